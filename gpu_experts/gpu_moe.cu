/* gpu_moe: models.md §2.4 and §3.7 on the device. */
#include <math.h>

#include "gpu_moe.cuh"
#include "gpu_quant.cuh"

/* The warp's largest (value, id) pair, ties to the lowest id, given each
 * lane's (*best, *bi); every lane gets the result. A value that is not >= 0
 * (nothing left, NaN) never wins against one that is. */
__device__ __forceinline__ void router_warp_argmax(float *best, int *bi)
{
#if __CUDA_ARCH__ >= 800
    /* non-negative floats order as their bits; + 1 keeps 0.0 above "none" */
    const unsigned key = *best >= 0.0f ? __float_as_uint(*best) + 1u : 0u;
    const unsigned top = __reduce_max_sync(0xffffffffu, key);
    *bi = (int)__reduce_min_sync(0xffffffffu, key == top ? (unsigned)*bi : 0xffffffffu);
    *best = top ? __uint_as_float(top - 1u) : -1.0f;
#else
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ob = __shfl_xor_sync(0xffffffffu, *best, o);
        int oi = __shfl_xor_sync(0xffffffffu, *bi, o);
        if (ob > *best || (ob == *best && oi < *bi)) {
            *best = ob;
            *bi = oi;
        }
    }
#endif
}

/* Lane's largest untaken probability among its experts lane, lane + 32,
 * ... (p[i] is expert lane + 32 i; strict: the lowest id wins ties); -1 and
 * n_expert when none is left. Unrolled: p stays in registers. */
template <int PER>
__device__ __forceinline__ void router_lane_best(const float (&p)[PER], int n_expert, int lane, float *best,
                                                 int *bi)
{
    *best = -1.0f;
    *bi = n_expert;
#pragma unroll
    for (int i = 0; i < PER; i++)
        if (p[i] > *best) {
            *best = p[i];
            *bi = lane + 32 * i;
        }
}

static_assert(ROUTER_MAX_K <= 32, "a lane per choice");

/* Token t's choice by one warp, PER experts per lane held in registers (an
 * expert past n_expert: probability -1, never chosen): softmax, then k
 * rounds of arg-max; each lane keeps its own best between rounds and only
 * the lane whose expert was taken looks again; lane r keeps round r's
 * choice. Waits for the launch before (the logits) first. */
template <int PER>
__device__ __forceinline__ void router_warp(const float *__restrict__ logits, int n_expert, int k, int renorm,
                                            int32_t *ids, float *weights, int t)
{
    tdm_pdl_enter();
    const int lane = threadIdx.x & 31;
    const float *lr = logits + (int64_t)t * n_expert;
    float p[PER];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < PER; i++) {
        const int e = lane + 32 * i;
        p[i] = e < n_expert ? lr[e] : -INFINITY;
        mx = fmaxf(mx, p[i]);
    }
    mx = tdm_warp_max(mx);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < PER; i++) {
        p[i] = lane + 32 * i < n_expert ? expf(p[i] - mx) : 0.0f;
        sum += p[i];
    }
    sum = tdm_warp_sum(sum);
    const float inv = 1.0f / sum;
#pragma unroll
    for (int i = 0; i < PER; i++)
        p[i] = lane + 32 * i < n_expert ? p[i] * inv : -1.0f;
    float mine, tot = 0.0f, chosen = 0.0f; /* lane r < k: round r's choice */
    int mine_i, chosen_i = 0;
    router_lane_best(p, n_expert, lane, &mine, &mine_i);
    for (int r = 0; r < k; r++) {
        float best = mine;
        int bi = mine_i;
        router_warp_argmax(&best, &bi);
        tot += best;
        if (lane == r) {
            chosen = best;
            chosen_i = bi;
        }
        if (lane == (bi & 31)) { /* taken: this lane's next best */
#pragma unroll
            for (int i = 0; i < PER; i++)
                p[i] = lane + 32 * i == bi ? -2.0f : p[i];
            router_lane_best(p, n_expert, lane, &mine, &mine_i);
        }
    }
    if (lane < k) {
        ids[(int64_t)t * k + lane] = chosen_i;
        weights[(int64_t)t * k + lane] = chosen * (renorm ? 1.0f / tot : 1.0f);
    }
}

/* One warp per token. */
template <int PER>
__global__ void __launch_bounds__(32)
    router_kernel(const float *__restrict__ logits, int n_expert, int k, int renorm, int32_t *ids,
                  float *weights)
{
    router_warp<PER>(logits, n_expert, k, renorm, ids, weights, blockIdx.x);
}

