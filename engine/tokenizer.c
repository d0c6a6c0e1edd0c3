/* tokenizer: byte-level BPE (gguf.md §4).
 *
 * Load builds two hashes once: text -> id over the vocab, and (left id,
 * right id) -> (rank, merged id) over the merges. Strings that merges
 * mention but the vocab lacks (never the case for a consistent file) get
 * "virtual" ids >= n_vocab, so BPE runs on integer ids only and still behaves
 * exactly like llama.cpp's text-based merge on such files. The 256 byte-level
 * symbols are resolved once (byte_xid), so a word's initial symbols are just
 * its UTF-8 bytes mapped through that table.
 */
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"
#include "unicode.h"

#define TT_MAX 6 /* largest token type id */

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 0x100000001b3ull;
    }
    h ^= h >> 32;
    h *= 0xd6e8feb86659fd93ull;
    return h ^ (h >> 32);
}

static uint64_t hash_pair(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return k;
}

const char *tk_text(const tdm_tokenizer *tk, int32_t x, size_t *len)
{
    *len = tk->text_len[x];
    return tk->arena + tk->text_off[x];
}

int32_t tk_lookup(const tdm_tokenizer *tk, const char *s, size_t n)
{
    uint64_t h = hash_bytes(s, n);
    uint32_t tag = (uint32_t)(h >> 32);
    for (uint32_t i = (uint32_t)h & tk->vmask;; i = (i + 1) & tk->vmask) {
        int32_t x = tk->vhash[i].id;
        if (x < 0)
            return -1;
        if (tk->vhash[i].tag == tag && tk->text_len[x] == n && memcmp(tk->arena + tk->text_off[x], s, n) == 0)
            return x;
    }
}

int64_t tk_merge_find(const tdm_tokenizer *tk, int32_t l, int32_t r, int32_t *res)
{
    uint64_t key = ((uint64_t)(uint32_t)l << 32) | (uint32_t)r;
    for (uint32_t i = (uint32_t)hash_pair(key) & tk->mmask;; i = (i + 1) & tk->mmask) {
        if (tk->mkey[i] == UINT64_MAX)
            return -1;
        if (tk->mkey[i] == key) {
            *res = tk->mres[i];
            return tk->mrank[i];
        }
    }
}

/* ---- load-time building blocks ---- */

static tdm_status arena_put(tdm_tokenizer *tk, const char *s, size_t n, uint32_t *off, tdm_error *err)
{
    if (tk->arena_len + n + 1 > UINT32_MAX)
        return tdm_error_set(err, TDM_ERR_OOM, "tokenizer: string arena above 4 GiB");
    if (tk->arena_len + n + 1 > tk->arena_cap) {
        size_t cap = tk->arena_cap ? tk->arena_cap : 1 << 16;
        while (cap < tk->arena_len + n + 1)
            cap *= 2;
        char *p = realloc(tk->arena, cap);
        if (!p)
            return tdm_error_set(err, TDM_ERR_OOM, "tokenizer: arena of %zu bytes", cap);
        tk->arena = p;
        tk->arena_cap = cap;
    }
    memcpy(tk->arena + tk->arena_len, s, n);
    tk->arena[tk->arena_len + n] = '\0';
    *off = (uint32_t)tk->arena_len;
    tk->arena_len += n + 1;
    return TDM_OK;
}

static void vhash_insert(tdm_tokenizer *tk, int32_t x)
{
    size_t n;
    const char *s = tk_text(tk, x, &n);
    uint64_t h = hash_bytes(s, n);
    uint32_t tag = (uint32_t)(h >> 32);
    for (uint32_t i = (uint32_t)h & tk->vmask;; i = (i + 1) & tk->vmask) {
        int32_t y = tk->vhash[i].id;
        if (y < 0 || (tk->vhash[i].tag == tag && tk->text_len[y] == n &&
                      memcmp(tk->arena + tk->text_off[y], s, n) == 0)) {
            /* empty slot, or duplicate text: llama.cpp's token_to_id keeps the last id */
            tk->vhash[i] = (tk_vslot){tag, x};
            return;
        }
    }
}

