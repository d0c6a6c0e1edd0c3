/* session: one conversation's state over the CPU forward or the resident GPU
 * forward (see session.h).
 *
 * Truncation and the recurrent state: attention KV rows can be cut anywhere
 * (positions >= n_past are simply rewritten later), but DeltaNet conv and
 * recurrent states summarise the whole prefix and cannot be rewound. The
 * session therefore keeps ONE checkpoint of the recurrent state:
 *  - taken automatically at the end of every eval of more than one token (a
 *    prompt: the usual place a later request diverges), and
 *  - on demand with tdm_session_checkpoint() (e.g. after a reply was
 *    generated, so that the next turn resumes after it).
 * Per-token decode steps do not checkpoint (copying the state per token would
 * cost more than the step on large models). tdm_session_truncate(n_keep)
 * returns n_keep for models without recurrent layers; otherwise it restores
 * the checkpoint when it lies at or below n_keep (returning its position; the
 * caller re-evaluates the rest), and resets to 0 when it does not. A
 * checkpoint above the new length is dropped.
 */
#include "session.h"

#include <stdlib.h>
#include <string.h>

#include "forward.h"
#include "forward_gpu.h"
#include "gpu.h"
#include "sampler.h"

struct tdm_session {
    tdm_model *m;
    tdm_forward *f;       /* CPU backend, or NULL */
    tdm_forward_gpu *fg;  /* CUDA backend, or NULL */
    int32_t n_ctx;
    int32_t n_past;
    int32_t *tokens;   /* [n_ctx] */
    float *logits;     /* [n_vocab] of the last evaluated token; owned by fg when fg (page-locked) */
    bool no_logits;    /* the last eval was greedy: logits holds an older token's */
    bool has_rec;      /* the model has recurrent layers */
    float *ckpt[2];    /* [tdm_forward_rec_floats] recurrent state at ckpt_pos: prompt, mark */
    int32_t ckpt_pos[2]; /* -1: none */
};

bool tdm_device_parse(const char *s, tdm_device *out)
{
    static const char *names[] = {"auto", "cpu", "cuda"};
    for (int i = 0; i < 3; i++)
        if (s && !strcmp(s, names[i])) {
            *out = (tdm_device)i;
            return true;
        }
    return false;
}

const char *tdm_device_name(tdm_device d)
{
    return d == TDM_DEVICE_CPU ? "cpu" : d == TDM_DEVICE_CUDA ? "cuda" : "auto";
}

tdm_device tdm_session_device(const tdm_session *s) { return s->fg ? TDM_DEVICE_CUDA : TDM_DEVICE_CPU; }

static size_t rec_floats(const tdm_session *s)
{
    return s->fg ? tdm_forward_gpu_rec_floats(s->fg) : tdm_forward_rec_floats(s->f);
}

tdm_status tdm_session_new(tdm_model *m, int32_t n_ctx, tdm_session **out, tdm_error *err)
{
    return tdm_session_new_device(m, n_ctx, TDM_DEVICE_CPU, out, err);
}

static tdm_status create(tdm_model *m, int32_t n_ctx, tdm_device dev, const tdm_executor_params *xp,
                         tdm_session **out, tdm_error *err)
{
    *out = NULL;
    if (!m || n_ctx <= 0)
        return tdm_error_set(err, TDM_ERR_INVALID, "session: n_ctx %d must be positive", n_ctx);
    const tdm_hparams *hp = tdm_model_hparams(m);
    tdm_session *s = calloc(1, sizeof *s);
    if (!s)
        return tdm_error_set(err, TDM_ERR_OOM, "session");
    s->m = m;
    s->n_ctx = n_ctx;
    s->ckpt_pos[0] = s->ckpt_pos[1] = -1;
    if (dev == TDM_DEVICE_AUTO)
        dev = tdm_gpu_available() ? TDM_DEVICE_CUDA : TDM_DEVICE_CPU;
    tdm_status st = xp ? tdm_forward_gpu_new_hybrid(m, 0, n_ctx, TDM_FORWARD_BATCH_DEFAULT, xp, &s->fg, err)
                    : dev == TDM_DEVICE_CUDA ? tdm_forward_gpu_new(m, 0, n_ctx, TDM_FORWARD_BATCH_DEFAULT, &s->fg, err)
                                             : tdm_forward_new(m, n_ctx, TDM_FORWARD_BATCH_DEFAULT, &s->f, err);
    if (st) {
        free(s);
        return st;
    }
    s->has_rec = hp->n_rec_layers > 0;
    s->tokens = malloc((size_t)n_ctx * sizeof(int32_t));
    if (s->fg) {
        s->logits = tdm_forward_gpu_host_logits(s->fg);
        memset(s->logits, 0, (size_t)hp->n_vocab * sizeof(float));
    } else {
        s->logits = calloc((size_t)hp->n_vocab, sizeof(float));
    }
    for (int i = 0; i < 2; i++)
        s->ckpt[i] = s->has_rec ? malloc(rec_floats(s) * sizeof(float)) : NULL;
    if (!s->tokens || !s->logits || (s->has_rec && (!s->ckpt[0] || !s->ckpt[1]))) {
        tdm_session_free(s);
        return tdm_error_set(err, TDM_ERR_OOM, "session buffers for %d tokens", n_ctx);
    }
    *out = s;
    return TDM_OK;
}

