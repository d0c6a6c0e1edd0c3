/* tandem bench: the fixed prefill/decode workload on the engine's path, each
 * speed next to the bandwidth bound of DESIGN.md §5 measured in the same run.
 * With a GPU (--device cuda, or auto with one visible) every point of the
 * --gpu-mem x --threads x --fill grid is a hybrid session (VRAM expert cache +
 * CPU pool), reported with its decode-phase executor counters and the
 * projection of engine/projection.h (validation); without one, the CPU
 * forward per thread count. --project prints the DDR4/DDR5 x VRAM projection
 * instead. Options, JSON schema and formulas: docs/BENCH.md. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_bound.h"
#include "cli.h"
#include "gpu.h"
#include "membw.h"
#include "model.h"
#include "projection.h"
#include "session.h"
#include "tokenizer.h"
#include "topology.h"

const char tdm_cli_bench_help[] =
    "benchmark prefill and decode against the bandwidth bound, or project decode tok/s\n"
    "usage: tandem bench [-m MODEL] [--device D] [--threads LIST] [--prompt LIST] [--gen N]\n"
    "                    [--gpu-mem LIST] [--fill LIST] [--profile P.json] [--validate]\n"
    "                    [--hit-curve F | --zipf S] [--membw [GBPS]] [--json FILE] [--plot]\n"
    "       tandem bench --revalidate FILE.json [-m MODEL | --preset NAME] [--vram-efficiency F]\n"
    "                    [--efficiency F] [--hit-curve F | --zipf S]\n"
    "       tandem bench --project [-m MODEL | --preset NAME] [projection options]\n"
    "workload: each prompt length (greedy, text from the tokenizer), then --gen decoded tokens.\n"
    "With a GPU, one hybrid session (VRAM expert cache + CPU pool) per --gpu-mem x --threads x\n"
    "--fill point, counters over the decode phase; without one, the CPU forward per thread count.\n"
    "  -m MODEL          GGUF file (default: the demo model)\n"
    "  --device D        auto|cpu|cuda (default auto: cuda, i.e. hybrid, when a GPU is visible)\n"
    "  --threads LIST    CPU: OpenMP threads, e.g. 1,2,4 (default: all); hybrid: CPU pool\n"
    "                    threads (default: physical cores - 1)\n"
    "  --prompt LIST     prompt lengths in tokens (default 512,4096)\n"
    "  --gen N           greedy tokens generated after each prompt (default 256)\n"
    "  --gpu-mem LIST    VRAM budgets in GiB, G suffix allowed (default 8,12,16,24): the hybrid\n"
    "                    grid, or the projected budgets of the CPU path\n"
    "  --fill LIST       hybrid cache fill: layer,profile,adaptive (default layer, profile with\n"
    "                    --profile); profile and adaptive need --profile\n"
    "  --profile P.json  expert profile (tandem profile) for the profile and adaptive fills\n"
    "  --adapt-every N   tokens between adaptive swaps (default: the policy's)\n"
    "  --validate        hybrid: print projected against measured decode tok/s per point\n"
    "  --hit-curve F     hit-rate curve of the projection (a profile, cachesim JSON or CSV, as\n"
    "                    --project); default Zipf (--zipf S, 0.5); the layer fill is projected\n"
    "                    with h = cached fraction (whole layers cached)\n"
    "  --membw [GBPS]    host read GB/s for the bound; without a value (and by default) the\n"
    "                    probe measures it (hybrid: per pool thread count, pinned as the pool)\n"
    "  --no-measure      no probe and no bound unless --membw GBPS\n"
    "  --probe-mib N     probe buffer size (default 1024)\n"
    "  --efficiency F    pool GB/s / probe GB/s of the projection (default: CPU path 0.80 or the\n"
    "                    probe's matvec rate; hybrid: the pool's decode GB/s at the largest\n"
    "                    thread count over the probe's read GB/s there)\n"
    "  --vram-efficiency F  fraction of the device copy GB/s the GPU side of the projection\n"
    "                    reaches (--validate: default 1; --revalidate: default as recorded)\n"
    "  --revalidate FILE.json  no workload: the projection of every run of a hybrid --validate\n"
    "                    JSON recomputed with the current model, against its measured decode;\n"
    "                    the model from -m, else the recorded path when it exists, else\n"
    "                    --preset NAME or the preset matching the recorded accounting\n"
    "  --json FILE       result file (default bench/results/bench-<model>-<UTC time>.json)\n"
    "  --plot            also run bench/plot.sh on the JSON (PNGs next to it; skipped with a\n"
    "                    warning when gnuplot is missing)\n"
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
#define MAX_RUNS 256
#define PLOT_NO_GNUPLOT 3 /* bench/plot.sh's exit status when gnuplot or python3 is missing */

/* Cache fills of the hybrid grid and the policy each one runs. */
typedef enum bench_fill { FILL_LAYER = 0, FILL_PROFILE, FILL_ADAPTIVE, FILL_COUNT } bench_fill;
static const char *const FILL_NAME[FILL_COUNT] = {"layer", "profile", "adaptive"};
static const int FILL_POLICY[FILL_COUNT] = {TDM_CACHE_LAYER, TDM_CACHE_STATIC, TDM_CACHE_ADAPTIVE};

typedef struct bench_opts {
    const char *model, *json, *profile, *hit_curve;
    const char *revalidate, *preset; /* --revalidate FILE.json and its model preset */
    int threads[MAX_LIST], n_threads;
    int prompts[MAX_LIST], n_prompts;
    int gen;
    double gpu_mem[MAX_LIST];
    int n_gpu_mem;
    int fills[FILL_COUNT], n_fills; /* bench_fill */
    bool fill_given;                /* --fill (else the default fill) */
    int32_t adapt_every;
    double membw, efficiency, zipf; /* zipf < 0: the projection default */
    double vram_eff;                /* 0: the default of the mode */
    bool plot, measure, validate;
    size_t probe_bytes;
    tdm_device device;
} bench_opts;

typedef struct bench_run {
    int threads, prompt;
    double prompt_s, decode_s;
    int decoded;
    /* hybrid only */
    double gpu_mem_gib;
    int fill;                   /* bench_fill; -1 on the CPU path */
    tdm_executor_stats dec;     /* counters over the decode phase (after - before) */
    double hit;                 /* measured decode hit rate (from dec, or as recorded) */
    /* filled after the workload */
    double dram_gbps;           /* B_dram at this thread count (0: none) */
    double cpu_bytes, gpu_bytes; /* per decoded token */
    tdm_bench_bound bound;
    tdm_proj_point proj;        /* hybrid: the projection of this point */
    bool have_proj;
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

/* "8,12.5,16G": GiB, an optional G suffix on each. */
static int parse_gib_list(const char *s, double *out)
{
    int n = 0;
    char buf[256], *save;
    snprintf(buf, sizeof buf, "%s", s);
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char *end;
        double v = strtod(t, &end);
        if (*end == 'G' || *end == 'g')
            end++;
        if (n >= MAX_LIST || end == t || *end || !(v > 0 && v <= 4096))
            return -1;
        out[n++] = v;
    }
    return n;
}

