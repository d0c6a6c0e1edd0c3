/* profile: an expert-usage profile of one model (which routed experts a corpus
 * selects, how often, with how much routing weight), the hot-expert ranking it
 * implies, and its JSON file format (written and read with cJSON).
 *
 * A profile is tied to one model by a tdm_model_id: the architecture string,
 * a 64-bit FNV-1a hash of the tensor layout (every tensor's name, type and
 * shape in file order), n_layer (trunk MoE layers, MTP blocks excluded),
 * n_expert and k (experts used per token). Reading, merging and filling a
 * cache from a profile made for another model is refused (TDM_ERR_INVALID,
 * the message names the field that differs).
 *
 * File format (version 1), one JSON object:
 *   {"format": "tandem-expert-profile", "version": 1,
 *    "model": {"architecture": "qwen35moe", "layout_hash": "<16 hex digits>",
 *              "n_layer": 8, "n_expert": 24, "k": 4},
 *    "tokens": T,                  token positions routed (each through every layer)
 *    "source": "free text",        optional: what was profiled
 *    "layers": [{"layer": l,
 *                "count":  [n_expert integers]   times expert e was in the top-k,
 *                "weight": [n_expert numbers]    summed renormalised routing weight,
 *                "rank":   [n_expert ids]        hottest first}, ... n_layer entries],
 *    "global_rank": [[layer, expert], ...]        all n_layer*n_expert, hottest first}
 * Validation on read: every field present with the right type and length,
 * integers exact and >= 0, weights finite, 0 <= weight <= count, per layer the
 * counts sum to tokens * k (or to 0 for a layer that never routed), and the
 * stored rankings are permutations that agree with the counts. "rank" and
 * "global_rank" are derived data: written for people and other tools, checked
 * on read, recomputed from the counts in memory.
 *
 * Ranking order: count descending, then weight descending, then layer and
 * expert id ascending (deterministic for equal counts).
 *
 * Ownership: a tdm_profile owns its arrays; tdm_profile_free() releases them.
 * Recording (tdm_profile_record) never allocates.
 */
#ifndef TDM_PROFILE_H
#define TDM_PROFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf.h"
#include "status.h"

#define TDM_PROFILE_ARCH_MAX 64
#define TDM_PROFILE_VERSION 1
/* Most routed experts, all layers together (n_layer x n_expert), that a
 * profile, a routing dump or an expert cache describes: ~680x today's largest
 * MoE models, and a bound on what a few hostile header bytes can make a
 * reader allocate. */
#define TDM_PROFILE_MAX_EXPERTS (1 << 24)

typedef struct tdm_model_id {
    char arch[TDM_PROFILE_ARCH_MAX]; /* NUL-terminated general.architecture */
    uint64_t layout_hash;            /* tdm_profile_layout_hash() of the file */
    int32_t n_layer;                 /* trunk layers routed (MTP blocks excluded) */
    int32_t n_expert;                /* routed experts per layer */
    int32_t k;                       /* experts selected per token and layer */
} tdm_model_id;

typedef struct tdm_profile tdm_profile;

/* FNV-1a 64 over, for every tensor in file order: name bytes, a 0 byte, the
 * type (u32 LE), n_dims (u32 LE) and ne[0..n_dims-1] (i64 LE each). */
uint64_t tdm_profile_layout_hash(const tdm_gguf *g);

/* Fills id from an open GGUF: general.architecture, the layout hash,
 * {arch}.block_count minus {arch}.nextn_predict_layers (when present),
 * {arch}.expert_count and {arch}.expert_used_count. */
tdm_status tdm_profile_model_id(const tdm_gguf *g, tdm_model_id *id, tdm_error *err);

/* One 64-bit digest of the whole identity (used by the routing dump header). */
uint64_t tdm_profile_model_hash(const tdm_model_id *id);

/* TDM_OK when a and b are the same model; otherwise TDM_ERR_INVALID naming
 * the first field that differs (what = "profile", "routing dump", ...). */
tdm_status tdm_profile_check_model(const tdm_model_id *want, const tdm_model_id *got,
                                   const char *what, tdm_error *err);

/* An empty profile (all counts 0) for id. */
tdm_status tdm_profile_new(const tdm_model_id *id, tdm_profile **out, tdm_error *err);
void tdm_profile_free(tdm_profile *p);

const tdm_model_id *tdm_profile_id(const tdm_profile *p);
uint64_t tdm_profile_tokens(const tdm_profile *p);
uint64_t tdm_profile_count(const tdm_profile *p, int32_t layer, int32_t expert);
double tdm_profile_weight(const tdm_profile *p, int32_t layer, int32_t expert);
/* Optional free-text description kept in the file ("source"); copied. */
tdm_status tdm_profile_set_source(tdm_profile *p, const char *source, tdm_error *err);
const char *tdm_profile_source(const tdm_profile *p); /* "" when unset */

/* Adds one routing decision (n ids with their weights; weights may be NULL).
 * Bad layer/id/weight is TDM_ERR_INVALID and changes nothing. */
tdm_status tdm_profile_record(tdm_profile *p, int32_t layer, int32_t n, const int32_t *ids,
                              const float *weights, tdm_error *err);
/* Counts n more routed token positions. */
void tdm_profile_add_tokens(tdm_profile *p, uint64_t n);

/* Ranking of layer (hottest first): writes n_expert expert ids to out. */
tdm_status tdm_profile_rank_layer(const tdm_profile *p, int32_t layer, int32_t *out,
                                  tdm_error *err);
/* Global ranking: writes n_layer*n_expert entries layer*n_expert+expert to out. */
void tdm_profile_rank_global(const tdm_profile *p, int32_t *out);

/* Checks the invariants listed above on an in-memory profile. */
tdm_status tdm_profile_validate(const tdm_profile *p, tdm_error *err);

/* JSON text (caller frees with free()), or NULL on OOM. */
char *tdm_profile_to_json(const tdm_profile *p);
tdm_status tdm_profile_write(const tdm_profile *p, const char *path, tdm_error *err);

/* Parses and validates. When expect is non-NULL the profile must be for that
 * model (else TDM_ERR_INVALID). */
tdm_status tdm_profile_parse(const char *json, size_t len, const tdm_model_id *expect,
                             tdm_profile **out, tdm_error *err);
tdm_status tdm_profile_read(const char *path, const tdm_model_id *expect, tdm_profile **out,
                            tdm_error *err);

/* dst += src (counts, weights, tokens). Refused when the models differ. */
tdm_status tdm_profile_merge(tdm_profile *dst, const tdm_profile *src, tdm_error *err);

#endif
