/* Fast matmul / conv2d paths (src/kernels/fast_onednn.c) against independent double-precision
 * references computed here, and against the reference kernels.
 *
 * Bounds (u = 2^-24, the f32 unit roundoff). For an output element let
 *   scale = |alpha| * sum_k |a_k b_k| + |bias| + |beta C_old|   (computed in double).
 * Every product of two bf16 values is exact in f32 and every f32 product is rounded once, so an
 * f32-accumulated dot product of length K is within gamma_(K+1) * scale of the exact value;
 * with the alpha multiply, the bias and the C add on top we allow (K + 4) * u * scale
 * (+ half an ulp of bf16 when C is bf16). The double references see exactly the operands the
 * fast path claims to use: for the f32 path the f32 inputs, for the bf16-weight path A rounded
 * to bf16 (round-to-nearest-even, as cdf_convert does) and the bf16 B. The f32 path is also
 * compared with the reference kernel (cdf_k_matmul / cdf_k_conv2d) within 1e-4 * scale.
 *
 * Under a lower ISA level (CDIFFUSERS_ISA=avx2|avx512|generic or such a CPU) the bf16-weight
 * cases run through cdf_k_matmul_dispatch / cdf_k_conv2d_dispatch instead and must still give
 * the bf16 policy's result (A rounded to bf16, f32 accumulation) within the same bounds.
 *
 * Every case asserts that the fast path actually ran (handled == true) where it claims support,
 * so a fast path that silently declines everything fails. On a CPU without AVX2+FMA (f32) or
 * AVX512-BF16/AMX-BF16 (bf16), or a build without oneDNN, the cases skip with a note; but when
 * the CPU has the feature and oneDNN is built in, the fast path must report itself available.
 *
 * Operand padding (ld > row length, gaps between batch matrices) is filled with NaN so that
 * any read of it shows up in the result; C's padding holds a sentinel that must survive; A and
 * B end exactly at their last element, so an overrun shows under ASan.
 *
 * Cases: f32 over (M, N, K) in {1, 3, 17, 64, 129, 300}^3 (minus the 10 largest products) with
 * trans flags / bias / alpha cycling; batched (per-batch, broadcast A or B, padded, beta = 1,
 * folded batch, >= 1024 rows); bf16 weights over half that grid (+ bf16 C, bf16 bias, padding)
 * and batched; bf16 rounding of A is exactly round-to-nearest-even; the prepack cache (reuse,
 * refresh on changed data at the same address, forget, full cap, cap 0); declines (f16, beta
 * 0.5, K = 0, bad lda, NULL handled) and dispatch; two threads at once; conv2d f32 and bf16
 * (stride, padding incl. unused trailing rows/columns, dilation, groups, depthwise, 1x1,
 * bf16 input / output) and its declines. */
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#include "cdiffusers/dtype.h"
#include "cdiffusers/io.h"
#include "kernels/cpu_features.h"
#include "kernels/dispatch.h"
#include "kernels/fast_onednn.h"
#include "kernels/gemm_bf16w.h"
#include "kernels/gemm_vdpbf16.h"
#include "kernels/kernels.h"
#include "kernels/pack_cache.h"

#define U32 (1.0 / 16777216.0)
#define SENTINEL 12345.0f

static cdf_k_fast_info info;
/* Set by need_bf16 when the ISA level (CPU or CDIFFUSERS_ISA) has no native bf16 kernels: the
 * bf16 cases then run through the dispatch, which must still compute the bf16 policy (A rounded
 * to bf16, f32 accumulation) with the widened-weight oneDNN f32 path or the reference kernel. */
static bool bf16_via_dispatch;
/* Set by the own-GEMM tests: mm_check runs cdf_k_gemm_bf16w (kernels/gemm_bf16w.c) instead. */
static bool via_own_gemm;
/* Set by the vdpbf16ps GEMM's tests: mm_check runs cdf_k_gemm_vdp_bf16 (kernels/gemm_vdpbf16.c). */
static bool via_vdp_gemm;

static bool isa_capped_by_env(void) {
    const char *a = getenv("ONEDNN_MAX_CPU_ISA"), *b = getenv("DNNL_MAX_CPU_ISA");
    return (a && *a) || (b && *b);
}

/* true = f32 fast path expected to run; skips (returns false) with a note otherwise. */
static bool need_f32(void) {
    cdf_k_fast_get_info(&info);
    if (cdf_k_reference_only()) {
        printf("  [skip] ISA level %s (CDIFFUSERS_ISA or the CPU): only the reference kernels run\n", info.level);
        return false;
    }
    if (!info.onednn_version[0]) {
        printf("  [skip] built without oneDNN: the fast paths decline everything\n");
        return false;
    }
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
        printf("  [skip] CPU lacks AVX2/FMA: the fast paths decline\n");
        return false;
    }
    if (isa_capped_by_env() && !info.available) {
        printf("  [skip] oneDNN's ISA is capped by ONEDNN_MAX_CPU_ISA/DNNL_MAX_CPU_ISA\n");
        return false;
    }
    assert_true(info.available); /* oneDNN is built in and the CPU qualifies */
    return true;
}

