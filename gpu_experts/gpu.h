/* gpu: every CUDA kernel of tandem behind one plain C header.
 *
 * A tdm_gpu context owns one device's streams (compute + copy), events, the
 * cuBLAS handle and every device buffer allocated through it; tdm_gpu_free()
 * releases all of them. Every entry point takes device pointers, launches on
 * the context's compute stream and returns without synchronising; errors of
 * the launch itself come back at once, errors of the kernel's execution at the
 * next tdm_gpu_sync() (or synchronous copy). Every CUDA failure becomes
 * TDM_ERR_CUDA with the CUDA error string and the call site.
 *
 * Layouts: activations are float32 row-major, one row per token
 * (`x[t * n + i]`). Quantised weight matrices are GGUF's: `rows` rows of `k`
 * elements, row r at byte r * tdm_qtype_row_bytes(type, k). A matrix starts
 * aligned to the largest power of two, at most 16, that divides its format's
 * block bytes (Q4_K, Q5_K 16; Q5_1, IQ4_XS 8; Q4_1, Q2_K 4; Q6_K, Q8_0, Q3_K,
 * Q4_0, Q5_0, IQ4_NL 2; MXFP4 1; the plain types 4), so every block is: the
 * int8 decoders' loads assume it (every buffer of a tdm_gpu and every GGUF
 * tensor start is aligned so; tdm_gpu_weight_align). The entry points refuse
 * other weights, and expert slots and host experts whose size breaks it from
 * one to the next.
 * Attention KV caches are fp16, [n_kv_head][n_ctx][head_dim].
 * DeltaNet recurrent state is float32 [H_v][d_k][d_v] (key index first, as HF).
 *
 * Nothing here allocates on the per-token path: scratch is passed in by the
 * caller (sizes from the *_scratch_bytes helpers), sized once at load.
 * In builds without CUDA (gpu_none.c) every entry point returns
 * TDM_ERR_UNSUPPORTED and tdm_gpu_available() returns false.
 * A context is used by one host thread at a time.
 */
#ifndef TDM_GPU_H
#define TDM_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "quant.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tdm_gpu tdm_gpu;

typedef struct tdm_gpu_info {
    char name[256];
    int device;
    int sm_count;
    int cc_major, cc_minor;
    size_t mem_free, mem_total; /* bytes, at the time of the query */
    size_t l2_bytes;
} tdm_gpu_info;

/* True when this build has CUDA and at least one device is visible. */
bool tdm_gpu_available(void);

/* ---- context and buffers ---- */
tdm_status tdm_gpu_create(int device, tdm_gpu **out, tdm_error *err);
void tdm_gpu_free(tdm_gpu *g); /* frees every buffer still allocated through g */
tdm_status tdm_gpu_query(tdm_gpu *g, tdm_gpu_info *info, tdm_error *err);

/* Device memory owned by g (freed by tdm_gpu_release or tdm_gpu_free). */
tdm_status tdm_gpu_alloc(tdm_gpu *g, size_t bytes, void **dptr, tdm_error *err);
void tdm_gpu_release(tdm_gpu *g, void *dptr);
/* Page-locked host memory owned by g (for DMA and mapped hand-off buffers). */
tdm_status tdm_gpu_alloc_host(tdm_gpu *g, size_t bytes, void **hptr, tdm_error *err);
void tdm_gpu_release_host(tdm_gpu *g, void *hptr);
/* Pins host memory owned by someone else (e.g. the model's copy of its
 * experts) so kernels read it over PCIe (zero-copy), read-only: [p, p +
 * bytes) widened to whole pages. *dev: the device address of p. The caller
 * must call tdm_gpu_host_unregister(g, p) before the memory goes away and
 * before tdm_gpu_free. TDM_ERR_UNSUPPORTED when the device or the memory
 * cannot be registered. Anonymous huge pages register fast (2 GiB in 0.04 s
 * on the H200 host); a file mapping can take minutes (docs/EXECUTOR.md).
 * The widened pages must hold nothing else the caller copies with
 * tdm_gpu_upload/download: a copy from heap memory sharing a page with the
 * registered range failed with cudaErrorInvalidValue on the H200 (give the
 * range pages of its own, e.g. an mmap or a page-multiple allocation). */
tdm_status tdm_gpu_host_register(tdm_gpu *g, const void *p, size_t bytes, const void **dev, tdm_error *err);
void tdm_gpu_host_unregister(tdm_gpu *g, const void *p);

