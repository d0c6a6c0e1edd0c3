/* kernels_avx512_body: the 512-bit dot products, compiled twice:
 *   kernels_avx512.c         TDM_VNNI 1 (Makefile's AVX-512 flags incl. VNNI)
 *   kernels_avx512_novnni.c  TDM_VNNI 0 (target pragma without VNNI, because a
 *                            compiler may fuse madd+add into vpdpwssd whenever
 *                            VNNI is enabled, and Skylake-X lacks it)
 * Both produce the same int32 lanes (dpbusd sums the same four products as
 * maddubs+madd), so the two variants return identical floats. Activation
 * quantisation is not defined here: the dispatcher takes the AVX2 one (same
 * bytes, and not on the bandwidth-critical path). Q4_1/Q5_1 fall back to AVX2.
 * The 32-element block types stay 256 bits wide (VNNI on ymm).
 * Requires TDM_VNNI and TDM_AVX512_TABLE to be defined by the includer.
 */
#ifndef TDM_VNNI
#error "define TDM_VNNI before including kernels_avx512_body.h"
#endif

/* ---- 512-bit helpers ---------------------------------------------------- */

static const int16_t k_quad_ramp[32] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                        2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};
static const int16_t k_nib_shift[32] = {0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4,
                                        0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4};

/* int16 lanes: a in the low 256 bits, b in the high. */
INLINE __m512i halves16(int a, int b)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)a)), _mm256_set1_epi16((short)b), 1);
}

/* int16 lanes: g, g+1, g+2, g+3 in the four 128-bit lanes (one 16-element group each). */
INLINE __m512i quad16(int g)
{
    return _mm512_add_epi16(_mm512_loadu_si512(k_quad_ramp), _mm512_set1_epi16((short)g));
}

INLINE __m512i load512(const uint8_t *p) { return _mm512_loadu_si512(p); }
INLINE __m512i bcast256(const uint8_t *p) { return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p)); }

/* y with the sign of x (AVX-512 has no vpsignb); zero x gives zero products anyway. */
INLINE __m512i sign_by(__m512i y, __m512i x)
{
    return _mm512_mask_sub_epi8(y, _mm512_movepi8_mask(x), _mm512_setzero_si512(), y);
}

/* int32 lane i = sum of the products of bytes 4i..4i+3 (u8 x s8). */
INLINE __m512i dot_us(__m512i u, __m512i s)
{
#if TDM_VNNI
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s);
#else
    return _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1));
#endif
}

/* acc += pair sums of u x s, each int16 pair sum times its int16 scale. */
INLINE __m512i dot_us_scaled(__m512i acc, __m512i u, __m512i s, __m512i sc16)
{
    __m512i p = _mm512_maddubs_epi16(u, s);
#if TDM_VNNI
    return _mm512_dpwssd_epi32(acc, p, sc16);
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(p, sc16));
#endif
}

INLINE __m512i q8k_load512(const uint8_t *y, int c) { return load512(y + Q8K_QS + 32 * c); }

/* ---- row drivers (as in kernels_avx2.c): hsum512 / hsum4_512 add in the
 * same order, so the 1-row and 4-row drivers agree bit for bit ---------- */

INLINE __m256 fold512(__m512 v)
{
    return _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
}

INLINE float hsum512(__m512 v) { return hsum_ps(fold512(v)); }

typedef __m512 (*step512_fn)(const uint8_t *x, const uint8_t *y, __m512 acc);

/* Two blocks per iteration, in the same order (the 4-row drivers' sums bit
 * for bit), as kernels_x86.h's dot_row for K-quants: with one block per
 * iteration the AVX-512 K-quant rows read from DRAM at half the rate on
 * Sapphire Rapids (docs/EXECUTOR.md "The row driver"), though from cache
 * both run alike. */
