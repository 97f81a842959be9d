/* Body of the vectorised flash attention (attention_fast.c), compiled once per ISA: the includer
 * defines VW (f32 lanes per vector), KV_VECS (vectors of keys per tile, even), CV (2: the value
 * width is padded to a multiple of CV * VW), the
 * name suffix SFX, and wraps the include in a `#pragma GCC target`; the body undefines them at its
 * end (and AF_DPBF16 / AF_AMX), ready for the next build. GCC vector extensions keep
 * one source for AVX2 (8 lanes) and AVX-512 (16 lanes).
 *
 * One work item = one (batch, head) and a chunk of up to AF_QC query rows. Keys are taken in spans
 * of up to AF_KS keys: a span's K is packed once, transposed into tiles of BK = KV_VECS * VW keys
 * (keys across the lanes), and its V padded to dvp, then every query block (AF_BQ rows) of the
 * chunk runs over the span's tiles — the packing (conversion from bf16, transposition) is paid
 * once per chunk, not once per query block. Per query block and key tile:
 *   S = Q' K^T (f32 FMA, 6 query rows x 2 vectors of keys in registers), with Q' = Q scale log2(e)
 *   prescaled at load, so S is in log2 units; + mask log2(e); online softmax per row:
 *   m_new = max(m, max S), corr = 2^(m - m_new), P = 2^(S - m_new) (simd_impl.h's vexp2),
 *   l = l corr + P (kept per lane, summed across the lanes once at the end),
 *   O = O corr + P V (6 rows x 2 vectors of O in registers)
 * then O / l. Only one BQ x BK tile of scores exists per thread at a time; memory per thread is
 * bounded by AF_QC and AF_KS, whatever the sequence lengths.
 *
 * The bf16 policy (q, k, v all bf16: kernels.h) changes two things in the f32 body: Q is not
 * prescaled (S = (Q K^T) scale log2(e), the products of bf16 values exact), and P is rounded to
 * bf16 in registers before P V; the row sums l take the f32 P. With AF_DPBF16 defined (the
 * AVX512-BF16 build, VW 16) the body is instead the bf16 one: Q, K^T and V stay bf16, packed in
 * pairs along the summed dimension (K^T tiles kt[t][e/2][BK][2], V vt[j/2][dvp][2]: key pairs),
 * and both products are vdpbf16ps (two bf16 products per f32 lane and instruction) on the same
 * 6 x 2 register blocks; the softmax is the same function, writing P as bf16 pairs. */

#define AF_CAT2(a, b) a##_##b
#define AF_CAT(a, b) AF_CAT2(a, b)
#define AF_NAME(x) AF_CAT(x, SFX)

#include "kernels/simd_impl.h" /* VF, VI, vld, vst, vset1, vhmax, vhsum, vexp2 */
#define BK (KV_VECS * VW)

/* The 6 x 2 register block of both products, on twelve named accumulators a00..a51 (named, so
 * the compiler keeps them in registers): a_r0 += s_r[i] x0, a_r1 += s_r[i] x1 for the six rows
 * r (one broadcast load per row), and loading / storing the block at p with a row stride. */
#define AF_RANK1_6X2(x0, x1, s0, s1, s2, s3, s4, s5, i)                                                            \
    do {                                                                                                       \
        VF b_ = AF_NAME(vset1)(s0[i]);                                                                         \
        a00 += b_ * x0, a01 += b_ * x1;                                                                        \
        b_ = AF_NAME(vset1)(s1[i]);                                                                            \
        a10 += b_ * x0, a11 += b_ * x1;                                                                        \
        b_ = AF_NAME(vset1)(s2[i]);                                                                            \
        a20 += b_ * x0, a21 += b_ * x1;                                                                        \
        b_ = AF_NAME(vset1)(s3[i]);                                                                            \
        a30 += b_ * x0, a31 += b_ * x1;                                                                        \
        b_ = AF_NAME(vset1)(s4[i]);                                                                            \
        a40 += b_ * x0, a41 += b_ * x1;                                                                        \
        b_ = AF_NAME(vset1)(s5[i]);                                                                            \
        a50 += b_ * x0, a51 += b_ * x1;                                                                        \
    } while (0)
#define AF_LOAD_6X2(p, ld)                                                                                         \
    VF a00 = AF_NAME(vld)(p), a01 = AF_NAME(vld)((p) + VW);                                                    \
    VF a10 = AF_NAME(vld)((p) + (ld)), a11 = AF_NAME(vld)((p) + (ld) + VW);                                    \
    VF a20 = AF_NAME(vld)((p) + 2 * (ld)), a21 = AF_NAME(vld)((p) + 2 * (ld) + VW);                            \
    VF a30 = AF_NAME(vld)((p) + 3 * (ld)), a31 = AF_NAME(vld)((p) + 3 * (ld) + VW);                            \
    VF a40 = AF_NAME(vld)((p) + 4 * (ld)), a41 = AF_NAME(vld)((p) + 4 * (ld) + VW);                            \
    VF a50 = AF_NAME(vld)((p) + 5 * (ld)), a51 = AF_NAME(vld)((p) + 5 * (ld) + VW)
