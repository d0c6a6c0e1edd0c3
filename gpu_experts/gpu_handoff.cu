/* gpu_handoff: publish / merge kernels of the hybrid executor and the
 * expert-slot device (see gpu_handoff.h). */
#include "gpu_common.cuh"
#include "gpu_handoff.h"

#include <stdlib.h>
#include <string.h>

#define HANDOFF_THREADS 256
#define HANDOFF_MAX_BLOCKS 64

/* How many selections of the layer have no slot (an id out of range counts
 * as a miss, so the pool reports it). Every block evaluates it itself; the
 * block-wide counts keep the hand-off kernels free of shared memory. */
__device__ int layer_misses(const tdm_gpu_handoff &h, int32_t layer, const int32_t *ids, int n)
{
    int miss = 0;
    for (int i0 = 0; i0 < n; i0 += blockDim.x) {
        const int i = i0 + threadIdx.x;
        const int32_t e = i < n ? ids[i] : 0;
        miss += __syncthreads_count(i < n && (e < 0 || e >= h.n_expert ||
                                              h.slot_of[(int64_t)layer * h.n_expert + e] < 0));
    }
    return miss;
}

/* Block 0, thread 0: each token's selections, those of o.last's experts
 * after the others (each group in its order), into o.ids / o.weights. */
__device__ void route_order(const tdm_gpu_route_order &o, const int32_t *ids, const float *w, int ntok, int k)
{
    const int nl = o.last[0] < 0 ? 0 : o.last[0] > TDM_GPU_HINT_MAX ? TDM_GPU_HINT_MAX : o.last[0];
    for (int t = 0; t < ntok; t++) {
        int at = t * k;
        for (int pass = 0; pass < 2; pass++)
            for (int i = t * k; i < (t + 1) * k; i++) {
                bool late = false;
                for (int j = 0; j < nl; j++)
                    late |= ids[i] == o.last[1 + j];
                if (late == (pass == 1)) {
                    o.ids[at] = ids[i];
                    o.weights[at++] = w[i];
                }
            }
    }
}

__global__ void __launch_bounds__(HANDOFF_THREADS)
    publish_kernel(tdm_gpu_handoff h, int32_t layer, const float *__restrict__ x, const int32_t *__restrict__ ids,
                   const float *__restrict__ w, int32_t ntok, int direct, tdm_gpu_route_order order)
{
    tdm_pdl_enter();
    const int nk = ntok * h.k, quota = direct ? *h.quota : 0;
    if (order.last && blockIdx.x == 0 && threadIdx.x == 0) /* the other blocks read ids only (for the count) */
        route_order(order, ids, w, ntok, h.k);
    if (layer_misses(h, layer, ids, nk) <= (quota > 0 ? quota : 0)) { /* the GPU computes every selection */
        if (blockIdx.x == 0 && threadIdx.x == 0)
            h.state[TDM_GPU_HANDOFF_CUR] = 0;
        return;
    }
    const int64_t nx = (int64_t)ntok * h.n_embd;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < nx; i += stride)
        h.x[i] = x[i];
    if (blockIdx.x == 0) {
        /* the selections in the new order when there is one (thread 0 wrote
         * it before layer_misses' barriers; plain loads, not the read-only path) */
        const int32_t *pi = order.last ? order.ids : ids;
        const float *pw = order.last ? order.weights : w;
        for (int i = threadIdx.x; i < nk; i += blockDim.x) {
            const int32_t e = pi[i];
            const bool held = e >= 0 && e < h.n_expert && h.slot_of[(int64_t)layer * h.n_expert + e] >= 0;
            h.ids[i] = held ? e | h.held_bit : e;
            h.weights[i] = pw[i];
        }
        if (threadIdx.x == 0) {
            *h.layer = layer;
            *h.n_tok = ntok;
            *h.direct = quota > 0 ? quota : 0;
        }
    }
    /* The last block to finish its share bumps the job number, after every
     * block's writes are visible to the host (fence, then count). */
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x != 0)
        return;
    const unsigned done = atomicAdd(&h.state[TDM_GPU_HANDOFF_ARRIVED], 1u);
    if (done != gridDim.x - 1)
        return;
    __threadfence_system();
    h.state[TDM_GPU_HANDOFF_ARRIVED] = 0;
    const uint32_t seq = h.state[TDM_GPU_HANDOFF_SEQ] + 1;
    h.state[TDM_GPU_HANDOFF_SEQ] = seq;
    h.state[TDM_GPU_HANDOFF_CUR] = seq;
    *(volatile uint32_t *)h.dev_seq = seq;
    __threadfence_system();
}

