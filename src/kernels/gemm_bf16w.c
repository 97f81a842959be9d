/* Own GEMM for bf16 weights on AVX2 + FMA CPUs without native bf16 arithmetic (the bf16 policy of
 * kernels/dispatch.h, "avx2" level): C = alpha op(A) B^T (+ bias) (+ beta C), where B is a bf16
 * weight shared by the batch and A is f32 (rounded to bf16 here, round-to-nearest-even, as the
 * policy says) or bf16.
 *
 * Why: the path it replaces widened the bf16 weights into an f32 copy for oneDNN's f32 kernels,
 * which doubles the weights' memory, and rounded A into a separate bf16 buffer per call. Here the
 * weights stay bf16: prepacked once per weight into 16-column panels (bf16, the same size as the
 * weight) and widened to f32 in registers. bf16 -> f32 is a 16-bit shift, so every product of a
 * rounded A element and a weight is exact in f32 and the sums are f32: the policy's numerics, in
 * another summation order.
 *
 * Panel layout: panel p holds columns [16p, 16p + 16) of op(B) for every k as 8 32-bit words;
 * word i = column 16p + i in the low half, column 16p + 8 + i in the high half. One 256-bit load
 * gives both f32 vectors: (w << 16) = columns 0..7, (w & 0xffff0000) = columns 8..15. Columns past
 * N are zero.
 *
 * Blocking (Goto-style, B already packed): a task is MC rows x NT columns of C; its rows of A are
 * packed once (rounded, f32, MR-row micro-panels over the whole K); then for each NC-column block
 * and KC-deep chunk the 6 x 16 register micro-kernel (12 ymm accumulators) runs over the block,
 * accumulating into an f32 block buffer that is finished (alpha, bias, beta C, C's dtype) once the
 * last chunk is in. Tasks are whole-row strips when there are enough of them (the epilogue of a
 * strip then runs right after it, while it is in cache), else a 2-D grid of row x column tiles
 * (the epilogue then runs after a barrier, over row chunks). One OpenMP region per call.
 *
 * The packed copies live in the prepack cache shared with oneDNN's copies (kernels/pack_cache.h),
 * keyed by the weight's address and layout and checked by a sampled checksum, dropped when the
 * backend frees the buffer and bounded by its one cap (CDIFFUSERS_PREPACK_MB); over the cap the
 * weight is packed per call. */
#include "kernels/gemm_bf16w.h"

#include <math.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "kernels/cpu_features.h"
#include "kernels/pack_cache.h"
#include "kernels/reference_internal.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define GB_HAVE_X86 1
#include <immintrin.h>
#endif

enum {
    MR = 6,   /* micro-tile rows */
    NR = 16,  /* micro-tile columns (two ymm of f32) */
    KC = 256, /* depth per pass over a block (B micro-panel 8 KiB: stays in L1 across the rows) */
    NC = 256, /* columns per block (block buffer MC x NC f32 and B block KC x NC bf16 in L2) */
    MC = 96,  /* rows per task at most (multiple of MR) */
};

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* ---- packing ---------------------------------------------------------------------------- */

static size_t panel_words(int64_t K) { return (size_t)K * (NR / 2); }
static size_t packed_bytes(int64_t N, int64_t K) { return (size_t)((N + NR - 1) / NR) * panel_words(K) * 4; }

/* Packs op(B) (trans_b: B [N, K], else [K, N], leading dimension ldb, bf16) into panels. */
static void pack_b(const uint16_t *b, int64_t N, int64_t K, int64_t ldb, bool trans_b, uint32_t *dst) {
    const int64_t panels = (N + NR - 1) / NR;
    const double work = (double)N * (double)K;
#pragma omp parallel for schedule(static) if (work > 262144)
    for (int64_t p = 0; p < panels; p++) {
        uint16_t *d = (uint16_t *)(dst + (size_t)p * panel_words(K));
        for (int c = 0; c < NR; c++) {
            const int64_t n = p * NR + c;
            const int pos = c < NR / 2 ? 2 * c : 2 * (c - NR / 2) + 1;
            if (n >= N) {
                for (int64_t k = 0; k < K; k++) d[k * NR + pos] = 0;
            } else if (trans_b) {
                const uint16_t *src = b + n * ldb;
                for (int64_t k = 0; k < K; k++) d[k * NR + pos] = src[k];
            } else {
                for (int64_t k = 0; k < K; k++) d[k * NR + pos] = b[k * ldb + n];
            }
        }
    }
}

