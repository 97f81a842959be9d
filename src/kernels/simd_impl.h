/* f32 vector helpers shared by the vectorised kernels (attention_fast_impl.h,
 * elementwise_fast_impl.h), compiled once per ISA: the includer defines VW (f32 lanes) and the
 * name suffix SFX inside a `#pragma GCC target`, includes this, and #undefs VF and VI when done.
 * No include guard: it is included once per ISA. GCC vector extensions keep one source for AVX2
 * (8 lanes) and AVX-512 (16 lanes). Defines, suffixed _SFX: types vf, vi, vfu and vld, vst, vset1,
 * vselect, vmax, vhmax, vhsum, vexp, vexp2. */

#include <immintrin.h> /* vmax: maxps */

#ifndef SV_NAME /* kept for the whole translation unit: VF and VI expand through it */
#define SV_CAT2(a, b) a##_##b
#define SV_CAT(a, b) SV_CAT2(a, b)
#define SV_NAME(x) SV_CAT(x, SFX)
#endif

typedef float SV_NAME(vf) __attribute__((vector_size(VW * 4)));
typedef int32_t SV_NAME(vi) __attribute__((vector_size(VW * 4)));
/* the same with element alignment, for unaligned loads/stores through a pointer (a memcpy is
 * lowered through the stack in 16-byte pieces on AVX2) */
typedef float SV_NAME(vfu) __attribute__((vector_size(VW * 4), aligned(4), may_alias));
#define VF SV_NAME(vf)
#define VI SV_NAME(vi)

static inline VF SV_NAME(vld)(const float *p) { return *(const SV_NAME(vfu) *)p; }
static inline void SV_NAME(vst)(float *p, VF v) { *(SV_NAME(vfu) *)p = v; }
/* every lane x; spelled out, not as {0} + x: that is a real addition (0 + -0 = +0), which GCC keeps
 * as a scalar add plus a register broadcast, two FP-pipe instructions where a broadcast load is
 * none (it was half the instructions of the attention kernel's inner loops) */
#if VW == 16
static inline VF SV_NAME(vset1)(float x) { return (VF){x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}; }
#else
static inline VF SV_NAME(vset1)(float x) { return (VF){x, x, x, x, x, x, x, x}; }
#endif
/* m ? a : b per lane (m: all-ones or all-zeros lanes, as vector comparisons give) */
static inline VF SV_NAME(vselect)(VI m, VF a, VF b) { return (VF)(((VI)a & m) | ((VI)b & ~m)); }

/* exp(z) over the whole f32 range, relative error ~2 ulp where the result is normal: z < -87
 * (incl. -inf) gives exactly 0 (expf is denormal or 0 there: a masked key contributes nothing to
 * a softmax), z > 88.72 gives +inf, NaN gives NaN. Range reduction z = n ln2 + r with
 * |r| <= ln2/2 (ln2 in two parts), exp(r) by its Taylor series to degree 7 (truncation error
 * < 1e-8 relative), then 2^n added to the exponent field. */
static inline VF SV_NAME(vexp)(VF z) {
    const VI nan = z != z, under = z < SV_NAME(vset1)(-87.0f), over = z > SV_NAME(vset1)(88.72f);
    VF x = SV_NAME(vselect)(under, SV_NAME(vset1)(-87.0f), z);
    x = SV_NAME(vselect)(x > SV_NAME(vset1)(88.0f), SV_NAME(vset1)(88.0f), x); /* n <= 127 */
    x = SV_NAME(vselect)(nan, SV_NAME(vset1)(0.0f), x);
    /* n = round(x / ln2): the 1.5 * 2^23 shift leaves n in the low mantissa bits */
    const VF shift = SV_NAME(vset1)(12582912.0f);
    const VF t = x * 1.44269504088896341f + shift;
    const VF n = t - shift;
    VF r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    VF p = SV_NAME(vset1)(1.0f / 5040.0f);
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
    y = SV_NAME(vselect)(under, SV_NAME(vset1)(0.0f), y);
    y = SV_NAME(vselect)(over, SV_NAME(vset1)(__builtin_inff()), y);
    return SV_NAME(vselect)(nan, z, y);
}

