#!/usr/bin/env bash
# Runs every GPU test binary under compute-sanitizer: memcheck (out-of-bounds
# and misaligned accesses, leaks of device memory at exit), racecheck
# (shared-memory hazards) and synccheck (barriers and warp primitives such as
# __ballot_sync reached by fewer threads than they name). Fails on any
# reported error or test failure.
# The runs are independent processes sharing the GPU: SAN_JOBS of them at a
# time (default 6), each limited to SAN_TIMEOUT seconds (default 600).
# SAN_TOOLS picks the tools (default "memcheck racecheck synccheck").
# Arguments: test names to run (e.g. test_hybrid_gpu); none: every binary.
set -u
cd "$(dirname "$0")/../.." || exit 1
BUILD=${BUILD:-build}
export TDM_ROOT=${TDM_ROOT:-$PWD}
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
if [ -z "$CS" ]; then
    echo "compute-sanitizer not found" >&2
    exit 1
fi
# racecheck crashes inside cuBLAS's GEMM kernels even when they are excluded
# by name: the tests keep cuBLAS out of racecheck runs (TDM_SANITIZER=racecheck:
# gm_race_safe, test_gpu_quant's test_matmul); memcheck covers that path.
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
# Stopped (a caller's timeout, ^C): the runs stop too. Each run's `timeout`
# moves it into a process group of its own, which a signal to the caller's
# group misses, and a run left over would share the GPU with whatever the
# caller starts next (a benchmark would measure it). The runs' `timeout`s are
# signalled by pid (their .pid files) and pass the signal on.
# shellcheck disable=SC2317 # reached through the trap
stop() {
    local p
    for p in "$logs"/*.pid; do [ -f "$p" ] && kill -TERM "$(cat "$p")" 2>/dev/null; done
    wait
    exit 143
}
trap stop TERM INT

# one run: binary, tool, test ("": all) -> $logs/<binary>[@<test>].<tool>.{log,rc}
run() {
    local t=$1 tool=$2 one=$3 extra=() name
    [ "$tool" = memcheck ] && extra=(--leak-check full)
    name=$(basename "$t")${one:+@$one}.$tool
    TDM_TEST_FILTER=$one TDM_SANITIZER=$tool timeout "${SAN_TIMEOUT:-600}" "$CS" --tool "$tool" "${extra[@]}" \
        --error-exitcode 99 "$t" >"$logs/$name.log" 2>&1 &
    echo $! >"$logs/$name.pid"
    wait $!
    echo $? >"$logs/$name.rc"
    rm -f "$logs/$name.pid"
}

# the model tests are the slow ones under both tools (memcheck of
# test_forward_gpu as one process: ~480 s): one process per test there (their
# mains honour TDM_TEST_FILTER, gpu_model_util.h); one run per binary else
units() {
    local src
    src=tests/gpu/$(basename "$1").c
    if grep -q gm_filter "$src" 2>/dev/null; then
        grep -o 'cmocka_unit_test([a-z0-9_]*)' "$src" | sed 's/.*(\(.*\))/\1/'
    else
        echo ""
    fi
}

jobs_running=0
bins=("$BUILD"/tests/gpu/test_*)
[ $# -gt 0 ] && bins=("${@/#/$BUILD/tests/gpu/}")
for t in "${bins[@]}"; do
    [ -x "$t" ] || continue
    case "$(basename "$t")" in test_gpu_dequant) continue ;; esac # host only, no kernels
    for tool in ${SAN_TOOLS:-memcheck racecheck synccheck}; do
        while read -r one; do
            if [ "$jobs_running" -ge "${SAN_JOBS:-6}" ]; then
                wait -n
                jobs_running=$((jobs_running - 1))
            fi
            run "$t" "$tool" "$one" &
            jobs_running=$((jobs_running + 1))
        done < <(units "$t")
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
