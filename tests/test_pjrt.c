/* The pjrt backend beyond the op suite (test_backend_ops runs every op on it): what a user meets
 * first and what must never crash.
 *  - bad plugins: a missing file, a file that is no shared library, a library without
 *    GetPjrtApi, a plugin of another PJRT major version: a clear error naming the path and
 *    CDIFFUSERS_PJRT_PLUGIN (each in its own process: a backend loads once per process);
 *  - a program the plugin refuses: an error naming the op with the plugin's message, the device
 *    usable afterwards (no abort);
 *  - device memory exhausted: the budget's out-of-memory error, as on the cpu backend;
 *  - the disk cache across processes: a second process compiles nothing; a corrupt entry is
 *    compiled again with a warning;
 *  - the default model's picture on pjrt within 12/255 of the cpu backend's (same dtype).
 * Skipped (77) in a build without the pjrt backend or without the XLA CPU plugin. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "cdiffusers/cdiffusers.h"
#include "testutil.h"
#ifdef CDF_HAVE_PJRT
#include "backend/pjrt/pjrt_cache.h"
#endif

static const char *cli(void) { return CDF_CLI_PATH; }

/* run the CLI with env prefix `env` and args; stderr into err (malloc'd); returns the exit code */
static int run_cli(const char *env, const char *args, char **err) {
    const char *log = tu_tmp_path("cli_stderr.txt");
    int rc = tu_system("env %s '%s' %s > /dev/null 2> '%s'", env, cli(), args, log);
    size_t n = 0;
    *err = tu_read_file(log, &n);
    if (!*err) *err = strdup("");
    return rc;
}

static void expect_plugin_error(const char *plugin, const char *must_say) {
    char env[1400], *err = NULL;
    snprintf(env, sizeof env, "CDIFFUSERS_PJRT_PLUGIN='%s' CDIFFUSERS_PJRT_CACHE=off", plugin);
    int rc = run_cli(env, "generate --device pjrt --prompt 'a red circle on a blue background' --steps 1 --output /dev/null --force", &err);
    printf("  %s -> rc %d: %s", plugin, rc, err);
    assert_int_not_equal(rc, 0);
    assert_non_null(strstr(err, plugin));
    assert_non_null(strstr(err, "CDIFFUSERS_PJRT_PLUGIN"));
    assert_non_null(strstr(err, must_say));
    assert_null(strstr(err, "Segmentation")); /* a message, not a crash */
    free(err);
}

static void test_bad_plugins(void **state) {
    (void)state;
    expect_plugin_error("/nonexistent/pjrt_plugin.so", "does not exist");
    const char *text = tu_tmp_path("not_a_library.so");
    assert_int_equal(tu_write_file(text, "this is not a shared library\n", 29), 0);
    expect_plugin_error(text, "cannot load PJRT plugin");
    /* a real shared library without GetPjrtApi: the fake plugin's sibling, the test helper library */
    expect_plugin_error(CDF_NOT_A_PLUGIN_LIB, "no GetPjrtApi");
    expect_plugin_error(CDF_FAKE_PJRT_PLUGIN, "major version");
}

#ifdef CDF_HAVE_PJRT
static void break_program(char *text, size_t len) {
    /* an op no StableHLO version has: the plugin's parser refuses the module */
    char *p = strstr(text, "\"stablehlo.");
    if (p && (size_t)(p - text) + 12 < len) memcpy(p + 1, "nosuchdialect", 12);
}

static void test_refused_program(void **state) {
    (void)state;
    cdf_device *d = cdf_device_get("pjrt");
    assert_non_null(d);
    float x[6] = {1, 2, 3, 4, 5, 6};
    cdf_pjrt_cache_test_hook = break_program;
    cdf_tensor *t = cdf_tensor_from_host(d, CDF_F32, 2, (int64_t[]){2, 3}, x, CDF_F32);
    cdf_tensor *y = cdf_exp(t);
    cdf_status s = y ? cdf_device_synchronize(d) : cdf_last_status();
    float out[6];
    if (s == CDF_OK) s = cdf_tensor_read(y, CDF_F32, out, sizeof out);
    cdf_pjrt_cache_test_hook = NULL;
    printf("  refused: %s\n", cdf_last_error());
    assert_int_not_equal(s, CDF_OK);
    assert_non_null(strstr(cdf_last_error(), "refused"));
    assert_non_null(strstr(cdf_last_error(), "unary"));
    cdf_tensor_release(y);
    /* the device still works */
    assert_int_equal(cdf_device_synchronize(d), CDF_OK);
    cdf_tensor *z = cdf_scale(t, 2.0f);
    assert_non_null(z);
    assert_int_equal(cdf_tensor_read(z, CDF_F32, out, sizeof out), CDF_OK);
    assert_true(out[5] == 12.0f);
    cdf_tensor_release(z);
    cdf_tensor_release(t);
}
#endif

static void test_out_of_memory(void **state) {
    (void)state;
    cdf_device *d = cdf_device_get("pjrt");
    assert_non_null(d);
    assert_int_equal(cdf_device_set_memory_limit(d, 1 << 20), CDF_OK);
    cdf_tensor *big = cdf_tensor_empty(d, CDF_F32, 2, (int64_t[]){1024, 1024});
    assert_null(big);
    printf("  oom: %s\n", cdf_last_error());
    assert_int_equal(cdf_last_status(), CDF_ERR_OUT_OF_MEMORY);
    assert_non_null(strstr(cdf_last_error(), "pjrt:0"));
    assert_int_equal(cdf_device_set_memory_limit(d, 0), CDF_OK);
    cdf_tensor *ok = cdf_tensor_empty(d, CDF_F32, 2, (int64_t[]){1024, 1024});
    assert_non_null(ok);
    cdf_tensor_release(ok);
}

