/* JSON loading limits and typed getters. Expected config values come from the golden io.json
 * (its "config" object, parsed here with plain cJSON), not from the code under test. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cdiffusers/io.h"
#include "io/json.h"

static const char *write_json(const char *name, const char *text) {
    const char *p = tu_tmp_path(name);
    assert_int_equal(tu_write_file(p, text, strlen(text)), 0);
    return p;
}

#define ASSERT_ERR(expr, status, substring)                                                        \
    do {                                                                                           \
        cdf_status s_ = (expr);                                                                    \
        if (s_ != (status) || !strstr(cdf_last_error(), (substring)))                              \
            print_error("got %d: %s\n", s_, cdf_last_error());                                     \
        assert_int_equal(s_, (status));                                                            \
        assert_non_null(strstr(cdf_last_error(), (substring)));                                    \
    } while (0)

static void test_golden_config(void **state) {
    (void)state;
    const char *path = tu_data("io/vae_kl16_bf16/config.json");
    cJSON *cfg = NULL;
    assert_int_equal(cdf_json_load_file(path, &cfg), CDF_OK);
    assert_non_null(cfg);
    /* reference values: golden io.json["config"], read with raw cJSON */
    size_t n;
    char *text = tu_read_file(tu_data("io/vae_kl16_io.json"), &n);
    cJSON *io = cJSON_Parse(text);
    free(text);
    const cJSON *ref = cJSON_GetObjectItem(io, "config");
    assert_non_null(ref);

    int64_t v;
    const char *ints[] = {"in_channels", "out_channels", "latent_channels", "layers_per_block", "norm_num_groups",
                          "sample_size"};
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++) {
        assert_int_equal(cdf_json_get_int(cfg, ints[i], -1, &v), CDF_OK);
        assert_int_equal(v, (int64_t)cJSON_GetObjectItem(ref, ints[i])->valuedouble);
    }
    double d;
    assert_int_equal(cdf_json_get_double(cfg, "scaling_factor", 0, &d), CDF_OK);
    assert_true(d == cJSON_GetObjectItem(ref, "scaling_factor")->valuedouble);
    assert_int_equal(cdf_json_get_double(cfg, "shift_factor", 0, &d), CDF_OK);
    assert_true(d == cJSON_GetObjectItem(ref, "shift_factor")->valuedouble);
    bool b;
    assert_int_equal(cdf_json_get_bool(cfg, "force_upcast", false, &b), CDF_OK);
    assert_int_equal(b, cJSON_IsTrue(cJSON_GetObjectItem(ref, "force_upcast")));
    assert_int_equal(cdf_json_get_bool(cfg, "use_quant_conv", true, &b), CDF_OK);
    assert_int_equal(b, cJSON_IsTrue(cJSON_GetObjectItem(ref, "use_quant_conv")));
    const char *s;
    assert_int_equal(cdf_json_get_string(cfg, "act_fn", NULL, &s), CDF_OK);
    assert_string_equal(s, cJSON_GetObjectItem(ref, "act_fn")->valuestring);
    int64_t ch[8];
    int nch;
    assert_int_equal(cdf_json_get_int_array(cfg, "block_out_channels", ch, 8, &nch), CDF_OK);
    const cJSON *rch = cJSON_GetObjectItem(ref, "block_out_channels");
    assert_int_equal(nch, cJSON_GetArraySize(rch));
    for (int i = 0; i < nch; i++) assert_int_equal(ch[i], (int64_t)cJSON_GetArrayItem(rch, i)->valuedouble);
    /* "latents_mean": null -> default */
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(ref, "latents_mean")));
    double lm[4];
    int nlm = 7;
    assert_int_equal(cdf_json_get_double_array(cfg, "latents_mean", lm, 4, &nlm), CDF_OK);
    assert_int_equal(nlm, 0);
    assert_false(cdf_json_has(cfg, "latents_mean"));
    assert_true(cdf_json_has(cfg, "act_fn"));
    /* absent -> default */
    assert_int_equal(cdf_json_get_int(cfg, "no_such_key", 77, &v), CDF_OK);
    assert_int_equal(v, 77);
    assert_int_equal(cdf_json_get_string(cfg, "no_such_key", NULL, &s), CDF_OK);
    assert_null(s);
    /* wrong type on the root names the key and the file */
    ASSERT_ERR(cdf_json_get_int(cfg, "act_fn", 0, &v), CDF_ERR_FORMAT, "'act_fn'");
    assert_non_null(strstr(cdf_last_error(), path));
    assert_non_null(strstr(cdf_last_error(), "expected an integer, got a string"));
    cJSON_Delete(io);
    cJSON_Delete(cfg);
}