/* The router's arguments (at most max_expert experts). */
static tdm_status router_check(const float *logits, int64_t ntok, int64_t n_expert, int64_t k, const int32_t *ids,
                               const float *weights, int max_expert, tdm_error *err)
{
    TDM_REQUIRE(err, logits && ids && weights, "gpu router: NULL argument");
    TDM_REQUIRE(err, n_expert >= 1 && n_expert <= max_expert, "gpu router: n_expert=%lld outside 1..%d",
                (long long)n_expert, max_expert);
    TDM_REQUIRE(err, k >= 1 && k <= n_expert && k <= ROUTER_MAX_K,
                "gpu router: k=%lld outside 1..min(n_expert, %d)", (long long)k, ROUTER_MAX_K);
    TDM_REQUIRE(err, ntok >= 1 && ntok <= INT32_MAX, "gpu router: ntok=%lld", (long long)ntok);
    return TDM_OK;
}

extern "C" tdm_status tdm_gpu_router(tdm_gpu *g, const float *logits, int64_t ntok,
                                     int64_t n_expert, int64_t k, bool renorm, int32_t *ids,
                                     float *weights, tdm_error *err)
{
    TDM_TRY(router_check(logits, ntok, n_expert, k, ids, weights, ROUTER_MAX_EXPERTS, err));
    /* experts per lane: the least power of two that covers n_expert */
    static const decltype(&router_kernel<1>) kernels[] = {router_kernel<1>, router_kernel<2>, router_kernel<4>,
                                                          router_kernel<8>, router_kernel<16>, router_kernel<32>};
    static_assert(32 << 5 == ROUTER_MAX_EXPERTS, "the table ends at ROUTER_MAX_EXPERTS");
    int per_log2 = 0;
    while ((32 << per_log2) < n_expert)
        per_log2++;
    TDM_LAUNCH(err, g, kernels[per_log2], (unsigned)ntok, 32, 0, logits, (int)n_expert, (int)k, renorm ? 1 : 0, ids,
               weights);
    return TDM_OK;
}

/* Whether expert id e of the layer has no slot (an id out of range has none). */
__device__ __forceinline__ bool moe_missing(const moe_args &a, int32_t e)
{
    return e < 0 || e >= a.n_expert || a.slot_of[e] < 0;
}

/* The gate, up and down matrices of selection sel (= token * k + rank):
 * its slot's when resident; else the host copy when fewer than *quota
 * selections before it miss too (zero-copy, gpu.h); else NULL (the CPU's). */
__device__ const uint8_t *expert_mats(const moe_args &a, const int32_t *ids, int sel, const uint8_t **up,
                                      const uint8_t **down)
{
    const int32_t e = ids[sel];
    if (!moe_missing(a, e)) {
        const uint8_t *b = a.arena + (int64_t)a.slot_of[e] * a.slot_bytes;
        *up = b + a.up_off;
        *down = b + a.down_off;
        return b + a.gate_off;
    }
    if (!a.dir_gate || e < 0 || e >= a.n_expert)
        return NULL;
    int before = 0;
    for (int j = 0; j < sel; j++)
        before += moe_missing(a, ids[j]);
    if (before >= *a.dir_quota)
        return NULL;
    *up = a.dir_up + e * a.dir_up_stride;
    *down = a.dir_down + e * a.dir_down_stride;
    return a.dir_gate + e * a.dir_gate_stride;
}

/* Row pitch of the int8 activations: whole 128-byte swizzle groups. */
__host__ __device__ __forceinline__ int moe_pitch(int64_t n) { return (int)((n + 127) & ~(int64_t)127); }

/* The int8 copy of h that gate_up writes for down, after the float rows
 * (gpu.h, tdm_gpu_moe_h_bytes): rows [sel][pitch] (each swizzled on its
 * own, as tdm_xq_fill) at byte q_off of h, their scales and sums
 * [sel][pitch / 32] at s_off. */
struct moe_hq_layout {
    size_t q_off, s_off;
    int pitch;
};

static moe_hq_layout moe_hq_of(int64_t rows, int64_t h_stride)
{
    const size_t q = tdm_gpu_moe_h_float_bytes(h_stride, rows);
    const int pitch = moe_pitch(h_stride);
    return {q, q + (size_t)rows * pitch, pitch};
}

/* gate_up's writable view of it. */
struct moe_hq_out {
    int8_t *q;
    uint2 *s;
    int pitch;
};

/* The block's tile (GU_TILE rows) of gate and up for one selection (a
 * (token, rank) pair, or the shared expert when sel >= ntok * k). The block
 * quantises the token's x into shared memory (a chunk of n_embd at a time;
 * or copies xg, x's int8 copy from the norm, for one token in one chunk),
 * then each warp computes one row of gate and up per pass, its lanes
 * splitting the row's units; the block's silu(g) * u go to h and, when that
 * selection's down weights take int8 activations, as one int8 group to h's
 * int8 copy (GU_TILE = 32). The tile waits for the launch before (x, ids)
 * first, unless AHEAD (a shared tile whose x is two launches back: the
 * caller waits afterwards). */
