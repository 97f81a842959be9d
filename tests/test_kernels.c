/* Reference kernels (src/kernels/reference_*.c) against independent double-precision references
 * computed here, on random inputs, for f32/bf16/f16 storage, ragged sizes, non-contiguous
 * strides and broadcasting; plus the golden timestep-embedding and RoPE tables
 * (tests/data/embeddings/embeddings.safetensors, a byte-identical copy of the golden file).
 *
 * Tolerances: an f32 result may differ from the double reference by its f32 computation error
 * (atol + rtol * magnitude, sized per kernel below); a bf16/f16 result additionally by half an
 * ulp of the output dtype (the single rounding on store). Inputs are rounded to their storage
 * dtype before the double reference sees them. */
#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#include "cdiffusers/dtype.h"
#include "cdiffusers/error.h"
#include "cdiffusers/io.h"
#include "kernels/fast_onednn.h"
#include "kernels/gemm_bf16w.h"
#include "kernels/kernels.h"

#define U32 (1.0 / 16777216.0) /* f32 unit roundoff 2^-24 */

/* ---- helpers -------------------------------------------------------------------------------- */

static float *rnd(size_t n, uint64_t seed, float scale) {
    float *x = malloc(sizeof(float) * (n ? n : 1));
    assert_non_null(x);
    tu_fill_random(x, n, seed);
    for (size_t i = 0; i < n; i++) x[i] *= scale;
    return x;
}

/* A copy of f32 values in storage dtype dt. */
static void *to_dt(const float *x, size_t n, cdf_dtype dt) {
    void *p = malloc(cdf_dtype_size(dt) * (n ? n : 1));
    assert_non_null(p);
    cdf_convert(p, dt, x, CDF_F32, n);
    return p;
}

static float *from_dt(const void *p, cdf_dtype dt, size_t n) {
    float *x = malloc(sizeof(float) * (n ? n : 1));
    assert_non_null(x);
    cdf_convert(x, CDF_F32, p, dt, n);
    return x;
}

/* x := x rounded to dt (what the kernel will see). */
static void round_to(float *x, size_t n, cdf_dtype dt) {
    void *p = to_dt(x, n, dt);
    cdf_convert(x, CDF_F32, p, dt, n);
    free(p);
}

/* Half an ulp of dt at magnitude v (0 for f32: f32 results are judged by the computation bound). */
static double half_ulp(double v, cdf_dtype dt) {
    if (dt == CDF_F32) return 0.0;
    int mant = dt == CDF_BF16 ? 7 : 10, emin = dt == CDF_BF16 ? -126 : -14;
    int e = v > 0 ? (int)floor(log2(v)) : emin;
    if (e < emin) e = emin;
    return ldexp(1.0, e - mant) * 0.5;
}

/* Compare kernel output (already converted to f32) with the double reference. The allowed error
 * of element i is atol + rtol * mag_i (mag = |ref| when NULL) plus half an ulp of the output
 * dtype. NaN must match NaN. */
static void check_close_mag(const char *what, const float *got, const double *ref, const double *mag, size_t n,
                            cdf_dtype dt, double atol, double rtol) {
    for (size_t i = 0; i < n; i++) {
        double m = mag ? mag[i] : fabs(ref[i]);
        double tol = atol + rtol * m;
        tol += half_ulp(fabs(ref[i]) + tol, dt);
        bool ok = isnan(ref[i]) ? isnan(got[i]) : (fabs((double)got[i] - ref[i]) <= tol);
        if (!ok)
            fail_msg("%s (%s): element %zu of %zu: got %.9g, reference %.9g, |diff| %.3g > tol %.3g", what,
                     cdf_dtype_name(dt), i, n, (double)got[i], ref[i], fabs((double)got[i] - ref[i]), tol);
    }
}

static void check_close(const char *what, const float *got, const double *ref, size_t n, cdf_dtype dt, double atol,
                        double rtol) {
    check_close_mag(what, got, ref, NULL, n, dt, atol, rtol);
}

static const cdf_dtype FLOAT_DTS[] = {CDF_F32, CDF_BF16, CDF_F16};

/* ---- a tiny safetensors reader (test-only; F32 tensors by name) ------------------------------ */

typedef struct {
    char *buf;
    size_t len;
    char *hdr; /* NUL-terminated copy of the JSON header */
    const char *data;
    size_t data_len;
} st_file;

static void st_open(st_file *f, const char *path) {
    memset(f, 0, sizeof *f);
    f->buf = tu_read_file(path, &f->len);
    if (!f->buf) fail_msg("cannot read %s", path);
    assert_true(f->len >= 8);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | (unsigned char)f->buf[i];
    assert_true(hl <= f->len - 8);
    f->hdr = malloc(hl + 1);
    assert_non_null(f->hdr);
    memcpy(f->hdr, f->buf + 8, hl);
    f->hdr[hl] = 0;
    f->data = f->buf + 8 + hl;
    f->data_len = f->len - 8 - hl;
}

static void st_close(st_file *f) {
    free(f->buf);
    free(f->hdr);
}

/* A malloc'd copy of F32 tensor `key`, which must have `numel` elements. */
static float *st_f32(const st_file *f, const char *key, size_t numel) {
    char pat[256];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(f->hdr, pat);
    if (!p) fail_msg("tensor %s not in the golden file", key);
    const char *end = strchr(p, '}');
    assert_non_null(end);
    const char *dt = strstr(p, "\"dtype\":\"F32\"");
    assert_true(dt && dt < end);
    const char *off = strstr(p, "\"data_offsets\":[");
    assert_true(off && off < end);
    unsigned long long a = 0, b = 0;
    assert_int_equal(sscanf(off + strlen("\"data_offsets\":["), "%llu,%llu", &a, &b), 2);
    assert_true(a <= b && b <= f->data_len);
    if (b - a != numel * sizeof(float)) fail_msg("tensor %s has %llu bytes, expected %zu", key, b - a, numel * 4);
    float *x = malloc(b - a + 4);
    assert_non_null(x);
    memcpy(x, f->data + a, b - a);
    return x;
}

/* ---- copy_strided / fill / embedding / upsample -------------------------------------------- */

static void test_copy_strided_float(void **state) {
    (void)state;
    /* logical [3, 17, 5] copied for every float dtype pair, in two layouts:
     * (0) src contiguous, dst with the first two dims swapped in memory ([17, 3, 5]);
     * (1) src fully reversed in memory ([5, 17, 3]), dst contiguous: inner strides != 1 */
    const int64_t shape[3] = {3, 17, 5};
    const size_t n = 3 * 17 * 5;
    const int64_t src_sts[2][3] = {{17 * 5, 5, 1}, {1, 3, 51}}, dst_sts[2][3] = {{5, 3 * 5, 1}, {17 * 5, 5, 1}};
    for (int k = 0; k < 18; k++) {
        {
            const int layout = k / 9, si = (k / 3) % 3, di = k % 3;
            const int64_t *src_st = src_sts[layout], *dst_st = dst_sts[layout];
            cdf_dtype sdt = FLOAT_DTS[si], ddt = FLOAT_DTS[di];
            float *x = rnd(n, 11 + si, 3.0f);
            round_to(x, n, sdt);
            void *src = to_dt(x, n, sdt);
            void *dst = malloc(n * cdf_dtype_size(ddt));
            assert_int_equal(cdf_k_copy_strided(dst, ddt, dst_st, src, sdt, src_st, 3, shape), CDF_OK);
            float *got = from_dt(dst, ddt, n);
            double ref[3 * 17 * 5];
            float got_logical[3 * 17 * 5];
            for (int a = 0; a < 3; a++)
                for (int b = 0; b < 17; b++)
                    for (int c = 0; c < 5; c++) {
                        size_t li = (size_t)(a * 85 + b * 5 + c);
                        ref[li] = x[a * src_st[0] + b * src_st[1] + c * src_st[2]];
                        got_logical[li] = got[a * dst_st[0] + b * dst_st[1] + c * dst_st[2]];
                    }
            check_close("copy_strided transpose", got_logical, ref, n, ddt, 0, 0);
            free(x); free(src); free(dst); free(got);
        }
    }
}

