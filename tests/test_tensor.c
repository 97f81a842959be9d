/* Tensor runtime: views, copies, broadcasting, the async queue, memory accounting. Expected
 * values come from straightforward index arithmetic in the test (double precision). */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cdiffusers/exec.h"
#include "cdiffusers/tensor.h"

static cdf_device *cpu(void) {
    cdf_device *d = cdf_device_get("cpu");
    assert_non_null(d);
    return d;
}

static cdf_tensor *iota(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    float *v = malloc(n * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = (float)i;
    cdf_tensor *t = cdf_tensor_from_host(cpu(), CDF_F32, ndim, shape, v, CDF_F32);
    free(v);
    assert_non_null(t);
    return t;
}

static void test_views_permute_slice_reshape(void **state) {
    (void)state;
    cdf_scope_push();
    int64_t s[3] = {2, 3, 4};
    cdf_tensor *t = iota(3, s);
    int perm[3] = {2, 0, 1};
    cdf_tensor *p = cdf_permute(t, perm); /* [4, 2, 3]: p[i][j][k] = t[j][k][i] */
    assert_int_equal(cdf_tensor_dim(p, 0), 4);
    assert_false(cdf_tensor_is_contiguous(p));
    float *v = cdf_tensor_read_f32(p);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 2; j++)
            for (int k = 0; k < 3; k++) assert_float_equal(v[(i * 2 + j) * 3 + k], j * 12 + k * 4 + i, 0);
    free(v);
    /* reshape of a non-viewable permutation copies; values follow logical order */
    int64_t r[2] = {8, -1};
    cdf_tensor *rp = cdf_reshape(p, 2, r);
    assert_int_equal(cdf_tensor_dim(rp, 1), 3);
    v = cdf_tensor_read_f32(rp);
    assert_float_equal(v[3], 12 /* p[0][1][0] = t[1][0][0] */, 0);
    free(v);
    /* slice with step, narrow, transpose */
    cdf_tensor *sl = cdf_slice(t, 2, 1, 4, 2); /* cols 1, 3 */
    assert_int_equal(cdf_tensor_dim(sl, 2), 2);
    v = cdf_tensor_read_f32(sl);
    assert_float_equal(v[0], 1, 0);
    assert_float_equal(v[1], 3, 0);
    assert_float_equal(v[11], 23, 0);
    free(v);
    cdf_tensor *nr = cdf_narrow(t, 1, 1, 2);
    v = cdf_tensor_read_f32(nr);
    assert_float_equal(v[0], 4, 0);
    free(v);
    assert_null(cdf_narrow(t, 1, 2, 2));
    assert_int_equal(cdf_last_status(), CDF_ERR_INVALID_ARG);
    /* a viewable reshape does not copy (shares storage): reshape of a contiguous tensor */
    int64_t r2[2] = {6, 4};
    cdf_tensor *rv = cdf_reshape(t, 2, r2);
    assert_true(cdf_tensor_is_contiguous(rv));
    /* unsqueeze / squeeze / expand */
    cdf_tensor *u = cdf_unsqueeze(t, 1);
    assert_int_equal(cdf_tensor_ndim(u), 4);
    assert_int_equal(cdf_tensor_dim(u, 1), 1);
    int64_t e[4] = {2, 5, 3, 4};
    cdf_tensor *ex = cdf_expand(u, 4, e);
    assert_non_null(ex);
    assert_int_equal(cdf_tensor_strides(ex)[1], 0);
    v = cdf_tensor_read_f32(ex);
    assert_float_equal(v[4 * 12 + 5], 5, 0); /* ex[0][4][1][1] = t[0][1][1] */
    free(v);
    int64_t bad[4] = {2, 5, 7, 4};
    assert_null(cdf_expand(u, 4, bad));
    assert_int_equal(cdf_last_status(), CDF_ERR_SHAPE);
    cdf_tensor *sq = cdf_squeeze(u, 1);
    assert_int_equal(cdf_tensor_ndim(sq), 3);
    cdf_scope_pop(NULL, 0);
}

