/* cache_policy: expert residency policies (semantics in cache_policy.h).
 * An "item" is layer * n_expert + expert. Pools are slot ranges: all slots
 * (global budget) or the layer's own range (per-layer budget). The demand
 * policies (lru, lfu, oracle) find a pool's victim in a tournament tree over
 * the slots (O(log slots) per miss and per changed slot, no allocation); the
 * adaptive policy compares a layer's experts directly. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cache_policy.h"

#define NEVER INT64_MAX

struct tdm_cache {
    tdm_cache_params p;            /* profile / future pointers cleared after new */
    int32_t n_items;               /* n_layer * n_expert */
    int32_t n_slots;
    int32_t *slot_item;            /* [n_slots] item or -1 */
    int32_t *resid;                /* [n_items] slot or -1 */
    int32_t *pool_lo, *pool_hi;    /* [n_layer] slot range a layer's loads may use */
    int32_t *layer_slots;          /* [n_layer] slots each layer holds now */
    int64_t clock;                 /* accesses so far (LRU time) */
    int64_t *last_use;             /* [n_items] clock of the last use, -1 never */
    uint64_t *freq;                /* [n_items] lfu counts */
    float *score;                  /* [n_items] adaptive decayed counts */
    int64_t *last_adapt;           /* [n_layer] token of the layer's last adaptation */
    float decay_every;             /* adapt_decay ^ adapt_every */
    int64_t *next_use;             /* [n_future * k] oracle: next request index of the same item */
    int64_t *item_next;            /* [n_items] oracle: next request of the item */
    int32_t *future_layer;         /* [n_future] oracle copy */
    int32_t *future_ids;           /* [n_future * k] oracle copy */
    int64_t n_future, cursor;      /* oracle: accesses consumed */
    tdm_cache_swap *swaps;         /* [max(k, adapt_swaps)] planned by the last access */
    int32_t n_swaps;
    int32_t *tree;                 /* lru, lfu, oracle: [2 * leaves] the preferred slot of each
                                    * node's range (-1: none); leaf leaves + s is slot s */
    int32_t leaves;                /* power of two >= n_slots */
    int32_t *touched;              /* [k] items of the last access (their slots leave the
                                    * current access's exclusion at the next one) */
    int32_t n_touched;
    tdm_cache_stats st;
};

static const char *const policy_names[TDM_CACHE_N_POLICIES] = {
    "static", "layer", "adaptive", "lru", "lfu", "oracle"};

const char *tdm_cache_policy_name(tdm_cache_policy p)
{
    return (unsigned)p < TDM_CACHE_N_POLICIES ? policy_names[p] : "?";
}

int tdm_cache_policy_parse(const char *name)
{
    for (int i = 0; i < TDM_CACHE_N_POLICIES; i++)
        if (!strcmp(name, policy_names[i]))
            return i;
    return -1;
}

void tdm_cache_params_init(tdm_cache_params *p, tdm_cache_policy policy, int32_t n_layer,
                           int32_t n_expert, int32_t k, int32_t n_slots)
{
    memset(p, 0, sizeof *p);
    p->policy = policy;
    p->n_layer = n_layer;
    p->n_expert = n_expert;
    p->k = k;
    p->n_slots = n_slots;
    p->adapt_every = 8;
    p->adapt_swaps = 2;
    p->adapt_decay = 0.98f;
    p->adapt_hysteresis = 0.25f;
}