static bool need_bf16(void) {
    bf16_via_dispatch = false;
    if (cdf_k_isa_level() < CDF_K_ISA_AVX512_BF16) {
        cdf_k_fast_get_info(&info);
        printf("  [note] ISA level %s: bf16 cases run through the dispatch (emulated bf16 policy)\n", info.level);
        bf16_via_dispatch = true;
        return true;
    }
    if (!need_f32()) return false;
    bool cpu_has = (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16")) ||
                   __builtin_cpu_supports("amx-bf16");
    if (!cpu_has) {
        printf("  [skip] CPU lacks AVX512-BF16 and AMX-BF16: the bf16 fast paths decline\n");
        return false;
    }
    if (!info.bf16_supported && info.amx_bf16 && !info.amx_permitted && !info.avx512_bf16) {
        printf("  [skip] AMX present but the kernel refused tile permission\n");
        return false;
    }
    if (!info.bf16_supported && isa_capped_by_env()) {
        printf("  [skip] oneDNN's ISA is capped below bf16 by ONEDNN_MAX_CPU_ISA/DNNL_MAX_CPU_ISA\n");
        return false;
    }
    assert_true(info.bf16_supported);
    return true;
}

/* ---- matmul cases ------------------------------------------------------------------------- */

typedef struct mm_case {
    int64_t batch, M, N, K;
    bool ta, tb, bias, a_bcast, b_bcast;
    int pad;            /* extra elements per leading dimension and between batch matrices */
    float alpha, beta;
    cdf_dtype a_dt, b_dt, c_dt, bias_dt;
} mm_case;

typedef struct mm_bufs {
    cdf_k_matmul_args x;
    void *a, *b, *c, *bias;
    float *c_old;      /* C before the call (f32 view), for beta = 1 */
    size_t a_n, b_n, c_n;
    size_t c_guard; /* elements after C, sentinel-filled and checked: AMX tile stores (32 rows at a
                       time) are not seen by AddressSanitizer */
} mm_bufs;

static void fill_dt(void *p, cdf_dtype dt, size_t i, float v) { cdf_k_st(p, dt, (int64_t)i, v); }

/* Allocates operands laid out as the case says; valid elements random, padding NaN. */
static void mm_setup(const mm_case *cs, mm_bufs *m, uint64_t seed) {
    memset(m, 0, sizeof *m);
    cdf_k_matmul_args *x = &m->x;
    x->batch = cs->batch;
    x->M = cs->M;
    x->N = cs->N;
    x->K = cs->K;
    x->trans_a = cs->ta;
    x->trans_b = cs->tb;
    x->a_dt = cs->a_dt;
    x->b_dt = cs->b_dt;
    x->c_dt = cs->c_dt;
    x->alpha = cs->alpha;
    x->beta = cs->beta;
    const int64_t a_rows = cs->ta ? cs->K : cs->M, a_cols = cs->ta ? cs->M : cs->K;
    const int64_t b_rows = cs->tb ? cs->N : cs->K, b_cols = cs->tb ? cs->K : cs->N;
    x->lda = a_cols + cs->pad;
    x->ldb = b_cols + cs->pad;
    x->ldc = cs->N + cs->pad;
    const int64_t a_mat = a_rows * x->lda + cs->pad, b_mat = b_rows * x->ldb + cs->pad, c_mat = cs->M * x->ldc + cs->pad;
    x->sa = cs->a_bcast ? 0 : a_mat;
    x->sb = cs->b_bcast ? 0 : b_mat;
    x->sc = c_mat;
    const int64_t nba = cs->a_bcast ? 1 : cs->batch, nbb = cs->b_bcast ? 1 : cs->batch;
    /* A and B end at their last element (no slack after it), so ASan sees any overrun */
    m->a_n = (size_t)((nba - 1) * a_mat + (a_rows - 1) * x->lda + a_cols);
    m->b_n = (size_t)((nbb - 1) * b_mat + (b_rows - 1) * x->ldb + b_cols);
    m->c_n = (size_t)(cs->batch * c_mat);
    m->a = malloc(cdf_dtype_size(cs->a_dt) * m->a_n);
    m->b = malloc(cdf_dtype_size(cs->b_dt) * m->b_n);
    m->c_guard = (size_t)(32 * x->ldc + 64);
    m->c = malloc(cdf_dtype_size(cs->c_dt) * (m->c_n + m->c_guard));
    m->c_old = malloc(sizeof(float) * m->c_n);
    assert_non_null(m->a);
    assert_non_null(m->b);
    assert_non_null(m->c);
    assert_non_null(m->c_old);
    float *r = malloc(sizeof(float) * (m->a_n + m->b_n + m->c_n + (size_t)cs->N));
    assert_non_null(r);
    tu_fill_random(r, m->a_n + m->b_n + m->c_n + (size_t)cs->N, seed);
    for (size_t i = 0; i < m->a_n; i++) fill_dt(m->a, cs->a_dt, i, NAN);
    for (size_t i = 0; i < m->b_n; i++) fill_dt(m->b, cs->b_dt, i, NAN);
    for (size_t i = 0; i < m->c_n + m->c_guard; i++) fill_dt(m->c, cs->c_dt, i, SENTINEL);
    for (int64_t bi = 0; bi < nba; bi++)
        for (int64_t i = 0; i < a_rows; i++)
            for (int64_t j = 0; j < a_cols; j++) {
                size_t idx = (size_t)(bi * x->sa + i * x->lda + j);
                fill_dt(m->a, cs->a_dt, idx, r[idx]);
            }
    for (int64_t bi = 0; bi < nbb; bi++)
        for (int64_t i = 0; i < b_rows; i++)
            for (int64_t j = 0; j < b_cols; j++) {
                size_t idx = (size_t)(bi * x->sb + i * x->ldb + j);
                fill_dt(m->b, cs->b_dt, idx, r[m->a_n + idx]);
            }
    if (cs->beta != 0.0f)
        for (int64_t bi = 0; bi < cs->batch; bi++)
            for (int64_t i = 0; i < cs->M; i++)
                for (int64_t j = 0; j < cs->N; j++) {
                    size_t idx = (size_t)(bi * x->sc + i * x->ldc + j);
                    fill_dt(m->c, cs->c_dt, idx, r[m->a_n + m->b_n + idx]);
                }
    cdf_convert(m->c_old, CDF_F32, m->c, cs->c_dt, m->c_n);
    if (cs->bias) {
        x->bias_dt = cs->bias_dt;
        m->bias = malloc(cdf_dtype_size(cs->bias_dt) * (size_t)cs->N);
        assert_non_null(m->bias);
        for (int64_t j = 0; j < cs->N; j++) fill_dt(m->bias, cs->bias_dt, (size_t)j, r[m->a_n + m->b_n + m->c_n + j]);
    }
    free(r);
    x->a = m->a;
    x->b = m->b;
    x->c = m->c;
    x->bias = m->bias;
}

static void mm_free(mm_bufs *m) {
    free(m->a);
    free(m->b);
    free(m->c);
    free(m->c_old);
    free(m->bias);
}

/* Restores C to its state before a call (for a second run on the same buffers). */
static void mm_reset_c(mm_bufs *m) { cdf_convert(m->c, m->x.c_dt, m->c_old, CDF_F32, m->c_n); }

/* Double reference of element (bi, i, j); round_a: A as the bf16 fast path sees it. */
static double mm_ref(const mm_bufs *m, int64_t bi, int64_t i, int64_t j, bool round_a, double *scale) {
    const cdf_k_matmul_args *x = &m->x;
    double acc = 0.0, mag = 0.0;
    for (int64_t k = 0; k < x->K; k++) {
        int64_t ai = bi * x->sa + (x->trans_a ? k * x->lda + i : i * x->lda + k);
        int64_t bidx = bi * x->sb + (x->trans_b ? j * x->ldb + k : k * x->ldb + j);
        float av = cdf_k_ld(x->a, x->a_dt, ai);
        if (round_a) av = cdf_bf16_to_f32(cdf_f32_to_bf16(av));
        double p = (double)av * (double)cdf_k_ld(x->b, x->b_dt, bidx);
        acc += p;
        mag += fabs(p);
    }
    double v = (double)x->alpha * acc;
    mag *= fabs((double)x->alpha);
    if (x->bias) {
        double bv = cdf_k_ld(x->bias, x->bias_dt, j);
        v += bv;
        mag += fabs(bv);
    }
    if (x->beta != 0.0f) {
        double cv = m->c_old[bi * x->sc + i * x->ldc + j];
        v += cv;
        mag += fabs(cv);
    }
    *scale = mag;
    return v;
}

/* Runs the fast path (must be handled) and checks every element against the double reference;
 * with `vs_reference`, also against cdf_k_matmul within 1e-4 * scale. */
static void mm_check(mm_bufs *m, bool round_a, bool vs_reference, const char *what) {
    const cdf_k_matmul_args *x = &m->x;
    bool handled = false;
    if (via_vdp_gemm) {
        assert_int_equal(cdf_k_gemm_vdp_bf16(x, &handled), CDF_OK);
    } else if (via_own_gemm) {
        assert_int_equal(cdf_k_gemm_bf16w(x, &handled), CDF_OK);
    } else if (bf16_via_dispatch && x->b_dt == CDF_BF16) {
        assert_int_equal(cdf_k_matmul_dispatch(x), CDF_OK);
        handled = true;
    } else {
        assert_int_equal(cdf_k_matmul_fast(x, &handled), CDF_OK);
    }
    if (!handled) fail_msg("%s: fast matmul declined batch=%lld M=%lld N=%lld K=%lld", what, (long long)x->batch,
                           (long long)x->M, (long long)x->N, (long long)x->K);
    float *got = malloc(sizeof(float) * m->c_n), *want = NULL;
    assert_non_null(got);
    cdf_convert(got, CDF_F32, m->c, x->c_dt, m->c_n);
    const float sentinel = x->c_dt == CDF_BF16 ? cdf_bf16_to_f32(cdf_f32_to_bf16(SENTINEL)) : SENTINEL;
    if (vs_reference) {
        mm_reset_c(m);
        assert_int_equal(cdf_k_matmul(x), CDF_OK);
        want = malloc(sizeof(float) * m->c_n);
        assert_non_null(want);
        cdf_convert(want, CDF_F32, m->c, x->c_dt, m->c_n);
    }
    for (int64_t bi = 0; bi < x->batch; bi++)
        for (int64_t i = 0; i < x->M; i++) {
            for (int64_t j = 0; j < x->N; j++) {
                size_t idx = (size_t)(bi * x->sc + i * x->ldc + j);
                double scale, r = mm_ref(m, bi, i, j, round_a, &scale);
                double tol = (double)(x->K + 4) * U32 * scale + 1e-30;
                if (x->c_dt == CDF_BF16) tol += fabs(r) * (1.0 / 256.0) * 1.0001; /* half a bf16 ulp <= 2^-8 |v| */
                double err = fabs((double)got[idx] - r);
                if (!(err <= tol))
                    fail_msg("%s: C[%lld,%lld,%lld] = %.9g, double reference %.9g (|err| %.3g > tol %.3g); "
                             "batch=%lld M=%lld N=%lld K=%lld ta=%d tb=%d",
                             what, (long long)bi, (long long)i, (long long)j, got[idx], r, err, tol,
                             (long long)x->batch, (long long)x->M, (long long)x->N, (long long)x->K, x->trans_a,
                             x->trans_b);
                if (want && !(fabs((double)got[idx] - want[idx]) <= 1e-4 * scale + 1e-30))
                    fail_msg("%s: C[%lld,%lld,%lld] fast %.9g vs reference kernel %.9g (scale %.3g)", what,
                             (long long)bi, (long long)i, (long long)j, got[idx], want[idx], scale);
            }
            for (int64_t j = x->N; j < x->ldc; j++) /* padding between rows untouched */
                if (got[bi * x->sc + i * x->ldc + j] != sentinel)
                    fail_msg("%s: C padding [%lld,%lld,%lld] overwritten (%g); batch=%lld M=%lld N=%lld K=%lld ldc=%lld",
                             what, (long long)bi, (long long)i, (long long)j, got[bi * x->sc + i * x->ldc + j],
                             (long long)x->batch, (long long)x->M, (long long)x->N, (long long)x->K,
                             (long long)x->ldc);
        }
    for (size_t i = 0; i < m->c_guard; i++) /* nothing written past C's last element */
        if (cdf_k_ld(m->c, x->c_dt, (int64_t)(m->c_n + i)) != sentinel)
            fail_msg("%s: C's guard overwritten at %zu elements past its end; batch=%lld M=%lld N=%lld K=%lld", what, i,
                     (long long)x->batch, (long long)x->M, (long long)x->N, (long long)x->K);
    free(got);
    free(want);
}

static const int64_t SIZES[] = {1, 3, 17, 64, 129, 300};
enum { NSIZES = sizeof SIZES / sizeof SIZES[0] };
#define MAX_MNK 2500000 /* skips 10 of the 216 shapes, e.g. 300 x 300 x 300 */

/* (M, N, K) in SIZES^3 for f32 except the few largest products (Debug-build time), the trans
 * flags / bias / alpha cycling over the cases. */
static void test_matmul_f32_sizes(void **state) {
    (void)state;
    if (!need_f32()) return;
    int n = 0;
    for (int mi = 0; mi < NSIZES; mi++)
        for (int ni = 0; ni < NSIZES; ni++)
            for (int ki = 0; ki < NSIZES; ki++, n++) {
                if (SIZES[mi] * SIZES[ni] * SIZES[ki] > MAX_MNK) continue;
                mm_case cs = {.batch = 1, .M = SIZES[mi], .N = SIZES[ni], .K = SIZES[ki], .ta = n & 1,
                              .tb = (n >> 1) & 1, .bias = (n % 3) == 0, .alpha = (n % 5) == 0 ? 0.375f : 1.0f,
                              .a_dt = CDF_F32, .b_dt = CDF_F32, .c_dt = CDF_F32, .bias_dt = CDF_F32};
                mm_bufs m;
                mm_setup(&cs, &m, 1000 + n);
                mm_check(&m, false, true, "f32 sizes");
                mm_free(&m);
            }
}

/* Batched f32 (attention-like): per-batch A and B, broadcast A or B, padded leading dims and
 * batch gaps, beta = 1 accumulation, alpha with bias. */
static void test_matmul_f32_batched(void **state) {
    (void)state;
    if (!need_f32()) return;
    const mm_case cases[] = {
        {.batch = 3, .M = 17, .N = 64, .K = 33, .tb = true},                         /* q k^T */
        {.batch = 4, .M = 64, .N = 17, .K = 129, .pad = 5},                          /* p v, padded */
        {.batch = 2, .M = 300, .N = 3, .K = 17, .ta = true, .tb = true, .pad = 2, .bias = true, .alpha = 0.5f},
        {.batch = 3, .M = 5, .N = 7, .K = 9, .a_bcast = true, .pad = 1, .beta = 1.0f},
        {.batch = 3, .M = 5, .N = 7, .K = 9, .b_bcast = true, .bias = true, .beta = 1.0f, .alpha = 2.0f},
        {.batch = 5, .M = 64, .N = 129, .K = 64, .b_bcast = true, .bias = true},      /* folds into M */
        {.batch = 2, .M = 3, .N = 300, .K = 1, .ta = true, .b_bcast = true, .pad = 3}, /* weight shared, A strided */
        {.batch = 1, .M = 129, .N = 64, .K = 300, .beta = 1.0f, .bias = true, .alpha = -1.5f, .pad = 4},
        /* >= 1024 rows: B is reordered into oneDNN's blocked layout per call */
        {.batch = 1, .M = 1100, .N = 129, .K = 17, .tb = true, .bias = true, .pad = 1},
        {.batch = 4, .M = 300, .N = 64, .K = 17, .b_bcast = true, .alpha = 0.5f, .bias = true}, /* folds to 1200 */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mm_case cs = cases[i];
        if (cs.alpha == 0.0f) cs.alpha = 1.0f;
        cs.a_dt = cs.b_dt = cs.c_dt = cs.bias_dt = CDF_F32;
        mm_bufs m;
        mm_setup(&cs, &m, 2000 + i);
        mm_check(&m, false, true, "f32 batched");
        mm_free(&m);
    }
    /* bf16 activations with f32 weights: A widened to f32 (exactly), f32 compute */
    mm_case cs = {.batch = 2, .M = 33, .N = 17, .K = 65, .ta = true, .bias = true, .alpha = 1.0f, .pad = 1,
                  .a_dt = CDF_BF16, .b_dt = CDF_F32, .c_dt = CDF_F32, .bias_dt = CDF_BF16};
    mm_bufs m;
    mm_setup(&cs, &m, 2100);
    mm_check(&m, false, true, "bf16 A x f32 B");
    mm_free(&m);
}

/* bf16 weights, f32 activations (the default compute): A rounded to bf16 at the input. */
static void test_matmul_bf16_weights(void **state) {
    (void)state;
    if (!need_bf16()) return;
    cdf_k_fast_reset_stats();
    int n = 0;
    for (int mi = 0; mi < NSIZES; mi++)
        for (int ni = 0; ni < NSIZES; ni++)
            for (int ki = 0; ki < NSIZES; ki += 1, n++) {
                /* half the grid keeps the Debug run short */
                if ((mi + ni + ki) % 2 || SIZES[mi] * SIZES[ni] * SIZES[ki] > MAX_MNK) continue;
                mm_case cs = {.batch = 1, .M = SIZES[mi], .N = SIZES[ni], .K = SIZES[ki], .ta = (n >> 1) & 1,
                              .tb = !(n & 1), .bias = (n % 3) == 0, .alpha = (n % 7) == 0 ? 0.25f : 1.0f,
                              .a_dt = CDF_F32, .b_dt = CDF_BF16, .c_dt = (n % 4) == 1 ? CDF_BF16 : CDF_F32,
                              .bias_dt = (n % 2) ? CDF_BF16 : CDF_F32, .pad = n % 3};
                mm_bufs m;
                mm_setup(&cs, &m, 3000 + n);
                mm_check(&m, true, false, "bf16 weights");
                mm_free(&m);
            }
    const mm_case batched[] = {
        {.batch = 3, .M = 17, .N = 64, .K = 33, .tb = true, .pad = 2},
        {.batch = 2, .M = 64, .N = 17, .K = 129, .ta = true, .bias = true, .alpha = 0.5f},
        {.batch = 4, .M = 3, .N = 5, .K = 7, .b_bcast = true, .beta = 1.0f, .bias = true},
        {.batch = 3, .M = 9, .N = 5, .K = 64, .a_bcast = true, .pad = 1},
    };
    for (size_t i = 0; i < sizeof batched / sizeof batched[0]; i++) {
        mm_case cs = batched[i];
        if (cs.alpha == 0.0f) cs.alpha = 1.0f;
        cs.a_dt = CDF_F32;
        cs.b_dt = CDF_BF16;
        cs.c_dt = CDF_F32;
        cs.bias_dt = CDF_F32;
        mm_bufs m;
        mm_setup(&cs, &m, 4000 + i);
        mm_check(&m, true, false, "bf16 batched");
        mm_free(&m);
    }
    /* bf16 activations too (no rounding needed) */
    mm_case cs = {.batch = 1, .M = 129, .N = 64, .K = 300, .tb = true, .bias = true, .alpha = 1.0f,
                  .a_dt = CDF_BF16, .b_dt = CDF_BF16, .c_dt = CDF_BF16, .bias_dt = CDF_BF16};
    mm_bufs m;
    mm_setup(&cs, &m, 4100);
    mm_check(&m, true, false, "bf16 x bf16 -> bf16");
    mm_free(&m);
    cdf_k_fast_stats st;
    cdf_k_fast_get_stats(&st);
    printf("  bf16-weight matmuls run by oneDNN: %lld (declined %lld), ISA level %s\n", (long long)st.matmul_handled,
           (long long)st.matmul_declined, info.level);
    /* above generic, the widened-weight f32 path (or the native bf16 one) must have run them */
    if (!cdf_k_reference_only() && info.available) assert_true(st.matmul_handled > 0);
}

/* With K = 1 and B = 1 the product is A as the fast path rounded it: it must be exactly
 * round-to-nearest-even of A (ties to even, not truncation, not ties away). */
static void test_matmul_bf16_rounding_is_rne(void **state) {
    (void)state;
    if (!need_bf16()) return;
    const float eps = 1.0f / 256.0f; /* 2^-8: half a bf16 ulp at 1.0 */
    const float vals[] = {1.0f + eps,             /* tie -> even (1.0) */
                          1.0f + 3 * eps,         /* tie -> even (1 + 2^-6) */
                          1.0f + eps * 1.25f,     /* above half -> up */
                          1.0f + eps * 0.75f,     /* below half -> down */
                          -(1.0f + eps * 1.25f),  /* negative, up in magnitude */
                          3.14159265f, -2.71828182f, 1e-3f, 65504.5f};
    enum { NV = sizeof vals / sizeof vals[0] };
    const int64_t M = 32;
    float a[32];
    for (int i = 0; i < M; i++) a[i] = vals[i % NV] * (i < NV ? 1.0f : (float)(i + 1));
    uint16_t one = cdf_f32_to_bf16(1.0f);
    float c[32];
    cdf_k_matmul_args x = {.batch = 1, .M = M, .N = 1, .K = 1, .a = a, .a_dt = CDF_F32, .lda = 1,
                           .b = &one, .b_dt = CDF_BF16, .ldb = 1, .c = c, .c_dt = CDF_F32, .ldc = 1, .alpha = 1.0f};
    bool handled = bf16_via_dispatch;
    if (bf16_via_dispatch)
        assert_int_equal(cdf_k_matmul_dispatch(&x), CDF_OK);
    else
        assert_int_equal(cdf_k_matmul_fast(&x, &handled), CDF_OK);
    assert_true(handled);
    for (int i = 0; i < M; i++) {
        /* RNE by hand: independent of the library's converter */
        uint32_t u;
        memcpy(&u, &a[i], 4);
        uint32_t lsb = (u >> 16) & 1u, r = (u + 0x7fffu + lsb) & 0xffff0000u;
        float want;
        memcpy(&want, &r, 4);
        if (c[i] != want) fail_msg("A[%d] = %.9g: fast path used %.9g, round-to-nearest-even is %.9g", i, a[i], c[i], want);
    }
}

/* Prepacked bf16 weights: packed once, reused, refreshed when the data at the address
 * changes, forgotten on request, and a cap of 0 falls back to per-call reorders. */
static void test_matmul_bf16_prepack(void **state) {
    (void)state;
    if (!need_bf16()) return;
    if (bf16_via_dispatch) {
        printf("  [skip] prepacking of native bf16 weights: not at this ISA level\n");
        return;
    }
    cdf_k_fast_clear();
    cdf_k_pack_set_limit((size_t)64 << 20);
    mm_case cs = {.batch = 1, .M = 17, .N = 129, .K = 64, .tb = true, .bias = true, .alpha = 1.0f,
                  .a_dt = CDF_F32, .b_dt = CDF_BF16, .c_dt = CDF_F32, .bias_dt = CDF_F32};
    mm_bufs m;
    mm_setup(&cs, &m, 5000);
    cdf_k_fast_stats st;
    cdf_k_fast_reset_stats();
    mm_check(&m, true, false, "prepack first use");
    cdf_k_fast_get_stats(&st);
    /* bf16 dot-product kernels need B in a K-pair-interleaved layout: a packed copy exists */
    assert_int_equal(st.packs, 1);
    assert_int_equal(st.packed_weights, 1);
    assert_true(st.packed_bytes >= 64 * 129 * 2);
    printf("  bf16 matmul implementation: %s\n", st.last_impl);

    mm_check(&m, true, false, "prepack reuse");
    cdf_k_fast_get_stats(&st);
    assert_int_equal(st.packs, 1);
    assert_int_equal(st.repacks, 0);

    /* new contents at the same address: the sampled checksum notices, the copy is refreshed */
    uint16_t *b = m.b;
    for (size_t i = 0; i < m.b_n; i++) b[i] = cdf_f32_to_bf16(-0.5f * cdf_bf16_to_f32(b[i]) + 0.125f);
    mm_check(&m, true, false, "prepack after change");
    cdf_k_fast_get_stats(&st);
    assert_int_equal(st.repacks, 1);

    /* a freed buffer's copy is dropped (before the next lookup); the next use packs again. The
     * range covers b: a view inside a freed buffer loses its copy too. */
    cdf_k_pack_forget_range((const char *)m.b - 64, m.b_n * 2 + 64);
    mm_check(&m, true, false, "prepack after forget");
    cdf_k_fast_get_stats(&st);
    assert_int_equal(st.packs, 2);
    assert_int_equal(st.packed_weights, 1);
    assert_int_equal(st.repacks, 1); /* a fresh copy, not a refresh of the old one */

    /* a cap too small for the copy: the weights are reordered per call, results stay right */
    cdf_k_fast_clear();
    cdf_k_pack_set_limit(1);
    cdf_k_fast_reset_stats();
    mm_check(&m, true, false, "prepack cap full");
    cdf_k_fast_get_stats(&st);
    assert_int_equal(st.packs, 0);
    assert_int_equal(st.packed_weights, 0);
    assert_int_equal(st.unpacked_reorders, 1);

    /* cap 0 (prepacking off): few rows use B as it is, many rows reorder it per call */
    cdf_k_pack_set_limit(0);
    cdf_k_fast_reset_stats();
    mm_check(&m, true, false, "no prepack, 17 rows");
    cdf_k_fast_get_stats(&st);
    assert_int_equal(st.packs, 0);
    assert_int_equal(st.unpacked_reorders, 0);
    mm_free(&m);
    cs.M = 1100;
    cs.K = 33;
    mm_setup(&cs, &m, 5001);
    mm_check(&m, true, false, "no prepack, 1100 rows");
    cdf_k_fast_get_stats(&st);
    assert_int_equal(st.packs, 0);
    assert_int_equal(st.unpacked_reorders, 1);
    cdf_k_pack_set_limit((size_t)64 << 20);
    mm_free(&m);
}

/* ---- quantized weights decoded into oneDNN's layout ------------------------------------------ */

/* cdf_k_matmul_q with bf16 decoding, where oneDNN runs it, writes the decoded rows straight into
 * the primitive's weight layout (cdf_k_matmul_fast_filled) instead of a plain panel that oneDNN
 * then reorders. Its result must equal bit for bit the plain path's: the gguf decode of every row
 * rounded to bf16 into a plain [N, K] matrix, multiplied panel by panel (matmul_quant.c's
 * partition: equal panels of about its byte bound, a multiple of 64 rows) through cdf_k_matmul_dispatch as a transient B. Weights are random
 * Q8_0 and Q4_K (varied f16 scales) and A random, so every misplaced weight element changes the
 * result; N = 100 leaves padding in oneDNN's 64-wide blocks. M below REORDER_B_MIN_M (1024)
 * mostly keeps B's plain layout, M above it gets oneDNN's blocked layout. At a level where oneDNN
 * does not run the panel (avx2: the own GEMM; f32 A without native bf16: declined) the plain path
 * runs and the same equality holds trivially. */
/* the decode panel bound in force (cdf_k_matmul_q_set_panel_bytes), bf16 panels here */
static size_t g_q_panel_bytes = (size_t)128 << 20;

static void q_direct_case(uint32_t qtype, int64_t M, int64_t N, int64_t K, cdf_dtype a_dt, uint64_t seed) {
    int64_t be = 0, bb = 0;
    assert_true(cdf_ggml_type_block(qtype, &be, &bb));
    const int64_t nb = K / be;
    uint8_t *w = malloc((size_t)(N * nb * bb));
    float *af = malloc(sizeof(float) * (size_t)(M * K)), *bias = malloc(sizeof(float) * (size_t)N);
    float *row = malloc(sizeof(float) * (size_t)K);
    uint16_t *wb = malloc(sizeof(uint16_t) * (size_t)(N * K));
    void *a = malloc(cdf_dtype_size(a_dt) * (size_t)(M * K));
    float *c = malloc(sizeof(float) * (size_t)(M * N)), *c_ref = malloc(sizeof(float) * (size_t)(M * N));
    assert_true(w && af && bias && row && wb && a && c && c_ref);
    uint64_t x = seed;
#define NEXT() (x = x * 6364136223846793005ull + 1442695040888963407ull, (uint32_t)(x >> 33))
    /* random blocks whose f16 scales (Q8_0: d; Q4_K: d, dmin) lie in [2^-8, 2^-6) */
    for (int64_t i = 0; i < N * nb; i++) {
        uint8_t *blk = w + i * bb;
        for (int64_t j = 0; j < bb; j++) blk[j] = (uint8_t)NEXT();
        for (int j = 0; j < (qtype == CDF_GGML_Q4_K ? 2 : 1); j++) {
            const uint16_t d = (uint16_t)(0x1C00 + NEXT() % 0x800);
            blk[2 * j] = (uint8_t)(d & 0xff), blk[2 * j + 1] = (uint8_t)(d >> 8);
        }
    }
    for (int64_t i = 0; i < M * K; i++) af[i] = (float)((int)(NEXT() % 20001) - 10000) * 1e-4f;
    for (int64_t n = 0; n < N; n++) bias[n] = (float)((int)(NEXT() % 2001) - 1000) * 1e-3f;
    cdf_convert(a, a_dt, af, CDF_F32, (size_t)(M * K));
#undef NEXT
    for (int64_t n = 0; n < N; n++) {
        assert_int_equal(cdf_ggml_dequantize(qtype, w + n * nb * bb, K, row), CDF_OK);
        for (int64_t k = 0; k < K; k++) wb[n * K + k] = cdf_f32_to_bf16(row[k]);
    }
    /* matmul_quant.c's partition: equal panels of about g_q_panel_bytes, rounded up to 64 rows */
    const int64_t panel_elems = (int64_t)(g_q_panel_bytes / 2), n_parts = (N * K + panel_elems - 1) / panel_elems;
    int64_t panel = (N + n_parts - 1) / n_parts;
    panel = n_parts == 1 ? N : (panel + 63) / 64 * 64;
    for (int64_t n0 = 0; n0 < N; n0 += panel) {
        const int64_t np = N - n0 < panel ? N - n0 : panel;
        cdf_k_matmul_args r = {.batch = 1, .M = M, .N = np, .K = K, .a = a, .a_dt = a_dt, .lda = K,
                               .b = wb + n0 * K, .b_dt = CDF_BF16, .ldb = K, .trans_b = true,
                               .bias = bias + n0, .bias_dt = CDF_F32, .c = c_ref + n0, .c_dt = CDF_F32, .ldc = N,
                               .alpha = 1.0f, .b_transient = true};
        assert_int_equal(cdf_k_matmul_dispatch(&r), CDF_OK);
    }
    const int64_t n_panels = (N + panel - 1) / panel;

    cdf_k_fast_stats s0, s1;
    cdf_k_fast_get_stats(&s0);
    cdf_k_matmul_q_args q = {.M = M, .N = N, .K = K, .a = a, .a_dt = a_dt, .w = w, .qtype = qtype,
                             .w_dt = CDF_BF16, .bias = bias, .bias_dt = CDF_F32, .c = c, .c_dt = CDF_F32};
    assert_int_equal(cdf_k_matmul_q(&q), CDF_OK);
    cdf_k_fast_get_stats(&s1);
    int64_t wrong = 0;
    for (int64_t i = 0; i < M * N; i++)
        if (memcmp(&c[i], &c_ref[i], sizeof(float)) != 0 && wrong++ < 3)
            print_error("%s M %lld N %lld K %lld A %s: c[%lld, %lld] = %.9g, plain panel gives %.9g\n",
                        cdf_ggml_type_name(qtype), (long long)M,
                        (long long)N, (long long)K, cdf_dtype_name(a_dt), (long long)(i / N), (long long)(i % N),
                        (double)c[i], (double)c_ref[i]);
    assert_int_equal(wrong, 0);

    /* the direct path must be the one that ran where oneDNN takes the panel: one fill per panel,
     * and no per-call reorder of a plain panel */
    cdf_k_fast_get_info(&info);
    const bool direct = info.available && cdf_k_isa_level() > CDF_K_ISA_AVX2 && (info.bf16_supported || a_dt == CDF_BF16);
    assert_int_equal(s1.direct_fills - s0.direct_fills, direct ? n_panels : 0);
    if (direct) assert_int_equal(s1.unpacked_reorders, s0.unpacked_reorders);
    free(w), free(af), free(bias), free(row), free(wb), free(a), free(c), free(c_ref);
}

/* A plain bf16 B [N, K] (row-major, op(B) = B^T) written at the layout's offsets. */
typedef struct plain_b {
    const uint16_t *b;
    int64_t N, K;
    int calls;
} plain_b;

static cdf_status fill_plain_b(void *ctx, void *dst, const cdf_k_fast_b_layout *l) {
    plain_b *p = ctx;
    assert_int_equal(l->N, p->N);
    assert_int_equal(l->K, p->K);
    for (int64_t n = 0; n < l->N; n++)
        for (int64_t k = 0; k < l->K; k++) {
            char *d = (char *)dst + l->off_n[n] + l->off_k[k];
            const uint16_t v = p->b[n * p->K + k];
            if (l->dt == CDF_BF16) memcpy(d, &v, 2);
            else *(float *)d = cdf_bf16_to_f32(v);
        }
    p->calls++;
    return CDF_OK;
}

/* cdf_k_matmul_fast_filled itself, with an odd K (quantized weights never have one): oneDNN's
 * bf16 layout pairs k values, and the padding element of the last pair is read by the kernel, so
 * it must be zero. The workspace it lands in is first filled with NaN by a K = 64 call, so a
 * padding element left unwritten poisons the outputs. */
static void test_matmul_fast_filled_padding(void **state) {
    (void)state;
    if (!need_bf16() || bf16_via_dispatch) return;
    const int64_t M = 1100, N = 100, K = 41;
    float *a = malloc(sizeof(float) * (size_t)(M * K)), *c = malloc(sizeof(float) * (size_t)(M * N));
    float *c_ref = malloc(sizeof(float) * (size_t)(M * N));
    uint16_t *b = malloc(sizeof(uint16_t) * (size_t)(N * 64)), *nan_b = malloc(sizeof(uint16_t) * (size_t)(N * 64));
    assert_true(a && c && c_ref && b && nan_b);
    for (int64_t i = 0; i < M * K; i++) a[i] = (float)((int)(i * 7919 % 2001) - 1000) * 1e-3f;
    for (int64_t i = 0; i < N * 64; i++) b[i] = cdf_f32_to_bf16((float)((int)(i * 104729 % 201) - 100) * 1e-2f), nan_b[i] = 0x7fc0;
    cdf_k_matmul_args x = {.batch = 1, .M = M, .N = N, .K = 64, .a = a, .a_dt = CDF_F32, .lda = 64, .b_dt = CDF_BF16,
                           .ldb = 64, .trans_b = true, .c = c, .c_dt = CDF_F32, .ldc = N, .alpha = 1.0f,
                           .b_transient = true};
    float *a64 = calloc((size_t)(M * 64), sizeof(float));
    assert_non_null(a64);
    x.a = a64;
    plain_b p = {.b = nan_b, .N = N, .K = 64};
    bool handled = false;
    assert_int_equal(cdf_k_matmul_fast_filled(&x, fill_plain_b, &p, &handled), CDF_OK); /* workspace: NaN */
    assert_true(handled);
    x.a = a, x.K = K, x.lda = K, x.ldb = K;
    p = (plain_b){.b = b, .N = N, .K = K};
    handled = false;
    assert_int_equal(cdf_k_matmul_fast_filled(&x, fill_plain_b, &p, &handled), CDF_OK);
    assert_true(handled);
    assert_int_equal(p.calls, 1);
    cdf_k_matmul_args r = x;
    r.b = b, r.c = c_ref;
    assert_int_equal(cdf_k_matmul_dispatch(&r), CDF_OK);
    int64_t wrong = 0;
    for (int64_t i = 0; i < M * N; i++)
        if (memcmp(&c[i], &c_ref[i], sizeof(float)) != 0 && wrong++ < 3)
            print_error("filled K = 41: c[%lld] = %.9g, plain B gives %.9g\n", (long long)i, (double)c[i], (double)c_ref[i]);
    assert_int_equal(wrong, 0);
    free(a), free(a64), free(c), free(c_ref), free(b), free(nan_b);
}

static void test_matmul_q_direct_layout(void **state) {
    (void)state;
    cdf_k_matmul_q_set_own_gemm(0); /* the panels: bit for bit the plain matmul */
    cdf_k_matmul_q_set_int8(0);
    cdf_k_fast_stats s0, s1;
    cdf_k_fast_get_stats(&s0);
    const uint32_t q8 = CDF_GGML_Q8_0;
    q_direct_case(q8, 3, 100, 96, CDF_F32, 1);
    q_direct_case(q8, 1100, 100, 96, CDF_F32, 2);    /* blocked layout, N padded */
    q_direct_case(q8, 1024, 300, 256, CDF_BF16, 3);  /* bf16 A (widened f32 B where bf16 is emulated) */
    q_direct_case(q8, 17, 100, 3072, CDF_BF16, 4);
    q_direct_case(q8, 1030, 100, 3072, CDF_F32, 5);
    q_direct_case(q8, 1030, 4100, 4096, CDF_F32, 7); /* one panel at the default bound */
    cdf_k_matmul_q_set_panel_bytes(g_q_panel_bytes = (size_t)32 << 20);
    q_direct_case(q8, 2, 4100, 4096, CDF_F32, 6);    /* two panels: 2112 rows + 1988 */
    q_direct_case(q8, 1030, 4100, 4096, CDF_F32, 7);
    cdf_k_matmul_q_set_panel_bytes(g_q_panel_bytes = 0);
    g_q_panel_bytes = (size_t)128 << 20;
    q_direct_case(CDF_GGML_Q4_K, 1100, 70, 1280, CDF_F32, 8); /* 256-value blocks, K past one decode tile */
    cdf_k_fast_get_stats(&s1);
    assert_int_equal(s1.packs, s0.packs); /* decoded panels are never kept prepacked */
    cdf_k_matmul_q_set_own_gemm(-1);
    cdf_k_matmul_q_set_int8(-1);
}

/* ---- the own AVX512-BF16 GEMM on Q8_0 weights (matmul_quant.c) ------------------------------- */

/* Its result against the policy's numbers computed here in double: A rounded to bf16, every Q8_0
 * weight decoded by cdf_ggml_dequantize (gguf-py's values) and rounded to bf16, exact products,
 * the bias after the sum. It sums in f32 in its own order: each element must lie within 4e-6 of
 * the sum of |products| (f32 summation over K <= 1100 stays far below that; a weight or A value
 * in the wrong place, a lost k chunk or a missing bias moves an element by ~1e-3 of it). Shapes
 * cover a partial row group and MC block (M), a partial column slab (N), a partial k chunk (K),
 * bf16 A and bias, no bias. Where the own GEMM applies (GCC build, AVX512-BF16 level; with AMX
 * where AMX is usable, GCC 11+) it must be the one that ran: no fill of oneDNN's layout; without
 * AMX outside its M range (128-1023), with AMX below 128, and at an N not a multiple of 32, the
 * panels run (one fill). */
/* set where AMX runs both: the own GEMM's result must also equal the bf16 weights' bit for bit */
static bool q8_same_as_bf16;

static void q8_own_case(int64_t M, int64_t N, int64_t K, cdf_dtype a_dt, int bias_kind /* 0 none, 1 f32, 2 bf16 */,
                        uint64_t seed, int expect /* 1: the own GEMM ran, 2: the panels ran (oneDNN fills), 0: either */) {
    const int64_t nb = K / 32;
    uint8_t *w = malloc((size_t)(N * nb * 34));
    float *af = malloc(sizeof(float) * (size_t)(M * K)), *wf = malloc(sizeof(float) * (size_t)(N * K));
    float *bias = malloc(sizeof(float) * (size_t)N), *c = malloc(sizeof(float) * (size_t)(M * N));
    void *a = malloc(cdf_dtype_size(a_dt) * (size_t)(M * K)), *bias_x = malloc(sizeof(float) * (size_t)N);
    assert_true(w && af && wf && bias && c && a && bias_x);
    uint64_t x = seed;
#define NEXT() (x = x * 6364136223846793005ull + 1442695040888963407ull, (uint32_t)(x >> 33))
    for (int64_t i = 0; i < N * nb; i++) { /* random int8 values, f16 scales in [2^-8, 2^-5) */
        uint8_t *blk = w + i * 34;
        for (int j = 2; j < 34; j++) blk[j] = (uint8_t)NEXT();
        const uint16_t d = (uint16_t)(0x1C00 + NEXT() % 0xC00);
        blk[0] = (uint8_t)(d & 0xff), blk[1] = (uint8_t)(d >> 8);
    }
    for (int64_t i = 0; i < M * K; i++) af[i] = (float)((int)(NEXT() % 20001) - 10000) * 1.2345e-4f;
    for (int64_t n = 0; n < N; n++) bias[n] = (float)((int)(NEXT() % 2001) - 1000) * 1e-2f;
#undef NEXT
    cdf_convert(a, a_dt, af, CDF_F32, (size_t)(M * K));
    cdf_convert(bias_x, bias_kind == 2 ? CDF_BF16 : CDF_F32, bias, CDF_F32, (size_t)N);
    cdf_convert(af, CDF_F32, a, a_dt, (size_t)(M * K)); /* A as given (bf16 A: exact) */
    assert_int_equal(cdf_ggml_dequantize(CDF_GGML_Q8_0, w, N * K, wf), CDF_OK);
    for (int64_t i = 0; i < M * K; i++) af[i] = cdf_bf16_to_f32(cdf_f32_to_bf16(af[i]));
    for (int64_t i = 0; i < N * K; i++) wf[i] = cdf_bf16_to_f32(cdf_f32_to_bf16(wf[i]));
    for (int64_t i = 0; i < M * N; i++) c[i] = NAN; /* every element must be written */

    cdf_k_fast_stats s0, s1;
    cdf_k_fast_get_stats(&s0);
    const cdf_k_matmul_q_args q = {.M = M, .N = N, .K = K, .a = a, .a_dt = a_dt, .w = w, .qtype = CDF_GGML_Q8_0,
                                   .w_dt = CDF_BF16, .bias = bias_kind ? bias_x : NULL,
                                   .bias_dt = bias_kind == 2 ? CDF_BF16 : CDF_F32, .c = c, .c_dt = CDF_F32};
    assert_int_equal(cdf_k_matmul_q(&q), CDF_OK);
    cdf_k_fast_get_stats(&s1);
    if (expect == 1) assert_int_equal(s1.direct_fills, s0.direct_fills);
    if (expect == 2) assert_int_equal(s1.direct_fills, s0.direct_fills + 1);
    int64_t wrong = 0;
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double sum = 0, mag = 0;
            for (int64_t k = 0; k < K; k++) {
                const double t = (double)af[m * K + k] * (double)wf[n * K + k];
                sum += t, mag += fabs(t);
            }
            if (bias_kind) sum += bias_kind == 2 ? (double)cdf_bf16_to_f32(cdf_f32_to_bf16(bias[n])) : (double)bias[n];
            const double got = c[m * N + n];
            if (!(fabs(got - sum) <= 4e-6 * mag + 1e-30) && wrong++ < 3)
                print_error("Q8_0 own M %lld N %lld K %lld: c[%lld, %lld] = %.9g, expected %.9g (|products| %.3g)\n",
                            (long long)M, (long long)N, (long long)K, (long long)m, (long long)n, got, sum, mag);
        }
    assert_int_equal(wrong, 0);
    if (q8_same_as_bf16 && expect == 1) {
        /* with AMX the same weights loaded as bf16 run the same kernel: the same bits */
        uint16_t *wb = malloc(sizeof(uint16_t) * (size_t)(N * K));
        float *c2 = malloc(sizeof(float) * (size_t)(M * N));
        assert_true(wb && c2);
        for (int64_t i = 0; i < N * K; i++) wb[i] = cdf_f32_to_bf16(wf[i]);
        const cdf_k_matmul_args x = {.batch = 1, .M = M, .N = N, .K = K, .a = a, .a_dt = a_dt, .lda = K, .b = wb,
                                     .b_dt = CDF_BF16, .ldb = K, .trans_b = true, .bias = bias_kind ? bias_x : NULL,
                                     .bias_dt = bias_kind == 2 ? CDF_BF16 : CDF_F32, .c = c2, .c_dt = CDF_F32, .ldc = N,
                                     .alpha = 1.0f};
        assert_int_equal(cdf_k_matmul_dispatch(&x), CDF_OK);
        if (memcmp(c, c2, sizeof(float) * (size_t)(M * N)) != 0)
            fail_msg("Q8_0 own M %lld N %lld K %lld: not the bf16 weights' result bit for bit", (long long)M, (long long)N,
                     (long long)K);
        free(wb), free(c2);
    }
    free(w), free(af), free(wf), free(bias), free(c), free(a), free(bias_x);
}

