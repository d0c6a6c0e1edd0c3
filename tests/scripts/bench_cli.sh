#!/usr/bin/env bash
# `tandem bench --project`, tools/ddr --preset and a short `tandem bench` run:
# the JSON they write parses, has every field, and obeys the sanity relations
# of the projection (more host bandwidth -> not slower, more VRAM -> not slower).
# The validator is also shown a doctored file and must reject it.
# shellcheck source=tests/scripts/lib/suite.sh
. "$(dirname "$0")/lib/suite.sh"

validate() { # validate FILE -> exit status of the checks
python3 - "$1" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
def need(c, msg):
    if not c:
        sys.exit(f"{sys.argv[1]}: {msg}")
need(doc.get("format") == "tandem-projection" and doc.get("version") == 1, "format/version")
b = doc["model"]["bytes"]
for k in ("active_expert_per_token", "dense_per_token", "slot", "total_experts", "resident_nonexpert"):
    need(isinstance(b.get(k), (int, float)) and b[k] > 0, f"model.bytes.{k}")
need(b["total_experts"] >= b["active_expert_per_token"], "total experts < active experts")
a = doc["assumptions"]
need(0 < a["efficiency"] <= 1.5 and a["vram_gbps"] > 0 and a["layer_latency_us"] >= 0, "assumptions")
drams, vrams, pts = doc["dram"], doc["vram_gib"], doc["points"]
need(len(pts) == len(drams) * len(vrams), "points != dram x vram")
bounds = {"cpu-dram", "gpu-vram", "latency", "no-fit"}
cell = {}
for p in pts:
    need(p["bound"] in bounds, f"bound {p['bound']}")
    need(p["measured_tok_s"] is None and p["rel_error"] is None, "validation fields")
    need(0 <= p["hit_rate"] <= 1 and 0 <= p["cached_fraction"] <= 1, "hit/cached out of range")
    need(p["fits"] == (p["bound"] != "no-fit"), "fits vs bound")
    need((p["tok_s"] > 0) == p["fits"], "tok_s > 0 exactly when it fits")
    need(p["tok_s"] <= p["tok_s_overlap"] * (1 + 1e-9), "serial projection above the overlapped ceiling")
    need(0 < p["efficiency"] <= 1.5, "efficiency")
    # rows compare by the bandwidth the pool sustains
    cell[(p["dram_gbps"] * p["efficiency"], p["vram_gib"])] = p["tok_s"]
gb = sorted({k[0] for k in cell}); vr = sorted({k[1] for k in cell})
for g in gb:
    for lo, hi in zip(vr, vr[1:]):
        need(cell[(g, hi)] >= cell[(g, lo)] * (1 - 1e-9), f"more VRAM slower: {g} GB/s {lo}->{hi} GiB")
for v in vr:
    for lo, hi in zip(gb, gb[1:]):
        need(cell[(hi, v)] >= cell[(lo, v)] * (1 - 1e-9), f"more bandwidth slower: {v} GiB {lo}->{hi} GB/s")
PY
}

# 1. tandem bench --project on the demo model, with a user bandwidth row
"$BUILD/tandem" bench --project -m models/demo/demo-Q4_K_M.gguf --membw 20 \
    --vram 0.5,1,2,8 --json "$tmp/demo.json" > "$tmp/demo.txt" || fail "bench --project"
grep -q "DDR5-5200 dual" "$tmp/demo.txt" || fail "table lacks the DDR5-5200 row"
grep -q "measured" "$tmp/demo.txt" || fail "table lacks the --membw row"
validate "$tmp/demo.json" || fail "demo projection JSON"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["model"]["arch"]=="qwen35moe" and len(d["dram"])==4' \
    "$tmp/demo.json" || fail "demo JSON content"

# 1b. the same with the host probe (small buffers: a format check, not a measurement)
"$BUILD/tandem" bench --project -m models/demo/demo-Q4_K_M.gguf --probe-mib 4 \
    --json "$tmp/probe.json" > "$tmp/probe.txt" || fail "bench --project with the probe"
grep -q "host bandwidth probe" "$tmp/probe.txt" || fail "probe table not printed"
validate "$tmp/probe.json" || fail "probe projection JSON"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); r=d["dram"][-1]; assert r["measured"] and r["gbps"] > 0 and d["dram"][0]["efficiency"] == 0.8' \
    "$tmp/probe.json" || fail "probe row"