static tdm_status vhash_alloc(tdm_tokenizer *tk, size_t n_entries, tdm_error *err)
{
    size_t cap = 1024;
    while (cap < 2 * n_entries)
        cap *= 2;
    tk_vslot *h = malloc(cap * sizeof *h);
    if (!h)
        return tdm_error_set(err, TDM_ERR_OOM, "tokenizer: vocab hash of %zu slots", cap);
    memset(h, 0xff, cap * sizeof *h);
    free(tk->vhash);
    tk->vhash = h;
    tk->vmask = (uint32_t)(cap - 1);
    for (int32_t x = 0; x < tk->n_xtok; x++)
        vhash_insert(tk, x);
    return TDM_OK;
}

/* Appends a text entry (vocab token or virtual symbol); returns its id. */
static tdm_status add_text(tdm_tokenizer *tk, const char *s, size_t n, int32_t *id, tdm_error *err)
{
    if (tk->n_xtok == tk->xcap) {
        size_t cap = tk->xcap ? (size_t)tk->xcap * 2 : 4096;
        uint32_t *o = realloc(tk->text_off, cap * sizeof *o);
        if (o)
            tk->text_off = o;
        uint32_t *l = o ? realloc(tk->text_len, cap * sizeof *l) : NULL;
        if (!l)
            return tdm_error_set(err, TDM_ERR_OOM, "tokenizer: %zu token entries", cap);
        tk->text_len = l;
        tk->xcap = (int32_t)cap;
    }
    int32_t x = tk->n_xtok;
    tdm_status st = arena_put(tk, s, n, &tk->text_off[x], err);
    if (st)
        return st;
    tk->text_len[x] = (uint32_t)n;
    tk->n_xtok++;
    if ((size_t)tk->n_xtok * 10 > ((size_t)tk->vmask + 1) * 7) {
        st = vhash_alloc(tk, (size_t)tk->n_xtok * 2, err);
        if (st)
            return st;
    } else {
        vhash_insert(tk, x);
    }
    *id = x;
    return TDM_OK;
}

/* Id of text s, creating a virtual one when the vocab lacks it. */
static tdm_status intern(tdm_tokenizer *tk, const char *s, size_t n, int32_t *id, tdm_error *err)
{
    int32_t x = tk_lookup(tk, s, n);
    if (x >= 0) {
        *id = x;
        return TDM_OK;
    }
    return add_text(tk, s, n, id, err);
}

/* GPT-2 byte-level map (gguf.md §4.5). */
static uint32_t byte_to_cp(uint8_t b)
{
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)
        return b;
    uint32_t k = 0; /* rank of b among the 68 remapped bytes */
    for (uint32_t c = 0; c < b; c++)
        if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE))
            k++;
    return 0x100 + k;
}

/* Inverse of byte_to_cp over U+0000..U+0143 (-1: not a byte-level char). */
static void build_inverse(int16_t inv[0x144])
{
    for (int i = 0; i < 0x144; i++)
        inv[i] = -1;
    for (int b = 0; b < 256; b++)
        inv[byte_to_cp((uint8_t)b)] = (int16_t)b;
}

static tdm_status load_tokens(tdm_tokenizer *tk, const tdm_gguf *g, tdm_error *err)
{
    tdm_gguf_vtype et;
    uint64_t n;
    tdm_status st = tdm_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n, err);
    if (st)
        return st;
    if (et != TDM_GGUF_STRING || n == 0 || n > (1u << 28))
        return tdm_error_set(err, TDM_ERR_FORMAT,
                             "tokenizer.ggml.tokens: want 1..2^28 strings, have %llu of type %d",
                             (unsigned long long)n, (int)et);
    tk->n_vocab = (int32_t)n;
    tk->type = calloc(n, 1);
    if (!tk->type || (st = vhash_alloc(tk, n + 256, err)))
        return st ? st : tdm_error_set(err, TDM_ERR_OOM, "tokenizer: token types");
    bool have_types = tdm_gguf_find_key(g, "tokenizer.ggml.token_type") >= 0;
    if (have_types) {
        uint64_t nt;
        if ((st = tdm_gguf_get_arr(g, "tokenizer.ggml.token_type", &et, &nt, err)))
            return st;
        if (nt != n || et == TDM_GGUF_STRING || et == TDM_GGUF_ARRAY || et == TDM_GGUF_FLOAT32 ||
            et == TDM_GGUF_FLOAT64)
            return tdm_error_set(err, TDM_ERR_FORMAT,
                                 "tokenizer.ggml.token_type: want %llu integers, have %llu of type %d",
                                 (unsigned long long)n, (unsigned long long)nt, (int)et);
    }
    for (uint64_t i = 0; i < n; i++) {
        const char *s;
        size_t len;
        char empty[32];
        if ((st = tdm_gguf_arr_str(g, "tokenizer.ggml.tokens", i, &s, &len, err)))
            return st;
        if (len == 0) {
            len = (size_t)snprintf(empty, sizeof empty, "[EMPTY_%llu]", (unsigned long long)i);
            s = empty;
        }
        int64_t t = TDM_TOKEN_NORMAL;
        if (have_types && (st = tdm_gguf_arr_int(g, "tokenizer.ggml.token_type", i, &t, err)))
            return st;
        if (t < 0 || t > TT_MAX)
            return tdm_error_set(err, TDM_ERR_FORMAT, "tokenizer.ggml.token_type[%llu] = %lld (want 0..6)",
                                 (unsigned long long)i, (long long)t);
        tk->type[i] = (uint8_t)t;
        int32_t id;
        if ((st = add_text(tk, s, len, &id, err)))
            return st;
    }
    return TDM_OK;
}

