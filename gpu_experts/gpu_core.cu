/* gpu_core: the context (streams, events, cuBLAS, owned allocations), the
 * CUDA error helper and the buffer helpers of gpu.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu_common.cuh"

extern "C" {
#include "topology.h"
}

tdm_status tdm_gpu_cuda_fail(tdm_error *err, cudaError_t e, const char *call, const char *file,
                             int line)
{
    return tdm_error_set(err, TDM_ERR_CUDA, "%s:%d: %s: %s (%s)", file, line, call,
                         cudaGetErrorString(e), cudaGetErrorName(e));
}

tdm_status tdm_gpu_blas_fail(tdm_error *err, cublasStatus_t s, const char *call, const char *file,
                             int line)
{
    return tdm_error_set(err, TDM_ERR_CUDA, "%s:%d: %s: cuBLAS status %d", file, line, call,
                         (int)s);
}

extern "C" bool tdm_gpu_available(void)
{
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

static tdm_status track(tdm_gpu *g, void *p, size_t bytes, bool host, tdm_error *err)
{
    if (g->n_bufs == g->cap_bufs) {
        size_t cap = g->cap_bufs ? 2 * g->cap_bufs : 64;
        tdm_gpu_buf *nb = (tdm_gpu_buf *)realloc(g->bufs, cap * sizeof *nb);
        if (!nb)
            return tdm_error_set(err, TDM_ERR_OOM, "gpu: buffer table of %zu entries", cap);
        g->bufs = nb;
        g->cap_bufs = cap;
    }
    g->bufs[g->n_bufs++] = (tdm_gpu_buf){p, bytes, host};
    return TDM_OK;
}

static void destroy(tdm_gpu *g)
{
    cudaSetDevice(g->device);
    if (g->stream)
        cudaStreamSynchronize(g->stream);
    for (size_t i = 0; i < g->n_bufs; i++) {
        if (g->bufs[i].host)
            cudaFreeHost(g->bufs[i].ptr);
        else
            cudaFree(g->bufs[i].ptr);
    }
    free(g->bufs);
    if (g->blas)
        cublasDestroy(g->blas);
    for (int i = 0; i < TDM_GPU_MARKS; i++)
        if (g->marks[i])
            cudaEventDestroy(g->marks[i]);
    for (int i = 0; i < TDM_GPU_FENCES; i++)
        if (g->fences[i])
            cudaEventDestroy(g->fences[i]);
    if (g->copy_done)
        cudaEventDestroy(g->copy_done);
    if (g->compute_done)
        cudaEventDestroy(g->compute_done);
    if (g->sync_done)
        cudaEventDestroy(g->sync_done);
    if (g->side_fork)
        cudaEventDestroy(g->side_fork);
    if (g->side_done)
        cudaEventDestroy(g->side_done);
    if (g->side_stream)
        cudaStreamDestroy(g->side_stream);
    if (g->copy_stream)
        cudaStreamDestroy(g->copy_stream);
    if (g->stream)
        cudaStreamDestroy(g->stream);
    free(g);
}

static tdm_status create(tdm_gpu *g, int device, tdm_error *err)
{
    int n = 0;
    TDM_CU(err, cudaGetDeviceCount(&n));
    if (device < 0 || device >= n)
        return tdm_error_set(err, TDM_ERR_INVALID, "gpu: device %d does not exist (%d visible)",
                             device, n);
    g->device = device;
    TDM_CU(err, cudaSetDevice(device));
    TDM_CU(err, cudaDeviceGetAttribute(&g->sm_count, cudaDevAttrMultiProcessorCount, device));
    int l2 = 0;
    TDM_CU(err, cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
    g->l2_bytes = l2;
    int major = 0;
    TDM_CU(err, cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    g->pdl_capable = major >= 9;
    int optin = 0;
    TDM_CU(err, cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    g->smem_optin = optin;
    TDM_CU(err, cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking));
    TDM_CU(err, cudaStreamCreateWithFlags(&g->copy_stream, cudaStreamNonBlocking));
    TDM_CU(err, cudaStreamCreateWithFlags(&g->side_stream, cudaStreamNonBlocking));
    g->launch = g->stream;
    TDM_CU(err, cudaEventCreateWithFlags(&g->side_fork, cudaEventDisableTiming));
    TDM_CU(err, cudaEventCreateWithFlags(&g->side_done, cudaEventDisableTiming));
    for (int i = 0; i < TDM_GPU_MARKS; i++)
        TDM_CU(err, cudaEventCreate(&g->marks[i]));
    TDM_CU(err, cudaEventCreateWithFlags(&g->copy_done, cudaEventDisableTiming));
    TDM_CU(err, cudaEventCreateWithFlags(&g->compute_done, cudaEventDisableTiming));
    TDM_CU(err, cudaEventCreateWithFlags(&g->sync_done, cudaEventDisableTiming));
    for (int i = 0; i < TDM_GPU_FENCES; i++)
        TDM_CU(err, cudaEventCreateWithFlags(&g->fences[i], cudaEventDisableTiming));
    TDM_BLAS(err, cublasCreate(&g->blas));
    TDM_BLAS(err, cublasSetStream(g->blas, g->stream));
    TDM_TRY(tdm_gpu_attention_init(g, err));
    return tdm_gpu_moe_prefill_init(err);
}

extern "C" tdm_status tdm_gpu_create(int device, tdm_gpu **out, tdm_error *err)
{
    *out = NULL;
    tdm_gpu *g = (tdm_gpu *)calloc(1, sizeof *g);
    if (!g)
        return tdm_error_set(err, TDM_ERR_OOM, "gpu: context");
    tdm_status s = create(g, device, err);
    if (s != TDM_OK) {
        destroy(g);
        return s;
    }
    *out = g;
    return TDM_OK;
}

extern "C" void tdm_gpu_free(tdm_gpu *g)
{
    if (g)
        destroy(g);
}

extern "C" tdm_status tdm_gpu_query(tdm_gpu *g, tdm_gpu_info *info, tdm_error *err)
{
    cudaDeviceProp p;
    TDM_CU(err, cudaSetDevice(g->device));
    TDM_CU(err, cudaGetDeviceProperties(&p, g->device));
    memset(info, 0, sizeof *info);
    snprintf(info->name, sizeof info->name, "%s", p.name);
    info->device = g->device;
    info->sm_count = p.multiProcessorCount;
    info->cc_major = p.major;
    info->cc_minor = p.minor;
    info->l2_bytes = (size_t)p.l2CacheSize;
    TDM_CU(err, cudaMemGetInfo(&info->mem_free, &info->mem_total));
    return TDM_OK;
}

extern "C" tdm_status tdm_gpu_alloc(tdm_gpu *g, size_t bytes, void **dptr, tdm_error *err)
{
    *dptr = NULL;
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        return tdm_error_set(err, TDM_ERR_OOM, "gpu: cudaMalloc of %zu bytes: out of device memory",
                             bytes);
    }
    TDM_CU(err, e);
    tdm_status s = track(g, p, bytes, false, err);
    if (s != TDM_OK) {
        cudaFree(p);
        return s;
    }
    *dptr = p;
    return TDM_OK;
}

static void untrack(tdm_gpu *g, void *p, bool host)
{
    for (size_t i = 0; i < g->n_bufs; i++) {
        if (g->bufs[i].ptr == p && g->bufs[i].host == host) {
            if (host)
                cudaFreeHost(p);
            else
                cudaFree(p);
            g->bufs[i] = g->bufs[--g->n_bufs];
            return;
        }
    }
    tdm_log(TDM_LOG_WARN, "gpu: release of %p that this context does not own", p);
}

extern "C" void tdm_gpu_release(tdm_gpu *g, void *dptr)
{
    if (g && dptr)
        untrack(g, dptr, false);
}

extern "C" tdm_status tdm_gpu_alloc_host(tdm_gpu *g, size_t bytes, void **hptr, tdm_error *err)
{
    *hptr = NULL;
    void *p = NULL;
    TDM_CU(err, cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocPortable | cudaHostAllocMapped));
    tdm_status s = track(g, p, bytes, true, err);
    if (s != TDM_OK) {
        cudaFreeHost(p);
        return s;
    }
    *hptr = p;
    return TDM_OK;
}

extern "C" void tdm_gpu_release_host(tdm_gpu *g, void *hptr)
{
    if (g && hptr)
        untrack(g, hptr, true);
}

/* The page that holds p, and the bytes from there to cover [p, p + bytes). */
static uintptr_t page_span(const void *p, size_t bytes, size_t *span)
{
    const uintptr_t ps = (uintptr_t)sysconf(_SC_PAGESIZE), lo = (uintptr_t)p & ~(ps - 1);
    *span = (((uintptr_t)p + bytes + ps - 1) & ~(ps - 1)) - lo;
    return lo;
}

