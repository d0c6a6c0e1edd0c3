#!/usr/bin/env bash
# Short libFuzzer runs of the GGUF reader and the request parsers (part of
# `make test`); fails when clang/libFuzzer is missing. Longer runs: FUZZ_SECONDS=600 tests/fuzz/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
FUZZ_SECONDS=${FUZZ_SECONDS:-30} exec bash tests/fuzz/run.sh
