/* gpu_none: the gpu.h API in builds without CUDA. Every entry point fails
 * with TDM_ERR_UNSUPPORTED so callers fall back to the CPU path. */
#ifndef TDM_HAVE_CUDA

#include "gpu.h"

#define NO_CUDA(err, what) \
    tdm_error_set((err), TDM_ERR_UNSUPPORTED, "%s: this build has no CUDA support", (what))

bool tdm_gpu_available(void) { return false; }

tdm_status tdm_gpu_create(int device, tdm_gpu **out, tdm_error *err)
{
    (void)device;
    if (out)
        *out = NULL;
    return NO_CUDA(err, "gpu create");
}

void tdm_gpu_free(tdm_gpu *g) { (void)g; }

tdm_status tdm_gpu_query(tdm_gpu *g, tdm_gpu_info *info, tdm_error *err)
{
    (void)g, (void)info;
    return NO_CUDA(err, "gpu query");
}

tdm_status tdm_gpu_alloc(tdm_gpu *g, size_t bytes, void **dptr, tdm_error *err)
{
    (void)g, (void)bytes;
    if (dptr)
        *dptr = NULL;
    return NO_CUDA(err, "gpu alloc");
}

void tdm_gpu_release(tdm_gpu *g, void *dptr) { (void)g, (void)dptr; }

tdm_status tdm_gpu_alloc_host(tdm_gpu *g, size_t bytes, void **hptr, tdm_error *err)
{
    (void)g, (void)bytes;
    if (hptr)
        *hptr = NULL;
    return NO_CUDA(err, "gpu alloc_host");
}

void tdm_gpu_release_host(tdm_gpu *g, void *hptr) { (void)g, (void)hptr; }

tdm_status tdm_gpu_host_register(tdm_gpu *g, const void *p, size_t bytes, const void **dev, tdm_error *err)
{
    (void)g, (void)p, (void)bytes;
    if (dev)
        *dev = NULL;
    return NO_CUDA(err, "gpu host_register");
}

void tdm_gpu_host_unregister(tdm_gpu *g, const void *p) { (void)g, (void)p; }

tdm_status tdm_gpu_upload(tdm_gpu *g, void *dst, const void *src, size_t bytes, tdm_error *err)
{
    (void)g, (void)dst, (void)src, (void)bytes;
    return NO_CUDA(err, "gpu upload");
}

tdm_status tdm_gpu_download(tdm_gpu *g, void *dst, const void *src, size_t bytes, tdm_error *err)
{
    (void)g, (void)dst, (void)src, (void)bytes;
    return NO_CUDA(err, "gpu download");
}

tdm_status tdm_gpu_upload_async(tdm_gpu *g, void *dst, const void *src, size_t bytes, tdm_error *err)
{
    return tdm_gpu_upload(g, dst, src, bytes, err);
}

tdm_status tdm_gpu_download_async(tdm_gpu *g, void *dst, const void *src, size_t bytes, tdm_error *err)
{
    return tdm_gpu_download(g, dst, src, bytes, err);
}

tdm_status tdm_gpu_copy(tdm_gpu *g, void *dst, const void *src, size_t bytes, tdm_error *err)
{
    (void)g, (void)dst, (void)src, (void)bytes;
    return NO_CUDA(err, "gpu copy");
}

tdm_status tdm_gpu_copy_async(tdm_gpu *g, void *dst, const void *src, size_t bytes, tdm_error *err)
{
    (void)g, (void)dst, (void)src, (void)bytes;
    return NO_CUDA(err, "gpu copy_async");
}

tdm_status tdm_gpu_wait_copies(tdm_gpu *g, tdm_error *err)
{
    (void)g;
    return NO_CUDA(err, "gpu wait_copies");
}

tdm_status tdm_gpu_wait_compute(tdm_gpu *g, tdm_error *err)
{
    (void)g;
    return NO_CUDA(err, "gpu wait_compute");
}

tdm_status tdm_gpu_fence_copies(tdm_gpu *g, int fence, tdm_error *err)
{
    (void)g, (void)fence;
    return NO_CUDA(err, "gpu fence_copies");
}