/* Synchronous copies on the compute stream (they wait for queued kernels). */
tdm_status tdm_gpu_upload(tdm_gpu *g, void *dst, const void *src, size_t bytes, tdm_error *err);
tdm_status tdm_gpu_download(tdm_gpu *g, void *dst, const void *src, size_t bytes, tdm_error *err);
/* The same copies queued on the compute stream without waiting: an upload's
 * source must stay unchanged, and a download's destination unread, until the
 * stream is next waited for (tdm_gpu_sync, tdm_gpu_sync_pausing or a
 * synchronous copy). With page-locked host memory
 * (tdm_gpu_alloc_host) the host goes on at once; with pageable memory the
 * driver may wait for the copy anyway. */
tdm_status tdm_gpu_upload_async(tdm_gpu *g, void *dst, const void *src, size_t bytes, tdm_error *err);
tdm_status tdm_gpu_download_async(tdm_gpu *g, void *dst, const void *src, size_t bytes, tdm_error *err);
/* Asynchronous device-to-device copy and fill on the compute stream. */
tdm_status tdm_gpu_copy(tdm_gpu *g, void *dst, const void *src, size_t bytes, tdm_error *err);
tdm_status tdm_gpu_memset(tdm_gpu *g, void *dst, int byte, size_t bytes, tdm_error *err);
/* Fills n floats with v (tests poison outputs with NaN this way). */
tdm_status tdm_gpu_fill_f32(tdm_gpu *g, float *dst, float v, size_t n, tdm_error *err);
/* Expert/slot copies on the context's copy stream, overlapping compute
 * (src in page-locked memory for a truly asynchronous DMA; any direction). */
tdm_status tdm_gpu_copy_async(tdm_gpu *g, void *dst, const void *src, size_t bytes,
                              tdm_error *err);
/* Orders the streams without blocking the host: compute waits for every copy
 * queued so far (before using a filled slot) ... */
tdm_status tdm_gpu_wait_copies(tdm_gpu *g, tdm_error *err);
/* ... and copies wait for the compute queued so far (before overwriting a
 * slot that queued kernels may still read). */
tdm_status tdm_gpu_wait_compute(tdm_gpu *g, tdm_error *err);
/* Copy fences, for a pipeline of copies into reused buffers: fence i is set
 * after the copies queued so far (replacing its previous setting for later
 * waits); the host can wait for it (before refilling the page-locked source
 * of those copies), or the compute stream can (before kernels read what they
 * brought, without blocking the host or waiting for later copies). A fence
 * never set is passed. */
#define TDM_GPU_FENCES 4
tdm_status tdm_gpu_fence_copies(tdm_gpu *g, int fence, tdm_error *err);
tdm_status tdm_gpu_fence_wait_host(tdm_gpu *g, int fence, tdm_error *err);
tdm_status tdm_gpu_fence_wait_compute(tdm_gpu *g, int fence, tdm_error *err);
/* Work beside the compute stream, e.g. reads of host memory while the compute
 * stream runs a layer: after side_begin the side stream starts where the
 * compute stream is now, and this module's kernels are launched there until
 * side_end (which always switches back, even when it fails). side_join makes
 * the compute stream wait for what the side stream had at the last side_end.
 * A CUDA graph being recorded on the compute stream records the side work as
 * a branch; it must be joined before the recording ends. The side work must
 * not touch what the compute stream's kernels meanwhile read or write. */
tdm_status tdm_gpu_side_begin(tdm_gpu *g, tdm_error *err);
tdm_status tdm_gpu_side_end(tdm_gpu *g, tdm_error *err);
tdm_status tdm_gpu_side_join(tdm_gpu *g, tdm_error *err);
/* Waits for the compute stream; reports any asynchronous kernel error. */
tdm_status tdm_gpu_sync(tdm_gpu *g, tdm_error *err);
/* The same for a whole step: the calling thread polls with ~2 us of pause
 * instructions between polls, so that a hardware thread sharing its core
 * (the CPU expert pool's, on an SMT desktop) keeps most of the core; a
 * sleeping wait (cudaEventBlockingSync) cost ~0.1-0.2 ms of wake-up per
 * decode step on the H200 host. */
tdm_status tdm_gpu_sync_pausing(tdm_gpu *g, tdm_error *err);

/* Device timing for benchmarks: records a mark on the compute stream;
 * tdm_gpu_elapsed_ms() waits for the later mark and returns the time
 * between two marks (mark ids 0..TDM_GPU_MARKS-1). */
#define TDM_GPU_MARKS 8
tdm_status tdm_gpu_mark(tdm_gpu *g, int mark, tdm_error *err);
tdm_status tdm_gpu_elapsed_ms(tdm_gpu *g, int from, int to, float *ms, tdm_error *err);

