/* session: one conversation's state over the CPU forward (see session.h).
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

struct tdm_session {
    tdm_model *m;
    tdm_forward *f;
    int32_t n_ctx;
    int32_t n_past;
    int32_t *tokens;   /* [n_ctx] */
    float *logits;     /* [n_vocab] of the last evaluated token */
    bool has_rec;      /* the model has recurrent layers */
    float *ckpt[2];    /* [tdm_forward_rec_floats] recurrent state at ckpt_pos: prompt, mark */
    int32_t ckpt_pos[2]; /* -1: none */
};

tdm_status tdm_session_new(tdm_model *m, int32_t n_ctx, tdm_session **out, tdm_error *err)
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
    tdm_status st = tdm_forward_new(m, n_ctx, TDM_FORWARD_BATCH_DEFAULT, &s->f, err);
    if (st) {
        free(s);
        return st;
    }
    s->has_rec = hp->n_rec_layers > 0;
    s->tokens = malloc((size_t)n_ctx * sizeof(int32_t));
    s->logits = calloc((size_t)hp->n_vocab, sizeof(float));
    for (int i = 0; i < 2; i++)
        s->ckpt[i] = s->has_rec ? malloc(tdm_forward_rec_floats(s->f) * sizeof(float)) : NULL;
    if (!s->tokens || !s->logits || (s->has_rec && (!s->ckpt[0] || !s->ckpt[1]))) {
        tdm_session_free(s);
        return tdm_error_set(err, TDM_ERR_OOM, "session buffers for %d tokens", n_ctx);
    }
    *out = s;
    return TDM_OK;
}

void tdm_session_free(tdm_session *s)
{
    if (!s)
        return;
    tdm_forward_free(s->f);
    free(s->tokens);
    free(s->logits);
    free(s->ckpt[0]);
    free(s->ckpt[1]);
    free(s);
}

int32_t tdm_session_n_ctx(const tdm_session *s) { return s->n_ctx; }
int32_t tdm_session_n_past(const tdm_session *s) { return s->n_past; }
const int32_t *tdm_session_tokens(const tdm_session *s) { return s->tokens; }
const float *tdm_session_logits(const tdm_session *s) { return s->logits; }
const tdm_model *tdm_session_model(const tdm_session *s) { return s->m; }

void tdm_session_reset(tdm_session *s)
{
    tdm_forward_reset(s->f);
    s->n_past = 0;
    s->ckpt_pos[0] = s->ckpt_pos[1] = -1;
}

static void save(tdm_session *s, int which)
{
    if (!s->has_rec)
        return;
    tdm_forward_rec_save(s->f, s->ckpt[which]);
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
    tdm_forward_rec_load(s->f, s->ckpt[best]);
    s->n_past = s->ckpt_pos[best];
    for (int i = 0; i < 2; i++)
        if (s->ckpt_pos[i] > s->n_past)
            s->ckpt_pos[i] = -1;
    return s->n_past;
}

tdm_status tdm_session_eval(tdm_session *s, const int32_t *tokens, int32_t n, float *logits_all, tdm_error *err)
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
    tdm_status st = tdm_forward_eval(s->f, tokens, n, s->n_past, logits_all ? logits_all : s->logits,
                                     logits_all != NULL, err);
    if (st) {
        /* the recurrent state may have advanced part-way: start over */
        tdm_session_reset(s);
        return st;
    }
    if (logits_all)
        memcpy(s->logits, logits_all + (size_t)(n - 1) * n_vocab, (size_t)n_vocab * sizeof(float));
    memcpy(s->tokens + s->n_past, tokens, (size_t)n * sizeof(int32_t));
    s->n_past += n;
    if (n > 1)
        save(s, 0);
    return TDM_OK;
}

void tdm_session_set_route_hook(tdm_session *s, tdm_route_hook hook, void *user)
{
    tdm_forward_set_route_hook(s->f, hook, user);
}

tdm_forward *tdm_session_forward(tdm_session *s) { return s->f; }
