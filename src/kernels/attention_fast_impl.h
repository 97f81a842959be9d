/* Body of the vectorised flash attention (attention_fast.c), compiled once per ISA: the includer
 * defines VW (f32 lanes per vector), KV_VECS (vectors of keys per tile, even), CV (2: the value
 * width is padded to a multiple of CV * VW), the
 * name suffix SFX, and wraps the include in a `#pragma GCC target`. GCC vector extensions keep
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
 * bounded by AF_QC and AF_KS, whatever the sequence lengths. */

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

static int64_t AF_NAME(dvpad)(int64_t dv) { return (dv + VW * CV - 1) / (VW * CV) * (VW * CV); }

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
 * one key tile (kt [d][BK], vt [BK][dvp], nk live keys starting at global key kg0). */
static void AF_NAME(tile)(const cdf_k_attention_args *x, int64_t bi, int64_t hi, int64_t qg0, int64_t nq,
                          int64_t kg0, int64_t nk, const float *q, float *o, float *lv, float *m, float *s,
                          const float *kt, const float *vt) {
    const int64_t d = x->d, dvp = AF_NAME(dvpad)(x->dv);
    const int64_t nrows = (nq + AF_RB - 1) / AF_RB * AF_RB;
    const VF zero = {0};

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
            float *sp = s + r * BK + c * VW;
            AF_STORE_6X2(sp, BK);
        }
    }

    /* online softmax per row; P overwrites S. Mask and missing keys only on the tiles that have
     * them: the common tile is one pass for the max and one for P. */
    const bool fix = x->mask || nk < BK;
    const bool mask_vec = x->mask && x->mask_dt == CDF_F32 && x->m_sk == 1;
    const VF log2e = AF_NAME(vset1)(1.44269504088896341f);
    for (int64_t r = 0; r < nq; r++) {
        float *sr = s + r * BK;
        VF vmax = AF_NAME(vset1)(-INFINITY);
        if (fix) {
            const int64_t moff = x->mask ? bi * x->m_sb + hi * x->m_sh + (qg0 + r) * x->m_sq + kg0 * x->m_sk : 0;
            for (int c = 0; c < KV_VECS; c++) {
                VF sv = AF_NAME(vld)(sr + c * VW);
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
        } else {
            for (int c = 0; c < KV_VECS; c++) vmax = AF_NAME(vmax)(vmax, AF_NAME(vld)(sr + c * VW));
        }
        const float tile_max = AF_NAME(vhmax)(vmax);
        const float m_new = tile_max > m[r] ? tile_max : m[r];
        if (m_new == -INFINITY) { /* every key so far masked: P = 0, nothing to add */
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
        for (int c = 0; c < KV_VECS; c++) {
            const VF p = AF_NAME(vexp2)(AF_NAME(vld)(sr + c * VW) - mn);
            AF_NAME(vst)(sr + c * VW, p);
            lr += p;
        }
        AF_NAME(vst)(lv + r * VW, lr);
    }
    /* rows past nq: P = 0 (their S holds scores of zero queries) */
    for (int64_t r = nq; r < nrows; r++) memset(s + r * BK, 0, sizeof(float) * BK);

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
    /* Q' = Q scale log2(e): the scores come out in log2 units, P = 2^(S - max) */
    const float qscale = x->scale * 1.44269504088896341f;
    const int64_t nqp = (nqc + AF_BQ - 1) / AF_BQ * AF_BQ;
    for (int64_t r = 0; r < nqc; r++) {
        float *qr = q + r * d;
        cdf_k_load_row(qr, x->q, x->q_dt, bi * x->q_sb + hi * x->q_sh + (q0 + r) * x->q_sl, d);
        for (int64_t e = 0; e < d; e++) qr[e] *= qscale;
        m[r] = -INFINITY;
    }
    /* rows past nqc (a ragged last block) compute on zeros and are never stored */
    memset(q + nqc * d, 0, sizeof(float) * (size_t)((nqp - nqc) * d));
    memset(o, 0, sizeof(float) * (size_t)(nqp * dvp));
    memset(lv, 0, sizeof(float) * (size_t)(nqp * VW));

    for (int64_t k0 = 0; k0 < x->lk; k0 += ks) {
        const int64_t nks = x->lk - k0 < ks ? x->lk - k0 : ks;
        AF_NAME(pack_span)(x, bi, hi, k0, nks, kt, vt, row);
        for (int64_t b0 = 0; b0 < nqc; b0 += AF_BQ) {
            const int64_t nq = nqc - b0 < AF_BQ ? nqc - b0 : AF_BQ;
            for (int64_t t0 = 0; t0 < nks; t0 += BK)
                AF_NAME(tile)(x, bi, hi, q0 + b0, nq, k0 + t0, nks - t0 < BK ? nks - t0 : BK, q + b0 * d,
                              o + b0 * dvp, lv + b0 * VW, m + b0, s, kt + t0 * d, vt + t0 * dvp);
        }
    }
    for (int64_t r = 0; r < nqc; r++) {
        float *orow = o + r * dvp;
        const float l = AF_NAME(vhsum)(AF_NAME(vld)(lv + r * VW));
        /* a fully masked row (l == 0) gives zeros, not 0/0 */
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        for (int64_t e = 0; e < dv; e++) orow[e] *= inv;
        cdf_k_store_row(x->out, x->out_dt, ((bi * x->h + hi) * x->lq + q0 + r) * dv, orow, dv);
    }
}

#undef VF
#undef VI
#undef BK
#undef AF_RANK1_6X2
#undef AF_LOAD_6X2
#undef AF_STORE_6X2
#undef AF_NAME
#undef AF_CAT
#undef AF_CAT2
