/* Body of the vectorised sigmoid-family ops (elementwise_fast.c), compiled once per ISA: the
 * includer defines VW (f32 lanes per vector) and the name suffix SFX, and wraps the include in a
 * `#pragma GCC target`. GCC vector extensions keep one source for AVX2 and AVX-512.
 *
 * Every element goes through the same vector instruction sequence (a short tail is padded into a
 * full vector), so the result of an element does not depend on where a span starts or ends: the
 * fused kernels (other block sizes) stay bit-identical to the unfused ones. */

#define EW_CAT2(a, b) a##_##b
#define EW_CAT(a, b) EW_CAT2(a, b)
#define EW_NAME(x) EW_CAT(x, SFX)

#include "kernels/simd_impl.h" /* VF, VI, vld, vst, vset1, vexp */

/* y = f(x) for the ops elementwise_fast.c routes here (see there for the formulas) */
static inline VF EW_NAME(op1)(cdf_unary_op op, VF x) {
    switch (op) {
    case CDF_UN_SIGMOID: return 1.0f / (1.0f + EW_NAME(vexp)(-x));
    case CDF_UN_SILU: return x / (1.0f + EW_NAME(vexp)(-x));
    case CDF_UN_QUICK_GELU: return x / (1.0f + EW_NAME(vexp)(x * -1.702f));
    default: { /* CDF_UN_GELU_TANH: 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3) */
        const VF u = (x + 0.044715f * x * x * x) * 0.79788456080286535588f;
        return x / (1.0f + EW_NAME(vexp)(u * -2.0f));
    }
    }
}

static void EW_NAME(unary_span)(cdf_unary_op op, float *v, int64_t len) {
    int64_t i = 0;
    for (; i + VW <= len; i += VW) {
        EW_NAME(vst)(v + i, EW_NAME(op1)(op, EW_NAME(vld)(v + i)));
    }
    if (i < len) {
        VF x = EW_NAME(vset1)(0.0f);
        memcpy(&x, v + i, (size_t)(len - i) * sizeof *v);
        const VF y = EW_NAME(op1)(op, x);
        memcpy(v + i, &y, (size_t)(len - i) * sizeof *v);
    }
}

/* v[i] = op(v[i], o[i]) (rhs: op(o[i], v[i])) for add, sub, mul and div: one IEEE operation per
 * element, so the same value as cdf_k_binary_f gives; the tail element by element */
static void EW_NAME(binary_span)(cdf_binary_op op, bool rhs, float *v, const float *o, int64_t len) {
    int64_t i = 0;
    for (; i + VW <= len; i += VW) {
        const VF x = EW_NAME(vld)(v + i), y = EW_NAME(vld)(o + i), a = rhs ? y : x, b = rhs ? x : y;
        VF r;
        switch (op) {
        case CDF_BIN_ADD: r = a + b; break;
        case CDF_BIN_SUB: r = a - b; break;
        case CDF_BIN_MUL: r = a * b; break;
        default: r = a / b; break; /* CDF_BIN_DIV */
        }
        EW_NAME(vst)(v + i, r);
    }
    for (; i < len; i++) v[i] = rhs ? cdf_k_binary_f(op, o[i], v[i]) : cdf_k_binary_f(op, v[i], o[i]);
}

typedef uint32_t EW_NAME(vu32) __attribute__((vector_size(VW * 4)));
typedef uint16_t EW_NAME(vu16) __attribute__((vector_size(VW * 2)));
typedef uint16_t EW_NAME(vu16u) __attribute__((vector_size(VW * 2), aligned(2), may_alias));
typedef uint32_t EW_NAME(vu32u) __attribute__((vector_size(VW * 4), aligned(4), may_alias));

/* dst[i] = cdf_f32_to_bf16(src[i]): nearest even, a NaN kept quiet with its upper bits */
static void EW_NAME(f32_to_bf16_span)(uint16_t *dst, const float *src, int64_t n) {
    int64_t i = 0;
    for (; i + VW <= n; i += VW) {
        const EW_NAME(vu32) u = *(const EW_NAME(vu32u) *)(src + i);
        const EW_NAME(vu32) nan = (u & 0x7fffffffu) > 0x7f800000u;
        const EW_NAME(vu32) r = (nan & ((u >> 16) | 0x40u)) | (~nan & ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16));
        *(EW_NAME(vu16u) *)(dst + i) = __builtin_convertvector(r, EW_NAME(vu16));
    }
    for (; i < n; i++) dst[i] = cdf_f32_to_bf16(src[i]);
}

/* dst[i] = the f32 of bf16 src[i] (exact: the bits moved up) */
static void EW_NAME(bf16_to_f32_span)(float *dst, const uint16_t *src, int64_t n) {
    int64_t i = 0;
    for (; i + VW <= n; i += VW) {
        const EW_NAME(vu16) h = *(const EW_NAME(vu16u) *)(src + i);
        *(EW_NAME(vu32u) *)(dst + i) = __builtin_convertvector(h, EW_NAME(vu32)) << 16;
    }
    for (; i < n; i++) dst[i] = cdf_bf16_to_f32(src[i]);
}

#undef VF
#undef VI
#undef EW_NAME
#undef EW_CAT
#undef EW_CAT2
