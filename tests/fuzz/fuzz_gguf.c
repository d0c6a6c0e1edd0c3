/* libFuzzer target for the GGUF reader: every input is parsed by
 * tdm_gguf_open_memory (strict and partial); when accepted, every accessor is
 * exercised and every byte a view claims is touched, so ASan reports any
 * view that leaves the input. Built and run by tests/fuzz/run.sh. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"

static volatile uint64_t sink; /* keeps the touched bytes alive */

static void touch(const void *p, size_t n)
{
    const uint8_t *b = p;
    uint64_t s = 0;
    if (n) s += b[0] + b[n - 1] + b[n / 2];
    sink += s;
}

static void array_elem(const tdm_gguf *g, const char *key, uint64_t i)
{
    const char *s;
    size_t len;
    int64_t v;
    double d;
    if (tdm_gguf_arr_str(g, key, i, &s, &len, NULL) == TDM_OK) touch(s, len);
    if (tdm_gguf_arr_int(g, key, i, &v, NULL) == TDM_OK) sink += (uint64_t)v;
    if (tdm_gguf_arr_float(g, key, i, &d, NULL) == TDM_OK) sink += (uint64_t)(d == d);
}

static void exercise(const tdm_gguf *g, const uint8_t *data, size_t size)
{
    tdm_error err;
    sink += tdm_gguf_version(g) + tdm_gguf_alignment(g) + tdm_gguf_data_offset(g) +
            tdm_gguf_file_size(g) + tdm_gguf_data_end(g) + tdm_gguf_complete(g);
    if (tdm_gguf_base(g) != data || tdm_gguf_file_size(g) != size) abort();
    int64_t n_kv = tdm_gguf_kv_count(g);
    for (int64_t i = 0; i < n_kv; i++) {
        const char *key = tdm_gguf_kv_key(g, i);
        if (!key || tdm_gguf_find_key(g, key) != i) abort(); /* keys are unique */
        sink += (uint64_t)tdm_gguf_kv_type(g, i);
        uint32_t u32; uint64_t u64; int64_t i64; float f; bool b; const char *s; size_t len;
        tdm_gguf_vtype et; uint64_t cnt;
        if (tdm_gguf_get_u32(g, key, &u32, &err) == TDM_OK) sink += u32;
        if (tdm_gguf_get_u64(g, key, &u64, &err) == TDM_OK) sink += u64;
        if (tdm_gguf_get_i64(g, key, &i64, &err) == TDM_OK) sink += (uint64_t)i64;
        if (tdm_gguf_get_f32(g, key, &f, &err) == TDM_OK) sink += (uint64_t)(f == f);
        double d;
        if (tdm_gguf_get_f64(g, key, &d, &err) == TDM_OK) sink += (uint64_t)(d == d);
        if (tdm_gguf_get_bool(g, key, &b, &err) == TDM_OK) sink += b;
        if (tdm_gguf_get_str(g, key, &s, &len, &err) == TDM_OK) touch(s, len);
        if (tdm_gguf_get_arr(g, key, &et, &cnt, &err) == TDM_OK) {
            sink += et;
            if (cnt) {
                array_elem(g, key, 0);
                array_elem(g, key, cnt / 2);
                array_elem(g, key, cnt - 1);
            }
            array_elem(g, key, cnt); /* out of range: must fail cleanly */
            /* small arrays: every element */
            for (uint64_t k = 0; k < cnt && k < 64; k++) array_elem(g, key, k);
        }
    }
    sink += (uint64_t)tdm_gguf_find_key(g, "general.architecture");
    tdm_gguf_kv_key(g, n_kv);
    tdm_gguf_kv_type(g, -1);
    int64_t n_t = tdm_gguf_tensor_count(g);
    for (int64_t i = 0; i < n_t; i++) {
        const tdm_gguf_tensor *t = tdm_gguf_tensor_at(g, i);
        if (!t || tdm_gguf_find_tensor(g, t->name) != t) abort(); /* names are unique */
        if (t->n_dims < 1 || t->n_dims > 4 || !tdm_qtype_get(t->type)) abort();
        if (t->offset % tdm_gguf_alignment(g)) abort();
        sink += strlen(t->name);
        if (t->data) touch(t->data, (size_t)t->nbytes);
        tdm_gguf_check_tensor_data(t, &err);
    }
    tdm_gguf_tensor_at(g, n_t);
    tdm_gguf_find_tensor(g, "token_embd.weight");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tdm_gguf *g = NULL;
    tdm_error err;
    if (tdm_gguf_open_memory(data, size, &g, &err) == TDM_OK) {
        if (!tdm_gguf_complete(g)) abort(); /* strict open never accepts missing data */
        exercise(g, data, size);
        tdm_gguf_free(g);
    } else if (g || err.code != TDM_ERR_FORMAT || !err.msg[0]) {
        abort(); /* a rejection is always FORMAT with a message, and leaves no object */
    }
    if (tdm_gguf_open_memory_ex(data, size, TDM_GGUF_OPEN_PARTIAL, &g, &err) == TDM_OK) {
        exercise(g, data, size);
        tdm_gguf_free(g);
    }
    return 0;
}
