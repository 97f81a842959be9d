/* Pipeline loading (model_index.json: the class table below picks the per-model pipeline) and
 * generate's frame: the request checked, then image by image the per-model pipeline's generate,
 * called down through its class. The shared steps are in steps.c, the defaults in params.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error_internal.h"
#include "pipelines/pipeline_impl.h"
#include "pipelines/step_cache.h"
#include "tensor/tensor_impl.h"
#include "io/json.h"

const char *cdf_pipeline_class_name(const cdf_pipeline *p) { return p ? p->class_name : NULL; }

static bool is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static cdf_status load_component(cdf_pipeline *p, const cJSON *idx, const char *key, bool required, cdf_component **out) {
    *out = NULL;
    const char *cls = NULL;
    CDF_TRY(cdf_model_index_class(p->dir, idx, key, &cls));
    char sub[4096];
    snprintf(sub, sizeof sub, "%s/%s", p->dir, key);
    if (!cls) {
        if (required) return cdf_error(CDF_ERR_FORMAT, "%s/model_index.json: component '%s' is required by %s but absent", p->dir, key, p->class_name);
        return CDF_OK;
    }
    if (!is_dir(sub)) return cdf_error(CDF_ERR_NOT_FOUND, "%s: sub-folder '%s' (%s) is missing", p->dir, key, cls);
    const cdf_load_options opt = cdf_pipe_load_options(p, key); /* offload.c: sequential keeps blocks host-side */
    free(p->report.unused);
    p->report = (cdf_weights_report){0};
    CDF_TRY(cdf_component_load(sub, &opt, out));
    if (p->report.unused && !p->allow_unused_keys)
        return cdf_error(CDF_ERR_FORMAT, "%s: %d tensor(s) of %s are not used by %s '%s': %s (pass --allow-unused-keys / "
                         "allow_unused_keys to load anyway)", p->dir, p->report.n_unused, opt.weights_file, cls, key,
                         p->report.unused);
    return cdf_pipe_offload_adopt(p, *out, sub, key); /* offload.c */
}

static cdf_status load_tokenizer(cdf_pipeline *p, const cJSON *idx, const char *key, bool required, cdf_tokenizer **out) {
    *out = NULL;
    const char *cls = NULL;
    CDF_TRY(cdf_model_index_class(p->dir, idx, key, &cls));
    char sub[4096];
    snprintf(sub, sizeof sub, "%s/%s", p->dir, key);
    if (!cls) {
        if (required) return cdf_error(CDF_ERR_FORMAT, "%s/model_index.json: tokenizer '%s' is required but absent", p->dir, key);
        return CDF_OK;
    }
    if (!is_dir(sub)) return cdf_error(CDF_ERR_NOT_FOUND, "%s: sub-folder '%s' (%s) is missing", p->dir, key, cls);
    *out = cdf_tokenizer_load(sub);
    return *out ? CDF_OK : cdf_last_status();
}

void cdf_pipeline_free(cdf_pipeline *p) {
    if (!p) return;
    for (int i = 0; i < CDF_PIPE_MAX_TEXT; i++) {
        cdf_tokenizer_free(p->tokenizer[i]);
        cdf_component_free(p->text_encoder[i]);
    }
    cdf_component_free(p->transformer);
    cdf_component_free(p->vae);
    for (int i = 0; i < p->n_files; i++) {
        free(p->file_key[i]);
        free(p->file_path[i]);
    }
    free(p->report.unused);
    for (int i = 0; i < p->n_cache_reports; i++) free(p->cache_reports[i]);
    free(p->cache_reports);
    free(p->dir);
    free(p);
}

