/* gpu_moe_prefill: one Qwen3.5-35B-A3B MoE layer over a prompt batch (256
 * experts, all resident, 8 per token by uniform random routing, Q4_K gate/up,
 * Q6_K down, a Q4_K/Q6_K shared expert of n_ff 512), timed for the grouped
 * prompt path (tdm_gpu_moe_prefill) and for the decode-style fused kernels
 * (tdm_gpu_moe_gate_up + tdm_gpu_moe_down) in the same run, with the
 * norm-wise relative difference of their outputs. Prints a table; writes JSON.
 *   gpu_moe_prefill [--out FILE] [--tokens 512,4096]
 * Effective TFLOP/s = 2 * ntok * (k + 1) * 3 * n_ff * n_embd / time. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "bench_check.h"
#include "gpu.h"
#include "qrand.h"
#include "quant.h"
#include "bench_json.h"

static tdm_gpu *g;
static tdm_error err;

enum { E = 256, K = 8, D = 2048, F = 512 };

typedef struct layer_ctx {
    tdm_gpu_moe_layer L;
    const float *x, *w;
    const int32_t *ids;
    float *h, *y;
    void *scratch;
    size_t scratch_bytes;
    int64_t ntok;
} layer_ctx;

static void run_prefill(const layer_ctx *c)
{
    CHECK(tdm_gpu_moe_prefill(g, &c->L, c->x, c->ids, c->w, c->ntok, K, c->h, NULL, c->y, false,
                              c->scratch, c->scratch_bytes, &err));
}

static void run_decode(const layer_ctx *c)
{
    CHECK(tdm_gpu_moe_gate_up(g, &c->L, c->x, NULL, c->ids, c->ntok, K, c->h, &err));
    CHECK(tdm_gpu_moe_down(g, &c->L, c->h, c->ids, c->w, c->ntok, K, NULL, c->y, false, &err));
}

static int cmpf(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Median over 5 repetitions of the mean time of n calls (n sized from one
 * warm call so a repetition takes ~100 ms), in ms. */
static float time_ms(void (*fn)(const layer_ctx *), const layer_ctx *c)
{
    float t[5], one;
    fn(c);
    CHECK(tdm_gpu_mark(g, 0, &err));
    fn(c);
    CHECK(tdm_gpu_mark(g, 1, &err));
    CHECK(tdm_gpu_elapsed_ms(g, 0, 1, &one, &err));
    int n = one > 0 ? (int)(100.0f / one) : 100;
    n = n < 1 ? 1 : n > 200 ? 200 : n;
    for (int r = 0; r < 5; r++) {
        CHECK(tdm_gpu_mark(g, 0, &err));
        for (int i = 0; i < n; i++)
            fn(c);
        CHECK(tdm_gpu_mark(g, 1, &err));
        CHECK(tdm_gpu_elapsed_ms(g, 0, 1, &t[r], &err));
        t[r] /= (float)n;
    }
    qsort(t, 5, sizeof t[0], cmpf);
    return t[2];
}

static void *dalloc(size_t bytes)
{
    void *p;
    CHECK(tdm_gpu_alloc(g, bytes, &p, &err));
    return p;
}

static float *download(const float *d, size_t n)
{
    float *h = malloc(n * sizeof(float));
    CHECK(tdm_gpu_sync(g, &err));
    CHECK(tdm_gpu_download(g, h, d, n * sizeof(float), &err));
    return h;
}

