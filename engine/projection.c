/* projection: byte accounting of a MoE model and the decode-throughput model.
 * The formulas are documented in docs/PROJECTION.md; keep the two in step. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "projection.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

/* ------------------------------------------------------------------ */
/* byte accounting                                                     */
/* ------------------------------------------------------------------ */

typedef struct layer_acc {
    uint64_t gate, up, down, gate_up; /* bytes of ONE expert of each expert tensor */
} layer_acc;

/* What the accounting needs besides the tensors. */
typedef struct acc_hp {
    int32_t n_block;    /* block_count: trunk + MTP blocks */
    int32_t n_nextn;    /* MTP blocks at the end */
    int32_t n_expert, k;
    int64_t ssm_inner;  /* H_v x d_v (0: no DeltaNet) */
    int64_t ssm_state;  /* d_v */
} acc_hp;

typedef struct acc {
    tdm_proj_model *m;
    acc_hp hp;
    layer_acc *layers;  /* [hp.n_block - hp.n_nextn] */
    int32_t n_rec;      /* DeltaNet layers seen (ssm_conv1d tensors in the trunk) */
    bool have_output;
} acc;

static bool has_prefix(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }

static tdm_status acc_init(acc *a, tdm_proj_model *m, const acc_hp *hp, tdm_error *err)
{
    memset(a, 0, sizeof *a);
    a->m = m;
    a->hp = *hp;
    if (hp->n_block < 1 || hp->n_nextn < 0 || hp->n_nextn >= hp->n_block)
        return tdm_error_set(err, TDM_ERR_FORMAT, "block_count %d with nextn_predict_layers %d",
                             hp->n_block, hp->n_nextn);
    if (hp->n_expert < 1 || hp->k < 1 || hp->k > hp->n_expert)
        return tdm_error_set(err, TDM_ERR_FORMAT, "expert_used_count %d of expert_count %d",
                             hp->k, hp->n_expert);
    m->n_layer = hp->n_block - hp->n_nextn;
    m->n_expert = hp->n_expert;
    m->n_expert_used = hp->k;
    a->layers = calloc((size_t)m->n_layer, sizeof *a->layers);
    if (!a->layers)
        return tdm_error_set(err, TDM_ERR_OOM, "projection: %d layers", m->n_layer);
    return TDM_OK;
}

static tdm_status tensor_bytes(const char *name, uint32_t type, uint32_t n_dims, const int64_t ne[4],
                               uint64_t *out, tdm_error *err)
{
    const tdm_qtype_info *qi = tdm_qtype_get(type);
    if (!qi || qi->block == 0)
        return tdm_error_set(err, TDM_ERR_FORMAT, "tensor %s: unknown type %u", name, type);
    for (uint32_t d = 0; d < 4; d++)
        if (ne[d] < 1 || (d >= n_dims && ne[d] != 1))
            return tdm_error_set(err, TDM_ERR_FORMAT, "tensor %s: ne[%u] = %lld", name, d,
                                 (long long)ne[d]);
    if (ne[0] % qi->block)
        return tdm_error_set(err, TDM_ERR_FORMAT, "tensor %s: ne[0] %lld not a multiple of %s block %u",
                             name, (long long)ne[0], qi->name, qi->block);
    *out = (uint64_t)(ne[0] / qi->block) * qi->type_size * (uint64_t)ne[1] * (uint64_t)ne[2] *
           (uint64_t)ne[3];
    return TDM_OK;
}

/* One expert tensor of trunk layer il. */
static tdm_status acc_expert(acc *a, int32_t il, const char *name, const char *rest,
                             uint32_t n_dims, const int64_t ne[4], uint64_t bytes, tdm_error *err)
{
    if (n_dims != 3 || ne[2] != a->hp.n_expert)
        return tdm_error_set(err, TDM_ERR_FORMAT, "tensor %s: %u dims, ne[2] = %lld, expected 3 dims "
                             "with ne[2] = expert_count %d", name, n_dims, (long long)ne[2],
                             a->hp.n_expert);
    uint64_t one = bytes / (uint64_t)ne[2];
    layer_acc *L = &a->layers[il];
    uint64_t *slot = has_prefix(rest, "ffn_gate_up_exps.") ? &L->gate_up
                     : has_prefix(rest, "ffn_gate_exps.")  ? &L->gate
                     : has_prefix(rest, "ffn_up_exps.")    ? &L->up
                                                           : &L->down;
    if (*slot)
        return tdm_error_set(err, TDM_ERR_FORMAT, "tensor %s: layer %d has two of it", name, il);
    *slot = one;
    return TDM_OK;
}

static bool is_expert_name(const char *rest)
{
    return has_prefix(rest, "ffn_gate_exps.") || has_prefix(rest, "ffn_up_exps.") ||
           has_prefix(rest, "ffn_down_exps.") || has_prefix(rest, "ffn_gate_up_exps.");
}

/* A tensor of block il (trunk or MTP). */
static tdm_status acc_block(acc *a, int32_t il, const char *name, const char *rest, uint32_t n_dims,
                            const int64_t ne[4], uint64_t bytes, tdm_error *err)
{
    tdm_proj_model *m = a->m;
    if (il >= m->n_layer) {
        m->mtp_bytes += bytes;
        return TDM_OK;
    }
    if (is_expert_name(rest))
        return acc_expert(a, il, name, rest, n_dims, ne, bytes, err);
    if (strstr(rest, "_shexp"))
        m->shexp_bytes += bytes;
    else
        m->attn_bytes += bytes;
    /* f16 K and V rows per context token; V as wide as attn_v's output. */
    if (strcmp(rest, "attn_k.weight") == 0 || strcmp(rest, "attn_v.weight") == 0)
        m->kv_bytes_per_ctx += (uint64_t)ne[1] * 2;
    if (strcmp(rest, "ssm_conv1d.weight") == 0) {
        /* conv window (K-1 previous inputs) + the d_k x d_v state of every value head */
        m->state_bytes += (uint64_t)(ne[0] - 1) * (uint64_t)ne[1] * 4;
        a->n_rec++;
    }
    return TDM_OK;
}

