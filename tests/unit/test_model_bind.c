/* test_model_bind: tensor binding and hyper-parameters on edited copies of
 * micro-qwen35moe (written in memory with the GGUF writer): a missing or
 * mis-shaped tensor, bad metadata and an unknown architecture are clear
 * errors naming the culprit; a missing output.weight means tied embeddings;
 * the demo's MTP block is bound aside; layer kinds follow
 * full_attention_interval; the expert copy (tdm_model_copy_experts). Sweeps
 * (model_edit.h, shared with tests/gpu/test_gpu_model_bind.c): every
 * metadata key set to edge values and tensors rewritten in other types are
 * refused with a message or bind and evaluate, never crash. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "expert_cache.h"
#include "forward.h"
#include "gguf.h"
#include "model.h"
#include "model_edit.h"

static tdm_gguf *src, *src3, *srcn; /* micro-qwen35moe, micro-qwen3moe, micro-qwen3next */

/* Binds src's edited copy; returns the status, the message in err. */
static tdm_status bind_edit(const edit *e, tdm_error *err, tdm_model **keep, void **keep_buf)
{
    tdm_model *m;
    void *buf;
    tdm_status st = me_bind(src, e, &m, &buf, err);
    if (keep && !st) {
        *keep = m;
        *keep_buf = buf;
        return st;
    }
    tdm_model_free(m);
    free(buf);
    return st;
}

static int setup(void **state)
{
    (void)state;
    const char *root = getenv("TDM_ROOT");
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/micro-qwen35moe/micro-qwen35moe-f32.gguf", root && *root ? root : ".");
    tdm_error err = {0};
    if (tdm_gguf_open(path, &src, &err))
        return -1;
    snprintf(path, sizeof path, "%s/tests/fixtures/micro-qwen3moe/micro-qwen3moe-f32.gguf", root && *root ? root : ".");
    if (tdm_gguf_open(path, &src3, &err))
        return -1;
    snprintf(path, sizeof path, "%s/tests/fixtures/micro-qwen3next/micro-qwen3next-f32.gguf", root && *root ? root : ".");
    return tdm_gguf_open(path, &srcn, &err) == TDM_OK ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    tdm_gguf_free(src);
    tdm_gguf_free(src3);
    tdm_gguf_free(srcn);
    return 0;
}

static void expect(const edit *e, tdm_status code, const char *needle)
{
    tdm_error err = {0};
    tdm_status st = bind_edit(e, &err, NULL, NULL);
    printf("  -> %s: %s\n", tdm_status_name(st), err.msg);
    assert_int_equal(st, code);
    assert_non_null(strstr(err.msg, needle));
}

static void test_missing_and_misshaped(void **state)
{
    (void)state;
    expect(&(edit){.drop = "blk.1.ssm_a"}, TDM_ERR_FORMAT, "blk.1.ssm_a");
    expect(&(edit){.drop = "blk.2.attn_q.weight"}, TDM_ERR_FORMAT, "blk.2.attn_q.weight");
    expect(&(edit){.drop = "blk.4.ffn_down_shexp.weight"}, TDM_ERR_FORMAT, "blk.4.ffn_down_shexp.weight");
    expect(&(edit){.drop = "token_embd.weight"}, TDM_ERR_FORMAT, "token_embd.weight");
    expect(&(edit){.reshape = "blk.0.attn_qkv.weight"}, TDM_ERR_FORMAT, "blk.0.attn_qkv.weight");
    expect(&(edit){.reshape = "blk.3.ffn_up_exps.weight"}, TDM_ERR_FORMAT, "blk.3.ffn_up_exps.weight");
}