__device__ __forceinline__ uint64_t global_ns(void)
{
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* Thread 0 of every block waits for the job; block 0 accounts the time. */
__global__ void __launch_bounds__(HANDOFF_THREADS)
    merge_kernel(tdm_gpu_handoff h, float *__restrict__ y, int32_t ntok, uint64_t timeout_ns)
{
    tdm_pdl_enter();
    const uint32_t seq = h.state[TDM_GPU_HANDOFF_CUR];
    if (seq == 0)
        return;
    int ready = 1; /* thread 0's verdict; the others agree through the block-wide AND */
    if (threadIdx.x == 0) {
        const uint64_t t0 = global_ns();
        uint64_t t = t0;
        ready = h.state[TDM_GPU_HANDOFF_TIMEOUTS] == 0; /* after one timeout, never wait again */
        while (ready && (int32_t)(*(volatile const uint32_t *)h.pool_seq - seq) < 0) {
            t = global_ns();
            if (t - t0 > timeout_ns) {
                ready = 0;
                break;
            }
            __nanosleep(200);
        }
        __threadfence_system();
        if (blockIdx.x == 0) {
            unsigned long long *wait = (unsigned long long *)&h.state[TDM_GPU_HANDOFF_WAIT_LO];
            atomicAdd(wait, (unsigned long long)(t - t0));
            if (!ready)
                atomicAdd(&h.state[TDM_GPU_HANDOFF_TIMEOUTS], 1u);
        }
    }
    if (!__syncthreads_and(ready))
        return;
    const volatile float *out = h.out;
    const int64_t n = (int64_t)ntok * h.n_embd;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] += out[i];
}

static tdm_status check(const tdm_gpu_handoff *h, int32_t ntok, tdm_error *err)
{
    TDM_REQUIRE(err, h && h->dev_seq && h->pool_seq && h->x && h->out && h->ids && h->weights && h->state &&
                         h->slot_of && h->layer && h->n_tok && h->direct,
                "gpu handoff: incomplete descriptor");
    TDM_REQUIRE(err, ntok >= 1 && ntok <= h->max_tok, "gpu handoff: %d tokens (mailbox holds %d)", ntok,
                h->max_tok);
    TDM_REQUIRE(err, h->k >= 1 && h->n_embd >= 1 && h->n_expert >= 1, "gpu handoff: k %d, n_embd %lld, n_expert %lld",
                h->k, (long long)h->n_embd, (long long)h->n_expert);
    return TDM_OK;
}

static unsigned grid_for(int64_t n)
{
    unsigned b = tdm_cdiv(n, HANDOFF_THREADS * 4);
    return b < 1 ? 1 : b > HANDOFF_MAX_BLOCKS ? HANDOFF_MAX_BLOCKS : b;
}

extern "C" tdm_status tdm_gpu_handoff_publish(tdm_gpu *g, const tdm_gpu_handoff *h, int32_t layer, const float *x,
                                              const int32_t *ids, const float *weights, int32_t ntok, bool direct,
                                              const tdm_gpu_route_order *order, tdm_error *err)
{
    tdm_status st = check(h, ntok, err);
    if (st)
        return st;
    TDM_REQUIRE(err, layer >= 0, "gpu handoff: layer %d", layer);
    TDM_REQUIRE(err, !direct || h->quota, "gpu handoff: direct share without a quota");
    TDM_REQUIRE(err, !order || (order->last && order->ids && order->weights), "gpu handoff: incomplete order");
    const tdm_gpu_route_order o = order ? *order : tdm_gpu_route_order{NULL, NULL, NULL};
    TDM_LAUNCH(err, g, publish_kernel, grid_for((int64_t)ntok * h->n_embd), HANDOFF_THREADS, 0, *h, layer, x, ids,
               weights, ntok, direct ? 1 : 0, o);
    return TDM_OK;
}