# 2. tools/ddr presets, default grid and a wide one, Zipf and a table curve
printf 'fraction,hit_rate\n0.1,0.3\n0.3,0.6\n0.6,0.85\n' > "$tmp/curve.csv"
for p in qwen35-35b-a3b qwen3next-80b-a3b qwen3-30b-a3b; do
    "$BUILD/tools/ddr" --preset "$p" --json "$tmp/$p.json" > /dev/null || fail "ddr --preset $p"
    validate "$tmp/$p.json" || fail "$p JSON"
    "$BUILD/tools/ddr" --preset "$p" --membw 35 --efficiency 0.6 --vram 4,6,8,12,16,24,32,48 \
        --hit-curve "$tmp/curve.csv" --quiet --json "$tmp/$p-wide.json" || fail "ddr wide $p"
    validate "$tmp/$p-wide.json" || fail "$p wide JSON"
done

# 2b. the demo model with its shipped expert profile as the hit curve
"$BUILD/tools/ddr" -m models/demo/demo-Q4_K_M.gguf --hit-curve profiles/demo.profile.json \
    --vram 0.492,0.495,0.5,0.505 --reserve-gib 0.49 --quiet --json "$tmp/prof.json" || fail "ddr with a profile"
validate "$tmp/prof.json" || fail "profile-curve JSON"
python3 - "$tmp/prof.json" <<'PY' || fail "profile-curve content"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["assumptions"]["hit_model"]["kind"] == "table"
row = [p for p in d["points"] if p["dram"] == "DDR4-3200 dual"]
assert not row[0]["fits"] and row[0]["bound"] == "no-fit"
hits = [p["hit_rate"] for p in row[1:]]
assert hits == sorted(hits) and 0 < hits[0] < hits[-1] < 1, hits
PY

# 3. the validator rejects a doctored grid (24 GiB slower than 16 GiB)
python3 - "$tmp/qwen3next-80b-a3b.json" "$tmp/bad.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for p in d["points"]:
    if p["vram_gib"] == 24:
        p["tok_s"] *= 0.5; p["tok_s_overlap"] *= 0.5
json.dump(d, open(sys.argv[2], "w"))
PY
if validate "$tmp/bad.json" 2>/dev/null; then fail "validator accepted a grid where more VRAM is slower"; fi

# 4. refusals
"$BUILD/tools/ddr" --preset nope > /dev/null 2> "$tmp/err"; [ $? -eq 1 ] || fail "unknown preset exit code"
grep -q "qwen35-35b-a3b" "$tmp/err" || fail "unknown preset message lists the presets"
"$BUILD/tools/ddr" > /dev/null 2>&1; [ $? -eq 2 ] || fail "ddr without a model: usage error"
"$BUILD/tools/ddr" --preset demo --efficiency 7 > /dev/null 2>&1; [ $? -eq 2 ] || fail "bad --efficiency"
"$BUILD/tandem" bench --project -m /nonexistent.gguf > /dev/null 2>&1; [ $? -eq 1 ] || fail "missing file"
printf 'fraction,hit_rate\n0.5,1.7\n' > "$tmp/bad.csv"
"$BUILD/tools/ddr" --preset demo --hit-curve "$tmp/bad.csv" > /dev/null 2> "$tmp/err"; [ $? -eq 1 ] || fail "bad curve"
grep -q "1.7" "$tmp/err" || fail "bad curve message names the value"

# 5. a short measured run on the CPU path: the tandem-bench JSON has its fields (no speed is asserted)
"$BUILD/tandem" bench -m models/demo/demo-Q4_K_M.gguf --device cpu --prompt 8,16 --gen 4 --threads 1 \
    --membw 20 --gpu-mem 1G,2 --json "$tmp/run.json" > /dev/null 2>&1 || fail "tandem bench run"
"$BUILD/tandem" bench -m models/demo/demo-Q4_K_M.gguf --device cpu --prompt 8 --gen 2 --threads 1 --membw \
    --probe-mib 4 --hit-curve profiles/demo.profile.json --json "$tmp/run2.json" > /dev/null 2>&1 \
    || fail "tandem bench run with the probe"
