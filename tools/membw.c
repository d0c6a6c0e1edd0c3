/* membw: host memory bandwidth per thread count (read / copy / triad,
 * min / median / max GB/s), optionally next to the rate the engine's matvec
 * kernel streams expert-shaped weights; table on stdout, JSON with --json.
 *
 *   membw [--bytes SIZE] [--threads 1,2,4,..] [--repeats N]
 *         [--matvec TYPE [--shape ROWSxCOLS]] [--json FILE]
 *
 * SIZE accepts K/M/G suffixes (binary). Default: 1G, threads 1,2,4,... and
 * all physical cores, 7 repeats, no matvec. The ISA is the engine's default
 * (TDM_ISA=scalar|avx2|avx512 overrides).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kernels.h"
#include "membw.h"

static void usage(void)
{
    fprintf(stderr, "usage: membw [--bytes SIZE] [--threads 1,2,4] [--repeats N]\n"
                    "             [--matvec TYPE [--shape ROWSxCOLS]] [--json FILE]\n");
}

int main(int argc, char **argv)
{
    tdm_membw_opts o;
    tdm_membw_opts_default(&o);
    int32_t threads[64];
    int nthreads = 0, mv_type = -1;
    uint64_t bytes = 0;
    long long rows = 768, cols = 2048;
    const char *json = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(a, "--bytes") && v)
            bad = !tdm_cli_parse_size(v, &bytes) || bytes == 0, o.bytes = (size_t)bytes, i++;
        else if (!strcmp(a, "--threads") && v)
            bad = (nthreads = tdm_cli_parse_int_list(v, threads, 64, 1, 4096)) < 1, i++;
        else if (!strcmp(a, "--repeats") && v)
            bad = (o.repeats = atoi(v)) < 1, i++;
        else if (!strcmp(a, "--matvec") && v)
            bad = (mv_type = tdm_qtype_from_name(v)) < 0, i++;
        else if (!strcmp(a, "--shape") && v)
            bad = sscanf(v, "%lldx%lld", &rows, &cols) != 2, i++;
        else if (!strcmp(a, "--json") && v)
            json = v, i++;
        else
            bad = 1;
        if (bad) {
            fprintf(stderr, "membw: bad argument %s%s%s\n", a, v ? " " : "", v ? v : "");
            usage();
            return 2;
        }
    }
    int ncores = tdm_membw_physical_cores();
    if (!nthreads)
        nthreads = tdm_membw_thread_ladder(threads, 64);
    tdm_membw_result *res = calloc((size_t)nthreads, sizeof *res);
    printf("membw: %d physical cores, %.0f MiB, %d repeats, ISA %s (GB/s = 1e9 B/s; min / median / max)\n",
           ncores, (double)o.bytes / (1 << 20), o.repeats, tdm_cpu_isa_name(tdm_cpu_isa_active()));
    printf("%7s  %-22s  %-22s  %-22s", "threads", "read", "copy", "triad");
    if (mv_type >= 0)
        printf("  %-8s %lldx%lld median  ratio", tdm_qtype_name((uint32_t)mv_type), rows, cols);
    printf("\n");
    for (int i = 0; i < nthreads; i++) {
        tdm_error err;
        o.threads = threads[i];
        if (tdm_membw_run(&o, &res[i], &err) != TDM_OK) {
            fprintf(stderr, "%s\n", err.msg);
            free(res);
            return 1;
        }
        printf("%7d", res[i].threads);
        for (int k = 0; k < TDM_MEMBW_KIND_COUNT; k++)
            printf("  %6.1f / %6.1f / %6.1f", res[i].kind[k].min_gbs, res[i].kind[k].median_gbs,
                   res[i].kind[k].max_gbs);
        if (mv_type >= 0) {
            tdm_membw_matvec_opts mo = {(tdm_qtype)mv_type, rows, cols, o.bytes, threads[i], o.repeats};
            if (tdm_membw_matvec(&mo, &res[i].matvec, &err) != TDM_OK) {
                fprintf(stderr, "\n%s\n", err.msg);
                free(res);
                return 1;
            }
            res[i].has_matvec = 1;
            res[i].matvec_type = (tdm_qtype)mv_type;
            printf("  %24.1f  %5.2f", res[i].matvec.median_gbs,
                   res[i].matvec.median_gbs / res[i].kind[TDM_MEMBW_READ].median_gbs);
        }
        printf("\n");
        fflush(stdout);
    }
    if (json) {
        tdm_error err;
        if (tdm_membw_write_json(json, res, nthreads, &err) != TDM_OK) {
            fprintf(stderr, "%s\n", err.msg);
            free(res);
            return 1;
        }
        printf("wrote %s\n", json);
    }
    free(res);
    return 0;
}