extern "C" tdm_status tdm_gpu_handoff_merge(tdm_gpu *g, const tdm_gpu_handoff *h, float *y, int32_t ntok,
                                            tdm_error *err)
{
    tdm_status st = check(h, ntok, err);
    if (st)
        return st;
    const double t = h->timeout_s > 0 ? h->timeout_s : 30.0;
    TDM_LAUNCH(err, g, merge_kernel, grid_for((int64_t)ntok * h->n_embd), HANDOFF_THREADS, 0, *h, y, ntok,
               (uint64_t)(t * 1e9));
    return TDM_OK;
}

extern "C" tdm_status tdm_gpu_download_rows_async(tdm_gpu *g, void *dst, size_t dst_pitch, const void *src,
                                            size_t src_pitch, size_t width, size_t rows, tdm_error *err)
{
    if (!rows || !width)
        return TDM_OK;
    TDM_CU(err, cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyDeviceToHost, g->stream));
    return TDM_OK;
}

extern "C" tdm_status tdm_gpu_copy_rows_async(tdm_gpu *g, void *dst, size_t dpitch, const void *src, size_t spitch,
                                              size_t width, size_t rows, tdm_error *err)
{
    if (!rows || !width)
        return TDM_OK;
    TDM_CU(err, cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDefault, g->copy_stream));
    return TDM_OK;
}

/* ---- decode prefetch ---- */

#define STAGE_THREADS 32
#define COPY_THREADS 256
#define COPY_BLOCKS 4 /* per matrix: 12 per staged expert; 8 measured slower (fewer SMs left to the layer) */
#define COPY_UNROLL 4
#define DIRECT_COPY_BLOCKS 16 /* per matrix: the direct share's copy has the GPU to itself */

/* The stage kernels run as one warp, lane i on selection i < k (k <= 32),
 * so their few dependent loads do not queue up one after another. */

/* How many lanes below this one have their bit set in mask. */
__device__ __forceinline__ int lane_rank(unsigned mask)
{
    return __popc(mask & ((1u << (threadIdx.x & 31)) - 1u));
}

/* Layer prev's entries that still point at p's spare slots back to -1
 * (prev < 0: none; lane j: spare slot j); its stage row stays, for the
 * statistics. The whole warp calls it. */
__device__ void unstage(const tdm_gpu_prefetch &p, int32_t prev)
{
    const int j = threadIdx.x & 31;
    if (prev >= 0 && j < p.n) {
        const int32_t e = p.stage[(int64_t)prev * p.n + j];
        if (e >= 0 && p.slot_of[prev * p.n_expert + e] == p.base + j)
            p.slot_of[prev * p.n_expert + e] = -1;
    }
    __syncwarp(); /* before any lane reads the table again */
}

/* The lanes with `take` set, in lane order, give their expert e the spare
 * slots (at most p.n); layer's stage row gets them, then -1. The whole warp
 * calls it. */
__device__ void stage_lanes(const tdm_gpu_prefetch &p, int32_t layer, int32_t e, bool take)
{
    const unsigned m = __ballot_sync(0xffffffffu, take);
    const int r = lane_rank(m), lane = threadIdx.x & 31, staged = __popc(m) < p.n ? __popc(m) : p.n;
    if (take && r < p.n) {
        p.slot_of[layer * p.n_expert + e] = p.base + r;
        p.stage[(int64_t)layer * p.n + r] = e;
    }
    if (lane >= staged && lane < p.n)
        p.stage[(int64_t)layer * p.n + lane] = -1;
}

/* The stage kernels' common start (the whole warp): layer prev's entries
 * back to -1, then lane i's selection sel[i] (-1 past k) into *e. False
 * when there is no layer to stage (layer < 0: clear only). */
__device__ bool stage_begin(const tdm_gpu_prefetch &p, int32_t layer, int32_t prev, const int32_t *__restrict__ sel,
                            int32_t k, int32_t *e)
{
    unstage(p, prev);
    if (layer < 0)
        return false;
    const int lane = threadIdx.x & 31;
    *e = lane < k ? sel[lane] : -1;
    return true;
}

/* One warp: the previous layer's staged entries back to -1, then the
 * layer's picks (an id predicted twice counts once, at its best rank);
 * then the pool's hint. write false: the hint alone (no entry cleared or
 * set, no stage row), for a prediction made before the staging may start. */