static tdm_status check_params(const tdm_cache_params *p, tdm_error *err)
{
    if ((unsigned)p->policy >= TDM_CACHE_N_POLICIES)
        return tdm_error_set(err, TDM_ERR_INVALID, "cache: unknown policy %d", (int)p->policy);
    if (p->n_layer <= 0 || p->n_expert <= 0 || p->k <= 0 || p->k > 64 || p->k > p->n_expert ||
        (int64_t)p->n_layer * p->n_expert > TDM_PROFILE_MAX_EXPERTS)
        return tdm_error_set(err, TDM_ERR_INVALID, "cache: bad shape %d layers x %d experts, "
                             "k %d", p->n_layer, p->n_expert, p->k);
    if (p->n_slots < 0)
        return tdm_error_set(err, TDM_ERR_INVALID, "cache: n_slots %d < 0", p->n_slots);
    if (p->adapt_every < 1 || p->adapt_swaps < 0 || p->adapt_swaps > 4096 ||
        !(p->adapt_decay > 0 && p->adapt_decay <= 1) || !(p->adapt_hysteresis >= 0))
        return tdm_error_set(err, TDM_ERR_INVALID, "cache: bad adaptive parameters (every %d, "
                             "swaps %d, decay %g, hysteresis %g)", p->adapt_every, p->adapt_swaps,
                             (double)p->adapt_decay, (double)p->adapt_hysteresis);
    if (p->policy == TDM_CACHE_STATIC && !p->profile)
        return tdm_error_set(err, TDM_ERR_INVALID, "cache: the static policy needs a profile");
    if (p->profile) {
        const tdm_model_id *id = tdm_profile_id(p->profile);
        if (id->n_layer != p->n_layer || id->n_expert != p->n_expert || id->k != p->k)
            return tdm_error_set(err, TDM_ERR_INVALID, "cache: the profile was made for another "
                                 "model (%d x %d, top-%d; the cache is %d x %d, top-%d)",
                                 id->n_layer, id->n_expert, id->k, p->n_layer, p->n_expert, p->k);
    }
    if (p->policy == TDM_CACHE_ORACLE && p->n_future > 0 && (!p->future_layer || !p->future_ids))
        return tdm_error_set(err, TDM_ERR_INVALID, "cache: the oracle needs the future accesses");
    if (p->n_future < 0)
        return tdm_error_set(err, TDM_ERR_INVALID, "cache: n_future < 0");
    return TDM_OK;
}

void tdm_cache_free(tdm_cache *c)
{
    if (!c)
        return;
    free(c->slot_item);
    free(c->resid);
    free(c->pool_lo);
    free(c->pool_hi);
    free(c->layer_slots);
    free(c->last_use);
    free(c->freq);
    free(c->score);
    free(c->last_adapt);
    free(c->next_use);
    free(c->item_next);
    free(c->future_layer);
    free(c->future_ids);
    free(c->swaps);
    free(c->tree);
    free(c->touched);
    free(c);
}

static void place(tdm_cache *c, int32_t slot, int32_t item)
{
    int32_t old = c->slot_item[slot];
    if (old >= 0) {
        c->resid[old] = -1;
        c->layer_slots[old / c->p.n_expert]--;
    }
    c->slot_item[slot] = item;
    if (item >= 0) {
        c->resid[item] = slot;
        c->layer_slots[item / c->p.n_expert]++;
    }
}

/* ---------------------------------------------------------------- victims */

/* Whether slot a is a better place than slot b for a demand load: an empty
 * slot first, then the policy's victim (lru: the least recently used; lfu:
 * the least frequently used, then the least recent; oracle: the one used
 * again farthest ahead), the lower slot on ties; residents of the current
 * access come last for lru and lfu (they are never evicted). A total order,
 * so a tournament over any split of a pool picks the same slot as a scan. */
static bool prefer(const tdm_cache *c, int32_t a, int32_t b)
{
    const int32_t va = c->slot_item[a], vb = c->slot_item[b];
    if (va < 0 || vb < 0)
        return vb >= 0 || (va < 0 && a < b);
    if (c->p.policy != TDM_CACHE_ORACLE) {
        const bool ca = c->last_use[va] == c->clock, cb = c->last_use[vb] == c->clock;
        if (ca != cb)
            return cb;
    }
    if (c->p.policy == TDM_CACHE_ORACLE && c->item_next[va] != c->item_next[vb])
        return c->item_next[va] > c->item_next[vb];
    if (c->p.policy == TDM_CACHE_LFU && c->freq[va] != c->freq[vb])
        return c->freq[va] < c->freq[vb];
    if (c->p.policy != TDM_CACHE_ORACLE && c->last_use[va] != c->last_use[vb])
        return c->last_use[va] < c->last_use[vb];
    return a < b;
}