/* max(a, b) per lane, x86's maxps: a > b ? a : b, so a NaN in either gives b (a NaN score reaches
 * the softmax sums either way). One instruction: GCC compiles the select form (a >= b ? a : b) to a
 * compare and two masked xors, three per max, and the row maxima were a ninth of the vdpbf16ps
 * attention's time. The two forms differ only where a == b, i.e. in the sign of a zero maximum,
 * which the softmax cannot see (2^(s - 0) is the same for either zero). */
#if VW == 16
static inline VF SV_NAME(vmax)(VF a, VF b) { return (VF)_mm512_max_ps((__m512)a, (__m512)b); }
#else
static inline VF SV_NAME(vmax)(VF a, VF b) { return (VF)_mm256_max_ps((__m256)a, (__m256)b); }
#endif

/* the largest lane / the sum of the lanes, by halving shuffles (log2(VW) steps, not VW scalar ops) */
#if VW == 16
#define SV_HALVES(OP)                                                                                              \
    v = OP(v, __builtin_shuffle(v, (VI){8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7}));                  \
    v = OP(v, __builtin_shuffle(v, (VI){4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11}));                  \
    v = OP(v, __builtin_shuffle(v, (VI){2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13}));                  \
    v = OP(v, __builtin_shuffle(v, (VI){1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14}))
#elif VW == 8
#define SV_HALVES(OP)                                                                                              \
    v = OP(v, __builtin_shuffle(v, (VI){4, 5, 6, 7, 0, 1, 2, 3}));                                                \
    v = OP(v, __builtin_shuffle(v, (VI){2, 3, 0, 1, 6, 7, 4, 5}));                                                \
    v = OP(v, __builtin_shuffle(v, (VI){1, 0, 3, 2, 5, 4, 7, 6}))
#else
#error "simd_impl.h: VW must be 8 or 16"
#endif
#define SV_ADD(a, b) ((a) + (b))
static inline float SV_NAME(vhmax)(VF v) {
    SV_HALVES(SV_NAME(vmax));
    return v[0];
}
static inline float SV_NAME(vhsum)(VF v) {
    SV_HALVES(SV_ADD);
    return v[0];
}
#undef SV_ADD
#undef SV_HALVES

/* 2^z for the softmax's z = s - max(s) <= 0 (also -inf, NaN), relative error < 0.9 ulp (checked
 * over [-126, 0]): z < -126 (incl. -inf) gives exactly 0 (a masked key contributes nothing), NaN
 * gives NaN. The reduction z = n + r, |r| <= 1/2, is exact (n = round(z) by the 1.5 * 2^23 shift);
 * 2^r by a degree-6 polynomial fitted for relative error on [-1/2, 1/2] (1.9e-9: the f32 rounding
 * of the Horner steps dominates), times 2^n built in the exponent field. About half the
 * instructions of vexp: no ln2 split, no clamps above 0, NaN carried by the product. */
static inline VF SV_NAME(vexp2)(VF z) {
    const VI under = z < SV_NAME(vset1)(-126.0f);
    const VF x = SV_NAME(vselect)(under, SV_NAME(vset1)(-126.0f), z);
    const VF shift = SV_NAME(vset1)(12582912.0f);
    const VF t = x + shift;
    const VF r = x - (t - shift);
    VF p = SV_NAME(vset1)(1.534580806037411e-4f);
    p = p * r + 1.3399932067841291e-3f;
    p = p * r + 9.618489071726799e-3f;
    p = p * r + 5.550328642129898e-2f;
    p = p * r + 0.24022646248340607f;
    p = p * r + 0.6931471824645996f;
    p = p * r + 1.0f;
    /* 2^n as a float: n + 127 in the exponent field, n in [-126, 0] here (NaN: any bits, p is NaN) */
    const VF scale = (VF)(((VI)t - (VI)shift + 127) << 23);
    return (VF)((VI)(p * scale) & ~under);
}
