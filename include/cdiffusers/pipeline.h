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

/* Where the models' weights live between their uses (diffusers' pipe.to(device) /
 * enable_model_cpu_offload). The "host" copy is always the memory-mapped checkpoint. */
typedef enum cdf_offload_mode {
    CDF_OFFLOAD_NONE = 0,  /* every model resident on the device (default) */
    CDF_OFFLOAD_MODEL = 1, /* one model at a time: each is materialised just before it runs and
                              released when another model runs; peak = largest model + its
                              activations, at the cost of re-converting weights every generate */
    CDF_OFFLOAD_SEQUENTIAL = 2, /* MODEL, and the transformer's repeated blocks stay host-side:
                              each block's weights are materialised just before it runs and
                              released after (diffusers' enable_sequential_cpu_offload), so a
                              transformer larger than the budget runs; peak = the transformer's
                              other weights + about two blocks + activations */
} cdf_offload_mode;

typedef struct cdf_pipeline_load_params {
    const char *device;       /* "cpu" (default) */
    cdf_dtype weight_dtype;   /* CDF_BF16 (default): bf16 weights, matmul/conv inputs rounded to bf16,
                                 f32 accumulation, f32 elsewhere; CDF_F32: the exact path */
    cdf_offload_mode offload; /* CDF_OFFLOAD_NONE (default). With NONE, a device budget smaller than
                                 the weights fails the load before anything is loaded
                                 (CDF_ERR_OUT_OF_MEMORY: needed vs allowed, suggests MODEL) */
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
/* Compile only the transformer's repeated blocks: one graph per block class and shape, shared
 * by all blocks (much shorter warm-up than whole-model compile; works with offload). */
cdf_status cdf_pipeline_compile_repeated_blocks(cdf_pipeline *p, const struct cdf_compile_options *opt);

/* The effective value the pipeline will use for each 0/negative default of params. */
void cdf_pipeline_resolve_defaults(const cdf_pipeline *p, cdf_generate_params *params);
/* The checks cdf_pipeline_generate makes before any work (size multiple and limit, steps,
 * sequence length, finite guidance), on params with its defaults resolved; CDF_ERR_INVALID_ARG or
 * CDF_ERR_LIMIT with the message generate would give. Reads only what loading fixed, so any
 * thread may call it while another generates (e.g. a server refusing a request up front). */
cdf_status cdf_pipeline_validate(const cdf_pipeline *p, const cdf_generate_params *params);

/* ---- device memory: offload, measured peaks, planning ------------------------------------- */
/* Switch the offload mode of a loaded pipeline. MODEL releases every model now; NONE
 * materialises them all again (CDF_ERR_OUT_OF_MEMORY if they do not fit the budget). */
cdf_status cdf_pipeline_set_offload(cdf_pipeline *p, cdf_offload_mode mode);
cdf_status cdf_pipeline_enable_model_cpu_offload(cdf_pipeline *p); /* set_offload(p, MODEL) */
cdf_status cdf_pipeline_enable_sequential_cpu_offload(cdf_pipeline *p); /* set_offload(p, SEQUENTIAL) */
cdf_offload_mode cdf_pipeline_offload_mode(const cdf_pipeline *p);

typedef enum cdf_pipeline_phase {
    CDF_PHASE_TEXT = 0,    /* prompt encoding (the text encoders) */
    CDF_PHASE_DENOISE = 1, /* the denoising loop (the transformer) */
    CDF_PHASE_DECODE = 2,  /* VAE decode and the image conversion */
    CDF_PHASE_COUNT = 3
} cdf_pipeline_phase;
const char *cdf_pipeline_phase_name(cdf_pipeline_phase phase); /* "text encoding", ... */

/* Measured during the last cdf_pipeline_generate. generate waits for the device at each phase
 * change and restarts the device's peak counter there (cdf_device_reset_peak). Without a budget
 * the peak includes the outputs of ops the host queued ahead of the device, so it can exceed
 * what the run needs; under a budget the allocator waits for the queue before failing. */
typedef struct cdf_pipeline_memory_stats {
    uint64_t phase_peak_bytes[CDF_PHASE_COUNT]; /* device peak during each phase */
    uint64_t peak_bytes;                        /* the largest of them */
    int materialisations;                       /* models (re)loaded by offload during the run */
} cdf_pipeline_memory_stats;
void cdf_pipeline_last_memory_stats(const cdf_pipeline *p, cdf_pipeline_memory_stats *out);

/* The planner: expected peak device memory per phase for a pipeline folder, from its configs and
 * checkpoint headers only (nothing is loaded or run). weights = models resident during the phase
 * (all of them with NONE; the phase's largest with MODEL); activations = what the phase's largest
 * forward needs at its peak plus the tensors the pipeline holds meanwhile. "Needed" is the
 * smallest device budget under which the phase runs (see cdf_pipeline_memory_stats on why an
 * unbudgeted peak is higher). With SEQUENTIAL the transformer's weights are its non-block ones
 * plus its largest block. Calibrated for FluxPipeline, StableDiffusion3Pipeline and
 * Flux2Pipeline models in eager (and defer-and-fuse) execution and with repeated-block compile
 * (cdf_pipeline_plan_memory_exec); for whole-model compile the eager plan is an upper bound.
 * Model classes without a formula count weights only (activation_known false). See
 * bench/RESULTS.md, "Offload". */
#define CDF_PLAN_MAX_COMPONENTS 8
/* How the transformer will run: the activations differ. */
typedef enum cdf_plan_execution {
    CDF_PLAN_EAGER = 0,           /* eager and defer-and-fuse (whole-model compile: an upper bound) */
    CDF_PLAN_REPEATED_BLOCKS = 1, /* cdf_pipeline_compile_repeated_blocks (CDIFFUSERS_COMPILE=blocks) */
} cdf_plan_execution;
typedef struct cdf_memory_plan {
    char pipeline_class[64];
    int height, width, max_sequence_length, batch; /* the resolved request; batch 2 with SD3 CFG */
    cdf_offload_mode offload;
    cdf_dtype weight_dtype;
    cdf_plan_execution execution;
    int n_components;
    struct {
        char name[32];        /* "text_encoder", "transformer", ... */
        char class_name[64];
        uint64_t weights_bytes;    /* resident once loaded */
        uint64_t activation_bytes; /* its largest forward in this request */
        bool activation_known;
    } component[CDF_PLAN_MAX_COMPONENTS];
    struct {
        uint64_t weights_bytes, activation_bytes, peak_bytes;
    } phase[CDF_PHASE_COUNT];
    uint64_t peak_bytes;          /* the largest phase */
    uint64_t total_weights_bytes; /* every model */
    uint64_t largest_weights_bytes;
    /* the transformer's repeated blocks (with SEQUENTIAL only the block running is resident) */
    int n_blocks;
    uint64_t blocks_weights_bytes, largest_block_bytes;
} cdf_memory_plan;
/* gp may be NULL (defaults); its 0/negative fields take the pipeline defaults. */
cdf_status cdf_pipeline_plan_memory(const char *dir, const cdf_pipeline_load_params *lp, const cdf_generate_params *gp,
                                    cdf_memory_plan *out);
/* The same for a given execution (cdf_pipeline_plan_memory plans CDF_PLAN_EAGER). */
cdf_status cdf_pipeline_plan_memory_exec(const char *dir, const cdf_pipeline_load_params *lp, const cdf_generate_params *gp,
                                         cdf_plan_execution exec, cdf_memory_plan *out);

#ifdef __cplusplus
}
#endif
#endif
