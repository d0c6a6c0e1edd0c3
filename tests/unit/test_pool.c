/* test_pool: the mailbox protocol of the CPU expert pool under stress: many
 * layers x token batches with random residency and routing, published in
 * sequence, some ids marked as held by the device (TDM_MAILBOX_HELD); each
 * result checked against tdm_experts_run on the misses that are not held. Also
 * bad jobs, an all-hit job, freeing a sleeping pool, 1 thread, all cores,
 * more threads than cores, and a kick waking an idle team. Copy jobs
 * (tdm_pool_copy) between expert jobs: every byte lands, nothing else is
 * written, the expert jobs' counters stay apart. Warm-up hints, hostile ones
 * too, between and right before the stress jobs, and counted exactly. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "model_fixtures.h"
#include "pool.h"
#include "topology.h"

#define WATCHDOG_S 240

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

static tdm_experts_desc desc_of(const tdm_layer *L)
{
    return (tdm_experts_desc){L->gate_exps.data, L->up_exps.data, L->down_exps.data, L->gate_exps.type,
                              L->up_exps.type, L->down_exps.type, L->gate_exps.mat_bytes, L->up_exps.mat_bytes,
                              L->down_exps.mat_bytes, L->gate_exps.cols, L->gate_exps.rows,
                              (int32_t)L->gate_exps.n_mat};
}

static void stress(const char *name, int threads, int n_jobs)
{
    alarm(WATCHDOG_S);
    tdm_model *m = fx_load_micro_f32(name);
    const tdm_hparams *hp = tdm_model_hparams(m);
    const int32_t E = hp->n_expert, k = hp->n_expert_used, D = hp->n_embd, T = 4;
    tdm_topology *topo = NULL;
    tdm_error err = {0};
    assert_int_equal(tdm_topology_load(&topo, &err), TDM_OK);
    if (threads < 0) /* -n: n x the physical cores */
        threads *= -tdm_topology_physical_cores(topo);
    tdm_pool_params pp = {.model = m, .topo = topo, .n_threads = threads, .max_tok = T, .spin = 100};
    tdm_pool *p;
    assert_int_equal(tdm_pool_new(&pp, &p, &err), TDM_OK);
    assert_true(tdm_pool_threads(p) >= 1);
    int32_t *res = malloc((size_t)hp->n_layer * E * sizeof *res);
    tdm_pool_set_residency(p, res);
    tdm_experts_scratch *ex;
    assert_int_equal(tdm_experts_scratch_new(D, hp->n_ff_exp, T, T * k, E, &ex, &err), TDM_OK);
    tdm_expert_sel *sel = malloc((size_t)T * k * sizeof *sel);
    float *want = malloc((size_t)T * D * sizeof(float));
    tdm_mailbox *mb = tdm_pool_mailbox(p);
    int64_t jobs = 0, wakes = 0;
    for (int j = 0; j < n_jobs; j++) {
        if (j % 16 == 0) /* a new random residency, only between jobs */
            for (int32_t i = 0; i < hp->n_layer * E; i++)
                res[i] = (int32_t)(rnd() % 3) == 0 ? (int32_t)i : -1;
        int32_t il;
        do
            il = (int32_t)(rnd() % (uint32_t)hp->n_layer);
        while (tdm_model_layer(m, il)->ffn != TDM_FFN_MOE);
        const int32_t n = 1 + (int32_t)(rnd() % T);
        mb->layer = il;
        mb->n_tok = n;
        int32_t nm = 0;
        for (int32_t t = 0; t < n; t++) {
            for (int32_t i = 0; i < k; i++) { /* k distinct ids */
                int32_t e, dup;
                do {
                    e = (int32_t)(rnd() % (uint32_t)E);
                    dup = 0;
                    for (int32_t q = 0; q < i; q++)
                        dup |= (mb->ids[t * k + q] & ~TDM_MAILBOX_HELD) == e;
                } while (dup);
                mb->ids[t * k + i] = e;
                mb->weights[t * k + i] = (float)(rnd() % 1000) / 1000.0f;
                if (rnd() % 4 == 0) /* the device holds it (e.g. prefetched): the pool leaves it out, slot or not */
                    mb->ids[t * k + i] |= TDM_MAILBOX_HELD;
                else if (res[(size_t)il * E + e] < 0)
                    sel[nm++] = (tdm_expert_sel){t, e, mb->weights[t * k + i]};
            }
            for (int32_t c = 0; c < D; c++)
                mb->x[(size_t)t * D + c] = (float)((int32_t)(rnd() % 2001) - 1000) / 1000.0f;
        }
        for (size_t i = 0; i < (size_t)n * D; i++)
            mb->out[i] = NAN; /* poisoned: the pool must overwrite */
        const tdm_experts_desc d = desc_of(tdm_model_layer(m, il));
        assert_int_equal(tdm_experts_run(&d, mb->x, n, sel, nm, want, false, ex, &err), TDM_OK);
        if (j % 3 == 0) { /* a warm-up hint, often hostile, just before the job (read-only: no effect on it) */
            int32_t h[TDM_MAILBOX_HINT_MAX + 2];
            for (int i = 0; i < TDM_MAILBOX_HINT_MAX + 2; i++)
                h[i] = (int32_t)(rnd() % (uint32_t)(E + 4)) - 2;
            tdm_pool_hint(p, (int32_t)(rnd() % (uint32_t)(hp->n_layer + 2)) - 1, h,
                          (int32_t)(rnd() % (TDM_MAILBOX_HINT_MAX + 4)) - 1);
        }
        const uint32_t seq = tdm_pool_publish(p);
        wakes++;
        if (j % 97 == 0)
            usleep(3000); /* let the driver reach its futex sleep now and then */
        double wait_ms = 0;
        assert_int_equal(tdm_pool_wait(p, seq, &wait_ms, &err), TDM_OK);
        jobs++;
        assert_int_equal(mb->n_miss, nm);
        for (size_t i = 0; i < (size_t)n * D; i++)
            if (!(fabsf(mb->out[i] - want[i]) <= 1e-5f * (1.0f + fabsf(want[i]))))
                fail_msg("job %d layer %d: out[%zu] = %g, want %g", j, il, i, mb->out[i], want[i]);
    }
    tdm_pool_stats st;
    tdm_pool_get_stats(p, &st);
    assert_int_equal(st.jobs, jobs);
    assert_int_equal(wakes, jobs);
    printf("  %s, %d pool threads (pinned %d): %lld jobs, %lld misses, %.3f ms in jobs, %llu bytes\n", name,
           tdm_pool_threads(p), tdm_pool_pinned(p), (long long)st.jobs, (long long)st.misses, st.ms,
           (unsigned long long)st.bytes);
    tdm_pool_free(p);
    tdm_experts_scratch_free(ex);
    free(sel);
    free(want);
    free(res);
    tdm_topology_free(topo);
    tdm_model_free(m);
    alarm(0);
}

