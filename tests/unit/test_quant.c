/* test_quant: reference dequantisation against the ggml fixture vectors (bit for
 * bit), fp16/bf16 conversions, and the error paths. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "model_fixtures.h"
#include "quant.h"
#include "status.h"



/* Runs every case of dir/manifest.json; returns how many types were checked. */
static int check_fixture_dir(const char *dir)
{
    char path[1024];
    size_t len;
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    char *text = fx_read(path, &len);
    if (!text)
        return -1;
    cJSON *root = cJSON_Parse(text);
    assert_non_null(root);
    cJSON *cases = cJSON_GetObjectItem(root, "cases");
    assert_true(cJSON_IsArray(cases));
    int checked = 0;
    cJSON *c;
    cJSON_ArrayForEach(c, cases)
    {
        const char *id = cJSON_GetObjectItem(c, "id")->valuestring;
        const char *tname = cJSON_GetObjectItem(c, "type")->valuestring;
        int ne0 = cJSON_GetObjectItem(c, "ne0")->valueint;
        int rows = cJSON_GetObjectItem(c, "rows")->valueint;
        int row_bytes = cJSON_GetObjectItem(c, "row_bytes")->valueint;
        int t = tdm_qtype_from_name(tname);
        assert_true(t >= 0);
        assert_int_equal(tdm_qtype_row_bytes((tdm_qtype)t, ne0), (size_t)row_bytes);
        size_t qlen, flen;
        snprintf(path, sizeof path, "%s/%s.q", dir, id);
        uint8_t *q = (uint8_t *)fx_read(path, &qlen);
        snprintf(path, sizeof path, "%s/%s.f32", dir, id);
        float *ref = (float *)fx_read(path, &flen);
        assert_non_null(q);
        assert_non_null(ref);
        assert_int_equal(qlen, (size_t)rows * row_bytes);
        assert_int_equal(flen, (size_t)rows * ne0 * 4);
        float *out = malloc((size_t)ne0 * 4);
        int mismatches = 0;
        for (int r = 0; r < rows; r++) {
            memset(out, 0xff, (size_t)ne0 * 4); /* NaN poison */
            tdm_error err;
            assert_int_equal(tdm_dequant_row((tdm_qtype)t, q + (size_t)r * row_bytes, out, ne0,
                                             &err),
                             TDM_OK);
            if (memcmp(out, ref + (size_t)r * ne0, (size_t)ne0 * 4) != 0) {
                for (int e = 0; e < ne0; e++)
                    if (memcmp(&out[e], &ref[(size_t)r * ne0 + e], 4) && mismatches++ < 5)
                        printf("  %s row %d elem %d: got %.9g want %.9g\n", id, r, e, out[e],
                               ref[(size_t)r * ne0 + e]);
            }
        }
        printf("  %-8s %2d rows x %4d: %s\n", id, rows, ne0, mismatches ? "MISMATCH" : "bit-exact");
        assert_int_equal(mismatches, 0);
        free(out);
        free(q);
        free(ref);
        checked++;
    }
    cJSON_Delete(root);
    free(text);
    return checked;
}

static void test_fixtures(void **state)
{
    const char *root = getenv("TDM_ROOT");
    char dir[900];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/quant", root ? root : ".");
    printf("fixture set: vendored (%s)\n", dir);
    int n = check_fixture_dir(dir);
    assert_true(n >= 15);
    snprintf(dir, sizeof dir, "%s/../shared/fixtures/quant", root ? root : ".");
    int m = check_fixture_dir(dir);
    if (m < 0)
        printf("fixture set: full set not present (%s), skipped\n", dir);
    else
        printf("fixture set: full (%s): %d cases\n", dir, m);
}

static uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* fp16 -> fp32 -> fp16 is the identity for every non-NaN half; decoded
 * values match ldexp arithmetic. */
