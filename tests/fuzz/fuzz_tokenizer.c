/* libFuzzer target for the tokenizer on the demo model's vocabulary: the first
 * byte picks the encode flags, the rest is the text. Checks the contract of
 * tokenizer.h on every input: encode measures and then fits
 * tdm_tokenizer_encode_bound, every id is in the vocabulary, decode(encode(x))
 * == tdm_utf8_sanitize(x), and the streaming detokeniser gives the same bytes
 * in chunks that are each valid UTF-8. Built and run by tests/fuzz/run.sh,
 * from the repository root. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"
#include "unicode.h"

static tdm_tokenizer *tk;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    tdm_error err = {0};
    if (tdm_tokenizer_open("models/demo/demo-Q4_K_M.gguf", &tk, &err) != TDM_OK) {
        fprintf(stderr, "fuzz_tokenizer: %s (run from the repository root)\n", err.msg);
        abort();
    }
    return 0;
}

/* Whether s[0..n) is UTF-8 sanitize leaves as it is. */
static int valid_utf8(const char *s, size_t n, char *scratch)
{
    return tdm_utf8_sanitize(s, n, scratch) == n && memcmp(s, scratch, n) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const unsigned flags = data[0] & (TDM_TOKENIZE_PARSE_SPECIAL | TDM_TOKENIZE_ADD_SPECIAL);
    const char *text = (const char *)data + 1;
    const size_t len = size - 1;
    tdm_error err = {0};
    size_t n_ids = 0;
    tdm_status st = tdm_tokenizer_encode(tk, text, len, flags, NULL, 0, &n_ids, &err);
    if (st != (n_ids ? TDM_ERR_INVALID : TDM_OK) || n_ids > tdm_tokenizer_encode_bound(len))
        abort(); /* measuring */
    int32_t *ids = malloc((n_ids + 1) * sizeof *ids);
    size_t again = 0;
    if (tdm_tokenizer_encode(tk, text, len, flags, ids, n_ids, &again, &err) != TDM_OK || again != n_ids)
        abort();
    for (size_t i = 0; i < n_ids; i++)
        if (ids[i] < 0 || ids[i] >= tdm_tokenizer_n_vocab(tk))
            abort();
    char *clean = malloc(3 * len + 1), *out = malloc(3 * len + 1);
    const size_t cn = tdm_utf8_sanitize(text, len, clean);
    size_t dn = 0;
    if (tdm_tokenizer_decode(tk, ids, n_ids, TDM_DECODE_SPECIAL, out, 3 * len + 1, &dn, &err) != TDM_OK ||
        dn != cn || memcmp(out, clean, cn) != 0)
        abort(); /* decode(encode(x)) == sanitize(x) */
    tdm_detok d;
    tdm_detok_init(&d, TDM_DECODE_SPECIAL);
    const size_t cap = tdm_detok_cap(tk);
    char *chunk = malloc(cap), *scratch = malloc(3 * cap + TDM_DETOK_FLUSH_MAX * 3);
    size_t o = 0;
    for (size_t i = 0; i < n_ids; i++) {
        size_t m = 0;
        if (tdm_detok_push(&d, tk, ids[i], chunk, cap, &m, &err) != TDM_OK || o + m > cn ||
            !valid_utf8(chunk, m, scratch) || memcmp(chunk, clean + o, m) != 0)
            abort();
        o += m;
    }
    char tail[TDM_DETOK_FLUSH_MAX];
    const size_t m = tdm_detok_flush(&d, tail);
    if (o + m != cn || !valid_utf8(tail, m, scratch) || memcmp(tail, clean + o, m) != 0)
        abort(); /* the stream gives the same bytes */
    free(ids), free(clean), free(out), free(chunk), free(scratch);
    return 0;
}
