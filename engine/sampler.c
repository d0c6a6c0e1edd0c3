/* sampler: penalties -> greedy | top-k -> top-p -> min-p -> temperature -> draw.
 * All work buffers are [n_vocab], allocated in tdm_sampler_new(). Candidates
 * are only sorted as far as a filter needs: top-k and top-p select the
 * largest m with a quickselect and sort just those. */
#include "sampler.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* top-p over many candidates: bucket by distance to the best logit, so only
 * the bucket where the cumulative mass crosses top_p needs sorting. */
#define TOPP_BUCKETS 4096
#define TOPP_RANGE 64.0f /* logits further below the best share the last bucket */
#define TOPP_COPIES 4     /* neighbours mostly share a bucket: separate sums break the chain through memory */
#define TOPK_HEAP_MAX 4096 /* top-k up to this size: one streaming pass with a heap */
#define BLOCK 64               /* scans go by blocks of this many (block_max, weights) */
#define BLOCK_LANES 8          /* independent lanes inside a block */

struct tdm_sampler {
    tdm_sampler_params p;
    int32_t n_vocab;
    uint64_t rng[4];  /* xoshiro256** state */
    float *work;      /* [n_vocab] penalised logits */
    int32_t *cand;    /* [n_vocab] candidate ids, best first once sorted */
    int32_t *count;   /* [n_vocab] occurrences in the penalty window */
    uint32_t *stamp;  /* [n_vocab] last penalty pass that touched the id */
    uint32_t gen;
    int32_t *ring;    /* [penalty_last_n] accepted tokens, oldest at ring_pos when full */
    int32_t ring_n, ring_pos;
    float *wexp;      /* [n_vocab] exp weight of each candidate position */
    float *bsum;      /* [n_vocab / BLOCK + 1] their sums by blocks of BLOCK positions */
    uint16_t *bkt;    /* [n_vocab] top-p bucket of each candidate position */
    double bmass[TOPP_COPIES][TOPP_BUCKETS]; /* probability mass per top-p bucket, in copies by i % TOPP_COPIES */
};

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_next(uint64_t s[4])
{
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

/* uniform in [0, 1) with 53 random bits */
static double rng_uniform(uint64_t s[4]) { return (double)(rng_next(s) >> 11) * 0x1.0p-53; }

tdm_sampler_params tdm_sampler_default_params(void)
{
    return (tdm_sampler_params){.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f,
                                .repeat_penalty = 1.0f, .frequency_penalty = 0.0f,
                                .presence_penalty = 0.0f, .penalty_last_n = 64, .seed = 0x7A4D5EEDu};
}

static tdm_status check_params(const tdm_sampler_params *p, tdm_error *err)
{
    if (isnan(p->temperature) || isnan(p->top_p) || isnan(p->min_p) || isnan(p->frequency_penalty) ||
        isnan(p->presence_penalty) || isnan(p->repeat_penalty))
        return tdm_error_set(err, TDM_ERR_INVALID, "sampler: a parameter is NaN");
    if (p->top_p <= 0)
        return tdm_error_set(err, TDM_ERR_INVALID, "sampler: top_p = %g (want > 0)", p->top_p);
    if (p->min_p < 0 || p->min_p > 1)
        return tdm_error_set(err, TDM_ERR_INVALID, "sampler: min_p = %g (want 0..1)", p->min_p);
    if (p->repeat_penalty <= 0)
        return tdm_error_set(err, TDM_ERR_INVALID, "sampler: repeat_penalty = %g (want > 0)", p->repeat_penalty);
    if (p->penalty_last_n < 0)
        return tdm_error_set(err, TDM_ERR_INVALID, "sampler: penalty_last_n = %d (want >= 0)", p->penalty_last_n);
    return TDM_OK;
}

tdm_status tdm_sampler_new(int32_t n_vocab, const tdm_sampler_params *p, tdm_sampler **out, tdm_error *err)
{
    *out = NULL;
    if (n_vocab < 1)
        return tdm_error_set(err, TDM_ERR_INVALID, "sampler: n_vocab = %d", n_vocab);
    tdm_sampler_params def = tdm_sampler_default_params();
    if (!p)
        p = &def;
    tdm_status st = check_params(p, err);
    if (st)
        return st;
    tdm_sampler *s = calloc(1, sizeof *s);
    if (!s)
        return tdm_error_set(err, TDM_ERR_OOM, "sampler: state");
    s->p = *p;
    s->n_vocab = n_vocab;
    size_t n = (size_t)n_vocab;
    s->work = malloc(n * sizeof *s->work);
    s->cand = malloc(n * sizeof *s->cand);
    s->count = calloc(n, sizeof *s->count);
    s->stamp = calloc(n, sizeof *s->stamp);
    s->ring = malloc(((size_t)p->penalty_last_n + 1) * sizeof *s->ring);
    s->wexp = malloc(n * sizeof *s->wexp);
    s->bsum = malloc((n / BLOCK + 1) * sizeof *s->bsum);
    s->bkt = malloc(n * sizeof *s->bkt);
    if (!s->work || !s->cand || !s->count || !s->stamp || !s->ring || !s->wexp || !s->bsum || !s->bkt) {
        tdm_sampler_free(s);
        return tdm_error_set(err, TDM_ERR_OOM, "sampler: buffers for %d tokens", n_vocab);
    }
    tdm_sampler_reset(s);
    *out = s;
    return TDM_OK;
}

void tdm_sampler_free(tdm_sampler *s)
{
    if (!s)
        return;
    free(s->work);
    free(s->cand);
    free(s->count);
    free(s->stamp);
    free(s->ring);
    free(s->wexp);
    free(s->bsum);
    free(s->bkt);
    free(s);
}

const tdm_sampler_params *tdm_sampler_params_get(const tdm_sampler *s) { return &s->p; }

void tdm_sampler_seed(tdm_sampler *s, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        s->rng[i] = splitmix64(&x);
}

void tdm_sampler_reset(tdm_sampler *s)
{
    memset(s->count, 0, (size_t)s->n_vocab * sizeof *s->count);
    s->ring_n = s->ring_pos = 0;
    tdm_sampler_seed(s, s->p.seed);
}

void tdm_sampler_accept(tdm_sampler *s, int32_t token)
{
    int32_t cap = s->p.penalty_last_n;
    if (cap == 0 || token < 0 || token >= s->n_vocab)
        return;
    if (s->ring_n == cap) {
        s->count[s->ring[s->ring_pos]]--;
        s->ring[s->ring_pos] = token;
        s->ring_pos = (s->ring_pos + 1) % cap;
    } else {
        s->ring[s->ring_n++] = token;
    }
    s->count[token]++;
}

static void apply_penalties(tdm_sampler *s)
{
    const tdm_sampler_params *p = &s->p;
    if (s->ring_n == 0 || (p->repeat_penalty == 1.0f && p->frequency_penalty == 0.0f && p->presence_penalty == 0.0f))
        return;
    if (++s->gen == 0) { /* wrapped: forget old stamps */
        memset(s->stamp, 0, (size_t)s->n_vocab * sizeof *s->stamp);
        s->gen = 1;
    }
    for (int32_t i = 0; i < s->ring_n; i++) {
        int32_t t = s->ring[i];
        if (s->stamp[t] == s->gen)
            continue;
        s->stamp[t] = s->gen;
        float l = s->work[t];
        l = l > 0 ? l / p->repeat_penalty : l * p->repeat_penalty;
        s->work[t] = l - (float)s->count[t] * p->frequency_penalty - p->presence_penalty;
    }
}

/* better(a, b): higher logit, then lower id (a total order, so results are deterministic) */
static inline int better(const float *w, int32_t a, int32_t b)
{
    return w[a] > w[b] || (w[a] == w[b] && a < b);
}

/* Moves the m best of c[0..n) to c[0..m) (any order). */
static void select_top(const float *w, int32_t *c, int32_t n, int32_t m)
{
    int32_t lo = 0, hi = n - 1;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2, pv = c[mid];
        int32_t i = lo, j = hi;
        while (i <= j) {
            while (better(w, c[i], pv))
                i++;
            while (better(w, pv, c[j]))
                j--;
            if (i <= j) {
                int32_t t = c[i];
                c[i++] = c[j];
                c[j--] = t;
            }
        }
        if (m - 1 <= j)
            hi = j;
        else if (m - 1 >= i)
            lo = i;
        else
            break;
    }
}

