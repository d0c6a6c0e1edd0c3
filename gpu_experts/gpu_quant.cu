/* gpu_quant: quantised matrix-vector (decode, 1..8 tokens: dp4a against
 * int8 activations for the quantised formats, float for F32/F16/BF16) and
 * matrix-matrix (prompt: dequantise to fp16 + cuBLAS) products over the
 * gpu_quant.cuh table. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "gpu_quant.cuh"
#include "gpu_test_hooks.h"

#define MVF_WARPS 4 /* float path: warps per block */
#define MVQ_WARPS 8 /* int8 path: warps per block (they share one quantised x) */
/* int8 path: resident blocks per SM asked of ptxas (<= 80 registers; 2 for
 * 8 tokens x 2 rows; without the bound ptxas capped some instantiations at
 * 48-64 registers and spilled), and the grid cap (more blocks would only
 * quantise x again) */
#define MVQ_BLOCKS_PER_SM 3
#define MV_XQ_ELEMS 16384   /* int8 activations a block holds: ntok x chunk of k */

/* Sums the partials of each row over its lpr lanes (shuffles) and wpr warps
 * (shared memory; wpr > 1 only with lpr = 32), then the row's first lane in
 * the group's first warp stores y. Every thread of the block calls it. */
template <int NT, int R, int W>
__device__ __forceinline__ void mv_reduce_store(float (*acc)[NT], float (*red)[NT][W], int lpr,
                                                int wpr, int64_t row0, int nrows, int64_t rows,
                                                int ntok, float *y, int accumulate)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++)
            for (int o = lpr >> 1; o > 0; o >>= 1)
                acc[r][t] += __shfl_xor_sync(0xffffffffu, acc[r][t], o);
    if (wpr > 1) {
        if (lane == 0)
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int t = 0; t < NT; t++)
                    red[r][t][warp] = acc[r][t];
        __syncthreads();
        if (lane == 0 && warp % wpr == 0)
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    float s = 0.0f;
                    for (int i = 0; i < wpr; i++)
                        s += red[r][t][warp + i];
                    acc[r][t] = s;
                }
        __syncthreads(); /* red is reused by the next tile */
    }
    if ((lane & (lpr - 1)) != 0 || warp % wpr != 0)
        return;
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++)
            if (t < ntok && r < nrows) {
                float *dst = y + t * rows + row0 + r;
                *dst = accumulate ? *dst + acc[r][t] : acc[r][t];
            }
}

/* Token group blockIdx.y of a launch: its first token (returned) and its
 * count (ntok: in every token of the call, out this group's, at most
 * TDM_GPU_MATVEC_MAX_TOK). */
__device__ __forceinline__ int64_t mv_token_group(int *ntok)
{
    int t0 = (int)blockIdx.y * TDM_GPU_MATVEC_MAX_TOK;
    *ntok = *ntok - t0 < TDM_GPU_MATVEC_MAX_TOK ? *ntok - t0 : TDM_GPU_MATVEC_MAX_TOK;
    return t0;
}

bool tdm_gpu_qt_geometry(tdm_qtype t, int *blk, int *bytes)
{
    bool ok = false;
    TDM_QT_DISPATCH(t, (*blk = QT<QTYPE>::BLK, *bytes = QT<QTYPE>::BYTES, ok = true));
    return ok;
}

int tdm_gpu_qt_unit(tdm_qtype t)
{
    int unit = 0;
    TDM_QT_DISPATCH(t, (unit = QT<QTYPE>::UNIT));
    return unit;
}

extern "C" int tdm_gpu_weight_align(tdm_qtype t)
{
    int a = 0;
    TDM_QT_DISPATCH(t, (a = QT<QTYPE>::I8 ? tdm_al(QT<QTYPE>::BYTES, 0) : 4));
    return a;
}

tdm_status tdm_gpu_check_align(tdm_qtype t, const void *w, int64_t stride, const char *who, const char *what,
                               tdm_error *err)
{
    const int al = tdm_gpu_weight_align(t);
    TDM_REQUIRE(err, al > 0 && (uintptr_t)w % al == 0 && stride % al == 0,
                "%s: %s weights (%s) must start %d-byte aligned%s", who, what, tdm_qtype_name(t), al,
                stride ? ", and so must every slot or expert after them" : "");
    return TDM_OK;
}

extern "C" bool tdm_gpu_type_supported(tdm_qtype t)
{
    int blk, bytes;
    return tdm_gpu_qt_geometry(t, &blk, &bytes);
}

/* ---- float-activation matvec (F32, F16, BF16) ----
 * A block of MVF_WARPS warps computes (MVF_WARPS / wpr) * R rows: the wpr
 * warps of a row group split its units (so short and few rows still fill
 * the GPU) and meet in shared memory; each warp carries R rows so that one
 * activation load serves R rows. */
