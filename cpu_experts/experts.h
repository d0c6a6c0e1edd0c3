/* experts: the routed-expert computation on the CPU (the OpenMP expert pool).
 *
 * Given one layer's stacked expert matrices (plain pointers, types, strides)
 * and a list of (token, expert, weight) selections, computes for every token
 *     out[t] (+)= sum over its selections s of  s.weight * down_e( silu(gate_e x_t) * up_e x_t )
 * on the quantised weights (cpu_experts/kernels.h). Every thread owns the
 * same share of every expert's rows (tdm_experts_share), cut into row-block
 * items; it computes its own items first and then takes the items the others
 * have not started, so all threads finish together whether one expert or many
 * are involved, and a thread reads the rows its core read last time (or that
 * a warm-up read there). Each expert's rows are multiplied against all of its
 * tokens at once (prefill reads each expert once).
 *
 * It knows nothing of the forward pass: the forward uses it for the routed and
 * shared experts, the hybrid executor for the experts that miss the GPU cache.
 * All memory comes from a scratch made once for the worst case; a call never
 * allocates. Results are deterministic: each token's terms are added in the
 * order its selections appear in the list.
 *
 * Threading: tdm_experts_run opens its own OpenMP parallel region (call it
 * from outside one); tdm_experts_run_team runs on a caller's persistent
 * thread team instead (the CPU expert pool: no fork/join and no OpenMP wait
 * policy per job). Both run one worker, so their results are bit-identical
 * for any thread count. A scratch serves one call at a time.
 */
#ifndef TDM_EXPERTS_H
#define TDM_EXPERTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "quant.h"
#include "status.h"
#include "topology.h"

typedef struct tdm_experts_desc {
    const void *gate;      /* expert 0's gate matrix [n_ff][n_embd]; expert e at gate + e*gate_stride */
    const void *up;        /* expert 0's up matrix [n_ff][n_embd] */
    const void *down;      /* expert 0's down matrix [n_embd][n_ff] */
    tdm_qtype gate_type, up_type, down_type;
    size_t gate_stride, up_stride, down_stride; /* bytes between experts (0 for a single expert) */
    int64_t n_embd;        /* model width (gate/up row length, down rows) */
    int64_t n_ff;          /* expert width (gate/up rows, down row length) */
    int32_t n_expert;      /* valid expert ids are 0..n_expert-1 */
} tdm_experts_desc;

typedef struct tdm_expert_sel {
    int32_t token;         /* row of x / out */
    int32_t expert;
    float weight;          /* multiplies the expert's output */
} tdm_expert_sel;

typedef struct tdm_experts_scratch tdm_experts_scratch;

/* Scratch for calls with n_embd <= max_embd, n_ff <= max_ff, n_tok <= max_tok,
 * n_sel <= max_sel and n_expert <= max_expert. */
tdm_status tdm_experts_scratch_new(int64_t max_embd, int64_t max_ff, int32_t max_tok, int32_t max_sel,
                                   int32_t max_expert, tdm_experts_scratch **out, tdm_error *err);
void tdm_experts_scratch_free(tdm_experts_scratch *s);
/* Bytes held by the scratch. */
size_t tdm_experts_scratch_bytes(const tdm_experts_scratch *s);

/* x: [n_tok][n_embd] activations, out: [n_tok][n_embd]. With accumulate the
 * result is added to out, otherwise out is overwritten (tokens without any
 * selection get 0). TDM_ERR_INVALID (nothing written) when a size exceeds the
 * scratch or a selection names a token/expert out of range. */
tdm_status tdm_experts_run(const tdm_experts_desc *d, const float *x, int32_t n_tok, const tdm_expert_sel *sel,
                           int32_t n_sel, float *out, bool accumulate, tdm_experts_scratch *s, tdm_error *err);

/* A thread team the caller owns. run starts fn on every thread of the team,
 * the caller being thread 0, and returns once all have returned; fn gets its
 * thread id and the team's size (nth). barrier returns once all nth threads
 * of the running fn have entered it; it orders memory like a release by each
 * thread followed by an acquire. */
typedef struct tdm_team tdm_team;
struct tdm_team {
    int nth;
    void (*run)(tdm_team *team, void (*fn)(void *arg, int tid, int nth), void *arg);
    void (*barrier)(tdm_team *team);
};

/* Most threads a team may have: the schedule keeps one item counter per
 * thread in the scratch. */
#define TDM_EXPERTS_MAX_TEAM 1024

/* The rows [*r0, *r1) of a matrix of `rows` rows that thread tid of a team of
 * nth owns in every expert of a call: nth contiguous shares that start at
 * multiples of 4 rows and tile [0, rows) (some may be empty). A thread reading
 * its share of an expert ahead of a call (the pool's warm-up) leaves those
 * rows in the caches of the core that will compute them. */
void tdm_experts_share(int64_t rows, int tid, int nth, int64_t *r0, int64_t *r1);

/* tdm_experts_run on the team (called on its thread 0 only; the checks and
 * the bookkeeping run there before the team starts; a tiny call runs there
 * alone, without starting the team). TDM_ERR_INVALID for a team of more than
 * TDM_EXPERTS_MAX_TEAM threads. run may start fewer threads than nth (the
 * others' shares are then taken by those running). */
tdm_status tdm_experts_run_team(tdm_team *team, const tdm_experts_desc *d, const float *x, int32_t n_tok,
                                const tdm_expert_sel *sel, int32_t n_sel, float *out, bool accumulate,
                                tdm_experts_scratch *s, tdm_error *err);

#endif
