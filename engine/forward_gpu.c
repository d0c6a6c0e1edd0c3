/* forward_gpu: the model resident on the GPU (see forward_gpu.h). Upload and
 * sizing here; the per-layer bodies mirror forward.c's. */
#include "forward_gpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_fwd.h"
#include "gpu_handoff.h"

#define MM_CHUNK_ROWS 8192 /* rows per fp16 dequant chunk of the prompt GEMM */
#define LOGIT_ROWS 32      /* rows of logits computed per head pass */

_Static_assert(TDM_GPU_HINT_MAX == TDM_MAILBOX_HINT_MAX, "the device's warm-up hint and the mailbox's differ");

/* A device copy of one 2-D weight in its file format. */
typedef struct dweight {
    const void *d;   /* device; NULL when absent */
    tdm_qtype type;
    int64_t rows, cols;
} dweight;

/* Products of one input uploaded back to back (up_group): a, then b (d NULL
 * when all share a's type); a.d NULL when they could not be grouped. */
typedef struct dgroup {
    dweight a, b;
} dgroup;

typedef struct glayer {
    dweight attn_norm, post_norm;                     /* F32 [n_embd] */
    dweight wq, wk, wv, wo, q_norm, k_norm;           /* attention */
    dweight qkv, z, beta, alpha, conv, dt, a, ssm_norm, out; /* DeltaNet (beta/alpha split from ssm_ba) */
    dweight router, shexp_gate;
    dweight sh_gate, sh_up, sh_down;
    /* decode: products sharing an input, uploaded back to back so one launch
     * covers them (up_group) */
    dgroup f_qkv;    /* attention wq | wk | wv */
    dgroup f_dn;     /* DeltaNet qkv | z */
    dgroup f_ba;     /* DeltaNet beta | alpha */
    dgroup f_route;  /* router | shared-expert gate */
    tdm_gpu_expert_table table; /* routed experts (or the dense FFN as one expert) */
    tdm_gpu_shared_expert shared;
    tdm_gpu_moe_layer moe;
    tdm_gpu_direct_experts direct; /* hybrid: the routed experts in registered host memory */
    int32_t k;                  /* experts per token: n_expert_used, 1 for dense */
} glayer;

struct tdm_forward_gpu {
    const tdm_model *m;
    const tdm_hparams *hp;
    tdm_gpu *g;
    int32_t n_ctx, B, mm_min;
    int32_t S;                 /* rows of the span buffers: a streaming span's tokens (B without streaming) */
    int32_t sub0;              /* first token of the batch the views below show, inside the span */
    int64_t q_dim, kv_dim, conv_dim, v_dim, wide, h_stride;
    size_t bytes, weight_bytes;

    glayer *L;                 /* [n_layer] */
    dweight out_norm, output;
    int32_t *identity;         /* device [max(n_expert, 1)]: slot_of of every layer */
    int32_t *zeros;            /* device [B] expert id 0 (dense layers) */
    float *ones;               /* device [B] weight 1 */

    /* state */
    uint16_t *kc, *vc;         /* device [n_attn][n_kv][n_ctx][head_dim] fp16 */
    float *rec;                /* device: conv [n_rec][2][K-1][conv_dim] (two halves), then S [n_rec][H_v][d_k][d_v] */
    size_t rec_floats, conv_floats;

    /* scratch (device) */
    float *span_x, *span_xn;   /* [S][n_embd]: the residual stream and the normed rows */
    float *span_wts;           /* [S][k] */
    int32_t *span_pos;         /* [S] positions (RoPE) */
    float *x, *xn;             /* views: the batch of B rows at token sub0 of span_x, span_xn (span_view) */
    float *tmp;                /* [B][n_embd] */
    float *p1, *p2, *p3;       /* [B][wide] */
    float *q, *gate, *ao;      /* [B][wide] */
    float *beta, *alpha;       /* [B][H_v] */
    float *rl;                 /* [B][n_expert] */
    float *sg;                 /* [B] */
    int32_t *ids;              /* [n_layer][S][k]: each layer's routing kept for the pass (layer_ids) */
    float *wts;                /* view: [B][k] at token sub0 of span_wts */
    float *h;                  /* [B][k+1][h_stride], then its int8 copy (tdm_gpu_moe_h_bytes) */
    void *xq;                  /* one token's normed input as int8 (tdm_gpu_xq8_bytes(1, xq_k)), NULL: none */
    int64_t xq_k;              /* the widest row it holds: n_embd or the DeltaNet output */
    float *logits;             /* [LOGIT_ROWS][n_vocab] */
    void *amax_scratch;        /* tdm_gpu_argmax's, zeroed once */
    int32_t *next;             /* [1] the greedy choice after a step's last token (eval_greedy) */
    /* the prompt scratch, used only by batches of more than mm_min tokens
     * or streaming ones (borrow): held for good, or, in a hybrid
     * forward whose budget it would cost slots, the arena's last loan_slots
     * slots lent by the expert cache for the length of such an eval (NULL
     * pointers in between) */
    void *mm_scratch;          /* the GEMM's (tdm_gpu_matmul) */
    size_t mm_bytes;
    void *moe_scratch;         /* grouped MoE of prompt batches (tdm_gpu_moe_prefill) */
    size_t moe_bytes;          /* 0: batches never take the grouped path */
    int32_t loan_slots;        /* 0: the prompt scratch is held for good */
    void *attn_scratch;        /* attention split partials (tdm_gpu_attention), zeroed once */
    size_t attn_bytes;

    /* host */
    float *hx;                 /* pinned [S][n_embd] embeddings (uploaded without waiting) */
    int32_t *hpos;             /* pinned [S] positions (likewise) */
    float *host_logits;        /* pinned [n_vocab] (tdm_forward_gpu_host_logits) */
    int32_t *host_next;        /* pinned [1]: next, read back */
    int32_t *pos;              /* view: [B] at token sub0 of span_pos */
    int32_t *hids;             /* [B][k] (route hook) */
    float *hwts;               /* [B][k] */
    tdm_forward_route_fn hook;
    void *hook_user;
    bool graphs;               /* decode steps through a CUDA graph */
    tdm_gpu_graph *graph;      /* the decode step, updated per token */

    /* hybrid: routed experts through the VRAM cache + CPU pool (NULL ex: all resident) */
    bool hybrid;
    tdm_executor *ex;
    tdm_expert_device *sdev;   /* the cache's slot device */
    int32_t *slot_of;          /* device [n_layer][n_expert] mirror of the published residency */
    uint64_t res_version;      /* of the mirrored table */
    bool *full;                /* [n_layer] MoE layers holding every expert: no hand-off launches */
    uint32_t *hstate;          /* device [TDM_GPU_HANDOFF_WORDS] */
    uint32_t hstate_host[TDM_GPU_HANDOFF_WORDS];
    uint32_t *hstate_in;       /* pinned [TDM_GPU_HANDOFF_WORDS]: hstate as step_end reads it back */
    tdm_gpu_handoff ho;
    int32_t *pass_ids;         /* pinned [n_layer][S][k] routing of the last batch or span */
    /* the direct share: decode launches read the first `quota` misses of a
     * layer from the model's expert memory, registered with the device
     * (zero-copy); the pool computes the rest (executor.h params.direct) */
    const void *reg_base;      /* host address registered, NULL: none (the share is off) */
    size_t reg_bytes;          /* its length */
    int32_t quota_host;        /* the share in device state (TDM_GPU_HANDOFF_QUOTA) */
    /* decode prefetch (docs/EXECUTOR.md "Decode prefetch"): for a MoE layer
     * that may miss, the layer's router over the residual stream at the
     * start of the layer (or of the layer before, when that one holds every
     * expert) predicts its experts; the side stream reads the predicted
     * misses from the registered memory into pf.n spare arena slots while
     * the compute stream runs on, and the layer joins it before its
     * hand-off. pf.n 0: off. */
    tdm_gpu_prefetch pf;
    float *pxn, *prl;          /* device [n_embd], [n_expert]: the prediction's router input and logits */
    int32_t *pids;             /* device [k] predicted experts, best first */
    float *pwts;               /* device [k] their weights (unused) */
    tdm_gpu_route_order order; /* device: the pool's hint (pf.last) and a prefetching layer's selections with
                                * the hinted ones last ([k]), which its MoE launch reads */
    int32_t *stage_host;       /* pinned [n_layer][pf.n]: what the last step staged */
    /* the direct share of one-token steps, staged: after the publish, the
     * share's misses are copied into ds.n (k) more spare slots by a copy
     * kernel with the GPU to itself, then computed as hits (the MoE kernels'
     * own host reads reached ~30 GB/s, the copy ~50). ds.n 0: the MoE
     * kernels read them from host memory. */
    tdm_gpu_prefetch ds;
    int32_t ds_prev;           /* the layer the pass staged last, -1: none */
    tdm_budget budget;         /* the plan the cache was sized with */

    /* hybrid prompt streaming: a batch of >= stream_min tokens sends every
     * expert the cache lacks to the GPU, layer by layer in chunks of st_chunk
     * experts into st_dev[c & 1] (copy fence c & 1), and the batch's misses
     * of the chunk are computed there; chunk c + 1 travels while chunk c
     * computes. With the experts' copy registered (reg_base) the copy stream
     * reads it directly (one DMA per matrix per run of consecutive experts);
     * otherwise the pool copies the chunk from the mapping into page-locked
     * staging st_host[c & 1] and the copy stream sends that. The pool
     * computes nothing for such a batch. A prompt of more than B tokens
     * streams in spans of up to S tokens (TDM_STREAM_SPAN batches) that run
     * layer by layer (span_layers): each chunk serves every batch of the span. */
    int32_t stream_min;        /* 0: never */
    int32_t st_chunk;          /* experts per chunk */
    int32_t st_per_layer;      /* chunks per layer at most */
    uint8_t *st_dev[2];        /* device [st_chunk][slot] (prompt scratch) */
    uint8_t *st_host[2];       /* page-locked [st_chunk][slot]; NULL with reg_base */
    int32_t *st_map;           /* device [n_layer * st_per_layer][n_expert]: slot in its chunk or -1 */
    int32_t *st_map_host;      /* host copy */
    int32_t *st_experts;       /* host [n_layer][n_expert]: the batch's missing experts, layer by layer */
    int32_t *st_layer, *st_first, *st_count; /* host [n_layer * st_per_layer]: the chunks in order */
    tdm_copy_piece *st_pieces; /* host [3 * st_chunk] */
    int32_t st_total, st_next; /* chunks of the batch; the next one to compute */
    int32_t st_moe_layers;     /* MoE layers (layer calls per batch) */
    uint64_t st_bytes;         /* sent by the batch */
    bool streaming;            /* the batch in flight streams */
};

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

static tdm_status dalloc(tdm_forward_gpu *f, size_t bytes, void *out, tdm_error *err)
{
    if (bytes == 0)
        bytes = 256;
    tdm_status st = tdm_gpu_alloc(f->g, bytes, (void **)out, err);
    if (st)
        return tdm_error_wrap(err, "forward_gpu: %zu bytes (%zu already held)", bytes, f->bytes);
    f->bytes += bytes;
    return TDM_OK;
}

/* Uploads w as it is in the file (all stacked matrices). */
static tdm_status up_weight(tdm_forward_gpu *f, const tdm_weight *w, dweight *dw, tdm_error *err)
{
    memset(dw, 0, sizeof *dw);
    if (!w->data)
        return TDM_OK;
    if (w->type != TDM_Q_F32 && !tdm_gpu_type_supported(w->type))
        return tdm_error_set(err, TDM_ERR_UNSUPPORTED, "forward_gpu: %s has type %s without GPU kernels", w->name,
                             tdm_qtype_name(w->type));
    const size_t bytes = w->mat_bytes * (size_t)w->n_mat;
    void *d;
    tdm_status st = dalloc(f, bytes, &d, err);
    if (!st)
        st = tdm_gpu_upload(f->g, d, w->data, bytes, err);
    if (st)
        return tdm_error_wrap(err, "uploading %s", w->name);
    f->weight_bytes += bytes;
    *dw = (dweight){d, w->type, w->rows, w->cols};
    return TDM_OK;
}

/* Bytes of ws[0 .. i) back to back, rounded up to 256 when i reaches n (a
 * run's end, where the next run starts). */
static size_t group_offset(const tdm_weight *const *ws, int i, int n)
{
    size_t b = 0;
    for (int j = 0; j < i; j++)
        b += ws[j]->mat_bytes;
    return i == n ? (b + 255) & ~(size_t)255 : b;
}

/* Uploads n 2-D weights (data present, one width) back to back when they
 * form at most two runs of one type each, so that one product covers them
 * all (*fused: fused->a the first run, fused->b the second or d NULL; the
 * second starts 256-byte aligned); each one's dweight views its rows.
 * Otherwise each is uploaded on its own and fused->a.d is NULL. */
