/* test_executor: the emulated hybrid path (expert cache + CPU pool through the
 * forward's MoE backend) against the plain CPU forward on every fixture, with
 * the cache at 0%, ~50% and 100% of the experts, the pool on 1 thread and on
 * all cores, a budget that leaves no slot, adaptive swaps between tokens, and
 * a direct share (the device side computing some misses from the model's own
 * expert memory, the pool the rest); the share's tuner on its own. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "executor.h"
#include "forward.h"
#include "model_fixtures.h"
#include "topology.h"

#define N_PROMPT 5
#define N_DECODE 3
#define WATCHDOG_S 300

typedef struct hitcheck {
    tdm_executor *x;
    const tdm_hparams *hp;
    int64_t *hits, *misses; /* [n_layer] expected from the residency table */
} hitcheck;

/* Route hook: runs right before the backend of the same layer, so the
 * residency it sees is the one the executor splits with. */
static void count_route(void *user, int32_t pos, int32_t layer, int32_t k, const int32_t *experts,
                        const float *weights)
{
    (void)pos;
    (void)weights;
    hitcheck *h = user;
    for (int32_t i = 0; i < k; i++) {
        if (tdm_expert_cache_slot(tdm_executor_cache(h->x), layer, experts[i]) >= 0)
            h->hits[layer]++;
        else
            h->misses[layer]++;
    }
}

static double rel_l2(const float *a, const float *b, size_t n)
{
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        r += (double)b[i] * b[i];
    }
    return sqrt(d / (r > 0 ? r : 1));
}

typedef struct run_cfg {
    double frac;        /* slots as a fraction of n_layer * n_expert; < 0: use gpu_mem */
    uint64_t gpu_mem;
    int policy;         /* -1 default */
    int pool_threads;   /* 0: physical cores minus one; -1: all physical cores */
    int32_t adapt_every;
    int n_decode;
    int32_t direct;     /* params.direct; 0 here means the default (-1: none in the emulation) */
} run_cfg;

/* Prompt batch + n_decode single tokens through both paths; returns the
 * worst relative L2 and fills the executor's stats. */
