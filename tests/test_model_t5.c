/* T5 v1.1 encoder (T5EncoderModel) against the golden outputs of /work/shared/golden/text (copied
 * to tests/data/golden/text_models): a tiny random T5-v1.1-like encoder (d_model 48, 4 heads x 12,
 * d_ff 120, 3 blocks, gated-gelu, 32 buckets / max distance 128, vocab 32128, BF16 weights) run on
 * 8 prompts padded to 256 ids and 3 prompts padded to 512 (no attention mask, as in the
 * pipelines). The golden was computed in float64 from the BF16 weights upcast exactly.
 *
 * Tolerance: 1e-4 max |diff|, what the golden README suggests for a float32 implementation; plain
 * float32 PyTorch reaches ~9e-6 (checks.json, values up to ~4). A wrong bucket, a 1/sqrt(d_kv)
 * scaling or a mean-subtracting norm moves outputs by 1e-2 .. 1. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdiffusers/io.h"
#include "models/component.h"
#include "models/text_encoders.h"

#define F32_TOL 1e-4


static cdf_load_options opts(cdf_dtype weight_dtype) {
    cdf_load_options o = cdf_load_options_default();
    o.device = tu_device();
    o.weight_dtype = weight_dtype;
    return o;
}




/* Run the component on the golden ids (the first `rows` prompts, 0 = all) and compare
 * out.last_hidden_state; returns its max |diff|. */
static double run_and_compare_rows(const char *model_dir, cdf_dtype weight_dtype, const char *golden_rel, int64_t rows,
                                   double tol, const char *label) {
    cdf_tensor_map golden, in, out;
    tu_load_map(&golden, golden_rel);
    cdf_tensor_map_init(&in);
    cdf_tensor_map_init(&out);
    cdf_scope_push();
    cdf_tensor *ids = cdf_tensor_map_get(&golden, "input_ids"), *want = cdf_tensor_map_get(&golden, "last_hidden_state");
    assert_non_null(ids);
    assert_non_null(want);
    if (rows > 0) {
        ids = cdf_narrow(ids, 0, 0, rows);
        want = cdf_narrow(want, 0, 0, rows);
    }
    assert_int_equal(cdf_tensor_map_set(&in, "input_ids", ids), CDF_OK);
    cdf_component *c = tu_load_component(model_dir, weight_dtype);
    cdf_status s = cdf_component_run(c, "forward", &in, &out);
    if (s != CDF_OK) fail_msg("%s: run failed: %s", label, cdf_last_error());
    assert_int_equal(out.n, 1);
    double d = tu_diff_tensors(cdf_tensor_map_get(&out, "out.last_hidden_state"), want, "out.last_hidden_state");
    printf("  %-34s last_hidden_state [%lld, %lld, %lld] max|diff| = %.3g (tol %.1g)\n", label,
           (long long)cdf_tensor_dim(want, 0), (long long)cdf_tensor_dim(want, 1), (long long)cdf_tensor_dim(want, 2), d, tol);
    if (!(d <= tol)) fail_msg("%s: max |diff| %.3g > %.3g", label, d, tol);
    cdf_scope_pop(NULL, 0);
    cdf_component_free(c);
    cdf_tensor_map_clear(&out);
    cdf_tensor_map_clear(&in);
    cdf_tensor_map_clear(&golden);
    return d;
}

static double run_and_compare(const char *model_dir, cdf_dtype weight_dtype, const char *golden_rel, double tol,
                              const char *label) {
    return run_and_compare_rows(model_dir, weight_dtype, golden_rel, 0, tol, label);
}

static void test_t5_256_f32(void **state) {
    (void)state;
    run_and_compare(tu_data("golden/text_models/t5_tiny"), CDF_F32, "golden/text_models/outputs/t5_tiny_256.safetensors",
                    F32_TOL, "t5 @256 f32 weights");
}

static void test_t5_512_f32(void **state) {
    (void)state;
    run_and_compare(tu_data("golden/text_models/t5_tiny"), CDF_F32, "golden/text_models/outputs/t5_tiny_512.safetensors",
                    F32_TOL, "t5 @512 f32 weights");
}

/* The checkpoint is BF16, so bf16 storage holds exactly the same weight values; the bf16 compute
 * policy (activations rounded at the matmul inputs) differs:
 * bf16 compute (the default policy, kernels/dispatch.h): with bf16 weights the matmul inputs are
 * also rounded to bf16 (f32 accumulation). That perturbs the other operand of the same products
 * by the same relative 2^-9 as rounding the weights did, whose effect the golden README measured
 * at 0.3-0.94% of max|output| (worst: vae_kl16 decode, 0.021 of 2.24). No such figure exists for
 * a BF16 checkpoint, so the bound is 3x the worst relative one: 3% of max|golden output| (4.09 -> 0.12; measured ~0.013). Two prompts keep the Debug
 * build fast (the f32 tests above cover all of them). */
static void test_t5_256_bf16_storage(void **state) {
    (void)state;
    run_and_compare_rows(tu_data("golden/text_models/t5_tiny"), CDF_BF16, "golden/text_models/outputs/t5_tiny_256.safetensors",
                         2, 0.12, "t5 @256 bf16 storage");
}