/* Heap sort of c[0..m) best first: in place (no allocation), O(m log m). */
static void sift_down(const float *w, int32_t *c, int32_t i, int32_t m)
{
    for (;;) {
        int32_t k = 2 * i + 1;
        if (k >= m)
            return;
        if (k + 1 < m && better(w, c[k], c[k + 1]))
            k++; /* the worse child: a min-heap by "better" puts the worst on top */
        if (!better(w, c[i], c[k]))
            return;
        int32_t t = c[i];
        c[i] = c[k];
        c[k] = t;
        i = k;
    }
}

/* Moves the m best of c[0..n) to c[0..m), sorted best first. */
static void sort_best(const float *w, int32_t *c, int32_t n, int32_t m)
{
    if (m < n)
        select_top(w, c, n, m);
    for (int32_t i = m / 2 - 1; i >= 0; i--)
        sift_down(w, c, i, m);
    for (int32_t end = m - 1; end > 0; end--) {
        int32_t t = c[0]; /* the worst goes to the back */
        c[0] = c[end];
        c[end] = t;
        sift_down(w, c, 0, end);
    }
}

/* Scans of the vocabulary go by blocks: a block's largest value through
 * BLOCK_LANES independent running maxima (a fixed-count loop the compiler
 * vectorises; NaN compares false and is never taken, -inf for none). One
 * compare-and-select chain over the whole vocabulary instead cost ~0.3 ms
 * per token at 248k logits (its latency, not the memory). BLOCK, BLOCK_LANES:
 * at the top. */

