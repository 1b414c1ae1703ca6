#!/usr/bin/env bash
# Runs ON the GPU machine, from the repository root, over what tools/device/pack.sh packed (docs/gpu.md):
#   tools/device/gpu_run.sh STAGE...      stages, in the order given:
#     join       unpacks the binaries, keeps the model parts carried so far and, once all are there, joins
#                and decompresses them into models/ (says which are missing)
#     info       nvidia-smi, the driver, the GPU, python3's torch, and the device-to-device copy bandwidth
#     tests      every CUDA and NCCL test (kernels_tests --gtest_filter='Cuda*', and the tests named
#                *Cuda* or *Nccl* of the others: NCCL in a world of one); those on SmolLM2 (*SmolLm2*) only
#                once the model is joined. STRATA_TESTS_FILTER=F runs kernels_tests' F alone.
#     compare    SmolLM2 output, engine.backend=cuda against cpu, over several prompts (greedy, a seeded draw,
#                SpindleKV, Expected Attention): where they differ
#     serve      strata serve on CUDA: a chat request and a streamed completion, each with a compression policy,
#                then /metrics's per-layer KV series (tools/device/serve_check.py)
#     bench-8b   strata bench at Llama-3-8B shapes: decode at batch 1-64 and context 1K-32K, policies, prefill
#     bench-8b-long  the same at 16K and 32K only, batch 1 and 8: bf16 KV, int4 KV, SnapKV at 1,024
#     bench-70b  strata bench at Llama-3-70B layer shapes, with as many layers as the GPU's memory allows
#     capacity-8b  [capacity] at Llama-3-8B shapes: a 16 GiB KV pool, 32K-token prompts arriving at once, `full`
#                against SnapKV at 1,024 a layer on int4 with chunked prefill compression
#     profile    the GPU time of every kernel of a few decode steps at 8B shapes, batch 1 and 64 (ncu; nsys's
#                trace where ncu is refused the counters, with the host's gaps), summed per forward pass, beside the
#                steps' time without the profiler (tools/device/profile_report.py): does the GPU or the host set
#                the pace?
#     torch      tools/bench_torch_reference.py at the 8B shapes (PyTorch + transformers, dummy bf16 weights);
#                STRATA_TORCH_70B=1 adds the 70B layers
#     torch-compile  the same, torch.compile'd with CUDA graphs (mode reduce-overhead), at the cells of the issue's
#                goals (batch 1 and 64 at 1K): the peer of [gpu-speed] where the image has no vLLM, SGLang or
#                TensorRT-LLM (the info stage says which it can import)
# Everything goes to $OUT (at most 8 files come back from a call: each stage writes STAGE.json, every stage's
# output goes to gpu_run.log and every command line run to commands.txt), so a call can hold six stages. A call
# keeps to the sum of its stages' budgets (stage_seconds below; STRATA_CALL_SECONDS overrides): a run that would
# not end in time is not started. A failing stage is reported and the next one runs.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
root=$PWD
out=${OUT:-$root/.device/out}
dev=$root/.device
# What outlives a call while the machine stays warm: the tool removes, at each call, the carried paths that call
# does not name, so the unpacked binaries and the model's parts are kept outside the repository.
held=/tmp/strata-device
run_dir=$held/run
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p "$out"
commands=$out/commands.txt
log=$out/gpu_run.log
call_start=$(date +%s)
# Seconds each stage may take; a call may take the sum of its stages' (at most 560, inside the tool's 600), so
# that the calls of docs/gpu.md fit a session's 15 minutes of device time with the machine's start.
declare -A stage_seconds=([join]=20 [info]=30 [tests]=90 [compare]=120 [serve]=60 [bench-8b]=170 [bench-8b-long]=135
                          [bench-70b]=200 [torch]=100 [torch-compile]=200 [profile]=300 [capacity-8b]=300)
