/* model_edit: edited copies of a GGUF model, written in memory with the GGUF
 * writer (a tensor left out, reshaped, retyped; a metadata key overridden or
 * left out; blk.1's FFN made dense), and the hostile-model sweeps that
 * enumerate such copies: every u32/f32 metadata key at edge values, tensors
 * rewritten in other types. Included by tests/unit/test_model_bind.c (binding
 * and the CPU forward) and tests/gpu/test_gpu_model_bind.c (the GPU forward
 * against the CPU's). The sweeps fix the edits and their order; each test
 * passes a visitor that does its own work per edit. Header-only (static)
 * because each test is its own binary; include after cmocka.h. */
#ifndef TDM_TEST_MODEL_EDIT_H
#define TDM_TEST_MODEL_EDIT_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "gguf_writer.h"
#include "model.h"
#include "quant.h"

typedef struct edit {
    const char *drop;       /* tensor left out */
    const char *reshape;    /* tensor written with half its rows */
    const char *key;        /* u32 key overridden ... */
    uint32_t value;         /* ... with this value */
    const char *fkey;       /* f32 key overridden ... */
    float fvalue;           /* ... with this value */
    const char *drop_key;   /* metadata key left out */
    const char *arch;       /* general.architecture override */
    int ffn1;               /* blk.1 FFN: 1 = dense from expert 0, 2 = every expert = expert 0 */
    const char *retype;     /* tensor written as type `type`, zero bytes */
    tdm_qtype type;
} edit;

/* Buffers a copy's tensors point at beside the source's, which the writer
 * reads only when it writes the file (me_build frees them after): [0..2]
 * the replicated expert stacks of ffn1 == 2, [ME_ZERO] the retyped tensor's
 * zero bytes. */
enum { ME_REP = 3, ME_ZERO = ME_REP, ME_HELD = ME_ZERO + 1 };

/* Adds blk.1's FFN per e->ffn1; returns false when t is not one of its
 * tensors. held[0..2]: the replicated expert-0 stacks of ffn1 == 2. */
static __attribute__((unused)) bool me_add_ffn1(tdm_gguf_writer *w, const edit *e, const tdm_gguf_tensor *t,
                                                void *held[ME_HELD])
{
    static const char *const exps[ME_REP] = {"blk.1.ffn_gate_exps.weight", "blk.1.ffn_up_exps.weight",
                                             "blk.1.ffn_down_exps.weight"};
    static const char *const dense[ME_REP] = {"blk.1.ffn_gate.weight", "blk.1.ffn_up.weight",
                                              "blk.1.ffn_down.weight"};
    tdm_error err = {0};
    if (e->ffn1 == 1 && !strcmp(t->name, "blk.1.ffn_gate_inp.weight"))
        return true; /* no router: a dense layer */
    for (int i = 0; i < ME_REP; i++) {
        if (strcmp(t->name, exps[i]))
            continue;
        const size_t mat = tdm_qtype_row_bytes(t->type, t->ne[0]) * (size_t)t->ne[1];
        if (e->ffn1 == 1) {
            assert_int_equal(tdm_gguf_writer_add_tensor(w, dense[i], t->type, 2, t->ne, t->data, &err), TDM_OK);
        } else {
            uint8_t *rep = malloc(mat * (size_t)t->ne[2]);
            assert_non_null(rep);
            held[i] = rep;
            for (int64_t x = 0; x < t->ne[2]; x++)
                memcpy(rep + x * mat, t->data, mat);
            assert_int_equal(tdm_gguf_writer_add_tensor(w, t->name, t->type, 3, t->ne, rep, &err), TDM_OK);
        }
        return true;
    }
    return false;
}

