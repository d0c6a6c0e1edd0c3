/* generate: the fence repair, sentence-end and UTF-8 helpers on their own,
 * then the generator on the demo model (stop strings across tokens, the
 * streamed pieces, token caps, cancellation, prefix reuse, thinking budget). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "generate.h"
#include "model.h"

/* ---- fences ---- */

static void closer_of(const char *text, bool bytewise, char *out)
{
    tdm_fence_state f;
    tdm_fence_init(&f);
    size_t n = strlen(text);
    if (bytewise)
        for (size_t i = 0; i < n; i++)
            tdm_fence_feed(&f, text + i, 1);
    else
        tdm_fence_feed(&f, text, n);
    tdm_fence_closer(&f, out, 80);
}

static void expect_closer(const char *text, const char *want)
{
    char a[80], b[80];
    closer_of(text, false, a);
    closer_of(text, true, b);
    if (strcmp(a, want) || strcmp(b, want))
        fail_msg("closer of \"%s\": got \"%s\" / bytewise \"%s\", want \"%s\"", text, a, b, want);
}

static void test_fence_closer(void **state)
{
    (void)state;
    expect_closer("", "");
    expect_closer("plain text", "");
    expect_closer("```\n1\n2", "\n```");
    expect_closer("```\n1\n2\n", "```");
    expect_closer("```python\nprint(1)", "\n```");
    expect_closer("```\n1\n```", "");
    expect_closer("```\n1\n```\n", "");
    expect_closer("```\n1\n```  ", "");
    expect_closer("a\n```\nx\n```\nb\n```c\ny", "\n```");
    expect_closer("````\n```\nstill inside", "\n````");     /* a shorter run does not close */
    expect_closer("````\nx\n`````", "");                     /* a longer one does */
    expect_closer("   ```\nindented 3", "\n```");
    expect_closer("    ```\nindented 4 is code, not a fence", "");
    expect_closer("text ``` inline\nmore", "");
    expect_closer("``\nnot a fence", "");
    expect_closer("```\nx\n``` not a closer", "\n```");
    expect_closer("```\nx\n``", "\n```");
}

static void test_fence_closer_small_buffer(void **state)
{
    (void)state;
    tdm_fence_state f;
    tdm_fence_init(&f);
    tdm_fence_feed(&f, "```\nx", 5);
    char buf[3];
    size_t n = tdm_fence_closer(&f, buf, sizeof buf);
    assert_int_equal(n, 2);
    assert_string_equal(buf, "\n`");
    assert_int_equal(tdm_fence_closer(&f, buf, 0), 0);
}

static void test_sentence_ended(void **state)
{
    (void)state;
    assert_true(tdm_gen_sentence_ended("", 0));
    assert_true(tdm_gen_sentence_ended("Done.", 5));
    assert_true(tdm_gen_sentence_ended("Really?  ", 9));
    assert_true(tdm_gen_sentence_ended("Wow!", 4));
    assert_true(tdm_gen_sentence_ended("line\n", 5));
    assert_false(tdm_gen_sentence_ended("12 *", 4));
    assert_false(tdm_gen_sentence_ended("and then ", 9));
}

static void test_utf8_complete(void **state)
{
    (void)state;
    assert_int_equal(tdm_utf8_complete_len("abc", 3), 3);
    assert_int_equal(tdm_utf8_complete_len("a\xc3", 2), 1);          /* é cut after its lead */
    assert_int_equal(tdm_utf8_complete_len("a\xc3\xa9", 3), 3);
    assert_int_equal(tdm_utf8_complete_len("\xe2\x82", 2), 0);        /* € cut */
    assert_int_equal(tdm_utf8_complete_len("\xe2\x82\xac", 3), 3);
    assert_int_equal(tdm_utf8_complete_len("x\xf0\x9f\x98", 4), 1);  /* emoji cut */
    assert_int_equal(tdm_utf8_complete_len("\x80\x80", 2), 2);        /* stray bytes: nothing to wait for */
}

