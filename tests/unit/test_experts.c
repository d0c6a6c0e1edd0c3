/* test_experts: the CPU expert pool (cpu_experts/experts.h) against a float64
 * reference computed from dequantised weights: F32 (tight), Q8_0 and mixed
 * gate/up/down formats (loose: activations are quantised to 8 bit), odd
 * widths, many tokens per expert, tokens without selections, accumulate,
 * identical results for 1 and 2 threads, and rejected bad selections. The
 * team entry point (tdm_experts_run_team) on a plain pthread team of 1..5
 * threads gives the same bits as tdm_experts_run on random cases. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "experts.h"
#include "quant.h"

static uint64_t rng = 42;
static float frand(void)
{
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((rng >> 40) & 0xFFFFFF) / 16777216.0f * 2.0f - 1.0f;
}

/* n_mat matrices of rows x cols in type t, random; returns bytes (caller frees). */
static uint8_t *make_weights(tdm_qtype t, int64_t rows, int64_t cols, int n_mat, float scale)
{
    size_t rb = tdm_qtype_row_bytes(t, cols), total = rb * (size_t)rows * n_mat;
    uint8_t *w = malloc(total);
    for (size_t r = 0; r < (size_t)rows * n_mat; r++) {
        uint8_t *row = w + r * rb;
        if (t == TDM_Q_F32) {
            for (int64_t i = 0; i < cols; i++)
                ((float *)row)[i] = frand() * scale;
        } else if (t == TDM_Q_Q8_0) { /* {fp16 d, int8 qs[32]} */
            for (int64_t b = 0; b < cols / 32; b++) {
                uint16_t d = tdm_fp32_to_fp16(scale / 127.0f * (0.5f + 0.5f * fabsf(frand())));
                memcpy(row + b * 34, &d, 2);
                for (int i = 0; i < 32; i++)
                    ((int8_t *)row)[b * 34 + 2 + i] = (int8_t)(frand() * 127);
            }
        } else if (t == TDM_Q_Q4_0) { /* {fp16 d, uint8 qs[16]} */
            for (int64_t b = 0; b < cols / 32; b++) {
                uint16_t d = tdm_fp32_to_fp16(scale / 8.0f * (0.5f + 0.5f * fabsf(frand())));
                memcpy(row + b * 18, &d, 2);
                for (int i = 0; i < 16; i++)
                    row[b * 18 + 2 + i] = (uint8_t)((frand() + 1.0f) * 127.9f);
            }
        }
    }
    return w;
}

static void deq(tdm_qtype t, const uint8_t *w, int64_t row, int64_t cols, float *out)
{
    tdm_error err;
    assert_int_equal(tdm_dequant_row(t, w + (size_t)row * tdm_qtype_row_bytes(t, cols), out, cols, &err), TDM_OK);
}

/* out[t] = sum_s w_s * down(silu(gate x) * up x) in double from dequantised weights */
static void reference(const tdm_experts_desc *d, const float *x, int n_tok, const tdm_expert_sel *sel, int n_sel,
                      double *out)
{
    const int64_t D = d->n_embd, F = d->n_ff;
    float *row = malloc(sizeof(float) * (D > F ? D : F));
    double *h = malloc(sizeof(double) * F);
    memset(out, 0, sizeof(double) * n_tok * D);
    for (int s = 0; s < n_sel; s++) {
        const float *xt = x + (size_t)sel[s].token * D;
        const int64_t e = sel[s].expert;
        for (int64_t r = 0; r < F; r++) {
            double g = 0, u = 0;
            deq(d->gate_type, (const uint8_t *)d->gate + e * d->gate_stride, r, D, row);
            for (int64_t i = 0; i < D; i++)
                g += (double)row[i] * xt[i];
            deq(d->up_type, (const uint8_t *)d->up + e * d->up_stride, r, D, row);
            for (int64_t i = 0; i < D; i++)
                u += (double)row[i] * xt[i];
            h[r] = g / (1 + exp(-g)) * u;
        }
        for (int64_t r = 0; r < D; r++) {
            double y = 0;
            deq(d->down_type, (const uint8_t *)d->down + e * d->down_stride, r, F, row);
            for (int64_t i = 0; i < F; i++)
                y += (double)row[i] * h[i];
            out[(size_t)sel[s].token * D + r] += sel[s].weight * y;
        }
    }
    free(row);
    free(h);
}

