/* gpu_quant: the one dequantisation table of the GPU kernels. Each supported
 * weight format is a QT<type> with its block geometry and two decoders:
 * dq8() gives the float values of the 8 elements 8j..8j+7 of one block (unit
 * j; dequant-to-f16, the float-activation path of F32/F16/BF16), and, for the
 * quantised formats, dqi8() gives whole 32-element groups as 8-bit quants with
 * per-16 scale and min (the dp4a path of the decode kernels). Every kernel
 * that reads weights goes through these, so a format is written once. The
 * helpers are __host__ __device__ so that the tests can check both decoders
 * bit for bit against the CPU reference without a GPU. Values are exactly
 * ggml's dequantize_row_* results (gguf.md §2.4-2.5). */
#ifndef TDM_GPU_QUANT_CUH
#define TDM_GPU_QUANT_CUH

#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

#include "gpu_common.cuh"
#include "gpu_xq.cuh"

static __device__ const int8_t tdm_d_kv_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                     1,    13,   25,  38,  53,  69,  89,  113};
static __device__ const int8_t tdm_d_kv_fp4[16] = {0, 1, 2, 3, 4, 6, 8, 12,
                                                   0, -1, -2, -3, -4, -6, -8, -12};
static const int8_t tdm_h_kv_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                          1,    13,   25,  38,  53,  69,  89,  113};
static const int8_t tdm_h_kv_fp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

#ifdef __CUDA_ARCH__
#define TDM_KV_IQ4NL tdm_d_kv_iq4nl
#define TDM_KV_FP4 tdm_d_kv_fp4
#else
#define TDM_KV_IQ4NL tdm_h_kv_iq4nl
#define TDM_KV_FP4 tdm_h_kv_fp4
#endif

TDM_HD float tdm_bits_f32(uint32_t u)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

TDM_HD uint32_t tdm_f32_bits(float f)
{
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
#endif
}

TDM_HD float tdm_half_f32(uint16_t u)
{
#ifdef __CUDA_ARCH__
    return __half2float(__ushort_as_half(u));
#else
    return tdm_fp16_to_fp32(u);
#endif
}

/* Little-endian fields at any byte: the float decoders (dq8) and host code. */
TDM_HD uint16_t tdm_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
TDM_HD uint32_t tdm_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
TDM_HD float tdm_h2f(const uint8_t *p) { return tdm_half_f32(tdm_u16(p)); }

/* ---- loads for the int8 decoders: as wide as the format allows ---- */

/* The alignment (a power of two, at most 16) of byte `off` of every block of
 * a format with blocks of `bytes` bytes, given that the matrix starts aligned
 * to tdm_al(bytes, 0) (gpu.h, tdm_gpu_weight_align): rows and blocks start at
 * multiples of `bytes` from there. Known when compiled, so the loads below
 * never test an address: a branch there kept the next unit's (or row's)
 * loads behind this one's decode. */
__host__ __device__ constexpr int tdm_al(int bytes, int off)
{
    int a = 16;
    while (a > 1 && (bytes % a != 0 || off % a != 0))
        a >>= 1;
    return a;
}

/* A 16-bit field at an address aligned to A (1: MXFP4's 17-byte blocks,
 * odd or even). */
template <int A> TDM_HD uint16_t tdm_ld16(const uint8_t *p)
{
#ifdef __CUDA_ARCH__
    if (A >= 2 || ((uintptr_t)p & 1) == 0)
        return __ldg((const unsigned short *)p);
#endif
    return tdm_u16(p);
}

/* N little-endian words from p, aligned to A: 16-byte loads (A = 16),
 * 4-byte loads (A = 4, 8), or for A = 2 the N aligned words from p & ~3
 * funnel-shifted by 0 or 16 bits with the last two bytes from a predicated
 * 2-byte load, so that the lanes of Q6_K / Q8_0 blocks, which alternate
 * between 4- and 2-byte alignment, do not diverge (never reading outside
 * [p & ~3, p + 4N)). A = 1 (MXFP4): that for an even p, bytes for an odd
 * one. */
template <int N, int A> TDM_HD void tdm_ldw(const uint8_t *p, uint32_t *w)
{
#ifdef __CUDA_ARCH__
    if constexpr (A >= 16 && N % 4 == 0) {
#pragma unroll
        for (int i = 0; i < N / 4; i++) {
            const uint4 v = __ldg((const uint4 *)p + i);
            w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
        }
    } else if constexpr (A >= 4) {
#pragma unroll
        for (int i = 0; i < N; i++)
            w[i] = __ldg((const unsigned int *)p + i);
    } else if (A == 2 || ((uintptr_t)p & 1) == 0) {
        const uintptr_t a = (uintptr_t)p;
        const unsigned int *al = (const unsigned int *)(a & ~(uintptr_t)3);
        const unsigned shift = (unsigned)(a & 2) * 8;
        uint32_t lo = __ldg(al);
#pragma unroll
        for (int i = 0; i < N; i++) {
            const uint32_t hi = i < N - 1 ? __ldg(al + i + 1)
                                : shift ? __ldg((const unsigned short *)(p + 4 * N - 2)) : 0u;
            w[i] = __funnelshift_r(lo, hi, shift);
            lo = hi;
        }
    } else
#endif
        for (int i = 0; i < N; i++)
            w[i] = tdm_u32(p + 4 * i);
}

