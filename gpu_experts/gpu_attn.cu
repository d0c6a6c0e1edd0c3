/* gpu_attn: the attention inputs (norms, RoPE, KV store) and attention (models.md §1.5, §3.4). */
#include <cuda_fp16.h>
#include <math.h>

#include "gpu_attn.cuh"
#include "gpu_norm.cuh"

/* True when a position read from device memory addresses a cache row. */
__device__ __forceinline__ bool pos_in_cache(int64_t p, int64_t n_ctx) { return p >= 0 && p < n_ctx; }

/* Block = one head slot of one token: query heads, then key heads, then
 * value heads. Thread i holds channels i + PREP_THREADS c; the normalised row
 * goes through shared memory so that each thread can read its RoPE partner.
 * The arithmetic is that of tdm_gpu_rmsnorm followed by a NeoX rotation,
 * angles in float32 as transformers computes them. */
__global__ void __launch_bounds__(PREP_THREADS)
    attn_prep_kernel(tdm_gpu_attn_in in, const int32_t *__restrict__ pos, float *__restrict__ q,
                     float *__restrict__ gate, __half *kc, __half *vc, int64_t n_ctx)
{
    constexpr int PER = ATTN_MAX_HEAD_DIM / PREP_THREADS;
    __shared__ float buf[ATTN_MAX_HEAD_DIM], red[32];
    tdm_pdl_enter();
    const int tid = threadIdx.x, hd = (int)in.head_dim;
    const int64_t t = blockIdx.y, H = in.n_head, Hkv = in.n_kv, slot = blockIdx.x;
    const int64_t p = pos[t];
    const bool is_q = slot < H, is_v = slot >= H + Hkv, store = pos_in_cache(p, n_ctx);
    const int64_t h = is_q ? slot : is_v ? slot - H - Hkv : slot - H;
    const float *src = is_q ? in.q_src + t * in.q_stride + h * (gate ? 2 : 1) * hd
                            : (is_v ? in.v_src : in.k_src) + t * in.kv_stride + h * hd;
    const int64_t cache_row = (h * n_ctx + p) * hd;
    if (is_v) {
        for (int i = tid; i < hd && store; i += PREP_THREADS)
            vc[cache_row + i] = __float2half_rn(src[i]);
        return;
    }
    float v[PER], ss = 0.0f;
#pragma unroll
    for (int c = 0; c < PER; c++) {
        const int i = tid + PREP_THREADS * c;
        v[c] = i < hd ? src[i] : 0.0f;
        ss += v[c] * v[c];
    }
    const float r = rsqrtf(tdm_block_sum(ss, red) / (float)hd + in.eps);
    const float *w = is_q ? in.q_norm : in.k_norm;
#pragma unroll
    for (int c = 0; c < PER; c++) {
        const int i = tid + PREP_THREADS * c;
        if (i < hd)
            buf[i] = w[i] * (v[c] * r);
    }
    __syncthreads();
    const int half = (int)(in.n_rot / 2);
    float *qrow = q + (t * H + h) * hd;
#pragma unroll
    for (int c = 0; c < PER; c++) {
        const int i = tid + PREP_THREADS * c;
        if (i >= hd)
            break;
        float o = buf[i];
        if (i < 2 * half) {
            const int pair = i < half ? i : i - half;
            const float inv = 1.0f / powf(in.base, (float)(2 * pair) / (float)(2 * half));
            float sn, cs;
            sincosf((float)p * inv, &sn, &cs);
            o = i < half ? buf[i] * cs - buf[i + half] * sn : buf[i] * cs + buf[i - half] * sn;
        }
        if (is_q)
            qrow[i] = o;
        else if (store)
            kc[cache_row + i] = __float2half_rn(o);
    }
    if (is_q && gate)
        for (int i = tid; i < hd; i += PREP_THREADS)
            gate[(t * H + h) * hd + i] = src[hd + i];
}

