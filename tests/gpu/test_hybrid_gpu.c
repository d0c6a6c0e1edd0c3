/* test_hybrid_gpu: the hybrid executor on a real GPU (forward_gpu.h
 * tdm_forward_gpu_new_hybrid) against the all-resident GPU forward.
 *
 * Every case runs the same token sequence through both paths: a prompt batch
 * (logits of every position) and then teacher-forced decode steps (one token
 * each, through the CUDA graph), and compares all rows.
 *  - cache at 100% of the experts: the same kernels read the same bytes, so
 *    the logits must agree to float rounding (rel L2 <= 1e-5), and no layer
 *    may publish a job (no host round trip when everything hits);
 *  - cache at 0% and ~50%: the misses are computed by the CPU pool. With f32
 *    weights (micro fixtures) the CPU computes in float32 too: rel L2 <= 1e-4.
 *    With quantised weights the CPU rounds activations to 8 bit for its dot
 *    products (as llama.cpp does) where the GPU keeps float32, so the hybrid
 *    may differ from the resident path by at most what the CPU forward
 *    differs: KL(resident || hybrid) <= 1.1 KL(resident || CPU forward) +
 *    1e-6, top-1 agreement >= the CPU forward's - 0.02;
 *  - counters: hits + misses = tokens x MoE layers x k, hit rate 0 with no
 *    slots, pool jobs = layer calls with a miss;
 *  - adaptive policy on the demo model: slot copies run on the copy stream
 *    during decode (swaps > 0) without changing the bounds;
 *  - greedy on the device: every case whose split does not adapt and that
 *    borrows no slots replays
 *    its path with tdm_forward_gpu_eval_greedy, and each choice is the
 *    argmax of the logits the path gave;
 *  - pool of 1 thread and of every core; a budget below the fixed part is
 *    refused with TDM_ERR_OOM; a budget that leaves 0 slots runs;
 *  - a budget with room for the experts but not also the prompt scratch:
 *    the prompt borrows the arena's last slots (test_prompt_loan), as a pool
 *    batch, streamed, with the direct share and with the adaptive policy;
 *    the same bounds, each lent slot copied back once;
 *  - the direct share (a fixed 2 or 3 misses per layer launch, more than
 *    there are, and adapted): decode launches read those misses from the
 *    model's registered expert memory, the pool computes the rest; the same
 *    bounds, and pool misses + direct misses = misses;
 *  - the decode prefetch (2 to 4 spare slots, alone, with the direct share
 *    and with the adaptive policy swapping meanwhile): layers read their
 *    predicted misses into spare slots; the same bounds, something staged
 *    when a layer without slots decodes, and pool misses + direct + misses
 *    served by the prefetch = misses;
 *  - the prefetch kernels on their own (test_prefetch_kernels): which
 *    predicted experts are staged, the residency entries set and cleared
 *    (a spare slot's entry only while it still points there), every byte
 *    of the matrices copied at the slot offsets (odd sizes: the byte path
 *    too) and nothing else written in the poisoned spare slots;
 *  - prompt streaming (stream_min 2: the prompt batch sends every missing
 *    expert to the GPU in chunks and the GPU computes the misses; decode
 *    steps still use the pool): the same bounds, the prompt's layer calls
 *    counted as streamed instead of pool jobs, bytes sent > 0; with the
 *    experts' copy registered (direct share or prefetch on) the copy stream
 *    reads it directly and the pool copies nothing, else the pool copies;
 *  - a prompt longer than max_batch streams in spans (tdm_stream_span) that
 *    run layer by layer: the same bounds, and each span sends every missing
 *    expert exactly once (bytes = spans x missing experts x slot bytes).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "../unit/model_fixtures.h"
#include "gpu_model_util.h"
#include "expert_cache.h"
#include "forward.h"
#include "forward_gpu.h"
#include "gpu.h"
#include "gpu_handoff.h"
#include "model.h"
#include "topology.h"


enum { FULL = -2, HALF = -3, LOAN = -4 }; /* slot counts resolved per model; LOAN: as gpu_mem leaves */

typedef struct hyb_case {
    int32_t slots;  /* 0, HALF or FULL */
    int threads;    /* pool threads; 0: the default */
    int policy;     /* -1: layer order */
    int32_t adapt_every;
    int32_t stream_min; /* -1: never; 2: the prompt batch streams */
    int32_t direct;     /* the direct share (executor.h): 0 off, N, -1 adapted */
    int32_t prefetch;   /* decode prefetch slots (executor.h): 0 off */
    int32_t max_batch;  /* 0: 512 */
    uint64_t gpu_mem;   /* LOAN's budget in bytes */
} hyb_case;

static int32_t batch_of(const hyb_case *hc) { return hc->max_batch ? hc->max_batch : 512; }

/* Streamed spans of an np-token prompt, as tdm_forward_gpu_eval cuts it,
 * and their batches of max_batch tokens (*batches). */
static int32_t streamed_spans(const hyb_case *hc, int np, int n_ctx, int32_t *batches)
{
    const int32_t B = batch_of(hc) < n_ctx ? batch_of(hc) : n_ctx, S = tdm_stream_span(B, n_ctx);
    int32_t spans = 0;
    *batches = 0;
    for (int32_t b0 = 0, nb; b0 < np; b0 += nb) {
        const int32_t left = np - b0;
        const bool streams = hc->stream_min > 0 && left >= hc->stream_min;
        const int32_t cap = streams ? S : B;
        nb = left < cap ? left : cap;
        spans += streams;
        *batches += streams ? (nb + B - 1) / B : 0;
    }
    return spans;
}

static int32_t moe_layers(const tdm_model *m)
{
    int32_t n = 0;
    for (int32_t il = 0; il < tdm_model_hparams(m)->n_layer; il++)
        n += tdm_model_layer(m, il)->ffn == TDM_FFN_MOE;
    return n;
}

/* Prompt tok[0..np) as one batch, then tok[np..n) one decode step each;
 * rows [n][V] receive the logits of every position. */
static void run_path(tdm_forward_gpu *f, const int32_t *tok, int np, int n, float *rows, int V)
{
    tdm_error err = {0};
    tdm_status st = tdm_forward_gpu_eval(f, tok, np, 0, rows, true, &err);
    for (int i = np; !st && i < n; i++)
        st = tdm_forward_gpu_eval(f, tok + i, 1, i, rows + (size_t)i * V, false, &err);
    if (st)
        fprintf(stderr, "eval: %s\n", err.msg);
    assert_int_equal(st, TDM_OK);
}

