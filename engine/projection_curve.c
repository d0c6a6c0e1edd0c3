/* projection_curve: hit-rate curves h(cached fraction) for the projection
 * (engine/projection.h): the Zipf model and tables read from a tandem expert
 * profile, a cachesim JSON or a CSV. docs/PROJECTION.md §3 documents them. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "projection.h"
#include "projection_internal.h"


tdm_status tdm_proj_hitcurve_zipf(double s, int32_t n_expert, tdm_proj_hitcurve *out,
                                  tdm_error *err)
{
    if (!out || !(s >= 0 && s <= 10) || n_expert < 1)
        return tdm_error_set(err, TDM_ERR_INVALID, "zipf curve: skew %g (want 0..10), %d experts", s,
                             n_expert);
    memset(out, 0, sizeof *out);
    out->kind = TDM_PROJ_HIT_ZIPF;
    out->zipf_s = s;
    out->n_expert = n_expert;
    snprintf(out->source, sizeof out->source, "zipf s=%.2f", s);
    return TDM_OK;
}

/* H(c, s) = sum_{r=1..c} r^-s for real c >= 0, linear between integers. */
static double harmonic(double c, double s)
{
    double h = 0;
    int64_t whole = (int64_t)c;
    for (int64_t r = 1; r <= whole; r++)
        h += pow((double)r, -s);
    if (c > (double)whole)
        h += (c - (double)whole) * pow((double)(whole + 1), -s);
    return h;
}

double tdm_proj_hit_rate(const tdm_proj_hitcurve *h, double f)
{
    f = f < 0 ? 0 : f > 1 ? 1 : f;
    if (h->kind == TDM_PROJ_HIT_ZIPF) {
        double E = h->n_expert;
        return harmonic(f * E, h->zipf_s) / harmonic(E, h->zipf_s);
    }
    double x0 = 0, y0 = 0;
    for (int32_t i = 0; i < h->n; i++) {
        double x1 = h->frac[i], y1 = h->hit[i];
        if (f <= x1)
            return y0 + (y1 - y0) * (f - x0) / (x1 - x0);
        x0 = x1;
        y0 = y1;
    }
    return x0 >= 1 ? y0 : y0 + (1 - y0) * (f - x0) / (1 - x0); /* implicit (1, 1) */
}

/* Adds (f, hit) to a table, in any order; sorted and checked by table_finish(). */
static tdm_status table_add(tdm_proj_hitcurve *h, double f, double hit, const char *name,
                            tdm_error *err)
{
    if (!(f >= 0 && f <= 1) || !(hit >= 0 && hit <= 1))
        return tdm_error_set(err, TDM_ERR_FORMAT, "%s: point (size fraction %g, hit_rate %g) outside "
                             "[0,1]", name, f, hit);
    if (f == 0) {
        if (hit != 0)
            return tdm_error_set(err, TDM_ERR_FORMAT, "%s: hit_rate %g with an empty cache", name, hit);
        return TDM_OK; /* (0, 0) is implicit */
    }
    if (h->n >= TDM_PROJ_HIT_MAX)
        return tdm_error_set(err, TDM_ERR_FORMAT, "%s: more than %d points", name, TDM_PROJ_HIT_MAX);
    h->frac[h->n] = f;
    h->hit[h->n] = hit;
    h->n++;
    return TDM_OK;
}

static tdm_status table_finish(tdm_proj_hitcurve *h, const char *name, tdm_error *err)
{
    if (h->n == 0)
        return tdm_error_set(err, TDM_ERR_FORMAT, "%s: no hit-rate points", name);
    for (int32_t i = 1; i < h->n; i++) /* insertion sort: n <= 512 */
        for (int32_t j = i; j > 0 && h->frac[j - 1] > h->frac[j]; j--) {
            double tf = h->frac[j], th = h->hit[j];
            h->frac[j] = h->frac[j - 1], h->hit[j] = h->hit[j - 1];
            h->frac[j - 1] = tf, h->hit[j - 1] = th;
        }
    for (int32_t i = 1; i < h->n; i++)
        if (h->frac[i] == h->frac[i - 1])
            return tdm_error_set(err, TDM_ERR_FORMAT, "%s: two points at size fraction %g", name,
                                 h->frac[i]);
    h->kind = TDM_PROJ_HIT_TABLE;
    return TDM_OK;
}