static double run_pair(const char *path, const run_cfg *cfg, tdm_executor_stats *es, tdm_pool_stats *ps)
{
    tdm_error err = {0};
    tdm_model *m;
    tdm_status st = tdm_model_load(path, &m, &err);
    if (st)
        fprintf(stderr, "%s: %s\n", path, err.msg);
    assert_int_equal(st, TDM_OK);
    const tdm_hparams *hp = tdm_model_hparams(m);
    const int32_t n_ctx = 32, B = 8, V = hp->n_vocab;
    tdm_topology *topo = NULL;
    assert_int_equal(tdm_topology_load(&topo, &err), TDM_OK);
    tdm_forward *f0, *f1;
    assert_int_equal(tdm_forward_new(m, n_ctx, B, &f0, &err), TDM_OK);
    assert_int_equal(tdm_forward_new(m, n_ctx, B, &f1, &err), TDM_OK);
    tdm_executor_params p;
    tdm_executor_params_init(&p);
    p.n_ctx = n_ctx;
    p.max_batch = B;
    p.topo = topo;
    if (cfg->pool_threads < 0) /* every physical core */
        p.n_threads = tdm_topology_physical_cores(topo);
    else
        p.n_threads = cfg->pool_threads;
    p.policy = cfg->policy;
    p.adapt_every = cfg->adapt_every;
    if (cfg->direct)
        p.direct = cfg->direct;
    p.per_layer = true; /* ~50% then means about half the experts of every layer */
    if (cfg->frac >= 0)
        p.n_slots = (int32_t)lround(cfg->frac * hp->n_layer * hp->n_expert);
    else
        p.gpu_mem = cfg->gpu_mem;
    tdm_executor *x;
    st = tdm_executor_new(m, &p, &x, &err);
    if (st)
        fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(st, TDM_OK);
    tdm_executor_attach(x, f1);
    hitcheck h = {x, hp, calloc((size_t)hp->n_layer, 8), calloc((size_t)hp->n_layer, 8)};
    tdm_forward_set_route_hook(f1, count_route, &h);
    float *l0 = malloc((size_t)N_PROMPT * V * sizeof(float)), *l1 = malloc((size_t)N_PROMPT * V * sizeof(float));
    int32_t tok[N_PROMPT + 16];
    for (int i = 0; i < N_PROMPT + cfg->n_decode; i++)
        tok[i] = (int32_t)((i * 7919 + 13) % V);
    assert_int_equal(tdm_forward_eval(f0, tok, N_PROMPT, 0, l0, true, &err), TDM_OK);
    st = tdm_forward_eval(f1, tok, N_PROMPT, 0, l1, true, &err);
    if (st)
        fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(st, TDM_OK);
    double worst = rel_l2(l1, l0, (size_t)N_PROMPT * V);
    for (int i = 0; i < cfg->n_decode; i++) {
        const int32_t pos = N_PROMPT + i;
        assert_int_equal(tdm_forward_eval(f0, tok + pos, 1, pos, l0, false, &err), TDM_OK);
        assert_int_equal(tdm_forward_eval(f1, tok + pos, 1, pos, l1, false, &err), TDM_OK);
        double r = rel_l2(l1, l0, (size_t)V);
        worst = r > worst ? r : worst;
    }
    assert_int_equal(tdm_executor_flush(x, &err), TDM_OK);
    tdm_executor_get_stats(x, es);
    tdm_pool_get_stats(tdm_executor_pool(x), ps);
    /* counters = the residency table's verdicts, layer by layer */
    for (int32_t il = 0; il < hp->n_layer; il++) {
        assert_int_equal(tdm_expert_cache_layer_hits(tdm_executor_cache(x), il), h.hits[il]);
        assert_int_equal(tdm_expert_cache_layer_misses(tdm_executor_cache(x), il), h.misses[il]);
    }
    char line[512];
    tdm_executor_format_stats(x, line, sizeof line);
    printf("  %s: max rel L2 %.3g | %s\n", strrchr(path, '/') + 1, worst, line);
    free(h.hits);
    free(h.misses);
    free(l0);
    free(l1);
    tdm_executor_free(x);
    tdm_forward_free(f0);
    tdm_forward_free(f1);
    tdm_topology_free(topo);
    tdm_model_free(m);
    return worst;
}

static int n_paths(char paths[][1200])
{
    static const char *const micro[] = {"micro-qwen3moe", "micro-qwen3next", "micro-qwen35moe"};
    int n = 0;
    for (int i = 0; i < 3; i++) {
        char d[1024];
        fx_dir(d, sizeof d, micro[i], 0);
        snprintf(paths[n++], 1200, "%s/%s-f32.gguf", d, micro[i]);
    }
    char d[1024];
    fx_dir(d, sizeof d, "small-qwen35moe", 0);
    snprintf(paths[n++], 1200, "%s/small-qwen35moe-Q4_K_M.gguf", d);
    snprintf(paths[n], 1200, "%s/models/demo/demo-Q4_K_M.gguf", fx_root());
    if (!fx_exists(paths[n]))
        fail_msg("demo model (shipped in the repository) missing: %s", paths[n]);
    return n + 1;
}

