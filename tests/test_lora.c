/* LoRA adapters (issue #20) against diffusers + PEFT: tests/data/lora (made by
 * tools/make-lora-golden/make_lora_golden.py; see its README) holds random adapters in the
 * diffusers/PEFT (with network alphas), kohya and XLabs formats for the tiny golden FLUX.1-dev and SD3
 * transformers, and the transformer outputs diffusers computes with them: run time at scale 1
 * and 0.7, fused at 0.7, two adapters at once.
 *
 * Tolerance: 3e-4 max abs, the golden transformers' own f32 tolerance (test_model_flux's
 * DEV_ATOL, test_model_sd3's F32_ATOL: our timestep table uses its own expf). The adapters move
 * the outputs by 1.7 to 5.6 (reference.json), so a dropped or mis-scaled layer cannot pass.
 *
 * The suite runs in every execution mode (CDIFFUSERS_DEFER_AND_FUSE=1, CDIFFUSERS_COMPILE=1,
 * CDIFFUSERS_COMPILE=blocks): components load compiled when those are set, and every check here
 * runs through cdf_component_run. The scale checks also assert that a new scale does not
 * recompile (recompiles are forbidden around the second run). */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cdiffusers/exec.h"
#include "cdiffusers/io.h"
#include "compile/compile.h"
#include "models/component.h"
#include "models/lora_file.h"
#include "nn/lora.h"
#include "pipelines/pipeline_impl.h"

#define ATOL 3e-4

static const char *path_of(const char *rel) {
    static char buf[8][1024];
    static int slot;
    char *b = buf[slot++ & 7];
    snprintf(b, 1024, "%s/%s", CDF_TEST_DATA, rel);
    return b;
}

typedef struct model_case {
    const char *folder; /* golden/<x> */
    const char *ref;    /* lora/<x>.safetensors */
    double atol;        /* the golden transformer's own f32 tolerance */
} model_case;
static const model_case FLUX = {"golden/flux1_dev", "lora/flux.safetensors", ATOL};
static const model_case SD3 = {"golden/sd3", "lora/sd3.safetensors", ATOL};
/* test_model_flux2's DEV_ATOL / KLEIN_ATOL */
static const model_case FLUX2_DEV = {"golden/flux2_dev", "lora/flux2_dev.safetensors", 1e-4};
static const model_case FLUX2_KLEIN = {"golden/flux2_klein", "lora/flux2_klein.safetensors", 5e-5};

static cdf_component *load_transformer(const model_case *mc) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/transformer", path_of(mc->folder));
    return tu_load_component(dir, CDF_F32);
}

static cdf_status load_lora(cdf_component *c, const char *rel, int id, float scale, cdf_lora_mode mode, bool allow_unused,
                            cdf_lora_info *info) {
    cdf_lora_components cs = {.n = 1, .name = {"transformer"}, .c = {c}};
    cdf_lora_params lp = cdf_lora_params_default();
    lp.scale = scale;
    lp.mode = mode;
    lp.allow_unused = allow_unused;
    return cdf_lora_load_into(&cs, path_of(rel), &lp, id, info);
}

/* max |forward - ref[key]| on the golden inputs */
static double forward_diff(cdf_component *c, const model_case *mc, const char *key) {
    char io_path[512];
    snprintf(io_path, sizeof io_path, "%s/io.safetensors", mc->folder);
    cdf_tensor_map io, ref, out;
    cdf_tensor_map_init(&io);
    cdf_tensor_map_init(&ref);
    cdf_tensor_map_init(&out);
    tu_load_map(&io, io_path);
    tu_load_map(&ref, mc->ref);
    /* only the forward's arguments (io also holds outputs and extras) */
    cdf_tensor_map in;
    cdf_tensor_map_init(&in);
    for (int i = 0; i < io.n; i++)
        if (strncmp(io.names[i], "out.", 4) != 0 && strncmp(io.names[i], "extra.", 6) != 0)
            assert_int_equal(cdf_tensor_map_set(&in, io.names[i], io.tensors[i]), CDF_OK);
    cdf_status s = cdf_component_run(c, "forward", &in, &out);
    if (s != CDF_OK) fail_msg("forward: %s", cdf_last_error());
    cdf_tensor *want = cdf_tensor_map_get(&ref, key);
    if (!want) fail_msg("reference %s has no %s", mc->ref, key);
    double d = tu_diff_tensors(cdf_tensor_map_get(&out, "out.sample"), want, key);
    fprintf(stderr, "  %-28s max abs diff %.3g\n", key, d);
    cdf_tensor_map_clear(&in);
    cdf_tensor_map_clear(&io);
    cdf_tensor_map_clear(&ref);
    cdf_tensor_map_clear(&out);
    return d;
}

static void set_scale(cdf_component *c, int id, float s) {
    cdf_lora_scales *sc = cdf_component_lora_scales(c, false);
    assert_non_null(sc);
    assert_int_equal(cdf_lora_scales_set(sc, id, s), CDF_OK);
}

