/* Every op on a device against the cpu backend (the reference), in f32 and bf16: the CUDA
 * backend's op suite for scripts/device-check.sh. The device under test is
 * CDIFFUSERS_TEST_DEVICE (default cuda:0); the test skips when that device does not exist (CI
 * machines have no GPU). ctest also runs it as test_cuda_ops_discrete with the device "cpu" in
 * the cpu backend's discrete mode, which checks the harness and that every op here works on
 * memory the host cannot touch.
 *
 * Inputs are the same pseudo-random values on both devices; the expected output is the cpu
 * backend's. Tolerances, on |diff| / max(1, |expected|): f32 1e-4 (different summation orders
 * on values of order 1), bf16 3e-2 (a bf16 rounding is 2^-9 relative, and a chain of ops rounds
 * several times; matmul/conv/attention inputs are rounded too); argmax (small integers) must
 * match exactly, which these bounds imply. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdiffusers/device.h"
#include "cdiffusers/exec.h"
#include "cdiffusers/tensor.h"

#define MAX_IN 4

typedef struct op_case {
    const char *name;
    int n_in;
    int ndim[MAX_IN];
    int64_t shape[MAX_IN][4];
    bool int_ids[MAX_IN]; /* an i64 index input (values in [0, 10)) */
    bool neg_inf_mask;    /* input 3 is an attention mask with -inf entries */
    cdf_tensor *(*run)(cdf_tensor **in);
} op_case;

