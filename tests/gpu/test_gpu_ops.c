/* test_gpu_ops: norms, the attention inputs (q/k norms, RoPE, q/gate split,
 * KV store), attention (decode and prefill, GQA, gated, positions from
 * device memory), DeltaNet conv + recurrence (decode steps, the sequential
 * and the chunked prefill, the one-launch decode step), the router, the greedy choice and the
 * bound's dependent-stage probe, each against a float64 (the choice: a scalar) host reference on
 * fresh random data with poisoned outputs and odd sizes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "bench_bound.h"
#include "gpu_fwd.h"
#include "gpu_test_hooks.h"
#include "gpu_testutil.h"

static double *dalloc(size_t n)
{
    double *p = calloc(n, sizeof(double));
    assert_non_null(p);
    return p;
}

static float *frand(size_t n, float scale)
{
    float *p = malloc(n * sizeof(float));
    assert_non_null(p);
    rand_floats(p, n, scale);
    return p;
}

/* ---------------- RMSNorm ---------------- */
static void run_rmsnorm(int64_t rows, int64_t n, int64_t stride, bool gated)
{
    float *x = frand(rows * stride, 2.0f), *w = frand(n, 1.0f), *z = frand(rows * n, 3.0f);
    double *ref = dalloc(rows * stride);
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * (gated ? n : stride);
        double ss = 0;
        for (int64_t i = 0; i < n; i++)
            ss += (double)xr[i] * xr[i];
        double s = 1.0 / sqrt(ss / n + 1e-6);
        for (int64_t i = 0; i < n; i++) {
            double v = w[i] * (xr[i] * s);
            if (gated) {
                double zz = z[r * n + i];
                v *= zz / (1.0 + exp(-zz));
            }
            ref[r * (gated ? n : stride) + i] = v;
        }
    }
    int64_t total = rows * (gated ? n : stride);
    float *dx = dev_upload(x, sizeof(float) * total), *dw = dev_upload(w, sizeof(float) * n);
    float *dz = dev_upload(z, sizeof(float) * rows * n), *dy = dev_poisoned(total);
    /* with n a multiple of 32 also the int8 copy: rows of `group` norm rows
     * (plain: 1), equal byte for byte to the kernels' quantisation of y */
    const int64_t group = gated && rows % 4 == 0 ? 4 : 1, qk = group * n, qrows = rows / group;
    const bool copy = n % 32 == 0 && (gated || stride == n);
    const size_t qbytes = tdm_gpu_xq8_bytes(qrows, qk);
    void *dq = copy ? dev_alloc(qbytes) : NULL;
    if (copy)
        GPU_OK(tdm_gpu_memset(g_gpu, dq, 0xA5, qbytes, ERR));
    if (gated)
        GPU_OK(tdm_gpu_rmsnorm_gated(g_gpu, dx, dz, dw, dy, dq, rows, n, group, 1e-6f, ERR));
    else
        GPU_OK(tdm_gpu_rmsnorm(g_gpu, dx, dw, dy, dq, rows, n, stride, 1e-6f, ERR));
    float *y = dev_download_f32(dy, total);
    if (copy) {
        uint8_t *got = malloc(qbytes), *want = malloc(qbytes);
        assert_non_null(got);
        assert_non_null(want);
        GPU_OK(tdm_gpu_download(g_gpu, got, dq, qbytes, ERR));
        memset(want, 0xA5, qbytes);
        GPU_OK(tdm_gpu_xq8_pack_host(y, qrows, qk, want, ERR));
        if (memcmp(got, want, qbytes) != 0)
            fail_msg("%s %lldx%lld: the int8 copy differs from the quantised output", gated ? "rmsnorm_gated" : "rmsnorm",
                     (long long)rows, (long long)n);
        free(got), free(want);
        dev_free(dq);
    }
    /* the gap between rows (stride > n) must stay poisoned */
    for (int64_t r = 0; r < rows && !gated; r++)
        for (int64_t i = n; i < stride; i++) {
            if (!isnan(y[r * stride + i]))
                fail_msg("rmsnorm wrote outside its rows at row %lld col %lld", (long long)r,
                         (long long)i);
            y[r * stride + i] = 0;
        }
    char what[80];
    snprintf(what, sizeof what, "%s %lldx%lld stride %lld", gated ? "rmsnorm_gated" : "rmsnorm",
             (long long)rows, (long long)n, (long long)stride);
    check_close(what, y, ref, NULL, total, 2e-6, 1e-6);
    free(x), free(w), free(z), free(ref), free(y);
    dev_free(dx), dev_free(dw), dev_free(dz), dev_free(dy);
}

static void test_rmsnorm(void **state)
{
    (void)state;
    run_rmsnorm(3, 2048, 2048, false);
    run_rmsnorm(5, 1000, 1003, false);
    run_rmsnorm(37, 128, 256, false); /* per-head q_norm inside a wider row */
    run_rmsnorm(1, 7, 7, false);
    run_rmsnorm(64, 128, 128, true);
    run_rmsnorm(3, 33, 33, true);
    /* rows held in registers (<= 2048, multiple of 4) and just past it */
    run_rmsnorm(2, 1020, 1020, false);
    run_rmsnorm(2, 2052, 2052, false);
    run_rmsnorm(3, 2048, 2048, true);
    /* int8 copies past the register path, and of rows not filling 128 bytes */
    run_rmsnorm(2, 2080, 2080, false);
    run_rmsnorm(6, 96, 96, true);
    /* a copy needs whole groups of 32 and whole rows of `group` */
    tdm_error e = {0};
    float *d = dev_poisoned(256);
    void *q = dev_alloc(4096);
    assert_int_equal(tdm_gpu_rmsnorm(g_gpu, d, d, d, q, 2, 33, 33, 1e-6f, &e), TDM_ERR_INVALID);
    printf("  %s\n", e.msg);
    assert_int_equal(tdm_gpu_rmsnorm_gated(g_gpu, d, d, d, d, q, 3, 32, 2, 1e-6f, &e), TDM_ERR_INVALID);
    dev_free(d), dev_free(q);
}

/* ---------------- attention inputs: q/k norms, RoPE, KV store ---------------- */
static float h16(float v) { return tdm_fp16_to_fp32(tdm_fp32_to_fp16(v)); }

/* RMSNorm (w) then NeoX RoPE of one head row x into out, in float64 with the
 * float32 angles transformers computes; bound: the tolerance per channel. */
static void ref_norm_rope(const float *x, const float *w, int64_t hd, int64_t n_rot, float base, int32_t pos,
                          double *out, double *bound)
{
    double ss = 0;
    for (int64_t i = 0; i < hd; i++)
        ss += (double)x[i] * x[i];
    const double r = 1.0 / sqrt(ss / hd + 1e-6);
    for (int64_t i = 0; i < hd; i++) {
        out[i] = w[i] * (x[i] * r);
        bound[i] = 4e-6 * fabs(out[i]) + 1e-6;
    }
    const int64_t half = n_rot / 2;
    for (int64_t i = 0; i < half; i++) {
        float inv = 1.0f / powf(base, (float)(2 * i) / (float)n_rot);
        float ang = (float)pos * inv;
        double c = cos((double)ang), s = sin((double)ang), a = out[i], b = out[i + half];
        out[i] = a * c - b * s;
        out[i + half] = b * c + a * s;
        /* one ulp of inv_freq moves the angle by ~pos * 6e-8 */
        bound[i] = bound[i + half] = (4e-6 + 1.2e-7 * fabs((double)pos)) * (fabs(a) + fabs(b)) + 1e-6;
    }
}

/* ntok tokens at positions t * 7 + (0..4), row strides padded; with
 * `stray` the last position lies past the cache (nothing stored for it, its
 * query still rotated) and one is negative. The caches start NaN-poisoned
 * and must hold exactly the stored rows afterwards. */
