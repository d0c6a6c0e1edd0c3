/* libFuzzer target for the expert-profile reader (profiles/profile.h): any
 * input is parsed; a profile it accepts must validate, rank every layer and
 * globally, write itself as JSON that parses back to the same text, and merge
 * with its copy (or refuse with a message). Built and run by
 * tests/fuzz/run.sh. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "profile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tdm_profile *p = NULL, *q = NULL;
    tdm_error err = {0};
    if (tdm_profile_parse((const char *)data, size, NULL, &p, &err) != TDM_OK) {
        if (p || !err.msg[0])
            abort(); /* a refusal leaves nothing and says why */
        return 0;
    }
    if (tdm_profile_validate(p, &err) != TDM_OK)
        abort();
    const tdm_model_id *id = tdm_profile_id(p);
    int32_t *rank = malloc((size_t)id->n_layer * (size_t)id->n_expert * sizeof *rank);
    for (int32_t l = 0; l < id->n_layer; l++)
        if (tdm_profile_rank_layer(p, l, rank, &err) != TDM_OK)
            abort();
    tdm_profile_rank_global(p, rank);
    free(rank);
    char *json = tdm_profile_to_json(p), *again = NULL;
    if (!json || tdm_profile_parse(json, strlen(json), id, &q, &err) != TDM_OK ||
        !(again = tdm_profile_to_json(q)) || strcmp(json, again) != 0)
        abort(); /* written, read back, written again: the same text */
    err.msg[0] = 0;
    if (tdm_profile_merge(q, p, &err) == TDM_OK ? tdm_profile_validate(q, &err) != TDM_OK : !err.msg[0])
        abort();
    free(json);
    free(again);
    tdm_profile_free(q);
    tdm_profile_free(p);
    return 0;
}
