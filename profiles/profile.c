/* profile: expert-usage counts, their ranking and the JSON file format.
 * The format and its validation rules are documented in profile.h. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "profile.h"

#define FORMAT_NAME "tandem-expert-profile"
/* largest integer a JSON number (a double) holds exactly */
#define JSON_INT_MAX 9007199254740992.0

struct tdm_profile {
    tdm_model_id id;
    uint64_t tokens;
    uint64_t *count; /* [n_layer * n_expert] */
    double *weight;  /* [n_layer * n_expert] */
    char *source;    /* NUL-terminated, never NULL */
};

/* ---------------------------------------------------------------- identity */

#define FNV_OFFSET 0xcbf29ce484222325ULL
#define FNV_PRIME 0x100000001b3ULL

static uint64_t fnv_bytes(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= FNV_PRIME;
    }
    return h;
}

/* little-endian, independent of the host */
static uint64_t fnv_u64(uint64_t h, uint64_t v, int bytes)
{
    unsigned char b[8];
    for (int i = 0; i < bytes; i++)
        b[i] = (unsigned char)(v >> (8 * i));
    return fnv_bytes(h, b, (size_t)bytes);
}

uint64_t tdm_profile_layout_hash(const tdm_gguf *g)
{
    uint64_t h = FNV_OFFSET;
    int64_t n = tdm_gguf_tensor_count(g);
    for (int64_t i = 0; i < n; i++) {
        const tdm_gguf_tensor *t = tdm_gguf_tensor_at(g, i);
        h = fnv_bytes(h, t->name, strlen(t->name) + 1);
        h = fnv_u64(h, (uint64_t)t->type, 4);
        h = fnv_u64(h, t->n_dims, 4);
        for (uint32_t d = 0; d < t->n_dims; d++)
            h = fnv_u64(h, (uint64_t)t->ne[d], 8);
    }
    return h;
}

static tdm_status get_dim(const tdm_gguf *g, const char *arch, const char *suffix, bool optional,
                          int32_t *out, tdm_error *err)
{
    char key[TDM_PROFILE_ARCH_MAX + 64];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (optional && tdm_gguf_find_key(g, key) < 0) {
        *out = 0;
        return TDM_OK;
    }
    uint32_t v;
    tdm_status st = tdm_gguf_get_u32(g, key, &v, err);
    if (st)
        return st;
    if (v > INT32_MAX)
        return tdm_error_set(err, TDM_ERR_FORMAT, "%s = %u is out of range", key, v);
    *out = (int32_t)v;
    return TDM_OK;
}

tdm_status tdm_profile_model_id(const tdm_gguf *g, tdm_model_id *id, tdm_error *err)
{
    memset(id, 0, sizeof *id);
    const char *arch;
    size_t len;
    tdm_status st = tdm_gguf_get_str(g, "general.architecture", &arch, &len, err);
    if (st)
        return st;
    if (len == 0 || len >= TDM_PROFILE_ARCH_MAX || memchr(arch, '\0', len))
        return tdm_error_set(err, TDM_ERR_FORMAT, "general.architecture: bad length %zu", len);
    memcpy(id->arch, arch, len);
    int32_t blocks, nextn;
    if ((st = get_dim(g, id->arch, "block_count", false, &blocks, err)) ||
        (st = get_dim(g, id->arch, "nextn_predict_layers", true, &nextn, err)) ||
        (st = get_dim(g, id->arch, "expert_count", false, &id->n_expert, err)) ||
        (st = get_dim(g, id->arch, "expert_used_count", false, &id->k, err)))
        return st;
    id->n_layer = blocks - nextn;
    if (id->n_layer <= 0 || id->n_expert <= 0 || id->k <= 0 || id->k > id->n_expert)
        return tdm_error_set(err, TDM_ERR_FORMAT,
                             "%s: not a MoE layout (layers %d, experts %d, used %d)", id->arch,
                             id->n_layer, id->n_expert, id->k);
    id->layout_hash = tdm_profile_layout_hash(g);
    return TDM_OK;
}