static int cmp_desc_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* A tandem expert profile: the static cache of the S hottest (layer, expert)
 * pairs hits the share of all routings that those pairs received. */
static tdm_status curve_from_profile(const cJSON *root, const char *name, const tdm_proj_model *m,
                                     tdm_proj_hitcurve *h, tdm_error *err)
{
    const cJSON *layers = cJSON_GetObjectItemCaseSensitive(root, "layers");
    int nl = cJSON_GetArraySize(layers);
    if (!cJSON_IsArray(layers) || nl != m->n_moe_layer)
        return tdm_error_set(err, TDM_ERR_FORMAT, "%s: profile \"layers\" has %d entries, the model "
                             "%d MoE layers", name, nl, m->n_moe_layer);
    size_t n = (size_t)nl * (size_t)m->n_expert;
    uint64_t *c = calloc(n + 1, sizeof *c);
    if (!c)
        return tdm_error_set(err, TDM_ERR_OOM, "%s: %zu counts", name, n);
    tdm_status st = TDM_OK;
    size_t k = 0;
    const cJSON *L;
    cJSON_ArrayForEach(L, layers) {
        const cJSON *cnt = cJSON_GetObjectItemCaseSensitive(L, "count"), *v;
        if (!cJSON_IsArray(cnt) || cJSON_GetArraySize(cnt) != m->n_expert) {
            st = tdm_error_set(err, TDM_ERR_FORMAT, "%s: layer entry %zu: \"count\" is not an array "
                               "of %d numbers", name, k / (size_t)m->n_expert, m->n_expert);
            goto out;
        }
        cJSON_ArrayForEach(v, cnt) {
            if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 9e15) {
                st = tdm_error_set(err, TDM_ERR_FORMAT, "%s: bad count in layer entry %zu", name,
                                   k / (size_t)m->n_expert);
                goto out;
            }
            c[k++] = (uint64_t)v->valuedouble;
        }
    }
    qsort(c, n, sizeof *c, cmp_desc_u64);
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += c[i];
    if (total == 0) {
        st = tdm_error_set(err, TDM_ERR_FORMAT, "%s: profile has no routed tokens", name);
        goto out;
    }
    size_t pts = n < TDM_PROJ_HIT_MAX ? n : TDM_PROJ_HIT_MAX, done = 0;
    uint64_t cum = 0;
    for (size_t p = 1; p <= pts && !st; p++) {
        size_t upto = (p * n + pts - 1) / pts; /* slots of point p, ascending, last = n */
        while (done < upto)
            cum += c[done++];
        st = table_add(h, (double)upto / (double)n, (double)cum / (double)total, name, err);
    }
    if (!st)
        st = table_finish(h, name, err);
out:
    free(c);
    return st;
}

/* Size of one table point as a cached fraction, from whichever key it has
 * (or, for a cachesim result, the run's "slots"). */
static bool point_fraction(const cJSON *o, const cJSON *doc, const tdm_proj_model *m, double *f)
{
    static const char *const keys[] = {"fraction", "cached_fraction", "slots_per_layer", "slots",
                                       "cache_slots"};
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < 5; i++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(pass ? doc : o, keys[i]);
            if (!cJSON_IsNumber(v))
                continue;
            double d = i < 2 ? 1.0 : i == 2 ? m->n_expert : (double)m->n_moe_layer * m->n_expert;
            *f = v->valuedouble / d;
            return true;
        }
    return false;
}

/* A cachesim run names its model's shape: it must be this model's. */
static tdm_status check_shape(const cJSON *doc, const char *name, const tdm_proj_model *m,
                              tdm_error *err)
{
    const cJSON *nl = cJSON_GetObjectItemCaseSensitive(doc, "n_layer");
    const cJSON *ne = cJSON_GetObjectItemCaseSensitive(doc, "n_expert");
    if (cJSON_IsNumber(nl) && nl->valuedouble != m->n_moe_layer)
        return tdm_error_set(err, TDM_ERR_FORMAT, "%s: n_layer %g, the model has %d MoE layers", name,
                             nl->valuedouble, m->n_moe_layer);
    if (cJSON_IsNumber(ne) && ne->valuedouble != m->n_expert)
        return tdm_error_set(err, TDM_ERR_FORMAT, "%s: n_expert %g, the model has %d", name,
                             ne->valuedouble, m->n_expert);
    return TDM_OK;
}

