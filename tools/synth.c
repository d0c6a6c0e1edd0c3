/* synth: writes a benchmark GGUF with the exact tensor names, shapes and
 * per-tensor types of a real Qwen MoE model at Q4_K_M (gguf.md §3.2,
 * models.md §5.2-5.3) and random but valid weights (finite scales, values of
 * a sensible magnitude), plus a real tokenizer copied from a fixture GGUF and
 * padded with [PAD<i>] UNUSED tokens up to the preset's vocabulary.
 *
 * Router rows are scaled by a Zipf-like law (--route-skew S: expert of
 * popularity rank r gets row scale (1 + r)^-S, ranks shuffled per layer), so
 * that a small expert cache serves a large share of the selections, as real
 * routers do. The share is measured by simulating random activations through
 * the generated router of layer 0 and printed.
 *
 * The file is streamed: at most one 8 MiB chunk per tensor is in memory;
 * blocks are generated in parallel (OpenMP), deterministically from --seed.
 *
 *   synth --preset qwen3-30b-a3b|qwen35-35b-a3b|qwen3next-80b-a3b -o FILE
 *         [--layers N] [--seed S] [--route-skew S] [--tokenizer GGUF]
 *         [--dry-run] [--calibrate]
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gguf.h"
#include "gguf_writer.h"
#include "qrand.h"
#include "quant.h"

typedef enum arch { QWEN3MOE, QWEN3NEXT, QWEN35MOE } arch;

typedef struct preset {
    const char *name, *arch_name, *tok_fixture;
    arch a;
    int n_layer, d, n_head, n_kv, hd, n_expert, k, n_ff, n_ff_sh, ffn_len, vocab, ctx;
    float rope_base, skew; /* skew: default --route-skew, calibrated (see docs/GPU.md) */
    int rope_dim, conv, dk, n_kh, n_vh, dv, fa_interval;
} preset;

static const preset k_presets[] = {
    {"qwen3-30b-a3b", "qwen3moe", "micro-qwen3moe", QWEN3MOE, 48, 2048, 32, 4, 128, 128, 8, 768, 0,
     6144, 151936, 40960, 1e6f, 0.30f, 0, 0, 0, 0, 0, 0, 0},
    {"qwen35-35b-a3b", "qwen35moe", "micro-qwen35moe", QWEN35MOE, 40, 2048, 16, 2, 256, 256, 8, 512,
     512, 0, 248320, 262144, 1e7f, 0.195f, 64, 4, 128, 16, 32, 128, 4},
    {"qwen3next-80b-a3b", "qwen3next", "micro-qwen3next", QWEN3NEXT, 48, 2048, 16, 2, 256, 512, 10,
     512, 512, 5120, 151936, 262144, 1e7f, 0.153f, 64, 4, 128, 16, 32, 128, 4},
};

/* What a tensor's values are. */
typedef enum kind { K_MATRIX, K_NORM, K_ROUTER, K_SSM_A, K_DT_BIAS, K_CONV } kind;

typedef struct tensor {
    char name[64];
    tdm_qtype type;
    uint32_t n_dims;
    int64_t ne[4];
    kind kind;
    int layer;
    uint64_t seed;
    uint64_t bytes;
} tensor;

typedef struct synth {
    const preset *p;
    int n_layer;
    uint64_t seed;
    float skew;
    tensor *t;
    int n, cap;
    /* the last small tensor materialised whole (F32 kinds) */
    int64_t cached;
    float *cache;
    size_t cache_cap;
    uint8_t **scratch; /* per thread: one group of blocks */
} synth;

#define GROUP_BLOCKS 1024

static void die(const char *what, const tdm_error *e)
{
    fprintf(stderr, "synth: %s: %s\n", what, e ? e->msg : "");
    exit(1);
}

static bool use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

