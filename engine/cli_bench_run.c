/* tandem bench, the measuring side: the prompt, the workload on the CPU
 * forward or one hybrid session per grid point, the measured bandwidths, and
 * every run's bound and projection (docs/BENCH.md). The report reads what
 * this leaves in bench_ctx. */
#include <cjson/cJSON.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_bound.h"
#include "cli_bench.h"
#include "gpu.h"
#include "model.h"
#include "projection.h"
#include "session.h"
#include "tokenizer.h"
#include "topology.h"
#include "sampler.h"
#include "cli_gen.h"

/* Original text for the prompts, repeated to the length asked for. */
static const char BENCH_TEXT[] =
    "The harbour office opened at seven, and by eight the clerks had already argued twice about "
    "the tide tables. A freighter from the south was late; its captain radioed that the engine "
    "had lost pressure somewhere past the lighthouse and that he would come in on the afternoon "
    "flood instead. Nobody minded much. The fish market closed early on Thursdays, the ferry ran "
    "every forty minutes, and the new crane at the container quay still had no operator. In the "
    "town above the port, the council met to discuss the budget for the winter: road salt, the "
    "school roof, a second nurse for the clinic, and whether the library could stay open on "
    "Sundays. The mayor read the figures aloud, slowly, and then asked who wanted to speak first. ";

static const int FILL_POLICY[FILL_COUNT] = {TDM_CACHE_LAYER, TDM_CACHE_STATIC, TDM_CACHE_ADAPTIVE};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Prompt ids: the text tokenised and cut to n; synthetic ids if the vocabulary refuses. */
static tdm_status make_prompt(const tdm_tokenizer *tk, int32_t n_vocab, int32_t *ids, int n,
                              bool *synthetic, tdm_error *err)
{
    size_t tlen = strlen(BENCH_TEXT), n_ids = 0, reps = 1;
    tdm_status st = tdm_tokenizer_encode(tk, BENCH_TEXT, tlen, 0, NULL, 0, &n_ids, err);
    if ((st == TDM_OK || st == TDM_ERR_INVALID) && n_ids > 8)
        reps = (size_t)n / n_ids + 1;
    size_t len = tlen * reps;
    char *text = malloc(len + 1);
    int32_t *all = malloc(tdm_tokenizer_encode_bound(len) * sizeof *all);
    st = text && all ? TDM_OK : tdm_error_set(err, TDM_ERR_OOM, "bench prompt");
    for (size_t r = 0; !st && r < reps; r++)
        memcpy(text + r * tlen, BENCH_TEXT, tlen);
    if (!st)
        st = tdm_tokenizer_encode(tk, text, len, 0, all, tdm_tokenizer_encode_bound(len), &n_ids, err);
    *synthetic = st != TDM_OK || n_ids < (size_t)n;
    for (int i = 0; i < n; i++) /* synthetic: a fixed stride through the vocabulary */
        ids[i] = *synthetic ? (int32_t)((1000 + 7919ll * i) % (n_vocab > 256 ? n_vocab - 256 : n_vocab))
                            : all[i];
    free(text);
    free(all);
    return st == TDM_ERR_OOM ? st : TDM_OK;
}

/* after - before of the cumulative counters; the sizes are after's. */
static tdm_executor_stats stats_delta(const tdm_executor_stats *after, const tdm_executor_stats *before)
{
    tdm_executor_stats d = *after;
    d.tokens -= before->tokens;
    d.layers -= before->layers;
    d.hits -= before->hits;
    d.misses -= before->misses;
    d.pool_wakes -= before->pool_wakes;
    d.pool_ms -= before->pool_ms;
    d.wait_ms -= before->wait_ms;
    d.dev_ms -= before->dev_ms;
    d.pool_bytes -= before->pool_bytes;
    d.direct -= before->direct;
    d.direct_bytes -= before->direct_bytes;
    d.prefetched -= before->prefetched;
    d.prefetched_bytes -= before->prefetched_bytes;
    d.prefetch_staged -= before->prefetch_staged;
    d.prefetch_bytes -= before->prefetch_bytes;
    d.warms -= before->warms;
    d.warm_cut -= before->warm_cut;
    d.warm_bytes -= before->warm_bytes;
    d.swaps -= before->swaps;
    d.bytes_moved -= before->bytes_moved;
    return d;
}

