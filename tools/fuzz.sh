#!/usr/bin/env bash
# Builds the libFuzzer harnesses of tests/fuzz/ (docs/fuzzing.md) with clang, AddressSanitizer and
# UndefinedBehaviorSanitizer in build-fuzz/, runs each for SECONDS (default 60) and prints its executions and
# crashes. Exits 1 when a harness crashed (a sanitizer report, a failed check, an uncaught exception, a hang).
#   tools/fuzz.sh [SECONDS] [--only NAME,NAME] [--record FILE]
# Each harness grows a working corpus in build-fuzz/corpus/<harness>/ from the committed seeds
# (tests/fuzz/corpus/<harness>/); the input of a crash is kept in build-fuzz/crashes/<harness>/ and its log in
# build-fuzz/logs/<harness>.log. --record FILE writes the run as JSON: per harness the seconds, executions and
# crashes, with the machine, the command and the commit.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=60
only=""
record=""
command_line="tools/fuzz.sh $*"
while (($#)); do
  case "$1" in
    --only) only="$2"; shift 2 ;;
    --record) record="$2"; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) [[ "$1" =~ ^[0-9]+$ ]] || { echo "fuzz.sh: expected SECONDS, --only or --record, got '$1'" >&2; exit 2; }
       seconds="$1"; shift ;;
  esac
done

harnesses=()
for source in tests/fuzz/*_fuzz.cpp; do
  name=$(basename "$source" .cpp)
  if [ -z "$only" ] || [[ ",$only," == *",$name,"* ]]; then harnesses+=("$name"); fi
done
((${#harnesses[@]})) || { echo "fuzz.sh: no harness matches --only $only" >&2; exit 2; }
[ -f models/SmolLM2-135M-Instruct.Q4_1.gguf ] || { echo "fuzz.sh: the model is missing; run tools/setup.sh" >&2; exit 2; }

commit=$(git rev-parse HEAD)  # what the harnesses are built from
git diff --quiet HEAD -- . 2>/dev/null || commit="$commit (with uncommitted changes)"
if [ ! -f build-fuzz/build.ninja ]; then
  echo "[fuzz] configuring build-fuzz (clang, -DSTRATA_FUZZ=ON)"
  CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=OFF \
    -DSTRATA_TESTS=OFF -DSTRATA_FUZZ=ON >/dev/null
fi
echo "[fuzz] building ${harnesses[*]}"
mkdir -p build-fuzz/logs
if ! cmake --build build-fuzz -j "${STRATA_FUZZ_JOBS:-2}" --target "${harnesses[@]}" >build-fuzz/logs/build.log 2>&1; then
  tail -30 build-fuzz/logs/build.log >&2
  echo "fuzz.sh: the build failed (build-fuzz/logs/build.log)" >&2
  exit 1
fi
results=()
failed=0
printf '%-22s %8s %12s %10s %8s\n' harness seconds executions exec/s crashes
for name in "${harnesses[@]}"; do
  mkdir -p "build-fuzz/corpus/$name" "build-fuzz/crashes/$name"
  log="build-fuzz/logs/$name.log"
  status=0
  # -timeout: an input that runs 10 s is a hang; UBSan and LeakSanitizer reports end the run like a crash.
  "build-fuzz/fuzz/$name" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
    -artifact_prefix="build-fuzz/crashes/$name/" "build-fuzz/corpus/$name" "tests/fuzz/corpus/$name" \
    >"$log" 2>&1 || status=$?
  executions=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)  # over the time it ran
  crashes=$((status != 0))
  printf '%-22s %8s %12s %10s %8s\n' "$name" "$seconds" "${executions:-?}" "${rate:-?}" "$crashes"
  if ((crashes)); then
    failed=1
    echo "[fuzz] $name crashed (exit $status); the end of $log:" >&2
    grep -E 'ERROR|SUMMARY|fuzz check failed|runtime error|what\(\)|Test unit written' "$log" | tail -8 >&2 || true
  fi
  results+=("$name ${seconds} ${executions:-0} ${rate:-0} $crashes")
done

if [ -n "$record" ]; then
  mkdir -p "$(dirname "$record")"
  python3 - "$record" "$command_line" "$commit" "${results[@]}" <<'EOF'
import datetime, json, os, platform, sys
path, command, commit, rows = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "")
harnesses = []
for row in rows:
    name, seconds, executions, rate, crashes = row.split()
    harnesses.append({"harness": name, "seconds": int(seconds), "executions": int(executions),
                      "exec_per_s": int(rate), "crashes": int(crashes)})
record = {"command": command, "commit": commit, "date": datetime.datetime.utcnow().strftime("%Y-%m-%dT%H:%M:%SZ"),
          "machine": {"cpu": cpu, "cores": os.cpu_count(), "kernel": platform.release()},
          "sanitizers": "address, undefined (clang 14 libFuzzer)", "harnesses": harnesses,
          "total_executions": sum(h["executions"] for h in harnesses),
          "total_crashes": sum(h["crashes"] for h in harnesses)}
with open(path, "w") as f:
    json.dump(record, f, indent=2)
    f.write("\n")
print(f"[fuzz] recorded in {path}")
EOF
fi
exit $failed
