/* Scalar reference kernels: activation quantisation (the semantics every ISA
 * reproduces byte for byte, see kernels_impl.h) and the dot products of spec
 * gguf.md §2.7 (ggml's generic formulas, same association order). Compiled
 * without ISA flags, so no FMA contraction. */
#include <math.h>
#include <string.h>

#include "kernels_impl.h"

/* ---- activation quantisation ------------------------------------------- */

static void quant_f32(const float *x, void *xq, int64_t n)
{
    memcpy(xq, x, (size_t)n * sizeof(float));
}

static int8_t round_q8(float v)
{
    float r = rintf(v); /* round half to even in the default FP mode */
    return (int8_t)(r > 127.0f ? 127 : r < -128.0f ? -128 : (int)r);
}

/* One 32-block of Q8_0 (q81 == 0) or Q8_1; out points at the block. */
static void quant_q8_block32(const float *x, uint8_t *out, int q81)
{
    float amax = 0.0f;
    for (int i = 0; i < 32; i++)
        amax = fmaxf(amax, fabsf(x[i]));
    float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int8_t *qs = (int8_t *)(out + (q81 ? 4 : 2));
    int sum = 0;
    for (int i = 0; i < 32; i++) {
        qs[i] = round_q8(x[i] * id);
        sum += qs[i];
    }
    uint16_t dh = tdm_fp32_to_fp16(d);
    memcpy(out, &dh, 2);
    if (q81) {
        uint16_t sh = tdm_fp32_to_fp16(d * (float)sum);
        memcpy(out + 2, &sh, 2);
    }
}

static void quant_q8_0(const float *x, void *xq, int64_t n)
{
    for (int64_t b = 0; b < n / 32; b++)
        quant_q8_block32(x + 32 * b, (uint8_t *)xq + TDM_ACT_Q8_0 * b, 0);
}

static void quant_q8_1(const float *x, void *xq, int64_t n)
{
    for (int64_t b = 0; b < n / 32; b++)
        quant_q8_block32(x + 32 * b, (uint8_t *)xq + TDM_ACT_Q8_1 * b, 1);
}

static void quant_q8_k(const float *x, void *xq, int64_t n)
{
    for (int64_t b = 0; b < n / 256; b++) {
        const float *xb = x + 256 * b;
        uint8_t *out = (uint8_t *)xq + TDM_ACT_Q8_K * b;
        int8_t *qs = (int8_t *)(out + Q8K_QS);
        int16_t bsums[16];
        float amax = 0.0f, max = 0.0f;
        for (int i = 0; i < 256; i++)
            if (fabsf(xb[i]) > amax) {
                amax = fabsf(xb[i]);
                max = xb[i];
            }
        float d = 0.0f;
        if (amax == 0.0f) {
            memset(qs, 0, 256);
        } else {
            float iscale = -127.0f / max;
            for (int i = 0; i < 256; i++)
                qs[i] = round_q8(iscale * xb[i]);
            d = 1.0f / iscale;
        }
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int i = 0; i < 16; i++)
                s += qs[16 * g + i];
            bsums[g] = (int16_t)s;
        }
        memcpy(out + Q8K_D, &d, 4);
        memcpy(out + Q8K_BSUMS, bsums, sizeof bsums);
        memset(out + Q8K_D + 4, 0, TDM_ACT_Q8_K - Q8K_D - 4); /* padding: deterministic bytes */
    }
}

/* ---- float weights: accumulated in double (this is the reference) ------ */

static float dot_f32(int64_t n, const void *w, const void *xq)
{
    const float *a = w, *x = xq;
    double s = 0.0;
    for (int64_t i = 0; i < n; i++)
        s += (double)a[i] * x[i];
    return (float)s;
}

static float dot_f16(int64_t n, const void *w, const void *xq)
{
    const uint8_t *a = w;
    const float *x = xq;
    double s = 0.0;
    for (int64_t i = 0; i < n; i++)
        s += (double)tdm_fp16_to_fp32(tdm_rd_u16(a + 2 * i)) * x[i];
    return (float)s;
}

static float dot_bf16(int64_t n, const void *w, const void *xq)
{
    const uint8_t *a = w;
    const float *x = xq;
    double s = 0.0;
    for (int64_t i = 0; i < n; i++)
        s += (double)tdm_bf16_to_fp32(tdm_rd_u16(a + 2 * i)) * x[i];
    return (float)s;
}

/* ---- 32-element blocks against Q8_0 / Q8_1 ------------------------------ */

/* Weight values of one 32-block as integers (the offset already applied). */
static void nibbles32(const uint8_t *qs, int v[32], int offset)
{
    for (int j = 0; j < 16; j++) {
        v[j] = (qs[j] & 0xF) - offset;
        v[j + 16] = (qs[j] >> 4) - offset;
    }
}