/* The bucket of every relative position -511..511 equals the golden table (transformers'
 * _relative_position_bucket, bidirectional, 32 buckets, max distance 128). */
static void test_relative_position_buckets(void **state) {
    (void)state;
    cdf_tensor_map dbg;
    tu_load_map(&dbg, "golden/text_models/outputs/debug_t5_tiny.safetensors");
    cdf_tensor *rp = cdf_tensor_map_get(&dbg, "relative_position"), *rb = cdf_tensor_map_get(&dbg, "relative_position_bucket");
    assert_non_null(rp);
    assert_non_null(rb);
    int64_t n = cdf_tensor_numel(rp);
    assert_int_equal(n, 1023);
    int64_t *pos = malloc(n * sizeof *pos), *bucket = malloc(n * sizeof *bucket);
    assert_int_equal(cdf_tensor_read(rp, CDF_I64, pos, n * sizeof *pos), CDF_OK);
    assert_int_equal(cdf_tensor_read(rb, CDF_I64, bucket, n * sizeof *bucket), CDF_OK);
    int distinct = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t got = cdf_t5_relative_position_bucket(pos[i], true, 32, 128);
        if (got != bucket[i]) fail_msg("relative position %lld: bucket %lld, golden %lld", (long long)pos[i], (long long)got,
                                       (long long)bucket[i]);
        distinct += i == 0 || bucket[i] != bucket[i - 1];
    }
    assert_int_equal(distinct, 31); /* every bucket but 16 (d > 0 with |d| = 0 cannot happen) */
    /* unidirectional (decoder) variant: future keys share bucket 0; spot values from the formula */
    assert_int_equal(cdf_t5_relative_position_bucket(5, false, 32, 128), 0);
    assert_int_equal(cdf_t5_relative_position_bucket(-5, false, 32, 128), 5);
    assert_int_equal(cdf_t5_relative_position_bucket(-1000, false, 32, 128), 31);
    free(pos);
    free(bucket);
    cdf_tensor_map_clear(&dbg);
}

/* ---- modified checkpoints in a temp dir ------------------------------------------------------- */
/* Copy src_dir into dst_dir leaving out tensor `drop`, giving tensor `narrow` one column less, and
 * renaming tensor rename_from to rename_to (each may be NULL). */
static void write_modified_copy(const char *src_dir, const char *dst_dir, const char *drop, const char *narrow,
                                const char *rename_from, const char *rename_to) {
    char path[1024];
    assert_int_equal(tu_system("mkdir -p '%s' && cp '%s/config.json' '%s/'", dst_dir, src_dir, dst_dir), 0);
    snprintf(path, sizeof path, "%s/model.safetensors", src_dir);
    cdf_st_file *f;
    if (cdf_st_open(path, &f) != CDF_OK) fail_msg("%s", cdf_last_error());
    cdf_st_writer *w = cdf_st_writer_new();
    assert_non_null(w);
    for (int i = 0; i < cdf_st_count(f); i++) {
        const cdf_st_tensor *t = cdf_st_tensor_at(f, i);
        if (drop && strcmp(t->name, drop) == 0) continue;
        int64_t shape[CDF_ST_MAX_DIMS];
        memcpy(shape, t->shape, sizeof shape);
        if (narrow && strcmp(t->name, narrow) == 0) shape[t->ndim - 1] -= 1; /* a prefix of the data */
        const char *name = rename_from && strcmp(t->name, rename_from) == 0 ? rename_to : t->name;
        assert_int_equal(cdf_st_writer_add(w, name, t->dtype, t->ndim, shape, cdf_st_data(f, t)), CDF_OK);
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dst_dir);
    assert_int_equal(cdf_st_writer_save(w, path), CDF_OK);
    cdf_st_writer_free(w);
    cdf_st_close(f);
}

static void test_missing_and_misshaped_tensors(void **state) {
    (void)state;
    cdf_load_options o = opts(CDF_F32);
    cdf_component *c = NULL;
    char dir[512];
    const char *missing = "encoder.block.2.layer.1.DenseReluDense.wi_1.weight";
    snprintf(dir, sizeof dir, "%s/t5_missing", tu_tmpdir());
    write_modified_copy(tu_data("golden/text_models/t5_tiny"), dir, missing, NULL, NULL, NULL);
    assert_int_equal(cdf_component_load(dir, &o, &c), CDF_ERR_NOT_FOUND);
    assert_null(c);
    printf("  error: %s\n", cdf_last_error());
    assert_non_null(strstr(cdf_last_error(), missing));

    const char *misshaped = "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight";
    snprintf(dir, sizeof dir, "%s/t5_misshaped", tu_tmpdir());
    write_modified_copy(tu_data("golden/text_models/t5_tiny"), dir, NULL, misshaped, NULL, NULL);
    assert_int_equal(cdf_component_load(dir, &o, &c), CDF_ERR_SHAPE);
    assert_null(c);
    printf("  error: %s\n", cdf_last_error());
    assert_non_null(strstr(cdf_last_error(), misshaped));
    assert_non_null(strstr(cdf_last_error(), "[32, 3]"));

    const char *misshaped2 = "encoder.block.1.layer.0.SelfAttention.o.weight";
    snprintf(dir, sizeof dir, "%s/t5_misshaped2", tu_tmpdir());
    write_modified_copy(tu_data("golden/text_models/t5_tiny"), dir, NULL, misshaped2, NULL, NULL);
    assert_int_equal(cdf_component_load(dir, &o, &c), CDF_ERR_SHAPE);
    printf("  error: %s\n", cdf_last_error());
    assert_non_null(strstr(cdf_last_error(), misshaped2));
}

