/* forward: the batched CPU forward pass (see forward.h). Layer bodies are in
 * this file; primitive ops in forward_ops.c. */
#include "forward.h"

#include <math.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "experts.h"
#include "kernels.h"

#define NQSLOT 3 /* activation formats cached per input (F32, Q8_0/Q8_1, Q8_K at most) */
#define MAX_DV 1024

/* The current matmul input, quantised lazily once per activation format. */
typedef struct act_slot {
    tdm_qtype vdt;      /* activation format held (valid when used) */
    bool used;
    uint8_t *buf;       /* [max_batch][act_cap] */
} act_slot;

struct tdm_forward {
    const tdm_model *m;
    const tdm_hparams *hp;
    int32_t n_ctx, B, nthr;  /* positions, tokens per batch, threads scratch was sized for */
    int64_t kv_dim;          /* n_head_kv * head_dim */
    int64_t q_out;           /* rows of wq (x2 when gated) */
    int64_t conv_dim, v_dim; /* DeltaNet conv input, H_v * d_v */
    int64_t wide;            /* widest per-token projection */

    /* sequence state */
    float *kcache;           /* [n_attn][n_ctx][kv_dim] */
    float *vcache;           /* [n_attn][n_ctx][kv_dim] */
    float *rec;              /* conv states [n_rec][K-1][conv_dim], then S [n_rec][H_v][d_k][d_v] */
    float *ssm;              /* points into rec */
    size_t rec_floats;

    /* scratch, sized for B tokens */
    float *x;                /* [B][n_embd] residual stream */
    float *xn;               /* [B][n_embd] normed input of the current block */
    float *p1, *p2, *p3;     /* [B][wide] projections */
    float *ao;               /* [B][wide + 2*H_v] attention output; DeltaNet b, a inputs then output */
    float *gb;               /* [2][H_v][B] DeltaNet decay g and beta, head-major */
    float *rl;               /* [B][n_expert] router logits */
    int32_t *ids;            /* [B][k] */
    float *wts;              /* [B][k] */
    tdm_expert_sel *sel;     /* [B * k] */
    float *moe;              /* [B][n_embd] */
    float *scores;           /* [nthr][n_ctx] attention scores */
    float *dnws;             /* [nthr][ws] DeltaNet chunk workspace */
    size_t dnws_floats;
    act_slot act[NQSLOT];
    const float *act_src;    /* input the act slots describe */
    int32_t act_n;
    int64_t act_cols;
    size_t act_cap;          /* bytes per activation row, worst case */
    tdm_experts_scratch *ex;

    tdm_forward_route_fn hook;
    void *hook_user;
    tdm_forward_moe_fn moe_fn;  /* NULL: routed experts on the CPU here */
    void *moe_user;
    float *capture;
    tdm_deltanet_mode dn_mode;
    size_t bytes;
};

static void *xalloc(tdm_forward *f, size_t bytes, bool *fail)
{
    void *p = NULL;
    if (bytes == 0)
        bytes = 64;
    if (posix_memalign(&p, 64, bytes))
        p = NULL;
    if (!p)
        *fail = true;
    f->bytes += bytes;
    return p;
}

void tdm_forward_free(tdm_forward *f)
{
    if (!f)
        return;
    free(f->kcache);
    free(f->vcache);
    free(f->rec);
    free(f->x);
    free(f->xn);
    free(f->p1);
    free(f->p2);
    free(f->p3);
    free(f->ao);
    free(f->gb);
    free(f->rl);
    free(f->ids);
    free(f->wts);
    free(f->sel);
    free(f->moe);
    free(f->scores);
    free(f->dnws);
    for (int i = 0; i < NQSLOT; i++)
        free(f->act[i].buf);
    tdm_experts_scratch_free(f->ex);
    free(f);
}

static int64_t max64(int64_t a, int64_t b)
{
    return a > b ? a : b;
}

static void size_dims(tdm_forward *f)
{
    const tdm_hparams *hp = f->hp;
    f->kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    f->q_out = (int64_t)hp->n_head * hp->head_dim * (hp->attn_gated ? 2 : 1);
    f->conv_dim = tdm_hparams_conv_dim(hp);
    f->v_dim = (int64_t)hp->ssm_n_v_heads * hp->ssm_d_v;
    int64_t w = max64(f->q_out, max64(f->conv_dim, f->v_dim));
    w = max64(w, max64(hp->n_embd, f->kv_dim));
    w = max64(w, max64(2 * (int64_t)hp->ssm_n_v_heads, (int64_t)hp->n_head * hp->head_dim));
    f->wide = max64(w, hp->n_expert);
    /* widest matmul input: n_embd, attention output, DeltaNet output */
    int64_t in = max64(hp->n_embd, max64((int64_t)hp->n_head * hp->head_dim, f->v_dim));
    f->act_cap = (size_t)in * sizeof(float) + 64;
}

