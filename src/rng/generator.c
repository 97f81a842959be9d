/* torch-compatible CPU generator: mt19937 state, uniforms, the scalar normal paths and
 * diffusers' randn_tensor. The float32 vectorised normal path is in normal_avx2.c.
 *
 * Floating-point evaluation order matters here (results must match torch bit for bit), so
 * this file is compiled without FMA contraction whatever the global flags are. */
#include "core/exact_fp.h" /* first: no FMA contraction, no -ffast-math */

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "rng_internal.h"

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

/* ---------------------------------------------------------------------------------------- */
/* mt19937 (Matsumoto & Nishimura), seeded the way torch's at::mt19937 is: low 32 bits.     */

static void mt_seed(cdf_generator *g, uint64_t seed) {
    g->seed = seed;
    g->mt[0] = (uint32_t)(seed & 0xffffffffu);
    for (int i = 1; i < CDF_MT_N; i++) {
        uint32_t prev = g->mt[i - 1];
        g->mt[i] = 1812433253u * (prev ^ (prev >> 30)) + (uint32_t)i;
    }
    g->mt_index = CDF_MT_N; /* the first draw regenerates the whole block */
    g->has_cached_normal = 0;
    g->cached_normal = 0.0;
}

static void mt_regenerate(cdf_generator *g) {
    enum { M = 397 };
    const uint32_t upper = 0x80000000u, lower = 0x7fffffffu, matrix_a = 0x9908b0dfu;
    uint32_t *s = g->mt;
    for (int i = 0; i < CDF_MT_N; i++) {
        uint32_t y = (s[i] & upper) | (s[(i + 1) % CDF_MT_N] & lower);
        s[i] = s[(i + M) % CDF_MT_N] ^ (y >> 1) ^ ((y & 1u) ? matrix_a : 0u);
    }
    g->mt_index = 0;
}

