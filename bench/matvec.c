/* bench/matvec: GB/s of expert weights streamed by the engine's CPU matvec
 * kernel (tdm_matmul_rows, one token, default ISA) per thread count, next to
 * the read bandwidth measured in the same run at the same thread count.
 * Expert shapes of Qwen3-30B-A3B / Qwen3.5-35B-A3B: gate/up 768x2048 and
 * 512x2048, down 2048x768 and 2048x512; types Q4_K, Q6_K, Q8_0, IQ4_XS and the
 * K-quants of the Q2_K..Q5_K_M files (Q2_K, Q3_K, Q5_K). Many
 * distinct matrices (1 GiB of weights by default) are rotated so the working
 * set is far beyond the LLC. Threads: OpenMP, pinned one per physical core.
 *
 *   matvec [--bytes SIZE] [--threads 1,2,4] [--repeats N] [--out FILE]
 *
 * Table on stdout; JSON to bench/results/matvec-<hostname>.json (or --out).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "bench_json.h"
#include "cli.h"
#include "kernels.h"
#include "membw.h"

typedef struct shape {
    const char *name;
    int64_t rows, cols;
} shape;

static const shape k_shapes[] = {
    {"gate/up 768x2048", 768, 2048},
    {"gate/up 512x2048", 512, 2048},
    {"down 2048x768", 2048, 768},
    {"down 2048x512", 2048, 512},
};
static const tdm_qtype k_types[] = {TDM_Q_Q4_K, TDM_Q_Q6_K, TDM_Q_Q8_0, TDM_Q_IQ4_XS, TDM_Q_Q2_K, TDM_Q_Q3_K, TDM_Q_Q5_K};
#define N_SHAPES (int)(sizeof k_shapes / sizeof k_shapes[0])
#define N_TYPES (int)(sizeof k_types / sizeof k_types[0])

int main(int argc, char **argv)
{
    uint64_t bytes = (uint64_t)1 << 30;
    int32_t threads[64];
    int repeats = 5, nthreads = 0, bad = argc % 2 == 0;
    const char *out = NULL;
    for (int i = 1; i + 1 < argc && !bad; i += 2) {
        if (!strcmp(argv[i], "--bytes"))
            bad = !tdm_cli_parse_size(argv[i + 1], &bytes);
        else if (!strcmp(argv[i], "--repeats"))
            repeats = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--out"))
            out = argv[i + 1];
        else if (!strcmp(argv[i], "--threads"))
            bad = (nthreads = tdm_cli_parse_int_list(argv[i + 1], threads, 64, 1, 4096)) < 1;
        else
            bad = 1;
    }
    if (bad || bytes < (1u << 20) || repeats < 1) {
        fprintf(stderr, "usage: matvec [--bytes SIZE] [--threads 1,2,4] [--repeats N] [--out FILE]\n");
        return 2;
    }
    int ncores = tdm_membw_physical_cores();
    if (!nthreads)
        nthreads = tdm_membw_thread_ladder(threads, 64);
    char host[256] = "unknown", path[512];
    gethostname(host, sizeof host - 1);
    if (!out) {
        const char *root = getenv("TDM_ROOT");
        snprintf(path, sizeof path, "%s/bench/results/matvec-%s.json", root ? root : ".", host);
        out = path;
    }
    const char *isa = tdm_cpu_isa_name(tdm_cpu_isa_active());
    printf("== bench/matvec: %s, ISA %s, %d physical cores, %.0f MiB of weights, %d repeats (median GB/s)\n",
           host, isa, ncores, (double)bytes / 1048576.0, repeats);
    printf("%7s %8s  %-18s %8s %8s %7s\n", "threads", "read", "shape", "type", "matvec", "ratio");

    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "bench", "matvec");
    cJSON_AddStringToObject(root, "host", host);
    cJSON_AddStringToObject(root, "isa", isa);
    cJSON_AddStringToObject(root, "units", "GB/s of weights read (1e9 B/s)");
    cJSON_AddNumberToObject(root, "weight_bytes", (double)bytes);
    cJSON_AddNumberToObject(root, "repeats", repeats);
    cJSON *arr = cJSON_AddArrayToObject(root, "results");
    int rc = 0;
    for (int ti = 0; ti < nthreads && !rc; ti++) {
        tdm_membw_opts o = {bytes, threads[ti], repeats};
        tdm_membw_result r;
        tdm_error err;
        if (tdm_membw_run(&o, &r, &err) != TDM_OK) {
            fprintf(stderr, "matvec: %s\n", err.msg);
            rc = 1;
            break;
        }
        double read = r.kind[TDM_MEMBW_READ].median_gbs;
        cJSON *row = cJSON_CreateObject();
        cJSON_AddNumberToObject(row, "threads", threads[ti]);
        cJSON_AddItemToObject(row, "read", tdm_membw_stats_json(&r.kind[TDM_MEMBW_READ]));
        cJSON *mv = cJSON_AddArrayToObject(row, "matvec");
        for (int t = 0; t < N_TYPES && !rc; t++) {
            for (int s = 0; s < N_SHAPES; s++) {
                tdm_membw_matvec_opts mo = {k_types[t], k_shapes[s].rows, k_shapes[s].cols, bytes,
                                            threads[ti], repeats};
                tdm_membw_stats st;
                if (tdm_membw_matvec(&mo, &st, &err) != TDM_OK) {
                    fprintf(stderr, "matvec: %s\n", err.msg);
                    rc = 1;
                    break;
                }
                printf("%7d %8.1f  %-18s %8s %8.1f %7.2f\n", threads[ti], read, k_shapes[s].name,
                       tdm_qtype_name(k_types[t]), st.median_gbs, st.median_gbs / read);
                fflush(stdout);
                cJSON *e = tdm_membw_stats_json(&st);
                cJSON_AddStringToObject(e, "type", tdm_qtype_name(k_types[t]));
                cJSON_AddNumberToObject(e, "rows", (double)k_shapes[s].rows);
                cJSON_AddNumberToObject(e, "cols", (double)k_shapes[s].cols);
                cJSON_AddNumberToObject(e, "ratio_to_read", st.median_gbs / read);
                cJSON_AddItemToArray(mv, e);
            }
        }
        cJSON_AddItemToArray(arr, row);
    }
    return bench_write_json(root, out) ? 1 : rc;
}
