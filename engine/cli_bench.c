/* tandem bench: the fixed decode/prefill workload on the engine's current
 * path, reported against the bandwidth bound; --project prints the DDR4/DDR5
 * x VRAM projection instead (engine/projection.h, docs/PROJECTION.md). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "membw.h"
#include "model.h"
#include "projection.h"
#include "session.h"
#include "tokenizer.h"

const char tdm_cli_bench_help[] =
    "benchmark decode and prefill, or project decode tok/s for DDR4/DDR5 and VRAM sizes\n"
    "usage: tandem bench [-m MODEL] [--threads LIST] [--prompt LIST] [--gen N] [--gpu-mem LIST]\n"
    "                    [--membw GBPS] [--efficiency F] [--json FILE] [--plot]\n"
    "       tandem bench --project [-m MODEL | --preset NAME] [projection options]\n"
    "workload (the engine's current path: CPU forward until the hybrid executor lands):\n"
    "  -m MODEL        GGUF file (default: the demo model)\n"
    "  --threads LIST  OpenMP thread counts to run, e.g. 1,2,4 (default: all)\n"
    "  --prompt LIST   prompt lengths in tokens (default 512,4096); text from the tokenizer\n"
    "  --gen N         greedy tokens generated after each prompt (default 256)\n"
    "  --device D      auto|cpu|cuda: where the forward runs (default auto: cuda when a GPU\n"
    "                  is visible; cuda holds the whole model on the GPU, --threads unused)\n"
    "  --gpu-mem LIST  VRAM budgets (GiB) for the projected hybrid bound (default 8,12,16,24)\n"
    "  --membw [GBPS]  host read bandwidth for the bound; without a value (and by default)\n"
    "                  the probe (cpu_experts/membw.h) measures it and prints its table\n"
    "  --no-measure    no probe and no bound unless --membw GBPS\n"
    "  --probe-mib N   probe buffer size (default 1024)\n"
    "  --efficiency F  pool GB/s / probe GB/s for the hybrid projection (default 0.80)\n"
    "  --json FILE     result file (default bench/results/bench-<model>-<UTC time>.json)\n"
    "  --plot          also run bench/plot.sh on the JSON (gnuplot PNG next to it)\n"
    "projection (--project; same as tools/ddr):\n";

/* Original text for the prompts, repeated to the length asked for. */
static const char BENCH_TEXT[] =
    "The harbour office opened at seven, and by eight the clerks had already argued twice about "
    "the tide tables. A freighter from the south was late; its captain radioed that the engine "
    "had lost pressure somewhere past the lighthouse and that he would come in on the afternoon "
    "flood instead. Nobody minded much. The fish market closed early on Thursdays, the ferry ran "
    "every forty minutes, and the new crane at the container quay still had no operator. In the "
    "town above the port, the council met to discuss the budget for the winter: road salt, the "
    "school roof, a second nurse for the clinic, and whether the library could stay open on "
    "Sundays. The mayor read the figures aloud, slowly, and then asked who wanted to speak first. ";

#define MAX_LIST 8

typedef struct bench_opts {
    const char *model, *json;
    int threads[MAX_LIST], n_threads;
    int prompts[MAX_LIST], n_prompts;
    int gen;
    double gpu_mem[MAX_LIST];
    int n_gpu_mem;
    double membw, efficiency;
    bool plot, measure;
    size_t probe_bytes;
    tdm_device device;
} bench_opts;

typedef struct bench_run {
    int threads, prompt;
    double prompt_s, decode_s;
    int decoded;
} bench_run;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int parse_int_list(const char *s, int *out, int lo, int hi)
{
    int32_t ids[MAX_LIST];
    int n = tdm_cli_parse_ids(s, ids, MAX_LIST);
    for (int i = 0; i < n; i++) {
        if (ids[i] < lo || ids[i] > hi)
            return -1;
        out[i] = ids[i];
    }
    return n;
}

static int parse_gib_list(const char *s, double *out)
{
    int n = 0;
    char buf[256], *save;
    snprintf(buf, sizeof buf, "%s", s);
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char *end;
        double v = strtod(t, &end);
        if (n >= MAX_LIST || end == t || *end || !(v > 0 && v <= 4096))
            return -1;
        out[n++] = v;
    }
    return n;
}

