/* torch.randn for float32 tensors of 16 or more elements, as torch's AVX2 build computes it.
 *
 * torch draws every 24-bit uniform first, then turns each block of 16 into normals with
 * Box-Muller, using the Cephes-style log/sincos approximations of avx_mathfun.h in float32.
 * The golden torch build was compiled by GCC, which fused some multiply-adds of those
 * approximations into FMAs. We reproduce that exact sequence of roundings: every fused step
 * is an explicit fmaf(), every other step is a plain float32 operation. The file is compiled
 * with FMA contraction off so the compiler cannot fuse anything else, which makes the result
 * independent of -O levels and -march (fmaf is exact in hardware and in glibc's fallback).
 * Evaluated this way the result matches torch bit for bit (golden rng/ data, 669k values);
 * a "cleaner" evaluation (no fusion, or double precision) differs in 1-30% of the values. */
#include "core/exact_fp.h" /* first: no FMA contraction, no -ffast-math */
#include <float.h>
#if defined(FLT_EVAL_METHOD) && FLT_EVAL_METHOD != 0
#error "src/rng needs float arithmetic evaluated in float (FLT_EVAL_METHOD == 0, e.g. SSE on x86)"
#endif

#include <math.h>
#include <string.h>

#include "rng_internal.h"

/* log(x) for x in (0, 1] (x is 1 - u with u a 24-bit uniform, so never 0 or denormal). */
static float cephes_logf(float x) {
    uint32_t bits;
    memcpy(&bits, &x, 4);
    /* exponent as a float, biased so that the mantissa below lies in [0.5, 1) */
    float e = (float)((int32_t)(bits >> 23) - 127) + 1.0f;
    bits = (bits & ~0x7f800000u) | 0x3f000000u;
    float m;
    memcpy(&m, &bits, 4);
    if (m < 0.707106781186547524f) {
        e = e - 1.0f;
        m = (m - 1.0f) + m;
    } else {
        m = m - 1.0f;
    }
    const float z = m * m;
    float y = 7.0376836292e-2f;
    y = fmaf(y, m, -1.1514610310e-1f);
    y = fmaf(y, m, 1.1676998740e-1f);
    y = fmaf(y, m, -1.2420140846e-1f);
    y = fmaf(y, m, 1.4249322787e-1f);
    y = fmaf(y, m, -1.6668057665e-1f);
    y = fmaf(y, m, 2.0000714765e-1f);
    y = fmaf(y, m, -2.4999993993e-1f);
    y = fmaf(y, m, 3.3333331174e-1f);
    y = y * m;
    const float eq1 = e * -2.12194440e-4f;
    y = fmaf(y, z, eq1);
    const float half_z = z * 0.5f;
    y = y - half_z;
    m = m + y;
    return fmaf(e, 0.693359375f, m);
}

/* sin and cos of theta in [0, 2*pi) (theta = float(2*pi) * u, never negative). */
static void cephes_sincosf(float theta, float *sin_out, float *cos_out) {
    const float scaled = theta * 1.27323954473516f; /* 4/pi */
    int32_t j = (int32_t)scaled;                     /* truncation, like cvttps2dq */
    j = (j + 1) & ~1;
    const float y = (float)j;
    /* extended-precision range reduction x = theta - y*pi/4 in three parts */
    float x = fmaf(y, -0.78515625f, theta);
    x = fmaf(y, -2.4187564849853515625e-4f, x);
    x = fmaf(y, -3.77489497744594108e-8f, x);
    const float z = x * x;

    float c = fmaf(fmaf(2.443315711809948e-5f, z, -1.388731625493765e-3f), z, 4.166664568298827e-2f);
    c = c * z;
    const float half_z = z * 0.5f;
    c = fmaf(c, z, -half_z);
    c = c + 1.0f;

    float s = fmaf(fmaf(-1.9515295891e-4f, z, 8.3321608736e-3f), z, -1.6666654611e-1f);
    s = s * z;
    s = fmaf(s, x, x);

    float sv, cv;
    if ((j & 2) == 0) {
        sv = s;
        cv = c;
    } else {
        sv = c;
        cv = s;
    }
    if (j & 4) sv = -sv;
    if (((j - 2) & 4) == 0) cv = -cv;
    *sin_out = sv;
    *cos_out = cv;
}

static void normal16(float *d) {
    const float two_pi = (float)(2.0 * 3.14159265358979323846);
    const float mean = 0.0f, stdv = 1.0f;
    for (int j = 0; j < 8; j++) {
        const float u1 = 1.0f - d[j];
        const float u2 = d[j + 8];
        const float radius = sqrtf(-2.0f * cephes_logf(u1));
        const float theta = two_pi * u2;
        float s, c;
        cephes_sincosf(theta, &s, &c);
        const float n1 = radius * c;
        const float n2 = radius * s;
        /* torch stores fmadd(n, std, mean); with std 1 and mean 0 this only turns -0 into +0 */
        d[j] = fmaf(n1, stdv, mean);
        d[j + 8] = fmaf(n2, stdv, mean);
    }
}

void cdf_rng_normal_fill_f32(cdf_generator *g, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = cdf_rng_uniform_bits_f(g, 24);
    for (int64_t i = 0; i + 16 <= n; i += 16) normal16(out + i);
    if (n % 16 != 0) {
        /* torch redoes the last 16 slots with fresh uniforms */
        float *tail = out + n - 16;
        for (int i = 0; i < 16; i++) tail[i] = cdf_rng_uniform_bits_f(g, 24);
        normal16(tail);
    }
}