static void test_stress_1_thread(void **state)
{
    (void)state;
    stress("micro-qwen3moe", 1, 3000);
    stress("micro-qwen35moe", 1, 1000);
}

static void test_stress_all_cores(void **state)
{
    (void)state;
    stress("micro-qwen3next", -1, 2000);
    stress("micro-qwen3moe", 0, 500); /* the default: physical cores - 1 */
}

/* More team threads than cores (CI has 2): the barriers and the waits fall
 * back to yielding, so the jobs still finish. */
static void test_stress_oversubscribed(void **state)
{
    (void)state;
    stress("micro-qwen3moe", -3, 300);
    stress("micro-qwen35moe", -2, 200);
}

/* An idle team sleeps; a kick (what the GPU step does first, as its kernels
 * cannot wake the futex) makes the driver spin again, and the next job, after
 * a gap or at once, is served with the same bits as tdm_experts_run. */
static void test_kick_after_idle(void **state)
{
    (void)state;
    alarm(WATCHDOG_S);
    tdm_model *m = fx_load_micro_f32("micro-qwen3moe");
    const tdm_hparams *hp = tdm_model_hparams(m);
    const int32_t k = hp->n_expert_used, D = hp->n_embd;
    tdm_error err = {0};
    /* a spin of about 30-50 ms: long enough to observe, short enough to fall asleep */
    tdm_pool_params pp = {.model = m, .n_threads = 2, .max_tok = 1, .spin = 1 << 20};
    tdm_pool *p;
    assert_int_equal(tdm_pool_new(&pp, &p, &err), TDM_OK);
    tdm_mailbox *mb = tdm_pool_mailbox(p);
    int32_t il = 0;
    while (tdm_model_layer(m, il)->ffn != TDM_FFN_MOE)
        il++;
    tdm_expert_sel *sel = malloc((size_t)k * sizeof *sel);
    float *want = malloc((size_t)D * sizeof(float));
    mb->layer = il;
    mb->n_tok = 1;
    for (int32_t i = 0; i < k; i++) {
        mb->ids[i] = (i * 5 + 1) % hp->n_expert;
        mb->weights[i] = 0.1f * (float)(i + 1);
        sel[i] = (tdm_expert_sel){0, mb->ids[i], mb->weights[i]};
    }
    for (int32_t c = 0; c < D; c++)
        mb->x[c] = (float)((int32_t)(rnd() % 2001) - 1000) / 1000.0f;
    tdm_experts_scratch *ex;
    assert_int_equal(tdm_experts_scratch_new(D, hp->n_ff_exp, 1, k, hp->n_expert, &ex, &err), TDM_OK);
    const tdm_experts_desc d = desc_of(tdm_model_layer(m, il));
    assert_int_equal(tdm_experts_run(&d, mb->x, 1, sel, k, want, false, ex, &err), TDM_OK);
    for (int round = 0; round < 4; round++) {
        while (!atomic_load(&mb->pool_sleeping))
            usleep(1000); /* idle: the driver falls asleep */
        tdm_pool_kick(p);
        /* it wakes and spins again (only a wake clears pool_sleeping; a
         * timeout does not). If this thread was descheduled past the whole
         * spin the driver is asleep again: kick again rather than wait forever */
        for (int i = 1; atomic_load(&mb->pool_sleeping); i++) {
            usleep(100);
            if (i % 100 == 0)
                tdm_pool_kick(p);
        }
        if (round % 2)
            usleep(2000);
        for (int32_t c = 0; c < D; c++)
            mb->out[c] = NAN;
        assert_int_equal(tdm_pool_wait(p, tdm_pool_publish(p), NULL, &err), TDM_OK);
        assert_int_equal(mb->n_miss, k);
        assert_memory_equal(mb->out, want, (size_t)D * sizeof(float));
    }
    tdm_pool_kick(p); /* a kick while nobody sleeps is harmless */
    assert_int_equal(tdm_pool_wait(p, tdm_pool_publish(p), NULL, &err), TDM_OK);
    assert_memory_equal(mb->out, want, (size_t)D * sizeof(float));
    tdm_pool_stats st;
    tdm_pool_get_stats(p, &st);
    assert_int_equal(st.jobs, 5);
    tdm_pool_free(p);
    tdm_experts_scratch_free(ex);
    free(sel);
    free(want);
    tdm_model_free(m);
    alarm(0);
}