static void add(synth *s, kind k, int layer, tdm_qtype type, const char *fmt, int n_dims,
                int64_t ne0, int64_t ne1, int64_t ne2)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 256;
        s->t = realloc(s->t, sizeof *s->t * s->cap);
        if (!s->t)
            die("out of memory", NULL);
    }
    tensor *t = &s->t[s->n];
    memset(t, 0, sizeof *t);
    if (layer >= 0)
        snprintf(t->name, sizeof t->name, fmt, layer);
    else
        snprintf(t->name, sizeof t->name, "%s", fmt);
    t->type = type;
    t->n_dims = (uint32_t)n_dims;
    t->ne[0] = ne0, t->ne[1] = ne1, t->ne[2] = ne2, t->ne[3] = 1;
    t->kind = k;
    t->layer = layer;
    t->seed = tdm_qrand_mix(s->seed, (uint64_t)s->n + 1);
    int64_t rows = ne1 * ne2;
    if (n_dims == 1)
        rows = 1;
    else if (n_dims == 2)
        rows = ne1;
    t->bytes = tdm_qtype_row_bytes(type, ne0) * (uint64_t)rows;
    s->n++;
}

/* The Q4_K_M tensor list (gguf.md §3.2): Q6_K for output, attn_v-like and
 * ffn_down(_exps/_shexp) on use_more_bits layers, Q4_K for every other
 * matrix, F32 for norms, router and the small SSM tensors. */
static void build_list(synth *s)
{
    const preset *p = s->p;
    int L = s->n_layer, D = p->d;
    const tdm_qtype Q4 = TDM_Q_Q4_K, Q6 = TDM_Q_Q6_K, F32 = TDM_Q_F32;
    add(s, K_MATRIX, -1, Q4, "token_embd.weight", 2, D, p->vocab, 1);
    for (int l = 0; l < L; l++) {
        tdm_qtype vt = use_more_bits(l, L) ? Q6 : Q4;
        bool full = p->a == QWEN3MOE || (l + 1) % p->fa_interval == 0;
        add(s, K_NORM, l, F32, "blk.%d.attn_norm.weight", 1, D, 1, 1);
        if (full) {
            int qw = p->n_head * p->hd * (p->a == QWEN3MOE ? 1 : 2); /* q | gate per head */
            add(s, K_MATRIX, l, Q4, "blk.%d.attn_q.weight", 2, D, qw, 1);
            add(s, K_MATRIX, l, Q4, "blk.%d.attn_k.weight", 2, D, p->n_kv * p->hd, 1);
            add(s, K_MATRIX, l, vt, "blk.%d.attn_v.weight", 2, D, p->n_kv * p->hd, 1);
            add(s, K_MATRIX, l, Q4, "blk.%d.attn_output.weight", 2, p->n_head * p->hd, D, 1);
            add(s, K_NORM, l, F32, "blk.%d.attn_q_norm.weight", 1, p->hd, 1, 1);
            add(s, K_NORM, l, F32, "blk.%d.attn_k_norm.weight", 1, p->hd, 1, 1);
        } else {
            int conv_dim = 2 * p->n_kh * p->dk + p->n_vh * p->dv;
            add(s, K_MATRIX, l, vt, "blk.%d.attn_qkv.weight", 2, D, conv_dim, 1);
            add(s, K_MATRIX, l, Q4, "blk.%d.attn_gate.weight", 2, D, p->n_vh * p->dv, 1);
            if (p->a == QWEN35MOE) {
                add(s, K_MATRIX, l, F32, "blk.%d.ssm_alpha.weight", 2, D, p->n_vh, 1);
                add(s, K_MATRIX, l, F32, "blk.%d.ssm_beta.weight", 2, D, p->n_vh, 1);
            } else {
                add(s, K_MATRIX, l, F32, "blk.%d.ssm_ba.weight", 2, D, 2 * p->n_vh, 1);
            }
            add(s, K_CONV, l, F32, "blk.%d.ssm_conv1d.weight", 2, p->conv, conv_dim, 1);
            add(s, K_DT_BIAS, l, F32, "blk.%d.ssm_dt.bias", 1, p->n_vh, 1, 1);
            add(s, K_SSM_A, l, F32, "blk.%d.ssm_a", 1, p->n_vh, 1, 1);
            add(s, K_NORM, l, F32, "blk.%d.ssm_norm.weight", 1, p->dv, 1, 1);
            add(s, K_MATRIX, l, Q4, "blk.%d.ssm_out.weight", 2, p->n_vh * p->dv, D, 1);
        }
        add(s, K_NORM, l, F32,
            p->a == QWEN3MOE ? "blk.%d.ffn_norm.weight" : "blk.%d.post_attention_norm.weight", 1, D,
            1, 1);
        add(s, K_ROUTER, l, F32, "blk.%d.ffn_gate_inp.weight", 2, D, p->n_expert, 1);
        add(s, K_MATRIX, l, Q4, "blk.%d.ffn_gate_exps.weight", 3, D, p->n_ff, p->n_expert);
        add(s, K_MATRIX, l, Q4, "blk.%d.ffn_up_exps.weight", 3, D, p->n_ff, p->n_expert);
        add(s, K_MATRIX, l, use_more_bits(l, L) ? Q6 : Q4, "blk.%d.ffn_down_exps.weight", 3,
            p->n_ff, D, p->n_expert);
        if (p->n_ff_sh) {
            add(s, K_MATRIX, l, F32, "blk.%d.ffn_gate_inp_shexp.weight", 2, D, 1, 1);
            add(s, K_MATRIX, l, Q4, "blk.%d.ffn_gate_shexp.weight", 2, D, p->n_ff_sh, 1);
            add(s, K_MATRIX, l, Q4, "blk.%d.ffn_up_shexp.weight", 2, D, p->n_ff_sh, 1);
            add(s, K_MATRIX, l, use_more_bits(l, L) ? Q6 : Q4, "blk.%d.ffn_down_shexp.weight", 2,
                p->n_ff_sh, D, 1);
        }
    }
    add(s, K_NORM, -1, F32, "output_norm.weight", 1, D, 1, 1);
    add(s, K_MATRIX, -1, Q6, "output.weight", 2, D, p->vocab, 1);
}

