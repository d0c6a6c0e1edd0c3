/* experts: routed SwiGLU experts on the CPU over quantised weights (see experts.h). */
#include "experts.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

/* One unit of parallel work: rows r0..r1-1 of expert e's matrix. */
typedef struct work_item {
    int32_t e, r0, r1;
} work_item;

struct tdm_experts_scratch {
    int64_t max_embd, max_ff;
    int32_t max_tok, max_sel, max_expert, max_items;
    size_t act_cap_embd, act_cap_ff; /* bytes of one quantised row, worst case */
    uint8_t *xq_tok;    /* [max_tok][act_cap_embd] x quantised for gate */
    uint8_t *xq_tok2;   /* [max_tok][act_cap_embd] x quantised for up when its format differs */
    uint8_t *xs;        /* [max_sel][act_cap_embd] gate activations in expert order */
    uint8_t *xs2;       /* [max_sel][act_cap_embd] up activations in expert order */
    float *g;           /* [max_sel][max_ff] gate outputs, then silu(g)*u */
    float *u;           /* [max_sel][max_ff] up outputs */
    uint8_t *hq;        /* [max_sel][act_cap_ff] quantised hidden for down */
    float *y;           /* [max_sel][max_embd] expert outputs in expert order */
    int32_t *cnt;       /* [max_expert] selections per expert */
    int32_t *off;       /* [max_expert + 1] first sorted slot of each expert */
    int32_t *pos;       /* [max_sel] sorted slot of selection i */
    int32_t *tcnt;      /* [max_tok + 1] selections per token, then offsets */
    int32_t *tlist;     /* [max_sel] selection ids grouped by token, in list order */
    work_item *items;   /* [max_items] */
    size_t bytes;
};

/* Largest activation row of n elements over every format (F32 is the widest). */
static size_t act_cap(int64_t n)
{
    return (size_t)n * sizeof(float) + 64;
}

void tdm_experts_scratch_free(tdm_experts_scratch *s)
{
    if (!s)
        return;
    free(s->xq_tok);
    free(s->xq_tok2);
    free(s->xs);
    free(s->xs2);
    free(s->g);
    free(s->u);
    free(s->hq);
    free(s->y);
    free(s->cnt);
    free(s->off);
    free(s->pos);
    free(s->tcnt);
    free(s->tlist);
    free(s->items);
    free(s);
}

size_t tdm_experts_scratch_bytes(const tdm_experts_scratch *s)
{
    return s->bytes;
}

#define MIN_ROWS 16

tdm_status tdm_experts_scratch_new(int64_t max_embd, int64_t max_ff, int32_t max_tok, int32_t max_sel,
                                   int32_t max_expert, tdm_experts_scratch **out, tdm_error *err)
{
    *out = NULL;
    if (max_embd <= 0 || max_ff <= 0 || max_tok <= 0 || max_sel <= 0 || max_expert <= 0)
        return tdm_error_set(err, TDM_ERR_INVALID, "experts scratch: sizes must be positive (embd %lld, ff %lld, "
                             "tok %d, sel %d, experts %d)", (long long)max_embd, (long long)max_ff, max_tok,
                             max_sel, max_expert);
    tdm_experts_scratch *s = calloc(1, sizeof *s);
    if (!s)
        return tdm_error_set(err, TDM_ERR_OOM, "experts scratch");
    s->max_embd = max_embd;
    s->max_ff = max_ff;
    s->max_tok = max_tok;
    s->max_sel = max_sel;
    s->max_expert = max_expert;
    s->act_cap_embd = act_cap(max_embd);
    s->act_cap_ff = act_cap(max_ff);
    int64_t rows = max_embd > max_ff ? max_embd : max_ff;
    int64_t items = (int64_t)max_expert * ((rows + MIN_ROWS - 1) / MIN_ROWS);
    if (items > (int64_t)max_sel * ((rows + MIN_ROWS - 1) / MIN_ROWS))
        items = (int64_t)max_sel * ((rows + MIN_ROWS - 1) / MIN_ROWS);
    s->max_items = (int32_t)items;
    size_t ns = (size_t)max_sel, nt = (size_t)max_tok;
    s->bytes = 2 * nt * s->act_cap_embd + 2 * ns * s->act_cap_embd + 2 * ns * (size_t)max_ff * sizeof(float) +
               ns * s->act_cap_ff + ns * (size_t)max_embd * sizeof(float);
    s->xq_tok = malloc(nt * s->act_cap_embd);
    s->xq_tok2 = malloc(nt * s->act_cap_embd);
    s->xs = malloc(ns * s->act_cap_embd);
    s->xs2 = malloc(ns * s->act_cap_embd);
    s->g = malloc(ns * (size_t)max_ff * sizeof(float));
    s->u = malloc(ns * (size_t)max_ff * sizeof(float));
    s->hq = malloc(ns * s->act_cap_ff);
    s->y = malloc(ns * (size_t)max_embd * sizeof(float));
    s->cnt = malloc((size_t)max_expert * sizeof(int32_t));
    s->off = malloc(((size_t)max_expert + 1) * sizeof(int32_t));
    s->pos = malloc(ns * sizeof(int32_t));
    s->tcnt = malloc((nt + 1) * sizeof(int32_t));
    s->tlist = malloc(ns * sizeof(int32_t));
    s->items = malloc((size_t)s->max_items * sizeof(work_item));
    if (!s->xq_tok || !s->xq_tok2 || !s->xs || !s->xs2 || !s->g || !s->u || !s->hq || !s->y || !s->cnt ||
        !s->off || !s->pos || !s->tcnt || !s->tlist || !s->items) {
        tdm_experts_scratch_free(s);
        return tdm_error_set(err, TDM_ERR_OOM, "experts scratch of %zu bytes", s->bytes);
    }
    *out = s;
    return TDM_OK;
}

