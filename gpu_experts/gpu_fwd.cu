/* gpu_fwd: element-wise helpers of the resident forward (see gpu_fwd.h). */
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