static void run_attn_prep(int64_t ntok, int64_t H, int64_t Hkv, int64_t hd, int64_t n_rot, float base, bool gated,
                          bool stray)
{
    const int64_t qs = H * hd * (gated ? 2 : 1) + 3, kvs = Hkv * hd + 5, n_ctx = ntok * 7 + 4;
    float *q = frand(ntok * qs, 2.0f), *k = frand(ntok * kvs, 2.0f), *v = frand(ntok * kvs, 2.0f);
    float *qw = frand(hd, 1.0f), *kw = frand(hd, 1.0f);
    int32_t *pos = malloc(sizeof(int32_t) * ntok);
    for (int64_t t = 0; t < ntok; t++)
        pos[t] = (int32_t)(t * 7 + rng_u64() % 5);
    if (stray) {
        pos[ntok - 1] = (int32_t)(n_ctx + 5);
        pos[0] = -3;
    }
    double *rq = dalloc(ntok * H * hd), *bq = dalloc(ntok * H * hd), *rk = dalloc(hd), *bk = dalloc(hd);
    for (int64_t t = 0; t < ntok; t++)
        for (int64_t h = 0; h < H; h++)
            ref_norm_rope(q + t * qs + h * hd * (gated ? 2 : 1), qw, hd, n_rot, base, pos[t],
                          rq + (t * H + h) * hd, bq + (t * H + h) * hd);
    const size_t cache = (size_t)Hkv * n_ctx * hd;
    tdm_gpu_attn_in in = {.q_src = dev_upload(q, sizeof(float) * ntok * qs),
                          .k_src = dev_upload(k, sizeof(float) * ntok * kvs),
                          .v_src = dev_upload(v, sizeof(float) * ntok * kvs),
                          .q_stride = qs, .kv_stride = kvs,
                          .q_norm = dev_upload(qw, sizeof(float) * hd), .k_norm = dev_upload(kw, sizeof(float) * hd),
                          .n_head = H, .n_kv = Hkv, .head_dim = hd, .n_rot = n_rot, .base = base, .eps = 1e-6f};
    int32_t *dpos = dev_upload(pos, sizeof(int32_t) * ntok);
    float *dq = dev_poisoned(ntok * H * hd), *dg = gated ? dev_poisoned(ntok * H * hd) : NULL;
    uint16_t *kc = dev_alloc(2 * cache), *vc = dev_alloc(2 * cache);
    GPU_OK(tdm_gpu_memset(g_gpu, kc, 0xFF, 2 * cache, ERR)); /* NaN halves */
    GPU_OK(tdm_gpu_memset(g_gpu, vc, 0xFF, 2 * cache, ERR));
    GPU_OK(tdm_gpu_attn_prep(g_gpu, &in, dpos, ntok, dq, dg, kc, vc, n_ctx, ERR));
    char what[96];
    snprintf(what, sizeof what, "attn_prep q %lldx%lldx%lld rot %lld%s%s", (long long)ntok, (long long)H,
             (long long)hd, (long long)n_rot, gated ? " gated" : "", stray ? " stray" : "");
    float *gq = dev_download_f32(dq, ntok * H * hd);
    check_close(what, gq, rq, bq, ntok * H * hd, 0, 0);
    if (gated) {
        float *gg = dev_download_f32(dg, ntok * H * hd);
        for (int64_t t = 0; t < ntok; t++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t i = 0; i < hd; i++)
                    assert_true(gg[(t * H + h) * hd + i] == q[t * qs + (2 * h + 1) * hd + i]);
        free(gg);
    }
    uint16_t *hk = malloc(2 * cache), *hv = malloc(2 * cache);
    GPU_OK(tdm_gpu_sync(g_gpu, ERR));
    GPU_OK(tdm_gpu_download(g_gpu, hk, kc, 2 * cache, ERR));
    GPU_OK(tdm_gpu_download(g_gpu, hv, vc, 2 * cache, ERR));
    int64_t stored = 0;
    for (int64_t t = 0; t < ntok; t++) {
        if (pos[t] < 0 || pos[t] >= n_ctx)
            continue;
        stored++;
        for (int64_t g = 0; g < Hkv; g++) {
            ref_norm_rope(k + t * kvs + g * hd, kw, hd, n_rot, base, pos[t], rk, bk);
            for (int64_t i = 0; i < hd; i++) {
                const size_t c = ((size_t)g * n_ctx + pos[t]) * hd + i;
                const double got = tdm_fp16_to_fp32(hk[c]), lim = bk[i] + fabs(rk[i]) * (1.0 / 2048) + 6e-8;
                if (!(fabs(got - rk[i]) <= lim))
                    fail_msg("%s: key head %lld pos %d [%lld] %.9g want %.9g", what, (long long)g, pos[t],
                             (long long)i, got, rk[i]);
                assert_int_equal(hv[c], tdm_fp32_to_fp16(v[t * kvs + g * hd + i]));
                hk[c] = hv[c] = 0xFFFF; /* checked */
            }
        }
    }
    for (size_t c = 0; c < cache; c++)
        if (hk[c] != 0xFFFF || hv[c] != 0xFFFF)
            fail_msg("%s: cache entry %zu written outside the stored positions", what, c);
    printf("  %-40s %lld of %lld tokens stored\n", what, (long long)stored, (long long)ntok);
    free(q), free(k), free(v), free(qw), free(kw), free(pos), free(rq), free(bq), free(rk), free(bk);
    free(gq), free(hk), free(hv);
    dev_free((void *)in.q_src), dev_free((void *)in.k_src), dev_free((void *)in.v_src);
    dev_free((void *)in.q_norm), dev_free((void *)in.k_norm), dev_free(dpos), dev_free(dq), dev_free(dg);
    dev_free(kc), dev_free(vc);
}

static void test_attn_prep(void **state)
{
    (void)state;
    run_attn_prep(5, 32, 4, 128, 128, 1e6f, false, false); /* Qwen3-MoE: full rotation */
    run_attn_prep(1, 16, 2, 256, 64, 1e7f, true, false);   /* Qwen3.5 decode: partial rotation */
    run_attn_prep(3, 16, 2, 256, 64, 1e7f, true, true);
    run_attn_prep(17, 3, 1, 32, 8, 1e7f, false, false);   /* micro model */
    run_attn_prep(4, 6, 3, 80, 20, 1e4f, true, true);      /* head_dim not a multiple of 32 */
    run_attn_prep(2, 2, 1, 512, 512, 1e4f, false, false);  /* the largest head */
    run_attn_prep(2, 5, 5, 7, 6, 100.0f, false, false);    /* tiny heads, MHA */
    tdm_error e = {0};
    tdm_gpu_attn_in bad = {.q_src = (float *)16, .k_src = (float *)16, .v_src = (float *)16, .q_stride = 8,
                           .kv_stride = 8, .q_norm = (float *)16, .k_norm = (float *)16, .n_head = 1, .n_kv = 1,
                           .head_dim = 8, .n_rot = 3, .base = 1e4f, .eps = 1e-6f};
    void *p = (void *)16;
    assert_int_equal(tdm_gpu_attn_prep(g_gpu, &bad, p, 1, p, NULL, p, p, 4, &e), TDM_ERR_INVALID);
    printf("  %s\n", e.msg);
    bad.n_rot = 8;
    bad.q_stride = 7;
    assert_int_equal(tdm_gpu_attn_prep(g_gpu, &bad, p, 1, p, NULL, p, p, 4, &e), TDM_ERR_INVALID);
    printf("  %s\n", e.msg);
}

/* ---------------- attention ---------------- */

