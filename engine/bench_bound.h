/* bench_bound: the measured inputs and the arithmetic of the decode bound of
 * DESIGN.md §5 for the hybrid path (`tandem bench`, bench/gpu_decode):
 *
 *   bus bound tok/s = 1 / max(cpu_bytes / B_dram, gpu_bytes / B_vram)
 *   §5 bound tok/s  = 1 / max(cpu_bytes / B_dram, gpu_bytes / B_vram + S x t_stage)
 *
 * B_dram: the bandwidth probe's median read GB/s with exactly the pool's
 * thread count, pinned as the pool pins (thread i -> physical core i);
 * B_vram: the device-to-device copy GB/s of the GPU (read + write counted).
 * The second form adds §5's per-layer latency: S, the matrix products on a
 * token's dependency chain, each of which needs the whole vector the one
 * before made (tdm_bench_token_stages: a property of the model, not of this
 * engine's launches), times t_stage, what one such dependent stage costs on
 * the device (tdm_bench_stage_us: a chain of minimal stages, no weights).
 * No efficiency factor: the bound is what the buses and the device's
 * dependency latency allow; the measured speed is reported as a fraction.
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

/* Median time of one dependent stage in microseconds: a CUDA graph of a chain
 * of stages (gpu_fwd.h tdm_gpu_stage_chain) replayed after a warm-up,
 * `repeats` timings (0: 7). Two small buffers through g, released before
 * returning. TDM_ERR_UNSUPPORTED in builds without CUDA. */
tdm_status tdm_bench_stage_us(tdm_gpu *g, int repeats, double *us, tdm_error *err);

/* The dependent stages of one decoded token: per MoE layer five products
 * (the mixer's inputs, its output, the router, gate|up, down), per dense
 * layer four, and the head's one. The norms, the mixer itself (per head),
 * the top-k and the token's choice are not counted: each needs only a head's
 * or a small vector's worth and can ride inside a neighbouring launch, so the
 * count stays a lower bound on any implementation's chain. */
int64_t tdm_bench_token_stages(const tdm_proj_model *m);

/* Median read GB/s of the membw probe with `threads` pinned threads, `bytes`
 * per pass (0: the probe's default, 1 GiB): over region (region_bytes of
 * memory the caller owns, e.g. tdm_model_experts_memory: what the CPU pool
 * reads; tdm_membw_read_region), or over fresh buffers when region is NULL
 * (tdm_membw_run). TDM_ERR_INVALID when threads exceeds the physical cores
 * (the probe refuses to share a core). */
tdm_status tdm_bench_dram_gbps(int threads, size_t bytes, const void *region, size_t region_bytes, double *gbps,
                               tdm_error *err);

/* Bytes the GPU reads per decoded token when a share `hit` of the routed
 * expert bytes runs there: attention/DeltaNet, shared experts and head, the
 * f16 KV of `ctx` positions, the DeltaNet state read and written, and hit x
 * the active expert bytes: the same accounting as tdm_proj_predict's GPU side. */
double tdm_bench_gpu_bytes(const tdm_proj_model *m, double hit, double ctx);

typedef struct tdm_bench_bound {
    double t_cpu_s, t_gpu_s; /* per token, each side at its full bandwidth */
    double t_latency_s;      /* per token: dependent stages x stage time; 0 when not measured */
    double tok_s;            /* bus bound: 1 / max(t_cpu, t_gpu); 0 when an input is missing */
    double tok_s_latency;    /* §5 bound: 1 / max(t_cpu, t_gpu + t_latency); 0 without t_latency */
    bool cpu_bound;          /* t_cpu >= t_gpu */
    bool cpu_bound_latency;  /* t_cpu >= t_gpu + t_latency */
} tdm_bench_bound;

/* cpu_bytes / gpu_bytes per token, bandwidths in GB/s (1e9 B/s), latency_s
 * the GPU side's dependent stages per token in seconds (<= 0: not measured,
 * tok_s_latency 0). A side with no bytes costs nothing (the GPU side's latency
 * counts only when it reads); a bandwidth <= 0 where bytes are needed gives
 * both bounds 0. */
void tdm_bench_bound_compute(double cpu_bytes, double dram_gbps, double gpu_bytes, double vram_gbps,
                             double latency_s, tdm_bench_bound *out);

#endif