/* The metadata of from (u32, f32 and string keys) with e's overrides. */
static __attribute__((unused)) void me_add_metadata(tdm_gguf_writer *w, tdm_gguf *from, const edit *e)
{
    tdm_error err = {0};
    for (int64_t i = 0; i < tdm_gguf_kv_count(from); i++) {
        const char *k = tdm_gguf_kv_key(from, i);
        if (e->drop_key && !strcmp(k, e->drop_key))
            continue;
        switch (tdm_gguf_kv_type(from, i)) {
        case TDM_GGUF_UINT32: {
            uint32_t v;
            assert_int_equal(tdm_gguf_get_u32(from, k, &v, &err), TDM_OK);
            if (e->key && !strcmp(k, e->key))
                v = e->value;
            assert_int_equal(tdm_gguf_writer_add_u32(w, k, v, &err), TDM_OK);
            break;
        }
        case TDM_GGUF_FLOAT32: {
            float v;
            assert_int_equal(tdm_gguf_get_f32(from, k, &v, &err), TDM_OK);
            if (e->fkey && !strcmp(k, e->fkey))
                v = e->fvalue;
            assert_int_equal(tdm_gguf_writer_add_f32(w, k, v, &err), TDM_OK);
            break;
        }
        case TDM_GGUF_STRING: {
            const char *s;
            size_t len;
            assert_int_equal(tdm_gguf_get_str(from, k, &s, &len, &err), TDM_OK);
            if (e->arch && !strcmp(k, "general.architecture"))
                s = e->arch, len = strlen(e->arch);
            assert_int_equal(tdm_gguf_writer_add_strn(w, k, s, len, &err), TDM_OK);
            break;
        }
        default: /* arrays (tokenizer, rope sections) are not needed for binding */
            break;
        }
    }
}

/* The GGUF file of from's copy with edit e, in memory (caller frees). */
static __attribute__((unused)) void *me_build(tdm_gguf *from, const edit *e, size_t *size)
{
    tdm_gguf_writer *w;
    tdm_error err = {0};
    void *held[ME_HELD] = {0};
    assert_int_equal(tdm_gguf_writer_create(&w, &err), TDM_OK);
    me_add_metadata(w, from, e);
    for (int64_t i = 0; i < tdm_gguf_tensor_count(from); i++) {
        const tdm_gguf_tensor *t = tdm_gguf_tensor_at(from, i);
        if ((e->drop && !strcmp(t->name, e->drop)) || (e->ffn1 && me_add_ffn1(w, e, t, held)))
            continue;
        int64_t ne[4] = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
        if (e->reshape && !strcmp(t->name, e->reshape))
            ne[1] /= 2;
        if (e->retype && !strcmp(t->name, e->retype)) {
            const size_t bytes = tdm_qtype_row_bytes(e->type, ne[0]) * (size_t)(ne[1] * ne[2] * ne[3]);
            held[ME_ZERO] = calloc(1, bytes);
            assert_non_null(held[ME_ZERO]);
            assert_int_equal(tdm_gguf_writer_add_tensor(w, t->name, e->type, t->n_dims, ne, held[ME_ZERO], &err),
                             TDM_OK);
            continue;
        }
        assert_int_equal(tdm_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, ne, t->data, &err), TDM_OK);
    }
    void *buf;
    assert_int_equal(tdm_gguf_writer_write_memory(w, &buf, size, &err), TDM_OK);
    tdm_gguf_writer_free(w);
    for (int i = 0; i < ME_HELD; i++)
        free(held[i]);
    return buf;
}

/* Binds from's copy with edit e. TDM_OK: *m and *buf (the file the model
 * reads) are the caller's to free, the model first. Otherwise the binder's
 * status and message, nothing to free. The copy always parses: an edit
 * changes values and tensors, never the file's syntax. */
static __attribute__((unused)) tdm_status me_bind(tdm_gguf *from, const edit *e, tdm_model **m, void **buf,
                                                  tdm_error *err)
{
    size_t size;
    tdm_gguf *g;
    *m = NULL;
    *buf = me_build(from, e, &size);
    assert_int_equal(tdm_gguf_open_memory(*buf, size, &g, err), TDM_OK);
    const tdm_status st = tdm_model_from_gguf(g, m, err); /* owns g, also on failure */
    if (st) {
        free(*buf);
        *buf = NULL;
    }
    return st;
}

/* The sweeps' prompt: n tokens spread over a vocabulary of n_vocab. */
static __attribute__((unused)) void me_tokens(int32_t *toks, int n, int32_t n_vocab)
{
    for (int i = 0; i < n; i++)
        toks[i] = (int32_t)((i * 7919 + 11) % n_vocab);
}

