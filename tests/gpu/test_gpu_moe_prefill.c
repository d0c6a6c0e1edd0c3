/* test_gpu_moe_prefill: the grouped prompt-batch MoE path (tdm_gpu_moe_prefill)
 * against a float64 host reference and against the decode kernels
 * (tdm_gpu_moe_gate_up / tdm_gpu_moe_down) on the same data: odd token
 * counts (9, 33, 77, 512 with several token tiles per expert), k 1 and 8,
 * experts missing from the residency table (their h rows must stay NaN),
 * mixed formats (Q4_K gate/up, Q6_K down, Q8_0/Q5_K shared), shared experts
 * narrower than the routed ones, every format at small odd shapes, scratch
 * poisoned before each call, bit-identical results on a second call.
 *
 * Bound (docs/GPU.md): x, h and the dequantised weights are rounded to fp16
 * (relative 2^-11 for normal values, absolute 2^-25 below 2^-14), products
 * are exact and accumulate in float32 on the tensor cores (at most one
 * truncation of 2^-23 per block of >= 2 products: K * 2^-24 relative to
 * sum |w x|). Quantised formats do better than this (their integer quants
 * are exact in fp16 and the scales are applied in float32), plain ones
 * (F32/F16/BF16) meet it as written. For a dot of length K:
 *   |d - d64| <= (2^-10 + 2^-22 + K 2^-24) sum |w x| + 2^-25 (1 + 2^-11) (sum |w| + sum |x|)
 * h = silu(g) u: 1.1 E_g (|u| + E_u) + |silu(g)| E_u + 1e-6 |h| (silu is 1.1-Lipschitz);
 * y: sum_i |w_i| E_i + 1e-6 (|y0| + |add| + sum |w_i d_i|) (float32 adds).
 *
 * The decode kernels on the same data: gate_up's h against the prefill's
 * within the sum of the two paths' bounds (triangle inequality through the
 * float64 reference); down (which reads the int8 copy of h that gate_up
 * wrote) against float64 on the decode kernels' own h. Decode, for a dot
 * with a quantised weight type: activations rounded to int8 per group of 32,
 * |x - x^| <= amax_g / 254 (1 + 1e-4), and float32 summation 1e-5 sum |w x^|
 * (docs/GPU.md), so
 *   E_dec <= (1 + 1e-5) sum_i |w_i| amax_g(i) / 254 (1 + 1e-4) + 1e-5 sum |w x|;
 * F32/F16/BF16 multiply x itself: 1e-5 sum |w x|. h and y propagate E_dec
 * as above (1e-6 |h| for the float32 silu and product). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "gpu_testutil.h"

/* A random quantised matrix with its exact dequantised values and per-row
 * sums of |w| (for the fp16 bound). */
typedef struct qmat {
    tdm_qtype t;
    int64_t rows, k;
    size_t bytes;
    uint8_t *q;
    float *f;
    double *abs_row;
} qmat;

static void qmat_make(qmat *m, tdm_qtype t, int64_t rows, int64_t k)
{
    size_t rb = tdm_qtype_row_bytes(t, k);
    *m = (qmat){t, rows, k, rb * rows, malloc(rb * rows), malloc(sizeof(float) * rows * k),
                malloc(sizeof(double) * rows)};
    for (int64_t r = 0; r < rows; r++) {
        rand_row(t, m->q + r * rb, k);
        tdm_error e = {0};
        assert_int_equal(tdm_dequant_row(t, m->q + r * rb, m->f + r * k, k, &e), TDM_OK);
        double a = 0;
        for (int64_t i = 0; i < k; i++)
            a += fabs(m->f[r * k + i]);
        m->abs_row[r] = a;
    }
}

static void qmat_free(qmat *m)
{
    free(m->q);
    free(m->f);
    free(m->abs_row);
}

/* sum_i |w_i| amax_g(i) / 254 (1 + 1e-4): the int8 activation rounding of
 * the decode kernels in row r . x (0 for the float-activation types). */
