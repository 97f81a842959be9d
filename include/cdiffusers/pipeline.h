/* cdiffusers — text-to-image pipelines loaded from ordinary diffusers folders
 * (model_index.json + component sub-folders): FluxPipeline, StableDiffusion3Pipeline, Flux2Pipeline. */
#ifndef CDIFFUSERS_PIPELINE_H
#define CDIFFUSERS_PIPELINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cdiffusers/capture.h"
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

/* One component's weights from a single file in place of its sub-folder's: component is the
 * model_index.json name ("transformer", "vae", "text_encoder_2", ...), path a .safetensors
 * file (diffusers key names, or BFL FLUX names with or without ComfyUI's
 * "model.diffusion_model." prefix, converted like diffusers' single-file loader; fp8 and
 * fp8_scaled included) or a .gguf file (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K,
 * dequantized to the load dtype when loaded). The sub-folder still gives config.json. */
typedef struct cdf_component_file {
    const char *component;
    const char *path;
} cdf_component_file;

typedef struct cdf_pipeline_load_params {
    const char *device;       /* "cpu", "cpu:0", ...; NULL (default) = the best device available */
    cdf_dtype weight_dtype;   /* CDF_BF16 (default): bf16 weights, matmul/conv inputs rounded to bf16,
                                 f32 accumulation, f32 elsewhere; CDF_F32: the exact path */
    cdf_offload_mode offload; /* CDF_OFFLOAD_NONE (default). With NONE, a device budget smaller than
                                 the weights fails the load before anything is loaded
                                 (CDF_ERR_OUT_OF_MEMORY: needed vs allowed, suggests MODEL) */
    const cdf_component_file *component_files; /* NULL / 0: every component from its folder */
    int num_component_files;
    bool allow_unused_keys; /* a component file's tensors the model does not read are an error
                               (CDF_ERR_FORMAT listing them) unless this is set */
    bool decode_quantized;  /* GGUF block weights (Q8_0, Q4_K, ...): false (default) keeps a linear
                               layer's blocks in memory and decodes them inside its matmul, a panel
                               at a time; true decodes them to weight_dtype at load (more memory,
                               the same numbers) */
    uint32_t quantize_weights; /* 0 (default), CDF_GGML_Q8_0 or CDF_GGML_Q4_K (cdiffusers/io.h):
                                  every linear layer's float weight with a whole number of blocks
                                  (32 / 256 values) per row is quantized at load (cdf_ggml_quantize)
                                  and kept as blocks; other layers stay float */
    const char *config;     /* cdf_pipeline_load's path a single all-in-one file: a diffusers folder
                               giving model_index.json, the configs and the tokenizers (its weights
                               are not read), as diffusers' from_single_file(config=); NULL (default):
                               the configs shipped for the model the file is recognised as
                               (models/configs/<name>, found through $CDIFFUSERS_CONFIGS or the
                               source tree). Must be NULL with a folder. */
} cdf_pipeline_load_params;
cdf_pipeline_load_params cdf_pipeline_load_params_default(void);

/* Load a pipeline folder, or one all-in-one file holding every component (ComfyUI's
 * "model.diffusion_model." / "vae." / "text_encoders.<clip_l|clip_g|t5xxl>.transformer." or
 * Stability's "first_stage_model." layout; params->config or the shipped configs give the rest;
 * component_files may supply what the file lacks). Errors name the folder/sub-folder/file that
 * is wrong; a file that lacks a component names the component and the option that supplies it. */
cdf_status cdf_pipeline_load(const char *dir, const cdf_pipeline_load_params *params, cdf_pipeline **out);
/* What cdf_pipeline_load of a single file would use, from the headers alone: the known model
 * the file is recognised as ("flux1-dev", "flux1-schnell", "sd3-medium", "sd3.5-medium",
 * "sd3.5-large", "flux2-dev"; "" if none and config is given) and the config folder, after
 * checking the file's shapes against that config (CDF_ERR_SHAPE), that it holds every
 * component (CDF_ERR_NOT_FOUND) and that it is a known model (CDF_ERR_UNSUPPORTED). config:
 * NULL or a diffusers folder, as cdf_pipeline_load_params.config. */
cdf_status cdf_pipeline_single_file_model(const char *path, const char *config, char *model, size_t model_n, char *config_dir,
                                          size_t dir_n);
void cdf_pipeline_free(cdf_pipeline *p);
/* "FluxPipeline", "StableDiffusion3Pipeline", "Flux2Pipeline". */
const char *cdf_pipeline_class_name(const cdf_pipeline *p);
/* The step cache of image `image` (0-based) of the last cdf_pipeline_generate /
 * cdf_pipeline_generate_images call: its name and settings and which denoising steps ran the
 * whole transformer ("first-block:0.05, full steps 0,1,4,9 (4 of 10)"; with true CFG per pass,
 * "cond ..., uncond ..."; TaylorSeer: the steps whose attention was computed; MagCache's
 * calibration: then ", calibrated mag_ratios [1.0, ...]" per pass). Each image of a
 * batch decides on its own (docs/step-caches.md). NULL when it ran without a cache (or no such
 * image). Owned by the pipeline, valid until the next generate. */
