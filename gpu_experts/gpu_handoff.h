/* gpu_handoff: the CUDA side of the hybrid executor (docs/EXECUTOR.md).
 *
 * Per MoE layer the GPU hands the experts it does not hold to the CPU pool
 * (cpu_experts/pool.h) through the pool's mailbox, which lives in mapped
 * page-locked host memory (tdm_gpu_alloc_host), and takes the pool's partial
 * sum back, with no host thread involved:
 *
 *   publish  after the router: counts the selections whose expert has no slot
 *            (slot_of -1); if there are more than the GPU reads itself from
 *            host memory (the direct share: *quota of them, when the layer's
 *            launch has direct experts, gpu.h), copies x, ids, weights, layer,
 *            the token count and the share into the mailbox, fences (system
 *            scope) and stores the next job number into dev_seq. Otherwise it
 *            writes nothing and the pool is never woken.
 *   (the fused MoE kernels compute the hits and the direct share meanwhile)
 *   merge    if the layer published a job: spins on pool_seq (volatile loads
 *            of mapped memory) until the pool reports that job, then adds the
 *            pool's out rows into y. A pool that does not answer within the
 *            timeout is counted (TDM_GPU_HANDOFF_TIMEOUTS) and the add is
 *            skipped, so the GPU never hangs; after one timeout no merge
 *            waits again (the forward reports the error at every step).
 *
 * Both are ordinary kernels on the compute stream, so a decode step with
 * hand-offs is still one CUDA graph. The job number and the statistics live
 * in a small device array (`state`, TDM_GPU_HANDOFF_WORDS words) that the
 * caller allocates, zeroes and reads back (tdm_gpu_download) between steps.
 *
 * Decode prefetch (docs/EXECUTOR.md "Prefetch"): while the GPU runs a
 * layer's attention, the experts that the layer's router is predicted to
 * pick and that have no slot are read from host memory into spare slots of
 * the arena, on the side stream (gpu.h), and their residency entries point
 * there; the layer's hand-off and MoE kernels then count them as hits. The
 * publish kernel marks every selection the GPU holds in the ids it writes
 * (id | held_bit), so the pool skips those whatever its own residency says.
 *
 * Also here: the expert-slot device for engine/expert_cache.h (arena in
 * device memory; slot copies staged through page-locked buffers and sent on
 * the context's copy stream, so they overlap decode; poll() reports when the
 * last one has landed).
 *
 * Ownership: the descriptor only points at memory owned by others (the
 * pool's mailbox, the forward's device buffers). The slot device owns its
 * staging buffers and events; the arena is allocated through the context.
 * In builds without CUDA every call returns TDM_ERR_UNSUPPORTED.
 */
#ifndef TDM_GPU_HANDOFF_H
#define TDM_GPU_HANDOFF_H

#include <stddef.h>
#include <stdint.h>

#include "expert_cache.h"
#include "gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Words of the device state array (uint32). */
enum {
    TDM_GPU_HANDOFF_SEQ = 0,      /* last job number published */
    TDM_GPU_HANDOFF_CUR = 1,      /* job of the layer in flight, 0 when it published none */
    TDM_GPU_HANDOFF_WAIT_LO = 2,  /* nanoseconds the merge waited for the pool (uint64, low word) */
    TDM_GPU_HANDOFF_WAIT_HI = 3,
    TDM_GPU_HANDOFF_TIMEOUTS = 4, /* merges that gave up waiting */
    TDM_GPU_HANDOFF_ARRIVED = 5,  /* publish: blocks done (internal) */
    TDM_GPU_HANDOFF_QUOTA = 6,    /* the direct share (int32), written by the caller between steps */
    TDM_GPU_HANDOFF_HINTS = 7,    /* warm-up hints published (tdm_gpu_prefetch) */
    TDM_GPU_HANDOFF_WORDS = 8
};

