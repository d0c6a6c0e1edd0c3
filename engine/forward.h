/* forward: the reference CPU forward pass of qwen3moe / qwen3next / qwen35moe
 * (the engine's CPU-only mode and the oracle every faster path is checked
 * against). Activations are f32 everywhere (KV cache f32); norms accumulate
 * in double. OpenMP: matmuls over rows, attention/DeltaNet over heads.
 *
 * A prompt is processed in batches of up to max_batch positions: all positions
 * of a batch go through each layer together (matmuls multiply each weight row
 * against every token of the batch). DeltaNet uses the chunked form (chunks of
 * 64, models.md §3.6.6) for batches of more than one token and the one-token
 * recurrence (§3.6.5) otherwise.
 *
 * Per layer (x: [n][n_embd] residual stream of the batch):
 *   a = RMSNorm(x; attn_norm)
 *   x += attention(a, pos) | deltanet(a)
 *   m = RMSNorm(x; post_norm)
 *   x += MoE(m) (softmax router -> top-k -> renormalise -> experts; + sigmoid-gated shared expert)
 * logits = output * RMSNorm(x; output_norm)
 *
 * Ownership: a tdm_forward borrows the model and owns the sequence state (KV
 * cache, conv + recurrent state) and all scratch, sized at tdm_forward_new()
 * for n_ctx positions and max_batch tokens per batch; tdm_forward_eval never
 * allocates. One thread at a time calls into a tdm_forward.
 */
#ifndef TDM_FORWARD_H
#define TDM_FORWARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "status.h"

#define TDM_DELTANET_CHUNK 64
#define TDM_FORWARD_BATCH_DEFAULT 512

typedef struct tdm_forward tdm_forward;

/* Same signature as session.h's tdm_route_hook: k expert ids (descending
 * probability) and their renormalised weights, per token position and MoE layer. */
typedef void (*tdm_forward_route_fn)(void *user, int32_t pos, int32_t layer, int32_t k, const int32_t *experts,
                                     const float *weights);

typedef enum tdm_deltanet_mode {
    TDM_DELTANET_AUTO = 0,  /* chunked for n > 1, recurrence for n == 1 */
    TDM_DELTANET_RECURRENT, /* always token by token (the exact definition) */
    TDM_DELTANET_CHUNKED    /* always the chunked form */
} tdm_deltanet_mode;

/* n_ctx: positions the state holds; max_batch: tokens per internal batch
 * (longer evals are split). */
tdm_status tdm_forward_new(const tdm_model *m, int32_t n_ctx, int32_t max_batch, tdm_forward **out, tdm_error *err);
void tdm_forward_free(tdm_forward *f);
/* Bytes of state + scratch. */
size_t tdm_forward_bytes(const tdm_forward *f);
int32_t tdm_forward_n_ctx(const tdm_forward *f);

/* Zeroes the recurrent state (the KV cache needs no clearing: positions >= pos0
 * are always rewritten before they are read). */
void tdm_forward_reset(tdm_forward *f);

/* Evaluates tokens[0..n) at positions pos0..pos0+n-1, continuing the state
 * (which must hold exactly positions 0..pos0-1). logits: [n][n_vocab] when
 * logits_all, else [n_vocab] of the last position; may be NULL (no head).
 * TDM_ERR_INVALID for a token id out of range or pos0 + n > n_ctx. */
tdm_status tdm_forward_eval(tdm_forward *f, const int32_t *tokens, int32_t n, int32_t pos0, float *logits,
                            bool logits_all, tdm_error *err);

/* Recurrent state (conv windows + DeltaNet states of every layer) as one flat
 * float array, for checkpoints. */
size_t tdm_forward_rec_floats(const tdm_forward *f);
void tdm_forward_rec_save(const tdm_forward *f, float *dst);
void tdm_forward_rec_load(tdm_forward *f, const float *src);

void tdm_forward_set_route_hook(tdm_forward *f, tdm_forward_route_fn fn, void *user);

