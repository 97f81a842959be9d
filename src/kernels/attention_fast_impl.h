/* Body of the vectorised flash attention (attention_fast.c), compiled once per ISA: the includer
 * defines VW (f32 lanes per vector), KV_VECS (vectors of keys per tile, even), CV (2: the value
 * width is padded to a multiple of CV * VW), the
 * name suffix SFX, and wraps the include in a `#pragma GCC target`. GCC vector extensions keep
 * one source for AVX2 (8 lanes) and AVX-512 (16 lanes).
 *
 * One block of up to AF_BQ query rows of one (batch, head), keys in tiles of BK = KV_VECS * VW:
 *   S = Q K^T (f32 FMA, keys across the lanes, 4 query rows x 2 vectors in registers)
 *   S = S * scale + mask; online softmax per row: m_new = max(m, max S), corr = exp(m - m_new),
 *   P = exp(S - m_new), l = l corr + sum P, O = O corr + P V (4 rows x 2 vectors of O in registers)
 * then O / l. Only one BQ x BK tile of scores exists per thread at a time. exp is simd_impl.h's. */

#define AF_CAT2(a, b) a##_##b
#define AF_CAT(a, b) AF_CAT2(a, b)
#define AF_NAME(x) AF_CAT(x, SFX)

#include "kernels/simd_impl.h" /* VF, VI, vld, vst, vset1, vexp */
#define BK (KV_VECS * VW)

static float AF_NAME(hmax)(VF v) {
    float m = v[0];
    for (int i = 1; i < VW; i++) m = v[i] > m ? v[i] : m;
    return m;
}

/* Scratch per thread (floats): q [BQ][dp], o [BQ][dvp], s [BQ][BK], kt [d][BK], v [BK][dvp], row. */
static size_t AF_NAME(scratch_floats)(int64_t d, int64_t dv) {
    const int64_t dvp = (dv + VW * CV - 1) / (VW * CV) * (VW * CV);
    const int64_t rowmax = d > dvp ? d : dvp;
    return (size_t)(AF_BQ * d + AF_BQ * dvp + AF_BQ * BK + d * BK + BK * dvp + rowmax + 2 * AF_BQ) + 64;
}

