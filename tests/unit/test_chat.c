/* Chat rendering tests: template detection (demo/fixture template, Qwen3,
 * Qwen3.5, inverted default, no template, unknown families) and byte-exact
 * ChatML output for fixed conversations. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "chat.h"
#include "tokenizer.h"

static tdm_tokenizer *open_tk(const char *rel)
{
    const char *root = getenv("TDM_ROOT");
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", root && *root ? root : ".", rel);
    tdm_tokenizer *tk;
    tdm_error err;
    if (tdm_tokenizer_open(p, &tk, &err))
        fail_msg("%s: %s", p, err.msg);
    return tk;
}

static tdm_chat_template *detect(const char *tmpl, bool im_start)
{
    tdm_chat_template *t;
    tdm_error err;
    if (tdm_chat_template_detect(tmpl, tmpl ? strlen(tmpl) : 0, im_start, &t, &err))
        fail_msg("detect: %s", err.msg);
    return t;
}

static char out[8192];

static const char *render(const tdm_chat_template *t, const tdm_chat_msg *m, size_t n, bool gen, int thinking)
{
    size_t len;
    tdm_error err;
    if (tdm_chat_render(t, m, n, gen, thinking, out, sizeof out, &len, &err))
        fail_msg("render: %s", err.msg);
    assert_int_equal(len, strlen(out));
    return out;
}

/* The demo model's (and the fixtures') template, verbatim. */
static const char demo_template[] =
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}{%- endif %}";

static const tdm_chat_msg convo[] = {
    {"system", "You are a calculator.", NULL},
    {"user", "What is 2+2?", NULL},
    {"assistant", "4", "two plus two"},
    {"user", "And 3+3?", NULL},
};

#define CONVO_CHATML                                                                                         \
    "<|im_start|>system\nYou are a calculator.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"        \
    "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n"

static void test_demo_template(void **state)
{
    (void)state;
    tdm_tokenizer *tk = open_tk("models/demo/demo-Q4_K_M.gguf");
    assert_string_equal(tdm_tokenizer_chat_template(tk), demo_template);
    tdm_chat_template *t;
    tdm_error err;
    assert_int_equal(tdm_chat_template_from_tokenizer(tk, &t, &err), TDM_OK);
    assert_int_equal(tdm_chat_template_kind(t), TDM_CHAT_QWEN3_SIMPLE);
    assert_string_equal(tdm_chat_kind_name(tdm_chat_template_kind(t)), "qwen3-simple");
    assert_true(tdm_chat_template_thinks_by_default(t));
    /* thinking off: the empty think block after the generation prompt */
    assert_string_equal(render(t, convo, 4, true, 0),
                        CONVO_CHATML "<|im_start|>assistant\n<think>\n\n</think>\n\n");
    /* on / default: nothing after the prompt; reasoning is not part of this template */
    assert_string_equal(render(t, convo, 4, true, 1), CONVO_CHATML "<|im_start|>assistant\n");
    assert_string_equal(render(t, convo, 4, true, -1), CONVO_CHATML "<|im_start|>assistant\n");
    assert_string_equal(render(t, convo, 4, false, 0), CONVO_CHATML);
    /* the peer's chat prompt renders and tokenises to llama.cpp's ids */
    tdm_chat_msg q = {"user", "What is 17 + 25?", NULL};
    const char *p = render(t, &q, 1, true, -1);
    assert_string_equal(p, "<|im_start|>user\nWhat is 17 + 25?<|im_end|>\n<|im_start|>assistant\n");
    static const int32_t want[] = {8186, 403, 265, 198, 1186, 327, 220, 16, 22, 220, 10,
                                   220,  17,  20,  30,  8187, 198, 8186, 589, 382, 404, 198};
    int32_t ids[64];
    size_t n;
    assert_int_equal(tdm_tokenizer_encode(tk, p, strlen(p), TDM_TOKENIZE_PARSE_SPECIAL, ids, 64, &n, &err), TDM_OK);
    assert_int_equal(n, sizeof want / sizeof want[0]);
    assert_memory_equal(ids, want, sizeof want);
    tdm_chat_template_free(t);
    /* the micro fixtures carry the same template */
    tdm_tokenizer *tk2 = open_tk("tests/fixtures/micro-qwen3moe/micro-qwen3moe-f32.gguf");
    assert_int_equal(tdm_chat_template_from_tokenizer(tk2, &t, &err), TDM_OK);
    assert_int_equal(tdm_chat_template_kind(t), TDM_CHAT_QWEN3_SIMPLE);
    tdm_chat_template_free(t);
    tdm_tokenizer_free(tk2);
    tdm_tokenizer_free(tk);
}