tdm_status tdm_forward_new(const tdm_model *m, int32_t n_ctx, int32_t max_batch, tdm_forward **out, tdm_error *err)
{
    *out = NULL;
    const tdm_hparams *hp = tdm_model_hparams(m);
    if (n_ctx <= 0 || max_batch <= 0)
        return tdm_error_set(err, TDM_ERR_INVALID, "forward: n_ctx %d and max_batch %d must be positive", n_ctx,
                             max_batch);
    if (hp->ssm_d_v > MAX_DV || hp->ssm_conv_kernel > 16)
        return tdm_error_set(err, TDM_ERR_UNSUPPORTED, "forward: DeltaNet value head %d > %d or conv kernel %d > 16",
                             hp->ssm_d_v, MAX_DV, hp->ssm_conv_kernel);
    tdm_forward *f = calloc(1, sizeof *f);
    if (!f)
        return tdm_error_set(err, TDM_ERR_OOM, "forward context");
    f->m = m;
    f->hp = hp;
    f->n_ctx = n_ctx;
    f->B = max_batch < n_ctx ? max_batch : n_ctx;
    f->nthr = omp_get_max_threads();
    size_dims(f);
    const size_t B = (size_t)f->B, d = (size_t)hp->n_embd, k = (size_t)hp->n_expert_used;
    const size_t kvsz = (size_t)hp->n_attn_layers * (size_t)n_ctx * (size_t)f->kv_dim * sizeof(float);
    const size_t conv_f = (size_t)(hp->ssm_conv_kernel > 0 ? hp->ssm_conv_kernel - 1 : 0) * (size_t)f->conv_dim;
    const size_t ssm_f = (size_t)hp->ssm_n_v_heads * hp->ssm_d_k * hp->ssm_d_v;
    f->rec_floats = (size_t)hp->n_rec_layers * (conv_f + ssm_f);
    f->dnws_floats = hp->n_rec_layers ? tdm_op_deltanet_ws_floats(hp->ssm_d_k, hp->ssm_d_v) : 0;
    bool fail = false;
    f->kcache = xalloc(f, kvsz, &fail);
    f->vcache = xalloc(f, kvsz, &fail);
    f->rec = xalloc(f, f->rec_floats * sizeof(float), &fail);
    f->x = xalloc(f, B * d * sizeof(float), &fail);
    f->xn = xalloc(f, B * d * sizeof(float), &fail);
    f->p1 = xalloc(f, B * (size_t)f->wide * sizeof(float), &fail);
    f->p2 = xalloc(f, B * (size_t)f->wide * sizeof(float), &fail);
    f->p3 = xalloc(f, B * (size_t)f->wide * sizeof(float), &fail);
    f->ao = xalloc(f, B * ((size_t)f->wide + 2 * (size_t)hp->ssm_n_v_heads) * sizeof(float), &fail);
    f->gb = xalloc(f, 2 * B * (size_t)(hp->ssm_n_v_heads + 1) * sizeof(float), &fail);
    f->rl = xalloc(f, B * (size_t)hp->n_expert * sizeof(float), &fail);
    f->ids = xalloc(f, B * k * sizeof(int32_t), &fail);
    f->wts = xalloc(f, B * k * sizeof(float), &fail);
    f->sel = xalloc(f, B * k * sizeof(tdm_expert_sel), &fail);
    f->moe = xalloc(f, B * d * sizeof(float), &fail);
    f->scores = xalloc(f, (size_t)f->nthr * (size_t)n_ctx * sizeof(float), &fail);
    f->dnws = xalloc(f, (size_t)f->nthr * f->dnws_floats * sizeof(float), &fail);
    for (int i = 0; i < NQSLOT; i++)
        f->act[i].buf = xalloc(f, B * f->act_cap, &fail);
    if (fail) {
        tdm_forward_free(f);
        return tdm_error_set(err, TDM_ERR_OOM, "forward: %zu bytes of state and scratch (n_ctx %d, batch %d)",
                             f->bytes, n_ctx, max_batch);
    }
    f->ssm = f->rec + (size_t)hp->n_rec_layers * conv_f;
    int64_t max_ff = max64(hp->n_ff_exp, max64(hp->n_ff_shexp, hp->n_ff));
    tdm_status st = tdm_experts_scratch_new(hp->n_embd, max_ff, f->B, f->B * hp->n_expert_used, hp->n_expert,
                                            &f->ex, err);
    if (st) {
        tdm_forward_free(f);
        return st;
    }
    f->bytes += tdm_experts_scratch_bytes(f->ex);
    tdm_forward_reset(f);
    *out = f;
    return TDM_OK;
}

size_t tdm_forward_bytes(const tdm_forward *f) { return f->bytes; }
int32_t tdm_forward_n_ctx(const tdm_forward *f) { return f->n_ctx; }

