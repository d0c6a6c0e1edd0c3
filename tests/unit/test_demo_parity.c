/* test_demo_parity: the demo model (Q4_K_M, qwen35moe + MTP block) teacher-
 * forced on each prompt of models/demo/peer-greedy.json followed by
 * llama.cpp's greedy tokens: the engine's argmax must equal llama.cpp's next
 * token at >= 97% of positions overall. Prints the agreement and the common
 * greedy prefix per prompt. One forward pass per prompt. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "forward.h"
#include "model.h"
#include "model_fixtures.h"

static void test_demo_teacher_forced(void **state)
{
    (void)state;
    char path[1200];
    snprintf(path, sizeof path, "%s/models/demo/peer-greedy.json", fx_root());
    cJSON *pg = fx_json(path);
    assert_non_null(pg);
    snprintf(path, sizeof path, "%s/models/demo/demo-Q4_K_M.gguf", fx_root());
    tdm_model *m;
    tdm_error err = {0};
    tdm_status st = tdm_model_load(path, &m, &err);
    if (st)
        fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(st, TDM_OK);
    assert_non_null(tdm_model_mtp(m)); /* the MTP block is bound, not run */
    assert_int_equal(tdm_model_hparams(m)->n_layer, 8);
    const int V = tdm_model_hparams(m)->n_vocab;
    int total = 0, agree = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(pg, "cases"))
    {
        int32_t tok[1024];
        int np = fx_ints(cJSON_GetObjectItem(c, "prompt_tokens"), tok, 512);
        int ng = fx_ints(cJSON_GetObjectItem(c, "greedy_tokens"), tok + np, 512);
        const int n = np + ng - 1; /* the last greedy token is only predicted */
        float *logits = malloc((size_t)n * V * sizeof(float));
        tdm_forward *f;
        assert_int_equal(tdm_forward_new(m, n, 512, &f, &err), TDM_OK);
        assert_int_equal(tdm_forward_eval(f, tok, n, 0, logits, true, &err), TDM_OK);
        int a = 0, prefix = -1;
        for (int i = 0; i < ng; i++) {
            int pred = fx_argmax(logits + (size_t)(np - 1 + i) * V, V);
            if (pred == tok[np + i])
                a++;
            else if (prefix < 0)
                prefix = i;
        }
        if (prefix < 0)
            prefix = ng;
        printf("  %-40.40s agreement %d/%d, common greedy prefix %d\n", cJSON_GetObjectItem(c, "prompt")->valuestring,
               a, ng, prefix);
        total += ng;
        agree += a;
        tdm_forward_free(f);
        free(logits);
    }
    printf("demo teacher-forced agreement with llama.cpp: %d/%d = %.4f\n", agree, total, (double)agree / total);
    assert_true(total > 0);
    assert_true(agree >= 0.97 * total);
    tdm_model_free(m);
    cJSON_Delete(pg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_demo_teacher_forced),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
