/* gpu_xq: the int8 activations of the quantised products (every format on
 * the dp4a path): the per-32 quantisation, the layout a block or a producer
 * kernel writes them in, and the helpers that write it. Private to
 * gpu_experts/; __host__ __device__ where the tests rerun it on the host. */
#ifndef TDM_GPU_XQ_CUH
#define TDM_GPU_XQ_CUH

#include <math.h>
#include <stdint.h>

#include "gpu_common.cuh"

#define TDM_HD __host__ __device__ __forceinline__
#ifdef __CUDA_ARCH__ /* unroll hints in __host__ __device__ code (host compilers warn) */
#define TDM_UNROLL _Pragma("unroll")
#else
#define TDM_UNROLL
#endif

/* Activations are quantised per 32 elements: dx = amax / 127, q = rint(x *
 * (127 / amax)), both divisions correctly rounded and the product a single
 * binary32 multiply, so the host (tdm_gpu_xq_host) reproduces them bit for
 * bit. Groups with amax < TDM_XQ_TINY become zeros; a NaN makes dx NaN. */
#define TDM_XQ_TINY 1e-30f

TDM_HD float tdm_xq_scale(float amax)
{
#ifdef __CUDA_ARCH__
    return __fdiv_rn(amax, 127.0f);
#else
    return amax / 127.0f;
#endif
}

TDM_HD float tdm_xq_inv(float amax)
{
#ifdef __CUDA_ARCH__
    return amax >= TDM_XQ_TINY ? __fdiv_rn(127.0f, amax) : 0.0f;
#else
    return amax >= TDM_XQ_TINY ? 127.0f / amax : 0.0f;
#endif
}

TDM_HD int tdm_xq_round(float x, float inv)
{
#ifdef __CUDA_ARCH__
    return __float2int_rn(__fmul_rn(x, inv));
#else
    return (int)rintf(x * inv);
#endif
}

/* max that keeps a NaN (fmaxf would drop it) */
TDM_HD float tdm_max_nan(float a, float b) { return (a > b || a != a) ? a : b; }

/* int8 activations for a chunk of k (a block's, in shared memory; or a
 * producer's whole rows, in global memory, tdm_gpu_xq8_bytes):
 * q [rows][pitch] int8 (pitch: the chunk rounded up to 128 bytes; each row
 * swizzled on its own, tdm_xq_swz), s [rows][pitch / 32] = {dx bits, sum of
 * the group's quants over elements 0..15 (low 16 bits) and 16..31 (high 16
 * bits)}; rows are tokens (matvec) or selections (MoE down). Because the
 * swizzle is per row, {q + r * pitch, s + r * (pitch / 32), pitch} is again
 * a valid tdm_xq holding row r alone (the MoE down kernel's per-selection
 * views). */
struct tdm_xq {
    const int8_t *q;
    const uint2 *s;
    int pitch;
};

/* Byte offset of element o of one row from the row's start: the 16-byte
 * chunks of each 128 bytes are xor-swizzled so that the 8 lanes of a quarter
 * warp, reading the groups of 8 consecutive units, hit distinct banks. The
 * key is the position within the row, never the row: rows start at
 * multiples of 128 bytes, so adding r * pitch outside the swizzle keeps the
 * banks, and a row read through a view starting at it finds what was
 * written (a swizzle of r * pitch + o would differ for r * pitch not a
 * multiple of 1024). */
TDM_HD int tdm_xq_swz(int o)
{
    int c = o >> 4;
    return ((c ^ ((c >> 3) & 7)) << 4) | (o & 15);
}

/* Quantises the four activations v at element e (a multiple of 4) of one
 * row into the row's q and s (tdm_xq layout): the 8 consecutive lanes
 * holding a group of 32, e ascending, call it together, and every lane of
 * the warp calls it (a lane with ok = false contributes zeros and writes
 * nothing; a group's 8 lanes agree on ok). */
