/* test_expert_cache: slot layout and contents against the file, the fill
 * order, swaps executed as copies, slots lent and reclaimed, the device
 * table, the budget ledger's
 * arithmetic on hand-computed cases and its refusal message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "expert_cache.h"
#include "gguf.h"
#include "model_fixtures.h"

/* A device that forwards to the host one and counts what it is asked. */
typedef struct counting { int allocs, frees, copies, syncs; } counting;
static tdm_status c_alloc(void *ctx, size_t b, void **a, tdm_error *e)
{
    ((counting *)ctx)->allocs++;
    return tdm_expert_device_host()->arena_alloc(NULL, b, a, e);
}
static void c_free(void *ctx, void *a)
{
    ((counting *)ctx)->frees++;
    tdm_expert_device_host()->arena_free(NULL, a);
}
static tdm_status c_copy(void *ctx, void *a, size_t off, int n, const void *const *s, const size_t *b, tdm_error *e)
{
    ((counting *)ctx)->copies++;
    return tdm_expert_device_host()->copy(NULL, a, off, n, s, b, e);
}
static tdm_status c_sync(void *ctx, tdm_error *e)
{
    ((counting *)ctx)->syncs++;
    return tdm_expert_device_host()->sync(NULL, e);
}

/* Every resident (layer, expert) has the file's bytes in its slot. */
static void check_contents(const tdm_model *m, const tdm_expert_cache *c)
{
    const tdm_hparams *hp = tdm_model_hparams(m);
    const uint8_t *arena = tdm_expert_cache_arena(c);
    const size_t sb = tdm_expert_cache_slot_bytes(c);
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const tdm_layer *L = tdm_model_layer(m, il);
        for (int32_t e = 0; e < hp->n_expert; e++) {
            const int32_t s = tdm_expert_cache_slot(c, il, e);
            if (s < 0 || L->ffn != TDM_FFN_MOE)
                continue;
            const uint8_t *p = arena + (size_t)s * sb;
            const size_t g = L->gate_exps.mat_bytes, u = L->up_exps.mat_bytes, d = L->down_exps.mat_bytes;
            assert_memory_equal(p, (const uint8_t *)L->gate_exps.data + e * g, g);
            assert_memory_equal(p + g, (const uint8_t *)L->up_exps.data + e * u, u);
            assert_memory_equal(p + g + u, (const uint8_t *)L->down_exps.data + e * d, d);
            tdm_experts_desc dd = tdm_expert_cache_desc(c, il);
            assert_ptr_equal((const uint8_t *)dd.gate + (size_t)s * dd.gate_stride, p);
            assert_ptr_equal((const uint8_t *)dd.down + (size_t)s * dd.down_stride, p + g + u);
        }
    }
}

