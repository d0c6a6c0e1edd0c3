/* gpu_moe: router (softmax, top-k, renormalise) and the two fused MoE
 * launches. Private to gpu_experts/.
 *
 * Both fused launches read weights with the dp4a path of gpu_quant.cuh.
 * gate_up: grid (GU_TILE-row tiles of n_ff, selections); a selection is one
 * (token, rank) pair, or the token's shared expert; the block quantises its
 * token's x to int8 in shared memory once, each warp computes one row of gate
 * and up per pass and writes silu(g) * u to h, and the block quantises its
 * 32 h values once into the int8 copy of h (one group of 32) when that
 * selection's down weights take int8 activations. down: grid (row tiles of
 * n_embd, tokens); for one output row the lanes of a warp share the (rank,
 * unit) items of every resident selection and the gated shared expert,
 * reading the int8 copy of h straight from global memory (no per-block
 * quantisation, no barrier), then add `add` and the old y and write the row
 * once. An expert id outside 0..n_expert-1 counts as not resident. A
 * selection that is not resident is skipped, or read from host memory when
 * the layer has direct experts and it is among the first *quota such
 * selections (gpu.h). Any ntok works; each down block serves one token.
 * Each launch is compiled once per weight type (the host picks the one for
 * the layer, so nothing in it switches on the type) and once for layers
 * whose matrices mix types (a warp-uniform switch per row); every quotient
 * of the geometry comes from the host (moe_args). The router's launch can
 * carry the shared expert's gate_up tiles (tdm_gpu_router_shared: the
 * switching kind, computed ahead of the wait), so that gate_up's grid holds
 * the routed experts alone.
 */
#ifndef TDM_GPU_MOE_CUH
#define TDM_GPU_MOE_CUH

#include "gpu_common.cuh"

#define GU_WARPS 16          /* gate_up: warps per block, one row each per pass */
#define GU_TILE 32           /* gate_up rows per block: one int8 group of h */
#define GU_BLOCKS_PER_SM 2   /* asked of ptxas (<= 64 registers): a 1-token Qwen3.5
                                gate_up (144 blocks) runs in one wave on 132 SMs */
#define DN_WARPS 8           /* down: warps per block, one output row each per pass */
#define DN_TILE 8            /* down rows per block (built in; tuning: 8, 16 or 32) */
#define DN_BLOCKS_PER_SM 3   /* asked of ptxas (<= 80 registers) */
#define MOE_MAX_K 32         /* selected experts per token */
#define MOE_XQ_ELEMS 16384   /* int8 x elements a gate_up block holds (a chunk) */
#define ROUTER_MAX_EXPERTS 1024
#define ROUTER_MAX_K 32
#define RS_PER 8             /* router_shared: experts per lane (TDM_GPU_ROUTER_SHARED_MAX_EXPERTS / 32) */

static_assert(GU_TILE == 32 && GU_TILE % GU_WARPS == 0, "a gate_up block is one int8 group of h");

/* One gate or up matrix's share of a gate_up row chunk (moe_prepare): bytes
 * of a whole chunk of a row, units of a whole and of the last chunk. */
typedef struct moe_chunk_geom {
    int bytes, full, last;
} moe_chunk_geom;

/* What the kernels need of a tdm_gpu_moe_layer, flattened for the launch,
 * with every quotient the kernels need worked out on the host. */
typedef struct moe_args {
    const int32_t *slot_of; /* this layer's row of the residency table */
    int32_t n_expert;
    const uint8_t *arena;
    int64_t slot_bytes, gate_off, up_off, down_off;
    int gate_type, up_type, down_type;
    int64_t gate_row_bytes, down_row_bytes; /* routed experts */
    int n_embd, n_ff;
    /* shared expert (has_shared == 0: none) */
    int has_shared;
    const uint8_t *sh_gate, *sh_up, *sh_down;
    int sh_gate_type, sh_up_type, sh_down_type;
    int64_t sh_gate_row_bytes, sh_up_row_bytes, sh_down_row_bytes;
    int sh_n_ff;
    const float *sh_logit;
    int64_t up_row_bytes;
    int64_t h_stride;
    int down_i8, sh_down_i8; /* the down weights take int8 h (gate_up writes its int8 copy) */
    /* gate_up: x in nchunks chunks of `chunk` elements (the last: `last`) */
    int chunk, nchunks, last;
    moe_chunk_geom gate_g, up_g, sh_gate_g, sh_up_g;
    int down_units, sh_down_units; /* units of a down row: n_ff / unit */
    /* misses read from host memory (tdm_gpu_direct_experts); dir_gate NULL: none */
    const uint8_t *dir_gate, *dir_up, *dir_down;
    int64_t dir_gate_stride, dir_up_stride, dir_down_stride;
    const int32_t *dir_quota;
} moe_args;

#endif