static void test_buffer_and_roles(void **state)
{
    (void)state;
    tdm_chat_template *t = detect(demo_template, true);
    size_t len;
    tdm_error err;
    assert_int_equal(tdm_chat_render(t, convo, 4, true, 0, NULL, 0, &len, &err), TDM_ERR_INVALID);
    size_t need = strlen(CONVO_CHATML "<|im_start|>assistant\n<think>\n\n</think>\n\n");
    assert_int_equal(len, need);
    char small[16];
    assert_int_equal(tdm_chat_render(t, convo, 4, true, 0, small, sizeof small, &len, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.msg, "too small"));
    assert_int_equal(strlen(small), 15);
    char *exact = malloc(need + 1);
    assert_int_equal(tdm_chat_render(t, convo, 4, true, 0, exact, need + 1, &len, &err), TDM_OK);
    free(exact);
    tdm_chat_msg bad[2] = {{"user", "x", NULL}, {"robot", "y", NULL}};
    assert_int_equal(tdm_chat_render(t, bad, 2, true, -1, out, sizeof out, &len, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.msg, "robot"));
    bad[1].role = NULL;
    assert_int_equal(tdm_chat_render(t, bad, 2, true, -1, out, sizeof out, &len, &err), TDM_ERR_INVALID);
    /* NULL content renders as empty; zero messages is just the prompt */
    tdm_chat_msg empty = {"user", NULL, NULL};
    assert_string_equal(render(t, &empty, 1, false, -1), "<|im_start|>user\n<|im_end|>\n");
    assert_string_equal(render(t, NULL, 0, true, -1), "<|im_start|>assistant\n");
    tdm_chat_template_free(t);
}

static void test_detection(void **state)
{
    (void)state;
    tdm_chat_template *t = detect(NULL, true);
    assert_int_equal(tdm_chat_template_kind(t), TDM_CHAT_CHATML);
    /* plain ChatML ignores thinking */
    assert_string_equal(render(t, convo, 4, true, 0), CONVO_CHATML "<|im_start|>assistant\n");
    tdm_chat_template_free(t);
    tdm_error err;
    static const struct {
        const char *tmpl;
        bool im_start;
        const char *why;
    } bad[] = {
        {NULL, false, "no chat template"},
        {"{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>{% endfor %}", true,
         "not ChatML"},
        {"{% for message in messages %}<|im_start|>{{ message['role'] }}<|im_sep|>{{ message['content'] }}<|im_end|>"
         "{% endfor %}", true, "another family"},
        {"{% for message in messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou "
         "are Qwen, created by Alibaba Cloud.<|im_end|>\n{% endif %}<|im_start|>...<|im_end|>{% endfor %}", true,
         "default system prompt"},
        {"{% for message in messages %}<|im_start|><|im_end|>{% endfor %}{% if not enable_thinking %}x{% endif %}",
         true, "enable_thinking"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tdm_chat_template *x = (tdm_chat_template *)1;
        assert_int_equal(tdm_chat_template_detect(bad[i].tmpl, bad[i].tmpl ? strlen(bad[i].tmpl) : 0,
                                                  bad[i].im_start, &x, &err), TDM_ERR_UNSUPPORTED);
        assert_null(x);
        if (!strstr(err.msg, bad[i].why))
            fail_msg("case %zu: '%s' lacks '%s'", i, err.msg, bad[i].why);
    }
}

/* Condensed from the HF Qwen3 template: the features detection keys on. */
static const char qwen3_template[] =
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}"
    "{%- for message in messages %}"
    "{%- if message.role == \"assistant\" %}{%- if message.reasoning_content is string %}"
    "{{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' }}"
    "{%- endif %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == \"tool\" %}{{- '<|im_start|>user' }}{{- '\\n<tool_response>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}{%- endif %}";

