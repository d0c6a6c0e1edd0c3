/* cli_gen: shared pieces of the generation commands (see cli_gen.h). */
#include "cli_gen.h"

#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

double cli_gen_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}



int cli_gen_parse(int argc, char **argv, cli_gen_opts *o, const char *cmd)
{
    memset(o, 0, sizeof *o);
    o->model = tdm_cli_default_model();
    o->n_predict = 128;
    o->ctx = 4096;
    o->sp = tdm_sampler_default_params();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        long l = 0;
        bool ok = true, takes = true;
        if (!strcmp(a, "--chat")) {
            o->chat = true, takes = false;
        } else if (!strcmp(a, "--no-think")) {
            o->no_think = true, takes = false;
        } else if (!strcmp(a, "--all")) {
            o->all = true, takes = false;
        } else if (!v) {
            fprintf(stderr, "tandem %s: option %s needs a value (or is unknown)\n", cmd, a);
            return 2;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            o->model = v;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            o->prompt = v;
        } else if (!strcmp(a, "--tokens")) {
            o->tokens = v;
        } else if (!strcmp(a, "--out") || !strcmp(a, "-o")) {
            o->out = v;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
            ok = tdm_cli_parse_long(v, 0, 1 << 24, &l), o->n_predict = (int32_t)l;
        } else if (!strcmp(a, "--threads") || !strcmp(a, "-t")) {
            ok = tdm_cli_parse_long(v, 1, 4096, &l), o->threads = (int)l;
        } else if (!strcmp(a, "--device")) {
            ok = tdm_device_parse(v, &o->device);
        } else if (!strcmp(a, "--ctx") || !strcmp(a, "-c")) {
            ok = tdm_cli_parse_long(v, 1, 1 << 24, &l), o->ctx = (int32_t)l;
        } else if (!strcmp(a, "--seed")) {
            char *end;
            errno = 0;
            o->sp.seed = strtoull(v, &end, 10);
            ok = end != v && !*end && !errno;
        } else if (!strcmp(a, "--temp")) {
            ok = tdm_cli_parse_float(v, 0, 100, &o->sp.temperature);
        } else if (!strcmp(a, "--top-k")) {
            ok = tdm_cli_parse_long(v, 0, 1 << 24, &l), o->sp.top_k = (int32_t)l;
        } else if (!strcmp(a, "--top-p")) {
            ok = tdm_cli_parse_float(v, 0, 1, &o->sp.top_p);
        } else if (!strcmp(a, "--min-p")) {
            ok = tdm_cli_parse_float(v, 0, 1, &o->sp.min_p);
        } else if (!strcmp(a, "--repeat-penalty")) {
            ok = tdm_cli_parse_float(v, 0.01, 100, &o->sp.repeat_penalty);
        } else {
            fprintf(stderr, "tandem %s: unknown option %s\n", cmd, a);
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "tandem %s: bad value '%s' for %s\n", cmd, v, a);
            return 2;
        }
        if (takes)
            i++;
    }
    return 0;
}

bool cli_gen_open(cli_gen_ctx *c, const cli_gen_opts *o, bool with_text)
{
    memset(c, 0, sizeof *c);
    if (o->threads > 0)
        omp_set_num_threads(o->threads);
    tdm_error err = {0};
    tdm_status st = tdm_model_load(o->model, &c->model, &err);
    if (!st && with_text)
        st = tdm_tokenizer_load(tdm_model_gguf(c->model), &c->tok, &err);
    if (!st && with_text)
        st = tdm_chat_template_from_tokenizer(c->tok, &c->tmpl, &err);
    if (!st && with_text)
        st = tdm_sampler_new(tdm_model_hparams(c->model)->n_vocab, &o->sp, &c->smp, &err);
    if (!st)
        st = tdm_session_new_device(c->model, o->ctx, o->device, &c->sess, &err);
    if (!st && with_text) {
        c->piece_cap = tdm_detok_cap(c->tok) + TDM_DETOK_FLUSH_MAX + 1;
        c->piece = malloc(c->piece_cap);
        if (!c->piece)
            st = tdm_error_set(&err, TDM_ERR_OOM, "detokeniser buffer");
    }
    if (st) {
        fprintf(stderr, "tandem: %s: %s\n", tdm_status_name(st), err.msg);
        cli_gen_close(c);
        return false;
    }
    return true;
}

