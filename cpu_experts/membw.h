/* membw: host memory bandwidth probe, the bound every CPU-side decode speed
 * is reported against (DESIGN.md §5).
 *
 * tdm_membw_run() measures read-only, copy and triad bandwidth (STREAM
 * accounting: copy moves 2 arrays, triad 3; write-allocate traffic is not
 * counted) with N OpenMP threads, each pinned with hwloc to a distinct
 * physical core, over buffers far larger than the LLC (default 1 GiB in all),
 * each thread first-touching and then streaming its own slice.
 * tdm_membw_matvec() measures the rate at which the engine's own kernel
 * (tdm_matmul_rows, one token) streams expert-shaped quantised weights from a
 * buffer larger than the LLC, split by rows across the same pinned threads.
 * GB/s are 1e9 bytes per second. Timed repetitions give min/median/max.
 * The caller is the team's master and is pinned while a probe runs; its
 * binding is put back before return, so a probe between runs of the pool
 * leaves the caller's placement as it was (tandem bench probes around every
 * grid point). Everything allocated is freed before return; not for the
 * per-token path.
 */
#ifndef TDM_MEMBW_H
#define TDM_MEMBW_H

#include <stddef.h>
#include <stdint.h>

#include "quant.h"
#include "status.h"

typedef enum tdm_membw_kind {
    TDM_MEMBW_READ = 0,
    TDM_MEMBW_COPY,
    TDM_MEMBW_TRIAD,
    TDM_MEMBW_KIND_COUNT
} tdm_membw_kind;

typedef struct tdm_membw_stats {
    double min_gbs, median_gbs, max_gbs;
} tdm_membw_stats;

typedef struct tdm_membw_opts {
    size_t bytes; /* all buffers together (default 1 GiB; >= 1 MiB) */
    int threads;  /* pinned threads, <= physical cores (0 = all physical cores) */
    int repeats;  /* timed repetitions after one warm-up pass (default 7) */
} tdm_membw_opts;

typedef struct tdm_membw_result {
    int threads;
    size_t bytes;
    int repeats;
    tdm_membw_stats kind[TDM_MEMBW_KIND_COUNT]; /* by tdm_membw_kind */
    int has_matvec;                             /* matvec filled in (tools/membw --matvec) */
    tdm_qtype matvec_type;
    tdm_membw_stats matvec; /* GB/s of weights read by tdm_matmul_rows */
} tdm_membw_result;

void tdm_membw_opts_default(tdm_membw_opts *o);

/* Physical cores hwloc sees (>= 1; 1 when the topology cannot be read). */
int tdm_membw_physical_cores(void);

/* The thread counts of a default sweep: 1, 2, 4, ... below the physical
 * cores, then all of them; writes at most cap, returns how many. */
int tdm_membw_thread_ladder(int32_t *threads, int cap);

/* s as a new JSON object {"min", "median", "max"} (GB/s); the caller owns it. */
struct cJSON;
struct cJSON *tdm_membw_stats_json(const tdm_membw_stats *s);

const char *tdm_membw_kind_name(tdm_membw_kind k); /* "read", "copy", "triad" */

/* Fills out->kind[] (and threads/bytes/repeats). TDM_ERR_INVALID for bad
 * options (too many threads, bytes < 1 MiB, repeats < 1), TDM_ERR_OOM when
 * the buffers cannot be allocated. */
tdm_status tdm_membw_run(const tdm_membw_opts *o, tdm_membw_result *out, tdm_error *err);

typedef struct tdm_membw_matvec_opts {
    tdm_qtype type;     /* weight type (any with a CPU kernel) */
    int64_t rows, cols; /* one expert matrix, e.g. 768 x 2048 */
    size_t bytes;       /* total weight bytes, rotated over many matrices (default 1 GiB) */
    int threads;        /* as in tdm_membw_opts */
    int repeats;
} tdm_membw_matvec_opts;

/* Rate at which tdm_matmul_rows (active ISA, one token) reads the weights:
 * every repetition passes once over all matrices, each matrix split by rows
 * across the threads. TDM_ERR_INVALID for a type without a kernel or cols not
 * a multiple of its block, TDM_ERR_OOM when allocation fails. */
tdm_status tdm_membw_matvec(const tdm_membw_matvec_opts *o, tdm_membw_stats *out, tdm_error *err);

/* Read GB/s of `threads` pinned threads (as tdm_membw_run) over memory that
 * already holds data, e.g. the model's expert copy that the CPU pool reads
 * (tandem bench's B_dram): `bytes` of the region per pass (0 or more than
 * region_bytes: all of it) as 64 evenly spaced pieces, so that a pass
 * samples the whole region rather than its first bytes; each thread
 * streams its share of every piece. One untimed pass, then `repeats` timed
 * ones. Reads only.
 * TDM_ERR_INVALID for a base not 64-byte aligned, too few bytes for the
 * pieces, repeats < 1 or too many threads. */
tdm_status tdm_membw_read_region(const void *base, size_t region_bytes, size_t bytes, int threads, int repeats,
                                 tdm_membw_stats *out, tdm_error *err);

/* Writes results[0..n-1] as JSON to path:
 * {"host": str, "units": "GB/s", "bytes": int, "repeats": int,
 *  "results": [{"threads": int, "read": {"min","median","max"}, "copy": {...},
 *               "triad": {...}, ["matvec": {"type": str, "min","median","max"}]}]} */
tdm_status tdm_membw_write_json(const char *path, const tdm_membw_result *results, int n,
                                tdm_error *err);

#endif