static void test_cast_round_to_nearest_even(void **state) {
    (void)state;
    cdf_scope_push();
    /* 1 + 2^-8 is exactly halfway between two bf16 values: ties to even -> 1.0;
     * 1 + 3*2^-8 is halfway too: ties to even -> 1 + 2^-6 */
    float in[4] = {1.0f + 1.0f / 256, 1.0f + 3.0f / 256, -2.5f, 65504.0f};
    int64_t s[1] = {4};
    cdf_tensor *t = cdf_tensor_from_host(cpu(), CDF_F32, 1, s, in, CDF_F32);
    cdf_tensor *b = cdf_cast(t, CDF_BF16);
    uint16_t raw[4];
    assert_int_equal(cdf_tensor_read(b, CDF_BF16, raw, sizeof raw), CDF_OK);
    assert_int_equal(raw[0], 0x3f80);
    assert_int_equal(raw[1], 0x3f82);
    assert_int_equal(raw[2], 0xc020);
    cdf_tensor *h = cdf_cast(t, CDF_F16);
    uint16_t rh[4];
    assert_int_equal(cdf_tensor_read(h, CDF_F16, rh, sizeof rh), CDF_OK);
    assert_int_equal(rh[0], 0x3c04); /* 1 + 2^-8 is exact in f16 (10-bit mantissa) */
    assert_int_equal(rh[3], 0x7bff); /* 65504 = f16 max */
    /* i64 -> f32 -> i32 */
    int64_t ids[3] = {7, -3, 1 << 20};
    int64_t s3[1] = {3};
    cdf_tensor *ti = cdf_tensor_from_host(cpu(), CDF_I64, 1, s3, ids, CDF_I64);
    cdf_tensor *t32 = cdf_cast(ti, CDF_I32);
    int32_t r32[3];
    assert_int_equal(cdf_tensor_read(t32, CDF_I32, r32, sizeof r32), CDF_OK);
    assert_int_equal(r32[1], -3);
    assert_int_equal(r32[2], 1 << 20);
    cdf_scope_pop(NULL, 0);
}

static void test_f16_conversion_exhaustive(void **state) {
    (void)state;
    /* every finite f16 value survives f16 -> f32 -> f16; midpoints round to even */
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00) continue;
        float f = cdf_f16_to_f32((uint16_t)h);
        assert_int_equal(cdf_f32_to_f16(f), h);
    }
    /* 1 + 2^-11 (halfway between 1 and 1+2^-10) -> 1.0; 1 + 3*2^-11 -> 1 + 2^-9 */
    assert_int_equal(cdf_f32_to_f16(1.0f + 1.0f / 2048), 0x3c00);
    assert_int_equal(cdf_f32_to_f16(1.0f + 3.0f / 2048), 0x3c02);
    assert_int_equal(cdf_f32_to_f16(1e-8f), 0x0000);
    assert_int_equal(cdf_f32_to_f16(70000.0f), 0x7c00);
}