/* Row scale of each expert's router row: Zipf-like by a per-layer shuffled
 * popularity rank. */
static void router_scales(const synth *s, int layer, float skew, float *scale)
{
    int E = s->p->n_expert;
    int *perm = malloc(sizeof(int) * E);
    for (int e = 0; e < E; e++)
        perm[e] = e;
    uint64_t st = tdm_qrand_mix(s->seed ^ 0x5eed, (uint64_t)layer);
    for (int e = E - 1; e > 0; e--) {
        st = tdm_qrand_mix(st, (uint64_t)e);
        int r = (int)(st % (uint64_t)(e + 1)), tmp = perm[e];
        perm[e] = perm[r];
        perm[r] = tmp;
    }
    for (int e = 0; e < E; e++)
        scale[e] = powf(1.0f + (float)perm[e], -skew);
    free(perm);
}

/* Whole float32 tensor t (small kinds) into out. */
static void gen_f32(const synth *s, const tensor *t, float skew, float *out)
{
    int64_t n = t->ne[0] * t->ne[1] * t->ne[2];
    tdm_error e = {0};
    uint64_t st = t->seed;
    switch (t->kind) {
    case K_MATRIX: /* small F32 projections (ssm_alpha/beta/ba, shared gate) */
    case K_ROUTER:
        if (tdm_qrand_fill(TDM_Q_F32, out, n, 0.02f, t->seed, &e) != TDM_OK)
            die(t->name, &e);
        if (t->kind == K_ROUTER) {
            float *sc = malloc(sizeof(float) * t->ne[1]);
            router_scales(s, t->layer, skew, sc);
            for (int64_t r = 0; r < t->ne[1]; r++)
                for (int64_t i = 0; i < t->ne[0]; i++)
                    out[r * t->ne[0] + i] *= sc[r];
            free(sc);
        }
        break;
    case K_NORM: /* GGUF norm weights (zero-centred ones folded +1): about 1 */
        if (tdm_qrand_fill(TDM_Q_F32, out, n, 0.05f, t->seed, &e) != TDM_OK)
            die(t->name, &e);
        for (int64_t i = 0; i < n; i++)
            out[i] += 1.0f;
        break;
    case K_CONV:
        if (tdm_qrand_fill(TDM_Q_F32, out, n, 0.2f, t->seed, &e) != TDM_OK)
            die(t->name, &e);
        break;
    case K_SSM_A: /* -exp(A_log), A_log = log U(1, 16) as HF initialises it */
    case K_DT_BIAS: /* inverse softplus of dt, dt log-uniform in [1e-3, 1e-1] */
        for (int64_t i = 0; i < n; i++) {
            st = tdm_qrand_mix(st, (uint64_t)i);
            double u = (double)(st >> 11) / 9007199254740992.0;
            if (t->kind == K_SSM_A)
                out[i] = -(float)(1.0 + 15.0 * u);
            else {
                double dt = exp(log(1e-3) + u * (log(1e-1) - log(1e-3)));
                out[i] = (float)log(expm1(dt));
            }
        }
        break;
    }
}

