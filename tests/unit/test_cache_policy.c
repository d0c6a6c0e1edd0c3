/* test_cache_policy: every policy against hit counts worked out by hand on
 * small traces, the oracle bound on random traces, the adaptive policy's
 * guarantees (never evicts the current access's experts, no ping-pong with
 * hysteresis), and refusal of bad arguments. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "alloc_count.h"
#include "cache_policy.h"
#include "profile.h"

static tdm_profile *profile_from_counts(int32_t nl, int32_t ne, int32_t k, const int *counts,
                                        int tokens)
{
    tdm_model_id id = {.arch = "test", .layout_hash = 7, .n_layer = nl, .n_expert = ne, .k = k};
    tdm_profile *p;
    tdm_error err;
    assert_int_equal(tdm_profile_new(&id, &p, &err), TDM_OK);
    for (int32_t l = 0; l < nl; l++)
        for (int32_t e = 0; e < ne; e++)
            for (int c = 0; c < counts[l * ne + e]; c++) /* k = 1 records */
                assert_int_equal(tdm_profile_record(p, l, 1, &e, NULL, &err), TDM_OK);
    tdm_profile_add_tokens(p, (uint64_t)tokens);
    return p;
}

/* Replays a one-layer k=1 trace (token i = access i); returns hits. */
static int64_t replay1(tdm_cache_params *prm, const int32_t *trace, int n, int64_t *loads)
{
    tdm_cache *c;
    tdm_error err;
    int32_t layer0[64] = {0};
    prm->future_layer = layer0;
    prm->future_ids = trace;
    prm->n_future = n;
    assert_int_equal(tdm_cache_new(prm, &c, &err), TDM_OK);
    for (int i = 0; i < n; i++) {
        int32_t h;
        assert_int_equal(tdm_cache_access(c, i, 0, &trace[i], 1, NULL, &h, &err), TDM_OK);
    }
    tdm_cache_stats st;
    tdm_cache_get_stats(c, &st);
    assert_int_equal(st.accesses, n);
    if (loads)
        *loads = st.loads;
    tdm_cache_free(c);
    return st.hits;
}

/* Trace T = 0 1 2 0 1 3 0 1 2 3 2 2 over 4 experts, 2 slots (worked in the comments). */
static void test_hand_traces(void **state)
{
    (void)state;
    static const int32_t t[12] = {0, 1, 2, 0, 1, 3, 0, 1, 2, 3, 2, 2};
    static const int counts[4] = {4, 0, 1, 5};
    tdm_profile *prof = profile_from_counts(1, 4, 1, counts, 10);
    tdm_cache_params p;
    int64_t loads;

    /* layer: {0,1} -> hits at 0 1 3 4 6 7 */
    tdm_cache_params_init(&p, TDM_CACHE_LAYER, 1, 4, 1, 2);
    assert_int_equal(replay1(&p, t, 12, &loads), 6);
    assert_int_equal(loads, 0);
    /* static from the profile: {3,0} -> hits at 0 3 5 6 9 */
    tdm_cache_params_init(&p, TDM_CACHE_STATIC, 1, 4, 1, 2);
    p.profile = prof;
    assert_int_equal(replay1(&p, t, 12, &loads), 5);
    /* lru from {0,1}: 0 1 hit; then 2 0 1 3 0 1 2 3 all miss (each evicts the
     * older); 2 2 hit -> 4 hits, 8 loads */
    tdm_cache_params_init(&p, TDM_CACHE_LRU, 1, 4, 1, 2);
    assert_int_equal(replay1(&p, t, 12, &loads), 4);
    assert_int_equal(loads, 8);
    /* lfu from {0,1}: the misses of 2 and 3 never out-count 0 and 1 until the
     * last access (f(2) = 4 > f(0) = 3) -> hits 0 1 3 4 6 7, one load */
    tdm_cache_params_init(&p, TDM_CACHE_LFU, 1, 4, 1, 2);
    assert_int_equal(replay1(&p, t, 12, &loads), 6);
    assert_int_equal(loads, 1);
    /* oracle: fill {0,1}; bypass 2 (next 8) and 3 (next 9) while 0,1 come
     * back sooner; at 8 both are dead: load 2 -> hits 0 1 3 4 6 7 10 11 */
    tdm_cache_params_init(&p, TDM_CACHE_ORACLE, 1, 4, 1, 2);
    assert_int_equal(replay1(&p, t, 12, &loads), 8);
    assert_int_equal(loads, 1);
    tdm_profile_free(prof);
}

