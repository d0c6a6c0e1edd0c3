/* server_anthropic: the Anthropic Messages shapes. POST /v1/messages with
 * system, messages (text / thinking blocks), max_tokens, stop_sequences,
 * sampling, thinking {type: enabled, budget_tokens} | {type: disabled}; the
 * response is a message object or, streamed, the event sequence
 * message_start, ping, (content_block_start, content_block_delta*,
 * content_block_stop)*, message_delta, message_stop. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server_internal.h"

/* A content value: a string or an array of blocks; text blocks are joined,
 * thinking blocks (assistant turns) become the message's reasoning. */
static bool blocks_text(srv_job *j, const cJSON *c, const char *param, bool is_system,
                        const char **text, const char **reasoning, srv_reqerr *e)
{
    if (cJSON_IsString(c)) {
        *text = c->valuestring;
        return true;
    }
    if (!cJSON_IsArray(c))
        return srv_fail(e, 400, param, "%s: must be a string or an array of content blocks", param);
    srv_buf t = {0}, r = {0};
    const cJSON *b;
    int i = 0;
    bool ok = true;
    cJSON_ArrayForEach(b, c) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(b, "type");
        if (!cJSON_IsObject(b) || !cJSON_IsString(type)) {
            ok = srv_fail(e, 400, param, "%s.%d: a content block must be an object with a 'type'",
                          param, i);
            break;
        }
        const char *ty = type->valuestring;
        const char *key = !strcmp(ty, "text") ? "text" : !strcmp(ty, "thinking") ? "thinking" : NULL;
        if (!key || (is_system && strcmp(ty, "text"))) {
            ok = srv_fail(e, 400, param, "%s.%d: content block type '%s' is not supported (%s)",
                          param, i, ty, is_system ? "text" : "text, thinking");
            break;
        }
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(b, key);
        if (!cJSON_IsString(v)) {
            ok = srv_fail(e, 400, param, "%s.%d.%s: Field required (a string)", param, i, key);
            break;
        }
        srv_buf *dst = !strcmp(key, "text") ? &t : &r;
        if ((dst->len && !srv_buf_puts(dst, "\n")) || !srv_buf_puts(dst, v->valuestring)) {
            ok = srv_fail(e, 500, param, "out of memory");
            break;
        }
        i++;
    }
    if (ok) {
        *text = srv_job_strdup(j, t.p ? t.p : "", t.len);
        if (r.len && reasoning)
            *reasoning = srv_job_strdup(j, r.p, r.len);
        if (!*text || (r.len && reasoning && !*reasoning))
            ok = srv_fail(e, 500, param, "out of memory");
    }
    srv_buf_free(&t);
    srv_buf_free(&r);
    return ok;
}

static bool parse_messages(srv_job *j, const cJSON *body, srv_reqerr *e)
{
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(body, "messages");
    if (!msgs || cJSON_IsNull(msgs))
        return srv_fail(e, 400, "messages", "messages: Field required");
    if (!cJSON_IsArray(msgs))
        return srv_fail(e, 400, "messages", "messages: Input should be a valid list");
    int n = cJSON_GetArraySize(msgs);
    if (n == 0)
        return srv_fail(e, 400, "messages", "messages: at least one message is required");
    j->msgs = calloc((size_t)n + 1, sizeof *j->msgs);
    if (!j->msgs)
        return srv_fail(e, 500, NULL, "out of memory");
    const cJSON *sys = cJSON_GetObjectItemCaseSensitive(body, "system");
    if (sys && !cJSON_IsNull(sys)) {
        const char *text = NULL;
        if (!blocks_text(j, sys, "system", true, &text, NULL, e))
            return false;
        j->msgs[j->n_msgs++] = (tdm_gen_message){"system", text, NULL};
    }
    const cJSON *m;
    int i = 0;
    cJSON_ArrayForEach(m, msgs) {
        char param[64];
        snprintf(param, sizeof param, "messages.%d", i);
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsObject(m) || !cJSON_IsString(r))
            return srv_fail(e, 400, param, "%s.role: Field required", param);
        if (strcmp(r->valuestring, "user") && strcmp(r->valuestring, "assistant"))
            return srv_fail(e, 400, param, "%s.role: Input should be 'user' or 'assistant'", param);
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!c || cJSON_IsNull(c))
            return srv_fail(e, 400, param, "%s.content: Field required", param);
        tdm_gen_message *out = &j->msgs[j->n_msgs];
        out->role = r->valuestring[0] == 'u' ? "user" : "assistant";
        char cparam[80];
        snprintf(cparam, sizeof cparam, "%s.content", param);
        if (!blocks_text(j, c, cparam, false, &out->content, &out->reasoning, e))
            return false;
        j->n_msgs++;
        i++;
    }
    return true;
}

