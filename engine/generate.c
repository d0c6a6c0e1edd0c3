/* generate: request-level generation (see generate.h).
 *
 * Text pipeline per sampled token:
 *   detokeniser (complete UTF-8) -> [answer: grace cut, stop-string holdback]
 *   -> whitespace trim (leading at a part's start, trailing held until more
 *   text follows) -> [answer: fence scanner] -> on_text.
 *
 * Prefix reuse with recurrent (DeltaNet) layers: the session keeps one
 * checkpoint of the recurrent state, taken after a multi-token eval. The
 * prompt is therefore evaluated in two steps: everything before the last
 * <|im_start|> (the generation prompt's header) in one batch, which leaves
 * the checkpoint there, then the few header tokens one at a time. The next
 * request of the same conversation (or the same prompt again) diverges after
 * that point, so it restores the checkpoint and evaluates only the rest.
 */
#include "generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat.h"
#include "sampler.h"
#include "session.h"
#include "tokenizer.h"

#define WS_CAP 256          /* trailing whitespace held back per part */
#define FORCED_MAX 8        /* tokens of "</think>\n\n" */
#define SINGLE_STEP_MAX 32  /* prompt tails up to this are evaluated token by token */

struct tdm_generator {
    tdm_model *m;
    tdm_session *sess;
    tdm_tokenizer *tk;
    tdm_chat_template *tmpl;  /* NULL when the template is not supported */
    tdm_error tmpl_err;
    int32_t n_ctx;
    int32_t n_vocab;
    bool recurrent;
    int32_t tok_think, tok_think_end, tok_im_start; /* -1 when absent */
    int32_t forced[FORCED_MAX]; /* "</think>" "\n\n" */
    int32_t n_forced;
    int32_t *ids;             /* [n_ctx] prompt ids */
    char *piece;              /* [piece_cap] one detokenised token */
    size_t piece_cap;
    int32_t *eog;             /* [n_eog] end-of-generation ids */
    int32_t n_eog;
    float *masked;            /* [n_vocab] logits with the EOG ids masked (ignore_eog) */
    char *hold;               /* [hold_cap] answer bytes that may start a stop string */
    size_t hold_cap;
    char ws[WS_CAP];          /* held trailing whitespace */
};

/* ---- small pure helpers ---- */

const char *tdm_gen_finish_name(tdm_gen_finish f)
{
    static const char *names[] = {"eog", "stop", "length", "context", "cancelled"};
    return (unsigned)f < sizeof names / sizeof names[0] ? names[f] : "?";
}

void tdm_gen_params_default(tdm_gen_params *p)
{
    tdm_sampler_params sp = tdm_sampler_default_params();
    *p = (tdm_gen_params){0};
    p->max_tokens = -1;
    p->max_thinking_tokens = -1;
    p->grace_tokens = TDM_GEN_GRACE_DEFAULT;
    p->temperature = sp.temperature;
    p->top_p = sp.top_p;
    p->min_p = sp.min_p;
    p->top_k = sp.top_k;
    p->repeat_penalty = 1.0f;
    p->repair_fences = true;
}

