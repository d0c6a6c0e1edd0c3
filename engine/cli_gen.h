/* cli_gen: what `tandem run`, `chat`, `logits` and `generate-ids` share:
 * option parsing, loading model + tokenizer + session + sampler, and the
 * streaming generation loop. Not a command itself (defines no tdm_cli_<name>). */
#ifndef TDM_CLI_GEN_H
#define TDM_CLI_GEN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "chat.h"
#include "cli.h"
#include "executor.h"
#include "model.h"
#include "sampler.h"
#include "session.h"
#include "tokenizer.h"

typedef struct cli_gen_opts {
    const char *model;      /* -m; default tdm_cli_default_model() */
    const char *prompt;     /* -p */
    const char *tokens;     /* --tokens "1,2,3" */
    const char *out;        /* --out */
    bool all;               /* --all */
    int32_t n_predict;      /* -n */
    tdm_sampler_params sp;  /* --temp --seed --top-k --top-p --min-p --repeat-penalty */
    bool chat, no_think;    /* --chat --no-think */
    int threads;            /* --threads; 0 = OpenMP default */
    int32_t ctx;            /* --ctx */
    tdm_device device;      /* --device auto|cpu|cuda (auto: cuda when a GPU is visible) */
    /* the hybrid executor: on the GPU when any of these is given or the model
     * does not fit the free VRAM; --hybrid-emulate runs its GPU side on the host */
    uint64_t gpu_mem;       /* --gpu-mem SIZE; 0: free VRAM minus a reserve */
    int32_t cache_experts;  /* --cache-experts N; -1: from the budget */
    const char *profile;    /* --profile P.json: hottest-first fill */
    int policy;             /* --policy NAME (tdm_cache_policy); -1: static with a profile, layer without */
    int32_t adapt_every;    /* --adapt-every N; 0: the policy default */
    int32_t adapt_swaps;    /* --adapt-swaps N; -1: the policy default */
    float adapt_decay;      /* --adapt-decay F; 0: the policy default */
    int32_t stream_min;     /* --stream-min N; 0: the default, -1 (--stream-min 0): never */
    int32_t zero_copy;      /* --zero-copy N|auto: the direct share (executor.h); -1: auto */
    int32_t prefetch;       /* --prefetch N: decode prefetch slots (executor.h); -1: the default */
    int32_t pool_warm;      /* --pool-warm on|off (executor.h); -1: the default (on) */
    const char *profile_save; /* --profile-save FILE: the run's routing (+ --profile's counts) */
    bool stats;             /* --stats: the executor's line on stderr at the end */
    bool emulate;           /* --hybrid-emulate */
    tdm_expert_memory expert_memory; /* --expert-memory auto|map|copy (cli.h) */
} cli_gen_opts;

/* Usage lines of the options above shared by every generation command
 * (a literal, so help strings can be concatenated with it). */
#define CLI_GEN_HYBRID_HELP \
    "  --gpu-mem SIZE    VRAM budget (12G, 11500M; a bare number is GiB; default: free VRAM minus\n" \
    "                    768 MiB): with --device cuda the routed experts that do not fit are computed\n" \
    "                    by the CPU pool (hybrid executor);\n" \
    "                    a model that does not fit the free VRAM runs hybrid without it\n" \
    "  --cache-experts N expert slots in VRAM instead of what the budget leaves\n" \
    "  --profile P.json  fill the cache hottest-first from an expert-usage profile (tandem profile)\n" \
    "  --policy NAME     static|layer|adaptive|lru|lfu (default: static with a profile, layer without)\n" \
    "  --adapt-every N   adaptive: re-plan every N tokens (default 16)\n" \
    "  --adapt-swaps N   adaptive: at most N swaps per layer and re-plan (default 2)\n" \
    "  --adapt-decay F   adaptive: per-token decay of the use counts (default 0.98)\n" \
    "                    adaptation is off unless --policy adaptive (without a profile its slots are\n" \
    "                    split evenly over the layers so every layer can swap)\n" \
    "  --profile-save F  write the routing seen in this run (added to --profile's) as a profile\n" \
    "  --stream-min N    GPU prompt batches of >= N tokens (default 64; 0: never) send the experts\n" \
    "                    the cache lacks to the GPU in chunks and compute them there, instead of\n" \
    "                    the CPU pool computing every miss of the batch; a longer prompt runs\n" \
    "                    in spans of up to 8 batches layer by layer (each expert sent once)\n" \
    "  --zero-copy N     hybrid decode: the GPU itself reads up to N missed experts per layer from\n" \
    "                    host memory over PCIe (the pool computes the others); auto (default)\n" \
    "                    tunes N on the measured step time every 4 tokens; 0: off; needs the\n" \
    "                    experts in pinned memory: --expert-memory copy (auto picks it)\n" \
    "  --prefetch N      hybrid decode: while the GPU runs the layer before, it reads up to N of\n" \
    "                    the experts a layer's router is predicted to pick and the cache lacks\n" \
    "                    into spare slots (default 2; 0: off); needs the memory --zero-copy needs\n" \
    "  --pool-warm on|off hybrid decode with --prefetch: the CPU pool reads the predicted misses\n" \
    "                    left to it into its caches while the GPU works (default on)\n" \
    "  --threads N       also the CPU pool's threads (default: physical cores - 1)\n" \
    "  --expert-memory M auto (default): copy when the GPU reads misses itself (--zero-copy or\n" \
    "                    --prefetch), else map;\n" \
    "                    map: the CPU reads expert weights in place from the file mapping;\n" \
    "                    copy: copies them once into huge-page memory (local NUMA node, or\n" \
    "                    interleaved over several) for the CPU pool / CPU forward\n" \
    "  --stats           print the executor's line (hit rate, GPU/pool/wait ms, pool GB/s) at the end\n" \
    "  --hybrid-emulate  the same schedule with the GPU side emulated on the host (CPU only)\n"