void tdm_forward_reset(tdm_forward *f)
{
    memset(f->rec, 0, f->rec_floats * sizeof(float));
}

size_t tdm_forward_rec_floats(const tdm_forward *f) { return f->rec_floats; }

void tdm_forward_rec_save(const tdm_forward *f, float *dst)
{
    memcpy(dst, f->rec, f->rec_floats * sizeof(float));
}

void tdm_forward_rec_load(tdm_forward *f, const float *src)
{
    memcpy(f->rec, src, f->rec_floats * sizeof(float));
}

void tdm_forward_set_route_hook(tdm_forward *f, tdm_forward_route_fn fn, void *user)
{
    f->hook = fn;
    f->hook_user = user;
}

void tdm_forward_set_moe_backend(tdm_forward *f, tdm_forward_moe_fn fn, void *user)
{
    f->moe_fn = fn;
    f->moe_user = user;
}

void tdm_forward_set_deltanet_mode(tdm_forward *f, tdm_deltanet_mode mode) { f->dn_mode = mode; }
void tdm_forward_set_capture(tdm_forward *f, float *hidden) { f->capture = hidden; }

/* ---- matmul with lazily quantised, shared activations ---- */

static int nthreads(const tdm_forward *f)
{
    int n = omp_get_max_threads();
    return n < f->nthr ? n : f->nthr;
}

/* Threads for a loop of about `work` multiply-adds: tiny loops (decode on
 * small models) run serially, a parallel region costs microseconds. */
static int par(const tdm_forward *f, double work)
{
    return work < 32768.0 ? 1 : nthreads(f);
}

/* Runs body(ctx, i) for i in [0, n) on nth threads, statically or one at a
 * time (dynamic). With one thread it loops here, outside any parallel
 * region: libgomp allocates a team for every region, even of one thread,
 * and these loops run per token. */
static void run_loop(int nth, bool dynamic, int64_t n, void (*body)(void *ctx, int64_t i), void *ctx)
{
    if (nth <= 1) {
        for (int64_t i = 0; i < n; i++)
            body(ctx, i);
    } else if (dynamic) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(nth)
        for (int64_t i = 0; i < n; i++)
            body(ctx, i);
    } else {
#pragma omp parallel for schedule(static) num_threads(nth)
        for (int64_t i = 0; i < n; i++)
            body(ctx, i);
    }
}

/* Declares x [n][cols] as the input of the following matmuls. */
static void act_set(tdm_forward *f, const float *x, int32_t n, int64_t cols)
{
    f->act_src = x;
    f->act_n = n;
    f->act_cols = cols;
    for (int i = 0; i < NQSLOT; i++)
        f->act[i].used = false;
}

typedef struct quant_ctx {
    tdm_qtype wt;
    const float *x; /* [n][cols] */
    uint8_t *buf;   /* [n][rb] */
    size_t rb;
    int64_t cols;
} quant_ctx;

static void quant_row(void *ctx, int64_t t)
{
    const quant_ctx *q = ctx;
    tdm_act_quantize(q->wt, q->x + (size_t)t * q->cols, q->buf + (size_t)t * q->rb, q->cols);
}

/* The current input in w's activation format; *stride = bytes per token. */
static const void *act_get(tdm_forward *f, tdm_qtype wt, size_t *stride)
{
    const tdm_qtype vdt = tdm_qtype_get(wt)->vec_dot_type;
    const size_t rb = tdm_act_row_bytes(wt, f->act_cols);
    if (vdt == TDM_Q_F32 && rb == (size_t)f->act_cols * sizeof(float)) {
        *stride = rb;
        return f->act_src;
    }
    *stride = rb;
    int slot = -1;
    for (int i = 0; i < NQSLOT && slot < 0; i++)
        if (f->act[i].used && f->act[i].vdt == vdt)
            return f->act[i].buf;
    for (int i = 0; i < NQSLOT && slot < 0; i++)
        if (!f->act[i].used)
            slot = i;
    if (slot < 0)
        slot = 0; /* more formats than slots: recompute (never happens with ggml's types) */
    act_slot *a = &f->act[slot];
    quant_ctx q = {wt, f->act_src, a->buf, rb, f->act_cols};
    run_loop(par(f, (double)f->act_n * f->act_cols * 4), false, f->act_n, quant_row, &q);
    a->vdt = vdt;
    a->used = true;
    return a->buf;
}

#define MM_MAX 4

typedef struct mm_ctx {
    const tdm_weight *const *ws;
    float *const *ys;
    const void *const *xq;
    const size_t *xs;
    int64_t first[MM_MAX + 1]; /* first row block of each matrix; first[count]: all */
    int64_t rb;                /* rows per block */
    int32_t n;                 /* tokens */
} mm_ctx;

