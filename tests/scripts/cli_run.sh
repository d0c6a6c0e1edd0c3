#!/usr/bin/env bash
# CLI: `tandem run` on the demo model (greedy text = llama.cpp's, stderr
# summary), `tandem chat`, `tandem logits` and `tandem generate-ids` against
# the micro fixtures' float64 references, and bad-input handling.
# shellcheck source=tests/scripts/lib/suite.sh
. "$(dirname "$0")/lib/suite.sh"
T=$BUILD/tandem
[ -x "$T" ] || fail "$T not built"

# run: greedy on the default (demo) model reproduces llama.cpp's continuation
TANDEM_MODEL="" "$T" run --device cpu -p "The jury said" -n 16 --temp 0 >"$tmp/out" 2>"$tmp/err"; rc=$?
want='The jury said that the "sons of God" were not so much of the fact that'
[ $rc -eq 0 ] && [ "$(head -c ${#want} "$tmp/out")" == "$want" ] && ok "run greedy text" || { bad "run greedy text (rc $rc)"; cat "$tmp/out" "$tmp/err"; }
grep -Eq '^prompt: 3 tokens, [0-9.]+ tok/s \| generated: 16 tokens, [0-9.]+ tok/s' "$tmp/err" && ok "run summary" || { bad "run summary"; cat "$tmp/err"; }

# run with sampling (seeded: same seed, same text)
"$T" run -p "The jury said" -n 12 --temp 0.8 --seed 7 --top-k 40 --top-p 0.95 --min-p 0.05 --repeat-penalty 1.1 >"$tmp/s1" 2>/dev/null; rc1=$?
"$T" run -p "The jury said" -n 12 --temp 0.8 --seed 7 --top-k 40 --top-p 0.95 --min-p 0.05 --repeat-penalty 1.1 --threads 1 >"$tmp/s2" 2>/dev/null
[ $rc1 -eq 0 ] && [ "$(wc -c <"$tmp/s1")" -gt 14 ] && cmp -s "$tmp/s1" "$tmp/s2" && ok "run sampled, reproducible" || bad "run sampled"

# run --chat: the template's answer to a sum the demo model was trained on
"$T" run -p "What is 17 + 25?" --chat -n 40 --temp 0 >"$tmp/c" 2>/dev/null && grep -q "42" "$tmp/c" && ok "run --chat" || { bad "run --chat"; cat "$tmp/c"; }

# chat: two turns, the second reuses the first turn's tokens
printf 'What is 17 + 25?\nAnd 3 + 4?\n' | "$T" chat -n 40 --temp 0 >"$tmp/chat" 2>"$tmp/chaterr"; rc=$?
[ $rc -eq 0 ] && grep -q "42" "$tmp/chat" && ok "chat answers" || { bad "chat answers"; cat "$tmp/chat" "$tmp/chaterr"; }
reused=$(sed -n 's/.*(\([0-9]*\) reused).*/\1/p' "$tmp/chaterr" | tail -1)
[ "${reused:-0}" -gt 20 ] && ok "chat prefix reuse ($reused tokens)" || { bad "chat prefix reuse"; cat "$tmp/chaterr"; }

# logits: one pass over the short prompt vs the float64 reference
for name in micro-qwen3moe micro-qwen35moe micro-qwen3next; do
    dir=tests/fixtures/$name
    toks=$(python3 -c "import json;print(','.join(map(str,json.load(open('$dir/reference.json'))['prompts']['short']['tokens'])))")
    "$T" logits -m $dir/$name-f32.gguf --tokens "$toks" --out "$tmp/all.f32" --all 2>/dev/null &&
    "$T" logits -m $dir/$name-f32.gguf --tokens "$toks" --out "$tmp/last.f32" 2>/dev/null || { bad "logits $name: command failed"; continue; }
    res=$(python3 - "$tmp/all.f32" "$tmp/last.f32" "$dir/ref-short.logits.f32" <<'PY'
import array, math, sys
def load(p):
    a = array.array('f'); a.frombytes(open(p, 'rb').read()); return a
al, la, ref = load(sys.argv[1]), load(sys.argv[2]), load(sys.argv[3])
V = 2048
num = sum((x - y) ** 2 for x, y in zip(al, ref)); den = sum(y * y for y in ref)
rel = math.sqrt(num / den)
last_ok = len(la) == V and max(abs(x - y) for x, y in zip(la, al[-V:])) < 1e-4
print("ok" if len(al) == len(ref) and rel <= 1e-3 and last_ok else "bad", "%.2e" % rel)
PY
)
    [ "${res%% *}" == ok ] && ok "logits $name (rel L2 ${res#* })" || bad "logits $name: $res"
done

# generate-ids: incremental greedy = reference greedy_24
for name in micro-qwen3moe micro-qwen35moe micro-qwen3next; do
    dir=tests/fixtures/$name
    read -r toks want < <(python3 -c "
import json;p=json.load(open('$dir/reference.json'))['prompts']['short']
print(','.join(map(str,p['tokens'])), json.dumps(p['greedy_24']).replace(' ',''))")
    got=$("$T" generate-ids -m $dir/$name-f32.gguf --tokens "$toks" -n 24 2>/dev/null | tr -d ' ')
    [ "$got" == "$want" ] && ok "generate-ids $name" || bad "generate-ids $name: want $want got $got"
done

# bad input: clear errors, no crash
"$T" logits -m tests/fixtures/micro-qwen3moe/micro-qwen3moe-f32.gguf --tokens 1,x --out "$tmp/x" 2>"$tmp/e"; [ $? -eq 2 ] && ok "bad --tokens is a usage error" || bad "bad --tokens"
"$T" logits -m tests/fixtures/micro-qwen3moe/micro-qwen3moe-f32.gguf --tokens 1,99999 --out "$tmp/x" 2>"$tmp/e"; rc=$?
[ $rc -eq 1 ] && grep -q "vocabulary" "$tmp/e" && ok "token out of vocabulary" || { bad "token out of vocabulary (rc $rc)"; cat "$tmp/e"; }
"$T" run -m /nonexistent.gguf -p hi 2>"$tmp/e"; rc=$?
[ $rc -eq 1 ] && [ -s "$tmp/e" ] && ok "missing model file" || bad "missing model file (rc $rc)"
"$T" run -m tests/fixtures/quant/manifest.json -p hi 2>"$tmp/e"; rc=$?
[ $rc -eq 1 ] && ok "not a GGUF: $(head -c 80 "$tmp/e")" || bad "not a GGUF (rc $rc)"
"$T" run -p hi -n -3 2>/dev/null; [ $? -eq 2 ] && ok "bad -n" || bad "bad -n"
"$T" run -n 3 2>/dev/null; [ $? -eq 2 ] && ok "missing -p" || bad "missing -p"

exit $failed
