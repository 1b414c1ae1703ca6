#!/usr/bin/env bash
# Decoding on a busy machine: `strata bench` (batch 1 and 8) alone, then with a competing process spinning on one
# core (taskset -c 1), for this build and for a commit before it (default 17651ea, the last with OpenMP's
# fork-join threads), one after the other:
#
#   bench/cpu_busy_core.sh [--before-commit 17651ea] [--reps 3] [--out bench/results/cpu-busy-core.json]
#
# The commit before is built once in build-before-COMMIT/ (a git worktree; ignored by git). Raw results, the machine and
# every command go to --out. Run it on an otherwise idle machine.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
SCRIPT_COMMAND="bench/cpu_busy_core.sh${*:+ $*}"

BEFORE=17651ea
REPS=3
OUT=bench/results/cpu-busy-core.json
CONFIG=configs/smollm2-cpu.yaml
while (($#)); do
  case "$1" in
    --before-commit) BEFORE=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) sed -n 2,9p "$0"; exit 0 ;;
    *) echo "cpu_busy_core.sh: unknown flag $1" >&2; exit 2 ;;
  esac
done

log() { printf '[busy-core] %s\n' "$*" >&2; }

before_dir=build-before-$BEFORE
before_bin=$(bench/build_commit.sh "$BEFORE" "$before_dir")

busy_pid=""
stop_busy() {
  if [ -n "$busy_pid" ]; then
    kill "$busy_pid" 2>/dev/null || true
    wait "$busy_pid" 2>/dev/null || true  # the killed loop's status
  fi
  busy_pid=""
}
trap stop_busy EXIT

tmp=$(mktemp -d)
results=()
for label in before after; do
  bin=build/strata config=$CONFIG
  # The commit before reads its own configuration file (it would refuse keys added since).
  [ "$label" = before ] && bin=$before_bin config=$before_dir/$CONFIG
  for load in idle busy; do
    if [ "$load" = busy ]; then
      taskset -c 1 sh -c 'while :; do :; done' &
      busy_pid=$!
      sleep 0.5
    fi
    for rep in $(seq "$REPS"); do
      json=$tmp/$label-$load-$rep.json
      cmd=("$bin" bench --config "$config" --batch 1,8 --prompt-tokens 128 --gen-tokens 64 --out "$json")
      log "$label, $load, run $rep: ${cmd[*]}"
      "${cmd[@]}" >/dev/null 2>&1
      results+=("$label|$load|$rep|${cmd[*]}|$json")
    done
    stop_busy
  done
done

mkdir -p "$(dirname "$OUT")"
.venv/bin/python - "$OUT" "$BEFORE" "$(git rev-parse --short HEAD)" "$SCRIPT_COMMAND" "${results[@]}" <<'EOF'
import json, statistics, sys
sys.path.insert(0, "bench")
from bench_support import machine
out, before, head, script_command, *runs = sys.argv[1:]
rows = []
for run in runs:
    label, load, rep, command, path = run.split("|")
    report = json.load(open(path))
    for r in report["results"]:
        rows.append({"build": label, "load": load, "rep": int(rep), "batch": r["batch"],
                     "decode_tokens_per_second": r["decode_tokens_per_second"], "command": command})
summary = {}
for build in ("before", "after"):
    for load in ("idle", "busy"):
        for batch in (1, 8):
            values = [r["decode_tokens_per_second"] for r in rows
                      if (r["build"], r["load"], r["batch"]) == (build, load, batch)]
            summary[f"{build} {load} batch {batch}"] = statistics.median(values)
for build in ("before", "after"):
    for batch in (1, 8):
        summary[f"{build} batch {batch}: busy / idle"] = (summary[f"{build} busy batch {batch}"] /
                                                          summary[f"{build} idle batch {batch}"])
json.dump({"what": "strata bench decode tokens/s, idle and with a busy process pinned to core 1 "
                   "(taskset -c 1 sh -c 'while :; do :; done')",
           "before_commit": before, "after_commit": head, "machine": machine(),
           "command": script_command,
           "median": summary, "runs": rows}, open(out, "w"), indent=1)
for k, v in summary.items():
    print(f"{k:32s} {v:8.2f}")
EOF
rm -rf "$tmp"
