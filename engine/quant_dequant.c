/* Reference dequantisation (spec gguf.md §2.4). Every product below is exact
 * in binary32 (§2.5), so the only rounding is the final add of a min term;
 * the association order is ggml's so results match it bit for bit. */
#include "quant.h"
#include "quant_blocks.h"

const int8_t tdm_kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                      1,    13,   25,  38,  53,  69,  89,  113};
const int8_t tdm_kvalues_fp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* Elements e and e+16 of a 32-block come from the low and high nibble of qs[e]. */
static void dq_nibbles(const uint8_t *qs, int lo[32])
{
    for (int j = 0; j < 16; j++) {
        lo[j] = qs[j] & 0xF;
        lo[j + 16] = qs[j] >> 4;
    }
}

static void dq_q4_0(const uint8_t *b, float *y)
{
    float d = tdm_rd_fp16(b);
    int n[32];
    dq_nibbles(b + 2, n);
    for (int e = 0; e < 32; e++)
        y[e] = (float)(n[e] - 8) * d;
}

static void dq_q4_1(const uint8_t *b, float *y)
{
    float d = tdm_rd_fp16(b), m = tdm_rd_fp16(b + 2);
    int n[32];
    dq_nibbles(b + 4, n);
    for (int e = 0; e < 32; e++)
        y[e] = (float)n[e] * d + m;
}

static void dq_q5_0(const uint8_t *b, float *y)
{
    float d = tdm_rd_fp16(b);
    uint32_t h = tdm_rd_u32(b + 2);
    int n[32];
    dq_nibbles(b + 6, n);
    for (int e = 0; e < 32; e++)
        y[e] = (float)((n[e] | (int)((h >> e) & 1) << 4) - 16) * d;
}

static void dq_q5_1(const uint8_t *b, float *y)
{
    float d = tdm_rd_fp16(b), m = tdm_rd_fp16(b + 2);
    uint32_t h = tdm_rd_u32(b + 4);
    int n[32];
    dq_nibbles(b + 8, n);
    for (int e = 0; e < 32; e++)
        y[e] = (float)(n[e] | (int)((h >> e) & 1) << 4) * d + m;
}

static void dq_q8_0(const uint8_t *b, float *y)
{
    float d = tdm_rd_fp16(b);
    for (int e = 0; e < 32; e++)
        y[e] = (float)(int8_t)b[2 + e] * d;
}

static void dq_iq4_nl(const uint8_t *b, float *y)
{
    float d = tdm_rd_fp16(b);
    int n[32];
    dq_nibbles(b + 2, n);
    for (int e = 0; e < 32; e++)
        y[e] = d * (float)tdm_kvalues_iq4nl[n[e]];
}

static void dq_mxfp4(const uint8_t *b, float *y)
{
    float d = tdm_e8m0_half(b[0]);
    int n[32];
    dq_nibbles(b + 1, n);
    for (int e = 0; e < 32; e++)
        y[e] = (float)tdm_kvalues_fp4[n[e]] * d;
}

static void dq_q2_k(const uint8_t *b, float *y)
{
    float d = tdm_rd_fp16(b + Q2K_D), dmin = tdm_rd_fp16(b + Q2K_DMIN);
    const uint8_t *sc = b + Q2K_SCALES, *qs = b + Q2K_QS;
    for (int e = 0; e < 256; e++) {
        int h = e / 128, j = (e % 128) / 32, l = e % 32, g = e / 16;
        int q = (qs[32 * h + l] >> (2 * j)) & 3;
        float dl = d * (float)(sc[g] & 0xF), ml = dmin * (float)(sc[g] >> 4);
        y[e] = dl * (float)q - ml;
    }
}

static void dq_q3_k(const uint8_t *b, float *y)
{
    float d = tdm_rd_fp16(b + Q3K_D);
    int8_t s[16];
    tdm_q3k_scales(b + Q3K_SCALES, s);
    const uint8_t *hm = b + Q3K_HMASK, *qs = b + Q3K_QS;
    for (int e = 0; e < 256; e++) {
        int h = e / 128, j = (e % 128) / 32, l = e % 32;
        int q = (qs[32 * h + l] >> (2 * j)) & 3;
        int v = q - ((hm[l] >> (4 * h + j)) & 1 ? 0 : 4);
        y[e] = (d * (float)s[e / 16]) * (float)v;
    }
}

