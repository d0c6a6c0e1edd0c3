/* tandem bench, the report side: the tables on stdout and the JSON file
 * (schema: docs/BENCH.md), from what bench_measure or --revalidate left in
 * bench_ctx. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli_bench.h"
#include "membw.h"
#include "projection.h"

static double run_pool_gbps(const bench_run *r)
{
    return r->dec.pool_ms > 0 ? (double)r->dec.pool_bytes / (r->dec.pool_ms * 1e-3) / 1e9 : 0;
}

static void print_opt(double v, bool have, const char *fmt, int width)
{
    if (have)
        printf(fmt, width, v);
    else
        printf("%*s", width, "n/a");
}

void bench_print_cpu_report(const bench_ctx *c)
{
    printf("\n%-7s %7s %12s %12s %8s %10s %10s %11s %9s %11s %8s\n", "threads", "prompt",
           "prompt tok/s", "decode tok/s", "hit rate", "cpu ms/tok", "gpu ms/tok", "wait ms/tok",
           "pool GB/s", "bound tok/s", "of bound");
    for (int i = 0; i < c->n_runs; i++) {
        const bench_run *r = &c->runs[i];
        double dec = r->decoded / r->decode_s, bound = r->bound.tok_s;
        printf("%-7d %7d %12.1f %12.2f %8s %10s %10s %11s %9s ", r->threads, r->prompt,
               r->prompt / r->prompt_s, dec, "n/a", "n/a", "n/a", "n/a", "n/a");
        if (bound > 0)
            printf("%11.2f %7.1f%%\n", bound, 100 * dec / bound);
        else
            printf("%11s %8s\n", "n/a", "n/a");
    }
    printf("(CPU path: bound = host read GB/s / bytes per token: %.4f GB of weights + f32 KV at the "
           "mean position + DeltaNet state%s; hit rate, CPU/GPU/wait ms and pool GB/s come with the "
           "hybrid path)\n",
           (c->pm.active_expert_bytes + tdm_proj_dense_bytes(&c->pm)) / 1e9,
           c->membw > 0 ? "" : "; --membw GBPS or the probe gives it");
    if (c->have_grid) {
        double eff = c->grid.dram[0].efficiency > 0 ? c->grid.dram[0].efficiency : c->grid.base.efficiency;
        printf("\nhybrid projection with %.1f GB/s host, efficiency %.2f, %s:\n", c->membw, eff,
               c->hc.source);
        for (int v = 0; v < c->grid.n_vram; v++)
            printf("  --gpu-mem %5.1f GiB: %8.1f tok/s projected (%s, hit %.1f%%), measured n/a\n",
                   c->grid.vram_gib[v], c->grid.points[v].tok_s,
                   tdm_proj_bound_name(c->grid.points[v].bound), 100 * c->grid.points[v].hit_rate);
    }
}

/* The engine runs every hit on the GPU: the projection's g = h value. */
static double projected_tok_s(const bench_run *r)
{
    return r->have_proj ? r->proj.tok_s_hits_on_gpu : 0;
}

void bench_print_validation(const bench_ctx *c)
{
    printf("\nprojection (engine/projection.h: t = t_gpu + t_cpu + hand-offs) against the measured decode;\n"
           "efficiency %.3f = %s;\nVRAM %.0f GB/s x %.3f, latency %.0f us per hand-off, reserve %.1f MB "
           "(KV for %d positions); hit curve:\nlayer fill: h = cached fraction, other fills: %s\n",
           c->efficiency, c->efficiency_source, c->vram_gbps, c->vram_eff, c->latency_us,
           c->reserve_bytes / 1e6, c->n_ctx, c->hc.source);
    printf("%7s %-8s %7s %6s %7s %7s %7s %7s %7s %7s %7s %9s %9s %9s %8s\n", "gpu-mem", "fill", "threads",
           "prompt", "B_dram", "hit prj", "hit msr", "gpu prj", "gpu msr", "cpu prj", "cpu msr", "projected",
           "measured", "error", "bound");
    for (int i = 0; i < c->n_runs; i++) {
        const bench_run *r = &c->runs[i];
        const double dec = r->decoded / r->decode_s, pr = projected_tok_s(r), n = r->decoded;
        printf("%7.1f %-8s %7d %6d ", r->gpu_mem_gib, bench_fill_name[r->fill], r->threads, r->prompt);
        print_opt(r->dram_gbps, r->dram_gbps > 0, "%*.1f", 7);
        if (pr > 0)
            printf(" %6.1f%% %6.1f%% %7.2f %7.2f %7.2f %7.2f %9.1f %9.2f %+8.1f%% %8s\n", 100 * r->proj.hit_rate,
                   100 * r->hit, 1e3 * r->proj.t_gpu_s, (r->dec.dev_ms - r->dec.wait_ms) / n,
                   1e3 * r->proj.t_cpu_s, r->dec.pool_ms / n, pr, dec, 100 * (dec - pr) / pr,
                   tdm_proj_bound_name(r->proj.bound));
        else
            printf(" %7s %6.1f%% %7s %7.2f %7s %7.2f %9s %9.2f %9s %8s\n", "n/a", 100 * r->hit, "n/a",
                   (r->dec.dev_ms - r->dec.wait_ms) / n, "n/a", r->dec.pool_ms / n, "n/a", dec, "n/a",
                   r->have_proj ? tdm_proj_bound_name(r->proj.bound) : "n/a");
    }
    printf("(ms per decoded token: gpu msr = GPU step time - waiting for the pool, cpu msr = pool compute;\n"
           " error = (measured - projected) / projected)\n");
}