/* Run time at scale 1 then 0.7 (no recompile in between), as set_adapters does. */
static void runtime_case(const model_case *mc, const char *adapter, const char *prefix, int expect_layers) {
    cdf_component *c = load_transformer(mc);
    assert_true(forward_diff(c, mc, "out.base") < mc->atol);
    cdf_lora_info info;
    char rel[256], key[128];
    snprintf(rel, sizeof rel, "lora/%s.safetensors", adapter);
    cdf_status s = load_lora(c, rel, 0, 1.0f, CDF_LORA_RUNTIME, false, &info);
    if (s != CDF_OK) fail_msg("load %s: %s", rel, cdf_last_error());
    assert_int_equal(info.layers, expect_layers);
    snprintf(key, sizeof key, "out.%s.runtime_s1", prefix);
    assert_true(forward_diff(c, mc, key) < mc->atol);
    const int graphs = cdf_component_compiled_graphs(c);
    set_scale(c, 0, 0.7f);
    cdf_compile_set_forbid_recompile(true);
    snprintf(key, sizeof key, "out.%s.runtime_s07", prefix);
    assert_true(forward_diff(c, mc, key) < mc->atol);
    cdf_compile_set_forbid_recompile(false);
    assert_int_equal(cdf_component_compiled_graphs(c), graphs);
    cdf_component_free(c);
}

static void fused_case(const model_case *mc, const char *adapter, const char *prefix) {
    cdf_component *c = load_transformer(mc);
    char rel[256], key[128];
    snprintf(rel, sizeof rel, "lora/%s.safetensors", adapter);
    cdf_status s = load_lora(c, rel, 0, 0.7f, CDF_LORA_FUSE, false, NULL);
    if (s != CDF_OK) fail_msg("load %s: %s", rel, cdf_last_error());
    assert_null(cdf_component_lora_scales(c, false)); /* nothing at run time */
    snprintf(key, sizeof key, "out.%s.fused_s07", prefix);
    assert_true(forward_diff(c, mc, key) < mc->atol);
    /* unfused (what cdf_pipeline_unload_lora does; diffusers' unfuse_lora): the base model again */
    assert_int_equal(cdf_component_lora_unfuse(c), CDF_OK);
    assert_true(forward_diff(c, mc, "out.base") < mc->atol);
    assert_int_equal(cdf_component_lora_unfuse(c), CDF_OK); /* nothing left to undo */
    assert_true(forward_diff(c, mc, "out.base") < mc->atol);
    cdf_component_free(c);
}

/* FLUX: 14 linears x 2 double blocks + 6 x 2 single blocks + 5 others */
static void test_flux_peft_runtime(void **st) { (void)st, runtime_case(&FLUX, "flux_peft", "flux_peft", 45); }
static void test_flux_peft_fused(void **st) { (void)st, fused_case(&FLUX, "flux_peft", "flux_peft"); }
/* kohya: the 10 per double block and 3 per single block keys reach 14 x 2 + 6 x 2 layers */
static void test_flux_kohya_runtime(void **st) { (void)st, runtime_case(&FLUX, "flux_kohya", "flux_kohya", 40); }
static void test_flux_kohya_fused(void **st) { (void)st, fused_case(&FLUX, "flux_kohya", "flux_kohya"); }
/* XLabs: qkv_lora1/2 (3 layers each) + proj_lora1/2 per double block, qkv_lora (3) + proj_lora
 * per single block: 8 x 2 + 4 x 2 layers */
static void test_flux_xlabs_runtime(void **st) { (void)st, runtime_case(&FLUX, "flux_xlabs", "flux_xlabs", 24); }
static void test_flux_xlabs_fused(void **st) { (void)st, fused_case(&FLUX, "flux_xlabs", "flux_xlabs"); }
/* SD3: 14 + 14 + 11 block linears + context_embedder + proj_out */
static void test_sd3_runtime(void **st) { (void)st, runtime_case(&SD3, "sd3_peft", "sd3_peft", 41); }
static void test_sd3_fused(void **st) { (void)st, fused_case(&SD3, "sd3_peft", "sd3_peft"); }

/* FLUX.2 (diffusers/PEFT on every linear): per double block 8 attention + 4 feed-forward
 * linears, per single block the fused to_qkv_mlp_proj and to_out, three shared modulations,
 * x/context embedders, norm_out, proj_out, the time (+ guidance, dev) embedder's two linears */
static void test_flux2_dev_runtime(void **st) { (void)st, runtime_case(&FLUX2_DEV, "flux2_dev_peft", "flux2_dev_peft", 39); }
static void test_flux2_dev_fused(void **st) { (void)st, fused_case(&FLUX2_DEV, "flux2_dev_peft", "flux2_dev_peft"); }
static void test_flux2_klein_runtime(void **st) {
    (void)st, runtime_case(&FLUX2_KLEIN, "flux2_klein_peft", "flux2_klein_peft", 37);
}
static void test_flux2_klein_fused(void **st) { (void)st, fused_case(&FLUX2_KLEIN, "flux2_klein_peft", "flux2_klein_peft"); }
/* FLUX.2 kohya names (diffusers' _convert_kohya_flux2_lora_to_diffusers): per double block
 * img/txt qkv (3 + 3), proj (2), mlp_0/2 (4); per single block linear1 (the fused
 * to_qkv_mlp_proj) and linear2; img_in, txt_in, time_in x 2, final_layer_linear */
static void test_flux2_dev_kohya_runtime(void **st) { (void)st, runtime_case(&FLUX2_DEV, "flux2_dev_kohya", "flux2_dev_kohya", 33); }
static void test_flux2_dev_kohya_fused(void **st) { (void)st, fused_case(&FLUX2_DEV, "flux2_dev_kohya", "flux2_dev_kohya"); }
/* ai-toolkit names (_convert_non_diffusers_flux2_lora_to_diffusers): block 0 in BFL names (12),
 * block 1 in diffusers' names passed through (12), single blocks (4), 11 others (guidance_in,
 * final_layer.adaLN_modulation.1, the shared modulations too) */