/* ---- the generator on the demo model ---- */

typedef struct capture {
    char text[2][8192];
    size_t len[2];
    int pieces;
    int n_prompt, n_reused;
    int cancel_after; /* pieces; 0 = never */
} capture;

static void on_prompt(void *user, int32_t n, int32_t reused)
{
    capture *c = user;
    c->n_prompt = n;
    c->n_reused = reused;
}

static void on_text(void *user, tdm_gen_part part, const char *t, size_t n)
{
    capture *c = user;
    assert_true(n > 0);
    assert_true(c->len[part] + n < sizeof c->text[part]);
    memcpy(c->text[part] + c->len[part], t, n);
    c->len[part] += n;
    c->text[part][c->len[part]] = '\0';
    c->pieces++;
}

static bool cancelled(void *user)
{
    capture *c = user;
    return c->cancel_after > 0 && c->pieces >= c->cancel_after;
}

typedef struct fixture {
    tdm_model *m;
    tdm_generator *g;
} fixture;

static int setup(void **state)
{
    char path[4096];
    const char *root = getenv("TDM_ROOT");
    snprintf(path, sizeof path, "%s/models/demo/demo-Q4_K_M.gguf", root && *root ? root : ".");
    fixture *f = calloc(1, sizeof *f);
    tdm_error err = {0};
    if (tdm_model_load(path, &f->m, &err) != TDM_OK || tdm_generator_new(f->m, 512, TDM_DEVICE_CPU, &f->g, &err) != TDM_OK) {
        fprintf(stderr, "demo model: %s\n", err.msg);
        return -1;
    }
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    tdm_generator_free(f->g);
    tdm_model_free(f->m);
    free(f);
    return 0;
}

static tdm_gen_result complete(fixture *f, const char *prompt, tdm_gen_params *p, capture *c)
{
    tdm_gen_callbacks cb = {on_prompt, on_text, cancelled, c};
    tdm_gen_result r;
    tdm_error err = {0};
    if (tdm_generator_complete(f->g, prompt, p, &cb, &r, &err) != TDM_OK)
        fail_msg("complete: %s", err.msg);
    return r;
}

static tdm_gen_result chat(fixture *f, const char *user, tdm_gen_thinking th, tdm_gen_params *p, capture *c)
{
    tdm_gen_message m = {"user", user, NULL};
    tdm_gen_callbacks cb = {on_prompt, on_text, cancelled, c};
    tdm_gen_result r;
    tdm_error err = {0};
    if (tdm_generator_chat(f->g, &m, 1, th, p, &cb, &r, &err) != TDM_OK)
        fail_msg("chat: %s", err.msg);
    return r;
}

static void greedy(tdm_gen_params *p, int max_tokens)
{
    tdm_gen_params_default(p);
    p->temperature = 0;
    p->max_tokens = max_tokens;
}

static void test_stop_string_across_tokens(void **state)
{
    fixture *f = *state;
    tdm_gen_params p;
    greedy(&p, 40);
    capture full = {0};
    tdm_gen_result r = complete(f, "The jury said", &p, &full);
    assert_int_equal(r.finish, TDM_GEN_FINISH_LENGTH);
    assert_int_equal(r.n_generated, 40);
    assert_true(full.pieces > 10);
    /* a stop string made of the middle of the text, spanning several tokens */
    size_t at = full.len[0] / 3;
    char stop[16];
    memcpy(stop, full.text[0] + at, 9);
    stop[9] = '\0';
    const char *stops[2] = {"\x01never", stop};
    p.stop = stops;
    p.n_stop = 2;
    capture c = {0};
    r = complete(f, "The jury said", &p, &c);
    assert_int_equal(r.finish, TDM_GEN_FINISH_STOP);
    assert_int_equal(r.stop_index, 1);
    const char *first = strstr(full.text[0], stop);
    assert_non_null(first);
    assert_int_equal(c.len[0], (size_t)(first - full.text[0]));
    assert_memory_equal(c.text[0], full.text[0], c.len[0]);
    assert_int_equal(c.len[1], 0);
}

