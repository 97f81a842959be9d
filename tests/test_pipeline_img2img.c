/* img2img, inpainting and batches against diffusers' own pipelines (tests/data/golden/img2img,
 * made by tools/make-img2img-golden/make_golden.py: FluxImg2ImgPipeline,
 * StableDiffusion3Img2ImgPipeline, FluxInpaintPipeline, StableDiffusion3InpaintPipeline,
 * FluxPipeline / StableDiffusion3Pipeline with num_images_per_prompt=2 and generator lists,
 * Flux2Pipeline with one and two reference images, from the flux2_dev_tiny case's prompt_embeds).
 *
 * Tolerances (that folder's README, which takes them from the golden pipelines README):
 *   exact: the preprocessed image (PIL Lanczos resize, /255, 2x-1), the binarised mask, the noise
 *          (drawn after the VAE's latent sample), the schedule; text-to-image initial latents;
 *   image latents and img2img initial latents: they go through the VAE encoder, whose golden
 *          tolerance is 2e-5 (x scaling_factor 1.53 for SD3; FLUX.2: / the BatchNorm std): 5e-5;
 *   FLUX.2 reference ids: exact;
 *   latents after every step and final: 5e-4; image: 5e-4; image_uint8: at most 1 level. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdiffusers/cdiffusers.h"
#include "nn/nn.h"
#include "pipelines/flux2_pipeline.h"
#include "pipelines/pipeline_impl.h"

/* golden/<folder>/<case> */
static const char *const k_cases[] = {
    "img2img/flux_img2img_s06_64x64", "img2img/flux_img2img_s09_48x80", "img2img/sd3_img2img_s06_64x64",
    "img2img/sd3_img2img_s03_48x80",  "img2img/flux_inpaint_s08_64x64", "img2img/flux_inpaint_s10_48x80",
    "img2img/sd3_inpaint_s07_64x64",  "img2img/sd3_inpaint_s10_48x80",  "img2img/flux_t2i_n2_64x64",
    "img2img/flux_t2i_gens_64x64",    "img2img/sd3_t2i_n2_64x64",       "img2img/sd3_t2i_gens_64x64",
    "img2img/flux_img2img_n2_64x64",  "img2img/flux2_ref1_64x64",       "img2img/flux2_ref2_64x96",
    /* tools/make-fidelity-sweep/make_golden.py: strengths whose float32 rounding would start a step
     * earlier (0.6 x 5, 0.3 x 10, 0.55 x 20, 0.6 x 25, 0.2 x 5, 0.14 x 50), and seed lists with an input image */
    "fidelity/flux_img2img_s06_n5",   "fidelity/sd3_img2img_s06_n5",    "fidelity/flux_inpaint_s03_n10",
    "fidelity/sd3_inpaint_s055_n20",  "fidelity/flux_img2img_s06_n25",  "fidelity/sd3_img2img_s03_n10",
    "fidelity/flux_inpaint_s02_n5",   "fidelity/sd3_img2img_s014_n50",
    "fidelity/flux_img2img_gens",     "fidelity/sd3_inpaint_gens",      "fidelity/flux_inpaint_gens",
};

/* max |ours - golden element block| where the block is `n` values at element offset `off`. */
static double cmp_at(cdf_tensor_map *cap, const char *key, cdf_st_file *gf, const char *gkey, int64_t block, bool *missing) {
    cdf_tensor *t = cdf_tensor_map_get(cap, key);
    const cdf_st_tensor *g = cdf_st_find(gf, gkey);
    *missing = !t || !g;
    if (*missing) {
        print_message("    missing %s (ours %p) / %s (golden %p)\n", key, (void *)t, gkey, (void *)g);
        return INFINITY;
    }
    float *ours = cdf_tensor_read_f32(t);
    assert_non_null(ours);
    int64_t n = cdf_tensor_numel(t);
    assert_true((block + 1) * n <= cdf_st_numel(g));
    float *ref = malloc(n * sizeof *ref);
    cdf_convert(ref, CDF_F32, (const char *)cdf_st_data(gf, g) + block * n * cdf_dtype_size(g->dtype), g->dtype, (size_t)n);
    double d = tu_max_abs_diff(ours, ref, n, NULL);
    free(ours);
    free(ref);
    return d;
}