static void test_fp16(void **state)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = tdm_fp16_to_fp32((uint16_t)h);
        int exp = (h >> 10) & 31, man = h & 1023;
        double want = exp == 0 ? ldexp(man, -24) : ldexp(1024 + man, exp - 25);
        if (h & 0x8000)
            want = -want;
        if (exp == 31) {
            assert_true(man ? isnan(f) : isinf(f));
            if (!man)
                assert_int_equal(tdm_fp32_to_fp16(f), h);
            continue;
        }
        assert_true((double)f == want);
        assert_int_equal(tdm_fp32_to_fp16(f), h);
    }
    /* rounding: halfway between 1 and 1+2^-10 goes to even (1); just above goes up */
    assert_int_equal(tdm_fp32_to_fp16(1.0f + 0x1p-11f), 0x3c00);
    assert_int_equal(tdm_fp32_to_fp16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
    assert_int_equal(tdm_fp32_to_fp16(1.0f + 3 * 0x1p-11f), 0x3c02);
    assert_int_equal(tdm_fp32_to_fp16(65520.0f), 0x7c00);
    assert_int_equal(tdm_fp32_to_fp16(65519.0f), 0x7bff);
    assert_int_equal(tdm_fp32_to_fp16(-1e9f), 0xfc00);
    assert_int_equal(tdm_fp32_to_fp16(0x1p-25f), 0x0000);          /* tie to even zero */
    assert_int_equal(tdm_fp32_to_fp16(0x1p-25f * 1.0001f), 0x0001); /* above the tie */
    assert_int_equal(tdm_fp32_to_fp16(u2f(0x7fc00001)) & 0x7e00, 0x7e00);
}

static void test_bf16(void **state)
{
    assert_true(tdm_bf16_to_fp32(0x3f80) == 1.0f);
    assert_true(tdm_bf16_to_fp32(0xc000) == -2.0f);
    assert_int_equal(tdm_fp32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(tdm_fp32_to_bf16(u2f(0x3f808000)), 0x3f80); /* tie -> even */
    assert_int_equal(tdm_fp32_to_bf16(u2f(0x3f818000)), 0x3f82); /* tie -> even (up) */
    assert_int_equal(tdm_fp32_to_bf16(u2f(0x3f808001)), 0x3f81);
    uint16_t nan = tdm_fp32_to_bf16(u2f(0x7f800001));
    assert_true(isnan(tdm_bf16_to_fp32(nan)));
    for (uint32_t h = 0; h < 65536; h++) {
        float f = tdm_bf16_to_fp32((uint16_t)h);
        assert_int_equal(f2u(f), h << 16);
        if (!isnan(f))
            assert_int_equal(tdm_fp32_to_bf16(f), h);
    }
}

static void test_errors(void **state)
{
    float out[256];
    uint8_t in[512] = {0};
    tdm_error err;
    assert_int_equal(tdm_dequant_row(TDM_Q_IQ2_XXS, in, out, 256, &err), TDM_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "IQ2_XXS"));
    assert_int_equal(tdm_dequant_row((tdm_qtype)4, in, out, 32, &err), TDM_ERR_UNSUPPORTED);
    assert_int_equal(tdm_dequant_row((tdm_qtype)200, in, out, 32, &err), TDM_ERR_UNSUPPORTED);
    assert_int_equal(tdm_dequant_row(TDM_Q_Q4_K, in, out, 100, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.msg, "100"));
    assert_int_equal(tdm_dequant_row(TDM_Q_Q8_0, in, out, -32, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_dequant_row(TDM_Q_Q8_0, NULL, out, 32, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_dequant_row(TDM_Q_Q8_0, in, out, 0, NULL), TDM_OK);
    assert_int_equal(tdm_dequant_row(TDM_Q_Q8_0, in, out, 31, NULL), TDM_ERR_INVALID);
    /* MXFP4 scale exponents: e = 0, 1, 2, 254 */
    uint8_t mx[17] = {0};
    mx[1] = 0x01; /* element 0 -> table value 1 */
    const uint8_t es[4] = {0, 1, 2, 254};
    for (int i = 0; i < 4; i++) {
        mx[0] = es[i];
        assert_int_equal(tdm_dequant_row(TDM_Q_MXFP4, mx, out, 32, NULL), TDM_OK);
        assert_true(out[0] == (float)ldexp(1.0, es[i] - 128));
        assert_true(out[1] == 0.0f);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixtures),
        cmocka_unit_test(test_fp16),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
