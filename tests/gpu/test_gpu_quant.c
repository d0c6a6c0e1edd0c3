/* test_gpu_quant: quantised matvec (1..8 tokens), dequant-to-fp16 and the
 * cuBLAS prompt product of every supported format against a float64 host
 * reference over tdm_dequant_row, on fresh random data, NaN-poisoned outputs,
 * odd sizes and the real expert shapes (512x2048 gate/up, 2048x512 down).
 *
 * Error bounds (docs/GPU.md): the GPU dequantises exactly (bit-equal to the
 * CPU). F32/F16/BF16 keep activations in float32, so matvec only differs by
 * float32 accumulation order: |err| <= 1e-5 * sum|w x| per element. The
 * quantised formats multiply int8 activations x^ = q dx (per 32 elements,
 * reproduced bit for bit on the host by tdm_gpu_xq_host): checked twice,
 * (1) against the float64 product with x^, |err| <= 1e-5 * sum|w x^| (the
 * tight check a wrong kernel fails), (2) against the exact x with the
 * documented bound 1e-5 * sum|w x^| + sum_i |w_i| amax_g(i) / 254 (1 + 1e-4).
 * The prompt path rounds weights and activations to fp16:
 * |err| <= 2e-3 * sum|w x|. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "gpu_test_hooks.h"
#include "gpu_testutil.h"

typedef struct problem {
    tdm_qtype t;
    int64_t rows, k;
    uint8_t *w;   /* host quantised [rows][k] */
    float *wf;    /* host dequantised */
    void *base;   /* device buffer */
    void *dw;     /* device copy of w, inside base */
} problem;

/* Weights at byte offset `off` of their device buffer (blocks need not be
 * aligned: the int8 path picks its loads by address). */
static void problem_make_at(problem *p, tdm_qtype t, int64_t rows, int64_t k, size_t off)
{
    p->t = t;
    p->rows = rows;
    p->k = k;
    size_t rb = tdm_qtype_row_bytes(t, k);
    p->w = malloc(rb * rows);
    p->wf = malloc(sizeof(float) * rows * k);
    assert_non_null(p->w);
    assert_non_null(p->wf);
    for (int64_t r = 0; r < rows; r++) {
        rand_row(t, p->w + r * rb, k);
        tdm_error e = {0};
        assert_int_equal(tdm_dequant_row(t, p->w + r * rb, p->wf + r * k, k, &e), TDM_OK);
    }
    p->base = dev_alloc(rb * rows + off);
    p->dw = (uint8_t *)p->base + off;
    GPU_OK(tdm_gpu_upload(g_gpu, p->dw, p->w, rb * rows, ERR));
}

static void problem_make(problem *p, tdm_qtype t, int64_t rows, int64_t k)
{
    problem_make_at(p, t, rows, k, 0);
}

static void problem_free(problem *p)
{
    dev_free(p->base);
    free(p->w);
    free(p->wf);
}

/* ref[t][r] = sum w x in float64, bound = tol * sum |w x| + tiny. */
static void reference(const problem *p, const double *x, int64_t ntok, double tol, double *ref,
                      double *bound)
{
    for (int64_t t = 0; t < ntok; t++)
        for (int64_t r = 0; r < p->rows; r++) {
            double s = 0, a = 0;
            const float *wr = p->wf + r * p->k;
            const double *xt = x + t * p->k;
            for (int64_t i = 0; i < p->k; i++) {
                s += (double)wr[i] * xt[i];
                a += fabs((double)wr[i] * xt[i]);
            }
            ref[t * p->rows + r] = s;
            bound[t * p->rows + r] = tol * a + 1e-30;
        }
}

static bool int8_path(tdm_qtype t)
{
    return t != TDM_Q_F32 && t != TDM_Q_F16 && t != TDM_Q_BF16;
}

/* The activations the kernel multiplies (x^ for the int8 path, else x) and,
 * per element, the rounding bound amax_g / 254 (1 + 1e-4) (0 for float). */
