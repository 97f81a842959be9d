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

typedef float EW_NAME(vf) __attribute__((vector_size(VW * 4)));
typedef int32_t EW_NAME(vi) __attribute__((vector_size(VW * 4)));
typedef float EW_NAME(vfu) __attribute__((vector_size(VW * 4), aligned(4), may_alias));
#define VF EW_NAME(vf)
#define VI EW_NAME(vi)

static inline VF EW_NAME(splat)(float x) { return (VF){0} + x; }
static inline VF EW_NAME(select)(VI m, VF a, VF b) { return (VF)(((VI)a & m) | ((VI)b & ~m)); }

/* exp(z) over the whole f32 range, relative error ~2 ulp where the result is normal: z < -87
 * gives 0 (expf is denormal or 0 there), z > 88.72 gives +inf, NaN gives NaN. Range reduction
 * z = n ln2 + r with |r| <= ln2/2 (ln2 in two parts), exp(r) by its Taylor series to degree 7
 * (truncation error < 1e-8 relative), then 2^n added to the exponent field. */
static inline VF EW_NAME(vexp)(VF z) {
    const VI nan = z != z, under = z < EW_NAME(splat)(-87.0f), over = z > EW_NAME(splat)(88.72f);
    VF x = EW_NAME(select)(under, EW_NAME(splat)(-87.0f), z);
    x = EW_NAME(select)(x > EW_NAME(splat)(88.0f), EW_NAME(splat)(88.0f), x); /* n <= 127 */
    x = EW_NAME(select)(nan, EW_NAME(splat)(0.0f), x);
    /* n = round(x / ln2): the 1.5 * 2^23 shift leaves n in the low mantissa bits */
    const VF shift = EW_NAME(splat)(12582912.0f);
    const VF t = x * 1.44269504088896341f + shift;
    const VF n = t - shift;
    VF r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    VF p = EW_NAME(splat)(1.0f / 5040.0f);
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    /* 2^n: (bits(t) - bits(shift)) is n, an integer in [-126, 127] (no float-to-int conversion) */
    const VI ni = (VI)t - (VI)shift;
    VF y = (VF)((VI)p + (ni << 23));
    y = EW_NAME(select)(under, EW_NAME(splat)(0.0f), y);
    y = EW_NAME(select)(over, EW_NAME(splat)(__builtin_inff()), y);
    return EW_NAME(select)(nan, z, y);
}

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
        const VF x = *(const EW_NAME(vfu) *)(v + i);
        *(EW_NAME(vfu) *)(v + i) = EW_NAME(op1)(op, x);
    }
    if (i < len) {
        VF x = EW_NAME(splat)(0.0f);
        memcpy(&x, v + i, (size_t)(len - i) * sizeof *v);
        const VF y = EW_NAME(op1)(op, x);
        memcpy(v + i, &y, (size_t)(len - i) * sizeof *v);
    }
}

#undef VF
#undef VI
#undef EW_NAME
#undef EW_CAT
#undef EW_CAT2
