/* kernels_x86: 256-bit helpers shared by the AVX2 and AVX-512 translation
 * units (each compiles them with its own target flags). Internal. */
#ifndef TDM_KERNELS_X86_H
#define TDM_KERNELS_X86_H

#include <immintrin.h>
#include <string.h>

#include "kernels_impl.h"

#define INLINE static inline __attribute__((always_inline))

/* Sum of the 8 lanes as ((a0+a1)+(a2+a3)) + ((a4+a5)+(a6+a7)): the order
 * hsum4_ps uses for each of its four vectors. */
INLINE float hsum_ps(__m256 v)
{
    __m256 h = _mm256_hadd_ps(v, v);
    h = _mm256_hadd_ps(h, h);
    return _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
}

/* out[i] = hsum_ps(vi), bit for bit, for four vectors at once. */
INLINE void hsum4_ps(__m256 a, __m256 b, __m256 c, __m256 d, float *out)
{
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
}

INLINE int hsum_i32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

INLINE float fp16(const uint8_t *p)
{
    return _cvtsh_ss(tdm_rd_u16(p));
}

INLINE float hmax_ps(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

INLINE __m256 abs_ps(__m256 v)
{
    return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v);
}

/* round-half-even(v * s) as int32: the same operations as the scalar rintf path. */
INLINE __m256i round_mul(__m256 v, __m256 s)
{
    return _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v, s), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

/* Four int32x8 -> 32 int8 in element order, saturating like the scalar clamp. */
INLINE __m256i pack_i8(__m256i a, __m256i b, __m256i c, __m256i d)
{
    __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
    __m256i abcd = _mm256_packs_epi16(ab, cd);
    return _mm256_permutevar8x32_epi32(abcd, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* ---- 8-bit helpers shared by every quantised type ----------------------- */

/* Pair sums of signed x times signed y as 16 int16 (|x| <= 128, |y| <= 127). */
INLINE __m256i mul_i8_pairs(__m256i x, __m256i y)
{
    return _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

INLINE __m256i sum_pairs(__m256i p16)
{
    return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
}

/* 16 packed bytes -> 32 nibbles: low nibbles are elements 0..15, high 16..31. */
INLINE __m256i nibbles32(const uint8_t *qs)
{
    __m128i q = _mm_loadu_si128((const __m128i *)qs);
    __m256i v = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

/* 32 bits (little-endian u32) -> 32 bytes of 0x10 where the bit is set. */
INLINE __m256i fifth_bits32(const uint8_t *qh)
{
    __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)tdm_rd_u32(qh)),
                                        _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                          0x0101010101010101, 0));
    __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
    return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

INLINE __m256i table16(const int8_t *t)
{
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)t));
}

INLINE __m256i shift_right16(__m256i v, int k)
{
    return _mm256_srl_epi16(v, _mm_cvtsi32_si128(k));
}

/* ---- 32-element block weights as 32 int8 (signed) or u8, and their scales */

typedef __m256i (*w32_fn)(const uint8_t *blk);       /* weights as int8 (signed) or u8 */
typedef float (*scale32_fn)(const uint8_t *x, const uint8_t *y);
typedef float (*min32_fn)(const uint8_t *x, const uint8_t *y);

INLINE __m256i w_q4_0(const uint8_t *b) { return _mm256_sub_epi8(nibbles32(b + 2), _mm256_set1_epi8(8)); }
INLINE __m256i w_q4_1(const uint8_t *b) { return nibbles32(b + 4); }
INLINE __m256i w_q5_0(const uint8_t *b)
{
    return _mm256_sub_epi8(_mm256_or_si256(nibbles32(b + 6), fifth_bits32(b + 2)), _mm256_set1_epi8(16));
}
INLINE __m256i w_q5_1(const uint8_t *b) { return _mm256_or_si256(nibbles32(b + 8), fifth_bits32(b + 4)); }
INLINE __m256i w_q8_0(const uint8_t *b) { return _mm256_loadu_si256((const __m256i *)(b + 2)); }
INLINE __m256i w_iq4_nl(const uint8_t *b) { return _mm256_shuffle_epi8(table16(tdm_kvalues_iq4nl), nibbles32(b + 2)); }
INLINE __m256i w_mxfp4(const uint8_t *b) { return _mm256_shuffle_epi8(table16(tdm_kvalues_fp4), nibbles32(b + 1)); }

