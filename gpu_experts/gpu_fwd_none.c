/* gpu_fwd_none: gpu_fwd.h in builds without CUDA. */
#ifndef TDM_HAVE_CUDA

#include "gpu_fwd.h"

tdm_status tdm_gpu_add_f32(tdm_gpu *g, float *y, const float *x, size_t n, tdm_error *err)
{
    (void)g, (void)y, (void)x, (void)n;
    return tdm_error_set(err, TDM_ERR_UNSUPPORTED, "gpu add: this build has no CUDA support");
}

tdm_status tdm_gpu_graph_begin(tdm_gpu *g, tdm_error *err)
{
    (void)g;
    return tdm_error_set(err, TDM_ERR_UNSUPPORTED, "gpu graph: this build has no CUDA support");
}

tdm_status tdm_gpu_graph_end(tdm_gpu *g, tdm_gpu_graph **gr, tdm_error *err)
{
    (void)g, (void)gr;
    return tdm_error_set(err, TDM_ERR_UNSUPPORTED, "gpu graph: this build has no CUDA support");
}

void tdm_gpu_graph_abort(tdm_gpu *g) { (void)g; }

tdm_status tdm_gpu_graph_launch(tdm_gpu *g, tdm_gpu_graph *gr, tdm_error *err)
{
    (void)g, (void)gr;
    return tdm_error_set(err, TDM_ERR_UNSUPPORTED, "gpu graph: this build has no CUDA support");
}

void tdm_gpu_graph_free(tdm_gpu_graph *gr) { (void)gr; }

tdm_status tdm_gpu_stage_chain(tdm_gpu *g, float *a, float *b, int stages, tdm_error *err)
{
    (void)g, (void)a, (void)b, (void)stages;
    return tdm_error_set(err, TDM_ERR_UNSUPPORTED, "gpu stage chain: this build has no CUDA support");
}

#else
typedef int tdm_gpu_fwd_none_unused;
#endif