template <int T, bool AHEAD>
__device__ __forceinline__ void gate_up_tile(const moe_args &a, const float *__restrict__ x,
                                             const int8_t *__restrict__ xg, const int32_t *__restrict__ ids, int k,
                                             int ntok, float *__restrict__ h, const moe_hq_out &hq, int tile, int sel)
{
    extern __shared__ __align__(128) int4 moe_smem[]; /* q [pitch] int8, s [pitch / 32] */
    __shared__ float hv[GU_TILE];
    const int chunk = a.chunk, nchunks = a.nchunks, last = a.last, pitch = moe_pitch(chunk);
    int8_t *xq8 = (int8_t *)moe_smem;
    uint2 *xs = (uint2 *)(xq8 + pitch);
    tdm_xq xq = {xq8, xs, pitch};
    /* everything that depends on the arguments alone, ahead of the wait */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const bool routed = !AHEAD && sel < ntok * k;
    const int t = routed ? sel / k : sel - ntok * k, rank = routed ? sel - t * k : k;
    const int n_ff = routed ? a.n_ff : a.sh_n_ff, tile0 = tile * GU_TILE;
    const int64_t grb = routed ? a.gate_row_bytes : a.sh_gate_row_bytes;
    const int64_t urb = routed ? a.up_row_bytes : a.sh_up_row_bytes;
    const int live_rows = n_ff - tile0 < GU_TILE ? n_ff - tile0 : GU_TILE;
    const int gtype = routed ? a.gate_type : a.sh_gate_type, utype = routed ? a.up_type : a.sh_up_type;
    const moe_chunk_geom gg = routed ? a.gate_g : a.sh_gate_g, ug = routed ? a.up_g : a.sh_up_g;
    const uint8_t *gw = a.sh_gate, *uw = a.sh_up;
    if (!routed && live_rows > 0) { /* the shared expert's rows: weights only */
        tdm_prefetch_l2(gw + tile0 * grb, live_rows * grb);
        tdm_prefetch_l2(uw + tile0 * urb, live_rows * urb);
    }
    if (!AHEAD)
        tdm_pdl_enter(); /* x and ids are the previous kernels' */
    if (live_rows <= 0)
        return; /* the narrower of routed and shared n_ff */
    if (routed) {
        const uint8_t *dw;
        gw = expert_mats(a, ids, sel, &uw, &dw);
        if (!gw)
            return; /* the CPU computes it (uniform over the block) */
        tdm_prefetch_l2(gw + tile0 * grb, live_rows * grb);
        tdm_prefetch_l2(uw + tile0 * urb, live_rows * urb);
    }
    const float *xt = x + (int64_t)t * a.n_embd;
    const int64_t hrow = (int64_t)t * (k + a.has_shared) + rank;
    for (int p = 0; p < GU_TILE / GU_WARPS; p++) {
        int r = p * GU_WARPS + warp, row = tile0 + r;
        bool live = row < n_ff;
        float gs = 0.0f, us = 0.0f;
        for (int c = 0; c < nchunks; c++) {
            const bool end = c == nchunks - 1;
            const int k0 = c * chunk;
            if (xg && p == 0) { /* x's int8 copy (one token, one chunk) */
                tdm_xq_copy(moe_smem, xg, pitch);
            } else if (nchunks > 1 || p == 0) { /* one chunk: x stays for every pass */
                __syncthreads();
                tdm_xq_fill(xq8, xs, pitch, xt, 0, 1, k0, (end ? last : chunk) & ~31);
                __syncthreads();
            }
            const uint8_t *gr = gw + row * grb + (int64_t)c * gg.bytes, *ur = uw + row * urb + (int64_t)c * ug.bytes;
            if (live && (T >= 0 || gtype == utype)) { /* both rows' loads in flight at once */
                float acc[2] = {0.0f, 0.0f};
                tdm_rows_part_of<T, 2>(gtype, gr, ur - gr, lane, end ? gg.last : gg.full, 32, xq, xt + k0, acc);
                gs += acc[0];
                us += acc[1];
            } else if (live) {
                tdm_rows_part_of<T, 1>(gtype, gr, 0, lane, end ? gg.last : gg.full, 32, xq, xt + k0, &gs);
                tdm_rows_part_of<T, 1>(utype, ur, 0, lane, end ? ug.last : ug.full, 32, xq, xt + k0, &us);
            }
        }
        gs = tdm_warp_sum(gs);
        us = tdm_warp_sum(us);
        const float v = tdm_silu(gs) * us;
        if (live && lane == 0)
            h[hrow * a.h_stride + row] = v;
        if (lane == 0)
            hv[r] = live ? v : 0.0f;
    }
    if (!(routed ? a.down_i8 : a.sh_down_i8))
        return;
    __syncthreads();
    if (warp == 0)
        tdm_xq_put32(hv[lane], hq.q + hrow * hq.pitch, hq.s + hrow * (hq.pitch / 32), tile0 / 32);
}