static tdm_status up_group(tdm_forward_gpu *f, const tdm_weight *const *ws, int n, dweight *const *outs,
                           dgroup *fused, tdm_error *err)
{
    memset(fused, 0, sizeof *fused);
    bool ok = true;
    int split = n; /* first member of the second run */
    for (int i = 0; i < n; i++) {
        ok = ok && ws[i]->data && ws[i]->n_mat == 1 && ws[i]->cols == ws[0]->cols &&
             (ws[i]->type == TDM_Q_F32 || tdm_gpu_type_supported(ws[i]->type));
        if (ok && split == n && ws[i]->type != ws[0]->type)
            split = i;
        ok = ok && ws[i]->type == ws[i < split ? 0 : split]->type;
    }
    if (!ok) {
        for (int i = 0; i < n; i++)
            TDM_TRY(up_weight(f, ws[i], outs[i], err));
        return TDM_OK;
    }
    const size_t lead = group_offset(ws, split, split); /* the second run's start */
    const size_t bytes = lead + group_offset(ws + split, n - split, n - split);
    uint8_t *d;
    TDM_TRY(dalloc(f, bytes, &d, err));
    for (int i = 0; i < n; i++) {
        uint8_t *p = d + (i < split ? group_offset(ws, i, split) : lead + group_offset(ws + split, i - split, n - split));
        tdm_status st = tdm_gpu_upload(f->g, p, ws[i]->data, ws[i]->mat_bytes, err);
        if (st)
            return tdm_error_wrap(err, "uploading %s", ws[i]->name);
        *outs[i] = (dweight){p, ws[i]->type, ws[i]->rows, ws[i]->cols};
        dweight *run = i < split ? &fused->a : &fused->b;
        if (!run->d)
            *run = (dweight){p, ws[i]->type, 0, ws[i]->cols};
        run->rows += ws[i]->rows;
    }
    f->weight_bytes += bytes;
    return TDM_OK;
}

/* qwen3next's ssm_ba rows are grouped per key head [b(r) | a(r)]: copy them
 * into separate beta and alpha matrices ordered by value head, so both
 * layouts run the same code (as forward.c's deltanet_gates reads them). */
static tdm_status up_ba(tdm_forward_gpu *f, const tdm_weight *ba, glayer *gl, tdm_error *err)
{
    const int64_t Hv = f->hp->ssm_n_v_heads, r = Hv / f->hp->ssm_n_k_heads;
    const size_t rb = ba->row_bytes;
    uint8_t *hb = malloc(2 * (size_t)Hv * rb);
    if (!hb)
        return tdm_error_set(err, TDM_ERR_OOM, "forward_gpu: ssm_ba staging");
    for (int64_t j = 0; j < Hv; j++) {
        const int64_t grp = j / r, i = j % r;
        memcpy(hb + (size_t)j * rb, (const uint8_t *)ba->data + (size_t)(grp * 2 * r + i) * rb, rb);
        memcpy(hb + (size_t)(Hv + j) * rb, (const uint8_t *)ba->data + (size_t)(grp * 2 * r + r + i) * rb, rb);
    }
    void *d;
    tdm_status st = dalloc(f, 2 * (size_t)Hv * rb, &d, err);
    if (!st)
        st = tdm_gpu_upload(f->g, d, hb, 2 * (size_t)Hv * rb, err);
    free(hb);
    if (st)
        return tdm_error_wrap(err, "uploading %s", ba->name);
    f->weight_bytes += 2 * (size_t)Hv * rb;
    gl->beta = (dweight){d, ba->type, Hv, ba->cols};
    gl->alpha = (dweight){(const uint8_t *)d + (size_t)Hv * rb, ba->type, Hv, ba->cols};
    gl->f_ba = (dgroup){.a = {d, ba->type, 2 * Hv, ba->cols}};
    return TDM_OK;
}

static tdm_status check_expert_types(const tdm_weight *gw, const tdm_weight *uw, const tdm_weight *dw, tdm_error *err)
{
    for (const tdm_weight *w = gw; w; w = w == gw ? uw : w == uw ? dw : NULL)
        if (!tdm_gpu_type_supported(w->type))
            return tdm_error_set(err, TDM_ERR_UNSUPPORTED, "forward_gpu: %s has type %s without GPU kernels",
                                 w->name, tdm_qtype_name(w->type));
    return TDM_OK;
}

/* One arena of slots gate|up|down per expert (in expert order) for the
 * fused kernels; staged one expert at a time. */
static tdm_status up_experts(tdm_forward_gpu *f, const tdm_weight *gw, const tdm_weight *uw, const tdm_weight *dw,
                             glayer *gl, tdm_error *err)
{
    tdm_status st = check_expert_types(gw, uw, dw, err);
    if (st)
        return st;
    const size_t slot = gw->mat_bytes + uw->mat_bytes + dw->mat_bytes;
    const int64_t E = gw->n_mat;
    uint8_t *arena;
    st = dalloc(f, slot * (size_t)E, &arena, err);
    if (st)
        return st;
    uint8_t *stage;
    st = tdm_gpu_alloc_host(f->g, slot, (void **)&stage, err);
    if (st)
        return st;
    for (int64_t e = 0; e < E && !st; e++) {
        memcpy(stage, (const uint8_t *)gw->data + (size_t)e * gw->mat_bytes, gw->mat_bytes);
        memcpy(stage + gw->mat_bytes, (const uint8_t *)uw->data + (size_t)e * uw->mat_bytes, uw->mat_bytes);
        memcpy(stage + gw->mat_bytes + uw->mat_bytes, (const uint8_t *)dw->data + (size_t)e * dw->mat_bytes,
               dw->mat_bytes);
        st = tdm_gpu_upload(f->g, arena + (size_t)e * slot, stage, slot, err);
    }
    tdm_gpu_release_host(f->g, stage);
    if (st)
        return tdm_error_wrap(err, "uploading %s", gw->name);
    f->weight_bytes += slot * (size_t)E;
    gl->table = (tdm_gpu_expert_table){.slot_of = f->identity, .n_expert = E, .arena = arena, .slot_bytes = slot,
                                       .gate_off = 0, .up_off = gw->mat_bytes,
                                       .down_off = gw->mat_bytes + uw->mat_bytes};
    gl->moe = (tdm_gpu_moe_layer){.table = &gl->table, .layer = 0, .gate_type = gw->type, .up_type = uw->type,
                                  .down_type = dw->type, .n_embd = gw->cols, .n_ff = gw->rows, .shared = NULL};
    return TDM_OK;
}

/* Hybrid: the routed experts stay in the file; the fused kernels read the
 * cache's arena through the shared residency mirror (filled in later). */
static void bind_cached_experts(tdm_forward_gpu *f, const tdm_layer *L, int32_t il, glayer *gl)
{
    /* the arena is set by start_hybrid; until then (and with no slot at all,
     * when every entry of slot_of is -1 and nothing is read) any device pointer */
    gl->table = (tdm_gpu_expert_table){.slot_of = f->slot_of, .n_expert = f->hp->n_expert, .arena = f->slot_of,
                                       .slot_bytes = tdm_expert_cache_slot_bytes_for(f->m), .gate_off = 0,
                                       .up_off = L->gate_exps.mat_bytes,
                                       .down_off = L->gate_exps.mat_bytes + L->up_exps.mat_bytes};
    gl->moe = (tdm_gpu_moe_layer){.table = &gl->table, .layer = il, .gate_type = L->gate_exps.type,
                                  .up_type = L->up_exps.type, .down_type = L->down_exps.type,
                                  .n_embd = L->gate_exps.cols, .n_ff = L->gate_exps.rows, .shared = NULL};
}

static tdm_status upload_layer(tdm_forward_gpu *f, const tdm_layer *L, int32_t il, glayer *gl, tdm_error *err)
{
    tdm_status st = TDM_OK;
#define UP(field, w) if (!st) st = up_weight(f, &L->w, &gl->field, err)
#define GROUP(fused, ...)                                                                        \
    do {                                                                                         \
        const tdm_weight *ws_[] = {__VA_ARGS__};                                                 \
        if (!st)                                                                                 \
            st = up_group(f, ws_, (int)(sizeof ws_ / sizeof *ws_), outs_, &gl->fused, err);      \
    } while (0)
    UP(attn_norm, attn_norm); UP(post_norm, post_norm);
    if (L->kind == TDM_LAYER_ATTN) {
        dweight *outs_[] = {&gl->wq, &gl->wk, &gl->wv};
        GROUP(f_qkv, &L->wq, &L->wk, &L->wv);
        UP(wo, wo); UP(q_norm, q_norm); UP(k_norm, k_norm);
    } else {
        dweight *outs_[] = {&gl->qkv, &gl->z};
        GROUP(f_dn, &L->ssm_qkv, &L->ssm_z);
        UP(conv, ssm_conv); UP(dt, ssm_dt); UP(a, ssm_a);
        UP(ssm_norm, ssm_norm); UP(out, ssm_out);
        if (!st && L->ssm_ba.data)
            st = up_ba(f, &L->ssm_ba, gl, err);
        else {
            dweight *outs_ba[] = {&gl->beta, &gl->alpha};
            const tdm_weight *ws_ba[] = {&L->ssm_beta, &L->ssm_alpha};
            if (!st)
                st = up_group(f, ws_ba, 2, outs_ba, &gl->f_ba, err);
        }
    }
    if (L->ffn == TDM_FFN_DENSE) {
        if (!st)
            st = up_experts(f, &L->ffn_gate, &L->ffn_up, &L->ffn_down, gl, err);
        gl->table.slot_of = f->zeros; /* one slot: expert 0 -> slot 0 */
        gl->k = 1;
        return st;
    }
    if (L->shexp_gate.data) {
        dweight *outs_[] = {&gl->router, &gl->shexp_gate};
        GROUP(f_route, &L->router, &L->shexp_gate);
    } else {
        UP(router, router);
    }
    UP(sh_gate, gate_shexp); UP(sh_up, up_shexp); UP(sh_down, down_shexp);
#undef GROUP
#undef UP
    if (!st && f->hybrid) {
        if ((st = check_expert_types(&L->gate_exps, &L->up_exps, &L->down_exps, err)))
            return st;
        bind_cached_experts(f, L, il, gl);
    } else if (!st) {
        st = up_experts(f, &L->gate_exps, &L->up_exps, &L->down_exps, gl, err);
    }
    if (st)
        return st;
    gl->k = f->hp->n_expert_used;
    if (gl->sh_gate.d) {
        gl->shared = (tdm_gpu_shared_expert){.gate = gl->sh_gate.d, .up = gl->sh_up.d, .down = gl->sh_down.d,
                                             .gate_type = gl->sh_gate.type, .up_type = gl->sh_up.type,
                                             .down_type = gl->sh_down.type, .n_ff = gl->sh_gate.rows,
                                             .gate_logit = gl->shexp_gate.d ? f->sg : NULL};
        gl->moe.shared = &gl->shared;
    }
    return TDM_OK;
}

void tdm_forward_gpu_free(tdm_forward_gpu *f)
{
    if (!f)
        return;
    tdm_gpu_graph_free(f->graph);
    tdm_executor_free(f->ex); /* stops the pool; the arena and mailbox go back through f->g */
    if (f->reg_base)
        tdm_gpu_host_unregister(f->g, f->reg_base);
    tdm_gpu_slot_device_free(f->sdev);
    free(f->full);
    free(f->st_map_host);
    free(f->st_experts);
    free(f->st_layer);
    free(f->st_first);
    free(f->st_count);
    free(f->st_pieces);
    tdm_gpu_free(f->g); /* every device and pinned buffer (host_logits, pass_ids, stage_host, ...) */
    free(f->L);
    free(f->hids);
    free(f->hwts);
    free(f);
}

static void size_dims(tdm_forward_gpu *f)
{
    const tdm_hparams *hp = f->hp;
    f->q_dim = (int64_t)hp->n_head * hp->head_dim;
    f->kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    f->conv_dim = tdm_hparams_conv_dim(hp);
    f->v_dim = (int64_t)hp->ssm_n_v_heads * hp->ssm_d_v;
    int64_t w = max64(2 * f->q_dim, max64(f->conv_dim, f->v_dim));
    f->wide = max64(w, max64(hp->n_embd, f->kv_dim));
    f->h_stride = max64(hp->n_ff_exp, max64(hp->n_ff_shexp, hp->n_ff));
    /* the norms of one-token steps hand the products after them an int8 copy
     * of their output when the rows split into groups of 32 */
    const bool dn_q8 = hp->n_rec_layers == 0 || hp->ssm_d_v % 32 == 0;
    f->xq_k = hp->n_embd % 32 == 0 && dn_q8 ? max64(hp->n_embd, f->v_dim) : 0;
    const int64_t kin = max64(hp->n_embd, max64(f->q_dim, max64(f->v_dim, 1)));
    f->mm_bytes = tdm_gpu_matmul_scratch_bytes(MM_CHUNK_ROWS, kin, f->B);
}

/* Points x, xn, pos, wts (and layer_ids) at the batch starting at token t0
 * of the span; span_view(f, 0) is the state between passes (the decode graph
 * records these pointers). */
static void span_view(tdm_forward_gpu *f, int32_t t0)
{
    const size_t d = (size_t)f->hp->n_embd, k = (size_t)(f->hp->n_expert_used > 0 ? f->hp->n_expert_used : 1);
    f->sub0 = t0;
    f->x = f->span_x + (size_t)t0 * d;
    f->xn = f->span_xn + (size_t)t0 * d;
    f->pos = f->span_pos + t0;
    f->wts = f->span_wts + (size_t)t0 * k;
}