__device__ __forceinline__ void tdm_xq_put4(float4 v, int e, bool ok, int8_t *q, uint2 *s)
{
    float amax = tdm_max_nan(tdm_max_nan(fabsf(v.x), fabsf(v.y)), tdm_max_nan(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int o = 1; o < 8; o <<= 1)
        amax = tdm_max_nan(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    float inv = tdm_xq_inv(amax);
    int q0 = tdm_xq_round(v.x, inv), q1 = tdm_xq_round(v.y, inv), q2 = tdm_xq_round(v.z, inv),
        q3 = tdm_xq_round(v.w, inv);
    int sum = q0 + q1 + q2 + q3;
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    int upper = __shfl_xor_sync(0xffffffffu, sum, 4); /* the other half's sum */
    if (ok) {
        *(uint32_t *)(q + tdm_xq_swz(e)) = (uint32_t)(q0 & 0xFF) | (uint32_t)(q1 & 0xFF) << 8 |
                                          (uint32_t)(q2 & 0xFF) << 16 | (uint32_t)q3 << 24;
        if ((e & 31) == 0)
            s[e / 32] = make_uint2(__float_as_uint(tdm_xq_scale(amax)),
                                   ((uint32_t)sum & 0xFFFFu) | (uint32_t)upper << 16);
    }
}

/* The same for one group of 32 held one value per lane (lane i: element i)
 * by a whole warp: group gi of the row. */
__device__ __forceinline__ void tdm_xq_put32(float v, int8_t *q, uint2 *s, int gi)
{
    const int lane = threadIdx.x & 31;
    float amax = fabsf(v);
#pragma unroll
    for (int o = 1; o < 32; o <<= 1)
        amax = tdm_max_nan(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const int qv = tdm_xq_round(v, tdm_xq_inv(amax));
    int sum = qv;
#pragma unroll
    for (int o = 1; o < 16; o <<= 1)
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const int upper = __shfl_xor_sync(0xffffffffu, sum, 16);
    q[tdm_xq_swz(32 * gi + lane)] = (int8_t)qv;
    if (lane == 0)
        s[gi] = make_uint2(__float_as_uint(tdm_xq_scale(amax)), ((uint32_t)sum & 0xFFFFu) | (uint32_t)upper << 16);
}

/* Copies a row's int8 activations written by a producer kernel (src: its
 * tdm_gpu_xq8_bytes(1, k) bytes, pitch = k rounded up to 128) into the
 * block's shared memory (dst, the same layout), then syncs the block. */
__device__ __forceinline__ void tdm_xq_copy(int4 *dst, const int8_t *src, int pitch)
{
    const int n16 = (pitch + pitch / 32 * 8) / 16; /* whole 16-byte words: pitch is a multiple of 128 */
    for (int i = threadIdx.x; i < n16; i += blockDim.x)
        dst[i] = ((const int4 *)src)[i];
    __syncthreads();
}

/* Quantises x[r * xs + k0 .. + n) for r < nrows into (q, s); n is a multiple
 * of 32, x + k0 16-byte aligned. Every thread of the block must call it: 8
 * lanes per group, 4 elements each; unrolled so that several rows' loads
 * are in flight. */
__device__ __forceinline__ void tdm_xq_fill(int8_t *q, uint2 *s, int pitch, const float *x, int64_t xs,
                                            int nrows, int64_t k0, int n)
{
    int per_row = n / 4, total = nrows * per_row;
#pragma unroll 4
    for (int base = 0; base < total; base += blockDim.x) {
        int i = base + threadIdx.x;
        bool ok = i < total; /* a group's 8 lanes agree: per_row is a multiple of 8 */
        int r = 0;
        if (nrows > 1 && ok) /* one row (nrows is uniform) needs no division */
            r = i / per_row;
        int e = ok ? 4 * (i - r * per_row) : 0;
        float4 v = ok ? __ldg((const float4 *)(x + r * xs + k0 + e)) : make_float4(0, 0, 0, 0);
        tdm_xq_put4(v, e, ok, q + r * pitch, s + r * (pitch / 32));
    }
}

#endif