#define AF_STORE_6X2(p, ld)                                                                                        \
    do {                                                                                                       \
        AF_NAME(vst)(p, a00), AF_NAME(vst)((p) + VW, a01);                                                     \
        AF_NAME(vst)((p) + (ld), a10), AF_NAME(vst)((p) + (ld) + VW, a11);                                     \
        AF_NAME(vst)((p) + 2 * (ld), a20), AF_NAME(vst)((p) + 2 * (ld) + VW, a21);                             \
        AF_NAME(vst)((p) + 3 * (ld), a30), AF_NAME(vst)((p) + 3 * (ld) + VW, a31);                             \
        AF_NAME(vst)((p) + 4 * (ld), a40), AF_NAME(vst)((p) + 4 * (ld) + VW, a41);                             \
        AF_NAME(vst)((p) + 5 * (ld), a50), AF_NAME(vst)((p) + 5 * (ld) + VW, a51);                             \
    } while (0)

#define AF_SCALE_6X2(c)                                                                                            \
    do {                                                                                                       \
        a00 *= (c), a01 *= (c), a10 *= (c), a11 *= (c), a20 *= (c), a21 *= (c);                                \
        a30 *= (c), a31 *= (c), a40 *= (c), a41 *= (c), a50 *= (c), a51 *= (c);                                \
    } while (0)

static int64_t AF_NAME(dvpad)(int64_t dv) { return (dv + VW * CV - 1) / (VW * CV) * (VW * CV); }

#ifdef AF_DPBF16
/* simd_impl.h's vexp2 with AVX-512's own rounding and scaling: n = round(z) (vrndscaleps, to
 * nearest even, as vexp2's shifter), the same polynomial in z - n, then p 2^n by vscalefps, and 0
 * below -126 (a masked compare): the same value as vexp2 for every z, in 10 instructions instead
 * of 17 (the bf16 bodies' softmax is most of their time next to the AMX products) */
