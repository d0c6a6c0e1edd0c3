/* model: hyper-parameters from GGUF metadata and tensor binding (see model.h). */
#include "model.h"

#include <numa.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

struct tdm_model {
    tdm_gguf *g;
    tdm_hparams hp;
    tdm_layer *layers;     /* [n_layer] */
    tdm_mtp mtp;
    bool has_mtp;
    tdm_weight tok_embd;
    tdm_weight output_norm;
    tdm_weight output;
    bool tied;
    void *experts;         /* tdm_model_copy_experts' region (mmap or libnuma), NULL: none */
    size_t experts_bytes;  /* its mapped size */
    bool experts_numa;     /* from numa_alloc_interleaved */
};

static const char *const arch_names[] = {"qwen3moe", "qwen3next", "qwen35moe"};

const char *tdm_arch_name(tdm_arch a)
{
    return (unsigned)a < 3 ? arch_names[a] : "?";
}

/* ---- metadata ---- */

typedef struct meta {
    const tdm_gguf *g;
    const char *arch;
    tdm_error *err;
} meta;

/* Forms "{arch}.key" into full and says whether the file has it; absent keys
 * are an error when required. */
static tdm_status meta_key(const meta *mt, const char *key, bool required, char full[160], bool *present)
{
    snprintf(full, 160, "%s.%s", mt->arch, key);
    *present = tdm_gguf_find_key(mt->g, full) >= 0;
    if (!*present && required)
        return tdm_error_set(mt->err, TDM_ERR_FORMAT, "missing metadata key %s", full);
    return TDM_OK;
}

/* Reads {arch}.key, a u32 (<= 2^30) or, with f32, a positive f32; when
 * absent, def (>= 0) is used or, for def < 0, the key is required. */
static tdm_status meta_num(const meta *mt, const char *key, bool f32, double def, double *out)
{
    char full[160];
    bool present;
    tdm_status st = meta_key(mt, key, def < 0, full, &present);
    if (st || !present) {
        if (!st)
            *out = def;
        return st;
    }
    if (f32) {
        float v;
        if ((st = tdm_gguf_get_f32(mt->g, full, &v, mt->err)))
            return st;
        if (!(v > 0) || v != v)
            return tdm_error_set(mt->err, TDM_ERR_FORMAT, "metadata %s = %g is not positive", full, v);
        *out = v;
    } else {
        uint32_t v;
        if ((st = tdm_gguf_get_u32(mt->g, full, &v, mt->err)))
            return st;
        if (v > (1u << 30))
            return tdm_error_set(mt->err, TDM_ERR_FORMAT, "metadata %s = %u is out of range", full, v);
        *out = v;
    }
    return TDM_OK;
}

static tdm_status meta_u32(const meta *mt, const char *key, int64_t def, int32_t *out)
{
    double v;
    tdm_status st = meta_num(mt, key, false, (double)def, &v);
    if (!st)
        *out = (int32_t)v;
    return st;
}

static tdm_status meta_f32(const meta *mt, const char *key, double def, double *out)
{
    return meta_num(mt, key, true, def, out);
}