static void test_copy_strided_broadcast_and_ints(void **state) {
    (void)state;
    /* broadcast: src [1, 4] (stride 0 on dim 0) into dst [3, 4] with a padded row stride 6 */
    float src[4] = {1.5f, -2.25f, 3.0f, 1e-3f};
    float dst[18];
    for (int i = 0; i < 18; i++) dst[i] = -99.0f;
    const int64_t shape[2] = {3, 4}, sst[2] = {0, 1}, dst_st[2] = {6, 1};
    assert_int_equal(cdf_k_copy_strided(dst, CDF_F32, dst_st, src, CDF_F32, sst, 2, shape), CDF_OK);
    for (int r = 0; r < 3; r++) {
        for (int c = 0; c < 4; c++) assert_true(dst[r * 6 + c] == src[c]);
        assert_true(dst[r * 6 + 4] == -99.0f && dst[r * 6 + 5] == -99.0f); /* padding untouched */
    }

    /* i64 -> i64 and i64 -> i32 and i32 -> i64 are exact (values beyond 2^53 must survive) */
    int64_t big[3] = {(1LL << 60) + 1, -((1LL << 55) + 3), 7};
    int64_t big_out[3] = {0};
    const int64_t s1[1] = {1}, n3[1] = {3};
    assert_int_equal(cdf_k_copy_strided(big_out, CDF_I64, s1, big, CDF_I64, s1, 1, n3), CDF_OK);
    for (int i = 0; i < 3; i++) assert_true(big_out[i] == big[i]);
    int64_t i64v[3] = {2147483647LL, -2147483648LL, 123456789LL};
    int32_t i32v[3];
    assert_int_equal(cdf_k_copy_strided(i32v, CDF_I32, s1, i64v, CDF_I64, s1, 1, n3), CDF_OK);
    for (int i = 0; i < 3; i++) assert_true((int64_t)i32v[i] == i64v[i]);
    int32_t i32src[3] = {16777217, -5, 0}; /* 2^24 + 1 is not an f32 */
    int64_t back[3];
    assert_int_equal(cdf_k_copy_strided(back, CDF_I64, s1, i32src, CDF_I32, s1, 1, n3), CDF_OK);
    for (int i = 0; i < 3; i++) assert_true(back[i] == i32src[i]);
    /* out-of-range integer narrowing wraps like torch's (C's) integer conversion, so no value
     * goes through a double: 2^40 + 5 -> 5 */
    int64_t wide = (1LL << 40) + 5;
    int32_t narrow = 0;
    const int64_t n1[1] = {1};
    assert_int_equal(cdf_k_copy_strided(&narrow, CDF_I32, s1, &wide, CDF_I64, s1, 1, n1), CDF_OK);
    assert_int_equal(narrow, 5);

    /* float -> int truncates toward zero; int -> float */
    float fv[4] = {-2.7f, 2.7f, -0.5f, 100.99f};
    int64_t iv[4];
    const int64_t n4[1] = {4};
    assert_int_equal(cdf_k_copy_strided(iv, CDF_I64, s1, fv, CDF_F32, s1, 1, n4), CDF_OK);
    assert_true(iv[0] == -2 && iv[1] == 2 && iv[2] == 0 && iv[3] == 100);
    int64_t ints[3] = {3, -4, 1 << 20};
    uint16_t bf[3];
    assert_int_equal(cdf_k_copy_strided(bf, CDF_BF16, s1, ints, CDF_I64, s1, 1, n3), CDF_OK);
    assert_true(cdf_bf16_to_f32(bf[0]) == 3.0f && cdf_bf16_to_f32(bf[1]) == -4.0f &&
                cdf_bf16_to_f32(bf[2]) == 1048576.0f);
    /* f64 -> f32, ints -> bool */
    double dv[3] = {0.1, -1e10, 3.0};
    float fo[3];
    assert_int_equal(cdf_k_copy_strided(fo, CDF_F32, s1, dv, CDF_F64, s1, 1, n3), CDF_OK);
    for (int i = 0; i < 3; i++) assert_true(fo[i] == (float)dv[i]);
    uint8_t bo[3];
    int32_t bi[3] = {0, -3, 1};
    assert_int_equal(cdf_k_copy_strided(bo, CDF_BOOL, s1, bi, CDF_I32, s1, 1, n3), CDF_OK);
    assert_true(bo[0] == 0 && bo[1] == 1 && bo[2] == 1);

    /* ndim 0 = one element; a zero-sized dim copies nothing */
    float one = 4.5f;
    uint16_t one_bf = 0;
    assert_int_equal(cdf_k_copy_strided(&one_bf, CDF_BF16, NULL, &one, CDF_F32, NULL, 0, NULL), CDF_OK);
    assert_true(cdf_bf16_to_f32(one_bf) == 4.5f);
    const int64_t zero_shape[2] = {3, 0};
    assert_int_equal(cdf_k_copy_strided(NULL, CDF_F32, dst_st, NULL, CDF_F32, sst, 2, zero_shape), CDF_OK);
    assert_int_equal(cdf_k_copy_strided(dst, CDF_F32, dst_st, src, CDF_F32, sst, 9, shape), CDF_ERR_INVALID_ARG);

    /* a big strided copy takes the OpenMP path: src [600, 300] transposed into dst [300, 600] */
    const size_t bn = 600 * 300;
    float *bsrc = rnd(bn, 5, 1.0f), *bdst = malloc(sizeof(float) * bn);
    const int64_t bshape[2] = {300, 600}, bsst[2] = {1, 300}, bdst_st[2] = {600, 1};
    assert_int_equal(cdf_k_copy_strided(bdst, CDF_F32, bdst_st, bsrc, CDF_F32, bsst, 2, bshape), CDF_OK);
    for (int i = 0; i < 300; i++)
        for (int j = 0; j < 600; j++) assert_true(bdst[i * 600 + j] == bsrc[j * 300 + i]);
    free(bsrc);
    free(bdst);
}

static void test_fill(void **state) {
    (void)state;
    float f[17];
    assert_int_equal(cdf_k_fill(f, CDF_F32, 17, -1.25), CDF_OK);
    for (int i = 0; i < 17; i++) assert_true(f[i] == -1.25f);
    uint16_t b[5];
    assert_int_equal(cdf_k_fill(b, CDF_BF16, 5, 1.0 / 3.0), CDF_OK);
    for (int i = 0; i < 5; i++) assert_true(b[i] == cdf_f32_to_bf16(1.0f / 3.0f));
    assert_int_equal(cdf_k_fill(b, CDF_F16, 5, 0.1), CDF_OK);
    for (int i = 0; i < 5; i++) assert_true(b[i] == cdf_f32_to_f16(0.1f));
    int64_t l[3];
    assert_int_equal(cdf_k_fill(l, CDF_I64, 3, -7.9), CDF_OK);
    for (int i = 0; i < 3; i++) assert_true(l[i] == -7);
    int32_t m[3];
    assert_int_equal(cdf_k_fill(m, CDF_I32, 3, 42), CDF_OK);
    for (int i = 0; i < 3; i++) assert_true(m[i] == 42);
    assert_int_equal(cdf_k_fill(NULL, CDF_F32, 0, 1.0), CDF_OK);
    assert_int_equal(cdf_k_fill(f, CDF_F32, -1, 1.0), CDF_ERR_INVALID_ARG);
}

static void test_embedding(void **state) {
    (void)state;
    const int64_t rows = 10, dim = 13, n = 6;
    float *table = rnd((size_t)(rows * dim), 3, 2.0f);
    int64_t ids64[6] = {0, 9, 3, 3, 7, 1};
    int32_t ids32[6] = {9, 0, 0, 5, 2, 8};
    for (int ti = 0; ti < 3; ti++) {
        cdf_dtype tdt = FLOAT_DTS[ti];
        float *tr = malloc(sizeof(float) * (size_t)(rows * dim));
        memcpy(tr, table, sizeof(float) * (size_t)(rows * dim));
        round_to(tr, (size_t)(rows * dim), tdt);
        void *tb = to_dt(tr, (size_t)(rows * dim), tdt);
        for (int oi = 0; oi < 3; oi++) {
            cdf_dtype odt = FLOAT_DTS[oi];
            for (int use32 = 0; use32 < 2; use32++) {
                void *out = malloc(cdf_dtype_size(odt) * (size_t)(n * dim));
                assert_int_equal(cdf_k_embedding(out, odt, tb, tdt, rows, dim, use32 ? (void *)ids32 : (void *)ids64,
                                                 use32 ? CDF_I32 : CDF_I64, n),
                                 CDF_OK);
                float *got = from_dt(out, odt, (size_t)(n * dim));
                double ref[6 * 13];
                for (int i = 0; i < n; i++)
                    for (int j = 0; j < dim; j++) ref[i * dim + j] = tr[(use32 ? ids32[i] : ids64[i]) * dim + j];
                check_close("embedding", got, ref, (size_t)(n * dim), odt, 0, 0);
                free(out);
                free(got);
            }
        }
        free(tb);
        free(tr);
    }
    /* out-of-range ids are an error naming the id, and nothing is read out of bounds */
    float out[6 * 13];
    int64_t bad[3] = {1, 10, 2};
    cdf_clear_error();
    assert_int_equal(cdf_k_embedding(out, CDF_F32, table, CDF_F32, rows, dim, bad, CDF_I64, 3), CDF_ERR_INVALID_ARG);
    assert_non_null(strstr(cdf_last_error(), "id 10"));
    int32_t neg[2] = {0, -1};
    assert_int_equal(cdf_k_embedding(out, CDF_F32, table, CDF_F32, rows, dim, neg, CDF_I32, 2), CDF_ERR_INVALID_ARG);
    assert_non_null(strstr(cdf_last_error(), "id -1"));
    float fids[1] = {0};
    assert_int_equal(cdf_k_embedding(out, CDF_F32, table, CDF_F32, rows, dim, fids, CDF_F32, 1), CDF_ERR_DTYPE);
    free(table);
}

static void test_upsample_nearest(void **state) {
    (void)state;
    const int64_t nc = 3, h = 5, w = 7;
    const int64_t factors[3][2] = {{2, 2}, {3, 1}, {1, 1}};
    for (int fi = 0; fi < 3; fi++) {
        for (int di = 0; di < 2; di++) {
            cdf_dtype dt = FLOAT_DTS[di];
            const int64_t fh = factors[fi][0], fw = factors[fi][1], oh = h * fh, ow = w * fw;
            const size_t in_n = (size_t)(nc * h * w), out_n = (size_t)(nc * oh * ow);
            float *x = rnd(in_n, 9, 1.0f);
            round_to(x, in_n, dt);
            void *in = to_dt(x, in_n, dt);
            float *out = malloc(sizeof(float) * out_n);
            assert_int_equal(cdf_k_upsample_nearest(out, CDF_F32, in, dt, nc, h, w, fh, fw), CDF_OK);
            double *ref = malloc(sizeof(double) * out_n);
            for (int64_t p = 0; p < nc; p++)
                for (int64_t y = 0; y < oh; y++)
                    for (int64_t xx = 0; xx < ow; xx++)
                        ref[(p * oh + y) * ow + xx] = x[(p * h + y / fh) * w + xx / fw];
            check_close("upsample_nearest", out, ref, out_n, CDF_F32, 0, 0);
            free(x); free(in); free(out); free(ref);
        }
    }
}

/* ---- unary / binary ---------------------------------------------------------------------------- */

static double unary_ref(cdf_unary_op op, double x, double p0, double p1) {
    switch (op) {
    case CDF_UN_NEG: return -x;
    case CDF_UN_EXP: return exp(x);
    case CDF_UN_LOG: return log(x);
    case CDF_UN_SQRT: return sqrt(x);
    case CDF_UN_RSQRT: return 1.0 / sqrt(x);
    case CDF_UN_SQUARE: return x * x;
    case CDF_UN_ABS: return fabs(x);
    case CDF_UN_SIGMOID: return 1.0 / (1.0 + exp(-x));
    case CDF_UN_TANH: return tanh(x);
    case CDF_UN_SILU: return x / (1.0 + exp(-x));
    case CDF_UN_GELU_ERF: return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
    case CDF_UN_GELU_TANH: return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    case CDF_UN_QUICK_GELU: return x / (1.0 + exp(-1.702 * x));
    case CDF_UN_RELU: return x > 0 ? x : 0.0;
    case CDF_UN_SIN: return sin(x);
    case CDF_UN_COS: return cos(x);
    case CDF_UN_SCALE: return x * p0;
    case CDF_UN_ADD_SCALAR: return x + p0;
    case CDF_UN_AFFINE: return x * p0 + p1;
    case CDF_UN_CLAMP: return x < p0 ? p0 : (x > p1 ? p1 : x);
    case CDF_UN_POW: return pow(x, p0);
    default: return NAN;
    }
}

