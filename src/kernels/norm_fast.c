/* Layer norm and RMS norm, 16 rows at a time in AVX-512 lanes, bit-identical to the reference
 * kernels (reference_norm.c).
 *
 * Why: the reference normalises a row at a time, and its sums are serial f32 additions (the
 * cascade's leaves, <= 64 terms, each waiting on the one before), with a per-element dtype switch
 * for the weight: ~10 cycles per element. In SD3.5-Medium and FLUX every attention's QK-norm runs
 * over rows of one head (64 or 128 values), and the norms took ~10% of the steady forward
 * (bench/peers/profile.sh, AMX Xeon). Here lane i of every vector belongs to row r0 + i: each
 * row's sums run exactly the reference's order (same cascade, same CHUNK-wide partial totals, a
 * subtraction, multiplication and addition per term, never fused), the per-row scalars are IEEE
 * divisions and square roots, and the outputs are computed with the same operations in the same
 * order: the results are the reference's bit for bit (tests/test_kernels_fast.c compares them).
 * The 16 rows are transposed into lanes 16 x 16 at a time as they load (T[k]: element k of the 16
 * rows) and back as they store.
 *
 * This file is compiled with -ffp-contract=off (CMakeLists.txt): a fused multiply-add would round
 * once where the reference rounds twice. */
#include "kernels/dispatch.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/reference_internal.h"

/* the reference's partial-total width (reference_norm.c) and its cascade's leaf size
 * (reference_internal.h, cdf_k_sum_f32 / cdf_k_sumsq_dev_f32) */
enum { NORM_CHUNK = 1024, NORM_LEAF = 64, NORM_MAX_COLS = 16384 };

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define NORM_HAVE_AVX512 1
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl")
#include "kernels/avx512_pairs_impl.h"

/* T[k] = element k of rows [r0, r0 + nrows) (lanes past nrows: zero), k < cols, as f32 */
static void load_lanes(__m512 *T, const void *in, cdf_dtype dt, int64_t r0, int nrows, int64_t cols) {
    for (int64_t k0 = 0; k0 < cols; k0 += 16) {
        const int n = cols - k0 < 16 ? (int)(cols - k0) : 16;
        const __mmask16 m = (__mmask16)((1u << n) - 1);
        __m512i r[16];
        for (int i = 0; i < 16; i++) {
            if (i >= nrows) {
                r[i] = _mm512_setzero_si512();
            } else if (dt == CDF_F32) {
                r[i] = _mm512_castps_si512(_mm512_maskz_loadu_ps(m, (const float *)in + (r0 + i) * cols + k0));
            } else { /* bf16: the f32 with the same upper 16 bits (exact) */
                const __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)in + (r0 + i) * cols + k0);
                r[i] = _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
            }
        }
        transpose16_epi32(r);
        for (int k = 0; k < n; k++) T[k0 + k] = _mm512_castsi512_ps(r[k]);
    }
}

/* rows [r0, r0 + nrows) of out = Y[k] lanes, k < cols (f32, or bf16 rounded as cdf_f32_to_bf16) */
static void store_lanes(void *out, cdf_dtype dt, const __m512 *Y, int64_t r0, int nrows, int64_t cols) {
    for (int64_t k0 = 0; k0 < cols; k0 += 16) {
        const int n = cols - k0 < 16 ? (int)(cols - k0) : 16;
        const __mmask16 m = (__mmask16)((1u << n) - 1);
        __m512i r[16];
        for (int k = 0; k < 16; k++) r[k] = k < n ? _mm512_castps_si512(Y[k0 + k]) : _mm512_setzero_si512();
        transpose16_epi32(r);
        for (int i = 0; i < nrows; i++) {
            if (dt == CDF_F32)
                _mm512_mask_storeu_ps((float *)out + (r0 + i) * cols + k0, m, _mm512_castsi512_ps(r[i]));
            else
                _mm256_mask_storeu_epi16((uint16_t *)out + (r0 + i) * cols + k0, m,
                                         _mm512_cvtepi32_epi16(bf16_round_512(_mm512_castsi512_ps(r[i]))));
        }
    }
}

/* The reference's cascade (cdf_k_sum_f32 / cdf_k_sumsq_dev_f32) lane-wise over T[0..n):
 * sum of (T - shift), or of (T - shift)^2 */
