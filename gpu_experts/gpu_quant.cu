/* gpu_quant: quantised matrix-vector (decode, 1..8 tokens) and matrix-matrix
 * (prompt: dequantise to fp16 + cuBLAS) products over the gpu_quant.cuh table. */
#include <stdint.h>

#include "gpu_quant.cuh"

#define MV_WARPS 4

bool tdm_gpu_qt_geometry(tdm_qtype t, int *blk, int *bytes)
{
    bool ok = false;
    TDM_QT_DISPATCH(t, (*blk = QT<QTYPE>::BLK, *bytes = QT<QTYPE>::BYTES, ok = true));
    return ok;
}

extern "C" bool tdm_gpu_type_supported(tdm_qtype t)
{
    int blk, bytes;
    return tdm_gpu_qt_geometry(t, &blk, &bytes);
}

/* A block of MV_WARPS warps computes (MV_WARPS / wpr) * R rows: the wpr
 * warps of a row group split its units (so short and few rows still fill the
 * GPU) and meet in shared memory; each warp carries R rows so that one
 * activation load serves R rows (what limits 3-8 tokens). */
template <int T, int NT, int R>
__global__ void __launch_bounds__(MV_WARPS * 32)
    matvec_kernel(const uint8_t *__restrict__ w, int64_t row_bytes, int64_t rows, int units,
                  const float *__restrict__ x, int ntok, float *__restrict__ y, int accumulate,
                  int wpr)
{
    __shared__ float red[R][NT][MV_WARPS];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, sub = warp % wpr;
    int64_t row0 = ((int64_t)blockIdx.x * (MV_WARPS / wpr) + warp / wpr) * R;
    int nrows = rows - row0 < R ? (int)(rows - row0) : R;
    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++)
            acc[r][t] = 0.0f;
    if (nrows > 0)
        tdm_rows_dot_part<T, NT, R>(w + row0 * row_bytes, row_bytes, nrows, units, x,
                                    8 * (int64_t)units, ntok, sub * 32 + lane, 32 * wpr, acc);
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float s = tdm_warp_sum(acc[r][t]);
            if (lane == 0)
                red[r][t][warp] = s;
        }
    __syncthreads();
    if (lane == 0 && sub == 0) {
#pragma unroll
        for (int r = 0; r < R; r++) {
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t < ntok && r < nrows) {
                    float s = 0.0f;
                    for (int i = 0; i < wpr; i++)
                        s += red[r][t][warp + i];
                    float *dst = y + t * rows + row0 + r;
                    *dst = accumulate ? *dst + s : s;
                }
            }
        }
    }
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

#define MV_LAUNCH(NT, R)                                                                        \
    matvec_kernel<T, NT, R><<<tdm_cdiv(rows, (MV_WARPS / wpr) * R), MV_WARPS * 32, 0, st>>>(    \
        w, row_bytes, rows, units, x, ntok, y, acc, wpr)

template <int T>
static void launch_matvec(cudaStream_t st, const uint8_t *w, int64_t row_bytes, int64_t rows,
                          int units, const float *x, int ntok, float *y, int acc, int wpr, int rpw)
{
    if (ntok == 1)
        MV_LAUNCH(1, 1);
    else if (ntok == 2)
        MV_LAUNCH(2, 1);
    else if (ntok <= 4 && rpw == 1)
        MV_LAUNCH(4, 1);
    else if (ntok <= 4)
        MV_LAUNCH(4, 2);
    else if (rpw == 1)
        MV_LAUNCH(8, 1);
    else
        MV_LAUNCH(8, 2);
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
    if (blk == 8) /* plain types are read as whole words */
        TDM_REQUIRE(err, ((uintptr_t)w & 3) == 0, "%s: %s weights must be 4-byte aligned", who,
                    tdm_qtype_name(wt));
    *row_bytes = k / blk * bytes;
    return TDM_OK;
}