static double int8_term(const qmat *m, int64_t r, const float *x)
{
    if (m->t == TDM_Q_F32 || m->t == TDM_Q_F16 || m->t == TDM_Q_BF16)
        return 0;
    double s = 0;
    for (int64_t g = 0; g < m->k / 32; g++) {
        double amax = 0, aw = 0;
        for (int64_t i = 32 * g; i < 32 * g + 32; i++) {
            amax = fmax(amax, fabs((double)x[i]));
            aw += fabs(m->f[r * m->k + i]);
        }
        s += aw * amax;
    }
    return s / 254 * (1 + 1e-4);
}

/* Row r . x in float64; *bound gets the fp16/tensor-core bound above and,
 * when dec is not NULL, *dec the decode kernels' bound E_dec. */
static double dot_bounded(const qmat *m, int64_t r, const float *x, double *bound, double *dec)
{
    double s = 0, a = 0, ax = 0;
    for (int64_t i = 0; i < m->k; i++) {
        double p = (double)m->f[r * m->k + i] * x[i];
        s += p;
        a += fabs(p);
        ax += fabs(x[i]);
    }
    const double u = 1.0 / 2048, tiny = ldexp(1.0, -25);
    *bound = (2 * u + u * u + (double)m->k * ldexp(1.0, -24)) * a +
             tiny * (1 + u) * (m->abs_row[r] + ax) + 1e-30;
    if (dec)
        *dec = (1 + 1e-5) * int8_term(m, r, x) + 1e-5 * a + 1e-30;
    return s;
}

static double silu(double v) { return v / (1.0 + exp(-v)); }

typedef struct pcase {
    int64_t n_embd, n_ff, n_expert, k, ntok, sh_ff;
    tdm_qtype gt, dt, sh_gt, sh_dt;
    double resident; /* fraction of the layer's experts given a slot */
    bool shared, use_add, accumulate, use_logit;
} pcase;

typedef struct expert {
    qmat gate, up, down;
} expert;

/* Host side of one case: weights, residency, arena and inputs. */
typedef struct world {
    const pcase *c;
    expert *ex, sh;
    int32_t *slot_of; /* [n_layer][n_expert]; this test's layer is 1 */
    int64_t n_slots;
    size_t slot_bytes;
    uint8_t *arena;
    float *x, *wts, *lg, *y0, *add;
    int32_t *ids;
} world;

enum { N_LAYER = 3, LAYER = 1 };

static void world_make(world *w, const pcase *c)
{
    int64_t E = c->n_expert, D = c->n_embd, F = c->n_ff, k = c->k, ntok = c->ntok;
    memset(w, 0, sizeof *w);
    w->c = c;
    w->ex = calloc(E, sizeof *w->ex);
    for (int64_t e = 0; e < E; e++) {
        qmat_make(&w->ex[e].gate, c->gt, F, D);
        qmat_make(&w->ex[e].up, c->gt, F, D);
        qmat_make(&w->ex[e].down, c->dt, D, F);
    }
    if (c->shared) {
        qmat_make(&w->sh.gate, c->sh_gt, c->sh_ff, D);
        qmat_make(&w->sh.up, c->sh_gt, c->sh_ff, D);
        qmat_make(&w->sh.down, c->sh_dt, D, c->sh_ff);
    }
    /* other layers' rows point at slots that do not exist: reading them faults */
    w->slot_of = malloc(sizeof(int32_t) * N_LAYER * E);
    for (int64_t i = 0; i < N_LAYER * E; i++)
        w->slot_of[i] = 1000000;
    int32_t *so = w->slot_of + LAYER * E;
    for (int64_t e = 0; e < E; e++)
        so[e] = rng_unif() < c->resident ? (int32_t)w->n_slots++ : -1;
    for (int64_t e = E - 1; e > 0; e--) { /* shuffle the slot numbers */
        int64_t r = (int64_t)(rng_u64() % (uint64_t)(e + 1));
        int32_t t = so[e];
        so[e] = so[r];
        so[r] = t;
    }
    size_t gb = w->ex[0].gate.bytes, db = w->ex[0].down.bytes;
    /* odd-sized slots padded to no more than the formats ask (gpu.h) */
    size_t al = (size_t)tdm_gpu_weight_align(c->gt);
    al = (size_t)tdm_gpu_weight_align(c->dt) > al ? (size_t)tdm_gpu_weight_align(c->dt) : al;
    assert_true(al >= 1 && (2 * gb) % al == 0);
    w->slot_bytes = (2 * gb + db + 7 + al) / al * al;
    w->arena = calloc(w->n_slots ? w->n_slots : 1, w->slot_bytes);
    for (int64_t e = 0; e < E; e++) {
        if (so[e] < 0)
            continue;
        uint8_t *s = w->arena + so[e] * w->slot_bytes;
        memcpy(s, w->ex[e].gate.q, gb);
        memcpy(s + gb, w->ex[e].up.q, gb);
        memcpy(s + 2 * gb, w->ex[e].down.q, db);
    }
    w->x = malloc(sizeof(float) * ntok * D);
    rand_floats(w->x, ntok * D, 1.0f);
    w->ids = malloc(sizeof(int32_t) * ntok * k);
    w->wts = malloc(sizeof(float) * ntok * k);
    w->lg = malloc(sizeof(float) * ntok);
    for (int64_t t = 0; t < ntok; t++) {
        for (int64_t r = 0; r < k; r++) {
            int32_t e;
            bool dup;
            do { /* k distinct experts per token */
                e = (int32_t)(rng_u64() % (uint64_t)E);
                dup = false;
                for (int64_t q = 0; q < r; q++)
                    dup |= w->ids[t * k + q] == e;
            } while (dup);
            w->ids[t * k + r] = e;
            w->wts[t * k + r] = 0.05f + rng_unif();
        }
        w->lg[t] = 2.0f * rng_sym();
    }
    w->y0 = malloc(sizeof(float) * ntok * D);
    w->add = malloc(sizeof(float) * ntok * D);
    rand_floats(w->y0, ntok * D, 1.0f);
    rand_floats(w->add, ntok * D, 1.0f);
}

