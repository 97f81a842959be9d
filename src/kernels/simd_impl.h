/* f32 vector helpers shared by the vectorised kernels (attention_fast_impl.h,
 * elementwise_fast_impl.h), compiled once per ISA: the includer defines VW (f32 lanes) and the
 * name suffix SFX inside a `#pragma GCC target`, includes this, and #undefs VF and VI when done.
 * No include guard: it is included once per ISA. GCC vector extensions keep one source for AVX2
 * (8 lanes) and AVX-512 (16 lanes). Defines, suffixed _SFX: types vf, vi, vfu and vld, vst, vset1,
 * vselect, vexp. */

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
static inline VF SV_NAME(vset1)(float x) { return (VF){0} + x; }
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
