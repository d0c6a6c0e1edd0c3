/* gguf: a validating GGUF v2/v3 reader over a read-only memory mapping.
 *
 * tdm_gguf_open() maps the file, parses and checks everything (header,
 * metadata of every value type, tensor infos, alignment, bounds) before it
 * returns; afterwards every accessor is a bounds-checked view into the
 * mapping and never fails on memory. Rejections are TDM_ERR_FORMAT with a
 * message naming the field. Ownership: the tdm_gguf owns the mapping and its
 * index; every pointer it hands out (names, strings, tensor data) lives until
 * tdm_gguf_free(). Strings from the file are NOT NUL-terminated unless noted:
 * use the returned length.
 */
#ifndef TDM_GGUF_H
#define TDM_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "quant.h"
#include "status.h"

typedef enum tdm_gguf_vtype {
    TDM_GGUF_UINT8 = 0,
    TDM_GGUF_INT8 = 1,
    TDM_GGUF_UINT16 = 2,
    TDM_GGUF_INT16 = 3,
    TDM_GGUF_UINT32 = 4,
    TDM_GGUF_INT32 = 5,
    TDM_GGUF_FLOAT32 = 6,
    TDM_GGUF_BOOL = 7,
    TDM_GGUF_STRING = 8,
    TDM_GGUF_ARRAY = 9,
    TDM_GGUF_UINT64 = 10,
    TDM_GGUF_INT64 = 11,
    TDM_GGUF_FLOAT64 = 12
} tdm_gguf_vtype;

typedef struct tdm_gguf tdm_gguf;

typedef struct tdm_gguf_tensor {
    const char *name;  /* NUL-terminated, owned by the tdm_gguf */
    tdm_qtype type;
    uint32_t n_dims;   /* 1..4 */
    int64_t ne[4];     /* ne[0] fastest; unused dims are 1 */
    uint64_t offset;   /* from the start of the data section */
    uint64_t nbytes;   /* exact payload size (without padding) */
    const void *data;  /* view into the mapping at a multiple of tdm_gguf_alignment()
                        * (32 unless the file sets general.alignment) from the
                        * base, which is page-aligned for tdm_gguf_open(); NULL
                        * only for a tensor past EOF under TDM_GGUF_OPEN_PARTIAL */
} tdm_gguf_tensor;

/* Opens and validates path. On failure *out is NULL. */
tdm_status tdm_gguf_open(const char *path, tdm_gguf **out, tdm_error *err);

/* Parses a buffer the caller keeps alive and unchanged until tdm_gguf_free()
 * (used by the fuzzer and by tests that build files in memory). */
tdm_status tdm_gguf_open_memory(const void *data, size_t size, tdm_gguf **out, tdm_error *err);

void tdm_gguf_free(tdm_gguf *g);

uint32_t tdm_gguf_version(const tdm_gguf *g);
uint64_t tdm_gguf_file_size(const tdm_gguf *g);
uint64_t tdm_gguf_data_offset(const tdm_gguf *g); /* absolute offset of the data section */
uint32_t tdm_gguf_alignment(const tdm_gguf *g);
const void *tdm_gguf_base(const tdm_gguf *g);     /* first byte of the mapping */

/* ---- metadata ---- */
int64_t tdm_gguf_kv_count(const tdm_gguf *g);
/* Index of key, or -1 when absent. */
int64_t tdm_gguf_find_key(const tdm_gguf *g, const char *key);
const char *tdm_gguf_kv_key(const tdm_gguf *g, int64_t i); /* NUL-terminated */
tdm_gguf_vtype tdm_gguf_kv_type(const tdm_gguf *g, int64_t i);

/* Typed getters by key. Integer getters accept any integer value type whose
 * value fits the requested type; float getters accept FLOAT32 and FLOAT64.
 * A missing key is TDM_ERR_FORMAT naming it; callers that treat a key as
 * optional check tdm_gguf_find_key() first. */
