/* test_projection: the byte accounting against hand-computed sizes of the
 * fixture files (from their configs and the type table, not from the reader),
 * the Q4_K_M preset generator against the real demo file, hit curves, the
 * throughput arithmetic (the serial model) on hand-computed cases, the JSON
 * format and the reader of recorded validation runs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>
#include <math.h>
#include <unistd.h>

#include "gguf.h"
#include "gguf_writer.h"
#include "projection.h"

static char root[1024];

static const char *path_of(const char *rel)
{
    static char buf[2048];
    snprintf(buf, sizeof buf, "%s/%s", root, rel);
    return buf;
}

static void load_file(const char *rel, tdm_proj_model *m)
{
    tdm_gguf *g = NULL;
    tdm_error err = {0};
    tdm_status st = tdm_gguf_open(path_of(rel), &g, &err);
    if (st)
        fail_msg("%s: %s", rel, err.msg);
    st = tdm_proj_model_from_gguf(g, "x", m, &err);
    tdm_gguf_free(g);
    if (st)
        fail_msg("%s: %s", rel, err.msg);
}

#define F32 4u
#define Q4K_ROW(n) ((uint64_t)(n) / 256 * 144) /* bytes of a Q4_K row of n elements */
#define Q6K_ROW(n) ((uint64_t)(n) / 256 * 210)

static void test_use_more_bits(void **state)
{
    (void)state;
    /* gguf.md §3.1: for n = 48 layers 0-5, 8, 11, ..., 41, 42-47 (24 of 48) */
    int count = 0;
    for (int i = 0; i < 48; i++) {
        bool want = i < 6 || i >= 42 || (i >= 8 && (i - 8) % 3 == 0);
        assert_int_equal(tdm_proj_use_more_bits(i, 48), want);
        count += want;
    }
    assert_int_equal(count, 24);
    /* n = 9 (demo: 8 layers + MTP): the Q6_K layers of models/demo are 0, 3, 6, 7, 8 */
    for (int i = 0; i < 9; i++)
        assert_int_equal(tdm_proj_use_more_bits(i, 9), i == 0 || i == 3 || i == 6 || i >= 7);
}

/* micro-qwen3moe (F32): d 64, 3 layers, 8 experts of width 32, k 2, 4 x 16 q
 * heads, 2 x 16 kv heads, vocab 2048 (tests/fixtures/micro-qwen3moe/hf-config.json). */
static void test_micro_qwen3moe(void **state)
{
    (void)state;
    tdm_proj_model m;
    load_file("tests/fixtures/micro-qwen3moe/micro-qwen3moe-f32.gguf", &m);
    const uint64_t expert = 3 * 64 * 32 * F32;
    assert_string_equal(m.arch, "qwen3moe");
    assert_int_equal(m.n_layer, 3);
    assert_int_equal(m.n_moe_layer, 3);
    assert_int_equal(m.n_expert, 8);
    assert_int_equal(m.n_expert_used, 2);
    assert_int_equal(m.slot_bytes, expert);
    assert_int_equal(m.active_expert_bytes, 3 * 2 * expert);
    assert_int_equal(m.total_expert_bytes, 3 * 8 * expert);
    /* per layer: 2 norms [64], q [64x64], k, v [64x32], o [64x64], q/k norms [16], router [64x8] */
    const uint64_t layer = (2 * 64 + 64 * 64 + 2 * 64 * 32 + 64 * 64 + 2 * 16 + 64 * 8) * F32;
    assert_int_equal(m.attn_bytes, 3 * layer);
    assert_int_equal(m.shexp_bytes, 0);
    assert_int_equal(m.head_bytes, (64 * 2048 + 64) * F32);
    assert_int_equal(m.embd_row_bytes, 64 * F32);
    assert_int_equal(m.embd_bytes, 64 * 2048 * F32);
    assert_false(m.output_tied);
    assert_int_equal(m.kv_bytes_per_ctx, 3 * (32 + 32) * 2);
    assert_int_equal(m.state_bytes, 0);
    assert_int_equal(m.mtp_bytes, 0);
    assert_int_equal(m.tensor_bytes, 1794176); /* every tensor payload of the file */
    assert_int_equal(tdm_proj_dense_bytes(&m), 3 * layer + (64 * 2048 + 64) * F32 + 64 * F32);
    assert_int_equal(tdm_proj_resident_bytes(&m), 3 * layer + (64 * 2048 + 64) * F32);
}

/* micro-qwen3next (F32): d 64, 5 layers, full attention every 3rd (layer 2),
 * 8 experts of 32, k 2, shared expert 48, gated q 4 x 32 x 2, kv 2 x 32,
 * DeltaNet H_k 2, H_v 4, d 16, conv kernel 4. */
static void test_micro_qwen3next(void **state)
{
    (void)state;
    tdm_proj_model m;
    load_file("tests/fixtures/micro-qwen3next/micro-qwen3next-f32.gguf", &m);
    const uint64_t expert = 3 * 64 * 32 * F32;
    assert_int_equal(m.n_layer, 5);
    assert_int_equal(m.active_expert_bytes, 5 * 2 * expert);
    assert_int_equal(m.total_expert_bytes, 5 * 8 * expert);
    const uint64_t common = (64 + 64 + 64 * 8) * F32;         /* 2 norms + router */
    const uint64_t conv = 2 * 2 * 16 + 4 * 16;                /* 128 conv channels */
    const uint64_t linear = (64 * conv + 64 * 64 + 64 * 8     /* qkv, gate (z), ba */
                             + 4 * conv + 4 + 4 + 16          /* conv1d, dt, a, norm */
                             + 64 * 64) * F32;                /* ssm_out */
    const uint64_t full = (64 * 256 + 2 * 64 * 64 + 128 * 64 + 2 * 32) * F32;
    assert_int_equal(m.attn_bytes, 5 * common + 4 * linear + full);
    assert_int_equal(m.shexp_bytes, 5 * (3 * 64 * 48 + 64) * F32);
    assert_int_equal(m.kv_bytes_per_ctx, (64 + 64) * 2);
    /* per DeltaNet layer: 3 conv columns + H_v x d x d state, f32 */
    assert_int_equal(m.state_bytes, 4 * (3 * conv + 4 * 16 * 16) * F32);
    assert_int_equal(m.tensor_bytes, 2640512);
}