static void world_free(world *w)
{
    for (int64_t e = 0; e < w->c->n_expert; e++)
        qmat_free(&w->ex[e].gate), qmat_free(&w->ex[e].up), qmat_free(&w->ex[e].down);
    if (w->c->shared)
        qmat_free(&w->sh.gate), qmat_free(&w->sh.up), qmat_free(&w->sh.down);
    free(w->ex), free(w->slot_of), free(w->arena), free(w->x), free(w->ids), free(w->wts);
    free(w->lg), free(w->y0), free(w->add);
}

/* The expert of selection (t, i), i == k the shared one; NULL when skipped. */
static const expert *sel_expert(const world *w, int64_t t, int64_t i)
{
    const pcase *c = w->c;
    if (i == c->k)
        return &w->sh;
    int32_t e = w->ids[t * c->k + i];
    return w->slot_of[LAYER * c->n_expert + e] >= 0 ? &w->ex[e] : NULL;
}

/* The bound on h = silu(g) u from the bounds eg, eu on its two dots. */
static double h_bound(double g, double u, double eg, double eu)
{
    double h = silu(g) * u;
    return 1.1 * eg * (fabs(u) + eu) + fabs(silu(g)) * eu + 1e-6 * fabs(h);
}

/* Reference h and its bounds (prefill; decode kernels in dbound); skipped
 * rows keep ref = NAN (the GPU must too). */
static void ref_h(const world *w, int64_t hs, double *ref, double *bound, double *dbound)
{
    const pcase *c = w->c;
    int64_t nsel = c->k + (c->shared ? 1 : 0);
#pragma omp parallel for schedule(dynamic)
    for (int64_t t = 0; t < c->ntok; t++)
        for (int64_t i = 0; i < nsel; i++) {
            const expert *xp = sel_expert(w, t, i);
            int64_t nff = i == c->k ? c->sh_ff : c->n_ff;
            for (int64_t r = 0; r < hs; r++) {
                int64_t o = (t * nsel + i) * hs + r;
                ref[o] = NAN;
                bound[o] = dbound[o] = 0;
                if (!xp || r >= nff)
                    continue;
                const float *xt = w->x + t * c->n_embd;
                double eg, eu, dg, du, g = dot_bounded(&xp->gate, r, xt, &eg, &dg);
                double u = dot_bounded(&xp->up, r, xt, &eu, &du);
                ref[o] = silu(g) * u;
                bound[o] = h_bound(g, u, eg, eu);
                dbound[o] = h_bound(g, u, dg, du);
            }
        }
}