/* Row block b of the matrices' concatenated row blocks. */
static void mm_block(void *ctx, int64_t b)
{
    const mm_ctx *m = ctx;
    int i = 0;
    while (b >= m->first[i + 1])
        i++;
    const tdm_weight *w = m->ws[i];
    const int64_t r0 = (b - m->first[i]) * m->rb, r1 = r0 + m->rb < w->rows ? r0 + m->rb : w->rows;
    tdm_matmul_rows(w->type, w->cols, w->data, w->row_bytes, r0, r1, m->xq[i], m->xs[i], m->n, m->ys[i],
                    (size_t)w->rows);
}

/* ys[i][t * rows_i + r] = W_i row r . input_t for up to MM_MAX matrices that
 * share the current input, as one parallel loop over row blocks of all of
 * them (one barrier instead of one per matrix). */
static void matmul_multi(tdm_forward *f, int count, const tdm_weight *const *ws, float *const *ys)
{
    const void *xq[MM_MAX];
    size_t xs[MM_MAX];
    int64_t total_rows = 0;
    double work = 0;
    for (int i = 0; i < count; i++) {
        xq[i] = act_get(f, ws[i]->type, &xs[i]);
        total_rows += ws[i]->rows;
        work += (double)ws[i]->rows * ws[i]->cols * f->act_n;
    }
    const int nth = par(f, work);
    int64_t rb = (total_rows + nth * 4 - 1) / (nth * 4);
    if (rb < 4)
        rb = 4;
    mm_ctx m = {.ws = ws, .ys = ys, .xq = xq, .xs = xs, .rb = rb, .n = f->act_n};
    m.first[0] = 0;
    for (int i = 0; i < count; i++)
        m.first[i + 1] = m.first[i] + (ws[i]->rows + rb - 1) / rb;
    run_loop(nth, true, m.first[count], mm_block, &m);
}

static void matmul(tdm_forward *f, const tdm_weight *w, float *y)
{
    matmul_multi(f, 1, &w, &y);
}

/* Rows of d floats: out[t] from in[t] (and a norm's weight w). */
typedef struct rows_ctx {
    float *out;
    const float *in, *w;
    int64_t d;
    float eps;
} rows_ctx;

static void rmsnorm_row(void *ctx, int64_t t)
{
    const rows_ctx *r = ctx;
    tdm_op_rmsnorm(r->in + (size_t)t * r->d, r->w, r->out + (size_t)t * r->d, r->d, r->eps);
}

/* y[t] = RMSNorm(x[t]) * w */
static void rmsnorm_rows(tdm_forward *f, const float *x, const tdm_weight *w, float *y, int32_t n)
{
    rows_ctx r = {y, x, (const float *)w->data, f->hp->n_embd, f->hp->norm_eps};
    run_loop(par(f, (double)n * r.d * 2), false, n, rmsnorm_row, &r);
}

static void add_row(void *ctx, int64_t t)
{
    const rows_ctx *r = ctx;
    float *out = r->out + (size_t)t * r->d;
    const float *in = r->in + (size_t)t * r->d;
    for (int64_t i = 0; i < r->d; i++)
        out[i] += in[i];
}

/* x[t] += y[t] */
static void add_rows(tdm_forward *f, float *x, const float *y, int32_t n)
{
    rows_ctx r = {x, y, NULL, f->hp->n_embd, 0};
    run_loop(par(f, (double)n * r.d), false, n, add_row, &r);
}

static inline float sigmoidf(float v)
{
    return 1.0f / (1.0f + expf(-v));
}

static inline float siluf(float v)
{
    return v / (1.0f + expf(-v));
}

/* ---- attention layer: x += attention(RMSNorm(x)) for n tokens at pos0.. ---- */

typedef struct attn_ctx {
    const tdm_forward *f;
    const tdm_layer *L;
    float *Q, *K, *V;   /* [n][q_out], [n][kv_dim] x 2 */
    float *kc, *vc;     /* the layer's cache [n_ctx][kv_dim] */
    int32_t pos0, H, Hkv, hd, group;
    int64_t qo, kvd, ostride, qh_stride;
    float scale;
} attn_ctx;

/* Token t: q and k heads normalised and rotated, k and v into the cache. */
static void attn_qk_row(void *ctx, int64_t t)
{
    const attn_ctx *a = ctx;
    const tdm_hparams *hp = a->f->hp;
    const int64_t pos = a->pos0 + t;
    for (int32_t h = 0; h < a->H; h++) {
        float *q = a->Q + (size_t)t * a->qo + (size_t)h * a->qh_stride;
        tdm_op_rmsnorm(q, (const float *)a->L->q_norm.data, q, a->hd, hp->norm_eps);
        tdm_op_rope_neox(q, hp->n_rot, pos, hp->rope_base);
    }
    for (int32_t g = 0; g < a->Hkv; g++) {
        float *k = a->K + (size_t)t * a->kvd + (size_t)g * a->hd;
        tdm_op_rmsnorm(k, (const float *)a->L->k_norm.data, k, a->hd, hp->norm_eps);
        tdm_op_rope_neox(k, hp->n_rot, pos, hp->rope_base);
    }
    memcpy(a->kc + (size_t)pos * a->kvd, a->K + (size_t)t * a->kvd, (size_t)a->kvd * sizeof(float));
    memcpy(a->vc + (size_t)pos * a->kvd, a->V + (size_t)t * a->kvd, (size_t)a->kvd * sizeof(float));
}