static inline float block_max(const float *x)
{
    float m[BLOCK_LANES];
    for (int j = 0; j < BLOCK_LANES; j++)
        m[j] = -INFINITY;
    for (int k = 0; k < BLOCK; k += BLOCK_LANES)
        for (int j = 0; j < BLOCK_LANES; j++)
            m[j] = x[k + j] > m[j] ? x[k + j] : m[j];
    float b = m[0];
    for (int j = 1; j < BLOCK_LANES; j++)
        b = m[j] > b ? m[j] : b;
    return b;
}

/* e^x for x <= 0, 0 below EXP_MIN (where expf is denormal or 0): x = n ln2
 * + r with |r| <= ln2 / 2 (ln2 in two parts, the first exact times any n
 * here), e^r by its Taylor series to r^7 (truncation < 1e-8 relative), times
 * 2^n built in the exponent bits. Only float arithmetic, compares and bit
 * operations, so a fixed-count loop over it vectorises, where expf calls do
 * not (sampling with a temperature alone over 248k logits: 1.9-2.1 ms per
 * token on the development VM with expf, 1.0 with this). Within 1.2 ulp of
 * exp over [-87, 0] (test_sampler test_exp_neg). */
#define EXP_MIN -87.0f

static inline float exp_neg(float x)
{
    /* selects by masks, not ?: (which -O2 does not if-convert here): every
     * operation runs for every lane */
    const int32_t low = -(int32_t)(x < EXP_MIN); /* all ones below EXP_MIN (-inf too) */
    union { float f; int32_t i; } xc = {.f = x}, lo = {.f = EXP_MIN};
    xc.i = (xc.i & ~low) | (lo.i & low);
    const float t = xc.f * 1.44269504f + 12582912.0f; /* 1.5 * 2^23: n = round(x / ln2) in the low bits */
    const float n = t - 12582912.0f;
    const float r = xc.f - n * 0.693359375f + n * 2.12194440e-4f;
    float q = 1.0f / 5040;
    q = q * r + 1.0f / 720;
    q = q * r + 1.0f / 120;
    q = q * r + 1.0f / 24;
    q = q * r + 1.0f / 6;
    q = q * r + 0.5f;
    q = q * r + 1.0f;
    q = q * r + 1.0f;
    union { int32_t i; float f; } scale = {.i = ((int32_t)n + 127) << 23}, e;
    e.f = q * scale.f;
    e.i &= ~low;
    return e.f;
}

float tdm_sampler_exp_neg(float x) { return exp_neg(x); }

/* wexp[i] = exp_neg((w[c[i]] - base) * inv_t) for i < n and bsum[b] the sum
 * of block b (positions b * BLOCK ..); returns the sum of the blocks. */
