/* test_no_alloc: the per-token path allocates nothing (DESIGN.md §4). On the
 * demo model (Q4_K_M, MTP head), after a prompt and two warm-up steps, with
 * every thread's heap allocations counted (alloc_count.h):
 *   - CPU session decode steps, logits out and greedy;
 *   - the hybrid schedule's CPU emulation (executor on the session's forward,
 *     half the experts cached, a pool of 2 threads, the adaptive cache
 *     policy swapping every step) decode steps;
 *   - whole generations (sampler with top-k/top-p/min-p and penalties, a stop
 *     string, streaming detokenisation): 40 tokens allocate exactly as much
 *     as 8, so nothing is allocated per token.
 * The counter (malloc, calloc, realloc and the aligned kinds, which libgomp
 * uses for a parallel region's team) is checked to count. Sanitizer builds
 * skip (own allocator). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc_count.h"
#include "executor.h"
#include "generate.h"
#include "session.h"
#include "topology.h"

#define WARM 2
#define STEPS 16

static tdm_model *model;

static int setup(void **state)
{
    (void)state;
    const char *root = getenv("TDM_ROOT");
    char path[4096];
    snprintf(path, sizeof path, "%s/models/demo/demo-Q4_K_M.gguf", root && *root ? root : ".");
    tdm_error err = {0};
    if (tdm_model_load(path, &model, &err) != TDM_OK) {
        fprintf(stderr, "demo model: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tdm_model_free(model);
    return 0;
}

static void prompt_tokens(int32_t *tok, int n)
{
    const int32_t V = tdm_model_hparams(model)->n_vocab;
    for (int i = 0; i < n; i++)
        tok[i] = (int32_t)((i * 7919 + 13) % V);
}

/* WARM then STEPS decode steps on s, alternating logits out and greedy;
 * returns the allocations of the STEPS. */
static int decode_allocs(tdm_session *s)
{
    tdm_error err = {0};
    int32_t tok[8];
    prompt_tokens(tok, 8);
    assert_int_equal(tdm_session_eval(s, tok, 8, NULL, &err), TDM_OK);
    int32_t next = tok[7];
    for (int i = 0; i < WARM + STEPS; i++) {
        if (i == WARM)
            alloc_count_start();
        if (i % 2)
            assert_int_equal(tdm_session_eval_greedy(s, &next, 1, &next, &err), TDM_OK);
        else {
            assert_int_equal(tdm_session_eval(s, &next, 1, NULL, &err), TDM_OK);
            next = (next + 101) % tdm_model_hparams(model)->n_vocab;
        }
    }
    return alloc_count_stop();
}

static void test_counter_counts(void **state)
{
    (void)state;
    alloc_count_or_skip();
    alloc_count_start();
    void *volatile a = malloc(8); /* volatile: the calls must not be optimised away */
    void *volatile b = calloc(2, 8);
    void *volatile c = realloc(NULL, 8);
    void *volatile d = aligned_alloc(64, 64);
    int calls = alloc_count_stop();
    free(a), free(b), free(c), free(d);
    assert_int_equal(calls, 4);
    alloc_count_start(); /* another thread's calls count too */
#pragma omp parallel num_threads(2)
    {
        void *volatile p = malloc(8);
        free(p);
    }
    calls = alloc_count_stop();
    assert_true(calls >= 2);
}

static void test_cpu_decode(void **state)
{
    (void)state;
    alloc_count_or_skip();
    tdm_session *s;
    tdm_error err = {0};
    assert_int_equal(tdm_session_new(model, 64, &s, &err), TDM_OK);
    const int calls = decode_allocs(s);
    printf("  CPU session: %d allocations in %d decode steps\n", calls, STEPS);
    assert_int_equal(calls, 0);
    tdm_session_free(s);
}

static void test_hybrid_emulation_decode(void **state)
{
    (void)state;
    alloc_count_or_skip();
    const tdm_hparams *hp = tdm_model_hparams(model);
    tdm_topology *topo = NULL;
    tdm_error err = {0};
    assert_int_equal(tdm_topology_load(&topo, &err), TDM_OK);
    tdm_session *s;
    assert_int_equal(tdm_session_new(model, 64, &s, &err), TDM_OK);
    tdm_executor_params p;
    tdm_executor_params_init(&p);
    p.n_ctx = 64;
    p.max_batch = 8;
    p.topo = topo;
    p.n_threads = 2;
    p.n_slots = hp->n_layer * hp->n_expert / 2;
    p.policy = TDM_CACHE_ADAPTIVE;
    p.per_layer = true;
    p.adapt_every = 1; /* the policy runs, and may swap, after every step */
    tdm_executor *x;
    assert_int_equal(tdm_executor_new(model, &p, &x, &err), TDM_OK);
    tdm_executor_attach(x, tdm_session_forward(s));
    omp_set_num_threads(1);
    const int calls = decode_allocs(s);
    tdm_executor_stats st;
    tdm_executor_get_stats(x, &st);
    printf("  hybrid emulation: %d allocations in %d decode steps (%lld pool jobs, %lld swaps in all)\n", calls, STEPS,
           (long long)st.pool_wakes, (long long)st.swaps);
    assert_true(st.pool_wakes > 0); /* the pool did run */
    assert_int_equal(calls, 0);
    tdm_session_free(s);
    tdm_executor_free(x);
    tdm_topology_free(topo);
    omp_set_num_threads(omp_get_num_procs());
}

static void on_text(void *user, tdm_gen_part part, const char *t, size_t n)
{
    (void)part, (void)t;
    *(size_t *)user += n;
}

/* Allocations of one whole generation of n tokens. */
static int generation_allocs(tdm_generator *g, int32_t n)
{
    tdm_gen_params p;
    tdm_gen_params_default(&p);
    p.max_tokens = n;
    p.ignore_eog = true;
    p.temperature = 0.9f;
    p.top_k = 20;
    p.top_p = 0.9f;
    p.min_p = 0.02f;
    p.repeat_penalty = 1.1f;
    p.presence_penalty = 0.2f;
    p.seed = 42;
    static const char *const stop[1] = {"\n\n\n\n\n\n"};
    p.stop = stop;
    p.n_stop = 1;
    size_t bytes = 0;
    tdm_gen_callbacks cb = {NULL, on_text, NULL, &bytes};
    tdm_gen_result r;
    tdm_error err = {0};
    alloc_count_start();
    const tdm_status st = tdm_generator_complete(g, "Once upon a time", &p, &cb, &r, &err);
    const int calls = alloc_count_stop();
    assert_int_equal(st, TDM_OK);
    assert_int_equal(r.n_generated, n);
    assert_true(bytes > 0);
    return calls;
}

static void test_generation(void **state)
{
    (void)state;
    alloc_count_or_skip();
    tdm_generator *g;
    tdm_error err = {0};
    assert_int_equal(tdm_generator_new(model, 256, TDM_DEVICE_CPU, &g, &err), TDM_OK);
    generation_allocs(g, 4); /* warm-up: OpenMP teams, first-use buffers */
    const int short_run = generation_allocs(g, 8), long_run = generation_allocs(g, 40);
    printf("  generation: %d allocations for 8 tokens, %d for 40\n", short_run, long_run);
    assert_int_equal(long_run, short_run);
    tdm_generator_free(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counter_counts),
        cmocka_unit_test(test_cpu_decode),
        cmocka_unit_test(test_hybrid_emulation_decode),
        cmocka_unit_test(test_generation),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
