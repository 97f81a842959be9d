/* Vectorised flash attention (src/kernels/attention_fast.c) at every ISA level this CPU has
 * (AVX2: 8 lanes, AVX-512: 16), against a double-precision softmax(q k^T * scale + mask) v
 * computed here and against the reference kernel cdf_k_attention.
 *
 * Bound: with |v| <= vmax, an output is a convex combination of v rows, so errors in the
 * weights p (from f32 score sums over d terms, ~d u |q||k| scale, and the ~2-ulp polynomial
 * exp) move it by at most ~(d + 8) u (|q||k|scale + 1) vmax, the bound used (measured: a few % of
 * it), which a wrong
 * softmax (missing max subtraction, a dropped tile, a mis-scaled row) misses by orders of
 * magnitude. bf16 outputs add half a bf16 ulp.
 *
 * Cases: sequence lengths that are not multiples of the key tile (32/64 keys), the query block
 * (48 rows) or the 6-row register block: 1, 5, 17, 63, 65, 130, 200 ... (with 2+ threads the small
 * cases are split into several query chunks per head; the 4100-token case has 3 query chunks and 3
 * packed key spans); head dims 1, 17, 64, 128 and dv != d; strided
 * q/k/v (the [B, L, H, D] layout of a fused QKV projection); bf16 q/k/v/out; masks: additive f32
 * [B, 1, Lq, Lk] with -inf entries and a fully masked row (must give zeros), key padding
 * [B, 1, 1, Lk] (query stride 0), bf16 mask, a transposed mask (key stride != 1); a 4100-token
 * self-attention checked on sampled rows (bounded memory: no L x L buffer could exist in it);
 * declines and the dispatch.
 *
 * bf16 q/k/v follow the bf16 attention policy (kernels.h: P rounded to bf16 before P V, the row
 * sum from the f32 P), at every level: AVX2 / AVX-512 in f32 on the widened values, AVX512-BF16
 * with vdpbf16ps. The double reference computes that policy, so the same f32-level bound applies,
 * plus, for the keys whose P lies so close to a bf16 rounding midpoint that the kernel's few-ulp
 * P may round the other way, one bf16 ulp of their weight (the allowance, ref_row). Not rounding
 * P (the f32 result) misses the reference by ~2^-9 of the weights, far outside. Checked by
 * mutation, each failing here: P not rounded (f32 bodies), P truncated (vdpbf16ps body), the
 * running max not taken up to an integer (avx2's 32-key tiles then round differently), K or V
 * pairs swapped in the packed layout, S not scaled, the reference kernel not rounding P. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#include "cdiffusers/dtype.h"
#include "kernels/cpu_features.h"
#include "kernels/dispatch.h"
#include "kernels/kernels.h"

#define U32 (1.0 / 16777216.0)
#define LOG2E 1.4426950408889634

typedef struct att_case {
    int64_t b, h, lq, lk, d, dv;
    cdf_dtype qkv_dt, out_dt, mask_dt;
    int mask;      /* 0 none, 1 full [B,1,Lq,Lk] with -inf holes and a dead row, 2 key padding, 3 transposed */
    bool blhd;     /* q/k/v in [B, L, H, D] layout (strided), else [B, H, L, D] */
    int sample;    /* > 0: check only this many query rows (large cases) */
} att_case;

typedef struct att_bufs {
    cdf_k_attention_args x;
    void *q, *k, *v, *mask, *out;
    float *qf, *kf, *vf, *mf; /* the values as stored, in f32 */
} att_bufs;

static void *alloc_dt(cdf_dtype dt, size_t n) {
    void *p = malloc(cdf_dtype_size(dt) * (n ? n : 1));
    assert_non_null(p);
    return p;
}

/* fills an operand of n elements with random values scaled by `s`, stored as dt; f32 copy of
 * the stored values in *f */
static void *rand_operand(cdf_dtype dt, size_t n, uint64_t seed, float s, float **f) {
    float *r = malloc(sizeof(float) * (n ? n : 1));
    assert_non_null(r);
    tu_fill_random(r, n, seed);
    for (size_t i = 0; i < n; i++) r[i] *= s;
    void *p = alloc_dt(dt, n);
    cdf_convert(p, dt, r, CDF_F32, n);
    cdf_convert(r, CDF_F32, p, dt, n);
    *f = r;
    return p;
}