static double weights(const float *restrict w, const int32_t *restrict c, int32_t n, float base, float inv_t,
                      float *restrict wexp, float *restrict bsum)
{
    double z = 0;
    int32_t i0 = 0;
    for (; i0 + BLOCK <= n; i0 += BLOCK) {
        float *e = wexp + i0, lane[BLOCK_LANES] = {0};
        for (int j = 0; j < BLOCK; j++)
            e[j] = exp_neg((w[c[i0 + j]] - base) * inv_t);
        for (int k = 0; k < BLOCK; k += BLOCK_LANES) /* independent sums: no reassociation needed */
            for (int j = 0; j < BLOCK_LANES; j++)
                lane[j] += e[k + j];
        float t = 0;
        for (int j = 0; j < BLOCK_LANES; j++)
            t += lane[j];
        bsum[i0 / BLOCK] = t;
        z += t;
    }
    if (i0 < n) {
        float t = 0;
        for (int32_t i = i0; i < n; i++) {
            wexp[i] = exp_neg((w[c[i]] - base) * inv_t);
            t += wexp[i];
        }
        bsum[i0 / BLOCK] = t;
        z += t;
    }
    return z;
}

/* A draw from candidates c[0..m) with weights wexp / bsum (weights()) of
 * total z: the block where u * z falls by the block sums, then the element
 * inside it; a u that rounding carries past the block's elements takes its
 * last one of positive weight. */
static int32_t draw(const tdm_sampler *s, const int32_t *c, int32_t m, double z, double u)
{
    const int32_t nb = (m + BLOCK - 1) / BLOCK;
    double cum = 0, x = u * z;
    int32_t b = 0;
    for (; b < nb - 1 && cum + s->bsum[b] <= x; b++)
        cum += s->bsum[b];
    const int32_t i0 = b * BLOCK, i1 = m - i0 < BLOCK ? m : i0 + BLOCK;
    for (int32_t i = i0; i < i1; i++) {
        cum += s->wexp[i];
        if (x < cum)
            return c[i];
    }
    for (int32_t i = i1; i-- > i0;)
        if (s->wexp[i] > 0)
            return c[i];
    return c[m - 1];
}

/* A logit as the sampler counts it: NaN is -inf. */
static inline float sane(float v) { return v == v ? v : -INFINITY; }

/* sane() over one block (the work buffer's copy of the logits): a fixed
 * count, branch-free and unaliased, so that -O2 vectorises it (one loop over
 * the whole vocabulary it did not: 0.25 ms per token at 248k). */
static inline void sanitize_block(const float *restrict src, float *restrict dst)
{
    for (int j = 0; j < BLOCK; j++)
        dst[j] = sane(src[j]);
}

/* The valid (> -inf) ids with, when 0 < k <= TOPK_HEAP_MAX, only the k
 * best kept: one streaming pass over a min-heap of the best seen so far.
 * Once the heap is full, a block whose largest does not beat the heap's
 * worst is skipped whole (ids come in order, so an equal one never would). */
static int32_t gather(const float *w, int32_t n, int32_t k, int32_t *c)
{
    int32_t m = 0;
    bool heap = k > 0 && k <= TOPK_HEAP_MAX;
    if (!heap) { /* every valid id: a branch-free compaction (the loop below branched on each) */
        for (int32_t i = 0; i < n; i++) {
            c[m] = i;
            m += w[i] > -INFINITY;
        }
        if (k > 0 && k < m) {
            select_top(w, c, m, k);
            m = k;
        }
        return m;
    }
    float worst = -INFINITY; /* w of the heap's root once full: most ids fail one compare */
    for (int32_t i0 = 0; i0 < n; i0 += BLOCK) {
        const int32_t i1 = n - i0 < BLOCK ? n : i0 + BLOCK;
        if (heap && m == k && i1 - i0 == BLOCK && !(block_max(w + i0) > worst))
            continue;
        for (int32_t i = i0; i < i1; i++) {
            if (!(w[i] > worst))
                continue;
            if (!heap || m < k) {
                c[m++] = i;
                if (heap && m == k) {
                    for (int32_t j = k / 2 - 1; j >= 0; j--)
                        sift_down(w, c, j, k);
                    worst = w[c[0]];
                }
            } else if (better(w, i, c[0])) {
                c[0] = i;
                sift_down(w, c, 0, k);
                worst = w[c[0]];
            }
        }
    }
    return m;
}

