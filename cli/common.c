/* What `generate` and `serve` share: see common.h. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cdiffusers/cdiffusers.h"
#include "common.h"
#include "core/error_internal.h"
#include "io/json.h"

static bool file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

static bool is_pipeline_dir(const char *dir) {
    char p[4096];
    return snprintf(p, sizeof p, "%s/model_index.json", dir) < (int)sizeof p && file_exists(p);
}

bool cdf_cli_find_default_model(char *out, size_t n) {
    const char *env = getenv("CDIFFUSERS_DEFAULT_MODEL");
    if (env && *env) return snprintf(out, n, "%s", env) < (int)n;
    char exe[4096];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0) {
        exe[len] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) *slash = '\0';
        static const char *const rel[] = {"../models/", "../share/cdiffusers/models/", "models/"};
        for (size_t i = 0; i < sizeof rel / sizeof *rel; i++)
            if (snprintf(out, n, "%s/%s" CDF_CLI_DEFAULT_MODEL_NAME, exe, rel[i]) < (int)n && is_pipeline_dir(out)) return true;
    }
    const char *src = __FILE__; /* .../cli/common.c (absolute under CMake) */
    const char *cut = strstr(src, "/cli/common.c");
    if (src[0] == '/' && cut && snprintf(out, n, "%.*s/models/" CDF_CLI_DEFAULT_MODEL_NAME, (int)(cut - src), src) < (int)n &&
        is_pipeline_dir(out))
        return true;
    return false;
}

cdf_status cdf_cli_model_defaults_load(const char *dir, cdf_cli_model_defaults *d) {
    memset(d, 0, sizeof *d);
    d->guidance_scale = -1.0;
    d->true_cfg_scale = 1.0;
    char path[4096];
    if (snprintf(path, sizeof path, "%s/cdiffusers_defaults.json", dir) >= (int)sizeof path || !file_exists(path)) return CDF_OK;
    cJSON *j = NULL;
    if (cdf_json_load_file(path, &j) != CDF_OK) return cdf_error_prefix("reading the model's defaults: ");
    int64_t h, w, steps, seq;
    double g, cfg;
    cdf_status s = cdf_json_get_int(j, "height", 0, &h);
    if (s == CDF_OK) s = cdf_json_get_int(j, "width", 0, &w);
    if (s == CDF_OK) s = cdf_json_get_int(j, "num_inference_steps", 0, &steps);
    if (s == CDF_OK) s = cdf_json_get_int(j, "max_sequence_length", 0, &seq);
    if (s == CDF_OK) s = cdf_json_get_double(j, "guidance_scale", -1.0, &g);
    if (s == CDF_OK) s = cdf_json_get_double(j, "true_cfg_scale", 1.0, &cfg);
    const cJSON *neg = cJSON_GetObjectItemCaseSensitive(j, "negative_prompt");
    d->have_negative = cJSON_IsString(neg) && strlen(neg->valuestring) < sizeof d->negative_prompt;
    if (d->have_negative) snprintf(d->negative_prompt, sizeof d->negative_prompt, "%s", neg->valuestring);
    if (s == CDF_OK && neg && !d->have_negative)
        s = cdf_error(CDF_ERR_FORMAT, "negative_prompt must be a string shorter than %zu bytes", sizeof d->negative_prompt);
    cJSON_Delete(j);
    if (s != CDF_OK) return cdf_error_prefix("%s: ", path);
    /* out-of-range values are left to the pipeline's own checks, which name the parameter */
    if (h > 0 && h <= 1 << 20) d->height = (long)h;
    if (w > 0 && w <= 1 << 20) d->width = (long)w;
    if (steps > 0 && steps <= 1000) d->steps = (long)steps;
    if (seq > 0 && seq <= 512) d->max_sequence_length = (long)seq;
    if (g >= 0 && isfinite(g)) d->guidance_scale = g;
    if (cfg > 1.0 && isfinite(cfg)) d->true_cfg_scale = cfg;
    return CDF_OK;
}

void cdf_cli_model_defaults_apply(const cdf_cli_model_defaults *d, cdf_generate_params *gp, bool user_scale) {
    /* true CFG, field by field: a scale given alone keeps the folder's negative prompt (true CFG
     * needs both, so dropping it would silently turn CFG off), a negative prompt given alone
     * keeps the folder's scale; a scale of 1 given by the user still turns it off */
    if (!gp->negative_prompt && d->have_negative) gp->negative_prompt = d->negative_prompt;
    if (gp->true_cfg_scale == 1.0 && !user_scale && d->true_cfg_scale > 1.0) gp->true_cfg_scale = d->true_cfg_scale;
    if (gp->height <= 0 && d->height > 0) gp->height = (int)d->height;
    if (gp->width <= 0 && d->width > 0) gp->width = (int)d->width;
    if (gp->num_inference_steps <= 0 && d->steps > 0) gp->num_inference_steps = (int)d->steps;
    if (gp->max_sequence_length <= 0 && d->max_sequence_length > 0) gp->max_sequence_length = (int)d->max_sequence_length;
    if (gp->guidance_scale < 0 && d->guidance_scale >= 0) gp->guidance_scale = d->guidance_scale;
}