static int32_t pick(const tdm_cache *c, int32_t a, int32_t b)
{
    if (a < 0 || b < 0)
        return a < 0 ? b : a;
    return prefer(c, a, b) ? a : b;
}

/* Slot s's item or that item's keys changed: the nodes above its leaf
 * choose again. */
static void tree_update(tdm_cache *c, int32_t s)
{
    for (int32_t i = (c->leaves + s) >> 1; i >= 1; i >>= 1)
        c->tree[i] = pick(c, c->tree[2 * i], c->tree[2 * i + 1]);
}

/* The tree's slot of item, when it has one, chooses again. */
static void item_changed(tdm_cache *c, int32_t item)
{
    if (c->tree && c->resid[item] >= 0)
        tree_update(c, c->resid[item]);
}

static void tree_build(tdm_cache *c)
{
    for (int32_t i = 0; i < c->leaves; i++)
        c->tree[c->leaves + i] = i < c->n_slots ? i : -1;
    for (int32_t i = c->leaves - 1; i >= 1; i--)
        c->tree[i] = pick(c, c->tree[2 * i], c->tree[2 * i + 1]);
}

/* The preferred slot of [lo, hi), -1 for an empty range. */
static int32_t tree_best(const tdm_cache *c, int32_t lo, int32_t hi)
{
    int32_t best = -1;
    for (lo += c->leaves, hi += c->leaves; lo < hi; lo >>= 1, hi >>= 1) {
        if (lo & 1)
            best = pick(c, best, c->tree[lo++]);
        if (hi & 1)
            best = pick(c, best, c->tree[--hi]);
    }
    return best;
}

/* ---------------------------------------------------------------- creation and fill */

/* The first free slot at or after s (n_slots if none): skip[] links every
 * slot to one at or after it with no free slot in between (skip[s] == s:
 * s is free), shortened as it is walked, so a whole fill is near-linear in
 * items + slots even when every layer shares one pool. */
static int32_t first_free(int32_t *skip, int32_t s)
{
    int32_t r = s;
    while (skip[r] != r)
        r = skip[r];
    while (skip[s] != r) {
        const int32_t next = skip[s];
        skip[s] = r;
        s = next;
    }
    return r;
}

/* Fills the empty pools from a list of items in preference order (each item
 * goes to the next free slot of its layer's pool). order: [n]; skip:
 * [n_slots + 1] scratch. */
static void fill_in_order(tdm_cache *c, const int32_t *order, int32_t n, int32_t *skip)
{
    for (int32_t s = 0; s <= c->n_slots; s++)
        skip[s] = s; /* all free; n_slots: the end */
    for (int32_t i = 0; i < n; i++) {
        int32_t item = order[i], l = item / c->p.n_expert;
        if (c->resid[item] >= 0)
            continue;
        const int32_t s = first_free(skip, c->pool_lo[l]);
        if (s < c->pool_hi[l]) {
            place(c, s, item);
            skip[s] = s + 1;
        }
    }
}

/* The profile's preference order for this budget: per-layer rankings
 * interleaved (each layer fills its own pool) or the global ranking. */
static tdm_status profile_order(tdm_cache *c, const tdm_profile *prof, int32_t *order,
                                tdm_error *err)
{
    if (!c->p.per_layer) {
        tdm_profile_rank_global(prof, order);
        return TDM_OK;
    }
    int32_t ne = c->p.n_expert;
    for (int32_t l = 0; l < c->p.n_layer; l++) {
        tdm_status st = tdm_profile_rank_layer(prof, l, order + (size_t)l * ne, err);
        if (st)
            return st;
        for (int32_t e = 0; e < ne; e++)
            order[(size_t)l * ne + e] += l * ne;
    }
    return TDM_OK;
}

