/* Sequential offload (--offload sequential, cdf_pipeline_enable_sequential_cpu_offload) on
 * pipelines with random weights written by tools/make-random-pipeline: a FLUX.1-architecture
 * pipeline whose transformer (7 MB, 4 blocks) is the largest model, and an SD3.5-architecture
 * one (three block classes: plain, dual attention, context_pre_only).
 *
 * What must hold (issue "Model offload and device memory budgets", sequential part):
 *  - with a device budget smaller than the transformer alone, --offload model is refused up
 *    front (and says that sequential would fit), --offload sequential runs, stays within the
 *    budget, and its outputs are bit-identical to --offload none without a budget;
 *  - the planner's sequential peaks are within 10% of the measured need: each phase runs under
 *    planned/0.9 and fails under planned/1.1 (a budget applied to that phase only), in eager
 *    execution and, with the plan for it, with repeated-block compile (model offload too);
 *  - the same with repeated-block compile and with whole compile (which a sequentially offloaded
 *    transformer turns into repeated-block compile), via the API;
 *  - nothing stays on the device after generate: neither block copies nor graphs (repeated-block
 *    graphs must not pin a block's weights or their arenas across model offload);
 *  - a host-side block weight used outside its block is an error, not a crash.
 * The suite runs this file in eager, defer-and-fuse, compile and repeated-block compile modes
 * (test.sh); the environment's mode applies to everything here. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdiffusers/cdiffusers.h"
#include "nn/nn.h"
#include "pipelines/pipeline_impl.h"
#include "pipelines/planner.h"

#include "offload_test_common.h"

static char g_flux[600], g_sd3[600];

/* SD3.5 architecture (dual attention, qk norm), transformer width 128 over 5 blocks (12 MB): its
 * settings (the text encoders': ot_sd3_text_sets). */
static const char *const k_sd3_sets[] = {"sd3.heads=2", "sd3.head_dim=64", "sd3.layers=5", "sd3.dual_layers=2", "seed=11"};

static int setup(void **state) {
    (void)state;
    return ot_write_pipelines("seq_flux_random", g_flux, sizeof g_flux, "seq_sd3_random", g_sd3, sizeof g_sd3, k_sd3_sets,
                              sizeof k_sd3_sets / sizeof *k_sd3_sets);
}

static const char *flux2_dir(void) { return tu_data("pipelines/flux2_dev_tiny"); }
static const int k_flux2_layers[3] = {1, 2, 3}; /* the tiny text encoder has 4 layers */

static cdf_generate_params request(const char *dir) {
    cdf_generate_params gp = cdf_generate_params_default();
    if (strstr(dir, "flux2_dev_tiny")) {
        gp.text_encoder_out_layers = k_flux2_layers;
        gp.num_text_encoder_out_layers = 3;
    }
    gp.prompt = "a red fox in the snow";
    gp.height = gp.width = 64;
    gp.num_inference_steps = 1;
    gp.max_sequence_length = 16;
    gp.seed = 3;
    if (dir == g_sd3) {
        gp.negative_prompt = "blurry";
        gp.guidance_scale = 4.5f; /* CFG: batch 2 */
    }
    return gp;
}

static cdf_pipeline_load_params load_params(cdf_offload_mode mode) {
    cdf_pipeline_load_params lp = cdf_pipeline_load_params_default();
    lp.offload = mode;
    lp.weight_dtype = CDF_F32; /* the sizes above are f32 ones */
    return lp;
}

static cdf_memory_plan plan_exec(const char *dir, cdf_offload_mode mode, const cdf_generate_params *gp, cdf_plan_execution exec) {
    cdf_pipeline_load_params lp = load_params(mode);
    cdf_memory_plan plan;
    cdf_status s = cdf_pipeline_plan_memory_exec(dir, &lp, gp, exec, &plan);
    if (s != CDF_OK) print_message("plan: %s\n", cdf_last_error());
    assert_int_equal(s, CDF_OK);
    assert_int_equal(plan.execution, exec);
    return plan;
}

static cdf_memory_plan plan_of(const char *dir, cdf_offload_mode mode, const cdf_generate_params *gp) {
    return plan_exec(dir, mode, gp, CDF_PLAN_EAGER);
}