typedef struct tdm_gpu_handoff {
    /* the mailbox, mapped page-locked host memory (same pointer on both sides) */
    uint32_t *dev_seq;        /* GPU -> pool: job number published */
    const uint32_t *pool_seq; /* pool -> GPU: job number finished */
    int32_t *layer, *n_tok;   /* job header */
    int32_t *direct;          /* job header: leading misses the GPU computes itself */
    int32_t *ids;             /* [max_tok][k] */
    float *weights;           /* [max_tok][k] */
    float *x;                 /* [max_tok][n_embd] */
    const float *out;         /* [max_tok][n_embd] the pool's sum over the missed experts */
    int32_t max_tok, k;
    int64_t n_embd;
    /* device memory */
    const int32_t *slot_of;   /* [n_layer][n_expert] slot or -1 */
    int64_t n_expert;
    const int32_t *quota;     /* device, one int32: the direct share (tdm_gpu_direct_experts.quota);
                               * NULL when no launch reads misses from host memory */
    uint32_t *state;          /* [TDM_GPU_HANDOFF_WORDS], zeroed before the first step */
    int32_t held_bit;         /* or-ed into the published id of a selection the GPU holds (pool.h) */
    double timeout_s;         /* merge gives up after this long (e.g. 30) */
} tdm_gpu_handoff;

/* After the router of `layer`: x [ntok][n_embd] (the routed activation),
 * ids/weights [ntok][k] (device). ntok <= max_tok. direct: the layer's MoE
 * launch reads the first *h->quota misses from host memory (the pool is
 * told to skip them); false: the pool computes every miss.
 * order (NULL: none): the selections in another order, for the layer's MoE
 * launch to read instead of ids/weights and as published: each token's
 * selections of the experts in order->last (device: count, then ids; the
 * prefetch's hint) after its others, so the direct share takes the others
 * and the pool the hinted ones it has warmed. */
typedef struct tdm_gpu_route_order {
    const int32_t *last; /* device [1 + n] */
    int32_t *ids;        /* device [max_tok][k] out */
    float *weights;      /* device [max_tok][k] out */
} tdm_gpu_route_order;

tdm_status tdm_gpu_handoff_publish(tdm_gpu *g, const tdm_gpu_handoff *h, int32_t layer, const float *x,
                                   const int32_t *ids, const float *weights, int32_t ntok, bool direct,
                                   const tdm_gpu_route_order *order, tdm_error *err);

/* After the hit kernels: y[t] += out[t] for t < ntok once the pool has
 * finished the layer's job (nothing when the layer published none). */
tdm_status tdm_gpu_handoff_merge(tdm_gpu *g, const tdm_gpu_handoff *h, float *y, int32_t ntok, tdm_error *err);

/* The decode prefetch's spare slots. Spare slot j (slot base + j of the
 * expert arena) holds, for layer l, expert stage[l * n + j] (-1: none); its
 * residency entry in slot_of is base + j while the layer runs, -1 otherwise. */
typedef struct tdm_gpu_prefetch {
    int32_t *slot_of;    /* device [n_layer][n_expert], the residency mirror (tdm_gpu_handoff's) */
    int64_t n_expert;
    void *spare;         /* device, spare slot 0 (tdm_gpu_slot_device_spare) */
    size_t slot_bytes;
    int32_t base, n;     /* spare slot 0's index in the arena; n >= 1 spare slots */
    int32_t *stage;      /* device [n_layer][n] */
    /* The pool's warm-up hint (pool.h, tdm_mailbox.hint_*: mapped memory;
     * hint_seq NULL: no hints). After staging, the predicted experts that
     * still have no slot are the layer's likely misses; all but *quota of
     * them (the direct share's; quota NULL: 0) are likely the pool's, so the
     * best predicted of those, at most hint_max, go to the pool as a hint
     * (it reads them into its caches while the GPU works) and to `last`,
     * which the layer's publish puts after the other selections
     * (tdm_gpu_handoff_publish): the direct share takes the others. */
    uint32_t *hint_seq;
    int32_t *hint_layer, *hint_n, *hint_ids;
    int32_t hint_max;      /* 1 .. TDM_GPU_HINT_MAX */
    int32_t *last;         /* device [1 + hint_max]: the count, then the hinted ids (0: no hint) */
    const int32_t *quota;  /* device, one int32 (tdm_gpu_handoff.quota) */
    uint32_t *hints;       /* device word counting the hints (state + TDM_GPU_HANDOFF_HINTS) */
} tdm_gpu_prefetch;

/* Most experts one hint names (pool.h TDM_MAILBOX_HINT_MAX). */
#define TDM_GPU_HINT_MAX 16

/* Stages layer's predicted experts: pred [k] (device, best first, e.g. the
 * layer's router over the layer's input) in order, the first n that have
 * no slot get the spare slots; then publishes the pool's hint when p has
 * one and some predicted expert is left for the pool. First it clears the
 * entries layer prev staged (prev < 0: none); layer < 0 only clears.
 * tdm_gpu_prefetch_copy then fills the slots. Launched wherever the caller
 * launches (the side stream); the layer's hand-off and MoE kernels must
 * come after the copy (tdm_gpu_side_join). */