/* Positions come from device memory: token j of the sequence sits at row
 * j; with `stray` the last query's position is beyond the cache (its K/V
 * row is not there) and its output row must be zeros. The caches start
 * `shift` halves into their allocations (1: rows not 16-byte aligned, so a
 * head_dim of 32 DPL takes the strided lanes instead of vector loads). */
static void run_attention_at(int64_t n_head, int64_t n_kv, int64_t hd, int64_t n_ctx, int64_t pos0,
                             int64_t ntok, bool gated, bool stray, int64_t shift)
{
    int64_t total = pos0 + ntok, kvw = n_kv * hd;
    /* K/V rows 0..total-1, the queries are the last ntok */
    float *k = frand(total * kvw, 1.0f), *v = frand(total * kvw, 1.0f);
    float *q = frand(ntok * n_head * hd, 1.0f), *gate = frand(ntok * n_head * hd, 2.0f);
    int32_t *pos = malloc(sizeof(int32_t) * total);
    for (int64_t j = 0; j < total; j++)
        pos[j] = (int32_t)j;
    if (stray)
        pos[total - 1] = (int32_t)(n_ctx + 5);
    float scale = 1.0f / sqrtf((float)hd);
    double *ref = dalloc(ntok * n_head * hd), *bound = dalloc(ntok * n_head * hd);
    double *sc = dalloc(total);
    for (int64_t t = 0; t < ntok; t++)
        for (int64_t h = 0; h < n_head; h++) {
            int64_t g = h / (n_head / n_kv), p = pos[pos0 + t];
            if (p >= n_ctx)
                continue; /* ref and bound stay 0: an exact zero row */
            const float *qh = q + (t * n_head + h) * hd;
            double mx = -INFINITY, sum = 0;
            for (int64_t j = 0; j <= p; j++) {
                double s = 0;
                for (int64_t i = 0; i < hd; i++)
                    s += (double)qh[i] * scale * h16(k[j * kvw + g * hd + i]);
                sc[j] = s;
                mx = fmax(mx, s);
            }
            for (int64_t j = 0; j <= p; j++)
                sum += (sc[j] = exp(sc[j] - mx));
            for (int64_t i = 0; i < hd; i++) {
                double o = 0, a = 0;
                for (int64_t j = 0; j <= p; j++) {
                    double vv = h16(v[j * kvw + g * hd + i]);
                    o += sc[j] / sum * vv;
                    a += sc[j] / sum * fabs(vv);
                }
                int64_t oi = (t * n_head + h) * hd + i;
                if (gated)
                    o /= 1.0 + exp(-(double)gate[oi]);
                ref[oi] = o;
                bound[oi] = 2e-5 * a + 2e-6;
            }
        }
    /* the caches: fp16 rows of the stored positions, NaN halves elsewhere */
    const int64_t stored = stray ? total - 1 : total;
    uint16_t *hk = malloc(2 * n_kv * n_ctx * hd), *hv = malloc(2 * n_kv * n_ctx * hd);
    for (int64_t j = 0; j < n_ctx; j++)
        for (int64_t g = 0; g < n_kv; g++)
            for (int64_t i = 0; i < hd; i++) {
                const int64_t c = (g * n_ctx + j) * hd + i;
                hk[c] = j < stored ? tdm_fp32_to_fp16(k[j * kvw + g * hd + i]) : 0xFFFF;
                hv[c] = j < stored ? tdm_fp32_to_fp16(v[j * kvw + g * hd + i]) : 0xFFFF;
            }
    const size_t cache_bytes = 2 * (size_t)(n_kv * n_ctx * hd);
    uint16_t *kbuf = dev_alloc(cache_bytes + 16), *vbuf = dev_alloc(cache_bytes + 16);
    uint16_t *kc = kbuf + shift, *vc = vbuf + shift;
    GPU_OK(tdm_gpu_upload(g_gpu, kc, hk, cache_bytes, ERR));
    GPU_OK(tdm_gpu_upload(g_gpu, vc, hv, cache_bytes, ERR));
    int32_t *dpos = dev_upload(pos, sizeof(int32_t) * total);
    float *dq = dev_upload(q, sizeof(float) * ntok * n_head * hd);
    float *dg = dev_upload(gate, sizeof(float) * ntok * n_head * hd);
    /* without scratch (one block per query head), then with it twice (the
     * keys split over blocks; the second call finds the counters reset) */
    const size_t sb = tdm_gpu_attention_scratch_bytes(g_gpu, n_head, hd, n_ctx);
    void *scratch = dev_alloc(sb);
    GPU_OK(tdm_gpu_memset(g_gpu, scratch, 0, sb, ERR));
    for (int run = 0; run < 3; run++) {
        float *dout = dev_poisoned(ntok * n_head * hd);
        GPU_OK(tdm_gpu_attention(g_gpu, dq, kc, vc, gated ? dg : NULL, dout, ntok, n_head, n_kv, hd, n_ctx,
                                 dpos + pos0, scale, run ? scratch : NULL, run ? sb : 0, ERR));
        float *o = dev_download_f32(dout, ntok * n_head * hd);
        char what[128];
        snprintf(what, sizeof what, "attention %lldq/%lldkv hd %lld pos0 %lld ntok %lld%s%s%s%s",
                 (long long)n_head, (long long)n_kv, (long long)hd, (long long)pos0, (long long)ntok,
                 gated ? " gated" : "", stray ? " stray" : "", run ? " split" : "", shift ? " unaligned" : "");
        check_close(what, o, ref, bound, ntok * n_head * hd, 0, 0);
        free(o);
        dev_free(dout);
    }
    dev_free(scratch);
    free(k), free(v), free(q), free(gate), free(pos), free(ref), free(bound), free(sc), free(hk), free(hv);
    dev_free(kbuf), dev_free(vbuf), dev_free(dpos), dev_free(dq), dev_free(dg);
}

static void run_attention(int64_t n_head, int64_t n_kv, int64_t hd, int64_t n_ctx, int64_t pos0,
                          int64_t ntok, bool gated, bool stray)
{
    run_attention_at(n_head, n_kv, hd, n_ctx, pos0, ntok, gated, stray, 0);
}

static void test_attention(void **state)
{
    (void)state;
    run_attention(32, 4, 128, 300, 0, 37, false, false);  /* Qwen3-MoE prefill */
    run_attention(32, 4, 128, 300, 37, 1, false, false);  /* then decode */
    run_attention(16, 2, 256, 200, 150, 1, true, false);  /* Qwen3.5 gated decode, long context */
    run_attention(16, 2, 256, 1100, 1023, 1, true, false); /* 17 splits of 61 keys, the last 47 */
    run_attention(16, 2, 256, 1100, 5, 2, true, false);   /* most splits empty */
    run_attention(8, 1, 128, 700, 600, 7, false, false);  /* 7 queries: several splits each */
    run_attention(16, 2, 256, 64, 5, 9, true, false);     /* prefill continuing a cache */
    run_attention(4, 2, 16, 40, 0, 23, false, false);     /* micro qwen3moe */
    run_attention(6, 3, 80, 50, 3, 3, true, false);       /* head_dim not a multiple of 32 */
    run_attention(2, 1, 512, 20, 0, 2, false, false);
    run_attention(4, 2, 64, 16, 10, 4, true, true);       /* last position past the cache */
    run_attention(4, 2, 64, 16, 0, 1, false, true);       /* decode past the cache */
    /* prompts of FA_MIN_TOK (16) tokens or more at head dims 64, 128, 256
     * take the tensor-core kernel (the 37-token one above too): blocks of 64
     * queries, the last one partial, keys in steps of 16 */
    run_attention(16, 2, 256, 200, 0, 130, true, false);  /* Qwen3.5 gated prompt */
    run_attention(16, 2, 256, 300, 70, 75, true, false);  /* a prompt continuing a cache */
    run_attention(8, 2, 64, 100, 0, 33, false, true);     /* the last query past the cache */
    run_attention(4, 4, 128, 40, 23, 16, false, false);   /* MHA, exactly FA_MIN_TOK */
    /* the head dims that take vector loads (64, 128, 256, 512 above), with
     * caches not 16-byte aligned: the strided lanes */
    run_attention_at(16, 2, 256, 1100, 1023, 1, true, false, 1);
    run_attention_at(8, 1, 128, 700, 600, 7, false, false, 1);
    run_attention_at(4, 2, 64, 16, 10, 4, true, true, 1);
    run_attention_at(16, 2, 256, 64, 5, 20, true, false, 1); /* a prompt on unaligned rows */
}