INLINE float dot_row512(int64_t nb, const uint8_t *w, int bsize, const uint8_t *y, int ysize, step512_fn step)
{
    __m512 acc = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        acc = step(w + b * bsize, y + b * ysize, acc);
        acc = step(w + (b + 1) * bsize, y + (b + 1) * ysize, acc);
    }
    if (b < nb)
        acc = step(w + b * bsize, y + b * ysize, acc);
    return hsum512(acc);
}

INLINE void dot_row4_512(int64_t nb, const uint8_t *w, size_t stride, int bsize, const uint8_t *y, int ysize,
                         step512_fn step, float *out)
{
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
#pragma GCC unroll 4 /* as dot_row4 */
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *x = w + b * bsize, *yb = y + b * ysize;
        a0 = step(x, yb, a0);
        a1 = step(x + stride, yb, a1);
        a2 = step(x + 2 * stride, yb, a2);
        a3 = step(x + 3 * stride, yb, a3);
    }
    hsum4_ps(fold512(a0), fold512(a1), fold512(a2), fold512(a3), out);
}

INLINE void dot_tok4_512(int64_t nb, const uint8_t *w, int bsize, const uint8_t *y, size_t ystride, int ysize,
                         step512_fn step, float *out)
{
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
#pragma GCC unroll 2 /* as dot_row512: CPU prompt of the 8-layer synthetic Qwen3.5, 2 threads, +5% */
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *x = w + b * bsize, *yb = y + b * ysize;
        a0 = step(x, yb, a0);
        a1 = step(x, yb + ystride, a1);
        a2 = step(x, yb + 2 * ystride, a2);
        a3 = step(x, yb + 3 * ystride, a3);
    }
    hsum4_ps(fold512(a0), fold512(a1), fold512(a2), fold512(a3), out);
}

#define DEFINE_DOTS512(name, step, bsize)                                                        \
    static float name(int64_t n, const void *w, const void *y)                                  \
    {                                                                                            \
        return dot_row512(n / 256, w, bsize, y, TDM_ACT_Q8_K, step);                             \
    }                                                                                            \
    static void name##_x4(int64_t n, const void *w, size_t stride, const void *y, float *out)   \
    {                                                                                            \
        dot_row4_512(n / 256, w, stride, bsize, y, TDM_ACT_Q8_K, step, out);                     \
    }                                                                                            \
    static void name##_t4(int64_t n, const void *w, const void *y, size_t ystride, float *out)  \
    {                                                                                            \
        dot_tok4_512(n / 256, w, bsize, y, ystride, TDM_ACT_Q8_K, step, out);                    \
    }

/* ---- float weights ------------------------------------------------------ */

typedef __m512 (*load16_fn)(const uint8_t *p, __mmask16 m);