static bool parse_thinking(srv_job *j, const cJSON *body, srv_reqerr *e)
{
    /* The API's default is no extended thinking. */
    j->thinking = TDM_GEN_THINK_OFF;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(body, "thinking");
    if (!t || cJSON_IsNull(t))
        return true;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
    if (!cJSON_IsObject(t) || !cJSON_IsString(type))
        return srv_fail(e, 400, "thinking", "thinking: must be an object with a 'type'");
    if (!strcmp(type->valuestring, "disabled"))
        return true;
    if (strcmp(type->valuestring, "enabled"))
        return srv_fail(e, 400, "thinking", "thinking.type: Input should be 'enabled' or 'disabled'");
    int64_t budget = -1;
    bool present = false;
    if (!srv_json_int(t, "budget_tokens", 1, INT32_MAX, &budget, &present, e))
        return srv_fail(e, 400, "thinking.budget_tokens",
                        "thinking.budget_tokens: must be a positive integer");
    if (!present)
        return srv_fail(e, 400, "thinking.budget_tokens", "thinking.budget_tokens: Field required");
    if (budget >= j->params.max_tokens)
        return srv_fail(e, 400, "thinking.budget_tokens",
                        "`max_tokens` must be greater than `thinking.budget_tokens`");
    j->thinking = TDM_GEN_THINK_ON;
    j->params.max_thinking_tokens = (int32_t)budget;
    return true;
}

bool srv_anthropic_parse(srv_job *j, cJSON *body, const srv_defaults *d, srv_reqerr *e)
{
    if (!cJSON_IsObject(body))
        return srv_fail(e, 400, NULL, "the request body must be a JSON object");
    bool present = false;
    int64_t mt = 0, grace = d->grace_tokens, budget = -1;
    if (!srv_json_int(body, "max_tokens", 1, INT32_MAX, &mt, &present, e))
        return false;
    if (!present)
        return srv_fail(e, 400, "max_tokens", "max_tokens: Field required");
    j->params.max_tokens = (int32_t)mt;
    if (!srv_json_int(body, "grace_tokens", 0, 4096, &grace, NULL, e))
        return false;
    j->params.grace_tokens = (int32_t)grace;
    const char *model = NULL;
    if (!srv_json_string(body, "model", &model, NULL, e) ||
        !srv_json_bool(body, "stream", &j->stream, NULL, e) ||
        !srv_parse_sampling(j, body, 1.0, e) ||
        !srv_parse_stop(j, body, "stop_sequences", false, e) || !parse_thinking(j, body, e) ||
        !srv_json_int(body, "max_thinking_tokens", 0, INT32_MAX, &budget, &present, e))
        return false;
    if (present) {
        j->params.max_thinking_tokens = (int32_t)budget;
        if (j->thinking == TDM_GEN_THINK_OFF &&
            !cJSON_GetObjectItemCaseSensitive(body, "thinking"))
            j->thinking = TDM_GEN_THINK_ON;
    }
    return parse_messages(j, body, e);
}

/* ---- responses ---- */

static const char *stop_reason(const tdm_gen_result *r)
{
    switch (r->finish) {
    case TDM_GEN_FINISH_STOP: return "stop_sequence";
    case TDM_GEN_FINISH_LENGTH:
    case TDM_GEN_FINISH_CONTEXT: return "max_tokens";
    default: return "end_turn";
    }
}

static void add_stop(cJSON *o, const srv_job *j)
{
    cJSON_AddStringToObject(o, "stop_reason", stop_reason(&j->res));
    if (j->res.finish == TDM_GEN_FINISH_STOP && j->res.stop_index >= 0 &&
        j->res.stop_index < j->params.n_stop)
        cJSON_AddStringToObject(o, "stop_sequence", j->params.stop[j->res.stop_index]);
    else
        cJSON_AddNullToObject(o, "stop_sequence");
}

static cJSON *usage(const srv_job *j, bool final)
{
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "input_tokens", j->n_prompt - j->n_reused);
    cJSON_AddNumberToObject(u, "cache_creation_input_tokens", 0);
    cJSON_AddNumberToObject(u, "cache_read_input_tokens", j->n_reused);
    cJSON_AddNumberToObject(u, "output_tokens", final ? j->res.n_generated : 0);
    return u;
}