template <int T, int NT, int R>
__global__ void __launch_bounds__(MVF_WARPS * 32)
    matvec_f_kernel(const uint8_t *__restrict__ w, int64_t row_bytes, int64_t rows, int units,
                    const float *__restrict__ x, int ntok, float *__restrict__ y, int accumulate,
                    int wpr)
{
    __shared__ float red[R][NT][MVF_WARPS];
    const int64_t t0 = mv_token_group(&ntok);
    x += t0 * 8 * units;
    y += t0 * rows;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, sub = warp % wpr;
    const int64_t block_rows = (MVF_WARPS / wpr) * R, first = (int64_t)blockIdx.x * block_rows;
    int64_t row0 = first + (int64_t)(warp / wpr) * R;
    int nrows = rows - row0 < R ? (int)(rows - row0) : R;
    if (blockIdx.y == 0) /* the block's rows, once for all token groups */
        tdm_prefetch_l2(w + first * row_bytes, (rows - first < block_rows ? rows - first : block_rows) * row_bytes);
    tdm_pdl_enter(); /* x is the previous kernel's */
    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++)
            acc[r][t] = 0.0f;
    if (nrows > 0)
        tdm_rows_dot_part<T, NT, R>(w + row0 * row_bytes, row_bytes, nrows, units, x,
                                    8 * (int64_t)units, ntok, sub * 32 + lane, 32 * wpr, acc);
    mv_reduce_store<NT, R, MVF_WARPS>(acc, red, 32, wpr, row0, nrows, rows, ntok, y, accumulate);
}

/* ---- int8-activation matvec (quantised formats, dp4a) ----
 * The block quantises x (all tokens, a chunk of k at a time) into shared
 * memory once and then walks row tiles (grid-stride, so the quantisation is
 * amortised over many rows of large matrices). In a tile, lpr lanes of a
 * warp share one row (short rows: 32 / lpr rows side by side), or wpr whole
 * warps share it (long rows); every lane carries R rows so that one shared
 * activation load serves R rows. A lane decodes whole units (1-2 groups of
 * 32) with wide loads and one scale decode per group. XG: x's int8 copy
 * (xg, written by the norm before it: one token, one chunk) is copied into
 * shared memory instead of quantising x in every block. */

/* One matrix of a launch: its rows, where they go, and the host's shape for
 * them (a pair launch carries two, each walked by its own blocks). */
typedef struct mv_seg {
    const uint8_t *w;
    int64_t row_bytes, rows;
    float *y;
    int lpr_log2, wpr;
    unsigned grid; /* blocks walking this matrix's tiles */
    int pf_tiles;  /* tiles a block asks L2 for before its wait (plan_q8) */
} mv_seg;

/* Block blk (< s.grid) of matrix s over ntok tokens of x (one token group). */
template <int T, int NT, int R, bool XG>
__device__ __forceinline__ void mv_q8_block(const mv_seg &s, unsigned blk, const float *__restrict__ x,
                                            const int8_t *__restrict__ xg, int64_t k, int ntok, int accumulate,
                                            int chunk)
{
    using Q = QT<T>;
    extern __shared__ __align__(128) int4 mv_smem[]; /* q [ntok][pitch] int8, s [ntok][pitch / 32] */
    __shared__ float red[R][NT][MVQ_WARPS];
    const int64_t rows = s.rows, row_bytes = s.row_bytes;
    const int lpr_log2 = s.lpr_log2, wpr = s.wpr;
    int pitch = (chunk + 127) & ~127;
    int8_t *xq8 = (int8_t *)mv_smem;
    const tdm_xq xq = {xq8, (const uint2 *)(xq8 + ntok * pitch), pitch};
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, lpr = 1 << lpr_log2;
    int sub = (warp % wpr) * lpr + (lane & (lpr - 1)), nsub = lpr * wpr;
    int rows_group = (32 >> lpr_log2) * R; /* rows of one group of wpr warps */
    int64_t tile_rows = (int64_t)(MVQ_WARPS / wpr) * rows_group;
    int64_t ntiles = (rows + tile_rows - 1) / tile_rows;
    int nchunks = (int)((k + chunk - 1) / chunk);
    for (int i = 0; i < s.pf_tiles; i++) {
        int64_t first = ((int64_t)blk + (int64_t)i * s.grid) * tile_rows;
        if (first >= rows)
            break;
        tdm_prefetch_l2(s.w + first * row_bytes, (rows - first < tile_rows ? rows - first : tile_rows) * row_bytes);
    }
    tdm_pdl_enter(); /* x is the previous kernel's */
    if (XG)
        tdm_xq_copy(mv_smem, xg, pitch);
    for (int64_t tile = blk; tile < ntiles; tile += s.grid) {
        int64_t row0 = tile * tile_rows + (warp / wpr) * rows_group + (lane >> lpr_log2) * R;
        int nrows = rows - row0 < R ? (int)(rows - row0) : R;
        float acc[R][NT];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int t = 0; t < NT; t++)
                acc[r][t] = 0.0f;
        for (int c = 0; c < nchunks; c++) {
            int64_t k0 = (int64_t)c * chunk;
            int n = k - k0 < chunk ? (int)(k - k0) : chunk;
            if (!XG && (nchunks > 1 || tile == blk)) { /* one chunk: x stays for every tile */
                __syncthreads();
                tdm_xq_fill(xq8, (uint2 *)(xq8 + ntok * pitch), pitch, x, k, ntok, k0, n);
                __syncthreads();
            }
            if (nrows > 0)
                tdm_q8_rows_part<T, NT, R>(s.w + row0 * row_bytes + k0 / Q::BLK * Q::BYTES, row_bytes,
                                           nrows, sub, n / Q::UNIT, nsub, xq, ntok, acc);
        }
        mv_reduce_store<NT, R, MVQ_WARPS>(acc, red, lpr, wpr, row0, nrows, rows, ntok, s.y, accumulate);
    }
}

