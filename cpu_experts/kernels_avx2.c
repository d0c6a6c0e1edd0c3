/* AVX2 + FMA + F16C kernels (compiled with -mavx2 -mfma -mf16c).
 *
 * Activations: the same bytes as the scalar quantiser (float multiply, then
 * round-half-even; see kernels_impl.h). Dots: 8-bit integer products with
 * maddubs (u8 x s8 -> pairs of int16, no saturation possible for these value
 * ranges), madd with the integer scales into int32 lanes, so the integer part
 * of every block equals the scalar one; only the float accumulation order
 * differs (8 lanes with FMA, one horizontal add at the end).
 */
#include <immintrin.h>
#include <math.h>

#include "kernels_impl.h"
#include "kernels_x86.h"

/* ---- activation quantisation ------------------------------------------- */

INLINE void quant_block32(const float *x, uint8_t *out, int q81)
{
    __m256 v[4], m = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_loadu_ps(x + 8 * i);
        m = _mm256_max_ps(m, abs_ps(v[i]));
    }
    float amax = hmax_ps(m);
    float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
    __m256 s = _mm256_set1_ps(id);
    __m256i q[4];
    for (int i = 0; i < 4; i++)
        q[i] = round_mul(v[i], s);
    __m256i packed = pack_i8(q[0], q[1], q[2], q[3]);
    _mm256_storeu_si256((__m256i *)(out + (q81 ? 4 : 2)), packed);
    uint16_t dh = (uint16_t)_cvtss_sh(d, 0);
    memcpy(out, &dh, 2);
    if (q81) {
        __m256i sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        uint16_t sh = (uint16_t)_cvtss_sh(d * (float)hsum_i32(sum), 0);
        memcpy(out + 2, &sh, 2);
    }
}

static void quant_q8_0(const float *x, void *xq, int64_t n)
{
    for (int64_t b = 0; b < n / 32; b++)
        quant_block32(x + 32 * b, (uint8_t *)xq + TDM_ACT_Q8_0 * b, 0);
}

static void quant_q8_1(const float *x, void *xq, int64_t n)
{
    for (int64_t b = 0; b < n / 32; b++)
        quant_block32(x + 32 * b, (uint8_t *)xq + TDM_ACT_Q8_1 * b, 1);
}

/* The signed value of largest |x| in a 256-block, first one on ties. */
INLINE float q8k_block_max(const float *x, float *amax_out)
{
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < 256; i += 8)
        m = _mm256_max_ps(m, abs_ps(_mm256_loadu_ps(x + i)));
    float amax = hmax_ps(m);
    *amax_out = amax;
    __m256 am = _mm256_set1_ps(amax);
    for (int i = 0; i < 256; i += 8) {
        int mask = _mm256_movemask_ps(_mm256_cmp_ps(abs_ps(_mm256_loadu_ps(x + i)), am, _CMP_EQ_OQ));
        if (mask)
            return x[i + __builtin_ctz((unsigned)mask)];
    }
    return 0.0f;
}

static void quant_q8_k(const float *x, void *xq, int64_t n)
{
    for (int64_t b = 0; b < n / 256; b++) {
        const float *xb = x + 256 * b;
        uint8_t *out = (uint8_t *)xq + TDM_ACT_Q8_K * b;
        float amax, max = q8k_block_max(xb, &amax), d = 0.0f;
        int16_t bsums[16];
        if (amax == 0.0f) {
            memset(out + Q8K_QS, 0, 256);
            memset(bsums, 0, sizeof bsums);
        } else {
            float iscale = -127.0f / max;
            __m256 s = _mm256_set1_ps(iscale);
            for (int g = 0; g < 8; g++) { /* 32 values = two bsums groups */
                __m256i q[4];
                for (int i = 0; i < 4; i++)
                    q[i] = round_mul(_mm256_loadu_ps(xb + 32 * g + 8 * i), s);
                /* |round(iscale*x)| <= 127 except by one ulp at most: clamp like scalar */
                __m256i hi = _mm256_set1_epi32(127);
                for (int i = 0; i < 4; i++)
                    q[i] = _mm256_min_epi32(q[i], hi);
                _mm256_storeu_si256((__m256i *)(out + Q8K_QS + 32 * g), pack_i8(q[0], q[1], q[2], q[3]));
                bsums[2 * g] = (int16_t)hsum_i32(_mm256_add_epi32(q[0], q[1]));
                bsums[2 * g + 1] = (int16_t)hsum_i32(_mm256_add_epi32(q[2], q[3]));
            }
            d = 1.0f / iscale;
        }
        memcpy(out + Q8K_D, &d, 4);
        memcpy(out + Q8K_BSUMS, bsums, sizeof bsums);
        memset(out + Q8K_D + 4, 0, TDM_ACT_Q8_K - Q8K_D - 4); /* padding: deterministic bytes */
    }
}