/* Block (x, y) = tile x of selection y. */
template <int T>
__global__ void __launch_bounds__(GU_WARPS * 32, GU_BLOCKS_PER_SM)
    moe_gate_up_kernel(moe_args a, const float *__restrict__ x, const int8_t *__restrict__ xg,
                       const int32_t *__restrict__ ids, int k, int ntok, float *__restrict__ h, moe_hq_out hq)
{
    gate_up_tile<T, false>(a, x, xg, ids, k, ntok, h, hq, blockIdx.x, blockIdx.y);
}

/* tdm_gpu_router_shared's launch: blocks [0, ntok) choose token t's experts
 * (warp 0; the block's other warps have nothing to do), the others compute
 * one tile of a token's shared expert each, all of it ahead of the wait
 * (x is two launches back). Compiled per type as gate_up. */
template <int T>
__global__ void __launch_bounds__(GU_WARPS * 32, GU_BLOCKS_PER_SM)
    router_shared_kernel(const float *__restrict__ logits, int n_expert, int renorm, int32_t *ids, float *weights,
                         moe_args a, const float *__restrict__ x, const int8_t *__restrict__ xg, int k, int ntok,
                         float *__restrict__ h, moe_hq_out hq)
{
    if (blockIdx.x < (unsigned)ntok) {
        if (threadIdx.x < 32)
            router_warp<RS_PER>(logits, n_expert, k, renorm, ids, weights, blockIdx.x);
        return;
    }
    const int b = blockIdx.x - ntok, tiles = (a.sh_n_ff + GU_TILE - 1) / GU_TILE;
    gate_up_tile<T, true>(a, x, xg, NULL, k, ntok, h, hq, b % tiles, ntok * k + b / tiles);
    tdm_pdl_enter();
}

/* A lane's walk over the (rank, unit) items it = sub, sub + nsub, ... <
 * n_items of one output row: item it is rank r0 + it / nu, unit it % nu.
 * Worked out once per kernel, ahead of the PDL wait. */
struct moe_walk {
    int r, u, nu, dr, du, n_items, sub, nsub;
};

__device__ __forceinline__ moe_walk moe_walk_of(int r0, int nu, int n_items, int sub, int nsub)
{
    const int q = sub / nu, dq = nsub / nu;
    return {r0 + q, sub - q * nu, nu, dq, nsub - dq * nu, n_items, sub, nsub};
}

/* The items of walk w: rank r's weight row is base[r] + off (NULL: not
 * resident) against its activations (int8 row r of xq, float hf + r *
 * h_stride). Adds wt[r] * partial dot to *acc. One type: the switch stays
 * outside the loop. */
template <int T>
__device__ __forceinline__ void down_items(const uint8_t *const *base, const float *wt, int64_t off, moe_walk w,
                                           const tdm_xq &xq, const float *hf, int64_t h_stride, float *acc)
{
    int r = w.r, u = w.u;
    for (int it = w.sub; it < w.n_items; it += w.nsub, r += w.dr, u += w.du) {
        if (u >= w.nu) {
            u -= w.nu;
            r++;
        }
        const uint8_t *b = base[r];
        if (!b)
            continue;
        /* rank r's row on its own: valid because every row is swizzled
         * relative to its start (gpu_quant.cuh) */
        tdm_xq xr = {xq.q + r * xq.pitch, xq.s + r * (xq.pitch / 32), xq.pitch};
        float part = 0.0f;
        tdm_rows_part<T, 1>(b + off, 0, u, u + 1, 1, xr, hf + r * h_stride, &part);
        *acc += wt[r] * part;
    }
}

/* down_items for a type fixed when compiled (T >= 0) or known only at run
 * time (T < 0: a warp-uniform switch on type, outside the item loop). */
template <int T>
__device__ __forceinline__ void down_items_of(int type, const uint8_t *const *base, const float *wt, int64_t off,
                                              moe_walk w, const tdm_xq &xq, const float *hf, int64_t h_stride,
                                              float *acc)
{
    if constexpr (T >= 0)
        down_items<T>(base, wt, off, w, xq, hf, h_stride, acc);
    else
        TDM_QT_DISPATCH(type, (down_items<QTYPE>(base, wt, off, w, xq, hf, h_stride, acc)));
}

