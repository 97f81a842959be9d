/* Tiled VAE decode / encode (diffusers' enable_tiling(): AutoencoderKL.tiled_decode / _tiled_encode,
 * the same code in AutoencoderKLFlux2) against tests/data/vae_tiling, made by diffusers itself
 * (tools/make-vae-tiling-golden/make_golden.py) from the tiny golden VAEs: several overlapping
 * tiles in both directions, edge tiles cut short, other tile sizes and overlap, a batch, and the
 * quant convs inside the tiles (FLUX.2). Through the component interface, so the suite's execution
 * modes (eager, defer-and-fuse, compile, repeated blocks) all run it; the tiling parameters are
 * static inputs of the compiled graph.
 *
 * Tolerance: 2e-5, the golden README's VAE tolerance (a float64 re-run moves a decode by 2.3e-6);
 * the blending adds two float32 products and a sum per element, as torch does. Every case also
 * checks that diffusers' untiled output is more than 1e-2 away from the tiled one, so agreeing
 * with the tiled reference means the tiles and blends are right, not that tiling was skipped. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#include "cdiffusers/cdiffusers.h"
#include "cdiffusers/io.h"
#include "models/component.h"
#include "models/vae.h"
#include "pipelines/pipeline_impl.h"

#define VAE_ATOL 2e-5
#define DISTINCT 1e-2

static cdf_tensor *io_get(const cdf_tensor_map *io, const char *c, const char *name) {
    char key[400];
    snprintf(key, sizeof key, "%s.%s", c, name);
    cdf_tensor *t = cdf_tensor_map_get(io, key);
    if (!t) fail_msg("vae_tiling io has no '%s'", key);
    return t;
}

/* Runs `method` of the case's model with its input and tiling parameters; returns the outputs. */
static void run_case(cdf_component *vae, const cdf_tensor_map *io, const char *c, const char *method, cdf_tensor_map *out) {
    cdf_tensor_map in;
    cdf_tensor_map_init(&in);
    const bool dec = strcmp(method, "decode") == 0;
    assert_int_equal(cdf_tensor_map_set(&in, dec ? "z" : "x", io_get(io, c, dec ? "z" : "x")), CDF_OK);
    const char *const names[3] = {CDF_VAE_TILING_INPUTS};
    for (int i = 0; i < 3; i++) assert_int_equal(cdf_tensor_map_set(&in, names[i], io_get(io, c, names[i])), CDF_OK);
    cdf_tensor_map_init(out);
    if (cdf_component_run(vae, method, &in, out) != CDF_OK) fail_msg("%s: %s", c, cdf_last_error());
    cdf_tensor_map_clear(&in);
}

static void check(const char *c, const char *what, cdf_tensor *got, cdf_tensor *tiled, cdf_tensor *untiled) {
    char label[160];
    snprintf(label, sizeof label, "%s %s", c, what);
    const double d = tu_diff_tensors(got, tiled, label);
    printf("  %-40s max|diff| vs diffusers tiled = %.3g", label, d);
    assert_true(d <= VAE_ATOL);
    if (untiled) {
        const double du = tu_diff_tensors(untiled, tiled, label);
        printf(" (diffusers tiled vs untiled: %.3g)", du);
        assert_true(du > DISTINCT);
    }
    printf("\n");
}

static void run_model_cases(const char *model_dir, const char *const *cases) {
    cdf_tensor_map io;
    tu_load_map(&io, "vae_tiling/io.safetensors");
    cdf_component *vae = tu_load_component(tu_data(model_dir), CDF_F32);
    for (int i = 0; cases[i]; i++) {
        const char *c = cases[i];
        cdf_scope_push();
        cdf_tensor_map out;
        if (strstr(c, "_decode")) {
            for (int rep = 0; rep < 2; rep++) { /* the second run replays the compiled graph */
                run_case(vae, &io, c, "decode", &out);
                check(c, "decode", cdf_tensor_map_get(&out, "out.decode_sample"), io_get(&io, c, "tiled"),
                      rep ? NULL : io_get(&io, c, "untiled"));
                cdf_tensor_map_clear(&out);
            }
        } else {
            run_case(vae, &io, c, "encode", &out);
            check(c, "encode mean", cdf_tensor_map_get(&out, "out.encode_mean"), io_get(&io, c, "tiled_mean"),
                  io_get(&io, c, "untiled_mean"));
            check(c, "encode logvar", cdf_tensor_map_get(&out, "out.encode_logvar"), io_get(&io, c, "tiled_logvar"), NULL);
            cdf_tensor_map_clear(&out);
        }
        cdf_scope_pop(NULL, 0);
    }
    cdf_component_free(vae);
    cdf_tensor_map_clear(&io);
}