static tdm_status read_hparams(tdm_model *m, tdm_error *err)
{
    tdm_hparams *hp = &m->hp;
    const char *s;
    size_t len;
    TDM_TRY(tdm_gguf_get_str(m->g, "general.architecture", &s, &len, err));
    int a = -1;
    for (int i = 0; i < 3; i++)
        if (strlen(arch_names[i]) == len && !memcmp(s, arch_names[i], len))
            a = i;
    if (a < 0)
        return tdm_error_set(err, TDM_ERR_UNSUPPORTED,
                             "general.architecture '%.*s' is not supported (qwen3moe, qwen3next, qwen35moe)",
                             (int)(len > 64 ? 64 : len), s);
    hp->arch = (tdm_arch)a;
    meta mt = {m->g, arch_names[a], err};
    int32_t block_count;
    double eps, base;
    TDM_TRY(meta_u32(&mt, "block_count", -1, &block_count));
    TDM_TRY(meta_u32(&mt, "nextn_predict_layers", 0, &hp->n_nextn));
    TDM_TRY(meta_u32(&mt, "embedding_length", -1, &hp->n_embd));
    TDM_TRY(meta_u32(&mt, "context_length", 4096, &hp->n_ctx_train));
    TDM_TRY(meta_u32(&mt, "attention.head_count", -1, &hp->n_head));
    TDM_TRY(meta_u32(&mt, "attention.head_count_kv", hp->n_head, &hp->n_head_kv));
    TDM_TRY(meta_f32(&mt, "attention.layer_norm_rms_epsilon", 1e-6, &eps));
    TDM_TRY(meta_f32(&mt, "rope.freq_base", 10000.0, &base));
    hp->norm_eps = (float)eps;
    hp->rope_base = base;
    if (hp->n_embd <= 0 || hp->n_head <= 0 || hp->n_head_kv <= 0 || hp->n_head % hp->n_head_kv)
        return tdm_error_set(err, TDM_ERR_FORMAT,
                             "bad attention shape: embedding_length %d, head_count %d, head_count_kv %d",
                             hp->n_embd, hp->n_head, hp->n_head_kv);
    int32_t vlen;
    TDM_TRY(meta_u32(&mt, "attention.key_length", hp->n_embd / hp->n_head, &hp->head_dim));
    TDM_TRY(meta_u32(&mt, "attention.value_length", hp->head_dim, &vlen));
    if (vlen != hp->head_dim || hp->head_dim <= 0 || hp->head_dim % 2)
        return tdm_error_set(err, TDM_ERR_UNSUPPORTED,
                             "%s.attention.key_length %d / value_length %d: need equal, even sizes",
                             mt.arch, hp->head_dim, vlen);
    TDM_TRY(meta_u32(&mt, "rope.dimension_count", hp->head_dim, &hp->n_rot));
    if (hp->n_rot <= 0 || hp->n_rot > hp->head_dim || hp->n_rot % 2)
        return tdm_error_set(err, TDM_ERR_FORMAT, "%s.rope.dimension_count %d invalid for head dim %d",
                             mt.arch, hp->n_rot, hp->head_dim);
    TDM_TRY(meta_u32(&mt, "expert_count", -1, &hp->n_expert));
    TDM_TRY(meta_u32(&mt, "expert_used_count", -1, &hp->n_expert_used));
    TDM_TRY(meta_u32(&mt, "expert_feed_forward_length", -1, &hp->n_ff_exp));
    TDM_TRY(meta_u32(&mt, "expert_shared_feed_forward_length", 0, &hp->n_ff_shexp));
    TDM_TRY(meta_u32(&mt, "feed_forward_length", 0, &hp->n_ff));
    if (hp->n_expert <= 0 || hp->n_expert_used <= 0 || hp->n_expert_used > hp->n_expert ||
        hp->n_expert_used > 64 || hp->n_ff_exp <= 0)
        return tdm_error_set(err, TDM_ERR_FORMAT,
                             "bad MoE shape: expert_count %d, expert_used_count %d, expert_feed_forward_length %d",
                             hp->n_expert, hp->n_expert_used, hp->n_ff_exp);
    hp->norm_topk = true; /* no key for it; llama.cpp and the checkpoints renormalise */
    if (hp->n_nextn < 0 || hp->n_nextn >= block_count)
        return tdm_error_set(err, TDM_ERR_FORMAT, "%s.nextn_predict_layers %d >= block_count %d",
                             mt.arch, hp->n_nextn, block_count);
    hp->n_layer = block_count - hp->n_nextn;
    if (hp->n_layer < 1 || hp->n_layer > 4096)
        return tdm_error_set(err, TDM_ERR_FORMAT, "%s.block_count %d leaves %d trunk layers", mt.arch, block_count,
                             hp->n_layer);
    hp->attn_gated = hp->arch != TDM_ARCH_QWEN3MOE;
    hp->vhead_tiled = hp->arch == TDM_ARCH_QWEN35MOE;
    if (hp->arch == TDM_ARCH_QWEN3MOE)
        return TDM_OK;
    int32_t inner;
    TDM_TRY(meta_u32(&mt, "ssm.conv_kernel", -1, &hp->ssm_conv_kernel));
    TDM_TRY(meta_u32(&mt, "ssm.state_size", -1, &hp->ssm_d_k));
    TDM_TRY(meta_u32(&mt, "ssm.group_count", -1, &hp->ssm_n_k_heads));
    TDM_TRY(meta_u32(&mt, "ssm.time_step_rank", -1, &hp->ssm_n_v_heads));
    TDM_TRY(meta_u32(&mt, "ssm.inner_size", -1, &inner));
    TDM_TRY(meta_u32(&mt, "full_attention_interval", 4, &hp->full_attn_interval));
    if (hp->ssm_conv_kernel < 1 || hp->ssm_conv_kernel > 16 || hp->ssm_d_k <= 0 || hp->ssm_n_k_heads <= 0 ||
        hp->ssm_n_v_heads <= 0 || hp->ssm_n_v_heads % hp->ssm_n_k_heads || inner % hp->ssm_n_v_heads ||
        hp->full_attn_interval <= 0)
        return tdm_error_set(err, TDM_ERR_FORMAT,
                             "bad DeltaNet shape: ssm.conv_kernel %d, state_size %d, group_count %d, "
                             "time_step_rank %d, inner_size %d, full_attention_interval %d",
                             hp->ssm_conv_kernel, hp->ssm_d_k, hp->ssm_n_k_heads, hp->ssm_n_v_heads, inner,
                             hp->full_attn_interval);
    hp->ssm_d_v = inner / hp->ssm_n_v_heads;
    return TDM_OK;
}

