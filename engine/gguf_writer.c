/* gguf_writer: see gguf_writer.h. The KV section is encoded into one growing
 * byte buffer at add time; tensor infos are encoded when the header is
 * written, so the layout numbers are always current. */
#include "gguf_writer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_NAME 64   /* GGML_MAX_NAME, incl. the NUL */
#define MAX_DIMS 4

typedef struct wtensor {
    char name[MAX_NAME];
    tdm_qtype type;
    uint32_t n_dims;
    int64_t ne[MAX_DIMS];
    uint64_t offset; /* from the data section start */
    uint64_t nbytes;
    const void *data;
    tdm_gguf_fill_fn fill;
    void *user;
} wtensor;

typedef enum sink_kind { SINK_NONE, SINK_FILE, SINK_MEM } sink_kind;

struct tdm_gguf_writer {
    uint32_t version;
    uint32_t alignment;
    size_t align_payload_off; /* where general.alignment's value sits in kv; SIZE_MAX if absent */
    bool in_set_alignment;    /* only set_alignment may add general.alignment */

    uint8_t *kv;  /* encoded KV pairs */
    size_t kv_len, kv_cap;
    int64_t n_kv;
    char **keys;  /* [n_kv] copies, for the duplicate check */
    int64_t keys_cap;

    wtensor *t;   /* [n_t] */
    int64_t n_t, t_cap;
    uint64_t data_size; /* sum of padded tensor sizes */

    /* output state */
    bool started, finished;
    sink_kind sink;
    FILE *f;
    uint8_t *mem; size_t mem_pos, mem_size;
    int64_t cur;        /* tensor being streamed */
    uint64_t cur_done;  /* its bytes written so far */
};

static const uint8_t zeros64[64];

/* ---------------------------------------------------------------- helpers */

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

static bool kv_reserve(tdm_gguf_writer *w, size_t extra, tdm_error *err)
{
    if (extra > SIZE_MAX / 2 - w->kv_len) {
        tdm_error_set(err, TDM_ERR_OOM, "gguf writer: metadata too large");
        return false;
    }
    size_t need = w->kv_len + extra;
    if (need <= w->kv_cap) return true;
    size_t cap = w->kv_cap ? w->kv_cap : 4096;
    while (cap < need) cap *= 2;
    uint8_t *p = realloc(w->kv, cap);
    if (!p) {
        tdm_error_set(err, TDM_ERR_OOM, "gguf writer: out of memory (%zu bytes of metadata)", cap);
        return false;
    }
    w->kv = p;
    w->kv_cap = cap;
    return true;
}

static void put_le(uint8_t *dst, uint64_t v, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = (uint8_t)(v >> (8 * i));
}

/* Appends without checking capacity (callers reserve first). */
static void kv_put(tdm_gguf_writer *w, const void *p, size_t n)
{
    if (n) memcpy(w->kv + w->kv_len, p, n);
    w->kv_len += n;
}

static void kv_put_le(tdm_gguf_writer *w, uint64_t v, size_t n)
{
    put_le(w->kv + w->kv_len, v, n);
    w->kv_len += n;
}

static tdm_status check_writable(const tdm_gguf_writer *w, tdm_error *err)
{
    if (!w) return tdm_error_set(err, TDM_ERR_INVALID, "gguf writer: NULL writer");
    if (w->started)
        return tdm_error_set(err, TDM_ERR_INVALID, "gguf writer: cannot add after writing started");
    return TDM_OK;
}

/* Checks the key and appends "key, type" to the KV buffer; the caller then
 * appends the payload (extra bytes already reserved). */