static void test_bad_metadata(void **state)
{
    (void)state;
    expect(&(edit){.key = "qwen35moe.expert_used_count", .value = 9}, TDM_ERR_FORMAT, "expert_used_count 9");
    expect(&(edit){.key = "qwen35moe.attention.head_count_kv", .value = 3}, TDM_ERR_FORMAT, "head_count_kv 3");
    expect(&(edit){.key = "qwen35moe.ssm.time_step_rank", .value = 3}, TDM_ERR_FORMAT, "time_step_rank 3");
    expect(&(edit){.key = "qwen35moe.rope.dimension_count", .value = 7}, TDM_ERR_FORMAT, "dimension_count 7");
    expect(&(edit){.key = "qwen35moe.block_count", .value = 6}, TDM_ERR_FORMAT, "blk.5.");
    expect(&(edit){.arch = "llama"}, TDM_ERR_UNSUPPORTED, "llama");
    expect(&(edit){.key = "qwen35moe.block_count", .value = 0}, TDM_ERR_FORMAT, "block_count 0");
    /* the interval decides the layer kinds: with 5 every layer but the 5th is DeltaNet */
    expect(&(edit){.key = "qwen35moe.full_attention_interval", .value = 5}, TDM_ERR_FORMAT, "blk.2.attn_qkv.weight");
    /* the readers' own checks: a required key left out, a count past 2^30,
     * a float that is not positive (NaN included) */
    expect(&(edit){.drop_key = "qwen35moe.embedding_length"}, TDM_ERR_FORMAT,
           "missing metadata key qwen35moe.embedding_length");
    expect(&(edit){.key = "qwen35moe.expert_count", .value = 0x80000000u}, TDM_ERR_FORMAT,
           "qwen35moe.expert_count = 2147483648 is out of range");
    expect(&(edit){.fkey = "qwen35moe.attention.layer_norm_rms_epsilon", .fvalue = -1e-6f}, TDM_ERR_FORMAT,
           "qwen35moe.attention.layer_norm_rms_epsilon = -1e-06 is not positive");
    expect(&(edit){.fkey = "qwen35moe.rope.freq_base", .fvalue = NAN}, TDM_ERR_FORMAT,
           "qwen35moe.rope.freq_base = nan is not positive");
    /* an optional key left out takes its default: the micro model binds */
    tdm_error err = {0};
    assert_int_equal(bind_edit(&(edit){.drop_key = "qwen35moe.context_length"}, &err, NULL, NULL), TDM_OK);
}

static void test_tied_output(void **state)
{
    (void)state;
    tdm_error err = {0};
    tdm_model *m;
    void *buf;
    assert_int_equal(bind_edit(&(edit){.drop = "output.weight"}, &err, &m, &buf), TDM_OK);
    assert_true(tdm_model_output_tied(m));
    assert_ptr_equal(tdm_model_output(m)->data, tdm_model_tok_embd(m)->data);
    const tdm_hparams *hp = tdm_model_hparams(m);
    assert_int_equal(hp->n_layer, 5);
    assert_int_equal(hp->n_attn_layers, 1);
    assert_int_equal(tdm_model_layer(m, 2)->kind, TDM_LAYER_ATTN);
    assert_int_equal(tdm_model_layer(m, 3)->kind, TDM_LAYER_DELTANET);
    assert_true(hp->vhead_tiled);
    tdm_forward *f;
    float *logits = malloc(sizeof(float) * hp->n_vocab);
    int32_t toks[3] = {1, 2, 3};
    assert_int_equal(tdm_forward_new(m, 8, 4, &f, &err), TDM_OK);
    assert_int_equal(tdm_forward_eval(f, toks, 3, 0, logits, false, &err), TDM_OK);
    assert_int_equal(tdm_forward_eval(f, toks, 6, 3, logits, false, &err), TDM_ERR_INVALID); /* 9 > n_ctx */
    tdm_forward_free(f);
    free(logits);
    tdm_model_free(m);
    free(buf);
}

/* The demo model (caller frees). */
static tdm_model *load_demo(void)
{
    const char *root = getenv("TDM_ROOT");
    char path[1024];
    snprintf(path, sizeof path, "%s/models/demo/demo-Q4_K_M.gguf", root && *root ? root : ".");
    tdm_model *m;
    tdm_error err = {0};
    assert_int_equal(tdm_model_load(path, &m, &err), TDM_OK);
    return m;
}

