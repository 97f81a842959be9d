/* Kernel dispatch: compute policy + ISA fallback chain, see dispatch.h. */
#include "kernels/dispatch.h"

#include <omp.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "kernels/cpu_features.h"
#include "kernels/gemm_bf16w.h"
#include "kernels/gemm_vdpbf16.h"

bool cdf_k_reference_only(void) { return cdf_k_isa_level() < CDF_K_ISA_AVX2; }

/* dst[i] = bf16(src[i]) for n elements (OpenMP for large n). */
static void round_bf16(uint16_t *dst, const float *src, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) dst[i] = cdf_f32_to_bf16(src[i]);
}

/* The bf16 policy's A: op(A) rounded into a dense bf16 buffer [ba][M][K] (ba = batch when A has
 * a batch stride, else 1), described in *r (a copy of *x pointing at it). NULL when x is not a
 * well-formed problem (the kernel then reports it) or out of memory (*oom set). */
static uint16_t *round_matmul_a(const cdf_k_matmul_args *x, cdf_k_matmul_args *r, bool *oom) {
    *oom = false;
    if (x->batch < 1 || x->M < 1 || x->K < 1 || x->N < 1 || !x->a || x->sa < 0) return NULL;
    if (x->lda < (x->trans_a ? x->M : x->K)) return NULL;
    const int64_t ba = x->batch > 1 && x->sa != 0 ? x->batch : 1;
    const int64_t M = x->M, K = x->K;
    uint16_t *buf = malloc(sizeof(uint16_t) * (size_t)(ba * M * K));
    if (!buf) {
        *oom = true;
        return NULL;
    }
    const float *a = x->a;
    const double work = (double)ba * (double)M * (double)K;
#pragma omp parallel for collapse(2) schedule(static) if (work > 65536)
    for (int64_t b = 0; b < ba; b++)
        for (int64_t i = 0; i < M; i++) {
            uint16_t *dst = buf + (b * M + i) * K;
            const float *src = a + b * x->sa;
            if (x->trans_a)
                for (int64_t p = 0; p < K; p++) dst[p] = cdf_f32_to_bf16(src[p * x->lda + i]);
            else
                for (int64_t p = 0; p < K; p++) dst[p] = cdf_f32_to_bf16(src[i * x->lda + p]);
        }
    *r = *x;
    r->a = buf;
    r->a_dt = CDF_BF16;
    r->trans_a = false;
    r->lda = K;
    r->sa = ba > 1 ? M * K : 0;
    return buf;
}

/* The epilogue (args->epilogue) is each path's to call: the own GEMM per finished row panel, the
 * reference and oneDNN paths after the product (cdf_k_matmul_run_epilogue). */
cdf_status cdf_k_matmul_dispatch(const cdf_k_matmul_args *a) {
    const bool fast = cdf_k_isa_level() >= CDF_K_ISA_AVX2;
    bool handled = false;
    cdf_status s;
    /* bf16 weights at the AVX2 level: the own GEMM (weights stay bf16, A rounded as it is packed),
     * faster than oneDNN's f32 kernels on a widened f32 copy at the DiT shapes (bench/RESULTS.md).
     * Above AVX2 oneDNN stays: its AVX-512 / native bf16 kernels were not measured against it. */
    if (cdf_k_isa_level() == CDF_K_ISA_AVX2 && cdf_k_gemm_bf16w_supports(a)) {
        s = cdf_k_gemm_bf16w(a, &handled);
        if (s != CDF_OK || handled) return s;
    }
    /* bf16 weights at the avx512_bf16 level: the own GEMM (vdpbf16ps, or AMX tiles where AMX is
     * usable) on slabs repacked from the plain weight (kernels/gemm_vdpbf16.c): no prepacked copy */
    if (cdf_k_gemm_vdp_bf16_supports(a)) {
        s = cdf_k_gemm_vdp_bf16(a, &handled);
        if (s != CDF_OK || handled) return s;
    }
    if (fast) {
        /* its weights with few rows: oneDNN, keeping no prepacked copy (gemm_vdpbf16.h) */
        cdf_k_matmul_args nopack;
        const cdf_k_matmul_args *f = a;
        if (cdf_k_gemm_vdp_bf16_skips_pack(a)) {
            nopack = *a;
            nopack.b_transient = true;
            f = &nopack;
        }
        s = cdf_k_matmul_fast(f, &handled);
        if (s != CDF_OK || handled) return s;
    }
    if (a && a->b_dt == CDF_BF16 && a->a_dt == CDF_F32) {
        /* bf16 policy without oneDNN's bf16 kernels: round A here, then f32 compute */
        cdf_k_matmul_args r;
        bool oom;
        uint16_t *buf = round_matmul_a(a, &r, &oom);
        if (oom)
            return cdf_error(CDF_ERR_OUT_OF_MEMORY, "cdf_k_matmul: cannot allocate the bf16 copy of A (%lld x %lld)",
                             (long long)a->M, (long long)a->K);
        if (buf) {
            s = CDF_OK;
            handled = false;
            if (fast) s = cdf_k_matmul_fast(&r, &handled);
            if (s == CDF_OK && !handled) s = cdf_k_matmul(&r);
            free(buf);
            return s;
        }
    }
    return cdf_k_matmul(a);
}