static void test_autoencoder_kl(void **state) {
    (void)state;
    static const char *const cases[] = {"kl16_decode_default", "kl16_decode_48", "kl16_decode_b2_overlap", "kl16_encode_default", NULL};
    run_model_cases("golden/vae_kl16/vae", cases);
}

static void test_autoencoder_kl_flux2(void **state) {
    (void)state;
    static const char *const cases[] = {"flux2_decode_default", "flux2_encode_default", NULL};
    run_model_cases("golden/vae_flux2/vae", cases);
}

/* An input no larger than one tile is decoded whole (diffusers' _decode condition): the golden
 * 8x8 latent with tiles of 8 equals the untiled golden decode. */
static void test_small_input_not_tiled(void **state) {
    (void)state;
    cdf_tensor_map io;
    tu_load_map(&io, "golden/vae_kl16/io.safetensors");
    cdf_component *vae = tu_load_component(tu_data("golden/vae_kl16/vae"), CDF_F32);
    cdf_scope_push();
    cdf_tensor_map in, out;
    cdf_tensor_map_init(&in);
    cdf_tensor_map_init(&out);
    int64_t one = 1;
    cdf_tensor *ts = cdf_tensor_from_host(tu_cpu(), CDF_I64, 1, &one, &(int64_t){32}, CDF_I64);
    assert_int_equal(cdf_tensor_map_set(&in, "z", cdf_tensor_map_get(&io, "z")), CDF_OK);
    assert_int_equal(cdf_tensor_map_set(&in, "tile_sample_min_size", ts), CDF_OK);
    if (cdf_component_run(vae, "decode", &in, &out) != CDF_OK) fail_msg("%s", cdf_last_error());
    check("kl16 8x8 latent, tiles of 8", "decode", cdf_tensor_map_get(&out, "out.decode_sample"),
          cdf_tensor_map_get(&io, "out.decode_sample"), NULL);
    cdf_tensor_map_clear(&in);
    cdf_tensor_map_clear(&out);
    cdf_scope_pop(NULL, 0);
    cdf_component_free(vae);
    cdf_tensor_map_clear(&io);
}

/* Bad tiling inputs: a clear error naming the input, no output. */
static void test_bad_tiling_inputs(void **state) {
    (void)state;
    cdf_tensor_map io;
    tu_load_map(&io, "vae_tiling/io.safetensors");
    cdf_component *vae = tu_load_component(tu_data("golden/vae_kl16/vae"), CDF_F32);
    const struct {
        const char *name;
        double value;
        bool with_sample; /* also pass tile_sample_min_size = 32 */
        const char *expect;
    } bad[] = {
        {"tile_sample_min_size", 0, false, "tile_sample_min_size"},
        {"tile_sample_min_size", 31.5, false, "whole number"},
        {"tile_latent_min_size", 8, false, "need tile_sample_min_size"},
        {"tile_overlap_factor", 1.0, true, "tile_overlap_factor"},
        {"tile_overlap_factor", NAN, true, "not finite"},
        {"tile_latent_min_size", 1, true, "no step"},
        {"tile_sample_min_size", 3, false, "tile_latent_min_size = 0"}, /* 3 / 4 latents */
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        cdf_scope_push();
        cdf_tensor_map in, out;
        cdf_tensor_map_init(&in);
        cdf_tensor_map_init(&out);
        int64_t one = 1;
        assert_int_equal(cdf_tensor_map_set(&in, "z", io_get(&io, "kl16_decode_default", "z")), CDF_OK);
        if (bad[k].with_sample)
            assert_int_equal(cdf_tensor_map_set(&in, "tile_sample_min_size",
                                                cdf_tensor_from_host(tu_cpu(), CDF_F64, 1, &one, &(double){32}, CDF_F64)),
                             CDF_OK);
        assert_int_equal(cdf_tensor_map_set(&in, bad[k].name, cdf_tensor_from_host(tu_cpu(), CDF_F64, 1, &one, &bad[k].value, CDF_F64)),
                         CDF_OK);
        cdf_status s = cdf_component_run(vae, "decode", &in, &out);
        printf("  %s = %g: %s\n", bad[k].name, bad[k].value, cdf_last_error());
        assert_int_not_equal(s, CDF_OK);
        assert_non_null(strstr(cdf_last_error(), bad[k].expect));
        assert_null(cdf_tensor_map_get(&out, "out.decode_sample"));
        cdf_clear_error();
        cdf_tensor_map_clear(&in);
        cdf_tensor_map_clear(&out);
        cdf_scope_pop(NULL, 0);
    }
    cdf_component_free(vae);
    cdf_tensor_map_clear(&io);
}

