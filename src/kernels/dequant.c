/* Dequantization of ggml's block formats into f32 (scalar reference).
 *
 * Each type reproduces the gguf Python package's `gguf.quants.dequantize` (numpy, f32) bit for
 * bit: the same products in the same order, each rounded to f32 on its own. The per-block
 * arithmetic lives in kernels/dequant_blocks.h, shared with the CUDA decode kernel, so the tests
 * of this file against gguf-py cover the GPU's decode too. Nothing may be contracted into an FMA
 * (this file is compiled with -ffp-contract=off; clang also gets the pragma below, before the
 * header's functions): numpy rounds the product before the subtraction. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#include "cdiffusers/io.h"
#include "core/error_internal.h"
#include "kernels/dequant_blocks.h"

#include <math.h>
#include <string.h>

#define QK_K CDF_DQ_QK_K

typedef void (*dq_block_fn)(const uint8_t *, float *);

static bool block_fn(uint32_t type, dq_block_fn *fn, int *be, int *bb) {
    if (!cdf_dq_block_size(type, be, bb)) return false;
    switch (type) {
    case CDF_GGML_Q8_0: *fn = cdf_dq_q8_0; return true;
    case CDF_GGML_Q4_0: *fn = cdf_dq_q4_0; return true;
    case CDF_GGML_Q4_1: *fn = cdf_dq_q4_1; return true;
    case CDF_GGML_Q5_0: *fn = cdf_dq_q5_0; return true;
    case CDF_GGML_Q5_1: *fn = cdf_dq_q5_1; return true;
    case CDF_GGML_Q2_K: *fn = cdf_dq_q2_k; return true;
    case CDF_GGML_Q3_K: *fn = cdf_dq_q3_k; return true;
    case CDF_GGML_Q4_K: *fn = cdf_dq_q4_k; return true;
    case CDF_GGML_Q5_K: *fn = cdf_dq_q5_k; return true;
    case CDF_GGML_Q6_K: *fn = cdf_dq_q6_k; return true;
    default: return false;
    }
}

bool cdf_k_dequant_store_blocks(uint32_t type, const void *blocks, int64_t n_blocks, void *out, cdf_dq_store store) {
    for (int64_t i = 0; i < n_blocks; i++)
        if (!cdf_dq_store_block(type, blocks, i, out, store)) return false;
    return true;
}

bool cdf_ggml_can_dequantize(uint32_t type) {
    dq_block_fn fn;
    int be, bb;
    return type == CDF_GGML_F32 || type == CDF_GGML_F16 || type == CDF_GGML_BF16 || block_fn(type, &fn, &be, &bb);
}

cdf_status cdf_ggml_dequantize(uint32_t type, const void *src, int64_t n, float *dst) {
    if (n < 0 || (n > 0 && (!src || !dst)))
        return cdf_error(CDF_ERR_INVALID_ARG, "cdf_ggml_dequantize: bad arguments (n %lld)", (long long)n);
    switch (type) {
    case CDF_GGML_F32: memcpy(dst, src, (size_t)n * 4); return CDF_OK;
    case CDF_GGML_F16: cdf_convert(dst, CDF_F32, src, CDF_F16, (size_t)n); return CDF_OK;
    case CDF_GGML_BF16: cdf_convert(dst, CDF_F32, src, CDF_BF16, (size_t)n); return CDF_OK;
    default: break;
    }
    dq_block_fn fn;
    int be, bb;
    if (!block_fn(type, &fn, &be, &bb)) {
        return cdf_error(CDF_ERR_UNSUPPORTED,
                         "ggml type %u cannot be dequantized by cdiffusers (supported: F32, F16, BF16, Q8_0, "
                         "Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)",
                         type);
    }
    if (n % be != 0)
        return cdf_error(CDF_ERR_INVALID_ARG, "cdf_ggml_dequantize: %lld elements is not a whole number of blocks of %d (type %u)",
                         (long long)n, be, type);
    const uint8_t *s = src;
    for (int64_t i = 0; i < n / be; i++) fn(s + i * bb, dst + i * be);
    return CDF_OK;
}

/* ---- quantization (what `--weight-type q8_0` does at load) ---------------------------------- */

/* gguf-py's np_roundf: half away from zero, as floor(a) + floor(2 (a - floor(a))) in f32. */
static float roundf_gguf(float n) {
    float a = fabsf(n), fl = floorf(a);
    float b = fl + floorf(2.0f * (a - fl));
    return n < 0 ? -b : (n > 0 ? b : 0.0f);
}

