/* gpu_attn: the attention inputs (q/k norms, RoPE, fp16 KV store) and causal
 * GQA attention (plain and gated). Private to gpu_experts/. */
#ifndef TDM_GPU_ATTN_CUH
#define TDM_GPU_ATTN_CUH

#include "gpu_common.cuh"

/* Warps per (token, head, split) block: each warp runs an online softmax
 * over every ATTN_WARPS-th key of the split, then the warps' partial results
 * are merged (and the splits' in the last block to finish). */
#define ATTN_WARPS 8
#define ATTN_MAX_HEAD_DIM 512
#define PREP_THREADS 128 /* attn_prep: threads per head slot */
#define ATTN_SPLIT_MAX_TOK 8 /* decode batches split the keys; longer ones fill the GPU anyway */
#define ATTN_MAX_SPLITS 32
#define ATTN_MIN_KEYS 16     /* cache rows per split at least */
/* Prompt attention on the tensor cores (attention_prefill_kernel): a block
 * of FA_BR query tokens of one head, four warps of 16 rows, walks the keys
 * FA_BC at a time through shared memory. */
#define FA_BR 64
#define FA_BC 16
#define FA_THREADS 128
#define FA_MIN_TOK 16 /* fewer query tokens take attention_kernel */

#endif
