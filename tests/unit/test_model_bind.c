/* test_model_bind: tensor binding and hyper-parameters on edited copies of
 * micro-qwen35moe (written in memory with the GGUF writer): a missing or
 * mis-shaped tensor, bad metadata and an unknown architecture are clear
 * errors naming the culprit; a missing output.weight means tied embeddings;
 * the demo's MTP block is bound aside; layer kinds follow
 * full_attention_interval; the expert copy (tdm_model_copy_experts). Sweeps:
 * every metadata key set to edge values and tensors rewritten in other
 * types are refused with a message or bind and evaluate, never crash. */
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
#include "gguf_writer.h"
#include "model.h"

typedef struct edit {
    const char *drop;       /* tensor left out */
    const char *reshape;    /* tensor written with half its rows */
    const char *key;        /* u32 key overridden ... */
    uint32_t value;         /* ... with this value */
    const char *fkey;       /* f32 key overridden ... */
    float fvalue;           /* ... with this value */
    const char *drop_key;   /* metadata key left out */
    const char *arch;       /* general.architecture override */
    int ffn1;               /* blk.1 FFN: 1 = dense from expert 0, 2 = every expert = expert 0 */
    const char *retype;     /* tensor written as type `type`, zero bytes */
    tdm_qtype type;
} edit;

static tdm_gguf *src, *src3, *srcn; /* micro-qwen35moe, micro-qwen3moe, micro-qwen3next */
static uint8_t *rep_buf[3];  /* replicated expert-0 stacks for ffn1 == 2 */

/* Adds blk.1's FFN per e->ffn1; returns false when t is not one of its tensors. */
static bool add_ffn1(tdm_gguf_writer *w, const edit *e, const tdm_gguf_tensor *t)
{
    static const char *const exps[3] = {"blk.1.ffn_gate_exps.weight", "blk.1.ffn_up_exps.weight",
                                        "blk.1.ffn_down_exps.weight"};
    static const char *const dense[3] = {"blk.1.ffn_gate.weight", "blk.1.ffn_up.weight", "blk.1.ffn_down.weight"};
    tdm_error err = {0};
    if (e->ffn1 == 1 && !strcmp(t->name, "blk.1.ffn_gate_inp.weight"))
        return true; /* no router: a dense layer */
    for (int i = 0; i < 3; i++) {
        if (strcmp(t->name, exps[i]))
            continue;
        const size_t mat = tdm_qtype_row_bytes(t->type, t->ne[0]) * (size_t)t->ne[1];
        if (e->ffn1 == 1) {
            assert_int_equal(tdm_gguf_writer_add_tensor(w, dense[i], t->type, 2, t->ne, t->data, &err), TDM_OK);
        } else {
            free(rep_buf[i]);
            rep_buf[i] = malloc(mat * (size_t)t->ne[2]);
            for (int64_t x = 0; x < t->ne[2]; x++)
                memcpy(rep_buf[i] + x * mat, t->data, mat);
            assert_int_equal(tdm_gguf_writer_add_tensor(w, t->name, t->type, 3, t->ne, rep_buf[i], &err), TDM_OK);
        }
        return true;
    }
    return false;
}