/* ---------------- DeltaNet ---------------- */
static void ref_conv(const float *u, const float *w, double *st, double *y, int64_t ntok,
                     int64_t ch, int64_t K)
{
    for (int64_t t = 0; t < ntok; t++)
        for (int64_t c = 0; c < ch; c++) {
            double s = w[c * K + K - 1] * (double)u[t * ch + c];
            for (int64_t i = 0; i < K - 1; i++)
                s += w[c * K + i] * st[i * ch + c];
            y[t * ch + c] = s / (1.0 + exp(-s));
            for (int64_t i = 0; i + 1 < K - 1; i++)
                st[i * ch + c] = st[(i + 1) * ch + c];
            st[(K - 2) * ch + c] = u[t * ch + c];
        }
}

static double *to_f64(const float *x, int64_t n)
{
    double *d = dalloc(n);
    for (int64_t i = 0; i < n; i++)
        d[i] = x[i];
    return d;
}

/* Batches in sequence from position 1, state carried: 5, 1, 2 (shorter
 * than the window: the new state mixes old state and inputs; from an odd
 * position to an odd one, so in place), 37 (three token groups, the last
 * partial) tokens. The state starts in half 1 with half 0 poisoned, so a
 * read of the wrong half shows as NaN; it ends in half (1 + 45) & 1 = 0. */
static void test_ssm_conv(void **state)
{
    (void)state;
    enum { NB = 4 };
    const int64_t ch = 1001, K = 4, nb[NB] = {5, 1, 2, 37}, n = 5 + 1 + 2 + 37, half = (K - 1) * ch;
    const int32_t p0[NB] = {1, 6, 7, 9};
    float *u = frand(n * ch, 1.0f), *w = frand(ch * K, 0.5f), *st0 = frand(half, 1.0f);
    double *st = to_f64(st0, half), *ref = dalloc(n * ch);
    float *du = dev_upload(u, sizeof(float) * n * ch), *dw = dev_upload(w, sizeof(float) * ch * K);
    float *dst = dev_poisoned(2 * half), *dy = dev_poisoned(n * ch);
    int32_t *dpos = dev_upload(p0, sizeof p0);
    GPU_OK(tdm_gpu_upload(g_gpu, dst + half, st0, sizeof(float) * half, ERR));
    for (int64_t b = 0, t0 = 0; b < NB; t0 += nb[b++]) {
        ref_conv(u + t0 * ch, w, st, ref + t0 * ch, nb[b], ch, K);
        GPU_OK(tdm_gpu_ssm_conv(g_gpu, du + t0 * ch, dw, dst, dpos + b, dy + t0 * ch, nb[b], ch, K, ERR));
    }
    float *y = dev_download_f32(dy, n * ch), *sto = dev_download_f32(dst, half);
    check_close("ssm_conv 1001 ch, 5 + 1 + 2 + 37 tokens", y, ref, NULL, n * ch, 1e-5, 1e-6);
    check_close("ssm_conv state", sto, st, NULL, half, 0, 0);
    free(u), free(w), free(st0), free(st), free(ref), free(y), free(sto);
    dev_free(du), dev_free(dw), dev_free(dst), dev_free(dy), dev_free(dpos);
}

typedef struct dn_case {
    tdm_gpu_deltanet_shape sh;
    int64_t ntok;
    float *qkv, *beta, *alpha, *ssm_a, *dt, *s0;
} dn_case;

static void ref_deltanet(const dn_case *c, double *S, double *o)
{
    const tdm_gpu_deltanet_shape *sh = &c->sh;
    int64_t nk = sh->n_k_head, nv = sh->n_v_head, dk = sh->d_k, dv = sh->d_v;
    int64_t width = 2 * nk * dk + nv * dv;
    double *q = dalloc(dk), *k = dalloc(dk), *m = dalloc(dv);
    for (int64_t t = 0; t < c->ntok; t++) {
        const float *row = c->qkv + t * width;
        for (int64_t j = 0; j < nv; j++) {
            int64_t kh = sh->map == TDM_GPU_HEADS_GROUPED ? j / (nv / nk) : j % nk;
            double qs = 0, ks = 0;
            for (int64_t i = 0; i < dk; i++) {
                q[i] = row[kh * dk + i];
                k[i] = row[(nk + kh) * dk + i];
                qs += q[i] * q[i];
                ks += k[i] * k[i];
            }
            for (int64_t i = 0; i < dk; i++) {
                q[i] = q[i] / sqrt(qs + sh->eps) / sqrt((double)dk);
                k[i] = k[i] / sqrt(ks + sh->eps);
            }
            double b = 1.0 / (1.0 + exp(-(double)c->beta[t * nv + j]));
            double xa = (double)c->alpha[t * nv + j] + c->dt[j];
            double g = c->ssm_a[j] * (xa > 20 ? xa : log1p(exp(xa)));
            double eg = exp(g);
            double *Sj = S + j * dk * dv;
            for (int64_t i = 0; i < dk * dv; i++)
                Sj[i] *= eg;
            for (int64_t vv = 0; vv < dv; vv++) {
                double s = 0;
                for (int64_t i = 0; i < dk; i++)
                    s += Sj[i * dv + vv] * k[i];
                m[vv] = b * (row[2 * nk * dk + j * dv + vv] - s);
            }
            for (int64_t i = 0; i < dk; i++)
                for (int64_t vv = 0; vv < dv; vv++)
                    Sj[i * dv + vv] += k[i] * m[vv];
            for (int64_t vv = 0; vv < dv; vv++) {
                double s = 0;
                for (int64_t i = 0; i < dk; i++)
                    s += Sj[i * dv + vv] * q[i];
                o[(t * nv + j) * dv + vv] = s;
            }
        }
    }
    free(q), free(k), free(m);
}

/* How the device runs a case: one token per launch (decode), one launch in
 * the built-in form, or both forced forms (sequential, chunked) compared with
 * the reference and with each other. */
typedef enum { DN_STEPS, DN_BATCH, DN_FORMS } dn_mode;

/* One device run from the case's initial state; chunk_min 0 = built in. */
static void dn_device(const dn_case *c, bool stepwise, int chunk_min, float **out, float **state)
{
    int64_t nk = c->sh.n_k_head, nv = c->sh.n_v_head, ntok = c->ntok;
    int64_t width = 2 * nk * c->sh.d_k + nv * c->sh.d_v, ssz = nv * c->sh.d_k * c->sh.d_v;
    tdm_gpu_tuning tune = {.deltanet_chunk_min = chunk_min};
    GPU_OK(tdm_gpu_set_tuning(g_gpu, &tune, ERR));
    float *dqkv = dev_upload(c->qkv, sizeof(float) * ntok * width);
    float *db = dev_upload(c->beta, sizeof(float) * ntok * nv), *da = dev_upload(c->alpha, sizeof(float) * ntok * nv);
    float *dA = dev_upload(c->ssm_a, sizeof(float) * nv), *ddt = dev_upload(c->dt, sizeof(float) * nv);
    float *dS = dev_upload(c->s0, sizeof(float) * ssz), *dout = dev_poisoned(ntok * nv * c->sh.d_v);
    if (stepwise) /* decode: one token per launch, state carried on the device */
        for (int64_t t = 0; t < ntok; t++)
            GPU_OK(tdm_gpu_deltanet(g_gpu, &c->sh, dqkv + t * width, db + t * nv, da + t * nv, dA,
                                    ddt, dS, dout + t * nv * c->sh.d_v, 1, ERR));
    else
        GPU_OK(tdm_gpu_deltanet(g_gpu, &c->sh, dqkv, db, da, dA, ddt, dS, dout, ntok, ERR));
    *out = dev_download_f32(dout, ntok * nv * c->sh.d_v);
    *state = dev_download_f32(dS, ssz);
    tune.deltanet_chunk_min = 0;
    GPU_OK(tdm_gpu_set_tuning(g_gpu, &tune, ERR));
    dev_free(dqkv), dev_free(db), dev_free(da), dev_free(dA), dev_free(ddt), dev_free(dS), dev_free(dout);
}