static tdm_status fill(void *user, int64_t index, uint64_t offset, void *dst, size_t n,
                       tdm_error *err)
{
    synth *s = user;
    const tensor *t = &s->t[index];
    if (t->type == TDM_Q_F32) {
        if (s->cached != index) {
            if (t->bytes > s->cache_cap) {
                free(s->cache);
                s->cache = malloc(t->bytes);
                s->cache_cap = t->bytes;
                if (!s->cache)
                    return tdm_error_set(err, TDM_ERR_OOM, "synth: %s", t->name);
            }
            gen_f32(s, t, s->skew, s->cache);
            s->cached = index;
        }
        memcpy(dst, (uint8_t *)s->cache + offset, n);
        return TDM_OK;
    }
    /* quantised: groups of GROUP_BLOCKS blocks, each from its own seed */
    const tdm_qtype_info *qi = tdm_qtype_get(t->type);
    uint64_t gbytes = (uint64_t)GROUP_BLOCKS * qi->type_size;
    int64_t g0 = (int64_t)(offset / gbytes), g1 = (int64_t)((offset + n - 1) / gbytes);
    int64_t total_blocks = (int64_t)(t->bytes / qi->type_size);
    tdm_status st = TDM_OK;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t g = g0; g <= g1; g++) {
        uint8_t *buf = s->scratch[omp_get_thread_num()];
        int64_t b0 = g * GROUP_BLOCKS, nb = total_blocks - b0 < GROUP_BLOCKS ? total_blocks - b0 : GROUP_BLOCKS;
        tdm_error e = {0};
        if (tdm_qrand_fill(t->type, buf, nb, 0.02f, tdm_qrand_mix(t->seed, (uint64_t)g), &e) != TDM_OK) {
#pragma omp critical
            st = tdm_error_set(err, e.code, "%s", e.msg);
            continue;
        }
        uint64_t gs = (uint64_t)g * gbytes, ge = gs + (uint64_t)nb * qi->type_size;
        uint64_t lo = gs > offset ? gs : offset, hi = ge < offset + n ? ge : offset + n;
        if (lo < hi)
            memcpy((uint8_t *)dst + (lo - offset), buf + (lo - gs), hi - lo);
    }
    return st;
}

/* Share of selections served by the 20% most popular experts, for random
 * isotropic activations through the router rows (skew applied). */