/* The point of tiling: the device peak of a decode no longer grows with the image. A 32x32 latent
 * (128x128 image) decoded whole and in tiles of 8 latents: the tiled peak must be well below the
 * untiled one (an upper bound on the ratio, not a timing). Eager, direct calls (the compiled
 * arena is planned differently and is covered by the planner's tests). */
static void test_tiled_peak_memory(void **state) {
    (void)state;
    struct cJSON *cfg = NULL;
    assert_int_equal(cdf_config_load(tu_data("golden/vae_kl16/vae"), &cfg), CDF_OK);
    cdf_load_options o = cdf_load_options_default();
    o.device = tu_cpu();
    o.weight_dtype = CDF_F32;
    void *impl = NULL;
    if (cdf_autoencoder_kl_class.load(tu_data("golden/vae_kl16/vae"), cfg, &o, &impl) != CDF_OK) fail_msg("%s", cdf_last_error());
    const cdf_autoencoder_kl *m = impl;
    cdf_device *dev = tu_cpu();
    const int64_t shape[4] = {1, 16, 32, 32};
    float *zh = malloc(16 * 32 * 32 * sizeof *zh);
    tu_fill_random(zh, 16 * 32 * 32, 7);
    const cdf_vae_tiling tiling = cdf_vae_tiling_default(&m->config);
    assert_int_equal(tiling.tile_latent_min_size, 8);
    uint64_t peak[2];
    for (int tiled = 0; tiled < 2; tiled++) {
        cdf_scope_push();
        cdf_tensor *z = cdf_tensor_from_host(dev, CDF_F32, 4, shape, zh, CDF_F32);
        assert_int_equal(cdf_device_synchronize(dev), CDF_OK);
        cdf_memory_stats st;
        cdf_device_reset_peak(dev);
        cdf_device_memory_stats(dev, &st);
        const uint64_t base = st.current_bytes;
        cdf_tensor *img = cdf_autoencoder_kl_decode_tiled(m, z, tiled ? &tiling : NULL);
        assert_non_null(img);
        assert_int_equal(cdf_device_synchronize(dev), CDF_OK);
        assert_int_equal(cdf_tensor_dim(img, 2), 128);
        assert_int_equal(cdf_tensor_dim(img, 3), 128);
        cdf_device_memory_stats(dev, &st);
        peak[tiled] = st.peak_bytes - base;
        cdf_scope_pop(NULL, 0);
    }
    printf("  decode 32x32 latent: peak above baseline untiled %.2f MiB, tiles of 8 latents %.2f MiB\n",
           (double)peak[0] / (1 << 20), (double)peak[1] / (1 << 20));
    /* a tile is 1/16 of the latent (plus the small finished tiles): expect far below half */
    assert_true(peak[1] * 3 < peak[0]);
    free(zh);
    cdf_autoencoder_kl_class.free(impl);
    cJSON_Delete(cfg);
}

/* ---- the pipelines (cdf_generate_params.vae_tiling) ------------------------------------------
 * A golden pipeline case run with tiles of 32 pixels: its VAE output must equal diffusers' tiled
 * decode of diffusers' own decode input for that case (pipe_<pipeline>_<case> in io.safetensors).
 * Tolerance 5e-4, the pipeline tests' tolerance for vae_decode_output (the latents reaching the
 * VAE carry up to ~1e-4 from the timestep table, see test_pipeline.c). */
