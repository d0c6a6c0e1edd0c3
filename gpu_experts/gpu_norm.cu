/* gpu_norm: RMSNorm, plain and gated (models.md §1.2, §3.6). */
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
