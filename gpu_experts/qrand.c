/* qrand: see qrand.h. Scales: payload statistics of each format (uniform
 * random codes) give the factor between the block scale and the values'
 * standard deviation; the constants below are those factors. */
#include "qrand.h"

#include <math.h>
#include <string.h>

uint64_t tdm_qrand_mix(uint64_t a, uint64_t b)
{
    uint64_t z = a ^ (b + 0x9E3779B97F4A7C15ull + (a << 6) + (a >> 2));
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* uniform in [0.5, 1.5): scales vary between blocks like real ones do */
static float jitter(uint64_t *s) { return 0.5f + (float)(next(s) >> 40) * (1.0f / 16777216.0f); }

/* approximately N(0, 1): sum of 4 uniforms, rescaled */
static float gauss(uint64_t *s)
{
    float a = 0;
    for (int i = 0; i < 4; i++)
        a += (float)(next(s) >> 40) * (1.0f / 16777216.0f);
    return (a - 2.0f) * 1.7320508f;
}

static void put16(uint8_t *p, uint16_t h)
{
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

static void puth(uint8_t *p, float v) { put16(p, tdm_fp32_to_fp16(v)); }

static void fill_random(uint8_t *dst, size_t bytes, uint64_t *s)
{
    size_t i = 0;
    for (; i + 8 <= bytes; i += 8) {
        uint64_t v = next(s);
        memcpy(dst + i, &v, 8);
    }
    if (i < bytes) {
        uint64_t v = next(s);
        memcpy(dst + i, &v, bytes - i);
    }
}

tdm_status tdm_qrand_fill(tdm_qtype t, void *dst, int64_t n_blocks, float sigma, uint64_t seed,
                          tdm_error *err)
{
    const tdm_qtype_info *qi = tdm_qtype_get(t);
    uint8_t *p = dst;
    uint64_t s = seed;
    if (!qi || n_blocks < 0 || !(sigma > 0))
        return tdm_error_set(err, TDM_ERR_INVALID, "qrand: type %d, %lld blocks, sigma %g", (int)t,
                             (long long)n_blocks, (double)sigma);
    switch (t) {
    case TDM_Q_F32:
        for (int64_t i = 0; i < n_blocks; i++) {
            float v = sigma * gauss(&s);
            memcpy(p + 4 * i, &v, 4);
        }
        return TDM_OK;
    case TDM_Q_F16:
    case TDM_Q_BF16:
        for (int64_t i = 0; i < n_blocks; i++) {
            float v = sigma * gauss(&s);
            put16(p + 2 * i, t == TDM_Q_F16 ? tdm_fp32_to_fp16(v) : tdm_fp32_to_bf16(v));
        }
        return TDM_OK;
    default:
        break;
    }
    fill_random(p, (size_t)n_blocks * qi->type_size, &s);
    for (int64_t b = 0; b < n_blocks; b++) {
        uint8_t *q = p + b * qi->type_size;
        float d = sigma * jitter(&s);
        switch (t) {
        case TDM_Q_Q4_0: puth(q, d / 4.6f); break;
        case TDM_Q_Q5_0: puth(q, d / 9.2f); break;
        case TDM_Q_Q4_1: puth(q, d / 4.6f), puth(q + 2, -7.5f * d / 4.6f); break;
        case TDM_Q_Q5_1: puth(q, d / 9.2f), puth(q + 2, -15.5f * d / 9.2f); break;
        case TDM_Q_Q8_0: puth(q, d / 74.0f); break;
        case TDM_Q_IQ4_NL: puth(q, d / 70.0f); break;
        case TDM_Q_MXFP4: {
            int e = 128 + (int)lrintf(log2f(d / 5.3f));
            q[0] = (uint8_t)(e < 1 ? 1 : e > 254 ? 254 : e);
            break;
        }
        case TDM_Q_Q2_K: puth(q + 80, d / 9.7f), puth(q + 82, 1.5f * d / 9.7f); break;
        case TDM_Q_Q3_K: puth(q + 108, d / 42.0f); break;
        case TDM_Q_Q4_K: puth(q, d / 200.0f), puth(q + 2, 7.5f * d / 200.0f); break;
        case TDM_Q_Q5_K: puth(q, d / 400.0f), puth(q + 2, 15.5f * d / 400.0f); break;
        case TDM_Q_Q6_K: puth(q + 208, d / 1370.0f); break;
        case TDM_Q_IQ4_XS: puth(q, d / 1300.0f); break;
        case TDM_Q_Q8_K: { /* float32 d, bsums consistent with qs */
            float dk = d / 74.0f;
            memcpy(q, &dk, 4);
            for (int g = 0; g < 16; g++) {
                int sum = 0;
                for (int i = 0; i < 16; i++)
                    sum += (int8_t)q[4 + 16 * g + i];
                q[260 + 2 * g] = (uint8_t)(sum & 0xFF);
                q[261 + 2 * g] = (uint8_t)((sum >> 8) & 0xFF);
            }
            break;
        }
        default:
            return tdm_error_set(err, TDM_ERR_UNSUPPORTED, "qrand: no generator for type %s",
                                 tdm_qtype_name(t));
        }
    }
    return TDM_OK;
}
