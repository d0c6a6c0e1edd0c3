/* routing: the raw per-token routing dump (every routing decision of a run, in
 * order), written by `tandem profile --dump-routing` and replayed by
 * `tandem cachesim`.
 *
 * File format, version 1, all integers and floats little-endian:
 *   header, 32 bytes:
 *     0  char[8] magic "TDMROUTE"
 *     8  u32     version (1)
 *    12  u32     n_layer   (1..4096, as a profile's)
 *    16  u32     n_expert  (<= 65535; n_layer x n_expert <= TDM_PROFILE_MAX_EXPERTS)
 *    20  u32     k         (1..min(64, n_expert))
 *    24  u64     model hash (tdm_profile_model_hash() of the model's tdm_model_id)
 *   then records of 6 + 6k bytes each, until the end of the file:
 *     0  i32     pos       token position in its sequence (>= 0)
 *     4  u16     layer     (< n_layer)
 *     6  u16[k]  expert ids, descending routing probability, distinct, < n_expert
 *     6+2k f32[k] renormalised routing weights (finite, in [0, 1])
 * Order: token-major. A token is a run of consecutive records with the same
 * pos, its layers strictly increasing; a new token starts where pos changes
 * (pos going back, e.g. to 0, starts a new sequence). This is the order a
 * decoder visits the experts, which is what a cache replay needs.
 *
 * Ownership: the writer owns its FILE; a tdm_routing owns its arrays.
 */
#ifndef TDM_ROUTING_H
#define TDM_ROUTING_H

#include <stdint.h>
#include <stdio.h>

#include "profile.h"
#include "status.h"

#define TDM_ROUTING_MAGIC "TDMROUTE"
#define TDM_ROUTING_VERSION 1
#define TDM_ROUTING_HEADER_BYTES 32

typedef struct tdm_routing_writer tdm_routing_writer;

tdm_status tdm_routing_writer_open(const char *path, const tdm_model_id *id,
                                   tdm_routing_writer **out, tdm_error *err);
/* Appends one record; validates it like the reader does. */
tdm_status tdm_routing_writer_add(tdm_routing_writer *w, int32_t pos, int32_t layer,
                                  const int32_t *ids, const float *weights, tdm_error *err);
/* Flushes and closes (also on error paths); reports a failed write. */
tdm_status tdm_routing_writer_close(tdm_routing_writer *w, tdm_error *err);

/* A dump read into memory. */
typedef struct tdm_routing {
    int32_t n_layer, n_expert, k;
    uint64_t model_hash;
    int64_t n_records;
    int64_t n_tokens;  /* runs of equal pos */
    int32_t *pos;      /* [n_records] */
    int32_t *layer;    /* [n_records] */
    int32_t *ids;      /* [n_records * k] */
    float *weights;    /* [n_records * k] */
    int64_t *token;    /* [n_records] token index 0..n_tokens-1 of each record */
} tdm_routing;

/* Reads and validates the whole file (TDM_ERR_FORMAT naming the byte offset
 * or record of the first problem). */
tdm_status tdm_routing_read(const char *path, tdm_routing **out, tdm_error *err);
tdm_status tdm_routing_parse(const void *data, size_t size, tdm_routing **out, tdm_error *err);
void tdm_routing_free(tdm_routing *r);

/* TDM_ERR_INVALID when the dump was not made on the model id describes. */
tdm_status tdm_routing_check_model(const tdm_routing *r, const tdm_model_id *id, tdm_error *err);

#endif
