/* gguf_writer: builds GGUF v3 (or v2) files the way gguf-py / llama-quantize
 * lay them out: KV pairs, tensor infos, zero padding to the alignment, then
 * the tensors back to back in the order they were added, each padded with
 * zeros to the alignment.
 *
 * Usage:
 *   tdm_gguf_writer_create(&w, err);
 *   tdm_gguf_writer_add_str(w, "general.architecture", "qwen3moe", err); ...
 *   tdm_gguf_writer_add_tensor(w, "blk.0.attn_q.weight", TDM_Q_Q4_K, 2, ne, data, err); ...
 *   then ONE of:
 *   a) tdm_gguf_writer_write_file(w, path, err): every tensor's bytes come from
 *      the pointer given at add time or from its fill callback (called in
 *      chunks of at most TDM_GGUF_WRITER_CHUNK bytes into a writer-owned
 *      buffer), so a 20 GB file never needs more than one chunk in memory;
 *   b) tdm_gguf_writer_write_memory(w, &buf, &size, err): the whole file in one
 *      buffer (tests, fuzz seeds); the caller frees it with free();
 *   c) streaming: tdm_gguf_writer_begin(w, path, err) writes the header; then
 *      tdm_gguf_writer_write_data(w, p, n, err) any number of times appends the
 *      bytes of the tensors in the order they were added (a call may span
 *      tensor boundaries; padding is inserted automatically); then
 *      tdm_gguf_writer_finish(w, err) checks that exactly the declared bytes
 *      came and closes the file.
 * tdm_gguf_writer_free(w) always releases everything (and closes an
 * unfinished file, leaving it incomplete).
 *
 * Ownership: keys, names and KV values are copied at add time. Tensor data
 * pointers given to add_tensor are NOT copied: they must stay valid until the
 * file is written. Callbacks' user pointers likewise.
 *
 * Validation: the writer refuses (TDM_ERR_INVALID, message names the key or
 * tensor) what a reader would reject: empty or duplicate keys, names that are
 * empty, >= 64 bytes or duplicate, n_dims outside 1..4, negative dims, an
 * element count that overflows, unknown or removed tensor types, ne[0] not a
 * multiple of the block size, an alignment that is not a power of two, adds
 * after writing has started. To produce a deliberately corrupt file (tests),
 * write a valid one to memory and patch bytes.
 * Not thread-safe; one writer per thread.
 */
#ifndef TDM_GGUF_WRITER_H
#define TDM_GGUF_WRITER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf.h"
#include "quant.h"
#include "status.h"

/* Largest chunk a fill callback is asked for. */
#define TDM_GGUF_WRITER_CHUNK ((size_t)8 << 20)

typedef struct tdm_gguf_writer tdm_gguf_writer;

/* Fills dst[0..n) with bytes [offset, offset + n) of tensor `index` (the order
 * of add_tensor calls, from 0). Return TDM_OK or an error (which aborts the
 * write and is passed through). */
typedef tdm_status (*tdm_gguf_fill_fn)(void *user, int64_t index, uint64_t offset, void *dst,
                                       size_t n, tdm_error *err);

tdm_status tdm_gguf_writer_create(tdm_gguf_writer **out, tdm_error *err);
void tdm_gguf_writer_free(tdm_gguf_writer *w);

/* Version written in the header: 3 (default) or 2. */
tdm_status tdm_gguf_writer_set_version(tdm_gguf_writer *w, uint32_t version, tdm_error *err);

/* Sets the data alignment (power of two, default 32) and records it as the
 * UINT32 key general.alignment (added on first call, updated afterwards).
 * Must come before the first add_tensor. */
tdm_status tdm_gguf_writer_set_alignment(tdm_gguf_writer *w, uint32_t alignment, tdm_error *err);

/* ---- metadata (key: NUL-terminated, non-empty, unique) ----
 * add_u32("general.alignment", a) is set_alignment(a); any other adder
 * refuses that key (the file's alignment and the layout must agree). */
