/* gpu_deltanet: models.md §3.6.3-3.6.5. */
#include <math.h>

#include "gpu_deltanet.cuh"
#include "gpu_norm.cuh"

/* One thread per channel, sequential over the tokens. */
__global__ void ssm_conv_kernel(const float *__restrict__ u, const float *__restrict__ w,
                                float *state, float *__restrict__ y, int64_t ntok,
                                int64_t channels, int kernel)
{
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= channels)
        return;
    float win[CONV_MAX_K], tap[CONV_MAX_K];
    for (int i = 0; i < kernel; i++)
        tap[i] = w[c * kernel + i];
    for (int i = 0; i < kernel - 1; i++)
        win[i] = state[i * channels + c];
    for (int64_t t = 0; t < ntok; t++) {
        float cur = u[t * channels + c], s = tap[kernel - 1] * cur;
        for (int i = 0; i < kernel - 1; i++)
            s += tap[i] * win[i];
        y[t * channels + c] = tdm_silu(s);
        for (int i = 0; i + 1 < kernel - 1; i++)
            win[i] = win[i + 1];
        win[kernel - 2] = cur;
    }
    for (int i = 0; i < kernel - 1; i++)
        state[i * channels + c] = win[i];
}

extern "C" tdm_status tdm_gpu_ssm_conv(tdm_gpu *g, const float *u, const float *w, float *state,
                                       float *y, int64_t ntok, int64_t channels, int64_t kernel,
                                       tdm_error *err)
{
    TDM_REQUIRE(err, u && w && state && y, "gpu ssm_conv: NULL argument");
    TDM_REQUIRE(err, kernel >= 2 && kernel <= CONV_MAX_K, "gpu ssm_conv: kernel %lld outside 2..%d",
                (long long)kernel, CONV_MAX_K);
    TDM_REQUIRE(err, ntok > 0 && channels > 0, "gpu ssm_conv: bad shape ntok=%lld channels=%lld",
                (long long)ntok, (long long)channels);
    ssm_conv_kernel<<<tdm_cdiv(channels, 128), 128, 0, g->stream>>>(u, w, state, y, ntok, channels,
                                                                    (int)kernel);
    TDM_LAUNCHED(err, "ssm_conv_kernel");
    return TDM_OK;
}

__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

template <int RPT> /* state rows per thread = d_k / DN_KSPLIT */
__global__ void __launch_bounds__(DN_WARPS * 32)
    deltanet_kernel(const float *__restrict__ qkv, const float *__restrict__ beta,
                    const float *__restrict__ alpha, const float *__restrict__ ssm_a,
                    const float *__restrict__ dt_bias, float *state, float *__restrict__ o,
                    int64_t ntok, int n_kh, int n_vh, int d_v, int grouped, float eps)
{
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
    float qscale = rsqrtf((float)DK), a_j = ssm_a[j], dt_j = dt_bias[j];
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
        float rq = rsqrtf(tdm_block_sum(qss, s_red) + eps) * qscale;
        float rk = rsqrtf(tdm_block_sum(kss, s_red) + eps);
        float b = tdm_sigmoid(beta[t * n_vh + j]);
        float eg = expf(a_j * softplus(alpha[t * n_vh + j] + dt_j));
        float vv = active ? row[2 * (int64_t)n_kh * DK + (int64_t)j * d_v + col] : 0.0f;
        float pk = 0.0f;
#pragma unroll
        for (int r = 0; r < RPT; r++)
            pk += s[r] * s_k[ks + DN_KSPLIT * r];
        pk *= rk;
        pk += __shfl_xor_sync(0xffffffffu, pk, 1);
        pk += __shfl_xor_sync(0xffffffffu, pk, 2);
        float delta = b * (vv - eg * pk), po = 0.0f;
#pragma unroll
        for (int r = 0; r < RPT; r++) {
            s[r] = s[r] * eg + (s_k[ks + DN_KSPLIT * r] * rk) * delta;
            po += s[r] * s_q[ks + DN_KSPLIT * r];
        }
        po += __shfl_xor_sync(0xffffffffu, po, 1);
        po += __shfl_xor_sync(0xffffffffu, po, 2);
        po *= rq;
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
    dim3 grid((unsigned)sh->n_v_head, tdm_cdiv(sh->d_v, DN_COLS));
    int nk = (int)sh->n_k_head, nv = (int)sh->n_v_head, dv = (int)sh->d_v;
    int grouped = sh->map == TDM_GPU_HEADS_GROUPED;
#define DN_LAUNCH(R)                                                                          \
    deltanet_kernel<R><<<grid, DN_WARPS * 32, 0, g->stream>>>(qkv, beta, alpha, ssm_a, dt_bias, \
                                                              state, o, ntok, nk, nv, dv,     \
                                                              grouped, sh->eps)
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
    TDM_LAUNCHED(err, "deltanet_kernel");
    return TDM_OK;
}
