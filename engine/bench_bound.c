/* bench_bound: measured bandwidths and the DESIGN.md §5 bound (bench_bound.h). */
#include "bench_bound.h"

#include <stdlib.h>

#include "gpu_fwd.h"
#include "membw.h"

#define VRAM_COPIES 10   /* copies per timing: long enough that launch gaps vanish */
#define STAGE_CHAIN 500  /* stages per recorded graph: its launch is one gap per 500 stages */
#define STAGE_REPLAYS 4  /* graph replays per timing */
#define STAGE_WARMUP 20  /* replays before the first timing (clocks up, graph uploaded) */

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* repeats timings into rate[] (GB/s); the buffers are owned by the caller. */
static tdm_status time_copies(tdm_gpu *g, void *a, void *b, size_t bytes, int repeats, double *rate, tdm_error *err)
{
    tdm_status st = tdm_gpu_memset(g, a, 0x5A, bytes, err);
    for (int r = 0; !st && r < repeats; r++) {
        float ms = 0;
        st = tdm_gpu_mark(g, 0, err);
        for (int i = 0; !st && i < VRAM_COPIES; i++)
            st = tdm_gpu_copy(g, i & 1 ? a : b, i & 1 ? b : a, bytes, err);
        if (!st)
            st = tdm_gpu_mark(g, 1, err);
        if (!st)
            st = tdm_gpu_elapsed_ms(g, 0, 1, &ms, err);
        rate[r] = 2.0 * (double)bytes * VRAM_COPIES / (ms * 1e-3) / 1e9;
    }
    return st;
}

tdm_status tdm_bench_vram_gbps(tdm_gpu *g, size_t bytes, int repeats, double *gbps, tdm_error *err)
{
    bytes = bytes ? bytes : (size_t)1 << 30;
    repeats = repeats > 0 ? repeats : 7;
    double *rate = malloc((size_t)repeats * sizeof *rate);
    if (!rate)
        return tdm_error_set(err, TDM_ERR_OOM, "copy bandwidth timings");
    void *a = NULL, *b = NULL;
    tdm_status st = tdm_gpu_alloc(g, bytes, &a, err);
    if (!st)
        st = tdm_gpu_alloc(g, bytes, &b, err);
    if (!st)
        st = time_copies(g, a, b, bytes, repeats, rate, err);
    if (!st) {
        qsort(rate, (size_t)repeats, sizeof *rate, cmp_double);
        *gbps = rate[repeats / 2];
    }
    if (a)
        tdm_gpu_release(g, a);
    if (b)
        tdm_gpu_release(g, b);
    free(rate);
    return st;
}

/* repeats timings of STAGE_REPLAYS replays of gr into us[] (per stage). */
static tdm_status time_stages(tdm_gpu *g, tdm_gpu_graph *gr, int repeats, double *us, tdm_error *err)
{
    tdm_status st = TDM_OK;
    for (int i = 0; !st && i < STAGE_WARMUP; i++)
        st = tdm_gpu_graph_launch(g, gr, err);
    for (int r = 0; !st && r < repeats; r++) {
        float ms = 0;
        st = tdm_gpu_mark(g, 0, err);
        for (int i = 0; !st && i < STAGE_REPLAYS; i++)
            st = tdm_gpu_graph_launch(g, gr, err);
        if (!st)
            st = tdm_gpu_mark(g, 1, err);
        if (!st)
            st = tdm_gpu_elapsed_ms(g, 0, 1, &ms, err);
        us[r] = 1e3 * ms / (STAGE_REPLAYS * STAGE_CHAIN);
    }
    return st;
}