static void test_matmul_q8_own_gemm(void **state) {
    (void)state;
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    const bool amx = cdf_k_cpu()->amx_bf16;
    const bool own = cdf_k_isa_level() >= CDF_K_ISA_AVX512_BF16 && cdf_k_cpu()->avx512_bf16 &&
                     (!amx || (__GNUC__ >= 11 && cdf_k_amx_usable()));
#else
    const bool amx = false, own = false;
#endif
    if (!own) printf("  [note] the own Q8_0 GEMM does not apply here: the panels' results are checked instead\n");
    else printf("  micro-kernel: %s\n", amx ? "AMX tiles" : "vdpbf16ps");
    cdf_k_matmul_q_set_int8(0); /* the bf16 paths this test is about */
    const int yes = own ? 1 : 0, no = own ? 2 : 0; /* own: oneDNN's direct fill is the alternative here */
    const int range = amx ? yes : no;              /* with AMX it takes every M from 128 on */
    q8_same_as_bf16 = own && amx;
    q8_own_case(301, 288, 1056, CDF_F32, 1, 11, yes); /* 2 MC blocks + a partial group; 1 + 1/8 slabs; 2 + 1/16 chunks */
    q8_own_case(256, 64, 64, CDF_BF16, 2, 12, yes);   /* bf16 A and bias, K below one chunk */
    q8_own_case(260, 32, 512, CDF_F32, 0, 13, yes);   /* no bias, exactly one chunk */
    q8_own_case(127, 64, 96, CDF_F32, 1, 14, no);     /* below its M range: the panels (same check) */
    q8_own_case(1024, 64, 96, CDF_F32, 1, 16, range); /* above the vdpbf16ps range */
    q8_own_case(1023, 64, 96, CDF_F32, 1, 17, yes);   /* its top */
    q8_own_case(128, 64, 96, CDF_BF16, 1, 18, yes);   /* its bottom */
    q8_own_case(300, 80, 96, CDF_F32, 1, 15, no);     /* N not a multiple of 32: the panels */
    cdf_k_matmul_q_set_own_gemm(0);                   /* switched off: the panels */
    q8_same_as_bf16 = false;
    q8_own_case(301, 288, 1056, CDF_F32, 1, 11, no);
    cdf_k_matmul_q_set_own_gemm(-1);
    cdf_k_matmul_q_set_int8(-1);
}