static int parse_fill_list(const char *s, int *out)
{
    int n = 0;
    char buf[128], *save;
    snprintf(buf, sizeof buf, "%s", s);
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int f = 0;
        while (f < FILL_COUNT && strcmp(t, FILL_NAME[f]))
            f++;
        if (f == FILL_COUNT || n == FILL_COUNT)
            return -1;
        out[n++] = f;
    }
    return n ? n : -1;
}

/* One option with a value; false for an unknown option, *bad for a bad value. */
static bool parse_value(bench_opts *o, const char *a, const char *v, bool *bad)
{
    long l = 0;
    if (!strcmp(a, "-m"))
        o->model = v;
    else if (!strcmp(a, "--json"))
        o->json = v;
    else if (!strcmp(a, "--profile"))
        o->profile = v;
    else if (!strcmp(a, "--hit-curve"))
        o->hit_curve = v;
    else if (!strcmp(a, "--revalidate"))
        o->revalidate = v;
    else if (!strcmp(a, "--preset"))
        o->preset = v;
    else if (!strcmp(a, "--vram-efficiency"))
        *bad = !tdm_cli_parse_double(v, 0.001, 1, &o->vram_eff);
    else if (!strcmp(a, "--device"))
        *bad = !tdm_device_parse(v, &o->device);
    else if (!strcmp(a, "--threads"))
        *bad = (o->n_threads = parse_int_list(v, o->threads, 1, 4096)) < 1;
    else if (!strcmp(a, "--prompt"))
        *bad = (o->n_prompts = parse_int_list(v, o->prompts, 1, 1 << 20)) < 1;
    else if (!strcmp(a, "--gpu-mem"))
        *bad = (o->n_gpu_mem = parse_gib_list(v, o->gpu_mem)) < 1;
    else if (!strcmp(a, "--fill"))
        *bad = (o->n_fills = parse_fill_list(v, o->fills)) < 1;
    else if (!strcmp(a, "--gen")) {
        *bad = !tdm_cli_parse_long(v, 1, 1 << 20, &l);
        o->gen = (int)l;
    }
    else if (!strcmp(a, "--adapt-every"))
        *bad = !tdm_cli_parse_i32(v, 1, 1 << 24, &o->adapt_every);
    else if (!strcmp(a, "--membw"))
        *bad = !tdm_cli_parse_double(v, 1e-9, 1e5, &o->membw);
    else if (!strcmp(a, "--zipf"))
        *bad = !tdm_cli_parse_double(v, 0, 10, &o->zipf);
    else if (!strcmp(a, "--efficiency"))
        *bad = !tdm_cli_parse_double(v, 1e-9, 1.5, &o->efficiency);
    else if (!strcmp(a, "--probe-mib")) {
        *bad = !tdm_cli_parse_long(v, 1, 1 << 20, &l);
        o->probe_bytes = (size_t)l << 20;
    } else
        return false;
    return true;
}

static int parse_args(int argc, char **argv, bench_opts *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (!strcmp(a, "--plot") || !strcmp(a, "--no-measure") || !strcmp(a, "--validate")) {
            o->plot |= !strcmp(a, "--plot");
            o->validate |= !strcmp(a, "--validate");
            o->measure &= !!strcmp(a, "--no-measure");
            continue;
        }
        if (!strcmp(a, "--membw") && (!v || strtod(v, &end) == 0 || end == v)) {
            o->measure = true; /* no value: run the probe */
            continue;
        }
        bool bad = false;
        if (!v || !parse_value(o, a, v, &bad)) {
            fprintf(stderr, "tandem bench: unexpected or incomplete argument '%s' (see tandem bench --help)\n", a);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "tandem bench: bad value for %s: %s\n", a, v);
            return 2;
        }
        i++;
    }
    bool needs_profile = false;
    for (int f = 0; f < o->n_fills; f++)
        needs_profile |= o->fills[f] != FILL_LAYER;
    if (needs_profile && !o->profile) {
        fprintf(stderr, "tandem bench: --fill profile and adaptive need --profile P.json (tandem profile)\n");
        return 2;
    }
    o->fill_given = o->n_fills > 0;
    if (!o->fill_given)
        o->fills[o->n_fills++] = o->profile ? FILL_PROFILE : FILL_LAYER;
    return 0;
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

/* after - before of the cumulative counters; the sizes are after's. */
static tdm_executor_stats stats_delta(const tdm_executor_stats *after, const tdm_executor_stats *before)
{
    tdm_executor_stats d = *after;
    d.tokens -= before->tokens;
    d.layers -= before->layers;
    d.hits -= before->hits;
    d.misses -= before->misses;
    d.pool_wakes -= before->pool_wakes;
    d.pool_ms -= before->pool_ms;
    d.wait_ms -= before->wait_ms;
    d.dev_ms -= before->dev_ms;
    d.pool_bytes -= before->pool_bytes;
    d.swaps -= before->swaps;
    d.bytes_moved -= before->bytes_moved;
    return d;
}

/* One prompt + greedy decode on a reset session; with an executor, its
 * counters over the decode phase into r->dec. */
static tdm_status run_one(tdm_session *s, tdm_executor *ex, int32_t n_vocab, const int32_t *prompt, int gen,
                          bench_run *r, tdm_error *err)
{
    tdm_session_reset(s);
    double t0 = now_s();
    tdm_status st = tdm_session_eval(s, prompt, r->prompt, NULL, err);
    if (st)
        return st;
    double t1 = now_s();
    tdm_executor_stats before = {0}, after = {0};
    if (ex)
        tdm_executor_get_stats(ex, &before);
    int32_t tok = argmax(tdm_session_logits(s), n_vocab);
    for (r->decoded = 0; r->decoded < gen; r->decoded++) {
        if ((st = tdm_session_eval(s, &tok, 1, NULL, err)))
            return st;
        tok = argmax(tdm_session_logits(s), n_vocab);
    }
    r->decode_s = now_s() - t1;
    r->prompt_s = t1 - t0;
    if (ex) {
        tdm_executor_get_stats(ex, &after);
        r->dec = stats_delta(&after, &before);
    }
    return TDM_OK;
}

