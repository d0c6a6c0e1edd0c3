/* gpu_fwd: element-wise helpers of the resident forward (engine/forward_gpu.c),
 * in their own plain C header so gpu.h (included by every .cu) stays unchanged.
 * Same conventions as gpu.h: device pointers, compute stream, no sync; in
 * builds without CUDA (gpu_fwd_none.c) TDM_ERR_UNSUPPORTED. */
#ifndef TDM_GPU_FWD_H
#define TDM_GPU_FWD_H

#include "gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y[i] += x[i] for i < n (residual adds after the prompt GEMM). */
tdm_status tdm_gpu_add_f32(tdm_gpu *g, float *y, const float *x, size_t n, tdm_error *err);

#ifdef __cplusplus
}
#endif

#endif
