/* The vectorised sigmoid-family ops (src/kernels/elementwise_fast.c) at every ISA level the CPU
 * has, against double-precision definitions computed here:
 *   gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))   silu(x) = x / (1 + e^-x)
 *   sigmoid(x)   = 1 / (1 + e^-x)                                    quick_gelu(x) = x sigmoid(1.702 x)
 * Bound: |got - want| <= (5e-7 + 3 |z| 2^-24) |want| + 1e-36, z the argument of the op's exp
 * (8 f32 ulps, plus the conditioning of exp; the absolute term covers results
 * in the denormal range, where the vector exp flushes to 0 as expf nearly does). The generic
 * level computes GELU as torch does, 0.5 x (1 + tanhf(u)), which cancels for x below about -5
 * (tanhf(u) rounds to -1): there it is allowed half an ulp of 1 times |x| more; the vector levels
 * use x sigmoid(2u), the same function without the cancellation, and get the tight bound. Special values
 * follow the scalar definitions (NaN in, NaN out; +-inf as cdf_k_unary_f gives them). And the
 * result of an element must not depend on the span it is computed in (the fused kernels use
 * other block sizes than the unfused ones and must stay bit-identical to them). The fused kernel
 * reads strided operands (broadcasts: stride 0 on the last or a middle dimension, transposed,
 * gapped rows, bf16) exactly as an element-by-element walk does, and its binary steps (vectorised
 * add/sub/mul/div) give the scalar definitions' values. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#include "kernels/cpu_features.h"
#include "kernels/kernels.h"
#include "kernels/reference_internal.h"

static double truth(cdf_unary_op op, double x) {
    switch (op) {
    case CDF_UN_GELU_TANH: { /* = 0.5 x (1 + tanh(u)), written without its cancellation (even double's 1 + tanh(u) cancels for x < -6) */
        const double u = 0.79788456080286535588 * (x + 0.044715 * x * x * x);
        return x / (1.0 + exp(-2.0 * u));
    }
    case CDF_UN_SILU: return x / (1.0 + exp(-x));
    case CDF_UN_SIGMOID: return 1.0 / (1.0 + exp(-x));
    case CDF_UN_QUICK_GELU: return x / (1.0 + exp(-1.702 * x));
    default: return NAN;
    }
}

/* |z| of the exp(-z) each op evaluates: an f32 rounding of z (relative 2^-24) becomes a relative
 * error of |z| 2^-24 in exp(-z), so the bound grows with it (conditioning, not the kernel) */
static double exp_arg(cdf_unary_op op, double x) {
    switch (op) {
    case CDF_UN_GELU_TANH: return fabs(2.0 * 0.79788456080286535588 * (x + 0.044715 * x * x * x));
    case CDF_UN_QUICK_GELU: return fabs(1.702 * x);
    default: return fabs(x);
    }
}

static const cdf_unary_op k_ops[] = {CDF_UN_GELU_TANH, CDF_UN_SILU, CDF_UN_SIGMOID, CDF_UN_QUICK_GELU};
static const char *const k_names[] = {"gelu_tanh", "silu", "sigmoid", "quick_gelu"};

/* inputs: a dense sweep of [-20, 20], random magnitudes up to 1e4, tiny values, exact zeros */
static int64_t make_inputs(float *x, int64_t cap) {
    int64_t n = 0;
    for (int i = -20000; i <= 20000 && n < cap; i++) x[n++] = (float)i * 1e-3f;
    uint64_t s = 12345;
    while (n < cap) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        const double u = (double)(s >> 11) / 9007199254740992.0; /* [0, 1) */
        const double mag = pow(10.0, -30.0 + 34.0 * u);
        x[n] = (float)((s & 1) ? -mag : mag);
        n++;
    }
    x[0] = 0.0f;
    x[1] = -0.0f;
    return n;
}

