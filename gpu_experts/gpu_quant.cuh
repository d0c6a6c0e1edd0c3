/* gpu_quant: the one dequantisation table of the GPU kernels. Each supported
 * weight format is a QT<type> with its block geometry and dq8(), which decodes
 * the 8 consecutive elements 8j..8j+7 of one block ("unit" j). Plain types
 * (F32/F16/BF16) are treated as blocks of 8. Every kernel that reads weights
 * (matvec, dequant-to-f16, the fused MoE kernels) goes through these, so a
 * format is written once. The helpers are __host__ __device__ so that the
 * tests can check them bit for bit against the CPU reference without a GPU.
 * Values are exactly ggml's dequantize_row_* results (gguf.md §2.4-2.5). */
#ifndef TDM_GPU_QUANT_CUH
#define TDM_GPU_QUANT_CUH

#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

#include "gpu_common.cuh"

#define TDM_HD __host__ __device__ __forceinline__

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

TDM_HD float tdm_half_f32(uint16_t u)
{
#ifdef __CUDA_ARCH__
    return __half2float(__ushort_as_half(u));
#else
    return tdm_fp16_to_fp32(u);
#endif
}

/* Unaligned little-endian fields (blocks are only 1-2 byte aligned). */
TDM_HD uint16_t tdm_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
TDM_HD uint32_t tdm_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
TDM_HD float tdm_h2f(const uint8_t *p) { return tdm_half_f32(tdm_u16(p)); }

template <int T> struct QT;

template <> struct QT<TDM_Q_F32> {
    static constexpr int BLK = 8, BYTES = 32;
    static TDM_HD void dq8(const uint8_t *b, int, float *y)
    {
        for (int i = 0; i < 8; i++)
            y[i] = tdm_bits_f32(tdm_u32(b + 4 * i));
    }
};

template <> struct QT<TDM_Q_F16> {
    static constexpr int BLK = 8, BYTES = 16;
    static TDM_HD void dq8(const uint8_t *b, int, float *y)
    {
        for (int i = 0; i < 8; i++)
            y[i] = tdm_h2f(b + 2 * i);
    }
};

template <> struct QT<TDM_Q_BF16> {
    static constexpr int BLK = 8, BYTES = 16;
    static TDM_HD void dq8(const uint8_t *b, int, float *y)
    {
        for (int i = 0; i < 8; i++)
            y[i] = tdm_bits_f32((uint32_t)tdm_u16(b + 2 * i) << 16);
    }
};

/* 32-element blocks: low nibbles are elements 0..15, high nibbles 16..31. */
TDM_HD void tdm_nibbles8(const uint8_t *qs, int j, int *n)
{
    const uint8_t *q = qs + (j & 1) * 8;
    int shift = (j >> 1) * 4;
    for (int i = 0; i < 8; i++)
        n[i] = (q[i] >> shift) & 0xF;
}

template <> struct QT<TDM_Q_Q4_0> {
    static constexpr int BLK = 32, BYTES = 18;
    static TDM_HD void dq8(const uint8_t *b, int j, float *y)
    {
        float d = tdm_h2f(b);
        int n[8];
        tdm_nibbles8(b + 2, j, n);
        for (int i = 0; i < 8; i++)
            y[i] = (float)(n[i] - 8) * d;
    }
};

template <> struct QT<TDM_Q_Q4_1> {
    static constexpr int BLK = 32, BYTES = 20;
    static TDM_HD void dq8(const uint8_t *b, int j, float *y)
    {
        float d = tdm_h2f(b), m = tdm_h2f(b + 2);
        int n[8];
        tdm_nibbles8(b + 4, j, n);
        for (int i = 0; i < 8; i++)
            y[i] = (float)n[i] * d + m;
    }
};

template <> struct QT<TDM_Q_Q5_0> {
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
};

template <> struct QT<TDM_Q_Q5_1> {
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
};

template <> struct QT<TDM_Q_Q8_0> {
    static constexpr int BLK = 32, BYTES = 34;
    static TDM_HD void dq8(const uint8_t *b, int j, float *y)
    {
        float d = tdm_h2f(b);
        const uint8_t *q = b + 2 + 8 * j;
        for (int i = 0; i < 8; i++)
            y[i] = (float)(int8_t)q[i] * d;
    }
};

template <> struct QT<TDM_Q_IQ4_NL> {
    static constexpr int BLK = 32, BYTES = 18;
    static TDM_HD void dq8(const uint8_t *b, int j, float *y)
    {
        float d = tdm_h2f(b);
        int n[8];
        tdm_nibbles8(b + 2, j, n);
        for (int i = 0; i < 8; i++)
            y[i] = d * (float)TDM_KV_IQ4NL[n[i]];
    }
};

template <> struct QT<TDM_Q_MXFP4> {
    static constexpr int BLK = 32, BYTES = 17;
    static TDM_HD void dq8(const uint8_t *b, int j, float *y)
    {
        uint32_t e = b[0]; /* E8M0, halved because the FP4 table is doubled */
        float d = tdm_bits_f32(e < 2 ? (0x00200000u << e) : ((e - 1) << 23));
        int n[8];
        tdm_nibbles8(b + 1, j, n);
        for (int i = 0; i < 8; i++)
            y[i] = (float)TDM_KV_FP4[n[i]] * d;
    }
};

template <> struct QT<TDM_Q_Q2_K> {
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
};

