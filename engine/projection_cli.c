/* projection_cli: the option parser and driver shared by `tandem bench
 * --project` (engine/cli_bench.c) and the standalone tools/ddr, so that both
 * print the same table and write the same JSON. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "membw.h"
#include "projection.h"


/* "8,12,16,24" in GiB. */
static int parse_gib_list(const char *s, double *out, int cap)
{
    int n = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (n >= cap || !tdm_cli_parse_double(t, 0.25, 4096, &out[n]))
            return -1;
        n++;
    }
    return n;
}

tdm_status tdm_proj_measure_host(size_t bytes, tdm_proj_host *out, tdm_error *err)
{
    tdm_membw_opts o;
    tdm_membw_opts_default(&o);
    if (bytes)
        o.bytes = bytes;
    tdm_membw_result r;
    tdm_status st = tdm_membw_run(&o, &r, err);
    if (st)
        return tdm_error_wrap(err, "bandwidth probe");
    /* the expert shape of Qwen3.5-35B-A3B / Qwen3-Next gate and up matrices */
    tdm_membw_matvec_opts mo = {.type = TDM_Q_Q4_K, .rows = 512, .cols = 2048, .bytes = o.bytes,
                                .threads = o.threads, .repeats = o.repeats};
    tdm_membw_stats mv;
    if ((st = tdm_membw_matvec(&mo, &mv, err)))
        return tdm_error_wrap(err, "matvec bandwidth");
    *out = (tdm_proj_host){.threads = r.threads, .bytes = r.bytes,
                           .read_gbps = r.kind[TDM_MEMBW_READ].median_gbs,
                           .copy_gbps = r.kind[TDM_MEMBW_COPY].median_gbs,
                           .triad_gbps = r.kind[TDM_MEMBW_TRIAD].median_gbs,
                           .matvec_gbps = mv.median_gbs};
    if (!(out->read_gbps > 0 && out->matvec_gbps > 0))
        return tdm_error_set(err, TDM_ERR_INVALID, "bandwidth probe measured read %g, matvec %g GB/s",
                             out->read_gbps, out->matvec_gbps);
    out->efficiency = out->matvec_gbps / out->read_gbps;
    if (out->efficiency > 1.5) /* a cache-resident probe; keep the model in range */
        out->efficiency = 1.5;
    return TDM_OK;
}

void tdm_proj_host_print(FILE *f, const tdm_proj_host *h)
{
    fprintf(f, "host bandwidth probe: %d threads (physical cores), %.0f MiB, medians in GB/s\n",
            h->threads, (double)h->bytes / (1 << 20));
    fprintf(f, "  read %.1f  copy %.1f  triad %.1f  engine Q4_K matvec %.1f  -> efficiency %.2f\n",
            h->read_gbps, h->copy_gbps, h->triad_gbps, h->matvec_gbps, h->efficiency);
}

typedef struct proj_opts {
    const char *model, *preset, *curve, *policy, *json, *membw_name;
    double membw, efficiency, zipf_s, vram_gbps, vram_eff, latency_us, reserve_gib;
    int n_ctx, decode_ctx;
    int n_vram;
    double vram[TDM_PROJ_GRID_MAX];
    bool quiet, measure;
    size_t probe_bytes;
} proj_opts;

static int usage_error(const char *prog, const char *msg, const char *arg)
{
    fprintf(stderr, "%s: %s%s%s (see --help)\n", prog, msg, arg ? ": " : "", arg ? arg : "");
    return 2;
}

