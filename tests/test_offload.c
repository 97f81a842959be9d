/* Model offload, device memory budgets and the memory planner, on pipelines with random weights
 * written by tools/make-random-pipeline (no downloads): a FLUX.1-architecture pipeline whose
 * models are a few MB each (the transformer the largest) and an SD3.5-architecture one.
 *
 * What must hold (issue "Model offload and device memory budgets"):
 *  - the weight bytes the planner reads off the checkpoint headers are exactly what loading
 *    allocates (f32 and bf16 policies);
 *  - with a budget below the sum of the models but above the largest, --offload none fails
 *    before loading anything, saying how much is needed and allowed and suggesting
 *    --offload model; --offload model runs, and its measured peak is within 10% of the planned
 *    peak (largest model + activations);
 *  - outputs are bit-identical with and without offload;
 *  - the planner's per-phase peaks are within 10% of the measured need: the phase runs under a
 *    budget of planned/0.9 and fails under planned/1.1 (a budget applied to that phase only).
 * The planner models eager execution: the planner checks force eager mode and no compile. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cdiffusers/cdiffusers.h"
#include "nn/nn.h"
#include "pipelines/pipeline_impl.h"
#include "pipelines/planner.h"

#include "offload_test_common.h"

static char g_flux[600], g_sd3[600];

/* SD3.5 architecture (dual attention, qk norm), widths 16 / 24 / 48 / 64: the transformer's
 * settings (the text encoders': ot_sd3_text_sets). */
static const char *const k_sd3_sets[] = {"sd3.heads=2", "sd3.head_dim=32", "sd3.layers=3", "sd3.dual_layers=1", "seed=11"};

static int setup(void **state) {
    (void)state;
    return ot_write_pipelines("flux_random", g_flux, sizeof g_flux, "sd3_random", g_sd3, sizeof g_sd3, k_sd3_sets,
                              sizeof k_sd3_sets / sizeof *k_sd3_sets);
}

static cdf_generate_params request(int size) {
    cdf_generate_params gp = cdf_generate_params_default();
    gp.prompt = "a red fox in the snow";
    gp.height = gp.width = size;
    gp.num_inference_steps = 1;
    gp.max_sequence_length = 16;
    gp.seed = 3;
    return gp;
}

static cdf_pipeline_load_params load_params(cdf_offload_mode mode, cdf_dtype dt) {
    cdf_pipeline_load_params lp = cdf_pipeline_load_params_default();
    lp.offload = mode;
    lp.weight_dtype = dt;
    return lp;
}

static cdf_memory_plan plan_of(const char *dir, cdf_offload_mode mode, const cdf_generate_params *gp) {
    cdf_pipeline_load_params lp = load_params(mode, CDF_F32);
    cdf_memory_plan plan;
    cdf_status s = cdf_pipeline_plan_memory(dir, &lp, gp, &plan);
    if (s != CDF_OK) print_message("plan: %s\n", cdf_last_error());
    assert_int_equal(s, CDF_OK);
    return plan;
}

/* The planner models eager execution: run a check with compile / defer-and-fuse off. */
typedef struct exec_env {
    char *compile;
    cdf_exec_mode mode;
} exec_env;
static exec_env force_eager(void) {
    exec_env e = {.mode = cdf_exec_get_mode()};
    const char *c = getenv("CDIFFUSERS_COMPILE");
    e.compile = c ? strdup(c) : NULL;
    unsetenv("CDIFFUSERS_COMPILE");
    assert_int_equal(cdf_exec_set_mode(CDF_EXEC_EAGER), CDF_OK);
    return e;
}
static void restore_exec(exec_env e) {
    if (e.compile) setenv("CDIFFUSERS_COMPILE", e.compile, 1);
    free(e.compile);
    assert_int_equal(cdf_exec_set_mode(e.mode), CDF_OK);
}