/* Q8_0 as gguf-py's Q8_0.quantize_blocks: d = max|x| / 127, q = roundf(x * (1 / d)), d as f16. */
static void q_q8_0(const float *x, uint8_t *b) {
    float amax = 0.0f;
    for (int i = 0; i < 32; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    const float d = amax / 127.0f;
    const float id = d == 0.0f ? 0.0f : 1.0f / d;
    const uint16_t h = cdf_f32_to_f16(d);
    b[0] = (uint8_t)(h & 0xFF);
    b[1] = (uint8_t)(h >> 8);
    for (int i = 0; i < 32; i++) b[2 + i] = (uint8_t)(int8_t)roundf_gguf(x[i] * id);
}

/* ---- Q4_K (ggml's quantize_row_q4_K_ref: what llama-quantize writes without an importance
 * matrix, and what city96's Q4_K files hold). gguf-py has no Q4_K quantizer, so the reference is
 * ggml's C code itself, compiled without FMA contraction (as its ggml-base library is on x86-64);
 * tests/data/formats/q4k_refs.safetensors holds its output (tools/make-format-refs/make_q4k_refs.py).
 * Every float operation below is one f32 operation of that code, in its order: the sums run
 * sequentially and nothing is contracted (this file is compiled with -ffp-contract=off). */

/* ggml's rounding: the f32 sum v + 1.5 * 2^23 rounds v to an integer (ties to even) held in the
 * low mantissa bits. Reading those bits, rather than calling lrintf, keeps the result identical
 * to ggml's even for |v| > 2^22, where the trick no longer gives v (degenerate blocks can get
 * there: a sub-block scale in the f16 subnormal range); the caller clamps the result anyway. */
static inline int round_k(float v) {
    const float t = v + 12582912.0f;
    int32_t bits;
    memcpy(&bits, &t, sizeof bits);
    return (bits & 0x007FFFFF) - 0x00400000;
}

static inline int clamp_nib(int v) { return v < 0 ? 0 : (v > 15 ? 15 : v); }

/* Weighted squared error of x ~ scale * L + min over one sub-block of 32. */
static float fit_error(const float *x, const float *w, const uint8_t *L, float scale, float min) {
    float err = 0.0f;
    for (int i = 0; i < 32; i++) {
        const float p = scale * (float)L[i];
        const float diff = p + min - x[i];
        const float sq = diff * diff;
        err += w[i] * sq;
    }
    return err;
}

/* One sub-block of 32 values as x ~ scale * L + min with L in 0..15 and min <= 0 (ggml's
 * make_qkx2_quants with nmax 15, rmin -1, rdelta 0.1, 20 steps, squared error): start from the
 * plain min/max grid, then try 21 grid spacings around it, refit scale and min to each grid by
 * weighted least squares and keep the one with the smallest weighted error. As in ggml, a grid
 * that wins moves the origin: later grids start at the best min so far, not at the data's min.
 * Returns the scale, *neg_min = -min (>= 0). */
static float fit_sub_block(const float *x, const float *w, uint8_t *L, float *neg_min) {
    float lo = x[0], hi = x[0];
    float sum_w = w[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < 32; i++) {
        if (x[i] < lo) lo = x[i];
        if (x[i] > hi) hi = x[i];
        sum_w += w[i];
        const float wx = w[i] * x[i];
        sum_x += wx;
    }
    if (lo > 0) lo = 0; /* the offset only ever shifts down: a block of positives keeps min 0 */
    if (hi == lo) {
        memset(L, 0, 32);
        *neg_min = -lo;
        return 0.0f;
    }
    float inv = 15.0f / (hi - lo);
    float scale = 1.0f / inv, min = lo;
    for (int i = 0; i < 32; i++) {
        const float diff = x[i] - lo;
        L[i] = (uint8_t)clamp_nib(round_k(inv * diff));
    }
    float best = fit_error(x, w, L, scale, min);
    uint8_t trial[32];
    for (int step = 0; step <= 20; step++) {
        const float widen = -1.0f + 0.1f * (float)step; /* rmin + rdelta * step */
        const float range = hi - min;
        inv = (widen + 15.0f) / range;
        float sum_l = 0.0f, sum_l2 = 0.0f, sum_xl = 0.0f;
        for (int i = 0; i < 32; i++) {
            const float diff = x[i] - min;
            const int l = clamp_nib(round_k(inv * diff));
            trial[i] = (uint8_t)l;
            const float wl = w[i] * (float)l;
            sum_l += wl;
            const float wll = wl * (float)l;
            sum_l2 += wll;
            const float wlx = wl * x[i];
            sum_xl += wlx;
        }
        const float a = sum_w * sum_l2, b = sum_l * sum_l;
        const float det = a - b;
        if (!(det > 0)) continue;
        const float sn1 = sum_w * sum_xl, sn2 = sum_x * sum_l;
        float t_scale = (sn1 - sn2) / det;
        const float mn1 = sum_l2 * sum_x, mn2 = sum_l * sum_xl;
        float t_min = (mn1 - mn2) / det;
        if (t_min > 0) { /* the offset may not be positive: fit the scale alone */
            t_min = 0;
            t_scale = sum_xl / sum_l2;
        }
        const float err = fit_error(x, w, trial, t_scale, t_min);
        if (err < best) {
            memcpy(L, trial, 32);
            best = err;
            scale = t_scale;
            min = t_min;
        }
    }
    *neg_min = -min;
    return scale;
}

/* Q4_K: f16 d, f16 dmin, 12 bytes of 6-bit sub-block scales and mins (the packing dq_q4_k
 * reads), 128 bytes of nibbles. Each sub-block is fitted on its own (weights |x| + rms of the
 * sub-block), then its scale and min are coded as 6-bit multiples of the block's largest over 63,
 * and the values re-quantized against the coded scale and min. */
static void q_q4_k(const float *x, uint8_t *b) {
    uint8_t L[QK_K];
    float w[32], scales[8], mins[8];
    float max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < 8; j++) {
        const float *xs = x + 32 * j;
        float sum_x2 = 0.0f;
        for (int l = 0; l < 32; l++) {
            const float sq = xs[l] * xs[l];
            sum_x2 += sq;
        }
        const float rms = sqrtf(sum_x2 / 32.0f);
        for (int l = 0; l < 32; l++) w[l] = rms + fabsf(xs[l]);
        scales[j] = fit_sub_block(xs, w, L + 32 * j, &mins[j]);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
    const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
    uint8_t ls[8], lm[8];
    for (int j = 0; j < 8; j++) {
        /* ggml stores the rounded int in a uint8_t before clamping: keep that wrap-around */
        ls[j] = (uint8_t)round_k(inv_scale * scales[j]);
        lm[j] = (uint8_t)round_k(inv_min * mins[j]);
        if (ls[j] > 63) ls[j] = 63;
        if (lm[j] > 63) lm[j] = 63;
    }
    uint8_t *sc = b + 4;
    for (int j = 0; j < 4; j++) {
        sc[j] = (uint8_t)(ls[j] | (ls[j + 4] >> 4) << 6);
        sc[j + 4] = (uint8_t)(lm[j] | (lm[j + 4] >> 4) << 6);
        sc[j + 8] = (uint8_t)((ls[j + 4] & 0x0F) | (lm[j + 4] & 0x0F) << 4);
    }
    const uint16_t hd = cdf_f32_to_f16(max_scale / 63.0f), hm = cdf_f32_to_f16(max_min / 63.0f);
    b[0] = (uint8_t)(hd & 0xFF);
    b[1] = (uint8_t)(hd >> 8);
    b[2] = (uint8_t)(hm & 0xFF);
    b[3] = (uint8_t)(hm >> 8);
    const float d = cdf_f16_to_f32(hd), dmin = cdf_f16_to_f32(hm);
    for (int j = 0; j < 8; j++) {
        const float dj = d * (float)ls[j];
        if (dj == 0.0f) continue; /* a zero coded scale: keep the fit's levels (they decode to -dm) */
        const float mj = dmin * (float)lm[j];
        for (int l = 0; l < 32; l++) {
            const float num = x[32 * j + l] + mj;
            L[32 * j + l] = (uint8_t)clamp_nib(round_k(num / dj));
        }
    }
    /* byte (j/2)*32 + l: sub-block j even in the low nibble, j + 1 in the high one */
    uint8_t *qs = b + 16;
    for (int p = 0; p < 4; p++)
        for (int l = 0; l < 32; l++) qs[32 * p + l] = (uint8_t)(L[64 * p + l] | L[64 * p + 32 + l] << 4);
}

cdf_status cdf_ggml_quantize(uint32_t type, const float *src, int64_t n, void *dst) {
    const char *name = cdf_ggml_type_name(type);
    if (type != CDF_GGML_Q8_0 && type != CDF_GGML_Q4_K)
        return cdf_error(CDF_ERR_UNSUPPORTED, "quantizing to ggml type %s is not supported (Q8_0 and Q4_K are)",
                         name ? name : "unknown");
    const int be = type == CDF_GGML_Q8_0 ? 32 : QK_K, bb = type == CDF_GGML_Q8_0 ? 34 : 144;
    if (n < 0 || n % be || (n && (!src || !dst)))
        return cdf_error(CDF_ERR_INVALID_ARG, "quantizing %lld values to %s: not a whole number of %d-value blocks",
                         (long long)n, name, be);
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(src[i]))
            return cdf_error(CDF_ERR_INVALID_ARG, "quantizing to %s: value %lld is %g (not finite)", name, (long long)i,
                             (double)src[i]);
    for (int64_t k = 0; k < n / be; k++) {
        if (type == CDF_GGML_Q8_0) q_q8_0(src + be * k, (uint8_t *)dst + bb * k);
        else q_q4_k(src + be * k, (uint8_t *)dst + bb * k);
    }
    return CDF_OK;
}