static void load_png(const char *dir, const char *name, cdf_png_image *png, cdf_image *img) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (cdf_png_read(path, png) != CDF_OK) fail_msg("%s: %s", path, cdf_last_error());
    *img = (cdf_image){.width = png->width, .height = png->height, .channels = png->channels, .pixels = png->pixels};
}

static void run_case(const char *name) {
    char dir[1024], path[1200], pipe_dir[1200];
    snprintf(dir, sizeof dir, "%s/golden/%s", tu_data(""), name);
    snprintf(path, sizeof path, "%s/expected.json", dir);
    size_t len;
    char *txt = tu_read_file(path, &len);
    assert_non_null(txt);
    cJSON *js = cJSON_Parse(txt);
    free(txt);
    assert_non_null(js);
    const cJSON *call = cJSON_GetObjectItem(js, "call"), *seeds = cJSON_GetObjectItem(js, "seeds");
    cdf_generate_params gp = cdf_generate_params_default();
    const cJSON *prompt = cJSON_GetObjectItem(call, "prompt");
    gp.prompt = cJSON_IsString(prompt) ? prompt->valuestring : NULL;
    const cJSON *neg = cJSON_GetObjectItem(call, "negative_prompt");
    gp.negative_prompt = cJSON_IsString(neg) ? neg->valuestring : NULL;
    const cJSON *height = cJSON_GetObjectItem(call, "height"), *width = cJSON_GetObjectItem(call, "width");
    if (height) gp.height = height->valueint; /* FLUX.2: absent = the first reference image's size */
    if (width) gp.width = width->valueint;
    gp.num_inference_steps = cJSON_GetObjectItem(call, "num_inference_steps")->valueint;
    gp.guidance_scale = cJSON_GetObjectItem(call, "guidance_scale")->valuedouble;
    const cJSON *msl = cJSON_GetObjectItem(call, "max_sequence_length");
    if (msl) gp.max_sequence_length = msl->valueint;
    const cJSON *strength = cJSON_GetObjectItem(call, "strength"), *nipp = cJSON_GetObjectItem(call, "num_images_per_prompt");
    if (strength) gp.strength = strength->valuedouble;
    uint64_t seed_list[4];
    if (cJSON_IsArray(seeds)) {
        gp.num_seeds = cJSON_GetArraySize(seeds);
        for (int i = 0; i < gp.num_seeds; i++) seed_list[i] = (uint64_t)cJSON_GetArrayItem(seeds, i)->valuedouble;
        gp.seeds = seed_list;
    } else {
        gp.seed = (uint64_t)seeds->valuedouble;
        if (nipp) gp.num_images = nipp->valueint;
    }
    cdf_png_image png_img[2] = {0}, png_mask = {0};
    cdf_image in_img[2], in_mask;
    const cJSON *img_in = cJSON_GetObjectItem(js, "image_in"), *mask_in = cJSON_GetObjectItem(js, "mask_in");
    if (cJSON_IsString(img_in)) {
        load_png(dir, img_in->valuestring, &png_img[0], &in_img[0]);
        gp.image = in_img;
    } else if (cJSON_IsArray(img_in)) { /* FLUX.2 reference images */
        gp.num_input_images = cJSON_GetArraySize(img_in);
        assert_true(gp.num_input_images <= 2);
        for (int i = 0; i < gp.num_input_images; i++) load_png(dir, cJSON_GetArrayItem(img_in, i)->valuestring, &png_img[i], &in_img[i]);
        gp.image = in_img;
    }
    if (cJSON_IsString(mask_in)) {
        load_png(dir, mask_in->valuestring, &png_mask, &in_mask);
        gp.mask_image = &in_mask;
    }
    const char *folder = strrchr(cJSON_GetObjectItem(js, "folder")->valuestring, '/') + 1;
    snprintf(pipe_dir, sizeof pipe_dir, "%s/%s", tu_data("pipelines"), folder);
    cdf_pipeline *pipe = NULL;
    cdf_pipeline_load_params lp = cdf_pipeline_load_params_default();
    lp.weight_dtype = CDF_F32; /* diffusers ran in float32 */
    if (cdf_pipeline_load(pipe_dir, &lp, &pipe) != CDF_OK) fail_msg("load %s: %s", pipe_dir, cdf_last_error());
    cdf_tensor_map cap;
    cdf_tensor_map_init(&cap);
    gp.capture = (cdf_capture *)&cap;
    const int n = cdf_generate_params_count(&gp);
    cdf_image out[4];
    cdf_tensor_map f2;
    cdf_tensor_map_init(&f2);
    if (!prompt) { /* FLUX.2: the text encoder's output from its own golden case */
        tu_load_map(&f2, "pipelines/flux2_dev_tiny/cases/64x64/expected.safetensors");
        if (cdf_flux2_generate_from_embeds(pipe, &gp, cdf_tensor_map_get(&f2, "prompt_embeds"), &out[0]) != CDF_OK)
            fail_msg("generate %s: %s", name, cdf_last_error());
        /* one image: its captures under the plain keys, as "0.<key>" too */
        cdf_tensor_map plain = cap;
        cdf_tensor_map_init(&cap);
        for (int i = 0; i < plain.n; i++) {
            char key[128];
            snprintf(key, sizeof key, "0.%s", plain.names[i]);
            assert_int_equal(cdf_tensor_map_set(&cap, key, plain.tensors[i]), CDF_OK);
        }
        cdf_tensor_map_clear(&plain);
        /* FLUX.2's step captures are step%02d.latents */
        for (int st = 0; st < cJSON_GetObjectItem(js, "steps_run")->valueint; st++) {
            char from[64], to[64];
            snprintf(from, sizeof from, "0.step%02d.latents", st);
            snprintf(to, sizeof to, "0.latents_after_step.%d", st);
            assert_int_equal(cdf_tensor_map_set(&cap, to, cdf_tensor_map_get(&cap, from)), CDF_OK);
        }
    } else if (cdf_pipeline_generate_images(pipe, &gp, out, n) != CDF_OK) {
        fail_msg("generate %s: %s", name, cdf_last_error());
    }

    snprintf(path, sizeof path, "%s/expected.safetensors", dir);
    cdf_st_file *gf;
    assert_int_equal(cdf_st_open(path, &gf), CDF_OK);
    const int steps_run = cJSON_GetObjectItem(js, "steps_run")->valueint;
    /* initial latents are exact unless an encoded image is mixed in (scale_noise) */
    const bool with_image = cdf_st_find(gf, "scale_noise_timestep") != NULL;
    bool miss;
    for (int k = 0; k < n; k++) {
        struct {
            const char *key;
            double tol;
            bool per_image; /* golden row k of a (B, ...) tensor; else the whole tensor */
        } checks[] = {
            {"init_image", 0, false},       {"mask_condition", 0, false},
            {"image_latent_ids", 0, false},
            {"noise", 0, true},             {"image_latents", 5e-5, true},
            {"sigmas", 0, false},           {"timesteps", 0, false},
            {"latents_initial", with_image ? 5e-5 : 0, true},
            {"latents_final", 5e-4, true},  {"image", 5e-4, true},
        };
        for (size_t i = 0; i < sizeof checks / sizeof *checks; i++) {
            if (!cdf_st_find(gf, checks[i].key)) continue;
            char key[96];
            snprintf(key, sizeof key, "%d.%s", k, checks[i].key);
            double d = cmp_at(&cap, key, gf, checks[i].key, checks[i].per_image ? k : 0, &miss);
            print_message("  %s[%d] %-16s max|diff| = %.3g (tol %.1g)\n", name, k, checks[i].key, d, checks[i].tol);
            assert_false(miss);
            assert_true(d <= checks[i].tol);
        }
        for (int s = 0; s < steps_run; s++) { /* latents_after_step: (steps, B, ...) */
            char key[96];
            snprintf(key, sizeof key, "%d.latents_after_step.%d", k, s);
            double d = cmp_at(&cap, key, gf, "latents_after_step", (int64_t)s * n + k, &miss);
            assert_false(miss);
            if (!(d <= 5e-4)) fail_msg("%s[%d] latents after step %d: max|diff| %.3g > 5e-4", name, k, s, d);
        }
        char extra[64];
        snprintf(extra, sizeof extra, "%d.latents_after_step.%d", k, steps_run); /* no step beyond the ones run */
        assert_null(cdf_tensor_map_get(&cap, extra));
        const cdf_st_tensor *u8 = cdf_st_find(gf, "image_uint8");
        assert_non_null(u8);
        const int64_t per = (int64_t)out[k].width * out[k].height * 3;
        assert_int_equal(cdf_st_numel(u8), per * n);
        const uint8_t *ref = (const uint8_t *)cdf_st_data(gf, u8) + k * per;
        int worst = 0, ndiff = 0;
        for (int64_t i = 0; i < per; i++) {
            int d = abs((int)ref[i] - (int)out[k].pixels[i]);
            if (d > worst) worst = d;
            ndiff += d != 0;
        }
        print_message("  %s[%d] image_uint8: %d values differ, max %d level(s)\n", name, k, ndiff, worst);
        assert_true(worst <= 1);
        cdf_image_free(&out[k]);
    }
    cdf_st_close(gf);
    cdf_tensor_map_clear(&cap);
    cdf_pipeline_free(pipe);
    cdf_png_image_free(&png_img[0]);
    cdf_png_image_free(&png_img[1]);
    cdf_png_image_free(&png_mask);
    cdf_tensor_map_clear(&f2);
    cJSON_Delete(js);
}