static void test_fill_and_swaps(void **state)
{
    (void)state;
    alarm(120);
    tdm_model *m = fx_load_micro_f32("micro-qwen3moe");
    const tdm_hparams *hp = tdm_model_hparams(m);
    const tdm_layer *L0 = tdm_model_layer(m, 0);
    size_t want = L0->gate_exps.mat_bytes + L0->up_exps.mat_bytes + L0->down_exps.mat_bytes;
    want = (want + 63) / 64 * 64;
    assert_int_equal(tdm_expert_cache_slot_bytes_for(m), want);
    counting cnt = {0};
    tdm_expert_device dev = {"counting", &cnt, c_alloc, c_free, c_copy, c_sync, NULL};
    const int32_t E = hp->n_expert, ns = E + 3;
    const int32_t l2 = hp->n_layer > 2 ? 2 : 1; /* the fill's second layer (even layers first) */
    tdm_cache_params cp;
    tdm_cache_params_init(&cp, TDM_CACHE_ADAPTIVE, hp->n_layer, E, hp->n_expert_used, ns);
    cp.adapt_every = 1;
    tdm_expert_cache *c;
    tdm_error err = {0};
    assert_int_equal(tdm_expert_cache_new(m, &cp, &dev, &c, &err), TDM_OK);
    assert_int_equal(tdm_expert_cache_n_slots(c), ns);
    assert_int_equal(cnt.allocs, 1);
    assert_int_equal(cnt.copies, ns);
    /* whole layers: all of layer 0, then 3 of the next even one */
    int res1 = 0;
    for (int32_t e = 0; e < E; e++) {
        assert_true(tdm_expert_cache_slot(c, 0, e) >= 0);
        res1 += tdm_expert_cache_slot(c, l2, e) >= 0;
    }
    assert_int_equal(res1, 3);
    check_contents(m, c);
    tdm_expert_cache_stats st;
    tdm_expert_cache_get_stats(c, &st);
    assert_int_equal(st.bytes_filled, (uint64_t)ns * want);
    /* route layer 1 to non-resident experts until the policy swaps them in */
    int32_t ids[64];
    int32_t n = 0;
    for (int32_t e = 0; e < E && n < hp->n_expert_used; e++)
        if (tdm_expert_cache_slot(c, l2, e) < 0)
            ids[n++] = e;
    for (int64_t t = 0; t < 4; t++)
        assert_int_equal(tdm_expert_cache_record(c, t, l2, ids, n, &err), TDM_OK);
    tdm_expert_cache_get_stats(c, &st);
    assert_true(st.swaps > 0);
    assert_int_equal(st.bytes_moved, (uint64_t)st.swaps * want);
    assert_int_equal(cnt.copies, ns + st.swaps);
    assert_true(tdm_expert_cache_slot(c, l2, ids[0]) >= 0);
    check_contents(m, c);
    /* counters */
    tdm_expert_cache_count(c, l2, 5, 2);
    tdm_expert_cache_count(c, hp->n_layer, 100, 100); /* ignored */
    assert_int_equal(tdm_expert_cache_layer_hits(c, l2), 5);
    assert_int_equal(tdm_expert_cache_layer_misses(c, l2), 2);
    assert_int_equal(tdm_expert_cache_layer_hits(c, -1), 0);
    /* bad routing: policy error, nothing copied */
    ids[0] = E;
    const int before = cnt.copies;
    assert_int_equal(tdm_expert_cache_record(c, 5, l2, ids, n, &err), TDM_ERR_INVALID);
    assert_int_equal(cnt.copies, before);
    tdm_expert_cache_free(c);
    assert_int_equal(cnt.frees, 1);
    /* zero slots: no arena, every lookup misses */
    cp.n_slots = 0;
    assert_int_equal(tdm_expert_cache_new(m, &cp, &dev, &c, &err), TDM_OK);
    assert_int_equal(tdm_expert_cache_slot(c, 0, 0), -1);
    assert_null(tdm_expert_cache_arena(c));
    tdm_expert_cache_free(c);
    /* incomplete device table, wrong shape */
    tdm_expert_device bad = dev;
    bad.copy = NULL;
    c = NULL;
    assert_int_equal(tdm_expert_cache_new(m, &cp, &bad, &c, &err), TDM_ERR_INVALID);
    assert_null(c);
    cp.n_expert = E + 1;
    assert_int_equal(tdm_expert_cache_new(m, &cp, &dev, &c, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.msg, "policy shape"));
    tdm_model_free(m);
    alarm(0);
}

/* An asynchronous device: copies are done at once on the host but count as
 * landed only when the test says so (poll). */
static bool landed;
static bool c_poll(void *ctx)
{
    (void)ctx;
    return landed;
}

/* The asynchronous tests' set-up: the micro model's cache of E + 3 slots on
 * the asynchronous device (the fill: layer 0 whole, 3 experts of its second
 * layer l2, slots E .. E + 2), the adaptive policy re-planning every token;
 * ids[n]: k experts of l2 the fill left out. Copies land when `landed` is
 * set (cleared here). */
typedef struct async_fx {
    tdm_model *m;
    counting cnt;
    tdm_expert_device dev; /* the cache's device: lives as long as c */
    int32_t l2, ids[64], n;
    tdm_expert_cache *c;
} async_fx;

static void async_fx_open(async_fx *f)
{
    alarm(120);
    *f = (async_fx){.m = fx_load_micro_f32("micro-qwen3moe")};
    f->dev = (tdm_expert_device){"async", &f->cnt, c_alloc, c_free, c_copy, c_sync, c_poll};
    const tdm_hparams *hp = tdm_model_hparams(f->m);
    f->l2 = hp->n_layer > 2 ? 2 : 1; /* the fill's second layer (even layers first) */
    landed = false;
    tdm_cache_params cp;
    tdm_cache_params_init(&cp, TDM_CACHE_ADAPTIVE, hp->n_layer, hp->n_expert, hp->n_expert_used, hp->n_expert + 3);
    cp.adapt_every = 1;
    tdm_error err = {0};
    assert_int_equal(tdm_expert_cache_new(f->m, &cp, &f->dev, &f->c, &err), TDM_OK); /* the fill syncs */
    for (int32_t e = 0; e < hp->n_expert && f->n < hp->n_expert_used; e++)
        if (tdm_expert_cache_slot(f->c, f->l2, e) < 0)
            f->ids[f->n++] = e;
}

