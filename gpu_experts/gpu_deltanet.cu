/* gpu_deltanet: models.md §3.6.3-3.6.5. */
#include <math.h>

#include "gpu_deltanet.cuh"
#include "gpu_norm.cuh"
#include "gpu_xq.cuh"

#define CONV_TOK 16 /* tokens per thread */
static_assert(CONV_TOK >= CONV_MAX_K - 1, "only token group 0 may read the state");

/* One channel's output for the current input cur: SiLU of tap kernel-1 times
 * cur plus taps 0 .. kernel-2 times the window (oldest first, element i at
 * win[i * stride]). */
__device__ __forceinline__ float conv_out(const float *tap, const float *win, int stride, float cur, int kernel)
{
    float s = tap[kernel - 1] * cur;
    for (int i = 0; i < kernel - 1; i++)
        s += tap[i] * win[i * stride];
    return tdm_silu(s);
}

/* Half h of the conv state's two ([2][kernel - 1][channels], gpu.h). */
__device__ __forceinline__ float *conv_half(float *state, int64_t h, int64_t channels, int kernel)
{
    return state + (h & 1) * (int64_t)(kernel - 1) * channels;
}

/* One thread per (channel, group of CONV_TOK tokens): a token's window is
 * the kernel - 1 inputs before it, from u or, before the batch, from the
 * state's half *pos & 1 (oldest first). Group 0's thread writes the
 * channel's new state into half (*pos + ntok) & 1 after its own reads; no
 * other thread touches either. */
__global__ void ssm_conv_kernel(const float *__restrict__ u, const float *__restrict__ w,
                                float *state, const int32_t *__restrict__ pos, float *__restrict__ y,
                                int64_t ntok, int64_t channels, int kernel)
{
    tdm_pdl_enter();
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= channels)
        return;
    const int64_t t0 = (int64_t)blockIdx.y * CONV_TOK, t1 = ntok - t0 < CONV_TOK ? ntok : t0 + CONV_TOK;
    float win[CONV_MAX_K], tap[CONV_MAX_K], old[CONV_MAX_K];
    for (int i = 0; i < kernel; i++)
        tap[i] = w[c * kernel + i];
    const float *in = t0 == 0 ? conv_half(state, *pos, channels, kernel) : NULL;
    for (int i = 0; i < kernel - 1; i++) {
        const int64_t s = t0 - (kernel - 1) + i;
        old[i] = in ? in[i * channels + c] : 0.0f;
        win[i] = s >= 0 ? u[s * channels + c] : old[kernel - 1 + s];
    }
    for (int64_t t = t0; t < t1; t++) {
        float cur = u[t * channels + c];
        y[t * channels + c] = conv_out(tap, win, 1, cur, kernel);
        for (int i = 0; i + 1 < kernel - 1; i++)
            win[i] = win[i + 1];
        win[kernel - 2] = cur;
    }
    if (t0 != 0)
        return;
    float *out = conv_half(state, *pos + ntok, channels, kernel);
    for (int i = 0; i < kernel - 1; i++) {
        const int64_t s = ntok - (kernel - 1) + i;
        out[i * channels + c] = s >= 0 ? u[s * channels + c] : old[kernel - 1 + s];
    }
}

extern "C" tdm_status tdm_gpu_ssm_conv(tdm_gpu *g, const float *u, const float *w, float *state,
                                       const int32_t *pos, float *y, int64_t ntok, int64_t channels,
                                       int64_t kernel, tdm_error *err)
{
    TDM_REQUIRE(err, u && w && state && pos && y, "gpu ssm_conv: NULL argument");
    TDM_REQUIRE(err, kernel >= 2 && kernel <= CONV_MAX_K, "gpu ssm_conv: kernel %lld outside 2..%d",
                (long long)kernel, CONV_MAX_K);
    TDM_REQUIRE(err, ntok > 0 && channels > 0, "gpu ssm_conv: bad shape ntok=%lld channels=%lld",
                (long long)ntok, (long long)channels);
    TDM_REQUIRE(err, ntok / CONV_TOK < 65535, "gpu ssm_conv: ntok=%lld", (long long)ntok);
    const dim3 grid(tdm_cdiv(channels, 128), (unsigned)tdm_cdiv(ntok, CONV_TOK));
    TDM_LAUNCH(err, g, ssm_conv_kernel, grid, 128, 0, u, w, state, pos, y, ntok, channels, (int)kernel);
    return TDM_OK;
}

__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* The per-token log-decay g = ssm_a * softplus(alpha + dt_bias) (<= 0). */
__device__ __forceinline__ float dn_log_decay(float alpha, float a, float dt)
{
    return a * softplus(alpha + dt);
}

