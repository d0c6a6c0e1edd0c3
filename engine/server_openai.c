/* server_openai: the OpenAI shapes. Requests: POST /v1/chat/completions and
 * POST /v1/completions; responses: chat.completion / text_completion objects
 * and their SSE chunks (with a final usage chunk when
 * stream_options.include_usage), ended by "data: [DONE]". Unknown request
 * fields are ignored. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server_internal.h"

/* Text of an OpenAI content value: a string, or an array of {type:"text",text} parts. */
static bool content_text(srv_job *j, const cJSON *c, const char *param, const char **out,
                         srv_reqerr *e)
{
    if (!c || cJSON_IsNull(c)) {
        *out = "";
        return true;
    }
    if (cJSON_IsString(c)) {
        *out = c->valuestring;
        return true;
    }
    if (!cJSON_IsArray(c))
        return srv_fail(e, 400, param, "'%s' must be a string or an array of content parts", param);
    srv_buf b = {0};
    const cJSON *part;
    int i = 0;
    cJSON_ArrayForEach(part, c) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsObject(part) || !cJSON_IsString(type)) {
            srv_buf_free(&b);
            return srv_fail(e, 400, param, "'%s[%d]' must be an object with a 'type'", param, i);
        }
        if (strcmp(type->valuestring, "text") != 0) {
            srv_buf_free(&b);
            return srv_fail(e, 400, param, "'%s[%d]': content part type '%s' is not supported "
                            "(only 'text')", param, i, type->valuestring);
        }
        if (!cJSON_IsString(text)) {
            srv_buf_free(&b);
            return srv_fail(e, 400, param, "'%s[%d].text' must be a string", param, i);
        }
        if ((i > 0 && !srv_buf_puts(&b, "\n")) || !srv_buf_puts(&b, text->valuestring)) {
            srv_buf_free(&b);
            return srv_fail(e, 500, param, "out of memory");
        }
        i++;
    }
    *out = srv_job_strdup(j, b.p ? b.p : "", b.len);
    srv_buf_free(&b);
    return *out ? true : srv_fail(e, 500, param, "out of memory");
}

static bool parse_messages(srv_job *j, const cJSON *body, srv_reqerr *e)
{
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(body, "messages");
    if (!msgs || cJSON_IsNull(msgs))
        return srv_fail(e, 400, "messages", "'messages' is required");
    if (!cJSON_IsArray(msgs))
        return srv_fail(e, 400, "messages", "'messages' must be an array");
    int n = cJSON_GetArraySize(msgs);
    if (n == 0)
        return srv_fail(e, 400, "messages", "'messages' must not be empty");
    const char *sys = NULL;
    if (!srv_json_string(body, "system", &sys, NULL, e))
        return false;
    j->msgs = calloc((size_t)n + 1, sizeof *j->msgs);
    if (!j->msgs)
        return srv_fail(e, 500, NULL, "out of memory");
    if (sys)
        j->msgs[j->n_msgs++] = (tdm_gen_message){"system", sys, NULL};
    const cJSON *m;
    int i = 0;
    cJSON_ArrayForEach(m, msgs) {
        char param[64];
        snprintf(param, sizeof param, "messages[%d]", i);
        if (!cJSON_IsObject(m))
            return srv_fail(e, 400, param, "'%s' must be an object", param);
        const char *role = NULL;
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsString(r))
            return srv_fail(e, 400, param, "'%s.role' must be a string", param);
        role = r->valuestring;
        if (!strcmp(role, "developer"))
            role = "system";
        if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant"))
            return srv_fail(e, 400, param, "'%s.role' '%s' is not supported (system, developer, "
                            "user, assistant)", param, role);
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if ((!content || cJSON_IsNull(content)) && strcmp(role, "assistant"))
            return srv_fail(e, 400, param, "'%s.content' is required", param);
        char cparam[80];
        snprintf(cparam, sizeof cparam, "%s.content", param);
        tdm_gen_message *out = &j->msgs[j->n_msgs];
        out->role = role;
        if (!content_text(j, content, cparam, &out->content, e))
            return false;
        const cJSON *rc = cJSON_GetObjectItemCaseSensitive(m, "reasoning_content");
        if (rc && !cJSON_IsNull(rc)) {
            if (!cJSON_IsString(rc))
                return srv_fail(e, 400, param, "'%s.reasoning_content' must be a string", param);
            out->reasoning = rc->valuestring;
        }
        j->n_msgs++;
        i++;
    }
    return true;
}

