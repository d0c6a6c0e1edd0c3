/* model: hyper-parameters and tensor binding of a Qwen3-MoE / Qwen3-Next /
 * Qwen3.5-MoE GGUF file (llama.cpp arch strings qwen3moe, qwen3next, qwen35moe).
 *
 * tdm_model_load() maps the file (engine/gguf.h), reads the hyper-parameters
 * from `{arch}.*` metadata, and binds every tensor a layer needs, checking its
 * type and shape; a missing or mis-shaped tensor is TDM_ERR_FORMAT naming it.
 * Every matrix is a view into the mapping (nothing is copied or converted).
 *
 * Conventions of the bound weights (see ../shared/specs/models.md):
 * - A matrix has `rows` output rows of `cols` input elements; row r starts at
 *   data + r * row_bytes (GGUF ne = [cols, rows]). 3-D expert tensors add
 *   `n_mat` matrices, matrix e at data + e * mat_bytes.
 * - Every norm weight is used as y = w * x / rms(x): the GGUF converter already
 *   folded the "+1" of the zero-centred norms of qwen3next/qwen35moe.
 * - ssm_a holds -exp(A_log). In qwen35moe files the value heads are in
 *   "tiled" order: value head j uses key head j % H_k; in qwen3next files
 *   j / (H_v / H_k). hp.vhead_tiled says which.
 * - The MTP block(s) blk.{n_layer}.* are bound into mtp[] and never run by
 *   the main forward.
 *
 * Ownership: the model owns the mapping (and the expert copy below); every
 * pointer it hands out lives until tdm_model_free(). A loaded model is
 * read-only and thread-safe once tdm_model_copy_experts(), if used, is done.
 */
#ifndef TDM_MODEL_H
#define TDM_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf.h"
#include "quant.h"
#include "status.h"

typedef enum tdm_arch {
    TDM_ARCH_QWEN3MOE = 0,
    TDM_ARCH_QWEN3NEXT,
    TDM_ARCH_QWEN35MOE
} tdm_arch;

/* A view of one GGUF tensor as a (stack of) row-major matrices. */
typedef struct tdm_weight {
    const void *data;    /* NULL when the tensor is absent (optional ones) */
    tdm_qtype type;
    int64_t cols;        /* ne[0]: input elements per row */
    int64_t rows;        /* ne[1] */
    int64_t n_mat;       /* ne[2] (experts), 1 for 2-D */
    size_t row_bytes;    /* bytes per row */
    size_t mat_bytes;    /* rows * row_bytes: stride between stacked matrices */
    const char *name;    /* GGUF name (owned by the gguf) */
} tdm_weight;

typedef enum tdm_layer_kind {
    TDM_LAYER_ATTN = 0,   /* (gated) full softmax attention with a KV cache */
    TDM_LAYER_DELTANET    /* Gated DeltaNet with conv + recurrent state */
} tdm_layer_kind;

typedef enum tdm_ffn_kind {
    TDM_FFN_MOE = 0,      /* router + routed experts (+ shared expert when bound) */
    TDM_FFN_DENSE         /* plain SwiGLU MLP (qwen3moe mlp_only layers) */
} tdm_ffn_kind;

typedef struct tdm_layer {
    tdm_layer_kind kind;
    tdm_ffn_kind ffn;
    int32_t slot;            /* index among layers of the same kind (KV / recurrent state slot) */

    tdm_weight attn_norm;    /* [n_embd] */
    tdm_weight post_norm;    /* [n_embd] ffn_norm (qwen3moe) / post_attention_norm */

    /* attention (kind == ATTN) */
    tdm_weight wq;           /* [n_embd] -> n_head*head_dim (x2, per-head [q|gate], when gated) */
    tdm_weight wk, wv;       /* [n_embd] -> n_head_kv*head_dim */
    tdm_weight wo;           /* n_head*head_dim -> [n_embd] */
    tdm_weight q_norm, k_norm; /* [head_dim] */

    /* Gated DeltaNet (kind == DELTANET) */
    tdm_weight ssm_qkv;      /* attn_qkv: [n_embd] -> conv_dim = 2*H_k*d_k + H_v*d_v */
    tdm_weight ssm_z;        /* attn_gate: [n_embd] -> H_v*d_v */
    tdm_weight ssm_ba;       /* qwen3next: [n_embd] -> 2*H_v, grouped per key head [b(r)|a(r)] */
    tdm_weight ssm_beta;     /* qwen35moe: [n_embd] -> H_v */
    tdm_weight ssm_alpha;    /* qwen35moe: [n_embd] -> H_v */
    tdm_weight ssm_conv;     /* [conv_dim][conv_kernel] (F32) */
    tdm_weight ssm_dt;       /* [H_v] (F32) */
    tdm_weight ssm_a;        /* [H_v] = -exp(A_log) (F32) */
    tdm_weight ssm_norm;     /* [d_v] gated-norm weight (plain, no +1) */
    tdm_weight ssm_out;      /* H_v*d_v -> [n_embd] */

    /* MoE */
    tdm_weight router;       /* ffn_gate_inp: [n_embd] -> n_expert */
    tdm_weight gate_exps, up_exps; /* n_expert x ([n_embd] -> n_ff_exp) */
    tdm_weight down_exps;    /* n_expert x (n_ff_exp -> [n_embd]) */
    tdm_weight gate_shexp, up_shexp; /* [n_embd] -> n_ff_shexp (data NULL if none) */
    tdm_weight down_shexp;   /* n_ff_shexp -> [n_embd] */
    tdm_weight shexp_gate;   /* ffn_gate_inp_shexp: [n_embd] -> 1 */

    /* dense FFN (ffn == DENSE) */
    tdm_weight ffn_gate, ffn_up; /* [n_embd] -> n_ff */
    tdm_weight ffn_down;         /* n_ff -> [n_embd] */
} tdm_layer;