/* Oracle fill: the items requested first, in order of first request. */
static int32_t first_use_order(const tdm_cache *c, int32_t *order, bool *seen)
{
    int32_t n = 0;
    memset(seen, 0, (size_t)c->n_items * sizeof *seen);
    for (int64_t f = 0; f < c->n_future * c->p.k && n < c->n_items; f++) {
        int32_t item = c->future_layer[f / c->p.k] * c->p.n_expert + c->future_ids[f];
        if (!seen[item]) {
            seen[item] = true;
            order[n++] = item;
        }
    }
    return n;
}

static void set_pools(tdm_cache *c)
{
    int32_t nl = c->p.n_layer, ne = c->p.n_expert;
    int32_t base = c->n_slots / nl, rem = c->n_slots % nl, s = 0;
    for (int32_t l = 0; l < nl; l++) {
        if (c->p.per_layer) {
            int32_t want = base + (l < rem);
            c->pool_lo[l] = s;
            s += want < ne ? want : ne;
            c->pool_hi[l] = s;
        } else {
            c->pool_lo[l] = 0;
            c->pool_hi[l] = c->n_slots;
        }
    }
    if (c->p.per_layer)
        c->n_slots = s; /* layers with fewer experts than their share */
}

static tdm_status copy_future(tdm_cache *c, const tdm_cache_params *p, tdm_error *err)
{
    int32_t k = p->k, ne = p->n_expert;
    size_t nf = (size_t)p->n_future;
    c->n_future = p->n_future;
    c->future_layer = malloc((nf ? nf : 1) * sizeof *c->future_layer);
    c->future_ids = malloc((nf ? nf : 1) * k * sizeof *c->future_ids);
    c->next_use = malloc((nf ? nf : 1) * k * sizeof *c->next_use);
    if (!c->future_layer || !c->future_ids || !c->next_use)
        return tdm_error_set(err, TDM_ERR_OOM, "cache: cannot hold %zu future accesses", nf);
    if (nf) {
        memcpy(c->future_layer, p->future_layer, nf * sizeof *c->future_layer);
        memcpy(c->future_ids, p->future_ids, nf * k * sizeof *c->future_ids);
    }
    for (size_t a = 0; a < nf; a++) {
        if (c->future_layer[a] < 0 || c->future_layer[a] >= p->n_layer)
            return tdm_error_set(err, TDM_ERR_INVALID, "cache: future access %zu: layer %d out "
                                 "of range", a, c->future_layer[a]);
        for (int32_t i = 0; i < k; i++) {
            int32_t e = c->future_ids[a * k + i];
            if (e < 0 || e >= ne)
                return tdm_error_set(err, TDM_ERR_INVALID, "cache: future access %zu: expert "
                                     "%d out of range", a, e);
            for (int32_t j = 0; j < i; j++)
                if (c->future_ids[a * k + j] == e)
                    return tdm_error_set(err, TDM_ERR_INVALID, "cache: future access %zu: "
                                         "expert %d repeated", a, e);
        }
    }
    for (int32_t i = 0; i < c->n_items; i++)
        c->item_next[i] = NEVER;
    for (size_t f = nf * k; f-- > 0;) {
        int32_t item = c->future_layer[f / k] * ne + c->future_ids[f];
        c->next_use[f] = c->item_next[item];
        c->item_next[item] = (int64_t)f;
    }
    return TDM_OK;
}

static tdm_status initial_fill(tdm_cache *c, const tdm_cache_params *p, tdm_error *err)
{
    int32_t *order = malloc((size_t)c->n_items * sizeof *order);
    int32_t *skip = malloc(((size_t)c->n_slots + 1) * sizeof *skip);
    bool *seen = malloc((size_t)c->n_items * sizeof *seen);
    tdm_status st = TDM_OK;
    if (!order || !skip || !seen) {
        st = tdm_error_set(err, TDM_ERR_OOM, "cache: out of memory");
    } else if (p->policy == TDM_CACHE_ORACLE) {
        fill_in_order(c, order, first_use_order(c, order, seen), skip);
    } else if (p->profile && p->policy != TDM_CACHE_LAYER) {
        st = profile_order(c, p->profile, order, err);
        if (!st)
            fill_in_order(c, order, c->n_items, skip);
    } else { /* whole layers: the even ones, then the odd ones */
        int32_t n = 0;
        for (int32_t parity = 0; parity < 2; parity++)
            for (int32_t l = parity; l < c->p.n_layer; l += 2)
                for (int32_t e = 0; e < c->p.n_expert; e++)
                    order[n++] = l * c->p.n_expert + e;
        fill_in_order(c, order, n, skip);
    }
    free(order);
    free(skip);
    free(seen);
    return st;
}

