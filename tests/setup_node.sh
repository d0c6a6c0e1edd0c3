#!/usr/bin/env bash
# Installs what the node-based tests need: node + npm (apt, only when
# missing), Debian's chromium (the web UI test), and the npm packages pinned
# by tests/api/package-lock.json and tests/ui/package-lock.json (npm ci).
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
pkgs=()
command -v node >/dev/null 2>&1 || pkgs+=(nodejs)
command -v npm >/dev/null 2>&1 || pkgs+=(npm)
[ -x /usr/bin/chromium ] || pkgs+=(chromium)
if [ ${#pkgs[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
fi
for d in tests/api tests/ui; do
    (cd "$d" && npm ci --no-audit --no-fund --loglevel=error)
done
echo "node test dependencies installed (node $(node --version), $(/usr/bin/chromium --version 2>/dev/null || echo 'chromium missing'))"
