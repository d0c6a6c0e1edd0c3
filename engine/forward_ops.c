/* forward_ops: the primitive operations of the CPU forward (see forward.h). */
#include <math.h>
#include <string.h>

#include "forward.h"

void tdm_op_rmsnorm(const float *x, const float *w, float *y, int64_t n, float eps)
{
    double ss = 0;
    for (int64_t i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    const float r = (float)(1.0 / sqrt(ss / (double)n + eps));
    for (int64_t i = 0; i < n; i++)
        y[i] = w[i] * (x[i] * r);
}

void tdm_op_rope_neox(float *x, int32_t n_rot, int64_t pos, double base)
{
    const int32_t h = n_rot / 2;
    for (int32_t i = 0; i < h; i++) {
        const double theta = (double)pos * pow(base, -2.0 * i / n_rot);
        const double c = cos(theta), s = sin(theta);
        const double a = x[i], b = x[i + h];
        x[i] = (float)(a * c - b * s);
        x[i + h] = (float)(b * c + a * s);
    }
}

static inline float dotf(const float *a, const float *b, int64_t n)
{
    float s = 0;
    for (int64_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

void tdm_op_attend(const float *q, const float *k, const float *v, size_t kv_stride, int32_t n_kv, int32_t hd,
                   float scale, float *scores, float *out)
{
    float mx = -INFINITY;
    for (int32_t j = 0; j < n_kv; j++) {
        scores[j] = dotf(q, k + (size_t)j * kv_stride, hd) * scale;
        if (scores[j] > mx)
            mx = scores[j];
    }
    double sum = 0;
    for (int32_t j = 0; j < n_kv; j++) {
        scores[j] = expf(scores[j] - mx);
        sum += scores[j];
    }
    const float inv = (float)(1.0 / sum);
    memset(out, 0, (size_t)hd * sizeof(float));
    for (int32_t j = 0; j < n_kv; j++) {
        const float p = scores[j] * inv;
        const float *vj = v + (size_t)j * kv_stride;
        for (int32_t i = 0; i < hd; i++)
            out[i] += p * vj[i];
    }
}

static inline float silu(float v)
{
    return v / (1.0f + expf(-v));
}

#define CONV_MAX_K 16

/* Channel c of tdm_op_conv_silu. */
static void conv_channel(const float *u, float *y, float *state, const float *w, int64_t n, int64_t dim, int32_t K,
                         int64_t c)
{
    float prev[CONV_MAX_K];
    const float *wc = w + c * K;
    for (int32_t i = 0; i < K - 1; i++)
        prev[i] = state[(size_t)i * dim + c];
    for (int64_t t = 0; t < n; t++) {
        const float cur = u[t * dim + c];
        float acc = wc[K - 1] * cur;
        for (int32_t i = 0; i < K - 1; i++)
            acc += wc[i] * prev[i];
        for (int32_t i = 0; i + 1 < K - 1; i++)
            prev[i] = prev[i + 1];
        if (K > 1)
            prev[K - 2] = cur;
        y[t * dim + c] = silu(acc);
    }
    for (int32_t i = 0; i < K - 1; i++)
        state[(size_t)i * dim + c] = prev[i];
}

void tdm_op_conv_silu(const float *u, float *y, float *state, const float *w, int64_t n, int64_t dim, int32_t K)
{
    if ((double)n * dim * K <= 32768.0) { /* small (a decode step): no parallel region, which libgomp allocates */
        for (int64_t c = 0; c < dim; c++)
            conv_channel(u, y, state, w, n, dim, K, c);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < dim; c++)
        conv_channel(u, y, state, w, n, dim, K, c);
}

void tdm_op_deltanet_recurrent(const float *q, const float *k, size_t qk_stride, const float *v, size_t v_stride,
                               const float *g, const float *beta, int64_t n, int32_t d_k, int32_t d_v, float *S,
                               float *o)
{
    for (int64_t t = 0; t < n; t++) {
        const float *qt = q + t * qk_stride, *kt = k + t * qk_stride, *vt = v + t * v_stride;
        float *ot = o + t * v_stride;
        const float eg = expf(g[t]), b = beta[t];
        /* ot first holds S^T k (before decay), then becomes the delta, then the output */
        memset(ot, 0, (size_t)d_v * sizeof(float));
        for (int32_t a = 0; a < d_k; a++) {
            const float ka = kt[a];
            const float *Sa = S + (size_t)a * d_v;
            for (int32_t j = 0; j < d_v; j++)
                ot[j] += Sa[j] * ka;
        }
        for (int32_t j = 0; j < d_v; j++)
            ot[j] = b * (vt[j] - eg * ot[j]);
        float acc[1024];
        memset(acc, 0, (size_t)d_v * sizeof(float));
        for (int32_t a = 0; a < d_k; a++) {
            const float ka = kt[a], qa = qt[a];
            float *Sa = S + (size_t)a * d_v;
            for (int32_t j = 0; j < d_v; j++) {
                Sa[j] = eg * Sa[j] + ka * ot[j];
                acc[j] += Sa[j] * qa;
            }
        }
        memcpy(ot, acc, (size_t)d_v * sizeof(float));
    }
}

size_t tdm_op_deltanet_ws_floats(int32_t d_k, int32_t d_v)
{
    const size_t C = TDM_DELTANET_CHUNK;
    return 2 * C + C * C + C * (size_t)d_v + C * (size_t)d_k;
}

/* One chunk of L <= C tokens; see forward.h and models.md §3.6.6. */
static void deltanet_chunk(const float *q, const float *k, size_t qk_stride, const float *v, size_t v_stride,
                           const float *g, const float *beta, int32_t L, int32_t d_k, int32_t d_v, float *S, float *o,
                           float *ws)
{
    const size_t C = TDM_DELTANET_CHUNK;
    float *G = ws;               /* [C] cumulative log-decay */
    float *eG = G + C;           /* [C] exp(G) */
    float *A = eG + C;           /* [C][C] strictly lower (k_beta . k) exp(G_t - G_s), later q.k */
    float *U = A + C * C;        /* [C][d_v] V' */
    float *KB = U + C * d_v;     /* [C][d_k] beta k */
    for (int32_t t = 0; t < L; t++) {
        G[t] = (t ? G[t - 1] : 0.0f) + g[t];
        eG[t] = expf(G[t]);
        const float *kt = k + t * qk_stride;
        for (int32_t a = 0; a < d_k; a++)
            KB[(size_t)t * d_k + a] = beta[t] * kt[a];
    }
    for (int32_t t = 0; t < L; t++)
        for (int32_t s = 0; s < t; s++)
            A[(size_t)t * C + s] = dotf(KB + (size_t)t * d_k, k + s * qk_stride, d_k) * expf(G[t] - G[s]);
    /* V' = U - W S with U = T beta v, W = T (KB exp(G)), T = (I + A)^-1, i.e.
     * (I + A) V' = beta v - exp(G) KB S: one forward substitution */
    for (int32_t t = 0; t < L; t++) {
        float *Vt = U + (size_t)t * d_v;
        const float *vt = v + t * v_stride, *kbt = KB + (size_t)t * d_k;
        memset(Vt, 0, (size_t)d_v * sizeof(float));
        for (int32_t a = 0; a < d_k; a++) {
            const float ka = kbt[a];
            const float *Sa = S + (size_t)a * d_v;
            for (int32_t j = 0; j < d_v; j++)
                Vt[j] += ka * Sa[j];
        }
        for (int32_t j = 0; j < d_v; j++)
            Vt[j] = beta[t] * vt[j] - eG[t] * Vt[j];
        for (int32_t s = 0; s < t; s++) {
            const float c = A[(size_t)t * C + s];
            const float *Vs = U + (size_t)s * d_v;
            for (int32_t j = 0; j < d_v; j++)
                Vt[j] -= c * Vs[j];
        }
    }
    /* O_t = exp(G_t) q_t S + sum_{s<=t} (q_t . k_s) exp(G_t - G_s) V'_s (uses the old S) */
    for (int32_t t = 0; t < L; t++) {
        const float *qt = q + t * qk_stride;
        float *ot = o + t * v_stride;
        memset(ot, 0, (size_t)d_v * sizeof(float));
        for (int32_t a = 0; a < d_k; a++) {
            const float qa = qt[a] * eG[t];
            const float *Sa = S + (size_t)a * d_v;
            for (int32_t j = 0; j < d_v; j++)
                ot[j] += qa * Sa[j];
        }
        for (int32_t s = 0; s <= t; s++) {
            const float c = dotf(qt, k + s * qk_stride, d_k) * expf(G[t] - G[s]);
            const float *Vs = U + (size_t)s * d_v;
            for (int32_t j = 0; j < d_v; j++)
                ot[j] += c * Vs[j];
        }
    }
    /* S = exp(G_last) S + sum_t (k_t exp(G_last - G_t)) V'_t^T */
    const float gl = G[L - 1], egl = eG[L - 1];
    for (int32_t t = 0; t < L; t++)
        A[t] = expf(gl - G[t]);
    for (int32_t a = 0; a < d_k; a++) {
        float *Sa = S + (size_t)a * d_v;
        for (int32_t j = 0; j < d_v; j++)
            Sa[j] *= egl;
        for (int32_t t = 0; t < L; t++) {
            const float c = k[t * qk_stride + a] * A[t];
            const float *Vt = U + (size_t)t * d_v;
            for (int32_t j = 0; j < d_v; j++)
                Sa[j] += c * Vt[j];
        }
    }
}

void tdm_op_deltanet_chunked(const float *q, const float *k, size_t qk_stride, const float *v, size_t v_stride,
                             const float *g, const float *beta, int64_t n, int32_t d_k, int32_t d_v, float *S,
                             float *o, float *ws)
{
    for (int64_t c0 = 0; c0 < n; c0 += TDM_DELTANET_CHUNK) {
        int32_t L = (int32_t)(n - c0 < TDM_DELTANET_CHUNK ? n - c0 : TDM_DELTANET_CHUNK);
        deltanet_chunk(q + c0 * qk_stride, k + c0 * qk_stride, qk_stride, v + c0 * v_stride, v_stride, g + c0,
                       beta + c0, L, d_k, d_v, S, o + c0 * v_stride, ws);
    }
}

void tdm_op_router_topk(const float *logits, int32_t n_expert, int32_t k, bool norm, int32_t *ids, float *weights)
{
    double mx = -INFINITY, sum = 0;
    for (int32_t e = 0; e < n_expert; e++)
        if (logits[e] > mx)
            mx = logits[e];
    for (int32_t e = 0; e < n_expert; e++)
        sum += exp((double)logits[e] - mx);
    double wsum = 0, wv[64];
    for (int32_t i = 0; i < k; i++) {
        int32_t best = -1;
        for (int32_t e = 0; e < n_expert; e++) {
            bool taken = false;
            for (int32_t j = 0; j < i; j++)
                taken |= ids[j] == e;
            if (!taken && (best < 0 || logits[e] > logits[best]))
                best = e;
        }
        ids[i] = best;
        wv[i] = exp((double)logits[best] - mx) / sum;
        wsum += wv[i];
    }
    for (int32_t i = 0; i < k; i++)
        weights[i] = (float)(norm ? wv[i] / wsum : wv[i]);
}