INLINE float s_dxdy(const uint8_t *x, const uint8_t *y) { return fp16(x) * fp16(y); }
INLINE float s_mxfp4(const uint8_t *x, const uint8_t *y) { return fp16(y) * tdm_e8m0_half(x[0]); }
INLINE float m_q81(const uint8_t *x, const uint8_t *y) { return fp16(x + 2) * fp16(y + 2); }

/* ---- Q8_K activation access and 16-element group scales ---------------- */

/* int16 lane k of each 128-bit lane of v broadcast over that lane (v with
 * the same 8 int16 in both lanes: over all 16). */
INLINE __m256i bcast16(__m256i v, int k)
{
    return _mm256_shuffle_epi8(v, _mm256_set1_epi16((short)((2 * k) | (2 * k + 1) << 8)));
}

/* The int16 scales of 16-element groups 0..15 (in order) rearranged, once
 * per block, so that bcast16(result, c) gives 32-element chunk c's: group
 * 2c's scale in the low 128 bits, 2c+1's in the high (the halves of the
 * maddubs pairs). Even groups go to the low lane, odd ones to the high. */
INLINE __m256i chunk_scales(__m256i sc16)
{
    const __m256i evens_first = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5,
                                                 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
    return _mm256_permute4x64_epi64(_mm256_shuffle_epi8(sc16, evens_first), _MM_SHUFFLE(3, 1, 2, 0));
}

/* Q4_K/Q5_K scales as 8 int16 in both lanes, and the int32 lanes of
 * sum_g bsums[g] * mn[g/2] (the min correction, summed by the caller). */
INLINE __m256i q4k_scales16(const uint8_t *x, const uint8_t *y, __m256i *mins_lanes)
{
    uint64_t sc, mn;
    tdm_q4k_scales_packed(x + Q4K_SCALES, &sc, &mn);
    __m128i m8 = _mm_cvtsi64_si128((long long)mn);
    *mins_lanes = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(y + Q8K_BSUMS)),
                                    _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8)));
    return _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc)));
}

/* IQ4_XS: the 8 sub-block scales minus 32 as int16 in both lanes. */
INLINE __m256i iq4xs_scales16(const uint8_t *x)
{
    uint32_t l = tdm_rd_u32(x + IQ4XS_SL);
    __m128i lo = _mm_cvtsi32_si128((int)(l & 0x0F0F0F0Fu)), hi = _mm_cvtsi32_si128((int)((l >> 4) & 0x0F0F0F0Fu));
    __m128i low = _mm_cvtepu8_epi16(_mm_unpacklo_epi8(lo, hi)); /* nibble of sub-block ib */
    /* (sh >> 2ib) & 3 as (sh << (14 - 2ib)) >> 14 in 16-bit lanes */
    __m128i sh = _mm_set1_epi16((short)tdm_rd_u16(x + IQ4XS_SH));
    __m128i top = _mm_srli_epi16(_mm_mullo_epi16(sh, _mm_setr_epi16(1 << 14, 1 << 12, 1 << 10, 1 << 8, 1 << 6, 1 << 4, 1 << 2, 1)), 14);
    __m128i ls = _mm_sub_epi16(_mm_or_si128(low, _mm_slli_epi16(top, 4)), _mm_set1_epi16(32));
    return _mm256_broadcastsi128_si256(ls);
}

/* Q3_K: the 16 group scales minus 32 as int16, in group order. */
INLINE __m256i q3k_scales16(const uint8_t *x)
{
    uint64_t lo, hi;
    tdm_q3k_scales_packed(x + Q3K_SCALES, &lo, &hi);
    return _mm256_cvtepi8_epi16(_mm_sub_epi8(_mm_set_epi64x((long long)hi, (long long)lo), _mm_set1_epi8(32)));
}

INLINE __m256i q8k_load(const uint8_t *y, int c) { return _mm256_loadu_si256((const __m256i *)(y + Q8K_QS + 32 * c)); }
INLINE __m256i q8k_bsums(const uint8_t *y) { return _mm256_loadu_si256((const __m256i *)(y + Q8K_BSUMS)); }

