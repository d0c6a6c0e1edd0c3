/* test_kernels: the CPU quantised kernels of every type under every ISA this
 * CPU supports, on fresh random data (seed from the clock, printed; TDM_SEED
 * reproduces a run).
 *  - activation bytes of each SIMD ISA == the scalar ones; the scalar ones obey
 *    the documented rounding (|x - d q| <= d/2 (+fp16 rounding of d)).
 *  - scalar dot == float64 reference from tdm_dequant_row and the dequantised
 *    activation, within the float-accumulation bound.
 *  - each SIMD dot == scalar dot within 1e-6 relative to sum|w x| (or the
 *    float-accumulation bound when that is larger: long rows).
 *  - tdm_matmul_rows on odd row/token counts with NaN-poisoned outputs.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "kernels.h"
#include "kernels_impl.h"
#include "quant.h"

static uint64_t g_rng;

static uint64_t rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

static float frand(float lo, float hi)
{
    return lo + (hi - lo) * (float)((rnd() >> 11) * 0x1p-53);
}

static uint16_t rand_scale_fp16(void)
{
    float mag = ldexpf(frand(1.0f, 2.0f), -(int)(rnd() % 8) - 4); /* 2^-11 .. 2^-3 */
    return tdm_fp32_to_fp16(rnd() & 1 ? -mag : mag);
}

/* Byte offsets of the fp16 fields (d first, then the min) of each block type;
 * -1 = none. Layouts from spec gguf.md §2.4. */
typedef struct scale_fields {
    int d, min;
} scale_fields;

static scale_fields fields_of(tdm_qtype t)
{
    switch (t) {
    case TDM_Q_Q4_1: case TDM_Q_Q5_1: case TDM_Q_Q4_K: case TDM_Q_Q5_K:
        return (scale_fields){0, 2};
    case TDM_Q_Q4_0: case TDM_Q_Q5_0: case TDM_Q_Q8_0: case TDM_Q_IQ4_NL: case TDM_Q_IQ4_XS:
        return (scale_fields){0, -1};
    case TDM_Q_Q2_K: return (scale_fields){80, 82};
    case TDM_Q_Q3_K: return (scale_fields){108, -1};
    case TDM_Q_Q6_K: return (scale_fields){208, -1};
    default: return (scale_fields){-1, -1};
    }
}

static void rand_weights(tdm_qtype t, uint8_t *w, int64_t n)
{
    const tdm_qtype_info *q = tdm_qtype_get(t);
    size_t bytes = tdm_qtype_row_bytes(t, n);
    for (size_t i = 0; i < bytes; i++)
        w[i] = (uint8_t)rnd();
    if (t == TDM_Q_F32 || t == TDM_Q_F16 || t == TDM_Q_BF16) {
        for (int64_t i = 0; i < n; i++) {
            float v = frand(-1.0f, 1.0f);
            uint16_t h = t == TDM_Q_F16 ? tdm_fp32_to_fp16(v) : tdm_fp32_to_bf16(v);
            if (t == TDM_Q_F32)
                memcpy(w + 4 * i, &v, 4);
            else
                memcpy(w + 2 * i, &h, 2);
        }
        return;
    }
    scale_fields f = fields_of(t);
    for (int64_t b = 0; b < n / q->block; b++) {
        uint8_t *blk = w + b * q->type_size;
        if (t == TDM_Q_MXFP4) {
            blk[0] = (uint8_t)(118 + rnd() % 16);
            continue;
        }
        uint16_t d = rand_scale_fp16(), m = rand_scale_fp16();
        memcpy(blk + f.d, &d, 2);
        if (f.min >= 0)
            memcpy(blk + f.min, &m, 2);
    }
}

/* Random activations with the awkward cases mixed in: an all-zero block, and
 * a block whose largest |x| occurs with both signs (first must win). */
static void rand_act(float *x, int64_t n, int block)
{
    float scale = ldexpf(1.0f, (int)(rnd() % 8) - 4);
    for (int64_t i = 0; i < n; i++)
        x[i] = frand(-1.0f, 1.0f) * scale;
    int64_t nb = n / block;
    if (nb >= 3 && block > 1) {
        memset(x + block, 0, (size_t)block * sizeof(float));
        x[2 * block + 3] = 2.5f * scale;
        x[2 * block + block - 2] = -2.5f * scale;
    }
}

