/* libFuzzer target for the HTTP API's request bodies: the first byte picks
 * the API (OpenAI chat, OpenAI completion, Anthropic messages) and the
 * chat template, the rest is the body. A body cJSON accepts goes through the
 * API's parser as `tandem serve` runs it; a refusal must carry an HTTP status
 * and a message and its error body must format; an accepted request is
 * rendered with the chat template (chat APIs) and answered as if generated,
 * streaming or whole, so every string the parser kept is read again.
 * ASan/UBSan report the rest. Built and run by tests/fuzz/run.sh. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "chat.h"
#include "server_internal.h"

static tdm_chat_template *templates[2]; /* ChatML, Qwen3.5 */

/* The features tdm_chat_template_detect reads off a Qwen3.5 template. */
static const char qwen35_markers[] = "<|im_start|> <|im_end|> messages enable_thinking is false "
                                     "<think>\\n\\n</think>\\n\\n '<think>\\n' reasoning_content";

static void render(const srv_job *j, const tdm_chat_template *t)
{
    tdm_chat_msg *cm = calloc((size_t)j->n_msgs + 1, sizeof *cm);
    if (!cm)
        return;
    for (int32_t i = 0; i < j->n_msgs; i++)
        cm[i] = (tdm_chat_msg){j->msgs[i].role, j->msgs[i].content, j->msgs[i].reasoning};
    size_t len = 0;
    tdm_error err = {0};
    const int thinking = j->thinking == TDM_GEN_THINK_ON ? 1 : j->thinking == TDM_GEN_THINK_OFF ? 0 : -1;
    tdm_status st = tdm_chat_render(t, cm, (size_t)j->n_msgs, true, thinking, NULL, 0, &len, &err);
    if (st == TDM_ERR_INVALID && len) {
        char *out = malloc(len + 1);
        if (out && tdm_chat_render(t, cm, (size_t)j->n_msgs, true, thinking, out, len + 1, &len, &err) != TDM_OK)
            abort(); /* measured, then refused */
        free(out);
    }
    free(cm);
}

static void answer(srv_job *j)
{
    static const char think[] = "a thought", text[] = "an answer \xe2\x9c\x93";
    j->n_prompt = 7;
    j->res.n_generated = 3;
    if (j->stream) {
        j->ops->stream_begin(j);
        j->ops->stream_text(j, TDM_GEN_THINKING, think, sizeof think - 1);
        j->ops->stream_text(j, TDM_GEN_ANSWER, text, sizeof text - 1);
        j->ops->stream_end(j);
        j->ops->stream_error(j, 500, "late failure");
    } else {
        srv_buf_puts(&j->thinking_text, think);
        srv_buf_puts(&j->answer, text);
        free(j->ops->response(j));
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    if (!templates[0]) {
        tdm_error err = {0};
        if (tdm_chat_template_detect(NULL, 0, true, &templates[0], &err) ||
            tdm_chat_template_detect(qwen35_markers, sizeof qwen35_markers - 1, true, &templates[1], &err) ||
            tdm_chat_template_kind(templates[1]) != TDM_CHAT_QWEN35)
            abort();
    }
    const srv_api api = (srv_api)(data[0] % 3);
    cJSON *body = cJSON_ParseWithLength((const char *)data + 1, size - 1);
    if (!body)
        return 0;
    srv_job *j = srv_job_new(api);
    if (!j) {
        cJSON_Delete(body);
        return 0;
    }
    snprintf(j->id, sizeof j->id, "fuzz");
    j->model = "tandem-fuzz";
    const srv_defaults d = {.max_tokens = 256, .max_thinking_tokens = 128, .grace_tokens = 64, .n_ctx = 4096};
    srv_reqerr e = {0};
    const bool ok = api == SRV_OPENAI_CHAT         ? srv_openai_parse_chat(j, body, &d, &e)
                    : api == SRV_OPENAI_COMPLETION ? srv_openai_parse_completion(j, body, &d, &e)
                                                   : srv_anthropic_parse(j, body, &d, &e);
    j->body = body; /* as the server does: the parsed strings live as long as the job */
    if (!ok) {
        if (e.status < 400 || e.status > 599 || !e.msg[0])
            abort(); /* a refusal names its status and says why */
        free(api == SRV_ANTHROPIC ? srv_anthropic_error_body(e.status, e.msg)
                                  : srv_openai_error_body(e.status, e.msg, e.param));
    } else {
        if (api != SRV_OPENAI_COMPLETION)
            render(j, templates[data[0] / 3 % 2]);
        else if (!j->prompt)
            abort();
        answer(j);
    }
    srv_job_unref(j);
    return 0;
}