/* Head h of token t (th = t * H + h) attends over the cache (and is gated). */
static void attn_head(void *ctx, int64_t th)
{
    const attn_ctx *a = ctx;
    const tdm_forward *f = a->f;
    const int32_t t = (int32_t)(th / a->H), h = (int32_t)(th % a->H), g = h / a->group;
    const float *q = a->Q + (size_t)t * a->qo + (size_t)h * a->qh_stride;
    float *o = f->ao + (size_t)t * a->ostride + (size_t)h * a->hd;
    float *sc = f->scores + (size_t)omp_get_thread_num() * f->n_ctx;
    tdm_op_attend(q, a->kc + (size_t)g * a->hd, a->vc + (size_t)g * a->hd, (size_t)a->kvd, a->pos0 + t + 1, a->hd,
                  a->scale, sc, o);
    if (f->hp->attn_gated) {
        const float *gate = q + a->hd;
        for (int32_t i = 0; i < a->hd; i++)
            o[i] *= sigmoidf(gate[i]);
    }
}

static void attention_layer(tdm_forward *f, const tdm_layer *L, int32_t n, int32_t pos0)
{
    const tdm_hparams *hp = f->hp;
    const int32_t H = hp->n_head, Hkv = hp->n_head_kv, hd = hp->head_dim;
    const int64_t kvd = f->kv_dim;
    attn_ctx a = {
        .f = f, .L = L, .Q = f->p1, .K = f->p2, .V = f->p3,
        .kc = f->kcache + (size_t)L->slot * f->n_ctx * kvd, .vc = f->vcache + (size_t)L->slot * f->n_ctx * kvd,
        .pos0 = pos0, .H = H, .Hkv = Hkv, .hd = hd, .group = H / Hkv,
        .qo = f->q_out, .kvd = kvd, .ostride = (int64_t)H * hd,
        .qh_stride = hp->attn_gated ? 2 * hd : hd, /* per-head [q | gate] */
        .scale = (float)(1.0 / sqrt((double)hd)),
    };
    rmsnorm_rows(f, f->x, &L->attn_norm, f->xn, n);
    act_set(f, f->xn, n, hp->n_embd);
    matmul_multi(f, 3, (const tdm_weight *const[]){&L->wq, &L->wk, &L->wv}, (float *const[]){a.Q, a.K, a.V});
    run_loop(par(f, (double)n * (H + Hkv) * hd * 8), false, n, attn_qk_row, &a);
    run_loop(par(f, (double)n * H * (pos0 + n) * hd * 2), true, (int64_t)n * H, attn_head, &a);
    act_set(f, f->ao, n, a.ostride);
    matmul(f, &L->wo, f->p2);
    add_rows(f, f->x, f->p2, n);
}

/* ---- Gated DeltaNet layer ---- */

static inline float softplusf(float v)
{
    return v > 20.0f ? v : log1pf(expf(v));
}

/* Decay g and gate beta per value head, head-major gb[0][j][t], gb[1][j][t]. */
static void deltanet_gates(tdm_forward *f, const tdm_layer *L, int32_t n, const float *bsrc, const float *asrc)
{
    const tdm_hparams *hp = f->hp;
    const int32_t Hv = hp->ssm_n_v_heads, r = Hv / hp->ssm_n_k_heads;
    const bool grouped = hp->arch == TDM_ARCH_QWEN3NEXT;
    const float *dt = L->ssm_dt.data, *A = L->ssm_a.data;
    float *G = f->gb, *Bt = f->gb + (size_t)Hv * n;
    for (int32_t t = 0; t < n; t++) {
        for (int32_t j = 0; j < Hv; j++) {
            float b, a;
            if (grouped) { /* ssm_ba: per key head [b(r) | a(r)], value head j = g*r + i */
                const float *ba = bsrc + (size_t)t * 2 * Hv + (size_t)(j / r) * 2 * r;
                b = ba[j % r];
                a = ba[r + j % r];
            } else {
                b = bsrc[(size_t)t * Hv + j];
                a = asrc[(size_t)t * Hv + j];
            }
            Bt[(size_t)j * n + t] = sigmoidf(b);
            G[(size_t)j * n + t] = A[j] * softplusf(a + dt[j]);
        }
    }
}

