/* Flux2Pipeline against diffusers' own runs (tests/data/pipelines/flux2_dev_tiny, copied from
 * the golden set; generator and meanings: golden flux2_text/README.md section 5): the image side
 * from the golden prompt_embeds (pipe(prompt_embeds=...)), and the whole prompt -> image path.
 *
 * Tolerances. Exact by construction (compared with ==): token ids, attention mask, text ids,
 * latent ids, the initial noise (torch's CPU generator, bit-exact), the packed initial latents, the
 * timesteps, sigmas and guidance, and the per-step transformer timestep. The golden pipeline
 * README made no float64/thread re-run, so the bound comes from the component measurements: the
 * FLUX.2-dev transformer with our own expf time-projection table differs from diffusers by up to
 * 5.6e-5 on its output (golden README, "exact time_proj", guidance argument 4000) and the VAE by
 * ~3e-6. Every Euler step adds (sigma_next - sigma) * noise_pred, the step sizes sum to 1, and
 * the error of a step feeds the next one, so per-step noise predictions and latents get 3e-4 (5x
 * the single-forward sensitivity) and the decoded image, whose VAE has gains of order 1, 5e-4
 * (as test_pipeline.c uses for FLUX.1). prompt_embeds: 1e-4 (flux2_text README: "|diff| <= 1e-4
 * on hidden states / prompt_embeds" for a float32 implementation). The 8-bit image may differ by
 * one level where a value sits at a rounding boundary. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdiffusers/cdiffusers.h"
#include "nn/nn.h"
#include "pipelines/flux2_pipeline.h"

#define STEP_ATOL 3e-4
#define IMAGE_ATOL 5e-4
#define EMBEDS_ATOL 1e-4

static const char *pipe_dir(void) { return tu_data("pipelines/flux2_dev_tiny"); }

typedef struct golden_call {
    cJSON *json;
    const char *prompt;
    int height, width, steps;
    float guidance;
    uint64_t seed;
} golden_call;

static void read_call(const char *cs, golden_call *c) {
    char path[1200];
    snprintf(path, sizeof path, "%s/cases/%s/expected.json", pipe_dir(), cs);
    char *txt = tu_read_file(path, NULL);
    assert_non_null(txt);
    c->json = cJSON_Parse(txt);
    free(txt);
    assert_non_null(c->json);
    const cJSON *k = cJSON_GetObjectItem(c->json, "case");
    c->prompt = cJSON_GetObjectItem(k, "prompt")->valuestring;
    c->height = cJSON_GetObjectItem(k, "height")->valueint;
    c->width = cJSON_GetObjectItem(k, "width")->valueint;
    c->steps = cJSON_GetObjectItem(k, "steps")->valueint;
    c->guidance = (float)cJSON_GetObjectItem(k, "guidance")->valuedouble;
    c->seed = (uint64_t)cJSON_GetObjectItem(k, "seed")->valuedouble;
    /* the call used text_encoder_out_layers=[1, 2, 3] and max_sequence_length=512 */
    assert_non_null(strstr(cJSON_GetObjectItem(c->json, "call")->valuestring, "text_encoder_out_layers=[1, 2, 3]"));
    assert_non_null(strstr(cJSON_GetObjectItem(c->json, "call")->valuestring, "max_sequence_length=512"));
}

static const int k_layers[3] = {1, 2, 3};

static cdf_generate_params params_of(const golden_call *c) {
    cdf_generate_params gp = cdf_generate_params_default();
    gp.prompt = c->prompt;
    gp.height = c->height;
    gp.width = c->width;
    gp.num_inference_steps = c->steps;
    gp.guidance_scale = c->guidance;
    gp.seed = c->seed;
    gp.max_sequence_length = 512;
    gp.text_encoder_out_layers = k_layers;
    gp.num_text_encoder_out_layers = 3;
    return gp;
}

/* Compare captured tensor `key` with the golden one; tol 0 means bit-exact. */
static void cmp(const char *cs, cdf_tensor_map *cap, cdf_tensor_map *gold, const char *key, double tol) {
    cdf_tensor *t = cdf_tensor_map_get(cap, key), *g = cdf_tensor_map_get(gold, key);
    if (!t) fail_msg("%s: the pipeline captured no '%s'", cs, key);
    if (!g) fail_msg("%s: the golden file has no '%s'", cs, key);
    double d = tu_diff_tensors(t, g, key);
    print_message("  %s %-28s max|diff| = %.3g (tol %.3g)\n", cs, key, d, tol);
    assert_true(tol == 0 ? d == 0 : d <= tol);
}