/* ---- the int8 AVX512-VNNI GEMM on Q8_0 weights (matmul_quant.c, q8_int8) ---------------------
 *
 * Not the dequantized weights' numbers: A is quantized per row and 32-value block. Two checks
 * per element, with A's quantization recomputed here by its definition (f32 arithmetic, as the
 * kernel's lanes do: amax = max |a|, da = amax / 127, qa = nearest-even(a * (127 / amax))):
 *  1. the integer part is exact: against R_q = sum_b da_b dw_b S_b (+ bias) in double, with
 *     S_b = sum_k qa wq, |c - R_q| <= g (sum_b |da_b dw_b S_b| + |bias|), g = gamma(nb + 2) =
 *     (nb + 2) u / (1 - (nb + 2) u), u = 2^-24: the f32 product da * dw (one rounding), nb fma
 *     steps (the recursive sum's gamma(nb - 1) bound, one more for the scale), one for the bias
 *     (the int32 sums and their conversion to f32 are exact: |S_b| < 2^24). A weight or A value
 *     in the wrong place, a lost offset correction or a wrong scale moves an element by far more.
 *  2. against the exact product of the original A with the dequantized weights, R = sum_k a wf
 *     (+ bias) in double: |c - R| <= the bound of 1 + sum_k |wf_k| (da_b / 2 + 3.01 u |a_k|): the
 *     quantization error of a value, |a - qa da| <= |x - qa| da + |a - x da| with x = fl(a * fl(127 /
 *     amax)) and x da = a (1 + e1)(1 + e2)(1 + e3), |e| <= u. This is the tolerance the path
 *     carries, stated per element.
 * Both bounds get 1e-12 of the element's magnitude for the double reference's own rounding.
 * Shapes cover partial row groups (6 rows) and MC blocks (192), a partial column slab (256),
 * an odd block count and a partial k chunk (512), bf16 A, f32 / bf16 / no bias, an all-zero
 * block of A and one below 2^-96 (both count as zero; the bound then has |a| for their values),
 * a NaN in A (its row's outputs NaN, the rest untouched). */