static tdm_status kv_begin(tdm_gguf_writer *w, const char *key, tdm_gguf_vtype type, size_t payload,
                           tdm_error *err)
{
    tdm_status st = check_writable(w, err);
    if (st) return st;
    if (!key || !key[0]) return tdm_error_set(err, TDM_ERR_INVALID, "gguf writer: empty key");
    if (!w->in_set_alignment && strcmp(key, "general.alignment") == 0)
        return tdm_error_set(err, TDM_ERR_INVALID,
                             "gguf writer: general.alignment is set with tdm_gguf_writer_set_alignment");
    for (int64_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->keys[i], key) == 0)
            return tdm_error_set(err, TDM_ERR_INVALID, "gguf writer: duplicate key '%s'", key);
    size_t klen = strlen(key);
    if (payload > SIZE_MAX / 2 || !kv_reserve(w, 12 + klen + payload, err))
        return tdm_error_set(err, TDM_ERR_OOM, "gguf writer: key '%s': value too large", key);
    if (w->n_kv == w->keys_cap) {
        int64_t cap = w->keys_cap ? w->keys_cap * 2 : 32;
        char **k = realloc(w->keys, (size_t)cap * sizeof *k);
        if (!k) return tdm_error_set(err, TDM_ERR_OOM, "gguf writer: out of memory");
        w->keys = k;
        w->keys_cap = cap;
    }
    char *copy = malloc(klen + 1);
    if (!copy) return tdm_error_set(err, TDM_ERR_OOM, "gguf writer: out of memory");
    memcpy(copy, key, klen + 1);
    w->keys[w->n_kv++] = copy;
    kv_put_le(w, klen, 8);
    kv_put(w, key, klen);
    kv_put_le(w, (uint32_t)type, 4);
    return TDM_OK;
}

static tdm_status add_scalar(tdm_gguf_writer *w, const char *key, tdm_gguf_vtype t, uint64_t bits,
                             tdm_error *err)
{
    size_t n = tdm_gguf_vtype_size(t);
    tdm_status st = kv_begin(w, key, t, n, err);
    if (st) return st;
    kv_put_le(w, bits, n);
    return TDM_OK;
}

/* ---------------------------------------------------------------- public: setup */

tdm_status tdm_gguf_writer_create(tdm_gguf_writer **out, tdm_error *err)
{
    if (!out) return tdm_error_set(err, TDM_ERR_INVALID, "gguf writer: NULL out");
    tdm_gguf_writer *w = calloc(1, sizeof *w);
    *out = NULL;
    if (!w) return tdm_error_set(err, TDM_ERR_OOM, "gguf writer: out of memory");
    w->version = 3;
    w->alignment = 32;
    w->align_payload_off = SIZE_MAX;
    *out = w;
    return TDM_OK;
}

