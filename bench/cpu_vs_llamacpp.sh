#!/usr/bin/env bash
# Strata against llama.cpp on the CPU, side by side, with one command:
#
#   bench/cpu_vs_llamacpp.sh [--threads 2] [-r 3] [--out bench/results/cpu-vs-llamacpp.json]
#
#   1. builds llama.cpp (llama-bench, llama-batched-bench, llama-server; Release, CPU only, GGML_NATIVE=ON) from
#      the source distribution of the PyPI package llama-cpp-python==0.3.36 (its vendor/llama.cpp), in
#      build-llamacpp/ (ignored by git); skipped when the three binaries are already there;
#   2. runs, one after the other, on the same GGUF and thread count:
#        batch-1 decode and prefill: llama-bench           against  strata bench --batch 1
#        batch-8 decode:             llama-batched-bench   against  strata bench --batch 8
#        HTTP, 1 and 8 concurrent streaming /v1/completions: llama-server against strata serve
#          (the same client, bench/http_load.py);
#      and, first, this machine's read bandwidth (build/bench/read_bandwidth), against which the report sets the
#      weight bytes a batch-1 decode step reads;
#   3. writes every command line, every raw number and the ratios Strata / llama.cpp to --out (JSON) and prints a
#      table.
#
# --level avx2 compares the two engines' AVX2 code on a machine with more: llama.cpp built for x86-64-v3 (AVX, AVX2,
# FMA, F16C, BMI2; no AVX-512), in build-llamacpp/build-VERSION-avx2/, and Strata with engine.cpu_kernels=avx2.
# --level native-noamx builds llama.cpp natively but without AMX (-mno-amx-*), in build-VERSION-noamx/: on a machine
# that reports AMX, run both native levels and keep both files, since a VM has been seen to report AMX and trap its
# tile instructions, where llama.cpp's native build crashes on batched work (Strata's AMX probe, the third line of
# `strata --version`, says whether this machine grants them). A llama.cpp command that fails does not stop the
# script: the JSON's `failures` name it, how it ended and the end of its stderr, and its cases have no ratio.
#
# Run it on an idle machine: on a shared one the numbers mean little (bench/results/README.md).
# `bench/cpu_vs_llamacpp.sh --help` lists the flags.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
SCRIPT_COMMAND="bench/cpu_vs_llamacpp.sh${*:+ $*}"
STARTED=$(date -u +%Y-%m-%dT%H:%M:%S+00:00)

LCP_VERSION=0.3.36
THREADS=2
REPS=3
PROMPT_TOKENS=128
GEN_TOKENS=64
BATCH=8
HTTP_ROUNDS=3
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
CONFIG=configs/smollm2-cpu.yaml
STRATA=build/strata
READ_BANDWIDTH=build/bench/read_bandwidth
LCP_DIR=build-llamacpp
LEVEL=native
OUT=bench/results/cpu-vs-llamacpp.json
LLAMA_PORT=18431
STRATA_PORT=18432
BUILD_JOBS=2
BUILD_ONLY=0
PYTHON=.venv/bin/python
STRATA_SETS=()

usage() {
  cat <<EOF
usage: bench/cpu_vs_llamacpp.sh [flags]
  --threads N         compute threads of both engines (default $THREADS)
  -r, --reps N        repetitions: llama-bench -r N; llama-batched-bench and strata bench run N times each
                      (default $REPS)
  --prompt-tokens N   prompt length of every case (default $PROMPT_TOKENS)
  --gen-tokens N      tokens generated per sequence / requested per HTTP request (default $GEN_TOKENS)
  --batch N           the batched case: decode batch and concurrent HTTP streams (default $BATCH)
  --http-rounds N     requests each HTTP stream sends one after another (default $HTTP_ROUNDS)
  --model FILE        the GGUF both engines load (default $MODEL)
  --config FILE       Strata's configuration (default $CONFIG)
  --strata FILE       the Strata binary (default $STRATA)
  --strata-set K=V    an extra --set for strata bench and strata serve (repeatable), e.g. model.weight_dtype=q8_0
  --llamacpp-dir DIR  where llama.cpp is unpacked and built (default $LCP_DIR)
  --level native|native-noamx|avx2
                      both engines at this machine's best, llama.cpp's without AMX, or both at AVX2 (llama.cpp
                      built for x86-64-v3, Strata with engine.cpu_kernels=avx2; default $LEVEL)
  --jobs N            parallel compile jobs for llama.cpp (default $BUILD_JOBS)
  --llama-port P, --strata-port P   HTTP ports (default $LLAMA_PORT, $STRATA_PORT)
  --out FILE          the JSON written (default $OUT)
  --build-only        build llama.cpp and stop
EOF
}