static void pipeline_request(const char *pipeline, const char *c, cdf_generate_params *gp, cJSON **js) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s/cases/%s/expected.json", tu_data("pipelines"), pipeline, c);
    char *txt = tu_read_file(path, NULL);
    assert_non_null(txt);
    *js = cJSON_Parse(txt);
    free(txt);
    assert_non_null(*js);
    const cJSON *call = cJSON_GetObjectItem(*js, "call");
    *gp = cdf_generate_params_default();
    gp->prompt = cJSON_GetObjectItem(call, "prompt")->valuestring;
    const cJSON *neg = cJSON_GetObjectItem(call, "negative_prompt");
    gp->negative_prompt = cJSON_IsString(neg) ? neg->valuestring : NULL;
    gp->height = cJSON_GetObjectItem(call, "height")->valueint;
    gp->width = cJSON_GetObjectItem(call, "width")->valueint;
    gp->num_inference_steps = cJSON_GetObjectItem(call, "num_inference_steps")->valueint;
    gp->guidance_scale = cJSON_GetObjectItem(call, "guidance_scale")->valuedouble;
    gp->max_sequence_length = cJSON_GetObjectItem(call, "max_sequence_length")->valueint;
    gp->seed = (uint64_t)cJSON_GetObjectItem(call, "seed")->valuedouble;
}

/* Generates and compares the VAE output with the tiled reference (tiled = true) or with the
 * case's untiled golden output. */
static void generate_and_check(cdf_pipeline *pipe, const char *pipeline, const char *c, cdf_generate_params *gp, bool tiled) {
    cdf_tensor_map io, gold, cap;
    cdf_tensor_map_init(&cap);
    gp->capture = (cdf_capture *)&cap;
    cdf_image img;
    /* the references are loaded after: on the device they would count against a budget */
    if (cdf_pipeline_generate(pipe, gp, &img) != CDF_OK) fail_msg("generate %s/%s: %s", pipeline, c, cdf_last_error());
    char rel[256], key[200], label[200];
    tu_load_map(&io, "vae_tiling/io.safetensors");
    snprintf(rel, sizeof rel, "pipelines/%s/cases/%s/expected.safetensors", pipeline, c);
    tu_load_map(&gold, rel);
    snprintf(key, sizeof key, "pipe_%s_%s", pipeline, c);
    cdf_tensor *untiled = cdf_tensor_map_get(&gold, "vae_decode_output");
    cdf_tensor *want = tiled ? io_get(&io, key, "tiled") : untiled;
    snprintf(label, sizeof label, "%s/%s %s", pipeline, c, tiled ? "tiled" : "untiled");
    const double d = tu_diff_tensors(cdf_tensor_map_get(&cap, "vae_decode_output"), want, label);
    const double du = tu_diff_tensors(untiled, io_get(&io, key, "tiled"), label);
    printf("  %-44s vae_decode_output max|diff| = %.3g (diffusers tiled vs untiled %.3g)\n", label, d, du);
    assert_true(d <= 5e-4);
    assert_true(du > DISTINCT);
    cdf_image_free(&img);
    cdf_tensor_map_clear(&cap);
    cdf_tensor_map_clear(&gold);
    cdf_tensor_map_clear(&io);
}

static cdf_pipeline *load_pipeline(const char *pipeline) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", tu_data("pipelines"), pipeline);
    cdf_pipeline_load_params lp = cdf_pipeline_load_params_default();
    lp.weight_dtype = CDF_F32; /* the golden pipelines ran in f32 */
    cdf_pipeline *pipe = NULL;
    if (cdf_pipeline_load(dir, &lp, &pipe) != CDF_OK) fail_msg("load %s: %s", dir, cdf_last_error());
    return pipe;
}

