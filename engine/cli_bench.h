/* cli_bench: what the files of `tandem bench` share: the options, the runs
 * and the context the workload fills and the report reads. Internal to the
 * command (engine/cli_bench.c options + entry point + --revalidate,
 * engine/cli_bench_run.c the workload, bounds and projections,
 * engine/cli_bench_report.c the tables and the JSON); not a command itself
 * (defines no tdm_cli_<name>). */
#ifndef TDM_CLI_BENCH_H
#define TDM_CLI_BENCH_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bench_bound.h"
#include "cli.h"
#include "model.h"
#include "projection.h"
#include "session.h"
#include "topology.h"

#define MAX_LIST 8
#define MAX_RUNS 256

/* Cache fills of the hybrid grid; the policy each one runs is cli_bench_run.c's. */
typedef enum bench_fill { FILL_LAYER = 0, FILL_PROFILE, FILL_ADAPTIVE, FILL_COUNT } bench_fill;
/* The --fill names, also those of the report and the JSON. */
extern const char *const bench_fill_name[FILL_COUNT];

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
    int32_t stream_min;             /* --stream-min (cli_gen_opts) */
    int32_t zero_copy;              /* --zero-copy (cli_gen_opts); -1: auto */
    int32_t prefetch;               /* --prefetch (cli_gen_opts); -1: the default */
    int32_t pool_warm;              /* --pool-warm (cli_gen_opts); -1: the default */
    double membw, efficiency, zipf; /* zipf < 0: the projection default */
    double vram_eff;                /* 0: the default of the mode */
    bool plot, measure, validate;
    tdm_expert_memory expert_memory; /* --expert-memory (cli.h) */
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
    double dram_gbps;           /* B_dram of the bound (0: none): CPU path the probe or --membw;
                                 * hybrid --membw or the larger of dram_pre and dram_post */
    double dram_pre, dram_post; /* hybrid: the probe at this thread count right before and right
                                 * after the point's session (0: none) */
    double cpu_bytes, gpu_bytes; /* per decoded token */
    tdm_bench_bound bound;
    tdm_proj_point proj;        /* hybrid: the projection of this point */
    bool have_proj;
} bench_run;

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
    double stage_us;            /* one dependent stage on the device (bench_bound.h) */
    int64_t stages;             /* dependent stages per decoded token of the model */
    double dram_gbps[MAX_LIST]; /* B_dram per o->threads[i] (0: none): --membw or the median of
                                 * its probes (the projection's pool efficiency) */
    double dram_min[MAX_LIST], dram_max[MAX_LIST];
    int dram_n[MAX_LIST];       /* probes at o->threads[i] that read a bandwidth */
    char dram_source[32];       /* "probe", "user", "none" */
    char probe_memory[32];      /* what the probe read: "expert copy", "fresh buffers" ("": none) */
    double probe_gbps[2 * MAX_RUNS]; /* hybrid: every probe that read, in order */
    int probe_threads[2 * MAX_RUNS];
    int n_probes;
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

/* ---- cli_bench_run.c ---- */

/* The hit curves of c->pm: h = f for the layer fill, --hit-curve or Zipf
 * (zipf; < 0: the projection default) for the others. */
tdm_status bench_setup_curves(bench_ctx *c, double zipf, tdm_error *err);

/* The workload on model (CPU forward or hybrid grid, as c->hybrid says), then
 * every run's bound and, hybrid, its projection; prints the measured
 * bandwidths as they come. */
tdm_status bench_measure(bench_ctx *c, tdm_model *model, tdm_error *err);

/* The projection of run i (r->proj, r->have_proj) from c's machine
 * assumptions and the run's B_dram; a failure is a note on stderr. */
void bench_project_run(const bench_ctx *c, bench_run *r, int i);

/* ---- cli_bench_report.c ---- */

/* The tables on stdout after bench_measure: per thread count (CPU path) or
 * per grid point (hybrid; with o->validate also bench_print_validation). */
void bench_print_cpu_report(const bench_ctx *c);
void bench_print_hybrid_report(const bench_ctx *c);
/* The projection against the measured decode, per run (--validate, --revalidate). */
void bench_print_validation(const bench_ctx *c);

/* The JSON of docs/BENCH.md to path; bench_default_json_path names it when
 * --json is not given. */
tdm_status bench_write_report(const bench_ctx *c, const char *path, tdm_error *err);
void bench_default_json_path(const bench_ctx *c, char *out, size_t cap);

#endif