extern "C" tdm_status tdm_gpu_attn_prep(tdm_gpu *g, const tdm_gpu_attn_in *in, const int32_t *pos,
                                        int64_t ntok, float *q, float *gate, uint16_t *kc, uint16_t *vc,
                                        int64_t n_ctx, tdm_error *err)
{
    TDM_REQUIRE(err, in && in->q_src && in->k_src && in->v_src && in->q_norm && in->k_norm,
                "gpu attn_prep: NULL input");
    TDM_REQUIRE(err, pos && q && kc && vc, "gpu attn_prep: NULL argument");
    const int64_t hd = in->head_dim, slots = in->n_head + 2 * in->n_kv;
    TDM_REQUIRE(err, hd > 0 && hd <= ATTN_MAX_HEAD_DIM, "gpu attn_prep: head_dim %lld outside 1..%d",
                (long long)hd, ATTN_MAX_HEAD_DIM);
    TDM_REQUIRE(err, in->n_head > 0 && in->n_kv > 0 && slots <= INT32_MAX,
                "gpu attn_prep: %lld query and %lld KV heads", (long long)in->n_head, (long long)in->n_kv);
    TDM_REQUIRE(err, in->q_stride >= in->n_head * hd * (gate ? 2 : 1) && in->kv_stride >= in->n_kv * hd,
                "gpu attn_prep: token strides %lld / %lld too short", (long long)in->q_stride,
                (long long)in->kv_stride);
    TDM_REQUIRE(err, in->n_rot > 0 && in->n_rot % 2 == 0 && in->n_rot <= hd,
                "gpu attn_prep: n_rot=%lld must be even and <= head_dim %lld", (long long)in->n_rot,
                (long long)hd);
    TDM_REQUIRE(err, in->base > 0.0f, "gpu attn_prep: base %g", (double)in->base);
    TDM_REQUIRE(err, ntok > 0 && ntok <= 65535 && n_ctx > 0, "gpu attn_prep: ntok=%lld n_ctx=%lld",
                (long long)ntok, (long long)n_ctx);
    TDM_LAUNCH(err, g, attn_prep_kernel, dim3((unsigned)slots, (unsigned)ntok), PREP_THREADS, 0, *in, pos, q, gate,
               (__half *)kc, (__half *)vc, n_ctx);
    return TDM_OK;
}

/* exp(m - M) of a partial result with running max m against the overall
 * max M; 0 for a partial that saw no key (m = -inf). */
__device__ __forceinline__ float attn_rescale(float m, float M)
{
    return m == -INFINITY ? 0.0f : expf(m - M);
}

/* Channel c (< DPL) of lane l: l + 32c, or with VEC (a head_dim of exactly
 * 32 DPL, rows 16-byte aligned) channel l DPL + c, so that a lane reads its
 * share of a K or V row with one or two vector loads (attn_row). */
template <int DPL, bool VEC>
__device__ __forceinline__ int attn_ch(int lane, int c)
{
    return VEC ? lane * DPL + c : lane + 32 * c;
}

/* The lane's DPL halves of K or V row r (attn_ch) as floats, 0 past head_dim;
 * with VEC in 16-, 8- or 4-byte loads. */
template <int DPL, bool VEC>
__device__ __forceinline__ void attn_row(const __half *r, int lane, int head_dim, float (&f)[DPL])
{
    if constexpr (VEC && DPL % 8 == 0) {
#pragma unroll
        for (int v = 0; v < DPL / 8; v++) {
            const uint4 u = *(const uint4 *)(r + lane * DPL + 8 * v);
            const __half2 *h = (const __half2 *)&u;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float2 x = __half22float2(h[j]);
                f[8 * v + 2 * j] = x.x;
                f[8 * v + 2 * j + 1] = x.y;
            }
        }
    } else if constexpr (VEC && DPL == 4) {
        const uint2 u = *(const uint2 *)(r + lane * 4);
        const __half2 *h = (const __half2 *)&u;
        const float2 x = __half22float2(h[0]), y = __half22float2(h[1]);
        f[0] = x.x;
        f[1] = x.y;
        f[2] = y.x;
        f[3] = y.y;
    } else if constexpr (VEC && DPL == 2) {
        const float2 x = __half22float2(*(const __half2 *)(r + lane * 2));
        f[0] = x.x;
        f[1] = x.y;
    } else {
#pragma unroll
        for (int c = 0; c < DPL; c++) {
            const int i = attn_ch<DPL, VEC>(lane, c);
            f[c] = i < head_dim ? __half2float(r[i]) : 0.0f;
        }
    }
}