static tdm_status alloc_state(tdm_forward_gpu *f, tdm_error *err)
{
    const tdm_hparams *hp = f->hp;
    const size_t B = (size_t)f->B, S = (size_t)f->S, d = (size_t)hp->n_embd,
                 k = (size_t)(hp->n_expert_used > 0 ? hp->n_expert_used : 1);
    const size_t W = (size_t)f->wide, Hv = (size_t)(hp->ssm_n_v_heads > 0 ? hp->ssm_n_v_heads : 1);
    const size_t kv = (size_t)hp->n_attn_layers * (size_t)f->n_ctx * (size_t)f->kv_dim * 2;
    f->conv_floats = (size_t)hp->n_rec_layers * 2u * /* two halves a layer (tdm_gpu_ssm_conv) */
                     (size_t)(hp->ssm_conv_kernel > 0 ? hp->ssm_conv_kernel - 1 : 0) * (size_t)f->conv_dim;
    f->rec_floats = f->conv_floats + (size_t)hp->n_rec_layers * hp->ssm_n_v_heads * hp->ssm_d_k * hp->ssm_d_v;
    tdm_status st = TDM_OK;
#define DA(ptr, bytes) if (!st) st = dalloc(f, (bytes), &f->ptr, err)
    DA(kc, kv); DA(vc, kv); DA(rec, f->rec_floats * sizeof(float));
    DA(span_x, S * d * 4); DA(span_xn, S * d * 4); DA(tmp, B * d * 4);
    DA(p1, B * W * 4); DA(p2, B * W * 4); DA(p3, B * W * 4);
    DA(q, B * W * 4); DA(gate, B * W * 4); DA(ao, B * W * 4);
    DA(beta, B * Hv * 4); DA(alpha, B * Hv * 4);
    DA(rl, B * (size_t)max64(hp->n_expert, 1) * 4); DA(sg, B * 4);
    DA(ids, (size_t)hp->n_layer * S * k * 4); DA(span_wts, S * k * 4);
    DA(h, tdm_gpu_moe_h_bytes(f->h_stride, (int64_t)(B * (k + 1))));
    if (f->xq_k)
        DA(xq, tdm_gpu_xq8_bytes(1, f->xq_k));
    DA(logits, (size_t)LOGIT_ROWS * hp->n_vocab * 4);
    DA(amax_scratch, tdm_gpu_argmax_scratch_bytes()); DA(next, sizeof(int32_t));
    DA(identity, (size_t)max64(hp->n_expert, 1) * 4);
    DA(zeros, B * 4); DA(ones, B * 4); DA(span_pos, S * 4);
    f->attn_bytes = hp->n_attn_layers ? tdm_gpu_attention_scratch_bytes(f->g, hp->n_head, hp->head_dim, f->n_ctx) : 0;
    if (f->attn_bytes)
        DA(attn_scratch, f->attn_bytes);
    if (f->hybrid) {
        DA(slot_of, (size_t)hp->n_layer * (size_t)hp->n_expert * 4);
        DA(hstate, TDM_GPU_HANDOFF_WORDS * sizeof(uint32_t));
    }
#undef DA
    if (!st)
        st = tdm_gpu_alloc_host(f->g, S * d * sizeof(float), (void **)&f->hx, err);
    if (!st)
        st = tdm_gpu_alloc_host(f->g, S * sizeof(int32_t), (void **)&f->hpos, err);
    if (!st)
        st = tdm_gpu_alloc_host(f->g, (size_t)hp->n_vocab * sizeof(float), (void **)&f->host_logits, err);
    if (!st)
        st = tdm_gpu_alloc_host(f->g, sizeof(int32_t), (void **)&f->host_next, err);
    if (st)
        return st;
    span_view(f, 0);
    int32_t *id = malloc((size_t)max64(hp->n_expert, 1) * sizeof(int32_t));
    f->hids = malloc(B * k * sizeof(int32_t));
    f->hwts = malloc(B * k * sizeof(float));
    if (!id || !f->hids || !f->hwts) {
        free(id);
        return tdm_error_set(err, TDM_ERR_OOM, "forward_gpu: host buffers");
    }
    for (int32_t e = 0; e < max64(hp->n_expert, 1); e++)
        id[e] = e;
    st = tdm_gpu_upload(f->g, f->identity, id, (size_t)max64(hp->n_expert, 1) * sizeof(int32_t), err);
    free(id);
    if (!st)
        st = tdm_gpu_memset(f->g, f->zeros, 0, B * 4, err);
    if (!st && f->attn_bytes)
        st = tdm_gpu_memset(f->g, f->attn_scratch, 0, f->attn_bytes, err);
    if (!st)
        st = tdm_gpu_memset(f->g, f->amax_scratch, 0, tdm_gpu_argmax_scratch_bytes(), err);
    if (!st)
        st = tdm_gpu_fill_f32(f->g, f->ones, 1.0f, B, err);
    return st;
}

static void *mapped_alloc(void *ctx, size_t bytes)
{
    void *p = NULL;
    tdm_error e = {0};
    return tdm_gpu_alloc_host(ctx, bytes, &p, &e) ? NULL : p;
}

static void mapped_free(void *ctx, void *ptr) { tdm_gpu_release_host(ctx, ptr); }

#define VRAM_RESERVE ((uint64_t)768 << 20) /* left free by the default budget (context, cuBLAS, graphs) */

/* The budget: --gpu-mem, or what the device has free minus the reserve;
 * the ledger checks the fixed part before anything is allocated. */
static tdm_status plan_budget(tdm_forward_gpu *f, const tdm_executor_params *xp, tdm_error *err)
{
    uint64_t budget = xp->gpu_mem;
    if (!budget) {
        tdm_gpu_info info;
        TDM_TRY(tdm_gpu_query(f->g, &info, err));
        budget = info.mem_free > VRAM_RESERVE ? info.mem_free - VRAM_RESERVE : 0;
    }
    return tdm_budget_plan(f->m, f->n_ctx, f->B, budget, &f->budget, err);
}

/* The device address of host pointer p inside the span registered at lo. */
static const void *dev_addr(const void *dev, const uint8_t *lo, const void *p)
{
    return (const uint8_t *)dev + ((const uint8_t *)p - lo);
}

/* The direct share's memory: the span of every MoE layer's routed experts
 * (all in tdm_model_copy_experts' one region) registered with the device;
 * each layer's tdm_gpu_direct_experts points into it. */
static tdm_status register_experts(tdm_forward_gpu *f, tdm_error *err)
{
    const uint8_t *lo = NULL, *hi = NULL;
    for (int32_t il = 0; il < f->hp->n_layer; il++) {
        const tdm_layer *L = tdm_model_layer(f->m, il);
        if (L->ffn != TDM_FFN_MOE || !L->gate_exps.data)
            continue;
        const tdm_weight *w[3] = {&L->gate_exps, &L->up_exps, &L->down_exps};
        for (int i = 0; i < 3; i++) {
            const int al = tdm_gpu_weight_align(w[i]->type);
            if (al <= 0 || (uintptr_t)w[i]->data % (uintptr_t)al || w[i]->mat_bytes % (size_t)al)
                return tdm_error_set(err, TDM_ERR_UNSUPPORTED, "layer %d's experts (%s) do not start %d-byte "
                                     "aligned in memory, as the GPU's decoders need", il,
                                     tdm_qtype_name(w[i]->type), al);
            const uint8_t *a = w[i]->data, *b = a + w[i]->mat_bytes * (size_t)w[i]->n_mat;
            lo = !lo || a < lo ? a : lo;
            hi = !hi || b > hi ? b : hi;
        }
    }
    if (!lo)
        return tdm_error_set(err, TDM_ERR_UNSUPPORTED, "no routed experts to register");
    const void *dev;
    TDM_TRY(tdm_gpu_host_register(f->g, lo, (size_t)(hi - lo), &dev, err));
    f->reg_base = lo;
    f->reg_bytes = (size_t)(hi - lo);
    for (int32_t il = 0; il < f->hp->n_layer; il++) {
        const tdm_layer *L = tdm_model_layer(f->m, il);
        if (L->ffn != TDM_FFN_MOE || !L->gate_exps.data)
            continue;
        f->L[il].direct = (tdm_gpu_direct_experts){
            dev_addr(dev, lo, L->gate_exps.data), dev_addr(dev, lo, L->up_exps.data),
            dev_addr(dev, lo, L->down_exps.data), L->gate_exps.mat_bytes, L->up_exps.mat_bytes,
            L->down_exps.mat_bytes, (const int32_t *)(f->hstate + TDM_GPU_HANDOFF_QUOTA)};
    }
    return TDM_OK;
}

static size_t stage_bytes(const tdm_forward_gpu *f)
{
    return (size_t)f->hp->n_layer * (size_t)f->pf.n * sizeof(int32_t);
}

/* The device mirror of the published residency, and which MoE layers hold
 * every expert: those skip the hand-off (no publish, no merge launch). A
 * change to that set drops the recorded decode graph, whose launches follow
 * it; the next decode step records it again. */
static tdm_status mirror_residency(tdm_forward_gpu *f, tdm_error *err)
{
    const tdm_hparams *hp = f->hp;
    const tdm_expert_cache *c = tdm_executor_cache(f->ex);
    const int32_t *res = tdm_expert_cache_residency(c);
    const size_t E = (size_t)hp->n_expert;
    TDM_TRY(tdm_gpu_upload(f->g, f->slot_of, res, (size_t)hp->n_layer * E * sizeof(int32_t), err));
    f->res_version = tdm_expert_cache_version(c);
    const bool slots = tdm_expert_cache_n_slots(c) > 0;
    bool changed = false;
    for (int32_t il = 0; il < hp->n_layer; il++) {
        bool full = slots && tdm_model_layer(f->m, il)->ffn == TDM_FFN_MOE;
        for (size_t e = 0; e < E && full; e++)
            full = res[(size_t)il * E + e] >= 0;
        changed |= full != f->full[il];
        f->full[il] = full;
    }
    if (changed) {
        tdm_gpu_graph_free(f->graph);
        f->graph = NULL;
    }
    /* the prefetching layers follow the full ones: forget what others staged */
    return changed && f->pf.n ? tdm_gpu_memset(f->g, f->pf.stage, 0xff, stage_bytes(f), err) : TDM_OK;
}

/* The prefetch's device scratch for up to n spare slots (start_hybrid sets
 * the slots once the arena exists). */
static tdm_status alloc_prefetch(tdm_forward_gpu *f, int32_t n, tdm_error *err)
{
    const tdm_hparams *hp = f->hp;
    const size_t k = (size_t)hp->n_expert_used;
    f->pf = (tdm_gpu_prefetch){.slot_of = f->slot_of, .n_expert = hp->n_expert, .n = n};
    TDM_TRY(dalloc(f, (size_t)hp->n_embd * sizeof(float), &f->pxn, err));
    TDM_TRY(dalloc(f, (size_t)hp->n_expert * sizeof(float), &f->prl, err));
    TDM_TRY(dalloc(f, k * sizeof(int32_t), &f->pids, err));
    TDM_TRY(dalloc(f, k * sizeof(float), &f->pwts, err));
    TDM_TRY(dalloc(f, (1 + TDM_GPU_HINT_MAX) * sizeof(int32_t), &f->pf.last, err));
    TDM_TRY(dalloc(f, k * sizeof(int32_t), &f->order.ids, err));
    TDM_TRY(dalloc(f, k * sizeof(float), &f->order.weights, err));
    f->order.last = f->pf.last;
    TDM_TRY(dalloc(f, stage_bytes(f), &f->pf.stage, err));
    TDM_TRY(tdm_gpu_alloc_host(f->g, stage_bytes(f), (void **)&f->stage_host, err));
    return tdm_gpu_memset(f->g, f->pf.stage, 0xff, stage_bytes(f), err);
}

/* Scratch of the grouped prompt MoE: the largest layer's need at B tokens
 * (0 when no batch exceeds mm_min). */
static void size_moe_scratch(tdm_forward_gpu *f)
{
    size_t need = 0;
    for (int32_t il = 0; il < f->hp->n_layer && f->B > f->mm_min; il++) {
        const size_t b = tdm_gpu_moe_prefill_scratch_bytes(&f->L[il].moe, f->B, f->L[il].k);
        need = b > need ? b : need;
    }
    f->moe_bytes = need;
}

#define SCRATCH_ALIGN 256u

static size_t align_up(size_t n) { return (n + SCRATCH_ALIGN - 1) / SCRATCH_ALIGN * SCRATCH_ALIGN; }

/* Bytes of the prompt scratch: the GEMM's, the grouped MoE's and prompt
 * streaming's two chunks, each SCRATCH_ALIGN-aligned. */
static size_t prompt_scratch_bytes(const tdm_forward_gpu *f)
{
    const size_t chunk = f->stream_min ? (size_t)f->st_chunk * tdm_expert_cache_slot_bytes_for(f->m) : 0;
    return align_up(f->mm_bytes) + align_up(f->moe_bytes) + 2 * align_up(chunk);
}

/* Points the prompt scratch into mem (prompt_scratch_bytes of device
 * memory, SCRATCH_ALIGN-aligned), or everything at NULL. */
