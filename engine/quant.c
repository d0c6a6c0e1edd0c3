#include "quant.h"

#include <string.h>

/* Block geometry of every ggml type id (ggml-common.h / ggml.c type_traits).
 * Ids ggml removed have no entry (name == NULL). */
static const tdm_qtype_info k_types[TDM_Q_COUNT] = {
    [TDM_Q_F32] = {"F32", 1, 4, true, TDM_Q_F32},
    [TDM_Q_F16] = {"F16", 1, 2, true, TDM_Q_F32},
    [TDM_Q_Q4_0] = {"Q4_0", 32, 18, true, TDM_Q_Q8_0},
    [TDM_Q_Q4_1] = {"Q4_1", 32, 20, true, TDM_Q_Q8_1},
    [TDM_Q_Q5_0] = {"Q5_0", 32, 22, true, TDM_Q_Q8_0},
    [TDM_Q_Q5_1] = {"Q5_1", 32, 24, true, TDM_Q_Q8_1},
    [TDM_Q_Q8_0] = {"Q8_0", 32, 34, true, TDM_Q_Q8_0},
    [TDM_Q_Q8_1] = {"Q8_1", 32, 36, false, TDM_Q_Q8_1},
    [TDM_Q_Q2_K] = {"Q2_K", 256, 84, true, TDM_Q_Q8_K},
    [TDM_Q_Q3_K] = {"Q3_K", 256, 110, true, TDM_Q_Q8_K},
    [TDM_Q_Q4_K] = {"Q4_K", 256, 144, true, TDM_Q_Q8_K},
    [TDM_Q_Q5_K] = {"Q5_K", 256, 176, true, TDM_Q_Q8_K},
    [TDM_Q_Q6_K] = {"Q6_K", 256, 210, true, TDM_Q_Q8_K},
    [TDM_Q_Q8_K] = {"Q8_K", 256, 292, false, TDM_Q_Q8_K},
    [TDM_Q_IQ2_XXS] = {"IQ2_XXS", 256, 66, false, TDM_Q_Q8_K},
    [TDM_Q_IQ2_XS] = {"IQ2_XS", 256, 74, false, TDM_Q_Q8_K},
    [TDM_Q_IQ3_XXS] = {"IQ3_XXS", 256, 98, false, TDM_Q_Q8_K},
    [TDM_Q_IQ1_S] = {"IQ1_S", 256, 50, false, TDM_Q_Q8_K},
    [TDM_Q_IQ4_NL] = {"IQ4_NL", 32, 18, true, TDM_Q_Q8_0},
    [TDM_Q_IQ3_S] = {"IQ3_S", 256, 110, false, TDM_Q_Q8_K},
    [TDM_Q_IQ2_S] = {"IQ2_S", 256, 82, false, TDM_Q_Q8_K},
    [TDM_Q_IQ4_XS] = {"IQ4_XS", 256, 136, true, TDM_Q_Q8_K},
    [TDM_Q_I8] = {"I8", 1, 1, false, TDM_Q_I8},
    [TDM_Q_I16] = {"I16", 1, 2, false, TDM_Q_I16},
    [TDM_Q_I32] = {"I32", 1, 4, false, TDM_Q_I32},
    [TDM_Q_I64] = {"I64", 1, 8, false, TDM_Q_I64},
    [TDM_Q_F64] = {"F64", 1, 8, false, TDM_Q_F64},
    [TDM_Q_IQ1_M] = {"IQ1_M", 256, 56, false, TDM_Q_Q8_K},
    [TDM_Q_BF16] = {"BF16", 1, 2, true, TDM_Q_F32},
    [TDM_Q_TQ1_0] = {"TQ1_0", 256, 54, false, TDM_Q_Q8_K},
    [TDM_Q_TQ2_0] = {"TQ2_0", 256, 66, false, TDM_Q_Q8_K},
    [TDM_Q_MXFP4] = {"MXFP4", 32, 17, true, TDM_Q_Q8_0},
    [TDM_Q_NVFP4] = {"NVFP4", 64, 36, false, TDM_Q_Q8_0},
    [TDM_Q_Q1_0] = {"Q1_0", 128, 18, false, TDM_Q_Q8_0},
    [TDM_Q_Q2_0] = {"Q2_0", 64, 18, false, TDM_Q_Q8_0},
};

const tdm_qtype_info *tdm_qtype_get(uint32_t id)
{
    if (id >= TDM_Q_COUNT || !k_types[id].name)
        return NULL;
    return &k_types[id];
}

const char *tdm_qtype_name(uint32_t id)
{
    const tdm_qtype_info *t = tdm_qtype_get(id);
    return t ? t->name : "?";
}

int tdm_qtype_from_name(const char *name)
{
    for (uint32_t i = 0; i < TDM_Q_COUNT; i++)
        if (k_types[i].name && strcmp(k_types[i].name, name) == 0)
            return (int)i;
    return -1;
}

size_t tdm_qtype_row_bytes(tdm_qtype t, int64_t n)
{
    const tdm_qtype_info *q = tdm_qtype_get(t);
    return q ? (size_t)(n / q->block) * q->type_size : 0;
}

float tdm_fp16_to_fp32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else { /* subnormal: normalise */
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t tdm_fp32_to_fp16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) /* NaN: quiet, keep sign */
        return sign | 0x7e00;
    if (ax >= 0x477ff000u) /* rounds to >= 65520: overflow to Inf */
        return sign | 0x7c00;
    if (ax < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
        if (ax < 0x33000000u) /* < 2^-25: rounds to zero */
            return sign;
        uint32_t e = ax >> 23, m = (ax & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - e; /* 14..24 */
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1)))
            q++;
        return sign | (uint16_t)q;
    }
    uint32_t r = ax + 0xfff + ((ax >> 13) & 1) - 0x38000000u; /* rebias 127 -> 15, RNE */
    return sign | (uint16_t)(r >> 13);
}

float tdm_bf16_to_fp32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t tdm_fp32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40);
    return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}