static void quant_f32(const float *x, void *xq, int64_t n)
{
    memcpy(xq, x, (size_t)n * sizeof(float));
}

/* ---- float weights ------------------------------------------------------ */

INLINE __m256 load8_f32(const uint8_t *p) { return _mm256_loadu_ps((const float *)p); }
INLINE __m256 load8_f16(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
INLINE __m256 load8_bf16(const uint8_t *p)
{
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

typedef __m256 (*load8_fn)(const uint8_t *p);

/* Four independent accumulators hide the FMA latency; the tail (< 8) is
 * done one element at a time through the same loader on a padded copy. */
INLINE float dot_float(int64_t n, const uint8_t *w, const float *x, load8_fn load, int esize)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(load(w + esize * i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(load(w + esize * (i + 8)), _mm256_loadu_ps(x + i + 8), a1);
        a2 = _mm256_fmadd_ps(load(w + esize * (i + 16)), _mm256_loadu_ps(x + i + 16), a2);
        a3 = _mm256_fmadd_ps(load(w + esize * (i + 24)), _mm256_loadu_ps(x + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8)
        a0 = _mm256_fmadd_ps(load(w + esize * i), _mm256_loadu_ps(x + i), a0);
    if (i < n) {
        uint8_t wt[32] = {0};
        float xt[8] = {0};
        memcpy(wt, w + esize * i, (size_t)(n - i) * esize);
        memcpy(xt, x + i, (size_t)(n - i) * sizeof(float));
        a1 = _mm256_fmadd_ps(load(wt), _mm256_loadu_ps(xt), a1);
    }
    return hsum_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
}

static float dot_f32(int64_t n, const void *w, const void *x) { return dot_float(n, w, x, load8_f32, 4); }
static float dot_f16(int64_t n, const void *w, const void *x) { return dot_float(n, w, x, load8_f16, 2); }
static float dot_bf16(int64_t n, const void *w, const void *x) { return dot_float(n, w, x, load8_bf16, 2); }

/* ---- 32-element blocks against Q8_0 / Q8_1 (drivers in kernels_x86.h) -- */

INLINE __m256i dot_i8(__m256i x, __m256i y) { return sum_pairs(mul_i8_pairs(x, y)); }

STEP32(step_q4_0, w_q4_0, s_dxdy, dot_i8)
STEP32(step_q5_0, w_q5_0, s_dxdy, dot_i8)
STEP32(step_q8_0, w_q8_0, s_dxdy, dot_i8)
STEP32(step_iq4_nl, w_iq4_nl, s_dxdy, dot_i8)
STEP32(step_mxfp4, w_mxfp4, s_mxfp4, dot_i8)
DEFINE_DOTS(dot_q4_0, step_q4_0, TDM_B_Q4_0, 32, TDM_ACT_Q8_0)
DEFINE_DOTS(dot_q5_0, step_q5_0, TDM_B_Q5_0, 32, TDM_ACT_Q8_0)
DEFINE_DOTS(dot_q8_0, step_q8_0, TDM_B_Q8_0, 32, TDM_ACT_Q8_0)
DEFINE_DOTS(dot_iq4_nl, step_iq4_nl, TDM_B_IQ4_NL, 32, TDM_ACT_Q8_0)
DEFINE_DOTS(dot_mxfp4, step_mxfp4, TDM_B_MXFP4, 32, TDM_ACT_Q8_0)

/* Q4_1 / Q5_1: unsigned weights plus the min term m * s of the activation. */
#define STEP32_MIN(name, load)                                                                    \
    INLINE __m256 name(const uint8_t *x, const uint8_t *y, __m256 acc)                         \
    {                                                                                           \
        __m256i p = _mm256_maddubs_epi16(load(x), _mm256_loadu_si256((const __m256i *)(y + 4))); \
        acc = _mm256_fmadd_ps(_mm256_set1_ps(s_dxdy(x, y)), _mm256_cvtepi32_ps(sum_pairs(p)), acc); \
        /* the min term enters one lane only */                                                 \
        return _mm256_add_ps(acc, _mm256_castps128_ps256(_mm_set_ss(m_q81(x, y))));            \
    }
STEP32_MIN(step_q4_1, w_q4_1)
STEP32_MIN(step_q5_1, w_q5_1)
DEFINE_DOTS(dot_q4_1, step_q4_1, TDM_B_Q4_1, 32, TDM_ACT_Q8_1)
DEFINE_DOTS(dot_q5_1, step_q5_1, TDM_B_Q5_1, 32, TDM_ACT_Q8_1)

/* ---- K-quants against Q8_K ---------------------------------------------- */

/* Bit k of every byte of v moved to bit t of that byte, the rest cleared:
 * one 16-bit shift and a mask (for k, t <= 7 the mask drops whatever
 * crossed from the neighbouring byte). */
INLINE __m256i move_bit(__m256i v, int k, int t)
{
    v = k <= t ? _mm256_slli_epi16(v, t - k) : _mm256_srli_epi16(v, k - t);
    return _mm256_and_si256(v, _mm256_set1_epi8((char)(1 << t)));
}

/* Q4_K / Q5_K block: returns the int32 lanes of sum sc*q*y, sets the lanes of
 * the mins sum. */
INLINE __m256i q45k_block(const uint8_t *x, const uint8_t *qs, const uint8_t *qh, const uint8_t *y,
                          __m256i *mins_lanes)
{
    __m256i sc16 = q4k_scales16(x, y, mins_lanes);
    __m256i isum = _mm256_setzero_si256(), low4 = _mm256_set1_epi8(0x0F);
    __m256i hbits = qh ? _mm256_loadu_si256((const __m256i *)qh) : low4;
#pragma GCC unroll 4
    for (int p = 0; p < 4; p++) {
        __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * p));
        __m256i lo = _mm256_and_si256(q, low4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
        if (qh) {
            lo = _mm256_or_si256(lo, move_bit(hbits, 2 * p, 4));
            hi = _mm256_or_si256(hi, move_bit(hbits, 2 * p + 1, 4));
        }
        __m256i p0 = _mm256_maddubs_epi16(lo, q8k_load(y, 2 * p));
        __m256i p1 = _mm256_maddubs_epi16(hi, q8k_load(y, 2 * p + 1));
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p0, bcast16(sc16, 2 * p)));
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p1, bcast16(sc16, 2 * p + 1)));
    }
    return isum;
}

