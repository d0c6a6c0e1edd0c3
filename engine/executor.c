/* executor: split, publish, compute hits, wait, merge; policy between passes. */
#include "executor.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct tdm_executor {
    const tdm_model *m;
    const tdm_hparams *hp;
    tdm_expert_cache *cache;
    tdm_pool *pool;
    int dev_threads;
    int32_t max_batch, k, first_moe, last_moe;
    tdm_experts_scratch *ex;  /* device side (hits) */
    tdm_expert_sel *hit;      /* [max_batch * k] (token, slot, weight) */
    tdm_expert_sel *dir;      /* [max_batch * k] (token, expert, weight): emulated direct share */
    int32_t direct_mode;      /* params.direct */
    tdm_direct_tuner tuner;   /* params.direct -1 on a GPU */
    int32_t *log;             /* [n_layer][max_batch][k] routing of the pass, for the policy */
    uint8_t *logged;          /* [n_layer] */
    int32_t log_n;            /* tokens of the logged pass */
    int64_t token;            /* next token index for the policy */
    tdm_profile *learn;       /* borrowed, or NULL */
    bool gpu;                 /* the device side is a real GPU (tdm_executor_gpu_*) */
    tdm_executor_stats st;
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

void tdm_executor_params_init(tdm_executor_params *p)
{
    memset(p, 0, sizeof *p);
    p->n_slots = -1;
    p->n_ctx = 4096;
    p->max_batch = 512;
    p->policy = -1;
    p->adapt_swaps = -1;
    p->direct = -1;
    p->prefetch = -1;
    p->pool_warm = -1;
}

static tdm_status make_cache(tdm_executor *x, const tdm_executor_params *p, tdm_error *err)
{
    int32_t n_slots = p->n_slots;
    if (n_slots < 0) {
        if (!p->gpu_mem)
            return tdm_error_set(err, TDM_ERR_INVALID, "executor: give n_slots >= 0 or a gpu_mem budget");
        tdm_budget b;
        tdm_status st = tdm_budget_plan(x->m, p->n_ctx, p->max_batch, p->gpu_mem, &b, err);
        if (st)
            return st;
        n_slots = b.n_slots;
    }
    const int policy = p->policy >= 0 ? p->policy : p->profile ? TDM_CACHE_STATIC : TDM_CACHE_LAYER;
    tdm_cache_params cp;
    tdm_cache_params_init(&cp, (tdm_cache_policy)policy, x->hp->n_layer, x->hp->n_expert, x->hp->n_expert_used,
                          n_slots);
    cp.profile = p->profile;
    cp.per_layer = p->per_layer;
    if (p->adapt_every > 0)
        cp.adapt_every = p->adapt_every;
    if (p->adapt_swaps >= 0)
        cp.adapt_swaps = p->adapt_swaps;
    if (p->adapt_decay > 0)
        cp.adapt_decay = p->adapt_decay;
    return tdm_expert_cache_new(x->m, &cp, p->dev ? p->dev : tdm_expert_device_host(), &x->cache, err);
}

/* The direct share's first value: half the misses the prefetch (pf
 * experts; forward_gpu.c sets the count it runs) leaves in a layer that
 * misses (the best share measured on the H200 host, with and without a
 * prefetch, when such a layer misses all k). A layer's misses are counted
 * from the fill as if routing were uniform, k x its share of experts not
 * held, averaged over the MoE layers that lack some: k when whole layers
 * are missing, fewer when a profile's fill or the layer fill's last layer
 * holds part of one. */
static int32_t direct_start(const tdm_executor *x, int32_t pf)
{
    const int32_t E = x->hp->n_expert;
    const int32_t *res = tdm_expert_cache_residency(x->cache);
    int64_t lacking = 0, layers = 0;
    for (int32_t il = x->first_moe; il >= 0 && il <= x->last_moe; il++) {
        const tdm_layer *L = tdm_model_layer(x->m, il);
        if (L->ffn != TDM_FFN_MOE || !L->gate_exps.data)
            continue;
        int32_t missing = 0;
        for (int32_t e = 0; e < E; e++)
            missing += res[(size_t)il * E + e] < 0;
        lacking += missing;
        layers += missing > 0;
    }
    const double misses = layers ? (double)x->k * (double)lacking / ((double)E * (double)layers) : x->k;
    return (int32_t)lround((misses - pf) / 2.0);
}