static void kernel_activations(tdm_qtype t, const float *x, int64_t n, double *xa, double *xerr)
{
    if (!int8_path(t)) {
        for (int64_t i = 0; i < n; i++)
            xa[i] = x[i], xerr[i] = 0;
        return;
    }
    int8_t *q = malloc((size_t)n);
    float *dx = malloc(sizeof(float) * (size_t)(n / 32));
    tdm_gpu_xq_host(x, n, q, dx);
    for (int64_t g = 0; g < n / 32; g++) {
        double amax = 0;
        for (int i = 0; i < 32; i++)
            amax = fmax(amax, fabs((double)x[32 * g + i]));
        for (int i = 0; i < 32; i++) {
            xa[32 * g + i] = (double)q[32 * g + i] * dx[g];
            xerr[32 * g + i] = amax / 254 * (1 + 1e-4);
        }
    }
    free(q);
    free(dx);
}

static void run_matvec_at(tdm_qtype t, int64_t rows, int64_t k, int ntok, bool accumulate,
                          size_t off)
{
    problem p;
    problem_make_at(&p, t, rows, k, off);
    size_t nx = (size_t)ntok * k, ny = (size_t)ntok * rows;
    float *x = malloc(sizeof(float) * nx);
    rand_floats(x, nx, 1.0f);
    double *xa = malloc(sizeof(double) * nx), *xerr = malloc(sizeof(double) * nx);
    double *xe = malloc(sizeof(double) * nx);
    kernel_activations(t, x, (int64_t)nx, xa, xerr);
    for (size_t i = 0; i < nx; i++)
        xe[i] = x[i];
    double *ref = malloc(sizeof(double) * ny), *bound = malloc(sizeof(double) * ny);
    double *ref_e = malloc(sizeof(double) * ny), *bound_e = malloc(sizeof(double) * ny);
    reference(&p, xa, ntok, 1e-5, ref, bound);
    reference(&p, xe, ntok, 0, ref_e, bound_e);
    for (int64_t tk = 0; tk < ntok; tk++) /* documented bound: + sum |w| * rounding of x */
        for (int64_t r = 0; r < rows; r++) {
            double e = 0;
            for (int64_t i = 0; i < k; i++)
                e += fabs((double)p.wf[r * k + i]) * xerr[tk * k + i];
            bound_e[tk * rows + r] = bound[tk * rows + r] + e;
        }
    float *dx = dev_upload(x, sizeof(float) * nx);
    float *dy;
    float *y0 = NULL;
    if (accumulate) { /* y starts as random values that must be added to */
        y0 = malloc(sizeof(float) * ny);
        rand_floats(y0, ny, 1.0f);
        for (size_t i = 0; i < ny; i++) {
            ref[i] += y0[i];
            ref_e[i] += y0[i];
            bound[i] += 1e-6 * fabs(y0[i]);
            bound_e[i] += 1e-6 * fabs(y0[i]);
        }
        dy = dev_upload(y0, sizeof(float) * ny);
    } else {
        dy = dev_poisoned(ny);
    }
    GPU_OK(tdm_gpu_matvec(g_gpu, t, p.dw, rows, k, dx, NULL, ntok, dy, accumulate, ERR));
    float *y = dev_download_f32(dy, ny);
    if (ntok == 1 && k % 32 == 0) { /* x's int8 copy given (as a norm writes it): the same y, bit for bit */
        const size_t qb = tdm_gpu_xq8_bytes(1, k);
        void *hq = malloc(qb);
        assert_non_null(hq);
        memset(hq, 0, qb);
        GPU_OK(tdm_gpu_xq8_pack_host(x, 1, k, hq, ERR));
        void *dq = dev_upload(hq, qb);
        float *dy2 = accumulate ? dev_upload(y0, sizeof(float) * ny) : dev_poisoned(ny);
        GPU_OK(tdm_gpu_matvec(g_gpu, t, p.dw, rows, k, dx, dq, 1, dy2, accumulate, ERR));
        float *y2 = dev_download_f32(dy2, ny);
        if (memcmp(y, y2, sizeof(float) * ny) != 0)
            fail_msg("matvec %s %lldx%lld: with x's int8 copy y differs", tdm_qtype_name(t), (long long)rows,
                     (long long)k);
        free(y2), free(hq);
        dev_free(dq), dev_free(dy2);
    }
    char what[96];
    snprintf(what, sizeof what, "matvec %s %lldx%lld ntok %d%s%s", tdm_qtype_name(t),
             (long long)rows, (long long)k, ntok, accumulate ? " acc" : "", off ? " unaligned" : "");
    check_close(what, y, ref, bound, ny, 0, 0);
    if (int8_path(t)) {
        snprintf(what, sizeof what, "  vs exact x (+ int8 rounding bound)");
        check_close(what, y, ref_e, bound_e, ny, 0, 0);
    }
    free(y);
    free(y0);
    free(x);
    free(xa);
    free(xe);
    free(xerr);
    free(ref);
    free(bound);
    free(ref_e);
    free(bound_e);
    dev_free(dx);
    dev_free(dy);
    problem_free(&p);
}

