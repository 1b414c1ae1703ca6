#!/usr/bin/env bash
# Builds Strata with the CUDA backend (build-device/, Release, default options) and assembles .device/, what a
# session with a GPU machine carries to it (docs/gpu.md). The machine has CUDA 13, python3 with PyTorch, and none
# of Strata's other libraries, and each call carries at most 64 MiB of the working tree, so:
#   .device/bin/strata-device.tar.xz  the strata binary, the test executables that hold CUDA or NCCL tests
#                                     (stripped), every shared library they need
#                                     except glibc's, libcuda and the CUDA libraries the image has (cuBLAS,
#                                     cuBLASLt, NCCL: tools/device/gpu_run.sh finds them there), and MANIFEST
#   .device/model-K/                  models/SmolLM2-135M-Instruct.Q4_1.gguf compressed with xz (98 MB to 90),
#                                     in parts, each with its .sha256: the first as large as fits beside the binaries
#                                     in one call, each later one alone
# Then it checks the pack as the GPU machine will use it (an empty environment, only the carried libraries on
# LD_LIBRARY_PATH): strata --help, the CPU kernel tests, and a CPU `strata generate` on the joined model; and it
# prints each carry folder's size and the `run` calls to make.
#   tools/device/pack.sh [--no-build]     --no-build: pack build-device/ as it is
set -euo pipefail
cd "$(dirname "$0")/../.." || exit 1
root=$PWD
build="build-device"
dev=".device"
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
# Libraries the GPU image provides: glibc's own, the driver's, and the CUDA libraries of its toolkit and pip
# packages (KINDS.md: cuBLAS and NCCL come with PyTorch's nvidia-* packages).
provided='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libutil|libcuda|libcublas|libcublasLt|libnccl)[.-]'

fail() { echo "pack.sh: $*" >&2; exit 1; }

exclude=$(git rev-parse --git-path info/exclude)
grep -qxF '/.device/' "$exclude" 2>/dev/null || echo '/.device/' >>"$exclude"

if [[ "${1:-}" != "--no-build" ]]; then
  nice -n 15 cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  nice -n 15 cmake --build "$build" -j"$(nproc)"
fi
grep -q '^STRATA_CUDA:BOOL=ON' "$build/CMakeCache.txt" || fail "$build was configured without the CUDA backend (no nvcc?)"
[[ -f "$model" && -f "$model.sha256" ]] || fail "$model or its .sha256 is missing: run tools/setup.sh"

