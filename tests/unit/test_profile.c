/* test_profile: the expert-usage profile: recording, ranking, JSON round trip,
 * merge, model identity (layout hash of real GGUF files) and the refusal of
 * corrupt, truncated, inconsistent and foreign profiles. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "gguf.h"
#include "gguf_writer.h"
#include "profile.h"

static tdm_model_id test_id(void)
{
    tdm_model_id id = {.arch = "qwen35moe", .layout_hash = 0x0123456789abcdefULL,
                       .n_layer = 3, .n_expert = 6, .k = 2};
    return id;
}

/* 10 tokens with a known distribution: layer l selects {l, l+1} 7 times and
 * {5, 0} 3 times (layer 0: expert 0 then appears 10 times). */
static tdm_profile *make_profile(void)
{
    tdm_model_id id = test_id();
    tdm_profile *p = NULL;
    tdm_error err;
    assert_int_equal(tdm_profile_new(&id, &p, &err), TDM_OK);
    for (int t = 0; t < 10; t++) {
        for (int32_t l = 0; l < 3; l++) {
            int32_t ids[2] = {l, l + 1};
            int32_t alt[2] = {5, 0};
            float w[2] = {0.75f, 0.25f};
            assert_int_equal(tdm_profile_record(p, l, 2, t < 7 ? ids : alt, w, &err), TDM_OK);
        }
        tdm_profile_add_tokens(p, 1);
    }
    assert_int_equal(tdm_profile_set_source(p, "unit test", &err), TDM_OK);
    return p;
}

static char *tmp_path(const char *tag)
{
    static char buf[256];
    snprintf(buf, sizeof buf, "/tmp/tdm_test_profile_%d_%s.json", (int)getpid(), tag);
    return buf;
}