static double rms(const double *x, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += x[i] * x[i];
    return sqrt(s / n);
}

/* Bound: float32 sums of d_k + 64 products per element, relative ~1e-5 of
 * their absolute sum; cancellation makes it relative to the rms: rel 1e-4 +
 * 1e-4 rms. */
static void dn_check(const char *what, const float *go, const float *gS, const double *o,
                     const double *S, int64_t n_out, int64_t ssz)
{
    char w2[160];
    check_close(what, go, o, NULL, n_out, 1e-4, 1e-4 * rms(o, n_out));
    snprintf(w2, sizeof w2, "  state (%s)", what);
    check_close(w2, gS, S, NULL, ssz, 1e-4, 1e-4 * rms(S, ssz));
}

/* alpha_shift moves softplus(alpha + dt): 0 gives fast-forgetting heads,
 * -8 nearly no decay (the state carries across many chunks). */
static void run_deltanet(int64_t nk, int64_t nv, int64_t dk, int64_t dv, tdm_gpu_head_map map,
                         int64_t ntok, dn_mode mode, float alpha_shift)
{
    dn_case c = {{nk, nv, dk, dv, map, 1e-6f}, ntok, 0};
    int64_t width = 2 * nk * dk + nv * dv, ssz = nv * dk * dv, n_out = ntok * nv * dv;
    c.qkv = frand(ntok * width, 1.0f);
    c.beta = frand(ntok * nv, 1.5f);
    c.alpha = frand(ntok * nv, 1.5f);
    for (int64_t i = 0; i < ntok * nv; i++)
        c.alpha[i] += alpha_shift;
    c.dt = frand(nv, 0.5f);
    c.ssm_a = malloc(sizeof(float) * nv);
    for (int64_t j = 0; j < nv; j++)
        c.ssm_a[j] = -expf(rng_sym());
    c.s0 = frand(ssz, 0.1f);
    double *S = dalloc(ssz), *o = dalloc(n_out);
    for (int64_t i = 0; i < ssz; i++)
        S[i] = c.s0[i];
    ref_deltanet(&c, S, o);
    char what[120];
    int n = snprintf(what, sizeof what, "deltanet %lldk/%lldv dk %lld dv %lld %s ntok %lld%s",
                     (long long)nk, (long long)nv, (long long)dk, (long long)dv,
                     map == TDM_GPU_HEADS_GROUPED ? "grouped" : "tiled", (long long)ntok,
                     alpha_shift != 0.0f ? " slow" : "");
    float *go, *gS;
    if (mode != DN_FORMS) {
        dn_device(&c, mode == DN_STEPS, 0, &go, &gS);
        snprintf(what + n, sizeof what - n, " %s", mode == DN_STEPS ? "decode" : "prefill");
        dn_check(what, go, gS, o, S, n_out, ssz);
    } else {
        float *co, *cS;
        dn_device(&c, false, INT32_MAX, &go, &gS);
        dn_device(&c, false, 1, &co, &cS);
        snprintf(what + n, sizeof what - n, " sequential");
        dn_check(what, go, gS, o, S, n_out, ssz);
        snprintf(what + n, sizeof what - n, " chunked");
        dn_check(what, co, cS, o, S, n_out, ssz);
        double *so = to_f64(go, n_out), *sS = to_f64(gS, ssz);
        snprintf(what + n, sizeof what - n, " chunked vs seq");
        dn_check(what, co, cS, so, sS, n_out, ssz);
        free(co), free(cS), free(so), free(sS);
    }
    free(c.qkv), free(c.beta), free(c.alpha), free(c.dt), free(c.ssm_a), free(c.s0);
    free(S), free(o), free(go), free(gS);
}

static void test_deltanet(void **state)
{
    (void)state;
    run_deltanet(16, 32, 128, 128, TDM_GPU_HEADS_TILED, 1, DN_STEPS, 0);    /* Qwen3.5 decode */
    run_deltanet(16, 32, 128, 128, TDM_GPU_HEADS_GROUPED, 9, DN_BATCH, 0); /* Qwen3-Next prefill */
    run_deltanet(2, 6, 128, 100, TDM_GPU_HEADS_TILED, 5, DN_STEPS, 0);      /* odd d_v */
    run_deltanet(2, 6, 128, 100, TDM_GPU_HEADS_TILED, 5, DN_BATCH, 0);
    run_deltanet(2, 4, 16, 16, TDM_GPU_HEADS_GROUPED, 13, DN_BATCH, 0);    /* micro models */
    run_deltanet(1, 2, 256, 40, TDM_GPU_HEADS_GROUPED, 3, DN_BATCH, 0);
    run_deltanet(3, 3, 32, 64, TDM_GPU_HEADS_TILED, 4, DN_STEPS, 0);
    run_deltanet(1, 2, 256, 40, TDM_GPU_HEADS_TILED, 40, DN_BATCH, 0);     /* d_k 256: sequential */
}

/* The chunked form against the reference and the sequential form: partial
 * and whole chunks (1, 63, 64, 65, 200 tokens), both head maps, d_k 16 and
 * 128, d_v 100, a random initial state, fast and slow decay. */
static void test_deltanet_chunked(void **state)
{
    (void)state;
    static const int64_t ntoks[] = {1, 63, 64, 65, 200};
    for (size_t i = 0; i < sizeof ntoks / sizeof ntoks[0]; i++) {
        run_deltanet(2, 6, 128, 100, TDM_GPU_HEADS_TILED, ntoks[i], DN_FORMS, 0);
        run_deltanet(2, 4, 16, 100, TDM_GPU_HEADS_GROUPED, ntoks[i], DN_FORMS, 0);
    }
    run_deltanet(2, 4, 128, 100, TDM_GPU_HEADS_GROUPED, 200, DN_FORMS, -8.0f);
    run_deltanet(2, 6, 16, 16, TDM_GPU_HEADS_TILED, 130, DN_FORMS, -8.0f);
    run_deltanet(3, 3, 32, 64, TDM_GPU_HEADS_TILED, 129, DN_FORMS, -3.0f);
    run_deltanet(1, 2, 64, 40, TDM_GPU_HEADS_GROUPED, 100, DN_FORMS, 0);
    run_deltanet(16, 32, 128, 128, TDM_GPU_HEADS_TILED, 512, DN_FORMS, -4.0f); /* Qwen3.5 prompt */
    run_deltanet(16, 32, 128, 128, TDM_GPU_HEADS_GROUPED, 100, DN_BATCH, 0);   /* built-in: chunked */
    tdm_error e = {0};
    tdm_gpu_tuning bad = {.deltanet_chunk_min = -1};
    GPU_OK(tdm_gpu_set_tuning(g_gpu, &bad, ERR));
    const tdm_gpu_deltanet_shape sh = {2, 4, 16, 16, TDM_GPU_HEADS_TILED, 1e-6f};
    float *p = (float *)16;
    assert_int_equal(tdm_gpu_deltanet(g_gpu, &sh, p, p, p, p, p, p, p, 70, &e), TDM_ERR_INVALID);
    printf("  %s\n", e.msg);
    bad.deltanet_chunk_min = 0;
    GPU_OK(tdm_gpu_set_tuning(g_gpu, &bad, ERR));
}

