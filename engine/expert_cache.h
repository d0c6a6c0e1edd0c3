/* expert_cache: the GPU expert cache (DESIGN.md §2) and the VRAM budget ledger.
 *
 * The cache is one arena of n_slots fixed-size slots; a slot holds one routed
 * expert as gate|up|down in the file's quant types, laid out exactly as the
 * file's rows (so the same kernels run on a slot as on the mmapped weights).
 * slot_bytes = max over MoE layers of one expert's three matrices.
 * Which (layer, expert) sits in which slot is decided by a profiles/
 * cache_policy.h tdm_cache: whole layers without a profile, hottest first with
 * one; adaptive / demand policies plan swaps, which tdm_expert_cache_record
 * executes at once as slot copies (call it between tokens, never while a
 * kernel reads the arena).
 *
 * Published residency: the table the executor, the pool and the GPU read is
 * not the policy's own. A swap unpublishes the evicted expert at once and
 * publishes the loaded one only once its copy has landed (device poll(), see
 * tdm_expert_cache_settle), so with an asynchronous device the copies overlap
 * decode and nothing ever reads a slot while it is being written: until then
 * both experts simply miss and the CPU computes them.
 *
 * The arena memory comes from a tdm_expert_device: a table of function
 * pointers (alloc the arena, copy one expert into a slot, sync the copies).
 * tdm_expert_device_host() keeps the arena in plain host memory (the CPU-only
 * emulation, and CI); the CUDA implementation will allocate it with
 * cudaMalloc and copy on the gpu.h copy stream (docs/EXECUTOR.md).
 *
 * Ownership: the cache borrows the model (its mmapped expert views are the
 * copy sources) and the device table (which must outlive it); it owns the
 * arena (freed through the device), the policy and the counters. Nothing is
 * allocated after tdm_expert_cache_new(). One thread at a time.
 */
#ifndef TDM_EXPERT_CACHE_H
#define TDM_EXPERT_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cache_policy.h"
#include "experts.h"
#include "model.h"
#include "status.h"

/* Where the arena lives. ctx is passed back to every call. */
typedef struct tdm_expert_device {
    const char *name;
    void *ctx;
    /* *arena = bytes of device memory (64-byte aligned at least). */
    tdm_status (*arena_alloc)(void *ctx, size_t bytes, void **arena, tdm_error *err);
    void (*arena_free)(void *ctx, void *arena);
    /* Copies n source blocks (host, mmapped) back to back to arena + offset;
     * may be asynchronous until sync. */
    tdm_status (*copy)(void *ctx, void *arena, size_t offset, int n, const void *const *src, const size_t *bytes,
                       tdm_error *err);
    /* Returns when every copy issued so far is visible to the compute side. */
    tdm_status (*sync)(void *ctx, tdm_error *err);
    /* Without blocking: whether every copy issued so far has landed. NULL:
     * copies are complete when copy() returns. */
    bool (*poll)(void *ctx);
} tdm_expert_device;

/* Plain host memory (aligned_alloc, memcpy); immutable, shared. */
const tdm_expert_device *tdm_expert_device_host(void);

typedef struct tdm_expert_cache tdm_expert_cache;

/* Bytes of one slot for model m (0 when it has no MoE layer). */
size_t tdm_expert_cache_slot_bytes_for(const tdm_model *m);

/* p: the policy parameters (n_layer, n_expert, k must match the model; the
 * profile, when set, is checked against the model's dimensions by the
 * policy). n_slots may be 0 (every expert misses). Fills the slots at once
 * (copies through dev) and syncs. */
tdm_status tdm_expert_cache_new(const tdm_model *m, const tdm_cache_params *p, const tdm_expert_device *dev,
                                tdm_expert_cache **out, tdm_error *err);
void tdm_expert_cache_free(tdm_expert_cache *c);