static void check_fraction(double frac, int pool_threads)
{
    alarm(WATCHDOG_S);
    char paths[5][1200];
    int n = n_paths(paths);
    for (int i = 0; i < n; i++) {
        run_cfg c = {.frac = frac, .policy = -1, .pool_threads = pool_threads, .n_decode = N_DECODE};
        tdm_executor_stats es;
        tdm_pool_stats ps;
        double r = run_pair(paths[i], &c, &es, &ps);
        assert_true(r <= 1e-5);
        assert_true(es.hits + es.misses > 0);
        assert_int_equal(es.tokens, N_PROMPT + N_DECODE);
        if (frac >= 1.0) { /* everything resident: the pool is never woken */
            assert_int_equal(es.misses, 0);
            assert_int_equal(es.pool_wakes, 0);
            assert_int_equal(ps.jobs, 0);
        } else if (frac <= 0.0) {
            assert_int_equal(es.hits, 0);
            assert_int_equal(ps.jobs, es.layers);
        } else {
            assert_true(es.hits > 0 && es.misses > 0);
            assert_int_equal(ps.jobs, es.pool_wakes);
        }
        assert_int_equal(ps.misses, es.misses);
    }
    alarm(0);
}

/* The device side takes the first `direct` misses of every layer call from
 * the model's expert memory; the pool computes the others (or, when the share
 * covers every miss, is never woken). */
static void check_direct(double frac, int32_t direct)
{
    alarm(WATCHDOG_S);
    char paths[5][1200];
    int n = n_paths(paths);
    for (int i = 0; i < n; i++) {
        run_cfg c = {.frac = frac, .policy = -1, .pool_threads = 1, .n_decode = N_DECODE, .direct = direct};
        tdm_executor_stats es;
        tdm_pool_stats ps;
        double r = run_pair(paths[i], &c, &es, &ps);
        assert_true(r <= 1e-5);
        assert_true(es.misses > 0 && es.direct > 0 && es.direct_bytes > 0);
        assert_int_equal(es.direct_quota, direct);
        assert_int_equal(ps.misses + es.direct, es.misses); /* every miss computed once */
        if (direct >= 1000) {
            assert_int_equal(es.direct, es.misses);
            assert_int_equal(ps.jobs, 0);
        } else {
            assert_true(es.direct <= (int64_t)direct * es.layers);
            assert_true(ps.jobs > 0);
        }
    }
    alarm(0);
}

static void test_direct_share(void **state) { (void)state; check_direct(0.5, 2); }
static void test_direct_no_cache(void **state) { (void)state; check_direct(0.0, 3); }
static void test_direct_all(void **state) { (void)state; check_direct(0.5, 1000); }

/* The adapting share: step times whose best share is `best` (each share
 * away from it costs 1 ms, `bump` ms more right beside it: a sharp optimum);
 * from `start` the tuner must reach it and then spend at least 80% of the
 * windows there and the rest (its probes) within one. */
static int32_t tune_towards(tdm_direct_tuner *t, int32_t best, double bump, int windows)
{
    const int32_t k = t->q_max;
    int32_t q = t->q, at = 0, seen = 0;
    for (int step = 0; step < windows * TDM_DIRECT_WINDOW; step++) {
        const int32_t d = abs(q - best);
        q = tdm_direct_tuner_step(t, 10.0 + d + (d ? bump : 0.0));
        assert_true(q >= 0 && q <= k);
        if (step >= (windows - 36) * TDM_DIRECT_WINDOW && (step + 1) % TDM_DIRECT_WINDOW == 0) { /* reached */
            assert_true(abs(q - best) <= 1);
            at += q == best;
            seen++;
        }
    }
    assert_true(at * 5 >= seen * 4);
    return q;
}

static void tune_from(int32_t k, int32_t start, int32_t best, double bump)
{
    tdm_direct_tuner t;
    tdm_direct_tuner_init(&t, k, start);
    assert_int_equal(t.q, start < 0 ? 0 : start > k ? k : start);
    tune_towards(&t, best, bump, 80);
}

/* A tuner from share 3 of 8 after one probe whose four windows (the share,
 * share + 1, share - 1, the share again) read ms[]: the share it settles on. */
static int32_t probe_once(tdm_direct_tuner *t, const double ms[4])
{
    tdm_direct_tuner_init(t, 8, 3);
    for (int w = 0; w < 4; w++)
        for (int i = 0; i < TDM_DIRECT_WINDOW; i++)
            tdm_direct_tuner_step(t, ms[w]);
    assert_int_equal(t->center, t->q);
    return t->q;
}

