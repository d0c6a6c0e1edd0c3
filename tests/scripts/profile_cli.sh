#!/usr/bin/env bash
# Expert profiles and cache policies on the demo model, end to end:
#  - a fresh routing dump of the held-out text (profiles/corpus/heldout.txt),
#  - `tandem cachesim` with the shipped profile (profiles/demo.profile.json) at
#    48 slots (25% of 8 x 24 experts), global and per-layer budgets,
#  - the orderings the design relies on: profile fill > layer-order fill,
#    adaptive > static, oracle >= every policy; fails when one does not hold,
#  - the hit rates agree with bench/results/cache_policies-demo.json,
#  - profile merge, and refusal of a profile made for another model.
# shellcheck source=tests/scripts/lib/suite.sh
. "$(dirname "$0")/lib/suite.sh"
T=$BUILD/tandem
MODEL=models/demo/demo-Q4_K_M.gguf
PROFILE=profiles/demo.profile.json
RESULTS=bench/results/cache_policies-demo.json
# one thread: the CPU forward's routing does not depend on it, and a loaded
# CI machine runs spinning OpenMP teams very slowly
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
[ -x "$T" ] || fail "$T not built"
[ -f "$MODEL" ] || fail "$MODEL missing"

if "$T" profile -m "$MODEL" --text-file profiles/corpus/heldout.txt -o "$tmp/heldout.json" \
        --dump-routing "$tmp/heldout.bin" 2>"$tmp/profile.log"; then
    ok "profile + routing dump of the held-out text ($(tail -n 1 "$tmp/profile.log"))"
else
    bad "tandem profile failed: $(cat "$tmp/profile.log")"
    exit 1
fi

for budget in global per-layer; do
    flag=""
    [ $budget = per-layer ] && flag=--per-layer
    if ! "$T" cachesim --routing "$tmp/heldout.bin" --slots 48 --profile "$PROFILE" $flag \
            --json >"$tmp/sim-$budget.json" 2>"$tmp/sim.log"; then
        bad "cachesim ($budget): $(cat "$tmp/sim.log")"
        continue
    fi
    "$T" cachesim --routing "$tmp/heldout.bin" --slots 48 --profile "$PROFILE" $flag | tail -n 7
    if msg=$(python3 - "$tmp/sim-$budget.json" "$RESULTS" "$budget" <<'PY'
import json, sys
sim = json.load(open(sys.argv[1]))
r = {e["policy"]: e["hit_rate"] for e in sim["results"]}
errors = []
if not r["static"] > r["layer"]:
    errors.append(f"profile fill {r['static']:.4f} <= layer-order fill {r['layer']:.4f}")
if not r["adaptive"] > r["static"]:
    errors.append(f"adaptive {r['adaptive']:.4f} <= static {r['static']:.4f}")
for p, v in r.items():
    if v > r["oracle"]:
        errors.append(f"{p} {v:.4f} > oracle {r['oracle']:.4f}")
rec = json.load(open(sys.argv[2]))["runs"][sys.argv[3]]
for e in rec["results"]:
    if abs(e["hit_rate"] - r[e["policy"]]) > 0.01:
        errors.append(f"{e['policy']}: {r[e['policy']]:.4f} now, {e['hit_rate']:.4f} recorded")
print("; ".join(errors) if errors else
      "layer %.2f%% < static %.2f%% < adaptive %.2f%% <= oracle %.2f%%" %
      tuple(100 * r[p] for p in ("layer", "static", "adaptive", "oracle")))
sys.exit(1 if errors else 0)
PY
    ); then ok "orderings, $budget budget: $msg"; else bad "orderings, $budget budget: $msg"; fi
done

# merge: counts add up; a profile of another model is refused everywhere
if "$T" profile merge -m "$MODEL" "$PROFILE" "$tmp/heldout.json" -o "$tmp/merged.json" 2>"$tmp/m.log"; then
    n=$(python3 -c 'import json,sys; print(sum(json.load(open(f))["tokens"] for f in sys.argv[1:3]), json.load(open(sys.argv[3]))["tokens"])' \
        "$PROFILE" "$tmp/heldout.json" "$tmp/merged.json")
    # shellcheck disable=SC2086 # two numbers, split on purpose
    set -- $n
    [ "$1" = "$2" ] && ok "merge: $2 tokens" || bad "merge: tokens $2, expected $1"
else
    bad "merge failed: $(cat "$tmp/m.log")"
fi
sed 's/"layout_hash":[^,]*/"layout_hash": "00000000deadbeef"/' "$PROFILE" >"$tmp/foreign.json"
if "$T" profile merge "$PROFILE" "$tmp/foreign.json" -o "$tmp/x.json" 2>"$tmp/f.log"; then
    bad "merge accepted a profile of another model"
elif grep -q "another model" "$tmp/f.log"; then
    ok "merge refuses another model's profile: $(cat "$tmp/f.log")"
else
    bad "merge refused for the wrong reason: $(cat "$tmp/f.log")"
fi
if "$T" cachesim --routing "$tmp/heldout.bin" --slots 48 --profile "$tmp/foreign.json" \
        >/dev/null 2>"$tmp/f.log"; then
    bad "cachesim accepted a profile of another model"
elif grep -q "another model" "$tmp/f.log"; then
    ok "cachesim refuses another model's profile"
else
    bad "cachesim refused for the wrong reason: $(cat "$tmp/f.log")"
fi
head -c 300 "$PROFILE" >"$tmp/trunc.json"
if "$T" profile merge "$tmp/trunc.json" "$PROFILE" -o "$tmp/x.json" 2>"$tmp/t.log"; then
    bad "merge accepted a truncated profile"
else
    ok "truncated profile refused: $(cat "$tmp/t.log")"
fi
exit $failed
