#!/usr/bin/env bash
# Short libFuzzer runs (part of `make test`): the GGUF reader, the request
# parsers, the tokenizer, the profile reader and the routing-dump reader with
# the cache policies, 20 s each; fails when clang/libFuzzer is missing.
# Longer runs: FUZZ_SECONDS=600 tests/fuzz/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
FUZZ_SECONDS=${FUZZ_SECONDS:-20} exec bash tests/fuzz/run.sh