/* Dot products of q (lane l: the channels of attn_ch) with key rows kr and
 * kr2, both rows' loads in flight together. */
template <int DPL, bool VEC>
__device__ __forceinline__ void attn_dot2(const float *qr, const __half *kr, const __half *kr2, int lane,
                                          int head_dim, float *s, float *s2)
{
    float k1[DPL], k2[DPL];
    attn_row<DPL, VEC>(kr, lane, head_dim, k1);
    attn_row<DPL, VEC>(kr2, lane, head_dim, k2);
    float a = 0.0f, b = 0.0f;
#pragma unroll
    for (int c = 0; c < DPL; c++) {
        a += qr[c] * k1[c];
        b += qr[c] * k2[c];
    }
    *s = tdm_warp_sum(a);
    *s2 = tdm_warp_sum(b);
}

static_assert(ATTN_MAX_SPLITS <= 32, "one warp merges the splits");

/* Block = (query token, query head, split of the keys). Lane l of each warp
 * owns channels attn_ch(l, c) (c < DPL) of q, of the running output and of
 * each K/V row; warp w takes keys w and w + ATTN_WARPS in one step, then moves on
 * by 2 ATTN_WARPS, so two rows' loads are in flight. The keys are 0..pos[t], read from device memory,
 * so one recorded launch serves every decode step; split z of gridDim.z
 * takes the z-th equal share of them. One split writes o itself; with
 * several, each writes its (max, sum, unnormalised output) to part and the
 * last to finish (count, reset by it) merges them: one warp reads every
 * split's max and sum at once and leaves their weights in shared memory.
 * A position outside the cache writes zeros. */