static cdf_pipeline *load(const char *dir, cdf_offload_mode mode) {
    cdf_pipeline *p = NULL;
    cdf_pipeline_load_params lp = load_params(mode);
    cdf_status s = cdf_pipeline_load(dir, &lp, &p);
    if (s != CDF_OK) print_message("load: %s\n", cdf_last_error());
    assert_int_equal(s, CDF_OK);
    return p;
}

/* ---- outputs -------------------------------------------------------------------------------- */
typedef struct result {
    cdf_tensor_map cap;
    cdf_image img;
} result;

static void generate(cdf_pipeline *p, const cdf_generate_params *gp0, result *r) {
    cdf_generate_params gp = *gp0;
    cdf_tensor_map_init(&r->cap);
    gp.capture = (cdf_capture *)&r->cap;
    cdf_status s = cdf_pipeline_generate(p, &gp, &r->img);
    if (s != CDF_OK) print_message("generate: %s\n", cdf_last_error());
    assert_int_equal(s, CDF_OK);
}

static void result_free(result *r) {
    cdf_tensor_map_clear(&r->cap);
    cdf_image_free(&r->img);
}

static void expect_identical(result *a, result *b) {
    static const char *const keys[] = {"latents_final", "vae_decode_output"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        cdf_tensor *x = cdf_tensor_map_get(&a->cap, keys[i]), *y = cdf_tensor_map_get(&b->cap, keys[i]);
        assert_non_null(x);
        assert_non_null(y);
        assert_int_equal(cdf_tensor_numel(x), cdf_tensor_numel(y));
        float *u = cdf_tensor_read_f32(x), *v = cdf_tensor_read_f32(y);
        assert_non_null(u);
        assert_non_null(v);
        if (memcmp(u, v, (size_t)cdf_tensor_numel(x) * sizeof(float)) != 0) print_message("%s differs\n", keys[i]);
        assert_memory_equal(u, v, (size_t)cdf_tensor_numel(x) * sizeof(float));
        free(u);
        free(v);
    }
    assert_int_equal(a->img.width * a->img.height, b->img.width * b->img.height);
    assert_memory_equal(a->img.pixels, b->img.pixels, (size_t)a->img.width * a->img.height * 3);
}

/* The reference: every model resident, no budget (computed once per pipeline). */
static result g_ref[3];
static bool g_have_ref[3];
static result *reference(const char *dir) {
    const int k = dir == g_sd3 ? 1 : dir == g_flux ? 0 : 2;
    if (!g_have_ref[k]) {
        cdf_pipeline *p = load(dir, CDF_OFFLOAD_NONE);
        const cdf_generate_params gp = request(dir);
        generate(p, &gp, &g_ref[k]);
        cdf_pipeline_free(p);
        g_have_ref[k] = true;
    }
    return &g_ref[k];
}

static int teardown(void **state) {
    (void)state;
    for (int k = 0; k < 3; k++)
        if (g_have_ref[k]) result_free(&g_ref[k]);
    return 0;
}

typedef enum { AS_LOADED = 0, API_BLOCKS = 1, API_WHOLE = 2 } compile_variant;
static const char *const k_variant[] = {"as loaded (environment's mode)", "cdf_pipeline_compile_repeated_blocks",
                                        "cdf_pipeline_compile"};

static void apply_variant(cdf_pipeline *p, compile_variant v) {
    cdf_compile_options o = cdf_compile_options_default();
    if (v == API_BLOCKS) assert_int_equal(cdf_pipeline_compile_repeated_blocks(p, &o), CDF_OK);
    if (v == API_WHOLE) {
        o.fullgraph = false; /* the text encoders are not compiled by it; the VAE has no breaks */
        assert_int_equal(cdf_pipeline_compile(p, &o), CDF_OK);
    }
}