/* The L2 norms' reciprocals of one token's q and k from the block's sums of
 * squares (qss, kss: this thread's share): rq also carries 1 / sqrt(dk). */
__device__ __forceinline__ void dn_norms(float qss, float kss, int dk, float eps, float *red, float *rq, float *rk)
{
    *rq = rsqrtf(tdm_block_sum(qss, red) + eps) * rsqrtf((float)dk);
    *rk = rsqrtf(tdm_block_sum(kss, red) + eps);
}

/* One token's step for a thread's RPT state rows of its value column (rows
 * ks, ks + DN_KSPLIT, ...; the column's DN_KSPLIT threads are consecutive
 * lanes): S = e^g S + k (b (v - e^g S^T k))^T with k = sk * rk, then returns
 * S^T q (q = sq * rq) to every thread of the column. b = sigmoid(beta),
 * eg = e^g, vv: the column's v. */
template <int RPT>
__device__ __forceinline__ float dn_update(float (&s)[RPT], const float *sq, const float *sk, float rq, float rk,
                                           float b, float eg, float vv, int ks)
{
    float pk = 0.0f;
#pragma unroll
    for (int r = 0; r < RPT; r++)
        pk += s[r] * sk[ks + DN_KSPLIT * r];
    pk *= rk;
    pk += __shfl_xor_sync(0xffffffffu, pk, 1);
    pk += __shfl_xor_sync(0xffffffffu, pk, 2);
    float delta = b * (vv - eg * pk), po = 0.0f;
#pragma unroll
    for (int r = 0; r < RPT; r++) {
        s[r] = s[r] * eg + (sk[ks + DN_KSPLIT * r] * rk) * delta;
        po += s[r] * sq[ks + DN_KSPLIT * r];
    }
    po += __shfl_xor_sync(0xffffffffu, po, 1);
    po += __shfl_xor_sync(0xffffffffu, po, 2);
    return po * rq;
}

template <int RPT> /* state rows per thread = d_k / DN_KSPLIT */
__global__ void __launch_bounds__(DN_WARPS * 32)
    deltanet_kernel(const float *__restrict__ qkv, const float *__restrict__ beta,
                    const float *__restrict__ alpha, const float *__restrict__ ssm_a,
                    const float *__restrict__ dt_bias, float *state, float *__restrict__ o,
                    int64_t ntok, int n_kh, int n_vh, int d_v, int grouped, float eps)
{
    tdm_pdl_enter();
    constexpr int DK = RPT * DN_KSPLIT;
    __shared__ float s_q[DK], s_k[DK], s_red[32];
    int j = blockIdx.x; /* value head */
    int ks = threadIdx.x % DN_KSPLIT;
    int col = blockIdx.y * DN_COLS + threadIdx.x / DN_KSPLIT;
    bool active = col < d_v;
    int kh = grouped ? j / (n_vh / n_kh) : j % n_kh;
    int64_t width = 2 * (int64_t)n_kh * DK + (int64_t)n_vh * d_v;
    float *S = state + (int64_t)j * DK * d_v;
    float s[RPT];
#pragma unroll
    for (int r = 0; r < RPT; r++)
        s[r] = active ? S[(int64_t)(ks + DN_KSPLIT * r) * d_v + col] : 0.0f;
    float a_j = ssm_a[j], dt_j = dt_bias[j];
    for (int64_t t = 0; t < ntok; t++) {
        const float *row = qkv + t * width;
        float qss = 0.0f, kss = 0.0f;
        for (int i = threadIdx.x; i < DK; i += blockDim.x) {
            float qv = row[(int64_t)kh * DK + i], kv = row[(int64_t)(n_kh + kh) * DK + i];
            s_q[i] = qv;
            s_k[i] = kv;
            qss += qv * qv;
            kss += kv * kv;
        }
        /* the block sums synchronise, so s_q/s_k are complete afterwards */
        float rq, rk;
        dn_norms(qss, kss, DK, eps, s_red, &rq, &rk);
        float b = tdm_sigmoid(beta[t * n_vh + j]);
        float eg = expf(dn_log_decay(alpha[t * n_vh + j], a_j, dt_j));
        float vv = active ? row[2 * (int64_t)n_kh * DK + (int64_t)j * d_v + col] : 0.0f;
        const float po = dn_update<RPT>(s, s_q, s_k, rq, rk, b, eg, vv, ks);
        if (active && ks == 0)
            o[(t * n_vh + j) * d_v + col] = po;
        __syncthreads(); /* s_q/s_k are rewritten by the next token */
    }
    if (active) {
#pragma unroll
        for (int r = 0; r < RPT; r++)
            S[(int64_t)(ks + DN_KSPLIT * r) * d_v + col] = s[r];
    }
}

/* ---- one decode token: conv, recurrence and gated norm in one launch ---- */