/* ---- row drivers --------------------------------------------------------
 * Every quantised kernel below is a block step `acc = step(x, y, acc)`; the
 * drivers run it over one row, or over four rows sharing the activation (the
 * per-row reduction and call overhead then count once per four rows, which
 * matters for the 2-3 block rows of down projections). Both reduce with
 * hsum_ps / hsum4_ps, which add in the same order, so a row gets the same
 * float from either driver. */

typedef __m256 (*step_fn)(const uint8_t *x, const uint8_t *y, __m256 acc);

/* The blocks of 512 elements per loop iteration, in the same order (so the
 * sums are the 4-row drivers' bit for bit): two of 256 (k_quant), or 16 of
 * 32. With one block per iteration rows read from DRAM at half the rate or
 * less on a Golden Cove (Sapphire Rapids) core, though from cache both run
 * alike (docs/EXECUTOR.md "The row driver"). The K-quant pair is written
 * out: the same loop with an inner loop over two ran slower there. */
INLINE float dot_row(int64_t nb, const uint8_t *w, int bsize, const uint8_t *y, int ysize, step_fn step,
                     bool k_quant)
{
    __m256 acc = _mm256_setzero_ps();
    int64_t b = 0;
    if (k_quant)
        for (; b + 2 <= nb; b += 2) {
            acc = step(w + b * bsize, y + b * ysize, acc);
            acc = step(w + (b + 1) * bsize, y + (b + 1) * ysize, acc);
        }
    else
        for (; b + 16 <= nb; b += 16)
#pragma GCC unroll 16
            for (int u = 0; u < 16; u++)
                acc = step(w + (b + u) * bsize, y + (b + u) * ysize, acc);
    for (; b < nb; b++)
        acc = step(w + b * bsize, y + b * ysize, acc);
    return hsum_ps(acc);
}

INLINE void dot_row4(int64_t nb, const uint8_t *w, size_t stride, int bsize, const uint8_t *y, int ysize,
                     step_fn step, float *out)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
#pragma GCC unroll 4 /* the 2-3 blocks of a down row in one piece: +12-27% from DRAM (EXECUTOR.md) */
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *x = w + b * bsize, *yb = y + b * ysize;
        a0 = step(x, yb, a0);
        a1 = step(x + stride, yb, a1);
        a2 = step(x + 2 * stride, yb, a2);
        a3 = step(x + 3 * stride, yb, a3);
    }
    hsum4_ps(a0, a1, a2, a3, out);
}

/* One row against four activations (ystride bytes apart): the four inlined
 * steps read the same weight block, so the compiler unpacks it once. */
INLINE void dot_tok4(int64_t nb, const uint8_t *w, int bsize, const uint8_t *y, size_t ystride, int ysize,
                     step_fn step, float *out)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *x = w + b * bsize, *yb = y + b * ysize;
        a0 = step(x, yb, a0);
        a1 = step(x, yb + ystride, a1);
        a2 = step(x, yb + 2 * ystride, a2);
        a3 = step(x, yb + 3 * ystride, a3);
    }
    hsum4_ps(a0, a1, a2, a3, out);
}

#define DEFINE_DOTS(name, step, bsize, belems, ysize)                                           \
    static float name(int64_t n, const void *w, const void *y)                                  \
    {                                                                                            \
        return dot_row(n / (belems), w, bsize, y, ysize, step, (belems) == 256);                 \
    }                                                                                            \
    static void name##_x4(int64_t n, const void *w, size_t stride, const void *y, float *out)   \
    {                                                                                            \
        dot_row4(n / (belems), w, stride, bsize, y, ysize, step, out);                           \
    }                                                                                            \
    static void name##_t4(int64_t n, const void *w, const void *y, size_t ystride, float *out)  \
    {                                                                                            \
        dot_tok4(n / (belems), w, bsize, y, ystride, ysize, step, out);                          \
    }

/* One signed 32-block (the sign trick) against Q8_0, one float scale per
 * block; dot(x, y) returns the int32 lanes of 4-product sums. */
#define STEP32(name, load, scale, dot)                                                            \
    INLINE __m256 name(const uint8_t *x, const uint8_t *y, __m256 acc)                         \
    {                                                                                           \
        __m256i s = dot(load(x), _mm256_loadu_si256((const __m256i *)(y + 2)));                 \
        return _mm256_fmadd_ps(_mm256_set1_ps(scale(x, y)), _mm256_cvtepi32_ps(s), acc);        \
    }

#endif