/* ---- byte-parallel helpers (4 quants per 32-bit word) ---- */

/* Bits 0..3 of h to bit 0 of bytes 0..3 (the four shifted copies of h,
 * at 0, 7, 14 and 21, do not overlap). */
TDM_HD uint32_t tdm_spread4(uint32_t h) { return ((h & 0xFu) * 0x00204081u) & 0x01010101u; }

/* Per byte nibble (bytes of v hold 0..15): the table's int8 value. */
TDM_HD uint32_t tdm_lut_bytes(uint32_t v, const int8_t *kv)
{
    uint32_t r = 0;
    for (int i = 0; i < 4; i++)
        r |= (uint32_t)(uint8_t)kv[(v >> (8 * i)) & 0xF] << (8 * i);
    return r;
}

/* 32 consecutive weights of one block as 8-bit quants: weight i is
 * d[i / 16] * (q_i - Z) - m[i / 16], bit for bit dq8's value (every product
 * is exact, gguf.md §2.5), with Z the format's zero point (QI8::ZERO): the
 * bytes are int8 where Z = 0, else unsigned (0..2Z-1), so the formats that
 * store q + Z need no per-byte sign conversion. q[j] holds elements
 * 4j..4j+3, lowest byte first. */
struct tdm_qg {
    uint32_t q[8];
    float d[2], m[2];
};

TDM_HD void tdm_qg_scales(tdm_qg *g, float d0, float d1, float m0, float m1)
{
    g->d[0] = d0, g->d[1] = d1, g->m[0] = m0, g->m[1] = m1;
}

/* 16 bytes of nibbles (aligned to A), 32-element blocks: low nibbles are
 * elements 0..15, high nibbles 16..31. */
template <int A> TDM_HD void tdm_nibbles32(const uint8_t *qs, uint32_t *q)
{
    uint32_t w[4];
    tdm_ldw<4, A>(qs, w);
    for (int i = 0; i < 4; i++) {
        q[i] = w[i] & 0x0F0F0F0Fu;
        q[i + 4] = (w[i] >> 4) & 0x0F0F0F0Fu;
    }
}

/* Or's bit 4 from the 32 high bits h (element i: bit i) into q. */
TDM_HD void tdm_high_bits32(uint32_t h, uint32_t *q)
{
    for (int i = 0; i < 8; i++)
        q[i] |= tdm_spread4(h >> (4 * i)) << 4;
}

template <int T> struct QT;

/* Plain types: blocks of 8 on the float-activation path (I8 = false). */
template <> struct QT<TDM_Q_F32> {
    static constexpr int BLK = 8, BYTES = 32, UNIT = 8;
    static constexpr bool I8 = false;
    static TDM_HD void dq8(const uint8_t *b, int, float *y)
    {
        for (int i = 0; i < 8; i++)
            y[i] = tdm_bits_f32(tdm_u32(b + 4 * i));
    }
};

template <> struct QT<TDM_Q_F16> {
    static constexpr int BLK = 8, BYTES = 16, UNIT = 8;
    static constexpr bool I8 = false;
    static TDM_HD void dq8(const uint8_t *b, int, float *y)
    {
        for (int i = 0; i < 8; i++)
            y[i] = tdm_h2f(b + 2 * i);
    }
};

template <> struct QT<TDM_Q_BF16> {
    static constexpr int BLK = 8, BYTES = 16, UNIT = 8;
    static constexpr bool I8 = false;
    static TDM_HD void dq8(const uint8_t *b, int, float *y)
    {
        for (int i = 0; i < 8; i++)
            y[i] = tdm_bits_f32((uint32_t)tdm_u16(b + 2 * i) << 16);
    }
};

/* Quantised formats: I8 = true. A unit is NG groups of 32 that one lane
 * decodes together (the groups sharing a load); group(u, i) is the i-th
 * group's index in the block; UNIT = 32 * NG elements. SPLIT: the two halves
 * of a group may have different scales; MIN: some m is nonzero; ZERO: the
 * zero point Z of the quants (tdm_qg). */
template <int NG_, bool SPLIT_, bool MIN_, int ZERO_ = 0> struct QI8 {
    static constexpr bool I8 = true, SPLIT = SPLIT_, MIN = MIN_;
    static constexpr int NG = NG_, UNIT = 32 * NG_, ZERO = ZERO_;
    static TDM_HD int group(int u, int i) { return NG_ * u + i; }
};

/* 32-element blocks: low nibbles are elements 0..15, high nibbles 16..31. */
TDM_HD void tdm_nibbles8(const uint8_t *qs, int j, int *n)
{
    const uint8_t *q = qs + (j & 1) * 8;
    int shift = (j >> 1) * 4;
    for (int i = 0; i < 8; i++)
        n[i] = (q[i] >> shift) & 0xF;
}

template <> struct QT<TDM_Q_Q4_0> : QI8<1, false, false, 8> {
    static constexpr int BLK = 32, BYTES = 18;
    static TDM_HD void dq8(const uint8_t *b, int j, float *y)
    {
        float d = tdm_h2f(b);
        int n[8];
        tdm_nibbles8(b + 2, j, n);
        for (int i = 0; i < 8; i++)
            y[i] = (float)(n[i] - 8) * d;
    }
    static TDM_HD void dqi8(const uint8_t *b, int, tdm_qg *g)
    {
        tdm_nibbles32<tdm_al(BYTES, 2)>(b + 2, g->q);
        float d = tdm_half_f32(tdm_ld16<tdm_al(BYTES, 0)>(b));
        tdm_qg_scales(g, d, d, 0.0f, 0.0f);
    }
};

