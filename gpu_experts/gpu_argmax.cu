/* gpu_argmax: the greedy choice over one row of logits, on the device, so a
 * greedy decode step downloads one id instead of the row (gpu.h). */
#include "gpu_common.cuh"

#define ARGMAX_THREADS 256
#define ARGMAX_MAX_BLOCKS 256

/* The scratch: one key per block, then the count of blocks that are done. */
#define ARGMAX_COUNT_OFF (ARGMAX_MAX_BLOCKS * sizeof(unsigned long long))

/* Logit x[i] as one ordered key: the value's bits made monotone in the high
 * word (-inf and NaN lowest, -0 as +0), the index inverted in the low word.
 * The largest key is then the largest value at its lowest index, and a row
 * with nothing above -inf yields index 0: tdm_sampler_argmax's choice. */
__device__ __forceinline__ unsigned long long argmax_key(float v, unsigned i)
{
    unsigned b = 0u;
    if (v > -INFINITY) {
        b = v == 0.0f ? 0u : __float_as_uint(v);
        b = (b & 0x80000000u) ? ~b : b | 0x80000000u;
    }
    return (unsigned long long)b << 32 | (unsigned)~i;
}

__device__ __forceinline__ unsigned long long key_max(unsigned long long a, unsigned long long b)
{
    return a > b ? a : b;
}

/* The block's largest key, in thread 0. red: one key per warp. */
__device__ unsigned long long block_key_max(unsigned long long k, unsigned long long *red)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        k = key_max(k, __shfl_xor_sync(0xffffffffu, k, o));
    __syncthreads(); /* red may still be read by an earlier call */
    if (threadIdx.x % 32 == 0)
        red[threadIdx.x / 32] = k;
    __syncthreads();
    k = threadIdx.x < ARGMAX_THREADS / 32 ? red[threadIdx.x] : 0ull;
    if (threadIdx.x < 32)
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            k = key_max(k, __shfl_xor_sync(0xffffffffu, k, o));
    return k;
}

/* Every block reduces its stride of x to one key; the block that finishes
 * last reduces those keys, writes the index and sets the count back to 0. */
__global__ void __launch_bounds__(ARGMAX_THREADS)
    argmax_kernel(const float *x, unsigned n, unsigned long long *part, unsigned *count, int32_t *out)
{
    tdm_pdl_enter();
    __shared__ unsigned long long red[ARGMAX_THREADS / 32];
    __shared__ bool last;
    unsigned long long k = 0ull; /* below every key of a real index */
    for (unsigned i = blockIdx.x * ARGMAX_THREADS + threadIdx.x; i < n; i += gridDim.x * ARGMAX_THREADS)
        k = key_max(k, argmax_key(x[i], i));
    k = block_key_max(k, red);
    if (threadIdx.x == 0) {
        part[blockIdx.x] = k;
        __threadfence(); /* the key is visible before the count says so */
        last = atomicAdd(count, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last)
        return;
    __threadfence();
    k = 0ull;
    for (unsigned b = threadIdx.x; b < gridDim.x; b += ARGMAX_THREADS)
        k = key_max(k, ((volatile unsigned long long *)part)[b]);
    k = block_key_max(k, red);
    if (threadIdx.x == 0) {
        *out = (int32_t)~(unsigned)k;
        *count = 0u;
    }
}

extern "C" size_t tdm_gpu_argmax_scratch_bytes(void) { return ARGMAX_COUNT_OFF + sizeof(unsigned long long); }

extern "C" tdm_status tdm_gpu_argmax(tdm_gpu *g, const float *x, int64_t n, void *scratch, int32_t *out,
                                     tdm_error *err)
{
    TDM_REQUIRE(err, x && scratch && out, "gpu argmax: NULL argument");
    TDM_REQUIRE(err, n >= 1 && n <= INT32_MAX, "gpu argmax: n=%lld outside 1..INT32_MAX", (long long)n);
    TDM_REQUIRE(err, (uintptr_t)scratch % 8 == 0, "gpu argmax: scratch not 8-byte aligned");
    /* about 16 elements per thread, enough blocks to keep every SM reading */
    unsigned blocks = tdm_cdiv(n, 16 * ARGMAX_THREADS);
    if (blocks > ARGMAX_MAX_BLOCKS)
        blocks = ARGMAX_MAX_BLOCKS;
    unsigned long long *part = (unsigned long long *)scratch;
    TDM_LAUNCH(err, g, argmax_kernel, blocks, ARGMAX_THREADS, 0, x, (unsigned)n, part,
               (unsigned *)((char *)scratch + ARGMAX_COUNT_OFF), out);
    return TDM_OK;
}
