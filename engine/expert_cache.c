/* expert_cache: slot arena + residency (tdm_cache) + the VRAM budget ledger. */
#include "expert_cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"

struct tdm_expert_cache {
    const tdm_model *m;
    const tdm_expert_device *dev;
    tdm_cache *pol;
    int32_t n_layer, n_expert, n_slots;
    size_t slot_bytes;
    void *arena;              /* [n_slots][slot_bytes] on the device */
    int32_t *pub;             /* [n_layer * n_expert] published residency */
    int32_t *pend;            /* [n_slots] pub indices loaded but not yet published */
    int32_t n_pend;
    int32_t lent;             /* the last `lent` slots are lent out (tdm_expert_cache_lend), 0: none */
    uint64_t version;
    int64_t *hits, *misses;   /* [n_layer] */
    int64_t swaps, loans;
    uint64_t bytes_filled, bytes_moved, bytes_reclaimed;
};

/* ---- host device ---- */

static tdm_status host_alloc(void *ctx, size_t bytes, void **arena, tdm_error *err)
{
    (void)ctx;
    size_t n = (bytes + 63) / 64 * 64;
    *arena = aligned_alloc(64, n ? n : 64);
    if (!*arena)
        return tdm_error_set(err, TDM_ERR_OOM, "expert cache: cannot allocate a %zu-byte host arena", bytes);
    return TDM_OK;
}

static void host_free(void *ctx, void *arena)
{
    (void)ctx;
    free(arena);
}

static tdm_status host_copy(void *ctx, void *arena, size_t offset, int n, const void *const *src,
                            const size_t *bytes, tdm_error *err)
{
    (void)ctx;
    (void)err;
    uint8_t *dst = (uint8_t *)arena + offset;
    for (int i = 0; i < n; i++) {
        memcpy(dst, src[i], bytes[i]);
        dst += bytes[i];
    }
    return TDM_OK;
}

static tdm_status host_sync(void *ctx, tdm_error *err)
{
    (void)ctx;
    (void)err;
    return TDM_OK;
}

static const tdm_expert_device host_device = {"host", NULL, host_alloc, host_free, host_copy, host_sync, NULL};

const tdm_expert_device *tdm_expert_device_host(void) { return &host_device; }

/* ---- slots ---- */

static bool is_moe(const tdm_layer *L) { return L->ffn == TDM_FFN_MOE && L->gate_exps.data; }

size_t tdm_expert_cache_slot_bytes_for(const tdm_model *m)
{
    const tdm_hparams *hp = tdm_model_hparams(m);
    size_t best = 0;
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const tdm_layer *L = tdm_model_layer(m, il);
        if (!is_moe(L))
            continue;
        size_t b = L->gate_exps.mat_bytes + L->up_exps.mat_bytes + L->down_exps.mat_bytes;
        best = b > best ? b : best;
    }
    return (best + 63) / 64 * 64; /* keep every slot 64-byte aligned */
}

static tdm_status load_slot(tdm_expert_cache *c, int32_t slot, int32_t il, int32_t e, tdm_error *err)
{
    const tdm_layer *L = tdm_model_layer(c->m, il);
    if (!is_moe(L) || e < 0 || e >= L->gate_exps.n_mat)
        return TDM_OK; /* a dense layer's slot share stays empty */
    const void *src[3] = {(const uint8_t *)L->gate_exps.data + (size_t)e * L->gate_exps.mat_bytes,
                          (const uint8_t *)L->up_exps.data + (size_t)e * L->up_exps.mat_bytes,
                          (const uint8_t *)L->down_exps.data + (size_t)e * L->down_exps.mat_bytes};
    const size_t bytes[3] = {L->gate_exps.mat_bytes, L->up_exps.mat_bytes, L->down_exps.mat_bytes};
    tdm_status st = c->dev->copy(c->dev->ctx, c->arena, (size_t)slot * c->slot_bytes, 3, src, bytes, err);
    if (st)
        return tdm_error_wrap(err, "expert cache: copy layer %d expert %d to slot %d", il, e, slot);
    return TDM_OK;
}