/* The 8-bit image against the golden image.png: at most one level off anywhere. */
static void cmp_png(const char *cs, const cdf_image *img) {
    char path[1200];
    snprintf(path, sizeof path, "%s/cases/%s/image.png", pipe_dir(), cs);
    cdf_png_image png;
    if (cdf_png_read(path, &png) != CDF_OK) fail_msg("%s", cdf_last_error());
    assert_int_equal(png.width, img->width);
    assert_int_equal(png.height, img->height);
    assert_int_equal(png.channels, 3);
    int worst = 0, ndiff = 0;
    for (size_t i = 0; i < (size_t)img->width * img->height * 3; i++) {
        int d = abs((int)png.pixels[i] - (int)img->pixels[i]);
        if (d > worst) worst = d;
        ndiff += d != 0;
    }
    print_message("  %s image.png: %d values differ, max %d level(s)\n", cs, ndiff, worst);
    assert_true(worst <= 1);
    cdf_png_image_free(&png);
}

/* Everything after the text encoder, compared key by key. */
static void check_image_side(const char *cs, const golden_call *c, cdf_tensor_map *cap, cdf_tensor_map *gold, const cdf_image *img) {
    const char *exact[] = {"text_ids", "latent_ids", "initial_noise", "initial_latents", "timesteps", "sigmas", "guidance"};
    for (size_t i = 0; i < sizeof exact / sizeof *exact; i++) cmp(cs, cap, gold, exact[i], 0);
    for (int i = 0; i < c->steps; i++) {
        char key[64];
        snprintf(key, sizeof key, "step%02d.transformer_timestep", i);
        cmp(cs, cap, gold, key, 0);
        snprintf(key, sizeof key, "step%02d.noise_pred", i);
        cmp(cs, cap, gold, key, STEP_ATOL);
        snprintf(key, sizeof key, "step%02d.latents", i);
        cmp(cs, cap, gold, key, STEP_ATOL);
    }
    cmp(cs, cap, gold, "final_latents", STEP_ATOL);
    cmp(cs, cap, gold, "vae_decode_input", STEP_ATOL);
    cmp(cs, cap, gold, "vae_decode_output", IMAGE_ATOL);
    cmp(cs, cap, gold, "image", IMAGE_ATOL);
    cmp_png(cs, img);
}

/* One pipeline for all tests (loading the 17 MB tokenizer dominates otherwise). */
static cdf_pipeline *g_pipe;

static int group_setup(void **st) {
    (void)st;
    /* the golden pipeline ran in f32: the exact path, not the bf16 default */
    cdf_pipeline_load_params lp = cdf_pipeline_load_params_default();
    lp.weight_dtype = CDF_F32;
    if (cdf_pipeline_load(pipe_dir(), &lp, &g_pipe) != CDF_OK) {
        print_error("load %s: %s\n", pipe_dir(), cdf_last_error());
        return -1;
    }
    return 0;
}

static int group_teardown(void **st) {
    (void)st;
    cdf_pipeline_free(g_pipe);
    return 0;
}

static cdf_pipeline *load_pipeline(void) {
    assert_non_null(g_pipe);
    assert_string_equal(cdf_pipeline_class_name(g_pipe), "Flux2Pipeline");
    return g_pipe;
}

static void load_gold(const char *cs, cdf_tensor_map *gold) {
    char rel[256];
    snprintf(rel, sizeof rel, "pipelines/flux2_dev_tiny/cases/%s/expected.safetensors", cs);
    cdf_tensor_map_init(gold);
    tu_load_map(gold, rel);
}

/* pipe(prompt_embeds=golden prompt_embeds, ...): the image side alone (one case; the full runs
 * below check the same keys for both cases after the text encoder). */
static void run_from_embeds(const char *cs) {
    golden_call c;
    read_call(cs, &c);
    cdf_tensor_map gold, cap;
    load_gold(cs, &gold);
    cdf_tensor_map_init(&cap);
    cdf_pipeline *p = load_pipeline();
    cdf_generate_params gp = params_of(&c);
    gp.capture = (cdf_capture *)&cap;
    cdf_image img;
    if (cdf_flux2_generate_from_embeds(p, &gp, cdf_tensor_map_get(&gold, "prompt_embeds"), &img) != CDF_OK)
        fail_msg("%s: %s", cs, cdf_last_error());
    assert_int_equal(img.width, c.width);
    assert_int_equal(img.height, c.height);
    check_image_side(cs, &c, &cap, &gold, &img);
    cdf_image_free(&img);
    cdf_tensor_map_clear(&cap);
    cdf_tensor_map_clear(&gold);
    cJSON_Delete(c.json);
}

static void test_image_side_64x64(void **st) {
    (void)st;
    run_from_embeds("64x64");
}

/* The whole pipeline: prompt -> chat template -> tekken ids -> Mistral hidden states 1, 2, 3 ->
 * the image side. */