/* Block = tile output rows of one token. The block looks up the token's
 * resident experts; each warp takes one row per pass, its lanes splitting
 * the (rank, unit) items of every resident selection and the gated shared
 * expert against the int8 copy of h that gate_up wrote (plain formats: the
 * float rows), so short rows (n_ff 512) still keep every lane busy. */
template <int T>
__global__ void __launch_bounds__(DN_WARPS * 32, DN_BLOCKS_PER_SM)
    moe_down_kernel(moe_args a, const float *__restrict__ h, tdm_xq hq, const int32_t *__restrict__ ids,
                    const float *__restrict__ wts, int k, const float *add, float *y, int accumulate, int tile)
{
    __shared__ const uint8_t *base[MOE_MAX_K + 1];
    __shared__ float wt[MOE_MAX_K + 1];
    /* everything that depends on the arguments alone, ahead of the wait */
    const int nsel = k + a.has_shared, t = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, tile0 = blockIdx.x * tile;
    const int live_rows = a.n_embd - tile0 < tile ? a.n_embd - tile0 : tile;
    const float *ht = h + (int64_t)t * nsel * a.h_stride;
    const tdm_xq xt = {hq.q + (int64_t)t * nsel * hq.pitch, hq.s + (int64_t)t * nsel * (hq.pitch / 32), hq.pitch};
    const moe_walk routed = moe_walk_of(0, a.down_units, k * a.down_units, lane, 32);
    const moe_walk shared = a.has_shared ? moe_walk_of(k, a.sh_down_units, a.sh_down_units, lane, 32) : routed;
    if (a.has_shared) /* weights only */
        tdm_prefetch_l2(a.sh_down + tile0 * a.sh_down_row_bytes, live_rows * a.sh_down_row_bytes);
    /* ids and wts were written at least two launches back (the router, then
     * gate_up, which waited for it before this grid could start; gpu.h), so
     * the selected experts' rows are asked of L2 while gate_up still runs */
    for (int r = threadIdx.x; r < nsel; r += blockDim.x) {
        const uint8_t *b;
        if (r < k) {
            const uint8_t *up, *down;
            b = expert_mats(a, ids, t * k + r, &up, &down) ? down : NULL;
            wt[r] = wts[(int64_t)t * k + r];
        } else {
            b = a.sh_down;
            wt[r] = a.sh_logit ? tdm_sigmoid(a.sh_logit[t]) : 1.0f;
        }
        base[r] = b;
    }
    __syncthreads();
    for (int r = 0; r < k; r++)
        if (base[r])
            tdm_prefetch_l2(base[r] + tile0 * a.down_row_bytes, live_rows * a.down_row_bytes);
    tdm_pdl_enter(); /* h is the previous kernel's */
    for (int p = 0; p < tile / DN_WARPS; p++) {
        int row = tile0 + p * DN_WARPS + warp;
        if (row >= a.n_embd)
            break;
        float acc = 0.0f;
        down_items_of<T>(a.down_type, base, wt, row * a.down_row_bytes, routed, xt, ht, a.h_stride, &acc);
        if (a.has_shared)
            down_items_of<T>(a.sh_down_type, base, wt, row * a.sh_down_row_bytes, shared, xt, ht, a.h_stride, &acc);
        acc = tdm_warp_sum(acc);
        if (lane == 0) {
            int64_t i = (int64_t)t * a.n_embd + row;
            float v = accumulate ? y[i] : 0.0f;
            if (add)
                v += add[i];
            y[i] = v + acc;
        }
    }
}

extern "C" int64_t tdm_gpu_moe_h_stride(const tdm_gpu_moe_layer *L)
{
    int64_t s = L->n_ff;
    if (L->shared && L->shared->n_ff > s)
        s = L->shared->n_ff;
    return s;
}

static tdm_status row_bytes_of(tdm_qtype t, int64_t n, const char *what, int64_t *rb,
                               tdm_error *err)
{
    int blk, bytes;
    if (!tdm_gpu_qt_geometry(t, &blk, &bytes))
        return tdm_error_set(err, TDM_ERR_UNSUPPORTED, "gpu moe: %s type %s has no GPU kernel",
                             what, tdm_qtype_name(t));
    TDM_REQUIRE(err, n > 0 && n % blk == 0 && n <= INT32_MAX,
                "gpu moe: %s row of %lld is not a multiple of the %s block (%d)", what,
                (long long)n, tdm_qtype_name(t), blk);
    *rb = n / blk * bytes;
    return TDM_OK;
}

/* Whether the format multiplies int8 activations. */
static bool moe_i8(int t)
{
    int blk, bytes;
    return tdm_gpu_qt_geometry((tdm_qtype)t, &blk, &bytes) && blk >= 32;
}

/* Activation chunk (elements) of a gate_up block: the whole x row when it
 * fits MOE_XQ_ELEMS, else block multiples; padded to whole groups of 32. */