/* What deltanet_step_kernel needs, flattened for the launch. */
struct dns_args {
    tdm_gpu_deltanet_step_io p;
    int64_t channels;
    int n_kh, d_v, group, grouped, kernel, pitch;
    float eps;
};

/* Channel c of a block's conv inputs (q of key head kh, then its k, then v
 * of value head j): its index in the token's 2 H_k d_k + H_v d_v channels. */
__device__ __forceinline__ int64_t dns_channel(const dns_args &a, int dk, int kh, int j, int c)
{
    if (c < dk)
        return (int64_t)kh * dk + c;
    if (c < 2 * dk)
        return (int64_t)(a.n_kh + kh) * dk + c - dk;
    return 2 * (int64_t)a.n_kh * dk + (int64_t)j * a.d_v + c - 2 * dk;
}

/* Block = value head j, DN_KSPLIT threads per value column. Ahead of the
 * PDL wait (qkv, z and pos are written two launches back, gpu.h): the head's
 * state into registers, the conv of its q, k and v channels, q's and k's
 * norms. After it: beta and alpha (the launch right before), the update, the
 * gated norm of the head's output, y and its int8 copy, the state. Every
 * block reads the old conv inputs from one half of the conv state and writes
 * the new ones into the other (gpu.h): its v channels, and, for the first
 * value head of key head kh, q's and k's, which all of kh's value heads read:
 * no block can replace an input another has yet to read. */
template <int RPT>
__global__ void __launch_bounds__(DNS_MAX_THREADS)
    deltanet_step_kernel(dns_args a)
{
    constexpr int DK = RPT * DN_KSPLIT;
    extern __shared__ float dns_smem[]; /* u [nch], old inputs [kernel - 1][nch], conv out [nch], y [d_v] */
    __shared__ float s_red[32];
    const tdm_gpu_deltanet_step_io &p = a.p;
    const int j = blockIdx.x, ks = threadIdx.x % DN_KSPLIT, col = threadIdx.x / DN_KSPLIT;
    const int kh = a.grouped ? j / a.group : j % a.n_kh, nch = 2 * DK + a.d_v, K = a.kernel;
    float *su = dns_smem, *sold = su + nch, *sc = sold + (K - 1) * nch, *sy = sc + nch;
    float *S = p.state + (int64_t)j * DK * a.d_v;
    float s[RPT];
#pragma unroll
    for (int r = 0; r < RPT; r++)
        s[r] = S[(int64_t)(ks + DN_KSPLIT * r) * a.d_v + col];
    const float a_j = p.ssm_a[j], dt_j = p.dt_bias[j], nw = p.norm_w[col], zv = p.z[(int64_t)j * a.d_v + col];
    const int32_t pos = *p.pos;
    const float *cin = conv_half(p.conv_state, pos, a.channels, K);
    for (int c = threadIdx.x; c < nch; c += blockDim.x) {
        const int64_t ch = dns_channel(a, DK, kh, j, c);
        for (int i = 0; i < K - 1; i++)
            sold[i * nch + c] = cin[i * a.channels + ch];
        su[c] = p.qkv[ch];
        sc[c] = conv_out(p.conv_w + ch * K, sold + c, nch, su[c], K);
    }
    __syncthreads();
    float qss = 0.0f, kss = 0.0f;
    for (int i = threadIdx.x; i < DK; i += blockDim.x) {
        qss += sc[i] * sc[i];
        kss += sc[DK + i] * sc[DK + i];
    }
    float rq, rk;
    dn_norms(qss, kss, DK, a.eps, s_red, &rq, &rk);
    tdm_pdl_enter(); /* beta and alpha are the launch before's */
    const float b = tdm_sigmoid(p.beta[j]), eg = expf(dn_log_decay(p.alpha[j], a_j, dt_j));
    const float po = dn_update<RPT>(s, sc, sc + DK, rq, rk, b, eg, sc[2 * DK + col], ks);
    const float r = rsqrtf(tdm_block_sum(ks == 0 ? po * po : 0.0f, s_red) / (float)a.d_v + p.norm_eps);
    float yv = nw * (po * r);
    yv *= tdm_silu(zv);
    if (ks == 0) {
        p.y[(int64_t)j * a.d_v + col] = yv;
        sy[col] = yv;
    }
#pragma unroll
    for (int i = 0; i < RPT; i++)
        S[(int64_t)(ks + DN_KSPLIT * i) * a.d_v + col] = s[i];
    float *cout = conv_half(p.conv_state, pos + 1, a.channels, K);
    const bool qk_writer = j == (a.grouped ? kh * a.group : kh);
    for (int c = (qk_writer ? 0 : 2 * DK) + threadIdx.x; c < nch; c += blockDim.x) {
        const int64_t ch = dns_channel(a, DK, kh, j, c);
        for (int i = 0; i < K - 1; i++)
            cout[i * a.channels + ch] = i + 2 < K ? sold[(i + 1) * nch + c] : su[c];
    }
    if (!p.yq)
        return;
    __syncthreads(); /* sy is complete */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (warp < a.d_v / 32) { /* whole groups of 32 (d_v % 32 == 0 with a copy) */
        int8_t *q = (int8_t *)p.yq;
        tdm_xq_put32(sy[warp * 32 + lane], q, (uint2 *)(q + a.pitch), j * (a.d_v / 32) + warp);
    }
}

