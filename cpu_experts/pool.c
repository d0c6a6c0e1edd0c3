/* pool: driver thread, mailbox protocol, persistent team, miss computation. */
#include "pool.h"

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

typedef struct worker {
    tdm_pool *p;
    int tid;
    pthread_t thread;
} worker;

/* The team is n_threads threads: the driver (thread 0) and n_threads - 1
 * workers, each pinned to core tid. It replaces an OpenMP fork/join per job,
 * whose ~7 barriers per job sleep in the kernel under libgomp's default
 * passive wait policy (the pool lost 22-36% of its bandwidth to them, and the
 * policy is read from the environment before main; docs/EXECUTOR.md). The
 * workers wait on gen with the mailbox's spin/yield/futex policy and meet at
 * a spinning barrier. */
struct tdm_pool {
    tdm_team team;           /* first: the team callbacks cast it back to the pool */
    _Alignas(64) _Atomic uint32_t gen;      /* job generation: the driver bumps it to start the workers */
    _Atomic uint32_t sleepers;              /* workers asleep on gen's futex */
    _Atomic uint32_t quit;                  /* set (then gen bumped) by tdm_pool_free */
    void (*fn)(void *arg, int tid, int nth); /* the job's worker, written before gen */
    void *arg;
    _Alignas(64) _Atomic uint64_t awake_until; /* CLOCK_MONOTONIC ns: the team spins until then (tdm_pool_kick) */
    const _Atomic uint64_t *kick_window;       /* &awake_until, NULL when the team outnumbers the CPUs */
    _Alignas(64) _Atomic uint32_t bar_count; /* threads inside the barrier */
    _Alignas(64) _Atomic uint32_t bar_gen;  /* barrier generation: bumped by the last one in */
    _Alignas(64) const tdm_model *m;
    const tdm_hparams *hp;
    const tdm_topology *topo;
    int n_threads, spin;
    int spin_busy;           /* spin rounds of the workers, the barrier and tdm_pool_wait before
                              * yielding: spin, or 64 when the team and the publisher outnumber the
                              * CPUs (a spinner then holds the CPU that the thread it waits for needs) */
    bool pinned;             /* valid once ready == n_threads */
    _Atomic int ready;       /* threads started (and pinned or not) */
    _Atomic int unpinned;    /* threads whose binding failed */
    int32_t max_tok;
    _Atomic(const int32_t *) residency; /* [n_layer * n_expert] or NULL */
    const tdm_copy_piece *copy; /* the copy job in flight (tdm_pool_copy), NULL: an expert job */
    int n_copy;
    _Alignas(64) _Atomic int64_t copy_next; /* next block of the copy job */
    tdm_mailbox *mb;
    /* the warm-up in flight: its matrices (written by the driver before the
     * team starts), the job number it runs under (a new one cuts it) */
    struct warm_mat {
        const uint8_t *p;
        size_t row_bytes;
        int64_t rows;
    } warm[3 * TDM_MAILBOX_HINT_MAX];
    int n_warm;
    uint32_t warm_job;
    _Alignas(64) _Atomic uint64_t warm_read; /* bytes the team read */
    _Atomic int warm_cut;
    tdm_expert_sel *sel;     /* [max_tok * k] the job's misses */
    uint8_t *seen;           /* [n_expert] distinct-expert marks for the byte count */
    tdm_experts_scratch *ex;
    pthread_t thread;
    bool started;
    worker *workers;         /* [n_threads - 1] thread tid = index + 1 */
    int n_workers;           /* started */
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

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static double now_ms(void) { return (double)now_ns() * 1e-6; }

static long futex_wait(_Atomic uint32_t *addr, uint32_t val, long ns)
{
    struct timespec ts = {0, ns};
    return syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, &ts, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *addr, int n)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

/* Whether the kick window *awake_until (NULL: none) is open now. */
static bool window_open(const _Atomic uint64_t *awake_until)
{
    return awake_until && now_ns() < atomic_load_explicit(awake_until, memory_order_relaxed);
}

/* Whether a waiter past i rounds spins on: its first spin rounds, then while
 * the kick window is open, the clock read every 1024 rounds. */
static bool keep_spinning(int i, int spin, const _Atomic uint64_t *awake_until)
{
    if (i < spin)
        return true;
    return awake_until && ((i & 1023) || window_open(awake_until));
}

/* Returns *seq once it differs from last: spins (pause) as keep_spinning
 * says, then yields 64 times, then sleeps on the futex of *seq, counted in *sleeping,
 * with a 1 ms timeout (a publisher that cannot wake it, a GPU kernel, is
 * still served within a millisecond). A wake (a host publish, the driver
 * starting a job, tdm_pool_kick) restarts the spinning, as work is expected
 * again; a timeout does not, unless the kick window is open (a kick whose
 * wake fell between two timed waits is not lost). While spinning or
 * yielding it also returns last when *aux (if not NULL) differs from
 * aux_last. Used by the driver on dev_seq (spin; aux: the hints) and the
 * workers on gen (spin_busy). */
static uint32_t wait_change(int spin, const _Atomic uint64_t *awake_until, _Atomic uint32_t *seq, uint32_t last,
                            _Atomic uint32_t *sleeping, _Atomic uint32_t *aux, uint32_t aux_last)
{
    uint32_t s;
    for (;;) {
        for (int i = 0; keep_spinning(i, spin, awake_until); i++) {
            if ((s = atomic_load_explicit(seq, memory_order_acquire)) != last)
                return s;
            if (aux && atomic_load_explicit(aux, memory_order_relaxed) != aux_last)
                return last;
            tdm_cpu_relax();
        }
        for (int i = 0; i < 64; i++) {
            if ((s = atomic_load_explicit(seq, memory_order_acquire)) != last)
                return s;
            if (aux && atomic_load_explicit(aux, memory_order_relaxed) != aux_last)
                return last;
            sched_yield();
        }
        /* seq_cst, pairing with the waker's store of *seq then load of
         * *sleeping (Dekker): either it sees us counted and wakes us, or we
         * see its store here. */
        atomic_fetch_add(sleeping, 1);
        bool woken = false;
        while ((s = atomic_load(seq)) == last && !woken)
            woken = futex_wait(seq, last, 1000000L) == 0 || window_open(awake_until);
        atomic_fetch_sub(sleeping, 1);
        if (s != last)
            return s;
    }
}

/* Sense-reversing barrier over the team (the sense is bar_gen, read before
 * arriving). Waits inside a job are short, so it spins; past spin_busy rounds it
 * yields so that threads sharing a core (more threads than cores) still get
 * to arrive. The acq_rel arrivals and the release/acquire of bar_gen make it
 * a full exchange of the threads' writes. */
static void team_barrier(tdm_team *team)
{
    tdm_pool *p = (tdm_pool *)team;
    const uint32_t g = atomic_load_explicit(&p->bar_gen, memory_order_acquire);
    if (atomic_fetch_add_explicit(&p->bar_count, 1, memory_order_acq_rel) + 1 == (uint32_t)team->nth) {
        atomic_store_explicit(&p->bar_count, 0, memory_order_relaxed);
        atomic_store_explicit(&p->bar_gen, g + 1, memory_order_release);
        return;
    }
    for (int i = 0; atomic_load_explicit(&p->bar_gen, memory_order_acquire) == g; i++) {
        if (i < p->spin_busy)
            tdm_cpu_relax();
        else
            sched_yield();
    }
}

/* On the driver: starts fn on the workers, runs its own share as thread 0,
 * and returns once every thread is through the closing barrier. */
static void team_run(tdm_team *team, void (*fn)(void *arg, int tid, int nth), void *arg)
{
    tdm_pool *p = (tdm_pool *)team;
    p->fn = fn;
    p->arg = arg;
    atomic_fetch_add(&p->gen, 1); /* seq_cst: see wait_change */
    if (atomic_load(&p->sleepers))
        futex_wake(&p->gen, INT_MAX);
    fn(arg, 0, team->nth);
    team_barrier(team);
}

/* Pins the calling thread to core tid, as the OpenMP team binding did, and
 * reports in. */
static void start_thread(tdm_pool *p, int tid)
{
    if (p->topo && tdm_topology_bind_thread(p->topo, tid, NULL) != TDM_OK)
        atomic_fetch_add(&p->unpinned, 1);
    atomic_fetch_add_explicit(&p->ready, 1, memory_order_release);
}

static void *worker_main(void *arg)
{
    const worker *w = arg;
    tdm_pool *p = w->p;
    start_thread(p, w->tid);
    uint32_t last = 0;
    for (;;) {
        last = wait_change(p->spin_busy, p->kick_window, &p->gen, last, &p->sleepers, NULL, 0);
        if (atomic_load_explicit(&p->quit, memory_order_acquire))
            return NULL;
        p->fn(p->arg, w->tid, p->team.nth);
        team_barrier(&p->team);
    }
}

tdm_experts_desc tdm_pool_layer_desc(const tdm_layer *L)
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
    int32_t nm = 0, skip = mb->direct > 0 ? mb->direct : 0;
    uint64_t bytes = 0;
    const uint64_t eb = L->gate_exps.mat_bytes + L->up_exps.mat_bytes + L->down_exps.mat_bytes;
    for (int32_t t = 0; t < n; t++)
        for (int32_t i = 0; i < k; i++) {
            const int32_t id = mb->ids[(size_t)t * k + i], e = id & ~TDM_MAILBOX_HELD;
            if (e < 0 || e >= E)
                return tdm_error_set(err, TDM_ERR_INVALID, "pool: layer %d token %d: expert %d out of range",
                                     il, t, e);
            if (id != e || (res && res[(size_t)il * E + e] >= 0) || skip-- > 0)
                continue;
            p->sel[nm++] = (tdm_expert_sel){t, e, mb->weights[(size_t)t * k + i]};
            if (!p->seen[e]) {
                p->seen[e] = 1;
                bytes += eb;
            }
        }
    for (int32_t i = 0; i < nm; i++)
        p->seen[p->sel[i].expert] = 0;
    tdm_experts_desc d = tdm_pool_layer_desc(L);
    tdm_status st = tdm_experts_run_team(&p->team, &d, mb->x, n, p->sel, nm, mb->out, false, p->ex, err);
    mb->n_miss = nm;
    p->st.misses += nm;
    p->st.bytes += bytes;
    return st;
}