template <> struct QT<TDM_Q_Q4_1> : QI8<1, false, true> {
    static constexpr int BLK = 32, BYTES = 20;
    static TDM_HD void dq8(const uint8_t *b, int j, float *y)
    {
        float d = tdm_h2f(b), m = tdm_h2f(b + 2);
        int n[8];
        tdm_nibbles8(b + 4, j, n);
        for (int i = 0; i < 8; i++)
            y[i] = (float)n[i] * d + m;
    }
    static TDM_HD void dqi8(const uint8_t *b, int, tdm_qg *g)
    {
        tdm_nibbles32<tdm_al(BYTES, 4)>(b + 4, g->q);
        float d = tdm_half_f32(tdm_ld16<tdm_al(BYTES, 0)>(b)), m = tdm_half_f32(tdm_ld16<tdm_al(BYTES, 2)>(b + 2));
        tdm_qg_scales(g, d, d, -m, -m); /* d q - (-m) rounds as d q + m */
    }
};

template <> struct QT<TDM_Q_Q5_0> : QI8<1, false, false, 16> {
    static constexpr int BLK = 32, BYTES = 22;
    static TDM_HD void dq8(const uint8_t *b, int j, float *y)
    {
        float d = tdm_h2f(b);
        uint32_t h = tdm_u32(b + 2) >> (8 * j);
        int n[8];
        tdm_nibbles8(b + 6, j, n);
        for (int i = 0; i < 8; i++)
            y[i] = (float)((n[i] | (int)(((h >> i) & 1) << 4)) - 16) * d;
    }
    static TDM_HD void dqi8(const uint8_t *b, int, tdm_qg *g)
    {
        uint32_t h;
        tdm_ldw<1, tdm_al(BYTES, 2)>(b + 2, &h);
        tdm_nibbles32<tdm_al(BYTES, 6)>(b + 6, g->q);
        tdm_high_bits32(h, g->q);
        float d = tdm_half_f32(tdm_ld16<tdm_al(BYTES, 0)>(b));
        tdm_qg_scales(g, d, d, 0.0f, 0.0f);
    }
};

template <> struct QT<TDM_Q_Q5_1> : QI8<1, false, true> {
    static constexpr int BLK = 32, BYTES = 24;
    static TDM_HD void dq8(const uint8_t *b, int j, float *y)
    {
        float d = tdm_h2f(b), m = tdm_h2f(b + 2);
        uint32_t h = tdm_u32(b + 4) >> (8 * j);
        int n[8];
        tdm_nibbles8(b + 8, j, n);
        for (int i = 0; i < 8; i++)
            y[i] = (float)(n[i] | (((h >> i) & 1) << 4)) * d + m;
    }
    static TDM_HD void dqi8(const uint8_t *b, int, tdm_qg *g)
    {
        uint32_t h;
        tdm_ldw<1, tdm_al(BYTES, 4)>(b + 4, &h);
        tdm_nibbles32<tdm_al(BYTES, 8)>(b + 8, g->q);
        tdm_high_bits32(h, g->q);
        float d = tdm_half_f32(tdm_ld16<tdm_al(BYTES, 0)>(b)), m = tdm_half_f32(tdm_ld16<tdm_al(BYTES, 2)>(b + 2));
        tdm_qg_scales(g, d, d, -m, -m);
    }
};

template <> struct QT<TDM_Q_Q8_0> : QI8<1, false, false> {
    static constexpr int BLK = 32, BYTES = 34;
    static TDM_HD void dq8(const uint8_t *b, int j, float *y)
    {
        float d = tdm_h2f(b);
        const uint8_t *q = b + 2 + 8 * j;
        for (int i = 0; i < 8; i++)
            y[i] = (float)(int8_t)q[i] * d;
    }
    static TDM_HD void dqi8(const uint8_t *b, int, tdm_qg *g)
    {
        tdm_ldw<8, tdm_al(BYTES, 2)>(b + 2, g->q);
        float d = tdm_half_f32(tdm_ld16<tdm_al(BYTES, 0)>(b));
        tdm_qg_scales(g, d, d, 0.0f, 0.0f);
    }
};

template <> struct QT<TDM_Q_IQ4_NL> : QI8<1, false, false> {
    static constexpr int BLK = 32, BYTES = 18;
    static TDM_HD void dq8(const uint8_t *b, int j, float *y)
    {
        float d = tdm_h2f(b);
        int n[8];
        tdm_nibbles8(b + 2, j, n);
        for (int i = 0; i < 8; i++)
            y[i] = d * (float)TDM_KV_IQ4NL[n[i]];
    }
    static TDM_HD void dqi8(const uint8_t *b, int, tdm_qg *g)
    {
        tdm_nibbles32<tdm_al(BYTES, 2)>(b + 2, g->q);
        for (int i = 0; i < 8; i++)
            g->q[i] = tdm_lut_bytes(g->q[i], TDM_KV_IQ4NL);
        float d = tdm_half_f32(tdm_ld16<tdm_al(BYTES, 0)>(b));
        tdm_qg_scales(g, d, d, 0.0f, 0.0f);
    }
};

