/* gpu_fwd: element-wise helpers, graphs and the stage probe (see gpu_fwd.h). */
#include "gpu_common.cuh"
#include "gpu_fwd.h"

#include <stdlib.h>

__global__ void add_f32(float *y, const float *x, size_t n)
{
    tdm_pdl_enter();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] += x[i];
}

extern "C" tdm_status tdm_gpu_add_f32(tdm_gpu *g, float *y, const float *x, size_t n, tdm_error *err)
{
    if (n == 0)
        return TDM_OK;
    unsigned blocks = tdm_cdiv((int64_t)n, 256);
    if (blocks > 4096)
        blocks = 4096;
    TDM_LAUNCH(err, g, add_f32, blocks, 256, 0, y, x, n);
    return TDM_OK;
}

#define STAGE_THREADS 256

/* One stage of tdm_gpu_stage_chain: every block sums all of in (the launch
 * before's vector) and the grid's first threads write out. */
__global__ void __launch_bounds__(STAGE_THREADS) stage_kernel(const float *__restrict__ in, float *__restrict__ out)
{
    __shared__ float part[STAGE_THREADS / 32];
    tdm_pdl_enter();
    float s = 0;
    for (int i = threadIdx.x; i < TDM_GPU_STAGE_FLOATS; i += STAGE_THREADS)
        s += in[i];
    s = tdm_warp_sum(s);
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x >> 5] = s;
    __syncthreads();
    float total = 0;
#pragma unroll
    for (int w = 0; w < STAGE_THREADS / 32; w++)
        total += part[w];
    for (int i = blockIdx.x * STAGE_THREADS + threadIdx.x; i < TDM_GPU_STAGE_FLOATS; i += gridDim.x * STAGE_THREADS)
        out[i] = 0.5f * in[i] + total * (1.0f / TDM_GPU_STAGE_FLOATS);
}

extern "C" tdm_status tdm_gpu_stage_chain(tdm_gpu *g, float *a, float *b, int stages, tdm_error *err)
{
    TDM_REQUIRE(err, a && b && a != b && stages >= 1, "gpu stage chain: two distinct buffers and stages >= 1");
    for (int s = 0; s < stages; s++)
        TDM_LAUNCH(err, g, stage_kernel, g->sm_count, STAGE_THREADS, 0, s & 1 ? b : a, s & 1 ? a : b);
    return TDM_OK;
}

struct tdm_gpu_graph {
    cudaGraphExec_t exec;
};

extern "C" tdm_status tdm_gpu_graph_begin(tdm_gpu *g, tdm_error *err)
{
    TDM_CU(err, cudaStreamBeginCapture(g->stream, cudaStreamCaptureModeThreadLocal));
    return TDM_OK;
}

extern "C" void tdm_gpu_graph_abort(tdm_gpu *g)
{
    cudaGraph_t graph = NULL;
    cudaStreamCaptureStatus cs;
    g->launch = g->stream;
    if (cudaStreamIsCapturing(g->stream, &cs) == cudaSuccess && cs != cudaStreamCaptureStatusNone &&
        cudaStreamEndCapture(g->stream, &graph) == cudaSuccess && graph)
        cudaGraphDestroy(graph);
    (void)cudaGetLastError(); /* the capture's error is reported by the call that failed */
}

extern "C" tdm_status tdm_gpu_graph_end(tdm_gpu *g, tdm_gpu_graph **gr, tdm_error *err)
{
    *gr = NULL;
    cudaGraph_t graph = NULL;
    TDM_CU(err, cudaStreamEndCapture(g->stream, &graph));
    tdm_gpu_graph *x = (tdm_gpu_graph *)calloc(1, sizeof *x);
    if (!x) {
        cudaGraphDestroy(graph);
        return tdm_error_set(err, TDM_ERR_OOM, "gpu graph");
    }
    cudaError_t e = cudaGraphInstantiate(&x->exec, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
        free(x);
        return tdm_gpu_cuda_fail(err, e, "cudaGraphInstantiate", __FILE__, __LINE__);
    }
    *gr = x;
    return TDM_OK;
}

extern "C" tdm_status tdm_gpu_graph_launch(tdm_gpu *g, tdm_gpu_graph *gr, tdm_error *err)
{
    TDM_REQUIRE(err, gr && gr->exec, "gpu graph launch: no instantiated graph");
    TDM_CU(err, cudaGraphLaunch(gr->exec, g->stream));
    return TDM_OK;
}

extern "C" void tdm_gpu_graph_free(tdm_gpu_graph *gr)
{
    if (!gr)
        return;
    if (gr->exec)
        cudaGraphExecDestroy(gr->exec);
    free(gr);
}