/* top-p: keep the shortest best-first prefix whose probability reaches top_p. */
static int32_t apply_top_p(tdm_sampler *s, int32_t *c, int32_t n, float top_p, float lmax)
{
    const float *w = s->work;
    double z = 0, cum = 0;
    if (n <= 1024) {
        sort_best(w, c, n, n);
        for (int32_t i = 0; i < n; i++)
            z += exp((double)w[c[i]] - lmax);
        for (int32_t i = 0; i < n; i++) {
            cum += exp((double)w[c[i]] - lmax);
            if (cum >= (double)top_p * z)
                return i + 1;
        }
        return n;
    }
    memset(s->bmass, 0, sizeof s->bmass);
    double *mass = s->bmass[0];
    const float scale = TOPP_BUCKETS / TOPP_RANGE;
    z = weights(w, c, n, lmax, 1.0f, s->wexp, s->bsum);
    for (int32_t i = 0; i < n; i++) {
        float d = lmax - w[c[i]];
        int b = d * scale < TOPP_BUCKETS - 1 ? (int)(d * scale) : TOPP_BUCKETS - 1;
        s->bkt[i] = (uint16_t)b;
        s->bmass[i % TOPP_COPIES][b] += s->wexp[i];
    }
    double target = (double)top_p * z;
    int b = 0;
    for (; b < TOPP_BUCKETS; b++) {
        for (int j = 1; j < TOPP_COPIES; j++)
            mass[b] += s->bmass[j][b];
        if (cum + mass[b] >= target)
            break;
        cum += mass[b];
    }
    if (b == TOPP_BUCKETS)
        return n; /* rounding: the whole mass did not reach target */
    /* partition: buckets before b (all kept, any order), then bucket b */
    int32_t k = 0, j = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int32_t i = k; i < n; i++) {
            if (pass == 0 ? s->bkt[i] < b : s->bkt[i] == b) {
                int32_t t = c[i];
                uint16_t tb = s->bkt[i];
                c[i] = c[k];
                s->bkt[i] = s->bkt[k];
                c[k] = t;
                s->bkt[k++] = tb;
            }
        }
        if (pass == 0)
            j = k;
    }
    sort_best(w, c + j, k - j, k - j);
    for (int32_t i = j; i < k; i++) {
        cum += exp_neg((w[c[i]] - lmax) * 1.0f); /* the same rounding as the bucket sums */
        if (cum >= target)
            return i + 1;
    }
    return k;
}

/* Argmax: the first block holding the overall largest, then its first
 * element equal to it; the tail one by one. */
int32_t tdm_sampler_argmax(const float *logits, int32_t n)
{
    float bv = -INFINITY;
    int32_t block = -1, i = 0;
    for (; i + BLOCK <= n; i += BLOCK) {
        const float b = block_max(logits + i);
        if (b > bv) { /* strictly: an equal block later does not move the choice */
            bv = b;
            block = i;
        }
    }
    int32_t best = 0;
    if (block >= 0)
        for (best = block; logits[best] != bv; best++)
            ;
    for (; i < n; i++)
        if (logits[i] > bv) {
            bv = logits[i];
            best = i;
        }
    return best;
}

bool tdm_sampler_greedy(const tdm_sampler *s)
{
    const tdm_sampler_params *p = &s->p;
    return p->temperature <= 0 && (p->penalty_last_n == 0 || (p->repeat_penalty == 1.0f &&
                                                             p->frequency_penalty == 0.0f &&
                                                             p->presence_penalty == 0.0f));
}

int32_t tdm_sampler_sample(tdm_sampler *s, const float *logits)
{
    const tdm_sampler_params *p = &s->p;
    int32_t n = s->n_vocab;
    float *w = s->work;
    int32_t i0 = 0;
    for (; i0 + BLOCK <= n; i0 += BLOCK)
        sanitize_block(logits + i0, w + i0);
    for (; i0 < n; i0++)
        w[i0] = sane(logits[i0]);
    apply_penalties(s);
    const int32_t best = tdm_sampler_argmax(w, n);
    if (p->temperature <= 0 || !(w[best] > -INFINITY))
        return best;
    float lmax = w[best];
    int32_t *c = s->cand;
    int32_t m = gather(w, n, p->top_k, c);
    if (p->top_p < 1.0f)
        m = apply_top_p(s, c, m, p->top_p, lmax);
    if (p->min_p > 0) { /* keep p_i >= min_p * p_max, i.e. l_i >= lmax + log(min_p) */
        float thr = lmax + logf(p->min_p);
        int32_t k = 0;
        for (int32_t i = 0; i < m; i++)
            if (w[c[i]] >= thr)
                c[k++] = c[i];
        m = k;
    }
    const double z = weights(w, c, m, lmax, 1.0f / p->temperature, s->wexp, s->bsum);
    return draw(s, c, m, z, rng_uniform(s->rng));
}
