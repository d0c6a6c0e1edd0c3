/* gguf: validating GGUF v2/v3 reader (see gguf.h and ../shared/specs/gguf.md §1).
 *
 * One pass over the header builds the index: the KV table (value offsets, a
 * per-string-array table of element offsets for O(1) access), the tensor
 * table, and two sorted name indexes (keys, tensor names: O(log n) lookup
 * and O(n log n) construction whatever the names, so crafted names cannot
 * slow the open down the way hash collisions could). All of it
 * is allocated at open; accessors never allocate. Every read of the file goes
 * through the cursor below, which checks the bytes remaining first, and all
 * size arithmetic is done in uint64 with explicit overflow checks, so nothing
 * outside [base, base + size) is ever touched.
 *
 * Policy where the spec leaves room:
 * - Nested arrays (element type ARRAY) are PARSED, to a depth of 8, and can
 *   then only be queried for their type/count. ggml rejects them, gguf-py
 *   reads them; parsing lets a file carrying one extra exotic key still load,
 *   and the depth bound keeps the recursion (and stack use) bounded on
 *   hostile input. Deeper nesting is rejected.
 * - BOOL accepts any non-zero byte as true, as ggml does.
 * - Tensors must be aligned, in bounds and non-overlapping; they need not be
 *   contiguous in header order (ggml's extra rule), because nothing here
 *   depends on it.
 * - n_dims 0 is rejected (gguf.h promises 1..4; no writer emits 0); empty
 *   names and names containing NUL bytes (keys and tensors) are rejected.
 * - Only little-endian files: a version whose low 16 bits are 0 is reported
 *   as byte-swapped.
 */
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_NAME 64                     /* GGML_MAX_NAME incl. NUL */
#define MAX_DIMS 4
#define MAX_STRING ((uint64_t)1 << 30)  /* GGUF_MAX_STRING_LENGTH */
#define MAX_ARRAY ((uint64_t)1 << 30)   /* GGUF_MAX_ARRAY_ELEMENTS */
#define MAX_NEST 8
#define HEADER_BYTES 24
#define MIN_KV_BYTES 14     /* key len + 1 key byte + type + 1 value byte */
#define MIN_TINFO_BYTES 33  /* name len + 1 byte + n_dims + one ne + type + offset */

typedef struct kv_ent {
    const char *key;      /* NUL-terminated copy in key_pool */
    uint64_t key_off;     /* into key_pool while parsing */
    tdm_gguf_vtype type;
    tdm_gguf_vtype elem;  /* arrays: element type */
    uint64_t count;       /* arrays: element count */
    uint64_t pos;         /* absolute offset of the value (arrays: of the first element) */
    uint64_t *str_pos;    /* string arrays: [count] absolute offsets of each length prefix */
} kv_ent;

struct tdm_gguf {
    const uint8_t *base;
    uint64_t size;
    bool mapped;
    uint32_t version, alignment;
    uint64_t data_offset, data_end;

    kv_ent *kv;           /* [n_kv] */
    int64_t n_kv, kv_cap;
    char *key_pool;
    uint64_t pool_len, pool_cap;

    tdm_gguf_tensor *t;   /* [n_t] */
    char (*tnames)[MAX_NAME]; /* [n_t] */
    int64_t n_t;

    struct name_ref *kv_ix; /* [n_kv] sorted by name */
    struct name_ref *t_ix;  /* [n_t] sorted by name */
};

/* ---------------------------------------------------------------- small helpers */

static const char *const k_vtype_names[] = {
    "UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32",
    "BOOL", "STRING", "ARRAY", "UINT64", "INT64", "FLOAT64",
};

const char *tdm_gguf_vtype_name(tdm_gguf_vtype t)
{
    return (unsigned)t <= TDM_GGUF_FLOAT64 ? k_vtype_names[t] : "?";
}

