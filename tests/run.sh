#!/usr/bin/env bash
# Runs the test suites and prints one closing line "N passed, N failed".
#   tests/run.sh          unit binaries (build/tests/test_*) + scripted suites (tests/scripts/*.sh)
#   tests/run.sh --unit   unit binaries only (the sanitizer build)
#   tests/run.sh --gpu    GPU binaries (build/tests/gpu/test_*) + tests/gpu/*.sh
# A suite passes when it exits 0. Each suite's output is kept under $BUILD/test-logs.
set -u
cd "$(dirname "$0")/.." || exit 1
BUILD=${BUILD:-build}
export TDM_ROOT=${TDM_ROOT:-$PWD}
# Idle OpenMP threads sleep instead of spinning: suites run side by side with
# servers and other processes on small CI machines.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
mode=${1:-all}
logs=$BUILD/test-logs
mkdir -p "$logs"
passed=0 failed=0 failed_names=()

run_suite() {
    local name=$1; shift
    local log="$logs/$name.log" start=$SECONDS
    mkdir -p "$(dirname "$log")"
    printf '%-44s ' "$name"
    if "$@" >"$log" 2>&1; then
        passed=$((passed + 1)); echo "ok   ($((SECONDS - start)) s)"
    else
        failed=$((failed + 1)); failed_names+=("$name"); echo "FAIL ($((SECONDS - start)) s)"
    fi
}

if [ "$mode" = --gpu ]; then
    for t in "$BUILD"/tests/gpu/test_*; do [ -x "$t" ] && run_suite "gpu/$(basename "$t")" "$t"; done
    for s in tests/gpu/*.sh; do [ -f "$s" ] && run_suite "gpu/$(basename "$s" .sh)" bash "$s"; done
else
    for t in "$BUILD"/tests/test_*; do [ -x "$t" ] && run_suite "$(basename "$t")" "$t"; done
    if [ "$mode" != --unit ]; then
        for s in tests/scripts/*.sh; do [ -f "$s" ] && run_suite "$(basename "$s" .sh)" bash "$s"; done
    fi
fi

# The failures' log tails come last, next to the summary: a CI report that
# keeps only the end of the output still shows why.
for name in "${failed_names[@]}"; do
    echo "--- $name: the end of $logs/$name.log"
    tail -n 25 "$logs/$name.log" | sed 's/^/    | /'
done
[ ${#failed_names[@]} -gt 0 ] && echo "failed: ${failed_names[*]} (logs in $logs)"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