#define COPY_BLOCK ((size_t)256 << 10)

/* memcpy with non-temporal stores where the destination is 16-byte aligned
 * (SSE2, every x86-64): the copy's reader is the GPU's DMA engine, not this
 * core, so the destination lines need neither be read for ownership nor kept
 * in the cache. The fence orders the stores before the team's barrier. */
static void copy_nt(uint8_t *dst, const uint8_t *src, size_t n)
{
#if defined(__SSE2__)
    size_t head = (16 - ((uintptr_t)dst & 15)) & 15;
    head = head < n ? head : n;
    memcpy(dst, src, head);
    dst += head, src += head, n -= head;
    for (; n >= 64; n -= 64, dst += 64, src += 64) {
        const __m128i a = _mm_loadu_si128((const __m128i *)src), b = _mm_loadu_si128((const __m128i *)(src + 16)),
                      c = _mm_loadu_si128((const __m128i *)(src + 32)), d = _mm_loadu_si128((const __m128i *)(src + 48));
        _mm_stream_si128((__m128i *)dst, a);
        _mm_stream_si128((__m128i *)(dst + 16), b);
        _mm_stream_si128((__m128i *)(dst + 32), c);
        _mm_stream_si128((__m128i *)(dst + 48), d);
    }
    memcpy(dst, src, n);
    _mm_sfence();
#else
    memcpy(dst, src, n);
#endif
}

