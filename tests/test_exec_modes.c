/* Execution modes: defer-and-fuse records ops and runs them (fused) at sync points, with
 * results bit-identical to eager. Expected values are the eager results of the same ops (an
 * independent path: one kernel per op, every intermediate stored). */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cdiffusers/cdiffusers.h"

static cdf_tensor *rnd(int ndim, const int64_t *shape, uint64_t seed, cdf_dtype dt) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    float *v = malloc(n * sizeof *v);
    tu_fill_random(v, n, seed);
    cdf_tensor *t = cdf_tensor_from_host(tu_cpu(), dt, ndim, shape, v, CDF_F32);
    free(v);
    return t;
}

/* AdaLN-style modulation and a gated residual, as the DiT blocks do: x*(1+scale)+shift,
 * gelu(tanh), then res + gate*y — broadcasting over tokens. */
static float *block_like(int64_t B, int64_t L, int64_t D, cdf_dtype in_dt) {
    cdf_scope_push();
    int64_t xs[3] = {B, L, D}, ms[3] = {B, 1, D};
    /* x in the given dtype; modulation f32 (bf16 intermediates would be rounded, so they are not fused) */
    cdf_tensor *x = rnd(3, xs, 1, in_dt), *scale = rnd(3, ms, 2, CDF_F32), *shift = rnd(3, ms, 3, CDF_F32);
    cdf_tensor *gate = rnd(3, ms, 4, CDF_F32), *res = rnd(3, xs, 5, CDF_F32);
    cdf_tensor *h = cdf_add(cdf_mul(x, cdf_add_scalar(scale, 1.0f)), shift);
    cdf_tensor *y = cdf_gelu(cdf_silu(h), CDF_GELU_TANH);
    cdf_tensor *out = cdf_add(res, cdf_mul(gate, cdf_scale(y, 0.5f)));
    /* release every intermediate before the sync point, as a model forward does: only then
     * may they be fused away */
    cdf_scope_pop(&out, 1);
    float *r = cdf_tensor_read_f32(out);
    assert_non_null(r);
    cdf_tensor_release(out);
    return r;
}

static void check_bitwise_equal_to_eager(int64_t B, int64_t L, int64_t D, cdf_dtype dt) {
    assert_int_equal(cdf_exec_set_mode(CDF_EXEC_EAGER), CDF_OK);
    float *eager = block_like(B, L, D, dt);
    assert_int_equal(cdf_exec_set_mode(CDF_EXEC_DEFER_AND_FUSE), CDF_OK);
    cdf_exec_stats s0, s1;
    cdf_exec_get_stats(&s0);
    float *fused = block_like(B, L, D, dt);
    cdf_exec_get_stats(&s1);
    assert_memory_equal(eager, fused, (size_t)(B * L * D) * sizeof(float));
    /* the chain was really fused: fewer kernels than ops */
    assert_true(s1.fused_kernels > s0.fused_kernels);
    assert_true(s1.kernels_launched - s0.kernels_launched < s1.ops - s0.ops);
    free(eager);
    free(fused);
    assert_int_equal(cdf_exec_set_mode(CDF_EXEC_EAGER), CDF_OK);
}

static void test_fused_equals_eager_f32(void **s) { (void)s; check_bitwise_equal_to_eager(2, 37, 65, CDF_F32); }
static void test_fused_equals_eager_bf16_inputs(void **s) { (void)s; check_bitwise_equal_to_eager(1, 129, 33, CDF_BF16); }
static void test_fused_equals_eager_large(void **s) { (void)s; check_bitwise_equal_to_eager(1, 300, 256, CDF_F32); }

static void test_defer_records_until_sync(void **state) {
    (void)state;
    cdf_device *d = tu_cpu();
    assert_int_equal(cdf_exec_set_mode(CDF_EXEC_DEFER_AND_FUSE), CDF_OK);
    cdf_scope_push();
    int64_t s[1] = {1000};
    cdf_tensor *x = rnd(1, s, 9, CDF_F32);
    assert_int_equal(cdf_device_synchronize(d), CDF_OK);
    cdf_queue_stats q0, q1, q2;
    cdf_device_queue_stats(d, &q0);
    cdf_tensor *y = cdf_exp(x);
    cdf_tensor *z = cdf_scale(y, 2.0f);
    cdf_device_queue_stats(d, &q1);
    assert_int_equal(q1.enqueued, q0.enqueued); /* recorded, not enqueued */
    /* y is still held by the caller: it must not be fused away */
    float vy, vz;
    cdf_tensor *y0 = cdf_narrow(y, 0, 7, 1), *z0 = cdf_narrow(z, 0, 7, 1);
    assert_int_equal(cdf_tensor_read(z0, CDF_F32, &vz, sizeof vz), CDF_OK); /* sync point */
    cdf_device_queue_stats(d, &q2);
    assert_true(q2.enqueued >= q0.enqueued + 2);
    assert_int_equal(cdf_tensor_read(y0, CDF_F32, &vy, sizeof vy), CDF_OK);
    float vx;
    cdf_tensor *x0 = cdf_narrow(x, 0, 7, 1);
    assert_int_equal(cdf_tensor_read(x0, CDF_F32, &vx, sizeof vx), CDF_OK);
    assert_float_equal(vy, expf(vx), 0);
    assert_float_equal(vz, 2.0f * expf(vx), 0);
    cdf_scope_pop(NULL, 0);
    assert_int_equal(cdf_exec_set_mode(CDF_EXEC_EAGER), CDF_OK);
}

