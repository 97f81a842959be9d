#include "cdiffusers/dtype.h"
#include "core/dtype_internal.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

static const struct {
    const char *name, *st;
    size_t size;
} k_dtypes[CDF_DTYPE_COUNT] = {
    [CDF_F32] = {"f32", "F32", 4},   [CDF_BF16] = {"bf16", "BF16", 2}, [CDF_F16] = {"f16", "F16", 2},
    [CDF_I64] = {"i64", "I64", 8},   [CDF_I32] = {"i32", "I32", 4},    [CDF_F64] = {"f64", "F64", 8},
    [CDF_U8] = {"u8", "U8", 1},      [CDF_I8] = {"i8", "I8", 1},       [CDF_I16] = {"i16", "I16", 2},
    [CDF_BOOL] = {"bool", "BOOL", 1},
    [CDF_F8_E4M3] = {"f8_e4m3", "F8_E4M3", 1}, [CDF_F8_E5M2] = {"f8_e5m2", "F8_E5M2", 1},
};

size_t cdf_dtype_size(cdf_dtype dt) { return (unsigned)dt < CDF_DTYPE_COUNT ? k_dtypes[dt].size : 0; }
const char *cdf_dtype_name(cdf_dtype dt) { return (unsigned)dt < CDF_DTYPE_COUNT ? k_dtypes[dt].name : "?"; }
const char *cdf_dtype_st_name(cdf_dtype dt) { return (unsigned)dt < CDF_DTYPE_COUNT ? k_dtypes[dt].st : "?"; }

int cdf_dtype_parse(const char *name, cdf_dtype *out) {
    if (!name) return -1;
    for (int i = 0; i < CDF_DTYPE_COUNT; i++) {
        if (strcmp(name, k_dtypes[i].name) == 0 || strcmp(name, k_dtypes[i].st) == 0) {
            *out = (cdf_dtype)i;
            return 0;
        }
    }
    if (strcmp(name, "float32") == 0 || strcmp(name, "fp32") == 0) { *out = CDF_F32; return 0; }
    if (strcmp(name, "bfloat16") == 0) { *out = CDF_BF16; return 0; }
    if (strcmp(name, "float16") == 0 || strcmp(name, "fp16") == 0) { *out = CDF_F16; return 0; }
    return -1;
}