/* Everything the report needs. */
typedef struct bench_ctx {
    const bench_opts *o;
    const char *model_name;
    char command[1024];         /* the command line, for the JSON */
    bool hybrid;
    tdm_proj_model pm;
    tdm_proj_hitcurve hc;       /* --hit-curve or Zipf: the CPU path's grid, profile/adaptive fills */
    tdm_proj_hitcurve hc_layer; /* the layer fill caches whole layers: h = f for any routing */
    tdm_proj_grid grid;         /* CPU path: one DRAM row (membw) x the --gpu-mem budgets */
    bool have_grid;
    bool synthetic;
    bool measured;              /* membw comes from the probe */
    double membw;               /* CPU path: host read GB/s for the bound (0: none) */
    tdm_proj_host host;
    /* hybrid */
    tdm_topology *topo;
    tdm_profile *prof;
    char gpu_name[256];
    double vram_gbps;           /* device copy GB/s */
    double dram_gbps[MAX_LIST]; /* B_dram per o->threads[i] (0: none) */
    char dram_source[32];       /* "probe", "user", "none" */
    double efficiency;          /* of the projection */
    char efficiency_source[128];
    double vram_eff;            /* of the projection: fraction of vram_gbps */
    double latency_us;          /* of the projection, per hand-off */
    uint64_t reserve_bytes;     /* of the projection: KV + state + scratch in the budget */
    int32_t n_ctx;              /* of every session */
    cJSON *skipped;             /* hybrid: grid points that failed, [{..., "error"}] */
    bench_run *runs;            /* [MAX_RUNS] */
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

/* The hit curves of c->pm: h = f for the layer fill, --hit-curve or Zipf (zipf) for the others. */
static tdm_status setup_curves(bench_ctx *c, double zipf, tdm_error *err)
{
    tdm_status st = tdm_proj_hitcurve_zipf(0, c->pm.n_expert, &c->hc_layer, err);
    if (st)
        return st;
    snprintf(c->hc_layer.source, sizeof c->hc_layer.source, "layer fill: h = cached fraction");
    if (c->o->hit_curve)
        return tdm_proj_hitcurve_load(c->o->hit_curve, NULL, &c->pm, &c->hc, err);
    return tdm_proj_hitcurve_zipf(zipf >= 0 ? zipf : TDM_PROJ_DEFAULT_ZIPF_S, c->pm.n_expert, &c->hc, err);
}

static tdm_status setup_projection(bench_ctx *c, const tdm_gguf *g, tdm_error *err)
{
    tdm_status st = tdm_proj_model_from_gguf(g, c->model_name, &c->pm, err);
    return st ? st : setup_curves(c, c->o->zipf, err);
}

/* CPU path, after the workload (the probe pins threads, which must not change the runs). */
static tdm_status setup_cpu_bound(bench_ctx *c, tdm_error *err)
{
    tdm_status st;
    if (c->o->measure && !(c->o->membw > 0)) {
        if ((st = tdm_proj_measure_host(c->o->probe_bytes, &c->host, err)))
            return st;
        c->measured = true;
        c->membw = c->host.read_gbps;
        tdm_proj_host_print(stdout, &c->host);
    }
    for (int i = 0; i < c->n_runs; i++) {
        bench_run *r = &c->runs[i];
        r->dram_gbps = c->membw;
        r->cpu_bytes = cpu_path_bytes(c, r);
        tdm_bench_bound_compute(r->cpu_bytes, c->membw, 0, 0, &r->bound);
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
    if (c->o->vram_eff > 0)
        gr->base.vram_efficiency = c->o->vram_eff;
    c->have_grid = true;
    return tdm_proj_grid_run(&c->pm, &c->hc, gr, err);
}

/* ---- hybrid ---- */

/* The session's executor parameters, as cli_gen's executor_params builds them. */
static void hybrid_params(const bench_ctx *c, const bench_run *r, tdm_executor_params *p)
{
    tdm_executor_params_init(p);
    p->n_slots = -1;
    p->gpu_mem = (uint64_t)(r->gpu_mem_gib * (double)(1ull << 30));
    p->n_ctx = c->n_ctx;
    p->max_batch = TDM_FORWARD_BATCH_DEFAULT;
    p->policy = FILL_POLICY[r->fill];
    p->profile = r->fill == FILL_LAYER ? NULL : c->prof;
    p->topo = c->topo;
    p->n_threads = r->threads;
    p->adapt_every = c->o->adapt_every;
}

/* Before the workload: topology, profile and the device copy bandwidth. */
static tdm_status hybrid_setup(bench_ctx *c, const tdm_model *model, tdm_error *err)
{
    tdm_status st = tdm_topology_load(&c->topo, err);
    if (!st && c->o->profile) {
        tdm_model_id id;
        st = tdm_profile_model_id(tdm_model_gguf(model), &id, err);
        if (!st)
            st = tdm_profile_read(c->o->profile, &id, &c->prof, err);
    }
    tdm_gpu *g = NULL;
    tdm_gpu_info info;
    if (!st)
        st = tdm_gpu_create(0, &g, err);
    if (!st)
        st = tdm_gpu_query(g, &info, err);
    if (!st)
        st = tdm_bench_vram_gbps(g, 0, 0, &c->vram_gbps, err);
    if (!st) {
        snprintf(c->gpu_name, sizeof c->gpu_name, "%s", info.name);
        printf("GPU %s: device copy %.0f GB/s (B_vram)\n", c->gpu_name, c->vram_gbps);
    }
    tdm_gpu_free(g);
    return st;
}

/* One grid point: a fresh hybrid session, every prompt length on it. */
static tdm_status run_hybrid_point(bench_ctx *c, tdm_model *model, const int32_t *ids, bench_run proto,
                                   tdm_error *err)
{
    const bench_opts *o = c->o;
    tdm_executor_params p;
    hybrid_params(c, &proto, &p);
    tdm_session *s = NULL;
    fprintf(stderr, "bench: --gpu-mem %g GiB, fill %s, %d pool threads ...\n", proto.gpu_mem_gib,
            FILL_NAME[proto.fill], proto.threads);
    tdm_status st = tdm_session_new_hybrid(model, c->n_ctx, &p, &s, err);
    if (!st && tdm_session_budget(s)) {
        char line[512];
        tdm_budget_format(tdm_session_budget(s), line, sizeof line);
        fprintf(stderr, "bench: %s\n", line);
    }
    for (int i = 0; !st && i < o->n_prompts; i++) {
        bench_run *r = &c->runs[c->n_runs];
        *r = proto;
        r->prompt = o->prompts[i];
        if (!(st = run_one(s, tdm_session_executor(s), tdm_model_hparams(model)->n_vocab, ids, o->gen, r, err)))
            c->n_runs++;
    }
    tdm_session_free(s);
    return st;
}

/* B_dram per thread count, after the workload; a count the probe refuses
 * (more threads than physical cores) leaves its bound empty. */
static void hybrid_dram(bench_ctx *c)
{
    const bench_opts *o = c->o;
    snprintf(c->dram_source, sizeof c->dram_source, "%s",
             o->membw > 0 ? "user" : o->measure ? "probe" : "none");
    for (int t = 0; t < o->n_threads; t++) {
        tdm_error e = {0};
        if (o->membw > 0)
            c->dram_gbps[t] = o->membw;
        else if (o->measure && tdm_bench_dram_gbps(o->threads[t], o->probe_bytes, &c->dram_gbps[t], &e))
            fprintf(stderr, "bench: no B_dram for %d threads: %s\n", o->threads[t], e.msg);
        else if (o->measure)
            printf("host read bandwidth, %d pinned threads: %.1f GB/s (B_dram)\n", o->threads[t],
                   c->dram_gbps[t]);
    }
}

static double run_hit_rate(const bench_run *r)
{
    const int64_t n = r->dec.hits + r->dec.misses;
    return n > 0 ? (double)r->dec.hits / (double)n : 0;
}

static double run_pool_gbps(const bench_run *r)
{
    return r->dec.pool_ms > 0 ? (double)r->dec.pool_bytes / (r->dec.pool_ms * 1e-3) / 1e9 : 0;
}

/* The projection's pool efficiency: the pool's decode GB/s over every run at
 * the largest thread count, divided by B_dram there (or --efficiency). */
static void hybrid_efficiency(bench_ctx *c)
{
    const bench_opts *o = c->o;
    int tmax = 0;
    for (int t = 1; t < o->n_threads; t++)
        tmax = o->threads[t] > o->threads[tmax] ? t : tmax;
    double bytes = 0, ms = 0;
    for (int i = 0; i < c->n_runs; i++)
        if (c->runs[i].threads == o->threads[tmax]) {
            bytes += (double)c->runs[i].dec.pool_bytes;
            ms += c->runs[i].dec.pool_ms;
        }
    c->efficiency = TDM_PROJ_DEFAULT_EFFICIENCY;
    snprintf(c->efficiency_source, sizeof c->efficiency_source, "default (no pool work at %d threads)",
             o->threads[tmax]);
    if (o->efficiency > 0) {
        c->efficiency = o->efficiency;
        snprintf(c->efficiency_source, sizeof c->efficiency_source, "user");
    } else if (ms > 0 && c->dram_gbps[tmax] > 0) {
        const double eff = bytes / (ms * 1e-3) / 1e9 / c->dram_gbps[tmax];
        c->efficiency = eff < 1.5 ? eff : 1.5; /* the projection's range */
        snprintf(c->efficiency_source, sizeof c->efficiency_source,
                 "pool %.1f GB/s / B_dram %.1f GB/s at %d threads", bytes / (ms * 1e-3) / 1e9,
                 c->dram_gbps[tmax], o->threads[tmax]);
    }
}

static int thread_index(const bench_opts *o, int threads)
{
    int t = 0;
    while (t < o->n_threads - 1 && o->threads[t] != threads)
        t++;
    return t;
}

/* The projection of run i for its machine (docs/BENCH.md "Projection check"):
 * nothing from the run's own cache counters. */
static void project_run(const bench_ctx *c, bench_run *r, int i)
{
    if (!(r->dram_gbps > 0))
        return;
    tdm_proj_machine mc;
    tdm_proj_machine_default(&c->pm, &mc);
    mc.dram_gbps = r->dram_gbps;
    mc.efficiency = c->efficiency;
    mc.vram_gbps = c->vram_gbps;
    mc.vram_efficiency = c->vram_eff;
    mc.latency_us = c->latency_us;
    mc.vram_bytes = (uint64_t)(r->gpu_mem_gib * (double)(1ull << 30));
    mc.reserve_bytes = c->reserve_bytes;
    mc.decode_ctx = (int32_t)(r->prompt + r->decoded / 2.0);
    tdm_error e = {0};
    r->have_proj = tdm_proj_predict(&c->pm, r->fill == FILL_LAYER ? &c->hc_layer : &c->hc, &mc, &r->proj,
                                    &e) == TDM_OK;
    if (!r->have_proj)
        fprintf(stderr, "bench: no projection for run %d: %s\n", i, e.msg);
}

/* Bound and projection of every hybrid run (DESIGN.md §5, docs/BENCH.md). */
static void hybrid_bound(bench_ctx *c)
{
    hybrid_efficiency(c);
    /* the copy rate is measured, not a peak: 1 unless --vram-efficiency */
    c->vram_eff = c->o->vram_eff > 0 ? c->o->vram_eff : 1.0;
    c->latency_us = TDM_PROJ_DEFAULT_LATENCY_US;
    c->reserve_bytes = tdm_proj_reserve_bytes(&c->pm, c->n_ctx);
    for (int i = 0; i < c->n_runs; i++) {
        bench_run *r = &c->runs[i];
        const double ctx = r->prompt + r->decoded / 2.0;
        r->hit = run_hit_rate(r);
        r->dram_gbps = c->dram_gbps[thread_index(c->o, r->threads)];
        r->cpu_bytes = (double)r->dec.pool_bytes / r->decoded;
        r->gpu_bytes = tdm_bench_gpu_bytes(&c->pm, r->hit, ctx);
        tdm_bench_bound_compute(r->cpu_bytes, r->dram_gbps, r->gpu_bytes, c->vram_gbps, &r->bound);
        project_run(c, r, i);
    }
}

static tdm_status run_cpu(bench_ctx *c, tdm_model *model, const int32_t *ids, tdm_error *err)
{
    const bench_opts *o = c->o;
    int max_thr = 1;
    for (int t = 0; t < o->n_threads; t++)
        max_thr = o->threads[t] > max_thr ? o->threads[t] : max_thr;
    omp_set_num_threads(max_thr); /* the forward sizes its per-thread scratch at creation */
    tdm_session *s = NULL;
    tdm_status st = tdm_session_new_device(model, c->n_ctx, TDM_DEVICE_CPU, &s, err);
    if (!st)
        fprintf(stderr, "bench: forward on %s\n", tdm_device_name(tdm_session_device(s)));
    for (int t = 0; !st && t < o->n_threads; t++)
        for (int p = 0; !st && p < o->n_prompts; p++) {
            bench_run *r = &c->runs[c->n_runs];
            *r = (bench_run){.threads = o->threads[t], .prompt = o->prompts[p], .fill = -1};
            omp_set_num_threads(r->threads);
            fprintf(stderr, "bench: %d threads, prompt %d, %d generated ...\n", r->threads, r->prompt,
                    o->gen);
            if (!(st = run_one(s, NULL, tdm_model_hparams(model)->n_vocab, ids, o->gen, r, err)))
                c->n_runs++;
        }
    tdm_session_free(s);
    return st;
}

/* A point that fails (budget too small, a CUDA error) is reported and skipped:
 * the others still run. An error only when no point ran. */
static tdm_status run_hybrid(bench_ctx *c, tdm_model *model, const int32_t *ids, tdm_error *err)
{
    const bench_opts *o = c->o;
    omp_set_num_threads(1); /* the main thread only feeds the GPU; the pool has its own team */
    for (int v = 0; v < o->n_gpu_mem; v++)
        for (int t = 0; t < o->n_threads; t++)
            for (int f = 0; f < o->n_fills; f++) {
                const bench_run proto = {.threads = o->threads[t], .gpu_mem_gib = o->gpu_mem[v],
                                         .fill = o->fills[f]};
                if (!run_hybrid_point(c, model, ids, proto, err))
                    continue;
                fprintf(stderr, "bench: skipped --gpu-mem %g, %d threads, fill %s: %s\n", proto.gpu_mem_gib,
                        proto.threads, FILL_NAME[proto.fill], err->msg);
                cJSON *x = cJSON_CreateObject();
                cJSON_AddNumberToObject(x, "gpu_mem_gib", proto.gpu_mem_gib);
                cJSON_AddNumberToObject(x, "threads", proto.threads);
                cJSON_AddStringToObject(x, "fill", FILL_NAME[proto.fill]);
                cJSON_AddStringToObject(x, "error", err->msg);
                cJSON_AddItemToArray(c->skipped, x);
            }
    if (c->n_runs)
        return TDM_OK;
    char last[sizeof err->msg];
    snprintf(last, sizeof last, "%s", err->msg);
    return tdm_error_set(err, err->code, "no grid point ran; the last: %s", last);
}

/* The workload: prompt ids once, then the CPU forward per thread count or a
 * hybrid session per grid point; every prompt length on each. */
static tdm_status run_workload(bench_ctx *c, tdm_model *model, tdm_error *err)
{
    const bench_opts *o = c->o;
    int maxp = 0;
    for (int i = 0; i < o->n_prompts; i++)
        maxp = o->prompts[i] > maxp ? o->prompts[i] : maxp;
    c->n_ctx = maxp + o->gen;
    tdm_tokenizer *tk = NULL;
    int32_t *ids = malloc((size_t)maxp * sizeof *ids);
    tdm_status st = ids ? tdm_tokenizer_load(tdm_model_gguf(model), &tk, err)
                        : tdm_error_set(err, TDM_ERR_OOM, "prompt ids");
    if (!st)
        st = make_prompt(tk, tdm_model_hparams(model)->n_vocab, ids, maxp, &c->synthetic, err);
    if (!st)
        st = c->hybrid ? run_hybrid(c, model, ids, err) : run_cpu(c, model, ids, err);
    tdm_tokenizer_free(tk);
    free(ids);
    return st;
}

/* ---- report ---- */

static void print_opt(double v, bool have, const char *fmt, int width)
{
    if (have)
        printf(fmt, width, v);
    else
        printf("%*s", width, "n/a");
}

static void print_cpu_report(const bench_ctx *c)
{
    printf("\n%-7s %7s %12s %12s %8s %10s %10s %11s %9s %11s %8s\n", "threads", "prompt",
           "prompt tok/s", "decode tok/s", "hit rate", "cpu ms/tok", "gpu ms/tok", "wait ms/tok",
           "pool GB/s", "bound tok/s", "of bound");
    for (int i = 0; i < c->n_runs; i++) {
        const bench_run *r = &c->runs[i];
        double dec = r->decoded / r->decode_s, bound = r->bound.tok_s;
        printf("%-7d %7d %12.1f %12.2f %8s %10s %10s %11s %9s ", r->threads, r->prompt,
               r->prompt / r->prompt_s, dec, "n/a", "n/a", "n/a", "n/a", "n/a");
        if (bound > 0)
            printf("%11.2f %7.1f%%\n", bound, 100 * dec / bound);
        else
            printf("%11s %8s\n", "n/a", "n/a");
    }
    printf("(CPU path: bound = host read GB/s / bytes per token: %.4f GB of weights + f32 KV at the "
           "mean position + DeltaNet state%s; hit rate, CPU/GPU/wait ms and pool GB/s come with the "
           "hybrid path)\n",
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

/* The engine runs every hit on the GPU: the projection's g = h value. */
static double projected_tok_s(const bench_run *r)
{
    return r->have_proj ? r->proj.tok_s_hits_on_gpu : 0;
}

/* The projection against the measured decode, per run (--validate, --revalidate). */
static void print_validation(const bench_ctx *c)
{
    printf("\nprojection (engine/projection.h: t = t_gpu + t_cpu + hand-offs) against the measured decode;\n"
           "efficiency %.3f = %s;\nVRAM %.0f GB/s x %.3f, latency %.0f us per hand-off, reserve %.1f MB "
           "(KV for %d positions); hit curve:\nlayer fill: h = cached fraction, other fills: %s\n",
           c->efficiency, c->efficiency_source, c->vram_gbps, c->vram_eff, c->latency_us,
           c->reserve_bytes / 1e6, c->n_ctx, c->hc.source);
    printf("%7s %-8s %7s %6s %7s %7s %7s %7s %7s %7s %7s %9s %9s %9s %8s\n", "gpu-mem", "fill", "threads",
           "prompt", "B_dram", "hit prj", "hit msr", "gpu prj", "gpu msr", "cpu prj", "cpu msr", "projected",
           "measured", "error", "bound");
    for (int i = 0; i < c->n_runs; i++) {
        const bench_run *r = &c->runs[i];
        const double dec = r->decoded / r->decode_s, pr = projected_tok_s(r), n = r->decoded;
        printf("%7.1f %-8s %7d %6d ", r->gpu_mem_gib, FILL_NAME[r->fill], r->threads, r->prompt);
        print_opt(r->dram_gbps, r->dram_gbps > 0, "%*.1f", 7);
        if (pr > 0)
            printf(" %6.1f%% %6.1f%% %7.2f %7.2f %7.2f %7.2f %9.1f %9.2f %+8.1f%% %8s\n", 100 * r->proj.hit_rate,
                   100 * r->hit, 1e3 * r->proj.t_gpu_s, (r->dec.dev_ms - r->dec.wait_ms) / n,
                   1e3 * r->proj.t_cpu_s, r->dec.pool_ms / n, pr, dec, 100 * (dec - pr) / pr,
                   tdm_proj_bound_name(r->proj.bound));
        else
            printf(" %7s %6.1f%% %7s %7.2f %7s %7.2f %9s %9.2f %9s %8s\n", "n/a", 100 * r->hit, "n/a",
                   (r->dec.dev_ms - r->dec.wait_ms) / n, "n/a", r->dec.pool_ms / n, "n/a", dec, "n/a",
                   r->have_proj ? tdm_proj_bound_name(r->proj.bound) : "n/a");
    }
    printf("(ms per decoded token: gpu msr = GPU step time - waiting for the pool, cpu msr = pool compute;\n"
           " error = (measured - projected) / projected)\n");
}

static void print_hybrid_report(const bench_ctx *c)
{
    printf("\n%7s %-8s %7s %6s %8s %8s %6s %7s %7s %7s %7s %7s %7s %8s %-8s %7s\n", "gpu-mem", "fill",
           "threads", "prompt", "prompt/s", "decode/s", "hit", "cpu ms", "gpu ms", "wait ms", "pool GB/s",
           "MB/tok", "B_dram", "bound/s", "bound", "of bnd");
    for (int i = 0; i < c->n_runs; i++) {
        const bench_run *r = &c->runs[i];
        const double dec = r->decoded / r->decode_s, n = r->decoded;
        printf("%7.1f %-8s %7d %6d %8.1f %8.2f %5.1f%% %7.3f %7.3f %7.3f %7.1f %7.1f ", r->gpu_mem_gib,
               FILL_NAME[r->fill], r->threads, r->prompt, r->prompt / r->prompt_s, dec, 100 * r->hit,
               r->dec.pool_ms / n, r->dec.dev_ms / n, r->dec.wait_ms / n, run_pool_gbps(r), r->cpu_bytes / 1e6);
        print_opt(r->dram_gbps, r->dram_gbps > 0, "%*.1f", 7);
        if (r->bound.tok_s > 0)
            printf(" %8.1f %-8s %6.1f%%\n", r->bound.tok_s, r->bound.cpu_bound ? "cpu-dram" : "gpu-vram",
                   100 * dec / r->bound.tok_s);
        else
            printf(" %8s %-8s %7s\n", "n/a", "n/a", "n/a");
    }
    printf("(per decoded token; cpu ms = pool compute, gpu ms = GPU step time, wait ms = GPU waiting for "
           "the pool;\n bound = 1 / max(pool bytes / B_dram, GPU bytes / B_vram), B_vram %.0f GB/s device "
           "copy, B_dram %s)\n",
           c->vram_gbps, c->dram_source);
    if (c->o->validate)
        print_validation(c);
}

static void add_num_or_null(cJSON *o, const char *k, double v, bool have)
{
    if (have)
        cJSON_AddNumberToObject(o, k, v);
    else
        cJSON_AddNullToObject(o, k);
}

static void add_int_array(cJSON *o, const char *k, const int *v, int n)
{
    cJSON *a = cJSON_AddArrayToObject(o, k);
    for (int i = 0; i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
}

/* Executor counters per decoded token (hybrid); null on the CPU path. */
static void run_json_hybrid(cJSON *x, const bench_run *r)
{
    const bool hy = r->fill >= 0;
    const double n = r->decoded, pr = projected_tok_s(r), dec = r->decoded / r->decode_s;
    add_num_or_null(x, "gpu_mem_gib", r->gpu_mem_gib, hy);
    if (hy)
        cJSON_AddStringToObject(x, "fill", FILL_NAME[r->fill]);
    else
        cJSON_AddNullToObject(x, "fill");
    add_num_or_null(x, "slots", r->dec.n_slots, hy);
    add_num_or_null(x, "hit_rate", r->hit, hy);
    add_num_or_null(x, "cpu_ms_per_token", r->dec.pool_ms / n, hy);
    add_num_or_null(x, "gpu_ms_per_token", r->dec.dev_ms / n, hy);
    add_num_or_null(x, "wait_ms_per_token", r->dec.wait_ms / n, hy);
    add_num_or_null(x, "pool_gbps", run_pool_gbps(r), hy && r->dec.pool_ms > 0);
    add_num_or_null(x, "pool_mb_per_token", (double)r->dec.pool_bytes / n / 1e6, hy);
    add_num_or_null(x, "pool_wakes_per_token", (double)r->dec.pool_wakes / n, hy);
    add_num_or_null(x, "swaps", (double)r->dec.swaps, hy);
    add_num_or_null(x, "cpu_bytes_per_token", r->cpu_bytes, hy);
    add_num_or_null(x, "gpu_bytes_per_token", r->gpu_bytes, hy);
    add_num_or_null(x, "projected_tok_s", pr, pr > 0);
    add_num_or_null(x, "projected_hit_rate", r->proj.hit_rate, r->have_proj);
    add_num_or_null(x, "projected_slots", (double)r->proj.slots, r->have_proj);
    if (r->have_proj)
        cJSON_AddStringToObject(x, "projected_bound", tdm_proj_bound_name(r->proj.bound));
    else
        cJSON_AddNullToObject(x, "projected_bound");
    add_num_or_null(x, "rel_error", (dec - pr) / pr, pr > 0);
}

static cJSON *run_json(const bench_run *r)
{
    cJSON *x = cJSON_CreateObject();
    const double dec = r->decoded / r->decode_s, bound = r->bound.tok_s;
    cJSON_AddNumberToObject(x, "threads", r->threads);
    cJSON_AddNumberToObject(x, "prompt_tokens", r->prompt);
    cJSON_AddNumberToObject(x, "gen_tokens", r->decoded);
    cJSON_AddNumberToObject(x, "prompt_s", r->prompt_s);
    cJSON_AddNumberToObject(x, "decode_s", r->decode_s);
    cJSON_AddNumberToObject(x, "prompt_tok_s", r->prompt / r->prompt_s);
    cJSON_AddNumberToObject(x, "decode_tok_s", dec);
    run_json_hybrid(x, r);
    add_num_or_null(x, "bytes_per_token", r->cpu_bytes, r->fill < 0);
    add_num_or_null(x, "dram_gbps", r->dram_gbps, r->dram_gbps > 0);
    add_num_or_null(x, "bound_tok_s", bound, bound > 0);
    if (r->fill < 0 || bound > 0) /* the CPU path is DRAM-bound by construction */
        cJSON_AddStringToObject(x, "bound", r->fill < 0 || r->bound.cpu_bound ? "cpu-dram" : "gpu-vram");
    else
        cJSON_AddNullToObject(x, "bound");
    add_num_or_null(x, "fraction_of_bound", dec / bound, bound > 0);
    return x;
}

static void host_json(cJSON *root, const bench_ctx *c)
{
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
    cJSON *d = cJSON_AddArrayToObject(h, "dram_by_threads");
    for (int t = 0; c->hybrid && t < c->o->n_threads; t++) {
        cJSON *x = cJSON_CreateObject();
        cJSON_AddNumberToObject(x, "threads", c->o->threads[t]);
        add_num_or_null(x, "read_gbps", c->dram_gbps[t], c->dram_gbps[t] > 0);
        cJSON_AddStringToObject(x, "source", c->dram_source);
        cJSON_AddItemToArray(d, x);
    }
}

/* Hybrid: the GPU and the projection's assumptions; CPU path: the projected budgets. */
static void path_json(cJSON *root, const bench_ctx *c)
{
    if (c->hybrid) {
        cJSON *g = cJSON_AddObjectToObject(root, "gpu");
        cJSON_AddStringToObject(g, "name", c->gpu_name);
        cJSON_AddNumberToObject(g, "copy_gbps", c->vram_gbps);
        cJSON *v = cJSON_AddObjectToObject(root, "validation");
        cJSON_AddNumberToObject(v, "efficiency", c->efficiency);
        cJSON_AddStringToObject(v, "efficiency_source", c->efficiency_source);
        cJSON_AddNumberToObject(v, "vram_gbps", c->vram_gbps);
        cJSON_AddNumberToObject(v, "vram_efficiency", c->vram_eff);
        cJSON_AddNumberToObject(v, "latency_us", c->latency_us);
        cJSON_AddNumberToObject(v, "reserve_bytes", (double)c->reserve_bytes);
        cJSON_AddStringToObject(v, "hit_curve_layer", c->hc_layer.source);
        cJSON_AddStringToObject(v, "hit_curve", c->hc.source);
        cJSON_AddStringToObject(v, "projected", "tok_s_hits_on_gpu (every hit on the GPU, as the engine runs)");
        cJSON_AddItemToObject(root, "skipped", cJSON_Duplicate(c->skipped, true));
        return;
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
}

static cJSON *report_json(const bench_ctx *c)
{
    const bench_opts *o = c->o;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "format", "tandem-bench");
    cJSON_AddNumberToObject(root, "version", 2);
    cJSON_AddStringToObject(root, "command", c->command);
    cJSON *m = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(m, "name", c->model_name);
    cJSON_AddStringToObject(m, "path", o->model);
    cJSON_AddStringToObject(m, "arch", c->pm.arch);
    cJSON_AddNumberToObject(m, "active_expert_bytes_per_token", (double)c->pm.active_expert_bytes);
    cJSON_AddNumberToObject(m, "dense_bytes_per_token", (double)tdm_proj_dense_bytes(&c->pm));
    host_json(root, c);
    cJSON_AddStringToObject(root, "engine_path", c->hybrid ? "hybrid" : "cpu");
    cJSON *w = cJSON_AddObjectToObject(root, "workload");
    add_int_array(w, "prompt_tokens", o->prompts, o->n_prompts);
    cJSON_AddNumberToObject(w, "gen_tokens", o->gen);
    cJSON_AddBoolToObject(w, "greedy", true);
    cJSON_AddStringToObject(w, "prompt_source", c->synthetic ? "synthetic" : "text");
    cJSON *a = cJSON_AddArrayToObject(w, "fills");
    for (int f = 0; c->hybrid && f < o->n_fills; f++)
        cJSON_AddItemToArray(a, cJSON_CreateString(FILL_NAME[o->fills[f]]));
    if (c->hybrid && o->profile)
        cJSON_AddStringToObject(w, "profile", o->profile);
    cJSON *runs = cJSON_AddArrayToObject(root, "runs");
    for (int i = 0; i < c->n_runs; i++)
        cJSON_AddItemToArray(runs, run_json(&c->runs[i]));
    path_json(root, c);
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

/* "tandem bench ARGS", each argument with a space or quote single-quoted. */
static void join_command(int argc, char **argv, char *out, size_t cap)
{
    size_t n = (size_t)snprintf(out, cap, "tandem");
    for (int i = 0; i < argc && n < cap; i++) {
        const bool q = strpbrk(argv[i], " \t'\"$") != NULL;
        n += (size_t)snprintf(out + n, cap - n, q ? " '%s'" : " %s", argv[i]);
    }
}

/* Usage errors that depend on the path (after the device is resolved). */
static int check_path(const bench_ctx *c)
{
    const bench_opts *o = c->o;
    if (!c->hybrid && (o->validate || o->profile || o->adapt_every || o->fill_given)) {
        fprintf(stderr, "tandem bench: --fill, --profile, --adapt-every and --validate need the hybrid GPU "
                        "path (--device cuda; device here: cpu)\n");
        return 2;
    }
    if (c->hybrid && o->n_gpu_mem * o->n_threads * o->n_fills * o->n_prompts > MAX_RUNS) {
        fprintf(stderr, "tandem bench: %d x %d x %d x %d runs, at most %d\n", o->n_gpu_mem, o->n_threads,
                o->n_fills, o->n_prompts, MAX_RUNS);
        return 2;
    }
    return 0;
}

/* bench/plot.sh on the JSON; a missing gnuplot is a warning, not a failure. */
static int run_plot(const char *path)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "bash bench/plot.sh '%s'", path);
    const int rc = system(cmd);
    if (rc != -1 && WIFEXITED(rc) && WEXITSTATUS(rc) == PLOT_NO_GNUPLOT) {
        fprintf(stderr, "tandem bench: no plot (gnuplot or python3 missing); the JSON is complete\n");
        return 0;
    }
    if (rc != 0) {
        fprintf(stderr, "tandem bench: bench/plot.sh failed (run from the repository root)\n");
        return 1;
    }
    return 0;
}

static tdm_status run_bench(bench_ctx *c, tdm_model *model, char *path, size_t cap, tdm_error *err)
{
    const bench_opts *o = c->o;
    tdm_status st = setup_projection(c, tdm_model_gguf(model), err);
    if (!st && c->hybrid)
        st = hybrid_setup(c, model, err);
    if (st)
        return st;
    printf("tandem bench: %s (%s), engine path: %s, prompts", c->model_name, c->pm.arch,
           c->hybrid ? "hybrid (GPU + VRAM expert cache + CPU pool)" : "CPU forward");
    for (int i = 0; i < o->n_prompts; i++)
        printf(" %d", o->prompts[i]);
    printf(", %d greedy tokens\n", o->gen);
    if ((st = run_workload(c, model, err)))
        return st;
    if (c->hybrid) {
        hybrid_dram(c);
        hybrid_bound(c);
        print_hybrid_report(c);
    } else {
        if ((st = setup_cpu_bound(c, err)))
            return st;
        print_cpu_report(c);
    }
    if (o->json)
        snprintf(path, cap, "%s", o->json);
    else
        default_json_path(c, path, cap);
    if (!(st = write_report(c, path, err)))
        printf("wrote %s\n", path);
    return st;
}

/* ---- --revalidate ---- */

/* The accounting for a recorded file: -m, else the recorded path when it is
 * readable here, else a preset with the recorded byte counts (said on stdout). */
static tdm_status revalidate_model(bench_ctx *c, const tdm_proj_valfile *v, tdm_error *err)
{
    const char *path = c->o->model ? c->o->model
                       : !c->o->preset && v->model_path[0] && access(v->model_path, R_OK) == 0 ? v->model_path
                                                                                              : NULL;
    if (!path) {
        char note[512];
        tdm_status st = tdm_proj_valfile_model(v, c->o->preset, &c->pm, note, sizeof note, err);
        if (!st)
            printf("model: %s\n", note);
        return st;
    }
    tdm_gguf *g;
    tdm_status st = tdm_gguf_open(path, &g, err);
    if (st)
        return st;
    st = tdm_proj_model_from_gguf(g, v->model_name, &c->pm, err);
    tdm_gguf_free(g);
    if (!st)
        printf("model: %s (accounting from the file)\n", path);
    return st;
}

/* c from the recorded inputs: every run's machine and measured decode. */
static tdm_status revalidate_setup(bench_ctx *c, bench_opts *o, const tdm_proj_valfile *v, tdm_error *err)
{
    double zipf = o->zipf;
    bool other_fill = false;
    for (int i = 0; i < v->n_runs; i++)
        other_fill |= strcmp(v->runs[i].fill, "layer") != 0;
    /* the profile/adaptive fills' curve as --validate had it: Zipf from the
     * recorded source, a file only from --hit-curve */
    if (!o->hit_curve && zipf < 0 && sscanf(v->hit_curve, "zipf s=%lf", &zipf) != 1) {
        zipf = -1;
        if (other_fill)
            return tdm_error_set(err, TDM_ERR_INVALID, "the recorded hit curve '%s' of the profile/adaptive "
                                 "fills is a file: give --hit-curve F (or --zipf S)", v->hit_curve);
    }
    tdm_status st = revalidate_model(c, v, err);
    if (st || (st = setup_curves(c, zipf, err)))
        return st;
    c->hybrid = true;
    c->vram_gbps = v->vram_gbps;
    c->vram_eff = o->vram_eff > 0 ? o->vram_eff : v->vram_efficiency;
    c->latency_us = v->latency_us;
    c->reserve_bytes = v->reserve_bytes;
    c->efficiency = o->efficiency > 0 ? o->efficiency : v->efficiency;
    snprintf(c->efficiency_source, sizeof c->efficiency_source, "%s",
             o->efficiency > 0 ? "user" : v->efficiency_source);
    for (int i = 0; i < v->n_runs; i++) {
        const tdm_proj_valrun *x = &v->runs[i];
        bench_run *r = &c->runs[c->n_runs++];
        const double n = x->gen_tokens;
        int fill = FILL_LAYER; /* the reader accepts only the three fill names */
        parse_fill_list(x->fill, &fill);
        *r = (bench_run){.threads = x->threads, .prompt = x->prompt_tokens, .decoded = x->gen_tokens,
                         .decode_s = n / x->decode_tok_s, .gpu_mem_gib = x->gpu_mem_gib, .fill = fill,
                         .hit = x->hit_rate, .dram_gbps = x->dram_gbps};
        r->dec.pool_ms = x->cpu_ms * n;
        r->dec.dev_ms = x->gpu_ms * n;
        r->dec.wait_ms = x->wait_ms * n;
        if (x->prompt_tokens + x->gen_tokens > c->n_ctx)
            c->n_ctx = x->prompt_tokens + x->gen_tokens;
    }
    return TDM_OK;
}

/* tandem bench --revalidate FILE.json: the recorded runs projected again. */
static int revalidate(bench_opts *o)
{
    bench_ctx c;
    memset(&c, 0, sizeof c);
    c.o = o;
    tdm_error err = {0};
    tdm_proj_valfile *v = calloc(1, sizeof *v); /* ~40 kB */
    c.runs = calloc(MAX_RUNS, sizeof *c.runs);
    tdm_status st = v && c.runs ? tdm_proj_valfile_load(o->revalidate, v, &err)
                                : tdm_error_set(&err, TDM_ERR_OOM, "revalidate");
    if (!st) {
        printf("tandem bench --revalidate %s\nrecorded: %s\n", o->revalidate, v->command);
        st = revalidate_setup(&c, o, v, &err);
    }
    for (int i = 0; !st && i < c.n_runs; i++) {
        project_run(&c, &c.runs[i], i);
        if (c.runs[i].have_proj && v->runs[i].projected_slots >= 0 &&
            c.runs[i].proj.slots != v->runs[i].projected_slots)
            printf("note: run %d: %lld slots here, %lld when recorded (the accounting differs from the "
                   "file's)\n", i, (long long)c.runs[i].proj.slots, (long long)v->runs[i].projected_slots);
    }
    if (!st)
        print_validation(&c);
    free(v);
    free(c.runs);
    if (st) {
        fprintf(stderr, "tandem bench: %s\n", err.msg);
        return 1;
    }
    return 0;
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
    bench_opts o = {.prompts = {512, 4096}, .n_prompts = 2, .gen = 256, .n_gpu_mem = 4,
                    .gpu_mem = {8, 12, 16, 24}, .measure = true, .zipf = -1};
    int rc = parse_args(argc, argv, &o);
    if (rc)
        return rc;
    if (o.revalidate)
        return revalidate(&o);
    if (!o.model)
        o.model = tdm_cli_default_model();
    bench_ctx c;
    memset(&c, 0, sizeof c);
    c.o = &o;
    c.hybrid = o.device == TDM_DEVICE_CUDA || (o.device == TDM_DEVICE_AUTO && tdm_gpu_available());
    if (!o.n_threads) { /* CPU: every OpenMP thread; hybrid: the pool's default */
        o.threads[0] = c.hybrid ? (tdm_membw_physical_cores() > 1 ? tdm_membw_physical_cores() - 1 : 1)
                                : omp_get_max_threads();
        o.n_threads = 1;
    }
    if ((rc = check_path(&c)))
        return rc;
    join_command(argc, argv, c.command, sizeof c.command);
    c.membw = o.membw > 0 ? o.membw : 0;
    const char *slash = strrchr(o.model, '/');
    c.model_name = slash ? slash + 1 : o.model;
    c.runs = calloc(MAX_RUNS, sizeof *c.runs);
    c.skipped = cJSON_CreateArray();
    tdm_error err = {0};
    tdm_model *model = NULL;
    char path[1024];
    tdm_status st = c.runs && c.skipped ? tdm_model_load(o.model, &model, &err)
                                        : tdm_error_set(&err, TDM_ERR_OOM, "runs");
    if (!st)
        st = run_bench(&c, model, path, sizeof path, &err);
    tdm_profile_free(c.prof);
    tdm_topology_free(c.topo);
    tdm_model_free(model);
    free(c.runs);
    cJSON_Delete(c.skipped);
    if (st) {
        fprintf(stderr, "tandem bench: %s\n", err.msg);
        return 1;
    }
    return o.plot ? run_plot(path) : 0;
}