/* bf16(v) as f32 (round to nearest even; NaN stays NaN), the value the policy multiplies. */
static inline float round_bf16(float v) { return cdf_bf16_to_f32(cdf_f32_to_bf16(v)); }

/* Ap[g][k][r] = bf16-rounded op(A)[m0 + g*MR + r][k] of batch item bi, zero rows past m1. */
static inline void pack_a(const cdf_k_matmul_args *x, int64_t bi, int64_t m0, int64_t m1, float *ap) {
    const int64_t K = x->K;
    const int64_t groups = (m1 - m0 + MR - 1) / MR;
    for (int64_t g = 0; g < groups; g++) {
        float *d = ap + (size_t)g * MR * K;
        for (int r = 0; r < MR; r++) {
            const int64_t i = m0 + g * MR + r;
            if (i >= m1) {
                for (int64_t k = 0; k < K; k++) d[k * MR + r] = 0.0f;
                continue;
            }
            if (x->a_dt == CDF_F32 && !x->trans_a) {
                const float *src = (const float *)x->a + bi * x->sa + i * x->lda;
                for (int64_t k = 0; k < K; k++) d[k * MR + r] = round_bf16(src[k]);
            } else if (x->a_dt == CDF_BF16 && !x->trans_a) {
                const uint16_t *src = (const uint16_t *)x->a + bi * x->sa + i * x->lda;
                for (int64_t k = 0; k < K; k++) d[k * MR + r] = cdf_bf16_to_f32(src[k]);
            } else {
                for (int64_t k = 0; k < K; k++) {
                    const int64_t idx = bi * x->sa + (x->trans_a ? k * x->lda + i : i * x->lda + k);
                    d[k * MR + r] = round_bf16(cdf_k_ld(x->a, x->a_dt, idx));
                }
            }
        }
    }
}

/* ---- the micro-kernel ----------------------------------------------------------------------- */

#ifdef GB_HAVE_X86
#pragma GCC push_options
#pragma GCC target("avx2,fma,tune=haswell")

/* t[r][0..16) (+)= sum_k ap[k][r] * widen(bp[k]) for the 6 rows r; accumulate: t holds a sum. */
static void ukernel_avx2(int64_t kc, const float *restrict ap, const uint32_t *restrict bp, float *restrict t,
                         int64_t ldt, bool accumulate) {
    __m256 c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51;
    if (accumulate) {
        c00 = _mm256_loadu_ps(t), c01 = _mm256_loadu_ps(t + 8);
        c10 = _mm256_loadu_ps(t + ldt), c11 = _mm256_loadu_ps(t + ldt + 8);
        c20 = _mm256_loadu_ps(t + 2 * ldt), c21 = _mm256_loadu_ps(t + 2 * ldt + 8);
        c30 = _mm256_loadu_ps(t + 3 * ldt), c31 = _mm256_loadu_ps(t + 3 * ldt + 8);
        c40 = _mm256_loadu_ps(t + 4 * ldt), c41 = _mm256_loadu_ps(t + 4 * ldt + 8);
        c50 = _mm256_loadu_ps(t + 5 * ldt), c51 = _mm256_loadu_ps(t + 5 * ldt + 8);
    } else {
        c00 = c01 = c10 = c11 = c20 = c21 = c30 = c31 = c40 = c41 = c50 = c51 = _mm256_setzero_ps();
    }
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
    for (int64_t k = 0; k < kc; k++, ap += MR, bp += NR / 2) {
        const __m256i w = _mm256_loadu_si256((const __m256i *)bp);
        const __m256 b0 = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
        const __m256 b1 = _mm256_castsi256_ps(_mm256_and_si256(w, hi));
        __m256 a = _mm256_broadcast_ss(ap);
        c00 = _mm256_fmadd_ps(a, b0, c00), c01 = _mm256_fmadd_ps(a, b1, c01);
        a = _mm256_broadcast_ss(ap + 1);
        c10 = _mm256_fmadd_ps(a, b0, c10), c11 = _mm256_fmadd_ps(a, b1, c11);
        a = _mm256_broadcast_ss(ap + 2);
        c20 = _mm256_fmadd_ps(a, b0, c20), c21 = _mm256_fmadd_ps(a, b1, c21);
        a = _mm256_broadcast_ss(ap + 3);
        c30 = _mm256_fmadd_ps(a, b0, c30), c31 = _mm256_fmadd_ps(a, b1, c31);
        a = _mm256_broadcast_ss(ap + 4);
        c40 = _mm256_fmadd_ps(a, b0, c40), c41 = _mm256_fmadd_ps(a, b1, c41);
        a = _mm256_broadcast_ss(ap + 5);
        c50 = _mm256_fmadd_ps(a, b0, c50), c51 = _mm256_fmadd_ps(a, b1, c51);
    }
    _mm256_storeu_ps(t, c00), _mm256_storeu_ps(t + 8, c01);
    _mm256_storeu_ps(t + ldt, c10), _mm256_storeu_ps(t + ldt + 8, c11);
    _mm256_storeu_ps(t + 2 * ldt, c20), _mm256_storeu_ps(t + 2 * ldt + 8, c21);
    _mm256_storeu_ps(t + 3 * ldt, c30), _mm256_storeu_ps(t + 3 * ldt + 8, c31);
    _mm256_storeu_ps(t + 4 * ldt, c40), _mm256_storeu_ps(t + 4 * ldt + 8, c41);
    _mm256_storeu_ps(t + 5 * ldt, c50), _mm256_storeu_ps(t + 5 * ldt + 8, c51);
}