static tdm_status check(const tdm_experts_desc *d, int32_t n_tok, const tdm_expert_sel *sel, int32_t n_sel,
                        const tdm_experts_scratch *s, tdm_error *err)
{
    if (n_tok < 0 || n_tok > s->max_tok || n_sel < 0 || n_sel > s->max_sel || d->n_embd <= 0 ||
        d->n_embd > s->max_embd || d->n_ff <= 0 || d->n_ff > s->max_ff || d->n_expert <= 0 ||
        d->n_expert > s->max_expert)
        return tdm_error_set(err, TDM_ERR_INVALID,
                             "experts: call (tok %d, sel %d, embd %lld, ff %lld, experts %d) exceeds the scratch "
                             "(tok %d, sel %d, embd %lld, ff %lld, experts %d)",
                             n_tok, n_sel, (long long)d->n_embd, (long long)d->n_ff, d->n_expert, s->max_tok,
                             s->max_sel, (long long)s->max_embd, (long long)s->max_ff, s->max_expert);
    if (tdm_act_row_bytes(d->gate_type, d->n_embd) > s->act_cap_embd ||
        tdm_act_row_bytes(d->up_type, d->n_embd) > s->act_cap_embd ||
        tdm_act_row_bytes(d->down_type, d->n_ff) > s->act_cap_ff)
        return tdm_error_set(err, TDM_ERR_INVALID, "experts: activation rows exceed the scratch");
    for (int32_t i = 0; i < n_sel; i++)
        if (sel[i].token < 0 || sel[i].token >= n_tok || sel[i].expert < 0 || sel[i].expert >= d->n_expert)
            return tdm_error_set(err, TDM_ERR_INVALID, "experts: selection %d (token %d, expert %d) out of range "
                                 "(%d tokens, %d experts)", i, sel[i].token, sel[i].expert, n_tok, d->n_expert);
    return TDM_OK;
}

/* Counting sorts: selections by expert (pos[i] = slot) and by token (tlist). */
static void sort_selections(const tdm_experts_desc *d, int32_t n_tok, const tdm_expert_sel *sel, int32_t n_sel,
                            tdm_experts_scratch *s)
{
    memset(s->cnt, 0, (size_t)d->n_expert * sizeof(int32_t));
    for (int32_t i = 0; i < n_sel; i++)
        s->cnt[sel[i].expert]++;
    s->off[0] = 0;
    for (int32_t e = 0; e < d->n_expert; e++)
        s->off[e + 1] = s->off[e] + s->cnt[e];
    memset(s->cnt, 0, (size_t)d->n_expert * sizeof(int32_t));
    for (int32_t i = 0; i < n_sel; i++) {
        int32_t e = sel[i].expert;
        s->pos[i] = s->off[e] + s->cnt[e]++;
    }
    memset(s->tcnt, 0, ((size_t)n_tok + 1) * sizeof(int32_t));
    for (int32_t i = 0; i < n_sel; i++)
        s->tcnt[sel[i].token + 1]++;
    for (int32_t t = 0; t < n_tok; t++)
        s->tcnt[t + 1] += s->tcnt[t];
    /* tcnt[t] is now token t's first slot; fill moves it to the next one, so
     * shift back afterwards. */
    for (int32_t i = 0; i < n_sel; i++)
        s->tlist[s->tcnt[sel[i].token]++] = i;
    for (int32_t t = n_tok; t > 0; t--)
        s->tcnt[t] = s->tcnt[t - 1];
    s->tcnt[0] = 0;
}

/* Splits every used expert's `rows` into blocks so that there are several
 * blocks per thread in total. Returns the number of items. */
static int32_t plan(const tdm_experts_desc *d, const tdm_experts_scratch *s, int64_t rows, int nthreads,
                    work_item *items)
{
    int32_t used = 0;
    for (int32_t e = 0; e < d->n_expert; e++)
        used += s->cnt[e] > 0;
    if (!used)
        return 0;
    int64_t rb = (rows * used + (int64_t)nthreads * 4 - 1) / ((int64_t)nthreads * 4);
    if (rb < MIN_ROWS)
        rb = MIN_ROWS;
    rb = (rb + 3) & ~(int64_t)3;
    int32_t n = 0;
    for (int32_t e = 0; e < d->n_expert; e++) {
        if (!s->cnt[e])
            continue;
        for (int64_t r = 0; r < rows; r += rb)
            items[n++] = (work_item){e, (int32_t)r, (int32_t)(r + rb < rows ? r + rb : rows)};
    }
    return n;
}