static int parse_args(int argc, char **argv, bench_opts *o)
{
    const char *bad_arg = "";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (!strcmp(a, "--plot") || !strcmp(a, "--no-measure")) {
            o->plot |= !strcmp(a, "--plot");
            o->measure &= !!strcmp(a, "--no-measure");
            continue;
        }
        if (!strcmp(a, "--membw") && (!v || strtod(v, &end) == 0 || end == v)) {
            o->measure = true; /* no value: run the probe */
            continue;
        }
        if (!v) {
            bad_arg = a;
            goto bad;
        }
        i++;
        if (!strcmp(a, "-m"))
            o->model = v;
        else if (!strcmp(a, "--json"))
            o->json = v;
        else if (!strcmp(a, "--device")) {
            if (!tdm_device_parse(v, &o->device)) {
                fprintf(stderr, "tandem bench: bad value for --device: %s (auto, cpu or cuda)\n", v);
                return 2;
            }
        }
        else if (!strcmp(a, "--threads"))
            o->n_threads = parse_int_list(v, o->threads, 1, 4096);
        else if (!strcmp(a, "--prompt"))
            o->n_prompts = parse_int_list(v, o->prompts, 1, 1 << 20);
        else if (!strcmp(a, "--gpu-mem"))
            o->n_gpu_mem = parse_gib_list(v, o->gpu_mem);
        else if (!strcmp(a, "--gen")) {
            long g = strtol(v, &end, 10);
            o->gen = (*end || g < 1 || g > 1 << 20) ? -1 : (int)g;
        } else if (!strcmp(a, "--membw")) {
            o->membw = strtod(v, &end);
            if (*end || !(o->membw > 0))
                o->membw = -1;
        } else if (!strcmp(a, "--probe-mib")) {
            long mib = strtol(v, &end, 10);
            if (*end || mib < 1 || mib > 1 << 20)
                o->membw = -1;
            o->probe_bytes = (size_t)mib << 20;
        } else if (!strcmp(a, "--efficiency")) {
            o->efficiency = strtod(v, &end);
            if (*end || !(o->efficiency > 0 && o->efficiency <= 1.5))
                o->efficiency = -1;
        } else {
            bad_arg = a;
            goto bad;
        }
        if (o->n_threads < 0 || o->n_prompts < 0 || o->n_gpu_mem < 0 || o->gen < 0 || o->membw < 0 ||
            o->efficiency < 0) {
            fprintf(stderr, "tandem bench: bad value for %s: %s\n", a, v);
            return 2;
        }
    }
    return 0;
bad:
    fprintf(stderr, "tandem bench: unexpected or incomplete argument '%s' (see tandem bench --help)\n",
            bad_arg);
    return 2;
}

/* Prompt ids: the text tokenised and cut to n; synthetic ids if the vocabulary refuses. */
static tdm_status make_prompt(const tdm_tokenizer *tk, int32_t n_vocab, int32_t *ids, int n,
                              bool *synthetic, tdm_error *err)
{
    size_t tlen = strlen(BENCH_TEXT), n_ids = 0, reps = 1;
    tdm_status st = tdm_tokenizer_encode(tk, BENCH_TEXT, tlen, 0, NULL, 0, &n_ids, err);
    if ((st == TDM_OK || st == TDM_ERR_INVALID) && n_ids > 8)
        reps = (size_t)n / n_ids + 1;
    size_t len = tlen * reps;
    char *text = malloc(len + 1);
    int32_t *all = malloc(tdm_tokenizer_encode_bound(len) * sizeof *all);
    st = text && all ? TDM_OK : tdm_error_set(err, TDM_ERR_OOM, "bench prompt");
    for (size_t r = 0; !st && r < reps; r++)
        memcpy(text + r * tlen, BENCH_TEXT, tlen);
    if (!st)
        st = tdm_tokenizer_encode(tk, text, len, 0, all, tdm_tokenizer_encode_bound(len), &n_ids, err);
    *synthetic = st != TDM_OK || n_ids < (size_t)n;
    for (int i = 0; i < n; i++) /* synthetic: a fixed stride through the vocabulary */
        ids[i] = *synthetic ? (int32_t)((1000 + 7919ll * i) % (n_vocab > 256 ? n_vocab - 256 : n_vocab))
                            : all[i];
    free(text);
    free(all);
    return st == TDM_ERR_OOM ? st : TDM_OK;
}