int32_t tdm_expert_cache_n_slots(const tdm_expert_cache *c);
size_t tdm_expert_cache_slot_bytes(const tdm_expert_cache *c);
/* Slot of (layer, expert) in the published table, or -1. */
int32_t tdm_expert_cache_slot(const tdm_expert_cache *c, int32_t layer, int32_t expert);
/* [n_layer * n_expert]: slot or -1, the published table (see above); it
 * changes only in record and settle calls. */
const int32_t *tdm_expert_cache_residency(const tdm_expert_cache *c);
/* Publishes the experts whose copies have landed (wait: block until all
 * have). Between tokens only. */
tdm_status tdm_expert_cache_settle(tdm_expert_cache *c, bool wait, tdm_error *err);
/* Bumped whenever the published table changes (device mirrors re-upload). */
uint64_t tdm_expert_cache_version(const tdm_expert_cache *c);
/* Loads whose copies have not been published yet. */
int32_t tdm_expert_cache_pending(const tdm_expert_cache *c);
/* The arena's base (device memory for a device implementation). */
const void *tdm_expert_cache_arena(const tdm_expert_cache *c);

/* Layer il's experts as they sit in the arena: expert id i of this desc is
 * slot i (n_expert = n_slots). For tdm_experts_run on the cached copies. */
tdm_experts_desc tdm_expert_cache_desc(const tdm_expert_cache *c, int32_t il);

/* Adds the hits/misses the executor resolved for layer il. */
void tdm_expert_cache_count(tdm_expert_cache *c, int32_t il, int64_t hits, int64_t misses);

/* Feeds one (token, layer) routing to the policy and executes the swaps it
 * plans (slot copies, then sync). Between tokens only. */
tdm_status tdm_expert_cache_record(tdm_expert_cache *c, int64_t token, int32_t il, const int32_t *ids, int32_t n,
                                   tdm_error *err);

/* ---- lending slots ----
 * The last n slots of the arena can be lent out as scratch memory (the GPU
 * forward's prompt buffers, which one-token steps never use): lend
 * unpublishes the experts they hold at once (they miss until reclaim) and
 * returns their memory, n * slot_bytes from the slot boundary; while lent,
 * loads the policy plans into them are not copied. reclaim, once nothing
 * uses the memory any more, copies back whatever the policy holds in those
 * slots, published as the copies land (tdm_expert_cache_settle). Between
 * tokens only, like record; one loan at a time. */
tdm_status tdm_expert_cache_lend(tdm_expert_cache *c, int32_t n, void **mem, tdm_error *err);
tdm_status tdm_expert_cache_reclaim(tdm_expert_cache *c, tdm_error *err);
/* Slots lent now (0: none). */
int32_t tdm_expert_cache_lent(const tdm_expert_cache *c);

typedef struct tdm_expert_cache_stats {
    int64_t hits, misses;   /* over all layers, as counted by the executor */
    int64_t swaps;          /* loads the policy planned after the fill (copied at once, or by reclaim into a
                             * lent slot) */
    uint64_t bytes_filled;  /* bytes copied by the initial fill */
    uint64_t bytes_moved;   /* bytes copied by swaps */
    int64_t loans;          /* tdm_expert_cache_lend calls */
    uint64_t bytes_reclaimed; /* bytes copied back by reclaim */
} tdm_expert_cache_stats;

void tdm_expert_cache_get_stats(const tdm_expert_cache *c, tdm_expert_cache_stats *out);
/* Per-layer counters (0 for il out of range). */
int64_t tdm_expert_cache_layer_hits(const tdm_expert_cache *c, int32_t il);
int64_t tdm_expert_cache_layer_misses(const tdm_expert_cache *c, int32_t il);