tdm_status tdm_expert_cache_new(const tdm_model *m, const tdm_cache_params *p, const tdm_expert_device *dev,
                                tdm_expert_cache **out, tdm_error *err)
{
    *out = NULL;
    const tdm_hparams *hp = tdm_model_hparams(m);
    if (!dev || !dev->arena_alloc || !dev->arena_free || !dev->copy || !dev->sync)
        return tdm_error_set(err, TDM_ERR_INVALID, "expert cache: incomplete device table");
    if (p->n_layer != hp->n_layer || p->n_expert != hp->n_expert || p->k != hp->n_expert_used)
        return tdm_error_set(err, TDM_ERR_INVALID,
                             "expert cache: policy shape %d layers x %d experts (k %d), model %d x %d (k %d)",
                             p->n_layer, p->n_expert, p->k, hp->n_layer, hp->n_expert, hp->n_expert_used);
    tdm_expert_cache *c = calloc(1, sizeof *c);
    if (!c)
        return tdm_error_set(err, TDM_ERR_OOM, "expert cache: out of memory");
    c->m = m;
    c->dev = dev;
    c->n_layer = hp->n_layer;
    c->n_expert = hp->n_expert;
    c->slot_bytes = tdm_expert_cache_slot_bytes_for(m);
    c->hits = calloc((size_t)c->n_layer, sizeof *c->hits);
    c->misses = calloc((size_t)c->n_layer, sizeof *c->misses);
    c->pub = malloc((size_t)c->n_layer * (size_t)(c->n_expert > 0 ? c->n_expert : 1) * sizeof *c->pub);
    tdm_status st = TDM_OK;
    if (!c->hits || !c->misses || !c->pub)
        st = tdm_error_set(err, TDM_ERR_OOM, "expert cache: out of memory");
    if (!st)
        st = tdm_cache_new(p, &c->pol, err);
    if (!st) {
        c->n_slots = c->slot_bytes ? tdm_cache_n_slots(c->pol) : 0;
        if (c->n_slots > 0)
            st = dev->arena_alloc(dev->ctx, (size_t)c->n_slots * c->slot_bytes, &c->arena, err);
    }
    const int32_t *res = st ? NULL : tdm_cache_residency(c->pol);
    for (int32_t i = 0; !st && c->n_slots > 0 && i < c->n_layer * c->n_expert; i++)
        if (res[i] >= 0) {
            st = load_slot(c, res[i], i / c->n_expert, i % c->n_expert, err);
            c->bytes_filled += st ? 0 : c->slot_bytes;
        }
    if (!st && c->n_slots > 0)
        st = dev->sync(dev->ctx, err);
    if (!st && c->n_slots > 0 && !(c->pend = malloc((size_t)c->n_slots * sizeof *c->pend)))
        st = tdm_error_set(err, TDM_ERR_OOM, "expert cache: out of memory");
    if (!st)
        memcpy(c->pub, res, (size_t)c->n_layer * (size_t)c->n_expert * sizeof *c->pub);
    if (st) {
        tdm_expert_cache_free(c);
        return st;
    }
    *out = c;
    return TDM_OK;
}

void tdm_expert_cache_free(tdm_expert_cache *c)
{
    if (!c)
        return;
    if (c->arena)
        c->dev->arena_free(c->dev->ctx, c->arena);
    tdm_cache_free(c->pol);
    free(c->pub);
    free(c->pend);
    free(c->hits);
    free(c->misses);
    free(c);
}

int32_t tdm_expert_cache_n_slots(const tdm_expert_cache *c) { return c->n_slots; }
size_t tdm_expert_cache_slot_bytes(const tdm_expert_cache *c) { return c->slot_bytes; }
const void *tdm_expert_cache_arena(const tdm_expert_cache *c) { return c->arena; }

int32_t tdm_expert_cache_slot(const tdm_expert_cache *c, int32_t layer, int32_t expert)
{
    if (c->n_slots <= 0 || layer < 0 || layer >= c->n_layer || expert < 0 || expert >= c->n_expert)
        return -1;
    return c->pub[(size_t)layer * c->n_expert + expert];
}

const int32_t *tdm_expert_cache_residency(const tdm_expert_cache *c) { return c->pub; }
uint64_t tdm_expert_cache_version(const tdm_expert_cache *c) { return c->version; }
int32_t tdm_expert_cache_pending(const tdm_expert_cache *c) { return c->n_pend; }

tdm_status tdm_expert_cache_settle(tdm_expert_cache *c, bool wait, tdm_error *err)
{
    if (!c->n_pend)
        return TDM_OK;
    if (wait || !c->dev->poll) {
        tdm_status st = c->dev->sync(c->dev->ctx, err);
        if (st)
            return st;
    } else if (!c->dev->poll(c->dev->ctx)) {
        return TDM_OK;
    }
    /* The policy's table is the truth: a load evicted again meanwhile stays
     * -1, and so does one moved into a lent slot (reclaim publishes it). */
    const int32_t *res = tdm_cache_residency(c->pol);
    for (int32_t i = 0; i < c->n_pend; i++)
        c->pub[c->pend[i]] = res[c->pend[i]] < c->n_slots - c->lent ? res[c->pend[i]] : -1;
    c->n_pend = 0;
    c->version++;
    return TDM_OK;
}

