/* tandem cachesim: replays a routing dump through the expert-cache policies
 * (profiles/cache_policy.h) and prints each one's hit rate and loads. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cache_policy.h"
#include "cli.h"
#include "profile.h"
#include "routing.h"

const char tdm_cli_cachesim_help[] =
    "replay a routing dump through the expert-cache policies and print their hit rates\n"
    "usage: tandem cachesim --routing FILE --slots N [--policy P] [--profile P.json] [--json]\n"
    "                       [--per-layer] [--adapt-every N] [--adapt-swaps M]\n"
    "                       [--adapt-decay D] [--adapt-hysteresis H]\n"
    "  --routing FILE   dump from `tandem profile --dump-routing` (token-major records)\n"
    "  --slots N        cache slots in total (one slot holds one expert of one layer)\n"
    "  --policy P       static|layer|adaptive|lru|lfu|oracle|all (default all; static\n"
    "                   needs --profile; without one, all skips it)\n"
    "  --profile P      profile of the same model: fills static, and adaptive/lru/lfu\n"
    "                   start from it (whole layers without it, even ones first)\n"
    "  --per-layer      each layer owns N / n_layer slots (default: one global pool)\n"
    "  --adapt-every N, --adapt-swaps M, --adapt-decay D, --adapt-hysteresis H\n"
    "                   adaptive policy parameters (defaults 8, 2, 0.98, 0.25)\n"
    "  --json           print one JSON object instead of the table\n";

typedef struct sim_opts {
    const char *routing, *profile;
    int32_t slots;
    int policy; /* -1: all */
    bool per_layer, json;
    tdm_cache_params adapt; /* only the adapt_* fields are used */
} sim_opts;

typedef struct sim_result {
    tdm_cache_policy policy;
    tdm_cache_stats st;
} sim_result;



static int parse_args(int argc, char **argv, sim_opts *o)
{
    memset(o, 0, sizeof *o);
    o->slots = -1;
    o->policy = -1;
    tdm_cache_params_init(&o->adapt, TDM_CACHE_ADAPTIVE, 1, 1, 1, 0);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true, takes = true;
        if (!strcmp(a, "--routing") && v)
            o->routing = v;
        else if (!strcmp(a, "--profile") && v)
            o->profile = v;
        else if (!strcmp(a, "--slots") && v)
            ok = tdm_cli_parse_i32(v, 0, INT32_MAX, &o->slots);
        else if (!strcmp(a, "--policy") && v)
            ok = !strcmp(v, "all") || (o->policy = tdm_cache_policy_parse(v)) >= 0;
        else if (!strcmp(a, "--adapt-every") && v)
            ok = tdm_cli_parse_i32(v, 1, INT32_MAX, &o->adapt.adapt_every);
        else if (!strcmp(a, "--adapt-swaps") && v)
            ok = tdm_cli_parse_i32(v, 0, 4096, &o->adapt.adapt_swaps);
        else if (!strcmp(a, "--adapt-decay") && v)
            ok = tdm_cli_parse_float(v, 0, 1, &o->adapt.adapt_decay);
        else if (!strcmp(a, "--adapt-hysteresis") && v)
            ok = tdm_cli_parse_float(v, 0, 1e9, &o->adapt.adapt_hysteresis);
        else if ((takes = false), !strcmp(a, "--json"))
            o->json = true;
        else if (!strcmp(a, "--per-layer"))
            o->per_layer = true;
        else {
            fprintf(stderr, "tandem cachesim: unexpected argument '%s'\n%s", a,
                    tdm_cli_cachesim_help);
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "tandem cachesim: bad value '%s' for %s\n", v, a);
            return 2;
        }
        i += takes;
    }
    if (!o->routing || o->slots < 0) {
        fprintf(stderr, "tandem cachesim: --routing and --slots are required\n%s",
                tdm_cli_cachesim_help);
        return 2;
    }
    if (o->policy == TDM_CACHE_STATIC && !o->profile) {
        fprintf(stderr, "tandem cachesim: the static policy needs --profile\n");
        return 2;
    }
    return 0;
}

static tdm_status replay(const tdm_routing *r, const tdm_profile *prof, const sim_opts *o,
                         tdm_cache_policy policy, tdm_cache_stats *st, tdm_error *err)
{
    tdm_cache_params p;
    tdm_cache_params_init(&p, policy, r->n_layer, r->n_expert, r->k, o->slots);
    p.per_layer = o->per_layer;
    p.profile = prof;
    p.adapt_every = o->adapt.adapt_every;
    p.adapt_swaps = o->adapt.adapt_swaps;
    p.adapt_decay = o->adapt.adapt_decay;
    p.adapt_hysteresis = o->adapt.adapt_hysteresis;
    p.future_layer = r->layer;
    p.future_ids = r->ids;
    p.n_future = r->n_records;
    tdm_cache *c;
    tdm_status s = tdm_cache_new(&p, &c, err);
    if (s)
        return s;
    for (int64_t i = 0; i < r->n_records && !s; i++)
        s = tdm_cache_access(c, r->token[i], r->layer[i], r->ids + i * r->k, r->k, NULL, NULL,
                             err);
    tdm_cache_get_stats(c, st);
    tdm_cache_free(c);
    return s;
}

static double rate(const tdm_cache_stats *st)
{
    return st->accesses ? (double)st->hits / (double)st->accesses : 0.0;
}