static void run_matvec(tdm_qtype t, int64_t rows, int64_t k, int ntok, bool accumulate)
{
    run_matvec_at(t, rows, k, ntok, accumulate, 0);
}

static void test_matvec_all_types(void **state)
{
    (void)state;
    for (size_t ti = 0; ti < N_GPU_TYPES; ti++) {
        tdm_qtype t = k_gpu_types[ti];
        int64_t blk = tdm_qtype_get(t)->block < 8 ? 8 : tdm_qtype_get(t)->block;
        /* odd row counts (not multiples of the 4 rows per block), short and
         * long rows (units not multiples of 32), every batch size */
        for (int ntok = 1; ntok <= TDM_GPU_MATVEC_MAX_TOK; ntok++)
            run_matvec(t, 37 + ntok, blk * (ntok % 3 + 1) + (blk == 8 ? 8 * 7 : 0), ntok, false);
        run_matvec(t, 3, blk * 11, 3, true);
        /* more tokens than one group: groups side by side, a partial last one */
        run_matvec(t, 29, blk * 2, 2 * TDM_GPU_MATVEC_MAX_TOK + 5, false);
        run_matvec(t, 5, blk * 3, TDM_GPU_MATVEC_MAX_TOK + 1, true);
    }
}

static void test_matvec_expert_shapes(void **state)
{
    (void)state;
    static const tdm_qtype ts[] = {TDM_Q_Q4_K, TDM_Q_Q6_K, TDM_Q_Q8_0, TDM_Q_Q5_K, TDM_Q_IQ4_XS,
                                   TDM_Q_MXFP4, TDM_Q_BF16};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
        run_matvec(ts[i], 512, 2048, 1, false);  /* gate/up */
        run_matvec(ts[i], 2048, 512, 1, false);  /* down */
        run_matvec(ts[i], 512, 2048, 8, false);
        run_matvec(ts[i], 2048, 768, 5, false);  /* Qwen3-30B-A3B down */
    }
    /* one token from x's int8 copy over 8192+ rows: 2 rows per lane (bit-equal
     * to 1 row per lane without the copy, also where the rows are long enough
     * for 2 warps per row) */
    run_matvec(TDM_Q_Q6_K, 8195, 2048, 1, false);
    run_matvec(TDM_Q_Q4_K, 8195, 2048, 1, true);
    run_matvec(TDM_Q_Q8_0, 8195, 4096, 1, false);
    /* rows longer than one activation chunk (uneven last chunk) */
    run_matvec(TDM_Q_Q4_K, 37, 16640, 1, true);
    run_matvec(TDM_Q_Q8_0, 29, 16416, 3, false);
    /* weights aligned no more than their format asks (MXFP4: odd; Q6_K and
     * Q8_0: blocks alternating between 2- and 4-byte alignment): every load
     * width of the int8 path; half that alignment is refused */
    static const tdm_qtype ua[] = {TDM_Q_Q4_K, TDM_Q_Q5_K, TDM_Q_Q6_K, TDM_Q_Q8_0, TDM_Q_Q3_K,
                                   TDM_Q_Q2_K, TDM_Q_Q4_1, TDM_Q_Q5_1, TDM_Q_IQ4_XS, TDM_Q_MXFP4};
    float *dx = dev_poisoned(512), *dy = dev_poisoned(67);
    for (size_t i = 0; i < sizeof ua / sizeof ua[0]; i++) {
        const int al = tdm_gpu_weight_align(ua[i]);
        assert_true(al >= 1 && al <= 16);
        run_matvec_at(ua[i], 67, 512, 2, false, (size_t)al % 16);
        run_matvec_at(ua[i], 67, 512, 1, false, (size_t)al % 16);
        if (al > 1) {
            problem p;
            problem_make_at(&p, ua[i], 67, 512, (size_t)al / 2);
            tdm_error e = {0};
            assert_int_equal(tdm_gpu_matvec(g_gpu, ua[i], p.dw, 67, 512, dx, NULL, 1, dy, false, &e), TDM_ERR_INVALID);
            printf("  %s\n", e.msg);
            problem_free(&p);
        }
    }
    assert_int_equal(tdm_gpu_weight_align(TDM_Q_Q8_K), 0);
    dev_free(dx), dev_free(dy);
}