static __m512 lane_cascade(const __m512 *T, int64_t n, __m512 shift, bool squared) {
    if (n <= NORM_LEAF) {
        __m512 s = _mm512_setzero_ps();
        for (int64_t i = 0; i < n; i++) {
            const __m512 d = _mm512_sub_ps(T[i], shift);
            s = _mm512_add_ps(s, squared ? _mm512_mul_ps(d, d) : d);
        }
        return s;
    }
    const int64_t half = n / 2;
    return _mm512_add_ps(lane_cascade(T, half, shift, squared), lane_cascade(T + half, n - half, shift, squared));
}

/* reference_norm.c's strided_sum: the cascade per NORM_CHUNK-wide piece, the pieces' sums added
 * in order onto 0 */
static __m512 lane_sum(const __m512 *T, int64_t n, __m512 shift, bool squared) {
    __m512 total = _mm512_setzero_ps();
    for (int64_t c0 = 0; c0 < n; c0 += NORM_CHUNK)
        total = _mm512_add_ps(total, lane_cascade(T + c0, n - c0 < NORM_CHUNK ? n - c0 : NORM_CHUNK, shift, squared));
    return total;
}

/* one group of rows; w, b: f32 [cols] or NULL */
static void norm_rows(bool rms, void *out, cdf_dtype out_dt, const void *in, cdf_dtype in_dt, int64_t r0, int nrows,
                      int64_t cols, float eps, const float *w, const float *b, __m512 *T) {
    load_lanes(T, in, in_dt, r0, nrows, cols);
    const __m512 n = _mm512_set1_ps((float)cols), one = _mm512_set1_ps(1.0f), e = _mm512_set1_ps(eps);
    if (rms) {
        /* ms = sum(x^2) / cols; rs = 1 / sqrt(ms + eps); y = x * rs (* w) */
        const __m512 ms = _mm512_div_ps(lane_sum(T, cols, _mm512_setzero_ps(), true), n);
        const __m512 rs = _mm512_div_ps(one, _mm512_sqrt_ps(_mm512_add_ps(ms, e)));
        for (int64_t k = 0; k < cols; k++) {
            __m512 y = _mm512_mul_ps(T[k], rs);
            if (w) y = _mm512_mul_ps(y, _mm512_set1_ps(w[k]));
            T[k] = y;
        }
    } else {
        /* mean = sum(x) / cols; var = sum((x - mean)^2) / cols; y = (x - mean) * rstd (* w) (+ b) */
        const __m512 mean = _mm512_div_ps(lane_sum(T, cols, _mm512_setzero_ps(), false), n);
        const __m512 var = _mm512_div_ps(lane_sum(T, cols, mean, true), n);
        const __m512 rstd = _mm512_div_ps(one, _mm512_sqrt_ps(_mm512_add_ps(var, e)));
        for (int64_t k = 0; k < cols; k++) {
            __m512 y = _mm512_mul_ps(_mm512_sub_ps(T[k], mean), rstd);
            if (w) y = _mm512_mul_ps(y, _mm512_set1_ps(w[k]));
            if (b) y = _mm512_add_ps(y, _mm512_set1_ps(b[k]));
            T[k] = y;
        }
    }
    store_lanes(out, out_dt, T, r0, nrows, cols);
}
#pragma GCC pop_options
#endif

static int g_on = -1;
void cdf_k_norm_fast_set(int on) { g_on = on < 0 ? -1 : on > 0; }

static bool enabled(void) {
    if (g_on < 0) {
        const char *e = getenv("CDIFFUSERS_FAST_NORM");
        g_on = !(e && strcmp(e, "0") == 0);
    }
    return g_on != 0;
}

/* the weight / bias as f32 (exact from bf16 / f16), or NULL */
static float *widen(const void *p, cdf_dtype dt, int64_t n) {
    if (!p) return NULL;
    float *f = malloc(sizeof(float) * (size_t)n);
    if (f) cdf_k_load_row(f, p, dt, 0, n);
    return f;
}

#ifdef NORM_HAVE_AVX512
/* Whether the 16-lane body takes a call: on, at the avx512 level, f32 / bf16 in and out, rows of
 * 1..NORM_MAX_COLS (the same answer for a whole call and for any group of its rows) */