float cdf_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ffu, u;
    if (exp == 0) {
        if (mant == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do { mant <<= 1; e++; } while (!(mant & 0x400u));
            mant &= 0x3ffu;
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | (mant << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (mant << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t cdf_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t absu = u & 0x7fffffffu;
    if (absu > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);       /* NaN */
    if (absu >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);      /* overflow -> inf */
    if (absu < 0x38800000u) {                                         /* subnormal or zero */
        /* value = absf * 2^24 rounded to nearest even, as an integer mantissa */
        float af;
        memcpy(&af, &absu, 4);
        float scaled = af * 16777216.0f; /* exact: power of two */
        uint32_t m = (uint32_t)nearbyintf(scaled);
        return (uint16_t)(sign | m);
    }
    uint32_t exp = ((absu >> 23) - 127 + 15);
    uint32_t mant = absu & 0x7fffffu;
    uint32_t h = (exp << 10) | (mant >> 13);
    uint32_t rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

float cdf_f8e4m3_to_f32(uint8_t b) {
    uint32_t sign = (uint32_t)(b & 0x80u) << 24, e = (b >> 3) & 15u, m = b & 7u, u;
    if (e == 15 && m == 7) {
        u = sign | 0x7ff00000u; /* NaN with torch's bits */
    } else if (e == 0) {
        float f = (float)m * 0x1p-9f; /* subnormal: m/8 * 2^-6, exact */
        return sign ? -f : f;
    } else {
        u = sign | ((e + 127u - 7u) << 23) | (m << 20);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* e5m2 is the top byte of an IEEE half: same exponent width and bias. torch converts through
 * float arithmetic, which quiets a signalling NaN: so does this. */
float cdf_f8e5m2_to_f32(uint8_t b) {
    float f = cdf_f16_to_f32((uint16_t)(b << 8));
    if ((b & 0x7cu) == 0x7cu && (b & 3u)) {
        uint32_t u;
        memcpy(&u, &f, 4);
        u |= 0x00400000u;
        memcpy(&f, &u, 4);
    }
    return f;
}

/* Element i of an array that may not be aligned to its element size: src is often a tensor's
 * bytes inside a mapped safetensors file, whose data section starts wherever the header ends
 * (the format does not require padding), and dst may be any caller buffer. memcpy of a fixed
 * small size compiles to a plain load/store, without the undefined behaviour of a misaligned
 * typed access (found by UBSan on a header rewritten without padding). */
#define DEFINE_LD(name, T)                                                                         \
    static inline T name(const void *p, size_t i) {                                                \
        T v;                                                                                       \
        memcpy(&v, (const char *)p + i * sizeof(T), sizeof(T));                                    \
        return v;                                                                                  \
    }
DEFINE_LD(ld_float, float)
DEFINE_LD(ld_double, double)
DEFINE_LD(ld_uint16_t, uint16_t)
DEFINE_LD(ld_int16_t, int16_t)
DEFINE_LD(ld_int32_t, int32_t)
DEFINE_LD(ld_int64_t, int64_t)
#define LD(T, p, i) ld_##T(p, i)
#define ST(T, p, i, x) do { T v_ = (x); memcpy((char *)(p) + (size_t)(i) * sizeof(T), &v_, sizeof(T)); } while (0)

static bool is_int_dtype(cdf_dtype dt) {
    return dt == CDF_I64 || dt == CDF_I32 || dt == CDF_I16 || dt == CDF_I8 || dt == CDF_U8 || dt == CDF_BOOL;
}

static int64_t load_i(const void *p, cdf_dtype dt, size_t i) {
    switch (dt) {
    case CDF_I64: return LD(int64_t, p, i);
    case CDF_I32: return LD(int32_t, p, i);
    case CDF_I16: return LD(int16_t, p, i);
    case CDF_I8: return ((const int8_t *)p)[i];
    case CDF_U8: return ((const uint8_t *)p)[i];
    case CDF_BOOL: return ((const uint8_t *)p)[i] != 0;
    default: return 0;
    }
}

static double load_d(const void *p, cdf_dtype dt, size_t i) {
    switch (dt) {
    case CDF_F32: return LD(float, p, i);
    case CDF_BF16: return cdf_bf16_to_f32(LD(uint16_t, p, i));
    case CDF_F16: return cdf_f16_to_f32(LD(uint16_t, p, i));
    case CDF_F64: return LD(double, p, i);
    case CDF_I64: return (double)LD(int64_t, p, i);
    case CDF_I32: return LD(int32_t, p, i);
    case CDF_I16: return LD(int16_t, p, i);
    case CDF_I8: return ((const int8_t *)p)[i];
    case CDF_U8: return ((const uint8_t *)p)[i];
    case CDF_BOOL: return ((const uint8_t *)p)[i] != 0;
    case CDF_F8_E4M3: return cdf_f8e4m3_to_f32(((const uint8_t *)p)[i]);
    case CDF_F8_E5M2: return cdf_f8e5m2_to_f32(((const uint8_t *)p)[i]);
    default: return 0;
    }
}

void cdf_convert(void *dst, cdf_dtype ddt, const void *src, cdf_dtype sdt, size_t n) {
    if (ddt == sdt) {
        memmove(dst, src, n * cdf_dtype_size(ddt));
        return;
    }
    /* fast, exact paths for the float conversions the models use */
    if (sdt == CDF_F32 && ddt == CDF_BF16) {
        for (size_t i = 0; i < n; i++) ST(uint16_t, dst, i, cdf_f32_to_bf16(LD(float, src, i)));
        return;
    }
    if (sdt == CDF_BF16 && ddt == CDF_F32) {
        for (size_t i = 0; i < n; i++) ST(float, dst, i, cdf_bf16_to_f32(LD(uint16_t, src, i)));
        return;
    }
    if (sdt == CDF_F32 && ddt == CDF_F16) {
        for (size_t i = 0; i < n; i++) ST(uint16_t, dst, i, cdf_f32_to_f16(LD(float, src, i)));
        return;
    }
    if (sdt == CDF_F16 && ddt == CDF_F32) {
        for (size_t i = 0; i < n; i++) ST(float, dst, i, cdf_f16_to_f32(LD(uint16_t, src, i)));
        return;
    }
    if ((sdt == CDF_F8_E4M3 || sdt == CDF_F8_E5M2) && (ddt == CDF_F32 || ddt == CDF_BF16)) {
        const uint8_t *b = src;
        for (size_t i = 0; i < n; i++) {
            float f = sdt == CDF_F8_E4M3 ? cdf_f8e4m3_to_f32(b[i]) : cdf_f8e5m2_to_f32(b[i]);
            if (ddt == CDF_F32) ST(float, dst, i, f);
            else ST(uint16_t, dst, i, cdf_f32_to_bf16(f)); /* exact: fp8 values fit in bf16 */
        }
        return;
    }
    if (sdt == CDF_I64 && ddt == CDF_I32) {
        for (size_t i = 0; i < n; i++) ST(int32_t, dst, i, (int32_t)LD(int64_t, src, i));
        return;
    }
    if (sdt == CDF_I32 && ddt == CDF_I64) {
        for (size_t i = 0; i < n; i++) ST(int64_t, dst, i, (int64_t)LD(int32_t, src, i));
        return;
    }
    /* the general case, with the copy kernel's semantics (kernels/reference_data.c), so that a
     * tensor read converts exactly as an on-device cast: integers stay exact between integer
     * dtypes, float -> integer truncates toward zero, saturates and maps NaN to 0 */
    const bool int_src = is_int_dtype(sdt);
    for (size_t i = 0; i < n; i++) {
        const int64_t iv = int_src ? load_i(src, sdt, i) : 0;
        const double v = int_src ? (double)iv : load_d(src, sdt, i);
        switch (ddt) {
        case CDF_F32: ST(float, dst, i, int_src ? (float)iv : (float)v); break;
        case CDF_F64: ST(double, dst, i, v); break;
        /* double -> bf16/f16 goes through f32 like torch's .to() from float64 does for f32
         * intermediates only when the source is f32; for f64 sources this double rounding is
         * a documented approximation */
        case CDF_BF16: ST(uint16_t, dst, i, cdf_f32_to_bf16(int_src ? (float)iv : (float)v)); break;
        case CDF_F16: ST(uint16_t, dst, i, cdf_f32_to_f16(int_src ? (float)iv : (float)v)); break;
        case CDF_I64: ST(int64_t, dst, i, int_src ? iv : cdf_trunc_sat(v, -9223372036854775808.0, 9223372036854775807.0)); break;
        case CDF_I32: ST(int32_t, dst, i, (int32_t)(int_src ? iv : cdf_trunc_sat(v, -2147483648.0, 2147483647.0))); break;
        case CDF_I16: ST(int16_t, dst, i, (int16_t)(int_src ? iv : cdf_trunc_sat(v, -32768.0, 32767.0))); break;
        case CDF_I8: ((int8_t *)dst)[i] = (int8_t)(int_src ? iv : cdf_trunc_sat(v, -128.0, 127.0)); break;
        case CDF_U8: ((uint8_t *)dst)[i] = (uint8_t)(int_src ? iv : cdf_trunc_sat(v, 0.0, 255.0)); break;
        case CDF_BOOL: ((uint8_t *)dst)[i] = int_src ? iv != 0 : v != 0; break;
        case CDF_F8_E4M3: case CDF_F8_E5M2: ((uint8_t *)dst)[i] = 0; break; /* not supported */
        default: break;
        }
    }
}
