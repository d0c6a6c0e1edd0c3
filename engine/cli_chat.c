/* tandem chat: an interactive conversation on stdin/stdout. The session is
 * kept across turns: each turn re-renders the whole conversation, keeps the
 * prefix the session already holds (tdm_session_truncate) and evaluates only
 * the rest. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_gen.h"

const char tdm_cli_chat_help[] =
    "interactive chat (ChatML template of the model), one user message per line on stdin\n"
    "usage: tandem chat [-m MODEL] [-n N] [--temp T --seed S --top-k K --top-p P --min-p P\n"
    "                   --repeat-penalty R] [--no-think] [--threads N] [--ctx N] [--device auto|cpu|cuda]\n"
    "  -n N  tokens per reply at most (default 128). '/reset' starts over; end of input quits.\n"
    "  Per turn a summary (new prompt tokens, reused tokens, tok/s) goes to stderr.";

typedef struct convo {
    tdm_chat_msg *msgs;
    char **owned; /* contents we allocated, parallel to msgs */
    size_t n, cap;
} convo;

static bool convo_add(convo *cv, const char *role, const char *content)
{
    if (cv->n == cv->cap) {
        size_t nc = cv->cap ? 2 * cv->cap : 16;
        tdm_chat_msg *m = realloc(cv->msgs, nc * sizeof *m);
        if (!m)
            return false;
        cv->msgs = m;
        char **o = realloc(cv->owned, nc * sizeof *o);
        if (!o)
            return false;
        cv->owned = o;
        cv->cap = nc;
    }
    char *copy = strdup(content);
    if (!copy)
        return false;
    cv->owned[cv->n] = copy;
    cv->msgs[cv->n++] = (tdm_chat_msg){.role = role, .content = copy};
    return true;
}

static void convo_clear(convo *cv)
{
    for (size_t i = 0; i < cv->n; i++)
        free(cv->owned[i]);
    cv->n = 0;
}

static char *render(cli_gen_ctx *c, const convo *cv, int thinking)
{
    tdm_error err = {0};
    size_t len = 0;
    tdm_chat_render(c->tmpl, cv->msgs, cv->n, true, thinking, NULL, 0, &len, &err);
    char *text = malloc(len + 1);
    if (text && tdm_chat_render(c->tmpl, cv->msgs, cv->n, true, thinking, text, len + 1, &len, &err)) {
        fprintf(stderr, "tandem chat: chat template: %s\n", err.msg);
        free(text);
        return NULL;
    }
    return text;
}

/* One turn: render, reuse the common prefix, generate. false on a hard error. */
static bool turn(cli_gen_ctx *c, convo *cv, const cli_gen_opts *o, char *reply, size_t reply_cap)
{
    char *text = render(c, cv, o->no_think ? 0 : -1);
    int32_t *ids = NULL, n = 0;
    if (!text || !cli_gen_encode(c, text, true, &ids, &n)) {
        free(text);
        return false;
    }
    free(text);
    if (n + 1 > o->ctx) {
        fprintf(stderr, "[the conversation (%d tokens) no longer fits the context of %d: starting over]\n", n, o->ctx);
        free(ids);
        convo_clear(cv);
        tdm_session_reset(c->sess);
        reply[0] = 0;
        return true;
    }
    const int32_t *have = tdm_session_tokens(c->sess);
    int32_t p = 0, n_past = tdm_session_n_past(c->sess);
    while (p < n_past && p < n - 1 && have[p] == ids[p])
        p++;
    int32_t kept = tdm_session_truncate(c->sess, p);
    tdm_sampler_reset(c->smp);
    cli_gen_stats st;
    int32_t room = o->ctx - n;
    bool ok = cli_gen_generate(c, ids, n, kept, o->n_predict < room ? o->n_predict : room, stdout, reply, reply_cap,
                               &st);
    fputc('\n', stdout);
    fflush(stdout);
    if (ok) {
        tdm_session_checkpoint(c->sess);
        fprintf(stderr, "[prompt: %d new tokens (%d reused), %.1f tok/s | generated: %d tokens, %.1f tok/s]\n",
                st.n_prompt, kept, st.t_prompt > 0 ? st.n_prompt / st.t_prompt : 0.0, st.n_gen,
                st.t_gen > 0 ? st.n_gen / st.t_gen : 0.0);
    }
    free(ids);
    return ok;
}

int tdm_cli_chat(int argc, char **argv)
{
    cli_gen_opts o;
    int rc = cli_gen_parse(argc, argv, &o, "chat");
    if (rc)
        return rc;
    cli_gen_ctx c;
    if (!cli_gen_open(&c, &o, true))
        return 1;
    /* replies keep their special tokens (<think>...) so that re-rendering the
     * conversation reproduces the evaluated tokens and the prefix is reused */
    c.detok_flags = TDM_DECODE_SPECIAL;
    convo cv = {0};
    size_t reply_cap = (size_t)o.n_predict * (c.piece_cap + 4) + 64;
    char *reply = malloc(reply_cap), *line = NULL;
    size_t line_cap = 0;
    rc = reply ? 0 : 1;
    while (!rc) {
        fprintf(stderr, "> ");
        ssize_t got = getline(&line, &line_cap, stdin);
        if (got < 0)
            break;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r'))
            line[--got] = 0;
        if (!got)
            continue;
        if (!strcmp(line, "/reset")) {
            convo_clear(&cv);
            tdm_session_reset(c.sess);
            continue;
        }
        if (!convo_add(&cv, "user", line) || !turn(&c, &cv, &o, reply, reply_cap) ||
            (cv.n && !convo_add(&cv, "assistant", reply)))
            rc = 1;
    }
    convo_clear(&cv);
    free(cv.msgs);
    free(cv.owned);
    free(line);
    free(reply);
    if (!cli_gen_finish(&c, &o))
        rc = 1;
    cli_gen_close(&c);
    return rc;
}