int main(int argc, char **argv)
{
    const char *out = "bench/results/gpu_moe_prefill.json", *toks = "512,4096";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc)
            out = argv[++i];
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc)
            toks = argv[++i];
        else {
            fprintf(stderr, "usage: gpu_moe_prefill [--out FILE] [--tokens 512,4096]\n");
            return 2;
        }
    }
    CHECK(tdm_gpu_create(0, &g, &err));
    tdm_gpu_info info;
    CHECK(tdm_gpu_query(g, &info, &err));
    printf("device %s, %d SMs, cc %d.%d\n", info.name, info.sm_count, info.cc_major, info.cc_minor);

    /* 256 slots of gate | up (Q4_K) | down (Q6_K) + the shared expert: 523 MB,
     * more than L2, so every expert is read from HBM once per call */
    size_t gb = tdm_qtype_row_bytes(TDM_Q_Q4_K, D) * F, db = tdm_qtype_row_bytes(TDM_Q_Q6_K, F) * D;
    size_t slot = 2 * gb + db;
    uint8_t *arena = dalloc(slot * (E + 1)), *hq = malloc(slot);
    int32_t slot_of[E];
    for (int e = 0; e <= E; e++) {
        CHECK(tdm_qrand_fill(TDM_Q_Q4_K, hq, (int64_t)(2 * gb / 144), 0.02f, 3 * (uint64_t)e, &err));
        CHECK(tdm_qrand_fill(TDM_Q_Q6_K, hq + 2 * gb, (int64_t)(db / 210), 0.02f, 3 * (uint64_t)e + 1, &err));
        CHECK(tdm_gpu_upload(g, arena + e * slot, hq, slot, &err));
        if (e < E)
            slot_of[e] = e;
    }
    free(hq);
    int32_t *dslot = dalloc(sizeof slot_of);
    CHECK(tdm_gpu_upload(g, dslot, slot_of, sizeof slot_of, &err));
    const uint8_t *shw = arena + (size_t)E * slot;
    tdm_gpu_expert_table tab = {dslot, E, arena, slot, 0, gb, 2 * gb};
    tdm_gpu_shared_expert sh = {shw, shw + gb, shw + 2 * gb, TDM_Q_Q4_K, TDM_Q_Q4_K, TDM_Q_Q6_K, F,
                                NULL};

    cJSON *root = cJSON_CreateObject(), *rows = cJSON_CreateArray();
    cJSON_AddStringToObject(root, "device", info.name);
    cJSON_AddNumberToObject(root, "timestamp", (double)time(NULL));
    cJSON_AddStringToObject(root, "layer", "qwen35-35b-a3b: 256 experts, k 8, n_embd 2048, n_ff 512, "
                                           "Q4_K gate/up, Q6_K down, shared expert n_ff 512");
    printf("\n%6s %12s %10s %12s %10s %8s %10s\n", "ntok", "prefill ms", "TFLOP/s", "decode ms",
           "TFLOP/s", "speedup", "rel diff");
    for (const char *p = toks; *p;) {
        int64_t ntok = strtoll(p, (char **)&p, 10);
        if (*p == ',')
            p++;
        if (ntok < 1)
            continue;
        layer_ctx c = {{&tab, 0, TDM_Q_Q4_K, TDM_Q_Q4_K, TDM_Q_Q6_K, D, F, &sh}};
        c.ntok = ntok;
        float *hx = malloc(sizeof(float) * ntok * D), *hw = malloc(sizeof(float) * ntok * K);
        int32_t *hid = malloc(sizeof(int32_t) * ntok * K);
        uint64_t s = 42 + (uint64_t)ntok;
        for (int64_t i = 0; i < ntok * D; i++) {
            s = tdm_qrand_mix(s, (uint64_t)i);
            hx[i] = (float)((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
        }
        for (int64_t t = 0; t < ntok; t++)
            for (int r = 0; r < K; r++) {
                int32_t e;
                bool dup;
                do { /* uniform, k distinct experts per token */
                    s = tdm_qrand_mix(s, (uint64_t)(t * K + r));
                    e = (int32_t)((s >> 20) % E);
                    dup = false;
                    for (int q = 0; q < r; q++)
                        dup |= hid[t * K + q] == e;
                } while (dup);
                hid[t * K + r] = e;
                hw[t * K + r] = 1.0f / K;
            }
        float *dx = dalloc(sizeof(float) * ntok * D), *dw = dalloc(sizeof(float) * ntok * K);
        int32_t *did = dalloc(sizeof(int32_t) * ntok * K);
        CHECK(tdm_gpu_upload(g, dx, hx, sizeof(float) * ntok * D, &err));
        CHECK(tdm_gpu_upload(g, dw, hw, sizeof(float) * ntok * K, &err));
        CHECK(tdm_gpu_upload(g, did, hid, sizeof(int32_t) * ntok * K, &err));
        c.x = dx, c.w = dw, c.ids = did;
        c.h = dalloc(tdm_gpu_moe_h_bytes(F, ntok * (K + 1)));
        c.y = dalloc(sizeof(float) * ntok * D);
        c.scratch_bytes = tdm_gpu_moe_prefill_scratch_bytes(&c.L, ntok, K);
        c.scratch = dalloc(c.scratch_bytes);

        float tp = time_ms(run_prefill, &c);
        float *yp = download(c.y, ntok * D);
        float td = time_ms(run_decode, &c);
        float *yd = download(c.y, ntok * D);
        double num = 0, den = 0;
        for (int64_t i = 0; i < ntok * D; i++) {
            num += ((double)yp[i] - yd[i]) * ((double)yp[i] - yd[i]);
            den += (double)yd[i] * yd[i];
        }
        double rel = den > 0 ? sqrt(num / den) : sqrt(num);
        double flop = 2.0 * ntok * (K + 1) * 3.0 * F * D;
        double tfp = flop / (tp * 1e-3) / 1e12, tfd = flop / (td * 1e-3) / 1e12;
        printf("%6lld %12.3f %10.1f %12.3f %10.1f %7.1fx %10.2e\n", (long long)ntok, tp, tfp, td,
               tfd, td / tp, rel);
        cJSON *r = cJSON_CreateObject();
        cJSON_AddNumberToObject(r, "ntok", (double)ntok);
        cJSON_AddNumberToObject(r, "prefill_ms", tp);
        cJSON_AddNumberToObject(r, "prefill_tflops", tfp);
        cJSON_AddNumberToObject(r, "decode_kernels_ms", td);
        cJSON_AddNumberToObject(r, "decode_kernels_tflops", tfd);
        cJSON_AddNumberToObject(r, "speedup", td / tp);
        cJSON_AddNumberToObject(r, "rel_diff", rel);
        cJSON_AddNumberToObject(r, "scratch_bytes", (double)c.scratch_bytes);
        cJSON_AddItemToArray(rows, r);
        free(hx), free(hw), free(hid), free(yp), free(yd);
        tdm_gpu_release(g, dx), tdm_gpu_release(g, dw), tdm_gpu_release(g, did);
        tdm_gpu_release(g, c.h), tdm_gpu_release(g, c.y), tdm_gpu_release(g, c.scratch);
    }
    cJSON_AddItemToObject(root, "layers", rows);
    const int rc = bench_write_json(root, out);
    tdm_gpu_free(g);
    return rc;
}
