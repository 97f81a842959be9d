/* FLUX.2's text encoder (Mistral3ForConditionalGeneration's language model) against the golden
 * outputs of /work/shared/golden/flux2_text (copied to tests/data/golden/flux2_text): a tiny random
 * Mistral (vocab 131072, hidden 16, 4 layers, 4 heads x head_dim 16, 2 kv heads, intermediate 40,
 * rope_theta 1e9, BF16 weights in the legacy "language_model.model.*" names) run on 8 golden prompts
 * padded to 512 (and 2 at 64) with their attention masks; prompt_embeds = hidden states of layers
 * (1, 2, 3) stacked per token (width 48), as Flux2Pipeline builds it.
 *
 * Tolerance: 1e-4 max |diff|, what the golden README suggests for a float32 implementation: the
 * reference computed in float32 from the BF16 weights upcast exactly; an independent float32
 * implementation (gpt-fast) differs from it by up to 6.2e-6, its own float32 vs float64 by 3.1e-6
 * (values up to 5.2). A wrong RoPE layout (interleaved instead of halves), a missing padding mask,
 * a wrong GQA head mapping or a missing final norm moves outputs by 1e-2 .. 1. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdiffusers/io.h"
#include "models/component.h"
#include "models/mistral3_text.h"

#define F32_TOL 1e-4
#define MODEL_DIR "golden/flux2_text/text_encoder"
#define EMBEDS "golden/flux2_text/outputs/prompt_embeds.safetensors"
#define EMBEDS64 "golden/flux2_text/outputs/prompt_embeds_maxlen64.safetensors"
#define DEBUG_HS "golden/flux2_text/outputs/debug_hidden_states.safetensors"

static cdf_load_options opts(cdf_dtype weight_dtype) {
    cdf_load_options o = cdf_load_options_default();
    o.device = tu_device();
    o.weight_dtype = weight_dtype;
    return o;
}

static cdf_tensor *i64_tensor(int n, const int64_t *v) { return cdf_tensor_from_host(tu_device(), CDF_I64, 1, (int64_t[]){n}, v, CDF_I64); }

/* Run the component on the golden ids/masks (the first `rows` prompts, 0 = all) with layers (1, 2, 3)
 * and compare out.prompt_embeds; returns its max |diff|. *got (optional) receives a copy. */
static double run_and_compare_rows(const char *model_dir, cdf_dtype weight_dtype, const char *golden_rel, int64_t rows,
                                   double tol, const char *label, float **got) {
    cdf_tensor_map golden, in, out;
    tu_load_map(&golden, golden_rel);
    cdf_tensor_map_init(&in);
    cdf_tensor_map_init(&out);
    cdf_scope_push();
    cdf_tensor *ids = cdf_tensor_map_get(&golden, "input_ids"), *mask = cdf_tensor_map_get(&golden, "attention_mask");
    cdf_tensor *want = cdf_tensor_map_get(&golden, "prompt_embeds");
    assert_non_null(ids);
    assert_non_null(mask);
    assert_non_null(want);
    if (rows > 0) {
        ids = cdf_narrow(ids, 0, 0, rows);
        mask = cdf_narrow(mask, 0, 0, rows);
        want = cdf_narrow(want, 0, 0, rows);
    }
    assert_int_equal(cdf_tensor_map_set(&in, "input_ids", ids), CDF_OK);
    assert_int_equal(cdf_tensor_map_set(&in, "attention_mask", mask), CDF_OK);
    assert_int_equal(cdf_tensor_map_set(&in, "text_encoder_out_layers", i64_tensor(3, (int64_t[]){1, 2, 3})), CDF_OK);
    cdf_component *c = tu_load_component(model_dir, weight_dtype);
    cdf_status s = cdf_component_run(c, "forward", &in, &out);
    if (s != CDF_OK) fail_msg("%s: run failed: %s", label, cdf_last_error());
    assert_int_equal(out.n, 2); /* prompt_embeds, last_hidden_state */
    cdf_tensor *pe = cdf_tensor_map_get(&out, "out.prompt_embeds");
    double d = tu_diff_tensors(pe, want, "out.prompt_embeds");
    printf("  %-34s prompt_embeds [%lld, %lld, %lld] max|diff| = %.3g (tol %.1g)\n", label, (long long)cdf_tensor_dim(want, 0),
           (long long)cdf_tensor_dim(want, 1), (long long)cdf_tensor_dim(want, 2), d, tol);
    if (!(d <= tol)) fail_msg("%s: max |diff| %.3g > %.3g", label, d, tol);
    if (got) *got = cdf_tensor_read_f32(pe);
    cdf_scope_pop(NULL, 0);
    cdf_component_free(c);
    cdf_tensor_map_clear(&out);
    cdf_tensor_map_clear(&in);
    cdf_tensor_map_clear(&golden);
    return d;
}