/* Dequantised activation (float64) and, for Q8_1, the per-block fp16 sum. */
static void act_dequant(tdm_qtype at, const uint8_t *xq, int64_t n, double *xd, double *s)
{
    for (int64_t i = 0; i < n; i++) {
        if (at == TDM_Q_F32) {
            float v;
            memcpy(&v, xq + 4 * i, 4);
            xd[i] = v;
        } else if (at == TDM_Q_Q8_K) {
            const uint8_t *b = xq + (i / 256) * TDM_ACT_Q8_K;
            float d;
            memcpy(&d, b + Q8K_D, 4);
            xd[i] = (double)d * (int8_t)b[Q8K_QS + i % 256];
        } else {
            int bs = at == TDM_Q_Q8_1 ? 36 : 34, off = at == TDM_Q_Q8_1 ? 4 : 2;
            const uint8_t *b = xq + (i / 32) * bs;
            uint16_t dh, sh;
            memcpy(&dh, b, 2);
            memcpy(&sh, b + 2, 2);
            xd[i] = (double)tdm_fp16_to_fp32(dh) * (int8_t)b[off + i % 32];
            if (s && i % 32 == 0)
                s[i / 32] = at == TDM_Q_Q8_1 ? tdm_fp16_to_fp32(sh) : 0.0;
        }
    }
}

typedef struct ref_result {
    double value; /* float64 dot of the dequantised operands */
    double mag;   /* sum of |terms| the kernels round: the scale of the error */
} ref_result;

static ref_result reference(tdm_qtype t, const uint8_t *w, const uint8_t *xq, int64_t n)
{
    const tdm_qtype_info *q = tdm_qtype_get(t);
    tdm_qtype at = q->vec_dot_type;
    float *wd = malloc((size_t)n * 4), *mt = calloc((size_t)n, 4);
    double *xd = malloc((size_t)n * 8), *s = calloc((size_t)n / 32 + 1, 8);
    assert_int_equal(tdm_dequant_row(t, w, wd, n, NULL), TDM_OK);
    act_dequant(at, xq, n, xd, s);
    scale_fields f = fields_of(t);
    if (f.min >= 0) { /* the min term of each element: dequantise with d = 0 */
        size_t bytes = tdm_qtype_row_bytes(t, n);
        uint8_t *w0 = malloc(bytes);
        memcpy(w0, w, bytes);
        for (int64_t b = 0; b < n / q->block; b++)
            memset(w0 + b * q->type_size + f.d, 0, 2);
        assert_int_equal(tdm_dequant_row(t, w0, mt, n, NULL), TDM_OK);
        free(w0);
    }
    ref_result r = {0.0, 0.0};
    for (int64_t i = 0; i < n; i++) {
        r.value += (double)wd[i] * xd[i];
        r.mag += (fabs(wd[i]) + fabs(mt[i])) * fabs(xd[i]);
    }
    if (at == TDM_Q_Q8_1) { /* the kernel uses the stored s, not d * sum(q) */
        for (int64_t b = 0; b < n / 32; b++) {
            double sq = 0.0;
            for (int i = 0; i < 32; i++)
                sq += xd[32 * b + i];
            r.value += (double)mt[32 * b] * (s[b] - sq);
            r.mag += fabs(mt[32 * b]) * (fabs(s[b]) + fabs(sq));
        }
    }
    free(wd);
    free(mt);
    free(xd);
    free(s);
    return r;
}

static int n_blocks(tdm_qtype t, int64_t n)
{
    return (int)(n / tdm_qtype_get(t)->block);
}

/* Float-accumulation error bound for a dot of nb block terms. */
static double accum_tol(tdm_qtype t, int64_t n)
{
    int nb = n_blocks(t, n);
    if (tdm_qtype_get(t)->block == 1)
        nb = (int)(n / 16);
    return 2.0 * (nb + 16) * 0x1p-24;
}

static const int64_t k_sizes_blocks[] = {1, 3, 7, 9};
static const int64_t k_sizes_float[] = {1, 37, 203, 517};

