/* test_gpu_model_bind: test_model_bind's hostile-model sweeps on the resident
 * GPU forward (engine/forward_gpu.h). The edits (tests/unit/model_edit.h):
 * every u32/f32 metadata key of the three micro models at edge values, and
 * the tensors of blk.0, blk.3 and outside the layers rewritten in other
 * types. Each copy that binds runs on the CPU forward and on the GPU
 * forward: a 12-token prompt in one batch (the GPU's prompt path: GEMM and
 * grouped MoE), then two one-token decode steps (the decode kernels in a
 * CUDA graph, recorded at the first and replayed at the second); compared
 * are the logits of the prompt's last row and of both steps.
 *
 * Always: no crash, no out-of-bounds access (tests/gpu/sanitizer.sh runs
 * this under memcheck, racecheck and synccheck) and every refusal, at
 * creation or in an eval, carries a message. Where the CPU ran and all its
 * logits are finite, also:
 *  - the GPU runs too, unless it refuses with TDM_ERR_UNSUPPORTED: the code
 *    forward_gpu.c and the kernels give a valid model they have no kernel
 *    for ("forward_gpu: <tensor> has type <type> without GPU kernels",
 *    "gpu moe: <matrix> type <type> has no GPU kernel", "gpu deltanet:
 *    d_k=<n> (supported: ...)"). Any other refusal fails: TDM_ERR_INVALID
 *    comes from a kernel's precondition (head dim, expert count, k, a
 *    weight's alignment) that forward_gpu passed on unchecked, where it
 *    should refuse at creation with TDM_ERR_UNSUPPORTED; TDM_ERR_OOM or
 *    TDM_ERR_CUDA on these micro models means an allocation sized by a
 *    hostile value;
 *  - the GPU's logits are finite and within REL_L2_MAX of the CPU's over
 *    the three rows (the first H200 run's worst was 1.0e-3: qwen3next with
 *    blk.0's ffn_gate_exps in F16; the bound leaves 5x). Where the largest
 *    RoPE angle passes 2^16 rad the two forwards disagree by design: the
 *    GPU's float32 angles are then off by 2^-7 rad or more (the CPU's are
 *    float64), which moved the logits by 3.9e-2 (rope.freq_base 1e-6: ~1e5
 *    rad a position) and 0.16-0.59 (1e-38: 1e29 rad); those edits are only
 *    checked for finite logits, their rel L2 printed.
 * Where the CPU's logits are not finite the GPU only has to finish (run or
 * refuse with a message). Violations are printed as they occur; each test
 * fails at its end if there was any.
 *
 * One test per model and sweep (sanitizer.sh runs them as separate
 * processes). Under compute-sanitizer (gm_sanitized) every SAN_STRIDE-th
 * edit of the fixed enumeration runs, so that each test stays within a few
 * minutes under memcheck.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../unit/model_edit.h"
#include "../unit/model_fixtures.h"
#include "forward.h"
#include "forward_gpu.h"
#include "gpu_model_util.h"
#include "model.h"

#define PROMPT 12         /* prompt tokens, one batch: past TDM_GPU_MATVEC_MAX_TOK, so the GPU's
                           * prompt path (GEMM, grouped MoE) runs, not the decode kernels */
#define STEPS 2           /* one-token decode steps after it */
#define ROWS (1 + STEPS)  /* logits rows compared: the prompt's last, each step's */
#define N_CTX 16
#define REL_L2_MAX 5e-3
#define ROPE_F32_MAX 65536.0 /* rad: a float32 angle's ulp is 2^-7 rad there */
#define SAN_STRIDE 8
#define N_MSGS 4          /* distinct GPU refusals kept for the summary */
_Static_assert(PROMPT > TDM_GPU_MATVEC_MAX_TOK && PROMPT + STEPS <= N_CTX, "the prompt path, within the context");

typedef struct sweep_stats {
    int seen;             /* edits enumerated */
    int bound;            /* copies that bound, of the edits run */
    int cpu_skipped;      /* ... whose CPU forward refused or gave non-finite logits */
    int gpu_ran, gpu_refused;
    int compared;         /* GPU logits held against the CPU's */
    int uncompared;       /* ... not: RoPE angles beyond float32 (see above) */
    int failures;         /* violations, each printed */
    double worst;         /* largest rel L2 compared, and its edit */
    char worst_edit[160];
    char msgs[N_MSGS][TDM_ERROR_MSG_MAX];
    int n_msgs;
} sweep_stats;

/* Either forward behind one call: eval of n tokens at pos0, the last row's logits. */
typedef tdm_status (*eval_fn)(void *f, const int32_t *toks, int32_t n, int32_t pos0, float *logits, tdm_error *err);