uint64_t tdm_profile_model_hash(const tdm_model_id *id)
{
    uint64_t h = fnv_bytes(FNV_OFFSET, id->arch, strnlen(id->arch, TDM_PROFILE_ARCH_MAX) + 1);
    h = fnv_u64(h, id->layout_hash, 8);
    h = fnv_u64(h, (uint64_t)(uint32_t)id->n_layer, 4);
    h = fnv_u64(h, (uint64_t)(uint32_t)id->n_expert, 4);
    return fnv_u64(h, (uint64_t)(uint32_t)id->k, 4);
}

tdm_status tdm_profile_check_model(const tdm_model_id *want, const tdm_model_id *got,
                                   const char *what, tdm_error *err)
{
    if (strncmp(want->arch, got->arch, TDM_PROFILE_ARCH_MAX))
        return tdm_error_set(err, TDM_ERR_INVALID,
                             "%s was made for another model: architecture '%s', expected '%s'",
                             what, got->arch, want->arch);
    if (want->n_layer != got->n_layer || want->n_expert != got->n_expert || want->k != got->k)
        return tdm_error_set(err, TDM_ERR_INVALID,
                             "%s was made for another model: %d layers x %d experts, top-%d; "
                             "expected %d x %d, top-%d",
                             what, got->n_layer, got->n_expert, got->k, want->n_layer,
                             want->n_expert, want->k);
    if (want->layout_hash != got->layout_hash)
        return tdm_error_set(err, TDM_ERR_INVALID,
                             "%s was made for another model: layout_hash %016" PRIx64
                             ", expected %016" PRIx64 " (same architecture, other tensors)",
                             what, got->layout_hash, want->layout_hash);
    return TDM_OK;
}

/* ---------------------------------------------------------------- object */

static tdm_status check_id(const tdm_model_id *id, tdm_error *err)
{
    size_t alen = strnlen(id->arch, TDM_PROFILE_ARCH_MAX);
    if (alen == 0 || alen == TDM_PROFILE_ARCH_MAX)
        return tdm_error_set(err, TDM_ERR_INVALID, "model.architecture: empty or too long");
    if (id->n_layer <= 0 || id->n_layer > 4096)
        return tdm_error_set(err, TDM_ERR_INVALID, "model.n_layer = %d out of range 1..4096",
                             id->n_layer);
    if (id->n_expert <= 0 || id->n_expert > 65535)
        return tdm_error_set(err, TDM_ERR_INVALID, "model.n_expert = %d out of range 1..65535",
                             id->n_expert);
    if (id->k <= 0 || id->k > id->n_expert || id->k > 64)
        return tdm_error_set(err, TDM_ERR_INVALID, "model.k = %d out of range 1..min(64, %d)",
                             id->k, id->n_expert);
    if ((int64_t)id->n_layer * id->n_expert > TDM_PROFILE_MAX_EXPERTS)
        return tdm_error_set(err, TDM_ERR_INVALID, "model: %d layers x %d experts is more than %d experts",
                             id->n_layer, id->n_expert, TDM_PROFILE_MAX_EXPERTS);
    return TDM_OK;
}

tdm_status tdm_profile_new(const tdm_model_id *id, tdm_profile **out, tdm_error *err)
{
    *out = NULL;
    tdm_status st = check_id(id, err);
    if (st)
        return st;
    size_t n = (size_t)id->n_layer * (size_t)id->n_expert;
    tdm_profile *p = calloc(1, sizeof *p);
    if (p) {
        p->count = calloc(n, sizeof *p->count);
        p->weight = calloc(n, sizeof *p->weight);
        p->source = calloc(1, 1);
    }
    if (!p || !p->count || !p->weight || !p->source) {
        tdm_profile_free(p);
        return tdm_error_set(err, TDM_ERR_OOM, "profile: cannot allocate %zu entries", n);
    }
    p->id = *id;
    p->id.arch[TDM_PROFILE_ARCH_MAX - 1] = '\0';
    *out = p;
    return TDM_OK;
}

