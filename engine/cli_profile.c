/* tandem profile: runs text through the model, records every routing decision
 * (tdm_session_set_route_hook) and writes an expert-usage profile
 * (profiles/profile.h), optionally the raw routing dump (profiles/routing.h).
 * `tandem profile merge` adds profiles of the same model. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "chat.h"
#include "cli.h"
#include "model.h"
#include "profile.h"
#include "routing.h"
#include "session.h"
#include "tokenizer.h"

const char tdm_cli_profile_help[] =
    "record which experts a text routes to and write an expert-usage profile\n"
    "usage: tandem profile [-m MODEL] (--text-file F | --prompts F.jsonl) -o PROFILE.json\n"
    "                      [--tokens N] [--ctx N] [--dump-routing FILE] [--source TEXT]\n"
    "                      [--device cpu|cuda|auto]\n"
    "       tandem profile merge [-m MODEL] A.json B.json [...] -o C.json\n"
    "  -m MODEL          GGUF model (default: the demo model)\n"
    "  --text-file F     plain text (control tokens like <|im_start|> are parsed),\n"
    "                    evaluated in context-sized windows (each from an empty state)\n"
    "  --prompts F       JSONL, one object a line: {\"messages\": [{\"role\", \"content\"}...]}\n"
    "                    (rendered with the model's chat template and a generation\n"
    "                    prompt) or {\"text\": \"raw prompt\"}; each prompt is evaluated,\n"
    "                    then up to --tokens tokens are generated greedily\n"
    "  --tokens N        prompts: tokens generated per prompt (default 64); text: at most\n"
    "                    N text tokens are processed (default: all)\n"
    "  --ctx N           context size: the text window / prompt + generation (default 512)\n"
    "  --dump-routing F  also write every routing decision, token-major (for cachesim)\n"
    "  --source TEXT     description stored in the profile (default: the input path)\n"
    "  --device D        where the model runs (default cpu; cuda needs the whole model in VRAM;\n"
    "                    the routing is read back after every MoE layer there)\n"
    "  -o PROFILE.json   output\n"
    "merge: adds the counts of profiles made on the same model; a profile of another\n"
    "model is refused (with -m, every input must match MODEL).\n";

/* Routing of one eval call, collected by the hook (calls come layer by layer)
 * and flushed token-major afterwards. */
typedef struct route_buf {
    int32_t n_layer, k, cap_tokens;
    int32_t pos0, n_tokens;     /* window of positions being evaluated */
    int32_t *ids;               /* [cap_tokens * n_layer * k] */
    float *w;                   /* [cap_tokens * n_layer * k] */
    unsigned char *filled;      /* [cap_tokens * n_layer] */
    char error[256];            /* first problem the hook saw ("" = none) */
} route_buf;

typedef struct prof_run {
    tdm_model *model;
    tdm_tokenizer *tk;
    tdm_session *sess;
    tdm_profile *prof;
    tdm_routing_writer *dump;
    route_buf rb;
    int64_t tokens_total;
} prof_run;

static void route_hook(void *user, int32_t pos, int32_t layer, int32_t k, const int32_t *experts,
                       const float *weights)
{
    route_buf *b = user;
    int32_t t = pos - b->pos0;
    if (b->error[0])
        return;
    if (k != b->k || layer < 0 || layer >= b->n_layer || t < 0 || t >= b->n_tokens) {
        snprintf(b->error, sizeof b->error, "unexpected routing call (pos %d, layer %d, k %d; "
                 "window %d+%d, %d layers, k %d)", pos, layer, k, b->pos0, b->n_tokens,
                 b->n_layer, b->k);
        return;
    }
    size_t i = (size_t)t * b->n_layer + layer;
    memcpy(b->ids + i * k, experts, (size_t)k * sizeof *experts);
    memcpy(b->w + i * k, weights, (size_t)k * sizeof *weights);
    b->filled[i] = 1;
}

/* Evaluates tokens and adds their routing to the profile (and the dump);
 * *next: the greedy choice after them (the logits stay on a GPU). */
static tdm_status eval_recorded(prof_run *r, const int32_t *tokens, int32_t n, int32_t *next, tdm_error *err)
{
    route_buf *b = &r->rb;
    b->pos0 = tdm_session_n_past(r->sess);
    b->n_tokens = n;
    memset(b->filled, 0, (size_t)n * b->n_layer);
    tdm_status st = tdm_session_eval_greedy(r->sess, tokens, n, next, err);
    if (st)
        return st;
    if (b->error[0])
        return tdm_error_set(err, TDM_ERR_FORMAT, "%s", b->error);
    for (int32_t t = 0; t < n; t++)
        for (int32_t l = 0; l < b->n_layer; l++) {
            size_t i = (size_t)t * b->n_layer + l;
            if (!b->filled[i])
                continue; /* a dense (non-MoE) layer */
            const int32_t *ids = b->ids + i * b->k;
            const float *w = b->w + i * b->k;
            if ((st = tdm_profile_record(r->prof, l, b->k, ids, w, err)))
                return st;
            if (r->dump && (st = tdm_routing_writer_add(r->dump, b->pos0 + t, l, ids, w, err)))
                return st;
        }
    tdm_profile_add_tokens(r->prof, (uint64_t)n);
    r->tokens_total += n;
    return TDM_OK;
}