/* Team worker of a copy job: block w of the pieces, in order. */
static void copy_work(void *arg, int tid, int nth)
{
    (void)tid, (void)nth;
    tdm_pool *p = arg;
    for (;;) {
        int64_t w = atomic_fetch_add_explicit(&p->copy_next, 1, memory_order_relaxed);
        int i = 0;
        for (; i < p->n_copy; i++) {
            const int64_t nb = (int64_t)((p->copy[i].bytes + COPY_BLOCK - 1) / COPY_BLOCK);
            if (w < nb)
                break;
            w -= nb;
        }
        if (i == p->n_copy)
            return;
        const size_t o = (size_t)w * COPY_BLOCK, left = p->copy[i].bytes - o;
        copy_nt((uint8_t *)p->copy[i].dst + o, (const uint8_t *)p->copy[i].src + o,
                left < COPY_BLOCK ? left : COPY_BLOCK);
    }
}

#define WARM_BLOCK ((size_t)32 << 10)

/* Reads thread tid's share of matrix m (tdm_experts_share: the rows it will
 * compute first in the job), one load per cache line, checking for a
 * published job every WARM_BLOCK bytes. Adds the bytes read to *read;
 * false once a job cut it short. */
static bool warm_share(tdm_pool *p, const struct warm_mat *m, int tid, int nth, size_t *read)
{
    int64_t r0, r1;
    tdm_experts_share(m->rows, tid, nth, &r0, &r1);
    const uint8_t *q = m->p + (size_t)r0 * m->row_bytes, *end = m->p + (size_t)r1 * m->row_bytes;
    while (q < end) {
        if (atomic_load_explicit(&p->mb->dev_seq, memory_order_relaxed) != p->warm_job)
            return false;
        const uint8_t *stop = (size_t)(end - q) > WARM_BLOCK ? q + WARM_BLOCK : end;
        *read += (size_t)(stop - q);
        for (; q < stop; q += 64)
            (void)*(const volatile uint8_t *)q;
    }
    return true;
}