static void test_flux2_dev_aitk_runtime(void **st) { (void)st, runtime_case(&FLUX2_DEV, "flux2_dev_aitk", "flux2_dev_aitk", 39); }
static void test_flux2_dev_aitk_fused(void **st) { (void)st, fused_case(&FLUX2_DEV, "flux2_dev_aitk", "flux2_dev_aitk"); }
/* the same adapter as PEFT saves it ("base_model.model." for "diffusion_model."): diffusers gives
 * the ai-toolkit file's outputs bit for bit (make_lora_golden.py asserts it), so they are the reference */
static void test_flux2_dev_peftbm_runtime(void **st) { (void)st, runtime_case(&FLUX2_DEV, "flux2_dev_peftbm", "flux2_dev_aitk", 39); }
static void test_flux2_dev_peftbm_fused(void **st) { (void)st, fused_case(&FLUX2_DEV, "flux2_dev_peftbm", "flux2_dev_aitk"); }


/* Two adapters at once: set_adapters(["a", "b"], [0.7, 1.3]). */
static void multi_case(const char *first, const char *prefix) {
    cdf_component *c = load_transformer(&FLUX);
    char rel[256], key[128];
    snprintf(rel, sizeof rel, "lora/%s.safetensors", first);
    assert_int_equal(load_lora(c, rel, 0, 0.7f, CDF_LORA_RUNTIME, false, NULL), CDF_OK);
    assert_int_equal(load_lora(c, "lora/flux_second.safetensors", 1, 1.3f, CDF_LORA_RUNTIME, false, NULL), CDF_OK);
    snprintf(key, sizeof key, "out.%s.multi", prefix);
    assert_true(forward_diff(c, &FLUX, key) < FLUX.atol);
    /* back to the first alone at 0.7 by scaling the second to 0: no recompile */
    const int graphs = cdf_component_compiled_graphs(c);
    set_scale(c, 1, 0.0f);
    cdf_compile_set_forbid_recompile(true);
    snprintf(key, sizeof key, "out.%s.runtime_s07", prefix);
    assert_true(forward_diff(c, &FLUX, key) < FLUX.atol);
    cdf_compile_set_forbid_recompile(false);
    assert_int_equal(cdf_component_compiled_graphs(c), graphs);
    /* unload: the base model again */
    cdf_component_lora_reset(c);
    assert_true(forward_diff(c, &FLUX, "out.base") < FLUX.atol);
    cdf_component_free(c);
}
static void test_flux_multi_peft(void **st) { (void)st, multi_case("flux_peft", "flux_peft"); }
static void test_flux_multi_kohya(void **st) { (void)st, multi_case("flux_kohya", "flux_kohya"); }
static void test_flux_multi_xlabs(void **st) { (void)st, multi_case("flux_xlabs", "flux_xlabs"); }

/* Explicit compile modes (whatever the environment says): a new scale replays the graph. */
static void compiled_case(bool blocks) {
    cdf_component *c = load_transformer(&FLUX);
    cdf_compile_options o = cdf_compile_options_default();
    assert_int_equal(blocks ? cdf_component_compile_repeated_blocks(c, &o) : cdf_component_compile(c, &o), CDF_OK);
    assert_int_equal(load_lora(c, "lora/flux_peft.safetensors", 0, 1.0f, CDF_LORA_RUNTIME, false, NULL), CDF_OK);
    assert_true(forward_diff(c, &FLUX, "out.flux_peft.runtime_s1") < FLUX.atol);
    const int graphs = cdf_component_compiled_graphs(c);
    assert_true(graphs >= 1);
    set_scale(c, 0, 0.7f);
    cdf_compile_set_forbid_recompile(true);
    assert_true(forward_diff(c, &FLUX, "out.flux_peft.runtime_s07") < FLUX.atol);
    cdf_compile_set_forbid_recompile(false);
    assert_int_equal(cdf_component_compiled_graphs(c), graphs);
    cdf_component_free(c);
}
static void test_compile_whole_scale(void **st) { (void)st, compiled_case(false); }
static void test_compile_blocks_scale(void **st) { (void)st, compiled_case(true); }

/* ---- bad input ---------------------------------------------------------------------------- */
/* A one-module adapter for transformer_blocks.0.attn.to_q of the FLUX model (64 -> 64). */
static void write_adapter(const char *path, const char *key_a, int64_t ra, int64_t in, const char *key_b, int64_t out,
                          int64_t rb, float poison, const char *extra_key) {
    cdf_st_writer *w = cdf_st_writer_new();
    float *a = calloc((size_t)(ra * in), sizeof *a), *b = calloc((size_t)(out * rb), sizeof *b);
    for (int64_t i = 0; i < ra * in; i++) a[i] = 0.01f * (float)(i % 7);
    for (int64_t i = 0; i < out * rb; i++) b[i] = 0.02f * (float)(i % 5);
    b[3] = poison;
    const int64_t sa[2] = {ra, in}, sb[2] = {out, rb}, s1[1] = {1};
    assert_int_equal(cdf_st_writer_add(w, key_a, CDF_F32, 2, sa, a), CDF_OK);
    assert_int_equal(cdf_st_writer_add(w, key_b, CDF_F32, 2, sb, b), CDF_OK);
    if (extra_key) {
        const float one = 1.0f;
        assert_int_equal(cdf_st_writer_add(w, extra_key, CDF_F32, 1, s1, &one), CDF_OK);
    }
    assert_int_equal(cdf_st_writer_save(w, path), CDF_OK);
    cdf_st_writer_free(w);
    free(a);
    free(b);
}

