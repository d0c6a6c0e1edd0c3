/* test_gpu_moe: the two fused MoE launches against a float64 host reference:
 * experts addressed through a residency table (layer x expert -> slot or -1)
 * into a slot arena, non-resident experts skipped (their h rows stay
 * poisoned, their contribution absent) or read from registered host memory
 * (the direct share, a quota of misses), shared expert with a sigmoid gate and
 * its own types, the CPU partial sum `add`, accumulation into the residual,
 * real shapes (2048 x 512 and 2048 x 768) and mixed formats.
 *
 * Quantised matrices multiply int8 activations (x, and h in the down
 * launch, quantised per 32 elements; docs/GPU.md): the reference uses the
 * very same x^ = q dx, reproduced bit for bit by tdm_gpu_xq_host, so the
 * bounds stay those of float32 summation. F32/F16/BF16 use x itself. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "gpu_test_hooks.h"
#include "gpu_testutil.h"

typedef struct mat {
    tdm_qtype t;
    int64_t rows, k;
    size_t bytes;
    uint8_t *q;
    float *f;
} mat;

static void mat_make(mat *m, tdm_qtype t, int64_t rows, int64_t k)
{
    m->t = t;
    m->rows = rows;
    m->k = k;
    size_t rb = tdm_qtype_row_bytes(t, k);
    m->bytes = rb * rows;
    m->q = malloc(m->bytes);
    m->f = malloc(sizeof(float) * rows * k);
    for (int64_t r = 0; r < rows; r++) {
        rand_row(t, m->q + r * rb, k);
        tdm_error e = {0};
        assert_int_equal(tdm_dequant_row(t, m->q + r * rb, m->f + r * k, k, &e), TDM_OK);
    }
}

static void mat_free(mat *m)
{
    free(m->q);
    free(m->f);
}

/* dot of row r with x in float64; *abs gets sum |w x| */
static double rdot(const mat *m, int64_t r, const double *x, double *abs)
{
    double s = 0, a = 0;
    for (int64_t i = 0; i < m->k; i++) {
        double p = (double)m->f[r * m->k + i] * x[i];
        s += p;
        a += fabs(p);
    }
    *abs = a;
    return s;
}

/* The n activations a matrix of type t multiplies: x itself for
 * F32/F16/BF16, else the int8 x^ = q dx of the kernels (n % 32 == 0). */
static void activations(tdm_qtype t, const float *x, int64_t n, double *out)
{
    if (t == TDM_Q_F32 || t == TDM_Q_F16 || t == TDM_Q_BF16) {
        for (int64_t i = 0; i < n; i++)
            out[i] = x[i];
        return;
    }
    int8_t *q = malloc((size_t)n);
    float *dx = malloc(sizeof(float) * (size_t)(n / 32));
    tdm_gpu_xq_host(x, n, q, dx);
    for (int64_t i = 0; i < n; i++)
        out[i] = (double)q[i] * dx[i / 32];
    free(q);
    free(dx);
}

typedef struct expert {
    mat gate, up, down;
} expert;

static double silu(double v) { return v / (1.0 + exp(-v)); }

typedef struct moe_case {
    int64_t n_embd, n_ff, n_expert, k, ntok, layer, n_layer, sh_ff;
    tdm_qtype gt, dt, sh_gt, sh_dt;
    double resident; /* fraction of experts given a slot */
    bool shared;
    tdm_qtype ut, sh_ut; /* up types when they differ from gate's (0: the same) */
    int direct;          /* > 0: misses read from registered host memory, quota direct - 1 */
} moe_case;

static void run_moe_tile(const moe_case *c);

/* tdm_gpu_router_shared, then gate_up with L->shared_done, against
 * tdm_gpu_router and the whole gate_up launch (want: its h, from ids, as
 * run_moe_tile computed it): the same ids and weights, the same h bit for bit
 * (float rows and int8 copy). The logits make the router pick ids (ranks in
 * order, far above every other expert). As in the forward, the launch right
 * before router_shared (here a fill) does not write x; with x8 (one token)
 * also x's int8 copy as the norm writes it. */
