/* fp8 safetensors: F8_E4M3 / F8_E5M2 read and converted exactly as torch's .to(torch.float32),
 * and ComfyUI "fp8_scaled" checkpoints (a weight's "scale_weight") dequantized at load as
 * weight.to(f32) * scale_weight. References: tools/make-format-refs/make_fp8_refs.py (torch). */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#include "cdiffusers/io.h"
#include "cdiffusers/tensor.h"
#include "nn/nn.h"

static void assert_same_bits(const float *got, const float *want, size_t n, const char *what) {
    for (size_t i = 0; i < n; i++) {
        uint32_t a, b;
        memcpy(&a, &got[i], 4);
        memcpy(&b, &want[i], 4);
        if (a != b) fail_msg("%s: element %zu is 0x%08x, torch gives 0x%08x", what, i, a, b);
    }
}

static void test_fp8_values_match_torch(void **state) {
    (void)state;
    cdf_st_file *f = NULL;
    assert_int_equal(cdf_st_open(tu_data("formats/fp8_refs.safetensors"), &f), CDF_OK);
    const char *names[2] = {"e4m3", "e5m2"};
    const cdf_dtype dts[2] = {CDF_F8_E4M3, CDF_F8_E5M2};
    for (int k = 0; k < 2; k++) {
        char ref[32];
        snprintf(ref, sizeof ref, "%s.f32", names[k]);
        const cdf_st_tensor *t = cdf_st_find(f, names[k]), *r = cdf_st_find(f, ref);
        assert_non_null(t);
        assert_non_null(r);
        assert_int_equal(t->dtype, dts[k]);
        assert_int_equal(cdf_st_numel(t), 256);
        float got[256];
        cdf_convert(got, CDF_F32, cdf_st_data(f, t), t->dtype, 256);
        assert_same_bits(got, cdf_st_data(f, r), 256, names[k]);
        /* to bf16: exact for every value that is not NaN */
        uint16_t b16[256];
        cdf_convert(b16, CDF_BF16, cdf_st_data(f, t), t->dtype, 256);
        for (int i = 0; i < 256; i++)
            if (got[i] == got[i]) assert_true(cdf_bf16_to_f32(b16[i]) == got[i]);
    }
    cdf_st_close(f);
}

static void check_weight(cdf_weights *w, cdf_st_file *e, const char *name, int ndim, const int64_t *shape) {
    cdf_tensor *t = cdf_weights_get(w, ndim, shape, "%s", name);
    if (!t) fail_msg("%s: %s", name, cdf_last_error());
    const cdf_st_tensor *x = cdf_st_find(e, name);
    assert_non_null(x);
    size_t n = (size_t)cdf_st_numel(x);
    float *got = malloc(n * 4);
    assert_int_equal(cdf_tensor_read(t, CDF_F32, got, n * 4), CDF_OK);
    assert_same_bits(got, cdf_st_data(e, x), n, name);
    free(got);
    cdf_tensor_release(t);
}

static void test_fp8_scaled_checkpoint(void **state) {
    (void)state;
    cdf_load_options o = cdf_load_options_default();
    o.device = tu_cpu();
    o.weight_dtype = CDF_F32;
    cdf_st_file *e = NULL;
    assert_int_equal(cdf_st_open(tu_data("formats/fp8_scaled.expect.safetensors"), &e), CDF_OK);
    for (int pass = 0; pass < 2; pass++) {
        /* as a folder, and as the same file named directly in place of a folder's weights */
        if (pass == 1) o.weights_file = tu_data("formats/fp8_scaled/model.safetensors");
        cdf_weights *w = NULL;
        assert_int_equal(cdf_weights_open(tu_data("formats/fp8_scaled"), &o, &w), CDF_OK);
        check_weight(w, e, "lin.weight", 2, (int64_t[]){8, 16});
        check_weight(w, e, "lin.bias", 1, (int64_t[]){8});
        check_weight(w, e, "other.weight", 2, (int64_t[]){4, 4});
        cdf_weights_free(w);
    }
    cdf_st_close(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp8_values_match_torch),
        cmocka_unit_test(test_fp8_scaled_checkpoint),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