static void test_record_and_rank(void **state)
{
    (void)state;
    tdm_profile *p = make_profile();
    tdm_error err;
    assert_int_equal(tdm_profile_tokens(p), 10);
    assert_int_equal(tdm_profile_count(p, 0, 0), 10);
    assert_int_equal(tdm_profile_count(p, 0, 1), 7);
    assert_int_equal(tdm_profile_count(p, 0, 5), 3);
    assert_int_equal(tdm_profile_count(p, 1, 0), 3);
    assert_float_equal(tdm_profile_weight(p, 0, 0), 7 * 0.75 + 3 * 0.25, 1e-9);
    assert_float_equal(tdm_profile_weight(p, 0, 5), 3 * 0.75, 1e-9);
    /* layer 1: experts 1 and 2 (7 each; 1 has more weight), then 5 and 0 (3
     * each; 5 has more weight), then 3 and 4 (0 each, by id). */
    int32_t r[6];
    assert_int_equal(tdm_profile_rank_layer(p, 1, r, &err), TDM_OK);
    int32_t want[6] = {1, 2, 5, 0, 3, 4};
    assert_memory_equal(r, want, sizeof want);
    /* global: layer 0 expert 0 (10) first, then the 7s by weight, layer, id */
    int32_t g[18];
    tdm_profile_rank_global(p, g);
    assert_int_equal(g[0], 0 * 6 + 0);
    assert_int_equal(g[1], 1 * 6 + 1); /* 7 uses, weight 5.25 */
    assert_int_equal(g[2], 2 * 6 + 2);
    assert_int_equal(g[3], 0 * 6 + 1); /* 7 uses, weight 1.75 */
    assert_int_equal(tdm_profile_rank_layer(p, 3, r, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_profile_validate(p, &err), TDM_OK);
    tdm_profile_free(p);
}

static void test_record_refuses_bad_ids(void **state)
{
    (void)state;
    tdm_profile *p = make_profile();
    tdm_error err;
    int32_t bad[2] = {1, 6}, dup[2] = {3, 3}, ok[2] = {1, 2};
    float w[2] = {0.5f, 0.5f}, nan_w[2] = {0.5f, 0.0f / 0.0f};
    assert_int_equal(tdm_profile_record(p, 0, 2, bad, w, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.msg, "expert id 6"));
    assert_int_equal(tdm_profile_record(p, 0, 2, dup, w, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_profile_record(p, 3, 2, ok, w, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_profile_record(p, 0, 3, ok, w, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_profile_record(p, 0, 2, ok, nan_w, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_profile_count(p, 0, 1), 7); /* nothing changed */
    tdm_profile_free(p);
}

static void test_round_trip(void **state)
{
    (void)state;
    tdm_profile *p = make_profile(), *q = NULL;
    tdm_error err;
    const char *path = tmp_path("rt");
    assert_int_equal(tdm_profile_write(p, path, &err), TDM_OK);
    tdm_model_id id = test_id();
    assert_int_equal(tdm_profile_read(path, &id, &q, &err), TDM_OK);
    assert_int_equal(tdm_profile_tokens(q), 10);
    assert_string_equal(tdm_profile_source(q), "unit test");
    assert_int_equal(tdm_profile_check_model(&id, tdm_profile_id(q), "profile", &err), TDM_OK);
    for (int32_t l = 0; l < 3; l++)
        for (int32_t e = 0; e < 6; e++) {
            assert_int_equal(tdm_profile_count(q, l, e), tdm_profile_count(p, l, e));
            assert_float_equal(tdm_profile_weight(q, l, e), tdm_profile_weight(p, l, e), 1e-6);
        }
    char *a = tdm_profile_to_json(p), *b = tdm_profile_to_json(q);
    assert_string_equal(a, b); /* stable: writing what was read gives the same text */
    free(a);
    free(b);
    tdm_profile_free(q);
    assert_int_equal(tdm_profile_read("/nonexistent/dir/p.json", NULL, &q, &err), TDM_ERR_IO);
    assert_null(q);
    unlink(path);
    tdm_profile_free(p);
}

/* Parses the valid profile's JSON, applies edit, expects the parse to fail
 * with code and a message containing needle. */
static void expect_refused(void (*edit)(cJSON *), tdm_status code, const char *needle)
{
    tdm_profile *p = make_profile(), *q = NULL;
    char *text = tdm_profile_to_json(p);
    cJSON *root = cJSON_Parse(text);
    assert_non_null(root);
    edit(root);
    char *bad = cJSON_PrintUnformatted(root);
    tdm_model_id id = test_id();
    tdm_error err = {0};
    tdm_status st = tdm_profile_parse(bad, strlen(bad), &id, &q, &err);
    if (st != code || !strstr(err.msg, needle))
        print_error("got %s '%s', wanted %s containing '%s'\n", tdm_status_name(st), err.msg,
                    tdm_status_name(code), needle);
    assert_int_equal(st, code);
    assert_non_null(strstr(err.msg, needle));
    assert_null(q);
    free(bad);
    free(text);
    cJSON_Delete(root);
    tdm_profile_free(p);
}

static cJSON *layer_arr(cJSON *root, int l, const char *key)
{
    return cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "layers"), l), key);
}

static void set_num(cJSON *arr, int i, double v)
{
    cJSON_ReplaceItemInArray(arr, i, cJSON_CreateNumber(v));
}

static void e_hash(cJSON *r) { cJSON_ReplaceItemInObject(cJSON_GetObjectItem(r, "model"), "layout_hash", cJSON_CreateString("0123456789abcdee")); }
static void e_arch(cJSON *r) { cJSON_ReplaceItemInObject(cJSON_GetObjectItem(r, "model"), "architecture", cJSON_CreateString("qwen3moe")); }
static void e_nexp(cJSON *r) { cJSON_ReplaceItemInObject(cJSON_GetObjectItem(r, "model"), "n_expert", cJSON_CreateNumber(8)); }
static void e_format(cJSON *r) { cJSON_ReplaceItemInObject(r, "format", cJSON_CreateString("other")); }
static void e_version(cJSON *r) { cJSON_ReplaceItemInObject(r, "version", cJSON_CreateNumber(2)); }
static void e_tokens(cJSON *r) { cJSON_ReplaceItemInObject(r, "tokens", cJSON_CreateNumber(11)); }
static void e_count_sum(cJSON *r) { set_num(layer_arr(r, 1, "count"), 3, 1); }
static void e_count_frac(cJSON *r) { set_num(layer_arr(r, 0, "count"), 0, 9.5); }
static void e_count_neg(cJSON *r) { set_num(layer_arr(r, 2, "count"), 4, -1); }
static void e_short(cJSON *r) { cJSON_DeleteItemFromArray(layer_arr(r, 1, "weight"), 5); }
static void e_layers(cJSON *r) { cJSON_DeleteItemFromArray(cJSON_GetObjectItem(r, "layers"), 2); }
static void e_weight_null(cJSON *r) { cJSON_ReplaceItemInArray(layer_arr(r, 0, "weight"), 1, cJSON_CreateNull()); }
static void e_weight_big(cJSON *r) { set_num(layer_arr(r, 0, "weight"), 1, 8.0); /* count is 7 */ }
static void e_rank_dup(cJSON *r) { set_num(layer_arr(r, 0, "rank"), 1, 0); }
static void e_rank_order(cJSON *r) /* a permutation, but experts 0 and 5 swapped */
{
    cJSON *rk = layer_arr(r, 0, "rank");
    int a = cJSON_GetArrayItem(rk, 0)->valueint;
    set_num(rk, 0, cJSON_GetArrayItem(rk, 5)->valueint);
    set_num(rk, 5, a);
}
static void e_global(cJSON *r) { cJSON_DeleteItemFromArray(cJSON_GetObjectItem(r, "global_rank"), 0); }
static void e_global_dup(cJSON *r)
{
    cJSON *g = cJSON_GetObjectItem(r, "global_rank");
    cJSON_ReplaceItemInArray(g, 1, cJSON_Duplicate(cJSON_GetArrayItem(g, 0), true));
}

static void test_refusals(void **state)
{
    (void)state;
    expect_refused(e_hash, TDM_ERR_INVALID, "another model");
    expect_refused(e_arch, TDM_ERR_INVALID, "architecture 'qwen3moe'");
    expect_refused(e_nexp, TDM_ERR_INVALID, "another model");
    expect_refused(e_format, TDM_ERR_FORMAT, "format");
    expect_refused(e_version, TDM_ERR_UNSUPPORTED, "version 2");
    expect_refused(e_tokens, TDM_ERR_FORMAT, "counts sum");
    expect_refused(e_count_sum, TDM_ERR_FORMAT, "layer 1: counts sum");
    expect_refused(e_count_frac, TDM_ERR_FORMAT, "layers[0].count[0]");
    expect_refused(e_count_neg, TDM_ERR_FORMAT, "layers[2].count[4]");
    expect_refused(e_short, TDM_ERR_FORMAT, "layers[1].weight");
    expect_refused(e_layers, TDM_ERR_FORMAT, "\"layers\"");
    expect_refused(e_weight_null, TDM_ERR_FORMAT, "weight[1] is not a finite number");
    expect_refused(e_weight_big, TDM_ERR_FORMAT, "weight 8");
    expect_refused(e_rank_dup, TDM_ERR_FORMAT, "layers[0].rank");
    expect_refused(e_rank_order, TDM_ERR_FORMAT, "disagrees");
    expect_refused(e_global, TDM_ERR_FORMAT, "global_rank");
    expect_refused(e_global_dup, TDM_ERR_FORMAT, "global_rank");
}

static void expect_text_refused(const char *text, const char *needle)
{
    tdm_profile *q = NULL;
    tdm_error err = {0};
    assert_int_equal(tdm_profile_parse(text, strlen(text), NULL, &q, &err), TDM_ERR_FORMAT);
    if (!strstr(err.msg, needle))
        print_error("message '%s' lacks '%s'\n", err.msg, needle);
    assert_non_null(strstr(err.msg, needle));
    assert_null(q);
}

static void test_corrupt_and_truncated(void **state)
{
    (void)state;
    tdm_profile *p = make_profile();
    char *text = tdm_profile_to_json(p);
    size_t len = strlen(text);
    /* every truncation point of a valid file is refused, none crashes */
    for (size_t cut = 0; cut < len; cut += 7) {
        tdm_profile *q = NULL;
        tdm_error err;
        assert_int_not_equal(tdm_profile_parse(text, cut, NULL, &q, &err), TDM_OK);
        assert_null(q);
    }
    expect_text_refused("{\"format\": \"tandem-expert-profile\", ", "invalid JSON");
    expect_text_refused("[1, 2, 3]", "format");
    expect_text_refused("", "invalid JSON");
    /* NaN and infinities are not JSON; an overflowing literal reads as inf */
    char *nan_text = strdup(text);
    char *w = strstr(nan_text, "\"weight\":");
    assert_non_null(w);
    char *num = strchr(w, '[') + 1;
    while (*num == ' ' || *num == '\n' || *num == '\t')
        num++;
    size_t numlen = strcspn(num, ",]");
    char *with_nan = malloc(len + 16);
    snprintf(with_nan, len + 16, "%.*sNaN%s", (int)(num - nan_text), nan_text, num + numlen);
    expect_text_refused(with_nan, "invalid JSON");
    snprintf(with_nan, len + 16, "%.*s1e999%s", (int)(num - nan_text), nan_text, num + numlen);
    expect_text_refused(with_nan, "not a finite number");
    free(with_nan);
    free(nan_text);
    /* the truncated file on disk */
    const char *path = tmp_path("trunc");
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fwrite(text, 1, len / 2, f);
    fclose(f);
    tdm_profile *q = NULL;
    tdm_error err;
    assert_int_equal(tdm_profile_read(path, NULL, &q, &err), TDM_ERR_FORMAT);
    assert_non_null(strstr(err.msg, path));
    assert_non_null(strstr(err.msg, "truncated"));
    unlink(path);
    free(text);
    tdm_profile_free(p);
}

static void test_merge(void **state)
{
    (void)state;
    tdm_profile *a = make_profile(), *b = make_profile(), *c = NULL;
    tdm_error err;
    assert_int_equal(tdm_profile_merge(a, b, &err), TDM_OK);
    assert_int_equal(tdm_profile_tokens(a), 20);
    assert_int_equal(tdm_profile_count(a, 0, 0), 20);
    assert_float_equal(tdm_profile_weight(a, 0, 5), 2 * 3 * 0.75, 1e-9);
    assert_int_equal(tdm_profile_validate(a, &err), TDM_OK);
    tdm_model_id other = test_id();
    other.layout_hash ^= 1;
    other.n_layer = 4096;
    other.n_expert = 4097; /* more than TDM_PROFILE_MAX_EXPERTS in all */
    assert_int_equal(tdm_profile_new(&other, &c, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.msg, "4096 layers x 4097 experts is more than 16777216"));
    assert_null(c);
    other = test_id();
    other.layout_hash ^= 1;
    assert_int_equal(tdm_profile_new(&other, &c, &err), TDM_OK);
    assert_int_equal(tdm_profile_merge(a, c, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.msg, "another model"));
    assert_int_equal(tdm_profile_tokens(a), 20); /* unchanged */
    tdm_profile_free(a);
    tdm_profile_free(b);
    tdm_profile_free(c);
}

/* A tiny MoE-shaped GGUF; n_expert and the first tensor's shape vary. */
static void *build_gguf(int n_expert, int64_t rows, size_t *size)
{
    tdm_gguf_writer *w = NULL;
    tdm_error err;
    static float data[4096];
    assert_int_equal(tdm_gguf_writer_create(&w, &err), TDM_OK);
    assert_int_equal(tdm_gguf_writer_add_str(w, "general.architecture", "qwen3moe", &err), TDM_OK);
    assert_int_equal(tdm_gguf_writer_add_u32(w, "qwen3moe.block_count", 2, &err), TDM_OK);
    assert_int_equal(tdm_gguf_writer_add_u32(w, "qwen3moe.expert_count", n_expert, &err), TDM_OK);
    assert_int_equal(tdm_gguf_writer_add_u32(w, "qwen3moe.expert_used_count", 2, &err), TDM_OK);
    int64_t ne_a[2] = {32, rows}, ne_b[3] = {32, 8, n_expert};
    assert_int_equal(tdm_gguf_writer_add_tensor(w, "blk.0.ffn_gate_inp.weight", TDM_Q_F32, 2,
                                                ne_a, data, &err), TDM_OK);
    assert_int_equal(tdm_gguf_writer_add_tensor(w, "blk.0.ffn_up_exps.weight", TDM_Q_F32, 3,
                                                ne_b, data, &err), TDM_OK);
    void *buf = NULL;
    assert_int_equal(tdm_gguf_writer_write_memory(w, &buf, size, &err), TDM_OK);
    tdm_gguf_writer_free(w);
    return buf;
}

static void test_model_id_from_gguf(void **state)
{
    (void)state;
    size_t s1, s2, s3;
    void *b1 = build_gguf(8, 8, &s1), *b2 = build_gguf(8, 8, &s2), *b3 = build_gguf(8, 4, &s3);
    tdm_gguf *g1, *g2, *g3;
    tdm_error err;
    assert_int_equal(tdm_gguf_open_memory(b1, s1, &g1, &err), TDM_OK);
    assert_int_equal(tdm_gguf_open_memory(b2, s2, &g2, &err), TDM_OK);
    assert_int_equal(tdm_gguf_open_memory(b3, s3, &g3, &err), TDM_OK);
    tdm_model_id a, b, c;
    assert_int_equal(tdm_profile_model_id(g1, &a, &err), TDM_OK);
    assert_int_equal(tdm_profile_model_id(g2, &b, &err), TDM_OK);
    assert_int_equal(tdm_profile_model_id(g3, &c, &err), TDM_OK);
    assert_string_equal(a.arch, "qwen3moe");
    assert_int_equal(a.n_layer, 2);
    assert_int_equal(a.n_expert, 8);
    assert_int_equal(a.k, 2);
    assert_true(a.layout_hash == b.layout_hash);
    assert_true(a.layout_hash != c.layout_hash); /* one tensor shape differs */
    assert_int_equal(tdm_profile_check_model(&a, &b, "profile", &err), TDM_OK);
    assert_int_equal(tdm_profile_check_model(&a, &c, "profile", &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.msg, "layout_hash"));
    assert_true(tdm_profile_model_hash(&a) != tdm_profile_model_hash(&c));
    tdm_gguf_free(g1);
    tdm_gguf_free(g2);
    tdm_gguf_free(g3);
    free(b1);
    free(b2);
    free(b3);

    /* the demo model: 9 blocks of which 1 is MTP */
    const char *root = getenv("TDM_ROOT");
    char path[1024];
    snprintf(path, sizeof path, "%s/models/demo/demo-Q4_K_M.gguf", root ? root : ".");
    tdm_gguf *g;
    if (tdm_gguf_open(path, &g, &err) != TDM_OK)
        fail_msg("demo model (shipped in the repository): %s", err.msg);
    assert_int_equal(tdm_profile_model_id(g, &a, &err), TDM_OK);
    assert_string_equal(a.arch, "qwen35moe");
    assert_int_equal(a.n_layer, 8);
    assert_int_equal(a.n_expert, 24);
    assert_int_equal(a.k, 4);
    tdm_gguf_free(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_record_and_rank),
        cmocka_unit_test(test_record_refuses_bad_ids),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_corrupt_and_truncated),
        cmocka_unit_test(test_merge),
        cmocka_unit_test(test_model_id_from_gguf),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
