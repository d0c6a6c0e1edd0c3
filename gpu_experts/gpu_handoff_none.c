/* gpu_handoff_none: gpu_handoff.h in builds without CUDA. */
#ifndef TDM_HAVE_CUDA

#include "gpu_handoff.h"

static tdm_status no_cuda(tdm_error *err, const char *what)
{
    return tdm_error_set(err, TDM_ERR_UNSUPPORTED, "%s: this build has no CUDA support", what);
}

tdm_status tdm_gpu_handoff_publish(tdm_gpu *g, const tdm_gpu_handoff *h, int32_t layer, const float *x,
                                   const int32_t *ids, const float *weights, int32_t ntok, bool direct,
                                   const tdm_gpu_route_order *order, tdm_error *err)
{
    (void)g, (void)h, (void)layer, (void)x, (void)ids, (void)weights, (void)ntok, (void)direct, (void)order;
    return no_cuda(err, "gpu handoff");
}

tdm_status tdm_gpu_handoff_merge(tdm_gpu *g, const tdm_gpu_handoff *h, float *y, int32_t ntok, tdm_error *err)
{
    (void)g, (void)h, (void)y, (void)ntok;
    return no_cuda(err, "gpu handoff");
}

tdm_status tdm_gpu_download_rows_async(tdm_gpu *g, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                                 size_t width, size_t rows, tdm_error *err)
{
    (void)g, (void)dst, (void)dst_pitch, (void)src, (void)src_pitch, (void)width, (void)rows;
    return no_cuda(err, "gpu download");
}

tdm_status tdm_gpu_copy_rows_async(tdm_gpu *g, void *dst, size_t dpitch, const void *src, size_t spitch,
                                   size_t width, size_t rows, tdm_error *err)
{
    (void)g, (void)dst, (void)dpitch, (void)src, (void)spitch, (void)width, (void)rows;
    return no_cuda(err, "gpu copy_rows_async");
}

tdm_status tdm_gpu_prefetch_stage(tdm_gpu *g, const tdm_gpu_prefetch *p, int32_t layer, int32_t prev,
                                  const int32_t *pred, int32_t k, tdm_error *err)
{
    (void)g, (void)p, (void)layer, (void)prev, (void)pred, (void)k;
    return no_cuda(err, "gpu prefetch");
}

tdm_status tdm_gpu_prefetch_hint(tdm_gpu *g, const tdm_gpu_prefetch *p, int32_t layer, const int32_t *pred,
                                 int32_t k, tdm_error *err)
{
    (void)g, (void)p, (void)layer, (void)pred, (void)k;
    return no_cuda(err, "gpu prefetch hint");
}

tdm_status tdm_gpu_prefetch_copy(tdm_gpu *g, const tdm_gpu_prefetch *p, int32_t layer,
                                 const tdm_gpu_direct_experts *src, const tdm_gpu_expert_table *table,
                                 tdm_error *err)
{
    (void)g, (void)p, (void)layer, (void)src, (void)table;
    return no_cuda(err, "gpu prefetch copy");
}

tdm_status tdm_gpu_direct_stage(tdm_gpu *g, const tdm_gpu_prefetch *p, int32_t layer, int32_t prev,
                                const int32_t *ids, int32_t k, const tdm_gpu_direct_experts *src,
                                const tdm_gpu_expert_table *table, tdm_error *err)
{
    (void)g, (void)p, (void)layer, (void)prev, (void)ids, (void)k, (void)src, (void)table;
    return no_cuda(err, "gpu direct stage");
}

tdm_status tdm_gpu_slot_device_new(tdm_gpu *g, size_t slot_bytes, int staging, int spare, const void *direct,
                                   size_t direct_bytes, tdm_expert_device **out, tdm_error *err)
{
    (void)g, (void)slot_bytes, (void)staging, (void)spare, (void)direct, (void)direct_bytes;
    *out = NULL;
    return no_cuda(err, "slot device");
}

void tdm_gpu_slot_device_free(tdm_expert_device *d) { (void)d; }

void *tdm_gpu_slot_device_spare(tdm_expert_device *d)
{
    (void)d;
    return NULL;
}

#endif
