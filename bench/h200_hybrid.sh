#!/usr/bin/env bash
# The hybrid benchmarks of issues 6, 7 and 9 in one go, on the GPU machine (docs/BENCH.md):
#   a) uniform-routing synthetic Qwen3.5-35B-A3B Q4_K_M, --gpu-mem 8,12,16,24, 8 pool threads
#      (the comparison with llama.cpp at the same VRAM budget);
#   b) the same grid on the default-skew model;
#   c) skewed model, 12 GiB, threads 2,4,8,15 with --validate (projection vs measured);
#   d) skewed model, 12 GiB, 8 threads, fills layer / profile / adaptive;
#   e) skewed model, 12 GiB, 8 threads, experts copied to huge-page memory (--expert-memory copy).
# Needs `make -j16 BUILD=build/dev DEPS_PREFIX=/tmp/deps CUDA_ARCHS=90 CUDA_PTX=90` first; run from
# anywhere. Writes JSON, PNGs, per-step output and a log into $OUT (default /tmp/h200_hybrid).
# Models: /tmp/q35.gguf and /tmp/q35u.gguf (~20 GB each; reused when present, FORCE_SYNTH=1 to
# rewrite). One prompt length (512) and 64 decoded tokens per point keep the run near 6 minutes:
# a 4096-token prefill has the CPU pool compute every miss of the prompt, and the decode counters
# settle within tens of tokens.
# set -u, not -e: a failing step is reported and the others still run.
set -u
cd "$(dirname "$0")/.." || exit 1
BUILD=${BUILD:-build/dev}
OUT=${OUT:-/tmp/h200_hybrid}
T=$BUILD/tandem
SKEW=/tmp/q35.gguf UNIF=/tmp/q35u.gguf PROF=/tmp/q35.profile.json
mkdir -p "$OUT"
log=$OUT/h200_hybrid.log
: > "$log"
summary=()

if [ ! -x "$T" ] || [ ! -x "$BUILD/tools/synth" ]; then
    echo "h200_hybrid: build first: make -j16 BUILD=$BUILD DEPS_PREFIX=/tmp/deps CUDA_ARCHS=90 CUDA_PTX=90" >&2
    exit 1
fi

# step NAME SECONDS CMD...: runs CMD under timeout, stdout+stderr to $OUT/NAME.txt (with the command
# line first) and the log; records the exit status and the wall time.
step() {
    local name=$1 lim=$2
    shift 2
    local t0=$SECONDS
    { echo "command: $*"; echo; } > "$OUT/$name.txt"
    echo "== $name: $*" | tee -a "$log"
    timeout "$lim" "$@" >> "$OUT/$name.txt" 2>&1
    local rc=$?
    cat "$OUT/$name.txt" >> "$log"
    summary+=("$(printf '%-12s rc %-3s %4ss' "$name" "$rc" "$((SECONDS - t0))")")
    echo "== $name: exit $rc after $((SECONDS - t0)) s" | tee -a "$log"
    return $rc
}

nvidia-smi -L >> "$log" 2>&1
lscpu | grep -E 'Model name|^CPU\(s\)|Core\(s\) per socket|Socket' >> "$log" 2>&1

# models (synth prints the routing share of its hottest experts)
if [ ! -s "$SKEW" ] || [ "${FORCE_SYNTH:-0}" = 1 ]; then
    step synth-skew 180 "$BUILD/tools/synth" --preset qwen35-35b-a3b -o "$SKEW"
fi
if [ ! -s "$UNIF" ] || [ "${FORCE_SYNTH:-0}" = 1 ]; then
    step synth-unif 180 "$BUILD/tools/synth" --preset qwen35-35b-a3b --route-skew 0 -o "$UNIF"
fi

# expert profile of the skewed model, on the GPU (the whole model fits the H200)
step profile 240 "$T" profile -m "$SKEW" --device cuda --text-file profiles/corpus/prose.txt -o "$PROF" --tokens 2048

