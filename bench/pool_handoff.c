/* bench/pool_handoff: round-trip latency of the CPU expert pool's mailbox
 * (publish -> driver sees the job -> computes nothing -> flag back), the
 * protocol's fixed cost per missed layer, and the same for a job of k missed
 * experts of the model. Prints median and p99 in microseconds.
 *   build/bench/pool_handoff [MODEL.gguf] [--rounds N] [--gap-us G] [--threads T]
 *                            [--gpu-publish] [--kick] [--spread] [--expert-memory map|copy]
 *                            [--experts N] [--busy-gap G] [--hint]
 * --gap-us: idle time between jobs (e.g. 2000 puts the team to sleep).
 * --threads: pool team size (default: physical cores - 1).
 * --gpu-publish: store dev_seq without waking the futex, as a GPU kernel does
 * (a sleeping driver then notices within its 1 ms futex timeout).
 * --kick: tdm_pool_kick after each gap, as a GPU step starts with.
 * --spread: each round's job is another MoE layer with k distinct random
 * experts (fixed seed), after one pass touching every expert page: the pool's
 * steady-state read rate from DRAM rather than from the cache.
 * --expert-memory copy: the experts copied into huge-page memory first
 * (tdm_model_copy_experts); map (default): read from the file mapping.
 * --experts N: the pool computes N of the job's k experts (the others are
 * marked held by the device, TDM_MAILBOX_HELD), as in a hybrid decode where
 * the GPU holds or reads some of a layer's misses itself. Default k.
 * --busy-gap G: the publisher spins G us before each job (a GPU's work
 * between hand-offs; unlike --gap-us the team keeps spinning).
 * --hint: with --spread and --busy-gap, a warm-up hint naming the next job's
 * experts is published at the start of each gap (tdm_pool_hint), so the team
 * reads them into its caches meanwhile: the best case of the decode warm-up.
 * --stream: also the copy jobs of prompt streaming (tdm_pool_copy): each
 * round copies 32 random experts of the next MoE layer as slots into one of
 * two staging buffers, as forward_gpu.c does; prints the copy GB/s. */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "model.h"
#include "pool.h"
#include "topology.h"

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct mode {
    int rounds, gap_us, busy_us, experts;
    bool gpu_publish, kick, spread, stream, hint;
    const tdm_model *m; /* --spread: the model whose layers and experts the rounds walk */
    uint64_t rng;
} mode;

/* --experts N: all but the last N ids are the device's. */
static void held(const mode *md, tdm_mailbox *mb)
{
    for (int32_t i = 0; i < mb->k; i++) {
        mb->ids[i] &= ~TDM_MAILBOX_HELD;
        if (i < mb->k - md->experts)
            mb->ids[i] |= TDM_MAILBOX_HELD;
    }
}

static double now_us(void);

/* --busy-gap: spins for us microseconds. */
static void busy_wait(int us)
{
    const double end = now_us() + us;
    while (now_us() < end)
        ;
}

/* --spread: the next round's layer (the MoE ones in turn) and k distinct experts. */
static void next_job(mode *md, tdm_mailbox *mb)
{
    const tdm_hparams *hp = tdm_model_hparams(md->m);
    int32_t il = mb->layer;
    do
        il = (il + 1) % hp->n_layer;
    while (tdm_model_layer(md->m, il)->ffn != TDM_FFN_MOE);
    mb->layer = il;
    for (int32_t i = 0; i < hp->n_expert_used; i++) {
        bool dup;
        do {
            md->rng = md->rng * 6364136223846793005ULL + 1442695040888963407ULL;
            mb->ids[i] = (int32_t)((md->rng >> 33) % (uint64_t)hp->n_expert);
            dup = false;
            for (int32_t j = 0; j < i; j++)
                dup |= mb->ids[j] == mb->ids[i];
        } while (dup);
    }
    held(md, mb);
}