extern "C" tdm_status tdm_gpu_host_register(tdm_gpu *g, const void *p, size_t bytes, const void **dev,
                                            tdm_error *err)
{
    *dev = NULL;
    TDM_REQUIRE(err, p && bytes, "gpu host_register: empty range");
    int ok = 0, ro = 0;
    TDM_CU(err, cudaDeviceGetAttribute(&ok, cudaDevAttrHostRegisterSupported, g->device));
    TDM_CU(err, cudaDeviceGetAttribute(&ro, cudaDevAttrHostRegisterReadOnlySupported, g->device));
    if (!ok || !ro)
        return tdm_error_set(err, TDM_ERR_UNSUPPORTED,
                             "gpu host_register: device %d cannot map read-only host memory", g->device);
    size_t span;
    void *lo = (void *)page_span(p, bytes, &span);
    cudaError_t e = cudaHostRegister(lo, span, cudaHostRegisterPortable | cudaHostRegisterMapped |
                                                   cudaHostRegisterReadOnly);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return tdm_error_set(err, TDM_ERR_UNSUPPORTED, "gpu host_register: %.2f GiB at %p: %s",
                             (double)span / 1073741824.0, lo, cudaGetErrorString(e));
    }
    void *d = NULL;
    e = cudaHostGetDevicePointer(&d, lo, 0);
    if (e != cudaSuccess) {
        (void)cudaHostUnregister(lo);
        return tdm_gpu_cuda_fail(err, e, "cudaHostGetDevicePointer", __FILE__, __LINE__);
    }
    *dev = (const uint8_t *)d + ((uintptr_t)p - (uintptr_t)lo);
    return TDM_OK;
}