static void test_qwen3_reasoning(void **state)
{
    (void)state;
    tdm_chat_template *t = detect(qwen3_template, true);
    assert_int_equal(tdm_chat_template_kind(t), TDM_CHAT_QWEN3);
    /* history before the last user query drops reasoning */
    assert_string_equal(render(t, convo, 4, true, 0),
                        CONVO_CHATML "<|im_start|>assistant\n<think>\n\n</think>\n\n");
    /* after the last query: reasoning (field or split out of content) is shown */
    const tdm_chat_msg tail[] = {
        {"user", "Hi", NULL},
        {"assistant", "\nfirst", "\nthinking one\n"},
        {"tool", "42", NULL},
        {"tool", "43", NULL},
        {"assistant", "<think>\nsplit me\n</think>\n\nanswer", NULL},
    };
    assert_string_equal(render(t, tail, 5, false, -1),
                        "<|im_start|>user\nHi<|im_end|>\n"
                        "<|im_start|>assistant\n<think>\nthinking one\n</think>\n\nfirst<|im_end|>\n"
                        "<|im_start|>user\n<tool_response>\n42\n</tool_response>\n<tool_response>\n43\n"
                        "</tool_response><|im_end|>\n"
                        "<|im_start|>assistant\n<think>\nsplit me\n</think>\n\nanswer<|im_end|>\n");
    /* an assistant turn before the last query: content split, reasoning dropped */
    const tdm_chat_msg early[] = {
        {"user", "a", NULL},
        {"assistant", "<think>x</think>\n\nb", NULL},
        {"user", "c", NULL},
    };
    assert_string_equal(render(t, early, 3, true, 1),
                        "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nb<|im_end|>\n"
                        "<|im_start|>user\nc<|im_end|>\n<|im_start|>assistant\n");
    /* last message, no reasoning: an empty think block is still written */
    const tdm_chat_msg last[] = {{"user", "a", NULL}, {"assistant", "b", NULL}};
    assert_string_equal(render(t, last, 2, false, -1),
                        "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nb<|im_end|>\n");
    tdm_chat_template_free(t);
}

static void test_qwen35_forms(void **state)
{
    (void)state;
    char tmpl[sizeof qwen3_template + 64];
    /* Qwen3.5: the generation prompt opens the think block */
    snprintf(tmpl, sizeof tmpl, "%s{%%- else %%}{{- '<think>\\n' }}", qwen3_template);
    tdm_chat_template *t = detect(tmpl, true);
    assert_int_equal(tdm_chat_template_kind(t), TDM_CHAT_QWEN35);
    tdm_chat_msg q = {"user", "Hi", NULL};
    assert_string_equal(render(t, &q, 1, true, -1), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n");
    assert_string_equal(render(t, &q, 1, true, 1), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n");
    assert_string_equal(render(t, &q, 1, true, 0),
                        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
    tdm_chat_template_free(t);
    /* inverted default (thinking only when enable_thinking is true) */
    const char inv[] = "{%- for message in messages %}<|im_start|><|im_end|>{%- endfor %}"
                       "{%- if enable_thinking is defined and enable_thinking is true %}{{- '<think>\\n' }}"
                       "{%- else %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}";
    t = detect(inv, true);
    assert_false(tdm_chat_template_thinks_by_default(t));
    assert_string_equal(render(t, &q, 1, true, -1),
                        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
    assert_string_equal(render(t, &q, 1, true, 1), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n");
    tdm_chat_template_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_demo_template), cmocka_unit_test(test_buffer_and_roles),
        cmocka_unit_test(test_detection),     cmocka_unit_test(test_qwen3_reasoning),
        cmocka_unit_test(test_qwen35_forms),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