static void *build_from(tdm_gguf *from, const edit *e, size_t *size)
{
    tdm_gguf_writer *w;
    tdm_error err = {0};
    void *zero = NULL; /* e->retype's bytes */
    assert_int_equal(tdm_gguf_writer_create(&w, &err), TDM_OK);
    for (int64_t i = 0; i < tdm_gguf_kv_count(from); i++) {
        const char *k = tdm_gguf_kv_key(from, i);
        if (e->drop_key && !strcmp(k, e->drop_key))
            continue;
        switch (tdm_gguf_kv_type(from, i)) {
        case TDM_GGUF_UINT32: {
            uint32_t v;
            assert_int_equal(tdm_gguf_get_u32(from, k, &v, &err), TDM_OK);
            if (e->key && !strcmp(k, e->key))
                v = e->value;
            assert_int_equal(tdm_gguf_writer_add_u32(w, k, v, &err), TDM_OK);
            break;
        }
        case TDM_GGUF_FLOAT32: {
            float v;
            assert_int_equal(tdm_gguf_get_f32(from, k, &v, &err), TDM_OK);
            if (e->fkey && !strcmp(k, e->fkey))
                v = e->fvalue;
            assert_int_equal(tdm_gguf_writer_add_f32(w, k, v, &err), TDM_OK);
            break;
        }
        case TDM_GGUF_STRING: {
            const char *s;
            size_t len;
            assert_int_equal(tdm_gguf_get_str(from, k, &s, &len, &err), TDM_OK);
            if (e->arch && !strcmp(k, "general.architecture"))
                s = e->arch, len = strlen(e->arch);
            assert_int_equal(tdm_gguf_writer_add_strn(w, k, s, len, &err), TDM_OK);
            break;
        }
        default: /* arrays (tokenizer, rope sections) are not needed for binding */
            break;
        }
    }
    for (int64_t i = 0; i < tdm_gguf_tensor_count(from); i++) {
        const tdm_gguf_tensor *t = tdm_gguf_tensor_at(from, i);
        if ((e->drop && !strcmp(t->name, e->drop)) || (e->ffn1 && add_ffn1(w, e, t)))
            continue;
        int64_t ne[4] = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
        if (e->reshape && !strcmp(t->name, e->reshape))
            ne[1] /= 2;
        if (e->retype && !strcmp(t->name, e->retype)) {
            const size_t bytes = tdm_qtype_row_bytes(e->type, ne[0]) * (size_t)(ne[1] * ne[2] * ne[3]);
            zero = calloc(1, bytes); /* read by tdm_gguf_writer_write_memory below */
            assert_int_equal(tdm_gguf_writer_add_tensor(w, t->name, e->type, t->n_dims, ne, zero, &err), TDM_OK);
            continue;
        }
        assert_int_equal(tdm_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, ne, t->data, &err), TDM_OK);
    }
    void *buf;
    assert_int_equal(tdm_gguf_writer_write_memory(w, &buf, size, &err), TDM_OK);
    tdm_gguf_writer_free(w);
    free(zero);
    return buf;
}

static void *build(const edit *e, size_t *size)
{
    return build_from(src, e, size);
}