static void q8_int8_case(int64_t M, int64_t N, int64_t K, cdf_dtype a_dt, int bias_kind /* 0 none, 1 f32, 2 bf16 */,
                         uint64_t seed, bool nan_row) {
    const int64_t nb = K / 32;
    uint8_t *w = malloc((size_t)(N * nb * 34));
    float *af = malloc(sizeof(float) * (size_t)(M * K)), *wf = malloc(sizeof(float) * (size_t)(N * K));
    float *bias = malloc(sizeof(float) * (size_t)N), *c = malloc(sizeof(float) * (size_t)(M * N));
    float *da = malloc(sizeof(float) * (size_t)(M * nb));
    int *qa = malloc(sizeof(int) * (size_t)(M * K));
    void *a = malloc(cdf_dtype_size(a_dt) * (size_t)(M * K)), *bias_x = malloc(sizeof(float) * (size_t)N);
    assert_true(w && af && wf && bias && c && da && qa && a && bias_x);
    uint64_t x = seed;
#define NEXT() (x = x * 6364136223846793005ull + 1442695040888963407ull, (uint32_t)(x >> 33))
    for (int64_t i = 0; i < N * nb; i++) { /* random int8 values (-128 included), f16 scales in [2^-8, 2^-5) */
        uint8_t *blk = w + i * 34;
        for (int j = 2; j < 34; j++) blk[j] = (uint8_t)NEXT();
        const uint16_t d = (uint16_t)(0x1C00 + NEXT() % 0xC00);
        blk[0] = (uint8_t)(d & 0xff), blk[1] = (uint8_t)(d >> 8);
    }
    /* A: values over 3 decades of magnitude, so blocks mix large and small */
    for (int64_t i = 0; i < M * K; i++) {
        const float v = (float)((int)(NEXT() % 20001) - 10000) * 1.2345e-4f;
        af[i] = NEXT() % 3 == 0 ? v * 1e-3f : v;
    }
    if (M > 1 && nb > 1)
        for (int64_t k = 32; k < 64; k++) af[1 * K + k] = 0.0f; /* row 1, block 1: all zero (da = 0) */
    if (M > 2)
        for (int64_t k = 0; k < 32; k++) af[2 * K + k] = (float)(k - 16) * 0x1p-110f; /* row 2, block 0: below 2^-96 */
    for (int64_t n = 0; n < N; n++) bias[n] = (float)((int)(NEXT() % 2001) - 1000) * 1e-2f;
#undef NEXT
    const int64_t nan_m = nan_row ? M / 2 : -1;
    if (nan_row) af[nan_m * K + K - 3] = NAN;
    cdf_convert(a, a_dt, af, CDF_F32, (size_t)(M * K));
    cdf_convert(bias_x, bias_kind == 2 ? CDF_BF16 : CDF_F32, bias, CDF_F32, (size_t)N);
    cdf_convert(af, CDF_F32, a, a_dt, (size_t)(M * K)); /* A as given (bf16 A: exact) */
    if (bias_kind == 2)
        for (int64_t n = 0; n < N; n++) bias[n] = cdf_bf16_to_f32(cdf_f32_to_bf16(bias[n]));
    assert_int_equal(cdf_ggml_dequantize(CDF_GGML_Q8_0, w, N * K, wf), CDF_OK); /* dw * wq: exact in f32 */
    for (int64_t m = 0; m < M; m++)
        for (int64_t b = 0; b < nb; b++) {
            const float *ab = af + m * K + b * 32;
            float amax = 0.0f;
            for (int k = 0; k < 32; k++) amax = fabsf(ab[k]) > amax ? fabsf(ab[k]) : amax;
            const bool tiny = amax < 0x1p-96f; /* counts as a zero block */
            const float d = tiny ? 0.0f : amax / 127.0f, id = tiny ? 0.0f : 127.0f / amax;
            da[m * nb + b] = d;
            for (int k = 0; k < 32; k++) {
                const float xq = ab[k] * id; /* one f32 rounding, then nearest even */
                qa[m * K + b * 32 + k] = m == nan_m ? 0 : (int)nearbyintf(xq);
                if (m != nan_m) assert_true(abs(qa[m * K + b * 32 + k]) <= 127);
            }
        }
    for (int64_t i = 0; i < M * N; i++) c[i] = -12345.0f; /* every element must be written */

    const uint64_t calls = cdf_k_matmul_q_int8_calls();
    const cdf_k_matmul_q_args q = {.M = M, .N = N, .K = K, .a = a, .a_dt = a_dt, .w = w, .qtype = CDF_GGML_Q8_0,
                                   .w_dt = CDF_BF16, .bias = bias_kind ? bias_x : NULL,
                                   .bias_dt = bias_kind == 2 ? CDF_BF16 : CDF_F32, .c = c, .c_dt = CDF_F32};
    assert_int_equal(cdf_k_matmul_q(&q), CDF_OK);
    assert_int_equal(cdf_k_matmul_q_int8_calls(), calls + 1); /* the int8 GEMM ran */
    const double u = ldexp(1.0, -24), g = (double)(nb + 2) * u / (1.0 - (double)(nb + 2) * u);
    int64_t wrong = 0;
    double worst = 0; /* largest |c - R| / its bound 2 */
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            const double got = c[m * N + n];
            if (m == nan_m) {
                if (!isnan(got) && wrong++ < 3)
                    print_error("Q8_0 int8 M %lld N %lld K %lld: c[%lld, %lld] = %.9g, a NaN in its row of A gives NaN\n",
                                (long long)M, (long long)N, (long long)K, (long long)m, (long long)n, got);
                continue;
            }
            const double bv = bias_kind ? (double)bias[n] : 0.0;
            double rq = bv, rq_mag = fabs(bv), r = bv, r_mag = fabs(bv), qerr = 0;
            for (int64_t b = 0; b < nb; b++) {
                int64_t sb = 0;
                const uint8_t *blk = w + (n * nb + b) * 34;
                const double dw = cdf_f16_to_f32((uint16_t)(blk[0] | blk[1] << 8)), d = da[m * nb + b];
                for (int k = 0; k < 32; k++) {
                    const int64_t kk = b * 32 + k;
                    sb += (int64_t)qa[m * K + kk] * (int8_t)blk[2 + k];
                    const double t = (double)af[m * K + kk] * (double)wf[n * K + kk];
                    r += t, r_mag += fabs(t);
                    const double ak = fabs((double)af[m * K + kk]);
                    qerr += fabs((double)wf[n * K + kk]) * (d > 0 ? d / 2 + 3.01 * u * ak : ak); /* da 0: qa 0 */
                }
                rq += d * dw * (double)sb, rq_mag += fabs(d * dw * (double)sb);
            }
            const double b1 = g * rq_mag + 1e-12 * rq_mag, b2 = b1 + qerr + 1e-12 * r_mag;
            const bool ok1 = fabs(got - rq) <= b1, ok2 = fabs(got - r) <= b2;
            if (b2 > 0 && fabs(got - r) / b2 > worst) worst = fabs(got - r) / b2;
            if ((!ok1 || !ok2) && wrong++ < 3)
                print_error("Q8_0 int8 M %lld N %lld K %lld: c[%lld, %lld] = %.9g; quantized-A sum %.9g (bound %.3g), "
                            "exact %.9g (bound %.3g)\n", (long long)M, (long long)N, (long long)K, (long long)m, (long long)n,
                            got, rq, b1, r, b2);
        }
    assert_int_equal(wrong, 0);
    printf("  int8 M %lld N %lld K %lld: largest |c - exact| = %.2f of its bound\n", (long long)M, (long long)N, (long long)K,
           worst);
    free(w), free(af), free(wf), free(bias), free(c), free(da), free(qa), free(a), free(bias_x);
}

static void test_matmul_q8_int8(void **state) {
    (void)state;
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    const cdf_k_cpu_features *cpu = cdf_k_cpu();
    const bool int8 = cdf_k_isa_level() >= CDF_K_ISA_AVX512 && cpu->avx512_vnni && !cpu->amx_bf16;
#else
    const bool int8 = false;
#endif
    if (!int8) {
        printf("  [note] the int8 Q8_0 GEMM does not apply here (needs AVX512-VNNI without AMX, a GCC build)\n");
        return;
    }
    cdf_k_matmul_q_set_int8(2); /* wherever it can run: the M edges too */
    q8_int8_case(301, 288, 1056, CDF_F32, 1, 21, false); /* 2 MC blocks + a partial group; 1 + 1/8 slabs; 33 blocks: 2 + 1/16 chunks */
    q8_int8_case(200, 64, 64, CDF_BF16, 2, 22, false);  /* bf16 A and bias, K below one chunk */
    q8_int8_case(7, 32, 512, CDF_F32, 0, 23, false);    /* no bias, exactly one chunk, one panel, 6 + 1 rows */
    q8_int8_case(1, 96, 32, CDF_F32, 1, 24, false);     /* one row, one block (an odd count: half a repack pair) */
    q8_int8_case(6, 256, 96, CDF_BF16, 1, 25, true);    /* one whole group and slab; a NaN in row 3 */
    q8_int8_case(193, 544, 3072, CDF_F32, 1, 26, false); /* an MC block + 1 row, 2 slabs + 1 panel, FLUX's K */
    /* the environment's switch (read again after set_int8(-1)): off by default and with "0" (then
     * another path runs, checked as the bf16 paths are), on with "1" */
    const uint64_t calls = cdf_k_matmul_q_int8_calls();
    const char *was = getenv("CDIFFUSERS_Q8_INT8");
    char *saved = was ? strdup(was) : NULL;
    for (int v = 0; v < 3; v++) {
        if (v == 0) unsetenv("CDIFFUSERS_Q8_INT8");
        else setenv("CDIFFUSERS_Q8_INT8", v == 1 ? "0" : "1", 1);
        cdf_k_matmul_q_set_int8(-1);
        if (v < 2) {
            q8_own_case(301, 288, 1056, CDF_F32, 1, 11, 0);
            assert_int_equal(cdf_k_matmul_q_int8_calls(), calls);
        } else {
            q8_int8_case(13, 64, 64, CDF_F32, 1, 27, false);
            assert_int_equal(cdf_k_matmul_q_int8_calls(), calls + 1);
        }
    }
    if (saved) setenv("CDIFFUSERS_Q8_INT8", saved, 1);
    else unsetenv("CDIFFUSERS_Q8_INT8");
    free(saved);
    cdf_k_matmul_q_set_int8(-1);
    /* the f32 policy (weights decoded to f32) never runs it */
    float a1[32] = {1}, c1[32];
    uint8_t w1[32 * 34] = {0};
    const cdf_k_matmul_q_args f = {.M = 1, .N = 32, .K = 32, .a = a1, .a_dt = CDF_F32, .w = w1, .qtype = CDF_GGML_Q8_0,
                                   .w_dt = CDF_F32, .c = c1, .c_dt = CDF_F32};
    cdf_k_matmul_q_set_int8(2);
    assert_int_equal(cdf_k_matmul_q(&f), CDF_OK);
    assert_int_equal(cdf_k_matmul_q_int8_calls(), calls + 1);
    cdf_k_matmul_q_set_int8(-1);
}

/* What the fast path must leave to the reference, and that dispatch goes through it. */
static void test_matmul_declines_and_dispatch(void **state) {
    (void)state;
    if (!need_f32()) return;
    float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {1, 0, 0, 1, 1, 1}, c[4];
    uint16_t h[6];
    cdf_convert(h, CDF_F16, a, CDF_F32, 6);
    cdf_k_matmul_args x = {.batch = 1, .M = 2, .N = 2, .K = 3, .a = a, .a_dt = CDF_F32, .lda = 3,
                           .b = b, .b_dt = CDF_F32, .ldb = 2, .c = c, .c_dt = CDF_F32, .ldc = 2, .alpha = 1.0f};
    bool handled = true;
    cdf_k_matmul_args y = x;
    y.a = h;
    y.a_dt = CDF_F16; /* f16: not supported */
    assert_int_equal(cdf_k_matmul_fast(&y, &handled), CDF_OK);
    assert_false(handled);
    y = x;
    y.beta = 0.5f; /* only 0/1: the reference reports the error */
    assert_int_equal(cdf_k_matmul_fast(&y, &handled), CDF_OK);
    assert_false(handled);
    assert_int_not_equal(cdf_k_matmul_dispatch(&y), CDF_OK);
    y = x;
    y.K = 0; /* empty reduction: the reference writes bias / zeros */
    assert_int_equal(cdf_k_matmul_fast(&y, &handled), CDF_OK);
    assert_false(handled);
    y = x;
    y.lda = 2; /* inconsistent leading dimension: never read out of bounds */
    assert_int_equal(cdf_k_matmul_fast(&y, &handled), CDF_OK);
    assert_false(handled);
    assert_int_not_equal(cdf_k_matmul(&y), CDF_OK);
    assert_int_equal(cdf_k_matmul_fast(&x, NULL), CDF_ERR_INVALID_ARG);

    /* the dispatcher runs the fast path */
    cdf_k_fast_stats st0, st1;
    cdf_k_fast_get_stats(&st0);
    assert_int_equal(cdf_k_matmul_dispatch(&x), CDF_OK);
    cdf_k_fast_get_stats(&st1);
    if (!cdf_k_reference_only()) assert_int_equal(st1.matmul_handled, st0.matmul_handled + 1);
    /* [[1,2,3],[4,5,6]] @ [[1,0],[0,1],[1,1]] */
    assert_true(c[0] == 4 && c[1] == 5 && c[2] == 10 && c[3] == 11);
}

/* Kernels run on the device queue's worker thread, and several queues may call at once: run
 * matmuls from two threads concurrently (the caches are shared and locked) and check them. */
typedef struct thread_job {
    int id;
    bool own; /* bf16 weights through the own GEMM (its packed-weight cache is shared too) */
    int failures, declined;
} thread_job;

static void *matmul_thread(void *arg) {
    thread_job *job = arg;
    for (int it = 0; it < 12; it++) {
        const int64_t M = 3 + 7 * it + job->id, N = 17 + it, K = 9 + 5 * job->id;
        float *a = malloc(sizeof(float) * (size_t)(M * K)), *b = malloc(sizeof(float) * (size_t)(K * N));
        float *c = malloc(sizeof(float) * (size_t)(M * N));
        uint16_t *bh = malloc(sizeof(uint16_t) * (size_t)(K * N));
        if (!a || !b || !c || !bh) {
            job->failures++;
            free(a); free(b); free(c); free(bh);
            continue;
        }
        tu_fill_random(a, (size_t)(M * K), 9000 + 100 * job->id + it);
        tu_fill_random(b, (size_t)(K * N), 9050 + 100 * job->id + it);
        cdf_convert(bh, CDF_BF16, b, CDF_F32, (size_t)(K * N));
        const bool bf16 = it % 2 && (info.bf16_supported || job->own);
        cdf_k_matmul_args x = {.batch = 1, .M = M, .N = N, .K = K, .a = a, .a_dt = CDF_F32, .lda = K,
                               .b = bf16 ? (const void *)bh : (const void *)b, .b_dt = bf16 ? CDF_BF16 : CDF_F32,
                               .ldb = N, .c = c, .c_dt = CDF_F32, .ldc = N, .alpha = 1.0f};
        bool handled = false;
        if ((bf16 && job->own ? cdf_k_gemm_bf16w(&x, &handled) : cdf_k_matmul_fast(&x, &handled)) != CDF_OK)
            job->failures++;
        if (!handled) job->declined++;
        for (int64_t i = 0; i < M && handled; i++)
            for (int64_t j = 0; j < N; j++) {
                double acc = 0.0, mag = 0.0;
                for (int64_t k = 0; k < K; k++) {
                    float av = bf16 ? cdf_bf16_to_f32(cdf_f32_to_bf16(a[i * K + k])) : a[i * K + k];
                    double p = (double)av * cdf_k_ld(x.b, x.b_dt, k * N + j);
                    acc += p;
                    mag += fabs(p);
                }
                if (!(fabs(c[i * N + j] - acc) <= (double)(K + 4) * U32 * mag + 1e-30)) job->failures++;
            }
        free(a); free(b); free(c); free(bh);
    }
    return NULL;
}

static void test_matmul_threads(void **state) {
    (void)state;
    if (!need_f32()) return;
    pthread_t th[2];
    const bool own = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    thread_job jobs[2] = {{.id = 0, .own = own}, {.id = 1, .own = own}};
    for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&th[i], NULL, matmul_thread, &jobs[i]), 0);
    for (int i = 0; i < 2; i++) assert_int_equal(pthread_join(th[i], NULL), 0);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(jobs[i].declined, 0);
        assert_int_equal(jobs[i].failures, 0);
    }
}

/* ---- the own bf16-weight GEMM (kernels/gemm_bf16w.c) ------------------------------------------ */

static bool need_own_gemm(void) {
    cdf_k_fast_get_info(&info);
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
        printf("  [skip] CPU lacks AVX2/FMA: the own bf16-weight GEMM declines\n");
        return false;
    }
    return true;
}

/* The bf16 policy's bounds (A rounded to bf16) over the whole size grid, both layouts of A and
 * B, bias / alpha / beta / bf16 C / padding cycling; batches sharing the weight; bf16 A; sizes
 * crossing its KC / NC / MC blocks; per-batch weights are declined. */