INLINE __m512 l16_f32(const uint8_t *p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
INLINE __m512 l16_f16(const uint8_t *p, __mmask16 m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }
INLINE __m512 l16_bf16(const uint8_t *p, __mmask16 m)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

INLINE float dot_float512(int64_t n, const uint8_t *w, const float *x, load16_fn load, int esize)
{
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    const __mmask16 all = 0xFFFF;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        a0 = _mm512_fmadd_ps(load(w + esize * i, all), _mm512_loadu_ps(x + i), a0);
        a1 = _mm512_fmadd_ps(load(w + esize * (i + 16), all), _mm512_loadu_ps(x + i + 16), a1);
        a2 = _mm512_fmadd_ps(load(w + esize * (i + 32), all), _mm512_loadu_ps(x + i + 32), a2);
        a3 = _mm512_fmadd_ps(load(w + esize * (i + 48), all), _mm512_loadu_ps(x + i + 48), a3);
    }
    for (; i + 16 <= n; i += 16)
        a0 = _mm512_fmadd_ps(load(w + esize * i, all), _mm512_loadu_ps(x + i), a0);
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        a1 = _mm512_fmadd_ps(load(w + esize * i, m), _mm512_maskz_loadu_ps(m, x + i), a1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

static float dot_f32(int64_t n, const void *w, const void *x) { return dot_float512(n, w, x, l16_f32, 4); }
static float dot_f16(int64_t n, const void *w, const void *x) { return dot_float512(n, w, x, l16_f16, 2); }
static float dot_bf16(int64_t n, const void *w, const void *x) { return dot_float512(n, w, x, l16_bf16, 2); }

/* ---- signed 32-element blocks against Q8_0 -------------------------------
 * 256 bits per block (a block is 32 bytes; pairing blocks in a zmm costs
 * more lane inserts than it saves), with VNNI's vpdpbusd on ymm where
 * present; the 1-row and 4-row drivers are kernels_x86.h's. */

INLINE __m256i dot_i8_256(__m256i x, __m256i y)
{
#if TDM_VNNI
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
#else
    return sum_pairs(mul_i8_pairs(x, y));
#endif
}

STEP32(step_q4_0, w_q4_0, s_dxdy, dot_i8_256)
STEP32(step_q5_0, w_q5_0, s_dxdy, dot_i8_256)
STEP32(step_q8_0, w_q8_0, s_dxdy, dot_i8_256)
STEP32(step_iq4_nl, w_iq4_nl, s_dxdy, dot_i8_256)
STEP32(step_mxfp4, w_mxfp4, s_mxfp4, dot_i8_256)
DEFINE_DOTS(dot_q4_0, step_q4_0, TDM_B_Q4_0, 32, TDM_ACT_Q8_0)
DEFINE_DOTS(dot_q5_0, step_q5_0, TDM_B_Q5_0, 32, TDM_ACT_Q8_0)
DEFINE_DOTS(dot_q8_0, step_q8_0, TDM_B_Q8_0, 32, TDM_ACT_Q8_0)
DEFINE_DOTS(dot_iq4_nl, step_iq4_nl, TDM_B_IQ4_NL, 32, TDM_ACT_Q8_0)
DEFINE_DOTS(dot_mxfp4, step_mxfp4, TDM_B_MXFP4, 32, TDM_ACT_Q8_0)

/* ---- K-quants against Q8_K ---------------------------------------------- */

/* Q4_K / Q5_K: register j holds sub-blocks 2j (low nibbles of qs[32j..],
 * low half) and 2j+1 (high nibbles of the same bytes, high half), i.e. 64
 * consecutive elements: a 256-bit broadcast load (no shuffle port) shifted by
 * 0 / 4 per half. */
INLINE __m512i q45k_block512(const uint8_t *x, const uint8_t *qs, const uint8_t *qh, const uint8_t *y,
                             __m256i *mins_lanes)
{
    __m512i scv = _mm512_castsi256_si512(q4k_scales16(x, y, mins_lanes));
    const __m512i low4 = _mm512_set1_epi8(0x0F), one = _mm512_set1_epi8(1), nib = halves16(0, 4);
    /* two accumulators: with VNNI every dpwssd waits for the previous one */
    __m512i hb = qh ? bcast256(qh) : low4, isum[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        __m512i kk = halves16(2 * j, 2 * j + 1);
        __m512i v = _mm512_and_si512(_mm512_srlv_epi16(bcast256(qs + 32 * j), nib), low4);
        if (qh)
            v = _mm512_or_si512(v, _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(hb, kk), one), 4));
        isum[j & 1] = dot_us_scaled(isum[j & 1], v, load512(y + Q8K_QS + 64 * j), _mm512_permutexvar_epi16(kk, scv));
    }
    return _mm512_add_epi32(isum[0], isum[1]);
}

INLINE __m512 step_q45k(const uint8_t *x, const uint8_t *y, __m512 acc, const uint8_t *qs, const uint8_t *qh)
{
    __m256i mins;
    __m512i isum = q45k_block512(x, qs, qh, y, &mins);
    float dy = tdm_rd_f32(y + Q8K_D);
    acc = _mm512_fmadd_ps(_mm512_set1_ps(fp16(x) * dy), _mm512_cvtepi32_ps(isum), acc);
    /* the mins lanes occupy the low half; the zero high half leaves acc unchanged there */
    return _mm512_fnmadd_ps(_mm512_set1_ps(fp16(x + 2) * dy), _mm512_zextps256_ps512(_mm256_cvtepi32_ps(mins)), acc);
}