static inline VF AF_NAME(vexp2s)(VF z) {
    const __m512 x = (__m512)z;
    const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-126.0f), _CMP_NLT_UQ); /* NaN stays live */
    const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 r = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(1.534580806037411e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3399932067841291e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(9.618489071726799e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.550328642129898e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.24022646248340607f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.6931471824645996f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return (VF)_mm512_maskz_scalef_ps(live, p, n);
}
#endif

/* Online softmax of one query block against one key tile, per row r < nq of s [rows][BK] (scores
 * in log2 units): mask and missing keys, m_new = max(m, max S), rescale of l and O by
 * 2^(m - m_new), P = 2^(S - m_new), l += P (f32). P goes to s as f32 (rounded to bf16 values when
 * round_p: the bf16 policy's f32 body), or as bf16 to pb [rows][BK] when pb is given (the
 * vdpbf16ps body, AF_DPBF16 only); rows nq..nrows get P = 0. Mask and missing keys only on the
 * tiles that have them: the common tile is one pass for the max and one for P. */
static void AF_NAME(softmax)(const cdf_k_attention_args *x, int64_t bi, int64_t hi, int64_t qg0, int64_t nq,
                             int64_t nrows, int64_t kg0, int64_t nk, float *o, int64_t dvp, float *lv, float *m,
                             float *s, bool round_p, uint16_t *pb) {
    const VF zero = {0};
    const bool fix = x->mask || nk < BK;
    const bool mask_vec = x->mask && x->mask_dt == CDF_F32 && x->m_sk == 1;
    const VF log2e = AF_NAME(vset1)(1.44269504088896341f);
#ifdef AF_AMX
    /* the AMX tiles store Q K^T unscaled: S = (Q K^T) scale log2(e) is taken here, as it loads */
    const VF sc = AF_NAME(vset1)(x->scale * 1.44269504088896341f);
#define AF_SLD(p) (AF_NAME(vld)(p) * sc)
    /* raw: the common tile keeps S unscaled; its max is scaled after the max is taken (x -> x sc
     * with sc > 0 is monotonic, also after rounding: the max of the scaled scores), and the scale
     * goes into P's exponent, S sc - m in one rounding (fmsub) */
    const bool raw = !fix && sc[0] > 0.0f;
#else
#define AF_SLD(p) AF_NAME(vld)(p)
    const bool raw = false;
#endif
    for (int64_t r = 0; r < nq; r++) {
        float *sr = s + r * BK;
        VF vmax = AF_NAME(vset1)(-INFINITY);
        if (fix) {
            const int64_t moff = x->mask ? bi * x->m_sb + hi * x->m_sh + (qg0 + r) * x->m_sq + kg0 * x->m_sk : 0;
            for (int c = 0; c < KV_VECS; c++) {
                VF sv = AF_SLD(sr + c * VW);
                if (x->mask) {
                    VF mv;
                    if (mask_vec && (c + 1) * VW <= nk) {
                        mv = AF_NAME(vld)((const float *)x->mask + moff + c * VW);
                    } else {
                        mv = zero;
                        for (int t = 0; t < VW && c * VW + t < nk; t++)
                            mv[t] = cdf_k_ld(x->mask, x->mask_dt, moff + (c * VW + t) * x->m_sk);
                    }
                    sv += mv * log2e;
                }
                if ((c + 1) * VW > nk) /* keys past the end do not exist */
                    for (int t = 0; t < VW; t++)
                        if (c * VW + t >= nk) sv[t] = -INFINITY;
                AF_NAME(vst)(sr + c * VW, sv);
                vmax = AF_NAME(vmax)(vmax, sv);
            }
        } else if (raw) {
            for (int c = 0; c < KV_VECS; c++) vmax = AF_NAME(vmax)(vmax, AF_NAME(vld)(sr + c * VW));
        } else {
#ifdef AF_AMX
            for (int c = 0; c < KV_VECS; c++) {
                const VF sv = AF_SLD(sr + c * VW);
                AF_NAME(vst)(sr + c * VW, sv);
                vmax = AF_NAME(vmax)(vmax, sv);
            }
#else
            for (int c = 0; c < KV_VECS; c++) vmax = AF_NAME(vmax)(vmax, AF_NAME(vld)(sr + c * VW));
#endif
        }
#undef AF_SLD
#ifdef AF_AMX
        const float tile_max = raw ? AF_NAME(vhmax)(vmax) * sc[0] : AF_NAME(vhmax)(vmax);
#else
        const float tile_max = AF_NAME(vhmax)(vmax);
#endif
        float m_new = tile_max > m[r] ? tile_max : m[r];
        /* rounding P: the max taken up to an integer, so that P and the rescale factor are scaled
         * by powers of two only and P's bf16 rounding does not depend on the tiling (kernels.h) */
        if (round_p || pb) m_new = ceilf(m_new);
        if (m_new == -INFINITY) { /* every key so far masked: P = 0, nothing to add */
            if (pb)
                memset(pb + r * BK, 0, sizeof(uint16_t) * BK);
            else
                memset(sr, 0, sizeof(float) * BK);
            continue;
        }
        VF lr = AF_NAME(vld)(lv + r * VW);
        if (m_new != m[r]) {
            const float corr = exp2f(m[r] - m_new); /* 0 on the first live tile (m = -inf) */
            const VF cv = AF_NAME(vset1)(corr);
            lr *= cv;
            float *orow = o + r * dvp;
            for (int64_t e = 0; e < dvp; e += VW) AF_NAME(vst)(orow + e, AF_NAME(vld)(orow + e) * cv);
            m[r] = m_new;
        }
        const VF mn = AF_NAME(vset1)(m_new);
#ifdef AF_DPBF16
        if (pb) { /* two vectors of P to 32 bf16 in one vcvtne2ps2bf16 (round-to-nearest-even) */
            /* S - m (S times 1 exactly), or S sc - m for a raw AMX tile */
#ifdef AF_AMX
            const __m512 ps = raw ? (__m512)sc : _mm512_set1_ps(1.0f);
#else
            const __m512 ps = _mm512_set1_ps(1.0f);
#endif
            for (int c = 0; c < KV_VECS; c += 2) {
                const VF p0 = AF_NAME(vexp2s)((VF)_mm512_fmsub_ps((__m512)AF_NAME(vld)(sr + c * VW), ps, (__m512)mn));
                const VF p1 = AF_NAME(vexp2s)((VF)_mm512_fmsub_ps((__m512)AF_NAME(vld)(sr + (c + 1) * VW), ps, (__m512)mn));
                lr += p0 + p1;
                _mm512_storeu_si512(pb + r * BK + c * VW, (__m512i)_mm512_cvtne2ps_pbh(p1, p0));
            }
            AF_NAME(vst)(lv + r * VW, lr);
            continue;
        }
#endif
        for (int c = 0; c < KV_VECS; c++) {
            const VF p = AF_NAME(vexp2)(AF_NAME(vld)(sr + c * VW) - mn);
            lr += p;
            if (round_p) {
                /* bf16 round-to-nearest-even on the bits (p >= 0 and finite, or a quiet NaN that
                 * stays one), as cdf_f32_to_bf16 */
                const VI u = (VI)p;
                AF_NAME(vst)(sr + c * VW, (VF)((u + 0x7fff + ((u >> 16) & 1)) & -65536));
            } else {
                AF_NAME(vst)(sr + c * VW, p);
            }
        }
        AF_NAME(vst)(lv + r * VW, lr);
    }
    /* rows past nq: P = 0 (their S holds scores of zero queries) */
    for (int64_t r = nq; r < nrows; r++) {
        if (pb)
            memset(pb + r * BK, 0, sizeof(uint16_t) * BK);
        else
            memset(s + r * BK, 0, sizeof(float) * BK);
    }
}

/* A chunk's query-row state: o [qc][dvp] (f32 output accumulators), lv [qc][VW] (the row sums per
 * lane), m [qc] (running maxima); zeroed / -inf for the nqp rows of a chunk. */
static void AF_NAME(chunk_init)(int64_t nqp, int64_t dvp, float *o, float *lv, float *m) {
    memset(o, 0, sizeof(float) * (size_t)(nqp * dvp));
    memset(lv, 0, sizeof(float) * (size_t)(nqp * VW));
    for (int64_t r = 0; r < nqp; r++) m[r] = -INFINITY;
}

/* out rows [q0, q0 + nqc) of (bi, hi) = O / l */
static void AF_NAME(chunk_store)(const cdf_k_attention_args *x, int64_t bi, int64_t hi, int64_t q0, int64_t nqc,
                                 int64_t dvp, float *o, const float *lv) {
    const int64_t dv = x->dv;
    for (int64_t r = 0; r < nqc; r++) {
        float *orow = o + r * dvp;
        const float l = AF_NAME(vhsum)(AF_NAME(vld)(lv + r * VW));
        /* a fully masked row (l == 0) gives zeros, not 0/0 */
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        for (int64_t e = 0; e < dv; e++) orow[e] *= inv;
        cdf_k_store_row(x->out, x->out_dt, ((bi * x->h + hi) * x->lq + q0 + r) * dv, orow, dv);
    }
}

#ifndef AF_DPBF16

/* Scratch per thread (floats) for chunks of up to qc query rows and spans of up to ks keys
 * (qc a multiple of AF_BQ, ks of BK):
 * q [qc][d], o [qc][dvp], lv [qc][VW], m [qc], s [BQ][BK], kt [ks/BK][d][BK], v [ks][dvp], row. */
static size_t AF_NAME(scratch_floats)(int64_t d, int64_t dv, int64_t qc, int64_t ks) {
    const int64_t dvp = AF_NAME(dvpad)(dv);
    const int64_t rowmax = d > dvp ? d : dvp;
    return (size_t)(qc * (d + dvp + VW + 1) + AF_BQ * BK + ks * (d + dvp) + rowmax) + 64;
}

/* keys [k0, k0 + nks) of (bi, hi): K transposed into tiles kt[t][e][j], V rows padded to dvp;
 * keys past nks up to the tile end are zeros */
static void AF_NAME(pack_span)(const cdf_k_attention_args *x, int64_t bi, int64_t hi, int64_t k0, int64_t nks,
                               float *kt, float *vt, float *row) {
    const int64_t d = x->d, dv = x->dv, dvp = AF_NAME(dvpad)(dv);
    const int64_t nkp = (nks + BK - 1) / BK * BK;
    for (int64_t j = 0; j < nks; j++) {
        cdf_k_load_row(row, x->k, x->k_dt, bi * x->k_sb + hi * x->k_sh + (k0 + j) * x->k_sl, d);
        float *kd = kt + (j / BK) * d * BK + j % BK;
        for (int64_t e = 0; e < d; e++) kd[e * BK] = row[e];
        float *vr = vt + j * dvp;
        cdf_k_load_row(vr, x->v, x->v_dt, bi * x->v_sb + hi * x->v_sh + (k0 + j) * x->v_sl, dv);
        for (int64_t e = dv; e < dvp; e++) vr[e] = 0.0f;
    }
    if (nkp > nks) {
        float *kd = kt + (nks / BK) * d * BK;
        for (int64_t e = 0; e < d; e++)
            for (int64_t j = nks % BK; j < BK; j++) kd[e * BK + j] = 0.0f;
        memset(vt + nks * dvp, 0, sizeof(float) * (size_t)((nkp - nks) * dvp));
    }
}

/* One query block (rows q[0..nq) of the chunk arrays passed in, qg0 its first global row) against
 * one key tile (kt [d][BK], vt [BK][dvp], nk live keys starting at global key kg0). bfp: the bf16
 * policy (Q not prescaled: S scaled here; P rounded to bf16 by the softmax). */
static void AF_NAME(tile)(const cdf_k_attention_args *x, int64_t bi, int64_t hi, int64_t qg0, int64_t nq,
                          int64_t kg0, int64_t nk, const float *q, float *o, float *lv, float *m, float *s,
                          const float *kt, const float *vt, bool bfp) {
    const int64_t d = x->d, dvp = AF_NAME(dvpad)(x->dv);
    const int64_t nrows = (nq + AF_RB - 1) / AF_RB * AF_RB;
    const VF zero = {0};
    const VF sc = AF_NAME(vset1)(x->scale * 1.44269504088896341f);

    /* S = Q' K^T, 6 rows x 2 vectors of keys per register block: twelve named accumulators (the
     * compiler keeps them in registers), enough independent FMA chains to cover the FMA latency
     * at two per cycle, plus 2 key vectors and a broadcast: 15 of AVX2's 16 registers */
    for (int64_t r = 0; r < nrows; r += AF_RB) {
        const float *q0p = q + r * d, *q1p = q0p + d, *q2p = q1p + d, *q3p = q2p + d, *q4p = q3p + d, *q5p = q4p + d;
        for (int c = 0; c < KV_VECS; c += 2) {
            VF a00 = zero, a01 = zero, a10 = zero, a11 = zero, a20 = zero, a21 = zero;
            VF a30 = zero, a31 = zero, a40 = zero, a41 = zero, a50 = zero, a51 = zero;
            const float *kp = kt + c * VW;
            for (int64_t e = 0; e < d; e++, kp += BK) {
                const VF k0 = AF_NAME(vld)(kp), k1 = AF_NAME(vld)(kp + VW);
                AF_RANK1_6X2(k0, k1, q0p, q1p, q2p, q3p, q4p, q5p, e);
            }
            if (bfp) AF_SCALE_6X2(sc);
            float *sp = s + r * BK + c * VW;
            AF_STORE_6X2(sp, BK);
        }
    }

    AF_NAME(softmax)(x, bi, hi, qg0, nq, nrows, kg0, nk, o, dvp, lv, m, s, bfp, NULL);

    /* O += P V, 6 rows x 2 vectors of O per register block (named accumulators, as above) */
    for (int64_t r = 0; r < nrows; r += AF_RB) {
        const float *p0 = s + r * BK, *p1 = p0 + BK, *p2 = p1 + BK, *p3 = p2 + BK, *p4 = p3 + BK, *p5 = p4 + BK;
        for (int64_t e0 = 0; e0 < dvp; e0 += 2 * VW) {
            float *op = o + r * dvp + e0;
            AF_LOAD_6X2(op, dvp);
            const float *vp = vt + e0;
            for (int64_t j = 0; j < nk; j++, vp += dvp) {
                const VF v0 = AF_NAME(vld)(vp), v1 = AF_NAME(vld)(vp + VW);
                AF_RANK1_6X2(v0, v1, p0, p1, p2, p3, p4, p5, j);
            }
            AF_STORE_6X2(op, dvp);
        }
    }
}

/* query rows [q0, q0 + nqc) of (bi, hi) against all keys, spans of up to ks keys */
static void AF_NAME(chunk)(const cdf_k_attention_args *x, int64_t bi, int64_t hi, int64_t q0, int64_t nqc,
                           int64_t qc, int64_t ks, float *mem) {
    const int64_t d = x->d, dv = x->dv, dvp = AF_NAME(dvpad)(dv);
    float *q = mem, *o = q + qc * d, *lv = o + qc * dvp, *m = lv + qc * VW, *s = m + qc;
    float *kt = s + AF_BQ * BK, *vt = kt + ks * d, *row = vt + ks * dvp;
    const bool bfp = cdf_k_attention_bf16_policy(x);
    /* f32: Q' = Q scale log2(e), the scores come out in log2 units, P = 2^(S - max); the bf16
     * policy keeps Q's bf16 values and scales S instead (the tile) */
    const float qscale = bfp ? 1.0f : x->scale * 1.44269504088896341f;
    const int64_t nqp = (nqc + AF_BQ - 1) / AF_BQ * AF_BQ;
    for (int64_t r = 0; r < nqc; r++) {
        float *qr = q + r * d;
        cdf_k_load_row(qr, x->q, x->q_dt, bi * x->q_sb + hi * x->q_sh + (q0 + r) * x->q_sl, d);
        if (!bfp)
            for (int64_t e = 0; e < d; e++) qr[e] *= qscale;
    }
    /* rows past nqc (a ragged last block) compute on zeros and are never stored */
    memset(q + nqc * d, 0, sizeof(float) * (size_t)((nqp - nqc) * d));
    AF_NAME(chunk_init)(nqp, dvp, o, lv, m);

    for (int64_t k0 = 0; k0 < x->lk; k0 += ks) {
        const int64_t nks = x->lk - k0 < ks ? x->lk - k0 : ks;
        AF_NAME(pack_span)(x, bi, hi, k0, nks, kt, vt, row);
        for (int64_t b0 = 0; b0 < nqc; b0 += AF_BQ) {
            const int64_t nq = nqc - b0 < AF_BQ ? nqc - b0 : AF_BQ;
            for (int64_t t0 = 0; t0 < nks; t0 += BK)
                AF_NAME(tile)(x, bi, hi, q0 + b0, nq, k0 + t0, nks - t0 < BK ? nks - t0 : BK, q + b0 * d,
                              o + b0 * dvp, lv + b0 * VW, m + b0, s, kt + t0 * d, vt + t0 * dvp, bfp);
        }
    }
    AF_NAME(chunk_store)(x, bi, hi, q0, nqc, dvp, o, lv);
}

#else /* AF_DPBF16: the vdpbf16ps body (bf16 policy only: q, k, v are bf16) */

/* d rounded up to even: the pairs the dot instruction sums (an odd d gets a zero dimension) */
static int64_t AF_NAME(dpad)(int64_t d) { return (d + 1) / 2 * 2; }

/* Scratch per thread (in floats, each part 64-byte aligned): f32 o [qc][dvp], lv [qc][VW], m [qc],
 * s [BQ][BK]; bf16 q [qc][d2], kt [ks/BK][d2/2][BK][2], vt [ks/2][dvp][2], pb [BQ][BK]. */
#define AF_AL(n) (((n) + 15) / 16 * 16) /* floats, rounded to 64 bytes */
static size_t AF_NAME(scratch_floats)(int64_t d, int64_t dv, int64_t qc, int64_t ks) {
    const int64_t dvp = AF_NAME(dvpad)(dv), d2 = AF_NAME(dpad)(d);
    return (size_t)(AF_AL(qc * dvp) + AF_AL(qc * VW) + AF_AL(qc) + AF_AL(AF_BQ * BK) + AF_AL(qc * d2 / 2) +
                    AF_AL(ks * d2 / 2) + AF_AL(ks * dvp / 2) + AF_AL(AF_BQ * BK / 2)) + 16;
}

/* keys [k0, k0 + nks) of (bi, hi), bf16 bits as they are: K^T tiles in dimension pairs
 * kt[t][e/2][j][e%2], V in key pairs vt[j/2][e][j%2] (dims padded to dvp); a padded dimension and
 * keys past nks up to the tile end are zeros */
static void AF_NAME(pack_span)(const cdf_k_attention_args *x, int64_t bi, int64_t hi, int64_t k0, int64_t nks,
                               uint16_t *kt, uint16_t *vt) {
    const int64_t d = x->d, d2 = AF_NAME(dpad)(d), dv = x->dv, dvp = AF_NAME(dvpad)(dv);
    const int64_t nkp = (nks + BK - 1) / BK * BK;
    const uint16_t *k = x->k, *v = x->v;
    /* even d (every model's): in vectors, 16 keys' dimension pair per gather for K^T and two key
     * rows interleaved by 16-bit permutes for V (next to the AMX products the scalar loops below
     * were a sixth of the attention's time); the scalar loops do odd d and huge strides */
    if (d == d2 && x->k_sl <= INT32_MAX / 32 && x->k_sl > 0) {
        const uint16_t *kb = k + bi * x->k_sb + hi * x->k_sh + k0 * x->k_sl;
        const __m512i rows = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                                _mm512_set1_epi32((int)x->k_sl));
        for (int64_t j0 = 0; j0 < nkp; j0 += 16) {
            const int64_t live = nks - j0 < 0 ? 0 : nks - j0 > 16 ? 16 : nks - j0;
            const __mmask16 km = (__mmask16)((1u << live) - 1u);
            uint16_t *kd = kt + (j0 / BK) * d2 * BK + (j0 % BK) * 2;
            const uint16_t *src = kb + (live ? j0 : 0) * x->k_sl;
            for (int64_t pi = 0; pi < d2 / 2; pi++) /* element offsets, scale 2 bytes */
                _mm512_storeu_si512(kd + pi * BK * 2,
                                    _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), km,
                                                                _mm512_add_epi32(rows, _mm512_set1_epi32((int)(2 * pi))),
                                                                src, 2));
        }
        const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6, 37,
                                            5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
        const __m512i hi16 = _mm512_set_epi16(63, 31, 62, 30, 61, 29, 60, 28, 59, 27, 58, 26, 57, 25, 56, 24, 55, 23, 54,
                                              22, 53, 21, 52, 20, 51, 19, 50, 18, 49, 17, 48, 16);
        const uint16_t *vb = v + bi * x->v_sb + hi * x->v_sh + k0 * x->v_sl;
        for (int64_t j = 0; j < nkp; j += 2) {
            uint16_t *vd = vt + (j / 2) * dvp * 2;
            for (int64_t e0 = 0; e0 < dvp; e0 += 32) {
                const int64_t ne = dv - e0 < 0 ? 0 : dv - e0 > 32 ? 32 : dv - e0;
                const __mmask32 em = (__mmask32)(ne == 32 ? 0xffffffffu : (1u << ne) - 1u);
                const __m512i a = j < nks ? _mm512_maskz_loadu_epi16(em, vb + j * x->v_sl + e0) : _mm512_setzero_si512();
                const __m512i b =
                    j + 1 < nks ? _mm512_maskz_loadu_epi16(em, vb + (j + 1) * x->v_sl + e0) : _mm512_setzero_si512();
                _mm512_storeu_si512(vd + e0 * 2, _mm512_permutex2var_epi16(a, lo, b));
                _mm512_storeu_si512(vd + e0 * 2 + 32, _mm512_permutex2var_epi16(a, hi16, b));
            }
        }
        return;
    }
    for (int64_t j = 0; j < nkp; j++) {
        uint16_t *kd = kt + (j / BK) * d2 * BK + (j % BK) * 2;
        uint16_t *vd = vt + (j / 2) * dvp * 2 + j % 2;
        if (j < nks) {
            const uint16_t *kr = k + bi * x->k_sb + hi * x->k_sh + (k0 + j) * x->k_sl;
            for (int64_t e = 0; e < d; e++) kd[(e / 2) * BK * 2 + e % 2] = kr[e];
            if (d < d2) kd[(d / 2) * BK * 2 + 1] = 0;
            const uint16_t *vr = v + bi * x->v_sb + hi * x->v_sh + (k0 + j) * x->v_sl;
            for (int64_t e = 0; e < dv; e++) vd[e * 2] = vr[e];
        } else {
            for (int64_t e = 0; e < d2; e++) kd[(e / 2) * BK * 2 + e % 2] = 0;
            for (int64_t e = 0; e < dv; e++) vd[e * 2] = 0;
        }
        for (int64_t e = dv; e < dvp; e++) vd[e * 2] = 0;
    }
}