static void test_errors_still_surface(void **state) {
    (void)state;
    cdf_device *d = tu_cpu();
    assert_int_equal(cdf_exec_set_mode(CDF_EXEC_DEFER_AND_FUSE), CDF_OK);
    cdf_scope_push();
    int64_t ts[2] = {4, 3}, is[1] = {2};
    int64_t ids[2] = {1, 40};
    cdf_tensor *e = cdf_embedding(cdf_tensor_zeros(d, CDF_F32, 2, ts), cdf_tensor_from_host(d, CDF_I64, 1, is, ids, CDF_I64));
    assert_non_null(e);
    assert_int_equal(cdf_device_synchronize(d), CDF_ERR_DEVICE);
    assert_non_null(strstr(cdf_last_error(), "40"));
    assert_int_equal(cdf_device_synchronize(d), CDF_OK);
    cdf_scope_pop(NULL, 0);
    assert_int_equal(cdf_exec_set_mode(CDF_EXEC_EAGER), CDF_OK);
}

/* whole golden pipeline: identical image bytes in both modes, with fused kernels */
static void test_pipeline_identical_in_both_modes(void **state) {
    (void)state;
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/flux1_dev_tiny", tu_data("pipelines"));
    cdf_pipeline *p = NULL;
    assert_int_equal(cdf_pipeline_load(dir, NULL, &p), CDF_OK);
    cdf_generate_params gp = cdf_generate_params_default();
    gp.prompt = "a capybara";
    gp.height = gp.width = 64;
    gp.num_inference_steps = 3;
    gp.max_sequence_length = 32;
    gp.seed = 5;
    cdf_image a, b;
    assert_int_equal(cdf_exec_set_mode(CDF_EXEC_EAGER), CDF_OK);
    assert_int_equal(cdf_pipeline_generate(p, &gp, &a), CDF_OK);
    assert_int_equal(cdf_exec_set_mode(CDF_EXEC_DEFER_AND_FUSE), CDF_OK);
    cdf_exec_stats s0, s1;
    cdf_exec_get_stats(&s0);
    assert_int_equal(cdf_pipeline_generate(p, &gp, &b), CDF_OK);
    cdf_exec_get_stats(&s1);
    assert_int_equal(cdf_exec_set_mode(CDF_EXEC_EAGER), CDF_OK);
    print_message("  defer-and-fuse: %llu ops -> %llu kernels (%llu fused kernels absorbing %llu ops), %llu flushes\n",
                  (unsigned long long)(s1.ops - s0.ops), (unsigned long long)(s1.kernels_launched - s0.kernels_launched),
                  (unsigned long long)(s1.fused_kernels - s0.fused_kernels), (unsigned long long)(s1.fused_ops - s0.fused_ops),
                  (unsigned long long)(s1.flushes - s0.flushes));
    assert_true(s1.fused_kernels > s0.fused_kernels);
    assert_memory_equal(a.pixels, b.pixels, (size_t)a.width * a.height * 3);
    cdf_image_free(&a);
    cdf_image_free(&b);
    cdf_pipeline_free(p);
}

/* Under a device budget, deferred ops still hold buffers the host released: the allocator runs
 * the pending graph (which frees them) before declaring out-of-memory, so a workload that fits
 * in eager mode also fits in defer-and-fuse. */
static void test_defer_under_budget(void **state) {
    (void)state;
    cdf_device *d = tu_cpu();
    assert_int_equal(cdf_exec_set_mode(CDF_EXEC_DEFER_AND_FUSE), CDF_OK);
    assert_int_equal(cdf_device_synchronize(d), CDF_OK);
    cdf_memory_stats m0;
    cdf_device_memory_stats(d, &m0);
    int64_t n[1] = {1 << 20}; /* 4 MiB */
    cdf_tensor *x = cdf_tensor_zeros(d, CDF_F32, 1, n);
    assert_non_null(x);
    assert_int_equal(cdf_device_set_memory_limit(d, m0.current_bytes + (12u << 20)), CDF_OK);
    for (int i = 0; i < 10; i++) {
        cdf_tensor *y = cdf_exp(x); /* each output: 4 MiB, released at once but held by the graph */
        if (!y) fail_msg("iteration %d: %s", i, cdf_last_error());
        cdf_tensor_release(y);
    }
    assert_int_equal(cdf_device_synchronize(d), CDF_OK);
    assert_int_equal(cdf_device_set_memory_limit(d, 0), CDF_OK);
    cdf_tensor_release(x);
    assert_int_equal(cdf_exec_set_mode(CDF_EXEC_EAGER), CDF_OK);
}