static bool is_ws(char c)
{
    return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

bool tdm_gen_sentence_ended(const char *text, size_t len)
{
    if (len == 0 || text[len - 1] == '\n')
        return true;
    while (len && is_ws(text[len - 1]))
        len--;
    if (len == 0)
        return true;
    char c = text[len - 1];
    return c == '.' || c == '!' || c == '?';
}

size_t tdm_utf8_complete_len(const char *text, size_t len)
{
    /* walk back over at most 3 continuation bytes to the last lead byte */
    size_t i = len, back = 0;
    while (i > 0 && back < 4 && ((unsigned char)text[i - 1] & 0xC0) == 0x80) {
        i--;
        back++;
    }
    if (i == 0)
        return len; /* only continuation bytes: nothing to wait for */
    unsigned char lead = (unsigned char)text[i - 1];
    size_t need = lead < 0x80 ? 1 : (lead >> 5) == 6 ? 2 : (lead >> 4) == 14 ? 3 : (lead >> 3) == 30 ? 4 : 1;
    return back + 1 < need ? i - 1 : len;
}

/* ---- fences ---- */

enum { F_LINE_START = 0, F_TICKS, F_AFTER_OPEN_RUN, F_CLOSE_TAIL, F_REST };

void tdm_fence_init(tdm_fence_state *f)
{
    *f = (tdm_fence_state){0};
    f->last_nl = 1;
}

/* The line's leading backtick run ended (at c, or at the line end when c is '\n'). */
static void fence_run_end(tdm_fence_state *f, char c)
{
    if (f->run >= 3 && f->open_len == 0) {
        f->open_len = f->run; /* an opening fence; the rest is its info string */
        f->phase = F_REST;
    } else if (f->run >= f->open_len && f->open_len > 0 && (c == ' ' || c == '\t' || c == '\n')) {
        f->phase = F_CLOSE_TAIL; /* closes if only blanks follow */
    } else {
        f->phase = F_REST;
    }
}

void tdm_fence_feed(tdm_fence_state *f, const char *text, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (c == '\n') {
            if (f->phase == F_TICKS)
                fence_run_end(f, c);
            if (f->phase == F_CLOSE_TAIL)
                f->open_len = 0;
            f->phase = F_LINE_START;
            f->run = f->indent = 0;
            f->last_nl = 1;
            continue;
        }
        f->last_nl = 0;
        switch (f->phase) {
        case F_LINE_START:
            if (c == ' ' && f->indent < 3) {
                f->indent++;
            } else if (c == '`') {
                f->run = 1;
                f->phase = F_TICKS;
            } else {
                f->phase = F_REST;
            }
            break;
        case F_TICKS:
            if (c == '`')
                f->run++;
            else
                fence_run_end(f, c);
            break;
        case F_CLOSE_TAIL:
            if (c != ' ' && c != '\t')
                f->phase = F_REST;
            break;
        default:
            break;
        }
    }
}

size_t tdm_fence_closer(const tdm_fence_state *f, char *buf, size_t cap)
{
    if (cap == 0)
        return 0;
    buf[0] = '\0';
    bool open = f->open_len > 0;
    if (open && (f->phase == F_CLOSE_TAIL || (f->phase == F_TICKS && f->run >= f->open_len)))
        open = false; /* the text ends on a closing fence line */
    if (!open)
        return 0;
    size_t n = 0, ticks = (size_t)(f->open_len < 64 ? f->open_len : 64);
    if (!f->last_nl && n + 1 < cap)
        buf[n++] = '\n';
    for (size_t k = 0; k < ticks && n + 1 < cap; k++)
        buf[n++] = '`';
    buf[n] = '\0';
    return n;
}

/* ---- lifecycle ---- */

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int32_t tdm_generator_default_ctx(const tdm_model *m)
{
    const tdm_hparams *hp = tdm_model_hparams(m);
    return hp->n_ctx_train > 0 && hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096;
}

tdm_status tdm_generator_new(tdm_model *m, int32_t n_ctx, tdm_device dev, tdm_generator **out, tdm_error *err)
{
    *out = NULL;
    if (!m)
        return tdm_error_set(err, TDM_ERR_INVALID, "generator: no model");
    tdm_session *sess = NULL;
    tdm_status st = tdm_session_new_device(m, n_ctx > 0 ? n_ctx : tdm_generator_default_ctx(m), dev, &sess, err);
    if (st)
        return tdm_error_wrap(err, "generator");
    return tdm_generator_new_session(m, sess, out, err);
}