static void run_full(const char *cs) {
    golden_call c;
    read_call(cs, &c);
    cdf_tensor_map gold, cap;
    load_gold(cs, &gold);
    cdf_tensor_map_init(&cap);
    cdf_pipeline *p = load_pipeline();
    cdf_generate_params gp = params_of(&c);
    gp.capture = (cdf_capture *)&cap;
    cdf_image img;
    if (cdf_pipeline_generate(p, &gp, &img) != CDF_OK) fail_msg("%s: %s", cs, cdf_last_error());
    cmp(cs, &cap, &gold, "input_ids", 0);
    cmp(cs, &cap, &gold, "attention_mask", 0);
    cmp(cs, &cap, &gold, "prompt_embeds", EMBEDS_ATOL);
    check_image_side(cs, &c, &cap, &gold, &img);
    cdf_image_free(&img);
    cdf_tensor_map_clear(&cap);
    cdf_tensor_map_clear(&gold);
    cJSON_Delete(c.json);
}

static void test_full_64x64(void **st) {
    (void)st;
    run_full("64x64");
}
static void test_full_48x80(void **st) {
    (void)st;
    run_full("48x80");
}

/* The defaults Flux2Pipeline.__call__ has: 50 steps, guidance 4.0, 512 tokens, 128 x vae
 * scale factor pixels per side. */
static void test_defaults(void **st) {
    (void)st;
    cdf_pipeline *p = load_pipeline();
    cdf_generate_params gp = cdf_generate_params_default();
    cdf_pipeline_resolve_defaults(p, &gp);
    assert_int_equal(gp.num_inference_steps, 50);
    assert_true(gp.guidance_scale == 4.0f);
    assert_int_equal(gp.max_sequence_length, 512);
    assert_int_equal(gp.height, 128 * 8); /* the tiny VAE has 4 blocks: scale factor 8 */
    assert_int_equal(gp.width, 128 * 8);
}

static void test_errors(void **st) {
    (void)st;
    cdf_pipeline *p = load_pipeline();
    cdf_tensor_map gold;
    load_gold("64x64", &gold);
    golden_call c;
    read_call("64x64", &c);
    cdf_generate_params gp = params_of(&c);
    cdf_image img;
    cdf_scope_push();
    /* prompt embeddings of the wrong width (two layers' worth) */
    cdf_tensor *narrow = cdf_narrow(cdf_tensor_map_get(&gold, "prompt_embeds"), 2, 0, 32);
    assert_int_equal(cdf_flux2_generate_from_embeds(p, &gp, narrow, &img), CDF_ERR_SHAPE);
    print_message("  expected error: %s\n", cdf_last_error());
    assert_non_null(strstr(cdf_last_error(), "joint_attention_dim"));
    assert_null(img.pixels);
    /* a size that is not a multiple of 16 */
    gp.height = 40;
    assert_int_equal(cdf_flux2_generate_from_embeds(p, &gp, cdf_tensor_map_get(&gold, "prompt_embeds"), &img), CDF_ERR_INVALID_ARG);
    print_message("  expected error: %s\n", cdf_last_error());
    gp.height = c.height;
    /* too many text encoder layers requested */
    int many[20] = {0};
    gp.text_encoder_out_layers = many;
    gp.num_text_encoder_out_layers = 20;
    gp.num_inference_steps = 1;
    assert_int_equal(cdf_pipeline_generate(p, &gp, &img), CDF_ERR_INVALID_ARG);
    print_message("  expected error: %s\n", cdf_last_error());
    assert_non_null(strstr(cdf_last_error(), "text_encoder_out_layers"));
    cdf_scope_pop(NULL, 0);
    cJSON_Delete(c.json);
    cdf_tensor_map_clear(&gold);
}

/* cdf_pipeline_compile with fullgraph (what `generate --mode compile` does): the transformer and
 * the VAE decode each compile without a graph break (the ids scatter before the decode runs in
 * the pipeline, eagerly), both golden cases pass, and a second run of a seen size recompiles
 * nothing. Last in the list: it leaves the shared pipeline compiled. */
static void test_compiled_fullgraph(void **st) {
    (void)st;
    cdf_pipeline *p = load_pipeline();
    cdf_compile_options o = cdf_compile_options_default();
    assert_true(o.fullgraph);
    assert_int_equal(cdf_pipeline_compile(p, &o), CDF_OK);
    cdf_exec_stats s0, s1, s2;
    cdf_exec_get_stats(&s0);
    run_full("64x64");
    run_full("48x80");
    cdf_exec_get_stats(&s1);
    print_message("  compiled: %lld compiles, %lld graph breaks\n", (long long)(s1.compiles - s0.compiles),
                  (long long)(s1.graph_breaks - s0.graph_breaks));
    assert_int_equal(s1.graph_breaks - s0.graph_breaks, 0);
    assert_int_equal(s1.compiles - s0.compiles, 4); /* transformer + VAE decode, per size */
    cdf_compile_set_forbid_recompile(true);
    run_full("64x64");
    cdf_compile_set_forbid_recompile(false);
    cdf_exec_get_stats(&s2);
    assert_int_equal(s2.compiles - s1.compiles, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_image_side_64x64),
        cmocka_unit_test(test_full_64x64),
        cmocka_unit_test(test_full_48x80),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_compiled_fullgraph),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
