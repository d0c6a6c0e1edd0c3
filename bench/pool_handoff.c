/* bench/pool_handoff: round-trip latency of the CPU expert pool's mailbox
 * (publish -> driver sees the job -> computes nothing -> flag back), the
 * protocol's fixed cost per missed layer, and the same for a job of k missed
 * experts of the model. Prints median and p99 in microseconds.
 *   build/bench/pool_handoff [MODEL.gguf] [--rounds N] [--gap-us G]
 * --gap-us: idle time between jobs (e.g. 2000 puts the driver to sleep). */
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

static void measure(tdm_pool *p, int rounds, int gap_us, const char *what)
{
    double *lat = malloc((size_t)rounds * sizeof *lat);
    tdm_error err = {0};
    if (!lat)
        return;
    for (int r = 0; r < rounds; r++) {
        if (gap_us)
            usleep((useconds_t)gap_us);
        const double t0 = now_us();
        if (tdm_pool_wait(p, tdm_pool_publish(p), NULL, &err)) {
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
    int rounds = 2000, gap = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--gap-us") && i + 1 < argc)
            gap = atoi(argv[++i]);
        else
            path = argv[i];
    }
    if (rounds < 1 || gap < 0) {
        fprintf(stderr, "usage: pool_handoff [MODEL.gguf] [--rounds N>0] [--gap-us G>=0]\n");
        return 2;
    }
    tdm_error err = {0};
    tdm_model *m;
    tdm_topology *topo = NULL;
    if (tdm_model_load(path, &m, &err) || tdm_topology_load(&topo, &err)) {
        fprintf(stderr, "pool_handoff: %s\n", err.msg);
        return 1;
    }
    const tdm_hparams *hp = tdm_model_hparams(m);
    int32_t il = 0;
    while (il < hp->n_layer && tdm_model_layer(m, il)->ffn != TDM_FFN_MOE)
        il++;
    tdm_pool_params pp = {.model = m, .topo = topo, .max_tok = 1};
    tdm_pool *p;
    int32_t *res = malloc((size_t)hp->n_layer * hp->n_expert * sizeof *res);
    if (il == hp->n_layer || !res || tdm_pool_new(&pp, &p, &err)) {
        fprintf(stderr, "pool_handoff: %s\n", il == hp->n_layer ? "no MoE layer" : err.msg);
        return 1;
    }
    printf("%s: pool %d threads (pinned %d)\n", path, tdm_pool_threads(p), tdm_pool_pinned(p));
    tdm_mailbox *mb = tdm_pool_mailbox(p);
    mb->layer = il;
    mb->n_tok = 1;
    for (int32_t i = 0; i < hp->n_expert_used; i++) {
        mb->ids[i] = i;
        mb->weights[i] = 1.0f / (float)hp->n_expert_used;
    }
    for (int32_t i = 0; i < hp->n_embd; i++)
        mb->x[i] = (float)(i % 7) * 0.1f;
    for (int32_t i = 0; i < hp->n_layer * hp->n_expert; i++)
        res[i] = i; /* all resident: the job is the bare hand-off */
    tdm_pool_set_residency(p, res);
    measure(p, rounds, gap, "hand-off, no expert");
    tdm_pool_set_residency(p, NULL);
    char what[64];
    snprintf(what, sizeof what, "hand-off + %d missed experts", hp->n_expert_used);
    measure(p, rounds, gap, what);
    tdm_pool_stats st;
    tdm_pool_get_stats(p, &st);
    printf("pool: %lld jobs, %.3f ms in jobs, %llu bytes read, %.2f GB/s inside jobs\n", (long long)st.jobs, st.ms,
           (unsigned long long)st.bytes, st.ms > 0 ? (double)st.bytes / 1e6 / st.ms : 0.0);
    tdm_pool_free(p);
    free(res);
    tdm_topology_free(topo);
    tdm_model_free(m);
    return 0;
}