/* Decoded bytes of every vocab token (what detokenisation emits). */
static tdm_status build_pieces(tdm_tokenizer *tk, tdm_error *err)
{
    tk->piece_off = malloc((size_t)tk->n_vocab * sizeof *tk->piece_off);
    tk->piece_len = malloc((size_t)tk->n_vocab * sizeof *tk->piece_len);
    if (!tk->piece_off || !tk->piece_len)
        return tdm_error_set(err, TDM_ERR_OOM, "tokenizer: piece index");
    char *buf = NULL;
    size_t bcap = 0;
    tdm_status st = TDM_OK;
    int16_t inv[0x144];
    build_inverse(inv);
    for (int32_t i = 0; i < tk->n_vocab && !st; i++) {
        size_t n;
        const char *s = tk_text(tk, i, &n);
        if (bcap < n + 1) {
            bcap = 2 * n + 64;
            char *p = realloc(buf, bcap);
            if (!p) {
                st = tdm_error_set(err, TDM_ERR_OOM, "tokenizer: piece buffer");
                break;
            }
            buf = p;
        }
        size_t o = 0;
        uint8_t t = tk->type[i];
        if (t == TDM_TOKEN_NORMAL) {
            for (size_t k = 0; k < n;) {
                uint32_t cp;
                size_t m = tdm_utf8_decode((const uint8_t *)s + k, n - k, &cp);
                int b = cp < 0x144 ? inv[cp] : -1;
                if (b >= 0) {
                    buf[o++] = (char)b;
                } else { /* not a byte-level char: keep it verbatim */
                    memcpy(buf + o, s + k, m);
                    o += m;
                }
                k += m;
            }
        } else if (t == TDM_TOKEN_CONTROL || t == TDM_TOKEN_UNKNOWN || t == TDM_TOKEN_USER_DEFINED) {
            memcpy(buf, s, n);
            o = n;
        }
        st = arena_put(tk, buf, o, &tk->piece_off[i], err);
        tk->piece_len[i] = (uint32_t)o;
        if (o > tk->max_piece)
            tk->max_piece = o;
    }
    free(buf);
    return st;
}

static tdm_status merge_insert(tdm_tokenizer *tk, int32_t l, int32_t r, uint32_t rank, int32_t res)
{
    uint64_t key = ((uint64_t)(uint32_t)l << 32) | (uint32_t)r;
    for (uint32_t i = (uint32_t)hash_pair(key) & tk->mmask;; i = (i + 1) & tk->mmask) {
        if (tk->mkey[i] == key)
            return TDM_OK; /* first (lowest) rank wins, as llama.cpp's emplace */
        if (tk->mkey[i] == UINT64_MAX) {
            tk->mkey[i] = key;
            tk->mrank[i] = rank;
            tk->mres[i] = res;
            return TDM_OK;
        }
    }
}