/* E8M0 scale, halved because the FP4 table is doubled. */
TDM_HD float tdm_e8m0_half(uint32_t e)
{
    return tdm_bits_f32(e < 2 ? (0x00200000u << e) : ((e - 1) << 23));
}

template <> struct QT<TDM_Q_MXFP4> : QI8<1, false, false> {
    static constexpr int BLK = 32, BYTES = 17;
    static TDM_HD void dq8(const uint8_t *b, int j, float *y)
    {
        float d = tdm_e8m0_half(b[0]);
        int n[8];
        tdm_nibbles8(b + 1, j, n);
        for (int i = 0; i < 8; i++)
            y[i] = (float)TDM_KV_FP4[n[i]] * d;
    }
    static TDM_HD void dqi8(const uint8_t *b, int, tdm_qg *g)
    {
        tdm_nibbles32<tdm_al(BYTES, 1)>(b + 1, g->q);
        for (int i = 0; i < 8; i++)
            g->q[i] = tdm_lut_bytes(g->q[i], TDM_KV_FP4);
        float d = tdm_e8m0_half(b[0]);
        tdm_qg_scales(g, d, d, 0.0f, 0.0f);
    }
};

template <> struct QT<TDM_Q_Q2_K> : QI8<1, true, true> {
    static constexpr int BLK = 256, BYTES = 84;
    static TDM_HD void dq8(const uint8_t *b, int j, float *y)
    {
        int sc = b[j >> 1];
        float dl = tdm_h2f(b + 80) * (float)(sc & 0xF), ml = tdm_h2f(b + 82) * (float)(sc >> 4);
        int h = j >> 4, shift = 2 * ((j & 15) >> 2), l0 = (j & 3) * 8;
        const uint8_t *q = b + 16 + 32 * h + l0;
        for (int i = 0; i < 8; i++)
            y[i] = dl * (float)((q[i] >> shift) & 3) - ml;
    }
    /* group g: 2-bit field g & 3 of the 32 bytes of half g >> 2; scale bytes 2g, 2g + 1 */
    static TDM_HD void dqi8(const uint8_t *b, int g8, tdm_qg *g)
    {
        uint32_t w[8];
        tdm_ldw<8, tdm_al(BYTES, 16)>(b + 16 + 32 * (g8 >> 2), w);
        for (int i = 0; i < 8; i++)
            g->q[i] = (w[i] >> (2 * (g8 & 3))) & 0x03030303u;
        uint32_t sc = tdm_ld16<tdm_al(BYTES, 2)>(b + 2 * g8);
        float d = tdm_half_f32(tdm_ld16<tdm_al(BYTES, 80)>(b + 80)),
              dm = tdm_half_f32(tdm_ld16<tdm_al(BYTES, 82)>(b + 82));
        tdm_qg_scales(g, d * (float)(sc & 0xF), d * (float)((sc >> 8) & 0xF), dm * (float)((sc >> 4) & 0xF),
                      dm * (float)(sc >> 12));
    }
};

/* Q3_K 6-bit scale (minus 32) of 16-element sub-block g (0..15). */
TDM_HD int tdm_q3k_scale(const uint8_t *s, int g)
{
    int k = g & 3, quarter = g >> 2;
    int lo = s[(quarter & 1) * 4 + k];
    lo = quarter < 2 ? (lo & 0xF) : (lo >> 4);
    return (lo | (((s[8 + k] >> (2 * quarter)) & 3) << 4)) - 32;
}

template <> struct QT<TDM_Q_Q3_K> : QI8<1, true, false, 4> {
    static constexpr int BLK = 256, BYTES = 110;
    static TDM_HD void dq8(const uint8_t *b, int j, float *y)
    {
        float dl = tdm_h2f(b + 108) * (float)tdm_q3k_scale(b + 96, j >> 1);
        int h = j >> 4, jj = (j & 15) >> 2, l0 = (j & 3) * 8;
        const uint8_t *q = b + 32 + 32 * h + l0, *hm = b + l0;
        int hbit = 4 * h + jj;
        for (int i = 0; i < 8; i++) {
            int v = ((q[i] >> (2 * jj)) & 3) - (((hm[i] >> hbit) & 1) ? 0 : 4);
            y[i] = dl * (float)v;
        }
    }
    /* group g: 2-bit field g & 3 of the 32 bytes of half g >> 2, high-mask bit g */
    static TDM_HD void dqi8(const uint8_t *b, int g8, tdm_qg *g)
    {
        uint32_t w[8], hm[8];
        tdm_ldw<8, tdm_al(BYTES, 32)>(b + 32 + 32 * (g8 >> 2), w);
        tdm_ldw<8, tdm_al(BYTES, 0)>(b, hm);
        for (int i = 0; i < 8; i++) /* a set high bit: q - 4 >= 0 */
            g->q[i] = ((w[i] >> (2 * (g8 & 3))) & 0x03030303u) | (((hm[i] >> g8) & 0x01010101u) << 2);
        float d = tdm_half_f32(tdm_ld16<tdm_al(BYTES, 108)>(b + 108));
        tdm_qg_scales(g, d * (float)tdm_q3k_scale(b + 96, 2 * g8),
                      d * (float)tdm_q3k_scale(b + 96, 2 * g8 + 1), 0.0f, 0.0f);
    }
};