/* --stream: md->rounds copy jobs of 32 experts each (slots: gate | up | down)
 * into two alternating 64-byte aligned staging buffers. */
static void measure_stream(tdm_pool *p, mode *md)
{
    const tdm_hparams *hp = tdm_model_hparams(md->m);
    enum { CHUNK = 32 };
    const int32_t n = hp->n_expert < CHUNK ? hp->n_expert : CHUNK;
    size_t slot = 0;
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const tdm_layer *L = tdm_model_layer(md->m, il);
        const size_t b = L->ffn == TDM_FFN_MOE ? L->gate_exps.mat_bytes + L->up_exps.mat_bytes + L->down_exps.mat_bytes
                                               : 0;
        slot = b > slot ? b : slot;
    }
    const size_t bytes = ((size_t)n * slot + 63) / 64 * 64;
    uint8_t *stage[2] = {aligned_alloc(64, bytes), aligned_alloc(64, bytes)};
    tdm_copy_piece *pc = malloc(3 * (size_t)n * sizeof *pc);
    tdm_error err = {0};
    if (!stage[0] || !stage[1] || !pc) {
        fprintf(stderr, "pool_handoff: out of memory for the staging buffers\n");
        goto done;
    }
    memset(stage[0], 0, bytes); /* fault the destination in once, as page-locked staging is */
    memset(stage[1], 0, bytes);
    int32_t il = -1;
    uint64_t total = 0;
    const double t0 = now_us();
    for (int r = 0; r < md->rounds; r++) {
        do
            il = (il + 1) % hp->n_layer;
        while (tdm_model_layer(md->m, il)->ffn != TDM_FFN_MOE);
        const tdm_layer *L = tdm_model_layer(md->m, il);
        const tdm_weight *w[3] = {&L->gate_exps, &L->up_exps, &L->down_exps};
        for (int32_t j = 0; j < n; j++) {
            md->rng = md->rng * 6364136223846793005ULL + 1442695040888963407ULL;
            const int32_t e = (int32_t)((md->rng >> 33) % (uint64_t)hp->n_expert);
            size_t off = 0;
            for (int i = 0; i < 3; i++) {
                pc[3 * j + i] = (tdm_copy_piece){stage[r & 1] + (size_t)j * slot + off,
                                                 (const uint8_t *)w[i]->data + (size_t)e * w[i]->mat_bytes,
                                                 w[i]->mat_bytes};
                off += w[i]->mat_bytes;
                total += w[i]->mat_bytes;
            }
        }
        if (tdm_pool_copy(p, pc, 3 * n, &err)) {
            fprintf(stderr, "pool_handoff: %s\n", err.msg);
            goto done;
        }
    }
    const double us = now_us() - t0;
    printf("stream copies: %d jobs of %d experts, %.1f MB in %.1f ms: %.2f GB/s\n", md->rounds, n,
           (double)total / 1e6, us * 1e-3, (double)total / 1e3 / us);
done:
    free(stage[0]);
    free(stage[1]);
    free(pc);
}

/* One read of every page of the experts (faults the mapping in). */
static unsigned touch_experts(const tdm_model *m)
{
    unsigned acc = 0;
    const tdm_hparams *hp = tdm_model_hparams(m);
    for (int32_t il = 0; il < hp->n_layer; il++) {
        const tdm_layer *L = tdm_model_layer(m, il);
        const tdm_weight *w[3] = {&L->gate_exps, &L->up_exps, &L->down_exps};
        for (int i = 0; i < 3 && L->ffn == TDM_FFN_MOE; i++)
            for (size_t o = 0; o < w[i]->mat_bytes * (size_t)w[i]->n_mat; o += 4096)
                acc += ((const volatile uint8_t *)w[i]->data)[o];
    }
    return acc;
}