static void test_gemm_bf16w(void **state) {
    (void)state;
    if (!need_own_gemm()) return;
    via_own_gemm = true;
    cdf_k_gemm_bf16w_reset_stats();
    int n = 0;
    for (int mi = 0; mi < NSIZES; mi++)
        for (int ni = 0; ni < NSIZES; ni++)
            for (int ki = 0; ki < NSIZES; ki++, n++) {
                if (SIZES[mi] * SIZES[ni] * SIZES[ki] > MAX_MNK) continue;
                mm_case cs = {.batch = 1, .M = SIZES[mi], .N = SIZES[ni], .K = SIZES[ki], .ta = (n >> 1) & 1,
                              .tb = !(n & 1), .bias = (n % 3) == 0, .alpha = (n % 7) == 0 ? 0.25f : 1.0f,
                              .beta = (n % 5) == 0 ? 1.0f : 0.0f, .a_dt = CDF_F32, .b_dt = CDF_BF16,
                              .c_dt = (n % 4) == 1 ? CDF_BF16 : CDF_F32, .bias_dt = (n % 2) ? CDF_BF16 : CDF_F32,
                              .pad = n % 3};
                mm_bufs m;
                mm_setup(&cs, &m, 6000 + n);
                mm_check(&m, true, false, "own gemm");
                mm_free(&m);
            }
    const mm_case more[] = {
        {.batch = 1, .M = 97, .N = 300, .K = 520, .tb = true, .bias = true}, /* 3 KC chunks, 2 NC blocks */
        {.batch = 1, .M = 2, .N = 530, .K = 260, .tb = true, .pad = 3},       /* columns split over threads */
        {.batch = 3, .M = 17, .N = 64, .K = 33, .tb = true, .b_bcast = true, .pad = 2, .beta = 1.0f},
        {.batch = 2, .M = 64, .N = 17, .K = 129, .ta = true, .b_bcast = true, .bias = true, .alpha = 0.5f},
        {.batch = 3, .M = 9, .N = 5, .K = 64, .a_bcast = true, .b_bcast = true, .pad = 1},
        {.batch = 1, .M = 129, .N = 64, .K = 300, .tb = true, .bias = true, .a_dt = CDF_BF16, .c_dt = CDF_BF16,
         .bias_dt = CDF_BF16},
    };
    for (size_t i = 0; i < sizeof more / sizeof more[0]; i++) {
        mm_case cs = more[i];
        if (cs.alpha == 0.0f) cs.alpha = 1.0f;
        if (cs.a_dt != CDF_BF16) cs.a_dt = CDF_F32, cs.c_dt = CDF_F32, cs.bias_dt = CDF_F32;
        cs.b_dt = CDF_BF16;
        mm_bufs m;
        mm_setup(&cs, &m, 6500 + i);
        mm_check(&m, true, false, "own gemm, more");
        mm_free(&m);
    }
    via_own_gemm = false;
    /* one weight per batch item, f32 weights, f16 A: not its case */
    mm_case cs = {.batch = 2, .M = 3, .N = 4, .K = 5, .alpha = 1.0f, .a_dt = CDF_F32, .b_dt = CDF_BF16,
                  .c_dt = CDF_F32, .bias_dt = CDF_F32};
    mm_bufs m;
    mm_setup(&cs, &m, 6600);
    bool handled = true;
    assert_int_equal(cdf_k_gemm_bf16w(&m.x, &handled), CDF_OK);
    assert_false(handled);
    m.x.sb = 0;
    m.x.b_dt = CDF_F32;
    assert_int_equal(cdf_k_gemm_bf16w(&m.x, &handled), CDF_OK);
    assert_false(handled);
    m.x.b_dt = CDF_BF16;
    m.x.a_dt = CDF_F16;
    assert_int_equal(cdf_k_gemm_bf16w(&m.x, &handled), CDF_OK);
    assert_false(handled);
    assert_int_equal(cdf_k_gemm_bf16w(&m.x, NULL), CDF_ERR_INVALID_ARG);
    mm_free(&m);
    cdf_k_gemm_bf16w_stats st;
    cdf_k_gemm_bf16w_get_stats(&st);
    assert_true(st.packs > 0);
    /* at the AVX2 level the dispatch runs it for bf16 weights */
    if (cdf_k_isa_level() == CDF_K_ISA_AVX2) {
        cs = (mm_case){.batch = 1, .M = 33, .N = 20, .K = 40, .tb = true, .alpha = 1.0f, .a_dt = CDF_F32,
                       .b_dt = CDF_BF16, .c_dt = CDF_F32, .bias_dt = CDF_F32};
        mm_setup(&cs, &m, 6601);
        cdf_k_gemm_bf16w_get_stats(&st);
        const int64_t before = st.packs + st.hits + st.unpacked_calls;
        assert_int_equal(cdf_k_matmul_dispatch(&m.x), CDF_OK);
        cdf_k_gemm_bf16w_get_stats(&st);
        assert_int_equal(st.packs + st.hits + st.unpacked_calls, before + 1);
        mm_free(&m);
    }
}

/* Its packed weights: packed once and reused, packed afresh when the data at the address
 * changes, dropped by cdf_k_pack_forget_range, per call over the cap; results right throughout. */
static void test_gemm_bf16w_cache(void **state) {
    (void)state;
    if (!need_own_gemm()) return;
    via_own_gemm = true;
    cdf_k_fast_clear();
    cdf_k_pack_set_limit((size_t)64 << 20);
    mm_case cs = {.batch = 1, .M = 17, .N = 129, .K = 64, .tb = true, .bias = true, .alpha = 1.0f,
                  .a_dt = CDF_F32, .b_dt = CDF_BF16, .c_dt = CDF_F32, .bias_dt = CDF_F32};
    mm_bufs m;
    mm_setup(&cs, &m, 6700);
    cdf_k_gemm_bf16w_stats st;
    cdf_k_gemm_bf16w_reset_stats();
    mm_check(&m, true, false, "own cache first use");
    cdf_k_gemm_bf16w_get_stats(&st);
    assert_int_equal(st.packs, 1);
    assert_int_equal(st.packed_weights, 1);
    assert_int_equal(st.packed_bytes, 9 * 64 * 32); /* 9 panels of 16 columns x 64 deep, bf16 */
    mm_check(&m, true, false, "own cache reuse");
    cdf_k_gemm_bf16w_get_stats(&st);
    assert_int_equal(st.packs, 1);
    assert_int_equal(st.hits, 1);
    uint16_t *b = m.b;
    for (size_t i = 0; i < m.b_n; i++) b[i] = cdf_f32_to_bf16(-0.5f * cdf_bf16_to_f32(b[i]) + 0.125f);
    mm_check(&m, true, false, "own cache after change");
    cdf_k_gemm_bf16w_get_stats(&st);
    assert_int_equal(st.repacks, 1);
    assert_int_equal(st.packs, 2);
    assert_int_equal(st.packed_weights, 1);
    cdf_k_pack_forget_range((const char *)m.b - 64, m.b_n * 2 + 64);
    cdf_k_gemm_bf16w_get_stats(&st);
    assert_int_equal(st.packed_weights, 0);
    assert_int_equal(st.packed_bytes, 0);
    mm_check(&m, true, false, "own cache after forget");
    cdf_k_gemm_bf16w_get_stats(&st);
    assert_int_equal(st.packs, 3);
    assert_int_equal(st.repacks, 1);
    cdf_k_fast_clear();
    cdf_k_pack_set_limit(1);
    cdf_k_gemm_bf16w_reset_stats();
    mm_check(&m, true, false, "own cache cap full");
    cdf_k_gemm_bf16w_get_stats(&st);
    assert_int_equal(st.packs, 0);
    assert_int_equal(st.packed_weights, 0);
    assert_int_equal(st.unpacked_calls, 1);
    cdf_k_pack_set_limit((size_t)64 << 20);
    mm_free(&m);
    via_own_gemm = false;
}

/* ---- the own vdpbf16ps GEMM on bf16 weights (kernels/gemm_vdpbf16.c) ------------------------ */

/* Whether it runs here: a GCC x86-64 build at the avx512_bf16 level of an AVX512-BF16 CPU
 * (CDIFFUSERS_ISA may cap the level below it); with AMX, where AMX is usable (then the AMX
 * micro-kernel runs: the same bound holds, tdpbf16ps adds each k pair's products to the f32 sum
 * as vdpbf16ps does). */
static bool vdp_applies(void) {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    return cdf_k_isa_level() >= CDF_K_ISA_AVX512_BF16 && cdf_k_cpu()->avx512_bf16 &&
           (!cdf_k_cpu()->amx_bf16 || (__GNUC__ >= 11 && cdf_k_amx_usable()));
#else
    return false;
#endif
}

/* Against the double reference of mm_check with A rounded to bf16 (the policy). Why mm_check's
 * tolerance (K + 4) * 2^-24 * sum|terms| holds: a product of two bf16 values has at most 16
 * significant bits, exact in f32; vdpbf16ps adds a k pair's two products to the f32 sum, at most
 * two roundings of at most 2^-24 of a partial sum each, and |partial sum| <= sum |products|: K
 * roundings in all; the bias's addition one more (<= 2^-24 of |sum| + |bias|, both in the
 * scale). Its flush of denormal terms moves a sum by < K * 2^-126, under the absolute 1e-30. A
 * misplaced value, a lost k chunk or column panel or a missing bias moves an element by ~1e-2
 * of the scale. Shapes: M 1, 11, 12, 13 (row groups of 12), 200 and 397 (past one 192-row
 * block, a partial group; past the AMX kernel's 256-row block, a partial 32-row block); N 32, 288
 * and 544 (a partial 256-column slab, 32-column panels); K 32, 544, 1056 (a partial 512-deep
 * chunk) and 3104 (six chunks and a 32 tail); A f32 / bf16, bias none / f32 / bf16, padded leading
 * dimensions, batches stacked over one weight; then what it must decline, the dispatch taking
 * it, and the switch. */
static void test_gemm_vdp_bf16(void **state) {
    (void)state;
    if (!vdp_applies()) {
        printf("  [skip] the vdpbf16ps GEMM does not apply here (build, CPU or ISA level)\n");
        mm_case cs = {.batch = 1, .M = 12, .N = 32, .K = 32, .tb = true, .alpha = 1.0f, .a_dt = CDF_F32,
                      .b_dt = CDF_BF16, .c_dt = CDF_F32, .bias_dt = CDF_F32};
        mm_bufs m;
        mm_setup(&cs, &m, 8000);
        bool handled = true;
        assert_int_equal(cdf_k_gemm_vdp_bf16(&m.x, &handled), CDF_OK);
        assert_false(handled);
        mm_free(&m);
        return;
    }
    cdf_k_gemm_vdp_bf16_set(2); /* the kernel at every row count (by default from 128 rows on) */
    via_vdp_gemm = true;
    printf("  micro-kernel: %s\n", cdf_k_cpu()->amx_bf16 ? "AMX tiles" : "vdpbf16ps");
    /* K 3104: six 512-deep chunks and a 32-deep one (both micro-kernels) */
    static const int64_t Ms[] = {1, 11, 12, 13, 200, 397}, Ns[] = {32, 288, 544}, Ks[] = {32, 544, 1056, 3104};
    int n = 0;
    for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++)
        for (size_t ni = 0; ni < sizeof Ns / sizeof Ns[0]; ni++)
            for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++, n++) {
                if (Ms[mi] * Ns[ni] * Ks[ki] > 60000000) continue;
                mm_case cs = {.batch = 1, .M = Ms[mi], .N = Ns[ni], .K = Ks[ki], .tb = true, .bias = n % 3 != 0,
                              .alpha = 1.0f, .a_dt = n % 2 ? CDF_BF16 : CDF_F32, .b_dt = CDF_BF16, .c_dt = CDF_F32,
                              .bias_dt = n % 3 == 2 ? CDF_BF16 : CDF_F32, .pad = n % 5 == 1 ? 3 : 0};
                mm_bufs m;
                mm_setup(&cs, &m, 8100 + n);
                mm_check(&m, true, false, "vdpbf16ps gemm");
                mm_free(&m);
            }
    /* batches sharing the weight, stacked as rows (no padding between the matrices) */
    mm_case bs = {.batch = 3, .M = 13, .N = 64, .K = 96, .tb = true, .b_bcast = true, .bias = true, .alpha = 1.0f,
                  .a_dt = CDF_F32, .b_dt = CDF_BF16, .c_dt = CDF_F32, .bias_dt = CDF_F32};
    mm_bufs m;
    mm_setup(&bs, &m, 8300);
    mm_check(&m, true, false, "vdpbf16ps gemm, batch");
    mm_free(&m);
    via_vdp_gemm = false;

    /* a bf16 A (what a model's shared input is, nn.h: cdf_linear_shared_input) and the same
     * values as an f32 A (rounded as packed) give the same bits, with padded rows, a partial
     * 512-deep chunk, a 256-row block and partial 32-row blocks of under and over 16 rows */
    static const int64_t same_M[] = {13, 93, 200, 413};
    for (size_t mi = 0; mi < sizeof same_M / sizeof same_M[0]; mi++) {
        mm_case cf = {.batch = 1, .M = same_M[mi], .N = 288, .K = 1056, .tb = true, .bias = mi % 2 == 0, .alpha = 1.0f,
                      .a_dt = CDF_F32, .b_dt = CDF_BF16, .c_dt = CDF_F32, .bias_dt = CDF_F32, .pad = mi % 2 ? 3 : 0};
        mm_case cb = cf;
        cb.a_dt = CDF_BF16;
        mm_bufs mf, mb;
        mm_setup(&cf, &mf, 8200 + mi);
        mm_setup(&cb, &mb, 8200 + mi);
        bool hf = false, hb = false;
        assert_int_equal(cdf_k_gemm_vdp_bf16(&mf.x, &hf), CDF_OK);
        assert_int_equal(cdf_k_gemm_vdp_bf16(&mb.x, &hb), CDF_OK);
        assert_true(hf && hb);
        assert_memory_equal(mf.c, mb.c, sizeof(float) * (mf.c_n + mf.c_guard));
        mm_free(&mf);
        mm_free(&mb);
    }

    /* not its case: each must decline and write nothing */
    const mm_case base = {.batch = 1, .M = 13, .N = 64, .K = 64, .tb = true, .alpha = 1.0f, .a_dt = CDF_F32,
                          .b_dt = CDF_BF16, .c_dt = CDF_F32, .bias_dt = CDF_F32};
    for (int v = 0; v < 11; v++) {
        mm_case cs = base;
        switch (v) {
        case 0: cs.alpha = 0.5f; break;
        case 1: cs.beta = 1.0f; break;
        case 2: cs.ta = true; break;
        case 3: cs.tb = false; break;
        case 4: cs.N = 48; break;
        case 5: cs.K = 48; break;
        case 6: cs.c_dt = CDF_BF16; break;
        case 7: cs.batch = 2; break; /* one weight per item */
        case 8: cs.batch = 2, cs.b_bcast = true, cs.pad = 1; break; /* items not stackable */
        case 9: cs.b_dt = CDF_F32; break;
        default: break; /* v = 10: a quantized layer's transient panel (set below) */
        }
        mm_setup(&cs, &m, 8400 + v);
        m.x.b_transient = v == 10;
        bool handled = true;
        assert_false(cdf_k_gemm_vdp_bf16_supports(&m.x));
        assert_int_equal(cdf_k_gemm_vdp_bf16(&m.x, &handled), CDF_OK);
        assert_false(handled);
        float first;
        cdf_convert(&first, CDF_F32, m.c, cs.c_dt, 1);
        assert_true(first == m.c_old[0]);
        mm_free(&m);
    }
    bool handled = true;
    assert_int_equal(cdf_k_gemm_vdp_bf16(NULL, &handled), CDF_OK);
    assert_false(handled);
    assert_int_equal(cdf_k_gemm_vdp_bf16(NULL, NULL), CDF_ERR_INVALID_ARG);

    /* the dispatch runs it on bf16 weights from 128 rows on; below, oneDNN without a kept copy;
     * switched off, oneDNN as before */
    cdf_k_gemm_vdp_bf16_set(1);
    mm_setup(&base, &m, 8500); /* 13 rows */
    int64_t c0 = cdf_k_gemm_vdp_bf16_calls();
    assert_true(cdf_k_gemm_vdp_bf16_skips_pack(&m.x));
    cdf_k_fast_clear();
    cdf_k_fast_stats f0, f1;
    cdf_k_fast_get_stats(&f0);
    assert_int_equal(cdf_k_matmul_dispatch(&m.x), CDF_OK);
    cdf_k_fast_get_stats(&f1);
    assert_int_equal(cdf_k_gemm_vdp_bf16_calls(), c0);
    assert_int_equal(f1.packs, f0.packs);
    mm_free(&m);
    mm_case big = base;
    big.M = 128;
    mm_setup(&big, &m, 8501);
    assert_false(cdf_k_gemm_vdp_bf16_skips_pack(&m.x));
    c0 = cdf_k_gemm_vdp_bf16_calls();
    assert_int_equal(cdf_k_matmul_dispatch(&m.x), CDF_OK);
    assert_int_equal(cdf_k_gemm_vdp_bf16_calls(), c0 + 1);
    cdf_k_gemm_vdp_bf16_set(0);
    assert_false(cdf_k_gemm_vdp_bf16_supports(&m.x));
    assert_int_equal(cdf_k_matmul_dispatch(&m.x), CDF_OK);
    assert_int_equal(cdf_k_gemm_vdp_bf16_calls(), c0 + 1);
    cdf_k_gemm_vdp_bf16_set(-1);
    mm_free(&m);
}