template <int DPL, bool VEC>
__global__ void __launch_bounds__(ATTN_WARPS * 32)
    attention_kernel(const float *__restrict__ q, const __half *__restrict__ kc,
                     const __half *__restrict__ vc, const float *__restrict__ gate, float *o,
                     int n_head, int group, int head_dim, int64_t n_ctx,
                     const int32_t *__restrict__ pos, float scale, float *part, unsigned *count)
{
    __shared__ float s_m[ATTN_WARPS], s_l[ATTN_WARPS];
    __shared__ float s_acc[ATTN_WARPS][DPL * 32];
    __shared__ float s_w[ATTN_MAX_SPLITS], s_gl;
    __shared__ int s_last;
    int t = blockIdx.y, h = blockIdx.x, split = blockIdx.z, nsplit = gridDim.z;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int64_t qoff = ((int64_t)t * n_head + h) * head_dim;
    /* ahead of the wait: pos (the host's, never the launch before's; gpu.h)
     * and this split's K and V rows (all but the newest written steps ago) */
    const int64_t p = pos[t], n_keys = p + 1, per = (n_keys + nsplit - 1) / nsplit, j0 = split * per;
    const int64_t j1 = n_keys - j0 < per ? n_keys : j0 + per;
    const bool cached = pos_in_cache(p, n_ctx);
    const __half *kh = kc + (int64_t)(h / group) * n_ctx * head_dim;
    const __half *vh = vc + (int64_t)(h / group) * n_ctx * head_dim;
    if (cached && j1 > j0) {
        tdm_prefetch_l2(kh + j0 * head_dim, (j1 - j0) * head_dim * (int64_t)sizeof(__half));
        tdm_prefetch_l2(vh + j0 * head_dim, (j1 - j0) * head_dim * (int64_t)sizeof(__half));
    }
    tdm_pdl_enter();
    if (!cached) { /* uniform over the block: no barrier is skipped */
        for (int i = threadIdx.x; i < head_dim && split == 0; i += blockDim.x)
            o[qoff + i] = 0.0f;
        return;
    }
    float qr[DPL], acc[DPL];
#pragma unroll
    for (int c = 0; c < DPL; c++) {
        int i = attn_ch<DPL, VEC>(lane, c);
        qr[c] = i < head_dim ? q[qoff + i] * scale : 0.0f;
        acc[c] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int64_t j = j0 + warp; j < j1; j += 2 * ATTN_WARPS) {
        const bool two = j + ATTN_WARPS < j1; /* uniform over the warp */
        const int64_t j2 = two ? j + ATTN_WARPS : j;
        const __half *vr = vh + j * head_dim, *vr2 = vh + j2 * head_dim;
        float s, s2;
        attn_dot2<DPL, VEC>(qr, kh + j * head_dim, kh + j2 * head_dim, lane, head_dim, &s, &s2);
        const float mn = fmaxf(m, two ? fmaxf(s, s2) : s), corr = attn_rescale(m, mn);
        const float p = expf(s - mn), p2 = two ? expf(s2 - mn) : 0.0f;
        l = l * corr + p + p2;
        float v1[DPL], v2[DPL];
        attn_row<DPL, VEC>(vr, lane, head_dim, v1);
        attn_row<DPL, VEC>(vr2, lane, head_dim, v2);
#pragma unroll
        for (int c = 0; c < DPL; c++)
            acc[c] = acc[c] * corr + p * v1[c] + p2 * v2[c];
        m = mn;
    }
    if (lane == 0) {
        s_m[warp] = m;
        s_l[warp] = l;
    }
#pragma unroll
    for (int c = 0; c < DPL; c++)
        s_acc[warp][attn_ch<DPL, VEC>(lane, c)] = acc[c];
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < ATTN_WARPS; w++)
        M = fmaxf(M, s_m[w]);
    float L = 0.0f;
    for (int w = 0; w < ATTN_WARPS; w++)
        L += s_l[w] * attn_rescale(s_m[w], M);
    const int64_t pitch = head_dim + 2; /* a partial: max, sum, head_dim outputs */
    float *mine = nsplit > 1 ? part + (((int64_t)t * n_head + h) * nsplit + split) * pitch : NULL;
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
        float v = 0.0f;
        for (int w = 0; w < ATTN_WARPS; w++)
            v += s_acc[w][i] * attn_rescale(s_m[w], M);
        if (nsplit > 1) {
            mine[2 + i] = v;
            continue;
        }
        v /= L;
        if (gate)
            v *= tdm_sigmoid(gate[qoff + i]);
        o[qoff + i] = v;
    }
    if (nsplit == 1)
        return;
    if (threadIdx.x == 0) {
        mine[0] = M;
        mine[1] = L;
    }
    __threadfence(); /* the partial is visible before the count says so */
    __syncthreads();
    unsigned *cnt = count + (int64_t)t * n_head + h;
    if (threadIdx.x == 0)
        s_last = atomicAdd(cnt, 1u) == (unsigned)nsplit - 1;
    __syncthreads();
    if (!s_last)
        return;
    __threadfence();
    const float *all = part + ((int64_t)t * n_head + h) * nsplit * pitch;
    if (warp == 0) { /* lane z: split z's max and sum */
        const float mz = lane < nsplit ? __ldcg(all + lane * pitch) : -INFINITY;
        const float lz = lane < nsplit ? __ldcg(all + lane * pitch + 1) : 0.0f;
        const float w = attn_rescale(mz, tdm_warp_max(mz)), gl = tdm_warp_sum(lz * w);
        if (lane < nsplit)
            s_w[lane] = w;
        if (lane == 0)
            s_gl = gl;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
        float v = 0.0f;
#pragma unroll 8
        for (int z = 0; z < nsplit; z++) {
            const float r = s_w[z];
            v += r == 0.0f ? 0.0f : __ldcg(all + z * pitch + 2 + i) * r;
        }
        v /= s_gl;
        if (gate)
            v *= tdm_sigmoid(gate[qoff + i]);
        o[qoff + i] = v;
    }
    if (threadIdx.x == 0)
        *cnt = 0; /* ready for the next launch */
}

/* Splits x into fp16 hi + lo (|x - hi - lo| <= 2^-22 |x| for x in fp16's
 * normal range): with K, V and products exact in fp16 x fp16 -> fp32, two
 * tensor-core products keep the float32 kernel's accuracy. */
