/* chat: ChatML rendering for the Qwen family without a Jinja engine.
 *
 * Detection (tdm_chat_template_detect), by features of the template text:
 *  1. No template: ChatML when the vocab has <|im_start|>, else UNSUPPORTED.
 *  2. The text must contain <|im_start|>, <|im_end|> and a loop over
 *     `messages`; <|im_sep|> (Phi-4) or <end_of_utterance> (SmolVLM) mean
 *     another family; a built-in default system prompt ("You are Qwen", the
 *     Qwen2.5 form) is not rendered by us: all UNSUPPORTED.
 *  3. `enable_thinking` present -> it must appear as `enable_thinking is
 *     false` (thinking is the default) or `enable_thinking is true`
 *     (thinking only on request), and the empty block <think>\n\n</think>\n\n
 *     must be in the text; otherwise UNSUPPORTED.
 *  4. A literal '<think>\n' (quoted, as the Qwen3.5 generation prompt writes
 *     it) -> the generation prompt opens the think block when thinking is on.
 *  5. `reasoning_content` present -> assistant history uses the Qwen3 rule
 *     (reasoning shown only after the last user query) and tool turns
 *     are wrapped in <tool_response>; kind QWEN35 when (4) holds, else QWEN3.
 *     Without it: QWEN3_SIMPLE when (3) holds, else CHATML (messages printed
 *     as <|im_start|>role\ncontent<|im_end|>\n, nothing else).
 */
#include "chat.h"

#include <stdlib.h>
#include <string.h>

struct tdm_chat_template {
    tdm_chat_kind kind;
    bool think_clause;  /* the template reacts to enable_thinking */
    bool default_on;    /* thinking when the caller does not say */
    bool opens_think;   /* generation prompt writes <think>\n when thinking */
    bool reasoning;     /* Qwen3 assistant-history rule + tool_response turns */
};

static bool has(const char *t, size_t n, const char *needle)
{
    return memmem(t, n, needle, strlen(needle)) != NULL;
}

static tdm_status unsupported(tdm_error *err, const char *why)
{
    return tdm_error_set(err, TDM_ERR_UNSUPPORTED, "chat template not recognised: %s", why);
}

static tdm_status detect_features(const char *t, size_t n, tdm_chat_template *c, tdm_error *err)
{
    if (!has(t, n, "<|im_start|>") || !has(t, n, "<|im_end|>"))
        return unsupported(err, "no <|im_start|>/<|im_end|> (not ChatML; only the Qwen family is supported)");
    if (!has(t, n, "messages"))
        return unsupported(err, "no loop over messages");
    if (has(t, n, "<|im_sep|>") || has(t, n, "<end_of_utterance>"))
        return unsupported(err, "ChatML variant of another family (<|im_sep|> / <end_of_utterance>)");
    if (has(t, n, "You are Qwen"))
        return unsupported(err, "template injects a default system prompt (Qwen2.5 form)");
    c->think_clause = has(t, n, "enable_thinking");
    if (c->think_clause) {
        bool is_false = has(t, n, "enable_thinking is false"), is_true = has(t, n, "enable_thinking is true");
        if (is_false == is_true)
            return unsupported(err, "enable_thinking is used in an unknown way");
        if (!has(t, n, "<think>\\n\\n</think>\\n\\n"))
            return unsupported(err, "enable_thinking without the empty <think></think> block");
        c->default_on = is_false;
    }
    c->opens_think = has(t, n, "'<think>\\n'") || has(t, n, "\"<think>\\n\"");
    c->reasoning = has(t, n, "reasoning_content");
    if (c->reasoning)
        c->kind = c->opens_think ? TDM_CHAT_QWEN35 : TDM_CHAT_QWEN3;
    else
        c->kind = c->think_clause ? TDM_CHAT_QWEN3_SIMPLE : TDM_CHAT_CHATML;
    return TDM_OK;
}

tdm_status tdm_chat_template_detect(const char *tmpl, size_t len, bool has_im_start, tdm_chat_template **out,
                                    tdm_error *err)
{
    *out = NULL;
    tdm_chat_template c = {.kind = TDM_CHAT_CHATML};
    if (!tmpl || len == 0) {
        if (!has_im_start)
            return unsupported(err, "the model has no chat template and no <|im_start|> token");
    } else {
        tdm_status st = detect_features(tmpl, len, &c, err);
        if (st)
            return st;
    }
    tdm_chat_template *t = malloc(sizeof *t);
    if (!t)
        return tdm_error_set(err, TDM_ERR_OOM, "chat template");
    *t = c;
    *out = t;
    return TDM_OK;
}

tdm_status tdm_chat_template_from_tokenizer(const tdm_tokenizer *tk, tdm_chat_template **out, tdm_error *err)
{
    const char *t = tdm_tokenizer_chat_template(tk);
    return tdm_chat_template_detect(t, t ? strlen(t) : 0, tdm_tokenizer_find(tk, "<|im_start|>") >= 0, out, err);
}

void tdm_chat_template_free(tdm_chat_template *t) { free(t); }

tdm_chat_kind tdm_chat_template_kind(const tdm_chat_template *t) { return t->kind; }

const char *tdm_chat_kind_name(tdm_chat_kind k)
{
    switch (k) {
    case TDM_CHAT_CHATML: return "chatml";
    case TDM_CHAT_QWEN3_SIMPLE: return "qwen3-simple";
    case TDM_CHAT_QWEN3: return "qwen3";
    case TDM_CHAT_QWEN35: return "qwen35";
    }
    return "?";
}

bool tdm_chat_template_thinks_by_default(const tdm_chat_template *t)
{
    return t->think_clause ? t->default_on : true;
}

/* ---- rendering ---- */

typedef struct sbuf {
    char *out;
    size_t cap, len;
} sbuf;