static void test_prompt_embeds_512(void **state) {
    (void)state;
    run_and_compare_rows(tu_data(MODEL_DIR), CDF_F32, EMBEDS, 0, F32_TOL, "8 prompts @512 f32 weights", NULL);
}

static void test_prompt_embeds_64(void **state) {
    (void)state;
    run_and_compare_rows(tu_data(MODEL_DIR), CDF_F32, EMBEDS64, 0, F32_TOL, "2 prompts @64 f32 weights", NULL);
}

/* The checkpoint is BF16, so bf16 storage holds exactly the same weight values; the bf16 compute
 * policy (activations rounded at the matmul inputs) differs:
 * bf16 compute (the default policy, kernels/dispatch.h): with bf16 weights the matmul inputs are
 * also rounded to bf16 (f32 accumulation). That perturbs the other operand of the same products
 * by the same relative 2^-9 as rounding the weights did, whose effect the golden README measured
 * at 0.3-0.94% of max|output| (worst: vae_kl16 decode, 0.021 of 2.24). No such figure exists for
 * a BF16 checkpoint, so the bound is 3x the worst relative one: 3% of max|golden output| (5.17 -> 0.15; measured ~0.06). */
static void test_prompt_embeds_bf16_storage(void **state) {
    (void)state;
    run_and_compare_rows(tu_data(MODEL_DIR), CDF_BF16, EMBEDS, 1, 0.15, "1 prompt @512 bf16 storage", NULL);
}

/* Every hidden state (embeddings, the 4 layer outputs, the last one after the final norm) of the
 * first golden prompt (37 real tokens + padding), and out.last_hidden_state = hidden_states[4]. */
static void test_all_hidden_states(void **state) {
    (void)state;
    cdf_tensor_map golden, dbg, in, out;
    tu_load_map(&golden, EMBEDS);
    tu_load_map(&dbg, DEBUG_HS);
    cdf_tensor_map_init(&in);
    cdf_tensor_map_init(&out);
    cdf_scope_push();
    cdf_tensor *want = cdf_tensor_map_get(&dbg, "hidden_states"); /* [2, 5, 512, 16] */
    assert_non_null(want);
    want = cdf_narrow(want, 0, 0, 1);
    cdf_tensor_map_set(&in, "input_ids", cdf_narrow(cdf_tensor_map_get(&golden, "input_ids"), 0, 0, 1));
    cdf_tensor_map_set(&in, "attention_mask", cdf_narrow(cdf_tensor_map_get(&golden, "attention_mask"), 0, 0, 1));
    cdf_tensor_map_set(&in, "text_encoder_out_layers", i64_tensor(2, (int64_t[]){-1, 0}));
    cdf_tensor_map_set(&in, "output_hidden_states", cdf_tensor_full(tu_device(), CDF_I64, 1, (int64_t[]){1}, 1));
    cdf_component *c = tu_load_component(tu_data(MODEL_DIR), CDF_F32);
    if (cdf_component_run(c, "forward", &in, &out) != CDF_OK) fail_msg("run failed: %s", cdf_last_error());
    assert_int_equal(out.n, 3);
    double d = tu_diff_tensors(cdf_tensor_map_get(&out, "out.hidden_states"), want, "out.hidden_states");
    printf("  hidden_states [1, 5, 512, 16] max|diff| = %.3g (tol %.1g)\n", d, F32_TOL);
    assert_true(d <= F32_TOL);
    cdf_tensor *last = cdf_squeeze(cdf_narrow(want, 1, 4, 1), 1), *first = cdf_squeeze(cdf_narrow(want, 1, 0, 1), 1);
    d = tu_diff_tensors(cdf_tensor_map_get(&out, "out.last_hidden_state"), last, "out.last_hidden_state");
    assert_true(d <= F32_TOL);
    /* layers (-1, 0): hidden_states[4] then the embeddings, channels in list order */
    d = tu_diff_tensors(cdf_tensor_map_get(&out, "out.prompt_embeds"), cdf_cat((cdf_tensor *[]){last, first}, 2, 2),
                        "out.prompt_embeds (-1, 0)");
    assert_true(d <= F32_TOL);
    cdf_scope_pop(NULL, 0);
    cdf_component_free(c);
    cdf_tensor_map_clear(&out);
    cdf_tensor_map_clear(&in);
    cdf_tensor_map_clear(&dbg);
    cdf_tensor_map_clear(&golden);
}

