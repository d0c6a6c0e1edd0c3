/* kernels_impl: the per-ISA function tables behind cpu_experts/kernels.h.
 * Internal to cpu_experts/. Each ISA's translation unit exports one table;
 * entries it leaves NULL fall back to the next ISA down (AVX-512 -> AVX2 ->
 * scalar), so every type works under every ISA.
 *
 * Activation formats (ggml layouts, spec gguf.md §2.6):
 *   F32   n floats (a copy; F32/F16/BF16 weights are dotted in float)
 *   Q8_0  per 32: fp16 d, int8 qs[32]                         (34 B)
 *   Q8_1  per 32: fp16 d, fp16 s = fp16(d * sum(qs)), qs[32]  (36 B)
 *   Q8_K  per 256: int8 qs[256], int16 bsums[16], float d, pad (320 B)
 *         (ggml's fields, reordered and padded so that qs starts every
 *         block on a 64-byte boundary when the row buffer is 64-byte
 *         aligned: the SIMD loads then never split a cache line)
 * Rounding, identical in every ISA (x86 llama.cpp's choice for Q8_0/Q8_1,
 * ggml's reference for Q8_K):
 *   Q8_0/Q8_1: amax = max|x|, d = amax/127, id = amax ? 127/amax : 0,
 *              q = round-half-even(x * id) (float multiply, then rint);
 *              d is stored as fp16 (RNE), s uses the unrounded d.
 *   Q8_K:      max = the signed x of largest |x| (first on ties);
 *              iscale = -127/max, q = min(127, round-half-even(iscale * x)),
 *              d = 1/iscale; an all-zero block stores d = 0, q = 0, bsums = 0.
 */
#ifndef TDM_KERNELS_IMPL_H
#define TDM_KERNELS_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels.h"
#include "quant_blocks.h"

/* Quantises x[n] into the activation format the table slot stands for. */
typedef void (*tdm_act_quant_fn)(const float *x, void *xq, int64_t n);
/* One weight row of n elements against one quantised activation. */
typedef float (*tdm_vec_dot_fn)(int64_t n, const void *w, const void *xq);

/* Four consecutive rows (w_stride bytes apart) against one activation:
 * out[i] must equal the table's dot() of row i bit for bit. */
typedef void (*tdm_vec_dot4_fn)(int64_t n, const void *w, size_t w_stride, const void *xq,
                                float *out);

/* One row against four activations (xq_stride bytes apart): out[t] must
 * equal the table's dot() with activation t bit for bit. */
typedef void (*tdm_vec_dott4_fn)(int64_t n, const void *w, const void *xq, size_t xq_stride,
                                 float *out);

typedef struct tdm_kernel_table {
    tdm_act_quant_fn quant[TDM_Q_COUNT]; /* by activation type: F32, Q8_0, Q8_1, Q8_K */
    tdm_vec_dot_fn dot[TDM_Q_COUNT];     /* by weight type */
    tdm_vec_dot4_fn dot4[TDM_Q_COUNT];   /* optional; taken only with the same table's dot */
    tdm_vec_dott4_fn dott4[TDM_Q_COUNT]; /* optional; likewise */
} tdm_kernel_table;

extern const tdm_kernel_table tdm_kernels_scalar;
extern const tdm_kernel_table tdm_kernels_avx2;
extern const tdm_kernel_table tdm_kernels_avx512;
/* Filled in by kernels_avx512.c: the table used when the CPU has AVX512_VNNI. */
extern const tdm_kernel_table tdm_kernels_avx512_vnni;

/* For tests: switches like tdm_cpu_isa_select() but, for TDM_ISA_AVX512,
 * chooses the VNNI or the plain AVX-512 table explicitly.
 * TDM_ERR_UNSUPPORTED when the CPU lacks the ISA (or VNNI when asked). */
tdm_status tdm_cpu_isa_select_variant(tdm_cpu_isa isa, int vnni, tdm_error *err);
/* Whether the CPU (and OS) support AVX512_VNNI. */
int tdm_cpu_has_vnni(void);

/* Activation block sizes in bytes. */
enum { TDM_ACT_Q8_0 = 34, TDM_ACT_Q8_1 = 36, TDM_ACT_Q8_K = 320 };
/* Field offsets of a Q8_K activation block. */
enum { Q8K_QS = 0, Q8K_BSUMS = 256, Q8K_D = 288 };

#endif
