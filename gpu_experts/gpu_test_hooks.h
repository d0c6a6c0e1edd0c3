/* gpu_test_hooks: host-side entry points of the CUDA code for the GPU tests
 * (defined in gpu_quant.cu; only in builds with CUDA, like tests/gpu). They
 * run the very __host__ __device__ code of the kernels on the host. */
#ifndef TDM_GPU_TEST_HOOKS_H
#define TDM_GPU_TEST_HOOKS_H

#include <stdint.h>

#include "quant.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A row decoded through the int8 decoders (dqi8) of a quantised format, as
 * the floats d (q - Z) - m; must equal tdm_dequant_row bit for bit. */
tdm_status tdm_gpu_dequant_i8_row_host(tdm_qtype wt, const void *src, float *dst, int64_t n,
                                       tdm_error *err);

/* The int8-activation path's quantisation of x[0..n) (n a multiple of 32):
 * q[i] and the scale dx[i / 32] of each group of 32, bit for bit as on the
 * device; the kernels multiply the weights by q[i] * dx[i / 32]. */
void tdm_gpu_xq_host(const float *x, int64_t n, int8_t *q, float *dx);

/* ntok rows of k activations (k a multiple of 32) as the int8 copy a norm
 * writes (tdm_gpu_xq8_bytes bytes at copy; bytes past each row's k untouched). */
tdm_status tdm_gpu_xq8_pack_host(const float *x, int64_t ntok, int64_t k, void *copy, tdm_error *err);

/* One row's dot product with x on the int8 path (the kernels' quantisation,
 * shared-memory layout and tdm_q8_rows_part, run on the host). */
tdm_status tdm_gpu_dot_i8_host(tdm_qtype wt, const void *row, int64_t k, const float *x,
                               float *out, tdm_error *err);

#ifdef __cplusplus
}
#endif

#endif
