/* LoRA on whole pipelines (issue #20): text-encoder adapters and unloading fused adapters,
 * against diffusers + PEFT. tests/data/lora/pipe_{flux,sd3}_te.safetensors hold what diffusers'
 * FluxPipeline (tests/data/pipelines/flux1_dev_tiny) and StableDiffusion3Pipeline (sd35m_tiny)
 * compute after pipe.load_lora_weights of the adapters next to them (made by
 * tools/make-lora-golden/make_lora_golden.py, text_encoder_pipeline_cases; the calls are in
 * reference.json, "text_encoder_pipelines"):
 *   pipe_flux_te_peft   diffusers/PEFT "text_encoder.text_model.encoder.layers.*" with network
 *                       alphas, plus one transformer module (a mixed file)
 *   pipe_flux_te_kohya  kohya "lora_te1_text_model_encoder_layers_*" (alphas, some missing)
 *   pipe_sd3_te_peft    "text_encoder.*" (CLIP-L) and "text_encoder_2.*" (CLIP-G)
 * Which encoders take adapters is diffusers' choice: FLUX.1 the CLIP-L only (its loader has no T5
 * LoRA), SD3 both CLIPs (no T5), FLUX.2 none.
 *
 * Each adapter: run time at scale 1, then 0.7 (set_adapters), then unloaded (the base again);
 * fused at 0.7 (pipe.fuse_lora over every loadable component), then unloaded (diffusers:
 * unfuse_lora + unload_lora_weights, which subtracts the merged delta). Compared: the prompt
 * embeddings (test_pipeline's 2e-5) and the latents after the loop (test_pipeline's 5e-4); the
 * adapters move the pooled embeddings by 0.47-2 and the latents by 0.47-13 (reference.json), so
 * an adapter missed on any encoder cannot pass. Runs in every execution mode like the rest of
 * the suite (the pipeline loads compiled when CDIFFUSERS_COMPILE is set). */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdiffusers/cdiffusers.h"
#include "nn/nn.h"

#define EMB_TOL 2e-5
#define LAT_TOL 5e-4

typedef struct pcase {
    const char *name;    /* reference.json text_encoder_pipelines.<name> */
    const char *adapter; /* lora/<adapter>.safetensors, keys "<adapter>.<mode>.<tensor>" */
    int layers;          /* linear layers the adapter changes */
} pcase;

static const char *const k_keys[] = {"prompt_embeds", "pooled_prompt_embeds", "negative_prompt_embeds",
                                     "negative_pooled_prompt_embeds", "latents_final"};

typedef struct ctx {
    cJSON *js;           /* reference.json */
    const cJSON *call;   /* its call for this pipeline */
    cdf_tensor_map ref;  /* pipe_<name>_te.safetensors */
    cdf_pipeline *pipe;
} ctx;

static void ctx_open(ctx *c, const pcase *pc) {
    char path[1024];
    snprintf(path, sizeof path, "%s/lora/reference.json", CDF_TEST_DATA);
    size_t len;
    char *txt = tu_read_file(path, &len);
    assert_non_null(txt);
    c->js = cJSON_Parse(txt);
    free(txt);
    const cJSON *p = cJSON_GetObjectItem(cJSON_GetObjectItem(c->js, "text_encoder_pipelines"), pc->name);
    if (!p) fail_msg("reference.json has no text_encoder_pipelines.%s (regenerate tests/data/lora)", pc->name);
    c->call = cJSON_GetObjectItem(p, "call");
    char rel[256];
    snprintf(rel, sizeof rel, "lora/pipe_%s_te.safetensors", pc->name);
    cdf_tensor_map_init(&c->ref);
    tu_load_map(&c->ref, rel);
    /* the references ran in f32: the exact path, not the bf16 default */
    cdf_pipeline_load_params lp = cdf_pipeline_load_params_default();
    lp.weight_dtype = CDF_F32;
    snprintf(path, sizeof path, "%s/../../%s", CDF_TEST_DATA, cJSON_GetObjectItem(p, "folder")->valuestring);
    if (cdf_pipeline_load(path, &lp, &c->pipe) != CDF_OK) fail_msg("load %s: %s", path, cdf_last_error());
}

static void ctx_close(ctx *c) {
    cdf_pipeline_free(c->pipe);
    cdf_tensor_map_clear(&c->ref);
    cJSON_Delete(c->js);
}

