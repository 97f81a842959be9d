/* `cdiffusers run-model` (the interface outside checks and benchmarks use) reproduces golden
 * components end to end through the CLI: read io.safetensors, run, write out.*, compare. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdiffusers/cdiffusers.h"

static double compare(const char *ours_path, const char *golden_path, const char *key) {
    cdf_st_file *a, *b;
    assert_int_equal(cdf_st_open(ours_path, &a), CDF_OK);
    assert_int_equal(cdf_st_open(golden_path, &b), CDF_OK);
    const cdf_st_tensor *ta = cdf_st_find(a, key), *tb = cdf_st_find(b, key);
    assert_non_null(ta);
    assert_non_null(tb);
    assert_int_equal(cdf_st_numel(ta), cdf_st_numel(tb));
    size_t n = (size_t)cdf_st_numel(ta);
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    cdf_convert(x, CDF_F32, cdf_st_data(a, ta), ta->dtype, n);
    cdf_convert(y, CDF_F32, cdf_st_data(b, tb), tb->dtype, n);
    double d = tu_max_abs_diff(x, y, n, NULL);
    free(x);
    free(y);
    cdf_st_close(a);
    cdf_st_close(b);
    return d;
}

static void run_case(const char *model_rel, const char *io_rel, const char *method, const char *key, double tol,
                     const char *extra) {
    char out[512];
    snprintf(out, sizeof out, "%s/out_%s_%s.safetensors", tu_tmpdir(), method, key);
    int rc = tu_system("%s run-model --model %s --inputs %s --output %s --method %s --force %s", CDF_CLI_PATH,
                       tu_data(model_rel), tu_data(io_rel), out, method, extra);
    assert_int_equal(rc, 0);
    double d = compare(out, tu_data(io_rel), key);
    print_message("  run-model %s %s: max|diff| = %.3g (tol %.1g)\n", model_rel, key, d, tol);
    assert_true(d <= tol);
}

/* tolerances: golden README ("Tolerances observed"): transformers with our own exp table 3e-4
 * (schnell measured 6e-6), VAE 2e-5 — for the exact path, --dtype f32 (the default is bf16
 * compute); the bf16 default itself at the bf16-compute bound of test_model_flux.c (0.11). */
static void test_flux_schnell(void **s) { (void)s; run_case("golden/flux1_schnell/transformer", "golden/flux1_schnell/io.safetensors", "forward", "out.sample", 5e-5, "--dtype f32"); }
static void test_flux_dev_bf16(void **s) { (void)s; run_case("golden/flux1_dev/transformer_bf16", "golden/flux1_dev/io_bf16.safetensors", "forward", "out.sample", 3e-4, "--dtype f32"); }
static void test_flux_dev_bf16_default(void **s) { (void)s; run_case("golden/flux1_dev/transformer_bf16", "golden/flux1_dev/io_bf16.safetensors", "forward", "out.sample", 0.11, ""); }
static void test_sd35m(void **s) { (void)s; run_case("golden/sd35m/transformer", "golden/sd35m/io.safetensors", "forward", "out.sample", 3e-4, "--dtype f32"); }
static void test_vae_decode(void **s) { (void)s; run_case("golden/vae_kl16/vae", "golden/vae_kl16/io.safetensors", "decode", "out.decode_sample", 2e-5, "--dtype f32"); }
static void test_vae_encode(void **s) { (void)s; run_case("golden/vae_kl16/vae", "golden/vae_kl16/io.safetensors", "encode", "out.encode_mean", 2e-5, "--dtype f32"); }

static void test_repeat_prints_forward_ms(void **s) {
    (void)s;
    char out[512], err[512];
    snprintf(out, sizeof out, "%s/rep.safetensors", tu_tmpdir());
    snprintf(err, sizeof err, "%s/rep.err", tu_tmpdir());
    int rc = tu_system("%s run-model --model %s --inputs %s --output %s --repeat 3 --force 2>%s", CDF_CLI_PATH,
                       tu_data("golden/flux1_schnell/transformer"), tu_data("golden/flux1_schnell/io.safetensors"), out, err);
    assert_int_equal(rc, 0);
    char *txt = tu_read_file(err, NULL);
    assert_non_null(txt);
    int n = 0;
    for (char *p = txt; (p = strstr(p, "forward_ms=")); p++) n++;
    assert_int_equal(n, 3);
    free(txt);
}

static void test_unknown_class(void **s) {
    (void)s;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/unknown_model", tu_tmpdir());
    tu_system("mkdir -p %s && echo '{\"_class_name\": \"UNet2DConditionModel\"}' > %s/config.json", dir, dir);
    char err[600];
    snprintf(err, sizeof err, "%s/unknown.err", tu_tmpdir());
    int rc = tu_system("%s run-model --model %s --inputs %s --output %s/x.safetensors 2>%s", CDF_CLI_PATH, dir,
                       tu_data("golden/flux1_schnell/io.safetensors"), dir, err);
    assert_int_equal(rc, 1);
    char *txt = tu_read_file(err, NULL);
    assert_non_null(strstr(txt, "UNet2DConditionModel"));
    assert_non_null(strstr(txt, "not supported"));
    free(txt);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flux_schnell), cmocka_unit_test(test_flux_dev_bf16), cmocka_unit_test(test_flux_dev_bf16_default),
        cmocka_unit_test(test_sd35m),
        cmocka_unit_test(test_vae_decode),   cmocka_unit_test(test_vae_encode),    cmocka_unit_test(test_repeat_prints_forward_ms),
        cmocka_unit_test(test_unknown_class),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
