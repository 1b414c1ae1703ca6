#!/usr/bin/env bash
# Sets up (tools/setup.sh: packages, Python tools, model, build) and serves SmolLM2-135M-Instruct on the CPU.
# Extra arguments go to `strata serve`, e.g. tools/serve.sh --port 9000 --set engine.max_running=8
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
exec build/strata serve --config configs/smollm2-cpu.yaml "$@"