static void seed_scores(tdm_cache *c, const tdm_profile *prof)
{
    uint64_t tokens = prof ? tdm_profile_tokens(prof) : 0;
    if (!tokens)
        return;
    float horizon = 1.0f / fmaxf(1.0f - c->p.adapt_decay, 1e-3f);
    for (int32_t i = 0; i < c->n_items; i++) {
        double rate = (double)tdm_profile_count(prof, i / c->p.n_expert, i % c->p.n_expert) /
                      (double)tokens;
        c->score[i] = (float)rate * horizon;
    }
}

tdm_status tdm_cache_new(const tdm_cache_params *p, tdm_cache **out, tdm_error *err)
{
    *out = NULL;
    tdm_status st = check_params(p, err);
    if (st)
        return st;
    tdm_cache *c = calloc(1, sizeof *c);
    if (!c)
        return tdm_error_set(err, TDM_ERR_OOM, "cache: out of memory");
    c->p = *p;
    c->n_items = p->n_layer * p->n_expert;
    c->n_slots = p->n_slots < c->n_items ? p->n_slots : c->n_items;
    size_t ni = (size_t)c->n_items, nl = (size_t)p->n_layer, ns = c->n_slots ? c->n_slots : 1;
    int32_t max_swaps = p->adapt_swaps > p->k ? p->adapt_swaps : p->k;
    c->slot_item = malloc(ns * sizeof *c->slot_item);
    c->resid = malloc(ni * sizeof *c->resid);
    c->pool_lo = calloc(nl, sizeof *c->pool_lo);
    c->pool_hi = calloc(nl, sizeof *c->pool_hi);
    c->layer_slots = calloc(nl, sizeof *c->layer_slots);
    c->last_use = malloc(ni * sizeof *c->last_use);
    c->freq = calloc(ni, sizeof *c->freq);
    c->score = calloc(ni, sizeof *c->score);
    c->last_adapt = calloc(nl, sizeof *c->last_adapt);
    c->item_next = malloc(ni * sizeof *c->item_next);
    c->swaps = calloc((size_t)max_swaps, sizeof *c->swaps);
    if (!c->slot_item || !c->resid || !c->pool_lo || !c->pool_hi || !c->layer_slots ||
        !c->last_use || !c->freq || !c->score || !c->last_adapt || !c->item_next || !c->swaps) {
        tdm_cache_free(c);
        return tdm_error_set(err, TDM_ERR_OOM, "cache: out of memory for %zu experts", ni);
    }
    for (size_t i = 0; i < ns; i++)
        c->slot_item[i] = -1;
    for (size_t i = 0; i < ni; i++) {
        c->resid[i] = -1;
        c->last_use[i] = -1;
    }
    set_pools(c);
    c->decay_every = powf(p->adapt_decay, (float)p->adapt_every);
    if (p->policy == TDM_CACHE_ORACLE)
        st = copy_future(c, p, err);
    if (!st)
        st = initial_fill(c, p, err);
    if (!st && (p->policy == TDM_CACHE_LRU || p->policy == TDM_CACHE_LFU || p->policy == TDM_CACHE_ORACLE)) {
        for (c->leaves = 1; c->leaves < c->n_slots; c->leaves <<= 1)
            ;
        c->tree = malloc(2 * (size_t)c->leaves * sizeof *c->tree);
        c->touched = malloc((size_t)p->k * sizeof *c->touched);
        if (!c->tree || !c->touched)
            st = tdm_error_set(err, TDM_ERR_OOM, "cache: out of memory for %d slots", c->n_slots);
        else
            tree_build(c);
    }
    if (st) {
        tdm_cache_free(c);
        return st;
    }
    if (p->policy == TDM_CACHE_ADAPTIVE)
        seed_scores(c, p->profile);
    c->p.profile = NULL;
    c->p.future_layer = c->p.future_ids = NULL;
    *out = c;
    return TDM_OK;
}

