#!/usr/bin/env bash
# Plots a tandem JSON result as PNG with gnuplot (needs python3 and gnuplot).
#   bench/plot.sh FILE.json [OUT_PREFIX]
# - format "tandem-bench", CPU path ("engine_path": "cpu"):
#                               OUT_PREFIX-threads.png  prompt and decode tok/s against threads,
#                                                         one line per prompt length;
#                               OUT_PREFIX-vram.png     projected decode tok/s against the VRAM
#                                                         budget (+ measured points when filled).
# - format "tandem-bench", hybrid path ("engine_path": "hybrid"), one line per series:
#                               OUT_PREFIX-vram.png     measured decode tok/s against the VRAM
#                                                         budget per (threads, fill, prompt), with
#                                                         the bound (dashed), the projection (dotted)
#                                                         and the bound with its latency term
#                                                         (dash-dot; files before it: no line);
#                               OUT_PREFIX-threads.png  the same against the pool threads per
#                                                         (VRAM budget, fill, prompt).
# - format "tandem-projection": OUT_PREFIX.png          projected decode tok/s against VRAM,
#                                                         one line per DRAM row.
# OUT_PREFIX defaults to FILE without .json. Prints the PNG paths written.
# Exit status 3 when gnuplot or python3 is missing (tandem bench --plot then only warns).
set -euo pipefail
json=${1:?usage: bench/plot.sh FILE.json [OUT_PREFIX]}
out=${2:-${json%.json}}
for t in gnuplot python3; do
    command -v $t >/dev/null || { echo "plot.sh: $t not found" >&2; exit 3; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# JSON -> whitespace-separated data blocks (one per line of the plot) + a title.
python3 - "$json" "$tmp" <<'EOF'
import json, sys
doc = json.load(open(sys.argv[1]))
tmp = sys.argv[2]
fmt = doc.get("format")
def w(name, text): open(f"{tmp}/{name}", "w").write(text)
def num(v): return "NaN" if v is None else v
if fmt == "tandem-bench" and doc.get("engine_path") == "hybrid":
    # one series per fixed (other axes); x = gpu_mem_gib or threads
    w("kind", "hybrid\n")
    w("title", f"{doc['model']['name']}, hybrid path")
    for x, others, label in (("gpu_mem_gib", ("threads", "fill", "prompt_tokens"), "{} thr, {}, p{}"),
                             ("threads", ("gpu_mem_gib", "fill", "prompt_tokens"), "{:g} GiB, {}, p{}")):
        series = {}
        for r in doc["runs"]:
            series.setdefault(tuple(r[k] for k in others), []).append(r)
        keys = sorted(series)
        w(f"{x}.dat", "\n\n".join("".join(
            f"{r[x]} {r['decode_tok_s']} {num(r['bound_tok_s'])} {num(r['projected_tok_s'])} "
            f"{num(r.get('bound_latency_tok_s'))}\n"
            for r in sorted(series[k], key=lambda r: r[x])) for k in keys) + "\n")
        w(f"{x}.names", "\n".join(label.format(*k) for k in keys) + "\n")
elif fmt == "tandem-bench":
    m = doc["model"]["name"]
    w("kind", "bench\n")
    w("title", f"{m}, {doc['engine_path']} path")
    by = {}
    for r in doc["runs"]:
        by.setdefault(r["prompt_tokens"], []).append(r)
    blocks = []
    for p in sorted(by):
        rows = sorted(by[p], key=lambda r: r["threads"])
        blocks.append(f"# prompt {p}\n" + "".join(
            f"{r['threads']} {r['prompt_tok_s']} {r['decode_tok_s']}\n" for r in rows))
    w("threads.dat", "\n\n".join(blocks) + "\n")
    w("prompts", " ".join(str(p) for p in sorted(by)) + "\n")
    threads = sorted({r["threads"] for r in doc["runs"]})
    w("xtics", "(" + ", ".join(str(t) for t in threads) + ")\n")
    vram = doc.get("vram") or []
    if vram:
        w("vram.dat", "".join(
            f"{v['gpu_mem_gib']} {v['projected_tok_s']} "
            f"{v['measured_tok_s'] if v['measured_tok_s'] is not None else 'NaN'}\n" for v in vram))
elif fmt == "tandem-projection":
    w("kind", "projection\n")
    a = doc["assumptions"]
    w("title", f"{doc['model']['name']}: projected decode (eff {a['efficiency']:.2f}, "
               f"VRAM {a['vram_gbps']:.0f} GB/s, {a['hit_model']['source']})")
    names = [d["name"] for d in doc["dram"]]
    blocks = []
    for n in names:
        pts = [p for p in doc["points"] if p["dram"] == n]
        blocks.append("".join(f"{p['vram_gib']} {p['tok_s']}\n" for p in pts))
    w("proj.dat", "\n\n".join(blocks) + "\n")
    w("names", "\n".join(names) + "\n")
else:
    sys.exit(f"plot.sh: {sys.argv[1]}: unknown format {fmt!r}")
EOF

kind=$(cat "$tmp/kind")
title=$(sed 's/"/\\"/g' "$tmp/title")
if [ "$kind" = hybrid ]; then
    for axis in "gpu_mem_gib:vram:VRAM budget (GiB)" "threads:threads:CPU pool threads"; do
        IFS=: read -r x suffix xlabel <<< "$axis"
        plot="" i=0
        while IFS= read -r n; do
            plot+="'$tmp/$x.dat' index $i using 1:2 with linespoints linecolor $((i + 1)) title 'decode, $n', "
            plot+="'$tmp/$x.dat' index $i using 1:3 with lines dashtype 2 linecolor $((i + 1)) title 'bound', "
            plot+="'$tmp/$x.dat' index $i using 1:4 with lines dashtype 3 linecolor $((i + 1)) title 'projected', "
            plot+="'$tmp/$x.dat' index $i using 1:5 with lines dashtype 4 linecolor $((i + 1)) title 'bound + latency', "
            i=$((i + 1))
        done < "$tmp/$x.names"
        # a single x value makes gnuplot warn about an empty range (and widen it): not an error
        gnuplot <<EOF 2> "$tmp/gnuplot.err" || { cat "$tmp/gnuplot.err" >&2; exit 1; }
set terminal pngcairo size 1000,600
set output '$out-$suffix.png'
set title "$title: decode tok/s against the $xlabel" noenhanced
set xlabel '$xlabel'
set ylabel 'decode tokens/s'
set offsets graph 0.05, graph 0.05, 0, 0
set grid
set yrange [0:*]
set key outside right
plot ${plot%, }
EOF
        echo "$out-$suffix.png"
    done
elif [ "$kind" = bench ]; then
    read -r -a prompts < "$tmp/prompts"
    plot="" i=0
    for p in "${prompts[@]}"; do
        plot+="'$tmp/threads.dat' index $i using 1:3 with linespoints title 'decode, prompt $p', "
        plot+="'$tmp/threads.dat' index $i using 1:2 with linespoints dashtype 2 title 'prefill, prompt $p', "
        i=$((i + 1))
    done
    gnuplot <<EOF
set terminal pngcairo size 900,560
set output '$out-threads.png'
set title "$title" noenhanced
set xlabel 'threads'
set ylabel 'tokens/s'
set xtics $(cat "$tmp/xtics")
set offsets graph 0.05, graph 0.05, 0, 0
set logscale y
set grid
set key outside right
plot ${plot%, }
EOF
    echo "$out-threads.png"
    if [ -f "$tmp/vram.dat" ]; then
        gnuplot <<EOF
set terminal pngcairo size 900,560
set output '$out-vram.png'
set title "$title: decode against the VRAM budget" noenhanced
set xlabel 'VRAM budget (GiB)'
set ylabel 'decode tokens/s'
set grid
set yrange [0:*]
plot '$tmp/vram.dat' using 1:2 with linespoints title 'projected', \
     '$tmp/vram.dat' using 1:3 with points pointsize 2 title 'measured'
EOF
        echo "$out-vram.png"
    fi
else
    plot="" i=0
    while IFS= read -r n; do
        plot+="'$tmp/proj.dat' index $i using 1:2 with linespoints title '$n', "
        i=$((i + 1))
    done < "$tmp/names"
    gnuplot <<EOF
set terminal pngcairo size 900,560
set output '$out.png'
set title "$title" noenhanced
set xlabel 'VRAM (GiB)'
set ylabel 'decode tokens/s'
set grid
set yrange [0:*]
set key left top
plot ${plot%, }
EOF
    echo "$out.png"
fi
