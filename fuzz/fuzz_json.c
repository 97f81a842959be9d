/* Fuzz target: JSON configuration files. The same input is used four ways:
 *   1. cdf_json_parse + every typed getter on every key (three levels deep) + cdf_json_check_depth;
 *   2. as scheduler/scheduler_config.json: cdf_scheduler_config_from_json, then a scheduler is
 *      built from what it accepts and run through set_timesteps and every step (Flux sigmas and
 *      the SD3 default schedule);
 *   3. as model_index.json of a pipeline folder (cdf_pipeline_load; the folder has a valid
 *      scheduler and no components, so loading stops at the first component);
 *   4. as a component's config.json next to the tiny golden weights of the class it names
 *      (cdf_component_load): the model config parsers and the config-vs-checkpoint checks.
 * Device memory is capped at 256 MiB so that a config asking for huge buffers ends in a clean
 * out-of-memory error rather than exhausting the machine. */
#include <cjson/cJSON.h>

#include "fuzz_common.h"
#include "models/component.h"
#include "io/json.h"

static char g_sched[512], g_pipe[512], g_comp[512];

static void write_seeds(const char *dir) {
    static const char *files[] = {
        "pipelines/flux1_schnell_tiny/model_index.json",
        "pipelines/flux1_schnell_tiny/scheduler/scheduler_config.json",
        "pipelines/flux1_schnell_tiny/transformer/config.json",
        "pipelines/flux1_schnell_tiny/vae/config.json",
        "pipelines/flux1_schnell_tiny/text_encoder/config.json",
        "pipelines/flux1_schnell_tiny/text_encoder_2/config.json",
        "pipelines/flux1_dev_tiny/model_index.json",
        "pipelines/flux1_dev_tiny/scheduler/scheduler_config.json",
        "pipelines/flux1_dev_tiny/transformer/config.json",
        "pipelines/sd35m_tiny/model_index.json",
        "pipelines/sd35m_tiny/scheduler/scheduler_config.json",
        "pipelines/sd35m_tiny/transformer/config.json",
        "pipelines/sd35m_tiny/text_encoder/config.json",
        "pipelines/sd35m_tiny/text_encoder_2/config.json",
        "golden/vae_kl16/vae/config.json",
        "golden/text_models/t5_tiny/config.json",
        "golden/text_models/clip_g_tiny/config.json",
        "tokenizers/clip_l/tokenizer_config.json",
        "tokenizers/clip_l/special_tokens_map.json",
        "io/vae_kl16_io.json",
    };
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) fz_seed_file(dir, -1, files[i], 1 << 16);
    static const char *tiny[] = {"{}", "[]", "{\"a\": [1, 2.5, -3], \"b\": {\"c\": null, \"d\": true, \"e\": \"x\"}}",
                                 "{\"n\": 9007199254740993, \"m\": -1e308, \"o\": 1e999}",
                                 /* findings 13 and 14 (docs/ROBUSTNESS.md): saturated first sigmas, shift 0 */
                                 "{\"base_shift\": 15, \"use_dynamic_shifting\": true}", "{\"shift\": 0.0}"};
    for (size_t i = 0; i < sizeof tiny / sizeof *tiny; i++) fz_seed(dir, -1, tiny[i], strlen(tiny[i]));
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fz_maybe_write_seeds(write_seeds);
    fz_load_backend();
    cdf_device *dev = cdf_device_get("cpu");
    FZ_CHECK(dev);
    cdf_device_set_memory_limit(dev, 256ull << 20);
    cdf_device_set_threads(dev, 1);
    snprintf(g_sched, sizeof g_sched, "%s", fz_join(fz_tmp(), "sched"));
    snprintf(g_pipe, sizeof g_pipe, "%s", fz_join(fz_tmp(), "pipe"));
    snprintf(g_comp, sizeof g_comp, "%s", fz_join(fz_tmp(), "comp"));
    fz_mkdir(g_sched);
    fz_mkdir(g_pipe);
    fz_mkdir(g_comp);
    fz_mkdir(fz_join(g_pipe, "scheduler"));
    size_t n = 0;
    uint8_t *s = fz_read(fz_join(CDF_TEST_DATA, "pipelines/flux1_schnell_tiny/scheduler/scheduler_config.json"), &n);
    FZ_CHECK(s);
    fz_write(fz_join(g_pipe, "scheduler/scheduler_config.json"), s, n);
    free(s);
    return 0;
}