/* Kind of trunk layer il: `{arch}.attention.recurrent_layers` when present,
 * else the full_attention_interval rule. */
static tdm_status layer_kind(const tdm_model *m, int32_t il, tdm_layer_kind *kind, tdm_error *err)
{
    const tdm_hparams *hp = &m->hp;
    if (hp->arch == TDM_ARCH_QWEN3MOE) {
        *kind = TDM_LAYER_ATTN;
        return TDM_OK;
    }
    char key[96];
    snprintf(key, sizeof key, "%s.attention.recurrent_layers", arch_names[hp->arch]);
    if (tdm_gguf_find_key(m->g, key) >= 0) {
        tdm_gguf_vtype et;
        uint64_t n;
        int64_t v;
        TDM_TRY(tdm_gguf_get_arr(m->g, key, &et, &n, err));
        if (n < (uint64_t)hp->n_layer)
            return tdm_error_set(err, TDM_ERR_FORMAT, "%s has %llu entries, need %d", key,
                                 (unsigned long long)n, hp->n_layer);
        TDM_TRY(tdm_gguf_arr_int(m->g, key, il, &v, err));
        *kind = v ? TDM_LAYER_DELTANET : TDM_LAYER_ATTN;
        return TDM_OK;
    }
    *kind = ((il + 1) % hp->full_attn_interval) ? TDM_LAYER_DELTANET : TDM_LAYER_ATTN;
    return TDM_OK;
}

/* ---- tensor binding ---- */

typedef enum { OPT = 0, REQ = 1 } need;
typedef enum { MATRIX = 0, VECTOR_F32 = 1 } wkind;

/* Binds tensor `name` as a (stack of) matrices of shape [n_mat][rows][cols].
 * MATRIX: any type the engine computes with; VECTOR_F32: must be F32. */