/* Generate with the reference call and compare every recorded tensor of `prefix`. */
static void check(ctx *c, const char *prefix) {
    cdf_generate_params gp = cdf_generate_params_default();
    gp.prompt = cJSON_GetObjectItem(c->call, "prompt")->valuestring;
    const cJSON *neg = cJSON_GetObjectItem(c->call, "negative_prompt");
    gp.negative_prompt = cJSON_IsString(neg) ? neg->valuestring : NULL;
    gp.height = cJSON_GetObjectItem(c->call, "height")->valueint;
    gp.width = cJSON_GetObjectItem(c->call, "width")->valueint;
    gp.num_inference_steps = cJSON_GetObjectItem(c->call, "num_inference_steps")->valueint;
    gp.guidance_scale = cJSON_GetObjectItem(c->call, "guidance_scale")->valuedouble;
    gp.max_sequence_length = cJSON_GetObjectItem(c->call, "max_sequence_length")->valueint;
    gp.seed = (uint64_t)cJSON_GetObjectItem(c->call, "seed")->valuedouble;
    cdf_tensor_map cap;
    cdf_tensor_map_init(&cap);
    gp.capture = (cdf_capture *)&cap;
    cdf_image img;
    if (cdf_pipeline_generate(c->pipe, &gp, &img) != CDF_OK) fail_msg("generate (%s): %s", prefix, cdf_last_error());
    int compared = 0;
    for (size_t i = 0; i < sizeof k_keys / sizeof *k_keys; i++) {
        char key[256];
        snprintf(key, sizeof key, "%s.%s", prefix, k_keys[i]);
        cdf_tensor *want = cdf_tensor_map_get(&c->ref, key);
        if (!want) continue; /* no negative prompt for FLUX */
        cdf_tensor *got = cdf_tensor_map_get(&cap, k_keys[i]);
        if (!got) fail_msg("%s: the pipeline captured no %s", prefix, k_keys[i]);
        assert_int_equal(cdf_tensor_numel(got), cdf_tensor_numel(want)); /* FLUX's latents are packed in both */
        float *g = cdf_tensor_read_f32(got), *w = cdf_tensor_read_f32(want);
        assert_non_null(g);
        assert_non_null(w);
        const double d = tu_max_abs_diff(g, w, (size_t)cdf_tensor_numel(want), NULL);
        free(g);
        free(w);
        const double tol = strcmp(k_keys[i], "latents_final") == 0 ? LAT_TOL : EMB_TOL;
        fprintf(stderr, "  %-32s %-30s max abs diff %.3g (tol %.0e)\n", prefix, k_keys[i], d, tol);
        if (!(d <= tol)) fail_msg("%s %s: max abs diff %g > %g", prefix, k_keys[i], d, tol);
        compared++;
    }
    assert_true(compared >= 3);
    cdf_image_free(&img);
    cdf_tensor_map_clear(&cap);
}

static void load(ctx *c, const pcase *pc, cdf_lora_mode mode, float scale) {
    char path[1024];
    snprintf(path, sizeof path, "%s/lora/%s.safetensors", CDF_TEST_DATA, pc->adapter);
    cdf_lora_params lp = cdf_lora_params_default();
    lp.mode = mode;
    lp.scale = scale;
    cdf_lora_info info;
    if (cdf_pipeline_load_lora(c->pipe, path, &lp, &info) != CDF_OK) fail_msg("load %s: %s", path, cdf_last_error());
    assert_int_equal(info.layers, pc->layers);
    assert_int_equal(info.unused_keys, 0);
}

static void fused_case(const pcase *pc) {
    ctx c;
    ctx_open(&c, pc);
    char k[128];
    load(&c, pc, CDF_LORA_FUSE, 0.7f);
    snprintf(k, sizeof k, "%s.fused_s07", pc->adapter);
    check(&c, k);
    /* a fused scale is fixed */
    assert_int_equal(cdf_pipeline_set_lora_scale(c.pipe, 0, 0.5f), CDF_ERR_UNSUPPORTED);
    assert_int_equal(cdf_pipeline_unload_lora(c.pipe), CDF_OK);
    assert_int_equal(cdf_pipeline_lora_count(c.pipe), 0);
    snprintf(k, sizeof k, "%s.unloaded", pc->adapter);
    check(&c, k);
    check(&c, "base");
    ctx_close(&c);
}

/* Load (fused at 0.7 or run time at 1), generate twice, (run time) scale 0.7, unload. With
 * offload the adapters survive the models' release and re-materialisation (they are logged on
 * the component and re-applied each time; the A/B matrices stay resident): same references,
 * same tolerances. `late`: offload switched on after the adapter is loaded. */
static void offload_case(const pcase *pc, cdf_offload_mode om, cdf_lora_mode mode, bool late) {
    ctx c;
    ctx_open(&c, pc);
    char k[128];
    if (om == CDF_OFFLOAD_NONE) check(&c, "base");
    if (!late) assert_int_equal(cdf_pipeline_set_offload(c.pipe, om), CDF_OK);
    const float scale = mode == CDF_LORA_FUSE ? 0.7f : 1.0f;
    load(&c, pc, mode, scale);
    if (late) assert_int_equal(cdf_pipeline_set_offload(c.pipe, om), CDF_OK);
    snprintf(k, sizeof k, "%s.%s", pc->adapter, mode == CDF_LORA_FUSE ? "fused_s07" : "runtime_s1");
    check(&c, k);
    check(&c, k); /* the models were released after the first run and come back with the adapter */
    cdf_pipeline_memory_stats ms;
    cdf_pipeline_last_memory_stats(c.pipe, &ms);
    if (om != CDF_OFFLOAD_NONE) assert_true(ms.materialisations >= 2); /* text encoder(s) and transformer re-read */
    if (mode == CDF_LORA_RUNTIME) {
        assert_int_equal(cdf_pipeline_set_lora_scale(c.pipe, 0, 0.7f), CDF_OK);
        snprintf(k, sizeof k, "%s.runtime_s07", pc->adapter);
        check(&c, k);
    }
    assert_int_equal(cdf_pipeline_unload_lora(c.pipe), CDF_OK);
    check(&c, "base");
    ctx_close(&c);
}