static void test_pipelines_tiled(void **state) {
    (void)state;
    static const char *const cases[][2] = {{"flux1_schnell_tiny", "64x64"}, {"sd35m_tiny", "64x64_neg"}};
    for (int i = 0; i < 2; i++) {
        cdf_pipeline *pipe = load_pipeline(cases[i][0]);
        cJSON *js;
        cdf_generate_params gp;
        pipeline_request(cases[i][0], cases[i][1], &gp, &js);
        gp.vae_tiling = CDF_VAE_TILING_ON;
        gp.vae_tile_size = 32;
        generate_and_check(pipe, cases[i][0], cases[i][1], &gp, true);
        /* the tile size must keep the output the image's size: multiples of 4 latents */
        gp.vae_tile_size = 24;
        cdf_image img;
        assert_int_equal(cdf_pipeline_generate(pipe, &gp, &img), CDF_ERR_INVALID_ARG);
        printf("  tile 24: %s\n", cdf_last_error());
        assert_non_null(strstr(cdf_last_error(), "multiple of 32"));
        cJSON_Delete(js);
        cdf_pipeline_free(pipe);
    }
}

/* AUTO: untiled without a budget; with a decode budget the untiled plan exceeds and the tiled
 * plan meets, the pipeline tiles (tiles of 32: the VAE's sample_size 64 is the whole image) and
 * the output is diffusers' tiled one. The planner's decode activations are smaller tiled. */
static void test_pipeline_auto_tiling(void **state) {
    (void)state;
    const char *pipeline = "flux1_schnell_tiny", *c = "64x64";
    cdf_pipeline *pipe = load_pipeline(pipeline);
    cJSON *js;
    cdf_generate_params gp;
    pipeline_request(pipeline, c, &gp, &js);
    generate_and_check(pipe, pipeline, c, &gp, false); /* AUTO, no budget */

    cdf_pipeline_load_params lp = cdf_pipeline_load_params_default();
    lp.weight_dtype = CDF_F32;
    cdf_memory_plan untiled, tiled;
    cdf_generate_params g = gp;
    g.vae_tiling = CDF_VAE_TILING_OFF;
    assert_int_equal(cdf_pipeline_plan_memory(tu_data("pipelines/flux1_schnell_tiny"), &lp, &g, &untiled), CDF_OK);
    g.vae_tiling = CDF_VAE_TILING_ON;
    g.vae_tile_size = 32;
    assert_int_equal(cdf_pipeline_plan_memory(tu_data("pipelines/flux1_schnell_tiny"), &lp, &g, &tiled), CDF_OK);
    const uint64_t ua = untiled.phase[CDF_PHASE_DECODE].activation_bytes, ta = tiled.phase[CDF_PHASE_DECODE].activation_bytes;
    printf("  planned decode activations: untiled %llu, tiles of 32: %llu bytes\n", (unsigned long long)ua, (unsigned long long)ta);
    assert_true(ta < ua);
    const uint64_t up = untiled.phase[CDF_PHASE_DECODE].peak_bytes, tp = tiled.phase[CDF_PHASE_DECODE].peak_bytes;
    pipe->phase_limit_active = true;
    memset(pipe->phase_limit, 0, sizeof pipe->phase_limit);
    pipe->phase_limit[CDF_PHASE_DECODE] = tp + (up - tp) / 2;
    generate_and_check(pipe, pipeline, c, &gp, true);
    /* OFF never tiles: the same budget then gives the untiled output or runs out of memory */
    gp.vae_tiling = CDF_VAE_TILING_OFF;
    cdf_tensor_map cap;
    cdf_tensor_map_init(&cap);
    gp.capture = (cdf_capture *)&cap;
    cdf_image img;
    cdf_status s = cdf_pipeline_generate(pipe, &gp, &img);
    assert_true(s == CDF_OK || s == CDF_ERR_OUT_OF_MEMORY);
    if (s == CDF_OK) cdf_image_free(&img);
    cdf_tensor_map_clear(&cap);
    pipe->phase_limit_active = false;
    cJSON_Delete(js);
    cdf_pipeline_free(pipe);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_autoencoder_kl),
        cmocka_unit_test(test_autoencoder_kl_flux2),
        cmocka_unit_test(test_small_input_not_tiled),
        cmocka_unit_test(test_bad_tiling_inputs),
        cmocka_unit_test(test_tiled_peak_memory),
        cmocka_unit_test(test_pipelines_tiled),
        cmocka_unit_test(test_pipeline_auto_tiling),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