static void test_case(void **state) { run_case((const char *)*state); }

/* Text-to-image: each image of a seed list equals the single-seed image of its seed. */
static void test_seed_list_equals_single_seeds(void **state) {
    (void)state;
    cdf_pipeline *pipe = tu_load_tiny_pipeline("flux1_dev_tiny");
    cdf_generate_params gp = cdf_generate_params_default();
    gp.prompt = "a cat";
    gp.height = gp.width = 32;
    gp.num_inference_steps = 2;
    gp.max_sequence_length = 16;
    uint64_t seeds[2] = {5, 6};
    gp.seeds = seeds;
    gp.num_seeds = 2;
    cdf_image batch[2], one;
    assert_int_equal(cdf_pipeline_generate_images(pipe, &gp, batch, 2), CDF_OK);
    gp.num_seeds = 0;
    gp.seeds = NULL;
    for (int k = 0; k < 2; k++) {
        gp.seed = seeds[k];
        assert_int_equal(cdf_pipeline_generate(pipe, &gp, &one), CDF_OK);
        assert_memory_equal(one.pixels, batch[k].pixels, (size_t)one.width * one.height * 3);
        cdf_image_free(&one);
        cdf_image_free(&batch[k]);
    }
    cdf_pipeline_free(pipe);
}

/* img2img with a seed list: the first image is the single-seed image of the first seed; the
 * others are not their seed's single-seed image, since diffusers encodes the one input image with
 * generator[0] (the golden fidelity/..._gens cases hold the exact values). */