uint32_t cdf_generator_next_u32(cdf_generator *g) {
    if (g->mt_index >= CDF_MT_N) mt_regenerate(g);
    uint32_t y = g->mt[g->mt_index++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

cdf_generator *cdf_generator_new(uint64_t seed) {
    cdf_generator *g = malloc(sizeof *g);
    if (!g) {
        cdf_error(CDF_ERR_OUT_OF_MEMORY, "cdf_generator_new: cannot allocate %zu bytes", sizeof *g);
        return NULL;
    }
    mt_seed(g, seed);
    return g;
}

void cdf_generator_free(cdf_generator *g) { free(g); }

void cdf_generator_manual_seed(cdf_generator *g, uint64_t seed) {
    if (g) mt_seed(g, seed);
}

uint64_t cdf_generator_initial_seed(const cdf_generator *g) { return g ? g->seed : 0; }

cdf_generator *cdf_generator_clone(const cdf_generator *g) {
    if (!g) {
        cdf_error(CDF_ERR_INVALID_ARG, "cdf_generator_clone: generator is NULL");
        return NULL;
    }
    cdf_generator *c = malloc(sizeof *c);
    if (!c) {
        cdf_error(CDF_ERR_OUT_OF_MEMORY, "cdf_generator_clone: cannot allocate %zu bytes", sizeof *c);
        return NULL;
    }
    memcpy(c, g, sizeof *c);
    return c;
}

cdf_status cdf_generator_copy(cdf_generator *dst, const cdf_generator *src) {
    if (!dst || !src) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_generator_copy: %s generator is NULL", !dst ? "destination" : "source");
    if (dst != src) memcpy(dst, src, sizeof *dst);
    return CDF_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Argument checks shared by the draw functions.                                            */

static cdf_status check_draw(const char *fn, const cdf_generator *g, const void *out, int64_t n) {
    if (!g) return cdf_error(CDF_ERR_INVALID_ARG, "%s: generator is NULL", fn);
    if (n < 0) return cdf_error(CDF_ERR_INVALID_ARG, "%s: negative element count %lld", fn, (long long)n);
    if (n > 0 && !out) return cdf_error(CDF_ERR_INVALID_ARG, "%s: output buffer is NULL for %lld elements", fn, (long long)n);
    return CDF_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Uniform [0, 1).                                                                          */

cdf_status cdf_rand_f32(cdf_generator *g, float *out, int64_t n) {
    CDF_TRY(check_draw("cdf_rand_f32", g, out, n));
    for (int64_t i = 0; i < n; i++) out[i] = cdf_rng_uniform_bits_f(g, 24);
    return CDF_OK;
}

cdf_status cdf_rand_f64(cdf_generator *g, double *out, int64_t n) {
    CDF_TRY(check_draw("cdf_rand_f64", g, out, n));
    for (int64_t i = 0; i < n; i++) out[i] = cdf_rng_uniform_f64(g);
    return CDF_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Tensors of fewer than 16 elements: at::normal_distribution<double>, one value per element, */
/* with the second Box-Muller value cached in the generator until the next such draw.        */

static double normal_double(cdf_generator *g) {
    const double mean = 0.0, stdv = 1.0;
    if (g->has_cached_normal) {
        g->has_cached_normal = 0;
        return g->cached_normal * stdv + mean; /* "+ mean" also turns -0 into +0, as torch does */
    }
    const double u1 = cdf_rng_uniform_f64(g);
    const double u2 = cdf_rng_uniform_f64(g);
    const double r = sqrt(-2.0 * log(1.0 - u2));
    const double theta = (2.0 * M_PI) * u1;
    g->cached_normal = r * sin(theta);
    g->has_cached_normal = 1;
    return r * cos(theta) * stdv + mean;
}

/* ---------------------------------------------------------------------------------------- */
/* Tensors of 16 or more elements in bf16 / f16 / f64: torch's generic normal_fill, which    */
/* draws all uniforms in the element type first, then transforms blocks of 16 with scalar    */
/* Box-Muller evaluated with that type's arithmetic rules (c10::BFloat16 rounds after every   */
/* operation; c10::Half only where a Half variable is assigned). A trailing partial block is  */
/* handled by drawing 16 fresh uniforms into the last 16 slots and redoing them.              */

static inline float bf(float x) { return cdf_bf16_to_f32(cdf_f32_to_bf16(x)); }
static inline float hf(float x) { return cdf_f16_to_f32(cdf_f32_to_f16(x)); }

static void normal16_bf16(float *d) {
    const float mean = 0.0f, stdv = 1.0f;
    for (int j = 0; j < 8; j++) {
        const float u1 = bf(1.0f - d[j]);
        const float u2 = d[j + 8];
        const float lg = bf(logf(u1));
        const float radius = bf(sqrtf(bf(-2.0f * lg)));
        /* 2.0f * pi<double> * u2 is a double product, stored into a BFloat16 via float. */
        const float theta = bf((float)((2.0 * M_PI) * (double)u2));
        const float c = bf(cosf(theta)), s = bf(sinf(theta));
        d[j] = bf(bf(bf(radius * c) * stdv) + mean);
        d[j + 8] = bf(bf(bf(radius * s) * stdv) + mean);
    }
}

static void normal16_f16(float *d) {
    const float mean = 0.0f, stdv = 1.0f;
    for (int j = 0; j < 8; j++) {
        const float u1 = hf(1.0f - d[j]);
        const float u2 = d[j + 8];
        const float radius = hf(sqrtf(-2.0f * logf(u1)));
        const float theta = hf((float)((2.0 * M_PI) * (double)u2));
        d[j] = hf(radius * cosf(theta) * stdv + mean);
        d[j + 8] = hf(radius * sinf(theta) * stdv + mean);
    }
}

static void normal16_f64(double *d) {
    const double mean = 0.0, stdv = 1.0;
    for (int j = 0; j < 8; j++) {
        const double u1 = 1.0 - d[j];
        const double u2 = d[j + 8];
        const double radius = sqrt(-2.0 * log(u1));
        const double theta = (2.0 * M_PI) * u2;
        d[j] = radius * cos(theta) * stdv + mean;
        d[j + 8] = radius * sin(theta) * stdv + mean;
    }
}

/* bf16 / f16 fill: work in a float buffer holding values exactly representable in the type. */
static void normal_fill_half(cdf_generator *g, float *d, int64_t n, int digits, void (*block)(float *)) {
    for (int64_t i = 0; i < n; i++) d[i] = cdf_rng_uniform_bits_f(g, digits);
    for (int64_t i = 0; i + 16 <= n; i += 16) block(d + i);
    if (n % 16 != 0) {
        float *tail = d + n - 16;
        for (int i = 0; i < 16; i++) tail[i] = cdf_rng_uniform_bits_f(g, digits);
        block(tail);
    }
}

static void normal_fill_f64(cdf_generator *g, double *d, int64_t n) {
    for (int64_t i = 0; i < n; i++) d[i] = cdf_rng_uniform_f64(g);
    for (int64_t i = 0; i + 16 <= n; i += 16) normal16_f64(d + i);
    if (n % 16 != 0) {
        double *tail = d + n - 16;
        for (int i = 0; i < 16; i++) tail[i] = cdf_rng_uniform_f64(g);
        normal16_f64(tail);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Public normal draws.                                                                     */

cdf_status cdf_randn_f32(cdf_generator *g, float *out, int64_t n) {
    CDF_TRY(check_draw("cdf_randn_f32", g, out, n));
    if (n >= 16) {
        cdf_rng_normal_fill_f32(g, out, n);
    } else {
        for (int64_t i = 0; i < n; i++) out[i] = (float)normal_double(g);
    }
    return CDF_OK;
}

static cdf_status randn_half(const char *fn, cdf_generator *g, uint16_t *out, int64_t n, int is_bf16) {
    CDF_TRY(check_draw(fn, g, out, n));
    if (n < 16) {
        /* static_cast<BFloat16/Half>(double): the double goes to float first, then rounds. */
        for (int64_t i = 0; i < n; i++) {
            float f = (float)normal_double(g);
            out[i] = is_bf16 ? cdf_f32_to_bf16(f) : cdf_f32_to_f16(f);
        }
        return CDF_OK;
    }
    if ((uint64_t)n > SIZE_MAX / sizeof(float))
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "%s: %lld elements do not fit in memory", fn, (long long)n);
    float *tmp = malloc((size_t)n * sizeof(float));
    if (!tmp) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "%s: cannot allocate a %lld-element float work buffer", fn, (long long)n);
    normal_fill_half(g, tmp, n, is_bf16 ? 8 : 11, is_bf16 ? normal16_bf16 : normal16_f16);
    for (int64_t i = 0; i < n; i++) out[i] = is_bf16 ? cdf_f32_to_bf16(tmp[i]) : cdf_f32_to_f16(tmp[i]);
    free(tmp);
    return CDF_OK;
}

cdf_status cdf_randn_bf16(cdf_generator *g, uint16_t *out, int64_t n) { return randn_half("cdf_randn_bf16", g, out, n, 1); }
cdf_status cdf_randn_f16(cdf_generator *g, uint16_t *out, int64_t n) { return randn_half("cdf_randn_f16", g, out, n, 0); }

static cdf_status randn_f64(cdf_generator *g, double *out, int64_t n) {
    CDF_TRY(check_draw("cdf_randn(f64)", g, out, n));
    if (n >= 16) {
        normal_fill_f64(g, out, n);
    } else {
        for (int64_t i = 0; i < n; i++) out[i] = normal_double(g);
    }
    return CDF_OK;
}

cdf_status cdf_randn(cdf_generator *g, cdf_dtype dtype, void *out, int64_t n) {
    switch (dtype) {
    case CDF_F32: return cdf_randn_f32(g, out, n);
    case CDF_BF16: return cdf_randn_bf16(g, out, n);
    case CDF_F16: return cdf_randn_f16(g, out, n);
    case CDF_F64: return randn_f64(g, out, n);
    default: return cdf_error(CDF_ERR_DTYPE, "cdf_randn: dtype %s is not a floating-point type torch.randn supports here (f32, bf16, f16, f64)", cdf_dtype_name(dtype));
    }
}

/* ---------------------------------------------------------------------------------------- */
/* diffusers.utils.torch_utils.randn_tensor                                                  */

cdf_status cdf_randn_tensor(cdf_generator *const *gens, int n_gens, const int64_t *shape, int ndim, cdf_dtype dtype, void *out) {
    const char *fn = "cdf_randn_tensor";
    if (!gens) return cdf_error(CDF_ERR_INVALID_ARG, "%s: generator list is NULL", fn);
    if (n_gens < 1) return cdf_error(CDF_ERR_INVALID_ARG, "%s: need at least one generator, got %d", fn, n_gens);
    for (int i = 0; i < n_gens; i++)
        if (!gens[i]) return cdf_error(CDF_ERR_INVALID_ARG, "%s: generator %d of %d is NULL", fn, i, n_gens);
    if (!shape) return cdf_error(CDF_ERR_INVALID_ARG, "%s: shape is NULL", fn);
    if (ndim < 1 || ndim > 16) return cdf_error(CDF_ERR_INVALID_ARG, "%s: ndim %d out of range [1, 16]", fn, ndim);
    size_t esize = cdf_dtype_size(dtype);
    if (dtype != CDF_F32 && dtype != CDF_BF16 && dtype != CDF_F16 && dtype != CDF_F64)
        return cdf_error(CDF_ERR_DTYPE, "%s: dtype %s is not supported (f32, bf16, f16, f64)", fn, cdf_dtype_name(dtype));
    int64_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0) return cdf_error(CDF_ERR_SHAPE, "%s: dimension %d is negative (%lld)", fn, d, (long long)shape[d]);
        if (shape[d] != 0 && numel > INT64_MAX / (int64_t)esize / shape[d])
            return cdf_error(CDF_ERR_SHAPE, "%s: element count overflows at dimension %d", fn, d);
        numel *= shape[d];
    }
    if (numel > 0 && !out) return cdf_error(CDF_ERR_INVALID_ARG, "%s: output buffer is NULL", fn);
    /* A one-element list is treated as a single generator, as diffusers does. */
    if (n_gens == 1) return cdf_randn(gens[0], dtype, out, numel);
    if ((int64_t)n_gens != shape[0])
        return cdf_error(CDF_ERR_SHAPE, "%s: %d generators given for a batch of %lld (they must match)", fn, n_gens, (long long)shape[0]);
    int64_t per = shape[0] > 0 ? numel / shape[0] : 0;
    for (int b = 0; b < n_gens; b++) CDF_TRY(cdf_randn(gens[b], dtype, (char *)out + (size_t)(b * per) * esize, per));
    return CDF_OK;
}

cdf_status cdf_randn_tensor_f32(cdf_generator *const *gens, int n_gens, const int64_t *shape, int ndim, float *out) {
    return cdf_randn_tensor(gens, n_gens, shape, ndim, CDF_F32, out);
}
