#!/usr/bin/env bash
# The engine's speed before and after a change: `strata bench` (by default batch 1 and 8, 128 prompt tokens, 64
# generated) with this build and with an earlier commit's, alternating which goes first in each repetition:
#
#   bench/engine_before_after.sh [--before-commit 1faafb9] [--reps 5] [--out bench/results/FILE.json]
#       [--batch 1,8] [--prompt-tokens 128] [--gen-tokens 64] [--flags 'MORE BENCH FLAGS']
#       [--before-flags 'FLAGS'] [--after-flags 'FLAGS']
#
# --flags go to both builds' `strata bench` as they are (split as a shell splits words): for example
# '--set kv_cache.dtype=int4 --set kv_cache.block_size=32 --context 2048,7936'; --before-flags and --after-flags
# to one side only. The commit before is built once in build-before-COMMIT/ (bench/build_commit.sh); with
# --before-commit this, both sides run this build (two settings compared: say which in the side flags). Medians of
# prefill and decode tokens/s and their after/before ratios, every run, the machine and the commands go to --out.
# Run it on an otherwise idle machine.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
SCRIPT_COMMAND="bench/engine_before_after.sh${*:+ $*}"

BEFORE=1faafb9
REPS=5
BATCH=1,8
PROMPT_TOKENS=128
GEN_TOKENS=64
FLAGS=""
BEFORE_FLAGS=""
AFTER_FLAGS=""
OUT=bench/results/cpu-engine-before-after.json
CONFIG=configs/smollm2-cpu.yaml
while (($#)); do
  case "$1" in
    --before-commit) BEFORE=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --batch) BATCH=$2; shift 2 ;;
    --prompt-tokens) PROMPT_TOKENS=$2; shift 2 ;;
    --gen-tokens) GEN_TOKENS=$2; shift 2 ;;
    --flags) FLAGS=$2; shift 2 ;;
    --before-flags) BEFORE_FLAGS=$2; shift 2 ;;
    --after-flags) AFTER_FLAGS=$2; shift 2 ;;
    -h|--help) sed -n 2,16p "$0"; exit 0 ;;
    *) echo "engine_before_after.sh: unknown flag $1" >&2; exit 2 ;;
  esac
done

if [ "$BEFORE" = this ]; then
  before_dir=. before_bin=build/strata
else
  before_dir=build-before-$BEFORE
  before_bin=$(bench/build_commit.sh "$BEFORE" "$before_dir")
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
results=()
for rep in $(seq "$REPS"); do
  order="before after"
  ((rep % 2 == 0)) && order="after before"
  for label in $order; do
    bin=build/strata config=$CONFIG side_flags=$AFTER_FLAGS
    # The commit before reads its own configuration file (it would refuse keys added since).
    [ "$label" = before ] && bin=$before_bin config=$before_dir/$CONFIG side_flags=$BEFORE_FLAGS
    json=$tmp/$label-$rep.json
    # shellcheck disable=SC2206  # the flags are split into words on purpose
    cmd=("$bin" bench --config "$config" --batch "$BATCH" --prompt-tokens "$PROMPT_TOKENS" --gen-tokens "$GEN_TOKENS"
         $FLAGS $side_flags --out "$json")
    printf '[before-after] %s, run %s: %s\n' "$label" "$rep" "${cmd[*]}" >&2
    "${cmd[@]}" >/dev/null 2>&1
    results+=("$label|$rep|${cmd[*]}|$json")
  done
done

mkdir -p "$(dirname "$OUT")"
before_commit=$BEFORE
[ "$BEFORE" = this ] && before_commit=$(git rev-parse --short HEAD)
.venv/bin/python - "$OUT" "$before_commit" "$(git rev-parse --short HEAD)" "$SCRIPT_COMMAND" "${results[@]}" <<'PY'
import json, statistics, sys
sys.path.insert(0, "bench")
from bench_support import machine
out, before, head, script_command, *runs = sys.argv[1:]
rows = []
for run in runs:
    label, rep, command, path = run.split("|")
    for r in json.load(open(path))["results"]:
        if "skipped" in r:
            raise SystemExit(f"engine_before_after.sh: {command}: a cell was skipped: {r['skipped']}")
        rows.append({"build": label, "rep": int(rep), "batch": r["batch"], "context": r.get("context"),
                     "command": command,
                     "prefill_tokens_per_second": r["prefill_tokens_per_second"],
                     "decode_tokens_per_second": r["decode_tokens_per_second"]})
median = {}
cells = sorted({(r["batch"], r["context"]) for r in rows}, key=lambda c: (c[0], c[1] or 0))
for phase in ("prefill", "decode"):
    for batch, context in cells:
        cell = f"batch {batch}" + (f" context {context}" if context else "")
        for build in ("before", "after"):
            median[f"{build} {phase} {cell}"] = statistics.median(
                r[f"{phase}_tokens_per_second"] for r in rows if (r["build"], r["batch"], r["context"]) ==
                (build, batch, context))
        median[f"{phase} {cell}: after / before"] = median[f"after {phase} {cell}"] / median[f"before {phase} {cell}"]
json.dump({"what": "strata bench tokens/s (the runs' commands below), medians over runs that alternate which build "
                   "goes first",
           "before_commit": before, "after_commit": head, "machine": machine(), "command": script_command,
           "median": median, "runs": rows}, open(out, "w"), indent=1)
for k, v in median.items():
    print(f"{k:50s} {v:8.3f}")
PY
