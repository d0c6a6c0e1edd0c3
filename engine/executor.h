/* executor: the hybrid per-layer MoE schedule (DESIGN.md §1), CPU half.
 *
 * Per MoE layer, for the n tokens of a batch with their top-k ids/weights:
 *   1. split the selections with the residency table (expert cache): hit ->
 *      (token, slot, weight), miss -> left to the pool;
 *   2. if anything missed: publish x and the top-k into the pool's mailbox
 *      (pool.h); the pool computes the misses from the mmapped weights;
 *   3. at the same time the device side computes the hits from the slot arena
 *      (the cached copies, not the file); in this CPU-only emulation on the
 *      calling thread with its own small OpenMP team (dev_threads, default 1)
 *      so the pool's pinned team keeps its cores;
 *   4. wait for the pool's flag and merge out = routed(hit) + routed(miss);
 *      the forward then adds the shared expert.
 * After the last MoE layer of a pass (between tokens) the pass's routing is
 * fed to the cache policy, whose swaps are executed as slot copies. The real GPU keeps this schedule and
 * protocol (docs/EXECUTOR.md); only step 3 and the publish move to CUDA.
 *
 * Ownership: borrows the model (and the profile/topology during new); owns
 * the expert cache, the pool and all buffers, sized at creation for
 * max_batch tokens. Never allocates per token. One thread at a time.
 */
#ifndef TDM_EXECUTOR_H
#define TDM_EXECUTOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cache_policy.h"
#include "expert_cache.h"
#include "forward.h"
#include "model.h"
#include "pool.h"
#include "profile.h"
#include "status.h"
#include "topology.h"

#define TDM_PREFETCH_DEFAULT 2

typedef struct tdm_executor_params {
    int32_t n_slots;              /* expert slots; -1: as many as gpu_mem allows (ledger) */
    uint64_t gpu_mem;             /* VRAM budget in bytes for the ledger (with n_slots -1) */
    int32_t n_ctx;                /* positions (ledger: KV cache) */
    int32_t max_batch;            /* tokens per forward batch (buffers, ledger scratch) */
    int policy;                   /* tdm_cache_policy, or -1: static with a profile, layer without */
    const tdm_profile *profile;   /* NULL: the layer fill (whole layers, even ones first) */
    bool per_layer;               /* slots split evenly over layers (cache_policy.h "Budget") */
    const tdm_topology *topo;     /* NULL: pool not pinned */
    int n_threads;                /* pool threads; 0: physical cores - 1 */
    int dev_threads;              /* emulated device-side threads; 0: 1 */
    int32_t adapt_every;          /* 0: the policy default */
    int32_t adapt_swaps;          /* -1: the policy default */
    float adapt_decay;            /* 0: the policy default */
    tdm_profile *learn;           /* NULL, or every pass's routing is added to it (--profile-save); borrowed */
    int32_t stream_min;           /* GPU prompt batches of at least this many tokens stream the experts the
                                   * cache lacks to the GPU instead of the pool computing them
                                   * (forward_gpu.h); 0: TDM_STREAM_MIN_DEFAULT, -1: never */
    int32_t direct;               /* the direct share: misses per MoE launch the device reads itself from
                                   * host memory (zero-copy, gpu.h tdm_gpu_direct_experts) while the pool
                                   * computes the rest; -1: adapted after every GPU step (the emulation
                                   * then takes none), 0: none, N: N (the emulation too) */
    int32_t prefetch;             /* GPU decode: spare slots that take each layer's predicted misses while
                                   * its attention runs (forward_gpu.c, docs/EXECUTOR.md "Prefetch"); -1:
                                   * TDM_PREFETCH_DEFAULT, 0: none. Needs the direct share's registered
                                   * memory; the emulation takes none */
    int32_t pool_warm;            /* GPU decode with a prefetch: the pool reads the predicted misses left
                                   * to it into its caches before their job (pool.h "Warm-up"); -1: on
                                   * (the default), 0: off, 1: on */
    const tdm_expert_device *dev; /* NULL: host memory */
    /* The pool's mailbox memory (pool.h); NULL: the C heap. The GPU passes
     * mapped page-locked memory. */
    void *(*mem_alloc)(void *ctx, size_t bytes);
    void (*mem_free)(void *ctx, void *ptr);
    void *mem_ctx;
} tdm_executor_params;

