/* forward_gpu: the whole model resident on one GPU. Mirrors engine/forward.c
 * op for op (same layer structure, same DeltaNet layouts), with every weight
 * uploaded in its file format and every activation in device memory:
 *
 *   a = RMSNorm(x)                          tdm_gpu_rmsnorm
 *   attention: q|gate split, q/k norm, NeoX partial RoPE, fp16 KV store,
 *              causal GQA attention with the sigmoid gate, wo (+= x)
 *   DeltaNet:  qkv/z/beta/alpha projections (qwen3next's grouped ssm_ba is
 *              split into beta and alpha matrices at upload), conv + SiLU,
 *              exact recurrence (L2 norms inside), gated RMSNorm, out (+= x)
 *   m = RMSNorm(x); router top-k on the device; fused MoE gate_up / down
 *              (+ sigmoid-gated shared expert) accumulated into x
 *   logits = output * RMSNorm(x)
 *
 * Products: up to 8 tokens use tdm_gpu_matvec (int8 activations for the
 * quantised formats, float32 for F32/F16/BF16); a one-token step runs
 * products that share their input as one (q|k|v, DeltaNet qkv|z and
 * beta|alpha, router|shared gate: uploaded back to back). Longer batches use
 * tdm_gpu_matmul (fp16 GEMM) except for F32 weights (routers, the f32 test
 * models), which stay on matvec (one launch, 8-token groups) so routing
 * decisions see float32 logits, and the grouped MoE path (tdm_gpu_moe_prefill). Expert
 * weights: per layer one arena with a slot per expert (gate|up|down, copied
 * from the file's 3-D tensors) and an identity residency table, so the fused
 * kernels of the hybrid path run unchanged. Dense (mlp_only) layers are a
 * one-expert arena with k = 1, weight 1.
 *
 * Differences to the CPU forward (numerical only): fp16 KV cache, float32
 * RoPE angles, int8 activations rounded per 32 elements (the CPU per block
 * of its dot format), the chunked DeltaNet in float32 (tdm_gpu_deltanet),
 * fp16 GEMMs for prompt batches of non-F32 weights.
 *
 * Decode (one token with logits, no route hook) runs as one CUDA graph,
 * recorded at the first decode step and replayed for every later one: the
 * embedding row and the position go to fixed device buffers first, and every
 * kernel reads the position from there, so the graph never changes. It
 * ends with the greedy choice (tdm_gpu_argmax); the download of the logits
 * or (tdm_forward_gpu_eval_greedy) of the choice alone after it is the only
 * host sync. Any failure while
 * recording switches graphs off for that forward and the step runs eagerly
 * (tdm_forward_gpu_graphs()).
 *
 * Ownership: a tdm_forward_gpu borrows the model (host mapping used only for
 * the token embedding, which is dequantised on the host per token) and owns a
 * tdm_gpu context with all weights, state and scratch, sized at creation for
 * n_ctx positions and max_batch tokens per internal batch; eval allocates
 * nothing. One thread at a time.
 */
#ifndef TDM_FORWARD_GPU_H
#define TDM_FORWARD_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "executor.h"
#include "expert_cache.h"
#include "forward.h"
#include "gpu.h"
#include "model.h"
#include "status.h"

typedef struct tdm_forward_gpu tdm_forward_gpu;

/* Uploads the model to device `device`. TDM_ERR_UNSUPPORTED without CUDA or
 * for a weight format without GPU kernels; TDM_ERR_CUDA when it does not fit. */
tdm_status tdm_forward_gpu_new(const tdm_model *m, int device, int32_t n_ctx, int32_t max_batch,
                               tdm_forward_gpu **out, tdm_error *err);
void tdm_forward_gpu_free(tdm_forward_gpu *f);

/* Hybrid mode (DESIGN.md §1-2, docs/EXECUTOR.md): everything but the routed
 * experts is uploaded; the routed experts live in the expert cache's slot
 * arena in VRAM (filled by xp's policy/profile) and the misses of every MoE
 * layer are computed by the CPU pool (xp: threads, topology) in parallel with
 * the GPU's hits, hand-off through mapped memory (gpu_handoff.h), no host
 * round trip per layer. VRAM budget: xp->gpu_mem, or the free memory minus a
 * 768 MiB reserve when 0; the ledger (expert_cache.h) is checked before any
 * allocation (TDM_ERR_OOM naming what would fit), and the slots are whatever
 * the budget leaves after the real allocations (or xp->n_slots when >= 0).
 * Prompt batches of at least xp->stream_min tokens (default
 * TDM_STREAM_MIN_DEFAULT) stream instead: every expert the cache lacks is
 * copied by the pool into page-locked staging and sent to the GPU, layer by
 * layer in chunks of TDM_STREAM_CHUNK experts (two chunk buffers in VRAM,
 * counted by the ledger; chunk c + 1 travels while chunk c computes), and the
 * GPU computes the batch's misses there: a batch's CPU work per miss grows
 * with its tokens, the copy does not. A longer prompt streams in spans of up
 * to tdm_stream_span(max_batch, n_ctx) tokens run layer by layer, so each
 * missing expert crosses PCIe once per span. Decode steps always use the pool,
 * but for the direct share (xp->direct, docs/EXECUTOR.md): the first misses
 * of each layer the fused launches read themselves from the experts in host
 * memory, registered with the device at creation; only tdm_model_copy_experts'
 * copy is registered (a fixed share on mapped experts: TDM_ERR_UNSUPPORTED,
 * an adapted one is then off). With that memory registered, decode steps
 * also prefetch (xp->prefetch spare slots, taken from the budget's): each
 * layer's predicted misses are read into them while the GPU runs the layer
 * (or the one before). The prompt scratch (the GEMM's, the grouped MoE's,
 * the two streaming chunks), which one-token steps never use, is held only
 * when the budget has room for it beside every slot the cache could use;
 * otherwise a prompt eval borrows the arena's last slots for it and copies
 * their experts back afterwards (tdm_expert_cache_lend; DMAs from the
 * experts' registered copy, so only when the direct share or the prefetch
 * registers it); they miss until those copies land. xp->max_batch / n_ctx / dev / mem_* / prefetch (the count
 * that runs) are set here. */
