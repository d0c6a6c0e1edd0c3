/* tokenizer_encode: text -> ids (gguf.md §4.3-4.6).
 *
 * special-token partition -> per raw fragment: strict UTF-8 decode (bad byte
 * -> U+FFFD) -> pre-tokeniser scanner (llama.cpp's hand-written qwen2 /
 * qwen35 / gpt2 scanners, rule by rule) -> byte-level symbols -> BPE with a
 * binary heap (lowest rank, then leftmost) -> ids.
 * Scratch is per call (the tokenizer stays immutable and thread-safe).
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"
#include "unicode.h"

#define OOR 0xFFFFFFFFu /* code point of a position outside the fragment */

typedef struct frag {
    int32_t id; /* special token id, -1 for raw text */
    size_t off, len;
} frag;

typedef struct heap_ent {
    uint32_t rank;
    int32_t left, right; /* symbol positions */
    int32_t lx, rx, res; /* ids of left, right and the merge (staleness check) */
} heap_ent;

typedef struct enc {
    const tdm_tokenizer *tk;
    /* per fragment, sized for the whole text */
    uint32_t *cp;  /* [n_cp] code points */
    uint16_t *fl;  /* [n_cp] flags */
    size_t *boff;  /* [n_cp + 1] byte offset of each code point in sbuf */
    uint8_t *sbuf; /* [3 * len] sanitised UTF-8 of the fragment */
    /* per word, grown on demand */
    int32_t *sx, *prev, *next; /* [sym_cap] symbol id (-1 = merged away) and links */
    size_t sym_cap;
    heap_ent *heap;
    size_t heap_n, heap_cap;
    frag *fa, *fb;
    size_t fcap;
    int32_t *ids;
    size_t cap, n;
    bool oom;
} enc;

static void emit(enc *e, int32_t id)
{
    if (e->n < e->cap)
        e->ids[e->n] = id;
    e->n++;
}

/* ---- BPE over one word ---- */

static bool heap_less(const heap_ent *a, const heap_ent *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static void heap_push(enc *e, heap_ent v)
{
    size_t i = e->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&v, &e->heap[p]))
            break;
        e->heap[i] = e->heap[p];
        i = p;
    }
    e->heap[i] = v;
}

static heap_ent heap_pop(enc *e)
{
    heap_ent top = e->heap[0], v = e->heap[--e->heap_n];
    size_t i = 0, n = e->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && heap_less(&e->heap[c + 1], &e->heap[c]))
            c++;
        if (!heap_less(&e->heap[c], &v))
            break;
        e->heap[i] = e->heap[c];
        i = c;
    }
    if (n)
        e->heap[i] = v;
    return top;
}

static void try_pair(enc *e, int32_t l, int32_t r)
{
    int32_t res;
    int64_t rank = tk_merge_find(e->tk, e->sx[l], e->sx[r], &res);
    if (rank >= 0)
        heap_push(e, (heap_ent){(uint32_t)rank, l, r, e->sx[l], e->sx[r], res});
}

static bool grow_word(enc *e, size_t n)
{
    if (n <= e->sym_cap)
        return true;
    size_t cap = n < 256 ? 256 : 2 * n;
    int32_t *a = realloc(e->sx, cap * sizeof *a);
    if (a)
        e->sx = a;
    int32_t *b = a ? realloc(e->prev, cap * sizeof *b) : NULL;
    if (b)
        e->prev = b;
    int32_t *c = b ? realloc(e->next, cap * sizeof *c) : NULL;
    if (c)
        e->next = c;
    heap_ent *h = c ? realloc(e->heap, 3 * cap * sizeof *h) : NULL;
    if (!h)
        return false;
    e->heap = h;
    e->heap_cap = 3 * cap;
    e->sym_cap = cap;
    return true;
}

/* A final symbol the vocab lacks: llama.cpp looks up each byte of its
 * (byte-level) text as a one-byte token and drops the misses. */