static void async_fx_close(async_fx *f)
{
    tdm_expert_cache_free(f->c);
    tdm_model_free(f->m);
    alarm(0);
}

/* Routes layer l2 to ids until the policy swaps (at most 8 tokens). */
static tdm_expert_cache_stats route_until_swaps(tdm_expert_cache *c, int32_t l2, const int32_t *ids, int32_t n)
{
    tdm_error err = {0};
    tdm_expert_cache_stats st = {0};
    for (int64_t t = 0; t < 8 && st.swaps == 0; t++) {
        assert_int_equal(tdm_expert_cache_record(c, t, l2, ids, n, &err), TDM_OK);
        tdm_expert_cache_get_stats(c, &st);
    }
    assert_true(st.swaps > 0);
    return st;
}

/* A swap unpublishes the evicted expert at once and publishes the loaded one
 * only after its copy landed: nothing reads a slot while it is written. */
static void test_deferred_publish(void **state)
{
    (void)state;
    async_fx f;
    async_fx_open(&f);
    tdm_expert_cache *c = f.c;
    const tdm_hparams *hp = tdm_model_hparams(f.m);
    const int32_t E = hp->n_expert, l2 = f.l2, n = f.n, *ids = f.ids;
    tdm_error err = {0};
    assert_int_equal(tdm_expert_cache_pending(c), 0);
    const uint64_t v0 = tdm_expert_cache_version(c);
    route_until_swaps(c, l2, ids, n);
    assert_true(tdm_expert_cache_pending(c) > 0);
    assert_true(tdm_expert_cache_version(c) > v0);
    /* the loads are in flight: published nowhere, and no two experts share a slot */
    int published = 0;
    for (int32_t i = 0; i < n; i++)
        published += tdm_expert_cache_slot(c, l2, ids[i]) >= 0;
    assert_int_equal(published, 0);
    const int32_t *res = tdm_expert_cache_residency(c);
    uint8_t *used = calloc((size_t)E + 3, 1);
    for (int32_t i = 0; i < hp->n_layer * E; i++)
        if (res[i] >= 0) {
            assert_int_equal(used[res[i]], 0);
            used[res[i]] = 1;
        }
    free(used);
    const uint64_t v1 = tdm_expert_cache_version(c);
    const int syncs = f.cnt.syncs;
    assert_int_equal(tdm_expert_cache_settle(c, false, &err), TDM_OK); /* not landed: nothing changes */
    assert_int_equal(tdm_expert_cache_version(c), v1);
    assert_int_equal(f.cnt.syncs, syncs);
    landed = true;
    assert_int_equal(tdm_expert_cache_settle(c, false, &err), TDM_OK);
    assert_int_equal(tdm_expert_cache_pending(c), 0);
    assert_true(tdm_expert_cache_version(c) > v1);
    for (int32_t i = 0, got = 0; i < n; i++, published = got)
        got = published + (tdm_expert_cache_slot(c, l2, ids[i]) >= 0);
    assert_true(published > 0);
    check_contents(f.m, c);
    async_fx_close(&f);
}

/* Lent slots: their experts unpublished at once and their memory handed
 * out; swaps the policy plans into them meanwhile copy nothing; reclaim
 * copies back whatever the policy holds there, published once landed. */
