#!/usr/bin/env bash
# Regenerates the demo model's shipped profile (profiles/demo.profile.json) from
# the corpus and the cache-policy evidence (bench/results/cache_policies-demo.json)
# from a routing dump of the held-out text. Usage: profiles/make_demo.sh [BUILD]
set -eu
cd "$(dirname "$0")/.."
BUILD=${1:-${BUILD:-build}}
T=$BUILD/tandem
MODEL=models/demo/demo-Q4_K_M.gguf
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$T" profile -m "$MODEL" --text-file profiles/corpus/prose.txt --source profiles/corpus/prose.txt \
    -o "$tmp/prose.json"
"$T" profile -m "$MODEL" --prompts profiles/corpus/chats.jsonl --tokens 48 \
    --source "profiles/corpus/chats.jsonl (160 prompts, 48 greedy tokens each)" -o "$tmp/chats.json"
"$T" profile merge -m "$MODEL" "$tmp/prose.json" "$tmp/chats.json" -o profiles/demo.profile.json

"$T" profile -m "$MODEL" --text-file profiles/corpus/heldout.txt -o "$tmp/heldout.json" \
    --dump-routing "$tmp/heldout.bin"
"$T" cachesim --routing "$tmp/heldout.bin" --slots 48 --profile profiles/demo.profile.json \
    --json >"$tmp/global.json"
"$T" cachesim --routing "$tmp/heldout.bin" --slots 48 --profile profiles/demo.profile.json \
    --per-layer --json >"$tmp/per-layer.json"

# sensitivity of adaptive to its parameters (global budget)
: >"$tmp/sweep.txt"
for e in 4 8 16 32; do for s in 1 2 4; do for d in 0.9 0.95 0.98 0.99; do for h in 0.1 0.25 0.5; do
    "$T" cachesim --routing "$tmp/heldout.bin" --slots 48 --profile profiles/demo.profile.json \
        --policy adaptive --adapt-every $e --adapt-swaps $s --adapt-decay $d \
        --adapt-hysteresis $h --json |
        python3 -c 'import json,sys; r=json.load(sys.stdin); p=r["adaptive_params"]; e=r["results"][0]; print(p["adapt_every"], p["adapt_swaps"], p["adapt_decay"], p["adapt_hysteresis"], e["hit_rate"], e["loads_per_token"])' \
        >>"$tmp/sweep.txt"
done; done; done; done

python3 - "$tmp" >bench/results/cache_policies-demo.json <<'PY'
import json, sys, datetime
tmp = sys.argv[1]
runs = {b: json.load(open(f"{tmp}/{b}.json")) for b in ("global", "per-layer")}
for r in runs.values():
    r["routing"] = "fresh dump of profiles/corpus/heldout.txt"
sweep = [dict(zip(("adapt_every", "adapt_swaps", "adapt_decay", "adapt_hysteresis", "hit_rate",
                   "loads_per_token"), map(float, l.split()))) for l in open(f"{tmp}/sweep.txt")]
static = next(e["hit_rate"] for e in runs["global"]["results"] if e["policy"] == "static")
out = {
    "what": "expert-cache hit rates of every policy on the demo model, 48 slots = 25% of "
            "8 layers x 24 experts (top-4), replaying the routing of the held-out text",
    "model": "models/demo/demo-Q4_K_M.gguf",
    "profile": "profiles/demo.profile.json (profiles/corpus/prose.txt + chats.jsonl)",
    "heldout": "profiles/corpus/heldout.txt",
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
    "commands": [
        "tandem profile --text-file profiles/corpus/heldout.txt -o heldout.json --dump-routing heldout.bin",
        "tandem cachesim --routing heldout.bin --slots 48 --profile profiles/demo.profile.json --json",
        "tandem cachesim --routing heldout.bin --slots 48 --profile profiles/demo.profile.json --per-layer --json",
    ],
    "runs": runs,
    "adaptive_sweep_global": {
        "settings": len(sweep),
        "beating_static": sum(s["hit_rate"] > static for s in sweep),
        "static_hit_rate": static,
        "min_hit_rate": min(s["hit_rate"] for s in sweep),
        "max_hit_rate": max(s["hit_rate"] for s in sweep),
        "grid": sweep,
    },
}
print(json.dumps(out, indent=1))
PY
echo "wrote profiles/demo.profile.json and bench/results/cache_policies-demo.json"