/* Launch-shape choices (performance only: every choice computes the same
 * values and the tests run all of them). 0 = the built-in choice. */
typedef struct tdm_gpu_tuning {
    int matvec_wpr;  /* warps sharing one matvec row: 1, 2 or 4 (quantised
                        formats: rows of >= 32 units only) */
    int matvec_rows; /* rows per lane for 3-8 tokens: 1 or 2 */
    int moe_tile;    /* fused MoE down: output rows per block: 8, 16 or 32 */
    int deltanet_chunk_min; /* DeltaNet: batches of at least this many tokens run
                               the chunked form (1 = always; 16 built in) */
    int pdl;         /* programmatic dependent launch (each kernel starts its
                        weight prefetch while the previous one finishes):
                        -1 off; built in: on where the GPU has it (sm_90+) */
} tdm_gpu_tuning;
tdm_status tdm_gpu_set_tuning(tdm_gpu *g, const tdm_gpu_tuning *t, tdm_error *err);

/* ---- quantised matrix products ---- */

/* True when the GPU kernels multiply weights of type t: F32, F16, BF16, Q4_0,
 * Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4. */
bool tdm_gpu_type_supported(tdm_qtype t);

/* The alignment in bytes a matrix of type t must start at (see Layouts
 * above), and that expert slots and host experts keep from one to the
 * next; 0 when the kernels do not take the type. */
int tdm_gpu_weight_align(tdm_qtype t);

#define TDM_GPU_MATVEC_MAX_TOK 8 /* tokens a matvec block multiplies at once */

/* Decode products: y[t][r] = (accumulate ? y[t][r] : 0) + W[r] . x[t] for
 * r < rows, t < ntok. w: [rows] rows of k elements of type wt; x: [ntok][k];
 * y: [ntok][rows]. xq: NULL, or x's int8 copy from the norm that wrote x
 * (tdm_gpu_rmsnorm's yq; one token only): the quantised formats copy it
 * instead of quantising x in every block (the same values, so the same y;
 * rows of k <= 16384, longer ones quantise x as without it); plain formats
 * read x. k must be a multiple of the type's block (8 for F32/F16/BF16).
 * One launch for any ntok (groups of TDM_GPU_MATVEC_MAX_TOK tokens side by
 * side, each reading the weights: from L2 for small matrices); made for 1..8
 * tokens and for the small F32 matrices of a prompt (router, beta/alpha).
 * Quantised formats multiply int8 activations (x quantised per 32 elements
 * on the device, dp4a; error bound in docs/GPU.md); F32/F16/BF16 keep x in
 * float32. */
tdm_status tdm_gpu_matvec(tdm_gpu *g, tdm_qtype wt, const void *w, int64_t rows, int64_t k,
                          const float *x, const void *xq, int ntok, float *y, bool accumulate,
                          tdm_error *err);

/* One matrix of tdm_gpu_matvec_pair: rows of k elements of type `type`. */
typedef struct tdm_gpu_mat {
    tdm_qtype type;
    const void *w;
    int64_t rows;
} tdm_gpu_mat;

/* One token through two matrices of the same input width k, e.g. attention
 * q|k (Q4_K) and v (Q6_K) of a Q4_K_M file: y[0 .. a.rows) = A . x and
 * y[a.rows .. a.rows + b.rows) = B . x (accumulate as tdm_gpu_matvec). The
 * same values as those two tdm_gpu_matvec calls, bit for bit; one launch
 * when tdm_gpu_matvec_pair_one_launch says so, else the two calls. */
tdm_status tdm_gpu_matvec_pair(tdm_gpu *g, const tdm_gpu_mat *a, const tdm_gpu_mat *b, int64_t k, const float *x,
                               const void *xq, float *y, bool accumulate, tdm_error *err);
/* Whether a pair of these types runs as one launch: x's int8 copy given
 * (xq), k <= 16384 and a kernel for the pair (the K-quant mixes: Q4_K,
 * Q5_K, Q3_K or Q2_K with the type llama.cpp's recipes give attn_v). */
bool tdm_gpu_matvec_pair_one_launch(tdm_qtype a, tdm_qtype b, int64_t k, bool xq);

/* Device scratch bytes tdm_gpu_matmul needs to process up to chunk_rows rows of
 * a [rows][k] matrix per cuBLAS call for ntok tokens. */
size_t tdm_gpu_matmul_scratch_bytes(int64_t chunk_rows, int64_t k, int64_t ntok);

/* Prompt products, any ntok: y[t][r] = W[r] . x[t] (y: [ntok][rows]).
 * Dequantises W to fp16 (chunks of rows fitting the scratch) and x to fp16,
 * then cuBLAS GEMM with float32 accumulation; F32 weights go straight to
 * cuBLAS SGEMM (float32 throughout, scratch unused, any x range). */