static int moe_chunk(int64_t n)
{
    return (int)(n <= MOE_XQ_ELEMS ? (n + 31) / 32 * 32 : MOE_XQ_ELEMS);
}

/* A gate or up matrix of type t over a's chunks (type checked before). */
static moe_chunk_geom moe_chunk_geom_of(int t, const moe_args *a)
{
    int blk = 1, bytes = 0;
    tdm_gpu_qt_geometry((tdm_qtype)t, &blk, &bytes);
    const int unit = tdm_gpu_qt_unit((tdm_qtype)t);
    return {a->chunk / blk * bytes, a->chunk / unit, a->last / unit};
}

static tdm_status moe_prepare(const tdm_gpu_moe_layer *L, int64_t ntok, int64_t k, moe_args *a,
                              tdm_error *err)
{
    TDM_REQUIRE(err, L && L->table && L->table->slot_of && L->table->arena,
                "gpu moe: missing layer or expert table");
    const tdm_gpu_expert_table *tb = L->table;
    TDM_REQUIRE(err, tb->n_expert > 0 && tb->n_expert <= INT32_MAX && L->layer >= 0,
                "gpu moe: n_expert=%lld layer=%lld", (long long)tb->n_expert, (long long)L->layer);
    TDM_REQUIRE(err, k >= 1 && k <= tb->n_expert && k <= MOE_MAX_K && ntok >= 1 &&
                         ntok * (k + 1) <= 65535,
                "gpu moe: ntok=%lld k=%lld (k <= %d, at most 65535 selections per launch)",
                (long long)ntok, (long long)k, MOE_MAX_K);
    memset(a, 0, sizeof *a);
    a->slot_of = tb->slot_of + L->layer * tb->n_expert;
    a->n_expert = (int32_t)tb->n_expert;
    a->arena = (const uint8_t *)tb->arena;
    a->slot_bytes = (int64_t)tb->slot_bytes;
    a->gate_off = (int64_t)tb->gate_off;
    a->up_off = (int64_t)tb->up_off;
    a->down_off = (int64_t)tb->down_off;
    a->gate_type = L->gate_type;
    a->up_type = L->up_type;
    a->down_type = L->down_type;
    TDM_TRY(row_bytes_of(L->gate_type, L->n_embd, "gate", &a->gate_row_bytes, err));
    TDM_TRY(row_bytes_of(L->up_type, L->n_embd, "up", &a->up_row_bytes, err));
    TDM_TRY(row_bytes_of(L->down_type, L->n_ff, "down", &a->down_row_bytes, err));
    TDM_REQUIRE(err, L->n_ff % 8 == 0 && L->n_embd % 8 == 0, "gpu moe: n_ff/n_embd not multiples of 8");
    a->n_embd = (int)L->n_embd;
    a->n_ff = (int)L->n_ff;
    a->h_stride = tdm_gpu_moe_h_stride(L);
    a->down_i8 = moe_i8(L->down_type);
    a->chunk = moe_chunk(a->n_embd);
    a->nchunks = (a->n_embd + a->chunk - 1) / a->chunk;
    a->last = a->n_embd - (a->nchunks - 1) * a->chunk;
    a->gate_g = moe_chunk_geom_of(L->gate_type, a);
    a->up_g = moe_chunk_geom_of(L->up_type, a);
    a->down_units = a->n_ff / tdm_gpu_qt_unit(L->down_type);
    TDM_TRY(tdm_gpu_check_align(L->gate_type, a->arena + a->gate_off, a->slot_bytes, "gpu moe", "gate", err));
    TDM_TRY(tdm_gpu_check_align(L->up_type, a->arena + a->up_off, a->slot_bytes, "gpu moe", "up", err));
    TDM_TRY(tdm_gpu_check_align(L->down_type, a->arena + a->down_off, a->slot_bytes, "gpu moe", "down", err));
    const tdm_gpu_shared_expert *sh = L->shared;
    if (sh) {
        TDM_REQUIRE(err, sh->gate && sh->up && sh->down, "gpu moe: shared expert weights NULL");
        a->has_shared = 1;
        a->sh_gate = (const uint8_t *)sh->gate;
        a->sh_up = (const uint8_t *)sh->up;
        a->sh_down = (const uint8_t *)sh->down;
        a->sh_gate_type = sh->gate_type;
        a->sh_up_type = sh->up_type;
        a->sh_down_type = sh->down_type;
        TDM_TRY(row_bytes_of(sh->gate_type, L->n_embd, "shared gate", &a->sh_gate_row_bytes, err));
        TDM_TRY(row_bytes_of(sh->up_type, L->n_embd, "shared up", &a->sh_up_row_bytes, err));
        TDM_TRY(row_bytes_of(sh->down_type, sh->n_ff, "shared down", &a->sh_down_row_bytes, err));
        a->sh_n_ff = (int)sh->n_ff;
        a->sh_logit = sh->gate_logit;
        a->sh_down_i8 = moe_i8(sh->down_type);
        a->sh_gate_g = moe_chunk_geom_of(sh->gate_type, a);
        a->sh_up_g = moe_chunk_geom_of(sh->up_type, a);
        a->sh_down_units = a->sh_n_ff / tdm_gpu_qt_unit(sh->down_type);
        TDM_TRY(tdm_gpu_check_align(sh->gate_type, sh->gate, 0, "gpu moe", "shared gate", err));
        TDM_TRY(tdm_gpu_check_align(sh->up_type, sh->up, 0, "gpu moe", "shared up", err));
        TDM_TRY(tdm_gpu_check_align(sh->down_type, sh->down, 0, "gpu moe", "shared down", err));
    }
    const tdm_gpu_direct_experts *dx = L->direct;
    if (dx) {
        TDM_REQUIRE(err, dx->gate && dx->up && dx->down && dx->quota, "gpu moe: incomplete direct experts");
        a->dir_gate = (const uint8_t *)dx->gate;
        a->dir_up = (const uint8_t *)dx->up;
        a->dir_down = (const uint8_t *)dx->down;
        a->dir_gate_stride = (int64_t)dx->gate_stride;
        a->dir_up_stride = (int64_t)dx->up_stride;
        a->dir_down_stride = (int64_t)dx->down_stride;
        a->dir_quota = dx->quota;
        TDM_TRY(tdm_gpu_check_align(L->gate_type, dx->gate, a->dir_gate_stride, "gpu moe", "host gate", err));
        TDM_TRY(tdm_gpu_check_align(L->up_type, dx->up, a->dir_up_stride, "gpu moe", "host up", err));
        TDM_TRY(tdm_gpu_check_align(L->down_type, dx->down, a->dir_down_stride, "gpu moe", "host down", err));
    }
    return TDM_OK;
}

