/* pool: the CPU expert pool of the hybrid executor (DESIGN.md §1 step 3).
 *
 * A persistent team of n_threads pthreads, thread i pinned to physical core i
 * (engine/topology.h), computes the jobs; its thread 0, the driver, waits on a
 * mailbox: the device side (the GPU, or the host emulation) writes one layer's
 * routed activation and top-k ids/weights, then bumps dev_seq (release). The
 * driver sees the bump (acquire), computes the experts that MISS the cache
 * (residency table entry -1) with tdm_experts_run_team on the mmapped weights,
 * the team writing their weighted sum to out; once all are done it stores
 * pool_seq = dev_seq (release). The device side computes the hits meanwhile,
 * waits for pool_seq (acquire) and merges. A layer whose selections all hit
 * is never published: the pool is not woken.
 *
 * Warm-up: between jobs the device may publish a hint (tdm_mailbox.hint_*),
 * the experts of a layer it expects to miss next. While spinning, the driver
 * sees it and the team reads those experts' weights (those without a slot)
 * into its caches, each thread a share, so the job that follows reads them
 * from cache instead of DRAM; a published job cuts the warm-up short within
 * a few microseconds. Reading only: a wrong hint costs bandwidth, never
 * correctness.
 *
 * Waiting: the driver spins `spin` rounds (pause), then sched_yield()s, then
 * sleeps on a futex of dev_seq with a 1 ms timeout (so a publisher that cannot
 * wake it, a GPU kernel, still gets served within a millisecond; a host
 * publisher wakes it at once). The other team threads wait the same way for
 * the driver to start a job; a wake (publish, job start, kick) makes a sleeper
 * spin again, and a kick keeps the team spinning for TDM_POOL_KICK_MS past its
 * rounds. Inside a job the team meets at spinning barriers that fall back
 * to sched_yield, so more threads than cores work, only slower.
 * Layout and ordering: docs/EXECUTOR.md.
 *
 * Ownership: the pool borrows the model, the topology and the residency
 * table; it owns the mailbox buffers (sized for max_tok tokens at creation:
 * for the GPU they will be cudaHostAllocMapped), the scratch and the threads.
 * Nothing is allocated per job. One device-side thread publishes at a time.
 */
#ifndef TDM_POOL_H
#define TDM_POOL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "experts.h"
#include "model.h"
#include "status.h"
#include "topology.h"

/* An id in the mailbox with this bit set is a selection the device holds
 * itself (e.g. an expert it prefetched): the pool skips it, whatever the
 * residency table says; the bit is not part of the id. */
#define TDM_MAILBOX_HELD ((int32_t)1 << 30)

/* Experts one warm-up hint names at most. */
#define TDM_MAILBOX_HINT_MAX 16

/* The shared hand-off block. The flags sit on their own cache lines. */
typedef struct tdm_mailbox {
    _Alignas(64) _Atomic uint32_t dev_seq;   /* device -> pool: number of the job published */
    _Alignas(64) _Atomic uint32_t pool_seq;  /* pool -> device: number of the job finished */
    _Atomic uint32_t pool_sleeping;          /* 1 while the driver sleeps on the futex */
    _Atomic uint32_t stop;                   /* set by tdm_pool_free */
    /* job payload, written before dev_seq is bumped */
    _Alignas(64) int32_t layer;
    int32_t n_tok;                           /* <= max_tok */
    int32_t k;                               /* ids per token (the model's n_expert_used) */
    int32_t *ids;                            /* [max_tok][k] top-k expert ids (| TDM_MAILBOX_HELD) */
    float *weights;                          /* [max_tok][k] their weights */
    float *x;                                /* [max_tok][n_embd] routed activation (normed) */
    int32_t direct;                          /* the first `direct` missed selections (in [t][i] order)
                                              * are the device's own (it reads them from host memory,
                                              * zero-copy); the pool computes the others */
    /* result, written before pool_seq is bumped */
    float *out;                              /* [max_tok][n_embd] sum over the missed experts */
    int32_t n_miss;                          /* selections the pool computed */
    tdm_status status;                       /* TDM_OK or the failure of the job */
    char msg[TDM_ERROR_MSG_MAX];
    /* warm-up hint: experts of hint_layer that the device expects to hand
     * over soon (e.g. predicted by the next layer's router). Written before
     * hint_seq is bumped, possibly while the pool reads an older one: the
     * pool copies it and re-checks hint_seq, and ignores ids out of range. */
    _Alignas(64) _Atomic uint32_t hint_seq;  /* device -> pool: number of the hint published */
    _Atomic int32_t hint_layer, hint_n;      /* hint_n <= TDM_MAILBOX_HINT_MAX */
    _Atomic int32_t hint_ids[TDM_MAILBOX_HINT_MAX];
} tdm_mailbox;