static tdm_status acc_tensor(acc *a, const char *name, uint32_t type, uint32_t n_dims,
                             const int64_t ne[4], tdm_error *err)
{
    uint64_t bytes = 0;
    tdm_status st = tensor_bytes(name, type, n_dims, ne, &bytes, err);
    if (st)
        return st;
    tdm_proj_model *m = a->m;
    m->tensor_bytes += bytes;
    if (has_prefix(name, "blk.")) {
        char *end;
        errno = 0;
        long il = strtol(name + 4, &end, 10);
        if (end == name + 4 || *end != '.' || errno || il < 0 || il >= a->hp.n_block)
            return tdm_error_set(err, TDM_ERR_FORMAT, "tensor %s: block index not in 0..%d", name,
                                 a->hp.n_block - 1);
        return acc_block(a, (int32_t)il, name, end + 1, n_dims, ne, bytes, err);
    }
    if (strcmp(name, "token_embd.weight") == 0) {
        m->embd_bytes = bytes;
        m->embd_row_bytes = bytes / (uint64_t)ne[1];
    } else if (strcmp(name, "output.weight") == 0) {
        m->head_bytes += bytes;
        a->have_output = true;
    } else if (strcmp(name, "output_norm.weight") == 0) {
        m->head_bytes += bytes;
    } else {
        m->attn_bytes += bytes; /* global extras (rope factors, ...) are read by the GPU */
    }
    return TDM_OK;
}

static tdm_status acc_finish(acc *a, tdm_error *err)
{
    tdm_proj_model *m = a->m;
    tdm_status st = TDM_OK;
    if (!a->have_output) { /* tied: the head is the embedding table, kept in VRAM */
        m->output_tied = true;
        m->head_bytes += m->embd_bytes;
    }
    if (a->n_rec > 0) {
        if (a->hp.ssm_inner <= 0 || a->hp.ssm_state <= 0) {
            st = tdm_error_set(err, TDM_ERR_FORMAT, "DeltaNet layers but ssm.inner_size %lld / "
                               "ssm.state_size %lld", (long long)a->hp.ssm_inner,
                               (long long)a->hp.ssm_state);
            goto out;
        }
        m->state_bytes += (uint64_t)a->n_rec * (uint64_t)a->hp.ssm_inner *
                          (uint64_t)a->hp.ssm_state * 4;
    }
    for (int32_t il = 0; il < m->n_layer; il++) {
        const layer_acc *L = &a->layers[il];
        if (!L->gate && !L->up && !L->down && !L->gate_up)
            continue; /* dense layer: its FFN went to attn_bytes */
        bool split = L->gate && L->up && !L->gate_up;
        bool fused = L->gate_up && !L->gate && !L->up;
        if (!L->down || !(split || fused)) {
            st = tdm_error_set(err, TDM_ERR_FORMAT, "blk.%d: incomplete expert tensors (need "
                               "ffn_gate_exps + ffn_up_exps or ffn_gate_up_exps, and ffn_down_exps)",
                               il);
            goto out;
        }
        uint64_t e = L->gate + L->up + L->gate_up + L->down;
        m->n_moe_layer++;
        m->active_expert_bytes += (uint64_t)m->n_expert_used * e;
        m->total_expert_bytes += (uint64_t)m->n_expert * e;
        if (e > m->slot_bytes)
            m->slot_bytes = e;
    }
    if (m->n_moe_layer == 0)
        st = tdm_error_set(err, TDM_ERR_UNSUPPORTED, "no routed expert tensors (blk.N.ffn_*_exps): "
                           "not a MoE model");
out:
    free(a->layers);
    a->layers = NULL;
    return st;
}

/* ---- from a GGUF ---- */

static tdm_status gguf_key_i64(const tdm_gguf *g, const char *arch, const char *key, bool required,
                               int64_t *out, tdm_error *err)
{
    char full[128];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    *out = 0;
    if (!required && tdm_gguf_find_key(g, full) < 0)
        return TDM_OK;
    return tdm_gguf_get_i64(g, full, out, err);
}

static tdm_status read_hparams(const tdm_gguf *g, tdm_proj_model *m, acc_hp *hp, tdm_error *err)
{
    const char *s;
    size_t len;
    tdm_status st = tdm_gguf_get_str(g, "general.architecture", &s, &len, err);
    if (st)
        return st;
    if (len == 0 || len >= sizeof m->arch)
        return tdm_error_set(err, TDM_ERR_FORMAT, "general.architecture: length %zu", len);
    memcpy(m->arch, s, len);
    m->arch[len] = '\0';
    int64_t v[6];
    static const char *const keys[6] = {"block_count", "expert_count", "expert_used_count",
                                        "nextn_predict_layers", "ssm.inner_size", "ssm.state_size"};
    for (int i = 0; i < 6; i++) {
        if ((st = gguf_key_i64(g, m->arch, keys[i], i < 3, &v[i], err)))
            return st;
        if (v[i] < 0 || v[i] > (1 << 24))
            return tdm_error_set(err, TDM_ERR_FORMAT, "%s.%s = %lld out of range", m->arch, keys[i],
                                 (long long)v[i]);
    }
    *hp = (acc_hp){.n_block = (int32_t)v[0], .n_expert = (int32_t)v[1], .k = (int32_t)v[2],
                   .n_nextn = (int32_t)v[3], .ssm_inner = v[4], .ssm_state = v[5]};
    return TDM_OK;
}