const char *cdf_pipeline_cache_report(const cdf_pipeline *p, int image);
/* Checks a step-cache string (cdf_generate_params.cache) without a pipeline: CDF_OK, or the
 * error generate would give for it. */
cdf_status cdf_pipeline_cache_check(const char *cache);

/* Called after each denoising step; return false to cancel (generate then fails with
 * CDF_ERR_INTERRUPTED). */
typedef bool (*cdf_step_callback)(int step, int num_steps, double step_seconds, void *user);

typedef struct cdf_image cdf_image;

/* FLUX.2 reference images per request (the FLUX.2 model card's limit). */
#define CDF_FLUX2_MAX_REFERENCE_IMAGES 10

typedef struct cdf_generate_params {
    const char *prompt;
    const char *negative_prompt; /* NULL = none (SD3 with CFG encodes "") */
    int height, width;           /* 0 = the model's default size */
    int num_inference_steps;     /* 0 = the pipeline default (28; Flux2 50) */
    /* Doubles, as the Python floats diffusers decides with (SD3 guides with CFG when
     * guidance_scale > 1, Flux when true_cfg_scale > 1 with a negative prompt); the model sees them
     * as float32, as torch does. */
    double guidance_scale;       /* < 0 = pipeline default (Flux 3.5, SD3 7.0, Flux2 4.0) */
    double true_cfg_scale;       /* Flux only; 1 = off */
    uint64_t seed;
    int max_sequence_length;     /* 0 = pipeline default (Flux 512, SD3 256) */
    /* FLUX.2 only: the text encoder's hidden states stacked into the prompt embedding
     * (Flux2Pipeline text_encoder_out_layers); NULL / 0 = the default (10, 20, 30). */
    const int *text_encoder_out_layers;
    int num_text_encoder_out_layers;
    /* img2img / inpainting (diffusers' FluxImg2ImgPipeline, StableDiffusion3Img2ImgPipeline,
     * FluxInpaintPipeline, StableDiffusion3InpaintPipeline): the start image, 8-bit RGB
     * (channels 3), any size: resized to height x width as diffusers' VaeImageProcessor does
     * (PIL Lanczos) and encoded by the VAE with a latent *sample* drawn from the generator before
     * the noise. NULL = text-to-image. height/width 0 = the image's size rounded down to a
     * multiple of 16 (diffusers would use the model's default size).
     * FLUX.2 (Flux2Pipeline's `image`): reference images the prompt refers to, an array of
     * num_input_images (up to CDF_FLUX2_MAX_REFERENCE_IMAGES), each at least 64 pixels a side
     * with an aspect ratio up to 8; each is scaled down to at most 1024x1024 pixels of area,
     * center-cropped to multiples of 16 and encoded (the VAE mean: no draw); height/width 0 =
     * the first one's size; strength and mask do not apply. */
    const cdf_image *image;
    int num_input_images; /* images at `image` (0 with image set = 1); Flux/SD3 take one */
    /* Inpainting: white (>= 0.5 after the resize) = repaint, black = keep. 1 (gray) or 3
     * (RGB, converted as PIL's convert("L")) channels, the same size as image. */
    const cdf_image *mask_image;
    /* (0, 1], default 0.6: how much of the schedule runs (diffusers' get_timesteps). A double, as
     * the Python float diffusers computes with: the start step int(N - min(N * strength, N)) can
     * change with the float rounding of the strength (5 * 0.6 is 3.0, 5 * 0.6f is 3.0000001). */
    double strength;
    /* Batches (cdf_pipeline_generate_images): num_images images from ONE generator seeded with
     * `seed` (diffusers' num_images_per_prompt: the noise is drawn as one (N, ...) tensor), or,
     * with seeds, one image per seed from its own generator (a list of generators; each image
     * equals its single-seed image, except that an img2img / inpainting input image is encoded
     * with the first seed's generator, as diffusers does; SD3 img2img refuses a list of two or
     * more, diffusers fails on it). 0 = 1 image. */
    int num_images;
    const uint64_t *seeds;
    int num_seeds;
    /* VAE tiling (diffusers' pipe.vae.enable_tiling()): decode (and img2img's encode) in
     * overlapping tiles blended together, so the VAE's peak memory stops growing with the image;
     * the picture differs slightly from the untiled one, exactly as diffusers' tiled output does.
     * AUTO (default): untiled, unless the device has a budget (--device-memory) and the planner
     * says the untiled decode would not fit in what is free; then tiles that fit, with a note on
     * stderr. ON: always (tiles of vae_tile_size pixels; 0 = the VAE config's sample_size, as
     * enable_tiling() does; an image no larger than one tile is not tiled). OFF: never. */
    int vae_tiling;    /* cdf_vae_tiling_mode */
    int vae_tile_size; /* pixels, a multiple of 4 x the VAE's downscaling factor; 0 = default */
    /* Step cache (docs/step-caches.md): NULL, "" or "none" = off; "first-block" or
     * "first-block:THRESHOLD" = diffusers' First Block Cache (FirstBlockCacheConfig(threshold),
     * default 0.05; FLUX.1); "mag[:key=value,...]" = MagCacheConfig (FLUX.1, FLUX.2; mag_ratios
     * "[r0, r1, ...]", default FLUX_MAG_RATIOS; calibrate=True prints the measured ratios on stdout
     * as diffusers does); "taylorseer[:key=value,...]" = TaylorSeerCacheConfig (FLUX.1; also
     * use_lite_mode=True). Another string, or a cache the model cannot take, is an error. */
    const char *cache;
    /* Several prompts (diffusers' prompt=[...]): num_prompts strings used in place of prompt, and
     * NULL or num_prompts negative prompts (else negative_prompt for all). A request then makes
     * num_prompts x num_images images, prompt-major (image k has prompt k / num_images); with one
     * generator the noise is one (num_prompts x num_images, ...) draw, as diffusers' batch; with
     * seeds, num_seeds must be num_prompts x num_images (one generator per image). */
    const char *const *prompts;
    const char *const *negative_prompts;
    int num_prompts;
    /* Precomputed text embeddings (diffusers' prompt_embeds=, pooled_prompt_embeds=,
     * negative_prompt_embeds=, negative_pooled_prompt_embeds=): float tensors on any device, of
     * FluxPipeline's / StableDiffusion3Pipeline's encode_prompt shapes with a batch of 1 or of the
     * number of prompts ([B, L, joint_attention_dim] and [B, pooled_projection_dim]; their
     * batch sets the number of prompts when prompts is NULL). prompt_embeds replaces the prompt
     * (pooled_prompt_embeds is then required); the negative ones replace the negative prompt (Flux:
     * true CFG needs both). NULL (default): the prompts are encoded. */
    const struct cdf_tensor *prompt_embeds, *pooled_prompt_embeds;
    const struct cdf_tensor *negative_prompt_embeds, *negative_pooled_prompt_embeds;
    cdf_step_callback callback;
    void *callback_user;
    /* If non-NULL: receives intermediates under the golden keys (noise, latents_initial,
     * latents_final, prompt_embeds, pooled_prompt_embeds, timesteps, sigmas, vae_decode_output,
     * image, ...): a cdf_capture (cdiffusers/capture.h). */
    cdf_capture *capture;
} cdf_generate_params;
cdf_generate_params cdf_generate_params_default(void);
typedef enum cdf_vae_tiling_mode { CDF_VAE_TILING_AUTO = 0, CDF_VAE_TILING_ON = 1, CDF_VAE_TILING_OFF = 2 } cdf_vae_tiling_mode;