/* acc += d*dy * isum - dmin*dy * mins (the K-quants with a min term). */
INLINE __m256 acc_k_min(__m256 acc, float d, float dmin, float dy, __m256i isum, __m256i mins)
{
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d * dy), _mm256_cvtepi32_ps(isum), acc);
    return _mm256_fnmadd_ps(_mm256_set1_ps(dmin * dy), _mm256_cvtepi32_ps(mins), acc);
}

INLINE __m256 step_q4_k(const uint8_t *x, const uint8_t *y, __m256 acc)
{
    __m256i mins, isum = q45k_block(x, x + Q4K_QS, NULL, y, &mins);
    return acc_k_min(acc, fp16(x + Q4K_D), fp16(x + Q4K_DMIN), tdm_rd_f32(y + Q8K_D), isum, mins);
}

INLINE __m256 step_q5_k(const uint8_t *x, const uint8_t *y, __m256 acc)
{
    __m256i mins, isum = q45k_block(x, x + Q5K_QS, x + Q5K_QH, y, &mins);
    return acc_k_min(acc, fp16(x + Q5K_D), fp16(x + Q5K_DMIN), tdm_rd_f32(y + Q8K_D), isum, mins);
}

INLINE __m256 step_q6_k(const uint8_t *x, const uint8_t *y, __m256 acc)
{
    const __m256i low4 = _mm256_set1_epi8(0x0F), hi2 = _mm256_set1_epi8(0x30);
    __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(x + Q6K_SCALES))), cs = chunk_scales(sc16);
    /* the -32 offset through the bsums: sum sc*(q-32)*y = sum sc*q*y - 32 sum sc*bsum */
    __m256i isum = _mm256_sub_epi32(_mm256_setzero_si256(),
                                    _mm256_slli_epi32(_mm256_madd_epi16(q8k_bsums(y), sc16), 5));
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = x + Q6K_QL + 64 * h;
        __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
        __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
        __m256i qh = _mm256_loadu_si256((const __m256i *)(x + Q6K_QH + 32 * h));
        __m256i q[4] = {
            _mm256_or_si256(_mm256_and_si256(l0, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), hi2)),
            _mm256_or_si256(_mm256_and_si256(l1, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), hi2)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4), _mm256_and_si256(qh, hi2)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                            _mm256_and_si256(_mm256_srli_epi16(qh, 2), hi2)),
        };