/* models/demo (Q4_K_M): d 256, 8 layers + 1 MTP block, 24 experts of 256, k 4,
 * shared expert 256, vocab 8192; Q6_K where use_more_bits(i, 9). */
static void test_demo_file(void **state)
{
    (void)state;
    tdm_proj_model m;
    load_file("models/demo/demo-Q4_K_M.gguf", &m);
    assert_string_equal(m.arch, "qwen35moe");
    assert_int_equal(m.n_layer, 8);
    assert_int_equal(m.n_moe_layer, 8);
    const uint64_t e4 = 3 * 256 * Q4K_ROW(256);                   /* down in Q4_K */
    const uint64_t e6 = 2 * 256 * Q4K_ROW(256) + 256 * Q6K_ROW(256); /* down in Q6_K */
    assert_int_equal(m.slot_bytes, e6);
    assert_int_equal(m.active_expert_bytes, 4 * (4 * e6 + 4 * e4)); /* layers 0,3,6,7 Q6_K */
    assert_int_equal(m.total_expert_bytes, 24 * (4 * e6 + 4 * e4));
    const uint64_t common = 8 * (2 * 256 * F32 + 256 * 24 * F32);
    const uint64_t lin = 256 * Q4K_ROW(256) * 2 + 2 * 4 * Q4K_ROW(256) + (4 * 512 + 4 + 4 + 64) * F32;
    const uint64_t qkv = 2 * 512 * Q6K_ROW(256) + 4 * 512 * Q4K_ROW(256); /* layers 0,6 | 1,2,4,5 */
    const uint64_t full = 512 * Q4K_ROW(256) + 128 * Q4K_ROW(256) + 128 * Q6K_ROW(256) +
                          256 * Q4K_ROW(256) + 2 * 64 * F32;
    assert_int_equal(m.attn_bytes, common + 6 * lin + qkv + 2 * full);
    assert_int_equal(m.attn_bytes, 1535936);
    const uint64_t sh = 256 * F32 + 2 * 256 * Q4K_ROW(256);
    assert_int_equal(m.shexp_bytes, 4 * (sh + 256 * Q6K_ROW(256)) + 4 * (sh + 256 * Q4K_ROW(256)));
    assert_int_equal(m.head_bytes, 8192 * Q6K_ROW(256) + 256 * F32);
    assert_int_equal(m.embd_row_bytes, Q4K_ROW(256));
    assert_int_equal(m.kv_bytes_per_ctx, 2 * (128 + 128) * 2);
    assert_int_equal(m.state_bytes, 6 * (3 * 512 + 4 * 64 * 64) * F32);
    assert_int_equal(m.mtp_bytes, 3448064);
    assert_int_equal(m.tensor_bytes, 31701184);

    /* the Q4_K_M generator behind --preset reproduces the real file */
    tdm_proj_model p;
    tdm_error err = {0};
    assert_int_equal(tdm_proj_model_preset("demo", &p, &err), TDM_OK);
    assert_string_equal(p.name, "demo");
    memcpy(p.name, m.name, sizeof p.name);
    assert_memory_equal(&p, &m, sizeof m);
}

static void test_presets(void **state)
{
    (void)state;
    tdm_proj_model m;
    tdm_error err = {0};
    /* Qwen3-30B-A3B: 48 layers, k 8 of 128, experts 2048 x 768; down Q6_K in 24 layers */
    assert_int_equal(tdm_proj_model_preset("qwen3-30b-a3b", &m, &err), TDM_OK);
    uint64_t gu = 2 * 768 * Q4K_ROW(2048);
    uint64_t d4 = 2048 * Q4K_ROW(768), d6 = 2048 * Q6K_ROW(768);
    assert_int_equal(m.active_expert_bytes, 8 * (24 * (gu + d6) + 24 * (gu + d4)));
    assert_int_equal(m.total_expert_bytes, 128 * (24 * (gu + d6) + 24 * (gu + d4)));
    assert_int_equal(m.slot_bytes, gu + d6);
    assert_int_equal(m.head_bytes, 151936 * Q6K_ROW(2048) + 2048 * F32);
    assert_int_equal(m.kv_bytes_per_ctx, 48 * 2 * 512 * 2);
    /* Qwen3.5-35B-A3B: 40 layers + MTP (n = 41 for use_more_bits), k 8 of 256, 2048 x 512 */
    assert_int_equal(tdm_proj_model_preset("qwen35-35b-a3b", &m, &err), TDM_OK);
    gu = 2 * 512 * Q4K_ROW(2048);
    d4 = 2048 * Q4K_ROW(512), d6 = 2048 * Q6K_ROW(512);
    uint64_t act = 0;
    for (int i = 0; i < 40; i++)
        act += 8 * (gu + (tdm_proj_use_more_bits(i, 41) ? d6 : d4));
    assert_int_equal(m.active_expert_bytes, act);
    assert_int_equal(m.n_layer, 40);
    assert_int_equal(m.head_bytes, 248320 * Q6K_ROW(2048) + 2048 * F32);
    assert_int_equal(m.kv_bytes_per_ctx, 10 * 2 * 512 * 2);
    assert_true(m.mtp_bytes > 0);
    /* Qwen3-Next-80B-A3B: 48 layers, k 10 of 512 */
    assert_int_equal(tdm_proj_model_preset("qwen3next-80b-a3b", &m, &err), TDM_OK);
    act = 0;
    for (int i = 0; i < 48; i++)
        act += 10 * (gu + (tdm_proj_use_more_bits(i, 48) ? d6 : d4));
    assert_int_equal(m.active_expert_bytes, act);
    assert_int_equal(m.mtp_bytes, 0);
    assert_int_equal(tdm_proj_model_preset("qwen4-1t", &m, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.msg, "qwen4-1t"));
    assert_null(tdm_proj_preset_name(tdm_proj_preset_count()));
}

