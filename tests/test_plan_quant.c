/* The planner's weight bytes with quantized weights (pipelines/planner.c), checked against what
 * the loaders actually allocate on the device:
 * - which 2-d weights are linear layers' (cdf_plan_is_linear_weight) equals what the tiny FLUX.1,
 *   SD3.5 and FLUX.2 components read through cdf_linear_load (the load hook on_read says so);
 * - --weight-type q8_0 / q4_k (f32 and bf16 weights): planned bytes == device bytes after loading;
 * - a GGUF file in place of the folder's weights (the BFL-named mixed-type test file, and files
 *   cdiffusers convert generates), kept as blocks or decoded at load: planned == loaded;
 * - `cdiffusers plan --transformer FILE.gguf --weight-type ...` prints the smaller weights. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cdiffusers/cdiffusers.h"
#include "nn/nn.h"
#include "pipelines/planner.h"

static const char *const k_pipes[] = {"pipelines/flux1_dev_tiny", "pipelines/sd35m_tiny", "pipelines/flux2_dev_tiny"};
static const char *const k_subs[] = {"text_encoder", "text_encoder_2", "text_encoder_3", "transformer", "vae"};

static uint64_t current_bytes(void) {
    assert_int_equal(cdf_device_synchronize(tu_cpu()), CDF_OK);
    cdf_memory_stats st;
    cdf_device_memory_stats(tu_cpu(), &st);
    return st.current_bytes;
}

typedef struct rec {
    char names[4096][128];
    bool linear[4096];
    int n;
} rec;

static void on_read(void *ctx, const char *name, bool linear) {
    rec *r = ctx;
    for (int i = 0; i < r->n; i++)
        if (strcmp(r->names[i], name) == 0) {
            r->linear[i] |= linear;
            return;
        }
    assert_true(r->n < 4096);
    snprintf(r->names[r->n], sizeof r->names[0], "%s", name);
    r->linear[r->n++] = linear;
}

static bool exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

static void test_linear_predicate_matches_loaders(void **state) {
    (void)state;
    static rec r;
    int checked = 0;
    for (size_t pi = 0; pi < sizeof k_pipes / sizeof *k_pipes; pi++)
        for (size_t si = 0; si < sizeof k_subs / sizeof *k_subs; si++) {
            char sub[1024];
            snprintf(sub, sizeof sub, "%s/%s", tu_data(k_pipes[pi]), k_subs[si]);
            if (!exists(sub)) continue;
            memset(&r, 0, sizeof r);
            cdf_load_options o = cdf_load_options_default();
            o.device = tu_cpu();
            o.weight_dtype = CDF_F32;
            o.on_read = on_read;
            o.on_read_ctx = &r;
            cdf_component *c = NULL;
            if (cdf_component_load(sub, &o, &c) != CDF_OK) fail_msg("%s: %s", sub, cdf_last_error());
            char cls[64];
            snprintf(cls, sizeof cls, "%s", cdf_component_class_name(c));
            cdf_component_free(c);
            cdf_checkpoint *ck = NULL;
            assert_int_equal(cdf_checkpoint_open(sub, &ck), CDF_OK);
            for (int i = 0; i < cdf_checkpoint_count(ck); i++) {
                const cdf_st_file *f;
                const cdf_st_tensor *t;
                assert_int_equal(cdf_checkpoint_tensor_at(ck, i, &f, &t), CDF_OK);
                int k = 0;
                while (k < r.n && strcmp(r.names[k], t->name) != 0) k++;
                const bool read_linear = k < r.n && r.linear[k];
                if (cdf_plan_is_linear_weight(cls, t->name, t->ndim) != read_linear)
                    fail_msg("%s (%s): '%s' planned as %s, loaded as %s", sub, cls, t->name,
                             read_linear ? "not linear" : "linear", read_linear ? "a linear weight" : "no linear weight");
                checked += read_linear;
            }
            cdf_checkpoint_close(ck);
        }
    assert_true(checked > 100); /* linear weights were seen, in every pipeline */
}

/* planned bytes of component folder sub (or file) under o == device bytes a load with the same
 * options allocates; returns them. */
static uint64_t planned_equals_loaded(const char *sub, const char *file, cdf_dtype wdt, uint32_t quantize, bool decode) {
    cdf_load_options o = cdf_load_options_default();
    o.device = tu_cpu();
    o.weight_dtype = wdt;
    o.weights_file = file;
    o.quantize_to = quantize;
    o.decode_quantized = decode;
    const uint64_t before = current_bytes();
    cdf_component *c = NULL;
    if (cdf_component_load(sub, &o, &c) != CDF_OK) fail_msg("%s: %s", sub, cdf_last_error());
    const uint64_t loaded = current_bytes() - before;
    char cls[64];
    snprintf(cls, sizeof cls, "%s", cdf_component_class_name(c));
    cdf_component_free(c);
    assert_int_equal(current_bytes(), before);
    cdf_plan_weights_opts wo = {.class_name = cls, .file = file, .quantize_to = quantize, .decode_quantized = decode};
    cdf_plan_blocks b;
    assert_int_equal(cdf_plan_block_bytes_opts(sub, wdt, &wo, &b), CDF_OK);
    if (b.total_bytes != loaded)
        fail_msg("%s%s%s (%s, quantize %u, decode %d): planned %llu, loaded %llu", sub, file ? " + " : "", file ? file : "",
                 cdf_dtype_name(wdt), quantize, decode, (unsigned long long)b.total_bytes, (unsigned long long)loaded);
    return loaded;
}