static void test_seed_list_image_encoded_once(void **state) {
    (void)state;
    cdf_pipeline *pipe = tu_load_tiny_pipeline("flux1_dev_tiny");
    cdf_png_image pi;
    char path[1300];
    snprintf(path, sizeof path, "%s/image_in.png", tu_data("golden/img2img/flux_img2img_s06_64x64"));
    assert_int_equal(cdf_png_read(path, &pi), CDF_OK);
    cdf_image im = {pi.width, pi.height, pi.channels, pi.pixels};
    cdf_generate_params gp = cdf_generate_params_default();
    gp.prompt = "a cat";
    gp.num_inference_steps = 2;
    gp.max_sequence_length = 16;
    gp.image = &im;
    uint64_t seeds[2] = {5, 6};
    gp.seeds = seeds;
    gp.num_seeds = 2;
    cdf_image batch[2], one;
    assert_int_equal(cdf_pipeline_generate_images(pipe, &gp, batch, 2), CDF_OK);
    gp.num_seeds = 0;
    gp.seeds = NULL;
    const size_t bytes = (size_t)batch[0].width * batch[0].height * 3;
    for (int k = 0; k < 2; k++) {
        gp.seed = seeds[k];
        assert_int_equal(cdf_pipeline_generate(pipe, &gp, &one), CDF_OK);
        if (k == 0) assert_memory_equal(one.pixels, batch[k].pixels, bytes);
        else assert_memory_not_equal(one.pixels, batch[k].pixels, bytes);
        cdf_image_free(&one);
        cdf_image_free(&batch[k]);
    }
    cdf_png_image_free(&pi);
    cdf_pipeline_free(pipe);
}