__global__ void __launch_bounds__(STAGE_THREADS) stage_kernel(tdm_gpu_prefetch p, int32_t layer, int32_t prev,
                                                              const int32_t *__restrict__ pred, int32_t k, bool write)
{
    tdm_pdl_enter();
    int32_t e;
    if (!stage_begin(p, layer, write ? prev : -1, pred, k, &e))
        return;
    const int lane = threadIdx.x;
    const int64_t E = p.n_expert;
    const bool first = __ffs(__match_any_sync(0xffffffffu, e)) - 1 == lane;
    const bool no_slot = first && e >= 0 && e < E && p.slot_of[layer * E + e] < 0;
    const unsigned fm = __ballot_sync(0xffffffffu, no_slot);
    if (write)
        stage_lanes(p, layer, e, no_slot);
    if (!p.hint_seq)
        return;
    /* the pool's share: what the prediction leaves without a slot, less the
     * direct share; its most likely experts, best first */
    const bool left = no_slot && lane_rank(fm) >= p.n;
    const unsigned lm = __ballot_sync(0xffffffffu, left);
    int want = __popc(lm) - (p.quota && *p.quota > 0 ? *p.quota : 0);
    want = want < p.hint_max ? want : p.hint_max;
    const int m = want > 0 ? want : 0, r = lane_rank(lm);
    if (left && r < m) {
        p.last[1 + r] = e;
        p.hint_ids[r] = e;
    }
    if (lane == 0)
        p.last[0] = m;
    if (!m)
        return;
    __threadfence_system(); /* every lane's ids before the hint's number */
    __syncwarp();
    if (lane == 0) {
        *p.hint_layer = layer;
        *p.hint_n = m;
        __threadfence_system();
        *(volatile uint32_t *)p.hint_seq = ++*p.hints;
    }
}

/* blockIdx.z: spare slot, blockIdx.y: gate / up / down. Reads host memory
 * over PCIe: several independent 16-byte loads per thread before the stores. */
__global__ void __launch_bounds__(COPY_THREADS)
    prefetch_copy_kernel(tdm_gpu_prefetch p, int32_t layer, tdm_gpu_direct_experts src, tdm_gpu_expert_table t)
{
    tdm_pdl_enter();
    const int j = blockIdx.z, part = blockIdx.y;
    const int32_t e = p.stage[(int64_t)layer * p.n + j];
    if (e < 0)
        return;
    const void *base = part == 0 ? src.gate : part == 1 ? src.up : src.down;
    const size_t bytes = part == 0 ? src.gate_stride : part == 1 ? src.up_stride : src.down_stride;
    const size_t off = part == 0 ? t.gate_off : part == 1 ? t.up_off : t.down_off;
    const uint8_t *from = (const uint8_t *)base + (size_t)e * bytes;
    uint8_t *to = (uint8_t *)p.spare + (size_t)j * p.slot_bytes + off;
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x, nth = (size_t)gridDim.x * blockDim.x;
    if ((((uintptr_t)from | (uintptr_t)to | bytes) & 15) != 0) {
        for (size_t i = tid; i < bytes; i += nth)
            to[i] = from[i];
        return;
    }
    const uint4 *f4 = (const uint4 *)from;
    uint4 *t4 = (uint4 *)to;
    const size_t units = bytes / 16;
    for (size_t i0 = tid; i0 < units; i0 += nth * COPY_UNROLL) {
        uint4 v[COPY_UNROLL];
#pragma unroll
        for (int u = 0; u < COPY_UNROLL; u++) {
            const size_t i = i0 + u * nth;
            if (i < units)
                v[u] = f4[i];
        }
#pragma unroll
        for (int u = 0; u < COPY_UNROLL; u++) {
            const size_t i = i0 + u * nth;
            if (i < units)
                t4[i] = v[u];
        }
    }
}

/* One warp: the previous layer's entries back to -1, then the direct share
 * of the selections ids [k] in their order: the first *p.quota misses (an
 * id out of range counts as one, as in the MoE kernels and the pool) get
 * spare slots, those in range that is. */