template <int T, int NT, int R, bool XG>
__global__ void __launch_bounds__(MVQ_WARPS * 32, NT * R >= 16 ? 2 : MVQ_BLOCKS_PER_SM)
    matvec_q8_kernel(mv_seg s, int64_t k, const float *__restrict__ x, const int8_t *__restrict__ xg, int ntok,
                     int accumulate, int chunk)
{
    const int64_t t0 = mv_token_group(&ntok);
    s.y += t0 * s.rows;
    mv_q8_block<T, NT, R, XG>(s, blockIdx.x, x + t0 * k, xg, k, ntok, accumulate, chunk);
}

/* Two matrices of different types over one token's int8 copy of x, in one
 * launch: blocks [0, a.grid) walk a, the rest b (tdm_gpu_matvec_pair). a is
 * the table's first type, the large matrix of its pairs: under PDL its
 * blocks start their L2 prefetch first (b's first measured 3% slower in the
 * decode step, docs/GPU.md). */
template <int TA, int TB>
__global__ void __launch_bounds__(MVQ_WARPS * 32, MVQ_BLOCKS_PER_SM)
    matvec_q8_pair_kernel(mv_seg a, mv_seg b, int64_t k, const int8_t *__restrict__ xg, int accumulate)
{
    if (blockIdx.x < a.grid)
        mv_q8_block<TA, 1, 1, true>(a, blockIdx.x, NULL, xg, k, 1, accumulate, (int)k);
    else
        mv_q8_block<TB, 1, 1, true>(b, blockIdx.x - a.grid, NULL, xg, k, 1, accumulate, (int)k);
}

/* Warps per row: split long rows while the matrix has too few row groups to
 * give every SM plenty of warps; each lane keeps at least 2 units. */
static int auto_wpr(int64_t groups, int units, int sm_count)
{
    int64_t want = (int64_t)sm_count * 48; /* warps in flight that hide the latency */
    int wpr = 1;
    while (wpr < 4 && groups * wpr < want && units >= 2 * 32 * (2 * wpr))
        wpr *= 2;
    return wpr;
}

/* One launch's shape, chosen on the host. */
typedef struct mv_plan {
    const uint8_t *w;
    int64_t row_bytes, rows, k;
    const float *x;
    const int8_t *xq; /* x's int8 copy (one token) or NULL */
    int ntok; /* tokens of one group (<= TDM_GPU_MATVEC_MAX_TOK): picks the bucket */
    float *y;
    int acc, wpr, rpw;
    int all_tok;     /* every token of the call */
    unsigned groups; /* token groups: grid.y */
    int lpr_log2, chunk, pf_tiles; /* int8 path */
    unsigned grid;
    size_t smem;
} mv_plan;

static mv_seg seg_of(const mv_plan *p)
{
    return mv_seg{p->w, p->row_bytes, p->rows, p->y, p->lpr_log2, p->wpr, p->grid, p->pf_tiles};
}

#define MVF_LAUNCH(NT, R)                                                                     \
    e = tdm_launch(g, matvec_f_kernel<T, NT, R>, dim3(tdm_cdiv(p->rows, (MVF_WARPS / p->wpr) * R), p->groups), \
                   dim3(MVF_WARPS * 32), 0, p->w, p->row_bytes, p->rows, (int)(p->k / 8), p->x,   \
                   p->all_tok, p->y, p->acc, p->wpr)
#define MVQ_LAUNCH(NT, R) MVQ_LAUNCH_X(NT, R, false)
#define MVQ_LAUNCH_X(NT, R, XG)                                                               \
    e = tdm_launch(g, matvec_q8_kernel<T, NT, R, XG>, dim3(p->grid, p->groups), dim3(MVQ_WARPS * 32), \
                   p->smem, seg_of(p), p->k, p->x, p->xq, p->all_tok, p->acc, p->chunk)
/* token buckets 1, 2, 4, 8; R = 2 only from 3 tokens on */
#define MV_BUCKETS(L)                                                                         \
    do {                                                                                      \
        if (p->ntok == 1)                                                                     \
            L(1, 1);                                                                          \
        else if (p->ntok == 2)                                                                \
            L(2, 1);                                                                          \
        else if (p->ntok <= 4 && p->rpw == 1)                                                 \
            L(4, 1);                                                                          \
        else if (p->ntok <= 4)                                                                \
            L(4, 2);                                                                          \
        else if (p->rpw == 1)                                                                 \
            L(8, 1);                                                                          \
        else                                                                                  \
            L(8, 2);                                                                          \
    } while (0)