tdm_status tdm_gpu_matmul(tdm_gpu *g, tdm_qtype wt, const void *w, int64_t rows, int64_t k,
                          const float *x, int64_t ntok, float *y, void *scratch,
                          size_t scratch_bytes, tdm_error *err);

/* Dequantises `rows` rows of k elements to fp16 (dst: [rows][k] uint16 halves). */
tdm_status tdm_gpu_dequant_f16(tdm_gpu *g, tdm_qtype wt, const void *w, int64_t rows, int64_t k,
                               uint16_t *dst, tdm_error *err);

/* ---- norms, small element-wise ops ---- */

/* Bytes of the int8 copy of ntok rows of k activations (k a multiple of 32)
 * that a norm writes for the product after it (tdm_gpu_rmsnorm's yq,
 * tdm_gpu_matvec's xq): the same per-32 quantisation the products apply to
 * float activations, written once instead of by every block of the product. */
static inline size_t tdm_gpu_xq8_bytes(int64_t ntok, int64_t k)
{
    const size_t pitch = ((size_t)k + 127) & ~(size_t)127;
    return (size_t)ntok * (pitch + pitch / 32 * 8);
}

/* RMSNorm of n_rows rows of n elements: y[r] = w . (x[r] * rsqrt(mean(x[r]^2) + eps)).
 * Row r starts at x + r * stride (same for y; in place allowed). w: [n] (GGUF
 * files already hold the +1 of zero-centred norms). yq: NULL, or a 16-byte
 * aligned buffer of tdm_gpu_xq8_bytes(n_rows, n) receiving y's int8 copy
 * (n a multiple of 32). */
tdm_status tdm_gpu_rmsnorm(tdm_gpu *g, const float *x, const float *w, float *y, void *yq,
                           int64_t n_rows, int64_t n, int64_t stride, float eps, tdm_error *err);

/* Gated RMSNorm of the DeltaNet output, per head of n elements:
 * y[r] = (w . rmsnorm(x[r])) * silu(z[r]); rows contiguous ([n_rows][n]).
 * yq: NULL, or y's int8 copy as rows of `group` heads (the product's input
 * rows): tdm_gpu_xq8_bytes(n_rows / group, group * n) bytes, 16-byte aligned,
 * n a multiple of 32 and n_rows of group. */
tdm_status tdm_gpu_rmsnorm_gated(tdm_gpu *g, const float *x, const float *z, const float *w,
                                 float *y, void *yq, int64_t n_rows, int64_t n, int64_t group,
                                 float eps, tdm_error *err);

/* ---- attention ---- */

/* Positions come from device memory (pos: [ntok]) and launch shapes do not
 * depend on them, so a recorded decode step (CUDA graph) replays unchanged
 * from token to token. A position outside 0 .. n_ctx-1 never touches the
 * cache: attn_prep stores nothing for that token and attention writes a zero
 * output row for it. tdm_gpu_attention reads pos while the launch before may
 * still run (programmatic dependent launch): pos must not be written by the
 * launch right before it. */

/* The inputs of one attention layer, from its q, k, v projections. */
typedef struct tdm_gpu_attn_in {
    const float *q_src;          /* token t: q_src + t * q_stride: per head head_dim query
                                    values, with a gate output then head_dim gate values */
    const float *k_src, *v_src;  /* token t: + t * kv_stride: [n_kv][head_dim] each */
    int64_t q_stride, kv_stride; /* floats between tokens */
    const float *q_norm, *k_norm; /* [head_dim] RMSNorm weights */
    int64_t n_head, n_kv, head_dim; /* head_dim <= 512 */
    int64_t n_rot;               /* RoPE channels: even, <= head_dim */
    float base, eps;             /* RoPE base, RMSNorm epsilon */
} tdm_gpu_attn_in;

/* One launch for ntok tokens: each query head RMSNorm (q_norm) then NeoX
 * (half-split) RoPE on its first n_rot channels into q [ntok][n_head][head_dim];
 * gate != NULL: the gate halves into gate [ntok][n_head][head_dim]; each key
 * head RMSNorm (k_norm), RoPE, fp16 into kc at row pos[t]; each value head fp16
 * into vc at row pos[t]. Caches: [n_kv][n_ctx][head_dim] halves. inv_freq and
 * angles are float32 as in transformers: inv_freq[i] = 1 / base^(2i / n_rot). */
