/* membw: see membw.h. Compiled with the portable flags: the streaming loops
 * use SSE2 (x86-64 baseline), which on every current core issues loads far
 * faster than one core's share of DRAM bandwidth. */
#include "membw.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "kernels.h"
#include "topology.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define MIB ((size_t)1 << 20)

int tdm_membw_physical_cores(void)
{
    tdm_topology *t;
    if (tdm_topology_load(&t, NULL) != TDM_OK)
        return 1;
    int n = tdm_topology_physical_cores(t);
    tdm_topology_free(t);
    return n;
}

int tdm_membw_thread_ladder(int32_t *threads, int cap)
{
    const int cores = tdm_membw_physical_cores();
    int n = 0;
    for (int t = 1; t < cores && n + 1 < cap; t *= 2)
        threads[n++] = t;
    if (n < cap)
        threads[n++] = cores;
    return n;
}

void tdm_membw_opts_default(tdm_membw_opts *o)
{
    o->bytes = (size_t)1 << 30;
    o->threads = 0;
    o->repeats = 7;
}

const char *tdm_membw_kind_name(tdm_membw_kind k)
{
    static const char *const names[TDM_MEMBW_KIND_COUNT] = {"read", "copy", "triad"};
    return (int)k >= 0 && k < TDM_MEMBW_KIND_COUNT ? names[k] : "?";
}

/* ---- buffers ------------------------------------------------------------ */

static void *big_alloc(size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
#ifdef MADV_HUGEPAGE
    madvise(p, bytes, MADV_HUGEPAGE); /* fewer TLB misses; a hint only */
#endif
    return p;
}

static void big_free(void *p, size_t bytes)
{
    if (p)
        munmap(p, bytes);
}

/* Slice [lo, hi) of n items for thread t of nt, in units of `align` items. */
static void slice(size_t n, int t, int nt, size_t align, size_t *lo, size_t *hi)
{
    size_t units = n / align;
    *lo = units * (size_t)t / (size_t)nt * align;
    *hi = units * (size_t)(t + 1) / (size_t)nt * align;
}

/* ---- streaming loops (slices are multiples of 8 doubles, 64-byte aligned)
 * Each loop prefetches PF_AHEAD bytes ahead, as the kernels do: without it a
 * single thread is latency-bound and the probe would understate what one
 * core can stream. Prefetching past the end of a slice is harmless. */
#define PF_AHEAD 1024

/* Reads n doubles' worth of bytes as integers (any bit pattern: the region
 * probe reads quantised weights, which as doubles would hold denormals and
 * slow the adds); returns their xor so the loads stay live. */
static uint64_t read_slice(const double *a, size_t n)
{
#if defined(__SSE2__)
    __m128i s0 = _mm_setzero_si128(), s1 = s0, s2 = s0, s3 = s0;
    const __m128i *v = (const __m128i *)a;
    for (size_t i = 0; i < n / 2; i += 4) {
        __builtin_prefetch((const char *)(v + i) + PF_AHEAD, 0, 3);
        s0 = _mm_xor_si128(s0, _mm_load_si128(v + i));
        s1 = _mm_xor_si128(s1, _mm_load_si128(v + i + 1));
        s2 = _mm_xor_si128(s2, _mm_load_si128(v + i + 2));
        s3 = _mm_xor_si128(s3, _mm_load_si128(v + i + 3));
    }
    uint64_t out[2];
    _mm_storeu_si128((__m128i *)out, _mm_xor_si128(_mm_xor_si128(s0, s1), _mm_xor_si128(s2, s3)));
    return out[0] ^ out[1];
#else
    const uint64_t *u = (const uint64_t *)a;
    uint64_t s = 0;
    for (size_t i = 0; i < n; i++)
        s ^= u[i];
    return s;
#endif
}

