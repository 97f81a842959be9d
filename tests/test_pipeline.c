/* Whole pipelines against diffusers' own runs (tests/data/pipelines, copied from the golden
 * set): prompt -> tokens -> text embeddings -> noise -> schedule -> denoising -> VAE -> image.
 *
 * Tolerances (golden pipelines README, "Tolerances observed"): ids, noise, initial latents,
 * sigmas and timesteps are exact by construction. prompt_embeds: atol 2e-5. Latents after the
 * loop: 5e-4, because we evaluate the sinusoidal timestep table with our own expf (the README
 * measured up to 1.4e-4 for that alone on FLUX.1-dev). VAE output / image: 5e-4 for the same
 * reason, and image_uint8 may differ by at most one level. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdiffusers/cdiffusers.h"
#include "nn/nn.h"

typedef struct golden_case {
    const char *pipeline, *name;
    bool embeds; /* the case's captured prompt_embeds (and pooled, negative) in place of its prompts */
} golden_case;

static const golden_case k_cases[] = {
    {"flux1_schnell_tiny", "64x64", false},      {"flux1_schnell_tiny", "64x96_seq256", false},
    {"flux1_dev_tiny", "64x64", false},          {"flux1_dev_tiny", "96x64_long_default_seq", false},
    {"flux1_dev_tiny", "64x64_true_cfg", false}, {"sd35m_tiny", "64x64_neg", false},
    {"sd35m_tiny", "64x96_bang_default_seq", false}, {"sd35m_tiny", "96x64_nocfg", false},
    /* diffusers' prompt_embeds= (cdf_generate_params.prompt_embeds): no prompt, the same latents */
    {"flux1_schnell_tiny", "64x64", true}, {"flux1_dev_tiny", "64x64_true_cfg", true}, {"sd35m_tiny", "64x64_neg", true},
};

/* A golden tensor as an f32 host tensor (NULL if the case has none). */
static cdf_tensor *golden_tensor(cdf_st_file *gf, const char *key) {
    const cdf_st_tensor *g = cdf_st_find(gf, key);
    if (!g) return NULL;
    float *v = malloc((size_t)cdf_st_numel(g) * sizeof *v);
    assert_non_null(v);
    cdf_convert(v, CDF_F32, cdf_st_data(gf, g), g->dtype, (size_t)cdf_st_numel(g));
    cdf_tensor *t = cdf_tensor_from_host(cdf_device_get("cpu"), CDF_F32, g->ndim, g->shape, v, CDF_F32);
    free(v);
    assert_non_null(t);
    return t;
}

/* max |a - b| over the tensor `key` of the capture vs the golden file's tensor of the same key
 * (or `gkey`), optionally a row `row` of a stacked golden tensor [N, ...]. */
static double cmp_tensor(cdf_tensor_map *cap, const char *key, cdf_st_file *gf, const char *gkey, int row, bool *missing) {
    cdf_tensor *t = cdf_tensor_map_get(cap, key);
    const cdf_st_tensor *g = cdf_st_find(gf, gkey);
    *missing = !t || !g;
    if (*missing) {
        print_message("    missing %s (ours %p, golden %p)\n", key, (void *)t, (void *)g);
        return INFINITY;
    }
    float *ours = cdf_tensor_read_f32(t);
    assert_non_null(ours);
    int64_t n = cdf_tensor_numel(t);
    int64_t gn = cdf_st_numel(g) / (row >= 0 ? g->shape[0] : 1);
    assert_int_equal(n, gn);
    float *ref = malloc(n * sizeof *ref);
    const void *base = cdf_st_data(gf, g);
    size_t esz = cdf_dtype_size(g->dtype);
    cdf_convert(ref, CDF_F32, (const char *)base + (row >= 0 ? row : 0) * gn * esz, g->dtype, (size_t)n);
    double d = tu_max_abs_diff(ours, ref, n, NULL);
    free(ours);
    free(ref);
    return d;
}