static tdm_status bind(const tdm_model *m, tdm_weight *w, const char *name, int64_t cols, int64_t rows,
                       int64_t n_mat, need req, wkind kind, tdm_error *err)
{
    memset(w, 0, sizeof *w);
    const tdm_gguf_tensor *t = tdm_gguf_find_tensor(m->g, name);
    if (!t) {
        if (req == REQ)
            return tdm_error_set(err, TDM_ERR_FORMAT, "missing tensor %s", name);
        return TDM_OK;
    }
    if (t->ne[0] != cols || t->ne[1] != rows || t->ne[2] != n_mat || t->ne[3] != 1)
        return tdm_error_set(err, TDM_ERR_FORMAT,
                             "tensor %s has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld, %lld]", name,
                             (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3],
                             (long long)cols, (long long)rows, (long long)n_mat);
    const tdm_qtype_info *qi = tdm_qtype_get(t->type);
    if (!qi || !qi->dequant)
        return tdm_error_set(err, TDM_ERR_UNSUPPORTED, "tensor %s has type %s, which this engine cannot compute with",
                             name, tdm_qtype_name(t->type));
    if (kind == VECTOR_F32 && t->type != TDM_Q_F32)
        return tdm_error_set(err, TDM_ERR_UNSUPPORTED, "tensor %s has type %s, expected F32", name,
                             tdm_qtype_name(t->type));
    if (cols % qi->block)
        return tdm_error_set(err, TDM_ERR_FORMAT, "tensor %s: row of %lld elements is not a multiple of the %s block %u",
                             name, (long long)cols, qi->name, qi->block);
    w->data = t->data;
    w->type = t->type;
    w->cols = cols;
    w->rows = rows;
    w->n_mat = n_mat;
    w->row_bytes = tdm_qtype_row_bytes(t->type, cols);
    w->mat_bytes = w->row_bytes * (size_t)rows;
    w->name = t->name;
    if ((uint64_t)w->mat_bytes * (uint64_t)n_mat > t->nbytes)
        return tdm_error_set(err, TDM_ERR_FORMAT, "tensor %s: payload of %llu bytes is too small", name,
                             (unsigned long long)t->nbytes);
    return TDM_OK;
}

typedef struct binder {
    const tdm_model *m;
    int32_t blk;
    tdm_error *err;
} binder;

static tdm_status bl(const binder *b, tdm_weight *w, const char *suffix, int64_t cols, int64_t rows, int64_t n_mat,
                     need req, wkind kind)
{
    char name[128];
    snprintf(name, sizeof name, "blk.%d.%s", b->blk, suffix);
    return bind(b->m, w, name, cols, rows, n_mat, req, kind, b->err);
}

static tdm_status bind_attention(const binder *b, tdm_layer *L)
{
    const tdm_hparams *hp = &b->m->hp;
    int64_t d = hp->n_embd, hd = hp->head_dim;
    int64_t q_out = (int64_t)hp->n_head * hd * (hp->attn_gated ? 2 : 1);
    int64_t kv_out = (int64_t)hp->n_head_kv * hd;
    TDM_TRY(bl(b, &L->wq, "attn_q.weight", d, q_out, 1, REQ, MATRIX));
    TDM_TRY(bl(b, &L->wk, "attn_k.weight", d, kv_out, 1, REQ, MATRIX));
    TDM_TRY(bl(b, &L->wv, "attn_v.weight", d, kv_out, 1, REQ, MATRIX));
    TDM_TRY(bl(b, &L->wo, "attn_output.weight", (int64_t)hp->n_head * hd, d, 1, REQ, MATRIX));
    TDM_TRY(bl(b, &L->q_norm, "attn_q_norm.weight", hd, 1, 1, REQ, VECTOR_F32));
    TDM_TRY(bl(b, &L->k_norm, "attn_k_norm.weight", hd, 1, 1, REQ, VECTOR_F32));
    return TDM_OK;
}