static void check_router_shared(const tdm_gpu_moe_layer *L, const float *dx, const float *want, const int32_t *ids,
                                int64_t ntok, int64_t k, const float *x8)
{
    const int64_t E = L->table->n_expert, nsel = k + 1;
    const size_t hbytes = tdm_gpu_moe_h_bytes(tdm_gpu_moe_h_stride(L), ntok * nsel);
    float *lg = malloc(sizeof(float) * ntok * E);
    assert_non_null(lg);
    for (int64_t t = 0; t < ntok; t++) {
        for (int64_t e = 0; e < E; e++)
            lg[t * E + e] = -1.0f - rng_unif();
        for (int64_t r = 0; r < k; r++)
            lg[t * E + ids[t * k + r]] = 8.0f - 0.25f * (float)r;
    }
    float *dlg = dev_upload(lg, sizeof(float) * ntok * E), *dw1 = dev_poisoned(ntok * k), *dw2 = dev_poisoned(ntok * k);
    int32_t *di1 = dev_alloc(sizeof(int32_t) * ntok * k), *di2 = dev_alloc(sizeof(int32_t) * ntok * k);
    float *dh = dev_poisoned(hbytes / sizeof(float)), *fill = dev_poisoned(64);
    void *dxq = NULL;
    if (x8 && ntok == 1) {
        const size_t qb = tdm_gpu_xq8_bytes(1, L->n_embd);
        void *hxq = calloc(1, qb);
        assert_non_null(hxq);
        GPU_OK(tdm_gpu_xq8_pack_host(x8, 1, L->n_embd, hxq, ERR));
        dxq = dev_upload(hxq, qb);
        free(hxq);
    }
    GPU_OK(tdm_gpu_router(g_gpu, dlg, ntok, E, k, true, di1, dw1, ERR));
    GPU_OK(tdm_gpu_fill_f32(g_gpu, fill, 1.0f, 64, ERR));
    GPU_OK(tdm_gpu_router_shared(g_gpu, L, dlg, ntok, E, k, true, di2, dw2, dx, dxq, dh, ERR));
    tdm_gpu_moe_layer Ld = *L;
    Ld.shared_done = true;
    GPU_OK(tdm_gpu_moe_gate_up(g_gpu, &Ld, dx, dxq, di2, ntok, k, dh, ERR));
    int32_t *i1 = malloc(sizeof(int32_t) * ntok * k), *i2 = malloc(sizeof(int32_t) * ntok * k);
    float *w1 = dev_download_f32(dw1, ntok * k), *w2 = dev_download_f32(dw2, ntok * k);
    uint8_t *h1 = malloc(hbytes), *h2 = malloc(hbytes);
    assert_true(i1 && i2 && h1 && h2);
    GPU_OK(tdm_gpu_download(g_gpu, i1, di1, sizeof(int32_t) * ntok * k, ERR));
    GPU_OK(tdm_gpu_download(g_gpu, i2, di2, sizeof(int32_t) * ntok * k, ERR));
    GPU_OK(tdm_gpu_download(g_gpu, h1, want, hbytes, ERR));
    GPU_OK(tdm_gpu_download(g_gpu, h2, dh, hbytes, ERR));
    if (memcmp(i1, ids, sizeof(int32_t) * ntok * k) || memcmp(i2, ids, sizeof(int32_t) * ntok * k) ||
        memcmp(w1, w2, sizeof(float) * ntok * k))
        fail_msg("router_shared: a choice differs from tdm_gpu_router's");
    if (memcmp(h1, h2, hbytes) != 0)
        fail_msg("router_shared then gate_up: h differs from gate_up's alone");
    printf("  router_shared + gate_up (%s): the same ids, weights and h\n", dxq ? "x's int8 copy" : "x");
    free(lg), free(i1), free(i2), free(w1), free(w2), free(h1), free(h2);
    dev_free(dlg), dev_free(dw1), dev_free(dw2), dev_free(di1), dev_free(di2), dev_free(dh), dev_free(fill);
    if (dxq)
        dev_free(dxq);
}

/* Every launch shape of the fused down kernel (rows per block) must compute
 * the same values. */
static void run_moe(const moe_case *c)
{
    static const int tiles[] = {8, 16, 32};
    for (size_t i = 0; i < sizeof tiles / sizeof tiles[0]; i++) {
        tdm_gpu_tuning tu = {.moe_tile = tiles[i]};
        GPU_OK(tdm_gpu_set_tuning(g_gpu, &tu, ERR));
        printf("  down tile %d\n", tiles[i]);
        run_moe_tile(c);
    }
    tdm_gpu_tuning tu = {0};
    GPU_OK(tdm_gpu_set_tuning(g_gpu, &tu, ERR));
}