static void test_getter_errors(void **state) {
    (void)state;
    const char *path = write_json("getters.json",
                                  "{\"big\": 1e300, \"over53\": 9007199254740993, \"max53\": 9007199254740991,"
                                  " \"neg\": -5, \"frac\": 2.5, \"str\": \"3\", \"t\": true, \"nul\": null,"
                                  " \"inf\": 1e999, \"whole\": 3.0, \"arr\": [1, 2, 3], \"mixed\": [1, \"x\"],"
                                  " \"darr\": [0.5, -1e-3, 7], \"inner\": {\"k\": \"v\"}}");
    cJSON *j;
    assert_int_equal(cdf_json_load_file(path, &j), CDF_OK);
    int64_t v = 42;
    ASSERT_ERR(cdf_json_get_int(j, "big", 0, &v), CDF_ERR_FORMAT, "'big'");
    assert_non_null(strstr(cdf_last_error(), "too large"));
    assert_non_null(strstr(cdf_last_error(), path));
    ASSERT_ERR(cdf_json_get_int(j, "over53", 0, &v), CDF_ERR_FORMAT, "below 2^53");
    assert_int_equal(v, 42); /* untouched on error */
    assert_int_equal(cdf_json_get_int(j, "max53", 0, &v), CDF_OK);
    assert_int_equal(v, 9007199254740991LL);
    assert_int_equal(cdf_json_get_int(j, "neg", 0, &v), CDF_OK);
    assert_int_equal(v, -5);
    assert_int_equal(cdf_json_get_int(j, "whole", 0, &v), CDF_OK);
    assert_int_equal(v, 3);
    ASSERT_ERR(cdf_json_get_int(j, "frac", 0, &v), CDF_ERR_FORMAT, "expected an integer, got 2.5");
    ASSERT_ERR(cdf_json_get_int(j, "str", 0, &v), CDF_ERR_FORMAT, "'str'");
    assert_non_null(strstr(cdf_last_error(), "got a string"));
    ASSERT_ERR(cdf_json_get_int(j, "t", 0, &v), CDF_ERR_FORMAT, "got a boolean");
    ASSERT_ERR(cdf_json_get_int(j, "arr", 0, &v), CDF_ERR_FORMAT, "got an array");
    assert_int_equal(cdf_json_get_int(j, "nul", 9, &v), CDF_OK);
    assert_int_equal(v, 9);

    double d = 1.25;
    ASSERT_ERR(cdf_json_get_double(j, "inf", 0, &d), CDF_ERR_FORMAT, "out of the double range");
    ASSERT_ERR(cdf_json_get_double(j, "str", 0, &d), CDF_ERR_FORMAT, "expected a number, got a string");
    assert_true(d == 1.25);
    assert_int_equal(cdf_json_get_double(j, "big", 0, &d), CDF_OK);
    assert_true(d == 1e300);
    assert_int_equal(cdf_json_get_double(j, "nul", 0.5, &d), CDF_OK);
    assert_true(d == 0.5);

    bool b = false;
    ASSERT_ERR(cdf_json_get_bool(j, "neg", false, &b), CDF_ERR_FORMAT, "expected a boolean, got a number");
    assert_int_equal(cdf_json_get_bool(j, "t", false, &b), CDF_OK);
    assert_true(b);
    assert_int_equal(cdf_json_get_bool(j, "nul", true, &b), CDF_OK);
    assert_true(b);
    const char *s = NULL;
    ASSERT_ERR(cdf_json_get_string(j, "neg", NULL, &s), CDF_ERR_FORMAT, "expected a string, got a number");
    assert_int_equal(cdf_json_get_string(j, "str", NULL, &s), CDF_OK);
    assert_string_equal(s, "3");
    assert_int_equal(cdf_json_get_string(j, "nul", "dflt", &s), CDF_OK);
    assert_string_equal(s, "dflt");

    int64_t a[3];
    int n = -1;
    assert_int_equal(cdf_json_get_int_array(j, "arr", a, 3, &n), CDF_OK);
    assert_int_equal(n, 3);
    assert_true(a[0] == 1 && a[1] == 2 && a[2] == 3);
    ASSERT_ERR(cdf_json_get_int_array(j, "arr", a, 2, &n), CDF_ERR_LIMIT, "3 elements, at most 2");
    ASSERT_ERR(cdf_json_get_int_array(j, "mixed", a, 3, &n), CDF_ERR_FORMAT, "'mixed[1]'");
    ASSERT_ERR(cdf_json_get_int_array(j, "darr", a, 3, &n), CDF_ERR_FORMAT, "'darr[0]'");
    ASSERT_ERR(cdf_json_get_int_array(j, "neg", a, 3, &n), CDF_ERR_FORMAT, "expected an array, got a number");
    assert_int_equal(cdf_json_get_int_array(j, "absent", a, 3, &n), CDF_OK);
    assert_int_equal(n, 0);
    double da[3];
    assert_int_equal(cdf_json_get_double_array(j, "darr", da, 3, &n), CDF_OK);
    assert_int_equal(n, 3);
    assert_true(da[0] == 0.5 && da[1] == -1e-3 && da[2] == 7);
    ASSERT_ERR(cdf_json_get_double_array(j, "mixed", da, 3, &n), CDF_ERR_FORMAT, "'mixed[1]'");

    /* a nested object: errors name the enclosing key */
    const cJSON *inner = cJSON_GetObjectItem(j, "inner");
    ASSERT_ERR(cdf_json_get_int(inner, "k", 0, &v), CDF_ERR_FORMAT, "in object 'inner'");
    /* not an object */
    ASSERT_ERR(cdf_json_get_int(cJSON_GetObjectItem(j, "arr"), "k", 0, &v), CDF_ERR_INVALID_ARG, "not called on a JSON object");
    ASSERT_ERR(cdf_json_get_int(NULL, "k", 0, &v), CDF_ERR_INVALID_ARG, "NULL");
    cJSON_Delete(j);
}