static void emit_virtual(enc *e, int32_t x)
{
    size_t n;
    const char *s = tk_text(e->tk, x, &n);
    for (size_t i = 0; i < n; i++) {
        int32_t id = tk_lookup(e->tk, s + i, 1);
        if (id >= 0 && id < e->tk->n_vocab)
            emit(e, id);
    }
}

static void bpe_word(enc *e, const uint8_t *w, size_t n)
{
    if (!grow_word(e, n)) {
        e->oom = true;
        return;
    }
    const tdm_tokenizer *tk = e->tk;
    for (size_t i = 0; i < n; i++) {
        e->sx[i] = tk->byte_xid[w[i]];
        e->prev[i] = (int32_t)i - 1;
        e->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    e->heap_n = 0;
    for (size_t i = 0; i + 1 < n; i++)
        try_pair(e, (int32_t)i, (int32_t)i + 1);
    while (e->heap_n) {
        heap_ent h = heap_pop(e);
        if (e->sx[h.left] != h.lx || e->sx[h.right] != h.rx || e->next[h.left] != h.right)
            continue; /* stale: one side changed since the pair was queued */
        e->sx[h.left] = h.res;
        e->sx[h.right] = -1;
        int32_t nx = e->next[h.right];
        e->next[h.left] = nx;
        if (nx >= 0)
            e->prev[nx] = h.left;
        if (e->prev[h.left] >= 0)
            try_pair(e, e->prev[h.left], h.left);
        if (nx >= 0)
            try_pair(e, h.left, nx);
    }
    for (int32_t i = 0; i >= 0; i = e->next[i]) {
        if (e->sx[i] < tk->n_vocab)
            emit(e, e->sx[i]);
        else
            emit_virtual(e, e->sx[i]);
    }
}

/* ---- pre-tokenisers: each returns the end of the word starting at pos ---- */

static inline unsigned flags_at(const enc *e, size_t p, size_t end) { return p < end ? e->fl[p] : 0u; }
static inline uint32_t cp_at(const enc *e, size_t p, size_t end) { return p < end ? e->cp[p] : OOR; }

static size_t scan_contraction(const enc *e, size_t pos, size_t end, bool ci)
{
    if (e->cp[pos] != '\'' || pos + 1 >= end)
        return 0;
    uint32_t a = e->cp[pos + 1];
    if (ci)
        a = tdm_unicode_tolower(a);
    if (a == 's' || a == 't' || a == 'm' || a == 'd')
        return pos + 2;
    if (pos + 2 >= end)
        return 0;
    uint32_t b = e->cp[pos + 2];
    if (ci)
        b = tdm_unicode_tolower(b);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
        return pos + 3;
    return 0;
}

/* Rule 5 (and the fallback): whitespace runs. with_rn: the qwen \s*[\r\n]+ rule. */
static size_t scan_space(const enc *e, size_t pos, size_t end, bool with_rn)
{
    size_t nws = 0, last_rn = 0;
    while (flags_at(e, pos + nws, end) & TDM_UCF_WHITESPACE) {
        uint32_t c = e->cp[pos + nws];
        if (c == '\r' || c == '\n')
            last_rn = pos + nws + 1;
        nws++;
    }
    if (with_rn && last_rn > 0)
        return last_rn;
    if (nws > 1 && cp_at(e, pos + nws, end) != OOR)
        return pos + nws - 1; /* \s+(?!\S): leave one space for the next word */
    if (nws > 0)
        return pos + nws;
    return pos + 1;
}

static size_t scan_qwen(const enc *e, size_t pos, size_t end, bool q35)
{
    const unsigned lm = q35 ? (TDM_UCF_LETTER | TDM_UCF_MARK) : TDM_UCF_LETTER;
    size_t r = scan_contraction(e, pos, end, true);
    if (r)
        return r;
    uint32_t c = e->cp[pos];
    unsigned f = e->fl[pos];
    /* [^\r\n\p{L}\p{N}]?\p{L}+  (qwen35: [\p{L}\p{M}]+) */
    if (!(c == '\r' || c == '\n' || (f & TDM_UCF_NUMBER)) && ((f & lm) || (flags_at(e, pos + 1, end) & lm))) {
        pos++;
        while (flags_at(e, pos, end) & lm)
            pos++;
        return pos;
    }
    if (f & TDM_UCF_NUMBER)
        return pos + 1;
    /*  ?[^\s\p{L}\p{N}]+[\r\n]*  ; the "f != 0" test is llama.cpp's quirk (c's flags, not f2's) */
    const unsigned stop = TDM_UCF_WHITESPACE | lm | TDM_UCF_NUMBER;
    unsigned f2 = c == ' ' ? flags_at(e, pos + 1, end) : f;
    if (!(f2 & stop) && f) {
        pos += (c == ' ');
        while (!(f2 & stop) && f2)
            f2 = flags_at(e, ++pos, end);
        for (uint32_t c2 = cp_at(e, pos, end); c2 == '\r' || c2 == '\n'; c2 = cp_at(e, pos, end))
            pos++;
        return pos;
    }
    return scan_space(e, pos, end, true);
}

static size_t scan_gpt2(const enc *e, size_t pos, size_t end)
{
    size_t r = scan_contraction(e, pos, end, false);
    if (r)
        return r;
    uint32_t c = e->cp[pos];
    unsigned f2 = c == ' ' ? flags_at(e, pos + 1, end) : e->fl[pos];
    static const unsigned classes[2] = {TDM_UCF_LETTER, TDM_UCF_NUMBER};
    for (int k = 0; k < 2; k++) { /*  ?\p{L}+  and  ?\p{N}+ */
        if (f2 & classes[k]) {
            pos += (c == ' ');
            while (f2 & classes[k])
                f2 = flags_at(e, ++pos, end);
            return pos;
        }
    }
    const unsigned stop = TDM_UCF_WHITESPACE | TDM_UCF_LETTER | TDM_UCF_NUMBER;
    if (!(f2 & stop) && f2) { /*  ?[^\s\p{L}\p{N}]+ */
        pos += (c == ' ');
        while (!(f2 & stop) && f2)
            f2 = flags_at(e, ++pos, end);
        return pos;
    }
    return scan_space(e, pos, end, false);
}

static void encode_raw(enc *e, const uint8_t *s, size_t len)
{
    size_t n = 0, o = 0;
    for (size_t i = 0; i < len;) {
        uint32_t c;
        size_t m = tdm_utf8_decode(s + i, len - i, &c);
        e->boff[n] = o;
        o += tdm_utf8_encode(c, e->sbuf + o); /* == the input bytes, or EF BF BD */
        e->cp[n] = c;
        e->fl[n] = (uint16_t)tdm_unicode_flags(c);
        n++;
        i += m;
    }
    e->boff[n] = o;
    tdm_pretok pt = e->tk->pretok;
    for (size_t pos = 0; pos < n && !e->oom;) {
        size_t end = pt == TDM_PRETOK_GPT2 ? scan_gpt2(e, pos, n) : scan_qwen(e, pos, n, pt == TDM_PRETOK_QWEN35);
        bpe_word(e, e->sbuf + e->boff[pos], e->boff[end] - e->boff[pos]);
        pos = end;
    }
}

/* ---- special-token partition (llama.cpp tokenizer_st_partition) ---- */

static bool frag_push(enc *e, size_t *nb, frag f)
{
    if (*nb == e->fcap) {
        size_t cap = e->fcap * 2;
        frag *a = realloc(e->fa, cap * sizeof *a);
        if (a)
            e->fa = a;
        frag *b = a ? realloc(e->fb, cap * sizeof *b) : NULL;
        if (!b)
            return false;
        e->fb = b;
        e->fcap = cap;
    }
    e->fb[(*nb)++] = f;
    return true;
}

static size_t partition(enc *e, const char *text, size_t len, bool parse_special)
{
    const tdm_tokenizer *tk = e->tk;
    size_t nf = 1;
    e->fa[0] = (frag){-1, 0, len};
    for (int32_t k = 0; k < tk->n_specials; k++) {
        int32_t id = tk->specials[k];
        if (!parse_special && tk->type[id] != TDM_TOKEN_USER_DEFINED)
            continue;
        size_t sl;
        const char *st = tk_text(tk, id, &sl);
        if (!memmem(text, len, st, sl))
            continue;
        size_t nb = 0;
        for (size_t i = 0; i < nf; i++) {
            frag f = e->fa[i];
            if (f.id >= 0) {
                if (!frag_push(e, &nb, f))
                    return 0;
                continue;
            }
            size_t p = f.off, end = f.off + f.len;
            const char *q;
            while (p < end && (q = memmem(text + p, end - p, st, sl))) {
                size_t at = (size_t)(q - text);
                if ((at > p && !frag_push(e, &nb, (frag){-1, p, at - p})) ||
                    !frag_push(e, &nb, (frag){id, at, sl}))
                    return 0;
                p = at + sl;
            }
            if (p < end && !frag_push(e, &nb, (frag){-1, p, end - p}))
                return 0;
        }
        frag *t = e->fa;
        e->fa = e->fb;
        e->fb = t;
        nf = nb;
    }
    return nf;
}

static void enc_free(enc *e)
{
    free(e->cp);
    free(e->fl);
    free(e->boff);
    free(e->sbuf);
    free(e->sx);
    free(e->prev);
    free(e->next);
    free(e->heap);
    free(e->fa);
    free(e->fb);
}

tdm_status tdm_tokenizer_encode(const tdm_tokenizer *tk, const char *text, size_t len, unsigned flags,
                                int32_t *ids, size_t cap, size_t *n_ids, tdm_error *err)
{
    *n_ids = 0;
    if (!text && len)
        return tdm_error_set(err, TDM_ERR_INVALID, "tokenizer_encode: text is NULL");
    if (!ids)
        cap = 0;
    enc e = {.tk = tk, .ids = ids, .cap = cap, .fcap = 16};
    if (flags & TDM_TOKENIZE_ADD_SPECIAL && tk->add_bos && tk->bos >= 0)
        emit(&e, tk->bos);
    if (len) {
        e.cp = malloc(len * sizeof *e.cp);
        e.fl = malloc(len * sizeof *e.fl);
        e.boff = malloc((len + 1) * sizeof *e.boff);
        e.sbuf = malloc(3 * len + 4);
        e.fa = malloc(e.fcap * sizeof *e.fa);
        e.fb = malloc(e.fcap * sizeof *e.fb);
        e.oom = !e.cp || !e.fl || !e.boff || !e.sbuf || !e.fa || !e.fb;
        size_t nf = e.oom ? 0 : partition(&e, text, len, flags & TDM_TOKENIZE_PARSE_SPECIAL);
        e.oom |= nf == 0;
        for (size_t i = 0; i < nf && !e.oom; i++) {
            if (e.fa[i].id >= 0)
                emit(&e, e.fa[i].id);
            else
                encode_raw(&e, (const uint8_t *)text + e.fa[i].off, e.fa[i].len);
        }
    }
    enc_free(&e);
    if (e.oom)
        return tdm_error_set(err, TDM_ERR_OOM, "tokenizer_encode: scratch for %zu bytes of text", len);
    if (flags & TDM_TOKENIZE_ADD_SPECIAL && tk->add_eos && tk->eos >= 0)
        emit(&e, tk->eos);
    *n_ids = e.n;
    if (e.n > cap)
        return tdm_error_set(err, TDM_ERR_INVALID, "tokenizer_encode: %zu ids do not fit in %zu", e.n, cap);
    return TDM_OK;
}