#pragma GCC pop_options

/* ---- the driver ------------------------------------------------------------------------------ */

/* C rows [m0, m1) x columns [n0, n1) of batch item bi. ap: this thread's A strip buffer
 * (ceil(MC/MR) * MR * K floats), t: its block buffer (MC x NC floats). */
static void gemm_tile(const cdf_k_matmul_args *x, const uint32_t *bp, int64_t bi, int64_t m0, int64_t m1, int64_t n0,
                      int64_t n1, float *ap, float *t) {
    const int64_t K = x->K, mrows = m1 - m0, groups = (mrows + MR - 1) / MR;
    pack_a(x, bi, m0, m1, ap);
    const size_t csz = cdf_dtype_size(x->c_dt);
    char *c = (char *)x->c + (size_t)(bi * x->sc) * csz;
    for (int64_t jc = n0; jc < n1; jc += NC) {
        const int64_t ncols = min64(NC, n1 - jc), npan = (ncols + NR - 1) / NR;
        for (int64_t pc = 0; pc < K; pc += KC) {
            const int64_t kc = min64(KC, K - pc);
            for (int64_t jp = 0; jp < npan; jp++) {
                const uint32_t *bpan = bp + (size_t)((jc / NR) + jp) * panel_words(K) + (size_t)pc * (NR / 2);
                for (int64_t g = 0; g < groups; g++)
                    ukernel_avx2(kc, ap + (size_t)g * MR * K + (size_t)pc * MR, bpan, t + g * MR * NC + jp * NR, NC,
                                 pc > 0);
            }
        }
        /* finish: alpha, bias, beta C (beta 0: C's old contents, maybe NaN, are ignored), C's dtype.
         * The bias and a non-f32 C row are converted to f32 a row at a time first, so that the
         * additions are plain loops (read element by element through cdf_k_ld, the dtype switch
         * per element was most of this function's time at the AVX2 level: ~2.5% of a forward) */
        float bias_f[NC], c_f[NC];
        if (x->bias) cdf_k_load_row(bias_f, x->bias, x->bias_dt, jc, ncols);
        for (int64_t r = 0; r < mrows; r++) {
            float *row = t + r * NC;
            const int64_t off = (m0 + r) * x->ldc + jc;
            if (x->alpha != 1.0f)
                for (int64_t j = 0; j < ncols; j++) row[j] *= x->alpha;
            if (x->bias)
                for (int64_t j = 0; j < ncols; j++) row[j] += bias_f[j];
            if (x->c_dt == CDF_F32) {
                float *cr = (float *)c + off;
                if (x->beta != 0.0f)
                    for (int64_t j = 0; j < ncols; j++) cr[j] += row[j];
                else
                    memcpy(cr, row, sizeof(float) * (size_t)ncols);
            } else {
                if (x->beta != 0.0f) {
                    cdf_k_load_row(c_f, c, x->c_dt, off, ncols);
                    for (int64_t j = 0; j < ncols; j++) row[j] += c_f[j];
                }
                cdf_k_store_row(c, x->c_dt, off, row, ncols);
            }
        }
    }
}