typedef decltype(&deltanet_step_kernel<4>) dns_fn;

/* The one-token kernel for d_k (NULL: none). */
static dns_fn dns_kernel_of(int64_t dk)
{
    switch (dk) {
    case 16: return deltanet_step_kernel<4>;
    case 32: return deltanet_step_kernel<8>;
    case 64: return deltanet_step_kernel<16>;
    case 128: return deltanet_step_kernel<32>;
    default: return NULL;
    }
}

extern "C" bool tdm_gpu_deltanet_step_fits(const tdm_gpu_deltanet_shape *sh, int64_t kernel, bool copy)
{
    return sh && dns_kernel_of(sh->d_k) && sh->n_k_head > 0 && sh->n_v_head > 0 &&
           sh->n_v_head % sh->n_k_head == 0 && sh->n_v_head <= 65535 && sh->d_v >= 8 && sh->d_v % 8 == 0 &&
           sh->d_v * DN_KSPLIT <= DNS_MAX_THREADS && (!copy || sh->d_v % 32 == 0) && kernel >= 2 &&
           kernel <= CONV_MAX_K && (sh->map == TDM_GPU_HEADS_TILED || sh->map == TDM_GPU_HEADS_GROUPED);
}

extern "C" tdm_status tdm_gpu_deltanet_step(tdm_gpu *g, const tdm_gpu_deltanet_shape *sh,
                                            const tdm_gpu_deltanet_step_io *p, tdm_error *err)
{
    TDM_REQUIRE(err, sh && p, "gpu deltanet_step: NULL argument");
    TDM_REQUIRE(err, p->qkv && p->conv_w && p->conv_state && p->pos && p->beta && p->alpha && p->ssm_a &&
                         p->dt_bias && p->state && p->z && p->norm_w && p->y,
                "gpu deltanet_step: NULL argument");
    TDM_REQUIRE(err, !p->yq || ((uintptr_t)p->yq & 15) == 0, "gpu deltanet_step: int8 copy not 16-byte aligned");
    if (!tdm_gpu_deltanet_step_fits(sh, p->kernel, p->yq != NULL))
        return tdm_error_set(err, TDM_ERR_UNSUPPORTED,
                             "gpu deltanet_step: no one-launch form for H_k %lld H_v %lld d_k %lld d_v %lld "
                             "conv kernel %lld%s (tdm_gpu_deltanet_step_fits)",
                             (long long)sh->n_k_head, (long long)sh->n_v_head, (long long)sh->d_k,
                             (long long)sh->d_v, (long long)p->kernel, p->yq ? " with an int8 copy" : "");
    dns_args a;
    a.p = *p;
    a.n_kh = (int)sh->n_k_head;
    a.d_v = (int)sh->d_v;
    a.group = (int)(sh->n_v_head / sh->n_k_head);
    a.grouped = sh->map == TDM_GPU_HEADS_GROUPED;
    a.kernel = (int)p->kernel;
    a.channels = 2 * sh->n_k_head * sh->d_k + sh->n_v_head * sh->d_v;
    a.pitch = (int)((sh->n_v_head * sh->d_v + 127) & ~(int64_t)127);
    a.eps = sh->eps;
    const int nch = (int)(2 * sh->d_k + sh->d_v);
    const size_t smem = ((size_t)(p->kernel + 1) * nch + (size_t)sh->d_v) * sizeof(float);
    TDM_LAUNCH(err, g, dns_kernel_of(sh->d_k), (unsigned)sh->n_v_head, (unsigned)(sh->d_v * DN_KSPLIT), smem, a);
    return TDM_OK;
}

/* ---- chunked form ---- */

/* Shared-memory layout of the chunked kernel, in floats. q and k rows are
 * DK + 4 floats apart: 16-byte aligned for float4 loads and an odd number of
 * 16-byte units, so the 8 rows read by a quarter-warp hit distinct banks.
 * After the products that need q, its space holds M^T (q.k decayed, read as
 * float4 along t) and A (row stride C + 1: column reads conflict-free). */