static int32_t argmax(const float *x, int32_t n)
{
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

/* One prompt + greedy decode on a reset session. */
static tdm_status run_one(tdm_session *s, int32_t n_vocab, const int32_t *prompt, int n, int gen,
                          bench_run *r, tdm_error *err)
{
    tdm_session_reset(s);
    double t0 = now_s();
    tdm_status st = tdm_session_eval(s, prompt, n, NULL, err);
    if (st)
        return st;
    double t1 = now_s();
    int32_t tok = argmax(tdm_session_logits(s), n_vocab);
    for (r->decoded = 0; r->decoded < gen; r->decoded++) {
        if ((st = tdm_session_eval(s, &tok, 1, NULL, err)))
            return st;
        tok = argmax(tdm_session_logits(s), n_vocab);
    }
    r->prompt_s = t1 - t0;
    r->decode_s = now_s() - t1;
    return TDM_OK;
}

/* What the bound needs: bytes per token on the CPU path and the hybrid grid. */
typedef struct bench_ctx {
    const bench_opts *o;
    const char *model_name;
    tdm_proj_model pm;
    tdm_proj_hitcurve hc;
    tdm_proj_grid grid; /* one DRAM row (membw) x the --gpu-mem budgets */
    bool have_grid;
    bool synthetic;
    bool measured;      /* membw comes from the probe */
    double membw;       /* host read GB/s for the bound (0: none) */
    tdm_proj_host host;
    bench_run runs[MAX_LIST * MAX_LIST];
    int n_runs;
} bench_ctx;

/* Bytes a decoded token reads on the CPU path: every weight from host RAM,
 * the KV cache at the run's mean decode position (the CPU forward keeps K and
 * V in f32: twice the f16 accounting) and the DeltaNet state read + written. */
static double cpu_path_bytes(const bench_ctx *c, const bench_run *r)
{
    double ctx = r->prompt + r->decoded / 2.0;
    return (double)(c->pm.active_expert_bytes + tdm_proj_dense_bytes(&c->pm)) +
           2.0 * (double)c->pm.kv_bytes_per_ctx * ctx + 2.0 * (double)c->pm.state_bytes;
}

static double cpu_path_bound(const bench_ctx *c, const bench_run *r)
{
    return c->membw > 0 ? c->membw * 1e9 / cpu_path_bytes(c, r) : 0;
}

static tdm_status setup_projection(bench_ctx *c, const tdm_gguf *g, tdm_error *err)
{
    tdm_status st = tdm_proj_model_from_gguf(g, c->model_name, &c->pm, err);
    if (st)
        return st;
    return tdm_proj_hitcurve_zipf(TDM_PROJ_DEFAULT_ZIPF_S, c->pm.n_expert, &c->hc, err);
}

/* After the workload: the probe pins threads, which must not change the runs. */
static tdm_status setup_bound(bench_ctx *c, tdm_error *err)
{
    tdm_status st;
    if (c->o->measure && !(c->o->membw > 0)) {
        if ((st = tdm_proj_measure_host(c->o->probe_bytes, &c->host, err)))
            return st;
        c->measured = true;
        c->membw = c->host.read_gbps;
        tdm_proj_host_print(stdout, &c->host);
    }
    if (!(c->membw > 0))
        return TDM_OK;
    tdm_proj_grid *gr = &c->grid;
    tdm_proj_grid_default(&c->pm, gr);
    gr->n_dram = 0;
    if ((st = tdm_proj_grid_add_dram(gr, c->measured ? "this host (probe)" : "measured", c->membw,
                                     true, err)))
        return st;
    if (c->measured && !(c->o->efficiency > 0))
        gr->dram[0].efficiency = c->host.efficiency;
    gr->n_vram = c->o->n_gpu_mem;
    memcpy(gr->vram_gib, c->o->gpu_mem, sizeof c->o->gpu_mem);
    if (c->o->efficiency > 0) {
        gr->base.efficiency = c->o->efficiency;
        snprintf(gr->efficiency_source, sizeof gr->efficiency_source, "user");
    }
    c->have_grid = true;
    return tdm_proj_grid_run(&c->pm, &c->hc, gr, err);
}

static void print_report(const bench_ctx *c)
{
    printf("\n%-7s %7s %12s %12s %8s %10s %10s %11s %9s %11s %8s\n", "threads", "prompt",
           "prompt tok/s", "decode tok/s", "hit rate", "cpu ms/tok", "gpu ms/tok", "wait ms/tok",
           "pool GB/s", "bound tok/s", "of bound");
    for (int i = 0; i < c->n_runs; i++) {
        const bench_run *r = &c->runs[i];
        double dec = r->decoded / r->decode_s, bound = cpu_path_bound(c, r);
        printf("%-7d %7d %12.1f %12.2f %8s %10s %10s %11s %9s ", r->threads, r->prompt,
               r->prompt / r->prompt_s, dec, "n/a", "n/a", "n/a", "n/a", "n/a");
        if (bound > 0)
            printf("%11.2f %7.1f%%\n", bound, 100 * dec / bound);
        else
            printf("%11s %8s\n", "n/a", "n/a");
    }
    printf("(CPU path: bound = host read GB/s / bytes per token: %.4f GB of weights + f32 KV at the "
           "mean position + DeltaNet state%s; hit rate, CPU/GPU/wait ms and pool GB/s come with the "
           "hybrid executor)\n",
           (c->pm.active_expert_bytes + tdm_proj_dense_bytes(&c->pm)) / 1e9,
           c->membw > 0 ? "" : "; --membw GBPS or the probe gives it");
    if (c->have_grid) {
        double eff = c->grid.dram[0].efficiency > 0 ? c->grid.dram[0].efficiency : c->grid.base.efficiency;
        printf("\nhybrid projection with %.1f GB/s host, efficiency %.2f, %s:\n", c->membw, eff,
               c->hc.source);
        for (int v = 0; v < c->grid.n_vram; v++)
            printf("  --gpu-mem %5.1f GiB: %8.1f tok/s projected (%s, hit %.1f%%), measured n/a\n",
                   c->grid.vram_gib[v], c->grid.points[v].tok_s,
                   tdm_proj_bound_name(c->grid.points[v].bound), 100 * c->grid.points[v].hit_rate);
    }
}

static void add_num_or_null(cJSON *o, const char *k, double v, bool have)
{
    if (have)
        cJSON_AddNumberToObject(o, k, v);
    else
        cJSON_AddNullToObject(o, k);
}

static cJSON *report_json(const bench_ctx *c)
{
    const bench_opts *o = c->o;
    cJSON *root = cJSON_CreateObject(), *a;
    cJSON_AddStringToObject(root, "format", "tandem-bench");
    cJSON_AddNumberToObject(root, "version", 1);
    cJSON *m = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(m, "name", c->model_name);
    cJSON_AddStringToObject(m, "path", o->model);
    cJSON_AddStringToObject(m, "arch", c->pm.arch);
    cJSON_AddNumberToObject(m, "active_expert_bytes_per_token", (double)c->pm.active_expert_bytes);
    cJSON_AddNumberToObject(m, "dense_bytes_per_token", (double)tdm_proj_dense_bytes(&c->pm));
    cJSON *h = cJSON_AddObjectToObject(root, "host");
    add_num_or_null(h, "membw_gbps", c->membw, c->membw > 0);
    cJSON_AddStringToObject(h, "membw_source", c->measured ? "probe" : c->membw > 0 ? "user" : "none");
    if (c->measured) {
        cJSON *pr = cJSON_AddObjectToObject(h, "probe");
        cJSON_AddNumberToObject(pr, "threads", c->host.threads);
        cJSON_AddNumberToObject(pr, "bytes", (double)c->host.bytes);
        cJSON_AddNumberToObject(pr, "read_gbps", c->host.read_gbps);
        cJSON_AddNumberToObject(pr, "copy_gbps", c->host.copy_gbps);
        cJSON_AddNumberToObject(pr, "triad_gbps", c->host.triad_gbps);
        cJSON_AddNumberToObject(pr, "matvec_q4k_gbps", c->host.matvec_gbps);
        cJSON_AddNumberToObject(pr, "efficiency", c->host.efficiency);
    }
    cJSON_AddNumberToObject(h, "physical_cores", tdm_membw_physical_cores());
    cJSON_AddStringToObject(root, "engine_path", "cpu");
    cJSON *w = cJSON_AddObjectToObject(root, "workload");
    a = cJSON_AddArrayToObject(w, "prompt_tokens");
    for (int i = 0; i < o->n_prompts; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(o->prompts[i]));
    cJSON_AddNumberToObject(w, "gen_tokens", o->gen);
    cJSON_AddBoolToObject(w, "greedy", true);
    cJSON_AddStringToObject(w, "prompt_source", c->synthetic ? "synthetic" : "text");
    cJSON *runs = cJSON_AddArrayToObject(root, "runs");
    for (int i = 0; i < c->n_runs; i++) {
        const bench_run *r = &c->runs[i];
        cJSON *x = cJSON_CreateObject();
        double dec = r->decoded / r->decode_s, bound = cpu_path_bound(c, r);
        cJSON_AddNumberToObject(x, "threads", r->threads);
        cJSON_AddNumberToObject(x, "prompt_tokens", r->prompt);
        cJSON_AddNumberToObject(x, "gen_tokens", r->decoded);
        cJSON_AddNumberToObject(x, "prompt_s", r->prompt_s);
        cJSON_AddNumberToObject(x, "decode_s", r->decode_s);
        cJSON_AddNumberToObject(x, "prompt_tok_s", r->prompt / r->prompt_s);
        cJSON_AddNumberToObject(x, "decode_tok_s", dec);
        static const char *const later[] = {"hit_rate", "cpu_ms_per_token", "gpu_ms_per_token",
                                            "wait_ms_per_token", "pool_gbps"};
        for (int k = 0; k < 5; k++) /* the hybrid executor fills these */
            cJSON_AddNullToObject(x, later[k]);
        cJSON_AddNumberToObject(x, "bytes_per_token", cpu_path_bytes(c, r));
        add_num_or_null(x, "bound_tok_s", bound, bound > 0);
        cJSON_AddStringToObject(x, "bound", "cpu-dram");
        add_num_or_null(x, "fraction_of_bound", dec / bound, bound > 0);
        cJSON_AddItemToArray(runs, x);
    }
    cJSON *vr = cJSON_AddArrayToObject(root, "vram");
    for (int v = 0; c->have_grid && v < c->grid.n_vram; v++) {
        const tdm_proj_point *p = &c->grid.points[v];
        cJSON *x = cJSON_CreateObject();
        cJSON_AddNumberToObject(x, "gpu_mem_gib", c->grid.vram_gib[v]);
        cJSON_AddNumberToObject(x, "projected_tok_s", p->tok_s);
        cJSON_AddStringToObject(x, "bound", tdm_proj_bound_name(p->bound));
        cJSON_AddNumberToObject(x, "hit_rate", p->hit_rate);
        cJSON_AddNullToObject(x, "measured_tok_s");
        cJSON_AddNullToObject(x, "rel_error");
        cJSON_AddItemToArray(vr, x);
    }
    if (c->have_grid) {
        char *pj = tdm_proj_json(&c->pm, &c->hc, &c->grid);
        cJSON *pp = pj ? cJSON_Parse(pj) : NULL;
        free(pj);
        if (pp)
            cJSON_AddItemToObject(root, "projection", pp);
    }
    return root;
}

static tdm_status write_report(const bench_ctx *c, const char *path, tdm_error *err)
{
    cJSON *root = report_json(c);
    char *s = root ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!s)
        return tdm_error_set(err, TDM_ERR_OOM, "bench JSON");
    FILE *f = fopen(path, "w");
    bool ok = f && fputs(s, f) >= 0 && fputc('\n', f) != EOF;
    if (f)
        ok = fclose(f) == 0 && ok;
    free(s);
    return ok ? TDM_OK : tdm_error_set(err, TDM_ERR_IO, "%s: %s", path, strerror(errno));
}