static void test_unary(void **state) {
    (void)state;
    const size_t sizes[] = {1, 17, 1000};
    for (int op = 0; op < CDF_UN_COUNT; op++) {
        const bool positive = op == CDF_UN_LOG || op == CDF_UN_SQRT || op == CDF_UN_RSQRT || op == CDF_UN_POW;
        const float p0 = op == CDF_UN_CLAMP ? -0.5f : (op == CDF_UN_POW ? 1.7f : 1.3f);
        const float p1 = op == CDF_UN_CLAMP ? 0.75f : -0.2f;
        for (int si = 0; si < 3; si++) {
            const size_t n = sizes[si];
            for (int di = 0; di < 3; di++) {
                cdf_dtype dt = FLOAT_DTS[di];
                float *x = rnd(n, 100 + (uint64_t)op, 4.0f);
                if (positive)
                    for (size_t i = 0; i < n; i++) x[i] = fabsf(x[i]) + 0.05f;
                round_to(x, n, dt);
                void *in = to_dt(x, n, dt);
                void *out = malloc(cdf_dtype_size(dt) * n);
                assert_int_equal(cdf_k_unary((cdf_unary_op)op, p0, p1, out, dt, in, dt, n), CDF_OK);
                float *got = from_dt(out, dt, n);
                double *ref = malloc(sizeof(double) * n);
                for (size_t i = 0; i < n; i++) ref[i] = unary_ref((cdf_unary_op)op, x[i], p0, p1);
                char what[64];
                snprintf(what, sizeof what, "unary op %d n %zu", op, n);
                /* f32 libm functions are accurate to a few ulp; composite formulas lose a few more
                 * near their zeros, hence the small absolute term */
                check_close(what, got, ref, n, dt, 2e-6, 4e-6);
                /* in place: out == in */
                assert_int_equal(cdf_k_unary((cdf_unary_op)op, p0, p1, in, dt, in, dt, n), CDF_OK);
                assert_memory_equal(in, out, cdf_dtype_size(dt) * n);
                free(x); free(in); free(out); free(got); free(ref);
            }
        }
    }
    /* mixed dtypes and the OpenMP path (n above the parallel threshold) */
    const size_t n = 70001;
    float *x = rnd(n, 77, 3.0f);
    round_to(x, n, CDF_BF16);
    void *in = to_dt(x, n, CDF_BF16);
    float *out = malloc(sizeof(float) * n);
    assert_int_equal(cdf_k_unary(CDF_UN_GELU_TANH, 0, 0, out, CDF_F32, in, CDF_BF16, n), CDF_OK);
    double *ref = malloc(sizeof(double) * n);
    for (size_t i = 0; i < n; i++) ref[i] = unary_ref(CDF_UN_GELU_TANH, x[i], 0, 0);
    check_close("unary gelu_tanh bf16->f32 large", out, ref, n, CDF_F32, 2e-6, 4e-6);
    /* NaN passes through relu and clamp (as torch) */
    float nan_in[2] = {NAN, -1.0f}, nan_out[2];
    assert_int_equal(cdf_k_unary(CDF_UN_RELU, 0, 0, nan_out, CDF_F32, nan_in, CDF_F32, 2), CDF_OK);
    assert_true(isnan(nan_out[0]) && nan_out[1] == 0.0f);
    assert_int_equal(cdf_k_unary(CDF_UN_CLAMP, -0.5f, 0.5f, nan_out, CDF_F32, nan_in, CDF_F32, 2), CDF_OK);
    assert_true(isnan(nan_out[0]) && nan_out[1] == -0.5f);
    assert_int_equal(cdf_k_unary(CDF_UN_COUNT, 0, 0, nan_out, CDF_F32, nan_in, CDF_F32, 2), CDF_ERR_INVALID_ARG);
    assert_int_equal(cdf_k_unary(CDF_UN_NEG, 0, 0, nan_out, CDF_I32, nan_in, CDF_F32, 2), CDF_ERR_DTYPE);
    free(x); free(in); free(out); free(ref);
}

static double binary_ref(cdf_binary_op op, double a, double b) {
    switch (op) {
    case CDF_BIN_ADD: return a + b;
    case CDF_BIN_SUB: return a - b;
    case CDF_BIN_MUL: return a * b;
    case CDF_BIN_DIV: return a / b;
    case CDF_BIN_MAX: return a > b ? a : b;
    case CDF_BIN_MIN: return a < b ? a : b;
    default: return NAN;
    }
}

static void test_binary(void **state) {
    (void)state;
    /* out [2, 3, 17]; a is stored transposed as [17, 3, 2] memory (non-contiguous);
     * b is [1, 3, 1] broadcast (strides 0 on dims 0 and 2), or a full [2, 3, 17] with padding */
    const int64_t shape[3] = {2, 3, 17};
    const size_t n = 2 * 3 * 17;
    const int64_t a_st[3] = {1, 2, 6};
    const int64_t b_bcast[3] = {0, 1, 0}, b_pad[3] = {3 * 20, 20, 1};
    for (int op = 0; op < CDF_BIN_COUNT; op++) {
        for (int di = 0; di < 3; di++) {
            for (int bc = 0; bc < 2; bc++) {
                cdf_dtype adt = FLOAT_DTS[di], bdt = FLOAT_DTS[(di + bc) % 3], odt = FLOAT_DTS[(di + 2 * bc) % 3];
                float *a = rnd(n, 200 + (uint64_t)op, 2.0f);
                float *b = rnd(2 * 3 * 20, 300 + (uint64_t)op, 2.0f);
                if (op == CDF_BIN_DIV)
                    for (size_t i = 0; i < 2 * 3 * 20; i++) b[i] = b[i] < 0 ? b[i] - 0.25f : b[i] + 0.25f;
                round_to(a, n, adt);
                round_to(b, 2 * 3 * 20, bdt);
                void *ab = to_dt(a, n, adt), *bb = to_dt(b, 2 * 3 * 20, bdt);
                const int64_t *b_st = bc ? b_bcast : b_pad;
                void *out = malloc(cdf_dtype_size(odt) * n);
                assert_int_equal(cdf_k_binary((cdf_binary_op)op, out, odt, ab, adt, a_st, bb, bdt, b_st, 3, shape),
                                 CDF_OK);
                float *got = from_dt(out, odt, n);
                double ref[2 * 3 * 17];
                for (int i = 0; i < 2; i++)
                    for (int j = 0; j < 3; j++)
                        for (int k = 0; k < 17; k++)
                            ref[(i * 3 + j) * 17 + k] =
                                binary_ref((cdf_binary_op)op, a[i * a_st[0] + j * a_st[1] + k * a_st[2]],
                                           b[i * b_st[0] + j * b_st[1] + k * b_st[2]]);
                char what[64];
                snprintf(what, sizeof what, "binary op %d broadcast %d", op, bc);
                check_close(what, got, ref, n, odt, 0, 1.01 * U32);
                free(a); free(b); free(ab); free(bb); free(out); free(got);
            }
        }
    }
    /* ndim 0 and the OpenMP path with a broadcast row vector: [400, 300] + [300] (b has 400) */
    float a0 = 1.5f, b0 = -4.0f, o0 = 0;
    assert_int_equal(cdf_k_binary(CDF_BIN_MUL, &o0, CDF_F32, &a0, CDF_F32, NULL, &b0, CDF_F32, NULL, 0, NULL), CDF_OK);
    assert_true(o0 == -6.0f);
    const size_t big = 400 * 300;
    float *a = rnd(big, 8, 1.0f), *b = rnd(400, 9, 1.0f), *o = malloc(sizeof(float) * big);
    const int64_t bshape[2] = {400, 300}, ast[2] = {300, 1}, bst[2] = {0, 1};
    assert_int_equal(cdf_k_binary(CDF_BIN_ADD, o, CDF_F32, a, CDF_F32, ast, b, CDF_F32, bst, 2, bshape), CDF_OK);
    for (size_t i = 0; i < big; i++) assert_true(o[i] == a[i] + b[i % 300]);
    /* a column vector (inner stride 0): [400, 300] * [400, 1] */
    const int64_t cst[2] = {1, 0};
    assert_int_equal(cdf_k_binary(CDF_BIN_MUL, o, CDF_F32, a, CDF_F32, ast, b, CDF_F32, cst, 2, bshape), CDF_OK);
    for (size_t i = 0; i < big; i++) assert_true(o[i] == a[i] * b[i / 300]);
    /* maximum/minimum propagate NaN like torch */
    float an[2] = {NAN, 1.0f}, bn[2] = {0.0f, NAN}, on[2];
    const int64_t s1[1] = {1}, n2[1] = {2};
    assert_int_equal(cdf_k_binary(CDF_BIN_MAX, on, CDF_F32, an, CDF_F32, s1, bn, CDF_F32, s1, 1, n2), CDF_OK);
    assert_true(isnan(on[0]) && isnan(on[1]));
    assert_int_equal(cdf_k_binary(CDF_BIN_MIN, on, CDF_F32, an, CDF_F32, s1, bn, CDF_F32, s1, 1, n2), CDF_OK);
    assert_true(isnan(on[0]) && isnan(on[1]));
    free(a); free(b); free(o);
}

/* ---- matmul ---------------------------------------------------------------------------------- */

typedef struct {
    int64_t batch, M, N, K;
    bool ta, tb;
    int64_t pad; /* extra elements per row (lda/ldb/ldc = row length + pad) */
    bool bcast_b; /* sb = 0 */
    bool bias;
    float alpha, beta;
    cdf_dtype adt, bdt, cdt;
} mm_case;