/* ---- the VRAM budget ledger ----
 * Every byte the GPU will hold, planned before anything is allocated:
 *   weights   every non-routed-expert tensor of the file (attention, DeltaNet,
 *             norms, routers, shared experts, embeddings, output head, MTP)
 *   kv        n_attn_layers * n_ctx * 2 * n_head_kv * head_dim * 2 (fp16 K and V)
 *   deltanet  n_rec_layers * ((K-1) * conv_dim + H_v * d_k * d_v) * 4
 *   scratch   max_batch * 4 * (4 * n_embd + 3 * wide + n_expert + n_vocab) with
 *             wide = max(q rows (x2 gated), conv_dim, k * n_ff_exp, n_ff_shexp)
 *             plus 2 x TDM_STREAM_CHUNK slots (at most 2 x n_expert) for
 *             prompt streaming (forward_gpu.h), double buffered, and the
 *             span's rows beyond max_batch (span - max_batch) * 4 *
 *             (2 * n_embd + 1 + (n_layer + 1) * k), span =
 *             tdm_stream_span(max_batch, n_ctx)
 *   slots     the rest, in whole slots, at most n_moe_layers * n_expert.
 * The weights and scratch terms are estimates, on the high side for large
 * vocabularies (the token embedding and logits for every batch row): the
 * GPU forward plans with them before it allocates anything, then plans
 * again over the fixed part as allocated (forward_gpu.c start_hybrid), so
 * the slots get what the estimates kept back; when holding its prompt
 * scratch (the GEMM's, the grouped MoE's, the streaming chunks) would cost
 * slots, it borrows the arena's last slots for it during prompt batches
 * instead (lent_slots; the as-allocated scratch term leaves it out). */
/* Prompt streaming: experts per chunk sent to the GPU (two chunks in VRAM). */
#define TDM_STREAM_CHUNK 32
/* Prompt batches of at least this many tokens stream (executor stream_min 0). */
#define TDM_STREAM_MIN_DEFAULT 64
/* A streaming prompt runs up to this many batches layer by layer (a span):
 * each layer's missing experts cross PCIe once per span, not per batch. */
#define TDM_STREAM_SPAN 8

/* Tokens of a streaming span: TDM_STREAM_SPAN batches of max_batch, at most
 * n_ctx, at least max_batch. */
int32_t tdm_stream_span(int32_t max_batch, int32_t n_ctx);

typedef struct tdm_budget_inputs {
    uint64_t weight_bytes, kv_bytes, deltanet_bytes, scratch_bytes;
    uint64_t slot_bytes;
    int64_t max_slots;          /* n_moe_layers * n_expert */
    uint64_t kv_bytes_per_pos;  /* for the "what would fit" answer */
} tdm_budget_inputs;

typedef struct tdm_budget {
    tdm_budget_inputs in;
    uint64_t budget;
    uint64_t fixed_bytes;       /* weights + kv + deltanet + scratch */
    int32_t n_slots;
    uint64_t slot_total;        /* n_slots * slot_bytes */
    uint64_t spare;             /* budget - fixed - slot_total */
    int32_t lent_slots;         /* of n_slots, lent to prompt batches as scratch (the GPU forward sets it;
                                 * the scratch term then leaves that scratch out) */
} tdm_budget;

/* The ledger's sizes for model m at n_ctx positions and max_batch tokens. */
tdm_status tdm_budget_inputs_for(const tdm_model *m, int32_t n_ctx, int32_t max_batch, tdm_budget_inputs *out,
                                 tdm_error *err);
/* Plans budget_bytes over in. TDM_ERR_OOM when the fixed part does not fit,
 * with the numbers and what would fit (the smallest budget, and the largest
 * context the budget allows); *out is filled either way. */
tdm_status tdm_budget_compute(const tdm_budget_inputs *in, uint64_t budget_bytes, tdm_budget *out, tdm_error *err);
/* tdm_budget_inputs_for + tdm_budget_compute; *n_slots = out->n_slots. */
tdm_status tdm_budget_plan(const tdm_model *m, int32_t n_ctx, int32_t max_batch, uint64_t budget_bytes,
                           tdm_budget *out, tdm_error *err);
/* One line: "gpu-mem 8.00 GiB: weights ... | 123 slots x 4.5 MiB". */
void tdm_budget_format(const tdm_budget *b, char *buf, size_t cap);

#endif