/* Adds the points of arr (doc: the enclosing object, or NULL) whose policy is
 * *chosen (the first one seen when chosen is empty). *idx numbers points for messages. */
static tdm_status add_points(const cJSON *arr, const cJSON *doc, const char *name, char *chosen,
                             size_t cap, const tdm_proj_model *m, tdm_proj_hitcurve *h, int *idx,
                             tdm_error *err)
{
    tdm_status st = doc ? check_shape(doc, name, m, err) : TDM_OK;
    const cJSON *o;
    cJSON_ArrayForEach(o, arr) {
        if (st)
            break;
        int i = (*idx)++;
        const cJSON *pol = cJSON_GetObjectItemCaseSensitive(o, "policy");
        if (cJSON_IsString(pol)) {
            if (!chosen[0])
                snprintf(chosen, cap, "%s", pol->valuestring);
            if (strcmp(chosen, pol->valuestring) != 0)
                continue;
        }
        const cJSON *hv = cJSON_GetObjectItemCaseSensitive(o, "hit_rate");
        if (!hv)
            hv = cJSON_GetObjectItemCaseSensitive(o, "hit");
        double f;
        if (!cJSON_IsObject(o) || !cJSON_IsNumber(hv) || !point_fraction(o, doc, m, &f))
            return tdm_error_set(err, TDM_ERR_FORMAT, "%s: point %d lacks a number \"hit_rate\" and a "
                                 "size (fraction, slots_per_layer or slots)", name, i);
        st = table_add(h, f, hv->valuedouble, name, err);
    }
    return st;
}

static tdm_status finish_points(const char *name, const char *chosen, tdm_proj_hitcurve *h,
                                tdm_error *err)
{
    if (h->n == 0 && chosen[0])
        return tdm_error_set(err, TDM_ERR_INVALID, "%s: no points for policy '%s'", name, chosen);
    snprintf(h->source, sizeof h->source, "%s%s%s", name, chosen[0] ? " policy " : "", chosen);
    return table_finish(h, name, err);
}

static const cJSON *points_array(const cJSON *doc)
{
    static const char *const keys[] = {"points", "curve", "results"};
    for (int i = 0; i < 3; i++) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(doc, keys[i]);
        if (cJSON_IsArray(a))
            return a;
    }
    return NULL;
}

/* A table document, a bare array of points, or an array of cachesim runs
 * (`tandem cachesim --json` at several --slots, e.g. collected with jq -s). */
static tdm_status curve_from_table(const cJSON *root, const char *name, const char *policy,
                                   const tdm_proj_model *m, tdm_proj_hitcurve *h, tdm_error *err)
{
    char chosen[64] = "";
    if (policy)
        snprintf(chosen, sizeof chosen, "%s", policy);
    int idx = 0;
    tdm_status st = TDM_OK;
    const cJSON *first = cJSON_IsArray(root) ? cJSON_GetArrayItem(root, 0) : NULL;
    if (first && points_array(first)) {
        const cJSON *doc;
        cJSON_ArrayForEach(doc, root) {
            const cJSON *arr = points_array(doc);
            if (!arr)
                return tdm_error_set(err, TDM_ERR_FORMAT, "%s: run %d has no \"results\"", name, idx);
            if ((st = add_points(arr, doc, name, chosen, sizeof chosen, m, h, &idx, err)))
                return st;
        }
    } else {
        const cJSON *arr = cJSON_IsArray(root) ? root : points_array(root);
        if (!arr)
            return tdm_error_set(err, TDM_ERR_FORMAT, "%s: no \"points\", \"curve\" or \"results\" "
                                 "array and not a tandem-expert-profile", name);
        st = add_points(arr, arr == root ? NULL : root, name, chosen, sizeof chosen, m, h, &idx, err);
    }
    return st ? st : finish_points(name, chosen, h, err);
}