static void place_prompt_scratch(tdm_forward_gpu *f, uint8_t *mem)
{
    const size_t chunk = f->stream_min ? (size_t)f->st_chunk * tdm_expert_cache_slot_bytes_for(f->m) : 0;
    f->mm_scratch = mem;
    f->moe_scratch = mem && f->moe_bytes ? mem + align_up(f->mm_bytes) : NULL;
    for (int b = 0; b < 2; b++)
        f->st_dev[b] = mem && chunk ? mem + align_up(f->mm_bytes) + align_up(f->moe_bytes) + (size_t)b * align_up(chunk)
                                    : NULL;
}

/* The prompt scratch held for good. */
static tdm_status hold_prompt_scratch(tdm_forward_gpu *f, tdm_error *err)
{
    void *mem = NULL;
    TDM_TRY(dalloc(f, prompt_scratch_bytes(f), &mem, err));
    place_prompt_scratch(f, mem);
    return TDM_OK;
}

/* Before the expert cache: the prompt scratch is held for good when the
 * budget has room for it beside every slot the cache could use (and the
 * spare ones); otherwise, when the cache will have that many, the arena's
 * last slots are lent to each eval that uses it (borrow), so that the
 * one-token steps, which never do, get those slots. Only with the experts'
 * copy, which the direct share or the prefetch registers (start_hybrid): the
 * copies back are then DMAs from it that the host does not wait for. Errs
 * on the side of holding it: the spare slots are counted at their most. */
static tdm_status plan_prompt_scratch(tdm_forward_gpu *f, const tdm_executor_params *xp, size_t slot,
                                      tdm_error *err)
{
    const size_t pb = prompt_scratch_bytes(f);
    if (!slot || !pb)
        return hold_prompt_scratch(f, err);
    const uint64_t budget = f->budget.budget, slack = (uint64_t)1 << 20; /* the prefetch's own scratch */
    const int64_t loan = (int64_t)((pb + SCRATCH_ALIGN + slot - 1) / slot),
                  cap = xp->n_slots >= 0 ? xp->n_slots : f->budget.in.max_slots,
                  spares = (xp->prefetch > TDM_PREFETCH_DEFAULT ? xp->prefetch : TDM_PREFETCH_DEFAULT) +
                           f->hp->n_expert_used,
                  room = f->bytes + slack < budget ? (int64_t)((budget - f->bytes - slack) / slot) - spares : 0;
    const int64_t cache = room < cap ? room : cap;
    const bool registers = tdm_model_experts_copied(f->m) && (xp->direct != 0 || xp->prefetch != 0);
    if (registers && room < cap + loan && cache >= loan) {
        f->loan_slots = (int32_t)loan;
        return TDM_OK;
    }
    return hold_prompt_scratch(f, err);
}

/* After every other allocation: the expert cache (slot arena, filled by the
 * policy), the pool with its mailbox in mapped memory, the residency mirror,
 * the hand-off descriptor and, when some experts will miss, the direct
 * share's registration (params.direct: N > 0 fails when the memory cannot be
 * registered; -1 goes without the share then). */
static tdm_status start_hybrid(tdm_forward_gpu *f, const tdm_executor_params *xp, tdm_error *err)
{
    const tdm_hparams *hp = f->hp;
    const size_t slot = tdm_expert_cache_slot_bytes_for(f->m);
    const uint64_t budget = f->budget.budget;
    TDM_TRY(plan_prompt_scratch(f, xp, slot, err));
    /* the ledger again, over the fixed part as allocated: the first plan's
     * weights and scratch were estimates (before anything was allocated);
     * the slots get what they kept back, and a fixed part over the budget
     * is refused with the same numbers and what would fit */
    tdm_budget_inputs in = f->budget.in;
    const uint64_t named = (uint64_t)f->weight_bytes + in.kv_bytes + in.deltanet_bytes;
    in.weight_bytes = f->weight_bytes;
    in.scratch_bytes = f->bytes > named ? f->bytes - named : 0;
    if (tdm_budget_compute(&in, budget, &f->budget, err))
        return tdm_error_wrap(err, "forward_gpu: as allocated");
    int64_t fit = slot ? (int64_t)((budget - f->bytes) / slot) : 0;
    fit = fit < f->budget.n_slots ? fit : f->budget.n_slots;
    /* --cache-experts with --gpu-mem: the count must fit the budget too */
    if (xp->gpu_mem && xp->n_slots > fit && fit < f->budget.in.max_slots)
        return tdm_error_set(err, TDM_ERR_OOM, "forward_gpu: %d expert slots do not fit the %.2f GiB budget "
                             "(at most %lld of %.2f MiB)", xp->n_slots, (double)budget / 1073741824.0,
                             (long long)fit, (double)slot / 1048576.0);
    tdm_executor_params p = *xp;
    p.n_slots = xp->n_slots >= 0 ? xp->n_slots : (int32_t)fit;
    p.n_ctx = f->n_ctx;
    p.max_batch = f->B;
    p.mem_alloc = mapped_alloc;
    p.mem_free = mapped_free;
    p.mem_ctx = f->g;
    int64_t routed = 0;
    for (int32_t il = 0; il < hp->n_layer; il++)
        routed += tdm_model_layer(f->m, il)->ffn == TDM_FFN_MOE ? hp->n_expert : 0;
    int32_t want = 0; /* prefetch slots */
    if ((p.direct != 0 || xp->prefetch != 0) && p.n_slots < routed) {
        /* only the copy: the driver pins a file mapping page by page (H200 host, kernel 6.18: 512 MiB
         * still unfinished after 60 s) where the copy's huge pages take 0.04 s for 2 GiB */
        tdm_error re = {0};
        tdm_status rs = tdm_model_experts_copied(f->m)
                            ? register_experts(f, &re)
                            : tdm_error_set(&re, TDM_ERR_UNSUPPORTED, "the experts are in the file mapping, not "
                                            "in tdm_model_copy_experts' copy (--expert-memory copy)");
        if (rs && p.direct > 0)
            return tdm_error_set(err, rs, "forward_gpu: the direct share (--zero-copy %d) needs the experts' memory "
                                 "registered with the GPU: %s", p.direct, re.msg);
        p.direct = rs ? 0 : p.direct;
        want = rs || !slot ? 0 : xp->prefetch < 0 ? TDM_PREFETCH_DEFAULT : xp->prefetch;
    } else {
        p.direct = 0;
    }
    /* the prefetch: its scratch, then its spare slots out of the budget's
     * (it extends a cache of at least one slot); then k more for the
     * staged direct share, when the rest of the budget holds them */
    const int32_t want_ds = p.direct != 0 && slot ? hp->n_expert_used : 0;
    int32_t spare = 0, dspare = 0;
    if (want || want_ds) {
        if (want)
            TDM_TRY(alloc_prefetch(f, want, err));
        int64_t left = f->bytes < budget ? (int64_t)((budget - f->bytes) / slot) : 0;
        left = left < f->budget.n_slots ? left : f->budget.n_slots;
        const int64_t keep = xp->n_slots >= 0 ? xp->n_slots : 1, room = left - keep;
        spare = room <= 0 ? 0 : want < room ? want : (int32_t)room;
        dspare = want_ds && room - spare >= want_ds ? want_ds : 0;
        if (dspare)
            TDM_TRY(dalloc(f, (size_t)hp->n_layer * (size_t)dspare * sizeof(int32_t), &f->ds.stage, err));
        if (xp->n_slots < 0)
            p.n_slots = (int32_t)(left - spare - dspare);
    }
    TDM_TRY(tdm_gpu_slot_device_new(f->g, slot ? slot : 64, 4, spare + dspare, f->reg_base, f->reg_bytes, &f->sdev, err));
    p.prefetch = spare; /* what runs: the direct share's tuner starts from it */
    p.dev = f->sdev;
    TDM_TRY(tdm_executor_new(f->m, &p, &f->ex, err));
    tdm_expert_cache *c = tdm_executor_cache(f->ex);
    if (f->loan_slots > tdm_expert_cache_n_slots(c)) /* plan_prompt_scratch counted on them */
        return tdm_error_set(err, TDM_ERR_OOM, "forward_gpu: the prompt scratch needs %d slots to borrow, the cache "
                             "has %d", f->loan_slots, tdm_expert_cache_n_slots(c));
    f->budget.lent_slots = f->loan_slots;
    f->bytes += (size_t)tdm_expert_cache_n_slots(c) * tdm_expert_cache_slot_bytes(c); /* the arena */
    uint8_t *spares = tdm_gpu_slot_device_spare(f->sdev);
    const size_t sb = tdm_expert_cache_slot_bytes(c);
    f->pf.n = spares ? spare : 0; /* no room: the scratch stays unused */
    if (spares) {
        f->bytes += (size_t)(spare + dspare) * sb;
        f->pf.spare = spares;
        f->pf.slot_bytes = sb;
        f->pf.base = tdm_expert_cache_n_slots(c);
    }
    f->ds_prev = -1;
    if (spares && dspare) {
        f->ds = (tdm_gpu_prefetch){.slot_of = f->slot_of, .n_expert = hp->n_expert, .spare = spares + spare * sb,
                                   .slot_bytes = sb, .base = tdm_expert_cache_n_slots(c) + spare, .n = dspare,
                                   .stage = f->ds.stage,
                                   .quota = (const int32_t *)(f->hstate + TDM_GPU_HANDOFF_QUOTA)};
        TDM_TRY(tdm_gpu_memset(f->g, f->ds.stage, 0xff, (size_t)hp->n_layer * dspare * sizeof(int32_t), err));
    }
    f->full = calloc((size_t)hp->n_layer, sizeof(bool));
    if (!f->full)
        return tdm_error_set(err, TDM_ERR_OOM, "forward_gpu: layer flags");
    TDM_TRY(mirror_residency(f, err));
    TDM_TRY(tdm_gpu_memset(f->g, f->hstate, 0, TDM_GPU_HANDOFF_WORDS * sizeof(uint32_t), err));
    for (int32_t il = 0; il < hp->n_layer; il++)
        if (tdm_model_layer(f->m, il)->ffn == TDM_FFN_MOE && tdm_expert_cache_arena(c))
            f->L[il].table.arena = tdm_expert_cache_arena(c);
    tdm_mailbox *mb = tdm_pool_mailbox(tdm_executor_pool(f->ex));
    f->ho = (tdm_gpu_handoff){.dev_seq = (uint32_t *)&mb->dev_seq, .pool_seq = (const uint32_t *)&mb->pool_seq,
                              .layer = &mb->layer, .n_tok = &mb->n_tok, .ids = mb->ids, .weights = mb->weights,
                              .x = mb->x, .out = mb->out, .max_tok = f->B, .k = hp->n_expert_used,
                              .n_embd = hp->n_embd, .slot_of = f->slot_of, .n_expert = hp->n_expert,
                              .direct = &mb->direct,
                              .quota = f->reg_base ? (const int32_t *)(f->hstate + TDM_GPU_HANDOFF_QUOTA) : NULL,
                              .state = f->hstate, .held_bit = TDM_MAILBOX_HELD, .timeout_s = 30.0};
    if (f->pf.n && xp->pool_warm != 0) { /* the pool's warm-up hints ride on the prefetch's prediction */
        f->pf.hint_seq = (uint32_t *)&mb->hint_seq;
        f->pf.hint_layer = (int32_t *)&mb->hint_layer;
        f->pf.hint_n = (int32_t *)&mb->hint_n;
        f->pf.hint_ids = (int32_t *)mb->hint_ids;
        f->pf.hint_max = TDM_GPU_HINT_MAX;
        f->pf.quota = f->ho.quota;
        f->pf.hints = f->hstate + TDM_GPU_HANDOFF_HINTS;
    }
    TDM_TRY(tdm_gpu_alloc_host(f->g, TDM_GPU_HANDOFF_WORDS * sizeof(uint32_t), (void **)&f->hstate_in, err));
    return tdm_gpu_alloc_host(f->g, (size_t)hp->n_layer * f->S * hp->n_expert_used * sizeof(int32_t),
                              (void **)&f->pass_ids, err);
}

/* The smallest batch that streams (0: none) for executor parameters xp. */
static int32_t stream_min_of(const tdm_forward_gpu *f, const tdm_executor_params *xp)
{
    int32_t m = xp->stream_min == 0 ? TDM_STREAM_MIN_DEFAULT : xp->stream_min < 0 ? 0 : xp->stream_min;
    if (m == 1)
        m = 2; /* one-token steps are the decode graph's */
    return f->B < m || !tdm_expert_cache_slot_bytes_for(f->m) ? 0 : m;
}

/* Prompt streaming's tables (before start_hybrid, so the arena gets what is
 * left): the chunk maps (the two device chunks are prompt scratch, the
 * staging follows the registration, stream_staging). Nothing when batches
 * can never reach stream_min. */