static void test_broadcast_binary_and_cat_pad(void **state) {
    (void)state;
    cdf_scope_push();
    int64_t sa[2] = {3, 1}, sb[1] = {4};
    cdf_tensor *a = iota(2, sa), *b = iota(1, sb);
    cdf_tensor *c = cdf_add(a, b); /* [3,4]: i + j */
    assert_int_equal(cdf_tensor_dim(c, 0), 3);
    assert_int_equal(cdf_tensor_dim(c, 1), 4);
    float *v = cdf_tensor_read_f32(c);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++) assert_float_equal(v[i * 4 + j], i + j, 0);
    free(v);
    /* integer operands are promoted to f32 (torch: int64 + float32 -> float32) */
    int64_t iv[4] = {10, 20, 30, 40};
    cdf_tensor *ti = cdf_tensor_from_host(cpu(), CDF_I64, 1, sb, iv, CDF_I64);
    cdf_tensor *mixed = cdf_add(ti, b);
    assert_non_null(mixed);
    assert_int_equal(cdf_tensor_dtype(mixed), CDF_F32);
    v = cdf_tensor_read_f32(mixed);
    assert_non_null(v);
    assert_float_equal(v[3], 43, 0);
    free(v);
    v = cdf_tensor_read_f32(cdf_scale(ti, 0.5f));
    assert_non_null(v);
    assert_float_equal(v[1], 10, 0);
    free(v);
    int64_t sbad[1] = {5};
    assert_null(cdf_mul(c, iota(1, sbad)));
    assert_int_equal(cdf_last_status(), CDF_ERR_SHAPE);
    assert_non_null(strstr(cdf_last_error(), "do not broadcast"));
    /* cat along dim 1 of a transposed view and a plain tensor */
    cdf_tensor *ct = cdf_transpose(c, 0, 1); /* [4,3] */
    int64_t s43[2] = {4, 2};
    cdf_tensor *z = iota(2, s43);
    cdf_tensor *cc = cdf_cat((cdf_tensor *[]){ct, z}, 2, 1); /* [4,5] */
    v = cdf_tensor_read_f32(cc);
    assert_float_equal(v[1 * 5 + 2], 2 + 1, 0); /* ct[1][2] = c[2][1] */
    assert_float_equal(v[1 * 5 + 4], 3, 0);     /* z[1][1] */
    free(v);
    int64_t pads[4] = {1, 2, 0, 1}; /* last dim: 1 left, 2 right; dim 0: 0 top, 1 bottom */
    cdf_tensor *pd = cdf_pad(z, 2, pads, -1.0);
    assert_int_equal(cdf_tensor_dim(pd, 0), 5);
    assert_int_equal(cdf_tensor_dim(pd, 1), 5);
    v = cdf_tensor_read_f32(pd);
    assert_float_equal(v[0], -1, 0);
    assert_float_equal(v[1], 0, 0);
    assert_float_equal(v[2], 1, 0);
    assert_float_equal(v[3], -1, 0);
    assert_float_equal(v[4 * 5 + 1], -1, 0);
    free(v);
    cdf_scope_pop(NULL, 0);
}

