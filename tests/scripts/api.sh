#!/usr/bin/env bash
# `tandem serve` against the official OpenAI and Anthropic SDKs (tests/api,
# node:test): each test file starts its own server on a free port.
# Needs $BUILD/tandem (make) and tests/api/node_modules (tests/setup_node.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
export BUILD=${BUILD:-build}
export TDM_ROOT=${TDM_ROOT:-$PWD}
[ -x "$BUILD/tandem" ] || { echo "api: $BUILD/tandem is missing (run make)"; exit 1; }
[ -d tests/api/node_modules/openai ] || { echo "api: npm packages missing (run tests/setup_node.sh)"; exit 1; }
cd tests/api
exec node --test --test-concurrency=1 --test-reporter=spec \
    openai.test.js anthropic.test.js auth.test.js robustness.test.js