/* Fills the int8 path's shape: chunk of k held in shared memory (all of k
 * when x's int8 copy is given), lanes per row, warps per row, grid, and the
 * tiles each block asks L2 for before its wait: all of its share while the
 * launch's shares fit an eighth of L2, else as many as fit (at least one;
 * an eighth measured +0.8% against a quarter on the H200: 6 of 6 rounds). */
template <int T> static void plan_q8(mv_plan *p, const tdm_gpu *g)
{
    const tdm_gpu_tuning *tu = &g->tune;
    const int sm_count = g->sm_count;
    if (p->k > MV_XQ_ELEMS) /* a copy too long for shared memory: quantise x in chunks */
        p->xq = NULL;
    int64_t cap = p->xq ? p->k : MV_XQ_ELEMS / p->ntok / 256 * 256; /* chunks end on block boundaries */
    p->chunk = (int)(p->k <= cap ? p->k : cap);
    int units = p->chunk / QT<T>::UNIT;
    p->lpr_log2 = 0;
    while ((1 << p->lpr_log2) < 32 && (1 << p->lpr_log2) < units)
        p->lpr_log2++;
    int64_t groups = (p->rows + p->rpw - 1) / p->rpw;
    if (p->lpr_log2 < 5) /* several rows per warp already: a warp never spans rows */
        p->wpr = 1;
    else
        /* the one-token R = 2 launch keeps R = 1's warps per row: the same
         * partial sums, so y does not depend on whether x's copy is given */
        p->wpr = tu->matvec_wpr ? tu->matvec_wpr : auto_wpr(p->xq ? p->rows : groups, units, sm_count);
    int64_t tile = (int64_t)(MVQ_WARPS / p->wpr) * (32 >> p->lpr_log2) * p->rpw;
    int64_t tiles = (p->rows + tile - 1) / tile, cap_grid = (int64_t)sm_count * MVQ_BLOCKS_PER_SM;
    p->grid = (unsigned)(tiles < cap_grid ? tiles : cap_grid);
    const int64_t fit = g->l2_bytes / 8 / p->grid / (tile * p->row_bytes);
    p->pf_tiles = (int)(fit < 1 ? 1 : fit < tiles ? fit : tiles);
    size_t pitch = ((size_t)p->chunk + 127) & ~(size_t)127; /* as in the kernel */
    /* with a copy given too: it is staged there (a kernel launched with no
     * dynamic shared memory lost 15% of the decode step under PDL) */
    p->smem = p->ntok * pitch + p->ntok * (pitch / 32) * sizeof(uint2);
}

template <int T> static cudaError_t launch_matvec(const tdm_gpu *g, mv_plan *p)
{
    cudaError_t e;
    if constexpr (QT<T>::I8) {
        /* one token from x's int8 copy over 8192 rows or more (lm head,
         * DeltaNet and attention inputs): 2 rows per lane keep both rows'
         * loads in flight (+1.7% decode, docs/GPU.md) */
        if (p->xq && p->k <= MV_XQ_ELEMS && p->rows >= 8192 && p->k >= 2048)
            p->rpw = 2;
        plan_q8<T>(p, g);
        if (p->xq && p->rpw == 2)
            MVQ_LAUNCH_X(1, 2, true);
        else if (p->xq)
            MVQ_LAUNCH_X(1, 1, true);
        else
            MV_BUCKETS(MVQ_LAUNCH);
    } else {
        p->wpr = g->tune.matvec_wpr ? g->tune.matvec_wpr
                                    : auto_wpr((p->rows + p->rpw - 1) / p->rpw, (int)(p->k / 8), g->sm_count);
        MV_BUCKETS(MVF_LAUNCH);
    }
    return e;
}

/* Shared argument checks of the weight-reading entry points. */
static tdm_status check_weights(tdm_qtype wt, const void *w, int64_t rows, int64_t k,
                                const char *who, int64_t *row_bytes, tdm_error *err)
{
    int blk, bytes;
    if (!tdm_gpu_qt_geometry(wt, &blk, &bytes))
        return tdm_error_set(err, TDM_ERR_UNSUPPORTED, "%s: weight type %s (%d) has no GPU kernel",
                             who, tdm_qtype_name(wt), (int)wt);
    TDM_REQUIRE(err, w != NULL, "%s: weights are NULL", who);
    TDM_REQUIRE(err, rows > 0 && k > 0, "%s: bad shape rows=%lld k=%lld", who, (long long)rows,
                (long long)k);
    TDM_REQUIRE(err, k % blk == 0, "%s: k=%lld is not a multiple of the %s block (%d)", who,
                (long long)k, tdm_qtype_name(wt), blk);
    TDM_REQUIRE(err, k / 8 <= INT32_MAX && rows <= INT32_MAX, "%s: shape too large", who);
    tdm_status s = tdm_gpu_check_align(wt, w, 0, who, "the", err);
    if (s != TDM_OK)
        return s;
    *row_bytes = k / blk * bytes;
    return TDM_OK;
}

