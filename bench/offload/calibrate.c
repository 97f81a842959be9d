/* Calibration of the memory planner's activation formulas (src/pipelines/planner.c) against
 * measurements, one model at a time.
 *
 * For each model of a random pipeline (tools/make-random-pipeline) and each input size, the
 * measured activation need is: the smallest device budget under which one forward succeeds,
 * minus the bytes resident before it (weights + inputs). The budget is found by bisection;
 * under a budget the allocator drains the device queue before failing, so this is the memory
 * the forward really needs (the peak without a budget is larger and timing-dependent: the host
 * runs up to a queue's worth of ops ahead and their outputs are allocated early).
 *
 *   calibrate PIPELINE_DIR [--dtype f32|bf16] [--sizes 64,128,256] [--seq 77,256] [--batch 2]
 *   calibrate PIPELINE_DIR --pipeline [same options; --batch 2 = SD3 with CFG]
 *             [--offload none,model,sequential (default none,model)] [--phase 0|1|2 (default all)]
 *             [--why: print the out-of-memory error just below each phase's need: where the peak is]
 * The execution mode is the environment's (CDIFFUSERS_COMPILE=blocks, CDIFFUSERS_DEFER_AND_FUSE=1).
 *
 * Prints one row per (model, size): measured, planned, and their ratio. With --pipeline, whole
 * generate runs (2 steps), one row per phase and offload mode: the phase's need is found by
 * bisecting a budget applied to that phase only (pipeline_impl.h's phase_limit). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdiffusers/cdiffusers.h"
#include "models/component.h"
#include "pipelines/pipeline_impl.h"
#include "pipelines/planner.h"

static cdf_device *g_dev;

/* One forward under `limit` bytes; true if it succeeded. */
static bool run_under(cdf_component *c, const char *method, const cdf_tensor_map *in, uint64_t limit) {
    cdf_tensor_map out;
    cdf_tensor_map_init(&out);
    cdf_device_set_memory_limit(g_dev, limit);
    cdf_status s = cdf_component_run(c, method, in, &out);
    cdf_status q = cdf_device_synchronize(g_dev);
    cdf_tensor_map_clear(&out);
    cdf_device_set_memory_limit(g_dev, 0);
    (void)cdf_device_synchronize(g_dev);
    return s == CDF_OK && q == CDF_OK;
}

/* Smallest budget (to 0.1%) under which the forward succeeds, minus what was resident before. */
static uint64_t measure(cdf_component *c, const char *method, const cdf_tensor_map *in, uint64_t *unlimited_peak) {
    cdf_memory_stats st;
    (void)cdf_device_synchronize(g_dev);
    cdf_device_memory_stats(g_dev, &st);
    const uint64_t base = st.current_bytes;
    cdf_device_reset_peak(g_dev);
    if (!run_under(c, method, in, 0)) {
        fprintf(stderr, "calibrate: forward failed without a budget: %s\n", cdf_last_error());
        exit(1);
    }
    cdf_device_memory_stats(g_dev, &st);
    *unlimited_peak = st.peak_bytes - base;
    uint64_t lo = base, hi = st.peak_bytes;
    while (hi - lo > (hi - base) / 1000 + 64) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (run_under(c, method, in, mid)) hi = mid;
        else lo = mid;
    }
    return hi - base;
}

static cdf_tensor *ids_tensor(int64_t L, int64_t vocab) {
    int64_t *ids = malloc((size_t)L * sizeof *ids);
    for (int64_t i = 0; i < L; i++) ids[i] = (i * 7919 + 3) % vocab;
    cdf_tensor *t = cdf_tensor_from_host(g_dev, CDF_I64, 2, (int64_t[]){1, L}, ids, CDF_I64);
    free(ids);
    return t;
}

