/* cdiffusers — element types and conversions (round-to-nearest-even, as torch does). */
#ifndef CDIFFUSERS_DTYPE_H
#define CDIFFUSERS_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cdf_dtype {
    CDF_F32 = 0,
    CDF_BF16 = 1,
    CDF_F16 = 2,
    CDF_I64 = 3,
    CDF_I32 = 4,
    CDF_F64 = 5,
    CDF_U8 = 6,
    CDF_I8 = 7,
    CDF_I16 = 8,
    CDF_BOOL = 9,
    /* fp8 storage types of checkpoints (torch.float8_e4m3fn / float8_e5m2; safetensors F8_E4M3 /
     * F8_E5M2): converted to a compute dtype when loaded, never used for computation */
    CDF_F8_E4M3 = 10,
    CDF_F8_E5M2 = 11,
    CDF_DTYPE_COUNT
} cdf_dtype;

/* Bytes per element, 0 for an invalid dtype. */
size_t cdf_dtype_size(cdf_dtype dt);
/* Lower-case name ("f32", "bf16", ...) and the safetensors name ("F32", "BF16", ...). */
const char *cdf_dtype_name(cdf_dtype dt);
const char *cdf_dtype_st_name(cdf_dtype dt);
/* Parse either form; returns 0 and sets *out, or -1 if unknown. */
int cdf_dtype_parse(const char *name, cdf_dtype *out);
static inline int cdf_dtype_is_float(cdf_dtype dt) {
    return dt == CDF_F32 || dt == CDF_BF16 || dt == CDF_F16 || dt == CDF_F64 || dt == CDF_F8_E4M3 ||
           dt == CDF_F8_E5M2;
}

static inline float cdf_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t cdf_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(u >> 16);
}
float cdf_f16_to_f32(uint16_t h);
/* fp8 -> f32 exactly as torch's .to(torch.float32) (e4m3fn has no infinities; its NaN 0x7f/0xff
 * becomes the f32 bits sign | 0x7ff00000, and e5m2 NaNs come out quiet, as in torch). */
float cdf_f8e4m3_to_f32(uint8_t b);
float cdf_f8e5m2_to_f32(uint8_t b);
uint16_t cdf_f32_to_f16(float f);

/* Convert n elements between any two dtypes (float <-> int truncates toward zero like torch).
 * The fp8 types are source types only: a conversion into them writes zeros. */
void cdf_convert(void *dst, cdf_dtype dst_dt, const void *src, cdf_dtype src_dt, size_t n);

#ifdef __cplusplus
}
#endif
#endif