/* ---- hostile / unusual files built in memory ---- */

static tdm_status build(int variant, void **buf, size_t *size, tdm_error *err)
{
    tdm_gguf_writer *w;
    tdm_status st = tdm_gguf_writer_create(&w, err);
    if (st)
        return st;
    static float zeros[4 * 64 * 32];
    int64_t exps[3] = {64, 32, 4}, down[3] = {32, 64, 4}, embd[2] = {64, 16};
    if (variant == 1)
        exps[2] = 3; /* not expert_count */
    st = tdm_gguf_writer_add_str(w, "general.architecture", "qwen3moe", err);
    if (!st)
        st = tdm_gguf_writer_add_u32(w, "qwen3moe.block_count", 1, err);
    if (!st && variant != 2)
        st = tdm_gguf_writer_add_u32(w, "qwen3moe.expert_count", 4, err);
    if (!st)
        st = tdm_gguf_writer_add_u32(w, "qwen3moe.expert_used_count", variant == 5 ? 5 : 2, err);
    if (!st)
        st = tdm_gguf_writer_add_tensor(w, "token_embd.weight", TDM_Q_F32, 2, embd, zeros, err);
    if (!st && variant != 3)
        st = tdm_gguf_writer_add_tensor(w, "blk.0.ffn_gate_exps.weight", TDM_Q_F32, 3, exps, zeros, err);
    if (!st && variant != 3 && variant != 4)
        st = tdm_gguf_writer_add_tensor(w, "blk.0.ffn_up_exps.weight", TDM_Q_F32, 3, exps, zeros, err);
    if (!st && variant != 3)
        st = tdm_gguf_writer_add_tensor(w, "blk.0.ffn_down_exps.weight", TDM_Q_F32, 3, down, zeros, err);
    if (!st && variant == 6)
        st = tdm_gguf_writer_add_tensor(w, "blk.7.attn_k.weight", TDM_Q_F32, 2, embd, zeros, err);
    if (!st)
        st = tdm_gguf_writer_write_memory(w, buf, size, err);
    tdm_gguf_writer_free(w);
    return st;
}

static tdm_status account_variant(int variant, tdm_proj_model *m, tdm_error *err)
{
    void *buf;
    size_t size;
    tdm_gguf *g;
    if (build(variant, &buf, &size, err) || tdm_gguf_open_memory(buf, size, &g, err))
        fail_msg("variant %d: %s", variant, err->msg);
    tdm_status st = tdm_proj_model_from_gguf(g, NULL, m, err);
    tdm_gguf_free(g);
    free(buf);
    return st;
}

static void test_bad_files(void **state)
{
    (void)state;
    tdm_proj_model m;
    tdm_error err = {0};
    assert_int_equal(account_variant(0, &m, &err), TDM_OK);
    assert_true(m.output_tied); /* no output.weight: the head reads token_embd */
    assert_int_equal(m.head_bytes, 64 * 16 * F32);
    assert_int_equal(m.slot_bytes, 3 * 64 * 32 * F32);
    assert_string_equal(m.name, "model");
    assert_int_equal(account_variant(1, &m, &err), TDM_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "blk.0.ffn_gate_exps.weight"));
    assert_int_equal(account_variant(2, &m, &err), TDM_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "qwen3moe.expert_count"));
    assert_int_equal(account_variant(3, &m, &err), TDM_ERR_UNSUPPORTED);
    assert_int_equal(account_variant(4, &m, &err), TDM_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "blk.0"));
    assert_int_equal(account_variant(5, &m, &err), TDM_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "expert_used_count"));
    assert_int_equal(account_variant(6, &m, &err), TDM_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "blk.7.attn_k.weight"));
}

/* ---- hit curves ---- */

static void test_zipf(void **state)
{
    (void)state;
    tdm_proj_hitcurve h;
    tdm_error err = {0};
    assert_int_equal(tdm_proj_hitcurve_zipf(0, 10, &h, &err), TDM_OK);
    for (int i = 0; i <= 10; i++) /* uniform routing: hit rate = cached share */
        assert_float_equal(tdm_proj_hit_rate(&h, i / 10.0), i / 10.0, 1e-12);
    assert_int_equal(tdm_proj_hitcurve_zipf(1, 4, &h, &err), TDM_OK);
    const double H4 = 1 + 1 / 2.0 + 1 / 3.0 + 1 / 4.0;
    assert_float_equal(tdm_proj_hit_rate(&h, 0.5), 1.5 / H4, 1e-12);
    assert_float_equal(tdm_proj_hit_rate(&h, 0.375), (1 + 0.5 * 0.5) / H4, 1e-12); /* c = 1.5 */
    assert_float_equal(tdm_proj_hit_rate(&h, 1), 1, 1e-12);
    assert_float_equal(tdm_proj_hit_rate(&h, 2), 1, 1e-12);
    assert_float_equal(tdm_proj_hit_rate(&h, -1), 0, 1e-12);
    assert_int_equal(tdm_proj_hitcurve_zipf(-0.1, 4, &h, &err), TDM_ERR_INVALID);
    assert_int_equal(tdm_proj_hitcurve_zipf(0.5, 0, &h, &err), TDM_ERR_INVALID);
}