tdm_experts_desc tdm_expert_cache_desc(const tdm_expert_cache *c, int32_t il)
{
    const tdm_layer *L = tdm_model_layer(c->m, il);
    const uint8_t *a = c->arena;
    const size_t g = L->gate_exps.mat_bytes, u = L->up_exps.mat_bytes;
    return (tdm_experts_desc){
        .gate = a, .up = a ? a + g : NULL, .down = a ? a + g + u : NULL,
        .gate_type = L->gate_exps.type, .up_type = L->up_exps.type, .down_type = L->down_exps.type,
        .gate_stride = c->slot_bytes, .up_stride = c->slot_bytes, .down_stride = c->slot_bytes,
        .n_embd = L->gate_exps.cols, .n_ff = L->gate_exps.rows, .n_expert = c->n_slots,
    };
}

void tdm_expert_cache_count(tdm_expert_cache *c, int32_t il, int64_t hits, int64_t misses)
{
    if (il < 0 || il >= c->n_layer)
        return;
    c->hits[il] += hits;
    c->misses[il] += misses;
}

/* Copies the expert at published index pi (layer * n_expert + expert) into
 * slot and lists it as pending (published once landed, settle). */
static tdm_status load_pending(tdm_expert_cache *c, int32_t slot, int32_t pi, tdm_error *err)
{
    tdm_status st = load_slot(c, slot, pi / c->n_expert, pi % c->n_expert, err);
    if (st)
        return st;
    /* a full list (a slot reloaded while pending): wait rather than grow it */
    if (c->n_pend == c->n_slots && (st = tdm_expert_cache_settle(c, true, err)))
        return st;
    c->pend[c->n_pend++] = pi;
    return TDM_OK;
}

tdm_status tdm_expert_cache_record(tdm_expert_cache *c, int64_t token, int32_t il, const int32_t *ids, int32_t n,
                                   tdm_error *err)
{
    tdm_status st = tdm_cache_access(c->pol, token, il, ids, n, NULL, NULL, err);
    if (st || c->n_slots == 0)
        return st;
    const tdm_cache_swap *sw;
    int32_t ns = tdm_cache_swaps(c->pol, &sw);
    for (int32_t i = 0; i < ns; i++) {
        const int32_t load = sw[i].load_layer * c->n_expert + sw[i].load_expert;
        if (sw[i].evict_layer >= 0)
            c->pub[sw[i].evict_layer * c->n_expert + sw[i].evict_expert] = -1;
        c->pub[load] = -1;
        c->version++;
        c->swaps++;
        if (sw[i].slot >= c->n_slots - c->lent)
            continue; /* a lent slot: tdm_expert_cache_reclaim loads what the policy put there */
        if ((st = load_pending(c, sw[i].slot, load, err)))
            return st;
        c->bytes_moved += c->slot_bytes;
    }
    /* A synchronous device publishes at once (the host emulation, tests). */
    return tdm_expert_cache_settle(c, !c->dev->poll, err);
}

tdm_status tdm_expert_cache_lend(tdm_expert_cache *c, int32_t n, void **mem, tdm_error *err)
{
    *mem = NULL;
    if (c->lent)
        return tdm_error_set(err, TDM_ERR_INVALID, "expert cache: %d slots are lent already", c->lent);
    if (n <= 0 || n > c->n_slots)
        return tdm_error_set(err, TDM_ERR_INVALID, "expert cache: cannot lend %d of %d slots", n, c->n_slots);
    /* a copy still landing in a slot about to be lent would write into the loan */
    tdm_status st = tdm_expert_cache_settle(c, true, err);
    if (st)
        return st;
    const int32_t first = c->n_slots - n;
    for (int32_t i = 0; i < c->n_layer * c->n_expert; i++)
        if (c->pub[i] >= first)
            c->pub[i] = -1;
    c->lent = n;
    c->loans++;
    c->version++;
    *mem = (uint8_t *)c->arena + (size_t)first * c->slot_bytes;
    return TDM_OK;
}

tdm_status tdm_expert_cache_reclaim(tdm_expert_cache *c, tdm_error *err)
{
    if (!c->lent)
        return TDM_OK;
    const int32_t first = c->n_slots - c->lent;
    const int32_t *res = tdm_cache_residency(c->pol);
    c->lent = 0;
    for (int32_t i = 0; i < c->n_layer * c->n_expert; i++) {
        if (res[i] < first)
            continue;
        tdm_status st = load_pending(c, res[i], i, err);
        if (st)
            return st;
        c->bytes_reclaimed += c->slot_bytes;
    }
    return tdm_expert_cache_settle(c, !c->dev->poll, err);
}