static void test_lend_reclaim(void **state)
{
    (void)state;
    async_fx f;
    async_fx_open(&f);
    tdm_expert_cache *c = f.c;
    const tdm_hparams *hp = tdm_model_hparams(f.m);
    const int32_t E = hp->n_expert, ns = E + 3, lend = 4, first = ns - lend, l2 = f.l2, n = f.n, *ids = f.ids;
    tdm_error err = {0};
    const size_t sb = tdm_expert_cache_slot_bytes(c);
    void *mem = NULL;
    assert_int_equal(tdm_expert_cache_lend(c, 0, &mem, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_expert_cache_lend(c, ns + 1, &mem, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_expert_cache_lent(c), 0);
    const uint64_t v0 = tdm_expert_cache_version(c);
    assert_int_equal(tdm_expert_cache_lend(c, lend, &mem, &err), TDM_OK);
    assert_ptr_equal(mem, (const uint8_t *)tdm_expert_cache_arena(c) + (size_t)first * sb);
    assert_int_equal(tdm_expert_cache_lent(c), lend);
    assert_true(tdm_expert_cache_version(c) > v0);
    void *again = NULL;
    assert_int_equal(tdm_expert_cache_lend(c, 1, &again, &err), TDM_ERR_INVALID);
    memset(mem, 0xa5, (size_t)lend * sb); /* the borrower's data */
    const int32_t *res = tdm_expert_cache_residency(c);
    int resident = 0;
    for (int32_t i = 0; i < hp->n_layer * E; i++) {
        assert_true(res[i] < first);
        resident += res[i] >= 0;
    }
    assert_int_equal(resident, first);
    /* the policy swaps inside layer l2, whose slots are all lent: no copies */
    const int copies = f.cnt.copies;
    tdm_expert_cache_stats st = route_until_swaps(c, l2, ids, n);
    assert_int_equal(f.cnt.copies, copies);
    for (int32_t i = 0; i < hp->n_layer * E; i++)
        assert_true(res[i] < first);
    for (size_t i = 0; i < (size_t)lend * sb; i++)
        assert_int_equal(((const uint8_t *)mem)[i], 0xa5);
    /* reclaim: one copy per lent slot, published when landed */
    assert_int_equal(tdm_expert_cache_reclaim(c, &err), TDM_OK);
    assert_int_equal(tdm_expert_cache_lent(c), 0);
    assert_int_equal(f.cnt.copies, copies + lend);
    assert_int_equal(tdm_expert_cache_pending(c), lend);
    for (int32_t i = 0; i < hp->n_layer * E; i++)
        assert_true(res[i] < first);
    landed = true;
    assert_int_equal(tdm_expert_cache_settle(c, false, &err), TDM_OK);
    resident = 0;
    for (int32_t i = 0; i < hp->n_layer * E; i++)
        resident += res[i] >= 0;
    assert_int_equal(resident, ns);
    int swapped_in = 0;
    for (int32_t i = 0; i < n; i++)
        swapped_in += tdm_expert_cache_slot(c, l2, ids[i]) >= first;
    assert_true(swapped_in > 0);
    check_contents(f.m, c); /* the lent slots hold the file's bytes again */
    tdm_expert_cache_get_stats(c, &st);
    assert_int_equal(st.loans, 1);
    assert_int_equal(st.bytes_reclaimed, (uint64_t)lend * sb);
    assert_int_equal(tdm_expert_cache_reclaim(c, &err), TDM_OK); /* nothing lent: nothing to do */
    assert_int_equal(f.cnt.copies, copies + lend);
    async_fx_close(&f);
}

static void test_ledger_arithmetic(void **state)
{
    (void)state;
    tdm_budget_inputs in = {.weight_bytes = 1000, .kv_bytes = 200, .deltanet_bytes = 50, .scratch_bytes = 250,
                            .slot_bytes = 100, .max_slots = 30, .kv_bytes_per_pos = 2};
    tdm_budget b;
    tdm_error err = {0};
    assert_int_equal(tdm_budget_compute(&in, 2000, &b, &err), TDM_OK);
    assert_int_equal(b.fixed_bytes, 1500);
    assert_int_equal(b.n_slots, 5);
    assert_int_equal(b.slot_total, 500);
    assert_int_equal(b.spare, 0);
    assert_int_equal(tdm_budget_compute(&in, 2099, &b, &err), TDM_OK);
    assert_int_equal(b.n_slots, 5);
    assert_int_equal(b.spare, 99);
    assert_int_equal(tdm_budget_compute(&in, 1500, &b, &err), TDM_OK); /* exactly the fixed part */
    assert_int_equal(b.n_slots, 0);
    assert_int_equal(tdm_budget_compute(&in, 10000, &b, &err), TDM_OK); /* capped at every expert */
    assert_int_equal(b.n_slots, 30);
    assert_int_equal(b.spare, 10000 - 1500 - 3000);
    /* refusals: KV does not fit -> the largest context; nothing fits */
    assert_int_equal(tdm_budget_compute(&in, 1400, &b, &err), TDM_ERR_OOM);
    assert_int_equal(b.n_slots, 0);
    assert_non_null(strstr(err.msg, "(1400 bytes)"));
    assert_non_null(strstr(err.msg, "need at least 1500 bytes"));
    assert_non_null(strstr(err.msg, "largest context that fits is 50 positions"));
    assert_int_equal(tdm_budget_compute(&in, 1200, &b, &err), TDM_ERR_OOM);
    assert_non_null(strstr(err.msg, "no context fits"));
    char line[512];
    assert_int_equal(tdm_budget_compute(&in, 2000, &b, &err), TDM_OK);
    tdm_budget_format(&b, line, sizeof line);
    assert_non_null(strstr(line, "5 expert slots"));
}

/* The model's inputs: routed experts + the rest = every tensor; KV and state
 * from the hyper-parameters. */
static void test_ledger_inputs(void **state)
{
    (void)state;
    const char *names[] = {"micro-qwen3moe", "micro-qwen3next", "micro-qwen35moe"};
    for (int i = 0; i < 3; i++) {
        tdm_model *m = fx_load_micro_f32(names[i]);
        const tdm_hparams *hp = tdm_model_hparams(m);
        tdm_budget_inputs in;
        tdm_error err = {0};
        assert_int_equal(tdm_budget_inputs_for(m, 100, 4, &in, &err), TDM_OK);
        uint64_t all = 0, experts = 0;
        const tdm_gguf *g = tdm_model_gguf(m);
        for (int64_t t = 0; t < tdm_gguf_tensor_count(g); t++)
            all += tdm_gguf_tensor_at(g, t)->nbytes;
        int32_t n_moe = 0;
        for (int32_t il = 0; il < hp->n_layer; il++) {
            const tdm_layer *L = tdm_model_layer(m, il);
            if (L->ffn == TDM_FFN_MOE) {
                n_moe++;
                experts += (L->gate_exps.mat_bytes + L->up_exps.mat_bytes + L->down_exps.mat_bytes) *
                           (uint64_t)hp->n_expert;
            }
        }
        assert_int_equal(in.weight_bytes + experts, all);
        assert_int_equal(in.kv_bytes, (uint64_t)hp->n_attn_layers * 100 * 2 * hp->n_head_kv * hp->head_dim * 2);
        if (hp->n_rec_layers)
            assert_true(in.deltanet_bytes > 0);
        else
            assert_int_equal(in.deltanet_bytes, 0);
        assert_int_equal(in.max_slots, (int64_t)n_moe * hp->n_expert);
        assert_int_equal(in.slot_bytes, tdm_expert_cache_slot_bytes_for(m));
        /* a streaming span (8 batches of 4 at n_ctx 100, n_ctx when shorter, never below a batch):
         * its rows beyond max_batch are the only scratch that grows with n_ctx */
        assert_int_equal(tdm_stream_span(4, 100), 32);
        assert_int_equal(tdm_stream_span(4, 20), 20);
        assert_int_equal(tdm_stream_span(4, 3), 4);
        tdm_budget_inputs one;
        assert_int_equal(tdm_budget_inputs_for(m, 4, 4, &one, &err), TDM_OK);
        const uint64_t k = (uint64_t)(hp->n_expert_used > 0 ? hp->n_expert_used : 1);
        assert_int_equal(in.scratch_bytes - one.scratch_bytes,
                         (uint64_t)(32 - 4) * 4u * (2u * (uint64_t)hp->n_embd + 1 + ((uint64_t)hp->n_layer + 1) * k));
        assert_int_equal(tdm_budget_inputs_for(m, 0, 4, &in, &err), TDM_ERR_INVALID);
        tdm_budget b;
        assert_int_equal(tdm_budget_plan(m, 100, 4, 1000, &b, &err), TDM_ERR_OOM);
        printf("  %s: %s\n", names[i], err.msg);
        tdm_model_free(m);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fill_and_swaps),
        cmocka_unit_test(test_deferred_publish),
        cmocka_unit_test(test_lend_reclaim),
        cmocka_unit_test(test_ledger_arithmetic),
        cmocka_unit_test(test_ledger_inputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