/* Budget below the transformer alone: model refused, sequential runs within it, bit-identical. */
static void check_sequential_under_budget(const char *dir, compile_variant variant, int runs) {
    result *ref = reference(dir), got;
    const cdf_generate_params gp = request(dir);
    const cdf_memory_plan ps = plan_of(dir, CDF_OFFLOAD_SEQUENTIAL, &gp);
    const cdf_memory_plan pm = plan_of(dir, CDF_OFFLOAD_MODEL, &gp);
    const uint64_t budget = (uint64_t)(ps.peak_bytes / 0.9);
    print_message("%s, %s: transformer %llu bytes (%d blocks, largest %llu); sequential plan %llu, budget %llu\n",
                  ps.pipeline_class, k_variant[variant], (unsigned long long)pm.largest_weights_bytes, ps.n_blocks,
                  (unsigned long long)ps.largest_block_bytes, (unsigned long long)ps.peak_bytes,
                  (unsigned long long)budget);
    assert_true(ps.n_blocks >= 3);
    assert_true(budget < pm.largest_weights_bytes); /* the transformer alone does not fit */
    assert_string_equal(pm.component[ps.n_components - 2].name, "transformer");
    assert_int_equal(pm.component[ps.n_components - 2].weights_bytes, pm.largest_weights_bytes);

    const uint64_t base = current_bytes();
    assert_int_equal(cdf_device_set_memory_limit(dev(), base + budget), CDF_OK);
    cdf_pipeline *p = NULL;
    cdf_pipeline_load_params lp = load_params(CDF_OFFLOAD_MODEL);
    assert_int_equal(cdf_pipeline_load(dir, &lp, &p), CDF_ERR_OUT_OF_MEMORY);
    assert_null(p);
    print_message("model: %s\n", cdf_last_error());
    assert_non_null(strstr(cdf_last_error(), "the largest model, transformer"));
    assert_non_null(strstr(cdf_last_error(), "--offload sequential"));
    assert_int_equal(current_bytes(), base);

    p = load(dir, CDF_OFFLOAD_SEQUENTIAL);
    assert_int_equal(cdf_pipeline_offload_mode(p), CDF_OFFLOAD_SEQUENTIAL);
    assert_int_equal(current_bytes(), base);
    apply_variant(p, variant);
    for (int run = 0; run < runs; run++) { /* a second generate replays what the first compiled */
        generate(p, &gp, &got);
        expect_identical(ref, &got);
        result_free(&got);
        cdf_pipeline_memory_stats ms;
        cdf_pipeline_last_memory_stats(p, &ms);
        print_message("sequential run %d: measured peak %llu (denoising %llu) under budget %llu; planned %llu\n", run,
                      (unsigned long long)(ms.peak_bytes - base),
                      (unsigned long long)(ms.phase_peak_bytes[CDF_PHASE_DENOISE] - base), (unsigned long long)budget,
                      (unsigned long long)ps.peak_bytes);
        assert_true(ms.peak_bytes - base <= budget);
        assert_true(ms.phase_peak_bytes[CDF_PHASE_DENOISE] - base < pm.largest_weights_bytes);
        /* every block copy, graph arena and model released after generate */
        assert_int_equal(current_bytes(), base);
    }
    /* the block graphs outlive the transformer's release (they hold no device memory: checked above) */
    if (variant == API_BLOCKS) assert_true(cdf_component_compiled_graphs(p->transformer) > 0);
    cdf_pipeline_free(p);
    assert_int_equal(cdf_device_set_memory_limit(dev(), 0), CDF_OK);
}

static void test_flux_sequential_under_budget(void **state) {
    (void)state;
    check_sequential_under_budget(g_flux, AS_LOADED, 2);
}

static void test_sd3_sequential_under_budget(void **state) {
    (void)state;
    check_sequential_under_budget(g_sd3, AS_LOADED, 1);
}

static void test_sequential_with_compile_api(void **state) {
    (void)state;
    /* (SD3's three block classes with repeated-block compile: the suite's CDIFFUSERS_COMPILE=blocks
     * run of test_sd3_sequential_under_budget) */
    check_sequential_under_budget(g_flux, API_BLOCKS, 2);
    check_sequential_under_budget(g_flux, API_WHOLE, 1);
}

/* FLUX.2 (its blocks go through cdf_block_run too): the golden tiny pipeline, whose text
 * encoder is the largest model, so no budget here: outputs and the denoising plan only. */
static void check_plan(const char *dir, cdf_offload_mode mode, compile_variant variant);
/* check_plan with sequential and with model offload */
static void check_plans(const char *dir, compile_variant variant) {
    check_plan(dir, CDF_OFFLOAD_SEQUENTIAL, variant);
    check_plan(dir, CDF_OFFLOAD_MODEL, variant);
}