static void run_moe_tile(const moe_case *c)
{
    int64_t E = c->n_expert, k = c->k, ntok = c->ntok, D = c->n_embd, F = c->n_ff;
    expert *ex = calloc(E, sizeof *ex), sh;
    for (int64_t e = 0; e < E; e++) {
        mat_make(&ex[e].gate, c->gt, F, D);
        mat_make(&ex[e].up, c->ut ? c->ut : c->gt, F, D);
        mat_make(&ex[e].down, c->dt, D, F);
    }
    if (c->shared) {
        mat_make(&sh.gate, c->sh_gt, c->sh_ff, D);
        mat_make(&sh.up, c->sh_ut ? c->sh_ut : c->sh_gt, c->sh_ff, D);
        mat_make(&sh.down, c->sh_dt, D, c->sh_ff);
    }
    /* residency: a random subset of this layer's experts in shuffled slots;
     * the other layers' rows point at garbage slots that must not be used */
    int32_t *slot_of = malloc(sizeof(int32_t) * c->n_layer * E);
    for (int64_t i = 0; i < c->n_layer * E; i++)
        slot_of[i] = 1000000;
    int64_t n_slots = 0;
    for (int64_t e = 0; e < E; e++)
        slot_of[c->layer * E + e] = rng_unif() < c->resident ? (int32_t)n_slots++ : -1;
    for (int64_t e = E - 1; e > 0; e--) { /* shuffle the slot numbers */
        int64_t r = (int64_t)(rng_u64() % (uint64_t)(e + 1));
        int32_t *a = &slot_of[c->layer * E + e], *b = &slot_of[c->layer * E + r];
        int32_t t = *a; *a = *b; *b = t;
    }
    size_t gb = ex[0].gate.bytes, ub = ex[0].up.bytes, db = ex[0].down.bytes;
    /* slots aligned no more than their formats ask (gpu.h): an odd-sized
     * slot padded to the largest of the three alignments */
    size_t al = 1;
    const tdm_qtype mt[3] = {c->gt, c->ut ? c->ut : c->gt, c->dt};
    for (int i = 0; i < 3; i++) {
        const size_t a = (size_t)tdm_gpu_weight_align(mt[i]);
        assert_true(a >= 1 && gb % a == 0 && (gb + ub) % a == 0);
        al = a > al ? a : al;
    }
    size_t slot_bytes = gb + ub + db + 1;
    slot_bytes = (slot_bytes + al - 1) / al * al;
    uint8_t *arena = calloc(n_slots ? n_slots : 1, slot_bytes);
    for (int64_t e = 0; e < E; e++) {
        int32_t s = slot_of[c->layer * E + e];
        if (s < 0)
            continue;
        memcpy(arena + s * slot_bytes, ex[e].gate.q, gb);
        memcpy(arena + s * slot_bytes + gb, ex[e].up.q, ub);
        memcpy(arena + s * slot_bytes + gb + ub, ex[e].down.q, db);
    }
    /* inputs */
    float *x = malloc(sizeof(float) * ntok * D);
    rand_floats(x, ntok * D, 1.0f);
    int32_t *ids = malloc(sizeof(int32_t) * ntok * k);
    float *wts = malloc(sizeof(float) * ntok * k), *lg = malloc(sizeof(float) * ntok);
    for (int64_t t = 0; t < ntok; t++) {
        for (int64_t r = 0; r < k; r++) {
            int32_t e;
            bool dup;
            do { /* k distinct experts */
                e = (int32_t)(rng_u64() % (uint64_t)E);
                dup = false;
                for (int64_t q = 0; q < r; q++)
                    dup |= ids[t * k + q] == e;
            } while (dup);
            ids[t * k + r] = e;
            wts[t * k + r] = 0.05f + rng_unif();
        }
        lg[t] = 2.0f * rng_sym();
    }
    /* which selections the launch computes: resident ones, and with direct
     * experts the first quota misses in [t][i] order */
    bool *taken = malloc(sizeof(bool) * ntok * k);
    const int quota = c->direct - 1;
    for (int64_t i = 0, before = 0; i < ntok * k; i++) {
        const bool miss = slot_of[c->layer * E + ids[i]] < 0;
        taken[i] = !miss || (c->direct > 0 && before < quota);
        before += miss;
    }
    /* direct: every expert's matrices back to back per kind, in host memory
     * of whole pages of its own registered with the device (as the model's
     * copy of its experts; gpu.h: no other heap data in the registered pages) */
    uint8_t *hostw = NULL;
    tdm_gpu_direct_experts dir = {0};
    if (c->direct > 0) {
        const size_t total = ((gb + ub + db) * (size_t)E + 4095) & ~(size_t)4095;
        assert_int_equal(posix_memalign((void **)&hostw, 4096, total), 0);
        for (int64_t e = 0; e < E; e++) {
            memcpy(hostw + e * gb, ex[e].gate.q, gb);
            memcpy(hostw + E * gb + e * ub, ex[e].up.q, ub);
            memcpy(hostw + E * (gb + ub) + e * db, ex[e].down.q, db);
        }
        const void *dev = NULL;
        GPU_OK(tdm_gpu_host_register(g_gpu, hostw, total, &dev, ERR));
        dir = (tdm_gpu_direct_experts){dev, (const uint8_t *)dev + E * gb, (const uint8_t *)dev + E * (gb + ub),
                                       gb, ub, db, dev_upload(&quota, sizeof quota)};
    }
    float *y0 = malloc(sizeof(float) * ntok * D), *add = malloc(sizeof(float) * ntok * D);
    rand_floats(y0, ntok * D, 1.0f);
    rand_floats(add, ntok * D, 1.0f);
    /* device */
    tdm_gpu_expert_table tab = {dev_upload(slot_of, sizeof(int32_t) * c->n_layer * E), E,
                                dev_upload(arena, (n_slots ? n_slots : 1) * slot_bytes), slot_bytes,
                                0, gb, gb + ub};
    tdm_gpu_shared_expert dsh = {0};
    if (c->shared)
        dsh = (tdm_gpu_shared_expert){dev_upload(sh.gate.q, sh.gate.bytes),
                                      dev_upload(sh.up.q, sh.up.bytes),
                                      dev_upload(sh.down.q, sh.down.bytes),
                                      c->sh_gt, c->sh_ut ? c->sh_ut : c->sh_gt, c->sh_dt, c->sh_ff,
                                      dev_upload(lg, sizeof(float) * ntok)};
    tdm_gpu_moe_layer L = {&tab, c->layer, c->gt, c->ut ? c->ut : c->gt, c->dt, D, F,
                           c->shared ? &dsh : NULL, c->direct > 0 ? &dir : NULL};
    int64_t hs = tdm_gpu_moe_h_stride(&L), nsel = k + (c->shared ? 1 : 0);
    float *dx = dev_upload(x, sizeof(float) * ntok * D);
    float *dh = dev_poisoned(tdm_gpu_moe_h_bytes(hs, ntok * nsel) / sizeof(float)); /* floats and the int8 copy */
    int32_t *dids = dev_upload(ids, sizeof(int32_t) * ntok * k);
    float *dw = dev_upload(wts, sizeof(float) * ntok * k), *dadd = dev_upload(add, sizeof(float) * ntok * D);
    float *dy = dev_upload(y0, sizeof(float) * ntok * D);
    GPU_OK(tdm_gpu_moe_gate_up(g_gpu, &L, dx, NULL, dids, ntok, k, dh, ERR));
    if (ntok == 1 && D % 32 == 0) { /* with x's int8 copy (as a norm writes it): the same h, bit for bit */
        const size_t hbytes = tdm_gpu_moe_h_bytes(hs, ntok * nsel), qb = tdm_gpu_xq8_bytes(1, D);
        void *hxq = calloc(1, qb);
        assert_non_null(hxq);
        GPU_OK(tdm_gpu_xq8_pack_host(x, 1, D, hxq, ERR));
        void *dxq = dev_upload(hxq, qb);
        float *dh2 = dev_poisoned(hbytes / sizeof(float));
        GPU_OK(tdm_gpu_moe_gate_up(g_gpu, &L, dx, dxq, dids, ntok, k, dh2, ERR));
        uint8_t *h1 = malloc(hbytes), *h2 = malloc(hbytes);
        assert_non_null(h1);
        assert_non_null(h2);
        GPU_OK(tdm_gpu_download(g_gpu, h1, dh, hbytes, ERR));
        GPU_OK(tdm_gpu_download(g_gpu, h2, dh2, hbytes, ERR));
        if (memcmp(h1, h2, hbytes) != 0)
            fail_msg("moe gate_up with x's int8 copy: h differs");
        free(h1), free(h2), free(hxq);
        dev_free(dxq), dev_free(dh2);
    }
    if (c->shared && E <= TDM_GPU_ROUTER_SHARED_MAX_EXPERTS)
        check_router_shared(&L, dx, dh, ids, ntok, k, D % 32 == 0 ? x : NULL);
    GPU_OK(tdm_gpu_moe_down(g_gpu, &L, dh, dids, dw, ntok, k, dadd, dy, true, ERR));
    if (al > 1) { /* a slot stride that breaks one matrix's alignment is refused */
        tdm_gpu_expert_table bad = tab;
        bad.slot_bytes = slot_bytes + al / 2;
        tdm_gpu_moe_layer Lb = L;
        Lb.table = &bad;
        tdm_error e = {0};
        assert_int_equal(tdm_gpu_moe_down(g_gpu, &Lb, dh, dids, dw, ntok, k, dadd, dy, true, &e), TDM_ERR_INVALID);
    }
    float *h = dev_download_f32(dh, ntok * nsel * hs), *y = dev_download_f32(dy, ntok * D);

    /* h: reference for resident selections; poisoned elsewhere */
    double *href = calloc(ntok * nsel * hs, sizeof(double)), *hb = calloc(ntok * nsel * hs, sizeof(double));
    double *xg = malloc(sizeof(double) * D), *xu = malloc(sizeof(double) * D);
    float *hcmp = malloc(sizeof(float) * ntok * nsel * hs);
    for (int64_t t = 0; t < ntok; t++)
        for (int64_t i = 0; i < nsel; i++) {
            const expert *xp = NULL;
            if (i < k && taken[t * k + i])
                xp = &ex[ids[t * k + i]];
            else if (i == k)
                xp = &sh;
            int64_t nff = i == k ? c->sh_ff : F;
            if (xp) {
                activations(xp->gate.t, x + t * D, D, xg);
                activations(xp->up.t, x + t * D, D, xu);
            }
            for (int64_t r = 0; r < hs; r++) {
                int64_t o = (t * nsel + i) * hs + r;
                hcmp[o] = 0;
                if (!xp || r >= nff) {
                    if (!isnan(h[o]))
                        fail_msg("h[%lld][%lld][%lld] written for a skipped expert or past n_ff",
                                 (long long)t, (long long)i, (long long)r);
                    continue;
                }
                double ag, au, g = rdot(&xp->gate, r, xg, &ag), u = rdot(&xp->up, r, xu, &au);
                href[o] = silu(g) * u;
                hb[o] = 1e-5 * (1.2 * ag * fabs(u) + fabs(silu(g)) * au) + 1e-12;
                hcmp[o] = h[o];
            }
        }
    char what[120];
    snprintf(what, sizeof what, "moe gate_up %s/%s D %lld F %lld k %lld ntok %lld%s",
             tdm_qtype_name(c->gt), tdm_qtype_name(c->dt), (long long)D, (long long)F,
             (long long)k, (long long)ntok, c->shared ? " +shared" : "");
    check_close(what, hcmp, href, hb, ntok * nsel * hs, 0, 0);

    /* y: from the GPU's own h, so the down kernel is checked on its own */
    double *yref = malloc(sizeof(double) * ntok * D), *yb = malloc(sizeof(double) * ntok * D);
    double *hq = calloc(ntok * nsel * hs, sizeof(double)); /* the h the down launch multiplies */
    for (int64_t t = 0; t < ntok; t++)
        for (int64_t i = 0; i < nsel; i++)
            if (i == k || taken[t * k + i])
                activations(i == k ? c->sh_dt : c->dt, h + (t * nsel + i) * hs, i == k ? c->sh_ff : F,
                            hq + (t * nsel + i) * hs);
    for (int64_t t = 0; t < ntok; t++)
        for (int64_t r = 0; r < D; r++) {
            double s = (double)y0[t * D + r] + add[t * D + r], a = fabs(s);
            for (int64_t i = 0; i < nsel; i++) {
                const mat *dm = NULL;
                double wgt;
                if (i < k) {
                    if (!taken[t * k + i])
                        continue;
                    dm = &ex[ids[t * k + i]].down;
                    wgt = wts[t * k + i];
                } else {
                    dm = &sh.down;
                    wgt = 1.0 / (1.0 + exp(-(double)lg[t]));
                }
                double ad, d = rdot(dm, r, hq + (t * nsel + i) * hs, &ad);
                s += wgt * d;
                a += wgt * ad;
            }
            yref[t * D + r] = s;
            yb[t * D + r] = 1e-5 * a + 1e-12;
        }
    snprintf(what, sizeof what, "moe down (+add, accumulate, %lld of %lld resident, direct quota %d)",
             (long long)n_slots, (long long)E, quota);
    check_close(what, y, yref, yb, ntok * D, 0, 0);

    free(h), free(y), free(href), free(hb), free(hcmp), free(yref), free(yb);
    free(xg), free(xu), free(hq);
    if (hostw) {
        tdm_gpu_host_unregister(g_gpu, hostw);
        dev_free((void *)dir.quota);
        free(hostw);
    }
    free(taken);
    free(x), free(ids), free(wts), free(lg), free(y0), free(add), free(slot_of), free(arena);
    dev_free(dx), dev_free(dh), dev_free(dids), dev_free(dw), dev_free(dadd), dev_free(dy);
    dev_free((void *)tab.slot_of), dev_free((void *)tab.arena);
    if (c->shared) {
        dev_free((void *)dsh.gate), dev_free((void *)dsh.up), dev_free((void *)dsh.down);
        dev_free((void *)dsh.gate_logit);
        mat_free(&sh.gate), mat_free(&sh.up), mat_free(&sh.down);
    }
    for (int64_t e = 0; e < E; e++)
        mat_free(&ex[e].gate), mat_free(&ex[e].up), mat_free(&ex[e].down);
    free(ex);
}