static double rel_err(const float *a, const double *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += (a[i] - ref[i]) * (a[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

static void run_case(tdm_qtype tg, tdm_qtype tu, tdm_qtype td, int64_t D, int64_t F, int E, int n_tok, int k,
                     double tol)
{
    uint8_t *g = make_weights(tg, F, D, E, 0.3f), *u = make_weights(tu, F, D, E, 0.3f), *dn = make_weights(td, D, F, E, 0.3f);
    tdm_experts_desc d = {g, u, dn, tg, tu, td, tdm_qtype_row_bytes(tg, D) * F, tdm_qtype_row_bytes(tu, D) * F,
                          tdm_qtype_row_bytes(td, F) * D, D, F, E};
    float *x = malloc(sizeof(float) * n_tok * D), *out = malloc(sizeof(float) * n_tok * D);
    double *ref = malloc(sizeof(double) * n_tok * D);
    for (int i = 0; i < n_tok * D; i++)
        x[i] = frand();
    tdm_expert_sel *sel = malloc(sizeof *sel * n_tok * k);
    int n_sel = 0;
    for (int t = 0; t < n_tok; t++) {
        if (n_tok > 2 && t % 5 == 3)
            continue; /* some tokens without any expert */
        for (int i = 0; i < k; i++)
            sel[n_sel++] = (tdm_expert_sel){t, (t * 7 + i * 3) % E, 0.2f + 0.1f * i};
    }
    tdm_experts_scratch *s;
    tdm_error err = {0};
    assert_int_equal(tdm_experts_scratch_new(D, F, n_tok, n_tok * k, E, &s, &err), TDM_OK);
    memset(out, 0xff, sizeof(float) * n_tok * D); /* poisoned: must be overwritten */
    assert_int_equal(tdm_experts_run(&d, x, n_tok, sel, n_sel, out, false, s, &err), TDM_OK);
    reference(&d, x, n_tok, sel, n_sel, ref);
    double e = rel_err(out, ref, (size_t)n_tok * D);
    printf("  %s/%s/%s D=%lld F=%lld E=%d tok=%d k=%d sel=%d: rel err %.2e (tol %.0e)\n", tdm_qtype_name(tg),
           tdm_qtype_name(tu), tdm_qtype_name(td), (long long)D, (long long)F, E, n_tok, k, n_sel, e, tol);
    assert_true(e <= tol);
    /* accumulate adds on top */
    float *twice = malloc(sizeof(float) * n_tok * D);
    memcpy(twice, out, sizeof(float) * n_tok * D);
    assert_int_equal(tdm_experts_run(&d, x, n_tok, sel, n_sel, twice, true, s, &err), TDM_OK);
    for (int i = 0; i < n_tok * D; i++)
        assert_float_equal(twice[i], 2 * out[i], 1e-5 * (1 + fabsf(out[i])));
    /* same bits with one thread */
    int nth = omp_get_max_threads();
    omp_set_num_threads(1);
    assert_int_equal(tdm_experts_run(&d, x, n_tok, sel, n_sel, twice, false, s, &err), TDM_OK);
    omp_set_num_threads(nth);
    assert_memory_equal(twice, out, sizeof(float) * n_tok * D);
    tdm_experts_scratch_free(s);
    free(g), free(u), free(dn), free(x), free(out), free(ref), free(sel), free(twice);
}

static void test_f32(void **state)
{
    (void)state;
    run_case(TDM_Q_F32, TDM_Q_F32, TDM_Q_F32, 64, 40, 6, 9, 3, 1e-5);
    run_case(TDM_Q_F32, TDM_Q_F32, TDM_Q_F32, 33, 17, 3, 1, 1, 1e-5); /* decode shape, odd widths */
}

static void test_quantised(void **state)
{
    (void)state;
    run_case(TDM_Q_Q8_0, TDM_Q_Q8_0, TDM_Q_Q8_0, 96, 64, 5, 37, 2, 2e-2);
    run_case(TDM_Q_Q8_0, TDM_Q_F32, TDM_Q_Q4_0, 64, 96, 8, 12, 4, 2e-2); /* three activation formats */
}

static void test_bad_selections(void **state)
{
    (void)state;
    float w[4 * 4] = {0}, x[2 * 4] = {0}, out[2 * 4];
    tdm_experts_desc d = {w, w, w, TDM_Q_F32, TDM_Q_F32, TDM_Q_F32, 0, 0, 0, 4, 4, 1};
    tdm_experts_scratch *s;
    tdm_error err = {0};
    assert_int_equal(tdm_experts_scratch_new(4, 4, 2, 2, 1, &s, &err), TDM_OK);
    for (int i = 0; i < 8; i++)
        out[i] = 7.0f;
    tdm_expert_sel bad_expert = {0, 1, 1.0f}, bad_token = {2, 0, 1.0f}, ok[3] = {{0, 0, 1}, {1, 0, 1}, {0, 0, 1}};
    assert_int_equal(tdm_experts_run(&d, x, 2, &bad_expert, 1, out, false, s, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.msg, "expert 1"));
    assert_int_equal(tdm_experts_run(&d, x, 2, &bad_token, 1, out, false, s, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_experts_run(&d, x, 2, ok, 3, out, false, s, &err), TDM_ERR_INVALID); /* > max_sel */
    assert_int_equal(tdm_experts_run(&d, x, 3, ok, 1, out, false, s, &err), TDM_ERR_INVALID); /* > max_tok */
    for (int i = 0; i < 8; i++)
        assert_float_equal(out[i], 7.0f, 0); /* untouched */
    assert_int_equal(tdm_experts_run(&d, x, 2, ok, 2, out, false, s, &err), TDM_OK);
    for (int i = 0; i < 8; i++)
        assert_float_equal(out[i], 0.0f, 0);
    tdm_experts_scratch_free(s);
    assert_int_equal(tdm_experts_scratch_new(0, 4, 2, 2, 1, &s, &err), TDM_ERR_INVALID);
}

/* The simplest team: fresh pthreads per run, a pthread barrier. */
#define MAX_TEAM 5
typedef struct test_team {
    tdm_team team; /* first: the callbacks cast back */
    int started;   /* threads run starts (nth of the worker); 0: team.nth */
    pthread_barrier_t bar;
    void (*fn)(void *arg, int tid, int nth);
    void *arg;
    struct member {
        struct test_team *t;
        int tid;
    } m[MAX_TEAM];
} test_team;

static void *member_main(void *a)
{
    const struct member *m = a;
    m->t->fn(m->t->arg, m->tid, m->t->started);
    return NULL;
}

static void tt_run(tdm_team *team, void (*fn)(void *arg, int tid, int nth), void *arg)
{
    test_team *t = (test_team *)team;
    pthread_t th[MAX_TEAM];
    t->fn = fn;
    t->arg = arg;
    for (int i = 1; i < t->started; i++) {
        t->m[i] = (struct member){t, i};
        assert_int_equal(pthread_create(&th[i], NULL, member_main, &t->m[i]), 0);
    }
    fn(arg, 0, t->started);
    for (int i = 1; i < t->started; i++)
        pthread_join(th[i], NULL);
}

static void tt_barrier(tdm_team *team)
{
    pthread_barrier_wait(&((test_team *)team)->bar);
}

static int irand(int n)
{
    return (int)((frand() + 1.0f) * 0.5f * (float)n * 0.9999f);
}

static void test_team_bits(void **state)
{
    (void)state;
    alarm(300); /* a share nobody takes would leave a down item waiting forever */
    const tdm_qtype types[] = {TDM_Q_F32, TDM_Q_Q8_0, TDM_Q_Q4_0};
    int cases = 0;
    for (int c = 0; c < 30; c++) {
        const tdm_qtype tg = types[irand(3)], tu = types[irand(3)], td = types[irand(3)];
        const int64_t D = 32 * (1 + irand(4)), F = 32 * (1 + irand(4));
        const int E = 1 + irand(c % 2 ? 3 : 24); /* few or many experts */
        const int n_tok = 1 + 2 * irand(5);        /* odd token counts */
        const int k = 1 + irand(E < 8 ? E : 8);
        uint8_t *g = make_weights(tg, F, D, E, 0.3f), *u = make_weights(tu, F, D, E, 0.3f);
        uint8_t *dn = make_weights(td, D, F, E, 0.3f);
        tdm_experts_desc d = {g, u, dn, tg, tu, td, tdm_qtype_row_bytes(tg, D) * F, tdm_qtype_row_bytes(tu, D) * F,
                              tdm_qtype_row_bytes(td, F) * D, D, F, E};
        const size_t nf = (size_t)n_tok * D;
        float *x = malloc(sizeof(float) * nf), *want = malloc(sizeof(float) * nf), *got = malloc(sizeof(float) * nf);
        tdm_expert_sel *sel = malloc(sizeof *sel * n_tok * k);
        int n_sel = 0;
        for (size_t i = 0; i < nf; i++)
            x[i] = frand();
        for (int t = 0; t < n_tok; t++)
            for (int i = 0; i < k && irand(8) > 0; i++) /* some tokens get fewer or none */
                sel[n_sel++] = (tdm_expert_sel){t, irand(E), frand()};
        const bool acc = irand(2);
        tdm_experts_scratch *s;
        tdm_error err = {0};
        assert_int_equal(tdm_experts_scratch_new(D, F, n_tok, n_tok * k, E, &s, &err), TDM_OK);
        for (size_t i = 0; i < nf; i++)
            want[i] = acc ? x[nf - 1 - i] : NAN;
        assert_int_equal(tdm_experts_run(&d, x, n_tok, sel, n_sel, want, acc, s, &err), TDM_OK);
        /* teams of 1..MAX_TEAM, and teams that start fewer threads than their
         * nth (as an OpenMP region may): the missing threads' shares are
         * taken by the others */
        for (int v = 0; v < 2 * MAX_TEAM - 1; v++) {
            const int nth = v < MAX_TEAM ? v + 1 : v - MAX_TEAM + 2, started = v < MAX_TEAM ? nth : 1 + c % (nth - 1);
            test_team t = {.team = {.nth = nth, .run = tt_run, .barrier = tt_barrier}, .started = started};
            pthread_barrier_init(&t.bar, NULL, (unsigned)started);
            for (size_t i = 0; i < nf; i++)
                got[i] = acc ? x[nf - 1 - i] : NAN;
            assert_int_equal(tdm_experts_run_team(&t.team, &d, x, n_tok, sel, n_sel, got, acc, s, &err), TDM_OK);
            pthread_barrier_destroy(&t.bar);
            if (memcmp(got, want, sizeof(float) * nf))
                fail_msg("case %d (%s/%s/%s D=%lld F=%lld E=%d tok=%d sel=%d acc=%d): %d threads (%d started) differ",
                         c, tdm_qtype_name(tg), tdm_qtype_name(tu), tdm_qtype_name(td), (long long)D, (long long)F, E,
                         n_tok, n_sel, acc, nth, started);
        }
        cases++;
        tdm_experts_scratch_free(s);
        free(g), free(u), free(dn), free(x), free(want), free(got), free(sel);
    }
    alarm(0);
    printf("  %d random cases, teams of 1..%d threads (and short-started ones): bit-identical to tdm_experts_run "
           "(%d OpenMP threads)\n", cases, MAX_TEAM, omp_get_max_threads());
}

/* Shares tile the rows in order, start at multiples of 4 and are even (up to
 * the rounding to 4); a team past TDM_EXPERTS_MAX_TEAM is refused. */
static void test_shares(void **state)
{
    (void)state;
    const int64_t rows[] = {0, 1, 3, 4, 7, 16, 100, 511, 512, 2048, 2050};
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++)
        for (int nth = 1; nth <= 40; nth++) {
            int64_t prev = 0, big = 0;
            for (int t = 0; t < nth; t++) {
                int64_t r0, r1;
                tdm_experts_share(rows[i], t, nth, &r0, &r1);
                assert_int_equal(r0, prev);
                assert_true(r0 % 4 == 0 && r0 <= r1);
                big = r1 - r0 > big ? r1 - r0 : big;
                prev = r1;
            }
            assert_int_equal(prev, rows[i]);
            assert_true(big <= (rows[i] + nth - 1) / nth + 4);
        }
    int64_t r0, r1;
    tdm_experts_share(512, 3, 8, &r0, &r1);
    assert_true(r0 == 192 && r1 == 256);
    const int64_t D = 32, F = 32;
    uint8_t *w = make_weights(TDM_Q_F32, F, D, 1, 0.3f);
    tdm_experts_desc d = {w, w, w, TDM_Q_F32, TDM_Q_F32, TDM_Q_F32, 0, 0, 0, D, F, 1};
    float x[32] = {0}, out[32];
    tdm_expert_sel sel = {0, 0, 1.0f};
    tdm_experts_scratch *s;
    tdm_error err = {0};
    assert_int_equal(tdm_experts_scratch_new(D, F, 1, 1, 1, &s, &err), TDM_OK);
    test_team t = {.team = {.nth = TDM_EXPERTS_MAX_TEAM + 1, .run = tt_run, .barrier = tt_barrier}, .started = 1};
    assert_int_equal(tdm_experts_run_team(&t.team, &d, x, 1, &sel, 1, out, false, s, &err), TDM_ERR_INVALID);
    tdm_experts_scratch_free(s);
    free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f32),
        cmocka_unit_test(test_quantised),
        cmocka_unit_test(test_bad_selections),
        cmocka_unit_test(test_team_bits),
        cmocka_unit_test(test_shares),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