/* "key=value", "key=fvalue" or "tensor->type": what a sweep's edit changed. */
static __attribute__((unused)) void me_describe(const edit *e, char *out, size_t cap)
{
    if (e->key)
        snprintf(out, cap, "%s=%u", e->key, e->value);
    else if (e->fkey)
        snprintf(out, cap, "%s=%g", e->fkey, (double)e->fvalue);
    else if (e->retype)
        snprintf(out, cap, "%s->%s", e->retype, tdm_qtype_name(e->type));
    else
        snprintf(out, cap, "(not a sweep's edit)");
}

/* Called by the sweeps for each edit of from (e lives for the call). */
typedef void (*me_visit_fn)(tdm_gguf *from, const edit *e, void *ctx);

/* Every u32 and f32 metadata key of from set, one at a time, to edge values
 * (u32: the old value -1, +1 and doubled, 0, 1, small, 2^16, 2^31 - 1, 2^31,
 * 2^32 - 1; f32: zeros, tiny, huge, infinities, NaN), each copy handed to
 * visit. Returns the number of keys swept. */
static __attribute__((unused)) int me_sweep_metadata(tdm_gguf *from, me_visit_fn visit, void *ctx)
{
    static const uint32_t uv[] = {0, 1, 2, 3, 7, 64, 65536, 0x7FFFFFFFu, 0x80000000u, 0xFFFFFFFFu};
    static const float fv[] = {0.0f, -0.0f, 1e-38f, 1e-6f, 1.0f, 1e30f, INFINITY, -INFINITY, NAN};
    int keys = 0;
    for (int64_t i = 0; i < tdm_gguf_kv_count(from); i++) {
        const char *k = tdm_gguf_kv_key(from, i);
        tdm_error err = {0};
        if (tdm_gguf_kv_type(from, i) == TDM_GGUF_UINT32) {
            uint32_t v;
            assert_int_equal(tdm_gguf_get_u32(from, k, &v, &err), TDM_OK);
            const uint32_t near[3] = {v - 1, v + 1, 2 * v};
            for (size_t j = 0; j < sizeof uv / sizeof *uv + 3; j++)
                visit(from, &(edit){.key = k, .value = j < 3 ? near[j] : uv[j - 3]}, ctx);
            keys++;
        } else if (tdm_gguf_kv_type(from, i) == TDM_GGUF_FLOAT32) {
            for (size_t j = 0; j < sizeof fv / sizeof *fv; j++)
                visit(from, &(edit){.fkey = k, .fvalue = fv[j]}, ctx);
            keys++;
        }
    }
    return keys;
}

/* Every tensor of blk.0 (DeltaNet in the hybrids), blk.3 (attention) and
 * outside the layers written, one at a time, in each other type whose block
 * divides its rows, with zero bytes (finite in every format), each copy
 * handed to visit. Returns the number of tensors swept. */
static __attribute__((unused)) int me_sweep_types(tdm_gguf *from, me_visit_fn visit, void *ctx)
{
    static const tdm_qtype types[] = {TDM_Q_F32,    TDM_Q_F16,    TDM_Q_BF16,  TDM_Q_F64,   TDM_Q_Q8_0,
                                      TDM_Q_Q4_0,   TDM_Q_Q5_1,   TDM_Q_IQ4_NL, TDM_Q_MXFP4, TDM_Q_Q4_K,
                                      TDM_Q_Q6_K,   TDM_Q_IQ2_XXS, TDM_Q_I8,   TDM_Q_I32};
    int tensors = 0;
    for (int64_t i = 0; i < tdm_gguf_tensor_count(from); i++) {
        const tdm_gguf_tensor *t = tdm_gguf_tensor_at(from, i);
        if (!strncmp(t->name, "blk.", 4) && strncmp(t->name, "blk.0.", 6) && strncmp(t->name, "blk.3.", 6))
            continue; /* blk.0 and blk.3 stand for the rest */
        tensors++;
        for (size_t j = 0; j < sizeof types / sizeof *types; j++)
            if (types[j] != t->type && t->ne[0] % tdm_qtype_get(types[j])->block == 0)
                visit(from, &(edit){.retype = t->name, .type = types[j]}, ctx);
    }
    return tensors;
}

#endif