/* One decode token's conv, recurrence and gated norm in one launch
 * (tdm_gpu_deltanet_step), ntok tokens in sequence from position 3 with the
 * conv state (in half 1, half 0 poisoned: ssm_conv's test) and the recurrent
 * state carried on the device, against the float64 conv, recurrence and
 * gated norm above; the int8 copy byte for byte against the host's
 * quantisation of y; the conv state exactly, in half (3 + ntok) & 1. As in
 * the forward, each token's beta comes from the kernel launched right before
 * the step (here a fill over a poisoned buffer, one value per token), the
 * step's other inputs and states from two or more launches back (gpu.h). */
static void run_deltanet_step(int64_t nk, int64_t nv, int64_t dk, int64_t dv, tdm_gpu_head_map map, int64_t K,
                              int64_t ntok, bool copy)
{
    const tdm_gpu_deltanet_shape sh = {nk, nv, dk, dv, map, 1e-6f};
    const int64_t ch = 2 * nk * dk + nv * dv, ssz = nv * dk * dv, nout = nv * dv;
    const float norm_eps = 1e-6f;
    float *u = frand(ntok * ch, 1.0f), *w = frand(ch * K, 0.5f), *cs0 = frand((K - 1) * ch, 1.0f);
    float *beta = frand(ntok * nv, 1.5f), *alpha = frand(ntok * nv, 1.5f), *dt = frand(nv, 0.5f);
    for (int64_t i = 0; i < ntok * nv; i++)
        beta[i] = beta[i / nv * nv];
    float *z = frand(ntok * nout, 3.0f), *nw = frand(dv, 1.0f), *s0 = frand(ssz, 0.1f), *cyf = frand(ch, 1.0f);
    float *A = frand(nv, 1.0f);
    for (int64_t j = 0; j < nv; j++)
        A[j] = -expf(A[j]);
    double *cst = to_f64(cs0, (K - 1) * ch), *S = to_f64(s0, ssz), *cy = dalloc(ch), *o = dalloc(nout);
    double *ref = dalloc(ntok * nout);
    for (int64_t t = 0; t < ntok; t++) {
        ref_conv(u + t * ch, w, cst, cy, 1, ch, K);
        for (int64_t i = 0; i < ch; i++)
            cyf[i] = (float)cy[i];
        const dn_case c = {sh, 1, cyf, beta + t * nv, alpha + t * nv, A, dt, NULL};
        ref_deltanet(&c, S, o);
        for (int64_t j = 0; j < nv; j++) {
            const double *oj = o + j * dv, r = 1.0 / sqrt(rms(oj, dv) * rms(oj, dv) + norm_eps);
            for (int64_t i = 0; i < dv; i++) {
                const double zz = z[t * nout + j * dv + i];
                ref[t * nout + j * dv + i] = nw[i] * (oj[i] * r) * (zz / (1.0 + exp(-zz)));
            }
        }
    }
    float *du = dev_upload(u, sizeof(float) * ntok * ch), *dw = dev_upload(w, sizeof(float) * ch * K);
    const int64_t half = (K - 1) * ch, p0 = 3;
    float *dcs = dev_poisoned(2 * half), *dS = dev_upload(s0, sizeof(float) * ssz);
    GPU_OK(tdm_gpu_upload(g_gpu, dcs + half, cs0, sizeof(float) * half, ERR));
    int32_t *pos = malloc(sizeof(int32_t) * ntok);
    assert_non_null(pos);
    for (int64_t t = 0; t < ntok; t++)
        pos[t] = (int32_t)(p0 + t);
    int32_t *dpos = dev_upload(pos, sizeof(int32_t) * ntok);
    float *db = dev_poisoned(ntok * nv), *da = dev_upload(alpha, sizeof(float) * ntok * nv);
    float *dA = dev_upload(A, sizeof(float) * nv), *ddt = dev_upload(dt, sizeof(float) * nv);
    float *dz = dev_upload(z, sizeof(float) * ntok * nout), *dnw = dev_upload(nw, sizeof(float) * dv);
    float *dy = dev_poisoned(ntok * nout);
    const size_t qb = tdm_gpu_xq8_bytes(1, nout);
    uint8_t *dq = copy ? dev_alloc(ntok * qb) : NULL;
    if (copy)
        GPU_OK(tdm_gpu_memset(g_gpu, dq, 0xA5, ntok * qb, ERR));
    for (int64_t t = 0; t < ntok; t++) {
        const tdm_gpu_deltanet_step_io io = {
            .qkv = du + t * ch, .conv_w = dw, .conv_state = dcs, .pos = dpos + t, .kernel = K,
            .beta = db + t * nv, .alpha = da + t * nv, .ssm_a = dA, .dt_bias = ddt, .state = dS,
            .z = dz + t * nout, .norm_w = dnw, .norm_eps = norm_eps, .y = dy + t * nout,
            .yq = copy ? dq + t * qb : NULL};
        GPU_OK(tdm_gpu_fill_f32(g_gpu, db + t * nv, beta[t * nv], nv, ERR));
        GPU_OK(tdm_gpu_deltanet_step(g_gpu, &sh, &io, ERR));
    }
    float *y = dev_download_f32(dy, ntok * nout), *gS = dev_download_f32(dS, ssz);
    float *gcs = dev_download_f32(dcs + ((p0 + ntok) & 1) * half, half);
    char what[160];
    snprintf(what, sizeof what, "deltanet_step %lldk/%lldv dk %lld dv %lld %s conv %lld, %lld tokens%s",
             (long long)nk, (long long)nv, (long long)dk, (long long)dv,
             map == TDM_GPU_HEADS_GROUPED ? "grouped" : "tiled", (long long)K, (long long)ntok,
             copy ? " + int8 copy" : "");
    check_close(what, y, ref, NULL, ntok * nout, 1e-4, 1e-4 * rms(ref, ntok * nout));
    check_close("  its conv state", gcs, cst, NULL, half, 0, 0);
    check_close("  its recurrent state", gS, S, NULL, ssz, 1e-4, 1e-4 * rms(S, ssz));
    if (copy) {
        uint8_t *got = malloc(ntok * qb), *want = malloc(ntok * qb);
        assert_non_null(got);
        assert_non_null(want);
        GPU_OK(tdm_gpu_download(g_gpu, got, dq, ntok * qb, ERR));
        memset(want, 0xA5, ntok * qb);
        for (int64_t t = 0; t < ntok; t++)
            GPU_OK(tdm_gpu_xq8_pack_host(y + t * nout, 1, nout, want + t * qb, ERR));
        if (memcmp(got, want, ntok * qb) != 0)
            fail_msg("%s: the int8 copy differs from the quantised output", what);
        free(got), free(want);
        dev_free(dq);
    }
    free(u), free(w), free(cs0), free(beta), free(alpha), free(dt), free(z), free(nw), free(s0), free(cyf);
    free(A), free(cst), free(S), free(cy), free(o), free(ref), free(y), free(gS), free(gcs), free(pos);
    dev_free(du), dev_free(dw), dev_free(dcs), dev_free(dS), dev_free(db), dev_free(da), dev_free(dA);
    dev_free(ddt), dev_free(dz), dev_free(dnw), dev_free(dy), dev_free(dpos);
}