static tdm_status load_merges(tdm_tokenizer *tk, const tdm_gguf *g, tdm_error *err)
{
    tdm_gguf_vtype et;
    uint64_t n;
    tdm_status st = tdm_gguf_get_arr(g, "tokenizer.ggml.merges", &et, &n, err);
    if (st)
        return st;
    if (et != TDM_GGUF_STRING || n > (1u << 28))
        return tdm_error_set(err, TDM_ERR_FORMAT, "tokenizer.ggml.merges: want strings, have %llu of type %d",
                             (unsigned long long)n, (int)et);
    size_t cap = 1024;
    while (cap < 2 * n + 2)
        cap *= 2;
    tk->mkey = malloc(cap * sizeof *tk->mkey);
    tk->mrank = malloc(cap * sizeof *tk->mrank);
    tk->mres = malloc(cap * sizeof *tk->mres);
    if (!tk->mkey || !tk->mrank || !tk->mres)
        return tdm_error_set(err, TDM_ERR_OOM, "tokenizer: merge hash of %zu slots", cap);
    memset(tk->mkey, 0xff, cap * sizeof *tk->mkey);
    tk->mmask = (uint32_t)(cap - 1);
    char *cat = NULL;
    size_t ccap = 0;
    for (uint64_t i = 0; i < n && !st; i++) {
        const char *s;
        size_t len;
        if ((st = tdm_gguf_arr_str(g, "tokenizer.ggml.merges", i, &s, &len, err)))
            break;
        const char *sp = len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
        if (!sp) {
            st = tdm_error_set(err, TDM_ERR_FORMAT, "tokenizer.ggml.merges[%llu] = '%.*s' has no separating space",
                               (unsigned long long)i, (int)(len > 64 ? 64 : len), s);
            break;
        }
        size_t ln = (size_t)(sp - s), rn = len - ln - 1;
        if (ccap < len) {
            ccap = 2 * len + 64;
            char *p = realloc(cat, ccap);
            if (!p) {
                st = tdm_error_set(err, TDM_ERR_OOM, "tokenizer: merge buffer");
                break;
            }
            cat = p;
        }
        memcpy(cat, s, ln);
        memcpy(cat + ln, sp + 1, rn);
        int32_t l, r, res;
        if ((st = intern(tk, s, ln, &l, err)) || (st = intern(tk, sp + 1, rn, &r, err)) ||
            (st = intern(tk, cat, ln + rn, &res, err)))
            break;
        st = merge_insert(tk, l, r, (uint32_t)i, res);
    }
    free(cat);
    return st;
}