tdm_status tdm_executor_new(const tdm_model *m, const tdm_executor_params *p, tdm_executor **out, tdm_error *err)
{
    *out = NULL;
    const tdm_hparams *hp = tdm_model_hparams(m);
    if (p->max_batch < 1 || p->n_ctx < 1 || p->dev_threads < 0 || p->n_threads < 0 || p->direct < -1)
        return tdm_error_set(err, TDM_ERR_INVALID,
                             "executor: bad parameters (max_batch %d, n_ctx %d, threads %d/%d, direct %d)",
                             p->max_batch, p->n_ctx, p->n_threads, p->dev_threads, p->direct);
    if (hp->n_expert < 1 || hp->n_expert_used < 1 || hp->n_expert_used > 64)
        return tdm_error_set(err, TDM_ERR_UNSUPPORTED, "executor: the model has %d experts, %d used (need 1..64 used)",
                             hp->n_expert, hp->n_expert_used);
    tdm_executor *x = calloc(1, sizeof *x);
    if (!x)
        return tdm_error_set(err, TDM_ERR_OOM, "executor: out of memory");
    x->m = m;
    x->hp = hp;
    x->dev_threads = p->dev_threads ? p->dev_threads : 1;
    x->learn = p->learn;
    x->max_batch = p->max_batch;
    x->k = hp->n_expert_used;
    x->first_moe = -1;
    x->direct_mode = p->direct;
    int64_t max_ff = 1;
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const tdm_layer *L = tdm_model_layer(m, il);
        if (L->ffn == TDM_FFN_MOE && L->gate_exps.data) {
            x->first_moe = x->first_moe < 0 ? il : x->first_moe;
            x->last_moe = il;
            max_ff = L->gate_exps.rows > max_ff ? L->gate_exps.rows : max_ff;
        }
    }
    const size_t nk = (size_t)p->max_batch * (size_t)x->k;
    x->hit = malloc(nk * sizeof *x->hit);
    x->dir = malloc(nk * sizeof *x->dir);
    x->log = malloc((size_t)hp->n_layer * nk * sizeof *x->log);
    x->logged = calloc((size_t)hp->n_layer, 1);
    tdm_status st = TDM_OK;
    if (!x->hit || !x->dir || !x->log || !x->logged)
        st = tdm_error_set(err, TDM_ERR_OOM, "executor: out of memory");
    if (!st)
        st = make_cache(x, p, err);
    if (!st)
        tdm_direct_tuner_init(&x->tuner, x->k, direct_start(x, p->prefetch > 0 ? p->prefetch : 0));
    if (!st) {
        /* experts named by slot (hits) or by id (the emulated direct share) */
        int32_t ns = tdm_expert_cache_n_slots(x->cache);
        ns = ns > hp->n_expert ? ns : hp->n_expert;
        st = tdm_experts_scratch_new(hp->n_embd, max_ff, p->max_batch, (int32_t)nk, ns, &x->ex, err);
    }
    if (!st) {
        tdm_pool_params pp = {.model = m, .topo = p->topo, .n_threads = p->n_threads, .max_tok = p->max_batch,
                              .mem_alloc = p->mem_alloc, .mem_free = p->mem_free, .mem_ctx = p->mem_ctx};
        st = tdm_pool_new(&pp, &x->pool, err);
    }
    if (st) {
        tdm_executor_free(x);
        return st;
    }
    tdm_pool_set_residency(x->pool, tdm_expert_cache_residency(x->cache));
    *out = x;
    return TDM_OK;
}

void tdm_executor_free(tdm_executor *x)
{
    if (!x)
        return;
    tdm_pool_free(x->pool);
    tdm_expert_cache_free(x->cache);
    tdm_experts_scratch_free(x->ex);
    free(x->hit);
    free(x->dir);
    free(x->log);
    free(x->logged);
    free(x);
}

void tdm_executor_attach(tdm_executor *x, tdm_forward *f) { tdm_forward_set_moe_backend(f, tdm_executor_moe, x); }