tdm_status tdm_proj_model_from_gguf(const tdm_gguf *g, const char *name, tdm_proj_model *out,
                                    tdm_error *err)
{
    if (!g || !out)
        return tdm_error_set(err, TDM_ERR_INVALID, "tdm_proj_model_from_gguf: NULL argument");
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", name ? name : "model");
    acc_hp hp;
    acc a;
    tdm_status st = read_hparams(g, out, &hp, err);
    if (st || (st = acc_init(&a, out, &hp, err)))
        return st;
    for (int64_t i = 0; i < tdm_gguf_tensor_count(g); i++) {
        const tdm_gguf_tensor *t = tdm_gguf_tensor_at(g, i);
        if ((st = acc_tensor(&a, t->name, t->type, t->n_dims, t->ne, err))) {
            free(a.layers);
            return st;
        }
    }
    return acc_finish(&a, err);
}

/* ---- presets: published shapes + llama-quantize's Q4_K_M mix ---- */

bool tdm_proj_use_more_bits(int32_t i, int32_t n)
{
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

typedef struct preset {
    const char *name, *arch, *desc;
    int32_t n_layer, n_nextn;     /* trunk layers, MTP blocks appended by the converter */
    int32_t n_embd, n_vocab;
    int32_t n_head, n_head_kv, head_dim;
    bool gated_q;                 /* attn_q carries [q | gate] per head */
    int32_t full_attn_interval;   /* 0: every layer is full attention */
    int32_t ssm_hk, ssm_hv, ssm_d, ssm_kernel;
    bool ssm_ba;                  /* qwen3next: fused ssm_ba; qwen35moe: ssm_beta + ssm_alpha */
    int32_t n_expert, k, n_ff_exp, n_ff_shexp;
} preset;

static const preset PRESETS[] = {
    {"qwen35-35b-a3b", "qwen35moe", "Qwen3.5-35B-A3B", 40, 1, 2048, 248320, 16, 2, 256, true, 4,
     16, 32, 128, 4, false, 256, 8, 512, 512},
    {"qwen3next-80b-a3b", "qwen3next", "Qwen3-Next-80B-A3B", 48, 0, 2048, 151936, 16, 2, 256, true,
     4, 16, 32, 128, 4, true, 512, 10, 512, 512},
    {"qwen3-30b-a3b", "qwen3moe", "Qwen3-30B-A3B", 48, 0, 2048, 151936, 32, 4, 128, false, 0, 0, 0,
     0, 0, false, 128, 8, 768, 0},
    /* the shipped demo model (models/demo): checks the generator against a real file */
    {"demo", "qwen35moe", "tandem demo model", 8, 1, 256, 8192, 4, 2, 64, true, 4, 2, 4, 64, 4,
     false, 24, 4, 256, 256},
};
#define N_PRESETS ((int)(sizeof PRESETS / sizeof PRESETS[0]))

int tdm_proj_preset_count(void) { return N_PRESETS; }
const char *tdm_proj_preset_name(int i) { return i >= 0 && i < N_PRESETS ? PRESETS[i].name : NULL; }

static tdm_status emit(acc *a, tdm_qtype t, int64_t ne0, int64_t ne1, int64_t ne2, tdm_error *err,
                       const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static tdm_status emit(acc *a, tdm_qtype t, int64_t ne0, int64_t ne1, int64_t ne2, tdm_error *err,
                       const char *fmt, ...)
{
    char name[96];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    int64_t ne[4] = {ne0, ne1, ne2, 1};
    uint32_t nd = ne2 > 1 ? 3 : ne1 > 1 ? 2 : 1;
    return acc_tensor(a, name, t, nd, ne, err);
}

#define EMIT(...)                                   \
    do {                                            \
        if ((st = emit(a, __VA_ARGS__)))            \
            return st;                              \
    } while (0)

/* One block of a preset; i counts blocks including MTP ones (llama-quantize's n
 * is block_count, as the demo file shows). */
static tdm_status preset_block(acc *a, const preset *p, int32_t i, tdm_error *err)
{
    tdm_status st;
    const int32_t n = p->n_layer + p->n_nextn, E = p->n_embd;
    const tdm_qtype more = tdm_proj_use_more_bits(i, n) ? TDM_Q_Q6_K : TDM_Q_Q4_K;
    bool full = p->full_attn_interval == 0 || (i + 1) % p->full_attn_interval == 0 || i >= p->n_layer;
    EMIT(TDM_Q_F32, E, 1, 1, err, "blk.%d.attn_norm.weight", i);
    EMIT(TDM_Q_F32, E, 1, 1, err, p->full_attn_interval ? "blk.%d.post_attention_norm.weight"
                                                        : "blk.%d.ffn_norm.weight", i);
    if (full) {
        int64_t hd = p->head_dim, nq = (int64_t)p->n_head * hd * (p->gated_q ? 2 : 1);
        EMIT(TDM_Q_Q4_K, E, nq, 1, err, "blk.%d.attn_q.weight", i);
        EMIT(TDM_Q_Q4_K, E, p->n_head_kv * hd, 1, err, "blk.%d.attn_k.weight", i);
        EMIT(more, E, p->n_head_kv * hd, 1, err, "blk.%d.attn_v.weight", i);
        EMIT(TDM_Q_Q4_K, p->n_head * hd, E, 1, err, "blk.%d.attn_output.weight", i);
        EMIT(TDM_Q_F32, hd, 1, 1, err, "blk.%d.attn_q_norm.weight", i);
        EMIT(TDM_Q_F32, hd, 1, 1, err, "blk.%d.attn_k_norm.weight", i);
    } else {
        int64_t d = p->ssm_d, vdim = (int64_t)p->ssm_hv * d, conv = 2 * p->ssm_hk * d + vdim;
        EMIT(more, E, conv, 1, err, "blk.%d.attn_qkv.weight", i); /* attn_v-like */
        EMIT(TDM_Q_Q4_K, E, vdim, 1, err, "blk.%d.attn_gate.weight", i);
        if (p->ssm_ba) {
            EMIT(TDM_Q_Q4_K, E, 2 * p->ssm_hv, 1, err, "blk.%d.ssm_ba.weight", i);
        } else {
            EMIT(TDM_Q_Q4_K, E, p->ssm_hv, 1, err, "blk.%d.ssm_beta.weight", i);
            EMIT(TDM_Q_Q4_K, E, p->ssm_hv, 1, err, "blk.%d.ssm_alpha.weight", i);
        }
        EMIT(TDM_Q_F32, p->ssm_kernel, conv, 1, err, "blk.%d.ssm_conv1d.weight", i);
        EMIT(TDM_Q_F32, p->ssm_hv, 1, 1, err, "blk.%d.ssm_dt.bias", i);
        EMIT(TDM_Q_F32, p->ssm_hv, 1, 1, err, "blk.%d.ssm_a", i);
        EMIT(TDM_Q_F32, d, 1, 1, err, "blk.%d.ssm_norm.weight", i);
        EMIT(TDM_Q_Q4_K, vdim, E, 1, err, "blk.%d.ssm_out.weight", i);
    }
    EMIT(TDM_Q_F32, E, p->n_expert, 1, err, "blk.%d.ffn_gate_inp.weight", i);
    EMIT(TDM_Q_Q4_K, E, p->n_ff_exp, p->n_expert, err, "blk.%d.ffn_gate_exps.weight", i);
    EMIT(TDM_Q_Q4_K, E, p->n_ff_exp, p->n_expert, err, "blk.%d.ffn_up_exps.weight", i);
    EMIT(more, p->n_ff_exp, E, p->n_expert, err, "blk.%d.ffn_down_exps.weight", i);
    if (p->n_ff_shexp) {
        EMIT(TDM_Q_F32, E, 1, 1, err, "blk.%d.ffn_gate_inp_shexp.weight", i);
        EMIT(TDM_Q_Q4_K, E, p->n_ff_shexp, 1, err, "blk.%d.ffn_gate_shexp.weight", i);
        EMIT(TDM_Q_Q4_K, E, p->n_ff_shexp, 1, err, "blk.%d.ffn_up_shexp.weight", i);
        EMIT(more, p->n_ff_shexp, E, 1, err, "blk.%d.ffn_down_shexp.weight", i);
    }
    if (i >= p->n_layer) { /* MTP extras */
        EMIT(TDM_Q_Q4_K, 2 * E, E, 1, err, "blk.%d.nextn.eh_proj.weight", i);
        EMIT(TDM_Q_F32, E, 1, 1, err, "blk.%d.nextn.enorm.weight", i);
        EMIT(TDM_Q_F32, E, 1, 1, err, "blk.%d.nextn.hnorm.weight", i);
        EMIT(TDM_Q_F32, E, 1, 1, err, "blk.%d.nextn.shared_head_norm.weight", i);
    }
    return TDM_OK;
}

static tdm_status preset_tensors(acc *a, const preset *p, tdm_error *err)
{
    tdm_status st;
    EMIT(TDM_Q_Q4_K, p->n_embd, p->n_vocab, 1, err, "token_embd.weight");
    EMIT(TDM_Q_Q6_K, p->n_embd, p->n_vocab, 1, err, "output.weight");
    EMIT(TDM_Q_F32, p->n_embd, 1, 1, err, "output_norm.weight");
    for (int32_t i = 0; i < p->n_layer + p->n_nextn; i++)
        if ((st = preset_block(a, p, i, err)))
            return st;
    return TDM_OK;
}
#undef EMIT

tdm_status tdm_proj_model_preset(const char *name, tdm_proj_model *out, tdm_error *err)
{
    const preset *p = NULL;
    for (int i = 0; name && i < N_PRESETS; i++)
        if (strcmp(name, PRESETS[i].name) == 0)
            p = &PRESETS[i];
    if (!p || !out)
        return tdm_error_set(err, TDM_ERR_INVALID, "unknown preset '%s' (known: qwen35-35b-a3b, "
                             "qwen3next-80b-a3b, qwen3-30b-a3b, demo)", name ? name : "(null)");
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", p->name);
    snprintf(out->arch, sizeof out->arch, "%s", p->arch);
    acc_hp hp = {.n_block = p->n_layer + p->n_nextn, .n_nextn = p->n_nextn, .n_expert = p->n_expert,
                 .k = p->k, .ssm_inner = (int64_t)p->ssm_hv * p->ssm_d, .ssm_state = p->ssm_d};
    acc a;
    tdm_status st = acc_init(&a, out, &hp, err);
    if (st)
        return st;
    if ((st = preset_tensors(&a, p, err))) {
        free(a.layers);
        return st;
    }
    return acc_finish(&a, err);
}

uint64_t tdm_proj_dense_bytes(const tdm_proj_model *m)
{
    return m->attn_bytes + m->shexp_bytes + m->head_bytes + m->embd_row_bytes;
}

uint64_t tdm_proj_resident_bytes(const tdm_proj_model *m)
{
    /* head_bytes already holds the embedding table when the output is tied */
    return m->attn_bytes + m->shexp_bytes + m->head_bytes;
}

uint64_t tdm_proj_reserve_bytes(const tdm_proj_model *m, int32_t n_ctx)
{
    /* no prompt scratch: when the budget is short the GPU forward borrows it
     * from the expert arena (forward_gpu.h) */
    return m->kv_bytes_per_ctx * (uint64_t)(n_ctx > 0 ? n_ctx : 0) + m->state_bytes + TDM_PROJ_OVERHEAD_BYTES;
}

/* ------------------------------------------------------------------ */
/* prediction                                                          */
/* ------------------------------------------------------------------ */

void tdm_proj_machine_default(const tdm_proj_model *m, tdm_proj_machine *mc)
{
    *mc = (tdm_proj_machine){.efficiency = TDM_PROJ_DEFAULT_EFFICIENCY,
                             .vram_gbps = TDM_PROJ_DEFAULT_VRAM_GBPS,
                             .vram_efficiency = TDM_PROJ_DEFAULT_VRAM_EFFICIENCY,
                             .reserve_bytes = tdm_proj_reserve_bytes(m, TDM_PROJ_DEFAULT_N_CTX),
                             .decode_ctx = TDM_PROJ_DEFAULT_DECODE_CTX,
                             .latency_us = TDM_PROJ_DEFAULT_LATENCY_US};
}

const char *tdm_proj_bound_name(tdm_proj_bound b)
{
    switch (b) {
    case TDM_PROJ_BOUND_DRAM: return "cpu-dram";
    case TDM_PROJ_BOUND_VRAM: return "gpu-vram";
    case TDM_PROJ_BOUND_LATENCY: return "latency";
    case TDM_PROJ_BOUND_NOFIT: return "no-fit";
    }
    return "?";
}

static tdm_status check_machine(const tdm_proj_machine *mc, tdm_error *err)
{
    if (!(mc->dram_gbps > 0 && mc->dram_gbps < 1e5))
        return tdm_error_set(err, TDM_ERR_INVALID, "DRAM bandwidth %g GB/s", mc->dram_gbps);
    if (!(mc->efficiency > 0 && mc->efficiency <= 1.5))
        return tdm_error_set(err, TDM_ERR_INVALID, "pool efficiency %g (want 0 < F <= 1.5)",
                             mc->efficiency);
    if (!(mc->vram_gbps > 0 && mc->vram_gbps < 1e5))
        return tdm_error_set(err, TDM_ERR_INVALID, "VRAM bandwidth %g GB/s", mc->vram_gbps);
    if (!(mc->vram_efficiency > 0 && mc->vram_efficiency <= 1))
        return tdm_error_set(err, TDM_ERR_INVALID, "VRAM efficiency %g (want 0 < F <= 1)",
                             mc->vram_efficiency);
    if (mc->decode_ctx < 0)
        return tdm_error_set(err, TDM_ERR_INVALID, "decode context %d", mc->decode_ctx);
    if (!(mc->latency_us >= 0 && mc->latency_us < 1e6))
        return tdm_error_set(err, TDM_ERR_INVALID, "per-layer latency %g us", mc->latency_us);
    return TDM_OK;
}

/* Inputs of the per-token time for a given GPU share g of the routed expert bytes. */
typedef struct split {
    double A, d_cpu, d_gpu; /* bytes per token: active experts, host-side and GPU-side non-expert */
    double bc, bg;          /* sustained B/s of the CPU pool and the GPU */
    double lat;             /* s per hand-off */
    int32_t n_moe, k;
} split;

static void eval_split(const split *sp, double g, tdm_proj_point *p)
{
    p->gpu_share = g;
    p->cpu_bytes = sp->d_cpu + (1 - g) * sp->A;
    p->gpu_bytes = sp->d_gpu + g * sp->A;
    /* a layer needs the CPU hand-off unless all k of its experts run on the GPU */
    p->handoffs = sp->n_moe * (1 - pow(g, sp->k));
    p->t_cpu_s = p->cpu_bytes / sp->bc;
    p->t_gpu_s = p->gpu_bytes / sp->bg;
    p->t_latency_s = p->handoffs * sp->lat;
    /* serial: each layer's output needs the pool's misses and the GPU's
     * attention + hits, and the next layer's attention needs that output, so
     * the two sides alternate instead of overlapping (projection.h) */
    p->tok_s = 1 / (p->t_cpu_s + p->t_gpu_s + p->t_latency_s);
    const double t_max = p->t_cpu_s > p->t_gpu_s ? p->t_cpu_s : p->t_gpu_s;
    p->tok_s_overlap = 1 / (t_max + p->t_latency_s);
    p->bound = p->t_latency_s > t_max     ? TDM_PROJ_BOUND_LATENCY
               : p->t_cpu_s >= p->t_gpu_s ? TDM_PROJ_BOUND_DRAM
                                          : TDM_PROJ_BOUND_VRAM;
}

tdm_status tdm_proj_predict(const tdm_proj_model *m, const tdm_proj_hitcurve *h,
                            const tdm_proj_machine *mc, tdm_proj_point *out, tdm_error *err)
{
    if (!m || !h || !mc || !out)
        return tdm_error_set(err, TDM_ERR_INVALID, "tdm_proj_predict: NULL argument");
    if (m->n_moe_layer < 1 || m->slot_bytes == 0)
        return tdm_error_set(err, TDM_ERR_INVALID, "projection: model '%s' has no experts", m->name);
    tdm_status st = check_machine(mc, err);
    if (st)
        return st;
    memset(out, 0, sizeof *out);
    uint64_t need = tdm_proj_resident_bytes(m) + mc->reserve_bytes;
    if (need > mc->vram_bytes) {
        out->bound = TDM_PROJ_BOUND_NOFIT;
        return TDM_OK;
    }
    int64_t all = (int64_t)m->n_moe_layer * m->n_expert;
    out->cache_bytes = mc->vram_bytes - need;
    uint64_t slots = out->cache_bytes / m->slot_bytes;
    out->slots = slots > (uint64_t)all ? all : (int64_t)slots;
    out->cached_fraction = (double)out->slots / (double)all;
    out->hit_rate = out->slots == all ? 1.0 : tdm_proj_hit_rate(h, out->cached_fraction);

    const split sp = {.A = (double)m->active_expert_bytes,
                      .d_cpu = (double)m->embd_row_bytes,
                      /* weights, the KV the token attends to, the recurrent state
                       * every DeltaNet layer reads and writes back */
                      .d_gpu = (double)(m->attn_bytes + m->shexp_bytes + m->head_bytes) +
                               (double)m->kv_bytes_per_ctx * mc->decode_ctx +
                               2.0 * (double)m->state_bytes,
                      .bc = mc->efficiency * mc->dram_gbps * 1e9,
                      .bg = mc->vram_efficiency * mc->vram_gbps * 1e9,
                      .lat = mc->latency_us * 1e-6,
                      .n_moe = m->n_moe_layer,
                      .k = m->n_expert_used};
    /* Every hit runs on the GPU (g = h), unless the pool reads faster than the
     * GPU: then every expert on the CPU (g = 0; their weights are in host RAM
     * too) can be faster. t(g) is linear plus the concave hand-off term, so
     * its minimum over [0, h] is at one of these ends; taking the better one
     * keeps the projection monotone in the cache size. */
    tdm_proj_point all_hits = *out, none = *out;
    eval_split(&sp, out->hit_rate, &all_hits);
    eval_split(&sp, 0, &none);
    *out = none.tok_s > all_hits.tok_s ? none : all_hits;
    out->tok_s_hits_on_gpu = all_hits.tok_s;
    return TDM_OK;
}

/* ------------------------------------------------------------------ */
/* grid, table, JSON                                                   */
/* ------------------------------------------------------------------ */

static const tdm_proj_dram DRAM_PRESETS[] = {
    {"DDR4-3200 dual", 2 * 8 * 3200e6 / 1e9, false},
    {"DDR5-5200 dual", 2 * 8 * 5200e6 / 1e9, false},
    {"DDR5-6000 dual", 2 * 8 * 6000e6 / 1e9, false},
};

int tdm_proj_dram_preset_count(void) { return 3; }
const tdm_proj_dram *tdm_proj_dram_preset(int i) { return i >= 0 && i < 3 ? &DRAM_PRESETS[i] : NULL; }

void tdm_proj_grid_default(const tdm_proj_model *m, tdm_proj_grid *g)
{
    memset(g, 0, sizeof *g);
    for (int i = 0; i < 3; i++)
        g->dram[g->n_dram++] = DRAM_PRESETS[i];
    static const double gib[] = {8, 12, 16, 24};
    for (int i = 0; i < 4; i++)
        g->vram_gib[g->n_vram++] = gib[i];
    tdm_proj_machine_default(m, &g->base);
    g->n_ctx = TDM_PROJ_DEFAULT_N_CTX;
    snprintf(g->efficiency_source, sizeof g->efficiency_source, "default");
}

tdm_status tdm_proj_grid_add_dram(tdm_proj_grid *g, const char *name, double gbps, bool measured,
                                  tdm_error *err)
{
    if (g->n_dram >= TDM_PROJ_GRID_MAX || !(gbps > 0 && gbps < 1e5))
        return tdm_error_set(err, TDM_ERR_INVALID, "DRAM row '%s': %g GB/s (rows %d of %d)", name,
                             gbps, g->n_dram, TDM_PROJ_GRID_MAX);
    tdm_proj_dram *d = &g->dram[g->n_dram++];
    snprintf(d->name, sizeof d->name, "%s", name);
    d->gbps = gbps;
    d->measured = measured;
    d->efficiency = 0;
    return TDM_OK;
}

tdm_status tdm_proj_grid_run(const tdm_proj_model *m, const tdm_proj_hitcurve *h, tdm_proj_grid *g,
                             tdm_error *err)
{
    if (g->n_dram < 1 || g->n_dram > TDM_PROJ_GRID_MAX || g->n_vram < 1 ||
        g->n_vram > TDM_PROJ_GRID_MAX)
        return tdm_error_set(err, TDM_ERR_INVALID, "grid %d x %d (1..%d each)", g->n_dram, g->n_vram,
                             TDM_PROJ_GRID_MAX);
    for (int32_t r = 0; r < g->n_dram; r++)
        for (int32_t c = 0; c < g->n_vram; c++) {
            if (!(g->vram_gib[c] > 0 && g->vram_gib[c] <= 4096))
                return tdm_error_set(err, TDM_ERR_INVALID, "VRAM size %g GiB", g->vram_gib[c]);
            tdm_proj_machine mc = g->base;
            mc.dram_gbps = g->dram[r].gbps;
            if (g->dram[r].efficiency > 0)
                mc.efficiency = g->dram[r].efficiency;
            mc.vram_bytes = (uint64_t)(g->vram_gib[c] * GIB);
            tdm_status st = tdm_proj_predict(m, h, &mc, &g->points[r * g->n_vram + c], err);
            if (st)
                return tdm_error_wrap(err, "%s, %g GiB", g->dram[r].name, g->vram_gib[c]);
        }
    return TDM_OK;
}

static const char *bound_short(tdm_proj_bound b)
{
    static const char *const s[] = {"cpu", "gpu", "lat", "nofit"};
    return s[b];
}

void tdm_proj_grid_print(FILE *f, const tdm_proj_model *m, const tdm_proj_hitcurve *h,
                         const tdm_proj_grid *g)
{
    const double GB = 1e9;
    fprintf(f, "Projected decode tok/s: %s (%s, %d layers, %d experts, k=%d)\n", m->name, m->arch,
            m->n_layer, m->n_expert, m->n_expert_used);
    fprintf(f, "  per token: experts %.3f GB, non-expert %.3f GB (attn %.3f, shared %.3f, head %.3f)\n",
            m->active_expert_bytes / GB, tdm_proj_dense_bytes(m) / GB, m->attn_bytes / GB,
            m->shexp_bytes / GB, m->head_bytes / GB);
    fprintf(f, "  all experts %.2f GB in slots of %.2f MB; VRAM: non-expert %.2f GB + reserve %.2f GB "
            "(KV at %d ctx, state, scratch)\n", m->total_expert_bytes / GB, m->slot_bytes / 1e6,
            tdm_proj_resident_bytes(m) / GB, g->base.reserve_bytes / GB, g->n_ctx);
    fprintf(f, "  KV read at %d tokens %.3f GB + DeltaNet state r/w %.3f GB per token (GPU side)\n",
            g->base.decode_ctx, (double)m->kv_bytes_per_ctx * g->base.decode_ctx / GB,
            2.0 * (double)m->state_bytes / GB);
    fprintf(f, "  pool efficiency %.2f (%s), VRAM %.0f GB/s x %.2f, hand-off %.1f us/layer, hit "
            "curve: %s\n", g->base.efficiency, g->efficiency_source, g->base.vram_gbps,
            g->base.vram_efficiency, g->base.latency_us, h->source);
    fprintf(f, "%-24s %7s |", "DRAM", "GB/s");
    for (int32_t c = 0; c < g->n_vram; c++)
        fprintf(f, " %9.4g GiB |", g->vram_gib[c]);
    fprintf(f, "\n%-24s %7s |", "  cache hit rate", "");
    for (int32_t c = 0; c < g->n_vram; c++) {
        const tdm_proj_point *p = &g->points[c];
        if (p->bound == TDM_PROJ_BOUND_NOFIT)
            fprintf(f, " %13s |", "-");
        else
            fprintf(f, " %5.1f%% %5.1f%%c |", 100 * p->hit_rate, 100 * p->cached_fraction);
    }
    fputc('\n', f);
    for (int32_t r = 0; r < g->n_dram; r++) {
        char label[TDM_PROJ_NAME_MAX + 16];
        if (g->dram[r].efficiency > 0)
            snprintf(label, sizeof label, "%s x%.2f", g->dram[r].name, g->dram[r].efficiency);
        else
            snprintf(label, sizeof label, "%s", g->dram[r].name);
        fprintf(f, "%-24s %7.1f |", label, g->dram[r].gbps);
        for (int32_t c = 0; c < g->n_vram; c++) {
            const tdm_proj_point *p = &g->points[r * g->n_vram + c];
            fprintf(f, " %7.1f %-5s |", p->tok_s, bound_short(p->bound));
        }
        fputc('\n', f);
    }
    fprintf(f, "  (cell: tok/s = 1 / (t_gpu + t_cpu + hand-offs), the sides alternate per layer; and "
            "its largest term: cpu = CPU/DRAM, gpu = GPU/VRAM, lat = hand-off latency; hit row: hit "
            "rate, share of experts cached)\n");
}

static cJSON *model_json(const tdm_proj_model *m)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", m->name);
    cJSON_AddStringToObject(o, "arch", m->arch);
    cJSON_AddNumberToObject(o, "n_layer", m->n_layer);
    cJSON_AddNumberToObject(o, "n_moe_layer", m->n_moe_layer);
    cJSON_AddNumberToObject(o, "n_expert", m->n_expert);
    cJSON_AddNumberToObject(o, "n_expert_used", m->n_expert_used);
    cJSON_AddBoolToObject(o, "output_tied", m->output_tied);
    cJSON *b = cJSON_AddObjectToObject(o, "bytes");
    const struct { const char *k; uint64_t v; } f[] = {
        {"active_expert_per_token", m->active_expert_bytes},
        {"dense_per_token", tdm_proj_dense_bytes(m)},
        {"attn_per_token", m->attn_bytes},
        {"shexp_per_token", m->shexp_bytes},
        {"head_per_token", m->head_bytes},
        {"embd_row_per_token", m->embd_row_bytes},
        {"slot", m->slot_bytes},
        {"total_experts", m->total_expert_bytes},
        {"resident_nonexpert", tdm_proj_resident_bytes(m)},
        {"embd_table", m->embd_bytes},
        {"kv_per_ctx_token", m->kv_bytes_per_ctx},
        {"recurrent_state", m->state_bytes},
        {"mtp", m->mtp_bytes},
        {"tensors", m->tensor_bytes},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        cJSON_AddNumberToObject(b, f[i].k, (double)f[i].v);
    return o;
}

static cJSON *assumptions_json(const tdm_proj_hitcurve *h, const tdm_proj_grid *g)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "efficiency", g->base.efficiency);
    cJSON_AddStringToObject(o, "efficiency_source", g->efficiency_source);
    cJSON_AddNumberToObject(o, "vram_gbps", g->base.vram_gbps);
    cJSON_AddNumberToObject(o, "vram_efficiency", g->base.vram_efficiency);
    cJSON_AddNumberToObject(o, "layer_latency_us", g->base.latency_us);
    cJSON_AddNumberToObject(o, "reserve_bytes", (double)g->base.reserve_bytes);
    cJSON_AddNumberToObject(o, "n_ctx", g->n_ctx);
    cJSON_AddNumberToObject(o, "decode_ctx", g->base.decode_ctx);
    cJSON *hm = cJSON_AddObjectToObject(o, "hit_model");
    cJSON_AddStringToObject(hm, "kind", h->kind == TDM_PROJ_HIT_ZIPF ? "zipf" : "table");
    cJSON_AddStringToObject(hm, "source", h->source);
    if (h->kind == TDM_PROJ_HIT_ZIPF)
        cJSON_AddNumberToObject(hm, "s", h->zipf_s);
    else
        cJSON_AddNumberToObject(hm, "points", h->n);
    return o;
}

