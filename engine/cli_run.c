/* tandem run: generate text from a prompt on the CPU, streaming to stdout. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_gen.h"
#include "executor.h"
#include "session.h"

const char tdm_cli_run_help[] =
    "generate text from a prompt, streaming to stdout\n"
    "usage: tandem run [-m MODEL] -p PROMPT [-n N] [--temp T --seed S --top-k K --top-p P --min-p P\n"
    "                  --repeat-penalty R] [--chat] [--no-think] [--threads N] [--ctx N]\n"
    "                  [--device auto|cpu|cuda]\n"
    "  -m MODEL    GGUF file (default: the demo model)\n"
    "  -p PROMPT   the prompt (raw text; with --chat it is one user message in the chat template)\n"
    "  -n N        tokens to generate at most (default 128; stops earlier at end-of-generation)\n"
    "  --temp T    0 = greedy (default 0.8); --top-k, --top-p, --min-p, --repeat-penalty, --seed as usual\n"
    "  --no-think  with --chat: render the template with thinking off\n"
    "  --threads N OpenMP threads; --ctx N context tokens (default 4096)\n"
    "  --device D  cuda = the whole model on the GPU, cpu = the CPU forward (default: cuda when a GPU is visible)\n"
    "  --hybrid-emulate  run the routed experts through the hybrid executor, its GPU side emulated on\n"
    "              the host: --cache-experts N slots (or --gpu-mem SIZE through the VRAM budget ledger),\n"
    "              --profile P.json (hottest-first fill), --policy static|layer|adaptive|lru|lfu,\n"
    "              --threads N also sizes the CPU expert pool (default physical cores - 1),\n"
    "              --stats prints the executor's line (hit rate, pool/wait/device ms, GB/s)\n"
    "A one-line summary (prompt and generated tokens, tok/s) goes to stderr.";

typedef struct hybrid_opts {
    bool on, stats;
    int32_t cache_experts;     /* -1: from --gpu-mem */
    uint64_t gpu_mem;
    const char *profile;
    int policy;
} hybrid_opts;

/* Takes the hybrid options out of argv (the rest goes to cli_gen_parse). */
static int hybrid_parse(int *argc, char **argv, hybrid_opts *h)
{
    *h = (hybrid_opts){.cache_experts = -1, .policy = -1};
    int j = 1;
    for (int i = 1; i < *argc; i++) {
        const char *a = argv[i], *v = i + 1 < *argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--hybrid-emulate")) {
            h->on = true;
        } else if (!strcmp(a, "--stats")) {
            h->stats = true;
        } else if (!strcmp(a, "--cache-experts") || !strcmp(a, "--gpu-mem") || !strcmp(a, "--profile") ||
                   !strcmp(a, "--policy")) {
            char *end = NULL;
            long n = v ? strtol(v, &end, 10) : -1;
            if (!v || (!strcmp(a, "--cache-experts") && (*end || n < 0 || n > 1000000000L)) ||
                (!strcmp(a, "--gpu-mem") && !tdm_cli_parse_size(v, &h->gpu_mem)) ||
                (!strcmp(a, "--policy") && (h->policy = tdm_cache_policy_parse(v)) < 0)) {
                fprintf(stderr, "tandem run: bad value for %s: %s\n", a, v ? v : "(missing)");
                return 2;
            }
            if (!strcmp(a, "--cache-experts"))
                h->cache_experts = (int32_t)n;
            if (!strcmp(a, "--profile"))
                h->profile = v;
            i++;
        } else {
            argv[j++] = argv[i];
        }
    }
    *argc = j;
    if ((h->cache_experts >= 0 || h->gpu_mem || h->profile || h->policy >= 0) && !h->on) {
        fprintf(stderr, "tandem run: --cache-experts, --gpu-mem, --profile, --policy need --hybrid-emulate\n");
        return 2;
    }
    if (h->on && h->cache_experts < 0 && !h->gpu_mem) {
        fprintf(stderr, "tandem run: --hybrid-emulate needs --cache-experts N or --gpu-mem SIZE\n");
        return 2;
    }
    return 0;
}