while (($#)); do
  case "$1" in
    --threads) THREADS=$2; shift 2 ;;
    -r|--reps) REPS=$2; shift 2 ;;
    --prompt-tokens) PROMPT_TOKENS=$2; shift 2 ;;
    --gen-tokens) GEN_TOKENS=$2; shift 2 ;;
    --batch) BATCH=$2; shift 2 ;;
    --http-rounds) HTTP_ROUNDS=$2; shift 2 ;;
    --model) MODEL=$2; shift 2 ;;
    --config) CONFIG=$2; shift 2 ;;
    --strata) STRATA=$2; shift 2 ;;
    --strata-set) STRATA_SETS+=(--set "$2"); shift 2 ;;
    --llamacpp-dir) LCP_DIR=$2; shift 2 ;;
    --level) LEVEL=$2; shift 2 ;;
    --jobs) BUILD_JOBS=$2; shift 2 ;;
    --llama-port) LLAMA_PORT=$2; shift 2 ;;
    --strata-port) STRATA_PORT=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --build-only) BUILD_ONLY=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "cpu_vs_llamacpp: unknown flag $1" >&2; usage >&2; exit 2 ;;
  esac
done
[[ $LEVEL == native || $LEVEL == native-noamx || $LEVEL == avx2 ]] \
  || { echo "cpu_vs_llamacpp: --level must be native, native-noamx or avx2, got '$LEVEL'" >&2; exit 2; }
for v in THREADS REPS PROMPT_TOKENS GEN_TOKENS BATCH HTTP_ROUNDS BUILD_JOBS LLAMA_PORT STRATA_PORT; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "cpu_vs_llamacpp: $v must be a positive integer, got '${!v}'" >&2; exit 2; }
done

log() { printf '[cpu-vs-llamacpp] %s\n' "$*" >&2; }
die() { printf 'cpu_vs_llamacpp: %s\n' "$*" >&2; exit 1; }

# Every child server is killed on exit, however the script ends.
SERVER_PID=""
WORK=$(mktemp -d /tmp/cpu-vs-llamacpp.XXXXXX)
stop_server() {
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  SERVER_PID=""
}
cleanup() { stop_server; rm -rf "$WORK"; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- 1. llama.cpp ---------------------------------------------------------------------------------------------
LCP_SRC=$LCP_DIR/llama_cpp_python-$LCP_VERSION/vendor/llama.cpp
LCP_BUILD=$LCP_DIR/build-$LCP_VERSION
LCP_LEVEL_FLAGS=(-DGGML_NATIVE=ON)
if [ "$LEVEL" = avx2 ]; then
  LCP_BUILD=$LCP_BUILD-avx2
  LCP_LEVEL_FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
                   -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF)
  STRATA_SETS+=(--set engine.cpu_kernels=avx2)
