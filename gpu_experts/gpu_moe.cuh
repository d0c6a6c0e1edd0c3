/* gpu_moe: router (softmax, top-k, renormalise) and the two fused MoE
 * launches. Private to gpu_experts/.
 *
 * gate_up: grid (row tiles of n_ff, selections); a selection is one
 * (token, rank) pair, or the token's shared expert; `split` warps (1 or 4)
 * compute one row of gate and up for that selection and write silu(g) * u.
 * down: grid (row tiles of n_embd, tokens); for one output row the `split`
 * warps share the token's resident selections (rank r to warp r % split),
 * add the gated shared expert, `add` and the old y, and write the row once.
 * An expert id outside 0..n_expert-1 counts as not resident.
 */
#ifndef TDM_GPU_MOE_CUH
#define TDM_GPU_MOE_CUH

#include "gpu_common.cuh"

#define MOE_WARPS 4
/* warps sharing a row by default (tdm_gpu_tuning.moe_split): 1 measured faster on the H200
 * (36.4 vs 45.8 us per Qwen3.5 layer, bench/results/gpu_kernels.json) */
#define MOE_SPLIT_DEFAULT 1
#define ROUTER_MAX_EXPERTS 1024
#define ROUTER_MAX_K 32

/* What the kernels need of a tdm_gpu_moe_layer, flattened for the launch. */
typedef struct moe_args {
    const int32_t *slot_of; /* this layer's row of the residency table */
    int32_t n_expert;
    const uint8_t *arena;
    int64_t slot_bytes, gate_off, up_off, down_off;
    int gate_type, up_type, down_type;
    int64_t gate_row_bytes, down_row_bytes; /* routed experts */
    int units_embd, units_ff;               /* n_embd / 8, n_ff / 8 */
    int n_embd, n_ff;
    /* shared expert (has_shared == 0: none) */
    int has_shared;
    const uint8_t *sh_gate, *sh_up, *sh_down;
    int sh_gate_type, sh_up_type, sh_down_type;
    int64_t sh_gate_row_bytes, sh_up_row_bytes, sh_down_row_bytes;
    int sh_n_ff, sh_units_ff;
    const float *sh_logit;
    int64_t up_row_bytes;
    int64_t h_stride;
} moe_args;

#endif
