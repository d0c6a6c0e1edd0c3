/* chat: renders a conversation into the prompt text of the Qwen family
 * (ChatML), as the model's own chat template would (gguf.md §4.8).
 *
 * There is no Jinja engine: the template text is recognised by its features
 * and mapped to one of the known Qwen forms (see chat.c for the exact
 * detection rules). An unknown template is TDM_ERR_UNSUPPORTED, never
 * guessed. Forms:
 *   CHATML     <|im_start|>{role}\n{content}<|im_end|>\n per message,
 *              generation prompt <|im_start|>assistant\n. Also used when the
 *              file has no template but <|im_start|> is in the vocab.
 *              `thinking` is ignored (the template has no switch).
 *   QWEN3_SIMPLE  CHATML + the enable_thinking clause: thinking off appends
 *              <think>\n\n</think>\n\n after the generation prompt (the demo
 *              model and the fixtures carry this one). Reasoning is not
 *              rendered (the template never references it).
 *   QWEN3      the full Qwen3 template (reasoning_content, tool turns):
 *              assistant turns after the last user query render
 *              <think>\n{reasoning}\n</think>\n\n{content}; consecutive tool
 *              messages form one user turn of <tool_response> blocks.
 *   QWEN35     as QWEN3, but the generation prompt opens <think>\n when
 *              thinking is on (or default-on).
 * Render the result with TDM_TOKENIZE_PARSE_SPECIAL and no BOS.
 *
 * Ownership: a template owns nothing from the tokenizer/GGUF it came from.
 */
#ifndef TDM_CHAT_H
#define TDM_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include "status.h"
#include "tokenizer.h"

typedef struct tdm_chat_msg {
    const char *role;      /* "system", "user", "assistant", "tool" (NUL-terminated) */
    const char *content;   /* NULL = "" */
    const char *reasoning; /* assistant reasoning (Qwen3 reasoning_content), NULL = none */
} tdm_chat_msg;

typedef enum tdm_chat_kind {
    TDM_CHAT_CHATML = 0,
    TDM_CHAT_QWEN3_SIMPLE,
    TDM_CHAT_QWEN3,
    TDM_CHAT_QWEN35
} tdm_chat_kind;

typedef struct tdm_chat_template tdm_chat_template;

/* Detects the form of template text tmpl[0..len) (tmpl may be NULL: no
 * template; then ChatML if has_im_start, else TDM_ERR_UNSUPPORTED).
 * Unknown template: TDM_ERR_UNSUPPORTED with a message saying why. */
tdm_status tdm_chat_template_detect(const char *tmpl, size_t len, bool has_im_start,
                                    tdm_chat_template **out, tdm_error *err);
/* Same, from the tokenizer's chat template and vocab. */
tdm_status tdm_chat_template_from_tokenizer(const tdm_tokenizer *tk, tdm_chat_template **out,
                                            tdm_error *err);
void tdm_chat_template_free(tdm_chat_template *t);

tdm_chat_kind tdm_chat_template_kind(const tdm_chat_template *t);
const char *tdm_chat_kind_name(tdm_chat_kind k); /* "chatml", "qwen3-simple", "qwen3", "qwen35" */
/* Whether the model thinks when thinking = -1 (template default). */
bool tdm_chat_template_thinks_by_default(const tdm_chat_template *t);

/* Renders msgs[0..n) into out (NUL-terminated). thinking: -1 template
 * default, 0 off, 1 on. *len = bytes of the full text (without the NUL);
 * when *len + 1 > cap: TDM_ERR_INVALID ("buffer too small"), so out=NULL,
 * cap=0 measures. TDM_ERR_INVALID for an unknown role or NULL role. */
tdm_status tdm_chat_render(const tdm_chat_template *t, const tdm_chat_msg *msgs, size_t n,
                           bool add_generation_prompt, int thinking, char *out, size_t cap,
                           size_t *len, tdm_error *err);

#endif