#endif /* GB_HAVE_X86 */

/* ---- the packed weight ------------------------------------------------------------------------ */

/* The cache's layout tag of a packed weight (zeroed padding: compared with memcmp). */
typedef struct panel_layout {
    int64_t N, K, ldb, trans_b;
} panel_layout;

static atomic_llong g_unpacked_calls; /* the cache counts the rest (kernels/pack_cache.h) */

static bool fill_panels(void *ctx, void *dst) {
    const cdf_k_matmul_args *x = ctx;
    pack_b(x->b, x->N, x->K, x->ldb, x->trans_b, dst);
    return true;
}

/* The packed weight for x: the cached copy (*held set, cdf_k_pack_release it) or, when the cap
 * leaves no room, a copy for this call (*owned set, free it). NULL when out of memory. */
static const uint32_t *packed_weight(const cdf_k_matmul_args *x, cdf_k_pack **held, uint32_t **owned) {
    *held = NULL;
    *owned = NULL;
    const size_t bytes = packed_bytes(x->N, x->K);
    /* a transient B (overwritten right after the call) is never looked up nor cached */
    if (!x->b_transient) {
        const int64_t rows = x->trans_b ? x->N : x->K, cols = x->trans_b ? x->K : x->N;
        const panel_layout lay = {.N = x->N, .K = x->K, .ldb = x->ldb, .trans_b = x->trans_b};
        const cdf_k_pack_key key = {.kind = CDF_K_PACK_OWN_GEMM, .src = x->b, .bytes = bytes, .layout = &lay,
                                    .layout_size = sizeof lay,
                                    .sum = cdf_k_pack_checksum(x->b, 2, rows, cols, x->ldb)};
        const uint32_t *cached = cdf_k_pack_get(&key, fill_panels, (void *)x, held);
        if (cached) return cached;
    }
    uint32_t *data = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (!data) return NULL;
    pack_b(x->b, x->N, x->K, x->ldb, x->trans_b, data);
    atomic_fetch_add(&g_unpacked_calls, 1);
    *owned = data;
    return data;
}

void cdf_k_gemm_bf16w_get_stats(cdf_k_gemm_bf16w_stats *out) {
    if (!out) return;
    cdf_k_pack_stats ps;
    cdf_k_pack_get_stats(CDF_K_PACK_OWN_GEMM, &ps);
    *out = (cdf_k_gemm_bf16w_stats){.packs = ps.packs, .repacks = ps.repacks, .hits = ps.hits,
                                    .unpacked_calls = atomic_load(&g_unpacked_calls),
                                    .packed_weights = ps.packed_weights, .packed_bytes = ps.packed_bytes};
}

void cdf_k_gemm_bf16w_reset_stats(void) {
    cdf_k_pack_reset_stats(CDF_K_PACK_OWN_GEMM);
    atomic_store(&g_unpacked_calls, 0);
}

/* ---- entry ----------------------------------------------------------------------------------- */

bool cdf_k_gemm_bf16w_supports(const cdf_k_matmul_args *x) {
#ifdef GB_HAVE_X86
    if (!x || !cdf_k_cpu()->avx2_fma) return false;
    if (x->b_dt != CDF_BF16 || (x->a_dt != CDF_F32 && x->a_dt != CDF_BF16)) return false;
    if (x->c_dt != CDF_F32 && x->c_dt != CDF_BF16) return false;
    if (x->bias && x->bias_dt != CDF_F32 && x->bias_dt != CDF_BF16) return false;
    /* well-formed, non-empty problems with one weight matrix for the batch; the rest (and the
     * reporting of malformed ones) is the other paths' */
    if (x->batch < 1 || x->M < 1 || x->N < 1 || x->K < 1 || !x->a || !x->b || !x->c) return false;
    if (x->beta != 0.0f && x->beta != 1.0f) return false;
    if (x->lda < (x->trans_a ? x->M : x->K) || x->ldb < (x->trans_b ? x->K : x->N) || x->ldc < x->N) return false;
    if (x->sa < 0 || x->sc < 0 || (x->batch > 1 && (x->sb != 0 || x->sc == 0))) return false;
    return true;
#else
    (void)x;
    return false;
#endif
}