/* MoE backend: computes the routed experts of MoE layer `layer` for n tokens
 * instead of the CPU forward's own tdm_experts_run. x: [n][n_embd] (the
 * post-norm input), ids/weights: [n][k] (descending probability, weights
 * renormalised); out: [n][n_embd] overwritten with the weighted sum of the
 * routed experts (the forward adds the shared expert after it). The hybrid
 * executor (engine/executor.h) plugs in here; NULL restores the CPU path. */
typedef tdm_status (*tdm_forward_moe_fn)(void *user, int32_t layer, const float *x, int32_t n, int32_t k,
                                         const int32_t *ids, const float *weights, float *out, tdm_error *err);
void tdm_forward_set_moe_backend(tdm_forward *f, tdm_forward_moe_fn fn, void *user);
void tdm_forward_set_deltanet_mode(tdm_forward *f, tdm_deltanet_mode mode);
/* Debug capture for the next tdm_forward_eval calls (NULL to stop): hidden is
 * [n_layer+1][n][n_embd] for an eval of n tokens: entry 0 = embedding, entry i
 * = output of layer i-1, the last entry = the final-normed output. */
void tdm_forward_set_capture(tdm_forward *f, float *hidden);

/* ---- per-op functions (single-threaded unless noted; the GPU port mirrors them) ---- */

/* y[i] = w[i] * x[i] / sqrt(mean(x^2) + eps) over n (sum in double); y may be x. */
void tdm_op_rmsnorm(const float *x, const float *w, float *y, int64_t n, float eps);

/* RoPE NeoX (rotate-half) on the first n_rot dims of one head of head_dim at
 * position pos: pairs (i, i + n_rot/2), theta_i = pos * base^(-2i/n_rot);
 * the other dims are untouched. Angles in double. */
void tdm_op_rope_neox(float *x, int32_t n_rot, int64_t pos, double base);

/* Causal softmax attention of one query head against n_kv cached positions:
 * out[hd] = sum_j softmax_j(q . k_j * scale) v_j with k_j = k + j*kv_stride.
 * scores: [n_kv] scratch. */
void tdm_op_attend(const float *q, const float *k, const float *v, size_t kv_stride, int32_t n_kv, int32_t hd,
                   float scale, float *scores, float *out);

/* Causal depthwise conv + SiLU over n tokens of `dim` channels, kernel K:
 * y[t][c] = silu(sum_i w[c][i] * u(t-K+1+i)[c]) with u(<0) taken from
 * state[K-1][dim] (oldest first); state is updated to the last K-1 inputs.
 * u, y: [n][dim] (may not alias). OpenMP over channels. */
void tdm_op_conv_silu(const float *u, float *y, float *state, const float *w, int64_t n, int64_t dim, int32_t K);

/* One Gated DeltaNet head, token by token (models.md §3.6.5). For t < n:
 * S = exp(g[t]) S; d = beta[t] (v_t - S^T k_t); S += k_t d^T; o_t = S^T q_t.
 * q,k: rows of d_k at q + t*qk_stride; v, o: rows of d_v at t*v_stride;
 * S: [d_k][d_v]. q must already be L2-normalised and scaled. */
void tdm_op_deltanet_recurrent(const float *q, const float *k, size_t qk_stride, const float *v, size_t v_stride,
                               const float *g, const float *beta, int64_t n, int32_t d_k, int32_t d_v, float *S,
                               float *o);

/* The same computation in the chunked form (chunks of TDM_DELTANET_CHUNK;
 * §3.6.6). ws: tdm_op_deltanet_ws_floats(d_k, d_v) floats of scratch. */
size_t tdm_op_deltanet_ws_floats(int32_t d_k, int32_t d_v);
void tdm_op_deltanet_chunked(const float *q, const float *k, size_t qk_stride, const float *v, size_t v_stride,
                             const float *g, const float *beta, int64_t n, int32_t d_k, int32_t d_v, float *S,
                             float *o, float *ws);

/* Router: probs = softmax(logits[n_expert]) in double; the k largest (ties to
 * the lower id) in descending order; weights renormalised over the k when
 * norm. */
void tdm_op_router_topk(const float *logits, int32_t n_expert, int32_t k, bool norm, int32_t *ids, float *weights);

#endif