static void AF_NAME(block)(const cdf_k_attention_args *x, int64_t bi, int64_t hi, int64_t q0, int64_t nq, float *mem) {
    const int64_t d = x->d, dv = x->dv;
    const int64_t dvp = (dv + VW * CV - 1) / (VW * CV) * (VW * CV);
    float *q = mem, *o = q + AF_BQ * d, *s = o + AF_BQ * dvp, *kt = s + AF_BQ * BK, *vt = kt + d * BK;
    float *row = vt + BK * dvp;
    const int64_t rowmax = d > dvp ? d : dvp;
    float *m = row + rowmax, *l = m + AF_BQ;
    const VF zero = {0};
    for (int64_t r = 0; r < nq; r++) {
        cdf_k_load_row(q + r * d, x->q, x->q_dt, bi * x->q_sb + hi * x->q_sh + (q0 + r) * x->q_sl, d);
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    /* rows past nq (a ragged last block) compute on zeros and are never stored */
    for (int64_t r = nq; r < AF_BQ; r++) {
        memset(q + r * d, 0, sizeof(float) * (size_t)d);
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    memset(o, 0, sizeof(float) * (size_t)(AF_BQ * dvp));
    const int64_t nrows = (nq + 3) & ~(int64_t)3;
    const bool mask_vec = x->mask && x->mask_dt == CDF_F32 && x->m_sk == 1;

    for (int64_t k0 = 0; k0 < x->lk; k0 += BK) {
        const int64_t nk = x->lk - k0 < BK ? x->lk - k0 : BK;
        /* K tile transposed (keys across the lanes), V tile padded to dvp; keys past nk are 0 */
        for (int64_t j = 0; j < nk; j++) {
            cdf_k_load_row(row, x->k, x->k_dt, bi * x->k_sb + hi * x->k_sh + (k0 + j) * x->k_sl, d);
            for (int64_t e = 0; e < d; e++) kt[e * BK + j] = row[e];
            float *vr = vt + j * dvp;
            cdf_k_load_row(vr, x->v, x->v_dt, bi * x->v_sb + hi * x->v_sh + (k0 + j) * x->v_sl, dv);
            for (int64_t e = dv; e < dvp; e++) vr[e] = 0.0f;
        }
        if (nk < BK) {
            for (int64_t e = 0; e < d; e++)
                for (int64_t j = nk; j < BK; j++) kt[e * BK + j] = 0.0f;
            memset(vt + nk * dvp, 0, sizeof(float) * (size_t)((BK - nk) * dvp));
        }

        /* S = Q K^T, 4 rows x 2 vectors of keys per register block (named accumulators, so the
         * compiler keeps all eight in registers) */
        for (int64_t r = 0; r < nrows; r += 4) {
            const float *q0p = q + r * d, *q1p = q0p + d, *q2p = q1p + d, *q3p = q2p + d;
            for (int c = 0; c < KV_VECS; c += 2) {
                VF a00 = zero, a01 = zero, a10 = zero, a11 = zero, a20 = zero, a21 = zero, a30 = zero, a31 = zero;
                const float *kp = kt + c * VW;
                for (int64_t e = 0; e < d; e++, kp += BK) {
                    const VF k0 = AF_NAME(vld)(kp), k1 = AF_NAME(vld)(kp + VW);
                    const VF b0 = AF_NAME(vset1)(q0p[e]), b1 = AF_NAME(vset1)(q1p[e]);
                    const VF b2 = AF_NAME(vset1)(q2p[e]), b3 = AF_NAME(vset1)(q3p[e]);
                    a00 += b0 * k0, a01 += b0 * k1, a10 += b1 * k0, a11 += b1 * k1;
                    a20 += b2 * k0, a21 += b2 * k1, a30 += b3 * k0, a31 += b3 * k1;
                }
                float *sp = s + r * BK + c * VW;
                AF_NAME(vst)(sp, a00), AF_NAME(vst)(sp + VW, a01);
                AF_NAME(vst)(sp + BK, a10), AF_NAME(vst)(sp + BK + VW, a11);
                AF_NAME(vst)(sp + 2 * BK, a20), AF_NAME(vst)(sp + 2 * BK + VW, a21);
                AF_NAME(vst)(sp + 3 * BK, a30), AF_NAME(vst)(sp + 3 * BK + VW, a31);
            }
        }

        /* online softmax per row; P overwrites S */
        const VF scale = AF_NAME(vset1)(x->scale);
        for (int64_t r = 0; r < nq; r++) {
            float *sr = s + r * BK;
            const int64_t moff = x->mask ? bi * x->m_sb + hi * x->m_sh + (q0 + r) * x->m_sq + k0 * x->m_sk : 0;
            VF vmax = AF_NAME(vset1)(-INFINITY);
            for (int c = 0; c < KV_VECS; c++) {
                VF sv = AF_NAME(vld)(sr + c * VW) * scale;
                if (x->mask) {
                    VF mv;
                    if (mask_vec && (c + 1) * VW <= nk) {
                        mv = AF_NAME(vld)((const float *)x->mask + moff + c * VW);
                    } else {
                        mv = zero;
                        for (int t = 0; t < VW && c * VW + t < nk; t++)
                            mv[t] = cdf_k_ld(x->mask, x->mask_dt, moff + (c * VW + t) * x->m_sk);
                    }
                    sv += mv;
                }
                if ((c + 1) * VW > nk) /* keys past the end do not exist */
                    for (int t = 0; t < VW; t++)
                        if (c * VW + t >= nk) sv[t] = -INFINITY;
                AF_NAME(vst)(sr + c * VW, sv);
                vmax = (VF)(((VI)vmax & (VI)(vmax >= sv)) | ((VI)sv & ~(VI)(vmax >= sv)));
            }
            const float tile_max = AF_NAME(hmax)(vmax);
            const float m_new = tile_max > m[r] ? tile_max : m[r];
            if (m_new == -INFINITY) { /* every key so far masked: P = 0, nothing to add */
                memset(sr, 0, sizeof(float) * BK);
                continue;
            }
            const float corr = expf(m[r] - m_new);
            VF vsum = zero;
            const VF mn = AF_NAME(vset1)(m_new);
            for (int c = 0; c < KV_VECS; c++) {
                VF p = AF_NAME(vexp)(AF_NAME(vld)(sr + c * VW) - mn);
                AF_NAME(vst)(sr + c * VW, p);
                vsum += p;
            }
            float sum = 0.0f;
            for (int t = 0; t < VW; t++) sum += vsum[t];
            l[r] = l[r] * corr + sum;
            m[r] = m_new;
            if (corr != 1.0f) {
                const VF cv = AF_NAME(vset1)(corr);
                float *orow = o + r * dvp;
                for (int64_t e = 0; e < dvp; e += VW) AF_NAME(vst)(orow + e, AF_NAME(vld)(orow + e) * cv);
            }
        }
        /* rows past nq: P = 0 (their S holds garbage of zero queries) */
        for (int64_t r = nq; r < nrows; r++) memset(s + r * BK, 0, sizeof(float) * BK);

        /* O += P V, 4 rows x 2 vectors of O per register block (named accumulators) */
        for (int64_t r = 0; r < nrows; r += 4) {
            const float *p0 = s + r * BK, *p1 = p0 + BK, *p2 = p1 + BK, *p3 = p2 + BK;
            for (int64_t e0 = 0; e0 < dvp; e0 += 2 * VW) {
                float *op = o + r * dvp + e0;
                VF a00 = AF_NAME(vld)(op), a01 = AF_NAME(vld)(op + VW);
                VF a10 = AF_NAME(vld)(op + dvp), a11 = AF_NAME(vld)(op + dvp + VW);
                VF a20 = AF_NAME(vld)(op + 2 * dvp), a21 = AF_NAME(vld)(op + 2 * dvp + VW);
                VF a30 = AF_NAME(vld)(op + 3 * dvp), a31 = AF_NAME(vld)(op + 3 * dvp + VW);
                const float *vp = vt + e0;
                for (int64_t j = 0; j < nk; j++, vp += dvp) {
                    const VF v0 = AF_NAME(vld)(vp), v1 = AF_NAME(vld)(vp + VW);
                    const VF b0 = AF_NAME(vset1)(p0[j]), b1 = AF_NAME(vset1)(p1[j]);
                    const VF b2 = AF_NAME(vset1)(p2[j]), b3 = AF_NAME(vset1)(p3[j]);
                    a00 += b0 * v0, a01 += b0 * v1, a10 += b1 * v0, a11 += b1 * v1;
                    a20 += b2 * v0, a21 += b2 * v1, a30 += b3 * v0, a31 += b3 * v1;
                }
                AF_NAME(vst)(op, a00), AF_NAME(vst)(op + VW, a01);
                AF_NAME(vst)(op + dvp, a10), AF_NAME(vst)(op + dvp + VW, a11);
                AF_NAME(vst)(op + 2 * dvp, a20), AF_NAME(vst)(op + 2 * dvp + VW, a21);
                AF_NAME(vst)(op + 3 * dvp, a30), AF_NAME(vst)(op + 3 * dvp + VW, a31);
            }
        }
    }
    for (int64_t r = 0; r < nq; r++) {
        float *orow = o + r * dvp;
        /* a fully masked row (l == 0) gives zeros, not 0/0 */
        const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
        for (int64_t e = 0; e < dv; e++) orow[e] *= inv;
        cdf_k_store_row(x->out, x->out_dt, ((bi * x->h + hi) * x->lq + q0 + r) * dv, orow, dv);
    }
}

#undef VF
#undef VI
#undef BK
#undef AF_NAME
#undef AF_CAT
#undef AF_CAT2
