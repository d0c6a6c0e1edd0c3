#!/usr/bin/env bash
# Runs every GPU test binary under compute-sanitizer: memcheck (out-of-bounds
# and misaligned accesses, leaks of device memory at exit) and racecheck
# (shared-memory hazards). Fails on any reported error or test failure.
set -u
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
export TDM_ROOT=${TDM_ROOT:-$PWD}
export TDM_SANITIZER=1
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
if [ -z "$CS" ]; then
    echo "compute-sanitizer not found" >&2
    exit 1
fi
# cuBLAS's GEMM kernels (nvjet*) crash racecheck: they run uninstrumented
# (the option's name differs between sanitizer versions).
if "$CS" --help 2>&1 | grep -q -- --kernel-name-exclude; then
    race_skip=(--kernel-name-exclude kns=nvjet)
else
    race_skip=(--exclude kns=nvjet)
fi
status=0
for t in "$BUILD"/tests/gpu/test_*; do
    [ -x "$t" ] || continue
    case "$(basename "$t")" in test_gpu_dequant) continue ;; esac # host only, no kernels
    for tool in memcheck racecheck; do
        extra=(--leak-check full)
        [ "$tool" = racecheck ] && extra=("${race_skip[@]}")
        if TDM_SANITIZER=$tool timeout "${SAN_TIMEOUT:-600}" "$CS" --tool "$tool" "${extra[@]}" --error-exitcode 99 "$t" \
            >/tmp/san.$$.log 2>&1; then
            echo "ok   $tool $(basename "$t") ($(grep -c '^\[       OK' /tmp/san.$$.log) tests)"
        else
            echo "FAIL $tool $(basename "$t")"
            grep -E "=========|FAILED|ERROR|error" /tmp/san.$$.log | head -40
            status=1
        fi
    done
done
rm -f /tmp/san.$$.log
exit $status
