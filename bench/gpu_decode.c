/* gpu_decode: the model fully resident on one GPU (engine/forward_gpu.h):
 * decode tok/s and prompt tok/s (512 and 4096 tokens), each next to the HBM
 * bound for the bytes that pass needs, with the device copy bandwidth
 * measured in the same run through gpu.h. Prints a table; writes JSON
 * (default bench/results/gpu_decode-<host>.json).
 *   gpu_decode (-m MODEL | --synth) [--synth-out FILE] [--gen N] [--out FILE]
 * --synth writes the synthetic Qwen3.5-35B-A3B (Q4_K_M shapes and types,
 * random weights) with tools/synth of the same build directory first (about 20 GB; default
 * /tmp/q35.gguf, kept for the next run: an existing file is reused).
 *
 * Bytes per decoded token: every resident weight except the routed experts
 * (attention / DeltaNet, norms, routers, shared experts, output head) plus
 * k routed experts per MoE layer (gate + up + down); the KV cache read is
 * added per position. Prompt bound: all weights read once per internal batch
 * (512 tokens), a bandwidth-only bound (prompts are compute-bound). Decode is
 * also given against DESIGN.md §5's bound with its latency term: the bytes at
 * the copy bandwidth plus the token's dependent products x one dependent
 * stage, probed on the device in the same run (engine/bench_bound.h). */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "bench_bound.h"
#include "forward_gpu.h"
#include "gpu.h"
#include "model.h"
#include "projection.h"
#include "bench_check.h"
#include "bench_json.h"

static tdm_error err;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static size_t wbytes(const tdm_weight *w) { return w->data ? w->mat_bytes * (size_t)w->n_mat : 0; }

/* Weights read per decoded token (see the header comment) and in total. */
static void model_bytes(const tdm_model *m, double *per_token, double *total)
{
    const tdm_hparams *hp = tdm_model_hparams(m);
    double dense = 0, all = 0;
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const tdm_layer *L = tdm_model_layer(m, il);
        const tdm_weight *ws[] = {&L->attn_norm, &L->post_norm, &L->wq, &L->wk, &L->wv, &L->wo, &L->q_norm,
                                  &L->k_norm, &L->ssm_qkv, &L->ssm_z, &L->ssm_ba, &L->ssm_beta, &L->ssm_alpha,
                                  &L->ssm_conv, &L->ssm_dt, &L->ssm_a, &L->ssm_norm, &L->ssm_out, &L->router,
                                  &L->gate_shexp, &L->up_shexp, &L->down_shexp, &L->shexp_gate, &L->ffn_gate,
                                  &L->ffn_up, &L->ffn_down};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
            dense += (double)wbytes(ws[i]);
        const double ex = (double)wbytes(&L->gate_exps) + wbytes(&L->up_exps) + wbytes(&L->down_exps);
        all += ex;
        if (L->gate_exps.data)
            dense += ex / (double)L->gate_exps.n_mat * hp->n_expert_used;
    }
    dense += (double)wbytes(tdm_model_output_norm(m)) + wbytes(tdm_model_output(m));
    *per_token = dense;
    *total = all + dense; /* routed experts counted in full, dense parts once */
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const tdm_layer *L = tdm_model_layer(m, il);
        if (L->gate_exps.data)
            *total -= ((double)wbytes(&L->gate_exps) + wbytes(&L->up_exps) + wbytes(&L->down_exps)) /
                      (double)L->gate_exps.n_mat * hp->n_expert_used;
    }
}

/* tools/synth of the same build: <BUILD>/bench/gpu_decode -> <BUILD>/tools/synth. */
static void synth_path(const char *argv0, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s", argv0);
    for (int up = 0; up < 2; up++) {
        char *slash = strrchr(buf, '/');
        if (!slash) {
            snprintf(buf, cap, "build");
            break;
        }
        *slash = 0;
    }
    size_t n = strlen(buf);
    snprintf(buf + n, cap - n, "/tools/synth");
}

static int synth(const char *tool, const char *out)
{
    struct stat sb;
    if (stat(out, &sb) == 0 && sb.st_size > 0) {
        printf("reusing %s\n", out);
        return 0;
    }
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "'%s' --preset qwen35-35b-a3b -o '%s'", tool, out);
    printf("%s\n", cmd);
    return system(cmd);
}

