/* gpu_moe_prefill: the fused MoE layer for prompt batches, grouped by expert.
 *
 * The decode kernels (gpu_moe.cu) give every (row, selection) its own warp,
 * so with hundreds of tokens each expert row is re-read and re-decoded once
 * per token that chose it. Here:
 *   1. plan (one block): counting sort of the ntok * k selections by expert
 *      (skipping non-resident ones), the shared expert appended as group
 *      n_expert with all tokens; the groups are cut into tiles of at most
 *      PF_TN selections. Only device memory is touched, so the launches are
 *      graph-capturable; the next grids are sized for the worst case and
 *      blocks past the real tile count exit.
 *   2. gate_up: block = (tile, PF_BM rows); per PF_BK-wide step it decodes the
 *      gate and up tiles to fp16 in shared memory ONCE and multiplies them
 *      with the tile's PF_TN gathered tokens on the tensor cores (wmma,
 *      fp16 x fp16 -> fp32), then writes silu(g) * u into h.
 *   3. down: the same GEMM core over the down matrices and h; each selection's
 *      unweighted product goes to a partial row in scratch.
 *   4. reduce: thread per output element sums the partials in rank order
 *      (then the shared expert), so the result is deterministic without
 *      float atomics.
 * A selection s < ntok * k is (token s / k, rank s % k); s = ntok * k + t is
 * token t's shared expert (rank k in h). */
#include <mma.h>

#include "gpu_quant.cuh"

#define PF_MAX_EXPERTS 4096
#define PF_PLAN_THREADS 1024
#define PF_THREADS 128             /* 4 warps, 16 weight rows each */
#define PF_BM 64                   /* weight rows per block */
#define PF_TN 32                   /* selections (tokens) per tile */
#define PF_BK 64                   /* reduction elements per step */
#define PF_UK (PF_BK / 8)          /* decode units per row and step */
#define PF_LDH (PF_BK + 8)         /* fp16 row stride in shared memory (pads banks) */
#define PF_LDC (PF_BM + 4)         /* float stride of the epilogue tile */

static_assert(PF_BM == (PF_THREADS / 32) * 16, "one 16-row wmma slab per warp");
static_assert(PF_TN % 16 == 0 && PF_BK % 16 == 0, "wmma tiles are 16 x 16 x 16");
static_assert(PF_TN * PF_LDC * 4 <= PF_BM * PF_LDH * 2,
              "the float epilogue tile of a matrix fits in its fp16 weight tile");

typedef struct pf_mat {
    const uint8_t *w;   /* routed: the matrix in slot 0 (add slot * slot_bytes); shared: itself */
    int64_t row_bytes;
    int type, rows, units; /* units: elements per row / 8 */
} pf_mat;

typedef struct pf_args {
    const int32_t *slot_of; /* this layer's row of the residency table */
    int32_t n_expert;
    int64_t slot_bytes;
    pf_mat mat[2][3];       /* [routed, shared][gate, up, down] */
    int has_shared;
    const float *sh_logit;
    int n_embd, k, ntok, nsel; /* nsel = ntok * k */
    int64_t h_stride;
} pf_args;

typedef struct pf_tile {
    int32_t group; /* expert id, or n_expert for the shared expert */
    int32_t start; /* first entry in perm */
    int32_t count; /* 1..PF_TN */
} pf_tile;

typedef struct pf_plan {
    int32_t *perm;   /* [nsel + ntok]: selections grouped by expert */
    pf_tile *tiles;  /* [max_tiles] */
    int32_t *ntiles; /* [1] */
    float *part;     /* [nsel + ntok][n_embd]: unweighted down products */
} pf_plan;

/* Scratch layout for ntok tokens; shared by the size query and the launch. */
typedef struct pf_layout {
    size_t part, perm, tiles, ntiles, total;
    int64_t max_tiles;
} pf_layout;

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