static tdm_status run_workload(bench_ctx *c, tdm_model *model, tdm_error *err)
{
    const bench_opts *o = c->o;
    const tdm_hparams *hp = tdm_model_hparams(model);
    int maxp = 0;
    for (int i = 0; i < o->n_prompts; i++)
        maxp = o->prompts[i] > maxp ? o->prompts[i] : maxp;
    tdm_tokenizer *tk = NULL;
    tdm_session *s = NULL;
    int32_t *ids = malloc((size_t)maxp * sizeof *ids);
    tdm_status st = ids ? tdm_tokenizer_load(tdm_model_gguf(model), &tk, err)
                        : tdm_error_set(err, TDM_ERR_OOM, "prompt ids");
    if (!st)
        st = make_prompt(tk, hp->n_vocab, ids, maxp, &c->synthetic, err);
    int max_thr = 1;
    for (int t = 0; t < o->n_threads; t++)
        max_thr = o->threads[t] > max_thr ? o->threads[t] : max_thr;
    omp_set_num_threads(max_thr); /* the forward sizes its per-thread scratch at creation */
    if (!st)
        st = tdm_session_new_device(model, maxp + o->gen, o->device, &s, err);
    if (!st)
        fprintf(stderr, "bench: forward on %s\n", tdm_device_name(tdm_session_device(s)));
    for (int t = 0; !st && t < o->n_threads; t++)
        for (int p = 0; !st && p < o->n_prompts; p++) {
            bench_run *r = &c->runs[c->n_runs];
            *r = (bench_run){.threads = o->threads[t], .prompt = o->prompts[p]};
            omp_set_num_threads(r->threads);
            fprintf(stderr, "bench: %d threads, prompt %d, %d generated ...\n", r->threads, r->prompt,
                    o->gen);
            if (!(st = run_one(s, hp->n_vocab, ids, r->prompt, o->gen, r, err)))
                c->n_runs++;
        }
    tdm_session_free(s);
    tdm_tokenizer_free(tk);
    free(ids);
    return st;
}