/* Thinking on/off and budget: reasoning_effort (or reasoning.effort; "none" is off,
 * minimal/low/medium/high budget 128/512/2048/none), reasoning.max_tokens,
 * chat_template_kwargs.enable_thinking, max_thinking_tokens (the most specific wins). */
static bool parse_thinking(srv_job *j, const cJSON *body, srv_reqerr *e)
{
    const char *effort = NULL;
    if (!srv_json_string(body, "reasoning_effort", &effort, NULL, e))
        return false;
    /* the Responses-API / OpenRouter form: reasoning {effort, max_tokens} */
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(body, "reasoning");
    int64_t rs_budget = -1;
    bool rs_has_budget = false;
    if (rs && !cJSON_IsNull(rs)) {
        srv_reqerr sub;
        if (!cJSON_IsObject(rs))
            return srv_fail(e, 400, "reasoning", "'reasoning' must be an object");
        if (!srv_json_string(rs, "effort", &effort, NULL, &sub))
            return srv_fail(e, 400, "reasoning.effort", "'reasoning.effort' must be a string");
        if (!srv_json_int(rs, "max_tokens", 0, INT32_MAX, &rs_budget, &rs_has_budget, &sub))
            return srv_fail(e, 400, "reasoning.max_tokens",
                            "'reasoning.max_tokens' must be a non-negative integer");
    }
    if (effort) {
        static const struct { const char *name; int32_t budget; } efforts[] = {
            {"none", 0}, {"minimal", 128}, {"low", 512}, {"medium", 2048}, {"high", -1}};
        size_t k = 0;
        while (k < sizeof efforts / sizeof efforts[0] && strcmp(efforts[k].name, effort))
            k++;
        if (k == sizeof efforts / sizeof efforts[0])
            return srv_fail(e, 400, "reasoning_effort", "'reasoning_effort' must be one of none, "
                            "minimal, low, medium, high (got '%s')", effort);
        j->thinking = k == 0 ? TDM_GEN_THINK_OFF : TDM_GEN_THINK_ON;
        if (k > 0)
            j->params.max_thinking_tokens = efforts[k].budget;
    }
    const cJSON *kw = cJSON_GetObjectItemCaseSensitive(body, "chat_template_kwargs");
    if (kw && !cJSON_IsNull(kw)) {
        if (!cJSON_IsObject(kw))
            return srv_fail(e, 400, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
        bool on = true, present = false;
        srv_reqerr sub;
        if (!srv_json_bool(kw, "enable_thinking", &on, &present, &sub))
            return srv_fail(e, 400, "chat_template_kwargs.enable_thinking",
                            "'chat_template_kwargs.enable_thinking' must be a boolean");
        if (present)
            j->thinking = on ? TDM_GEN_THINK_ON : TDM_GEN_THINK_OFF;
    }
    if (rs_has_budget) {
        j->params.max_thinking_tokens = (int32_t)rs_budget;
        if (j->thinking == TDM_GEN_THINK_DEFAULT)
            j->thinking = TDM_GEN_THINK_ON;
    }
    int64_t budget = j->params.max_thinking_tokens;
    bool present = false;
    if (!srv_json_int(body, "max_thinking_tokens", 0, INT32_MAX, &budget, &present, e))
        return false;
    if (present)
        j->params.max_thinking_tokens = (int32_t)budget;
    return true;
}

static bool parse_common(srv_job *j, const cJSON *body, const srv_defaults *d, bool chat,
                         srv_reqerr *e)
{
    int64_t n = 1;
    if (!srv_json_int(body, "n", 1, 1, &n, NULL, e))
        return srv_fail(e, 400, "n", "only n=1 is supported");
    int64_t mt = chat ? d->max_tokens : 16, grace = d->grace_tokens;
    if (!srv_json_int(body, "max_tokens", 1, INT32_MAX, &mt, NULL, e) ||
        (chat && !srv_json_int(body, "max_completion_tokens", 1, INT32_MAX, &mt, NULL, e)) ||
        !srv_json_int(body, "grace_tokens", 0, 4096, &grace, NULL, e))
        return false;
    j->params.max_tokens = (int32_t)mt;
    j->params.grace_tokens = (int32_t)grace;
    if (!srv_json_bool(body, "stream", &j->stream, NULL, e))
        return false;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(body, "stream_options");
    if (so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so))
            return srv_fail(e, 400, "stream_options", "'stream_options' must be an object");
        srv_reqerr sub;
        if (!srv_json_bool(so, "include_usage", &j->include_usage, NULL, &sub))
            return srv_fail(e, 400, "stream_options.include_usage",
                            "'stream_options.include_usage' must be a boolean");
    }
    const char *model = NULL;
    if (!srv_json_string(body, "model", &model, NULL, e))
        return false;
    return srv_parse_sampling(j, body, 2.0, e) && srv_parse_stop(j, body, "stop", true, e);
}