/* ---- weights --------------------------------------------------------------------------------- */
static void test_header_weights_equal_loaded_bytes(void **state) {
    (void)state;
    static const char *const subs[] = {"text_encoder", "text_encoder_2", "text_encoder_3", "transformer", "vae"};
    const char *dirs[2] = {g_flux, g_sd3};
    const cdf_dtype dts[2] = {CDF_F32, CDF_BF16};
    for (int d = 0; d < 2; d++)
        for (size_t k = 0; k < sizeof subs / sizeof *subs; k++) {
            char sub[800];
            snprintf(sub, sizeof sub, "%s/%s", dirs[d], subs[k]);
            struct stat st;
            if (stat(sub, &st) != 0) continue; /* FLUX has no text_encoder_3 */
            for (int t = 0; t < 2; t++) {
                uint64_t planned = 0;
                assert_int_equal(cdf_plan_weight_bytes(sub, dts[t], &planned), CDF_OK);
                const uint64_t before = current_bytes();
                cdf_component *c = tu_load_component(sub, dts[t]);
                const uint64_t loaded = current_bytes() - before;
                cdf_component_free(c);
                assert_int_equal(current_bytes(), before);
                if (planned != loaded) print_message("%s (%s): planned %llu, loaded %llu\n", sub, cdf_dtype_name(dts[t]),
                                                     (unsigned long long)planned, (unsigned long long)loaded);
                assert_int_equal(planned, loaded);
                assert_true(loaded > 0);
            }
        }
}

/* ---- budgets ---------------------------------------------------------------------------------- */
static void test_budget_below_sum_none_fails_model_runs(void **state) {
    (void)state;
    exec_env env = force_eager();
    const cdf_generate_params gp = request(64);
    const cdf_memory_plan pm = plan_of(g_flux, CDF_OFFLOAD_MODEL, &gp);
    const uint64_t budget = (uint64_t)(pm.peak_bytes / 0.9);
    /* the scenario of the issue: a budget between the largest model and the sum of all */
    assert_true(budget > pm.largest_weights_bytes);
    assert_true(budget < pm.total_weights_bytes);
    const uint64_t base = current_bytes();
    assert_int_equal(cdf_device_set_memory_limit(dev(), base + budget), CDF_OK);

    /* none: refused before anything is loaded, with the numbers and the way out */
    cdf_pipeline *p = NULL;
    cdf_pipeline_load_params lp = load_params(CDF_OFFLOAD_NONE, CDF_F32);
    assert_int_equal(cdf_pipeline_load(g_flux, &lp, &p), CDF_ERR_OUT_OF_MEMORY);
    assert_null(p);
    assert_int_equal(current_bytes(), base);
    const char *msg = cdf_last_error();
    char need[32], allow[32];
    cdf_plan_format_bytes(need, sizeof need, pm.total_weights_bytes);
    cdf_plan_format_bytes(allow, sizeof allow, base + budget);
    print_message("none: %s\n", msg);
    assert_non_null(strstr(msg, need));
    assert_non_null(strstr(msg, allow));
    assert_non_null(strstr(msg, "--offload model"));
    assert_non_null(strstr(msg, "transformer"));

    /* model: runs, one model at a time; its peak is the planned largest model + activations */
    lp.offload = CDF_OFFLOAD_MODEL;
    assert_int_equal(cdf_pipeline_load(g_flux, &lp, &p), CDF_OK);
    assert_int_equal(current_bytes(), base); /* every model released after its validating load */
    cdf_image img;
    cdf_status s = cdf_pipeline_generate(p, &gp, &img);
    if (s != CDF_OK) print_message("generate: %s\n", cdf_last_error());
    assert_int_equal(s, CDF_OK);
    cdf_image_free(&img);
    cdf_pipeline_memory_stats ms;
    cdf_pipeline_last_memory_stats(p, &ms);
    print_message("model: planned peak %llu, measured %llu under a budget of %llu (weights %llu, largest %llu)\n",
                  (unsigned long long)pm.peak_bytes, (unsigned long long)(ms.peak_bytes - base), (unsigned long long)budget,
                  (unsigned long long)pm.total_weights_bytes, (unsigned long long)pm.largest_weights_bytes);
    assert_int_equal(ms.materialisations, 4);
    assert_true(ms.peak_bytes - base <= budget);
    assert_true(ms.peak_bytes - base >= (uint64_t)(0.9 * pm.peak_bytes));
    assert_true(ms.peak_bytes - base < pm.total_weights_bytes);
    assert_int_equal(current_bytes(), base); /* released again after generate */
    cdf_pipeline_free(p);
    assert_int_equal(cdf_device_set_memory_limit(dev(), 0), CDF_OK);

    /* a budget below the largest model: even model offload is refused up front */
    assert_int_equal(cdf_device_set_memory_limit(dev(), base + pm.largest_weights_bytes / 2), CDF_OK);
    assert_int_equal(cdf_pipeline_load(g_flux, &lp, &p), CDF_ERR_OUT_OF_MEMORY);
    assert_non_null(strstr(cdf_last_error(), "the largest model, transformer"));
    assert_int_equal(cdf_device_set_memory_limit(dev(), 0), CDF_OK);
    restore_exec(env);
}

