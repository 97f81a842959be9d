/* Reference kernel: batched matmul C = alpha op(A) op(B) (+ bias) (+ beta C).
 *
 * Plain C, but blocked so the compiler's auto-vectoriser gets a register tile: for each chunk of
 * NCW columns and KC depth, op(A) and op(B) are packed into f32 panels (which also does the dtype
 * conversion and the transposes once), then MR x NR register tiles accumulate over the depth
 * chunk in f32 and are added into an f32 target: C itself when C is f32, otherwise an f32
 * workspace that is rounded to C's dtype once at the end. Every product and every sum is f32. */
#include <omp.h>
#include <string.h>

#include "kernels/reference_internal.h"

enum {
    MR = 4,    /* register tile rows */
    NR = 8,    /* register tile columns (4x8 vectorises well at -O3 without -march) */
    KC = 256,  /* depth packed at a time */
    NCW = 512, /* columns packed at a time (multiple of NR) */
    MT = 64,   /* rows per parallel tile (multiple of MR) */
    NT = 128,  /* columns per parallel tile (multiple of NR) */
};

typedef struct {
    float *ap; /* [ceil(M/MR)][KC][MR] */
    float *bp; /* [NCW/NR][KC][NR] */
    float *w;  /* [M][NCW] f32 accumulator when C is not f32, else NULL */
} gemm_bufs;

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Ap[g][p][r] = alpha * op(A)[g*MR + r][pc + p], zero rows past M. */
static void pack_a_group(const cdf_k_matmul_args *x, const void *a, int64_t g, int64_t pc, int64_t kc, float *ap) {
    float *dst = ap + g * MR * KC;
    for (int r = 0; r < MR; r++) {
        int64_t i = g * MR + r;
        if (i >= x->M) {
            for (int64_t p = 0; p < kc; p++) dst[p * MR + r] = 0.0f;
            continue;
        }
        if (!x->trans_a && x->a_dt == CDF_F32) {
            const float *src = (const float *)a + i * x->lda + pc;
            for (int64_t p = 0; p < kc; p++) dst[p * MR + r] = x->alpha * src[p];
        } else {
            for (int64_t p = 0; p < kc; p++) {
                int64_t idx = x->trans_a ? (pc + p) * x->lda + i : i * x->lda + pc + p;
                dst[p * MR + r] = x->alpha * cdf_k_ld(a, x->a_dt, idx);
            }
        }
    }
}

/* Bp[g][p][j] = op(B)[pc + p][jc + g*NR + j], zero columns past N. */
static void pack_b_group(const cdf_k_matmul_args *x, const void *b, int64_t g, int64_t pc, int64_t kc, int64_t jc,
                         float *bp) {
    float *dst = bp + g * NR * KC;
    if (x->trans_b) { /* B is [N, K]: read along K (contiguous) */
        for (int j = 0; j < NR; j++) {
            int64_t col = jc + g * NR + j;
            if (col >= x->N) {
                for (int64_t p = 0; p < kc; p++) dst[p * NR + j] = 0.0f;
            } else if (x->b_dt == CDF_F32) {
                const float *src = (const float *)b + col * x->ldb + pc;
                for (int64_t p = 0; p < kc; p++) dst[p * NR + j] = src[p];
            } else {
                for (int64_t p = 0; p < kc; p++) dst[p * NR + j] = cdf_k_ld(b, x->b_dt, col * x->ldb + pc + p);
            }
        }
        return;
    }
    for (int64_t p = 0; p < kc; p++) {
        for (int j = 0; j < NR; j++) {
            int64_t col = jc + g * NR + j;
            float v = 0.0f;
            if (col < x->N) {
                int64_t idx = (pc + p) * x->ldb + col;
                v = x->b_dt == CDF_F32 ? ((const float *)b)[idx] : cdf_k_ld(b, x->b_dt, idx);
            }
            dst[p * NR + j] = v;
        }
    }
}

/* t[r][j] += sum_p ap[p][r] * bp[p][j] for r < mr, j < nr. */
static void micro_kernel(int64_t kc, const float *restrict ap, const float *restrict bp, float *restrict t,
                         int64_t ldt, int mr, int nr) {
    float acc[MR][NR];
    memset(acc, 0, sizeof acc);
    for (int64_t p = 0; p < kc; p++) {
        const float *av = ap + p * MR, *bv = bp + p * NR;
        for (int r = 0; r < MR; r++)
            for (int j = 0; j < NR; j++) acc[r][j] += av[r] * bv[j];
    }
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < nr; j++) t[r * ldt + j] += acc[r][j];
}

