#!/usr/bin/env bash
# Builds the libFuzzer target for the GGUF reader (clang, ASan + UBSan) and runs
# it for FUZZ_SECONDS (default 60). Seeds: the first 64 KiB of every fixture
# GGUF (truncated, hence invalid: they still lead the fuzzer into real
# metadata) plus small valid files written by tests/fuzz/gen_seeds.c. The
# corpus it grows is kept in $BUILD/fuzz/corpus-gguf between runs; crashes are
# written to $BUILD/fuzz/ as crash-*. Exit status: 0 when no failure was found.
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