__global__ void __launch_bounds__(STAGE_THREADS)
    direct_stage_kernel(tdm_gpu_prefetch p, int32_t layer, int32_t prev, const int32_t *__restrict__ ids, int32_t k)
{
    tdm_pdl_enter();
    int32_t e;
    if (!stage_begin(p, layer, prev, ids, k, &e))
        return;
    const int lane = threadIdx.x;
    const int64_t E = p.n_expert;
    const bool in = e >= 0 && e < E;
    const bool miss = lane < k && (!in || p.slot_of[layer * E + e] < 0);
    const unsigned mm = __ballot_sync(0xffffffffu, miss); /* every lane: not under the && */
    const bool share = miss && lane_rank(mm) < *p.quota;
    stage_lanes(p, layer, e, share && in);
}

static tdm_status check_stage(const tdm_gpu_prefetch *p, int32_t layer, const int32_t *ids, int32_t k,
                              tdm_error *err)
{
    TDM_REQUIRE(err, p && p->slot_of && p->spare && p->stage && p->n >= 1 && p->base >= 0 && p->n_expert >= 1,
                "gpu stage: incomplete descriptor");
    TDM_REQUIRE(err, p->n <= STAGE_THREADS, "gpu stage: %d spare slots (at most %d)", p->n, STAGE_THREADS);
    TDM_REQUIRE(err, layer < 0 || (ids && k >= 1 && k <= STAGE_THREADS),
                "gpu stage: layer %d without selections, or %d of them (at most %d)", layer, k, STAGE_THREADS);
    return TDM_OK;
}

static tdm_status check_hint(const tdm_gpu_prefetch *p, tdm_error *err)
{
    TDM_REQUIRE(err, !p->hint_seq || (p->hint_layer && p->hint_n && p->hint_ids && p->hints && p->last &&
                                      p->hint_max >= 1 && p->hint_max <= TDM_GPU_HINT_MAX),
                "gpu prefetch: incomplete warm-up hint");
    return TDM_OK;
}

static tdm_status check_copy(const tdm_gpu_prefetch *p, const tdm_gpu_direct_experts *src,
                             const tdm_gpu_expert_table *table, tdm_error *err)
{
    TDM_REQUIRE(err, src && src->gate && src->up && src->down && table, "gpu stage: copy without sources");
    TDM_REQUIRE(err, src->gate_stride + src->up_stride + src->down_stride <= p->slot_bytes &&
                         table->slot_bytes == p->slot_bytes,
                "gpu stage: the experts do not fit a %zu-byte slot", p->slot_bytes);
    return TDM_OK;
}

static tdm_status launch_copy(tdm_gpu *g, const tdm_gpu_prefetch *p, int32_t layer, unsigned blocks,
                              const tdm_gpu_direct_experts *src, const tdm_gpu_expert_table *table, tdm_error *err)
{
    TDM_LAUNCH(err, g, prefetch_copy_kernel, dim3(blocks, 3, (unsigned)p->n), COPY_THREADS, 0, *p, layer, *src,
               *table);
    return TDM_OK;
}

extern "C" tdm_status tdm_gpu_direct_stage(tdm_gpu *g, const tdm_gpu_prefetch *p, int32_t layer, int32_t prev,
                                           const int32_t *ids, int32_t k, const tdm_gpu_direct_experts *src,
                                           const tdm_gpu_expert_table *table, tdm_error *err)
{
    tdm_status st = check_stage(p, layer, ids, k, err);
    if (!st && layer >= 0)
        st = check_copy(p, src, table, err);
    if (st)
        return st;
    TDM_REQUIRE(err, p->quota && !p->hint_seq, "gpu direct stage: needs the share's quota and takes no hint");
    TDM_LAUNCH(err, g, direct_stage_kernel, 1, STAGE_THREADS, 0, *p, layer, prev, ids, k);
    return layer >= 0 ? launch_copy(g, p, layer, DIRECT_COPY_BLOCKS, src, table, err) : TDM_OK;
}

extern "C" tdm_status tdm_gpu_prefetch_stage(tdm_gpu *g, const tdm_gpu_prefetch *p, int32_t layer, int32_t prev,
                                             const int32_t *pred, int32_t k, tdm_error *err)
{
    tdm_status st = check_stage(p, layer, pred, k, err);
    if (!st)
        st = check_hint(p, err);
    if (st)
        return st;
    TDM_LAUNCH(err, g, stage_kernel, 1, STAGE_THREADS, 0, *p, layer, prev, pred, k, true);
    return TDM_OK;
}