tdm_status tdm_bench_stage_us(tdm_gpu *g, int repeats, double *us, tdm_error *err)
{
    repeats = repeats > 0 ? repeats : 7;
    double *t = malloc((size_t)repeats * sizeof *t);
    if (!t)
        return tdm_error_set(err, TDM_ERR_OOM, "stage timings");
    const size_t bytes = TDM_GPU_STAGE_FLOATS * sizeof(float);
    void *a = NULL, *b = NULL;
    tdm_gpu_graph *gr = NULL;
    tdm_status st = tdm_gpu_alloc(g, bytes, &a, err);
    if (!st)
        st = tdm_gpu_alloc(g, bytes, &b, err);
    if (!st)
        st = tdm_gpu_memset(g, a, 0, bytes, err);
    if (!st)
        st = tdm_gpu_graph_begin(g, err);
    if (!st) {
        st = tdm_gpu_stage_chain(g, a, b, STAGE_CHAIN, err);
        if (!st)
            st = tdm_gpu_graph_end(g, &gr, err);
        else
            tdm_gpu_graph_abort(g);
    }
    if (!st)
        st = time_stages(g, gr, repeats, t, err);
    if (!st) {
        qsort(t, (size_t)repeats, sizeof *t, cmp_double);
        *us = t[repeats / 2];
    }
    tdm_gpu_graph_free(gr);
    if (a)
        tdm_gpu_release(g, a);
    if (b)
        tdm_gpu_release(g, b);
    free(t);
    return st;
}

int64_t tdm_bench_token_stages(const tdm_proj_model *m)
{
    return 5 * (int64_t)m->n_moe_layer + 4 * (int64_t)(m->n_layer - m->n_moe_layer) + 1;
}

tdm_status tdm_bench_dram_gbps(int threads, size_t bytes, const void *region, size_t region_bytes, double *gbps,
                               tdm_error *err)
{
    tdm_membw_opts o;
    tdm_membw_opts_default(&o);
    o.threads = threads;
    if (bytes)
        o.bytes = bytes;
    if (region) {
        tdm_membw_stats s;
        tdm_status st = tdm_membw_read_region(region, region_bytes, o.bytes, threads, o.repeats, &s, err);
        if (!st)
            *gbps = s.median_gbs;
        return st;
    }
    tdm_membw_result r;
    tdm_status st = tdm_membw_run(&o, &r, err);
    if (!st)
        *gbps = r.kind[TDM_MEMBW_READ].median_gbs;
    return st;
}

double tdm_bench_gpu_bytes(const tdm_proj_model *m, double hit, double ctx)
{
    return (double)(m->attn_bytes + m->shexp_bytes + m->head_bytes) + (double)m->kv_bytes_per_ctx * ctx +
           2.0 * (double)m->state_bytes + hit * (double)m->active_expert_bytes;
}

static double slower(double a, double b) { return a > b ? a : b; }

void tdm_bench_bound_compute(double cpu_bytes, double dram_gbps, double gpu_bytes, double vram_gbps,
                             double latency_s, tdm_bench_bound *out)
{
    *out = (tdm_bench_bound){0};
    if ((cpu_bytes > 0 && !(dram_gbps > 0)) || (gpu_bytes > 0 && !(vram_gbps > 0)))
        return;
    out->t_cpu_s = cpu_bytes > 0 ? cpu_bytes / (dram_gbps * 1e9) : 0;
    out->t_gpu_s = gpu_bytes > 0 ? gpu_bytes / (vram_gbps * 1e9) : 0;
    const double t = slower(out->t_cpu_s, out->t_gpu_s);
    out->cpu_bound = out->t_cpu_s >= out->t_gpu_s;
    out->tok_s = t > 0 ? 1 / t : 0;
    if (!(latency_s > 0))
        return;
    out->t_latency_s = gpu_bytes > 0 ? latency_s : 0;
    const double tl = slower(out->t_cpu_s, out->t_gpu_s + out->t_latency_s);
    out->cpu_bound_latency = out->t_cpu_s >= out->t_gpu_s + out->t_latency_s;
    out->tok_s_latency = tl > 0 ? 1 / tl : 0;
}