static double simulate(const synth *s, float skew, int samples, bool print)
{
    int E = s->p->n_expert, D = s->p->d, k = s->p->k;
    const tensor *rt = NULL;
    for (int i = 0; i < s->n && !rt; i++)
        if (s->t[i].kind == K_ROUTER)
            rt = &s->t[i];
    float *w = malloc(sizeof(float) * E * D);
    gen_f32(s, rt, skew, w);
    long *count = calloc(E, sizeof(long));
#pragma omp parallel
    {
        float *x = malloc(sizeof(float) * D), *lg = malloc(sizeof(float) * E);
        long *local = calloc(E, sizeof(long));
#pragma omp for
        for (int n = 0; n < samples; n++) {
            tdm_qrand_fill(TDM_Q_F32, x, D, 1.0f, tdm_qrand_mix(0xac7, (uint64_t)n), NULL);
            for (int e = 0; e < E; e++) {
                float a = 0;
                for (int i = 0; i < D; i++)
                    a += w[(size_t)e * D + i] * x[i];
                lg[e] = a;
            }
            for (int r = 0; r < k; r++) { /* top-k of the logits = top-k of softmax */
                int b = 0;
                for (int e = 1; e < E; e++)
                    if (lg[e] > lg[b])
                        b = e;
                local[b]++;
                lg[b] = -INFINITY;
            }
        }
#pragma omp critical
        for (int e = 0; e < E; e++)
            count[e] += local[e];
        free(x), free(lg), free(local);
    }
    /* sort counts descending */
    for (int i = 0; i < E; i++)
        for (int j = i + 1; j < E; j++)
            if (count[j] > count[i]) {
                long tmp = count[i];
                count[i] = count[j];
                count[j] = tmp;
            }
    int top = (E + 4) / 5;
    long hot = 0, all = 0;
    for (int e = 0; e < E; e++) {
        all += count[e];
        if (e < top)
            hot += count[e];
    }
    double share = (double)hot / (double)all;
    if (print)
        printf("route skew %.3f: the hottest 20%% of experts (%d of %d) serve %.1f%% of %d x %d "
               "selections (layer 0, random activations; uniform routing: 20%%)\n",
               (double)skew, top, E, 100 * share, samples, k);
    free(w);
    free(count);
    return share;
}

static void copy_tokenizer(tdm_gguf_writer *w, const char *path, int vocab)
{
    tdm_gguf *g;
    tdm_error e = {0};
    if (tdm_gguf_open(path, &g, &e) != TDM_OK)
        die(path, &e);
    for (int64_t i = 0; i < tdm_gguf_kv_count(g); i++) {
        const char *key = tdm_gguf_kv_key(g, i);
        if (strncmp(key, "tokenizer.", 10) != 0)
            continue;
        tdm_gguf_vtype vt = tdm_gguf_kv_type(g, i);
        tdm_status st = TDM_OK;
        if (vt == TDM_GGUF_STRING) {
            const char *sv;
            size_t len;
            st = tdm_gguf_get_str(g, key, &sv, &len, &e);
            if (st == TDM_OK)
                st = tdm_gguf_writer_add_strn(w, key, sv, len, &e);
        } else if (vt == TDM_GGUF_ARRAY) {
            tdm_gguf_vtype et;
            uint64_t cnt;
            st = tdm_gguf_get_arr(g, key, &et, &cnt, &e);
            bool pad = !strcmp(key, "tokenizer.ggml.tokens") || !strcmp(key, "tokenizer.ggml.token_type");
            uint64_t n = pad && (uint64_t)vocab > cnt ? (uint64_t)vocab : cnt;
            if (st == TDM_OK && et == TDM_GGUF_STRING) {
                char **strs = calloc(n, sizeof *strs);
                size_t *lens = calloc(n, sizeof *lens);
                for (uint64_t j = 0; j < n && st == TDM_OK; j++) {
                    if (j < cnt) {
                        const char *sv;
                        st = tdm_gguf_arr_str(g, key, j, &sv, &lens[j], &e);
                        strs[j] = (char *)sv;
                    } else {
                        strs[j] = malloc(32);
                        lens[j] = (size_t)snprintf(strs[j], 32, "[PAD%llu]", (unsigned long long)j);
                    }
                }
                if (st == TDM_OK)
                    st = tdm_gguf_writer_add_arr_str(w, key, (const char *const *)strs, lens, n, &e);
                for (uint64_t j = cnt; j < n; j++)
                    free(strs[j]);
                free(strs);
                free(lens);
            } else if (st == TDM_OK && et == TDM_GGUF_INT32) {
                int32_t *v = malloc(sizeof(int32_t) * n);
                for (uint64_t j = 0; j < n && st == TDM_OK; j++) {
                    int64_t x = 5; /* UNUSED, for the padding */
                    if (j < cnt)
                        st = tdm_gguf_arr_int(g, key, j, &x, &e);
                    v[j] = (int32_t)x;
                }
                if (st == TDM_OK)
                    st = tdm_gguf_writer_add_arr(w, key, TDM_GGUF_INT32, v, n, &e);
                free(v);
            } else if (st == TDM_OK) {
                fprintf(stderr, "synth: skipping tokenizer array %s of type %d\n", key, (int)et);
            }
        } else if (vt == TDM_GGUF_UINT32 || vt == TDM_GGUF_INT32) {
            uint32_t v;
            st = tdm_gguf_get_u32(g, key, &v, &e);
            if (st == TDM_OK)
                st = tdm_gguf_writer_add_u32(w, key, v, &e);
        } else if (vt == TDM_GGUF_BOOL) {
            bool b;
            st = tdm_gguf_get_bool(g, key, &b, &e);
            if (st == TDM_OK)
                st = tdm_gguf_writer_add_bool(w, key, b, &e);
        } else {
            fprintf(stderr, "synth: skipping tokenizer key %s of type %d\n", key, (int)vt);
        }
        if (st != TDM_OK)
            die(key, &e);
    }
    tdm_gguf_free(g);
}