bool srv_openai_parse_chat(srv_job *j, cJSON *body, const srv_defaults *d, srv_reqerr *e)
{
    if (!cJSON_IsObject(body))
        return srv_fail(e, 400, NULL, "the request body must be a JSON object");
    j->params.max_thinking_tokens = d->max_thinking_tokens;
    return parse_common(j, body, d, true, e) && parse_thinking(j, body, e) &&
           parse_messages(j, body, e);
}

bool srv_openai_parse_completion(srv_job *j, cJSON *body, const srv_defaults *d, srv_reqerr *e)
{
    if (!cJSON_IsObject(body))
        return srv_fail(e, 400, NULL, "the request body must be a JSON object");
    if (!parse_common(j, body, d, false, e))
        return false;
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(body, "prompt");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && cJSON_IsString(cJSON_GetArrayItem(p, 0)))
        p = cJSON_GetArrayItem(p, 0);
    if (!p || cJSON_IsNull(p))
        return srv_fail(e, 400, "prompt", "'prompt' is required");
    if (!cJSON_IsString(p))
        return srv_fail(e, 400, "prompt", "'prompt' must be a string (or an array of one string)");
    if (!p->valuestring[0])
        return srv_fail(e, 400, "prompt", "'prompt' must not be empty");
    j->prompt = p->valuestring;
    j->params.repair_fences = false; /* raw continuation: the text is the client's */
    return true;
}

/* ---- responses ---- */

static const char *finish_reason(const tdm_gen_result *r)
{
    switch (r->finish) {
    case TDM_GEN_FINISH_LENGTH:
    case TDM_GEN_FINISH_CONTEXT: return "length";
    default: return "stop";
    }
}

static cJSON *usage_json(const srv_job *j)
{
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", j->res.n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", j->res.n_generated);
    cJSON_AddNumberToObject(u, "total_tokens", j->res.n_prompt + j->res.n_generated);
    cJSON *pd = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(pd, "cached_tokens", j->res.n_reused);
    if (j->api == SRV_OPENAI_CHAT) {
        cJSON *cd = cJSON_AddObjectToObject(u, "completion_tokens_details");
        cJSON_AddNumberToObject(cd, "reasoning_tokens", j->res.n_thinking);
    }
    return u;
}

static cJSON *envelope(const srv_job *j, const char *object)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", j->id);
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)j->created);
    cJSON_AddStringToObject(o, "model", j->model);
    cJSON_AddStringToObject(o, "system_fingerprint", "tandem");
    return o;
}

/* The envelope with one choice, index 0, returned in *choice. */
static cJSON *with_choice(const srv_job *j, const char *object, cJSON **choice)
{
    cJSON *o = envelope(j, object);
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    *choice = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, *choice);
    cJSON_AddNumberToObject(*choice, "index", 0);
    return o;
}

/* A whole (not streamed) response's end: choice c's finish reason, the
 * usage and tandem's numbers; o printed (the caller frees the text) and
 * freed. */