/* StableDiffusion3Img2ImgPipeline fails with a list of generators (golden/fidelity/refusals.json):
 * refused with a message that says why; one seed in a list, SD3 inpainting and Flux take one. */
static void test_sd3_img2img_seed_list_refused(void **state) {
    (void)state;
    size_t len;
    char *refusals = tu_read_file(tu_data("golden/fidelity/refusals.json"), &len);
    assert_non_null(refusals);
    assert_non_null(strstr(refusals, "\"sd3_img2img_gens\": \"RuntimeError"));
    free(refusals);
    cdf_pipeline *pipe = tu_load_tiny_pipeline("sd35m_tiny");
    uint8_t px[64 * 64 * 3] = {0};
    cdf_image im = {64, 64, 3, px}, mk = {64, 64, 1, px};
    cdf_generate_params gp = cdf_generate_params_default();
    gp.prompt = "a cat";
    gp.num_inference_steps = 2;
    gp.image = &im;
    uint64_t seeds[2] = {12, 13};
    gp.seeds = seeds;
    gp.num_seeds = 2;
    cdf_image out[2];
    assert_int_equal(cdf_pipeline_generate_images(pipe, &gp, out, 2), CDF_ERR_INVALID_ARG);
    assert_non_null(strstr(cdf_last_error(), "StableDiffusion3Img2ImgPipeline"));
    assert_null(out[0].pixels);
    gp.num_seeds = 1;
    assert_int_equal(cdf_pipeline_validate(pipe, &gp), CDF_OK);
    gp.num_seeds = 2;
    gp.mask_image = &mk;
    assert_int_equal(cdf_pipeline_validate(pipe, &gp), CDF_OK);
    cdf_pipeline_free(pipe);
}

/* Row k of a one-generator batch equals row k of torch.randn((rows, ...)): for rows of a multiple
 * of 16 values (every model here) and of other sizes (torch redraws its last block of 16). */
static void test_batch_rows_equal_one_draw(void **state) {
    (void)state;
    cdf_pipeline *pipe = tu_load_tiny_pipeline("flux1_dev_tiny");
    const int64_t sizes[2][4] = {{1, 16, 2, 3}, {1, 3, 5, 7}}; /* 96 and 105 values a row */
    for (int c = 0; c < 2; c++) {
        const int64_t n = sizes[c][0] * sizes[c][1] * sizes[c][2] * sizes[c][3], rows = 3;
        float *whole = malloc((size_t)(n * rows) * sizeof *whole);
        cdf_generator *g = cdf_generator_new(77);
        assert_int_equal(cdf_randn_f32(g, whole, n * rows), CDF_OK);
        cdf_generator_free(g);
        for (int64_t k = 0; k < rows; k++) {
            g = cdf_generator_new(77);
            cdf_tensor *t = NULL;
            assert_int_equal(cdf_pipe_draw(pipe, g, 4, sizes[c], k, rows, &t), CDF_OK);
            float *got = cdf_tensor_read_f32(t);
            assert_memory_equal(got, whole + k * n, (size_t)n * sizeof *got);
            free(got);
            cdf_tensor_release(t);
            cdf_generator_free(g);
        }
        free(whole);
    }
    cdf_pipeline_free(pipe);
}