void tdm_profile_free(tdm_profile *p)
{
    if (!p)
        return;
    free(p->count);
    free(p->weight);
    free(p->source);
    free(p);
}

const tdm_model_id *tdm_profile_id(const tdm_profile *p) { return &p->id; }
uint64_t tdm_profile_tokens(const tdm_profile *p) { return p->tokens; }
const char *tdm_profile_source(const tdm_profile *p) { return p->source; }

static bool in_range(const tdm_profile *p, int32_t layer, int32_t expert)
{
    return layer >= 0 && layer < p->id.n_layer && expert >= 0 && expert < p->id.n_expert;
}

uint64_t tdm_profile_count(const tdm_profile *p, int32_t layer, int32_t expert)
{
    return in_range(p, layer, expert) ? p->count[(size_t)layer * p->id.n_expert + expert] : 0;
}

double tdm_profile_weight(const tdm_profile *p, int32_t layer, int32_t expert)
{
    return in_range(p, layer, expert) ? p->weight[(size_t)layer * p->id.n_expert + expert] : 0;
}

tdm_status tdm_profile_set_source(tdm_profile *p, const char *source, tdm_error *err)
{
    char *s = strdup(source ? source : "");
    if (!s)
        return tdm_error_set(err, TDM_ERR_OOM, "profile: cannot copy source text");
    free(p->source);
    p->source = s;
    return TDM_OK;
}

tdm_status tdm_profile_record(tdm_profile *p, int32_t layer, int32_t n, const int32_t *ids,
                              const float *weights, tdm_error *err)
{
    if (layer < 0 || layer >= p->id.n_layer)
        return tdm_error_set(err, TDM_ERR_INVALID, "profile: layer %d out of range 0..%d", layer,
                             p->id.n_layer - 1);
    if (n < 0 || n > p->id.k)
        return tdm_error_set(err, TDM_ERR_INVALID, "profile: %d experts routed, k is %d", n,
                             p->id.k);
    for (int32_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= p->id.n_expert)
            return tdm_error_set(err, TDM_ERR_INVALID, "profile: layer %d: expert id %d out of "
                                 "range 0..%d", layer, ids[i], p->id.n_expert - 1);
        if (weights && !(weights[i] >= 0.0f && weights[i] <= 1.0f + 1e-5f))
            return tdm_error_set(err, TDM_ERR_INVALID, "profile: layer %d: weight %g of expert "
                                 "%d is not in [0, 1]", layer, (double)weights[i], ids[i]);
        for (int32_t j = 0; j < i; j++)
            if (ids[j] == ids[i])
                return tdm_error_set(err, TDM_ERR_INVALID, "profile: layer %d: expert %d "
                                     "selected twice", layer, ids[i]);
    }
    size_t base = (size_t)layer * p->id.n_expert;
    for (int32_t i = 0; i < n; i++) {
        p->count[base + ids[i]]++;
        p->weight[base + ids[i]] += weights ? (double)weights[i] : 0.0;
    }
    return TDM_OK;
}

void tdm_profile_add_tokens(tdm_profile *p, uint64_t n) { p->tokens += n; }

/* ---------------------------------------------------------------- ranking */

/* qsort_r context: entries are layer*n_expert+expert */
static int cmp_hot(const void *a, const void *b, void *ctx)
{
    const tdm_profile *p = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (p->count[x] != p->count[y])
        return p->count[x] > p->count[y] ? -1 : 1;
    if (p->weight[x] != p->weight[y])
        return p->weight[x] > p->weight[y] ? -1 : 1;
    return (x > y) - (x < y);
}