__device__ __forceinline__ void fa_split(float x, __half *hi, __half *lo)
{
    *hi = __float2half_rn(x);
    *lo = __float2half_rn(x - __half2float(*hi));
}

__device__ __forceinline__ uint32_t fa_pack(__half a, __half b)
{
    const __half2 h = __halves2half2(a, b);
    uint32_t u;
    memcpy(&u, &h, sizeof u);
    return u;
}

/* p (in [0, 1]) times 2^14 before its split, so that weights down to ~2^-38
 * keep their relative precision in fp16; the output divides it out. */
#define FA_PSCALE 16384.0f

/* Block = (FA_BR query tokens, query head). The queries, scaled and split
 * into fp16 hi and lo, sit in shared memory; each step stages FA_BC keys'
 * K and V rows (zeros past the block's last key). Warp w owns query rows
 * 16w..16w+15: S = (q_hi + q_lo) K^T on the tensor cores, the causal mask
 * (key j > pos[t]: -inf), an online softmax in float32 per row (the lanes of
 * a quad hold one row's keys), then O += (p_hi + p_lo) V with p scaled by
 * FA_PSCALE. A query past ntok or whose position is outside the cache sees
 * no key and writes zeros (the query past ntok writes nothing). Needs
 * head_dim = D (a multiple of 16), 16-byte aligned q, K and V rows. */