/* Inpainting under model and sequential offload: the VAE runs before the transformer (encode) and
 * after it (decode); the images equal the resident run's. */
static void test_offload_same_image(void **state) {
    (void)state;
    char dir[1200], path[1300];
    snprintf(dir, sizeof dir, "%s/flux1_dev_tiny", tu_data("pipelines"));
    const char *gold = tu_data("golden/img2img/flux_inpaint_s08_64x64");
    cdf_png_image pi, pm;
    snprintf(path, sizeof path, "%s/image_in.png", gold);
    assert_int_equal(cdf_png_read(path, &pi), CDF_OK);
    snprintf(path, sizeof path, "%s/mask_in.png", gold);
    assert_int_equal(cdf_png_read(path, &pm), CDF_OK);
    cdf_image im = {pi.width, pi.height, pi.channels, pi.pixels}, mk = {pm.width, pm.height, pm.channels, pm.pixels};
    cdf_generate_params gp = cdf_generate_params_default();
    gp.prompt = "a house";
    gp.num_inference_steps = 3;
    gp.max_sequence_length = 16;
    gp.image = &im;
    gp.mask_image = &mk;
    gp.strength = 0.7;
    cdf_image ref = {0};
    for (int mode = CDF_OFFLOAD_NONE; mode <= CDF_OFFLOAD_SEQUENTIAL; mode++) {
        cdf_pipeline_load_params lp = cdf_pipeline_load_params_default();
        lp.offload = (cdf_offload_mode)mode;
        cdf_pipeline *pipe = NULL;
        assert_int_equal(cdf_pipeline_load(dir, &lp, &pipe), CDF_OK);
        cdf_image img;
        if (cdf_pipeline_generate(pipe, &gp, &img) != CDF_OK) fail_msg("offload %d: %s", mode, cdf_last_error());
        if (mode == CDF_OFFLOAD_NONE) ref = img;
        else {
            assert_memory_equal(ref.pixels, img.pixels, (size_t)img.width * img.height * 3);
            cdf_image_free(&img);
        }
        cdf_pipeline_free(pipe);
    }
    cdf_image_free(&ref);
    cdf_png_image_free(&pi);
    cdf_png_image_free(&pm);
}