static cdf_tensor *op_softmax(cdf_tensor **in) { return cdf_softmax(in[0], -1); }
static cdf_tensor *op_softmax_dim1(cdf_tensor **in) { return cdf_softmax(in[0], 1); }
static cdf_tensor *op_layer_norm(cdf_tensor **in) { return cdf_layer_norm(in[0], in[1], in[2], 1e-5f); }
static cdf_tensor *op_layer_norm_plain(cdf_tensor **in) { return cdf_layer_norm(in[0], NULL, NULL, 1e-6f); }
static cdf_tensor *op_rms_norm(cdf_tensor **in) { return cdf_rms_norm(in[0], in[1], 1e-6f); }
static cdf_tensor *op_group_norm(cdf_tensor **in) { return cdf_group_norm(in[0], 4, in[1], in[2], 1e-5f); }
static cdf_tensor *op_sum(cdf_tensor **in) { return cdf_sum(in[0], 1, false); }
static cdf_tensor *op_mean(cdf_tensor **in) { return cdf_mean(in[0], -1, true); }
static cdf_tensor *op_var(cdf_tensor **in) { return cdf_var(in[0], 1, false); }
static cdf_tensor *op_max(cdf_tensor **in) { return cdf_max(in[0], 0, false); }
static cdf_tensor *op_argmax(cdf_tensor **in) { return cdf_argmax(in[0], 1, false); }
static cdf_tensor *op_conv(cdf_tensor **in) {
    cdf_conv2d_params p = cdf_conv2d_params_default();
    p.stride_h = p.stride_w = 2;
    p.pad_h = p.pad_w = 1;
    p.groups = 2;
    return cdf_conv2d(in[0], in[1], in[2], &p);
}
static cdf_tensor *op_conv_plain(cdf_tensor **in) {
    cdf_conv2d_params p = cdf_conv2d_params_default();
    p.pad_h = p.pad_w = 1;
    return cdf_conv2d(in[0], in[1], NULL, &p);
}
static cdf_tensor *op_upsample(cdf_tensor **in) { return cdf_upsample_nearest(in[0], 2, 2); }
static cdf_tensor *op_sdpa(cdf_tensor **in) { return cdf_sdpa(in[0], in[1], in[2], NULL, 0.0f); }
static cdf_tensor *op_sdpa_mask(cdf_tensor **in) { return cdf_sdpa(in[0], in[1], in[2], in[3], 0.3f); }
static cdf_tensor *op_sdpa_strided(cdf_tensor **in) { /* q/k/v as [B, L, H, D] transposed views */
    cdf_tensor *q = cdf_transpose(in[0], 1, 2), *k = cdf_transpose(in[1], 1, 2), *v = cdf_transpose(in[2], 1, 2);
    cdf_tensor *o = cdf_sdpa(q, k, v, NULL, 0.0f);
    cdf_tensor_release(q);
    cdf_tensor_release(k);
    cdf_tensor_release(v);
    return o;
}
static cdf_tensor *op_rope(cdf_tensor **in) {
    cdf_tensor *c = cdf_cast(in[1], CDF_F32), *s = cdf_cast(in[2], CDF_F32);
    cdf_tensor *o = cdf_rope(in[0], c, s);
    cdf_tensor_release(c);
    cdf_tensor_release(s);
    return o;
}
static cdf_tensor *op_rope_tables(cdf_tensor **in) {
    cdf_tensor *pos = cdf_cast(in[0], CDF_F32), *c = NULL, *s = NULL;
    const int64_t axes[3] = {4, 6, 6};
    if (cdf_rope_tables(pos, 3, axes, 10000.0, &c, &s) != CDF_OK) return NULL;
    cdf_tensor *parts[2] = {c, s};
    cdf_tensor *o = cdf_cat(parts, 2, 0);
    cdf_tensor_release(pos);
    cdf_tensor_release(c);
    cdf_tensor_release(s);
    return o;
}
static cdf_tensor *op_temb(cdf_tensor **in) {
    cdf_tensor *t = cdf_cast(in[0], CDF_F32), *s = cdf_scale(t, 500.0f);
    cdf_tensor *o = cdf_timestep_embedding(s, 33, true, 1.0f, 1.0f, 10000.0f);
    cdf_tensor_release(t);
    cdf_tensor_release(s);
    return o;
}
static cdf_tensor *op_embedding(cdf_tensor **in) { return cdf_embedding(in[0], in[1]); }
static cdf_tensor *op_matmul_t(cdf_tensor **in) { /* a [2, 5, 7] @ b^T, b [2, 6, 7] */
    cdf_tensor *bt = cdf_transpose(in[1], 1, 2), *o = cdf_matmul(in[0], bt);
    cdf_tensor_release(bt);
    return o;
}
static cdf_tensor *op_matmul_bcast(cdf_tensor **in) { return cdf_matmul(in[0], in[1]); } /* [3, 4, 9] @ [9, 5] */
static cdf_tensor *op_linear(cdf_tensor **in) { return cdf_linear(in[0], in[1], in[2]); }
static cdf_tensor *op_copies(cdf_tensor **in) { /* strided copy, cat, pad, cast, slice */
    cdf_tensor *t = cdf_transpose(in[0], 0, 2), *c = cdf_contiguous(t);
    cdf_tensor *sl = cdf_slice(c, 1, 1, 5, 2), *parts[2] = {sl, sl};
    cdf_tensor *cat = cdf_cat(parts, 2, 1);
    const int64_t pads[4] = {1, 2, 0, 1};
    cdf_tensor *p = cdf_pad(cat, 2, pads, -0.5);
    cdf_tensor *r = cdf_cast(p, CDF_F32);
    cdf_tensor_release(t);
    cdf_tensor_release(c);
    cdf_tensor_release(sl);
    cdf_tensor_release(cat);
    cdf_tensor_release(p);
    return r;
}
static cdf_tensor *op_binary(cdf_tensor **in) { /* broadcast both ways, then every binary op */
    cdf_tensor *a = cdf_add(in[0], in[1]), *b = cdf_mul(a, in[1]), *c = cdf_sub(b, in[0]);
    cdf_tensor *d = cdf_maximum(c, in[0]), *e = cdf_affine(in[1], 0.5f, 2.0f), *f = cdf_div(d, e);
    cdf_tensor_release(a);
    cdf_tensor_release(b);
    cdf_tensor_release(c);
    cdf_tensor_release(d);
    cdf_tensor_release(e);
    return f;
}
static cdf_tensor *op_unary(cdf_tensor **in) { /* every unary op, summed so one diff covers all */
    cdf_tensor *x = in[0], *acc = cdf_gelu(x, CDF_GELU_TANH);
    cdf_tensor *(*ops[])(cdf_tensor *) = {cdf_neg, cdf_exp, cdf_sigmoid, cdf_tanh, cdf_silu, cdf_relu, cdf_quick_gelu};
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
        cdf_tensor *y = ops[i](x), *s = cdf_add(acc, y);
        cdf_tensor_release(y);
        cdf_tensor_release(acc);
        acc = s;
    }
    cdf_tensor *g = cdf_gelu(x, CDF_GELU_ERF), *ab = cdf_affine(x, 0.0f, 1.5f), *cl = cdf_clamp(x, -0.5f, 0.5f);
    cdf_tensor *pos = cdf_add(ab, cl); /* in [1, 2]: log/sqrt/rsqrt well defined */
    cdf_tensor *lg = cdf_log(pos), *sq = cdf_sqrt(pos), *rs = cdf_rsqrt(pos);
    cdf_tensor *parts[] = {g, lg, sq, rs};
    for (size_t i = 0; i < 4; i++) {
        cdf_tensor *s = cdf_add(acc, parts[i]);
        cdf_tensor_release(acc);
        cdf_tensor_release(parts[i]);
        acc = s;
    }
    cdf_tensor_release(ab);
    cdf_tensor_release(cl);
    cdf_tensor_release(pos);
    return acc;
}

