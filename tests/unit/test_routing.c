/* test_routing: the routing dump: byte layout, round trip, token grouping,
 * and refusal of truncated, corrupt and foreign dumps. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "routing.h"

static tdm_model_id test_id(void)
{
    tdm_model_id id = {.arch = "qwen3moe", .layout_hash = 42, .n_layer = 3, .n_expert = 300,
                       .k = 2};
    return id;
}

static const char *tmp_path(const char *tag)
{
    static char buf[256];
    snprintf(buf, sizeof buf, "/tmp/tdm_test_routing_%d_%s.bin", (int)getpid(), tag);
    return buf;
}

static unsigned char *slurp(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *size = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*size + 64);
    assert_int_equal(fread(b, 1, *size, f), *size);
    fclose(f);
    return b;
}

/* Two sequences: pos 0,1 (3 layers each), then pos 0 again (layers 0, 2). */
static void write_sample(const char *path)
{
    tdm_model_id id = test_id();
    tdm_routing_writer *w;
    tdm_error err;
    assert_int_equal(tdm_routing_writer_open(path, &id, &w, &err), TDM_OK);
    int32_t pos[8] = {0, 0, 0, 1, 1, 1, 0, 0}, layer[8] = {0, 1, 2, 0, 1, 2, 0, 2};
    for (int i = 0; i < 8; i++) {
        int32_t ids[2] = {i * 37 % 300, 299 - i};
        float wt[2] = {0.625f, 0.375f};
        assert_int_equal(tdm_routing_writer_add(w, pos[i], layer[i], ids, wt, &err), TDM_OK);
    }
    assert_int_equal(tdm_routing_writer_close(w, &err), TDM_OK);
}

static void test_layout_and_round_trip(void **state)
{
    (void)state;
    const char *path = tmp_path("rt");
    write_sample(path);
    size_t size;
    unsigned char *b = slurp(path, &size);
    assert_int_equal(size, 32 + 8 * (6 + 6 * 2));
    assert_memory_equal(b, "TDMROUTE", 8);
    assert_int_equal(b[8], 1);   /* version */
    assert_int_equal(b[12], 3);  /* n_layer */
    assert_int_equal(b[16] | b[17] << 8, 300);
    assert_int_equal(b[20], 2);  /* k */
    /* record 3: pos 1, layer 0, ids {111, 296} */
    const unsigned char *r = b + 32 + 3 * 18;
    assert_int_equal(r[0], 1);
    assert_int_equal(r[4], 0);
    assert_int_equal(r[6] | r[7] << 8, 111);
    assert_int_equal(r[8] | r[9] << 8, 296);
    free(b);

    tdm_routing *rt;
    tdm_error err;
    assert_int_equal(tdm_routing_read(path, &rt, &err), TDM_OK);
    assert_int_equal(rt->n_records, 8);
    assert_int_equal(rt->n_tokens, 3);
    assert_int_equal(rt->k, 2);
    assert_int_equal(rt->n_expert, 300);
    int64_t tok[8] = {0, 0, 0, 1, 1, 1, 2, 2};
    for (int i = 0; i < 8; i++) {
        assert_int_equal(rt->token[i], tok[i]);
        assert_int_equal(rt->ids[2 * i], i * 37 % 300);
        assert_int_equal(rt->ids[2 * i + 1], 299 - i);
        assert_true(rt->weights[2 * i] == 0.625f);
    }
    assert_int_equal(rt->layer[7], 2);
    tdm_model_id id = test_id();
    assert_int_equal(tdm_routing_check_model(rt, &id, &err), TDM_OK);
    id.layout_hash++;
    assert_int_equal(tdm_routing_check_model(rt, &id, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.msg, "another model"));
    id = test_id();
    id.k = 3;
    assert_int_equal(tdm_routing_check_model(rt, &id, &err), TDM_ERR_INVALID);
    tdm_routing_free(rt);
    unlink(path);
}

