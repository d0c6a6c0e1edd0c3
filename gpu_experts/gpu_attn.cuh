/* gpu_attn: fp16 KV cache store and causal GQA attention (plain and gated).
 * Private to gpu_experts/. */
#ifndef TDM_GPU_ATTN_CUH
#define TDM_GPU_ATTN_CUH

#include "gpu_common.cuh"

/* Warps per (token, head) block: each warp runs an online softmax over every
 * ATTN_WARPS-th key, then the warps' partial results are merged. */
#define ATTN_WARPS 8
#define ATTN_MAX_HEAD_DIM 512

#endif