static bool fast_takes(cdf_dtype in_dt, cdf_dtype out_dt, int64_t rows, int64_t cols) {
    return enabled() && cdf_k_isa_level() >= CDF_K_ISA_AVX512 && (in_dt == CDF_F32 || in_dt == CDF_BF16) &&
           (out_dt == CDF_F32 || out_dt == CDF_BF16) && rows >= 1 && cols >= 1 && cols <= NORM_MAX_COLS;
}
#endif

static cdf_status run(bool rms, void *out, cdf_dtype out_dt, const void *in, cdf_dtype in_dt, int64_t rows, int64_t cols,
                      float eps, const void *weight, const void *bias, cdf_dtype wdt, bool *handled) {
    *handled = false;
#ifdef NORM_HAVE_AVX512
    if (!fast_takes(in_dt, out_dt, rows, cols) || !out || !in) return CDF_OK;
    if ((weight || bias) && !cdf_k_is_float_storage(wdt)) return CDF_OK;
    const int64_t groups = (rows + 15) / 16;
    const int nthr = omp_get_max_threads() > 0 ? omp_get_max_threads() : 1;
    float *w = widen(weight, wdt, cols), *b = widen(bias, wdt, cols);
    __m512 *T = aligned_alloc(64, (size_t)nthr * (size_t)cols * sizeof(__m512));
    if (!T || (weight && !w) || (bias && !b)) { /* the reference needs no buffers */
        free(T), free(w), free(b);
        return CDF_OK;
    }
#pragma omp parallel for schedule(static) if (rows * cols > CDF_K_PAR_MIN_WORK / 4)
    for (int64_t g = 0; g < groups; g++) {
        const int nrows = rows - 16 * g < 16 ? (int)(rows - 16 * g) : 16;
        norm_rows(rms, out, out_dt, in, in_dt, 16 * g, nrows, cols, eps, w, b, T + (size_t)omp_get_thread_num() * (size_t)cols);
    }
    free(T), free(w), free(b);
    *handled = true;
#else
    (void)rms, (void)out, (void)out_dt, (void)in, (void)in_dt, (void)rows, (void)cols, (void)eps, (void)weight, (void)bias,
        (void)wdt;
#endif
    return CDF_OK;
}

size_t cdf_k_layer_norm_rows_scratch(int64_t cols) { return (size_t)(cols > 0 ? cols : 1) * 64; }

void cdf_k_layer_norm_rows(float *out, const void *in, cdf_dtype in_dt, int nrows, int64_t cols, float eps, void *lanes) {
#ifdef NORM_HAVE_AVX512
    /* the choice run() makes for a whole call, so that the values are the ones the unfused norm
     * node would have stored (the two bodies agree bit for bit anyway) */
    if (fast_takes(in_dt, CDF_F32, nrows, cols) && nrows <= 16 && lanes) {
        norm_rows(false, out, CDF_F32, in, in_dt, 0, nrows, cols, eps, NULL, NULL, lanes);
        return;
    }
#else
    (void)lanes;
#endif
    /* the reference; called from inside a parallel region, its own region is a team of one. It
     * fails only on a non-float dtype or a NULL pointer, which the fused kernel's checks rule out. */
    (void)cdf_k_layer_norm(out, CDF_F32, in, in_dt, nrows, cols, eps, NULL, NULL, CDF_F32);
}

cdf_status cdf_k_layer_norm_fast(void *out, cdf_dtype out_dt, const void *in, cdf_dtype in_dt, int64_t rows, int64_t cols,
                                 float eps, const void *weight, const void *bias, cdf_dtype wdt, bool *handled) {
    if (!handled) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_k_layer_norm_fast: handled is NULL");
    return run(false, out, out_dt, in, in_dt, rows, cols, eps, weight, bias, wdt, handled);
}

cdf_status cdf_k_rms_norm_fast(void *out, cdf_dtype out_dt, const void *in, cdf_dtype in_dt, int64_t rows, int64_t cols,
                               float eps, const void *weight, cdf_dtype wdt, bool *handled) {
    if (!handled) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_k_rms_norm_fast: handled is NULL");
    return run(true, out, out_dt, in, in_dt, rows, cols, eps, weight, NULL, wdt, handled);
}
