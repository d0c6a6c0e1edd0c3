/* kernels: CPUID/XGETBV detection, the dispatch table and the ISA-independent
 * entry points of kernels.h.
 *
 * The default ISA is the best one the CPU and OS support, chosen on first use
 * (pthread_once). The environment variable TDM_ISA=scalar|avx2|avx512
 * overrides it (an ISA the CPU lacks is refused with a warning and the best
 * one is used). tdm_cpu_isa_select() switches afterwards; call it before
 * starting threads (the table is plain data, read without locks).
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "kernels_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define TDM_X86 1
#endif

typedef struct cpu_features {
    bool avx2;   /* AVX2 + FMA + F16C, OS saves YMM state */
    bool avx512; /* F + BW + VL + DQ, OS saves opmask/ZMM state */
    bool vnni;   /* AVX512_VNNI */
} cpu_features;

static cpu_features g_cpu;
static tdm_cpu_isa g_isa = TDM_ISA_SCALAR;
static tdm_kernel_table g_table;
static bool g_use_vnni = true; /* tests may turn the VNNI table off */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_once_t g_feat_once = PTHREAD_ONCE_INIT;

static const char *const k_isa_names[TDM_ISA_COUNT] = {"scalar", "avx2", "avx512"};

#ifdef TDM_X86
static uint64_t read_xcr0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}
#endif

static cpu_features detect_features(void)
{
    cpu_features f = {false, false, false};
#ifdef TDM_X86
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return f;
    bool osxsave = c & (1u << 27), avx = c & (1u << 28), fma = c & (1u << 12),
         f16c = c & (1u << 29);
    if (!osxsave || !avx)
        return f;
    uint64_t xcr0 = read_xcr0();
    bool ymm_state = (xcr0 & 0x6) == 0x6;            /* SSE + AVX state */
    bool zmm_state = ymm_state && (xcr0 & 0xE0) == 0xE0; /* opmask, ZMM_Hi256, Hi16_ZMM */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return f;
    f.avx2 = ymm_state && fma && f16c && (b & (1u << 5));
    bool avx512 = (b & (1u << 16)) && (b & (1u << 17)) && (b & (1u << 30)) && (b & (1u << 31));
    f.avx512 = f.avx2 && zmm_state && avx512;
    f.vnni = f.avx512 && (c & (1u << 11));
#endif
    return f;
}

static void detect_once(void)
{
    g_cpu = detect_features();
}

static bool isa_supported(tdm_cpu_isa isa)
{
    pthread_once(&g_feat_once, detect_once);
    switch (isa) {
    case TDM_ISA_SCALAR: return true;
    case TDM_ISA_AVX2: return g_cpu.avx2;
    case TDM_ISA_AVX512: return g_cpu.avx512;
    default: return false;
    }
}

/* Each slot comes from the most specific table that fills it. */
static void fill_table(tdm_cpu_isa isa)
{
    const tdm_kernel_table *chain[4];
    int nc = 0;
    if (isa == TDM_ISA_AVX512) {
        if (g_cpu.vnni && g_use_vnni)
            chain[nc++] = &tdm_kernels_avx512_vnni;
        chain[nc++] = &tdm_kernels_avx512;
    }
    if (isa >= TDM_ISA_AVX2)
        chain[nc++] = &tdm_kernels_avx2;
    chain[nc++] = &tdm_kernels_scalar;
    for (int t = 0; t < TDM_Q_COUNT; t++) {
        g_table.quant[t] = NULL;
        g_table.dot[t] = NULL;
        g_table.dot4[t] = NULL;
        g_table.dott4[t] = NULL;
        for (int i = nc - 1; i >= 0; i--) {
            if (chain[i]->quant[t])
                g_table.quant[t] = chain[i]->quant[t];
            if (chain[i]->dot[t]) { /* dot4/dott4 must agree with dot bit for bit: same table */
                g_table.dot[t] = chain[i]->dot[t];
                g_table.dot4[t] = chain[i]->dot4[t];
                g_table.dott4[t] = chain[i]->dott4[t];
            }
        }
    }
    g_isa = isa;
}

static void init_once(void)
{
    tdm_cpu_isa isa = tdm_cpu_isa_detect();
    const char *env = getenv("TDM_ISA");
    if (env && *env) {
        int want = -1;
        for (int i = 0; i < TDM_ISA_COUNT; i++)
            if (strcmp(env, k_isa_names[i]) == 0)
                want = i;
        if (want < 0)
            tdm_log(TDM_LOG_WARN, "TDM_ISA=%s is not one of scalar|avx2|avx512; using %s", env,
                    k_isa_names[isa]);
        else if (!isa_supported((tdm_cpu_isa)want))
            tdm_log(TDM_LOG_WARN, "TDM_ISA=%s: this CPU lacks it; using %s", env, k_isa_names[isa]);
        else
            isa = (tdm_cpu_isa)want;
    }
    fill_table(isa);
}

static inline const tdm_kernel_table *table(void)
{
    pthread_once(&g_once, init_once);
    return &g_table;
}

