/* gpu_kernels: decode matvec bandwidth per weight format at expert and
 * attention shapes, one fused MoE layer and one DeltaNet layer in both forms
 * (sequential, chunked), against the device-to-device
 * copy bandwidth measured in the same run. Weights are rotated over a pool of
 * several GiB of distinct random matrices, so L2 never holds them.
 * Prints a table; writes JSON (default bench/results/gpu_kernels.json).
 *   gpu_kernels [--out FILE] [--iters N] [--formats Q4_K,Q6_K,...] [--tunings]
 * --tunings also times every matvec launch shape (warps per row 1, 2, 4 at
 * 1 token; 1 and 2 rows per lane at 8 tokens). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "gpu.h"
#include "qrand.h"
#include "quant.h"
#include "bench_check.h"
#include "bench_json.h"

static tdm_gpu *g;
static tdm_error err;

static int cmpf(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Fills a device buffer with random blocks of type t (64 MiB host chunks). */
static void fill_pool(tdm_qtype t, void *dst, size_t bytes, uint64_t seed)
{
    const tdm_qtype_info *qi = tdm_qtype_get(t);
    size_t chunk = (64u << 20) / qi->type_size * qi->type_size;
    uint8_t *h = malloc(chunk);
    CHECK(tdm_qrand_fill(t, h, (int64_t)(chunk / qi->type_size), 0.02f, seed, &err));
    for (size_t off = 0; off < bytes; off += chunk) {
        size_t n = bytes - off < chunk ? bytes - off : chunk;
        CHECK(tdm_gpu_upload(g, (uint8_t *)dst + off, h, n, &err));
    }
    free(h);
}

/* Median over reps of (time of `iters` calls of fn) / iters, in ms. */
typedef void (*bench_fn)(void *ctx, int it);
static float time_median(bench_fn fn, void *ctx, int iters, int reps)
{
    float t[16];
    for (int w = 0; w < 3; w++)
        fn(ctx, w);
    for (int r = 0; r < reps; r++) {
        CHECK(tdm_gpu_mark(g, 0, &err));
        for (int i = 0; i < iters; i++)
            fn(ctx, r * iters + i);
        CHECK(tdm_gpu_mark(g, 1, &err));
        CHECK(tdm_gpu_elapsed_ms(g, 0, 1, &t[r], &err));
        t[r] /= (float)iters;
    }
    CHECK(tdm_gpu_sync(g, &err));
    qsort(t, (size_t)reps, sizeof t[0], cmpf);
    return t[reps / 2];
}

typedef struct copy_ctx { void *a, *b; size_t bytes; } copy_ctx;
static void copy_fn(void *c, int it)
{
    copy_ctx *x = c;
    CHECK(tdm_gpu_copy(g, it & 1 ? x->a : x->b, it & 1 ? x->b : x->a, x->bytes, &err));
}

typedef struct mv_ctx {
    tdm_qtype t;
    const uint8_t *pool;
    size_t mat_bytes;
    int64_t n_mats, rows, k;
    const float *x;
    float *y;
    int ntok;
} mv_ctx;
static void mv_fn(void *c, int it)
{
    mv_ctx *m = c;
    const uint8_t *w = m->pool + (size_t)(it % m->n_mats) * m->mat_bytes;
    CHECK(tdm_gpu_matvec(g, m->t, w, m->rows, m->k, m->x, NULL, m->ntok, m->y, false, &err));
}

typedef struct moe_ctx {
    tdm_gpu_moe_layer L;
    const float *x;
    const int32_t *ids; /* [n_sets][k] */
    const float *w;
    float *h, *y;
    int k, n_sets;
} moe_ctx;
static void moe_fn(void *c, int it)
{
    moe_ctx *m = c;
    const int32_t *ids = m->ids + (size_t)(it % m->n_sets) * m->k;
    const float *w = m->w + (size_t)(it % m->n_sets) * m->k;
    CHECK(tdm_gpu_moe_gate_up(g, &m->L, m->x, NULL, ids, 1, m->k, m->h, &err));
    CHECK(tdm_gpu_moe_down(g, &m->L, m->h, ids, w, 1, m->k, NULL, m->y, true, &err));
}

