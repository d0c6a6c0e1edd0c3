#!/usr/bin/env bash
# One device-machine session for the GPU work: unpack the -dev packages,
# build, run the GPU test binaries, compute-sanitizer, the kernel benchmark
# and (optionally) tools/synth.
# Logs go to $OUT. Usage: bench/gpu_device_run.sh [tests] [san] [bench] [tune] [synth]
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/deps
for f in .deps/*.deb; do dpkg -x "$f" /tmp/deps; done
MK="make -j16 BUILD=build/dev DEPS_PREFIX=/tmp/deps CUDA_ARCHS=90 CUDA_PTX=90"
start=$SECONDS
$MK all >"$OUT/build.log" 2>&1 || { echo BUILD FAILED; grep -E "error" "$OUT/build.log" | head -30; }
echo "build: $((SECONDS - start)) s"
export TDM_ROOT=$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
for stage in "$@"; do
    s0=$SECONDS
    case $stage in
    tests)
        for t in build/dev/tests/gpu/test_*; do
            n=$(basename "$t")
            timeout 180 "$t" >"$OUT/$n.log" 2>&1
            echo "$n rc=$? ($(grep -c '^\[       OK' "$OUT/$n.log") ok)"
            grep -E "FAILED|ERROR|out of bounds|got .* want" "$OUT/$n.log" | head -12
        done ;;
    san)
        BUILD=build/dev timeout 240 bash tests/gpu/sanitizer.sh >"$OUT/san.log" 2>&1
        echo "sanitizer rc=$?"; tail -25 "$OUT/san.log" ;;
    bench)
        timeout 200 build/dev/bench/gpu_kernels --out "$OUT/gpu_kernels.json" >"$OUT/bench.log" 2>&1
        echo "bench rc=$?"; tail -n 120 "$OUT/bench.log" ;;
    tune)
        timeout 200 build/dev/bench/gpu_kernels --tunings --formats Q4_K,Q6_K,BF16 \
            --out "$OUT/gpu_kernels_tunings.json" >"$OUT/tune.log" 2>&1
        echo "tune rc=$?"; grep -E "wpr|rows|MoE|copy" "$OUT/tune.log" | head -80 ;;
    synth)
        timeout 300 bash bench/gpu_synth_check.sh >"$OUT/synth.log" 2>&1
        echo "synth rc=$?"; tail -30 "$OUT/synth.log" ;;
    esac
    echo "stage $stage: $((SECONDS - s0)) s"
done