call_budget=0
for stage in "$@"; do call_budget=$((call_budget + ${stage_seconds[$stage]:-0})); done
(( call_budget > 560 )) && call_budget=560
call_budget=${STRATA_CALL_SECONDS:-$call_budget}
[[ $# -gt 0 ]] || { sed -n '2,15p' "$0"; exit 2; }

say() { echo "gpu_run: $*" >&2; }
# Runs a command, its line recorded in commands.txt.
record() {
  printf '%q ' "$@" >>"$commands"
  echo >>"$commands"
  "$@"
}
seconds_left() { echo $((call_start + call_budget - $(date +%s))); }
# The smaller of $1 seconds and what the call has left less 15; fails under 20.
cap_seconds() {
  local cap=$1 left=$(( $(seconds_left) - 15 ))
  (( left < cap )) && cap=$left
  (( cap >= 20 )) || return 1
  echo "$cap"
}

# ----- what the stages need: the unpacked binaries, the CUDA libraries of the image, the joined model -----------

need_bin() {
  local tarball=$dev/bin/strata-device.tar.xz sum
  if [[ ! -f "$tarball" ]]; then
    [[ -f "$run_dir/MANIFEST" ]] || { say "missing .device/bin: carry it"; return 1; }
    sum=$(cat "$run_dir/tarball.sha256")  # unpacked by an earlier call on this machine
  else
    sum=$(sha256sum <"$tarball")
  fi
  if [[ ! -f "$run_dir/MANIFEST" || "$(cat "$run_dir/tarball.sha256" 2>/dev/null)" != "$sum" ]]; then
    rm -rf "$run_dir"
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$tarball" "$run_dir" || return 1
    echo "$sum" >"$run_dir/tarball.sha256"
  fi
  # The tests find models/ and tests/fixtures/ under the source directory they were built in.
  local source_dir
  source_dir=$(sed -n 's/^source_dir //p' "$run_dir/MANIFEST")
  if [[ "$source_dir" != "$root" && ! -e "$source_dir" ]]; then
    mkdir -p "$(dirname "$source_dir")" && ln -s "$root" "$source_dir"
  fi
  # The carried libraries first, then where the image keeps each CUDA library the binaries need: the toolkit's
  # folders or the nvidia-* pip packages of python3 (PyTorch's), then the driver's.
  local libs=$run_dir/lib soname dir roots
  roots="/usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-13*/lib64 \
$(python3 -c 'import site; print(" ".join(p + "/nvidia" for p in site.getsitepackages()))' 2>/dev/null) /usr/lib/x86_64-linux-gnu"
  for soname in $(sed -n 's/^cuda_libraries //p' "$run_dir/MANIFEST"); do
    # shellcheck disable=SC2086
    dir=$(find -H $roots -maxdepth 4 -name "$soname" -printf '%h\n' 2>/dev/null | head -1)
    [[ -n "$dir" ]] || { say "no $soname in $roots"; return 1; }
    [[ ":$libs:" == *":$dir:"* ]] || libs=$libs:$dir
  done
  [[ -d /usr/local/nvidia/lib64 ]] && libs=$libs:/usr/local/nvidia/lib64
  LIBPATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  STRATA=$run_dir/bin/strata
}

# Only Strata's binaries see the carried libraries (python3's torch keeps its own).
packed() { LD_LIBRARY_PATH=$LIBPATH "$@"; }

# A profiler's path: on PATH, or where the CUDA toolkit and the Nsight packages put it; nothing if none.
find_tool() {
  { command -v "$1"; ls -d /usr/local/cuda/bin/"$1" /opt/nvidia/nsight-*/"$1" /opt/nvidia/nsight-*/*/"$1" \
    /opt/nvidia/nsight-*/*/*/"$1"; } 2>/dev/null | head -1
}

# Keeps the parts .device/model-K/*.xz.partK-of-N this call carried (each call of the sequence carries one) with
# those of earlier calls, and once all are there joins them and decompresses the model into models/, checked by
# sha256.
need_model() {
  local name sum parts k part
  name=$(basename "$model")
  mkdir -p "$held/parts"
  cp "$dev"/model-*/"$name".* "$held/parts/" 2>/dev/null
  sum=$(cut -d' ' -f1 "$held/parts/$name.sha256" 2>/dev/null)
  [[ -n "$sum" ]] || { say "no model part was carried (.device/model-K)"; return 1; }
  [[ -f "$model" && "$(sha256sum <"$model" | cut -d' ' -f1)" == "$sum" ]] && return 0
  parts=$(find "$held/parts" -name "$name.xz.part*-of-*" | head -1 | sed 's/.*-of-//')
  [[ -n "$parts" ]] || { say "no part of $name.xz was carried (.device/model-K)"; return 1; }
  for ((k = 1; k <= parts; k++)); do
    part=$held/parts/$name.xz.part$k-of-$parts
    [[ -f "$part" ]] || { say "missing part $k of $parts (the machine went cold?): carry .device/model-$k again"; return 1; }
  done
  mkdir -p models
  for ((k = 1; k <= parts; k++)); do cat "$held/parts/$name.xz.part$k-of-$parts"; done >"$held/$name.xz"
  python3 tools/device/unxz.py "$held/$name.xz" "$model" || { say "$name.xz did not decompress"; return 1; }
  [[ "$(sha256sum <"$model" | cut -d' ' -f1)" == "$sum" ]] || { say "the joined model's sha256 differs"; return 1; }
}

gpu_memory_mib() { nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | tr -d ' '; }

# The device-to-device copy bandwidth in GB/s, bytes read plus bytes written (what the bench's bandwidth account
# compares with); measured once per machine.
copy_bandwidth() {
  local file=$dev/copy-bandwidth-gbs
  if [[ ! -s "$file" ]]; then
    printf '%s\n' "python3 (torch): 2 GiB device-to-device copies, 5 warm-ups, mean of 20" >>"$commands"
    python3 - >"$file" <<'PY' || return 1
import torch
n = 2 << 30
src = torch.empty(n, dtype=torch.uint8, device="cuda")
dst = torch.empty_like(src)
for _ in range(5):
    dst.copy_(src)
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
for _ in range(20):
    dst.copy_(src)
end.record()
torch.cuda.synchronize()
print(f"{2 * n * 20 / (start.elapsed_time(end) / 1e3) / 1e9:.1f}")
PY
  fi
  cat "$file"
}

# Appends one strata bench result file to STAGE.json ({"runs": [...]}), rewritten after each run so that a stage
# cut short still returns what finished.
merge_json() {
  python3 - "$1" "$2" <<'PY'
import json, os, sys
merged, new = sys.argv[1], sys.argv[2]
data = json.load(open(merged)) if os.path.exists(merged) else {"runs": []}
data["runs"].append(json.load(open(new)))
json.dump(data, open(merged, "w"), indent=1)
PY
}

# bench_run STAGE CAP_SECONDS ARGS...: one strata bench on CUDA, at most CAP seconds and what the call has left.
bench_run() {
  local stage=$1 cap
  cap=$(cap_seconds "$2") || { say "$1: no time left for: ${*:3}"; return 1; }
  shift 2
  local result=$dev/scratch/bench.json
  mkdir -p "$dev/scratch" && rm -f "$result"
  record packed timeout "$cap" "$STRATA" bench --config configs/smollm2-cpu.yaml --set engine.backend=cuda \
    --copy-bandwidth-gbs "$(copy_bandwidth)" --out "$result" "$@" >>"$log" 2>&1
  local rc=$?
  (( rc == 0 )) || say "$stage: strata bench exited $rc: $*"
  [[ -f "$result" ]] && merge_json "$out/$stage.json" "$result"
  return "$rc"
}

# ----- stages -------------------------------------------------------------------------------------------------------

stage_info() {
  { nvidia-smi; nvidia-smi -q; } >>"$log" 2>&1
  local bw
  bw=$(copy_bandwidth) || return 1
  python3 - "$bw" >"$out/info.json" <<'PY'
import importlib.util, json, platform, subprocess, sys, torch, transformers
query = "name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,pcie.link.gen.max"
fields = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True,
                        text=True).stdout.strip().split(", ")
p = torch.cuda.get_device_properties(0)
print(json.dumps({"gpu": dict(zip(query.split(","), fields)),
                  "torch": {"version": torch.__version__, "cuda": torch.version.cuda, "device": p.name,
                            "multiprocessors": p.multi_processor_count, "memory_bytes": p.total_memory},
                  "transformers": transformers.__version__, "kernel": platform.release(),
                  "copy_bandwidth_gbs": float(sys.argv[1]),
                  "copy_bandwidth_method": "torch: 2 GiB device-to-device copies, mean of 20 after 5 warm-ups, "
                                           "bytes read plus bytes written",
                  "serving_engines_importable": {name: importlib.util.find_spec(name) is not None
                                                 for name in ("vllm", "sglang", "tensorrt_llm")}}, indent=1))
PY
  echo "profilers: ncu $(find_tool ncu), nsys $(find_tool nsys)" >>"$log"
  if need_bin; then
    { echo "glibc here: $(ldd --version | head -1)"; echo "LD_LIBRARY_PATH for strata: $LIBPATH"
      packed ldd "$STRATA"; cat "$run_dir/MANIFEST"; } >>"$log" 2>&1
  fi
}

stage_tests() {
  need_bin || return 1
  local scratch=$dev/scratch/tests rc=0 exe name filter cap without_model=""
  need_model 2>/dev/null || { without_model="-*SmolLm2*"; say "tests: no model yet: *SmolLm2* tests left out"; }
  rm -rf "$scratch" && mkdir -p "$scratch"
  for exe in "$run_dir"/bin/tests/*_tests; do
    name=$(basename "$exe")
    filter='*Cuda*:*CUDA*:*cuda*:*Nccl*'
    [[ "$name" == kernels_tests ]] && filter='Cuda*'
    [[ -n "${STRATA_TESTS_FILTER:-}" ]] && { [[ "$name" == kernels_tests ]] || continue; filter=$STRATA_TESTS_FILTER; }
    filter=$filter$without_model
    [[ -n "$(packed "$exe" --gtest_list_tests --gtest_filter="$filter" 2>/dev/null | grep '^ ')" ]] || continue
    cap=$(cap_seconds 120) || { say "tests: no time left for $name"; rc=1; break; }
    record packed timeout "$cap" "$exe" --gtest_filter="$filter" \
      --gtest_output="json:$scratch/$name.json" >>"$log" 2>&1 || rc=1
  done
  python3 - "$scratch" >"$out/tests.json" <<'PY'
import glob, json, os, sys
report = {}
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    data = json.load(open(path))
    report[os.path.basename(path)[:-5]] = {
        "tests": data.get("tests"), "failures": data.get("failures"), "disabled": data.get("disabled"),
        "failed": [f"{s['name']}.{t['name']}" for s in data.get("testsuites", []) for t in s.get("testsuite", [])
                   if t.get("failures")],
        "skipped": [f"{s['name']}.{t['name']}" for s in data.get("testsuites", []) for t in s.get("testsuite", [])
                    if t.get("result") == "SKIPPED"]}
print(json.dumps(report, indent=1))
PY
  return "$rc"
}

stage_compare() {
  need_bin && need_model || return 1
  local scratch=$dev/scratch/compare i backend cap variant
  rm -rf "$scratch" && mkdir -p "$scratch"
  local prompts=("The capital of France is" "Write a haiku about the sea."
                 "List three prime numbers and explain why they are prime."
                 "def fibonacci(n):" "Once upon a time, in a small village by the mountains,"
                 "Translate to French: The weather is nice today.")
  # Greedy over every prompt; then, over the first two, a seeded draw (the device's sampler against the host's
  # rule, the same uniform numbers), SpindleKV (the device's codebooks and coded attention) and Expected Attention
  # (the device's key forms: the prompt cut to 28 entries a layer at its end).
  local -A variant_args=([greedy]="" [sampled]="--temperature 0.8 --top-p 0.95 --seed 7"
                         [spindlekv]="--set kv_cache.policy=spindlekv:ratio=0.4,window=8"
                         [expected_attention]="--set kv_cache.policy=expected_attention:budget=28,sinks=2
                                               --set kv_cache.prefill_compression=end")
  local -A variant_prompts=([greedy]=${#prompts[@]} [sampled]=2 [spindlekv]=2 [expected_attention]=2)
  for variant in greedy sampled spindlekv expected_attention; do
    for ((i = 0; i < variant_prompts[$variant]; i++)); do
      for backend in cpu cuda; do
        cap=$(cap_seconds 30) || { say "compare: no time left for $variant prompt $i"; break 3; }
        # shellcheck disable=SC2086
        record packed timeout "$cap" "$STRATA" generate --config configs/smollm2-cpu.yaml --chat \
          --prompt "${prompts[$i]}" --max-tokens 64 --ignore-eos --json --top-logprobs 3 \
          --set engine.backend="$backend" ${variant_args[$variant]} \
          >"$scratch/$variant.$i.$backend.jsonl" 2>>"$log" ||
          say "compare: $backend failed on $variant prompt $i"
      done
    done
  done
  python3 - "$scratch" "${prompts[@]}" >"$out/compare.json" <<'PY'
import glob, json, os, sys
scratch, prompts = sys.argv[1], sys.argv[2:]
def read(path):
    try:
        return [json.loads(line) for line in open(path) if line.strip()]
    except (OSError, ValueError):
        return []
report = {"method": "strata generate --chat --max-tokens 64 --ignore-eos --json, cpu vs cuda: greedy; sampled "
                    "(--temperature 0.8 --top-p 0.95 --seed 7); spindlekv (ratio 0.4, window 8, greedy); "
                    "expected_attention (budget 28, sinks 2, end mode, greedy)"}
for variant in ("greedy", "sampled", "spindlekv", "expected_attention"):
    rows = []
    for i, prompt in enumerate(prompts):
        if not os.path.exists(f"{scratch}/{variant}.{i}.cpu.jsonl"):
            continue
        cpu, cuda = read(f"{scratch}/{variant}.{i}.cpu.jsonl"), read(f"{scratch}/{variant}.{i}.cuda.jsonl")
        a, b = [line["token"] for line in cpu], [line["token"] for line in cuda]
        same_length = None if len(a) == len(b) else min(len(a), len(b))
        first = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), same_length)
        row = {"prompt": prompt, "cpu_tokens": a, "cuda_tokens": b, "first_difference": first}
        if not a or not b:
            row["missing"] = "a backend printed no tokens: see gpu_run.log"
        elif first is not None and first < min(len(a), len(b)):  # how close the top choices were where they part
            row["at_difference"] = {"cpu": cpu[first], "cuda": cuda[first]}
        rows.append(row)
    agree = [r for r in rows if r["cpu_tokens"] and r["cpu_tokens"] == r["cuda_tokens"]]
    report[variant] = {"prompts_identical": len(agree), "prompts": len(rows), "results": rows}
print(json.dumps(report, indent=1))
PY
}

# The 8B benches' KV pool: what the GPU holds beyond the bf16 weights (16 GB) and 6 GiB for activations and cuBLAS.
kv_pool_8b_mib() { echo $(( $(gpu_memory_mib) - 15400 - 6144 )); }

stage_bench_8b() {
  need_bin || return 1
  local pool
  pool=$(kv_pool_8b_mib)
  local common=(--model preset:llama-3-8b --set "kv_cache.memory_mib=$pool" --set engine.max_running=64)
  # In order of importance: a stage cut short by the call's time skips the last runs.
  bench_run bench-8b 100 "${common[@]}" --context 1024,4096,16384,32768 --batch 1,8,32,64 --prompt-tokens 64 \
    --gen-tokens 32
  bench_run bench-8b 45 "${common[@]}" --context 16384,32768 --batch 1,8 --prompt-tokens 64 --gen-tokens 32 \
    --policy snapkv:budget=1024
  bench_run bench-8b 45 "${common[@]}" --context 16384,32768 --batch 1,8 --prompt-tokens 64 --gen-tokens 32 \
    --set kv_cache.dtype=int4 --set kv_cache.block_size=32
  bench_run bench-8b 45 "${common[@]}" --batch 1,8,32 --prompt-tokens 1024 --gen-tokens 16 \
    --set engine.max_batch_tokens=8192
}

# Long contexts only (a shorter call than bench-8b's grid): bf16 KV, int4 KV and SnapKV at 1,024 a layer, at 16K
# and 32K, batch 1 and 8 ([gpu-speed] item 3's goals).
stage_bench_8b_long() {
  need_bin || return 1
  local pool
  pool=$(kv_pool_8b_mib)
  local common=(--model preset:llama-3-8b --set "kv_cache.memory_mib=$pool" --set engine.max_running=64
                --context "16384,32768" --batch "1,8" --prompt-tokens 64 --gen-tokens 32)
  bench_run bench-8b-long 45 "${common[@]}"
  bench_run bench-8b-long 45 "${common[@]}" --set kv_cache.dtype=int4 --set kv_cache.block_size=32
  bench_run bench-8b-long 45 "${common[@]}" --policy snapkv:budget=1024
}

# [capacity] (docs/compression.md, chunked prefill): 16 requests of 32,768 tokens at once into a 16 GiB pool, 128
# generated each. max_concurrent is the most decoding at once; decode tokens/s the batch's rate once every request
# has its first token. The CPU benchmark's 64 requests do not fit a call here (2M prompt tokens a run).
stage_capacity_8b() {
  need_bin || return 1
  local common=(--model preset:llama-3-8b --set kv_cache.memory_mib=16384 --set engine.max_running=64
                --set engine.max_batch_tokens=8192 --set kv_cache.prefill_compression=chunked
                --set kv_cache.prefill_chunk=4096 --set kv_cache.prefix_caching=off
                --batch 16 --prompt-tokens 32768 --gen-tokens 128)
  bench_run capacity-8b 150 "${common[@]}" --policy snapkv:budget=1024 --set kv_cache.dtype=int4 \
    --set kv_cache.block_size=32
  bench_run capacity-8b 150 "${common[@]}"
}

# Layers of the 70B shapes that fit: the bf16 embedding and head (4.0 GiB), 16 GiB of KV pool, 6 GiB of
# activations and cuBLAS, 1,632 MiB per layer; STRATA_70B_LAYERS overrides.
layers_70b() {
  local layers=$(( ($(gpu_memory_mib) - 4010 - 16384 - 6144) / 1632 ))
  (( layers > 80 )) && layers=80
  echo "${STRATA_70B_LAYERS:-$layers}"
}

stage_bench_70b() {
  need_bin || return 1
  local layers
  layers=$(layers_70b)
  local common=(--model "preset:llama-3-70b@layers=$layers" --set kv_cache.memory_mib=16384
                --set engine.max_running=64)
  bench_run bench-70b 300 "${common[@]}" --context 1024,4096,16384,32768 --batch 1,8,32,64 --prompt-tokens 64 \
    --gen-tokens 32
  bench_run bench-70b 150 "${common[@]}" --batch 1,8 --prompt-tokens 1024 --gen-tokens 16 \
    --set engine.max_batch_tokens=8192
}

# The 8B shapes; with STRATA_TORCH_70B=1 they get half of the time left and the 70B ones the rest.
stage_torch() {
  local result=$dev/scratch/torch.json share=1 cap shape shapes=("--model llama-3-8b")
  [[ "${STRATA_TORCH_70B:-0}" == 1 ]] && { shapes+=("--model llama-3-70b --layers $(layers_70b)"); share=2; }
  mkdir -p "$dev/scratch"
  for shape in "${shapes[@]}"; do
    cap=$(cap_seconds $(( ($(seconds_left) - 15) / share ))) || { say "torch: no time left for $shape"; return 1; }
    share=1
    rm -f "$result"
    # shellcheck disable=SC2086
    record timeout "$cap" env PYTHONUNBUFFERED=1 python3 tools/bench_torch_reference.py $shape \
      --batch 1,8,32,64 --context 1024,4096,16384,32768 --gen-tokens 32 --prefill-tokens 1024 \
      --time-limit $((cap - 30)) --out "$result" >>"$log" 2>&1 || say "torch: $shape failed"
    [[ -f "$result" ]] && merge_json "$out/torch.json" "$result"
  done
}

# The peer in the same call as Strata's bench: the 8B shapes compiled (fullgraph, static shapes, CUDA graphs), each
# cell compiling its own graph first (untimed), so only the goals' cells.
stage_torch_compile() {
  local result=$dev/scratch/torch-compile.json cap
  mkdir -p "$dev/scratch" && rm -f "$result"
  cap=$(cap_seconds 200) || { say "torch-compile: no time left"; return 1; }
  record timeout "$cap" env PYTHONUNBUFFERED=1 python3 tools/bench_torch_reference.py --model llama-3-8b \
    --compile reduce-overhead --batch 1,64 --context 1024 --gen-tokens 32 --prefill-tokens '' \
    --time-limit $((cap - 40)) --out "$result" >>"$log" 2>&1 || say "torch-compile: failed or cut short"
  [[ -f "$result" ]] || return 1
  cp "$result" "$out/torch-compile.json"
}

# One pass per kernel (gpu__time_duration needs no replay, so no memory is saved and restored), every kernel of the
# run: the weights' upload, the prefill and the decode steps, each forward pass starting at its embedding_kernel.
# Batch 1 (where the host's gaps would show) and batch 64 (where the matrix products and attention of many sequences
# would), each under the key profile_batch_B of profile.json beside its unprofiled bench report.
# The unprofiled runs of both batches come first, so that a call short of time still has their step times: with
# the kernels' launches overlapped (the default) and without (engine.cuda_overlap); then batch 64 once more with
# CUDA_MODULE_LOADING=EAGER (the fifth report), which loads every kernel's module at start-up: if the batch's
# first decode step (45 ms against about 20 at 99bdc95) is fast there alone, its cost is the lazy loading of the
# kernels cuBLAS picks for the new shapes, not the staging memory's growth (mended in CudaContext since).
stage_profile() {
  need_bin || return 1
  local batch overlap rc=0
  for batch in 1 64; do
    for overlap in on off; do
      # shellcheck disable=SC2046
      bench_run profile 60 $(profile_args "$batch") --set engine.cuda_overlap=$overlap || rc=1
    done
  done
  say "profile: batch 64 with CUDA_MODULE_LOADING=EAGER (the fifth report of profile.json)"
  # shellcheck disable=SC2046
  CUDA_MODULE_LOADING=EAGER bench_run profile 60 $(profile_args 64) || rc=1
  for batch in 1 64; do profile_batch "$batch" || rc=1; done
  return "$rc"
}

profile_args() {
  echo --model preset:llama-3-8b --set kv_cache.memory_mib=16384 --context 1024 --batch "$1" --prompt-tokens 16 \
    --gen-tokens 4
}

profile_batch() {
  local batch=$1 key=profile_batch_$1
  local args
  read -r -a args <<<"$(profile_args "$batch")"
  local bench=(env LD_LIBRARY_PATH="$LIBPATH" "$STRATA" bench --config configs/smollm2-cpu.yaml
               --set engine.backend=cuda --out "$dev/scratch/profiled-bench.json" "${args[@]}")
  local ncu nsys cap scratch=$dev/scratch
  ncu=$(find_tool ncu) nsys=$(find_tool nsys)
  if [[ -n "$ncu" ]] && cap=$(cap_seconds 150); then
    rm -f "$scratch/ncu.csv"
    # The first 2,000 launches are the dummy weights' upload (about 2,000 casts): not profiled, for time.
    record timeout "$cap" "$ncu" --clock-control none --launch-skip 2000 --metrics gpu__time_duration.sum --csv \
      --page raw --print-units base --log-file "$scratch/ncu.csv" "${bench[@]}" >>"$log" 2>&1 ||
      say "profile: ncu exited $? (batch $batch)"
    python3 tools/device/profile_report.py ncu "$scratch/ncu.csv" "$out/profile.json" "$key" 2>>"$log" && return 0
    say "profile: ncu gave no kernel times (a container may refuse it the GPU's counters): trying nsys"
  fi
  [[ -n "$nsys" ]] || { say "profile: nsys is not here either (PATH, /usr/local/cuda/bin, /opt/nvidia)"; return 1; }
  cap=$(cap_seconds 120) || { say "profile: no time left for nsys"; return 1; }
  rm -f "$scratch"/profile.*
  # CUDA tracing only: CPU sampling and context switches need perf events, which a container may not allow.
  record timeout "$cap" "$nsys" profile --trace cuda --sample none --cpuctxsw none --force-overwrite true \
    --output "$scratch/profile" "${bench[@]}" >>"$log" 2>&1 || say "profile: nsys profile exited $?"
  record "$nsys" stats --report cuda_gpu_trace --format csv --force-export true --output "$scratch/profile" \
    "$scratch/profile.nsys-rep" >>"$log" 2>&1 || say "profile: nsys stats exited $?"
  python3 tools/device/profile_report.py nsys "$scratch/profile_cuda_gpu_trace.csv" "$out/profile.json" "$key" \
    2>>"$log"
}

# strata serve on CUDA, with the engine's defaults and the requests' own compression policies.
stage_serve() {
  need_bin && need_model || return 1
  local cap
  cap=$(cap_seconds 60) || { say "serve: no time left"; return 1; }
  record timeout "$cap" env STRATA_LIBRARY_PATH="$LIBPATH" python3 tools/device/serve_check.py "$STRATA" 8000 \
    --set engine.backend=cuda >"$out/serve.json" 2>>"$log"
}

# Unpacks the binaries and keeps the model's parts carried so far, joined once all are there.
stage_join() {
  need_bin
  need_model
}

status=0
for stage in "$@"; do
  case $stage in
    info | tests | compare | serve | profile | torch) fn=stage_$stage ;;
    torch-compile) fn=stage_torch_compile ;;
    join) fn=stage_join ;;
    bench-8b) fn=stage_bench_8b ;;
    bench-8b-long) fn=stage_bench_8b_long ;;
    bench-70b) fn=stage_bench_70b ;;
    capacity-8b) fn=stage_capacity_8b ;;
    *) say "unknown stage '$stage'"; status=2; continue ;;
  esac
  say "$stage: start ($(seconds_left) s left in this call)"
  echo "# stage $stage" >>"$commands"
  if $fn; then say "$stage: done"; else say "$stage: FAILED"; status=1; fi
done
ls -la "$out" >&2
exit $status