static void test_direct_tuner(void **state)
{
    (void)state;
    tune_from(8, 4, 6, 0.0);
    tune_from(8, 4, 1, 0.0);
    tune_from(8, 3, 0, 0.0);
    tune_from(8, 4, 8, 0.0);
    tune_from(8, 3, 3, 1.5); /* a sharp optimum at the start */
    tune_from(8, 9, 5, 1.5); /* start clamped to k */
    tune_from(8, -2, 2, 0.0);
    tune_from(1, 0, 0, 0.0);
    tune_from(0, 0, 0, 0.0);
    /* a change of load is followed within a settle period and a probe or two */
    tdm_direct_tuner t;
    tdm_direct_tuner_init(&t, 8, 4);
    assert_int_equal(tune_towards(&t, 6, 0.5, 60), 6);
    tune_towards(&t, 2, 0.5, 36 + (t.settle - t.settled) + 20);
    /* neighbours less than the margin faster never take over */
    tdm_direct_tuner_init(&t, 8, 3);
    for (int step = 0; step < 40 * TDM_DIRECT_WINDOW; step++) {
        const int32_t q = t.q;
        const int32_t next = tdm_direct_tuner_step(&t, q == 3 ? 10.0 : 10.0 * (1.0 - TDM_DIRECT_MARGIN / 2));
        assert_true(abs(next - 3) <= 1);
        assert_int_equal(t.center, 3);
    }
    /* the neighbours are compared with the share's window after them: a slow
     * first window (a prompt's aftermath) lets no slower neighbour win, and a
     * fast one keeps no slower share */
    const double slow_lead[4] = {15.0, 11.0, 11.5, 10.0}; /* share 3, 4, 2, 3 again */
    const double fast_lead[4] = {9.0, 10.5, 9.5, 10.0};
    assert_int_equal(probe_once(&t, fast_lead), 2);
    assert_int_equal(probe_once(&t, slow_lead), 3);
    /* each probe after a stay that keeps the share doubles the next stay, up
     * to the longest: at a sharp optimum, windows off it only while probing */
    int32_t off = 0, probes = 0;
    for (int w = 0; w < 2000; w++) {
        const int32_t q0 = t.q;
        for (int i = 0; i < TDM_DIRECT_WINDOW; i++)
            tdm_direct_tuner_step(&t, t.q == 3 ? 10.0 : 11.0);
        off += t.q != 3;
        probes += q0 == 3 && t.q == 4; /* a stay ended: its last window, then share + 1 */
    }
    assert_int_equal(t.settle, TDM_DIRECT_SETTLE_MAX);
    /* a stay of the longest and a probe's three windows beside and after it */
    assert_true(probes >= 2000 / (TDM_DIRECT_SETTLE_MAX + 3) && probes <= 2000 / (TDM_DIRECT_SETTLE_MAX + 3) + 3);
    assert_int_equal(off, 2 * probes);
    /* a window only moves the share when it is full; the probe goes up first */
    tdm_direct_tuner_init(&t, 8, 4);
    for (int i = 0; i < TDM_DIRECT_WINDOW - 1; i++)
        assert_int_equal(tdm_direct_tuner_step(&t, 5.0), 4);
    assert_int_equal(tdm_direct_tuner_step(&t, 5.0), 5);
}

static void test_cache_0(void **state) { (void)state; check_fraction(0.0, 1); }
static void test_cache_50(void **state) { (void)state; check_fraction(0.5, 1); }
static void test_cache_100(void **state) { (void)state; check_fraction(1.0, 1); }
static void test_cache_50_all_cores(void **state) { (void)state; check_fraction(0.5, -1); }

