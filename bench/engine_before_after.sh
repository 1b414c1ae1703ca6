#!/usr/bin/env bash
# The engine's speed before and after a change: `strata bench` (batch 1 and 8, 128 prompt tokens, 64 generated)
# with this build and with an earlier commit's, alternating which goes first in each repetition:
#
#   bench/engine_before_after.sh [--before-commit 1faafb9] [--reps 5] [--out bench/results/FILE.json]
#
# The commit before is built once in build-before-COMMIT/ (bench/build_commit.sh). Medians of prefill and decode
# tokens/s and their after/before ratios, every run, the machine and the commands go to --out. Run it on an
# otherwise idle machine.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
SCRIPT_COMMAND="bench/engine_before_after.sh${*:+ $*}"

BEFORE=1faafb9
REPS=5
OUT=bench/results/cpu-engine-before-after.json
CONFIG=configs/smollm2-cpu.yaml
while (($#)); do
  case "$1" in
    --before-commit) BEFORE=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) sed -n 2,9p "$0"; exit 0 ;;
    *) echo "engine_before_after.sh: unknown flag $1" >&2; exit 2 ;;
  esac
done

before_dir=build-before-$BEFORE
before_bin=$(bench/build_commit.sh "$BEFORE" "$before_dir")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
results=()
for rep in $(seq "$REPS"); do
  order="before after"
  ((rep % 2 == 0)) && order="after before"
  for label in $order; do
    bin=build/strata config=$CONFIG
    # The commit before reads its own configuration file (it would refuse keys added since).
    [ "$label" = before ] && bin=$before_bin config=$before_dir/$CONFIG
    json=$tmp/$label-$rep.json
    cmd=("$bin" bench --config "$config" --batch 1,8 --prompt-tokens 128 --gen-tokens 64 --out "$json")
    printf '[before-after] %s, run %s: %s\n' "$label" "$rep" "${cmd[*]}" >&2
    "${cmd[@]}" >/dev/null 2>&1
    results+=("$label|$rep|${cmd[*]}|$json")
  done
done

mkdir -p "$(dirname "$OUT")"
.venv/bin/python - "$OUT" "$BEFORE" "$(git rev-parse --short HEAD)" "$SCRIPT_COMMAND" "${results[@]}" <<'PY'
import json, statistics, sys
sys.path.insert(0, "bench")
from bench_support import machine
out, before, head, script_command, *runs = sys.argv[1:]
rows = []
for run in runs:
    label, rep, command, path = run.split("|")
    for r in json.load(open(path))["results"]:
        rows.append({"build": label, "rep": int(rep), "batch": r["batch"], "command": command,
                     "prefill_tokens_per_second": r["prefill_tokens_per_second"],
                     "decode_tokens_per_second": r["decode_tokens_per_second"]})
median = {}
for phase in ("prefill", "decode"):
    for batch in (1, 8):
        for build in ("before", "after"):
            median[f"{build} {phase} batch {batch}"] = statistics.median(
                r[f"{phase}_tokens_per_second"] for r in rows if (r["build"], r["batch"]) == (build, batch))
        median[f"{phase} batch {batch}: after / before"] = (median[f"after {phase} batch {batch}"] /
                                                            median[f"before {phase} batch {batch}"])
json.dump({"what": "strata bench tokens/s (batch 1 and 8, 128 prompt tokens, 64 generated), medians over runs "
                   "that alternate which build goes first",
           "before_commit": before, "after_commit": head, "machine": machine(), "command": script_command,
           "median": median, "runs": rows}, open(out, "w"), indent=1)
for k, v in median.items():
    print(f"{k:36s} {v:8.3f}")
PY