static void run_matmul_case(const mm_case *c) {
    const int64_t a_rows = c->ta ? c->K : c->M, a_cols = c->ta ? c->M : c->K;
    const int64_t b_rows = c->tb ? c->N : c->K, b_cols = c->tb ? c->K : c->N;
    const int64_t lda = a_cols + c->pad, ldb = b_cols + c->pad, ldc = c->N + c->pad;
    const int64_t sa = a_rows * lda + 1, sb = c->bcast_b ? 0 : b_rows * ldb + 2, sc = c->M * ldc + 3;
    const size_t an = (size_t)(sa * c->batch), bn = (size_t)(c->bcast_b ? b_rows * ldb : sb * c->batch),
                 cn = (size_t)(sc * c->batch);
    float *a = rnd(an, 1000 + (uint64_t)(c->M * 7 + c->K), 1.0f);
    float *b = rnd(bn, 2000 + (uint64_t)(c->N * 5 + c->K), 1.0f);
    float *bias = rnd((size_t)c->N, 3000, 1.0f);
    float *c0 = rnd(cn, 4000, 1.0f);
    round_to(a, an, c->adt);
    round_to(b, bn, c->bdt);
    round_to(bias, (size_t)c->N, c->bdt);
    round_to(c0, cn, c->cdt);
    if (c->beta == 0.0f) /* with beta 0 the old contents of C must be ignored, even NaN */
        for (size_t i = 0; i < cn; i++) c0[i] = NAN;
    void *ab = to_dt(a, an, c->adt), *bb = to_dt(b, bn, c->bdt), *biasb = to_dt(bias, (size_t)c->N, c->bdt);
    void *cb = to_dt(c0, cn, c->cdt);
    cdf_k_matmul_args x = {
        .batch = c->batch, .M = c->M, .N = c->N, .K = c->K,
        .a = ab, .a_dt = c->adt, .lda = lda, .sa = sa, .trans_a = c->ta,
        .b = bb, .b_dt = c->bdt, .ldb = ldb, .sb = sb, .trans_b = c->tb,
        .bias = c->bias ? biasb : NULL, .bias_dt = c->bdt,
        .c = cb, .c_dt = c->cdt, .ldc = ldc, .sc = sc,
        .alpha = c->alpha, .beta = c->beta,
    };
    assert_int_equal(cdf_k_matmul(&x), CDF_OK);
    float *got_all = from_dt(cb, c->cdt, cn);
    const size_t out_n = (size_t)(c->batch * c->M * c->N);
    double *ref = malloc(sizeof(double) * out_n), *mag = malloc(sizeof(double) * out_n);
    float *got = malloc(sizeof(float) * out_n);
    for (int64_t bi = 0; bi < c->batch; bi++) {
        for (int64_t i = 0; i < c->M; i++) {
            for (int64_t j = 0; j < c->N; j++) {
                double s = 0, m = 0;
                for (int64_t p = 0; p < c->K; p++) {
                    double av = a[bi * sa + (c->ta ? p * lda + i : i * lda + p)];
                    double bv = b[bi * sb + (c->tb ? j * ldb + p : p * ldb + j)];
                    s += av * bv;
                    m += fabs(av * bv);
                }
                double r = c->alpha * s, mg = fabs(c->alpha) * m;
                if (c->bias) { r += bias[j]; mg += fabs(bias[j]); }
                if (c->beta != 0.0f) { r += c0[bi * sc + i * ldc + j]; mg += fabs(c0[bi * sc + i * ldc + j]); }
                size_t o = (size_t)((bi * c->M + i) * c->N + j);
                ref[o] = r;
                mag[o] = mg;
                got[o] = got_all[bi * sc + i * ldc + j];
            }
        }
    }
    /* any f32 summation order of K products (+ bias + C) is within (K + 3) u sum|terms|; the
     * kernel may fold alpha into A (one more rounding per product): K + 5 */
    char what[160];
    snprintf(what, sizeof what, "matmul b%lld M%lld N%lld K%lld ta%d tb%d pad%lld bcast%d bias%d alpha%g beta%g %s/%s",
             (long long)c->batch, (long long)c->M, (long long)c->N, (long long)c->K, c->ta, c->tb, (long long)c->pad,
             c->bcast_b, c->bias, (double)c->alpha, (double)c->beta, cdf_dtype_name(c->adt), cdf_dtype_name(c->bdt));
    check_close_mag(what, got, ref, mag, out_n, c->cdt, 1e-30, (double)(c->K + 5) * U32);
    /* padding between rows / matrices of C is never written */
    for (int64_t bi = 0; bi < c->batch; bi++) {
        for (int64_t i = 0; i < c->M; i++)
            for (int64_t j = c->N; j < ldc; j++) {
                size_t o = (size_t)(bi * sc + i * ldc + j);
                assert_true(isnan(c0[o]) ? isnan(got_all[o]) : got_all[o] == c0[o]);
            }
    }
    free(a); free(b); free(bias); free(c0); free(ab); free(bb); free(biasb); free(cb);
    free(got_all); free(ref); free(mag); free(got);
}

static void test_matmul_shapes_and_flags(void **state) {
    (void)state;
    /* ragged sizes around the blocking: MR 4, NR 8, KC 256, NCW 512, MT 64, NT 128 */
    const int64_t sizes[][3] = {{1, 1, 1}, {3, 17, 5}, {17, 65, 129}, {65, 3, 300}, {5, 530, 7}, {130, 70, 33}};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        for (int t = 0; t < 4; t++) {
            mm_case c = {.batch = 1, .M = sizes[s][0], .N = sizes[s][1], .K = sizes[s][2], .ta = t & 1,
                         .tb = (t >> 1) & 1, .pad = (t == 3) ? 3 : 0, .bias = (s + t) % 2 == 0, .alpha = 1.0f,
                         .beta = 0.0f, .adt = CDF_F32, .bdt = CDF_F32, .cdt = CDF_F32};
            run_matmul_case(&c);
        }
    }
}

static void test_matmul_batch_dtypes(void **state) {
    (void)state;
    /* batches with broadcast B (weights), alpha, beta = 1, padding, all dtype mixes */
    for (int di = 0; di < 3; di++) {
        for (int mix = 0; mix < 2; mix++) {
            cdf_dtype dt = FLOAT_DTS[di];
            mm_case c = {.batch = 3, .M = 19, .N = 33, .K = 70, .ta = mix, .tb = !mix, .pad = 2, .bcast_b = true,
                         .bias = true, .alpha = 0.5f, .beta = 1.0f, .adt = mix ? CDF_F32 : dt, .bdt = dt,
                         .cdt = mix ? dt : CDF_F32};
            run_matmul_case(&c);
            c.bcast_b = false;
            c.beta = 0.0f;
            c.alpha = -1.25f;
            c.cdt = dt;
            run_matmul_case(&c);
        }
    }
    /* many small matrices: the batch-parallel path (omp threads set to 4 in main) */
    mm_case many = {.batch = 8, .M = 16, .N = 20, .K = 40, .tb = true, .bias = true, .alpha = 1.0f, .beta = 0.0f,
                    .adt = CDF_F32, .bdt = CDF_BF16, .cdt = CDF_BF16};
    run_matmul_case(&many);
    many.cdt = CDF_F32;
    many.bcast_b = true;
    many.beta = 1.0f;
    run_matmul_case(&many);
    /* K = 0: C = bias (+ C) */
    mm_case k0 = {.batch = 2, .M = 3, .N = 5, .K = 0, .bias = true, .alpha = 1.0f, .beta = 1.0f,
                  .adt = CDF_F32, .bdt = CDF_F32, .cdt = CDF_F32};
    run_matmul_case(&k0);
    /* a large one for the threaded tiles: 200 x 600 x 300 */
    mm_case big = {.batch = 1, .M = 200, .N = 600, .K = 300, .tb = true, .bias = true, .alpha = 1.0f, .beta = 0.0f,
                   .adt = CDF_F32, .bdt = CDF_F32, .cdt = CDF_F32};
    run_matmul_case(&big);
}

/* Matmul on Q8_0 blocks (cdf_k_matmul_q) over a layer larger than one decode panel (bound set to
 * 32 MiB: N = 4100 rows of K = 4096 is three f32 or two bf16 panels), f32 and bf16 decoding, called again with
 * a smaller and a larger layer (the cached panel buffer is reused, then replaced). Every value
 * is a small multiple of 1/8 so every product and partial sum is exact in f32: the result must
 * equal the integer reference exactly, whatever the kernel's summation order. */
static void run_matmul_q8(int64_t M, int64_t N, int64_t K, cdf_dtype w_dt) {
    const int64_t nb = K / 32;
    uint8_t *w = malloc((size_t)(N * nb * 34));
    float *a = malloc(sizeof(float) * (size_t)(M * K)), *bias = malloc(sizeof(float) * (size_t)N);
    float *c = malloc(sizeof(float) * (size_t)(M * N));
    assert_non_null(w), assert_non_null(a), assert_non_null(bias), assert_non_null(c);
    uint32_t x = 12345u + (uint32_t)N;
#define NEXT() (x = x * 1664525u + 1013904223u, (int)(x >> 24))
    for (int64_t i = 0; i < N * nb; i++) {
        uint8_t *blk = w + i * 34;
        blk[0] = 0x00, blk[1] = 0x38; /* f16 0.5 */
        for (int j = 0; j < 32; j++) blk[2 + j] = (uint8_t)(int8_t)(NEXT() % 255 - 127);
    }
    for (int64_t i = 0; i < M * K; i++) a[i] = (float)(NEXT() % 17 - 8) * 0.25f;
    for (int64_t n = 0; n < N; n++) bias[n] = (float)(NEXT() % 9 - 4);
    cdf_k_matmul_q_args args = {.M = M, .N = N, .K = K, .a = a, .a_dt = CDF_F32, .w = w, .qtype = CDF_GGML_Q8_0,
                                .w_dt = w_dt, .bias = bias, .bias_dt = CDF_F32, .c = c, .c_dt = CDF_F32};
    assert_int_equal(cdf_k_matmul_q(&args), CDF_OK);
    int64_t wrong = 0;
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double ref = bias[n];
            for (int64_t k = 0; k < K; k++)
                ref += (double)a[m * K + k] * 0.5 * (double)(int8_t)w[(n * nb + k / 32) * 34 + 2 + k % 32];
            if ((double)c[m * N + n] != ref && wrong++ < 3)
                print_error("w %s: c[%lld, %lld] = %.9g, expected %.9g\n", cdf_dtype_name(w_dt), (long long)m, (long long)n,
                            (double)c[m * N + n], ref);
        }
#undef NEXT
    assert_int_equal(wrong, 0);
    free(w), free(a), free(bias), free(c);
}

static void test_matmul_quantized_panels(void **state) {
    (void)state;
    cdf_k_fast_stats f0, f1;
    cdf_k_gemm_bf16w_stats g0, g1;
    cdf_k_fast_get_stats(&f0);
    cdf_k_gemm_bf16w_get_stats(&g0);
    cdf_k_matmul_q_set_int8(0); /* the panels' exact numbers: not the int8 GEMM's quantized A */
    cdf_k_matmul_q_set_panel_bytes((size_t)32 << 20); /* 8 Mi f32 / 16 Mi bf16 values a panel */
    run_matmul_q8(3, 4100, 4096, CDF_F32);
    run_matmul_q8(2, 64, 256, CDF_BF16);  /* smaller: the cached buffer serves it */
    run_matmul_q8(3, 4100, 4096, CDF_BF16);
    run_matmul_q8(1100, 64, 256, CDF_BF16); /* rows enough for oneDNN's per-call reorder of B */
    cdf_k_matmul_q_set_panel_bytes(0);
    run_matmul_q8(3, 4100, 4096, CDF_BF16); /* one panel at the default bound */
    /* the decode panel is overwritten by the next panel: it is never kept prepacked */
    cdf_k_fast_get_stats(&f1);
    cdf_k_gemm_bf16w_get_stats(&g1);
    assert_int_equal(f1.packs, f0.packs);
    assert_int_equal(g1.packs, g0.packs);
    cdf_k_matmul_q_set_int8(-1);
}

