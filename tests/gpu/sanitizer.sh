#!/usr/bin/env bash
# Runs every GPU test binary under compute-sanitizer: memcheck (out-of-bounds
# and misaligned accesses, leaks of device memory at exit) and racecheck
# (shared-memory hazards). Fails on any reported error or test failure.
# The runs are independent processes sharing the GPU: SAN_JOBS of them at a
# time (default 6), each limited to SAN_TIMEOUT seconds (default 600).
# Arguments: test names to run (e.g. test_hybrid_gpu); none: every binary.
set -u
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
export TDM_ROOT=${TDM_ROOT:-$PWD}
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
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

# one run: binary, tool -> $logs/<binary>.<tool>.{log,rc}
run() {
    local t=$1 tool=$2 extra=(--leak-check full)
    [ "$tool" = racecheck ] && extra=("${race_skip[@]}")
    TDM_SANITIZER=$tool timeout "${SAN_TIMEOUT:-600}" "$CS" --tool "$tool" "${extra[@]}" --error-exitcode 99 "$t" \
        >"$logs/$(basename "$t").$tool.log" 2>&1
    echo $? >"$logs/$(basename "$t").$tool.rc"
}

jobs_running=0
bins=("$BUILD"/tests/gpu/test_*)
[ $# -gt 0 ] && bins=("${@/#/$BUILD/tests/gpu/}")
for t in "${bins[@]}"; do
    [ -x "$t" ] || continue
    case "$(basename "$t")" in test_gpu_dequant) continue ;; esac # host only, no kernels
    for tool in memcheck racecheck; do
        if [ "$jobs_running" -ge "${SAN_JOBS:-6}" ]; then
            wait -n
            jobs_running=$((jobs_running - 1))
        fi
        run "$t" "$tool" &
        jobs_running=$((jobs_running + 1))
    done
done
wait

status=0
for rc in "$logs"/*.rc; do
    name=$(basename "$rc" .rc)
    log="$logs/$name.log"
    if [ "$(cat "$rc")" = 0 ]; then
        echo "ok   ${name#*.} ${name%.*} ($(grep -c '^\[       OK' "$log") tests)"
    else
        echo "FAIL ${name#*.} ${name%.*} (exit $(cat "$rc"); 124 = over SAN_TIMEOUT)"
        grep -E "=========|FAILED|ERROR|error" "$log" | head -40
        status=1
    fi
done
exit $status