INLINE __m512 step_q4_k(const uint8_t *x, const uint8_t *y, __m512 acc) { return step_q45k(x, y, acc, x + Q4K_QS, NULL); }
INLINE __m512 step_q5_k(const uint8_t *x, const uint8_t *y, __m512 acc) { return step_q45k(x, y, acc, x + Q5K_QS, x + Q5K_QH); }
DEFINE_DOTS512(dot_q4_k, step_q4_k, TDM_B_Q4_K)
DEFINE_DOTS512(dot_q5_k, step_q5_k, TDM_B_Q5_K)

/* Start value of a block's int32 lanes: -off * sum_g scale[g] * bsums[g]
 * (how the Q6_K -32 and Q3_K -4 offsets are applied). */
INLINE __m512i offset_lanes(const uint8_t *y, __m256i sc16, int log2_off)
{
    __m256i t = _mm256_slli_epi32(_mm256_madd_epi16(q8k_bsums(y), sc16), log2_off);
    return _mm512_zextsi256_si512(_mm256_sub_epi32(_mm256_setzero_si256(), t));
}

INLINE __m512 step_q6_k(const uint8_t *x, const uint8_t *y, __m512 acc)
{
    const __m512i low4 = _mm512_set1_epi8(0x0F), three = _mm512_set1_epi8(3);
    __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(x + Q6K_SCALES)));
    __m512i scv = _mm512_castsi256_si512(sc16), isum = offset_lanes(y, sc16, 5);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        __m512i l = load512(x + Q6K_QL + 64 * h), qh = bcast256(x + Q6K_QH + 32 * h);
        __m512i hb0 = _mm512_and_si512(_mm512_srlv_epi16(qh, halves16(0, 2)), three);
        __m512i hb1 = _mm512_and_si512(_mm512_srlv_epi16(qh, halves16(4, 6)), three);
        __m512i m0 = _mm512_or_si512(_mm512_and_si512(l, low4), _mm512_slli_epi16(hb0, 4));
        __m512i m1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), low4), _mm512_slli_epi16(hb1, 4));
        isum = dot_us_scaled(isum, m0, q8k_load512(y, 4 * h), _mm512_permutexvar_epi16(quad16(8 * h), scv));
        isum = dot_us_scaled(isum, m1, q8k_load512(y, 4 * h + 2), _mm512_permutexvar_epi16(quad16(8 * h + 4), scv));
    }
    float d = fp16(x + Q6K_D) * tdm_rd_f32(y + Q8K_D);
    return _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(isum), acc);
}
DEFINE_DOTS512(dot_q6_k, step_q6_k, TDM_B_Q6_K)

/* Q2_K / Q3_K: chunks c, c+1 (c even) of the 2-bit planes of qs[32(c/4) ..]. */
INLINE __m512i two_bits512(const uint8_t *qs, int c)
{
    __m512i q = bcast256(qs + 32 * (c / 4));
    return _mm512_and_si512(_mm512_srlv_epi16(q, halves16(2 * (c % 4), 2 * (c % 4) + 2)), _mm512_set1_epi8(3));
}

INLINE __m512 step_q2_k(const uint8_t *x, const uint8_t *y, __m512 acc)
{
    __m128i sc8 = _mm_loadu_si128((const __m128i *)(x + Q2K_SCALES)), low4 = _mm_set1_epi8(0x0F);
    __m256i sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(sc8, low4));
    __m256i mn16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc8, 4), low4));
    __m256i mins = _mm256_madd_epi16(q8k_bsums(y), mn16);
    __m512i scv = _mm512_castsi256_si512(sc16), isum = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int c = 0; c < 8; c += 2)
        isum = dot_us_scaled(isum, two_bits512(x + Q2K_QS, c), q8k_load512(y, c),
                             _mm512_permutexvar_epi16(quad16(2 * c), scv));
    float dy = tdm_rd_f32(y + Q8K_D);
    acc = _mm512_fmadd_ps(_mm512_set1_ps(dy * fp16(x + Q2K_D)), _mm512_cvtepi32_ps(isum), acc);
    return _mm512_fnmadd_ps(_mm512_set1_ps(dy * fp16(x + Q2K_DMIN)), _mm512_zextps256_ps512(_mm256_cvtepi32_ps(mins)), acc);
}