void tdm_gguf_writer_free(tdm_gguf_writer *w)
{
    if (!w) return;
    if (w->f) fclose(w->f);
    for (int64_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
    free(w->keys);
    free(w->kv);
    free(w->t);
    free(w);
}

tdm_status tdm_gguf_writer_set_version(tdm_gguf_writer *w, uint32_t version, tdm_error *err)
{
    tdm_status st = check_writable(w, err);
    if (st) return st;
    if (version != 2 && version != 3)
        return tdm_error_set(err, TDM_ERR_INVALID, "gguf writer: version %u (must be 2 or 3)", version);
    w->version = version;
    return TDM_OK;
}

tdm_status tdm_gguf_writer_set_alignment(tdm_gguf_writer *w, uint32_t alignment, tdm_error *err)
{
    tdm_status st = check_writable(w, err);
    if (st) return st;
    if (alignment == 0 || (alignment & (alignment - 1)))
        return tdm_error_set(err, TDM_ERR_INVALID,
                             "gguf writer: general.alignment %u is not a power of two", alignment);
    if (w->n_t > 0)
        return tdm_error_set(err, TDM_ERR_INVALID,
                             "gguf writer: general.alignment must be set before the first tensor");
    if (w->align_payload_off == SIZE_MAX) {
        w->in_set_alignment = true;
        st = add_scalar(w, "general.alignment", TDM_GGUF_UINT32, alignment, err);
        w->in_set_alignment = false;
        if (st) return st;
        w->align_payload_off = w->kv_len - 4;
    } else {
        put_le(w->kv + w->align_payload_off, alignment, 4);
    }
    w->alignment = alignment;
    return TDM_OK;
}

/* ---------------------------------------------------------------- public: KV */

tdm_status tdm_gguf_writer_add_u8(tdm_gguf_writer *w, const char *key, uint8_t v, tdm_error *err)
{ return add_scalar(w, key, TDM_GGUF_UINT8, v, err); }
tdm_status tdm_gguf_writer_add_i8(tdm_gguf_writer *w, const char *key, int8_t v, tdm_error *err)
{ return add_scalar(w, key, TDM_GGUF_INT8, (uint8_t)v, err); }
tdm_status tdm_gguf_writer_add_u16(tdm_gguf_writer *w, const char *key, uint16_t v, tdm_error *err)
{ return add_scalar(w, key, TDM_GGUF_UINT16, v, err); }
tdm_status tdm_gguf_writer_add_i16(tdm_gguf_writer *w, const char *key, int16_t v, tdm_error *err)
{ return add_scalar(w, key, TDM_GGUF_INT16, (uint16_t)v, err); }
tdm_status tdm_gguf_writer_add_u32(tdm_gguf_writer *w, const char *key, uint32_t v, tdm_error *err)
{
    if (key && strcmp(key, "general.alignment") == 0) return tdm_gguf_writer_set_alignment(w, v, err);
    return add_scalar(w, key, TDM_GGUF_UINT32, v, err);
}
tdm_status tdm_gguf_writer_add_i32(tdm_gguf_writer *w, const char *key, int32_t v, tdm_error *err)
{ return add_scalar(w, key, TDM_GGUF_INT32, (uint32_t)v, err); }
tdm_status tdm_gguf_writer_add_u64(tdm_gguf_writer *w, const char *key, uint64_t v, tdm_error *err)
{ return add_scalar(w, key, TDM_GGUF_UINT64, v, err); }
tdm_status tdm_gguf_writer_add_i64(tdm_gguf_writer *w, const char *key, int64_t v, tdm_error *err)
{ return add_scalar(w, key, TDM_GGUF_INT64, (uint64_t)v, err); }
tdm_status tdm_gguf_writer_add_bool(tdm_gguf_writer *w, const char *key, bool v, tdm_error *err)
{ return add_scalar(w, key, TDM_GGUF_BOOL, v ? 1 : 0, err); }

tdm_status tdm_gguf_writer_add_f32(tdm_gguf_writer *w, const char *key, float v, tdm_error *err)
{
    uint32_t bits;
    memcpy(&bits, &v, 4);
    return add_scalar(w, key, TDM_GGUF_FLOAT32, bits, err);
}

tdm_status tdm_gguf_writer_add_f64(tdm_gguf_writer *w, const char *key, double v, tdm_error *err)
{
    uint64_t bits;
    memcpy(&bits, &v, 8);
    return add_scalar(w, key, TDM_GGUF_FLOAT64, bits, err);
}

tdm_status tdm_gguf_writer_add_strn(tdm_gguf_writer *w, const char *key, const char *s, size_t len,
                                    tdm_error *err)
{
    if (!s && len) return tdm_error_set(err, TDM_ERR_INVALID, "gguf writer: key '%s': NULL string", key ? key : "");
    if (len > SIZE_MAX / 4) return tdm_error_set(err, TDM_ERR_INVALID, "gguf writer: string too long");
    tdm_status st = kv_begin(w, key, TDM_GGUF_STRING, 8 + len, err);
    if (st) return st;
    kv_put_le(w, len, 8);
    kv_put(w, s, len);
    return TDM_OK;
}

tdm_status tdm_gguf_writer_add_str(tdm_gguf_writer *w, const char *key, const char *s, tdm_error *err)
{
    if (!s) return tdm_error_set(err, TDM_ERR_INVALID, "gguf writer: key '%s': NULL string", key ? key : "");
    return tdm_gguf_writer_add_strn(w, key, s, strlen(s), err);
}

tdm_status tdm_gguf_writer_add_arr(tdm_gguf_writer *w, const char *key, tdm_gguf_vtype elem_type,
                                   const void *elems, uint64_t count, tdm_error *err)
{
    size_t es = tdm_gguf_vtype_size(elem_type);
    if (es == 0)
        return tdm_error_set(err, TDM_ERR_INVALID,
                             "gguf writer: key '%s': array element type %d needs add_arr_str/add_raw",
                             key ? key : "", (int)elem_type);
    if (count && !elems) return tdm_error_set(err, TDM_ERR_INVALID, "gguf writer: key '%s': NULL elements", key ? key : "");
    if (count > (SIZE_MAX / 4) / es)
        return tdm_error_set(err, TDM_ERR_INVALID, "gguf writer: key '%s': array too large", key ? key : "");
    tdm_status st = kv_begin(w, key, TDM_GGUF_ARRAY, 12 + (size_t)count * es, err);
    if (st) return st;
    kv_put_le(w, (uint32_t)elem_type, 4);
    kv_put_le(w, count, 8);
    const uint8_t *p = elems;
    for (uint64_t i = 0; i < count; i++) {
        uint64_t v = 0;
        switch (es) {
        case 1: { uint8_t x; memcpy(&x, p + i, 1); v = (elem_type == TDM_GGUF_BOOL) ? (x != 0) : x; break; }
        case 2: { uint16_t x; memcpy(&x, p + 2 * i, 2); v = x; break; }
        case 4: { uint32_t x; memcpy(&x, p + 4 * i, 4); v = x; break; }
        default: memcpy(&v, p + 8 * i, 8); break;
        }
        kv_put_le(w, v, es);
    }
    return TDM_OK;
}

tdm_status tdm_gguf_writer_add_arr_str(tdm_gguf_writer *w, const char *key, const char *const *strs,
                                       const size_t *lens, uint64_t count, tdm_error *err)
{
    if (count && !strs) return tdm_error_set(err, TDM_ERR_INVALID, "gguf writer: key '%s': NULL strings", key ? key : "");
    size_t total = 12;
    for (uint64_t i = 0; i < count; i++) {
        if (!strs[i] && (!lens || lens[i]))
            return tdm_error_set(err, TDM_ERR_INVALID, "gguf writer: key '%s': string %llu is NULL",
                                 key ? key : "", (unsigned long long)i);
        size_t l = lens ? lens[i] : strlen(strs[i]);
        if (l > SIZE_MAX / 8 - total)
            return tdm_error_set(err, TDM_ERR_INVALID, "gguf writer: key '%s': array too large", key ? key : "");
        total += 8 + l;
    }
    tdm_status st = kv_begin(w, key, TDM_GGUF_ARRAY, total, err);
    if (st) return st;
    kv_put_le(w, (uint32_t)TDM_GGUF_STRING, 4);
    kv_put_le(w, count, 8);
    for (uint64_t i = 0; i < count; i++) {
        size_t l = lens ? lens[i] : strlen(strs[i]);
        kv_put_le(w, l, 8);
        kv_put(w, strs[i], l);
    }
    return TDM_OK;
}

tdm_status tdm_gguf_writer_add_raw(tdm_gguf_writer *w, const char *key, tdm_gguf_vtype type,
                                   const void *payload, size_t nbytes, tdm_error *err)
{
    if (nbytes && !payload) return tdm_error_set(err, TDM_ERR_INVALID, "gguf writer: key '%s': NULL payload", key ? key : "");
    tdm_status st = kv_begin(w, key, type, nbytes, err);
    if (st) return st;
    kv_put(w, payload, nbytes);
    return TDM_OK;
}

/* ---------------------------------------------------------------- public: tensors */

static tdm_status add_tensor(tdm_gguf_writer *w, const char *name, tdm_qtype type, uint32_t n_dims,
                             const int64_t *ne, const void *data, tdm_gguf_fill_fn fill, void *user,
                             tdm_error *err)
{
    tdm_status st = check_writable(w, err);
    if (st) return st;
    if (!name || !name[0]) return tdm_error_set(err, TDM_ERR_INVALID, "gguf writer: empty tensor name");
    size_t nl = strlen(name);
    if (nl >= MAX_NAME)
        return tdm_error_set(err, TDM_ERR_INVALID, "gguf writer: tensor '%s': name is %zu bytes (max %d)",
                             name, nl, MAX_NAME - 1);
    for (int64_t i = 0; i < w->n_t; i++)
        if (strcmp(w->t[i].name, name) == 0)
            return tdm_error_set(err, TDM_ERR_INVALID, "gguf writer: duplicate tensor name '%s'", name);
    if (n_dims < 1 || n_dims > MAX_DIMS || !ne)
        return tdm_error_set(err, TDM_ERR_INVALID, "gguf writer: tensor '%s': n_dims %u (must be 1..4)",
                             name, n_dims);
    const tdm_qtype_info *qi = tdm_qtype_get((uint32_t)type);
    if (!qi)
        return tdm_error_set(err, TDM_ERR_INVALID, "gguf writer: tensor '%s': unknown type %d", name, (int)type);
    wtensor t = { .type = type, .n_dims = n_dims, .data = data, .fill = fill, .user = user };
    memcpy(t.name, name, nl + 1);
    uint64_t nel = 1;
    for (uint32_t d = 0; d < MAX_DIMS; d++) {
        int64_t v = d < n_dims ? ne[d] : 1;
        if (v < 0)
            return tdm_error_set(err, TDM_ERR_INVALID, "gguf writer: tensor '%s': ne[%u] = %lld is negative",
                                 name, d, (long long)v);
        t.ne[d] = v;
        if (v && nel > (uint64_t)INT64_MAX / (uint64_t)v)
            return tdm_error_set(err, TDM_ERR_INVALID, "gguf writer: tensor '%s': element count overflows", name);
        nel *= (uint64_t)v;
    }
    if (t.ne[0] % qi->block)
        return tdm_error_set(err, TDM_ERR_INVALID,
                             "gguf writer: tensor '%s': ne[0] = %lld not a multiple of the %s block %u",
                             name, (long long)t.ne[0], qi->name, qi->block);
    uint64_t blocks = nel / qi->block;
    if (blocks > (UINT64_MAX / 4) / qi->type_size)
        return tdm_error_set(err, TDM_ERR_INVALID, "gguf writer: tensor '%s': byte size overflows", name);
    t.nbytes = blocks * qi->type_size;
    uint64_t padded = align_up(t.nbytes, w->alignment);
    if (padded > UINT64_MAX / 4 - w->data_size)
        return tdm_error_set(err, TDM_ERR_INVALID, "gguf writer: tensor '%s': data section too large", name);
    if (w->n_t == w->t_cap) {
        int64_t cap = w->t_cap ? w->t_cap * 2 : 64;
        wtensor *p = realloc(w->t, (size_t)cap * sizeof *p);
        if (!p) return tdm_error_set(err, TDM_ERR_OOM, "gguf writer: out of memory");
        w->t = p;
        w->t_cap = cap;
    }
    t.offset = w->data_size;
    w->data_size += padded;
    w->t[w->n_t++] = t;
    return TDM_OK;
}

tdm_status tdm_gguf_writer_add_tensor(tdm_gguf_writer *w, const char *name, tdm_qtype type,
                                      uint32_t n_dims, const int64_t *ne, const void *data,
                                      tdm_error *err)
{
    return add_tensor(w, name, type, n_dims, ne, data, NULL, NULL, err);
}

tdm_status tdm_gguf_writer_add_tensor_cb(tdm_gguf_writer *w, const char *name, tdm_qtype type,
                                         uint32_t n_dims, const int64_t *ne,
                                         tdm_gguf_fill_fn fill, void *user, tdm_error *err)
{
    if (!fill)
        return tdm_error_set(err, TDM_ERR_INVALID, "gguf writer: tensor '%s': NULL fill callback",
                             name ? name : "");
    return add_tensor(w, name, type, n_dims, ne, NULL, fill, user, err);
}

/* ---------------------------------------------------------------- layout */

static uint64_t infos_size(const tdm_gguf_writer *w)
{
    uint64_t n = 0;
    for (int64_t i = 0; i < w->n_t; i++)
        n += 8 + strlen(w->t[i].name) + 4 + 8ull * w->t[i].n_dims + 4 + 8;
    return n;
}

uint64_t tdm_gguf_writer_header_size(const tdm_gguf_writer *w)
{
    if (!w) return 0;
    uint64_t n = 24 + w->kv_len + infos_size(w);
    /* ggml pads the header only when there is a data section. */
    return w->n_t > 0 ? align_up(n, w->alignment) : n;
}

uint64_t tdm_gguf_writer_file_size(const tdm_gguf_writer *w)
{
    return w ? tdm_gguf_writer_header_size(w) + w->data_size : 0;
}

uint64_t tdm_gguf_writer_tensor_offset(const tdm_gguf_writer *w, int64_t index)
{
    if (!w || index < 0 || index >= w->n_t) return UINT64_MAX;
    return w->t[index].offset;
}

/* ---------------------------------------------------------------- output */

static tdm_status sink_put(tdm_gguf_writer *w, const void *p, size_t n, tdm_error *err)
{
    if (n == 0) return TDM_OK;
    if (w->sink == SINK_MEM) {
        if (n > w->mem_size - w->mem_pos)
            return tdm_error_set(err, TDM_ERR_INVALID, "gguf writer: output exceeds computed size");
        memcpy(w->mem + w->mem_pos, p, n);
        w->mem_pos += n;
        return TDM_OK;
    }
    if (fwrite(p, 1, n, w->f) != n)
        return tdm_error_set(err, TDM_ERR_IO, "gguf writer: write failed: %s", strerror(errno));
    return TDM_OK;
}

static tdm_status sink_zeros(tdm_gguf_writer *w, uint64_t n, tdm_error *err)
{
    while (n) {
        size_t k = n < sizeof zeros64 ? (size_t)n : sizeof zeros64;
        tdm_status st = sink_put(w, zeros64, k, err);
        if (st) return st;
        n -= k;
    }
    return TDM_OK;
}

static tdm_status write_header(tdm_gguf_writer *w, tdm_error *err)
{
    uint8_t b[24 + 8 + MAX_NAME + 4 + 8 * MAX_DIMS + 4 + 8];
    memcpy(b, "GGUF", 4);
    put_le(b + 4, w->version, 4);
    put_le(b + 8, (uint64_t)w->n_t, 8);
    put_le(b + 16, (uint64_t)w->n_kv, 8);
    tdm_status st = sink_put(w, b, 24, err);
    if (!st) st = sink_put(w, w->kv, w->kv_len, err);
    for (int64_t i = 0; !st && i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        size_t nl = strlen(t->name), k = 0;
        put_le(b + k, nl, 8); k += 8;
        memcpy(b + k, t->name, nl); k += nl;
        put_le(b + k, t->n_dims, 4); k += 4;
        for (uint32_t d = 0; d < t->n_dims; d++) { put_le(b + k, (uint64_t)t->ne[d], 8); k += 8; }
        put_le(b + k, (uint32_t)t->type, 4); k += 4;
        put_le(b + k, t->offset, 8); k += 8;
        st = sink_put(w, b, k, err);
    }
    if (st) return st;
    uint64_t raw = 24 + w->kv_len + infos_size(w);
    return sink_zeros(w, tdm_gguf_writer_header_size(w) - raw, err);
}

static void skip_empty(tdm_gguf_writer *w)
{
    while (w->cur < w->n_t && w->t[w->cur].nbytes == 0) w->cur++;
}

static tdm_status start(tdm_gguf_writer *w, tdm_error *err)
{
    w->started = true;
    w->cur = 0;
    w->cur_done = 0;
    tdm_status st = write_header(w, err);
    skip_empty(w);
    return st;
}

tdm_status tdm_gguf_writer_write_data(tdm_gguf_writer *w, const void *p, size_t n, tdm_error *err)
{
    if (!w || !w->started || w->finished || w->sink == SINK_NONE)
        return tdm_error_set(err, TDM_ERR_INVALID, "gguf writer: write_data outside begin/finish");
    if (n && !p) return tdm_error_set(err, TDM_ERR_INVALID, "gguf writer: write_data: NULL data");
    const uint8_t *src = p;
    while (n) {
        if (w->cur >= w->n_t)
            return tdm_error_set(err, TDM_ERR_INVALID,
                                 "gguf writer: %zu bytes more than the declared tensors hold", n);
        wtensor *t = &w->t[w->cur];
        uint64_t left = t->nbytes - w->cur_done;
        size_t k = n < left ? n : (size_t)left;
        tdm_status st = sink_put(w, src, k, err);
        if (st) return st;
        src += k;
        n -= k;
        w->cur_done += k;
        if (w->cur_done == t->nbytes) {
            st = sink_zeros(w, align_up(t->nbytes, w->alignment) - t->nbytes, err);
            if (st) return st;
            w->cur++;
            w->cur_done = 0;
            skip_empty(w);
        }
    }
    return TDM_OK;
}

static tdm_status close_sink(tdm_gguf_writer *w, tdm_error *err)
{
    w->finished = true;
    if (w->sink == SINK_FILE && w->f) {
        int rc = fclose(w->f);
        w->f = NULL;
        if (rc != 0) return tdm_error_set(err, TDM_ERR_IO, "gguf writer: close failed: %s", strerror(errno));
    }
    return TDM_OK;
}

tdm_status tdm_gguf_writer_finish(tdm_gguf_writer *w, tdm_error *err)
{
    if (!w || !w->started || w->finished || w->sink == SINK_NONE)
        return tdm_error_set(err, TDM_ERR_INVALID, "gguf writer: finish without begin");
    if (w->cur < w->n_t) {
        tdm_error_set(err, TDM_ERR_INVALID,
                      "gguf writer: tensor '%s' (#%lld) incomplete: %llu of %llu bytes written",
                      w->t[w->cur].name, (long long)w->cur, (unsigned long long)w->cur_done,
                      (unsigned long long)w->t[w->cur].nbytes);
        close_sink(w, NULL);
        return TDM_ERR_INVALID;
    }
    return close_sink(w, err);
}

tdm_status tdm_gguf_writer_begin(tdm_gguf_writer *w, const char *path, tdm_error *err)
{
    if (!w || !path) return tdm_error_set(err, TDM_ERR_INVALID, "gguf writer: NULL argument");
    if (w->started) return tdm_error_set(err, TDM_ERR_INVALID, "gguf writer: already written");
    w->f = fopen(path, "wb");
    if (!w->f) return tdm_error_set(err, TDM_ERR_IO, "gguf writer: cannot create %s: %s", path, strerror(errno));
    setvbuf(w->f, NULL, _IOFBF, (size_t)1 << 20);
    w->sink = SINK_FILE;
    tdm_status st = start(w, err);
    if (st) tdm_error_wrap(err, "%s", path);
    return st;
}

/* Emits every tensor from its pointer or fill callback. */
static tdm_status emit_all(tdm_gguf_writer *w, tdm_error *err)
{
    uint64_t biggest = 0;
    for (int64_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        if (t->nbytes && !t->data && !t->fill)
            return tdm_error_set(err, TDM_ERR_INVALID,
                                 "gguf writer: tensor '%s' has neither data nor a fill callback "
                                 "(use begin/write_data/finish)", t->name);
        if (t->fill && t->nbytes > biggest) biggest = t->nbytes;
    }
    size_t cap = biggest < TDM_GGUF_WRITER_CHUNK ? (size_t)biggest : TDM_GGUF_WRITER_CHUNK;
    uint8_t *buf = cap ? malloc(cap) : NULL;
    if (cap && !buf) return tdm_error_set(err, TDM_ERR_OOM, "gguf writer: out of memory (%zu)", cap);
    tdm_status st = TDM_OK;
    for (int64_t i = 0; !st && i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        if (t->data) {
            st = tdm_gguf_writer_write_data(w, t->data, (size_t)t->nbytes, err);
            continue;
        }
        for (uint64_t off = 0; !st && off < t->nbytes; off += cap) {
            size_t k = t->nbytes - off < cap ? (size_t)(t->nbytes - off) : cap;
            st = t->fill(t->user, i, off, buf, k, err);
            if (st) tdm_error_wrap(err, "gguf writer: tensor '%s'", t->name);
            else st = tdm_gguf_writer_write_data(w, buf, k, err);
        }
    }
    free(buf);
    return st;
}

tdm_status tdm_gguf_writer_write_file(tdm_gguf_writer *w, const char *path, tdm_error *err)
{
    tdm_status st = tdm_gguf_writer_begin(w, path, err);
    if (st) return st;
    st = emit_all(w, err);
    if (!st) return tdm_gguf_writer_finish(w, err);
    close_sink(w, NULL);
    unlink(path); /* a half-written file must not look like a model */
    return st;
}

tdm_status tdm_gguf_writer_write_memory(tdm_gguf_writer *w, void **out, size_t *size, tdm_error *err)
{
    if (!w || !out || !size) return tdm_error_set(err, TDM_ERR_INVALID, "gguf writer: NULL argument");
    *out = NULL;
    *size = 0;
    if (w->started) return tdm_error_set(err, TDM_ERR_INVALID, "gguf writer: already written");
    uint64_t total = tdm_gguf_writer_file_size(w);
    if (total > SIZE_MAX / 2)
        return tdm_error_set(err, TDM_ERR_OOM, "gguf writer: %llu bytes do not fit in memory",
                             (unsigned long long)total);
    void *mem = NULL;
    if (posix_memalign(&mem, 64, total ? (size_t)total : 1) != 0)
        return tdm_error_set(err, TDM_ERR_OOM, "gguf writer: out of memory (%llu bytes)",
                             (unsigned long long)total);
    w->mem = mem;
    w->mem_size = (size_t)total;
    w->mem_pos = 0;
    w->sink = SINK_MEM;
    tdm_status st = start(w, err);
    if (!st) st = emit_all(w, err);
    if (!st) st = tdm_gguf_writer_finish(w, err);
    if (!st && w->mem_pos != w->mem_size)
        st = tdm_error_set(err, TDM_ERR_INVALID, "gguf writer: wrote %zu of %zu bytes", w->mem_pos, w->mem_size);
    w->mem = NULL;
    if (st) {
        free(mem);
        return st;
    }
    *out = mem;
    *size = (size_t)total;
    return TDM_OK;
}