static void add_kv(tdm_gguf_writer *w, const synth *s)
{
    const preset *p = s->p;
    tdm_error e = {0};
    char key[128], name[128];
#define KEY(suffix) (snprintf(key, sizeof key, "%s.%s", p->arch_name, suffix), key)
#define U32(k, v) if (tdm_gguf_writer_add_u32(w, k, (uint32_t)(v), &e) != TDM_OK) die(k, &e)
#define F32(k, v) if (tdm_gguf_writer_add_f32(w, k, (float)(v), &e) != TDM_OK) die(k, &e)
#define STR(k, v) if (tdm_gguf_writer_add_str(w, k, v, &e) != TDM_OK) die(k, &e)
    STR("general.architecture", p->arch_name);
    STR("general.type", "model");
    snprintf(name, sizeof name, "synthetic %s (random weights, tandem tools/synth)", p->name);
    STR("general.name", name);
    U32("general.file_type", 15); /* MOSTLY_Q4_K_M */
    U32("general.quantization_version", 2);
    U32(KEY("block_count"), s->n_layer);
    U32(KEY("context_length"), p->ctx);
    U32(KEY("embedding_length"), p->d);
    if (p->ffn_len)
        U32(KEY("feed_forward_length"), p->ffn_len);
    U32(KEY("attention.head_count"), p->n_head);
    U32(KEY("attention.head_count_kv"), p->n_kv);
    F32(KEY("rope.freq_base"), p->rope_base);
    F32(KEY("attention.layer_norm_rms_epsilon"), 1e-6);
    U32(KEY("expert_count"), p->n_expert);
    U32(KEY("expert_used_count"), p->k);
    U32(KEY("attention.key_length"), p->hd);
    U32(KEY("attention.value_length"), p->hd);
    U32(KEY("expert_feed_forward_length"), p->n_ff);
    if (p->a != QWEN3MOE) {
        U32(KEY("expert_shared_feed_forward_length"), p->n_ff_sh);
        U32(KEY("ssm.conv_kernel"), p->conv);
        U32(KEY("ssm.state_size"), p->dk);
        U32(KEY("ssm.group_count"), p->n_kh);
        U32(KEY("ssm.time_step_rank"), p->n_vh);
        U32(KEY("ssm.inner_size"), p->n_vh * p->dv);
        U32(KEY("full_attention_interval"), p->fa_interval);
        U32(KEY("rope.dimension_count"), p->rope_dim);
    }
    if (p->a == QWEN35MOE) {
        int32_t sec[4] = {11, 11, 10, 0};
        if (tdm_gguf_writer_add_arr(w, KEY("rope.dimension_sections"), TDM_GGUF_INT32, sec, 4, &e) != TDM_OK)
            die("rope.dimension_sections", &e);
    }
#undef KEY
#undef U32
#undef F32
#undef STR
}

/* Re-opens the file through the validating reader and checks every tensor's
 * type and shape against the list, the vocabulary size, and that sampled
 * rows of every tensor dequantise to finite values of the intended scale. */