static void test_flux2_sequential(void **state) {
    (void)state;
    const char *dir = flux2_dir();
    const cdf_generate_params gp = request(dir);
    result *ref = reference(dir); /* it holds device tensors: before the baseline */
    const uint64_t base = current_bytes();
    cdf_pipeline *p = load(dir, CDF_OFFLOAD_SEQUENTIAL);
    result got;
    generate(p, &gp, &got);
    expect_identical(ref, &got);
    result_free(&got);
    const cdf_memory_plan pm = plan_of(dir, CDF_OFFLOAD_SEQUENTIAL, &gp);
    assert_int_equal(pm.n_blocks, 4);
    assert_true(pm.component[1].activation_known); /* the transformer's formula */
    assert_int_equal(current_bytes(), base);
    cdf_pipeline_free(p);
    check_plans(dir, AS_LOADED);
    check_plans(dir, API_BLOCKS);
}

/* The planner's weights are what the loaders put on the device, to the byte, for every pipeline
 * class: e.g. FLUX.2's text encoder checkpoint also holds the lm_head and a vision tower (half of
 * the tiny file) and its VAE a BatchNorm counter, which are never loaded and must not be counted. */
static void test_planned_weights_are_loaded_weights(void **state) {
    (void)state;
    const char *dirs[] = {flux2_dir(), tu_data("pipelines/flux1_dev_tiny"), tu_data("pipelines/sd35m_tiny"), g_flux, g_sd3};
    for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++) {
        const cdf_generate_params gp = request(dirs[i]);
        const cdf_memory_plan pm = plan_of(dirs[i], CDF_OFFLOAD_NONE, &gp);
        const uint64_t base = current_bytes();
        cdf_pipeline *p = load(dirs[i], CDF_OFFLOAD_NONE);
        const uint64_t loaded = current_bytes() - base;
        print_message("  %s: planned weights %llu bytes, resident after load %llu\n", pm.pipeline_class,
                      (unsigned long long)pm.total_weights_bytes, (unsigned long long)loaded);
        assert_int_equal(pm.total_weights_bytes, loaded);
        cdf_pipeline_free(p);
    }
}

/* Switching a loaded pipeline (diffusers' enable_sequential_cpu_offload) and back. */
static void test_enable_sequential_on_loaded_pipeline(void **state) {
    (void)state;
    result *ref = reference(g_flux), seq, back;
    const cdf_generate_params gp = request(g_flux);
    cdf_pipeline *p = load(g_flux, CDF_OFFLOAD_NONE);
    assert_int_equal(cdf_pipeline_enable_sequential_cpu_offload(p), CDF_OK);
    assert_false(cdf_component_is_loaded(p->transformer));
    generate(p, &gp, &seq);
    cdf_pipeline_memory_stats ms;
    cdf_pipeline_last_memory_stats(p, &ms);
    assert_int_equal(ms.materialisations, 4); /* CLIP, T5, transformer (its non-block weights), VAE */
    assert_int_equal(cdf_pipeline_set_offload(p, CDF_OFFLOAD_NONE), CDF_OK);
    assert_true(cdf_component_is_loaded(p->transformer));
    generate(p, &gp, &back);
    expect_identical(ref, &seq);
    expect_identical(ref, &back);
    assert_int_equal(cdf_pipeline_set_offload(p, (cdf_offload_mode)7), CDF_ERR_INVALID_ARG);
    result_free(&seq);
    result_free(&back);
    cdf_pipeline_free(p);
}

/* Repeated-block graphs bind their weights per call: model offload releases the weights and
 * leaves no device memory behind, but keeps the graphs, so a second generate with the same shapes
 * replays them and compiles nothing (diffusers' compile_repeated_blocks + enable_model_cpu_offload). */