/* Tokens of the untimed batch each session runs first (warm_up). */
#define BENCH_WARM_TOKENS 64

/* Once per session, before anything is timed: one batch of the prompt's
 * first tokens (prompt streaming's size on the hybrid path), then a reset.
 * It pays what a process or session pays once (CUDA module loading, cuBLAS
 * setup, first touches of the mapped weights and of the registered copy),
 * which the first timed prompt carried before: on the H200, 1,025 against
 * 2,045 tok/s for the same 512-token prompt at 12 GiB. */
static tdm_status warm_up(tdm_session *s, const int32_t *ids, int n, tdm_error *err)
{
    tdm_status st = tdm_session_eval(s, ids, n < BENCH_WARM_TOKENS ? n : BENCH_WARM_TOKENS, NULL, err);
    tdm_session_reset(s);
    return st;
}

/* One prompt + greedy decode on a reset session; with an executor, its
 * counters over the timed decode phase into r->dec. The prompt's logits
 * come back (as a prompt's do); the decode steps choose on the device
 * (tdm_session_eval_greedy). One decode step runs untimed between the two:
 * it records the session's decode graph, a cost paid once per session and
 * not per token. */
static tdm_status run_one(tdm_session *s, tdm_executor *ex, int32_t n_vocab, const int32_t *prompt, int gen,
                          bench_run *r, tdm_error *err)
{
    tdm_session_reset(s);
    const double t0 = now_s();
    tdm_status st = tdm_session_eval(s, prompt, r->prompt, NULL, err);
    if (st)
        return st;
    r->prompt_s = now_s() - t0;
    int32_t tok = tdm_sampler_argmax(tdm_session_logits(s), n_vocab);
    if ((st = tdm_session_eval_greedy(s, &tok, 1, &tok, err)))
        return st;
    const double t1 = now_s();
    tdm_executor_stats before = {0}, after = {0};
    if (ex)
        tdm_executor_get_stats(ex, &before);
    for (r->decoded = 0; r->decoded < gen; r->decoded++)
        if ((st = tdm_session_eval_greedy(s, &tok, 1, &tok, err)))
            return st;
    r->decode_s = now_s() - t1;
    if (ex) {
        tdm_executor_get_stats(ex, &after);
        r->dec = stats_delta(&after, &before);
    }
    return TDM_OK;
}

/* Bytes a decoded token reads on the CPU path: every weight from host RAM,
 * the KV cache at the run's mean decode position (the CPU forward keeps K and
 * V in f32: twice the f16 accounting) and the DeltaNet state read + written. */
static double cpu_path_bytes(const bench_ctx *c, const bench_run *r)
{
    double ctx = r->prompt + r->decoded / 2.0;
    return (double)(c->pm.active_expert_bytes + tdm_proj_dense_bytes(&c->pm)) +
           2.0 * (double)c->pm.kv_bytes_per_ctx * ctx + 2.0 * (double)c->pm.state_bytes;
}

tdm_status bench_setup_curves(bench_ctx *c, double zipf, tdm_error *err)
{
    tdm_status st = tdm_proj_hitcurve_zipf(0, c->pm.n_expert, &c->hc_layer, err);
    if (st)
        return st;
    snprintf(c->hc_layer.source, sizeof c->hc_layer.source, "layer fill: h = cached fraction");
    if (c->o->hit_curve)
        return tdm_proj_hitcurve_load(c->o->hit_curve, NULL, &c->pm, &c->hc, err);
    return tdm_proj_hitcurve_zipf(zipf >= 0 ? zipf : TDM_PROJ_DEFAULT_ZIPF_S, c->pm.n_expert, &c->hc, err);
}