tdm_status tdm_gpu_fence_wait_host(tdm_gpu *g, int fence, tdm_error *err)
{
    (void)g, (void)fence;
    return NO_CUDA(err, "gpu fence_wait_host");
}

tdm_status tdm_gpu_fence_wait_compute(tdm_gpu *g, int fence, tdm_error *err)
{
    (void)g, (void)fence;
    return NO_CUDA(err, "gpu fence_wait_compute");
}

tdm_status tdm_gpu_memset(tdm_gpu *g, void *dst, int byte, size_t bytes, tdm_error *err)
{
    (void)g, (void)dst, (void)byte, (void)bytes;
    return NO_CUDA(err, "gpu memset");
}

tdm_status tdm_gpu_fill_f32(tdm_gpu *g, float *dst, float v, size_t n, tdm_error *err)
{
    (void)g, (void)dst, (void)v, (void)n;
    return NO_CUDA(err, "gpu fill_f32");
}

tdm_status tdm_gpu_side_begin(tdm_gpu *g, tdm_error *err)
{
    (void)g;
    return NO_CUDA(err, "gpu side stream");
}

tdm_status tdm_gpu_side_end(tdm_gpu *g, tdm_error *err)
{
    (void)g;
    return NO_CUDA(err, "gpu side stream");
}

tdm_status tdm_gpu_side_join(tdm_gpu *g, tdm_error *err)
{
    (void)g;
    return NO_CUDA(err, "gpu side stream");
}

tdm_status tdm_gpu_sync(tdm_gpu *g, tdm_error *err)
{
    (void)g;
    return NO_CUDA(err, "gpu sync");
}

tdm_status tdm_gpu_sync_pausing(tdm_gpu *g, tdm_error *err) { return tdm_gpu_sync(g, err); }

tdm_status tdm_gpu_mark(tdm_gpu *g, int mark, tdm_error *err)
{
    (void)g, (void)mark;
    return NO_CUDA(err, "gpu mark");
}

tdm_status tdm_gpu_elapsed_ms(tdm_gpu *g, int from, int to, float *ms, tdm_error *err)
{
    (void)g, (void)from, (void)to, (void)ms;
    return NO_CUDA(err, "gpu elapsed_ms");
}

tdm_status tdm_gpu_set_tuning(tdm_gpu *g, const tdm_gpu_tuning *t, tdm_error *err)
{
    (void)g, (void)t;
    return NO_CUDA(err, "gpu set_tuning");
}

bool tdm_gpu_type_supported(tdm_qtype t)
{
    (void)t;
    return false;
}

int tdm_gpu_weight_align(tdm_qtype t)
{
    (void)t;
    return 0;
}

tdm_status tdm_gpu_matvec(tdm_gpu *g, tdm_qtype wt, const void *w, int64_t rows, int64_t k,
                          const float *x, const void *xq, int ntok, float *y, bool accumulate,
                          tdm_error *err)
{
    (void)g, (void)wt, (void)w, (void)rows, (void)k, (void)x, (void)xq, (void)ntok, (void)y, (void)accumulate;
    return NO_CUDA(err, "gpu matvec");
}

tdm_status tdm_gpu_matvec_pair(tdm_gpu *g, const tdm_gpu_mat *a, const tdm_gpu_mat *b, int64_t k, const float *x,
                               const void *xq, float *y, bool accumulate, tdm_error *err)
{
    (void)g, (void)a, (void)b, (void)k, (void)x, (void)xq, (void)y, (void)accumulate;
    return NO_CUDA(err, "gpu matvec pair");
}

bool tdm_gpu_matvec_pair_one_launch(tdm_qtype a, tdm_qtype b, int64_t k, bool xq)
{
    (void)a, (void)b, (void)k, (void)xq;
    return false;
}

size_t tdm_gpu_matmul_scratch_bytes(int64_t chunk_rows, int64_t k, int64_t ntok)
{
    (void)chunk_rows, (void)k, (void)ntok;
    return 0;
}