static void setup(const att_case *c, att_bufs *m, uint64_t seed) {
    memset(m, 0, sizeof *m);
    cdf_k_attention_args *x = &m->x;
    x->b = c->b, x->h = c->h, x->lq = c->lq, x->lk = c->lk, x->d = c->d, x->dv = c->dv;
    const size_t nq = (size_t)(c->b * c->h * c->lq * c->d), nk = (size_t)(c->b * c->h * c->lk * c->d);
    const size_t nv = (size_t)(c->b * c->h * c->lk * c->dv);
    m->q = rand_operand(c->qkv_dt, nq, seed, 1.5f, &m->qf);
    m->k = rand_operand(c->qkv_dt, nk, seed + 1, 1.5f, &m->kf);
    m->v = rand_operand(c->qkv_dt, nv, seed + 2, 1.0f, &m->vf);
    x->q = m->q, x->k = m->k, x->v = m->v;
    x->q_dt = x->k_dt = x->v_dt = c->qkv_dt;
    if (c->blhd) { /* [B, L, H, D] */
        x->q_sb = c->lq * c->h * c->d, x->q_sh = c->d, x->q_sl = c->h * c->d;
        x->k_sb = c->lk * c->h * c->d, x->k_sh = c->d, x->k_sl = c->h * c->d;
        x->v_sb = c->lk * c->h * c->dv, x->v_sh = c->dv, x->v_sl = c->h * c->dv;
    } else {
        x->q_sb = c->h * c->lq * c->d, x->q_sh = c->lq * c->d, x->q_sl = c->d;
        x->k_sb = c->h * c->lk * c->d, x->k_sh = c->lk * c->d, x->k_sl = c->d;
        x->v_sb = c->h * c->lk * c->dv, x->v_sh = c->lk * c->dv, x->v_sl = c->dv;
    }
    x->scale = (float)(1.0 / sqrt((double)c->d));
    x->out_dt = c->out_dt;
    m->out = alloc_dt(c->out_dt, (size_t)(c->b * c->h * c->lq * c->dv));
    x->out = m->out;
    if (c->mask) {
        size_t n = c->mask == 2 ? (size_t)(c->b * c->lk) : (size_t)(c->b * c->lq * c->lk);
        float *r = malloc(sizeof(float) * n);
        assert_non_null(r);
        tu_fill_random(r, n, seed + 3);
        for (size_t i = 0; i < n; i++) {
            r[i] *= 0.5f;
            if (i % 7 == 3) r[i] = -INFINITY; /* holes */
        }
        if (c->mask == 1 && c->lq > 2) /* one fully masked query row: zeros */
            for (int64_t j = 0; j < c->lk; j++) r[(size_t)(c->lq / 2) * (size_t)c->lk + (size_t)j] = -INFINITY;
        if (c->mask == 2 && c->lk > 3) /* a padded tail of keys */
            for (int64_t bi = 0; bi < c->b; bi++)
                for (int64_t j = c->lk - 3; j < c->lk; j++) r[bi * c->lk + j] = -INFINITY;
        m->mask = alloc_dt(c->mask_dt, n);
        cdf_convert(m->mask, c->mask_dt, r, CDF_F32, n);
        cdf_convert(r, CDF_F32, m->mask, c->mask_dt, n);
        m->mf = r;
        x->mask = m->mask;
        x->mask_dt = c->mask_dt;
        if (c->mask == 1) x->m_sb = c->lq * c->lk, x->m_sh = 0, x->m_sq = c->lk, x->m_sk = 1;
        if (c->mask == 2) x->m_sb = c->lk, x->m_sh = 0, x->m_sq = 0, x->m_sk = 1;
        if (c->mask == 3) x->m_sb = c->lq * c->lk, x->m_sh = 0, x->m_sq = 1, x->m_sk = c->lq; /* stored [Lk][Lq] */
    }
}

static void release(att_bufs *m) {
    free(m->q), free(m->k), free(m->v), free(m->mask), free(m->out);
    free(m->qf), free(m->kf), free(m->vf), free(m->mf);
}