/* ---- bit-identical outputs ---------------------------------------------------------------------- */
static void expect_same_tensor(cdf_tensor_map *a, cdf_tensor_map *b, const char *key) {
    cdf_tensor *x = cdf_tensor_map_get(a, key), *y = cdf_tensor_map_get(b, key);
    assert_non_null(x);
    assert_non_null(y);
    assert_int_equal(cdf_tensor_numel(x), cdf_tensor_numel(y));
    float *u = cdf_tensor_read_f32(x), *v = cdf_tensor_read_f32(y);
    assert_non_null(u);
    assert_non_null(v);
    if (memcmp(u, v, (size_t)cdf_tensor_numel(x) * sizeof(float)) != 0) print_message("%s differs\n", key);
    assert_memory_equal(u, v, (size_t)cdf_tensor_numel(x) * sizeof(float));
    free(u);
    free(v);
}

static void run_capture(cdf_pipeline *p, const cdf_generate_params *gp0, cdf_tensor_map *cap, cdf_image *img) {
    cdf_generate_params gp = *gp0;
    cdf_tensor_map_init(cap);
    gp.capture = (cdf_capture *)cap;
    cdf_status s = cdf_pipeline_generate(p, &gp, img);
    if (s != CDF_OK) print_message("generate: %s\n", cdf_last_error());
    assert_int_equal(s, CDF_OK);
}

static void check_identical(const char *dir, const cdf_generate_params *gp, int expected_loads) {
    cdf_pipeline *p = NULL;
    cdf_pipeline_load_params lp = load_params(CDF_OFFLOAD_NONE, CDF_F32);
    assert_int_equal(cdf_pipeline_load(dir, &lp, &p), CDF_OK);
    cdf_tensor_map ref, off, back;
    cdf_image a, b, c;
    run_capture(p, gp, &ref, &a);
    cdf_pipeline_memory_stats ms;
    cdf_pipeline_last_memory_stats(p, &ms);
    assert_int_equal(ms.materialisations, 0);
    /* switch a loaded pipeline to model offload (diffusers' enable_model_cpu_offload) */
    assert_int_equal(cdf_pipeline_enable_model_cpu_offload(p), CDF_OK);
    assert_int_equal(cdf_pipeline_offload_mode(p), CDF_OFFLOAD_MODEL);
    assert_false(cdf_component_is_loaded(p->transformer));
    run_capture(p, gp, &off, &b);
    cdf_pipeline_last_memory_stats(p, &ms);
    assert_int_equal(ms.materialisations, expected_loads);
    /* and back to everything resident */
    assert_int_equal(cdf_pipeline_set_offload(p, CDF_OFFLOAD_NONE), CDF_OK);
    assert_true(cdf_component_is_loaded(p->transformer) && cdf_component_is_loaded(p->vae));
    run_capture(p, gp, &back, &c);
    static const char *const keys[] = {"prompt_embeds", "pooled_prompt_embeds", "latents_final", "vae_decode_output"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        expect_same_tensor(&ref, &off, keys[i]);
        expect_same_tensor(&ref, &back, keys[i]);
    }
    assert_int_equal(a.width * a.height, b.width * b.height);
    assert_memory_equal(a.pixels, b.pixels, (size_t)a.width * a.height * 3);
    assert_memory_equal(a.pixels, c.pixels, (size_t)a.width * a.height * 3);
    cdf_image_free(&a);
    cdf_image_free(&b);
    cdf_image_free(&c);
    cdf_tensor_map_clear(&ref);
    cdf_tensor_map_clear(&off);
    cdf_tensor_map_clear(&back);
    cdf_pipeline_free(p);
}