tdm_status tdm_gpu_attn_prep(tdm_gpu *g, const tdm_gpu_attn_in *in, const int32_t *pos, int64_t ntok,
                             float *q, float *gate, uint16_t *kc, uint16_t *vc, int64_t n_ctx,
                             tdm_error *err);

/* Causal GQA attention for ntok queries over the caches: query t attends keys
 * 0 .. pos[t] (the caches must already hold them).
 * q: [ntok][n_head][head_dim]; query head h reads KV head h / (n_head / n_kv);
 * scale: usually 1/sqrt(head_dim). gate: NULL, or [ntok][n_head][head_dim]:
 * the output is multiplied by sigmoid(gate) (gated attention).
 * o: [ntok][n_head][head_dim]. Softmax in float32. head_dim <= 512.
 * scratch: NULL, or device memory of tdm_gpu_attention_scratch_bytes() for
 * these heads and cache, zeroed once by the caller and kept for every call
 * (the kernel leaves it zeroed): batches of up to 8 queries then split the
 * keys over several blocks per head (a decode step would use a handful of
 * SMs otherwise). Calls sharing one scratch must run in stream order.
 * Batches of 16 or more queries at head_dim 64, 128 or 256 (16-byte aligned
 * q and cache rows, where the device grants the kernel's shared memory) run
 * on the tensor cores with q and the softmax weights split into fp16 hi + lo
 * (float32 accuracy; q x scale must stay within fp16's range, as normed
 * queries do). */
size_t tdm_gpu_attention_scratch_bytes(const tdm_gpu *g, int64_t n_head, int64_t head_dim,
                                       int64_t n_ctx);
tdm_status tdm_gpu_attention(tdm_gpu *g, const float *q, const uint16_t *kc, const uint16_t *vc,
                             const float *gate, float *o, int64_t ntok, int64_t n_head,
                             int64_t n_kv, int64_t head_dim, int64_t n_ctx, const int32_t *pos,
                             float scale, void *scratch, size_t scratch_bytes, tdm_error *err);

/* ---- Gated DeltaNet ---- */

/* Causal depthwise conv + SiLU over ntok tokens, continuing from the state.
 * u: [ntok][channels] pre-conv inputs; w: [channels][kernel] (GGUF ssm_conv1d,
 * tap kernel-1 multiplies the current token); state: two halves
 * [2][kernel-1][channels], each the kernel-1 inputs before some position,
 * oldest first: the inputs before position p are in half p & 1; pos: device
 * memory, the first token's position p0 (read by the kernel, so a recorded
 * launch serves every position): reads half p0 & 1, writes half
 * (p0 + ntok) & 1 (the same half for an even ntok: in place). Two halves let
 * the one-token step (below) read the old inputs in every block while one
 * block writes the new ones. y: [ntok][channels]. kernel in 2..8. */
tdm_status tdm_gpu_ssm_conv(tdm_gpu *g, const float *u, const float *w, float *state, const int32_t *pos, float *y,
                            int64_t ntok, int64_t channels, int64_t kernel, tdm_error *err);

typedef enum tdm_gpu_head_map {
    TDM_GPU_HEADS_TILED = 0,   /* value head j uses key head j % H_k (qwen35moe GGUF) */
    TDM_GPU_HEADS_GROUPED = 1  /* value head j uses key head j / (H_v / H_k) (qwen3next) */
} tdm_gpu_head_map;

typedef struct tdm_gpu_deltanet_shape {
    int64_t n_k_head, n_v_head; /* H_k, H_v (H_v a multiple of H_k) */
    int64_t d_k, d_v;           /* d_k in {16, 32, 64, 128, 256}; any d_v */
    tdm_gpu_head_map map;
    float eps;                  /* L2-norm epsilon (1e-6) */
} tdm_gpu_deltanet_shape;

/* Gated DeltaNet recurrence over ntok tokens. Two forms, equal up to float32
 * rounding: below tdm_gpu_tuning.deltanet_chunk_min tokens (16 built in;
 * decode, short batches) the exact token-sequential recurrence, parallel over
 * value heads and value columns; from there the chunked form (chunks of 64
 * tokens, models.md §3.6.6) for d_k <= 128 on devices granting its ~92 KB of
 * shared memory per block (sm_80+; d_k <= 32 on sm_75), else sequential.
 * qkv: [ntok][2*H_k*d_k + H_v*d_v], the conv output (q | k | v, head-major);
 * beta, alpha: [ntok][H_v] raw projections; ssm_a: [H_v] (= -exp(A_log));
 * dt_bias: [H_v]; state: [H_v][d_k][d_v], updated in place; o: [ntok][H_v][d_v].
 * Per token: q, k L2-normalised, q scaled by 1/sqrt(d_k), b = sigmoid(beta),
 * g = ssm_a * softplus(alpha + dt_bias); S = e^g S; S += k (b (v - S^T k))^T;
 * o = S^T q. */
