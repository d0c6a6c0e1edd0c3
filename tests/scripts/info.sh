#!/usr/bin/env bash
# `tandem info` on the vendored fixtures and the demo model: architecture,
# tensor count and expert bytes (computed independently from the tensor
# shapes/types, see the comments) in text and --json output; a truncated file
# is reported incomplete with exit status 1; a broken header is an error.
set -u
cd "$(dirname "$0")/../.." || exit 1
BUILD=${BUILD:-build}
T=$BUILD/tandem
fail=0
bad() { echo "FAIL: $*"; fail=1; }
[ -x "$T" ] || { echo "FAIL: $T not built"; exit 1; }

# file | arch | tensors | expert bytes
#  micro-*: f32 gate/up [64,32,8] + down [32,64,8] = 3 x 65536 bytes per layer
#  small Q4_K_M: 4 layers of 8 experts 256x256 (Q4_K 144 B / 256, Q6_K 210 B / 256 mixes)
#  demo: 9 layers x (gate+up Q4_K 2 x 884736) + down 5 x Q6_K 1290240 + 4 x Q4_K 884736
cases="
tests/fixtures/micro-qwen3moe/micro-qwen3moe-f32.gguf|qwen3moe|39|589824
tests/fixtures/micro-qwen35moe/micro-qwen35moe-f32.gguf|qwen35moe|95|983040
tests/fixtures/micro-qwen3next/micro-qwen3next-f32.gguf|qwen3next|91|983040
tests/fixtures/small-qwen35moe/small-qwen35moe-Q4_K_M.gguf|qwen35moe|76|3809280
models/demo/demo-Q4_K_M.gguf|qwen35moe|169|25915392
"
for c in $cases; do
    IFS='|' read -r f arch nt eb <<<"$c"
    before=$fail
    fail=0
    out=$("$T" info "$f") || bad "$f: exit status $?"
    grep -Eq "^architecture: +$arch\$" <<<"$out" || bad "$f: architecture is not $arch"
    grep -Eq "^tensors: +$nt\$" <<<"$out" || bad "$f: tensor count is not $nt"
    grep -Eq "^expert bytes: +$eb " <<<"$out" || bad "$f: expert bytes are not $eb"
    grep -Eq "^complete: +yes" <<<"$out" || bad "$f: not reported complete"
    js=$("$T" info "$f" --json) || bad "$f --json: exit status $?"
    grep -Eq "\"architecture\":[[:space:]]*\"$arch\"" <<<"$js" || bad "$f --json: architecture"
    grep -Eq "\"tensor_count\":[[:space:]]*$nt," <<<"$js" || bad "$f --json: tensor_count"
    grep -Eq "\"expert_bytes\":[[:space:]]*$eb," <<<"$js" || bad "$f --json: expert_bytes"
    grep -Eq "\"complete\":[[:space:]]*true" <<<"$js" || bad "$f --json: complete"
    [ $fail -eq 0 ] && echo "ok: $f ($arch, $nt tensors, $eb expert bytes)"
    fail=$((fail | before))
done

# Known per-layer facts of the demo: 24 experts; layer 0 one expert = Q4_K gate+up + Q6_K down.
out=$("$T" info models/demo/demo-Q4_K_M.gguf)
grep -Eq "^  layer +0: +127488 bytes .*24 experts" <<<"$out" || bad "demo: layer 0 one-expert bytes"
grep -Eq "^  qwen35moe.expert_count +24$" <<<"$out" || bad "demo: expert_count"
grep -Eq "^tokenizer: +model gpt2, pre qwen35, vocab 8192" <<<"$out" || bad "demo: tokenizer summary"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Truncated inside the tensor data: described, reported incomplete, exit 1.
src=tests/fixtures/micro-qwen3moe/micro-qwen3moe-f32.gguf
size=$(stat -c %s "$src")
head -c $((size - 1000)) "$src" >"$tmp/trunc.gguf"
out=$("$T" info "$tmp/trunc.gguf" 2>"$tmp/err"); rc=$?
[ $rc -eq 1 ] || bad "truncated file: exit status $rc, expected 1"
grep -Eq "^complete: +NO: data ends at $size but the file has $((size - 1000)) bytes \(1000 missing\)" <<<"$out" \
    || bad "truncated file: incompleteness not reported"
grep -q "incomplete" "$tmp/err" || bad "truncated file: no message on stderr"
"$T" info "$tmp/trunc.gguf" --json >"$tmp/j" 2>/dev/null; rc=$?
[ $rc -eq 1 ] || bad "truncated --json: exit status $rc"
grep -Eq '"complete":[[:space:]]*false' "$tmp/j" || bad "truncated --json: complete is not false"
# Truncated inside the header: an error naming the problem, exit 1.
head -c 5000 "$src" >"$tmp/hdr.gguf"
"$T" info "$tmp/hdr.gguf" >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -eq 1 ] || bad "header-truncated file: exit status $rc"
grep -q "truncated" "$tmp/err" || bad "header-truncated file: message lacks 'truncated'"
# --check: the demo's tensors are clean; a NaN written over the last f32 of a
# micro model (all its tensors are f32 with no padding, so the last 4 bytes are data) is found.
out=$("$T" info models/demo/demo-Q4_K_M.gguf --check) || bad "demo --check: exit status $?"
grep -Eq "^content check: +ok \(0 of 169 tensors fail\)" <<<"$out" || bad "demo --check: not reported clean"
cp "$src" "$tmp/nan.gguf"
printf '\x00\x00\xc0\x7f' | dd of="$tmp/nan.gguf" bs=1 seek=$((size - 4)) conv=notrunc status=none
out=$("$T" info "$tmp/nan.gguf" --check 2>"$tmp/err"); rc=$?
[ $rc -eq 1 ] || bad "NaN file --check: exit status $rc, expected 1"
grep -Eq "^content check: +FAILED \(1 of 39 tensors fail\)" <<<"$out" || bad "NaN file --check: not reported"
grep -q "is not finite" "$tmp/err" || bad "NaN file --check: no message naming the element"
"$T" info "$tmp/nan.gguf" >/dev/null || bad "NaN file without --check: exit status $?"

# Usage errors.
"$T" info a.gguf b.gguf >/dev/null 2>&1; rc=$?
[ $rc -eq 2 ] || bad "two files: exit status $rc, expected 2"
"$T" info --bogus >/dev/null 2>&1; rc=$?
[ $rc -eq 2 ] || bad "unknown option: exit status $rc, expected 2"

[ $fail -eq 0 ] && echo "info.sh: all checks passed"
exit $fail