static tdm_status encode(const tdm_tokenizer *tk, const char *text, size_t len, int32_t **ids,
                         size_t *n, tdm_error *err)
{
    size_t cap = tdm_tokenizer_encode_bound(len);
    *ids = malloc(cap * sizeof **ids);
    if (!*ids)
        return tdm_error_set(err, TDM_ERR_OOM, "cannot hold %zu tokens", cap);
    tdm_status st = tdm_tokenizer_encode(tk, text, len, TDM_TOKENIZE_PARSE_SPECIAL, *ids, cap, n,
                                         err);
    if (st) {
        free(*ids);
        *ids = NULL;
    }
    return st;
}

static char *slurp(const char *path, size_t *len, tdm_error *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        tdm_error_set(err, TDM_ERR_IO, "%s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap + 1);
    while (b) {
        n += fread(b + n, 1, cap - n, f);
        if (n < cap)
            break;
        char *p = realloc(b, (cap *= 2) + 1);
        if (!p)
            free(b);
        b = p;
    }
    fclose(f);
    if (!b) {
        tdm_error_set(err, TDM_ERR_OOM, "%s: cannot buffer the file", path);
        return NULL;
    }
    b[n] = '\0';
    *len = n;
    return b;
}

static tdm_status run_text(prof_run *r, const char *path, int32_t max_tokens, int32_t n_ctx,
                           tdm_error *err)
{
    size_t len, n = 0;
    char *text = slurp(path, &len, err);
    if (!text)
        return err ? err->code : TDM_ERR_IO;
    int32_t *ids = NULL;
    tdm_status st = encode(r->tk, text, len, &ids, &n, err);
    free(text);
    if (st)
        return tdm_error_wrap(err, "%s", path);
    if (max_tokens > 0 && n > (size_t)max_tokens)
        n = (size_t)max_tokens;
    for (size_t at = 0; at < n && !st; at += (size_t)n_ctx) {
        size_t w = n - at < (size_t)n_ctx ? n - at : (size_t)n_ctx;
        tdm_session_reset(r->sess);
        int32_t next;
        st = eval_recorded(r, ids + at, (int32_t)w, &next, err);
    }
    free(ids);
    return st;
}

/* Renders one JSONL line into prompt text (caller frees). */
static tdm_status prompt_text(const tdm_chat_template *tmpl, const cJSON *o, char **out,
                              tdm_error *err)
{
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(o, "text");
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(o, "messages");
    if (cJSON_IsString(text))
        return (*out = strdup(text->valuestring)) ? TDM_OK
                                                   : tdm_error_set(err, TDM_ERR_OOM, "out of memory");
    int n = cJSON_GetArraySize(msgs);
    if (!cJSON_IsArray(msgs) || n < 1 || n > 256)
        return tdm_error_set(err, TDM_ERR_FORMAT, "needs \"text\" or a non-empty \"messages\" "
                             "array (at most 256)");
    tdm_chat_msg m[256];
    int i = 0;
    for (const cJSON *e = msgs->child; e; e = e->next, i++) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(e, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(e, "content");
        if (!cJSON_IsString(role) || !cJSON_IsString(content))
            return tdm_error_set(err, TDM_ERR_FORMAT, "messages[%d] needs string \"role\" and "
                                 "\"content\"", i);
        m[i] = (tdm_chat_msg){role->valuestring, content->valuestring, NULL};
    }
    size_t len = 0;
    tdm_chat_render(tmpl, m, (size_t)n, true, -1, NULL, 0, &len, NULL);
    if (!(*out = malloc(len + 1)))
        return tdm_error_set(err, TDM_ERR_OOM, "out of memory");
    tdm_status st = tdm_chat_render(tmpl, m, (size_t)n, true, -1, *out, len + 1, &len, err);
    if (st) {
        free(*out);
        *out = NULL;
    }
    return st;
}

static tdm_status run_prompt(prof_run *r, const char *prompt, int32_t gen, int32_t n_ctx,
                             tdm_error *err)
{
    int32_t *ids = NULL;
    size_t n = 0;
    tdm_status st = encode(r->tk, prompt, strlen(prompt), &ids, &n, err);
    if (st)
        return st;
    if (n == 0 || n >= (size_t)n_ctx) {
        free(ids);
        return tdm_error_set(err, TDM_ERR_INVALID, "prompt of %zu tokens does not fit --ctx %d",
                             n, n_ctx);
    }
    tdm_session_reset(r->sess);
    int32_t tok;
    st = eval_recorded(r, ids, (int32_t)n, &tok, err);
    free(ids);
    for (int32_t g = 0; g < gen && !st && tdm_session_n_past(r->sess) < n_ctx; g++) {
        if (tdm_tokenizer_is_eog(r->tk, tok))
            break;
        st = eval_recorded(r, &tok, 1, &tok, err);
    }
    return st;
}

static tdm_status run_prompts(prof_run *r, const char *path, int32_t gen, int32_t n_ctx,
                              tdm_error *err)
{
    tdm_chat_template *tmpl = NULL;
    tdm_status st = tdm_chat_template_from_tokenizer(r->tk, &tmpl, err);
    if (st)
        return st;
    FILE *f = fopen(path, "r");
    if (!f) {
        tdm_chat_template_free(tmpl);
        return tdm_error_set(err, TDM_ERR_IO, "%s: %s", path, strerror(errno));
    }
    char *line = NULL;
    size_t cap = 0;
    int lineno = 0, prompts = 0;
    while (!st && getline(&line, &cap, f) >= 0) {
        lineno++;
        if (strspn(line, " \t\r\n") == strlen(line))
            continue;
        cJSON *o = cJSON_Parse(line);
        char *prompt = NULL;
        if (!cJSON_IsObject(o))
            st = tdm_error_set(err, TDM_ERR_FORMAT, "not a JSON object");
        else
            st = prompt_text(tmpl, o, &prompt, err);
        if (!st)
            st = run_prompt(r, prompt, gen, n_ctx, err);
        if (st)
            tdm_error_wrap(err, "%s:%d", path, lineno);
        prompts++;
        free(prompt);
        cJSON_Delete(o);
    }
    free(line);
    fclose(f);
    tdm_chat_template_free(tmpl);
    if (!st && prompts == 0)
        st = tdm_error_set(err, TDM_ERR_FORMAT, "%s: no prompts", path);
    return st;
}

static tdm_status run_setup(prof_run *r, const char *model, int32_t n_ctx, tdm_device dev, const char *dump,
                            const char *source, tdm_error *err)
{
    tdm_model_id id;
    tdm_status st;
    if ((st = tdm_model_load(model, &r->model, err)) ||
        (st = tdm_tokenizer_open(model, &r->tk, err)) ||
        (st = tdm_profile_model_id(tdm_model_gguf(r->model), &id, err)) ||
        (st = tdm_profile_new(&id, &r->prof, err)) ||
        (st = tdm_profile_set_source(r->prof, source, err)) ||
        (st = tdm_session_new_device(r->model, n_ctx, dev, &r->sess, err)))
        return st;
    if (tdm_model_hparams(r->model)->n_layer != id.n_layer)
        return tdm_error_set(err, TDM_ERR_FORMAT, "model has %d layers, its metadata %d",
                             tdm_model_hparams(r->model)->n_layer, id.n_layer);
    if (dump && (st = tdm_routing_writer_open(dump, &id, &r->dump, err)))
        return st;
    route_buf *b = &r->rb;
    b->n_layer = id.n_layer;
    b->k = id.k;
    b->cap_tokens = n_ctx;
    size_t slots = (size_t)n_ctx * id.n_layer;
    b->ids = malloc(slots * id.k * sizeof *b->ids);
    b->w = malloc(slots * id.k * sizeof *b->w);
    b->filled = malloc(slots);
    if (!b->ids || !b->w || !b->filled)
        return tdm_error_set(err, TDM_ERR_OOM, "cannot hold the routing of %d tokens", n_ctx);
    tdm_session_set_route_hook(r->sess, route_hook, b);
    return TDM_OK;
}

static void run_free(prof_run *r)
{
    tdm_session_free(r->sess);
    tdm_profile_free(r->prof);
    tdm_tokenizer_free(r->tk);
    tdm_model_free(r->model);
    free(r->rb.ids);
    free(r->rb.w);
    free(r->rb.filled);
}


static int profile_merge(int argc, char **argv)
{
    const char *out = NULL, *model = NULL, *in[64];
    int n_in = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-o") && i + 1 < argc)
            out = argv[++i];
        else if (!strcmp(argv[i], "-m") && i + 1 < argc)
            model = argv[++i];
        else if (argv[i][0] != '-' && n_in < 64)
            in[n_in++] = argv[i];
        else {
            fprintf(stderr, "tandem profile merge: unexpected argument '%s'\n%s", argv[i],
                    tdm_cli_profile_help);
            return 2;
        }
    }
    if (!out || n_in < 2) {
        fprintf(stderr, "tandem profile merge: needs at least two inputs and -o\n");
        return 2;
    }
    tdm_error err;
    tdm_model_id want;
    tdm_gguf *g = NULL;
    if (model && (tdm_gguf_open(model, &g, &err) || tdm_profile_model_id(g, &want, &err))) {
        fprintf(stderr, "tandem profile merge: %s\n", err.msg);
        tdm_gguf_free(g);
        return 1;
    }
    tdm_gguf_free(g);
    tdm_profile *acc = NULL;
    char *srcs[64];
    int rc = 0, n_src = 0;
    for (int i = 0; i < n_in && !rc; i++) {
        tdm_profile *p = NULL;
        const tdm_model_id *expect = model ? &want : acc ? tdm_profile_id(acc) : NULL;
        if (tdm_profile_read(in[i], expect, &p, &err) || (acc && tdm_profile_merge(acc, p, &err))) {
            fprintf(stderr, "tandem profile merge: %s\n", err.msg);
            rc = 1;
        }
        if (!rc && (srcs[n_src] = strdup(tdm_profile_source(p)[0] ? tdm_profile_source(p) : in[i])))
            n_src++;
        if (!acc) {
            acc = p;
            p = NULL;
        }
        tdm_profile_free(p);
    }
    /* the merged profile's source lists the inputs' sources */
    char source[1024];
    int used = snprintf(source, sizeof source, "merge of %d profiles:", n_in);
    for (int i = 0; i < n_src && used < (int)sizeof source; i++)
        used += snprintf(source + used, sizeof source - (size_t)used, "%s %s", i ? " +" : "",
                         srcs[i]);
    for (int i = 0; i < n_src; i++)
        free(srcs[i]);
    if (!rc && (tdm_profile_set_source(acc, source, &err) || tdm_profile_write(acc, out, &err))) {
        fprintf(stderr, "tandem profile merge: %s\n", err.msg);
        rc = 1;
    }
    if (!rc)
        fprintf(stderr, "tandem profile merge: %d profiles, %llu tokens -> %s\n", n_in,
                (unsigned long long)tdm_profile_tokens(acc), out);
    tdm_profile_free(acc);
    return rc;
}