static void test_writer_refuses(void **state)
{
    (void)state;
    const char *path = tmp_path("w");
    tdm_model_id id = test_id();
    tdm_routing_writer *w;
    tdm_error err;
    assert_int_equal(tdm_routing_writer_open(path, &id, &w, &err), TDM_OK);
    int32_t ok[2] = {1, 2}, dup[2] = {4, 4}, big[2] = {1, 300};
    float wt[2] = {0.5f, 0.5f}, bad_w[2] = {0.5f, -0.25f};
    assert_int_equal(tdm_routing_writer_add(w, 0, 1, ok, wt, &err), TDM_OK);
    assert_int_equal(tdm_routing_writer_add(w, 0, 1, ok, wt, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.msg, "not token-major"));
    assert_int_equal(tdm_routing_writer_add(w, 0, 0, ok, wt, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_routing_writer_add(w, 0, 2, dup, wt, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_routing_writer_add(w, 0, 2, big, wt, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_routing_writer_add(w, 0, 2, ok, bad_w, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_routing_writer_add(w, 0, 3, ok, wt, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_routing_writer_add(w, -1, 0, ok, wt, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_routing_writer_add(w, 1, 0, ok, wt, &err), TDM_OK);
    assert_int_equal(tdm_routing_writer_close(w, &err), TDM_OK);
    tdm_routing *rt;
    assert_int_equal(tdm_routing_read(path, &rt, &err), TDM_OK);
    assert_int_equal(rt->n_records, 2); /* only the valid records were written */
    tdm_routing_free(rt);
    unlink(path);
    id.k = 0;
    assert_int_equal(tdm_routing_writer_open(path, &id, &w, &err), TDM_ERR_INVALID);
    id = test_id();
    assert_int_equal(tdm_routing_writer_open("/nonexistent/dir/x.bin", &id, &w, &err), TDM_ERR_IO);
}

/* Parses b after patch(b) and expects code with needle in the message. */
static void expect_bad(const unsigned char *orig, size_t size, size_t at, const void *bytes,
                       size_t n, tdm_status code, const char *needle)
{
    unsigned char *b = malloc(size + 1);
    memcpy(b, orig, size);
    memcpy(b + at, bytes, n);
    tdm_routing *rt = NULL;
    tdm_error err = {0};
    tdm_status st = tdm_routing_parse(b, size, &rt, &err);
    if (st != code || !strstr(err.msg, needle))
        print_error("got %s '%s', wanted '%s'\n", tdm_status_name(st), err.msg, needle);
    assert_int_equal(st, code);
    assert_non_null(strstr(err.msg, needle));
    assert_null(rt);
    free(b);
}

static void test_reader_refuses(void **state)
{
    (void)state;
    const char *path = tmp_path("bad");
    write_sample(path);
    size_t size;
    unsigned char *b = slurp(path, &size);
    tdm_routing *rt = NULL;
    tdm_error err;
    /* every truncation that is not a record boundary is refused */
    for (size_t cut = 0; cut < size; cut++) {
        tdm_status st = tdm_routing_parse(b, cut, &rt, &err);
        bool boundary = cut >= 32 && (cut - 32) % 18 == 0;
        assert_int_equal(st == TDM_OK, boundary);
        tdm_routing_free(rt);
        rt = NULL;
    }
    assert_int_equal(tdm_routing_parse(b, size - 5, &rt, &err), TDM_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "truncated"));
    unsigned char zero2[2] = {0, 0}, big_id[2] = {0x2c, 0x01} /* 300 */, layer3[2] = {3, 0};
    unsigned char v2[4] = {2, 0, 0, 0}, k0[4] = {0, 0, 0, 0}, neg[4] = {0xff, 0xff, 0xff, 0xff};
    unsigned char nan_f[4] = {0, 0, 0xc0, 0x7f};
    expect_bad(b, size, 0, "TDMROUTX", 8, TDM_ERR_FORMAT, "magic");
    expect_bad(b, size, 8, v2, 4, TDM_ERR_UNSUPPORTED, "version 2");
    expect_bad(b, size, 20, k0, 4, TDM_ERR_FORMAT, "k 0");
    expect_bad(b, size, 12, k0, 4, TDM_ERR_FORMAT, "n_layer 0");
    /* shapes past the profiles' limits: 4097 layers; 4096 x 4097 experts (> 2^24) */
    unsigned char l4097[4] = {0x01, 0x10, 0, 0}, l4096[4] = {0x00, 0x10, 0, 0};
    expect_bad(b, size, 12, l4097, 4, TDM_ERR_FORMAT, "n_layer 4097");
    unsigned char *wide = malloc(size);
    memcpy(wide, b, size);
    memcpy(wide + 12, l4096, 4);
    expect_bad(wide, size, 16, l4097, 4, TDM_ERR_FORMAT, "4096 layers x 4097 experts is more than 16777216");
    free(wide);
    expect_bad(b, size, 32 + 18 + 6, big_id, 2, TDM_ERR_FORMAT, "expert id 300");
    expect_bad(b, size, 32 + 18 + 4, layer3, 2, TDM_ERR_FORMAT, "layer 3");
    /* record 2 (layer 2) becomes layer 0 again within pos 0 */
    expect_bad(b, size, 32 + 2 * 18 + 4, zero2, 2, TDM_ERR_FORMAT, "not token-major");
    expect_bad(b, size, 32 + 18 * 5, neg, 4, TDM_ERR_FORMAT, "pos -1");
    expect_bad(b, size, 32 + 18 * 4 + 10, nan_f, 4, TDM_ERR_FORMAT, "weight nan");
    /* record 0's second id equals its first */
    expect_bad(b, size, 32 + 8, b + 32 + 6, 2, TDM_ERR_FORMAT, "repeated");
    assert_int_equal(tdm_routing_read("/nonexistent/x.bin", &rt, &err), TDM_ERR_IO);
    free(b);
    unlink(path);
}

static void test_empty_dump(void **state)
{
    (void)state;
    const char *path = tmp_path("empty");
    tdm_model_id id = test_id();
    tdm_routing_writer *w;
    tdm_error err;
    assert_int_equal(tdm_routing_writer_open(path, &id, &w, &err), TDM_OK);
    assert_int_equal(tdm_routing_writer_close(w, &err), TDM_OK);
    tdm_routing *rt;
    assert_int_equal(tdm_routing_read(path, &rt, &err), TDM_OK);
    assert_int_equal(rt->n_records, 0);
    assert_int_equal(rt->n_tokens, 0);
    tdm_routing_free(rt);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_and_round_trip),
        cmocka_unit_test(test_writer_refuses),
        cmocka_unit_test(test_reader_refuses),
        cmocka_unit_test(test_empty_dump),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