template <int DK> struct DncLayout {
    static constexpr int T = DNC_T, KS = DK + 4, MS = T + 4, AS = T + 1;
    static constexpr int QK = T * KS, MA = T * MS + T * AS;
    static constexpr int R1 = QK > MA ? QK : MA;
    static constexpr int G = 0;          /* double [T]: cumulative log-decay */
    static constexpr int EG = 2 * T;     /* [T] exp(G_t) */
    static constexpr int DEC = EG + T;   /* [T] exp(G_last - G_t) */
    static constexpr int BETA = DEC + T; /* [T] sigmoid(beta_t), 0 past the prompt */
    static constexpr int Q = BETA + T;   /* [T][KS] q, later M^T [T][MS] then A [T][AS] */
    static constexpr int K = Q + R1;     /* [T][KS] */
    static constexpr int S = K + QK;     /* [DK][DNC_COLS] state slice */
    static constexpr int V = S + DK * DNC_COLS; /* [T][DNC_COLS] right-hand side, then V' */
    static constexpr int FLOATS = V + T * DNC_COLS;
    static_assert(Q % 4 == 0 && K % 4 == 0 && MS % 4 == 0 && KS % 8 == 4, "float4 alignment");
};

__device__ __forceinline__ float dot4(float4 a, float4 b, float acc)
{
    return fmaf(a.w, b.w, fmaf(a.z, b.z, fmaf(a.y, b.y, fmaf(a.x, b.x, acc))));
}

/* Loads chunk rows t < L (zeros beyond: they then contribute nothing) of the
 * L2-normalised q (times 1/sqrt(DK)) and k, and, in warp 0, the gates and
 * the cumulative log-decay. G is summed in float64: the kernel uses
 * exp(G_t - G_s), and in float32 the difference of two long sums would lose
 * the small decays of fast-forgetting heads (|G| in the hundreds). */
template <int DK>
__device__ void dnc_load(float *sm, const float *qsrc, const float *ksrc, int64_t width,
                         const float *beta, const float *alpha, int n_vh, int j, float a_j,
                         float dt_j, float eps, int L)
{
    using Lay = DncLayout<DK>;
    constexpr int PL = (DK + 31) / 32;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float qscale = rsqrtf((float)DK);
    for (int t = warp; t < Lay::T; t += DNC_THREADS / 32) {
        float qv[PL], kv[PL], qss = 0.0f, kss = 0.0f;
#pragma unroll
        for (int m = 0; m < PL; m++) {
            int i = lane + 32 * m;
            bool in = t < L && i < DK;
            qv[m] = in ? qsrc[t * width + i] : 0.0f;
            kv[m] = in ? ksrc[t * width + i] : 0.0f;
            qss += qv[m] * qv[m];
            kss += kv[m] * kv[m];
        }
        float rq = rsqrtf(tdm_warp_sum(qss) + eps) * qscale, rk = rsqrtf(tdm_warp_sum(kss) + eps);
#pragma unroll
        for (int m = 0; m < PL; m++) {
            int i = lane + 32 * m;
            if (i < DK) {
                sm[Lay::Q + t * Lay::KS + i] = qv[m] * rq;
                sm[Lay::K + t * Lay::KS + i] = kv[m] * rk;
            }
        }
    }
    if (warp != 0)
        return;
    /* lane l: tokens 2l, 2l+1; an inclusive scan of the pair sums over lanes */
    float b[2];
    double g[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int t = 2 * lane + h;
        b[h] = t < L ? tdm_sigmoid(beta[(int64_t)t * n_vh + j]) : 0.0f;
        g[h] = t < L ? (double)dn_log_decay(alpha[(int64_t)t * n_vh + j], a_j, dt_j) : 0.0;
    }
    double incl = g[0] + g[1];
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        double y = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off)
            incl += y;
    }
    double G[2] = {incl - g[1], incl}, glast = __shfl_sync(0xffffffffu, incl, 31);
    double *sG = (double *)(sm + Lay::G);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int t = 2 * lane + h;
        sG[t] = G[h];
        sm[Lay::EG + t] = expf((float)G[h]);
        sm[Lay::DEC + t] = expf((float)(glast - G[h]));
        sm[Lay::BETA + t] = b[h];
    }
}

/* Block = (value head j, DNC_COLS value columns); per chunk of L tokens with
 * the state S from the previous chunks (models.md §3.6.6, the CPU's
 * engine/forward_ops.c deltanet_chunk):
 *   A[t][s] = b_t (k_t.k_s) e^(G_t-G_s), s < t;   M[t][s] = (q_t.k_s) e^(G_t-G_s), s <= t
 *   (I + A) V' = b (v - e^G (k S))                  (forward substitution)
 *   O = e^G (q S) + M V';   S = e^G_last S + sum_t k_t e^(G_last-G_t) V'_t^T
 * Threads: P1 thread (tr, tc) = (tid / 16, tid % 16) owns the 4 x 4 entries
 * (tr + 16i, tc + 16j) of A and M; for row products thread (warp, lane) owns
 * column lane of rows 8 warp .. 8 warp + 7; the solve gives each warp 4
 * columns, lane holding rows lane and lane + 32; the state update owns rows
 * DK/8 warp .. + DK/8 - 1 of column lane. */