static const op_case k_cases[] = {
    {"softmax", 1, {3}, {{3, 5, 33}}, .run = op_softmax},
    {"softmax(dim 1)", 1, {3}, {{2, 70, 3}}, .run = op_softmax_dim1},
    {"layer_norm", 3, {2, 1, 1}, {{6, 40}, {40}, {40}}, .run = op_layer_norm},
    {"layer_norm (no affine, 1500 cols)", 1, {2}, {{3, 1500}}, .run = op_layer_norm_plain},
    {"rms_norm", 2, {3, 1}, {{2, 3, 40}, {40}}, .run = op_rms_norm},
    {"group_norm", 3, {4, 1, 1}, {{2, 8, 5, 5}, {8}, {8}}, .run = op_group_norm},
    {"sum", 1, {3}, {{3, 7, 5}}, .run = op_sum},
    {"mean", 1, {3}, {{3, 7, 5}}, .run = op_mean},
    {"var", 1, {3}, {{3, 7, 5}}, .run = op_var},
    {"max", 1, {3}, {{3, 7, 5}}, .run = op_max},
    {"argmax", 1, {3}, {{3, 7, 5}}, .run = op_argmax},
    {"conv2d (groups 2, stride 2, pad 1, bias)", 3, {4, 4, 1}, {{2, 4, 9, 9}, {6, 2, 3, 3}, {6}}, .run = op_conv},
    {"conv2d (3x3 pad 1)", 2, {4, 4}, {{1, 3, 8, 7}, {5, 3, 3, 3}}, .run = op_conv_plain},
    {"upsample_nearest", 1, {4}, {{1, 3, 4, 5}}, .run = op_upsample},
    {"sdpa", 3, {4, 4, 4}, {{2, 3, 17, 16}, {2, 3, 23, 16}, {2, 3, 23, 8}}, .run = op_sdpa},
    {"sdpa (mask with -inf)", 4, {4, 4, 4, 4}, {{1, 2, 9, 32}, {1, 2, 40, 32}, {1, 2, 40, 32}, {1, 1, 9, 40}},
     .neg_inf_mask = true, .run = op_sdpa_mask},
    {"sdpa (strided views, head dim 128)", 3, {4, 4, 4}, {{1, 33, 2, 128}, {1, 33, 2, 128}, {1, 33, 2, 128}}, .run = op_sdpa_strided},
    {"rope", 3, {4, 2, 2}, {{1, 2, 6, 8}, {6, 8}, {6, 8}}, .run = op_rope},
    {"rope_tables", 1, {2}, {{7, 3}}, .run = op_rope_tables},
    {"timestep_embedding (odd dim)", 1, {1}, {{3}}, .run = op_temb},
    {"embedding", 2, {2, 1}, {{10, 6}, {4}}, .int_ids = {false, true}, .run = op_embedding},
    {"matmul (batched, transposed b)", 2, {3, 3}, {{2, 5, 7}, {2, 6, 7}}, .run = op_matmul_t},
    {"matmul (broadcast weight)", 2, {3, 2}, {{3, 4, 9}, {9, 5}}, .run = op_matmul_bcast},
    {"linear (bias)", 3, {2, 2, 1}, {{7, 33}, {12, 33}, {12}}, .run = op_linear},
    {"copies (transpose, slice, cat, pad, cast)", 1, {3}, {{4, 6, 3}}, .run = op_copies},
    {"binary (broadcast)", 2, {3, 2}, {{3, 1, 5}, {4, 1}}, .run = op_binary},
    {"unary", 1, {2}, {{5, 37}}, .run = op_unary},
};