#define QA "transformer.transformer_blocks.0.attn.to_q.lora_A.weight"
#define QB "transformer.transformer_blocks.0.attn.to_q.lora_B.weight"

/* The load fails with `want` and a message containing `needle`, and the model is unchanged. */
static void expect_refused(cdf_component *c, const char *path, float scale, cdf_status want, const char *needle) {
    cdf_lora_components cs = {.n = 1, .name = {"transformer"}, .c = {c}};
    cdf_lora_params lp = cdf_lora_params_default();
    lp.scale = scale;
    cdf_status s = cdf_lora_load_into(&cs, path, &lp, 0, NULL);
    if (s != want || !strstr(cdf_last_error(), needle))
        fail_msg("%s: status %d (want %d), message '%s' (want '%s')", path, s, want, cdf_last_error(), needle);
    assert_null(cdf_component_lora_scales(c, false));
}

static void test_bad_input(void **st) {
    (void)st;
    cdf_component *c = load_transformer(&FLUX);
    const char *p = tu_tmp_path("lora_bad.safetensors");
    write_adapter(p, QA, 4, 64, QB, 64, 3, 0.0f, NULL);
    expect_refused(c, p, 1.0f, CDF_ERR_SHAPE, "rank mismatch");
    write_adapter(p, QA, 4, 65, QB, 64, 4, 0.0f, NULL);
    expect_refused(c, p, 1.0f, CDF_ERR_SHAPE, "fits no layer");
    write_adapter(p, QA, 4, 64, QB, 96, 4, 0.0f, NULL);
    expect_refused(c, p, 1.0f, CDF_ERR_SHAPE, "fits no layer");
    write_adapter(p, QA, 4, 64, QB, 64, 4, NAN, NULL);
    expect_refused(c, p, 1.0f, CDF_ERR_FORMAT, "non-finite");
    write_adapter(p, QA, 4, 64, QB, 64, 4, INFINITY, NULL);
    expect_refused(c, p, 1.0f, CDF_ERR_FORMAT, "non-finite");
    write_adapter(p, QA, 4, 64, QB, 64, 4, 0.0f, "transformer.transformer_blocks.0.attn.to_q.dora_scale");
    expect_refused(c, p, 1.0f, CDF_ERR_UNSUPPORTED, "DoRA");
    write_adapter(p, QA, 4, 64, QB, 64, 4, 0.0f, NULL);
    expect_refused(c, p, NAN, CDF_ERR_INVALID_ARG, "not a finite");
    expect_refused(c, p, INFINITY, CDF_ERR_INVALID_ARG, "not a finite");
    /* a key of no layer: an error naming it, or a warning with allow_unused */
    write_adapter(p, QA, 4, 64, QB, 64, 4, 0.0f, "transformer.no_such_layer.alpha");
    expect_refused(c, p, 1.0f, CDF_ERR_NOT_FOUND, "transformer.no_such_layer.alpha");
    write_adapter(p, "transformer.blocks_x.lora_A.weight", 4, 64, "transformer.blocks_x.lora_B.weight", 64, 4, 0.0f, NULL);
    expect_refused(c, p, 1.0f, CDF_ERR_NOT_FOUND, "blocks_x");
    /* SD3 kohya names: diffusers has no converter for them, so they are reported, not guessed */
    write_adapter(p, "lora_unet_joint_blocks_0_x_block_attn_qkv.lora_down.weight", 4, 64,
                  "lora_unet_joint_blocks_0_x_block_attn_qkv.lora_up.weight", 192, 4, 0.0f, NULL);
    expect_refused(c, p, 1.0f, CDF_ERR_FORMAT, "no LoRA weights of a known module (2 tensors, e.g. lora_unet_joint_blocks_0");
    write_adapter(p, QA, 4, 64, QB, 64, 4, 0.0f, "transformer.no_such_layer.alpha");
    cdf_lora_info info;
    assert_int_equal(load_lora(c, p, 0, 1.0f, CDF_LORA_RUNTIME, true, &info), CDF_ERR_NOT_FOUND); /* rel path: not found */
    cdf_lora_components cs = {.n = 1, .name = {"transformer"}, .c = {c}};
    cdf_lora_params lp = cdf_lora_params_default();
    lp.allow_unused = true;
    assert_int_equal(cdf_lora_load_into(&cs, p, &lp, 0, &info), CDF_OK);
    assert_int_equal(info.layers, 1);
    assert_int_equal(info.unused_keys, 1);
    cdf_component_lora_reset(c);
    /* truncated file */
    size_t len = 0;
    char *data = tu_read_file(path_of("lora/flux_peft.safetensors"), &len);
    assert_non_null(data);
    assert_int_equal(tu_write_file(p, data, len / 2), 0);
    free(data);
    expect_refused(c, p, 1.0f, CDF_ERR_FORMAT, "LoRA file");
    /* after all that, the model is the base model */
    assert_true(forward_diff(c, &FLUX, "out.base") < FLUX.atol);
    cdf_component_free(c);
}