extern "C" tdm_status tdm_gpu_matvec(tdm_gpu *g, tdm_qtype wt, const void *w, int64_t rows,
                                     int64_t k, const float *x, const void *xq, int ntok, float *y,
                                     bool accumulate, tdm_error *err)
{
    int64_t row_bytes = 0;
    tdm_status s = check_weights(wt, w, rows, k, "gpu matvec", &row_bytes, err);
    if (s != TDM_OK)
        return s;
    const int64_t groups = ((int64_t)ntok + TDM_GPU_MATVEC_MAX_TOK - 1) / TDM_GPU_MATVEC_MAX_TOK;
    TDM_REQUIRE(err, ntok >= 1 && groups <= 65535, "gpu matvec: ntok=%d outside 1..%d", ntok,
                65535 * TDM_GPU_MATVEC_MAX_TOK);
    TDM_REQUIRE(err, x && y, "gpu matvec: NULL activation or output");
    TDM_REQUIRE(err, ((uintptr_t)x & 15) == 0, "gpu matvec: x must be 16-byte aligned");
    TDM_REQUIRE(err, !xq || (ntok == 1 && ((uintptr_t)xq & 15) == 0),
                "gpu matvec: an int8 copy of x serves one token (ntok=%d) and must be 16-byte aligned", ntok);
    /* 2 rows per lane from 3 tokens on, for large matrices only: it halves the
     * activation loads (1.4-1.6x at 8 tokens on 2048x4096 .. 248320x2048) but
     * costs parallelism on expert-sized ones (measured, docs/GPU.md); one
     * token from x's int8 copy: launch_matvec */
    const int per = ntok < TDM_GPU_MATVEC_MAX_TOK ? ntok : TDM_GPU_MATVEC_MAX_TOK;
    mv_plan p = {(const uint8_t *)w, row_bytes, rows, k, x, (const int8_t *)xq, per, y, accumulate ? 1 : 0, 1, 1};
    p.all_tok = ntok;
    p.groups = (unsigned)groups;
    p.rpw = per <= 2 ? 1
            : g->tune.matvec_rows ? g->tune.matvec_rows
            : rows >= 2048 && k >= 2048 ? 2 : 1;
    cudaError_t e = cudaErrorInvalidValue;
    TDM_QT_DISPATCH(wt, (e = launch_matvec<QTYPE>(g, &p)));
    TDM_CU(err, e);
    return TDM_OK;
}

/* ---- two matrices of different types, one launch ---- */

/* Both matrices planned as their own tdm_gpu_matvec calls would be (so the
 * same lanes sum the same partials: bit-equal), side by side in one grid. */
template <int TA, int TB> static cudaError_t launch_pair(const tdm_gpu *g, mv_plan *a, mv_plan *b)
{
    plan_q8<TA>(a, g);
    plan_q8<TB>(b, g);
    return tdm_launch(g, matvec_q8_pair_kernel<TA, TB>, dim3(a->grid + b->grid), dim3(MVQ_WARPS * 32), a->smem,
                      seg_of(a), seg_of(b), a->k, a->xq, a->acc);
}

typedef cudaError_t (*mv_pair_fn)(const tdm_gpu *, mv_plan *, mv_plan *);

/* The pairs with a kernel: the mixes of llama.cpp's K-quant recipes, where
 * attn_v takes more bits than q and k (q|k the first type). */
static const struct {
    tdm_qtype a, b;
    mv_pair_fn launch;
} k_mv_pairs[] = {
    {TDM_Q_Q4_K, TDM_Q_Q6_K, launch_pair<TDM_Q_Q4_K, TDM_Q_Q6_K>},
    {TDM_Q_Q5_K, TDM_Q_Q6_K, launch_pair<TDM_Q_Q5_K, TDM_Q_Q6_K>},
    {TDM_Q_Q4_K, TDM_Q_Q5_K, launch_pair<TDM_Q_Q4_K, TDM_Q_Q5_K>},
    {TDM_Q_Q3_K, TDM_Q_Q5_K, launch_pair<TDM_Q_Q3_K, TDM_Q_Q5_K>},
    {TDM_Q_Q3_K, TDM_Q_Q4_K, launch_pair<TDM_Q_Q3_K, TDM_Q_Q4_K>},
    {TDM_Q_Q2_K, TDM_Q_Q4_K, launch_pair<TDM_Q_Q2_K, TDM_Q_Q4_K>},
};

/* The pair's launcher (*swap: a and b trade places in it), or NULL. */
static mv_pair_fn pair_fn(tdm_qtype a, tdm_qtype b, bool *swap)
{
    for (size_t i = 0; i < sizeof k_mv_pairs / sizeof k_mv_pairs[0]; i++)
        if ((k_mv_pairs[i].a == a && k_mv_pairs[i].b == b) || (k_mv_pairs[i].a == b && k_mv_pairs[i].b == a)) {
            *swap = k_mv_pairs[i].a != a;
            return k_mv_pairs[i].launch;
        }
    return NULL;
}

