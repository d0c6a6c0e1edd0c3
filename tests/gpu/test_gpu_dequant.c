/* test_gpu_dequant: the GPU dequantisation table (gpu_quant.cuh), run on the
 * host, must equal ggml's reference bit for bit: both decoders (dq8 through
 * tdm_gpu_dequant_row_host, the int8 decoders dqi8 through
 * tdm_gpu_dequant_i8_row_host), on the fixture vectors (real llama-quantize
 * rows) and on fresh random rows against tdm_dequant_row. Also the int8
 * activation quantiser's rounding bound. Needs no device. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "../unit/model_fixtures.h"
#include "gpu_test_hooks.h"
#include "gpu_testutil.h"
/* The int8 decoders exist for the quantised formats (blocks of 32 or 256). */
static bool has_i8(tdm_qtype t) { return tdm_qtype_get(t)->block >= 32; }

/* Both host decoders of row q must give want bit for bit. */
static void check_row(const char *what, tdm_qtype t, const uint8_t *q, const float *want, int64_t n,
                      float *got)
{
    for (int dec = 0; dec < (has_i8(t) ? 2 : 1); dec++) {
        tdm_error e = {0};
        tdm_status s = dec ? tdm_gpu_dequant_i8_row_host(t, q, got, n, &e)
                           : tdm_gpu_dequant_row_host(t, q, got, n, &e);
        if (s != TDM_OK)
            fail_msg("%s: %s", what, e.msg);
        for (int64_t i = 0; i < n; i++)
            if (memcmp(&got[i], &want[i], 4))
                fail_msg("%s (%s decoder) elem %lld: %.9g != %.9g", what, dec ? "int8" : "float",
                         (long long)i, (double)got[i], (double)want[i]);
    }
}

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
            char what[96];
            snprintf(what, sizeof what, "%s row %d", id, r);
            check_row(what, t, q + r * rb, want + (size_t)r * ne0, ne0, got);
        }
        printf("  fixture %-8s %d rows of %d: bit-exact%s\n", id, rows, ne0,
               has_i8(t) ? " (both decoders)" : "");
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
            for (int64_t i = 0; i < n; i++)
                if (!isfinite(a[i]))
                    fail_msg("%s: random row produced a non-finite value", tdm_qtype_name(t));
            char what[96];
            snprintf(what, sizeof what, "%s rep %d", tdm_qtype_name(t), rep);
            check_row(what, t, row, a, n, b);
        }
        printf("  random %-8s 200 rows of %lld: bit-exact%s\n", tdm_qtype_name(t), (long long)n,
               has_i8(t) ? " (both decoders)" : "");
    }
    free(row);
    free(a);
    free(b);
}

/* x^ = q dx per group of 32: |q| <= 127, |x - q dx| <= amax / 254 (1 + 1e-4)
 * over 13 decades of group scales, groups below 1e-30 become zeros. */
static void test_activation_quant(void **state)
{
    (void)state;
    enum { N = 32 * 512 };
    static float x[N], dx[N / 32];
    static int8_t q[N];
    for (int i = 0; i < N; i++)
        x[i] = rng_normalish() * (float)pow(10.0, (double)(i / 32 % 13) - 6); /* per-group scales */
    for (int i = 64; i < 96; i++)
        x[i] = 1e-31f;
    x[200] = 1e4f;
    tdm_gpu_xq_host(x, N, q, dx);
    double worst = 0;
    for (int g = 0; g < N / 32; g++) {
        double amax = 0;
        for (int i = 0; i < 32; i++)
            amax = fmax(amax, fabs((double)x[32 * g + i]));
        for (int i = 0; i < 32; i++) {
            double e = fabs((double)x[32 * g + i] - (double)q[32 * g + i] * dx[g]);
            if (q[32 * g + i] < -127 || (g == 2 && q[32 * g + i] != 0))
                fail_msg("group %d elem %d: q %d", g, i, q[32 * g + i]);
            if (g != 2 && !(e <= amax / 254 * (1 + 1e-4))) /* group 2 is below 1e-30: zeros */
                fail_msg("group %d elem %d: |x - q dx| %.3g > amax/254 %.3g", g, i, e, amax / 254);
            if (g != 2)
                worst = fmax(worst, e / (amax / 254));
        }
    }
    printf("  int8 activations: worst |x - q dx| = %.4f x amax/254\n", worst);
}

/* The int8 dot product (activation quantisation, shared-memory layout,
 * group indexing, dp4a formula) run on the host against float64 with the
 * same x^: |err| <= 1e-5 * sum |w x^|, the matvec test's tight bound. */
static void test_int8_dot(void **state)
{
    (void)state;
    enum { K = 2048 };
    static uint8_t row[K * 4];
    static float x[K], w[K], xq_dx[K / 32];
    static int8_t q[K];
    for (size_t ti = 0; ti < N_GPU_TYPES; ti++) {
        tdm_qtype t = k_gpu_types[ti];
        if (!has_i8(t))
            continue;
        double worst = 0;
        for (int rep = 0; rep < 50; rep++) {
            int64_t k = rep % 2 ? K : 256 * (1 + rep % 5);
            rand_row(t, row, k);
            rand_floats(x, (size_t)k, rep % 3 ? 1.0f : 1e-3f);
            tdm_error e = {0};
            assert_int_equal(tdm_dequant_row(t, row, w, k, &e), TDM_OK);
            tdm_gpu_xq_host(x, k, q, xq_dx);
            double ref = 0, abs = 0;
            for (int64_t i = 0; i < k; i++) {
                double p = (double)w[i] * ((double)q[i] * xq_dx[i / 32]);
                ref += p;
                abs += fabs(p);
            }
            float got;
            if (tdm_gpu_dot_i8_host(t, row, k, x, &got, &e) != TDM_OK)
                fail_msg("%s", e.msg);
            double lim = 1e-5 * abs + 1e-30, d = fabs((double)got - ref);
            if (!(d <= lim))
                fail_msg("%s rep %d k %lld: int8 dot %.9g, float64 %.9g (|d| %.3g > %.3g)",
                         tdm_qtype_name(t), rep, (long long)k, (double)got, ref, d, lim);
            worst = fmax(worst, d / lim);
        }
        printf("  int8 dot %-8s 50 rows: worst |err| / bound %.3f\n", tdm_qtype_name(t), worst);
    }
}

static void test_rejects(void **state)
{
    (void)state;
    uint8_t buf[512] = {0};
    float out[256];
    tdm_error e = {0};
    assert_int_equal(tdm_gpu_dequant_row_host(TDM_Q_IQ2_XXS, buf, out, 256, &e), TDM_ERR_UNSUPPORTED);
    assert_int_equal(tdm_gpu_dequant_row_host(TDM_Q_Q4_K, buf, out, 100, &e), TDM_ERR_INVALID);
    assert_int_equal(tdm_gpu_dequant_i8_row_host(TDM_Q_F16, buf, out, 256, &e), TDM_ERR_UNSUPPORTED);
    assert_int_equal(tdm_gpu_dequant_i8_row_host(TDM_Q_Q8_0, buf, out, 100, &e), TDM_ERR_INVALID);
    assert_false(tdm_gpu_type_supported(TDM_Q_Q8_K));
    assert_true(tdm_gpu_type_supported(TDM_Q_MXFP4));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_vectors),
        cmocka_unit_test(test_random_rows),
        cmocka_unit_test(test_activation_quant),
        cmocka_unit_test(test_int8_dot),
        cmocka_unit_test(test_rejects),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