static double mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* A kick keeps the driver spinning for TDM_POOL_KICK_MS, past its spin
 * rounds (64 here, microseconds): a GPU step's first job may come a
 * millisecond or more after the kick (layers that hold every expert run
 * first), and a driver asleep then waits for the futex timeout. Afterwards it
 * sleeps again. One thread, so that the team never outnumbers CI's 2 CPUs
 * (which turns the window off). The check is a verdict only when this thread
 * made it inside three quarters of the window: an attempt it was descheduled
 * through (a loaded CI machine) is repeated, up to 50 per round. Without the
 * window the driver is asleep again microseconds after its wake, and every
 * attempt that gives a verdict fails. */
static void test_kick_window(void **state)
{
    (void)state;
    alarm(WATCHDOG_S);
    tdm_model *m = fx_load_micro_f32("micro-qwen3moe");
    tdm_error err = {0};
    tdm_pool_params pp = {.model = m, .n_threads = 1, .max_tok = 1, .spin = 64};
    tdm_pool *p;
    assert_int_equal(tdm_pool_new(&pp, &p, &err), TDM_OK);
    tdm_mailbox *mb = tdm_pool_mailbox(p);
    for (int round = 0; round < 2; round++) {
        bool verdict = false;
        for (int attempt = 0; attempt < 50 && !verdict; attempt++) {
            while (!atomic_load(&mb->pool_sleeping))
                usleep(200); /* 64 rounds and 64 yields: asleep at once; past the window, asleep again */
            const double t0 = mono_ms();
            tdm_pool_kick(p);
            while (atomic_load(&mb->pool_sleeping) && mono_ms() - t0 < TDM_POOL_KICK_MS / 2.0)
                usleep(100);
            usleep(TDM_POOL_KICK_MS * 1000 / 4);
            const unsigned asleep = atomic_load(&mb->pool_sleeping);
            if (mono_ms() - t0 > TDM_POOL_KICK_MS * 0.75)
                continue; /* descheduled: no verdict */
            assert_int_equal(asleep, 0); /* woken and still spinning inside the window */
            verdict = true;
        }
        assert_true(verdict);
    }
    tdm_pool_free(p);
    tdm_model_free(m);
    alarm(0);
}

