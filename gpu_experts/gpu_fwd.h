/* gpu_fwd: element-wise helpers and CUDA graphs of the resident forward
 * (engine/forward_gpu.c), and the dependent-stage probe of the decode bound,
 * in their own plain C header so gpu.h (included by every .cu) stays
 * unchanged. Same conventions as gpu.h: device pointers, compute stream, no
 * sync; in builds without CUDA (gpu_fwd_none.c) TDM_ERR_UNSUPPORTED. */
#ifndef TDM_GPU_FWD_H
#define TDM_GPU_FWD_H

#include "gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y[i] += x[i] for i < n (residual adds after the prompt GEMM). */
tdm_status tdm_gpu_add_f32(tdm_gpu *g, float *y, const float *x, size_t n, tdm_error *err);

/* CUDA graphs of a launch sequence on the compute stream (the per-token
 * decode step). Between tdm_gpu_graph_begin and tdm_gpu_graph_end the
 * context's launches are recorded, not run; no synchronous call (upload,
 * download, sync, alloc) may happen in between. tdm_gpu_graph_end
 * instantiates the recording as a new *gr (the caller frees it with
 * tdm_gpu_graph_free); tdm_gpu_graph_launch replays it on the compute stream
 * with the same arguments (device buffers carry whatever changes). After any
 * failure inside a recording call tdm_gpu_graph_abort ends and discards it. */
typedef struct tdm_gpu_graph tdm_gpu_graph;
tdm_status tdm_gpu_graph_begin(tdm_gpu *g, tdm_error *err);
tdm_status tdm_gpu_graph_end(tdm_gpu *g, tdm_gpu_graph **gr, tdm_error *err);
void tdm_gpu_graph_abort(tdm_gpu *g);
tdm_status tdm_gpu_graph_launch(tdm_gpu *g, tdm_gpu_graph *gr, tdm_error *err);
void tdm_gpu_graph_free(tdm_gpu_graph *gr);

/* The dependent-stage probe of the decode bound (engine/bench_bound.h): what
 * one step of a chain costs when it needs the whole vector the step before
 * wrote. Launches `stages` stages on the compute stream, from a into b, then
 * b into a, and so on: each stage's blocks (one per SM, as a product spans
 * the device) wait for the launch before (programmatic dependent launch where
 * the GPU has it), read all TDM_GPU_STAGE_FLOATS floats it wrote, sum them in
 * the block, and write the next vector (half of each input plus the mean). a
 * and b: device buffers of TDM_GPU_STAGE_FLOATS floats; graph-capturable. */
#define TDM_GPU_STAGE_FLOATS 2048
tdm_status tdm_gpu_stage_chain(tdm_gpu *g, float *a, float *b, int stages, tdm_error *err);

#ifdef __cplusplus
}
#endif

#endif