static tdm_status setup_projection(bench_ctx *c, const tdm_gguf *g, tdm_error *err)
{
    tdm_status st = tdm_proj_model_from_gguf(g, c->model_name, &c->pm, err);
    return st ? st : bench_setup_curves(c, c->o->zipf, err);
}

/* CPU path, after the workload (the probe pins threads, which must not change the runs). */
static tdm_status setup_cpu_bound(bench_ctx *c, tdm_error *err)
{
    tdm_status st;
    if (c->o->measure && !(c->o->membw > 0)) {
        if ((st = tdm_proj_measure_host(c->o->probe_bytes, &c->host, err)))
            return st;
        c->measured = true;
        c->membw = c->host.read_gbps;
        tdm_proj_host_print(stdout, &c->host);
    }
    for (int i = 0; i < c->n_runs; i++) {
        bench_run *r = &c->runs[i];
        r->dram_gbps = c->membw;
        r->cpu_bytes = cpu_path_bytes(c, r);
        tdm_bench_bound_compute(r->cpu_bytes, c->membw, 0, 0, 0, &r->bound);
    }
    if (!(c->membw > 0))
        return TDM_OK;
    tdm_proj_grid *gr = &c->grid;
    tdm_proj_grid_default(&c->pm, gr);
    gr->n_dram = 0;
    if ((st = tdm_proj_grid_add_dram(gr, c->measured ? "this host (probe)" : "measured", c->membw,
                                     true, err)))
        return st;
    if (c->measured && !(c->o->efficiency > 0))
        gr->dram[0].efficiency = c->host.efficiency;
    gr->n_vram = c->o->n_gpu_mem;
    memcpy(gr->vram_gib, c->o->gpu_mem, sizeof c->o->gpu_mem);
    if (c->o->efficiency > 0) {
        gr->base.efficiency = c->o->efficiency;
        snprintf(gr->efficiency_source, sizeof gr->efficiency_source, "user");
    }
    if (c->o->vram_eff > 0)
        gr->base.vram_efficiency = c->o->vram_eff;
    c->have_grid = true;
    return tdm_proj_grid_run(&c->pm, &c->hc, gr, err);
}

/* ---- hybrid ---- */

/* The executor parameters of one grid point: cli_gen's construction (shared with run/serve). */
static void hybrid_params(const bench_ctx *c, const bench_run *r, tdm_executor_params *p)
{
    cli_gen_opts go; /* the generation commands' construction, with this point's settings */
    cli_gen_opts_init(&go);
    go.gpu_mem = (uint64_t)(r->gpu_mem_gib * (double)(1ull << 30));
    go.ctx = c->n_ctx;
    go.threads = r->threads;
    go.policy = FILL_POLICY[r->fill];
    go.adapt_every = c->o->adapt_every;
    go.stream_min = c->o->stream_min;
    go.zero_copy = c->o->zero_copy;
    go.prefetch = c->o->prefetch;
    go.pool_warm = c->o->pool_warm;
    const cli_gen_ctx gc = {.topo = c->topo, .prof = r->fill == FILL_LAYER ? NULL : c->prof};
    cli_gen_executor_params(&go, &gc, p);
}