tdm_status tdm_session_new_device(tdm_model *m, int32_t n_ctx, tdm_device dev, tdm_session **out, tdm_error *err)
{
    return create(m, n_ctx, dev, NULL, out, err);
}

tdm_status tdm_session_new_hybrid(tdm_model *m, int32_t n_ctx, const tdm_executor_params *xp, tdm_session **out,
                                  tdm_error *err)
{
    if (!xp) {
        *out = NULL;
        return tdm_error_set(err, TDM_ERR_INVALID, "session: hybrid mode without executor parameters");
    }
    return create(m, n_ctx, TDM_DEVICE_CUDA, xp, out, err);
}

tdm_executor *tdm_session_executor(tdm_session *s) { return s->fg ? tdm_forward_gpu_executor(s->fg) : NULL; }
const tdm_budget *tdm_session_budget(const tdm_session *s) { return s->fg ? tdm_forward_gpu_budget(s->fg) : NULL; }

void tdm_session_free(tdm_session *s)
{
    if (!s)
        return;
    tdm_forward_free(s->f);
    free(s->tokens);
    if (!s->fg)
        free(s->logits);
    tdm_forward_gpu_free(s->fg);
    free(s->ckpt[0]);
    free(s->ckpt[1]);
    free(s);
}

int32_t tdm_session_n_ctx(const tdm_session *s) { return s->n_ctx; }
int32_t tdm_session_n_past(const tdm_session *s) { return s->n_past; }
const int32_t *tdm_session_tokens(const tdm_session *s) { return s->tokens; }
const float *tdm_session_logits(const tdm_session *s) { return s->no_logits ? NULL : s->logits; }
const tdm_model *tdm_session_model(const tdm_session *s) { return s->m; }

void tdm_session_reset(tdm_session *s)
{
    if (s->fg) {
        tdm_error e = {0};
        (void)tdm_forward_gpu_reset(s->fg, &e); /* a device error shows again at the next eval */
    } else {
        tdm_forward_reset(s->f);
    }
    s->n_past = 0;
    s->ckpt_pos[0] = s->ckpt_pos[1] = -1;
}

static void save(tdm_session *s, int which)
{
    if (!s->has_rec)
        return;
    if (s->fg) {
        tdm_error e = {0};
        if (tdm_forward_gpu_rec_save(s->fg, s->ckpt[which], &e)) {
            s->ckpt_pos[which] = -1; /* no checkpoint rather than a wrong one */
            return;
        }
    } else {
        tdm_forward_rec_save(s->f, s->ckpt[which]);
    }
    s->ckpt_pos[which] = s->n_past;
}

void tdm_session_checkpoint(tdm_session *s)
{
    save(s, 1);
}

int32_t tdm_session_truncate(tdm_session *s, int32_t n_keep)
{
    if (n_keep < 0)
        n_keep = 0;
    if (n_keep >= s->n_past)
        return s->n_past;
    if (!s->has_rec) {
        s->n_past = n_keep;
        return n_keep;
    }
    int best = -1;
    for (int i = 0; i < 2; i++)
        if (s->ckpt_pos[i] >= 0 && s->ckpt_pos[i] <= n_keep && (best < 0 || s->ckpt_pos[i] > s->ckpt_pos[best]))
            best = i;
    if (best < 0) {
        tdm_session_reset(s);
        return 0;
    }
    if (s->fg) {
        tdm_error e = {0};
        if (tdm_forward_gpu_rec_load(s->fg, s->ckpt[best], &e)) {
            tdm_session_reset(s);
            return 0;
        }
    } else {
        tdm_forward_rec_load(s->f, s->ckpt[best]);
    }
    s->n_past = s->ckpt_pos[best];
    for (int i = 0; i < 2; i++)
        if (s->ckpt_pos[i] > s->n_past)
            s->ckpt_pos[i] = -1;
    return s->n_past;
}