static void fifth_bit32(const uint8_t *qh, int v[32], int offset)
{
    uint32_t h = tdm_rd_u32(qh);
    for (int e = 0; e < 32; e++)
        v[e] += (int)((h >> e) & 1) * 16 - offset;
}

static int dot32(const int v[32], const int8_t *y)
{
    int s = 0;
    for (int e = 0; e < 32; e++)
        s += v[e] * y[e];
    return s;
}

static float dot_q4_0(int64_t n, const void *w, const void *xq)
{
    float acc = 0.0f;
    for (int64_t b = 0; b < n / 32; b++) {
        const uint8_t *x = (const uint8_t *)w + TDM_B_Q4_0 * b, *y = (const uint8_t *)xq + TDM_ACT_Q8_0 * b;
        int v[32];
        nibbles32(x + 2, v, 8);
        acc += ((float)dot32(v, (const int8_t *)(y + 2)) * tdm_rd_fp16(x)) * tdm_rd_fp16(y);
    }
    return acc;
}

static float dot_q5_0(int64_t n, const void *w, const void *xq)
{
    float acc = 0.0f;
    for (int64_t b = 0; b < n / 32; b++) {
        const uint8_t *x = (const uint8_t *)w + TDM_B_Q5_0 * b, *y = (const uint8_t *)xq + TDM_ACT_Q8_0 * b;
        int v[32];
        nibbles32(x + 6, v, 0);
        fifth_bit32(x + 2, v, 16);
        acc += (tdm_rd_fp16(x) * tdm_rd_fp16(y)) * (float)dot32(v, (const int8_t *)(y + 2));
    }
    return acc;
}

/* Q4_1 / Q5_1: qs_off is where the nibbles start, qh_off the fifth bits (0 = none). */
static float dot_q41_q51(int64_t n, const void *w, const void *xq, int bsize, int qs_off, int qh_off)
{
    float acc = 0.0f;
    for (int64_t b = 0; b < n / 32; b++) {
        const uint8_t *x = (const uint8_t *)w + bsize * b, *y = (const uint8_t *)xq + TDM_ACT_Q8_1 * b;
        int v[32];
        nibbles32(x + qs_off, v, 0);
        if (qh_off)
            fifth_bit32(x + qh_off, v, 0);
        int s = dot32(v, (const int8_t *)(y + 4));
        acc += (tdm_rd_fp16(x) * tdm_rd_fp16(y)) * (float)s + tdm_rd_fp16(x + 2) * tdm_rd_fp16(y + 2);
    }
    return acc;
}

static float dot_q4_1(int64_t n, const void *w, const void *xq)
{
    return dot_q41_q51(n, w, xq, TDM_B_Q4_1, 4, 0);
}

static float dot_q5_1(int64_t n, const void *w, const void *xq)
{
    return dot_q41_q51(n, w, xq, TDM_B_Q5_1, 8, 4);
}

static float dot_q8_0(int64_t n, const void *w, const void *xq)
{
    float acc = 0.0f;
    for (int64_t b = 0; b < n / 32; b++) {
        const uint8_t *x = (const uint8_t *)w + TDM_B_Q8_0 * b, *y = (const uint8_t *)xq + TDM_ACT_Q8_0 * b;
        int v[32];
        for (int e = 0; e < 32; e++)
            v[e] = (int8_t)x[2 + e];
        acc += (float)dot32(v, (const int8_t *)(y + 2)) * (tdm_rd_fp16(x) * tdm_rd_fp16(y));
    }
    return acc;
}

/* IQ4_NL and MXFP4: a 16-entry value table indexed by the nibble. */
static void lookup32(const uint8_t *qs, const int8_t *table, int v[32])
{
    nibbles32(qs, v, 0);
    for (int e = 0; e < 32; e++)
        v[e] = table[v[e]];
}

static float dot_iq4_nl(int64_t n, const void *w, const void *xq)
{
    float acc = 0.0f;
    for (int64_t b = 0; b < n / 32; b++) {
        const uint8_t *x = (const uint8_t *)w + TDM_B_IQ4_NL * b, *y = (const uint8_t *)xq + TDM_ACT_Q8_0 * b;
        int v[32];
        lookup32(x + 2, tdm_kvalues_iq4nl, v);
        acc += (tdm_rd_fp16(x) * tdm_rd_fp16(y)) * (float)dot32(v, (const int8_t *)(y + 2));
    }
    return acc;
}

static float dot_mxfp4(int64_t n, const void *w, const void *xq)
{
    float acc = 0.0f;
    for (int64_t b = 0; b < n / 32; b++) {
        const uint8_t *x = (const uint8_t *)w + TDM_B_MXFP4 * b, *y = (const uint8_t *)xq + TDM_ACT_Q8_0 * b;
        int v[32];
        lookup32(x + 1, tdm_kvalues_fp4, v);
        acc += (tdm_rd_fp16(y) * tdm_e8m0_half(x[0])) * (float)dot32(v, (const int8_t *)(y + 2));
    }
    return acc;
}

