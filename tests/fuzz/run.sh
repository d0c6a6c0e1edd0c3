#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) and runs each for
# FUZZ_SECONDS (default 60): the GGUF reader, seeded with the first 64 KiB of
# every fixture GGUF (truncated, hence invalid: they still lead the fuzzer
# into real metadata) plus small valid files written by tests/fuzz/gen_seeds.c;
# then the HTTP API's request parsers (tests/fuzz/fuzz_request.c), seeded with
# one valid body per API and shape. The corpora it grows are kept in
# $BUILD/fuzz/corpus-* between runs; crashes are written to $BUILD/fuzz/ as
# crash-*. Exit status: 0 when no failure was found.
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

SRC="engine/gguf.c engine/gguf_writer.c engine/quant.c engine/status.c"
FLAGS="-std=c11 -g -O1 -D_GNU_SOURCE -Iengine -fno-omit-frame-pointer"
"$CLANG" $FLAGS -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    tests/fuzz/fuzz_gguf.c $SRC -o "$out/fuzz_gguf" -lm
"$CLANG" $FLAGS -fsanitize=address,undefined tests/fuzz/gen_seeds.c $SRC -o "$out/gen_seeds" -lm

seeds=$out/seeds-gguf corpus=$out/corpus-gguf
rm -rf "$seeds"
mkdir -p "$seeds" "$corpus"
"$out/gen_seeds" "$seeds"
shopt -s nullglob
for f in tests/fixtures/*/*.gguf models/demo/*.gguf ../shared/fixtures/*/*.gguf; do
    head -c 65536 "$f" >"$seeds/$(basename "$(dirname "$f")")-$(basename "$f").head"
done
echo "fuzz_gguf: $(ls "$seeds" | wc -l) seeds, $(ls "$corpus" | wc -l) corpus files, ${FUZZ_SECONDS} s"

"$out/fuzz_gguf" -max_total_time="$FUZZ_SECONDS" -max_len=70000 -timeout=10 -rss_limit_mb=2048 \
    -dict=tests/fuzz/gguf.dict -artifact_prefix="$out/" -print_final_stats=1 "$corpus" "$seeds"
echo "fuzz_gguf: no failure in ${FUZZ_SECONDS} s"

# The HTTP API's request parsers: built by make from the library (its rule
# says which sources are instrumented); seeds are one valid body per API and
# shape, the first byte choosing the API and the chat template.
make -s BUILD="$BUILD" "$out/fuzz_request"
seeds=$out/seeds-request corpus=$out/corpus-request
rm -rf "$seeds"
mkdir -p "$seeds" "$corpus"
printf '\x00{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"hi"}],"max_tokens":8,"stop":["x"],"temperature":0.5,"chat_template_kwargs":{"enable_thinking":false}}' >"$seeds/chat"
printf '\x03{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]},{"role":"assistant","content":"a","reasoning_content":"r"},{"role":"user","content":"again"}],"stream":true,"stream_options":{"include_usage":true},"reasoning_effort":"low","seed":7}' >"$seeds/chat-stream"
printf '\x01{"prompt":"once","max_tokens":4,"stop":"z","seed":3,"top_k":5,"min_p":0.1,"ignore_eos":true}' >"$seeds/completion"
printf '\x02{"model":"m","max_tokens":16,"system":"s","messages":[{"role":"user","content":"hi"}],"thinking":{"type":"enabled","budget_tokens":1024},"stop_sequences":["q"]}' >"$seeds/messages"
printf '\x05{"max_tokens":16,"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":[{"type":"text","text":"x"}]},{"role":"assistant","content":[{"type":"thinking","thinking":"t","signature":""},{"type":"text","text":"y"}]}],"stream":true}' >"$seeds/messages-stream"
echo "fuzz_request: $(ls "$seeds" | wc -l) seeds, $(ls "$corpus" | wc -l) corpus files, ${FUZZ_SECONDS} s"
"$out/fuzz_request" -max_total_time="$FUZZ_SECONDS" -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
    -dict=tests/fuzz/request.dict -artifact_prefix="$out/" -print_final_stats=1 "$corpus" "$seeds"
echo "fuzz_request: no failure in ${FUZZ_SECONDS} s"