/* Before the workload: topology, profile and the device copy bandwidth. */
static tdm_status hybrid_setup(bench_ctx *c, const tdm_model *model, tdm_error *err)
{
    tdm_status st = tdm_topology_load(&c->topo, err);
    if (!st && c->o->profile) {
        tdm_model_id id;
        st = tdm_profile_model_id(tdm_model_gguf(model), &id, err);
        if (!st)
            st = tdm_profile_read(c->o->profile, &id, &c->prof, err);
    }
    tdm_gpu *g = NULL;
    tdm_gpu_info info;
    if (!st)
        st = tdm_gpu_create(0, &g, err);
    if (!st)
        st = tdm_gpu_query(g, &info, err);
    if (!st)
        st = tdm_bench_vram_gbps(g, 0, 0, &c->vram_gbps, err);
    if (!st)
        st = tdm_bench_stage_us(g, 0, &c->stage_us, err);
    if (!st) {
        c->stages = tdm_bench_token_stages(&c->pm);
        snprintf(c->gpu_name, sizeof c->gpu_name, "%s", info.name);
        printf("GPU %s: device copy %.0f GB/s (B_vram); a dependent stage %.2f us x %lld per token = %.3f ms "
               "(t_latency)\n",
               c->gpu_name, c->vram_gbps, c->stage_us, (long long)c->stages, c->stage_us * 1e-3 * c->stages);
    }
    tdm_gpu_free(g);
    return st;
}

/* One grid point: a fresh hybrid session, every prompt length on it. */
static tdm_status run_hybrid_point(bench_ctx *c, tdm_model *model, const int32_t *ids, bench_run proto,
                                   tdm_error *err)
{
    const bench_opts *o = c->o;
    tdm_executor_params p;
    hybrid_params(c, &proto, &p);
    tdm_session *s = NULL;
    fprintf(stderr, "bench: --gpu-mem %g GiB, fill %s, %d pool threads ...\n", proto.gpu_mem_gib,
            bench_fill_name[proto.fill], proto.threads);
    tdm_status st = tdm_session_new_hybrid(model, c->n_ctx, &p, &s, err);
    if (!st && tdm_session_budget(s)) {
        char line[512];
        tdm_budget_format(tdm_session_budget(s), line, sizeof line);
        fprintf(stderr, "bench: %s\n", line);
    }
    if (!st)
        st = warm_up(s, ids, o->prompts[0], err);
    for (int i = 0; !st && i < o->n_prompts; i++) {
        bench_run *r = &c->runs[c->n_runs];
        *r = proto;
        r->prompt = o->prompts[i];
        if (!(st = run_one(s, tdm_session_executor(s), tdm_model_hparams(model)->n_vocab, ids, o->gen, r, err)))
            c->n_runs++;
    }
    tdm_session_free(s);
    return st;
}