static void test_matmul_errors(void **state) {
    (void)state;
    float a[4] = {0}, b[4] = {0}, c[4] = {0};
    cdf_k_matmul_args x = {.batch = 1, .M = 2, .N = 2, .K = 2, .a = a, .a_dt = CDF_F32, .lda = 2, .b = b,
                           .b_dt = CDF_F32, .ldb = 2, .c = c, .c_dt = CDF_F32, .ldc = 2, .alpha = 1, .beta = 0.5f};
    assert_int_equal(cdf_k_matmul(&x), CDF_ERR_INVALID_ARG);
    assert_non_null(strstr(cdf_last_error(), "beta"));
    x.beta = 0;
    x.lda = 1;
    assert_int_equal(cdf_k_matmul(&x), CDF_ERR_INVALID_ARG);
    x.lda = 2;
    x.a_dt = CDF_I64;
    assert_int_equal(cdf_k_matmul(&x), CDF_ERR_DTYPE);
    x.a_dt = CDF_F32;
    x.M = -1;
    assert_int_equal(cdf_k_matmul(&x), CDF_ERR_INVALID_ARG);
    assert_int_equal(cdf_k_matmul(NULL), CDF_ERR_INVALID_ARG);
}

/* ---- softmax / norms / reductions ---------------------------------------------------------------- */

static void test_softmax(void **state) {
    (void)state;
    const int64_t cols_list[] = {1, 3, 17, 129, 1500};
    for (int ci = 0; ci < 5; ci++) {
        for (int di = 0; di < 3; di++) {
            cdf_dtype dt = FLOAT_DTS[di];
            const int64_t rows = 7, cols = cols_list[ci]; /* 7 x 1500 takes the OpenMP path */
            const size_t n = (size_t)(rows * cols);
            const float scale = 0.37f;
            float *x = rnd(n, 500 + (uint64_t)cols, 8.0f);
            /* row 1: some -inf; row 2: all -inf (zeros, see kernel comment) */
            for (int64_t j = 0; j < cols; j += 2) x[cols + j] = -INFINITY;
            for (int64_t j = 0; j < cols; j++) x[2 * cols + j] = -INFINITY;
            round_to(x, n, dt);
            void *in = to_dt(x, n, dt);
            void *out = malloc(cdf_dtype_size(dt) * n);
            assert_int_equal(cdf_k_softmax(out, dt, in, dt, rows, cols, scale), CDF_OK);
            float *got = from_dt(out, dt, n);
            double *ref = malloc(sizeof(double) * n);
            for (int64_t r = 0; r < rows; r++) {
                double m = -INFINITY, s = 0;
                for (int64_t j = 0; j < cols; j++) m = fmax(m, (double)x[r * cols + j] * scale);
                for (int64_t j = 0; j < cols; j++) s += isinf(x[r * cols + j]) ? 0 : exp((double)x[r * cols + j] * scale - m);
                for (int64_t j = 0; j < cols; j++)
                    ref[r * cols + j] = (m == -INFINITY || isinf(x[r * cols + j])) ? 0.0
                                                                                 : exp((double)x[r * cols + j] * scale - m) / s;
            }
            /* the exponent's argument carries ~|x scale| u of error */
            check_close("softmax", got, ref, n, dt, 1e-9, 4e-6);
            free(x); free(in); free(out); free(got); free(ref);
        }
    }
}

static void test_layer_rms_norm(void **state) {
    (void)state;
    const int64_t cols_list[] = {1, 17, 65, 2100};
    for (int ci = 0; ci < 4; ci++) {
        for (int di = 0; di < 3; di++) {
            for (int affine = 0; affine < 3; affine++) { /* 0: none, 1: weight only, 2: weight + bias */
                cdf_dtype dt = FLOAT_DTS[di], wdt = FLOAT_DTS[(di + 1) % 3];
                const int64_t rows = 5, cols = cols_list[ci]; /* 5 x 2100 takes the OpenMP path */
                const size_t n = (size_t)(rows * cols);
                const float eps = 1e-5f;
                float *x = rnd(n, 600 + (uint64_t)cols, 2.0f);
                /* a large offset: a one-pass E[x^2] - E[x]^2 variance would lose ~15 bits here */
                for (size_t i = 0; i < n; i++) x[i] += 100.0f;
                float *w = rnd((size_t)cols, 601, 1.0f), *b = rnd((size_t)cols, 602, 1.0f);
                round_to(x, n, dt);
                round_to(w, (size_t)cols, wdt);
                round_to(b, (size_t)cols, wdt);
                void *in = to_dt(x, n, dt), *wb = to_dt(w, (size_t)cols, wdt), *bb = to_dt(b, (size_t)cols, wdt);
                void *out = malloc(cdf_dtype_size(dt) * n);
                double *ref = malloc(sizeof(double) * n), *mag = malloc(sizeof(double) * n);

                /* layer norm */
                assert_int_equal(cdf_k_layer_norm(out, dt, in, dt, rows, cols, eps, affine ? wb : NULL,
                                                  affine == 2 ? bb : NULL, wdt),
                                 CDF_OK);
                float *got = from_dt(out, dt, n);
                for (int64_t r = 0; r < rows; r++) {
                    double mean = 0, var = 0;
                    for (int64_t j = 0; j < cols; j++) mean += x[r * cols + j];
                    mean /= (double)cols;
                    for (int64_t j = 0; j < cols; j++) var += (x[r * cols + j] - mean) * (x[r * cols + j] - mean);
                    var /= (double)cols;
                    double rstd = 1.0 / sqrt(var + eps);
                    for (int64_t j = 0; j < cols; j++) {
                        double y = (x[r * cols + j] - mean) * rstd;
                        double m = fabs(y) + fabs(mean) * rstd; /* x - mean cancels: error ~ u |mean| */
                        if (affine) { y *= w[j]; m *= fabs(w[j]); }
                        if (affine == 2) { y += b[j]; m += fabs(b[j]); }
                        ref[r * cols + j] = y;
                        mag[r * cols + j] = m;
                    }
                }
                check_close_mag("layer_norm", got, ref, mag, n, dt, 1e-7, 2e-6);
                free(got);

                /* RMS norm */
                assert_int_equal(cdf_k_rms_norm(out, dt, in, dt, rows, cols, eps, affine ? wb : NULL, wdt), CDF_OK);
                got = from_dt(out, dt, n);
                for (int64_t r = 0; r < rows; r++) {
                    double ms = 0;
                    for (int64_t j = 0; j < cols; j++) ms += (double)x[r * cols + j] * x[r * cols + j];
                    ms /= (double)cols;
                    double rs = 1.0 / sqrt(ms + eps);
                    for (int64_t j = 0; j < cols; j++) ref[r * cols + j] = x[r * cols + j] * rs * (affine ? w[j] : 1.0);
                }
                check_close("rms_norm", got, ref, n, dt, 1e-7, 2e-6);
                free(got);
                free(x); free(w); free(b); free(in); free(wb); free(bb); free(out); free(ref); free(mag);
            }
        }
    }
}

static void test_group_norm(void **state) {
    (void)state;
    const int64_t cfg[][4] = {/* n, c, s, groups */ {2, 6, 17, 3}, {1, 32, 9, 32}, {2, 4, 1300, 2}, {3, 5, 1, 1}};
    for (int ci = 0; ci < 4; ci++) {
        for (int di = 0; di < 3; di++) {
            for (int affine = 0; affine < 2; affine++) {
                cdf_dtype dt = FLOAT_DTS[di];
                const int64_t N = cfg[ci][0], C = cfg[ci][1], S = cfg[ci][2], G = cfg[ci][3];
                const size_t n = (size_t)(N * C * S);
                const float eps = 1e-6f;
                float *x = rnd(n, 700 + (uint64_t)ci, 2.0f), *w = rnd((size_t)C, 701, 1.0f), *b = rnd((size_t)C, 702, 1.0f);
                for (size_t i = 0; i < n; i++) x[i] -= 40.0f; /* offset: tests the two-pass variance */
                round_to(x, n, dt);
                round_to(w, (size_t)C, CDF_F32);
                void *in = to_dt(x, n, dt);
                void *out = malloc(cdf_dtype_size(dt) * n);
                assert_int_equal(cdf_k_group_norm(out, dt, in, dt, N, C, S, G, eps, affine ? w : NULL, affine ? b : NULL,
                                                  CDF_F32),
                                 CDF_OK);
                float *got = from_dt(out, dt, n);
                double *ref = malloc(sizeof(double) * n), *mag = malloc(sizeof(double) * n);
                const int64_t cpg = C / G;
                for (int64_t in_ = 0; in_ < N; in_++) {
                    for (int64_t g = 0; g < G; g++) {
                        double mean = 0, var = 0;
                        for (int64_t c = g * cpg; c < (g + 1) * cpg; c++)
                            for (int64_t s = 0; s < S; s++) mean += x[(in_ * C + c) * S + s];
                        mean /= (double)(cpg * S);
                        for (int64_t c = g * cpg; c < (g + 1) * cpg; c++)
                            for (int64_t s = 0; s < S; s++) {
                                double d = x[(in_ * C + c) * S + s] - mean;
                                var += d * d;
                            }
                        var /= (double)(cpg * S);
                        double rstd = 1.0 / sqrt(var + eps);
                        for (int64_t c = g * cpg; c < (g + 1) * cpg; c++)
                            for (int64_t s = 0; s < S; s++) {
                                size_t o = (size_t)((in_ * C + c) * S + s);
                                double y = (x[o] - mean) * rstd, m = fabs(y) + fabs(mean) * rstd;
                                if (affine) { y = y * w[c] + b[c]; m = m * fabs(w[c]) + fabs(b[c]); }
                                ref[o] = y;
                                mag[o] = m;
                            }
                    }
                }
                check_close_mag("group_norm", got, ref, mag, n, dt, 1e-7, 2e-6);
                free(x); free(w); free(b); free(in); free(out); free(got); free(ref); free(mag);
            }
        }
    }
    float dummy[6];
    assert_int_equal(cdf_k_group_norm(dummy, CDF_F32, dummy, CDF_F32, 1, 6, 1, 4, 1e-5f, NULL, NULL, CDF_F32),
                     CDF_ERR_INVALID_ARG);
}