/* Parses the options above (any order). Returns 0, or 2 after printing a
 * usage error naming the option. */
int cli_gen_parse(int argc, char **argv, cli_gen_opts *o, const char *cmd);

/* For commands with their own parser (serve, bench): the defaults; one
 * option of the thread / expert-cache group (true when a is one of them;
 * *ok false for a bad or missing value v); the group's consistency check
 * (0, or 2 after printing the usage error). */
void cli_gen_opts_init(cli_gen_opts *o);
bool cli_gen_cache_option(const char *a, const char *v, cli_gen_opts *o, bool *ok);
int cli_gen_check(const cli_gen_opts *o, const char *cmd);

typedef struct cli_gen_ctx {
    tdm_model *model;
    tdm_tokenizer *tok;     /* NULL unless loaded */
    tdm_chat_template *tmpl;
    tdm_session *sess;
    tdm_sampler *smp;
    char *piece;            /* detokeniser output, tdm_detok_cap bytes */
    size_t piece_cap;
    unsigned detok_flags;   /* TDM_DECODE_SPECIAL to show <think> etc. (chat) */
    tdm_topology *topo;     /* hybrid: pool pinning */
    tdm_profile *prof;      /* --profile */
    tdm_profile *learn;     /* --profile-save */
    tdm_executor *emu;      /* --hybrid-emulate: the executor on the CPU forward */
    tdm_executor *ex;       /* whichever executor runs (emulated or the session's GPU one), or NULL */
} cli_gen_ctx;

/* At the end of a run: the executor's statistics line to stderr (--stats)
 * and the learned profile (--profile-save). false after printing an error. */
bool cli_gen_finish(const cli_gen_ctx *c, const cli_gen_opts *o);

/* Loads the model (and with_text: tokenizer, chat template, sampler), sets
 * the thread count, creates a session of o->ctx tokens. Prints the error and
 * returns false on failure. */
bool cli_gen_open(cli_gen_ctx *c, const cli_gen_opts *o, bool with_text);
void cli_gen_close(cli_gen_ctx *c);
/* Only the session of cli_gen_open (c->model loaded by the caller, the rest
 * of c zeroed): CPU, GPU or hybrid as the options say. false after printing
 * the error. */
bool cli_gen_open_session(cli_gen_ctx *c, const cli_gen_opts *o);
/* The executor parameters the options and c's topology/profile imply. */
void cli_gen_executor_params(const cli_gen_opts *o, const cli_gen_ctx *c, tdm_executor_params *p);

/* Tokenises text (specials parsed when parse_special) into a fresh array
 * (*ids, caller frees). false after printing the error. */
bool cli_gen_encode(cli_gen_ctx *c, const char *text, bool parse_special, int32_t **ids, int32_t *n);

typedef struct cli_gen_stats {
    int32_t n_prompt, n_gen;
    double t_prompt, t_gen;  /* seconds */
    bool context_full;
} cli_gen_stats;

/* Evaluates prompt[n_reuse..n) on the session (which holds prompt[0..n_reuse)),
 * then samples up to n_predict tokens (stopping at an end-of-generation
 * token, not emitted), writing text to out as it comes and appending it to
 * text (if non-NULL, cap bytes, NUL-terminated). false after printing an error. */
bool cli_gen_generate(cli_gen_ctx *c, const int32_t *prompt, int32_t n, int32_t n_reuse, int32_t n_predict,
                      FILE *out, char *text, size_t cap, cli_gen_stats *st);

double cli_gen_now(void);

#endif