/* ---------------------------------------------------------------- access */

static void plan(tdm_cache *c, int32_t slot, int32_t item)
{
    int32_t ne = c->p.n_expert, old = c->slot_item[slot];
    tdm_cache_swap *s = &c->swaps[c->n_swaps++];
    s->slot = slot;
    s->evict_layer = old >= 0 ? old / ne : -1;
    s->evict_expert = old >= 0 ? old % ne : -1;
    s->load_layer = item / ne;
    s->load_expert = item % ne;
    c->st.loads++;
    c->st.evictions += old >= 0;
    place(c, slot, item);
    if (c->tree)
        tree_update(c, slot);
}

/* Chooses the slot a missed item may take in its pool, or -1 (bypass): the
 * pool's preferred slot (prefer), unless it holds a resident of the current
 * access (all of them do), or the policy would rather not load (lfu: the
 * miss is not used more often than the victim; oracle: the miss comes back
 * no sooner than the victim, or never, which skips an empty slot too). */
static int32_t demand_slot(const tdm_cache *c, int32_t item)
{
    const int32_t l = item / c->p.n_expert, best = tree_best(c, c->pool_lo[l], c->pool_hi[l]);
    if (best < 0)
        return -1;
    const int32_t victim = c->slot_item[best];
    if (victim < 0)
        return c->p.policy == TDM_CACHE_ORACLE && c->item_next[item] == NEVER ? -1 : best;
    if (c->p.policy != TDM_CACHE_ORACLE && c->last_use[victim] == c->clock)
        return -1;
    if (c->p.policy == TDM_CACHE_LFU && c->freq[item] <= c->freq[victim])
        return -1;
    if (c->p.policy == TDM_CACHE_ORACLE && c->item_next[item] >= c->item_next[victim])
        return -1;
    return best;
}

static void adapt(tdm_cache *c, int64_t token, int32_t layer)
{
    int32_t ne = c->p.n_expert, base = layer * ne;
    int64_t gap = token - c->last_adapt[layer];
    float f = gap == c->p.adapt_every ? c->decay_every : powf(c->p.adapt_decay, (float)gap);
    c->last_adapt[layer] = token;
    for (int32_t e = 0; e < ne; e++)
        c->score[base + e] *= f;
    float h = 1.0f + c->p.adapt_hysteresis;
    for (int32_t n = 0; n < c->p.adapt_swaps; n++) {
        int32_t hot = -1, cold = -1;
        for (int32_t i = base; i < base + ne; i++) {
            if (c->resid[i] < 0) {
                if (hot < 0 || c->score[i] > c->score[hot])
                    hot = i;
            } else if (c->last_use[i] != c->clock) {
                if (cold < 0 || c->score[i] < c->score[cold])
                    cold = i;
            }
        }
        if (hot < 0 || cold < 0 || !(c->score[hot] > c->score[cold] * h + c->p.adapt_hysteresis))
            break;
        plan(c, c->resid[cold], hot);
    }
}

