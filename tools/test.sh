#!/usr/bin/env bash
# Sets up (tools/setup.sh) and runs every test: the C++ suites through ctest, then the Python suites (reference
# tokenizer, metrics format, end-to-end HTTP tests against the real server) through pytest, then each fuzzing
# harness for a few seconds (tools/fuzz.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
status=0
ctest --test-dir build --output-on-failure || status=1
STRATA_BIN="$PWD/build/strata" STRATA_BUILD_DIR="$PWD/build" .venv/bin/python -m pytest tests -q -p no:cacheprovider || status=1
# Every libFuzzer harness for a few seconds (tests/fuzz/, docs/fuzzing.md; built in build-fuzz/): a crash fails.
tools/fuzz.sh "${STRATA_FUZZ_SECONDS:-10}" || status=1
exit $status
