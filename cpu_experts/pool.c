/* pool: driver thread, mailbox protocol, miss computation. */
#include "pool.h"

#include <linux/futex.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

struct tdm_pool {
    const tdm_model *m;
    const tdm_hparams *hp;
    const tdm_topology *topo;
    int n_threads, spin;
    bool pinned;             /* valid once ready */
    _Atomic int ready;       /* the driver has set up (and pinned) its team */
    int32_t max_tok;
    _Atomic(const int32_t *) residency; /* [n_layer * n_expert] or NULL */
    tdm_mailbox *mb;
    tdm_expert_sel *sel;     /* [max_tok * k] the job's misses */
    uint8_t *seen;           /* [n_expert] distinct-expert marks for the byte count */
    tdm_experts_scratch *ex;
    pthread_t thread;
    bool started;
    tdm_pool_stats st;       /* written by the driver only */
    _Atomic int failed;      /* tdm_status of the first failed job (sticky) */
    char fail_msg[TDM_ERROR_MSG_MAX];
    void *(*mem_alloc)(void *ctx, size_t bytes);
    void (*mem_free)(void *ctx, void *ptr);
    void *mem_ctx;
};

static void *heap_alloc(void *ctx, size_t bytes)
{
    (void)ctx;
    return aligned_alloc(64, (bytes + 63) / 64 * 64);
}

static void heap_free(void *ctx, void *ptr)
{
    (void)ctx;
    free(ptr);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void futex_wait(_Atomic uint32_t *addr, uint32_t val, long ns)
{
    struct timespec ts = {0, ns};
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, &ts, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *addr) { syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0); }

/* Returns the new dev_seq (!= last), spinning, yielding, then sleeping. */
static uint32_t wait_job(tdm_pool *p, uint32_t last)
{
    tdm_mailbox *mb = p->mb;
    uint32_t s;
    for (int i = 0; i < p->spin; i++) {
        if ((s = atomic_load_explicit(&mb->dev_seq, memory_order_acquire)) != last)
            return s;
        cpu_relax();
    }
    for (int i = 0; i < 64; i++) {
        if ((s = atomic_load_explicit(&mb->dev_seq, memory_order_acquire)) != last)
            return s;
        sched_yield();
    }
    for (;;) {
        /* seq_cst pairs with the publisher's store-then-load of pool_sleeping:
         * either it sees the flag and wakes us, or we see its seq here. */
        atomic_store(&mb->pool_sleeping, 1);
        if ((s = atomic_load(&mb->dev_seq)) != last) {
            atomic_store(&mb->pool_sleeping, 0);
            atomic_thread_fence(memory_order_acquire);
            return s;
        }
        futex_wait(&mb->dev_seq, last, 1000000L);
        atomic_store(&mb->pool_sleeping, 0);
    }
}

static tdm_experts_desc layer_desc(const tdm_layer *L)
{
    return (tdm_experts_desc){
        .gate = L->gate_exps.data, .up = L->up_exps.data, .down = L->down_exps.data,
        .gate_type = L->gate_exps.type, .up_type = L->up_exps.type, .down_type = L->down_exps.type,
        .gate_stride = L->gate_exps.mat_bytes, .up_stride = L->up_exps.mat_bytes,
        .down_stride = L->down_exps.mat_bytes, .n_embd = L->gate_exps.cols, .n_ff = L->gate_exps.rows,
        .n_expert = (int32_t)L->gate_exps.n_mat,
    };
}