int32_t tdm_expert_cache_lent(const tdm_expert_cache *c) { return c->lent; }

void tdm_expert_cache_get_stats(const tdm_expert_cache *c, tdm_expert_cache_stats *out)
{
    memset(out, 0, sizeof *out);
    for (int32_t il = 0; il < c->n_layer; il++) {
        out->hits += c->hits[il];
        out->misses += c->misses[il];
    }
    out->swaps = c->swaps;
    out->bytes_filled = c->bytes_filled;
    out->bytes_moved = c->bytes_moved;
    out->loans = c->loans;
    out->bytes_reclaimed = c->bytes_reclaimed;
}

int32_t tdm_stream_span(int32_t max_batch, int32_t n_ctx)
{
    const int64_t span = (int64_t)TDM_STREAM_SPAN * max_batch;
    return span < n_ctx ? (int32_t)span : n_ctx > max_batch ? n_ctx : max_batch;
}

int64_t tdm_expert_cache_layer_hits(const tdm_expert_cache *c, int32_t il)
{
    return il >= 0 && il < c->n_layer ? c->hits[il] : 0;
}

int64_t tdm_expert_cache_layer_misses(const tdm_expert_cache *c, int32_t il)
{
    return il >= 0 && il < c->n_layer ? c->misses[il] : 0;
}

/* ---- budget ledger ---- */

/* Whether tensor t is a MoE layer's routed-expert stack. By the name the
 * weights keep from the gguf (the same pointer), not by the data: after
 * tdm_model_copy_experts the weights point into the copy, the tensors into
 * the mapping. */
static bool is_routed_expert(const tdm_model *m, const tdm_gguf_tensor *t)
{
    const tdm_hparams *hp = tdm_model_hparams(m);
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const tdm_layer *L = tdm_model_layer(m, il);
        if (is_moe(L) && (t->name == L->gate_exps.name || t->name == L->up_exps.name || t->name == L->down_exps.name))
            return true;
    }
    return false;
}

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

tdm_status tdm_budget_inputs_for(const tdm_model *m, int32_t n_ctx, int32_t max_batch, tdm_budget_inputs *out,
                                 tdm_error *err)
{
    memset(out, 0, sizeof *out);
    if (n_ctx <= 0 || max_batch <= 0)
        return tdm_error_set(err, TDM_ERR_INVALID, "budget: n_ctx %d and max_batch %d must be > 0", n_ctx, max_batch);
    const tdm_hparams *hp = tdm_model_hparams(m);
    const tdm_gguf *g = tdm_model_gguf(m);
    for (int64_t i = 0; i < tdm_gguf_tensor_count(g); i++) {
        const tdm_gguf_tensor *t = tdm_gguf_tensor_at(g, i);
        if (!is_routed_expert(m, t))
            out->weight_bytes += t->nbytes;
    }
    out->kv_bytes_per_pos = (uint64_t)hp->n_attn_layers * 2u * (uint64_t)hp->n_head_kv * (uint64_t)hp->head_dim * 2u;
    out->kv_bytes = out->kv_bytes_per_pos * (uint64_t)n_ctx;
    const int64_t conv_dim = hp->n_rec_layers ? tdm_hparams_conv_dim(hp) : 0;
    if (hp->n_rec_layers)
        out->deltanet_bytes = (uint64_t)hp->n_rec_layers * /* the conv state in two halves (gpu.h) */
                              (2u * (uint64_t)(hp->ssm_conv_kernel - 1) * (uint64_t)conv_dim +
                               (uint64_t)hp->ssm_n_v_heads * (uint64_t)hp->ssm_d_k * (uint64_t)hp->ssm_d_v) * 4u;
    int64_t q_rows = (int64_t)hp->n_head * hp->head_dim * (hp->attn_gated ? 2 : 1);
    int64_t wide = max64(max64(q_rows, conv_dim), max64((int64_t)hp->n_expert_used * hp->n_ff_exp, hp->n_ff_shexp));
    out->slot_bytes = tdm_expert_cache_slot_bytes_for(m);
    out->scratch_bytes = (uint64_t)max_batch * 4u *
                         (uint64_t)(4 * (int64_t)hp->n_embd + 3 * wide + hp->n_expert + hp->n_vocab) +
                         2u * (uint64_t)(hp->n_expert < TDM_STREAM_CHUNK ? hp->n_expert : TDM_STREAM_CHUNK) *
                             out->slot_bytes;
    const int64_t span = tdm_stream_span(max_batch, n_ctx), k = hp->n_expert_used > 0 ? hp->n_expert_used : 1;
    out->scratch_bytes += (uint64_t)(span - max_batch) * 4u *
                          (uint64_t)(2 * (int64_t)hp->n_embd + 1 + ((int64_t)hp->n_layer + 1) * k);
    if (hp->n_attn_layers) /* attention split partials: at most 8 queries x 32 splits per head */
        out->scratch_bytes += 8u * 32u * 4u * (uint64_t)hp->n_head * (uint64_t)(hp->head_dim + 2) + 4096u;
    int32_t n_moe = 0;
    for (int32_t il = 0; il < hp->n_layer; il++)
        n_moe += is_moe(tdm_model_layer(m, il));
    out->max_slots = out->slot_bytes ? (int64_t)n_moe * hp->n_expert : 0;
    return TDM_OK;
}