/* Requests refused before any work, with a message naming what is wrong. */
static void test_bad_inputs(void **state) {
    (void)state;
    cdf_pipeline *pipe = tu_load_tiny_pipeline("flux1_dev_tiny");
    uint8_t px[32 * 32 * 4] = {0};
    cdf_image rgb = {32, 32, 3, px}, rgba = {32, 32, 4, px}, gray = {32, 32, 1, px}, small = {16, 32, 1, px};
    cdf_generate_params gp = cdf_generate_params_default();
    gp.prompt = "x";
    gp.num_inference_steps = 2;
    cdf_image img;
    struct {
        const cdf_image *image, *mask;
        double strength;
        const char *needle;
    } bad[] = {
        {&rgba, NULL, 0.6f, "RGB image"},  {&gray, NULL, 0.6f, "RGB image"},
        {&rgb, NULL, 0.0f, "strength"},    {&rgb, NULL, 1.5f, "strength"},
        {&rgb, NULL, NAN, "strength"},     {&rgb, &small, 0.6f, "same size"},
        {&rgb, &rgba, 0.6f, "grayscale"},  {NULL, &gray, 0.6f, "needs an image"},
        {&rgb, NULL, 1e-30f, "leaves no denoising step"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        gp.image = bad[i].image;
        gp.mask_image = bad[i].mask;
        gp.strength = bad[i].strength;
        assert_int_equal(cdf_pipeline_generate(pipe, &gp, &img), CDF_ERR_INVALID_ARG);
        if (!strstr(cdf_last_error(), bad[i].needle)) fail_msg("case %zu: '%s' lacks '%s'", i, cdf_last_error(), bad[i].needle);
        assert_null(img.pixels);
    }
    /* FLUX.2 reference images */
    cdf_pipeline *p2 = tu_load_tiny_pipeline("flux2_dev_tiny");
    static uint8_t big[200 * 64 * 3];
    cdf_image refs[CDF_FLUX2_MAX_REFERENCE_IMAGES + 1];
    for (int i = 0; i <= CDF_FLUX2_MAX_REFERENCE_IMAGES; i++) refs[i] = (cdf_image){64, 64, 3, big};
    cdf_image narrow = {200, 24, 3, big}, thin = {64, 48, 3, big};
    cdf_generate_params g2 = cdf_generate_params_default();
    g2.prompt = "x";
    g2.num_inference_steps = 2;
    struct {
        const cdf_image *image, *mask;
        int n;
        const char *needle;
    } bad2[] = {
        {refs, NULL, CDF_FLUX2_MAX_REFERENCE_IMAGES + 1, "at most 10"},
        {&thin, NULL, 1, "at least 64"},
        {&narrow, NULL, 1, "at least 64"},
        {&rgba, NULL, 1, "RGB images"},
        {refs, &gray, 1, "not a mask"},
        {NULL, NULL, 2, "no image"},
    };
    for (size_t i = 0; i < sizeof bad2 / sizeof *bad2; i++) {
        g2.image = bad2[i].image;
        g2.mask_image = bad2[i].mask;
        g2.num_input_images = bad2[i].n;
        assert_int_equal(cdf_pipeline_generate(p2, &g2, &img), CDF_ERR_INVALID_ARG);
        if (!strstr(cdf_last_error(), bad2[i].needle)) fail_msg("flux2 case %zu: '%s' lacks '%s'", i, cdf_last_error(), bad2[i].needle);
    }
    cdf_pipeline_free(p2);
    /* one image for img2img */
    gp.image = refs;
    gp.strength = 0.6;
    gp.num_input_images = 2;
    assert_int_equal(cdf_pipeline_generate(pipe, &gp, &img), CDF_ERR_INVALID_ARG);
    assert_non_null(strstr(cdf_last_error(), "take one"));
    gp.num_input_images = 0;
    /* a batch through the one-image call */
    gp.image = NULL;
    gp.mask_image = NULL;
    gp.num_images = 2;
    assert_int_equal(cdf_pipeline_generate(pipe, &gp, &img), CDF_ERR_INVALID_ARG);
    assert_non_null(strstr(cdf_last_error(), "cdf_pipeline_generate_images"));
    cdf_image two[2];
    assert_int_equal(cdf_pipeline_generate_images(pipe, &gp, two, 3), CDF_ERR_INVALID_ARG);
    cdf_pipeline_free(pipe);
}

int main(void) {
    struct CMUnitTest tests[sizeof k_cases / sizeof *k_cases + 6];
    size_t n = 0;
    for (size_t i = 0; i < sizeof k_cases / sizeof *k_cases; i++)
        tests[n++] = (struct CMUnitTest){k_cases[i], test_case, NULL, NULL, (void *)k_cases[i]};
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_seed_list_equals_single_seeds);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_seed_list_image_encoded_once);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_sd3_img2img_seed_list_refused);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_batch_rows_equal_one_draw);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_offload_same_image);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_bad_inputs);
    return _cmocka_run_group_tests("pipelines_img2img", tests, n, NULL, NULL);
}
