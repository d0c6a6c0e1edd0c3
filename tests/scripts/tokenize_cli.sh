#!/usr/bin/env bash
# CLI parity: `tandem tokenize` / `tandem detokenize` against the fixture ids
# (tests/fixtures/tokenizer-*.tests.json) and the demo model's llama.cpp prompt ids.
set -u
cd "$(dirname "$0")/../.." || exit 1
BUILD=${BUILD:-build}
T=$BUILD/tandem
fail=0
check() { # name expected actual
    if [ "$2" == "$3" ]; then echo "ok   $1"; else echo "FAIL $1: want [$2] got [$3]"; fail=1; fi
}
[ -x "$T" ] || { echo "FAIL: $T not built"; exit 1; }
Q2=tests/fixtures/micro-qwen3moe/micro-qwen3moe-f32.gguf
Q35=tests/fixtures/micro-qwen35moe/micro-qwen35moe-f32.gguf

check "tokenize text" "[745, 300, 78, 858]" "$("$T" tokenize -m $Q2 --text 'Hello world')"
check "detokenize" "Hello world" "$("$T" detokenize -m $Q2 --ids 745,300,78,858)"
check "control token parsed" "[2034]" "$("$T" tokenize -m $Q2 --text '<|im_start|>')"
out=$("$T" tokenize -m $Q2 --no-special --text '<|im_start|>')
case "$out" in *2034*|"") check "--no-special" "no 2034" "$out" ;; *) echo "ok   --no-special" ;; esac
check "detokenize --no-special" "hi" "$("$T" detokenize -m $Q2 --no-special --ids 2034,71,72)"
check "default model (demo)" "[338, 5728, 617]" "$(TANDEM_MODEL="" "$T" tokenize --text 'The jury said')"

# every fixture string through --file, for both pre-tokenisers
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for pair in "qwen2:$Q2" "qwen35:$Q35"; do
    pre=${pair%%:*} gguf=${pair#*:}
    n=$(python3 - "$pre" "$tmp" <<'PY'
import json, sys
pre, tmp = sys.argv[1], sys.argv[2]
tests = json.load(open(f"tests/fixtures/tokenizer-{pre}.tests.json"))["tests"]
for i, t in enumerate(tests):
    open(f"{tmp}/{pre}.{i}.txt", "wb").write(t["text"].encode())
    open(f"{tmp}/{pre}.{i}.ids", "w").write("[" + ", ".join(map(str, t["ids"])) + "]")
print(len(tests))
PY
)
    for ((i = 0; i < n; i++)); do
        got=$("$T" tokenize -m "$gguf" --file "$tmp/$pre.$i.txt")
        check "$pre file $i" "$(cat "$tmp/$pre.$i.ids")" "$got"
        ids=$(echo "$got" | tr -d '[] ')
        [ -n "$ids" ] || continue
        "$T" detokenize -m "$gguf" --raw --ids "$ids" > "$tmp/out"
        if cmp -s "$tmp/out" "$tmp/$pre.$i.txt"; then echo "ok   $pre round trip $i"; else echo "FAIL $pre round trip $i"; fail=1; fi
    done
done

"$T" tokenize -m $Q2 >/dev/null 2>&1; check "usage error exit code" 2 $?
"$T" detokenize -m $Q2 --ids 1,x >/dev/null 2>&1; check "bad ids exit code" 2 $?
"$T" detokenize -m $Q2 --ids 99999 >/dev/null 2>&1; check "id out of range exit code" 1 $?
"$T" tokenize -m /nonexistent.gguf --text x >/dev/null 2>&1; check "missing model exit code" 1 $?
exit $fail