void cli_gen_close(cli_gen_ctx *c)
{
    tdm_session_free(c->sess);
    tdm_sampler_free(c->smp);
    tdm_chat_template_free(c->tmpl);
    tdm_tokenizer_free(c->tok);
    tdm_model_free(c->model);
    free(c->piece);
    memset(c, 0, sizeof *c);
}

bool cli_gen_encode(cli_gen_ctx *c, const char *text, bool parse_special, int32_t **ids, int32_t *n)
{
    size_t len = strlen(text), cap = tdm_tokenizer_encode_bound(len), got = 0;
    *ids = malloc((cap ? cap : 1) * sizeof(int32_t));
    if (!*ids) {
        fprintf(stderr, "tandem: out of memory tokenising %zu bytes\n", len);
        return false;
    }
    tdm_error err = {0};
    tdm_status st = tdm_tokenizer_encode(c->tok, text, len, parse_special ? TDM_TOKENIZE_PARSE_SPECIAL : 0, *ids,
                                         cap, &got, &err);
    if (st) {
        fprintf(stderr, "tandem: tokenising the prompt: %s\n", err.msg);
        free(*ids);
        *ids = NULL;
        return false;
    }
    *n = (int32_t)got;
    return true;
}

static void emit(FILE *out, char *text, size_t cap, size_t *tlen, const char *p, size_t len)
{
    if (!len)
        return;
    if (out) {
        fwrite(p, 1, len, out);
        fflush(out);
    }
    if (text && *tlen + len < cap) {
        memcpy(text + *tlen, p, len);
        *tlen += len;
        text[*tlen] = 0;
    }
}

bool cli_gen_generate(cli_gen_ctx *c, const int32_t *prompt, int32_t n, int32_t n_reuse, int32_t n_predict,
                      FILE *out, char *text, size_t cap, cli_gen_stats *st)
{
    memset(st, 0, sizeof *st);
    tdm_error err = {0};
    if (text && cap)
        text[0] = 0;
    size_t tlen = 0;
    st->n_prompt = n - n_reuse;
    double t0 = cli_gen_now();
    if (n > n_reuse && tdm_session_eval(c->sess, prompt + n_reuse, n - n_reuse, NULL, &err)) {
        fprintf(stderr, "tandem: evaluating the prompt: %s\n", err.msg);
        return false;
    }
    st->t_prompt = cli_gen_now() - t0;
    for (int32_t i = 0; i < n; i++)
        tdm_sampler_accept(c->smp, prompt[i]);
    tdm_detok d;
    tdm_detok_init(&d, c->detok_flags);
    double t1 = cli_gen_now();
    for (int32_t i = 0; i < n_predict; i++) {
        int32_t t = tdm_sampler_sample(c->smp, tdm_session_logits(c->sess));
        if (tdm_tokenizer_is_eog(c->tok, t))
            break;
        tdm_sampler_accept(c->smp, t);
        st->n_gen++;
        size_t len = 0;
        if (tdm_detok_push(&d, c->tok, t, c->piece, c->piece_cap, &len, &err)) {
            fprintf(stderr, "tandem: detokenising %d: %s\n", t, err.msg);
            return false;
        }
        emit(out, text, cap, &tlen, c->piece, len);
        if (i + 1 == n_predict)
            break;
        if (tdm_session_n_past(c->sess) >= tdm_session_n_ctx(c->sess)) {
            st->context_full = true;
            break;
        }
        if (tdm_session_eval(c->sess, &t, 1, NULL, &err)) {
            fprintf(stderr, "tandem: decoding: %s\n", err.msg);
            return false;
        }
    }
    size_t len = tdm_detok_flush(&d, c->piece);
    emit(out, text, cap, &tlen, c->piece, len);
    st->t_gen = cli_gen_now() - t1;
    return true;
}