extern "C" tdm_status tdm_gpu_prefetch_hint(tdm_gpu *g, const tdm_gpu_prefetch *p, int32_t layer,
                                            const int32_t *pred, int32_t k, tdm_error *err)
{
    TDM_REQUIRE(err, p && p->hint_seq, "gpu prefetch hint: the descriptor has no hint to publish");
    TDM_REQUIRE(err, layer >= 0, "gpu prefetch hint: layer %d", layer);
    tdm_status st = check_stage(p, layer, pred, k, err);
    if (!st)
        st = check_hint(p, err);
    if (st)
        return st;
    TDM_LAUNCH(err, g, stage_kernel, 1, STAGE_THREADS, 0, *p, layer, -1, pred, k, false);
    return TDM_OK;
}

extern "C" tdm_status tdm_gpu_prefetch_copy(tdm_gpu *g, const tdm_gpu_prefetch *p, int32_t layer,
                                            const tdm_gpu_direct_experts *src, const tdm_gpu_expert_table *table,
                                            tdm_error *err)
{
    TDM_REQUIRE(err, layer >= 0, "gpu prefetch copy: layer %d", layer);
    tdm_status st = check_stage(p, -1, NULL, 0, err);
    if (!st)
        st = check_copy(p, src, table, err);
    return st ? st : launch_copy(g, p, layer, COPY_BLOCKS, src, table, err);
}

/* ---- the expert-slot device ---- */

typedef struct slot_device {
    tdm_expert_device dev; /* first: the table handed out */
    tdm_gpu *g;
    size_t slot_bytes;
    int spare;             /* slots added after every arena */
    uint8_t *spare_at;     /* those of the last arena */
    const uint8_t *direct; /* registered host memory copies DMA from, NULL: none */
    size_t direct_bytes;
    cudaEvent_t direct_done; /* the latest such copy */
    int n_stage, next;
    uint8_t **stage;       /* [n_stage] page-locked, slot_bytes each */
    cudaEvent_t *done;     /* [n_stage] the copy out of each buffer */
    bool *used;            /* [n_stage] an event was recorded */
    cudaEvent_t last;      /* the latest copy's event, NULL before the first */
} slot_device;

static tdm_status sd_alloc(void *ctx, size_t bytes, void **arena, tdm_error *err)
{
    slot_device *s = (slot_device *)ctx;
    tdm_status st = tdm_gpu_alloc(s->g, bytes + (size_t)s->spare * s->slot_bytes, arena, err);
    if (!st && s->spare)
        s->spare_at = (uint8_t *)*arena + bytes;
    return st;
}

static void sd_free(void *ctx, void *arena)
{
    slot_device *s = (slot_device *)ctx;
    s->spare_at = NULL;
    tdm_gpu_release(s->g, arena);
}

extern "C" void *tdm_gpu_slot_device_spare(tdm_expert_device *d) { return d ? ((slot_device *)d)->spare_at : NULL; }

static tdm_status sd_copy(void *ctx, void *arena, size_t offset, int n, const void *const *src, const size_t *bytes,
                          tdm_error *err)
{
    slot_device *s = (slot_device *)ctx;
    size_t total = 0;
    bool direct = s->direct != NULL;
    for (int i = 0; i < n; i++) {
        total += bytes[i];
        const uint8_t *p = (const uint8_t *)src[i];
        direct = direct && p >= s->direct && bytes[i] <= s->direct_bytes &&
                 (size_t)(p - s->direct) <= s->direct_bytes - bytes[i];
    }
    if (direct) {
        for (size_t i = 0, off = offset; i < (size_t)n; off += bytes[i], i++)
            TDM_CU(err, cudaMemcpyAsync((uint8_t *)arena + off, src[i], bytes[i], cudaMemcpyHostToDevice,
                                        s->g->copy_stream));
        TDM_CU(err, cudaEventRecord(s->direct_done, s->g->copy_stream));
        s->last = s->direct_done;
        return TDM_OK;
    }
    TDM_REQUIRE(err, total <= s->slot_bytes, "slot copy: %zu bytes exceed the %zu-byte staging buffer", total,
                s->slot_bytes);
    const int b = s->next;
    s->next = (s->next + 1) % s->n_stage;
    if (s->used[b]) /* the ring came round: that buffer's DMA must be over */
        TDM_CU(err, cudaEventSynchronize(s->done[b]));
    uint8_t *p = s->stage[b];
    for (int i = 0; i < n; i++) {
        memcpy(p, src[i], bytes[i]);
        p += bytes[i];
    }
    TDM_CU(err, cudaMemcpyAsync((uint8_t *)arena + offset, s->stage[b], total, cudaMemcpyHostToDevice,
                                s->g->copy_stream));
    TDM_CU(err, cudaEventRecord(s->done[b], s->g->copy_stream));
    s->used[b] = true;
    s->last = s->done[b];
    return TDM_OK;
}