#define GIB(x) ((double)(x) / (1024.0 * 1024.0 * 1024.0))
#define MIB(x) ((double)(x) / (1024.0 * 1024.0))

tdm_status tdm_budget_compute(const tdm_budget_inputs *in, uint64_t budget_bytes, tdm_budget *out, tdm_error *err)
{
    memset(out, 0, sizeof *out);
    out->in = *in;
    out->budget = budget_bytes;
    out->fixed_bytes = in->weight_bytes + in->kv_bytes + in->deltanet_bytes + in->scratch_bytes;
    if (out->fixed_bytes > budget_bytes) {
        uint64_t other = in->weight_bytes + in->deltanet_bytes + in->scratch_bytes;
        char fit[160] = "no context fits: the weights, DeltaNet state and scratch alone exceed it";
        if (other < budget_bytes && in->kv_bytes_per_pos)
            snprintf(fit, sizeof fit, "the largest context that fits is %llu positions (without any expert slot)",
                     (unsigned long long)((budget_bytes - other) / in->kv_bytes_per_pos));
        else if (other < budget_bytes)
            snprintf(fit, sizeof fit, "the weights fit without the KV cache");
        return tdm_error_set(err, TDM_ERR_OOM,
                             "gpu-mem %.2f GiB (%llu bytes) is less than the %.2f GiB (%llu bytes) needed before "
                             "any expert slot: weights %.2f MiB + KV %.2f MiB + DeltaNet %.2f MiB + scratch %.2f MiB; "
                             "need at least %llu bytes; %s",
                             GIB(budget_bytes), (unsigned long long)budget_bytes, GIB(out->fixed_bytes),
                             (unsigned long long)out->fixed_bytes, MIB(in->weight_bytes), MIB(in->kv_bytes),
                             MIB(in->deltanet_bytes), MIB(in->scratch_bytes), (unsigned long long)out->fixed_bytes,
                             fit);
    }
    uint64_t rest = budget_bytes - out->fixed_bytes;
    uint64_t n = in->slot_bytes ? rest / in->slot_bytes : 0;
    if (n > (uint64_t)in->max_slots)
        n = (uint64_t)in->max_slots;
    if (n > INT32_MAX)
        n = INT32_MAX;
    out->n_slots = (int32_t)n;
    out->slot_total = n * in->slot_bytes;
    out->spare = rest - out->slot_total;
    return TDM_OK;
}

tdm_status tdm_budget_plan(const tdm_model *m, int32_t n_ctx, int32_t max_batch, uint64_t budget_bytes,
                           tdm_budget *out, tdm_error *err)
{
    tdm_budget_inputs in;
    tdm_status st = tdm_budget_inputs_for(m, n_ctx, max_batch, &in, err);
    if (st) {
        memset(out, 0, sizeof *out);
        return st;
    }
    return tdm_budget_compute(&in, budget_bytes, out, err);
}

void tdm_budget_format(const tdm_budget *b, char *buf, size_t cap)
{
    char lent[80] = "";
    if (b->lent_slots)
        snprintf(lent, sizeof lent, " (the last %d lent to prompts as scratch)", b->lent_slots);
    snprintf(buf, cap,
             "gpu-mem %.2f GiB: weights %.2f MiB, KV %.2f MiB, DeltaNet %.2f MiB, scratch %.2f MiB | "
             "%d expert slots x %.3f MiB (of %lld) = %.2f MiB%s, %.2f MiB spare",
             GIB(b->budget), MIB(b->in.weight_bytes), MIB(b->in.kv_bytes), MIB(b->in.deltanet_bytes),
             MIB(b->in.scratch_bytes), b->n_slots, MIB(b->in.slot_bytes), (long long)b->in.max_slots,
             MIB(b->slot_total), lent, MIB(b->spare));
}