static tdm_status alloc_stream(tdm_forward_gpu *f, const tdm_executor_params *xp, tdm_error *err)
{
    const tdm_hparams *hp = f->hp;
    f->stream_min = stream_min_of(f, xp);
    if (!f->stream_min)
        return TDM_OK;
    const int32_t E = hp->n_expert;
    f->st_chunk = E < TDM_STREAM_CHUNK ? E : TDM_STREAM_CHUNK;
    f->st_per_layer = (E + f->st_chunk - 1) / f->st_chunk;
    const size_t chunks = (size_t)hp->n_layer * (size_t)f->st_per_layer;
    TDM_TRY(dalloc(f, chunks * (size_t)E * sizeof(int32_t), &f->st_map, err));
    f->st_map_host = malloc(chunks * (size_t)E * sizeof(int32_t));
    f->st_experts = malloc((size_t)hp->n_layer * (size_t)E * sizeof(int32_t));
    f->st_layer = malloc(chunks * sizeof(int32_t));
    f->st_first = malloc(chunks * sizeof(int32_t));
    f->st_count = malloc(chunks * sizeof(int32_t));
    f->st_pieces = malloc(3 * (size_t)f->st_chunk * sizeof *f->st_pieces);
    if (!f->st_map_host || !f->st_experts || !f->st_layer || !f->st_first || !f->st_count || !f->st_pieces)
        return tdm_error_set(err, TDM_ERR_OOM, "forward_gpu: prompt streaming tables");
    return TDM_OK;
}

/* After start_hybrid: prompt streaming's two page-locked chunks, unless it
 * reads the registered copy. */
static tdm_status stream_staging(tdm_forward_gpu *f, tdm_error *err)
{
    if (!f->stream_min || f->reg_base)
        return TDM_OK;
    const size_t bytes = (size_t)f->st_chunk * tdm_expert_cache_slot_bytes_for(f->m);
    for (int b = 0; b < 2; b++)
        TDM_TRY(tdm_gpu_alloc_host(f->g, bytes, (void **)&f->st_host[b], err));
    return TDM_OK;
}

static tdm_status create(const tdm_model *m, int device, int32_t n_ctx, int32_t max_batch,
                         const tdm_executor_params *xp, tdm_forward_gpu **out, tdm_error *err)
{
    *out = NULL;
    const tdm_hparams *hp = tdm_model_hparams(m);
    if (n_ctx <= 0 || max_batch <= 0)
        return tdm_error_set(err, TDM_ERR_INVALID, "forward_gpu: n_ctx %d and max_batch %d must be positive", n_ctx,
                             max_batch);
    if (!tdm_gpu_available())
        return tdm_error_set(err, TDM_ERR_UNSUPPORTED, "forward_gpu: no CUDA device (or a build without CUDA)");
    if (xp && (hp->n_expert < 1 || hp->n_expert_used < 1))
        return tdm_error_set(err, TDM_ERR_UNSUPPORTED, "forward_gpu: hybrid mode needs routed experts (%s has none)",
                             tdm_arch_name(hp->arch));
    tdm_forward_gpu *f = calloc(1, sizeof *f);
    if (!f)
        return tdm_error_set(err, TDM_ERR_OOM, "forward_gpu context");
    f->m = m;
    f->hp = hp;
    f->n_ctx = n_ctx;
    f->B = max_batch < n_ctx ? max_batch : n_ctx;
    f->S = xp && stream_min_of(f, xp) ? tdm_stream_span(f->B, n_ctx) : f->B;
    f->mm_min = TDM_GPU_MATVEC_MAX_TOK; /* longer batches of quantised weights: the GEMM */
    f->graphs = true;
    f->hybrid = xp != NULL;
    size_dims(f);
    f->L = calloc((size_t)hp->n_layer, sizeof *f->L);
    tdm_status st = f->L ? tdm_gpu_create(device, &f->g, err) : tdm_error_set(err, TDM_ERR_OOM, "forward_gpu layers");
    if (!st && xp)
        st = plan_budget(f, xp, err);
    if (!st)
        st = alloc_state(f, err);
    for (int32_t il = 0; il < hp->n_layer && !st; il++) {
        st = upload_layer(f, tdm_model_layer(m, il), il, &f->L[il], err);
        if (st)
            tdm_error_wrap(err, "layer %d", il);
    }
    if (!st)
        st = up_weight(f, tdm_model_output_norm(m), &f->out_norm, err);
    if (!st)
        st = up_weight(f, tdm_model_output(m), &f->output, err);
    if (!st) {
        size_moe_scratch(f);
        st = xp ? alloc_stream(f, xp, err) : hold_prompt_scratch(f, err);
    }
    if (!st && xp)
        st = start_hybrid(f, xp, err);
    if (!st && xp)
        st = stream_staging(f, err);
    if (!st)
        st = tdm_forward_gpu_reset(f, err);
    if (!st)
        st = tdm_gpu_sync(f->g, err);
    if (st) {
        tdm_forward_gpu_free(f);
        return st;
    }
    *out = f;
    return TDM_OK;
}

tdm_status tdm_forward_gpu_new(const tdm_model *m, int device, int32_t n_ctx, int32_t max_batch,
                               tdm_forward_gpu **out, tdm_error *err)
{
    return create(m, device, n_ctx, max_batch, NULL, out, err);
}

tdm_status tdm_forward_gpu_new_hybrid(const tdm_model *m, int device, int32_t n_ctx, int32_t max_batch,
                                      const tdm_executor_params *xp, tdm_forward_gpu **out, tdm_error *err)
{
    if (!xp) {
        *out = NULL;
        return tdm_error_set(err, TDM_ERR_INVALID, "forward_gpu: hybrid mode without executor parameters");
    }
    return create(m, device, n_ctx, max_batch, xp, out, err);
}

tdm_executor *tdm_forward_gpu_executor(tdm_forward_gpu *f) { return f->ex; }
const tdm_budget *tdm_forward_gpu_budget(const tdm_forward_gpu *f) { return f->ex ? &f->budget : NULL; }

size_t tdm_forward_gpu_bytes(const tdm_forward_gpu *f) { return f->bytes; }
size_t tdm_forward_gpu_weight_bytes(const tdm_forward_gpu *f) { return f->weight_bytes; }
int32_t tdm_forward_gpu_n_ctx(const tdm_forward_gpu *f) { return f->n_ctx; }
tdm_gpu *tdm_forward_gpu_context(tdm_forward_gpu *f) { return f->g; }
float *tdm_forward_gpu_host_logits(tdm_forward_gpu *f) { return f->host_logits; }
void tdm_forward_gpu_set_matmul_min(tdm_forward_gpu *f, int32_t n) { f->mm_min = n < 1 ? 1 : n; }
void tdm_forward_gpu_set_graphs(tdm_forward_gpu *f, bool on)
{
    f->graphs = on;
    if (!on) { /* a later enable records afresh */
        tdm_gpu_graph_free(f->graph);
        f->graph = NULL;
    }
}
bool tdm_forward_gpu_graphs(const tdm_forward_gpu *f) { return f->graphs; }
size_t tdm_forward_gpu_rec_floats(const tdm_forward_gpu *f) { return f->rec_floats; }

void tdm_forward_gpu_set_route_hook(tdm_forward_gpu *f, tdm_forward_route_fn fn, void *user)
{
    f->hook = fn;
    f->hook_user = user;
}

tdm_status tdm_forward_gpu_reset(tdm_forward_gpu *f, tdm_error *err)
{
    return tdm_gpu_memset(f->g, f->rec, 0, f->rec_floats * sizeof(float), err);
}

tdm_status tdm_forward_gpu_rec_save(tdm_forward_gpu *f, float *dst, tdm_error *err)
{
    return f->rec_floats ? tdm_gpu_download(f->g, dst, f->rec, f->rec_floats * sizeof(float), err) : TDM_OK;
}

tdm_status tdm_forward_gpu_rec_load(tdm_forward_gpu *f, const float *src, tdm_error *err)
{
    return f->rec_floats ? tdm_gpu_upload(f->g, f->rec, src, f->rec_floats * sizeof(float), err) : TDM_OK;
}

/* ---- products ---- */

/* y[t] = (acc ? y[t] : 0) + W x[t] for n tokens: one matvec launch (with
 * x's int8 copy xq from the norm that wrote x, when there is one), or the
 * fp16 GEMM for long batches of non-F32 weights (acc through tmp). */
static tdm_status proj(tdm_forward_gpu *f, const dweight *w, const float *x, const void *xq, int32_t n, float *y,
                       bool acc, tdm_error *err)
{
    if (n > f->mm_min) {
        float *dst = acc ? f->tmp : y;
        if (acc && w->rows > f->hp->n_embd)
            return tdm_error_set(err, TDM_ERR_INVALID, "forward_gpu: accumulated product of %lld rows",
                                 (long long)w->rows);
        tdm_status st = tdm_gpu_matmul(f->g, w->type, w->d, w->rows, w->cols, x, n, dst, f->mm_scratch, f->mm_bytes,
                                       err);
        if (!st && acc)
            st = tdm_gpu_add_f32(f->g, y, f->tmp, (size_t)n * w->rows, err);
        return st;
    }
    return tdm_gpu_matvec(f->g, w->type, w->d, w->rows, w->cols, x, xq, n, y, acc, err);
}

/* The int8 copy buffer for a norm of n tokens whose rows are k wide, or
 * NULL: only one-token steps use it. */
static void *xq_for(const tdm_forward_gpu *f, int32_t n, int64_t k)
{
    return n == 1 && f->xq && k <= f->xq_k ? f->xq : NULL;
}

/* ---- layers (forward.c's attention_layer / deltanet_layer / ffn_layer) ---- */


/* A one-token step runs a fused group as one product into dst (one launch,
 * or two for a type pair without a kernel), when the group exists and its
 * rows fit dst's cap floats (the [B][...] buffers hold B rows of a batch;
 * one token's fused rows need only one). */
static bool fused(const dgroup *g, int32_t n, size_t cap)
{
    return n == 1 && g->a.d && (size_t)(g->a.rows + g->b.rows) <= cap;
}

/* A fused group's one-token product into y: a's rows, then b's (one launch
 * for a type pair with a kernel, tdm_gpu_matvec_pair). */
static tdm_status proj_group(tdm_forward_gpu *f, const dgroup *g, const float *x, const void *xq, float *y,
                             tdm_error *err)
{
    if (!g->b.d)
        return proj(f, &g->a, x, xq, 1, y, false, err);
    if (f->mm_min < 1) { /* one token takes the GEMM path too: a matrix at a time */
        TDM_TRY(proj(f, &g->a, x, xq, 1, y, false, err));
        return proj(f, &g->b, x, xq, 1, y + g->a.rows, false, err);
    }
    const tdm_gpu_mat a = {g->a.type, g->a.d, g->a.rows}, b = {g->b.type, g->b.d, g->b.rows};
    return tdm_gpu_matvec_pair(f->g, &a, &b, g->a.cols, x, xq, y, false, err);
}

static tdm_status attention_layer(tdm_forward_gpu *f, const tdm_layer *L, const glayer *gl, int32_t n, int32_t pos0,
                                  tdm_error *err)
{
    const tdm_hparams *hp = f->hp;
    const int64_t H = hp->n_head, Hkv = hp->n_head_kv, hd = hp->head_dim, d = hp->n_embd;
    const size_t per_layer = (size_t)Hkv * f->n_ctx * hd;
    uint16_t *kc = f->kc + (size_t)L->slot * per_layer, *vc = f->vc + (size_t)L->slot * per_layer;
    tdm_gpu_attn_in in = {.q_src = f->p1, .k_src = f->p2, .v_src = f->p3, .q_stride = gl->wq.rows,
                          .kv_stride = Hkv * hd, .q_norm = gl->q_norm.d, .k_norm = gl->k_norm.d, .n_head = H,
                          .n_kv = Hkv, .head_dim = hd, .n_rot = hp->n_rot, .base = (float)hp->rope_base,
                          .eps = hp->norm_eps};
    void *xq = xq_for(f, n, d);
    TDM_TRY(tdm_gpu_rmsnorm(f->g, f->x, gl->attn_norm.d, f->xn, xq, n, d, d, hp->norm_eps, err));
    if (fused(&gl->f_qkv, n, (size_t)f->B * f->wide)) { /* p1 = q (| gate) | k | v */
        TDM_TRY(proj_group(f, &gl->f_qkv, f->xn, xq, f->p1, err));
        in.k_src = f->p1 + gl->wq.rows;
        in.v_src = in.k_src + gl->wk.rows;
    } else {
        TDM_TRY(proj(f, &gl->wq, f->xn, xq, n, f->p1, false, err));
        TDM_TRY(proj(f, &gl->wk, f->xn, xq, n, f->p2, false, err));
        TDM_TRY(proj(f, &gl->wv, f->xn, xq, n, f->p3, false, err));
    }
    TDM_TRY(tdm_gpu_attn_prep(f->g, &in, f->pos, n, f->q, hp->attn_gated ? f->gate : NULL, kc, vc, f->n_ctx, err));
    const float scale = (float)(1.0 / sqrt((double)hd));
    TDM_TRY(tdm_gpu_attention(f->g, f->q, kc, vc, hp->attn_gated ? f->gate : NULL, f->ao, n, H, Hkv, hd, f->n_ctx, f->pos,
                          scale, f->attn_scratch, f->attn_bytes, err));
    return proj(f, &gl->wo, f->ao, NULL, n, f->x, true, err);
}

