/* Reference kernels: scaled dot-product attention (tiled, online softmax), rotary embedding and
 * the sinusoidal timestep embedding. */
#include <omp.h>
#include <string.h>

#include "kernels/reference_internal.h"

enum {
    ATT_TK = 64, /* keys per tile: the only scores that exist at a time */
    ATT_QB = 16, /* query rows that share one converted K/V tile */
};

typedef struct {
    float *kt, *v;   /* K tile transposed [d][ATT_TK] (scores vectorise over keys), V tile [ATT_TK][dv] */
    float *krow;     /* [d] one key row being converted */
    float *q, *acc;  /* [ATT_QB][d], [ATT_QB][dv] */
    float *s;        /* [ATT_TK] */
    float m[ATT_QB]; /* running max of the scores seen so far */
    float l[ATT_QB]; /* running sum of exp(score - m) */
} att_scratch;

static size_t att_scratch_floats(int64_t d, int64_t dv) {
    return (size_t)ATT_TK * (size_t)(d + dv) + (size_t)d + (size_t)ATT_QB * (size_t)(d + dv) + ATT_TK;
}

/* One block of up to ATT_QB query rows of one (batch, head). */
static void attention_block(const cdf_k_attention_args *x, int64_t bi, int64_t hi, int64_t q0, int64_t nq,
                            att_scratch *w) {
    const int64_t d = x->d, dv = x->dv;
    const bool round_p = cdf_k_attention_bf16_policy(x); /* P rounded to bf16 before P V (kernels.h) */
    for (int64_t r = 0; r < nq; r++) {
        cdf_k_load_row(w->q + r * d, x->q, x->q_dt, bi * x->q_sb + hi * x->q_sh + (q0 + r) * x->q_sl, d);
        for (int64_t j = 0; j < dv; j++) w->acc[r * dv + j] = 0.0f;
        w->m[r] = -INFINITY;
        w->l[r] = 0.0f;
    }
    for (int64_t k0 = 0; k0 < x->lk; k0 += ATT_TK) {
        const int64_t nk = x->lk - k0 < ATT_TK ? x->lk - k0 : ATT_TK;
        for (int64_t j = 0; j < nk; j++) {
            cdf_k_load_row(w->krow, x->k, x->k_dt, bi * x->k_sb + hi * x->k_sh + (k0 + j) * x->k_sl, d);
            for (int64_t e = 0; e < d; e++) w->kt[e * ATT_TK + j] = w->krow[e];
            cdf_k_load_row(w->v + j * dv, x->v, x->v_dt, bi * x->v_sb + hi * x->v_sh + (k0 + j) * x->v_sl, dv);
        }
        for (int64_t r = 0; r < nq; r++) {
            const float *q = w->q + r * d;
            /* dot products q . k_j for the whole tile, summed over e in order for every j */
            for (int64_t j = 0; j < nk; j++) w->s[j] = 0.0f;
            for (int64_t e = 0; e < d; e++) {
                const float qe = q[e], *kt = w->kt + e * ATT_TK;
                for (int64_t j = 0; j < nk; j++) w->s[j] += qe * kt[j];
            }
            float tile_max = -INFINITY;
            for (int64_t j = 0; j < nk; j++) {
                float s = w->s[j] * x->scale;
                if (x->mask)
                    s += cdf_k_ld(x->mask, x->mask_dt,
                                  bi * x->m_sb + hi * x->m_sh + (q0 + r) * x->m_sq + (k0 + j) * x->m_sk);
                if (round_p) s *= 1.44269504088896341f; /* log2 units */
                w->s[j] = s;
                if (s > tile_max) tile_max = s;
            }
            float m_new = tile_max > w->m[r] ? tile_max : w->m[r];
            if (m_new == -INFINITY) continue; /* every key so far is masked: nothing to add */
            /* rounding P: P = 2^(s - m) with m the max up to an integer (kernels.h) */
            if (round_p) m_new = ceilf(m_new);
            /* rescale what was accumulated under the old max (exp(-inf) = 0 on the first live tile) */
            const float corr = round_p ? exp2f(w->m[r] - m_new) : expf(w->m[r] - m_new);
            float *acc = w->acc + r * dv;
            float l = w->l[r] * corr;
            for (int64_t e = 0; e < dv; e++) acc[e] *= corr;
            for (int64_t j = 0; j < nk; j++) {
                const float p = round_p ? exp2f(w->s[j] - m_new) : expf(w->s[j] - m_new);
                if (p == 0.0f) continue;
                l += p; /* the row sum from the f32 weights, as PyTorch's CPU flash attention */
                const float pv = round_p ? cdf_bf16_to_f32(cdf_f32_to_bf16(p)) : p;
                const float *v = w->v + j * dv;
                for (int64_t e = 0; e < dv; e++) acc[e] += pv * v[e];
            }
            w->l[r] = l;
            w->m[r] = m_new;
        }
    }
    for (int64_t r = 0; r < nq; r++) {
        float *acc = w->acc + r * dv;
        /* a fully masked row (l == 0) gives zeros, not 0/0 */
        const float inv = w->l[r] > 0.0f ? 1.0f / w->l[r] : 0.0f;
        for (int64_t e = 0; e < dv; e++) acc[e] *= inv;
        cdf_k_store_row(x->out, x->out_dt, ((bi * x->h + hi) * x->lq + q0 + r) * dv, acc, dv);
    }
}