extern "C" bool tdm_gpu_matvec_pair_one_launch(tdm_qtype a, tdm_qtype b, int64_t k, bool xq)
{
    bool swap;
    return xq && k <= MV_XQ_ELEMS && pair_fn(a, b, &swap) != NULL;
}

extern "C" tdm_status tdm_gpu_matvec_pair(tdm_gpu *g, const tdm_gpu_mat *a, const tdm_gpu_mat *b, int64_t k,
                                          const float *x, const void *xq, float *y, bool accumulate, tdm_error *err)
{
    TDM_REQUIRE(err, a && b && y, "gpu matvec pair: NULL matrix or output");
    if (!tdm_gpu_matvec_pair_one_launch(a->type, b->type, k, xq != NULL)) {
        tdm_status s = tdm_gpu_matvec(g, a->type, a->w, a->rows, k, x, xq, 1, y, accumulate, err);
        return s ? s : tdm_gpu_matvec(g, b->type, b->w, b->rows, k, x, xq, 1, y + a->rows, accumulate, err);
    }
    int64_t rba = 0, rbb = 0;
    tdm_status s = check_weights(a->type, a->w, a->rows, k, "gpu matvec pair", &rba, err);
    if (s == TDM_OK)
        s = check_weights(b->type, b->w, b->rows, k, "gpu matvec pair", &rbb, err);
    if (s != TDM_OK)
        return s;
    TDM_REQUIRE(err, x != NULL, "gpu matvec pair: NULL activation");
    TDM_REQUIRE(err, ((uintptr_t)x & 15) == 0 && ((uintptr_t)xq & 15) == 0,
                "gpu matvec pair: x and its int8 copy must be 16-byte aligned");
    const int acc = accumulate ? 1 : 0;
    mv_plan pa = {(const uint8_t *)a->w, rba, a->rows, k, x, (const int8_t *)xq, 1, y, acc, 1, 1};
    mv_plan pb = {(const uint8_t *)b->w, rbb, b->rows, k, x, (const int8_t *)xq, 1, y + a->rows, acc, 1, 1};
    pa.all_tok = pb.all_tok = 1;
    pa.groups = pb.groups = 1;
    bool swap = false;
    mv_pair_fn launch = pair_fn(a->type, b->type, &swap);
    TDM_CU(err, swap ? launch(g, &pb, &pa) : launch(g, &pa, &pb));
    return TDM_OK;
}

/* One thread per unit: 8 elements -> 8 halves (one 16-byte store). */
template <int T>
__global__ void dequant_f16_kernel(const uint8_t *__restrict__ w, int64_t row_bytes, int units,
                                   int64_t total, uint16_t *__restrict__ dst)
{
    tdm_pdl_enter();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total)
        return;
    int64_t row = i / units;
    int u = (int)(i - row * units);
    float q[8];
    tdm_dq_unit<T>(w + row * row_bytes, u, q);
    *(uint4 *)(dst + 8 * i) = tdm_pack_f16x8(q);
}

extern "C" tdm_status tdm_gpu_dequant_f16(tdm_gpu *g, tdm_qtype wt, const void *w, int64_t rows,
                                          int64_t k, uint16_t *dst, tdm_error *err)
{
    int64_t row_bytes = 0;
    tdm_status s = check_weights(wt, w, rows, k, "gpu dequant_f16", &row_bytes, err);
    if (s != TDM_OK)
        return s;
    TDM_REQUIRE(err, dst && ((uintptr_t)dst & 15) == 0,
                "gpu dequant_f16: destination NULL or not 16-byte aligned");
    int units = (int)(k / 8);
    int64_t total = rows * units;
    unsigned grid = tdm_cdiv(total, 256);
    const uint8_t *wb = (const uint8_t *)w;
    cudaError_t e = cudaErrorInvalidValue;
    TDM_QT_DISPATCH(wt, (e = tdm_launch(g, dequant_f16_kernel<QTYPE>, grid, 256, 0, wb, row_bytes, units, total, dst)));
    TDM_CU(err, e);
    return TDM_OK;
}

__global__ void f32_to_f16_kernel(const float *__restrict__ x, int64_t n, __half *__restrict__ y)
{
    tdm_pdl_enter();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = __float2half_rn(x[i]);
}

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

extern "C" size_t tdm_gpu_matmul_scratch_bytes(int64_t chunk_rows, int64_t k, int64_t ntok)
{
    return align256((size_t)(ntok * k) * 2) + (size_t)(chunk_rows * k) * 2;
}

