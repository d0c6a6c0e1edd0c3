# Sourced by the scripted suites: the repository root as the working
# folder, BUILD, a temporary folder $tmp removed at exit; fail MESSAGE
# (prints it, exits 1) for suites that stop at their first failure, ok NAME
# and bad NAME (remembered in $failed; such a suite ends with exit $failed)
# for those that go on.
# shellcheck shell=bash disable=SC2034 # $failed is read by the suites that source this
set -u
cd "${TDM_ROOT:-$(dirname "${BASH_SOURCE[0]}")/../../..}" || exit 1
BUILD=${BUILD:-build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
failed=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; failed=1; }