static void pf_layout_of(int64_t n_expert, int64_t ntok, int64_t k, int64_t n_embd, bool shared,
                         pf_layout *lo)
{
    int64_t nsel = ntok * k, sels = nsel + (shared ? ntok : 0);
    /* sum over experts of ceil(c_e / TN) <= ceil(nsel / TN) + (experts used) */
    lo->max_tiles = (nsel + PF_TN - 1) / PF_TN + (n_expert < nsel ? n_expert : nsel) +
                    (shared ? (ntok + PF_TN - 1) / PF_TN : 0);
    size_t o = 0;
    lo->part = o;
    o += align256((size_t)sels * (size_t)n_embd * sizeof(float));
    lo->perm = o;
    o += align256((size_t)sels * sizeof(int32_t));
    lo->tiles = o;
    o += align256((size_t)lo->max_tiles * sizeof(pf_tile));
    lo->ntiles = o;
    o += 256;
    lo->total = o;
}

/* ---- 1. plan ---- */

/* Expert e when it is resident, else -1 (ids out of range count as not). */
__device__ __forceinline__ int pf_resident(const pf_args &a, int32_t e)
{
    return e >= 0 && e < a.n_expert && a.slot_of[e] >= 0 ? e : -1;
}

/* In-place exclusive prefix sum of v[0..n) by the whole block (every thread
 * calls it): each thread scans a contiguous chunk, warps combine chunk sums
 * with shuffles, warp 0 scans the warp totals. */
__device__ void pf_block_exclusive_scan(int *v, int n)
{
    __shared__ int warp_base[32];
    int per = (n + (int)blockDim.x - 1) / (int)blockDim.x;
    int lo = (int)threadIdx.x * per, hi = min(lo + per, n);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (int)blockDim.x >> 5;
    int sum = 0;
    for (int i = lo; i < hi; i++)
        sum += v[i];
    int inc = sum;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        int u = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o)
            inc += u;
    }
    if (lane == 31)
        warp_base[warp] = inc;
    __syncthreads();
    if (warp == 0) {
        int tot = lane < nwarps ? warp_base[lane] : 0, winc = tot;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            int u = __shfl_up_sync(0xffffffffu, winc, o);
            if (lane >= o)
                winc += u;
        }
        if (lane < nwarps)
            warp_base[lane] = winc - tot;
    }
    __syncthreads();
    int run = warp_base[warp] + inc - sum;
    for (int i = lo; i < hi; i++) {
        int c = v[i];
        v[i] = run;
        run += c;
    }
    __syncthreads();
}

/* One block. Groups g = 0..n_expert (the last is the shared expert);
 * off[g] = first perm entry of group g, toff[g] = its first tile. */
__global__ void __launch_bounds__(PF_PLAN_THREADS)
    pf_plan_kernel(pf_args a, const int32_t *__restrict__ ids, pf_plan p)
{
    tdm_pdl_enter();
    extern __shared__ int pf_sm[];
    const int G = a.n_expert + 1, tid = threadIdx.x, nt = blockDim.x;
    int *off = pf_sm, *toff = pf_sm + G + 1;
    for (int g = tid; g <= G; g += nt)
        off[g] = 0;
    __syncthreads();
    for (int s = tid; s < a.nsel; s += nt) {
        int e = pf_resident(a, ids[s]);
        if (e >= 0)
            atomicAdd(&off[e], 1);
    }
    if (tid == 0)
        off[a.n_expert] = a.has_shared ? a.ntok : 0;
    __syncthreads();
    pf_block_exclusive_scan(off, G + 1); /* off[G] = number of grouped selections */
    for (int g = tid; g <= G; g += nt)
        toff[g] = g < G ? (off[g + 1] - off[g] + PF_TN - 1) / PF_TN : 0;
    __syncthreads();
    pf_block_exclusive_scan(toff, G + 1);
    for (int g = tid; g < G; g += nt) {
        int start = off[g], n = off[g + 1] - start;
        for (int j = 0; j * PF_TN < n; j++)
            p.tiles[toff[g] + j] = {g, start + j * PF_TN, min(PF_TN, n - j * PF_TN)};
    }
    if (tid == 0)
        *p.ntiles = toff[G];
    __syncthreads(); /* off[] becomes the experts' insertion cursors */
    for (int s = tid; s < a.nsel; s += nt) {
        int e = pf_resident(a, ids[s]);
        if (e >= 0)
            p.perm[atomicAdd(&off[e], 1)] = s;
    }
    /* order inside a group does not matter: every selection's values are
     * computed independently of the other tokens of its tile */
    for (int t = tid; a.has_shared && t < a.ntok; t += nt)
        p.perm[off[a.n_expert] + t] = a.nsel + t;
}