elif [ "$LEVEL" = native-noamx ]; then
  LCP_BUILD=$LCP_BUILD-noamx
  LCP_LEVEL_FLAGS=(-DGGML_NATIVE=ON "-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
                   "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
fi
LCP_BIN=$LCP_BUILD/bin
LCP_TARGETS=(llama-bench llama-batched-bench llama-server)
LCP_CMAKE_FLAGS=(-DCMAKE_BUILD_TYPE=Release "${LCP_LEVEL_FLAGS[@]}" -DGGML_CUDA=OFF -DLLAMA_CURL=OFF
                 -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DBUILD_SHARED_LIBS=OFF
                 -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON)

have_llamacpp() {
  local t
  for t in "${LCP_TARGETS[@]}"; do [ -x "$LCP_BIN/$t" ] || return 1; done
}

build_llamacpp() {
  if have_llamacpp; then
    log "llama.cpp of llama-cpp-python $LCP_VERSION already built in $LCP_BIN (delete $LCP_BUILD to rebuild)"
    return
  fi
  local debs=(build-essential cmake ninja-build) missing=() p
  for p in "${debs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    log "installing Debian packages: ${missing[*]}"
    local sudo_cmd=""; [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
  mkdir -p "$LCP_DIR"
  if [ ! -f "$LCP_SRC/CMakeLists.txt" ]; then
    local sdist=$LCP_DIR/llama_cpp_python-$LCP_VERSION.tar.gz
    if [ ! -f "$sdist" ]; then
      log "downloading the sdist of llama-cpp-python==$LCP_VERSION from PyPI"
      "$PYTHON" -m pip download -q --no-binary=:all: --no-deps -d "$LCP_DIR" "llama-cpp-python==$LCP_VERSION"
    fi
    [ -f "$sdist" ] || die "pip download did not produce $sdist"
    log "unpacking $sdist"
    tar -xzf "$sdist" -C "$LCP_DIR"
    [ -f "$LCP_SRC/CMakeLists.txt" ] || die "$sdist has no vendor/llama.cpp/CMakeLists.txt"
  fi
  log "configuring llama.cpp (Release, CPU only, ${LCP_LEVEL_FLAGS[*]})"
  cmake -S "$LCP_SRC" -B "$LCP_BUILD" -G Ninja "${LCP_CMAKE_FLAGS[@]}" >"$LCP_DIR/configure.log" 2>&1 \
    || { tail -30 "$LCP_DIR/configure.log" >&2; die "cmake configure failed (log: $LCP_DIR/configure.log)"; }
  log "building ${LCP_TARGETS[*]} with -j$BUILD_JOBS (several minutes on 2 cores; log: $LCP_DIR/build.log)"
  local t0=$SECONDS
  nice -n 10 cmake --build "$LCP_BUILD" -j "$BUILD_JOBS" --target "${LCP_TARGETS[@]}" >"$LCP_DIR/build.log" 2>&1 \
    || { tail -30 "$LCP_DIR/build.log" >&2; die "llama.cpp build failed (log: $LCP_DIR/build.log)"; }
  have_llamacpp || die "the build finished without ${LCP_TARGETS[*]} in $LCP_BIN"
  log "llama.cpp built in $((SECONDS - t0)) s"
}

build_llamacpp
log "llama.cpp: ${LCP_LEVEL_FLAGS[*]}, CPU backend only, no BLAS"
((BUILD_ONLY)) && exit 0

# --- 2. the runs ----------------------------------------------------------------------------------------------
[ -f "$MODEL" ] || die "no model $MODEL (tools/setup.sh fetches it)"
[ -f "$CONFIG" ] || die "no configuration $CONFIG"
[ -x "$PYTHON" ] || die "no $PYTHON (tools/setup.sh creates it)"
command -v curl >/dev/null || die "curl is needed (apt-get install curl)"
# Another engineer may be relinking build/strata: wait up to 5 minutes for a binary that answers --help.
strata_ok() { [ -x "$STRATA" ] && "$STRATA" bench --help >/dev/null 2>&1; }
for _ in $(seq 60); do strata_ok && break; log "waiting for a working $STRATA"; sleep 5; done
strata_ok || die "$STRATA is missing or broken"
[ -x "$READ_BANDWIDTH" ] || die "no $READ_BANDWIDTH (ninja -C build read_bandwidth)"

MACHINE_JSON=$WORK/machine.json
"$PYTHON" - "$MACHINE_JSON" <<'EOF'
import json, os, platform, subprocess, sys
def lscpu():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return {}
    return {k.strip(): v.strip() for k, v in (l.split(":", 1) for l in out.splitlines() if ":" in l)}
cpu = lscpu()
mem_kib = next((int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("MemTotal:")), None)
machine = {
    "cpu": cpu.get("Model name", "unknown"),
    "cpu_vendor": cpu.get("Vendor ID"),
    "cores": os.cpu_count(),
    "threads_per_core": cpu.get("Thread(s) per core"),
    "hypervisor": cpu.get("Hypervisor vendor"),
    "cpu_flags_avx": sorted(f for f in cpu.get("Flags", "").split() if f.startswith(("avx", "fma", "f16c"))),
    "memory_gib": round(mem_kib / 2**20, 1) if mem_kib else None,
    "kernel": platform.release(),
    "os": platform.platform(),
    "load_average_at_start": list(os.getloadavg()),
}
json.dump(machine, open(sys.argv[1], "w"))
EOF
RUNS_JSONL=$WORK/runs.jsonl
: >"$RUNS_JSONL"

# note_run KIND ENGINE RAW_FILE FORMAT T0 LOAD STATUS COMMAND...: appends a command's line to the runs file (its
# exit status too where it failed; the report keeps the end of RAW_FILE.err then).
note_run() {
  "$PYTHON" - "$RUNS_JSONL" "$@" <<'EOF'
import json, shlex, sys, time
path, kind, engine, raw, fmt, t0, load, status, *cmd = sys.argv[1:]
line = {"kind": kind, "engine": engine, "raw": raw, "format": fmt, "command": shlex.join(cmd),
        "seconds": round(time.time() - float(t0), 2), "load_average_1min_before": float(load)}
if status != "0":
    line["exit_status"] = int(status)
with open(path, "a") as f:
    f.write(json.dumps(line) + "\n")
EOF
}

# record KIND ENGINE RAW_FILE FORMAT COMMAND...: runs COMMAND (stdout to RAW_FILE, stderr to RAW_FILE.err),
# and notes the command line as run. A llama.cpp command that fails is noted and the script goes on (a VM that
# reports AMX and traps its tile instructions kills llama.cpp's native build on batched work; the report names
# the failure and leaves those cases without a ratio); a failing Strata or machine command ends the script.
record() {
  local kind=$1 engine=$2 raw=$3 format=$4; shift 4
  log "$engine $kind: $*"
  local t0 load status=0; t0=$(date +%s.%N); load=$(cut -d' ' -f1 /proc/loadavg)
  "$@" >"$raw" 2>"$raw.err" || status=$?
  if [ "$status" != 0 ]; then
    tail -20 "$raw.err" >&2
    [[ $engine == llama.cpp || $engine == llama-server ]] || die "$engine $kind failed: $*"
    log "$engine $kind failed (exit status $status); going on without it"
  fi
  note_run "$kind" "$engine" "$raw" "$format" "$t0" "$load" "$status" "$@"
}

LB=$LCP_BIN/llama-bench
LBB=$LCP_BIN/llama-batched-bench
LS=$LCP_BIN/llama-server
CTX_PER_SLOT=$(((PROMPT_TOKENS + GEN_TOKENS + 8 + 255) / 256 * 256))  # llama.cpp pads a slot's context to 256
LS_CTX=$((BATCH * CTX_PER_SLOT))
LBB_CTX=$((BATCH * (PROMPT_TOKENS + GEN_TOKENS) > 2048 ? BATCH * (PROMPT_TOKENS + GEN_TOKENS) : 2048))

# The yardstick of a batch-1 decode step, which reads every weight once: this machine's read bandwidth on as many
# threads (the report divides the weight bytes a step reads by it).
record bandwidth machine "$WORK/read-bandwidth.log" read-bandwidth-json:"$WORK/read-bandwidth.json" \
  "$READ_BANDWIDTH" --threads "$THREADS" --out "$WORK/read-bandwidth.json"

# Not measured: how llama.cpp loads this GGUF (tensor types, which weights it repacks for its faster kernels).
record probe llama.cpp "$WORK/llama-load-probe.json" llama-load-probe \
  "$LB" -m "$MODEL" -p 8 -n 0 -t "$THREADS" -r 1 -v -o json

# Batch 1: llama-bench (prefill of PROMPT_TOKENS and GEN_TOKENS of decode, each REPS times), then Strata.
record batch1 llama.cpp "$WORK/llama-bench.json" llama-bench-json \
  "$LB" -m "$MODEL" -p "$PROMPT_TOKENS" -n "$GEN_TOKENS" -t "$THREADS" -r "$REPS" -o json
# llama-bench's tg test decodes from an empty cache; this one decodes after PROMPT_TOKENS of context, as Strata does.
record batch1-depth llama.cpp "$WORK/llama-bench-depth.json" llama-bench-json \
  "$LB" -m "$MODEL" -p 0 -n "$GEN_TOKENS" -d "$PROMPT_TOKENS" -t "$THREADS" -r "$REPS" -o json
for i in $(seq "$REPS"); do
  record batch1 strata "$WORK/strata-b1-$i.log" strata-bench-json:"$WORK/strata-b1-$i.json" \
    "$STRATA" bench --config "$CONFIG" --set model.path="$MODEL" --batch 1 --prompt-tokens "$PROMPT_TOKENS" \
    --gen-tokens "$GEN_TOKENS" --set engine.threads="$THREADS" "${STRATA_SETS[@]}" --out "$WORK/strata-b1-$i.json"
done

# Batch 8: llama-batched-bench (BATCH sequences of PROMPT_TOKENS each, then GEN_TOKENS decoded together), then Strata.
for i in $(seq "$REPS"); do
  record batch"$BATCH" llama.cpp "$WORK/llama-batched-bench-$i.jsonl" llama-batched-bench-jsonl \
    "$LBB" -m "$MODEL" -c "$LBB_CTX" -b 2048 -ub 512 -npp "$PROMPT_TOKENS" -ntg "$GEN_TOKENS" -npl "$BATCH" \
    -t "$THREADS" --output-format jsonl
done
for i in $(seq "$REPS"); do
  record batch"$BATCH" strata "$WORK/strata-b$BATCH-$i.log" strata-bench-json:"$WORK/strata-b$BATCH-$i.json" \
    "$STRATA" bench --config "$CONFIG" --set model.path="$MODEL" --batch "$BATCH" --prompt-tokens "$PROMPT_TOKENS" \
    --gen-tokens "$GEN_TOKENS" --set engine.threads="$THREADS" "${STRATA_SETS[@]}" --out "$WORK/strata-b$BATCH-$i.json"
done

# HTTP: each server in turn, loaded by the same client.
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_health() {  # wait_health PORT NAME: until GET /health answers 200 (model loaded); fails if the server exits
  local port=$1 name=$2
  for _ in $(seq 600); do
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
      tail -20 "$WORK/$name.log" >&2
      log "$name exited before it was healthy"
      return 1
    fi
    [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://127.0.0.1:$port/health" || true)" = 200 ] && return
    sleep 0.5
  done
  die "$name did not become healthy on port $port in 5 minutes"
}
# serve NAME PORT COMMAND...: starts the server, waits for /health, loads it with bench/http_load.py, stops it.
# A llama-server that dies is noted as record notes a failed llama.cpp command; a Strata one ends the script.
serve_and_load() {
  local name=$1 port=$2; shift 2
  port_free "$port" || die "port $port is in use (--llama-port / --strata-port)"
  log "$name: $*"
  local t0 load_avg status=0; t0=$(date +%s.%N); load_avg=$(cut -d' ' -f1 /proc/loadavg)
  "$@" >"$WORK/$name.log" 2>&1 &
  SERVER_PID=$!
  if ! wait_health "$port" "$name"; then
    wait "$SERVER_PID" || status=$?
    SERVER_PID=""
    [ "$name" = llama-server ] || die "$name exited before it was healthy"
  fi
  note_run http-server "$name" "$WORK/$name.log" log "$t0" "$load_avg" "$status" "$@"
  [ "$status" = 0 ] || return 0
  local load=("$PYTHON" bench/http_load.py --url "http://127.0.0.1:$port" --model auto
              --tokenizer "$STRATA tokenize --model $MODEL" --prompt-tokens "$PROMPT_TOKENS"
              --max-tokens "$GEN_TOKENS" --streams "1,$BATCH" --rounds "$HTTP_ROUNDS" --out "$WORK/$name-http.json")
  record http "$name" "$WORK/$name-http.log" http-load-json:"$WORK/$name-http.json" "${load[@]}"
  stop_server
}

serve_and_load llama-server "$LLAMA_PORT" \
  "$LS" -m "$MODEL" --host 127.0.0.1 --port "$LLAMA_PORT" -t "$THREADS" -tb "$THREADS" -np "$BATCH" -c "$LS_CTX" \
  -b 2048 -ub 512 --no-webui
serve_and_load strata-serve "$STRATA_PORT" \
  "$STRATA" serve --config "$CONFIG" --set model.path="$MODEL" --port "$STRATA_PORT" --set engine.threads="$THREADS" \
  "${STRATA_SETS[@]}"

# --- 3. the report --------------------------------------------------------------------------------------------
mkdir -p "$(dirname "$OUT")"
"$PYTHON" bench/cpu_vs_llamacpp_report.py --runs "$RUNS_JSONL" --machine "$MACHINE_JSON" --out "$OUT" \
  --llamacpp-python-version "$LCP_VERSION" --llamacpp-src "$LCP_SRC" --llamacpp-build "$LCP_BUILD" \
  --cmake-flags "${LCP_CMAKE_FLAGS[*]}" --threads "$THREADS" --reps "$REPS" --prompt-tokens "$PROMPT_TOKENS" \
  --gen-tokens "$GEN_TOKENS" --batch "$BATCH" --http-rounds "$HTTP_ROUNDS" --model "$MODEL" --strata "$STRATA" \
  --strata-sets "${STRATA_SETS[*]}" --script-command "$SCRIPT_COMMAND" --started "$STARTED"
log "wrote $OUT"