/* Reference y from the GPU's own h (so the down half is checked on its own)
 * and its bounds (prefill; decode kernels in dbound). */
static void ref_y(const world *w, const float *h, int64_t hs, double *ref, double *bound,
                  double *dbound)
{
    const pcase *c = w->c;
    int64_t D = c->n_embd, nsel = c->k + (c->shared ? 1 : 0);
#pragma omp parallel for schedule(dynamic)
    for (int64_t t = 0; t < c->ntok; t++)
        for (int64_t r = 0; r < D; r++) {
            double s = 0, mag = 0, b = 0, db = 0;
            if (c->accumulate)
                s += w->y0[t * D + r], mag += fabs(w->y0[t * D + r]);
            if (c->use_add)
                s += w->add[t * D + r], mag += fabs(w->add[t * D + r]);
            for (int64_t i = 0; i < nsel; i++) {
                const expert *xp = sel_expert(w, t, i);
                if (!xp)
                    continue;
                double wt = i < c->k ? w->wts[t * c->k + i]
                            : c->use_logit ? 1.0 / (1.0 + exp(-(double)w->lg[t])) : 1.0;
                double e, de, d = dot_bounded(&xp->down, r, h + (t * nsel + i) * hs, &e, &de);
                s += wt * d;
                mag += fabs(wt * d);
                b += wt * e;
                db += wt * de;
            }
            ref[t * D + r] = s;
            bound[t * D + r] = b + 1e-6 * mag + 1e-30;
            dbound[t * D + r] = db + 1e-6 * mag + 1e-30;
        }
}

/* Checks got against ref within bound, where ref is NAN the element must be NaN. */
static void check_h(const char *what, const float *got, const double *ref, const double *bound,
                    size_t n)
{
    float *g2 = malloc(sizeof(float) * n);
    double *r2 = malloc(sizeof(double) * n);
    for (size_t i = 0; i < n; i++) {
        if (isnan(ref[i]) && !isnan(got[i]))
            fail_msg("%s: [%zu] written (%g) for a skipped expert or past n_ff", what, i,
                     (double)got[i]);
        g2[i] = isnan(ref[i]) ? 0.0f : got[i];
        r2[i] = isnan(ref[i]) ? 0.0 : ref[i];
    }
    check_close(what, g2, r2, bound, n, 0, 0);
    free(g2), free(r2);
}

typedef struct dev {
    tdm_gpu_expert_table tab;
    tdm_gpu_shared_expert sh;
    tdm_gpu_moe_layer L;
    float *x, *wts, *add, *y, *h;
    int32_t *ids;
    void *scratch;
    size_t scratch_bytes;
} dev;

static void dev_make(dev *d, const world *w)
{
    const pcase *c = w->c;
    int64_t E = c->n_expert, D = c->n_embd, ntok = c->ntok;
    size_t gb = w->ex[0].gate.bytes;
    d->tab = (tdm_gpu_expert_table){dev_upload(w->slot_of, sizeof(int32_t) * N_LAYER * E), E,
                                    dev_upload(w->arena, (w->n_slots ? w->n_slots : 1) * w->slot_bytes),
                                    w->slot_bytes, 0, gb, 2 * gb};
    if (c->shared)
        d->sh = (tdm_gpu_shared_expert){dev_upload(w->sh.gate.q, w->sh.gate.bytes),
                                        dev_upload(w->sh.up.q, w->sh.up.bytes),
                                        dev_upload(w->sh.down.q, w->sh.down.bytes),
                                        c->sh_gt, c->sh_gt, c->sh_dt, c->sh_ff,
                                        c->use_logit ? dev_upload(w->lg, sizeof(float) * ntok) : NULL};
    d->L = (tdm_gpu_moe_layer){&d->tab, LAYER, c->gt, c->gt, c->dt, D, c->n_ff,
                               c->shared ? &d->sh : NULL};
    d->x = dev_upload(w->x, sizeof(float) * ntok * D);
    d->ids = dev_upload(w->ids, sizeof(int32_t) * ntok * c->k);
    d->wts = dev_upload(w->wts, sizeof(float) * ntok * c->k);
    d->add = c->use_add ? dev_upload(w->add, sizeof(float) * ntok * D) : NULL;
    d->y = dev_alloc(sizeof(float) * ntok * D);
    int64_t nsel = c->k + (c->shared ? 1 : 0);
    d->h = dev_alloc(sizeof(float) * ntok * nsel * tdm_gpu_moe_h_stride(&d->L));
    d->scratch_bytes = tdm_gpu_moe_prefill_scratch_bytes(&d->L, ntok, c->k);
    assert_true(d->scratch_bytes > 0);
    d->scratch = dev_alloc(d->scratch_bytes);
}