static int verify(const synth *s, const char *path)
{
    tdm_gguf *g;
    tdm_error e = {0};
    if (tdm_gguf_open(path, &g, &e) != TDM_OK) {
        fprintf(stderr, "verify: %s\n", e.msg);
        return 1;
    }
    int bad = 0;
    tdm_gguf_vtype et;
    uint64_t ntok = 0;
    if (tdm_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &ntok, &e) != TDM_OK ||
        ntok != (uint64_t)s->p->vocab) {
        fprintf(stderr, "verify: %llu tokens, want %d\n", (unsigned long long)ntok, s->p->vocab);
        bad++;
    }
    if (tdm_gguf_tensor_count(g) != s->n) {
        fprintf(stderr, "verify: %lld tensors, want %d\n", (long long)tdm_gguf_tensor_count(g), s->n);
        bad++;
    }
    float *row = malloc(sizeof(float) * 262144);
    double sumsq = 0;
    int64_t nq = 0;
    for (int i = 0; i < s->n; i++) {
        const tensor *t = &s->t[i];
        const tdm_gguf_tensor *gt = tdm_gguf_find_tensor(g, t->name);
        if (!gt || gt->type != t->type || gt->ne[0] != t->ne[0] || gt->ne[1] != t->ne[1] ||
            gt->ne[2] != t->ne[2] || gt->nbytes != t->bytes) {
            fprintf(stderr, "verify: tensor %s missing or different\n", t->name);
            bad++;
            continue;
        }
        int64_t rows = (int64_t)(t->bytes / tdm_qtype_row_bytes(t->type, t->ne[0]));
        size_t rb = tdm_qtype_row_bytes(t->type, t->ne[0]);
        for (int64_t r = 0; r < rows; r += rows / 7 + 1) {
            if (tdm_dequant_row(t->type, (const uint8_t *)gt->data + r * rb, row, t->ne[0], &e) != TDM_OK) {
                fprintf(stderr, "verify: %s: %s\n", t->name, e.msg);
                bad++;
                break;
            }
            for (int64_t j = 0; j < t->ne[0]; j++) {
                if (!isfinite(row[j])) {
                    fprintf(stderr, "verify: %s row %lld: non-finite value\n", t->name, (long long)r);
                    bad++;
                    break;
                }
                if (t->type != TDM_Q_F32) {
                    sumsq += (double)row[j] * row[j];
                    nq++;
                }
            }
        }
    }
    printf("verify %s: %s (%d tensors, %llu tokens; quantised weights rms %.4f, target ~0.02)\n",
           path, bad ? "FAILED" : "ok", s->n, (unsigned long long)ntok, sqrt(sumsq / (nq ? nq : 1)));
    free(row);
    tdm_gguf_free(g);
    return bad ? 1 : 0;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: synth --preset NAME -o FILE [--layers N] [--seed S] [--route-skew S]\n"
            "             [--tokenizer GGUF] [--dry-run] [--calibrate]\n"
            "presets:");
    for (size_t i = 0; i < sizeof k_presets / sizeof k_presets[0]; i++)
        fprintf(stderr, " %s", k_presets[i].name);
    fprintf(stderr, "\n");
}