extern "C" void tdm_gpu_host_unregister(tdm_gpu *g, const void *p)
{
    (void)g;
    size_t span;
    if (p && cudaHostUnregister((void *)page_span(p, 1, &span)) != cudaSuccess)
        (void)cudaGetLastError();
}

extern "C" tdm_status tdm_gpu_upload(tdm_gpu *g, void *dst, const void *src, size_t bytes,
                                     tdm_error *err)
{
    TDM_CU(err, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, g->stream));
    TDM_CU(err, cudaStreamSynchronize(g->stream));
    return TDM_OK;
}

extern "C" tdm_status tdm_gpu_download(tdm_gpu *g, void *dst, const void *src, size_t bytes,
                                       tdm_error *err)
{
    TDM_CU(err, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, g->stream));
    TDM_CU(err, cudaStreamSynchronize(g->stream));
    return TDM_OK;
}

extern "C" tdm_status tdm_gpu_upload_async(tdm_gpu *g, void *dst, const void *src, size_t bytes, tdm_error *err)
{
    TDM_CU(err, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, g->stream));
    return TDM_OK;
}

extern "C" tdm_status tdm_gpu_download_async(tdm_gpu *g, void *dst, const void *src, size_t bytes, tdm_error *err)
{
    TDM_CU(err, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, g->stream));
    return TDM_OK;
}

extern "C" tdm_status tdm_gpu_copy(tdm_gpu *g, void *dst, const void *src, size_t bytes,
                                   tdm_error *err)
{
    TDM_CU(err, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, g->stream));
    return TDM_OK;
}

extern "C" tdm_status tdm_gpu_copy_async(tdm_gpu *g, void *dst, const void *src, size_t bytes,
                                         tdm_error *err)
{
    TDM_CU(err, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, g->copy_stream));
    return TDM_OK;
}

extern "C" tdm_status tdm_gpu_wait_copies(tdm_gpu *g, tdm_error *err)
{
    TDM_CU(err, cudaEventRecord(g->copy_done, g->copy_stream));
    TDM_CU(err, cudaStreamWaitEvent(g->stream, g->copy_done, 0));
    return TDM_OK;
}

extern "C" tdm_status tdm_gpu_wait_compute(tdm_gpu *g, tdm_error *err)
{
    TDM_CU(err, cudaEventRecord(g->compute_done, g->stream));
    TDM_CU(err, cudaStreamWaitEvent(g->copy_stream, g->compute_done, 0));
    return TDM_OK;
}

extern "C" tdm_status tdm_gpu_fence_copies(tdm_gpu *g, int fence, tdm_error *err)
{
    TDM_REQUIRE(err, fence >= 0 && fence < TDM_GPU_FENCES, "gpu: fence %d out of range", fence);
    TDM_CU(err, cudaEventRecord(g->fences[fence], g->copy_stream));
    return TDM_OK;
}

extern "C" tdm_status tdm_gpu_fence_wait_host(tdm_gpu *g, int fence, tdm_error *err)
{
    TDM_REQUIRE(err, fence >= 0 && fence < TDM_GPU_FENCES, "gpu: fence %d out of range", fence);
    TDM_CU(err, cudaEventSynchronize(g->fences[fence]));
    return TDM_OK;
}

extern "C" tdm_status tdm_gpu_fence_wait_compute(tdm_gpu *g, int fence, tdm_error *err)
{
    TDM_REQUIRE(err, fence >= 0 && fence < TDM_GPU_FENCES, "gpu: fence %d out of range", fence);
    TDM_CU(err, cudaStreamWaitEvent(g->stream, g->fences[fence], 0));
    return TDM_OK;
}