typedef struct tdm_pool_params {
    const tdm_model *model;
    const tdm_topology *topo; /* NULL: threads are not pinned */
    int n_threads;            /* 0: tdm_topology_default_threads (or 1 without a topology); at most
                               * TDM_EXPERTS_MAX_TEAM */
    int32_t max_tok;          /* tokens per job */
    int spin;                 /* pause rounds before yielding; 0: 20000 */
    /* Where the mailbox (flags and payload) lives; NULL: the C heap. The GPU
     * passes mapped page-locked memory, which its kernels read and write
     * directly (gpu_handoff.h). Returns NULL when out of memory. */
    void *(*mem_alloc)(void *ctx, size_t bytes);
    void (*mem_free)(void *ctx, void *ptr);
    void *mem_ctx;
} tdm_pool_params;

typedef struct tdm_pool_stats {
    int64_t jobs;             /* layers the pool computed */
    int64_t misses;           /* selections computed */
    double ms;                /* time inside the jobs */
    uint64_t bytes;           /* expert weight bytes read (each distinct expert once per job) */
    int64_t warms;            /* hints acted on: the team read their experts into its caches */
    int64_t warm_cut;         /* of which a job cut short */
    uint64_t warm_bytes;      /* bytes read by the warm-ups */
    int64_t copies;           /* tdm_pool_copy jobs, counted apart */
    uint64_t copy_bytes;
    double copy_ms;
} tdm_pool_stats;

/* One piece of a copy job. */
typedef struct tdm_copy_piece {
    void *dst;
    const void *src;
    size_t bytes;
} tdm_copy_piece;

typedef struct tdm_pool tdm_pool;

/* Starts the team (the driver and n_threads - 1 workers). residency may be set
 * later (NULL: all miss). */
tdm_status tdm_pool_new(const tdm_pool_params *p, tdm_pool **out, tdm_error *err);
/* Stops and joins the team; the mailbox is freed. */
void tdm_pool_free(tdm_pool *p);

int tdm_pool_threads(const tdm_pool *p);
/* Whether every team thread got pinned (false without a topology). */
bool tdm_pool_pinned(const tdm_pool *p);
tdm_mailbox *tdm_pool_mailbox(tdm_pool *p);
/* [n_layer * n_expert] slot or -1, read by the driver during jobs; change it
 * only while no job is outstanding. */
void tdm_pool_set_residency(tdm_pool *p, const int32_t *residency);

/* Device side: the payload is written; publishes it and returns the job's seq. */
uint32_t tdm_pool_publish(tdm_pool *p);
/* Device side: waits until job seq is done (spin, then yield); adds the time
 * spent waiting to *wait_ms when not NULL. Returns the job's status (message
 * in err). */
tdm_status tdm_pool_wait(tdm_pool *p, uint32_t seq, double *wait_ms, tdm_error *err);

/* Host side, while no device job is outstanding (the GPU publishes none
 * during the call): the team copies the pieces, cut into 256 KiB blocks taken
 * from one counter so every thread streams, and the call returns when all are
 * done (pieces must not overlap). The forward streams missed experts into
 * page-locked staging this way (forward_gpu.h); the pool's threads are idle
 * then. */
tdm_status tdm_pool_copy(tdm_pool *p, const tdm_copy_piece *pieces, int n, tdm_error *err);

/* The routed experts of layer L as the model holds them (file mapping or
 * tdm_model_copy_experts' copy): what the pool multiplies. */
tdm_experts_desc tdm_pool_layer_desc(const tdm_layer *L);

/* Valid after tdm_pool_wait returned (the counters are the driver's). */
void tdm_pool_get_stats(const tdm_pool *p, tdm_pool_stats *out);

/* For a publisher that never calls tdm_pool_wait (the GPU): the first job
 * that failed since creation, with its message (TDM_OK when none). */
tdm_status tdm_pool_check(const tdm_pool *p, tdm_error *err);
/* Host-side publisher of a warm-up hint (the GPU writes the same fields
 * from a kernel): n ids of layer (at most TDM_MAILBOX_HINT_MAX are kept).
 * Returns the hint's seq. */
uint32_t tdm_pool_hint(tdm_pool *p, int32_t layer, const int32_t *ids, int32_t n);

/* Wakes a sleeping team and keeps it spinning for TDM_POOL_KICK_MS: call
 * before a GPU step, whose kernels cannot wake the futex. Otherwise the first
 * job of a step, when it comes later than the team's spin rounds (layers that
 * hold every expert run first), waits for the 1 ms futex timeout, then for
 * the workers' wake-up. */
#define TDM_POOL_KICK_MS 20
void tdm_pool_kick(tdm_pool *p);

#endif