template <> struct QT<TDM_Q_Q3_K> {
    static constexpr int BLK = 256, BYTES = 110;
    static TDM_HD void dq8(const uint8_t *b, int j, float *y)
    {
        int g = j >> 1, k = g & 3, quarter = g >> 2;
        const uint8_t *s = b + 96;
        int lo = s[(quarter & 1) * 4 + k];
        lo = quarter < 2 ? (lo & 0xF) : (lo >> 4);
        int sc = lo | (((s[8 + k] >> (2 * quarter)) & 3) << 4);
        float dl = tdm_h2f(b + 108) * (float)(sc - 32);
        int h = j >> 4, jj = (j & 15) >> 2, l0 = (j & 3) * 8;
        const uint8_t *q = b + 32 + 32 * h + l0, *hm = b + l0;
        int hbit = 4 * h + jj;
        for (int i = 0; i < 8; i++) {
            int v = ((q[i] >> (2 * jj)) & 3) - (((hm[i] >> hbit) & 1) ? 0 : 4);
            y[i] = dl * (float)v;
        }
    }
};

/* Q4_K / Q5_K 6-bit scale and min of sub-block k (ggml get_scale_min_k4). */
TDM_HD void tdm_scale_min_k4(const uint8_t *q, int k, int *sc, int *mn)
{
    if (k < 4) {
        *sc = q[k] & 63;
        *mn = q[k + 4] & 63;
    } else {
        *sc = (q[k + 4] & 0xF) | ((q[k - 4] >> 6) << 4);
        *mn = (q[k + 4] >> 4) | ((q[k] >> 6) << 4);
    }
}

template <> struct QT<TDM_Q_Q4_K> {
    static constexpr int BLK = 256, BYTES = 144;
    static TDM_HD void dq8(const uint8_t *b, int j, float *y)
    {
        int k = j >> 2, sc, mn;
        tdm_scale_min_k4(b + 4, k, &sc, &mn);
        float d1 = tdm_h2f(b) * (float)sc, m1 = tdm_h2f(b + 2) * (float)mn;
        const uint8_t *q = b + 16 + 32 * (j >> 3) + (j & 3) * 8;
        int shift = (k & 1) * 4;
        for (int i = 0; i < 8; i++)
            y[i] = d1 * (float)((q[i] >> shift) & 0xF) - m1;
    }
};

template <> struct QT<TDM_Q_Q5_K> {
    static constexpr int BLK = 256, BYTES = 176;
    static TDM_HD void dq8(const uint8_t *b, int j, float *y)
    {
        int k = j >> 2, sc, mn;
        tdm_scale_min_k4(b + 4, k, &sc, &mn);
        float d1 = tdm_h2f(b) * (float)sc, m1 = tdm_h2f(b + 2) * (float)mn;
        int l0 = (j & 3) * 8;
        const uint8_t *q = b + 48 + 32 * (j >> 3) + l0, *qh = b + 16 + l0;
        int shift = (k & 1) * 4;
        for (int i = 0; i < 8; i++) {
            int n = ((q[i] >> shift) & 0xF) + (((qh[i] >> k) & 1) << 4);
            y[i] = d1 * (float)n - m1;
        }
    }
};

template <> struct QT<TDM_Q_Q6_K> {
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
};

template <> struct QT<TDM_Q_IQ4_XS> {
    static constexpr int BLK = 256, BYTES = 136;
    static TDM_HD void dq8(const uint8_t *b, int j, float *y)
    {
        int ib = j >> 2, idx0 = (j & 3) * 8;
        int ls = ((b[4 + (ib >> 1)] >> (4 * (ib & 1))) & 0xF) | (((tdm_u16(b + 2) >> (2 * ib)) & 3) << 4);
        float dl = tdm_h2f(b) * (float)(ls - 32);
        const uint8_t *q = b + 8 + 16 * ib + (idx0 & 15);
        int shift = idx0 >= 16 ? 4 : 0;
        for (int i = 0; i < 8; i++)
            y[i] = dl * (float)TDM_KV_IQ4NL[(q[i] >> shift) & 0xF];
    }
};

/* Decodes unit u (8 elements) of a row of type T. */
template <int T> TDM_HD void tdm_dq_unit(const uint8_t *row, int u, float *y)
{
    constexpr int UPB = QT<T>::BLK / 8;
    QT<T>::dq8(row + (size_t)(u / UPB) * QT<T>::BYTES, u % UPB, y);
}

/* Calls F::template run<T>(args...) for the supported type t; returns false
 * for an unsupported one. The one place that lists the formats. */
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

/* Partial dot products of R consecutive weight rows (row, row + row_bytes,
 * ...; only the first nrows are real) over units first, first + stride, ...
 * with NT activation rows x + t * xs; the caller reduces the partials. Each
 * activation load serves R rows. Unrolled by two so two units' loads are in
 * flight at once. */
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

/* One row (R = 1). */
template <int T, int NT>
__device__ __forceinline__ void tdm_row_dot_part(const uint8_t *row, int units, const float *x,
                                                 int64_t xs, int ntok, int first, int stride,
                                                 float *acc)
{
    tdm_rows_dot_part<T, NT, 1>(row, 0, 1, units, x, xs, ntok, first, stride,
                                (float(*)[NT])acc);
}

/* The same for a weight type known only at run time (warp-uniform switch);
 * used by the fused MoE kernels, whose three matrices may differ in type. */
__device__ __forceinline__ float tdm_row_dot_rt(int type, const uint8_t *row, int units,
                                                const float *x, int first, int stride)
{
    float acc[1] = {0.0f};
    TDM_QT_DISPATCH(type, (tdm_row_dot_part<QTYPE, 1>(row, units, x, 0, 1, first, stride, acc)));
    return acc[0];
}

/* Bytes of one row, and whether the GPU code handles the type. */
bool tdm_gpu_qt_geometry(tdm_qtype t, int *blk, int *bytes);

#endif