tdm_status tdm_executor_flush(tdm_executor *x, tdm_error *err)
{
    const int32_t L = x->hp->n_layer, k = x->k;
    const size_t nk = (size_t)x->max_batch * (size_t)k;
    tdm_status st = TDM_OK;
    for (int32_t t = 0; t < x->log_n && !st; t++)
        for (int32_t il = 0; il < L && !st; il++)
            if (x->logged[il]) {
                const int32_t *ids = x->log + (size_t)il * nk + (size_t)t * k;
                st = tdm_expert_cache_record(x->cache, x->token + t, il, ids, k, err);
                if (!st && x->learn)
                    st = tdm_profile_record(x->learn, il, k, ids, NULL, err);
            }
    if (!st && x->learn)
        tdm_profile_add_tokens(x->learn, (uint64_t)x->log_n);
    x->token += x->log_n;
    x->log_n = 0;
    memset(x->logged, 0, (size_t)L);
    return st;
}

/* The emulated device side on its own small team: the hits from the arena,
 * then the direct share from the model's own copy of the experts. */
static tdm_status device_side(tdm_executor *x, int32_t layer, const float *in, int32_t n, int32_t nh, int32_t nd,
                              float *out, tdm_error *err)
{
    if (nh == 0)
        memset(out, 0, (size_t)n * (size_t)x->hp->n_embd * sizeof(float));
    if (nh == 0 && nd == 0)
        return TDM_OK;
    const int saved = omp_get_max_threads();
    omp_set_num_threads(x->dev_threads);
    tdm_status st = TDM_OK;
    if (nh) {
        tdm_experts_desc d = tdm_expert_cache_desc(x->cache, layer);
        st = tdm_experts_run(&d, in, n, x->hit, nh, out, false, x->ex, err);
    }
    if (!st && nd) {
        tdm_experts_desc d = tdm_pool_layer_desc(tdm_model_layer(x->m, layer));
        st = tdm_experts_run(&d, in, n, x->dir, nd, out, true, x->ex, err);
    }
    omp_set_num_threads(saved);
    return st;
}

/* Expert weight bytes of one selection of layer il. */
static uint64_t expert_bytes(const tdm_executor *x, int32_t il)
{
    const tdm_layer *L = tdm_model_layer(x->m, il);
    return (uint64_t)(L->gate_exps.mat_bytes + L->up_exps.mat_bytes + L->down_exps.mat_bytes);
}

/* Counts one layer's resolved selections and logs its routing for the policy. */
static void log_layer(tdm_executor *x, int32_t layer, const int32_t *ids, int32_t n, int64_t nh, int64_t nm)
{
    const int32_t k = x->k;
    tdm_expert_cache_count(x->cache, layer, nh, nm);
    x->st.layers++;
    x->st.hits += nh;
    x->st.misses += nm;
    memcpy(x->log + (size_t)layer * x->max_batch * k, ids, (size_t)n * k * sizeof *ids);
    x->logged[layer] = 1;
    x->log_n = n;
}

tdm_status tdm_executor_moe(void *user, int32_t layer, const float *in, int32_t n, int32_t k, const int32_t *ids,
                            const float *weights, float *out, tdm_error *err)
{
    tdm_executor *x = user;
    const tdm_hparams *hp = x->hp;
    const int32_t E = hp->n_expert;
    if (layer < 0 || layer >= hp->n_layer || n < 1 || n > x->max_batch || k != x->k)
        return tdm_error_set(err, TDM_ERR_INVALID, "executor: layer %d, %d tokens (max %d), k %d (model %d)", layer, n,
                             x->max_batch, k, x->k);
    tdm_status st;
    if (layer == x->first_moe) {
        if (x->log_n && (st = tdm_executor_flush(x, err))) /* a pass that stopped early */
            return st;
        x->st.tokens += n;
    }
    const int32_t *res = tdm_expert_cache_residency(x->cache);
    const bool any_slot = tdm_expert_cache_n_slots(x->cache) > 0;
    const int32_t q = x->direct_mode > 0 ? x->direct_mode : 0; /* the emulation takes a fixed share only */
    int32_t nh = 0, nm = 0, nd = 0;
    for (int32_t i = 0; i < n * k; i++) {
        const int32_t e = ids[i];
        if (e < 0 || e >= E)
            return tdm_error_set(err, TDM_ERR_INVALID, "executor: layer %d: expert id %d out of range", layer, e);
        const int32_t slot = any_slot ? res[(size_t)layer * E + e] : -1;
        if (slot >= 0)
            x->hit[nh++] = (tdm_expert_sel){i / k, slot, weights[i]};
        else if (nm++ < q)
            x->dir[nd++] = (tdm_expert_sel){i / k, e, weights[i]};
    }
    uint32_t seq = 0;
    tdm_mailbox *mb = tdm_pool_mailbox(x->pool);
    const size_t xb = (size_t)n * (size_t)hp->n_embd * sizeof(float);
    const bool publish = nm > nd;
    if (publish) { /* what the GPU's publish kernel writes to mapped memory */
        mb->layer = layer;
        mb->n_tok = n;
        mb->direct = nd;
        memcpy(mb->ids, ids, (size_t)n * k * sizeof *ids);
        memcpy(mb->weights, weights, (size_t)n * k * sizeof *weights);
        memcpy(mb->x, in, xb);
        seq = tdm_pool_publish(x->pool);
        x->st.pool_wakes++;
    }
    const double t0 = now_ms();
    st = device_side(x, layer, in, n, nh, nd, out, err);
    x->st.dev_ms += now_ms() - t0;
    x->st.direct += nd;
    x->st.direct_bytes += (uint64_t)nd * expert_bytes(x, layer);
    if (publish) { /* wait even after a device error: the pool still owns the mailbox */
        tdm_error perr = {0};
        tdm_status pst = tdm_pool_wait(x->pool, seq, &x->st.wait_ms, &perr);
        if (!st && pst)
            st = tdm_error_set(err, pst, "%s", perr.msg);
        if (!st)
            for (size_t i = 0; i < (size_t)n * (size_t)hp->n_embd; i++)
                out[i] += mb->out[i];
    }
    if (st)
        return st;
    log_layer(x, layer, ids, n, nh, nm);
    /* the pass is done: policy and slot copies now, before the next token */
    return layer == x->last_moe ? tdm_executor_flush(x, err) : TDM_OK;
}