static int64_t test_n(tdm_qtype t, int k)
{
    const tdm_qtype_info *q = tdm_qtype_get(t);
    if (q->block == 1)
        return k_sizes_float[k];
    int64_t mult = q->block == 32 ? 8 : 1; /* 32-blocks: 8, 24, 56, 72 blocks */
    return k_sizes_blocks[k] * mult * q->block;
}

static bool kernel_type(uint32_t id)
{
    const tdm_qtype_info *q = tdm_qtype_get(id);
    return q && q->dequant;
}

static void select_isa(tdm_cpu_isa isa)
{
    tdm_error err;
    assert_int_equal(tdm_cpu_isa_select(isa, &err), TDM_OK);
    assert_int_equal(tdm_cpu_isa_active(), isa);
}

static bool isa_available(tdm_cpu_isa isa)
{
    return isa <= tdm_cpu_isa_detect();
}

/* Every kernel set: the ISAs, and AVX-512 with and without its VNNI table. */
typedef struct variant {
    const char *name;
    tdm_cpu_isa isa;
    int vnni;
} variant;

static const variant k_variants[] = {{"scalar", TDM_ISA_SCALAR, 0},
                                     {"avx2", TDM_ISA_AVX2, 0},
                                     {"avx512", TDM_ISA_AVX512, 0},
                                     {"avx512-vnni", TDM_ISA_AVX512, 1}};
#define N_VARIANTS (int)(sizeof k_variants / sizeof k_variants[0])

static bool variant_available(int v)
{
    return isa_available(k_variants[v].isa) && (!k_variants[v].vnni || tdm_cpu_has_vnni());
}

static void select_variant(int v)
{
    tdm_error err;
    if (tdm_cpu_isa_select_variant(k_variants[v].isa, k_variants[v].vnni, &err) != TDM_OK)
        fail_msg("select %s: %s", k_variants[v].name, err.msg);
}

static void test_dispatch(void **state)
{
    tdm_cpu_isa best = tdm_cpu_isa_detect();
    printf("detected ISA: %s; default active: %s\n", tdm_cpu_isa_name(best),
           tdm_cpu_isa_name(tdm_cpu_isa_active()));
    for (int i = 0; i < TDM_ISA_COUNT; i++) {
        tdm_error err;
        tdm_status st = tdm_cpu_isa_select((tdm_cpu_isa)i, &err);
        if (i <= (int)best) {
            assert_int_equal(st, TDM_OK);
            assert_int_equal(tdm_cpu_isa_active(), i);
            printf("  %-7s ran\n", tdm_cpu_isa_name((tdm_cpu_isa)i));
        } else {
            assert_int_equal(st, TDM_ERR_UNSUPPORTED);
            assert_non_null(strstr(err.msg, tdm_cpu_isa_name((tdm_cpu_isa)i)));
            printf("  %-7s skipped (this CPU lacks it)\n", tdm_cpu_isa_name((tdm_cpu_isa)i));
        }
    }
    for (int v = 0; v < N_VARIANTS; v++)
        printf("  kernel set %-12s %s\n", k_variants[v].name,
               variant_available(v) ? "ran" : "skipped (this CPU lacks it)");
    tdm_error err;
    assert_int_equal(tdm_cpu_isa_select((tdm_cpu_isa)TDM_ISA_COUNT, &err), TDM_ERR_INVALID);
    assert_string_equal(tdm_cpu_isa_name(TDM_ISA_SCALAR), "scalar");
    assert_string_equal(tdm_cpu_isa_name((tdm_cpu_isa)99), "?");
    select_isa(best);
}

/* A type without a CPU kernel is a caller bug: the entry points must stop
 * with a message (SIGABRT), not jump through a NULL pointer. */
static void expect_abort(int which)
{
    fflush(stdout);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        uint8_t buf[1024] = {0};
        float y[4];
        if (!freopen("/dev/null", "w", stderr))
            _exit(3);
        if (which == 0)
            tdm_vec_dot(TDM_Q_IQ2_XXS, 256, buf, buf);
        else if (which == 1)
            tdm_act_quantize(TDM_Q_TQ1_0, (const float *)buf, buf, 256);
        else
            tdm_matmul_rows((tdm_qtype)31, 32, buf, 34, 0, 1, buf, 34, 1, y, 1);
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGABRT);
}

