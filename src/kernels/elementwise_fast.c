/* Vectorised sigmoid-family elementwise ops for the AVX2 and AVX-512 levels: GELU (tanh form),
 * SiLU, sigmoid and quick-GELU, computed as x / (1 + exp(-z)) with a polynomial exp in 8 or
 * 16-wide vectors (elementwise_fast_impl.h). libm's scalar tanhf/expf behind these ops was ~11% of
 * an SD3.5-Medium transformer forward (bench/RESULTS.md, "Where cdiffusers' time goes").
 *
 * Numerics: 0.5 x (1 + tanh(u)) and x sigmoid(2u) are the same function; the sigmoid form has no
 * cancellation near 0 and needs one exp. Results are within a few f32 ulps of the libm-based
 * scalar definitions (cdf_k_unary_f, which the generic level keeps using); tests/test_kernels_fast.c
 * checks every op at every level against them. */
#include <stdint.h>
#include <string.h>

#include "kernels/cpu_features.h"
#include "kernels/reference_internal.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define EW_HAVE_X86 1
#endif

#ifdef EW_HAVE_X86
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,tune=skylake-avx512")
#define VW 16
#define SFX avx512
#include "kernels/elementwise_fast_impl.h"
#undef VW
#undef SFX
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,tune=haswell")
#define VW 8
#define SFX avx2
#include "kernels/elementwise_fast_impl.h"
#undef VW
#undef SFX
#pragma GCC pop_options
#endif

static bool vectorised_op(cdf_unary_op op) {
    return op == CDF_UN_GELU_TANH || op == CDF_UN_SILU || op == CDF_UN_SIGMOID || op == CDF_UN_QUICK_GELU;
}

void cdf_k_unary_span_at(cdf_k_isa isa, cdf_unary_op op, float *v, int64_t len, float p0, float p1) {
    if (isa > cdf_k_isa_native()) isa = cdf_k_isa_native();
#ifdef EW_HAVE_X86
    if (vectorised_op(op) && isa >= CDF_K_ISA_AVX512) {
        unary_span_avx512(op, v, len);
        return;
    }
    if (vectorised_op(op) && isa >= CDF_K_ISA_AVX2) {
        unary_span_avx2(op, v, len);
        return;
    }
#endif
    for (int64_t i = 0; i < len; i++) v[i] = cdf_k_unary_f(op, v[i], p0, p1);
}

void cdf_k_unary_span(cdf_unary_op op, float *v, int64_t len, float p0, float p1) {
    cdf_k_unary_span_at(cdf_k_isa_level(), op, v, len, p0, p1);
}

void cdf_k_binary_span(cdf_binary_op op, bool rhs, float *v, const float *o, int64_t len) {
#ifdef EW_HAVE_X86
    const bool vectorised = op == CDF_BIN_ADD || op == CDF_BIN_SUB || op == CDF_BIN_MUL || op == CDF_BIN_DIV;
    const cdf_k_isa isa = cdf_k_isa_level();
    if (vectorised && isa >= CDF_K_ISA_AVX512) {
        binary_span_avx512(op, rhs, v, o, len);
        return;
    }
    if (vectorised && isa >= CDF_K_ISA_AVX2) {
        binary_span_avx2(op, rhs, v, o, len);
        return;
    }
#endif
    for (int64_t i = 0; i < len; i++) v[i] = rhs ? cdf_k_binary_f(op, o[i], v[i]) : cdf_k_binary_f(op, v[i], o[i]);
}

bool cdf_k_convert_span(void *dst, cdf_dtype ddt, const void *src, cdf_dtype sdt, int64_t n) {
#ifdef EW_HAVE_X86
    const cdf_k_isa isa = cdf_k_isa_level();
    if (isa < CDF_K_ISA_AVX2 || n < 1) return false;
    if (sdt == CDF_F32 && ddt == CDF_BF16) {
        if (isa >= CDF_K_ISA_AVX512) f32_to_bf16_span_avx512(dst, src, n);
        else f32_to_bf16_span_avx2(dst, src, n);
        return true;
    }
    if (sdt == CDF_BF16 && ddt == CDF_F32) {
        if (isa >= CDF_K_ISA_AVX512) bf16_to_f32_span_avx512(dst, src, n);
        else bf16_to_f32_span_avx2(dst, src, n);
        return true;
    }
#else
    (void)dst, (void)ddt, (void)src, (void)sdt, (void)n;
#endif
    return false;
}