/* ---- 2./3. the grouped GEMM ---- */

/* Decodes unit u of a row whose type is known only at run time (block-uniform). */
__device__ __forceinline__ void pf_dq_unit(int type, const uint8_t *row, int u, float *q)
{
    TDM_QT_DISPATCH(type, (tdm_dq_unit<QTYPE>(row, u, q)));
}

/* h row of selection s: [t][rank] in h's [ntok][k + shared] rows. */
__device__ __forceinline__ int64_t pf_h_row(const pf_args &a, int s)
{
    int t = s < a.nsel ? s / a.k : s - a.nsel, rank = s < a.nsel ? s % a.k : a.k;
    return ((int64_t)t * (a.k + a.has_shared) + rank) * a.h_stride;
}

/* NMAT = 2: gate_up (matrices gate and up, source x, output h);
 * NMAT = 1: down (source h, output the partial rows). Block = one tile of
 * selections x PF_BM weight rows; warp w owns rows 16w..16w+15 of the block
 * for all PF_TN selections and every matrix. */
template <int NMAT>
__global__ void __launch_bounds__(PF_THREADS)
    pf_gemm_kernel(pf_args a, pf_plan p, const float *__restrict__ src, float *__restrict__ dst)
{
    tdm_pdl_enter();
    using namespace nvcuda;
    __shared__ __align__(128) unsigned char sm[(NMAT * PF_BM + PF_TN) * PF_LDH * 2];
    __shared__ int64_t src_off[PF_TN], dst_off[PF_TN];
    if ((int)blockIdx.x >= *p.ntiles)
        return;
    const pf_tile tl = p.tiles[blockIdx.x];
    const int kind = tl.group == a.n_expert, warp = threadIdx.x >> 5, tid = threadIdx.x;
    const int64_t slot = kind ? 0 : a.slot_of[tl.group];
    const pf_mat *mats = &a.mat[kind][NMAT == 2 ? 0 : 2];
    const int rows = mats[0].rows, units = mats[0].units, row0 = blockIdx.y * PF_BM;
    if (row0 >= rows)
        return; /* the shared expert's n_ff may be smaller than the grid's */
    if (tid < PF_TN) {
        int64_t so = -1, d = 0;
        if (tid < tl.count) {
            int s = p.perm[tl.start + tid];
            int64_t hr = pf_h_row(a, s);
            int t = s < a.nsel ? s / a.k : s - a.nsel;
            so = NMAT == 2 ? (int64_t)t * a.n_embd : hr;
            d = NMAT == 2 ? hr : (int64_t)s * a.n_embd;
        }
        src_off[tid] = so;
        dst_off[tid] = d;
    }
    __half *As = (__half *)sm, *Bs = As + NMAT * PF_BM * PF_LDH;

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[NMAT][PF_TN / 16];
#pragma unroll
    for (int m = 0; m < NMAT; m++)
#pragma unroll
        for (int n = 0; n < PF_TN / 16; n++)
            wmma::fill_fragment(acc[m][n], 0.0f);
    const int nfrag = (tl.count + 15) / 16; /* token slabs with at least one real token */

    for (int u0 = 0; u0 < units; u0 += PF_UK) {
        __syncthreads(); /* the previous step's fragments are loaded; src_off is set */
        /* weights: consecutive threads take consecutive units of one row */
#pragma unroll
        for (int m = 0; m < NMAT; m++) {
            const uint8_t *w = mats[m].w + slot * a.slot_bytes;
            for (int i = tid; i < PF_BM * PF_UK; i += PF_THREADS) {
                int uu = i % PF_UK, r = i / PF_UK, u = u0 + uu, row = row0 + r;
                float q[8] = {0, 0, 0, 0, 0, 0, 0, 0};
                if (row < rows && u < units)
                    pf_dq_unit(mats[m].type, w + row * mats[m].row_bytes, u, q);
                __half2 hq[4];
#pragma unroll
                for (int e = 0; e < 4; e++)
                    hq[e] = __floats2half2_rn(q[2 * e], q[2 * e + 1]);
                *(uint4 *)(As + (m * PF_BM + r) * PF_LDH + uu * 8) = *(uint4 *)hq;
            }
        }
        /* activations: PF_TN gathered rows, float4 loads (rows are 16-byte aligned) */
        for (int i = tid; i < PF_TN * (PF_BK / 4); i += PF_THREADS) {
            int c4 = i % (PF_BK / 4), j = i / (PF_BK / 4), e0 = u0 * 8 + c4 * 4;
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (src_off[j] >= 0 && e0 < units * 8)
                v = __ldg((const float4 *)(src + src_off[j] + e0));
            __half2 hv[2] = {__floats2half2_rn(v.x, v.y), __floats2half2_rn(v.z, v.w)};
            *(uint2 *)(Bs + j * PF_LDH + c4 * 4) = *(uint2 *)hv;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < PF_BK; kk += 16) {
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> b[PF_TN / 16];
#pragma unroll
            for (int n = 0; n < PF_TN / 16; n++)
                if (n < nfrag)
                    wmma::load_matrix_sync(b[n], Bs + n * 16 * PF_LDH + kk, PF_LDH);
#pragma unroll
            for (int m = 0; m < NMAT; m++) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
                wmma::load_matrix_sync(fa, As + (m * PF_BM + warp * 16) * PF_LDH + kk, PF_LDH);
#pragma unroll
                for (int n = 0; n < PF_TN / 16; n++)
                    if (n < nfrag)
                        wmma::mma_sync(acc[m][n], fa, b[n], acc[m][n]);
            }
        }
    }
    __syncthreads(); /* the weight tiles become the float epilogue tiles */
    float *Cs = (float *)sm; /* [NMAT][PF_TN][PF_LDC]: per selection, the block's rows */