cdf_status cdf_k_attention(const cdf_k_attention_args *x) {
    static const char *fn = "cdf_k_attention";
    CDF_K_CHECK_PTR(fn, "args", x);
    CDF_K_CHECK_FLOAT_DT(fn, "q", x->q_dt);
    CDF_K_CHECK_FLOAT_DT(fn, "k", x->k_dt);
    CDF_K_CHECK_FLOAT_DT(fn, "v", x->v_dt);
    CDF_K_CHECK_FLOAT_DT(fn, "out", x->out_dt);
    if (x->mask) CDF_K_CHECK_FLOAT_DT(fn, "mask", x->mask_dt);
    CDF_K_CHECK_NONNEG(fn, "b", x->b);
    CDF_K_CHECK_NONNEG(fn, "h", x->h);
    CDF_K_CHECK_NONNEG(fn, "lq", x->lq);
    CDF_K_CHECK_NONNEG(fn, "lk", x->lk);
    CDF_K_CHECK_NONNEG(fn, "d", x->d);
    CDF_K_CHECK_NONNEG(fn, "dv", x->dv);
    if (x->b == 0 || x->h == 0 || x->lq == 0 || x->dv == 0) return CDF_OK;
    CDF_K_CHECK_PTR(fn, "out", x->out);
    CDF_K_CHECK_PTR(fn, "q", x->q);
    if (x->lk > 0) {
        CDF_K_CHECK_PTR(fn, "k", x->k);
        CDF_K_CHECK_PTR(fn, "v", x->v);
    }

    const int nthr = omp_get_max_threads() > 0 ? omp_get_max_threads() : 1;
    const size_t per = att_scratch_floats(x->d, x->dv);
    float *mem = malloc(sizeof(float) * per * (size_t)nthr);
    if (!mem)
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "%s: cannot allocate tile buffers (d %lld, dv %lld)", fn,
                         (long long)x->d, (long long)x->dv);
    const int64_t qblocks = (x->lq + ATT_QB - 1) / ATT_QB;
    const double work = 2.0 * (double)x->b * (double)x->h * (double)x->lq * (double)x->lk * (double)(x->d + x->dv);
#pragma omp parallel if (work > CDF_K_PAR_MIN_WORK)
    {
        float *base = mem + per * (size_t)omp_get_thread_num();
        att_scratch w;
        w.kt = base;
        w.v = w.kt + ATT_TK * x->d;
        w.krow = w.v + ATT_TK * x->dv;
        w.q = w.krow + x->d;
        w.acc = w.q + ATT_QB * x->d;
        w.s = w.acc + ATT_QB * x->dv;
#pragma omp for schedule(dynamic, 1)
        for (int64_t u = 0; u < x->b * x->h * qblocks; u++) {
            const int64_t bh = u / qblocks, q0 = (u % qblocks) * ATT_QB;
            const int64_t nq = x->lq - q0 < ATT_QB ? x->lq - q0 : ATT_QB;
            attention_block(x, bh / x->h, bh % x->h, q0, nq, &w);
        }
    }
    free(mem);
    return CDF_OK;
}

