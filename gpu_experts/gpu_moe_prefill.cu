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
 *   2. gate_up: block = (tile, PF_BM rows); per PF_BK-wide step it stages
 *      the gate and up tiles in shared memory ONCE through the int8 decoders
 *      (integer quants plus a float32 {d, m} per 16 elements; plain formats
 *      as fp16 values) and the tile's gathered tokens as fp16; the tensor
 *      cores (mma.sync m16n8k16, fp16 x fp16 -> fp32; two m16n8k8 on sm_75)
 *      multiply each 16 elements exactly and the lanes scale the products
 *      into float32 accumulators; then writes silu(g) * u into h.
 *   3. down: the same GEMM core over the down matrices and h; each selection's
 *      unweighted product goes to a partial row in scratch.
 *   4. reduce: thread per output element sums the partials in rank order
 *      (then the shared expert), so the result is deterministic without
 *      float atomics.
 * A selection s < ntok * k is (token s / k, rank s % k); s = ntok * k + t is
 * token t's shared expert (rank k in h). */
#include "gpu_quant.cuh"

#define PF_MAX_EXPERTS 4096
#define PF_PLAN_THREADS 1024
#define PF_THREADS 128             /* 4 warps, 16 weight rows each */
#define PF_BM 64                   /* weight rows per block */
#define PF_TN 32                   /* selections (tokens) per tile */
#define PF_SLABS 2                 /* weight tiles per block: gate and up, or two row blocks of down */
#define PF_NS (PF_TN / 8)          /* 8-token slabs of a tile */
#define PF_BK 128                  /* reduction elements per step: whole decoder units of every format */
#define PF_BLOCKS_PER_SM 4         /* asked of ptxas: <= 128 registers (no spills) */
#define PF_HG (PF_BK / 16)         /* scale granules (16 elements) per step */
#define PF_LDH (PF_BK + 16)        /* fp16 row stride (halves): a lane's 8-byte fragment loads of 8 rows hit distinct banks */
#define PF_LDQ (PF_BK + 16)        /* int8 row stride (bytes): the same for the 4-byte loads */

static_assert(PF_BM == (PF_THREADS / 32) * 16, "one 16-row mma slab per warp");