/* run_path chosen on the device (tdm_forward_gpu_eval_greedy) from a reset,
 * teacher-forced: every choice is the argmax of the logits rows [n][V] the
 * path gave (a split of the work that does not adapt computes the same
 * values again). */
static void check_greedy_replay(tdm_forward_gpu *f, const int32_t *tok, int np, int n, const float *rows, int V)
{
    tdm_error err = {0};
    assert_int_equal(tdm_forward_gpu_reset(f, &err), TDM_OK);
    int32_t c = -1;
    assert_int_equal(tdm_forward_gpu_eval_greedy(f, tok, np, 0, &c, &err), TDM_OK);
    for (int i = np;; i++) {
        assert_int_equal(c, fx_argmax(rows + (size_t)(i - 1) * V, V));
        if (i == n)
            break;
        assert_int_equal(tdm_forward_gpu_eval_greedy(f, tok + i, 1, i, &c, &err), TDM_OK);
    }
}

static tdm_forward_gpu *open_hybrid(const tdm_model *m, int n_ctx, const hyb_case *hc, const tdm_topology *topo)
{
    const tdm_hparams *hp = tdm_model_hparams(m);
    const int32_t all = moe_layers(m) * hp->n_expert;
    tdm_executor_params xp;
    tdm_executor_params_init(&xp);
    xp.n_slots = hc->slots == FULL ? all : hc->slots == HALF ? all / 2 : hc->slots == LOAN ? -1 : hc->slots;
    xp.gpu_mem = hc->slots == LOAN ? hc->gpu_mem : 0;
    xp.n_threads = hc->threads;
    xp.policy = hc->policy;
    xp.adapt_every = hc->adapt_every;
    xp.per_layer = hc->policy == TDM_CACHE_ADAPTIVE; /* layer order + global slots leaves nothing to swap */
    xp.topo = topo;
    xp.stream_min = hc->stream_min;
    xp.direct = hc->direct;
    xp.prefetch = hc->prefetch;
    tdm_forward_gpu *f = NULL;
    tdm_error err = {0};
    tdm_status st = tdm_forward_gpu_new_hybrid(m, 0, n_ctx, batch_of(hc), &xp, &f, &err);
    if (st)
        fprintf(stderr, "forward_gpu_new_hybrid: %s\n", err.msg);
    assert_int_equal(st, TDM_OK);
    gm_race_safe(f);
    return f;
}

/* The resident path's logits and the CPU forward's (the scale of the
 * quantised bound) for one token sequence. */
typedef struct baseline {
    float *gpu, *cpu; /* [n][V] */
} baseline;

static baseline make_baseline(const tdm_model *m, const int32_t *tok, int np, int n, int V)
{
    baseline b = {malloc((size_t)n * V * sizeof(float)), malloc((size_t)n * V * sizeof(float))};
    assert_non_null(b.gpu);
    assert_non_null(b.cpu);
    tdm_error err = {0};
    tdm_forward_gpu *f = NULL;
    assert_int_equal(tdm_forward_gpu_new(m, 0, n + 1, 512, &f, &err), TDM_OK);
    gm_race_safe(f);
    run_path(f, tok, np, n, b.gpu, V);
    tdm_forward_gpu_free(f);
    tdm_forward *fc = NULL;
    assert_int_equal(tdm_forward_new(m, n + 1, 512, &fc, &err), TDM_OK);
    assert_int_equal(tdm_forward_eval(fc, tok, n, 0, b.cpu, true, &err), TDM_OK);
    tdm_forward_free(fc);
    return b;
}