typedef struct dn_ctx {
    const tdm_forward *f;
    const tdm_layer *L;
    float *Y;          /* conv output [n][cd] (q | k | v), then the gated norm's [n][vd] */
    const float *Z;    /* [n][vd] */
    float *O;          /* [n][cd] heads' outputs, conv stride */
    float *S0;         /* the layer's states [Hv][dk][dv] */
    int32_t n, Hk, Hv, dk, dv, r;
    int64_t cd, vd;
    float qscale;
    bool chunked;
} dn_ctx;

/* q or k head th % (2 Hk) of token th / (2 Hk): L2-normalised (q also scaled). */
static void dn_l2_head(void *ctx, int64_t th)
{
    const dn_ctx *c = ctx;
    float *v = c->Y + (size_t)(th / (2 * c->Hk)) * c->cd + (size_t)(th % (2 * c->Hk)) * c->dk;
    double ss = 0;
    for (int32_t i = 0; i < c->dk; i++)
        ss += (double)v[i] * v[i];
    const float s = (float)(1.0 / sqrt(ss + 1e-6)) * ((th % (2 * c->Hk)) < c->Hk ? c->qscale : 1.0f);
    for (int32_t i = 0; i < c->dk; i++)
        v[i] *= s;
}

/* Value head j over the n tokens: the recurrence (or its chunked form). */
static void dn_head(void *ctx, int64_t j)
{
    const dn_ctx *c = ctx;
    const tdm_forward *f = c->f;
    const int32_t n = c->n, dk = c->dk, dv = c->dv;
    const int32_t kh = f->hp->vhead_tiled ? (int32_t)(j % c->Hk) : (int32_t)(j / c->r);
    const float *q = c->Y + (size_t)kh * dk, *k = c->Y + (size_t)(c->Hk + kh) * dk;
    const float *v = c->Y + (size_t)2 * c->Hk * dk + (size_t)j * dv;
    const float *g = f->gb + (size_t)j * n, *beta = f->gb + (size_t)c->Hv * n + (size_t)j * n;
    float *S = c->S0 + (size_t)j * dk * dv, *o = c->O + (size_t)j * dv;
    if (c->chunked)
        tdm_op_deltanet_chunked(q, k, (size_t)c->cd, v, (size_t)c->cd, g, beta, n, dk, dv, S, o,
                                f->dnws + (size_t)omp_get_thread_num() * f->dnws_floats);
    else
        tdm_op_deltanet_recurrent(q, k, (size_t)c->cd, v, (size_t)c->cd, g, beta, n, dk, dv, S, o);
}

/* Head j of token t (th = t * Hv + j): gated RMSNorm, packed to [n][vd] in Y. */
static void dn_gated_norm(void *ctx, int64_t th)
{
    const dn_ctx *c = ctx;
    const int64_t t = th / c->Hv, j = th % c->Hv;
    const float *o = c->O + (size_t)t * c->cd + (size_t)j * c->dv;
    const float *z = c->Z + (size_t)t * c->vd + (size_t)j * c->dv;
    float *y = c->Y + (size_t)t * c->vd + (size_t)j * c->dv;
    float tmp[MAX_DV];
    tdm_op_rmsnorm(o, (const float *)c->L->ssm_norm.data, tmp, c->dv, c->f->hp->norm_eps);
    for (int32_t i = 0; i < c->dv; i++)
        y[i] = tmp[i] * siluf(z[i]);
}

static void deltanet_layer(tdm_forward *f, const tdm_layer *L, int32_t n)
{
    const tdm_hparams *hp = f->hp;
    const int32_t Hk = hp->ssm_n_k_heads, Hv = hp->ssm_n_v_heads, dk = hp->ssm_d_k, dv = hp->ssm_d_v;
    const int32_t K = hp->ssm_conv_kernel;
    const int64_t cd = f->conv_dim, vd = f->v_dim;
    float *QKV = f->p1, *Z = f->p2, *Y = f->p3;
    float *bsrc = f->ao, *asrc = f->ao + (size_t)n * Hv;
    float *conv_state = f->rec + (size_t)L->slot * (size_t)(K - 1) * cd;
    rmsnorm_rows(f, f->x, &L->attn_norm, f->xn, n);
    act_set(f, f->xn, n, hp->n_embd);
    if (L->ssm_ba.data)
        matmul_multi(f, 3, (const tdm_weight *const[]){&L->ssm_qkv, &L->ssm_z, &L->ssm_ba},
                     (float *const[]){QKV, Z, bsrc});
    else
        matmul_multi(f, 4, (const tdm_weight *const[]){&L->ssm_qkv, &L->ssm_z, &L->ssm_beta, &L->ssm_alpha},
                     (float *const[]){QKV, Z, bsrc, asrc});
    deltanet_gates(f, L, n, bsrc, asrc);
    tdm_op_conv_silu(QKV, Y, conv_state, (const float *)L->ssm_conv.data, n, cd, K);
    dn_ctx c = {
        .f = f, .L = L, .Y = Y, .Z = Z,
        .O = f->ao + (size_t)2 * n * Hv, /* [n][vd] after the b/a inputs */
        .S0 = f->ssm + (size_t)L->slot * Hv * dk * dv,
        .n = n, .Hk = Hk, .Hv = Hv, .dk = dk, .dv = dv, .r = Hv / Hk, .cd = cd, .vd = vd,
        .qscale = (float)(1.0 / sqrt((double)dk)),
        .chunked = f->dn_mode == TDM_DELTANET_CHUNKED || (f->dn_mode == TDM_DELTANET_AUTO && n > 1),
    };
    run_loop(par(f, (double)n * 2 * Hk * dk * 2), false, (int64_t)n * 2 * Hk, dn_l2_head, &c);
    run_loop(par(f, (double)n * Hv * dk * dv * 3), true, Hv, dn_head, &c);
    /* O rows were written with the conv stride; gated RMSNorm packs them to [n][vd] in Y */
    run_loop(par(f, (double)n * vd * 4), false, (int64_t)n * Hv, dn_gated_norm, &c);
    act_set(f, Y, n, vd);
    matmul(f, &L->ssm_out, f->p2);
    add_rows(f, f->x, f->p2, n);
}

