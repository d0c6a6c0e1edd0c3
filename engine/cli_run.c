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
    "  --device D  cuda = the model on the GPU (hybrid when it does not fit), cpu = the CPU forward\n"
    "              (default: cuda when a GPU is visible)\n"
    "Hybrid executor (routed experts in a VRAM cache + CPU pool):\n"
    CLI_GEN_HYBRID_HELP
    "A one-line summary (prompt and generated tokens, tok/s) goes to stderr.";

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
    cli_gen_opts o;
    int rc = cli_gen_parse(argc, argv, &o, "run");
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
    rc = 1;
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
    rc = cli_gen_finish(&c, &o) ? 0 : 1;
done:
    free(ids);
    cli_gen_close(&c);
    return rc;
}
