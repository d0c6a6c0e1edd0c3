/* cli_gen: shared pieces of the generation commands (see cli_gen.h). */
#include "cli_gen.h"

#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "gpu.h"

double cli_gen_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}



static bool cache_opts(const cli_gen_opts *o)
{
    return o->gpu_mem || o->cache_experts >= 0 || o->profile || o->policy >= 0 || o->adapt_every || o->stream_min ||
           o->adapt_swaps >= 0 || o->adapt_decay > 0 || o->profile_save;
}

void cli_gen_opts_init(cli_gen_opts *o)
{
    memset(o, 0, sizeof *o);
    o->model = tdm_cli_default_model();
    o->n_predict = 128;
    o->ctx = 4096;
    o->sp = tdm_sampler_default_params();
    o->cache_experts = -1;
    o->policy = -1;
    o->adapt_swaps = -1;
    o->zero_copy = -1;
    o->prefetch = -1;
    o->pool_warm = -1;
}

/* --gpu-mem: a size with its unit (12G, 11500M), or a bare number of GiB as
 * in bench's --gpu-mem list (a bare 12 meaning 12 bytes helps nobody). */
static bool parse_gpu_mem(const char *v, uint64_t *out)
{
    double gib;
    if (tdm_cli_parse_double(v, 1.0 / 1024, 1 << 20, &gib)) {
        *out = (uint64_t)(gib * 1073741824.0);
        return true;
    }
    return tdm_cli_parse_size(v, out) && *out > 0;
}

bool cli_gen_cache_option(const char *a, const char *v, cli_gen_opts *o, bool *ok)
{
    long l = 0;
    if (!strcmp(a, "--threads") || !strcmp(a, "-t"))
        *ok = tdm_cli_parse_long(v, 1, 4096, &l), o->threads = (int)l;
    else if (!strcmp(a, "--gpu-mem"))
        *ok = parse_gpu_mem(v, &o->gpu_mem);
    else if (!strcmp(a, "--cache-experts"))
        *ok = tdm_cli_parse_long(v, 0, 1 << 30, &l), o->cache_experts = (int32_t)l;
    else if (!strcmp(a, "--profile"))
        *ok = true, o->profile = v;
    else if (!strcmp(a, "--policy"))
        *ok = (o->policy = tdm_cache_policy_parse(v)) >= 0;
    else if (!strcmp(a, "--adapt-every"))
        *ok = tdm_cli_parse_long(v, 1, 1 << 24, &l), o->adapt_every = (int32_t)l;
    else if (!strcmp(a, "--adapt-swaps"))
        *ok = tdm_cli_parse_long(v, 0, 1 << 20, &l), o->adapt_swaps = (int32_t)l;
    else if (!strcmp(a, "--adapt-decay"))
        *ok = tdm_cli_parse_float(v, 1e-6, 1, &o->adapt_decay);
    else if (!strcmp(a, "--profile-save"))
        *ok = true, o->profile_save = v;
    else if (!strcmp(a, "--expert-memory"))
        *ok = tdm_cli_parse_expert_memory(v, &o->expert_memory);
    else if (!strcmp(a, "--stream-min"))
        *ok = tdm_cli_parse_long(v, 0, 1 << 24, &l), o->stream_min = l ? (int32_t)l : -1;
    else if (!strcmp(a, "--zero-copy"))
        *ok = tdm_cli_parse_zero_copy(v, &o->zero_copy);
    else if (!strcmp(a, "--prefetch"))
        *ok = tdm_cli_parse_long(v, 0, 64, &l), o->prefetch = (int32_t)l;
    else if (!strcmp(a, "--pool-warm"))
        *ok = tdm_cli_parse_on_off(v, &o->pool_warm);
    else
        return false;
    if (!v)
        *ok = false;
    return true;
}

int cli_gen_check(const cli_gen_opts *o, const char *cmd)
{
    if (o->emulate && o->cache_experts < 0 && !o->gpu_mem) {
        fprintf(stderr, "tandem %s: --hybrid-emulate needs --cache-experts N or --gpu-mem SIZE\n", cmd);
        return 2;
    }
    if (cache_opts(o) && !o->emulate && o->device == TDM_DEVICE_CPU) {
        fprintf(stderr, "tandem %s: the expert cache options need the GPU (--device cuda) or --hybrid-emulate\n",
                cmd);
        return 2;
    }
    return 0;
}