static void test_weight_type_bytes_exact(void **state) {
    (void)state;
    const uint32_t qs[2] = {CDF_GGML_Q8_0, CDF_GGML_Q4_K};
    const cdf_dtype dts[2] = {CDF_F32, CDF_BF16};
    for (size_t pi = 0; pi < sizeof k_pipes / sizeof *k_pipes; pi++)
        for (size_t si = 0; si < sizeof k_subs / sizeof *k_subs; si++) {
            char sub[1024];
            snprintf(sub, sizeof sub, "%s/%s", tu_data(k_pipes[pi]), k_subs[si]);
            if (!exists(sub)) continue;
            for (int d = 0; d < 2; d++) {
                const uint64_t plain = planned_equals_loaded(sub, NULL, dts[d], 0, false);
                for (int q = 0; q < 2; q++) {
                    const uint64_t quant = planned_equals_loaded(sub, NULL, dts[d], qs[q], false);
                    assert_true(quant <= plain);
                    /* the FLUX.1 transformer has 48 Q8_0-able layers: fewer bytes than f32 or bf16 */
                    if (pi == 0 && si == 3 && q == 0) assert_true(quant < plain);
                }
            }
        }
}

static void test_gguf_bytes_exact(void **state) {
    (void)state;
    const char *sub = tu_data("pipelines/flux1_dev_tiny/transformer");
    char file[1024];
    snprintf(file, sizeof file, "%s", tu_data("formats/flux_single/flux_bfl_q8.gguf")); /* BFL names, mixed types */
    for (int d = 0; d < 2; d++) {
        const cdf_dtype wdt = d ? CDF_BF16 : CDF_F32;
        const uint64_t kept = planned_equals_loaded(sub, file, wdt, 0, false);
        const uint64_t decoded = planned_equals_loaded(sub, file, wdt, 0, true);
        assert_true(kept < decoded);
        planned_equals_loaded(sub, file, wdt, CDF_GGML_Q8_0, false); /* the file's float linears re-quantized */
    }
    /* files generated by cdiffusers convert */
    static const uint32_t types[] = {CDF_GGML_Q8_0, CDF_GGML_Q4_K, CDF_GGML_BF16};
    for (size_t k = 0; k < sizeof types / sizeof *types; k++) {
        cdf_convert_params p = cdf_convert_params_default();
        p.model = tu_data("pipelines/flux1_dev_tiny");
        char out[1024];
        snprintf(out, sizeof out, "%s/plan_%u.gguf", tu_tmpdir(), types[k]);
        p.output = out;
        p.type = types[k];
        assert_int_equal(cdf_convert_to_gguf(&p, NULL), CDF_OK);
        planned_equals_loaded(sub, out, CDF_F32, 0, false);
        planned_equals_loaded(sub, out, CDF_BF16, 0, true);
    }
}

/* The plan command: --transformer FILE.gguf and --weight-type change the transformer's weights. */
static void test_plan_cli(void **state) {
    (void)state;
    const char *dir = tu_tmpdir(), *model = tu_data("pipelines/flux1_dev_tiny");
    int rc = tu_system("'%s' plan --model '%s' --dtype f32 >'%s/p0.txt' 2>&1", CDF_CLI_PATH, model, dir);
    assert_int_equal(rc, 0);
    rc = tu_system("'%s' plan --model '%s' --dtype f32 --weight-type q8_0 >'%s/p1.txt' 2>&1", CDF_CLI_PATH, model, dir);
    assert_int_equal(rc, 0);
    rc = tu_system("'%s' plan --model '%s' --dtype f32 --transformer '%s' >'%s/p2.txt' 2>&1", CDF_CLI_PATH, model,
                   tu_data("formats/flux_single/flux_bfl_q8.gguf"), dir);
    assert_int_equal(rc, 0);
    rc = tu_system("'%s' plan --model '%s' --dtype f32 --weight-type q5_k >'%s/p3.txt' 2>&1", CDF_CLI_PATH, model, dir);
    assert_int_equal(rc, 2);
    char p0[1024], p1[1024], p2[1024];
    snprintf(p0, sizeof p0, "%s/p0.txt", dir);
    snprintf(p1, sizeof p1, "%s/p1.txt", dir);
    snprintf(p2, sizeof p2, "%s/p2.txt", dir);
    char *a = tu_read_file(p0, NULL), *b = tu_read_file(p1, NULL), *c = tu_read_file(p2, NULL);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    /* the transformer's line ("transformer FluxTransformer2DModel <weights> ...") differs */
    const char *ta = strstr(a, "\ntransformer"), *tb = strstr(b, "\ntransformer"), *tc = strstr(c, "\ntransformer");
    assert_non_null(ta);
    assert_non_null(tb);
    assert_non_null(tc);
    assert_true(strncmp(ta, tb, 60) != 0);
    assert_true(strncmp(ta, tc, 60) != 0);
    free(a);
    free(b);
    free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linear_predicate_matches_loaders),
        cmocka_unit_test(test_weight_type_bytes_exact),
        cmocka_unit_test(test_gguf_bytes_exact),
        cmocka_unit_test(test_plan_cli),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