static void copy_slice(double *restrict b, const double *restrict a, size_t n)
{
#if defined(__SSE2__)
    for (size_t i = 0; i < n; i += 8) {
        __builtin_prefetch((const char *)(a + i) + PF_AHEAD, 0, 3);
        _mm_store_pd(b + i, _mm_load_pd(a + i));
        _mm_store_pd(b + i + 2, _mm_load_pd(a + i + 2));
        _mm_store_pd(b + i + 4, _mm_load_pd(a + i + 4));
        _mm_store_pd(b + i + 6, _mm_load_pd(a + i + 6));
    }
#else
    for (size_t i = 0; i < n; i++)
        b[i] = a[i];
#endif
}

static void triad_slice(double *restrict a, const double *restrict b, const double *restrict c,
                        double s, size_t n)
{
#if defined(__SSE2__)
    __m128d vs = _mm_set1_pd(s);
    for (size_t i = 0; i < n; i += 8) {
        __builtin_prefetch((const char *)(b + i) + PF_AHEAD, 0, 3);
        __builtin_prefetch((const char *)(c + i) + PF_AHEAD, 0, 3);
        for (size_t j = i; j < i + 8; j += 2)
            _mm_store_pd(a + j, _mm_add_pd(_mm_load_pd(b + j), _mm_mul_pd(vs, _mm_load_pd(c + j))));
    }
#else
    for (size_t i = 0; i < n; i++)
        a[i] = b[i] + s * c[i];
#endif
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Seconds per repetition -> GB/s statistics for `bytes` moved per repetition. */
static tdm_membw_stats stats_of(double *secs, int n, double bytes)
{
    qsort(secs, (size_t)n, sizeof(double), cmp_double);
    double med = n % 2 ? secs[n / 2] : 0.5 * (secs[n / 2 - 1] + secs[n / 2]);
    tdm_membw_stats s = {bytes / secs[n - 1] / 1e9, bytes / med / 1e9, bytes / secs[0] / 1e9};
    return s;
}

static tdm_status check_threads(int *threads, int ncores, tdm_error *err)
{
    if (*threads == 0)
        *threads = ncores;
    if (*threads < 0 || *threads > ncores)
        return tdm_error_set(err, TDM_ERR_INVALID,
                             "membw: threads = %d, this machine has %d physical cores", *threads,
                             ncores);
    return TDM_OK;
}

/* A probe's team: the topology, the thread count resolved against its
 * cores, and the caller's binding (the caller is the team's master, which
 * the probe pins; close_team, on the caller, puts it back). */
typedef struct probe_team {
    tdm_topology *topo;
    tdm_thread_binding *caller;
    int nt;
} probe_team;

static tdm_status open_team(probe_team *tm, int threads, tdm_error *err)
{
    tm->nt = threads;
    tdm_status st = tdm_topology_load(&tm->topo, err);
    if (st != TDM_OK)
        return st;
    st = check_threads(&tm->nt, tdm_topology_physical_cores(tm->topo), err);
    if (st != TDM_OK) {
        tdm_topology_free(tm->topo);
        return st;
    }
    tm->caller = tdm_topology_save_thread(tm->topo);
    return TDM_OK;
}

static void close_team(probe_team *tm)
{
    tdm_topology_restore_thread(tm->topo, tm->caller);
    tdm_topology_free(tm->topo);
}

tdm_status tdm_membw_run(const tdm_membw_opts *o, tdm_membw_result *out, tdm_error *err)
{
    if (o->bytes < MIB)
        return tdm_error_set(err, TDM_ERR_INVALID, "membw: bytes = %zu, need at least 1 MiB", o->bytes);
    if (o->repeats < 1)
        return tdm_error_set(err, TDM_ERR_INVALID, "membw: repeats = %d, need >= 1", o->repeats);
    probe_team tm;
    tdm_status st = open_team(&tm, o->threads, err);
    if (st != TDM_OK)
        return st;
    const int nt = tm.nt;
    /* three arrays of n doubles; n a multiple of 8 per thread */
    size_t n = o->bytes / 3 / sizeof(double) / (8 * (size_t)nt) * 8 * (size_t)nt;
    size_t abytes = n * sizeof(double);
    double *a = big_alloc(abytes), *b = big_alloc(abytes), *cc = big_alloc(abytes);
    double *secs = malloc(sizeof(double) * TDM_MEMBW_KIND_COUNT * (size_t)o->repeats);
    if (!a || !b || !cc || !secs) {
        big_free(a, abytes), big_free(b, abytes), big_free(cc, abytes), free(secs);
        close_team(&tm);
        return tdm_error_set(err, TDM_ERR_OOM, "membw: cannot allocate 3 x %zu bytes", abytes);
    }
    uint64_t sink = 0;
#pragma omp parallel num_threads(nt) reduction(^ : sink)
    {
        int t = omp_get_thread_num();
        tdm_topology_bind_thread(tm.topo, t, NULL); /* best effort */
        size_t lo, hi;
        slice(n, t, nt, 8, &lo, &hi);
        for (size_t i = lo; i < hi; i++) { /* first touch by the thread that streams it */
            a[i] = 1.0;
            b[i] = 2.0;
            cc[i] = 0.5;
        }
        for (int rep = -1; rep < o->repeats; rep++) {
            for (int k = 0; k < TDM_MEMBW_KIND_COUNT; k++) {
                double t0 = 0.0;
#pragma omp barrier
#pragma omp master
                t0 = omp_get_wtime();
                if (k == TDM_MEMBW_READ) {
                    sink ^= read_slice(a + lo, hi - lo) ^ read_slice(b + lo, hi - lo) ^
                            read_slice(cc + lo, hi - lo);
                } else if (k == TDM_MEMBW_COPY) {
                    copy_slice(b + lo, a + lo, hi - lo);
                } else {
                    triad_slice(a + lo, b + lo, cc + lo, 0.5, hi - lo);
                }
#pragma omp barrier
#pragma omp master
                if (rep >= 0)
                    secs[k * o->repeats + rep] = omp_get_wtime() - t0;
            }
        }
    }
    const double moved[TDM_MEMBW_KIND_COUNT] = {3.0 * (double)abytes, 2.0 * (double)abytes,
                                                3.0 * (double)abytes};
    out->threads = nt;
    out->bytes = 3 * abytes;
    out->repeats = o->repeats;
    out->has_matvec = 0;
    for (int k = 0; k < TDM_MEMBW_KIND_COUNT; k++)
        out->kind[k] = stats_of(secs + k * o->repeats, o->repeats, moved[k]);
    if (sink == 42) /* keeps the read loop's result alive */
        tdm_log(TDM_LOG_DEBUG, "membw: sink %llu", (unsigned long long)sink);
    big_free(a, abytes), big_free(b, abytes), big_free(cc, abytes), free(secs);
    close_team(&tm);
    return TDM_OK;
}

/* ---- an existing region ------------------------------------------------- */

#define REGION_PIECES 64

tdm_status tdm_membw_read_region(const void *base, size_t region_bytes, size_t bytes, int threads, int repeats,
                                 tdm_membw_stats *out, tdm_error *err)
{
    if (!base || (uintptr_t)base % 64)
        return tdm_error_set(err, TDM_ERR_INVALID, "membw region: base %p is not 64-byte aligned", base);
    if (repeats < 1)
        return tdm_error_set(err, TDM_ERR_INVALID, "membw region: repeats = %d, need >= 1", repeats);
    probe_team tm;
    tdm_status st = open_team(&tm, threads, err);
    if (st != TDM_OK)
        return st;
    const int nt = tm.nt;
    if (bytes == 0 || bytes > region_bytes)
        bytes = region_bytes;
    /* REGION_PIECES pieces, evenly spaced, each a whole number of 64-byte
     * lines per thread */
    const size_t unit = 64 * (size_t)nt, piece = bytes / REGION_PIECES / unit * unit;
    const size_t gap = region_bytes / REGION_PIECES / 64 * 64;
    double *secs = piece ? malloc(sizeof(double) * (size_t)repeats) : NULL;
    if (!secs) {
        close_team(&tm);
        return piece ? tdm_error_set(err, TDM_ERR_OOM, "membw region: out of memory")
                     : tdm_error_set(err, TDM_ERR_INVALID,
                                     "membw region: %zu of %zu bytes is too little for %d pieces of %d threads",
                                     bytes, region_bytes, REGION_PIECES, nt);
    }
    uint64_t sink = 0;
#pragma omp parallel num_threads(nt) reduction(^ : sink)
    {
        int t = omp_get_thread_num();
        tdm_topology_bind_thread(tm.topo, t, NULL); /* best effort */
        size_t lo, hi; /* in doubles of each piece */
        slice(piece / sizeof(double), t, nt, 8, &lo, &hi);
        for (int rep = -1; rep < repeats; rep++) {
            double t0 = 0.0;
#pragma omp barrier
#pragma omp master
            t0 = omp_get_wtime();
            for (int p = 0; p < REGION_PIECES; p++)
                sink ^= read_slice((const double *)((const char *)base + (size_t)p * gap) + lo, hi - lo);
#pragma omp barrier
#pragma omp master
            if (rep >= 0)
                secs[rep] = omp_get_wtime() - t0;
        }
    }
    *out = stats_of(secs, repeats, (double)piece * REGION_PIECES);
    if (sink == 42) /* keeps the read loop's result alive */
        tdm_log(TDM_LOG_DEBUG, "membw: sink %llu", (unsigned long long)sink);
    free(secs);
    close_team(&tm);
    return TDM_OK;
}

/* ---- the engine's own kernel over expert-shaped weights ------------------ */

/* Bytes in [0x10, 0x3B]: every fp16 (and f32) field is then a positive
 * normal number below 1, so no NaN/denormal slows the float part. */
static void fill_weights(uint8_t *p, size_t n, uint64_t seed)
{
    uint64_t s = seed | 1;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        p[i] = (uint8_t)(0x10 + (s >> 32) % 44);
    }
}