template <int DK>
__global__ void __launch_bounds__(DNC_THREADS, 1) /* at d_k 128 its shared memory fits one block per SM */
    deltanet_chunked_kernel(const float *__restrict__ qkv, const float *__restrict__ beta,
                            const float *__restrict__ alpha, const float *__restrict__ ssm_a,
                            const float *__restrict__ dt_bias, float *state,
                            float *__restrict__ o, int64_t ntok, int n_kh, int n_vh, int d_v,
                            int grouped, float eps)
{
    tdm_pdl_enter();
    using Lay = DncLayout<DK>;
    constexpr int T = DNC_T, KS = Lay::KS, SR = DK / 8, NC = DNC_COLS;
    extern __shared__ float4 dnc_smem[];
    float *sm = (float *)dnc_smem;
    const double *sG = (const double *)(sm + Lay::G);
    const float *seG = sm + Lay::EG, *sdec = sm + Lay::DEC, *sbeta = sm + Lay::BETA;
    float *sq = sm + Lay::Q, *sMT = sq, *sA = sq + T * Lay::MS;
    float *sk = sm + Lay::K, *sS = sm + Lay::S, *sV = sm + Lay::V;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int j = blockIdx.x, col = blockIdx.y * NC + lane;
    const bool active = col < d_v;
    const int kh = grouped ? j / (n_vh / n_kh) : j % n_kh;
    const int64_t width = 2 * (int64_t)n_kh * DK + (int64_t)n_vh * d_v;
    const float a_j = ssm_a[j], dt_j = dt_bias[j];
    float *S = state + (int64_t)j * DK * d_v;
    float sr[SR];
#pragma unroll
    for (int r = 0; r < SR; r++) {
        int a = warp * SR + r;
        sr[r] = active ? S[(int64_t)a * d_v + col] : 0.0f;
        sS[a * NC + lane] = sr[r];
    }
    for (int64_t c0 = 0; c0 < ntok; c0 += T) {
        const int L = (int)(ntok - c0 < T ? ntok - c0 : T);
        const float *rows = qkv + c0 * width;
        dnc_load<DK>(sm, rows + (int64_t)kh * DK, rows + (int64_t)(n_kh + kh) * DK, width,
                     beta + c0 * n_vh, alpha + c0 * n_vh, n_vh, j, a_j, dt_j, eps, L);
        __syncthreads();

        /* P1: k.k and q.k for A and M; k S and q S for the right-hand side and O */
        const int tr = tid >> 4, tc = tid & 15, t0 = warp * 8;
        float aa[4][4] = {}, mm[4][4] = {}, xs[8] = {}, ys[8] = {};
        for (int a = 0; a < DK; a += 4) {
            float4 kt[4], qt[4], ks[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                kt[i] = *(const float4 *)&sk[(tr + 16 * i) * KS + a];
                qt[i] = *(const float4 *)&sq[(tr + 16 * i) * KS + a];
                ks[i] = *(const float4 *)&sk[(tc + 16 * i) * KS + a];
            }
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int jj = 0; jj < 4; jj++) {
                    aa[i][jj] = dot4(kt[i], ks[jj], aa[i][jj]);
                    mm[i][jj] = dot4(qt[i], ks[jj], mm[i][jj]);
                }
            float4 s4 = make_float4(sS[a * NC + lane], sS[(a + 1) * NC + lane],
                                    sS[(a + 2) * NC + lane], sS[(a + 3) * NC + lane]);
#pragma unroll
            for (int r = 0; r < 8; r++) {
                xs[r] = dot4(*(const float4 *)&sk[(t0 + r) * KS + a], s4, xs[r]);
                ys[r] = dot4(*(const float4 *)&sq[(t0 + r) * KS + a], s4, ys[r]);
            }
        }
        __syncthreads(); /* q is dead: its space takes M^T and A */
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int jj = 0; jj < 4; jj++) {
                int t = tr + 16 * i, s = tc + 16 * jj;
                float dec = s <= t ? expf((float)(sG[t] - sG[s])) : 0.0f;
                sA[t * Lay::AS + s] = s < t ? sbeta[t] * aa[i][jj] * dec : 0.0f;
                sMT[s * Lay::MS + t] = mm[i][jj] * dec;
            }
        float out[8];
