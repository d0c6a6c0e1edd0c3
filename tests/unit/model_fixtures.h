/* Helpers shared by the model parity tests (test_forward.c, test_model_quant.c,
 * test_demo_parity.c): fixture paths, reading reference.json and .f32 files,
 * logits metrics. Header-only (static) because each test is its own binary. */
#ifndef TDM_TEST_MODEL_FIXTURES_H
#define TDM_TEST_MODEL_FIXTURES_H

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model.h"

static __attribute__((unused)) const char *fx_root(void)
{
    const char *r = getenv("TDM_ROOT");
    return r && *r ? r : ".";
}

static __attribute__((unused)) int fx_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Directory of fixture folder `name`: the full set (../shared/fixtures) when
 * present and `full` is set, else the vendored tests/fixtures. */
static __attribute__((unused)) void fx_dir(char *out, size_t cap, const char *name, int full)
{
    snprintf(out, cap, "%s/../shared/fixtures/%s", fx_root(), name);
    if (full && fx_exists(out))
        return;
    snprintf(out, cap, "%s/tests/fixtures/%s", fx_root(), name);
}

static __attribute__((unused)) int fx_full_available(void)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/../shared/fixtures/README.md", fx_root());
    return fx_exists(p);
}

static __attribute__((unused)) void *fx_read(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = 0;
        if (size)
            *size = (size_t)n;
    }
    return buf;
}

static __attribute__((unused)) cJSON *fx_json(const char *path)
{
    char *txt = fx_read(path, NULL);
    if (!txt)
        return NULL;
    cJSON *j = cJSON_Parse(txt);
    free(txt);
    return j;
}

/* Reads an f32 file expected to hold exactly n floats. */
static __attribute__((unused)) float *fx_f32(const char *path, size_t n)
{
    size_t size = 0;
    float *p = fx_read(path, &size);
    if (p && size != n * sizeof(float)) {
        fprintf(stderr, "%s: %zu bytes, expected %zu\n", path, size, n * sizeof(float));
        free(p);
        return NULL;
    }
    return p;
}

/* int array of a JSON array; returns count (cap-limited) */
static __attribute__((unused)) int fx_ints(const cJSON *arr, int32_t *out, int cap)
{
    int n = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr)
    {
        if (n < cap)
            out[n] = (int32_t)it->valuedouble;
        n++;
    }
    return n;
}

static __attribute__((unused)) double fx_rel_l2(const float *a, const float *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

static __attribute__((unused)) int fx_argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

/* Fraction of rows whose argmax agree. */
static __attribute__((unused)) double fx_top1(const float *a, const float *b, int rows, int n)
{
    int agree = 0;
    for (int r = 0; r < rows; r++)
        agree += fx_argmax(a + (size_t)r * n, n) == fx_argmax(b + (size_t)r * n, n);
    return (double)agree / rows;
}

/* Mean over rows of KL(softmax(p) || softmax(q)). */
static __attribute__((unused)) double fx_mean_kl(const float *p, const float *q, int rows, int n)
{
    double total = 0;
    for (int r = 0; r < rows; r++) {
        const float *a = p + (size_t)r * n, *b = q + (size_t)r * n;
        double ma = a[0], mb = b[0];
        for (int i = 1; i < n; i++) {
            if (a[i] > ma) ma = a[i];
            if (b[i] > mb) mb = b[i];
        }
        double sa = 0, sb = 0;
        for (int i = 0; i < n; i++) {
            sa += exp(a[i] - ma);
            sb += exp(b[i] - mb);
        }
        double lsa = log(sa), lsb = log(sb), kl = 0;
        for (int i = 0; i < n; i++) {
            double lpa = a[i] - ma - lsa, lpb = b[i] - mb - lsb;
            kl += exp(lpa) * (lpa - lpb);
        }
        total += kl;
    }
    return total / rows;
}

/* A route hook (forward.h tdm_forward_route_fn) counting into *(int *)user
 * the calls whose k weights sum to 1 (renormalised top-k). */
static __attribute__((unused)) void fx_count_routes(void *user, int32_t pos, int32_t layer, int32_t k,
                                                    const int32_t *ex, const float *w)
{
    (void)pos, (void)layer, (void)ex;
    float s = 0;
    for (int i = 0; i < k; i++)
        s += w[i];
    if (fabsf(s - 1.0f) < 1e-4f)
        ++*(int *)user;
}

/* The f32 file of a micro fixture (e.g. "micro-qwen3moe"), loaded. */
static __attribute__((unused)) tdm_model *fx_load_micro_f32(const char *name)
{
    char d[1024], path[1200];
    fx_dir(d, sizeof d, name, 0);
    snprintf(path, sizeof path, "%s/%s-f32.gguf", d, name);
    tdm_model *m = NULL;
    tdm_error err = {0};
    assert_int_equal(tdm_model_load(path, &m, &err), TDM_OK);
    return m;
}

/* A micro fixture model: its folder, reference.json and the loaded model. */
typedef struct fx_micro {
    char dir[1024];
    cJSON *ref;
    tdm_model *m;
    const tdm_hparams *hp;
} fx_micro;

static __attribute__((unused)) void fx_micro_open(fx_micro *mc, const char *name)
{
    char path[1200];
    fx_dir(mc->dir, sizeof mc->dir, name, 0);
    snprintf(path, sizeof path, "%s/reference.json", mc->dir);
    mc->ref = fx_json(path);
    assert_non_null(mc->ref);
    snprintf(path, sizeof path, "%s/%s", mc->dir, cJSON_GetObjectItem(mc->ref, "gguf")->valuestring);
    tdm_error err = {0};
    tdm_status st = tdm_model_load(path, &mc->m, &err);
    if (st)
        fprintf(stderr, "load %s: %s\n", path, err.msg);
    assert_int_equal(st, TDM_OK);
    mc->hp = tdm_model_hparams(mc->m);
    char desc[512];
    tdm_model_describe(mc->m, desc, sizeof desc);
    printf("[%s] %s\n", name, desc);
}

static __attribute__((unused)) void fx_micro_close(fx_micro *mc)
{
    tdm_model_free(mc->m);
    cJSON_Delete(mc->ref);
}

#endif
