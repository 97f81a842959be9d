/* cdiffusers — text-to-image pipelines loaded from ordinary diffusers folders
 * (model_index.json + component sub-folders): FluxPipeline, StableDiffusion3Pipeline, Flux2Pipeline. */
#ifndef CDIFFUSERS_PIPELINE_H
#define CDIFFUSERS_PIPELINE_H

#include <stdbool.h>
#include <stdint.h>

#include "cdiffusers/dtype.h"
#include "cdiffusers/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cdf_pipeline cdf_pipeline;

typedef struct cdf_pipeline_load_params {
    const char *device;     /* "cpu" (default) */
    cdf_dtype weight_dtype; /* CDF_F32 (default, exact) or CDF_BF16 */
} cdf_pipeline_load_params;
cdf_pipeline_load_params cdf_pipeline_load_default_params(void);

/* Load a pipeline folder. Errors name the folder/sub-folder/file that is wrong. */
cdf_status cdf_pipeline_load(const char *dir, const cdf_pipeline_load_params *params, cdf_pipeline **out);
void cdf_pipeline_free(cdf_pipeline *p);
/* "FluxPipeline", "StableDiffusion3Pipeline", "Flux2Pipeline". */
const char *cdf_pipeline_class_name(const cdf_pipeline *p);

/* Called after each denoising step; return false to cancel (generate then fails with
 * CDF_ERR_INTERRUPTED). */
typedef bool (*cdf_step_callback)(int step, int num_steps, double step_seconds, void *user);

typedef struct cdf_generate_params {
    const char *prompt;
    const char *negative_prompt; /* NULL = none (SD3 with CFG encodes "") */
    int height, width;           /* 0 = the model's default size */
    int num_inference_steps;     /* 0 = the pipeline default (28; Flux2 50) */
    float guidance_scale;        /* < 0 = pipeline default (Flux 3.5, SD3 7.0, Flux2 4.0) */
    float true_cfg_scale;        /* Flux only; 1 = off */
    uint64_t seed;
    int max_sequence_length;     /* 0 = pipeline default (Flux 512, SD3 256) */
    /* FLUX.2 only: the text encoder's hidden states stacked into the prompt embedding
     * (Flux2Pipeline text_encoder_out_layers); NULL / 0 = the default (10, 20, 30). */
    const int *text_encoder_out_layers;
    int num_text_encoder_out_layers;
    cdf_step_callback callback;
    void *callback_user;
    /* If non-NULL: receives intermediates under the golden keys (noise, latents_initial,
     * latents_final, prompt_embeds, pooled_prompt_embeds, timesteps, sigmas, vae_decode_output,
     * image, ...). Opaque to users of the C API: a `cdf_tensor_map *` (src/nn/nn.h). */
    void *capture;
} cdf_generate_params;
cdf_generate_params cdf_generate_default_params(void);

typedef struct cdf_image {
    int width, height, channels; /* channels = 3 */
    uint8_t *pixels;             /* row-major HWC, malloc'ed; free with cdf_image_free */
} cdf_image;
void cdf_image_free(cdf_image *img);

/* Run the whole pipeline: prompt -> image. Validates the request (sizes, steps) before
 * allocating anything large. */
cdf_status cdf_pipeline_generate(cdf_pipeline *p, const cdf_generate_params *params, cdf_image *out);

/* Compile the pipeline's denoiser (transformer) and VAE: each forward is captured once per input
 * signature and replayed (see cdiffusers/exec.h). The text encoders stay eager (they read token
 * ids on the host). A new height/width compiles once; the step count never recompiles. */
struct cdf_compile_options;
cdf_status cdf_pipeline_compile(cdf_pipeline *p, const struct cdf_compile_options *opt);

/* The effective value the pipeline will use for each 0/negative default of params. */
void cdf_pipeline_resolve_defaults(const cdf_pipeline *p, cdf_generate_params *params);

#ifdef __cplusplus
}
#endif
#endif