static void test_deltanet_step(void **state)
{
    (void)state;
    run_deltanet_step(16, 32, 128, 128, TDM_GPU_HEADS_TILED, 4, 6, true);   /* Qwen3.5 */
    run_deltanet_step(16, 32, 128, 128, TDM_GPU_HEADS_GROUPED, 4, 3, true); /* Qwen3-Next */
    run_deltanet_step(3, 3, 32, 64, TDM_GPU_HEADS_TILED, 2, 4, true);       /* a key head per value head */
    run_deltanet_step(2, 8, 16, 16, TDM_GPU_HEADS_GROUPED, 8, 10, false);   /* micro, 4 value heads per key head */
    run_deltanet_step(1, 3, 64, 40, TDM_GPU_HEADS_TILED, 3, 4, false);      /* d_v 40: 5 warps */
    run_deltanet_step(2, 4, 128, 8, TDM_GPU_HEADS_TILED, 4, 3, false);      /* one warp, more q/k than threads */
    /* shapes without the one-launch form, and bad input */
    const tdm_gpu_deltanet_shape ok = {2, 4, 16, 32, TDM_GPU_HEADS_TILED, 1e-6f};
    tdm_gpu_deltanet_shape bad[] = {ok, ok, ok, ok, ok};
    bad[0].d_k = 256, bad[1].d_v = 100, bad[2].d_v = 136, bad[3].d_v = 40, bad[4].n_v_head = 5;
    assert_true(tdm_gpu_deltanet_step_fits(&ok, 4, true));
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_false(tdm_gpu_deltanet_step_fits(&bad[i], 4, true));
    assert_false(tdm_gpu_deltanet_step_fits(&ok, 9, false));
    assert_false(tdm_gpu_deltanet_step_fits(&ok, 1, false));
    float *p = dev_poisoned(4096);
    tdm_gpu_deltanet_step_io io = {.qkv = p, .conv_w = p, .conv_state = p, .kernel = 4, .beta = p, .alpha = p,
                                   .ssm_a = p, .dt_bias = p, .state = p, .z = p, .norm_w = p, .y = p};
    tdm_error e = {0};
    assert_int_equal(tdm_gpu_deltanet_step(g_gpu, &ok, &io, &e), TDM_ERR_INVALID); /* no position */
    printf("  %s\n", e.msg);
    io.pos = (const int32_t *)p;
    assert_int_equal(tdm_gpu_deltanet_step(g_gpu, &bad[1], &io, &e), TDM_ERR_UNSUPPORTED);
    printf("  %s\n", e.msg);
    dev_free(p);
}

/* ---------------- router ---------------- */
static void run_router(int64_t ntok, int64_t E, int64_t k, bool renorm, bool ties)
{
    float *lg = malloc(sizeof(float) * ntok * E);
    for (int64_t t = 0; t < ntok; t++) {
        /* distinct logits (a shuffled ladder), so the top-k is unambiguous */
        for (int64_t e = 0; e < E; e++)
            lg[t * E + e] = ties ? 0.5f : 0.02f * (float)e - 3.0f;
        for (int64_t e = E - 1; e > 0 && !ties; e--) {
            int64_t r = (int64_t)(rng_u64() % (uint64_t)(e + 1));
            float tmp = lg[t * E + e];
            lg[t * E + e] = lg[t * E + r];
            lg[t * E + r] = tmp;
        }
    }
    float *dl = dev_upload(lg, sizeof(float) * ntok * E), *dw = dev_poisoned(ntok * k);
    int32_t *di = dev_alloc(sizeof(int32_t) * ntok * k);
    GPU_OK(tdm_gpu_memset(g_gpu, di, 0xFF, sizeof(int32_t) * ntok * k, ERR));
    GPU_OK(tdm_gpu_router(g_gpu, dl, ntok, E, k, renorm, di, dw, ERR));
    float *w = dev_download_f32(dw, ntok * k);
    int32_t *ids = malloc(sizeof(int32_t) * ntok * k);
    GPU_OK(tdm_gpu_download(g_gpu, ids, di, sizeof(int32_t) * ntok * k, ERR));
    double *ref = dalloc(ntok * k), *p = dalloc(E);
    char *used = calloc(E, 1);
    for (int64_t t = 0; t < ntok; t++) {
        double mx = -INFINITY, sum = 0, top = 0;
        for (int64_t e = 0; e < E; e++)
            mx = fmax(mx, lg[t * E + e]);
        for (int64_t e = 0; e < E; e++)
            sum += (p[e] = exp(lg[t * E + e] - mx));
        memset(used, 0, E);
        for (int64_t r = 0; r < k; r++) {
            int64_t best = -1;
            for (int64_t e = 0; e < E; e++)
                if (!used[e] && (best < 0 || p[e] > p[best]))
                    best = e;
            used[best] = 1;
            if (ids[t * k + r] != best)
                fail_msg("router token %lld rank %lld: id %d, want %lld", (long long)t,
                         (long long)r, ids[t * k + r], (long long)best);
            ref[t * k + r] = p[best] / sum;
            top += p[best] / sum;
        }
        for (int64_t r = 0; r < k && renorm; r++)
            ref[t * k + r] /= top;
    }
    char what[80];
    snprintf(what, sizeof what, "router E %lld k %lld ntok %lld%s%s", (long long)E, (long long)k,
             (long long)ntok, renorm ? " renorm" : "", ties ? " ties" : "");
    check_close(what, w, ref, NULL, ntok * k, 1e-5, 1e-9);
    free(lg), free(w), free(ids), free(ref), free(p), free(used);
    dev_free(dl), dev_free(dw), dev_free(di);
}

static void test_router(void **state)
{
    (void)state;
    run_router(1, 128, 8, true, false);
    run_router(7, 512, 10, true, false);
    run_router(3, 256, 8, true, false);
    run_router(5, 37, 3, false, false);
    run_router(2, 64, 4, true, true); /* equal logits: lowest ids, weights 1/k */
    run_router(2, 1024, 32, true, false); /* the limits: 4 experts per thread, k of a whole warp */
    run_router(3, 1, 1, false, false);
    run_router(1, 300, 32, false, true);
    tdm_error e = {0};
    assert_int_equal(tdm_gpu_router(g_gpu, (float *)8, 1, 2000, 8, true, (int32_t *)8, (float *)8, &e),
                     TDM_ERR_INVALID);
    printf("  %s\n", e.msg);
}

/* ---------------- greedy choice ---------------- */

/* The rule of gpu.h (and tdm_sampler_argmax): the first of the largest, NaN
 * never wins, 0 when nothing is above -inf. */
static int32_t ref_argmax(const float *x, int64_t n)
{
    int32_t best = 0;
    float bv = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        if (x[i] > bv)
            bv = x[i], best = (int32_t)i;
    return best;
}

enum { AM_RANDOM, AM_TIES, AM_NAN, AM_ALL_NAN, AM_NEG_INF, AM_ZEROS, AM_POS_INF, AM_CASES };

static void fill_argmax_case(float *x, int64_t n, int c)
{
    rand_floats(x, (size_t)n, 4.0f);
    const int64_t a = (int64_t)(rng_u64() % (uint64_t)n), b = (int64_t)(rng_u64() % (uint64_t)n);
    switch (c) {
    case AM_TIES: /* the largest value twice (or more): the lowest index */
        x[a] = x[b] = 100.0f;
        for (int i = 0; i < 3; i++)
            x[rng_u64() % (uint64_t)n] = 100.0f;
        break;
    case AM_NAN: /* NaN at 0, at a and in a tenth of the row never wins */
        for (int64_t i = 0; i < n; i++)
            if (rng_u64() % 10 == 0)
                x[i] = NAN;
        x[0] = x[a] = NAN;
        break;
    case AM_ALL_NAN:
        for (int64_t i = 0; i < n; i++)
            x[i] = NAN;
        break;
    case AM_NEG_INF: /* nothing above -inf: 0, whatever is at 0 */
        for (int64_t i = 0; i < n; i++)
            x[i] = rng_u64() % 2 ? -INFINITY : NAN;
        break;
    case AM_ZEROS: /* -0 and +0 are equal: the first of them */
        for (int64_t i = 0; i < n; i++)
            x[i] = -1.0f - fabsf(x[i]);
        x[a] = -0.0f;
        x[b] = 0.0f;
        break;
    case AM_POS_INF:
        x[a] = INFINITY;
        x[b] = INFINITY;
        break;
    default:
        break;
    }
}