static void test_moe_qwen35_shapes(void **state)
{
    (void)state;
    /* Qwen3.5-35B-A3B layer shapes (fewer experts), Q4_K_M mix, shared expert
     * with different types and a narrower width, 60% resident */
    moe_case c = {2048, 512, 24, 8, 1, 1, 3, 256, TDM_Q_Q4_K, TDM_Q_Q6_K, TDM_Q_Q8_0, TDM_Q_Q5_K,
                  0.6, true};
    run_moe(&c);
    c.ntok = 3;
    c.resident = 1.0;
    run_moe(&c);
}

/* Misses read from registered host memory (zero-copy): a quota of 0, a
 * share, and more than there are misses. */
static void test_moe_direct(void **state)
{
    (void)state;
    moe_case c = {2048, 512, 24, 8, 1, 1, 3, 256, TDM_Q_Q4_K, TDM_Q_Q6_K, TDM_Q_Q8_0, TDM_Q_Q5_K,
                  0.4, true};
    static const int quotas[] = {0, 3, 64};
    for (size_t i = 0; i < sizeof quotas / sizeof quotas[0]; i++) {
        c.direct = quotas[i] + 1;
        c.ntok = i == 1 ? 3 : 1; /* several tokens: the quota spans the launch */
        run_moe(&c);
    }
    moe_case odd = {512, 96, 7, 3, 2, 0, 1, 64, TDM_Q_Q5_K, TDM_Q_Q8_0, TDM_Q_Q4_0, TDM_Q_Q8_0, 0.3, true};
    odd.direct = 3;
    run_moe(&odd);
    /* the Q4_K_M layer as the models have it: the shared expert of the routed
     * types, so both launches run the kernels compiled for one type */
    moe_case q4km = {2048, 512, 24, 8, 2, 0, 1, 512, TDM_Q_Q4_K, TDM_Q_Q6_K, TDM_Q_Q4_K, TDM_Q_Q6_K, 0.4, true};
    q4km.direct = 4;
    run_moe(&q4km);
}