INLINE __m512 step_q3_k(const uint8_t *x, const uint8_t *y, __m512 acc)
{
    const __m512i one = _mm512_set1_epi8(1);
    __m256i sc16 = q3k_scales16(x);
    __m512i scv = _mm512_castsi256_si512(sc16), isum = offset_lanes(y, sc16, 2);
    __m512i hm = bcast256(x + Q3K_HMASK);
#pragma GCC unroll 4
    for (int c = 0; c < 8; c += 2) {
        __m512i hb = _mm512_and_si512(_mm512_srlv_epi16(hm, halves16(c, c + 1)), one);
        __m512i u = _mm512_or_si512(two_bits512(x + Q3K_QS, c), _mm512_slli_epi16(hb, 2));
        isum = dot_us_scaled(isum, u, q8k_load512(y, c), _mm512_permutexvar_epi16(quad16(2 * c), scv));
    }
    float d = fp16(x + Q3K_D) * tdm_rd_f32(y + Q8K_D);
    return _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(isum), acc);
}

INLINE __m512 step_iq4_xs(const uint8_t *x, const uint8_t *y, __m512 acc)
{
    const __m512i table = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)tdm_kvalues_iq4nl));
    const __m512i low4 = _mm512_set1_epi8(0x0F), nib_shift = _mm512_loadu_si512(k_nib_shift);
    __m512i scv = _mm512_castsi256_si512(iq4xs_scales16(x)), isum = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int m = 0; m < 4; m++) { /* sub-blocks 2m, 2m+1: 32 bytes -> 64 values */
        __m512i q = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(x + IQ4XS_QS + 32 * m)));
        q = _mm512_shuffle_i64x2(q, q, 0x50); /* 128-bit lanes: q0, q0, q1, q1 */
        __m512i wv = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srlv_epi16(q, nib_shift), low4));
        __m512i yv = q8k_load512(y, 2 * m);
        isum = dot_us_scaled(isum, _mm512_abs_epi8(wv), sign_by(yv, wv),
                             _mm512_permutexvar_epi16(halves16(2 * m, 2 * m + 1), scv));
    }
    float d = fp16(x + IQ4XS_D) * tdm_rd_f32(y + Q8K_D);
    return _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(isum), acc);
}

DEFINE_DOTS512(dot_q2_k, step_q2_k, TDM_B_Q2_K)
DEFINE_DOTS512(dot_q3_k, step_q3_k, TDM_B_Q3_K)
DEFINE_DOTS512(dot_iq4_xs, step_iq4_xs, TDM_B_IQ4_XS)

#define DOTS512(T, f) .dot[TDM_Q_##T] = f, .dot4[TDM_Q_##T] = f##_x4, .dott4[TDM_Q_##T] = f##_t4
const tdm_kernel_table TDM_AVX512_TABLE = {
    .dot[TDM_Q_F32] = dot_f32, .dot[TDM_Q_F16] = dot_f16, .dot[TDM_Q_BF16] = dot_bf16,
    DOTS512(Q4_0, dot_q4_0), DOTS512(Q5_0, dot_q5_0), DOTS512(Q8_0, dot_q8_0),
    DOTS512(IQ4_NL, dot_iq4_nl), DOTS512(MXFP4, dot_mxfp4),
    DOTS512(Q2_K, dot_q2_k), DOTS512(Q3_K, dot_q3_k), DOTS512(Q4_K, dot_q4_k),
    DOTS512(Q5_K, dot_q5_k), DOTS512(Q6_K, dot_q6_k), DOTS512(IQ4_XS, dot_iq4_xs),
};