static tdm_status bind_deltanet(const binder *b, tdm_layer *L)
{
    const tdm_hparams *hp = &b->m->hp;
    int64_t d = hp->n_embd, hv = hp->ssm_n_v_heads;
    int64_t conv_dim = tdm_hparams_conv_dim(hp), vdim = hv * hp->ssm_d_v;
    TDM_TRY(bl(b, &L->ssm_qkv, "attn_qkv.weight", d, conv_dim, 1, REQ, MATRIX));
    TDM_TRY(bl(b, &L->ssm_z, "attn_gate.weight", d, vdim, 1, REQ, MATRIX));
    if (hp->arch == TDM_ARCH_QWEN3NEXT) {
        TDM_TRY(bl(b, &L->ssm_ba, "ssm_ba.weight", d, 2 * hv, 1, REQ, MATRIX));
    } else {
        TDM_TRY(bl(b, &L->ssm_beta, "ssm_beta.weight", d, hv, 1, REQ, MATRIX));
        TDM_TRY(bl(b, &L->ssm_alpha, "ssm_alpha.weight", d, hv, 1, REQ, MATRIX));
    }
    TDM_TRY(bl(b, &L->ssm_conv, "ssm_conv1d.weight", hp->ssm_conv_kernel, conv_dim, 1, REQ, VECTOR_F32));
    TDM_TRY(bl(b, &L->ssm_dt, "ssm_dt.bias", hv, 1, 1, REQ, VECTOR_F32));
    TDM_TRY(bl(b, &L->ssm_a, "ssm_a", hv, 1, 1, REQ, VECTOR_F32));
    TDM_TRY(bl(b, &L->ssm_norm, "ssm_norm.weight", hp->ssm_d_v, 1, 1, REQ, VECTOR_F32));
    TDM_TRY(bl(b, &L->ssm_out, "ssm_out.weight", vdim, d, 1, REQ, MATRIX));
    return TDM_OK;
}

static tdm_status bind_ffn(const binder *b, tdm_layer *L)
{
    const tdm_hparams *hp = &b->m->hp;
    int64_t d = hp->n_embd, E = hp->n_expert, ff = hp->n_ff_exp;
    char name[128];
    snprintf(name, sizeof name, "blk.%d.ffn_gate_inp.weight", b->blk);
    if (!tdm_gguf_find_tensor(b->m->g, name)) {
        snprintf(name, sizeof name, "blk.%d.ffn_gate.weight", b->blk);
        if (!tdm_gguf_find_tensor(b->m->g, name))
            return tdm_error_set(b->err, TDM_ERR_FORMAT, "missing tensor blk.%d.ffn_gate_inp.weight", b->blk);
        if (hp->n_ff <= 0)
            return tdm_error_set(b->err, TDM_ERR_FORMAT, "blk.%d is a dense layer but %s.feed_forward_length is missing",
                                 b->blk, arch_names[hp->arch]);
        L->ffn = TDM_FFN_DENSE;
        TDM_TRY(bl(b, &L->ffn_gate, "ffn_gate.weight", d, hp->n_ff, 1, REQ, MATRIX));
        TDM_TRY(bl(b, &L->ffn_up, "ffn_up.weight", d, hp->n_ff, 1, REQ, MATRIX));
        TDM_TRY(bl(b, &L->ffn_down, "ffn_down.weight", hp->n_ff, d, 1, REQ, MATRIX));
        return TDM_OK;
    }
    L->ffn = TDM_FFN_MOE;
    TDM_TRY(bl(b, &L->router, "ffn_gate_inp.weight", d, E, 1, REQ, MATRIX));
    TDM_TRY(bl(b, &L->gate_exps, "ffn_gate_exps.weight", d, ff, E, REQ, MATRIX));
    TDM_TRY(bl(b, &L->up_exps, "ffn_up_exps.weight", d, ff, E, REQ, MATRIX));
    TDM_TRY(bl(b, &L->down_exps, "ffn_down_exps.weight", ff, d, E, REQ, MATRIX));
    if (hp->n_ff_shexp > 0) {
        need r = hp->arch == TDM_ARCH_QWEN3MOE ? OPT : REQ;
        TDM_TRY(bl(b, &L->gate_shexp, "ffn_gate_shexp.weight", d, hp->n_ff_shexp, 1, r, MATRIX));
        TDM_TRY(bl(b, &L->up_shexp, "ffn_up_shexp.weight", d, hp->n_ff_shexp, 1, r, MATRIX));
        TDM_TRY(bl(b, &L->down_shexp, "ffn_down_shexp.weight", hp->n_ff_shexp, d, 1, r, MATRIX));
        TDM_TRY(bl(b, &L->shexp_gate, "ffn_gate_inp_shexp.weight", d, 1, 1, r, MATRIX));
        if (!L->gate_shexp.data != !L->shexp_gate.data || !L->up_shexp.data != !L->down_shexp.data ||
            !L->gate_shexp.data != !L->up_shexp.data)
            return tdm_error_set(b->err, TDM_ERR_FORMAT, "blk.%d: incomplete shared expert tensors", b->blk);
    }
    return TDM_OK;
}