static void test_moe_qwen3_shapes(void **state)
{
    (void)state;
    /* Qwen3-30B-A3B: n_ff 768, no shared expert */
    moe_case c = {2048, 768, 16, 8, 2, 0, 2, 0, TDM_Q_Q4_K, TDM_Q_Q4_K, 0, 0, 0.5, false};
    run_moe(&c);
}

static void test_moe_small_formats(void **state)
{
    (void)state;
    /* every format in the fused path at small odd shapes; none resident in
     * one case (only add + shared reach y) */
    for (size_t i = 0; i < N_GPU_TYPES; i++) {
        tdm_qtype t = k_gpu_types[i];
        int64_t blk = tdm_qtype_get(t)->block < 32 ? 32 : tdm_qtype_get(t)->block;
        moe_case c = {blk * 2, blk, 7, 3, 3, 0, 1, blk, t, t, t, t, i == 3 ? 0.0 : 0.7, true};
        run_moe(&c);
    }
}

static void test_moe_long_rows(void **state)
{
    (void)state;
    /* activations longer than one shared-memory chunk: 9 h rows of 2048
     * (down), and x of 16640 (gate/up) */
    moe_case c = {512, 2048, 12, 8, 2, 0, 1, 1024, TDM_Q_Q4_K, TDM_Q_Q6_K, TDM_Q_Q8_0, TDM_Q_Q4_K,
                  0.8, true};
    run_moe(&c);
    moe_case w = {16640, 64, 4, 2, 1, 0, 1, 64, TDM_Q_Q4_K, TDM_Q_Q8_0, TDM_Q_Q8_0, TDM_Q_BF16,
                  1.0, true};
    run_moe(&w);
}