static void test_argmax(void **state)
{
    (void)state;
    const int64_t sizes[] = {1, 2, 31, 255, 4097, 65537, 151936, 248320, 248321, 1000003};
    const int64_t nmax = 1000003;
    float *x = malloc((size_t)nmax * sizeof(float));
    assert_non_null(x);
    float *dx = (float *)dev_alloc((size_t)(nmax + 1) * sizeof(float));
    void *scratch = dev_alloc(tdm_gpu_argmax_scratch_bytes());
    GPU_OK(tdm_gpu_memset(g_gpu, scratch, 0, tdm_gpu_argmax_scratch_bytes(), ERR));
    int32_t *dout = (int32_t *)dev_alloc(sizeof(int32_t));
    int checked = 0;
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
        for (int c = 0; c < AM_CASES; c++) {
            const int64_t n = sizes[si];
            fill_argmax_case(x, n, c);
            /* in place at an odd offset: no alignment is assumed */
            float *d = dx + (si % 2);
            GPU_OK(tdm_gpu_upload(g_gpu, d, x, (size_t)n * sizeof(float), ERR));
            const int32_t poison = -7;
            GPU_OK(tdm_gpu_upload(g_gpu, dout, &poison, sizeof poison, ERR));
            GPU_OK(tdm_gpu_argmax(g_gpu, d, n, scratch, dout, ERR));
            int32_t got = -1;
            GPU_OK(tdm_gpu_sync(g_gpu, ERR));
            GPU_OK(tdm_gpu_download(g_gpu, &got, dout, sizeof got, ERR));
            const int32_t want = ref_argmax(x, n);
            if (got != want)
                fail_msg("argmax n=%lld case %d: %d, want %d", (long long)n, c, got, want);
            checked++;
        }
    tdm_error e = {0};
    assert_int_equal(tdm_gpu_argmax(g_gpu, dx, 0, scratch, dout, &e), TDM_ERR_INVALID);
    printf("  argmax: %d rows (1 .. 1000003 logits; ties, NaN, -inf, -0/+0, +inf), every call on one scratch\n",
           checked);
    free(x);
    dev_free(dx), dev_free(scratch), dev_free(dout);
}

/* The dependent-stage probe (gpu_fwd.h): chains of 1, 2 and 5 stages against
 * the float64 recurrence next[i] = in[i] / 2 + mean(in), the end in b after
 * an odd count and in a after an even one, the other buffer poisoned first;
 * the bench's timing of it (engine/bench_bound.h) gives a finite positive
 * time (no speed is asserted; not under compute-sanitizer, whose replay of
 * its 24,000 launches would take minutes). */
static void test_stage_chain(void **state)
{
    (void)state;
    enum { N = TDM_GPU_STAGE_FLOATS };
    const int counts[] = {1, 2, 5};
    for (size_t c = 0; c < sizeof counts / sizeof *counts; c++) {
        float *x = frand(N, 1.0f);
        double *ref = dalloc(N), *nxt = dalloc(N);
        for (int i = 0; i < N; i++)
            ref[i] = x[i];
        for (int s = 0; s < counts[c]; s++) {
            double sum = 0;
            for (int i = 0; i < N; i++)
                sum += ref[i];
            for (int i = 0; i < N; i++)
                nxt[i] = 0.5 * ref[i] + sum / N;
            memcpy(ref, nxt, N * sizeof(double));
        }
        float *da = dev_upload(x, N * sizeof(float)), *db = dev_poisoned(N);
        GPU_OK(tdm_gpu_stage_chain(g_gpu, da, db, counts[c], ERR));
        float *got = dev_download_f32(counts[c] & 1 ? db : da, N);
        char what[48];
        snprintf(what, sizeof what, "stage chain of %d", counts[c]);
        check_close(what, got, ref, NULL, N, 1e-5, 1e-5);
        free(x), free(ref), free(nxt), free(got);
        dev_free(da), dev_free(db);
    }
    tdm_error e = {0};
    float *d = dev_poisoned(N);
    assert_int_equal(tdm_gpu_stage_chain(g_gpu, d, d, 1, &e), TDM_ERR_INVALID);
    assert_int_equal(tdm_gpu_stage_chain(g_gpu, d, NULL, 1, &e), TDM_ERR_INVALID);
    dev_free(d);
    printf("  stage chain: 1, 2, 5 stages of %d floats as the float64 recurrence\n", N);
    if (getenv("TDM_SANITIZER"))
        return; /* the timing replays 24,000 launches: too many under compute-sanitizer */
    double us = 0;
    GPU_OK(tdm_bench_stage_us(g_gpu, 3, &us, ERR));
    assert_true(isfinite(us) && us > 0);
    printf("  one stage %.2f us (bench_bound.h's probe)\n", us);
}

/* Slot copies on the copy stream, ordered against compute only by the fences:
 * a kernel queued on the compute stream after tdm_gpu_wait_copies() must see
 * the copied bytes, and a copy queued after tdm_gpu_wait_compute() must not
 * overwrite them before the kernel read them. */
static void test_copy_stream(void **state)
{
    (void)state;
    size_t n = 24u << 20; /* 96 MiB: long enough for a race to show */
    float *h = NULL;
    GPU_OK(tdm_gpu_alloc_host(g_gpu, n * sizeof(float), (void **)&h, ERR));
    rand_floats(h, n, 1.0f);
    float *slot = dev_poisoned(n), *seen = dev_poisoned(n);
    GPU_OK(tdm_gpu_sync(g_gpu, ERR));
    GPU_OK(tdm_gpu_wait_compute(g_gpu, ERR)); /* the poison fill is done */
    GPU_OK(tdm_gpu_copy_async(g_gpu, slot, h, n * sizeof(float), ERR));
    GPU_OK(tdm_gpu_wait_copies(g_gpu, ERR));
    GPU_OK(tdm_gpu_copy(g_gpu, seen, slot, n * sizeof(float), ERR)); /* the "kernel" */
    GPU_OK(tdm_gpu_wait_compute(g_gpu, ERR));
    float *zero = calloc(n, sizeof(float));
    GPU_OK(tdm_gpu_copy_async(g_gpu, slot, zero, n * sizeof(float), ERR)); /* next expert */
    float *got = dev_download_f32(seen, n);
    assert_memory_equal(got, h, n * sizeof(float));
    GPU_OK(tdm_gpu_wait_copies(g_gpu, ERR)); /* all copies done before freeing their source */
    GPU_OK(tdm_gpu_sync(g_gpu, ERR));
    printf("  copy stream + fences: 96 MiB slot copy seen complete by compute, not overwritten\n");
    free(got);
    free(zero);
    dev_free(slot);
    dev_free(seen);
    tdm_gpu_release_host(g_gpu, h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rmsnorm),   cmocka_unit_test(test_attn_prep),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_ssm_conv),  cmocka_unit_test(test_deltanet),
        cmocka_unit_test(test_deltanet_chunked), cmocka_unit_test(test_deltanet_step),
        cmocka_unit_test(test_router),    cmocka_unit_test(test_argmax),
        cmocka_unit_test(test_copy_stream), cmocka_unit_test(test_stage_chain),
    };
    return cmocka_run_group_tests(tests, gpu_setup, gpu_teardown);
}