void bench_print_hybrid_report(const bench_ctx *c)
{
    printf("\n%7s %-8s %7s %6s %8s %8s %6s %7s %7s %7s %7s %7s %7s %7s %7s %8s %-8s %7s %8s %7s\n", "gpu-mem",
           "fill", "threads", "prompt", "prompt/s", "decode/s", "hit", "cpu ms", "gpu ms", "wait ms", "pool GB/s",
           "MB/tok", "before", "after", "B_dram", "bound/s", "bound", "of bnd", "b+lat/s", "of b+l");
    for (int i = 0; i < c->n_runs; i++) {
        const bench_run *r = &c->runs[i];
        const double dec = r->decoded / r->decode_s, n = r->decoded;
        printf("%7.1f %-8s %7d %6d %8.1f %8.2f %5.1f%% %7.3f %7.3f %7.3f %7.1f %7.1f ", r->gpu_mem_gib,
               bench_fill_name[r->fill], r->threads, r->prompt, r->prompt / r->prompt_s, dec, 100 * r->hit,
               r->dec.pool_ms / n, r->dec.dev_ms / n, r->dec.wait_ms / n, run_pool_gbps(r), r->cpu_bytes / 1e6);
        print_opt(r->dram_pre, r->dram_pre > 0, "%*.1f", 7);
        printf(" ");
        print_opt(r->dram_post, r->dram_post > 0, "%*.1f", 7);
        printf(" ");
        print_opt(r->dram_gbps, r->dram_gbps > 0, "%*.1f", 7);
        if (r->bound.tok_s > 0)
            printf(" %8.1f %-8s %6.1f%%", r->bound.tok_s, r->bound.cpu_bound ? "cpu-dram" : "gpu-vram",
                   100 * dec / r->bound.tok_s);
        else
            printf(" %8s %-8s %7s", "n/a", "n/a", "n/a");
        if (r->bound.tok_s_latency > 0)
            printf(" %8.1f %6.1f%%\n", r->bound.tok_s_latency, 100 * dec / r->bound.tok_s_latency);
        else
            printf(" %8s %7s\n", "n/a", "n/a");
    }
    printf("(per decoded token; cpu ms = pool compute, gpu ms = GPU step time, wait ms = GPU waiting for "
           "the pool;\n bound = 1 / max(pool bytes / B_dram, GPU bytes / B_vram), B_vram %.0f GB/s device "
           "copy, B_dram %s%s%s\n (before / after: the probe right before / after the point; B_dram the "
           "larger);\n b+lat = DESIGN.md §5 with its latency: 1 / max(pool bytes / B_dram, GPU bytes / "
           "B_vram + t_latency),\n t_latency %.3f ms = %lld dependent stages x %.2f us)\n",
           c->vram_gbps, c->dram_source, c->probe_memory[0] ? " over the " : "", c->probe_memory,
           c->stage_us * 1e-3 * c->stages, (long long)c->stages, c->stage_us);
    if (c->o->validate)
        bench_print_validation(c);
}

static void add_num_or_null(cJSON *o, const char *k, double v, bool have)
{
    if (have)
        cJSON_AddNumberToObject(o, k, v);
    else
        cJSON_AddNullToObject(o, k);
}