tdm_status tdm_gpu_deltanet(tdm_gpu *g, const tdm_gpu_deltanet_shape *sh, const float *qkv,
                            const float *beta, const float *alpha, const float *ssm_a,
                            const float *dt_bias, float *state, float *o, int64_t ntok,
                            tdm_error *err);

/* One decode token's DeltaNet in one launch: tdm_gpu_ssm_conv of its q, k
 * and v channels, tdm_gpu_deltanet, then tdm_gpu_rmsnorm_gated per value
 * head (and y's int8 copy), equal to those three calls up to float32
 * rounding (the sums of squares run in another order). The buffers of one
 * step, all device memory: */
typedef struct tdm_gpu_deltanet_step_io {
    const float *qkv;             /* [2*H_k*d_k + H_v*d_v] the conv's inputs (q | k | v) */
    const float *conv_w;          /* [channels][kernel] */
    float *conv_state;            /* [2][kernel-1][channels], tdm_gpu_ssm_conv's two halves */
    const int32_t *pos;           /* this token's position p: reads half p & 1, writes (p + 1) & 1 */
    int64_t kernel;               /* conv taps */
    const float *beta, *alpha;    /* [H_v] raw projections */
    const float *ssm_a, *dt_bias; /* [H_v] */
    float *state;                 /* [H_v][d_k][d_v], updated in place */
    const float *z;               /* [H_v * d_v] the output gate's projection */
    const float *norm_w;          /* [d_v] */
    float norm_eps;
    float *y;                     /* [H_v * d_v] */
    void *yq;                     /* NULL, or y's int8 copy as one row: tdm_gpu_xq8_bytes(1, H_v * d_v)
                                     bytes, 16-byte aligned */
} tdm_gpu_deltanet_step_io;

/* Whether tdm_gpu_deltanet_step takes this shape: d_k 16..128 (a power of
 * 2), d_v a multiple of 8 up to 128 (of 32 with the int8 copy), conv kernel
 * 2..8. */
bool tdm_gpu_deltanet_step_fits(const tdm_gpu_deltanet_shape *sh, int64_t kernel, bool copy);

/* The step (TDM_ERR_UNSUPPORTED where it does not fit). Under programmatic
 * dependent launch it reads qkv, z, pos and the states while the launch
 * before may still run: those must not be written by the launch right
 * before it (beta and alpha may be). */
tdm_status tdm_gpu_deltanet_step(tdm_gpu *g, const tdm_gpu_deltanet_shape *sh,
                                 const tdm_gpu_deltanet_step_io *io, tdm_error *err);

/* ---- greedy choice ---- */

/* *out = the index of the largest of x[0..n) (device; NaN never wins, the
 * lowest index on ties, 0 when nothing is above -inf: tdm_sampler_argmax's
 * choice), so a greedy step downloads 4 bytes instead of its logits.
 * scratch: device memory of tdm_gpu_argmax_scratch_bytes() bytes, 8-byte
 * aligned, zeroed once before its first use (every call leaves it so);
 * calls sharing it run in stream order. 1 <= n <= INT32_MAX. */
size_t tdm_gpu_argmax_scratch_bytes(void);
tdm_status tdm_gpu_argmax(tdm_gpu *g, const float *x, int64_t n, void *scratch, int32_t *out, tdm_error *err);

/* ---- MoE ---- */

/* Router on the device: softmax over n_expert logits (float32), top-k
 * (descending; ties to the lower id), optional renormalisation of the k
 * weights. logits: [ntok][n_expert]; ids: [ntok][k]; weights: [ntok][k].
 * n_expert <= 1024, k <= 32. */
tdm_status tdm_gpu_router(tdm_gpu *g, const float *logits, int64_t ntok, int64_t n_expert,
                          int64_t k, bool renorm, int32_t *ids, float *weights, tdm_error *err);

/* Where the routed experts' weights live. slot_of (device) maps
 * layer * n_expert + expert to a slot index or -1 (not resident: the fused
 * kernels skip it; its h rows and contribution are left to the CPU). A slot
 * holds one expert's gate, up and down matrices at the given byte offsets
 * from arena + slot * slot_bytes, in the layer's types. */
typedef struct tdm_gpu_expert_table {
    const int32_t *slot_of; /* device [n_layer][n_expert] */
    int64_t n_expert;
    const void *arena;      /* device, slot 0 */
    size_t slot_bytes;
    size_t gate_off, up_off, down_off;
} tdm_gpu_expert_table;