static tdm_status run_job(tdm_pool *p, tdm_error *err)
{
    tdm_mailbox *mb = p->mb;
    const int32_t E = p->hp->n_expert, k = mb->k, n = mb->n_tok, il = mb->layer;
    if (il < 0 || il >= p->hp->n_layer || n < 1 || n > p->max_tok || k != p->hp->n_expert_used)
        return tdm_error_set(err, TDM_ERR_INVALID, "pool: bad job (layer %d, %d tokens, k %d)", il, n, k);
    const tdm_layer *L = tdm_model_layer(p->m, il);
    if (L->ffn != TDM_FFN_MOE || !L->gate_exps.data)
        return tdm_error_set(err, TDM_ERR_INVALID, "pool: layer %d has no routed experts", il);
    const int32_t *res = atomic_load_explicit(&p->residency, memory_order_acquire);
    int32_t nm = 0;
    uint64_t bytes = 0;
    const uint64_t eb = L->gate_exps.mat_bytes + L->up_exps.mat_bytes + L->down_exps.mat_bytes;
    for (int32_t t = 0; t < n; t++)
        for (int32_t i = 0; i < k; i++) {
            const int32_t e = mb->ids[(size_t)t * k + i];
            if (e < 0 || e >= E)
                return tdm_error_set(err, TDM_ERR_INVALID, "pool: layer %d token %d: expert %d out of range",
                                     il, t, e);
            if (res && res[(size_t)il * E + e] >= 0)
                continue;
            p->sel[nm++] = (tdm_expert_sel){t, e, mb->weights[(size_t)t * k + i]};
            if (!p->seen[e]) {
                p->seen[e] = 1;
                bytes += eb;
            }
        }
    for (int32_t i = 0; i < nm; i++)
        p->seen[p->sel[i].expert] = 0;
    tdm_experts_desc d = layer_desc(L);
    tdm_status st = tdm_experts_run(&d, mb->x, n, p->sel, nm, mb->out, false, p->ex, err);
    mb->n_miss = nm;
    p->st.misses += nm;
    p->st.bytes += bytes;
    return st;
}

static void *driver(void *arg)
{
    tdm_pool *p = arg;
    tdm_mailbox *mb = p->mb;
    omp_set_num_threads(p->n_threads);
    omp_set_dynamic(0);
    p->pinned = p->topo && tdm_topology_bind_omp_team(p->topo, p->n_threads, NULL) == TDM_OK;
    atomic_store_explicit(&p->ready, 1, memory_order_release);
    uint32_t last = 0;
    for (;;) {
        const uint32_t s = wait_job(p, last);
        last = s;
        if (atomic_load_explicit(&mb->stop, memory_order_acquire))
            break;
        const double t0 = now_ms();
        tdm_error e = {0};
        mb->status = run_job(p, &e);
        snprintf(mb->msg, sizeof mb->msg, "%s", mb->status ? e.msg : "");
        if (mb->status && !atomic_load_explicit(&p->failed, memory_order_relaxed)) {
            snprintf(p->fail_msg, sizeof p->fail_msg, "%s", e.msg);
            atomic_store_explicit(&p->failed, (int)mb->status, memory_order_release);
        }
        p->st.jobs++;
        p->st.ms += now_ms() - t0;
        atomic_store_explicit(&mb->pool_seq, s, memory_order_release);
    }
    return NULL;
}

tdm_status tdm_pool_new(const tdm_pool_params *pp, tdm_pool **out, tdm_error *err)
{
    *out = NULL;
    if (!pp->model || pp->max_tok < 1 || pp->n_threads < 0)
        return tdm_error_set(err, TDM_ERR_INVALID, "pool: need a model, max_tok >= 1 (%d), n_threads >= 0 (%d)",
                             pp->max_tok, pp->n_threads);
    const tdm_hparams *hp = tdm_model_hparams(pp->model);
    if (hp->n_expert < 1 || hp->n_expert_used < 1)
        return tdm_error_set(err, TDM_ERR_INVALID, "pool: the model has no routed experts");
    tdm_pool *p = calloc(1, sizeof *p);
    if (!p)
        return tdm_error_set(err, TDM_ERR_OOM, "pool: out of memory");
    p->m = pp->model;
    p->hp = hp;
    p->topo = pp->topo;
    p->n_threads = pp->n_threads ? pp->n_threads : pp->topo ? tdm_topology_default_threads(pp->topo) : 1;
    p->spin = pp->spin > 0 ? pp->spin : 20000;
    p->max_tok = pp->max_tok;
    p->mem_alloc = pp->mem_alloc ? pp->mem_alloc : heap_alloc;
    p->mem_free = pp->mem_alloc ? pp->mem_free : heap_free;
    p->mem_ctx = pp->mem_ctx;
    const size_t nt = (size_t)pp->max_tok, k = (size_t)hp->n_expert_used, d = (size_t)hp->n_embd;
    int64_t max_ff = 1;
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const tdm_layer *L = tdm_model_layer(pp->model, il);
        if (L->ffn == TDM_FFN_MOE && L->gate_exps.data && L->gate_exps.rows > max_ff)
            max_ff = L->gate_exps.rows;
    }
    p->mb = p->mem_alloc(p->mem_ctx, sizeof(tdm_mailbox));
    p->sel = malloc(nt * k * sizeof *p->sel);
    p->seen = calloc((size_t)hp->n_expert, 1);
    tdm_status st = TDM_OK;
    if (p->mb) {
        memset(p->mb, 0, sizeof *p->mb);
        p->mb->ids = p->mem_alloc(p->mem_ctx, nt * k * sizeof(int32_t));
        p->mb->weights = p->mem_alloc(p->mem_ctx, nt * k * sizeof(float));
        p->mb->x = p->mem_alloc(p->mem_ctx, nt * d * sizeof(float));
        p->mb->out = p->mem_alloc(p->mem_ctx, nt * d * sizeof(float));
        p->mb->k = (int32_t)k;
    }
    if (!p->mb || !p->sel || !p->seen || !p->mb->ids || !p->mb->weights || !p->mb->x || !p->mb->out)
        st = tdm_error_set(err, TDM_ERR_OOM, "pool: out of memory for a %d-token mailbox", pp->max_tok);
    if (!st)
        st = tdm_experts_scratch_new(hp->n_embd, max_ff, pp->max_tok, pp->max_tok * (int32_t)k, hp->n_expert, &p->ex,
                                     err);
    if (!st && pthread_create(&p->thread, NULL, driver, p) != 0)
        st = tdm_error_set(err, TDM_ERR_OOM, "pool: cannot start the driver thread");
    if (st) {
        tdm_pool_free(p);
        return st;
    }
    p->started = true;
    while (!atomic_load_explicit(&p->ready, memory_order_acquire))
        sched_yield(); /* so pinned is settled and the team exists before the first job */
    *out = p;
    return TDM_OK;
}