/* A budget that covers the fixed part but not one slot: 0 slots, all misses. */
static void test_budget_no_slot(void **state)
{
    (void)state;
    alarm(WATCHDOG_S);
    char d[1024], path[1200];
    fx_dir(d, sizeof d, "micro-qwen35moe", 0);
    snprintf(path, sizeof path, "%s/micro-qwen35moe-f32.gguf", d);
    tdm_model *m;
    tdm_error err = {0};
    assert_int_equal(tdm_model_load(path, &m, &err), TDM_OK);
    tdm_budget b;
    assert_int_equal(tdm_budget_plan(m, 32, 8, UINT64_MAX / 4, &b, &err), TDM_OK);
    const uint64_t mem = b.fixed_bytes + b.in.slot_bytes / 2;
    assert_int_equal(tdm_budget_plan(m, 32, 8, mem, &b, &err), TDM_OK);
    assert_int_equal(b.n_slots, 0);
    tdm_model_free(m);
    run_cfg c = {.frac = -1, .gpu_mem = mem, .policy = -1, .pool_threads = 1, .n_decode = N_DECODE};
    tdm_executor_stats es;
    tdm_pool_stats ps;
    assert_true(run_pair(path, &c, &es, &ps) <= 1e-5);
    assert_int_equal(es.n_slots, 0);
    assert_int_equal(es.hits, 0);
    /* one byte short of the fixed part: refused */
    tdm_executor_params p;
    tdm_executor_params_init(&p);
    p.n_ctx = 32;
    p.max_batch = 8;
    p.gpu_mem = b.fixed_bytes - 1;
    tdm_executor *x = NULL;
    assert_int_equal(tdm_model_load(path, &m, &err), TDM_OK);
    assert_int_equal(tdm_executor_new(m, &p, &x, &err), TDM_ERR_OOM);
    assert_null(x);
    assert_non_null(strstr(err.msg, "before any expert slot"));
    tdm_model_free(m);
    alarm(0);
}

/* The adapted direct share starts at half the misses the prefetch leaves in
 * a layer that misses, counted from the fill: demo (8 layers x 24 experts,
 * top-4) under the layer fill with 144 slots (6 full layers, 2 empty: 4
 * misses), 160 (6 full, one with 16 of 24, one empty: 2.67) and 190 (7
 * full, one with 22: 0.33). */