/* Q4_K and Q5_K share everything but the fifth bit (qh == NULL for Q4_K). */
static void dq_q45_k(const uint8_t *b, const uint8_t *qh, const uint8_t *qs, float *y)
{
    float d = tdm_rd_fp16(b), dmin = tdm_rd_fp16(b + 2);
    uint8_t sc[8], mn[8];
    tdm_q4k_scales(b + Q4K_SCALES, sc, mn);
    for (int e = 0; e < 256; e++) {
        int k = e / 32, l = e % 32;
        int n = (qs[32 * (k / 2) + l] >> (4 * (k % 2))) & 0xF;
        if (qh)
            n += ((qh[l] >> k) & 1) << 4;
        y[e] = (d * (float)sc[k]) * (float)n - dmin * (float)mn[k];
    }
}

static void dq_q4_k(const uint8_t *b, float *y) { dq_q45_k(b, NULL, b + Q4K_QS, y); }
static void dq_q5_k(const uint8_t *b, float *y) { dq_q45_k(b, b + Q5K_QH, b + Q5K_QS, y); }

static void dq_q6_k(const uint8_t *b, float *y)
{
    float d = tdm_rd_fp16(b + Q6K_D);
    const int8_t *sc = (const int8_t *)(b + Q6K_SCALES);
    for (int e = 0; e < 256; e++) {
        int h = e / 128, part = (e % 128) / 32, l = e % 32;
        uint8_t ql = b[Q6K_QL + 64 * h + 32 * (part & 1) + l];
        int nib = (part >> 1) ? ql >> 4 : ql & 0xF;
        int hi = (b[Q6K_QH + 32 * h + l] >> (2 * part)) & 3;
        y[e] = (d * (float)sc[e / 16]) * (float)((nib | hi << 4) - 32);
    }
}

static void dq_iq4_xs(const uint8_t *b, float *y)
{
    float d = tdm_rd_fp16(b + IQ4XS_D);
    for (int ib = 0; ib < 8; ib++) {
        float dl = d * (float)tdm_iq4xs_scale(b, ib);
        int n[32];
        dq_nibbles(b + IQ4XS_QS + 16 * ib, n);
        for (int e = 0; e < 32; e++)
            y[32 * ib + e] = dl * (float)tdm_kvalues_iq4nl[n[e]];
    }
}

typedef void (*dq_block_fn)(const uint8_t *blk, float *y);

static dq_block_fn block_fn(tdm_qtype t)
{
    switch (t) {
    case TDM_Q_Q4_0: return dq_q4_0;
    case TDM_Q_Q4_1: return dq_q4_1;
    case TDM_Q_Q5_0: return dq_q5_0;
    case TDM_Q_Q5_1: return dq_q5_1;
    case TDM_Q_Q8_0: return dq_q8_0;
    case TDM_Q_IQ4_NL: return dq_iq4_nl;
    case TDM_Q_MXFP4: return dq_mxfp4;
    case TDM_Q_Q2_K: return dq_q2_k;
    case TDM_Q_Q3_K: return dq_q3_k;
    case TDM_Q_Q4_K: return dq_q4_k;
    case TDM_Q_Q5_K: return dq_q5_k;
    case TDM_Q_Q6_K: return dq_q6_k;
    case TDM_Q_IQ4_XS: return dq_iq4_xs;
    default: return NULL;
    }
}

tdm_status tdm_dequant_row(tdm_qtype t, const void *src, float *dst, int64_t n, tdm_error *err)
{
    const tdm_qtype_info *q = tdm_qtype_get((uint32_t)t);
    if (!q)
        return tdm_error_set(err, TDM_ERR_UNSUPPORTED, "dequant: unknown type id %d", (int)t);
    if (!q->dequant)
        return tdm_error_set(err, TDM_ERR_UNSUPPORTED, "dequant: type %s is not supported",
                             q->name);
    if (n < 0 || n % q->block)
        return tdm_error_set(err, TDM_ERR_INVALID,
                             "dequant: n = %lld is not a non-negative multiple of %s's block %u",
                             (long long)n, q->name, q->block);
    if (n > 0 && (!src || !dst))
        return tdm_error_set(err, TDM_ERR_INVALID, "dequant: NULL %s", src ? "dst" : "src");
    const uint8_t *s = src;
    switch (t) {
    case TDM_Q_F32:
        memcpy(dst, src, (size_t)n * 4);
        return TDM_OK;
    case TDM_Q_F16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = tdm_fp16_to_fp32(tdm_rd_u16(s + 2 * i));
        return TDM_OK;
    case TDM_Q_BF16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = tdm_bf16_to_fp32(tdm_rd_u16(s + 2 * i));
        return TDM_OK;
    default:
        break;
    }
    dq_block_fn fn = block_fn(t);
    if (!fn)
        return tdm_error_set(err, TDM_ERR_UNSUPPORTED, "dequant: no dequantiser for %s", q->name);
    for (int64_t b = 0; b < n / q->block; b++)
        fn(s + b * q->type_size, dst + b * q->block);
    return TDM_OK;
}