#pragma unroll
        for (int r = 0; r < 8; r++) {
            int t = t0 + r;
            float vv = t < L && active ? rows[(int64_t)t * width + 2 * (int64_t)n_kh * DK +
                                              (int64_t)j * d_v + col]
                                       : 0.0f;
            sV[t * NC + lane] = sbeta[t] * (vv - seG[t] * xs[r]);
            out[r] = seG[t] * ys[r];
        }
        __syncthreads();

        /* P2: (I + A) V' = rhs, forward substitution down the chunk. Row s is
         * final once rows < s are subtracted; its owner lane broadcasts it. A
         * is zero on and above the diagonal, so every lane updates both rows. */
        float x[2][4];
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int m = 0; m < 4; m++)
                x[h][m] = sV[(lane + 32 * h) * NC + 4 * warp + m];
        for (int s = 0; s + 1 < L; s++) {
            const int src = s & 31, hi = s >> 5;
            float a0 = sA[lane * Lay::AS + s], a1 = sA[(lane + 32) * Lay::AS + s];
#pragma unroll
            for (int m = 0; m < 4; m++) {
                float vs = __shfl_sync(0xffffffffu, hi ? x[1][m] : x[0][m], src);
                x[0][m] = fmaf(-a0, vs, x[0][m]);
                x[1][m] = fmaf(-a1, vs, x[1][m]);
            }
        }
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int m = 0; m < 4; m++)
                sV[(lane + 32 * h) * NC + 4 * warp + m] = x[h][m];
        __syncthreads();

        /* P3: O = e^G (q S) + M V' (M^T[s][t] is zero for s > t) */
        for (int s = 0; s < L && s < t0 + 8; s++) {
            float vs = sV[s * NC + lane];
            float4 m0 = *(const float4 *)&sMT[s * Lay::MS + t0];
            float4 m1 = *(const float4 *)&sMT[s * Lay::MS + t0 + 4];
            out[0] = fmaf(m0.x, vs, out[0]);
            out[1] = fmaf(m0.y, vs, out[1]);
            out[2] = fmaf(m0.z, vs, out[2]);
            out[3] = fmaf(m0.w, vs, out[3]);
            out[4] = fmaf(m1.x, vs, out[4]);
            out[5] = fmaf(m1.y, vs, out[5]);
            out[6] = fmaf(m1.z, vs, out[6]);
            out[7] = fmaf(m1.w, vs, out[7]);
        }
#pragma unroll
        for (int r = 0; r < 8; r++)
            if (t0 + r < L && active)
                o[((c0 + t0 + r) * n_vh + j) * d_v + col] = out[r];

        /* P4: the state after the chunk (padding rows have k = 0, exp(G) = e^G_last) */
        const float egl = seG[T - 1];
#pragma unroll
        for (int r = 0; r < SR; r++)
            sr[r] *= egl;
        for (int t = 0; t < L; t++) {
            float w = sV[t * NC + lane] * sdec[t];
            const float *kr = sk + t * KS + warp * SR;
            if constexpr (SR % 4 == 0) {
#pragma unroll
                for (int r = 0; r < SR; r += 4) {
                    float4 k4 = *(const float4 *)&kr[r];
                    sr[r] = fmaf(k4.x, w, sr[r]);
                    sr[r + 1] = fmaf(k4.y, w, sr[r + 1]);
                    sr[r + 2] = fmaf(k4.z, w, sr[r + 2]);
                    sr[r + 3] = fmaf(k4.w, w, sr[r + 3]);
                }
            } else {
#pragma unroll
                for (int r = 0; r < SR; r++)
                    sr[r] = fmaf(kr[r], w, sr[r]);
            }
        }
#pragma unroll
        for (int r = 0; r < SR; r++)
            sS[(warp * SR + r) * NC + lane] = sr[r];
        __syncthreads(); /* the next chunk overwrites q/M, k, the gates and V' */
    }
    if (active) {
#pragma unroll
        for (int r = 0; r < SR; r++)
            S[(int64_t)(warp * SR + r) * d_v + col] = sr[r];
    }
}

/* Launches the chunked kernel when the device grants its shared memory;
 * false (nothing launched) otherwise, and the caller runs the sequential form. */