/* One warm-up: a job (so the driver spins), the hint (`publish` writes it),
 * 20 ms for the team to act on it, a job to read the counters after. Tries
 * again while the hint went unseen (this thread descheduled past the whole
 * spin); returns the counters' change. */
static tdm_pool_stats warm_once(tdm_pool *p, void (*publish)(tdm_mailbox *mb, void *ctx), void *ctx, bool retry)
{
    tdm_mailbox *mb = tdm_pool_mailbox(p);
    tdm_error err = {0};
    tdm_pool_stats a, b;
    for (int tries = 0;; tries++) {
        assert_int_equal(tdm_pool_wait(p, tdm_pool_publish(p), NULL, &err), TDM_OK);
        tdm_pool_get_stats(p, &a);
        publish(mb, ctx);
        usleep(20000);
        assert_int_equal(tdm_pool_wait(p, tdm_pool_publish(p), NULL, &err), TDM_OK);
        tdm_pool_get_stats(p, &b);
        if (!retry || b.warms > a.warms || tries == 20)
            break;
    }
    b.warms -= a.warms;
    b.warm_cut -= a.warm_cut;
    b.warm_bytes -= a.warm_bytes;
    return b;
}

typedef struct hint_case {
    int32_t layer, n, ids[TDM_MAILBOX_HINT_MAX];
} hint_case;

static void publish_case(tdm_mailbox *mb, void *ctx)
{
    const hint_case *c = ctx;
    atomic_store(&mb->hint_layer, c->layer);
    atomic_store(&mb->hint_n, c->n); /* unclamped, as a device may write it */
    for (int i = 0; i < TDM_MAILBOX_HINT_MAX; i++)
        atomic_store(&mb->hint_ids[i], c->ids[i]);
    atomic_fetch_add(&mb->hint_seq, 1);
}

/* Warm-up hints: the team reads the hinted experts of the layer that have no
 * slot, each once (duplicates, resident and out-of-range ids skipped; n
 * clamped to TDM_MAILBOX_HINT_MAX), and nothing for a layer out of range or
 * a dense one; the jobs around them stay exact. */