extern "C" tdm_status tdm_gpu_matmul(tdm_gpu *g, tdm_qtype wt, const void *w, int64_t rows,
                                     int64_t k, const float *x, int64_t ntok, float *y,
                                     void *scratch, size_t scratch_bytes, tdm_error *err)
{
    int64_t row_bytes = 0;
    tdm_status s = check_weights(wt, w, rows, k, "gpu matmul", &row_bytes, err);
    if (s != TDM_OK)
        return s;
    TDM_REQUIRE(err, x && y && scratch, "gpu matmul: NULL activation, output or scratch");
    TDM_REQUIRE(err, ntok >= 1 && ntok <= INT32_MAX && k <= INT32_MAX, "gpu matmul: ntok=%lld",
                (long long)ntok);
    TDM_REQUIRE(err, ((uintptr_t)scratch & 255) == 0, "gpu matmul: scratch not 256-byte aligned");
    const float one = 1.0f, zero = 0.0f;
    if (wt == TDM_Q_F32) { /* nothing to convert: SGEMM on the weights in place, float32 throughout */
        TDM_BLAS(err, cublasSgemm(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)ntok, (int)k, &one,
                                  (const float *)w, (int)k, x, (int)k, &zero, y, (int)rows));
        return TDM_OK;
    }
    size_t xbytes = align256((size_t)(ntok * k) * 2);
    TDM_REQUIRE(err, scratch_bytes >= xbytes + (size_t)k * 2,
                "gpu matmul: scratch of %zu bytes < %zu needed for one row", scratch_bytes,
                xbytes + (size_t)k * 2);
    int64_t chunk = (int64_t)((scratch_bytes - xbytes) / ((size_t)k * 2));
    chunk -= chunk % 8; /* keeps each chunk's fp16 rows 16-byte aligned for the dequant stores */
    if (chunk < 1)
        chunk = 1;
    if (chunk > rows)
        chunk = rows;
    __half *x16 = (__half *)scratch;
    uint16_t *w16 = (uint16_t *)((char *)scratch + xbytes);
    TDM_LAUNCH(err, g, f32_to_f16_kernel, tdm_cdiv(ntok * k, 256), 256, 0, x, ntok * k, x16);
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
        int64_t n = rows - r0 < chunk ? rows - r0 : chunk;
        s = tdm_gpu_dequant_f16(g, wt, (const uint8_t *)w + r0 * row_bytes, n, k, w16, err);
        if (s != TDM_OK)
            return s;
        /* column-major view: C[rows x ntok] = W16^T[rows x k] * X16[k x ntok] */
        TDM_BLAS(err, cublasGemmEx(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)ntok, (int)k,
                                   &one, w16, CUDA_R_16F, (int)k, x16, CUDA_R_16F, (int)k, &zero,
                                   y + r0, CUDA_R_32F, (int)rows, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT));
    }
    return TDM_OK;
}

/* Test hook: the same table on the host (no device needed). */
extern "C" tdm_status tdm_gpu_dequant_row_host(tdm_qtype wt, const void *src, float *dst,
                                               int64_t n, tdm_error *err)
{
    int blk, bytes;
    if (!tdm_gpu_qt_geometry(wt, &blk, &bytes))
        return tdm_error_set(err, TDM_ERR_UNSUPPORTED, "gpu dequant host: type %s",
                             tdm_qtype_name(wt));
    TDM_REQUIRE(err, n % blk == 0 && n % 8 == 0, "gpu dequant host: n=%lld", (long long)n);
    const uint8_t *row = (const uint8_t *)src;
    for (int64_t u = 0; u < n / 8; u++)
        TDM_QT_DISPATCH(wt, (tdm_dq_unit<QTYPE>(row, (int)u, dst + 8 * u)));
    return TDM_OK;
}

/* Test hook: the int8 decoders on the host, as floats d (q - Z) - m per element. */
template <int T> static void dequant_i8_row(const uint8_t *row, int64_t n, float *dst)
{
    if constexpr (QT<T>::I8) {
        constexpr int UPB = QT<T>::BLK / QT<T>::UNIT;
        for (int64_t u = 0; u < n / QT<T>::UNIT; u++) {
            int64_t blk = u / UPB;
            int ub = (int)(u % UPB);
            tdm_qg g[QT<T>::NG];
            QT<T>::dqi8(row + blk * QT<T>::BYTES, ub, g);
            for (int i = 0; i < QT<T>::NG; i++) {
                float *o = dst + blk * QT<T>::BLK + 32 * QT<T>::group(ub, i);
                for (int e = 0; e < 32; e++) {
                    const uint32_t byte = (g[i].q[e / 4] >> (8 * (e % 4))) & 0xFF;
                    const int q = QT<T>::ZERO ? (int)byte - QT<T>::ZERO : (int)(int8_t)byte;
                    o[e] = g[i].d[e / 16] * (float)q - g[i].m[e / 16];
                }
            }
        }
    }
}