/* 3 CLIP layers x 6 linears (+ the transformer's to_q in the PEFT file) */
static const pcase FLUX_PEFT = {"flux", "pipe_flux_te_peft", 19};
static const pcase FLUX_KOHYA = {"flux", "pipe_flux_te_kohya", 18};
static const pcase SD3_PEFT = {"sd3", "pipe_sd3_te_peft", 36};

static void runtime_case(const pcase *pc) { offload_case(pc, CDF_OFFLOAD_NONE, CDF_LORA_RUNTIME, false); }
static void test_flux_te_peft_runtime(void **st) { (void)st, runtime_case(&FLUX_PEFT); }
static void test_flux_te_peft_fused(void **st) { (void)st, fused_case(&FLUX_PEFT); }
static void test_flux_te_kohya_runtime(void **st) { (void)st, runtime_case(&FLUX_KOHYA); }
static void test_flux_te_kohya_fused(void **st) { (void)st, fused_case(&FLUX_KOHYA); }
static void test_sd3_te_runtime(void **st) { (void)st, runtime_case(&SD3_PEFT); }
static void test_sd3_te_fused(void **st) { (void)st, fused_case(&SD3_PEFT); }
static void test_model_offload_runtime(void **st) { (void)st, offload_case(&FLUX_PEFT, CDF_OFFLOAD_MODEL, CDF_LORA_RUNTIME, false); }
static void test_model_offload_fused(void **st) { (void)st, offload_case(&SD3_PEFT, CDF_OFFLOAD_MODEL, CDF_LORA_FUSE, false); }
static void test_model_offload_after_load(void **st) { (void)st, offload_case(&FLUX_KOHYA, CDF_OFFLOAD_MODEL, CDF_LORA_FUSE, true); }
/* the FLUX PEFT file holds transformer_blocks.0.attn.to_q: a block layer with host-side weights */
static void test_sequential_offload_runtime(void **st) {
    (void)st, offload_case(&FLUX_PEFT, CDF_OFFLOAD_SEQUENTIAL, CDF_LORA_RUNTIME, false);
}
static void test_sequential_offload_runtime_after_load(void **st) {
    (void)st, offload_case(&SD3_PEFT, CDF_OFFLOAD_SEQUENTIAL, CDF_LORA_RUNTIME, true);
}

/* Fusing into host-side block weights is refused, before anything changes. */
static void test_sequential_offload_fuse_refused(void **st) {
    (void)st;
    ctx c;
    ctx_open(&c, &FLUX_PEFT);
    char path[1024];
    snprintf(path, sizeof path, "%s/lora/%s.safetensors", CDF_TEST_DATA, FLUX_PEFT.adapter);
    cdf_lora_params lp = cdf_lora_params_default();
    lp.mode = CDF_LORA_FUSE;
    assert_int_equal(cdf_pipeline_set_offload(c.pipe, CDF_OFFLOAD_SEQUENTIAL), CDF_OK);
    assert_int_equal(cdf_pipeline_load_lora(c.pipe, path, &lp, NULL), CDF_ERR_UNSUPPORTED);
    assert_non_null(strstr(cdf_last_error(), "run-time mode"));
    assert_int_equal(cdf_pipeline_lora_count(c.pipe), 0);
    /* fused first, then sequential offload: refused too, the adapter still applies */
    assert_int_equal(cdf_pipeline_set_offload(c.pipe, CDF_OFFLOAD_NONE), CDF_OK);
    lp.scale = 0.7f;
    assert_int_equal(cdf_pipeline_load_lora(c.pipe, path, &lp, NULL), CDF_OK);
    assert_int_equal(cdf_pipeline_set_offload(c.pipe, CDF_OFFLOAD_SEQUENTIAL), CDF_ERR_UNSUPPORTED);
    assert_non_null(strstr(cdf_last_error(), "fused"));
    check(&c, "pipe_flux_te_peft.fused_s07");
    ctx_close(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flux_te_peft_runtime), cmocka_unit_test(test_flux_te_peft_fused),
        cmocka_unit_test(test_flux_te_kohya_runtime), cmocka_unit_test(test_flux_te_kohya_fused),
        cmocka_unit_test(test_sd3_te_runtime),        cmocka_unit_test(test_sd3_te_fused),
        cmocka_unit_test(test_model_offload_runtime), cmocka_unit_test(test_model_offload_fused),
        cmocka_unit_test(test_model_offload_after_load), cmocka_unit_test(test_sequential_offload_runtime),
        cmocka_unit_test(test_sequential_offload_runtime_after_load), cmocka_unit_test(test_sequential_offload_fuse_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