static cdf_status read_derived_config(cdf_pipeline *p) {
    const cJSON *vcfg = cdf_component_config(p->vae);
    const cJSON *tcfg = cdf_component_config(p->transformer);
    const cJSON *boc = cJSON_GetObjectItemCaseSensitive(vcfg, "block_out_channels");
    int nb = cJSON_IsArray(boc) ? cJSON_GetArraySize(boc) : 0;
    if (nb < 1 || nb > 8) return cdf_error(CDF_ERR_FORMAT, "%s/vae/config.json: block_out_channels must list 1..8 stages", p->dir);
    p->vae_scale_factor = 1 << (nb - 1);
    CDF_TRY(cdf_json_get_double(vcfg, "scaling_factor", 0.18215, &p->vae_scaling_factor));
    CDF_TRY(cdf_json_get_double(vcfg, "shift_factor", 0.0, &p->vae_shift_factor));
    if (!(p->vae_scaling_factor != 0)) return cdf_error(CDF_ERR_FORMAT, "%s/vae/config.json: scaling_factor is 0", p->dir);
    int64_t in_ch, sample;
    CDF_TRY(cdf_json_get_int(tcfg, "in_channels", 64, &in_ch));
    CDF_TRY(cdf_json_get_int(tcfg, "joint_attention_dim", 4096, &p->joint_attention_dim));
    if (p->kind == CDF_PIPE_FLUX || p->kind == CDF_PIPE_FLUX2) {
        if (in_ch % 4) return cdf_error(CDF_ERR_FORMAT, "%s/transformer/config.json: in_channels %lld is not a multiple of 4", p->dir, (long long)in_ch);
        p->latent_channels = in_ch / 4;
        p->default_sample_size = 128; /* FluxPipeline / Flux2Pipeline.default_sample_size */
        /* the transformers' own defaults: FLUX.1 false, FLUX.2 true */
        CDF_TRY(cdf_json_get_bool(tcfg, "guidance_embeds", p->kind == CDF_PIPE_FLUX2, &p->guidance_embeds));
    } else {
        p->latent_channels = in_ch;
        CDF_TRY(cdf_json_get_int(tcfg, "sample_size", 128, &sample));
        p->default_sample_size = sample;
    }
    return CDF_OK;
}

/* The component files named in the load parameters: each must name a component of model_index.json
 * and an existing file. */
static cdf_status copy_component_files(cdf_pipeline *p, const cJSON *idx, const cdf_pipeline_load_params *lp) {
    if (lp->num_component_files < 0 || lp->num_component_files > 8 || (lp->num_component_files && !lp->component_files))
        return cdf_error(CDF_ERR_INVALID_ARG, "component_files: %d entries (0..8 allowed)", lp->num_component_files);
    for (int i = 0; i < lp->num_component_files; i++) {
        const cdf_component_file *f = &lp->component_files[i];
        const char *cls = NULL;
        if (!f->component || !f->path) return cdf_error(CDF_ERR_INVALID_ARG, "component_files[%d] has a NULL field", i);
        CDF_TRY(cdf_model_index_class(p->dir, idx, f->component, &cls));
        if (!cls)
            return cdf_error(CDF_ERR_INVALID_ARG, "%s: a weights file is given for component '%s', which %s does not have",
                             p->dir, f->component, p->class_name);
        struct stat st;
        if (stat(f->path, &st) != 0 || !S_ISREG(st.st_mode))
            return cdf_error(CDF_ERR_NOT_FOUND, "weights file '%s' for component '%s' does not exist or is not a file",
                             f->path, f->component);
        p->file_key[p->n_files] = strdup(f->component);
        p->file_path[p->n_files] = strdup(f->path);
        p->n_files++;
        if (!p->file_key[p->n_files - 1] || !p->file_path[p->n_files - 1])
            return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    }
    return CDF_OK;
}

static cdf_status load_folder(const char *dir, const cdf_pipeline_load_params *params, cdf_pipeline **out);

cdf_status cdf_pipeline_load(const char *dir, const cdf_pipeline_load_params *params, cdf_pipeline **out) {
    if (!out) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_pipeline_load: out is NULL");
    *out = NULL;
    cdf_pipeline_load_params lp = params ? *params : cdf_pipeline_load_params_default();
    if (!dir) return cdf_error(CDF_ERR_INVALID_ARG, "pipeline folder is NULL");
    struct stat st;
    if (stat(dir, &st) == 0 && S_ISREG(st.st_mode)) { /* one all-in-one file: single_file.c */
        cdf_pipe_single_file *sf = calloc(1, sizeof *sf);
        if (!sf) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
        cdf_pipeline_load_params fl;
        cdf_status s = cdf_pipe_single_file_params(dir, &lp, sf, &fl);
        if (s == CDF_OK) s = load_folder(sf->config_dir, &fl, out);
        free(sf);
        return s;
    }
    if (lp.config)
        return cdf_error(CDF_ERR_INVALID_ARG, "a config folder ('%s') goes with a single-file model; '%s' is a folder", lp.config, dir);
    return load_folder(dir, &lp, out);
}