/* Q4_K / Q5_K 6-bit scales and mins of the sub-blocks 2p and 2p + 1 (p < 4)
 * from the 12 scale bytes as three words s[0..2] (ggml get_scale_min_k4),
 * both at once: byte i of *sc and *mn is sub-block 2p + i's. */
TDM_HD void tdm_scale_min_k4_pair(const uint32_t *s, int p, uint32_t *sc, uint32_t *mn)
{
    /* both forms, then a select: the lanes of a warp decode different
     * sub-blocks, and a branch here would diverge */
    const int sh = 16 * (p & 1);
    const uint32_t a = s[0] >> sh, b = s[1] >> sh, c = s[2] >> sh;
    *sc = p < 2 ? a & 0x3F3Fu : (c & 0x0F0Fu) | ((a >> 2) & 0x3030u);
    *mn = p < 2 ? b & 0x3F3Fu : ((c >> 4) & 0x0F0Fu) | ((b >> 2) & 0x3030u);
}

/* Scales d * sc and mins dmin * mn of the sub-blocks 2p and 2p + 1 of a
 * Q4_K/Q5_K block whose first 16 bytes are hdr (d, dmin, 12 scale bytes). */
TDM_HD void tdm_k4_scales(const uint32_t *hdr, int p, float *d, float *m)
{
    uint32_t sc, mn;
    tdm_scale_min_k4_pair(hdr + 1, p, &sc, &mn);
    const float dd = tdm_half_f32((uint16_t)hdr[0]), dm = tdm_half_f32((uint16_t)(hdr[0] >> 16));
    d[0] = dd * (float)(sc & 0xFFu), d[1] = dd * (float)(sc >> 8);
    m[0] = dm * (float)(mn & 0xFFu), m[1] = dm * (float)(mn >> 8);
}

template <int BYTES> TDM_HD void tdm_k4_header(const uint8_t *b, uint32_t *hdr)
{
    tdm_ldw<4, tdm_al(BYTES, 0)>(b, hdr);
}

template <> struct QT<TDM_Q_Q4_K> : QI8<2, false, true> {
    static constexpr int BLK = 256, BYTES = 144;
    static TDM_HD void dq8(const uint8_t *b, int j, float *y)
    {
        uint32_t hdr[4];
        tdm_k4_header<BYTES>(b, hdr);
        float d[2], m[2];
        tdm_k4_scales(hdr, j >> 3, d, m);
        const uint8_t *q = b + 16 + 32 * (j >> 3) + (j & 3) * 8;
        const int hi = (j >> 2) & 1;
        for (int i = 0; i < 8; i++)
            y[i] = d[hi] * (float)((q[i] >> (4 * hi)) & 0xF) - m[hi];
    }
    /* unit u: sub-blocks 2u (low nibbles) and 2u + 1 (high) of qs[32u..32u+31] */
    static TDM_HD void dqi8(const uint8_t *b, int u, tdm_qg *g)
    {
        uint32_t hdr[4], w[8];
        tdm_k4_header<BYTES>(b, hdr);
        tdm_ldw<8, tdm_al(BYTES, 16)>(b + 16 + 32 * u, w);
        float d[2], m[2];
        tdm_k4_scales(hdr, u, d, m);
        for (int i = 0; i < 2; i++) {
            for (int j = 0; j < 8; j++)
                g[i].q[j] = (w[j] >> (4 * i)) & 0x0F0F0F0Fu;
            tdm_qg_scales(&g[i], d[i], d[i], m[i], m[i]);
        }
    }
};

template <> struct QT<TDM_Q_Q5_K> : QI8<2, false, true> {
    static constexpr int BLK = 256, BYTES = 176;
    static TDM_HD void dq8(const uint8_t *b, int j, float *y)
    {
        uint32_t hdr[4];
        tdm_k4_header<BYTES>(b, hdr);
        const int k = j >> 2, hi = k & 1;
        float d[2], m[2];
        tdm_k4_scales(hdr, k >> 1, d, m);
        int l0 = (j & 3) * 8;
        const uint8_t *q = b + 48 + 32 * (j >> 3) + l0, *qh = b + 16 + l0;
        for (int i = 0; i < 8; i++) {
            int n = ((q[i] >> (4 * hi)) & 0xF) + (((qh[i] >> k) & 1) << 4);
            y[i] = d[hi] * (float)n - m[hi];
        }
    }
    /* as Q4_K, plus bit k of qh[l] for element l of sub-block k */
    static TDM_HD void dqi8(const uint8_t *b, int u, tdm_qg *g)
    {
        uint32_t hdr[4], w[8], h[8];
        tdm_k4_header<BYTES>(b, hdr);
        tdm_ldw<8, tdm_al(BYTES, 48)>(b + 48 + 32 * u, w);
        tdm_ldw<8, tdm_al(BYTES, 16)>(b + 16, h);
        float d[2], m[2];
        tdm_k4_scales(hdr, u, d, m);
        for (int i = 0; i < 2; i++) {
            int k = 2 * u + i;
            for (int j = 0; j < 8; j++)
                g[i].q[j] = ((w[j] >> (4 * i)) & 0x0F0F0F0Fu) | (((h[j] >> k) & 0x01010101u) << 4);
            tdm_qg_scales(&g[i], d[i], d[i], m[i], m[i]);
        }
    }
};

