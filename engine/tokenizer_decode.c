/* tokenizer_decode: ids -> text (gguf.md §4.7), whole or streaming.
 * Pieces are decoded once at load (tokenizer.c build_pieces), so decoding is
 * a copy per token and never allocates. */
#include <string.h>

#include "tokenizer_internal.h"
#include "unicode.h"

/* The bytes token id contributes under flags (empty for dropped specials). */
static const char *piece_for(const tdm_tokenizer *tk, int32_t id, unsigned flags, size_t *n)
{
    uint8_t t = tk->type[id];
    if (!(flags & TDM_DECODE_SPECIAL) && (t == TDM_TOKEN_CONTROL || t == TDM_TOKEN_UNKNOWN)) {
        *n = 0;
        return "";
    }
    *n = tk->piece_len[id];
    return tk->arena + tk->piece_off[id];
}

tdm_status tdm_tokenizer_decode(const tdm_tokenizer *tk, const int32_t *ids, size_t n, unsigned flags,
                                char *out, size_t cap, size_t *len, tdm_error *err)
{
    size_t o = 0;
    *len = 0;
    if (!out)
        cap = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= tk->n_vocab) {
            if (cap)
                out[o < cap ? o : cap - 1] = '\0';
            return tdm_error_set(err, TDM_ERR_INVALID, "tokenizer_decode: ids[%zu] = %d outside the vocab (%d)",
                                 i, ids[i], tk->n_vocab);
        }
        size_t m;
        const char *p = piece_for(tk, ids[i], flags, &m);
        if (o + m < cap)
            memcpy(out + o, p, m);
        else if (o + 1 < cap)
            memcpy(out + o, p, cap - 1 - o);
        o += m;
    }
    *len = o;
    if (cap)
        out[o < cap ? o : cap - 1] = '\0';
    if (o + 1 > cap)
        return tdm_error_set(err, TDM_ERR_INVALID, "tokenizer_decode: %zu bytes do not fit in %zu", o + 1, cap);
    return TDM_OK;
}

/* ---- streaming ---- */

void tdm_detok_init(tdm_detok *d, unsigned flags)
{
    memset(d, 0, sizeof *d);
    d->flags = flags;
}

size_t tdm_detok_cap(const tdm_tokenizer *tk)
{
    /* every held or new byte may turn into a 3-byte U+FFFD */
    return 3 * (tk->max_piece + sizeof ((tdm_detok *)0)->pending);
}

static size_t put_fffd(char *out)
{
    out[0] = (char)0xEF;
    out[1] = (char)0xBF;
    out[2] = (char)0xBD;
    return 3;
}

tdm_status tdm_detok_push(tdm_detok *d, const tdm_tokenizer *tk, int32_t id, char *out, size_t cap,
                          size_t *len, tdm_error *err)
{
    *len = 0;
    if (id < 0 || id >= tk->n_vocab)
        return tdm_error_set(err, TDM_ERR_INVALID, "detok_push: id %d outside the vocab (%d)", id, tk->n_vocab);
    if (cap < tdm_detok_cap(tk))
        return tdm_error_set(err, TDM_ERR_INVALID, "detok_push: out holds %zu bytes, need %zu", cap,
                             tdm_detok_cap(tk));
    size_t m;
    const char *p = piece_for(tk, id, d->flags, &m);
    /* work on pending ++ piece without copying the piece */
    size_t np = d->n_pending, total = np + m, i = 0, o = 0;
#define AT(k) ((k) < np ? d->pending[k] : (uint8_t)p[(k) - np])
    while (i < total) {
        uint8_t b = AT(i);
        if (b < 0x80) {
            out[o++] = (char)b;
            i++;
            continue;
        }
        size_t k = 0;
        uint8_t buf[4];
        while (k < 4 && i + k < total) {
            buf[k] = AT(i + k);
            k++;
        }
        int n = tdm_utf8_check(buf, k);
        if (n < 0) { /* valid but incomplete: hold it back for the next token */
            memcpy(d->pending, buf, k);
            d->n_pending = (uint32_t)k;
            *len = o;
            return TDM_OK;
        }
        if (n == 0) {
            o += put_fffd(out + o);
            i++;
            continue;
        }
        memcpy(out + o, buf, (size_t)n);
        o += (size_t)n;
        i += (size_t)n;
    }
#undef AT
    d->n_pending = 0;
    *len = o;
    return TDM_OK;
}

size_t tdm_detok_flush(tdm_detok *d, char *out)
{
    size_t o = 0;
    for (uint32_t i = 0; i < d->n_pending; i++)
        o += put_fffd(out + o);
    d->n_pending = 0;
    return o;
}