tdm_status tdm_membw_matvec(const tdm_membw_matvec_opts *o, tdm_membw_stats *out, tdm_error *err)
{
    const tdm_qtype_info *q = tdm_qtype_get((uint32_t)o->type);
    if (!q || !tdm_act_row_bytes(o->type, q->block))
        return tdm_error_set(err, TDM_ERR_INVALID, "membw matvec: no CPU kernel for type %s",
                             tdm_qtype_name((uint32_t)o->type));
    if (o->rows < 1 || o->cols < 1 || o->cols % q->block)
        return tdm_error_set(err, TDM_ERR_INVALID,
                             "membw matvec: %lld x %lld is not a valid %s matrix (cols %% %u)",
                             (long long)o->rows, (long long)o->cols, q->name, q->block);
    if (o->repeats < 1)
        return tdm_error_set(err, TDM_ERR_INVALID, "membw matvec: repeats = %d", o->repeats);
    probe_team tm;
    tdm_status st = open_team(&tm, o->threads, err);
    if (st != TDM_OK)
        return st;
    const int nt = tm.nt;
    size_t row_bytes = tdm_qtype_row_bytes(o->type, o->cols), mat_bytes = row_bytes * (size_t)o->rows;
    size_t nmat = o->bytes / mat_bytes > 0 ? o->bytes / mat_bytes : 1, total = nmat * mat_bytes;
    uint8_t *w = big_alloc(total);
    size_t act_bytes = tdm_act_row_bytes(o->type, o->cols);
    void *xq = aligned_alloc(64, (act_bytes + 63) / 64 * 64);
    float *x = malloc((size_t)o->cols * sizeof(float)), *y = malloc((size_t)o->rows * sizeof(float));
    double *secs = malloc(sizeof(double) * (size_t)o->repeats);
    if (!w || !xq || !x || !y || !secs) {
        big_free(w, total), free(xq), free(x), free(y), free(secs);
        close_team(&tm);
        return tdm_error_set(err, TDM_ERR_OOM, "membw matvec: cannot allocate %zu bytes", total);
    }
    for (int64_t i = 0; i < o->cols; i++)
        x[i] = (float)sin(0.1 * (double)i);
    tdm_act_quantize(o->type, x, xq, o->cols);
#pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num();
        tdm_topology_bind_thread(tm.topo, t, NULL); /* best effort */
        size_t r0, r1;
        slice((size_t)o->rows, t, nt, 1, &r0, &r1);
        for (size_t m = 0; m < nmat; m++)
            fill_weights(w + m * mat_bytes + r0 * row_bytes, (r1 - r0) * row_bytes, m * 131 + (size_t)t);
        for (int rep = -1; rep < o->repeats; rep++) {
            double t0 = 0.0;
#pragma omp barrier
#pragma omp master
            t0 = omp_get_wtime();
            for (size_t m = 0; m < nmat; m++)
                tdm_matmul_rows(o->type, o->cols, w + m * mat_bytes, row_bytes, (int64_t)r0,
                                (int64_t)r1, xq, act_bytes, 1, y, (size_t)o->rows);
#pragma omp barrier
#pragma omp master
            if (rep >= 0)
                secs[rep] = omp_get_wtime() - t0;
        }
    }
    *out = stats_of(secs, o->repeats, (double)total);
    big_free(w, total), free(xq), free(x), free(y), free(secs);
    close_team(&tm);
    return TDM_OK;
}

