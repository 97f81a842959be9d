/* Internal pieces of the torch-compatible CPU generator (see include/cdiffusers/rng.h). */
#ifndef CDF_RNG_INTERNAL_H
#define CDF_RNG_INTERNAL_H

#include <stdint.h>

#include "cdiffusers/rng.h"

#define CDF_MT_N 624

struct cdf_generator {
    uint64_t seed;              /* the full seed given to manual_seed (initial_seed()) */
    uint32_t mt[CDF_MT_N];      /* mt19937 state words */
    int mt_index;               /* next word to temper; CDF_MT_N means "regenerate first" */
    int has_cached_normal;      /* torch's next_double_normal_sample_ is set */
    double cached_normal;       /* the cached second Box-Muller value (before mean/std) */
};

/* Uniforms exactly as torch's uniform_real_distribution<T>(0, 1) draws them. */
static inline float cdf_rng_uniform_bits_f(cdf_generator *g, int digits) {
    /* (random() & (2^digits - 1)) * 2^-digits, in float (exact: digits <= 24). */
    uint32_t v = cdf_generator_next_u32(g) & ((UINT32_C(1) << digits) - 1u);
    return (float)v * (1.0f / (float)(UINT32_C(1) << digits));
}
static inline double cdf_rng_uniform_f64(cdf_generator *g) {
    /* random64() = (first draw << 32) | second draw; keep 53 bits. */
    uint64_t hi = cdf_generator_next_u32(g);
    uint64_t lo = cdf_generator_next_u32(g);
    uint64_t v = ((hi << 32) | lo) & ((UINT64_C(1) << 53) - 1u);
    return (double)v * (1.0 / 9007199254740992.0);
}

/* torch's float32 normal_fill on an AVX2 build, for n >= 16 (normal_avx2.c). */
void cdf_rng_normal_fill_f32(cdf_generator *g, float *out, int64_t n);

#endif