tdm_status tdm_gguf_writer_add_u8(tdm_gguf_writer *w, const char *key, uint8_t v, tdm_error *err);
tdm_status tdm_gguf_writer_add_i8(tdm_gguf_writer *w, const char *key, int8_t v, tdm_error *err);
tdm_status tdm_gguf_writer_add_u16(tdm_gguf_writer *w, const char *key, uint16_t v, tdm_error *err);
tdm_status tdm_gguf_writer_add_i16(tdm_gguf_writer *w, const char *key, int16_t v, tdm_error *err);
tdm_status tdm_gguf_writer_add_u32(tdm_gguf_writer *w, const char *key, uint32_t v, tdm_error *err);
tdm_status tdm_gguf_writer_add_i32(tdm_gguf_writer *w, const char *key, int32_t v, tdm_error *err);
tdm_status tdm_gguf_writer_add_u64(tdm_gguf_writer *w, const char *key, uint64_t v, tdm_error *err);
tdm_status tdm_gguf_writer_add_i64(tdm_gguf_writer *w, const char *key, int64_t v, tdm_error *err);
tdm_status tdm_gguf_writer_add_f32(tdm_gguf_writer *w, const char *key, float v, tdm_error *err);
tdm_status tdm_gguf_writer_add_f64(tdm_gguf_writer *w, const char *key, double v, tdm_error *err);
tdm_status tdm_gguf_writer_add_bool(tdm_gguf_writer *w, const char *key, bool v, tdm_error *err);
/* s NUL-terminated. */
tdm_status tdm_gguf_writer_add_str(tdm_gguf_writer *w, const char *key, const char *s,
                                   tdm_error *err);
/* s of len bytes (may contain NULs). */
tdm_status tdm_gguf_writer_add_strn(tdm_gguf_writer *w, const char *key, const char *s,
                                    size_t len, tdm_error *err);

/* Array of a fixed-size element type (every vtype except STRING and ARRAY):
 * elems holds count values in host representation, packed (bool: one byte
 * each, 0 or 1; e.g. uint32_t[count] for UINT32). elems may be NULL when
 * count == 0. */
tdm_status tdm_gguf_writer_add_arr(tdm_gguf_writer *w, const char *key, tdm_gguf_vtype elem_type,
                                   const void *elems, uint64_t count, tdm_error *err);
/* Array of strings: strs[i] of lens[i] bytes, or NUL-terminated when lens is NULL. */
tdm_status tdm_gguf_writer_add_arr_str(tdm_gguf_writer *w, const char *key,
                                       const char *const *strs, const size_t *lens,
                                       uint64_t count, tdm_error *err);
/* A value whose encoding the caller supplies verbatim (after the type tag):
 * for nested arrays and other cases the typed adders do not cover. The bytes
 * are not checked. */
tdm_status tdm_gguf_writer_add_raw(tdm_gguf_writer *w, const char *key, tdm_gguf_vtype type,
                                   const void *payload, size_t nbytes, tdm_error *err);

/* ---- tensors (in file order) ----
 * ne[0..n_dims) as in GGUF (ne[0] fastest). data: nbytes of the tensor, or
 * NULL when the bytes come later through write_data (streaming) or from a
 * fill callback. */
tdm_status tdm_gguf_writer_add_tensor(tdm_gguf_writer *w, const char *name, tdm_qtype type,
                                      uint32_t n_dims, const int64_t *ne, const void *data,
                                      tdm_error *err);
/* Same, with the bytes produced by fill() during write_file / write_memory. */
tdm_status tdm_gguf_writer_add_tensor_cb(tdm_gguf_writer *w, const char *name, tdm_qtype type,
                                         uint32_t n_dims, const int64_t *ne,
                                         tdm_gguf_fill_fn fill, void *user, tdm_error *err);

/* Layout of the file as it will be written (valid at any time; grows with
 * each add). */
uint64_t tdm_gguf_writer_header_size(const tdm_gguf_writer *w); /* == data section offset */
uint64_t tdm_gguf_writer_file_size(const tdm_gguf_writer *w);
/* Offset of tensor index from the start of the data section; UINT64_MAX if no such tensor. */
uint64_t tdm_gguf_writer_tensor_offset(const tdm_gguf_writer *w, int64_t index);

/* ---- output ---- */
tdm_status tdm_gguf_writer_write_file(tdm_gguf_writer *w, const char *path, tdm_error *err);
/* *out is allocated with an alignment of at least 64 bytes (free() it). */
tdm_status tdm_gguf_writer_write_memory(tdm_gguf_writer *w, void **out, size_t *size,
                                        tdm_error *err);

tdm_status tdm_gguf_writer_begin(tdm_gguf_writer *w, const char *path, tdm_error *err);
tdm_status tdm_gguf_writer_write_data(tdm_gguf_writer *w, const void *p, size_t n,
                                      tdm_error *err);
tdm_status tdm_gguf_writer_finish(tdm_gguf_writer *w, tdm_error *err);

#endif