static void test_prefix_reuse_and_determinism(void **state)
{
    fixture *f = *state;
    tdm_gen_params p;
    greedy(&p, 12);
    capture a = {0}, b = {0};
    complete(f, "In the morning the door opened", &p, &a);
    tdm_gen_result r = complete(f, "In the morning the door opened", &p, &b);
    assert_string_equal(a.text[0], b.text[0]);
    assert_true(r.n_reused > 0 && r.n_reused < r.n_prompt);
    capture c = {0};
    p.temperature = 0.9f;
    p.seed = 77;
    complete(f, "The city of Atlanta", &p, &c);
    capture d = {0};
    complete(f, "The city of Atlanta", &p, &d);
    assert_string_equal(c.text[0], d.text[0]);
}

static void test_chat_prefix_reuse(void **state)
{
    fixture *f = *state;
    tdm_gen_params p;
    greedy(&p, 30);
    capture a = {0}, b = {0}, c = {0};
    chat(f, "What is 12 + 7?", TDM_GEN_THINK_OFF, &p, &a);
    tdm_gen_result again = chat(f, "What is 12 + 7?", TDM_GEN_THINK_OFF, &p, &b);
    assert_string_equal(a.text[0], b.text[0]);
    assert_true(again.n_reused >= 10 && again.n_reused < again.n_prompt);
    tdm_gen_message turns[3] = {{"user", "What is 12 + 7?", NULL}, {"assistant", a.text[0], NULL},
                                {"user", "What is 3 times 4?", NULL}};
    tdm_gen_callbacks cb = {on_prompt, on_text, cancelled, &c};
    tdm_gen_result r;
    tdm_error err = {0};
    assert_int_equal(tdm_generator_chat(f->g, turns, 3, TDM_GEN_THINK_OFF, &p, &cb, &r, &err), TDM_OK);
    assert_true(r.n_reused >= again.n_reused);
    assert_true(r.n_prompt > again.n_prompt);
}

static void test_cancel(void **state)
{
    fixture *f = *state;
    tdm_gen_params p;
    greedy(&p, 200);
    p.ignore_eog = true;
    capture c = {.cancel_after = 5};
    tdm_gen_result r = complete(f, "The jury said", &p, &c);
    assert_int_equal(r.finish, TDM_GEN_FINISH_CANCELLED);
    assert_true(r.n_generated >= 5 && r.n_generated < 20);
}

static void test_ignore_eog_reaches_cap(void **state)
{
    fixture *f = *state;
    tdm_gen_params p;
    greedy(&p, 120);
    p.ignore_eog = true;
    capture c = {0};
    tdm_gen_result r = complete(f, "The jury said", &p, &c);
    assert_int_equal(r.finish, TDM_GEN_FINISH_LENGTH);
    assert_int_equal(r.n_generated, 120);
}

static void test_thinking_budget_and_parts(void **state)
{
    fixture *f = *state;
    tdm_gen_params p;
    greedy(&p, 100);
    capture free_ = {0};
    tdm_gen_result r = chat(f, "What is 12 + 7?", TDM_GEN_THINK_DEFAULT, &p, &free_);
    assert_int_equal(r.finish, TDM_GEN_FINISH_EOG);
    assert_true(free_.len[TDM_GEN_THINKING] > 0);
    assert_true(free_.len[TDM_GEN_ANSWER] > 0);
    assert_null(strstr(free_.text[TDM_GEN_THINKING], "think>"));
    assert_false(r.thinking_forced);
    p.max_thinking_tokens = 2;
    capture c = {0};
    r = chat(f, "What is 12 + 7?", TDM_GEN_THINK_DEFAULT, &p, &c);
    assert_true(r.thinking_forced);
    assert_true(c.len[TDM_GEN_THINKING] < free_.len[TDM_GEN_THINKING]);
    assert_true(c.len[TDM_GEN_ANSWER] > 0);
    capture off = {0};
    p.max_thinking_tokens = -1;
    r = chat(f, "What is 12 + 7?", TDM_GEN_THINK_OFF, &p, &off);
    assert_int_equal(off.len[TDM_GEN_THINKING], 0);
    assert_int_equal(r.n_thinking, 0);
}