static tdm_status deltanet_layer(tdm_forward_gpu *f, const tdm_layer *L, const glayer *gl, int32_t n,
                                 tdm_error *err)
{
    const tdm_hparams *hp = f->hp;
    const int64_t d = hp->n_embd, Hv = hp->ssm_n_v_heads, K = hp->ssm_conv_kernel;
    float *conv_state = f->rec + (size_t)L->slot * 2u * (size_t)(K - 1) * f->conv_dim;
    float *S = f->rec + f->conv_floats + (size_t)L->slot * Hv * hp->ssm_d_k * hp->ssm_d_v;
    float *z = f->p2, *alpha = f->alpha;
    void *xq = xq_for(f, n, d);
    TDM_TRY(tdm_gpu_rmsnorm(f->g, f->x, gl->attn_norm.d, f->xn, xq, n, d, d, hp->norm_eps, err));
    if (fused(&gl->f_dn, n, (size_t)f->B * f->wide)) { /* p1 = qkv | z */
        TDM_TRY(proj_group(f, &gl->f_dn, f->xn, xq, f->p1, err));
        z = f->p1 + gl->qkv.rows;
    } else {
        TDM_TRY(proj(f, &gl->qkv, f->xn, xq, n, f->p1, false, err));
        TDM_TRY(proj(f, &gl->z, f->xn, xq, n, z, false, err));
    }
    if (fused(&gl->f_ba, n, (size_t)f->B * Hv)) { /* beta | alpha */
        TDM_TRY(proj_group(f, &gl->f_ba, f->xn, xq, f->beta, err));
        alpha = f->beta + Hv;
    } else {
        TDM_TRY(proj(f, &gl->beta, f->xn, xq, n, f->beta, false, err));
        TDM_TRY(proj(f, &gl->alpha, f->xn, xq, n, alpha, false, err));
    }
    const tdm_gpu_deltanet_shape sh = {
        .n_k_head = hp->ssm_n_k_heads, .n_v_head = Hv, .d_k = hp->ssm_d_k, .d_v = hp->ssm_d_v,
        .map = hp->vhead_tiled ? TDM_GPU_HEADS_TILED : TDM_GPU_HEADS_GROUPED, .eps = 1e-6f};
    void *oq = xq_for(f, n, Hv * hp->ssm_d_v);
    if (n == 1 && tdm_gpu_deltanet_step_fits(&sh, K, oq != NULL)) { /* conv, recurrence, norm: one launch */
        const tdm_gpu_deltanet_step_io io = {
            .qkv = f->p1, .conv_w = gl->conv.d, .conv_state = conv_state, .pos = f->pos, .kernel = K,
            .beta = f->beta, .alpha = alpha, .ssm_a = gl->a.d, .dt_bias = gl->dt.d, .state = S, .z = z,
            .norm_w = gl->ssm_norm.d, .norm_eps = hp->norm_eps, .y = f->q, .yq = oq};
        TDM_TRY(tdm_gpu_deltanet_step(f->g, &sh, &io, err));
    } else {
        TDM_TRY(tdm_gpu_ssm_conv(f->g, f->p1, gl->conv.d, conv_state, f->pos, f->p3, n, f->conv_dim, K, err));
        TDM_TRY(tdm_gpu_deltanet(f->g, &sh, f->p3, f->beta, alpha, gl->a.d, gl->dt.d, S, f->ao, n, err));
        TDM_TRY(tdm_gpu_rmsnorm_gated(f->g, f->ao, z, gl->ssm_norm.d, f->q, oq, (int64_t)n * Hv, hp->ssm_d_v, Hv,
                                  hp->norm_eps, err));
    }
    return proj(f, &gl->out, f->q, oq, n, f->x, true, err);
}

static int32_t *layer_ids(const tdm_forward_gpu *f, int32_t il)
{
    return f->ids + ((size_t)il * f->S + f->sub0) * (size_t)(f->hp->n_expert_used > 0 ? f->hp->n_expert_used : 1);
}

static tdm_status route_hook(tdm_forward_gpu *f, int32_t il, int32_t n, int32_t pos0, int32_t k, tdm_error *err)
{
    TDM_TRY(tdm_gpu_download(f->g, f->hids, layer_ids(f, il), (size_t)n * k * sizeof(int32_t), err));
    TDM_TRY(tdm_gpu_download(f->g, f->hwts, f->wts, (size_t)n * k * sizeof(float), err));
    for (int32_t t = 0; t < n; t++)
        f->hook(f->hook_user, pos0 + t, il, k, f->hids + (size_t)t * k, f->hwts + (size_t)t * k);
    return TDM_OK;
}

/* ---- prompt streaming (see the struct) ---- */

/* Chunk c's experts ex [n] into device buffer b, each as a slot (gate |
 * up | down) at slot offsets: straight from the registered copy, one 2-D
 * DMA per matrix per run of consecutive experts. */
static tdm_status send_registered(tdm_forward_gpu *f, int b, const tdm_weight *const w[3], const int32_t *ex,
                                  int32_t n, size_t slot, tdm_error *err)
{
    for (int32_t j0 = 0, j1; j0 < n; j0 = j1) {
        for (j1 = j0 + 1; j1 < n && ex[j1] == ex[j1 - 1] + 1; j1++)
            ;
        size_t off = 0;
        for (int i = 0; i < 3; i++) {
            TDM_TRY(tdm_gpu_copy_rows_async(f->g, f->st_dev[b] + (size_t)j0 * slot + off, slot,
                                        (const uint8_t *)w[i]->data + (size_t)ex[j0] * w[i]->mat_bytes,
                                        w[i]->mat_bytes, w[i]->mat_bytes, (size_t)(j1 - j0), err));
            off += w[i]->mat_bytes;
        }
    }
    return TDM_OK;
}

/* The same through staging b: once the copy that last read it is over, the
 * pool copies the experts into it, then one DMA sends it. */
static tdm_status send_staged(tdm_forward_gpu *f, int b, const tdm_weight *const w[3], const int32_t *ex, int32_t n,
                              size_t slot, tdm_error *err)
{
    TDM_TRY(tdm_gpu_fence_wait_host(f->g, b, err));
    for (int32_t j = 0; j < n; j++) {
        size_t off = 0;
        for (int i = 0; i < 3; i++) {
            f->st_pieces[3 * j + i] = (tdm_copy_piece){f->st_host[b] + (size_t)j * slot + off,
                                                       (const uint8_t *)w[i]->data + (size_t)ex[j] * w[i]->mat_bytes,
                                                       w[i]->mat_bytes};
            off += w[i]->mat_bytes;
        }
    }
    TDM_TRY(tdm_pool_copy(tdm_executor_pool(f->ex), f->st_pieces, 3 * n, err));
    TDM_TRY(tdm_gpu_wait_compute(f->g, err));
    return tdm_gpu_copy_async(f->g, f->st_dev[b], f->st_host[b], (size_t)n * slot, err);
}

/* Chunk c to the GPU, on the copy stream after the kernels queued so far
 * (the last to read device buffer c & 1, chunk c - 2's, among them). */
static tdm_status stream_send(tdm_forward_gpu *f, int32_t c, tdm_error *err)
{
    const int b = c & 1;
    const int32_t n = f->st_count[c];
    const tdm_layer *L = tdm_model_layer(f->m, f->st_layer[c]);
    const size_t slot = f->L[f->st_layer[c]].table.slot_bytes;
    const tdm_weight *const w[3] = {&L->gate_exps, &L->up_exps, &L->down_exps};
    const int32_t *ex = f->st_experts + f->st_first[c];
    if (f->reg_base) {
        TDM_TRY(tdm_gpu_wait_compute(f->g, err));
        TDM_TRY(send_registered(f, b, w, ex, n, slot, err));
    } else {
        TDM_TRY(send_staged(f, b, w, ex, n, slot, err));
    }
    f->st_bytes += (uint64_t)n * slot;
    return tdm_gpu_fence_copies(f->g, b, err);
}

/* Before a streaming batch: every MoE layer's experts without a slot in the
 * published table, cut into chunks with a map each (expert -> slot in the
 * chunk, or -1), uploaded; the first chunk is sent at once. */
static tdm_status stream_plan(tdm_forward_gpu *f, tdm_error *err)
{
    const tdm_hparams *hp = f->hp;
    const int32_t E = hp->n_expert;
    const int32_t *res = tdm_expert_cache_residency(tdm_executor_cache(f->ex));
    f->st_total = f->st_next = f->st_moe_layers = 0;
    f->st_bytes = 0;
    for (int32_t il = 0; il < hp->n_layer; il++) {
        if (tdm_model_layer(f->m, il)->ffn != TDM_FFN_MOE)
            continue;
        f->st_moe_layers++;
        int32_t *miss = f->st_experts + (size_t)il * E, m = 0;
        for (int32_t e = 0; e < E; e++)
            if (res[(size_t)il * E + e] < 0)
                miss[m++] = e;
        for (int32_t c0 = 0; c0 < m; c0 += f->st_chunk) {
            const int32_t c = f->st_total++, n = m - c0 < f->st_chunk ? m - c0 : f->st_chunk;
            int32_t *map = f->st_map_host + (size_t)c * E;
            f->st_layer[c] = il;
            f->st_first[c] = il * E + c0;
            f->st_count[c] = n;
            for (int32_t e = 0; e < E; e++)
                map[e] = -1;
            for (int32_t j = 0; j < n; j++)
                map[miss[c0 + j]] = j;
        }
    }
    if (!f->st_total)
        return TDM_OK;
    TDM_TRY(tdm_gpu_upload(f->g, f->st_map, f->st_map_host, (size_t)f->st_total * E * sizeof(int32_t), err));
    return stream_send(f, 0, err);
}

/* Whether a batch of n tokens runs its routed experts grouped by expert
 * (the prompt path) for weights of type t, rather than the fused launches. */
static bool moe_grouped(const tdm_forward_gpu *f, int32_t n, tdm_qtype t)
{
    return n > f->mm_min && f->moe_bytes && t != TDM_Q_F32;
}

/* Whether a hybrid batch of n tokens reads the direct share: fused launches,
 * not streaming, registered memory. */
static bool direct_batch(const tdm_forward_gpu *f, int32_t n)
{
    return f->reg_base && !f->streaming && (n <= f->mm_min || !f->moe_bytes);
}

/* Layer il's routed experts: the fused kernels (or the grouped prompt path)
 * over the experts `table` holds, accumulated into f->x. */
static tdm_status moe_run(tdm_forward_gpu *f, const tdm_gpu_moe_layer *moe, const void *xq, const int32_t *ids,
                          const float *wts, int32_t n, int32_t k, tdm_error *err)
{
    if (moe_grouped(f, n, moe->gate_type)) /* prompt: grouped by expert */
        return tdm_gpu_moe_prefill(f->g, moe, f->xn, ids, wts, n, k, f->h, NULL, f->x, true, f->moe_scratch,
                                   f->moe_bytes, err);
    TDM_TRY(tdm_gpu_moe_gate_up(f->g, moe, f->xn, xq, ids, n, k, f->h, err));
    return tdm_gpu_moe_down(f->g, moe, f->h, ids, wts, n, k, NULL, f->x, true, err);
}

/* A streaming span of n tokens, after layer il's hits in every batch: its
 * chunks in turn, each once it has landed (the next one sent meanwhile),
 * computed for every batch of the span. Leaves the views at the last batch. */
static tdm_status stream_layer(tdm_forward_gpu *f, const glayer *gl, int32_t il, int32_t n, tdm_error *err)
{
    const int32_t E = f->hp->n_expert;
    while (f->st_next < f->st_total && f->st_layer[f->st_next] == il) {
        const int32_t c = f->st_next++;
        TDM_TRY(tdm_gpu_fence_wait_compute(f->g, c & 1, err));
        if (c + 1 < f->st_total)
            TDM_TRY(stream_send(f, c + 1, err));
        tdm_gpu_expert_table t = gl->table;
        t.slot_of = f->st_map + (size_t)c * E;
        t.arena = f->st_dev[c & 1];
        tdm_gpu_moe_layer moe = gl->moe;
        moe.table = &t;
        moe.layer = 0;
        moe.shared = NULL;
        for (int32_t t0 = 0; t0 < n; t0 += f->B) {
            span_view(f, t0);
            TDM_TRY(moe_run(f, &moe, NULL, layer_ids(f, il), f->wts, n - t0 < f->B ? n - t0 : f->B, gl->k, err));
        }
    }
    return TDM_OK;
}

/* What a side-stream branch of the prefetch runs, in this order. */
enum {
    SIDE_ROUTE = 1,       /* router product and top-k over f->pxn into f->pids */
    SIDE_HINT = 2,        /* the pool's hint alone (tdm_gpu_prefetch_hint), when hints are on */
    SIDE_STAGE = 4,       /* the staging of f->pids, with the pool's hint */
    SIDE_STAGE_QUIET = 8, /* the staging of f->pids, whose hint went out before */
    SIDE_COPY = 16        /* the copy of the experts the staging gave spare slots */
};

/* The prediction's router input: layer il's norm of the residual stream as
 * it is now, into f->pxn. On the compute stream, because the running layer
 * adds into f->x. */
static tdm_status predict_norm(tdm_forward_gpu *f, const glayer *gl, tdm_error *err)
{
    const int64_t d = f->hp->n_embd;
    return tdm_gpu_rmsnorm(f->g, f->x, gl->post_norm.d, f->pxn, NULL, 1, d, d, f->hp->norm_eps, err);
}

/* The steps `what` of layer il's prediction on the side stream, after
 * everything the compute stream has run so far (staging clears what layer
 * prev staged). */
