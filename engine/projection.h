/* projection: the decode-throughput model of DESIGN.md §5, as pure functions.
 *
 * Per decoded token the CPU pool reads the routed experts that miss the VRAM
 * cache from host RAM and the GPU reads everything else. The two do NOT run in
 * parallel: per MoE layer the GPU computes attention / DeltaNet and the router
 * and publishes the selection, the pool computes the misses while the GPU has
 * only the (small) hits to do, and the next layer needs the merged output. So
 * per token the two sides alternate, and
 *   t_token = gpu_bytes / (eff_v x B_vram) + cpu_bytes / (eff x B_dram)
 *             + n_handoff x latency,        tok/s = 1 / t_token.
 * (Measured on an H200 with the hybrid executor, 15 pool threads: GPU step
 * 10.5 ms/token of which 5.7 ms waiting for the pool, pool 5.8 ms; the earlier
 * max() of the two terms overestimated decode by 35-50%.)
 * The inputs are (a) the byte accounting of a model (tdm_proj_model, from a
 * GGUF file or from a preset of known shapes and the Q4_K_M type mix), (b) a
 * machine (VRAM budget, bandwidths, latency), (c) a hit-rate curve h(cached
 * fraction) (a Zipf model, a tandem expert profile, or a cachesim table).
 * docs/PROJECTION.md documents every formula, default and the measurement.
 *
 * Units: bytes; bandwidths in GB/s = 1e9 B/s (DRAM and VRAM are sold in
 * decimal units); VRAM sizes in GiB (cards are sold in binary units).
 * The accounting and curve readers allocate temporaries (a per-layer table,
 * cJSON trees) and free them before returning; tdm_proj_json returns a string
 * the caller frees with free(); predict/grid never allocate. No global state.
 * tdm_proj_measure_host runs the bandwidth probe, which pins the OpenMP
 * threads to cores (a side effect on the calling process).
 */
#ifndef TDM_PROJECTION_H
#define TDM_PROJECTION_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "gguf.h"
#include "quant.h"
#include "status.h"

#define TDM_PROJ_NAME_MAX 64
#define TDM_PROJ_HIT_MAX 512 /* points of a tabulated hit curve */
#define TDM_PROJ_GRID_MAX 8  /* rows (DRAM) or columns (VRAM) of a grid */

/* Defaults (docs/PROJECTION.md says where each comes from). */
#define TDM_PROJ_DEFAULT_EFFICIENCY 0.8       /* expert-pool GB/s / probe read GB/s */
#define TDM_PROJ_DEFAULT_VRAM_GBPS 448.0      /* RTX 2070/3070/5060 Ti class */
/* GPU decode kernels vs peak VRAM bandwidth on a ~450 GB/s consumer card: an
 * assumption, not a measurement (docs/PROJECTION.md §4): the H200 reached 0.106
 * of its copy bandwidth, almost all of it a per-token fixed cost of small
 * latency-bound kernels (~4 ms), which on a 448 GB/s card adds to ~4.4 ms of
 * reading and gives ~0.5. */
#define TDM_PROJ_DEFAULT_VRAM_EFFICIENCY 0.5
#define TDM_PROJ_DEFAULT_LATENCY_US 10.0      /* GPU<->CPU hand-off per layer */
#define TDM_PROJ_DEFAULT_ZIPF_S 0.5           /* routing skew when no curve is given */
#define TDM_PROJ_DEFAULT_N_CTX 8192           /* context the KV reserve is sized for */
#define TDM_PROJ_DEFAULT_DECODE_CTX 4096      /* tokens of KV a decoded token attends to */
#define TDM_PROJ_OVERHEAD_BYTES (512ull << 20) /* CUDA context, cuBLAS workspace, activations */