static void test_unsupported_types(void **state)
{
    for (int i = 0; i < 3; i++)
        expect_abort(i);
}

static void test_act_row_bytes(void **state)
{
    assert_int_equal(tdm_act_row_bytes(TDM_Q_F32, 37), 37 * 4);
    assert_int_equal(tdm_act_row_bytes(TDM_Q_BF16, 37), 37 * 4);
    assert_int_equal(tdm_act_row_bytes(TDM_Q_Q4_0, 64), 2 * 34);
    assert_int_equal(tdm_act_row_bytes(TDM_Q_Q4_1, 64), 2 * 36);
    assert_int_equal(tdm_act_row_bytes(TDM_Q_MXFP4, 64), 2 * 34);
    assert_int_equal(tdm_act_row_bytes(TDM_Q_Q4_K, 512), 2 * TDM_ACT_Q8_K);
    assert_int_equal(tdm_act_row_bytes(TDM_Q_IQ4_XS, 512), 2 * TDM_ACT_Q8_K);
    assert_int_equal(tdm_act_row_bytes(TDM_Q_IQ2_XXS, 512), 0);
}

/* The scalar quantiser obeys the documented rounding. */
static void check_act_semantics(tdm_qtype at, const float *x, const uint8_t *xq, int64_t n)
{
    if (at == TDM_Q_F32) {
        assert_memory_equal(x, xq, (size_t)n * 4);
        return;
    }
    int block = at == TDM_Q_Q8_K ? 256 : 32;
    int bs = at == TDM_Q_Q8_K ? TDM_ACT_Q8_K : at == TDM_Q_Q8_1 ? 36 : 34;
    int off = at == TDM_Q_Q8_K ? Q8K_QS : at == TDM_Q_Q8_1 ? 4 : 2;
    for (int64_t b = 0; b < n / block; b++) {
        const float *xb = x + b * block;
        const uint8_t *blk = xq + b * bs;
        const int8_t *q = (const int8_t *)(blk + off);
        double d;
        if (at == TDM_Q_Q8_K) {
            float df;
            memcpy(&df, blk + Q8K_D, 4);
            d = df;
        } else {
            uint16_t dh;
            memcpy(&dh, blk, 2);
            d = tdm_fp16_to_fp32(dh);
        }
        int amax_i = 0, sum = 0;
        for (int i = 0; i < block; i++) {
            if (fabsf(xb[i]) > fabsf(xb[amax_i]))
                amax_i = i;
            sum += q[i];
            double slack = at == TDM_Q_Q8_K ? 0.5 + 1e-4 : 0.5 + 127.0 * 0x1p-11 + 1e-4;
            assert_true(fabs(xb[i] - d * q[i]) <= slack * fabs(d) + 1e-30);
            assert_true(q[i] >= -127 && q[i] <= 127);
        }
        if (xb[amax_i] != 0.0f)
            assert_int_equal(abs(q[amax_i]), 127);
        if (at == TDM_Q_Q8_K) {
            if (xb[amax_i] != 0.0f)
                assert_int_equal(q[amax_i], -127); /* iscale = -127/max */
            for (int g = 0; g < 16; g++) {
                int s = 0;
                int16_t bsum;
                for (int i = 0; i < 16; i++)
                    s += q[16 * g + i];
                memcpy(&bsum, blk + Q8K_BSUMS + 2 * g, 2);
                assert_int_equal(bsum, s);
            }
        } else if (at == TDM_Q_Q8_1) {
            uint16_t dh, sh;
            memcpy(&dh, blk, 2);
            memcpy(&sh, blk + 2, 2);
            double dexact = 0.0;
            for (int i = 0; i < block; i++)
                dexact = fmax(dexact, fabs(xb[i]));
            dexact /= 127.0;
            assert_true(fabs(tdm_fp16_to_fp32(sh) - dexact * sum) <=
                        fabs(dexact * sum) * 0x1p-10 + 1e-6);
        }
    }
}

