#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) and runs each for
# FUZZ_SECONDS (default 60): the GGUF reader (fuzz_gguf.c), the HTTP API's
# request parsers with the chat renderer (fuzz_request.c), the tokenizer's
# encode/decode contract (fuzz_tokenizer.c), the expert-profile reader
# (fuzz_profile.c) and the routing-dump reader with the cache policies
# replaying what it accepts (fuzz_routing.c), each from a few seeds (below).
# The corpora it grows are kept in $BUILD/fuzz/corpus-* between runs; crashes
# are written to $BUILD/fuzz/ as crash-*. Exit status: 0 when no failure was
# found.
#
# A missing clang or libFuzzer (Debian: clang, libclang-rt-14-dev) is a FAILURE,
# not a skip: CI must not pass without fuzzing.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
CLANG=${CLANG:-clang}
out=$BUILD/fuzz
mkdir -p "$out"

if ! command -v "$CLANG" >/dev/null 2>&1; then
    echo "FAIL: $CLANG not found; install clang and libclang-rt-14-dev (apt-get install clang libclang-rt-14-dev)" >&2
    exit 1
fi
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
printf '#include <stddef.h>\n#include <stdint.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n' >"$probe/p.c"
if ! "$CLANG" -fsanitize=fuzzer,address,undefined "$probe/p.c" -o "$probe/p" 2>"$probe/err"; then
    echo "FAIL: $CLANG cannot link libFuzzer (-fsanitize=fuzzer); install libclang-rt-14-dev" >&2
    sed 's/^/    /' "$probe/err" >&2
    exit 1
fi

# Empties $out/seeds-NAME and points $seeds at it.
new_seeds() {
    seeds=$out/seeds-$1
    rm -rf "$seeds"
    mkdir -p "$seeds"
}

# One target: built by make (the Makefile's FUZZ_SRC_NAME says which sources
# are instrumented), run on its corpus and the seeds in $out/seeds-NAME.
fuzz() {
    local name=$1 max_len=$2 dict=$3
    make -s BUILD="$BUILD" FUZZ_CC="$CLANG" "$out/fuzz_$name"
    mkdir -p "$out/corpus-$name"
    echo "fuzz_$name: $(ls "$out/seeds-$name" | wc -l) seeds, $(ls "$out/corpus-$name" | wc -l) corpus files, ${FUZZ_SECONDS} s"
    "$out/fuzz_$name" -max_total_time="$FUZZ_SECONDS" -max_len="$max_len" -timeout=10 -rss_limit_mb=2048 \
        ${dict:+-dict="$dict"} -artifact_prefix="$out/" -print_final_stats=1 "$out/corpus-$name" "$out/seeds-$name"
    echo "fuzz_$name: no failure in ${FUZZ_SECONDS} s"
}

# The GGUF reader: small valid files from the project's writer, and the
# first 64 KiB of every fixture.
SRC="engine/gguf.c engine/gguf_writer.c engine/quant.c engine/status.c"
"$CLANG" -std=c11 -g -O1 -D_GNU_SOURCE -Iengine -fno-omit-frame-pointer -fsanitize=address,undefined \
    tests/fuzz/gen_seeds.c $SRC -o "$out/gen_seeds" -lm
new_seeds gguf
"$out/gen_seeds" "$seeds"
shopt -s nullglob
for f in tests/fixtures/*/*.gguf models/demo/*.gguf ../shared/fixtures/*/*.gguf; do
    head -c 65536 "$f" >"$seeds/$(basename "$(dirname "$f")")-$(basename "$f").head"
done
fuzz gguf 70000 tests/fuzz/gguf.dict

# The HTTP API's request parsers: one valid body per API and shape, the first
# byte choosing the API and the chat template.
new_seeds request
printf '\x00{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"hi"}],"max_tokens":8,"stop":["x"],"temperature":0.5,"chat_template_kwargs":{"enable_thinking":false}}' >"$seeds/chat"
printf '\x03{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]},{"role":"assistant","content":"a","reasoning_content":"r"},{"role":"user","content":"again"}],"stream":true,"stream_options":{"include_usage":true},"reasoning_effort":"low","seed":7}' >"$seeds/chat-stream"
printf '\x01{"prompt":"once","max_tokens":4,"stop":"z","seed":3,"top_k":5,"min_p":0.1,"ignore_eos":true}' >"$seeds/completion"
printf '\x02{"model":"m","max_tokens":16,"system":"s","messages":[{"role":"user","content":"hi"}],"thinking":{"type":"enabled","budget_tokens":1024},"stop_sequences":["q"]}' >"$seeds/messages"
printf '\x05{"max_tokens":16,"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":[{"type":"text","text":"x"}]},{"role":"assistant","content":[{"type":"thinking","thinking":"t","signature":""},{"type":"text","text":"y"}]}],"stream":true}' >"$seeds/messages-stream"
fuzz request 8192 tests/fuzz/request.dict

# The tokenizer (demo vocabulary): text with special tokens, code, numbers,
# CJK, emoji and broken UTF-8, the first byte choosing the encode flags.
new_seeds tokenizer
printf '\x01<|im_start|>user\nHello, world! 12345 <think>x</think><|im_end|>\n' >"$seeds/chat"
printf '\x00def f(x):\n    return x ** 2  # \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\xa6\x99\n\n\t\t  end' >"$seeds/code"
printf '\x02\xc3\x28 \xed\xa0\x80 \xf4\x90\x80\x80 \xe2\x82 caf\xc3\xa9 NA\xc3\x8fVE 3.14e-10' >"$seeds/broken"
fuzz tokenizer 4096 ""

# The expert-profile reader: the demo's profile and a one-layer one.
new_seeds profile
cp profiles/demo.profile.json "$seeds/demo"
printf '{"format":"tandem-expert-profile","version":1,"model":{"architecture":"x","layout_hash":"0000000000000001","n_layer":1,"n_expert":2,"k":1},"tokens":3,"source":"","layers":[{"layer":0,"count":[2,1],"weight":[1.5,0.5],"rank":[0,1]}],"global_rank":[[0,0],[0,1]]}' >"$seeds/tiny"
fuzz profile 16384 ""

# The routing-dump reader and the cache policies: a dump of 3 layers, 8
# experts, k = 2, two sequences of 3 and 2 tokens.
new_seeds routing
{
    printf 'TDMROUTE\x01\x00\x00\x00\x03\x00\x00\x00\x08\x00\x00\x00\x02\x00\x00\x00\x07\x00\x00\x00\x00\x00\x00\x00'
    for t in 0 1 2 0 1; do
        for l in 0 1 2; do
            printf "\\x0$t\\x00\\x00\\x00\\x0$l\\x00\\x0$(((t + l) % 8))\\x00\\x0$(((t + 2 * l + 3) % 8))\\x00"
            printf '\x00\x00\x40\x3f\x00\x00\x80\x3e' # 0.75, 0.25
        done
    done
} >"$seeds/dump"
fuzz routing 8192 ""