tdm_status tdm_gpu_prefetch_stage(tdm_gpu *g, const tdm_gpu_prefetch *p, int32_t layer, int32_t prev,
                                  const int32_t *pred, int32_t k, tdm_error *err);
/* The hint alone, early: what tdm_gpu_prefetch_stage(g, p, layer, .., pred,
 * k) would publish to the pool and write to p->last, from the residency
 * as it is now, with no entry cleared or set and no stage row written
 * (layer >= 0; p must have hint_seq). For a prediction made while other
 * staged entries are still in use: the staging follows later from the same
 * pred, by tdm_gpu_prefetch_stage with hint_seq NULL in p (no second hint;
 * p->last stays). */
tdm_status tdm_gpu_prefetch_hint(tdm_gpu *g, const tdm_gpu_prefetch *p, int32_t layer, const int32_t *pred,
                                 int32_t k, tdm_error *err);
/* Copies the matrices of the experts the last stage of layer (>= 0) gave
 * spare slots from src (registered host memory) to the slots at table's
 * offsets, over PCIe, after whatever the launching stream ran before. */
tdm_status tdm_gpu_prefetch_copy(tdm_gpu *g, const tdm_gpu_prefetch *p, int32_t layer,
                                 const tdm_gpu_direct_experts *src, const tdm_gpu_expert_table *table,
                                 tdm_error *err);

/* The direct share of a one-token launch, staged: after the layer's publish
 * (which counted the misses on the table before this), gives the first
 * *p->quota selections of ids [k] without a slot, in that order (the
 * pool's and the MoE kernels' count), p's spare slots, at most p->n, and
 * copies their matrices from src over PCIe with the GPU to itself, so the
 * layer's MoE kernels compute them from device memory as hits (launch them
 * without tdm_gpu_direct_experts). The ids must be distinct (a token's
 * top-k): a second selection of a staged expert would be a hit. First it
 * clears the entries layer prev staged; layer < 0 only clears. p needs
 * quota and no hint; its stage rows are [n_layer][n]. */
tdm_status tdm_gpu_direct_stage(tdm_gpu *g, const tdm_gpu_prefetch *p, int32_t layer, int32_t prev,
                                const int32_t *ids, int32_t k, const tdm_gpu_direct_experts *src,
                                const tdm_gpu_expert_table *table, tdm_error *err);

/* Device copy dst[r][0..width) = src[r * src_pitch ...] for rows r < rows
 * into host memory (2-D download, e.g. one layer-strided slab), queued like
 * tdm_gpu_download_async: dst holds it after the next tdm_gpu_sync. */
tdm_status tdm_gpu_download_rows_async(tdm_gpu *g, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                                 size_t width, size_t rows, tdm_error *err);

/* Copies rows rows of width bytes from src (rows spitch apart) to dst
 * (dpitch apart) on the copy stream (tdm_gpu_copy_async's), e.g.
 * consecutive experts' matrices from registered host memory
 * (tdm_gpu_host_register) into slots, in one DMA. */
tdm_status tdm_gpu_copy_rows_async(tdm_gpu *g, void *dst, size_t dpitch, const void *src, size_t spitch,
                                   size_t width, size_t rows, tdm_error *err);

/* The expert-slot device: `staging` page-locked buffers of slot_bytes each
 * (>= 1) rotate for the copies; a copy whose sources all lie in the
 * `direct_bytes` of host memory at `direct` (registered with the device,
 * tdm_gpu_host_register; NULL: none) is a DMA from there instead, without
 * the staging or the host waiting. Every arena it allocates has `spare` more
 * slots after the bytes the cache asks for (the decode prefetch's). *out is
 * owned by the caller and freed with tdm_gpu_slot_device_free (after the
 * cache that uses it). */
tdm_status tdm_gpu_slot_device_new(tdm_gpu *g, size_t slot_bytes, int staging, int spare, const void *direct,
                                   size_t direct_bytes, tdm_expert_device **out, tdm_error *err);
void tdm_gpu_slot_device_free(tdm_expert_device *d);
/* The spare slots after the last arena d allocated (NULL before the first,
 * or without spare slots); owned by d's arena. */
void *tdm_gpu_slot_device_spare(tdm_expert_device *d);

#ifdef __cplusplus
}
#endif

#endif