tdm_cpu_isa tdm_cpu_isa_detect(void)
{
    pthread_once(&g_feat_once, detect_once);
    return g_cpu.avx512 ? TDM_ISA_AVX512 : g_cpu.avx2 ? TDM_ISA_AVX2 : TDM_ISA_SCALAR;
}

tdm_status tdm_cpu_isa_select(tdm_cpu_isa isa, tdm_error *err)
{
    table();
    if ((int)isa < 0 || isa >= TDM_ISA_COUNT)
        return tdm_error_set(err, TDM_ERR_INVALID, "cpu isa: unknown id %d", (int)isa);
    if (!isa_supported(isa))
        return tdm_error_set(err, TDM_ERR_UNSUPPORTED, "cpu isa: this CPU lacks %s",
                             k_isa_names[isa]);
    fill_table(isa);
    return TDM_OK;
}

tdm_status tdm_cpu_isa_select_variant(tdm_cpu_isa isa, int vnni, tdm_error *err)
{
    table();
    if (vnni && isa == TDM_ISA_AVX512 && !g_cpu.vnni)
        return tdm_error_set(err, TDM_ERR_UNSUPPORTED, "cpu isa: this CPU lacks AVX512_VNNI");
    g_use_vnni = vnni != 0;
    tdm_status st = tdm_cpu_isa_select(isa, err);
    g_use_vnni = true;
    return st;
}

int tdm_cpu_has_vnni(void)
{
    pthread_once(&g_feat_once, detect_once);
    return g_cpu.vnni;
}

tdm_cpu_isa tdm_cpu_isa_active(void)
{
    table();
    return g_isa;
}

const char *tdm_cpu_isa_name(tdm_cpu_isa isa)
{
    return (int)isa >= 0 && isa < TDM_ISA_COUNT ? k_isa_names[isa] : "?";
}

/* The activation format of weight type wt, or -1 when wt cannot be dotted. */
static int act_type(tdm_qtype wt)
{
    const tdm_qtype_info *q = tdm_qtype_get((uint32_t)wt);
    if (!q || !q->dequant || !tdm_kernels_scalar.dot[wt])
        return -1;
    return (int)q->vec_dot_type;
}

size_t tdm_act_row_bytes(tdm_qtype wt, int64_t n)
{
    switch (act_type(wt)) {
    case TDM_Q_F32: return (size_t)n * sizeof(float);
    case TDM_Q_Q8_0: return (size_t)(n / 32) * TDM_ACT_Q8_0;
    case TDM_Q_Q8_1: return (size_t)(n / 32) * TDM_ACT_Q8_1;
    case TDM_Q_Q8_K: return (size_t)(n / 256) * TDM_ACT_Q8_K;
    default: return 0;
    }
}

/* The kernels.h entry points return no status: a type without a CPU kernel is
 * a caller bug (the model loader validates types with tdm_act_row_bytes() != 0),
 * reported by name before aborting rather than by a wild jump. */
static void no_kernel(const char *fn, tdm_qtype wt)
{
    tdm_log(TDM_LOG_ERROR, "%s: no CPU kernel for type %s (id %d)", fn, tdm_qtype_name(wt), (int)wt);
    abort();
}

void tdm_act_quantize(tdm_qtype wt, const float *x, void *xq, int64_t n)
{
    int at = act_type(wt);
    if (at < 0)
        no_kernel("tdm_act_quantize", wt);
    table()->quant[at](x, xq, n);
}

static tdm_vec_dot_fn dot_for(const char *fn, tdm_qtype wt)
{
    tdm_vec_dot_fn dot = (unsigned)wt < TDM_Q_COUNT ? table()->dot[wt] : NULL;
    if (!dot || act_type(wt) < 0)
        no_kernel(fn, wt);
    return dot;
}

float tdm_vec_dot(tdm_qtype wt, int64_t n, const void *w, const void *xq)
{
    return dot_for("tdm_vec_dot", wt)(n, w, xq);
}

/* Software prefetch TDM_PREFETCH_BYTES ahead of the row being computed
 * (whole rows, at least one): the kernels need a good part of a core's time
 * per byte, so the DRAM latency must be hidden ahead of the hardware
 * streamer. Both it and TDM_DOT4_MAX_ROW_BYTES can be set at build time
 * (EXTRA_CFLAGS=-D...) to measure another host (docs/EXECUTOR.md "The row
 * driver"); TDM_NO_PREFETCH turns the software prefetch off. */
/* Rows of more bytes than this are multiplied one at a time, not four side
 * by side: four rows of 0.5-2 KB interleave four streams through DRAM, which
 * the hardware prefetchers follow badly (AVX2 VM, one token, weights from
 * DRAM, `bench/matvec --bytes 256M --threads 1,2`: Q4_K 512x2048 (1152 B
 * rows) 2.1-2.6 GB/s with four rows at a time, 6.5-7.6 with one; 2 threads
 * 3.6-4.3 -> 9.3-11.0; Q8_0 2048x512 (544 B rows) 2 threads 5.1-6.4 ->
 * 10.4-11.2; in cache both drivers ~10 GB/s). Rows of <= 512 B (Q4_K/Q6_K
 * down projections) keep the four-row driver: its four rows are one
 * contiguous stream, and single rows measured no better there. */