/* A checkpoint that names the (tied) token table encoder.embed_tokens.weight instead of
 * shared.weight loads and gives the same result. */
static void test_embed_tokens_name(void **state) {
    (void)state;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/t5_embed_tokens", tu_tmpdir());
    write_modified_copy(tu_data("golden/text_models/t5_tiny"), dir, NULL, NULL, "shared.weight", "encoder.embed_tokens.weight");
    run_and_compare_rows(dir, CDF_F32, "golden/text_models/outputs/t5_tiny_256.safetensors", 2, F32_TOL,
                         "t5 @256 embed_tokens name");
}

static void test_direct_api_and_bad_inputs(void **state) {
    (void)state;
    cdf_load_options o = opts(CDF_F32);
    cdf_t5_encoder *m;
    if (cdf_t5_encoder_load(tu_data("golden/text_models/t5_tiny"), &o, &m) != CDF_OK) fail_msg("%s", cdf_last_error());
    assert_int_equal(cdf_t5_encoder_d_model(m), 48);

    /* outside any scope the output is a plain reference; i32 ids work too */
    int32_t ids32[2][4] = {{71, 1712, 1, 0}, {1, 0, 0, 0}};
    cdf_tensor *ids = cdf_tensor_from_host(tu_device(), CDF_I32, 2, (int64_t[]){2, 4}, ids32, CDF_I32);
    cdf_tensor *h = NULL;
    assert_int_equal(cdf_t5_encode(m, ids, &h), CDF_OK);
    assert_int_equal(cdf_tensor_dim(h, 0), 2);
    assert_int_equal(cdf_tensor_dim(h, 1), 4);
    assert_int_equal(cdf_tensor_dim(h, 2), 48);
    cdf_tensor_release(h);
    cdf_tensor_release(ids);

    int64_t bad[3] = {5, 32128, 1};
    ids = cdf_tensor_from_host(tu_device(), CDF_I64, 2, (int64_t[]){1, 3}, bad, CDF_I64);
    /* an id outside the vocabulary fails the embedding lookup on the device (the forward reads
     * nothing on the host); the encode's closing sync reports it, naming the op and the id */
    assert_int_equal(cdf_t5_encode(m, ids, &h), CDF_ERR_DEVICE);
    assert_null(h);
    printf("  error: %s\n", cdf_last_error());
    assert_non_null(strstr(cdf_last_error(), "'embedding' failed"));
    assert_non_null(strstr(cdf_last_error(), "id 32128 at position 1 is outside the table [0, 32128)"));
    cdf_tensor_release(ids);
    ids = cdf_tensor_from_host(tu_device(), CDF_I64, 1, (int64_t[]){3}, bad, CDF_I64);
    assert_int_equal(cdf_t5_encode(m, ids, &h), CDF_ERR_SHAPE);
    cdf_tensor_release(ids);
    cdf_t5_encoder_free(m);

    /* component: missing input, unsupported mask and method */
    cdf_component *c = tu_load_component(tu_data("golden/text_models/t5_tiny"), CDF_F32);
    cdf_tensor_map in, out;
    cdf_tensor_map_init(&in);
    cdf_tensor_map_init(&out);
    assert_int_equal(cdf_component_run(c, "forward", &in, &out), CDF_ERR_NOT_FOUND);
    assert_non_null(strstr(cdf_last_error(), "input_ids"));
    int64_t ok_ids[3] = {5, 6, 1};
    cdf_tensor *t = cdf_tensor_from_host(tu_device(), CDF_I64, 2, (int64_t[]){1, 3}, ok_ids, CDF_I64);
    cdf_tensor_map_set(&in, "input_ids", t);
    assert_int_equal(cdf_component_run(c, "decode", &in, &out), CDF_ERR_UNSUPPORTED);
    cdf_tensor_map_set(&in, "attention_mask", t);
    assert_int_equal(cdf_component_run(c, "forward", &in, &out), CDF_ERR_UNSUPPORTED);
    assert_non_null(strstr(cdf_last_error(), "attention_mask"));
    assert_int_equal(out.n, 0);
    cdf_tensor_release(t);
    cdf_tensor_map_clear(&in);
    cdf_component_free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_t5_256_f32),
        cmocka_unit_test(test_t5_512_f32),
        cmocka_unit_test(test_t5_256_bf16_storage),
        cmocka_unit_test(test_relative_position_buckets),
        cmocka_unit_test(test_missing_and_misshaped_tensors),
        cmocka_unit_test(test_embed_tokens_name),
        cmocka_unit_test(test_direct_api_and_bad_inputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