static tdm_proj_model toy_model(void)
{
    tdm_proj_model m;
    memset(&m, 0, sizeof m);
    snprintf(m.name, sizeof m.name, "toy");
    m.n_layer = m.n_moe_layer = 2;
    m.n_expert = 4;
    m.n_expert_used = 2;
    m.slot_bytes = 1000;
    return m;
}

static void test_curve_files(void **state)
{
    (void)state;
    tdm_proj_model m = toy_model(); /* 2 layers x 4 experts = 8 slots */
    tdm_proj_hitcurve h;
    tdm_error err = {0};
    /* JSON points in three size units, out of order, two policies */
    const char *js = "{\"points\": ["
                     "{\"policy\": \"lru\", \"slots\": 4, \"hit_rate\": 0.8},"
                     "{\"policy\": \"lru\", \"slots_per_layer\": 1, \"hit_rate\": 0.5},"
                     "{\"policy\": \"static\", \"fraction\": 0.5, \"hit_rate\": 0.6}]}";
    assert_int_equal(tdm_proj_hitcurve_parse(js, "c.json", NULL, &m, &h, &err), TDM_OK);
    assert_int_equal(h.kind, TDM_PROJ_HIT_TABLE);
    assert_int_equal(h.n, 2);
    assert_float_equal(tdm_proj_hit_rate(&h, 0.125), 0.25, 1e-12); /* (0,0)-(0.25,0.5) */
    assert_float_equal(tdm_proj_hit_rate(&h, 0.375), 0.65, 1e-12);
    assert_float_equal(tdm_proj_hit_rate(&h, 0.75), 0.9, 1e-12);   /* to the implicit (1,1) */
    assert_non_null(strstr(h.source, "lru"));
    assert_int_equal(tdm_proj_hitcurve_parse(js, "c.json", "static", &m, &h, &err), TDM_OK);
    assert_int_equal(h.n, 1);
    assert_float_equal(tdm_proj_hit_rate(&h, 0.5), 0.6, 1e-12);
    assert_int_equal(tdm_proj_hitcurve_parse(js, "c.json", "fifo", &m, &h, &err), TDM_ERR_INVALID);
    /* CSV */
    const char *csv = "# from a sim\npolicy,fraction,hit_rate\nstatic,0.25,0.4\nstatic,1.0,1.0\n";
    assert_int_equal(tdm_proj_hitcurve_parse(csv, "c.csv", NULL, &m, &h, &err), TDM_OK);
    assert_int_equal(h.n, 2);
    assert_float_equal(tdm_proj_hit_rate(&h, 0.625), 0.7, 1e-12);
    /* a tandem profile: counts L0 [6 2 0 0], L1 [4 4 0 0] -> hottest 6,4,4,2 of 16 */
    const char *prof = "{\"format\": \"tandem-expert-profile\", \"version\": 1, \"tokens\": 8,"
                       "\"layers\": [{\"layer\": 0, \"count\": [6, 2, 0, 0]},"
                       "{\"layer\": 1, \"count\": [0, 4, 0, 4]}]}";
    assert_int_equal(tdm_proj_hitcurve_parse(prof, "p.json", NULL, &m, &h, &err), TDM_OK);
    assert_int_equal(h.n, 8);
    assert_float_equal(tdm_proj_hit_rate(&h, 1 / 8.0), 6 / 16.0, 1e-12);
    assert_float_equal(tdm_proj_hit_rate(&h, 3 / 8.0), 14 / 16.0, 1e-12);
    assert_float_equal(tdm_proj_hit_rate(&h, 4 / 8.0), 1, 1e-12);
    /* `tandem cachesim --json` runs: one run is one point (size from its "slots"),
     * an array of runs (jq -s) is a curve */
    const char *sim1 = "{\"n_layer\": 2, \"n_expert\": 4, \"k\": 2, \"slots\": 2, \"results\": ["
                       "{\"policy\": \"adaptive\", \"hit_rate\": 0.5, \"loads\": 3},"
                       "{\"policy\": \"lru\", \"hit_rate\": 0.4}]}";
    assert_int_equal(tdm_proj_hitcurve_parse(sim1, "sim.json", "lru", &m, &h, &err), TDM_OK);
    assert_int_equal(h.n, 1);
    assert_float_equal(tdm_proj_hit_rate(&h, 0.25), 0.4, 1e-12);
    const char *sims = "[{\"n_layer\": 2, \"n_expert\": 4, \"slots\": 2, \"results\": ["
                       "{\"policy\": \"adaptive\", \"hit_rate\": 0.5}]},"
                       "{\"n_layer\": 2, \"n_expert\": 4, \"slots\": 6, \"results\": ["
                       "{\"policy\": \"adaptive\", \"hit_rate\": 0.9}]}]";
    assert_int_equal(tdm_proj_hitcurve_parse(sims, "sims.json", NULL, &m, &h, &err), TDM_OK);
    assert_int_equal(h.n, 2);
    assert_float_equal(tdm_proj_hit_rate(&h, 0.5), 0.7, 1e-12); /* between 0.25 and 0.75 */
    assert_non_null(strstr(h.source, "adaptive"));
    const char *other = "{\"n_layer\": 48, \"n_expert\": 4, \"slots\": 2, \"results\": ["
                        "{\"policy\": \"lru\", \"hit_rate\": 0.4}]}";
    assert_int_equal(tdm_proj_hitcurve_parse(other, "o.json", NULL, &m, &h, &err), TDM_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "n_layer 48"));
    /* refusals */
    static const struct { const char *text; tdm_status st; const char *needle; } bad[] = {
        {"{\"points\": [{\"fraction\": 0.5, \"hit_rate\": 1.5}]}", TDM_ERR_FORMAT, "1.5"},
        {"{\"points\": [{\"fraction\": 0.5}]}", TDM_ERR_FORMAT, "hit_rate"},
        {"{\"points\": []}", TDM_ERR_FORMAT, "no hit-rate"},
        {"{\"points\": [{\"fraction\": 0.5, \"hit\": 0.5}, {\"fraction\": 0.5, \"hit\": 0.6}]}",
         TDM_ERR_FORMAT, "two points"},
        {"{\"points\": [{\"fraction\": 0, \"hit\": 0.2}]}", TDM_ERR_FORMAT, "empty cache"},
        {"{\"nothing\": 1}", TDM_ERR_FORMAT, "no \"points\""},
        {"{\"points\": [", TDM_ERR_FORMAT, "not valid JSON"},
        {"{\"format\": \"tandem-expert-profile\", \"layers\": [{\"count\": [1,2,3,4]}]}",
         TDM_ERR_FORMAT, "2 MoE layers"},
        {"{\"format\": \"tandem-expert-profile\", \"layers\": [{\"count\": [0,0,0,0]},"
         "{\"count\": [0,0,0,0]}]}", TDM_ERR_FORMAT, "no routed tokens"},
        {"fraction,hit_rate\n0.5,abc\n", TDM_ERR_FORMAT, "hit_rate"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tdm_status st = tdm_proj_hitcurve_parse(bad[i].text, "bad", NULL, &m, &h, &err);
        if (st != bad[i].st || !strstr(err.msg, bad[i].needle))
            fail_msg("case %zu: %s (%s)", i, tdm_status_name(st), err.msg);
    }
    assert_int_equal(tdm_proj_hitcurve_load("/nonexistent/curve.json", NULL, &m, &h, &err),
                     TDM_ERR_IO);
}