/* RoPE tables vs the reference's (torch float32): within a float32 rounding or two. */
static void test_rope_tables(void **state) {
    (void)state;
    cdf_tensor_map dbg;
    tu_load_map(&dbg, DEBUG_HS);
    cdf_load_options o = opts(CDF_F32);
    cdf_mistral3_text *m;
    if (cdf_mistral3_text_load(tu_data(MODEL_DIR), &o, 0, &m) != CDF_OK) fail_msg("%s", cdf_last_error());
    static float inv[8], cs[512 * 16], sn[512 * 16];
    assert_int_equal(cdf_mistral3_rope_tables(m, 512, inv, cs, sn), CDF_OK);
    cdf_tensor *t_inv = cdf_tensor_from_host(tu_device(), CDF_F32, 1, (int64_t[]){8}, inv, CDF_F32);
    cdf_tensor *t_cos = cdf_tensor_from_host(tu_device(), CDF_F32, 2, (int64_t[]){512, 16}, cs, CDF_F32);
    cdf_tensor *t_sin = cdf_tensor_from_host(tu_device(), CDF_F32, 2, (int64_t[]){512, 16}, sn, CDF_F32);
    double di = tu_diff_tensors(t_inv, cdf_tensor_map_get(&dbg, "rope_inv_freq"), "rope_inv_freq");
    double dc = tu_diff_tensors(t_cos, cdf_tensor_map_get(&dbg, "rope_cos"), "rope_cos");
    double ds = tu_diff_tensors(t_sin, cdf_tensor_map_get(&dbg, "rope_sin"), "rope_sin");
    printf("  rope inv_freq max|diff| %.3g, cos %.3g, sin %.3g\n", di, dc, ds);
    assert_true(di <= 1e-7 && dc <= 2.4e-7 && ds <= 2.4e-7);
    cdf_tensor_release(t_inv);
    cdf_tensor_release(t_cos);
    cdf_tensor_release(t_sin);
    cdf_mistral3_text_free(m);
    cdf_tensor_map_clear(&dbg);
}

/* The direct API as the pipeline uses it: only the layers needed for hidden state 3 are loaded
 * (no layer 4, no final norm); encode gives the golden prompt_embeds; requests beyond what is
 * loaded, bad ids and mismatched masks are errors that say why. */