static void dev_free_all(dev *d)
{
    dev_free((void *)d->tab.slot_of), dev_free((void *)d->tab.arena);
    if (d->L.shared) {
        dev_free((void *)d->sh.gate), dev_free((void *)d->sh.up), dev_free((void *)d->sh.down);
        if (d->sh.gate_logit)
            dev_free((void *)d->sh.gate_logit);
    }
    dev_free(d->x), dev_free(d->ids), dev_free(d->wts), dev_free(d->y), dev_free(d->h);
    if (d->add)
        dev_free(d->add);
    dev_free(d->scratch);
}

/* One prefill call on NaN-poisoned h, y reset to y0 (or NaN when not
 * accumulating) and NaN-poisoned scratch; returns h and y on the host. */
static void run_prefill(const world *w, dev *d, float **h, float **y)
{
    const pcase *c = w->c;
    int64_t D = c->n_embd, ntok = c->ntok, nh = ntok * (c->k + (c->shared ? 1 : 0)) * tdm_gpu_moe_h_stride(&d->L);
    GPU_OK(tdm_gpu_fill_f32(g_gpu, d->h, NAN, nh, ERR));
    GPU_OK(tdm_gpu_memset(g_gpu, d->scratch, 0xFF, d->scratch_bytes, ERR));
    if (c->accumulate)
        GPU_OK(tdm_gpu_upload(g_gpu, d->y, w->y0, sizeof(float) * ntok * D, ERR));
    else
        GPU_OK(tdm_gpu_fill_f32(g_gpu, d->y, NAN, ntok * D, ERR));
    GPU_OK(tdm_gpu_moe_prefill(g_gpu, &d->L, d->x, d->ids, d->wts, ntok, c->k, d->h, d->add, d->y,
                               c->accumulate, d->scratch, d->scratch_bytes, ERR));
    *h = dev_download_f32(d->h, nh);
    *y = dev_download_f32(d->y, ntok * D);
}