typedef struct tdm_executor_stats {
    int64_t tokens;               /* token positions through the first MoE layer */
    int64_t layers;               /* MoE layer calls */
    int64_t hits, misses;         /* selections */
    int64_t direct;               /* misses the device read from host memory (the direct share) */
    uint64_t direct_bytes;        /* expert weight bytes it read that way */
    int64_t prefetched;           /* misses served by the device's prefetch (a miss of the cache) */
    uint64_t prefetched_bytes;    /* their expert bytes */
    int64_t prefetch_staged;      /* experts it prefetched, used or not */
    uint64_t prefetch_bytes;      /* their bytes (all read from host memory) */
    int32_t direct_quota;         /* the share now (-1 in params: adapted) */
    int64_t pool_wakes;           /* layer calls published to the pool */
    double pool_ms, wait_ms, dev_ms; /* pool compute; device waiting for the pool; device time (emulation:
                                        the hit compute; GPU: the whole steps) */
    uint64_t pool_bytes;          /* weight bytes the pool read */
    int64_t warms, warm_cut;      /* the pool's warm-ups, and those a job cut short */
    uint64_t warm_bytes;          /* bytes they read */
    int64_t streamed_layers;      /* MoE layer calls of batches that streamed their misses to the GPU */
    uint64_t stream_bytes;        /* expert bytes those batches sent to the GPU */
    int64_t swaps;
    uint64_t bytes_moved;         /* slot copies after the fill */
    int64_t loans;                /* prompts that borrowed slots as scratch (forward_gpu.h) */
    uint64_t bytes_reclaimed;     /* bytes copied back into them afterwards */
    int32_t n_slots;
    size_t slot_bytes;
    int pool_threads;
} tdm_executor_stats;

typedef struct tdm_executor tdm_executor;

void tdm_executor_params_init(tdm_executor_params *p);
tdm_status tdm_executor_new(const tdm_model *m, const tdm_executor_params *p, tdm_executor **out, tdm_error *err);
void tdm_executor_free(tdm_executor *x);

/* Makes f run its routed experts through x (tdm_forward_set_moe_backend). */
void tdm_executor_attach(tdm_executor *x, tdm_forward *f);
/* The backend function (tdm_forward_moe_fn; user = the executor). */
tdm_status tdm_executor_moe(void *user, int32_t layer, const float *x, int32_t n, int32_t k, const int32_t *ids,
                            const float *weights, float *out, tdm_error *err);
/* Feeds the routing of the last pass to the policy and executes its swaps. */
tdm_status tdm_executor_flush(tdm_executor *x, tdm_error *err);

/* ---- a real GPU as the device side (engine/forward_gpu.c) ----
 * The GPU publishes to and merges from the pool itself (gpu_handoff.h), so
 * the executor sees a pass only afterwards: */
/* Before a step: publishes slot copies that have landed and reports a pool
 * failure of the previous step. *version: the residency table's version
 * (re-upload the device mirror when it changed). */
tdm_status tdm_executor_gpu_begin(tdm_executor *x, uint64_t *version, tdm_error *err);
/* A GPU batch that streamed its misses (forward_gpu.h): its MoE layer calls
 * and the bytes sent, for the statistics. */
void tdm_executor_gpu_streamed(tdm_executor *x, int64_t layers, uint64_t bytes);
/* After a step of n tokens: ids [n_layer] slabs layer_stride ints apart, each
 * [n][k] (only MoE layers are read). Counts hits and misses against the
 * table the step ran with, feeds the policy, starts its slot copies. dev_ms:
 * the step's GPU time; wait_ms: the GPU's time waiting for the pool; direct:
 * the direct share the step's launches ran with (-1: they read no host
 * memory, e.g. a prompt batch); an adapted share takes its next value.
 * staged: [n_layer][n_staged] the experts the step prefetched into spare
 * slots (-1: none; NULL when it prefetched nothing): misses it served. */