tdm_status tdm_generator_new_session(tdm_model *m, tdm_session *sess, tdm_generator **out, tdm_error *err)
{
    *out = NULL;
    if (!m || !sess || tdm_session_model(sess) != m) {
        tdm_session_free(sess);
        return tdm_error_set(err, TDM_ERR_INVALID, "generator: no model, or a session of another model");
    }
    const tdm_hparams *hp = tdm_model_hparams(m);
    const int32_t n_ctx = tdm_session_n_ctx(sess);
    tdm_generator *g = calloc(1, sizeof *g);
    if (!g) {
        tdm_session_free(sess);
        return tdm_error_set(err, TDM_ERR_OOM, "generator");
    }
    g->m = m;
    g->sess = sess;
    g->n_ctx = n_ctx;
    g->n_vocab = hp->n_vocab;
    g->recurrent = hp->n_rec_layers > 0;
    tdm_status st = tdm_tokenizer_load(tdm_model_gguf(m), &g->tk, err);
    if (st != TDM_OK) {
        tdm_generator_free(g);
        return tdm_error_wrap(err, "generator");
    }
    if (tdm_chat_template_from_tokenizer(g->tk, &g->tmpl, &g->tmpl_err) != TDM_OK) {
        g->tmpl = NULL; /* raw completions still work; chat requests report why */
        tdm_log(TDM_LOG_WARN, "generator: chat template: %s", g->tmpl_err.msg);
    }
    g->tok_think = tdm_tokenizer_find(g->tk, "<think>");
    g->tok_think_end = tdm_tokenizer_find(g->tk, "</think>");
    g->tok_im_start = tdm_tokenizer_find(g->tk, "<|im_start|>");
    if (g->tok_think_end >= 0) {
        g->forced[g->n_forced++] = g->tok_think_end;
        size_t n = 0;
        if (tdm_tokenizer_encode(g->tk, "\n\n", 2, 0, g->forced + 1, FORCED_MAX - 1, &n, NULL) == TDM_OK)
            g->n_forced += (int32_t)n;
    }
    g->piece_cap = tdm_detok_cap(g->tk) + TDM_DETOK_FLUSH_MAX;
    g->hold_cap = TDM_GEN_STOP_LEN_MAX + g->piece_cap + 8;
    for (int32_t id = 0; id < g->n_vocab; id++)
        g->n_eog += tdm_tokenizer_is_eog(g->tk, id);
    g->eog = malloc(((size_t)g->n_eog + 1) * sizeof *g->eog);
    g->masked = malloc((size_t)g->n_vocab * sizeof *g->masked);
    if (g->eog) {
        g->n_eog = 0;
        for (int32_t id = 0; id < g->n_vocab; id++)
            if (tdm_tokenizer_is_eog(g->tk, id))
                g->eog[g->n_eog++] = id;
    }
    g->ids = malloc((size_t)n_ctx * sizeof *g->ids);
    g->piece = malloc(g->piece_cap);
    g->hold = malloc(g->hold_cap);
    if (!g->ids || !g->piece || !g->hold || !g->eog || !g->masked) {
        tdm_generator_free(g);
        return tdm_error_set(err, TDM_ERR_OOM, "generator buffers for %d tokens", n_ctx);
    }
    *out = g;
    return TDM_OK;
}

void tdm_generator_free(tdm_generator *g)
{
    if (!g)
        return;
    tdm_session_free(g->sess);
    tdm_chat_template_free(g->tmpl);
    tdm_tokenizer_free(g->tk);
    free(g->ids);
    free(g->eog);
    free(g->masked);
    free(g->piece);
    free(g->hold);
    free(g);
}

int32_t tdm_generator_n_ctx(const tdm_generator *g)
{
    return g->n_ctx;
}

/* ---- one run ---- */

typedef struct run {
    tdm_generator *g;
    const tdm_gen_params *p;
    const tdm_gen_callbacks *cb;
    tdm_gen_result *res;
    bool raw;               /* completions: no thinking, no trimming, no repair */
    tdm_gen_part part;      /* the part being produced */
    bool started[2];        /* the part has emitted non-blank text */
    size_t n_ws;            /* held whitespace in g->ws */
    size_t n_hold;          /* bytes in g->hold */
    bool stopped;           /* a stop string matched */
    char last_char, last_nonws; /* of the answer so far, for the grace rule */
    tdm_fence_state fence;
    tdm_detok detok;
    bool greedy;            /* the sampler takes the argmax: steps choose on the device (step) */
    int32_t next;           /* greedy: the choice after the session's last token; -1: from the logits */
} run;