/* ---- the throughput arithmetic ---- */

/* 10 MoE layers x 100 experts of 10 MB, k 4: 1 GB active experts per token;
 * 0.5 GB non-expert (all GPU side). */
static tdm_proj_model calc_model(void)
{
    tdm_proj_model m;
    memset(&m, 0, sizeof m);
    snprintf(m.name, sizeof m.name, "calc");
    m.n_layer = m.n_moe_layer = 10;
    m.n_expert = 100;
    m.n_expert_used = 4;
    m.slot_bytes = 25000000;
    m.active_expert_bytes = 1000000000;
    m.total_expert_bytes = 25000000000;
    m.attn_bytes = 500000000;
    return m;
}

static void test_predict_cases(void **state)
{
    (void)state;
    tdm_proj_model m = calc_model();
    tdm_proj_hitcurve h;
    tdm_error err = {0};
    tdm_proj_point p;
    assert_int_equal(tdm_proj_hitcurve_zipf(0, 100, &h, &err), TDM_OK); /* h(f) = f */
    tdm_proj_machine mc = {.dram_gbps = 50, .efficiency = 0.8, .vram_gbps = 500,
                           .vram_efficiency = 1, .reserve_bytes = 500000000, .latency_us = 0,
                           .vram_bytes = 3500000000}; /* cache 2.5 GB = 100 slots = 10% */
    assert_int_equal(tdm_proj_predict(&m, &h, &mc, &p, &err), TDM_OK);
    assert_int_equal(p.cache_bytes, 2500000000);
    assert_int_equal(p.slots, 100);
    assert_float_equal(p.cached_fraction, 0.1, 1e-12);
    assert_float_equal(p.hit_rate, 0.1, 1e-12);
    assert_float_equal(p.cpu_bytes, 0.9e9, 1);
    assert_float_equal(p.gpu_bytes, 0.6e9, 1);
    assert_float_equal(p.t_cpu_s, 0.9e9 / 40e9, 1e-12);  /* 22.5 ms */
    assert_float_equal(p.t_gpu_s, 0.6e9 / 500e9, 1e-12); /* 1.2 ms */
    /* serial: the sides alternate, 22.5 + 1.2 ms */
    assert_float_equal(p.tok_s, 1 / 0.0237, 1e-9);
    assert_float_equal(p.tok_s_hits_on_gpu, p.tok_s, 0);
    assert_float_equal(p.tok_s_overlap, 40e9 / 0.9e9, 1e-9); /* max(22.5, 1.2) ms */
    assert_int_equal(p.bound, TDM_PROJ_BOUND_DRAM);
    assert_string_equal(tdm_proj_bound_name(p.bound), "cpu-dram");

    /* KV read at the decode context and the recurrent state read + written:
     * 1 kB x 100000 tokens + 2 x 50 MB = 0.2 GB more on the GPU side: 1.6 ms */
    tdm_proj_model mk = m;
    mk.kv_bytes_per_ctx = 1000;
    mk.state_bytes = 50000000;
    tdm_proj_machine mck = mc;
    mck.decode_ctx = 100000;
    assert_int_equal(tdm_proj_predict(&mk, &h, &mck, &p, &err), TDM_OK);
    assert_float_equal(p.gpu_bytes, 0.8e9, 1);
    assert_float_equal(p.tok_s, 1 / (0.0225 + 0.0016), 1e-9);
    mck.decode_ctx = -1;
    assert_int_equal(tdm_proj_predict(&mk, &h, &mck, &p, &err), TDM_ERR_INVALID);

    /* hand-off latency: 10 layers x (1 - 0.1^4) x 50 us on top of both sides */
    mc.latency_us = 50;
    assert_int_equal(tdm_proj_predict(&m, &h, &mc, &p, &err), TDM_OK);
    assert_float_equal(p.handoffs, 10 * (1 - 1e-4), 1e-12);
    assert_float_equal(p.tok_s, 1 / (0.0225 + 0.0012 + 10 * (1 - 1e-4) * 50e-6), 1e-9);
    assert_float_equal(p.tok_s_overlap, 1 / (0.0225 + 10 * (1 - 1e-4) * 50e-6), 1e-9);
    mc.latency_us = 5000; /* 50 ms of hand-offs: the largest term */
    assert_int_equal(tdm_proj_predict(&m, &h, &mc, &p, &err), TDM_OK);
    assert_int_equal(p.bound, TDM_PROJ_BOUND_LATENCY);

    /* GPU-bound: VRAM 50 GB/s, 50% cached: GPU 1 GB = 20 ms > CPU 0.5 GB =
     * 12.5 ms; every expert on the CPU would be 25 + 10 ms, so the hits stay */
    mc.latency_us = 0;
    mc.vram_gbps = 50;
    mc.vram_bytes = 13500000000;
    assert_int_equal(tdm_proj_predict(&m, &h, &mc, &p, &err), TDM_OK);
    assert_float_equal(p.tok_s, 1 / (0.0125 + 0.020), 1e-9);
    assert_float_equal(p.gpu_share, 0.5, 1e-12);
    assert_int_equal(p.bound, TDM_PROJ_BOUND_VRAM);
    assert_string_equal(tdm_proj_bound_name(p.bound), "gpu-vram");

    /* everything cached, GPU slower than the pool (10 vs 40 GB/s): all hits on
     * the GPU take 150 ms, every expert on the CPU 25 ms + the GPU's 0.5 GB
     * 50 ms = 75 ms: g = 0, still GPU-bound (its 50 ms is the larger term) */
    mc.vram_gbps = 10;
    mc.vram_bytes = 40000000000;
    assert_int_equal(tdm_proj_predict(&m, &h, &mc, &p, &err), TDM_OK);
    assert_int_equal(p.slots, 1000);
    assert_float_equal(p.hit_rate, 1, 0);
    assert_float_equal(p.tok_s_hits_on_gpu, 1 / 0.15, 1e-9);
    assert_float_equal(p.gpu_share, 0, 0);
    assert_float_equal(p.handoffs, 10, 0);
    assert_float_equal(p.tok_s, 1 / 0.075, 1e-9);
    assert_int_equal(p.bound, TDM_PROJ_BOUND_VRAM);
    /* VRAM 100 GB/s: all hits 15 ms against 25 + 5 ms on the CPU */
    mc.vram_gbps = 100;
    assert_int_equal(tdm_proj_predict(&m, &h, &mc, &p, &err), TDM_OK);
    assert_float_equal(p.gpu_share, 1, 0);
    assert_float_equal(p.tok_s, 1 / 0.015, 1e-9);
    /* fast GPU, all cached, 50 us hand-offs: nothing on the CPU, no hand-off */
    mc.vram_gbps = 1000;
    mc.latency_us = 50;
    assert_int_equal(tdm_proj_predict(&m, &h, &mc, &p, &err), TDM_OK);
    assert_float_equal(p.tok_s, 1000e9 / 1.5e9, 1e-6);
    assert_int_equal(p.bound, TDM_PROJ_BOUND_VRAM);
    assert_float_equal(p.cpu_bytes, 0, 0);
    assert_float_equal(p.handoffs, 0, 0);

    /* does not fit: 0.5 GB weights + 0.5 GB reserve > 0.9 GB */
    mc.vram_bytes = 900000000;
    assert_int_equal(tdm_proj_predict(&m, &h, &mc, &p, &err), TDM_OK);
    assert_int_equal(p.bound, TDM_PROJ_BOUND_NOFIT);
    assert_float_equal(p.tok_s, 0, 0);

    /* bad machines */
    tdm_proj_machine bad = mc;
    bad.dram_gbps = 0;
    assert_int_equal(tdm_proj_predict(&m, &h, &bad, &p, &err), TDM_ERR_INVALID);
    bad = mc;
    bad.efficiency = 2;
    assert_int_equal(tdm_proj_predict(&m, &h, &bad, &p, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.msg, "efficiency"));
    tdm_proj_model none = calc_model();
    none.n_moe_layer = 0;
    assert_int_equal(tdm_proj_predict(&none, &h, &mc, &p, &err), TDM_ERR_INVALID);
}