extern "C" tdm_status tdm_gpu_dequant_i8_row_host(tdm_qtype wt, const void *src, float *dst,
                                                  int64_t n, tdm_error *err)
{
    int blk, bytes;
    if (!tdm_gpu_qt_geometry(wt, &blk, &bytes) || blk < 32)
        return tdm_error_set(err, TDM_ERR_UNSUPPORTED, "gpu int8 dequant host: type %s",
                             tdm_qtype_name(wt));
    TDM_REQUIRE(err, n % blk == 0, "gpu int8 dequant host: n=%lld", (long long)n);
    TDM_QT_DISPATCH(wt, (dequant_i8_row<QTYPE>((const uint8_t *)src, n, dst)));
    return TDM_OK;
}

/* Test hook: the kernels' activation quantisation on the host. */
extern "C" void tdm_gpu_xq_host(const float *x, int64_t n, int8_t *q, float *dx)
{
    for (int64_t g = 0; g < n / 32; g++) {
        float amax = 0.0f;
        for (int i = 0; i < 32; i++)
            amax = tdm_max_nan(amax, fabsf(x[32 * g + i]));
        float inv = tdm_xq_inv(amax);
        for (int i = 0; i < 32; i++)
            q[32 * g + i] = (int8_t)tdm_xq_round(x[32 * g + i], inv);
        dx[g] = tdm_xq_scale(amax);
    }
}

/* Test hook: ntok rows of k activations quantised as the kernels do, in the
 * layout of their int8 activations (swizzle, half sums; tdm_gpu_xq8_bytes):
 * what a norm writes as its int8 copy. Bytes past k stay as they were. */
extern "C" tdm_status tdm_gpu_xq8_pack_host(const float *x, int64_t ntok, int64_t k, void *copy, tdm_error *err)
{
    TDM_REQUIRE(err, ntok > 0 && k > 0 && k % 32 == 0 && k <= (1 << 24), "gpu xq8 pack host: %lld x %lld",
                (long long)ntok, (long long)k);
    const int pitch = (int)((k + 127) & ~127);
    int8_t *qs = (int8_t *)copy, *q = (int8_t *)malloc((size_t)k);
    uint2 *s = (uint2 *)(qs + ntok * pitch);
    float *dx = (float *)malloc(sizeof(float) * (size_t)(k / 32));
    if (!q || !dx) {
        free(q), free(dx);
        return tdm_error_set(err, TDM_ERR_OOM, "gpu xq8 pack host: k=%lld", (long long)k);
    }
    for (int64_t t = 0; t < ntok; t++) {
        tdm_gpu_xq_host(x + t * k, k, q, dx);
        for (int64_t g = 0; g < k / 32; g++) {
            int half[2] = {0, 0};
            for (int e = 0; e < 32; e++) {
                qs[t * pitch + tdm_xq_swz((int)(32 * g + e))] = q[32 * g + e];
                half[e / 16] += q[32 * g + e];
            }
            s[t * (pitch / 32) + g] =
                make_uint2(tdm_f32_bits(dx[g]), ((uint32_t)half[0] & 0xFFFFu) | (uint32_t)half[1] << 16);
        }
    }
    free(q), free(dx);
    return TDM_OK;
}

/* Test hook: one row's dot product on the int8 path, on the host: x
 * quantised as the kernels do, laid out as in their shared memory
 * (tdm_gpu_xq8_pack_host), then the kernels' own tdm_q8_rows_part. */
template <int T> static void dot_i8_row(const uint8_t *row, int64_t k, const tdm_xq &xq, float *out)
{
    if constexpr (QT<T>::I8) {
        float acc[1][1] = {{0.0f}};
        tdm_q8_rows_part<T, 1, 1>(row, 0, 1, 0, (int)(k / QT<T>::UNIT), 1, xq, 1, acc);
        *out = acc[0][0];
    }
}

extern "C" tdm_status tdm_gpu_dot_i8_host(tdm_qtype wt, const void *row, int64_t k, const float *x,
                                          float *out, tdm_error *err)
{
    int blk, bytes;
    if (!tdm_gpu_qt_geometry(wt, &blk, &bytes) || blk < 32)
        return tdm_error_set(err, TDM_ERR_UNSUPPORTED, "gpu int8 dot host: type %s",
                             tdm_qtype_name(wt));
    TDM_REQUIRE(err, k > 0 && k % blk == 0 && k <= (1 << 24), "gpu int8 dot host: k=%lld",
                (long long)k);
    int pitch = (int)((k + 127) & ~127);
    int8_t *qs = (int8_t *)aligned_alloc(128, (tdm_gpu_xq8_bytes(1, k) + 127) & ~(size_t)127);
    if (!qs)
        return tdm_error_set(err, TDM_ERR_OOM, "gpu int8 dot host: k=%lld", (long long)k);
    tdm_status st = tdm_gpu_xq8_pack_host(x, 1, k, qs, err);
    if (st) {
        free(qs);
        return st;
    }
    const uint2 *s = (const uint2 *)(qs + pitch);
    tdm_xq xq = {qs, s, pitch};
    TDM_QT_DISPATCH(wt, (dot_i8_row<QTYPE>((const uint8_t *)row, k, xq, out)));
    free(qs);
    return TDM_OK;
}