/* A chain of 24 elementwise ops on 16 MiB tensors inside a scope (384 MiB of outputs, every one
 * held by the scope, as a model block holds its intermediates): the pending graph must not run
 * mid-scope on recorded bytes (the intermediates are still referenced, so nothing could be fused),
 * but at the scope's close, as one fused kernel; bit-identical to eager. */
static float *long_chain(int64_t n, cdf_exec_stats *inside, cdf_exec_stats *at_close) {
    cdf_scope_push();
    cdf_tensor *x = rnd(1, (int64_t[]){n}, 21, CDF_F32);
    assert_int_equal(cdf_device_synchronize(tu_cpu()), CDF_OK);
    cdf_exec_stats s0;
    cdf_exec_get_stats(&s0);
    cdf_tensor *y = x;
    for (int i = 0; i < 24; i++) y = i % 2 ? cdf_scale(y, 0.75f) : cdf_add_scalar(y, 0.125f);
    cdf_exec_get_stats(inside);
    inside->flushes -= s0.flushes;
    cdf_scope_pop(&y, 1);
    cdf_exec_get_stats(at_close);
    at_close->flushes -= s0.flushes;
    float *r = cdf_tensor_read_f32(y);
    assert_non_null(r);
    cdf_tensor_release(y);
    return r;
}

static void test_flush_at_scope_close(void **state) {
    (void)state;
    const int64_t n = (int64_t)1 << 22;
    cdf_exec_stats in_eager, in_defer, closed, s0, s1;
    assert_int_equal(cdf_exec_set_mode(CDF_EXEC_EAGER), CDF_OK);
    float *want = long_chain(n, &in_eager, &closed);
    assert_int_equal(cdf_exec_set_mode(CDF_EXEC_DEFER_AND_FUSE), CDF_OK);
    cdf_exec_get_stats(&s0);
    float *got = long_chain(n, &in_defer, &closed);
    cdf_exec_get_stats(&s1);
    assert_int_equal(in_defer.flushes, 0); /* 384 MiB recorded, all still referenced: no flush */
    assert_int_equal(closed.flushes, 1); /* run at the close (a block's end), before any read */
    assert_int_equal(s1.fused_ops - s0.fused_ops, 24); /* the whole chain in one kernel */
    assert_memory_equal(want, got, (size_t)n * sizeof *want);
    free(want);
    free(got);

    /* outputs dropped at once, no scope: what deferring holds is bounded (256 MiB), so 40 of
     * them (640 MiB) run before the sync */
    cdf_tensor *x = rnd(1, (int64_t[]){n}, 22, CDF_F32);
    assert_int_equal(cdf_device_synchronize(tu_cpu()), CDF_OK);
    cdf_exec_get_stats(&s0);
    for (int i = 0; i < 40; i++) cdf_tensor_release(cdf_exp(x));
    cdf_exec_get_stats(&s1);
    assert_true(s1.flushes > s0.flushes);
    assert_int_equal(cdf_device_synchronize(tu_cpu()), CDF_OK);
    cdf_tensor_release(x);
    assert_int_equal(cdf_exec_set_mode(CDF_EXEC_EAGER), CDF_OK);
}

/* the environment switch selects the mode at startup */
static void test_env_switch(void **state) {
    (void)state;
    assert_int_equal(tu_system("CDIFFUSERS_DEFER_AND_FUSE=1 /proc/%d/exe --print-mode | grep -q defer-and-fuse", (int)getpid()), 0);
    assert_int_equal(tu_system("CDIFFUSERS_DEFER_AND_FUSE=1 CDIFFUSERS_EAGER_MODE=defer_never /proc/%d/exe --print-mode | grep -q eager", (int)getpid()), 0);
    assert_int_equal(tu_system("env -u CDIFFUSERS_DEFER_AND_FUSE -u CDIFFUSERS_EAGER_MODE /proc/%d/exe --print-mode | grep -q eager", (int)getpid()), 0);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--print-mode") == 0) {
        puts(cdf_exec_mode_name(cdf_exec_get_mode()));
        return 0;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fused_equals_eager_f32),   cmocka_unit_test(test_fused_equals_eager_bf16_inputs),
        cmocka_unit_test(test_fused_equals_eager_large), cmocka_unit_test(test_defer_records_until_sync),
        cmocka_unit_test(test_errors_still_surface),     cmocka_unit_test(test_pipeline_identical_in_both_modes),
        cmocka_unit_test(test_env_switch),
        cmocka_unit_test(test_defer_under_budget),       cmocka_unit_test(test_flush_at_scope_close),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