/* Adaptive, no decay, every 2 tokens, 1 swap, hysteresis 0.25, fill {0,1}.
 * Trace 0 1 2 2 2 2 3 3 3 3 3 3: at token 4 score(2) = 3 > 1 * 1.25 + 0.25
 * -> evict 0 load 2; at token 8 score(3) = 3 -> evict 1 (1 use) load 3. */
static void test_adaptive_hand(void **state)
{
    (void)state;
    static const int32_t t[12] = {0, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3};
    tdm_cache_params p;
    tdm_cache_params_init(&p, TDM_CACHE_ADAPTIVE, 1, 4, 1, 2);
    p.adapt_every = 2;
    p.adapt_swaps = 1;
    p.adapt_decay = 1.0f;
    p.adapt_hysteresis = 0.25f;
    tdm_cache *c;
    tdm_error err;
    assert_int_equal(tdm_cache_new(&p, &c, &err), TDM_OK);
    int64_t hits = 0;
    for (int i = 0; i < 12; i++) {
        int32_t h;
        uint64_t mask;
        assert_int_equal(tdm_cache_access(c, i, 0, &t[i], 1, &mask, &h, &err), TDM_OK);
        assert_int_equal(mask, (uint64_t)h);
        hits += h;
        const tdm_cache_swap *sw;
        int32_t ns = tdm_cache_swaps(c, &sw);
        if (i == 4 || i == 8) {
            assert_int_equal(ns, 1);
            assert_int_equal(sw[0].evict_layer, 0);
            assert_int_equal(sw[0].evict_expert, i == 4 ? 0 : 1);
            assert_int_equal(sw[0].load_layer, 0);
            assert_int_equal(sw[0].load_expert, i == 4 ? 2 : 3);
            assert_int_equal(tdm_cache_slot(c, 0, sw[0].load_expert), sw[0].slot);
            assert_int_equal(tdm_cache_slot(c, 0, sw[0].evict_expert), -1);
        } else {
            assert_int_equal(ns, 0);
        }
    }
    assert_int_equal(hits, 6); /* tokens 0 1 5 9 10 11 */
    assert_int_equal(tdm_cache_slot(c, 0, 2) >= 0 && tdm_cache_slot(c, 0, 3) >= 0, 1);
    tdm_cache_free(c);
}

/* The layer fill takes whole layers, even ones first: 5 layers x 4 experts
 * with 10 slots hold layers 0 and 2 and half of layer 4. */
static void test_layer_fill_even_first(void **state)
{
    (void)state;
    tdm_cache_params p;
    tdm_cache *c;
    tdm_error err;
    tdm_cache_params_init(&p, TDM_CACHE_LAYER, 5, 4, 2, 10);
    assert_int_equal(tdm_cache_new(&p, &c, &err), TDM_OK);
    static const int want[5] = {4, 0, 4, 0, 2};
    for (int32_t l = 0; l < 5; l++)
        assert_int_equal(tdm_cache_layer_slots(c, l), want[l]);
    assert_true(tdm_cache_slot(c, 4, 0) >= 0 && tdm_cache_slot(c, 4, 1) >= 0 && tdm_cache_slot(c, 4, 2) < 0);
    tdm_cache_free(c);
}

