/* test_forward: the CPU forward against the float64 transformers references
 * of the micro models (qwen3moe, qwen35moe, qwen3next): logits of three
 * prompts, per-layer hidden states, greedy decoding through the session;
 * the two DeltaNet forms against each other; session truncation. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "forward.h"
#include "model.h"
#include "model_fixtures.h"
#include "session.h"

/* ---- op level: the chunked DeltaNet equals the recurrence ---- */

static float frand(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((*s >> 40) & 0xFFFFFF) / 16777216.0f * 2.0f - 1.0f;
}

static void deltanet_forms(int64_t n, int32_t dk, int32_t dv, int nonzero_state)
{
    uint64_t seed = 1234 + (uint64_t)n;
    const size_t qks = (size_t)dk + 3, vs = (size_t)dv + 5; /* odd strides on purpose */
    float *q = malloc(n * qks * 4), *k = malloc(n * qks * 4), *v = malloc(n * vs * 4);
    float *g = malloc(n * 4), *b = malloc(n * 4);
    float *o1 = malloc(n * vs * 4), *o2 = malloc(n * vs * 4);
    float *S1 = malloc((size_t)dk * dv * 4), *S2 = malloc((size_t)dk * dv * 4);
    float *ws = malloc(tdm_op_deltanet_ws_floats(dk, dv) * 4);
    for (int64_t t = 0; t < n; t++) {
        double nq = 0, nk = 0;
        for (int32_t i = 0; i < dk; i++) {
            q[t * qks + i] = frand(&seed);
            k[t * qks + i] = frand(&seed);
            nq += q[t * qks + i] * q[t * qks + i];
            nk += k[t * qks + i] * k[t * qks + i];
        }
        for (int32_t i = 0; i < dk; i++) { /* as the layer feeds it: unit k, scaled unit q */
            q[t * qks + i] /= (float)sqrt(nq * dk);
            k[t * qks + i] /= (float)sqrt(nk);
        }
        for (int32_t i = 0; i < dv; i++)
            v[t * vs + i] = frand(&seed);
        g[t] = -fabsf(frand(&seed)) * 0.5f;
        b[t] = 0.5f + 0.5f * frand(&seed);
    }
    for (int32_t i = 0; i < dk * dv; i++)
        S1[i] = S2[i] = nonzero_state ? 0.3f * frand(&seed) : 0.0f;
    memset(o1, 0xff, n * vs * 4); /* poison */
    memset(o2, 0xff, n * vs * 4);
    tdm_op_deltanet_recurrent(q, k, qks, v, vs, g, b, n, dk, dv, S1, o1);
    tdm_op_deltanet_chunked(q, k, qks, v, vs, g, b, n, dk, dv, S2, o2, ws);
    double num = 0, den = 0;
    for (int64_t t = 0; t < n; t++)
        for (int32_t i = 0; i < dv; i++) {
            double d = (double)o1[t * vs + i] - o2[t * vs + i];
            num += d * d;
            den += (double)o1[t * vs + i] * o1[t * vs + i];
        }
    double err_o = sqrt(num / den), err_s = fx_rel_l2(S2, S1, (size_t)dk * dv);
    printf("deltanet n=%lld dk=%d dv=%d state=%d: rel err output %.2e, state %.2e\n", (long long)n, dk, dv,
           nonzero_state, err_o, err_s);
    assert_true(err_o < 1e-4);
    assert_true(err_s < 1e-4);
    free(q), free(k), free(v), free(g), free(b), free(o1), free(o2), free(S1), free(S2), free(ws);
}

static void test_deltanet_chunked_equals_recurrent(void **state)
{
    (void)state;
    deltanet_forms(1, 8, 8, 0);
    deltanet_forms(64, 16, 16, 0);
    deltanet_forms(150, 16, 24, 1); /* two full chunks and a partial one */
    deltanet_forms(130, 64, 64, 1);
}