static void test_act_quantize(void **state)
{
    const tdm_qtype reps[] = {TDM_Q_F32, TDM_Q_Q8_0, TDM_Q_Q4_1, TDM_Q_Q4_K};
    for (size_t r = 0; r < sizeof reps / sizeof reps[0]; r++) {
        tdm_qtype wt = reps[r];
        tdm_qtype at = tdm_qtype_get(wt)->vec_dot_type;
        int64_t n = wt == TDM_Q_F32 ? 517 : wt == TDM_Q_Q4_K ? 256 * 5 : 32 * 9;
        size_t bytes = tdm_act_row_bytes(wt, n);
        float *x = malloc((size_t)n * 4);
        uint8_t *ref = malloc(bytes), *got = malloc(bytes);
        for (int trial = 0; trial < 20; trial++) {
            rand_act(x, n, tdm_qtype_get(at)->block);
            select_isa(TDM_ISA_SCALAR);
            memset(ref, 0xA5, bytes);
            tdm_act_quantize(wt, x, ref, n);
            check_act_semantics(at, x, ref, n);
            for (int v = 1; v < N_VARIANTS; v++) {
                if (!variant_available(v))
                    continue;
                select_variant(v);
                memset(got, 0x5A, bytes);
                tdm_act_quantize(wt, x, got, n);
                if (memcmp(ref, got, bytes) != 0)
                    fail_msg("%s activation bytes differ between scalar and %s (trial %d)",
                             tdm_qtype_name(at), k_variants[v].name, trial);
            }
        }
        printf("  %-5s activations: scalar semantics ok, SIMD bytes identical\n", tdm_qtype_name(at));
        free(x);
        free(ref);
        free(got);
    }
    select_isa(tdm_cpu_isa_detect());
}

static void test_dot(void **state)
{
    for (uint32_t t = 0; t < TDM_Q_COUNT; t++) {
        if (!kernel_type(t))
            continue;
        double worst_ref = 0.0, worst_simd = 0.0;
        for (int k = 0; k < 4; k++) {
            int64_t n = test_n((tdm_qtype)t, k);
            const tdm_qtype_info *q = tdm_qtype_get(t);
            uint8_t *w = malloc(tdm_qtype_row_bytes((tdm_qtype)t, n));
            uint8_t *xq = malloc(tdm_act_row_bytes((tdm_qtype)t, n));
            float *x = malloc((size_t)n * 4);
            for (int trial = 0; trial < 8; trial++) {
                rand_weights((tdm_qtype)t, w, n);
                rand_act(x, n, tdm_qtype_get(q->vec_dot_type)->block);
                select_isa(TDM_ISA_SCALAR);
                tdm_act_quantize((tdm_qtype)t, x, xq, n);
                ref_result r = reference((tdm_qtype)t, w, xq, n);
                float s = tdm_vec_dot((tdm_qtype)t, n, w, xq);
                double tol = accum_tol((tdm_qtype)t, n) * r.mag + 1e-30;
                assert_true(isfinite(s));
                if (fabs(s - r.value) > tol)
                    fail_msg("%s n=%lld: scalar %.9g vs float64 %.9g (tol %.3g)", q->name,
                             (long long)n, s, r.value, tol);
                worst_ref = fmax(worst_ref, fabs(s - r.value) / (r.mag + 1e-30));
                for (int vi = 1; vi < N_VARIANTS; vi++) {
                    if (!variant_available(vi))
                        continue;
                    select_variant(vi);
                    float v = tdm_vec_dot((tdm_qtype)t, n, w, xq);
                    double tol2 = fmax(1e-6, accum_tol((tdm_qtype)t, n)) * r.mag + 1e-30;
                    if (!(fabs(v - s) <= tol2))
                        fail_msg("%s n=%lld: %s %.9g vs scalar %.9g (tol %.3g)", q->name,
                                 (long long)n, k_variants[vi].name, v, s, tol2);
                    worst_simd = fmax(worst_simd, fabs(v - s) / (r.mag + 1e-30));
                }
            }
            free(w);
            free(xq);
            free(x);
        }
        printf("  %-7s scalar-vs-f64 %.2e, simd-vs-scalar %.2e (relative to sum|wx|)\n",
               tdm_qtype_name(t), worst_ref, worst_simd);
    }
    select_isa(tdm_cpu_isa_detect());
}