static int cmp_gbps(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* B_dram per thread count: --membw, or the median, least and greatest of the
 * probes at that count (a count the probe refuses, more threads than
 * physical cores, has none: its bound stays empty). */
static void hybrid_dram(bench_ctx *c)
{
    const bench_opts *o = c->o;
    snprintf(c->dram_source, sizeof c->dram_source, "%s",
             o->membw > 0 ? "user" : o->measure ? "probe" : "none");
    for (int t = 0; t < o->n_threads; t++) {
        double v[2 * MAX_RUNS];
        int n = 0;
        for (int i = 0; i < c->n_probes; i++)
            if (c->probe_threads[i] == o->threads[t])
                v[n++] = c->probe_gbps[i];
        c->dram_n[t] = n;
        if (o->membw > 0) {
            c->dram_gbps[t] = c->dram_min[t] = c->dram_max[t] = o->membw;
            continue;
        }
        if (!n)
            continue;
        qsort(v, (size_t)n, sizeof *v, cmp_gbps);
        c->dram_gbps[t] = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
        c->dram_min[t] = v[0];
        c->dram_max[t] = v[n - 1];
        printf("host read bandwidth, %d pinned threads: %d probes, median %.1f GB/s (%.1f-%.1f)\n", o->threads[t],
               n, c->dram_gbps[t], v[0], v[n - 1]);
    }
}

static double run_hit_rate(const bench_run *r)
{
    const int64_t n = r->dec.hits + r->dec.misses;
    return n > 0 ? (double)r->dec.hits / (double)n : 0;
}

/* The projection's pool efficiency: the pool's decode GB/s over every run at
 * the largest thread count, divided by B_dram there (or --efficiency). */
static void hybrid_efficiency(bench_ctx *c)
{
    const bench_opts *o = c->o;
    int tmax = 0;
    for (int t = 1; t < o->n_threads; t++)
        tmax = o->threads[t] > o->threads[tmax] ? t : tmax;
    double bytes = 0, ms = 0;
    for (int i = 0; i < c->n_runs; i++)
        if (c->runs[i].threads == o->threads[tmax]) {
            bytes += (double)c->runs[i].dec.pool_bytes;
            ms += c->runs[i].dec.pool_ms;
        }
    c->efficiency = TDM_PROJ_DEFAULT_EFFICIENCY;
    snprintf(c->efficiency_source, sizeof c->efficiency_source, "default (no pool work at %d threads)",
             o->threads[tmax]);
    if (o->efficiency > 0) {
        c->efficiency = o->efficiency;
        snprintf(c->efficiency_source, sizeof c->efficiency_source, "user");
    } else if (ms > 0 && c->dram_gbps[tmax] > 0) {
        const double eff = bytes / (ms * 1e-3) / 1e9 / c->dram_gbps[tmax];
        c->efficiency = eff < 1.5 ? eff : 1.5; /* the projection's range */
        snprintf(c->efficiency_source, sizeof c->efficiency_source,
                 "pool %.1f GB/s / median B_dram %.1f GB/s at %d threads", bytes / (ms * 1e-3) / 1e9,
                 c->dram_gbps[tmax], o->threads[tmax]);
    }
}

/* The projection of run i for its machine (docs/BENCH.md "Projection check"):
 * nothing from the run's own cache counters. */
void bench_project_run(const bench_ctx *c, bench_run *r, int i)
{
    if (!(r->dram_gbps > 0))
        return;
    tdm_proj_machine mc;
    tdm_proj_machine_default(&c->pm, &mc);
    mc.dram_gbps = r->dram_gbps;
    mc.efficiency = c->efficiency;
    mc.vram_gbps = c->vram_gbps;
    mc.vram_efficiency = c->vram_eff;
    mc.latency_us = c->latency_us;
    mc.vram_bytes = (uint64_t)(r->gpu_mem_gib * (double)(1ull << 30));
    mc.reserve_bytes = c->reserve_bytes;
    mc.decode_ctx = (int32_t)(r->prompt + r->decoded / 2.0);
    tdm_error e = {0};
    r->have_proj = tdm_proj_predict(&c->pm, r->fill == FILL_LAYER ? &c->hc_layer : &c->hc, &mc, &r->proj,
                                    &e) == TDM_OK;
    if (!r->have_proj)
        fprintf(stderr, "bench: no projection for run %d: %s\n", i, e.msg);
}

/* Bound and projection of every hybrid run (DESIGN.md §5, docs/BENCH.md). */
static void hybrid_bound(bench_ctx *c)
{
    hybrid_efficiency(c);
    /* the copy rate is measured, not a peak: 1 unless --vram-efficiency */
    c->vram_eff = c->o->vram_eff > 0 ? c->o->vram_eff : 1.0;
    c->latency_us = TDM_PROJ_DEFAULT_LATENCY_US;
    c->reserve_bytes = tdm_proj_reserve_bytes(&c->pm, c->n_ctx);
    for (int i = 0; i < c->n_runs; i++) {
        bench_run *r = &c->runs[i];
        const double ctx = r->prompt + r->decoded / 2.0;
        r->hit = run_hit_rate(r);
        /* the larger of the probes around the point: a probe that read low never raises the
         * fraction of the bound */
        r->dram_gbps = c->o->membw > 0 ? c->o->membw : r->dram_pre > r->dram_post ? r->dram_pre : r->dram_post;
        /* every missed byte leaves host DRAM, through the pool, the GPU's direct share or its
         * prefetch (the bytes the misses need: prefetched experts that were not selected are not
         * counted) */
        r->cpu_bytes = (double)(r->dec.pool_bytes + r->dec.direct_bytes + r->dec.prefetched_bytes) / r->decoded;
        r->gpu_bytes = tdm_bench_gpu_bytes(&c->pm, r->hit, ctx);
        tdm_bench_bound_compute(r->cpu_bytes, r->dram_gbps, r->gpu_bytes, c->vram_gbps, c->stage_us * 1e-6 * c->stages,
                                &r->bound);
        bench_project_run(c, r, i);
    }
}

static tdm_status run_cpu(bench_ctx *c, tdm_model *model, const int32_t *ids, tdm_error *err)
{
    const bench_opts *o = c->o;
    int max_thr = 1;
    for (int t = 0; t < o->n_threads; t++)
        max_thr = o->threads[t] > max_thr ? o->threads[t] : max_thr;
    omp_set_num_threads(max_thr); /* the forward sizes its per-thread scratch at creation */
    tdm_session *s = NULL;
    tdm_status st = tdm_session_new_device(model, c->n_ctx, TDM_DEVICE_CPU, &s, err);
    if (!st)
        fprintf(stderr, "bench: forward on %s\n", tdm_device_name(tdm_session_device(s)));
    if (!st)
        st = warm_up(s, ids, o->prompts[0], err);
    for (int t = 0; !st && t < o->n_threads; t++)
        for (int p = 0; !st && p < o->n_prompts; p++) {
            bench_run *r = &c->runs[c->n_runs];
            *r = (bench_run){.threads = o->threads[t], .prompt = o->prompts[p], .fill = -1};
            omp_set_num_threads(r->threads);
            fprintf(stderr, "bench: %d threads, prompt %d, %d generated ...\n", r->threads, r->prompt,
                    o->gen);
            if (!(st = run_one(s, NULL, tdm_model_hparams(model)->n_vocab, ids, o->gen, r, err)))
                c->n_runs++;
        }
    tdm_session_free(s);
    return st;
}

/* B_dram from the probe with a point's pool thread count (pinned as the
 * pool pins them; the probe leaves the main thread's binding as it was),
 * taken right before and right after the point (the H200 host's bandwidth
 * switches between ~50 and ~70 GB/s over seconds: one probe per run said
 * little about a point a minute away), over the memory the pool reads: the
 * model's expert copy when there is one, else fresh buffers. 0 without a
 * probe or when it fails. */
static double probe_point(bench_ctx *c, const tdm_model *model, int threads, const char *when, double gib)
{
    const bench_opts *o = c->o;
    double gbps = 0;
    tdm_error e = {0};
    if (!o->measure || o->membw > 0)
        return 0;
    size_t rb = 0;
    const void *region = tdm_model_experts_memory(model, &rb);
    snprintf(c->probe_memory, sizeof c->probe_memory, "%s", region ? "expert copy" : "fresh buffers");
    if (tdm_bench_dram_gbps(threads, o->probe_bytes, region, rb, &gbps, &e)) {
        fprintf(stderr, "bench: no B_dram for %d threads: %s\n", threads, e.msg);
        return 0;
    }
    printf("host read bandwidth, %d pinned threads over the %s, %s --gpu-mem %g: %.1f GB/s\n", threads,
           c->probe_memory, when, gib, gbps);
    if (c->n_probes < 2 * MAX_RUNS) {
        c->probe_gbps[c->n_probes] = gbps;
        c->probe_threads[c->n_probes++] = threads;
    }
    return gbps;
}

/* A point that fails (budget too small, a CUDA error) is reported and skipped:
 * the others still run. An error only when no point ran. */
static tdm_status run_hybrid(bench_ctx *c, tdm_model *model, const int32_t *ids, tdm_error *err)
{
    const bench_opts *o = c->o;
    omp_set_num_threads(1); /* the main thread only feeds the GPU; the pool has its own team */
    for (int v = 0; v < o->n_gpu_mem; v++)
        for (int t = 0; t < o->n_threads; t++)
            for (int f = 0; f < o->n_fills; f++) {
                const bench_run proto = {.threads = o->threads[t], .gpu_mem_gib = o->gpu_mem[v],
                                         .fill = o->fills[f]};
                const int first = c->n_runs;
                const double pre = probe_point(c, model, proto.threads, "before", proto.gpu_mem_gib);
                const tdm_status st = run_hybrid_point(c, model, ids, proto, err);
                const double post = probe_point(c, model, proto.threads, "after", proto.gpu_mem_gib);
                for (int i = first; i < c->n_runs; i++) {
                    c->runs[i].dram_pre = pre;
                    c->runs[i].dram_post = post;
                }
                if (!st)
                    continue;
                fprintf(stderr, "bench: skipped --gpu-mem %g, %d threads, fill %s: %s\n", proto.gpu_mem_gib,
                        proto.threads, bench_fill_name[proto.fill], err->msg);
                cJSON *x = cJSON_CreateObject();
                cJSON_AddNumberToObject(x, "gpu_mem_gib", proto.gpu_mem_gib);
                cJSON_AddNumberToObject(x, "threads", proto.threads);
                cJSON_AddStringToObject(x, "fill", bench_fill_name[proto.fill]);
                cJSON_AddStringToObject(x, "error", err->msg);
                cJSON_AddItemToArray(c->skipped, x);
            }
    if (c->n_runs)
        return TDM_OK;
    char last[sizeof err->msg];
    snprintf(last, sizeof last, "%s", err->msg);
    return tdm_error_set(err, err->code, "no grid point ran; the last: %s", last);
}

/* The workload: prompt ids once, then the CPU forward per thread count or a
 * hybrid session per grid point; every prompt length on each. */
static tdm_status run_workload(bench_ctx *c, tdm_model *model, tdm_error *err)
{
    const bench_opts *o = c->o;
    int maxp = 0;
    for (int i = 0; i < o->n_prompts; i++)
        maxp = o->prompts[i] > maxp ? o->prompts[i] : maxp;
    c->n_ctx = maxp + 1 + o->gen; /* + the untimed first decode step */
    tdm_tokenizer *tk = NULL;
    int32_t *ids = malloc((size_t)maxp * sizeof *ids);
    tdm_status st = ids ? tdm_tokenizer_load(tdm_model_gguf(model), &tk, err)
                        : tdm_error_set(err, TDM_ERR_OOM, "prompt ids");
    if (!st)
        st = make_prompt(tk, tdm_model_hparams(model)->n_vocab, ids, maxp, &c->synthetic, err);
    if (!st)
        st = c->hybrid ? run_hybrid(c, model, ids, err) : run_cpu(c, model, ids, err);
    tdm_tokenizer_free(tk);
    free(ids);
    return st;
}

tdm_status bench_measure(bench_ctx *c, tdm_model *model, tdm_error *err)
{
    const bench_opts *o = c->o;
    tdm_status st = setup_projection(c, tdm_model_gguf(model), err);
    if (!st && c->hybrid)
        st = hybrid_setup(c, model, err);
    if (st)
        return st;
    printf("tandem bench: %s (%s), engine path: %s, prompts", c->model_name, c->pm.arch,
           c->hybrid ? "hybrid (GPU + VRAM expert cache + CPU pool)" : "CPU forward");
    for (int i = 0; i < o->n_prompts; i++)
        printf(" %d", o->prompts[i]);
    printf(", %d greedy tokens\n", o->gen);
    if ((st = run_workload(c, model, err)))
        return st;
    if (!c->hybrid)
        return setup_cpu_bound(c, err);
    hybrid_dram(c);
    hybrid_bound(c);
    return TDM_OK;
}