/* One matrix of the batch. With `parallel`, the work is shared by an OpenMP team; otherwise
 * the region is inactive (one thread), which is how the batch-parallel mode calls it. */
static void gemm_matrix(const cdf_k_matmul_args *x, int64_t bi, const gemm_bufs *bufs, int parallel) {
    const void *a = (const char *)x->a + bi * x->sa * (int64_t)cdf_dtype_size(x->a_dt);
    const void *b = (const char *)x->b + bi * x->sb * (int64_t)cdf_dtype_size(x->b_dt);
    void *c = (char *)x->c + bi * x->sc * (int64_t)cdf_dtype_size(x->c_dt);
    const int64_t M = x->M, N = x->N, K = x->K;
    const int64_t a_groups = (M + MR - 1) / MR;
    const int c_is_f32 = x->c_dt == CDF_F32;

#pragma omp parallel if (parallel)
    for (int64_t jc = 0; jc < N; jc += NCW) {
        const int64_t ncw = min64(NCW, N - jc);
        float *t = c_is_f32 ? (float *)c + jc : bufs->w;
        const int64_t ldt = c_is_f32 ? x->ldc : NCW;

        /* target = beta * C (beta is 0 or 1); with beta 0, C's old contents (maybe NaN) are ignored */
#pragma omp for schedule(static)
        for (int64_t i = 0; i < M; i++) {
            float *row = t + i * ldt;
            if (x->beta == 0.0f) {
                for (int64_t j = 0; j < ncw; j++) row[j] = 0.0f;
            } else if (!c_is_f32) {
                for (int64_t j = 0; j < ncw; j++) row[j] = cdf_k_ld(c, x->c_dt, i * x->ldc + jc + j);
            }
        }

        for (int64_t pc = 0; pc < K; pc += KC) {
            const int64_t kc = min64(KC, K - pc);
            const int64_t b_groups = (ncw + NR - 1) / NR;
#pragma omp for schedule(static)
            for (int64_t g = 0; g < a_groups; g++) pack_a_group(x, a, g, pc, kc, bufs->ap);
#pragma omp for schedule(static)
            for (int64_t g = 0; g < b_groups; g++) pack_b_group(x, b, g, pc, kc, jc, bufs->bp);

            const int64_t tiles_m = (M + MT - 1) / MT, tiles_n = (ncw + NT - 1) / NT;
#pragma omp for schedule(dynamic, 1)
            for (int64_t tile = 0; tile < tiles_m * tiles_n; tile++) {
                const int64_t i0 = (tile / tiles_n) * MT, j0 = (tile % tiles_n) * NT;
                const int64_t i1 = min64(i0 + MT, M), j1 = min64(j0 + NT, ncw);
                for (int64_t j = j0; j < j1; j += NR) {
                    const float *bpanel = bufs->bp + (j / NR) * NR * KC;
                    for (int64_t i = i0; i < i1; i += MR) {
                        micro_kernel(kc, bufs->ap + (i / MR) * MR * KC, bpanel, t + i * ldt + j, ldt,
                                     (int)min64(MR, i1 - i), (int)min64(NR, j1 - j));
                    }
                }
            }
        }

        /* + bias, then round to C's dtype when accumulating in the workspace */
#pragma omp for schedule(static)
        for (int64_t i = 0; i < M; i++) {
            float *row = t + i * ldt;
            if (x->bias)
                for (int64_t j = 0; j < ncw; j++) row[j] += cdf_k_ld(x->bias, x->bias_dt, jc + j);
            if (!c_is_f32) cdf_k_store_row(c, x->c_dt, i * x->ldc + jc, row, ncw);
        }
    }
}

void cdf_k_matmul_run_epilogue(const cdf_k_matmul_args *x) {
    if (!x || !x->epilogue || x->batch < 1 || x->M < 1) return;
    enum { ROWS = 64 }; /* rows per call: small enough to share, large enough to amortise a call */
    const int64_t chunks = (x->M + ROWS - 1) / ROWS, n = x->batch * chunks;
#pragma omp parallel for schedule(static) if (n > 1 && (double)x->M * (double)x->N * (double)x->batch > CDF_K_PAR_MIN_WORK)
    for (int64_t u = 0; u < n; u++) {
        const int64_t r0 = (u % chunks) * ROWS;
        x->epilogue(x->epilogue_ctx, u / chunks, r0, min64(x->M, r0 + ROWS));
    }
}

