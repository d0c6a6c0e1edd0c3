/* bench/cpu_decode: prompt and decode tok/s of the CPU-only forward on the demo
 * model and small-qwen35moe Q4_K_M at 1, 2 and all threads. Prints a table and
 * writes bench/results/cpu_decode-<hostname>.json.
 *   build/bench/cpu_decode [--prompt N] [--decode N] [--threads N] [MODEL.gguf ...]
 * Effective bandwidth = weight bytes one decoded token reads / time per token. */
#include <cjson/cJSON.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "forward.h"
#include "kernels.h"
#include "model.h"
#include "session.h"
#include "bench_json.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double wbytes(const tdm_weight *w)
{
    return w->data ? (double)w->mat_bytes : 0.0;
}

/* Weight bytes read per decoded token: dense parts + k experts + shared + head. */
static double active_bytes(const tdm_model *m)
{
    const tdm_hparams *hp = tdm_model_hparams(m);
    double b = wbytes(tdm_model_output(m)) + (double)tdm_model_tok_embd(m)->row_bytes;
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const tdm_layer *L = tdm_model_layer(m, il);
        const tdm_weight *dense[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->ssm_qkv, &L->ssm_z, &L->ssm_ba,
                                     &L->ssm_beta, &L->ssm_alpha, &L->ssm_out, &L->router, &L->gate_shexp,
                                     &L->up_shexp, &L->down_shexp, &L->shexp_gate, &L->ffn_gate, &L->ffn_up,
                                     &L->ffn_down};
        for (size_t i = 0; i < sizeof dense / sizeof *dense; i++)
            b += wbytes(dense[i]);
        if (L->ffn == TDM_FFN_MOE)
            b += hp->n_expert_used * (wbytes(&L->gate_exps) + wbytes(&L->up_exps) + wbytes(&L->down_exps));
    }
    return b;
}

typedef struct result {
    int threads;
    double prompt_tps, decode_tps;
} result;

static int run(const tdm_model *m, int threads, int n_prompt, int n_decode, result *r)
{
    omp_set_num_threads(threads);
    const tdm_hparams *hp = tdm_model_hparams(m);
    tdm_session *s;
    tdm_error err = {0};
    if (tdm_session_new((tdm_model *)m, n_prompt + n_decode + 8, &s, &err)) {
        fprintf(stderr, "session: %s\n", err.msg);
        return 1;
    }
    int32_t *ids = malloc(sizeof(int32_t) * n_prompt);
    for (int i = 0; i < n_prompt; i++)
        ids[i] = (int32_t)((i * 7919 + 13) % (hp->n_vocab > 2000 ? 2000 : hp->n_vocab));
    /* warm-up: page in the weights */
    tdm_session_eval(s, ids, n_prompt < 16 ? n_prompt : 16, NULL, &err);
    tdm_session_reset(s);
    double t0 = now();
    if (tdm_session_eval(s, ids, n_prompt, NULL, &err)) {
        fprintf(stderr, "eval: %s\n", err.msg);
        return 1;
    }
    double t1 = now();
    for (int i = 0; i < n_decode; i++) {
        const float *l = tdm_session_logits(s);
        int32_t best = 0;
        for (int32_t v = 1; v < hp->n_vocab; v++)
            if (l[v] > l[best])
                best = v;
        if (tdm_session_eval(s, &best, 1, NULL, &err)) {
            fprintf(stderr, "decode: %s\n", err.msg);
            return 1;
        }
    }
    double t2 = now();
    r->threads = threads;
    r->prompt_tps = n_prompt / (t1 - t0);
    r->decode_tps = n_decode / (t2 - t1);
    free(ids);
    tdm_session_free(s);
    return 0;
}

int main(int argc, char **argv)
{
    int n_prompt = 128, n_decode = 64, only_threads = 0;
    const char *models[8];
    int n_models = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--prompt") && i + 1 < argc)
            n_prompt = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--decode") && i + 1 < argc)
            n_decode = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            only_threads = atoi(argv[++i]);
        else if (n_models < 8)
            models[n_models++] = argv[i];
    }
    if (n_prompt <= 0 || n_decode <= 0) {
        fprintf(stderr, "usage: cpu_decode [--prompt N] [--decode N] [MODEL.gguf ...]\n");
        return 2;
    }
    if (!n_models) {
        models[n_models++] = "models/demo/demo-Q4_K_M.gguf";
        models[n_models++] = "tests/fixtures/small-qwen35moe/small-qwen35moe-Q4_K_M.gguf";
    }
    const int all = omp_get_num_procs();
    int counts[3] = {1, 2, all}, n_counts = all > 2 ? 3 : all;
    if (only_threads > 0)
        counts[0] = only_threads, n_counts = 1;
    char host[256] = "unknown";
    gethostname(host, sizeof host - 1);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "host", host);
    cJSON_AddStringToObject(root, "isa", tdm_cpu_isa_name(tdm_cpu_isa_active()));
    cJSON_AddNumberToObject(root, "cpus", all);
    const char *wp = getenv("OMP_WAIT_POLICY");
    cJSON_AddStringToObject(root, "omp_wait_policy", wp ? wp : "default");
    double load[1] = {0};
    if (getloadavg(load, 1) == 1)
        cJSON_AddNumberToObject(root, "load_average_1min", load[0]);
    cJSON_AddNumberToObject(root, "prompt_tokens", n_prompt);
    cJSON_AddNumberToObject(root, "decode_tokens", n_decode);
    cJSON *arr = cJSON_AddArrayToObject(root, "results");
    printf("cpu_decode on %s (%d CPUs, ISA %s, OMP_WAIT_POLICY %s, load %.1f), prompt %d tokens, decode %d tokens\n",
           host, all, tdm_cpu_isa_name(tdm_cpu_isa_active()), wp ? wp : "default", load[0], n_prompt, n_decode);
    printf("%-44s %7s %12s %12s %12s\n", "model", "threads", "prompt tok/s", "decode tok/s", "decode GB/s");
    for (int mi = 0; mi < n_models; mi++) {
        tdm_model *m;
        tdm_error err = {0};
        if (tdm_model_load(models[mi], &m, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        const double bytes = active_bytes(m);
        const char *base = strrchr(models[mi], '/') ? strrchr(models[mi], '/') + 1 : models[mi];
        for (int ci = 0; ci < n_counts; ci++) {
            result r;
            if (run(m, counts[ci], n_prompt, n_decode, &r))
                return 1;
            printf("%-44s %7d %12.1f %12.1f %12.2f\n", base, r.threads, r.prompt_tps, r.decode_tps,
                   bytes * r.decode_tps / 1e9);
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "model", base);
            cJSON_AddNumberToObject(o, "threads", r.threads);
            cJSON_AddNumberToObject(o, "prompt_tok_s", r.prompt_tps);
            cJSON_AddNumberToObject(o, "decode_tok_s", r.decode_tps);
            cJSON_AddNumberToObject(o, "active_bytes_per_token", bytes);
            cJSON_AddNumberToObject(o, "decode_gb_s", bytes * r.decode_tps / 1e9);
            cJSON_AddItemToArray(arr, o);
        }
        tdm_model_free(m);
    }
    mkdir("bench/results", 0755);
    char path[512];
    snprintf(path, sizeof path, "bench/results/cpu_decode-%s.json", host);
    return bench_write_json(root, path);
}