static void test_warm_up(void **state)
{
    (void)state;
    alarm(WATCHDOG_S);
    tdm_model *m = fx_load_micro_f32("micro-qwen3moe");
    const tdm_hparams *hp = tdm_model_hparams(m);
    const int32_t E = hp->n_expert;
    tdm_error err = {0};
    tdm_pool_params pp = {.model = m, .n_threads = 2, .max_tok = 1, .spin = 1 << 20};
    tdm_pool *p;
    assert_int_equal(tdm_pool_new(&pp, &p, &err), TDM_OK);
    int32_t *res = malloc((size_t)hp->n_layer * E * sizeof *res);
    for (int32_t i = 0; i < hp->n_layer * E; i++)
        res[i] = i % E % 3 == 0 ? i : -1; /* experts 0, 3, 6, ... have slots */
    tdm_pool_set_residency(p, res);
    tdm_mailbox *mb = tdm_pool_mailbox(p);
    int32_t il = 0;
    while (tdm_model_layer(m, il)->ffn != TDM_FFN_MOE)
        il++;
    const tdm_layer *L = tdm_model_layer(m, il);
    const uint64_t eb = L->gate_exps.mat_bytes + L->up_exps.mat_bytes + L->down_exps.mat_bytes;
    mb->layer = il;
    mb->n_tok = 1;
    for (int32_t i = 0; i < hp->n_expert_used; i++) {
        mb->ids[i] = i;
        mb->weights[i] = 1.0f;
    }
    memset(mb->x, 0, (size_t)hp->n_embd * sizeof(float));
    /* 1 and 2 have no slot, 1 twice, 3 has one, then ids out of range */
    hint_case c = {il, 6, {1, 2, 1, 3, E, -1}};
    tdm_pool_stats d = warm_once(p, publish_case, &c, true);
    assert_int_equal(d.warms, 1);
    assert_int_equal(d.warm_cut, 0);
    assert_int_equal(d.warm_bytes, 2 * eb);
    /* n far past the array: the first TDM_MAILBOX_HINT_MAX ids only */
    c.n = 1000;
    uint8_t seen[TDM_MAILBOX_HINT_MAX] = {0};
    int32_t want = 0; /* the distinct ids without a slot */
    for (int i = 0; i < TDM_MAILBOX_HINT_MAX; i++) {
        c.ids[i] = i % (E + 1); /* E: out of range */
        if (c.ids[i] < E && c.ids[i] % 3 != 0 && !seen[c.ids[i]]++)
            want++;
    }
    d = warm_once(p, publish_case, &c, true);
    assert_int_equal(d.warms, 1);
    assert_int_equal(d.warm_bytes, (uint64_t)want * eb);
    /* nothing to read: every id has a slot, or the layer is out of range */
    const hint_case none[] = {{il, 2, {0, 3}}, {hp->n_layer, 2, {1, 2}}, {-1, 2, {1, 2}}, {il, -4, {1, 2}}};
    for (size_t i = 0; i < sizeof none / sizeof *none; i++) {
        d = warm_once(p, publish_case, (void *)&none[i], false);
        assert_int_equal(d.warms, 0);
        assert_int_equal(d.warm_bytes, 0);
    }
    for (int32_t l = 0; l < hp->n_layer; l++)
        if (tdm_model_layer(m, l)->ffn != TDM_FFN_MOE) {
            hint_case dense = {l, 2, {1, 2}};
            d = warm_once(p, publish_case, &dense, false);
            assert_int_equal(d.warms, 0);
        }
    tdm_pool_free(p);
    free(res);
    tdm_model_free(m);
    alarm(0);
}

/* Bad jobs are reported in the mailbox and the pool keeps serving. */
static void test_bad_jobs_and_sleep(void **state)
{
    (void)state;
    alarm(WATCHDOG_S);
    tdm_model *m = fx_load_micro_f32("micro-qwen3moe");
    const tdm_hparams *hp = tdm_model_hparams(m);
    tdm_error err = {0};
    tdm_pool_params pp = {.model = m, .n_threads = 1, .max_tok = 2};
    tdm_pool *p = NULL;
    tdm_pool_params bad = pp;
    bad.max_tok = 0;
    assert_int_equal(tdm_pool_new(&bad, &p, &err), TDM_ERR_INVALID);
    assert_null(p);
    assert_int_equal(tdm_pool_new(&pp, &p, &err), TDM_OK);
    tdm_mailbox *mb = tdm_pool_mailbox(p);
    const int32_t k = hp->n_expert_used;
    memset(mb->x, 0, 2 * (size_t)hp->n_embd * sizeof(float));
    for (int32_t i = 0; i < 2 * k; i++) {
        mb->ids[i] = i % k;
        mb->weights[i] = 1.0f;
    }
    mb->layer = 0;
    mb->n_tok = 3; /* more than max_tok */
    assert_int_equal(tdm_pool_wait(p, tdm_pool_publish(p), NULL, &err), TDM_ERR_INVALID);
    mb->n_tok = 1;
    mb->ids[0] = hp->n_expert;
    assert_int_equal(tdm_pool_wait(p, tdm_pool_publish(p), NULL, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.msg, "out of range"));
    mb->ids[0] = 0;
    mb->layer = hp->n_layer;
    assert_int_equal(tdm_pool_wait(p, tdm_pool_publish(p), NULL, &err), TDM_ERR_INVALID);
    mb->layer = 0;
    usleep(50000); /* the driver is asleep on its futex now */
    assert_int_equal(tdm_pool_wait(p, tdm_pool_publish(p), NULL, &err), TDM_OK);
    assert_int_equal(mb->n_miss, k);
    /* an all-resident table: the job computes nothing and writes zeros */
    int32_t *res = malloc((size_t)hp->n_layer * hp->n_expert * sizeof *res);
    for (int32_t i = 0; i < hp->n_layer * hp->n_expert; i++)
        res[i] = i;
    tdm_pool_set_residency(p, res);
    mb->out[0] = NAN;
    assert_int_equal(tdm_pool_wait(p, tdm_pool_publish(p), NULL, &err), TDM_OK);
    assert_int_equal(mb->n_miss, 0);
    assert_true(mb->out[0] == 0.0f);
    usleep(50000);
    tdm_pool_free(p); /* a sleeping driver is woken and joined */
    free(res);
    tdm_model_free(m);
    alarm(0);
}