/* More bandwidth or more VRAM never makes a preset slower. */
static void test_monotone(void **state)
{
    (void)state;
    tdm_error err = {0};
    for (int i = 0; i < tdm_proj_preset_count(); i++) {
        tdm_proj_model m;
        tdm_proj_hitcurve h;
        assert_int_equal(tdm_proj_model_preset(tdm_proj_preset_name(i), &m, &err), TDM_OK);
        assert_int_equal(tdm_proj_hitcurve_zipf(0.7, m.n_expert, &h, &err), TDM_OK);
        tdm_proj_machine mc;
        tdm_proj_machine_default(&m, &mc);
        double prev_bw = 0;
        for (double bw = 10; bw <= 400; bw *= 1.5) {
            double prev_v = 0;
            mc.dram_gbps = bw;
            for (double gib = 1; gib <= 96; gib += 0.5) {
                tdm_proj_point p;
                mc.vram_bytes = (uint64_t)(gib * 1073741824.0);
                assert_int_equal(tdm_proj_predict(&m, &h, &mc, &p, &err), TDM_OK);
                if (p.tok_s < prev_v * (1 - 1e-12))
                    fail_msg("%s: %g GB/s, %g GiB: %g tok/s < %g", m.name, bw, gib, p.tok_s, prev_v);
                prev_v = p.tok_s;
            }
            if (prev_v < prev_bw * (1 - 1e-12))
                fail_msg("%s: %g GB/s slower than the previous bandwidth", m.name, bw);
            prev_bw = prev_v;
        }
    }
}

/* ---- the grid JSON ---- */

static double num(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(v))
        fail_msg("field %s is not a number", k);
    return v->valuedouble;
}