static void test_load_errors(void **state) {
    (void)state;
    cJSON *j = (cJSON *)(uintptr_t)1;
    /* 10000 '[': rejected by the depth scan before cJSON recurses */
    size_t deep_n = 10000;
    char *deep = malloc(deep_n + 1);
    memset(deep, '[', deep_n);
    deep[deep_n] = 0;
    const char *p = write_json("deep.json", deep);
    ASSERT_ERR(cdf_json_load_file(p, &j), CDF_ERR_LIMIT, "nests deeper than the limit of 128 levels");
    assert_non_null(strstr(cdf_last_error(), p));
    assert_null(j);
    ASSERT_ERR(cdf_json_parse(deep, deep_n, "inline", &j), CDF_ERR_LIMIT, "JSON 'inline' nests deeper");
    /* mixed objects and arrays count too; exactly at the limit is fine */
    char *ok = malloc(2 * 128 + 1);
    for (int i = 0; i < 128; i++) ok[i] = '[';
    for (int i = 0; i < 128; i++) ok[128 + i] = ']';
    ok[256] = 0;
    assert_int_equal(cdf_json_parse(ok, 256, "at_limit", &j), CDF_OK);
    cJSON_Delete(j);
    char *over = malloc(2 * 129 + 1);
    for (int i = 0; i < 129; i++) over[i] = i % 2 ? '[' : '{';
    over[129] = 0;
    ASSERT_ERR(cdf_json_check_depth(over, 129, 128, "mixed"), CDF_ERR_LIMIT, "mixed");
    free(over);
    free(ok);
    /* brackets inside strings (with escaped quotes) do not count */
    char *str = malloc(deep_n + 16);
    snprintf(str, deep_n + 16, "[\"\\\"%.*s\"]", (int)(deep_n - 10), deep);
    assert_int_equal(cdf_json_parse(str, strlen(str), "brackets_in_string", &j), CDF_OK);
    assert_true(cJSON_IsArray(j));
    cJSON_Delete(j);
    free(str);
    free(deep);

    /* missing file, folder */
    j = (cJSON *)(uintptr_t)1;
    ASSERT_ERR(cdf_json_load_file(tu_tmp_path("missing.json"), &j), CDF_ERR_NOT_FOUND, "does not exist");
    assert_null(j);
    ASSERT_ERR(cdf_json_load_file(tu_tmpdir(), &j), CDF_ERR_IO, "is a folder");

    /* syntax errors name the file and the line */
    p = write_json("syntax.json", "{\n  \"a\": 1,\n  \"b\": ]\n}\n");
    ASSERT_ERR(cdf_json_load_file(p, &j), CDF_ERR_FORMAT, "syntax error at line 3");
    assert_non_null(strstr(cdf_last_error(), p));
    p = write_json("trailing.json", "{\"a\": 1}\n  x");
    ASSERT_ERR(cdf_json_load_file(p, &j), CDF_ERR_FORMAT, "unexpected data after the value at line 2, column 3");
    p = write_json("empty.json", "  \n");
    ASSERT_ERR(cdf_json_load_file(p, &j), CDF_ERR_FORMAT, "is empty");
    p = write_json("trailing_ws.json", "[1, 2]\n\n  ");
    assert_int_equal(cdf_json_load_file(p, &j), CDF_OK);
    cJSON_Delete(j);

    /* size limit: a sparse file just over 64 MB is refused without reading it */
    p = tu_tmp_path("huge.json");
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)CDF_JSON_MAX_FILE_BYTES + 1), 0);
    close(fd);
    ASSERT_ERR(cdf_json_load_file(p, &j), CDF_ERR_LIMIT, "over the limit of 67108864 bytes");
    unlink(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_config),
        cmocka_unit_test(test_getter_errors),
        cmocka_unit_test(test_load_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