int cli_gen_parse(int argc, char **argv, cli_gen_opts *o, const char *cmd)
{
    cli_gen_opts_init(o);
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
        } else if (!strcmp(a, "--stats")) {
            o->stats = true, takes = false;
        } else if (!strcmp(a, "--hybrid-emulate")) {
            o->emulate = true, takes = false;
        } else if (!v) {
            fprintf(stderr, "tandem %s: option %s needs a value (or is unknown)\n", cmd, a);
            return 2;
        } else if (cli_gen_cache_option(a, v, o, &ok)) {
            /* parsed */
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
    return cli_gen_check(o, cmd);
}

void cli_gen_executor_params(const cli_gen_opts *o, const cli_gen_ctx *c, tdm_executor_params *p)
{
    tdm_executor_params_init(p);
    p->n_slots = o->cache_experts;
    p->gpu_mem = o->gpu_mem;
    p->n_ctx = o->ctx;
    p->max_batch = TDM_FORWARD_BATCH_DEFAULT;
    p->policy = o->policy;
    p->profile = c->prof;
    p->topo = c->topo;
    p->n_threads = o->threads > 0 ? o->threads : 0;
    p->adapt_every = o->adapt_every;
    p->adapt_swaps = o->adapt_swaps;
    p->adapt_decay = o->adapt_decay;
    p->stream_min = o->stream_min;
    p->direct = o->zero_copy;
    p->prefetch = o->prefetch;
    p->pool_warm = o->pool_warm;
    p->per_layer = o->policy == TDM_CACHE_ADAPTIVE && !c->prof;
    p->learn = c->learn;
}

/* The GPU runs hybrid when an expert-cache option is given, or when the
 * whole model would not fit the free VRAM (the ledger with the default budget). */
static bool wants_hybrid(const cli_gen_opts *o, const cli_gen_ctx *c)
{
    if (cache_opts(o))
        return true;
    tdm_gpu *g = NULL;
    tdm_gpu_info info;
    tdm_error e = {0};
    tdm_budget b;
    bool hyb = false;
    if (!tdm_gpu_create(0, &g, &e) && !tdm_gpu_query(g, &info, &e)) {
        const uint64_t budget = info.mem_free > ((uint64_t)768 << 20) ? info.mem_free - ((uint64_t)768 << 20) : 0;
        hyb = tdm_budget_plan(c->model, o->ctx, TDM_FORWARD_BATCH_DEFAULT, budget, &b, &e) == TDM_OK &&
              b.n_slots < b.in.max_slots;
    }
    tdm_gpu_free(g);
    return hyb;
}

/* --hybrid-emulate: the executor on the CPU forward, the forward's own
 * OpenMP team reduced to the one core the pool leaves free. */
static tdm_status open_emulation(const cli_gen_opts *o, cli_gen_ctx *c, tdm_error *err)
{
    tdm_executor_params p;
    cli_gen_executor_params(o, c, &p);
    tdm_status st = tdm_session_new_device(c->model, o->ctx, TDM_DEVICE_CPU, &c->sess, err);
    if (!st)
        st = tdm_executor_new(c->model, &p, &c->emu, err);
    if (st)
        return st;
    tdm_executor_attach(c->emu, tdm_session_forward(c->sess));
    omp_set_num_threads(1);
    tdm_executor_stats es;
    tdm_executor_get_stats(c->emu, &es);
    if (es.pool_threads < tdm_topology_physical_cores(c->topo))
        tdm_topology_bind_thread(c->topo, es.pool_threads, NULL);
    c->ex = c->emu;
    return TDM_OK;
}