/* What a GPU publisher does (gpu_handoff.cu): a plain release store, no wake. */
static uint32_t publish_like_gpu(tdm_mailbox *mb)
{
    const uint32_t s = atomic_load_explicit(&mb->dev_seq, memory_order_relaxed) + 1;
    atomic_store_explicit(&mb->dev_seq, s, memory_order_release);
    return s;
}

static void measure(tdm_pool *p, mode *md, const char *what)
{
    const int rounds = md->rounds, gap_us = md->gap_us;
    double *lat = malloc((size_t)rounds * sizeof *lat);
    tdm_error err = {0};
    if (!lat)
        return;
    for (int r = 0; r < rounds; r++) {
        if (gap_us)
            usleep((useconds_t)gap_us);
        if (md->kick)
            tdm_pool_kick(p);
        if (md->spread)
            next_job(md, tdm_pool_mailbox(p));
        if (md->hint) {
            const tdm_mailbox *mb = tdm_pool_mailbox(p);
            int32_t ids[TDM_MAILBOX_HINT_MAX], n = 0;
            for (int32_t i = 0; i < mb->k && n < TDM_MAILBOX_HINT_MAX; i++)
                if (!(mb->ids[i] & TDM_MAILBOX_HELD))
                    ids[n++] = mb->ids[i];
            tdm_pool_hint(p, mb->layer, ids, n);
        }
        if (md->busy_us)
            busy_wait(md->busy_us);
        const double t0 = now_us();
        const uint32_t seq = md->gpu_publish ? publish_like_gpu(tdm_pool_mailbox(p)) : tdm_pool_publish(p);
        if (tdm_pool_wait(p, seq, NULL, &err)) {
            fprintf(stderr, "pool_handoff: %s\n", err.msg);
            break;
        }
        lat[r] = now_us() - t0;
    }
    qsort(lat, (size_t)rounds, sizeof *lat, cmp_d);
    printf("%-34s median %8.2f us  p99 %8.2f us  (%d rounds, gap %d us)\n", what, lat[rounds / 2],
           lat[(size_t)rounds * 99 / 100], rounds, gap_us);
    free(lat);
}