static void run_case(const pcase *c)
{
    world w;
    dev d;
    world_make(&w, c);
    dev_make(&d, &w);
    int64_t D = c->n_embd, ntok = c->ntok, hs = tdm_gpu_moe_h_stride(&d.L);
    size_t nh = (size_t)(ntok * (c->k + (c->shared ? 1 : 0)) * hs), ny = (size_t)(ntok * D);
    char what[160], tag[120];
    snprintf(tag, sizeof tag, "%s/%s D %lld F %lld E %lld k %lld ntok %lld%s %lld res",
             tdm_qtype_name(c->gt), tdm_qtype_name(c->dt), (long long)D, (long long)c->n_ff,
             (long long)c->n_expert, (long long)c->k, (long long)ntok, c->shared ? " +sh" : "",
             (long long)w.n_slots);

    float *h, *y, *h2, *y2;
    run_prefill(&w, &d, &h, &y);
    double *href = malloc(sizeof(double) * nh), *hb = malloc(sizeof(double) * nh);
    double *yref = malloc(sizeof(double) * ny), *yb = malloc(sizeof(double) * ny);
    double *hdb = malloc(sizeof(double) * nh), *ydb = malloc(sizeof(double) * ny);
    ref_h(&w, hs, href, hb, hdb);
    snprintf(what, sizeof what, "prefill h %s", tag);
    check_h(what, h, href, hb, nh);
    ref_y(&w, h, hs, yref, yb, ydb);
    snprintf(what, sizeof what, "prefill y %s", tag);
    check_close(what, y, yref, yb, ny, 0, 0);

    /* deterministic: a second call gives the same bits */
    run_prefill(&w, &d, &h2, &y2);
    for (size_t i = 0; i < nh; i++)
        if (memcmp(&h[i], &h2[i], sizeof(float)) != 0)
            fail_msg("h[%zu] differs between two calls: %g vs %g", i, (double)h[i], (double)h2[i]);
    assert_memory_equal(y, y2, sizeof(float) * ny);

    /* the decode kernels: gate_up on the same x, whose h may differ from the
     * prefill's by the sum of the two bounds (the decode one is mostly its
     * int8 activation rounding, header) */
    float *dh = dev_poisoned(tdm_gpu_moe_h_bytes(hs, ntok * (c->k + (c->shared ? 1 : 0))) / sizeof(float));
    GPU_OK(tdm_gpu_moe_gate_up(g_gpu, &d.L, d.x, NULL, d.ids, ntok, c->k, dh, ERR));
    float *hd = dev_download_f32(dh, nh);
    for (size_t i = 0; i < nh; i++)
        hb[i] += hdb[i];
    snprintf(what, sizeof what, "prefill h vs decode kernels %s", tag);
    double *hdd = malloc(sizeof(double) * nh);
    for (size_t i = 0; i < nh; i++)
        hdd[i] = isnan(href[i]) ? NAN : (double)hd[i];
    for (size_t i = 0; i < nh; i++)
        if (isnan(href[i]) != isnan(hd[i]))
            fail_msg("%s: [%zu] skipped by one path only", what, i);
    check_h(what, h, hdd, hb, nh);
    /* down multiplies the int8 copy of h that gate_up wrote, so its
     * reference is built on the decode kernels' own h */
    double *yrd = malloc(sizeof(double) * ny), *ybd = malloc(sizeof(double) * ny);
    ref_y(&w, hd, hs, yrd, ybd, ydb);
    if (c->accumulate)
        GPU_OK(tdm_gpu_upload(g_gpu, d.y, w.y0, sizeof(float) * ny, ERR));
    GPU_OK(tdm_gpu_moe_down(g_gpu, &d.L, dh, d.ids, d.wts, ntok, c->k, d.add, d.y, c->accumulate,
                            ERR));
    float *yd = dev_download_f32(d.y, ny);
    snprintf(what, sizeof what, "decode kernels' y vs float64 on their h %s", tag);
    check_close(what, yd, yrd, ydb, ny, 0, 0);

    free(h), free(y), free(h2), free(y2), free(hd), free(yd), free(hdd), free(yrd), free(ybd);
    free(href), free(hb), free(yref), free(yb), free(hdb), free(ydb);
    dev_free(dh);
    dev_free_all(&d);
    world_free(&w);
}

static void test_prefill_qwen35_shapes(void **state)
{
    (void)state;
    /* Qwen3.5-35B-A3B layer shapes with fewer experts: Q4_K gate/up, Q6_K
     * down, a Q5_K/Q8_0 shared expert of 288 rows (a partial row tile; its
     * down rows of 288 need a 32-element block format) */
    pcase c = {2048, 512, 24, 8, 9, 288, TDM_Q_Q4_K, TDM_Q_Q6_K, TDM_Q_Q5_K, TDM_Q_Q8_0,
               0.6, true, true, true, true};
    run_case(&c);
    c.ntok = 33, c.k = 1, c.resident = 0.5, c.use_add = false;
    run_case(&c);
    c.ntok = 77, c.k = 8, c.resident = 1.0, c.accumulate = false, c.use_logit = false;
    run_case(&c);
}

static void test_prefill_long_prompt(void **state)
{
    (void)state;
    /* 512 tokens over 16 experts: ~256 selections, 8 token tiles, per expert */
    pcase c = {512, 256, 16, 8, 512, 256, TDM_Q_Q4_K, TDM_Q_Q6_K, TDM_Q_Q8_0, TDM_Q_Q8_0,
               0.75, true, true, true, true};
    run_case(&c);
}

static void test_prefill_no_shared(void **state)
{
    (void)state;
    /* Qwen3-30B-A3B style: n_ff 768, no shared expert */
    pcase c = {1024, 768, 16, 8, 33, 0, TDM_Q_Q4_K, TDM_Q_Q4_K, 0, 0, 0.5, false, true, true,
               false};
    run_case(&c);
}

