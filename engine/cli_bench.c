/* tandem bench: the fixed prefill/decode workload on the engine's path, each
 * speed next to the bandwidth bound of DESIGN.md §5 measured in the same run.
 * With a GPU (--device cuda, or auto with one visible) every point of the
 * --gpu-mem x --threads x --fill grid is a hybrid session (VRAM expert cache +
 * CPU pool), reported with its decode-phase executor counters and the
 * projection of engine/projection.h (validation); without one, the CPU
 * forward per thread count. --project prints the DDR4/DDR5 x VRAM projection
 * instead. Options, JSON schema and formulas: docs/BENCH.md. */
/* Split over three files (engine/cli_bench.h): this one the options, the
 * command and --revalidate; cli_bench_run.c the workload; cli_bench_report.c
 * the tables and the JSON. */
#include <cjson/cJSON.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "cli_bench.h"
#include "gpu.h"
#include "membw.h"
#include "model.h"
#include "projection.h"
#include "session.h"
#include "topology.h"

const char tdm_cli_bench_help[] =
    "benchmark prefill and decode against the bandwidth bound, or project decode tok/s\n"
    "usage: tandem bench [-m MODEL] [--device D] [--threads LIST] [--prompt LIST] [--gen N]\n"
    "                    [--gpu-mem LIST] [--fill LIST] [--profile P.json] [--validate]\n"
    "                    [--hit-curve F | --zipf S] [--membw [GBPS]] [--json FILE] [--plot]\n"
    "                    [--expert-memory auto|map|copy] [--stream-min N] [--zero-copy N|auto]\n"
    "                    [--prefetch N] [--pool-warm on|off]\n"
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
    "  --expert-memory M auto (default), map or copy: the CPU reads the experts from the file\n"
    "                    mapping, or from a copy in huge-page memory (tdm_model_copy_experts);\n"
    "                    auto copies when the GPU reads host memory (--zero-copy, --prefetch)\n"
    "  --stream-min N    hybrid: prompt batches of >= N tokens stream missed experts to the GPU\n"
    "                    (default 64; 0: never, the CPU pool computes every miss); longer\n"
    "                    prompts stream in spans of up to 8 batches run layer by layer\n"
    "  --zero-copy N     hybrid decode: missed experts per layer the GPU reads from host\n"
    "                    memory itself (default auto: tuned on the step time; 0: off)\n"
    "  --prefetch N      hybrid decode: predicted misses per layer the GPU reads into spare\n"
    "                    slots while it runs the layer before (default 2; 0: off)\n"
    "  --pool-warm on|off hybrid decode with --prefetch: the pool reads the predicted misses left\n"
    "                    to it into its caches while the GPU works (default on)\n"
    "  --validate        hybrid: print projected against measured decode tok/s per point\n"
    "  --hit-curve F     hit-rate curve of the projection (a profile, cachesim JSON or CSV, as\n"
    "                    --project); default Zipf (--zipf S, 0.5); the layer fill is projected\n"
    "                    with h = cached fraction (whole layers cached)\n"
    "  --membw [GBPS]    host read GB/s for the bound; without a value (and by default) the\n"
    "                    probe measures it (hybrid: before and after every point, with its pool\n"
    "                    threads pinned as the pool, over the expert copy the pool reads; the\n"
    "                    larger of the two)\n"
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

#define PLOT_NO_GNUPLOT 3 /* bench/plot.sh's exit status when gnuplot or python3 is missing */

const char *const bench_fill_name[FILL_COUNT] = {"layer", "profile", "adaptive"};

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
        while (f < FILL_COUNT && strcmp(t, bench_fill_name[f]))
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
        *bad = (o->n_threads = tdm_cli_parse_int_list(v, o->threads, MAX_LIST, 1, 4096)) < 1;
    else if (!strcmp(a, "--prompt"))
        *bad = (o->n_prompts = tdm_cli_parse_int_list(v, o->prompts, MAX_LIST, 1, 1 << 20)) < 1;
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
    else if (!strcmp(a, "--expert-memory"))
        *bad = !tdm_cli_parse_expert_memory(v, &o->expert_memory);
    else if (!strcmp(a, "--stream-min")) {
        *bad = !tdm_cli_parse_i32(v, 0, 1 << 24, &o->stream_min);
        o->stream_min = o->stream_min ? o->stream_min : -1;
    }
    else if (!strcmp(a, "--zero-copy"))
        *bad = !tdm_cli_parse_zero_copy(v, &o->zero_copy);
    else if (!strcmp(a, "--prefetch"))
        *bad = !tdm_cli_parse_i32(v, 0, 64, &o->prefetch);
    else if (!strcmp(a, "--pool-warm"))
        *bad = !tdm_cli_parse_on_off(v, &o->pool_warm);
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

/* The workload and its tables, then the JSON; path (cap bytes) gets the
 * file's name because --plot runs on it after the model is freed. */
static tdm_status run_bench(bench_ctx *c, tdm_model *model, char *path, size_t cap, tdm_error *err)
{
    tdm_status st = bench_measure(c, model, err);
    if (st)
        return st;
    if (c->hybrid)
        bench_print_hybrid_report(c);
    else
        bench_print_cpu_report(c);
    if (c->o->json)
        snprintf(path, cap, "%s", c->o->json);
    else
        bench_default_json_path(c, path, cap);
    if (!(st = bench_write_report(c, path, err)))
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
    if (st || (st = bench_setup_curves(c, zipf, err)))
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
        bench_project_run(&c, &c.runs[i], i);
        if (c.runs[i].have_proj && v->runs[i].projected_slots >= 0 &&
            c.runs[i].proj.slots != v->runs[i].projected_slots)
            printf("note: run %d: %lld slots here, %lld when recorded (the accounting differs from the "
                   "file's)\n", i, (long long)c.runs[i].proj.slots, (long long)v->runs[i].projected_slots);
    }
    if (!st)
        bench_print_validation(&c);
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
                    .gpu_mem = {8, 12, 16, 24}, .measure = true, .zipf = -1, .zero_copy = -1,
                    .prefetch = -1, .pool_warm = -1};
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
    if (!st) /* hybrid or the CPU path: the CPU reads the experts either way */
        st = tdm_cli_place_experts(model, o.expert_memory, true, c.hybrid && (o.zero_copy != 0 || o.prefetch != 0),
                                   &err);
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