int cdf_cli_usage_error(const char *fmt, const char *arg) {
    fprintf(stderr, "cdiffusers: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(see cdiffusers --help)\n");
    return 2;
}

bool cdf_cli_parse_long(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

int cdf_cli_parse_offload(const char *s, cdf_offload_mode *out) {
    if (strcmp(s, "none") == 0) *out = CDF_OFFLOAD_NONE;
    else if (strcmp(s, "model") == 0) *out = CDF_OFFLOAD_MODEL;
    else if (strcmp(s, "sequential") == 0) *out = CDF_OFFLOAD_SEQUENTIAL;
    else return -1;
    return 0;
}

bool cdf_cli_parse_double(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v)) return false;
    *out = v;
    return true;
}

int cdf_cli_parse_mode(const char *s) {
    if (strcmp(s, "eager") == 0) return CDF_CLI_MODE_EAGER;
    if (strcmp(s, "fuse") == 0 || strcmp(s, "defer-and-fuse") == 0) return CDF_CLI_MODE_FUSE;
    if (strcmp(s, "compile") == 0) return CDF_CLI_MODE_COMPILE;
    return -1;
}

cdf_cli_run_opts cdf_cli_run_opts_default(void) {
    return (cdf_cli_run_opts){.dtype = "bf16", .offload = "none", .mode = CDF_CLI_MODE_DEFAULT};
}

/* 1: c is one of the shared options (taken into o); 0: it is not; -1: a bad value (the usage
 * error printed). */
static int run_option(int c, const char *arg, cdf_cli_run_opts *o) {
    switch (c) {
    case 'm': o->model = arg; return 1;
    case 'd': o->dtype = arg; return 1;
    case 'O': o->offload = arg; return 1;
    case 'M': o->device_memory = arg; return 1;
    case 'B': o->blocks = true; return 1;
    case 900: /* --pjrt-cache DIR|off: read when the pjrt backend loads (at the first pjrt device) */
        setenv("CDIFFUSERS_PJRT_CACHE", arg, 1);
        return 1;
    case 't':
        if (!cdf_cli_parse_long(arg, 1, 4096, &o->threads))
            return cdf_cli_usage_error("--threads needs a positive integer, got '%s'", arg), -1;
        return 1;
    case 'E':
        if ((o->mode = cdf_cli_parse_mode(arg)) < 0)
            return cdf_cli_usage_error("--mode must be eager, fuse or compile, got '%s'", arg), -1;
        return 1;
    default: return 0;
    }
}

int cdf_cli_next_option(int argc, char **argv, const struct option *opts, cdf_cli_run_opts *o) {
    int c, r;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1)
        if ((r = run_option(c, optarg, o)) <= 0) return r < 0 ? '?' : c;
    return -1;
}

bool cdf_cli_run_opts_dtype(const cdf_cli_run_opts *o, cdf_dtype *out) {
    if (strcmp(o->dtype, "f32") == 0) *out = CDF_F32;
    else if (strcmp(o->dtype, "bf16") == 0) *out = CDF_BF16;
    else return cdf_cli_usage_error("--dtype must be f32 or bf16, got '%s'", o->dtype), false;
    return true;
}

bool cdf_cli_run_opts_load(const cdf_cli_run_opts *o, cdf_pipeline_load_params *lp, int64_t *device_memory) {
    if (!cdf_cli_run_opts_dtype(o, &lp->weight_dtype)) return false;
    if (cdf_cli_parse_offload(o->offload, &lp->offload) != 0)
        return cdf_cli_usage_error("--offload must be none, model or sequential, got '%s'", o->offload), false;
    *device_memory = -1;
    if (o->device_memory && (*device_memory = cdf_parse_bytes(o->device_memory)) < 0)
        return cdf_cli_usage_error("--device-memory needs a size like 8G or 512M, got '%s'", o->device_memory), false;
    return true;
}

cdf_status cdf_cli_apply_mode(int mode) {
    if (mode == CDF_CLI_MODE_FUSE) return cdf_exec_set_mode(CDF_EXEC_DEFER_AND_FUSE);
    if (mode == CDF_CLI_MODE_EAGER || mode == CDF_CLI_MODE_COMPILE) return cdf_exec_set_mode(CDF_EXEC_EAGER);
    return CDF_OK;
}

cdf_status cdf_cli_compile(cdf_pipeline *pipe, int mode, bool repeated_blocks) {
    if (mode != CDF_CLI_MODE_COMPILE && !repeated_blocks) return CDF_OK;
    cdf_compile_options co = cdf_compile_options_default();
    co.fullgraph = !repeated_blocks; /* blocks: a block that cannot be captured runs eagerly */
    return repeated_blocks ? cdf_pipeline_compile_repeated_blocks(pipe, &co) : cdf_pipeline_compile(pipe, &co);
}