tdm_status tdm_gpu_matmul(tdm_gpu *g, tdm_qtype wt, const void *w, int64_t rows, int64_t k,
                          const float *x, int64_t ntok, float *y, void *scratch,
                          size_t scratch_bytes, tdm_error *err)
{
    (void)g, (void)wt, (void)w, (void)rows, (void)k, (void)x, (void)ntok, (void)y, (void)scratch,
        (void)scratch_bytes;
    return NO_CUDA(err, "gpu matmul");
}

tdm_status tdm_gpu_dequant_f16(tdm_gpu *g, tdm_qtype wt, const void *w, int64_t rows, int64_t k,
                               uint16_t *dst, tdm_error *err)
{
    (void)g, (void)wt, (void)w, (void)rows, (void)k, (void)dst;
    return NO_CUDA(err, "gpu dequant_f16");
}

tdm_status tdm_gpu_rmsnorm(tdm_gpu *g, const float *x, const float *w, float *y, void *yq,
                           int64_t n_rows, int64_t n, int64_t stride, float eps, tdm_error *err)
{
    (void)g, (void)x, (void)w, (void)y, (void)yq, (void)n_rows, (void)n, (void)stride, (void)eps;
    return NO_CUDA(err, "gpu rmsnorm");
}

tdm_status tdm_gpu_rmsnorm_gated(tdm_gpu *g, const float *x, const float *z, const float *w,
                                 float *y, void *yq, int64_t n_rows, int64_t n, int64_t group,
                                 float eps, tdm_error *err)
{
    (void)g, (void)x, (void)z, (void)w, (void)y, (void)yq, (void)n_rows, (void)n, (void)group, (void)eps;
    return NO_CUDA(err, "gpu rmsnorm_gated");
}

tdm_status tdm_gpu_attn_prep(tdm_gpu *g, const tdm_gpu_attn_in *in, const int32_t *pos, int64_t ntok,
                             float *q, float *gate, uint16_t *kc, uint16_t *vc, int64_t n_ctx,
                             tdm_error *err)
{
    (void)g, (void)in, (void)pos, (void)ntok, (void)q, (void)gate, (void)kc, (void)vc, (void)n_ctx;
    return NO_CUDA(err, "gpu attn_prep");
}

size_t tdm_gpu_attention_scratch_bytes(const tdm_gpu *g, int64_t n_head, int64_t head_dim, int64_t n_ctx)
{
    (void)g, (void)n_head, (void)head_dim, (void)n_ctx;
    return 0;
}

tdm_status tdm_gpu_attention(tdm_gpu *g, const float *q, const uint16_t *kc, const uint16_t *vc,
                             const float *gate, float *o, int64_t ntok, int64_t n_head,
                             int64_t n_kv, int64_t head_dim, int64_t n_ctx, const int32_t *pos,
                             float scale, void *scratch, size_t scratch_bytes, tdm_error *err)
{
    (void)g, (void)q, (void)kc, (void)vc, (void)gate, (void)o, (void)ntok, (void)n_head,
        (void)n_kv, (void)head_dim, (void)n_ctx, (void)pos, (void)scale, (void)scratch,
        (void)scratch_bytes;
    return NO_CUDA(err, "gpu attention");
}

tdm_status tdm_gpu_ssm_conv(tdm_gpu *g, const float *u, const float *w, float *state, const int32_t *pos, float *y,
                            int64_t ntok, int64_t channels, int64_t kernel, tdm_error *err)
{
    (void)g, (void)u, (void)w, (void)state, (void)pos, (void)y, (void)ntok, (void)channels, (void)kernel;
    return NO_CUDA(err, "gpu ssm_conv");
}

tdm_status tdm_gpu_deltanet(tdm_gpu *g, const tdm_gpu_deltanet_shape *sh, const float *qkv,
                            const float *beta, const float *alpha, const float *ssm_a,
                            const float *dt_bias, float *state, float *o, int64_t ntok,
                            tdm_error *err)
{
    (void)g, (void)sh, (void)qkv, (void)beta, (void)alpha, (void)ssm_a, (void)dt_bias,
        (void)state, (void)o, (void)ntok;
    return NO_CUDA(err, "gpu deltanet");
}

bool tdm_gpu_deltanet_step_fits(const tdm_gpu_deltanet_shape *sh, int64_t kernel, bool copy)
{
    (void)sh, (void)kernel, (void)copy;
    return false;
}