static void test_against_double(void **state) {
    (void)state;
    enum { N = 60000 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    assert_non_null(x);
    assert_non_null(y);
    const int64_t n = make_inputs(x, N);
    const cdf_k_isa native = cdf_k_isa_native();
    for (int isa = CDF_K_ISA_GENERIC; isa <= (int)native; isa++) {
        for (size_t o = 0; o < sizeof k_ops / sizeof *k_ops; o++) {
            memcpy(y, x, (size_t)n * sizeof *y);
            cdf_k_unary_span_at((cdf_k_isa)isa, k_ops[o], y, n, 0.0f, 0.0f);
            double worst = 0;
            int64_t bad = -1;
            for (int64_t i = 0; i < n; i++) {
                const double want = truth(k_ops[o], (double)x[i]), err = fabs((double)y[i] - want);
                const double cancel = isa == CDF_K_ISA_GENERIC && k_ops[o] == CDF_UN_GELU_TANH ? 6e-8 * fabs((double)x[i]) : 0;
                const double excess = err - ((5e-7 + 3.0 * exp_arg(k_ops[o], x[i]) * 0x1p-24) * fabs(want) + 1e-36 + cancel);
                if (excess > worst || isnan(y[i])) {
                    worst = isnan(y[i]) ? INFINITY : excess;
                    bad = i;
                }
            }
            if (bad >= 0)
                fail_msg("%s at %s: x = %.9g gives %.9g, want %.9g", k_names[o], cdf_k_isa_name((cdf_k_isa)isa), x[bad],
                         y[bad], truth(k_ops[o], (double)x[bad]));
        }
        print_message("  %s: gelu_tanh, silu, sigmoid, quick_gelu within bounds on %lld inputs\n",
                      cdf_k_isa_name((cdf_k_isa)isa), (long long)n);
    }
    free(x);
    free(y);
}

/* NaN and infinities give what the scalar (libm) definitions give */
static void test_special_values(void **state) {
    (void)state;
    const float specials[] = {NAN, INFINITY, -INFINITY, 3.4e38f, -3.4e38f, 88.0f, -88.0f, 1e-40f};
    const int n = sizeof specials / sizeof *specials;
    for (int isa = CDF_K_ISA_GENERIC; isa <= (int)cdf_k_isa_native(); isa++)
        for (size_t o = 0; o < sizeof k_ops / sizeof *k_ops; o++) {
            float y[8];
            memcpy(y, specials, sizeof y);
            cdf_k_unary_span_at((cdf_k_isa)isa, k_ops[o], y, n, 0.0f, 0.0f);
            for (int i = 0; i < n; i++) {
                const float want = cdf_k_unary_f(k_ops[o], specials[i], 0.0f, 0.0f);
                const bool same = (isnan(want) && isnan(y[i])) || want == y[i] || fabsf(y[i] - want) <= 4e-6f * fabsf(want);
                if (!same)
                    fail_msg("%s at %s: x = %g gives %g, the scalar definition %g", k_names[o], cdf_k_isa_name((cdf_k_isa)isa),
                             specials[i], y[i], want);
            }
        }
}

/* an element's result is the same whatever span (offset, length) it is computed in */
static void test_span_independent(void **state) {
    (void)state;
    enum { N = 203 };
    float x[N], whole[N];
    for (int i = 0; i < N; i++) x[i] = (float)(i - 101) * 0.137f;
    for (int isa = CDF_K_ISA_GENERIC; isa <= (int)cdf_k_isa_native(); isa++)
        for (size_t o = 0; o < sizeof k_ops / sizeof *k_ops; o++) {
            memcpy(whole, x, sizeof whole);
            cdf_k_unary_span_at((cdf_k_isa)isa, k_ops[o], whole, N, 0.0f, 0.0f);
            for (int len = 1; len <= 37; len += 3)
                for (int start = 0; start + len <= N; start += len) {
                    float part[37];
                    memcpy(part, x + start, (size_t)len * sizeof *part);
                    cdf_k_unary_span_at((cdf_k_isa)isa, k_ops[o], part, len, 0.0f, 0.0f);
                    if (memcmp(part, whole + start, (size_t)len * sizeof *part) != 0)
                        fail_msg("%s at %s: span [%d, %d) differs from the whole-array result", k_names[o],
                                 cdf_k_isa_name((cdf_k_isa)isa), start, start + len);
                }
        }
}

/* out = (in0 * in1 + in2) for [4, 7, 300] (blocks of the kernel cross rows and matrices), each
 * input with its own strides; want from an element-by-element walk of the same strides */
static void test_fused_strided_inputs(void **state) {
    (void)state;
    enum { A = 4, B = 7, C = 300, N = A * B * C };
    const int64_t shape[3] = {A, B, C};
    static float buf0[2 * N], buf1[N], buf2[N], out[N];
    uint16_t *buf0h = malloc(sizeof(uint16_t) * 2 * N);
    assert_non_null(buf0h);
    for (int i = 0; i < 2 * N; i++) buf0[i] = (float)((i * 37) % 1001) * 0.01f - 5.0f;
    for (int i = 0; i < N; i++) buf1[i] = (float)((i * 13) % 97) * 0.03f - 1.0f, buf2[i] = (float)(i % 11) - 5.0f;
    for (int i = 0; i < 2 * N; i++) buf0h[i] = cdf_f32_to_bf16(buf0[i]);
    static const struct {
        int64_t s0[3], s1[3], s2[3];
        bool bf16;
    } cases[] = {
        {{B * C, C, 1}, {C, 0, 1}, {0, 0, 1}, false},             /* AdaLN scale [A,1,C], bias [C] */
        {{B * C, C, 1}, {B, 1, 0}, {0, 1, 0}, false},             /* stride 0 on the last dimension */
        {{1, A, A * B}, {B * C, C, 1}, {C, 0, 1}, false},         /* transposed head input */
        {{2 * B * C, 2 * C, 1}, {B * C, C, 1}, {0, C, 1}, false}, /* gapped rows */
        {{2 * B * C, 2 * C, 2}, {C, 0, 1}, {0, 0, 0}, true},      /* every other element, bf16; a scalar */
    };
    cdf_fused_program prog = {.n_steps = 2,
                              .steps = {{.binary = true, .input = 1, .op = CDF_BIN_MUL},
                                        {.binary = true, .input = 2, .op = CDF_BIN_ADD}}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const void *in[3] = {cases[c].bf16 ? (const void *)buf0h : (const void *)buf0, buf1, buf2};
        const cdf_dtype dts[3] = {cases[c].bf16 ? CDF_BF16 : CDF_F32, CDF_F32, CDF_F32};
        const int64_t *st[3] = {cases[c].s0, cases[c].s1, cases[c].s2};
        assert_int_equal(cdf_k_fused_elementwise(&prog, out, CDF_F32, 3, in, dts, st, 3, shape), CDF_OK);
        for (int64_t a = 0; a < A; a++)
            for (int64_t b = 0; b < B; b++)
                for (int64_t k = 0; k < C; k++) {
                    float v[3];
                    for (int t = 0; t < 3; t++)
                        v[t] = cdf_k_ld(in[t], dts[t], a * st[t][0] + b * st[t][1] + k * st[t][2]);
                    const float want = v[0] * v[1] + v[2], got = out[(a * B + b) * C + k];
                    if (memcmp(&want, &got, sizeof got) != 0)
                        fail_msg("case %zu: element [%lld,%lld,%lld] is %g, want %g", c, (long long)a, (long long)b,
                                 (long long)k, (double)got, (double)want);
                }
    }
    free(buf0h);
}

/* the fused kernel's binary steps (cdf_k_binary_span: add/sub/mul/div in vectors at the AVX2 /
 * AVX-512 levels) give cdf_k_binary_f's value for every element, either operand order, every
 * length (vector bodies and tails), with infinities, NaN, denormals and signed zeros among the
 * operands (a NaN result need only be a NaN: which operand's payload survives is the hardware's) */
static void test_binary_span(void **state) {
    (void)state;
    enum { N = 517 };
    static const float specials[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e-40f, -3e-39f, 3.4e38f};
    static const cdf_binary_op ops[] = {CDF_BIN_ADD, CDF_BIN_SUB, CDF_BIN_MUL, CDF_BIN_DIV, CDF_BIN_MAX, CDF_BIN_MIN};
    float a[N], b[N], v[N];
    for (int i = 0; i < N; i++) {
        a[i] = (float)((i * 37) % 1001) * 0.013f - 6.0f;
        b[i] = (float)((i * 53) % 997) * 0.007f - 3.0f;
        if (i % 7 == 3) a[i] = specials[(i / 7) % 8];
        if (i % 11 == 5) b[i] = specials[(i / 11) % 8];
    }
    for (size_t o = 0; o < sizeof ops / sizeof *ops; o++)
        for (int rhs = 0; rhs < 2; rhs++)
            for (int len = 0; len <= N; len += len < 40 ? 1 : 477) {
                memcpy(v, a, sizeof v);
                cdf_k_binary_span(ops[o], rhs, v, b, len);
                for (int i = 0; i < N; i++) {
                    const float want = i >= len ? a[i] : rhs ? cdf_k_binary_f(ops[o], b[i], a[i]) : cdf_k_binary_f(ops[o], a[i], b[i]);
                    if (!(isnan(want) && isnan(v[i])) && memcmp(&want, &v[i], sizeof want) != 0)
                        fail_msg("op %d rhs %d len %d: element %d is %g, cdf_k_binary_f gives %g", (int)ops[o], rhs, len, i,
                                 (double)v[i], (double)want);
                }
            }
}

/* cdf_k_convert_span (the casts around bf16 matmuls and attention, in vectors) gives
 * cdf_f32_to_bf16 / cdf_bf16_to_f32 bit for bit: every bf16 pattern; f32 patterns from a
 * generator over the whole 32-bit range plus rounding ties (odd and even), NaNs with payloads,
 * infinities, denormals and values that round up to infinity; every length up to 40 (vector
 * bodies and tails). Where it declines (other dtypes, below avx2) it writes nothing. */
static void test_convert_span(void **state) {
    (void)state;
    enum { N = 1 << 16 };
    uint16_t *h = malloc(sizeof(uint16_t) * N), *h2 = malloc(sizeof(uint16_t) * N);
    float *f = malloc(sizeof(float) * N), *f2 = malloc(sizeof(float) * N);
    assert_true(h && h2 && f && f2);
    for (int i = 0; i < N; i++) h[i] = (uint16_t)i;
    const bool vec = cdf_k_convert_span(f2, CDF_F32, h, CDF_BF16, N);
    if (!vec) {
        printf("  [skip] no vector conversion at this level\n");
        assert_false(cdf_k_convert_span(h2, CDF_BF16, f, CDF_F32, N));
    } else {
        for (int i = 0; i < N; i++) {
            const float want = cdf_bf16_to_f32(h[i]);
            if (memcmp(&want, &f2[i], 4) != 0) fail_msg("bf16 0x%04x -> f32: %a, want %a", h[i], (double)f2[i], (double)want);
        }
        static const uint32_t special[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffbfffffu, 0x00000001u,
                                           0x807fffffu, 0x3f808000u, 0x3f818000u, 0x3f817fffu, 0x7f7f8000u, 0x7f7fffffu,
                                           0x00008000u, 0x00018000u, 0x80000000u, 0x00000000u};
        uint64_t x = 0x9e3779b97f4a7c15ull;
        for (int i = 0; i < N; i++) {
            uint32_t u;
            if (i < 16) u = special[i];
            else {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                u = (uint32_t)(x >> 16);
                if (i % 3 == 0) u = (u & 0xffff0000u) | 0x8000u; /* a tie */
            }
            memcpy(&f[i], &u, 4);
        }
        for (int len = 0; len <= 40; len++) {
            memset(h2, 0xab, sizeof(uint16_t) * N);
            assert_true(cdf_k_convert_span(h2, CDF_BF16, f + 16 * len, CDF_F32, len) || len == 0);
            for (int i = 0; i < len; i++)
                if (h2[i] != cdf_f32_to_bf16(f[16 * len + i]))
                    fail_msg("len %d: f32 %a -> bf16 0x%04x, want 0x%04x", len, (double)f[16 * len + i], h2[i],
                             cdf_f32_to_bf16(f[16 * len + i]));
            if (h2[len] != 0xabab) fail_msg("len %d: wrote past the span", len);
        }
        assert_true(cdf_k_convert_span(h2, CDF_BF16, f, CDF_F32, N));
        for (int i = 0; i < N; i++)
            if (h2[i] != cdf_f32_to_bf16(f[i])) fail_msg("f32 %a -> bf16 0x%04x, want 0x%04x", (double)f[i], h2[i], cdf_f32_to_bf16(f[i]));
        assert_false(cdf_k_convert_span(h2, CDF_F16, f, CDF_F32, N)); /* not its pair */
    }
    free(h), free(h2), free(f), free(f2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fused_strided_inputs),
        cmocka_unit_test(test_against_double),
        cmocka_unit_test(test_special_values),
        cmocka_unit_test(test_span_independent),
        cmocka_unit_test(test_binary_span),
        cmocka_unit_test(test_convert_span),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