/* ---- 1. getters ---- */
static void probe_object(const cJSON *o, int depth) {
    if (!cJSON_IsObject(o) || depth > 3) return;
    for (const cJSON *e = o->child; e; e = e->next) {
        const char *k = e->string;
        FZ_CHECK(k);
        bool first = cJSON_GetObjectItemCaseSensitive(o, k) == e; /* duplicate keys: getters see the first */
        int64_t i = 0;
        double d = 0;
        bool b = false;
        const char *s = NULL;
        int64_t ia[8];
        double da[8];
        int n = -1;
        cdf_status st = FZ_TRY(cdf_json_get_int(o, k, 7, &i));
        if (st != CDF_OK) FZ_CHECK_MESSAGE();
        else if (first && cJSON_IsNumber(e)) FZ_CHECK((double)i == e->valuedouble);
        else if (first && cJSON_IsNull(e)) FZ_CHECK(i == 7);
        if (FZ_TRY(cdf_json_get_double(o, k, 0.5, &d)) != CDF_OK) FZ_CHECK_MESSAGE();
        if (FZ_TRY(cdf_json_get_bool(o, k, true, &b)) != CDF_OK) FZ_CHECK_MESSAGE();
        st = FZ_TRY(cdf_json_get_string(o, k, NULL, &s));
        if (st != CDF_OK) FZ_CHECK_MESSAGE();
        else if (first && cJSON_IsString(e)) FZ_CHECK(s == e->valuestring);
        if (FZ_TRY(cdf_json_get_int_array(o, k, ia, 8, &n)) != CDF_OK) FZ_CHECK_MESSAGE();
        else FZ_CHECK(n >= 0 && n <= 8);
        if (FZ_TRY(cdf_json_get_double_array(o, k, da, 8, &n)) != CDF_OK) FZ_CHECK_MESSAGE();
        else FZ_CHECK(n >= 0 && n <= 8);
        if (first) FZ_CHECK(cdf_json_has(o, k) == !cJSON_IsNull(e));
        probe_object(e, depth + 1);
        if (cJSON_IsArray(e))
            for (const cJSON *x = e->child; x; x = x->next) probe_object(x, depth + 1);
    }
}

/* ---- 2. scheduler ---- */
static void run_scheduler(const uint8_t *data, size_t size) {
    const char *path = fz_join(g_sched, "scheduler_config.json");
    fz_write(path, data, size);
    cdf_scheduler_config cfg;
    if (FZ_TRY(cdf_scheduler_config_from_json(path, &cfg)) != CDF_OK) {
        FZ_CHECK_MESSAGE();
        return;
    }
    if (FZ_TRY(cdf_scheduler_config_validate(&cfg)) != CDF_OK) {
        FZ_CHECK_MESSAGE();
        return;
    }
    cdf_scheduler *s = FZ_TRY(cdf_scheduler_new(&cfg));
    if (!s) {
        FZ_CHECK_MESSAGE();
        return;
    }
    static const int steps[] = {1, 4, 28};
    float x[4] = {0.5f, -1.0f, 2.0f, 0.0f}, v[4] = {1.0f, 0.25f, -0.5f, 3.0f};
    for (int k = 0; k < 3; k++) {
        int n = steps[k];
        float sig[28];
        FZ_CHECK(cdf_scheduler_flux_sigmas(n, sig) == CDF_OK);
        double mu = cdf_scheduler_calculate_shift(256, cfg.base_image_seq_len, cfg.max_image_seq_len, cfg.base_shift, cfg.max_shift);
        for (int flux = 0; flux < 2; flux++) {
            cdf_status st = FZ_TRY(cdf_scheduler_set_timesteps(s, n, flux ? sig : NULL, flux ? n : 0, cfg.use_dynamic_shifting ? &mu : NULL));
            if (st != CDF_OK) {
                FZ_CHECK_MESSAGE();
                continue;
            }
            FZ_CHECK(cdf_scheduler_num_timesteps(s) == n && cdf_scheduler_num_sigmas(s) == n + 1);
            if (flux) FZ_CHECK(cdf_scheduler_set_begin_index(s, 0) == CDF_OK);
            /* Without a begin index the first step looks its timestep up, and diffusers takes the
             * second match when timesteps[0] repeats (a huge shift saturates the first sigmas at
             * 1): the loop then starts at that index and has fewer steps to run. */
            FZ_CHECK(cdf_scheduler_step(s, v, x, x, 4) == CDF_OK);
            const int start = (int)cdf_scheduler_step_index(s) - 1;
            const float *ts = cdf_scheduler_timesteps(s);
            FZ_CHECK(start == 0 || (!flux && start > 0 && start < n && ts[start] == ts[0]));
            for (int i = start + 1; i < n; i++) FZ_CHECK(cdf_scheduler_step(s, v, x, x, 4) == CDF_OK);
            FZ_CHECK(cdf_scheduler_step(s, v, x, x, 4) != CDF_OK); /* past the last sigma */
        }
    }
    cdf_scheduler_free(s);
}