/* ---- K-quants against Q8_K ---------------------------------------------- */

/* ggml's eight-lane accumulation: aux[e % 8] += scale(group e/16) * q[e] * y[e]. */
static void kq_lanes(const int8_t q[256], const int sc16[16], const int8_t *y, int32_t aux[8])
{
    memset(aux, 0, 8 * sizeof(int32_t));
    for (int e = 0; e < 256; e++)
        aux[e % 8] += sc16[e / 16] * (q[e] * y[e]);
}

/* Per-block values: q[256] (offsets applied), sc16 group scales, d and the
 * min-correction (0 for types without mins). */
typedef float (*kq_unpack_fn)(const uint8_t *x, const uint8_t *y, int8_t q[256], int sc16[16],
                              float *dmin_term);

static float kq_dot(int64_t n, const void *w, const void *xq, int bsize, kq_unpack_fn unpack)
{
    float sums[8] = {0}, acc = 0.0f;
    for (int64_t b = 0; b < n / 256; b++) {
        const uint8_t *x = (const uint8_t *)w + bsize * b, *y = (const uint8_t *)xq + TDM_ACT_Q8_K * b;
        int8_t q[256];
        int sc16[16];
        int32_t aux[8];
        float dmin_term = 0.0f;
        float d = unpack(x, y, q, sc16, &dmin_term);
        kq_lanes(q, sc16, (const int8_t *)(y + Q8K_QS), aux);
        for (int l = 0; l < 8; l++)
            sums[l] += d * (float)aux[l];
        acc -= dmin_term;
    }
    for (int l = 0; l < 8; l++)
        acc += sums[l];
    return acc;
}

static int bsum_dot_mins(const uint8_t *y, const uint8_t mn[8])
{
    int s = 0;
    for (int g = 0; g < 16; g++)
        s += (int16_t)tdm_rd_u16(y + Q8K_BSUMS + 2 * g) * mn[g / 2];
    return s;
}

static float unpack_q4_k(const uint8_t *x, const uint8_t *y, int8_t q[256], int sc16[16], float *dmin_term)
{
    uint8_t sc[8], mn[8];
    tdm_q4k_scales(x + Q4K_SCALES, sc, mn);
    for (int e = 0; e < 256; e++) {
        int k = e / 32;
        q[e] = (int8_t)((x[Q4K_QS + 32 * (k / 2) + e % 32] >> (4 * (k % 2))) & 0xF);
    }
    for (int g = 0; g < 16; g++)
        sc16[g] = sc[g / 2];
    float dy = tdm_rd_f32(y + Q8K_D);
    *dmin_term = (tdm_rd_fp16(x + Q4K_DMIN) * dy) * (float)bsum_dot_mins(y, mn);
    return tdm_rd_fp16(x + Q4K_D) * dy;
}

static float unpack_q5_k(const uint8_t *x, const uint8_t *y, int8_t q[256], int sc16[16], float *dmin_term)
{
    uint8_t sc[8], mn[8];
    tdm_q4k_scales(x + Q5K_SCALES, sc, mn);
    for (int e = 0; e < 256; e++) {
        int k = e / 32, l = e % 32;
        int nib = (x[Q5K_QS + 32 * (k / 2) + l] >> (4 * (k % 2))) & 0xF;
        q[e] = (int8_t)(nib | ((x[Q5K_QH + l] >> k) & 1) << 4);
    }
    for (int g = 0; g < 16; g++)
        sc16[g] = sc[g / 2];
    float dy = tdm_rd_f32(y + Q8K_D);
    *dmin_term = (tdm_rd_fp16(x + Q5K_DMIN) * dy) * (float)bsum_dot_mins(y, mn);
    return tdm_rd_fp16(x + Q5K_D) * dy;
}

static float unpack_q3_k(const uint8_t *x, const uint8_t *y, int8_t q[256], int sc16[16], float *dmin_term)
{
    int8_t s[16];
    tdm_q3k_scales(x + Q3K_SCALES, s);
    for (int e = 0; e < 256; e++) {
        int h = e / 128, j = (e % 128) / 32, l = e % 32;
        int v = (x[Q3K_QS + 32 * h + l] >> (2 * j)) & 3;
        q[e] = (int8_t)(v - ((x[Q3K_HMASK + l] >> (4 * h + j)) & 1 ? 0 : 4));
    }
    for (int g = 0; g < 16; g++)
        sc16[g] = s[g];
    return tdm_rd_fp16(x + Q3K_D) * tdm_rd_f32(y + Q8K_D);
}