python3 - "$tmp/run2.json" <<'PY' || fail "probe fields of the bench JSON"
import json, sys
d = json.load(open(sys.argv[1]))
h = d["host"]
assert h["membw_source"] == "probe" and h["probe"]["read_gbps"] == h["membw_gbps"] > 0
assert h["dram_by_threads"] == []
assert d["projection"]["assumptions"]["hit_model"]["kind"] == "table"  # --hit-curve reached the projection
PY
python3 - "$tmp/run.json" <<'PY' || fail "bench JSON"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["format"] == "tandem-bench" and d["version"] == 2 and d["engine_path"] == "cpu"
assert d["command"].startswith("tandem bench ") and "--gpu-mem 1G,2" in d["command"]
assert d["workload"]["fills"] == [] and "gpu" not in d and "validation" not in d
assert [r["prompt_tokens"] for r in d["runs"]] == [8, 16]
hybrid_only = ("gpu_mem_gib", "fill", "slots", "hit_rate", "cpu_ms_per_token", "gpu_ms_per_token",
               "wait_ms_per_token", "pool_gbps", "pool_mb_per_token", "pool_wakes_per_token", "swaps",
               "cpu_bytes_per_token", "gpu_bytes_per_token", "projected_tok_s", "projected_hit_rate",
               "projected_slots", "projected_bound", "rel_error")
for r in d["runs"]:
    assert r["threads"] == 1 and r["gen_tokens"] == 4
    assert r["prompt_tok_s"] > 0 and r["decode_tok_s"] > 0
    for k in hybrid_only:
        assert k in r and r[k] is None, k
    assert r["bytes_per_token"] > 0 and r["dram_gbps"] == 20 and r["bound"] == "cpu-dram"
    assert abs(r["fraction_of_bound"] - r["decode_tok_s"] / r["bound_tok_s"]) < 1e-9
    assert abs(r["bound_tok_s"] - 20e9 / r["bytes_per_token"]) < 1e-6 * r["bound_tok_s"]
assert [v["gpu_mem_gib"] for v in d["vram"]] == [1, 2]
assert all(v["measured_tok_s"] is None for v in d["vram"])
assert d["projection"]["format"] == "tandem-projection"
PY

# 5b. option errors that need no GPU (exit 2, message naming the problem)
usage() { # usage MESSAGE-PATTERN ARGS...: exit 2 and the message
    local pat=$1
    shift
    "$BUILD/tandem" bench -m models/demo/demo-Q4_K_M.gguf "$@" > /dev/null 2> "$tmp/err"
    [ $? -eq 2 ] || fail "bench $*: want exit 2"
    grep -q -- "$pat" "$tmp/err" || fail "bench $*: message lacks '$pat': $(cat "$tmp/err")"
}
usage "bad value" --gen 0
usage "bad value for --fill" --fill layer,bogus
usage "bad value for --fill" --fill ""
usage "need --profile" --fill layer,adaptive
usage "need --profile" --fill profile --device cpu
usage "hybrid GPU path" --fill layer --device cpu
usage "hybrid GPU path" --validate --device cpu
usage "hybrid GPU path" --profile profiles/demo.profile.json --device cpu
usage "bad value for --gpu-mem" --gpu-mem 12X
usage "bad value for --zipf" --zipf -1
usage "bad value for --adapt-every" --adapt-every 0
# --device cuda where no GPU is visible: a clean failure, not a crash (skipped on a GPU machine)
if ! command -v nvidia-smi > /dev/null || ! nvidia-smi -L > /dev/null 2>&1; then
    "$BUILD/tandem" bench -m models/demo/demo-Q4_K_M.gguf --device cuda --prompt 8 --gen 2 \
        --json "$tmp/none.json" > /dev/null 2> "$tmp/err"
    [ $? -eq 1 ] || fail "bench --device cuda without a GPU: want exit 1"
    grep -q "tandem bench: " "$tmp/err" || fail "bench --device cuda without a GPU: no message"
    [ ! -e "$tmp/none.json" ] || fail "bench --device cuda without a GPU wrote a JSON"
fi

# 5c. --plot without gnuplot: a warning, exit 0 (plot.sh: exit 3)
mkdir -p "$tmp/bin"
ln -s "$(command -v bash)" "$tmp/bin/bash"
PATH="$tmp/bin" "$BUILD/tandem" bench -m models/demo/demo-Q4_K_M.gguf --device cpu --prompt 8 --gen 2 \
    --threads 1 --membw 20 --json "$tmp/noplot.json" --plot > /dev/null 2> "$tmp/err" || fail "--plot without gnuplot"