static void test_router_topk(void **state)
{
    (void)state;
    const float logits[6] = {0.1f, 2.0f, -1.0f, 2.0f, 1.5f, 0.0f};
    int32_t ids[3];
    float w[3];
    tdm_op_router_topk(logits, 6, 3, true, ids, w);
    assert_int_equal(ids[0], 1); /* tie with 3 goes to the lower id */
    assert_int_equal(ids[1], 3);
    assert_int_equal(ids[2], 4);
    double e1 = exp(2.0), e4 = exp(1.5);
    assert_float_equal(w[0], e1 / (2 * e1 + e4), 1e-6);
    assert_float_equal(w[2], e4 / (2 * e1 + e4), 1e-6);
    tdm_op_router_topk(logits, 6, 1, false, ids, w);
    double sum = 0;
    for (int i = 0; i < 6; i++)
        sum += exp(logits[i]);
    assert_float_equal(w[0], exp(2.0) / sum, 1e-6);
}

static void test_rope_partial(void **state)
{
    (void)state;
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    tdm_op_rope_neox(x, 4, 3, 10000.0);
    /* pairs (0,2) and (1,3); dims 4..7 untouched */
    double t0 = 3.0, t1 = 3.0 * pow(10000.0, -0.5);
    assert_float_equal(x[0], 1 * cos(t0) - 3 * sin(t0), 1e-6);
    assert_float_equal(x[2], 3 * cos(t0) + 1 * sin(t0), 1e-6);
    assert_float_equal(x[1], 2 * cos(t1) - 4 * sin(t1), 1e-6);
    assert_float_equal(x[3], 4 * cos(t1) + 2 * sin(t1), 1e-6);
    assert_float_equal(x[4], 5, 0);
    assert_float_equal(x[7], 8, 0);
}

/* ---- model level ---- */




/* Logits of every position from one eval; compares to the reference. */
static void check_prompt(fx_micro *mc, const char *prompt, int32_t batch, tdm_deltanet_mode mode)
{
    const cJSON *p = cJSON_GetObjectItem(cJSON_GetObjectItem(mc->ref, "prompts"), prompt);
    int32_t tokens[512];
    int n = fx_ints(cJSON_GetObjectItem(p, "tokens"), tokens, 512);
    const int V = mc->hp->n_vocab;
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", mc->dir, cJSON_GetObjectItem(p, "logits_file")->valuestring);
    float *ref = fx_f32(path, (size_t)n * V);
    assert_non_null(ref);
    float *out = malloc((size_t)n * V * sizeof(float));
    tdm_forward *f;
    tdm_error err = {0};
    assert_int_equal(tdm_forward_new(mc->m, n + 8, batch, &f, &err), TDM_OK);
    tdm_forward_set_deltanet_mode(f, mode);
    assert_int_equal(tdm_forward_eval(f, tokens, n, 0, out, true, &err), TDM_OK);
    double rel = fx_rel_l2(out, ref, (size_t)n * V), top1 = fx_top1(out, ref, n, V);
    printf("  %-5s n=%3d batch=%3d mode=%d: rel L2 %.3e, top-1 %.4f, mean KL %.2e\n", prompt, n, batch, mode, rel,
           top1, fx_mean_kl(ref, out, n, V));
    assert_true(rel <= 1e-3);
    assert_true(top1 == 1.0);
    /* logits of the last position only: the same row */
    float *last = malloc((size_t)V * sizeof(float));
    tdm_forward_reset(f);
    assert_int_equal(tdm_forward_eval(f, tokens, n, 0, last, false, &err), TDM_OK);
    assert_true(fx_rel_l2(last, out + (size_t)(n - 1) * V, V) < 1e-5);
    free(last);
    tdm_forward_free(f);
    free(out);
    free(ref);
}

static void check_hidden(fx_micro *mc)
{
    const cJSON *p = cJSON_GetObjectItem(cJSON_GetObjectItem(mc->ref, "prompts"), "short");
    int32_t tokens[64];
    int n = fx_ints(cJSON_GetObjectItem(p, "tokens"), tokens, 64);
    const int L = mc->hp->n_layer, d = mc->hp->n_embd;
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", mc->dir, cJSON_GetObjectItem(p, "hidden_file")->valuestring);
    const size_t total = (size_t)(L + 1) * n * d;
    float *ref = fx_f32(path, total), *cap = malloc(total * sizeof(float));
    assert_non_null(ref);
    memset(cap, 0xff, total * sizeof(float));
    tdm_forward *f;
    tdm_error err = {0};
    assert_int_equal(tdm_forward_new(mc->m, n, 512, &f, &err), TDM_OK);
    tdm_forward_set_capture(f, cap);
    assert_int_equal(tdm_forward_eval(f, tokens, n, 0, NULL, false, &err), TDM_OK);
    double worst = 0;
    for (int e = 0; e <= L; e++) {
        double r = fx_rel_l2(cap + (size_t)e * n * d, ref + (size_t)e * n * d, (size_t)n * d);
        worst = r > worst ? r : worst;
    }
    printf("  hidden states (%d entries): worst rel L2 %.3e\n", L + 1, worst);
    assert_true(worst <= 1e-3);
    tdm_forward_free(f);
    free(cap);
    free(ref);
}