#pragma unroll
    for (int m = 0; m < NMAT; m++)
#pragma unroll
        for (int n = 0; n < PF_TN / 16; n++)
            wmma::store_matrix_sync(Cs + (m * PF_TN + n * 16) * PF_LDC + warp * 16, acc[m][n],
                                    PF_LDC, wmma::mem_col_major);
    __syncthreads();
    for (int i = tid; i < PF_TN * PF_BM; i += PF_THREADS) {
        int r = i % PF_BM, j = i / PF_BM, row = row0 + r;
        if (j >= tl.count || row >= rows)
            continue;
        float v = Cs[j * PF_LDC + r];
        if (NMAT == 2)
            v = tdm_silu(v) * Cs[(PF_TN + j) * PF_LDC + r];
        dst[dst_off[j] + row] = v;
    }
}

/* ---- 4. reduce ---- */

__global__ void pf_reduce_kernel(pf_args a, const int32_t *__restrict__ ids,
                                 const float *__restrict__ wts, const float *__restrict__ part,
                                 const float *add, float *y, int accumulate)
{
    tdm_pdl_enter();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)a.ntok * a.n_embd)
        return;
    int t = (int)(i / a.n_embd), row = (int)(i % a.n_embd);
    float acc = 0.0f;
    for (int r = 0; r < a.k; r++) {
        int s = t * a.k + r;
        if (pf_resident(a, ids[s]) >= 0)
            acc += wts[s] * part[(int64_t)s * a.n_embd + row];
    }
    if (a.has_shared) {
        float sg = a.sh_logit ? tdm_sigmoid(a.sh_logit[t]) : 1.0f;
        acc += sg * part[(int64_t)(a.nsel + t) * a.n_embd + row];
    }
    float v = accumulate ? y[i] : 0.0f;
    if (add)
        v += add[i];
    y[i] = v + acc;
}