/* The output of case c on device dev with dtype dt, read back as f32 (NULL + message on error). */
static float *run_case(const op_case *c, cdf_device *dev, cdf_dtype dt, int64_t *numel) {
    cdf_tensor *in[MAX_IN] = {0};
    for (int i = 0; i < c->n_in; i++) {
        int64_t n = 1;
        for (int d = 0; d < c->ndim[i]; d++) n *= c->shape[i][d];
        float *v = malloc(sizeof(float) * (size_t)(n ? n : 1));
        tu_fill_random(v, (size_t)n, 1000 + 17 * (uint64_t)i + (uint64_t)strlen(c->name));
        if (c->int_ids[i]) {
            int64_t *ids = malloc(sizeof(int64_t) * (size_t)n);
            for (int64_t k = 0; k < n; k++) ids[k] = (int64_t)((v[k] + 1.0f) * 4.99f);
            in[i] = cdf_tensor_from_host(dev, CDF_I64, c->ndim[i], c->shape[i], ids, CDF_I64);
            free(ids);
        } else {
            if (c->neg_inf_mask && i == 3)
                for (int64_t k = 0; k < n; k++) v[k] = (k % 5 == 1 || k % 40 >= 30) ? -INFINITY : v[k];
            in[i] = cdf_tensor_from_host(dev, dt, c->ndim[i], c->shape[i], v, CDF_F32);
        }
        free(v);
        assert_non_null(in[i]);
    }
    cdf_tensor *out = c->run(in);
    float *r = NULL;
    if (out) {
        *numel = cdf_tensor_numel(out);
        r = cdf_tensor_read_f32(out);
    }
    if (cdf_device_synchronize(dev) != CDF_OK) {
        free(r);
        r = NULL;
    }
    if (!r) print_message("  %s on %s: %s\n", c->name, cdf_device_name(dev), cdf_last_error());
    cdf_tensor_release(out);
    for (int i = 0; i < c->n_in; i++) cdf_tensor_release(in[i]);
    return r;
}

static cdf_device *device_under_test(void) {
    const char *name = getenv("CDIFFUSERS_TEST_DEVICE");
    return cdf_device_get(name && *name ? name : "cuda:0");
}

static void test_ops(void **state) {
    (void)state;
    cdf_device *dev = device_under_test(), *cpu = tu_cpu();
    if (!dev) {
        print_message("  no device under test (%s): skipped\n", cdf_last_error());
        skip();
    }
    int failures = 0;
    for (int dti = 0; dti < 2; dti++) {
        const cdf_dtype dt = dti ? CDF_BF16 : CDF_F32;
        const double tol = dti ? 3e-2 : 1e-4;
        for (size_t ci = 0; ci < sizeof k_cases / sizeof *k_cases; ci++) {
            const op_case *c = &k_cases[ci];
            int64_t n_ref = 0, n_dev = -1;
            float *ref = run_case(c, cpu, dt, &n_ref), *got = run_case(c, dev, dt, &n_dev);
            assert_non_null(ref);
            double worst = 0;
            bool ok = got && n_ref == n_dev;
            for (int64_t i = 0; ok && i < n_ref; i++) {
                if (isnan(ref[i]) != isnan(got[i]) || (isinf(ref[i]) && ref[i] != got[i])) {
                    worst = INFINITY;
                    break;
                }
                if (isfinite(ref[i])) /* relative above 1: outputs such as sums reach ~10 */
                    worst = fmax(worst, fabs((double)ref[i] - (double)got[i]) / fmax(1.0, fabs((double)ref[i])));
            }
            ok = ok && worst <= tol;
            print_message("  %-4s %-45s %s max rel|diff| %.3g (tol %.0e)\n", cdf_dtype_name(dt), c->name, ok ? "ok  " : "FAIL",
                          worst, tol);
            failures += !ok;
            free(ref);
            free(got);
        }
    }
    assert_int_equal(failures, 0);
}

/* A kernel error (an embedding id out of range, found on the device) surfaces at the next sync
 * with the op's name, and the device stays usable. */
static void test_error_at_sync(void **state) {
    (void)state;
    cdf_device *dev = device_under_test();
    if (!dev) skip();
    const int64_t ts[2] = {4, 3}, is[1] = {2};
    float table[12] = {0};
    const int64_t ids[2] = {1, 9};
    cdf_tensor *t = cdf_tensor_from_host(dev, CDF_F32, 2, ts, table, CDF_F32);
    cdf_tensor *i = cdf_tensor_from_host(dev, CDF_I64, 1, is, ids, CDF_I64);
    cdf_tensor *o = cdf_embedding(t, i);
    cdf_status s = o ? cdf_device_synchronize(dev) : cdf_last_status();
    assert_int_not_equal(s, CDF_OK);
    assert_non_null(strstr(cdf_last_error(), "9"));
    cdf_tensor_release(o);
    cdf_tensor_release(i);
    cdf_tensor_release(t);
    assert_int_equal(cdf_device_synchronize(dev), CDF_OK); /* collected once; the device still works */
    cdf_tensor *z = cdf_tensor_zeros(dev, CDF_F32, 2, ts);
    assert_non_null(z);
    float *r = cdf_tensor_read_f32(z);
    assert_non_null(r);
    assert_true(r[11] == 0.0f);
    free(r);
    cdf_tensor_release(z);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_ops), cmocka_unit_test(test_error_at_sync)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
