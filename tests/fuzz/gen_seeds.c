/* Writes a few small valid GGUF files (seed corpus for fuzz_gguf) into the
 * directory given as argv[1], using the project's writer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf_writer.h"

static int check(tdm_status st, const tdm_error *err, const char *what)
{
    if (st != TDM_OK) {
        fprintf(stderr, "gen_seeds: %s: %s\n", what, err->msg);
        exit(1);
    }
    return 0;
}
#define CK(call) check((call), &err, #call)

static void emit(tdm_gguf_writer *w, const char *dir, const char *name)
{
    tdm_error err;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    CK(tdm_gguf_writer_write_file(w, path, &err));
    tdm_gguf_writer_free(w);
}

static void seed_all_types(const char *dir, uint32_t version, uint32_t align, const char *name)
{
    tdm_gguf_writer *w;
    tdm_error err;
    static uint8_t data[4096];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (uint8_t)(i * 37u);
    CK(tdm_gguf_writer_create(&w, &err));
    CK(tdm_gguf_writer_set_version(w, version, &err));
    if (align) CK(tdm_gguf_writer_set_alignment(w, align, &err));
    CK(tdm_gguf_writer_add_str(w, "general.architecture", "qwen3moe", &err));
    CK(tdm_gguf_writer_add_u8(w, "a.u8", 7, &err));
    CK(tdm_gguf_writer_add_i8(w, "a.i8", -7, &err));
    CK(tdm_gguf_writer_add_u16(w, "a.u16", 700, &err));
    CK(tdm_gguf_writer_add_i16(w, "a.i16", -700, &err));
    CK(tdm_gguf_writer_add_u32(w, "qwen3moe.block_count", 2, &err));
    CK(tdm_gguf_writer_add_i32(w, "a.i32", -70000, &err));
    CK(tdm_gguf_writer_add_f32(w, "qwen3moe.rope.freq_base", 1e6f, &err));
    CK(tdm_gguf_writer_add_bool(w, "a.bool", true, &err));
    CK(tdm_gguf_writer_add_u64(w, "a.u64", 1ull << 40, &err));
    CK(tdm_gguf_writer_add_i64(w, "a.i64", -(1ll << 40), &err));
    CK(tdm_gguf_writer_add_f64(w, "a.f64", 0.5, &err));
    const char *toks[] = {"<a>", "b", "", "ccc"};
    CK(tdm_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, 4, &err));
    int32_t tt[4] = {1, 1, 3, 1};
    CK(tdm_gguf_writer_add_arr(w, "tokenizer.ggml.token_type", TDM_GGUF_INT32, tt, 4, &err));
    float fa[2] = {1.0f, -2.0f};
    CK(tdm_gguf_writer_add_arr(w, "a.farr", TDM_GGUF_FLOAT32, fa, 2, &err));
    uint8_t nested[12 + 12 + 1 + 12] = {0};
    nested[0] = TDM_GGUF_ARRAY; nested[4] = 2;              /* 2 arrays: */
    nested[12] = TDM_GGUF_UINT8; nested[16] = 1; nested[24] = 5; /* [u8 5] */
    nested[25] = TDM_GGUF_INT16;                             /* [] of int16 */
    CK(tdm_gguf_writer_add_raw(w, "a.nested", TDM_GGUF_ARRAY, nested, sizeof nested, &err));
    int64_t ne_a[] = {32, 2}, ne_b[] = {256, 1, 2}, ne_c[] = {8};
    CK(tdm_gguf_writer_add_tensor(w, "token_embd.weight", TDM_Q_Q8_0, 2, ne_a, data, &err));
    CK(tdm_gguf_writer_add_tensor(w, "blk.0.ffn_up_exps.weight", TDM_Q_Q4_K, 3, ne_b, data, &err));
    CK(tdm_gguf_writer_add_tensor(w, "output_norm.weight", TDM_Q_F32, 1, ne_c, data, &err));
    CK(tdm_gguf_writer_add_tensor(w, "empty", TDM_Q_BF16, 1, (int64_t[]){0}, NULL, &err));
    emit(w, dir, name);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: gen_seeds DIR\n");
        return 2;
    }
    tdm_gguf_writer *w;
    tdm_error err;
    seed_all_types(argv[1], 3, 0, "seed-all-v3.gguf");
    seed_all_types(argv[1], 2, 64, "seed-all-v2-a64.gguf");
    seed_all_types(argv[1], 3, 1, "seed-all-a1.gguf");
    CK(tdm_gguf_writer_create(&w, &err));
    emit(w, argv[1], "seed-empty.gguf");
    CK(tdm_gguf_writer_create(&w, &err));
    CK(tdm_gguf_writer_add_str(w, "general.name", "kv only", &err));
    emit(w, argv[1], "seed-kv-only.gguf");
    return 0;
}