static void test_moe_mixed_gate_up(void **state)
{
    (void)state;
    /* gate and up of different types (two separate row dots instead of the
     * paired one), routed and shared */
    moe_case c = {512, 256, 9, 4, 3, 0, 1, 256, TDM_Q_Q4_K, TDM_Q_Q6_K, TDM_Q_Q8_0, TDM_Q_Q8_0,
                  0.7, true, TDM_Q_Q5_K, TDM_Q_F16};
    run_moe(&c);
}

static void test_moe_bad_input(void **state)
{
    (void)state;
    tdm_error e = {0};
    int32_t *d = dev_alloc(64);
    tdm_gpu_expert_table tab = {d, 8, d, 64, 0, 0, 0};
    tdm_gpu_moe_layer L = {&tab, 0, TDM_Q_IQ2_XXS, TDM_Q_IQ2_XXS, TDM_Q_Q4_K, 256, 256, NULL};
    float *f = dev_poisoned(1024);
    assert_int_equal(tdm_gpu_moe_gate_up(g_gpu, &L, f, NULL, d, 1, 2, f, &e), TDM_ERR_UNSUPPORTED);
    printf("  %s\n", e.msg);
    L.gate_type = L.up_type = TDM_Q_Q4_K;
    L.n_ff = 100;
    assert_int_equal(tdm_gpu_moe_down(g_gpu, &L, f, d, f, 1, 2, NULL, f, false, &e), TDM_ERR_INVALID);
    printf("  %s\n", e.msg);
    L.n_ff = 256;
    assert_int_equal(tdm_gpu_moe_down(g_gpu, &L, f + 4, d, f, 1, 2, NULL, f, false, &e), TDM_ERR_INVALID);
    printf("  %s\n", e.msg);
    assert_int_equal(tdm_gpu_moe_gate_up(g_gpu, &L, f, NULL, d, 1, 9, f, &e), TDM_ERR_INVALID);
    /* router_shared: a layer without a shared expert, more experts than its lanes hold */
    assert_int_equal(tdm_gpu_router_shared(g_gpu, &L, f, 1, 8, 2, true, d, f, f, NULL, f, &e), TDM_ERR_INVALID);
    printf("  %s\n", e.msg);
    assert_int_equal(tdm_gpu_router_shared(g_gpu, &L, f, 1, TDM_GPU_ROUTER_SHARED_MAX_EXPERTS + 1, 2, true, d, f, f,
                                           NULL, f, &e),
                     TDM_ERR_INVALID);
    printf("  %s\n", e.msg);
    L.table = NULL;
    assert_int_equal(tdm_gpu_moe_gate_up(g_gpu, &L, f, NULL, d, 1, 2, f, &e), TDM_ERR_INVALID);
    GPU_OK(tdm_gpu_sync(g_gpu, ERR));
    dev_free(d);
    dev_free(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_moe_qwen35_shapes),
        cmocka_unit_test(test_moe_direct),
        cmocka_unit_test(test_moe_qwen3_shapes),
        cmocka_unit_test(test_moe_small_formats),
        cmocka_unit_test(test_moe_long_rows),
        cmocka_unit_test(test_moe_mixed_gate_up),
        cmocka_unit_test(test_moe_bad_input),
    };
    return cmocka_run_group_tests(tests, gpu_setup, gpu_teardown);
}