tdm_status tdm_profile_rank_layer(const tdm_profile *p, int32_t layer, int32_t *out,
                                  tdm_error *err)
{
    if (layer < 0 || layer >= p->id.n_layer)
        return tdm_error_set(err, TDM_ERR_INVALID, "profile: layer %d out of range 0..%d", layer,
                             p->id.n_layer - 1);
    int32_t base = layer * p->id.n_expert;
    for (int32_t e = 0; e < p->id.n_expert; e++)
        out[e] = base + e;
    qsort_r(out, (size_t)p->id.n_expert, sizeof *out, cmp_hot, (void *)p);
    for (int32_t e = 0; e < p->id.n_expert; e++)
        out[e] -= base;
    return TDM_OK;
}

void tdm_profile_rank_global(const tdm_profile *p, int32_t *out)
{
    int32_t n = p->id.n_layer * p->id.n_expert;
    for (int32_t i = 0; i < n; i++)
        out[i] = i;
    qsort_r(out, (size_t)n, sizeof *out, cmp_hot, (void *)p);
}

/* ---------------------------------------------------------------- validation */

tdm_status tdm_profile_validate(const tdm_profile *p, tdm_error *err)
{
    const tdm_model_id *id = &p->id;
    if ((double)p->tokens * id->k > JSON_INT_MAX)
        return tdm_error_set(err, TDM_ERR_FORMAT, "profile: tokens = %" PRIu64 " too large",
                             p->tokens);
    for (int32_t l = 0; l < id->n_layer; l++) {
        uint64_t sum = 0;
        for (int32_t e = 0; e < id->n_expert; e++) {
            size_t i = (size_t)l * id->n_expert + e;
            double w = p->weight[i], c = (double)p->count[i];
            if (!isfinite(w) || w < 0 || w > c * (1 + 1e-6) + 1e-6)
                return tdm_error_set(err, TDM_ERR_FORMAT, "profile: layer %d expert %d: weight "
                                     "%g is not in [0, count = %.0f]", l, e, w, c);
            sum += p->count[i];
        }
        if (sum != 0 && sum != p->tokens * (uint64_t)id->k)
            return tdm_error_set(err, TDM_ERR_FORMAT, "profile: layer %d: counts sum to %" PRIu64
                                 ", expected tokens x k = %" PRIu64 " x %d", l, sum, p->tokens,
                                 id->k);
    }
    return TDM_OK;
}

/* ---------------------------------------------------------------- JSON out */

static cJSON *id_to_json(const tdm_model_id *id)
{
    char hex[17];
    snprintf(hex, sizeof hex, "%016" PRIx64, id->layout_hash);
    cJSON *m = cJSON_CreateObject();
    if (!m || !cJSON_AddStringToObject(m, "architecture", id->arch) ||
        !cJSON_AddStringToObject(m, "layout_hash", hex) ||
        !cJSON_AddNumberToObject(m, "n_layer", id->n_layer) ||
        !cJSON_AddNumberToObject(m, "n_expert", id->n_expert) ||
        !cJSON_AddNumberToObject(m, "k", id->k)) {
        cJSON_Delete(m);
        return NULL;
    }
    return m;
}