static void test_json(void **state)
{
    (void)state;
    tdm_proj_model m;
    tdm_proj_hitcurve h;
    static tdm_proj_grid g;
    tdm_error err = {0};
    assert_int_equal(tdm_proj_model_preset("qwen3next-80b-a3b", &m, &err), TDM_OK);
    assert_int_equal(tdm_proj_hitcurve_zipf(0.5, m.n_expert, &h, &err), TDM_OK);
    tdm_proj_grid_default(&m, &g);
    assert_int_equal(g.n_dram, 3);
    assert_float_equal(g.dram[0].gbps, 51.2, 1e-9);
    assert_float_equal(g.dram[1].gbps, 83.2, 1e-9);
    assert_float_equal(g.dram[2].gbps, 96.0, 1e-9);
    assert_int_equal(tdm_proj_grid_add_dram(&g, "this box", 30.5, true, &err), TDM_OK);
    assert_int_equal(tdm_proj_grid_run(&m, &h, &g, &err), TDM_OK);
    char *s = tdm_proj_json(&m, &h, &g);
    assert_non_null(s);
    cJSON *doc = cJSON_Parse(s);
    free(s);
    assert_non_null(doc);
    assert_string_equal(cJSON_GetObjectItem(doc, "format")->valuestring, "tandem-projection");
    assert_int_equal((int)num(doc, "version"), 1);
    const cJSON *model = cJSON_GetObjectItem(doc, "model"), *bytes = cJSON_GetObjectItem(model, "bytes");
    assert_string_equal(cJSON_GetObjectItem(model, "name")->valuestring, "qwen3next-80b-a3b");
    assert_int_equal((int)num(model, "n_expert_used"), 10);
    assert_float_equal(num(bytes, "active_expert_per_token"), (double)m.active_expert_bytes, 0);
    assert_float_equal(num(bytes, "dense_per_token"), (double)tdm_proj_dense_bytes(&m), 0);
    assert_float_equal(num(bytes, "total_experts"), (double)m.total_expert_bytes, 0);
    const cJSON *as = cJSON_GetObjectItem(doc, "assumptions");
    assert_float_equal(num(as, "efficiency"), 0.8, 0);
    assert_string_equal(cJSON_GetObjectItem(as, "efficiency_source")->valuestring, "default");
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(as, "hit_model"), "kind")->valuestring,
                        "zipf");
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(doc, "dram")), 4);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(doc, "vram_gib")), 4);
    const cJSON *pts = cJSON_GetObjectItem(doc, "points");
    assert_int_equal(cJSON_GetArraySize(pts), 16);
    int i = 0;
    const cJSON *pt;
    cJSON_ArrayForEach(pt, pts) {
        const tdm_proj_point *p = &g.points[i];
        assert_string_equal(cJSON_GetObjectItem(pt, "dram")->valuestring, g.dram[i / 4].name);
        assert_float_equal(num(pt, "vram_gib"), g.vram_gib[i % 4], 0);
        assert_float_equal(num(pt, "tok_s"), p->tok_s, 1e-9 * p->tok_s);
        assert_float_equal(num(pt, "hit_rate"), p->hit_rate, 1e-12);
        assert_float_equal(num(pt, "slots"), (double)p->slots, 0);
        assert_string_equal(cJSON_GetObjectItem(pt, "bound")->valuestring, tdm_proj_bound_name(p->bound));
        assert_true(cJSON_IsBool(cJSON_GetObjectItem(pt, "fits")));
        assert_true(cJSON_IsNull(cJSON_GetObjectItem(pt, "measured_tok_s")));
        assert_true(cJSON_IsNull(cJSON_GetObjectItem(pt, "rel_error")));
        assert_true(num(pt, "tok_s") > 0);
        i++;
    }
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(cJSON_GetArrayItem(pts, 12), "dram_measured")));
    cJSON_Delete(doc);
    /* grid limits */
    for (int k = g.n_dram; k < TDM_PROJ_GRID_MAX; k++)
        assert_int_equal(tdm_proj_grid_add_dram(&g, "x", 10, false, &err), TDM_OK);
    assert_int_equal(tdm_proj_grid_add_dram(&g, "x", 10, false, &err), TDM_ERR_INVALID);
    g.vram_gib[0] = -1;
    assert_int_equal(tdm_proj_grid_run(&m, &h, &g, &err), TDM_ERR_INVALID);
}

/* ---- re-validation: reading back a hybrid tandem-bench JSON ---- */

static const char VALFILE[] =
    "{\"format\": \"tandem-bench\", \"version\": 2, \"command\": \"tandem bench --validate\",\n"
    " \"model\": {\"name\": \"q.gguf\", \"path\": \"/nonexistent/q.gguf\", \"arch\": \"qwen35moe\",\n"
    "  \"active_expert_bytes_per_token\": 609484800, \"dense_bytes_per_token\": 1366192744},\n"
    " \"engine_path\": \"hybrid\",\n"
    " \"runs\": [{\"threads\": 4, \"prompt_tokens\": 512, \"gen_tokens\": 64, \"decode_tok_s\": 40,\n"
    "   \"gpu_mem_gib\": 12, \"fill\": \"layer\", \"hit_rate\": 0.5, \"dram_gbps\": 35.5,\n"
    "   \"cpu_ms_per_token\": 16, \"gpu_ms_per_token\": 20.5, \"wait_ms_per_token\": 15.5,\n"
    "   \"projected_slots\": 5337},\n"
    "  {\"threads\": 2, \"prompt_tokens\": 8, \"gen_tokens\": 2, \"decode_tok_s\": 3,\n"
    "   \"gpu_mem_gib\": 8, \"fill\": \"profile\", \"hit_rate\": 0.25, \"dram_gbps\": null,\n"
    "   \"projected_slots\": null}],\n"
    " \"validation\": {\"efficiency\": 0.6, \"efficiency_source\": \"pool\", \"vram_gbps\": 4000,\n"
    "  \"latency_us\": 10, \"reserve_bytes\": 614531072, \"hit_curve\": \"zipf s=0.50\"}}\n";

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_true(fputs(text, f) >= 0);
    assert_int_equal(fclose(f), 0);
}