template <> struct QT<TDM_Q_Q6_K> : QI8<2, true, false, 32> {
    static constexpr int BLK = 256, BYTES = 210;
    static TDM_HD void dq8(const uint8_t *b, int j, float *y)
    {
        int h = j >> 4, quarter = (j & 15) >> 2, l0 = (j & 3) * 8;
        const uint8_t *ql = b + 64 * h + (quarter & 1) * 32 + l0, *qh = b + 128 + 32 * h + l0;
        float d = tdm_h2f(b + 208) * (float)(int8_t)b[192 + (j >> 1)];
        int lshift = (quarter >> 1) * 4, hshift = 2 * quarter;
        for (int i = 0; i < 8; i++) {
            int q = (((ql[i] >> lshift) & 0xF) | (((qh[i] >> hshift) & 3) << 4)) - 32;
            y[i] = d * (float)q;
        }
    }
    /* unit u = 2h + p: quarters p (low nibbles) and p + 2 (high) of half h share ql */
    static TDM_HD int group(int u, int i) { return 4 * (u >> 1) + (u & 1) + 2 * i; }
    static TDM_HD void dqi8(const uint8_t *b, int u, tdm_qg *g)
    {
        int h = u >> 1;
        uint32_t w[8], qh[8];
        tdm_ldw<8, tdm_al(BYTES, 0)>(b + 64 * h + 32 * (u & 1), w);
        tdm_ldw<8, tdm_al(BYTES, 128)>(b + 128 + 32 * h, qh);
        float d = tdm_half_f32(tdm_ld16<tdm_al(BYTES, 208)>(b + 208));
        for (int i = 0; i < 2; i++) {
            int quarter = (u & 1) + 2 * i;
            for (int j = 0; j < 8; j++)
                g[i].q[j] = ((w[j] >> (4 * i)) & 0x0F0F0F0Fu) | (((qh[j] >> (2 * quarter)) & 0x03030303u) << 4);
            uint32_t sc = tdm_ld16<tdm_al(BYTES, 2)>(b + 192 + 8 * h + 2 * quarter);
            tdm_qg_scales(&g[i], d * (float)(int8_t)(sc & 0xFF), d * (float)(int8_t)(sc >> 8), 0.0f,
                          0.0f);
        }
    }
};

template <> struct QT<TDM_Q_IQ4_XS> : QI8<1, false, false> {
    static constexpr int BLK = 256, BYTES = 136;
    static TDM_HD float scale(const uint8_t *b, int ib)
    {
        int ls = ((b[4 + (ib >> 1)] >> (4 * (ib & 1))) & 0xF) |
                 (((tdm_ld16<tdm_al(BYTES, 2)>(b + 2) >> (2 * ib)) & 3) << 4);
        return tdm_half_f32(tdm_ld16<tdm_al(BYTES, 0)>(b)) * (float)(ls - 32);
    }
    static TDM_HD void dq8(const uint8_t *b, int j, float *y)
    {
        int ib = j >> 2, idx0 = (j & 3) * 8;
        float dl = scale(b, ib);
        const uint8_t *q = b + 8 + 16 * ib + (idx0 & 15);
        int shift = idx0 >= 16 ? 4 : 0;
        for (int i = 0; i < 8; i++)
            y[i] = dl * (float)TDM_KV_IQ4NL[(q[i] >> shift) & 0xF];
    }
    static TDM_HD void dqi8(const uint8_t *b, int ib, tdm_qg *g)
    {
        tdm_nibbles32<tdm_al(BYTES, 8)>(b + 8 + 16 * ib, g->q);
        for (int i = 0; i < 8; i++)
            g->q[i] = tdm_lut_bytes(g->q[i], TDM_KV_IQ4NL);
        float dl = scale(b, ib);
        tdm_qg_scales(g, dl, dl, 0.0f, 0.0f);
    }
};

/* Decodes unit u (8 elements) of a row of type T. */
template <int T> TDM_HD void tdm_dq_unit(const uint8_t *row, int u, float *y)
{
    constexpr int UPB = QT<T>::BLK / 8;
    QT<T>::dq8(row + (size_t)(u / UPB) * QT<T>::BYTES, u % UPB, y);
}

/* Calls CALL with QTYPE = the supported type t; does nothing for an
 * unsupported one. The one place that lists the formats. */