void cdf_cli_png_text_make(cdf_cli_png_text *t, const cdf_pipeline *pipe, const cdf_generate_params *gp, const char *dtype,
                           const char *model, unsigned long long seed, const char *batch, const char *init, int image) {
    cdf_generate_params eff = *gp;
    cdf_pipeline_resolve_defaults(pipe, &eff);
    const char *cache = cdf_pipeline_cache_report(pipe, image); /* "first-block:T, full steps ..." */
    snprintf(t->parameters, sizeof t->parameters,
             "%s\nNegative prompt: %s\nSteps: %d, Sampler: FlowMatchEulerDiscrete, CFG scale: %g, True CFG scale: %g, "
             "Seed: %llu%s, Size: %dx%d%s, Max sequence length: %d, Dtype: %s, Model: %s, Pipeline: %s, %s%s%sGenerator: cdiffusers %s",
             eff.prompt ? eff.prompt : "", eff.negative_prompt ? eff.negative_prompt : "", eff.num_inference_steps,
             eff.guidance_scale, eff.true_cfg_scale, seed, batch ? batch : "", eff.width, eff.height, init ? init : "",
             eff.max_sequence_length, dtype, model, cdf_pipeline_class_name(pipe), cache ? "Cache: " : "", cache ? cache : "",
             cache ? ", " : "", CDIFFUSERS_VERSION);
    snprintf(t->software, sizeof t->software, "cdiffusers %s", CDIFFUSERS_VERSION);
    t->keys[0] = "parameters";
    t->keys[1] = "Software";
    t->values[0] = t->parameters;
    t->values[1] = t->software;
}

void cdf_cli_png_init_text(char *buf, size_t n, const cdf_pipeline *pipe, const cdf_generate_params *gp,
                           const char *const *image_names, int n_names, const char *mask_name) {
    buf[0] = 0;
    if (!gp->image || n_names < 1) return;
    if (strcmp(cdf_pipeline_class_name(pipe), "Flux2Pipeline") == 0) {
        size_t used = (size_t)snprintf(buf, n, ", Reference images: ");
        for (int i = 0; i < n_names && used < n; i++)
            used += (size_t)snprintf(buf + used, n - used, "%s%s", i ? "; " : "", image_names[i]);
        return;
    }
    cdf_generate_params eff = *gp;
    cdf_pipeline_resolve_defaults(pipe, &eff);
    /* the shortest digits that read back as the same double (Python's repr), so that the
     * strength given back on the command line starts at the same step */
    char strength[32];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(strength, sizeof strength, "%.*g", prec, eff.strength);
        if (strtod(strength, NULL) == eff.strength) break;
    }
    snprintf(buf, n, ", Strength: %s, Init image: %s%s%s", strength, image_names[0],
             gp->mask_image && mask_name ? ", Mask: " : "", gp->mask_image && mask_name ? mask_name : "");
}

/* ---- component files and --weight-type ------------------------------------------------------ */
const char *cdf_cli_parse_weight_type(const char *wt, const char *dtype, bool *decode, uint32_t *quantize) {
    if (!wt) return NULL;
    if (strcmp(wt, "q8_0") == 0 || strcmp(wt, "q4_k") == 0) {
        *quantize = wt[1] == '8' ? CDF_GGML_Q8_0 : CDF_GGML_Q4_K;
        return NULL;
    }
    if (strcmp(wt, "f32") != 0 && strcmp(wt, "bf16") != 0) return "--weight-type must be q8_0, q4_k, f32 or bf16";
    if (strcmp(wt, dtype) != 0) return "--weight-type f32|bf16 decodes quantized weights to that dtype: give the same --dtype";
    *decode = true;
    return NULL;
}

int cdf_cli_add_component_file(cdf_cli_component_files *cf, int opt, const char *arg) {
    if (cf->n == 8) return cdf_cli_usage_error("%s", "at most 8 component files");
    const char *path = arg, *key = opt == CDF_CLI_OPT_TRANSFORMER_FILE ? "transformer" : "vae";
    if (opt == CDF_CLI_OPT_TEXT_ENCODER_FILE) {
        const char *eq = strchr(arg, '=');
        if (!eq || eq == arg || !eq[1] || eq - arg >= 24)
            return cdf_cli_usage_error("--text-encoder needs N=FILE (N = 1, 2, 3 or a component name), got '%s'", arg);
        char n[32];
        snprintf(n, sizeof n, "%.*s", (int)(eq - arg), arg);
        if (strcmp(n, "1") == 0) snprintf(cf->keys[cf->n], 32, "text_encoder");
        else if (strcmp(n, "2") == 0) snprintf(cf->keys[cf->n], 32, "text_encoder_2");
        else if (strcmp(n, "3") == 0) snprintf(cf->keys[cf->n], 32, "text_encoder_3");
        else snprintf(cf->keys[cf->n], 32, "%s", n);
        key = cf->keys[cf->n];
        path = eq + 1;
    }
    for (int i = 0; i < cf->n; i++)
        if (strcmp(cf->files[i].component, key) == 0) return cdf_cli_usage_error("two weights files for '%s'", key);
    cf->files[cf->n++] = (cdf_component_file){key, path};
    return 0;
}