/* the number in "programs: N compiled, M loaded from the disk cache" */
static long count_of(const char *err, const char *what) {
    const char *p = strstr(err, "programs: ");
    if (!p) return -1;
    if (!strcmp(what, "compiled")) return strtol(p + 10, NULL, 10);
    p = strstr(p, "compiled, ");
    return p ? strtol(p + 10, NULL, 10) : -1;
}

static void test_disk_cache_across_processes(void **state) {
    (void)state;
    const char *dir = tu_tmp_path("pjrt_cache");
    assert_int_equal(tu_system("rm -rf '%s'", dir), 0);
    char env[1200];
    snprintf(env, sizeof env, "CDIFFUSERS_PJRT_CACHE='%s' CDIFFUSERS_LOG=pjrt", dir);
    const char *args = "generate --device pjrt --prompt 'a small red circle on a blue background' --steps 2 --output /dev/null --force";
    char *e1 = NULL, *e2 = NULL, *e3 = NULL;
    assert_int_equal(run_cli(env, args, &e1), 0);
    assert_int_equal(run_cli(env, args, &e2), 0);
    long c1 = count_of(e1, "compiled"), c2 = count_of(e2, "compiled"), h2 = count_of(e2, "disk");
    printf("  first process: %ld compiled; second: %ld compiled, %ld from disk\n", c1, c2, h2);
    assert_true(c1 > 0);
    assert_int_equal(c2, 0);
    assert_int_equal(h2, c1);
    /* a corrupt entry: compiled again with a warning, the picture still made */
    assert_int_equal(tu_system("f=$(ls '%s'/*.pjrtx | head -1) && head -c 100 \"$f\" > \"$f.t\" && mv \"$f.t\" \"$f\"", dir), 0);
    assert_int_equal(run_cli(env, args, &e3), 0);
    printf("  after corrupting one entry: %ld compiled\n", count_of(e3, "compiled"));
    assert_non_null(strstr(e3, "unusable"));
    assert_int_equal(count_of(e3, "compiled"), 1);
    /* nothing half-written is left behind */
    assert_int_equal(tu_system("! ls '%s' | grep -q tmp", dir), 0);
    /* cdiffusers cache list | clear */
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "CDIFFUSERS_PJRT_CACHE='%s' '%s' cache list | tail -1 | grep -q '%s: %ld programs'", dir, cli(), dir, c1);
    assert_int_equal(tu_system("%s", cmd), 0);
    snprintf(cmd, sizeof cmd, "CDIFFUSERS_PJRT_CACHE='%s' '%s' cache clear | grep -q 'removed %ld programs'", dir, cli(), c1);
    assert_int_equal(tu_system("%s", cmd), 0);
    assert_int_equal(tu_system("! ls '%s'/*.pjrtx > /dev/null 2>&1", dir), 0);
    free(e1);
    free(e2);
    free(e3);
}

static void test_default_model_picture(void **state) {
    (void)state;
    const char *a = tu_tmp_path("tri_cpu.png"), *b = tu_tmp_path("tri_pjrt.png");
    char args[1400], *err = NULL;
    const char *prompt = "--prompt 'a large yellow triangle on a purple background'";
    snprintf(args, sizeof args, "generate --device cpu %s --output '%s' --force", prompt, a);
    assert_int_equal(run_cli("CDIFFUSERS_TEST=1", args, &err), 0);
    free(err);
    snprintf(args, sizeof args, "generate --device pjrt %s --output '%s' --force", prompt, b);
    char env[1200];
    snprintf(env, sizeof env, "CDIFFUSERS_TEST=1 CDIFFUSERS_PJRT_CACHE='%s'", tu_tmp_path("pjrt_cache")); /* not ~/.cache */
    assert_int_equal(run_cli(env, args, &err), 0);
    free(err);
    cdf_png_image x, y;
    assert_int_equal(cdf_png_read(a, &x), CDF_OK);
    assert_int_equal(cdf_png_read(b, &y), CDF_OK);
    assert_int_equal(x.width, y.width);
    assert_int_equal(x.height, y.height);
    assert_int_equal(x.channels, y.channels);
    int worst = 0;
    double sum = 0;
    const size_t n = (size_t)x.width * x.height * x.channels;
    for (size_t i = 0; i < n; i++) {
        int d = abs((int)x.pixels[i] - (int)y.pixels[i]);
        worst = d > worst ? d : worst;
        sum += d;
    }
    printf("  default model, pjrt vs cpu: max |diff| %d/255, mean %.3f\n", worst, sum / (double)n);
    assert_true(worst <= 12);
    cdf_png_image_free(&x);
    cdf_png_image_free(&y);
}

int main(void) {
    bool built = false;
    for (int i = 0; i < cdf_backend_compiled_count(); i++) built |= !strcmp(cdf_backend_compiled_name(i), "pjrt");
    if (!built) {
        printf("test_pjrt: skipped (this build has no pjrt backend: scripts/install-deps.sh installs its header)\n");
        return 77;
    }
    if (!cdf_device_get("pjrt")) {
        printf("test_pjrt: skipped (%s)\n", cdf_last_error());
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_plugins),
#ifdef CDF_HAVE_PJRT
        cmocka_unit_test(test_refused_program),
#endif
        cmocka_unit_test(test_out_of_memory),
        cmocka_unit_test(test_disk_cache_across_processes),
        cmocka_unit_test(test_default_model_picture),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