static void out_text(run *r, tdm_gen_part part, const char *t, size_t n)
{
    if (n == 0)
        return;
    if (part == TDM_GEN_ANSWER)
        tdm_fence_feed(&r->fence, t, n);
    if (r->cb && r->cb->on_text)
        r->cb->on_text(r->cb->user, part, t, n);
}

/* Whitespace trimming: drop it at a part's start, hold it at the end. */
static void emit(run *r, tdm_gen_part part, const char *t, size_t n)
{
    if (r->raw) {
        out_text(r, part, t, n);
        return;
    }
    if (!r->started[part]) {
        while (n && is_ws(*t))
            t++, n--;
        if (n == 0)
            return;
        r->started[part] = true;
    }
    size_t k = n;
    while (k && is_ws(t[k - 1]))
        k--;
    if (k > 0) {
        out_text(r, part, r->g->ws, r->n_ws);
        r->n_ws = 0;
        out_text(r, part, t, k);
    }
    for (size_t i = k; i < n; i++) {
        if (r->n_ws == WS_CAP) { /* a long blank run: let it through */
            out_text(r, part, r->g->ws, r->n_ws);
            r->n_ws = 0;
        }
        r->g->ws[r->n_ws++] = t[i];
    }
}

/* Longest k < strlen(stop) such that the held text ends with stop[0..k). */
static size_t stop_prefix_held(const char *h, size_t n, const char *stop)
{
    size_t sl = strlen(stop);
    for (size_t k = sl - 1 < n ? sl - 1 : n; k > 0; k--)
        if (!memcmp(h + n - k, stop, k))
            return k;
    return 0;
}

static void answer_text(run *r, const char *t, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        r->last_char = t[i];
        if (!is_ws(t[i]))
            r->last_nonws = t[i];
    }
    if (r->p->n_stop == 0) {
        emit(r, TDM_GEN_ANSWER, t, n);
        return;
    }
    tdm_generator *g = r->g;
    memcpy(g->hold + r->n_hold, t, n); /* n <= piece_cap and n_hold < STOP_LEN_MAX */
    r->n_hold += n;
    size_t best = SIZE_MAX;
    for (int32_t i = 0; i < r->p->n_stop; i++) {
        const char *s = r->p->stop[i];
        size_t sl = strlen(s);
        for (size_t pos = 0; sl && pos + sl <= r->n_hold && pos < best; pos++) {
            if (!memcmp(g->hold + pos, s, sl)) {
                best = pos;
                r->res->stop_index = i;
                break;
            }
        }
    }
    if (best != SIZE_MAX) {
        emit(r, TDM_GEN_ANSWER, g->hold, best);
        r->n_hold = 0;
        r->stopped = true;
        return;
    }
    size_t keep = 0;
    for (int32_t i = 0; i < r->p->n_stop; i++) {
        size_t k = stop_prefix_held(g->hold, r->n_hold, r->p->stop[i]);
        if (k > keep)
            keep = k;
    }
    emit(r, TDM_GEN_ANSWER, g->hold, r->n_hold - keep);
    memmove(g->hold, g->hold + r->n_hold - keep, keep);
    r->n_hold = keep;
}

static void part_text(run *r, const char *t, size_t n)
{
    if (r->part == TDM_GEN_THINKING)
        emit(r, TDM_GEN_THINKING, t, n);
    else
        answer_text(r, t, n);
}

/* Ends the current part: pending UTF-8 bytes go out, held blanks are dropped. */
static void close_part(run *r)
{
    char tail[TDM_DETOK_FLUSH_MAX];
    size_t n = tdm_detok_flush(&r->detok, tail);
    part_text(r, tail, n);
    if (r->part == TDM_GEN_ANSWER && r->n_hold) {
        emit(r, TDM_GEN_ANSWER, r->g->hold, r->n_hold);
        r->n_hold = 0;
    }
    if (r->raw)
        out_text(r, r->part, r->g->ws, r->n_ws);
    r->n_ws = 0;
}