/* ---- host side ---- */

#define PF_TRY(call)                                                                         \
    do {                                                                                     \
        tdm_status s_ = (call);                                                              \
        if (s_ != TDM_OK)                                                                    \
            return s_;                                                                       \
    } while (0)

static tdm_status pf_mat_set(pf_mat *m, const void *w, tdm_qtype t, int64_t rows, int64_t k,
                             const char *what, tdm_error *err)
{
    int blk, bytes;
    if (!tdm_gpu_qt_geometry(t, &blk, &bytes))
        return tdm_error_set(err, TDM_ERR_UNSUPPORTED,
                             "gpu moe_prefill: %s type %s has no GPU kernel", what,
                             tdm_qtype_name(t));
    TDM_REQUIRE(err, w != NULL, "gpu moe_prefill: %s weights are NULL", what);
    TDM_REQUIRE(err, rows > 0 && rows <= INT32_MAX && k > 0 && k <= INT32_MAX && k % blk == 0,
                "gpu moe_prefill: %s is [%lld][%lld]; its rows must be a positive multiple of "
                "the %s block (%d)",
                what, (long long)rows, (long long)k, tdm_qtype_name(t), blk);
    *m = pf_mat{(const uint8_t *)w, k / blk * bytes, (int)t, (int)rows, (int)(k / 8)};
    return TDM_OK;
}

static tdm_status pf_prepare(const tdm_gpu_moe_layer *L, int64_t ntok, int64_t k, pf_args *a,
                             tdm_error *err)
{
    TDM_REQUIRE(err, L && L->table && L->table->slot_of && L->table->arena,
                "gpu moe_prefill: missing layer or expert table");
    const tdm_gpu_expert_table *tb = L->table;
    TDM_REQUIRE(err, tb->n_expert >= 1 && tb->n_expert <= PF_MAX_EXPERTS && L->layer >= 0,
                "gpu moe_prefill: n_expert=%lld outside 1..%d or layer=%lld",
                (long long)tb->n_expert, PF_MAX_EXPERTS, (long long)L->layer);
    TDM_REQUIRE(err, k >= 1 && k <= tb->n_expert, "gpu moe_prefill: k=%lld outside 1..n_expert (%lld)",
                (long long)k, (long long)tb->n_expert);
    TDM_REQUIRE(err, ntok >= 1 && ntok * (k + 1) <= INT32_MAX / 2,
                "gpu moe_prefill: ntok=%lld (at most %d selections)", (long long)ntok,
                INT32_MAX / 2);
    memset(a, 0, sizeof *a);
    const uint8_t *arena = (const uint8_t *)tb->arena;
    PF_TRY(pf_mat_set(&a->mat[0][0], arena + tb->gate_off, L->gate_type, L->n_ff, L->n_embd,
                      "gate", err));
    PF_TRY(pf_mat_set(&a->mat[0][1], arena + tb->up_off, L->up_type, L->n_ff, L->n_embd, "up",
                      err));
    PF_TRY(pf_mat_set(&a->mat[0][2], arena + tb->down_off, L->down_type, L->n_embd, L->n_ff,
                      "down", err));
    const tdm_gpu_shared_expert *sh = L->shared;
    if (sh) {
        PF_TRY(pf_mat_set(&a->mat[1][0], sh->gate, sh->gate_type, sh->n_ff, L->n_embd,
                          "shared gate", err));
        PF_TRY(pf_mat_set(&a->mat[1][1], sh->up, sh->up_type, sh->n_ff, L->n_embd, "shared up",
                          err));
        PF_TRY(pf_mat_set(&a->mat[1][2], sh->down, sh->down_type, L->n_embd, sh->n_ff,
                          "shared down", err));
        a->has_shared = 1;
        a->sh_logit = sh->gate_logit;
    }
    a->slot_of = tb->slot_of + L->layer * tb->n_expert;
    a->n_expert = (int32_t)tb->n_expert;
    a->slot_bytes = (int64_t)tb->slot_bytes;
    a->n_embd = (int)L->n_embd;
    a->k = (int)k;
    a->ntok = (int)ntok;
    a->nsel = (int)(ntok * k);
    a->h_stride = tdm_gpu_moe_h_stride(L);
    return TDM_OK;
}

