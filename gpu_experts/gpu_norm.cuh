/* gpu_norm: RMSNorm (plain and gated) and the block sum other kernels
 * share. Private to gpu_experts/. */
#ifndef TDM_GPU_NORM_CUH
#define TDM_GPU_NORM_CUH

#include "gpu_common.cuh"

#define NORM_THREADS 256
#define NORM_VEC 2 /* float4s per thread of a row kept in registers: rows up to 2048 */

/* Sum over the block (any whole number of warps); every thread gets the result. */
__device__ __forceinline__ float tdm_block_sum(float v, float *red /* [32] shared */)
{
    v = tdm_warp_sum(v);
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0)
        red[w] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : 0.0f;
    return tdm_warp_sum(v);
}

#endif
