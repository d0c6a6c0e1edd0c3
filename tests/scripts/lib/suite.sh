# Sourced by the scripted suites that stop at their first failure: the
# repository root as the working folder, BUILD, a temporary folder $tmp
# removed at exit, and fail MESSAGE (prints it, exits 1).
# shellcheck shell=bash
set -u
cd "${TDM_ROOT:-$(dirname "${BASH_SOURCE[0]}")/../../..}" || exit 1
BUILD=${BUILD:-build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