static void run_case(const golden_case *gc) {
    char dir[1024], path[1200];
    snprintf(dir, sizeof dir, "%s", tu_data("pipelines"));
    snprintf(dir + strlen(dir), sizeof dir - strlen(dir), "/%s", gc->pipeline);
    snprintf(path, sizeof path, "%s/cases/%s/expected.json", dir, gc->name);
    size_t len;
    char *txt = tu_read_file(path, &len);
    assert_non_null(txt);
    cJSON *js = cJSON_Parse(txt);
    free(txt);
    assert_non_null(js);
    const cJSON *call = cJSON_GetObjectItem(js, "call");
    cdf_generate_params gp = cdf_generate_params_default();
    gp.prompt = cJSON_GetObjectItem(call, "prompt")->valuestring;
    const cJSON *neg = cJSON_GetObjectItem(call, "negative_prompt");
    gp.negative_prompt = cJSON_IsString(neg) ? neg->valuestring : NULL;
    gp.height = cJSON_GetObjectItem(call, "height")->valueint;
    gp.width = cJSON_GetObjectItem(call, "width")->valueint;
    gp.num_inference_steps = cJSON_GetObjectItem(call, "num_inference_steps")->valueint;
    gp.guidance_scale = cJSON_GetObjectItem(call, "guidance_scale")->valuedouble;
    const cJSON *tcfg = cJSON_GetObjectItem(call, "true_cfg_scale");
    if (tcfg) gp.true_cfg_scale = tcfg->valuedouble;
    const cJSON *msl = cJSON_GetObjectItem(call, "max_sequence_length");
    if (msl) gp.max_sequence_length = msl->valueint;
    gp.seed = (uint64_t)cJSON_GetObjectItem(call, "seed")->valuedouble;

    cdf_pipeline *pipe = NULL;
    /* the golden pipelines ran in f32: the exact path, not the bf16 default */
    cdf_pipeline_load_params lp = cdf_pipeline_load_params_default();
    lp.weight_dtype = CDF_F32;
    if (cdf_pipeline_load(dir, &lp, &pipe) != CDF_OK) fail_msg("load %s: %s", dir, cdf_last_error());
    cdf_tensor_map cap;
    cdf_tensor_map_init(&cap);
    gp.capture = (cdf_capture *)&cap;
    snprintf(path, sizeof path, "%s/cases/%s/expected.safetensors", dir, gc->name);
    cdf_st_file *gf;
    assert_int_equal(cdf_st_open(path, &gf), CDF_OK);
    cdf_tensor *emb[4] = {0};
    if (gc->embeds) {
        static const char *const keys[4] = {"prompt_embeds", "pooled_prompt_embeds", "negative_prompt_embeds",
                                            "negative_pooled_prompt_embeds"};
        for (int i = 0; i < 4; i++) emb[i] = golden_tensor(gf, keys[i]);
        gp.prompt = NULL, gp.negative_prompt = NULL;
        gp.prompt_embeds = emb[0], gp.pooled_prompt_embeds = emb[1];
        gp.negative_prompt_embeds = emb[2], gp.negative_pooled_prompt_embeds = emb[3];
    }
    cdf_image img;
    if (cdf_pipeline_generate(pipe, &gp, &img) != CDF_OK) fail_msg("generate %s/%s: %s", gc->pipeline, gc->name, cdf_last_error());
    for (int i = 0; i < 4; i++) cdf_tensor_release(emb[i]);
    bool miss;
    struct { const char *key; double tol; } exact_or_close[] = {
        {"input_ids.tokenizer", 0}, {"input_ids.tokenizer_2", 0}, {"input_ids.tokenizer_3", 0},
        {"noise", 0}, {"latents_initial", 0}, {"sigmas", 0}, {"timesteps", 0},
        {"prompt_embeds", 2e-5}, {"pooled_prompt_embeds", 2e-5},
        {"negative_prompt_embeds", 2e-5}, {"negative_pooled_prompt_embeds", 2e-5},
        {"latents_final", 5e-4}, {"vae_decode_output", 5e-4}, {"image", 5e-4},
    };
    for (size_t i = 0; i < sizeof exact_or_close / sizeof *exact_or_close; i++) {
        const char *k = exact_or_close[i].key;
        bool golden_has = cdf_st_find(gf, k) != NULL;
        if (!golden_has) continue; /* e.g. no negative prompt in this case */
        if (gc->embeds && strstr(k, "input_ids")) continue; /* nothing is tokenized */
        double d = cmp_tensor(&cap, k, gf, k, -1, &miss);
        print_message("  %s/%s %-30s max|diff| = %.3g (tol %.1g)\n", gc->pipeline, gc->name, k, d, exact_or_close[i].tol);
        assert_false(miss);
        assert_true(d <= exact_or_close[i].tol);
    }
    /* per-step latents */
    const cdf_st_tensor *las = cdf_st_find(gf, "latents_after_step");
    assert_non_null(las);
    for (int i = 0; i < gp.num_inference_steps; i++) {
        char key[64];
        snprintf(key, sizeof key, "latents_after_step.%d", i);
        double d = cmp_tensor(&cap, key, gf, "latents_after_step", i, &miss);
        assert_false(miss);
        assert_true(d <= 5e-4);
    }
    /* the 8-bit image: at most one level off anywhere */
    const cdf_st_tensor *u8 = cdf_st_find(gf, "image_uint8");
    assert_non_null(u8);
    assert_int_equal(cdf_st_numel(u8), (int64_t)img.width * img.height * 3);
    const uint8_t *ref = cdf_st_data(gf, u8);
    int worst = 0, ndiff = 0;
    for (int64_t i = 0; i < cdf_st_numel(u8); i++) {
        int d = abs((int)ref[i] - (int)img.pixels[i]);
        if (d > worst) worst = d;
        ndiff += d != 0;
    }
    print_message("  %s/%s image_uint8: %d values differ, max %d level(s)\n", gc->pipeline, gc->name, ndiff, worst);
    assert_true(worst <= 1);
    cdf_st_close(gf);
    cdf_image_free(&img);
    cdf_tensor_map_clear(&cap);
    cdf_pipeline_free(pipe);
    cJSON_Delete(js);
}