/* Team worker of a warm-up: thread tid's shares, matrix by matrix in the
 * hint's order, so a cut leaves the first experts warm. */
static void warm_work(void *arg, int tid, int nth)
{
    tdm_pool *p = arg;
    size_t read = 0;
    for (int i = 0; i < p->n_warm; i++)
        if (!warm_share(p, &p->warm[i], tid, nth, &read)) {
            atomic_store_explicit(&p->warm_cut, 1, memory_order_relaxed);
            break;
        }
    atomic_fetch_add_explicit(&p->warm_read, read, memory_order_relaxed);
}

/* The driver saw a new hint while job `job` was the last: copies it (the
 * device may be writing the next one: re-read until hint_seq holds still),
 * notes its seq in *hint_last, and has the team read the hinted experts that
 * have no slot. */
static void warm(tdm_pool *p, uint32_t job, uint32_t *hint_last)
{
    tdm_mailbox *mb = p->mb;
    int32_t il, n, ids[TDM_MAILBOX_HINT_MAX];
    uint32_t h;
    do {
        h = atomic_load_explicit(&mb->hint_seq, memory_order_acquire);
        il = atomic_load_explicit(&mb->hint_layer, memory_order_relaxed);
        n = atomic_load_explicit(&mb->hint_n, memory_order_relaxed);
        n = n < 0 ? 0 : n > TDM_MAILBOX_HINT_MAX ? TDM_MAILBOX_HINT_MAX : n;
        for (int32_t i = 0; i < n; i++)
            ids[i] = atomic_load_explicit(&mb->hint_ids[i], memory_order_relaxed);
        atomic_thread_fence(memory_order_acquire);
    } while (atomic_load_explicit(&mb->hint_seq, memory_order_relaxed) != h);
    *hint_last = h;
    if (il < 0 || il >= p->hp->n_layer)
        return;
    const tdm_layer *L = tdm_model_layer(p->m, il);
    if (L->ffn != TDM_FFN_MOE || !L->gate_exps.data)
        return;
    const int32_t E = p->hp->n_expert, *res = atomic_load_explicit(&p->residency, memory_order_acquire);
    const tdm_weight *w[3] = {&L->gate_exps, &L->up_exps, &L->down_exps};
    p->n_warm = 0;
    for (int32_t i = 0; i < n; i++) {
        const int32_t e = ids[i];
        if (e < 0 || e >= E || p->seen[e] || (res && res[(size_t)il * E + e] >= 0))
            continue;
        p->seen[e] = 1;
        for (int j = 0; j < 3; j++)
            p->warm[p->n_warm++] = (struct warm_mat){(const uint8_t *)w[j]->data + (size_t)e * w[j]->mat_bytes,
                                                     w[j]->row_bytes, w[j]->rows};
    }
    for (int32_t i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < E)
            p->seen[ids[i]] = 0;
    if (!p->n_warm)
        return;
    p->warm_job = job;
    atomic_store_explicit(&p->warm_read, 0, memory_order_relaxed);
    atomic_store_explicit(&p->warm_cut, 0, memory_order_relaxed); /* published by the team's start */
    p->team.run(&p->team, warm_work, p);
    p->st.warms++;
    p->st.warm_cut += atomic_load_explicit(&p->warm_cut, memory_order_relaxed);
    p->st.warm_bytes += atomic_load_explicit(&p->warm_read, memory_order_relaxed);
}