/* FLUX.2 names diffusers' converters do not take are refused, not guessed. */
static void test_flux2_names_refused(void **st) {
    (void)st;
    cdf_component *c = load_transformer(&FLUX2_DEV);
    const char *p = tu_tmp_path("lora_flux2_bad.safetensors");
    /* kohya suffixes under ComfyUI's prefix: FLUX.1's converter renames them, FLUX.2's keeps only
     * lora_unet_ names (diffusers ends with an empty adapter) */
    write_adapter(p, "diffusion_model.double_blocks.0.img_attn.proj.lora_down.weight", 4, 64,
                  "diffusion_model.double_blocks.0.img_attn.proj.lora_up.weight", 64, 4, 0.0f, NULL);
    expect_refused(c, p, 1.0f, CDF_ERR_FORMAT, "no LoRA weights of a known module (2 tensors, e.g. diffusion_model.double");
    /* kohya FLUX.1 modulation names: FLUX.2's converter drops them with a warning */
    write_adapter(p, "lora_unet_double_blocks_0_img_attn_proj.lora_down.weight", 4, 64,
                  "lora_unet_double_blocks_0_img_attn_proj.lora_up.weight", 64, 4, 0.0f, "lora_unet_double_blocks_0_img_mod_lin.alpha");
    expect_refused(c, p, 1.0f, CDF_ERR_NOT_FOUND, "lora_unet_double_blocks_0_img_mod_lin.alpha");
    /* ai-toolkit with an alpha: diffusers' converter rejects the file */
    write_adapter(p, "diffusion_model.double_blocks.0.img_attn.proj.lora_A.weight", 4, 64,
                  "diffusion_model.double_blocks.0.img_attn.proj.lora_B.weight", 64, 4, 0.0f,
                  "diffusion_model.double_blocks.0.img_attn.proj.alpha");
    expect_refused(c, p, 1.0f, CDF_ERR_NOT_FOUND, "diffusion_model.double_blocks.0.img_attn.proj.alpha");
    assert_true(forward_diff(c, &FLUX2_DEV, "out.base") < FLUX2_DEV.atol);
    cdf_component_free(c);
}

/* ---- key names ------------------------------------------------------------------------------ */
static void test_key_names(void **st) {
    (void)st;
    char base[CDF_LORA_NAME_MAX];
    bool kohya;
    assert_int_equal(cdf_lora_key_split("lora_unet_single_blocks_3_linear1.lora_down.weight", base, sizeof base, &kohya),
                     CDF_LORA_KEY_A);
    assert_true(kohya);
    assert_string_equal(base, "lora_unet_single_blocks_3_linear1");
    assert_int_equal(cdf_lora_key_split("x.alpha", base, sizeof base, &kohya), CDF_LORA_KEY_ALPHA);
    assert_int_equal(cdf_lora_key_split(".alpha", base, sizeof base, &kohya), CDF_LORA_KEY_OTHER);
    assert_int_equal(cdf_lora_key_split("ab.lora_B.weight", base, 2, &kohya), CDF_LORA_KEY_OTHER); /* does not fit */
    cdf_lora_target t;
    assert_true(cdf_lora_kohya_target("lora_unet_single_blocks_3_linear1", &t));
    assert_int_equal(t.n, 4);
    assert_string_equal(t.module[3], "single_transformer_blocks.3.proj_mlp");
    assert_true(cdf_lora_kohya_target("diffusion_model.double_blocks.12.txt_attn.qkv", &t));
    assert_int_equal(t.n, 3);
    assert_string_equal(t.module[0], "transformer_blocks.12.attn.add_q_proj");
    assert_true(cdf_lora_kohya_target("lora_unet_final_layer_adaLN_modulation_1", &t));
    assert_true(t.swap_halves && t.ignore_alpha);
    assert_string_equal(t.module[0], "norm_out.linear");
    assert_true(cdf_lora_kohya_target("lora_te1_text_model_encoder_layers_5_mlp_fc2", &t));
    assert_string_equal(t.component, "text_encoder");
    assert_string_equal(t.module[0], "text_model.encoder.layers.5.mlp.fc2");
    assert_false(cdf_lora_kohya_target("lora_unet_double_blocks_1234567_img_attn_qkv", &t));
    assert_false(cdf_lora_kohya_target("lora_unet_double_blocks__img_attn_qkv", &t));
    assert_false(cdf_lora_kohya_target("lora_unet_double_blocks_0_vid_attn_qkv", &t));
    assert_true(cdf_lora_diffusers_target("text_encoder_2.text_model.encoder.layers.0.self_attn.q_proj", &t));
    assert_string_equal(t.component, "text_encoder_2");
    assert_false(cdf_lora_diffusers_target("unet.down_blocks.0", &t));
    assert_false(cdf_lora_diffusers_target("transformer.", &t));
    /* XLabs: ".down.weight" counts only under a ".processor." module */
    assert_int_equal(cdf_lora_key_split("double_blocks.7.processor.qkv_lora2.up.weight", base, sizeof base, &kohya),
                     CDF_LORA_KEY_B);
    assert_false(kohya);
    assert_string_equal(base, "double_blocks.7.processor.qkv_lora2");
    assert_int_equal(cdf_lora_key_split("transformer.blocks.0.down.weight", base, sizeof base, &kohya), CDF_LORA_KEY_OTHER);
    assert_int_equal(cdf_lora_key_split("processor.up.weight", base, sizeof base, &kohya), CDF_LORA_KEY_OTHER);
    assert_true(cdf_lora_xlabs_target("double_blocks.7.processor.qkv_lora2", &t));
    assert_int_equal(t.n, 3);
    assert_string_equal(t.module[2], "transformer_blocks.7.attn.add_v_proj");
    assert_true(cdf_lora_xlabs_target("diffusion_model.single_blocks.11.processor.proj_lora", &t));
    assert_int_equal(t.n, 1);
    assert_string_equal(t.module[0], "single_transformer_blocks.11.proj_out");
    assert_true(cdf_lora_xlabs_target("single_blocks.0.processor.qkv_lora", &t));
    assert_int_equal(t.n, 3);
    assert_string_equal(t.module[0], "single_transformer_blocks.0.attn.to_q");
    assert_false(cdf_lora_xlabs_target("single_blocks.0.processor.qkv_lora1", &t)); /* a double-block name */
    assert_false(cdf_lora_xlabs_target("double_blocks.0.processor.proj_lora", &t));
    assert_false(cdf_lora_xlabs_target("double_blocks.x.processor.proj_lora1", &t));
    assert_false(cdf_lora_xlabs_target("double_blocks.0.proj_lora1", &t));
    /* FLUX.2 */
    assert_true(cdf_lora_kohya_flux2_target("lora_unet_single_blocks_3_linear1", &t));
    assert_int_equal(t.n, 1);
    assert_string_equal(t.module[0], "single_transformer_blocks.3.attn.to_qkv_mlp_proj");
    assert_true(cdf_lora_kohya_flux2_target("lora_unet_double_blocks_1_txt_mlp_2", &t));
    assert_string_equal(t.module[0], "transformer_blocks.1.ff_context.linear_out");
    assert_true(cdf_lora_kohya_flux2_target("lora_unet_double_blocks_0_img_attn_qkv", &t));
    assert_int_equal(t.n, 3);
    assert_false(cdf_lora_kohya_flux2_target("lora_unet_guidance_in_in_layer", &t)); /* not in diffusers' kohya map */
    assert_false(cdf_lora_kohya_flux2_target("lora_unet_double_blocks_0_img_mod_lin", &t));
    assert_true(cdf_lora_aitk_flux2_target("diffusion_model.double_blocks.2.txt_attn.qkv", &t));
    assert_int_equal(t.n, 3);
    assert_string_equal(t.module[2], "transformer_blocks.2.attn.add_v_proj");
    assert_true(cdf_lora_aitk_flux2_target("diffusion_model.sformer_blocks.0.attn.to_q", &t));
    assert_string_equal(t.module[0], "transformer_blocks.0.attn.to_q");
    assert_true(cdf_lora_aitk_flux2_target("diffusion_model.final_layer.adaLN_modulation.1", &t));
    assert_true(!t.swap_halves);
    assert_string_equal(t.module[0], "norm_out.linear");
    assert_false(cdf_lora_aitk_flux2_target("diffusion_model.double_blocks.0.img_attn_qkv", &t));
    assert_false(cdf_lora_aitk_flux2_target("double_blocks.0.img_attn.qkv", &t));
}