static void test_direct_api(void **state) {
    (void)state;
    cdf_load_options o = opts(CDF_F32);
    cdf_mistral3_text *m;
    if (cdf_mistral3_text_load(tu_data(MODEL_DIR), &o, 3, &m) != CDF_OK) fail_msg("%s", cdf_last_error());
    assert_int_equal(cdf_mistral3_text_hidden_size(m), 16);
    assert_int_equal(cdf_mistral3_text_num_layers(m), 4);
    cdf_tensor_map golden;
    tu_load_map(&golden, EMBEDS64);
    cdf_tensor *ids = cdf_tensor_map_get(&golden, "input_ids"), *mask = cdf_tensor_map_get(&golden, "attention_mask");
    cdf_tensor *pe = NULL;
    assert_int_equal(cdf_mistral3_encode(m, ids, mask, (int[]){1, 2, -2}, 3, &pe), CDF_OK); /* -2 = 3 */
    double d = tu_diff_tensors(pe, cdf_tensor_map_get(&golden, "prompt_embeds"), "prompt_embeds (direct)");
    printf("  direct API, layers (1, 2, -2), 3 layers loaded: max|diff| = %.3g\n", d);
    assert_true(d <= F32_TOL);
    cdf_tensor_release(pe); /* outside any scope: a plain reference */

    assert_int_equal(cdf_mistral3_encode(m, ids, mask, (int[]){1, 4}, 2, &pe), CDF_ERR_INVALID_ARG);
    assert_null(pe);
    printf("  error: %s\n", cdf_last_error());
    assert_non_null(strstr(cdf_last_error(), "not loaded"));
    assert_int_equal(cdf_mistral3_encode(m, ids, mask, (int[]){5}, 1, &pe), CDF_ERR_INVALID_ARG);
    assert_non_null(strstr(cdf_last_error(), "layer 5 is out of range"));
    assert_int_equal(cdf_mistral3_encode(m, ids, mask, (int[]){1}, 0, &pe), CDF_ERR_INVALID_ARG);

    int64_t bad[3] = {5, 131072, 1};
    cdf_tensor *bad_ids = cdf_tensor_from_host(tu_device(), CDF_I64, 2, (int64_t[]){1, 3}, bad, CDF_I64);
    /* checked on the device by the embedding lookup (no host read in the forward): the encode's
     * closing sync reports it, naming the op and the id */
    assert_int_equal(cdf_mistral3_encode(m, bad_ids, NULL, (int[]){1}, 1, &pe), CDF_ERR_DEVICE);
    printf("  error: %s\n", cdf_last_error());
    assert_non_null(strstr(cdf_last_error(), "'embedding' failed"));
    assert_non_null(strstr(cdf_last_error(), "id 131072 at position 1 is outside the table [0, 131072)"));
    assert_int_equal(cdf_mistral3_encode(m, ids, bad_ids, (int[]){1}, 1, &pe), CDF_ERR_SHAPE);
    assert_non_null(strstr(cdf_last_error(), "attention_mask"));
    cdf_tensor_release(bad_ids);

    /* no mask = every token real = a mask of ones; i32 ids work too */
    int32_t ids32[5] = {1, 17, 4568, 3, 4};
    int64_t ones[5] = {1, 1, 1, 1, 1};
    cdf_tensor *a = cdf_tensor_from_host(tu_device(), CDF_I32, 2, (int64_t[]){1, 5}, ids32, CDF_I32);
    cdf_tensor *ma = cdf_tensor_from_host(tu_device(), CDF_I64, 2, (int64_t[]){1, 5}, ones, CDF_I64);
    cdf_tensor *h1 = NULL, *h2 = NULL;
    assert_int_equal(cdf_mistral3_hidden_states(m, a, NULL, (int[]){0, 3}, 2, &h1), CDF_OK);
    assert_int_equal(cdf_mistral3_hidden_states(m, a, ma, (int[]){0, 3}, 2, &h2), CDF_OK);
    assert_int_equal(cdf_tensor_dim(h1, 1), 2);
    assert_true(tu_diff_tensors(h1, h2, "no mask vs ones") == 0.0);
    cdf_tensor_release(h1);
    cdf_tensor_release(h2);
    cdf_tensor_release(a);
    cdf_tensor_release(ma);
    cdf_tensor_map_clear(&golden);
    cdf_mistral3_text_free(m);

    /* the component: missing input, other method */
    cdf_component *c = tu_load_component(tu_data(MODEL_DIR), CDF_F32);
    cdf_tensor_map in, out;
    cdf_tensor_map_init(&in);
    cdf_tensor_map_init(&out);
    assert_int_equal(cdf_component_run(c, "forward", &in, &out), CDF_ERR_NOT_FOUND);
    assert_non_null(strstr(cdf_last_error(), "input_ids"));
    cdf_tensor *t = cdf_tensor_from_host(tu_device(), CDF_I32, 2, (int64_t[]){1, 5}, ids32, CDF_I32);
    cdf_tensor_map_set(&in, "input_ids", t);
    assert_int_equal(cdf_component_run(c, "decode", &in, &out), CDF_ERR_UNSUPPORTED);
    /* default layers (10, 20, 30) do not exist in a 4-layer model */
    assert_int_equal(cdf_component_run(c, "forward", &in, &out), CDF_ERR_INVALID_ARG);
    printf("  error: %s\n", cdf_last_error());
    assert_non_null(strstr(cdf_last_error(), "layer 10 is out of range"));
    assert_int_equal(out.n, 0);
    cdf_tensor_release(t);
    cdf_tensor_map_clear(&in);
    cdf_component_free(c);
}

/* ---- modified checkpoints in a temp dir ------------------------------------------------------- */
/* Copy the model into dst_dir leaving out tensor `drop`, giving tensor `narrow` one column less,
 * and replacing the name prefix `from` by `to` (each may be NULL); config.json is copied, or
 * written from `config` when given. */