template <int D>
__global__ void __launch_bounds__(FA_THREADS)
    attention_prefill_kernel(const float *__restrict__ q, const __half *__restrict__ kc,
                             const __half *__restrict__ vc, const float *__restrict__ gate, float *o, int n_head,
                             int group, int64_t n_ctx, int ntok, const int32_t *__restrict__ pos, float scale)
{
    static_assert(D % 16 == 0, "whole 16-wide tensor-core steps");
    constexpr int LD = D + 8; /* halves per shared row: an ldmatrix's 8 rows on distinct banks */
    extern __shared__ __align__(16) unsigned char fa_smem[];
    __half *qh = (__half *)fa_smem, *ql = qh + FA_BR * LD, *ks = ql + FA_BR * LD, *vs = ks + FA_BC * LD;
    __shared__ int s_pos[FA_BR], s_keys;
    const int h = blockIdx.y, t0 = blockIdx.x * FA_BR, tid = threadIdx.x;
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const __half *kh = kc + (int64_t)(h / group) * n_ctx * D, *vh = vc + (int64_t)(h / group) * n_ctx * D;
    if (tid == 0)
        s_keys = 0;
    tdm_pdl_enter();
    __syncthreads();
    if (tid < FA_BR) { /* -1: the row sees no key */
        const int t = t0 + tid;
        const int64_t p = t < ntok ? pos[t] : -1;
        s_pos[tid] = pos_in_cache(p, n_ctx) ? (int)p : -1;
        atomicMax(&s_keys, s_pos[tid] + 1);
    }
    for (int i = tid; i < FA_BR * D / 4; i += FA_THREADS) {
        const int r = i / (D / 4), c = 4 * (i % (D / 4)), t = t0 + r;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (t < ntok)
            v = *(const float4 *)(q + ((int64_t)t * n_head + h) * D + c);
        __half hi[4], lo[4];
        fa_split(v.x * scale, &hi[0], &lo[0]);
        fa_split(v.y * scale, &hi[1], &lo[1]);
        fa_split(v.z * scale, &hi[2], &lo[2]);
        fa_split(v.w * scale, &hi[3], &lo[3]);
        *(uint2 *)(qh + r * LD + c) = make_uint2(fa_pack(hi[0], hi[1]), fa_pack(hi[2], hi[3]));
        *(uint2 *)(ql + r * LD + c) = make_uint2(fa_pack(lo[0], lo[1]), fa_pack(lo[2], lo[3]));
    }
    __syncthreads();
    const int keys = s_keys, pr[2] = {s_pos[16 * warp + g], s_pos[16 * warp + g + 8]};
    int wlast = max(pr[0], pr[1]); /* the warp's last key */
    wlast = max(wlast, __shfl_xor_sync(0xffffffffu, wlast, 4));
    wlast = max(wlast, __shfl_xor_sync(0xffffffffu, wlast, 8));
    wlast = max(wlast, __shfl_xor_sync(0xffffffffu, wlast, 16));
    float acc[D / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < D / 8; n++)
        acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    for (int j0 = 0; j0 < keys; j0 += FA_BC) {
        __syncthreads(); /* the step before has read ks and vs */
        for (int i = tid; i < FA_BC * D / 8; i += FA_THREADS) {
            const int r = i / (D / 8), c = 8 * (i % (D / 8));
            const int64_t j = j0 + r;
            uint4 kv = make_uint4(0u, 0u, 0u, 0u), vv = kv; /* zeros: 0 x a NaN would poison O */
            if (j < keys) {
                kv = *(const uint4 *)(kh + j * D + c);
                vv = *(const uint4 *)(vh + j * D + c);
            }
            *(uint4 *)(ks + r * LD + c) = kv;
            *(uint4 *)(vs + r * LD + c) = vv;
        }
        __syncthreads();
        if (j0 > wlast)
            continue; /* every key of the step is masked for this warp (uniform) */
        /* s[n][c]: row g (c < 2) or g + 8, key j0 + 8 n + 2 t4 + (c & 1) */
        float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
        for (int d = 0; d < D; d += 16) {
            uint32_t ah[4], al[4], kb[4];
            const int qo = (16 * warp + (lane & 15)) * LD + d + 8 * (lane >> 4);
            tdm_ldsm_x4<false>(ah, qh + qo);
            tdm_ldsm_x4<false>(al, ql + qo);
            tdm_ldsm_x4<false>(kb, ks + (8 * (lane >> 4) + (lane & 7)) * LD + d + 8 * ((lane >> 3) & 1));
            tdm_mma_f16(s[0], ah[0], ah[1], ah[2], ah[3], kb[0], kb[1]);
            tdm_mma_f16(s[0], al[0], al[1], al[2], al[3], kb[0], kb[1]);
            tdm_mma_f16(s[1], ah[0], ah[1], ah[2], ah[3], kb[2], kb[3]);
            tdm_mma_f16(s[1], al[0], al[1], al[2], al[3], kb[2], kb[3]);
        }
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int n = 0; n < 2; n++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                if (j0 + 8 * n + 2 * t4 + (c & 1) > pr[c >> 1])
                    s[n][c] = -INFINITY;
                mx[c >> 1] = fmaxf(mx[c >> 1], s[n][c]);
            }
        float corr[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            const float mn = fmaxf(m[r], mx[r]);
            corr[r] = mn == -INFINITY ? 1.0f : expf(m[r] - mn);
            m[r] = mn;
            l[r] *= corr[r];
        }
        __half ph[2][4], pl[2][4];
#pragma unroll
        for (int n = 0; n < 2; n++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const float p = s[n][c] == -INFINITY ? 0.0f : expf(s[n][c] - m[c >> 1]);
                l[c >> 1] += p;
                fa_split(p * FA_PSCALE, &ph[n][c], &pl[n][c]);
            }
        /* P as the A operand of 16 keys: a0 row g keys 2t.., a1 row g + 8,
         * a2 and a3 the keys 8 further (s's layout, two n-tiles) */
        const uint32_t pa[4] = {fa_pack(ph[0][0], ph[0][1]), fa_pack(ph[0][2], ph[0][3]), fa_pack(ph[1][0], ph[1][1]),
                                fa_pack(ph[1][2], ph[1][3])};
        const uint32_t pb[4] = {fa_pack(pl[0][0], pl[0][1]), fa_pack(pl[0][2], pl[0][3]), fa_pack(pl[1][0], pl[1][1]),
                                fa_pack(pl[1][2], pl[1][3])};
#pragma unroll
        for (int n = 0; n < D / 8; n += 2) {
            uint32_t vb[4];
            acc[n][0] *= corr[0], acc[n][1] *= corr[0], acc[n][2] *= corr[1], acc[n][3] *= corr[1];
            acc[n + 1][0] *= corr[0], acc[n + 1][1] *= corr[0], acc[n + 1][2] *= corr[1], acc[n + 1][3] *= corr[1];
            tdm_ldsm_x4<true>(vb, vs + (8 * ((lane >> 3) & 1) + (lane & 7)) * LD + 8 * n + 8 * (lane >> 4));
            tdm_mma_f16(acc[n], pa[0], pa[1], pa[2], pa[3], vb[0], vb[1]);
            tdm_mma_f16(acc[n], pb[0], pb[1], pb[2], pb[3], vb[0], vb[1]);
            tdm_mma_f16(acc[n + 1], pa[0], pa[1], pa[2], pa[3], vb[2], vb[3]);
            tdm_mma_f16(acc[n + 1], pb[0], pb[1], pb[2], pb[3], vb[2], vb[3]);
        }
    }
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        inv[r] = l[r] > 0.0f ? 1.0f / (FA_PSCALE * l[r]) : 0.0f;
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int t = t0 + 16 * warp + g + 8 * r;
        if (t >= ntok)
            continue;
        const int64_t row = ((int64_t)t * n_head + h) * D;
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            const int i = 8 * n + 2 * t4;
            float2 v = make_float2(acc[n][2 * r] * inv[r], acc[n][2 * r + 1] * inv[r]);
            if (gate) {
                v.x *= tdm_sigmoid(gate[row + i]);
                v.y *= tdm_sigmoid(gate[row + i + 1]);
            }
            *(float2 *)(o + row + i) = v;
        }
    }
}

