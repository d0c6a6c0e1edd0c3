/* gpu_norm: RMSNorm, plain and gated (models.md §1.2, §3.6). */
#include "gpu_norm.cuh"
#include "gpu_xq.cuh"

/* One block per row. z == NULL: plain RMSNorm; else times silu(z). VEC:
 * rows of at most NORM_THREADS * 4 * NORM_VEC elements, all pointers and the
 * stride 16-byte aligned: each thread loads its x, w (and z) float4s at once
 * and keeps them in registers (one memory round trip instead of a strided
 * loop's several, which a one-row decode step pays for in full). y may be x.
 * yq != NULL: y's int8 copy too (tdm_xq layout, n a multiple of 32), `group`
 * rows of the norm making one row of the copy (pitch bytes; scales at ys). */
template <bool VEC>
__global__ void __launch_bounds__(NORM_THREADS)
    rmsnorm_kernel(const float *x, const float *__restrict__ w, const float *__restrict__ z, float *y,
                   int64_t n, int64_t stride, float eps, int8_t *yq, uint2 *ys, int group, int pitch)
{
    tdm_pdl_enter();
    __shared__ float red[32];
    const float *xr = x + blockIdx.x * stride, *zr = z ? z + blockIdx.x * stride : NULL;
    float *yr = y + blockIdx.x * stride;
    /* this row's place in the int8 copy */
    const int qrow = (int)blockIdx.x / group, qoff = ((int)blockIdx.x - qrow * group) * (int)n;
    int8_t *qr = yq ? yq + (int64_t)qrow * pitch : NULL;
    uint2 *sr = yq ? ys + (int64_t)qrow * (pitch / 32) : NULL;
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
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (i < n4) {
                v = make_float4(wv[k].x * (xv[k].x * r), wv[k].y * (xv[k].y * r), wv[k].z * (xv[k].z * r),
                                wv[k].w * (xv[k].w * r));
                if (zr) {
                    v.x *= tdm_silu(zv[k].x);
                    v.y *= tdm_silu(zv[k].y);
                    v.z *= tdm_silu(zv[k].z);
                    v.w *= tdm_silu(zv[k].w);
                }
                ((float4 *)yr)[i] = v;
            }
            if (qr) /* uniform; whole groups of 8 lanes agree on i < n4 (n % 32 == 0) */
                tdm_xq_put4(v, qoff + 4 * i, i < n4, qr, sr);
        }
    } else {
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
            ss += xr[i] * xr[i];
        ss = tdm_block_sum(ss, red);
        float r = rsqrtf(ss / (float)n + eps);
        /* a warp's 32 consecutive elements are one group of the copy: every
         * lane of a warp makes the same trips (n % 32 == 0 with a copy) */
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            float v = w[i] * (xr[i] * r);
            if (zr)
                v *= tdm_silu(zr[i]);
            yr[i] = v;
            if (qr)
                tdm_xq_put32(v, qr, sr, (qoff + (int)i) / 32);
        }
    }
}

static bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

static cudaError_t launch_rmsnorm(tdm_gpu *g, const float *x, const float *w, const float *z, float *y, void *yq,
                                  int64_t group, int64_t n_rows, int64_t n, int64_t stride, float eps)
{
    const bool vec = n % 4 == 0 && stride % 4 == 0 && n <= NORM_THREADS * 4 * NORM_VEC && aligned16(x) &&
                     aligned16(w) && aligned16(y) && (!z || aligned16(z));
    const int pitch = (int)((group * n + 127) & ~(int64_t)127);
    int8_t *q = (int8_t *)yq;
    uint2 *s = q ? (uint2 *)(q + n_rows / group * pitch) : NULL;
    return tdm_launch(g, vec ? rmsnorm_kernel<true> : rmsnorm_kernel<false>, (unsigned)n_rows, NORM_THREADS, 0, x, w, z,
                      y, n, stride, eps, q, s, (int)group, pitch);
}

/* The int8 copy's shape: n a multiple of 32, whole rows of `group`, rows of
 * at most INT32_MAX bytes, 16-byte aligned. */
static tdm_status check_copy(const void *yq, int64_t n_rows, int64_t n, int64_t group, const char *who,
                             tdm_error *err)
{
    if (!yq)
        return TDM_OK;
    TDM_REQUIRE(err, n % 32 == 0 && group >= 1 && n_rows % group == 0 && group * n <= INT32_MAX / 2 &&
                         ((uintptr_t)yq & 15) == 0,
                "%s: int8 copy of rows of %lld x %lld elements (n_rows %lld): n must be a multiple of 32, "
                "the rows whole, the copy 16-byte aligned",
                who, (long long)group, (long long)n, (long long)n_rows);
    return TDM_OK;
}

extern "C" tdm_status tdm_gpu_rmsnorm(tdm_gpu *g, const float *x, const float *w, float *y, void *yq,
                                      int64_t n_rows, int64_t n, int64_t stride, float eps,
                                      tdm_error *err)
{
    TDM_REQUIRE(err, x && w && y, "gpu rmsnorm: NULL argument");
    TDM_REQUIRE(err, n_rows > 0 && n_rows <= INT32_MAX && n > 0 && stride >= n,
                "gpu rmsnorm: bad shape rows=%lld n=%lld stride=%lld", (long long)n_rows,
                (long long)n, (long long)stride);
    tdm_status st = check_copy(yq, n_rows, n, 1, "gpu rmsnorm", err);
    if (st)
        return st;
    TDM_CU(err, launch_rmsnorm(g, x, w, NULL, y, yq, 1, n_rows, n, stride, eps));
    return TDM_OK;
}

extern "C" tdm_status tdm_gpu_rmsnorm_gated(tdm_gpu *g, const float *x, const float *z,
                                            const float *w, float *y, void *yq, int64_t n_rows,
                                            int64_t n, int64_t group, float eps, tdm_error *err)
{
    TDM_REQUIRE(err, x && z && w && y, "gpu rmsnorm_gated: NULL argument");
    TDM_REQUIRE(err, n_rows > 0 && n_rows <= INT32_MAX && n > 0,
                "gpu rmsnorm_gated: bad shape rows=%lld n=%lld", (long long)n_rows, (long long)n);
    tdm_status st = check_copy(yq, n_rows, n, group, "gpu rmsnorm_gated", err);
    if (st)
        return st;
    TDM_CU(err, launch_rmsnorm(g, x, w, z, y, yq, yq ? group : 1, n_rows, n, n, eps));
    return TDM_OK;
}