#define TDM_QT_DISPATCH(t, CALL)                                                       \
    switch (t) {                                                                       \
    case TDM_Q_F32: { constexpr int QTYPE = TDM_Q_F32; CALL; } break;                  \
    case TDM_Q_F16: { constexpr int QTYPE = TDM_Q_F16; CALL; } break;                  \
    case TDM_Q_BF16: { constexpr int QTYPE = TDM_Q_BF16; CALL; } break;                \
    case TDM_Q_Q4_0: { constexpr int QTYPE = TDM_Q_Q4_0; CALL; } break;                \
    case TDM_Q_Q4_1: { constexpr int QTYPE = TDM_Q_Q4_1; CALL; } break;                \
    case TDM_Q_Q5_0: { constexpr int QTYPE = TDM_Q_Q5_0; CALL; } break;                \
    case TDM_Q_Q5_1: { constexpr int QTYPE = TDM_Q_Q5_1; CALL; } break;                \
    case TDM_Q_Q8_0: { constexpr int QTYPE = TDM_Q_Q8_0; CALL; } break;                \
    case TDM_Q_Q2_K: { constexpr int QTYPE = TDM_Q_Q2_K; CALL; } break;                \
    case TDM_Q_Q3_K: { constexpr int QTYPE = TDM_Q_Q3_K; CALL; } break;                \
    case TDM_Q_Q4_K: { constexpr int QTYPE = TDM_Q_Q4_K; CALL; } break;                \
    case TDM_Q_Q5_K: { constexpr int QTYPE = TDM_Q_Q5_K; CALL; } break;                \
    case TDM_Q_Q6_K: { constexpr int QTYPE = TDM_Q_Q6_K; CALL; } break;                \
    case TDM_Q_IQ4_NL: { constexpr int QTYPE = TDM_Q_IQ4_NL; CALL; } break;            \
    case TDM_Q_IQ4_XS: { constexpr int QTYPE = TDM_Q_IQ4_XS; CALL; } break;            \
    case TDM_Q_MXFP4: { constexpr int QTYPE = TDM_Q_MXFP4; CALL; } break;              \
    default: break;                                                                    \
    }

/* ---- float-activation path (F32, F16, BF16) ---- */

/* Partial dot products of R consecutive weight rows (row, row + row_bytes,
 * ...; only the first nrows are real) over 8-element units first, first +
 * stride, ... < units with NT activation rows x + t * xs; the caller reduces
 * the partials. Each activation load serves R rows. Unrolled by two so two
 * units' loads are in flight at once. */
template <int T, int NT, int R>
__device__ __forceinline__ void tdm_rows_dot_part(const uint8_t *row, int64_t row_bytes, int nrows,
                                                  int units, const float *x, int64_t xs, int ntok,
                                                  int first, int stride, float (*acc)[NT])
{
#pragma unroll 2
    for (int u = first; u < units; u += stride) {
        float q[R][8];
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (r < nrows) {
                tdm_dq_unit<T>(row + r * row_bytes, u, q[r]);
            } else {
#pragma unroll
                for (int i = 0; i < 8; i++)
                    q[r][i] = 0.0f;
            }
        }
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t < ntok) {
                const float4 *xp = (const float4 *)(x + t * xs + 8 * (int64_t)u);
                float4 a = __ldg(xp), c = __ldg(xp + 1);
#pragma unroll
                for (int r = 0; r < R; r++)
                    acc[r][t] += q[r][0] * a.x + q[r][1] * a.y + q[r][2] * a.z + q[r][3] * a.w +
                                 q[r][4] * c.x + q[r][5] * c.y + q[r][6] * c.z + q[r][7] * c.w;
            }
        }
    }
}

/* c + the dot product of the four bytes of a (int8, or unsigned where U)
 * and of b (int8). */
template <bool U> TDM_HD int tdm_dp4a(uint32_t a, int b, int c)
{
#ifdef __CUDA_ARCH__
    if constexpr (U) {
        int d;
        asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
        return d;
    } else {
        return __dp4a((int)a, b, c);
    }
#else
    for (int i = 0; i < 4; i++) {
        const uint32_t ab = (a >> (8 * i)) & 0xFF;
        c += (U ? (int)ab : (int)(int8_t)ab) * (int)(int8_t)((uint32_t)b >> (8 * i));
    }
    return c;
#endif
}

/* Weight group g times the activation group (xa: elements 0..15, xb:
 * 16..31, s its scale and half sums x0, x1): dx (d0 s0 + d1 s1 - m0 x0 -
 * m1 x1), where s0 and s1, the halves' integer dot products, start from
 * -Z x0 and -Z x1 (the zero point; exact, so the sums equal those of the
 * signed quants bit for bit). */
template <int T> TDM_HD float tdm_qg_dot(const tdm_qg &g, int4 xa, int4 xb, uint2 s)
{
    constexpr int Z = QT<T>::ZERO;
    constexpr bool U = Z != 0;
    const int x0 = (int)(short)(s.y & 0xFFFFu), x1 = (int)s.y >> 16;
    int s0 = tdm_dp4a<U>(g.q[0], xa.x, -Z * x0), s1 = tdm_dp4a<U>(g.q[4], xb.x, -Z * x1);
    s0 = tdm_dp4a<U>(g.q[1], xa.y, s0);
    s1 = tdm_dp4a<U>(g.q[5], xb.y, s1);
    s0 = tdm_dp4a<U>(g.q[2], xa.z, s0);
    s1 = tdm_dp4a<U>(g.q[6], xb.z, s1);
    s0 = tdm_dp4a<U>(g.q[3], xa.w, s0);
    s1 = tdm_dp4a<U>(g.q[7], xb.w, s1);
    float v;
    if (QT<T>::SPLIT)
        v = g.d[0] * (float)s0 + g.d[1] * (float)s1;
    else
        v = g.d[0] * (float)(s0 + s1);
    if (QT<T>::MIN)
        v -= QT<T>::SPLIT ? g.m[0] * (float)x0 + g.m[1] * (float)x1 : g.m[0] * (float)(x0 + x1);
    return tdm_bits_f32(s.x) * v;
}