static cJSON *message(const srv_job *j)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", j->id);
    cJSON_AddStringToObject(o, "type", "message");
    cJSON_AddStringToObject(o, "role", "assistant");
    cJSON_AddStringToObject(o, "model", j->model);
    cJSON_AddArrayToObject(o, "content");
    return o;
}

static cJSON *block(tdm_gen_part part, const char *text)
{
    cJSON *b = cJSON_CreateObject();
    if (part == TDM_GEN_THINKING) {
        cJSON_AddStringToObject(b, "type", "thinking");
        cJSON_AddStringToObject(b, "thinking", text);
        cJSON_AddStringToObject(b, "signature", "");
    } else {
        cJSON_AddStringToObject(b, "type", "text");
        cJSON_AddStringToObject(b, "text", text);
    }
    return b;
}

static char *response(srv_job *j)
{
    cJSON *o = message(j);
    cJSON *content = cJSON_GetObjectItemCaseSensitive(o, "content");
    if (j->thinking_text.len)
        cJSON_AddItemToArray(content, block(TDM_GEN_THINKING, j->thinking_text.p));
    if (j->answer.len || !j->thinking_text.len)
        cJSON_AddItemToArray(content, block(TDM_GEN_ANSWER, j->answer.p ? j->answer.p : ""));
    add_stop(o, j);
    cJSON_AddItemToObject(o, "usage", usage(j, true));
    cJSON_AddItemToObject(o, "tandem", srv_tandem_info(j));
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

static void close_block(srv_job *j)
{
    if (j->block_index < 0)
        return;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "content_block_stop");
    cJSON_AddNumberToObject(o, "index", j->block_index);
    srv_sse_data_json(j, "content_block_stop", o);
    j->block_index = -1;
}

static void open_block(srv_job *j, tdm_gen_part part)
{
    close_block(j);
    j->block_index = j->n_blocks++;
    j->block_part = part;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "content_block_start");
    cJSON_AddNumberToObject(o, "index", j->block_index);
    cJSON_AddItemToObject(o, "content_block", block(part, ""));
    srv_sse_data_json(j, "content_block_start", o);
}

static void stream_begin(srv_job *j)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "message_start");
    cJSON *m = message(j);
    cJSON_AddNullToObject(m, "stop_reason");
    cJSON_AddNullToObject(m, "stop_sequence");
    cJSON_AddItemToObject(m, "usage", usage(j, false));
    cJSON_AddItemToObject(o, "message", m);
    srv_sse_data_json(j, "message_start", o);
    srv_buf_puts(&j->out, "event: ping\ndata: {\"type\":\"ping\"}\n\n");
    j->block_index = -1;
}

static void stream_text(srv_job *j, tdm_gen_part part, const char *text, size_t len)
{
    if (j->block_index < 0 || j->block_part != (int)part)
        open_block(j, part);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "content_block_delta");
    cJSON_AddNumberToObject(o, "index", j->block_index);
    cJSON *d = cJSON_AddObjectToObject(o, "delta");
    bool th = part == TDM_GEN_THINKING;
    cJSON_AddStringToObject(d, "type", th ? "thinking_delta" : "text_delta");
    cJSON *s = srv_json_strn(text, len);
    if (s)
        cJSON_AddItemToObject(d, th ? "thinking" : "text", s);
    srv_sse_data_json(j, "content_block_delta", o);
}

static void stream_end(srv_job *j)
{
    if (j->n_blocks == 0)
        open_block(j, TDM_GEN_ANSWER); /* an answer has at least one (maybe empty) text block */
    close_block(j);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "message_delta");
    cJSON *d = cJSON_AddObjectToObject(o, "delta");
    add_stop(d, j);
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "output_tokens", j->res.n_generated);
    cJSON_AddItemToObject(o, "tandem", srv_tandem_info(j));
    srv_sse_data_json(j, "message_delta", o);
    srv_buf_puts(&j->out, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
}

static void stream_error(srv_job *j, int status, const char *msg)
{
    char *body = srv_anthropic_error_body(status, msg);
    if (body) {
        srv_buf_printf(&j->out, "event: error\ndata: %s\n\n", body);
        free(body);
    }
}

const srv_api_ops srv_anthropic_ops = {stream_begin, stream_text, stream_end, stream_error,
                                       response};
