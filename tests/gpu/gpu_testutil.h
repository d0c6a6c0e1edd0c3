/* gpu_testutil: shared pieces of the GPU tests (header-only, static):
 * a seeded RNG, random but valid quantised rows (finite scales), device
 * buffers that fail the test on error, NaN poisoning and error metrics. */
#ifndef TDM_GPU_TESTUTIL_H
#define TDM_GPU_TESTUTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu.h"
#include "qrand.h"
#include "quant.h"

/* The formats the GPU kernels support (gpu.h). */
static const tdm_qtype k_gpu_types[] __attribute__((unused)) = {
    TDM_Q_F32,  TDM_Q_F16,  TDM_Q_BF16, TDM_Q_Q4_0, TDM_Q_Q4_1,   TDM_Q_Q5_0,
    TDM_Q_Q5_1, TDM_Q_Q8_0, TDM_Q_Q2_K, TDM_Q_Q3_K, TDM_Q_Q4_K,   TDM_Q_Q5_K,
    TDM_Q_Q6_K, TDM_Q_IQ4_NL, TDM_Q_IQ4_XS, TDM_Q_MXFP4};
#define N_GPU_TYPES (sizeof k_gpu_types / sizeof k_gpu_types[0])

static uint64_t g_rng __attribute__((unused)) = 0x9E3779B97F4A7C15ull;

static inline void rng_seed_fresh(void)
{
    const char *s = getenv("TDM_TEST_SEED");
    g_rng = s ? strtoull(s, NULL, 0) : ((uint64_t)time(NULL) * 0x2545F4914F6CDD1Dull) ^ (uint64_t)clock();
    if (!g_rng)
        g_rng = 1;
    printf("seed %llu (set TDM_TEST_SEED to repeat)\n", (unsigned long long)g_rng);
}

static inline uint64_t rng_u64(void)
{
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline float rng_unif(void) { return (float)((rng_u64() >> 40) * (1.0 / 16777216.0)); } /* [0,1) */
static inline float rng_sym(void) { return 2.0f * rng_unif() - 1.0f; }                        /* [-1,1) */
static inline float rng_normalish(void) { return rng_sym() + rng_sym() + rng_sym(); }

/* Fills one row of n elements of type t with random but valid data
 * (finite scales, values of a random magnitude), through gpu_experts/qrand. */
static inline void rand_row(tdm_qtype t, uint8_t *row, int64_t n)
{
    tdm_error e = {0};
    float sigma = 0.05f * (float)(1u << (rng_u64() % 5)) / 4.0f;
    if (tdm_qrand_fill(t, row, n / tdm_qtype_get(t)->block, sigma, rng_u64(), &e) != TDM_OK) {
        fprintf(stderr, "rand_row: %s\n", e.msg);
        abort();
    }
}

static inline void rand_floats(float *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++)
        x[i] = scale * rng_normalish();
}

/* ---- device helpers that fail the test (cmocka) on error ---- */
#define GPU_OK(call)                                                                     \
    do {                                                                                 \
        tdm_error e_ = {0};                                                              \
        tdm_status s_ = (call);                                                          \
        if (s_ != TDM_OK)                                                                \
            fail_msg("%s:%d: %s -> %s: %s", __FILE__, __LINE__, #call, tdm_status_name(s_), \
                     e_.msg);                                                            \
    } while (0)
/* The calls above must pass &e_ as their error argument: */
#define ERR (&e_)

static tdm_gpu *g_gpu __attribute__((unused));

static inline int gpu_setup(void **state)
{
    (void)state;
    tdm_error e = {0};
    if (tdm_gpu_create(0, &g_gpu, &e) != TDM_OK) {
        fprintf(stderr, "no usable CUDA device: %s\n", e.msg);
        return -1;
    }
    tdm_gpu_info info;
    if (tdm_gpu_query(g_gpu, &info, &e) == TDM_OK)
        printf("device %s, %d SMs, cc %d.%d, %.1f/%.1f GiB free\n", info.name, info.sm_count,
               info.cc_major, info.cc_minor, info.mem_free / 1073741824.0,
               info.mem_total / 1073741824.0);
    rng_seed_fresh();
    return 0;
}

static inline int gpu_teardown(void **state)
{
    (void)state;
    tdm_gpu_free(g_gpu);
    g_gpu = NULL;
    return 0;
}

static inline void *dev_alloc(size_t bytes)
{
    void *p = NULL;
    GPU_OK(tdm_gpu_alloc(g_gpu, bytes, &p, ERR));
    return p;
}

static inline void *dev_upload(const void *src, size_t bytes)
{
    void *p = dev_alloc(bytes);
    GPU_OK(tdm_gpu_upload(g_gpu, p, src, bytes, ERR));
    return p;
}

/* A NaN-poisoned float buffer of n elements. */
static inline float *dev_poisoned(size_t n)
{
    float *p = (float *)dev_alloc(n * sizeof(float));
    GPU_OK(tdm_gpu_fill_f32(g_gpu, p, NAN, n, ERR));
    return p;
}

static inline void dev_free(void *p) { tdm_gpu_release(g_gpu, p); }

static inline float *dev_download_f32(const float *d, size_t n)
{
    float *h = (float *)malloc(n * sizeof(float));
    assert_non_null(h);
    GPU_OK(tdm_gpu_sync(g_gpu, ERR));
    GPU_OK(tdm_gpu_download(g_gpu, h, d, n * sizeof(float), ERR));
    return h;
}

/* Checks every element: written (not NaN), |got - ref| <= bound[i] (or
 * tol * |ref| + atol when bound is NULL). Prints the worst and returns the
 * norm-wise relative error. */
static inline double check_close(const char *what, const float *got, const double *ref,
                          const double *bound, size_t n, double tol, double atol)
{
    double num = 0, den = 0, worst = 0;
    size_t wi = 0, bad = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        double lim = bound ? bound[i] : tol * fabs(ref[i]) + atol;
        if (!(d <= lim)) { /* NaN fails here too */
            if (bad < 5)
                fprintf(stderr, "%s: [%zu] got %.9g want %.9g (|d| %.3g > %.3g)\n", what, i,
                        (double)got[i], ref[i], d, lim);
            bad++;
        }
        num += d * d;
        den += ref[i] * ref[i];
        if (d / (lim > 0 ? lim : 1) > worst) {
            worst = d / (lim > 0 ? lim : 1);
            wi = i;
        }
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    printf("  %-40s n=%-8zu rel %.3e  worst/limit %.3f at %zu\n", what, n, rel, worst, wi);
    if (bad)
        fail_msg("%s: %zu of %zu elements out of bounds", what, bad, n);
    return rel;
}

#endif