void tdm_pool_free(tdm_pool *p)
{
    if (!p)
        return;
    if (p->started) {
        atomic_store(&p->mb->stop, 1);
        atomic_fetch_add(&p->mb->dev_seq, 1);
        futex_wake(&p->mb->dev_seq);
        pthread_join(p->thread, NULL);
    }
    if (p->mb) {
        void *bufs[] = {p->mb->ids, p->mb->weights, p->mb->x, p->mb->out, p->mb};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
            if (bufs[i])
                p->mem_free(p->mem_ctx, bufs[i]);
    }
    free(p->sel);
    free(p->seen);
    tdm_experts_scratch_free(p->ex);
    free(p);
}

int tdm_pool_threads(const tdm_pool *p) { return p->n_threads; }
bool tdm_pool_pinned(const tdm_pool *p) { return p->pinned; }
tdm_mailbox *tdm_pool_mailbox(tdm_pool *p) { return p->mb; }

void tdm_pool_set_residency(tdm_pool *p, const int32_t *residency)
{
    atomic_store_explicit(&p->residency, residency, memory_order_release);
}

uint32_t tdm_pool_publish(tdm_pool *p)
{
    tdm_mailbox *mb = p->mb;
    /* seq_cst store then load: see wait_job */
    const uint32_t s = atomic_load_explicit(&mb->dev_seq, memory_order_relaxed) + 1;
    atomic_store(&mb->dev_seq, s);
    if (atomic_load(&mb->pool_sleeping))
        futex_wake(&mb->dev_seq);
    return s;
}

tdm_status tdm_pool_wait(tdm_pool *p, uint32_t seq, double *wait_ms, tdm_error *err)
{
    tdm_mailbox *mb = p->mb;
    const double t0 = wait_ms ? now_ms() : 0;
    for (int i = 0; atomic_load_explicit(&mb->pool_seq, memory_order_acquire) != seq; i++) {
        if (i < p->spin)
            cpu_relax();
        else
            sched_yield();
    }
    if (wait_ms)
        *wait_ms += now_ms() - t0;
    if (mb->status)
        return tdm_error_set(err, mb->status, "%s", mb->msg);
    return TDM_OK;
}

void tdm_pool_get_stats(const tdm_pool *p, tdm_pool_stats *out) { *out = p->st; }

tdm_status tdm_pool_check(const tdm_pool *p, tdm_error *err)
{
    const int f = atomic_load_explicit(&((tdm_pool *)p)->failed, memory_order_acquire);
    return f ? tdm_error_set(err, (tdm_status)f, "CPU expert pool: %s", p->fail_msg) : TDM_OK;
}

void tdm_pool_kick(tdm_pool *p)
{
    if (atomic_load(&p->mb->pool_sleeping))
        futex_wake(&p->mb->dev_seq);
}