/* Two layers x 3 experts, 3 slots, global budget. */
static void test_global_budget(void **state)
{
    (void)state;
    static const int counts[6] = {0, 1, 1, 4, 2, 0}; /* layer 1 is hotter */
    tdm_profile *prof = profile_from_counts(2, 3, 1, counts, 2);
    tdm_cache_params p;
    tdm_cache *c;
    tdm_error err;
    tdm_cache_params_init(&p, TDM_CACHE_LAYER, 2, 3, 1, 3);
    assert_int_equal(tdm_cache_new(&p, &c, &err), TDM_OK);
    assert_int_equal(tdm_cache_layer_slots(c, 0), 3); /* all of layer 0 */
    assert_int_equal(tdm_cache_slot(c, 1, 0), -1);
    tdm_cache_free(c);
    tdm_cache_params_init(&p, TDM_CACHE_STATIC, 2, 3, 1, 3);
    p.profile = prof;
    assert_int_equal(tdm_cache_new(&p, &c, &err), TDM_OK);
    /* global ranking: (1,0) 4, (1,1) 2, then (0,1) and (0,2) with 1 each -> (0,1) */
    assert_true(tdm_cache_slot(c, 1, 0) >= 0 && tdm_cache_slot(c, 1, 1) >= 0 &&
                tdm_cache_slot(c, 0, 1) >= 0);
    assert_int_equal(tdm_cache_layer_slots(c, 1), 2);
    const int32_t *res = tdm_cache_residency(c);
    int resident = 0;
    for (int i = 0; i < 6; i++)
        resident += res[i] >= 0;
    assert_int_equal(resident, 3);
    tdm_cache_free(c);
    /* per layer: 3 slots over 2 layers -> 2 + 1, each from its own ranking */
    p.per_layer = true;
    assert_int_equal(tdm_cache_new(&p, &c, &err), TDM_OK);
    assert_int_equal(tdm_cache_layer_slots(c, 0), 2);
    assert_int_equal(tdm_cache_layer_slots(c, 1), 1);
    assert_true(tdm_cache_slot(c, 0, 1) >= 0 && tdm_cache_slot(c, 0, 2) >= 0);
    assert_true(tdm_cache_slot(c, 1, 0) >= 0);
    tdm_cache_free(c);
    /* a global LRU evicts across layers: layer 1 expert 2 replaces layer 0's
     * least recently used */
    tdm_cache_params_init(&p, TDM_CACHE_LRU, 2, 3, 1, 3);
    assert_int_equal(tdm_cache_new(&p, &c, &err), TDM_OK);
    int32_t e1 = 1, e2 = 2;
    assert_int_equal(tdm_cache_access(c, 0, 0, &e1, 1, NULL, NULL, &err), TDM_OK);
    assert_int_equal(tdm_cache_access(c, 0, 1, &e2, 1, NULL, NULL, &err), TDM_OK);
    assert_true(tdm_cache_slot(c, 1, 2) >= 0);
    assert_int_equal(tdm_cache_slot(c, 0, 0), -1);
    tdm_cache_free(c);
    tdm_profile_free(prof);
}

/* ---------------------------------------------------------------- random traces */

static uint64_t rng_state;
static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

/* Skewed ids with phases (a hot set that drifts), distinct within an access. */
static void random_trace(int32_t nl, int32_t ne, int32_t k, int n_tok, int32_t *layers,
                         int32_t *ids)
{
    int shift = 0;
    for (int t = 0; t < n_tok; t++) {
        if (rnd() % 50 == 0)
            shift = (int)(rnd() % ne);
        for (int32_t l = 0; l < nl; l++) {
            int a = t * nl + l;
            layers[a] = l;
            for (int32_t i = 0; i < k; i++) {
                int32_t e;
                bool dup;
                do {
                    uint32_t r = rnd() % 100;
                    e = r < 60 ? (int32_t)((rnd() % 3 + shift + l) % ne) : (int32_t)(rnd() % ne);
                    dup = false;
                    for (int32_t j = 0; j < i; j++)
                        dup |= ids[a * k + j] == e;
                } while (dup);
                ids[a * k + i] = e;
            }
        }
    }
}