cdf_status cdf_k_gemm_bf16w(const cdf_k_matmul_args *x, bool *handled) {
    static const char *fn = "cdf_k_gemm_bf16w";
    if (!handled) return cdf_error(CDF_ERR_INVALID_ARG, "%s: handled is NULL", fn);
    *handled = false;
#ifdef GB_HAVE_X86
    if (!cdf_k_gemm_bf16w_supports(x)) return CDF_OK;
    const int64_t M = x->M, N = x->N, K = x->K, batch = x->batch;
    int nthr = omp_get_max_threads();
    if (nthr < 1) nthr = 1;
    const double flops = 2.0 * (double)batch * (double)M * (double)N * (double)K;
    if (flops <= CDF_K_PAR_MIN_WORK) nthr = 1;

    /* Row strips of at most MC rows, balanced over the threads; with fewer strips than threads,
     * a 2-D grid that also splits the columns (in whole NR panels). */
    int64_t strips = (M + MC - 1) / MC;
    if (batch == 1 && strips >= nthr) strips = (strips + nthr - 1) / nthr * nthr;
    int64_t mc = ((M + strips - 1) / strips + MR - 1) / MR * MR;
    if (mc > MC) mc = MC;
    strips = (M + mc - 1) / mc;
    int64_t col_tiles = 1;
    if (batch * strips < nthr) {
        const int64_t panels = (N + NR - 1) / NR, want = (2 * nthr + batch * strips - 1) / (batch * strips);
        col_tiles = want < panels ? want : panels;
    }
    const int64_t panels = (N + NR - 1) / NR, pan_per_tile = (panels + col_tiles - 1) / col_tiles;
    col_tiles = (panels + pan_per_tile - 1) / pan_per_tile;
    const int64_t tasks = batch * strips * col_tiles;
    if (tasks < nthr) nthr = (int)tasks;

    cdf_k_pack *held;
    uint32_t *owned;
    const uint32_t *bp = packed_weight(x, &held, &owned);
    if (!bp) return CDF_OK; /* out of memory for the panels: the other paths need less */
    const size_t ap_n = (size_t)((mc + MR - 1) / MR) * MR * (size_t)K, t_n = (size_t)((mc + MR - 1) / MR) * MR * NC;
    const size_t per = (ap_n + t_n + 15) & ~(size_t)15;
    float *mem = aligned_alloc(64, sizeof(float) * per * (size_t)nthr);
    if (!mem) {
        cdf_k_pack_release(held);
        free(owned);
        return CDF_OK;
    }
#pragma omp parallel num_threads(nthr)
    {
        float *ap = mem + per * (size_t)omp_get_thread_num(), *t = ap + ap_n;
#pragma omp for schedule(dynamic, 1)
        for (int64_t u = 0; u < tasks; u++) {
            const int64_t bi = u / (strips * col_tiles), s = (u / col_tiles) % strips, ct = u % col_tiles;
            const int64_t m0 = s * mc, m1 = min64(M, m0 + mc);
            const int64_t n0 = ct * pan_per_tile * NR, n1 = min64(N, n0 + pan_per_tile * NR);
            gemm_tile(x, bp, bi, m0, m1, n0, n1, ap, t);
            if (x->epilogue && col_tiles == 1) x->epilogue(x->epilogue_ctx, bi, m0, m1);
        }
        /* split columns: a row is final only once every column tile is (after the for's barrier) */
        if (x->epilogue && col_tiles > 1) {
#pragma omp for schedule(static)
            for (int64_t u = 0; u < batch * strips; u++) {
                const int64_t m0 = (u % strips) * mc;
                x->epilogue(x->epilogue_ctx, u / strips, m0, min64(M, m0 + mc));
            }
        }
    }
    free(mem);
    cdf_k_pack_release(held);
    free(owned);
    *handled = true;
#else
    (void)x;
#endif
    return CDF_OK;
}