tdm_status tdm_forward_gpu_new_hybrid(const tdm_model *m, int device, int32_t n_ctx, int32_t max_batch,
                                      const tdm_executor_params *xp, tdm_forward_gpu **out, tdm_error *err);
/* The executor (statistics, cache, pool) of a hybrid forward; NULL otherwise. */
tdm_executor *tdm_forward_gpu_executor(tdm_forward_gpu *f);
/* The budget plan of a hybrid forward; NULL otherwise. */
const tdm_budget *tdm_forward_gpu_budget(const tdm_forward_gpu *f);
/* The prompt scratch: its bytes, and the slots a prompt eval borrows for it
 * (0: it is held for good, within tdm_forward_gpu_bytes). */
size_t tdm_forward_gpu_prompt_scratch_bytes(const tdm_forward_gpu *f);
int32_t tdm_forward_gpu_loan_slots(const tdm_forward_gpu *f);

/* Device bytes held (weights, state, scratch) and the weights alone. */
size_t tdm_forward_gpu_bytes(const tdm_forward_gpu *f);
size_t tdm_forward_gpu_weight_bytes(const tdm_forward_gpu *f);
int32_t tdm_forward_gpu_n_ctx(const tdm_forward_gpu *f);
/* The context (timing marks, bandwidth probes in benchmarks). */
tdm_gpu *tdm_forward_gpu_context(tdm_forward_gpu *f);

/* f's page-locked [n_vocab] logits buffer, owned by f (valid until
 * tdm_forward_gpu_free): the destination the decode step's download needs
 * to run without a staging copy. */
float *tdm_forward_gpu_host_logits(tdm_forward_gpu *f);

/* Zeroes the recurrent state. */
tdm_status tdm_forward_gpu_reset(tdm_forward_gpu *f, tdm_error *err);

/* As tdm_forward_eval (forward.h); logits are downloaded and the call
 * returns synchronised, also when it fails. A one-token step's logits
 * download fastest into tdm_forward_gpu_host_logits(f). */
tdm_status tdm_forward_gpu_eval(tdm_forward_gpu *f, const int32_t *tokens, int32_t n, int32_t pos0, float *logits,
                                bool logits_all, tdm_error *err);
/* The same without logits: *next = the greedy choice after the last token
 * (tdm_sampler_argmax of its logits), made on the device; only the id
 * crosses PCIe (a one-token step on the H200: 4 bytes instead of 1 MB).
 * next may point into tokens (it is written last). */
tdm_status tdm_forward_gpu_eval_greedy(tdm_forward_gpu *f, const int32_t *tokens, int32_t n, int32_t pos0,
                                       int32_t *next, tdm_error *err);

/* Recurrent state in the CPU forward's layout (conv windows, then DeltaNet
 * states), so checkpoints move between backends. */
size_t tdm_forward_gpu_rec_floats(const tdm_forward_gpu *f);
tdm_status tdm_forward_gpu_rec_save(tdm_forward_gpu *f, float *dst, tdm_error *err);
tdm_status tdm_forward_gpu_rec_load(tdm_forward_gpu *f, const float *src, tdm_error *err);

/* Route hook: supported, but each MoE layer then downloads its ids/weights
 * (one host sync per layer): for profiling, not for speed. */
void tdm_forward_gpu_set_route_hook(tdm_forward_gpu *f, tdm_forward_route_fn fn, void *user);

/* Decode through CUDA graphs (default on; see above). false when switched
 * off or after a recording failure. */
void tdm_forward_gpu_set_graphs(tdm_forward_gpu *f, bool on);
bool tdm_forward_gpu_graphs(const tdm_forward_gpu *f);

/* Tokens per batch above which non-F32 products use the fp16 GEMM and the
 * grouped MoE path (default 8; a larger value keeps prompts on the decode
 * kernels, slower; both paths are tested). */
void tdm_forward_gpu_set_matmul_min(tdm_forward_gpu *f, int32_t n);

#endif