typedef decltype(&moe_gate_up_kernel<-1>) moe_gate_up_fn;
typedef decltype(&moe_down_kernel<-1>) moe_down_fn;

/* The gate_up kernel for a's types: compiled for the one type of gate and
 * up (routed and shared alike), else the one that switches per row. */
static moe_gate_up_fn moe_gate_up_of(const moe_args *a)
{
    const int t = a->gate_type;
    moe_gate_up_fn kernel = moe_gate_up_kernel<-1>;
    if (a->up_type == t && (!a->has_shared || (a->sh_gate_type == t && a->sh_up_type == t)))
        TDM_QT_DISPATCH(t, kernel = moe_gate_up_kernel<QTYPE>);
    return kernel;
}

typedef decltype(&router_shared_kernel<-1>) router_shared_fn;

/* The router_shared kernel for the shared expert's types: compiled for its
 * one type of gate and up, else the one that switches per row. */
static router_shared_fn router_shared_of(const moe_args *a)
{
    router_shared_fn kernel = router_shared_kernel<-1>;
    if (a->sh_up_type == a->sh_gate_type)
        TDM_QT_DISPATCH(a->sh_gate_type, kernel = router_shared_kernel<QTYPE>);
    return kernel;
}

/* The down kernel for a's types: compiled for the one down type (routed and
 * shared), else the one that switches per row. */
static moe_down_fn moe_down_of(const moe_args *a)
{
    const int t = a->down_type;
    moe_down_fn kernel = moe_down_kernel<-1>;
    if (!a->has_shared || a->sh_down_type == t)
        TDM_QT_DISPATCH(t, kernel = moe_down_kernel<QTYPE>);
    return kernel;
}

/* Output rows per down block (tuning, else DN_TILE). */
static int moe_tile_of(const tdm_gpu *g) { return g->tune.moe_tile ? g->tune.moe_tile : DN_TILE; }

/* The checks and the launch shape gate_up's tiles share (tdm_gpu_moe_gate_up,
 * tdm_gpu_router_shared): x, its int8 copy (*xq, dropped when x is quantised
 * chunk by chunk) and h, the dynamic shared memory, and h's int8 copy for
 * ntok tokens of k selections and the shared expert. */