static bool is_poison(float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    return u == 0xFFFFFFFFu;
}

static void check_matmul(tdm_qtype t, const char *isa, int64_t rows, int64_t r0, int64_t r1,
                         int64_t ntok)
{
    const tdm_qtype_info *q = tdm_qtype_get(t);
    int64_t n = q->block == 1 ? 75 : q->block == 32 ? 32 * 11 : 256 * 3;
    size_t rb = tdm_qtype_row_bytes(t, n), w_stride = rb + (q->block == 1 ? 4 : 0);
    size_t ab = tdm_act_row_bytes(t, n), xq_stride = ab + 40;
    size_t y_stride = (size_t)rows + 3;
    uint8_t *w = malloc(w_stride * (size_t)rows), *xq = malloc(xq_stride * (size_t)ntok);
    float *x = malloc((size_t)n * 4), *y = malloc(y_stride * (size_t)ntok * 4 + 64);
    for (int64_t r = 0; r < rows; r++)
        rand_weights(t, w + r * w_stride, n);
    for (int64_t k = 0; k < ntok; k++) {
        rand_act(x, n, tdm_qtype_get(q->vec_dot_type)->block);
        tdm_act_quantize(t, x, xq + k * xq_stride, n);
    }
    size_t ylen = y_stride * (size_t)ntok + 16;
    memset(y, 0xFF, ylen * 4);
    tdm_matmul_rows(t, n, w, w_stride, r0, r1, xq, xq_stride, ntok, y, y_stride);
    for (size_t i = 0; i < ylen; i++) {
        int64_t k = (int64_t)(i / y_stride), r = (int64_t)(i % y_stride);
        bool written = k < ntok && r >= r0 && r < r1;
        if (!written) {
            if (!is_poison(y[i]))
                fail_msg("%s %s: y[%zu] (token %lld row %lld) was overwritten", q->name,
                         isa, i, (long long)k, (long long)r);
            continue;
        }
        const uint8_t *wr = w + r * w_stride, *xk = xq + k * xq_stride;
        float want = tdm_vec_dot(t, n, wr, xk);
        if (memcmp(&want, &y[i], 4) != 0)
            fail_msg("%s %s: token %lld row %lld: matmul %.9g vs vec_dot %.9g", q->name,
                     isa, (long long)k, (long long)r, y[i], want);
        ref_result ref = reference(t, wr, xk, n);
        double tol = fmax(1e-6, accum_tol(t, n)) * ref.mag + 1e-30;
        assert_true(fabs(y[i] - ref.value) <= 2 * tol);
    }
    free(w);
    free(xq);
    free(x);
    free(y);
}

static void test_matmul_rows(void **state)
{
    for (int v = 0; v < N_VARIANTS; v++) {
        if (!variant_available(v))
            continue;
        select_variant(v);
        const char *name = k_variants[v].name;
        for (uint32_t t = 0; t < TDM_Q_COUNT; t++) {
            if (!kernel_type(t))
                continue;
            check_matmul((tdm_qtype)t, name, 13, 2, 11, 1);
            check_matmul((tdm_qtype)t, name, 13, 0, 13, 3);
            check_matmul((tdm_qtype)t, name, 61, 5, 58, 7);
            check_matmul((tdm_qtype)t, name, 9, 4, 4, 2); /* empty range */
            check_matmul((tdm_qtype)t, name, 6, 1, 6, 8); /* two 4-token groups */
        }
        printf("  matmul_rows under %s: every type ok\n", name);
    }
    select_isa(tdm_cpu_isa_detect());
}

int main(void)
{
    const char *env = getenv("TDM_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    if (!seed)
        seed = 0x9E3779B97F4A7C15ull;
    printf("seed %llu (set TDM_SEED to repeat)\n", (unsigned long long)seed);
    g_rng = seed;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dispatch),
        cmocka_unit_test(test_act_row_bytes),
        cmocka_unit_test(test_unsupported_types),
        cmocka_unit_test(test_act_quantize),
        cmocka_unit_test(test_dot),
        cmocka_unit_test(test_matmul_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