/* bf16 round-to-nearest-even of a weight p >= 0 (via f32: a double exactly between two f32 values
 * next to a bf16 midpoint is an ambiguous key below anyway) */
static double bf16_round(double p) { return (double)cdf_bf16_to_f32(cdf_f32_to_bf16((float)p)); }

/* double reference of out[bi, hi, i, :] into ref[dv]; returns max |score| * (1) for the bound,
 * *dead = the row is fully masked. Under the bf16 policy (q, k, v bf16: kernels.h) the weights in
 * the numerator are P rounded to bf16 and the row sum takes the unrounded P; a key whose P lies
 * within relative eps_p of a bf16 rounding midpoint may round either way in a kernel whose P is
 * a few f32 ulps off: allow[e] (if given) gets sum over those keys of one bf16 ulp of P |v[e]| / l.
 * eps_p = (2 d + 16) u (mag + 1): the kernel's P is off by its score error (~d u mag in the
 * exponent, twice with the row max) and the 2^x polynomial (~1 ulp), bounded generously. */
static double ref_row(const att_bufs *m, int64_t bi, int64_t hi, int64_t i, double *ref, bool *dead, double *allow) {
    const cdf_k_attention_args *x = &m->x;
    double *s = malloc(sizeof(double) * (size_t)x->lk);
    assert_non_null(s);
    double mx = -INFINITY, mag = 0.0;
    for (int64_t j = 0; j < x->lk; j++) {
        double acc = 0.0, a = 0.0;
        for (int64_t e = 0; e < x->d; e++) {
            double p = (double)m->qf[bi * x->q_sb + hi * x->q_sh + i * x->q_sl + e] *
                       m->kf[bi * x->k_sb + hi * x->k_sh + j * x->k_sl + e];
            acc += p;
            a += fabs(p);
        }
        s[j] = acc * x->scale;
        if (a * x->scale > mag) mag = a * x->scale;
        if (x->mask) s[j] += m->mf[bi * x->m_sb + hi * x->m_sh + i * x->m_sq + j * x->m_sk];
        if (s[j] > mx) mx = s[j];
    }
    const bool round_p = cdf_k_attention_bf16_policy(x);
    const double eps_p = (2.0 * (double)x->d + 16.0) * U32 * (mag + 1.0);
    for (int64_t e = 0; e < x->dv; e++) ref[e] = 0.0;
    if (allow)
        for (int64_t e = 0; e < x->dv; e++) allow[e] = 0.0;
    *dead = mx == -INFINITY;
    if (!*dead) {
        /* the policy's P = 2^(s log2(e) - M), M an integer >= the row max: bf16 rounding then
         * depends on the scores alone (2^(mx log2(e) - M) scales the unrounded P, and cancels) */
        const double M = ceil(mx * LOG2E);
        double l = 0.0;
        for (int64_t j = 0; j < x->lk; j++) {
            const double p = round_p ? exp2(s[j] * LOG2E - M) : exp(s[j] - mx), pr = round_p ? bf16_round(p) : p;
            l += p;
            const float *v = m->vf + bi * x->v_sb + hi * x->v_sh + j * x->v_sl;
            for (int64_t e = 0; e < x->dv; e++) ref[e] += pr * v[e];
            /* ambiguous: rounding p up or down by eps_p gives different bf16 values */
            if (round_p && allow && bf16_round(p * (1.0 - eps_p)) != bf16_round(p * (1.0 + eps_p))) {
                const double ulp = bf16_round(p * (1.0 + eps_p)) - bf16_round(p * (1.0 - eps_p));
                for (int64_t e = 0; e < x->dv; e++) allow[e] += ulp * fabs(v[e]);
            }
        }
        for (int64_t e = 0; e < x->dv; e++) ref[e] /= l;
        if (allow)
            for (int64_t e = 0; e < x->dv; e++) allow[e] /= l;
    }
    free(s);
    return mag;
}

/* Runs the fast kernel at `isa` (must be handled) and checks it against the double reference
 * and (unless sampled) the reference kernel. */