static int64_t run_policy(tdm_cache_params *p, int32_t nl, int32_t k, int n_acc,
                          const int32_t *layers, const int32_t *ids, bool check_current)
{
    tdm_cache *c;
    tdm_error err;
    p->future_layer = layers;
    p->future_ids = ids;
    p->n_future = n_acc;
    assert_int_equal(tdm_cache_new(p, &c, &err), TDM_OK);
    for (int a = 0; a < n_acc; a++) {
        int32_t h;
        uint64_t mask;
        const int32_t *cur = ids + (size_t)a * k;
        /* the hit mask must agree with the residency before the access */
        uint64_t want = 0;
        for (int32_t i = 0; i < k; i++)
            want |= (uint64_t)(tdm_cache_slot(c, layers[a], cur[i]) >= 0) << i;
        assert_int_equal(tdm_cache_access(c, a / nl, layers[a], cur, k, &mask, &h, &err), TDM_OK);
        assert_int_equal(mask, want);
        const tdm_cache_swap *sw;
        int32_t ns = tdm_cache_swaps(c, &sw);
        for (int32_t s = 0; check_current && s < ns; s++) {
            if (sw[s].evict_layer != layers[a])
                continue;
            for (int32_t i = 0; i < k; i++)
                assert_int_not_equal(sw[s].evict_expert, cur[i]);
        }
        for (int32_t s = 0; s < ns; s++) {
            /* the oracle may refill a slot it loaded earlier in the same access */
            bool refilled = false;
            for (int32_t s2 = s + 1; s2 < ns; s2++)
                refilled |= sw[s2].slot == sw[s].slot;
            if (!refilled)
                assert_int_equal(tdm_cache_slot(c, sw[s].load_layer, sw[s].load_expert),
                                 sw[s].slot);
        }
    }
    int32_t used = 0;
    for (int32_t l = 0; l < nl; l++)
        used += tdm_cache_layer_slots(c, l);
    assert_true(used <= tdm_cache_n_slots(c));
    tdm_cache_stats st;
    tdm_cache_get_stats(c, &st);
    tdm_cache_free(c);
    return st.hits;
}

/* Belady with bypass and a free first fill bounds every other policy, in
 * both budget modes, on 300 random traces. */
static void test_oracle_bound(void **state)
{
    (void)state;
    enum { NL = 3, NE = 8, K = 2, NT = 120 };
    static int32_t layers[NT * NL], ids[NT * NL * K];
    int beaten_strictly = 0;
    for (int seed = 1; seed <= 300; seed++) {
        rng_state = 0x9E3779B97F4A7C15ULL * (uint64_t)seed;
        random_trace(NL, NE, K, NT, layers, ids);
        /* the profile comes from a different random trace of the same shape */
        tdm_model_id id = {.arch = "test", .layout_hash = 1, .n_layer = NL, .n_expert = NE, .k = K};
        tdm_profile *prof;
        tdm_error err;
        assert_int_equal(tdm_profile_new(&id, &prof, &err), TDM_OK);
        static int32_t pl[NT * NL], pi[NT * NL * K];
        random_trace(NL, NE, K, NT, pl, pi);
        for (int a = 0; a < NT * NL; a++)
            assert_int_equal(tdm_profile_record(prof, pl[a], K, pi + a * K, NULL, &err), TDM_OK);
        tdm_profile_add_tokens(prof, NT);
        int32_t slots = 1 + (int32_t)(rnd() % (NL * NE));
        bool per_layer = seed % 2;
        tdm_cache_params p;
        tdm_cache_params_init(&p, TDM_CACHE_ORACLE, NL, NE, K, slots);
        p.per_layer = per_layer;
        int64_t best = run_policy(&p, NL, K, NT * NL, layers, ids, false), other_max = 0;
        for (int pol = 0; pol < TDM_CACHE_N_POLICIES; pol++) {
            if (pol == TDM_CACHE_ORACLE)
                continue;
            tdm_cache_params_init(&p, (tdm_cache_policy)pol, NL, NE, K, slots);
            p.per_layer = per_layer;
            p.profile = prof;
            p.adapt_every = 1 + (int32_t)(rnd() % 8);
            p.adapt_swaps = (int32_t)(rnd() % 4);
            p.adapt_hysteresis = (float)(rnd() % 3) * 0.2f;
            int64_t h = run_policy(&p, NL, K, NT * NL, layers, ids, pol == TDM_CACHE_ADAPTIVE);
            if (h > best)
                print_error("seed %d: %s %lld hits > oracle %lld (slots %d, per_layer %d)\n",
                            seed, tdm_cache_policy_name(pol), (long long)h, (long long)best,
                            slots, per_layer);
            assert_true(h <= best);
            other_max = h > other_max ? h : other_max;
        }
        beaten_strictly += best > other_max;
        tdm_profile_free(prof);
    }
    /* the bound is not vacuous: the oracle is usually strictly better */
    assert_true(beaten_strictly > 150);
}