/* Binds the edited copy; returns the status, the message in err. */
static tdm_status bind_edit(const edit *e, tdm_error *err, tdm_model **keep, void **keep_buf)
{
    size_t size;
    void *buf = build(e, &size);
    tdm_gguf *g;
    tdm_model *m = NULL;
    tdm_status st = tdm_gguf_open_memory(buf, size, &g, err);
    if (!st)
        st = tdm_model_from_gguf(g, &m, err);
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
    for (int i = 0; i < 3; i++)
        free(rep_buf[i]);
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
    size_t size;
    void *buf = build_from(src3, e, &size);
    tdm_gguf *g;
    tdm_model *m;
    tdm_error err = {0};
    assert_int_equal(tdm_gguf_open_memory(buf, size, &g, &err), TDM_OK);
    tdm_status st = tdm_model_from_gguf(g, &m, &err);
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
    size_t size;
    tdm_error err = {0};
    edit e = {.ffn1 = 1, .key = "qwen3moe.feed_forward_length", .value = 48};
    void *buf = build_from(src3, &e, &size);
    tdm_gguf *g;
    tdm_model *m = NULL;
    assert_int_equal(tdm_gguf_open_memory(buf, size, &g, &err), TDM_OK);
    assert_int_equal(tdm_model_from_gguf(g, &m, &err), TDM_ERR_FORMAT);
    printf("  -> %s\n", err.msg);
    assert_non_null(strstr(err.msg, "blk.1.ffn_gate.weight"));
    free(buf);
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
    size_t bytes = 0;
    assert_int_equal(tdm_model_copy_experts(m, &bytes, &err), TDM_OK);
    assert_int_equal(bytes, want);
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

/* Binds from's copy with one edit and, when it binds, evaluates 8 tokens;
 * counts in n[0] the refusals (each with a message), n[1] the models that
 * bound, n[2] the evaluations that ran. */
static void try_edit(tdm_gguf *from, const edit *e, int n[3])
{
    size_t size;
    void *buf = build_from(from, e, &size);
    tdm_gguf *g;
    tdm_model *m = NULL;
    tdm_error err = {0};
    assert_int_equal(tdm_gguf_open_memory(buf, size, &g, &err), TDM_OK);
    if (tdm_model_from_gguf(g, &m, &err) != TDM_OK) {
        assert_true(err.msg[0] != 0);
        n[0]++;
        free(buf);
        return;
    }
    n[1]++;
    const tdm_hparams *hp = tdm_model_hparams(m);
    int32_t toks[8];
    for (int i = 0; i < 8; i++)
        toks[i] = (int32_t)((i * 7919 + 11) % hp->n_vocab);
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

/* Every u32 and f32 metadata key of the micro models set, one at a time, to
 * edge values (0, 1, small, the old value +-1 and doubled, 2^16, 2^31 - 1,
 * 2^31, 2^32 - 1; zeros, tiny, huge, infinities, NaN): the model is refused
 * with a message, or it binds and evaluates 8 tokens (or says why not).
 * Never a crash, a hang or an allocation sized by the hostile value (the
 * sanitizer build runs this too). */
static void sweep_metadata(tdm_gguf *from, const char *name)
{
    static const uint32_t uv[] = {0, 1, 2, 3, 7, 64, 65536, 0x7FFFFFFFu, 0x80000000u, 0xFFFFFFFFu};
    static const float fv[] = {0.0f, -0.0f, 1e-38f, 1e-6f, 1.0f, 1e30f, INFINITY, -INFINITY, NAN};
    int n[3] = {0, 0, 0}, keys = 0;
    for (int64_t i = 0; i < tdm_gguf_kv_count(from); i++) {
        const char *k = tdm_gguf_kv_key(from, i);
        tdm_error err = {0};
        if (tdm_gguf_kv_type(from, i) == TDM_GGUF_UINT32) {
            uint32_t v;
            assert_int_equal(tdm_gguf_get_u32(from, k, &v, &err), TDM_OK);
            const uint32_t near[3] = {v - 1, v + 1, 2 * v};
            for (size_t j = 0; j < sizeof uv / sizeof *uv + 3; j++)
                try_edit(from, &(edit){.key = k, .value = j < 3 ? near[j] : uv[j - 3]}, n);
            keys++;
        } else if (tdm_gguf_kv_type(from, i) == TDM_GGUF_FLOAT32) {
            for (size_t j = 0; j < sizeof fv / sizeof *fv; j++)
                try_edit(from, &(edit){.fkey = k, .fvalue = fv[j]}, n);
            keys++;
        }
    }
    printf("  %s: %d keys; %d edits refused, %d bound (%d evaluated)\n", name, keys, n[0], n[1], n[2]);
    assert_true(keys > 0 && n[0] > 0 && n[2] > 0);
}

/* Every tensor of the first layers of each kind and outside the layers
 * written, one at a time, in other types whose block divides its rows (zero
 * bytes: finite in every format): refused with a message, or bound and
 * evaluated. A norm read as floats from a quantised tensor, say, would read
 * past it (the sanitizer build runs this too). */
static void sweep_types(tdm_gguf *from, const char *name)
{
    static const tdm_qtype types[] = {TDM_Q_F32,    TDM_Q_F16,    TDM_Q_BF16,  TDM_Q_F64,   TDM_Q_Q8_0,
                                      TDM_Q_Q4_0,   TDM_Q_Q5_1,   TDM_Q_IQ4_NL, TDM_Q_MXFP4, TDM_Q_Q4_K,
                                      TDM_Q_Q6_K,   TDM_Q_IQ2_XXS, TDM_Q_I8,   TDM_Q_I32};
    int n[3] = {0, 0, 0}, tensors = 0;
    for (int64_t i = 0; i < tdm_gguf_tensor_count(from); i++) {
        const tdm_gguf_tensor *t = tdm_gguf_tensor_at(from, i);
        if (!strncmp(t->name, "blk.", 4) && strncmp(t->name, "blk.0.", 6) && strncmp(t->name, "blk.3.", 6))
            continue; /* blk.0 (DeltaNet in the hybrids) and blk.3 (attention) stand for the rest */
        tensors++;
        for (size_t j = 0; j < sizeof types / sizeof *types; j++)
            if (types[j] != t->type && t->ne[0] % tdm_qtype_get(types[j])->block == 0)
                try_edit(from, &(edit){.retype = t->name, .type = types[j]}, n);
    }
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