/* Returns 0 when parsed, 2 on a usage error, -1 for --help. */
static int parse_opts(int argc, char **argv, const char *prog, const char *default_model,
                      proj_opts *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool takes = true;
        if (!strcmp(a, "-h") || !strcmp(a, "--help"))
            return -1;
        if (!strcmp(a, "--project") || !strcmp(a, "--quiet") || !strcmp(a, "--measure") ||
            !strcmp(a, "--no-measure")) {
            o->quiet |= !strcmp(a, "--quiet");
            if (strstr(a, "measure"))
                o->measure = !strcmp(a, "--measure");
            continue;
        }
        if (!v)
            return usage_error(prog, "missing value after", a);
        if (!strcmp(a, "-m") || !strcmp(a, "--model"))
            o->model = v;
        else if (!strcmp(a, "--preset"))
            o->preset = v;
        else if (!strcmp(a, "--hit-curve"))
            o->curve = v;
        else if (!strcmp(a, "--policy"))
            o->policy = v;
        else if (!strcmp(a, "--json"))
            o->json = v;
        else if (!strcmp(a, "--membw-name"))
            o->membw_name = v;
        else if (!strcmp(a, "--membw")) {
            if (!tdm_cli_parse_double(v, 0.1, 1e5, &o->membw))
                return usage_error(prog, "--membw wants GB/s > 0", v);
        } else if (!strcmp(a, "--efficiency")) {
            if (!tdm_cli_parse_double(v, 0.01, 1.5, &o->efficiency))
                return usage_error(prog, "--efficiency wants 0.01..1.5", v);
        } else if (!strcmp(a, "--zipf")) {
            if (!tdm_cli_parse_double(v, 0, 10, &o->zipf_s))
                return usage_error(prog, "--zipf wants a skew 0..10", v);
        } else if (!strcmp(a, "--vram-gbps")) {
            if (!tdm_cli_parse_double(v, 1, 1e5, &o->vram_gbps))
                return usage_error(prog, "--vram-gbps wants GB/s", v);
        } else if (!strcmp(a, "--vram-efficiency")) {
            if (!tdm_cli_parse_double(v, 0.01, 1, &o->vram_eff))
                return usage_error(prog, "--vram-efficiency wants 0.01..1", v);
        } else if (!strcmp(a, "--latency-us")) {
            if (!tdm_cli_parse_double(v, 0, 1e5, &o->latency_us))
                return usage_error(prog, "--latency-us wants microseconds >= 0", v);
        } else if (!strcmp(a, "--reserve-gib")) {
            if (!tdm_cli_parse_double(v, 0, 4096, &o->reserve_gib))
                return usage_error(prog, "--reserve-gib wants GiB >= 0", v);
        } else if (!strcmp(a, "--ctx")) {
            double c;
            if (!tdm_cli_parse_double(v, 1, 1 << 24, &c))
                return usage_error(prog, "--ctx wants 1..16M tokens", v);
            o->n_ctx = (int)c;
        } else if (!strcmp(a, "--probe-mib")) {
            double mib;
            if (!tdm_cli_parse_double(v, 1, 1 << 20, &mib))
                return usage_error(prog, "--probe-mib wants MiB >= 1", v);
            o->probe_bytes = (size_t)(mib * (1 << 20));
        } else if (!strcmp(a, "--decode-ctx")) {
            double c;
            if (!tdm_cli_parse_double(v, 0, 1 << 24, &c))
                return usage_error(prog, "--decode-ctx wants 0..16M tokens", v);
            o->decode_ctx = (int)c;
        } else if (!strcmp(a, "--vram")) {
            if ((o->n_vram = parse_gib_list(v, o->vram, TDM_PROJ_GRID_MAX)) < 1)
                return usage_error(prog, "--vram wants up to 8 sizes in GiB, e.g. 8,12,16,24", v);
        } else {
            takes = false;
        }
        if (!takes)
            return usage_error(prog, "unknown option", a);
        i++;
    }
    if (o->model && o->preset)
        return usage_error(prog, "give one of -m MODEL and --preset NAME, not both", NULL);
    if (!o->model && !o->preset && !(o->model = default_model))
        return usage_error(prog, "give -m MODEL or --preset NAME", NULL);
    return 0;
}

static tdm_status load_model(const proj_opts *o, tdm_proj_model *m, tdm_error *err)
{
    if (o->preset)
        return tdm_proj_model_preset(o->preset, m, err);
    tdm_gguf *g;
    tdm_status st = tdm_gguf_open(o->model, &g, err);
    if (st)
        return st;
    const char *base = strrchr(o->model, '/');
    st = tdm_proj_model_from_gguf(g, base ? base + 1 : o->model, m, err);
    tdm_gguf_free(g);
    return st;
}