/* ---- FFN: MoE (+ shared expert) or dense ---- */

static tdm_experts_desc expert_desc(const tdm_weight *gate, const tdm_weight *up, const tdm_weight *down)
{
    return (tdm_experts_desc){
        .gate = gate->data, .up = up->data, .down = down->data,
        .gate_type = gate->type, .up_type = up->type, .down_type = down->type,
        .gate_stride = gate->mat_bytes, .up_stride = up->mat_bytes, .down_stride = down->mat_bytes,
        .n_embd = gate->cols, .n_ff = gate->rows, .n_expert = (int32_t)gate->n_mat,
    };
}

/* Token t's top-k experts from its router logits, also as selections. */
static void route_row(void *ctx, int64_t t)
{
    tdm_forward *f = ctx;
    const int32_t k = f->hp->n_expert_used, E = f->hp->n_expert;
    int32_t *ids = f->ids + (size_t)t * k;
    float *wts = f->wts + (size_t)t * k;
    tdm_op_router_topk(f->rl + (size_t)t * E, E, k, f->hp->norm_topk, ids, wts);
    for (int32_t i = 0; i < k; i++)
        f->sel[(size_t)t * k + i] = (tdm_expert_sel){(int32_t)t, ids[i], wts[i]};
}

static tdm_status ffn_layer(tdm_forward *f, const tdm_layer *L, int32_t il, int32_t n, int32_t pos0, tdm_error *err)
{
    const tdm_hparams *hp = f->hp;
    const int32_t k = hp->n_expert_used, E = hp->n_expert;
    tdm_status st;
    rmsnorm_rows(f, f->x, &L->post_norm, f->xn, n);
    act_set(f, f->xn, n, hp->n_embd);
    if (L->ffn == TDM_FFN_DENSE) {
        for (int32_t t = 0; t < n; t++)
            f->sel[t] = (tdm_expert_sel){t, 0, 1.0f};
        tdm_experts_desc dd = expert_desc(&L->ffn_gate, &L->ffn_up, &L->ffn_down);
        st = tdm_experts_run(&dd, f->xn, n, f->sel, n, f->moe, false, f->ex, err);
        if (st)
            return st;
        add_rows(f, f->x, f->moe, n);
        return TDM_OK;
    }
    float *sg = f->p1; /* [n] shared-expert gate logits */
    matmul_multi(f, L->shexp_gate.data ? 2 : 1, (const tdm_weight *const[]){&L->router, &L->shexp_gate},
                 (float *const[]){f->rl, sg});
    run_loop(par(f, (double)n * E * k), false, n, route_row, f);
    if (f->hook)
        for (int32_t t = 0; t < n; t++)
            f->hook(f->hook_user, pos0 + t, il, k, f->ids + (size_t)t * k, f->wts + (size_t)t * k);
    if (f->moe_fn) {
        st = f->moe_fn(f->moe_user, il, f->xn, n, k, f->ids, f->wts, f->moe, err);
    } else {
        tdm_experts_desc de = expert_desc(&L->gate_exps, &L->up_exps, &L->down_exps);
        st = tdm_experts_run(&de, f->xn, n, f->sel, n * k, f->moe, false, f->ex, err);
    }
    if (st)
        return st;
    if (L->gate_shexp.data) {
        for (int32_t t = 0; t < n; t++)
            f->sel[t] = (tdm_expert_sel){t, 0, sigmoidf(sg[t])};
        tdm_experts_desc ds = expert_desc(&L->gate_shexp, &L->up_shexp, &L->down_shexp);
        st = tdm_experts_run(&ds, f->xn, n, f->sel, n, f->moe, true, f->ex, err);
        if (st)
            return st;
    }
    add_rows(f, f->x, f->moe, n);
    return TDM_OK;
}