static void check_case(const att_case *c, cdf_k_isa isa, uint64_t seed) {
    att_bufs m;
    setup(c, &m, seed);
    const cdf_k_attention_args *x = &m.x;
    bool handled = false;
    assert_int_equal(cdf_k_attention_fast_at(x, isa, &handled), CDF_OK);
    if (!handled) fail_msg("fast attention (%s) declined lq=%lld lk=%lld d=%lld", cdf_k_isa_name(isa), (long long)c->lq,
                           (long long)c->lk, (long long)c->d);
    const size_t no = (size_t)(c->b * c->h * c->lq * c->dv);
    float *got = malloc(sizeof(float) * no), *want = NULL;
    assert_non_null(got);
    cdf_convert(got, CDF_F32, m.out, c->out_dt, no);
    if (!c->sample) {
        want = malloc(sizeof(float) * no);
        assert_non_null(want);
        assert_int_equal(cdf_k_attention(x), CDF_OK);
        cdf_convert(want, CDF_F32, m.out, c->out_dt, no);
    }
    double vmax = 0.0;
    for (size_t i = 0; i < (size_t)(c->b * c->h * c->lk * c->dv); i++) vmax = fmax(vmax, fabs(m.vf[i]));
    double *ref = malloc(sizeof(double) * (size_t)c->dv), *allow = malloc(sizeof(double) * (size_t)c->dv);
    assert_non_null(ref);
    assert_non_null(allow);
    double worst = 0.0, worst_vs_kernel = 0.0;
    int64_t n_allow = 0;
    for (int64_t bi = 0; bi < c->b; bi++)
        for (int64_t hi = 0; hi < c->h; hi++)
            for (int64_t t = 0; t < (c->sample ? c->sample : c->lq); t++) {
                const int64_t i = c->sample ? (t * 7919 + 13 * hi) % c->lq : t;
                bool dead;
                const double mag = ref_row(&m, bi, hi, i, ref, &dead, allow);
                double tol = (double)(c->d + 8) * U32 * (mag + 1.0) * vmax + 1e-30;
                for (int64_t e = 0; e < c->dv; e++) {
                    const size_t idx = (size_t)(((bi * c->h + hi) * c->lq + i) * c->dv + e);
                    double tl = tol + allow[e] + (c->out_dt == CDF_BF16 ? fabs(ref[e]) / 256.0 * 1.0001 : 0.0);
                    if (allow[e] > 0.0) n_allow++;
                    const double err = fabs((double)got[idx] - ref[e]);
                    if (dead && got[idx] != 0.0f)
                        fail_msg("%s: fully masked row %lld gives %g, not 0", cdf_k_isa_name(isa), (long long)i, got[idx]);
                    if (!(err <= tl))
                        fail_msg("%s: out[%lld,%lld,%lld,%lld] = %.9g, double reference %.9g (|err| %.3g > %.3g); "
                                 "lq=%lld lk=%lld d=%lld dv=%lld mask=%d",
                                 cdf_k_isa_name(isa), (long long)bi, (long long)hi, (long long)i, (long long)e, got[idx],
                                 ref[e], err, tl, (long long)c->lq, (long long)c->lk, (long long)c->d, (long long)c->dv,
                                 c->mask);
                    worst = fmax(worst, err / tl);
                    if (want) {
                        const double ek = fabs((double)got[idx] - want[idx]);
                        if (!(ek <= 2.0 * tl)) fail_msg("%s: out[%zu] fast %.9g vs reference kernel %.9g", cdf_k_isa_name(isa),
                                                      idx, got[idx], want[idx]);
                        worst_vs_kernel = fmax(worst_vs_kernel, ek);
                    }
                }
            }
    printf("  %-11s b%lld h%lld lq%-4lld lk%-4lld d%-3lld dv%-3lld %s%s mask%d: worst err/tol %.3f, vs kernel %.3g%s\n",
           cdf_k_isa_name(isa), (long long)c->b, (long long)c->h, (long long)c->lq, (long long)c->lk, (long long)c->d,
           (long long)c->dv, cdf_dtype_name(c->qkv_dt), c->blhd ? " blhd" : "", c->mask, worst, worst_vs_kernel,
           n_allow ? " (outputs with ambiguous P roundings allowed for)" : "");
    free(allow);
    free(ref);
    free(got);
    free(want);
    release(&m);
}