typedef struct dn_ctx {
    tdm_gpu_deltanet_shape sh;
    const float *qkv, *beta, *alpha, *a, *dt;
    float *state, *o;
    int64_t ntok;
} dn_ctx;
static void dn_fn(void *c, int it)
{
    (void)it;
    dn_ctx *d = c;
    CHECK(tdm_gpu_deltanet(g, &d->sh, d->qkv, d->beta, d->alpha, d->a, d->dt, d->state, d->o, d->ntok, &err));
}

static float *dev_random(size_t n, float scale, float shift, uint64_t seed)
{
    float *h = malloc(n * sizeof(float)), *d;
    for (size_t i = 0; i < n; i++) {
        seed = tdm_qrand_mix(seed, i);
        h[i] = shift + scale * (float)((double)(seed >> 11) * (2.0 / 9007199254740992.0) - 1.0);
    }
    CHECK(tdm_gpu_alloc(g, n * sizeof(float), (void **)&d, &err));
    CHECK(tdm_gpu_upload(g, d, h, n * sizeof(float), &err));
    free(h);
    return d;
}

/* Qwen3.5-35B-A3B DeltaNet layer (H_k 16, H_v 32, d_k = d_v = 128, tiled)
 * in both forms over prompt lengths: where the chunked form starts to win
 * sets DNC_MIN_TOKENS_DEFAULT (gpu_deltanet.cuh). */
static cJSON *bench_deltanet(char *table, int *tl, size_t cap)
{
    static const int64_t ntoks[] = {1, 8, 16, 32, 64, 128, 512, 4096};
    const int64_t Hk = 16, Hv = 32, D = 128, width = 2 * Hk * D + Hv * D, nmax = 4096;
    dn_ctx d = {{Hk, Hv, D, D, TDM_GPU_HEADS_TILED, 1e-6f}};
    d.qkv = dev_random((size_t)nmax * width, 1.0f, 0.0f, 1);
    d.beta = dev_random((size_t)nmax * Hv, 2.0f, 0.0f, 2);
    d.alpha = dev_random((size_t)nmax * Hv, 2.0f, -3.0f, 3);
    d.a = dev_random((size_t)Hv, 0.5f, -1.0f, 4);
    d.dt = dev_random((size_t)Hv, 0.5f, 0.0f, 5);
    d.state = dev_random((size_t)Hv * D * D, 0.01f, 0.0f, 6);
    CHECK(tdm_gpu_alloc(g, (size_t)nmax * Hv * D * sizeof(float), (void **)&d.o, &err));
    cJSON *arr = cJSON_CreateArray();
    for (size_t i = 0; i < sizeof ntoks / sizeof ntoks[0]; i++) {
        float us[2];
        d.ntok = ntoks[i];
        for (int form = 0; form < 2; form++) {
            tdm_gpu_tuning tu = {.deltanet_chunk_min = form ? 1 : INT32_MAX};
            CHECK(tdm_gpu_set_tuning(g, &tu, &err));
            us[form] = 1e3f * time_median(dn_fn, &d, ntoks[i] >= 512 ? 3 : 20, 5);
        }
        *tl += snprintf(table + *tl, cap - (size_t)*tl,
                        "deltanet Qwen3.5 layer, %4lld tokens: sequential %9.1f us, chunked %9.1f us\n",
                        (long long)ntoks[i], us[0], us[1]);
        cJSON *r = cJSON_CreateObject();
        cJSON_AddNumberToObject(r, "ntok", (double)ntoks[i]);
        cJSON_AddNumberToObject(r, "sequential_us", us[0]);
        cJSON_AddNumberToObject(r, "chunked_us", us[1]);
        cJSON_AddItemToArray(arr, r);
    }
    tdm_gpu_tuning tu0 = {0};
    CHECK(tdm_gpu_set_tuning(g, &tu0, &err));
    return arr;
}