static tdm_status side_branch(tdm_forward_gpu *f, const glayer *gl, int32_t il, int32_t prev, unsigned what,
                              tdm_error *err)
{
    const tdm_hparams *hp = f->hp;
    tdm_gpu_prefetch quiet = f->pf;
    quiet.hint_seq = NULL;
    TDM_TRY(tdm_gpu_side_begin(f->g, err));
    tdm_status st = TDM_OK;
    if (what & SIDE_ROUTE) {
        st = proj(f, &gl->router, f->pxn, NULL, 1, f->prl, false, err);
        if (!st)
            st = tdm_gpu_router(f->g, f->prl, 1, hp->n_expert, gl->k, hp->norm_topk, f->pids, f->pwts, err);
    }
    if (!st && (what & SIDE_HINT) && f->pf.hint_seq)
        st = tdm_gpu_prefetch_hint(f->g, &f->pf, il, f->pids, gl->k, err);
    if (!st && (what & (SIDE_STAGE | SIDE_STAGE_QUIET)))
        st = tdm_gpu_prefetch_stage(f->g, what & SIDE_STAGE ? &f->pf : &quiet, il, prev, f->pids, gl->k, err);
    if (!st && (what & SIDE_COPY))
        st = tdm_gpu_prefetch_copy(f->g, &f->pf, il, &gl->direct, &gl->table, err);
    tdm_error e2 = {0};
    const tdm_status se = tdm_gpu_side_end(f->g, st ? &e2 : err);
    return st ? st : se;
}

static tdm_status ffn_layer(tdm_forward_gpu *f, const tdm_layer *L, const glayer *gl, int32_t il, int32_t n,
                            int32_t pos0, bool staged, int32_t early, tdm_error *err)
{
    const tdm_hparams *hp = f->hp;
    const int64_t d = hp->n_embd;
    const int32_t k = gl->k;
    const int32_t *ids = f->zeros;
    const float *wts = f->ones;
    tdm_gpu_moe_layer moe = gl->moe; /* a one-token step may read the shared gate from the fused logits */
    tdm_gpu_shared_expert shared;
    void *xq = xq_for(f, n, d); /* for gate_up (the router products are F32) */
    TDM_TRY(tdm_gpu_rmsnorm(f->g, f->x, gl->post_norm.d, f->xn, xq, n, d, d, hp->norm_eps, err));
    if (L->ffn == TDM_FFN_MOE && fused(&gl->f_route, n, (size_t)f->B * hp->n_expert)) { /* router | shared gate */
        TDM_TRY(proj_group(f, &gl->f_route, f->xn, NULL, f->rl, err));
        shared = gl->shared;
        shared.gate_logit = f->rl + hp->n_expert;
        moe.shared = &shared;
    } else if (L->ffn == TDM_FFN_MOE) {
        TDM_TRY(proj(f, &gl->router, f->xn, NULL, n, f->rl, false, err));
        if (gl->shexp_gate.d)
            TDM_TRY(proj(f, &gl->shexp_gate, f->xn, NULL, n, f->sg, false, err));
    }
    if (L->ffn == TDM_FFN_MOE) {
        ids = layer_ids(f, il);
        wts = f->wts;
        /* one token: the shared expert's gate and up in the router's launch,
         * so gate_up's blocks are the routed experts' (tdm_gpu_router_shared) */
        moe.shared_done = n == 1 && moe.shared && !moe_grouped(f, n, moe.gate_type) &&
                          hp->n_expert <= TDM_GPU_ROUTER_SHARED_MAX_EXPERTS;
        if (moe.shared_done)
            TDM_TRY(tdm_gpu_router_shared(f->g, &moe, f->rl, n, hp->n_expert, k, hp->norm_topk, layer_ids(f, il), f->wts,
                                      f->xn, xq, f->h, err));
        else
            TDM_TRY(tdm_gpu_router(f->g, f->rl, n, hp->n_expert, k, hp->norm_topk, layer_ids(f, il), f->wts, err));
        if (f->hook)
            TDM_TRY(route_hook(f, il, n, pos0, k, err));
        if (staged) /* the prefetch's residency entries and slots, before anything reads them */
            TDM_TRY(tdm_gpu_side_join(f->g, err));
        /* hybrid: the misses go to the CPU pool now (but the direct share),
         * the hits run meanwhile (or, streaming, the misses follow on the GPU) */
        const bool direct = f->ex && direct_batch(f, n);
        if (direct)
            moe.direct = &gl->direct;
        /* a prefetching layer with a pool hint: the hinted selections last */
        const bool reorder = staged && f->pf.hint_seq;
        const bool handoff = f->ex && !f->streaming && !f->full[il];
        if (handoff)
            TDM_TRY(tdm_gpu_handoff_publish(f->g, &f->ho, il, f->xn, ids, wts, n, direct, reorder ? &f->order : NULL,
                                        err));
        if (early >= 0) { /* the early prediction's hint, from this layer's input (early_target) */
            TDM_TRY(predict_norm(f, &f->L[early], err));
            TDM_TRY(side_branch(f, &f->L[early], early, -1, SIDE_ROUTE | SIDE_HINT, err));
        }
        if (reorder) {
            ids = f->order.ids;
            wts = f->order.weights;
        }
        if (handoff && direct && n == 1 && f->ds.n) { /* the share staged, in the order the publish counted */
            TDM_TRY(tdm_gpu_direct_stage(f->g, &f->ds, il, f->ds_prev, ids, k, &gl->direct, &gl->table, err));
            f->ds_prev = il;
            moe.direct = NULL;
        }
    }
    return moe_run(f, &moe, xq, ids, wts, n, k, err); /* a hand-off's merge or the stream follows */
}

/* ---- driver ---- */

/* Token embeddings dequantised on the host (the table stays in the mapping)
 * and uploaded with the positions. */
static tdm_status embed(tdm_forward_gpu *f, const int32_t *tokens, int32_t n, int32_t pos0, tdm_error *err)
{
    const tdm_weight *te = tdm_model_tok_embd(f->m);
    const int64_t d = f->hp->n_embd;
    for (int32_t t = 0; t < n; t++) {
        const uint8_t *row = (const uint8_t *)te->data + (size_t)tokens[t] * te->row_bytes;
        if (tdm_dequant_row(te->type, row, f->hx + (size_t)t * d, d, err))
            return tdm_error_wrap(err, "forward_gpu: embedding %s", te->name);
        f->hpos[t] = pos0 + t;
    }
    /* every eval ends synchronised (tdm_forward_gpu_eval), so no earlier
     * upload still reads hx or hpos here */
    TDM_TRY(tdm_gpu_upload_async(f->g, f->x, f->hx, (size_t)n * d * sizeof(float), err));
    return tdm_gpu_upload_async(f->g, f->pos, f->hpos, (size_t)n * sizeof(int32_t), err);
}

/* Output head over rows t0 .. t0+nr-1 (nr <= LOGIT_ROWS) into f->logits. */
static tdm_status head_rows(tdm_forward_gpu *f, int32_t t0, int32_t nr, tdm_error *err)
{
    const int64_t d = f->hp->n_embd;
    void *xq = xq_for(f, nr, d);
    TDM_TRY(tdm_gpu_rmsnorm(f->g, f->x + (size_t)t0 * d, f->out_norm.d, f->xn + (size_t)t0 * d, xq, nr, d, d,
                        f->hp->norm_eps, err));
    return proj(f, &f->output, f->xn + (size_t)t0 * d, xq, nr, f->logits, false, err);
}

/* The greedy choice over the logits of row 0 of f->logits into f->next. */
static tdm_status choose(tdm_forward_gpu *f, tdm_error *err)
{
    return tdm_gpu_argmax(f->g, f->logits, f->hp->n_vocab, f->amax_scratch, f->next, err);
}

/* The head of a batch of n tokens: logits of the last (all: of every) row
 * into dst, or (dst NULL) the greedy choice after the last one queued for
 * download into host_next. */
static tdm_status head(tdm_forward_gpu *f, int32_t n, float *dst, bool all, tdm_error *err)
{
    const int64_t V = f->hp->n_vocab;
    if (!dst) {
        TDM_TRY(head_rows(f, n - 1, 1, err));
        TDM_TRY(choose(f, err));
        return tdm_gpu_download_async(f->g, f->host_next, f->next, sizeof(int32_t), err);
    }
    const int32_t r0 = all ? 0 : n - 1;
    for (int32_t t0 = r0; t0 < n; t0 += LOGIT_ROWS) {
        const int32_t nr = n - t0 < LOGIT_ROWS ? n - t0 : LOGIT_ROWS;
        TDM_TRY(head_rows(f, t0, nr, err));
        TDM_TRY(tdm_gpu_download(f->g, dst + (size_t)(t0 - r0) * V, f->logits, (size_t)nr * V * sizeof(float), err));
    }
    return TDM_OK;
}

/* Whether layer il of a batch of n tokens prefetches its predicted misses. */
static bool prefetching(const tdm_forward_gpu *f, const tdm_layer *L, int32_t il, int32_t n)
{
    return f->pf.n && n == 1 && direct_batch(f, n) && L->ffn == TDM_FFN_MOE && !f->full[il];
}

/* Layer il's prefetch: its prediction (its router over the residual
 * stream now), the staging of the predicted misses with the pool's hint
 * (clearing what layer prev staged) and their copy. */
static tdm_status prefetch(tdm_forward_gpu *f, const glayer *gl, int32_t il, int32_t prev, tdm_error *err)
{
    TDM_TRY(predict_norm(f, gl, err));
    return side_branch(f, gl, il, prev, SIDE_ROUTE | SIDE_STAGE | SIDE_COPY, err);
}

/* The early prediction: when the layer after miss layer il launches no
 * prefetch (it holds every expert, or is dense) and the one after that
 * does, that one (the target, returned; -1: none) is predicted from layer
 * il's FFN input, in il's hand-off right after its publish (ffn_layer), and
 * only its hint goes out then: the pool finds it when its job ends and
 * warms the target's likely misses through the full layer. Layer il's own
 * staged experts are in use until its merge; the staging and copy follow
 * that, from the same prediction (layers()). */
static int32_t early_target(const tdm_forward_gpu *f, int32_t il, int32_t n)
{
    const int32_t nl = f->hp->n_layer;
    if (il + 2 >= nl || !prefetching(f, tdm_model_layer(f->m, il + 2), il + 2, n) ||
        prefetching(f, tdm_model_layer(f->m, il + 1), il + 1, n))
        return -1;
    return il + 2;
}

static tdm_status layers(tdm_forward_gpu *f, int32_t n, int32_t pos0, tdm_error *err)
{
    const int32_t nl = f->hp->n_layer;
    int32_t staged = -1; /* the last layer that prefetched */
    int32_t ahead = -1;  /* the layer whose prefetch is in flight, joined at its hand-off */
    for (int32_t il = 0; il < nl; il++) {
        const tdm_layer *L = tdm_model_layer(f->m, il);
        const glayer *gl = &f->L[il];
        tdm_status st = TDM_OK;
        /* a layer's prefetch starts with the layer, or a layer earlier when
         * that one does not prefetch (it holds every expert, or is dense):
         * its time, too, leaves host memory and PCIe idle */
        if (ahead < il) {
            const int32_t t = prefetching(f, L, il, n) ? il
                              : il + 1 < nl && prefetching(f, tdm_model_layer(f->m, il + 1), il + 1, n) ? il + 1
                                                                                                       : -1;
            if (t >= 0)
                st = prefetch(f, &f->L[t], t, staged, err);
            staged = ahead = t >= 0 ? t : ahead;
        }
        if (!st)
            st = L->kind == TDM_LAYER_ATTN ? attention_layer(f, L, gl, n, pos0, err)
                                           : deltanet_layer(f, L, gl, n, err);
        const bool handoff = f->ex && L->ffn == TDM_FFN_MOE && !f->streaming && !f->full[il];
        const int32_t early = handoff && ahead == il ? early_target(f, il, n) : -1;
        if (!st)
            st = ffn_layer(f, L, gl, il, n, pos0, ahead == il, early, err);
        if (!st && handoff) /* the hand-off's merge */
            st = tdm_gpu_handoff_merge(f->g, &f->ho, f->x, n, err);
        if (!st && early >= 0) { /* the early prediction's staging (early_target) */
            st = side_branch(f, &f->L[early], early, staged, SIDE_STAGE_QUIET | SIDE_COPY, err);
            staged = ahead = early;
        }
        if (st)
            return tdm_error_wrap(err, "layer %d", il);
    }
    /* the last staged entries back to -1: the table is the cache's again */
    if (f->ds.n && f->ds_prev >= 0)
        TDM_TRY(tdm_gpu_direct_stage(f->g, &f->ds, -1, f->ds_prev, NULL, 0, NULL, NULL, err));
    f->ds_prev = -1;
    return staged >= 0 ? tdm_gpu_prefetch_stage(f->g, &f->pf, -1, staged, NULL, 0, err) : TDM_OK;
}

/* A streaming span of n tokens (pos0 on): layer by layer, each layer's
 * attention or DeltaNet and hits for every batch of B tokens in turn (the
 * recurrent state and the KV cache see the tokens in order), then its
 * streamed chunks for all of them (stream_layer). */
