/* bench_bound: the measured inputs and the arithmetic of the decode bound of
 * DESIGN.md §5 for the hybrid path (`tandem bench`, bench/gpu_decode):
 *
 *   bound tok/s = 1 / max(cpu_bytes / B_dram, gpu_bytes / B_vram)
 *
 * B_dram: the bandwidth probe's median read GB/s with exactly the pool's
 * thread count, pinned as the pool pins (thread i -> physical core i);
 * B_vram: the device-to-device copy GB/s of the GPU (read + write counted).
 * No efficiency factor: the bound is what the buses allow, the measured speed
 * is reported as a fraction of it.
 *
 * The probes allocate (1 GiB by default) and free before returning; the host
 * probe pins the calling process's OpenMP threads (run it after the timed
 * work). The arithmetic is pure. No global state.
 */
#ifndef TDM_BENCH_BOUND_H
#define TDM_BENCH_BOUND_H

#include <stdbool.h>
#include <stddef.h>

#include "gpu.h"
#include "projection.h"
#include "status.h"

/* Median device copy GB/s over `repeats` timings of 10 copies of `bytes`
 * between two buffers allocated (and released) through g; counts the bytes
 * read and written (2 x bytes per copy). bytes 0: 1 GiB; repeats 0: 7. */
tdm_status tdm_bench_vram_gbps(tdm_gpu *g, size_t bytes, int repeats, double *gbps, tdm_error *err);

/* Median read GB/s of the membw probe with `threads` pinned threads over
 * `bytes` (0: the probe's default). TDM_ERR_INVALID when threads exceeds the
 * physical cores (the probe refuses to share a core). */
tdm_status tdm_bench_dram_gbps(int threads, size_t bytes, double *gbps, tdm_error *err);

/* Bytes the GPU reads per decoded token when a share `hit` of the routed
 * expert bytes runs there: attention/DeltaNet, shared experts and head, the
 * f16 KV of `ctx` positions, the DeltaNet state read and written, and hit x
 * the active expert bytes: the same accounting as tdm_proj_predict's GPU side. */
double tdm_bench_gpu_bytes(const tdm_proj_model *m, double hit, double ctx);

typedef struct tdm_bench_bound {
    double t_cpu_s, t_gpu_s; /* per token, each side at its full bandwidth */
    double tok_s;            /* 1 / max(t_cpu, t_gpu); 0 when an input is missing */
    bool cpu_bound;          /* t_cpu >= t_gpu */
} tdm_bench_bound;

/* cpu_bytes / gpu_bytes per token, bandwidths in GB/s (1e9 B/s). A side with
 * no bytes costs nothing; a bandwidth <= 0 where bytes are needed gives tok_s 0. */
void tdm_bench_bound_compute(double cpu_bytes, double dram_gbps, double gpu_bytes, double vram_gbps,
                             tdm_bench_bound *out);

#endif
