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
    int smem_optin;   /* shared memory a block may ask for (bytes) */
    tdm_gpu_tuning tune;
    tdm_gpu_buf *bufs; /* every allocation made through this context */
    size_t n_bufs, cap_bufs;
};

/* Per-context set-up of the prompt MoE kernels (gpu_moe_prefill.cu), called
 * by tdm_gpu_create. */
tdm_status tdm_gpu_moe_prefill_init(tdm_error *err);
/* ... and of the prompt attention kernels (gpu_attn.cu): lets each take the
 * shared memory it needs where the device has it. */
tdm_status tdm_gpu_attention_init(const tdm_gpu *g, tdm_error *err);

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

/* d += A (16 x 16) * B (16 x 8) on the tensor cores, fp16 in, float32
 * accumulated, in the PTX fragment layout (g = lane / 4, t = lane % 4): a0
 * row g, k 2t and 2t + 1; a1 row g + 8, the same k; a2 and a3 the same rows
 * at k + 8; b0 k 2t and 2t + 1 of column g, b1 the same at k + 8; d[0..1] row
 * g, columns 2t and 2t + 1, d[2..3] row g + 8. sm_75 runs it as two m16n8k8
 * halves (k 0-7, then 8-15). */
__device__ __forceinline__ void tdm_mma_f16(float d[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                            uint32_t b0, uint32_t b1)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#elif defined(__CUDA_ARCH__)
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(b0));
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a2), "r"(a3), "r"(b1));
#endif
}

/* Four 8 x 8 fp16 matrices from shared memory (ldmatrix; sm_75 and later):
 * lane l gives the address of row l % 8 of matrix l / 8 (16-byte aligned);
 * r[i] is matrix i's pair (row g, columns 2t and 2t + 1), or with TRANS
 * (rows 2t and 2t + 1, column g). */
template <bool TRANS> __device__ __forceinline__ void tdm_ldsm_x4(uint32_t r[4], const void *row)
{
#if defined(__CUDA_ARCH__)
    const unsigned a = (unsigned)__cvta_generic_to_shared(row);
    if constexpr (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
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