tdm_status tdm_executor_gpu_begin(tdm_executor *x, uint64_t *version, tdm_error *err)
{
    x->gpu = true;
    tdm_status st = tdm_pool_check(x->pool, err);
    if (!st)
        st = tdm_expert_cache_settle(x->cache, false, err);
    *version = tdm_expert_cache_version(x->cache);
    tdm_pool_kick(x->pool);
    return st;
}

/* Phases: the share (0), share + 1 (1), share - 1 (2), the share again (3). */
enum { TUNER_AGAIN = 3, TUNER_SETTLED = 4 };

void tdm_direct_tuner_init(tdm_direct_tuner *t, int32_t k, int32_t start)
{
    start = start < 0 ? 0 : start > k ? k : start;
    *t = (tdm_direct_tuner){.q = start, .q_max = k, .center = start, .settle = TDM_DIRECT_SETTLE};
}

/* The share probe phase ph measures. */
static int32_t probed(const tdm_direct_tuner *t, int32_t ph) { return t->center + (ph == 1) - (ph == 2); }

/* After the probe's last window: the neighbour whose time beats the share's
 * window after them by the margin, if any (none measured: the share stays);
 * a probe that keeps the share after a stay doubles the next stay. */
static int32_t decide(tdm_direct_tuner *t)
{
    int32_t best = 0;
    double bar = t->ms[TUNER_AGAIN] * (1.0 - TDM_DIRECT_MARGIN); /* what a neighbour must beat */
    for (int32_t i = 1; i < 3; i++)
        if (t->ms[i] > 0 && t->ms[i] < bar) {
            best = i;
            bar = t->ms[i];
        }
    t->q = t->center = probed(t, best);
    t->phase = best == 0 ? TUNER_SETTLED : 0; /* moved: measure around the new share */
    if (best)
        t->settle = TDM_DIRECT_SETTLE;
    else if (t->settled) /* the probe followed a stay */
        t->settle = 2 * t->settle < TDM_DIRECT_SETTLE_MAX ? 2 * t->settle : TDM_DIRECT_SETTLE_MAX;
    t->settled = 0;
    return t->q;
}

int32_t tdm_direct_tuner_step(tdm_direct_tuner *t, double ms_per_token)
{
    t->sum += ms_per_token;
    if (++t->n < TDM_DIRECT_WINDOW)
        return t->q;
    const double mean = t->sum / t->n;
    t->n = 0;
    t->sum = 0;
    if (t->phase == TUNER_SETTLED) {
        if (++t->settled < t->settle)
            return t->q;
        t->phase = 0; /* this window measured the share: probe its neighbours */
    }
    if (t->phase == 0)
        t->ms[1] = t->ms[2] = t->ms[TUNER_AGAIN] = 0;
    t->ms[t->phase] = mean;
    int32_t ph = t->phase + 1;
    while (ph < TUNER_AGAIN && (probed(t, ph) < 0 || probed(t, ph) > t->q_max))
        ph++;
    if (ph == TUNER_AGAIN && t->ms[1] == 0 && t->ms[2] == 0)
        ph = TUNER_SETTLED; /* no neighbour to compare with */
    if (ph > TUNER_AGAIN)
        return decide(t);
    t->phase = ph;
    return t->q = probed(t, ph);
}

