/* libFuzzer target for the routing-dump reader and the cache policies
 * (`tandem cachesim`): a dump the reader accepts is replayed through every
 * policy, as cachesim does, with a profile recorded from the dump itself and
 * a slot count taken from the input; every access must be served (the
 * oracle's future is the dump), hits can not exceed accesses, and the
 * residency table must stay a one-to-one map onto the slots. Dumps of more
 * than 2^20 experts are read but not replayed (time). Built and run by
 * tests/fuzz/run.sh. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cache_policy.h"
#include "routing.h"

/* Every slot held by at most one (layer, expert); the layers' counts agree. */
static void check_table(const tdm_cache *c, const tdm_routing *r)
{
    const int32_t *res = tdm_cache_residency(c), n_slots = tdm_cache_n_slots(c);
    uint8_t *seen = calloc((size_t)n_slots + 1, 1);
    int64_t held = 0, per_layer = 0;
    for (int32_t l = 0; l < r->n_layer; l++) {
        per_layer += tdm_cache_layer_slots(c, l);
        for (int32_t e = 0; e < r->n_expert; e++) {
            const int32_t s = res[(size_t)l * (size_t)r->n_expert + (size_t)e];
            if (s < -1 || s >= n_slots || (s >= 0 && seen[s]++) || tdm_cache_slot(c, l, e) != s)
                abort();
            held += s >= 0;
        }
    }
    if (held != per_layer)
        abort();
    free(seen);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tdm_routing *r = NULL;
    tdm_error err = {0};
    if (tdm_routing_parse(data, size, &r, &err) != TDM_OK) {
        if (r || !err.msg[0])
            abort();
        return 0;
    }
    if ((int64_t)r->n_layer * r->n_expert > (1 << 20)) { /* read, but too large to replay 6 times per input */
        tdm_routing_free(r);
        return 0;
    }
    tdm_model_id id = {.arch = "fuzz", .n_layer = r->n_layer, .n_expert = r->n_expert, .k = r->k};
    tdm_profile *prof = NULL;
    if (tdm_profile_new(&id, &prof, &err) != TDM_OK)
        abort(); /* every shape the reader accepts can be profiled */
    for (int64_t i = 0; i < r->n_records; i++)
        if (tdm_profile_record(prof, r->layer[i], r->k, r->ids + i * r->k, r->weights + i * r->k, &err))
            abort(); /* the reader checked every id and weight */
    const int32_t slots = size > 40 ? (int32_t)(data[size - 1] | data[size - 2] << 8) : 3;
    for (int pol = 0; pol < TDM_CACHE_N_POLICIES; pol++) {
        tdm_cache_params p;
        tdm_cache_params_init(&p, (tdm_cache_policy)pol, r->n_layer, r->n_expert, r->k, slots);
        p.per_layer = size & 1;
        p.profile = prof;
        p.adapt_every = 1 + (int32_t)(size % 5);
        p.future_layer = r->layer;
        p.future_ids = r->ids;
        p.n_future = r->n_records;
        tdm_cache *c = NULL;
        err.msg[0] = 0;
        if (tdm_cache_new(&p, &c, &err) != TDM_OK) {
            if (c || !err.msg[0])
                abort();
            continue;
        }
        for (int64_t i = 0; i < r->n_records; i++)
            if (tdm_cache_access(c, r->token[i], r->layer[i], r->ids + i * r->k, r->k, NULL, NULL, &err))
                abort(); /* every access of a valid dump is served */
        tdm_cache_stats st;
        tdm_cache_get_stats(c, &st);
        if (st.accesses != r->n_records * r->k || st.hits < 0 || st.hits > st.accesses)
            abort();
        check_table(c, r);
        tdm_cache_free(c);
    }
    tdm_profile_free(prof);
    tdm_routing_free(r);
    return 0;
}
