/* Sampler tests: greedy = argmax, seeded reproducibility, penalties, and a
 * chi-square test of the drawn distribution against an independent reference
 * of temperature / top-k / top-p / min-p (which also shows that plausible
 * wrong implementations fail the same threshold). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sampler.h"

#define NV 64
#define NMAX 3000

static uint64_t rs = 0x9E3779B97F4A7C15ull;
static double urand(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (double)(rs >> 11) * 0x1.0p-53;
}

static void random_logits(float *l, int n, double scale)
{
    for (int i = 0; i < n; i++) /* sum of uniforms: roughly normal, distinct values */
        l[i] = (float)(scale * (urand() + urand() + urand() - 1.5));
}

static tdm_sampler *new_sampler(int n, tdm_sampler_params p)
{
    tdm_sampler *s;
    tdm_error err;
    if (tdm_sampler_new(n, &p, &s, &err))
        fail_msg("sampler_new: %s", err.msg);
    return s;
}

static tdm_sampler_params plain(float temp)
{
    tdm_sampler_params p = tdm_sampler_default_params();
    p.temperature = temp;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    return p;
}

/* The sampler's e^x for x <= 0 against exp in double: within 2 ulp of the
 * float result over [-87, 0] (a fine grid and random points), exactly 1 at
 * 0, 0 below -87 and at -inf. A mistake in the range reduction or the
 * polynomial is off by far more. */
static void test_exp_neg(void **state)
{
    (void)state;
    double worst = 0;
    uint64_t r = 0x243F6A8885A308D3ull;
    for (int i = 0; i <= 2000000; i++) {
        float x;
        if (i <= 1000000) {
            x = -87.0f * (float)i / 1000000.0f;
        } else {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            x = -87.0f * (float)((r >> 40) & 0xFFFFFF) / (float)0xFFFFFF;
        }
        const double want = exp((double)x);
        const float got = tdm_sampler_exp_neg(x);
        const double ulp = (double)nextafterf((float)want, INFINITY) - (double)(float)want;
        const double err = fabs((double)got - want) / ulp;
        if (err > worst)
            worst = err;
        if (!(err <= 2.0))
            fail_msg("exp_neg(%.9g) = %.9g, exp = %.9g (%.2f ulp)", (double)x, (double)got, want, err);
    }
    printf("  exp_neg: worst %.2f ulp over [-87, 0]\n", worst);
    assert_true(tdm_sampler_exp_neg(0.0f) == 1.0f);
    assert_true(tdm_sampler_exp_neg(-87.5f) == 0.0f);
    assert_true(tdm_sampler_exp_neg(-1e30f) == 0.0f);
    assert_true(tdm_sampler_exp_neg(-INFINITY) == 0.0f);
}

static void test_greedy_is_argmax(void **state)
{
    (void)state;
    float l[1000];
    tdm_sampler *s = new_sampler(1000, plain(0.0f));
    for (int it = 0; it < 200; it++) {
        random_logits(l, 1000, 10.0);
        int best = 0;
        for (int i = 1; i < 1000; i++)
            if (l[i] > l[best])
                best = i;
        assert_int_equal(tdm_sampler_sample(s, l), best);
    }
    for (int i = 0; i < 1000; i++)
        l[i] = 1.0f;
    l[17] = l[500] = 2.0f;
    assert_int_equal(tdm_sampler_sample(s, l), 17); /* ties: lowest id */
    l[17] = NAN;
    assert_int_equal(tdm_sampler_sample(s, l), 500); /* NaN counts as -inf */
    for (int i = 0; i < 1000; i++)
        l[i] = -INFINITY;
    assert_int_equal(tdm_sampler_sample(s, l), 0);
    assert_true(tdm_sampler_greedy(s));
    tdm_sampler_free(s);
    /* greedy only without temperature and without an active penalty */
    tdm_sampler_params p = plain(0.0f);
    p.repeat_penalty = 1.1f;
    s = new_sampler(1000, p);
    assert_false(tdm_sampler_greedy(s));
    tdm_sampler_free(s);
    p.penalty_last_n = 0; /* a penalty over no tokens */
    s = new_sampler(1000, p);
    assert_true(tdm_sampler_greedy(s));
    tdm_sampler_free(s);
    p = plain(0.0f);
    p.presence_penalty = 0.5f;
    s = new_sampler(1000, p);
    assert_false(tdm_sampler_greedy(s));
    tdm_sampler_free(s);
    s = new_sampler(1000, plain(0.7f));
    assert_false(tdm_sampler_greedy(s));
    tdm_sampler_free(s);
}