static void default_json_path(const bench_ctx *c, char *out, size_t cap)
{
    char base[128];
    snprintf(base, sizeof base, "%s", c->model_name);
    char *dot = strstr(base, ".gguf");
    if (dot)
        *dot = '\0';
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    char stamp[32];
    strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &tm);
    FILE *probe = fopen("bench/results/.probe", "a");
    if (probe) {
        fclose(probe);
        remove("bench/results/.probe");
    }
    snprintf(out, cap, "%sbench-%s-%s.json", probe ? "bench/results/" : "", base, stamp);
}

int tdm_cli_bench(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--project"))
            return tdm_proj_cli_run(argc, argv, "tandem bench --project", tdm_cli_default_model(),
                                    true);
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("%s%s", tdm_cli_bench_help, tdm_proj_cli_usage);
            return 0;
        }
    bench_opts o;
    o = (bench_opts){.prompts = {512, 4096}, .n_prompts = 2, .gen = 256, .n_gpu_mem = 4,
                     .gpu_mem = {8, 12, 16, 24}, .measure = true};
    o.threads[0] = omp_get_max_threads();
    o.n_threads = 1;
    int rc = parse_args(argc, argv, &o);
    if (rc)
        return rc;
    if (!o.model)
        o.model = tdm_cli_default_model();
    bench_ctx c;
    memset(&c, 0, sizeof c);
    c.o = &o;
    c.membw = o.membw > 0 ? o.membw : 0;
    const char *slash = strrchr(o.model, '/');
    c.model_name = slash ? slash + 1 : o.model;
    tdm_error err = {0};
    tdm_model *model = NULL;
    char path[1024];
    tdm_status st = tdm_model_load(o.model, &model, &err);
    if (!st)
        st = setup_projection(&c, tdm_model_gguf(model), &err);
    if (!st) {
        printf("tandem bench: %s (%s), engine path: CPU forward, prompts", c.model_name, c.pm.arch);
        for (int i = 0; i < o.n_prompts; i++)
            printf(" %d", o.prompts[i]);
        printf(", %d greedy tokens\n", o.gen);
        st = run_workload(&c, model, &err);
    }
    if (!st)
        st = setup_bound(&c, &err);
    if (!st) {
        print_report(&c);
        if (o.json)
            snprintf(path, sizeof path, "%s", o.json);
        else
            default_json_path(&c, path, sizeof path);
        if (!(st = write_report(&c, path, &err)))
            printf("wrote %s\n", path);
    }
    tdm_model_free(model);
    if (st) {
        fprintf(stderr, "tandem bench: %s\n", err.msg);
        return 1;
    }
    if (o.plot) {
        char cmd[1200];
        snprintf(cmd, sizeof cmd, "bash bench/plot.sh '%s'", path);
        if (system(cmd) != 0) {
            fprintf(stderr, "tandem bench: bench/plot.sh failed (run from the repository root)\n");
            return 1;
        }
    }
    return 0;
}