common=(--device cuda --prompt 512 --gen 64)
# a) uniform routing: hit rate = cached fraction whatever the fill; Zipf s=0 for the projection
step a-uniform 150 "$T" bench -m "$UNIF" "${common[@]}" --gpu-mem 8,12,16,24 --threads 8 --zipf 0 \
    --validate --json "$OUT/a-uniform.json" --plot
# b) default skew, the same grid
step b-skewed 150 "$T" bench -m "$SKEW" "${common[@]}" --gpu-mem 8,12,16,24 --threads 8 \
    --validate --json "$OUT/b-skewed.json" --plot
# c) projection validation: bandwidth emulated by the pool's thread count
step c-validate 180 "$T" bench -m "$SKEW" "${common[@]}" --gpu-mem 12 --threads 2,4,8,15 \
    --validate --json "$OUT/c-validate.json" --plot
# d) the three fills at 12 GiB (layer only when the profile step failed)
if [ -s "$PROF" ]; then
    step d-fills 150 "$T" bench -m "$SKEW" "${common[@]}" --gpu-mem 12 --threads 8 \
        --fill layer,profile,adaptive --profile "$PROF" --hit-curve "$PROF" --validate \
        --json "$OUT/d-fills.json"
else
    step d-fills 150 "$T" bench -m "$SKEW" "${common[@]}" --gpu-mem 12 --threads 8 --fill layer \
        --validate --json "$OUT/d-fills.json"
fi

# e) the experts read from a huge-page copy instead of the file mapping (compare with d's layer fill)
step e-expert-copy 150 "$T" bench -m "$SKEW" "${common[@]}" --gpu-mem 12 --threads 8 --fill layer \
    --expert-memory copy --validate --json "$OUT/e-expert-copy.json"

{
    echo
    echo "steps:"
    printf '  %s\n' "${summary[@]}"
    python3 - "$OUT" <<'PY'
import glob, json, os, sys
LLAMA = {"12": 75.5}  # llama.cpp, experts of 19/40 layers on the CPU (~12 GB VRAM), 8 threads
def f(v, fmt):
    return "n/a" if v is None else fmt % v
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    try:
        d = json.load(open(path))
    except (OSError, ValueError):
        continue
    if d.get("format") != "tandem-bench":
        continue
    g = d.get("gpu", {})
    print(f"\n{os.path.basename(path)}: {d['model']['name']}, B_vram {f(g.get('copy_gbps'), '%.0f')} GB/s, "
          f"efficiency {f(d.get('validation', {}).get('efficiency'), '%.3f')}")
    print(f"  {'GiB':>5} {'fill':<8} {'thr':>3} {'tok/s':>7} {'hit':>6} {'poolGB/s':>8} {'B_dram':>7} "
          f"{'bound':>7} {'of bnd':>7} {'proj':>7} {'error':>7} {'vs llama':>8}")
    for r in d["runs"]:
        ll = LLAMA.get("%g" % r["gpu_mem_gib"]) if r["threads"] == 8 and "q35u" in d["model"]["name"] else None
        print(f"  {r['gpu_mem_gib']:5g} {r['fill']:<8} {r['threads']:3d} {r['decode_tok_s']:7.1f} "
              f"{f(r['hit_rate'] and 100 * r['hit_rate'], '%5.1f%%'):>6} {f(r['pool_gbps'], '%8.1f'):>8} "
              f"{f(r['dram_gbps'], '%7.1f'):>7} {f(r['bound_tok_s'], '%7.1f'):>7} "
              f"{f(r['fraction_of_bound'] and 100 * r['fraction_of_bound'], '%6.1f%%'):>7} "
              f"{f(r['projected_tok_s'], '%7.1f'):>7} {f(r['rel_error'] and 100 * r['rel_error'], '%+6.1f%%'):>7} "
              f"{f(ll and r['decode_tok_s'] / ll, '%7.2fx'):>8}")
PY
} | tee -a "$log"
echo "outputs in $OUT (log: $log)"