/* The pipeline classes model_index.json's _class_name may name (each defined by its own file). */
static const cdf_pipeline_class *const classes[] = {&cdf_flux_pipeline_class, &cdf_sd3_pipeline_class, &cdf_flux2_pipeline_class};
#define N_CLASSES (int)(sizeof classes / sizeof *classes)

static cdf_status find_class(const char *path, const char *name, const cdf_pipeline_class **out) {
    for (int i = 0; i < N_CLASSES; i++)
        if (strcmp(name, classes[i]->name) == 0) return *out = classes[i], CDF_OK;
    char list[256] = "";
    for (int i = 0; i < N_CLASSES; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", classes[i]->name);
    return cdf_error(CDF_ERR_UNSUPPORTED, "%s: pipeline class '%s' is not supported (supported: %s)", path, name, list);
}

static cdf_status load_folder(const char *dir, const cdf_pipeline_load_params *params, cdf_pipeline **out) {
    cdf_pipeline_load_params lp = *params;
    if (!is_dir(dir)) return cdf_error(CDF_ERR_NOT_FOUND, "model folder '%s' does not exist or is not a folder", dir);
    char path[4096];
    snprintf(path, sizeof path, "%s/model_index.json", dir);
    cJSON *idx = NULL;
    cdf_status s = cdf_json_load_file(path, &idx);
    if (s != CDF_OK) return s;
    cdf_pipeline *p = calloc(1, sizeof *p);
    if (!p) {
        cJSON_Delete(idx);
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    }
    p->dir = strdup(dir);
    const char *cls = NULL;
    s = cdf_json_get_string(idx, "_class_name", NULL, &cls);
    if (s == CDF_OK && !cls) s = cdf_error(CDF_ERR_FORMAT, "%s: no _class_name", path);
    if (s == CDF_OK) {
        snprintf(p->class_name, sizeof p->class_name, "%s", cls);
        s = find_class(path, cls, &p->cls);
        if (s == CDF_OK) p->kind = p->cls->kind;
    }
    if (s == CDF_OK) {
        p->device = lp.device ? cdf_device_get(lp.device) : cdf_device_default();
        if (!p->device) s = cdf_last_status();
    }
    p->opt = cdf_load_options_default();
    p->opt.device = p->device;
    p->opt.weight_dtype = lp.weight_dtype;
    p->opt.decode_quantized = lp.decode_quantized;
    p->opt.quantize_to = lp.quantize_weights;
    p->offload = lp.offload;
    p->allow_unused_keys = lp.allow_unused_keys;
    if (s == CDF_OK) s = copy_component_files(p, idx, &lp);
    if (s == CDF_OK) s = cdf_pipe_check_budget(p, idx); /* planner.c: fail before loading anything */
    if (s == CDF_OK) {
        snprintf(path, sizeof path, "%s/scheduler/scheduler_config.json", dir);
        s = cdf_scheduler_config_from_json(path, &p->sched_cfg);
    }
    bool sd3 = p->kind == CDF_PIPE_SD3, flux2 = p->kind == CDF_PIPE_FLUX2;
    if (s == CDF_OK) s = load_tokenizer(p, idx, "tokenizer", true, &p->tokenizer[0]);
    if (s == CDF_OK && !flux2) s = load_tokenizer(p, idx, "tokenizer_2", true, &p->tokenizer[1]);
    if (s == CDF_OK && sd3) s = load_tokenizer(p, idx, "tokenizer_3", false, &p->tokenizer[2]);
    if (s == CDF_OK) s = load_component(p, idx, "text_encoder", true, &p->text_encoder[0]);
    if (s == CDF_OK && !flux2) s = load_component(p, idx, "text_encoder_2", true, &p->text_encoder[1]);
    if (s == CDF_OK && sd3) s = load_component(p, idx, "text_encoder_3", false, &p->text_encoder[2]);
    if (s == CDF_OK) s = load_component(p, idx, "transformer", true, &p->transformer);
    if (s == CDF_OK) s = load_component(p, idx, "vae", true, &p->vae);
    if (s == CDF_OK) s = read_derived_config(p);
    cJSON_Delete(idx);
    if (s != CDF_OK) {
        cdf_pipeline_free(p);
        return s;
    }
    *out = p;
    return CDF_OK;
}

/* Largest size we accept: 4096² (FLUX.1 supports up to ~2 MP; anything far beyond is a typo
 * that would otherwise allocate tens of GB). */
#define CDF_PIPE_MAX_SIDE 4096

/* The number of prompts of a request: prompts, else prompt_embeds' batch, else 1. */
static int prompt_count(const cdf_generate_params *gp) {
    if (gp->num_prompts > 0) return gp->num_prompts;
    if (gp->prompt_embeds && cdf_tensor_ndim(gp->prompt_embeds) == 3) return (int)cdf_tensor_dim(gp->prompt_embeds, 0);
    return 1;
}

/* One of the user's embeddings: ndim dimensions, a batch of 1 or nb, last dimension `last` (0: any). */
static cdf_status check_embeds(const cdf_tensor *t, const char *name, int ndim, int nb, int64_t last, const char *last_what) {
    char d[160];
    if (cdf_tensor_ndim(t) != ndim || (cdf_tensor_dim(t, 0) != 1 && cdf_tensor_dim(t, 0) != nb) || cdf_tensor_dim(t, 0) < 1 ||
        (ndim == 3 && cdf_tensor_dim(t, 1) < 1) || (last > 0 && cdf_tensor_dim(t, ndim - 1) != last))
        return cdf_error(CDF_ERR_INVALID_ARG, "%s is %s; it must be %s (batch 1 or %d, the number of prompts)%s%lld%s", name,
                         cdf_tensor_describe(t, d, sizeof d), ndim == 3 ? "[batch, sequence, channels]" : "[batch, channels]", nb,
                         last > 0 ? ", channels " : "", (long long)last, last > 0 ? last_what : "");
    return CDF_OK;
}

/* Several prompts and precomputed embeddings (cdf_generate_params.prompts, .prompt_embeds, ...). */
static cdf_status validate_batch(const cdf_pipeline *p, const cdf_generate_params *gp) {
    if (gp->num_prompts < 0 || (gp->num_prompts > 0 && !gp->prompts))
        return cdf_error(CDF_ERR_INVALID_ARG, "num_prompts %d%s", gp->num_prompts, gp->num_prompts > 0 ? " but no prompt list" : "");
    for (int i = 0; i < gp->num_prompts; i++)
        if (!gp->prompts[i] || (gp->negative_prompts && !gp->negative_prompts[i]))
            return cdf_error(CDF_ERR_INVALID_ARG, "%s %d of %d is NULL", gp->prompts[i] ? "negative prompt" : "prompt", i, gp->num_prompts);
    const bool any = gp->prompt_embeds || gp->pooled_prompt_embeds || gp->negative_prompt_embeds || gp->negative_pooled_prompt_embeds;
    if (any && p->kind == CDF_PIPE_FLUX2)
        return cdf_error(CDF_ERR_UNSUPPORTED, "%s: precomputed prompt embeddings are supported by FluxPipeline and "
                                              "StableDiffusion3Pipeline only", p->class_name);
    if (gp->prompt_embeds && gp->num_prompts > 0)
        return cdf_error(CDF_ERR_INVALID_ARG, "prompts and prompt_embeds both given: pass one of them");
    if (!gp->prompt_embeds != !gp->pooled_prompt_embeds)
        return cdf_error(CDF_ERR_INVALID_ARG, gp->prompt_embeds ? "prompt_embeds given without pooled_prompt_embeds: pass both (the "
                                                                  "pooled embedding comes from the same prompt)"
                                                                : "pooled_prompt_embeds given without prompt_embeds");
    if (!gp->negative_prompt_embeds != !gp->negative_pooled_prompt_embeds)
        return cdf_error(CDF_ERR_INVALID_ARG, "negative_prompt_embeds and negative_pooled_prompt_embeds go together: pass both");
    const int nb = prompt_count(gp);
    if (gp->prompt_embeds) {
        CDF_TRY(check_embeds(gp->prompt_embeds, "prompt_embeds", 3, nb, p->joint_attention_dim, " (the transformer's joint_attention_dim)"));
        CDF_TRY(check_embeds(gp->pooled_prompt_embeds, "pooled_prompt_embeds", 2, nb, 0, ""));
    }
    if (gp->negative_prompt_embeds) {
        CDF_TRY(check_embeds(gp->negative_prompt_embeds, "negative_prompt_embeds", 3, nb, p->joint_attention_dim,
                             " (the transformer's joint_attention_dim)"));
        CDF_TRY(check_embeds(gp->negative_pooled_prompt_embeds, "negative_pooled_prompt_embeds", 2, nb, 0, ""));
        /* both go through the transformer with the same text ids (SD3: in one batch) */
        const cdf_tensor *e = gp->prompt_embeds;
        if (e && cdf_tensor_dim(e, 1) != cdf_tensor_dim(gp->negative_prompt_embeds, 1))
            return cdf_error(CDF_ERR_INVALID_ARG, "prompt_embeds and negative_prompt_embeds must have the same sequence length (%lld, %lld)",
                             (long long)cdf_tensor_dim(e, 1), (long long)cdf_tensor_dim(gp->negative_prompt_embeds, 1));
    }
    /* SD3's CFG batches [negative; positive]: an encoded negative prompt has 77 + max_sequence_length tokens */
    if (p->kind == CDF_PIPE_SD3 && gp->guidance_scale > 1.0 && gp->prompt_embeds && !gp->negative_prompt_embeds &&
        cdf_tensor_dim(gp->prompt_embeds, 1) != 77 + gp->max_sequence_length)
        return cdf_error(CDF_ERR_INVALID_ARG, "prompt_embeds has %lld tokens but the negative prompt's embedding has 77 + "
                         "max_sequence_length = %d: pass negative_prompt_embeds, or max_sequence_length %lld",
                         (long long)cdf_tensor_dim(gp->prompt_embeds, 1), 77 + gp->max_sequence_length,
                         (long long)cdf_tensor_dim(gp->prompt_embeds, 1) - 77);
    if (gp->num_seeds > 0 && (gp->num_seeds % nb != 0 || (gp->num_images > 1 && gp->num_seeds != nb * gp->num_images)))
        return cdf_error(CDF_ERR_INVALID_ARG, "%d seeds for %d prompts x %d images: one seed per image", gp->num_seeds, nb,
                         gp->num_images > 1 ? gp->num_images : gp->num_seeds / nb > 0 ? gp->num_seeds / nb : 1);
    return CDF_OK;
}

static cdf_status validate(const cdf_pipeline *p, const cdf_generate_params *gp) {
    int mult = p->vae_scale_factor * 2; /* Flux packs 2x2; SD3 patch_size 2 */
    if (gp->height <= 0 || gp->width <= 0 || gp->height % mult || gp->width % mult)
        return cdf_error(CDF_ERR_INVALID_ARG, "height and width must be positive multiples of %d (got %dx%d)", mult, gp->height,
                         gp->width);
    if (gp->height > CDF_PIPE_MAX_SIDE || gp->width > CDF_PIPE_MAX_SIDE) {
        double tokens = (double)(gp->height / mult) * (gp->width / mult);
        /* the VAE decoder's largest activation: 128+ channels at full resolution, f32 */
        double gb = 4.0 * 128 * gp->height * (double)gp->width * 3 / 1e9;
        return cdf_error(CDF_ERR_LIMIT, "%dx%d is larger than the %d-pixel limit per side (%.0f image tokens; the VAE decode "
                         "alone would need about %.0f GB)", gp->width, gp->height, CDF_PIPE_MAX_SIDE, tokens, gb);
    }
    if (gp->num_inference_steps <= 0 || gp->num_inference_steps > 1000)
        return cdf_error(CDF_ERR_INVALID_ARG, "steps must be between 1 and 1000 (got %d)", gp->num_inference_steps);
    if (gp->max_sequence_length <= 0 || gp->max_sequence_length > 512)
        return cdf_error(CDF_ERR_INVALID_ARG, "max_sequence_length must be between 1 and 512 (got %d)", gp->max_sequence_length);
    /* the model gets them as float32 (torch's scalar): one past FLT_MAX is as infinite as inf */
    if (!isfinite((float)gp->guidance_scale) || !isfinite((float)gp->true_cfg_scale))
        return cdf_error(CDF_ERR_INVALID_ARG, "guidance scales must be finite numbers (within float32's range)");
    CDF_TRY(cdf_pipe_check_inputs(gp, p->kind == CDF_PIPE_FLUX2)); /* image_input.c */
    CDF_TRY(cdf_pipe_vae_tiling_check(p, gp));
    cdf_step_cache_config cache;
    CDF_TRY(cdf_step_cache_parse(gp->cache, &cache));
    /* diffusers: First Block Cache on FLUX.1 (on FLUX.2 it fails), MagCache on FLUX.1 and FLUX.2,
     * neither on SD3 (no CacheMixin) */
    if (cache.kind == CDF_STEP_CACHE_FIRST_BLOCK && p->kind != CDF_PIPE_FLUX)
        return cdf_error(CDF_ERR_UNSUPPORTED, "cache '%s': the first-block cache runs on FLUX.1 only (%s; docs/step-caches.md)",
                         gp->cache, p->class_name);
    if (cache.kind == CDF_STEP_CACHE_TAYLORSEER && p->kind == CDF_PIPE_FLUX2)
        return cdf_error(CDF_ERR_UNSUPPORTED, CDF_STEP_CACHE_TAYLORSEER_FLUX2_REFUSAL, gp->cache);
    if (cache.kind == CDF_STEP_CACHE_TAYLORSEER && p->kind != CDF_PIPE_FLUX)
        return cdf_error(CDF_ERR_UNSUPPORTED, "cache '%s': TaylorSeer runs on FLUX.1 only (%s; docs/step-caches.md)",
                         gp->cache, p->class_name);
    if (cache.kind == CDF_STEP_CACHE_MAG && p->kind == CDF_PIPE_SD3)
        return cdf_error(CDF_ERR_UNSUPPORTED, "cache '%s': MagCache runs on FLUX.1 and FLUX.2 only (%s; docs/step-caches.md)",
                         gp->cache, p->class_name);
    /* get_timesteps leaves num_inference_steps - t_start steps; diffusers raises when none is left */
    if (gp->image && p->kind != CDF_PIPE_FLUX2 && cdf_pipe_t_start(gp->num_inference_steps, gp->strength) >= gp->num_inference_steps)
        return cdf_error(CDF_ERR_INVALID_ARG, "strength %g leaves no denoising step of %d", gp->strength,
                         gp->num_inference_steps);
    if (gp->num_seeds < 0 || (gp->num_seeds > 0 && !gp->seeds) || gp->num_images < 0)
        return cdf_error(CDF_ERR_INVALID_ARG, "num_images / seeds: %d images, %d seeds%s", gp->num_images, gp->num_seeds,
                         gp->num_seeds > 0 && !gp->seeds ? " but no seed list" : "");
    /* StableDiffusion3Img2ImgPipeline.prepare_latents encodes image[i : i + 1] with generator[i] for
     * every i of the batch: past the one image the slices are empty and its VAE raises */
    if (gp->image && !gp->mask_image && p->kind == CDF_PIPE_SD3 && gp->num_seeds > 1)
        return cdf_error(CDF_ERR_INVALID_ARG,
                         "%d seeds with an input image: diffusers' StableDiffusion3Img2ImgPipeline fails with a list of "
                         "generators (it encodes an empty slice of the one image for each one past the first); use one "
                         "seed with num_images (--num-images), or one run per seed",
                         gp->num_seeds);
    if (gp->num_seeds > 0 && gp->num_images > 1 && gp->num_images != gp->num_seeds && prompt_count(gp) <= 1)
        return cdf_error(CDF_ERR_INVALID_ARG, "%d images requested with %d seeds: one image per seed", gp->num_images, gp->num_seeds);
    return validate_batch(p, gp);
}

int cdf_generate_params_count(const cdf_generate_params *gp) {
    if (!gp) return 0;
    if (gp->num_seeds > 0) return gp->num_seeds;
    return (gp->num_images > 1 ? gp->num_images : 1) * prompt_count(gp);
}

/* One image of a request (validated): row `row` of a one-generator batch. */
static cdf_status generate_one(cdf_pipeline *p, const cdf_generate_params *gp, int64_t row, int64_t rows, cdf_image *out) {
    p->batch_row = row;
    p->batch_rows = rows;
    cdf_pipe_generate_begin(p); /* offload.c: per-phase peaks */
    cdf_pipe_prefetch_resolve(p, gp);
    cdf_pipe_vae_tiling_resolve(p, gp);
    cdf_scope_push();
    cdf_status s = p->cls->generate(p, gp, out);
    cdf_scope_pop(NULL, 0);
    if (s == CDF_OK) s = cdf_device_synchronize(p->device);
    else (void)cdf_device_synchronize(p->device); /* drain the queue; keep the first error */
    s = cdf_pipe_generate_end(p, s);
    p->batch_row = 0;
    p->batch_rows = 1;
    p->encode_seed_set = false;
    if (s != CDF_OK) cdf_image_free(out);
    return s;
}

cdf_status cdf_pipeline_cache_check(const char *cache) {
    cdf_step_cache_config cfg;
    return cdf_step_cache_parse(cache, &cfg);
}

static cdf_status prepare(cdf_pipeline *p, const cdf_generate_params *params, cdf_generate_params *gp) {
    *gp = *params;
    if (!gp->prompt) gp->prompt = "";
    cdf_pipeline_resolve_defaults(p, gp);
    return validate(p, gp);
}

cdf_status cdf_pipeline_validate(const cdf_pipeline *p, const cdf_generate_params *params) {
    if (!p || !params) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_pipeline_validate: NULL argument");
    cdf_generate_params gp;
    return prepare((cdf_pipeline *)p, params, &gp); /* prepare only reads p */
}

/* Row r of a user's embedding (row 0 of a batch of 1) as a [1, ...] f32 tensor on the pipeline's
 * device; NULL for none. */
static cdf_status embeds_row(cdf_pipeline *p, const cdf_tensor *t, int64_t r, cdf_tensor **out) {
    *out = NULL;
    if (!t) return CDF_OK;
    const int nd = cdf_tensor_ndim(t);
    int64_t shape[3] = {1, 1, 1}, row = 1;
    for (int i = 1; i < nd && i < 3; i++) row *= shape[i] = cdf_tensor_dim(t, i);
    const int64_t total = cdf_tensor_numel(t);
    float *all = malloc((size_t)total * sizeof *all);
    if (!all) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    cdf_status s = cdf_tensor_read(t, CDF_F32, all, (size_t)total * sizeof *all);
    if (s == CDF_OK) {
        cdf_scope_suppress(1); /* owned here, released after the image */
        *out = cdf_tensor_from_host(p->device, CDF_F32, nd, shape, all + (cdf_tensor_dim(t, 0) == 1 ? 0 : r) * row, CDF_F32);
        cdf_scope_suppress(-1);
        if (!*out) s = cdf_last_status();
    }
    free(all);
    return s;
}

/* Image k of a request (validated), `per` images per prompt: its prompt (row k / per of the
 * prompts or embeddings) and its generator (its own seed, or row k of the one generator's batch). */
static cdf_status generate_image_k(cdf_pipeline *p, const cdf_generate_params *gp, int k, int n, cdf_image *out) {
    const int per = n / prompt_count(gp), row = k / per;
    cdf_generate_params gk = *gp;
    gk.prompts = gk.negative_prompts = NULL;
    gk.num_prompts = 0;
    if (gp->num_prompts > 0) gk.prompt = gp->prompts[row];
    if (gp->negative_prompts) gk.negative_prompt = gp->negative_prompts[row];
    cdf_tensor *e[4] = {0};
    cdf_status s = embeds_row(p, gp->prompt_embeds, row, &e[0]);
    if (s == CDF_OK) s = embeds_row(p, gp->pooled_prompt_embeds, row, &e[1]);
    if (s == CDF_OK) s = embeds_row(p, gp->negative_prompt_embeds, row, &e[2]);
    if (s == CDF_OK) s = embeds_row(p, gp->negative_pooled_prompt_embeds, row, &e[3]);
    gk.prompt_embeds = e[0], gk.pooled_prompt_embeds = e[1], gk.negative_prompt_embeds = e[2], gk.negative_pooled_prompt_embeds = e[3];
    if (s == CDF_OK) s = gp->num_seeds > 0 ? generate_one(p, &gk, 0, 1, out) : generate_one(p, &gk, k, n, out);
    for (int i = 0; i < 4; i++) cdf_tensor_release(e[i]);
    return s;
}

cdf_status cdf_pipeline_generate(cdf_pipeline *p, const cdf_generate_params *params, cdf_image *out) {
    if (!p || !params || !out) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_pipeline_generate: NULL argument");
    memset(out, 0, sizeof *out);
    if (cdf_generate_params_count(params) != 1)
        return cdf_error(CDF_ERR_INVALID_ARG, "cdf_pipeline_generate makes one image; %d requested (use cdf_pipeline_generate_images)",
                         cdf_generate_params_count(params));
    cdf_generate_params gp;
    CDF_TRY(prepare(p, params, &gp));
    if (gp.num_seeds == 1) gp.seed = gp.seeds[0];
    CDF_TRY(cdf_pipe_cache_reports_reset(p, 1));
    gp.seeds = NULL, gp.num_seeds = 0;
    return generate_image_k(p, &gp, 0, 1, out);
}

/* Copy image k's intermediates into the caller's map as "k.<key>" (and plain keys for image 0). */
static cdf_status keep_captures(cdf_tensor_map *dst, const cdf_tensor_map *src, int k) {
    for (int i = 0; i < src->n; i++) {
        char key[256];
        snprintf(key, sizeof key, "%d.%s", k, src->names[i]);
        CDF_TRY(cdf_tensor_map_set(dst, key, src->tensors[i]));
        if (k == 0) CDF_TRY(cdf_tensor_map_set(dst, src->names[i], src->tensors[i]));
    }
    return CDF_OK;
}

/* The "0.<key>" names of a single image's intermediates, beside the plain ones (set may grow the
 * arrays, so each entry is read before it). */
static cdf_status alias_image0(cdf_tensor_map *m) {
    const int n0 = m->n;
    for (int i = 0; i < n0; i++) {
        char key[256];
        snprintf(key, sizeof key, "0.%s", m->names[i]);
        CDF_TRY(cdf_tensor_map_set(m, key, m->tensors[i]));
    }
    return CDF_OK;
}

cdf_status cdf_pipeline_generate_images(cdf_pipeline *p, const cdf_generate_params *params, cdf_image *out, int n_out) {
    if (!p || !params || !out) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_pipeline_generate_images: NULL argument");
    const int n = cdf_generate_params_count(params);
    if (n_out != n)
        return cdf_error(CDF_ERR_INVALID_ARG, "cdf_pipeline_generate_images: the request makes %d images, room for %d given", n, n_out);
    memset(out, 0, sizeof *out * (size_t)n);
    cdf_generate_params gp;
    CDF_TRY(prepare(p, params, &gp));
    cdf_tensor_map *user_cap = (cdf_tensor_map *)gp.capture, cap; /* a cdf_capture is a map (capture.c) */
    cdf_status s = cdf_pipe_cache_reports_reset(p, n);
    /* Image by image (batch 1 each): with one generator, image k's noise is row k of the (n, ...)
     * tensor diffusers draws (the VAE sample of an input image is drawn once, before); with a
     * seed list each image's noise comes from its own generator, but an img2img / inpainting
     * image is encoded once, with the first generator (Flux*Pipeline._encode_vae_image loops over
     * the one image; StableDiffusion3Img2ImgPipeline's loop over the batch encodes empty slices
     * after the first): image k > 0 has seed k's noise and seed 0's latent sample. */
    for (int k = 0; k < n && s == CDF_OK; k++) {
        cdf_generate_params gk = gp;
        if (gp.num_seeds > 0) gk.seed = gp.seeds[k];
        if (gp.num_seeds > 0 && k > 0 && gp.image && p->kind != CDF_PIPE_FLUX2) {
            p->encode_seed_set = true; /* reset by generate_one */
            p->encode_seed = gp.seeds[0];
        }
        p->image_index = k;
        cdf_tensor_map_init(&cap);
        /* one image: straight into the caller's map, so that a step callback can read the step's
         * latents while the run goes on (the "0.<key>" copies are added after) */
        if (user_cap) gk.capture = (cdf_capture *)(n == 1 ? user_cap : &cap);
        s = generate_image_k(p, &gk, k, n, &out[k]);
        if (s == CDF_OK && user_cap) s = n == 1 ? alias_image0(user_cap) : keep_captures(user_cap, &cap, k);
        cdf_tensor_map_clear(&cap);
    }
    if (s != CDF_OK)
        for (int k = 0; k < n; k++) cdf_image_free(&out[k]);
    return s;
}