static void test_reduce(void **state) {
    (void)state;
    const int64_t cfg[][3] = {/* outer, red, inner */ {3, 1, 1}, {3, 17, 1}, {4, 2500, 1}, {3, 17, 5}, {1, 129, 65}};
    for (int ci = 0; ci < 5; ci++) {
        for (int op = CDF_RED_SUM; op <= CDF_RED_MIN; op++) {
            for (int di = 0; di < 3; di++) {
                cdf_dtype dt = FLOAT_DTS[di];
                const int64_t O = cfg[ci][0], R = cfg[ci][1], I = cfg[ci][2];
                const size_t n = (size_t)(O * R * I), on = (size_t)(O * I);
                float *x = rnd(n, 800 + (uint64_t)ci, 1.0f);
                for (size_t i = 0; i < n; i++) x[i] += 0.5f;
                round_to(x, n, dt);
                void *in = to_dt(x, n, dt);
                void *out = malloc(cdf_dtype_size(dt) * on);
                assert_int_equal(cdf_k_reduce((cdf_reduce_op)op, out, dt, in, dt, O, R, I), CDF_OK);
                float *got = from_dt(out, dt, on);
                double *ref = malloc(sizeof(double) * on), *mag = malloc(sizeof(double) * on);
                for (int64_t o = 0; o < O; o++) {
                    for (int64_t i = 0; i < I; i++) {
                        double s = 0, sa = 0, mx = -INFINITY, mn = INFINITY;
                        for (int64_t r = 0; r < R; r++) {
                            double v = x[(o * R + r) * I + i];
                            s += v; sa += fabs(v); mx = fmax(mx, v); mn = fmin(mn, v);
                        }
                        double mean = s / (double)R, var = 0;
                        for (int64_t r = 0; r < R; r++) {
                            double d = x[(o * R + r) * I + i] - mean;
                            var += d * d;
                        }
                        var /= (double)R;
                        double v, m;
                        switch (op) {
                        case CDF_RED_SUM: v = s; m = sa; break;
                        case CDF_RED_MEAN: v = mean; m = sa / (double)R; break;
                        case CDF_RED_VAR: v = var; m = var; break; /* sum of positive terms; mean errors cancel to first order */
                        case CDF_RED_MAX: v = mx; m = fabs(mx); break;
                        default: v = mn; m = fabs(mn); break;
                        }
                        ref[o * I + i] = v;
                        mag[o * I + i] = m;
                    }
                }
                /* cascaded f32 sums: error ~ log2(R) u * sum|x| (generous factor 16) */
                char what[64];
                snprintf(what, sizeof what, "reduce op %d cfg %d", op, ci);
                check_close_mag(what, got, ref, mag, on, dt, 1e-9, 16.0 * (log2((double)R) + 2.0) * U32);
                free(x); free(in); free(out); free(got); free(ref); free(mag);
            }
        }
    }
    float z[2] = {1, 2}, o[2];
    assert_int_equal(cdf_k_reduce(CDF_RED_SUM, o, CDF_F32, z, CDF_F32, 2, 0, 1), CDF_OK);
    assert_true(o[0] == 0.0f && o[1] == 0.0f);
    assert_int_equal(cdf_k_reduce(CDF_RED_MAX, o, CDF_F32, z, CDF_F32, 2, 0, 1), CDF_ERR_INVALID_ARG);
}

/* argmax: the first index of the maximum, any numeric input, exact; NaN wins (its first one) */
static void test_reduce_argmax(void **state) {
    (void)state;
    /* [outer 2, red 6, inner 3] of i64 with ties and values above 2^53's float resolution */
    const int64_t O = 2, R = 6, I = 3;
    int64_t x[36];
    for (int64_t k = 0; k < 36; k++) x[k] = (k * 7919) % 13 - 6;
    x[(0 * R + 2) * I + 1] = (INT64_C(1) << 60);     /* equal to the next one in double */
    x[(0 * R + 4) * I + 1] = (INT64_C(1) << 60) + 1; /* the largest: (o 0, i 1) -> r 4 */
    int64_t out[6], want[6];
    assert_int_equal(cdf_k_reduce(CDF_RED_ARGMAX, out, CDF_I64, x, CDF_I64, O, R, I), CDF_OK);
    for (int64_t o = 0; o < O; o++)
        for (int64_t i = 0; i < I; i++) {
            int64_t b = 0;
            for (int64_t r = 1; r < R; r++)
                if (x[(o * R + r) * I + i] > x[(o * R + b) * I + i]) b = r;
            want[o * I + i] = b;
        }
    /* 2^60 and 2^60 + 1 are the same double: only an exact compare gets r 4 */
    assert_int_equal(want[1], 4);
    assert_memory_equal(out, want, sizeof want);
    /* f32 with a tie (first wins) and a NaN (the NaN's index wins) */
    float f[5] = {1.0f, 3.0f, -2.0f, 3.0f, 0.5f}, g[5] = {1.0f, 3.0f, NAN, 9.0f, NAN};
    int64_t a;
    assert_int_equal(cdf_k_reduce(CDF_RED_ARGMAX, &a, CDF_I64, f, CDF_F32, 1, 5, 1), CDF_OK);
    assert_int_equal(a, 1);
    assert_int_equal(cdf_k_reduce(CDF_RED_ARGMAX, &a, CDF_I64, g, CDF_F32, 1, 5, 1), CDF_OK);
    assert_int_equal(a, 2);
    /* bf16 and i32 inputs */
    uint16_t h[3] = {cdf_f32_to_bf16(-1.0f), cdf_f32_to_bf16(-0.5f), cdf_f32_to_bf16(-0.75f)};
    assert_int_equal(cdf_k_reduce(CDF_RED_ARGMAX, &a, CDF_I64, h, CDF_BF16, 1, 3, 1), CDF_OK);
    assert_int_equal(a, 1);
    int32_t i32[4] = {-5, 49407, 12, 49407};
    assert_int_equal(cdf_k_reduce(CDF_RED_ARGMAX, &a, CDF_I64, i32, CDF_I32, 1, 4, 1), CDF_OK);
    assert_int_equal(a, 1);
    /* errors: a non-i64 output, an empty reduction */
    float fo;
    assert_int_equal(cdf_k_reduce(CDF_RED_ARGMAX, &fo, CDF_F32, f, CDF_F32, 1, 5, 1), CDF_ERR_DTYPE);
    assert_int_equal(cdf_k_reduce(CDF_RED_ARGMAX, &a, CDF_I64, f, CDF_F32, 1, 0, 1), CDF_ERR_INVALID_ARG);
}

/* ---- conv2d -------------------------------------------------------------------------------------- */

static void test_conv2d(void **state) {
    (void)state;
    /* n, cin, h, w, cout, kh, kw, sh, sw, ph, pw, dh, dw, groups */
    const int64_t cfg[][14] = {
        {2, 3, 9, 11, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1},  /* 3x3 same */
        {1, 3, 9, 11, 5, 3, 3, 2, 2, 1, 1, 1, 1, 1},  /* stride 2, padding 1 (VAE downsample-like) */
        {1, 4, 8, 7, 6, 3, 3, 1, 1, 1, 1, 1, 1, 2},   /* groups 2 */
        {1, 5, 6, 6, 5, 3, 3, 1, 1, 1, 1, 1, 1, 5},   /* depthwise */
        {1, 2, 10, 9, 3, 3, 3, 1, 1, 2, 2, 2, 2, 1},  /* dilation 2 */
        {1, 16, 8, 8, 7, 1, 1, 1, 1, 0, 0, 1, 1, 1},  /* 1x1 */
        {1, 16, 8, 8, 8, 2, 2, 2, 2, 0, 0, 1, 1, 1},  /* 2x2 stride 2 (SD3 patchify) */
        {2, 3, 7, 5, 2, 3, 1, 1, 2, 1, 0, 1, 1, 1},   /* 3x1 kernel, mixed strides, asymmetric padding */
        {1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1},   /* 1x1x1 */
        {1, 2, 5, 5, 3, 3, 3, 3, 3, 2, 2, 1, 1, 1},   /* stride larger than the overlap, big padding */
    };
    for (size_t ci = 0; ci < sizeof cfg / sizeof cfg[0]; ci++) {
        for (int di = 0; di < 3; di++) {
            const int64_t *p = cfg[ci];
            cdf_k_conv2d_args a = {.n = p[0], .cin = p[1], .h = p[2], .w = p[3], .cout = p[4], .kh = p[5], .kw = p[6],
                                   .stride_h = p[7], .stride_w = p[8], .pad_h = p[9], .pad_w = p[10], .dil_h = p[11],
                                   .dil_w = p[12], .groups = p[13]};
            cdf_dtype dt = FLOAT_DTS[di];
            const int64_t cin_g = a.cin / a.groups, cout_g = a.cout / a.groups;
            const int64_t oh = (a.h + 2 * a.pad_h - a.dil_h * (a.kh - 1) - 1) / a.stride_h + 1;
            const int64_t ow = (a.w + 2 * a.pad_w - a.dil_w * (a.kw - 1) - 1) / a.stride_w + 1;
            const size_t xn = (size_t)(a.n * a.cin * a.h * a.w), wn = (size_t)(a.cout * cin_g * a.kh * a.kw);
            const size_t on = (size_t)(a.n * a.cout * oh * ow);
            float *x = rnd(xn, 900 + ci, 1.0f), *w = rnd(wn, 901 + ci, 1.0f), *b = rnd((size_t)a.cout, 902, 1.0f);
            const bool with_bias = ci % 3 != 1;
            round_to(x, xn, dt);
            round_to(w, wn, dt);
            round_to(b, (size_t)a.cout, dt);
            void *xb = to_dt(x, xn, dt), *wb = to_dt(w, wn, dt), *bb = to_dt(b, (size_t)a.cout, dt);
            void *ob = malloc(cdf_dtype_size(dt) * on);
            a.x = xb; a.x_dt = dt;
            a.weight = wb; a.w_dt = dt;
            a.bias = with_bias ? bb : NULL; a.b_dt = dt;
            a.out = ob; a.out_dt = dt;
            assert_int_equal(cdf_k_conv2d(&a), CDF_OK);
            float *got = from_dt(ob, dt, on);
            double *ref = malloc(sizeof(double) * on), *mag = malloc(sizeof(double) * on);
            for (int64_t n = 0; n < a.n; n++)
                for (int64_t co = 0; co < a.cout; co++)
                    for (int64_t y = 0; y < oh; y++)
                        for (int64_t xx = 0; xx < ow; xx++) {
                            double s = with_bias ? b[co] : 0.0, m = with_bias ? fabs(b[co]) : 0.0;
                            const int64_t g = co / cout_g;
                            for (int64_t ci2 = 0; ci2 < cin_g; ci2++)
                                for (int64_t ky = 0; ky < a.kh; ky++)
                                    for (int64_t kx = 0; kx < a.kw; kx++) {
                                        int64_t iy = y * a.stride_h - a.pad_h + ky * a.dil_h;
                                        int64_t ix = xx * a.stride_w - a.pad_w + kx * a.dil_w;
                                        if (iy < 0 || iy >= a.h || ix < 0 || ix >= a.w) continue;
                                        double t = (double)x[((n * a.cin + g * cin_g + ci2) * a.h + iy) * a.w + ix] *
                                                   w[((co * cin_g + ci2) * a.kh + ky) * a.kw + kx];
                                        s += t;
                                        m += fabs(t);
                                    }
                            size_t o = (size_t)(((n * a.cout + co) * oh + y) * ow + xx);
                            ref[o] = s;
                            mag[o] = m;
                        }
            char what[64];
            snprintf(what, sizeof what, "conv2d case %zu", ci);
            check_close_mag(what, got, ref, mag, on, dt, 1e-30, (double)(cin_g * a.kh * a.kw + 2) * U32);
            free(x); free(w); free(b); free(xb); free(wb); free(bb); free(ob); free(got); free(ref); free(mag);
        }
    }
    float dummy[16] = {0};
    cdf_k_conv2d_args bad = {.n = 1, .cin = 3, .h = 2, .w = 2, .cout = 2, .kh = 1, .kw = 1, .stride_h = 1,
                             .stride_w = 1, .dil_h = 1, .dil_w = 1, .groups = 2, .x = dummy, .weight = dummy,
                             .out = dummy};
    assert_int_equal(cdf_k_conv2d(&bad), CDF_ERR_INVALID_ARG);
    bad.groups = 1;
    bad.kh = 5;
    assert_int_equal(cdf_k_conv2d(&bad), CDF_ERR_SHAPE);
}

