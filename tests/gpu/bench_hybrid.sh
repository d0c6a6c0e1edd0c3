#!/usr/bin/env bash
# tandem bench on the hybrid path, demo model, GPU machine: the JSON's bound
# takes B_dram from the probes right before and right after each grid point
# (the larger of the two, docs/BENCH.md), over the model's expert copy (fresh
# buffers with --expert-memory map), --membw replaces them, and the table
# shows both probes. No speed is asserted.
set -u
cd "$(dirname "$0")/../.." || exit 1
BUILD=${BUILD:-build}
export TDM_ROOT=${TDM_ROOT:-$PWD}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() {
    echo "FAIL: $*"
    exit 1
}
m=models/demo/demo-Q4_K_M.gguf
# the small budgets: a point that does not fit is skipped, so one that misses
# is found whatever the ledger's scratch on this GPU; 1 GiB holds every expert
budgets=0.015,0.02,0.025,0.03,0.05,1 # H200: 0.015 too small, 0.02 and 0.025 miss (at most 8: MAX_LIST)
common=(-m "$m" --device cuda --prompt 16 --gen 8 --threads 1 --gpu-mem $budgets --probe-mib 16)

"$BUILD/tandem" bench "${common[@]}" --json "$tmp/probe.json" > "$tmp/out" 2> "$tmp/err" ||
    fail "bench with the probe: $(tail -3 "$tmp/err")"
[ "$(grep -c "pinned threads over the expert copy, before --gpu-mem" "$tmp/out")" -eq 6 ] ||
    fail "a probe of the expert copy before each point"
[ "$(grep -c "pinned threads over the expert copy, after --gpu-mem" "$tmp/out")" -eq 6 ] ||
    fail "a probe of the expert copy after each point"
grep -q "before   after  B_dram" "$tmp/out" || fail "the table shows both probes"
python3 - "$tmp/probe.json" << 'PY' || fail "probe fields of the hybrid JSON"
import json, sys
d = json.load(open(sys.argv[1]))
runs = d["runs"]
for r in runs:
    print("gpu-mem", r["gpu_mem_gib"], "hit", r["hit_rate"], "host MB/token", r["cpu_bytes_per_token"] / 1e6,
          "probes", r["dram_probe_before_gbps"], r["dram_probe_after_gbps"])
for x in d["skipped"]:
    print("skipped", x["gpu_mem_gib"], x["error"][:100])
assert d["engine_path"] == "hybrid" and runs[-1]["gpu_mem_gib"] == 1 and runs[-1]["hit_rate"] == 1
assert len(runs) + len(d["skipped"]) == 6
seen = []
for r in runs:
    pre, post = r["dram_probe_before_gbps"], r["dram_probe_after_gbps"]
    assert pre > 0 and post > 0, r
    assert r["dram_gbps"] == max(pre, post), r
    seen += [pre, post]
    if r["cpu_bytes_per_token"] > 0:  # the host side sets the bound only when the pool reads
        t_cpu = r["cpu_bytes_per_token"] / (r["dram_gbps"] * 1e9)
        assert r["bound_tok_s"] <= 1 / t_cpu * (1 + 1e-9), r
assert any(r["hit_rate"] < 1 and r["cpu_bytes_per_token"] > 0 for r in runs), "no point missed"
(t,) = d["host"]["dram_by_threads"]
assert t["threads"] == 1 and t["source"] == "probe" and t["probes"] == 12 and t["memory"] == "expert copy"
assert t["min_gbps"] <= min(seen) and t["max_gbps"] >= max(seen)  # skipped points' probes count too
assert t["min_gbps"] <= t["read_gbps"] <= t["max_gbps"]
PY

"$BUILD/tandem" bench "${common[@]}" --expert-memory map --json "$tmp/map.json" > "$tmp/out" 2> "$tmp/err" ||
    fail "bench with --expert-memory map: $(tail -3 "$tmp/err")"
[ "$(grep -c "pinned threads over the fresh buffers" "$tmp/out")" -eq 12 ] || fail "map: probes of fresh buffers"
python3 - "$tmp/map.json" << 'PY' || fail "--expert-memory map fields of the hybrid JSON"
import json, sys
d = json.load(open(sys.argv[1]))
(t,) = d["host"]["dram_by_threads"]
assert t["memory"] == "fresh buffers" and t["probes"] == 12
for r in d["runs"]:
    assert r["dram_gbps"] == max(r["dram_probe_before_gbps"], r["dram_probe_after_gbps"]) > 0, r
PY

"$BUILD/tandem" bench "${common[@]}" --membw 20 --json "$tmp/user.json" > "$tmp/out" 2> "$tmp/err" ||
    fail "bench with --membw: $(tail -3 "$tmp/err")"
! grep -q "pinned threads" "$tmp/out" || fail "--membw ran the probe"
python3 - "$tmp/user.json" << 'PY' || fail "--membw fields of the hybrid JSON"
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["runs"]:
    assert r["dram_gbps"] == 20 and r["dram_probe_before_gbps"] is None and r["dram_probe_after_gbps"] is None, r
(t,) = d["host"]["dram_by_threads"]
assert t["read_gbps"] == 20 and t["source"] == "user" and t["probes"] == 0 and t["memory"] is None
PY
echo "bench_hybrid: ok"