template <int DK>
static tdm_status dnc_launch(tdm_gpu *g, const tdm_gpu_deltanet_shape *sh, const float *qkv,
                             const float *beta, const float *alpha, const float *ssm_a,
                             const float *dt_bias, float *state, float *o, int64_t ntok,
                             bool *launched, tdm_error *err)
{
    const int bytes = DncLayout<DK>::FLOATS * (int)sizeof(float);
    int optin = 0;
    TDM_CU(err, cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, g->device));
    *launched = bytes <= optin;
    if (!*launched)
        return TDM_OK;
    TDM_CU(err, cudaFuncSetAttribute(deltanet_chunked_kernel<DK>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    dim3 grid((unsigned)sh->n_v_head, tdm_cdiv(sh->d_v, DNC_COLS));
    TDM_LAUNCH(err, g, deltanet_chunked_kernel<DK>, grid, DNC_THREADS, bytes, qkv, beta, alpha, ssm_a, dt_bias, state, o,
               ntok, (int)sh->n_k_head, (int)sh->n_v_head, (int)sh->d_v, sh->map == TDM_GPU_HEADS_GROUPED, sh->eps);
    return TDM_OK;
}

/* The chunked form for d_k <= DNC_MAX_DK; *launched false where it cannot run. */
static tdm_status deltanet_chunked(tdm_gpu *g, const tdm_gpu_deltanet_shape *sh, const float *qkv,
                                   const float *beta, const float *alpha, const float *ssm_a,
                                   const float *dt_bias, float *state, float *o, int64_t ntok,
                                   bool *launched, tdm_error *err)
{
    *launched = false;
    switch (sh->d_k) {
    case 16: return dnc_launch<16>(g, sh, qkv, beta, alpha, ssm_a, dt_bias, state, o, ntok, launched, err);
    case 32: return dnc_launch<32>(g, sh, qkv, beta, alpha, ssm_a, dt_bias, state, o, ntok, launched, err);
    case 64: return dnc_launch<64>(g, sh, qkv, beta, alpha, ssm_a, dt_bias, state, o, ntok, launched, err);
    case 128: return dnc_launch<128>(g, sh, qkv, beta, alpha, ssm_a, dt_bias, state, o, ntok, launched, err);
    default: return TDM_OK;
    }
}

extern "C" tdm_status tdm_gpu_deltanet(tdm_gpu *g, const tdm_gpu_deltanet_shape *sh,
                                       const float *qkv, const float *beta, const float *alpha,
                                       const float *ssm_a, const float *dt_bias, float *state,
                                       float *o, int64_t ntok, tdm_error *err)
{
    TDM_REQUIRE(err, sh && qkv && beta && alpha && ssm_a && dt_bias && state && o,
                "gpu deltanet: NULL argument");
    TDM_REQUIRE(err, sh->n_k_head > 0 && sh->n_v_head > 0 && sh->n_v_head % sh->n_k_head == 0,
                "gpu deltanet: %lld value heads are not a multiple of %lld key heads",
                (long long)sh->n_v_head, (long long)sh->n_k_head);
    TDM_REQUIRE(err, sh->d_v > 0 && sh->d_v <= 65535 * DN_COLS && sh->n_v_head <= INT32_MAX,
                "gpu deltanet: d_v=%lld", (long long)sh->d_v);
    TDM_REQUIRE(err, ntok > 0, "gpu deltanet: ntok=%lld", (long long)ntok);
    TDM_REQUIRE(err, sh->map == TDM_GPU_HEADS_TILED || sh->map == TDM_GPU_HEADS_GROUPED,
                "gpu deltanet: head map %d", (int)sh->map);
    TDM_REQUIRE(err, g->tune.deltanet_chunk_min >= 0, "gpu deltanet: tuning deltanet_chunk_min %d",
                g->tune.deltanet_chunk_min);
    int64_t chunk_min = g->tune.deltanet_chunk_min ? g->tune.deltanet_chunk_min : DNC_MIN_TOKENS_DEFAULT;
    if (ntok >= chunk_min) {
        bool launched;
        tdm_status st = deltanet_chunked(g, sh, qkv, beta, alpha, ssm_a, dt_bias, state, o, ntok,
                                         &launched, err);
        if (st || launched)
            return st;
    }
    dim3 grid((unsigned)sh->n_v_head, tdm_cdiv(sh->d_v, DN_COLS));
    int nk = (int)sh->n_k_head, nv = (int)sh->n_v_head, dv = (int)sh->d_v;
    int grouped = sh->map == TDM_GPU_HEADS_GROUPED;
    cudaError_t e;
#define DN_LAUNCH(R)                                                                          \
    e = tdm_launch(g, deltanet_kernel<R>, grid, DN_WARPS * 32, 0, qkv, beta, alpha, ssm_a, dt_bias, state, o, ntok, nk, \
                   nv, dv, grouped, sh->eps)
    switch (sh->d_k) {
    case 16: DN_LAUNCH(4); break;
    case 32: DN_LAUNCH(8); break;
    case 64: DN_LAUNCH(16); break;
    case 128: DN_LAUNCH(32); break;
    case 256: DN_LAUNCH(64); break;
    default:
        return tdm_error_set(err, TDM_ERR_UNSUPPORTED,
                             "gpu deltanet: d_k=%lld (supported: 16, 32, 64, 128, 256)",
                             (long long)sh->d_k);
    }
#undef DN_LAUNCH
    TDM_CU(err, e);
    return TDM_OK;
}