static tdm_status bind_layer(const binder *b, tdm_layer *L, tdm_layer_kind kind)
{
    const tdm_hparams *hp = &b->m->hp;
    L->kind = kind;
    TDM_TRY(bl(b, &L->attn_norm, "attn_norm.weight", hp->n_embd, 1, 1, REQ, VECTOR_F32));
    TDM_TRY(bl(b, &L->post_norm, hp->arch == TDM_ARCH_QWEN3MOE ? "ffn_norm.weight" : "post_attention_norm.weight",
           hp->n_embd, 1, 1, REQ, VECTOR_F32));
    TDM_TRY(kind == TDM_LAYER_ATTN ? bind_attention(b, L) : bind_deltanet(b, L));
    return bind_ffn(b, L);
}

static tdm_status bind_all(tdm_model *m, tdm_error *err)
{
    tdm_hparams *hp = &m->hp;
    const tdm_gguf_tensor *te = tdm_gguf_find_tensor(m->g, "token_embd.weight");
    if (!te)
        return tdm_error_set(err, TDM_ERR_FORMAT, "missing tensor token_embd.weight");
    if (te->ne[1] <= 0 || te->ne[1] > (1 << 24))
        return tdm_error_set(err, TDM_ERR_FORMAT, "token_embd.weight has %lld rows", (long long)te->ne[1]);
    hp->n_vocab = (int32_t)te->ne[1];
    TDM_TRY(bind(m, &m->tok_embd, "token_embd.weight", hp->n_embd, hp->n_vocab, 1, REQ, MATRIX, err));
    TDM_TRY(bind(m, &m->output_norm, "output_norm.weight", hp->n_embd, 1, 1, REQ, VECTOR_F32, err));
    TDM_TRY(bind(m, &m->output, "output.weight", hp->n_embd, hp->n_vocab, 1, OPT, MATRIX, err));
    m->tied = m->output.data == NULL;
    if (m->tied)
        m->output = m->tok_embd;
    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers)
        return tdm_error_set(err, TDM_ERR_OOM, "layer table");
    for (int32_t il = 0; il < hp->n_layer; il++) {
        tdm_layer_kind kind = TDM_LAYER_ATTN;
        TDM_TRY(layer_kind(m, il, &kind, err));
        binder b = {m, il, err};
        TDM_TRY(bind_layer(&b, &m->layers[il], kind));
        m->layers[il].slot = kind == TDM_LAYER_ATTN ? hp->n_attn_layers++ : hp->n_rec_layers++;
    }
    if (hp->n_nextn > 0) {
        binder b = {m, hp->n_layer, err};
        tdm_mtp *p = &m->mtp;
        TDM_TRY(bl(&b, &p->eh_proj, "nextn.eh_proj.weight", 2 * (int64_t)hp->n_embd, hp->n_embd, 1, REQ, MATRIX));
        TDM_TRY(bl(&b, &p->enorm, "nextn.enorm.weight", hp->n_embd, 1, 1, REQ, VECTOR_F32));
        TDM_TRY(bl(&b, &p->hnorm, "nextn.hnorm.weight", hp->n_embd, 1, 1, REQ, VECTOR_F32));
        TDM_TRY(bl(&b, &p->shared_head_norm, "nextn.shared_head_norm.weight", hp->n_embd, 1, 1, OPT, VECTOR_F32));
        TDM_TRY(bind_layer(&b, &p->layer, TDM_LAYER_ATTN));
        p->layer.slot = -1; /* the MTP has its own KV cache, not the trunk's */
        m->has_mtp = true;
    }
    return TDM_OK;
}