extern "C" tdm_status tdm_gpu_side_begin(tdm_gpu *g, tdm_error *err)
{
    TDM_REQUIRE(err, g->launch == g->stream, "gpu: side stream already open");
    TDM_CU(err, cudaEventRecord(g->side_fork, g->stream));
    TDM_CU(err, cudaStreamWaitEvent(g->side_stream, g->side_fork, 0));
    g->launch = g->side_stream;
    return TDM_OK;
}

extern "C" tdm_status tdm_gpu_side_end(tdm_gpu *g, tdm_error *err)
{
    g->launch = g->stream; /* first: launches go back to the compute stream whatever happens */
    TDM_CU(err, cudaEventRecord(g->side_done, g->side_stream));
    return TDM_OK;
}

extern "C" tdm_status tdm_gpu_side_join(tdm_gpu *g, tdm_error *err)
{
    TDM_CU(err, cudaStreamWaitEvent(g->stream, g->side_done, 0));
    return TDM_OK;
}

extern "C" tdm_status tdm_gpu_memset(tdm_gpu *g, void *dst, int byte, size_t bytes,
                                     tdm_error *err)
{
    TDM_CU(err, cudaMemsetAsync(dst, byte, bytes, g->stream));
    return TDM_OK;
}

__global__ void fill_f32(float *dst, float v, size_t n)
{
    tdm_pdl_enter();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = v;
}

extern "C" tdm_status tdm_gpu_fill_f32(tdm_gpu *g, float *dst, float v, size_t n, tdm_error *err)
{
    if (n == 0)
        return TDM_OK;
    unsigned blocks = (unsigned)((n + 255) / 256);
    if (blocks > 4096)
        blocks = 4096;
    TDM_LAUNCH(err, g, fill_f32, blocks, 256, 0, dst, v, n);
    return TDM_OK;
}

extern "C" tdm_status tdm_gpu_sync(tdm_gpu *g, tdm_error *err)
{
    TDM_CU(err, cudaStreamSynchronize(g->stream));
    TDM_CU(err, cudaGetLastError());
    return TDM_OK;
}

extern "C" tdm_status tdm_gpu_sync_pausing(tdm_gpu *g, tdm_error *err)
{
    TDM_CU(err, cudaEventRecord(g->sync_done, g->stream));
    cudaError_t e;
    while ((e = cudaEventQuery(g->sync_done)) == cudaErrorNotReady)
        for (int i = 0; i < 32; i++) /* ~2 us between polls */
            tdm_cpu_relax();
    TDM_CU(err, e);
    return tdm_gpu_sync(g, err); /* nothing left to wait for: reports the stream's errors */
}

extern "C" tdm_status tdm_gpu_set_tuning(tdm_gpu *g, const tdm_gpu_tuning *t, tdm_error *err)
{
    TDM_REQUIRE(err, t, "gpu tuning: NULL");
    TDM_REQUIRE(err, t->matvec_wpr == 0 || t->matvec_wpr == 1 || t->matvec_wpr == 2 || t->matvec_wpr == 4,
                "gpu tuning: matvec_wpr %d not in {0, 1, 2, 4}", t->matvec_wpr);
    TDM_REQUIRE(err, t->matvec_rows >= 0 && t->matvec_rows <= 2, "gpu tuning: matvec_rows %d not in {0, 1, 2}",
                t->matvec_rows);
    TDM_REQUIRE(err, t->moe_tile == 0 || t->moe_tile == 8 || t->moe_tile == 16 || t->moe_tile == 32,
                "gpu tuning: moe_tile %d not in {0, 8, 16, 32}", t->moe_tile);
    TDM_REQUIRE(err, t->pdl >= -1 && t->pdl <= 1, "gpu tuning: pdl %d not in {-1, 0, 1}", t->pdl);
    g->tune = *t;
    return TDM_OK;
}

extern "C" tdm_status tdm_gpu_mark(tdm_gpu *g, int mark, tdm_error *err)
{
    TDM_REQUIRE(err, mark >= 0 && mark < TDM_GPU_MARKS, "gpu: mark %d out of range", mark);
    TDM_CU(err, cudaEventRecord(g->marks[mark], g->stream));
    return TDM_OK;
}

extern "C" tdm_status tdm_gpu_elapsed_ms(tdm_gpu *g, int from, int to, float *ms, tdm_error *err)
{
    TDM_REQUIRE(err, from >= 0 && from < TDM_GPU_MARKS && to >= 0 && to < TDM_GPU_MARKS,
                "gpu: marks %d, %d out of range", from, to);
    TDM_CU(err, cudaEventSynchronize(g->marks[to]));
    TDM_CU(err, cudaEventElapsedTime(ms, g->marks[from], g->marks[to]));
    return TDM_OK;
}