/* VALFILE with the first occurrence of from replaced by to. */
static void edited(const char *from, const char *to, char *out, size_t cap)
{
    const char *at = strstr(VALFILE, from);
    assert_non_null(at);
    snprintf(out, cap, "%.*s%s%s", (int)(at - VALFILE), VALFILE, to, at + strlen(from));
}

static void test_valfile(void **state)
{
    (void)state;
    static tdm_proj_valfile v;
    tdm_error err = {0};
    char path[] = "/tmp/test_projection_valXXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    write_text(path, VALFILE);
    assert_int_equal(tdm_proj_valfile_load(path, &v, &err), TDM_OK);
    assert_string_equal(v.command, "tandem bench --validate");
    assert_string_equal(v.arch, "qwen35moe");
    assert_string_equal(v.model_path, "/nonexistent/q.gguf");
    assert_int_equal(v.active_expert_bytes, 609484800);
    assert_int_equal(v.dense_bytes, 1366192744);
    assert_float_equal(v.vram_gbps, 4000, 0);
    assert_float_equal(v.vram_efficiency, 1, 0); /* absent: what --validate used */
    assert_float_equal(v.efficiency, 0.6, 0);
    assert_float_equal(v.latency_us, 10, 0);
    assert_int_equal(v.reserve_bytes, 614531072);
    assert_string_equal(v.hit_curve, "zipf s=0.50");
    assert_int_equal(v.n_runs, 2);
    const tdm_proj_valrun *r = &v.runs[0];
    assert_int_equal(r->threads, 4);
    assert_int_equal(r->prompt_tokens, 512);
    assert_int_equal(r->gen_tokens, 64);
    assert_string_equal(r->fill, "layer");
    assert_float_equal(r->gpu_mem_gib, 12, 0);
    assert_float_equal(r->dram_gbps, 35.5, 0);
    assert_float_equal(r->decode_tok_s, 40, 0);
    assert_float_equal(r->hit_rate, 0.5, 0);
    assert_float_equal(r->gpu_ms - r->wait_ms, 5, 1e-12);
    assert_int_equal(r->projected_slots, 5337);
    assert_string_equal(v.runs[1].fill, "profile");
    assert_float_equal(v.runs[1].dram_gbps, 0, 0); /* null: no B_dram */
    assert_int_equal(v.runs[1].projected_slots, -1);
    assert_float_equal(v.runs[1].cpu_ms, 0, 0);

    /* the model without its file: the preset with the recorded arch and A,
     * the recorded non-expert bytes (1000 more than the preset's) */
    tdm_proj_model m, pre;
    char note[512];
    assert_int_equal(tdm_proj_valfile_model(&v, NULL, &m, note, sizeof note, &err), TDM_OK);
    assert_int_equal(tdm_proj_model_preset("qwen35-35b-a3b", &pre, &err), TDM_OK);
    assert_string_equal(m.name, "qwen35-35b-a3b");
    assert_int_equal(m.attn_bytes, pre.attn_bytes + 1000);
    assert_int_equal(tdm_proj_dense_bytes(&m), v.dense_bytes);
    assert_int_equal(m.slot_bytes, pre.slot_bytes);
    assert_int_equal(tdm_proj_reserve_bytes(&m, 576), v.reserve_bytes); /* 512 + 64 positions */
    assert_non_null(strstr(note, "+1000"));
    v.active_expert_bytes++;
    assert_int_equal(tdm_proj_valfile_model(&v, NULL, &m, NULL, 0, &err), TDM_ERR_INVALID);
    assert_non_null(strstr(err.msg, "--preset"));
    assert_int_equal(tdm_proj_valfile_model(&v, "qwen35-35b-a3b", &m, NULL, 0, &err), TDM_OK);
    v.dense_bytes = 1;
    assert_int_equal(tdm_proj_valfile_model(&v, "qwen35-35b-a3b", &m, NULL, 0, &err), TDM_ERR_INVALID);

    /* refusals, each naming the problem */
    static char text[sizeof VALFILE + 64];
    static const struct { const char *from, *to, *msg; } bad[] = {
        {"\"hybrid\"", "\"cpu\"", "engine_path 'cpu'"},
        {"\"efficiency\": 0.6", "\"eff\": 0.6", "validation.efficiency"},
        {"\"threads\": 2", "\"threads\": null", "runs[1].threads"},
        {"\"profile\"", "\"bogus\"", "bogus"},
        {"tandem-bench", "tandem-projection", ""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        edited(bad[i].from, bad[i].to, text, sizeof text);
        assert_int_equal(tdm_proj_valfile_parse(text, "x.json", &v, &err), TDM_ERR_FORMAT);
        assert_non_null(strstr(err.msg, bad[i].msg));
    }
    assert_int_equal(tdm_proj_valfile_parse("{", "x.json", &v, &err), TDM_ERR_FORMAT);
    remove(path);
    assert_int_equal(tdm_proj_valfile_load(path, &v, &err), TDM_ERR_IO);
}

int main(void)
{
    const char *env = getenv("TDM_ROOT");
    snprintf(root, sizeof root, "%s", env && *env ? env : ".");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_use_more_bits), cmocka_unit_test(test_micro_qwen3moe),
        cmocka_unit_test(test_micro_qwen3next), cmocka_unit_test(test_demo_file),
        cmocka_unit_test(test_presets),       cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_zipf),          cmocka_unit_test(test_curve_files),
        cmocka_unit_test(test_predict_cases), cmocka_unit_test(test_monotone),
        cmocka_unit_test(test_json),          cmocka_unit_test(test_valfile),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