tdm_status tdm_model_from_gguf(tdm_gguf *g, tdm_model **out, tdm_error *err)
{
    *out = NULL;
    tdm_model *m = calloc(1, sizeof *m);
    if (!m) {
        tdm_gguf_free(g);
        return tdm_error_set(err, TDM_ERR_OOM, "model struct");
    }
    m->g = g;
    tdm_status st = read_hparams(m, err);
    if (!st)
        st = bind_all(m, err);
    if (st) {
        tdm_model_free(m);
        return st;
    }
    *out = m;
    return TDM_OK;
}

tdm_status tdm_model_load(const char *path, tdm_model **out, tdm_error *err)
{
    *out = NULL;
    tdm_gguf *g;
    tdm_status st = tdm_gguf_open(path, &g, err);
    if (st)
        return st;
    st = tdm_model_from_gguf(g, out, err);
    if (st)
        tdm_error_wrap(err, "%s", path);
    return st;
}

#define HUGE_PAGE ((size_t)2 << 20)

/* The three expert tensors of layer il that the copy moves (NULL-data ones
 * are skipped by the callers). */
static tdm_weight *expert_weight(tdm_model *m, int32_t il, int i)
{
    tdm_layer *L = &m->layers[il];
    return i == 0 ? &L->gate_exps : i == 1 ? &L->up_exps : &L->down_exps;
}

