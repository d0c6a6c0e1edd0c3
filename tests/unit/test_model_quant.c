/* test_model_quant: small-qwen35moe (hidden 256, real K-quant rows) in bf16
 * and quantised GGUFs against the float64 reference and llama.cpp's logits:
 * mean KL(ref || engine) <= 1.1 x KL(ref || llama.cpp) on the same file and
 * prompt, and top-1 agreement with llama.cpp >= 0.95. The vendored set has
 * Q4_K_M (short, chat); the full set (../shared/fixtures) all seven files and
 * three prompts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "forward.h"
#include "model.h"
#include "model_fixtures.h"
#include "session.h"

static const char *const files[] = {"bf16", "Q8_0", "Q6_K", "Q4_K_M", "Q4_0", "Q2_K", "IQ4_XS"};
static const char *const prompts[] = {"short", "long", "chat"};

static int ran;

/* bf16 weights are exact in the reference: hidden states and greedy decoding
 * through the session must match like the f32 micro models. */
static void check_bf16_extras(const char *dir, const cJSON *ref, tdm_model *m)
{
    const tdm_hparams *hp = tdm_model_hparams(m);
    const cJSON *pr = cJSON_GetObjectItem(cJSON_GetObjectItem(ref, "prompts"), "short");
    int32_t tokens[64], want[64];
    int n = fx_ints(cJSON_GetObjectItem(pr, "tokens"), tokens, 64);
    int ng = fx_ints(cJSON_GetObjectItem(pr, "greedy_24"), want, 64);
    char path[1400];
    snprintf(path, sizeof path, "%s/%s", dir, cJSON_GetObjectItem(pr, "hidden_file")->valuestring);
    const size_t total = (size_t)(hp->n_layer + 1) * n * hp->n_embd;
    float *href = fx_f32(path, total), *cap = malloc(total * sizeof(float));
    assert_non_null(href);
    tdm_forward *f;
    tdm_error err = {0};
    assert_int_equal(tdm_forward_new(m, n, 512, &f, &err), TDM_OK);
    tdm_forward_set_capture(f, cap);
    assert_int_equal(tdm_forward_eval(f, tokens, n, 0, NULL, false, &err), TDM_OK);
    double rel = fx_rel_l2(cap, href, total);
    tdm_forward_free(f);
    tdm_session *s;
    assert_int_equal(tdm_session_new(m, n + ng, &s, &err), TDM_OK);
    assert_int_equal(tdm_session_eval(s, tokens, n, NULL, &err), TDM_OK);
    int match = 0;
    for (int i = 0; i < ng; i++) {
        int32_t t = fx_argmax(tdm_session_logits(s), hp->n_vocab);
        match += t == want[i];
        if (i + 1 < ng)
            assert_int_equal(tdm_session_eval(s, &t, 1, NULL, &err), TDM_OK);
    }
    printf("  bf16    hidden states rel L2 %.2e, greedy_24 through the session %d/%d\n", rel, match, ng);
    assert_true(rel <= 1e-3);
    assert_int_equal(match, ng);
    tdm_session_free(s);
    free(cap);
    free(href);
}

static void run_file(const char *dir, const cJSON *ref, const char *q)
{
    char path[1400];
    snprintf(path, sizeof path, "%s/small-qwen35moe-%s.gguf", dir, q);
    if (!fx_exists(path))
        return;
    tdm_model *m;
    tdm_error err = {0};
    tdm_status st = tdm_model_load(path, &m, &err);
    if (st)
        fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(st, TDM_OK);
    const int V = tdm_model_hparams(m)->n_vocab;
    for (int p = 0; p < 3; p++) {
        const cJSON *pr = cJSON_GetObjectItem(cJSON_GetObjectItem(ref, "prompts"), prompts[p]);
        int32_t tokens[512];
        int n = fx_ints(cJSON_GetObjectItem(pr, "tokens"), tokens, 512);
        char rpath[1400], ppath[1400];
        snprintf(rpath, sizeof rpath, "%s/%s", dir, cJSON_GetObjectItem(pr, "logits_file")->valuestring);
        snprintf(ppath, sizeof ppath, "%s/peer-small-qwen35moe-%s-%s.logits.f32", dir, q, prompts[p]);
        if (!fx_exists(rpath) || !fx_exists(ppath))
            continue;
        float *lr = fx_f32(rpath, (size_t)n * V), *lp = fx_f32(ppath, (size_t)n * V);
        assert_non_null(lr);
        assert_non_null(lp);
        float *le = malloc((size_t)n * V * sizeof(float));
        tdm_forward *f;
        assert_int_equal(tdm_forward_new(m, n, 512, &f, &err), TDM_OK);
        assert_int_equal(tdm_forward_eval(f, tokens, n, 0, le, true, &err), TDM_OK);
        double kl_e = fx_mean_kl(lr, le, n, V), kl_p = fx_mean_kl(lr, lp, n, V);
        double top1_peer = fx_top1(le, lp, n, V), top1_ref = fx_top1(le, lr, n, V);
        double rel = fx_rel_l2(le, lr, (size_t)n * V);
        printf("  %-7s %-5s n=%3d  KL(ref||engine) %.3e  KL(ref||llama.cpp) %.3e  ratio %.3f  top-1 vs llama.cpp %.4f"
               "  vs ref %.4f  rel L2 vs ref %.2e\n",
               q, prompts[p], n, kl_e, kl_p, kl_e / kl_p, top1_peer, top1_ref, rel);
        assert_true(kl_e <= 1.1 * kl_p);
        assert_true(top1_peer >= 0.95);
        ran++;
        tdm_forward_free(f);
        free(le), free(lr), free(lp);
    }
    if (!strcmp(q, "bf16"))
        check_bf16_extras(dir, ref, m);
    tdm_model_free(m);
}

static void test_small_qwen35moe(void **state)
{
    (void)state;
    char dir[1024], path[1200];
    fx_dir(dir, sizeof dir, "small-qwen35moe", 1);
    printf("fixture set: %s (%s)\n", dir, strstr(dir, "shared/fixtures") ? "full" : "vendored");
    snprintf(path, sizeof path, "%s/reference.json", dir);
    cJSON *ref = fx_json(path);
    assert_non_null(ref);
    ran = 0;
    for (size_t i = 0; i < sizeof files / sizeof *files; i++)
        run_file(dir, ref, files[i]);
    printf("  %d file x prompt cases checked\n", ran);
    assert_true(ran >= 2);
    cJSON_Delete(ref);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_small_qwen35moe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
