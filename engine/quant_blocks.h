/* quant_blocks: internal block-layout helpers shared by the reference
 * dequantiser (engine/quant.c) and the CPU kernels (cpu_experts/kernels_*.c).
 * Not a public API: byte offsets of every block field, the scale unpackers of
 * the K-quants and the small value tables (spec gguf.md §2.3-2.4).
 * Blocks are only byte-aligned in general, so multi-byte fields are read
 * with memcpy.
 */
#ifndef TDM_QUANT_BLOCKS_H
#define TDM_QUANT_BLOCKS_H

#include <stdint.h>
#include <string.h>

#include "quant.h"

#define TDM_QK 32   /* elements of a 32-block (Q4_0 .. Q8_1, IQ4_NL, MXFP4) */
#define TDM_QK_K 256 /* elements of a K-quant super-block */

/* Block sizes in bytes (ggml-common.h). */
enum {
    TDM_B_Q4_0 = 18, TDM_B_Q4_1 = 20, TDM_B_Q5_0 = 22, TDM_B_Q5_1 = 24,
    TDM_B_Q8_0 = 34, TDM_B_Q8_1 = 36, TDM_B_IQ4_NL = 18, TDM_B_MXFP4 = 17,
    TDM_B_Q2_K = 84, TDM_B_Q3_K = 110, TDM_B_Q4_K = 144, TDM_B_Q5_K = 176,
    TDM_B_Q6_K = 210, TDM_B_Q8_K = 292, TDM_B_IQ4_XS = 136
};

/* Field offsets inside K-quant blocks. */
enum {
    Q2K_SCALES = 0, Q2K_QS = 16, Q2K_D = 80, Q2K_DMIN = 82,
    Q3K_HMASK = 0, Q3K_QS = 32, Q3K_SCALES = 96, Q3K_D = 108,
    Q4K_D = 0, Q4K_DMIN = 2, Q4K_SCALES = 4, Q4K_QS = 16,
    Q5K_D = 0, Q5K_DMIN = 2, Q5K_SCALES = 4, Q5K_QH = 16, Q5K_QS = 48,
    Q6K_QL = 0, Q6K_QH = 128, Q6K_SCALES = 192, Q6K_D = 208,
    IQ4XS_D = 0, IQ4XS_SH = 2, IQ4XS_SL = 4, IQ4XS_QS = 8
};

extern const int8_t tdm_kvalues_iq4nl[16];
extern const int8_t tdm_kvalues_fp4[16];

static inline uint16_t tdm_rd_u16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

static inline uint32_t tdm_rd_u32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline float tdm_rd_f32(const uint8_t *p)
{
    float v;
    memcpy(&v, p, 4);
    return v;
}

static inline float tdm_rd_fp16(const uint8_t *p)
{
    return tdm_fp16_to_fp32(tdm_rd_u16(p));
}

/* E8M0 scale of MXFP4 as ggml uses it: 2^(e-128), "half" because the FP4
 * value table is doubled. Exact for e in 0..254. */
static inline float tdm_e8m0_half(uint8_t e)
{
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Q4_K / Q5_K 6-bit scales and mins of the 8 sub-blocks (get_scale_min_k4). */
static inline void tdm_q4k_scales(const uint8_t *q, uint8_t sc[8], uint8_t mn[8])
{
    for (int k = 0; k < 4; k++) {
        sc[k] = q[k] & 63;
        mn[k] = q[k + 4] & 63;
        sc[k + 4] = (uint8_t)((q[k + 8] & 0xF) | ((q[k] >> 6) << 4));
        mn[k + 4] = (uint8_t)((q[k + 8] >> 4) | ((q[k + 4] >> 6) << 4));
    }
}

/* The same unpacking on 32-bit words: byte k of *sc / *mn is sc[k] / mn[k].
 * Bits 6-7 of a byte shift right by 2 into bits 4-5 of the same byte, so
 * whole words can be masked at once. */
static inline void tdm_q4k_scales_packed(const uint8_t *q, uint64_t *sc, uint64_t *mn)
{
    uint32_t a = tdm_rd_u32(q), b = tdm_rd_u32(q + 4), c = tdm_rd_u32(q + 8);
    uint32_t sc_hi = (c & 0x0F0F0F0Fu) | ((a >> 2) & 0x30303030u);
    uint32_t mn_hi = ((c >> 4) & 0x0F0F0F0Fu) | ((b >> 2) & 0x30303030u);
    *sc = (uint64_t)(a & 0x3F3F3F3Fu) | (uint64_t)sc_hi << 32;
    *mn = (uint64_t)(b & 0x3F3F3F3Fu) | (uint64_t)mn_hi << 32;
}

/* Q3_K: the sixteen 6-bit group scales (0..63, before the -32), one byte
 * each, groups 0..7 in *lo and 8..15 in *hi (little-endian byte order).
 * Group k < 4 takes the low nibble of b[k] and bits 0-1 of b[8 + k], group
 * 4 + k the low nibble of b[4 + k] and bits 2-3, groups 8 + k and 12 + k the
 * high nibbles and bits 4-5 / 6-7: four bytes at a time. */
static inline void tdm_q3k_scales_packed(const uint8_t *b, uint64_t *lo, uint64_t *hi)
{
    const uint32_t a = tdm_rd_u32(b), c = tdm_rd_u32(b + 4), h = tdm_rd_u32(b + 8), m4 = 0x0F0F0F0Fu,
                   m2 = 0x30303030u;
    *lo = (uint64_t)((a & m4) | ((h << 4) & m2)) | (uint64_t)((c & m4) | ((h << 2) & m2)) << 32;
    *hi = (uint64_t)(((a >> 4) & m4) | (h & m2)) | (uint64_t)(((c >> 4) & m4) | ((h >> 2) & m2)) << 32;
}

/* Q3_K: the sixteen 6-bit group scales minus 32 (range -32..31). */
static inline void tdm_q3k_scales(const uint8_t *b, int8_t s[16])
{
    uint64_t w[2];
    tdm_q3k_scales_packed(b, &w[0], &w[1]);
    for (int k = 0; k < 16; k++)
        s[k] = (int8_t)((int)((w[k / 8] >> (8 * (k % 8))) & 0xFF) - 32);
}

/* IQ4_XS: 6-bit scale of sub-block ib minus 32 (range -32..31). */
static inline int tdm_iq4xs_scale(const uint8_t *blk, int ib)
{
    uint16_t sh = tdm_rd_u16(blk + IQ4XS_SH);
    int lo = (blk[IQ4XS_SL + ib / 2] >> (4 * (ib % 2))) & 0xF;
    int hi = (sh >> (2 * ib)) & 3;
    return (lo | (hi << 4)) - 32;
}

#endif