/* ---- rotary embedding -------------------------------------------------------------------- */

cdf_status cdf_k_rope(void *out, cdf_dtype out_dt, const void *x, cdf_dtype x_dt, const float *cos_t,
                      const float *sin_t, int64_t b, int64_t h, int64_t l, int64_t d) {
    static const char *fn = "cdf_k_rope";
    CDF_K_CHECK_FLOAT_DT(fn, "out", out_dt);
    CDF_K_CHECK_FLOAT_DT(fn, "x", x_dt);
    CDF_K_CHECK_NONNEG(fn, "b", b);
    CDF_K_CHECK_NONNEG(fn, "h", h);
    CDF_K_CHECK_NONNEG(fn, "l", l);
    CDF_K_CHECK_NONNEG(fn, "d", d);
    if (d % 2) return cdf_error(CDF_ERR_INVALID_ARG, "%s: head dim %lld is odd (pairs are rotated)", fn, (long long)d);
    if (b == 0 || h == 0 || l == 0 || d == 0) return CDF_OK;
    CDF_K_CHECK_PTR(fn, "out", out);
    CDF_K_CHECK_PTR(fn, "x", x);
    CDF_K_CHECK_PTR(fn, "cos", cos_t);
    CDF_K_CHECK_PTR(fn, "sin", sin_t);
#pragma omp parallel for schedule(static) if (b * h * l * d > CDF_K_PAR_MIN_WORK)
    for (int64_t row = 0; row < b * h * l; row++) {
        const float *c = cos_t + (row % l) * d, *s = sin_t + (row % l) * d;
        const int64_t off = row * d;
        /* both elements of a pair are read before either is written: out may alias x */
        for (int64_t i = 0; i < d; i += 2) {
            const float x0 = cdf_k_ld(x, x_dt, off + i), x1 = cdf_k_ld(x, x_dt, off + i + 1);
            cdf_k_st(out, out_dt, off + i, x0 * c[i] - x1 * s[i]);
            cdf_k_st(out, out_dt, off + i + 1, x1 * c[i + 1] + x0 * s[i + 1]);
        }
    }
    return CDF_OK;
}

/* ---- sinusoidal timestep embedding --------------------------------------------------------- */

cdf_status cdf_k_timestep_embedding(float *out, const float *t, int64_t n, int64_t dim, bool flip_sin_to_cos,
                                    float downscale_freq_shift, float scale, float max_period) {
    static const char *fn = "cdf_k_timestep_embedding";
    CDF_K_CHECK_NONNEG(fn, "n", n);
    CDF_K_CHECK_NONNEG(fn, "dim", dim);
    if (n == 0 || dim == 0) return CDF_OK;
    CDF_K_CHECK_PTR(fn, "out", out);
    CDF_K_CHECK_PTR(fn, "t", t);
    const int64_t half = dim / 2;
    float *freqs = malloc(sizeof(float) * (size_t)(half > 0 ? half : 1));
    if (!freqs) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "%s: cannot allocate %lld frequencies", fn, (long long)half);
    /* diffusers builds the table in float32: exponent = f32(-ln(max_period)) * k, divided by the
     * f32 of (half - shift), then a float32 exp. Every step is rounded to f32 like torch does. */
    const float neg_log_period = (float)(-log((double)max_period));
    const float denom = (float)((double)half - (double)downscale_freq_shift);
    for (int64_t k = 0; k < half; k++) {
        float exponent = neg_log_period * (float)k;
        exponent = exponent / denom;
        freqs[k] = expf(exponent);
    }
    for (int64_t i = 0; i < n; i++) {
        float *row = out + i * dim;
        float *sin_part = row + (flip_sin_to_cos ? half : 0), *cos_part = row + (flip_sin_to_cos ? 0 : half);
        for (int64_t k = 0; k < half; k++) {
            const float arg = scale * (t[i] * freqs[k]); /* both products in f32 */
            /* sin/cos of the f32 argument evaluated in double and rounded once: matches torch's
             * float32 sin/cos to within 1 ulp without depending on libm's float versions */
            sin_part[k] = (float)sin((double)arg);
            cos_part[k] = (float)cos((double)arg);
        }
        if (dim % 2) row[dim - 1] = 0.0f;
    }
    free(freqs);
    return CDF_OK;
}