/* With adapt_every 1 and as many swaps as slots, the coldest residents are
 * often the ones in use: they must never be chosen. */
static void test_adaptive_never_evicts_current(void **state)
{
    (void)state;
    enum { NL = 2, NE = 10, K = 4, NT = 400 };
    static int32_t layers[NT * NL], ids[NT * NL * K];
    for (int seed = 1; seed <= 40; seed++) {
        rng_state = 0xD1B54A32D192ED03ULL * (uint64_t)seed;
        random_trace(NL, NE, K, NT, layers, ids);
        tdm_cache_params p;
        tdm_cache_params_init(&p, TDM_CACHE_ADAPTIVE, NL, NE, K, 2 * (4 + seed % 4));
        p.per_layer = seed % 2;
        p.adapt_every = 1;
        p.adapt_swaps = 8;
        p.adapt_decay = 0.5f;
        p.adapt_hysteresis = 0.0f;
        run_policy(&p, NL, K, NT * NL, layers, ids, true);
    }
    /* crafted: fill {0,1,2}; 4 and 5 become hot; 0, 1 and 2 have one use
     * each when the first adaptation comes at token 4, during an access of
     * {0, 1}. Ignoring the current ids, 0 and then 1 (lowest ids among the
     * coldest) would go; the policy must evict 2 and then stop (4 is as hot
     * as 5). */
    tdm_cache_params p;
    tdm_cache_params_init(&p, TDM_CACHE_ADAPTIVE, 1, 6, 2, 3);
    p.adapt_every = 4;
    p.adapt_swaps = 3;
    p.adapt_decay = 1.0f;
    p.adapt_hysteresis = 0.0f;
    tdm_cache *c;
    tdm_error err;
    assert_int_equal(tdm_cache_new(&p, &c, &err), TDM_OK);
    int32_t warm[2] = {5, 4}, other[2] = {2, 3}, cur[2] = {0, 1};
    for (int t = 0; t < 3; t++)
        assert_int_equal(tdm_cache_access(c, t, 0, warm, 2, NULL, NULL, &err), TDM_OK);
    assert_int_equal(tdm_cache_access(c, 3, 0, other, 2, NULL, NULL, &err), TDM_OK);
    assert_int_equal(tdm_cache_access(c, 4, 0, cur, 2, NULL, NULL, &err), TDM_OK);
    const tdm_cache_swap *sw;
    assert_int_equal(tdm_cache_swaps(c, &sw), 1);
    assert_int_equal(sw[0].evict_expert, 2);
    assert_int_equal(sw[0].load_expert, 4);
    assert_true(tdm_cache_slot(c, 0, 0) >= 0 && tdm_cache_slot(c, 0, 1) >= 0);
    tdm_cache_free(c);
}