static void test_block_graphs_do_not_pin_weights(void **state) {
    (void)state;
    const cdf_generate_params gp = request(g_flux);
    result *ref = reference(g_flux); /* it holds device tensors: before the baseline */
    const uint64_t base = current_bytes();
    cdf_pipeline *p = load(g_flux, CDF_OFFLOAD_MODEL);
    cdf_compile_options o = cdf_compile_options_default();
    assert_int_equal(cdf_pipeline_compile_repeated_blocks(p, &o), CDF_OK);
    /* whole-model compile (the suite's CDIFFUSERS_COMPILE=1 on the other models) recompiles after
     * each release, as its graphs hold the weights: the count is checked without it */
    const char *env = getenv("CDIFFUSERS_COMPILE");
    const bool count = !env || !*env || strcmp(env, "0") == 0 || strcmp(env, "blocks") == 0;
    for (int run = 0; run < 2; run++) {
        cdf_exec_stats s0, s1;
        cdf_exec_get_stats(&s0);
        result r;
        generate(p, &gp, &r);
        cdf_exec_get_stats(&s1);
        print_message("model offload + repeated blocks, run %d: %llu compiles, %d block graphs kept\n", run,
                      (unsigned long long)(s1.compiles - s0.compiles), cdf_component_compiled_graphs(p->transformer));
        assert_false(cdf_component_is_loaded(p->transformer)); /* released after the denoising phase */
        assert_true(cdf_component_compiled_graphs(p->transformer) > 0); /* kept across the release */
        if (count && run == 0) assert_true(s1.compiles > s0.compiles);
        if (count && run == 1) assert_int_equal(s1.compiles - s0.compiles, 0);
        expect_identical(ref, &r);
        result_free(&r);
        assert_int_equal(current_bytes(), base); /* the transformer's weights and its block graphs' arenas */
    }
    cdf_pipeline_free(p);
}

/* ---- planner ------------------------------------------------------------------------------------ */
/* Every phase, within 10%. The plan is for the execution the pipeline runs: as loaded, the environment's
 * (CDIFFUSERS_COMPILE=blocks: repeated-block compile; =1 / fullgraph: whole-model compile, which
 * sequential offload turns into repeated-block compile), or repeated-block compile by the API.
 * Whole-model compile is not modelled (the eager plan is an upper bound there). */
static const char *compile_env(void) {
    const char *c = getenv("CDIFFUSERS_COMPILE");
    return c && *c && strcmp(c, "0") != 0 ? c : NULL;
}

static void check_plan(const char *dir, cdf_offload_mode mode, compile_variant variant) {
    const char *env = compile_env();
    const bool blocks = variant == API_BLOCKS || (env && (strcmp(env, "blocks") == 0 || mode == CDF_OFFLOAD_SEQUENTIAL));
    const bool upper_bound_only = !blocks && env; /* whole-model compile */
    cdf_generate_params gp = request(dir);
    gp.vae_tiling = CDF_VAE_TILING_OFF; /* the untiled decode's plan (AUTO would tile under a budget below it) */
    const cdf_memory_plan plan = plan_exec(dir, mode, &gp, blocks ? CDF_PLAN_REPEATED_BLOCKS : CDF_PLAN_EAGER);
    cdf_pipeline *p = load(dir, mode);
    if (variant == API_BLOCKS) apply_variant(p, API_BLOCKS);
    const uint64_t base = current_bytes();
    /* every phase: the text encoders' formulas (FLUX.2: Mistral's), the transformer's, the VAE's */
    for (int ph = CDF_PHASE_TEXT; ph < CDF_PHASE_COUNT; ph++) {
        const uint64_t planned = plan.phase[ph].peak_bytes;
        print_message("%s %s %s (%s): planned %llu (weights %llu + activations %llu)\n", plan.pipeline_class,
                      mode == CDF_OFFLOAD_SEQUENTIAL ? "sequential" : "model", cdf_pipeline_phase_name((cdf_pipeline_phase)ph),
                      blocks ? "repeated-block compile" : env ? "whole-model compile" : "eager", (unsigned long long)planned,
                      (unsigned long long)plan.phase[ph].weights_bytes, (unsigned long long)plan.phase[ph].activation_bytes);
        assert_true(generate_with_phase_budget(p, &gp, ph, base + (uint64_t)(planned / 0.9)));
        if (!upper_bound_only) assert_false(generate_with_phase_budget(p, &gp, ph, base + (uint64_t)(planned / 1.1)));
    }
    cdf_pipeline_free(p);
}

static void test_planner_sequential_within_10_percent(void **state) {
    (void)state;
    check_plan(g_flux, CDF_OFFLOAD_SEQUENTIAL, AS_LOADED);
    check_plan(g_sd3, CDF_OFFLOAD_SEQUENTIAL, AS_LOADED);
}

