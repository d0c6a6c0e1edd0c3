/* routing: writer and validating reader of the routing dump (format in routing.h). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "routing.h"

struct tdm_routing_writer {
    FILE *f;
    char *path;
    int32_t n_layer, n_expert, k;
    int32_t last_pos, last_layer; /* -1 before the first record */
    int64_t n_records;
    unsigned char *rec;           /* [6 + 6k] encode buffer */
};

static size_t rec_bytes(int32_t k) { return 6 + 6 * (size_t)k; }

static void put_u16(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
}

static void put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get_u16(const unsigned char *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }

static uint32_t get_u32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get_u64(const unsigned char *p)
{
    return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32;
}

static float get_f32(const unsigned char *p)
{
    uint32_t u = get_u32(p);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Shared record checks; prev_pos/prev_layer describe the record before (-1: none). */
static tdm_status check_record(int32_t n_layer, int32_t n_expert, int32_t k, int32_t pos,
                               int32_t layer, const int32_t *ids, const float *w,
                               int32_t prev_pos, int32_t prev_layer, int64_t index,
                               tdm_error *err)
{
    if (pos < 0)
        return tdm_error_set(err, TDM_ERR_FORMAT, "routing record %" PRId64 ": pos %d < 0",
                             index, pos);
    if (layer < 0 || layer >= n_layer)
        return tdm_error_set(err, TDM_ERR_FORMAT, "routing record %" PRId64 ": layer %d out of "
                             "range 0..%d", index, layer, n_layer - 1);
    if (pos == prev_pos && layer <= prev_layer)
        return tdm_error_set(err, TDM_ERR_FORMAT, "routing record %" PRId64 ": layer %d after "
                             "layer %d of the same token (pos %d): not token-major", index,
                             layer, prev_layer, pos);
    for (int32_t i = 0; i < k; i++) {
        if (ids[i] < 0 || ids[i] >= n_expert)
            return tdm_error_set(err, TDM_ERR_FORMAT, "routing record %" PRId64 ": expert id %d "
                                 "out of range 0..%d", index, ids[i], n_expert - 1);
        if (!(w[i] >= 0.0f && w[i] <= 1.0f + 1e-5f))
            return tdm_error_set(err, TDM_ERR_FORMAT, "routing record %" PRId64 ": weight %g "
                                 "not in [0, 1]", index, (double)w[i]);
        for (int32_t j = 0; j < i; j++)
            if (ids[j] == ids[i])
                return tdm_error_set(err, TDM_ERR_FORMAT, "routing record %" PRId64 ": expert "
                                     "%d repeated", index, ids[i]);
    }
    return TDM_OK;
}

/* The writer shares the reader's checks; for it a bad record is the caller's fault. */
static tdm_status as_invalid(tdm_error *err)
{
    if (err)
        err->code = TDM_ERR_INVALID;
    return TDM_ERR_INVALID;
}

static tdm_status check_dims(int64_t n_layer, int64_t n_expert, int64_t k, tdm_error *err)
{
    if (n_layer <= 0 || n_layer > 4096) /* as a profile's model id */
        return tdm_error_set(err, TDM_ERR_FORMAT, "routing: n_layer %" PRId64 " out of range "
                             "1..4096", n_layer);
    if (n_expert <= 0 || n_expert > 65535)
        return tdm_error_set(err, TDM_ERR_FORMAT, "routing: n_expert %" PRId64 " out of range "
                             "1..65535", n_expert);
    if (k <= 0 || k > 64 || k > n_expert)
        return tdm_error_set(err, TDM_ERR_FORMAT, "routing: k %" PRId64 " out of range "
                             "1..min(64, n_expert)", k);
    if (n_layer * n_expert > TDM_PROFILE_MAX_EXPERTS)
        return tdm_error_set(err, TDM_ERR_FORMAT, "routing: %" PRId64 " layers x %" PRId64 " experts is more "
                             "than %d experts", n_layer, n_expert, TDM_PROFILE_MAX_EXPERTS);
    return TDM_OK;
}

tdm_status tdm_routing_writer_open(const char *path, const tdm_model_id *id,
                                   tdm_routing_writer **out, tdm_error *err)
{
    *out = NULL;
    tdm_status st = check_dims(id->n_layer, id->n_expert, id->k, err);
    if (st)
        return as_invalid(err);
    tdm_routing_writer *w = calloc(1, sizeof *w);
    if (w) {
        w->rec = malloc(rec_bytes(id->k));
        w->path = strdup(path);
    }
    if (!w || !w->rec || !w->path) {
        if (w) {
            free(w->rec);
            free(w->path);
        }
        free(w);
        return tdm_error_set(err, TDM_ERR_OOM, "routing writer: out of memory");
    }
    w->n_layer = id->n_layer;
    w->n_expert = id->n_expert;
    w->k = id->k;
    w->last_pos = w->last_layer = -1;
    w->f = fopen(path, "wb");
    if (!w->f) {
        st = tdm_error_set(err, TDM_ERR_IO, "%s: %s", path, strerror(errno));
        free(w->rec);
        free(w->path);
        free(w);
        return st;
    }
    unsigned char h[TDM_ROUTING_HEADER_BYTES];
    memcpy(h, TDM_ROUTING_MAGIC, 8);
    put_u32(h + 8, TDM_ROUTING_VERSION);
    put_u32(h + 12, (uint32_t)id->n_layer);
    put_u32(h + 16, (uint32_t)id->n_expert);
    put_u32(h + 20, (uint32_t)id->k);
    uint64_t mh = tdm_profile_model_hash(id);
    put_u32(h + 24, (uint32_t)mh);
    put_u32(h + 28, (uint32_t)(mh >> 32));
    fwrite(h, 1, sizeof h, w->f);
    *out = w;
    return TDM_OK;
}

tdm_status tdm_routing_writer_add(tdm_routing_writer *w, int32_t pos, int32_t layer,
                                  const int32_t *ids, const float *weights, tdm_error *err)
{
    int32_t prev_layer = w->last_pos == pos ? w->last_layer : -1;
    tdm_status st = check_record(w->n_layer, w->n_expert, w->k, pos, layer, ids, weights,
                                 w->last_pos, prev_layer, w->n_records, err);
    if (st)
        return as_invalid(err);
    unsigned char *p = w->rec;
    put_u32(p, (uint32_t)pos);
    put_u16(p + 4, (uint32_t)layer);
    for (int32_t i = 0; i < w->k; i++) {
        uint32_t u;
        memcpy(&u, &weights[i], 4);
        put_u16(p + 6 + 2 * i, (uint32_t)ids[i]);
        put_u32(p + 6 + 2 * (size_t)w->k + 4 * i, u);
    }
    fwrite(p, 1, rec_bytes(w->k), w->f); /* errors surface at close via ferror */
    w->last_pos = pos;
    w->last_layer = layer;
    w->n_records++;
    return TDM_OK;
}

tdm_status tdm_routing_writer_close(tdm_routing_writer *w, tdm_error *err)
{
    if (!w)
        return TDM_OK;
    bool bad = ferror(w->f) != 0;
    bad = (fclose(w->f) != 0) || bad;
    tdm_status st = bad ? tdm_error_set(err, TDM_ERR_IO, "%s: write failed", w->path) : TDM_OK;
    free(w->rec);
    free(w->path);
    free(w);
    return st;
}

void tdm_routing_free(tdm_routing *r)
{
    if (!r)
        return;
    free(r->pos);
    free(r->layer);
    free(r->ids);
    free(r->weights);
    free(r->token);
    free(r);
}

static tdm_status parse_records(tdm_routing *r, const unsigned char *d, tdm_error *err)
{
    int32_t k = r->k;
    size_t rb = rec_bytes(k);
    int32_t prev_pos = -1, prev_layer = -1;
    int64_t tok = -1;
    for (int64_t i = 0; i < r->n_records; i++) {
        const unsigned char *p = d + i * rb;
        int32_t *ids = r->ids + i * k;
        float *w = r->weights + i * k;
        int32_t pos = (int32_t)get_u32(p), layer = (int32_t)get_u16(p + 4);
        for (int32_t j = 0; j < k; j++) {
            ids[j] = (int32_t)get_u16(p + 6 + 2 * j);
            w[j] = get_f32(p + 6 + 2 * (size_t)k + 4 * j);
        }
        tdm_status st = check_record(r->n_layer, r->n_expert, k, pos, layer, ids, w, prev_pos,
                                     pos == prev_pos ? prev_layer : -1, i, err);
        if (st)
            return tdm_error_wrap(err, "byte %zu", TDM_ROUTING_HEADER_BYTES + (size_t)i * rb);
        if (pos != prev_pos)
            tok++;
        r->pos[i] = pos;
        r->layer[i] = layer;
        r->token[i] = tok;
        prev_pos = pos;
        prev_layer = layer;
    }
    r->n_tokens = tok + 1;
    return TDM_OK;
}

tdm_status tdm_routing_parse(const void *data, size_t size, tdm_routing **out, tdm_error *err)
{
    *out = NULL;
    const unsigned char *d = data;
    if (size < TDM_ROUTING_HEADER_BYTES)
        return tdm_error_set(err, TDM_ERR_FORMAT, "routing: %zu bytes, shorter than the %d-byte "
                             "header", size, TDM_ROUTING_HEADER_BYTES);
    if (memcmp(d, TDM_ROUTING_MAGIC, 8))
        return tdm_error_set(err, TDM_ERR_FORMAT, "routing: bad magic (not a routing dump)");
    uint32_t ver = get_u32(d + 8);
    if (ver != TDM_ROUTING_VERSION)
        return tdm_error_set(err, TDM_ERR_UNSUPPORTED, "routing: version %u (this build reads %d)",
                             ver, TDM_ROUTING_VERSION);
    int64_t nl = get_u32(d + 12), ne = get_u32(d + 16), k = get_u32(d + 20);
    tdm_status st = check_dims(nl, ne, k, err);
    if (st)
        return st;
    size_t rb = rec_bytes((int32_t)k), body = size - TDM_ROUTING_HEADER_BYTES;
    if (body % rb)
        return tdm_error_set(err, TDM_ERR_FORMAT, "routing: %zu bytes after the header is not a "
                             "whole number of %zu-byte records (truncated at record %zu?)", body,
                             rb, body / rb);
    tdm_routing *r = calloc(1, sizeof *r);
    if (!r)
        return tdm_error_set(err, TDM_ERR_OOM, "routing: out of memory");
    r->n_layer = (int32_t)nl;
    r->n_expert = (int32_t)ne;
    r->k = (int32_t)k;
    r->model_hash = get_u64(d + 24);
    r->n_records = (int64_t)(body / rb);
    size_t n = (size_t)r->n_records ? (size_t)r->n_records : 1;
    r->pos = malloc(n * sizeof *r->pos);
    r->layer = malloc(n * sizeof *r->layer);
    r->token = malloc(n * sizeof *r->token);
    r->ids = malloc(n * (size_t)k * sizeof *r->ids);
    r->weights = malloc(n * (size_t)k * sizeof *r->weights);
    if (!r->pos || !r->layer || !r->token || !r->ids || !r->weights)
        st = tdm_error_set(err, TDM_ERR_OOM, "routing: cannot hold %" PRId64 " records",
                           r->n_records);
    else
        st = parse_records(r, d + TDM_ROUTING_HEADER_BYTES, err);
    if (st) {
        tdm_routing_free(r);
        return st;
    }
    *out = r;
    return TDM_OK;
}

tdm_status tdm_routing_read(const char *path, tdm_routing **out, tdm_error *err)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return tdm_error_set(err, TDM_ERR_IO, "%s: %s", path, strerror(errno));
    long size = -1;
    if (fseek(f, 0, SEEK_END) == 0)
        size = ftell(f);
    if (size < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return tdm_error_set(err, TDM_ERR_IO, "%s: cannot determine the size", path);
    }
    void *buf = malloc(size ? (size_t)size : 1);
    if (!buf) {
        fclose(f);
        return tdm_error_set(err, TDM_ERR_OOM, "%s: cannot buffer %ld bytes", path, size);
    }
    size_t got = fread(buf, 1, (size_t)size, f);
    fclose(f);
    tdm_status st = got != (size_t)size
                        ? tdm_error_set(err, TDM_ERR_IO, "%s: short read", path)
                        : tdm_routing_parse(buf, (size_t)size, out, err);
    free(buf);
    return st ? tdm_error_wrap(err, "%s", path) : TDM_OK;
}

tdm_status tdm_routing_check_model(const tdm_routing *r, const tdm_model_id *id, tdm_error *err)
{
    if (r->n_layer != id->n_layer || r->n_expert != id->n_expert || r->k != id->k)
        return tdm_error_set(err, TDM_ERR_INVALID, "routing dump was made for another model: %d "
                             "layers x %d experts, top-%d; expected %d x %d, top-%d", r->n_layer,
                             r->n_expert, r->k, id->n_layer, id->n_expert, id->k);
    if (r->model_hash != tdm_profile_model_hash(id))
        return tdm_error_set(err, TDM_ERR_INVALID, "routing dump was made for another model "
                             "(model hash %016" PRIx64 ", expected %016" PRIx64 ")",
                             r->model_hash, tdm_profile_model_hash(id));
    return TDM_OK;
}