static void test_offload_outputs_bit_identical(void **state) {
    (void)state;
    cdf_generate_params gp = request(64);
    check_identical(g_flux, &gp, 4); /* CLIP, T5, transformer, VAE */
    gp.negative_prompt = "blurry";
    gp.guidance_scale = 4.5f;
    check_identical(g_sd3, &gp, 8); /* CLIP-L, CLIP-G, T5 for each of the two CFG passes, transformer, VAE */
}

/* ---- planner ------------------------------------------------------------------------------------ */
/* Every phase, or only the one with the largest planned peak (all_phases false: with NONE the
 * resident weights dominate every phase and are exact, see the weights test). */
static void check_plan(const char *dir, cdf_offload_mode mode, const cdf_generate_params *gp_in, bool all_phases) {
    /* the untiled decode's plan is checked: under a decode budget below it, the default (AUTO)
     * VAE tiling would tile and succeed (tests/test_vae_tiling.c checks that) */
    cdf_generate_params g = *gp_in;
    g.vae_tiling = CDF_VAE_TILING_OFF;
    const cdf_generate_params *gp = &g;
    const cdf_memory_plan plan = plan_of(dir, mode, gp);
    cdf_pipeline *p = NULL;
    cdf_pipeline_load_params lp = load_params(mode, CDF_F32);
    assert_int_equal(cdf_pipeline_load(dir, &lp, &p), CDF_OK);
    const uint64_t base = current_bytes();
    for (int ph = 0; ph < CDF_PHASE_COUNT; ph++) {
        const uint64_t planned = plan.phase[ph].peak_bytes;
        if (!all_phases && planned != plan.peak_bytes) continue;
        print_message("%s %s %s: planned %llu (weights %llu + activations %llu)\n", plan.pipeline_class,
                      mode == CDF_OFFLOAD_MODEL ? "model" : "none", cdf_pipeline_phase_name((cdf_pipeline_phase)ph),
                      (unsigned long long)planned, (unsigned long long)plan.phase[ph].weights_bytes,
                      (unsigned long long)plan.phase[ph].activation_bytes);
        /* the weights of the resident models are already counted in base with NONE */
        const uint64_t offset = mode == CDF_OFFLOAD_NONE ? base - plan.total_weights_bytes : base;
        assert_true(generate_with_phase_budget(p, gp, ph, offset + (uint64_t)(planned / 0.9)));
        assert_false(generate_with_phase_budget(p, gp, ph, offset + (uint64_t)(planned / 1.1)));
    }
    cdf_pipeline_free(p);
}

static void test_planner_phases_within_10_percent(void **state) {
    (void)state;
    exec_env env = force_eager();
    const cdf_generate_params gp = request(64);
    check_plan(g_flux, CDF_OFFLOAD_NONE, &gp, false);
    check_plan(g_flux, CDF_OFFLOAD_MODEL, &gp, true);
    cdf_generate_params g2 = request(64);
    g2.guidance_scale = 5.0f; /* CFG: batch 2 */
    check_plan(g_sd3, CDF_OFFLOAD_MODEL, &g2, true);
    /* First Block Cache: its residuals are held across steps (threshold 0: every step runs the
     * head, the tail and keeps the residuals; true CFG: two cache contexts) */
    cdf_generate_params g3 = request(256);
    g3.num_inference_steps = 3;
    g3.cache = "first-block:0";
    g3.negative_prompt = "blurry";
    g3.true_cfg_scale = 2.0f;
    check_plan(g_flux, CDF_OFFLOAD_MODEL, &g3, true);
    g3.cache = "taylorseer:disable_cache_before_step=1,cache_interval=2"; /* factors of every attention module */
    check_plan(g_flux, CDF_OFFLOAD_MODEL, &g3, true);
    g3.cache = "taylorseer:disable_cache_before_step=1,cache_interval=2,use_lite_mode=True"; /* factors of the output */
    check_plan(g_flux, CDF_OFFLOAD_MODEL, &g3, true);
    restore_exec(env);
}