#ifndef TDM_DOT4_MAX_ROW_BYTES
#define TDM_DOT4_MAX_ROW_BYTES 512
#endif

#ifndef TDM_NO_PREFETCH
#ifndef TDM_PREFETCH_BYTES
#define TDM_PREFETCH_BYTES 4096
#endif
static inline void prefetch_row(const uint8_t *p, size_t bytes)
{
    for (size_t o = 0; o < bytes; o += 64)
        __builtin_prefetch(p + o, 0, 3);
}
#else
#undef TDM_PREFETCH_BYTES
#define TDM_PREFETCH_BYTES 0
static inline void prefetch_row(const uint8_t *p, size_t bytes)
{
    (void)p, (void)bytes;
}
#endif

/* One tdm_matmul_rows call: what the row loops need. */
typedef struct mm_ctx {
    tdm_vec_dot_fn dot;
    tdm_vec_dot4_fn dot4;   /* 4 rows x 1 token, or NULL */
    tdm_vec_dott4_fn dott4; /* 1 row x 4 tokens, or NULL */
    int64_t n, r1, pf_rows;
    const uint8_t *w;
    size_t w_stride, row_bytes;
} mm_ctx;

static void prefetch_ahead(const mm_ctx *c, int64_t r, int64_t count)
{
    for (int64_t p = r + c->pf_rows; p < r + c->pf_rows + count && p < c->r1; p++)
        prefetch_row(c->w + (size_t)p * c->w_stride, c->row_bytes);
}

/* Rows [rt, re) against one activation; `first` = these rows come from DRAM. */
static void rows_x1(const mm_ctx *c, int64_t rt, int64_t re, const void *xt, float *yt, int first)
{
    int64_t r = rt;
    if (c->dot4) {
        for (; r + 4 <= re; r += 4) {
            if (first)
                prefetch_ahead(c, r, 4);
            float out[4];
            c->dot4(c->n, c->w + (size_t)r * c->w_stride, c->w_stride, xt, out);
            yt[r] = out[0], yt[r + 1] = out[1], yt[r + 2] = out[2], yt[r + 3] = out[3];
        }
    }
    for (; r < re; r++) {
        if (first)
            prefetch_ahead(c, r, 1);
        yt[r] = c->dot(c->n, c->w + (size_t)r * c->w_stride, xt);
    }
}

/* Rows [rt, re) against four activations, each weight block unpacked once. */
static void rows_x4(const mm_ctx *c, int64_t rt, int64_t re, const uint8_t *xt, size_t xq_stride,
                    float *yt, size_t y_stride, int first)
{
    for (int64_t r = rt; r < re; r++) {
        if (first)
            prefetch_ahead(c, r, 1);
        float out[4];
        c->dott4(c->n, c->w + (size_t)r * c->w_stride, xt, xq_stride, out);
        for (int k = 0; k < 4; k++)
            yt[(size_t)k * y_stride + (size_t)r] = out[k];
    }
}

/* Rows are taken in tiles that stay in L1/L2 while every token passes over
 * them, so a prompt reads each weight row from DRAM once; tokens go four at a
 * time where the ISA has a 4-token kernel. */
void tdm_matmul_rows(tdm_qtype wt, int64_t n, const void *w, size_t w_stride, int64_t r0,
                     int64_t r1, const void *xq, size_t xq_stride, int64_t ntok, float *y,
                     size_t y_stride)
{
    mm_ctx c = {dot_for("tdm_matmul_rows", wt), table()->dot4[wt], table()->dott4[wt], n, r1, 1,
                w, w_stride, tdm_qtype_row_bytes(wt, n)};
    int64_t tile = c.row_bytes ? (int64_t)(32768 / c.row_bytes) : 1;
    if (tile < 1)
        tile = 1;
    if (ntok == 1)
        tile = r1 - r0;
    if (c.row_bytes > TDM_DOT4_MAX_ROW_BYTES)
        c.dot4 = NULL;
    if (c.row_bytes)
        c.pf_rows = (int64_t)((TDM_PREFETCH_BYTES + c.row_bytes - 1) / c.row_bytes);
    if (c.pf_rows < 1)
        c.pf_rows = 1;
    const uint8_t *xb = xq;
    for (int64_t rt = r0; rt < r1; rt += tile) {
        int64_t re = rt + tile < r1 ? rt + tile : r1, t = 0;
        for (; c.dott4 && t + 4 <= ntok; t += 4)
            rows_x4(&c, rt, re, xb + (size_t)t * xq_stride, xq_stride, y + (size_t)t * y_stride,
                    y_stride, t == 0);
        for (; t < ntok; t++)
            rows_x1(&c, rt, re, xb + (size_t)t * xq_stride, y + (size_t)t * y_stride, t == 0);
    }
}