tdm_status tdm_executor_gpu_end(tdm_executor *x, const int32_t *ids, size_t layer_stride, int32_t n, double dev_ms,
                                double wait_ms, int32_t direct, const int32_t *staged, int32_t n_staged,
                                tdm_error *err);
/* The direct share for the next GPU step (0 when params.direct is 0). */
int32_t tdm_executor_direct_quota(const tdm_executor *x);
/* The adapting share (params.direct -1), on its own for tests: probe and
 * settle on the step time. A window is TDM_DIRECT_WINDOW steps that had
 * misses; its mean GPU time per token includes the wait for the pool, so it
 * weighs both sides as they are, hand-off latency included. From `start` the
 * tuner measures a window at the share, one at the share + 1, one at the
 * share - 1 (those within 0..q_max) and one at the share again, and moves to
 * the fastest neighbour if it beats that last window. The share's first
 * window only leads in: after a prompt it runs slow (the lent slots copy
 * back; H200 host, 12 GiB: 5.0-6.3 ms per token against 4.8-5.3 settled),
 * and compared with it a worse neighbour won in one run of four; the better
 * of both windows, the other choice, is biased low and kept the share where
 * a neighbour was better (bench/results/hybrid-h200-session29-ab.txt). When
 * the share moved it probes again around the new one; otherwise it stays for
 * TDM_DIRECT_SETTLE windows, then probes again (a change of load is
 * followed), each probe after a stay that keeps the share doubling the stay
 * up to TDM_DIRECT_SETTLE_MAX windows (a neighbour's window runs ~10%
 * slower). Staying put between probes matters: the best share can be
 * sharply better than its neighbours (H200 host, 12 GiB: 141 tok/s at 3 of
 * the 6 misses a prefetch of 2 leaves, 125-128 at 2 or 4), so a climber that
 * always moves loses to a fixed share. A neighbour takes over only when its
 * window is TDM_DIRECT_MARGIN faster than the share's: windows of 4 steps
 * differ by more than neighbouring shares near the best one do (a packed
 * cache at 12 GiB settled at 2 in two of three runs, 165-167 tok/s against
 * 174 at 3; bench/results/hybrid-h200-session20-ab.txt). */
enum { TDM_DIRECT_WINDOW = 4, TDM_DIRECT_SETTLE = 16, TDM_DIRECT_SETTLE_MAX = 64 };
#define TDM_DIRECT_MARGIN 0.02
typedef struct tdm_direct_tuner {
    int32_t q, q_max;   /* the share now, its largest value (k) */
    int32_t center;     /* the share probed around */
    int32_t phase;      /* measuring center (0), center + 1 (1), center - 1 (2), center (3); 4: settled */
    int32_t n, settled; /* steps in the window; windows since it settled */
    int32_t settle;     /* windows it stays before the next probe */
    double sum;         /* the window's ms per token */
    double ms[4];       /* the probe's means by phase (0: not measured); the lead-in's, ms[0], is not compared */
} tdm_direct_tuner;
/* start: the first share, clamped to 0..k (the executor's: half the misses
 * the prefetch leaves in a layer that misses, (k - prefetch) / 2 when such a
 * layer misses all k: the best share measured on the H200 host both with and
 * without a prefetch). */
void tdm_direct_tuner_init(tdm_direct_tuner *t, int32_t k, int32_t start);
/* Feeds one step (ms per token) and returns the share for the next. */
int32_t tdm_direct_tuner_step(tdm_direct_tuner *t, double ms_per_token);

void tdm_executor_get_stats(const tdm_executor *x, tdm_executor_stats *out);
/* One line for stderr: hit rate, pool/wait/device ms and pool GB/s per token. */
void tdm_executor_format_stats(const tdm_executor *x, char *buf, size_t cap);
tdm_expert_cache *tdm_executor_cache(tdm_executor *x);
tdm_pool *tdm_executor_pool(tdm_executor *x);

#endif