/* Shared memory of attention_prefill_kernel<D>: q hi and lo, K and V. */
static constexpr size_t fa_smem_bytes(int d) { return (size_t)(2 * FA_BR + 2 * FA_BC) * (d + 8) * sizeof(__half); }

/* The head dims with a tensor-core prompt kernel. */
static const struct {
    int d;
    void (*kernel)(const float *, const __half *, const __half *, const float *, float *, int, int, int64_t, int,
                   const int32_t *, float);
} fa_kernels[] = {{64, attention_prefill_kernel<64>},
                  {128, attention_prefill_kernel<128>},
                  {256, attention_prefill_kernel<256>}};

tdm_status tdm_gpu_attention_init(const tdm_gpu *g, tdm_error *err)
{
    for (const auto &k : fa_kernels)
        if (fa_smem_bytes(k.d) <= (size_t)g->smem_optin)
            TDM_CU(err, cudaFuncSetAttribute(k.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)fa_smem_bytes(k.d)));
    return TDM_OK;
}

/* Splits of the keys for ntok queries: about two blocks per SM, at least
 * ATTN_MIN_KEYS keys of the cache per split; 1 past ATTN_SPLIT_MAX_TOK. */
static int attn_splits(int sm_count, int64_t n_head, int64_t ntok, int64_t n_ctx)
{
    if (ntok > ATTN_SPLIT_MAX_TOK)
        return 1;
    int64_t s = (2 * (int64_t)sm_count + n_head * ntok - 1) / (n_head * ntok);
    int64_t cap = (n_ctx + ATTN_MIN_KEYS - 1) / ATTN_MIN_KEYS;
    s = s < cap ? s : cap;
    s = s < ATTN_MAX_SPLITS ? s : ATTN_MAX_SPLITS;
    return s < 1 ? 1 : (int)s;
}

/* Scratch layout: counters [ATTN_SPLIT_MAX_TOK][n_head], then the partials. */
static size_t attn_count_bytes(int64_t n_head)
{
    return ((size_t)ATTN_SPLIT_MAX_TOK * n_head * sizeof(unsigned) + 255) & ~(size_t)255;
}

extern "C" size_t tdm_gpu_attention_scratch_bytes(const tdm_gpu *g, int64_t n_head, int64_t head_dim,
                                                  int64_t n_ctx)
{
    size_t most = 0;
    for (int64_t nt = 1; nt <= ATTN_SPLIT_MAX_TOK; nt++) {
        size_t b = (size_t)nt * n_head * attn_splits(g->sm_count, n_head, nt, n_ctx) * (head_dim + 2);
        most = b > most ? b : most;
    }
    return attn_count_bytes(n_head) + most * sizeof(float);
}