/* ---- CLI ----------------------------------------------------------------------------------------- */
static void test_cli_offload_flag_and_plan(void **state) {
    (void)state;
    const cdf_generate_params gp = request(64);
    const cdf_memory_plan pm = plan_of(g_flux, CDF_OFFLOAD_MODEL, &gp);
    char out[700], err[700], so[700];
    snprintf(out, sizeof out, "%s/cli.png", tu_tmpdir());
    snprintf(err, sizeof err, "%s/cli.err", tu_tmpdir());
    snprintf(so, sizeof so, "%s/cli.out", tu_tmpdir());
    const char *common = "--prompt 'a red fox' --height 64 --width 64 --steps 1 --max-sequence-length 16 --quiet --force "
                         "--dtype f32"; /* the plan above is an f32 one (generate's default is bf16) */
    const unsigned long long budget = (unsigned long long)(pm.peak_bytes / 0.9);

    /* plan prints the same peak as the library */
    assert_int_equal(tu_system("CDIFFUSERS_COMPILE= '%s' plan --model '%s' --height 64 --width 64 --max-sequence-length 16 "
                               "--offload model --dtype f32 > '%s' 2> '%s'", CDF_CLI_PATH, g_flux, so, err), 0);
    char *txt = tu_read_file(so, NULL);
    assert_non_null(txt);
    char want[96];
    snprintf(want, sizeof want, "(%llu bytes)", (unsigned long long)pm.peak_bytes);
    assert_non_null(strstr(txt, want));
    assert_non_null(strstr(txt, "denoising"));
    free(txt);

    /* none over budget: exit 1, the message, no image */
    remove(out);
    int rc = tu_system("'%s' generate --model '%s' %s --output '%s' --device-memory %llu --offload none 2> '%s'", CDF_CLI_PATH,
                       g_flux, common, out, budget, err);
    assert_int_equal(rc, 1);
    txt = tu_read_file(err, NULL);
    assert_non_null(txt);
    assert_non_null(strstr(txt, "--offload model"));
    assert_non_null(strstr(txt, "out of memory"));
    assert_non_null(strstr(txt, "budget"));
    free(txt);
    struct stat st;
    assert_int_not_equal(stat(out, &st), 0);

    /* model under the same budget: runs and reports its phases */
    /* (eager: the budget is the eager plan's; defer-and-fuse holds a pending graph's outputs) */
    rc = tu_system("CDIFFUSERS_COMPILE= CDIFFUSERS_DEFER_AND_FUSE= '%s' generate --model '%s' %s --output '%s' --device-memory "
                   "%llu --offload model --mode eager --memory-stats 2> '%s'", CDF_CLI_PATH, g_flux, common, out, budget, err);
    txt = tu_read_file(err, NULL);
    if (rc != 0 && txt) print_message("%s\n", txt);
    assert_int_equal(rc, 0);
    assert_non_null(txt);
    assert_non_null(strstr(txt, "models materialised: 4"));
    free(txt);
    assert_int_equal(stat(out, &st), 0);

    /* a bad mode is a usage error */
    assert_int_equal(tu_system("'%s' generate --model '%s' %s --output '%s' --offload disk 2> '%s'", CDF_CLI_PATH, g_flux,
                               common, out, err),
                     2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_header_weights_equal_loaded_bytes),
        cmocka_unit_test(test_budget_below_sum_none_fails_model_runs),
        cmocka_unit_test(test_offload_outputs_bit_identical),
        cmocka_unit_test(test_planner_phases_within_10_percent),
        cmocka_unit_test(test_cli_offload_flag_and_plan),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