static int levels(cdf_k_isa out[3]) {
    int n = 0;
    if (cdf_k_isa_native() >= CDF_K_ISA_AVX2) out[n++] = CDF_K_ISA_AVX2;
    if (cdf_k_isa_native() >= CDF_K_ISA_AVX512) out[n++] = CDF_K_ISA_AVX512;
    if (cdf_k_isa_native() >= CDF_K_ISA_AVX512_BF16) out[n++] = CDF_K_ISA_AVX512_BF16; /* vdpbf16ps for bf16 q/k/v */
    if (n == 0) printf("  [skip] CPU below AVX2: the fast attention declines\n");
    return n;
}

static const att_case CASES[] = {
    /* b h  lq   lk   d    dv   qkv       out       mask dt   mask blhd */
    {1, 1, 1, 1, 1, 1, CDF_F32, CDF_F32, CDF_F32, 0, false, 0},
    {1, 2, 5, 3, 17, 9, CDF_F32, CDF_F32, CDF_F32, 0, false, 0},
    {2, 3, 67, 131, 17, 33, CDF_F32, CDF_F32, CDF_F32, 0, true, 0},
    {1, 2, 130, 65, 64, 64, CDF_F32, CDF_F32, CDF_F32, 0, false, 0},
    {1, 2, 63, 200, 128, 128, CDF_F32, CDF_F32, CDF_F32, 0, true, 0},
    {2, 2, 65, 97, 64, 64, CDF_F32, CDF_F32, CDF_F32, 1, false, 0},
    {2, 3, 33, 70, 32, 48, CDF_F32, CDF_F32, CDF_F32, 2, true, 0},
    {1, 2, 17, 129, 24, 16, CDF_F32, CDF_F32, CDF_BF16, 1, false, 0},
    {1, 1, 40, 50, 16, 16, CDF_F32, CDF_F32, CDF_F32, 3, false, 0},
    {1, 2, 70, 90, 64, 64, CDF_BF16, CDF_BF16, CDF_F32, 0, false, 0},
    {1, 1, 129, 17, 8, 80, CDF_BF16, CDF_F32, CDF_F32, 2, true, 0},
    /* the bf16 policy (bf16 q/k/v): odd head dims (a zero pair member), odd key counts (a zero key
     * in the last pair), masks, strided q/k/v, bf16 out, FLUX's and SD3's head dims */
    {1, 1, 1, 1, 1, 1, CDF_BF16, CDF_F32, CDF_F32, 0, false, 0},
    {2, 3, 67, 131, 17, 33, CDF_BF16, CDF_F32, CDF_F32, 1, true, 0},
    {1, 2, 63, 201, 128, 128, CDF_BF16, CDF_F32, CDF_F32, 0, true, 0},
    {2, 2, 65, 97, 64, 64, CDF_BF16, CDF_BF16, CDF_BF16, 1, false, 0},
    {2, 3, 33, 70, 32, 48, CDF_BF16, CDF_F32, CDF_F32, 2, true, 0},
    {1, 1, 40, 51, 15, 16, CDF_BF16, CDF_F32, CDF_F32, 3, false, 0},
    /* the AMX body's shapes (head dims in 32-dim steps): dv 96 (4 + 2 column tiles of O), dv 32
     * (2), query rows past a 16-row tile, a transposed mask, bf16 out */
    {1, 2, 49, 130, 96, 96, CDF_BF16, CDF_F32, CDF_F32, 0, false, 0},
    {1, 3, 100, 150, 64, 32, CDF_BF16, CDF_BF16, CDF_F32, 3, true, 0},
};

/* bf16 q/k/v with a head dim the AMX body takes */
static bool amx_shape(const att_case *c) { return c->qkv_dt == CDF_BF16 && (c->d + 1) / 2 * 2 % 32 == 0; }