static void add_int_array(cJSON *o, const char *k, const int *v, int n)
{
    cJSON *a = cJSON_AddArrayToObject(o, k);
    for (int i = 0; i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
}

/* Executor counters per decoded token (hybrid); null on the CPU path. */
static void run_json_hybrid(cJSON *x, const bench_run *r)
{
    const bool hy = r->fill >= 0;
    const double n = r->decoded, pr = projected_tok_s(r), dec = r->decoded / r->decode_s;
    add_num_or_null(x, "gpu_mem_gib", r->gpu_mem_gib, hy);
    if (hy)
        cJSON_AddStringToObject(x, "fill", bench_fill_name[r->fill]);
    else
        cJSON_AddNullToObject(x, "fill");
    add_num_or_null(x, "slots", r->dec.n_slots, hy);
    add_num_or_null(x, "hit_rate", r->hit, hy);
    add_num_or_null(x, "cpu_ms_per_token", r->dec.pool_ms / n, hy);
    add_num_or_null(x, "gpu_ms_per_token", r->dec.dev_ms / n, hy);
    add_num_or_null(x, "wait_ms_per_token", r->dec.wait_ms / n, hy);
    add_num_or_null(x, "pool_gbps", run_pool_gbps(r), hy && r->dec.pool_ms > 0);
    add_num_or_null(x, "pool_mb_per_token", (double)r->dec.pool_bytes / n / 1e6, hy);
    add_num_or_null(x, "pool_wakes_per_token", (double)r->dec.pool_wakes / n, hy);
    add_num_or_null(x, "direct_mb_per_token", (double)r->dec.direct_bytes / n / 1e6, hy);
    add_num_or_null(x, "direct_fraction_of_misses",
                    r->dec.misses > 0 ? (double)r->dec.direct / (double)r->dec.misses : 0.0, hy);
    add_num_or_null(x, "direct_share", r->dec.direct_quota, hy);
    add_num_or_null(x, "prefetch_mb_per_token", (double)r->dec.prefetch_bytes / n / 1e6, hy);
    add_num_or_null(x, "prefetch_fraction_of_misses",
                    r->dec.misses > 0 ? (double)r->dec.prefetched / (double)r->dec.misses : 0.0, hy);
    add_num_or_null(x, "prefetch_used_fraction",
                    r->dec.prefetch_staged > 0 ? (double)r->dec.prefetched / (double)r->dec.prefetch_staged : 0.0,
                    hy);
    add_num_or_null(x, "warm_mb_per_token", (double)r->dec.warm_bytes / n / 1e6, hy);
    add_num_or_null(x, "swaps", (double)r->dec.swaps, hy);
    add_num_or_null(x, "cpu_bytes_per_token", r->cpu_bytes, hy);
    add_num_or_null(x, "gpu_bytes_per_token", r->gpu_bytes, hy);
    add_num_or_null(x, "projected_tok_s", pr, pr > 0);
    add_num_or_null(x, "projected_hit_rate", r->proj.hit_rate, r->have_proj);
    add_num_or_null(x, "projected_slots", (double)r->proj.slots, r->have_proj);
    if (r->have_proj)
        cJSON_AddStringToObject(x, "projected_bound", tdm_proj_bound_name(r->proj.bound));
    else
        cJSON_AddNullToObject(x, "projected_bound");
    add_num_or_null(x, "rel_error", (dec - pr) / pr, pr > 0);
}

static cJSON *run_json(const bench_run *r)
{
    cJSON *x = cJSON_CreateObject();
    const double dec = r->decoded / r->decode_s, bound = r->bound.tok_s;
    cJSON_AddNumberToObject(x, "threads", r->threads);
    cJSON_AddNumberToObject(x, "prompt_tokens", r->prompt);
    cJSON_AddNumberToObject(x, "gen_tokens", r->decoded);
    cJSON_AddNumberToObject(x, "prompt_s", r->prompt_s);
    cJSON_AddNumberToObject(x, "decode_s", r->decode_s);
    cJSON_AddNumberToObject(x, "prompt_tok_s", r->prompt / r->prompt_s);
    cJSON_AddNumberToObject(x, "decode_tok_s", dec);
    run_json_hybrid(x, r);
    add_num_or_null(x, "bytes_per_token", r->cpu_bytes, r->fill < 0);
    add_num_or_null(x, "dram_gbps", r->dram_gbps, r->dram_gbps > 0);
    if (r->fill >= 0) {
        add_num_or_null(x, "dram_probe_before_gbps", r->dram_pre, r->dram_pre > 0);
        add_num_or_null(x, "dram_probe_after_gbps", r->dram_post, r->dram_post > 0);
    }
    add_num_or_null(x, "bound_tok_s", bound, bound > 0);
    if (r->fill < 0 || bound > 0) /* the CPU path is DRAM-bound by construction */
        cJSON_AddStringToObject(x, "bound", r->fill < 0 || r->bound.cpu_bound ? "cpu-dram" : "gpu-vram");
    else
        cJSON_AddNullToObject(x, "bound");
    add_num_or_null(x, "fraction_of_bound", dec / bound, bound > 0);
    const double bl = r->bound.tok_s_latency;
    add_num_or_null(x, "latency_s", r->bound.t_latency_s, bl > 0);
    add_num_or_null(x, "bound_latency_tok_s", bl, bl > 0);
    if (bl > 0)
        cJSON_AddStringToObject(x, "bound_latency", r->bound.cpu_bound_latency ? "cpu-dram" : "gpu-vram+latency");
    else
        cJSON_AddNullToObject(x, "bound_latency");
    add_num_or_null(x, "fraction_of_bound_latency", dec / bl, bl > 0);
    return x;
}

static void host_json(cJSON *root, const bench_ctx *c)
{
    cJSON *h = cJSON_AddObjectToObject(root, "host");
    add_num_or_null(h, "membw_gbps", c->membw, c->membw > 0);
    cJSON_AddStringToObject(h, "membw_source", c->measured ? "probe" : c->membw > 0 ? "user" : "none");
    if (c->measured) {
        cJSON *pr = cJSON_AddObjectToObject(h, "probe");
        cJSON_AddNumberToObject(pr, "threads", c->host.threads);
        cJSON_AddNumberToObject(pr, "bytes", (double)c->host.bytes);
        cJSON_AddNumberToObject(pr, "read_gbps", c->host.read_gbps);
        cJSON_AddNumberToObject(pr, "copy_gbps", c->host.copy_gbps);
        cJSON_AddNumberToObject(pr, "triad_gbps", c->host.triad_gbps);
        cJSON_AddNumberToObject(pr, "matvec_q4k_gbps", c->host.matvec_gbps);
        cJSON_AddNumberToObject(pr, "efficiency", c->host.efficiency);
    }
    cJSON_AddNumberToObject(h, "physical_cores", tdm_membw_physical_cores());
    cJSON *d = cJSON_AddArrayToObject(h, "dram_by_threads");
    for (int t = 0; c->hybrid && t < c->o->n_threads; t++) {
        cJSON *x = cJSON_CreateObject();
        cJSON_AddNumberToObject(x, "threads", c->o->threads[t]);
        add_num_or_null(x, "read_gbps", c->dram_gbps[t], c->dram_gbps[t] > 0);
        add_num_or_null(x, "min_gbps", c->dram_min[t], c->dram_min[t] > 0);
        add_num_or_null(x, "max_gbps", c->dram_max[t], c->dram_max[t] > 0);
        cJSON_AddNumberToObject(x, "probes", c->dram_n[t]);
        cJSON_AddStringToObject(x, "source", c->dram_source);
        if (c->probe_memory[0])
            cJSON_AddStringToObject(x, "memory", c->probe_memory);
        else
            cJSON_AddNullToObject(x, "memory");
        cJSON_AddItemToArray(d, x);
    }
}

/* Hybrid: the GPU and the projection's assumptions; CPU path: the projected budgets. */
static void path_json(cJSON *root, const bench_ctx *c)
{
    if (c->hybrid) {
        cJSON *g = cJSON_AddObjectToObject(root, "gpu");
        cJSON_AddStringToObject(g, "name", c->gpu_name);
        cJSON_AddNumberToObject(g, "copy_gbps", c->vram_gbps);
        cJSON_AddNumberToObject(g, "stage_us", c->stage_us);
        cJSON_AddNumberToObject(g, "stages_per_token", (double)c->stages);
        cJSON *v = cJSON_AddObjectToObject(root, "validation");
        cJSON_AddNumberToObject(v, "efficiency", c->efficiency);
        cJSON_AddStringToObject(v, "efficiency_source", c->efficiency_source);
        cJSON_AddNumberToObject(v, "vram_gbps", c->vram_gbps);
        cJSON_AddNumberToObject(v, "vram_efficiency", c->vram_eff);
        cJSON_AddNumberToObject(v, "latency_us", c->latency_us);
        cJSON_AddNumberToObject(v, "reserve_bytes", (double)c->reserve_bytes);
        cJSON_AddStringToObject(v, "hit_curve_layer", c->hc_layer.source);
        cJSON_AddStringToObject(v, "hit_curve", c->hc.source);
        cJSON_AddStringToObject(v, "projected", "tok_s_hits_on_gpu (every hit on the GPU, as the engine runs)");
        cJSON_AddItemToObject(root, "skipped", cJSON_Duplicate(c->skipped, true));
        return;
    }
    cJSON *vr = cJSON_AddArrayToObject(root, "vram");
    for (int v = 0; c->have_grid && v < c->grid.n_vram; v++) {
        const tdm_proj_point *p = &c->grid.points[v];
        cJSON *x = cJSON_CreateObject();
        cJSON_AddNumberToObject(x, "gpu_mem_gib", c->grid.vram_gib[v]);
        cJSON_AddNumberToObject(x, "projected_tok_s", p->tok_s);
        cJSON_AddStringToObject(x, "bound", tdm_proj_bound_name(p->bound));
        cJSON_AddNumberToObject(x, "hit_rate", p->hit_rate);
        cJSON_AddNullToObject(x, "measured_tok_s");
        cJSON_AddNullToObject(x, "rel_error");
        cJSON_AddItemToArray(vr, x);
    }
    if (c->have_grid) {
        char *pj = tdm_proj_json(&c->pm, &c->hc, &c->grid);
        cJSON *pp = pj ? cJSON_Parse(pj) : NULL;
        free(pj);
        if (pp)
            cJSON_AddItemToObject(root, "projection", pp);
    }
}

static cJSON *report_json(const bench_ctx *c)
{
    const bench_opts *o = c->o;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "format", "tandem-bench");
    cJSON_AddNumberToObject(root, "version", 2);
    cJSON_AddStringToObject(root, "command", c->command);
    cJSON *m = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(m, "name", c->model_name);
    cJSON_AddStringToObject(m, "path", o->model);
    cJSON_AddStringToObject(m, "arch", c->pm.arch);
    cJSON_AddNumberToObject(m, "active_expert_bytes_per_token", (double)c->pm.active_expert_bytes);
    cJSON_AddNumberToObject(m, "dense_bytes_per_token", (double)tdm_proj_dense_bytes(&c->pm));
    host_json(root, c);
    cJSON_AddStringToObject(root, "engine_path", c->hybrid ? "hybrid" : "cpu");
    cJSON *w = cJSON_AddObjectToObject(root, "workload");
    add_int_array(w, "prompt_tokens", o->prompts, o->n_prompts);
    cJSON_AddNumberToObject(w, "gen_tokens", o->gen);
    cJSON_AddBoolToObject(w, "greedy", true);
    cJSON_AddStringToObject(w, "prompt_source", c->synthetic ? "synthetic" : "text");
    cJSON *a = cJSON_AddArrayToObject(w, "fills");
    for (int f = 0; c->hybrid && f < o->n_fills; f++)
        cJSON_AddItemToArray(a, cJSON_CreateString(bench_fill_name[o->fills[f]]));
    if (c->hybrid && o->profile)
        cJSON_AddStringToObject(w, "profile", o->profile);
    cJSON *runs = cJSON_AddArrayToObject(root, "runs");
    for (int i = 0; i < c->n_runs; i++)
        cJSON_AddItemToArray(runs, run_json(&c->runs[i]));
    path_json(root, c);
    return root;
}

tdm_status bench_write_report(const bench_ctx *c, const char *path, tdm_error *err)
{
    cJSON *root = report_json(c);
    char *s = root ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!s)
        return tdm_error_set(err, TDM_ERR_OOM, "bench JSON");
    FILE *f = fopen(path, "w");
    bool ok = f && fputs(s, f) >= 0 && fputc('\n', f) != EOF;
    if (f)
        ok = fclose(f) == 0 && ok;
    free(s);
    return ok ? TDM_OK : tdm_error_set(err, TDM_ERR_IO, "%s: %s", path, strerror(errno));
}

void bench_default_json_path(const bench_ctx *c, char *out, size_t cap)
{
    char base[128];
    snprintf(base, sizeof base, "%s", c->model_name);
    char *dot = strstr(base, ".gguf");
    if (dot)
        *dot = '\0';
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    char stamp[32];
    strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &tm);
    FILE *probe = fopen("bench/results/.probe", "a");
    if (probe) {
        fclose(probe);
        remove("bench/results/.probe");
    }
    snprintf(out, cap, "%sbench-%s-%s.json", probe ? "bench/results/" : "", base, stamp);
}