static void check_greedy(fx_micro *mc)
{
    const cJSON *p = cJSON_GetObjectItem(cJSON_GetObjectItem(mc->ref, "prompts"), "short");
    int32_t tokens[64], want[64];
    int n = fx_ints(cJSON_GetObjectItem(p, "tokens"), tokens, 64);
    int ng = fx_ints(cJSON_GetObjectItem(p, "greedy_24"), want, 64);
    tdm_session *s;
    tdm_error err = {0};
    assert_int_equal(tdm_session_new(mc->m, n + ng + 1, &s, &err), TDM_OK);
    int route_calls = 0;
    tdm_session_set_route_hook(s, fx_count_routes, &route_calls);
    assert_int_equal(tdm_session_eval(s, tokens, n, NULL, &err), TDM_OK);
    assert_int_equal(route_calls, n * mc->hp->n_layer);
    int match = 0;
    for (int i = 0; i < ng; i++) {
        int32_t t = fx_argmax(tdm_session_logits(s), mc->hp->n_vocab);
        match += t == want[i];
        assert_int_equal(t, want[i]);
        if (i + 1 < ng)
            assert_int_equal(tdm_session_eval(s, &t, 1, NULL, &err), TDM_OK);
    }
    printf("  greedy_24 through the session: %d/%d tokens match\n", match, ng);
    /* greedy_last: the last position's logits recomputed without the cache */
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", mc->dir, cJSON_GetObjectItem(p, "greedy_last_logits_file")->valuestring);
    float *ref = fx_f32(path, (size_t)mc->hp->n_vocab);
    assert_non_null(ref);
    /* the reference is the position after the 24th greedy token */
    assert_int_equal(tdm_session_eval(s, &want[ng - 1], 1, NULL, &err), TDM_OK);
    double rel = fx_rel_l2(tdm_session_logits(s), ref, mc->hp->n_vocab);
    printf("  greedy_last logits (incremental path) vs reference: rel L2 %.3e\n", rel);
    assert_true(rel <= 1e-3);
    /* overflow is refused and leaves the session untouched */
    int32_t n_past = tdm_session_n_past(s);
    assert_int_equal(tdm_session_eval(s, tokens, n, NULL, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_session_n_past(s), n_past);
    int32_t bad = mc->hp->n_vocab;
    assert_int_equal(tdm_session_eval(s, &bad, 1, NULL, &err), TDM_ERR_INVALID);
    /* greedy steps: the same tokens, the choice written after the token it
     * may alias is read, no logits left behind, bad input refused */
    tdm_session_reset(s);
    int32_t t = -1;
    assert_int_equal(tdm_session_eval_greedy(s, tokens, n, &t, &err), TDM_OK);
    assert_null(tdm_session_logits(s));
    for (int i = 0; i < ng; i++) {
        assert_int_equal(t, want[i]);
        assert_int_equal(tdm_session_eval_greedy(s, &t, 1, &t, &err), TDM_OK);
        assert_int_equal(tdm_session_tokens(s)[n + i], want[i]);
    }
    assert_int_equal(tdm_session_eval_greedy(s, &bad, 1, &t, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_session_eval_greedy(s, tokens, 1, NULL, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_session_n_past(s), n + ng);
    assert_int_equal(tdm_session_eval(s, tokens, 1, NULL, &err), TDM_OK);
    assert_non_null(tdm_session_logits(s));
    free(ref);
    tdm_session_free(s);
}

/* Truncation back to the prompt checkpoint reproduces the same continuation. */
static void check_truncate(fx_micro *mc)
{
    const cJSON *p = cJSON_GetObjectItem(cJSON_GetObjectItem(mc->ref, "prompts"), "chat");
    int32_t tokens[64];
    int n = fx_ints(cJSON_GetObjectItem(p, "tokens"), tokens, 64);
    const int V = mc->hp->n_vocab;
    tdm_session *s;
    tdm_error err = {0};
    assert_int_equal(tdm_session_new(mc->m, 128, &s, &err), TDM_OK);
    assert_int_equal(tdm_session_eval(s, tokens, n, NULL, &err), TDM_OK);
    float *l0 = malloc(V * sizeof(float)), *l1 = malloc(V * sizeof(float));
    int32_t extra[3] = {5, 17, 200};
    assert_int_equal(tdm_session_eval(s, extra, 1, NULL, &err), TDM_OK);
    assert_int_equal(tdm_session_eval(s, extra + 1, 1, NULL, &err), TDM_OK);
    memcpy(l0, tdm_session_logits(s), V * sizeof(float));
    assert_int_equal(tdm_session_eval(s, extra + 2, 1, NULL, &err), TDM_OK);
    int32_t kept = tdm_session_truncate(s, n + 1);
    if (mc->hp->n_rec_layers)
        assert_int_equal(kept, n); /* back to the prompt's checkpoint */
    else
        assert_int_equal(kept, n + 1);
    assert_int_equal(tdm_session_n_past(s), kept);
    assert_int_equal(tdm_session_eval(s, extra + (kept - n), n + 2 - kept, NULL, &err), TDM_OK);
    memcpy(l1, tdm_session_logits(s), V * sizeof(float));
    double rel = fx_rel_l2(l1, l0, V);
    printf("  truncate(%d) kept %d; continuation rel diff %.2e\n", n + 1, kept, rel);
    assert_true(rel < 1e-5);
    /* below the checkpoint: recurrent models start over */
    kept = tdm_session_truncate(s, n - 1);
    assert_int_equal(kept, mc->hp->n_rec_layers ? 0 : n - 1);
    free(l0), free(l1);
    tdm_session_free(s);
}

static void run_micro(const char *name)
{
    fx_micro mc;
    fx_micro_open(&mc, name);
    check_prompt(&mc, "short", 512, TDM_DELTANET_AUTO);
    check_prompt(&mc, "chat", 512, TDM_DELTANET_AUTO);
    check_prompt(&mc, "long", 512, TDM_DELTANET_AUTO);
    check_prompt(&mc, "long", 50, TDM_DELTANET_AUTO); /* several batches, partial chunks */
    if (mc.hp->n_rec_layers)
        check_prompt(&mc, "long", 512, TDM_DELTANET_RECURRENT);
    check_hidden(&mc);
    check_greedy(&mc);
    check_truncate(&mc);
    fx_micro_close(&mc);
}

static void test_micro_qwen3moe(void **state) { (void)state; run_micro("micro-qwen3moe"); }
static void test_micro_qwen35moe(void **state) { (void)state; run_micro("micro-qwen35moe"); }
static void test_micro_qwen3next(void **state) { (void)state; run_micro("micro-qwen3next"); }

static void test_bad_model_files(void **state)
{
    (void)state;
    tdm_model *m = (tdm_model *)0x1;
    tdm_error err = {0};
    assert_int_not_equal(tdm_model_load("/nonexistent/model.gguf", &m, &err), TDM_OK);
    assert_null(m);
    /* a GGUF that is not one of the supported architectures */
    char path[1200];
    snprintf(path, sizeof path, "%s/tests/fixtures/quant/manifest.json", fx_root());
    assert_int_not_equal(tdm_model_load(path, &m, &err), TDM_OK);
    assert_null(m);
}

int main(void)
{
    printf("fixture set: vendored tests/fixtures (micro models are identical in the full set)\n");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deltanet_chunked_equals_recurrent),
        cmocka_unit_test(test_router_topk),
        cmocka_unit_test(test_rope_partial),
        cmocka_unit_test(test_micro_qwen3moe),
        cmocka_unit_test(test_micro_qwen35moe),
        cmocka_unit_test(test_micro_qwen3next),
        cmocka_unit_test(test_bad_model_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