static void test_attention_cases(void **state) {
    (void)state;
    cdf_k_isa lv[3];
    const int nl = levels(lv);
    const int64_t runs0 = cdf_k_attention_amx_runs();
    int64_t amx_cases = 0;
    for (int l = 0; l < nl; l++)
        for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
            check_case(&CASES[i], lv[l], 100 + 10 * i);
            amx_cases += lv[l] == CDF_K_ISA_AVX512_BF16 && amx_shape(&CASES[i]);
        }
    /* where AMX is usable the avx512_bf16 level ran the AMX body on those shapes (checked above);
     * the vdpbf16ps body then runs them too, with the AMX body switched off */
    if (cdf_k_amx_usable()) {
        printf("  AMX usable: %lld cases ran the AMX body; now the vdpbf16ps body\n", (long long)amx_cases);
        assert_int_equal(cdf_k_attention_amx_runs() - runs0, amx_cases);
        assert_true(amx_cases >= 6);
        cdf_k_attention_amx_set(0);
        for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++)
            if (amx_shape(&CASES[i])) check_case(&CASES[i], CDF_K_ISA_AVX512_BF16, 100 + 10 * i);
        assert_int_equal(cdf_k_attention_amx_runs() - runs0, amx_cases);
        cdf_k_attention_amx_set(-1);
    } else {
        printf("  [skip] AMX not usable here: the AMX body is not run\n");
    }
}

/* 4100 tokens of self-attention (an SD3/FLUX 1024x1024 image is 4096 + text): sampled rows. */
static void test_attention_long(void **state) {
    (void)state;
    cdf_k_isa lv[3];
    const int nl = levels(lv);
    const att_case c = {1, 1, 4100, 4100, 64, 64, CDF_F32, CDF_F32, CDF_F32, 0, false, 24};
    const att_case cb = {1, 1, 4100, 4100, 128, 128, CDF_BF16, CDF_F32, CDF_F32, 0, false, 24};
    if (nl) check_case(&c, lv[nl - 1], 777);
    if (nl) check_case(&cb, lv[nl - 1], 778);
}

static void test_attention_declines_and_dispatch(void **state) {
    (void)state;
    float q[4] = {1, 0, 0, 1}, k[4] = {1, 0, 0, 1}, v[4] = {1, 2, 3, 4}, out[4];
    cdf_k_attention_args x = {.b = 1, .h = 1, .lq = 2, .lk = 2, .d = 2, .dv = 2, .q = q, .q_dt = CDF_F32, .q_sb = 4,
                              .q_sh = 4, .q_sl = 2, .k = k, .k_dt = CDF_F32, .k_sb = 4, .k_sh = 4, .k_sl = 2, .v = v,
                              .v_dt = CDF_F32, .v_sb = 4, .v_sh = 4, .v_sl = 2, .out = out, .out_dt = CDF_F32, .scale = 1.0f};
    bool handled = true;
    assert_int_equal(cdf_k_attention_fast(&x, NULL), CDF_ERR_INVALID_ARG);
    cdf_k_attention_args y = x;
    y.lk = 0; /* empty keys: left to the reference */
    assert_int_equal(cdf_k_attention_fast(&y, &handled), CDF_OK);
    assert_false(handled);
    y = x;
    y.q_dt = CDF_I32; /* not a float dtype: the reference reports it */
    assert_int_equal(cdf_k_attention_fast(&y, &handled), CDF_OK);
    assert_false(handled);
    assert_int_not_equal(cdf_k_attention_dispatch(&y), CDF_OK);
    /* through the dispatch (fast path or reference): softmax([1,0]) . v */
    assert_int_equal(cdf_k_attention_dispatch(&x), CDF_OK);
    const double e = exp(1.0), p0 = e / (e + 1.0), p1 = 1.0 / (e + 1.0);
    printf("  dispatch: %.7g %.7g %.7g %.7g (want %.7g %.7g %.7g %.7g)\n", out[0], out[1], out[2], out[3], p0 + 3 * p1,
           2 * p0 + 4 * p1, p1 + 3 * p0, 2 * p1 + 4 * p0);
    assert_true(fabs(out[0] - (p0 * 1 + p1 * 3)) < 1e-6 && fabs(out[1] - (p0 * 2 + p1 * 4)) < 1e-6);
    assert_true(fabs(out[2] - (p1 * 1 + p0 * 3)) < 1e-6 && fabs(out[3] - (p1 * 2 + p0 * 4)) < 1e-6);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention_cases),
        cmocka_unit_test(test_attention_long),
        cmocka_unit_test(test_attention_declines_and_dispatch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