static void put(sbuf *b, const char *s, size_t n)
{
    if (b->len < b->cap) {
        size_t room = b->cap - b->len;
        memcpy(b->out + b->len, s, n < room ? n : room);
    }
    b->len += n;
}

static void puts_(sbuf *b, const char *s) { put(b, s, strlen(s)); }

/* s[0..n) without leading (lead) / trailing (trail) '\n' */
static void strip_nl(const char **s, size_t *n, bool lead, bool trail)
{
    while (lead && *n && **s == '\n') {
        (*s)++;
        (*n)--;
    }
    while (trail && *n && (*s)[*n - 1] == '\n')
        (*n)--;
}

static const char *memrmem(const char *h, size_t n, const char *needle)
{
    size_t k = strlen(needle);
    for (size_t i = n >= k ? n - k + 1 : 0; i-- > 0;)
        if (memcmp(h + i, needle, k) == 0)
            return h + i;
    return NULL;
}

static bool is_tool_response(const char *c)
{
    size_t n = strlen(c), a = strlen("<tool_response>"), b = strlen("</tool_response>");
    return n >= a && n >= b && !memcmp(c, "<tool_response>", a) && !memcmp(c + n - b, "</tool_response>", b);
}

/* Qwen3 assistant turn: reasoning from the message or split out of content at </think>. */
static void render_assistant(sbuf *b, const tdm_chat_msg *m, bool show_reasoning, bool last)
{
    const char *c = m->content ? m->content : "", *r = "";
    size_t cn = strlen(c), rn = 0;
    if (m->reasoning) {
        r = m->reasoning;
        rn = strlen(r);
    } else if (memmem(c, cn, "</think>", 8)) {
        const char *end = memmem(c, cn, "</think>", 8), *after = memrmem(c, cn, "</think>") + 8;
        r = c;
        rn = (size_t)(end - c);
        strip_nl(&r, &rn, false, true);
        const char *open = memrmem(r, rn, "<think>");
        if (open) {
            rn -= (size_t)(open + 7 - r);
            r = open + 7;
        }
        strip_nl(&r, &rn, true, false);
        cn -= (size_t)(after - c);
        c = after;
        strip_nl(&c, &cn, true, false);
    }
    puts_(b, "<|im_start|>assistant\n");
    if (show_reasoning && (last || rn > 0)) {
        strip_nl(&r, &rn, true, true);
        strip_nl(&c, &cn, true, false);
        puts_(b, "<think>\n");
        put(b, r, rn);
        puts_(b, "\n</think>\n\n");
    }
    put(b, c, cn);
    puts_(b, "<|im_end|>\n");
}

static void render_qwen3(sbuf *b, const tdm_chat_msg *msgs, size_t n)
{
    size_t last_query = n ? n - 1 : 0;
    for (size_t i = n; i-- > 0;) {
        if (!strcmp(msgs[i].role, "user") && !is_tool_response(msgs[i].content ? msgs[i].content : "")) {
            last_query = i;
            break;
        }
    }
    for (size_t i = 0; i < n; i++) {
        const tdm_chat_msg *m = &msgs[i];
        const char *c = m->content ? m->content : "";
        if (!strcmp(m->role, "assistant")) {
            render_assistant(b, m, i > last_query, i + 1 == n);
        } else if (!strcmp(m->role, "tool")) {
            if (i == 0 || strcmp(msgs[i - 1].role, "tool"))
                puts_(b, "<|im_start|>user");
            puts_(b, "\n<tool_response>\n");
            puts_(b, c);
            puts_(b, "\n</tool_response>");
            if (i + 1 == n || strcmp(msgs[i + 1].role, "tool"))
                puts_(b, "<|im_end|>\n");
        } else { /* system or user */
            puts_(b, "<|im_start|>");
            puts_(b, m->role);
            puts_(b, "\n");
            puts_(b, c);
            puts_(b, "<|im_end|>\n");
        }
    }
}

tdm_status tdm_chat_render(const tdm_chat_template *t, const tdm_chat_msg *msgs, size_t n,
                           bool add_generation_prompt, int thinking, char *out, size_t cap, size_t *len,
                           tdm_error *err)
{
    *len = 0;
    if (!out)
        cap = 0;
    if (n && !msgs)
        return tdm_error_set(err, TDM_ERR_INVALID, "chat_render: msgs is NULL");
    for (size_t i = 0; i < n; i++) {
        const char *r = msgs[i].role;
        if (!r || (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "tool")))
            return tdm_error_set(err, TDM_ERR_INVALID, "chat_render: message %zu has role '%s' (want system, "
                                 "user, assistant or tool)", i, r ? r : "(null)");
    }
    sbuf b = {out, cap, 0};
    if (t->reasoning) {
        render_qwen3(&b, msgs, n);
    } else {
        for (size_t i = 0; i < n; i++) {
            puts_(&b, "<|im_start|>");
            puts_(&b, msgs[i].role);
            puts_(&b, "\n");
            puts_(&b, msgs[i].content ? msgs[i].content : "");
            puts_(&b, "<|im_end|>\n");
        }
    }
    if (add_generation_prompt) {
        puts_(&b, "<|im_start|>assistant\n");
        bool on = thinking < 0 ? t->default_on : thinking > 0;
        if (t->think_clause && !on)
            puts_(&b, "<think>\n\n</think>\n\n");
        else if (t->think_clause && t->opens_think)
            puts_(&b, "<think>\n");
    }
    *len = b.len;
    if (cap)
        out[b.len < cap ? b.len : cap - 1] = '\0';
    if (b.len + 1 > cap)
        return tdm_error_set(err, TDM_ERR_INVALID, "chat_render: buffer too small (need %zu bytes)", b.len + 1);
    return TDM_OK;
}