/* The MTP block blk.{n_layer}: bound and kept aside (not run by the trunk). */
typedef struct tdm_mtp {
    tdm_weight eh_proj;          /* 2*n_embd -> n_embd ([embedding | hidden]) */
    tdm_weight enorm, hnorm;     /* [n_embd] */
    tdm_weight shared_head_norm; /* [n_embd] (data NULL: use output_norm) */
    tdm_layer layer;             /* a full-attention layer with MoE */
} tdm_mtp;

typedef struct tdm_hparams {
    tdm_arch arch;
    int32_t n_layer;         /* trunk layers (block_count - nextn_predict_layers) */
    int32_t n_nextn;         /* MTP blocks in the file (0 or 1 bound) */
    int32_t n_embd;
    int32_t n_vocab;
    int32_t n_ctx_train;
    float norm_eps;

    int32_t n_head, n_head_kv, head_dim; /* attention; head_dim = key_length = value_length */
    int32_t n_rot;           /* rotated dims per head (partial RoPE) */
    double rope_base;
    bool attn_gated;         /* q projection carries a per-head output gate */

    int32_t n_expert, n_expert_used;
    int32_t n_ff_exp, n_ff_shexp, n_ff; /* expert / shared expert / dense widths */
    bool norm_topk;          /* renormalise the top-k weights (always, as llama.cpp) */

    int32_t ssm_conv_kernel; /* K */
    int32_t ssm_d_k, ssm_d_v;
    int32_t ssm_n_k_heads;   /* H_k */
    int32_t ssm_n_v_heads;   /* H_v */
    bool vhead_tiled;        /* value head j uses key head j % H_k (else j / (H_v/H_k)) */
    int32_t full_attn_interval;

    int32_t n_attn_layers;   /* layers of kind ATTN (KV cache slots) */
    int32_t n_rec_layers;    /* layers of kind DELTANET (recurrent state slots) */
} tdm_hparams;

typedef struct tdm_model tdm_model;

/* Opens path and binds it. On failure *out is NULL. */
tdm_status tdm_model_load(const char *path, tdm_model **out, tdm_error *err);
/* Binds an already open GGUF; the model takes ownership of g (also on failure). */
tdm_status tdm_model_from_gguf(tdm_gguf *g, tdm_model **out, tdm_error *err);
void tdm_model_free(tdm_model *m);

/* Copies the routed experts' weights (gate/up/down_exps of every MoE layer)
 * out of the file mapping into anonymous memory asking for transparent huge
 * pages (2 MiB pages: far fewer TLB misses when the CPU pool reads whole
 * experts), placed on the local NUMA node, or interleaved over the nodes
 * when the machine has several (the pool spans all of them), and rebinds
 * those weights to the copy. Costs their size in RAM on top of the page
 * cache (which the kernel may reclaim). Call before any forward, pool or
 * session uses the model; a second call does nothing. *bytes (may be NULL):
 * the experts' bytes (copied now or before). TDM_ERR_OOM when the memory cannot be had or
 * MemAvailable would not cover it with 1 GiB to spare (the model stays as it was). */
tdm_status tdm_model_copy_experts(tdm_model *m, size_t *bytes, tdm_error *err);
/* Whether tdm_model_copy_experts has moved the routed experts to its copy. */
bool tdm_model_experts_copied(const tdm_model *m);
/* That copy, read-only, for a caller that measures the memory the CPU pool
 * reads (tandem bench's probe): its start (2 MiB aligned) and *bytes; NULL
 * (and *bytes 0) when the experts were not copied. Owned by the model. */
const void *tdm_model_experts_memory(const tdm_model *m, size_t *bytes);

const tdm_hparams *tdm_model_hparams(const tdm_model *m);
/* Layer il in 0..n_layer-1. */
const tdm_layer *tdm_model_layer(const tdm_model *m, int32_t il);
/* The MTP block, or NULL when the file has none. */
const tdm_mtp *tdm_model_mtp(const tdm_model *m);
const tdm_weight *tdm_model_tok_embd(const tdm_model *m);   /* [n_vocab][n_embd] */
const tdm_weight *tdm_model_output_norm(const tdm_model *m); /* [n_embd] */
const tdm_weight *tdm_model_output(const tdm_model *m);     /* [n_vocab][n_embd]; tok_embd if tied */
bool tdm_model_output_tied(const tdm_model *m);
const tdm_gguf *tdm_model_gguf(const tdm_model *m);
const char *tdm_arch_name(tdm_arch a);

/* Dim of the DeltaNet conv input (2*H_k*d_k + H_v*d_v); 0 without DeltaNet. */
int64_t tdm_hparams_conv_dim(const tdm_hparams *hp);

/* One line describing the model (arch, layers, experts, types) into buf. */
void tdm_model_describe(const tdm_model *m, char *buf, size_t cap);

#endif