static cJSON *layer_to_json(const tdm_profile *p, int32_t l, int32_t *rank)
{
    int32_t ne = p->id.n_expert;
    cJSON *o = cJSON_CreateObject();
    bool ok = o && cJSON_AddNumberToObject(o, "layer", l);
    cJSON *c = cJSON_AddArrayToObject(o, "count");
    cJSON *w = cJSON_AddArrayToObject(o, "weight");
    cJSON *r = cJSON_AddArrayToObject(o, "rank");
    ok = ok && c && w && r;
    tdm_profile_rank_layer(p, l, rank, NULL);
    for (int32_t e = 0; ok && e < ne; e++) {
        size_t i = (size_t)l * ne + e;
        /* weights rounded to 6 decimals keep the file small and stable */
        double wr = round(p->weight[i] * 1e6) / 1e6;
        ok = cJSON_AddItemToArray(c, cJSON_CreateNumber((double)p->count[i])) &&
             cJSON_AddItemToArray(w, cJSON_CreateNumber(wr > (double)p->count[i] ? (double)p->count[i] : wr)) &&
             cJSON_AddItemToArray(r, cJSON_CreateNumber(rank[e]));
    }
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

char *tdm_profile_to_json(const tdm_profile *p)
{
    int32_t nl = p->id.n_layer, ne = p->id.n_expert;
    int32_t *rank = malloc((size_t)nl * ne * sizeof *rank);
    cJSON *root = cJSON_CreateObject();
    bool ok = rank && root && cJSON_AddStringToObject(root, "format", FORMAT_NAME) &&
              cJSON_AddNumberToObject(root, "version", TDM_PROFILE_VERSION);
    cJSON *m = ok ? id_to_json(&p->id) : NULL;
    ok = ok && m && cJSON_AddItemToObject(root, "model", m);
    if (!ok)
        cJSON_Delete(m);
    ok = ok && cJSON_AddNumberToObject(root, "tokens", (double)p->tokens) &&
         cJSON_AddStringToObject(root, "source", p->source);
    cJSON *layers = ok ? cJSON_AddArrayToObject(root, "layers") : NULL;
    ok = ok && layers;
    for (int32_t l = 0; ok && l < nl; l++) {
        cJSON *lo = layer_to_json(p, l, rank);
        ok = lo && cJSON_AddItemToArray(layers, lo);
    }
    cJSON *g = ok ? cJSON_AddArrayToObject(root, "global_rank") : NULL;
    ok = ok && g;
    if (ok)
        tdm_profile_rank_global(p, rank);
    for (int32_t i = 0; ok && i < nl * ne; i++) {
        int pair[2] = {rank[i] / ne, rank[i] % ne};
        ok = cJSON_AddItemToArray(g, cJSON_CreateIntArray(pair, 2));
    }
    char *text = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    free(rank);
    return text;
}

tdm_status tdm_profile_write(const tdm_profile *p, const char *path, tdm_error *err)
{
    tdm_status st = tdm_profile_validate(p, err);
    if (st)
        return st;
    char *text = tdm_profile_to_json(p);
    if (!text)
        return tdm_error_set(err, TDM_ERR_OOM, "profile: cannot build JSON");
    FILE *f = fopen(path, "w");
    if (!f) {
        free(text);
        return tdm_error_set(err, TDM_ERR_IO, "%s: %s", path, strerror(errno));
    }
    size_t len = strlen(text);
    bool ok = fwrite(text, 1, len, f) == len && fputc('\n', f) != EOF;
    ok = (fclose(f) == 0) && ok;
    free(text);
    return ok ? TDM_OK : tdm_error_set(err, TDM_ERR_IO, "%s: write failed", path);
}

/* ---------------------------------------------------------------- JSON in */

/* An exact non-negative integer <= max. */
static tdm_status get_uint(const cJSON *v, const char *field, double max, double *out,
                           tdm_error *err)
{
    if (!cJSON_IsNumber(v))
        return tdm_error_set(err, TDM_ERR_FORMAT, "profile: %s: missing or not a number", field);
    double d = v->valuedouble;
    if (!isfinite(d) || d < 0 || d != floor(d) || d > max)
        return tdm_error_set(err, TDM_ERR_FORMAT, "profile: %s = %g is not an integer in 0..%.0f",
                             field, d, max);
    *out = d;
    return TDM_OK;
}

static tdm_status id_from_json(const cJSON *m, tdm_model_id *id, tdm_error *err)
{
    memset(id, 0, sizeof *id);
    if (!cJSON_IsObject(m))
        return tdm_error_set(err, TDM_ERR_FORMAT, "profile: \"model\" missing or not an object");
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(m, "architecture");
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(m, "layout_hash");
    if (!cJSON_IsString(a) || strlen(a->valuestring) == 0 ||
        strlen(a->valuestring) >= TDM_PROFILE_ARCH_MAX)
        return tdm_error_set(err, TDM_ERR_FORMAT, "profile: model.architecture missing or bad");
    strcpy(id->arch, a->valuestring);
    char *end = NULL;
    if (!cJSON_IsString(h) || strlen(h->valuestring) != 16 ||
        strspn(h->valuestring, "0123456789abcdefABCDEF") != 16)
        return tdm_error_set(err, TDM_ERR_FORMAT,
                             "profile: model.layout_hash must be 16 hex digits");
    id->layout_hash = strtoull(h->valuestring, &end, 16);
    static const char *const names[3] = {"n_layer", "n_expert", "k"};
    int32_t *dst[3] = {&id->n_layer, &id->n_expert, &id->k};
    for (int i = 0; i < 3; i++) {
        double d;
        char field[32];
        snprintf(field, sizeof field, "model.%s", names[i]);
        tdm_status st = get_uint(cJSON_GetObjectItemCaseSensitive(m, names[i]), field, 65535, &d, err);
        if (st)
            return st;
        *dst[i] = (int32_t)d;
    }
    tdm_status st = check_id(id, err);
    return st ? tdm_error_wrap(err, "profile") : TDM_OK;
}

/* rank must be a permutation of 0..n-1 (entries are flat indices into count
 * when base >= 0) whose counts never increase. seen: [n] scratch. */
static tdm_status check_rank(const tdm_profile *p, const int32_t *rank, int32_t n, bool *seen,
                             const char *what, tdm_error *err)
{
    memset(seen, 0, (size_t)n * sizeof *seen);
    for (int32_t i = 0; i < n; i++) {
        if (rank[i] < 0 || rank[i] >= n || seen[rank[i]])
            return tdm_error_set(err, TDM_ERR_FORMAT, "profile: %s: entry %d is not a "
                                 "permutation entry", what, i);
        seen[rank[i]] = true;
    }
    return TDM_OK;
}

static tdm_status layer_from_json(tdm_profile *p, const cJSON *lo, int32_t l, int32_t *rank,
                                  bool *seen, tdm_error *err)
{
    int32_t ne = p->id.n_expert;
    double d;
    if (!cJSON_IsObject(lo))
        return tdm_error_set(err, TDM_ERR_FORMAT, "profile: layers[%d] is not an object", l);
    tdm_status st = get_uint(cJSON_GetObjectItemCaseSensitive(lo, "layer"), "layers[].layer",
                             65535, &d, err);
    if (st)
        return st;
    if ((int32_t)d != l)
        return tdm_error_set(err, TDM_ERR_FORMAT, "profile: layers[%d].layer = %.0f", l, d);
    static const char *const keys[3] = {"count", "weight", "rank"};
    const cJSON *arr[3];
    for (int i = 0; i < 3; i++) {
        arr[i] = cJSON_GetObjectItemCaseSensitive(lo, keys[i]);
        if (!cJSON_IsArray(arr[i]) || cJSON_GetArraySize(arr[i]) != ne)
            return tdm_error_set(err, TDM_ERR_FORMAT, "profile: layers[%d].%s must be an array "
                                 "of n_expert = %d numbers", l, keys[i], ne);
    }
    char field[64];
    const cJSON *c = arr[0]->child, *w = arr[1]->child, *r = arr[2]->child;
    for (int32_t e = 0; e < ne; e++, c = c->next, w = w->next, r = r->next) {
        size_t i = (size_t)l * ne + e;
        snprintf(field, sizeof field, "layers[%d].count[%d]", l, e);
        if ((st = get_uint(c, field, JSON_INT_MAX, &d, err)))
            return st;
        p->count[i] = (uint64_t)d;
        if (!cJSON_IsNumber(w) || !isfinite(w->valuedouble))
            return tdm_error_set(err, TDM_ERR_FORMAT, "profile: layers[%d].weight[%d] is not a "
                                 "finite number", l, e);
        p->weight[i] = w->valuedouble;
        snprintf(field, sizeof field, "layers[%d].rank[%d]", l, e);
        if ((st = get_uint(r, field, ne - 1, &d, err)))
            return st;
        rank[e] = (int32_t)d;
    }
    snprintf(field, sizeof field, "layers[%d].rank", l);
    if ((st = check_rank(p, rank, ne, seen, field, err)))
        return st;
    for (int32_t e = 1; e < ne; e++)
        if (p->count[(size_t)l * ne + rank[e]] > p->count[(size_t)l * ne + rank[e - 1]])
            return tdm_error_set(err, TDM_ERR_FORMAT, "profile: %s disagrees with the counts at "
                                 "position %d (expert %d is hotter than %d)", field, e, rank[e],
                                 rank[e - 1]);
    return TDM_OK;
}

static tdm_status global_from_json(tdm_profile *p, const cJSON *g, int32_t *rank, bool *seen,
                                   tdm_error *err)
{
    int32_t ne = p->id.n_expert, n = p->id.n_layer * ne;
    if (!cJSON_IsArray(g) || cJSON_GetArraySize(g) != n)
        return tdm_error_set(err, TDM_ERR_FORMAT, "profile: global_rank must hold n_layer x "
                             "n_expert = %d [layer, expert] pairs", n);
    int32_t i = 0;
    for (const cJSON *pr = g->child; pr; pr = pr->next, i++) {
        double l, e;
        tdm_status st;
        if (!cJSON_IsArray(pr) || cJSON_GetArraySize(pr) != 2)
            return tdm_error_set(err, TDM_ERR_FORMAT, "profile: global_rank[%d] is not a "
                                 "[layer, expert] pair", i);
        if ((st = get_uint(pr->child, "global_rank[].layer", p->id.n_layer - 1, &l, err)) ||
            (st = get_uint(pr->child->next, "global_rank[].expert", ne - 1, &e, err)))
            return st;
        rank[i] = (int32_t)l * ne + (int32_t)e;
    }
    tdm_status st = check_rank(p, rank, n, seen, "global_rank", err);
    if (st)
        return st;
    for (i = 1; i < n; i++)
        if (p->count[rank[i]] > p->count[rank[i - 1]])
            return tdm_error_set(err, TDM_ERR_FORMAT, "profile: global_rank disagrees with the "
                                 "counts at position %d", i);
    return TDM_OK;
}

static tdm_status from_json(const cJSON *root, const tdm_model_id *expect, tdm_profile **out,
                            tdm_error *err)
{
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    if (!cJSON_IsObject(root) || !cJSON_IsString(fmt) || strcmp(fmt->valuestring, FORMAT_NAME))
        return tdm_error_set(err, TDM_ERR_FORMAT, "profile: \"format\" is not \"%s\"", FORMAT_NAME);
    double v;
    tdm_status st = get_uint(cJSON_GetObjectItemCaseSensitive(root, "version"), "version", 1e9,
                             &v, err);
    if (st)
        return st;
    if (v != TDM_PROFILE_VERSION)
        return tdm_error_set(err, TDM_ERR_UNSUPPORTED, "profile: version %.0f (this build "
                             "reads version %d)", v, TDM_PROFILE_VERSION);
    tdm_model_id id;
    if ((st = id_from_json(cJSON_GetObjectItemCaseSensitive(root, "model"), &id, err)))
        return st;
    if (expect && (st = tdm_profile_check_model(expect, &id, "profile", err)))
        return st;
    tdm_profile *p;
    if ((st = tdm_profile_new(&id, &p, err)))
        return st;
    const cJSON *src = cJSON_GetObjectItemCaseSensitive(root, "source");
    if (src && !cJSON_IsString(src))
        st = tdm_error_set(err, TDM_ERR_FORMAT, "profile: \"source\" is not a string");
    else if (src)
        st = tdm_profile_set_source(p, src->valuestring, err);
    if (!st)
        st = get_uint(cJSON_GetObjectItemCaseSensitive(root, "tokens"), "tokens", JSON_INT_MAX,
                      &v, err);
    p->tokens = (uint64_t)v;
    size_t n = (size_t)id.n_layer * id.n_expert;
    int32_t *rank = st ? NULL : malloc(n * sizeof *rank);
    bool *seen = st ? NULL : malloc(n * sizeof *seen);
    if (!st && (!rank || !seen))
        st = tdm_error_set(err, TDM_ERR_OOM, "profile: cannot allocate %zu entries", n);
    const cJSON *layers = cJSON_GetObjectItemCaseSensitive(root, "layers");
    if (!st && (!cJSON_IsArray(layers) || cJSON_GetArraySize(layers) != id.n_layer))
        st = tdm_error_set(err, TDM_ERR_FORMAT, "profile: \"layers\" must be an array of "
                           "n_layer = %d objects", id.n_layer);
    int32_t l = 0;
    for (const cJSON *lo = st ? NULL : layers->child; lo && !st; lo = lo->next, l++)
        st = layer_from_json(p, lo, l, rank, seen, err);
    if (!st)
        st = tdm_profile_validate(p, err);
    if (!st)
        st = global_from_json(p, cJSON_GetObjectItemCaseSensitive(root, "global_rank"), rank,
                              seen, err);
    free(rank);
    free(seen);
    if (st) {
        tdm_profile_free(p);
        return st;
    }
    *out = p;
    return TDM_OK;
}

tdm_status tdm_profile_parse(const char *json, size_t len, const tdm_model_id *expect,
                             tdm_profile **out, tdm_error *err)
{
    *out = NULL;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, false);
    if (!root) {
        size_t at = end && end >= json ? (size_t)(end - json) : 0, last = len;
        while (last > 0 && strchr(" \t\r\n", json[last - 1]))
            last--;
        bool cut = at + 1 >= len || last == 0 || json[last - 1] != '}';
        return tdm_error_set(err, TDM_ERR_FORMAT, "profile: invalid JSON near byte %zu%s", at,
                             cut ? " (truncated?)" : "");
    }
    tdm_status st = from_json(root, expect, out, err);
    cJSON_Delete(root);
    return st;
}