rm -rf "$dev"
stage=$dev/stage
mkdir -p "$stage/bin/tests" "$stage/lib" "$dev/bin"
cp "$build/strata" "$stage/bin/"
# Only the test executables that hold CUDA or NCCL tests travel (the call's 64 MiB are short), stripped.
for exe in "$build"/tests/*_tests; do
  "$exe" --gtest_list_tests --gtest_filter='*Cuda*:*CUDA*:*cuda*:*Nccl*' 2>/dev/null | grep -q '^ ' &&
    cp "$exe" "$stage/bin/tests/"
done
strip --strip-unneeded "$stage"/bin/strata "$stage"/bin/tests/*

# Every library the binaries load, by the name they ask for, minus what the image has.
for b in "$stage"/bin/strata "$stage"/bin/tests/*; do ldd "$b"; done |
  awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u | while read -r name path; do
    [[ "$name" =~ $provided ]] || cp -L "$path" "$stage/lib/$name"
  done
needed_cuda=$(for b in "$stage"/bin/strata "$stage"/bin/tests/*; do ldd "$b"; done |
  awk '{print $1}' | { grep -E '^(libcublas|libcublasLt|libnccl)[.]' || true; } | sort -u | tr '\n' ' ')
missing=$(ldd "$stage/bin/strata" | grep 'not found' || true)
[[ -z "$missing" ]] || fail "strata has unresolved libraries here: $missing"

{
  echo "commit $(git rev-parse HEAD)$(git diff --quiet HEAD -- . ':!.device' 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n)"
  echo "source_dir $root"  # the tests' STRATA_SOURCE_DIR: gpu_run.sh links it to the repository on the device
  echo "cuda_libraries $needed_cuda"
  # The GPU image's glibc must be at least this (Debian 12 builds: 2.36; Ubuntu 24.04 has 2.39).
  echo "glibc_required $(for f in "$stage"/bin/strata "$stage"/bin/tests/* "$stage"/lib/*; do objdump -T "$f"; done |
    grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)"
  echo "nvcc $(sed -n 's/^CMAKE_CUDA_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt")"
  (cd "$stage" && find bin lib -type f -printf '%p %s\n' | sort)
} >"$stage/MANIFEST"
(cd "$stage" && XZ_OPT='-9e -T0' tar -cJf "$root/$dev/bin/strata-device.tar.xz" MANIFEST bin lib)

# The model compressed, in parts, each with its .sha256 (of the model itself): call 1 carries .device/bin and
# part 1, each later call the next part alone (the binaries and earlier parts stay on the warm machine). A call
# moves at most 64 MiB with the working tree; 63 leaves room for what git does not count. Two parts sufficed while
# the tree was under about 11 MiB; at 21.5 MiB (stop 55: bench/results) it takes three. The compressed model is
# kept in .device/ until the model changes.
room=$((63 * 1048576))
tree_bytes=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
compressed=$dev/$(basename "$model").xz
[[ -f "$compressed" && "$compressed" -nt "$model" ]] || xz -T0 -6 -c "$model" >"$compressed"
first=$((room - tree_bytes - $(stat -c %s "$dev/bin/strata-device.tar.xz")))
later=$((room - tree_bytes))
total=$(stat -c %s "$compressed")
(( first > 0 && later > 0 )) || fail "the working tree ($tree_bytes bytes) leaves no room for the model in a call"
parts=$(( 1 + (total - first + later - 1) / later ))
rm -rf "$dev"/model-*
offset=0
for ((k = 1; k <= parts; k++)); do
  size=$later
  (( k == 1 )) && size=$first
  mkdir -p "$dev/model-$k"
  dd if="$compressed" of="$dev/model-$k/$(basename "$compressed").part$k-of-$parts" bs=1M iflag=skip_bytes,count_bytes \
    skip="$offset" count="$size" status=none
  cp "$model.sha256" "$dev/model-$k/"
  offset=$((offset + size))
done
# The check: unpack as gpu_run.sh does, then run with an empty environment and the carried libraries only.
check=$dev/check
mkdir -p "$check"
python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$dev/bin/strata-device.tar.xz" "$check"
lib=$root/$check/lib
for b in "$check"/bin/strata "$check"/bin/tests/*; do
  # Every library must resolve to the carried folder, except what the image provides.
  env -i LD_LIBRARY_PATH="$lib" ldd "$b" | awk '$2 == "=>" {print $1, $3}' | while read -r name path; do
    [[ "$name" =~ $provided || "$path" == "$lib/"* ]] || fail "$(basename "$b"): $name resolves to $path, not to the pack"
  done
done
run_packed() { env -i PATH=/usr/bin:/bin HOME=/tmp LD_LIBRARY_PATH="$lib" "$@"; }
run_packed "$check/bin/strata" --help >/dev/null || fail "strata --help failed from the pack"
for ((k = 1; k <= parts; k++)); do cat "$dev/model-$k/"*.part$k-of-$parts; done >"$check/model.gguf.xz"
python3 "$root/tools/device/unxz.py" "$check/model.gguf.xz" "$check/model.gguf"
echo "$(cut -d' ' -f1 "$model.sha256")  $check/model.gguf" | sha256sum -c --quiet ||
  fail "the joined model does not match $model.sha256"
run_packed nice -n 15 "$check/bin/tests/kernels_tests" --gtest_brief=1 --gtest_filter='-Cuda*' >/dev/null ||
  fail "kernels_tests (CPU) failed from the pack"
generated=$(run_packed nice -n 15 "$check/bin/strata" generate --config configs/smollm2-cpu.yaml \
  --set model.path="$check/model.gguf" --set engine.threads=1 --prompt "The capital of France is" \
  --max-tokens 8 --json 2>/dev/null | wc -l)
[[ "$generated" == 8 ]] || fail "a CPU strata generate from the pack printed $generated tokens, not 8"
rm -rf "$check" "$stage"

echo "pack.sh: checked: strata --help, kernels_tests (CPU), strata generate on the joined model, from the pack"
echo "pack.sh: carry folders (a call carries at most 64 MiB with the working tree):"
mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
for d in bin $(cd "$dev" && ls -d model-*); do
  printf '  %-16s %6s MiB\n' "$dev/$d" "$(mib "$(du -sb "$dev/$d" | cut -f1)")"
done
printf '  %-16s %6s MiB\n' "working tree" "$(mib "$tree_bytes")"
echo "pack.sh: the device calls, each right after the one before (the machine stays warm about 30 s after a call,"
echo "and what was carried stays there while it is warm); timeout_s 600 each:"
echo "  1. carry [\".device/bin\", \".device/model-1\"]  command: STRATA_CALL_SECONDS=360"\
  "tools/device/gpu_run.sh info tests torch-compile profile bench-8b-long"
for ((k = 2; k < parts; k++)); do
  echo "  $k. carry [\".device/model-$k\"]                 command: tools/device/gpu_run.sh join"
done
echo "  $parts. carry [\".device/model-$parts\"]                 command: STRATA_TESTS_FILTER='*SmolLm2*'"\
  "tools/device/gpu_run.sh join tests compare serve"
echo "A later call needs what the calls before it left there. If it says a part is missing, the machine went cold in"
echo "between: carry [\".device/bin\", \".device/model-1\"] with \"tools/device/gpu_run.sh join\" (it reports the parts"
echo "still missing), then carry those."