/* ---- attention ---------------------------------------------------------------------------------- */

typedef struct {
    int64_t b, h, lq, lk, d, dv;
    int mask; /* 0 none, 1 key-padding mask [B,1,1,Lk] with -inf, 2 full [B,H,Lq,Lk] random + a fully
                 masked row + a first tile fully masked, 3 bf16 mask [1,1,Lq,Lk] broadcast over b, h,
                 4 full mask with +-50 offsets between the first and later key tiles (a running max
                 that is not kept monotone would overflow exp) */
    cdf_dtype dt;
} att_case;

static void run_attention_case(const att_case *c) {
    const int64_t B = c->b, H = c->h, Lq = c->lq, Lk = c->lk, D = c->d, Dv = c->dv;
    /* q stored [B, Lq, H, D] (diffusers' layout before transpose), k [B, H, Lk, D] contiguous,
     * v [B, H, Lk, Dv + 3] padded rows */
    const int64_t q_sb = Lq * H * D, q_sh = D, q_sl = H * D;
    const int64_t k_sb = H * Lk * D, k_sh = Lk * D, k_sl = D;
    const int64_t v_sl = Dv + 3, v_sh = Lk * v_sl, v_sb = H * v_sh;
    const size_t qn = (size_t)(B * q_sb), kn = (size_t)(B * k_sb), vn = (size_t)(B * v_sb);
    const size_t on = (size_t)(B * H * Lq * Dv);
    float *q = rnd(qn, 1100 + (uint64_t)Lk, 1.0f), *k = rnd(kn, 1200 + (uint64_t)Lk, 1.0f), *v = rnd(vn, 1300, 1.0f);
    round_to(q, qn, c->dt);
    round_to(k, kn, c->dt);
    round_to(v, vn, c->dt);
    void *qb = to_dt(q, qn, c->dt), *kb = to_dt(k, kn, c->dt), *vb = to_dt(v, vn, c->dt);

    float *mask = NULL;
    int64_t m_sb = 0, m_sh = 0, m_sq = 0, m_sk = 1;
    cdf_dtype mdt = CDF_F32;
    if (c->mask == 1) {
        mask = calloc((size_t)(B * Lk), sizeof(float));
        m_sb = Lk;
        for (int64_t bi = 0; bi < B; bi++)
            for (int64_t j = Lk - 1 - bi * 5; j < Lk && j >= 0; j++) mask[bi * Lk + j] = -INFINITY;
    } else if (c->mask == 2) {
        mask = rnd((size_t)(B * H * Lq * Lk), 1400, 2.0f);
        m_sb = H * Lq * Lk, m_sh = Lq * Lk, m_sq = Lk;
        for (int64_t j = 0; j < Lk; j++) mask[1 * Lq * Lk + 2 * Lk + j] = -INFINITY; /* b0 h1 q2: all masked */
        for (int64_t j = 0; j < Lk && j < 64; j++) mask[3 * Lk + j] = -INFINITY;   /* b0 h0 q3: first tile masked */
        for (int64_t j = 0; j < Lk; j += 3) mask[4 * Lk + j] = -INFINITY;
    } else if (c->mask == 4) {
        mask = rnd((size_t)(B * H * Lq * Lk), 1450, 2.0f);
        m_sb = H * Lq * Lk, m_sh = Lq * Lk, m_sq = Lk;
        for (int64_t r = 0; r < B * H * Lq; r++)
            for (int64_t j = 0; j < Lk; j++) mask[r * Lk + j] += ((r + j / 64) % 2) ? 50.0f : -50.0f;
    } else if (c->mask == 3) {
        mask = rnd((size_t)(Lq * Lk), 1500, 3.0f);
        m_sq = Lk;
        mdt = CDF_BF16;
        round_to(mask, (size_t)(Lq * Lk), CDF_BF16);
    }
    const size_t mask_n = c->mask == 3 ? (size_t)(Lq * Lk) : (c->mask == 1 ? (size_t)(B * Lk) : (size_t)(B * H * Lq * Lk));
    void *maskb = mask ? to_dt(mask, mask_n, mdt) : NULL;

    const float scale = 1.0f / sqrtf((float)D);
    void *ob = malloc(cdf_dtype_size(c->dt) * on);
    cdf_k_attention_args a = {.b = B, .h = H, .lq = Lq, .lk = Lk, .d = D, .dv = Dv,
                              .q = qb, .q_dt = c->dt, .q_sb = q_sb, .q_sh = q_sh, .q_sl = q_sl,
                              .k = kb, .k_dt = c->dt, .k_sb = k_sb, .k_sh = k_sh, .k_sl = k_sl,
                              .v = vb, .v_dt = c->dt, .v_sb = v_sb, .v_sh = v_sh, .v_sl = v_sl,
                              .mask = maskb, .mask_dt = mdt, .m_sb = m_sb, .m_sh = m_sh, .m_sq = m_sq, .m_sk = m_sk,
                              .out = ob, .out_dt = c->dt, .scale = scale};
    assert_int_equal(cdf_k_attention(&a), CDF_OK);
    float *got = from_dt(ob, c->dt, on);
    double *ref = malloc(sizeof(double) * on), *s = malloc(sizeof(double) * (size_t)(Lk ? Lk : 1));
    double *mag = malloc(sizeof(double) * on);
    /* bf16 q/k/v: the bf16 attention policy (kernels.h): the numerator's weights are
     * P = 2^(s log2(e) - M) (M an integer, any: the rounding does not depend on it) rounded to
     * bf16, the row sum takes them unrounded. A weight within the kernel's few-ulp error (eps_p,
     * bounded generously by the scores' f32 error) of a bf16 rounding midpoint may round either
     * way: one bf16 ulp of it, times |v| / l, is added to that output's tolerance. */
    const bool round_p = c->dt == CDF_BF16;
    const double rtol = 1e-5;
    for (int64_t bi = 0; bi < B; bi++)
        for (int64_t hi = 0; hi < H; hi++)
            for (int64_t i = 0; i < Lq; i++) {
                double m = -INFINITY, smag = 0.0;
                for (int64_t j = 0; j < Lk; j++) {
                    double dot = 0, adot = 0;
                    for (int64_t e = 0; e < D; e++) {
                        const double pr =
                            (double)q[bi * q_sb + hi * q_sh + i * q_sl + e] * k[bi * k_sb + hi * k_sh + j * k_sl + e];
                        dot += pr;
                        adot += fabs(pr);
                    }
                    s[j] = dot * scale + (mask ? mask[bi * m_sb + hi * m_sh + i * m_sq + j * m_sk] : 0.0);
                    m = fmax(m, s[j]);
                    smag = fmax(smag, adot * scale);
                }
                const double M = m == -INFINITY ? 0.0 : ceil(m * 1.4426950408889634);
                const double eps_p = (2.0 * (double)D + 16.0) * U32 * (smag + 1.0);
                double l = 0;
                for (int64_t j = 0; j < Lk; j++)
                    l += m == -INFINITY ? 0 : round_p ? exp2(s[j] * 1.4426950408889634 - M) : exp(s[j] - m);
                for (int64_t e = 0; e < Dv; e++) {
                    double acc = 0, allow = 0;
                    if (m != -INFINITY)
                        for (int64_t j = 0; j < Lk; j++) {
                            const double ve = v[bi * v_sb + hi * v_sh + j * v_sl + e];
                            if (!round_p) {
                                acc += exp(s[j] - m) * ve;
                                continue;
                            }
                            const double p = exp2(s[j] * 1.4426950408889634 - M);
                            const double lo = cdf_bf16_to_f32(cdf_f32_to_bf16((float)(p * (1.0 - eps_p))));
                            const double hi_ = cdf_bf16_to_f32(cdf_f32_to_bf16((float)(p * (1.0 + eps_p))));
                            acc += (double)cdf_bf16_to_f32(cdf_f32_to_bf16((float)p)) * ve;
                            allow += (hi_ - lo) * fabs(ve);
                        }
                    const size_t o = (size_t)(((bi * H + hi) * Lq + i) * Dv + e);
                    ref[o] = m == -INFINITY ? 0.0 : acc / l;
                    /* check_close_mag's tolerance is atol + rtol mag: the allowance goes in mag */
                    mag[o] = fabs(ref[o]) + (m == -INFINITY ? 0.0 : allow / l / rtol);
                }
            }
    /* outputs are convex combinations of |v| <= 1; f32 scores/exp/sums carry a few e-7 */
    char what[96];
    snprintf(what, sizeof what, "attention B%lld H%lld Lq%lld Lk%lld D%lld Dv%lld mask%d", (long long)B, (long long)H,
             (long long)Lq, (long long)Lk, (long long)D, (long long)Dv, c->mask);
    check_close_mag(what, got, ref, mag, on, c->dt, 4e-6, rtol);
    free(mag);
    if (c->mask == 2) /* the fully masked row is exactly zero, not NaN */
        for (int64_t e = 0; e < Dv; e++) assert_true(got[((0 * H + 1) * Lq + 2) * Dv + e] == 0.0f);
    free(q); free(k); free(v); free(qb); free(kb); free(vb); free(mask); free(maskb); free(ob); free(got);
    free(ref); free(s);
}