static void write_modified_copy(const char *dst_dir, const char *drop, const char *narrow, const char *from, const char *to,
                                const char *config) {
    char path[1024];
    const char *src_dir = tu_data(MODEL_DIR);
    assert_int_equal(tu_system("mkdir -p '%s' && cp '%s/config.json' '%s/'", dst_dir, src_dir, dst_dir), 0);
    if (config) {
        snprintf(path, sizeof path, "%s/config.json", dst_dir);
        assert_int_equal(tu_write_file(path, config, strlen(config)), 0);
    }
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
        char name[512];
        if (from && strncmp(t->name, from, strlen(from)) == 0)
            snprintf(name, sizeof name, "%s%s", to, t->name + strlen(from));
        else
            snprintf(name, sizeof name, "%s", t->name);
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
    const char *missing = "language_model.model.layers.2.mlp.up_proj.weight";
    snprintf(dir, sizeof dir, "%s/mistral_missing", tu_tmpdir());
    write_modified_copy(dir, missing, NULL, NULL, NULL, NULL);
    assert_int_equal(cdf_component_load(dir, &o, &c), CDF_ERR_NOT_FOUND);
    assert_null(c);
    printf("  error: %s\n", cdf_last_error());
    assert_non_null(strstr(cdf_last_error(), missing));

    const char *misshaped = "language_model.model.layers.1.self_attn.k_proj.weight";
    snprintf(dir, sizeof dir, "%s/mistral_misshaped", tu_tmpdir());
    write_modified_copy(dir, NULL, misshaped, NULL, NULL, NULL);
    assert_int_equal(cdf_component_load(dir, &o, &c), CDF_ERR_SHAPE);
    assert_null(c);
    printf("  error: %s\n", cdf_last_error());
    assert_non_null(strstr(cdf_last_error(), misshaped));
    assert_non_null(strstr(cdf_last_error(), "[32, 15]"));

    const char *norm = "language_model.model.norm.weight";
    snprintf(dir, sizeof dir, "%s/mistral_no_norm", tu_tmpdir());
    write_modified_copy(dir, norm, NULL, NULL, NULL, NULL);
    assert_int_equal(cdf_component_load(dir, &o, &c), CDF_ERR_NOT_FOUND);
    assert_non_null(strstr(cdf_last_error(), norm));
    /* ... which the pipeline's partial load (up to hidden state 3) never reads */
    cdf_mistral3_text *m = NULL;
    assert_int_equal(cdf_mistral3_text_load(dir, &o, 3, &m), CDF_OK);
    cdf_mistral3_text_free(m);

    const char *embed = "language_model.model.embed_tokens.weight";
    snprintf(dir, sizeof dir, "%s/mistral_no_embed", tu_tmpdir());
    write_modified_copy(dir, embed, NULL, NULL, NULL, NULL);
    assert_int_equal(cdf_component_load(dir, &o, &c), CDF_ERR_NOT_FOUND);
    printf("  error: %s\n", cdf_last_error());
    assert_non_null(strstr(cdf_last_error(), embed));

    snprintf(dir, sizeof dir, "%s/mistral_rope_scaling", tu_tmpdir());
    write_modified_copy(dir, NULL, NULL, NULL, NULL,
                        "{\"architectures\": [\"Mistral3ForConditionalGeneration\"], \"text_config\": {\"hidden_size\": 16, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
                        " \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0}}}");
    cdf_status st = cdf_component_load(dir, &o, &c);
    printf("  error: %s\n", cdf_last_error());
    assert_int_equal(st, CDF_ERR_UNSUPPORTED);
    assert_non_null(strstr(cdf_last_error(), "yarn"));
}

/* The same weights under transformers >= 4.52's Mistral3 names (model.language_model.*, lm_head.*)
 * and as a plain MistralModel checkpoint (no prefix, config = text_config) give identical results. */