struct cdf_image {
    int width, height, channels; /* channels = 3 for generated images */
    uint8_t *pixels;             /* row-major HWC, malloc'ed; free with cdf_image_free */
};
void cdf_image_free(cdf_image *img);

/* Run the whole pipeline: prompt -> image. Validates the request (sizes, steps) before
 * allocating anything large. */
cdf_status cdf_pipeline_generate(cdf_pipeline *p, const cdf_generate_params *params, cdf_image *out);
/* The number of images a request makes (num_seeds if seeds, else max(num_images, 1) x the number
 * of prompts). */
int cdf_generate_params_count(const cdf_generate_params *params);
/* A batch: out[0 .. count-1] (count = cdf_generate_params_count, n_out must equal it). With
 * params->capture, image k's intermediates are also stored under "k.<key>". On failure no image
 * is returned (all freed). cdf_pipeline_generate refuses a request of more than one image. */
cdf_status cdf_pipeline_generate_images(cdf_pipeline *p, const cdf_generate_params *params, cdf_image *out, int n_out);

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

/* ---- LoRA adapters ------------------------------------------------------------------------
 * Files in diffusers/PEFT ("transformer.<module>.lora_A.weight" + ".alpha"; what ai-toolkit
 * writes too) or kohya ("lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight" + ".alpha",
 * "lora_te1_..." for the first text encoder) format, detected from the key names as diffusers'
 * lora_state_dict does. Run time (default): PEFT's y = W x + b + scale * (alpha/r) * B(A x), W
 * untouched, the scale changes without reloading or recompiling. Fuse: W += scale * (alpha/r) *
 * B A once at load (diffusers' fuse_lora), fastest, the scale is fixed. Several adapters can be
 * loaded; their contributions add up. With offload they are re-applied whenever a model is
 * materialised again (fuse + sequential offload is refused). With tensor parallelism (cdf_tp_enable)
 * each rank applies its slice of every adapter to its shard, in both modes. */
