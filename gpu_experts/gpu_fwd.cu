/* gpu_fwd: element-wise helpers of the resident forward (see gpu_fwd.h). */
#include "gpu_common.cuh"
#include "gpu_fwd.h"

__global__ void add_f32(float *y, const float *x, size_t n)
{
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
    add_f32<<<blocks, 256, 0, g->stream>>>(y, x, n);
    TDM_LAUNCHED(err, "add_f32");
    return TDM_OK;
}