static tdm_status check_tokens(const tdm_session *s, const int32_t *tokens, int32_t n, tdm_error *err)
{
    if (n <= 0 || !tokens)
        return tdm_error_set(err, TDM_ERR_INVALID, "session eval: %d tokens", n);
    if ((int64_t)s->n_past + n > s->n_ctx)
        return tdm_error_set(err, TDM_ERR_INVALID, "session eval: %d + %d tokens exceed the context of %d",
                             s->n_past, n, s->n_ctx);
    const int32_t n_vocab = tdm_model_hparams(s->m)->n_vocab;
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= n_vocab)
            return tdm_error_set(err, TDM_ERR_INVALID, "session eval: token %d is outside the vocabulary of %d",
                                 tokens[i], n_vocab);
    return TDM_OK;
}

/* After an eval of n tokens: st's failure resets the session (the recurrent
 * state may have advanced part-way), success appends the tokens. */
static tdm_status appended(tdm_session *s, const int32_t *tokens, int32_t n, tdm_status st)
{
    if (st) {
        tdm_session_reset(s);
        return st;
    }
    memcpy(s->tokens + s->n_past, tokens, (size_t)n * sizeof(int32_t));
    s->n_past += n;
    if (n > 1)
        save(s, 0);
    return TDM_OK;
}

tdm_status tdm_session_eval(tdm_session *s, const int32_t *tokens, int32_t n, float *logits_all, tdm_error *err)
{
    tdm_status st = check_tokens(s, tokens, n, err);
    if (st)
        return st;
    float *dst = logits_all ? logits_all : s->logits;
    st = s->fg ? tdm_forward_gpu_eval(s->fg, tokens, n, s->n_past, dst, logits_all != NULL, err)
               : tdm_forward_eval(s->f, tokens, n, s->n_past, dst, logits_all != NULL, err);
    const int32_t n_vocab = tdm_model_hparams(s->m)->n_vocab;
    if (!st && logits_all)
        memcpy(s->logits, logits_all + (size_t)(n - 1) * n_vocab, (size_t)n_vocab * sizeof(float));
    s->no_logits = false;
    return appended(s, tokens, n, st);
}

tdm_status tdm_session_eval_greedy(tdm_session *s, const int32_t *tokens, int32_t n, int32_t *next, tdm_error *err)
{
    tdm_status st = next ? check_tokens(s, tokens, n, err)
                         : tdm_error_set(err, TDM_ERR_INVALID, "session eval_greedy: NULL next");
    if (st)
        return st;
    int32_t choice = 0; /* next may be tokens: written after they are appended */
    if (s->fg) {
        st = tdm_forward_gpu_eval_greedy(s->fg, tokens, n, s->n_past, &choice, err);
    } else {
        st = tdm_forward_eval(s->f, tokens, n, s->n_past, s->logits, false, err);
        if (!st)
            choice = tdm_sampler_argmax(s->logits, tdm_model_hparams(s->m)->n_vocab);
    }
    s->no_logits = true;
    if ((st = appended(s, tokens, n, st)))
        return st;
    *next = choice;
    return TDM_OK;
}

void tdm_session_set_route_hook(tdm_session *s, tdm_route_hook hook, void *user)
{
    if (s->fg)
        tdm_forward_gpu_set_route_hook(s->fg, hook, user);
    else
        tdm_forward_set_route_hook(s->f, hook, user);
}

tdm_forward *tdm_session_forward(tdm_session *s)
{
    if (s->fg && s->n_past == 0) {
        tdm_error e = {0};
        float *logits = calloc((size_t)tdm_model_hparams(s->m)->n_vocab, sizeof(float));
        if (logits && tdm_forward_new(s->m, s->n_ctx, TDM_FORWARD_BATCH_DEFAULT, &s->f, &e) == TDM_OK) {
            tdm_forward_gpu_free(s->fg); /* same recurrent-state layout: checkpoints stay valid */
            s->fg = NULL;
            s->logits = logits; /* fg's page-locked buffer went with it */
        } else {
            free(logits);
        }
    }
    return s->f;
}