static tdm_status sd_sync(void *ctx, tdm_error *err)
{
    TDM_CU(err, cudaStreamSynchronize(((slot_device *)ctx)->g->copy_stream));
    return TDM_OK;
}

static bool sd_poll(void *ctx)
{
    slot_device *s = (slot_device *)ctx;
    if (!s->last)
        return true;
    cudaError_t e = cudaEventQuery(s->last);
    if (e == cudaErrorNotReady)
        return false;
    (void)cudaGetLastError();
    return true; /* done, or failed: a failure shows at the next synchronising call */
}

extern "C" void tdm_gpu_slot_device_free(tdm_expert_device *d)
{
    if (!d)
        return;
    slot_device *s = (slot_device *)d;
    if (s->g)
        (void)cudaStreamSynchronize(s->g->copy_stream);
    if (s->direct_done)
        cudaEventDestroy(s->direct_done);
    for (int i = 0; i < s->n_stage; i++) {
        if (s->done && s->done[i])
            cudaEventDestroy(s->done[i]);
        if (s->stage && s->stage[i])
            tdm_gpu_release_host(s->g, s->stage[i]);
    }
    free(s->stage);
    free(s->done);
    free(s->used);
    free(s);
}

extern "C" tdm_status tdm_gpu_slot_device_new(tdm_gpu *g, size_t slot_bytes, int staging, int spare,
                                              const void *direct, size_t direct_bytes, tdm_expert_device **out,
                                              tdm_error *err)
{
    *out = NULL;
    TDM_REQUIRE(err, staging >= 1 && slot_bytes > 0 && spare >= 0,
                "slot device: %d staging buffers of %zu bytes, %d spare slots", staging, slot_bytes, spare);
    slot_device *s = (slot_device *)calloc(1, sizeof *s);
    if (!s)
        return tdm_error_set(err, TDM_ERR_OOM, "slot device");
    s->dev = (tdm_expert_device){"cuda", s, sd_alloc, sd_free, sd_copy, sd_sync, sd_poll};
    s->g = g;
    s->slot_bytes = slot_bytes;
    s->spare = spare;
    s->n_stage = staging;
    s->direct = (const uint8_t *)direct;
    s->direct_bytes = direct ? direct_bytes : 0;
    s->stage = (uint8_t **)calloc((size_t)staging, sizeof *s->stage);
    s->done = (cudaEvent_t *)calloc((size_t)staging, sizeof *s->done);
    s->used = (bool *)calloc((size_t)staging, sizeof *s->used);
    tdm_status st = s->stage && s->done && s->used ? TDM_OK : tdm_error_set(err, TDM_ERR_OOM, "slot device");
    if (!st && direct) {
        cudaError_t e = cudaEventCreateWithFlags(&s->direct_done, cudaEventDisableTiming);
        if (e != cudaSuccess)
            st = tdm_gpu_cuda_fail(err, e, "cudaEventCreateWithFlags", __FILE__, __LINE__);
    }
    for (int i = 0; i < staging && !st; i++) {
        st = tdm_gpu_alloc_host(g, slot_bytes, (void **)&s->stage[i], err);
        cudaError_t e = st ? cudaSuccess : cudaEventCreateWithFlags(&s->done[i], cudaEventDisableTiming);
        if (e != cudaSuccess)
            st = tdm_gpu_cuda_fail(err, e, "cudaEventCreateWithFlags", __FILE__, __LINE__);
    }
    if (st) {
        tdm_gpu_slot_device_free(&s->dev);
        return st;
    }
    *out = &s->dev;
    return TDM_OK;
}