static void switch_part(run *r, tdm_gen_part part)
{
    if (r->part == part)
        return;
    close_part(r);
    r->part = part;
}

/* In grace mode: the length of t up to and including the first sentence end
 * (. ! ? followed by a blank or the piece's end, or a newline), or n+1 if none. */
static size_t grace_cut(const char *t, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (t[i] == '\n')
            return i + 1;
        if ((t[i] == '.' || t[i] == '!' || t[i] == '?') && (i + 1 == n || is_ws(t[i + 1])))
            return i + 1;
    }
    return n + 1;
}

static tdm_status eval1(tdm_generator *g, int32_t id, tdm_error *err)
{
    return tdm_session_eval(g->sess, &id, 1, NULL, err);
}

/* Appends a chosen or forced token. A greedy run's step brings the choice
 * after it (tdm_session_eval_greedy: on a GPU the logits stay there). */
static tdm_status step(run *r, int32_t id, tdm_error *err)
{
    return r->greedy ? tdm_session_eval_greedy(r->g->sess, &id, 1, &r->next, err) : eval1(r->g, id, err);
}

/* Evaluates ids[from..n) (see the comment at the top of the file). */
static tdm_status eval_prompt(tdm_generator *g, int32_t from, int32_t n, bool chat, tdm_error *err)
{
    int32_t split = n; /* without recurrent layers: one batch, nothing to keep */
    if (g->recurrent) {
        int32_t last = -1;
        for (int32_t i = n - 1; chat && g->tok_im_start >= 0 && i >= 0 && last < 0; i--)
            if (g->ids[i] == g->tok_im_start)
                last = i;
        if (last < 0)
            last = n - 1; /* raw prompt: keep the state before its last token */
        /* at or before `from` the checkpoint already sits where it should */
        split = last > from ? last : from;
    }
    tdm_status st;
    if (split > from) {
        if ((st = tdm_session_eval(g->sess, g->ids + from, split - from, NULL, err)) != TDM_OK)
            return st;
        if (split - from == 1)
            tdm_session_checkpoint(g->sess);
        from = split;
    }
    if (n - from > SINGLE_STEP_MAX || !g->recurrent)
        return from < n ? tdm_session_eval(g->sess, g->ids + from, n - from, NULL, err) : TDM_OK;
    for (int32_t i = from; i < n; i++)
        if ((st = eval1(g, g->ids[i], err)) != TDM_OK)
            return st;
    return TDM_OK;
}

/* Tokenises text into g->ids, reuses the session's common prefix, evaluates the rest. */
static tdm_status prepare(run *r, const char *text, size_t len, bool chat, int32_t *n_out,
                          tdm_error *err)
{
    tdm_generator *g = r->g;
    size_t n = 0;
    tdm_status st = tdm_tokenizer_encode(g->tk, text, len, chat ? TDM_TOKENIZE_PARSE_SPECIAL : 0,
                                         g->ids, (size_t)g->n_ctx, &n, err);
    if (st != TDM_OK && n <= (size_t)g->n_ctx)
        return st;
    if (n >= (size_t)g->n_ctx)
        return tdm_error_set(err, TDM_ERR_INVALID,
                             "the prompt is %zu tokens; the context holds %d (prompt + answer)", n,
                             g->n_ctx);
    if (n == 0)
        return tdm_error_set(err, TDM_ERR_INVALID, "the prompt is empty");
    int32_t np = (int32_t)n, past = tdm_session_n_past(g->sess), common = 0;
    const int32_t *held = tdm_session_tokens(g->sess);
    while (common < past && common < np - 1 && held[common] == g->ids[common])
        common++;
    int32_t kept = tdm_session_truncate(g->sess, common);
    if (kept > common) /* cannot happen per session.h; be safe */
        kept = 0, tdm_session_reset(g->sess);
    r->res->n_prompt = np;
    r->res->n_reused = kept;
    if (r->cb && r->cb->on_prompt)
        r->cb->on_prompt(r->cb->user, np, kept);
    *n_out = np;
    return eval_prompt(g, kept, np, chat, err);
}