size_t tdm_gguf_vtype_size(tdm_gguf_vtype t)
{
    switch (t) {
    case TDM_GGUF_UINT8: case TDM_GGUF_INT8: case TDM_GGUF_BOOL: return 1;
    case TDM_GGUF_UINT16: case TDM_GGUF_INT16: return 2;
    case TDM_GGUF_UINT32: case TDM_GGUF_INT32: case TDM_GGUF_FLOAT32: return 4;
    case TDM_GGUF_UINT64: case TDM_GGUF_INT64: case TDM_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

static uint64_t rd_le(const uint8_t *p, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* Renders up to ~80 bytes of a name for messages, escaping non-printables. */
static const char *shown(const uint8_t *s, uint64_t n, char buf[96])
{
    size_t k = 0;
    uint64_t i = 0;
    for (; i < n && k < 80; i++) {
        uint8_t c = s[i];
        if (c >= 0x20 && c < 0x7f && c != '\'') buf[k++] = (char)c;
        else k += (size_t)snprintf(buf + k, 96 - k, "\\x%02x", c);
    }
    if (i < n) {
        memcpy(buf + k, "...", 3);
        k += 3;
    }
    buf[k] = '\0';
    return buf;
}

/* ---------------------------------------------------------------- cursor */

typedef struct rd {
    const uint8_t *b;
    uint64_t size, pos;
    tdm_error *err;
} rd;

static uint64_t left(const rd *r) { return r->size - r->pos; }

/* "truncated" error for a field of n bytes at the cursor; ctx names the field. */
static tdm_status truncated(rd *r, uint64_t n, const char *ctx)
{
    return tdm_error_set(r->err, TDM_ERR_FORMAT,
                         "%s: truncated file (needs %llu bytes at offset %llu, file has %llu)", ctx,
                         (unsigned long long)n, (unsigned long long)r->pos,
                         (unsigned long long)r->size);
}

static tdm_status get_le(rd *r, unsigned n, uint64_t *v, const char *ctx)
{
    *v = 0;
    if (left(r) < n) return truncated(r, n, ctx);
    *v = rd_le(r->b + r->pos, n);
    r->pos += n;
    return TDM_OK;
}

/* Reads a GGUF string header (u64 length) and checks the bytes are there;
 * on success *pos is the absolute offset of the bytes and the cursor is past them. */
static tdm_status get_str(rd *r, uint64_t *pos, uint64_t *len, const char *ctx)
{
    tdm_status st = get_le(r, 8, len, ctx);
    if (st) return st;
    if (*len > MAX_STRING)
        return tdm_error_set(r->err, TDM_ERR_FORMAT, "%s: string length %llu exceeds the 1 GiB limit",
                             ctx, (unsigned long long)*len);
    if (*len > left(r)) return truncated(r, *len, ctx);
    *pos = r->pos;
    r->pos += *len;
    return TDM_OK;
}

/* Reads the name of item idx ("kv" / "tensor"; what: "key" / "name"): a
 * string that is not empty, shorter than max bytes (0: any) and free of
 * NUL bytes. nb receives it for messages. */
static tdm_status get_name(rd *r, const char *item, int64_t idx, const char *what, uint64_t max, uint64_t *pos,
                           uint64_t *len, char nb[96])
{
    char ctx[64];
    snprintf(ctx, sizeof ctx, "%s %lld %s", item, (long long)idx, what);
    tdm_status st = get_str(r, pos, len, ctx);
    if (st) return st;
    if (*len == 0) return tdm_error_set(r->err, TDM_ERR_FORMAT, "%s %lld: empty %s", item, (long long)idx, what);
    if (max && *len >= max)
        return tdm_error_set(r->err, TDM_ERR_FORMAT, "%s %lld: %s '%s' is %llu bytes (max %llu)", item,
                             (long long)idx, what, shown(r->b + *pos, *len, nb), (unsigned long long)*len,
                             (unsigned long long)max - 1);
    if (memchr(r->b + *pos, 0, (size_t)*len))
        return tdm_error_set(r->err, TDM_ERR_FORMAT, "%s %lld: %s '%s' contains a NUL byte", item,
                             (long long)idx, what, shown(r->b + *pos, *len, nb));
    return TDM_OK;
}

/* ---------------------------------------------------------------- metadata */

static tdm_status skip_value(rd *r, uint32_t t, int depth, const char *ctx);

/* Array header: element type (checked) and count (checked against the limit). */
static tdm_status array_header(rd *r, const char *ctx, uint32_t *elem, uint64_t *count)
{
    uint64_t et;
    tdm_status st = get_le(r, 4, &et, ctx);
    if (!st) st = get_le(r, 8, count, ctx);
    if (st) return st;
    if (et > TDM_GGUF_FLOAT64)
        return tdm_error_set(r->err, TDM_ERR_FORMAT, "%s: unknown array element type %llu", ctx,
                             (unsigned long long)et);
    if (*count > MAX_ARRAY)
        return tdm_error_set(r->err, TDM_ERR_FORMAT, "%s: array count %llu exceeds the limit 2^30",
                             ctx, (unsigned long long)*count);
    *elem = (uint32_t)et;
    return TDM_OK;
}

/* Skips count elements of type elem; depth is the nesting level of the array
 * that holds them (1 for a KV's own array). */
static tdm_status skip_elems(rd *r, uint32_t elem, uint64_t count, int depth, const char *ctx)
{
    uint64_t es = tdm_gguf_vtype_size(elem);
    if (es) {
        if (count > left(r) / es) return truncated(r, count * es, ctx);
        r->pos += count * es;
        return TDM_OK;
    }
    if (elem == TDM_GGUF_ARRAY && depth >= MAX_NEST)
        return tdm_error_set(r->err, TDM_ERR_FORMAT, "%s: arrays nested deeper than %d", ctx, MAX_NEST);
    /* Each string costs >= 8 bytes, each nested array >= 12: checked before looping. */
    uint64_t min_each = elem == TDM_GGUF_STRING ? 8 : 12;
    if (count > left(r) / min_each) return truncated(r, count * min_each, ctx);
    for (uint64_t i = 0; i < count; i++) {
        tdm_status st = skip_value(r, elem, depth + 1, ctx);
        if (st) return st;
    }
    return TDM_OK;
}

static tdm_status skip_value(rd *r, uint32_t t, int depth, const char *ctx)
{
    uint64_t pos, len, count;
    uint32_t elem;
    if (t == TDM_GGUF_STRING) return get_str(r, &pos, &len, ctx);
    if (t == TDM_GGUF_ARRAY) {
        tdm_status st = array_header(r, ctx, &elem, &count);
        return st ? st : skip_elems(r, elem, count, depth, ctx);
    }
    uint64_t n = tdm_gguf_vtype_size(t);
    if (left(r) < n) return truncated(r, n, ctx);
    r->pos += n;
    return TDM_OK;
}

static tdm_status grow_kv(tdm_gguf *g, tdm_error *err)
{
    if (g->n_kv < g->kv_cap) return TDM_OK;
    int64_t cap = g->kv_cap ? g->kv_cap * 2 : 64;
    kv_ent *p = realloc(g->kv, (size_t)cap * sizeof *p);
    if (!p) return tdm_error_set(err, TDM_ERR_OOM, "gguf: out of memory for %lld keys", (long long)cap);
    g->kv = p;
    g->kv_cap = cap;
    return TDM_OK;
}

static tdm_status pool_add(tdm_gguf *g, const uint8_t *s, uint64_t n, uint64_t *off, tdm_error *err)
{
    if (g->pool_len + n + 1 > g->pool_cap) {
        uint64_t cap = g->pool_cap ? g->pool_cap : 4096;
        while (cap < g->pool_len + n + 1) cap *= 2;
        char *p = realloc(g->key_pool, (size_t)cap);
        if (!p) return tdm_error_set(err, TDM_ERR_OOM, "gguf: out of memory for key names");
        g->key_pool = p;
        g->pool_cap = cap;
    }
    memcpy(g->key_pool + g->pool_len, s, (size_t)n);
    g->key_pool[g->pool_len + n] = '\0';
    *off = g->pool_len;
    g->pool_len += n + 1;
    return TDM_OK;
}

/* Value of the KV e (type already set) starting at the cursor. */
static tdm_status parse_value(rd *r, kv_ent *e, const char *ctx)
{
    if (e->type != TDM_GGUF_ARRAY) {
        e->pos = r->pos;
        return skip_value(r, e->type, 0, ctx);
    }
    uint32_t elem;
    tdm_status st = array_header(r, ctx, &elem, &e->count);
    if (st) return st;
    e->elem = (tdm_gguf_vtype)elem;
    e->pos = r->pos;
    if (elem != TDM_GGUF_STRING) return skip_elems(r, elem, e->count, 1, ctx);
    /* String array: remember where each element starts, for O(1) access. */
    if (e->count > left(r) / 8) return truncated(r, e->count * 8, ctx);
    e->str_pos = malloc(e->count ? (size_t)e->count * sizeof *e->str_pos : 1);
    if (!e->str_pos)
        return tdm_error_set(r->err, TDM_ERR_OOM, "%s: out of memory for %llu strings", ctx,
                             (unsigned long long)e->count);
    for (uint64_t i = 0; i < e->count; i++) {
        uint64_t pos, len;
        e->str_pos[i] = r->pos;
        if ((st = get_str(r, &pos, &len, ctx))) return st;
    }
    return TDM_OK;
}

static tdm_status parse_kv(tdm_gguf *g, rd *r, int64_t idx)
{
    char ctx[160], nb[96];
    uint64_t kpos, klen, type;
    tdm_status st = get_name(r, "kv", idx, "key", 0, &kpos, &klen, nb);
    if (st) return st;
    snprintf(ctx, sizeof ctx, "key '%s'", shown(r->b + kpos, klen, nb));
    st = get_le(r, 4, &type, ctx);
    if (st) return st;
    if (type > TDM_GGUF_FLOAT64)
        return tdm_error_set(r->err, TDM_ERR_FORMAT, "%s: unknown value type %llu", ctx,
                             (unsigned long long)type);
    st = grow_kv(g, r->err);
    if (st) return st;
    kv_ent *e = &g->kv[g->n_kv];
    memset(e, 0, sizeof *e);
    e->type = (tdm_gguf_vtype)type;
    g->n_kv++; /* counted now so that free() releases e->str_pos on failure */
    st = pool_add(g, r->b + kpos, klen, &e->key_off, r->err);
    if (st) return st;
    return parse_value(r, e, ctx);
}

typedef struct name_ref {
    const char *name;
    int64_t i;
} name_ref;

static int cmp_ref(const void *a, const void *b)
{
    const name_ref *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->i > y->i) - (x->i < y->i);
}

/* Sorted index of n names; dup_a, dup_b: two entries with the same name, or -1. */
static tdm_status build_index(int64_t n, const char *(*name_of)(const tdm_gguf *, int64_t),
                              const tdm_gguf *g, name_ref **out, int64_t *dup_a, int64_t *dup_b,
                              tdm_error *err)
{
    name_ref *ix = malloc(n ? (size_t)n * sizeof *ix : 1);
    if (!ix) return tdm_error_set(err, TDM_ERR_OOM, "gguf: out of memory for the index");
    *out = ix;
    *dup_a = *dup_b = -1;
    for (int64_t i = 0; i < n; i++) ix[i] = (name_ref){name_of(g, i), i};
    qsort(ix, (size_t)n, sizeof *ix, cmp_ref);
    for (int64_t k = 1; k < n; k++)
        if (strcmp(ix[k - 1].name, ix[k].name) == 0) {
            *dup_a = ix[k - 1].i;
            *dup_b = ix[k].i;
            break;
        }
    return TDM_OK;
}

static int64_t index_find(const name_ref *ix, int64_t n, const char *s)
{
    if (!ix || !s) return -1;
    int64_t lo = 0, hi = n; /* [lo, hi) */
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(ix[mid].name, s);
        if (c == 0) return ix[mid].i;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

static const char *kv_name_of(const tdm_gguf *g, int64_t i) { return g->kv[i].key; }
static const char *t_name_of(const tdm_gguf *g, int64_t i) { return g->tnames[i]; }

static tdm_status parse_alignment(tdm_gguf *g, tdm_error *err)
{
    g->alignment = 32;
    int64_t i = index_find(g->kv_ix, g->n_kv, "general.alignment");
    if (i < 0) return TDM_OK;
    const kv_ent *e = &g->kv[i];
    if (e->type != TDM_GGUF_UINT32)
        return tdm_error_set(err, TDM_ERR_FORMAT, "key 'general.alignment': type %s, must be UINT32",
                             tdm_gguf_vtype_name(e->type));
    uint32_t a = (uint32_t)rd_le(g->base + e->pos, 4);
    if (a == 0 || (a & (a - 1)))
        return tdm_error_set(err, TDM_ERR_FORMAT,
                             "key 'general.alignment': value %u is not a power of two", a);
    g->alignment = a;
    return TDM_OK;
}

/* ---------------------------------------------------------------- tensors */

static tdm_status parse_tensor_info(tdm_gguf *g, rd *r, int64_t idx)
{
    char ctx[160], nb[96];
    uint64_t npos, nlen, v;
    tdm_status st = get_name(r, "tensor", idx, "name", MAX_NAME, &npos, &nlen, nb);
    if (st) return st;
    memcpy(g->tnames[idx], r->b + npos, (size_t)nlen);
    g->tnames[idx][nlen] = '\0';
    tdm_gguf_tensor *t = &g->t[idx];
    snprintf(ctx, sizeof ctx, "tensor '%s'", shown(r->b + npos, nlen, nb));
    if ((st = get_le(r, 4, &v, ctx))) return st;
    if (v < 1 || v > MAX_DIMS)
        return tdm_error_set(r->err, TDM_ERR_FORMAT, "%s: n_dims %llu (must be 1..4)", ctx,
                             (unsigned long long)v);
    t->n_dims = (uint32_t)v;
    uint64_t nel = 1;
    for (uint32_t d = 0; d < MAX_DIMS; d++) {
        uint64_t ne = 1;
        if (d < t->n_dims && (st = get_le(r, 8, &ne, ctx))) return st;
        if (ne > (uint64_t)INT64_MAX)
            return tdm_error_set(r->err, TDM_ERR_FORMAT, "%s: ne[%u] = %lld is negative", ctx, d,
                                 (long long)ne);
        t->ne[d] = (int64_t)ne;
        if (ne && nel > (uint64_t)INT64_MAX / ne)
            return tdm_error_set(r->err, TDM_ERR_FORMAT,
                                 "%s: element count overflows int64 (ne[%u] = %llu)", ctx, d,
                                 (unsigned long long)ne);
        nel *= ne;
    }
    if ((st = get_le(r, 4, &v, ctx))) return st;
    const tdm_qtype_info *qi = v <= UINT32_MAX ? tdm_qtype_get((uint32_t)v) : NULL;
    if (!qi)
        return tdm_error_set(r->err, TDM_ERR_FORMAT, "%s: unknown or removed tensor type %llu", ctx,
                             (unsigned long long)v);
    t->type = (tdm_qtype)v;
    if ((uint64_t)t->ne[0] % qi->block)
        return tdm_error_set(r->err, TDM_ERR_FORMAT,
                             "%s: ne[0] = %lld is not a multiple of the %s block size %u", ctx,
                             (long long)t->ne[0], qi->name, qi->block);
    uint64_t blocks = nel / qi->block;
    if (blocks > (UINT64_MAX >> 1) / qi->type_size)
        return tdm_error_set(r->err, TDM_ERR_FORMAT, "%s: byte size overflows", ctx);
    t->nbytes = blocks * qi->type_size;
    if ((st = get_le(r, 8, &t->offset, ctx))) return st;
    if (t->offset % g->alignment)
        return tdm_error_set(r->err, TDM_ERR_FORMAT, "%s: offset %llu not a multiple of alignment %u",
                             ctx, (unsigned long long)t->offset, g->alignment);
    return TDM_OK;
}

typedef struct span { uint64_t off, n; int64_t i; } span;

static int cmp_span(const void *a, const void *b)
{
    const span *x = a, *y = b;
    if (x->off != y->off) return x->off < y->off ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}

/* Places every tensor: bounds (overflow-safe) and no overlap. */
static tdm_status place_tensors(tdm_gguf *g, uint32_t flags, tdm_error *err)
{
    uint64_t room = g->size >= g->data_offset ? g->size - g->data_offset : 0;
    g->data_end = g->data_offset;
    for (int64_t i = 0; i < g->n_t; i++) {
        tdm_gguf_tensor *t = &g->t[i];
        if (t->offset > (UINT64_MAX >> 1) || t->nbytes > (UINT64_MAX >> 1) - t->offset ||
            t->offset + t->nbytes > (UINT64_MAX >> 1) - g->data_offset)
            return tdm_error_set(err, TDM_ERR_FORMAT, "tensor '%s': offset %llu + size %llu overflows",
                                 t->name, (unsigned long long)t->offset, (unsigned long long)t->nbytes);
        uint64_t end = t->offset + t->nbytes;
        if (g->data_offset + end > g->data_end) g->data_end = g->data_offset + end;
        if (end <= room && g->data_offset <= g->size) {
            t->data = g->base + g->data_offset + t->offset;
        } else if (flags & TDM_GGUF_OPEN_PARTIAL) {
            t->data = NULL;
        } else {
            return tdm_error_set(err, TDM_ERR_FORMAT,
                                 "tensor '%s': data [%llu, %llu) extends past the end of the file "
                                 "(%llu bytes; data section at %llu)",
                                 t->name, (unsigned long long)(g->data_offset + t->offset),
                                 (unsigned long long)(g->data_offset + end),
                                 (unsigned long long)g->size, (unsigned long long)g->data_offset);
        }
    }
    if (g->n_t < 2) return TDM_OK;
    span *sp = malloc((size_t)g->n_t * sizeof *sp);
    if (!sp) return tdm_error_set(err, TDM_ERR_OOM, "gguf: out of memory");
    int64_t n = 0;
    for (int64_t i = 0; i < g->n_t; i++)
        if (g->t[i].nbytes) sp[n++] = (span){g->t[i].offset, g->t[i].nbytes, i};
    qsort(sp, (size_t)n, sizeof *sp, cmp_span);
    tdm_status st = TDM_OK;
    for (int64_t k = 1; k < n && !st; k++)
        if (sp[k - 1].off + sp[k - 1].n > sp[k].off)
            st = tdm_error_set(err, TDM_ERR_FORMAT,
                               "tensor '%s': offset %llu overlaps tensor '%s' [%llu, %llu)",
                               g->t[sp[k].i].name, (unsigned long long)sp[k].off,
                               g->t[sp[k - 1].i].name, (unsigned long long)sp[k - 1].off,
                               (unsigned long long)(sp[k - 1].off + sp[k - 1].n));
    free(sp);
    return st;
}

/* ---------------------------------------------------------------- parse / open */

static tdm_status grow_tensors(tdm_gguf *g, int64_t *cap, tdm_error *err)
{
    int64_t n = *cap ? *cap * 2 : 256;
    tdm_gguf_tensor *t = realloc(g->t, (size_t)n * sizeof *t);
    if (t) g->t = t;
    char(*names)[MAX_NAME] = realloc(g->tnames, (size_t)n * sizeof *names);
    if (names) g->tnames = names;
    if (!t || !names)
        return tdm_error_set(err, TDM_ERR_OOM, "gguf: out of memory for %lld tensors", (long long)n);
    *cap = n;
    return TDM_OK;
}

static tdm_status parse_header(tdm_gguf *g, rd *r, uint64_t *n_t, uint64_t *n_kv)
{
    uint64_t v;
    if (g->size == 0) return tdm_error_set(r->err, TDM_ERR_FORMAT, "empty file (0 bytes): not a GGUF file");
    if (g->size < 4 || memcmp(g->base, "GGUF", 4) != 0) {
        char nb[96];
        return tdm_error_set(r->err, TDM_ERR_FORMAT, "magic: '%s' is not 'GGUF'",
                             shown(g->base, g->size < 4 ? g->size : 4, nb));
    }
    r->pos = 4;
    tdm_status st = get_le(r, 4, &v, "version");
    if (st) return st;
    if (v != 0 && (v & 0xFFFF) == 0)
        return tdm_error_set(r->err, TDM_ERR_FORMAT,
                             "version 0x%08llx looks byte-swapped: big-endian GGUF files are not supported",
                             (unsigned long long)v);
    if (v < 2 || v > 3)
        return tdm_error_set(r->err, TDM_ERR_FORMAT, "version %llu not supported (2 or 3)",
                             (unsigned long long)v);
    g->version = (uint32_t)v;
    if ((st = get_le(r, 8, n_t, "tensor_count")) || (st = get_le(r, 8, n_kv, "metadata_kv_count")))
        return st;
    uint64_t room = g->size - HEADER_BYTES;
    if (*n_t > (uint64_t)INT64_MAX)
        return tdm_error_set(r->err, TDM_ERR_FORMAT, "tensor_count %lld is negative", (long long)*n_t);
    if (*n_kv > (uint64_t)INT64_MAX)
        return tdm_error_set(r->err, TDM_ERR_FORMAT, "metadata_kv_count %lld is negative", (long long)*n_kv);
    if (*n_t > room / MIN_TINFO_BYTES)
        return tdm_error_set(r->err, TDM_ERR_FORMAT,
                             "tensor_count %llu exceeds what a %llu-byte file can hold",
                             (unsigned long long)*n_t, (unsigned long long)g->size);
    if (*n_kv > room / MIN_KV_BYTES)
        return tdm_error_set(r->err, TDM_ERR_FORMAT,
                             "metadata_kv_count %llu exceeds what a %llu-byte file can hold",
                             (unsigned long long)*n_kv, (unsigned long long)g->size);
    return TDM_OK;
}

static tdm_status parse(tdm_gguf *g, uint32_t flags, tdm_error *err)
{
    rd r = {g->base, g->size, 0, err};
    uint64_t n_t = 0, n_kv = 0;
    int64_t a, b;
    tdm_status st = parse_header(g, &r, &n_t, &n_kv);
    for (uint64_t i = 0; !st && i < n_kv; i++) st = parse_kv(g, &r, (int64_t)i);
    if (st) return st;
    for (int64_t i = 0; i < g->n_kv; i++) g->kv[i].key = g->key_pool + g->kv[i].key_off;
    if ((st = build_index(g->n_kv, kv_name_of, g, &g->kv_ix, &a, &b, err))) return st;
    if (a >= 0)
        return tdm_error_set(err, TDM_ERR_FORMAT, "duplicate key '%s' (kv %lld and %lld)",
                             g->kv[b].key, (long long)a, (long long)b);
    if ((st = parse_alignment(g, err))) return st;

    /* Grown as infos are parsed, so memory follows what the file really
     * holds, not what its (possibly hostile) tensor_count claims. */
    int64_t cap = 0;
    for (uint64_t i = 0; !st && i < n_t; i++) {
        if ((int64_t)i == cap && (st = grow_tensors(g, &cap, err))) return st;
        memset(&g->t[i], 0, sizeof g->t[i]);
        st = parse_tensor_info(g, &r, (int64_t)i);
        g->n_t = (int64_t)i + 1;
    }
    if (st) return st;
    for (int64_t i = 0; i < g->n_t; i++) g->t[i].name = g->tnames[i];
    if ((st = build_index(g->n_t, t_name_of, g, &g->t_ix, &a, &b, err))) return st;
    if (a >= 0)
        return tdm_error_set(err, TDM_ERR_FORMAT, "duplicate tensor name '%s' (tensors %lld and %lld)",
                             g->tnames[b], (long long)a, (long long)b);

    /* r.pos <= size < 2^63 and alignment <= 2^31: no overflow. */
    uint64_t aligned = (r.pos + g->alignment - 1) / g->alignment * g->alignment;
    if (n_t == 0) {
        g->data_offset = aligned <= g->size ? aligned : r.pos; /* ggml writes no padding then */
    } else {
        if (aligned > g->size && !(flags & TDM_GGUF_OPEN_PARTIAL))
            return tdm_error_set(err, TDM_ERR_FORMAT,
                                 "data section: starts at %llu (tensor infos end at %llu, alignment %u), "
                                 "past the end of the file (%llu bytes)",
                                 (unsigned long long)aligned, (unsigned long long)r.pos, g->alignment,
                                 (unsigned long long)g->size);
        g->data_offset = aligned;
    }
    return place_tensors(g, flags, err);
}

void tdm_gguf_free(tdm_gguf *g)
{
    if (!g) return;
    for (int64_t i = 0; i < g->n_kv; i++) free(g->kv[i].str_pos);
    free(g->kv);
    free(g->key_pool);
    free(g->t);
    free(g->tnames);
    free(g->kv_ix);
    free(g->t_ix);
    if (g->mapped && g->size) munmap((void *)g->base, (size_t)g->size);
    free(g);
}

static tdm_status open_buffer(const void *data, uint64_t size, bool mapped, uint32_t flags,
                              tdm_gguf **out, tdm_error *err)
{
    tdm_gguf *g = calloc(1, sizeof *g);
    if (!g) {
        if (mapped && size) munmap((void *)data, (size_t)size);
        return tdm_error_set(err, TDM_ERR_OOM, "gguf: out of memory");
    }
    g->base = data;
    g->size = size;
    g->mapped = mapped;
    g->alignment = 32;
    tdm_status st = parse(g, flags, err);
    if (st) {
        tdm_gguf_free(g);
        return st;
    }
    *out = g;
    return TDM_OK;
}

tdm_status tdm_gguf_open_memory_ex(const void *data, size_t size, uint32_t flags, tdm_gguf **out,
                                   tdm_error *err)
{
    if (!out) return tdm_error_set(err, TDM_ERR_INVALID, "gguf: NULL out");
    *out = NULL;
    if (!data && size) return tdm_error_set(err, TDM_ERR_INVALID, "gguf: NULL buffer of %zu bytes", size);
    static const uint8_t empty[1];
    return open_buffer(data ? data : empty, size, false, flags, out, err);
}

tdm_status tdm_gguf_open_memory(const void *data, size_t size, tdm_gguf **out, tdm_error *err)
{
    return tdm_gguf_open_memory_ex(data, size, 0, out, err);
}

tdm_status tdm_gguf_open_ex(const char *path, uint32_t flags, tdm_gguf **out, tdm_error *err)
{
    if (!out) return tdm_error_set(err, TDM_ERR_INVALID, "gguf: NULL out");
    *out = NULL;
    if (!path) return tdm_error_set(err, TDM_ERR_INVALID, "gguf: NULL path");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return tdm_error_set(err, TDM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        int e = errno;
        close(fd);
        return tdm_error_set(err, TDM_ERR_IO, "%s: not a regular file%s%s", path, e ? ": " : "",
                             e ? strerror(e) : "");
    }
    uint64_t size = (uint64_t)sb.st_size;
    void *map = NULL;
    if (size > 0) {
        map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            close(fd);
            return tdm_error_set(err, TDM_ERR_IO, "%s: mmap of %llu bytes failed: %s", path,
                                 (unsigned long long)size, strerror(e));
        }
    }
    close(fd);
    static const uint8_t empty[1];
    tdm_status st = open_buffer(map ? map : empty, size, map != NULL, flags, out, err);
    if (st) tdm_error_wrap(err, "%s", path);
    return st;
}

tdm_status tdm_gguf_open(const char *path, tdm_gguf **out, tdm_error *err)
{
    return tdm_gguf_open_ex(path, 0, out, err);
}

/* ---------------------------------------------------------------- accessors */

uint32_t tdm_gguf_version(const tdm_gguf *g) { return g ? g->version : 0; }
uint64_t tdm_gguf_file_size(const tdm_gguf *g) { return g ? g->size : 0; }
uint64_t tdm_gguf_data_offset(const tdm_gguf *g) { return g ? g->data_offset : 0; }
uint32_t tdm_gguf_alignment(const tdm_gguf *g) { return g ? g->alignment : 0; }
const void *tdm_gguf_base(const tdm_gguf *g) { return g ? g->base : NULL; }
uint64_t tdm_gguf_data_end(const tdm_gguf *g) { return g ? g->data_end : 0; }
bool tdm_gguf_complete(const tdm_gguf *g) { return g && g->data_end <= g->size; }

int64_t tdm_gguf_kv_count(const tdm_gguf *g) { return g ? g->n_kv : 0; }

int64_t tdm_gguf_find_key(const tdm_gguf *g, const char *key)
{
    return g ? index_find(g->kv_ix, g->n_kv, key) : -1;
}

const char *tdm_gguf_kv_key(const tdm_gguf *g, int64_t i)
{
    return g && i >= 0 && i < g->n_kv ? g->kv[i].key : NULL;
}

tdm_gguf_vtype tdm_gguf_kv_type(const tdm_gguf *g, int64_t i)
{
    return g && i >= 0 && i < g->n_kv ? g->kv[i].type : (tdm_gguf_vtype)-1;
}

static tdm_status lookup(const tdm_gguf *g, const char *key, const kv_ent **e, tdm_error *err)
{
    if (!g || !key) return tdm_error_set(err, TDM_ERR_INVALID, "gguf: NULL argument");
    int64_t i = tdm_gguf_find_key(g, key);
    if (i < 0) return tdm_error_set(err, TDM_ERR_FORMAT, "key '%s' missing", key);
    *e = &g->kv[i];
    return TDM_OK;
}

/* An integer of value type t at p as (negative?, value): signed values in s,
 * non-negative ones also in u. false when t is not an integer type. */
static bool read_int(uint32_t t, const uint8_t *p, bool *neg, uint64_t *u, int64_t *s)
{
    uint64_t n = tdm_gguf_vtype_size(t), raw = rd_le(p, (unsigned)n);
    switch (t) {
    case TDM_GGUF_UINT8: case TDM_GGUF_UINT16: case TDM_GGUF_UINT32: case TDM_GGUF_UINT64:
        *neg = false; *u = raw; *s = raw > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)raw;
        return true;
    case TDM_GGUF_INT8: *s = (int8_t)raw; break;
    case TDM_GGUF_INT16: *s = (int16_t)raw; break;
    case TDM_GGUF_INT32: *s = (int32_t)raw; break;
    case TDM_GGUF_INT64: *s = (int64_t)raw; break;
    default: return false;
    }
    *neg = *s < 0;
    *u = *neg ? 0 : (uint64_t)*s;
    return true;
}

/* Reads the integer KV at key, checked against [lo..hi] (as int64 for signed
 * bounds, as uint64 for the upper one). */
static tdm_status get_int(const tdm_gguf *g, const char *key, bool allow_neg, uint64_t max,
                          const char *what, uint64_t *u, int64_t *s, tdm_error *err)
{
    const kv_ent *e;
    tdm_status st = lookup(g, key, &e, err);
    if (st) return st;
    bool neg;
    if (!read_int(e->type, g->base + e->pos, &neg, u, s))
        return tdm_error_set(err, TDM_ERR_FORMAT, "key '%s': type %s, expected an integer", key,
                             tdm_gguf_vtype_name(e->type));
    if ((neg && !allow_neg) || (!neg && *u > max)) {
        if (neg)
            return tdm_error_set(err, TDM_ERR_FORMAT, "key '%s': value %lld does not fit %s", key,
                                 (long long)*s, what);
        return tdm_error_set(err, TDM_ERR_FORMAT, "key '%s': value %llu does not fit %s", key,
                             (unsigned long long)*u, what);
    }
    return TDM_OK;
}

tdm_status tdm_gguf_get_u32(const tdm_gguf *g, const char *key, uint32_t *out, tdm_error *err)
{
    uint64_t u;
    int64_t s;
    tdm_status st = get_int(g, key, false, UINT32_MAX, "uint32", &u, &s, err);
    if (!st) *out = (uint32_t)u;
    return st;
}

tdm_status tdm_gguf_get_u64(const tdm_gguf *g, const char *key, uint64_t *out, tdm_error *err)
{
    uint64_t u;
    int64_t s;
    tdm_status st = get_int(g, key, false, UINT64_MAX, "uint64", &u, &s, err);
    if (!st) *out = u;
    return st;
}

tdm_status tdm_gguf_get_i64(const tdm_gguf *g, const char *key, int64_t *out, tdm_error *err)
{
    uint64_t u;
    int64_t s;
    tdm_status st = get_int(g, key, true, (uint64_t)INT64_MAX, "int64", &u, &s, err);
    if (!st) *out = s;
    return st;
}

static bool read_float(uint32_t t, const uint8_t *p, double *out)
{
    if (t == TDM_GGUF_FLOAT32) {
        uint32_t b = (uint32_t)rd_le(p, 4);
        float f;
        memcpy(&f, &b, 4);
        *out = f;
        return true;
    }
    if (t == TDM_GGUF_FLOAT64) {
        uint64_t b = rd_le(p, 8);
        memcpy(out, &b, 8);
        return true;
    }
    return false;
}

tdm_status tdm_gguf_get_f32(const tdm_gguf *g, const char *key, float *out, tdm_error *err)
{
    const kv_ent *e;
    tdm_status st = lookup(g, key, &e, err);
    if (st) return st;
    double d;
    if (!read_float(e->type, g->base + e->pos, &d))
        return tdm_error_set(err, TDM_ERR_FORMAT, "key '%s': type %s, expected FLOAT32 or FLOAT64",
                             key, tdm_gguf_vtype_name(e->type));
    if (isfinite(d) && fabs(d) > FLT_MAX) /* the conversion would be undefined behaviour */
        return tdm_error_set(err, TDM_ERR_FORMAT, "key '%s': value %g does not fit float32", key, d);
    *out = (float)d;
    return TDM_OK;
}

tdm_status tdm_gguf_get_f64(const tdm_gguf *g, const char *key, double *out, tdm_error *err)
{
    const kv_ent *e;
    tdm_status st = lookup(g, key, &e, err);
    if (st) return st;
    if (!read_float(e->type, g->base + e->pos, out))
        return tdm_error_set(err, TDM_ERR_FORMAT, "key '%s': type %s, expected FLOAT32 or FLOAT64",
                             key, tdm_gguf_vtype_name(e->type));
    return TDM_OK;
}

tdm_status tdm_gguf_get_bool(const tdm_gguf *g, const char *key, bool *out, tdm_error *err)
{
    const kv_ent *e;
    tdm_status st = lookup(g, key, &e, err);
    if (st) return st;
    if (e->type != TDM_GGUF_BOOL)
        return tdm_error_set(err, TDM_ERR_FORMAT, "key '%s': type %s, expected BOOL", key,
                             tdm_gguf_vtype_name(e->type));
    *out = g->base[e->pos] != 0;
    return TDM_OK;
}

tdm_status tdm_gguf_get_str(const tdm_gguf *g, const char *key, const char **s, size_t *len,
                            tdm_error *err)
{
    const kv_ent *e;
    tdm_status st = lookup(g, key, &e, err);
    if (st) return st;
    if (e->type != TDM_GGUF_STRING)
        return tdm_error_set(err, TDM_ERR_FORMAT, "key '%s': type %s, expected STRING", key,
                             tdm_gguf_vtype_name(e->type));
    *len = (size_t)rd_le(g->base + e->pos, 8);
    *s = (const char *)g->base + e->pos + 8;
    return TDM_OK;
}

tdm_status tdm_gguf_get_arr(const tdm_gguf *g, const char *key, tdm_gguf_vtype *elem_type,
                            uint64_t *count, tdm_error *err)
{
    const kv_ent *e;
    tdm_status st = lookup(g, key, &e, err);
    if (st) return st;
    if (e->type != TDM_GGUF_ARRAY)
        return tdm_error_set(err, TDM_ERR_FORMAT, "key '%s': type %s, expected ARRAY", key,
                             tdm_gguf_vtype_name(e->type));
    if (elem_type) *elem_type = e->elem;
    if (count) *count = e->count;
    return TDM_OK;
}

/* The array at key with element i in range. */
static tdm_status arr_elem(const tdm_gguf *g, const char *key, uint64_t i, const kv_ent **e,
                           tdm_error *err)
{
    tdm_status st = tdm_gguf_get_arr(g, key, NULL, NULL, err);
    if (st) return st;
    *e = &g->kv[tdm_gguf_find_key(g, key)];
    if (i >= (*e)->count)
        return tdm_error_set(err, TDM_ERR_INVALID, "key '%s': index %llu out of range (%llu elements)",
                             key, (unsigned long long)i, (unsigned long long)(*e)->count);
    return TDM_OK;
}

tdm_status tdm_gguf_arr_str(const tdm_gguf *g, const char *key, uint64_t i, const char **s,
                            size_t *len, tdm_error *err)
{
    const kv_ent *e;
    tdm_status st = arr_elem(g, key, i, &e, err);
    if (st) return st;
    if (e->elem != TDM_GGUF_STRING)
        return tdm_error_set(err, TDM_ERR_FORMAT, "key '%s': array of %s, expected STRING", key,
                             tdm_gguf_vtype_name(e->elem));
    uint64_t p = e->str_pos[i];
    *len = (size_t)rd_le(g->base + p, 8);
    *s = (const char *)g->base + p + 8;
    return TDM_OK;
}

tdm_status tdm_gguf_arr_int(const tdm_gguf *g, const char *key, uint64_t i, int64_t *out,
                            tdm_error *err)
{
    const kv_ent *e;
    tdm_status st = arr_elem(g, key, i, &e, err);
    if (st) return st;
    const uint8_t *p = g->base + e->pos + i * tdm_gguf_vtype_size(e->elem);
    bool neg;
    uint64_t u;
    int64_t s;
    if (e->elem == TDM_GGUF_BOOL) {
        *out = *p != 0;
        return TDM_OK;
    }
    if (!read_int(e->elem, p, &neg, &u, &s))
        return tdm_error_set(err, TDM_ERR_FORMAT, "key '%s': array of %s, expected integers", key,
                             tdm_gguf_vtype_name(e->elem));
    if (!neg && u > (uint64_t)INT64_MAX)
        return tdm_error_set(err, TDM_ERR_FORMAT, "key '%s'[%llu]: value %llu does not fit int64",
                             key, (unsigned long long)i, (unsigned long long)u);
    *out = s;
    return TDM_OK;
}

tdm_status tdm_gguf_arr_float(const tdm_gguf *g, const char *key, uint64_t i, double *out,
                              tdm_error *err)
{
    const kv_ent *e;
    tdm_status st = arr_elem(g, key, i, &e, err);
    if (st) return st;
    if (!read_float(e->elem, g->base + e->pos + i * tdm_gguf_vtype_size(e->elem), out))
        return tdm_error_set(err, TDM_ERR_FORMAT, "key '%s': array of %s, expected FLOAT32 or FLOAT64",
                             key, tdm_gguf_vtype_name(e->elem));
    return TDM_OK;
}

int64_t tdm_gguf_tensor_count(const tdm_gguf *g) { return g ? g->n_t : 0; }

const tdm_gguf_tensor *tdm_gguf_tensor_at(const tdm_gguf *g, int64_t i)
{
    return g && i >= 0 && i < g->n_t ? &g->t[i] : NULL;
}

const tdm_gguf_tensor *tdm_gguf_find_tensor(const tdm_gguf *g, const char *name)
{
    int64_t i = g ? index_find(g->t_ix, g->n_t, name) : -1;
    return i >= 0 ? &g->t[i] : NULL;
}

/* ---------------------------------------------------------------- content check */

/* Byte offsets of the fp16 scales in one block (spec gguf.md §2.4). */
static const struct { uint8_t n, off[2]; } k_scales[TDM_Q_COUNT] = {
    [TDM_Q_Q4_0] = {1, {0}}, [TDM_Q_Q4_1] = {2, {0, 2}}, [TDM_Q_Q5_0] = {1, {0}},
    [TDM_Q_Q5_1] = {2, {0, 2}}, [TDM_Q_Q8_0] = {1, {0}}, [TDM_Q_Q8_1] = {2, {0, 2}},
    [TDM_Q_Q2_K] = {2, {80, 82}}, [TDM_Q_Q3_K] = {1, {108}}, [TDM_Q_Q4_K] = {2, {0, 2}},
    [TDM_Q_Q5_K] = {2, {0, 2}}, [TDM_Q_Q6_K] = {1, {208}}, [TDM_Q_IQ2_XXS] = {1, {0}},
    [TDM_Q_IQ2_XS] = {1, {0}}, [TDM_Q_IQ3_XXS] = {1, {0}}, [TDM_Q_IQ1_S] = {1, {0}},
    [TDM_Q_IQ4_NL] = {1, {0}}, [TDM_Q_IQ3_S] = {1, {0}}, [TDM_Q_IQ2_S] = {1, {0}},
    [TDM_Q_IQ4_XS] = {1, {0}}, [TDM_Q_TQ1_0] = {1, {52}}, [TDM_Q_TQ2_0] = {1, {64}},
    [TDM_Q_Q1_0] = {1, {0}}, [TDM_Q_Q2_0] = {1, {0}},
};

static bool f16_finite(uint16_t h) { return (h & 0x7c00) != 0x7c00; }
static bool bf16_finite(uint16_t h) { return (h & 0x7f80) != 0x7f80; }
static bool f32_finite(uint32_t b) { return (b & 0x7f800000u) != 0x7f800000u; }

tdm_status tdm_gguf_check_tensor_data(const tdm_gguf_tensor *t, tdm_error *err)
{
    if (!t) return tdm_error_set(err, TDM_ERR_INVALID, "gguf: NULL tensor");
    if (!t->data && t->nbytes)
        return tdm_error_set(err, TDM_ERR_FORMAT, "tensor '%s': data missing (file incomplete)", t->name);
    const uint8_t *p = t->data;
    const tdm_qtype_info *q = tdm_qtype_get(t->type);
    uint64_t n = q ? t->nbytes / q->type_size : 0; /* blocks (elements for plain types) */
    for (uint64_t i = 0; i < n; i++) {
        const uint8_t *b = p + i * q->type_size;
        bool ok = true;
        unsigned bad_off = 0;
        switch (t->type) {
        case TDM_Q_F32: ok = f32_finite((uint32_t)rd_le(b, 4)); break;
        case TDM_Q_F16: ok = f16_finite((uint16_t)rd_le(b, 2)); break;
        case TDM_Q_BF16: ok = bf16_finite((uint16_t)rd_le(b, 2)); break;
        case TDM_Q_Q8_K: ok = f32_finite((uint32_t)rd_le(b, 4)); break;
        case TDM_Q_MXFP4: ok = b[0] != 0xff; break;
        default:
            for (unsigned k = 0; k < k_scales[t->type].n && ok; k++) {
                bad_off = k_scales[t->type].off[k];
                ok = f16_finite((uint16_t)rd_le(b + bad_off, 2));
            }
        }
        if (ok) continue;
        if (q->block == 1)
            return tdm_error_set(err, TDM_ERR_FORMAT, "tensor '%s': element %llu is not finite",
                                 t->name, (unsigned long long)i);
        return tdm_error_set(err, TDM_ERR_FORMAT,
                             "tensor '%s': block %llu has a non-finite %s scale (byte %u of the block)",
                             t->name, (unsigned long long)i, q->name, bad_off);
    }
    return TDM_OK;
}