/* Repeated-block compile through the API, whatever the suite's mode: each block graph's arena
 * exists only while the block runs, and the plan models the largest one. */
static void test_planner_repeated_blocks_within_10_percent(void **state) {
    (void)state;
    check_plans(g_flux, API_BLOCKS);
    check_plans(g_sd3, API_BLOCKS);
}

/* ---- misuse ------------------------------------------------------------------------------------- */
static void test_host_side_weight_outside_block_is_an_error(void **state) {
    (void)state;
    char sub[700];
    snprintf(sub, sizeof sub, "%s/transformer", g_flux);
    cdf_load_options o = cdf_load_options_default();
    o.device = dev();
    o.blocks_on_host = true;
    cdf_weights *w = NULL;
    assert_int_equal(cdf_weights_open(sub, &o, &w), CDF_OK);
    const uint64_t before = current_bytes();
    const int64_t shape[2] = {-1, -1};
    cdf_tensor *blk = cdf_weights_get(w, 2, shape, "transformer_blocks.0.attn.to_q.weight");
    cdf_tensor *top = cdf_weights_get(w, 2, shape, "x_embedder.weight");
    cdf_weights_free(w); /* the host-side weight keeps the checkpoint mapped */
    assert_non_null(blk);
    assert_non_null(top);
    assert_int_equal(current_bytes(), before + (uint64_t)cdf_tensor_numel(top) * 4); /* only the resident one */
    assert_int_equal(cdf_weights_block_prefix("single_transformer_blocks.12.attn.to_q.weight"), strlen("single_transformer_blocks.12"));
    assert_int_equal(cdf_weights_block_prefix("x_embedder.weight"), 0);
    assert_int_equal(cdf_weights_block_prefix("down_blocks.x.weight"), 0);
    float buf[4];
    assert_int_equal(cdf_tensor_read(blk, CDF_F32, buf, sizeof buf), CDF_ERR_INVALID_ARG);
    const int64_t xs[2] = {1, cdf_tensor_dim(blk, 1)};
    cdf_tensor *x = cdf_tensor_zeros(dev(), CDF_F32, 2, xs);
    cdf_tensor *y = cdf_linear(x, blk, NULL);
    assert_null(y);
    assert_non_null(strstr(cdf_last_error(), "host-side block weight"));
    cdf_tensor *x2 = cdf_tensor_zeros(dev(), CDF_F32, 2, (int64_t[]){1, cdf_tensor_dim(top, 1)});
    cdf_tensor *z = cdf_linear(x2, top, NULL); /* a resident weight of the same model works */
    assert_non_null(z);
    cdf_tensor_release(z);
    cdf_tensor_release(x2);
    cdf_tensor_release(x);
    cdf_tensor_release(blk);
    cdf_tensor_release(top);
    assert_int_equal(current_bytes(), before);
}

