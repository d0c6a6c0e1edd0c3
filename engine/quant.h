/* quant: the ggml tensor-type table and the reference (scalar) dequantiser.
 *
 * Type ids are ggml's (they are what GGUF files store). The table knows the
 * block geometry of every id ggml defines so that the GGUF reader can validate
 * any file; `dequant` says whether this engine can compute with the type.
 * Reference dequantisation matches ggml's dequantize_row_* bit for bit.
 * No state; everything here is thread-safe.
 */
#ifndef TDM_QUANT_H
#define TDM_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

typedef enum tdm_qtype {
    TDM_Q_F32 = 0,
    TDM_Q_F16 = 1,
    TDM_Q_Q4_0 = 2,
    TDM_Q_Q4_1 = 3,
    TDM_Q_Q5_0 = 6,
    TDM_Q_Q5_1 = 7,
    TDM_Q_Q8_0 = 8,
    TDM_Q_Q8_1 = 9,
    TDM_Q_Q2_K = 10,
    TDM_Q_Q3_K = 11,
    TDM_Q_Q4_K = 12,
    TDM_Q_Q5_K = 13,
    TDM_Q_Q6_K = 14,
    TDM_Q_Q8_K = 15,
    TDM_Q_IQ2_XXS = 16,
    TDM_Q_IQ2_XS = 17,
    TDM_Q_IQ3_XXS = 18,
    TDM_Q_IQ1_S = 19,
    TDM_Q_IQ4_NL = 20,
    TDM_Q_IQ3_S = 21,
    TDM_Q_IQ2_S = 22,
    TDM_Q_IQ4_XS = 23,
    TDM_Q_I8 = 24,
    TDM_Q_I16 = 25,
    TDM_Q_I32 = 26,
    TDM_Q_I64 = 27,
    TDM_Q_F64 = 28,
    TDM_Q_IQ1_M = 29,
    TDM_Q_BF16 = 30,
    TDM_Q_TQ1_0 = 34,
    TDM_Q_TQ2_0 = 35,
    TDM_Q_MXFP4 = 39,
    TDM_Q_NVFP4 = 40,
    TDM_Q_Q1_0 = 41,
    TDM_Q_Q2_0 = 42,
    TDM_Q_COUNT = 43
} tdm_qtype;

typedef struct tdm_qtype_info {
    const char *name;       /* ggml's name, e.g. "Q4_K" */
    uint32_t block;         /* elements per block (1 for plain types) */
    uint32_t type_size;     /* bytes per block */
    bool dequant;           /* this engine dequantises and multiplies it */
    tdm_qtype vec_dot_type; /* activation format its CPU dot product takes */
} tdm_qtype_info;

/* The entry for a type id, or NULL for ids ggml never defined or removed
 * (4, 5, 31-33, 36-38, >= TDM_Q_COUNT). */
const tdm_qtype_info *tdm_qtype_get(uint32_t id);

/* Name for printing; "?" for an unknown id. */
const char *tdm_qtype_name(uint32_t id);
/* The id of a ggml type name ("Q4_K"), or -1. */
int tdm_qtype_from_name(const char *name);

/* Bytes of one row of n elements (n must be a multiple of the block). */
size_t tdm_qtype_row_bytes(tdm_qtype t, int64_t n);

/* Reference dequantisation of one row of n elements into dst[n].
 * TDM_ERR_UNSUPPORTED for types with dequant == false, TDM_ERR_INVALID when n
 * is not a multiple of the block size. */
tdm_status tdm_dequant_row(tdm_qtype t, const void *src, float *dst, int64_t n, tdm_error *err);

/* Scalar conversions (exact IEEE; fp32->fp16 and fp32->bf16 round to nearest even). */
float tdm_fp16_to_fp32(uint16_t h);
uint16_t tdm_fp32_to_fp16(float f);
float tdm_bf16_to_fp32(uint16_t h);
uint16_t tdm_fp32_to_bf16(float f);

#endif