static tdm_status span_layers(tdm_forward_gpu *f, int32_t n, int32_t pos0, tdm_error *err)
{
    tdm_status st = TDM_OK;
    for (int32_t il = 0; il < f->hp->n_layer && !st; il++) {
        const tdm_layer *L = tdm_model_layer(f->m, il);
        const glayer *gl = &f->L[il];
        for (int32_t t0 = 0; t0 < n && !st; t0 += f->B) {
            const int32_t nb = n - t0 < f->B ? n - t0 : f->B;
            span_view(f, t0);
            st = L->kind == TDM_LAYER_ATTN ? attention_layer(f, L, gl, nb, pos0 + t0, err)
                                           : deltanet_layer(f, L, gl, nb, err);
            if (!st)
                st = ffn_layer(f, L, gl, il, nb, pos0 + t0, false, -1, err);
        }
        if (!st && L->ffn == TDM_FFN_MOE)
            st = stream_layer(f, gl, il, n, err);
        if (st)
            tdm_error_wrap(err, "layer %d", il);
    }
    span_view(f, 0);
    return st;
}

/* Hybrid, before a step: slot copies that have landed are published and the
 * device mirror of the residency follows; the pool is woken to spin. */
static tdm_status hybrid_begin(tdm_forward_gpu *f, tdm_error *err)
{
    if (!f->ex)
        return TDM_OK;
    uint64_t v;
    TDM_TRY(tdm_executor_gpu_begin(f->ex, &v, err));
    if (v != f->res_version)
        TDM_TRY(mirror_residency(f, err));
    const int32_t q = tdm_executor_direct_quota(f->ex);
    if (f->reg_base && q != f->quota_host) {
        TDM_TRY(tdm_gpu_upload(f->g, f->hstate + TDM_GPU_HANDOFF_QUOTA, &q, sizeof q, err));
        f->quota_host = q;
    }
    return tdm_gpu_mark(f->g, 0, err);
}

/* After a step of n tokens (a span: batch by batch), with whatever the
 * step queued (the decode graph's logits download): one wait. Hybrid: the
 * step's routing and the hand-off counters are read back in the same wait
 * and go to the executor (statistics, cache policy, the direct share;
 * direct: the step's launches read it). */
static tdm_status step_end(tdm_forward_gpu *f, int32_t n, bool direct, tdm_error *err)
{
    if (!f->ex)
        return tdm_gpu_sync_pausing(f->g, err);
    const size_t k = (size_t)f->hp->n_expert_used, row = (size_t)n * k * sizeof(int32_t);
    const uint32_t *hs = f->hstate_in;
    const bool staged = f->pf.n && n == 1 && direct;
    float ms = 0.0f;
    TDM_TRY(tdm_gpu_mark(f->g, 1, err));
    TDM_TRY(tdm_gpu_download_rows_async(f->g, f->pass_ids, row, f->ids, (size_t)f->S * k * sizeof(int32_t), row,
                                    (size_t)f->hp->n_layer, err));
    TDM_TRY(tdm_gpu_download_async(f->g, f->hstate_in, f->hstate, TDM_GPU_HANDOFF_WORDS * sizeof(uint32_t), err));
    if (staged)
        TDM_TRY(tdm_gpu_download_async(f->g, f->stage_host, f->pf.stage, stage_bytes(f), err));
    TDM_TRY(tdm_gpu_sync_pausing(f->g, err)); /* the pool's threads need the CPU the driver's spin took */
    TDM_TRY(tdm_gpu_elapsed_ms(f->g, 0, 1, &ms, err));
    if (hs[TDM_GPU_HANDOFF_TIMEOUTS] != f->hstate_host[TDM_GPU_HANDOFF_TIMEOUTS]) {
        tdm_error pe = {0};
        tdm_status pst = tdm_pool_check(tdm_executor_pool(f->ex), &pe);
        return tdm_error_set(err, TDM_ERR_CUDA, "forward_gpu: the CPU expert pool did not answer within %.0f s%s%s",
                             f->ho.timeout_s, pst ? ": " : "", pst ? pe.msg : "");
    }
    const uint64_t wait = hs[TDM_GPU_HANDOFF_WAIT_LO] | (uint64_t)hs[TDM_GPU_HANDOFF_WAIT_HI] << 32;
    const uint64_t prev = f->hstate_host[TDM_GPU_HANDOFF_WAIT_LO] |
                          (uint64_t)f->hstate_host[TDM_GPU_HANDOFF_WAIT_HI] << 32;
    memcpy(f->hstate_host, hs, sizeof f->hstate_host);
    for (int32_t t0 = 0; t0 < n; t0 += f->B) /* the step's times go with its first batch */
        TDM_TRY(tdm_executor_gpu_end(f->ex, f->pass_ids + (size_t)t0 * k, (size_t)n * k, n - t0 < f->B ? n - t0 : f->B,
                                 t0 ? 0.0 : ms, t0 ? 0.0 : (double)(wait - prev) * 1e-6, direct ? f->quota_host : -1,
                                 staged ? f->stage_host : NULL, f->pf.n, err));
    return TDM_OK;
}

/* A batch of n tokens; its head when it gives logits or (greedy) the choice
 * after it (head). */
static tdm_status eval_batch(tdm_forward_gpu *f, const int32_t *tokens, int32_t n, int32_t pos0, float *logits,
                             bool all, bool greedy, tdm_error *err)
{
    TDM_TRY(embed(f, tokens, n, pos0, err));
    TDM_TRY(hybrid_begin(f, err));
    f->streaming = f->ex && f->stream_min && n >= f->stream_min;
    tdm_status st = f->streaming ? stream_plan(f, err) : TDM_OK;
    if (!st)
        st = f->streaming ? span_layers(f, n, pos0, err) : layers(f, n, pos0, err);
    if (!st)
        st = logits || greedy ? head(f, n, logits, all, err) : TDM_OK;
    if (f->streaming && f->st_total) {
        /* the copy jobs took job numbers: the GPU's next job must follow them,
         * also after a failure (a merge would otherwise see a larger, stale
         * pool_seq and not wait) */
        const uint32_t seq = atomic_load(&tdm_pool_mailbox(tdm_executor_pool(f->ex))->dev_seq);
        tdm_error e2 = {0};
        const tdm_status su = tdm_gpu_upload(f->g, f->hstate + TDM_GPU_HANDOFF_SEQ, &seq, sizeof seq, st ? &e2 : err);
        st = st ? st : su;
    }
    if (!st && f->streaming) /* layer calls as the executor counts them: per batch of the span */
        tdm_executor_gpu_streamed(f->ex, (int64_t)f->st_moe_layers * ((n + f->B - 1) / f->B), f->st_bytes);
    const bool direct = direct_batch(f, n);
    f->streaming = false;
    return st ? st : step_end(f, n, direct, err);
}

/* The decode step as one CUDA graph, recorded at the first decode and
 * replayed for every later token: nothing in it depends on the token or the
 * position (the embedding row and the position are uploaded to fixed device
 * buffers first; attention, KV store and RoPE read the position from device
 * memory; the hybrid hand-off reads its job number from device state), so
 * replaying costs one launch instead of ~12 per layer and no host work.
 * The graph ends with the greedy choice (a few microseconds): after it the
 * logits (into logits) or, when logits is NULL, only the choice are
 * downloaded. Any failure while recording turns graphs off for this forward
 * and returns false, so the caller runs the step eagerly (nothing was
 * executed). */
static bool decode_graph(tdm_forward_gpu *f, int32_t pos0, float *logits, tdm_status *st, tdm_error *err)
{
    tdm_error e = {0};
    if (!f->graph && tdm_gpu_graph_begin(f->g, &e)) {
        f->graphs = false;
        return false;
    }
    if (!f->graph) {
        if (layers(f, 1, pos0, &e) || head_rows(f, 0, 1, &e) || choose(f, &e) ||
            tdm_gpu_graph_end(f->g, &f->graph, &e)) {
            tdm_gpu_graph_abort(f->g);
            tdm_gpu_graph_free(f->graph);
            f->graph = NULL;
            f->graphs = false;
            return false;
        }
        /* the step's time starts here: the recording's host work (milliseconds)
         * would count against the direct share the tuner is measuring */
        if (f->ex && (*st = tdm_gpu_mark(f->g, 0, err)))
            return true;
    }
    *st = tdm_gpu_graph_launch(f->g, f->graph, err);
    if (!*st) /* waited for by step_end */
        *st = logits ? tdm_gpu_download_async(f->g, logits, f->logits, (size_t)f->hp->n_vocab * sizeof(float), err)
                     : tdm_gpu_download_async(f->g, f->host_next, f->next, sizeof(int32_t), err);
    return true;
}

/* An eval of n tokens that uses the prompt scratch (a batch of more than
 * mm_min tokens, or a streaming one) borrows it from the expert cache when
 * it is not held (loan_slots): the lent slots' experts miss until their
 * copies back land (finish). */
static tdm_status borrow(tdm_forward_gpu *f, int32_t n, tdm_error *err)
{
    if (!f->loan_slots || (n <= f->mm_min && !(f->stream_min && n >= f->stream_min)))
        return TDM_OK;
    void *mem = NULL;
    TDM_TRY(tdm_expert_cache_lend(tdm_executor_cache(f->ex), f->loan_slots, &mem, err));
    /* the slot boundary is 64-byte aligned: the scratch starts at the next SCRATCH_ALIGN */
    const uintptr_t a = ((uintptr_t)mem + SCRATCH_ALIGN - 1) / SCRATCH_ALIGN * SCRATCH_ALIGN;
    place_prompt_scratch(f, (uint8_t *)a);
    return TDM_OK;
}

/* logits NULL and greedy: the choice after the last token lands in host_next. */
static tdm_status eval(tdm_forward_gpu *f, const int32_t *tokens, int32_t n, int32_t pos0, float *logits,
                       bool logits_all, bool greedy, tdm_error *err)
{
    const tdm_hparams *hp = f->hp;
    if (n <= 0 || pos0 < 0 || (int64_t)pos0 + n > f->n_ctx)
        return tdm_error_set(err, TDM_ERR_INVALID,
                             "forward_gpu: %d tokens at position %d do not fit the context of %d", n, pos0, f->n_ctx);
    for (int32_t t = 0; t < n; t++)
        if (tokens[t] < 0 || tokens[t] >= hp->n_vocab)
            return tdm_error_set(err, TDM_ERR_INVALID,
                                 "forward_gpu: token %d (at %d) is outside the vocabulary of %d", tokens[t], t,
                                 hp->n_vocab);
    if (n == 1 && (logits || greedy) && f->graphs && !f->hook) {
        TDM_TRY(embed(f, tokens, 1, pos0, err));
        TDM_TRY(hybrid_begin(f, err));
        tdm_status st = TDM_OK;
        if (decode_graph(f, pos0, logits, &st, err))
            return st ? st : step_end(f, 1, direct_batch(f, 1), err);
        TDM_TRY(tdm_gpu_sync(f->g, err)); /* the step runs eagerly below: its embed rewrites hx */
    }
    TDM_TRY(borrow(f, n, err));
    for (int32_t b0 = 0, nb; b0 < n; b0 += nb) {
        /* a streaming prompt: spans of up to S tokens; otherwise batches of B */
        const int32_t left = n - b0, cap = f->ex && f->stream_min && left >= f->stream_min ? f->S : f->B;
        nb = left < cap ? left : cap;
        const bool last = b0 + nb == n;
        float *dst = !logits ? NULL : logits_all ? logits + (size_t)b0 * hp->n_vocab : last ? logits : NULL;
        TDM_TRY(eval_batch(f, tokens + b0, nb, pos0 + b0, dst, logits_all, greedy && last, err));
    }
    return TDM_OK;
}

/* After an eval: a failed step's queued copies finish before the caller (or
 * the next eval) touches their memory; then a borrowed prompt scratch goes
 * back: its slots' experts are copied in again (every step ended
 * synchronised, so nothing reads the scratch any more), DMAs the eval does
 * not wait for; they are published once landed (hybrid_begin), missing
 * until then. */
static tdm_status finish(tdm_forward_gpu *f, tdm_status st, tdm_error *err)
{
    if (st) {
        tdm_error e = {0};
        (void)tdm_gpu_sync(f->g, &e);
    }
    if (!f->loan_slots || !tdm_expert_cache_lent(tdm_executor_cache(f->ex)))
        return st;
    place_prompt_scratch(f, NULL);
    tdm_error e2 = {0};
    tdm_expert_cache *c = tdm_executor_cache(f->ex);
    const tdm_status sr = tdm_expert_cache_reclaim(c, st ? &e2 : err);
    return st ? st : sr;
}

tdm_status tdm_forward_gpu_eval(tdm_forward_gpu *f, const int32_t *tokens, int32_t n, int32_t pos0, float *logits,
                                bool logits_all, tdm_error *err)
{
    return finish(f, eval(f, tokens, n, pos0, logits, logits_all, false, err), err);
}

tdm_status tdm_forward_gpu_eval_greedy(tdm_forward_gpu *f, const int32_t *tokens, int32_t n, int32_t pos0,
                                       int32_t *next, tdm_error *err)
{
    TDM_TRY(finish(f, eval(f, tokens, n, pos0, NULL, false, true, err), err));
    *next = *f->host_next;
    return TDM_OK;
}

int32_t tdm_forward_gpu_loan_slots(const tdm_forward_gpu *f) { return f->loan_slots; }
size_t tdm_forward_gpu_prompt_scratch_bytes(const tdm_forward_gpu *f) { return prompt_scratch_bytes(f); }