tdm_status tdm_gpu_deltanet_step(tdm_gpu *g, const tdm_gpu_deltanet_shape *sh,
                                 const tdm_gpu_deltanet_step_io *io, tdm_error *err)
{
    (void)g, (void)sh, (void)io;
    return NO_CUDA(err, "gpu deltanet_step");
}

size_t tdm_gpu_argmax_scratch_bytes(void) { return 0; }

tdm_status tdm_gpu_argmax(tdm_gpu *g, const float *x, int64_t n, void *scratch, int32_t *out, tdm_error *err)
{
    (void)g, (void)x, (void)n, (void)scratch, (void)out;
    return NO_CUDA(err, "gpu argmax");
}

tdm_status tdm_gpu_router(tdm_gpu *g, const float *logits, int64_t ntok, int64_t n_expert,
                          int64_t k, bool renorm, int32_t *ids, float *weights, tdm_error *err)
{
    (void)g, (void)logits, (void)ntok, (void)n_expert, (void)k, (void)renorm, (void)ids,
        (void)weights;
    return NO_CUDA(err, "gpu router");
}

int64_t tdm_gpu_moe_h_stride(const tdm_gpu_moe_layer *L)
{
    int64_t s = L->n_ff;
    if (L->shared && L->shared->n_ff > s)
        s = L->shared->n_ff;
    return s;
}

tdm_status tdm_gpu_moe_gate_up(tdm_gpu *g, const tdm_gpu_moe_layer *L, const float *x,
                               const void *xq, const int32_t *ids, int64_t ntok, int64_t k, float *h,
                               tdm_error *err)
{
    (void)g, (void)L, (void)x, (void)xq, (void)ids, (void)ntok, (void)k, (void)h;
    return NO_CUDA(err, "gpu moe_gate_up");
}

tdm_status tdm_gpu_router_shared(tdm_gpu *g, const tdm_gpu_moe_layer *L, const float *logits, int64_t ntok,
                                 int64_t n_expert, int64_t k, bool renorm, int32_t *ids, float *weights,
                                 const float *x, const void *xq, float *h, tdm_error *err)
{
    (void)g, (void)L, (void)logits, (void)ntok, (void)n_expert, (void)k, (void)renorm, (void)ids, (void)weights,
        (void)x, (void)xq, (void)h;
    return NO_CUDA(err, "gpu router_shared");
}

tdm_status tdm_gpu_moe_down(tdm_gpu *g, const tdm_gpu_moe_layer *L, const float *h,
                            const int32_t *ids, const float *weights, int64_t ntok, int64_t k,
                            const float *add, float *y, bool accumulate, tdm_error *err)
{
    (void)g, (void)L, (void)h, (void)ids, (void)weights, (void)ntok, (void)k, (void)add, (void)y,
        (void)accumulate;
    return NO_CUDA(err, "gpu moe_down");
}

size_t tdm_gpu_moe_prefill_scratch_bytes(const tdm_gpu_moe_layer *L, int64_t max_tok, int64_t k)
{
    (void)L, (void)max_tok, (void)k;
    return 0;
}

tdm_status tdm_gpu_moe_prefill(tdm_gpu *g, const tdm_gpu_moe_layer *L, const float *x,
                               const int32_t *ids, const float *weights, int64_t ntok, int64_t k,
                               float *h, const float *add, float *y, bool accumulate,
                               void *scratch, size_t scratch_bytes, tdm_error *err)
{
    (void)g, (void)L, (void)x, (void)ids, (void)weights, (void)ntok, (void)k, (void)h, (void)add,
        (void)y, (void)accumulate, (void)scratch, (void)scratch_bytes;
    return NO_CUDA(err, "gpu moe_prefill");
}

tdm_status tdm_gpu_dequant_row_host(tdm_qtype wt, const void *src, float *dst, int64_t n,
                                    tdm_error *err)
{
    (void)wt, (void)src, (void)dst, (void)n;
    return NO_CUDA(err, "gpu dequant_row_host");
}

#else
typedef int tdm_gpu_none_unused; /* ISO C forbids an empty translation unit */
#endif
