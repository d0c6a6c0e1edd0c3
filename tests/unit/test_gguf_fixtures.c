/* test_gguf_fixtures: every fixture GGUF opens through the reader, every
 * tensor view is consistent, and known facts (architecture, layer count,
 * hidden size, tensor counts, types and shapes, vocabulary) hold. The
 * extended set (../shared/fixtures) is used when present; the test says
 * which set ran. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"

static const char *root(void)
{
    const char *r = getenv("TDM_ROOT");
    return r && r[0] ? r : ".";
}

#define OK(expr)                                                                    \
    do {                                                                            \
        tdm_error e_ = {0};                                                         \
        tdm_status s_ = (expr);                                                     \
        if (s_ != TDM_OK) fail_msg("%s -> %s: %s", #expr, tdm_status_name(s_), e_.msg); \
    } while (0)
#define E (&e_)

/* Checks every tensor against facts the reader must not get wrong. */
static void check_tensors_consistent(const tdm_gguf *g)
{
    const uint8_t *base = tdm_gguf_base(g);
    uint64_t data = tdm_gguf_data_offset(g);
    assert_int_equal(data % tdm_gguf_alignment(g), 0);
    for (int64_t i = 0; i < tdm_gguf_tensor_count(g); i++) {
        const tdm_gguf_tensor *t = tdm_gguf_tensor_at(g, i);
        assert_ptr_equal(tdm_gguf_find_tensor(g, t->name), t);
        const tdm_qtype_info *q = tdm_qtype_get(t->type);
        assert_non_null(q);
        assert_true(t->n_dims >= 1 && t->n_dims <= 4);
        for (uint32_t d = t->n_dims; d < 4; d++) assert_int_equal(t->ne[d], 1);
        uint64_t nbytes = tdm_qtype_row_bytes(t->type, t->ne[0]) * (uint64_t)(t->ne[1] * t->ne[2] * t->ne[3]);
        assert_int_equal(t->nbytes, nbytes);
        assert_ptr_equal(t->data, base + data + t->offset);
        assert_true(data + t->offset + t->nbytes <= tdm_gguf_file_size(g));
        tdm_error err = {0};
        if (tdm_gguf_check_tensor_data(t, &err) != TDM_OK) fail_msg("%s", err.msg);
    }
}

static tdm_gguf *open_fixture(const char *rel)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", root(), rel);
    tdm_gguf *g = NULL;
    tdm_error err = {0};
    if (tdm_gguf_open(path, &g, &err) != TDM_OK) fail_msg("%s: %s", path, err.msg);
    check_tensors_consistent(g);
    return g;
}

static uint32_t u32_of(const tdm_gguf *g, const char *key)
{
    uint32_t v = 0;
    tdm_error err = {0};
    if (tdm_gguf_get_u32(g, key, &v, &err)) fail_msg("%s", err.msg);
    return v;
}

static void check_str(const tdm_gguf *g, const char *key, const char *expect)
{
    const char *s; size_t n;
    tdm_error err = {0};
    if (tdm_gguf_get_str(g, key, &s, &n, &err)) fail_msg("%s", err.msg);
    if (n != strlen(expect) || memcmp(s, expect, n)) fail_msg("%s = '%.*s', expected '%s'", key, (int)n, s, expect);
}

static void check_shape(const tdm_gguf *g, const char *name, tdm_qtype type, int64_t a, int64_t b, int64_t c)
{
    const tdm_gguf_tensor *t = tdm_gguf_find_tensor(g, name);
    if (!t) fail_msg("tensor %s missing", name);
    if ((int)type >= 0 && t->type != type)
        fail_msg("%s: type %s, expected %s", name, tdm_qtype_name(t->type), tdm_qtype_name(type));
    if (t->ne[0] != a || t->ne[1] != b || t->ne[2] != c)
        fail_msg("%s: ne [%lld %lld %lld], expected [%lld %lld %lld]", name, (long long)t->ne[0],
                 (long long)t->ne[1], (long long)t->ne[2], (long long)a, (long long)b, (long long)c);
}