extern "C" tdm_status tdm_gpu_matvec(tdm_gpu *g, tdm_qtype wt, const void *w, int64_t rows,
                                     int64_t k, const float *x, int ntok, float *y,
                                     bool accumulate, tdm_error *err)
{
    int64_t row_bytes;
    tdm_status s = check_weights(wt, w, rows, k, "gpu matvec", &row_bytes, err);
    if (s != TDM_OK)
        return s;
    TDM_REQUIRE(err, ntok >= 1 && ntok <= TDM_GPU_MATVEC_MAX_TOK,
                "gpu matvec: ntok=%d outside 1..%d", ntok, TDM_GPU_MATVEC_MAX_TOK);
    TDM_REQUIRE(err, x && y, "gpu matvec: NULL activation or output");
    TDM_REQUIRE(err, ((uintptr_t)x & 15) == 0, "gpu matvec: x must be 16-byte aligned");
    const uint8_t *wb = (const uint8_t *)w;
    int units = (int)(k / 8);
    /* 2 rows per warp from 3 tokens on, for large matrices only: it halves the
     * activation loads (1.4-1.6x at 8 tokens on 2048x4096 .. 248320x2048) but
     * costs parallelism on expert-sized ones (measured, docs/GPU.md) */
    int rpw = ntok <= 2 ? 1
              : g->tune.matvec_rows ? g->tune.matvec_rows
              : rows >= 2048 && units >= 256 ? 2 : 1;
    int wpr = g->tune.matvec_wpr ? g->tune.matvec_wpr
                                 : auto_wpr((rows + rpw - 1) / rpw, units, g->sm_count);
    TDM_QT_DISPATCH(wt, (launch_matvec<QTYPE>(g->stream, wb, row_bytes, rows, units, x, ntok, y,
                                              accumulate ? 1 : 0, wpr, rpw)));
    TDM_LAUNCHED(err, "matvec_kernel");
    return TDM_OK;
}

/* One thread per unit: 8 elements -> 8 halves (one 16-byte store). */
template <int T>
__global__ void dequant_f16_kernel(const uint8_t *__restrict__ w, int64_t row_bytes, int units,
                                   int64_t total, uint16_t *__restrict__ dst)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total)
        return;
    int64_t row = i / units;
    int u = (int)(i - row * units);
    float q[8];
    tdm_dq_unit<T>(w + row * row_bytes, u, q);
    __half2 h[4];
#pragma unroll
    for (int p = 0; p < 4; p++)
        h[p] = __floats2half2_rn(q[2 * p], q[2 * p + 1]);
    *(uint4 *)(dst + 8 * i) = *(uint4 *)h;
}

extern "C" tdm_status tdm_gpu_dequant_f16(tdm_gpu *g, tdm_qtype wt, const void *w, int64_t rows,
                                          int64_t k, uint16_t *dst, tdm_error *err)
{
    int64_t row_bytes;
    tdm_status s = check_weights(wt, w, rows, k, "gpu dequant_f16", &row_bytes, err);
    if (s != TDM_OK)
        return s;
    TDM_REQUIRE(err, dst && ((uintptr_t)dst & 15) == 0,
                "gpu dequant_f16: destination NULL or not 16-byte aligned");
    int units = (int)(k / 8);
    int64_t total = rows * units;
    unsigned grid = tdm_cdiv(total, 256);
    const uint8_t *wb = (const uint8_t *)w;
    TDM_QT_DISPATCH(wt, (dequant_f16_kernel<QTYPE><<<grid, 256, 0, g->stream>>>(wb, row_bytes,
                                                                               units, total, dst)));
    TDM_LAUNCHED(err, "dequant_f16_kernel");
    return TDM_OK;
}

__global__ void f32_to_f16_kernel(const float *__restrict__ x, int64_t n, __half *__restrict__ y)
{
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
    int64_t row_bytes;
    tdm_status s = check_weights(wt, w, rows, k, "gpu matmul", &row_bytes, err);
    if (s != TDM_OK)
        return s;
    TDM_REQUIRE(err, x && y && scratch, "gpu matmul: NULL activation, output or scratch");
    TDM_REQUIRE(err, ntok >= 1 && ntok <= INT32_MAX && k <= INT32_MAX, "gpu matmul: ntok=%lld",
                (long long)ntok);
    TDM_REQUIRE(err, ((uintptr_t)scratch & 255) == 0, "gpu matmul: scratch not 256-byte aligned");
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
    f32_to_f16_kernel<<<tdm_cdiv(ntok * k, 256), 256, 0, g->stream>>>(x, ntok * k, x16);
    TDM_LAUNCHED(err, "f32_to_f16_kernel");
    const float one = 1.0f, zero = 0.0f;
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