static tdm_status run(const proj_opts *o, tdm_error *err)
{
    tdm_proj_model m;
    tdm_proj_hitcurve h;
    tdm_proj_grid g; /* 8.5 kB */
    tdm_status st = load_model(o, &m, err);
    if (st)
        return st;
    st = o->curve ? tdm_proj_hitcurve_load(o->curve, o->policy, &m, &h, err)
                  : tdm_proj_hitcurve_zipf(o->zipf_s, m.n_expert, &h, err);
    if (st)
        return st;
    tdm_proj_grid_default(&m, &g);
    if (o->n_vram) {
        g.n_vram = o->n_vram;
        memcpy(g.vram_gib, o->vram, sizeof o->vram);
    }
    if (o->efficiency > 0) {
        g.base.efficiency = o->efficiency;
        snprintf(g.efficiency_source, sizeof g.efficiency_source, "user");
    }
    if (o->vram_gbps > 0)
        g.base.vram_gbps = o->vram_gbps;
    if (o->vram_eff > 0)
        g.base.vram_efficiency = o->vram_eff;
    if (o->latency_us >= 0)
        g.base.latency_us = o->latency_us;
    if (o->n_ctx > 0) {
        g.n_ctx = o->n_ctx;
        g.base.reserve_bytes = tdm_proj_reserve_bytes(&m, o->n_ctx);
    }
    if (o->decode_ctx >= 0)
        g.base.decode_ctx = o->decode_ctx;
    if (o->reserve_gib >= 0)
        g.base.reserve_bytes = (uint64_t)(o->reserve_gib * 1024.0 * 1024.0 * 1024.0);
    if (o->membw > 0 && (st = tdm_proj_grid_add_dram(&g, o->membw_name ? o->membw_name : "measured",
                                                     o->membw, true, err)))
        return st;
    if (o->measure && !(o->membw > 0)) {
        tdm_proj_host host;
        if ((st = tdm_proj_measure_host(o->probe_bytes, &host, err)))
            return st;
        if (!o->quiet)
            tdm_proj_host_print(stdout, &host);
        if ((st = tdm_proj_grid_add_dram(&g, o->membw_name ? o->membw_name : "this host (probe)",
                                         host.read_gbps, true, err)))
            return st;
        /* the measured kernel efficiency belongs to this host's row; the
         * preset rows keep --efficiency or the default */
        g.dram[g.n_dram - 1].efficiency = o->efficiency > 0 ? o->efficiency : host.efficiency;
    }
    if ((st = tdm_proj_grid_run(&m, &h, &g, err)))
        return st;
    if (!o->quiet)
        tdm_proj_grid_print(stdout, &m, &h, &g);
    if (o->json) {
        if ((st = tdm_proj_json_write(o->json, &m, &h, &g, err)))
            return st;
        if (!o->quiet)
            printf("wrote %s\n", o->json);
    }
    return TDM_OK;
}

const char tdm_proj_cli_usage[] =
    "  -m, --model FILE       GGUF file (byte accounting from its tensors)\n"
    "  --preset NAME          instead of a file: qwen35-35b-a3b | qwen3next-80b-a3b | qwen3-30b-a3b\n"
    "                         | demo (published shapes, llama-quantize Q4_K_M type mix)\n"
    "  --membw GBPS           add a row for this host bandwidth (probe read GB/s)\n"
    "  --measure, --no-measure  run the bandwidth probe for that row and the efficiency\n"
    "                         (default: on for tandem bench --project, off for tools/ddr)\n"
    "  --probe-mib N          probe buffer size (default 1024)\n"
    "  --membw-name NAME      label of that row (default \"measured\")\n"
    "  --efficiency F         pool GB/s / probe read GB/s (default 0.80)\n"
    "  --hit-curve FILE       hit rates: tandem expert profile, cachesim JSON or CSV\n"
    "  --policy NAME          which policy of a multi-policy curve (default: the first)\n"
    "  --zipf S               Zipf skew of the model curve when no file (default 0.50)\n"
    "  --vram LIST            VRAM sizes in GiB (default 8,12,16,24)\n"
    "  --vram-gbps G          VRAM bandwidth (default 448) --vram-efficiency F: the fraction the\n"
    "                         GPU kernels reach (default 0.50, an assumption; H200 measured 0.106)\n"
    "  --latency-us U         hand-off cost per layer with a CPU share (default 10)\n"
    "  --ctx N                context the KV reserve is sized for (default 8192)\n"
    "  --decode-ctx N         KV tokens a decoded token reads (default 4096)\n"
    "  --reserve-gib G        override the whole reserve (KV + state + scratch)\n"
    "  --json FILE            write the tandem-projection JSON\n"
    "  --quiet                no table\n";

int tdm_proj_cli_run(int argc, char **argv, const char *prog, const char *default_model,
                     bool measure)
{
    proj_opts o = {.zipf_s = TDM_PROJ_DEFAULT_ZIPF_S, .latency_us = -1, .reserve_gib = -1,
                   .decode_ctx = -1, .measure = measure};
    int rc = parse_opts(argc, argv, prog, default_model, &o);
    if (rc == -1) {
        printf("usage: %s [options]\n%s", prog, tdm_proj_cli_usage);
        return 0;
    }
    if (rc)
        return rc;
    tdm_error err = {0};
    if (run(&o, &err) != TDM_OK) {
        fprintf(stderr, "%s: %s\n", prog, err.msg);
        return 1;
    }
    return 0;
}
