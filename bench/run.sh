#!/usr/bin/env bash
# Runs every benchmark binary $BUILD/bench/* in name order (what `make bench`
# calls). Each program prints its own table and writes its own JSON under
# bench/results/. GPU benchmarks (named gpu_*) are skipped with a note when
# `nvidia-smi -L` fails. Extra arguments are passed to every program.
# Exit status: 0 when every program that ran succeeded.
set -u
cd "$(dirname "$0")/.." || exit 1
BUILD=${BUILD:-build}
export TDM_ROOT=${TDM_ROOT:-$PWD}
mkdir -p bench/results
have_gpu=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then have_gpu=1; fi
ran=0 failed=0 skipped=0 failed_names=()
for b in "$BUILD"/bench/*; do
    [ -f "$b" ] && [ -x "$b" ] || continue
    name=$(basename "$b")
    if [[ $name == gpu_* ]] && [ $have_gpu -eq 0 ]; then
        echo "=== bench $name: skipped (nvidia-smi -L found no GPU)"
        skipped=$((skipped + 1))
        continue
    fi
    echo "=== bench $name ($(date -u +%Y-%m-%dT%H:%M:%SZ), $(hostname))"
    start=$SECONDS
    if "$b" "$@"; then
        ran=$((ran + 1))
        echo "=== bench $name: ok ($((SECONDS - start)) s)"
    else
        failed=$((failed + 1)); failed_names+=("$name")
        echo "=== bench $name: FAILED ($((SECONDS - start)) s)"
    fi
done
[ ${#failed_names[@]} -gt 0 ] && echo "failed: ${failed_names[*]}"
echo "$ran ran, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