static void *driver(void *arg)
{
    tdm_pool *p = arg;
    tdm_mailbox *mb = p->mb;
    start_thread(p, 0);
    uint32_t last = 0, hint_last = 0;
    for (;;) {
        const uint32_t s =
            wait_change(p->spin, p->kick_window, &mb->dev_seq, last, &mb->pool_sleeping, &mb->hint_seq, hint_last);
        if (s == last) { /* a hint, no job */
            warm(p, last, &hint_last);
            continue;
        }
        last = s;
        if (atomic_load_explicit(&mb->stop, memory_order_acquire))
            break;
        const double t0 = now_ms();
        if (p->copy) {
            atomic_store_explicit(&p->copy_next, 0, memory_order_relaxed); /* published by the team's start */
            p->team.run(&p->team, copy_work, p);
            for (int i = 0; i < p->n_copy; i++)
                p->st.copy_bytes += p->copy[i].bytes;
            p->st.copies++;
            p->st.copy_ms += now_ms() - t0;
            p->copy = NULL;
            mb->status = TDM_OK;
            atomic_store_explicit(&mb->pool_seq, s, memory_order_release);
            continue;
        }
        tdm_error e = {0};
        mb->status = run_job(p, &e);
        snprintf(mb->msg, sizeof mb->msg, "%s", mb->status ? e.msg : "");
        if (mb->status && !atomic_load_explicit(&p->failed, memory_order_relaxed)) {
            snprintf(p->fail_msg, sizeof p->fail_msg, "%s", e.msg);
            atomic_store_explicit(&p->failed, (int)mb->status, memory_order_release);
        }
        p->st.jobs++;
        p->st.ms += now_ms() - t0;
        /* a hint for the layer just computed came too late: drop it */
        const uint32_t h = atomic_load_explicit(&mb->hint_seq, memory_order_relaxed);
        if (h != hint_last && atomic_load_explicit(&mb->hint_layer, memory_order_relaxed) == mb->layer)
            hint_last = h;
        atomic_store_explicit(&mb->pool_seq, s, memory_order_release);
    }
    return NULL;
}