/* Byte accounting of one model, per decoded token unless noted. */
typedef struct tdm_proj_model {
    char name[TDM_PROJ_NAME_MAX]; /* preset name or file base name */
    char arch[32];                /* general.architecture */
    int32_t n_layer;              /* trunk layers run per token (MTP blocks excluded) */
    int32_t n_moe_layer;          /* trunk layers with routed experts */
    int32_t n_expert;             /* routed experts per MoE layer */
    int32_t n_expert_used;        /* k */
    uint64_t slot_bytes;          /* gate+up+down of the largest expert: one cache slot */
    uint64_t active_expert_bytes; /* sum over MoE layers of k x (gate+up+down of one expert) */
    uint64_t total_expert_bytes;  /* every routed expert of every trunk layer (not per token) */
    uint64_t attn_bytes;          /* attention / DeltaNet, norms, routers, dense FFNs: all layers */
    uint64_t shexp_bytes;         /* shared experts and their gates: all layers */
    uint64_t head_bytes;          /* output norm + the full output matrix (full-vocab logits) */
    uint64_t embd_row_bytes;      /* one token-embedding row (read on the host) */
    uint64_t embd_bytes;          /* the embedding table (host-resident; not per token) */
    bool output_tied;             /* no output.weight: the head reads token_embd */
    uint64_t mtp_bytes;           /* MTP blocks (not read by plain decode; not per token) */
    uint64_t kv_bytes_per_ctx;    /* f16 K+V of all attention layers per context token */
    uint64_t state_bytes;         /* f32 conv + recurrent state of all DeltaNet layers */
    uint64_t tensor_bytes;        /* every tensor payload of the file */
} tdm_proj_model;

/* Non-expert weight bytes read per token: attn + shexp + head + embd_row. */
uint64_t tdm_proj_dense_bytes(const tdm_proj_model *m);
/* Non-expert weights the GPU keeps in VRAM: attn + shexp + head (+ the
 * embedding table when the output is tied to it). */
uint64_t tdm_proj_resident_bytes(const tdm_proj_model *m);
/* KV at n_ctx + recurrent state + TDM_PROJ_OVERHEAD_BYTES (the prompt
 * scratch, streaming chunks included, is lent by the slots when the budget
 * is short: forward_gpu.h). */
uint64_t tdm_proj_reserve_bytes(const tdm_proj_model *m, int32_t n_ctx);

/* Accounting from an open GGUF (qwen3moe, qwen3next, qwen35moe or any file
 * with blk.N.ffn_{gate,up,down}_exps tensors). name may be NULL ("model").
 * TDM_ERR_FORMAT for missing metadata, expert tensors of the wrong shape or a
 * layer with an incomplete expert set; TDM_ERR_UNSUPPORTED for no experts. */
tdm_status tdm_proj_model_from_gguf(const tdm_gguf *g, const char *name, tdm_proj_model *out,
                                    tdm_error *err);

/* Accounting from the published shapes and the Q4_K_M type mix of llama-quantize:
 * "qwen35-35b-a3b", "qwen3next-80b-a3b", "qwen3-30b-a3b". TDM_ERR_INVALID for
 * another name (the message lists the known ones). */
tdm_status tdm_proj_model_preset(const char *preset, tdm_proj_model *out, tdm_error *err);
int tdm_proj_preset_count(void);
const char *tdm_proj_preset_name(int i); /* NULL when out of range */

/* llama-quantize's use_more_bits(i, n): layers that get Q6_K in Q4_K_M. */
bool tdm_proj_use_more_bits(int32_t i, int32_t n);

/* ---- hit-rate curve: h(f), f = resident experts / all routed experts ---- */
typedef enum tdm_proj_hit_kind {
    TDM_PROJ_HIT_ZIPF = 0, /* per layer, expert of rank r used with weight r^-s */
    TDM_PROJ_HIT_TABLE     /* piecewise linear through (0,0), points, (1,1) */
} tdm_proj_hit_kind;

typedef struct tdm_proj_hitcurve {
    tdm_proj_hit_kind kind;
    double zipf_s;                  /* ZIPF: skew s >= 0 (0 = uniform routing) */
    int32_t n_expert;               /* ZIPF: experts per layer */
    int32_t n;                      /* TABLE: points */
    double frac[TDM_PROJ_HIT_MAX];  /* TABLE: cached fraction, strictly ascending in (0,1] */
    double hit[TDM_PROJ_HIT_MAX];   /* TABLE: hit rate in [0,1] */
    char source[256];               /* "zipf s=0.5", a file name + policy, ... */
} tdm_proj_hitcurve;