#pragma GCC unroll 4
        for (int part = 0; part < 4; part++) {
            int c = 4 * h + part;
            __m256i p = _mm256_maddubs_epi16(q[part], q8k_load(y, c));
            isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, bcast16(cs, c)));
        }
    }
    float d = fp16(x + Q6K_D) * tdm_rd_f32(y + Q8K_D);
    return _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum), acc);
}

/* Q2_K and Q3_K share the 2-bit planes: chunk c = 4h + j holds bits 2j..2j+1
 * of qs[32h .. 32h+31]. */
INLINE __m256i two_bits(const uint8_t *qs, int c)
{
    __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * (c / 4)));
    return _mm256_and_si256(shift_right16(q, 2 * (c % 4)), _mm256_set1_epi8(3));
}

INLINE __m256 step_q2_k(const uint8_t *x, const uint8_t *y, __m256 acc)
{
    __m128i sc8 = _mm_loadu_si128((const __m128i *)(x + Q2K_SCALES)), low4 = _mm_set1_epi8(0x0F);
    __m256i sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(sc8, low4));
    __m256i mn16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc8, 4), low4));
    __m256i mins = _mm256_madd_epi16(q8k_bsums(y), mn16), isum = _mm256_setzero_si256(), cs = chunk_scales(sc16);
#pragma GCC unroll 8
    for (int c = 0; c < 8; c++) {
        __m256i p = _mm256_maddubs_epi16(two_bits(x + Q2K_QS, c), q8k_load(y, c));
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, bcast16(cs, c)));
    }
    return acc_k_min(acc, fp16(x + Q2K_D), fp16(x + Q2K_DMIN), tdm_rd_f32(y + Q8K_D), isum, mins);
}

INLINE __m256 step_q3_k(const uint8_t *x, const uint8_t *y, __m256 acc)
{
    __m256i sc16 = q3k_scales16(x), cs = chunk_scales(sc16);
    /* v = u - 4 with u = low2 | hbit<<2 in 0..7: the -4 goes through the bsums */
    __m256i isum = _mm256_sub_epi32(_mm256_setzero_si256(),
                                    _mm256_slli_epi32(_mm256_madd_epi16(q8k_bsums(y), sc16), 2));
    __m256i hm = _mm256_loadu_si256((const __m256i *)(x + Q3K_HMASK));
#pragma GCC unroll 8
    for (int c = 0; c < 8; c++) {
        __m256i u = _mm256_or_si256(two_bits(x + Q3K_QS, c), move_bit(hm, c, 2));
        __m256i p = _mm256_maddubs_epi16(u, q8k_load(y, c));
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, bcast16(cs, c)));
    }
    float d = fp16(x + Q3K_D) * tdm_rd_f32(y + Q8K_D);
    return _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum), acc);
}