static void test_reproducible(void **state)
{
    (void)state;
    float l[NV];
    random_logits(l, NV, 3.0);
    tdm_sampler_params p = tdm_sampler_default_params();
    p.seed = 42;
    tdm_sampler *a = new_sampler(NV, p), *b = new_sampler(NV, p);
    p.seed = 43;
    tdm_sampler *c = new_sampler(NV, p);
    int32_t seq[500];
    int differ = 0;
    for (int i = 0; i < 500; i++) {
        seq[i] = tdm_sampler_sample(a, l);
        assert_int_equal(tdm_sampler_sample(b, l), seq[i]);
        differ += tdm_sampler_sample(c, l) != seq[i];
    }
    assert_true(differ > 50);
    tdm_sampler_reset(a); /* restarts the same sequence */
    for (int i = 0; i < 500; i++)
        assert_int_equal(tdm_sampler_sample(a, l), seq[i]);
    tdm_sampler_seed(a, 42);
    assert_int_equal(tdm_sampler_sample(a, l), seq[0]);
    tdm_sampler_free(a);
    tdm_sampler_free(b);
    tdm_sampler_free(c);
}

static void test_penalties(void **state)
{
    (void)state;
    float l[4] = {1.0f, 0.9f, -1.0f, -1.5f};
    tdm_sampler_params p = plain(0.0f);
    p.frequency_penalty = 0.1f;
    p.penalty_last_n = 3;
    tdm_sampler *s = new_sampler(4, p);
    tdm_sampler_accept(s, 0);
    assert_int_equal(tdm_sampler_sample(s, l), 0); /* 1.0 - 0.1 > 0.9 */
    tdm_sampler_accept(s, 0);
    assert_int_equal(tdm_sampler_sample(s, l), 1); /* 1.0 - 0.2 < 0.9 */
    tdm_sampler_accept(s, 3);
    tdm_sampler_accept(s, 3); /* window of 3: one 0 left */
    assert_int_equal(tdm_sampler_sample(s, l), 0);
    tdm_sampler_accept(s, 3); /* 0 leaves the window */
    assert_int_equal(tdm_sampler_sample(s, l), 0);
    tdm_sampler_accept(s, 99);  /* out of range: ignored */
    tdm_sampler_accept(s, -1);
    tdm_sampler_free(s);

    p = plain(0.0f);
    p.presence_penalty = 0.05f;
    s = new_sampler(4, p);
    tdm_sampler_accept(s, 0);
    tdm_sampler_accept(s, 0);
    assert_int_equal(tdm_sampler_sample(s, l), 0); /* presence counts once: 0.95 > 0.9 */
    tdm_sampler_free(s);

    p = plain(0.0f);
    p.repeat_penalty = 2.0f;
    s = new_sampler(4, p);
    tdm_sampler_accept(s, 0);
    assert_int_equal(tdm_sampler_sample(s, l), 1); /* 1.0 / 2 < 0.9 */
    float neg[2] = {-1.0f, -1.5f};
    tdm_sampler_free(s);
    s = new_sampler(2, p);
    tdm_sampler_accept(s, 0);
    assert_int_equal(tdm_sampler_sample(s, neg), 1); /* -1 * 2 < -1.5 */
    tdm_sampler_reset(s);                            /* history cleared */
    assert_int_equal(tdm_sampler_sample(s, neg), 0);
    assert_true(neg[0] == -1.0f);                    /* caller's logits untouched */
    tdm_sampler_free(s);
}