/* Runs one case and checks it against the baseline (see the file comment). */
static void check_case(const char *name, tdm_model *m, const int32_t *tok, int np, int n, const baseline *b,
                       const hyb_case *hc, bool f32_weights, const tdm_topology *topo)
{
    if ((hc->direct || hc->prefetch) && !tdm_model_experts_copied(m)) { /* both read the copy (registered) */
        tdm_error e = {0};
        assert_int_equal(tdm_model_copy_experts(m, NULL, &e), TDM_OK);
    }
    const tdm_hparams *hp = tdm_model_hparams(m);
    const int V = hp->n_vocab;
    float *h = malloc((size_t)n * V * sizeof(float));
    assert_non_null(h);
    tdm_forward_gpu *f = open_hybrid(m, n + 1, hc, topo);
    run_path(f, tok, np, n, h, V);
    tdm_executor_stats s;
    tdm_executor_get_stats(tdm_forward_gpu_executor(f), &s);
    const int32_t lent = tdm_forward_gpu_loan_slots(f); /* the prompt borrowed them, its experts missing */
    tdm_pool_stats ps;
    tdm_pool_get_stats(tdm_executor_pool(tdm_forward_gpu_executor(f)), &ps);
    const double rel = fx_rel_l2(h, b->gpu, (size_t)n * V), kl = fx_mean_kl(b->gpu, h, n, V);
    const double kl_cpu = fx_mean_kl(b->gpu, b->cpu, n, V);
    const double top1 = fx_top1(h, b->gpu, n, V), top1_cpu = fx_top1(b->cpu, b->gpu, n, V);
    const int64_t sel = s.hits + s.misses;
    printf("  %-10s %5d slots, pool %2d threads: rel L2 %.2e KL %.2e (cpu forward %.2e) top-1 %.4f (cpu %.4f) | "
           "hit %.1f%% jobs %lld/%lld streamed %lld (%.1f MB) direct %lld (share %d) prefetched %lld/%lld warm-ups "
           "%lld swaps %lld lent %d | gpu %.3f wait %.3f pool %.3f ms/token\n",
           name, s.n_slots, s.pool_threads, rel, kl, kl_cpu, top1, top1_cpu,
           sel ? 100.0 * (double)s.hits / (double)sel : 0.0, (long long)s.pool_wakes, (long long)s.layers,
           (long long)s.streamed_layers, (double)s.stream_bytes / 1e6, (long long)s.direct, s.direct_quota,
           (long long)s.prefetched, (long long)s.prefetch_staged, (long long)s.warms, (long long)s.swaps, lent,
           s.dev_ms / (double)s.tokens, s.wait_ms / (double)s.tokens, s.pool_ms / (double)s.tokens);
    /* counters */
    assert_int_equal(s.tokens, n);
    assert_int_equal(sel, (int64_t)n * moe_layers(m) * hp->n_expert_used);
    if (s.n_slots == 0)
        assert_int_equal(s.hits, 0);
    if (s.misses == 0)
        assert_int_equal(s.pool_wakes, 0);
    else if (hc->direct >= 1000) /* a share over every miss: only a prompt batch too long for the fused
                                  * launches wakes the pool */
        assert_true(s.pool_wakes <= moe_layers(m));
    else if (hc->stream_min > 0 && (hc->direct > 0 || hc->prefetch > 0)) /* the prompt streamed; the share or the
                                                                          * prefetch may take every decode miss */
        assert_true(s.pool_wakes <= s.layers);
    else
        assert_true(s.pool_wakes >= 1 && s.pool_wakes <= s.layers);
    if (s.n_slots == 0 && hc->direct == 0)
        assert_int_equal(s.pool_wakes, s.layers - s.streamed_layers);
    /* every miss computed once: by the pool, the direct share, the prefetch or a streamed batch */
    if (hc->stream_min <= 0)
        assert_int_equal(ps.misses + s.direct + s.prefetched, s.misses);
    assert_true(s.prefetched <= s.prefetch_staged);
    if (!hc->prefetch) /* no prediction: no staging and no warm-up hints */
        assert_true(s.prefetch_staged == 0 && s.warms == 0);
    else if (hc->slots == HALF) /* the layer fill leaves layers without slots: their decode steps stage */
        assert_true(s.prefetch_staged > 0);
    if (hc->direct == 0)
        assert_int_equal(s.direct, 0);
    else if (hc->direct > 0 && s.misses > 0)
        assert_true(s.direct > 0 && s.direct_quota == hc->direct);
    if (hc->stream_min > 0) { /* the prompt streamed, each span sending every missing expert once */
        int32_t batches;
        const int64_t spans = streamed_spans(hc, np, n + 1, &batches);
        assert_int_equal(s.streamed_layers, (int64_t)batches * moe_layers(m));
        assert_int_equal(s.stream_bytes, (uint64_t)spans *
                                             ((uint64_t)moe_layers(m) * hp->n_expert - s.n_slots + lent) *
                                             tdm_expert_cache_slot_bytes_for(m));
        /* with the registered copy (the share's or the prefetch's) the DMA reads it: the pool copies nothing */
        const bool registered = hc->direct != 0 || hc->prefetch != 0;
        assert_true((ps.copies > 0) == (s.stream_bytes > 0 && !registered));
    } else
        assert_int_equal(s.streamed_layers, 0);
    /* a loan: the prompt borrowed the arena's last slots, every one copied back after it (under
     * racecheck only a streamed prompt takes the prompt path: gm_race_safe) */
    if (hc->slots == LOAN && (hc->stream_min > 0 || !gm_racecheck()))
        assert_true(lent > 0 && s.loans == 1);
    else
        assert_int_equal(s.loans, 0);
    assert_int_equal(s.bytes_reclaimed, (uint64_t)s.loans * (uint64_t)lent * s.slot_bytes);
    /* numbers */
    for (size_t i = 0; i < (size_t)n * V; i++)
        assert_true(isfinite(h[i]));
    if (s.misses == 0)
        assert_true(rel <= 1e-5);
    else if (f32_weights)
        assert_true(rel <= 1e-4);
    else {
        assert_true(kl <= 1.1 * kl_cpu + 1e-6);
        assert_true(top1 >= top1_cpu - 0.02);
    }
    if (hc->policy == TDM_CACHE_ADAPTIVE)
        assert_true(s.swaps > 0);
    else if (hc->direct >= 0 && hc->slots != LOAN) /* a loan's copies back land when they land */
        check_greedy_replay(f, tok, np, n, h, V);
    tdm_forward_gpu_free(f);
    free(h);
}

static void free_baseline(baseline *b) { free(b->gpu), free(b->cpu); }

/* A direct share asked for on experts still in the file mapping is refused
 * (the driver would pin the mapping page by page); an adapted one is off. */
static void test_direct_needs_copy(void **state)
{
    (void)state;
    gm_need_gpu();
    fx_micro mc;
    fx_micro_open(&mc, "micro-qwen3moe");
    tdm_executor_params xp;
    tdm_executor_params_init(&xp);
    xp.n_slots = 0;
    xp.n_threads = 1;
    xp.direct = 2;
    tdm_forward_gpu *f = NULL;
    tdm_error err = {0};
    assert_int_equal(tdm_forward_gpu_new_hybrid(mc.m, 0, 16, 512, &xp, &f, &err), TDM_ERR_UNSUPPORTED);
    assert_null(f);
    assert_non_null(strstr(err.msg, "--expert-memory copy"));
    xp.direct = -1;
    assert_int_equal(tdm_forward_gpu_new_hybrid(mc.m, 0, 16, 512, &xp, &f, &err), TDM_OK);
    float *logits = malloc((size_t)mc.hp->n_vocab * sizeof(float));
    for (int32_t i = 0; i < 8; i++) { /* decode steps that all miss: the pool computes them */
        const int32_t tok = (i * 37 + 5) % mc.hp->n_vocab;
        assert_int_equal(tdm_forward_gpu_eval(f, &tok, 1, i, logits, false, &err), TDM_OK);
    }
    free(logits);
    tdm_executor_stats s;
    tdm_executor_get_stats(tdm_forward_gpu_executor(f), &s);
    assert_true(s.misses > 0);
    assert_int_equal(s.direct, 0);
    assert_int_equal(s.direct_quota, 0);
    tdm_forward_gpu_free(f);
    fx_micro_close(&mc);
}

/* The device tables of test_prefetch_kernels and their sizes. */
typedef struct stage_fx {
    tdm_gpu *g;
    const int32_t *slot_of, *stage;
    const uint8_t *spare;
    size_t slot_of_bytes, stage_bytes, spare_bytes;
} stage_fx;

/* Waits for the launches, then reads the residency table back into got and,
 * when not NULL, the stage rows into st and the spare slots into sp. */
static void read_back(const stage_fx *x, int32_t *got, int32_t *st, uint8_t *sp)
{
    tdm_error err = {0};
    assert_int_equal(tdm_gpu_sync(x->g, &err), TDM_OK);
    assert_int_equal(tdm_gpu_download(x->g, got, x->slot_of, x->slot_of_bytes, &err), TDM_OK);
    if (st)
        assert_int_equal(tdm_gpu_download(x->g, st, x->stage, x->stage_bytes, &err), TDM_OK);
    if (sp)
        assert_int_equal(tdm_gpu_download(x->g, sp, x->spare, x->spare_bytes, &err), TDM_OK);
}

/* A 3-slot stage row, slot by slot (a failure names the value). */
static void stage_row(const int32_t *row, int32_t s0, int32_t s1, int32_t s2)
{
    assert_int_equal(row[0], s0);
    assert_int_equal(row[1], s1);
    assert_int_equal(row[2], s2);
}