int main(int argc, char **argv)
{
    const char *path = "models/demo/demo-Q4_K_M.gguf";
    mode md = {.rounds = 2000, .rng = 42};
    int threads = 0;
    bool copy = false, bad = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            md.rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--gap-us") && i + 1 < argc)
            md.gap_us = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--gpu-publish"))
            md.gpu_publish = true;
        else if (!strcmp(argv[i], "--kick"))
            md.kick = true;
        else if (!strcmp(argv[i], "--spread"))
            md.spread = true;
        else if (!strcmp(argv[i], "--experts") && i + 1 < argc)
            md.experts = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--busy-gap") && i + 1 < argc)
            md.busy_us = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--hint"))
            md.hint = true;
        else if (!strcmp(argv[i], "--stream"))
            md.stream = true;
        else if (!strcmp(argv[i], "--expert-memory") && i + 1 < argc) {
            copy = !strcmp(argv[++i], "copy");
            bad |= !copy && strcmp(argv[i], "map");
        } else
            path = argv[i];
    }
    if (md.rounds < 1 || md.gap_us < 0 || md.busy_us < 0 || md.experts < 0 || threads < 0 ||
        (md.hint && (!md.spread || !md.busy_us)) || bad) {
        fprintf(stderr, "usage: pool_handoff [MODEL.gguf] [--rounds N>0] [--gap-us G>=0] [--threads T>=0] "
                        "[--gpu-publish] [--kick] [--spread] [--stream] [--expert-memory map|copy] "
                        "[--experts N] [--busy-gap G>=0] [--hint (with --spread, --busy-gap)]\n");
        return 2;
    }
    tdm_error err = {0};
    tdm_model *m;
    tdm_topology *topo = NULL;
    if (tdm_model_load(path, &m, &err) || tdm_topology_load(&topo, &err)) {
        fprintf(stderr, "pool_handoff: %s\n", err.msg);
        return 1;
    }
    size_t copied = 0;
    if (copy && tdm_model_copy_experts(m, &copied, &err)) {
        fprintf(stderr, "pool_handoff: %s\n", err.msg);
        return 1;
    }
    if (md.spread) {
        const double t0 = now_us();
        const unsigned sum = touch_experts(m);
        printf("experts %s%s: every page touched in %.2f s (%u)\n", copy ? "copied" : "mapped",
               copy ? "" : " (in place)", (now_us() - t0) * 1e-6, sum & 1);
    }
    md.m = m;
    const tdm_hparams *hp = tdm_model_hparams(m);
    int32_t il = 0;
    while (il < hp->n_layer && tdm_model_layer(m, il)->ffn != TDM_FFN_MOE)
        il++;
    tdm_pool_params pp = {.model = m, .topo = topo, .n_threads = threads, .max_tok = 1};
    tdm_pool *p;
    int32_t *res = malloc((size_t)hp->n_layer * hp->n_expert * sizeof *res);
    if (il == hp->n_layer || !res || tdm_pool_new(&pp, &p, &err)) {
        fprintf(stderr, "pool_handoff: %s\n", il == hp->n_layer ? "no MoE layer" : err.msg);
        return 1;
    }
    printf("%s: pool %d threads (pinned %d), %s publisher%s\n", path, tdm_pool_threads(p), tdm_pool_pinned(p),
           md.gpu_publish ? "GPU-like" : "host", md.kick ? ", kick after each gap" : "");
    tdm_mailbox *mb = tdm_pool_mailbox(p);
    mb->layer = il;
    mb->n_tok = 1;
    if (!md.experts || md.experts > hp->n_expert_used)
        md.experts = hp->n_expert_used;
    for (int32_t i = 0; i < hp->n_expert_used; i++) {
        mb->ids[i] = i;
        mb->weights[i] = 1.0f / (float)hp->n_expert_used;
    }
    for (int32_t i = 0; i < hp->n_embd; i++)
        mb->x[i] = (float)(i % 7) * 0.1f;
    for (int32_t i = 0; i < hp->n_layer * hp->n_expert; i++)
        res[i] = i; /* all resident: the job is the bare hand-off */
    tdm_pool_set_residency(p, res);
    measure(p, &md, "hand-off, no expert");
    tdm_pool_set_residency(p, NULL);
    held(&md, mb);
    char what[96];
    snprintf(what, sizeof what, "hand-off + %d missed experts%s%s", md.experts, md.spread ? " (spread)" : "",
             md.hint ? " (hinted)" : "");
    tdm_pool_stats st0;
    tdm_pool_get_stats(p, &st0);
    measure(p, &md, what);
    tdm_pool_stats st;
    tdm_pool_get_stats(p, &st);
    st.jobs -= st0.jobs, st.ms -= st0.ms, st.bytes -= st0.bytes; /* the expert rounds only */
    printf("pool: %lld jobs, %.3f ms in jobs, %llu bytes read, %.2f GB/s inside jobs\n", (long long)st.jobs, st.ms,
           (unsigned long long)st.bytes, st.ms > 0 ? (double)st.bytes / 1e6 / st.ms : 0.0);
    if (md.hint)
        printf("warm-up: %lld hints, %lld cut short, %.1f MB read (%.0f%% of the jobs' bytes)\n",
               (long long)(st.warms - st0.warms), (long long)(st.warm_cut - st0.warm_cut),
               (double)(st.warm_bytes - st0.warm_bytes) / 1e6,
               st.bytes ? 100.0 * (double)(st.warm_bytes - st0.warm_bytes) / (double)st.bytes : 0.0);
    if (md.stream)
        measure_stream(p, &md);
    tdm_pool_free(p);
    free(res);
    tdm_topology_free(topo);
    tdm_model_free(m);
    return 0;
}
