#!/usr/bin/env bash
# Alternated comparison of tandem builds (or options) with `tandem bench`: every round runs each
# variant once, in the order given, at every VRAM budget, one bench process per run. On the GPU
# machine the host's memory bandwidth moves by 20-40% from one minute to the next, so only runs
# alternated in one call compare (bench/results/hybrid-h200-session*-ab.txt were made this way).
#
#   bench/ab.sh [options] NAME=TANDEM[,ARG...] ...
#     -m MODEL     the GGUF (default: the embedded demo model)
#     -g GIB,...   VRAM budgets (default 12)
#     -r ROUNDS    rounds (default 3)
#     -p N, -n N   prompt and generated tokens (default 512, 128)
#     -t N         pool threads (default 8)
#     -d DEVICE    cuda or cpu (default cuda)
#     -x ARGS      more bench arguments for every run (one word list, e.g. "--zipf 0")
#     -o DIR       where the runs go (default /tmp/ab): NAME_gGIB_rR.json and .log each,
#                  summary.txt
#   e.g. bench/ab.sh -m /tmp/q35u.gguf -g 12,16 -r 4 A=build/dev/tandem B=/tmp/t_B/build/dev/tandem \
#          A3=build/dev/tandem,--zero-copy,3
#
# Prints a line per run as it ends, then the summary: per run its decode and prompt tok/s, hit
# rate, host MB per token, pool GB/s, the run's probe, the direct share and the GPU/wait ms; per
# budget and variant the mean, range and, against the first variant's run of the same round, the
# mean difference and how many rounds it was ahead. Needs python3 for the summary.
# Exit status: 0 when every run wrote its JSON, 1 when one failed (the summary covers the rest),
# 2 for a usage error.
set -u
usage() {
    sed -n '7,16s/^# \{0,1\}//p' "$0" >&2
    exit 2
}
model='' gibs=12 rounds=3 prompt=512 gen=128 threads=8 device=cuda extra='' out=/tmp/ab
while getopts "m:g:r:p:n:t:d:x:o:h" o; do
    case $o in
    m) model=$OPTARG ;;
    g) gibs=$OPTARG ;;
    r) rounds=$OPTARG ;;
    p) prompt=$OPTARG ;;
    n) gen=$OPTARG ;;
    t) threads=$OPTARG ;;
    d) device=$OPTARG ;;
    x) extra=$OPTARG ;;
    o) out=$OPTARG ;;
    *) usage ;;
    esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { echo "ab.sh: name at least one variant NAME=TANDEM[,ARG...]" >&2; usage; }
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "ab.sh: -r takes a positive count, not '$rounds'" >&2; exit 2; }
names=() bins=() args=()
for v in "$@"; do
    name=${v%%=*} spec=${v#*=}
    [[ $v == *=* && $name =~ ^[A-Za-z0-9_.-]+$ && -n $spec ]] ||
        { echo "ab.sh: '$v' is not NAME=TANDEM[,ARG...] (NAME of letters, digits, _ . -)" >&2; exit 2; }
    for n in "${names[@]}"; do
        [ "$n" != "$name" ] || { echo "ab.sh: variant $name named twice" >&2; exit 2; }
    done
    names+=("$name") bins+=("${spec%%,*}")
    [[ $spec == *,* ]] && args+=("${spec#*,}") || args+=("")
done
mkdir -p "$out" || exit 2
IFS=, read -r -a budgets <<< "$gibs"
read -r -a xa <<< "$extra"
failed=0
for g in "${budgets[@]}"; do
    for ((r = 1; r <= rounds; r++)); do
        for i in "${!names[@]}"; do
            base=$out/${names[$i]}_g${g}_r$r
            IFS=, read -r -a va <<< "${args[$i]}"
            cmd=("${bins[$i]}" bench ${model:+-m "$model"} --device "$device" --threads "$threads" \
                 --prompt "$prompt" --gen "$gen" --gpu-mem "$g" "${xa[@]}" "${va[@]}" --json "$base.json")
            rm -f "$base.json"
            t0=$SECONDS
            { echo "command: ${cmd[*]}"; echo; } > "$base.log"
            if "${cmd[@]}" >> "$base.log" 2>&1 && [ -s "$base.json" ]; then
                echo "ab: ${names[$i]} ${g} GiB round $r: done in $((SECONDS - t0)) s"
            else
                echo "ab: ${names[$i]} ${g} GiB round $r: FAILED (see $base.log)"
                failed=1
            fi
        done
    done
done
python3 - "$out" "$rounds" "$gibs" "${names[@]}" <<'PY' | tee "$out/summary.txt"
import json, os, sys
out, rounds, gibs, names = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(","), sys.argv[4:]
def num(x, f="%.1f"):
    return "-" if x is None else f % x
runs = {}  # (budget, round, variant) -> the run's JSON; failed runs are absent
for g in gibs:
    for r in range(1, rounds + 1):
        for name in names:
            fn = os.path.join(out, "%s_g%s_r%d.json" % (name, g, r))
            if os.path.exists(fn):
                runs[(g, r, name)] = json.load(open(fn))["runs"][0]
print("%-12s %6s %5s %8s %8s %6s %7s %6s %6s %5s %6s %6s" % ("variant", "GiB", "round", "decode", "prompt",
      "hit", "hostMB", "poolGB", "probe", "share", "gpu_ms", "wait"))
for (g, r, name), x in runs.items():
    host = x.get("cpu_bytes_per_token") or x.get("bytes_per_token")  # hybrid: the misses; CPU path: all
    print("%-12s %6s %5d %8.1f %8.1f %6s %7s %6s %6s %5s %6s %6s" % (name, g, r, x["decode_tok_s"], x["prompt_tok_s"],
          num(x.get("hit_rate"), "%.4f"), num(host / 1e6 if host is not None else None), num(x.get("pool_gbps")),
          num(x.get("dram_gbps")), num(x.get("direct_share"), "%d"), num(x.get("gpu_ms_per_token"), "%.3f"),
          num(x.get("wait_ms_per_token"), "%.3f")))
print()
for g in gibs:
    for name in names:
        d = [(r, runs[(g, r, name)]["decode_tok_s"]) for r in range(1, rounds + 1) if (g, r, name) in runs]
        if not d:
            print("%s GiB %-12s no runs" % (g, name))
            continue
        v = [x for _, x in d]
        line = "%s GiB %-12s decode mean %.1f (%.1f-%.1f, %d runs)" % (g, name, sum(v) / len(v), min(v), max(v), len(v))
        if name != names[0]:
            diff = [x - runs[(g, r, names[0])]["decode_tok_s"] for r, x in d if (g, r, names[0]) in runs]
            if diff:
                line += ", against %s %+.1f tok/s per round (ahead in %d of %d)" % (
                    names[0], sum(diff) / len(diff), sum(x > 0 for x in diff), len(diff))
        print(line)
PY
[ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
exit $failed