static void test_demo_mtp_bound(void **state)
{
    (void)state;
    tdm_model *m = load_demo();
    const tdm_hparams *hp = tdm_model_hparams(m);
    assert_int_equal(hp->n_layer, 8);
    assert_int_equal(hp->n_nextn, 1);
    assert_int_equal(hp->head_dim, 64);
    assert_int_equal(hp->n_rot, 16);
    assert_int_equal(hp->n_attn_layers, 2);
    assert_int_equal(tdm_model_layer(m, 3)->kind, TDM_LAYER_ATTN);
    assert_int_equal(tdm_model_layer(m, 7)->kind, TDM_LAYER_ATTN);
    const tdm_mtp *mtp = tdm_model_mtp(m);
    assert_non_null(mtp);
    assert_int_equal(mtp->eh_proj.cols, 2 * hp->n_embd);
    assert_non_null(mtp->shared_head_norm.data);
    assert_int_equal(mtp->layer.kind, TDM_LAYER_ATTN);
    assert_non_null(mtp->layer.gate_shexp.data);
    assert_false(tdm_model_output_tied(m));
    char desc[512];
    tdm_model_describe(m, desc, sizeof desc);
    printf("  %s\n", desc);
    tdm_model_free(m);
}

/* Logits of the 8-token prompt on an edited micro-qwen3moe. */
static float *q3m_logits(const edit *e, bool *dense1)
{
    tdm_model *m;
    void *buf;
    tdm_error err = {0};
    tdm_status st = me_bind(src3, e, &m, &buf, &err);
    if (st)
        printf("%s\n", err.msg);
    assert_int_equal(st, TDM_OK);
    *dense1 = tdm_model_layer(m, 1)->ffn == TDM_FFN_DENSE;
    const int V = tdm_model_hparams(m)->n_vocab;
    const int32_t toks[8] = {338, 442, 1260, 617, 260, 1507, 681, 340};
    float *logits = malloc(sizeof(float) * 8 * V);
    tdm_forward *f;
    assert_int_equal(tdm_forward_new(m, 8, 8, &f, &err), TDM_OK);
    assert_int_equal(tdm_forward_eval(f, toks, 8, 0, logits, true, &err), TDM_OK);
    tdm_forward_free(f);
    tdm_model_free(m);
    free(buf);
    return logits;
}

/* A dense SwiGLU layer (qwen3moe mlp_only_layers) equals a MoE layer whose
 * experts are all that same MLP (renormalised weights sum to 1). */
static void test_dense_layer(void **state)
{
    (void)state;
    bool d1, d2;
    float *dense = q3m_logits(&(edit){.ffn1 = 1, .key = "qwen3moe.feed_forward_length", .value = 32}, &d1);
    float *moe = q3m_logits(&(edit){.ffn1 = 2}, &d2);
    assert_true(d1);
    assert_false(d2);
    double num = 0, den = 0;
    for (int i = 0; i < 8 * 2048; i++) {
        num += (dense[i] - moe[i]) * (double)(dense[i] - moe[i]);
        den += (double)moe[i] * moe[i];
    }
    printf("  dense blk.1 vs MoE of identical experts: rel L2 %.2e\n", sqrt(num / den));
    assert_true(sqrt(num / den) < 1e-5);
    /* a feed_forward_length that does not match the dense tensors is refused */
    tdm_error err = {0};
    tdm_model *m;
    void *buf;
    assert_int_equal(me_bind(src3, &(edit){.ffn1 = 1, .key = "qwen3moe.feed_forward_length", .value = 48}, &m, &buf,
                             &err),
                     TDM_ERR_FORMAT);
    printf("  -> %s\n", err.msg);
    assert_non_null(strstr(err.msg, "blk.1.ffn_gate.weight"));
    free(dense);
    free(moe);
}