static const struct { const char *name; int64_t rows, k; } k_shapes[] = {
    {"expert gate/up 512x2048", 512, 2048},
    {"expert down 2048x512", 2048, 512},
    {"q30b expert 768x2048", 768, 2048},
    {"attn q+gate 8192x2048", 8192, 2048},
    {"attn out 2048x4096", 2048, 4096},
    {"lm head 248320x2048", 248320, 2048},
};

int main(int argc, char **argv)
{
    const char *out = "bench/results/gpu_kernels.json", *formats = NULL;
    int iters = 200;
    bool tunings = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc)
            out = argv[++i];
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc)
            iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--formats") && i + 1 < argc)
            formats = argv[++i];
        else if (!strcmp(argv[i], "--tunings"))
            tunings = true;
        else {
            fprintf(stderr, "usage: gpu_kernels [--out FILE] [--iters N] [--formats A,B] [--tunings]\n");
            return 2;
        }
    }
    CHECK(tdm_gpu_create(0, &g, &err));
    tdm_gpu_info info;
    CHECK(tdm_gpu_query(g, &info, &err));
    printf("device %s, %d SMs, L2 %zu MiB, %.1f GiB free\n", info.name, info.sm_count,
           info.l2_bytes >> 20, info.mem_free / 1073741824.0);
    cJSON *root = cJSON_CreateObject(), *rows = cJSON_CreateArray();
    cJSON_AddStringToObject(root, "device", info.name);
    cJSON_AddNumberToObject(root, "sm_count", info.sm_count);
    cJSON_AddNumberToObject(root, "timestamp", (double)time(NULL));

    /* copy ceiling: 1 GiB device-to-device, bytes read + written */
    copy_ctx cc = {NULL, NULL, (size_t)1 << 30};
    CHECK(tdm_gpu_alloc(g, cc.bytes, &cc.a, &err));
    CHECK(tdm_gpu_alloc(g, cc.bytes, &cc.b, &err));
    CHECK(tdm_gpu_memset(g, cc.a, 0x5A, cc.bytes, &err));
    float tc = time_median(copy_fn, &cc, 10, 7);
    double copy_gbs = 2.0 * cc.bytes / (tc * 1e-3) / 1e9;
    printf("device copy: %.0f GB/s (read + write, 1 GiB, median of 7)\n", copy_gbs);
    cJSON_AddNumberToObject(root, "copy_gbs", copy_gbs);
    tdm_gpu_release(g, cc.a);
    tdm_gpu_release(g, cc.b);

    size_t pool_bytes = (size_t)2 << 30;
    void *pool;
    CHECK(tdm_gpu_alloc(g, pool_bytes, &pool, &err));
    float *x, *y;
    CHECK(tdm_gpu_alloc(g, sizeof(float) * 8 * 8192, (void **)&x, &err));
    CHECK(tdm_gpu_alloc(g, sizeof(float) * 8 * 248320, (void **)&y, &err));
    CHECK(tdm_gpu_fill_f32(g, x, 0.37f, 8 * 8192, &err));

    char table[32768];
    int tl = snprintf(table, sizeof table, "%-8s %-26s %5s %10s %9s %7s\n", "format", "shape",
                      "ntok", "us/call", "GB/s", "%copy");
    for (uint32_t t = 0; t < TDM_Q_COUNT; t++) {
        if (!tdm_gpu_type_supported((tdm_qtype)t))
            continue;
        const char *name = tdm_qtype_name(t);
        if (formats && !strstr(formats, name))
            continue;
        const tdm_qtype_info *qi = tdm_qtype_get(t);
        fill_pool((tdm_qtype)t, pool, pool_bytes / qi->type_size * qi->type_size, 1234 + t);
        for (size_t s = 0; s < sizeof k_shapes / sizeof k_shapes[0]; s++) {
            static const struct { const char *label; tdm_gpu_tuning tu; int ntok; } vars[] = {
                {"", {0}, 1},
                {"", {0}, 8},
                {"wpr=1", {.matvec_wpr = 1}, 1},
                {"wpr=2", {.matvec_wpr = 2}, 1},
                {"wpr=4", {.matvec_wpr = 4}, 1},
                {"rows=1", {.matvec_rows = 1}, 8},
                {"rows=2", {.matvec_rows = 2}, 8},
            };
            for (int v = 0; v < (tunings ? 7 : 2); v++) {
                int ntok = vars[v].ntok;
                CHECK(tdm_gpu_set_tuning(g, &vars[v].tu, &err));
                mv_ctx m = {(tdm_qtype)t, pool, tdm_qtype_row_bytes((tdm_qtype)t, k_shapes[s].k) * k_shapes[s].rows,
                            0, k_shapes[s].rows, k_shapes[s].k, x, y, ntok};
                m.n_mats = (int64_t)(pool_bytes / m.mat_bytes);
                if (m.n_mats < 1)
                    continue;
                int it = m.mat_bytes > (64u << 20) ? 10 : iters;
                float ms = time_median(mv_fn, &m, it, 5);
                double gbs = m.mat_bytes / (ms * 1e-3) / 1e9;
                tl += snprintf(table + tl, sizeof table - tl, "%-8s %-26s %5d %10.2f %9.0f %6.0f%%  %s\n",
                               name, k_shapes[s].name, ntok, ms * 1e3, gbs, 100 * gbs / copy_gbs,
                               vars[v].label);
                cJSON *r = cJSON_CreateObject();
                cJSON_AddStringToObject(r, "format", name);
                cJSON_AddStringToObject(r, "shape", k_shapes[s].name);
                cJSON_AddNumberToObject(r, "rows", (double)m.rows);
                cJSON_AddNumberToObject(r, "k", (double)m.k);
                cJSON_AddNumberToObject(r, "ntok", ntok);
                cJSON_AddNumberToObject(r, "matvec_wpr", vars[v].tu.matvec_wpr);
                cJSON_AddNumberToObject(r, "matvec_rows", vars[v].tu.matvec_rows);
                cJSON_AddNumberToObject(r, "us", ms * 1e3);
                cJSON_AddNumberToObject(r, "gbs", gbs);
                cJSON_AddNumberToObject(r, "frac_of_copy", gbs / copy_gbs);
                cJSON_AddItemToArray(rows, r);
            }
        }
    }
    tdm_gpu_tuning tu0 = {0};
    CHECK(tdm_gpu_set_tuning(g, &tu0, &err));
    cJSON_AddItemToObject(root, "matvec", rows);

    /* one Qwen3.5-35B-A3B MoE layer, decode: 8 of 256 resident experts,
     * Q4_K gate/up, Q6_K down, shared expert, random routing each call */
    {
        int64_t E = 256, D = 2048, F = 512, k = 8, n_sets = 512;
        size_t gb = tdm_qtype_row_bytes(TDM_Q_Q4_K, D) * F, db = tdm_qtype_row_bytes(TDM_Q_Q6_K, F) * D;
        size_t slot = 2 * gb + db;
        /* every slot: gate | up (Q4_K) | down (Q6_K), valid random blocks */
        uint8_t *hg = malloc(gb), *hd = malloc(db);
        int32_t *slot_of = malloc(sizeof(int32_t) * E), *ids = malloc(sizeof(int32_t) * n_sets * k);
        float *w = malloc(sizeof(float) * n_sets * k);
        for (int64_t e = 0; e < E; e++) {
            slot_of[e] = (int32_t)e;
            CHECK(tdm_qrand_fill(TDM_Q_Q4_K, hg, (int64_t)(gb / 144), 0.02f, 2 * e, &err));
            CHECK(tdm_qrand_fill(TDM_Q_Q6_K, hd, (int64_t)(db / 210), 0.02f, 2 * e + 1, &err));
            CHECK(tdm_gpu_upload(g, (uint8_t *)pool + e * slot, hg, gb, &err));
            CHECK(tdm_gpu_upload(g, (uint8_t *)pool + e * slot + gb, hg, gb, &err));
            CHECK(tdm_gpu_upload(g, (uint8_t *)pool + e * slot + 2 * gb, hd, db, &err));
        }
        uint64_t s = 42;
        for (int64_t i = 0; i < n_sets; i++)
            for (int64_t r = 0; r < k; r++) {
                s = tdm_qrand_mix(s, (uint64_t)i);
                ids[i * k + r] = (int32_t)((s >> 20) % (uint64_t)E);
                w[i * k + r] = 0.125f;
            }
        void *dslot, *dids, *dw, *dh, *dsh;
        CHECK(tdm_gpu_alloc(g, sizeof(int32_t) * E, &dslot, &err));
        CHECK(tdm_gpu_upload(g, dslot, slot_of, sizeof(int32_t) * E, &err));
        CHECK(tdm_gpu_alloc(g, sizeof(int32_t) * n_sets * k, &dids, &err));
        CHECK(tdm_gpu_upload(g, dids, ids, sizeof(int32_t) * n_sets * k, &err));
        CHECK(tdm_gpu_alloc(g, sizeof(float) * n_sets * k, &dw, &err));
        CHECK(tdm_gpu_upload(g, dw, w, sizeof(float) * n_sets * k, &err));
        CHECK(tdm_gpu_alloc(g, tdm_gpu_moe_h_bytes(F, k + 1), &dh, &err));
        CHECK(tdm_gpu_alloc(g, slot, &dsh, &err));
        CHECK(tdm_gpu_copy(g, dsh, pool, slot, &err));
        tdm_gpu_expert_table tab = {dslot, E, pool, slot, 0, gb, 2 * gb};
        tdm_gpu_shared_expert sh = {dsh, (uint8_t *)dsh + gb, (uint8_t *)dsh + 2 * gb,
                                    TDM_Q_Q4_K, TDM_Q_Q4_K, TDM_Q_Q6_K, F, NULL};
        moe_ctx m = {{&tab, 0, TDM_Q_Q4_K, TDM_Q_Q4_K, TDM_Q_Q6_K, D, F, &sh}, x, dids, dw, dh, y,
                     (int)k, (int)n_sets};
        cJSON *mj = cJSON_CreateArray();
        static const int tiles[] = {8, 16, 32};
        for (size_t si = 0; si < sizeof tiles / sizeof tiles[0]; si++) {
            const int tile = tiles[si];
            tdm_gpu_tuning tu = {.moe_tile = tile};
            CHECK(tdm_gpu_set_tuning(g, &tu, &err));
            float ms = time_median(moe_fn, &m, iters, 5);
            double bytes = (double)(k + 1) * slot, gbs = bytes / (ms * 1e-3) / 1e9;
            tl += snprintf(table + tl, sizeof table - tl,
                           "fused MoE layer (Qwen3.5, k=8 + shared, Q4_K/Q6_K, down tile %2d): %.1f us, "
                           "%.0f GB/s, %.0f%% of copy\n",
                           tile, ms * 1e3, gbs, 100 * gbs / copy_gbs);
            cJSON *r = cJSON_CreateObject();
            cJSON_AddNumberToObject(r, "moe_tile", tile);
            cJSON_AddNumberToObject(r, "us", ms * 1e3);
            cJSON_AddNumberToObject(r, "gbs", gbs);
            cJSON_AddNumberToObject(r, "frac_of_copy", gbs / copy_gbs);
            cJSON_AddItemToArray(mj, r);
        }
        cJSON_AddItemToObject(root, "moe_layer_qwen35", mj);
        CHECK(tdm_gpu_set_tuning(g, &tu0, &err));
        free(hg), free(hd), free(slot_of), free(ids), free(w);
    }
    cJSON_AddItemToObject(root, "deltanet_qwen35", bench_deltanet(table, &tl, sizeof table));
    printf("\n%s", table);
    printf("copy ceiling %.0f GB/s\n", copy_gbs);
    const int rc = bench_write_json(root, out);
    tdm_gpu_free(g);
    return rc;
}