static void test_matmul_transposed_views(void **state) {
    (void)state;
    cdf_scope_push();
    enum { B = 2, M = 5, K = 7, N = 3 };
    float a[B * M * K], bt[B * N * K];
    tu_fill_random(a, B * M * K, 11);
    tu_fill_random(bt, B * N * K, 12);
    int64_t sa[3] = {B, M, K}, sb[3] = {B, N, K};
    cdf_tensor *ta = cdf_tensor_from_host(cpu(), CDF_F32, 3, sa, a, CDF_F32);
    cdf_tensor *tbt = cdf_tensor_from_host(cpu(), CDF_F32, 3, sb, bt, CDF_F32);
    cdf_tensor *tb = cdf_transpose(tbt, 1, 2); /* [B, K, N] view, not contiguous */
    cdf_tensor *c = cdf_matmul(ta, tb);
    float *v = cdf_tensor_read_f32(c);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double r = 0;
                for (int k = 0; k < K; k++) r += (double)a[(b * M + i) * K + k] * bt[(b * N + j) * K + k];
                assert_true(fabs(v[(b * M + i) * N + j] - r) < 1e-5);
            }
    free(v);
    /* linear with bias over a 3-D input */
    float w[N * K], bias[N];
    tu_fill_random(w, N * K, 13);
    tu_fill_random(bias, N, 14);
    int64_t sw[2] = {N, K}, sbias[1] = {N};
    cdf_tensor *tw = cdf_tensor_from_host(cpu(), CDF_F32, 2, sw, w, CDF_F32);
    cdf_tensor *tbias = cdf_tensor_from_host(cpu(), CDF_F32, 1, sbias, bias, CDF_F32);
    cdf_tensor *y = cdf_linear(ta, tw, tbias);
    assert_int_equal(cdf_tensor_dim(y, 2), N);
    v = cdf_tensor_read_f32(y);
    for (int r = 0; r < B * M; r++)
        for (int j = 0; j < N; j++) {
            double acc = bias[j];
            for (int k = 0; k < K; k++) acc += (double)a[r * K + k] * w[j * K + k];
            assert_true(fabs(v[r * N + j] - acc) < 1e-5);
        }
    free(v);
    int64_t swbad[2] = {N, K + 1};
    assert_null(cdf_linear(ta, cdf_tensor_zeros(cpu(), CDF_F32, 2, swbad), NULL));
    assert_non_null(strstr(cdf_last_error(), "in_features"));
    /* bf16 x and weights: cdf_linear's product is bf16 (rounded), cdf_linear_as's the dtype asked
     * for, holding the unrounded sums (the values the f32 product of the same bf16 inputs has) */
    cdf_tensor *xb = cdf_cast(ta, CDF_BF16), *wb = cdf_cast(tw, CDF_BF16);
    cdf_tensor *yb = cdf_linear(xb, wb, tbias), *yf = cdf_linear_as(xb, wb, tbias, CDF_F32);
    cdf_tensor *yr = cdf_linear(cdf_cast(xb, CDF_F32), cdf_cast(wb, CDF_F32), tbias);
    assert_int_equal(cdf_tensor_dtype(yb), CDF_BF16);
    assert_int_equal(cdf_tensor_dtype(yf), CDF_F32);
    float *vf = cdf_tensor_read_f32(yf), *vr = cdf_tensor_read_f32(yr);
    for (int i = 0; i < B * M * N; i++) assert_true(fabsf(vf[i] - vr[i]) <= 1e-5f * (1.0f + fabsf(vr[i])));
    free(vf);
    free(vr);
    assert_null(cdf_linear_as(xb, wb, NULL, CDF_I64));
    assert_int_equal(cdf_last_status(), CDF_ERR_DTYPE);
    cdf_scope_pop(NULL, 0);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void test_queue_is_async_and_in_order(void **state) {
    (void)state;
    /* eager semantics: each op goes to the queue at the call (defer-and-fuse records instead) */
    cdf_exec_mode saved = cdf_exec_get_mode();
    assert_int_equal(cdf_exec_set_mode(CDF_EXEC_EAGER), CDF_OK);
    cdf_device *d = cpu();
    cdf_scope_push();
    /* a chain of large matmuls: submitting must return long before the work is done */
    int64_t s[2] = {384, 384};
    cdf_tensor *x = cdf_tensor_full(d, CDF_F32, 2, s, 0.001);
    cdf_queue_stats q0, q1, q2;
    cdf_device_queue_stats(d, &q0);
    double t0 = now_s();
    cdf_tensor *y = x;
    for (int i = 0; i < 12; i++) y = cdf_matmul(y, x);
    double t_submit = now_s() - t0;
    cdf_device_queue_stats(d, &q1);
    assert_true(q1.enqueued - q0.enqueued >= 12);
    /* ops are still pending right after submission (the work takes far longer than the calls) */
    assert_true(q1.completed < q1.enqueued);
    float out;
    cdf_tensor *one = cdf_narrow(cdf_narrow(y, 0, 0, 1), 1, 0, 1);
    assert_int_equal(cdf_tensor_read(one, CDF_F32, &out, sizeof out), CDF_OK); /* waits */
    double t_total = now_s() - t0;
    cdf_device_queue_stats(d, &q2);
    assert_int_equal(q2.completed, q2.enqueued);
    assert_true(q2.syncs > q1.syncs);
    assert_true(t_submit < t_total);
    /* in-order: value of 13 chained products of the constant matrix: 0.001^13 * 384^12 */
    double expect = pow(0.001, 13) * pow(384.0, 12);
    assert_true(fabs(out - expect) / expect < 1e-3);
    cdf_scope_pop(NULL, 0);
    assert_int_equal(cdf_exec_set_mode(saved), CDF_OK);
}