static tdm_status cpu_eval(void *f, const int32_t *toks, int32_t n, int32_t pos0, float *logits, tdm_error *err)
{
    return tdm_forward_eval(f, toks, n, pos0, logits, false, err);
}

static tdm_status gpu_eval(void *f, const int32_t *toks, int32_t n, int32_t pos0, float *logits, tdm_error *err)
{
    return tdm_forward_gpu_eval(f, toks, n, pos0, logits, false, err);
}

/* The prompt toks[0 .. PROMPT), then the decode steps; out [ROWS][V]. */
static tdm_status run_rows(eval_fn ev, void *f, const int32_t *toks, int32_t V, float *out, tdm_error *err)
{
    tdm_status st = ev(f, toks, PROMPT, 0, out, err);
    for (int s = 0; !st && s < STEPS; s++)
        st = ev(f, toks + PROMPT + s, 1, PROMPT + s, out + (size_t)(s + 1) * V, err);
    return st;
}

static tdm_status run_cpu(const tdm_model *m, const int32_t *toks, float *out, tdm_error *err)
{
    tdm_forward *f;
    tdm_status st = tdm_forward_new(m, N_CTX, PROMPT, &f, err);
    if (!st)
        st = run_rows(cpu_eval, f, toks, tdm_model_hparams(m)->n_vocab, out, err);
    tdm_forward_free(f);
    return st;
}

static tdm_status run_gpu(const tdm_model *m, const int32_t *toks, float *out, tdm_error *err)
{
    tdm_forward_gpu *f;
    tdm_status st = tdm_forward_gpu_new(m, 0, N_CTX, PROMPT, &f, err);
    gm_race_safe(f);
    if (!st)
        st = run_rows(gpu_eval, f, toks, tdm_model_hparams(m)->n_vocab, out, err);
    tdm_forward_gpu_free(f);
    return st;
}

static bool all_finite(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return false;
    return true;
}

/* Whether the run's largest RoPE angle (the last position, the pair that
 * turns fastest: base^(-(n_rot-2)/n_rot) rad a position when base < 1)
 * passes ROPE_F32_MAX, beyond which the GPU's float32 angles differ from the
 * CPU's float64 ones by design. */
static bool rope_beyond_f32(const tdm_hparams *hp)
{
    const double fastest = fmax(1.0, pow(hp->rope_base, -(double)(hp->n_rot - 2) / hp->n_rot));
    return hp->n_attn_layers > 0 && (PROMPT + STEPS - 1) * fastest > ROPE_F32_MAX;
}

static void __attribute__((format(printf, 3, 4))) violation(sweep_stats *s, const char *what, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("    FAIL %s: ", what);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    s->failures++;
}

/* Keeps msg for the summary when it is among the first N_MSGS distinct ones. */
static void note_refusal(sweep_stats *s, const char *msg)
{
    for (int i = 0; i < s->n_msgs; i++)
        if (!strcmp(s->msgs[i], msg))
            return;
    if (s->n_msgs < N_MSGS)
        snprintf(s->msgs[s->n_msgs++], sizeof s->msgs[0], "%s", msg);
}

/* The GPU's outcome on edit `what` against the CPU's (the rules above);
 * cpu_ok: the CPU ran with finite logits. */
static void judge(sweep_stats *s, const char *what, const tdm_hparams *hp, bool cpu_ok, tdm_status gs,
                  const tdm_error *ge, const float *cpu, const float *gpu)
{
    const size_t n = (size_t)ROWS * hp->n_vocab;
    if (gs) {
        s->gpu_refused++;
        note_refusal(s, ge->msg);
        if (cpu_ok && gs != TDM_ERR_UNSUPPORTED)
            violation(s, what, "the GPU refused a model the CPU runs: %s: %s", tdm_status_name(gs), ge->msg);
        return;
    }
    s->gpu_ran++;
    if (!cpu_ok)
        return;
    if (!all_finite(gpu, n)) {
        violation(s, what, "non-finite GPU logits where the CPU's are finite");
        return;
    }
    const double rel = fx_rel_l2(gpu, cpu, n);
    if (rope_beyond_f32(hp)) {
        s->uncompared++;
        printf("    %s: RoPE angles beyond float32, not compared (rel L2 %.3e)\n", what, rel);
        return;
    }
    if (s->compared++ == 0 || rel > s->worst) {
        s->worst = rel;
        snprintf(s->worst_edit, sizeof s->worst_edit, "%s", what);
    }
    if (rel > REL_L2_MAX)
        violation(s, what, "rel L2 %.3e against the CPU > %.0e", rel, REL_L2_MAX);
}