int32_t tdm_executor_direct_quota(const tdm_executor *x)
{
    return x->direct_mode > 0 ? x->direct_mode : x->direct_mode < 0 ? x->tuner.q : 0;
}

/* Of layer il's selections li [n*k] that miss the cache, those staged
 * [n_staged] holds; *n_stage: how many experts it holds. */
static int64_t prefetch_served(const int32_t *res, bool any_slot, size_t E, int32_t il, const int32_t *li, int32_t nk,
                               const int32_t *staged, int32_t n_staged, int64_t *n_stage)
{
    int64_t np = 0;
    *n_stage = 0;
    for (int32_t j = 0; j < n_staged; j++) {
        const int32_t e = staged[j];
        if (e < 0)
            continue;
        ++*n_stage;
        for (int32_t i = 0; i < nk; i++)
            np += li[i] == e && !(any_slot && res[(size_t)il * E + e] >= 0);
    }
    return np;
}

tdm_status tdm_executor_gpu_end(tdm_executor *x, const int32_t *ids, size_t layer_stride, int32_t n, double dev_ms,
                                double wait_ms, int32_t direct, const int32_t *staged, int32_t n_staged,
                                tdm_error *err)
{
    const tdm_hparams *hp = x->hp;
    const int32_t E = hp->n_expert, k = x->k;
    if (n < 1 || n > x->max_batch)
        return tdm_error_set(err, TDM_ERR_INVALID, "executor: a GPU pass of %d tokens (max %d)", n, x->max_batch);
    tdm_status st = tdm_pool_check(x->pool, err);
    if (st)
        return st;
    const int32_t *res = tdm_expert_cache_residency(x->cache);
    const bool any_slot = tdm_expert_cache_n_slots(x->cache) > 0;
    int64_t step_misses = 0;
    for (int32_t il = x->first_moe; il >= 0 && il <= x->last_moe; il++) {
        const tdm_layer *L = tdm_model_layer(x->m, il);
        if (L->ffn != TDM_FFN_MOE || !L->gate_exps.data)
            continue;
        const int32_t *li = ids + (size_t)il * layer_stride;
        int64_t nh = 0;
        for (int32_t i = 0; i < n * k; i++) {
            if (li[i] < 0 || li[i] >= E)
                return tdm_error_set(err, TDM_ERR_INVALID, "executor: layer %d: expert id %d out of range", il, li[i]);
            nh += any_slot && res[(size_t)il * E + li[i]] >= 0;
        }
        int64_t ns = 0;
        const int64_t nm = (int64_t)n * k - nh,
                      np = staged ? prefetch_served(res, any_slot, (size_t)E, il, li, n * k,
                                                    staged + (size_t)il * n_staged, n_staged, &ns) : 0,
                      nd = direct > 0 ? (nm - np < direct ? nm - np : direct) : 0;
        step_misses += nm;
        x->st.prefetched += np;
        x->st.prefetched_bytes += (uint64_t)np * expert_bytes(x, il);
        x->st.prefetch_staged += ns;
        x->st.prefetch_bytes += (uint64_t)ns * expert_bytes(x, il);
        x->st.direct += nd;
        x->st.direct_bytes += (uint64_t)nd * expert_bytes(x, il);
        log_layer(x, il, li, n, nh, nm);
    }
    x->st.tokens += n;
    x->st.dev_ms += dev_ms;
    x->st.wait_ms += wait_ms;
    if (x->direct_mode < 0 && direct >= 0 && step_misses > 0)
        tdm_direct_tuner_step(&x->tuner, dev_ms / n);
    return tdm_executor_flush(x, err);
}

void tdm_executor_gpu_streamed(tdm_executor *x, int64_t layers, uint64_t bytes)
{
    x->st.streamed_layers += layers;
    x->st.stream_bytes += bytes;
}