/* ---- JSON ----------------------------------------------------------------- */

cJSON *tdm_membw_stats_json(const tdm_membw_stats *s)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "min", s->min_gbs);
    cJSON_AddNumberToObject(o, "median", s->median_gbs);
    cJSON_AddNumberToObject(o, "max", s->max_gbs);
    return o;
}

tdm_status tdm_membw_write_json(const char *path, const tdm_membw_result *results, int n,
                                tdm_error *err)
{
    char host[256] = "unknown";
    gethostname(host, sizeof host - 1);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "host", host);
    cJSON_AddStringToObject(root, "units", "GB/s");
    cJSON_AddNumberToObject(root, "bytes", n > 0 ? (double)results[0].bytes : 0.0);
    cJSON_AddNumberToObject(root, "repeats", n > 0 ? results[0].repeats : 0);
    cJSON *arr = cJSON_AddArrayToObject(root, "results");
    for (int i = 0; i < n; i++) {
        cJSON *r = cJSON_CreateObject();
        cJSON_AddNumberToObject(r, "threads", results[i].threads);
        for (int k = 0; k < TDM_MEMBW_KIND_COUNT; k++)
            cJSON_AddItemToObject(r, tdm_membw_kind_name((tdm_membw_kind)k),
                                  tdm_membw_stats_json(&results[i].kind[k]));
        if (results[i].has_matvec) {
            cJSON *m = tdm_membw_stats_json(&results[i].matvec);
            cJSON_AddStringToObject(m, "type", tdm_qtype_name((uint32_t)results[i].matvec_type));
            cJSON_AddItemToObject(r, "matvec", m);
        }
        cJSON_AddItemToArray(arr, r);
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    FILE *f = text ? fopen(path, "w") : NULL;
    if (!f) {
        free(text);
        return tdm_error_set(err, TDM_ERR_IO, "membw: cannot write %s", path);
    }
    int ok = fputs(text, f) >= 0 && fputc('\n', f) != EOF;
    ok = (fclose(f) == 0) && ok;
    free(text);
    return ok ? TDM_OK : tdm_error_set(err, TDM_ERR_IO, "membw: write to %s failed", path);
}