/* ---- CLI ----------------------------------------------------------------------------------------- */
static void test_cli_sequential(void **state) {
    (void)state;
    const cdf_generate_params gp = request(g_flux);
    const cdf_memory_plan ps = plan_of(g_flux, CDF_OFFLOAD_SEQUENTIAL, &gp);
    char out[700], ref[700], err[700], so[700];
    snprintf(out, sizeof out, "%s/seq_cli.png", tu_tmpdir());
    snprintf(ref, sizeof ref, "%s/seq_cli_ref.png", tu_tmpdir());
    snprintf(err, sizeof err, "%s/seq_cli.err", tu_tmpdir());
    snprintf(so, sizeof so, "%s/seq_cli.out", tu_tmpdir());
    const char *common = "--prompt 'a red fox' --height 64 --width 64 --steps 1 --max-sequence-length 16 --quiet --force "
                         "--dtype f32";
    const unsigned long long budget = (unsigned long long)(ps.peak_bytes / 0.9);

    assert_int_equal(tu_system("CDIFFUSERS_COMPILE= '%s' plan --model '%s' --height 64 --width 64 --max-sequence-length 16 "
                               "--offload sequential --dtype f32 > '%s' 2> '%s'", CDF_CLI_PATH, g_flux, so, err), 0);
    char *txt = tu_read_file(so, NULL);
    assert_non_null(txt);
    char want[96];
    snprintf(want, sizeof want, "(%llu bytes)", (unsigned long long)ps.peak_bytes);
    assert_non_null(strstr(txt, want));
    assert_non_null(strstr(txt, "offload sequential"));
    assert_non_null(strstr(txt, "transformer blocks: 4"));
    assert_non_null(strstr(txt, "eager or defer-and-fuse execution"));
    free(txt);
    /* the plan for repeated-block compile (SD3 with CFG: its denoising phase is the peak in eager, the
     * text phase with compiled blocks), from the flag and from the environment generate reads */
    const cdf_generate_params gs = request(g_sd3);
    const cdf_memory_plan pe = plan_of(g_sd3, CDF_OFFLOAD_MODEL, &gs);
    const cdf_memory_plan pb = plan_exec(g_sd3, CDF_OFFLOAD_MODEL, &gs, CDF_PLAN_REPEATED_BLOCKS);
    assert_true(pb.phase[CDF_PHASE_DENOISE].activation_bytes < pe.phase[CDF_PHASE_DENOISE].activation_bytes);
    assert_true(pb.phase[CDF_PHASE_TEXT].peak_bytes == pe.phase[CDF_PHASE_TEXT].peak_bytes);
    const char *const how[2] = {"CDIFFUSERS_COMPILE= '%s' plan --compile-repeated-blocks", "CDIFFUSERS_COMPILE=blocks '%s' plan"};
    for (int i = 0; i < 2; i++) {
        char cmd[900];
        snprintf(cmd, sizeof cmd, how[i], CDF_CLI_PATH);
        assert_int_equal(tu_system("%s --model '%s' --height 64 --width 64 --max-sequence-length 16 --negative-prompt blurry "
                                   "--guidance 4.5 --offload model --dtype f32 > '%s' 2> '%s'", cmd, g_sd3, so, err), 0);
        txt = tu_read_file(so, NULL);
        assert_non_null(txt);
        snprintf(want, sizeof want, "(%llu bytes)", (unsigned long long)pb.peak_bytes);
        if (!strstr(txt, want)) print_message("%s\nwanted %s\n", txt, want);
        assert_non_null(strstr(txt, want));
        assert_non_null(strstr(txt, "with repeated-block compile"));
        free(txt);
    }

    assert_int_equal(tu_system("'%s' generate --model '%s' %s --output '%s' 2> '%s'", CDF_CLI_PATH, g_flux, common, ref, err), 0);
    /* model under a budget below the transformer: exit 1, pointing at sequential */
    assert_int_equal(tu_system("'%s' generate --model '%s' %s --output '%s' --device-memory %llu --offload model 2> '%s'",
                               CDF_CLI_PATH, g_flux, common, out, budget, err),
                     1);
    txt = tu_read_file(err, NULL);
    assert_non_null(txt);
    assert_non_null(strstr(txt, "--offload sequential"));
    free(txt);
    int rc = tu_system("'%s' generate --model '%s' %s --output '%s' --device-memory %llu --offload sequential --memory-stats "
                       "2> '%s'", CDF_CLI_PATH, g_flux, common, out, budget, err);
    txt = tu_read_file(err, NULL);
    if (rc != 0 && txt) print_message("%s\n", txt);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(txt, "offload sequential"));
    free(txt);
    size_t na = 0, nb = 0;
    char *a = tu_read_file(ref, &na), *b = tu_read_file(out, &nb);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, na);
    free(a);
    free(b);
    assert_int_equal(tu_system("'%s' generate --model '%s' %s --output '%s' --offload disk 2> '%s'", CDF_CLI_PATH, g_flux,
                               common, out, err),
                     2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_host_side_weight_outside_block_is_an_error),
        cmocka_unit_test(test_flux_sequential_under_budget),
        cmocka_unit_test(test_sd3_sequential_under_budget),
        cmocka_unit_test(test_sequential_with_compile_api),
        cmocka_unit_test(test_flux2_sequential),
        cmocka_unit_test(test_planned_weights_are_loaded_weights),
        cmocka_unit_test(test_enable_sequential_on_loaded_pipeline),
        cmocka_unit_test(test_block_graphs_do_not_pin_weights),
        cmocka_unit_test(test_planner_sequential_within_10_percent),
        cmocka_unit_test(test_planner_repeated_blocks_within_10_percent),
        cmocka_unit_test(test_cli_sequential),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