grep -q "no plot" "$tmp/err" || fail "--plot without gnuplot: no warning"
PATH="$tmp/bin" bash bench/plot.sh "$tmp/noplot.json" > /dev/null 2>&1
[ $? -eq 3 ] || fail "plot.sh without gnuplot: want exit 3"

# 5d. --revalidate: the H200 validation file projected again offline (no GPU, no model file:
# the preset with the recorded accounting), and its refusals
"$BUILD/tandem" bench --revalidate bench/results/hybrid-h200-c-validate.json --vram-efficiency 0.106 \
    > "$tmp/reval.txt" 2> "$tmp/err" || fail "--revalidate: $(cat "$tmp/err")"
grep -q "preset qwen35-35b-a3b" "$tmp/reval.txt" || fail "--revalidate: the model source not said"
grep -q "x 0.106" "$tmp/reval.txt" || fail "--revalidate: --vram-efficiency not applied"
[ "$(grep -cE '^ +12\.0 layer +(2|4|8|15) +512 ' "$tmp/reval.txt")" -eq 4 ] || fail "--revalidate: want 4 rows"
! grep -q "slots here" "$tmp/reval.txt" || fail "--revalidate: slots differ from the recorded projection"
"$BUILD/tandem" bench --revalidate "$tmp/nonexistent.json" > /dev/null 2> "$tmp/err"
[ $? -eq 1 ] || fail "--revalidate of a missing file: want exit 1"
grep -q "nonexistent.json" "$tmp/err" || fail "--revalidate of a missing file: message lacks the name"
"$BUILD/tandem" bench --revalidate "$tmp/run.json" > /dev/null 2> "$tmp/err"
[ $? -eq 1 ] || fail "--revalidate of a CPU-path JSON: want exit 1"
grep -q "engine_path 'cpu'" "$tmp/err" || fail "--revalidate of a CPU-path JSON: $(cat "$tmp/err")"
"$BUILD/tandem" bench --revalidate "$tmp/qwen35-35b-a3b.json" > /dev/null 2> "$tmp/err"
[ $? -eq 1 ] || fail "--revalidate of a projection JSON: want exit 1"
grep -q "not a tandem-bench JSON" "$tmp/err" || fail "--revalidate of a projection JSON: $(cat "$tmp/err")"
"$BUILD/tandem" bench --revalidate bench/results/hybrid-h200-c-validate.json --preset nope > /dev/null 2> "$tmp/err"
[ $? -eq 1 ] || fail "--revalidate --preset nope: want exit 1"
usage "bad value for --vram-efficiency" --revalidate x.json --vram-efficiency 2

# 6. plots
# gnuplot is a dependency (tools/install-deps.sh): the PNG plots are part of `tandem bench`.
command -v gnuplot > /dev/null || fail "gnuplot is not installed (tools/install-deps.sh installs it)"
{
    bash bench/plot.sh "$tmp/run.json" "$tmp/run" > /dev/null || fail "plot.sh bench"
    bash bench/plot.sh "$tmp/qwen35-35b-a3b.json" "$tmp/proj" > /dev/null || fail "plot.sh projection"
    # the hybrid rows (a GPU run's shape, made up here: no GPU in CI)
    python3 - "$tmp/run.json" "$tmp/hyb.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["engine_path"] = "hybrid"
base = d["runs"][0]
d["runs"] = []
for gib in (8, 12):
    for thr in (2, 4):
        for fill in ("layer", "profile"):
            r = dict(base, gpu_mem_gib=gib, threads=thr, fill=fill, decode_tok_s=10.0 * gib + thr,
                     bound_tok_s=20.0 * gib, projected_tok_s=None if thr == 2 else 15.0 * gib)
            if fill == "layer":  # the bound with its latency term; "profile" rows: an older file's shape
                r["bound_latency_tok_s"] = 12.0 * gib
            d["runs"].append(r)
json.dump(d, open(sys.argv[2], "w"))
PY
    bash bench/plot.sh "$tmp/hyb.json" "$tmp/hyb" > /dev/null || fail "plot.sh hybrid"
    for f in "$tmp/run-threads.png" "$tmp/run-vram.png" "$tmp/proj.png" "$tmp/hyb-vram.png" "$tmp/hyb-threads.png"; do
        [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = "211PNG" ] || fail "$f is not a PNG"
    done
}
echo "bench_cli: ok"