/* Partial dot products of R consecutive weight rows (only the first nrows
 * real) with the int8 chunk xq over units ubeg, ubeg + ustep, ... < uend of
 * the chunk (row points at the chunk's first block). One unit's weights
 * are decoded once for all tokens; each activation load serves R rows.
 * __host__ too: tdm_gpu_dot_i8_host runs it against a host-built chunk. */
template <int T, int NT, int R>
TDM_HD void tdm_q8_rows_part(const uint8_t *row, int64_t row_bytes, int nrows, int ubeg, int uend,
                             int ustep, const tdm_xq &xq, int ntok, float (*acc)[NT])
{
    using Q = QT<T>;
    constexpr int UPB = Q::BLK / Q::UNIT, GPB = Q::BLK / 32;
#ifdef __CUDA_ARCH__
    /* two units' loads in flight where registers allow (1 token, 1 row) */
#pragma unroll(NT * R == 1 ? 2 : 1)
#endif
    for (int u = ubeg; u < uend; u += ustep) {
        int blk = u / UPB, ub = u - blk * UPB;
        tdm_qg g[R][Q::NG];
        TDM_UNROLL
        for (int r = 0; r < R; r++) /* rows past nrows repeat row 0; their sums are dropped */
            Q::dqi8(row + (r < nrows ? r : 0) * row_bytes + (int64_t)blk * Q::BYTES, ub, g[r]);
        TDM_UNROLL
        for (int i = 0; i < Q::NG; i++) {
            int gi = blk * GPB + Q::group(ub, i);
            TDM_UNROLL
            for (int t = 0; t < NT; t++) {
                if (t < ntok) {
                    const int8_t *xt = xq.q + t * xq.pitch; /* row t, swizzled on its own */
                    int4 xa = *(const int4 *)(xt + tdm_xq_swz(32 * gi));
                    int4 xb = *(const int4 *)(xt + tdm_xq_swz(32 * gi + 16));
                    uint2 s = xq.s[t * (xq.pitch / 32) + gi];
                    TDM_UNROLL
                    for (int r = 0; r < R; r++)
                        acc[r][t] += tdm_qg_dot<T>(g[r][i], xa, xb, s);
                }
            }
        }
    }
}

/* ---- the fused MoE kernels: one type or a type per matrix ---- */

/* Elements of one unit of type t on its path (8 plain, 32 * NG quantised),
 * 0 when unsupported: the host works the fused MoE kernels' geometry out
 * with it, so that they divide by nothing at run time. */
int tdm_gpu_qt_unit(tdm_qtype t);

/* Partial dots of R rows (row, row + delta, ...) over units ubeg, ubeg +
 * ustep, ... < uend of a chunk: quantised types against the chunk's int8
 * activations xq, plain ones against the float activations xf (at the
 * chunk's start); row points at the chunk's first block. Adds to acc[R].
 * R = 2 lets the fused gate_up kernel read a gate row and an up row (any
 * distance apart) with both loads in flight and one activation load. */
template <int T, int R>
__device__ __forceinline__ void tdm_rows_part(const uint8_t *row, int64_t delta, int ubeg, int uend,
                                              int ustep, const tdm_xq &xq, const float *xf,
                                              float *acc)
{
    if constexpr (QT<T>::I8)
        tdm_q8_rows_part<T, 1, R>(row, delta, R, ubeg, uend, ustep, xq, 1, (float(*)[1])acc);
    else
        tdm_rows_dot_part<T, 1, R>(row, delta, R, uend, xf, 0, 1, ubeg, ustep, (float(*)[1])acc);
}

/* The same for a type fixed when compiled (T >= 0; type is T) or known only
 * at run time (T < 0: a warp-uniform switch on type, outside the unit
 * loop). */
template <int T, int R>
__device__ __forceinline__ void tdm_rows_part_of(int type, const uint8_t *row, int64_t delta, int ubeg, int uend,
                                                 int ustep, const tdm_xq &xq, const float *xf, float *acc)
{
    if constexpr (T >= 0)
        tdm_rows_part<T, R>(row, delta, ubeg, uend, ustep, xq, xf, acc);
    else
        TDM_QT_DISPATCH(type, (tdm_rows_part<QTYPE, R>(row, delta, ubeg, uend, ustep, xq, xf, acc)));
}

/* Eight floats as eight halves (round to nearest even) in one 16-byte word:
 * the plain formats' fp16 tiles (dequant_f16_kernel, the prompt MoE staging). */
__device__ __forceinline__ uint4 tdm_pack_f16x8(const float *q)
{
    uint32_t w[4];
#pragma unroll
    for (int p = 0; p < 4; p++) {
        const __half2 h = __floats2half2_rn(q[2 * p], q[2 * p + 1]);
        memcpy(&w[p], &h, 4);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

/* Bytes of one row, and whether the GPU code handles the type. */
bool tdm_gpu_qt_geometry(tdm_qtype t, int *blk, int *bytes);

/* TDM_OK when a matrix of type t starts at w, and at w + i * stride for
 * every i (expert slots, host experts), as tdm_gpu_weight_align asks (the
 * quantised formats: tdm_al(BYTES, 0), which the int8 decoders' loads
 * assume; the plain ones: 4, read as words); else
 * TDM_ERR_INVALID naming who and what. */
tdm_status tdm_gpu_check_align(tdm_qtype t, const void *w, int64_t stride, const char *who, const char *what,
                               tdm_error *err);

#endif