/* Every launch shape computes the same values. */
static void test_matvec_tunings(void **state)
{
    (void)state;
    static const int wprs[] = {1, 2, 4};
    for (size_t i = 0; i < 3; i++) {
        for (int rpw = 1; rpw <= 2; rpw++) {
            tdm_gpu_tuning tu = {.matvec_wpr = wprs[i], .matvec_rows = rpw};
            GPU_OK(tdm_gpu_set_tuning(g_gpu, &tu, ERR));
            printf("  matvec_wpr %d matvec_rows %d\n", wprs[i], rpw);
            for (size_t ti = 0; ti < N_GPU_TYPES; ti++) {
                tdm_qtype t = k_gpu_types[ti];
                int64_t blk = tdm_qtype_get(t)->block < 8 ? 8 : tdm_qtype_get(t)->block;
                /* odd row counts leave a half-filled row pair */
                run_matvec(t, 13, blk * 5, 3 + (int)(ti % 6), ti % 2 == 0);
            }
            run_matvec(TDM_Q_Q4_K, 512, 2048, 1, false);
            run_matvec(TDM_Q_Q6_K, 2047, 4096, 8, false);
            run_matvec(TDM_Q_Q5_K, 511, 2048, 4, true);
        }
    }
    tdm_gpu_tuning tu = {0};
    GPU_OK(tdm_gpu_set_tuning(g_gpu, &tu, ERR));
    tdm_error e = {0};
    tu.matvec_wpr = 3;
    assert_int_equal(tdm_gpu_set_tuning(g_gpu, &tu, &e), TDM_ERR_INVALID);
    printf("  %s\n", e.msg);
}

/* Two matrices of different types behind one input (tdm_gpu_matvec_pair):
 * y equals the two tdm_gpu_matvec calls (checked against the float64
 * reference above) bit for bit, poisoned rows included. */
static void run_pair(tdm_qtype ta, int64_t ra, tdm_qtype tb, int64_t rb, int64_t k, bool accumulate)
{
    problem a, b;
    problem_make(&a, ta, ra, k);
    problem_make_at(&b, tb, rb, k, (size_t)tdm_gpu_weight_align(tb) % 16); /* b aligned no more than it must */
    const size_t ny = (size_t)(ra + rb), qb = tdm_gpu_xq8_bytes(1, k);
    float *x = malloc(sizeof(float) * k), *y0 = malloc(sizeof(float) * ny);
    void *hq = malloc(qb);
    assert_non_null(x), assert_non_null(y0), assert_non_null(hq);
    rand_floats(x, k, 1.0f);
    rand_floats(y0, ny, 1.0f);
    memset(hq, 0, qb);
    GPU_OK(tdm_gpu_xq8_pack_host(x, 1, k, hq, ERR));
    float *dx = dev_upload(x, sizeof(float) * k);
    void *dq = dev_upload(hq, qb);
    float *dy1 = accumulate ? dev_upload(y0, sizeof(float) * ny) : dev_poisoned(ny);
    float *dy2 = accumulate ? dev_upload(y0, sizeof(float) * ny) : dev_poisoned(ny);
    GPU_OK(tdm_gpu_matvec(g_gpu, ta, a.dw, ra, k, dx, dq, 1, dy1, accumulate, ERR));
    GPU_OK(tdm_gpu_matvec(g_gpu, tb, b.dw, rb, k, dx, dq, 1, dy1 + ra, accumulate, ERR));
    const tdm_gpu_mat ma = {ta, a.dw, ra}, mb = {tb, b.dw, rb};
    GPU_OK(tdm_gpu_matvec_pair(g_gpu, &ma, &mb, k, dx, dq, dy2, accumulate, ERR));
    float *y1 = dev_download_f32(dy1, ny), *y2 = dev_download_f32(dy2, ny);
    for (size_t i = 0; i < ny; i++)
        if (isnan(y1[i]) || memcmp(&y1[i], &y2[i], sizeof(float)) != 0)
            fail_msg("matvec pair %s %lld | %s %lld, k %lld%s: row %zu: %.9g against %.9g (two launches)",
                     tdm_qtype_name(ta), (long long)ra, tdm_qtype_name(tb), (long long)rb, (long long)k,
                     accumulate ? " acc" : "", i, y2[i], y1[i]);
    free(x), free(y0), free(hq), free(y1), free(y2);
    dev_free(dx), dev_free(dq), dev_free(dy1), dev_free(dy2);
    problem_free(&a);
    problem_free(&b);
}

