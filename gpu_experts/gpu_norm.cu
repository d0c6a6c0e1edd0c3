/* gpu_norm: norms, rope and the q/gate split (models.md §1.2, §1.4, §3.4). */
#include "gpu_norm.cuh"

/* One block per row. z == NULL: plain RMSNorm; else times silu(z). VEC:
 * rows of at most NORM_THREADS * 4 * NORM_VEC elements, all pointers and the
 * stride 16-byte aligned: each thread loads its x, w (and z) float4s at once
 * and keeps them in registers (one memory round trip instead of a strided
 * loop's several, which a one-row decode step pays for in full). y may be x. */
template <bool VEC>
__global__ void __launch_bounds__(NORM_THREADS)
    rmsnorm_kernel(const float *x, const float *__restrict__ w, const float *__restrict__ z, float *y,
                   int64_t n, int64_t stride, float eps)
{
    tdm_pdl_enter();
    __shared__ float red[32];
    const float *xr = x + blockIdx.x * stride, *zr = z ? z + blockIdx.x * stride : NULL;
    float *yr = y + blockIdx.x * stride;
    float ss = 0.0f;
    if constexpr (VEC) {
        float4 xv[NORM_VEC], wv[NORM_VEC], zv[NORM_VEC];
        const int n4 = (int)(n / 4);
#pragma unroll
        for (int k = 0; k < NORM_VEC; k++) {
            const int i = threadIdx.x + k * NORM_THREADS;
            if (i < n4) {
                xv[k] = ((const float4 *)xr)[i];
                wv[k] = ((const float4 *)w)[i];
                zv[k] = zr ? ((const float4 *)zr)[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                ss += xv[k].x * xv[k].x + xv[k].y * xv[k].y + xv[k].z * xv[k].z + xv[k].w * xv[k].w;
            }
        }
        ss = tdm_block_sum(ss, red);
        const float r = rsqrtf(ss / (float)n + eps);
#pragma unroll
        for (int k = 0; k < NORM_VEC; k++) {
            const int i = threadIdx.x + k * NORM_THREADS;
            if (i < n4) {
                float4 v = make_float4(wv[k].x * (xv[k].x * r), wv[k].y * (xv[k].y * r), wv[k].z * (xv[k].z * r),
                                       wv[k].w * (xv[k].w * r));
                if (zr) {
                    v.x *= tdm_silu(zv[k].x);
                    v.y *= tdm_silu(zv[k].y);
                    v.z *= tdm_silu(zv[k].z);
                    v.w *= tdm_silu(zv[k].w);
                }
                ((float4 *)yr)[i] = v;
            }
        }
    } else {
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
            ss += xr[i] * xr[i];
        ss = tdm_block_sum(ss, red);
        float r = rsqrtf(ss / (float)n + eps);
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            float v = w[i] * (xr[i] * r);
            if (zr)
                v *= tdm_silu(zr[i]);
            yr[i] = v;
        }
    }
}

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

static cudaError_t launch_rmsnorm(tdm_gpu *g, const float *x, const float *w, const float *z, float *y,
                                  int64_t n_rows, int64_t n, int64_t stride, float eps)
{
    const bool vec = n % 4 == 0 && stride % 4 == 0 && n <= NORM_THREADS * 4 * NORM_VEC && aligned16(x) &&
                     aligned16(w) && aligned16(y) && (!z || aligned16(z));
    return tdm_launch(g, vec ? rmsnorm_kernel<true> : rmsnorm_kernel<false>, (unsigned)n_rows, NORM_THREADS, 0, x, w, z,
                      y, n, stride, eps);
}

extern "C" tdm_status tdm_gpu_rmsnorm(tdm_gpu *g, const float *x, const float *w, float *y,
                                      int64_t n_rows, int64_t n, int64_t stride, float eps,
                                      tdm_error *err)
{
    TDM_REQUIRE(err, x && w && y, "gpu rmsnorm: NULL argument");
    TDM_REQUIRE(err, n_rows > 0 && n_rows <= INT32_MAX && n > 0 && stride >= n,
                "gpu rmsnorm: bad shape rows=%lld n=%lld stride=%lld", (long long)n_rows,
                (long long)n, (long long)stride);
    TDM_CU(err, launch_rmsnorm(g, x, w, NULL, y, n_rows, n, stride, eps));
    return TDM_OK;
}