extern "C" tdm_status tdm_gpu_attention(tdm_gpu *g, const float *q, const uint16_t *kc,
                                        const uint16_t *vc, const float *gate, float *o,
                                        int64_t ntok, int64_t n_head, int64_t n_kv,
                                        int64_t head_dim, int64_t n_ctx, const int32_t *pos,
                                        float scale, void *scratch, size_t scratch_bytes, tdm_error *err)
{
    TDM_REQUIRE(err, q && kc && vc && o && pos, "gpu attention: NULL argument");
    TDM_REQUIRE(err, n_head > 0 && n_kv > 0 && n_head % n_kv == 0,
                "gpu attention: %lld query heads are not a multiple of %lld KV heads",
                (long long)n_head, (long long)n_kv);
    TDM_REQUIRE(err, head_dim > 0 && head_dim <= ATTN_MAX_HEAD_DIM,
                "gpu attention: head_dim %lld outside 1..%d", (long long)head_dim,
                ATTN_MAX_HEAD_DIM);
    TDM_REQUIRE(err, ntok > 0 && ntok <= 65535 && n_head <= INT32_MAX,
                "gpu attention: ntok=%lld outside 1..65535", (long long)ntok);
    TDM_REQUIRE(err, n_ctx > 0, "gpu attention: n_ctx=%lld", (long long)n_ctx);
    int group = (int)(n_head / n_kv), hd = (int)head_dim;
    const __half *k16 = (const __half *)kc, *v16 = (const __half *)vc;
    cudaError_t e;
    const bool rows16 = ((uintptr_t)kc | (uintptr_t)vc) % 16 == 0;
    /* prompts: the tensor-core kernel where the head dim has one, the rows
     * are aligned and the device gives it the shared memory */
    if (ntok >= FA_MIN_TOK && rows16 && (uintptr_t)q % 16 == 0)
        for (const auto &k : fa_kernels)
            if (k.d == hd && fa_smem_bytes(k.d) <= (size_t)g->smem_optin) {
                TDM_CU(err, tdm_launch(g, k.kernel, dim3(tdm_cdiv(ntok, FA_BR), (unsigned)n_head), FA_THREADS,
                                       fa_smem_bytes(k.d), q, k16, v16, gate, o, (int)n_head, group, n_ctx, (int)ntok,
                                       pos, scale));
                return TDM_OK;
            }
    int splits = scratch ? attn_splits(g->sm_count, n_head, ntok, n_ctx) : 1;
    if ((size_t)ntok * n_head * splits * (head_dim + 2) * sizeof(float) + attn_count_bytes(n_head) >
        scratch_bytes)
        splits = 1; /* a scratch sized for a shorter context */
    unsigned *count = (unsigned *)scratch;
    float *part = splits > 1 ? (float *)((char *)scratch + attn_count_bytes(n_head)) : NULL;
    dim3 grid((unsigned)n_head, (unsigned)ntok, (unsigned)splits);
    /* a lane's channels consecutive (vector loads) when they fill whole,
     * aligned rows: +1.8% decode on the H200 at head_dim 256 (docs/GPU.md) */
#define ATTN_LAUNCH(D)                                                                                        \
    e = tdm_launch(g, rows16 && hd == 32 * (D) ? attention_kernel<D, true> : attention_kernel<D, false>, grid, \
                   ATTN_WARPS * 32, 0, q, k16, v16, gate, o, (int)n_head, group, hd, n_ctx, pos, scale, part, count)
    if (head_dim <= 32)
        ATTN_LAUNCH(1);
    else if (head_dim <= 64)
        ATTN_LAUNCH(2);
    else if (head_dim <= 128)
        ATTN_LAUNCH(4);
    else if (head_dim <= 256)
        ATTN_LAUNCH(8);
    else
        ATTN_LAUNCH(16);
#undef ATTN_LAUNCH
    TDM_CU(err, e);
    return TDM_OK;
}