cdf_status cdf_k_conv2d_dispatch(const cdf_k_conv2d_args *a) {
    const bool fast = cdf_k_isa_level() >= CDF_K_ISA_AVX2;
    bool handled = false;
    cdf_status s;
    if (fast) {
        s = cdf_k_conv2d_fast(a, &handled);
        if (s != CDF_OK || handled) return s;
    }
    if (a && a->w_dt == CDF_BF16 && a->x_dt == CDF_F32 && a->x && a->n > 0 && a->cin > 0 && a->h > 0 && a->w > 0) {
        const int64_t n = a->n * a->cin * a->h * a->w;
        uint16_t *buf = malloc(sizeof(uint16_t) * (size_t)n);
        if (!buf)
            return cdf_error(CDF_ERR_OUT_OF_MEMORY, "cdf_k_conv2d: cannot allocate the bf16 copy of the input (%lld elements)",
                             (long long)n);
        round_bf16(buf, a->x, n);
        cdf_k_conv2d_args r = *a;
        r.x = buf;
        r.x_dt = CDF_BF16;
        s = CDF_OK;
        handled = false;
        if (fast) s = cdf_k_conv2d_fast(&r, &handled);
        if (s == CDF_OK && !handled) s = cdf_k_conv2d(&r);
        free(buf);
        return s;
    }
    return cdf_k_conv2d(a);
}

/* attention calls by policy: [0] f32 q, k, v, [1] bf16 (cdf_k_attention_counts) */
static _Atomic int64_t g_attention_calls[2];

void cdf_k_attention_counts(int64_t out[2]) {
    out[0] = atomic_load(&g_attention_calls[0]);
    out[1] = atomic_load(&g_attention_calls[1]);
}

cdf_status cdf_k_attention_dispatch(const cdf_k_attention_args *a) {
    atomic_fetch_add(&g_attention_calls[a->q_dt == CDF_BF16], 1);
    if (cdf_k_isa_level() >= CDF_K_ISA_AVX2) {
        bool handled = false;
        cdf_status s = cdf_k_attention_fast(a, &handled);
        if (s != CDF_OK || handled) return s;
    }
    return cdf_k_attention(a);
}

cdf_status cdf_k_layer_norm_dispatch(void *out, cdf_dtype out_dt, const void *in, cdf_dtype in_dt, int64_t rows,
                                     int64_t cols, float eps, const void *weight, const void *bias, cdf_dtype wdt) {
    bool handled = false;
    cdf_status s = cdf_k_layer_norm_fast(out, out_dt, in, in_dt, rows, cols, eps, weight, bias, wdt, &handled);
    if (s != CDF_OK || handled) return s;
    return cdf_k_layer_norm(out, out_dt, in, in_dt, rows, cols, eps, weight, bias, wdt);
}

cdf_status cdf_k_rms_norm_dispatch(void *out, cdf_dtype out_dt, const void *in, cdf_dtype in_dt, int64_t rows,
                                   int64_t cols, float eps, const void *weight, cdf_dtype wdt) {
    bool handled = false;
    cdf_status s = cdf_k_rms_norm_fast(out, out_dt, in, in_dt, rows, cols, eps, weight, wdt, &handled);
    if (s != CDF_OK || handled) return s;
    return cdf_k_rms_norm(out, out_dt, in, in_dt, rows, cols, eps, weight, wdt);
}