/* vdpbf16ps on the 6 x 2 block: a_r0 += pair_r . x0, a_r1 += pair_r . x1, pair_r the r-th row's
 * bf16 pair i (32 bits) broadcast to every lane */
#define AF_DP_6X2(x0, x1, s0, s1, s2, s3, s4, s5, i)                                                               \
    do {                                                                                                       \
        __m512bh b_ = (__m512bh)_mm512_set1_epi32(s0[i]);                                                      \
        a00 = _mm512_dpbf16_ps(a00, b_, x0), a01 = _mm512_dpbf16_ps(a01, b_, x1);                              \
        b_ = (__m512bh)_mm512_set1_epi32(s1[i]);                                                               \
        a10 = _mm512_dpbf16_ps(a10, b_, x0), a11 = _mm512_dpbf16_ps(a11, b_, x1);                              \
        b_ = (__m512bh)_mm512_set1_epi32(s2[i]);                                                               \
        a20 = _mm512_dpbf16_ps(a20, b_, x0), a21 = _mm512_dpbf16_ps(a21, b_, x1);                              \
        b_ = (__m512bh)_mm512_set1_epi32(s3[i]);                                                               \
        a30 = _mm512_dpbf16_ps(a30, b_, x0), a31 = _mm512_dpbf16_ps(a31, b_, x1);                              \
        b_ = (__m512bh)_mm512_set1_epi32(s4[i]);                                                               \
        a40 = _mm512_dpbf16_ps(a40, b_, x0), a41 = _mm512_dpbf16_ps(a41, b_, x1);                              \
        b_ = (__m512bh)_mm512_set1_epi32(s5[i]);                                                               \
        a50 = _mm512_dpbf16_ps(a50, b_, x0), a51 = _mm512_dpbf16_ps(a51, b_, x1);                              \
    } while (0)

