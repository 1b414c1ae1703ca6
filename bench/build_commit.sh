#!/usr/bin/env bash
# Builds `strata` of an earlier commit once, for benchmarks that compare it with this build:
#
#   bench/build_commit.sh COMMIT DIR    # prints DIR/build/strata
#
# DIR becomes a git worktree of COMMIT (name it build-*/, which git ignores), with the model folder linked, built
# without CUDA and without tests. An existing DIR/build/strata is reused.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
commit=$1 dir=$2
if [ ! -x "$dir/build/strata" ]; then
  printf '[build-commit] building %s in %s/ (once)\n' "$commit" "$dir" >&2
  [ -d "$dir" ] || git worktree add --detach "$dir" "$commit" >/dev/null
  ln -sfn "$ROOT/models" "$dir/models"
  cmake -S "$dir" -B "$dir/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=OFF -DSTRATA_TESTS=OFF >/dev/null
  cmake --build "$dir/build" -j "$(nproc)" --target strata >/dev/null
fi
echo "$dir/build/strata"