/* tdm_model_copy_experts: every routed expert tensor moves to a 2 MiB-aligned
 * copy with the file's bytes, nothing else moves, a second call changes
 * nothing, and the forward's logits stay bit-identical. */
static void test_copy_experts(void **state)
{
    (void)state;
    tdm_model *m = load_demo();
    tdm_error err = {0};
    const tdm_hparams *hp = tdm_model_hparams(m);
    const int32_t tok[6] = {97, 11, 187, 0, 315, 13};
    const int V = hp->n_vocab;
    float *before = malloc((size_t)V * sizeof(float)), *after = malloc((size_t)V * sizeof(float));
    tdm_forward *f;
    assert_int_equal(tdm_forward_new(m, 16, 8, &f, &err), TDM_OK);
    assert_int_equal(tdm_forward_eval(f, tok, 6, 0, before, false, &err), TDM_OK);
    tdm_forward_free(f);
    enum { MAXL = 64 };
    assert_true(hp->n_layer <= MAXL);
    const void *orig[MAXL][3], *shexp[MAXL];
    size_t want = 0;
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const tdm_layer *L = tdm_model_layer(m, il);
        const tdm_weight *w[3] = {&L->gate_exps, &L->up_exps, &L->down_exps};
        for (int i = 0; i < 3; i++) {
            orig[il][i] = w[i]->data;
            want += w[i]->mat_bytes * (size_t)w[i]->n_mat;
        }
        shexp[il] = L->gate_shexp.data;
    }
    tdm_budget_inputs plan0, plan1;
    assert_int_equal(tdm_budget_inputs_for(m, 64, 8, &plan0, &err), TDM_OK);
    size_t bytes = 0, mem_bytes = 1;
    assert_null(tdm_model_experts_memory(m, &mem_bytes));
    assert_int_equal(mem_bytes, 0);
    assert_int_equal(tdm_model_copy_experts(m, &bytes, &err), TDM_OK);
    assert_int_equal(bytes, want);
    /* the copy's memory, as the bench's probe reads it: every expert inside it */
    const uint8_t *mem = tdm_model_experts_memory(m, &mem_bytes);
    assert_non_null(mem);
    assert_int_equal((uintptr_t)mem % (2u << 20), 0);
    assert_true(mem_bytes >= bytes && mem_bytes % (2u << 20) == 0);
    /* the VRAM ledger still tells the experts from the weights it must upload */
    assert_int_equal(tdm_budget_inputs_for(m, 64, 8, &plan1, &err), TDM_OK);
    assert_int_equal(plan1.weight_bytes, plan0.weight_bytes);
    assert_int_equal(plan1.max_slots, plan0.max_slots);
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const tdm_layer *L = tdm_model_layer(m, il);
        const tdm_weight *w[3] = {&L->gate_exps, &L->up_exps, &L->down_exps};
        for (int i = 0; i < 3; i++) {
            assert_ptr_not_equal(w[i]->data, orig[il][i]);
            assert_int_equal((uintptr_t)w[i]->data % (2u << 20), 0);
            assert_memory_equal(w[i]->data, orig[il][i], w[i]->mat_bytes * (size_t)w[i]->n_mat);
            assert_true((const uint8_t *)w[i]->data >= mem &&
                        (const uint8_t *)w[i]->data + w[i]->mat_bytes * (size_t)w[i]->n_mat <= mem + mem_bytes);
        }
        assert_ptr_equal(L->gate_shexp.data, shexp[il]); /* only the routed experts move */
    }
    const void *first = tdm_model_layer(m, 0)->gate_exps.data;
    size_t again = 0;
    assert_int_equal(tdm_model_copy_experts(m, &again, &err), TDM_OK);
    assert_int_equal(again, bytes);
    assert_ptr_equal(tdm_model_layer(m, 0)->gate_exps.data, first);
    assert_int_equal(tdm_forward_new(m, 16, 8, &f, &err), TDM_OK);
    assert_int_equal(tdm_forward_eval(f, tok, 6, 0, after, false, &err), TDM_OK);
    tdm_forward_free(f);
    assert_memory_equal(before, after, (size_t)V * sizeof(float));
    printf("  demo: %.1f MiB of experts copied, logits unchanged\n", (double)bytes / (1 << 20));
    free(before), free(after);
    tdm_model_free(m);
}

