/* gpu_model_util: what the GPU model tests (test_forward_gpu, test_hybrid_gpu)
 * share: the device check, model loading, the demo model with llama.cpp's
 * greedy continuations. Include after cmocka.h and model_fixtures.h. */
#ifndef TDM_GPU_MODEL_UTIL_H
#define TDM_GPU_MODEL_UTIL_H

#include "forward_gpu.h"
#include "gpu.h"
#include "model.h"

/* make test-gpu runs on a GPU machine: no device is a failure, not a skip. */
static __attribute__((unused)) void gm_need_gpu(void)
{
    if (!tdm_gpu_available())
        fail_msg("no CUDA device visible (make test-gpu needs one)");
}

/* Under compute-sanitizer (tests/gpu/sanitizer.sh sets TDM_SANITIZER) the
 * model tests run fewer prompts: the kernels are the same, 10-100x slower. */
static __attribute__((unused)) bool gm_sanitized(void) { return getenv("TDM_SANITIZER") != NULL; }

/* racecheck crashes inside cuBLAS's GEMM kernels ("Internal Sanitizer Error",
 * even with them excluded by name), and the broken context then fails every
 * later test: under racecheck a forward takes the matvec path for every batch
 * (our kernels only; memcheck and the plain run cover the GEMM path). */
static __attribute__((unused)) bool gm_racecheck(void)
{
    const char *san = getenv("TDM_SANITIZER");
    return san && !strcmp(san, "racecheck");
}

static __attribute__((unused)) void gm_race_safe(tdm_forward_gpu *f)
{
    if (f && gm_racecheck())
        tdm_forward_gpu_set_matmul_min(f, 1 << 30);
}

/* TDM_TEST_FILTER=name runs only the matching tests (cmocka's pattern):
 * tests/gpu/sanitizer.sh runs racecheck one test per process. */
static __attribute__((unused)) void gm_filter(void)
{
    const char *f = getenv("TDM_TEST_FILTER");
    if (f && *f)
        cmocka_set_test_filter(f);
}

static __attribute__((unused)) tdm_model *gm_load(const char *path)
{
    tdm_model *m = NULL;
    tdm_error err = {0};
    tdm_status st = tdm_model_load(path, &m, &err);
    if (st)
        fprintf(stderr, "load %s: %s\n", path, err.msg);
    assert_int_equal(st, TDM_OK);
    return m;
}

/* The demo model and models/demo/peer-greedy.json (caller frees both). */
static __attribute__((unused)) tdm_model *gm_demo(cJSON **peer_greedy)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/models/demo/peer-greedy.json", fx_root());
    *peer_greedy = fx_json(path);
    assert_non_null(*peer_greedy);
    snprintf(path, sizeof path, "%s/models/demo/demo-Q4_K_M.gguf", fx_root());
    return gm_load(path);
}

/* small-qwen35moe Q4_K_M and its reference.json (caller frees both). */
static __attribute__((unused)) tdm_model *gm_small_q4km(cJSON **ref, char *dir, size_t cap)
{
    char path[1400];
    fx_dir(dir, cap, "small-qwen35moe", 0);
    snprintf(path, sizeof path, "%s/reference.json", dir);
    *ref = fx_json(path);
    assert_non_null(*ref);
    snprintf(path, sizeof path, "%s/small-qwen35moe-Q4_K_M.gguf", dir);
    return gm_load(path);
}

#endif