static double row_efficiency(const tdm_proj_grid *g, const tdm_proj_dram *d)
{
    return d->efficiency > 0 ? d->efficiency : g->base.efficiency;
}

static cJSON *point_json(const tdm_proj_grid *g, const tdm_proj_dram *d, double gib,
                         const tdm_proj_point *p)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "dram", d->name);
    cJSON_AddNumberToObject(o, "dram_gbps", d->gbps);
    cJSON_AddNumberToObject(o, "efficiency", row_efficiency(g, d));
    cJSON_AddBoolToObject(o, "dram_measured", d->measured);
    cJSON_AddNumberToObject(o, "vram_gib", gib);
    cJSON_AddBoolToObject(o, "fits", p->bound != TDM_PROJ_BOUND_NOFIT);
    cJSON_AddNumberToObject(o, "cache_bytes", (double)p->cache_bytes);
    cJSON_AddNumberToObject(o, "slots", (double)p->slots);
    cJSON_AddNumberToObject(o, "cached_fraction", p->cached_fraction);
    cJSON_AddNumberToObject(o, "hit_rate", p->hit_rate);
    cJSON_AddNumberToObject(o, "gpu_share", p->gpu_share);
    cJSON_AddNumberToObject(o, "cpu_bytes_per_token", p->cpu_bytes);
    cJSON_AddNumberToObject(o, "gpu_bytes_per_token", p->gpu_bytes);
    cJSON_AddNumberToObject(o, "handoffs_per_token", p->handoffs);
    cJSON_AddNumberToObject(o, "t_cpu_ms", p->t_cpu_s * 1e3);
    cJSON_AddNumberToObject(o, "t_gpu_ms", p->t_gpu_s * 1e3);
    cJSON_AddNumberToObject(o, "t_latency_ms", p->t_latency_s * 1e3);
    cJSON_AddNumberToObject(o, "tok_s", p->tok_s);
    cJSON_AddNumberToObject(o, "tok_s_overlap", p->tok_s_overlap);
    cJSON_AddNumberToObject(o, "tok_s_hits_on_gpu", p->tok_s_hits_on_gpu);
    cJSON_AddStringToObject(o, "bound", tdm_proj_bound_name(p->bound));
    cJSON_AddNullToObject(o, "measured_tok_s"); /* filled by the validation run */
    cJSON_AddNullToObject(o, "rel_error");      /* (measured - tok_s) / tok_s */
    return o;
}