cdf_status cdf_k_matmul(const cdf_k_matmul_args *x) {
    static const char *fn = "cdf_k_matmul";
    CDF_K_CHECK_PTR(fn, "args", x);
    CDF_K_CHECK_NONNEG(fn, "batch", x->batch);
    CDF_K_CHECK_NONNEG(fn, "M", x->M);
    CDF_K_CHECK_NONNEG(fn, "N", x->N);
    CDF_K_CHECK_NONNEG(fn, "K", x->K);
    CDF_K_CHECK_FLOAT_DT(fn, "A", x->a_dt);
    CDF_K_CHECK_FLOAT_DT(fn, "B", x->b_dt);
    CDF_K_CHECK_FLOAT_DT(fn, "C", x->c_dt);
    if (x->bias) CDF_K_CHECK_FLOAT_DT(fn, "bias", x->bias_dt);
    if (x->beta != 0.0f && x->beta != 1.0f)
        return cdf_error(CDF_ERR_INVALID_ARG, "%s: beta = %g, only 0 and 1 are supported", fn, (double)x->beta);
    if (x->batch == 0 || x->M == 0 || x->N == 0) return CDF_OK;
    CDF_K_CHECK_PTR(fn, "C", x->c);
    if (x->ldc < x->N)
        return cdf_error(CDF_ERR_INVALID_ARG, "%s: ldc %lld < N %lld", fn, (long long)x->ldc, (long long)x->N);
    if (x->K > 0) {
        CDF_K_CHECK_PTR(fn, "A", x->a);
        CDF_K_CHECK_PTR(fn, "B", x->b);
        int64_t a_row = x->trans_a ? x->M : x->K, b_row = x->trans_b ? x->K : x->N;
        if (x->lda < a_row)
            return cdf_error(CDF_ERR_INVALID_ARG, "%s: lda %lld < %lld (trans_a %d)", fn, (long long)x->lda,
                             (long long)a_row, (int)x->trans_a);
        if (x->ldb < b_row)
            return cdf_error(CDF_ERR_INVALID_ARG, "%s: ldb %lld < %lld (trans_b %d)", fn, (long long)x->ldb,
                             (long long)b_row, (int)x->trans_b);
    }

    const int64_t M = x->M, N = x->N, K = x->K;
    const double flops = 2.0 * (double)M * (double)N * (double)(K > 0 ? K : 1);
    int nthr = omp_get_max_threads();
    if (nthr < 1) nthr = 1;
    const int64_t tiles = ((M + MT - 1) / MT) * ((min64(N, NCW) + NT - 1) / NT);
    /* many small matrices: one matrix per thread; otherwise share each matrix's tiles */
    const int batch_parallel = x->batch > 1 && nthr > 1 && tiles < nthr && flops * (double)x->batch > CDF_K_PAR_MIN_WORK;
    const int nbufs = batch_parallel ? nthr : 1;

    const size_t ap_n = (size_t)((M + MR - 1) / MR) * MR * KC, bp_n = (size_t)NCW * KC;
    const size_t w_n = x->c_dt == CDF_F32 ? 0 : (size_t)M * NCW;
    const size_t per = ap_n + bp_n + w_n;
    float *mem = malloc(sizeof(float) * per * (size_t)nbufs);
    if (!mem)
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes of packing buffers (M=%lld)", fn,
                         sizeof(float) * per * (size_t)nbufs, (long long)M);
    gemm_bufs bufs[nbufs];
    for (int i = 0; i < nbufs; i++) {
        bufs[i].ap = mem + per * (size_t)i;
        bufs[i].bp = bufs[i].ap + ap_n;
        bufs[i].w = w_n ? bufs[i].bp + bp_n : NULL;
    }

    if (batch_parallel) {
#pragma omp parallel for schedule(dynamic, 1)
        for (int64_t bi = 0; bi < x->batch; bi++) gemm_matrix(x, bi, &bufs[omp_get_thread_num()], 0);
    } else {
        const int par = flops > CDF_K_PAR_MIN_WORK;
        for (int64_t bi = 0; bi < x->batch; bi++) gemm_matrix(x, bi, &bufs[0], par);
    }
    free(mem);
    cdf_k_matmul_run_epilogue(x);
    return CDF_OK;
}