/* IQ4_XS, two sub-blocks per step: one 32-byte load holds sub-blocks 2j
 * (low 128 bits) and 2j+1; its low nibbles are their elements 0..15, the
 * high nibbles 16..31, so each 128-bit lane pairs with one sub-block's
 * activations and scale. */
INLINE __m256 step_iq4_xs(const uint8_t *x, const uint8_t *y, __m256 acc)
{
    const __m256i table = table16(tdm_kvalues_iq4nl), low4 = _mm256_set1_epi8(0x0F);
    __m256i isum = _mm256_setzero_si256(), ls16 = iq4xs_scales16(x);
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        __m256i q = _mm256_loadu_si256((const __m256i *)(x + IQ4XS_QS + 32 * j));
        __m256i wlo = _mm256_shuffle_epi8(table, _mm256_and_si256(q, low4));
        __m256i whi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(q, 4), low4));
        __m256i y0 = q8k_load(y, 2 * j), y1 = q8k_load(y, 2 * j + 1);
        __m256i ylo = _mm256_permute2x128_si256(y0, y1, 0x20), yhi = _mm256_permute2x128_si256(y0, y1, 0x31);
        /* lane 0: the scale of sub-block 2j, lane 1: of 2j + 1 */
        __m256i sc = _mm256_blend_epi32(bcast16(ls16, 2 * j), bcast16(ls16, 2 * j + 1), 0xF0);
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(mul_i8_pairs(wlo, ylo), sc));
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(mul_i8_pairs(whi, yhi), sc));
    }
    float d = fp16(x + IQ4XS_D) * tdm_rd_f32(y + Q8K_D);
    return _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum), acc);
}

DEFINE_DOTS(dot_q2_k, step_q2_k, TDM_B_Q2_K, 256, TDM_ACT_Q8_K)
DEFINE_DOTS(dot_q3_k, step_q3_k, TDM_B_Q3_K, 256, TDM_ACT_Q8_K)
DEFINE_DOTS(dot_q4_k, step_q4_k, TDM_B_Q4_K, 256, TDM_ACT_Q8_K)
DEFINE_DOTS(dot_q5_k, step_q5_k, TDM_B_Q5_K, 256, TDM_ACT_Q8_K)
DEFINE_DOTS(dot_q6_k, step_q6_k, TDM_B_Q6_K, 256, TDM_ACT_Q8_K)
DEFINE_DOTS(dot_iq4_xs, step_iq4_xs, TDM_B_IQ4_XS, 256, TDM_ACT_Q8_K)

#define DOTS(T, f) .dot[TDM_Q_##T] = f, .dot4[TDM_Q_##T] = f##_x4, .dott4[TDM_Q_##T] = f##_t4
const tdm_kernel_table tdm_kernels_avx2 = {
    .quant = {[TDM_Q_F32] = quant_f32, [TDM_Q_Q8_0] = quant_q8_0, [TDM_Q_Q8_1] = quant_q8_1,
              [TDM_Q_Q8_K] = quant_q8_k},
    .dot[TDM_Q_F32] = dot_f32, .dot[TDM_Q_F16] = dot_f16, .dot[TDM_Q_BF16] = dot_bf16,
    DOTS(Q4_0, dot_q4_0), DOTS(Q4_1, dot_q4_1), DOTS(Q5_0, dot_q5_0), DOTS(Q5_1, dot_q5_1),
    DOTS(Q8_0, dot_q8_0), DOTS(IQ4_NL, dot_iq4_nl), DOTS(MXFP4, dot_mxfp4), DOTS(Q2_K, dot_q2_k),
    DOTS(Q3_K, dot_q3_k), DOTS(Q4_K, dot_q4_k), DOTS(Q5_K, dot_q5_k), DOTS(Q6_K, dot_q6_k),
    DOTS(IQ4_XS, dot_iq4_xs),
};