/* ---- the CLI on a whole pipeline -------------------------------------------------------------
 * tests/data/lora/pipe_flux1_dev_tiny_fused_0.8/transformer is the tiny FluxPipeline's
 * transformer with pipe_flux1_dev_tiny_kohya.safetensors merged offline by diffusers (fuse_lora at
 * 0.8, save_pretrained). Equivalence: generate with `--lora-mode fuse` on the original folder gives
 * the latents generate gives on a folder with that transformer; run time gives them too. 1e-4:
 * the merged weights differ from ours by float32 rounding (the delta is summed in another order),
 * which three denoising steps carry into latents of magnitude ~2. */
#define CLI_ATOL 1e-4

static float *final_latents(const char *path, int64_t *n) {
    cdf_tensor_map m;
    cdf_tensor_map_init(&m);
    assert_int_equal(cdf_tensor_map_load(&m, path, tu_cpu()), CDF_OK);
    cdf_tensor *t = cdf_tensor_map_get(&m, "latents_final");
    assert_non_null(t);
    *n = cdf_tensor_numel(t);
    float *v = cdf_tensor_read_f32(t);
    cdf_tensor_map_clear(&m);
    return v;
}

static int generate(const char *model, const char *extra, const char *tag) {
    return tu_system("'%s' generate --model '%s' --prompt 'a red cube' --steps 3 --height 64 --width 64 --dtype f32 "
                     "--seed 7 --quiet --force --output '%s/%s.png' --latents-out '%s/%s.safetensors' %s 2> '%s/%s.err'",
                     CDF_CLI_PATH, model, tu_tmpdir(), tag, tu_tmpdir(), tag, extra, tu_tmpdir(), tag);
}

static void test_cli_fuse_matches_offline_fused_folder(void **st) {
    (void)st;
    const char *pipe = path_of("pipelines/flux1_dev_tiny");
    const char *fused = tu_tmp_path("fused_pipeline");
    assert_int_equal(tu_system("rm -rf '%s' && mkdir -p '%s' && cd '%s' && for e in *; do [ \"$e\" = transformer ] || "
                               "[ \"$e\" = cases ] || ln -s \"$PWD/$e\" '%s/'\"$e\"; done && ln -s '%s' '%s/transformer'",
                               fused, fused, pipe, fused, path_of("lora/pipe_flux1_dev_tiny_fused_0.8/transformer"), fused),
                     0);
    char arg[1024];
    snprintf(arg, sizeof arg, "--lora '%s:0.8' --lora-mode fuse", path_of("lora/pipe_flux1_dev_tiny_kohya.safetensors"));
    assert_int_equal(generate(pipe, arg, "fuse"), 0);
    snprintf(arg, sizeof arg, "--lora '%s:0.8'", path_of("lora/pipe_flux1_dev_tiny_kohya.safetensors"));
    assert_int_equal(generate(pipe, arg, "runtime"), 0);
    assert_int_equal(generate(fused, "", "offline"), 0);
    assert_int_equal(generate(pipe, "", "base"), 0);
    /* the load message counts the layers: 10 kohya modules per double block (q/k/v split) and 3
     * per single block (linear1 split in 4) reach 14 x 2 + 6 x 2 layers */
    size_t len;
    char *err = tu_read_file(tu_tmp_path("fuse.err"), &len);
    assert_non_null(err);
    if (!strstr(err, "kohya format): 40 layers, scale 0.8, fused")) fail_msg("load message: %s", err);
    free(err);
    int64_t n1, n2, n3, n4;
    float *fz = final_latents(tu_tmp_path("fuse.safetensors"), &n1), *rt = final_latents(tu_tmp_path("runtime.safetensors"), &n2);
    float *off = final_latents(tu_tmp_path("offline.safetensors"), &n3), *base = final_latents(tu_tmp_path("base.safetensors"), &n4);
    assert_true(n1 == n2 && n1 == n3 && n1 == n4);
    const double d_fuse = tu_max_abs_diff(fz, off, (size_t)n1, NULL), d_rt = tu_max_abs_diff(rt, off, (size_t)n1, NULL);
    const double d_base = tu_max_abs_diff(base, off, (size_t)n1, NULL);
    fprintf(stderr, "  latents vs offline-fused folder: fuse %.3g, run time %.3g (base model %.3g)\n", d_fuse, d_rt, d_base);
    assert_true(d_fuse < CLI_ATOL);
    assert_true(d_rt < CLI_ATOL);
    assert_true(d_base > 100 * CLI_ATOL); /* the adapter matters */
    free(fz);
    free(rt);
    free(off);
    free(base);
}