static void check_vocab(const tdm_gguf *g, uint64_t n_vocab)
{
    tdm_gguf_vtype et; uint64_t n; const char *s; size_t len;
    OK(tdm_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n, E));
    assert_int_equal(et, TDM_GGUF_STRING);
    assert_int_equal(n, n_vocab);
    OK(tdm_gguf_arr_str(g, "tokenizer.ggml.tokens", n - 1, &s, &len, E));
    assert_true(len > 0);
    OK(tdm_gguf_get_arr(g, "tokenizer.ggml.token_type", &et, &n, E));
    assert_int_equal(n, n_vocab);
}

static void test_fixture_micro_qwen3moe(void **state)
{
    (void)state;
    tdm_gguf *g = open_fixture("tests/fixtures/micro-qwen3moe/micro-qwen3moe-f32.gguf");
    check_str(g, "general.architecture", "qwen3moe");
    check_str(g, "tokenizer.ggml.pre", "qwen2");
    assert_int_equal(tdm_gguf_tensor_count(g), 3 + 3 * 12);
    assert_int_equal(u32_of(g, "qwen3moe.block_count"), 3);
    assert_int_equal(u32_of(g, "qwen3moe.embedding_length"), 64);
    assert_int_equal(u32_of(g, "qwen3moe.expert_count"), 8);
    assert_int_equal(u32_of(g, "qwen3moe.expert_used_count"), 2);
    assert_int_equal(u32_of(g, "qwen3moe.attention.head_count"), 4);
    assert_int_equal(u32_of(g, "qwen3moe.attention.head_count_kv"), 2);
    float f;
    OK(tdm_gguf_get_f32(g, "qwen3moe.rope.freq_base", &f, E));
    assert_true(f == 1e6f);
    check_shape(g, "token_embd.weight", TDM_Q_F32, 64, 2048, 1);
    check_shape(g, "blk.2.ffn_gate_exps.weight", TDM_Q_F32, 64, 32, 8);
    check_shape(g, "blk.2.ffn_down_exps.weight", TDM_Q_F32, 32, 64, 8);
    check_shape(g, "blk.0.attn_k.weight", TDM_Q_F32, 64, 32, 1);
    check_vocab(g, 2048);
    tdm_gguf_free(g);
}

static void test_fixture_micro_hybrid(void **state)
{
    (void)state;
    static const struct { const char *path, *arch; int64_t n_t; } k[] = {
        {"tests/fixtures/micro-qwen35moe/micro-qwen35moe-f32.gguf", "qwen35moe", 95},
        {"tests/fixtures/micro-qwen3next/micro-qwen3next-f32.gguf", "qwen3next", 91},
    };
    for (int i = 0; i < 2; i++) {
        tdm_gguf *g = open_fixture(k[i].path);
        char key[64];
        check_str(g, "general.architecture", k[i].arch);
        assert_int_equal(tdm_gguf_tensor_count(g), k[i].n_t);
        snprintf(key, sizeof key, "%s.block_count", k[i].arch);
        assert_int_equal(u32_of(g, key), 5);
        snprintf(key, sizeof key, "%s.embedding_length", k[i].arch);
        assert_int_equal(u32_of(g, key), 64);
        check_shape(g, "blk.4.ffn_up_exps.weight", TDM_Q_F32, 64, 32, 8);
        check_shape(g, "blk.4.ffn_up_shexp.weight", TDM_Q_F32, 64, 48, 1);
        check_vocab(g, 2048);
        tdm_gguf_free(g);
    }
}