/* Zipf curve: h = H(c, s) / H(E, s), c = f x E, H the generalised harmonic
 * number, linear between integer c. TDM_ERR_INVALID for s < 0 or E < 1. */
tdm_status tdm_proj_hitcurve_zipf(double s, int32_t n_expert, tdm_proj_hitcurve *out,
                                  tdm_error *err);
/* Reads a curve for model m from path, by content:
 * - a tandem expert profile ({"format": "tandem-expert-profile", ...}): the
 *   static cache of the S globally hottest experts, h = their share of the counts;
 * - JSON with an array "points" / "curve" / "results" of objects, each with a
 *   size ("fraction" | "cached_fraction", "slots_per_layer", "slots" | "cache_slots")
 *   and "hit_rate" | "hit", optionally "policy" (policy selects; NULL = the first seen);
 * - CSV with a header naming the same columns.
 * TDM_ERR_IO / TDM_ERR_FORMAT (naming the field) / TDM_ERR_INVALID (policy not found). */
tdm_status tdm_proj_hitcurve_load(const char *path, const char *policy, const tdm_proj_model *m,
                                  tdm_proj_hitcurve *out, tdm_error *err);
/* Same from a NUL-terminated buffer (name is only used in messages and source). */
tdm_status tdm_proj_hitcurve_parse(const char *text, const char *name, const char *policy,
                                   const tdm_proj_model *m, tdm_proj_hitcurve *out,
                                   tdm_error *err);
/* h(f), f clamped to [0, 1]. */
double tdm_proj_hit_rate(const tdm_proj_hitcurve *h, double frac);

/* ---- one projected point ---- */
typedef struct tdm_proj_machine {
    double dram_gbps;        /* host bandwidth: DDR theoretical peak or measured probe read */
    double efficiency;       /* fraction of dram_gbps the expert pool sustains, (0, 1.5] */
    double vram_gbps;        /* GPU memory bandwidth (peak) */
    double vram_efficiency;  /* fraction of vram_gbps the GPU kernels sustain, (0, 1] */
    uint64_t vram_bytes;     /* VRAM budget */
    uint64_t reserve_bytes;  /* KV + state + scratch inside the budget */
    double latency_us;       /* fixed cost per layer hand-off */
    int32_t decode_ctx;      /* KV tokens each decoded token reads (attention layers) */
} tdm_proj_machine;

/* Defaults above; dram_gbps and vram_bytes 0 (the caller sets them). */
void tdm_proj_machine_default(const tdm_proj_model *m, tdm_proj_machine *mc);

typedef enum tdm_proj_bound {
    TDM_PROJ_BOUND_DRAM = 0, /* CPU pool reading missed experts from host RAM */
    TDM_PROJ_BOUND_VRAM,     /* GPU reading weights from VRAM */
    TDM_PROJ_BOUND_LATENCY,  /* per-layer hand-offs dominate */
    TDM_PROJ_BOUND_NOFIT     /* non-expert weights + reserve exceed the budget */
} tdm_proj_bound;

/* "cpu-dram", "gpu-vram", "latency", "no-fit": the largest term of t_token */
const char *tdm_proj_bound_name(tdm_proj_bound b);

typedef struct tdm_proj_point {
    uint64_t cache_bytes;    /* budget - resident - reserve (0 when it does not fit) */
    int64_t slots;           /* cache slots: min(cache_bytes / slot_bytes, all experts) */
    double cached_fraction;  /* slots / all routed experts */
    double hit_rate;         /* h(cached_fraction) */
    double gpu_share;        /* share of routed expert bytes the GPU runs: hit_rate, or 0
                              * when the pool reads faster than the GPU (every expert on it) */
    double cpu_bytes;        /* per token */
    double gpu_bytes;        /* per token: weights + KV at decode_ctx + DeltaNet state read+write */
    double handoffs;         /* expected layers per token with >= 1 miss: n_moe x (1 - h^k) */
    double t_cpu_s, t_gpu_s, t_latency_s;
    double tok_s;            /* 1 / (t_cpu + t_gpu + t_latency); 0 when no-fit */
    double tok_s_overlap;    /* 1 / (max(t_cpu, t_gpu) + t_latency): if the two sides overlapped
                              * completely (the model before the H200 measurement; a ceiling) */
    double tok_s_hits_on_gpu; /* tok_s with gpu_share = hit_rate (as the executor runs) */
    tdm_proj_bound bound;
} tdm_proj_point;