static void test_matvec_pair(void **state)
{
    (void)state;
    static const tdm_qtype ts[] = {TDM_Q_Q2_K, TDM_Q_Q3_K, TDM_Q_Q4_K, TDM_Q_Q5_K, TDM_Q_Q6_K, TDM_Q_Q8_0};
    const size_t nt = sizeof ts / sizeof ts[0];
    int one = 0, n = 0;
    for (size_t i = 0; i < nt; i++)
        for (size_t j = 0; j < nt; j++) {
            if (i == j)
                continue;
            one += tdm_gpu_matvec_pair_one_launch(ts[i], ts[j], 768, true);
            /* odd rows on both sides, every pair with a kernel in both orders
             * and the pairs without one (two launches) */
            run_pair(ts[i], 37 + (int64_t)i, ts[j], 5 + 2 * (int64_t)j, 768, n++ % 2 == 1);
        }
    assert_int_equal(one, 12); /* the 6 pairs of the table, either order */
    assert_false(tdm_gpu_matvec_pair_one_launch(TDM_Q_Q4_K, TDM_Q_Q6_K, 768, false));
    assert_false(tdm_gpu_matvec_pair_one_launch(TDM_Q_Q4_K, TDM_Q_Q6_K, 16640, true));
    assert_false(tdm_gpu_matvec_pair_one_launch(TDM_Q_Q4_K, TDM_Q_Q4_K, 768, true));
    /* Qwen3.5-35B-A3B's attention: q with its gate and k (Q4_K), v (Q6_K) */
    run_pair(TDM_Q_Q4_K, 8192 + 512, TDM_Q_Q6_K, 512, 2048, false);
    /* a row too long for the copy in shared memory: two launches */
    run_pair(TDM_Q_Q4_K, 9, TDM_Q_Q6_K, 3, 16640, true);
    /* bad input */
    tdm_error e = {0};
    float *dx = dev_poisoned(4096), *dy = dev_poisoned(4096);
    void *dw = dev_alloc(1 << 16), *dq = dev_alloc(tdm_gpu_xq8_bytes(1, 256));
    const tdm_gpu_mat ma = {TDM_Q_Q4_K, dw, 4}, mb = {TDM_Q_Q6_K, dw, 4}, mn = {TDM_Q_Q6_K, NULL, 4};
    assert_int_equal(tdm_gpu_matvec_pair(g_gpu, &ma, NULL, 256, dx, dq, dy, false, &e), TDM_ERR_INVALID);
    printf("  %s\n", e.msg);
    assert_int_equal(tdm_gpu_matvec_pair(g_gpu, &ma, &mn, 256, dx, dq, dy, false, &e), TDM_ERR_INVALID);
    printf("  %s\n", e.msg);
    assert_int_equal(tdm_gpu_matvec_pair(g_gpu, &ma, &mb, 300, dx, dq, dy, false, &e), TDM_ERR_INVALID);
    assert_int_equal(tdm_gpu_matvec_pair(g_gpu, &ma, &mb, 256, dx + 1, dq, dy, false, &e), TDM_ERR_INVALID);
    assert_int_equal(tdm_gpu_matvec_pair(g_gpu, &ma, &mb, 256, dx, (char *)dq + 4, dy, false, &e),
                     TDM_ERR_INVALID);
    printf("  %s\n", e.msg);
    GPU_OK(tdm_gpu_sync(g_gpu, ERR));
    dev_free(dx), dev_free(dy), dev_free(dw), dev_free(dq);
}

