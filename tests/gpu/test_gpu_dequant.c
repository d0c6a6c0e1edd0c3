/* test_gpu_dequant: the GPU dequantisation table (gpu_quant.cuh), run on the
 * host through tdm_gpu_dequant_row_host, must equal ggml's reference bit for
 * bit: on the fixture vectors (real llama-quantize rows) and on fresh random
 * rows against tdm_dequant_row. Needs no device. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "../unit/model_fixtures.h"
#include "gpu_testutil.h"



static void test_fixture_vectors(void **state)
{
    (void)state;
    const char *root = getenv("TDM_ROOT") ? getenv("TDM_ROOT") : ".";
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/quant/manifest.json", root);
    size_t len;
    char *js = fx_read(path, &len);
    if (!js)
        fail_msg("cannot read %s", path);
    cJSON *m = cJSON_Parse(js);
    assert_non_null(m);
    cJSON *c;
    int checked = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(m, "cases"))
    {
        const char *id = cJSON_GetObjectItem(c, "id")->valuestring;
        int ti = tdm_qtype_from_name(cJSON_GetObjectItem(c, "type")->valuestring);
        if (ti < 0)
            fail_msg("fixture %s: unknown type", id);
        tdm_qtype t = (tdm_qtype)ti;
        int ne0 = cJSON_GetObjectItem(c, "ne0")->valueint, rows = cJSON_GetObjectItem(c, "rows")->valueint;
        if (!tdm_gpu_type_supported(t))
            fail_msg("fixture type %s has no GPU kernel", id);
        size_t ql, fl;
        snprintf(path, sizeof path, "%s/tests/fixtures/quant/%s.q", root, id);
        uint8_t *q = (uint8_t *)fx_read(path, &ql);
        snprintf(path, sizeof path, "%s/tests/fixtures/quant/%s.f32", root, id);
        float *want = (float *)fx_read(path, &fl);
        assert_non_null(q);
        assert_non_null(want);
        size_t rb = tdm_qtype_row_bytes(t, ne0);
        assert_int_equal(ql, rb * rows);
        assert_int_equal(fl, (size_t)ne0 * rows * 4);
        float *got = malloc((size_t)ne0 * sizeof *got);
        for (int r = 0; r < rows; r++) {
            tdm_error e = {0};
            assert_int_equal(tdm_gpu_dequant_row_host(t, q + r * rb, got, ne0, &e), TDM_OK);
            if (memcmp(got, want + (size_t)r * ne0, (size_t)ne0 * 4) != 0) {
                for (int i = 0; i < ne0; i++)
                    if (memcmp(&got[i], &want[(size_t)r * ne0 + i], 4))
                        fail_msg("%s row %d elem %d: %.9g != %.9g", id, r, i, (double)got[i],
                                 (double)want[(size_t)r * ne0 + i]);
            }
        }
        printf("  fixture %-8s %d rows of %d: bit-exact\n", id, rows, ne0);
        checked++;
        free(got);
        free(q);
        free(want);
    }
    assert_true(checked >= 15);
    cJSON_Delete(m);
    free(js);
}

static void test_random_rows(void **state)
{
    (void)state;
    rng_seed_fresh();
    const int64_t n = 1024;
    uint8_t *row = malloc(tdm_qtype_row_bytes(TDM_Q_F32, n));
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    for (size_t ti = 0; ti < N_GPU_TYPES; ti++) {
        tdm_qtype t = k_gpu_types[ti];
        for (int rep = 0; rep < 200; rep++) {
            rand_row(t, row, n);
            tdm_error e = {0};
            assert_int_equal(tdm_dequant_row(t, row, a, n, &e), TDM_OK);
            assert_int_equal(tdm_gpu_dequant_row_host(t, row, b, n, &e), TDM_OK);
            for (int64_t i = 0; i < n; i++) {
                if (!isfinite(a[i]))
                    fail_msg("%s: random row produced a non-finite value", tdm_qtype_name(t));
                if (memcmp(&a[i], &b[i], 4))
                    fail_msg("%s rep %d elem %lld: gpu table %.9g != reference %.9g",
                             tdm_qtype_name(t), rep, (long long)i, (double)b[i], (double)a[i]);
            }
        }
        printf("  random %-8s 200 rows of %lld: bit-exact\n", tdm_qtype_name(t), (long long)n);
    }
    free(row);
    free(a);
    free(b);
}

static void test_rejects(void **state)
{
    (void)state;
    uint8_t buf[512] = {0};
    float out[256];
    tdm_error e = {0};
    assert_int_equal(tdm_gpu_dequant_row_host(TDM_Q_IQ2_XXS, buf, out, 256, &e), TDM_ERR_UNSUPPORTED);
    assert_int_equal(tdm_gpu_dequant_row_host(TDM_Q_Q4_K, buf, out, 100, &e), TDM_ERR_INVALID);
    assert_false(tdm_gpu_type_supported(TDM_Q_Q8_K));
    assert_true(tdm_gpu_type_supported(TDM_Q_MXFP4));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_vectors),
        cmocka_unit_test(test_random_rows),
        cmocka_unit_test(test_rejects),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