/* The shared expert of a layer (Qwen3-Next / Qwen3.5); NULL where absent. */
typedef struct tdm_gpu_shared_expert {
    const void *gate, *up, *down; /* device; gate, up: [n_ff][n_embd]; down: [n_embd][n_ff] */
    tdm_qtype gate_type, up_type, down_type;
    int64_t n_ff;
    const float *gate_logit; /* device [ntok]: w_sg . m; its sigmoid scales the output; NULL = 1 */
} tdm_gpu_shared_expert;

/* A layer's routed experts in host memory the device can read (registered
 * with tdm_gpu_host_register: zero-copy, over PCIe), for the misses the
 * fused decode kernels take from the CPU: a selection whose expert has no
 * slot is read from here when fewer than *quota selections before it (in
 * [token][rank] order, over the launch) also have none; the rest are the
 * CPU's (gpu_handoff.h tells the pool how many to skip). */
typedef struct tdm_gpu_direct_experts {
    const void *gate, *up, *down; /* device pointers of the [n_expert] matrices of each */
    size_t gate_stride, up_stride, down_stride; /* bytes from one expert's matrix to the next */
    const int32_t *quota;         /* device, one int32: the misses per launch read from here */
} tdm_gpu_direct_experts;

typedef struct tdm_gpu_moe_layer {
    const tdm_gpu_expert_table *table;
    int64_t layer;
    tdm_qtype gate_type, up_type, down_type;
    int64_t n_embd, n_ff;                 /* expert: gate/up [n_ff][n_embd], down [n_embd][n_ff] */
    const tdm_gpu_shared_expert *shared;  /* NULL when the layer has none */
    const tdm_gpu_direct_experts *direct; /* NULL: the misses are all left to the CPU;
                                           * read by tdm_gpu_moe_gate_up / _down only */
    bool shared_done;                     /* tdm_gpu_router_shared wrote the shared expert's h
                                           * rows: tdm_gpu_moe_gate_up leaves them */
} tdm_gpu_moe_layer;

/* Row stride of h: max(n_ff, shared n_ff). h holds, per token, k routed rows
 * and (when shared) one more: h[t][i][0..n_ff), i <= k. */
int64_t tdm_gpu_moe_h_stride(const tdm_gpu_moe_layer *L);

/* The h buffer of tdm_gpu_moe_gate_up / _down for `rows` = ntok * (k +
 * shared) selections: the float rows [rows][h_stride] (their bytes rounded up
 * to 256), then the int8 copy that gate_up writes for down: [rows][h_stride
 * rounded up to 128] int8 and 8 bytes per 32 of scale and sums. An upper
 * bound of h_stride and rows gives a buffer that serves every smaller call. */
static inline size_t tdm_gpu_moe_h_float_bytes(int64_t h_stride, int64_t rows)
{
    return ((size_t)rows * (size_t)h_stride * sizeof(float) + 255) & ~(size_t)255;
}

static inline size_t tdm_gpu_moe_h_bytes(int64_t h_stride, int64_t rows)
{
    return tdm_gpu_moe_h_float_bytes(h_stride, rows) + tdm_gpu_xq8_bytes(rows, h_stride);
}

/* ONE launch: h[t][i] = silu(Gate_e x[t]) * Up_e x[t] for every selected
 * expert e = ids[t][i] that is resident, plus the shared expert into h[t][k]
 * (unless L->shared_done: tdm_gpu_router_shared below).
 * x: [ntok][n_embd], 16-byte aligned; ids: [ntok][k], k <= 32; h: 256-byte
 * aligned, tdm_gpu_moe_h_bytes(tdm_gpu_moe_h_stride(L), ntok * (k + shared))
 * bytes, the floats [ntok][k + shared][h_stride] first. Both fused launches
 * multiply int8 activations (x, h) as tdm_gpu_matvec; h is quantised once,
 * by gate_up, into the buffer's int8 copy. xq: NULL, or x's int8 copy from
 * the norm that wrote x (one token; as tdm_gpu_matvec's xq: the blocks copy
 * it instead of quantising x, n_embd <= 16384). */
tdm_status tdm_gpu_moe_gate_up(tdm_gpu *g, const tdm_gpu_moe_layer *L, const float *x,
                               const void *xq, const int32_t *ids, int64_t ntok, int64_t k, float *h,
                               tdm_error *err);