static void test_dequant_f16(void **state)
{
    (void)state;
    for (size_t ti = 0; ti < N_GPU_TYPES; ti++) {
        tdm_qtype t = k_gpu_types[ti];
        int64_t blk = tdm_qtype_get(t)->block < 8 ? 8 : tdm_qtype_get(t)->block;
        int64_t rows = 19, k = blk * 3;
        problem p;
        problem_make(&p, t, rows, k);
        uint16_t *d16 = dev_alloc(2 * rows * k);
        GPU_OK(tdm_gpu_memset(g_gpu, d16, 0xFF, 2 * rows * k, ERR)); /* NaN halves */
        GPU_OK(tdm_gpu_dequant_f16(g_gpu, t, p.dw, rows, k, d16, ERR));
        uint16_t *h16 = malloc(2 * rows * k);
        GPU_OK(tdm_gpu_sync(g_gpu, ERR));
        GPU_OK(tdm_gpu_download(g_gpu, h16, d16, 2 * rows * k, ERR));
        for (int64_t i = 0; i < rows * k; i++)
            if (h16[i] != tdm_fp32_to_fp16(p.wf[i]))
                fail_msg("dequant_f16 %s elem %lld: 0x%04x != 0x%04x", tdm_qtype_name(t),
                         (long long)i, h16[i], tdm_fp32_to_fp16(p.wf[i]));
        printf("  dequant_f16 %-8s %lldx%lld bit-exact (fp16 of the exact value)\n",
               tdm_qtype_name(t), (long long)rows, (long long)k);
        free(h16);
        dev_free(d16);
        problem_free(&p);
    }
}

static void run_matmul(tdm_qtype t, int64_t rows, int64_t k, int64_t ntok, int64_t chunk_rows)
{
    problem p;
    problem_make(&p, t, rows, k);
    float *x = malloc(sizeof(float) * ntok * k);
    rand_floats(x, (size_t)ntok * k, 1.0f);
    double *ref = malloc(sizeof(double) * ntok * rows), *bound = malloc(sizeof(double) * ntok * rows);
    double *xe = malloc(sizeof(double) * ntok * k);
    for (int64_t i = 0; i < ntok * k; i++)
        xe[i] = x[i];
    /* fp16 roundings of w and x; F32 weights stay float32 (SGEMM) */
    reference(&p, xe, ntok, t == TDM_Q_F32 ? 1e-5 : 2e-3, ref, bound);
    free(xe);
    float *dx = dev_upload(x, sizeof(float) * ntok * k);
    float *dy = dev_poisoned((size_t)ntok * rows);
    size_t sb = tdm_gpu_matmul_scratch_bytes(chunk_rows, k, ntok);
    void *scratch = dev_alloc(sb);
    GPU_OK(tdm_gpu_matmul(g_gpu, t, p.dw, rows, k, dx, ntok, dy, scratch, sb, ERR));
    float *y = dev_download_f32(dy, (size_t)ntok * rows);
    char what[96];
    snprintf(what, sizeof what, "matmul %s %lldx%lld ntok %lld chunk %lld", tdm_qtype_name(t),
             (long long)rows, (long long)k, (long long)ntok, (long long)chunk_rows);
    check_close(what, y, ref, bound, (size_t)ntok * rows, 0, 0);
    free(y);
    free(x);
    free(ref);
    free(bound);
    dev_free(dx);
    dev_free(dy);
    dev_free(scratch);
    problem_free(&p);
}