static void test_cli_bad_lora(void **st) {
    (void)st;
    const char *pipe = path_of("pipelines/flux1_dev_tiny");
    const char *bad = tu_tmp_path("nan_lora.safetensors");
    write_adapter(bad, QA, 4, 32, QB, 32, 4, NAN, NULL);
    char arg[1024];
    snprintf(arg, sizeof arg, "--lora '%s'", bad);
    assert_int_equal(tu_system("rm -f '%s/bad.png' '%s/bad.safetensors'", tu_tmpdir(), tu_tmpdir()), 0);
    assert_true(generate(pipe, arg, "bad") != 0);
    assert_int_equal(access(tu_tmp_path("bad.png"), F_OK), -1);
    assert_int_equal(access(tu_tmp_path("bad.safetensors"), F_OK), -1);
    size_t len;
    char *err = tu_read_file(tu_tmp_path("bad.err"), &len);
    if (!err || !strstr(err, "non-finite")) fail_msg("message: %s", err ? err : "(none)");
    free(err);
    snprintf(arg, sizeof arg, "--lora '%s:nan'", path_of("lora/pipe_flux1_dev_tiny_kohya.safetensors"));
    assert_true(generate(pipe, arg, "bad") != 0);
    assert_int_equal(access(tu_tmp_path("bad.png"), F_OK), -1);
    snprintf(arg, sizeof arg, "--lora '%s' --lora-mode sideways", path_of("lora/pipe_flux1_dev_tiny_kohya.safetensors"));
    assert_true(generate(pipe, arg, "bad") != 0);
    /* an adapter for another model: shapes fit no layer */
    snprintf(arg, sizeof arg, "--lora '%s'", path_of("lora/flux_kohya.safetensors"));
    assert_true(generate(pipe, arg, "bad") != 0);
    err = tu_read_file(tu_tmp_path("bad.err"), &len);
    if (!err || !strstr(err, "fits no layer")) fail_msg("message: %s", err ? err : "(none)");
    free(err);
    assert_int_equal(access(tu_tmp_path("bad.png"), F_OK), -1);
}

/* ---- unloading a fused adapter gives the loaded weights back bit for bit ---------------------- */
/* Every indexed layer's weight as stored (raw bytes in its dtype, blocks for a quantized layer). */
typedef struct raw_weights {
    int n;
    void **w;
    size_t *bytes;
    uint32_t *qtype;
} raw_weights;

static raw_weights raw_take(cdf_component *c) {
    cdf_layer_index *ix = cdf_component_layers(c);
    raw_weights r = {.n = cdf_layer_index_count(ix)};
    r.w = calloc((size_t)r.n + 1, sizeof *r.w);
    r.bytes = calloc((size_t)r.n + 1, sizeof *r.bytes);
    r.qtype = calloc((size_t)r.n + 1, sizeof *r.qtype);
    for (int i = 0; i < r.n; i++) {
        cdf_linear_layer *l = cdf_layer_index_at(ix, i, NULL);
        r.bytes[i] = (size_t)cdf_tensor_numel(l->w) * cdf_dtype_size(cdf_tensor_dtype(l->w));
        r.w[i] = malloc(r.bytes[i]);
        r.qtype[i] = l->qtype;
        assert_int_equal(cdf_tensor_read(l->w, cdf_tensor_dtype(l->w), r.w[i], r.bytes[i]), CDF_OK);
    }
    return r;
}

static void raw_free(raw_weights *r) {
    for (int i = 0; i < r->n; i++) free(r->w[i]);
    free(r->w), free(r->bytes), free(r->qtype);
}

/* layers whose stored weight differs */
static int raw_diff(const raw_weights *a, const raw_weights *b) {
    assert_int_equal(a->n, b->n);
    int d = 0;
    for (int i = 0; i < a->n; i++)
        d += a->qtype[i] != b->qtype[i] || a->bytes[i] != b->bytes[i] || memcmp(a->w[i], b->w[i], a->bytes[i]) != 0;
    return d;
}

/* A GGUF whose linear layers keep Q8_0 blocks: fusing decodes the touched layers; the unload reads
 * their blocks again (not W + d - d in the decoded dtype, which would leave them decoded and one
 * rounding off) */