char *tdm_proj_json(const tdm_proj_model *m, const tdm_proj_hitcurve *h, const tdm_proj_grid *g)
{
    cJSON *root = cJSON_CreateObject();
    if (!root)
        return NULL;
    cJSON_AddStringToObject(root, "format", "tandem-projection");
    cJSON_AddNumberToObject(root, "version", 1);
    cJSON_AddItemToObject(root, "model", model_json(m));
    cJSON_AddItemToObject(root, "assumptions", assumptions_json(h, g));
    cJSON *dr = cJSON_AddArrayToObject(root, "dram");
    for (int32_t r = 0; r < g->n_dram; r++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", g->dram[r].name);
        cJSON_AddNumberToObject(o, "gbps", g->dram[r].gbps);
        cJSON_AddBoolToObject(o, "measured", g->dram[r].measured);
        cJSON_AddNumberToObject(o, "efficiency", row_efficiency(g, &g->dram[r]));
        cJSON_AddItemToArray(dr, o);
    }
    cJSON *vr = cJSON_AddArrayToObject(root, "vram_gib");
    for (int32_t c = 0; c < g->n_vram; c++)
        cJSON_AddItemToArray(vr, cJSON_CreateNumber(g->vram_gib[c]));
    cJSON *pts = cJSON_AddArrayToObject(root, "points");
    for (int32_t r = 0; r < g->n_dram; r++)
        for (int32_t c = 0; c < g->n_vram; c++)
            cJSON_AddItemToArray(pts, point_json(g, &g->dram[r], g->vram_gib[c],
                                                 &g->points[r * g->n_vram + c]));
    char *s = cJSON_Print(root);
    cJSON_Delete(root);
    return s;
}

tdm_status tdm_proj_json_write(const char *path, const tdm_proj_model *m,
                               const tdm_proj_hitcurve *h, const tdm_proj_grid *g, tdm_error *err)
{
    char *s = tdm_proj_json(m, h, g);
    if (!s)
        return tdm_error_set(err, TDM_ERR_OOM, "projection JSON");
    FILE *f = fopen(path, "w");
    if (!f) {
        free(s);
        return tdm_error_set(err, TDM_ERR_IO, "%s: %s", path, strerror(errno));
    }
    bool ok = fputs(s, f) >= 0 && fputc('\n', f) != EOF;
    ok = (fclose(f) == 0) && ok;
    free(s);
    return ok ? TDM_OK : tdm_error_set(err, TDM_ERR_IO, "%s: write failed", path);
}