tdm_status tdm_pool_new(const tdm_pool_params *pp, tdm_pool **out, tdm_error *err)
{
    *out = NULL;
    if (!pp->model || pp->max_tok < 1 || pp->n_threads < 0 || pp->n_threads > TDM_EXPERTS_MAX_TEAM)
        return tdm_error_set(err, TDM_ERR_INVALID, "pool: need a model, max_tok >= 1 (%d), n_threads in 0..%d (%d)",
                             pp->max_tok, TDM_EXPERTS_MAX_TEAM, pp->n_threads);
    const tdm_hparams *hp = tdm_model_hparams(pp->model);
    if (hp->n_expert < 1 || hp->n_expert_used < 1)
        return tdm_error_set(err, TDM_ERR_INVALID, "pool: the model has no routed experts");
    /* aligned: the team's flags sit on their own cache lines */
    tdm_pool *p = aligned_alloc(64, (sizeof *p + 63) / 64 * 64);
    if (!p)
        return tdm_error_set(err, TDM_ERR_OOM, "pool: out of memory");
    memset(p, 0, sizeof *p);
    p->m = pp->model;
    p->hp = hp;
    p->topo = pp->topo;
    p->n_threads = pp->n_threads ? pp->n_threads : pp->topo ? tdm_topology_default_threads(pp->topo) : 1;
    if (p->n_threads > TDM_EXPERTS_MAX_TEAM)
        p->n_threads = TDM_EXPERTS_MAX_TEAM;
    p->team = (tdm_team){.nth = p->n_threads, .run = team_run, .barrier = team_barrier};
    p->spin = pp->spin > 0 ? pp->spin : 20000;
    p->spin_busy = p->n_threads + 1 > sysconf(_SC_NPROCESSORS_ONLN) ? 64 : p->spin;
    p->kick_window = p->spin_busy == p->spin ? &p->awake_until : NULL;
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
    p->workers = calloc((size_t)p->n_threads, sizeof *p->workers); /* n_threads - 1 used; never 0 bytes */
    tdm_status st = TDM_OK;
    if (p->mb) {
        memset(p->mb, 0, sizeof *p->mb);
        p->mb->ids = p->mem_alloc(p->mem_ctx, nt * k * sizeof(int32_t));
        p->mb->weights = p->mem_alloc(p->mem_ctx, nt * k * sizeof(float));
        p->mb->x = p->mem_alloc(p->mem_ctx, nt * d * sizeof(float));
        p->mb->out = p->mem_alloc(p->mem_ctx, nt * d * sizeof(float));
        p->mb->k = (int32_t)k;
    }
    if (!p->mb || !p->sel || !p->seen || !p->workers || !p->mb->ids || !p->mb->weights || !p->mb->x || !p->mb->out)
        st = tdm_error_set(err, TDM_ERR_OOM, "pool: out of memory for a %d-token mailbox", pp->max_tok);
    if (!st)
        st = tdm_experts_scratch_new(hp->n_embd, max_ff, pp->max_tok, pp->max_tok * (int32_t)k, hp->n_expert, &p->ex,
                                     err);
    for (int i = 0; !st && i < p->n_threads - 1; i++) {
        p->workers[i] = (worker){.p = p, .tid = i + 1};
        if (pthread_create(&p->workers[i].thread, NULL, worker_main, &p->workers[i]) != 0)
            st = tdm_error_set(err, TDM_ERR_OOM, "pool: cannot start team thread %d of %d", i + 1, p->n_threads);
        else
            p->n_workers++;
    }
    if (!st && pthread_create(&p->thread, NULL, driver, p) != 0)
        st = tdm_error_set(err, TDM_ERR_OOM, "pool: cannot start the driver thread");
    if (st) {
        tdm_pool_free(p);
        return st;
    }
    p->started = true;
    while (atomic_load_explicit(&p->ready, memory_order_acquire) < p->n_threads)
        sched_yield(); /* so pinned is settled and the team exists before the first job */
    p->pinned = p->topo && !atomic_load(&p->unpinned);
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
        futex_wake(&p->mb->dev_seq, 1);
        pthread_join(p->thread, NULL);
    }
    /* the driver is gone, so no job runs: wake the workers to quit */
    atomic_store(&p->quit, 1);
    atomic_fetch_add(&p->gen, 1);
    futex_wake(&p->gen, INT_MAX);
    for (int i = 0; i < p->n_workers; i++)
        pthread_join(p->workers[i].thread, NULL);
    free(p->workers);
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
    /* seq_cst store then load: see wait_change */
    const uint32_t s = atomic_load_explicit(&mb->dev_seq, memory_order_relaxed) + 1;
    atomic_store(&mb->dev_seq, s);
    if (atomic_load(&mb->pool_sleeping))
        futex_wake(&mb->dev_seq, 1);
    return s;
}