static cdf_tensor *rand_tensor(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    float *x = malloc((size_t)n * sizeof *x);
    uint64_t s = 88172645463325252ull;
    for (int64_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        x[i] = (float)((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
    cdf_tensor *t = cdf_tensor_from_host(g_dev, CDF_F32, ndim, shape, x, CDF_F32);
    free(x);
    return t;
}

/* The planner's activation peak for the component in sub (measured over virtual buffers). */
static uint64_t planned_act(const char *sub, cdf_dtype wdt, const cdf_plan_shape *s) {
    uint64_t fam[2] = {0, 0};
    if (cdf_plan_measure_activation_bytes(sub, wdt, s, fam) != CDF_OK) fprintf(stderr, "calibrate: %s\n", cdf_last_error());
    return fam[0] > fam[1] ? fam[0] : fam[1];
}

static void row(const char *model, const char *shape, uint64_t weights, uint64_t measured, uint64_t unlimited, uint64_t planned) {
    printf("| %-28s | %-26s | %10.3f | %10.3f | %10.3f | %10.3f | %6.3f |\n", model, shape, weights / 1048576.0,
           measured / 1048576.0, planned / 1048576.0, unlimited / 1048576.0, measured ? (double)planned / measured : 0.0);
    fflush(stdout);
}

static int parse_list(const char *s, int *out, int max) {
    int n = 0;
    while (*s && n < max) {
        out[n++] = atoi(s);
        const char *c = strchr(s, ',');
        if (!c) break;
        s = c + 1;
    }
    return n;
}

/* One generate with phase `ph` capped at `limit` bytes (0: no cap anywhere). */
static bool generate_under(cdf_pipeline *p, const cdf_generate_params *gp, int ph, uint64_t limit, cdf_pipeline_memory_stats *ms) {
    p->phase_limit_active = limit != 0;
    memset(p->phase_limit, 0, sizeof p->phase_limit);
    if (limit) p->phase_limit[ph] = limit;
    cdf_image img;
    cdf_status s = cdf_pipeline_generate(p, gp, &img);
    p->phase_limit_active = false;
    if (s == CDF_OK) cdf_image_free(&img);
    if (ms) cdf_pipeline_last_memory_stats(p, ms);
    return s == CDF_OK;
}

/* Per phase: the smallest budget under which the phase runs (to 0.1%), the planner's peak, and
 * the unbudgeted measured peak. */
static int g_phase = -1;
static bool g_why; /* --why: print the out-of-memory error just below each need */
static const char *mode_name(cdf_offload_mode m) {
    return m == CDF_OFFLOAD_SEQUENTIAL ? "sequential" : m == CDF_OFFLOAD_MODEL ? "model" : "none";
}

static void measure_pipeline(const char *dir, cdf_dtype wdt, cdf_offload_mode mode, int size, int seq, float guidance) {
    cdf_pipeline_load_params lp = cdf_pipeline_load_params_default();
    lp.weight_dtype = wdt;
    lp.offload = mode;
    cdf_generate_params gp = cdf_generate_params_default();
    gp.prompt = "a photo of a cat";
    gp.height = gp.width = size;
    gp.num_inference_steps = 2;
    gp.max_sequence_length = seq;
    gp.guidance_scale = guidance;
    cdf_memory_plan plan;
    cdf_pipeline *p = NULL;
    /* the plan for the environment's execution (as `cdiffusers plan` picks it) */
    const char *env = getenv("CDIFFUSERS_COMPILE");
    const bool blocks = env && (strcmp(env, "blocks") == 0 || (*env && strcmp(env, "0") != 0 && mode == CDF_OFFLOAD_SEQUENTIAL));
    const cdf_plan_execution exec = blocks ? CDF_PLAN_REPEATED_BLOCKS : CDF_PLAN_EAGER;
    if (cdf_pipeline_plan_memory_exec(dir, &lp, &gp, exec, &plan) != CDF_OK || cdf_pipeline_load(dir, &lp, &p) != CDF_OK) {
        fprintf(stderr, "calibrate: %s\n", cdf_last_error());
        exit(1);
    }
    cdf_pipeline_memory_stats free_run;
    if (!generate_under(p, &gp, 0, 0, &free_run)) {
        fprintf(stderr, "calibrate: generate failed: %s\n", cdf_last_error());
        exit(1);
    }
    for (int ph = 0; ph < CDF_PHASE_COUNT; ph++) {
        if (g_phase >= 0 && ph != g_phase) continue;
        uint64_t lo = 0, hi = free_run.phase_peak_bytes[ph];
        while (hi - lo > hi / 1000 + 64) {
            uint64_t mid = lo + (hi - lo) / 2;
            if (generate_under(p, &gp, ph, mid, NULL)) hi = mid;
            else lo = mid;
        }
        printf("| %s | %s | %dpx seq %d%s | %s | %10.3f | %10.3f | %10.3f | %6.3f |\n", plan.pipeline_class,
               mode_name(mode), size, seq, plan.batch > 1 ? " CFG" : "",
               cdf_pipeline_phase_name((cdf_pipeline_phase)ph), hi / 1048576.0, plan.phase[ph].peak_bytes / 1048576.0,
               free_run.phase_peak_bytes[ph] / 1048576.0, (double)plan.phase[ph].peak_bytes / hi);
        fflush(stdout);
        if (g_why && lo > 0 && !generate_under(p, &gp, ph, lo, NULL)) /* where the need is: the failure just below it */
            fprintf(stderr, "calibrate: under %.3f MiB: %s\n", lo / 1048576.0, cdf_last_error());
    }
    cdf_pipeline_free(p);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: calibrate PIPELINE_DIR [--dtype f32|bf16] [--sizes 64,128] [--seq 77,256] [--batch 1|2]\n");
        return 2;
    }
    const char *dir = argv[1];
    cdf_dtype wdt = CDF_F32;
    int sizes[16] = {64, 128}, n_sizes = 2, seqs[16] = {77, 256}, n_seqs = 2, batch = 1, n_modes = 2;
    cdf_offload_mode modes[3] = {CDF_OFFLOAD_NONE, CDF_OFFLOAD_MODEL};
    for (int i = 2; i + 1 < argc; i++) {
        if (strcmp(argv[i], "--dtype") == 0) wdt = strcmp(argv[i + 1], "bf16") == 0 ? CDF_BF16 : CDF_F32;
        else if (strcmp(argv[i], "--sizes") == 0) n_sizes = parse_list(argv[i + 1], sizes, 16);
        else if (strcmp(argv[i], "--seq") == 0) n_seqs = parse_list(argv[i + 1], seqs, 16);
        else if (strcmp(argv[i], "--batch") == 0) batch = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--phase") == 0) g_phase = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--offload") == 0) {
            n_modes = 0;
            for (int m = 0; m < 3; m++)
                if (strstr(argv[i + 1], mode_name((cdf_offload_mode)m))) modes[n_modes++] = (cdf_offload_mode)m;
        }
        else continue;
        i++;
    }
    g_dev = cdf_device_get("cpu");
    for (int i = 2; i < argc; i++)
        if (strcmp(argv[i], "--why") == 0) g_why = true;
    for (int i = 2; i < argc; i++)
        if (strcmp(argv[i], "--pipeline") == 0) {
            printf("| pipeline | offload | request | phase | measured need MiB | planned MiB | unbudgeted peak MiB | planned/measured |\n");
            printf("|---|---|---|---|---|---|---|---|\n");
            for (int m = 0; m < n_modes; m++)
                for (int a = 0; a < n_sizes; a++)
                    for (int b = 0; b < n_seqs; b++)
                        measure_pipeline(dir, wdt, modes[m], sizes[a], seqs[b], batch > 1 ? 7.0f : 1.0f);
            return 0;
        }
    cdf_load_options opt = cdf_load_options_default();
    opt.device = g_dev;
    opt.weight_dtype = wdt;
    printf("| model | input | weights MiB | measured act MiB | planned act MiB | unbudgeted act MiB | planned/measured |\n");
    printf("|---|---|---|---|---|---|---|\n");
    static const char *const subs[] = {"text_encoder", "text_encoder_2", "text_encoder_3", "transformer", "vae"};
    for (size_t k = 0; k < sizeof subs / sizeof *subs; k++) {
        char sub[4096];
        snprintf(sub, sizeof sub, "%s/%s", dir, subs[k]);
        cJSON *cfg = NULL;
        if (cdf_config_load(sub, &cfg) != CDF_OK) continue;
        cdf_memory_stats st0, st1;
        (void)cdf_device_synchronize(g_dev);
        cdf_device_memory_stats(g_dev, &st0);
        cdf_component *c = NULL;
        if (cdf_component_load(sub, &opt, &c) != CDF_OK) {
            fprintf(stderr, "calibrate: %s\n", cdf_last_error());
            return 1;
        }
        cdf_device_memory_stats(g_dev, &st1);
        const uint64_t weights = st1.current_bytes - st0.current_bytes;
        const char *cls = cdf_component_class_name(c);
        char label[64], shape[64];
        snprintf(label, sizeof label, "%s (%s)", subs[k], cls);
        cdf_plan_model_info info;
        if (cdf_plan_model_info_from_config(cls, cfg, &info) != CDF_OK) {
            fprintf(stderr, "calibrate: %s\n", cdf_last_error());
            return 1;
        }
        info.weight_dtype = wdt;
        cdf_tensor_map in;
        cdf_tensor_map_init(&in);
        uint64_t unl;
        if (strstr(cls, "CLIP")) {
            cdf_tensor_map_set(&in, "input_ids", ids_tensor(77, 49408));
            uint64_t m = measure(c, "forward", &in, &unl);
            row(label, "77 tokens", weights, m, unl, planned_act(sub, wdt, &(cdf_plan_shape){.batch = 1, .text_tokens = 77}));
        } else if (strstr(cls, "T5")) {
            for (int i = 0; i < n_seqs; i++) {
                cdf_tensor_map_clear(&in);
                cdf_tensor_map_set(&in, "input_ids", ids_tensor(seqs[i], 32128));
                uint64_t m = measure(c, "forward", &in, &unl);
                snprintf(shape, sizeof shape, "%d tokens", seqs[i]);
                row(label, shape, weights, m, unl, planned_act(sub, wdt, &(cdf_plan_shape){.batch = 1, .text_tokens = seqs[i]}));
            }
        } else if (strcmp(cls, "AutoencoderKL") == 0) {
            for (int i = 0; i < n_sizes; i++) {
                int64_t f = info.vae_scale_factor, h = sizes[i] / f;
                cdf_tensor_map_clear(&in);
                cdf_tensor_map_set(&in, "z", rand_tensor(4, (int64_t[]){1, info.latent_channels, h, h}));
                uint64_t m = measure(c, "decode", &in, &unl);
                snprintf(shape, sizeof shape, "decode %dx%d", sizes[i], sizes[i]);
                row(label, shape, weights, m, unl, planned_act(sub, wdt, &(cdf_plan_shape){.batch = 1, .latent_h = h, .latent_w = h}));
            }
        } else {
            /* transformers: the latent grid of a sizes[i]^2 image with an 8x VAE, text of seqs[j] tokens */
            for (int i = 0; i < n_sizes; i++)
                for (int j = 0; j < n_seqs; j++) {
                    const int64_t lat = sizes[i] / 8, B = batch;
                    cdf_tensor_map_clear(&in);
                    int64_t Lt = seqs[j];
                    if (strcmp(cls, "FluxTransformer2DModel") == 0) {
                        const int64_t Li = (lat / 2) * (lat / 2);
                        cdf_tensor_map_set(&in, "hidden_states", rand_tensor(3, (int64_t[]){B, Li, info.in_channels}));
                        cdf_tensor_map_set(&in, "encoder_hidden_states", rand_tensor(3, (int64_t[]){B, Lt, info.joint_dim}));
                        cdf_tensor_map_set(&in, "pooled_projections", rand_tensor(2, (int64_t[]){B, info.pooled_dim}));
                        cdf_tensor_map_set(&in, "timestep", rand_tensor(1, (int64_t[]){1}));
                        cdf_tensor_map_set(&in, "img_ids", cdf_tensor_zeros(g_dev, CDF_F32, 2, (int64_t[]){Li, 3}));
                        cdf_tensor_map_set(&in, "txt_ids", cdf_tensor_zeros(g_dev, CDF_F32, 2, (int64_t[]){Lt, 3}));
                        if (info.guidance_embeds) cdf_tensor_map_set(&in, "guidance", rand_tensor(1, (int64_t[]){1}));
                    } else {
                        Lt += 77; /* SD3: CLIP tokens + T5 tokens */
                        cdf_tensor_map_set(&in, "hidden_states", rand_tensor(4, (int64_t[]){B, info.in_channels, lat, lat}));
                        cdf_tensor_map_set(&in, "encoder_hidden_states", rand_tensor(3, (int64_t[]){B, Lt, info.joint_dim}));
                        cdf_tensor_map_set(&in, "pooled_projections", rand_tensor(2, (int64_t[]){B, info.pooled_dim}));
                        cdf_tensor_map_set(&in, "timestep", rand_tensor(1, (int64_t[]){B}));
                    }
                    uint64_t m = measure(c, "forward", &in, &unl);
                    snprintf(shape, sizeof shape, "B%lld %dpx, %lld txt tokens", (long long)B, sizes[i], (long long)Lt);
                    row(label, shape, weights, m, unl, planned_act(sub, wdt, &(cdf_plan_shape){.batch = B, .text_tokens = Lt, .latent_h = lat, .latent_w = lat}));
                }
        }
        cdf_tensor_map_clear(&in);
        cdf_component_free(c);
        cJSON_Delete(cfg);
    }
    return 0;
}