static int cmp_special(const void *a, const void *b, void *arg)
{
    const tdm_tokenizer *tk = arg;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (tk->text_len[x] != tk->text_len[y])
        return tk->text_len[x] > tk->text_len[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

static tdm_status build_specials(tdm_tokenizer *tk, tdm_error *err)
{
    int32_t n = 0;
    for (int32_t i = 0; i < tk->n_vocab; i++) {
        uint8_t t = tk->type[i];
        n += (t == TDM_TOKEN_CONTROL || t == TDM_TOKEN_USER_DEFINED || t == TDM_TOKEN_UNKNOWN);
    }
    tk->specials = malloc(((size_t)n + 1) * sizeof *tk->specials);
    if (!tk->specials)
        return tdm_error_set(err, TDM_ERR_OOM, "tokenizer: special list");
    n = 0;
    for (int32_t i = 0; i < tk->n_vocab; i++) {
        uint8_t t = tk->type[i];
        if (t == TDM_TOKEN_CONTROL || t == TDM_TOKEN_USER_DEFINED || t == TDM_TOKEN_UNKNOWN)
            tk->specials[n++] = i;
    }
    qsort_r(tk->specials, (size_t)n, sizeof *tk->specials, cmp_special, tk);
    tk->n_specials = n;
    return TDM_OK;
}

static tdm_status read_special_id(tdm_tokenizer *tk, const tdm_gguf *g, const char *key, int32_t *out,
                                  tdm_error *err)
{
    *out = -1;
    if (tdm_gguf_find_key(g, key) < 0)
        return TDM_OK;
    int64_t v;
    tdm_status st = tdm_gguf_get_i64(g, key, &v, err);
    if (st)
        return st;
    if (v < 0 || v >= tk->n_vocab)
        tdm_log(TDM_LOG_WARN, "tokenizer: %s = %lld is outside the vocab (%d tokens); ignored", key,
                (long long)v, tk->n_vocab);
    else
        *out = (int32_t)v;
    return TDM_OK;
}

static tdm_status load_specials_meta(tdm_tokenizer *tk, const tdm_gguf *g, tdm_error *err)
{
    int32_t eot, eom, fim_pad, fim_rep, fim_sep, unused;
    tdm_status st;
    if ((st = read_special_id(tk, g, "tokenizer.ggml.bos_token_id", &tk->bos, err)) ||
        (st = read_special_id(tk, g, "tokenizer.ggml.eos_token_id", &tk->eos, err)) ||
        (st = read_special_id(tk, g, "tokenizer.ggml.padding_token_id", &tk->pad, err)) ||
        (st = read_special_id(tk, g, "tokenizer.ggml.eot_token_id", &eot, err)) ||
        (st = read_special_id(tk, g, "tokenizer.ggml.eom_token_id", &eom, err)) ||
        (st = read_special_id(tk, g, "tokenizer.ggml.fim_pad_token_id", &fim_pad, err)) ||
        (st = read_special_id(tk, g, "tokenizer.ggml.fim_rep_token_id", &fim_rep, err)) ||
        (st = read_special_id(tk, g, "tokenizer.ggml.fim_sep_token_id", &fim_sep, err)) ||
        (st = read_special_id(tk, g, "tokenizer.ggml.unknown_token_id", &unused, err)))
        return st;
    const char *bkeys[2] = {"tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token"};
    bool *bvals[2] = {&tk->add_bos, &tk->add_eos};
    for (int i = 0; i < 2; i++)
        if (tdm_gguf_find_key(g, bkeys[i]) >= 0 && (st = tdm_gguf_get_bool(g, bkeys[i], bvals[i], err)))
            return st;
    tk->eog = calloc((size_t)tk->n_vocab, 1);
    if (!tk->eog)
        return tdm_error_set(err, TDM_ERR_OOM, "tokenizer: eog set");
    int32_t ids[] = {tk->eos, eot, eom, fim_pad, fim_rep, fim_sep};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
        if (ids[i] >= 0)
            tk->eog[ids[i]] = 1;
    static const char *const eog_texts[] = {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
        "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>",
        "<end_of_utterance>", "<|fim_pad|>", "<|fim_repo|>", "<|repo_name|>", "<|file_sep|>"};
    for (size_t i = 0; i < sizeof eog_texts / sizeof eog_texts[0]; i++) {
        int32_t x = tk_lookup(tk, eog_texts[i], strlen(eog_texts[i]));
        if (x >= 0 && x < tk->n_vocab)
            tk->eog[x] = 1;
    }
    if (tdm_gguf_find_key(g, "tokenizer.chat_template") >= 0) {
        const char *s;
        size_t n;
        if ((st = tdm_gguf_get_str(g, "tokenizer.chat_template", &s, &n, err)))
            return st;
        if (!(tk->chat_template = malloc(n + 1)))
            return tdm_error_set(err, TDM_ERR_OOM, "tokenizer: chat template");
        memcpy(tk->chat_template, s, n);
        tk->chat_template[n] = '\0';
    }
    return TDM_OK;
}

static bool str_is(const char *s, size_t n, const char *lit)
{
    return n == strlen(lit) && memcmp(s, lit, n) == 0;
}

static tdm_status load_kind(tdm_tokenizer *tk, const tdm_gguf *g, tdm_error *err)
{
    const char *s;
    size_t n;
    tdm_status st = tdm_gguf_get_str(g, "tokenizer.ggml.model", &s, &n, err);
    if (st)
        return st;
    if (!str_is(s, n, "gpt2"))
        return tdm_error_set(err, TDM_ERR_UNSUPPORTED,
                             "tokenizer.ggml.model = '%.*s': only byte-level BPE ('gpt2') is supported",
                             (int)(n > 64 ? 64 : n), s);
    tk->pretok = TDM_PRETOK_GPT2;
    if (tdm_gguf_find_key(g, "tokenizer.ggml.pre") < 0) {
        tdm_log(TDM_LOG_WARN, "tokenizer: no tokenizer.ggml.pre; using the gpt2 pre-tokeniser "
                              "(generation quality may be degraded)");
        return TDM_OK;
    }
    if ((st = tdm_gguf_get_str(g, "tokenizer.ggml.pre", &s, &n, err)))
        return st;
    if (str_is(s, n, "qwen2") || str_is(s, n, "deepseek-r1-qwen") || str_is(s, n, "kormo") ||
        str_is(s, n, "f2llmv2"))
        tk->pretok = TDM_PRETOK_QWEN2;
    else if (str_is(s, n, "qwen35"))
        tk->pretok = TDM_PRETOK_QWEN35;
    else if (!str_is(s, n, "gpt2") && !str_is(s, n, "default"))
        return tdm_error_set(err, TDM_ERR_UNSUPPORTED,
                             "tokenizer.ggml.pre = '%.*s': supported are qwen2, qwen35, gpt2",
                             (int)(n > 64 ? 64 : n), s);
    return TDM_OK;
}

static tdm_status load_all(tdm_tokenizer *tk, const tdm_gguf *g, tdm_error *err)
{
    tdm_status st;
    if ((st = load_kind(tk, g, err)) || (st = load_tokens(tk, g, err)))
        return st;
    for (int b = 0; b < 256; b++) {
        uint8_t u[4];
        size_t n = tdm_utf8_encode(byte_to_cp((uint8_t)b), u);
        if ((st = intern(tk, (const char *)u, n, &tk->byte_xid[b], err)))
            return st;
    }
    if ((st = load_merges(tk, g, err)) || (st = build_pieces(tk, err)) || (st = build_specials(tk, err)) ||
        (st = load_specials_meta(tk, g, err)))
        return st;
    return TDM_OK;
}

tdm_status tdm_tokenizer_load(const tdm_gguf *g, tdm_tokenizer **out, tdm_error *err)
{
    *out = NULL;
    if (!g)
        return tdm_error_set(err, TDM_ERR_INVALID, "tokenizer: no GGUF given");
    tdm_tokenizer *tk = calloc(1, sizeof *tk);
    if (!tk)
        return tdm_error_set(err, TDM_ERR_OOM, "tokenizer: state");
    tk->bos = tk->eos = tk->pad = -1;
    tdm_status st = load_all(tk, g, err);
    if (st) {
        tdm_tokenizer_free(tk);
        return st;
    }
    *out = tk;
    return TDM_OK;
}

tdm_status tdm_tokenizer_open(const char *gguf_path, tdm_tokenizer **out, tdm_error *err)
{
    tdm_gguf *g;
    *out = NULL;
    tdm_status st = tdm_gguf_open(gguf_path, &g, err);
    if (st)
        return st;
    st = tdm_tokenizer_load(g, out, err);
    tdm_gguf_free(g);
    return st;
}

void tdm_tokenizer_free(tdm_tokenizer *tk)
{
    if (!tk)
        return;
    free(tk->arena);
    free(tk->text_off);
    free(tk->text_len);
    free(tk->piece_off);
    free(tk->piece_len);
    free(tk->type);
    free(tk->eog);
    free(tk->vhash);
    free(tk->mkey);
    free(tk->mrank);
    free(tk->mres);
    free(tk->specials);
    free(tk->chat_template);
    free(tk);
}

/* ---- accessors ---- */

int32_t tdm_tokenizer_n_vocab(const tdm_tokenizer *tk) { return tk->n_vocab; }
tdm_pretok tdm_tokenizer_pretok(const tdm_tokenizer *tk) { return tk->pretok; }
int32_t tdm_tokenizer_bos(const tdm_tokenizer *tk) { return tk->bos; }
int32_t tdm_tokenizer_eos(const tdm_tokenizer *tk) { return tk->eos; }
int32_t tdm_tokenizer_pad(const tdm_tokenizer *tk) { return tk->pad; }
bool tdm_tokenizer_add_bos(const tdm_tokenizer *tk) { return tk->add_bos; }
size_t tdm_tokenizer_max_piece_len(const tdm_tokenizer *tk) { return tk->max_piece; }
const char *tdm_tokenizer_chat_template(const tdm_tokenizer *tk) { return tk->chat_template; }

int32_t tdm_tokenizer_find(const tdm_tokenizer *tk, const char *text)
{
    int32_t x = tk_lookup(tk, text, strlen(text));
    return x < tk->n_vocab ? x : -1;
}

bool tdm_tokenizer_is_eog(const tdm_tokenizer *tk, int32_t id)
{
    return id >= 0 && id < tk->n_vocab && tk->eog[id];
}

tdm_token_type tdm_tokenizer_token_type(const tdm_tokenizer *tk, int32_t id)
{
    return (id >= 0 && id < tk->n_vocab) ? (tdm_token_type)tk->type[id] : TDM_TOKEN_UNDEFINED;
}

const char *tdm_tokenizer_token_text(const tdm_tokenizer *tk, int32_t id, size_t *len)
{
    if (id < 0 || id >= tk->n_vocab)
        return NULL;
    size_t n;
    const char *s = tk_text(tk, id, &n);
    if (len)
        *len = n;
    return s;
}

const char *tdm_tokenizer_piece(const tdm_tokenizer *tk, int32_t id, size_t *len)
{
    if (id < 0 || id >= tk->n_vocab)
        return NULL;
    if (len)
        *len = tk->piece_len[id];
    return tk->arena + tk->piece_off[id];
}