typedef struct pf_mat {
    const uint8_t *w;   /* routed: the matrix in slot 0 (add slot * slot_bytes); shared: itself */
    int64_t row_bytes;
    int type, rows, k;     /* k: elements per row */
    int one_scale;         /* both 16-element halves of a group share {d, m} (pf_one_scale) */
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

__device__ __forceinline__ __half2 pf_h2(uint32_t u)
{
    __half2 h;
    memcpy(&h, &u, 4);
    return h;
}

__device__ __forceinline__ uint32_t pf_bits(__half2 h)
{
    uint32_t u;
    memcpy(&u, &h, 4);
    return u;
}

/* Four int8 values biased by 128 (byte b + 128) as two fp16 pairs, exactly:
 * each byte under the exponent of 1024 is 1152 + b, minus 1152. */
__device__ __forceinline__ uint2 pf_i8x4_h2(uint32_t q)
{
    const __half2 bias = __float2half2_rn(1152.0f);
    return make_uint2(pf_bits(__hsub2(pf_h2(__byte_perm(q, 0x64646464u, 0x4140)), bias)),
                      pf_bits(__hsub2(pf_h2(__byte_perm(q, 0x64646464u, 0x4342)), bias)));
}

/* Bytes of one staged weight row: int8 quants (I8A) or fp16 values. */
template <bool I8A> __host__ __device__ constexpr int pf_lda() { return I8A ? PF_LDQ : 2 * PF_LDH; }

/* Staging of one PF_BK-wide step of PF_BM rows of a matrix into shared
 * memory: A [PF_BM][pf_lda] and S [PF_BM][PF_HG] {d, -m}, so that the weight
 * is d * A - m per element, the scale pair shared by 16 consecutive
 * elements. Quantised formats keep A integer: int8 biased by 128 (I8A), or
 * the same integers in fp16 (exact); plain formats (only in fp16 tiles) store
 * the value rounded to fp16 with {1, 0}. Rows past `rows` and blocks past k
 * are zeros. Every thread of the block calls it; the type is a template
 * argument, so a thread issues the loads of all its items before decoding. */
template <int T, bool I8A>
__device__ __forceinline__ void pf_stage_weights(const uint8_t *w, int64_t row_bytes, int rows, int k, int row0,
                                                 int e0, unsigned char *A, float2 *S)
{
    using Q = QT<T>;
    constexpr int LDA = pf_lda<I8A>();
    if constexpr (Q::I8) {
        constexpr int UPS = PF_BK / Q::UNIT, ITEMS = PF_BM * UPS;
        static_assert(ITEMS % PF_THREADS == 0, "items spread evenly");
#pragma unroll
        for (int i0 = 0; i0 < ITEMS; i0 += PF_THREADS) {
            const int i = i0 + (int)threadIdx.x;
            const int r = i / UPS, e = e0 + (i % UPS) * Q::UNIT, blk = e / Q::BLK, ub = e % Q::BLK / Q::UNIT;
            tdm_qg g[Q::NG];
            const bool live = row0 + r < rows && e < k;
            if (live)
                Q::dqi8(w + (int64_t)(row0 + r) * row_bytes + (int64_t)blk * Q::BYTES, ub, g);
#pragma unroll
            for (int gi = 0; gi < Q::NG; gi++) {
                /* the group's position in the step (Q6_K's units hold two
                 * groups 64 elements apart; a step holds whole units) */
                const int pos = (blk * Q::BLK + 32 * Q::group(ub, gi) - e0) / 32;
                /* biased bytes q + 128: the int8 quants' sign bit flipped, or
                 * unsigned ones (zero point Z) plus 128 - Z (no carry: q < 2Z) */
                uint32_t q[8];
#pragma unroll
                for (int j = 0; j < 8; j++)
                    q[j] = !live       ? 0x80808080u
                           : Q::ZERO ? g[gi].q[j] + (uint32_t)(128 - Q::ZERO) * 0x01010101u
                                     : g[gi].q[j] ^ 0x80808080u;
                unsigned char *dst = A + r * LDA + (I8A ? 1 : 2) * 32 * pos;
#pragma unroll
                for (int j = 0; j < 8; j += (I8A ? 4 : 2)) {
                    if constexpr (I8A) {
                        *(uint4 *)(dst + 4 * j) = make_uint4(q[j], q[j + 1], q[j + 2], q[j + 3]);
                    } else {
                        const uint2 lo = pf_i8x4_h2(q[j]), hi = pf_i8x4_h2(q[j + 1]);
                        *(uint4 *)(dst + 8 * j) = make_uint4(lo.x, lo.y, hi.x, hi.y);
                    }
                }
                S[r * PF_HG + 2 * pos] = live ? make_float2(g[gi].d[0], -g[gi].m[0]) : make_float2(0.0f, 0.0f);
                S[r * PF_HG + 2 * pos + 1] = live ? make_float2(g[gi].d[1], -g[gi].m[1]) : make_float2(0.0f, 0.0f);
            }
        }
    } else if constexpr (!I8A) { /* the host gives launches with a plain format fp16 tiles */
        constexpr int UPS = PF_BK / 8, ITEMS = PF_BM * UPS;
#pragma unroll 4
        for (int i = threadIdx.x; i < ITEMS; i += PF_THREADS) {
            const int r = i / UPS, uu = i % UPS, e = e0 + 8 * uu;
            float q[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            if (row0 + r < rows && e < k)
                Q::dq8(w + (int64_t)(row0 + r) * row_bytes + (int64_t)e / 8 * Q::BYTES, 0, q);
            *(uint4 *)(A + r * LDA + 16 * uu) = tdm_pack_f16x8(q);
            if (uu % 2 == 0)
                S[r * PF_HG + uu / 2] = make_float2(1.0f, 0.0f);
        }
    }
}

/* Lane's A fragment of a staged row: k-slots kk..kk+3 as two fp16 pairs. */
template <bool I8A> __device__ __forceinline__ uint2 pf_frag_a(const unsigned char *A, int row, int kk)
{
    if constexpr (I8A)
        return pf_i8x4_h2(*(const uint32_t *)(A + row * PF_LDQ + kk));
    else
        return *(const uint2 *)(A + row * (2 * PF_LDH) + 2 * kk);
}

/* Staging of the activation rows of the tile's first nrows (whole 8-token
 * slabs; gathered, src_off < 0: a padding row of zeros) for one step: B
 * [PF_TN][PF_LDH] fp16 and XS [PF_HG][PF_TN], the sum of each 16 rounded
 * values (the min term). Rows of slabs past nrows are left as they are: a
 * product's token column depends on that token's row alone, and those
 * columns are never written. */
__device__ __forceinline__ void pf_stage_acts(const float *src, const int64_t *src_off, int nrows, int k, int e0,
                                              __half *B, float *XS)
{
    constexpr int C4 = PF_BK / 4; /* float4 per row and step: one warp per row */
    static_assert(C4 == 32, "a row's step is one warp's float4s");
#pragma unroll 4
    for (int i = threadIdx.x; i < nrows * C4; i += PF_THREADS) {
        const int c4 = i % C4, j = i / C4, e = e0 + 4 * c4;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (src_off[j] >= 0 && e < k)
            v = __ldg((const float4 *)(src + src_off[j] + e));
        const __half2 a = __floats2half2_rn(v.x, v.y), b = __floats2half2_rn(v.z, v.w);
        *(uint2 *)(B + j * PF_LDH + 4 * c4) = make_uint2(pf_bits(a), pf_bits(b));
        const float2 fa = __half22float2(a), fb = __half22float2(b);
        float sum = (fa.x + fa.y) + (fb.x + fb.y);
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        if (c4 % 4 == 0)
            XS[(c4 / 4) * PF_TN + j] = sum;
    }
}

/* D = A (16 x 16, fp16) * B (16 x 8, fp16) in float32, from zero or (acc)
 * onto D. Per lane (g = lane / 4, t = lane % 4): a[0] row g, a[1] row g + 8,
 * each the four k-slots 4t..4t+3 of the 16; b the same slots of token column
 * g; d[0..1] row g, d[2..3] row g + 8, columns 2t and 2t + 1. Slots stand for
 * the k indices {2t, 2t + 1, 2t + 8, 2t + 9} of the instruction; A and B use
 * the same assignment, so the product over the 16 is the plain dot product. */
__device__ __forceinline__ void pf_mma(const uint2 a[2], uint2 b, float d[4], bool acc)
{
    if (!acc)
        d[0] = d[1] = d[2] = d[3] = 0.0f;
    tdm_mma_f16(d, a[0].x, a[1].x, a[0].y, a[1].y, b.x, b.y);
}

/* Dynamic shared memory of a pf_gemm_kernel<GU, I8A> block. */
__host__ __device__ constexpr size_t pf_smem_bytes(bool i8a)
{
    return (size_t)PF_SLABS * PF_BM * (i8a ? PF_LDQ : 2 * PF_LDH) + (size_t)PF_SLABS * PF_BM * PF_HG * 8 +
           (size_t)PF_TN * PF_LDH * 2 + (size_t)PF_HG * PF_TN * 4;
}

/* h row of selection s: [t][rank] in h's [ntok][k + shared] rows. */
__device__ __forceinline__ int64_t pf_h_row(const pf_args &a, int s)
{
    int t = s < a.nsel ? s / a.k : s - a.nsel, rank = s < a.nsel ? s % a.k : a.k;
    return ((int64_t)t * (a.k + a.has_shared) + rank) * a.h_stride;
}

/* One staged step on the tensor cores: warp w's 16 rows of each of the NMAT
 * staged weight tiles times the first NS 8-token slabs, per 16 elements
 * (PAIR: per 32, when both halves of every group share {d, m}: the second
 * product accumulates onto the first and one fold serves both) from the
 * tensor cores in float32 and folded into the accumulators, acc += d * P -
 * m * XS (two fused multiply-adds per element). */
template <int NMAT, bool I8A, int NS, bool PAIR>
__device__ __forceinline__ void pf_mma_step(const unsigned char *A, const __half *B, const float2 *S, const float *XS,
                                            int warp, int lane, float (&acc)[NMAT][PF_NS][4])
{
    constexpr int W = PAIR ? 2 : 1; /* 16-element granules per fold */
    const int g = lane >> 2, t4 = lane & 3;
#pragma unroll 1
    for (int hg = 0; hg < PF_HG; hg += W) {
        float P[NMAT][NS][4];
        float2 xs[NS];
#pragma unroll
        for (int n = 0; n < NS; n++)
            xs[n] = make_float2(0.0f, 0.0f);
#pragma unroll
        for (int h = 0; h < W; h++) {
            const int kk = 16 * (hg + h) + 4 * t4;
            uint2 bf[NS];
#pragma unroll
            for (int n = 0; n < NS; n++) {
                bf[n] = *(const uint2 *)(B + (8 * n + g) * PF_LDH + kk);
                const float2 v = *(const float2 *)(XS + (hg + h) * PF_TN + 8 * n + 2 * t4);
                xs[n].x += v.x;
                xs[n].y += v.y;
            }
#pragma unroll
            for (int m = 0; m < NMAT; m++) {
                const int r = m * PF_BM + 16 * warp + g;
                const uint2 af[2] = {pf_frag_a<I8A>(A, r, kk), pf_frag_a<I8A>(A, r + 8, kk)};
#pragma unroll
                for (int n = 0; n < NS; n++)
                    pf_mma(af, bf[n], P[m][n], h > 0);
            }
        }
#pragma unroll
        for (int m = 0; m < NMAT; m++) {
            const int r = m * PF_BM + 16 * warp + g;
            const float2 s0 = S[r * PF_HG + hg], s1 = S[(r + 8) * PF_HG + hg];
#pragma unroll
            for (int n = 0; n < NS; n++) {
                acc[m][n][0] = fmaf(s0.y, xs[n].x, fmaf(s0.x, P[m][n][0], acc[m][n][0]));
                acc[m][n][1] = fmaf(s0.y, xs[n].y, fmaf(s0.x, P[m][n][1], acc[m][n][1]));
                acc[m][n][2] = fmaf(s1.y, xs[n].x, fmaf(s1.x, P[m][n][2], acc[m][n][2]));
                acc[m][n][3] = fmaf(s1.y, xs[n].y, fmaf(s1.x, P[m][n][3], acc[m][n][3]));
            }
        }
    }
}

/* GU: gate_up (weight tiles: the gate and up rows row0..row0+PF_BM-1,
 * source x, output h); else down (tiles: down rows row0.. and row0 + PF_BM..,
 * source h, output the partial rows). Block = one tile of selections x
 * PF_SLABS weight tiles; warp w owns rows 16w..16w+15 of every tile for the
 * tile's 8-token slabs, so each activation fragment serves both tiles. Per 16 elements of k each
 * (rows, slab) product comes from the tensor cores in float32 and is scaled
 * into the accumulator: acc += d * P - m * XS (two fused multiply-adds). */
template <bool GU, bool I8A>
__global__ void __launch_bounds__(PF_THREADS, PF_BLOCKS_PER_SM)
    pf_gemm_kernel(pf_args a, pf_plan p, const float *__restrict__ src, float *__restrict__ dst)
{
    tdm_pdl_enter();
    extern __shared__ __align__(16) unsigned char pf_dyn[];
    __shared__ int64_t src_off[PF_TN], dst_off[PF_TN];
    if ((int)blockIdx.x >= *p.ntiles)
        return;
    const pf_tile tl = p.tiles[blockIdx.x];
    const int kind = tl.group == a.n_expert, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, tid = threadIdx.x;
    const int64_t slot = kind ? 0 : a.slot_of[tl.group];
    /* the two tiles' matrices (selects: indexing the parameter by kind
     * would copy it to the stack); both have the same rows and k */
    const pf_mat m0 = kind ? a.mat[1][GU ? 0 : 2] : a.mat[0][GU ? 0 : 2];
    const pf_mat m1 = kind ? a.mat[1][GU ? 1 : 2] : a.mat[0][GU ? 1 : 2];
    const int rows = m0.rows, k = m0.k, row0 = blockIdx.y * (GU ? PF_BM : PF_SLABS * PF_BM);
    const bool pair = m0.one_scale && m1.one_scale;
    if (row0 >= rows)
        return; /* the shared expert's n_ff may be smaller than the grid's */
    if (tid < PF_TN) {
        int64_t so = -1, d = 0;
        if (tid < tl.count) {
            int s = p.perm[tl.start + tid];
            int64_t hr = pf_h_row(a, s);
            int t = s < a.nsel ? s / a.k : s - a.nsel;
            so = GU ? (int64_t)t * a.n_embd : hr;
            d = GU ? hr : (int64_t)s * a.n_embd;
        }
        src_off[tid] = so;
        dst_off[tid] = d;
    }
    constexpr int LDA = pf_lda<I8A>();
    unsigned char *A = pf_dyn;
    __half *B = (__half *)(A + PF_SLABS * PF_BM * LDA);
    float2 *S = (float2 *)(B + PF_TN * PF_LDH);
    float *XS = (float *)(S + PF_SLABS * PF_BM * PF_HG);
    const int nslab = (tl.count + 7) / 8;
    float acc[PF_SLABS][PF_NS][4];
#pragma unroll
    for (int m = 0; m < PF_SLABS; m++)
#pragma unroll
        for (int n = 0; n < PF_NS; n++)
#pragma unroll
            for (int c = 0; c < 4; c++)
                acc[m][n][c] = 0.0f;

    for (int e0 = 0; e0 < k; e0 += PF_BK) {
        __syncthreads(); /* the previous step's tiles are consumed; src_off is set */
        /* rolled: one copy of the type switch per kernel (compile time) */
#pragma unroll 1
        for (int m = 0; m < PF_SLABS; m++) {
            const pf_mat mt = m ? m1 : m0;
            TDM_QT_DISPATCH(mt.type, (pf_stage_weights<QTYPE, I8A>(mt.w + slot * a.slot_bytes, mt.row_bytes, rows, k,
                                                                   row0 + (GU ? 0 : m * PF_BM), e0,
                                                                   A + m * PF_BM * LDA, S + m * PF_BM * PF_HG)));
        }
        pf_stage_acts(src, src_off, 8 * nslab, k, e0, B, XS);
        __syncthreads();
        switch (nslab * 2 + pair) { /* active slabs and fold width known at compile time below */
        case 2: pf_mma_step<PF_SLABS, I8A, 1, false>(A, B, S, XS, warp, lane, acc); break;
        case 3: pf_mma_step<PF_SLABS, I8A, 1, true>(A, B, S, XS, warp, lane, acc); break;
        case 4: pf_mma_step<PF_SLABS, I8A, 2, false>(A, B, S, XS, warp, lane, acc); break;
        case 5: pf_mma_step<PF_SLABS, I8A, 2, true>(A, B, S, XS, warp, lane, acc); break;
        case 6: pf_mma_step<PF_SLABS, I8A, 3, false>(A, B, S, XS, warp, lane, acc); break;
        case 7: pf_mma_step<PF_SLABS, I8A, 3, true>(A, B, S, XS, warp, lane, acc); break;
        case 8: pf_mma_step<PF_SLABS, I8A, 4, false>(A, B, S, XS, warp, lane, acc); break;
        default: pf_mma_step<PF_SLABS, I8A, 4, true>(A, B, S, XS, warp, lane, acc); break;
        }
    }
    /* epilogue straight from the accumulators: lane holds rows g, g + 8 of
     * its warp's 16 in each tile and tokens 2t4, 2t4 + 1 of each slab */
    const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int m = 0; m < (GU ? 1 : PF_SLABS); m++)
#pragma unroll
        for (int n = 0; n < PF_NS; n++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int j = 8 * n + 2 * t4 + (c & 1), row = row0 + m * PF_BM + 16 * warp + g + 8 * (c >> 1);
                if (j >= tl.count || row >= rows)
                    continue;
                dst[dst_off[j] + row] = GU ? tdm_silu(acc[0][n][c]) * acc[1][n][c] : acc[m][n][c];
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

/* Whether the two 16-element halves of every group share {d, m}: the fold
 * of the products can then take 32 elements at once. Plain formats: {1, 0}. */
template <int T> static constexpr bool pf_one_scale()
{
    if constexpr (QT<T>::I8)
        return !QT<T>::SPLIT;
    else
        return true;
}

static tdm_status pf_mat_set(pf_mat *m, const void *w, int64_t stride, tdm_qtype t, int64_t rows, int64_t k,
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
    TDM_TRY(tdm_gpu_check_align(t, w, stride, "gpu moe_prefill", what, err));
    int one = 0;
    TDM_QT_DISPATCH(t, one = pf_one_scale<QTYPE>());
    *m = pf_mat{(const uint8_t *)w, k / blk * bytes, (int)t, (int)rows, (int)k, one};
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
    const int64_t sb = (int64_t)tb->slot_bytes;
    TDM_TRY(pf_mat_set(&a->mat[0][0], arena + tb->gate_off, sb, L->gate_type, L->n_ff, L->n_embd, "gate", err));
    TDM_TRY(pf_mat_set(&a->mat[0][1], arena + tb->up_off, sb, L->up_type, L->n_ff, L->n_embd, "up", err));
    TDM_TRY(pf_mat_set(&a->mat[0][2], arena + tb->down_off, sb, L->down_type, L->n_embd, L->n_ff, "down", err));
    const tdm_gpu_shared_expert *sh = L->shared;
    if (sh) {
        TDM_TRY(pf_mat_set(&a->mat[1][0], sh->gate, 0, sh->gate_type, sh->n_ff, L->n_embd, "shared gate", err));
        TDM_TRY(pf_mat_set(&a->mat[1][1], sh->up, 0, sh->up_type, sh->n_ff, L->n_embd, "shared up", err));
        TDM_TRY(pf_mat_set(&a->mat[1][2], sh->down, 0, sh->down_type, L->n_embd, sh->n_ff, "shared down", err));
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

/* Whether the format takes the int8 decoders (plain formats have 8-element blocks). */
static bool pf_quantised(int t)
{
    int blk, bytes;
    return tdm_gpu_qt_geometry((tdm_qtype)t, &blk, &bytes) && blk >= 32;
}

/* Each GEMM kernel may use its dynamic shared memory (the fp16-tile ones,
 * 54 KB, more than the 48 KB default): set once per context by
 * tdm_gpu_create, not per launch. */
tdm_status tdm_gpu_moe_prefill_init(tdm_error *err)
{
    TDM_CU(err, cudaFuncSetAttribute(pf_gemm_kernel<true, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)pf_smem_bytes(true)));
    TDM_CU(err, cudaFuncSetAttribute(pf_gemm_kernel<true, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)pf_smem_bytes(false)));
    TDM_CU(err, cudaFuncSetAttribute(pf_gemm_kernel<false, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)pf_smem_bytes(true)));
    TDM_CU(err, cudaFuncSetAttribute(pf_gemm_kernel<false, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)pf_smem_bytes(false)));
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
    TDM_TRY(pf_prepare(L, ntok, k, &a, err));
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
    /* int8 weight tiles (half the shared memory: more blocks per SM) unless a
     * matrix of the launch is in a plain format */
    bool i8[2] = {true, true};
    for (int kind = 0; kind < 1 + a.has_shared; kind++)
        for (int m = 0; m < 3; m++)
            i8[m == 2] = i8[m == 2] && pf_quantised(a.mat[kind][m].type);
    void (*gu)(pf_args, pf_plan, const float *, float *) = i8[0] ? pf_gemm_kernel<true, true> : pf_gemm_kernel<true, false>;
    void (*dn)(pf_args, pf_plan, const float *, float *) = i8[1] ? pf_gemm_kernel<false, true> : pf_gemm_kernel<false, false>;
    TDM_LAUNCH(err, g, gu, dim3((unsigned)lo.max_tiles, tdm_cdiv(ff, PF_BM)), PF_THREADS, pf_smem_bytes(i8[0]), a, p,
               x, h);
    TDM_LAUNCH(err, g, dn, dim3((unsigned)lo.max_tiles, tdm_cdiv(a.n_embd, PF_SLABS * PF_BM)), PF_THREADS,
               pf_smem_bytes(i8[1]), a, p, h, p.part);
    TDM_LAUNCH(err, g, pf_reduce_kernel, tdm_cdiv(ntok * a.n_embd, 256), 256, 0, a, ids, weights, p.part, add, y,
               accumulate ? 1 : 0);
    return TDM_OK;
}