static void test_other_name_forms(void **state) {
    (void)state;
    float *ref = NULL, *alt = NULL, *plain = NULL;
    run_and_compare_rows(tu_data(MODEL_DIR), CDF_F32, EMBEDS64, 0, F32_TOL, "legacy names", &ref);
    char dir[512];
    snprintf(dir, sizeof dir, "%s/mistral_new_names", tu_tmpdir());
    write_modified_copy(dir, NULL, NULL, "language_model.model.", "model.language_model.", NULL);
    run_and_compare_rows(dir, CDF_F32, EMBEDS64, 0, F32_TOL, "model.language_model.* names", &alt);

    /* MistralModel: the text_config as config.json, tensor names without prefix */
    char *cfg_text = tu_read_file(tu_data(MODEL_DIR "/config.json"), NULL);
    cJSON *cfg = cJSON_Parse(cfg_text);
    free(cfg_text);
    cJSON *tc = cJSON_DetachItemFromObject(cfg, "text_config");
    assert_non_null(tc);
    cJSON_AddItemToObject(tc, "architectures", cJSON_CreateStringArray((const char *const[]){"MistralModel"}, 1));
    char *plain_cfg = cJSON_PrintUnformatted(tc);
    snprintf(dir, sizeof dir, "%s/mistral_plain", tu_tmpdir());
    write_modified_copy(dir, NULL, NULL, "language_model.model.", "", plain_cfg);
    run_and_compare_rows(dir, CDF_F32, EMBEDS64, 0, F32_TOL, "MistralModel names", &plain);
    free(plain_cfg);
    cJSON_Delete(tc);
    cJSON_Delete(cfg);

    assert_non_null(ref);
    assert_non_null(alt);
    assert_non_null(plain);
    assert_memory_equal(ref, alt, sizeof(float) * 2 * 64 * 48);
    assert_memory_equal(ref, plain, sizeof(float) * 2 * 64 * 48);
    free(ref);
    free(alt);
    free(plain);
}

/* sliding_window W (transformers: key j visible from query i iff i - j < W): with W = 2, the output
 * of layer 1 at position i depends on tokens i-1 and i only, so changing token 0 changes position
 * 1 but no later one; without a window (the golden config: null) every later position changes. */
static void test_sliding_window(void **state) {
    (void)state;
    char *cfg_text = tu_read_file(tu_data(MODEL_DIR "/config.json"), NULL);
    cJSON *cfg = cJSON_Parse(cfg_text);
    free(cfg_text);
    cJSON *tc = cJSON_GetObjectItem(cfg, "text_config");
    cJSON_ReplaceItemInObject(tc, "sliding_window", cJSON_CreateNumber(2));
    char *windowed = cJSON_PrintUnformatted(cfg);
    char dir[512];
    snprintf(dir, sizeof dir, "%s/mistral_window", tu_tmpdir());
    write_modified_copy(dir, NULL, NULL, NULL, NULL, windowed);
    free(windowed);
    cJSON_Delete(cfg);
    cdf_load_options o = opts(CDF_F32);
    const char *dirs[2] = {tu_data(MODEL_DIR), dir};
    for (int k = 0; k < 2; k++) {
        cdf_mistral3_text *m;
        if (cdf_mistral3_text_load(dirs[k], &o, 1, &m) != CDF_OK) fail_msg("%s", cdf_last_error());
        int64_t a[6] = {1, 17, 4568, 1584, 1420, 3}, b[6] = {2, 17, 4568, 1584, 1420, 3};
        cdf_tensor *ta = cdf_tensor_from_host(tu_device(), CDF_I64, 2, (int64_t[]){1, 6}, a, CDF_I64);
        cdf_tensor *tb = cdf_tensor_from_host(tu_device(), CDF_I64, 2, (int64_t[]){1, 6}, b, CDF_I64);
        cdf_tensor *ha = NULL, *hb = NULL;
        assert_int_equal(cdf_mistral3_encode(m, ta, NULL, (int[]){1}, 1, &ha), CDF_OK);
        assert_int_equal(cdf_mistral3_encode(m, tb, NULL, (int[]){1}, 1, &hb), CDF_OK);
        float *fa = cdf_tensor_read_f32(ha), *fb = cdf_tensor_read_f32(hb);
        for (int pos = 1; pos < 6; pos++) {
            double d = tu_max_abs_diff(fa + pos * 16, fb + pos * 16, 16, NULL);
            if (k == 1 && pos >= 2) assert_true(d == 0.0);
            else assert_true(d > 1e-3);
        }
        free(fa);
        free(fb);
        cdf_tensor_release(ha);
        cdf_tensor_release(hb);
        cdf_tensor_release(ta);
        cdf_tensor_release(tb);
        cdf_mistral3_text_free(m);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prompt_embeds_512),
        cmocka_unit_test(test_prompt_embeds_64),
        cmocka_unit_test(test_prompt_embeds_bf16_storage),
        cmocka_unit_test(test_all_hidden_states),
        cmocka_unit_test(test_rope_tables),
        cmocka_unit_test(test_direct_api),
        cmocka_unit_test(test_missing_and_misshaped_tensors),
        cmocka_unit_test(test_other_name_forms),
        cmocka_unit_test(test_sliding_window),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