tdm_status tdm_gguf_get_u32(const tdm_gguf *g, const char *key, uint32_t *out, tdm_error *err);
tdm_status tdm_gguf_get_u64(const tdm_gguf *g, const char *key, uint64_t *out, tdm_error *err);
tdm_status tdm_gguf_get_i64(const tdm_gguf *g, const char *key, int64_t *out, tdm_error *err);
tdm_status tdm_gguf_get_f32(const tdm_gguf *g, const char *key, float *out, tdm_error *err);
tdm_status tdm_gguf_get_bool(const tdm_gguf *g, const char *key, bool *out, tdm_error *err);
tdm_status tdm_gguf_get_str(const tdm_gguf *g, const char *key, const char **s, size_t *len,
                            tdm_error *err);

/* Arrays: element type and count of the array stored at key. */
tdm_status tdm_gguf_get_arr(const tdm_gguf *g, const char *key, tdm_gguf_vtype *elem_type,
                            uint64_t *count, tdm_error *err);
/* Element i of an array of strings (O(1)). */
tdm_status tdm_gguf_arr_str(const tdm_gguf *g, const char *key, uint64_t i, const char **s,
                            size_t *len, tdm_error *err);
/* Element i of an integer / bool array as int64, of a float array as double. */
tdm_status tdm_gguf_arr_int(const tdm_gguf *g, const char *key, uint64_t i, int64_t *out,
                            tdm_error *err);
tdm_status tdm_gguf_arr_float(const tdm_gguf *g, const char *key, uint64_t i, double *out,
                              tdm_error *err);

/* ---- tensors ---- */
int64_t tdm_gguf_tensor_count(const tdm_gguf *g);
const tdm_gguf_tensor *tdm_gguf_tensor_at(const tdm_gguf *g, int64_t i);
/* NULL when absent. */
const tdm_gguf_tensor *tdm_gguf_find_tensor(const tdm_gguf *g, const char *name);

/* ---- additions (gguf task) ---- */

/* Flags for tdm_gguf_open_ex(). */
#define TDM_GGUF_OPEN_PARTIAL 1u /* accept tensors whose data lies (partly) past EOF, e.g.
                                  * an unfinished download: the header is still fully
                                  * validated; such tensors get data == NULL and
                                  * tdm_gguf_complete() is false. For `tandem info`. */

/* tdm_gguf_open() with flags (0 = the same as tdm_gguf_open). */
tdm_status tdm_gguf_open_ex(const char *path, uint32_t flags, tdm_gguf **out, tdm_error *err);
tdm_status tdm_gguf_open_memory_ex(const void *data, size_t size, uint32_t flags, tdm_gguf **out,
                                   tdm_error *err);

/* Absolute end of the last byte of tensor data (max over tensors of
 * data_offset + offset + nbytes; data_offset when there is no tensor). */
uint64_t tdm_gguf_data_end(const tdm_gguf *g);
/* data_end <= file size (always true unless opened with TDM_GGUF_OPEN_PARTIAL). */
bool tdm_gguf_complete(const tdm_gguf *g);

/* FLOAT32 or FLOAT64 value as double (get_f32 rejects FLOAT64 values beyond float range). */
tdm_status tdm_gguf_get_f64(const tdm_gguf *g, const char *key, double *out, tdm_error *err);

/* Optional content check (llama.cpp --check-tensors, spec gguf.md §1.7.16):
 * F32/F16/BF16 values must be finite; so must the fp16 block scales (d, and
 * dmin/m/s where the type has them) of the block types, the f32 d of Q8_K;
 * MXFP4 exponents must not be 0xFF. IQ1_M and NVFP4 scales are not checked.
 * Reads every byte of the tensor (run on demand, e.g. `tandem info --check`).
 * TDM_ERR_FORMAT naming the tensor and the first bad element or block; also
 * when the tensor's data is missing (partial open). */
tdm_status tdm_gguf_check_tensor_data(const tdm_gguf_tensor *t, tdm_error *err);

/* "UINT32", "STRING", ...; "?" for an unknown id. */
const char *tdm_gguf_vtype_name(tdm_gguf_vtype t);
/* Bytes of one scalar of type t; 0 for STRING, ARRAY and unknown types. */
size_t tdm_gguf_vtype_size(tdm_gguf_vtype t);

/* Out-of-range i: kv_key() returns NULL and kv_type() returns (tdm_gguf_vtype)-1. */

#endif