extern "C" size_t tdm_gpu_moe_prefill_scratch_bytes(const tdm_gpu_moe_layer *L, int64_t max_tok,
                                                   int64_t k)
{
    pf_args a;
    tdm_error e;
    if (pf_prepare(L, max_tok, k, &a, &e) != TDM_OK)
        return 0;
    pf_layout lo;
    pf_layout_of(a.n_expert, max_tok, k, a.n_embd, a.has_shared, &lo);
    return lo.total;
}

extern "C" tdm_status tdm_gpu_moe_prefill(tdm_gpu *g, const tdm_gpu_moe_layer *L, const float *x,
                                          const int32_t *ids, const float *weights, int64_t ntok,
                                          int64_t k, float *h, const float *add, float *y,
                                          bool accumulate, void *scratch, size_t scratch_bytes,
                                          tdm_error *err)
{
    pf_args a;
    PF_TRY(pf_prepare(L, ntok, k, &a, err));
    TDM_REQUIRE(err, x && ids && weights && h && y && scratch, "gpu moe_prefill: NULL argument");
    TDM_REQUIRE(err, ((uintptr_t)x & 15) == 0 && ((uintptr_t)h & 15) == 0,
                "gpu moe_prefill: x and h must be 16-byte aligned");
    TDM_REQUIRE(err, ((uintptr_t)scratch & 255) == 0,
                "gpu moe_prefill: scratch must be 256-byte aligned");
    pf_layout lo;
    pf_layout_of(a.n_expert, ntok, k, a.n_embd, a.has_shared, &lo);
    TDM_REQUIRE(err, scratch_bytes >= lo.total,
                "gpu moe_prefill: scratch of %zu bytes < %zu needed for %lld tokens", scratch_bytes,
                lo.total, (long long)ntok);
    uint8_t *sb = (uint8_t *)scratch;
    pf_plan p = {(int32_t *)(sb + lo.perm), (pf_tile *)(sb + lo.tiles), (int32_t *)(sb + lo.ntiles),
                 (float *)(sb + lo.part)};
    size_t plan_smem = 2 * (size_t)(a.n_expert + 2) * sizeof(int);
    TDM_LAUNCH(err, g, pf_plan_kernel, 1, PF_PLAN_THREADS, plan_smem, a, ids, p);
    int ff = a.mat[0][0].rows > a.mat[1][0].rows ? a.mat[0][0].rows : a.mat[1][0].rows;
    TDM_LAUNCH(err, g, pf_gemm_kernel<2>, dim3((unsigned)lo.max_tiles, tdm_cdiv(ff, PF_BM)), PF_THREADS, 0, a, p, x, h);
    TDM_LAUNCH(err, g, pf_gemm_kernel<1>, dim3((unsigned)lo.max_tiles, tdm_cdiv(a.n_embd, PF_BM)), PF_THREADS, 0, a, p, h,
               p.part);
    TDM_LAUNCH(err, g, pf_reduce_kernel, tdm_cdiv(ntok * a.n_embd, 256), 256, 0, a, ids, weights, p.part, add, y,
               accumulate ? 1 : 0);
    return TDM_OK;
}