/* TDM_ERR_INVALID for non-positive bandwidths, efficiencies out of range, a
 * model without experts or a NULL argument. */
tdm_status tdm_proj_predict(const tdm_proj_model *m, const tdm_proj_hitcurve *h,
                            const tdm_proj_machine *mc, tdm_proj_point *out, tdm_error *err);

/* ---- the DRAM x VRAM grid that `tandem bench --project` and tools/ddr print ---- */
typedef struct tdm_proj_dram {
    char name[TDM_PROJ_NAME_MAX]; /* "DDR5-5200 dual" or "measured" */
    double gbps;
    bool measured;
    double efficiency;            /* this row's pool efficiency; 0: the grid's base.efficiency */
} tdm_proj_dram;

/* The three dual-channel presets: 2 channels x 8 B x MT/s. */
int tdm_proj_dram_preset_count(void);
const tdm_proj_dram *tdm_proj_dram_preset(int i);

typedef struct tdm_proj_grid {
    int32_t n_dram;
    tdm_proj_dram dram[TDM_PROJ_GRID_MAX];
    int32_t n_vram;
    double vram_gib[TDM_PROJ_GRID_MAX];
    tdm_proj_machine base;             /* everything but dram_gbps and vram_bytes */
    char efficiency_source[32];        /* "default", "user", "measured" */
    int32_t n_ctx;                     /* the KV reserve's context (reported) */
    tdm_proj_point points[TDM_PROJ_GRID_MAX * TDM_PROJ_GRID_MAX]; /* [n_dram][n_vram] */
} tdm_proj_grid;

/* Presets x {8, 12, 16, 24} GiB with tdm_proj_machine_default() (n_ctx 8192). */
void tdm_proj_grid_default(const tdm_proj_model *m, tdm_proj_grid *g);
/* Adds a DRAM row; TDM_ERR_INVALID when full or gbps <= 0. */
tdm_status tdm_proj_grid_add_dram(tdm_proj_grid *g, const char *name, double gbps, bool measured,
                                  tdm_error *err);
/* Fills g->points. */
tdm_status tdm_proj_grid_run(const tdm_proj_model *m, const tdm_proj_hitcurve *h,
                             tdm_proj_grid *g, tdm_error *err);
/* The text table: one row per DRAM, one column per VRAM, "tok/s bound". */
void tdm_proj_grid_print(FILE *f, const tdm_proj_model *m, const tdm_proj_hitcurve *h,
                         const tdm_proj_grid *g);
/* JSON document (format "tandem-projection", version 1; see docs/PROJECTION.md)
 * with the model's accounting, the assumptions and every point, each with
 * "measured_tok_s": null and "rel_error": null for later validation.
 * Caller frees with free(); NULL on OOM. */
char *tdm_proj_json(const tdm_proj_model *m, const tdm_proj_hitcurve *h, const tdm_proj_grid *g);
/* Writes tdm_proj_json() to path. */
tdm_status tdm_proj_json_write(const char *path, const tdm_proj_model *m,
                               const tdm_proj_hitcurve *h, const tdm_proj_grid *g,
                               tdm_error *err);

/* ---- re-validation: the inputs a `tandem bench --validate` JSON recorded ---- */
#define TDM_PROJ_VAL_RUNS_MAX 256