extern "C" tdm_status tdm_gpu_rmsnorm_gated(tdm_gpu *g, const float *x, const float *z,
                                            const float *w, float *y, int64_t n_rows, int64_t n,
                                            float eps, tdm_error *err)
{
    TDM_REQUIRE(err, x && z && w && y, "gpu rmsnorm_gated: NULL argument");
    TDM_REQUIRE(err, n_rows > 0 && n_rows <= INT32_MAX && n > 0,
                "gpu rmsnorm_gated: bad shape rows=%lld n=%lld", (long long)n_rows, (long long)n);
    TDM_CU(err, launch_rmsnorm(g, x, w, z, y, n_rows, n, n, eps));
    return TDM_OK;
}

/* One thread per (token, head, pair i < n_rot/2). */
__global__ void rope_kernel(float *x, int64_t ntok, int64_t n_head, int64_t head_dim,
                            int64_t tok_stride, int64_t half, float base, const int32_t *pos)
{
    tdm_pdl_enter();
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= ntok * n_head * half)
        return;
    int64_t i = idx % half, h = (idx / half) % n_head, t = idx / (half * n_head);
    /* transformers: inv_freq = 1 / base^(arange(0, d, 2) / d) in float32 */
    float inv = 1.0f / powf(base, (float)(2 * i) / (float)(2 * half));
    float ang = (float)pos[t] * inv;
    float c = cosf(ang), s = sinf(ang);
    float *p = x + t * tok_stride + h * head_dim;
    float a = p[i], b = p[i + half];
    p[i] = a * c - b * s;
    p[i + half] = b * c + a * s;
}

extern "C" tdm_status tdm_gpu_rope(tdm_gpu *g, float *x, int64_t ntok, int64_t n_head,
                                   int64_t head_dim, int64_t tok_stride, int64_t n_rot, float base,
                                   const int32_t *pos, tdm_error *err)
{
    TDM_REQUIRE(err, x && pos, "gpu rope: NULL argument");
    TDM_REQUIRE(err, ntok > 0 && n_head > 0 && head_dim > 0 && tok_stride >= n_head * head_dim,
                "gpu rope: bad shape ntok=%lld heads=%lld head_dim=%lld stride=%lld",
                (long long)ntok, (long long)n_head, (long long)head_dim, (long long)tok_stride);
    TDM_REQUIRE(err, n_rot > 0 && n_rot % 2 == 0 && n_rot <= head_dim,
                "gpu rope: n_rot=%lld must be even and <= head_dim %lld", (long long)n_rot,
                (long long)head_dim);
    TDM_REQUIRE(err, base > 0.0f, "gpu rope: base %g", (double)base);
    int64_t n = ntok * n_head * (n_rot / 2);
    TDM_LAUNCH(err, g, rope_kernel, tdm_cdiv(n, 256), 256, 0, x, ntok, n_head, head_dim, tok_stride, n_rot / 2, base,
               pos);
    return TDM_OK;
}

__global__ void qgate_split_kernel(const float *__restrict__ p, float *__restrict__ q,
                                   float *__restrict__ gate, int64_t n, int64_t head_dim)
{
    tdm_pdl_enter();
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n)
        return;
    int64_t th = idx / head_dim, i = idx % head_dim; /* th = token * n_head + head */
    q[idx] = p[2 * th * head_dim + i];
    gate[idx] = p[(2 * th + 1) * head_dim + i];
}

extern "C" tdm_status tdm_gpu_qgate_split(tdm_gpu *g, const float *p, float *q, float *gate,
                                          int64_t ntok, int64_t n_head, int64_t head_dim,
                                          tdm_error *err)
{
    TDM_REQUIRE(err, p && q && gate, "gpu qgate_split: NULL argument");
    TDM_REQUIRE(err, ntok > 0 && n_head > 0 && head_dim > 0, "gpu qgate_split: bad shape");
    int64_t n = ntok * n_head * head_dim;
    TDM_LAUNCH(err, g, qgate_split_kernel, tdm_cdiv(n, 256), 256, 0, p, q, gate, n, head_dim);
    return TDM_OK;
}