/* ---- matmul epilogues ---------------------------------------------------------------------- */

typedef struct epi_ctx {
    const cdf_k_matmul_args *x;
    int *calls; /* per (batch item, row): times the epilogue covered it */
    int bad;    /* calls with an out-of-range or empty row range */
} epi_ctx;

/* Counts the rows it is given and adds 1 to them (f32 C): C must be final at that point. */
static void epi_add_one(void *p, int64_t bi, int64_t row0, int64_t row1) {
    epi_ctx *e = p;
    const cdf_k_matmul_args *x = e->x;
    if (bi < 0 || bi >= x->batch || row0 < 0 || row1 > x->M || row0 >= row1) {
        __atomic_fetch_add(&e->bad, 1, __ATOMIC_RELAXED);
        return;
    }
    for (int64_t r = row0; r < row1; r++) {
        __atomic_fetch_add(&e->calls[bi * x->M + r], 1, __ATOMIC_RELAXED);
        float *row = (float *)x->c + bi * x->sc + r * x->ldc;
        for (int64_t j = 0; j < x->N; j++) row[j] += 1.0f;
    }
}

enum { EPI_REFERENCE, EPI_ONEDNN, EPI_OWN, EPI_VDP, EPI_DISPATCH };

static cdf_status epi_run(int path, const cdf_k_matmul_args *x, bool *handled) {
    *handled = true;
    switch (path) {
    case EPI_REFERENCE: return cdf_k_matmul(x);
    case EPI_ONEDNN: return cdf_k_matmul_fast(x, handled);
    case EPI_OWN: return cdf_k_gemm_bf16w(x, handled);
    case EPI_VDP: return cdf_k_gemm_vdp_bf16(x, handled);
    default: return cdf_k_matmul_dispatch(x);
    }
}

/* Every path calls the epilogue over each row of C exactly once, after the row is final: the
 * result equals the same call without it, plus 1 everywhere (padding untouched). */
static void test_matmul_epilogue(void **state) {
    (void)state;
    const mm_case cases[] = {
        {.batch = 1, .M = 300, .N = 40, .K = 17, .tb = true, .bias = true},           /* row strips */
        {.batch = 1, .M = 5, .N = 300, .K = 64, .tb = true, .pad = 2},                /* columns split */
        {.batch = 3, .M = 17, .N = 20, .K = 9, .b_bcast = true, .beta = 1.0f, .pad = 1}, /* batch sharing B */
        {.batch = 2, .M = 70, .N = 9, .K = 33, .tb = true},                            /* per-batch B */
        {.batch = 1, .M = 300, .N = 64, .K = 64, .tb = true, .bias = true},           /* the vdpbf16ps GEMM's */
        {.batch = 3, .M = 50, .N = 32, .K = 32, .tb = true, .b_bcast = true},         /* its stacked batch */
    };
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    cdf_k_fast_get_info(&info);
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (int path = EPI_REFERENCE; path <= EPI_DISPATCH; path++)
            for (int wdt = 0; wdt < 2; wdt++) {
                const bool bf16 = wdt == 1;
                if (path == EPI_OWN && (!avx2 || !bf16)) continue;
                if (path == EPI_VDP && !bf16) continue; /* it declines what it cannot run (handled below) */
                if (path == EPI_ONEDNN && (cdf_k_reference_only() || !info.available || (bf16 && !info.bf16_supported)))
                    continue;
                mm_case cs = cases[ci];
                cs.alpha = 1.0f;
                cs.a_dt = bf16 && path == EPI_ONEDNN ? CDF_BF16 : CDF_F32;
                cs.b_dt = bf16 ? CDF_BF16 : CDF_F32;
                cs.c_dt = cs.bias_dt = CDF_F32;
                mm_bufs m;
                mm_setup(&cs, &m, 7000 + ci);
                bool handled;
                assert_int_equal(epi_run(path, &m.x, &handled), CDF_OK);
                if (!handled) { /* e.g. per-batch bf16 weights for the own GEMM */
                    mm_free(&m);
                    continue;
                }
                float *want = malloc(sizeof(float) * m.c_n);
                int *calls = calloc((size_t)(cs.batch * cs.M), sizeof(int));
                assert_non_null(want);
                assert_non_null(calls);
                memcpy(want, m.c, sizeof(float) * m.c_n);
                mm_reset_c(&m);
                epi_ctx e = {.x = &m.x, .calls = calls};
                m.x.epilogue = epi_add_one;
                m.x.epilogue_ctx = &e;
                assert_int_equal(epi_run(path, &m.x, &handled), CDF_OK);
                assert_true(handled);
                assert_int_equal(e.bad, 0);
                const float *got = m.c;
                for (int64_t bi = 0; bi < cs.batch; bi++)
                    for (int64_t i = 0; i < cs.M; i++) {
                        if (calls[bi * cs.M + i] != 1)
                            fail_msg("case %zu path %d bf16 %d: row %lld of item %lld covered %d times", ci, path, bf16,
                                     (long long)i, (long long)bi, calls[bi * cs.M + i]);
                        for (int64_t j = 0; j < m.x.ldc; j++) {
                            const size_t idx = (size_t)(bi * m.x.sc + i * m.x.ldc + j);
                            const float w = j < cs.N ? want[idx] + 1.0f : SENTINEL;
                            if (got[idx] != w)
                                fail_msg("case %zu path %d bf16 %d: C[%lld,%lld,%lld] = %.9g, want %.9g", ci, path,
                                         bf16, (long long)bi, (long long)i, (long long)j, got[idx], w);
                        }
                    }
                free(want);
                free(calls);
                mm_free(&m);
            }
}

/* ---- conv2d --------------------------------------------------------------------------------- */

typedef struct conv_case {
    int64_t n, cin, h, w, cout, kh, kw, sh, sw, ph, pw, dh, dw, groups;
    bool bias;
    cdf_dtype x_dt, w_dt, out_dt; /* set per test */
} conv_case;

static void conv_check(const conv_case *cs, uint64_t seed) {
    const int64_t cin_g = cs->cin / cs->groups, cout_g = cs->cout / cs->groups;
    const int64_t oh = (cs->h + 2 * cs->ph - cs->dh * (cs->kh - 1) - 1) / cs->sh + 1;
    const int64_t ow = (cs->w + 2 * cs->pw - cs->dw * (cs->kw - 1) - 1) / cs->sw + 1;
    const size_t nx = (size_t)(cs->n * cs->cin * cs->h * cs->w), nw = (size_t)(cs->cout * cin_g * cs->kh * cs->kw);
    const size_t no = (size_t)(cs->n * cs->cout * oh * ow);
    float *xf = malloc(sizeof(float) * nx), *wf = malloc(sizeof(float) * nw), *bf = malloc(sizeof(float) * cs->cout);
    assert_non_null(xf);
    assert_non_null(wf);
    assert_non_null(bf);
    tu_fill_random(xf, nx, seed);
    tu_fill_random(wf, nw, seed + 1);
    tu_fill_random(bf, (size_t)cs->cout, seed + 2);
    void *x = malloc(cdf_dtype_size(cs->x_dt) * nx), *w = malloc(cdf_dtype_size(cs->w_dt) * nw);
    void *bias = malloc(cdf_dtype_size(cs->w_dt) * (size_t)cs->cout), *out = malloc(cdf_dtype_size(cs->out_dt) * no);
    assert_non_null(x);
    assert_non_null(w);
    assert_non_null(bias);
    assert_non_null(out);
    cdf_convert(x, cs->x_dt, xf, CDF_F32, nx);
    cdf_convert(w, cs->w_dt, wf, CDF_F32, nw);
    cdf_convert(bias, cs->w_dt, bf, CDF_F32, (size_t)cs->cout);
    /* what the fast path computes with: stored values, x rounded to bf16 for bf16 weights */
    cdf_convert(xf, CDF_F32, x, cs->x_dt, nx);
    if (cs->w_dt == CDF_BF16)
        for (size_t i = 0; i < nx; i++) xf[i] = cdf_bf16_to_f32(cdf_f32_to_bf16(xf[i]));
    cdf_convert(wf, CDF_F32, w, cs->w_dt, nw);
    cdf_convert(bf, CDF_F32, bias, cs->w_dt, (size_t)cs->cout);

    cdf_k_conv2d_args a = {.n = cs->n, .cin = cs->cin, .h = cs->h, .w = cs->w, .cout = cs->cout, .kh = cs->kh,
                           .kw = cs->kw, .stride_h = cs->sh, .stride_w = cs->sw, .pad_h = cs->ph, .pad_w = cs->pw,
                           .dil_h = cs->dh, .dil_w = cs->dw, .groups = cs->groups, .x = x, .x_dt = cs->x_dt,
                           .weight = w, .w_dt = cs->w_dt, .bias = cs->bias ? bias : NULL, .b_dt = cs->w_dt,
                           .out = out, .out_dt = cs->out_dt};
    bool handled = false;
    if (bf16_via_dispatch && cs->w_dt == CDF_BF16) {
        assert_int_equal(cdf_k_conv2d_dispatch(&a), CDF_OK);
        handled = true;
    } else {
        assert_int_equal(cdf_k_conv2d_fast(&a, &handled), CDF_OK);
    }
    if (!handled)
        fail_msg("fast conv2d declined n=%lld cin=%lld %lldx%lld cout=%lld k=%lldx%lld s=%lld,%lld p=%lld,%lld g=%lld",
                 (long long)cs->n, (long long)cs->cin, (long long)cs->h, (long long)cs->w, (long long)cs->cout,
                 (long long)cs->kh, (long long)cs->kw, (long long)cs->sh, (long long)cs->sw, (long long)cs->ph,
                 (long long)cs->pw, (long long)cs->groups);
    float *got = malloc(sizeof(float) * no), *want = NULL;
    assert_non_null(got);
    cdf_convert(got, CDF_F32, out, cs->out_dt, no);
    if (cs->w_dt == CDF_F32) { /* same inputs, f32 compute: comparable with the reference kernel */
        want = malloc(sizeof(float) * no);
        assert_non_null(want);
        assert_int_equal(cdf_k_conv2d(&a), CDF_OK);
        cdf_convert(want, CDF_F32, out, cs->out_dt, no);
    }
    for (int64_t n = 0; n < cs->n; n++)
        for (int64_t co = 0; co < cs->cout; co++)
            for (int64_t y = 0; y < oh; y++)
                for (int64_t xo = 0; xo < ow; xo++) {
                    const int64_t g = co / cout_g;
                    double acc = cs->bias ? bf[co] : 0.0, mag = cs->bias ? fabs(bf[co]) : 0.0;
                    for (int64_t ci = 0; ci < cin_g; ci++)
                        for (int64_t ky = 0; ky < cs->kh; ky++)
                            for (int64_t kx = 0; kx < cs->kw; kx++) {
                                int64_t iy = y * cs->sh - cs->ph + ky * cs->dh, ix = xo * cs->sw - cs->pw + kx * cs->dw;
                                if (iy < 0 || iy >= cs->h || ix < 0 || ix >= cs->w) continue;
                                double p = (double)xf[((n * cs->cin + g * cin_g + ci) * cs->h + iy) * cs->w + ix] *
                                           wf[((co * cin_g + ci) * cs->kh + ky) * cs->kw + kx];
                                acc += p;
                                mag += fabs(p);
                            }
                    size_t idx = (size_t)(((n * cs->cout + co) * oh + y) * ow + xo);
                    double tol = (double)(cin_g * cs->kh * cs->kw + 4) * U32 * mag + 1e-30;
                    if (cs->out_dt == CDF_BF16) tol += fabs(acc) * (1.0 / 256.0) * 1.0001;
                    if (!(fabs(got[idx] - acc) <= tol))
                        fail_msg("conv out[%lld,%lld,%lld,%lld] = %.9g, double reference %.9g (tol %.3g), "
                                 "cin=%lld cout=%lld k=%lld s=%lld p=%lld,%lld d=%lld g=%lld",
                                 (long long)n, (long long)co, (long long)y, (long long)xo, got[idx], acc, tol,
                                 (long long)cs->cin, (long long)cs->cout, (long long)cs->kh, (long long)cs->sh,
                                 (long long)cs->ph, (long long)cs->pw, (long long)cs->dh, (long long)cs->groups);
                    if (want && !(fabs(got[idx] - want[idx]) <= 1e-4 * mag + 1e-30))
                        fail_msg("conv out[%zu]: fast %.9g vs reference kernel %.9g", idx, got[idx], want[idx]);
                }
    free(xf); free(wf); free(bf); free(x); free(w); free(bias); free(out); free(got); free(want);
}