int tdm_cli_profile(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "merge"))
        return profile_merge(argc - 1, argv + 1);
    const char *model = NULL, *text = NULL, *prompts = NULL, *out = NULL, *dump = NULL;
    const char *source = NULL;
    int32_t tokens = -1, n_ctx = 512;
    tdm_device dev = TDM_DEVICE_CPU;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true;
        if (!v) {
            ok = false;
        } else if (!strcmp(a, "-m")) {
            model = v;
        } else if (!strcmp(a, "--text-file")) {
            text = v;
        } else if (!strcmp(a, "--prompts")) {
            prompts = v;
        } else if (!strcmp(a, "-o")) {
            out = v;
        } else if (!strcmp(a, "--dump-routing")) {
            dump = v;
        } else if (!strcmp(a, "--source")) {
            source = v;
        } else if (!strcmp(a, "--tokens")) {
            ok = tdm_cli_parse_i32(v, 0, INT32_MAX, &tokens);
        } else if (!strcmp(a, "--ctx")) {
            ok = tdm_cli_parse_i32(v, 2, INT32_MAX, &n_ctx);
        } else if (!strcmp(a, "--device")) {
            ok = tdm_device_parse(v, &dev);
        } else {
            ok = false;
        }
        if (!ok) {
            fprintf(stderr, "tandem profile: bad or unexpected argument '%s'\n%s", a,
                    tdm_cli_profile_help);
            return 2;
        }
        i++;
    }
    if (!text == !prompts || !out) {
        fprintf(stderr, "tandem profile: give one of --text-file and --prompts, and -o\n%s",
                tdm_cli_profile_help);
        return 2;
    }
    prof_run r = {0};
    tdm_error err;
    tdm_status st = run_setup(&r, model ? model : tdm_cli_default_model(), n_ctx, dev, dump,
                              source ? source : text ? text : prompts, &err);
    if (!st && text)
        st = run_text(&r, text, tokens > 0 ? tokens : 0, n_ctx, &err);
    else if (!st)
        st = run_prompts(&r, prompts, tokens >= 0 ? tokens : 64, n_ctx, &err);
    tdm_error cerr;
    tdm_status cst = tdm_routing_writer_close(r.dump, &cerr);
    if (!st && cst) {
        st = cst;
        err = cerr;
    }
    if (!st)
        st = tdm_profile_write(r.prof, out, &err);
    if (st)
        fprintf(stderr, "tandem profile: %s\n", err.msg);
    else
        fprintf(stderr, "tandem profile: %lld tokens x %d layers -> %s%s%s\n",
                (long long)r.tokens_total, r.rb.n_layer, out, dump ? ", routing -> " : "",
                dump ? dump : "");
    run_free(&r);
    return st ? 1 : 0;
}