/* tdm_gpu_router and, in the same launch, tdm_gpu_moe_gate_up's part for
 * L's shared expert (its h rows and their int8 copy, the same values), so
 * that the gate_up launch after it (L->shared_done set) holds the routed
 * experts alone (the Qwen3.5 decode step: 128 blocks instead of 144 on the
 * H200's 132 SMs; docs/GPU.md). The shared expert's blocks compute while the launch
 * before (the logits) may still run, under programmatic dependent launch:
 * x and xq must not be written by that launch. n_expert <=
 * TDM_GPU_ROUTER_SHARED_MAX_EXPERTS; L must have a shared expert. */
#define TDM_GPU_ROUTER_SHARED_MAX_EXPERTS 256
tdm_status tdm_gpu_router_shared(tdm_gpu *g, const tdm_gpu_moe_layer *L, const float *logits, int64_t ntok,
                                 int64_t n_expert, int64_t k, bool renorm, int32_t *ids, float *weights,
                                 const float *x, const void *xq, float *h, tdm_error *err);

/* ONE launch: y[t] = (accumulate ? y[t] : 0) + (add ? add[t] : 0)
 *                   + sum over resident i of weights[t][i] * Down_e h[t][i]
 *                   + sigmoid(shared gate_logit[t]) * Down_shared h[t][k].
 * h: as gate_up wrote it (same ntok and k); add: NULL or [ntok][n_embd]
 * (e.g. the CPU's partial sum in mapped memory). ids, weights, the shared
 * gate logit and the residency table are read while the launch before may
 * still run (programmatic dependent launch): they may be written two
 * launches back or earlier (the router, then gate_up), never by the launch
 * right before this one. */
tdm_status tdm_gpu_moe_down(tdm_gpu *g, const tdm_gpu_moe_layer *L, const float *h,
                            const int32_t *ids, const float *weights, int64_t ntok, int64_t k,
                            const float *add, float *y, bool accumulate, tdm_error *err);

/* ---- MoE for prompt batches (gpu_moe_prefill.cu) ---- */

/* The same results as tdm_gpu_moe_gate_up followed by tdm_gpu_moe_down, but
 * grouped by expert: the selections are sorted by expert on the device
 * (counting sort, no host synchronisation, graph-capturable) and each expert's
 * weight tile is dequantised once (to fp16) for a tile of its tokens, which
 * tensor cores multiply with float32 accumulation (error bound: docs/GPU.md).
 * Meant for ntok > TDM_GPU_MATVEC_MAX_TOK; any ntok >= 1 works.
 *
 * Device scratch bytes for up to max_tok tokens with k selections each: the
 * sort (a permutation, a tile list) and per-selection partial outputs
 * [max_tok * (k + shared)][n_embd] floats: 38 MB for 512 tokens, 302 MB for
 * 4096 (k 8 + shared, n_embd 2048). 0 when L is not a valid layer. */
size_t tdm_gpu_moe_prefill_scratch_bytes(const tdm_gpu_moe_layer *L, int64_t max_tok, int64_t k);

/* Several launches, no allocation:
 *   h[t][i] = silu(Gate_e x[t]) * Up_e x[t] for each resident e = ids[t][i],
 *   h[t][k] = the shared expert's, as tdm_gpu_moe_gate_up (same h layout,
 *             [ntok][k + shared][tdm_gpu_moe_h_stride]; rows of non-resident
 *             selections untouched), then
 *   y[t] = (accumulate ? y[t] : 0) + (add ? add[t] : 0)
 *          + sum over resident i, in rank order, of weights[t][i] * Down_e h[t][i]
 *          + sigmoid(shared gate_logit[t]) * Down_shared h[t][k], as tdm_gpu_moe_down.
 * Deterministic: no float atomics, every output element summed in one order.
 * x: [ntok][n_embd], 16-byte aligned; ids, weights: [ntok][k]; h: 16-byte
 * aligned; add: NULL or [ntok][n_embd]; scratch: 256-byte aligned, at least
 * tdm_gpu_moe_prefill_scratch_bytes(L, ntok, k) bytes. n_expert <= 4096.
 * x and h pass through fp16: keep this path for normed activations. */
tdm_status tdm_gpu_moe_prefill(tdm_gpu *g, const tdm_gpu_moe_layer *L, const float *x,
                               const int32_t *ids, const float *weights, int64_t ntok, int64_t k,
                               float *h, const float *add, float *y, bool accumulate,
                               void *scratch, size_t scratch_bytes, tdm_error *err);

/* ---- testing ---- */

/* Dequantises a row on the host through the very table the kernels use (no
 * device needed), so tests can compare it bit for bit with tdm_dequant_row. */
tdm_status tdm_gpu_dequant_row_host(tdm_qtype wt, const void *src, float *dst, int64_t n,
                                    tdm_error *err);

#ifdef __cplusplus
}
#endif

#endif