static const conv_case CONVS[] = {
    /* n cin h  w  cout kh kw sh sw ph pw dh dw g bias (dtypes set per test) */
    {1, 3, 17, 13, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, true, CDF_F32, CDF_F32, CDF_F32},     /* first layer, odd sizes */
    {2, 16, 12, 12, 32, 3, 3, 1, 1, 1, 1, 1, 1, 1, true, CDF_F32, CDF_F32, CDF_F32},   /* VAE-like 3x3 */
    {1, 16, 15, 15, 16, 3, 3, 2, 2, 0, 0, 1, 1, 1, true, CDF_F32, CDF_F32, CDF_F32},   /* VAE downsample (padded to odd), stride 2 pad 0 */
    {1, 8, 15, 16, 8, 3, 3, 2, 2, 0, 0, 1, 1, 1, true, CDF_F32, CDF_F32, CDF_F32},     /* last column unused (negative right pad) */
    {1, 4, 9, 10, 4, 2, 3, 3, 2, 0, 1, 1, 1, 1, false, CDF_F32, CDF_F32, CDF_F32},     /* unused trailing rows and columns */
    {1, 8, 11, 9, 16, 3, 3, 2, 2, 1, 1, 1, 1, 1, false, CDF_F32, CDF_F32, CDF_F32},    /* stride 2 pad 1 */
    {1, 32, 9, 7, 64, 1, 1, 1, 1, 0, 0, 1, 1, 1, true, CDF_F32, CDF_F32, CDF_F32},     /* 1x1 (shortcut / quant conv) */
    {2, 8, 10, 10, 4, 3, 3, 1, 1, 1, 1, 1, 1, 2, true, CDF_F32, CDF_F32, CDF_F32},     /* groups */
    {1, 16, 9, 9, 16, 3, 3, 1, 1, 1, 1, 1, 1, 16, true, CDF_F32, CDF_F32, CDF_F32},    /* depthwise */
    {1, 4, 13, 11, 6, 3, 5, 1, 2, 2, 0, 2, 1, 1, true, CDF_F32, CDF_F32, CDF_F32},     /* dilation, asymmetric kernel and pad */
    {1, 4, 8, 8, 4, 2, 2, 2, 2, 0, 0, 1, 1, 1, true, CDF_F32, CDF_F32, CDF_F32},       /* patch embed style */
};

static void test_conv2d_f32(void **state) {
    (void)state;
    if (!need_f32()) return;
    for (size_t i = 0; i < sizeof CONVS / sizeof CONVS[0]; i++) {
        conv_case cs = CONVS[i];
        cs.x_dt = cs.w_dt = cs.out_dt = CDF_F32;
        if (i % 4 == 3) cs.x_dt = CDF_BF16; /* bf16 input, widened exactly */
        conv_check(&cs, 6000 + 10 * i);
    }
}

static void test_conv2d_bf16_weights(void **state) {
    (void)state;
    if (!need_bf16()) return;
    for (size_t i = 0; i < sizeof CONVS / sizeof CONVS[0]; i++) {
        conv_case cs = CONVS[i];
        cs.x_dt = (i % 3 == 2) ? CDF_BF16 : CDF_F32;
        cs.w_dt = CDF_BF16;
        cs.out_dt = (i % 2) ? CDF_BF16 : CDF_F32;
        conv_check(&cs, 7000 + 10 * i);
    }
}

static void test_conv2d_declines(void **state) {
    (void)state;
    if (!need_f32()) return;
    float x[4 * 4] = {0}, w[4] = {0}, out[4];
    cdf_k_conv2d_args a = {.n = 1, .cin = 1, .h = 4, .w = 4, .cout = 1, .kh = 2, .kw = 2, .stride_h = 2,
                           .stride_w = 2, .dil_h = 1, .dil_w = 1, .groups = 1, .x = x, .x_dt = CDF_F32,
                           .weight = w, .w_dt = CDF_F32, .out = out, .out_dt = CDF_F32};
    bool handled = false;
    assert_int_equal(cdf_k_conv2d_fast(&a, &handled), CDF_OK);
    assert_true(handled);
    a.groups = 3; /* invalid: the reference reports it */
    assert_int_equal(cdf_k_conv2d_fast(&a, &handled), CDF_OK);
    assert_false(handled);
    assert_int_not_equal(cdf_k_conv2d_dispatch(&a), CDF_OK);
    a.groups = 1;
    a.x_dt = CDF_F16; /* f16: not supported */
    assert_int_equal(cdf_k_conv2d_fast(&a, &handled), CDF_OK);
    assert_false(handled);
    a.x_dt = CDF_F32;
    a.kh = 5; /* kernel larger than the input: the reference reports it */
    assert_int_equal(cdf_k_conv2d_fast(&a, &handled), CDF_OK);
    assert_false(handled);
}

/* ---- layer / RMS norm, 16 rows in AVX-512 lanes (kernels/norm_fast.c) -----------------------
 * Against the reference kernels bit for bit: the fast path claims the same sums in the same
 * order. Rows 1, 15, 16, 17 and 40 (partial 16-row groups); columns 1, 7, 64 (SD3's head), 65,
 * 128 (FLUX's head), 1000, 1024 (one cascade chunk), 1536 and 2500 (past it: the chunks' partial
 * totals); f32 / bf16 in and out, weight none / f32 / bf16 / f16, bias (layer norm) none or in the
 * weight's dtype;
 * values spread over 2^-20..2^20 with an offset (layer norm's mean), one row with +inf and one
 * with NaN, denormal and zero rows; out == in; then what it must decline. */
static bool norm_fast_applies(void) {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    return cdf_k_isa_level() >= CDF_K_ISA_AVX512;
#else
    return false;
#endif
}

static void norm_case(bool rms, int64_t rows, int64_t cols, cdf_dtype in_dt, cdf_dtype out_dt, cdf_dtype wdt,
                      bool weight, bool bias, bool in_place, uint64_t seed) {
    const size_t n = (size_t)(rows * cols);
    float *r = malloc(sizeof(float) * (n + 2 * (size_t)cols));
    void *in = malloc(4 * n), *want = malloc(4 * n), *got = malloc(4 * n), *w = malloc(4 * (size_t)cols),
         *b = malloc(4 * (size_t)cols);
    assert_true(r && in && want && got && w && b);
    tu_fill_random(r, n + 2 * (size_t)cols, seed);
    for (size_t i = 0; i < n; i++) {
        const int64_t row = (int64_t)i / cols;
        float v = ldexpf(r[i], (int)(seed + i) % 41 - 20) + (rms ? 0.0f : 3.0f);
        if (row == 1 && i % 97 == 5) v = INFINITY;
        if (row == 2 && i % 89 == 3) v = NAN;
        if (row == 3) v = ldexpf(r[i], -140); /* denormal */
        if (row == 4) v = 0.0f;
        cdf_k_st(in, in_dt, (int64_t)i, v);
    }
    for (int64_t k = 0; k < cols; k++) {
        cdf_k_st(w, wdt, k, 1.0f + 0.5f * r[n + (size_t)k]);
        cdf_k_st(b, wdt, k, r[n + (size_t)cols + (size_t)k]);
    }
    const float eps = rms ? 1e-6f : 1e-5f;
    if (rms)
        assert_int_equal(cdf_k_rms_norm(want, out_dt, in, in_dt, rows, cols, eps, weight ? w : NULL, wdt), CDF_OK);
    else
        assert_int_equal(cdf_k_layer_norm(want, out_dt, in, in_dt, rows, cols, eps, weight ? w : NULL, bias ? b : NULL, wdt),
                         CDF_OK);
    void *dst = got;
    if (in_place) {
        assert_true(in_dt == out_dt);
        memcpy(got, in, cdf_dtype_size(in_dt) * n);
    }
    bool handled = false;
    if (rms)
        assert_int_equal(cdf_k_rms_norm_fast(dst, out_dt, in_place ? got : in, in_dt, rows, cols, eps, weight ? w : NULL, wdt,
                                             &handled),
                         CDF_OK);
    else
        assert_int_equal(cdf_k_layer_norm_fast(dst, out_dt, in_place ? got : in, in_dt, rows, cols, eps, weight ? w : NULL,
                                               bias ? b : NULL, wdt, &handled),
                         CDF_OK);
    assert_true(handled);
    if (memcmp(got, want, cdf_dtype_size(out_dt) * n) != 0) {
        for (size_t i = 0; i < n; i++) {
            const float g = cdf_k_ld(got, out_dt, (int64_t)i), e = cdf_k_ld(want, out_dt, (int64_t)i);
            if (memcmp(&g, &e, sizeof g) != 0)
                fail_msg("%s norm rows %lld cols %lld in %s out %s w %s/%d b %d in-place %d: [%lld, %lld] fast %.9g, "
                         "reference %.9g",
                         rms ? "RMS" : "layer", (long long)rows, (long long)cols, cdf_dtype_name(in_dt),
                         cdf_dtype_name(out_dt), cdf_dtype_name(wdt), weight, bias, in_place, (long long)(i / (size_t)cols),
                         (long long)(i % (size_t)cols), g, e);
        }
    }
    free(r), free(in), free(want), free(got), free(w), free(b);
}

static void test_norm_fast(void **state) {
    (void)state;
    bool handled = true;
    float x[16] = {1, 2, 3, 4}, y[16];
    if (!norm_fast_applies()) {
        printf("  [skip] the AVX-512 norms do not apply here (build, CPU or ISA level)\n");
        assert_int_equal(cdf_k_rms_norm_fast(y, CDF_F32, x, CDF_F32, 1, 4, 1e-6f, NULL, CDF_F32, &handled), CDF_OK);
        assert_false(handled);
        return;
    }
    static const int64_t Rows[] = {1, 15, 16, 17, 40}, Cols[] = {1, 7, 64, 65, 128, 1000, 1024, 1536, 2500};
    static const cdf_dtype Dts[] = {CDF_F32, CDF_BF16}, Wdts[] = {CDF_F32, CDF_BF16, CDF_F16};
    uint64_t seed = 9000;
    for (size_t ri = 0; ri < sizeof Rows / sizeof Rows[0]; ri++)
        for (size_t ci = 0; ci < sizeof Cols / sizeof Cols[0]; ci++, seed++) {
            const cdf_dtype in_dt = Dts[seed % 2], out_dt = Dts[(seed / 2) % 2], wdt = Wdts[seed % 3];
            const bool weight = seed % 4 != 0, bias = seed % 5 != 1;
            norm_case(true, Rows[ri], Cols[ci], in_dt, out_dt, wdt, weight, false, false, seed);
            norm_case(false, Rows[ri], Cols[ci], in_dt, out_dt, wdt, weight, bias, false, seed);
        }
    norm_case(true, 33, 64, CDF_F32, CDF_F32, CDF_BF16, true, false, true, 9100);      /* out == in */
    norm_case(false, 33, 1536, CDF_BF16, CDF_BF16, CDF_F32, true, true, true, 9101);
    /* declined: f16 in or out, rows past its bound, switched off (the dispatch then runs the
     * reference) */
    assert_int_equal(cdf_k_rms_norm_fast(y, CDF_F16, x, CDF_F32, 1, 4, 1e-6f, NULL, CDF_F32, &handled), CDF_OK);
    assert_false(handled);
    assert_int_equal(cdf_k_layer_norm_fast(y, CDF_F32, x, CDF_F16, 1, 4, 1e-5f, NULL, NULL, CDF_F32, &handled), CDF_OK);
    assert_false(handled);
    assert_int_equal(cdf_k_layer_norm_fast(y, CDF_F32, x, CDF_F32, 1, 20000, 1e-5f, NULL, NULL, CDF_F32, &handled), CDF_OK);
    assert_false(handled);
    assert_int_equal(cdf_k_rms_norm_fast(y, CDF_F32, x, CDF_F32, 1, 4, 1e-6f, NULL, CDF_F32, NULL), CDF_ERR_INVALID_ARG);
    cdf_k_norm_fast_set(0);
    assert_int_equal(cdf_k_rms_norm_fast(y, CDF_F32, x, CDF_F32, 1, 4, 1e-6f, NULL, CDF_F32, &handled), CDF_OK);
    assert_false(handled);
    assert_int_equal(cdf_k_rms_norm_dispatch(y, CDF_F32, x, CDF_F32, 1, 4, 1e-6f, NULL, CDF_F32), CDF_OK);
    cdf_k_norm_fast_set(-1);
    /* the dispatch's result either way: the reference's */
    float want[4];
    assert_int_equal(cdf_k_rms_norm(want, CDF_F32, x, CDF_F32, 1, 4, 1e-6f, NULL, CDF_F32), CDF_OK);
    assert_memory_equal(y, want, sizeof want);
    assert_int_equal(cdf_k_rms_norm_dispatch(y, CDF_F32, x, CDF_F32, 1, 4, 1e-6f, NULL, CDF_F32), CDF_OK);
    assert_memory_equal(y, want, sizeof want);
}

static int teardown(void **state) {
    (void)state;
    cdf_k_fast_clear();
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_f32_sizes),
        cmocka_unit_test(test_matmul_f32_batched),
        cmocka_unit_test(test_matmul_bf16_weights),
        cmocka_unit_test(test_matmul_bf16_rounding_is_rne),
        cmocka_unit_test(test_matmul_bf16_prepack),
        cmocka_unit_test(test_matmul_declines_and_dispatch),
        cmocka_unit_test(test_matmul_q_direct_layout),
        cmocka_unit_test(test_matmul_q8_own_gemm),
        cmocka_unit_test(test_matmul_q8_int8),
        cmocka_unit_test(test_matmul_fast_filled_padding),
        cmocka_unit_test(test_matmul_threads),
        cmocka_unit_test(test_gemm_bf16w),
        cmocka_unit_test(test_gemm_bf16w_cache),
        cmocka_unit_test(test_gemm_vdp_bf16),
        cmocka_unit_test(test_matmul_epilogue),
        cmocka_unit_test(test_conv2d_f32),
        cmocka_unit_test(test_conv2d_bf16_weights),
        cmocka_unit_test(test_conv2d_declines),
        cmocka_unit_test(test_norm_fast),
    };
    return cmocka_run_group_tests(tests, NULL, teardown);
}
