#!/usr/bin/env bash
# The web chat page of `tandem serve` in headless Chromium (tests/ui,
# playwright-core + Debian's chromium). Screenshot: $BUILD/test-artifacts/ui.png.
# Needs $BUILD/tandem, /usr/bin/chromium and tests/ui/node_modules (tests/setup_node.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
export BUILD=${BUILD:-build}
export TDM_ROOT=${TDM_ROOT:-$PWD}
[ -x "$BUILD/tandem" ] || { echo "ui: $BUILD/tandem is missing (run make)"; exit 1; }
[ -x "${CHROMIUM:-/usr/bin/chromium}" ] || { echo "ui: chromium missing (run tests/setup_node.sh)"; exit 1; }
[ -d tests/ui/node_modules/playwright-core ] || { echo "ui: npm packages missing (run tests/setup_node.sh)"; exit 1; }
cd tests/ui
exec node --test --test-concurrency=1 --test-reporter=spec ui.test.js
