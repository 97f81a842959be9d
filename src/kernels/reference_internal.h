/* Helpers shared by the reference kernels (src/kernels/reference_*.c). Not a public header. */
#ifndef CDF_KERNELS_REFERENCE_INTERNAL_H
#define CDF_KERNELS_REFERENCE_INTERNAL_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "kernels/cpu_features.h"
#include "kernels/kernels.h"

/* OpenMP is worth its fork/join cost only above this many (rough) flops. */
#define CDF_K_PAR_MIN_WORK 32768

/* The float storage dtypes a float operand may have. */
static inline int cdf_k_is_float_storage(cdf_dtype dt) { return dt == CDF_F32 || dt == CDF_BF16 || dt == CDF_F16; }

/* Report a bad float operand dtype for kernel `fn`, operand `what`. */
#define CDF_K_CHECK_FLOAT_DT(fn, what, dt)                                                                      \
    do {                                                                                                       \
        if (!cdf_k_is_float_storage(dt))                                                                       \
            return cdf_error(CDF_ERR_DTYPE, "%s: %s dtype %s is not f32/bf16/f16", fn, what, cdf_dtype_name(dt)); \
    } while (0)

#define CDF_K_CHECK_PTR(fn, what, p)                                                                           \
    do {                                                                                                       \
        if (!(p)) return cdf_error(CDF_ERR_INVALID_ARG, "%s: %s is NULL", fn, what);                           \
    } while (0)

#define CDF_K_CHECK_NONNEG(fn, what, v)                                                                        \
    do {                                                                                                       \
        if ((v) < 0) return cdf_error(CDF_ERR_INVALID_ARG, "%s: %s = %lld is negative", fn, what, (long long)(v)); \
    } while (0)

/* Calls x's epilogue (if any) over every row of every batch item of C, in row chunks shared by
 * an OpenMP team: for the paths that finish the whole C before the epilogue can run. */
void cdf_k_matmul_run_epilogue(const cdf_k_matmul_args *x);

/* dst[0..n) = src[0..n) converted, contiguous, for f32 -> bf16 (as cdf_f32_to_bf16) and bf16 -> f32
 * in AVX2 / AVX-512 vectors (elementwise_fast.c): false (nothing written) for other dtype pairs,
 * below the avx2 level or off x86 GCC builds. */
bool cdf_k_convert_span(void *dst, cdf_dtype ddt, const void *src, cdf_dtype sdt, int64_t n);

/* Convert n elements of a float-storage operand to f32 (contiguous). */
static inline void cdf_k_load_row(float *dst, const void *src, cdf_dtype dt, int64_t offset, int64_t n) {
    switch (dt) {
    case CDF_F32: /* glibc's memcpy: the widest vectors the CPU has (this file is built generic) */
        if (n > 0) memcpy(dst, (const float *)src + offset, sizeof(float) * (size_t)n);
        break;
    case CDF_BF16: {
        const uint16_t *s = (const uint16_t *)src + offset;
        if (cdf_k_convert_span(dst, CDF_F32, s, CDF_BF16, n)) break;
        for (int64_t i = 0; i < n; i++) dst[i] = cdf_bf16_to_f32(s[i]);
        break;
    }
    default:
        for (int64_t i = 0; i < n; i++) dst[i] = cdf_k_ld(src, dt, offset + i);
        break;
    }
}

/* Store n f32 values to a float-storage operand (round to nearest even). */
static inline void cdf_k_store_row(void *dst, cdf_dtype dt, int64_t offset, const float *src, int64_t n) {
    switch (dt) {
    case CDF_F32:
        if (n > 0) memcpy((float *)dst + offset, src, sizeof(float) * (size_t)n);
        break;
    case CDF_BF16: {
        uint16_t *d = (uint16_t *)dst + offset;
        if (cdf_k_convert_span(d, CDF_BF16, src, CDF_F32, n)) break;
        for (int64_t i = 0; i < n; i++) d[i] = cdf_f32_to_bf16(src[i]);
        break;
    }
    default:
        for (int64_t i = 0; i < n; i++) cdf_k_st(dst, dt, offset + i, src[i]);
        break;
    }
}

/* Sum of n f32 values with f32 accumulation, summed in blocks (cascade) so the rounding error grows
 * like log(n) rather than n — torch's CPU reductions also use a cascade. */