/* a bf16 pair read as one 32-bit word (the buffers are written as uint16) */
typedef uint32_t AF_NAME(pair) __attribute__((may_alias));

/* 32 bf16 values (16 pairs) at p */
static inline __m512bh AF_NAME(ldbh)(const uint16_t *p) { return (__m512bh)_mm512_loadu_si512(p); }

#ifdef AF_AMX
/* The AMX build (AF_AMX with AF_DPBF16): the same packed operands and softmax, both products on
 * AMX tiles (tdpbf16ps: a 16 x 16 f32 tile += 16 x 32 bf16 times 32 x 16 bf16, the latter in
 * the pairs layout kt and vt already have). Needs d2 a multiple of 32 (the dispatch checks), BK 64
 * (4 key tiles) and AF_BQ a multiple of 16: every block computes all AF_BQ rows (the chunk's rows
 * past nqc are zeros, their P is 0). Tiles: tmm0-3 accumulators, tmm4 the A operand (Q or P),
 * tmm5-7 the B operands (three, so a load need not wait for the product reading the previous). */
_Static_assert(BK == 64 && AF_BQ % 16 == 0, "AMX attention: 4 key tiles of 16, query blocks of 16-row tiles");

/* The tile of the vdpbf16ps body on AMX: q [AF_BQ][d2] bf16, kt [d2/2][BK][2], vt [BK/2][dvp][2],
 * s [AF_BQ][BK] f32, P through pb [AF_BQ][BK] bf16, o [AF_BQ][dvp] f32 (rescaled by the softmax,
 * then accumulated in tiles loaded from it and stored back). */
