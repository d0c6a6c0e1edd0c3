/* gpu_deltanet: causal depthwise conv + SiLU and the Gated DeltaNet
 * recurrence. Private to gpu_experts/.
 *
 * Recurrence layout: one block per (value head, tile of DN_COLS value
 * columns). Within a warp, 4 consecutive lanes share one column and split the
 * d_k state rows between them (rows ks, ks+4, ...), so each thread keeps
 * d_k/4 state values in registers for the whole sequence; the two sums over
 * the key index (S^T k, S^T q) are 2 shuffles. Decode and short batches run
 * this exact token-sequential recurrence; longer prompts the chunked form.
 * One decode token can instead run conv, recurrence and gated norm as one
 * launch (tdm_gpu_deltanet_step): a block per value head, the same 4 threads
 * per column. */
#ifndef TDM_GPU_DELTANET_CUH
#define TDM_GPU_DELTANET_CUH

#include "gpu_common.cuh"

#define DN_KSPLIT 4
#define DN_WARPS 4
#define DN_COLS (DN_WARPS * 32 / DN_KSPLIT) /* value columns per block: 32 */
#define DN_MAX_DK 256
#define CONV_MAX_K 8
#define DNS_MAX_THREADS 512 /* one-token step: d_v * DN_KSPLIT threads per value head */

/* Chunked form (prefill, models.md §3.6.6): one block per (value head, tile
 * of DNC_COLS value columns), sequential over chunks of DNC_T tokens; every
 * intra-chunk quantity (the C x C matrices, the triangular solve) is computed
 * from shared memory, the block's d_k x DNC_COLS state slice stays in
 * registers (and a shared copy) for the whole prompt. The C x C work is
 * repeated by the d_v / DNC_COLS blocks of a head: that keeps the grid at
 * H_v x 4 blocks for d_v 128 (one wave on a large GPU) with no scratch. */
#define DNC_T 64
#define DNC_COLS 32
#define DNC_THREADS 256
#define DNC_MAX_DK 128
/* Below this many tokens the sequential form runs (tdm_gpu_tuning's
 * deltanet_chunk_min overrides it). Measured on the H200 (bench/gpu_kernels,
 * one Qwen3.5 layer): sequential 20.1 / 36.9 us, chunked 24.0 / 26.1 us at
 * 16 / 32 tokens, so the forms cross near 24. */
#define DNC_MIN_TOKENS_DEFAULT 24

#endif