/* Builds the executor and plugs it into the session's forward. */
static bool hybrid_open(const hybrid_opts *h, const cli_gen_opts *o, cli_gen_ctx *c, tdm_topology **topo,
                        tdm_profile **prof, tdm_executor **x)
{
    tdm_error err = {0};
    tdm_status st = tdm_topology_load(topo, &err);
    if (!st && h->profile) {
        tdm_model_id id;
        st = tdm_profile_model_id(tdm_model_gguf(c->model), &id, &err);
        if (!st)
            st = tdm_profile_read(h->profile, &id, prof, &err);
    }
    if (!st) {
        tdm_executor_params p;
        tdm_executor_params_init(&p);
        p.n_slots = h->cache_experts;
        p.gpu_mem = h->gpu_mem;
        p.n_ctx = o->ctx;
        p.max_batch = TDM_FORWARD_BATCH_DEFAULT;
        p.policy = h->policy;
        p.profile = *prof;
        p.topo = *topo;
        p.n_threads = o->threads > 0 ? o->threads : 0;
        if (h->gpu_mem && h->cache_experts < 0) {
            tdm_budget b;
            char line[512];
            st = tdm_budget_plan(c->model, o->ctx, TDM_FORWARD_BATCH_DEFAULT, h->gpu_mem, &b, &err);
            if (!st) {
                tdm_budget_format(&b, line, sizeof line);
                fprintf(stderr, "%s\n", line);
            }
        }
        if (!st)
            st = tdm_executor_new(c->model, &p, x, &err);
    }
    if (st) {
        fprintf(stderr, "tandem run: hybrid executor: %s\n", err.msg);
        return false;
    }
    tdm_executor_attach(*x, tdm_session_forward(c->sess));
    /* The emulated device side (the whole forward but the missed experts) is
     * the GPU-feeding thread: alone on the core the pool leaves free, so no
     * idle OpenMP worker of its spins on a pool core. */
    omp_set_num_threads(1);
    tdm_executor_stats es;
    tdm_executor_get_stats(*x, &es);
    if (es.pool_threads < tdm_topology_physical_cores(*topo))
        tdm_topology_bind_thread(*topo, es.pool_threads, NULL);
    return true;
}

/* Prompt text to token ids, through the chat template with --chat. */
static bool build_prompt(cli_gen_ctx *c, const cli_gen_opts *o, int32_t **ids, int32_t *n)
{
    if (!o->chat)
        return cli_gen_encode(c, o->prompt, false, ids, n);
    tdm_chat_msg msg = {.role = "user", .content = o->prompt};
    tdm_error err = {0};
    size_t len = 0;
    int thinking = o->no_think ? 0 : -1;
    tdm_chat_render(c->tmpl, &msg, 1, true, thinking, NULL, 0, &len, &err);
    char *text = malloc(len + 1);
    if (!text)
        return false;
    if (tdm_chat_render(c->tmpl, &msg, 1, true, thinking, text, len + 1, &len, &err)) {
        fprintf(stderr, "tandem run: chat template: %s\n", err.msg);
        free(text);
        return false;
    }
    bool ok = cli_gen_encode(c, text, true, ids, n);
    free(text);
    return ok;
}

int tdm_cli_run(int argc, char **argv)
{
    hybrid_opts h;
    int rc = hybrid_parse(&argc, argv, &h);
    if (rc)
        return rc;
    cli_gen_opts o;
    rc = cli_gen_parse(argc, argv, &o, "run");
    if (rc)
        return rc;
    if (!o.prompt) {
        fprintf(stderr, "tandem run: -p PROMPT is required\n");
        return 2;
    }
    cli_gen_ctx c;
    if (!cli_gen_open(&c, &o, true))
        return 1;
    int32_t *ids = NULL, n = 0;
    tdm_topology *topo = NULL;
    tdm_profile *prof = NULL;
    tdm_executor *x = NULL;
    rc = 1;
    if (h.on && !hybrid_open(&h, &o, &c, &topo, &prof, &x))
        goto done;
    if (!build_prompt(&c, &o, &ids, &n))
        goto done;
    if (n == 0) {
        fprintf(stderr, "tandem run: the prompt is empty after tokenisation\n");
        goto done;
    }
    if (n >= o.ctx) {
        fprintf(stderr, "tandem run: the prompt has %d tokens, the context only %d (--ctx)\n", n, o.ctx);
        goto done;
    }
    cli_gen_stats st;
    if (!o.chat)
        fputs(o.prompt, stdout);
    if (!cli_gen_generate(&c, ids, n, 0, o.n_predict, stdout, NULL, 0, &st))
        goto done;
    fputc('\n', stdout);
    fflush(stdout);
    fprintf(stderr, "prompt: %d tokens, %.1f tok/s | generated: %d tokens, %.1f tok/s%s\n", st.n_prompt,
            st.t_prompt > 0 ? st.n_prompt / st.t_prompt : 0.0, st.n_gen, st.t_gen > 0 ? st.n_gen / st.t_gen : 0.0,
            st.context_full ? " (context full)" : "");
    if (x && h.stats) {
        char line[768];
        tdm_executor_format_stats(x, line, sizeof line);
        fprintf(stderr, "%s\n", line);
    }
    rc = 0;
done:
    free(ids);
    tdm_executor_free(x); /* before the session it is attached to */
    cli_gen_close(&c);
    tdm_profile_free(prof);
    tdm_topology_free(topo);
    return rc;
}
