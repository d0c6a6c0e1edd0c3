/* kernels: quantised dot products on the CPU, one implementation per ISA
 * (kernels_scalar.c is the reference; kernels_avx2.c, kernels_avx512.c are
 * compiled with their own target flags), picked once at start from CPUID.
 *
 * Every weight type W has an activation format A = tdm_qtype_get(W)->vec_dot_type
 * (Q8_0, Q8_1, Q8_K; F32 for F32/F16/BF16 weights, which this engine dots in
 * float). Callers quantise an activation row once with tdm_act_quantize() and
 * reuse it for every weight row. All ISAs produce identical activation bytes
 * and identical integer partial sums; only the float accumulation order
 * differs. The dispatch table is the one piece of global state; it is written
 * by tdm_cpu_isa_select() (call it before starting threads) and read-only after.
 */
#ifndef TDM_KERNELS_H
#define TDM_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "quant.h"
#include "status.h"

typedef enum tdm_cpu_isa {
    TDM_ISA_SCALAR = 0,
    TDM_ISA_AVX2,     /* AVX2 + FMA + F16C */
    TDM_ISA_AVX512,   /* F, BW, VL, DQ (+ VNNI used when present) */
    TDM_ISA_COUNT
} tdm_cpu_isa;

/* Best ISA this CPU (and OS, for the AVX-512 state) supports. */
tdm_cpu_isa tdm_cpu_isa_detect(void);
/* Switches the dispatch table; TDM_ERR_UNSUPPORTED if the CPU lacks isa. */
tdm_status tdm_cpu_isa_select(tdm_cpu_isa isa, tdm_error *err);
tdm_cpu_isa tdm_cpu_isa_active(void);
const char *tdm_cpu_isa_name(tdm_cpu_isa isa);

/* Bytes of the quantised activation of n elements for weight type wt. */
size_t tdm_act_row_bytes(tdm_qtype wt, int64_t n);
/* Quantises x[n] into xq (tdm_act_row_bytes(wt, n) bytes) for weight type wt. */
void tdm_act_quantize(tdm_qtype wt, const float *x, void *xq, int64_t n);

/* One weight row (n elements of type wt) dotted with a quantised activation. */
float tdm_vec_dot(tdm_qtype wt, int64_t n, const void *w, const void *xq);

/* Rows r0..r1-1 of a weight matrix against ntok quantised activations:
 * y[t * y_stride + r] = dot(row r, activation t). w points at row 0,
 * rows are w_stride bytes apart, activations xq_stride bytes apart.
 * Single-threaded; callers split rows across threads. */
void tdm_matmul_rows(tdm_qtype wt, int64_t n, const void *w, size_t w_stride, int64_t r0,
                     int64_t r1, const void *xq, size_t xq_stride, int64_t ntok, float *y,
                     size_t y_stride);

#endif