/* Whether the prompt leaves the model inside an open <think> block. */
static bool prompt_opens_think(const tdm_generator *g, int32_t n)
{
    for (int32_t i = n - 1; i >= 0 && g->ids[i] != g->tok_im_start; i--) {
        if (g->ids[i] == g->tok_think_end)
            return false;
        if (g->ids[i] == g->tok_think)
            return true;
    }
    return false;
}

static void force_think_end(run *r, tdm_error *err, tdm_status *st)
{
    tdm_generator *g = r->g;
    for (int32_t i = 0; i < g->n_forced && *st == TDM_OK; i++) {
        if (tdm_session_n_past(g->sess) >= g->n_ctx)
            break;
        *st = step(r, g->forced[i], err);
        r->res->n_generated++;
        if (i == 0)
            r->res->n_thinking++;
    }
    r->res->thinking_forced = true;
    switch_part(r, TDM_GEN_ANSWER);
}

/* Whether the answer so far ends a sentence (no answer yet counts as ended). */
static bool answer_ended(const run *r)
{
    if (r->last_char == 0 || r->last_char == '\n')
        return true;
    return r->last_nonws == '.' || r->last_nonws == '!' || r->last_nonws == '?';
}

/* After a token: true when max_tokens (and any grace) says to stop now. */
static bool length_reached(run *r, int32_t *grace_left)
{
    const tdm_gen_params *p = r->p;
    if (*grace_left == 0)
        return true;
    if (*grace_left > 0 || p->max_tokens <= 0 || r->res->n_generated < p->max_tokens)
        return false;
    if (r->raw || r->part != TDM_GEN_ANSWER || answer_ended(r) || p->grace_tokens <= 0)
        return true;
    *grace_left = p->grace_tokens;
    return false;
}

static tdm_status generate(run *r, tdm_sampler *smp, tdm_error *err)
{
    tdm_generator *g = r->g;
    const tdm_gen_params *p = r->p;
    tdm_gen_result *res = r->res;
    int32_t think_count = 0, grace_left = -1;
    tdm_status st = TDM_OK;
    for (;;) {
        if (r->part == TDM_GEN_THINKING && p->max_thinking_tokens >= 0 &&
            think_count >= p->max_thinking_tokens && g->n_forced > 0) {
            force_think_end(r, err, &st);
            if (st != TDM_OK)
                return st;
            think_count = 0;
            if (length_reached(r, &grace_left)) {
                res->finish = TDM_GEN_FINISH_LENGTH;
                return TDM_OK;
            }
        }
        if (r->cb && r->cb->cancelled && r->cb->cancelled(r->cb->user)) {
            res->finish = TDM_GEN_FINISH_CANCELLED;
            return TDM_OK;
        }
        if (tdm_session_n_past(g->sess) >= g->n_ctx) {
            res->finish = TDM_GEN_FINISH_CONTEXT;
            return TDM_OK;
        }
        int32_t id = r->next;
        if (id < 0) {
            const float *logits = tdm_session_logits(g->sess);
            if (p->ignore_eog && g->n_eog > 0) {
                memcpy(g->masked, logits, (size_t)g->n_vocab * sizeof *logits);
                for (int32_t i = 0; i < g->n_eog; i++)
                    g->masked[g->eog[i]] = -INFINITY;
                logits = g->masked;
            }
            id = tdm_sampler_sample(smp, logits);
        }
        if (tdm_tokenizer_is_eog(g->tk, id)) {
            res->finish = TDM_GEN_FINISH_EOG;
            return TDM_OK;
        }
        tdm_sampler_accept(smp, id);
        res->n_generated++;
        if (grace_left > 0)
            grace_left--;
        if (r->part == TDM_GEN_THINKING)
            res->n_thinking++;
        if (!r->raw && id == g->tok_think && g->tok_think >= 0) {
            switch_part(r, TDM_GEN_THINKING);
            think_count = 0;
        } else if (!r->raw && id == g->tok_think_end && g->tok_think_end >= 0) {
            switch_part(r, TDM_GEN_ANSWER);
        } else {
            size_t n = 0;
            if ((st = tdm_detok_push(&r->detok, g->tk, id, g->piece, g->piece_cap, &n, err)) != TDM_OK)
                return st;
            if (r->part == TDM_GEN_THINKING)
                think_count++;
            size_t cut = grace_left >= 0 && r->part == TDM_GEN_ANSWER ? grace_cut(g->piece, n) : n + 1;
            part_text(r, g->piece, cut <= n ? cut : n);
            if (cut <= n) { /* grace reached a sentence end (unless a stop string came first) */
                res->finish = r->stopped ? TDM_GEN_FINISH_STOP : TDM_GEN_FINISH_LENGTH;
                return TDM_OK;
            }
        }
        if (r->stopped) {
            res->finish = TDM_GEN_FINISH_STOP;
            return TDM_OK;
        }
        if (length_reached(r, &grace_left)) {
            res->finish = TDM_GEN_FINISH_LENGTH;
            return TDM_OK;
        }
        if ((st = step(r, id, err)) != TDM_OK)
            return st;
    }
}