/* The prefetch's stage and copy kernels (gpu_handoff.h) on hand-made
 * tables: 3 layers x 7 experts, 3 spare slots at index 4 (after 4 real
 * slots); in host memory up [7][48] (16-byte aligned: the vector path),
 * then gate [7][37] and down [7][100] (the byte path). Then the pool's
 * warm-up hint the stage kernel writes into mapped memory, and the staged
 * direct share. */
static void test_prefetch_kernels(void **state)
{
    (void)state;
    gm_need_gpu();
    enum { NL = 3, E = 7, NS = 3, BASE = 4, K = 4 };
    const size_t gb = 37, ub = 48, db = 100, slot = 224, goff = 0, uoff = 48, doff = 112;
    tdm_gpu *g = NULL;
    tdm_error err = {0};
    assert_int_equal(tdm_gpu_create(0, &g, &err), TDM_OK);
    /* host experts: up [E][48] | gate [E][37] | down [E][100] in registered pages of their own */
    const size_t total = ((gb + ub + db) * E + 4095) & ~(size_t)4095;
    uint8_t *hostw = NULL;
    assert_int_equal(posix_memalign((void **)&hostw, 4096, total), 0);
    for (size_t i = 0; i < total; i++)
        hostw[i] = (uint8_t)(i * 131 + 7);
    const void *dev = NULL;
    assert_int_equal(tdm_gpu_host_register(g, hostw, total, &dev, &err), TDM_OK);
    const uint8_t *hup = hostw, *hgate = hostw + E * ub, *hdown = hostw + E * (ub + gb);
    const tdm_gpu_direct_experts src = {.gate = (const uint8_t *)dev + E * ub, .up = dev,
                                        .down = (const uint8_t *)dev + E * (ub + gb), .gate_stride = gb,
                                        .up_stride = ub, .down_stride = db};
    /* residency: layer 1 holds experts 1 and 4, layer 2 holds 4 */
    int32_t res[NL * E];
    for (int i = 0; i < NL * E; i++)
        res[i] = -1;
    res[1 * E + 1] = 0, res[1 * E + 4] = 1, res[2 * E + 4] = 2;
    int32_t *slot_of = NULL, *stage = NULL, *pred = NULL;
    uint8_t *spare = NULL;
    assert_int_equal(tdm_gpu_alloc(g, sizeof res, (void **)&slot_of, &err), TDM_OK);
    assert_int_equal(tdm_gpu_alloc(g, NL * NS * sizeof(int32_t), (void **)&stage, &err), TDM_OK);
    assert_int_equal(tdm_gpu_alloc(g, K * sizeof(int32_t), (void **)&pred, &err), TDM_OK);
    assert_int_equal(tdm_gpu_alloc(g, NS * slot, (void **)&spare, &err), TDM_OK);
    assert_int_equal(tdm_gpu_upload(g, slot_of, res, sizeof res, &err), TDM_OK);
    assert_int_equal(tdm_gpu_memset(g, stage, 0xff, NL * NS * sizeof(int32_t), &err), TDM_OK);
    assert_int_equal(tdm_gpu_memset(g, spare, 0xab, NS * slot, &err), TDM_OK);
    const tdm_gpu_prefetch pf = {.slot_of = slot_of, .n_expert = E, .spare = spare, .slot_bytes = slot,
                                 .base = BASE, .n = NS, .stage = stage};
    const tdm_gpu_expert_table tab = {.slot_of = slot_of, .n_expert = E, .slot_bytes = slot, .gate_off = goff,
                                      .up_off = uoff, .down_off = doff};
    int32_t got[NL * E], st[NL * NS];
    uint8_t *sp = malloc(NS * slot);
    assert_non_null(sp);
    const stage_fx fx = {g, slot_of, stage, spare, sizeof got, sizeof st, NS * slot};

    /* layer 1, predicted 3 1 5 0: 1 has a slot, so 3 5 0 are staged */
    const int32_t p1[K] = {3, 1, 5, 0};
    assert_int_equal(tdm_gpu_upload(g, pred, p1, sizeof p1, &err), TDM_OK);
    assert_int_equal(tdm_gpu_prefetch_stage(g, &pf, 1, -1, pred, K, &err), TDM_OK);
    assert_int_equal(tdm_gpu_prefetch_copy(g, &pf, 1, &src, &tab, &err), TDM_OK);
    read_back(&fx, got, st, sp);
    int32_t want[NL * E];
    memcpy(want, res, sizeof want);
    want[1 * E + 3] = BASE, want[1 * E + 5] = BASE + 1, want[1 * E + 0] = BASE + 2;
    assert_memory_equal(got, want, sizeof got);
    assert_int_equal(st[1 * NS + 0], 3);
    assert_int_equal(st[1 * NS + 1], 5);
    assert_int_equal(st[1 * NS + 2], 0);
    for (int j = 0; j < NS; j++) {
        const int32_t e = st[1 * NS + j];
        const uint8_t *s0 = sp + (size_t)j * slot;
        assert_memory_equal(s0 + goff, hgate + e * gb, gb);
        assert_memory_equal(s0 + uoff, hup + e * ub, ub);
        assert_memory_equal(s0 + doff, hdown + e * db, db);
        for (size_t b = 0; b < slot; b++) /* the gaps between and after the matrices stay poisoned */
            if (!(b < goff + gb || (b >= uoff && b < uoff + ub) || (b >= doff && b < doff + db)))
                assert_int_equal(s0[b], 0xab);
    }

    /* layer 2, clearing layer 1: predicted 2 4 6 4, and 4 has a slot there */
    const int32_t p2[K] = {2, 4, 6, 4};
    assert_int_equal(tdm_gpu_upload(g, pred, p2, sizeof p2, &err), TDM_OK);
    assert_int_equal(tdm_gpu_prefetch_stage(g, &pf, 2, 1, pred, K, &err), TDM_OK);
    assert_int_equal(tdm_gpu_prefetch_copy(g, &pf, 2, &src, &tab, &err), TDM_OK);
    read_back(&fx, got, st, sp);
    memcpy(want, res, sizeof want);
    want[2 * E + 2] = BASE, want[2 * E + 6] = BASE + 1;
    assert_memory_equal(got, want, sizeof got);
    assert_int_equal(st[1 * NS + 0], 3); /* layer 1's row stays (statistics) */
    assert_int_equal(st[2 * NS + 0], 2);
    assert_int_equal(st[2 * NS + 1], 6);
    assert_int_equal(st[2 * NS + 2], -1);
    assert_memory_equal(sp + goff, hgate + 2 * gb, gb);
    assert_memory_equal(sp + slot + doff, hdown + 6 * db, db);
    assert_memory_equal(sp + 2 * slot + goff, hgate, gb); /* spare slot 2 untouched: still expert 0 */

    /* clear only: an entry the cache meanwhile gave a real slot keeps it */
    int32_t real = 3;
    assert_int_equal(tdm_gpu_upload(g, slot_of + 2 * E + 2, &real, sizeof real, &err), TDM_OK);
    assert_int_equal(tdm_gpu_prefetch_stage(g, &pf, -1, 2, NULL, 0, &err), TDM_OK);
    read_back(&fx, got, NULL, NULL);
    memcpy(want, res, sizeof want);
    want[2 * E + 2] = 3;
    assert_memory_equal(got, want, sizeof got);

    /* an id predicted twice is staged once: layer 2, 3 3 5 0 -> 3 5 0 */
    const int32_t pd[K] = {3, 3, 5, 0};
    assert_int_equal(tdm_gpu_upload(g, pred, pd, sizeof pd, &err), TDM_OK);
    assert_int_equal(tdm_gpu_prefetch_stage(g, &pf, 2, -1, pred, K, &err), TDM_OK);
    read_back(&fx, got, st, NULL);
    want[2 * E + 3] = BASE, want[2 * E + 5] = BASE + 1, want[2 * E + 0] = BASE + 2;
    assert_memory_equal(got, want, sizeof got);
    stage_row(st + 2 * NS, 3, 5, 0);
    assert_int_equal(tdm_gpu_prefetch_stage(g, &pf, -1, 2, NULL, 0, &err), TDM_OK);
    read_back(&fx, got, NULL, NULL);
    want[2 * E + 3] = -1, want[2 * E + 5] = -1, want[2 * E + 0] = -1;
    assert_memory_equal(got, want, sizeof got);

    /* the pool's hint, one spare slot, a direct share of 1: layer 1 predicted
     * 3 1 5 0 2 6; 1 has a slot, 3 is staged, 4 are left, 1 of them is the
     * share's: hint the best 3, 5 0 2 */
    uint32_t *hm = NULL; /* mapped: [0] seq, [1] layer, [2] n, [4..] ids */
    int32_t *quota = NULL; /* device: [0] the share, [1] the hint counter, [2..] the device list */
    int32_t last[1 + TDM_GPU_HINT_MAX];
    assert_int_equal(tdm_gpu_alloc_host(g, 64 * sizeof(uint32_t), (void **)&hm, &err), TDM_OK);
    assert_int_equal(tdm_gpu_alloc(g, (2 + 1 + TDM_GPU_HINT_MAX) * sizeof(int32_t), (void **)&quota, &err), TDM_OK);
    memset(hm, 0xee, 64 * sizeof(uint32_t));
    hm[0] = 0;
    const int32_t one = 1, p6[6] = {3, 1, 5, 0, 2, 6};
    assert_int_equal(tdm_gpu_upload(g, quota, &one, sizeof one, &err), TDM_OK);
    assert_int_equal(tdm_gpu_memset(g, quota + 1, 0, sizeof(int32_t), &err), TDM_OK);
    int32_t *pred6 = NULL;
    assert_int_equal(tdm_gpu_alloc(g, sizeof p6, (void **)&pred6, &err), TDM_OK);
    assert_int_equal(tdm_gpu_upload(g, pred6, p6, sizeof p6, &err), TDM_OK);
    tdm_gpu_prefetch ph = pf;
    ph.n = 1;
    ph.hint_seq = hm;
    ph.hint_layer = (int32_t *)hm + 1;
    ph.hint_n = (int32_t *)hm + 2;
    ph.hint_ids = (int32_t *)hm + 4;
    ph.hint_max = 8;
    ph.quota = quota;
    ph.hints = (uint32_t *)(quota + 1);
    ph.last = quota + 2;
    assert_int_equal(tdm_gpu_prefetch_stage(g, &ph, 1, -1, pred6, 6, &err), TDM_OK);
    assert_int_equal(tdm_gpu_sync(g, &err), TDM_OK);
    assert_int_equal(hm[0], 1);
    assert_int_equal((int32_t)hm[1], 1);
    assert_int_equal((int32_t)hm[2], 3);
    assert_int_equal((int32_t)hm[4], 5);
    assert_int_equal((int32_t)hm[5], 0);
    assert_int_equal((int32_t)hm[6], 2);
    assert_int_equal(hm[7], 0xeeeeeeeeu); /* nothing past n */
    assert_int_equal(tdm_gpu_download(g, last, ph.last, sizeof last, &err), TDM_OK);
    assert_int_equal(last[0], 3);
    assert_true(last[1] == 5 && last[2] == 0 && last[3] == 2);
    /* at most 2 ids, no share (quota NULL): 5 0 */
    ph.hint_max = 2;
    ph.quota = NULL;
    assert_int_equal(tdm_gpu_prefetch_stage(g, &ph, 1, 1, pred6, 6, &err), TDM_OK);
    assert_int_equal(tdm_gpu_sync(g, &err), TDM_OK);
    assert_int_equal(hm[0], 2);
    assert_int_equal((int32_t)hm[2], 2);
    assert_int_equal((int32_t)hm[4], 5);
    assert_int_equal((int32_t)hm[5], 0);
    /* nothing left for the pool (the first 2 predicted: 1 has a slot, 3 is
     * staged): no hint, an empty device list */
    assert_int_equal(tdm_gpu_prefetch_stage(g, &ph, 1, 1, pred6, 2, &err), TDM_OK);
    assert_int_equal(tdm_gpu_sync(g, &err), TDM_OK);
    assert_int_equal(hm[0], 2);
    assert_int_equal(tdm_gpu_download(g, last, ph.last, sizeof(int32_t), &err), TDM_OK);
    assert_int_equal(last[0], 0);
    assert_int_equal(tdm_gpu_prefetch_stage(g, &ph, -1, 1, NULL, 0, &err), TDM_OK);
    read_back(&fx, got, NULL, NULL);
    memcpy(want, res, sizeof want);
    want[2 * E + 2] = 3;
    assert_memory_equal(got, want, sizeof got); /* layer 1's staged entry cleared again */
    assert_int_equal(hm[0], 2);

    /* the hint alone (tdm_gpu_prefetch_hint), share 1: layer 2 predicted
     * 3 1 5 0 2 6; 2 has a (real) slot, 3 would take the spare one, 1 5 0 6
     * are left, 1 of them is the share's: hint 1 5 0, stage nothing */
    ph.hint_max = 8;
    ph.quota = quota;
    assert_int_equal(tdm_gpu_prefetch_hint(g, &ph, 2, pred6, 6, &err), TDM_OK);
    read_back(&fx, got, st, NULL);
    assert_memory_equal(got, want, sizeof got); /* no entry set */
    stage_row(st + 2 * NS, 3, 5, 0);            /* layer 2's row as the last staging left it */
    assert_int_equal(hm[0], 3);
    assert_int_equal((int32_t)hm[1], 2);
    assert_int_equal((int32_t)hm[2], 3);
    assert_true((int32_t)hm[4] == 1 && (int32_t)hm[5] == 5 && (int32_t)hm[6] == 0);
    assert_int_equal(tdm_gpu_download(g, last, ph.last, sizeof last, &err), TDM_OK);
    assert_true(last[0] == 3 && last[1] == 1 && last[2] == 5 && last[3] == 0);
    /* then the staging from the same prediction without the hint (no
     * hint_seq): 3 staged, no second hint, the device list kept */
    tdm_gpu_prefetch quiet = ph;
    quiet.hint_seq = NULL;
    assert_int_equal(tdm_gpu_prefetch_stage(g, &quiet, 2, -1, pred6, 6, &err), TDM_OK);
    read_back(&fx, got, st, NULL);
    want[2 * E + 3] = BASE;
    assert_memory_equal(got, want, sizeof got);
    assert_int_equal(st[2 * NS], 3);
    assert_int_equal(hm[0], 3);
    assert_int_equal(tdm_gpu_download(g, last, ph.last, sizeof last, &err), TDM_OK);
    assert_true(last[0] == 3 && last[1] == 1 && last[2] == 5 && last[3] == 0);
    assert_int_equal(tdm_gpu_prefetch_stage(g, &quiet, -1, 2, NULL, 0, &err), TDM_OK);
    read_back(&fx, got, NULL, NULL);
    want[2 * E + 3] = -1;
    assert_memory_equal(got, want, sizeof got);
    /* it needs a hint to publish and a layer */
    assert_int_equal(tdm_gpu_prefetch_hint(g, &quiet, 2, pred6, 6, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_gpu_prefetch_hint(g, &ph, -1, pred6, 6, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_gpu_prefetch_hint(g, &ph, 2, NULL, 6, &err), TDM_ERR_INVALID);
    assert_int_equal(hm[0], 3);

    /* the staged direct share (tdm_gpu_direct_stage) in the same 3 spare
     * slots, share 2: layer 1's selections 1 3 5 0 (1 has a slot) stage the
     * first 2 misses, 3 and 5, in that order; 0 is the pool's */
    tdm_gpu_prefetch ds = pf;
    ds.quota = quota;
    const int32_t two = 2, eight = 8, zero = 0, s1[K] = {1, 3, 5, 0}, s2[K] = {6, 9, 4, 0};
    int32_t base_res[NL * E];
    memcpy(base_res, res, sizeof base_res);
    base_res[2 * E + 2] = 3; /* the real slot given above */
    assert_int_equal(tdm_gpu_upload(g, quota, &two, sizeof two, &err), TDM_OK);
    assert_int_equal(tdm_gpu_upload(g, pred, s1, sizeof s1, &err), TDM_OK);
    assert_int_equal(tdm_gpu_memset(g, spare, 0xab, NS * slot, &err), TDM_OK);
    assert_int_equal(tdm_gpu_direct_stage(g, &ds, 1, -1, pred, K, &src, &tab, &err), TDM_OK);
    read_back(&fx, got, st, sp);
    memcpy(want, base_res, sizeof want);
    want[1 * E + 3] = BASE, want[1 * E + 5] = BASE + 1;
    assert_memory_equal(got, want, sizeof got);
    stage_row(st + 1 * NS, 3, 5, -1);
    assert_memory_equal(sp + goff, hgate + 3 * gb, gb);
    assert_memory_equal(sp + uoff, hup + 3 * ub, ub);
    assert_memory_equal(sp + slot + doff, hdown + 5 * db, db);
    for (size_t b = 0; b < slot; b++) /* spare slot 2 untouched */
        assert_int_equal(sp[2 * slot + b], 0xab);
    /* layer 2, clearing layer 1, a share over the misses: 6, 9 (out of
     * range: a miss, never staged) and 0 miss, 4 has a slot */
    assert_int_equal(tdm_gpu_upload(g, quota, &eight, sizeof eight, &err), TDM_OK);
    assert_int_equal(tdm_gpu_upload(g, pred, s2, sizeof s2, &err), TDM_OK);
    assert_int_equal(tdm_gpu_direct_stage(g, &ds, 2, 1, pred, K, &src, &tab, &err), TDM_OK);
    read_back(&fx, got, st, sp);
    memcpy(want, base_res, sizeof want);
    want[2 * E + 6] = BASE, want[2 * E + 0] = BASE + 1;
    assert_memory_equal(got, want, sizeof got);
    stage_row(st + 2 * NS, 6, 0, -1);
    assert_memory_equal(sp + doff, hdown + 6 * db, db);
    assert_memory_equal(sp + slot + goff, hgate, gb);
    /* share 0 stages nothing (layer 2 cleared); then clear only */
    assert_int_equal(tdm_gpu_upload(g, quota, &zero, sizeof zero, &err), TDM_OK);
    assert_int_equal(tdm_gpu_upload(g, pred, s1, sizeof s1, &err), TDM_OK);
    assert_int_equal(tdm_gpu_direct_stage(g, &ds, 1, 2, pred, K, &src, &tab, &err), TDM_OK);
    read_back(&fx, got, st, NULL);
    assert_memory_equal(got, base_res, sizeof got);
    stage_row(st + 1 * NS, -1, -1, -1);
    assert_int_equal(tdm_gpu_direct_stage(g, &ds, -1, 1, NULL, 0, NULL, NULL, &err), TDM_OK);
    read_back(&fx, got, NULL, NULL);
    assert_memory_equal(got, base_res, sizeof got);
    /* it needs the share's quota and takes no hint */
    ds.quota = NULL;
    assert_int_equal(tdm_gpu_direct_stage(g, &ds, 1, -1, pred, K, &src, &tab, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_gpu_direct_stage(g, &ph, 1, -1, pred, K, &src, &tab, &err), TDM_ERR_INVALID);

    /* bad arguments */
    assert_int_equal(tdm_gpu_prefetch_stage(g, &pf, 1, -1, NULL, K, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_gpu_prefetch_stage(g, &pf, 1, -1, pred, 33, &err), TDM_ERR_INVALID);
    tdm_gpu_expert_table small = tab;
    small.slot_bytes = slot - 16;
    assert_int_equal(tdm_gpu_prefetch_copy(g, &pf, 1, &src, &small, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_gpu_prefetch_copy(g, &pf, 1, NULL, &tab, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_gpu_prefetch_copy(g, &pf, -1, &src, &tab, &err), TDM_ERR_INVALID);
    tdm_gpu_prefetch none = pf;
    none.n = 0;
    assert_int_equal(tdm_gpu_prefetch_stage(g, &none, 1, -1, pred, K, &err), TDM_ERR_INVALID);
    ph.hint_ids = NULL;
    assert_int_equal(tdm_gpu_prefetch_stage(g, &ph, 1, -1, pred, K, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_gpu_sync(g, &err), TDM_OK);

    free(sp);
    tdm_gpu_host_unregister(g, hostw);
    tdm_gpu_free(g);
    free(hostw);
}

/* ---- micro f32 models ---- */

static void micro(const char *name)
{
    fx_micro mc;
    fx_micro_open(&mc, name);
    const cJSON *p = cJSON_GetObjectItem(cJSON_GetObjectItem(mc.ref, "prompts"), "long");
    int32_t tok[512];
    const int n = fx_ints(cJSON_GetObjectItem(p, "tokens"), tok, 512), np = n - 6;
    assert_true(np > 1);
    baseline b = make_baseline(mc.m, tok, np, n, mc.hp->n_vocab);
    const hyb_case cases[] = {{FULL, 1, -1, 0, -1}, {0, 1, -1, 0, -1},   {HALF, 1, -1, 0, -1},
                              {HALF, 2, TDM_CACHE_LRU, 0, -1}, {0, 2, -1, 0, 2}, {HALF, 1, -1, 0, 2},
                              {HALF, 1, -1, 0, -1, 2}, {0, 1, -1, 0, -1, 1000}, {HALF, 1, -1, 0, -1, -1},
                              {HALF, 1, -1, 0, -1, 0, 3}, {HALF, 2, -1, 0, -1, 2, 2}, {HALF, 1, -1, 0, 2, 2},
                              {0, 2, -1, 0, 2, 0, 2}, {HALF, 1, -1, 0, 2, 0, 0, 3}, {0, 2, -1, 0, 2, 0, 2, 4}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        check_case(name, mc.m, tok, np, n, &b, &cases[i], true, NULL);
    free_baseline(&b);
    fx_micro_close(&mc);
}

static void test_micro_qwen3moe(void **state)
{
    (void)state;
    gm_need_gpu();
    micro("micro-qwen3moe");
}

static void test_micro_qwen35moe(void **state)
{
    (void)state;
    gm_need_gpu();
    micro("micro-qwen35moe");
}

static void test_micro_qwen3next(void **state)
{
    (void)state;
    gm_need_gpu();
    micro("micro-qwen3next");
}

/* ---- quantised: small-qwen35moe Q4_K_M and the demo model ---- */

static void test_small_q4km(void **state)
{
    (void)state;
    gm_need_gpu();
    char dir[1024];
    cJSON *ref = NULL;
    tdm_model *m = gm_small_q4km(&ref, dir, sizeof dir);
    const cJSON *p = cJSON_GetObjectItem(cJSON_GetObjectItem(ref, "prompts"), "long");
    int32_t tok[512];
    const int n = fx_ints(cJSON_GetObjectItem(p, "tokens"), tok, 512), np = n - 8;
    baseline b = make_baseline(m, tok, np, n, tdm_model_hparams(m)->n_vocab);
    const hyb_case cases[] = {{FULL, 2, -1, 0, -1}, {0, 2, -1, 0, -1}, {HALF, 2, -1, 0, -1}, {0, 2, -1, 0, 2},
                              {HALF, 2, -1, 0, 2}, {FULL, 2, -1, 0, 2}, {HALF, 2, -1, 0, -1, 2},
                              {0, 2, -1, 0, -1, -1}, {HALF, 2, -1, 0, -1, 0, 4}, {HALF, 2, -1, 0, -1, -1, 2},
                              {HALF, 2, -1, 0, 2, -1}, {HALF, 2, -1, 0, 2, 0, 0, 9}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        check_case("small", m, tok, np, n, &b, &cases[i], false, NULL);
    free_baseline(&b);
    tdm_model_free(m);
    cJSON_Delete(ref);
}

/* Each peer-greedy prompt with llama.cpp's greedy tokens appended, prompt as
 * a batch, continuation as decode steps: layer order at 0/50/100%, the
 * adaptive policy re-planning every 4 tokens, a pool of every core. */
static void test_demo(void **state)
{
    (void)state;
    gm_need_gpu();
    cJSON *pg = NULL;
    tdm_model *m = gm_demo(&pg);
    tdm_topology *topo = NULL;
    tdm_error err = {0};
    assert_int_equal(tdm_topology_load(&topo, &err), TDM_OK);
    const int cores = tdm_topology_physical_cores(topo);
    const hyb_case cases[] = {{FULL, 0, -1, 0, -1},
                              {0, 0, -1, 0, -1},
                              {HALF, 0, -1, 0, -1},
                              {HALF, 0, TDM_CACHE_ADAPTIVE, 4, -1},
                              {HALF, cores, -1, 0, -1},
                              {0, 0, -1, 0, 2},
                              {HALF, 0, TDM_CACHE_ADAPTIVE, 4, 2},
                              {HALF, 0, -1, 0, -1, 3},
                              {0, 0, -1, 0, -1, 1000},
                              {HALF, 0, TDM_CACHE_ADAPTIVE, 4, -1, -1},
                              {HALF, 0, -1, 0, -1, 0, 2},
                              {HALF, 0, TDM_CACHE_ADAPTIVE, 4, -1, -1, 2},
                              {HALF, 0, -1, 0, 2, 0, 2},
                              {HALF, 0, -1, 0, 2, 0, 0, 3}};
    int done = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(pg, "cases"))
    {
        if (done == (gm_sanitized() ? 1 : 2)) /* two prompts keep the test short; each runs every case */
            break;
        int32_t tok[1024];
        const int np = fx_ints(cJSON_GetObjectItem(c, "prompt_tokens"), tok, 512);
        int ng = fx_ints(cJSON_GetObjectItem(c, "greedy_tokens"), tok + np, 512);
        if (gm_sanitized() && ng > 8)
            ng = 8; /* the same kernels on fewer decode steps: racecheck serialises them */
        const int n = np + ng - 1;
        baseline b = make_baseline(m, tok, np, n, tdm_model_hparams(m)->n_vocab);
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
            check_case("demo", m, tok, np, n, &b, &cases[i], false, topo);
        free_baseline(&b);
        done++;
    }
    assert_int_equal(done, gm_sanitized() ? 1 : 2);
    tdm_topology_free(topo);
    tdm_model_free(m);
    cJSON_Delete(pg);
}

/* A budget that has room for every expert but not also for the prompt
 * scratch: the prompt borrows the arena's last slots for it (their experts
 * miss meanwhile, the pool or the stream computes them) and copies them back
 * before it returns; decode steps run on the whole cache. The prompt as a
 * pool batch, streamed, and with the direct share and the adaptive policy. */
static void test_prompt_loan(void **state)
{
    (void)state;
    gm_need_gpu();
    cJSON *pg = NULL;
    tdm_model *m = gm_demo(&pg);
    tdm_error err = {0};
    assert_int_equal(tdm_model_copy_experts(m, NULL, &err), TDM_OK); /* the copies back read it */
    /* the first case's prompt and greedy tokens: all but the last 8 as the
     * prompt batch (longer than a matvec batch), those 8 as decode steps */
    const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(pg, "cases"), 0);
    int32_t tok[1024];
    const int n0 = fx_ints(cJSON_GetObjectItem(c, "prompt_tokens"), tok, 512);
    const int n = n0 + fx_ints(cJSON_GetObjectItem(c, "greedy_tokens"), tok + n0, 512) - 1, np = n - 8;
    assert_true(np > TDM_GPU_MATVEC_MAX_TOK);
    baseline b = make_baseline(m, tok, np, n, tdm_model_hparams(m)->n_vocab);
    /* the budget: what the forward holds with every expert cached, less its
     * prompt scratch and an eighth of the experts */
    const int32_t all = moe_layers(m) * tdm_model_hparams(m)->n_expert;
    const hyb_case held = {FULL, 1, -1, 0, -1, 0, 2};
    tdm_forward_gpu *f = open_hybrid(m, n + 1, &held, NULL);
    assert_int_equal(tdm_forward_gpu_loan_slots(f), 0);
    const uint64_t budget = tdm_forward_gpu_bytes(f) - tdm_forward_gpu_prompt_scratch_bytes(f) -
                            (uint64_t)(all / 8) * tdm_expert_cache_slot_bytes_for(m);
    printf("  held: %.2f MiB with %.2f MiB of prompt scratch; budget %.2f MiB\n",
           (double)tdm_forward_gpu_bytes(f) / 1048576.0, (double)tdm_forward_gpu_prompt_scratch_bytes(f) / 1048576.0,
           (double)budget / 1048576.0);
    tdm_forward_gpu_free(f);
    const hyb_case cases[] = {{LOAN, 1, -1, 0, -1, 0, 2, 0, budget},
                              {LOAN, 1, -1, 0, 2, 0, 2, 0, budget},
                              {LOAN, 1, -1, 0, -1, -1, 2, 0, budget},
                              {LOAN, 1, TDM_CACHE_ADAPTIVE, 4, -1, -1, 2, 0, budget}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        check_case("loan", m, tok, np, n, &b, &cases[i], false, NULL);
    free_baseline(&b);
    tdm_model_free(m);
    cJSON_Delete(pg);
}

/* A budget below the non-expert part is refused before anything runs; one
 * just above it leaves few or no slots and still runs, and the forward's
 * ledger then holds the fixed part as allocated, to the byte. */
static void test_budget(void **state)
{
    (void)state;
    gm_need_gpu();
    char path[1200];
    snprintf(path, sizeof path, "%s/models/demo/demo-Q4_K_M.gguf", fx_root());
    tdm_model *m = gm_load(path);
    tdm_executor_params xp;
    tdm_executor_params_init(&xp);
    xp.gpu_mem = 1 << 20;
    xp.n_threads = 1;
    tdm_forward_gpu *f = NULL;
    tdm_error err = {0};
    assert_int_equal(tdm_forward_gpu_new_hybrid(m, 0, 256, 64, &xp, &f, &err), TDM_ERR_OOM);
    printf("  1 MiB: %s\n", err.msg);
    assert_null(f);
    tdm_budget b;
    assert_int_equal(tdm_budget_plan(m, 256, 64, (uint64_t)64 << 30, &b, &err), TDM_OK);
    xp.gpu_mem = b.fixed_bytes + (b.fixed_bytes >> 2); /* the fixed part + 25%: real allocations decide the slots */
    tdm_status st = tdm_forward_gpu_new_hybrid(m, 0, 256, 64, &xp, &f, &err);
    gm_race_safe(f);
    if (st)
        printf("  fixed + 25%%: %s\n", err.msg);
    assert_int_equal(st, TDM_OK);
    tdm_executor_stats s;
    tdm_executor_get_stats(tdm_forward_gpu_executor(f), &s);
    printf("  budget %.1f MiB (fixed %.1f MiB): %d slots of %.2f MiB, %.1f MiB on the device\n",
           (double)xp.gpu_mem / 1048576.0, (double)b.fixed_bytes / 1048576.0, s.n_slots,
           (double)s.slot_bytes / 1048576.0, (double)tdm_forward_gpu_bytes(f) / 1048576.0);
    assert_true(tdm_forward_gpu_bytes(f) <= xp.gpu_mem);
    /* the ledger planned again over what was allocated: exact, and every slot it leaves is used */
    const tdm_budget *fb = tdm_forward_gpu_budget(f);
    assert_non_null(fb);
    assert_int_equal(fb->in.weight_bytes, tdm_forward_gpu_weight_bytes(f));
    assert_int_equal(fb->fixed_bytes + fb->slot_total, tdm_forward_gpu_bytes(f));
    assert_int_equal(fb->fixed_bytes + fb->slot_total + fb->spare, xp.gpu_mem);
    assert_true(fb->spare < fb->in.slot_bytes || fb->n_slots == fb->in.max_slots);
    assert_int_equal(s.n_slots, fb->n_slots);
    const int32_t tok[4] = {1, 2, 3, 4};
    float *lg = malloc((size_t)tdm_model_hparams(m)->n_vocab * sizeof(float));
    assert_int_equal(tdm_forward_gpu_eval(f, tok, 4, 0, lg, false, &err), TDM_OK);
    assert_int_equal(tdm_forward_gpu_eval(f, tok, 1, 4, lg, false, &err), TDM_OK);
    free(lg);
    tdm_forward_gpu_free(f);
    tdm_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_micro_qwen3moe), cmocka_unit_test(test_micro_qwen35moe),
        cmocka_unit_test(test_micro_qwen3next), cmocka_unit_test(test_small_q4km),
        cmocka_unit_test(test_demo),           cmocka_unit_test(test_budget),
        cmocka_unit_test(test_prompt_loan),
        cmocka_unit_test(test_direct_needs_copy), cmocka_unit_test(test_prefetch_kernels),
    };
    gm_filter();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