static void AF_NAME(tile)(const cdf_k_attention_args *x, int64_t bi, int64_t hi, int64_t qg0, int64_t nq,
                          int64_t kg0, int64_t nk, const uint16_t *q, float *o, float *lv, float *m, float *s,
                          uint16_t *pb, const uint16_t *kt, const uint16_t *vt) {
    const int64_t d2 = AF_NAME(dpad)(x->d), dvp = AF_NAME(dvpad)(x->dv);
    const size_t qst = (size_t)d2 * 2, kst = BK * 4, sst = BK * 4, pst = BK * 2, vst = (size_t)dvp * 4,
                 ost = (size_t)dvp * 4;

    /* S = Q K^T: per 16-row tile the 4 key tiles in tmm0-3, 32 dimensions per step */
    for (int64_t r = 0; r < AF_BQ; r += 16) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t e = 0; e < d2; e += 32) {
            const uint16_t *kp = kt + (e / 2) * BK * 2; /* dimension pairs e/2.., keys 16 c.. at 32 c */
            AMX_A_X_4B(q + r * d2 + e, qst, kp, kst);
        }
        float *sp = s + r * BK;
        _tile_stored(0, sp, sst);
        _tile_stored(1, sp + 16, sst);
        _tile_stored(2, sp + 32, sst);
        _tile_stored(3, sp + 48, sst);
    }
    /* the softmax scales S by scale log2(e) as it loads it */
    AF_NAME(softmax)(x, bi, hi, qg0, nq, AF_BQ, kg0, nk, o, dvp, lv, m, s, true, pb);

    /* O += P V: per 16-row tile, 4 (or, for the last 32 dims, 2) column tiles of O, 32 keys per step */
    for (int64_t r = 0; r < AF_BQ; r += 16) {
        const uint16_t *pr = pb + r * BK;
        for (int64_t e0 = 0; e0 < dvp; e0 += 64) {
            float *op = o + r * dvp + e0;
            const uint16_t *vp = vt + e0 * 2;
            if (dvp - e0 >= 64) {
                _tile_loadd(0, op, ost);
                _tile_loadd(1, op + 16, ost);
                _tile_loadd(2, op + 32, ost);
                _tile_loadd(3, op + 48, ost);
                for (int64_t j = 0; j < BK; j += 32, vp += 16 * dvp * 2) AMX_A_X_4B(pr + j, pst, vp, vst);
                _tile_stored(0, op, ost);
                _tile_stored(1, op + 16, ost);
                _tile_stored(2, op + 32, ost);
                _tile_stored(3, op + 48, ost);
            } else { /* dvp is a multiple of 32: 32 dims left */
                _tile_loadd(0, op, ost);
                _tile_loadd(1, op + 16, ost);
                for (int64_t j = 0; j < BK; j += 32, vp += 16 * dvp * 2) {
                    _tile_loadd(4, pr + j, pst);
                    _tile_loadd(5, vp, vst);
                    _tile_dpbf16ps(0, 4, 5);
                    _tile_loadd(6, vp + 32, vst);
                    _tile_dpbf16ps(1, 4, 6);
                }
                _tile_stored(0, op, ost);
                _tile_stored(1, op + 16, ost);
            }
        }
    }
}
#else
/* The tile of the f32 body with bf16 operands: q [nrows][d2] bf16 (pairs read as 32-bit words),
 * kt [d2/2][BK][2], vt [BK/2][dvp][2], P through pb [BQ][BK] bf16. */