/* ---- driver ---- */

typedef struct embed_ctx {
    tdm_forward *f;
    const tdm_weight *te;
    const int32_t *tokens;
    atomic_int bad; /* a row that did not dequantise */
} embed_ctx;

static void embed_row(void *ctx, int64_t t)
{
    embed_ctx *e = ctx;
    const int64_t d = e->f->hp->n_embd;
    const uint8_t *row = (const uint8_t *)e->te->data + (size_t)e->tokens[t] * e->te->row_bytes;
    if (tdm_dequant_row(e->te->type, row, e->f->x + (size_t)t * d, d, NULL) != TDM_OK)
        atomic_store_explicit(&e->bad, 1, memory_order_relaxed);
}

static tdm_status embed(tdm_forward *f, const int32_t *tokens, int32_t n, tdm_error *err)
{
    const tdm_weight *te = tdm_model_tok_embd(f->m);
    embed_ctx e = {f, te, tokens, 0};
    run_loop(par(f, (double)n * f->hp->n_embd * 4), false, n, embed_row, &e);
    if (atomic_load(&e.bad))
        return tdm_error_set(err, TDM_ERR_UNSUPPORTED, "cannot dequantise %s of type %s", te->name,
                             tdm_qtype_name(te->type));
    return TDM_OK;
}

static void capture_rows(tdm_forward *f, int32_t entry, const float *src, int32_t n, int32_t b0, int32_t n_total)
{
    if (!f->capture)
        return;
    const size_t d = (size_t)f->hp->n_embd;
    memcpy(f->capture + ((size_t)entry * n_total + b0) * d, src, (size_t)n * d * sizeof(float));
}

/* One batch of n <= B tokens at positions pos0.. (b0: offset inside the eval). */
static tdm_status eval_batch(tdm_forward *f, const int32_t *tokens, int32_t n, int32_t pos0, int32_t b0,
                             int32_t n_total, float *logits, bool logits_all, bool last_batch, tdm_error *err)
{
    const tdm_hparams *hp = f->hp;
    tdm_status st = embed(f, tokens, n, err);
    if (st)
        return st;
    capture_rows(f, 0, f->x, n, b0, n_total);
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const tdm_layer *L = tdm_model_layer(f->m, il);
        if (L->kind == TDM_LAYER_ATTN)
            attention_layer(f, L, n, pos0);
        else
            deltanet_layer(f, L, n);
        st = ffn_layer(f, L, il, n, pos0, err);
        if (st)
            return tdm_error_wrap(err, "layer %d", il);
        if (il + 1 < hp->n_layer)
            capture_rows(f, il + 1, f->x, n, b0, n_total);
    }
    const tdm_weight *on = tdm_model_output_norm(f->m);
    const int64_t d = hp->n_embd;
    if (f->capture) {
        rmsnorm_rows(f, f->x, on, f->xn, n);
        capture_rows(f, hp->n_layer, f->xn, n, b0, n_total);
    }
    if (!logits || (!logits_all && !last_batch))
        return TDM_OK;
    /* output head over every row (logits_all) or only the last one */
    const int32_t r0 = logits_all ? 0 : n - 1;
    rmsnorm_rows(f, f->x + (size_t)r0 * d, on, f->xn + (size_t)r0 * d, n - r0);
    act_set(f, f->xn + (size_t)r0 * d, n - r0, d);
    float *dst = logits_all ? logits + (size_t)b0 * hp->n_vocab : logits;
    matmul(f, tdm_model_output(f->m), dst);
    return TDM_OK;
}

tdm_status tdm_forward_eval(tdm_forward *f, const int32_t *tokens, int32_t n, int32_t pos0, float *logits,
                            bool logits_all, tdm_error *err)
{
    const tdm_hparams *hp = f->hp;
    if (n <= 0 || pos0 < 0 || (int64_t)pos0 + n > f->n_ctx)
        return tdm_error_set(err, TDM_ERR_INVALID, "forward: %d tokens at position %d do not fit the context of %d",
                             n, pos0, f->n_ctx);
    for (int32_t t = 0; t < n; t++)
        if (tokens[t] < 0 || tokens[t] >= hp->n_vocab)
            return tdm_error_set(err, TDM_ERR_INVALID, "forward: token %d (at %d) is outside the vocabulary of %d",
                                 tokens[t], t, hp->n_vocab);
    for (int32_t b0 = 0; b0 < n; b0 += f->B) {
        const int32_t nb = n - b0 < f->B ? n - b0 : f->B;
        tdm_status st = eval_batch(f, tokens + b0, nb, pos0 + b0, b0, n, logits, logits_all, b0 + nb == n, err);
        if (st)
            return st;
    }
    return TDM_OK;
}