int main(int argc, char **argv)
{
    const char *preset_name = NULL, *out = NULL, *tok = NULL;
    int layers = 0;
    bool dry = false, calibrate = false, skew_set = false;
    synth s = {0};
    s.seed = 1;
    s.cached = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--preset") && v)
            preset_name = v, i++;
        else if (!strcmp(a, "-o") && v)
            out = v, i++;
        else if (!strcmp(a, "--layers") && v)
            layers = atoi(v), i++;
        else if (!strcmp(a, "--seed") && v)
            s.seed = strtoull(v, NULL, 0), i++;
        else if (!strcmp(a, "--route-skew") && v)
            s.skew = strtof(v, NULL), skew_set = true, i++;
        else if (!strcmp(a, "--tokenizer") && v)
            tok = v, i++;
        else if (!strcmp(a, "--dry-run"))
            dry = true;
        else if (!strcmp(a, "--calibrate"))
            calibrate = true;
        else {
            usage();
            return 2;
        }
    }
    for (size_t i = 0; preset_name && i < sizeof k_presets / sizeof k_presets[0]; i++)
        if (!strcmp(preset_name, k_presets[i].name))
            s.p = &k_presets[i];
    if (!s.p || (!out && !dry && !calibrate)) {
        usage();
        return 2;
    }
    s.n_layer = layers > 0 ? layers : s.p->n_layer;
    if (layers < 0 || s.n_layer > s.p->n_layer) {
        fprintf(stderr, "synth: --layers must be 1..%d\n", s.p->n_layer);
        return 2;
    }
    if (!skew_set)
        s.skew = s.p->skew;
    if (!(s.skew >= 0 && s.skew < 8)) {
        fprintf(stderr, "synth: --route-skew must be in [0, 8)\n");
        return 2;
    }
    build_list(&s);
    uint64_t total = 0;
    for (int i = 0; i < s.n; i++)
        total += s.t[i].bytes;
    printf("%s: %s, %d layers, %d tensors, %.2f GiB of tensor data\n", s.p->name, s.p->arch_name,
           s.n_layer, s.n, total / 1073741824.0);
    if (calibrate) { /* bisection for a 50% share of the hottest 20% */
        float lo = 0, hi = 3;
        for (int it = 0; it < 14; it++) {
            float mid = 0.5f * (lo + hi);
            if (simulate(&s, mid, 2000, false) < 0.5)
                lo = mid;
            else
                hi = mid;
        }
        printf("calibrated: ");
        simulate(&s, 0.5f * (lo + hi), 4000, true);
        return 0;
    }
    simulate(&s, s.skew, 2000, true);
    if (dry) {
        for (int i = 0; i < s.n; i++)
            printf("  %-36s %-5s [%lld, %lld, %lld] %llu bytes\n", s.t[i].name,
                   tdm_qtype_name(s.t[i].type), (long long)s.t[i].ne[0], (long long)s.t[i].ne[1],
                   (long long)s.t[i].ne[2], (unsigned long long)s.t[i].bytes);
        return 0;
    }
    tdm_gguf_writer *w;
    tdm_error e = {0};
    if (tdm_gguf_writer_create(&w, &e) != TDM_OK)
        die("writer", &e);
    add_kv(w, &s);
    char tokpath[1024];
    if (!tok) {
        const char *root = getenv("TDM_ROOT") ? getenv("TDM_ROOT") : ".";
        snprintf(tokpath, sizeof tokpath, "%s/tests/fixtures/%s/%s-f32.gguf", root,
                 s.p->tok_fixture, s.p->tok_fixture);
        tok = tokpath;
    }
    copy_tokenizer(w, tok, s.p->vocab);
    for (int i = 0; i < s.n; i++)
        if (tdm_gguf_writer_add_tensor_cb(w, s.t[i].name, s.t[i].type, s.t[i].n_dims, s.t[i].ne,
                                          fill, &s, &e) != TDM_OK)
            die(s.t[i].name, &e);
    int nt = omp_get_max_threads();
    s.scratch = calloc((size_t)nt, sizeof *s.scratch);
    for (int i = 0; i < nt; i++)
        s.scratch[i] = malloc((size_t)GROUP_BLOCKS * 292);
    double t0 = omp_get_wtime();
    if (tdm_gguf_writer_write_file(w, out, &e) != TDM_OK)
        die(out, &e);
    double dt = omp_get_wtime() - t0;
    printf("wrote %s: %.2f GiB in %.1f s (%.2f GB/s, %d threads)\n", out,
           tdm_gguf_writer_file_size(w) / 1073741824.0, dt, tdm_gguf_writer_file_size(w) / dt / 1e9,
           nt);
    tdm_gguf_writer_free(w);
    int rc = verify(&s, out);
    for (int i = 0; i < nt; i++)
        free(s.scratch[i]);
    free(s.scratch);
    free(s.cache);
    free(s.t);
    return rc;
}