static void test_kernel_error_surfaces_at_sync(void **state) {
    (void)state;
    cdf_device *d = cpu();
    cdf_scope_push();
    int64_t ts[2] = {10, 4}, is[1] = {3};
    cdf_tensor *table = cdf_tensor_zeros(d, CDF_F32, 2, ts);
    int64_t ids[3] = {1, 99, 2}; /* 99 is out of range: only the kernel can see it (data on device) */
    cdf_tensor *tid = cdf_tensor_from_host(d, CDF_I64, 1, is, ids, CDF_I64);
    cdf_tensor *e = cdf_embedding(table, tid);
    assert_non_null(e); /* the call itself succeeds: the error is raised on the queue */
    cdf_status s = cdf_device_synchronize(d);
    assert_int_equal(s, CDF_ERR_DEVICE);
    assert_non_null(strstr(cdf_last_error(), "embedding"));
    assert_non_null(strstr(cdf_last_error(), "99"));
    /* the error is collected once; the device works afterwards */
    assert_int_equal(cdf_device_synchronize(d), CDF_OK);
    cdf_tensor *z = cdf_add_scalar(table, 2.0f);
    double v;
    assert_int_equal(cdf_tensor_item(cdf_narrow(cdf_narrow(z, 0, 3, 1), 1, 2, 1), &v), CDF_OK);
    assert_float_equal(v, 2.0, 0);
    cdf_scope_pop(NULL, 0);
}

static void test_memory_cap_and_accounting(void **state) {
    (void)state;
    cdf_device *d = cpu();
    assert_int_equal(cdf_device_synchronize(d), CDF_OK);
    cdf_memory_stats m0, m1, m2;
    cdf_device_memory_stats(d, &m0);
    cdf_device_reset_peak(d);
    int64_t s[1] = {1 << 20}; /* 4 MiB of f32 */
    cdf_tensor *a = cdf_tensor_zeros(d, CDF_F32, 1, s);
    cdf_device_memory_stats(d, &m1);
    assert_int_equal(m1.current_bytes - m0.current_bytes, 4u << 20);
    assert_true(m1.peak_bytes >= m1.current_bytes);
    /* cap at current + 6 MiB: a second 4 MiB fits, a third does not */
    assert_int_equal(cdf_device_set_memory_limit(d, m1.current_bytes + (6u << 20)), CDF_OK);
    cdf_tensor *b = cdf_tensor_zeros(d, CDF_F32, 1, s);
    assert_non_null(b);
    cdf_tensor *c = cdf_tensor_zeros(d, CDF_F32, 1, s);
    assert_null(c);
    assert_int_equal(cdf_last_status(), CDF_ERR_OUT_OF_MEMORY);
    assert_non_null(strstr(cdf_last_error(), "cannot allocate 4.00 MiB"));
    assert_non_null(strstr(cdf_last_error(), "budget"));
    /* an op whose output would not fit fails at the call, cleanly */
    assert_null(cdf_add(a, b));
    assert_int_equal(cdf_last_status(), CDF_ERR_OUT_OF_MEMORY);
    /* releasing memory makes room again; the device stays usable */
    cdf_tensor_release(b);
    assert_int_equal(cdf_device_synchronize(d), CDF_OK);
    cdf_tensor *e = cdf_add_scalar(a, 1.0f);
    assert_non_null(e);
    double v;
    cdf_tensor *e5 = cdf_narrow(e, 0, 5, 1); /* a view holds the storage too */
    assert_int_equal(cdf_tensor_item(e5, &v), CDF_OK);
    assert_float_equal(v, 1.0, 0);
    cdf_tensor_release(e5);
    cdf_tensor_release(e);
    cdf_tensor_release(a);
    assert_int_equal(cdf_device_synchronize(d), CDF_OK);
    cdf_device_memory_stats(d, &m2);
    assert_int_equal(m2.current_bytes, m0.current_bytes);
    assert_int_equal(cdf_device_set_memory_limit(d, 0), CDF_OK);
    assert_int_equal(cdf_parse_bytes("8G"), 8ll << 30);
    assert_int_equal(cdf_parse_bytes("512M"), 512ll << 20);
    assert_int_equal(cdf_parse_bytes("1.5GiB"), 3ll << 29);
    assert_int_equal(cdf_parse_bytes("12x"), -1);
}