static void test_fixture_small_and_demo(void **state)
{
    (void)state;
    tdm_gguf *g = open_fixture("tests/fixtures/small-qwen35moe/small-qwen35moe-Q4_K_M.gguf");
    check_str(g, "general.architecture", "qwen35moe");
    check_str(g, "tokenizer.ggml.pre", "qwen35");
    assert_int_equal(tdm_gguf_tensor_count(g), 76);
    assert_int_equal(u32_of(g, "qwen35moe.block_count"), 4);
    assert_int_equal(u32_of(g, "qwen35moe.embedding_length"), 256);
    assert_int_equal(u32_of(g, "general.file_type"), 15);
    check_shape(g, "blk.0.ffn_gate_exps.weight", TDM_Q_Q4_K, 256, 256, 8);
    check_shape(g, "blk.0.attn_qkv.weight", TDM_Q_Q8_0, 256, 512, 1);
    check_vocab(g, 2048);
    tdm_gguf_free(g);

    g = open_fixture("models/demo/demo-Q4_K_M.gguf");
    check_str(g, "general.architecture", "qwen35moe");
    assert_int_equal(tdm_gguf_tensor_count(g), 169);
    assert_int_equal(u32_of(g, "qwen35moe.block_count"), 9); /* 8 + the MTP block */
    assert_int_equal(u32_of(g, "qwen35moe.nextn_predict_layers"), 1);
    assert_int_equal(u32_of(g, "qwen35moe.expert_count"), 24);
    assert_int_equal(u32_of(g, "qwen35moe.expert_used_count"), 4);
    check_shape(g, "blk.0.ffn_gate_exps.weight", TDM_Q_Q4_K, 256, 256, 24);
    check_shape(g, "blk.0.ffn_down_exps.weight", TDM_Q_Q6_K, 256, 256, 24);
    check_shape(g, "output.weight", TDM_Q_Q6_K, 256, 8192, 1);
    assert_non_null(tdm_gguf_find_tensor(g, "blk.8.nextn.eh_proj.weight"));
    tdm_gguf_vtype et; uint64_t n; int64_t v;
    OK(tdm_gguf_get_arr(g, "qwen35moe.rope.dimension_sections", &et, &n, E));
    assert_int_equal(et, TDM_GGUF_INT32);
    assert_int_equal(n, 4);
    OK(tdm_gguf_arr_int(g, "qwen35moe.rope.dimension_sections", 0, &v, E));
    assert_true(v > 0);
    check_vocab(g, 8192);
    tdm_gguf_free(g);
}

/* Extended set: every small-qwen35moe-*.gguf in ../shared/fixtures. */
static void test_fixture_shared(void **state)
{
    (void)state;
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/../shared/fixtures/small-qwen35moe", root());
    DIR *d = opendir(dir);
    if (!d) {
        print_message("  extended fixtures: %s absent, vendored set only\n", dir);
        return;
    }
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *nm = de->d_name;
        size_t l = strlen(nm);
        if (strncmp(nm, "small-qwen35moe-", 16) || l < 21 || strcmp(nm + l - 5, ".gguf")) continue;
        char rel[1200], tname[32];
        snprintf(rel, sizeof rel, "../shared/fixtures/small-qwen35moe/%s", nm);
        /* small-qwen35moe-<TYPE>.gguf: the experts are <TYPE> ("Q4_K_M" -> Q4_K, "bf16" -> BF16) */
        snprintf(tname, sizeof tname, "%.*s", (int)(l - 21), nm + 16);
        for (char *c = tname; *c; c++) *c = (char)(*c >= 'a' && *c <= 'z' ? *c - 32 : *c);
        size_t tl = strlen(tname);
        if (tl > 2 && (strcmp(tname + tl - 2, "_M") == 0 || strcmp(tname + tl - 2, "_S") == 0)) tname[tl - 2] = 0;
        tdm_gguf *g = open_fixture(rel);
        check_str(g, "general.architecture", "qwen35moe");
        assert_int_equal(tdm_gguf_tensor_count(g), 76);
        assert_int_equal(u32_of(g, "qwen35moe.block_count"), 4);
        check_shape(g, "blk.3.ffn_gate_exps.weight", (tdm_qtype)-1, 256, 256, 8);
        const char *got = tdm_qtype_name(tdm_gguf_find_tensor(g, "blk.0.ffn_gate_exps.weight")->type);
        if (strcmp(got, tname)) fail_msg("%s: experts are %s, expected %s", nm, got, tname);
        check_vocab(g, 2048);
        print_message("  extended fixture %s: ok (experts %s)\n", nm, got);
        tdm_gguf_free(g);
        n++;
    }
    closedir(d);
    assert_true(n >= 1);
    print_message("  extended fixtures: %d files checked\n", n);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_micro_qwen3moe),
        cmocka_unit_test(test_fixture_micro_hybrid),
        cmocka_unit_test(test_fixture_small_and_demo),
        cmocka_unit_test(test_fixture_shared),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