static void test_unfuse_restores_quantized_blocks(void **st) {
    (void)st;
    cdf_load_options o = cdf_load_options_default();
    o.device = tu_cpu();
    o.weight_dtype = CDF_F32;
    o.weights_file = path_of("formats/flux_single/flux_bfl_q8.gguf");
    cdf_component *c = NULL;
    if (cdf_component_load(path_of("pipelines/flux1_dev_tiny/transformer"), &o, &c) != CDF_OK) fail_msg("%s", cdf_last_error());
    raw_weights before = raw_take(c);
    int quantized = 0;
    for (int i = 0; i < before.n; i++) quantized += before.qtype[i] != 0;
    assert_true(quantized > 0);
    assert_int_equal(load_lora(c, "lora/pipe_flux1_dev_tiny_kohya.safetensors", 0, 0.8f, CDF_LORA_FUSE, false, NULL), CDF_OK);
    raw_weights fused = raw_take(c);
    const int changed = raw_diff(&before, &fused);
    int decoded = 0;
    for (int i = 0; i < fused.n; i++) decoded += before.qtype[i] != 0 && fused.qtype[i] == 0;
    print_message("  %d of %d layers quantized, %d changed by the fuse (%d decoded)\n", quantized, before.n, changed, decoded);
    assert_true(changed > 0 && decoded > 0);
    assert_int_equal(cdf_component_lora_unfuse(c), CDF_OK);
    raw_weights back = raw_take(c);
    assert_int_equal(raw_diff(&before, &back), 0);
    raw_free(&before), raw_free(&fused), raw_free(&back);
    cdf_component_free(c);
}

/* The model's files are gone by the unload: the deltas are subtracted instead (a warning says
 * so), the weights within one rounding of the originals and the output the base's again */
static void test_unfuse_without_files_subtracts(void **st) {
    (void)st;
    char dir[1100];
    snprintf(dir, sizeof dir, "%s/sd3_copy", tu_tmpdir());
    assert_int_equal(tu_system("mkdir -p '%s' && cp '%s'/* '%s'/", dir, path_of("golden/sd3/transformer"), dir), 0);
    cdf_load_options o = cdf_load_options_default();
    o.device = tu_cpu();
    o.weight_dtype = CDF_F32;
    cdf_component *c = NULL;
    if (cdf_component_load(dir, &o, &c) != CDF_OK) fail_msg("%s", cdf_last_error());
    raw_weights before = raw_take(c);
    assert_int_equal(load_lora(c, "lora/sd3_peft.safetensors", 0, 0.7f, CDF_LORA_FUSE, false, NULL), CDF_OK);
    raw_weights fused = raw_take(c);
    assert_int_equal(tu_system("rm -f '%s'/*.safetensors", dir), 0);
    assert_int_equal(cdf_component_lora_unfuse(c), CDF_OK);
    raw_weights back = raw_take(c);
    int64_t off = 0, beyond = 0;
    for (int i = 0; i < before.n; i++)
        for (size_t j = 0; j < before.bytes[i] / 4; j++) {
            const float a = ((float *)before.w[i])[j], b = ((float *)back.w[i])[j], f = ((float *)fused.w[i])[j];
            if (a == b) continue;
            off++;
            /* W' = W + d rounds at |W'|'s scale, W' - d at |W|'s: half an ulp of each */
            if (fabs((double)a - b) > ldexp(fabs(f) + fabs(a), -24)) beyond++;
        }
    print_message("  subtracted: %lld elements not bit-equal, %lld beyond a rounding\n", (long long)off, (long long)beyond);
    assert_true(off > 0); /* it did subtract (a re-read would be exact) */
    assert_int_equal(beyond, 0);
    assert_true(forward_diff(c, &SD3, "out.base") < SD3.atol);
    raw_free(&before), raw_free(&fused), raw_free(&back);
    cdf_component_free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_names),           cmocka_unit_test(test_flux_peft_runtime),
        cmocka_unit_test(test_flux_peft_fused),     cmocka_unit_test(test_flux_kohya_runtime),
        cmocka_unit_test(test_flux_kohya_fused),    cmocka_unit_test(test_sd3_runtime),
        cmocka_unit_test(test_sd3_fused),           cmocka_unit_test(test_flux_multi_peft),
        cmocka_unit_test(test_flux_multi_kohya),    cmocka_unit_test(test_flux_xlabs_runtime),
        cmocka_unit_test(test_flux_xlabs_fused),    cmocka_unit_test(test_flux_multi_xlabs),
        cmocka_unit_test(test_flux2_dev_runtime),   cmocka_unit_test(test_flux2_dev_fused),
        cmocka_unit_test(test_flux2_klein_runtime), cmocka_unit_test(test_flux2_klein_fused),
        cmocka_unit_test(test_flux2_dev_kohya_runtime), cmocka_unit_test(test_flux2_dev_kohya_fused),
        cmocka_unit_test(test_flux2_dev_aitk_runtime), cmocka_unit_test(test_flux2_dev_aitk_fused),
        cmocka_unit_test(test_flux2_dev_peftbm_runtime), cmocka_unit_test(test_flux2_dev_peftbm_fused),
        cmocka_unit_test(test_flux2_names_refused),
        cmocka_unit_test(test_compile_whole_scale),
        cmocka_unit_test(test_compile_blocks_scale), cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_cli_fuse_matches_offline_fused_folder), cmocka_unit_test(test_cli_bad_lora),
        cmocka_unit_test(test_unfuse_restores_quantized_blocks), cmocka_unit_test(test_unfuse_without_files_subtracts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