static void test_scope_keeps_and_releases(void **state) {
    (void)state;
    cdf_device *d = cpu();
    assert_int_equal(cdf_device_synchronize(d), CDF_OK);
    cdf_memory_stats m0, m1;
    cdf_device_memory_stats(d, &m0);
    int64_t s[1] = {1000};
    cdf_scope_push();
    cdf_tensor *a = cdf_tensor_full(d, CDF_F32, 1, s, 1.0);
    cdf_tensor *b = cdf_scale(a, 3.0f);
    cdf_tensor *c = cdf_exp(cdf_neg(b));
    cdf_scope_pop(&c, 1);
    assert_int_equal(cdf_device_synchronize(d), CDF_OK);
    cdf_device_memory_stats(d, &m1);
    assert_int_equal(m1.current_bytes - m0.current_bytes, 4000); /* only c survives */
    double v;
    cdf_tensor *c0 = cdf_narrow(c, 0, 0, 1);
    assert_int_equal(cdf_tensor_item(c0, &v), CDF_OK);
    assert_true(fabs(v - exp(-3.0)) < 1e-6);
    cdf_tensor_release(c0);
    cdf_tensor_release(c);
}

static void test_device_registry(void **state) {
    (void)state;
    assert_true(cdf_backend_count() >= 1);
    assert_string_equal(cdf_backend_name(0), "cpu");
    assert_ptr_equal(cdf_device_get("cpu"), cdf_device_get("cpu:0"));
    assert_null(cdf_device_get("cpu:3"));
    assert_int_equal(cdf_last_status(), CDF_ERR_NOT_FOUND);
    assert_null(cdf_device_get("tpu"));
    assert_non_null(strstr(cdf_last_error(), "no backend 'tpu'"));
    assert_int_equal(cdf_backend_load("cpu"), CDF_OK); /* idempotent */
    assert_int_equal(cdf_backend_load("nope"), CDF_ERR_NOT_FOUND);
    assert_non_null(strstr(cdf_last_error(), "built-in backends: cpu"));
}

static void test_autoload_switch(void **state) {
    (void)state;
    /* a child process with autoload off sees no device until it loads one by name */
    int rc = tu_system("CDIFFUSERS_BACKEND_AUTOLOAD=0 /proc/%d/exe --autoload-child", (int)getpid());
    assert_int_equal(rc, 0);
    /* and the child really checks something: with autoload on, its checks must fail */
    rc = tu_system("CDIFFUSERS_BACKEND_AUTOLOAD=1 /proc/%d/exe --autoload-child 2>/dev/null", (int)getpid());
    assert_int_equal(rc, 3);
}

/* Child mode for test_autoload_switch. Exit codes say which expectation failed. */
static int autoload_child(void) {
    if (cdf_backend_count() != 0) return 3;
    if (cdf_device_get("cpu") != NULL) return 4;
    if (cdf_device_default() != NULL) return 5;
    if (cdf_backend_load("cpu") != CDF_OK) return 6;
    cdf_device *d = cdf_device_get("cpu");
    if (!d) return 7;
    int64_t s[1] = {3};
    cdf_tensor *t = cdf_tensor_full(d, CDF_F32, 1, s, 2.0);
    cdf_tensor *one = cdf_narrow(t, 0, 1, 1);
    double v = 0;
    int rc = (cdf_tensor_item(one, &v) != CDF_OK || v != 2.0) ? 8 : 0;
    cdf_tensor_release(one);
    cdf_tensor_release(t);
    return rc;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--autoload-child") == 0) return autoload_child();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_registry),
        cmocka_unit_test(test_views_permute_slice_reshape),
        cmocka_unit_test(test_cast_round_to_nearest_even),
        cmocka_unit_test(test_f16_conversion_exhaustive),
        cmocka_unit_test(test_broadcast_binary_and_cat_pad),
        cmocka_unit_test(test_matmul_transposed_views),
        cmocka_unit_test(test_queue_is_async_and_in_order),
        cmocka_unit_test(test_kernel_error_surfaces_at_sync),
        cmocka_unit_test(test_memory_cap_and_accounting),
        cmocka_unit_test(test_scope_keeps_and_releases),
        cmocka_unit_test(test_autoload_switch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