typedef struct tdm_proj_valrun {
    int32_t threads, prompt_tokens, gen_tokens;
    double gpu_mem_gib;       /* the VRAM budget */
    char fill[16];            /* "layer", "profile", "adaptive" */
    double dram_gbps;         /* B_dram at the run's thread count; 0 when null */
    double decode_tok_s;      /* measured */
    double hit_rate;          /* measured decode hit rate (shown, never an input) */
    double cpu_ms, gpu_ms, wait_ms; /* measured per token: pool compute, GPU step, GPU waiting
                                     * for the pool (shown, never an input; 0 when null) */
    int64_t projected_slots;  /* as projected when the file was written; -1 when null */
} tdm_proj_valrun;

typedef struct tdm_proj_valfile {
    char command[1024];                 /* the recorded command line */
    char model_name[TDM_PROJ_NAME_MAX], model_path[512], arch[32];
    uint64_t active_expert_bytes;       /* per token, the file's accounting */
    uint64_t dense_bytes;               /* per token: tdm_proj_dense_bytes of the file */
    double vram_gbps;                   /* B_vram (device copy GB/s) */
    double vram_efficiency;             /* as recorded; 1 when absent (what --validate used) */
    double efficiency;                  /* pool GB/s / B_dram at the largest thread count */
    char efficiency_source[128];
    double latency_us;
    uint64_t reserve_bytes;
    char hit_curve[256];                /* source of the profile/adaptive fills' curve ("" if none) */
    int32_t n_runs;
    tdm_proj_valrun runs[TDM_PROJ_VAL_RUNS_MAX];
} tdm_proj_valfile;

/* Reads a tandem-bench JSON of the hybrid path (`engine_path` "hybrid", with a
 * `validation` object). TDM_ERR_IO for an unreadable file, TDM_ERR_FORMAT
 * naming the field for anything else (a CPU-path file, a missing number, more
 * than TDM_PROJ_VAL_RUNS_MAX runs). name is used in messages only. */
tdm_status tdm_proj_valfile_parse(const char *text, const char *name, tdm_proj_valfile *out,
                                  tdm_error *err);
tdm_status tdm_proj_valfile_load(const char *path, tdm_proj_valfile *out, tdm_error *err);
/* The accounting of the recorded model without its file: the preset named
 * (NULL: the one with the recorded arch and active expert bytes), with the
 * recorded non-expert bytes per token (the difference goes to attn_bytes);
 * note (may be NULL) says what was taken from where. TDM_ERR_INVALID when no
 * preset matches or the recorded bytes do not fit the preset. */
tdm_status tdm_proj_valfile_model(const tdm_proj_valfile *v, const char *preset, tdm_proj_model *out,
                                  char *note, size_t note_cap, tdm_error *err);

/* ---- this host, measured with the bandwidth probe (cpu_experts/membw.h) ---- */
typedef struct tdm_proj_host {
    int threads;            /* pinned threads: every physical core */
    size_t bytes;           /* probe buffers */
    double read_gbps, copy_gbps, triad_gbps; /* medians */
    double matvec_gbps;     /* the engine's Q4_K matvec on 512 x 2048 expert matrices */
    double efficiency;      /* matvec_gbps / read_gbps: the pool's sustained fraction */
} tdm_proj_host;

/* Runs read/copy/triad and the matvec rate on all physical cores (bytes 0:
 * the probe's default 1 GiB; 7 repeats). Errors from the probe pass through. */
tdm_status tdm_proj_measure_host(size_t bytes, tdm_proj_host *out, tdm_error *err);
void tdm_proj_host_print(FILE *f, const tdm_proj_host *h);

/* ---- the front end shared by `tandem bench --project` and tools/ddr ---- */
/* Option help text (one option per line, two-space indent). */
extern const char tdm_proj_cli_usage[];
/* Parses argv[1..] (argv[0] is the command), prints the table and writes
 * --json. default_model is used when neither -m nor --preset is given (NULL:
 * one is required). measure: probe this host unless --membw GBPS or
 * --no-measure (else only with --measure). Returns an exit code: 0 ok,
 * 1 failure, 2 usage error. */
int tdm_proj_cli_run(int argc, char **argv, const char *prog, const char *default_model,
                     bool measure);

#endif