static void test_attention(void **state) {
    (void)state;
    const att_case cases[] = {
        {2, 3, 17, 130, 16, 24, 0, CDF_F32}, {2, 3, 17, 130, 16, 24, 1, CDF_F32}, {2, 3, 19, 130, 16, 16, 2, CDF_F32},
        {1, 2, 5, 1, 8, 8, 0, CDF_F32},     {1, 2, 33, 64, 32, 32, 2, CDF_F32},  {1, 1, 65, 65, 8, 4, 3, CDF_F32},
        {2, 3, 17, 130, 16, 24, 2, CDF_BF16}, {1, 2, 9, 70, 16, 16, 1, CDF_F16}, {1, 1, 3, 0, 8, 8, 0, CDF_F32},
        {1, 2, 18, 200, 16, 8, 4, CDF_F32},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_attention_case(&cases[i]);
}

/* ---- RoPE and the timestep embedding (golden tables) ----------------------------------------------- */

static void test_rope(void **state) {
    (void)state;
    st_file f;
    st_open(&f, tu_data("embeddings/embeddings.safetensors"));
    const struct { const char *name; int64_t l, d; double theta; } tabs[] = {
        {"rope_d16_theta10000", 7, 16, 10000.0}, {"rope_d56_theta10000", 4, 56, 10000.0}, {"rope_d32_theta2000", 4, 32, 2000.0}};
    for (int ti = 0; ti < 3; ti++) {
        char key[96];
        const int64_t L = tabs[ti].l, D = tabs[ti].d;
        snprintf(key, sizeof key, "%s.cos", tabs[ti].name);
        float *cs = st_f32(&f, key, (size_t)(L * D));
        snprintf(key, sizeof key, "%s.sin", tabs[ti].name);
        float *sn = st_f32(&f, key, (size_t)(L * D));
        snprintf(key, sizeof key, "%s.pos", tabs[ti].name);
        float *pos = st_f32(&f, key, (size_t)L);
        /* the tables have the layout cdf_k_rope assumes: frequency i at columns 2i and 2i+1,
         * angle pos * theta^(-2i/D) in double, cos/sin rounded to f32 */
        for (int64_t p = 0; p < L; p++)
            for (int64_t i = 0; i < D / 2; i++) {
                double ang = (double)pos[p] * (1.0 / pow(tabs[ti].theta, (double)(2 * i) / (double)D));
                for (int r = 0; r < 2; r++) {
                    assert_true(fabs(cs[p * D + 2 * i + r] - cos(ang)) <= 1.2e-7 * fmax(1.0, fabs(cos(ang))));
                    assert_true(fabs(sn[p * D + 2 * i + r] - sin(ang)) <= 1.2e-7 * fmax(1.0, fabs(sin(ang))));
                }
            }
        for (int di = 0; di < 3; di++) {
            cdf_dtype dt = FLOAT_DTS[di];
            const int64_t B = 2, H = 3;
            const size_t n = (size_t)(B * H * L * D);
            float *x = rnd(n, 1600 + (uint64_t)ti, 2.0f);
            round_to(x, n, dt);
            void *xb = to_dt(x, n, dt);
            void *ob = malloc(cdf_dtype_size(dt) * n);
            assert_int_equal(cdf_k_rope(ob, dt, xb, dt, cs, sn, B, H, L, D), CDF_OK);
            float *got = from_dt(ob, dt, n);
            double *ref = malloc(sizeof(double) * n), *mag = malloc(sizeof(double) * n);
            for (int64_t row = 0; row < B * H * L; row++) {
                const int64_t p = row % L;
                for (int64_t i = 0; i < D; i += 2) {
                    double x0 = x[row * D + i], x1 = x[row * D + i + 1];
                    ref[row * D + i] = x0 * cs[p * D + i] - x1 * sn[p * D + i];
                    ref[row * D + i + 1] = x1 * cs[p * D + i + 1] + x0 * sn[p * D + i + 1];
                    mag[row * D + i] = fabs(x0 * cs[p * D + i]) + fabs(x1 * sn[p * D + i]);
                    mag[row * D + i + 1] = fabs(x1 * cs[p * D + i + 1]) + fabs(x0 * sn[p * D + i + 1]);
                }
            }
            check_close_mag("rope", got, ref, mag, n, dt, 1e-30, 3.0 * U32);
            /* in place gives the same bytes */
            assert_int_equal(cdf_k_rope(xb, dt, xb, dt, cs, sn, B, H, L, D), CDF_OK);
            assert_memory_equal(xb, ob, cdf_dtype_size(dt) * n);
            free(x); free(xb); free(ob); free(got); free(ref); free(mag);
        }
        free(cs); free(sn); free(pos);
    }
    st_close(&f);
    float dummy[6] = {0};
    assert_int_equal(cdf_k_rope(dummy, CDF_F32, dummy, CDF_F32, dummy, dummy, 1, 1, 1, 3), CDF_ERR_INVALID_ARG);
}

static float trig_of_f32_arg(float t, float f, bool is_cos) {
    float arg = t * f;
    return (float)(is_cos ? cos((double)arg) : sin((double)arg));
}

static void test_timestep_embedding_golden(void **state) {
    (void)state;
    st_file f;
    st_open(&f, tu_data("embeddings/embeddings.safetensors"));
    float *t = st_f32(&f, "t", 8);
    float *emb = st_f32(&f, "timestep_embedding_256_flip", 8 * 256);
    float *freqs = st_f32(&f, "freqs_256_shift0", 128);
    float *out = malloc(sizeof(float) * 8 * 256);
    assert_int_equal(cdf_k_timestep_embedding(out, t, 8, 256, true, 0.0f, 1.0f, 10000.0f), CDF_OK);
    double max_diff_3500 = 0;
    for (int i = 0; i < 8; i++) {
        for (int k = 0; k < 128; k++) {
            for (int part = 0; part < 2; part++) { /* flip: [cos | sin] */
                const bool is_cos = part == 0;
                const float got = out[i * 256 + part * 128 + k], want = emb[i * 256 + part * 128 + k];
                /* (1) our frequency is torch's f32 table entry or one of its neighbours (README:
                 * 15 of 128 torch exp values are 1 ulp off a correctly rounded exp), and the
                 * argument is the f32 product t * freq: the output is exactly the double sin/cos
                 * of such an argument, rounded */
                const float cand[3] = {nextafterf(freqs[k], 0.0f), freqs[k], nextafterf(freqs[k], 2.0f)};
                bool matched = false;
                for (int ci = 0; ci < 3 && !matched; ci++) {
                    float r = trig_of_f32_arg(t[i], cand[ci], is_cos);
                    matched = fabsf(got - r) <= nextafterf(fabsf(r), INFINITY) - fabsf(r);
                }
                if (!matched)
                    fail_msg("timestep embedding t=%g k=%d %s: %.9g is not sin/cos(f32(t*freq)) for freq within 1 ulp of "
                             "torch's %.9g",
                             (double)t[i], k, is_cos ? "cos" : "sin", (double)got, (double)freqs[k]);
                /* (2) against torch's output: a 1-ulp frequency difference moves the f32 argument by
                 * at most t * ulp(freq) + ulp(arg); torch's own f32 sin/cos differ from the rounded
                 * double evaluation by <= 5.96e-8 (README) */
                const float arg = t[i] * freqs[k];
                const double ulp_f = (double)nextafterf(freqs[k], 2.0f) - freqs[k];
                const double ulp_arg = (double)nextafterf(fabsf(arg), INFINITY) - fabsf(arg);
                const double tol = (double)t[i] * ulp_f + ulp_arg + 5.97e-8 + 6e-8;
                const double diff = fabs((double)got - (double)want);
                if (diff > tol)
                    fail_msg("timestep embedding t=%g k=%d: got %.9g, torch %.9g, diff %.3g > %.3g", (double)t[i], k,
                             (double)got, (double)want, diff, tol);
                if (t[i] == 3500.0f && diff > max_diff_3500) max_diff_3500 = diff;
            }
        }
    }
    /* README: computing with an own exp is expected to differ by ~1e-4 at t = 3500 (the float64
     * formula differs by 1.12e-4); our worst case must stay in that class */
    print_message("timestep embedding: max |diff| to torch at t=3500: %.3g\n", max_diff_3500);
    assert_true(max_diff_3500 <= 1.5e-4);
    free(t); free(emb); free(freqs); free(out);
    st_close(&f);
}

static void test_timestep_embedding_variants(void **state) {
    (void)state;
    /* no flip, downscale_freq_shift 1 (SD-style), scale 2, odd dim (zero pad), max_period 1000:
     * compared with a double evaluation; the f32 table and argument carry ~3 ulp of relative error */
    const float t[4] = {0.0f, 0.5f, 3.0f, 9.75f};
    const int64_t dims[2] = {7, 32};
    for (int di = 0; di < 2; di++) {
        const int64_t dim = dims[di], half = dim / 2;
        float *out = malloc(sizeof(float) * (size_t)(4 * dim));
        for (int64_t i = 0; i < 4 * dim; i++) out[i] = NAN;
        assert_int_equal(cdf_k_timestep_embedding(out, t, 4, dim, false, 1.0f, 2.0f, 1000.0f), CDF_OK);
        for (int i = 0; i < 4; i++) {
            for (int64_t k = 0; k < half; k++) {
                double freq = exp(-log(1000.0) * (double)k / ((double)half - 1.0));
                double arg = 2.0 * t[i] * freq;
                /* f32 exponent (3 roundings) feeds exp: relative freq error ~ 3 u |ln freq| */
                double tol = 1.2e-7 * (4.0 + 3.0 * fabs(log(freq))) * (1.0 + fabs(arg));
                assert_true(fabs(out[i * dim + k] - sin(arg)) <= tol);
                assert_true(fabs(out[i * dim + half + k] - cos(arg)) <= tol);
            }
            if (dim % 2) assert_true(out[i * dim + dim - 1] == 0.0f);
        }
        free(out);
    }
    assert_int_equal(cdf_k_timestep_embedding(NULL, NULL, 0, 256, true, 0, 1, 10000), CDF_OK);
    assert_int_equal(cdf_k_timestep_embedding(NULL, t, 1, 256, true, 0, 1, 10000), CDF_ERR_INVALID_ARG);
}

int main(void) {
    /* more threads than this machine may have, so the OpenMP paths (shared tiles, batch-parallel
     * matmul, per-thread scratch) run with real teams */
    omp_set_num_threads(4);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_copy_strided_float),
        cmocka_unit_test(test_copy_strided_broadcast_and_ints),
        cmocka_unit_test(test_fill),
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_upsample_nearest),
        cmocka_unit_test(test_unary),
        cmocka_unit_test(test_binary),
        cmocka_unit_test(test_matmul_shapes_and_flags),
        cmocka_unit_test(test_matmul_batch_dtypes),
        cmocka_unit_test(test_matmul_errors),
        cmocka_unit_test(test_matmul_quantized_panels),
        cmocka_unit_test(test_softmax),
        cmocka_unit_test(test_layer_rms_norm),
        cmocka_unit_test(test_group_norm),
        cmocka_unit_test(test_reduce),
        cmocka_unit_test(test_reduce_argmax),
        cmocka_unit_test(test_conv2d),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_timestep_embedding_golden),
        cmocka_unit_test(test_timestep_embedding_variants),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