static tdm_status curve_from_json(const char *text, const char *name, const char *policy,
                                  const tdm_proj_model *m, tdm_proj_hitcurve *h, tdm_error *err)
{
    cJSON *root = cJSON_Parse(text);
    if (!root)
        return tdm_error_set(err, TDM_ERR_FORMAT, "%s: not valid JSON", name);
    tdm_status st;
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    if (cJSON_IsString(fmt) && strcmp(fmt->valuestring, "tandem-expert-profile") == 0) {
        st = curve_from_profile(root, name, m, h, err);
        snprintf(h->source, sizeof h->source, "%s (static cache of the hottest experts)", name);
    } else {
        st = curve_from_table(root, name, policy, m, h, err);
    }
    cJSON_Delete(root);
    return st;
}

/* CSV: a header row, then numbers; column names as the JSON keys. */
static tdm_status curve_from_csv(const char *text, const char *name, const char *policy,
                                 const tdm_proj_model *m, tdm_proj_hitcurve *h, tdm_error *err)
{
    cJSON *arr = cJSON_CreateArray();
    if (!arr)
        return tdm_error_set(err, TDM_ERR_OOM, "%s: CSV", name);
    char cols[16][32];
    int ncol = 0, line = 0;
    tdm_status st = TDM_OK;
    for (const char *p = text; *p && !st;) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        char buf[512];
        if (len >= sizeof buf) {
            st = tdm_error_set(err, TDM_ERR_FORMAT, "%s: line %d too long", name, line + 1);
            break;
        }
        memcpy(buf, p, len);
        buf[len] = '\0';
        p += len + (eol ? 1 : 0);
        line++;
        if (len && buf[len - 1] == '\r')
            buf[--len] = '\0';
        if (!len || buf[0] == '#')
            continue;
        cJSON *o = ncol ? cJSON_CreateObject() : NULL;
        int c = 0;
        for (char *save, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save), c++) {
            while (*tok == ' ')
                tok++;
            if (!ncol) {
                if (c < 16)
                    snprintf(cols[c], sizeof cols[c], "%s", tok);
                continue;
            }
            if (c >= ncol)
                break;
            char *end;
            double v = strtod(tok, &end);
            if (end != tok && (*end == '\0' || *end == ' '))
                cJSON_AddNumberToObject(o, cols[c], v);
            else
                cJSON_AddStringToObject(o, cols[c], tok);
        }
        if (!ncol)
            ncol = c < 16 ? c : 16;
        else
            cJSON_AddItemToArray(arr, o);
    }
    if (!st)
        st = curve_from_table(arr, name, policy, m, h, err);
    cJSON_Delete(arr);
    return st;
}

tdm_status tdm_proj_hitcurve_parse(const char *text, const char *name, const char *policy,
                                   const tdm_proj_model *m, tdm_proj_hitcurve *out, tdm_error *err)
{
    if (!text || !m || !out)
        return tdm_error_set(err, TDM_ERR_INVALID, "tdm_proj_hitcurve_parse: NULL argument");
    if (m->n_moe_layer < 1 || m->n_expert < 1)
        return tdm_error_set(err, TDM_ERR_INVALID, "hit curve: model without experts");
    name = name ? name : "hit curve";
    memset(out, 0, sizeof *out);
    const char *p = text;
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
        p++;
    if (*p == '{' || *p == '[')
        return curve_from_json(p, name, policy, m, out, err);
    return curve_from_csv(p, name, policy, m, out, err);
}

tdm_status tdm_proj_read_text(const char *path, char **out, tdm_error *err)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return tdm_error_set(err, TDM_ERR_IO, "%s: %s", path, strerror(errno));
    char *buf = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && n < (64l << 20) &&
        fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1)) &&
        fread(buf, 1, (size_t)n, f) == (size_t)n) {
        buf[n] = '\0';
    } else {
        free(buf);
        fclose(f);
        return tdm_error_set(err, n >= (64l << 20) ? TDM_ERR_FORMAT : TDM_ERR_IO,
                             "%s: cannot read (size %ld)", path, n);
    }
    fclose(f);
    *out = buf;
    return TDM_OK;
}

tdm_status tdm_proj_hitcurve_load(const char *path, const char *policy, const tdm_proj_model *m,
                                  tdm_proj_hitcurve *out, tdm_error *err)
{
    char *buf;
    tdm_status st = tdm_proj_read_text(path, &buf, err);
    if (st)
        return st;
    const char *base = strrchr(path, '/');
    st = tdm_proj_hitcurve_parse(buf, base ? base + 1 : path, policy, m, out, err);
    free(buf);
    return st;
}