/* A sweep's visitor: binds from's copy with edit e and, when it binds,
 * evaluates 8 tokens; counts in n[0] the refusals (each with a message),
 * n[1] the models that bound, n[2] the evaluations that ran. */
static void try_edit(tdm_gguf *from, const edit *e, void *ctx)
{
    int *n = ctx;
    tdm_model *m;
    void *buf;
    tdm_error err = {0};
    if (me_bind(from, e, &m, &buf, &err) != TDM_OK) {
        assert_true(err.msg[0] != 0);
        n[0]++;
        return;
    }
    n[1]++;
    const tdm_hparams *hp = tdm_model_hparams(m);
    int32_t toks[8];
    me_tokens(toks, 8, hp->n_vocab);
    float *logits = malloc(sizeof(float) * (size_t)hp->n_vocab);
    tdm_forward *f;
    err.msg[0] = 0;
    if (tdm_forward_new(m, 8, 8, &f, &err) == TDM_OK) {
        if (tdm_forward_eval(f, toks, 8, 0, logits, false, &err) == TDM_OK)
            n[2]++;
        else
            assert_true(err.msg[0] != 0);
        tdm_forward_free(f);
    } else {
        assert_true(err.msg[0] != 0);
    }
    free(logits);
    tdm_model_free(m);
    free(buf);
}

/* Every metadata key at edge values (me_sweep_metadata): the model is
 * refused with a message, or it binds and evaluates 8 tokens (or says why
 * not). Never a crash, a hang or an allocation sized by the hostile value
 * (the sanitizer build runs this too). */
static void sweep_metadata(tdm_gguf *from, const char *name)
{
    int n[3] = {0, 0, 0};
    const int keys = me_sweep_metadata(from, try_edit, n);
    printf("  %s: %d keys; %d edits refused, %d bound (%d evaluated)\n", name, keys, n[0], n[1], n[2]);
    assert_true(keys > 0 && n[0] > 0 && n[2] > 0);
}

/* Tensors rewritten in other types (me_sweep_types): refused with a
 * message, or bound and evaluated. A norm read as floats from a quantised
 * tensor, say, would read past it (the sanitizer build runs this too). */
static void sweep_types(tdm_gguf *from, const char *name)
{
    int n[3] = {0, 0, 0};
    const int tensors = me_sweep_types(from, try_edit, n);
    printf("  %s: %d tensors; %d retyped copies refused, %d bound (%d evaluated)\n", name, tensors, n[0], n[1],
           n[2]);
    assert_true(tensors > 0 && n[0] > 0);
}

static void test_type_sweep(void **state)
{
    (void)state;
    sweep_types(src, "micro-qwen35moe");
    sweep_types(src3, "micro-qwen3moe");
    sweep_types(srcn, "micro-qwen3next");
}

static void test_metadata_sweep(void **state)
{
    (void)state;
    sweep_metadata(src, "micro-qwen35moe");
    sweep_metadata(src3, "micro-qwen3moe");
    sweep_metadata(srcn, "micro-qwen3next");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_missing_and_misshaped),
        cmocka_unit_test(test_bad_metadata),
        cmocka_unit_test(test_tied_output),
        cmocka_unit_test(test_demo_mtp_bound),
        cmocka_unit_test(test_dense_layer),
        cmocka_unit_test(test_copy_experts),
        cmocka_unit_test(test_metadata_sweep),
        cmocka_unit_test(test_type_sweep),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