static int print_json(const sim_opts *o, const tdm_routing *r, const sim_result *res, int n)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "routing", o->routing);
    if (o->profile)
        cJSON_AddStringToObject(root, "profile", o->profile);
    cJSON_AddNumberToObject(root, "n_layer", r->n_layer);
    cJSON_AddNumberToObject(root, "n_expert", r->n_expert);
    cJSON_AddNumberToObject(root, "k", r->k);
    cJSON_AddNumberToObject(root, "tokens", (double)r->n_tokens);
    cJSON_AddNumberToObject(root, "slots", o->slots);
    cJSON_AddStringToObject(root, "budget", o->per_layer ? "per-layer" : "global");
    cJSON *ad = cJSON_AddObjectToObject(root, "adaptive_params");
    cJSON_AddNumberToObject(ad, "adapt_every", o->adapt.adapt_every);
    cJSON_AddNumberToObject(ad, "adapt_swaps", o->adapt.adapt_swaps);
    cJSON_AddNumberToObject(ad, "adapt_decay", o->adapt.adapt_decay);
    cJSON_AddNumberToObject(ad, "adapt_hysteresis", o->adapt.adapt_hysteresis);
    cJSON *arr = cJSON_AddArrayToObject(root, "results");
    for (int i = 0; i < n; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "policy", tdm_cache_policy_name(res[i].policy));
        cJSON_AddNumberToObject(e, "hit_rate", rate(&res[i].st));
        cJSON_AddNumberToObject(e, "hits", (double)res[i].st.hits);
        cJSON_AddNumberToObject(e, "accesses", (double)res[i].st.accesses);
        cJSON_AddNumberToObject(e, "loads", (double)res[i].st.loads);
        cJSON_AddNumberToObject(e, "loads_per_token",
                                r->n_tokens ? (double)res[i].st.loads / (double)r->n_tokens : 0);
        cJSON_AddItemToArray(arr, e);
    }
    char *text = cJSON_Print(root);
    int rc = text ? 0 : 1;
    if (text)
        printf("%s\n", text);
    free(text);
    cJSON_Delete(root);
    return rc;
}

static void print_table(const sim_opts *o, const tdm_routing *r, const sim_result *res, int n)
{
    printf("routing %s: %lld tokens, %d layers x %d experts, top-%d\n", o->routing,
           (long long)r->n_tokens, r->n_layer, r->n_expert, r->k);
    printf("cache: %d slots (%.1f%% of the experts), %s budget%s%s\n", o->slots,
           100.0 * o->slots / ((double)r->n_layer * r->n_expert),
           o->per_layer ? "per-layer" : "global", o->profile ? ", profile " : "",
           o->profile ? o->profile : "");
    printf("%-10s %9s %12s %12s %10s %13s\n", "policy", "hit rate", "hits", "lookups", "loads",
           "loads/token");
    for (int i = 0; i < n; i++)
        printf("%-10s %8.2f%% %12lld %12lld %10lld %13.3f\n", tdm_cache_policy_name(res[i].policy),
               100.0 * rate(&res[i].st), (long long)res[i].st.hits,
               (long long)res[i].st.accesses, (long long)res[i].st.loads,
               r->n_tokens ? (double)res[i].st.loads / (double)r->n_tokens : 0.0);
}

int tdm_cli_cachesim(int argc, char **argv)
{
    sim_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc)
        return rc;
    tdm_routing *r = NULL;
    tdm_profile *prof = NULL;
    tdm_error err;
    if (tdm_routing_read(o.routing, &r, &err)) {
        fprintf(stderr, "tandem cachesim: %s\n", err.msg);
        return 1;
    }
    if (o.profile) {
        rc = tdm_profile_read(o.profile, NULL, &prof, &err) != TDM_OK;
        if (!rc && tdm_profile_model_hash(tdm_profile_id(prof)) != r->model_hash) {
            const tdm_model_id *id = tdm_profile_id(prof);
            snprintf(err.msg, sizeof err.msg, "%s was made for another model than %s "
                     "(profile: %s, %d x %d, top-%d, layout %016llx)", o.profile, o.routing,
                     id->arch, id->n_layer, id->n_expert, id->k,
                     (unsigned long long)id->layout_hash);
            rc = 1;
        }
        if (rc) {
            fprintf(stderr, "tandem cachesim: %s\n", err.msg);
            tdm_profile_free(prof);
            tdm_routing_free(r);
            return 1;
        }
    }
    sim_result res[TDM_CACHE_N_POLICIES];
    int n = 0;
    for (int p = 0; p < TDM_CACHE_N_POLICIES && !rc; p++) {
        if ((o.policy >= 0 && p != o.policy) || (p == TDM_CACHE_STATIC && !prof))
            continue;
        res[n].policy = (tdm_cache_policy)p;
        if (replay(r, prof, &o, (tdm_cache_policy)p, &res[n].st, &err)) {
            fprintf(stderr, "tandem cachesim: %s: %s\n", tdm_cache_policy_name(p), err.msg);
            rc = 1;
        }
        n++;
    }
    if (!rc) {
        if (o.json)
            rc = print_json(&o, r, res, n);
        else
            print_table(&o, r, res, n);
    }
    tdm_profile_free(prof);
    tdm_routing_free(r);
    return rc;
}