static inline float silu(float v)
{
    return v / (1.0f + expf(-v));
}

tdm_status tdm_experts_run(const tdm_experts_desc *d, const float *x, int32_t n_tok, const tdm_expert_sel *sel,
                           int32_t n_sel, float *out, bool accumulate, tdm_experts_scratch *s, tdm_error *err)
{
    tdm_status st = check(d, n_tok, sel, n_sel, s, err);
    if (st)
        return st;
    const int64_t D = d->n_embd, F = d->n_ff;
    const size_t ag = tdm_act_row_bytes(d->gate_type, D), au = tdm_act_row_bytes(d->up_type, D);
    const size_t ad = tdm_act_row_bytes(d->down_type, F);
    const bool same_act = tdm_qtype_get(d->gate_type)->vec_dot_type == tdm_qtype_get(d->up_type)->vec_dot_type;
    const size_t rg = tdm_qtype_row_bytes(d->gate_type, D), ru = tdm_qtype_row_bytes(d->up_type, D);
    const size_t rd = tdm_qtype_row_bytes(d->down_type, F);
    sort_selections(d, n_tok, sel, n_sel, s);
    const uint8_t *xs_up = same_act ? s->xs : s->xs2;
    /* a parallel region costs microseconds: tiny calls run on one thread */
    int nth = (double)n_sel * (double)F * (double)D * 3.0 < 65536.0 ? 1 : omp_get_max_threads();
    int32_t n_items = 0;

#pragma omp parallel num_threads(nth)
    {
        /* 1. quantise each token once per activation format, then place copies in expert order */
#pragma omp for schedule(static)
        for (int32_t t = 0; t < n_tok; t++) {
            if (s->tcnt[t + 1] == s->tcnt[t])
                continue;
            tdm_act_quantize(d->gate_type, x + (size_t)t * D, s->xq_tok + (size_t)t * ag, D);
            if (!same_act)
                tdm_act_quantize(d->up_type, x + (size_t)t * D, s->xq_tok2 + (size_t)t * au, D);
        }
#pragma omp for schedule(static)
        for (int32_t i = 0; i < n_sel; i++) {
            memcpy(s->xs + (size_t)s->pos[i] * ag, s->xq_tok + (size_t)sel[i].token * ag, ag);
            if (!same_act)
                memcpy(s->xs2 + (size_t)s->pos[i] * au, s->xq_tok2 + (size_t)sel[i].token * au, au);
        }
#pragma omp single
        n_items = plan(d, s, F, nth, s->items);
        /* 2. gate and up rows of every used expert against all its tokens */
#pragma omp for schedule(dynamic, 1)
        for (int32_t w = 0; w < n_items; w++) {
            const work_item it = s->items[w];
            int32_t o = s->off[it.e], c = s->cnt[it.e];
            tdm_matmul_rows(d->gate_type, D, (const uint8_t *)d->gate + (size_t)it.e * d->gate_stride, rg, it.r0,
                            it.r1, s->xs + (size_t)o * ag, ag, c, s->g + (size_t)o * F, (size_t)F);
            tdm_matmul_rows(d->up_type, D, (const uint8_t *)d->up + (size_t)it.e * d->up_stride, ru, it.r0, it.r1,
                            xs_up + (size_t)o * au, au, c, s->u + (size_t)o * F, (size_t)F);
        }
        /* 3. SwiGLU, quantised for down */
#pragma omp for schedule(static)
        for (int32_t p = 0; p < n_sel; p++) {
            float *g = s->g + (size_t)p * F;
            const float *u = s->u + (size_t)p * F;
            for (int64_t j = 0; j < F; j++)
                g[j] = silu(g[j]) * u[j];
            tdm_act_quantize(d->down_type, g, s->hq + (size_t)p * ad, F);
        }
#pragma omp single
        n_items = plan(d, s, D, nth, s->items);
        /* 4. down rows */
#pragma omp for schedule(dynamic, 1)
        for (int32_t w = 0; w < n_items; w++) {
            const work_item it = s->items[w];
            int32_t o = s->off[it.e], c = s->cnt[it.e];
            tdm_matmul_rows(d->down_type, F, (const uint8_t *)d->down + (size_t)it.e * d->down_stride, rd, it.r0,
                            it.r1, s->hq + (size_t)o * ad, ad, c, s->y + (size_t)o * D, (size_t)D);
        }
        /* 5. weighted sum per token, in list order */
#pragma omp for schedule(static)
        for (int32_t t = 0; t < n_tok; t++) {
            float *o = out + (size_t)t * D;
            if (!accumulate)
                memset(o, 0, (size_t)D * sizeof(float));
            for (int32_t q = s->tcnt[t]; q < s->tcnt[t + 1]; q++) {
                int32_t i = s->tlist[q];
                const float *y = s->y + (size_t)s->pos[i] * D;
                const float wgt = sel[i].weight;
                for (int64_t j = 0; j < D; j++)
                    o[j] += wgt * y[j];
            }
        }
    }
    return TDM_OK;
}
