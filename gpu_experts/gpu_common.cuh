/* gpu_common: the private side of gpu.h shared by every .cu file: the context
 * body, the one CUDA-error helper and launch checks. Never included by engine/. */
#ifndef TDM_GPU_COMMON_CUH
#define TDM_GPU_COMMON_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "quant.h"
#include "status.h"
}
#include "gpu.h"

#define TDM_GPU_COPY_STREAMS 1

typedef struct tdm_gpu_buf {
    void *ptr;
    size_t bytes;
    bool host; /* page-locked host memory */
} tdm_gpu_buf;

struct tdm_gpu {
    int device;
    cudaStream_t stream;      /* compute */
    cudaStream_t copy_stream; /* expert/slot copies */
    cudaEvent_t marks[TDM_GPU_MARKS];
    cudaEvent_t copy_done, compute_done; /* stream-ordering fences (no timing) */
    cudaEvent_t fences[TDM_GPU_FENCES];  /* tdm_gpu_fence_copies (no timing) */
    cublasHandle_t blas;
    int sm_count;
    tdm_gpu_tuning tune;
    tdm_gpu_buf *bufs; /* every allocation made through this context */
    size_t n_bufs, cap_bufs;
};

/* Turns a CUDA error into TDM_ERR_CUDA naming the call and its site. */
tdm_status tdm_gpu_cuda_fail(tdm_error *err, cudaError_t e, const char *call, const char *file,
                             int line);
tdm_status tdm_gpu_blas_fail(tdm_error *err, cublasStatus_t s, const char *call, const char *file,
                             int line);

#define TDM_CU(err, call)                                                              \
    do {                                                                               \
        cudaError_t tdm_e_ = (call);                                                   \
        if (tdm_e_ != cudaSuccess)                                                     \
            return tdm_gpu_cuda_fail((err), tdm_e_, #call, __FILE__, __LINE__);        \
    } while (0)

#define TDM_BLAS(err, call)                                                            \
    do {                                                                               \
        cublasStatus_t tdm_s_ = (call);                                                \
        if (tdm_s_ != CUBLAS_STATUS_SUCCESS)                                           \
            return tdm_gpu_blas_fail((err), tdm_s_, #call, __FILE__, __LINE__);        \
    } while (0)

/* After a <<<>>> launch: reports configuration errors at once. */
#define TDM_LAUNCHED(err, what)                                                        \
    do {                                                                               \
        cudaError_t tdm_e_ = cudaGetLastError();                                       \
        if (tdm_e_ != cudaSuccess)                                                     \
            return tdm_gpu_cuda_fail((err), tdm_e_, "launch of " what, __FILE__, __LINE__); \
    } while (0)

#define TDM_REQUIRE(err, cond, ...)                                                    \
    do {                                                                               \
        if (!(cond))                                                                   \
            return tdm_error_set((err), TDM_ERR_INVALID, __VA_ARGS__);                 \
    } while (0)

static inline unsigned tdm_cdiv(int64_t a, int64_t b) { return (unsigned)((a + b - 1) / b); }

__device__ __forceinline__ float tdm_warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float tdm_warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float tdm_silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float tdm_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

#endif