/* The sweeps' visitor: binds the copy and, when it binds, runs both
 * forwards and judges the GPU's. */
static void visit(tdm_gguf *from, const edit *e, void *ctx)
{
    sweep_stats *s = ctx;
    const int index = s->seen++;
    if (gm_sanitized() && index % SAN_STRIDE)
        return;
    tdm_model *m;
    void *buf;
    tdm_error err = {0};
    if (me_bind(from, e, &m, &buf, &err)) {
        assert_true(err.msg[0] != 0);
        return;
    }
    s->bound++;
    const tdm_hparams *hp = tdm_model_hparams(m);
    const size_t n = (size_t)ROWS * hp->n_vocab; /* n_vocab: token_embd's rows, in the file */
    float *cpu = malloc(n * sizeof(float)), *gpu = malloc(n * sizeof(float));
    assert_true(cpu && gpu);
    int32_t toks[PROMPT + STEPS];
    me_tokens(toks, PROMPT + STEPS, hp->n_vocab);
    tdm_error ce = {0}, ge = {0};
    const tdm_status cs = run_cpu(m, toks, cpu, &ce), gs = run_gpu(m, toks, gpu, &ge);
    assert_true(!cs || ce.msg[0] != 0);
    assert_true(!gs || ge.msg[0] != 0);
    const bool cpu_ok = !cs && all_finite(cpu, n);
    s->cpu_skipped += !cpu_ok;
    char what[160];
    me_describe(e, what, sizeof what);
    judge(s, what, hp, cpu_ok, gs, &ge, cpu, gpu);
    free(cpu);
    free(gpu);
    tdm_model_free(m);
    free(buf);
}

static void print_stats(const char *model, const char *sweep, int swept, const sweep_stats *s)
{
    printf("  %s %s: %d %s swept, %d edits", model, sweep, swept, strcmp(sweep, "metadata") ? "tensors" : "keys",
           s->seen);
    if (gm_sanitized())
        printf(" (1 in %d run: compute-sanitizer)", SAN_STRIDE);
    printf("; %d bound: GPU evaluated %d, refused %d; CPU refused or non-finite %d; %d compared, worst rel L2 %.3e "
           "(%s); %d not compared (RoPE beyond float32); %d failures\n",
           s->bound, s->gpu_ran, s->gpu_refused, s->cpu_skipped, s->compared, s->worst,
           s->compared ? s->worst_edit : "-", s->uncompared, s->failures);
    for (int i = 0; i < s->n_msgs; i++)
        printf("    GPU refusal: %s\n", s->msgs[i]);
}

typedef int (*sweep_fn)(tdm_gguf *from, me_visit_fn visit, void *ctx);

static void run_sweep(const char *model, sweep_fn sweep)
{
    gm_need_gpu();
    char dir[1024], path[1200];
    fx_dir(dir, sizeof dir, model, 0);
    snprintf(path, sizeof path, "%s/%s-f32.gguf", dir, model);
    tdm_gguf *from;
    tdm_error err = {0};
    assert_int_equal(tdm_gguf_open(path, &from, &err), TDM_OK);
    sweep_stats s = {0};
    const int swept = sweep(from, visit, &s);
    tdm_gguf_free(from);
    print_stats(model, sweep == me_sweep_metadata ? "metadata" : "types", swept, &s);
    assert_true(swept > 0 && s.bound > 0);
    assert_int_equal(s.failures, 0);
}

static void test_qwen35moe_metadata(void **state) { (void)state; run_sweep("micro-qwen35moe", me_sweep_metadata); }
static void test_qwen35moe_types(void **state) { (void)state; run_sweep("micro-qwen35moe", me_sweep_types); }
static void test_qwen3moe_metadata(void **state) { (void)state; run_sweep("micro-qwen3moe", me_sweep_metadata); }
static void test_qwen3moe_types(void **state) { (void)state; run_sweep("micro-qwen3moe", me_sweep_types); }
static void test_qwen3next_metadata(void **state) { (void)state; run_sweep("micro-qwen3next", me_sweep_metadata); }
static void test_qwen3next_types(void **state) { (void)state; run_sweep("micro-qwen3next", me_sweep_types); }

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen35moe_metadata), cmocka_unit_test(test_qwen35moe_types),
        cmocka_unit_test(test_qwen3moe_metadata),  cmocka_unit_test(test_qwen3moe_types),
        cmocka_unit_test(test_qwen3next_metadata), cmocka_unit_test(test_qwen3next_types),
    };
    gm_filter();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