static void test_direct_start(void **state)
{
    (void)state;
    alarm(WATCHDOG_S);
    char paths[5][1200];
    const char *demo = paths[n_paths(paths) - 1];
    tdm_model *m;
    tdm_error err = {0};
    assert_int_equal(tdm_model_load(demo, &m, &err), TDM_OK);
    const tdm_hparams *hp = tdm_model_hparams(m);
    assert_true(hp->n_layer == 8 && hp->n_expert == 24 && hp->n_expert_used == 4);
    static const struct { int slots, prefetch, start; } cases[] = {
        {144, 2, 1}, {144, 0, 2}, {160, 2, 0}, {160, 0, 1}, {190, 2, 0}, {190, 0, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tdm_executor_params p;
        tdm_executor_params_init(&p);
        p.n_ctx = 32;
        p.max_batch = 8;
        p.n_threads = 1;
        p.n_slots = cases[i].slots;
        p.policy = TDM_CACHE_LAYER;
        p.prefetch = cases[i].prefetch;
        p.direct = -1;
        tdm_executor *x = NULL;
        assert_int_equal(tdm_executor_new(m, &p, &x, &err), TDM_OK);
        assert_int_equal(tdm_executor_direct_quota(x), cases[i].start);
        tdm_executor_free(x);
    }
    tdm_model_free(m);
    alarm(0);
}

/* Adaptive swaps run between tokens: results stay identical, bytes move. */
static void test_adaptive_swaps(void **state)
{
    (void)state;
    alarm(WATCHDOG_S);
    char d[1024], path[1200];
    const char *names[] = {"micro-qwen3moe", "micro-qwen35moe"};
    for (int i = 0; i < 2; i++) {
        fx_dir(d, sizeof d, names[i], 0);
        snprintf(path, sizeof path, "%s/%s-f32.gguf", d, names[i]);
        run_cfg c = {.frac = 0.25, .policy = TDM_CACHE_ADAPTIVE, .pool_threads = 1, .adapt_every = 1, .n_decode = 12};
        tdm_executor_stats es;
        tdm_pool_stats ps;
        assert_true(run_pair(path, &c, &es, &ps) <= 1e-5);
        assert_true(es.swaps > 0);
        assert_int_equal(es.bytes_moved, (uint64_t)es.swaps * es.slot_bytes);
        /* the lru policy changes the residency after every pass */
        c.policy = TDM_CACHE_LRU;
        assert_true(run_pair(path, &c, &es, &ps) <= 1e-5);
        assert_true(es.swaps > 0);
    }
    alarm(0);
}

static void test_bad_input(void **state)
{
    (void)state;
    alarm(WATCHDOG_S);
    char d[1024], path[1200];
    fx_dir(d, sizeof d, "micro-qwen3moe", 0);
    snprintf(path, sizeof path, "%s/micro-qwen3moe-f32.gguf", d);
    tdm_model *m;
    tdm_error err = {0};
    assert_int_equal(tdm_model_load(path, &m, &err), TDM_OK);
    const tdm_hparams *hp = tdm_model_hparams(m);
    tdm_executor_params p;
    tdm_executor_params_init(&p);
    p.max_batch = 2;
    p.n_ctx = 8;
    tdm_executor *x = NULL;
    assert_int_equal(tdm_executor_new(m, &p, &x, &err), TDM_ERR_INVALID); /* neither n_slots nor gpu_mem */
    p.n_slots = 3;
    p.policy = TDM_CACHE_STATIC; /* needs a profile */
    assert_int_equal(tdm_executor_new(m, &p, &x, &err), TDM_ERR_INVALID);
    p.policy = -1;
    p.direct = -2; /* neither adapted, off nor a count */
    assert_int_equal(tdm_executor_new(m, &p, &x, &err), TDM_ERR_INVALID);
    p.direct = -1;
    assert_int_equal(tdm_executor_new(m, &p, &x, &err), TDM_OK);
    const int32_t k = hp->n_expert_used;
    float *in = calloc((size_t)hp->n_embd * 3, sizeof(float)), *out = calloc((size_t)hp->n_embd * 3, sizeof(float));
    int32_t ids[3 * 64];
    float w[3 * 64];
    for (int i = 0; i < 3 * k; i++) {
        ids[i] = i % k;
        w[i] = 1.0f / k;
    }
    ids[1] = hp->n_expert; /* out of range */
    assert_int_equal(tdm_executor_moe(x, 0, in, 1, k, ids, w, out, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.msg, "out of range"));
    ids[1] = 1;
    assert_int_equal(tdm_executor_moe(x, 0, in, 3, k, ids, w, out, &err), TDM_ERR_INVALID); /* > max_batch */
    assert_int_equal(tdm_executor_moe(x, hp->n_layer, in, 1, k, ids, w, out, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_executor_moe(x, 0, in, 1, k + 1, ids, w, out, &err), TDM_ERR_INVALID);
    /* the executor still works afterwards */
    assert_int_equal(tdm_executor_moe(x, 0, in, 2, k, ids, w, out, &err), TDM_OK);
    free(in);
    free(out);
    tdm_executor_free(x);
    tdm_model_free(m);
    alarm(0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cache_0),          cmocka_unit_test(test_cache_50),
        cmocka_unit_test(test_cache_100),        cmocka_unit_test(test_cache_50_all_cores),
        cmocka_unit_test(test_budget_no_slot),   cmocka_unit_test(test_adaptive_swaps),
        cmocka_unit_test(test_bad_input),        cmocka_unit_test(test_direct_share),
        cmocka_unit_test(test_direct_no_cache),  cmocka_unit_test(test_direct_all),
        cmocka_unit_test(test_direct_tuner),     cmocka_unit_test(test_direct_start),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