/* Copy jobs of random pieces (empty, one byte, block-sized, several blocks
 * with a ragged end) into a poisoned buffer, on teams of 1 and 3 threads,
 * interleaved with an expert job. */
static void test_copy_jobs(void **state)
{
    (void)state;
    alarm(WATCHDOG_S);
    tdm_model *m = fx_load_micro_f32("micro-qwen3moe");
    const tdm_hparams *hp = tdm_model_hparams(m);
    const size_t cap = (size_t)3 << 20;
    uint8_t *src = malloc(cap), *dst = malloc(cap + 64), *want = malloc(cap + 64);
    assert_non_null(src);
    assert_non_null(dst);
    assert_non_null(want);
    for (size_t i = 0; i < cap; i++)
        src[i] = (uint8_t)rnd();
    const size_t sizes[] = {0, 1, 4096, (size_t)256 << 10, ((size_t)256 << 10) + 1, ((size_t)1 << 20) - 7, 12345};
    for (int threads = 1; threads <= 3; threads += 2) {
        tdm_pool_params pp = {.model = m, .n_threads = threads, .max_tok = 1};
        tdm_pool *p = NULL;
        tdm_error err = {0};
        assert_int_equal(tdm_pool_new(&pp, &p, &err), TDM_OK);
        for (int round = 0; round < 6; round++) {
            tdm_copy_piece pc[8];
            int n = 0;
            size_t at = 0;
            memset(dst, 0xA5, cap + 64);
            memset(want, 0xA5, cap + 64);
            for (size_t i = 0; i < sizeof sizes / sizeof *sizes && n < 8; i++) {
                const size_t b = sizes[(i + (size_t)round) % (sizeof sizes / sizeof *sizes)];
                const size_t from = rnd() % (cap - b + 1);
                if (at + b + 3 > cap)
                    break;
                pc[n++] = (tdm_copy_piece){dst + at, src + from, b};
                memcpy(want + at, src + from, b);
                at += b + 3; /* gaps must stay poisoned */
            }
            assert_int_equal(tdm_pool_copy(p, pc, n, &err), TDM_OK);
            assert_memory_equal(dst, want, cap + 64);
            /* an expert job in between still computes and counts as before */
            tdm_mailbox *mb = tdm_pool_mailbox(p);
            mb->layer = 0;
            while (tdm_model_layer(m, mb->layer)->ffn != TDM_FFN_MOE)
                mb->layer++;
            mb->n_tok = 1;
            for (int32_t i = 0; i < hp->n_expert_used; i++) {
                mb->ids[i] = i;
                mb->weights[i] = 1.0f;
            }
            memset(mb->x, 0, (size_t)hp->n_embd * sizeof(float));
            assert_int_equal(tdm_pool_wait(p, tdm_pool_publish(p), NULL, &err), TDM_OK);
            assert_int_equal(mb->n_miss, hp->n_expert_used);
        }
        assert_int_equal(tdm_pool_copy(p, NULL, 0, &err), TDM_OK);
        assert_int_equal(tdm_pool_copy(p, NULL, 2, &err), TDM_ERR_INVALID);
        tdm_pool_stats st;
        tdm_pool_get_stats(p, &st);
        assert_int_equal(st.copies, 6);
        assert_int_equal(st.jobs, 6);
        assert_true(st.copy_bytes > 0);
        tdm_pool_free(p);
    }
    free(src);
    free(dst);
    free(want);
    tdm_model_free(m);
    alarm(0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stress_1_thread),
        cmocka_unit_test(test_stress_all_cores),
        cmocka_unit_test(test_stress_oversubscribed),
        cmocka_unit_test(test_kick_after_idle),
        cmocka_unit_test(test_kick_window),
        cmocka_unit_test(test_bad_jobs_and_sleep),
        cmocka_unit_test(test_copy_jobs),
        cmocka_unit_test(test_warm_up),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