static void AF_NAME(tile)(const cdf_k_attention_args *x, int64_t bi, int64_t hi, int64_t qg0, int64_t nq,
                          int64_t kg0, int64_t nk, const uint16_t *q, float *o, float *lv, float *m, float *s,
                          uint16_t *pb, const uint16_t *kt, const uint16_t *vt) {
    const int64_t d2 = AF_NAME(dpad)(x->d), np = d2 / 2, dvp = AF_NAME(dvpad)(x->dv);
    const int64_t nrows = (nq + AF_RB - 1) / AF_RB * AF_RB;
    const VF zero = {0};
    const VF sc = AF_NAME(vset1)(x->scale * 1.44269504088896341f);

    /* S = (Q K^T) scale log2(e): per step one dimension pair of 6 rows x 32 keys */
    for (int64_t r = 0; r < nrows; r += AF_RB) {
        const AF_NAME(pair) *q0p = (const AF_NAME(pair) *)(q + r * d2), *q1p = q0p + np, *q2p = q1p + np,
                            *q3p = q2p + np, *q4p = q3p + np, *q5p = q4p + np;
        for (int c = 0; c < KV_VECS; c += 2) {
            VF a00 = zero, a01 = zero, a10 = zero, a11 = zero, a20 = zero, a21 = zero;
            VF a30 = zero, a31 = zero, a40 = zero, a41 = zero, a50 = zero, a51 = zero;
            const uint16_t *kp = kt + c * VW * 2;
            for (int64_t e = 0; e < np; e++, kp += BK * 2) {
                const __m512bh k0 = AF_NAME(ldbh)(kp), k1 = AF_NAME(ldbh)(kp + VW * 2);
                AF_DP_6X2(k0, k1, q0p, q1p, q2p, q3p, q4p, q5p, e);
            }
            AF_SCALE_6X2(sc);
            float *sp = s + r * BK + c * VW;
            AF_STORE_6X2(sp, BK);
        }
    }

    AF_NAME(softmax)(x, bi, hi, qg0, nq, nrows, kg0, nk, o, dvp, lv, m, s, true, pb);

    /* O += P V: per step one key pair of 6 rows x 32 output dims (P of missing keys is 0) */
    const int64_t nkpairs = (nk + 1) / 2;
    for (int64_t r = 0; r < nrows; r += AF_RB) {
        const AF_NAME(pair) *p0 = (const AF_NAME(pair) *)(pb + r * BK), *p1 = p0 + BK / 2, *p2 = p1 + BK / 2,
                            *p3 = p2 + BK / 2, *p4 = p3 + BK / 2, *p5 = p4 + BK / 2;
        for (int64_t e0 = 0; e0 < dvp; e0 += 2 * VW) {
            float *op = o + r * dvp + e0;
            AF_LOAD_6X2(op, dvp);
            const uint16_t *vp = vt + e0 * 2;
            for (int64_t j = 0; j < nkpairs; j++, vp += dvp * 2) {
                const __m512bh v0 = AF_NAME(ldbh)(vp), v1 = AF_NAME(ldbh)(vp + VW * 2);
                AF_DP_6X2(v0, v1, p0, p1, p2, p3, p4, p5, j);
            }
            AF_STORE_6X2(op, dvp);
        }
    }
}