static tdm_status check_access(const tdm_cache *c, int32_t layer, const int32_t *ids, int32_t n,
                               tdm_error *err)
{
    if (layer < 0 || layer >= c->p.n_layer)
        return tdm_error_set(err, TDM_ERR_INVALID, "cache: layer %d out of range 0..%d", layer,
                             c->p.n_layer - 1);
    if (n < 1 || n > c->p.k || !ids)
        return tdm_error_set(err, TDM_ERR_INVALID, "cache: %d ids, expected 1..%d", n, c->p.k);
    for (int32_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= c->p.n_expert)
            return tdm_error_set(err, TDM_ERR_INVALID, "cache: layer %d: expert %d out of range "
                                 "0..%d", layer, ids[i], c->p.n_expert - 1);
        for (int32_t j = 0; j < i; j++)
            if (ids[j] == ids[i])
                return tdm_error_set(err, TDM_ERR_INVALID, "cache: layer %d: expert %d repeated",
                                     layer, ids[i]);
    }
    if (c->p.policy != TDM_CACHE_ORACLE)
        return TDM_OK;
    if (c->cursor >= c->n_future)
        return tdm_error_set(err, TDM_ERR_INVALID, "cache: oracle: access beyond its %lld-access "
                             "future", (long long)c->n_future);
    const int32_t *want = c->future_ids + c->cursor * c->p.k;
    if (n != c->p.k || c->future_layer[c->cursor] != layer || memcmp(want, ids, n * sizeof *ids))
        return tdm_error_set(err, TDM_ERR_INVALID, "cache: oracle: access %lld (layer %d) is not "
                             "the one its future holds (layer %d)", (long long)c->cursor, layer,
                             c->future_layer[c->cursor]);
    return TDM_OK;
}

tdm_status tdm_cache_access(tdm_cache *c, int64_t token, int32_t layer, const int32_t *ids,
                            int32_t n, uint64_t *hit_mask, int32_t *n_hits, tdm_error *err)
{
    tdm_status st = check_access(c, layer, ids, n, err);
    if (st)
        return st;
    int32_t base = layer * c->p.n_expert, hits = 0;
    uint64_t mask = 0;
    c->n_swaps = 0;
    c->clock++;
    for (int32_t i = 0; i < c->n_touched; i++) /* the last access's residents are evictable again */
        item_changed(c, c->touched[i]);
    for (int32_t i = 0; i < n; i++) {
        int32_t item = base + ids[i];
        if (c->resid[item] >= 0) {
            mask |= 1ULL << i;
            hits++;
        }
        c->last_use[item] = c->clock;
        c->freq[item]++;
        c->score[item] += 1.0f;
        item_changed(c, item);
        if (c->tree)
            c->touched[i] = item;
    }
    c->n_touched = c->tree ? n : 0;
    switch (c->p.policy) {
    case TDM_CACHE_LRU:
    case TDM_CACHE_LFU:
        for (int32_t i = 0; i < n; i++) {
            int32_t s = (mask >> i & 1) ? -1 : demand_slot(c, base + ids[i]);
            if (s >= 0)
                plan(c, s, base + ids[i]);
        }
        break;
    case TDM_CACHE_ORACLE:
        for (int32_t i = 0; i < n; i++) {
            int32_t item = base + ids[i];
            c->item_next[item] = c->next_use[c->cursor * c->p.k + i];
            item_changed(c, item);
            int32_t s = c->resid[item] >= 0 ? -1 : demand_slot(c, item);
            if (s >= 0)
                plan(c, s, item);
        }
        c->cursor++;
        break;
    case TDM_CACHE_ADAPTIVE:
        if (token - c->last_adapt[layer] >= c->p.adapt_every)
            adapt(c, token, layer);
        break;
    default:
        break;
    }
    c->st.accesses += n;
    c->st.hits += hits;
    if (hit_mask)
        *hit_mask = mask;
    if (n_hits)
        *n_hits = hits;
    return TDM_OK;
}

int32_t tdm_cache_swaps(const tdm_cache *c, const tdm_cache_swap **swaps)
{
    *swaps = c->swaps;
    return c->n_swaps;
}

int32_t tdm_cache_slot(const tdm_cache *c, int32_t layer, int32_t expert)
{
    if (layer < 0 || layer >= c->p.n_layer || expert < 0 || expert >= c->p.n_expert)
        return -1;
    return c->resid[layer * c->p.n_expert + expert];
}

const int32_t *tdm_cache_residency(const tdm_cache *c) { return c->resid; }
int32_t tdm_cache_n_slots(const tdm_cache *c) { return c->n_slots; }

int32_t tdm_cache_layer_slots(const tdm_cache *c, int32_t layer)
{
    return layer >= 0 && layer < c->p.n_layer ? c->layer_slots[layer] : 0;
}

void tdm_cache_get_stats(const tdm_cache *c, tdm_cache_stats *out) { *out = c->st; }