static void test_prefill_formats(void **state)
{
    (void)state;
    /* every format at small shapes (reductions shorter than one 64-wide
     * step, fewer rows than one 64-row tile); none resident in one case */
    for (size_t i = 0; i < N_GPU_TYPES; i++) {
        tdm_qtype t = k_gpu_types[i];
        int64_t blk = tdm_qtype_get(t)->block < 32 ? 32 : tdm_qtype_get(t)->block;
        pcase c = {2 * blk, blk, 7, 3, 19, blk, t, t, t, t, i == 3 ? 0.0 : 0.7, true, true,
                   true, true};
        run_case(&c);
    }
}

static void test_prefill_bad_input(void **state)
{
    (void)state;
    tdm_error e = {0};
    int32_t *d = dev_alloc(4096);
    float *f = dev_poisoned(4096);
    tdm_gpu_expert_table tab = {d, 8, d, 64, 0, 0, 0};
    tdm_gpu_moe_layer L = {&tab, 0, TDM_Q_Q4_K, TDM_Q_Q4_K, TDM_Q_Q4_K, 256, 256, NULL};
    size_t need = tdm_gpu_moe_prefill_scratch_bytes(&L, 4, 2);
    assert_true(need > 0);
    void *s = dev_alloc(need);
#define BAD(status, call)                                                                    \
    do {                                                                                     \
        assert_int_equal((call), (status));                                                  \
        printf("  %s\n", e.msg);                                                             \
    } while (0)
    BAD(TDM_ERR_INVALID, tdm_gpu_moe_prefill(g_gpu, &L, f, d, f, 4, 2, f, NULL, f, false, s,
                                             need - 1, &e));
    BAD(TDM_ERR_INVALID, tdm_gpu_moe_prefill(g_gpu, &L, f, d, f, 4, 2, f, NULL, f, false, NULL,
                                             need, &e));
    BAD(TDM_ERR_INVALID, tdm_gpu_moe_prefill(g_gpu, &L, f + 1, d, f, 4, 2, f, NULL, f, false, s,
                                             need, &e));
    BAD(TDM_ERR_INVALID, tdm_gpu_moe_prefill(g_gpu, &L, f, d, f, 4, 9, f, NULL, f, false, s, need,
                                             &e));
    BAD(TDM_ERR_INVALID, tdm_gpu_moe_prefill(g_gpu, &L, f, d, f, 0, 2, f, NULL, f, false, s, need,
                                             &e));
    L.n_ff = 100;
    BAD(TDM_ERR_INVALID, tdm_gpu_moe_prefill(g_gpu, &L, f, d, f, 4, 2, f, NULL, f, false, s, need,
                                             &e));
    L.n_ff = 256;
    L.down_type = TDM_Q_IQ2_XXS;
    BAD(TDM_ERR_UNSUPPORTED, tdm_gpu_moe_prefill(g_gpu, &L, f, d, f, 4, 2, f, NULL, f, false, s,
                                                 need, &e));
    L.down_type = TDM_Q_Q4_K;
    tab.n_expert = 5000;
    BAD(TDM_ERR_INVALID, tdm_gpu_moe_prefill(g_gpu, &L, f, d, f, 4, 2, f, NULL, f, false, s, need,
                                             &e));
    assert_int_equal(tdm_gpu_moe_prefill_scratch_bytes(&L, 4, 2), 0);
    tab.n_expert = 8;
    L.table = NULL;
    BAD(TDM_ERR_INVALID, tdm_gpu_moe_prefill(g_gpu, &L, f, d, f, 4, 2, f, NULL, f, false, s, need,
                                             &e));
#undef BAD
    GPU_OK(tdm_gpu_sync(g_gpu, ERR));
    dev_free(s);
    dev_free(d);
    dev_free(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefill_qwen35_shapes),
        cmocka_unit_test(test_prefill_long_prompt),
        cmocka_unit_test(test_prefill_no_shared),
        cmocka_unit_test(test_prefill_formats),
        cmocka_unit_test(test_prefill_bad_input),
    };
    return cmocka_run_group_tests(tests, gpu_setup, gpu_teardown);
}
