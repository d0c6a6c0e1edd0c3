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
    cudaStream_t side_stream; /* work beside the compute stream (tdm_gpu_side_begin) */
    cudaStream_t launch;      /* where tdm_launch puts kernels: stream, or side_stream */
    cudaEvent_t side_fork, side_done;    /* the side stream's fork from and join to the compute stream */
    cudaEvent_t marks[TDM_GPU_MARKS];
    cudaEvent_t copy_done, compute_done; /* stream-ordering fences (no timing) */
    cudaEvent_t sync_done;               /* tdm_gpu_sync_pausing's (no timing) */
    cudaEvent_t fences[TDM_GPU_FENCES];  /* tdm_gpu_fence_copies (no timing) */
    cublasHandle_t blas;
    int sm_count;
    int64_t l2_bytes; /* the L2 cache: bounds the products' prefetch ahead of their wait */
    bool pdl_capable; /* compute capability 9.0 or later: programmatic dependent launch */
    tdm_gpu_tuning tune;
    tdm_gpu_buf *bufs; /* every allocation made through this context */
    size_t n_bufs, cap_bufs;
};

/* Per-context set-up of the prompt MoE kernels (gpu_moe_prefill.cu), called
 * by tdm_gpu_create. */
tdm_status tdm_gpu_moe_prefill_init(tdm_error *err);

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

#define TDM_REQUIRE(err, cond, ...)                                                    \
    do {                                                                               \
        if (!(cond))                                                                   \
            return tdm_error_set((err), TDM_ERR_INVALID, __VA_ARGS__);                 \
    } while (0)

/* Programmatic dependent launch (sm_90 and later). Every kernel of this
 * module is launched through tdm_launch, which lets it start while the
 * kernel before it in the stream is still running; so every kernel calls
 * tdm_pdl_enter() before it reads or writes anything another kernel may
 * touch. Before that call a kernel may only read what no kernel writes
 * (weights: the L2 prefetch of the products). tdm_pdl_enter() waits for the
 * previous kernel to complete with its memory visible, then lets the next
 * kernel start its own prologue: at most two grids are ever resident, the
 * running one and the next one waiting (no deadlock: the next grid starts
 * only once every block of this one has been scheduled). On older GPUs the
 * launch is plain and the call does nothing. */
__device__ __forceinline__ void tdm_pdl_enter(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* Asks L2 for [p, p + bytes) ahead of the loads (hides the DRAM latency
 * behind the activation quantisation; before tdm_pdl_enter, behind the
 * kernel before). A prefetch only moves lines into L2, where writes land
 * too, so it may also cover memory the kernel before is still writing. */
__device__ __forceinline__ void tdm_prefetch_l2(const void *p, int64_t bytes)
{
    for (int64_t off = (int64_t)threadIdx.x * 128; off < bytes; off += (int64_t)blockDim.x * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"((const char *)p + off));
}

/* Launches kernel on the compute stream (the side stream between
 * tdm_gpu_side_begin and _end), programmatically serialised where
 * the GPU supports it and the tuning has not turned it off. */
template <typename... P, typename... A>
static inline cudaError_t tdm_launch(const tdm_gpu *g, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem,
                                     A &&...args)
{
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = g->launch;
    cfg.attrs = at;
    cfg.numAttrs = g->pdl_capable && g->tune.pdl >= 0 ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, static_cast<A &&>(args)...);
}

/* tdm_launch(g, kernel, grid, block, smem, args...), a failure returned as
 * TDM_ERR_CUDA naming the call site. */
#define TDM_LAUNCH(err, g, ...)                                                        \
    do {                                                                               \
        cudaError_t tdm_e_ = tdm_launch((g), __VA_ARGS__);                             \
        if (tdm_e_ != cudaSuccess)                                                     \
            return tdm_gpu_cuda_fail((err), tdm_e_, "kernel launch", __FILE__, __LINE__); \
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
