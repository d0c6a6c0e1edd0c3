/* gpu_deltanet: causal depthwise conv + SiLU and the Gated DeltaNet
 * recurrence. Private to gpu_experts/.
 *
 * Recurrence layout: one block per (value head, tile of DN_COLS value
 * columns). Within a warp, 4 consecutive lanes share one column and split the
 * d_k state rows between them (rows ks, ks+4, ...), so each thread keeps
 * d_k/4 state values in registers for the whole sequence; the two sums over
 * the key index (S^T k, S^T q) are 2 shuffles. Prefill runs the exact
 * token-sequential recurrence (no chunking), parallel over heads x columns. */
#ifndef TDM_GPU_DELTANET_CUH
#define TDM_GPU_DELTANET_CUH

#include "gpu_common.cuh"

#define DN_KSPLIT 4
#define DN_WARPS 4
#define DN_COLS (DN_WARPS * 32 / DN_KSPLIT) /* value columns per block: 32 */
#define DN_MAX_DK 256
#define CONV_MAX_K 8

#endif