static float unpack_q6_k(const uint8_t *x, const uint8_t *y, int8_t q[256], int sc16[16], float *dmin_term)
{
    for (int e = 0; e < 256; e++) {
        int h = e / 128, part = (e % 128) / 32, l = e % 32;
        uint8_t ql = x[Q6K_QL + 64 * h + 32 * (part & 1) + l];
        int nib = (part >> 1) ? ql >> 4 : ql & 0xF;
        int hi = (x[Q6K_QH + 32 * h + l] >> (2 * part)) & 3;
        q[e] = (int8_t)((nib | hi << 4) - 32);
    }
    for (int g = 0; g < 16; g++)
        sc16[g] = (int8_t)x[Q6K_SCALES + g];
    return tdm_rd_fp16(x + Q6K_D) * tdm_rd_f32(y + Q8K_D);
}

static float dot_q3_k(int64_t n, const void *w, const void *xq) { return kq_dot(n, w, xq, TDM_B_Q3_K, unpack_q3_k); }
static float dot_q4_k(int64_t n, const void *w, const void *xq) { return kq_dot(n, w, xq, TDM_B_Q4_K, unpack_q4_k); }
static float dot_q5_k(int64_t n, const void *w, const void *xq) { return kq_dot(n, w, xq, TDM_B_Q5_K, unpack_q5_k); }
static float dot_q6_k(int64_t n, const void *w, const void *xq) { return kq_dot(n, w, xq, TDM_B_Q6_K, unpack_q6_k); }

static float dot_q2_k(int64_t n, const void *w, const void *xq)
{
    float acc = 0.0f;
    for (int64_t b = 0; b < n / 256; b++) {
        const uint8_t *x = (const uint8_t *)w + TDM_B_Q2_K * b, *y = (const uint8_t *)xq + TDM_ACT_Q8_K * b;
        const uint8_t *sc = x + Q2K_SCALES;
        const int8_t *q8 = (const int8_t *)(y + Q8K_QS);
        int summs = 0, isum = 0;
        for (int g = 0; g < 16; g++)
            summs += (sc[g] >> 4) * (int16_t)tdm_rd_u16(y + Q8K_BSUMS + 2 * g);
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int i = 0; i < 16; i++) {
                int e = 16 * g + i, h = e / 128, j = (e % 128) / 32, l = e % 32;
                s += q8[e] * ((x[Q2K_QS + 32 * h + l] >> (2 * j)) & 3);
            }
            isum += (sc[g] & 0xF) * s;
        }
        float dy = tdm_rd_f32(y + Q8K_D);
        float dall = dy * tdm_rd_fp16(x + Q2K_D), dmin = dy * tdm_rd_fp16(x + Q2K_DMIN);
        acc += dall * (float)isum - dmin * (float)summs;
    }
    return acc;
}

static float dot_iq4_xs(int64_t n, const void *w, const void *xq)
{
    float acc = 0.0f;
    for (int64_t b = 0; b < n / 256; b++) {
        const uint8_t *x = (const uint8_t *)w + TDM_B_IQ4_XS * b, *y = (const uint8_t *)xq + TDM_ACT_Q8_K * b;
        float d4d8 = tdm_rd_fp16(x + IQ4XS_D) * tdm_rd_f32(y + Q8K_D);
        for (int ib = 0; ib < 8; ib++) {
            int v[32];
            lookup32(x + IQ4XS_QS + 16 * ib, tdm_kvalues_iq4nl, v);
            int s = dot32(v, (const int8_t *)(y + Q8K_QS + 32 * ib));
            acc += (d4d8 * (float)tdm_iq4xs_scale(x, ib)) * (float)s;
        }
    }
    return acc;
}

const tdm_kernel_table tdm_kernels_scalar = {
    .quant = {[TDM_Q_F32] = quant_f32, [TDM_Q_Q8_0] = quant_q8_0, [TDM_Q_Q8_1] = quant_q8_1,
              [TDM_Q_Q8_K] = quant_q8_k},
    .dot = {[TDM_Q_F32] = dot_f32, [TDM_Q_F16] = dot_f16, [TDM_Q_BF16] = dot_bf16,
            [TDM_Q_Q4_0] = dot_q4_0, [TDM_Q_Q4_1] = dot_q4_1, [TDM_Q_Q5_0] = dot_q5_0,
            [TDM_Q_Q5_1] = dot_q5_1, [TDM_Q_Q8_0] = dot_q8_0, [TDM_Q_IQ4_NL] = dot_iq4_nl,
            [TDM_Q_MXFP4] = dot_mxfp4, [TDM_Q_Q2_K] = dot_q2_k, [TDM_Q_Q3_K] = dot_q3_k,
            [TDM_Q_Q4_K] = dot_q4_k, [TDM_Q_Q5_K] = dot_q5_k, [TDM_Q_Q6_K] = dot_q6_k,
            [TDM_Q_IQ4_XS] = dot_iq4_xs},
};