void tdm_executor_get_stats(const tdm_executor *x, tdm_executor_stats *out)
{
    *out = x->st;
    tdm_pool_stats ps;
    tdm_pool_get_stats(x->pool, &ps);
    out->pool_ms = ps.ms;
    out->pool_bytes = ps.bytes;
    out->warms = ps.warms;
    out->warm_cut = ps.warm_cut;
    out->warm_bytes = ps.warm_bytes;
    tdm_expert_cache_stats cs;
    tdm_expert_cache_get_stats(x->cache, &cs);
    out->swaps = cs.swaps;
    out->bytes_moved = cs.bytes_moved;
    out->loans = cs.loans;
    out->bytes_reclaimed = cs.bytes_reclaimed;
    out->n_slots = tdm_expert_cache_n_slots(x->cache);
    out->slot_bytes = tdm_expert_cache_slot_bytes(x->cache);
    out->pool_threads = tdm_pool_threads(x->pool);
    out->direct_quota = x->gpu || x->direct_mode > 0 ? tdm_executor_direct_quota(x) : 0; /* the emulation adapts none */
    if (x->gpu)
        out->pool_wakes = ps.jobs;
}

void tdm_executor_format_stats(const tdm_executor *x, char *buf, size_t cap)
{
    tdm_executor_stats s;
    tdm_executor_get_stats(x, &s);
    const double nt = s.tokens > 0 ? (double)s.tokens : 1.0, sel = (double)(s.hits + s.misses);
    char stream[96], direct[128] = "", prefetch[128] = "", warm[96] = "", loan[96] = "";
    snprintf(stream, sizeof stream, " | prompt streaming: %lld layer calls, %.2f MB sent", (long long)s.streamed_layers,
             (double)s.stream_bytes / 1e6);
    if (s.direct || x->direct_mode > 0 || (x->gpu && x->direct_mode < 0))
        snprintf(direct, sizeof direct, " | direct %lld misses (%.1f%%), %.2f MB/token, share %d%s",
                 (long long)s.direct, s.misses > 0 ? 100.0 * (double)s.direct / (double)s.misses : 0.0,
                 (double)s.direct_bytes / 1e6 / nt, s.direct_quota, x->direct_mode < 0 ? " (adapted)" : "");
    if (s.prefetch_staged)
        snprintf(prefetch, sizeof prefetch, " | prefetch %lld misses (%.1f%%), %.1f%% of %.2f MB/token used",
                 (long long)s.prefetched, s.misses > 0 ? 100.0 * (double)s.prefetched / (double)s.misses : 0.0,
                 100.0 * (double)s.prefetched / (double)s.prefetch_staged, (double)s.prefetch_bytes / 1e6 / nt);
    if (s.warms)
        snprintf(warm, sizeof warm, " | pool warm-up %.2f MB/token, %.1f%% cut short", (double)s.warm_bytes / 1e6 / nt,
                 100.0 * (double)s.warm_cut / (double)s.warms);
    if (s.loans)
        snprintf(loan, sizeof loan, " | %lld prompts borrowed slots, %.2f MB copied back", (long long)s.loans,
                 (double)s.bytes_reclaimed / 1e6);
    snprintf(buf, cap,
             "hybrid (%s): %d slots x %.2f MiB | hit rate %.1f%% (%lld/%lld) | pool %d threads, woken %lld/%lld "
             "layers, %.3f ms/token, %.2f MB/token, %.2f GB/s | wait %.3f ms/token | device %.3f ms/token | "
             "swaps %lld (%.2f MB moved)%s%s%s%s%s",
             x->gpu ? "GPU" : "emulated", s.n_slots, (double)s.slot_bytes / 1048576.0, sel > 0 ? 100.0 * (double)s.hits / sel : 0.0,
             (long long)s.hits, (long long)(s.hits + s.misses), s.pool_threads, (long long)s.pool_wakes,
             (long long)s.layers, s.pool_ms / nt, (double)s.pool_bytes / 1e6 / nt,
             s.pool_ms > 0 ? (double)s.pool_bytes / 1e6 / s.pool_ms : 0.0, s.wait_ms / nt, s.dev_ms / nt,
             (long long)s.swaps, (double)s.bytes_moved / 1e6, direct, prefetch, warm, x->gpu ? stream : "", loan);
}

tdm_expert_cache *tdm_executor_cache(tdm_executor *x) { return x->cache; }
tdm_pool *tdm_executor_pool(tdm_executor *x) { return x->pool; }