static tdm_status run_text(tdm_generator *g, const char *text, size_t len, bool chat,
                           const tdm_gen_params *p, const tdm_gen_callbacks *cb,
                           tdm_gen_result *res, tdm_error *err)
{
    if (p->n_stop < 0 || p->n_stop > TDM_GEN_STOP_MAX || (p->n_stop && !p->stop))
        return tdm_error_set(err, TDM_ERR_INVALID, "at most %d stop strings", TDM_GEN_STOP_MAX);
    for (int32_t i = 0; i < p->n_stop; i++) {
        size_t sl = p->stop[i] ? strlen(p->stop[i]) : 0;
        if (sl == 0 || sl > TDM_GEN_STOP_LEN_MAX)
            return tdm_error_set(err, TDM_ERR_INVALID, "stop string %d must be 1 to %d bytes", i,
                                 TDM_GEN_STOP_LEN_MAX);
    }
    tdm_sampler_params sp = tdm_sampler_default_params();
    sp.temperature = p->temperature;
    sp.top_k = p->top_k;
    sp.top_p = p->top_p > 0 ? p->top_p : 1.0f;
    sp.min_p = p->min_p;
    sp.repeat_penalty = p->repeat_penalty > 0 ? p->repeat_penalty : 1.0f;
    sp.frequency_penalty = p->frequency_penalty;
    sp.presence_penalty = p->presence_penalty;
    sp.seed = p->seed;
    tdm_sampler *smp = NULL;
    tdm_status st = tdm_sampler_new(g->n_vocab, &sp, &smp, err);
    if (st != TDM_OK)
        return st == TDM_ERR_INVALID ? st : tdm_error_wrap(err, "sampler");

    *res = (tdm_gen_result){0};
    res->stop_index = -1;
    run r = {.g = g, .p = p, .cb = cb, .res = res, .raw = !chat, .part = TDM_GEN_ANSWER, .next = -1,
             .greedy = tdm_sampler_greedy(smp) && !(p->ignore_eog && g->n_eog > 0)};
    tdm_fence_init(&r.fence);
    tdm_detok_init(&r.detok, 0);
    double t0 = now_seconds();
    int32_t np = 0;
    st = prepare(&r, text, len, chat, &np, err);
    double t1 = now_seconds();
    res->prompt_seconds = t1 - t0;
    if (st == TDM_OK) {
        if (chat && prompt_opens_think(g, np))
            r.part = TDM_GEN_THINKING;
        st = generate(&r, smp, err);
    }
    if (st == TDM_OK) {
        close_part(&r);
        char closer[80];
        size_t n = p->repair_fences && chat ? tdm_fence_closer(&r.fence, closer, sizeof closer) : 0;
        if (n) {
            out_text(&r, TDM_GEN_ANSWER, closer, n);
            res->fence_closed = true;
        }
    }
    res->gen_seconds = now_seconds() - t1;
    tdm_sampler_free(smp);
    return st;
}