tdm_status tdm_profile_read(const char *path, const tdm_model_id *expect, tdm_profile **out,
                            tdm_error *err)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return tdm_error_set(err, TDM_ERR_IO, "%s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (cap - len < 65536) {
            if (cap > ((size_t)1 << 30)) {
                free(buf);
                fclose(f);
                return tdm_error_set(err, TDM_ERR_FORMAT, "%s: larger than 1 GiB", path);
            }
            char *nb = realloc(buf, cap = cap * 2 + 65536);
            if (!nb) {
                free(buf);
                fclose(f);
                return tdm_error_set(err, TDM_ERR_OOM, "%s: cannot buffer the file", path);
            }
            buf = nb;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0)
            break;
    }
    bool rerr = ferror(f);
    fclose(f);
    if (rerr) {
        free(buf);
        return tdm_error_set(err, TDM_ERR_IO, "%s: read failed", path);
    }
    tdm_status st = tdm_profile_parse(buf, len, expect, out, err);
    free(buf);
    return st ? tdm_error_wrap(err, "%s", path) : TDM_OK;
}

tdm_status tdm_profile_merge(tdm_profile *dst, const tdm_profile *src, tdm_error *err)
{
    tdm_status st = tdm_profile_check_model(&dst->id, &src->id, "profile to merge", err);
    if (st)
        return st;
    if (dst->tokens + src->tokens < dst->tokens ||
        (double)(dst->tokens + src->tokens) * dst->id.k > JSON_INT_MAX)
        return tdm_error_set(err, TDM_ERR_INVALID, "profile merge: token count overflows");
    size_t n = (size_t)dst->id.n_layer * dst->id.n_expert;
    for (size_t i = 0; i < n; i++) {
        dst->count[i] += src->count[i];
        dst->weight[i] += src->weight[i];
    }
    dst->tokens += src->tokens;
    return TDM_OK;
}