static void test_case(void **state) { run_case((const golden_case *)*state); }

static void test_bad_requests_refused_before_work(void **state) {
    (void)state;
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/flux1_schnell_tiny", tu_data("pipelines"));
    cdf_pipeline *pipe = NULL;
    assert_int_equal(cdf_pipeline_load(dir, NULL, &pipe), CDF_OK);
    cdf_generate_params gp = cdf_generate_params_default();
    gp.prompt = "x";
    cdf_image img;
    gp.height = 72; gp.width = 64;
    assert_int_equal(cdf_pipeline_generate(pipe, &gp, &img), CDF_ERR_INVALID_ARG);
    assert_non_null(strstr(cdf_last_error(), "multiples of 16"));
    gp.height = 1 << 16; gp.width = 1 << 16;
    assert_int_equal(cdf_pipeline_generate(pipe, &gp, &img), CDF_ERR_LIMIT);
    assert_non_null(strstr(cdf_last_error(), "GB"));
    gp.height = 64; gp.width = 64; gp.num_inference_steps = -3;
    cdf_generate_params q = gp;
    cdf_pipeline_resolve_defaults(pipe, &q); /* negative steps are not "default": they must fail */
    gp.num_inference_steps = 2000;
    assert_int_equal(cdf_pipeline_generate(pipe, &gp, &img), CDF_ERR_INVALID_ARG);
    cdf_pipeline_free(pipe);
    /* a folder without a sub-folder model_index.json names */
    assert_int_equal(cdf_pipeline_load("/nonexistent/folder", NULL, &pipe), CDF_ERR_NOT_FOUND);
}

int main(void) {
    struct CMUnitTest tests[sizeof k_cases / sizeof *k_cases + 1];
    size_t n = 0;
    for (size_t i = 0; i < sizeof k_cases / sizeof *k_cases; i++) {
        static char names[16][96];
        snprintf(names[i], sizeof names[i], "%s/%s%s", k_cases[i].pipeline, k_cases[i].name, k_cases[i].embeds ? " (prompt_embeds)" : "");
        tests[n++] = (struct CMUnitTest){names[i], test_case, NULL, NULL, (void *)&k_cases[i]};
    }
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_bad_requests_refused_before_work);
    return _cmocka_run_group_tests("pipelines", tests, n, NULL, NULL);
}