typedef enum cdf_lora_mode { CDF_LORA_RUNTIME = 0, CDF_LORA_FUSE = 1 } cdf_lora_mode;
typedef struct cdf_lora_params {
    float scale;        /* 1 */
    cdf_lora_mode mode; /* CDF_LORA_RUNTIME */
    bool allow_unused;  /* false: keys that match no layer of the pipeline fail the load (the
                           message lists them); true: they are ignored with a warning on stderr */
} cdf_lora_params;
cdf_lora_params cdf_lora_params_default(void);
typedef struct cdf_lora_info {
    int adapter;       /* the id for cdf_pipeline_set_lora_scale */
    int layers;        /* linear layers the adapter changed (all components) */
    int unused_keys;   /* keys ignored (allow_unused) */
    const char *format; /* "diffusers" or "kohya" (static string) */
} cdf_lora_info;
/* Load an adapter. Validates the whole file against the pipeline's layers (shapes, ranks,
 * finite values, known keys) before changing anything: a failed load leaves the pipeline as it
 * was. info may be NULL. */
cdf_status cdf_pipeline_load_lora(cdf_pipeline *p, const char *path, const cdf_lora_params *params, cdf_lora_info *info);
/* Change a run-time adapter's scale (finite). A fused adapter's scale is fixed: CDF_ERR_UNSUPPORTED. */
cdf_status cdf_pipeline_set_lora_scale(cdf_pipeline *p, int adapter, float scale);
/* Remove every adapter. Fused ones are taken out of the weights (diffusers' unfuse_lora): each
 * fused layer's weight is read again from the files the model was loaded from (a tensor-parallel
 * rank reads only its slice), so the weights are the loaded ones bit for bit. Only if that read
 * fails (the files are gone) is the delta subtracted instead (W -= scale * (alpha/r) * B A, the
 * same product that was added, in f32, stored in W's dtype; a warning on stderr): the original
 * weights up to one rounding per element. */
cdf_status cdf_pipeline_unload_lora(cdf_pipeline *p);
int cdf_pipeline_lora_count(const cdf_pipeline *p);

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
    /* phase changes at which offload materialised the next phase's model while the previous
     * model's queued work still ran (prefetch: cdf_memory_plan.phase[].prefetch says when) */
    int prefetches;
    /* the device peak while the next model was materialised during each phase (0: it was not):
     * at most the plan's phase[].prefetch_peak_bytes (offload.c holds the prefetch to it) */
    uint64_t prefetch_peak_bytes[CDF_PHASE_COUNT];
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
        /* Offload prefetch (MODEL / SEQUENTIAL): the next phase's model (text encoding: the
         * transformer, denoising: the VAE) is materialised at the phase change before this
         * phase's last queued work has finished, so its weights join this phase's last forward
         * at its peak. prefetch_peak_bytes is this phase's peak then (0: no next model, offload
         * NONE); generate prefetches when it fits the budget left (the device limit, else its
         * memory, less what is in use when generate starts) and CDIFFUSERS_OFFLOAD_PREFETCH is
         * not 0. prefetch: the plan's budget holds it, and peak_bytes (weights_bytes: both
         * models) is it. */
        uint64_t prefetch_peak_bytes;
        bool prefetch;
    } phase[CDF_PHASE_COUNT];
    uint64_t peak_bytes;          /* the largest phase (with the prefetches the budget holds) */
    uint64_t need_bytes;          /* the largest phase without prefetch: the smallest budget under
                                     which generate runs (prefetch happens only where it fits) */
    uint64_t budget_bytes;        /* the budget the prefetches were decided with (0: none planned) */
    uint64_t cache_bytes;         /* gp->cache's state kept across steps (in the denoising phase's activations) */
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
/* The same with offload's prefetch decided for a device budget of budget_bytes available to the
 * run (UINT64_MAX: unlimited; 0: no prefetch planned, what cdf_pipeline_plan_memory_exec does).
 * cdf_pipeline_generate decides the same way with the device's limit (or memory) at that time. */
cdf_status cdf_pipeline_plan_memory_budget(const char *dir, const cdf_pipeline_load_params *lp, const cdf_generate_params *gp,
                                           cdf_plan_execution exec, uint64_t budget_bytes, cdf_memory_plan *out);

#ifdef __cplusplus
}
#endif
#endif