static tdm_status open_session(const cli_gen_opts *o, cli_gen_ctx *c, tdm_error *err)
{
    if (o->threads > 0)
        omp_set_num_threads(o->threads);
    tdm_device dev = o->device == TDM_DEVICE_AUTO ? (tdm_gpu_available() ? TDM_DEVICE_CUDA : TDM_DEVICE_CPU)
                                                  : o->device;
    if (!o->emulate && dev != TDM_DEVICE_CUDA && cache_opts(o))
        return tdm_error_set(err, TDM_ERR_UNSUPPORTED,
                             "the expert cache options need a GPU (none is visible): use --hybrid-emulate");
    const bool hybrid = o->emulate || (dev == TDM_DEVICE_CUDA && wants_hybrid(o, c));
    /* the CPU reads the experts in a hybrid or CPU run; the GPU takes a direct share on a real GPU */
    const tdm_status cs = tdm_cli_place_experts(c->model, o->expert_memory, hybrid || dev == TDM_DEVICE_CPU,
                                                hybrid && !o->emulate && (o->zero_copy != 0 || o->prefetch != 0),
                                                err);
    if (cs)
        return cs;
    if (!hybrid)
        return tdm_session_new_device(c->model, o->ctx, dev, &c->sess, err);
    tdm_status st = tdm_topology_load(&c->topo, err);
    if (!st && o->profile) {
        tdm_model_id id;
        st = tdm_profile_model_id(tdm_model_gguf(c->model), &id, err);
        if (!st)
            st = tdm_profile_read(o->profile, &id, &c->prof, err);
    }
    if (!st && o->profile_save) { /* starts from the loaded profile's counts */
        tdm_model_id id;
        st = tdm_profile_model_id(tdm_model_gguf(c->model), &id, err);
        if (!st)
            st = tdm_profile_new(&id, &c->learn, err);
        if (!st && c->prof)
            st = tdm_profile_merge(c->learn, c->prof, err);
    }
    if (st)
        return st;
    if (o->emulate)
        return open_emulation(o, c, err);
    tdm_executor_params p;
    cli_gen_executor_params(o, c, &p);
    st = tdm_session_new_hybrid(c->model, o->ctx, &p, &c->sess, err);
    if (st)
        return st;
    c->ex = tdm_session_executor(c->sess);
    const tdm_budget *b = tdm_session_budget(c->sess);
    if (b) {
        char line[512];
        tdm_budget_format(b, line, sizeof line);
        fprintf(stderr, "%s\n", line);
    }
    return TDM_OK;
}

bool cli_gen_finish(const cli_gen_ctx *c, const cli_gen_opts *o)
{
    if (o->stats && c->ex) {
        char line[1024];
        tdm_executor_format_stats(c->ex, line, sizeof line);
        fprintf(stderr, "%s\n", line);
    }
    if (!o->profile_save || !c->learn)
        return true;
    tdm_error err = {0};
    tdm_status st = tdm_profile_set_source(c->learn, "tandem --profile-save", &err);
    if (!st)
        st = tdm_profile_write(c->learn, o->profile_save, &err);
    if (st) {
        fprintf(stderr, "tandem: --profile-save %s: %s\n", o->profile_save, err.msg);
        return false;
    }
    fprintf(stderr, "profile: %llu tokens written to %s\n", (unsigned long long)tdm_profile_tokens(c->learn),
            o->profile_save);
    return true;
}

bool cli_gen_open(cli_gen_ctx *c, const cli_gen_opts *o, bool with_text)
{
    memset(c, 0, sizeof *c);
    tdm_error err = {0};
    tdm_status st = tdm_model_load(o->model, &c->model, &err);
    if (!st && with_text)
        st = tdm_tokenizer_load(tdm_model_gguf(c->model), &c->tok, &err);
    if (!st && with_text)
        st = tdm_chat_template_from_tokenizer(c->tok, &c->tmpl, &err);
    if (!st && with_text)
        st = tdm_sampler_new(tdm_model_hparams(c->model)->n_vocab, &o->sp, &c->smp, &err);
    if (!st)
        st = open_session(o, c, &err);
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

bool cli_gen_open_session(cli_gen_ctx *c, const cli_gen_opts *o)
{
    tdm_error err = {0};
    tdm_status st = open_session(o, c, &err);
    if (st)
        fprintf(stderr, "tandem: %s: %s\n", tdm_status_name(st), err.msg);
    return st == TDM_OK;
}

void cli_gen_close(cli_gen_ctx *c)
{
    tdm_executor_free(c->emu); /* before the session whose forward it is attached to */
    tdm_session_free(c->sess);
    tdm_profile_free(c->prof);
    tdm_profile_free(c->learn);
    tdm_topology_free(c->topo);
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
    /* a greedy sampler: each step brings the choice after it (on a GPU the
     * logits stay there); the first comes from the prompt's logits */
    const bool greedy = tdm_sampler_greedy(c->smp);
    int32_t next = -1;
    for (int32_t i = 0; i < n_predict; i++) {
        int32_t t = next >= 0 ? next : tdm_sampler_sample(c->smp, tdm_session_logits(c->sess));
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
        if (greedy ? tdm_session_eval_greedy(c->sess, &t, 1, &next, &err)
                   : tdm_session_eval(c->sess, &t, 1, NULL, &err)) {
            fprintf(stderr, "tandem: decoding: %s\n", err.msg);
            return false;
        }
    }
    size_t len = tdm_detok_flush(&d, c->piece);
    emit(out, text, cap, &tlen, c->piece, len);
    st->t_gen = cli_gen_now() - t1;
    return true;
}