static char *finish_response(srv_job *j, cJSON *o, cJSON *c)
{
    cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddStringToObject(c, "finish_reason", finish_reason(&j->res));
    cJSON_AddItemToObject(o, "usage", usage_json(j));
    cJSON_AddItemToObject(o, "tandem", srv_tandem_info(j));
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

static char *chat_response(srv_job *j)
{
    cJSON *c;
    cJSON *o = with_choice(j, "chat.completion", &c);
    cJSON *msg = cJSON_AddObjectToObject(c, "message");
    cJSON_AddStringToObject(msg, "role", "assistant");
    cJSON_AddStringToObject(msg, "content", j->answer.p ? j->answer.p : "");
    if (j->thinking_text.len)
        cJSON_AddStringToObject(msg, "reasoning_content", j->thinking_text.p);
    return finish_response(j, o, c);
}

static char *completion_response(srv_job *j)
{
    cJSON *c;
    cJSON *o = with_choice(j, "text_completion", &c);
    cJSON_AddStringToObject(c, "text", j->answer.p ? j->answer.p : "");
    return finish_response(j, o, c);
}

/* One streamed chunk; delta (chat) or text (completions) is added by the caller. */
static cJSON *chunk(srv_job *j, cJSON **choice)
{
    bool chat = j->api == SRV_OPENAI_CHAT;
    cJSON *o = with_choice(j, chat ? "chat.completion.chunk" : "text_completion", choice);
    if (j->include_usage)
        cJSON_AddNullToObject(o, "usage");
    return o;
}

static void stream_begin(srv_job *j)
{
    if (j->api != SRV_OPENAI_CHAT)
        return;
    cJSON *c;
    cJSON *o = chunk(j, &c);
    cJSON *delta = cJSON_AddObjectToObject(c, "delta");
    cJSON_AddStringToObject(delta, "role", "assistant");
    cJSON_AddStringToObject(delta, "content", "");
    cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddNullToObject(c, "finish_reason");
    srv_sse_data_json(j, NULL, o);
}

static void stream_text(srv_job *j, tdm_gen_part part, const char *text, size_t len)
{
    cJSON *c;
    cJSON *o = chunk(j, &c);
    cJSON *s = srv_json_strn(text, len);
    if (!s) {
        cJSON_Delete(o);
        return;
    }
    if (j->api == SRV_OPENAI_CHAT) {
        cJSON *delta = cJSON_AddObjectToObject(c, "delta");
        cJSON_AddItemToObject(delta, part == TDM_GEN_THINKING ? "reasoning_content" : "content", s);
    } else {
        cJSON_AddItemToObject(c, "text", s);
    }
    cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddNullToObject(c, "finish_reason");
    srv_sse_data_json(j, NULL, o);
}

static void stream_end(srv_job *j)
{
    cJSON *c;
    cJSON *o = chunk(j, &c);
    if (j->api == SRV_OPENAI_CHAT)
        cJSON_AddObjectToObject(c, "delta");
    else
        cJSON_AddStringToObject(c, "text", "");
    cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddStringToObject(c, "finish_reason", finish_reason(&j->res));
    cJSON_AddItemToObject(o, "tandem", srv_tandem_info(j));
    srv_sse_data_json(j, NULL, o);
    if (j->include_usage) {
        cJSON *u = envelope(j, j->api == SRV_OPENAI_CHAT ? "chat.completion.chunk" : "text_completion");
        cJSON_AddArrayToObject(u, "choices");
        cJSON_AddItemToObject(u, "usage", usage_json(j));
        srv_sse_data_json(j, NULL, u);
    }
    srv_buf_puts(&j->out, "data: [DONE]\n\n");
}

static void stream_error(srv_job *j, int status, const char *msg)
{
    char *body = srv_openai_error_body(status, msg, NULL);
    if (body) {
        srv_buf_printf(&j->out, "data: %s\n\n", body);
        free(body);
    }
    srv_buf_puts(&j->out, "data: [DONE]\n\n");
}

const srv_api_ops srv_openai_chat_ops = {stream_begin, stream_text, stream_end, stream_error,
                                         chat_response};
const srv_api_ops srv_openai_completion_ops = {stream_begin, stream_text, stream_end,
                                               stream_error, completion_response};