static void test_fence_repair_on_model_output(void **state)
{
    fixture *f = *state;
    tdm_gen_params p;
    greedy(&p, 10);
    capture c = {0};
    tdm_gen_result r = chat(f, "List the numbers from 1 to 40 in a code block.", TDM_GEN_THINK_OFF, &p, &c);
    assert_int_equal(r.finish, TDM_GEN_FINISH_LENGTH);
    assert_true(r.fence_closed);
    assert_int_equal(strncmp(c.text[0], "```", 3), 0);
    assert_string_equal(c.text[0] + c.len[0] - 4, "\n```");
    p.repair_fences = false;
    capture raw = {0};
    r = chat(f, "List the numbers from 1 to 40 in a code block.", TDM_GEN_THINK_OFF, &p, &raw);
    assert_false(r.fence_closed);
    assert_int_equal(raw.len[0] + 4, c.len[0]);
}

static void test_bad_requests(void **state)
{
    fixture *f = *state;
    tdm_gen_params p;
    greedy(&p, 4);
    tdm_gen_result r;
    tdm_error err = {0};
    capture c = {0};
    tdm_gen_callbacks cb = {on_prompt, on_text, cancelled, &c};
    assert_int_equal(tdm_generator_complete(f->g, "", &p, &cb, &r, &err), TDM_ERR_INVALID);
    /* longer than the 512-token context */
    size_t n = 512 * 12;
    char *big = malloc(n + 1);
    for (size_t i = 0; i < n; i++)
        big[i] = "jury said "[i % 10];
    big[n] = '\0';
    assert_int_equal(tdm_generator_complete(f->g, big, &p, &cb, &r, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.msg, "context"));
    free(big);
    const char *empty_stop[1] = {""};
    p.stop = empty_stop;
    p.n_stop = 1;
    assert_int_equal(tdm_generator_complete(f->g, "x", &p, &cb, &r, &err), TDM_ERR_INVALID);
    tdm_gen_message bad = {"wizard", "x", NULL};
    p.n_stop = 0;
    assert_int_not_equal(tdm_generator_chat(f->g, &bad, 1, TDM_GEN_THINK_DEFAULT, &p, &cb, &r, &err), TDM_OK);
    /* the generator still works afterwards */
    capture ok = {0};
    complete(f, "The jury said", &p, &ok);
    assert_true(ok.len[0] > 0);
}

int main(void)
{
    const struct CMUnitTest pure[] = {
        cmocka_unit_test(test_fence_closer),
        cmocka_unit_test(test_fence_closer_small_buffer),
        cmocka_unit_test(test_sentence_ended),
        cmocka_unit_test(test_utf8_complete),
    };
    const struct CMUnitTest model[] = {
        cmocka_unit_test(test_stop_string_across_tokens),
        cmocka_unit_test(test_prefix_reuse_and_determinism),
        cmocka_unit_test(test_chat_prefix_reuse),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_ignore_eog_reaches_cap),
        cmocka_unit_test(test_thinking_budget_and_parts),
        cmocka_unit_test(test_fence_repair_on_model_output),
        cmocka_unit_test(test_bad_requests),
    };
    int failed = cmocka_run_group_tests_name("generate helpers", pure, NULL, NULL);
    failed += cmocka_run_group_tests_name("generator on the demo model", model, setup, teardown);
    return failed ? 1 : 0;
}
