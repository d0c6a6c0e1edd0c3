/* experts: routed SwiGLU experts on the CPU over quantised weights (see experts.h). */
#include "experts.h"

#include <math.h>
#include <omp.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

/* A phase's items (gate/up rows, or down rows): thread v of the plan's nlist
 * owns the share tdm_experts_share(rows, v, nlist) of every used expert, cut
 * into blocks of rb rows; item w of its list is block w % nsub of its share
 * of expert used[w / nsub], so a list goes expert by expert in id order. */
typedef struct phase {
    int64_t rows, rb;
    int32_t used;
} phase;

/* The next item of thread v's gate/up and down lists: bumped by v, and by
 * the others once their own lists are done. Own cache line. */
typedef struct list_next {
    _Alignas(64) _Atomic int32_t gu, dn;
} list_next;

/* The call in progress: written by thread 0 before the team starts, then read-only. */
typedef struct job {
    const tdm_experts_desc *d;
    const float *x;
    const tdm_expert_sel *sel;
    float *out;
    tdm_team *team;
    int32_t n_tok, n_sel;
    bool accumulate, same_act;
    size_t ag, au, ad; /* quantised activation row bytes for gate, up, down */
    size_t rg, ru, rd; /* weight row bytes */
} job;

struct tdm_experts_scratch {
    int64_t max_embd, max_ff;
    int32_t max_tok, max_sel, max_expert;
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
    int32_t *used;      /* [max_expert] the experts with selections, ascending */
    int32_t *pos;       /* [max_sel] sorted slot of selection i */
    int32_t *tcnt;      /* [max_tok + 1] selections per token, then offsets */
    int32_t *tlist;     /* [max_sel] selection ids grouped by token, in list order */
    size_t bytes;
    _Atomic int32_t *left; /* [max_expert] per used expert: gate/up items not yet done; -1 once its
                            * hidden rows are quantised for down */
    job job;
    phase gu, dn;       /* gate/up rows (n_ff per expert), down rows (n_embd) */
    int nlist;          /* item lists of the call: the team's nth (1 for a tiny call) */
    list_next next[TDM_EXPERTS_MAX_TEAM];
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
    free(s->used);
    free(s->pos);
    free(s->tcnt);
    free(s->tlist);
    free(s->left);
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
    /* aligned: the phases' item counters sit on their own cache lines */
    tdm_experts_scratch *s = aligned_alloc(64, (sizeof *s + 63) / 64 * 64);
    if (!s)
        return tdm_error_set(err, TDM_ERR_OOM, "experts scratch");
    memset(s, 0, sizeof *s);
    s->max_embd = max_embd;
    s->max_ff = max_ff;
    s->max_tok = max_tok;
    s->max_sel = max_sel;
    s->max_expert = max_expert;
    s->act_cap_embd = act_cap(max_embd);
    s->act_cap_ff = act_cap(max_ff);
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
    s->used = malloc((size_t)max_expert * sizeof(int32_t));
    s->pos = malloc(ns * sizeof(int32_t));
    s->tcnt = malloc((nt + 1) * sizeof(int32_t));
    s->tlist = malloc(ns * sizeof(int32_t));
    s->left = malloc((size_t)max_expert * sizeof *s->left);
    if (!s->left || !s->xq_tok || !s->xq_tok2 || !s->xs || !s->xs2 || !s->g || !s->u || !s->hq || !s->y || !s->cnt ||
        !s->off || !s->used || !s->pos || !s->tcnt || !s->tlist) {
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

/* Counting sorts: selections by expert (pos[i] = slot) and by token (tlist).
 * Returns the number of experts used (listed in s->used). */
static int32_t sort_selections(const tdm_experts_desc *d, int32_t n_tok, const tdm_expert_sel *sel, int32_t n_sel,
                               tdm_experts_scratch *s)
{
    memset(s->cnt, 0, (size_t)d->n_expert * sizeof(int32_t));
    for (int32_t i = 0; i < n_sel; i++)
        s->cnt[sel[i].expert]++;
    int32_t used = 0;
    s->off[0] = 0;
    for (int32_t e = 0; e < d->n_expert; e++) {
        s->off[e + 1] = s->off[e] + s->cnt[e];
        if (s->cnt[e])
            s->used[used++] = e;
    }
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
    return used;
}

void tdm_experts_share(int64_t rows, int tid, int nth, int64_t *r0, int64_t *r1)
{
    *r0 = tid <= 0 ? 0 : tid >= nth ? rows : (rows * tid / nth) & ~(int64_t)3;
    *r1 = tid + 1 >= nth ? rows : (rows * (tid + 1) / nth) & ~(int64_t)3;
}

/* Blocks of about rows * used / (nlist * ITEMS_PER_THREAD) rows: a thread's
 * last block, all that can be left of its list when the others are done and
 * come to help, is short. Blocks start at multiples of 4 rows (shares do, and
 * rb is one), so every row is computed the same way for any thread count. */
#define ITEMS_PER_THREAD 8

static void plan(phase *ph, int64_t rows, int32_t used, int nlist)
{
    const int64_t parts = (int64_t)nlist * ITEMS_PER_THREAD;
    int64_t rb = (rows * used + parts - 1) / parts;
    if (rb < MIN_ROWS)
        rb = MIN_ROWS;
    ph->rows = rows;
    ph->rb = (rb + 3) & ~(int64_t)3;
    ph->used = used;
}

/* Blocks of thread v's share of one expert, and the share's first row. */
static int32_t share_blocks(const phase *ph, int v, int nlist, int64_t *a, int64_t *b)
{
    tdm_experts_share(ph->rows, v, nlist, a, b);
    return (int32_t)((*b - *a + ph->rb - 1) / ph->rb);
}

/* Item w of thread v's list: the index of its expert in s->used and rows
 * [*r0, *r1), or -1 past the list's end. */
static int32_t item(const phase *ph, int v, int nlist, int32_t w, int64_t *r0, int64_t *r1)
{
    int64_t a, b;
    const int32_t nsub = share_blocks(ph, v, nlist, &a, &b);
    if (w >= nsub * ph->used)
        return -1;
    const int32_t ei = w / nsub;
    *r0 = a + (int64_t)(w - ei * nsub) * ph->rb;
    *r1 = *r0 + ph->rb < b ? *r0 + ph->rb : b;
    return ei;
}

/* Thread tid's contiguous share [*i0, *i1) of n (what schedule(static) gives). */
static void share(int32_t n, int tid, int nth, int32_t *i0, int32_t *i1)
{
    *i0 = (int32_t)((int64_t)n * tid / nth);
    *i1 = (int32_t)((int64_t)n * (tid + 1) / nth);
}

static void sync_team(const job *j, int nth)
{
    if (nth > 1)
        j->team->barrier(j->team);
}

static inline float silu(float v)
{
    return v / (1.0f + expf(-v));
}

/* Gate/up item: rows [r0, r1) of expert used[ei] against all its tokens, then
 * SwiGLU on those rows. The thread that completes the expert's last item
 * quantises its hidden rows for down and marks the expert ready (left = -1,
 * release; the acq_rel decrements before it make every item's rows visible). */
static void gate_up_item(tdm_experts_scratch *s, const job *j, int32_t ei, int64_t r0, int64_t r1)
{
    const tdm_experts_desc *d = j->d;
    const int64_t D = d->n_embd, F = d->n_ff;
    const int32_t e = s->used[ei], o = s->off[e], c = s->cnt[e];
    tdm_matmul_rows(d->gate_type, D, (const uint8_t *)d->gate + (size_t)e * d->gate_stride, j->rg, r0, r1,
                    s->xs + (size_t)o * j->ag, j->ag, c, s->g + (size_t)o * F, (size_t)F);
    tdm_matmul_rows(d->up_type, D, (const uint8_t *)d->up + (size_t)e * d->up_stride, j->ru, r0, r1,
                    (j->same_act ? s->xs : s->xs2) + (size_t)o * j->au, j->au, c, s->u + (size_t)o * F, (size_t)F);
    for (int32_t p = o; p < o + c; p++) {
        float *g = s->g + (size_t)p * F;
        const float *u = s->u + (size_t)p * F;
        for (int64_t q = r0; q < r1; q++)
            g[q] = silu(g[q]) * u[q];
    }
    if (atomic_fetch_sub_explicit(&s->left[ei], 1, memory_order_acq_rel) != 1)
        return;
    for (int32_t p = o; p < o + c; p++)
        tdm_act_quantize(d->down_type, s->g + (size_t)p * F, s->hq + (size_t)p * j->ad, F);
    atomic_store_explicit(&s->left[ei], -1, memory_order_release);
}

/* Down item: waits until expert used[ei] is ready (its gate/up items were all
 * taken before any down item, by threads that are running them: run_phase),
 * then rows [r0, r1) of its down matrix against all its tokens. */
static void down_item(tdm_experts_scratch *s, const job *j, int32_t ei, int64_t r0, int64_t r1)
{
    const tdm_experts_desc *d = j->d;
    const int64_t D = d->n_embd, F = d->n_ff;
    for (int i = 0; atomic_load_explicit(&s->left[ei], memory_order_acquire) != -1; i++) {
        if (i < 4096)
            tdm_cpu_relax();
        else
            sched_yield(); /* more threads than cores: let the one finishing the expert run */
    }
    const int32_t e = s->used[ei], o = s->off[e], c = s->cnt[e];
    tdm_matmul_rows(d->down_type, F, (const uint8_t *)d->down + (size_t)e * d->down_stride, j->rd, r0, r1,
                    s->hq + (size_t)o * j->ad, j->ad, c, s->y + (size_t)o * D, (size_t)D);
}

/* The items of one phase on thread tid: its own list, then, list by list,
 * whatever the others have not started. A thread leaves the gate/up phase
 * only after finding every list's gate/up items taken, so by then each of
 * them is run by a running thread: a down item's wait always ends. */
static void run_phase(tdm_experts_scratch *s, const job *j, int tid, bool gu)
{
    const phase *ph = gu ? &s->gu : &s->dn;
    const int nl = s->nlist;
    for (int i = 0; i < nl; i++) {
        const int v = (tid + i) % nl;
        _Atomic int32_t *next = gu ? &s->next[v].gu : &s->next[v].dn;
        for (;;) {
            int64_t r0, r1;
            const int32_t ei = item(ph, v, nl, atomic_fetch_add_explicit(next, 1, memory_order_relaxed), &r0, &r1);
            if (ei < 0)
                break;
            if (gu)
                gate_up_item(s, j, ei, r0, r1);
            else
                down_item(s, j, ei, r0, r1);
        }
    }
}

/* Thread tid of nth: the activations (two barriers), the gate/up items, the
 * down items (each expert's down waiting only for that expert, so threads
 * done with gate/up start on down while the last gate/up blocks finish), a
 * barrier, the weighted sums. The output of each step lands in the same place
 * whoever computes it, and every token's terms are summed in list order, so
 * the bits do not depend on nth. */
static void work(void *arg, int tid, int nth)
{
    tdm_experts_scratch *s = arg;
    const job *j = &s->job;
    const tdm_experts_desc *d = j->d;
    const tdm_expert_sel *sel = j->sel;
    const int64_t D = d->n_embd;
    const size_t ag = j->ag, au = j->au;
    int32_t i0, i1;
    /* 1. quantise each token once per activation format, then place copies in expert order */
    share(j->n_tok, tid, nth, &i0, &i1);
    for (int32_t t = i0; t < i1; t++) {
        if (s->tcnt[t + 1] == s->tcnt[t])
            continue;
        tdm_act_quantize(d->gate_type, j->x + (size_t)t * D, s->xq_tok + (size_t)t * ag, D);
        if (!j->same_act)
            tdm_act_quantize(d->up_type, j->x + (size_t)t * D, s->xq_tok2 + (size_t)t * au, D);
    }
    sync_team(j, nth);
    share(j->n_sel, tid, nth, &i0, &i1);
    for (int32_t i = i0; i < i1; i++) {
        memcpy(s->xs + (size_t)s->pos[i] * ag, s->xq_tok + (size_t)sel[i].token * ag, ag);
        if (!j->same_act)
            memcpy(s->xs2 + (size_t)s->pos[i] * au, s->xq_tok2 + (size_t)sel[i].token * au, au);
    }
    sync_team(j, nth);
    /* 2. gate/up (+ SwiGLU, + quantising for down) and down items */
    run_phase(s, j, tid, true);
    run_phase(s, j, tid, false);
    sync_team(j, nth);
    /* 3. weighted sum per token, in list order */
    share(j->n_tok, tid, nth, &i0, &i1);
    for (int32_t t = i0; t < i1; t++) {
        float *o = j->out + (size_t)t * D;
        if (!j->accumulate)
            memset(o, 0, (size_t)D * sizeof(float));
        for (int32_t q = s->tcnt[t]; q < s->tcnt[t + 1]; q++) {
            const int32_t i = s->tlist[q];
            const float *y = s->y + (size_t)s->pos[i] * D;
            const float wgt = sel[i].weight;
            for (int64_t c = 0; c < D; c++)
                o[c] += wgt * y[c];
        }
    }
}

tdm_status tdm_experts_run_team(tdm_team *team, const tdm_experts_desc *d, const float *x, int32_t n_tok,
                                const tdm_expert_sel *sel, int32_t n_sel, float *out, bool accumulate,
                                tdm_experts_scratch *s, tdm_error *err)
{
    tdm_status st = check(d, n_tok, sel, n_sel, s, err);
    if (st)
        return st;
    if (team->nth < 1 || team->nth > TDM_EXPERTS_MAX_TEAM)
        return tdm_error_set(err, TDM_ERR_INVALID, "experts: a team of %d threads (1..%d)", team->nth,
                             TDM_EXPERTS_MAX_TEAM);
    const int64_t D = d->n_embd, F = d->n_ff;
    const int32_t used = sort_selections(d, n_tok, sel, n_sel, s);
    s->job = (job){
        .d = d, .x = x, .sel = sel, .out = out, .team = team, .n_tok = n_tok, .n_sel = n_sel,
        .accumulate = accumulate,
        .same_act = tdm_qtype_get(d->gate_type)->vec_dot_type == tdm_qtype_get(d->up_type)->vec_dot_type,
        .ag = tdm_act_row_bytes(d->gate_type, D), .au = tdm_act_row_bytes(d->up_type, D),
        .ad = tdm_act_row_bytes(d->down_type, F), .rg = tdm_qtype_row_bytes(d->gate_type, D),
        .ru = tdm_qtype_row_bytes(d->up_type, D), .rd = tdm_qtype_row_bytes(d->down_type, F),
    };
    /* starting a team costs microseconds (a parallel region, waking the
     * workers): tiny calls run on the calling thread alone */
    const bool tiny = (double)n_sel * (double)F * (double)D * 3.0 < 65536.0;
    const int nth = tiny ? 1 : team->nth;
    s->nlist = nth;
    plan(&s->gu, F, used, nth);
    plan(&s->dn, D, used, nth);
    int32_t gu_blocks = 0; /* gate/up items of one expert, over all lists */
    for (int v = 0; v < nth; v++) {
        int64_t a, b;
        gu_blocks += share_blocks(&s->gu, v, nth, &a, &b);
        atomic_store_explicit(&s->next[v].gu, 0, memory_order_relaxed); /* published by the team's start */
        atomic_store_explicit(&s->next[v].dn, 0, memory_order_relaxed);
    }
    for (int32_t i = 0; i < used; i++)
        atomic_store_explicit(&s->left[i], gu_blocks, memory_order_relaxed);
    if (nth == 1)
        work(s, 0, 1);
    else
        team->run(team, work, s);
    return TDM_OK;
}

/* The OpenMP team: one parallel region per call. Its size is what the region
 * really got (fewer threads than asked when nested or limited). */
static void omp_run(tdm_team *team, void (*fn)(void *arg, int tid, int nth), void *arg)
{
#pragma omp parallel num_threads(team->nth)
    fn(arg, omp_get_thread_num(), omp_get_num_threads());
}

static void omp_barrier(tdm_team *team)
{
    (void)team;
#pragma omp barrier
}

tdm_status tdm_experts_run(const tdm_experts_desc *d, const float *x, int32_t n_tok, const tdm_expert_sel *sel,
                           int32_t n_sel, float *out, bool accumulate, tdm_experts_scratch *s, tdm_error *err)
{
    const int nth = omp_get_max_threads();
    tdm_team team = {.nth = nth < TDM_EXPERTS_MAX_TEAM ? nth : TDM_EXPERTS_MAX_TEAM, .run = omp_run,
                     .barrier = omp_barrier};
    return tdm_experts_run_team(&team, d, x, n_tok, sel, n_sel, out, accumulate, s, err);
}