/* ---- 3. model_index.json ---- */
static void run_model_index(const uint8_t *data, size_t size) {
    fz_write(fz_join(g_pipe, "model_index.json"), data, size);
    cdf_pipeline *p = NULL;
    if (FZ_TRY(cdf_pipeline_load(g_pipe, NULL, &p)) != CDF_OK) {
        FZ_CHECK(p == NULL);
        FZ_CHECK_MESSAGE();
        return;
    }
    cdf_pipeline_free(p);
}

/* ---- 4. component config.json ---- */
static const struct {
    const char *cls, *weights;
} k_weights[] = {
    {"FluxTransformer2DModel", "pipelines/flux1_schnell_tiny/transformer/diffusion_pytorch_model.safetensors"},
    {"FluxTransformer2DModel+guidance", "pipelines/flux1_dev_tiny/transformer/diffusion_pytorch_model.safetensors"},
    {"SD3Transformer2DModel", "pipelines/sd35m_tiny/transformer/diffusion_pytorch_model.safetensors"},
    {"AutoencoderKL", "pipelines/flux1_schnell_tiny/vae/diffusion_pytorch_model.safetensors"},
    {"CLIPTextModel", "pipelines/flux1_schnell_tiny/text_encoder/model.safetensors"},
    {"CLIPTextModelWithProjection", "pipelines/sd35m_tiny/text_encoder_2/model.safetensors"},
    {"T5EncoderModel", "pipelines/flux1_schnell_tiny/text_encoder_2/model.safetensors"},
};

static void run_component(const cJSON *root, const uint8_t *data, size_t size) {
    fz_write(fz_join(g_comp, "config.json"), data, size);
    const char *link = fz_join(g_comp, "model.safetensors");
    unlink(link);
    const char *cls = root ? cdf_config_class_name(root) : NULL;
    if (cls && strcmp(cls, "FluxTransformer2DModel") == 0 && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "guidance_embeds")))
        cls = "FluxTransformer2DModel+guidance"; /* FLUX.1-dev's tiny weights have the guidance embedder */
    for (size_t i = 0; cls && i < sizeof k_weights / sizeof *k_weights; i++)
        if (strcmp(cls, k_weights[i].cls) == 0 && symlink(fz_join(CDF_TEST_DATA, k_weights[i].weights), link) != 0) abort();
    cdf_load_options opt = cdf_load_options_default();
    opt.device = cdf_device_get("cpu");
    cdf_component *c = NULL;
    if (FZ_TRY(cdf_component_load(g_comp, &opt, &c)) != CDF_OK) {
        FZ_CHECK(c == NULL);
        FZ_CHECK_MESSAGE();
        return;
    }
    cdf_component_free(c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    cJSON *root = (cJSON *)1;
    if (FZ_TRY(cdf_json_parse((const char *)data, size, "fuzz input", &root)) == CDF_OK) {
        FZ_CHECK(root);
        probe_object(root, 0);
        if (cJSON_IsArray(root))
            for (const cJSON *x = root->child; x; x = x->next) probe_object(x, 1);
    } else {
        FZ_CHECK(root == NULL);
        FZ_CHECK_MESSAGE();
    }
    if (FZ_TRY(cdf_json_check_depth((const char *)data, size, 8, "fuzz input")) != CDF_OK) FZ_CHECK_MESSAGE();
    run_scheduler(data, size);
    run_model_index(data, size);
    run_component(root, data, size);
    cJSON_Delete(root);
    cdf_clear_error();
    return 0;
}