static void test_bad_params(void **state)
{
    (void)state;
    tdm_sampler *s = (tdm_sampler *)1;
    tdm_error err;
    tdm_sampler_params p = tdm_sampler_default_params();
    assert_int_equal(tdm_sampler_new(0, &p, &s, &err), TDM_ERR_INVALID);
    assert_null(s);
    p.top_p = 0.0f;
    assert_int_equal(tdm_sampler_new(10, &p, &s, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.msg, "top_p"));
    p = tdm_sampler_default_params();
    p.temperature = NAN;
    assert_int_equal(tdm_sampler_new(10, &p, &s, &err), TDM_ERR_INVALID);
    p = tdm_sampler_default_params();
    p.penalty_last_n = -2;
    assert_int_equal(tdm_sampler_new(10, &p, &s, &err), TDM_ERR_INVALID);
    p = tdm_sampler_default_params();
    p.min_p = 1.5f;
    assert_int_equal(tdm_sampler_new(10, &p, &s, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_sampler_new(10, NULL, &s, &err), TDM_OK); /* NULL = defaults */
    assert_int_equal(tdm_sampler_params_get(s)->top_k, 40);
    tdm_sampler_free(s);
}

/* ---- chi-square ---- */

typedef enum { REF_OK, REF_NO_TEMP, REF_TEMP_FIRST, REF_NO_TOPP } ref_kind;

/* Independent reference: full sort, then the filters in the documented order. */
static void ref_dist(const float *l, int n, const tdm_sampler_params *p, ref_kind kind, double *out)
{
    static int idx[NMAX];
    double t = kind == REF_NO_TEMP ? 1.0 : p->temperature;
    double pre = kind == REF_TEMP_FIRST ? t : 1.0; /* wrong: filters see tempered logits */
    for (int i = 0; i < n; i++)
        idx[i] = i;
    for (int i = 0; i < n; i++) /* selection sort, descending */
        for (int j = i + 1; j < n; j++)
            if (l[idx[j]] > l[idx[i]]) {
                int x = idx[i];
                idx[i] = idx[j];
                idx[j] = x;
            }
    int keep = (p->top_k > 0 && p->top_k < n) ? p->top_k : n;
    double lmax = l[idx[0]];
    if (p->top_p < 1.0f && kind != REF_NO_TOPP) {
        double z = 0, cum = 0;
        for (int i = 0; i < keep; i++)
            z += exp((l[idx[i]] - lmax) / pre);
        for (int i = 0; i < keep; i++) {
            cum += exp((l[idx[i]] - lmax) / pre) / z;
            if (cum >= p->top_p) {
                keep = i + 1;
                break;
            }
        }
    }
    for (int i = 0; i < n; i++)
        out[i] = 0;
    double z = 0;
    for (int i = 0; i < keep; i++) {
        if (p->min_p > 0 && exp((l[idx[i]] - lmax) / pre) < p->min_p)
            continue;
        out[idx[i]] = exp((l[idx[i]] - lmax) / t);
        z += out[idx[i]];
    }
    for (int i = 0; i < n; i++)
        out[i] /= z;
}

/* Chi-square of observed counts against probabilities e (bins with an
 * expected count < 5 pooled). *df receives the degrees of freedom; returns
 * INFINITY when a zero-probability token was drawn. */
static double chi_square(const long *obs, const double *e, int n, long draws, int *df)
{
    double chi = 0, pool_e = 0;
    long pool_o = 0;
    int bins = 0;
    for (int i = 0; i < n; i++) {
        double ex = e[i] * (double)draws;
        if (e[i] == 0 && obs[i] > 0)
            return INFINITY;
        if (ex < 5) {
            pool_e += ex;
            pool_o += obs[i];
            continue;
        }
        chi += (obs[i] - ex) * (obs[i] - ex) / ex;
        bins++;
    }
    if (pool_e >= 5) {
        chi += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
        bins++;
    } else if (pool_o > 0 && pool_e > 0) { /* tiny pooled bin: fold it into the statistic conservatively */
        chi += (pool_o - pool_e) * (pool_o - pool_e) / 5.0;
    }
    *df = bins - 1;
    return chi;
}

/* Upper critical value at p = 1e-4 (Wilson-Hilferty). */
static double chi_crit(int df)
{
    double z = 3.719, a = 2.0 / (9.0 * df);
    return df * pow(1 - a + z * sqrt(a), 3);
}

static void run_chi_n(const char *name, tdm_sampler_params p, const ref_kind *wrong, int n_wrong, int n,
                      double scale, long draws)
{
    static float l[NMAX];
    static long obs[NMAX];
    static double e[NMAX];
    random_logits(l, n, scale);
    tdm_sampler *s = new_sampler(n, p);
    memset(obs, 0, sizeof obs);
    for (long i = 0; i < draws; i++)
        obs[tdm_sampler_sample(s, l)]++;
    int df;
    ref_dist(l, n, &p, REF_OK, e);
    double chi = chi_square(obs, e, n, draws, &df);
    printf("%-32s chi2 = %8.2f  df = %3d  crit(1e-4) = %6.2f", name, chi, df, chi_crit(df > 0 ? df : 1));
    assert_true(df >= 1);
    assert_true(chi < chi_crit(df));
    for (int w = 0; w < n_wrong; w++) { /* the same draws fail against a wrong model */
        int dfw;
        ref_dist(l, n, &p, wrong[w], e);
        double cw = chi_square(obs, e, n, draws, &dfw);
        printf("  wrong[%d] chi2 = %.3g", (int)wrong[w], cw);
        assert_true(dfw < 1 || cw > chi_crit(dfw));
    }
    printf("\n");
    tdm_sampler_free(s);
}

static void run_chi(const char *name, tdm_sampler_params p, const ref_kind *wrong, int n_wrong)
{
    run_chi_n(name, p, wrong, n_wrong, NV, 4.0, 100000);
}

static void test_chi_square(void **state)
{
    (void)state;
    tdm_sampler_params p = plain(1.0f);
    p.seed = 1;
    run_chi("temperature 1.0", p, NULL, 0);
    p.temperature = 0.6f;
    run_chi("temperature 0.6", p, (ref_kind[]){REF_NO_TEMP}, 1);
    p = plain(1.5f);
    p.top_k = 8;
    p.seed = 2;
    run_chi("top-k 8, temperature 1.5", p, (ref_kind[]){REF_NO_TEMP}, 1);
    p = plain(0.8f);
    p.top_p = 0.9f;
    p.seed = 3;
    run_chi("top-p 0.9, temperature 0.8", p, (ref_kind[]){REF_NO_TOPP, REF_TEMP_FIRST}, 2);
    p = plain(1.3f);
    p.min_p = 0.05f;
    p.seed = 4;
    run_chi("min-p 0.05, temperature 1.3", p, (ref_kind[]){REF_TEMP_FIRST}, 1);
    p = plain(0.9f);
    p.top_k = 20;
    p.top_p = 0.95f;
    p.min_p = 0.02f;
    p.seed = 5;
    run_chi("top-k 20, top-p .95, min-p .02", p, (ref_kind[]){REF_NO_TEMP}, 1);
    /* > 1024 candidates: the bucketed top-p path */
    p = plain(0.7f);
    p.top_p = 0.8f;
    p.seed = 6;
    run_chi_n("3000 tokens, top-p 0.8, temp 0.7", p, (ref_kind[]){REF_NO_TOPP, REF_TEMP_FIRST}, 2, NMAX, 6.0, 20000);
    p = plain(1.0f);
    p.top_k = 2000;
    p.top_p = 0.5f;
    p.min_p = 0.01f;
    p.seed = 7;
    run_chi_n("3000 tokens, k 2000, p .5, min-p", p, (ref_kind[]){REF_NO_TOPP}, 1, NMAX, 6.0, 20000);
}

/* Large vocabulary, top-p without top-k: the incremental sort path. */
static void test_large_vocab_top_p(void **state)
{
    (void)state;
    int n = 248320;
    float *l = malloc((size_t)n * sizeof *l);
    random_logits(l, n, 2.0);
    l[1234] = 30.0f; /* dominant: top-p 0.5 must keep only it */
    tdm_sampler_params p = plain(1.0f);
    p.top_p = 0.5f;
    tdm_sampler *s = new_sampler(n, p);
    for (int i = 0; i < 5; i++)
        assert_int_equal(tdm_sampler_sample(s, l), 1234);
    l[1234] = 0.0f;
    p.top_p = 0.999f;
    tdm_sampler_free(s);
    s = new_sampler(n, p);
    for (int i = 0; i < 5; i++) { /* a flat distribution: nearly everything stays a candidate */
        int32_t t = tdm_sampler_sample(s, l);
        assert_true(t >= 0 && t < n);
    }
    tdm_sampler_free(s);
    free(l);
}

/* top-k keeps the k best by (logit, then lower id): over 1000 logits (whole
 * blocks of the streaming pass and a tail) the heap fills at once with ties
 * (ids 0-5), later blocks and the tail bring larger logits that must enter
 * and equal ones that must not, NaN is sprinkled; only the kept ids are
 * ever drawn and each of them is. */
static void test_top_k_set(void **state)
{
    (void)state;
    enum { N = 1000, DRAWS = 3000 };
    float l[N];
    for (int i = 0; i < N; i++)
        l[i] = (float)urand();
    l[5 + 64] = l[333] = NAN;
    for (int i = 0; i < 6; i++)
        l[i] = 4.5f;
    const int larger[] = {70, 700, 900, 990}; /* 990: in the tail */
    for (int i = 0; i < 4; i++)
        l[larger[i]] = 5.0f;
    l[300] = l[980] = 4.5f; /* ties with later ids: never kept */
    tdm_sampler_params p = plain(1.0f);
    p.top_k = 6;
    tdm_sampler *s = new_sampler(N, p);
    int seen[N] = {0};
    for (int d = 0; d < DRAWS; d++)
        seen[tdm_sampler_sample(s, l)]++;
    const int kept[] = {0, 1, 70, 700, 900, 990};
    int total = 0;
    for (int i = 0; i < 6; i++) {
        if (seen[kept[i]] == 0)
            fail_msg("top-k: id %d never drawn", kept[i]);
        total += seen[kept[i]];
    }
    assert_int_equal(total, DRAWS);
    tdm_sampler_free(s);
}

/* The rule, one logit at a time. */
static int32_t ref_argmax(const float *l, int32_t n)
{
    int32_t best = 0;
    float bv = -INFINITY;
    for (int32_t i = 0; i < n; i++)
        if (l[i] > bv) {
            bv = l[i];
            best = i;
        }
    return best;
}

/* The shared greedy pick: lowest id on ties, NaN never chosen; then random
 * vectors of every length up to 300 and a vocabulary-sized one, with the
 * largest value repeated (inside one block, across blocks, in the tail),
 * NaN and -inf sprinkled, and all -inf/NaN. */
static void test_argmax_rules(void **state)
{
    (void)state;
    const float ties[5] = {1.0f, 3.0f, -2.0f, 3.0f, 0.5f};
    assert_int_equal(tdm_sampler_argmax(ties, 5), 1);
    const float nan_first[4] = {NAN, -1.0f, NAN, -0.5f};
    assert_int_equal(tdm_sampler_argmax(nan_first, 4), 3);
    const float none[3] = {-INFINITY, NAN, -INFINITY};
    assert_int_equal(tdm_sampler_argmax(none, 3), 0);
    enum { BIG = 248321 };
    float *l = malloc(sizeof(float) * BIG);
    assert_non_null(l);
    for (int32_t n = 1; n <= BIG; n = n < 300 ? n + 1 : BIG + 1) {
        const int32_t len = n <= 300 ? n : BIG;
        for (int rep = 0; rep < 4; rep++) {
            random_logits(l, len, 4.0);
            for (int32_t i = 0; i < len; i++) {
                const double u = urand();
                if (u < 0.02)
                    l[i] = NAN;
                else if (u < 0.04)
                    l[i] = -INFINITY;
            }
            const int32_t a = (int32_t)(urand() * len), b = (int32_t)(urand() * len);
            if (rep == 1) /* the largest twice */
                l[a] = l[b] = 100.0f;
            else if (rep == 2) /* everything -inf or NaN */
                for (int32_t i = 0; i < len; i++)
                    l[i] = i % 3 ? -INFINITY : NAN;
            else if (rep == 3) /* the largest in the last (partial) block and earlier */
                l[len - 1] = l[a] = 50.0f;
            const int32_t want = ref_argmax(l, len), got = tdm_sampler_argmax(l, len);
            if (got != want)
                fail_msg("argmax of %d logits (case %d): %d, want %d", len, rep, got, want);
        }
    }
    free(l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exp_neg),
        cmocka_unit_test(test_greedy_is_argmax), cmocka_unit_test(test_reproducible),
        cmocka_unit_test(test_argmax_rules),     cmocka_unit_test(test_top_k_set),
        cmocka_unit_test(test_penalties),        cmocka_unit_test(test_bad_params),
        cmocka_unit_test(test_chi_square),       cmocka_unit_test(test_large_vocab_top_p),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
