#!/usr/bin/env bash
# The hostile-GGUF suite (tests/unit/test_gguf.c) under ASan + UBSan, as part
# of `make test`: every corrupt file must be rejected with no sanitizer report.
# Builds only the reader/writer sources, so it costs seconds. The whole unit
# suite under sanitizers is `make asan`.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
out=$BUILD/gguf-asan
mkdir -p "$out"
cc -std=c11 -O1 -g -D_GNU_SOURCE -fsanitize=address,undefined -fno-sanitize-recover=undefined \
   -fno-omit-frame-pointer -Iengine -o "$out/test_gguf" \
   tests/unit/test_gguf.c engine/gguf.c engine/gguf_writer.c engine/quant.c engine/quant_dequant.c \
   engine/status.c -lcmocka -lm
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 "$out/test_gguf"