static tdm_status gate_up_shape(const moe_args *a, const float *x, const void **xq, int64_t ntok, int64_t k, float *h,
                                const char *who, size_t *smem, moe_hq_out *hq, tdm_error *err)
{
    TDM_REQUIRE(err, x && h, "%s: NULL argument", who);
    TDM_REQUIRE(err, ((uintptr_t)x & 15) == 0 && ((uintptr_t)h & 255) == 0 && ((uintptr_t)*xq & 15) == 0,
                "%s: x and its int8 copy must be 16-byte and h 256-byte aligned", who);
    TDM_REQUIRE(err, !*xq || ntok == 1, "%s: an int8 copy of x serves one token (ntok=%lld)", who, (long long)ntok);
    if (a->nchunks > 1) /* rows longer than a chunk: quantised chunk by chunk */
        *xq = NULL;
    *smem = (size_t)moe_pitch(a->chunk) / 32 * (32 + sizeof(uint2));
    const moe_hq_layout lay = moe_hq_of(ntok * (k + a->has_shared), a->h_stride);
    *hq = {(int8_t *)h + lay.q_off, (uint2 *)((int8_t *)h + lay.s_off), lay.pitch};
    return TDM_OK;
}

extern "C" tdm_status tdm_gpu_moe_gate_up(tdm_gpu *g, const tdm_gpu_moe_layer *L, const float *x,
                                          const void *xq, const int32_t *ids, int64_t ntok, int64_t k,
                                          float *h, tdm_error *err)
{
    moe_args a;
    TDM_TRY(moe_prepare(L, ntok, k, &a, err));
    TDM_REQUIRE(err, ids, "gpu moe_gate_up: NULL argument");
    size_t smem = 0;
    moe_hq_out hq = {};
    TDM_TRY(gate_up_shape(&a, x, &xq, ntok, k, h, "gpu moe_gate_up", &smem, &hq, err));
    /* the shared expert's tiles, unless tdm_gpu_router_shared computed them */
    const int64_t nsel = ntok * (k + (a.has_shared && !L->shared_done));
    dim3 grid(tdm_cdiv(a.h_stride, GU_TILE), (unsigned)nsel);
    TDM_LAUNCH(err, g, moe_gate_up_of(&a), grid, GU_WARPS * 32, smem, a, x, (const int8_t *)xq, ids, (int)k,
               (int)ntok, h, hq);
    return TDM_OK;
}

extern "C" tdm_status tdm_gpu_router_shared(tdm_gpu *g, const tdm_gpu_moe_layer *L, const float *logits,
                                            int64_t ntok, int64_t n_expert, int64_t k, bool renorm, int32_t *ids,
                                            float *weights, const float *x, const void *xq, float *h,
                                            tdm_error *err)
{
    static_assert(32 * RS_PER == TDM_GPU_ROUTER_SHARED_MAX_EXPERTS, "gpu.h states the limit");
    TDM_TRY(router_check(logits, ntok, n_expert, k, ids, weights, TDM_GPU_ROUTER_SHARED_MAX_EXPERTS, err));
    moe_args a;
    TDM_TRY(moe_prepare(L, ntok, k, &a, err));
    TDM_REQUIRE(err, a.has_shared, "gpu router_shared: the layer has no shared expert");
    size_t smem = 0;
    moe_hq_out hq = {};
    TDM_TRY(gate_up_shape(&a, x, &xq, ntok, k, h, "gpu router_shared", &smem, &hq, err));
    const int64_t blocks = ntok * (1 + tdm_cdiv(a.sh_n_ff, GU_TILE));
    TDM_LAUNCH(err, g, router_shared_of(&a), (unsigned)blocks, GU_WARPS * 32, smem, logits, (int)n_expert,
               renorm ? 1 : 0, ids, weights, a, x, (const int8_t *)xq, (int)k, (int)ntok, h, hq);
    return TDM_OK;
}

extern "C" tdm_status tdm_gpu_moe_down(tdm_gpu *g, const tdm_gpu_moe_layer *L, const float *h,
                                       const int32_t *ids, const float *weights, int64_t ntok,
                                       int64_t k, const float *add, float *y, bool accumulate,
                                       tdm_error *err)
{
    moe_args a;
    TDM_TRY(moe_prepare(L, ntok, k, &a, err));
    TDM_REQUIRE(err, h && ids && weights && y, "gpu moe_down: NULL argument");
    TDM_REQUIRE(err, ((uintptr_t)h & 255) == 0, "gpu moe_down: h must be 256-byte aligned");
    const int64_t nsel = ntok * (k + a.has_shared);
    const int tile = moe_tile_of(g);
    dim3 grid(tdm_cdiv(a.n_embd, tile), (unsigned)ntok);
    const moe_hq_layout lay = moe_hq_of(nsel, a.h_stride);
    const tdm_xq hq = {(const int8_t *)h + lay.q_off, (const uint2 *)((const int8_t *)h + lay.s_off), lay.pitch};
    TDM_LAUNCH(err, g, moe_down_of(&a), grid, DN_WARPS * 32, 0, a, h, hq, ids, weights, (int)k, add, y,
               accumulate ? 1 : 0, tile);
    return TDM_OK;
}