static void test_matmul(void **state)
{
    (void)state;
    /* racecheck crashes inside cuBLAS's own GEMM kernels ("Internal Sanitizer
     * Error"); memcheck covers this path, racecheck the dequant kernels alone */
    const char *san = getenv("TDM_SANITIZER");
    if (san && !strcmp(san, "racecheck"))
        skip();
    for (size_t ti = 0; ti < N_GPU_TYPES; ti++) {
        tdm_qtype t = k_gpu_types[ti];
        int64_t blk = tdm_qtype_get(t)->block < 8 ? 8 : tdm_qtype_get(t)->block;
        run_matmul(t, 45, blk * 2, 17, 16); /* 3 chunks, the last partial */
    }
    run_matmul(TDM_Q_Q4_K, 512, 2048, 64, 512);
    run_matmul(TDM_Q_Q6_K, 2048, 512, 33, 700);
    run_matmul(TDM_Q_F32, 257, 2048, 512, 1); /* a prompt's router product */
}

static void test_bad_input(void **state)
{
    (void)state;
    tdm_error e = {0};
    float *dx = dev_poisoned(4096), *dy = dev_poisoned(4096);
    void *dw = dev_alloc(1 << 16);
    assert_int_equal(tdm_gpu_matvec(g_gpu, TDM_Q_IQ2_XXS, dw, 4, 256, dx, NULL, 1, dy, false, &e),
                     TDM_ERR_UNSUPPORTED);
    printf("  %s\n", e.msg);
    assert_int_equal(tdm_gpu_matvec(g_gpu, TDM_Q_Q4_K, dw, 4, 300, dx, NULL, 1, dy, false, &e),
                     TDM_ERR_INVALID);
    printf("  %s\n", e.msg);
    assert_int_equal(tdm_gpu_matvec(g_gpu, TDM_Q_Q4_K, dw, 4, 256, dx, NULL, 0, dy, false, &e),
                     TDM_ERR_INVALID);
    assert_int_equal(tdm_gpu_matvec(g_gpu, TDM_Q_Q4_K, NULL, 4, 256, dx, NULL, 1, dy, false, &e),
                     TDM_ERR_INVALID);
    assert_int_equal(tdm_gpu_matvec(g_gpu, TDM_Q_Q4_K, dw, 4, 256, dx + 1, NULL, 1, dy, false, &e),
                     TDM_ERR_INVALID);
    /* an int8 copy of x serves one token, from an aligned address */
    assert_int_equal(tdm_gpu_matvec(g_gpu, TDM_Q_Q4_K, dw, 4, 256, dx, dw, 2, dy, false, &e), TDM_ERR_INVALID);
    printf("  %s\n", e.msg);
    assert_int_equal(tdm_gpu_matvec(g_gpu, TDM_Q_Q4_K, dw, 4, 256, dx, (char *)dw + 4, 1, dy, false, &e),
                     TDM_ERR_INVALID);
    assert_int_equal(tdm_gpu_matmul(g_gpu, TDM_Q_Q4_K, dw, 4, 256, dx, 2, dy, dw, 16, &e),
                     TDM_ERR_INVALID);
    printf("  %s\n", e.msg);
    /* a CUDA failure is reported with its call site, not a crash (skipped
     * under compute-sanitizer, which counts the deliberate failure as an error) */
    if (!getenv("TDM_SANITIZER")) {
        void *huge = NULL;
        assert_int_equal(tdm_gpu_alloc(g_gpu, (size_t)1 << 50, &huge, &e), TDM_ERR_OOM);
        printf("  %s\n", e.msg);
    }
    assert_int_equal(tdm_gpu_mark(g_gpu, 99, &e), TDM_ERR_INVALID);
    assert_int_equal(tdm_gpu_create(4096, &(tdm_gpu *){NULL}, &e), TDM_ERR_INVALID);
    printf("  %s\n", e.msg);
    GPU_OK(tdm_gpu_sync(g_gpu, ERR));
    dev_free(dx);
    dev_free(dy);
    dev_free(dw);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matvec_all_types),
        cmocka_unit_test(test_matvec_expert_shapes),
        cmocka_unit_test(test_matvec_tunings),
        cmocka_unit_test(test_matvec_pair),
        cmocka_unit_test(test_dequant_f16),
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, gpu_setup, gpu_teardown);
}