tdm_status tdm_pool_wait(tdm_pool *p, uint32_t seq, double *wait_ms, tdm_error *err)
{
    tdm_mailbox *mb = p->mb;
    const double t0 = wait_ms ? now_ms() : 0;
    for (int i = 0; atomic_load_explicit(&mb->pool_seq, memory_order_acquire) != seq; i++) {
        if (i < p->spin_busy)
            tdm_cpu_relax();
        else
            sched_yield();
    }
    if (wait_ms)
        *wait_ms += now_ms() - t0;
    if (mb->status)
        return tdm_error_set(err, mb->status, "%s", mb->msg);
    return TDM_OK;
}

tdm_status tdm_pool_copy(tdm_pool *p, const tdm_copy_piece *pieces, int n, tdm_error *err)
{
    if (n < 0 || (n > 0 && !pieces))
        return tdm_error_set(err, TDM_ERR_INVALID, "pool copy: %d pieces", n);
    if (n == 0)
        return TDM_OK;
    p->copy = pieces; /* published by the seq_cst store of dev_seq */
    p->n_copy = n;
    return tdm_pool_wait(p, tdm_pool_publish(p), NULL, err);
}

uint32_t tdm_pool_hint(tdm_pool *p, int32_t layer, const int32_t *ids, int32_t n)
{
    tdm_mailbox *mb = p->mb;
    n = n < 0 ? 0 : n > TDM_MAILBOX_HINT_MAX ? TDM_MAILBOX_HINT_MAX : n;
    atomic_store_explicit(&mb->hint_layer, layer, memory_order_relaxed);
    atomic_store_explicit(&mb->hint_n, n, memory_order_relaxed);
    for (int32_t i = 0; i < n; i++)
        atomic_store_explicit(&mb->hint_ids[i], ids[i], memory_order_relaxed);
    const uint32_t h = atomic_load_explicit(&mb->hint_seq, memory_order_relaxed) + 1;
    atomic_store_explicit(&mb->hint_seq, h, memory_order_release);
    return h;
}

void tdm_pool_get_stats(const tdm_pool *p, tdm_pool_stats *out) { *out = p->st; }

tdm_status tdm_pool_check(const tdm_pool *p, tdm_error *err)
{
    const int f = atomic_load_explicit(&((tdm_pool *)p)->failed, memory_order_acquire);
    return f ? tdm_error_set(err, (tdm_status)f, "CPU expert pool: %s", p->fail_msg) : TDM_OK;
}

void tdm_pool_kick(tdm_pool *p)
{
    atomic_store_explicit(&p->awake_until, now_ns() + TDM_POOL_KICK_MS * 1000000u, memory_order_relaxed);
    if (atomic_load(&p->mb->pool_sleeping))
        futex_wake(&p->mb->dev_seq, 1);
    if (atomic_load(&p->sleepers))
        futex_wake(&p->gen, INT_MAX);
}