#endif /* AF_AMX */

static void AF_NAME(chunk)(const cdf_k_attention_args *x, int64_t bi, int64_t hi, int64_t q0, int64_t nqc,
                           int64_t qc, int64_t ks, float *mem) {
    const int64_t d = x->d, d2 = AF_NAME(dpad)(d), dvp = AF_NAME(dvpad)(x->dv);
    float *o = mem, *lv = o + AF_AL(qc * dvp), *m = lv + AF_AL(qc * VW), *s = m + AF_AL(qc);
    uint16_t *q = (uint16_t *)(s + AF_AL(AF_BQ * BK));
    uint16_t *kt = q + 2 * AF_AL(qc * d2 / 2), *vt = kt + 2 * AF_AL(ks * d2 / 2), *pb = vt + 2 * AF_AL(ks * dvp / 2);
    const int64_t nqp = (nqc + AF_BQ - 1) / AF_BQ * AF_BQ;
    const uint16_t *qs = x->q;
    for (int64_t r = 0; r < nqp; r++) { /* rows past nqc compute on zeros and are never stored */
        uint16_t *qr = q + r * d2;
        if (r < nqc) {
            memcpy(qr, qs + bi * x->q_sb + hi * x->q_sh + (q0 + r) * x->q_sl, sizeof(uint16_t) * (size_t)d);
            if (d < d2) qr[d] = 0;
        } else {
            memset(qr, 0, sizeof(uint16_t) * (size_t)d2);
        }
    }
    AF_NAME(chunk_init)(nqp, dvp, o, lv, m);
#ifdef AF_AMX
    amx_config_16x64();
#endif

    for (int64_t k0 = 0; k0 < x->lk; k0 += ks) {
        const int64_t nks = x->lk - k0 < ks ? x->lk - k0 : ks;
        AF_NAME(pack_span)(x, bi, hi, k0, nks, kt, vt);
        for (int64_t b0 = 0; b0 < nqc; b0 += AF_BQ) {
            const int64_t nq = nqc - b0 < AF_BQ ? nqc - b0 : AF_BQ;
            for (int64_t t0 = 0; t0 < nks; t0 += BK)
                AF_NAME(tile)(x, bi, hi, q0 + b0, nq, k0 + t0, nks - t0 < BK ? nks - t0 : BK, q + b0 * d2,
                              o + b0 * dvp, lv + b0 * VW, m + b0, s, pb, kt + t0 * d2, vt + t0 * dvp);
        }
    }
#ifdef AF_AMX
    _tile_release(); /* the tile state back to its initial (unconfigured) state */
#endif
    AF_NAME(chunk_store)(x, bi, hi, q0, nqc, dvp, o, lv);
}
#undef AF_DP_6X2
#undef AF_AL

#endif /* AF_DPBF16 */

#undef VF
#undef VI
#undef BK
#undef AF_RANK1_6X2
#undef AF_LOAD_6X2
#undef AF_STORE_6X2
#undef AF_SCALE_6X2
#undef AF_NAME
#undef AF_CAT
#undef AF_CAT2
/* the includer's parameters, so that the next build defines its own */
#undef VW
#undef KV_VECS
#undef CV
#undef SFX
#undef AF_DPBF16
#undef AF_AMX
