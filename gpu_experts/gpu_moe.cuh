/* gpu_moe: router (softmax, top-k, renormalise) and the two fused MoE
 * launches. Private to gpu_experts/.
 *
 * Both fused launches read weights with the dp4a path of gpu_quant.cuh:
 * each block quantises its activations (x of one token, or the token's k +
 * shared h rows) to int8 in shared memory once, then computes MOE_TILE rows.
 * gate_up: grid (row tiles of n_ff, selections); a selection is one
 * (token, rank) pair, or the token's shared expert; a group of `split`
 * warps (1 or 4) computes one row of gate and up per pass and writes
 * silu(g) * u. down: grid (row tiles of n_embd, tokens); for one output row
 * the lanes of a group share the (rank, unit) items of every resident
 * selection and the gated shared expert, then add `add` and the old y and
 * write the row once. An expert id outside 0..n_expert-1 counts as not
 * resident. Any ntok works; each block serves one token.
 */
#ifndef TDM_GPU_MOE_CUH
#define TDM_GPU_MOE_CUH

#include "gpu_common.cuh"

#define MOE_WARPS 8
#define MOE_TILE 16          /* rows per block (built in): amortises the activation quantisation */
#define MOE_SPLIT 1          /* warps per output row (built in) */
#define MOE_BLOCKS_PER_SM 3  /* asked of ptxas (<= 80 registers): a 1-token Qwen3.5
                                gate_up (288 blocks) runs in one wave on 132 SMs */
#define MOE_MAX_K 32         /* selected experts per token */
#define MOE_XQ_ELEMS 16384   /* int8 activations a block holds (a chunk per selection) */
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