static int64_t alternating_loads(float hysteresis)
{
    tdm_cache_params p;
    tdm_cache_params_init(&p, TDM_CACHE_ADAPTIVE, 1, 2, 1, 1);
    p.adapt_every = 1;
    p.adapt_swaps = 1;
    p.adapt_decay = 0.9f;
    p.adapt_hysteresis = hysteresis;
    tdm_cache *c;
    tdm_error err;
    assert_int_equal(tdm_cache_new(&p, &c, &err), TDM_OK);
    for (int t = 0; t < 1000; t++) {
        int32_t e = t % 2;
        assert_int_equal(tdm_cache_access(c, t, 0, &e, 1, NULL, NULL, &err), TDM_OK);
    }
    tdm_cache_stats st;
    tdm_cache_get_stats(c, &st);
    tdm_cache_free(c);
    return st.loads;
}

static void test_no_ping_pong(void **state)
{
    (void)state;
    /* without hysteresis the just-used expert always looks hotter: it swaps in
     * nearly every token; with the default hysteresis it never swaps */
    assert_true(alternating_loads(0.0f) > 900);
    assert_int_equal(alternating_loads(0.25f), 0);
}

/* Every policy replays a trace with the allocator watched. */
static void test_no_allocation_per_access(void **state)
{
    (void)state;
    alloc_count_or_skip();
    enum { NL = 4, NE = 16, K = 4, NT = 200 };
    static int32_t layers[NT * NL], ids[NT * NL * K];
    rng_state = 12345;
    random_trace(NL, NE, K, NT, layers, ids);
    static const int counts[NL * NE] = {[3] = 5, [17] = 2};
    tdm_profile *prof = profile_from_counts(NL, NE, K, counts, 0);
    for (int pol = 0; pol < TDM_CACHE_N_POLICIES; pol++) {
        tdm_cache_params p;
        tdm_cache_params_init(&p, (tdm_cache_policy)pol, NL, NE, K, 20);
        p.profile = prof;
        p.adapt_every = 1;
        p.future_layer = layers;
        p.future_ids = ids;
        p.n_future = NT * NL;
        tdm_cache *c;
        tdm_error err;
        assert_int_equal(tdm_cache_new(&p, &c, &err), TDM_OK);
        alloc_count_start();
        int64_t hits = 0;
        for (int a = 0; a < NT * NL; a++) {
            int32_t h;
            tdm_cache_access(c, a / NL, layers[a], ids + a * K, K, NULL, &h, &err);
            hits += h;
        }
        assert_int_equal(alloc_count_stop(), 0);
        tdm_cache_stats st;
        tdm_cache_get_stats(c, &st);
        assert_int_equal(st.hits, hits);
        assert_int_equal(st.accesses, NT * NL * K);
        tdm_cache_free(c);
    }
    /* the counter itself works */
    alloc_count_start();
    void *volatile probe = malloc(16); /* volatile: the pair must not be optimised away */
    const int calls = alloc_count_stop();
    free(probe);
    assert_int_equal(calls, 1);
    tdm_profile_free(prof);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    tdm_cache_params p;
    tdm_cache *c = NULL;
    tdm_error err;
    tdm_cache_params_init(&p, TDM_CACHE_STATIC, 2, 4, 2, 4);
    assert_int_equal(tdm_cache_new(&p, &c, &err), TDM_ERR_INVALID); /* no profile */
    assert_non_null(strstr(err.msg, "profile"));
    static const int counts[12] = {0};
    tdm_profile *other = profile_from_counts(3, 4, 1, counts, 0);
    p.profile = other;
    assert_int_equal(tdm_cache_new(&p, &c, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.msg, "another model"));
    tdm_profile_free(other);
    tdm_cache_params_init(&p, TDM_CACHE_LRU, 2, 4, 2, -1);
    assert_int_equal(tdm_cache_new(&p, &c, &err), TDM_ERR_INVALID);
    tdm_cache_params_init(&p, TDM_CACHE_ADAPTIVE, 2, 4, 2, 4);
    p.adapt_decay = 0.0f;
    assert_int_equal(tdm_cache_new(&p, &c, &err), TDM_ERR_INVALID);
    tdm_cache_params_init(&p, TDM_CACHE_LRU, 2, 4, 5, 4);
    assert_int_equal(tdm_cache_new(&p, &c, &err), TDM_ERR_INVALID); /* k > n_expert */
    tdm_cache_params_init(&p, TDM_CACHE_LRU, 4096, 4097, 2, 4); /* > TDM_PROFILE_MAX_EXPERTS */
    assert_int_equal(tdm_cache_new(&p, &c, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.msg, "4096 layers x 4097 experts"));
    assert_null(c);

    tdm_cache_params_init(&p, TDM_CACHE_LRU, 2, 4, 2, 100); /* more slots than experts */
    assert_int_equal(tdm_cache_new(&p, &c, &err), TDM_OK);
    assert_int_equal(tdm_cache_n_slots(c), 8);
    int32_t dup[2] = {1, 1}, big[2] = {0, 4}, ok[2] = {0, 3};
    assert_int_equal(tdm_cache_access(c, 0, 2, ok, 2, NULL, NULL, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_cache_access(c, 0, 0, dup, 2, NULL, NULL, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_cache_access(c, 0, 0, big, 2, NULL, NULL, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_cache_access(c, 0, 0, ok, 3, NULL, NULL, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_cache_access(c, 0, 0, ok, 0, NULL, NULL, &err), TDM_ERR_INVALID);
    int32_t h = -1;
    assert_int_equal(tdm_cache_access(c, 0, 1, ok, 2, NULL, &h, &err), TDM_OK);
    assert_int_equal(h, 2); /* everything fits */
    assert_int_equal(tdm_cache_slot(c, 5, 0), -1);
    assert_int_equal(tdm_cache_slot(c, 0, -1), -1);
    tdm_cache_free(c);

    /* the oracle refuses an access its future does not hold */
    int32_t fl[2] = {0, 1}, fi[4] = {0, 1, 2, 3};
    tdm_cache_params_init(&p, TDM_CACHE_ORACLE, 2, 4, 2, 2);
    p.future_layer = fl;
    p.future_ids = fi;
    p.n_future = 2;
    assert_int_equal(tdm_cache_new(&p, &c, &err), TDM_OK);
    assert_int_equal(tdm_cache_access(c, 0, 0, fi + 2, 2, NULL, NULL, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.msg, "oracle"));
    assert_int_equal(tdm_cache_access(c, 0, 0, fi, 2, NULL, NULL, &err), TDM_OK);
    assert_int_equal(tdm_cache_access(c, 0, 1, fi + 2, 2, NULL, NULL, &err), TDM_OK);
    assert_int_equal(tdm_cache_access(c, 1, 0, fi, 2, NULL, NULL, &err), TDM_ERR_INVALID);
    tdm_cache_free(c);
    fi[1] = 9;
    assert_int_equal(tdm_cache_new(&p, &c, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_cache_policy_parse("adaptive"), TDM_CACHE_ADAPTIVE);
    assert_int_equal(tdm_cache_policy_parse("fifo"), -1);
    assert_string_equal(tdm_cache_policy_name(TDM_CACHE_LFU), "lfu");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hand_traces),
        cmocka_unit_test(test_adaptive_hand),
        cmocka_unit_test(test_global_budget),
        cmocka_unit_test(test_layer_fill_even_first),
        cmocka_unit_test(test_oracle_bound),
        cmocka_unit_test(test_adaptive_never_evicts_current),
        cmocka_unit_test(test_no_ping_pong),
        cmocka_unit_test(test_no_allocation_per_access),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