/* Renders msgs with the template into a malloc'd prompt (*text, *len). */
static tdm_status render_chat(const tdm_generator *g, const tdm_gen_message *msgs, int32_t n_msgs,
                              tdm_gen_thinking thinking, char **text, size_t *len, tdm_error *err)
{
    *text = NULL;
    if (!g->tmpl)
        return tdm_error_set(err, TDM_ERR_UNSUPPORTED, "chat: %s", g->tmpl_err.msg);
    if (n_msgs <= 0 || !msgs)
        return tdm_error_set(err, TDM_ERR_INVALID, "chat: no messages");
    tdm_chat_msg *cm = malloc((size_t)n_msgs * sizeof *cm);
    if (!cm)
        return tdm_error_set(err, TDM_ERR_OOM, "chat: %d messages", n_msgs);
    for (int32_t i = 0; i < n_msgs; i++)
        cm[i] = (tdm_chat_msg){msgs[i].role, msgs[i].content, msgs[i].reasoning};
    int th = thinking == TDM_GEN_THINK_ON ? 1 : thinking == TDM_GEN_THINK_OFF ? 0 : -1;
    *len = 0;
    tdm_status st = tdm_chat_render(g->tmpl, cm, (size_t)n_msgs, true, th, NULL, 0, len, err);
    if (st == TDM_OK || (st == TDM_ERR_INVALID && *len > 0)) {
        *text = malloc(*len + 1);
        st = *text ? tdm_chat_render(g->tmpl, cm, (size_t)n_msgs, true, th, *text, *len + 1, len, err)
                   : tdm_error_set(err, TDM_ERR_OOM, "chat: prompt of %zu bytes", *len);
    }
    free(cm);
    if (st != TDM_OK) {
        free(*text);
        *text = NULL;
    }
    return st;
}

tdm_status tdm_generator_chat(tdm_generator *g, const tdm_gen_message *msgs, int32_t n_msgs,
                              tdm_gen_thinking thinking, const tdm_gen_params *p,
                              const tdm_gen_callbacks *cb, tdm_gen_result *res, tdm_error *err)
{
    char *text = NULL;
    size_t len = 0;
    tdm_status st = render_chat(g, msgs, n_msgs, thinking, &text, &len, err);
    if (st == TDM_OK)
        st = run_text(g, text, len, true, p, cb, res, err);
    free(text);
    return st;
}

tdm_status tdm_generator_count_chat(const tdm_generator *g, const tdm_gen_message *msgs,
                                    int32_t n_msgs, tdm_gen_thinking thinking, int32_t *n_tokens,
                                    tdm_error *err)
{
    char *text = NULL;
    size_t len = 0, n = 0;
    tdm_status st = render_chat(g, msgs, n_msgs, thinking, &text, &len, err);
    if (st == TDM_OK)
        st = tdm_tokenizer_encode(g->tk, text, len, TDM_TOKENIZE_PARSE_SPECIAL, NULL, 0, &n, err);
    if (st == TDM_ERR_INVALID && text && n > 0)
        st = TDM_OK; /* measuring: cap 0 reports the count as "too small" */
    free(text);
    if (st == TDM_OK)
        *n_tokens = n > INT32_MAX ? INT32_MAX : (int32_t)n;
    return st;
}

tdm_status tdm_generator_complete(tdm_generator *g, const char *prompt, const tdm_gen_params *p,
                                  const tdm_gen_callbacks *cb, tdm_gen_result *res,
                                  tdm_error *err)
{
    if (!prompt || !*prompt)
        return tdm_error_set(err, TDM_ERR_INVALID, "the prompt is empty");
    return run_text(g, prompt, strlen(prompt), false, p, cb, res, err);
}