static size_t copy_span(const tdm_weight *w)
{
    return (w->mat_bytes * (size_t)w->n_mat + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
}

/* MemAvailable of /proc/meminfo in bytes (free memory plus what the kernel
 * can reclaim, page cache included); 0 when unknown. */
static uint64_t mem_available(void)
{
    FILE *fp = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kb = 0;
    while (fp && fgets(line, sizeof line, fp))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            break;
    if (fp)
        fclose(fp);
    return (uint64_t)kb * 1024u;
}

tdm_status tdm_model_copy_experts(tdm_model *m, size_t *bytes, tdm_error *err)
{
    size_t total = 0, copied = 0;
    for (int32_t il = 0; il < m->hp.n_layer; il++)
        for (int i = 0; i < 3; i++) {
            const tdm_weight *w = expert_weight(m, il, i);
            if (m->layers[il].ffn == TDM_FFN_MOE && w->data) {
                total += copy_span(w);
                copied += w->mat_bytes * (size_t)w->n_mat;
            }
        }
    if (bytes)
        *bytes = copied;
    if (m->experts || total == 0)
        return TDM_OK;
    const uint64_t avail = mem_available();
    if (avail && total + ((size_t)1 << 30) > avail) /* anonymous memory is not refused up front: ask first */
        return tdm_error_set(err, TDM_ERR_OOM,
                             "model: a copy of the experts needs %.2f GiB and only %.2f GiB are available "
                             "(read them in place from the mapping instead)",
                             (double)total / (1 << 30), (double)avail / (1 << 30));
    const size_t mapped = total + HUGE_PAGE; /* room to start on a huge-page boundary */
    const bool numa = numa_available() >= 0 && numa_num_configured_nodes() > 1;
    void *region = numa ? numa_alloc_interleaved(mapped)
                        : mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (numa ? region == NULL : region == MAP_FAILED)
        return tdm_error_set(err, TDM_ERR_OOM, "model: no memory for a copy of the experts (%.2f GiB)",
                             (double)total / (1 << 30));
    uint8_t *base = (uint8_t *)(((uintptr_t)region + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
#ifdef MADV_HUGEPAGE
    madvise(base, total, MADV_HUGEPAGE); /* a hint: without THP the copy still works */
#endif
    size_t off = 0;
    for (int32_t il = 0; il < m->hp.n_layer; il++)
        for (int i = 0; i < 3; i++) {
            tdm_weight *w = expert_weight(m, il, i);
            if (m->layers[il].ffn != TDM_FFN_MOE || !w->data)
                continue;
            const size_t n = w->mat_bytes * (size_t)w->n_mat;
#pragma omp parallel for schedule(static)
            for (size_t c = 0; c < (n + HUGE_PAGE - 1) / HUGE_PAGE; c++) {
                const size_t o = c * HUGE_PAGE, len = n - o < HUGE_PAGE ? n - o : HUGE_PAGE;
                memcpy(base + off + o, (const uint8_t *)w->data + o, len);
            }
            w->data = base + off;
            off += copy_span(w);
        }
    m->experts = region;
    m->experts_bytes = mapped;
    m->experts_numa = numa;
    return TDM_OK;
}

bool tdm_model_experts_copied(const tdm_model *m) { return m->experts != NULL; }

const void *tdm_model_experts_memory(const tdm_model *m, size_t *bytes)
{
    *bytes = m->experts ? m->experts_bytes - HUGE_PAGE : 0;
    return m->experts ? (const void *)(((uintptr_t)m->experts + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1))
                      : NULL;
}

void tdm_model_free(tdm_model *m)
{
    if (!m)
        return;
    if (m->experts && m->experts_numa)
        numa_free(m->experts, m->experts_bytes);
    else if (m->experts)
        munmap(m->experts, m->experts_bytes);
    free(m->layers);
    tdm_gguf_free(m->g);
    free(m);
}

const tdm_hparams *tdm_model_hparams(const tdm_model *m) { return &m->hp; }
const tdm_layer *tdm_model_layer(const tdm_model *m, int32_t il) { return &m->layers[il]; }
const tdm_mtp *tdm_model_mtp(const tdm_model *m) { return m->has_mtp ? &m->mtp : NULL; }
const tdm_weight *tdm_model_tok_embd(const tdm_model *m) { return &m->tok_embd; }
const tdm_weight *tdm_model_output_norm(const tdm_model *m) { return &m->output_norm; }
const tdm_weight *tdm_model_output(const tdm_model *m) { return &m->output; }
bool tdm_model_output_tied(const tdm_model *m) { return m->tied; }
const tdm_gguf *tdm_model_gguf(const tdm_model *m) { return m->g; }

int64_t tdm_hparams_conv_dim(const tdm_hparams *hp)
{
    if (hp->arch == TDM_ARCH_QWEN3MOE)
        return 0;
    return 2 * (int64_t)hp->ssm_n_k_heads * hp->ssm_d_k + (int64_t)hp->ssm_n_v_heads * hp->ssm_d_v;
}

void tdm_model_describe(const tdm_model *m, char *buf, size_t cap)
{
    const tdm_hparams *hp = &m->hp;
    const tdm_layer *L0 = &m->layers[0];
    snprintf(buf, cap,
             "%s: %d layers (%d attention, %d DeltaNet)%s, n_embd %d, vocab %d, heads %d/%d x %d (rope %d), "
             "experts %d top-%d x %d%s, expert types %s/%s/%s, output %s%s",
             tdm_arch_name(hp->arch), hp->n_layer, hp->n_attn_layers, hp->n_rec_layers,
             m->has_mtp ? " + MTP" : "", hp->n_embd, hp->n_vocab, hp->n_head, hp->n_head_kv, hp->head_dim,
             hp->n_rot, hp->n_expert, hp->n_expert_used, hp->n_ff_exp, L0->gate_shexp.data ? " + shared" : "",
             tdm_qtype_name(L0->gate_exps.type), tdm_qtype_name(L0->up_exps.type),
             tdm_qtype_name(L0->down_exps.type), tdm_qtype_name(m->output.type), m->tied ? " (tied)" : "");
}