int main(int argc, char **argv)
{
    const char *model = NULL, *out = NULL, *synth_out = "/tmp/q35.gguf";
    int gen = 128, do_synth = 0, decode_only = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-m") && v)
            model = v, i++;
        else if (!strcmp(a, "--synth"))
            do_synth = 1;
        else if (!strcmp(a, "--synth-out") && v)
            synth_out = v, i++;
        else if (!strcmp(a, "--gen") && v)
            gen = atoi(v), i++;
        else if (!strcmp(a, "--decode-only")) /* no prompt passes, graphs only: for profilers */
            decode_only = 1;
        else if (!strcmp(a, "--out") && v)
            out = v, i++;
        else {
            fprintf(stderr, "usage: gpu_decode (-m MODEL | --synth) [--synth-out FILE] [--gen N] [--decode-only] [--out FILE]\n");
            return 2;
        }
    }
    if (do_synth) {
        char tool[1024];
        synth_path(argv[0], tool, sizeof tool);
        if (synth(tool, synth_out))
            return 1;
        model = synth_out;
    }
    if (!model || gen < 1) {
        fprintf(stderr, "gpu_decode: -m MODEL or --synth required (and --gen >= 1)\n");
        return 2;
    }
    if (!tdm_gpu_available()) {
        fprintf(stderr, "gpu_decode: no CUDA device\n");
        return 1;
    }
    char host[256] = "unknown", outbuf[512];
    gethostname(host, sizeof host - 1);
    if (!out) {
        snprintf(outbuf, sizeof outbuf, "bench/results/gpu_decode-%s.json", host);
        out = outbuf;
    }
    tdm_model *m;
    CHECK(tdm_model_load(model, &m, &err));
    const tdm_hparams *hp = tdm_model_hparams(m);
    char desc[512];
    tdm_model_describe(m, desc, sizeof desc);
    printf("%s\n", desc);
    const int32_t n_ctx = 4096 + gen + 64;
    double t0 = now();
    tdm_forward_gpu *f;
    CHECK(tdm_forward_gpu_new(m, 0, n_ctx, 512, &f, &err));
    printf("upload: %.1f s, %.2f GiB on the device (%.2f GiB weights)\n", now() - t0,
           tdm_forward_gpu_bytes(f) / 1073741824.0, tdm_forward_gpu_weight_bytes(f) / 1073741824.0);
    tdm_gpu *g = tdm_forward_gpu_context(f);
    tdm_gpu_info info;
    CHECK(tdm_gpu_query(g, &info, &err));
    double bw; /* device-to-device copy GB/s (read + write), median of 7 over 1 GiB */
    CHECK(tdm_bench_vram_gbps(g, 0, 0, &bw, &err));
    double per_tok, total;
    model_bytes(m, &per_tok, &total);
    printf("device %s, copy %.0f GB/s; %.1f MB per decoded token, %.2f GB of weights\n", info.name, bw,
           per_tok / 1e6, total / 1e9);
    /* DESIGN.md §5's latency term: the token's dependent products x one dependent stage */
    tdm_proj_model pm;
    double stage_us;
    CHECK(tdm_proj_model_from_gguf(tdm_model_gguf(m), NULL, &pm, &err));
    CHECK(tdm_bench_stage_us(g, 0, &stage_us, &err));
    const int64_t stages = tdm_bench_token_stages(&pm);
    const double t_lat = stage_us * 1e-6 * (double)stages;
    printf("a dependent stage %.2f us x %lld per token = %.3f ms (t_latency)\n", stage_us, (long long)stages,
           1e3 * t_lat);

    int32_t *tok = malloc((size_t)n_ctx * sizeof(int32_t));
    for (int32_t i = 0; i < n_ctx; i++)
        tok[i] = (int32_t)((i * 7919u + 13u) % (unsigned)(hp->n_vocab > 1000 ? 1000 : hp->n_vocab));
    float *logits = tdm_forward_gpu_host_logits(f); /* page-locked, as a session's */
    const double kv_per_pos = (double)hp->n_attn_layers * 2.0 * hp->n_head_kv * hp->head_dim * 2.0;

    cJSON *root = cJSON_CreateObject(), *rows = cJSON_CreateArray();
    cJSON_AddStringToObject(root, "host", host);
    cJSON_AddStringToObject(root, "device", info.name);
    cJSON_AddStringToObject(root, "model", desc);
    cJSON_AddNumberToObject(root, "copy_gbs", bw);
    cJSON_AddNumberToObject(root, "decode_bytes_per_token", per_tok);
    cJSON_AddNumberToObject(root, "stage_us", stage_us);
    cJSON_AddNumberToObject(root, "stages_per_token", (double)stages);
    cJSON_AddNumberToObject(root, "weight_bytes", total);
    cJSON_AddNumberToObject(root, "timestamp", (double)time(NULL));
    printf("\n%-20s %8s %10s %10s %8s\n", "pass", "tokens", "tok/s", "HBM bound", "ratio");

    /* prompts: 512 and 4096 tokens from an empty state; the first pass of a
     * length after loading ("first": the driver loads each kernel's module at
     * its first launch, cuBLAS picks its kernels), then the same prompt again */
    const int32_t plen[2] = {512, 4096};
    for (int i = 0; i < (decode_only ? 0 : 2); i++) {
        for (int rep = 0; rep < 2; rep++) {
            CHECK(tdm_forward_gpu_reset(f, &err));
            t0 = now();
            CHECK(tdm_forward_gpu_eval(f, tok, plen[i], 0, logits, false, &err));
            const double s = now() - t0, tps = plen[i] / s;
            const double bound = plen[i] / (total * ceil(plen[i] / 512.0) / (bw * 1e9));
            char label[32];
            snprintf(label, sizeof label, "prompt %d%s", plen[i], rep ? "" : " first");
            printf("%-20s %8d %10.1f %10.1f %8.3f\n", label, plen[i], tps, bound, tps / bound);
            cJSON *r = cJSON_CreateObject();
            cJSON_AddStringToObject(r, "pass", rep ? "prompt" : "prompt_first");
            cJSON_AddNumberToObject(r, "tokens", plen[i]);
            cJSON_AddNumberToObject(r, "tok_s", tps);
            cJSON_AddNumberToObject(r, "hbm_bound_tok_s", bound);
            cJSON_AddNumberToObject(r, "ratio", tps / bound);
            cJSON_AddItemToArray(rows, r);
        }
    }
    /* decode after a 512-token prompt: greedy (the choice made on the device
     * and fed back, tdm_forward_gpu_eval_greedy), then the fixed token
     * sequence with the logits downloaded, through CUDA graphs and eagerly;
     * on sm_90+ also with programmatic dependent launch off (the previous
     * version's launches, measured in the same run) */
    static const struct {
        bool graphs, greedy;
        int pdl;
    } variants[] = {{true, true, 0}, {true, false, 0}, {false, false, 0}, {true, false, -1}, {false, false, -1}};
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        const bool graphs = variants[v].graphs, greedy = variants[v].greedy;
        const int pdl = variants[v].pdl;
        if ((decode_only && !graphs) || (pdl < 0 && info.cc_major < 9))
            continue;
        const tdm_gpu_tuning tu = {.pdl = pdl};
        CHECK(tdm_gpu_set_tuning(g, &tu, &err));
        tdm_forward_gpu_set_graphs(f, false); /* drops a graph recorded with the other launches */
        tdm_forward_gpu_set_graphs(f, graphs);
        CHECK(tdm_forward_gpu_reset(f, &err));
        CHECK(tdm_forward_gpu_eval(f, tok, 512, 0, logits, false, &err));
        int32_t next = tok[512];
        for (int i = 0; i < gen + 4; i++) {
            if (i == 4) /* after the warm-up (graph instantiation) */
                t0 = now();
            if (greedy)
                CHECK(tdm_forward_gpu_eval_greedy(f, &next, 1, 512 + i, &next, &err));
            else
                CHECK(tdm_forward_gpu_eval(f, tok + 512 + i, 1, 512 + i, logits, false, &err));
        }
        const double s = now() - t0, tps = gen / s;
        const double bytes = per_tok + kv_per_pos * (512 + 4 + gen / 2.0);
        const double bound = bw * 1e9 / bytes;
        const bool used = graphs && tdm_forward_gpu_graphs(f);
        char label[32];
        snprintf(label, sizeof label, "decode %s%s%s", used ? "graph" : "eager", greedy ? " greedy" : "",
                 pdl < 0 ? " -pdl" : "");
        const double bound_lat = 1 / (bytes / (bw * 1e9) + t_lat);
        printf("%-20s %8d %10.1f %10.1f %8.3f   (%.2f ms/token; %.3f of %.1f with t_latency)\n", label, gen, tps,
               bound, tps / bound, 1e3 * s / gen, tps / bound_lat, bound_lat);
        cJSON *r = cJSON_CreateObject();
        cJSON_AddStringToObject(r, "pass", used ? "decode_graph" : "decode_eager");
        cJSON_AddBoolToObject(r, "greedy", greedy);
        cJSON_AddBoolToObject(r, "pdl", pdl == 0 && info.cc_major >= 9);
        cJSON_AddNumberToObject(r, "tokens", gen);
        cJSON_AddNumberToObject(r, "context", 512);
        cJSON_AddNumberToObject(r, "tok_s", tps);
        cJSON_AddNumberToObject(r, "hbm_bound_tok_s", bound);
        cJSON_AddNumberToObject(r, "ratio", tps / bound);
        cJSON_AddNumberToObject(r, "ms_per_token", 1e3 * s / gen);
        cJSON_AddNumberToObject(r, "latency_bound_tok_s", bound_lat);
        cJSON_AddNumberToObject(r, "latency_ratio", tps / bound_lat);
        cJSON_AddItemToArray(rows, r);
    }
    const tdm_gpu_tuning tu0 = {0};
    CHECK(tdm_gpu_set_tuning(g, &tu0, &err));
    cJSON_AddItemToObject(root, "passes", rows);

    const int rc = bench_write_json(root, out);
    free(tok);
    tdm_forward_gpu_free(f);
    tdm_model_free(m);
    return rc;
}
