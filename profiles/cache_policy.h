/* cache_policy: which routed experts sit in a fixed number of cache slots, and
 * how that set changes as tokens are routed. The VRAM expert cache calls this
 * to decide residency and planned copies; `tandem cachesim` replays routing
 * dumps through it. It knows nothing about memory: a slot is an index.
 *
 * Budget: n_slots slots in total, either
 *   - global (per_layer = false): one pool; the initial fill decides how many
 *     slots each layer gets; demand policies (lru, lfu, oracle) evict across
 *     layers; adaptive swaps inside a layer, so its split stays the fill's;
 *   - per layer (per_layer = true): layer l owns n_slots / n_layer slots (the
 *     first n_slots % n_layer layers one more), every policy stays inside it.
 *
 * Policies:
 *   static    filled hottest-first from a profile (global or per-layer
 *             ranking), never changes. Needs a profile.
 *   layer     filled by whole layers: all experts of layer 0, then layer 2,
 *             4, ..., then layers 1, 3, ... (per layer: experts 0, 1, ... of
 *             each layer); never changes. The fallback when there is no
 *             profile. Even layers first, so that while fewer than half the
 *             layers fit, each layer left without slots follows one that holds
 *             every expert: the GPU's decode prefetch reads the next layer's
 *             predicted misses while such a layer runs (forward_gpu.c).
 *   adaptive  starts from the profile fill (layer fill without one). Keeps a
 *             decayed use count per expert (+1 per use, x adapt_decay per
 *             token, seeded with the profile's per-token rate / (1 - decay)).
 *             Every adapt_every tokens, at a layer's access, up to adapt_swaps
 *             of the layer's hottest non-resident experts replace its coldest
 *             residents, each only when hot > cold * (1 + h) + h with
 *             h = adapt_hysteresis (near-equal experts never ping-pong; the
 *             additive part matters while counts are small). Never evicts an
 *             expert of the current access.
 *   lru, lfu  demand caches: every miss is loaded, evicting the least recently
 *             / least frequently used resident of the pool (lfu: counts since
 *             creation, ties to the least recent; the miss is loaded only when
 *             its count exceeds the victim's). Same initial fill as adaptive.
 *   oracle    Belady's MIN with bypass: needs the whole future. Starts with
 *             the experts used first (a free fill, like every other policy's),
 *             on a miss evicts the resident used farthest in the future, or
 *             skips the load when the missed expert comes back later than all
 *             residents. No policy that fills the same pool can hit more.
 *
 * Access: tdm_cache_access(token, layer, ids[n]) reports which ids were
 * resident (hits are decided before any change), then applies the policy.
 * Changes appear as planned swaps (evict (layer, e) -> load (layer, e) into a
 * slot) for the executor to copy on a copy stream; the residency table is
 * updated at once, so the executor must complete a swap's copy before it
 * routes the next token to that slot.
 *
 * Ownership: tdm_cache_new() allocates every table; access never allocates.
 * The params' profile and future arrays are only read during tdm_cache_new().
 */
#ifndef TDM_CACHE_POLICY_H
#define TDM_CACHE_POLICY_H

#include <stdbool.h>
#include <stdint.h>

#include "profile.h"
#include "status.h"

typedef enum tdm_cache_policy {
    TDM_CACHE_STATIC = 0,
    TDM_CACHE_LAYER,
    TDM_CACHE_ADAPTIVE,
    TDM_CACHE_LRU,
    TDM_CACHE_LFU,
    TDM_CACHE_ORACLE,
    TDM_CACHE_N_POLICIES
} tdm_cache_policy;

typedef struct tdm_cache_params {
    tdm_cache_policy policy;
    int32_t n_layer, n_expert, k; /* k: most ids per access (<= 64) */
    int32_t n_slots;              /* total slots (capped at n_layer * n_expert) */
    bool per_layer;               /* see "Budget" above */
    const tdm_profile *profile;   /* static: required; adaptive, lru, lfu: optional */
    int32_t adapt_every;          /* tokens between adaptation steps (>= 1) */
    int32_t adapt_swaps;          /* swaps per layer and step (>= 0) */
    float adapt_decay;            /* per-token decay of use counts, in (0, 1] */
    float adapt_hysteresis;       /* >= 0 */
    /* oracle: every access that will follow, in order */
    const int32_t *future_layer;  /* [n_future] */
    const int32_t *future_ids;    /* [n_future * k] */
    int64_t n_future;
} tdm_cache_params;

typedef struct tdm_cache_swap {
    int32_t slot;
    int32_t evict_layer, evict_expert; /* -1, -1 when the slot was empty */
    int32_t load_layer, load_expert;
} tdm_cache_swap;

typedef struct tdm_cache_stats {
    int64_t accesses;  /* expert lookups (ids passed to access) */
    int64_t hits;
    int64_t loads;     /* experts loaded after the initial fill */
    int64_t evictions; /* loads that replaced a resident */
} tdm_cache_stats;

typedef struct tdm_cache tdm_cache;

/* Defaults: adapt_every 8, adapt_swaps 2, adapt_decay 0.98, adapt_hysteresis 0.25. */
void tdm_cache_params_init(tdm_cache_params *p, tdm_cache_policy policy, int32_t n_layer,
                           int32_t n_expert, int32_t k, int32_t n_slots);

tdm_status tdm_cache_new(const tdm_cache_params *p, tdm_cache **out, tdm_error *err);
void tdm_cache_free(tdm_cache *c);

/* token: index of the current token (non-decreasing); layer: 0..n_layer-1;
 * ids: n (1..k) distinct expert ids. hit_mask bit i = ids[i] was resident;
 * n_hits may be NULL. Bad arguments (and, for the oracle, an access that is
 * not the next one of its future) are TDM_ERR_INVALID and change nothing. */
tdm_status tdm_cache_access(tdm_cache *c, int64_t token, int32_t layer, const int32_t *ids,
                            int32_t n, uint64_t *hit_mask, int32_t *n_hits, tdm_error *err);

/* Swaps planned by the last access (valid until the next access). */
int32_t tdm_cache_swaps(const tdm_cache *c, const tdm_cache_swap **swaps);

/* Slot holding (layer, expert), or -1 (also for out-of-range arguments). */
int32_t tdm_cache_slot(const tdm_cache *c, int32_t layer, int32_t expert);
/* The whole table, [n_layer * n_expert]: slot or -1 (for the device copy). */
const int32_t *tdm_cache_residency(const tdm_cache *c);
int32_t tdm_cache_n_slots(const tdm_cache *c);
/* Slots layer holds now. */
int32_t tdm_cache_layer_slots(const tdm_cache *c, int32_t layer);
void tdm_cache_get_stats(const tdm_cache *c, tdm_cache_stats *out);

const char *tdm_cache_policy_name(tdm_cache_policy p);
/* -1 when name is unknown. */
int tdm_cache_policy_parse(const char *name);

#endif