static inline float cdf_k_sum_f32(const float *x, int64_t n) {
    if (n <= 64) {
        float s = 0.0f;
        for (int64_t i = 0; i < n; i++) s += x[i];
        return s;
    }
    int64_t half = n / 2;
    return cdf_k_sum_f32(x, half) + cdf_k_sum_f32(x + half, n - half);
}

/* Sum of (x[i] - mean)^2, same cascade. */
static inline float cdf_k_sumsq_dev_f32(const float *x, int64_t n, float mean) {
    if (n <= 64) {
        float s = 0.0f;
        for (int64_t i = 0; i < n; i++) {
            float d = x[i] - mean;
            s += d * d;
        }
        return s;
    }
    int64_t half = n / 2;
    return cdf_k_sumsq_dev_f32(x, half, mean) + cdf_k_sumsq_dev_f32(x + half, n - half, mean);
}

static inline float cdf_k_sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

/* The scalar definitions of the elementwise ops, shared by the plain and the fused kernels so
 * that a fused chain computes bit-identical results. */
static inline float cdf_k_unary_f(cdf_unary_op op, float x, float p0, float p1) {
    switch (op) {
    case CDF_UN_NEG: return -x;
    case CDF_UN_EXP: return expf(x);
    case CDF_UN_LOG: return logf(x);
    case CDF_UN_SQRT: return sqrtf(x);
    case CDF_UN_RSQRT: return 1.0f / sqrtf(x);
    case CDF_UN_SQUARE: return x * x;
    case CDF_UN_ABS: return fabsf(x);
    case CDF_UN_SIGMOID: return cdf_k_sigmoid_f(x);
    case CDF_UN_TANH: return tanhf(x);
    case CDF_UN_SILU: return x / (1.0f + expf(-x));
    case CDF_UN_GELU_ERF: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752440f));
    case CDF_UN_GELU_TANH: {
        const float k = 0.79788456080286535588f; /* sqrt(2/pi) */
        return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
    }
    case CDF_UN_QUICK_GELU: return x * cdf_k_sigmoid_f(1.702f * x);
    case CDF_UN_RELU: return x < 0.0f ? 0.0f : x; /* NaN passes through, as torch */
    case CDF_UN_SIN: return sinf(x);
    case CDF_UN_COS: return cosf(x);
    case CDF_UN_SCALE: return x * p0;
    case CDF_UN_ADD_SCALAR: return x + p0;
    case CDF_UN_AFFINE: return x * p0 + p1;
    case CDF_UN_CLAMP: return x < p0 ? p0 : (x > p1 ? p1 : x); /* NaN passes through, as torch */
    case CDF_UN_POW: return powf(x, p0);
    default: return x;
    }
}

/* v[i] = op(v[i]) for a span of f32 values: the unary and the fused elementwise kernels both
 * apply unary ops through this, so fused and unfused results stay bit-identical. At the AVX2 /
 * AVX-512 levels the sigmoid family (GELU tanh form, SiLU, sigmoid, quick-GELU) runs vectorised
 * (elementwise_fast.c, a few ulps from cdf_k_unary_f); everything else, and the generic level,
 * is cdf_k_unary_f element by element. */
void cdf_k_unary_span(cdf_unary_op op, float *v, int64_t len, float p0, float p1);
/* The same at a given level (tests; capped at the CPU's native level). */
void cdf_k_unary_span_at(cdf_k_isa isa, cdf_unary_op op, float *v, int64_t len, float p0, float p1);
/* v[i] = op(v[i], o[i]), or op(o[i], v[i]) with rhs, for a span: the fused elementwise kernel's
 * binary steps. Add, sub, mul and div in AVX2 / AVX-512 vectors (elementwise_fast.c: one IEEE
 * operation per element, the value cdf_k_binary_f gives), the rest element by element. */
void cdf_k_binary_span(cdf_binary_op op, bool rhs, float *v, const float *o, int64_t len);

static inline float cdf_k_binary_f(cdf_binary_op op, float a, float b) {
    switch (op) {
    case CDF_BIN_ADD: return a + b;
    case CDF_BIN_SUB: return a - b;
    case CDF_BIN_MUL: return a * b;
    case CDF_BIN_DIV: return a / b;
    case CDF_BIN_MAX: return (a > b || isnan(a)) ? a : b; /* NaN propagates, as torch.maximum */
    case CDF_BIN_MIN: return (a < b || isnan(a)) ? a : b;
    default: return a;
    }
}


#endif
