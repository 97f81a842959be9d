/* Private pipeline state shared by the pipeline implementations. */
#ifndef CDF_PIPELINE_IMPL_H
#define CDF_PIPELINE_IMPL_H

#include <cjson/cJSON.h>

#include "cdiffusers/pipeline.h"
#include "cdiffusers/rng.h"
#include "cdiffusers/scheduler.h"
#include "cdiffusers/tokenizer.h"
#include "models/component.h"

typedef enum cdf_pipeline_kind { CDF_PIPE_FLUX = 1, CDF_PIPE_SD3 = 2, CDF_PIPE_FLUX2 = 3 } cdf_pipeline_kind;

#define CDF_PIPE_MAX_TEXT 3

/* Most text_encoder_out_layers a FLUX.2 request may list (the default, (10, 20, 30), is
 * CDF_FLUX2_TEXT_LAYERS_DEFAULT in models/mistral3_text.h). */
#define CDF_FLUX2_MAX_OUT_LAYERS 16

/* A pipeline class: what model_index.json's _class_name selects. Each per-model pipeline file
 * defines one (flux_pipeline.c, sd3_pipeline.c, flux2_pipeline.c); pipeline.c lists them and
 * calls down through `generate`, so no per-model file calls back into pipeline.c. */
typedef struct cdf_pipeline_class {
    const char *name; /* model_index.json _class_name */
    cdf_pipeline_kind kind;
    /* one image of a resolved, validated request, inside the caller's tensor scope */
    cdf_status (*generate)(cdf_pipeline *p, const cdf_generate_params *gp, cdf_image *out);
} cdf_pipeline_class;
extern const cdf_pipeline_class cdf_flux_pipeline_class, cdf_sd3_pipeline_class, cdf_flux2_pipeline_class;

struct cdf_pipeline {
    const cdf_pipeline_class *cls;
    cdf_pipeline_kind kind; /* cls->kind */
    char class_name[64];
    char *dir;
    cdf_device *device;
    cdf_load_options opt;
    /* cdf_pipeline_load_params.component_files, copied */
    int n_files;
    char *file_key[8], *file_path[8];
    bool allow_unused_keys;
    cdf_weights_report report; /* of the component being loaded */
    /* text side: tokenizer[i] feeds text_encoder[i] (NULL where the folder has none) */
    cdf_tokenizer *tokenizer[CDF_PIPE_MAX_TEXT];
    cdf_component *text_encoder[CDF_PIPE_MAX_TEXT];
    cdf_component *transformer;
    cdf_component *vae;
    cdf_scheduler_config sched_cfg;
    /* derived from the configs */
    int vae_scale_factor;        /* 2^(len(vae block_out_channels) - 1) */
    double vae_scaling_factor, vae_shift_factor;
    int64_t latent_channels;     /* transformer in_channels (SD3) or in_channels/4 (Flux) */
    int64_t default_sample_size; /* in latent pixels */
    bool guidance_embeds;        /* Flux dev */
    int64_t joint_attention_dim;
    /* model offload and per-phase memory (offload.c) */
    cdf_offload_mode offload;
    bool tracking;                 /* inside cdf_pipeline_generate */
    cdf_component *active;         /* the component that ran last during generate */
    int phase;                     /* cdf_pipeline_phase of the running part of generate */
    int loads_at_start;
    cdf_pipeline_memory_stats mem; /* of the last generate */
    /* prefetch (offload.c): the planned peak of each phase when the next phase's model is
     * materialised during it (cdf_memory_plan.phase[].prefetch_peak_bytes; 0: never), and the
     * bytes in use when generate began (the budget left is the limit less these) */
    uint64_t prefetch_peak[CDF_PHASE_COUNT];
    uint64_t base_bytes;
    /* the request fields the plan above was made for: later images of the same shape reuse it */
    char prefetch_key[320];
    uint64_t prefetch_key_peak[CDF_PHASE_COUNT];
    /* called by the denoising loop (denoise.c) once the last step's transformer forward is
     * queued; offload.c sets it (a pointer, not a call: offload.c depends on the planner, which
     * depends on the loop's files): it prefetches the VAE then, when that fits, so the load
     * overlaps the step's compute even when the loop then waits for the step (a progress
     * callback). NULL: nothing to do. */
    cdf_status (*last_forward_queued)(cdf_pipeline *p);
    /* tests / calibration: device budget per phase during generate (0 = the device's own) */
    bool phase_limit_active;
    uint64_t phase_limit[CDF_PHASE_COUNT];
    uint64_t saved_limit;
    /* LoRA adapters (lora.c): how each loaded one was applied */
    int n_lora;
    cdf_lora_mode lora_mode[16];
    /* the batch row being generated (cdf_pipeline_generate_images): with one generator, image k
     * takes the k-th (1, ...) slice of the noise */
    int64_t batch_row, batch_rows;
    /* a seed list with an input image: the VAE's latent sample comes from a generator seeded with
     * encode_seed (the list's first), not from the image's own (diffusers encodes the one image with
     * generator[0] and only the noise rows use their own generators) */
    bool encode_seed_set;
    uint64_t encode_seed;
    /* the running request's VAE tile in pixels (0: untiled), set by cdf_pipe_vae_tiling_resolve */
    int64_t vae_tile;
    /* the last generate's step-cache report per image (step_cache.c; NULL: no cache), and the
     * index of the image being generated */
    char **cache_reports;
    int n_cache_reports, image_index;
};

/* The class of model_index.json's entry `key` (["library", "Class"]): *cls = NULL when the
 * component is absent (key missing, null, or [null, null]); any other shape is CDF_ERR_FORMAT,
 * naming the entry (the loader and the planner both read the index through this). */
/* single_file.c: a whole pipeline from one all-in-one file. The text encoder part of an
 * all-in-one file a component reads ("clip_l", "clip_g", "t5xxl"; NULL for others):
 * text_encoder CLIP-L, text_encoder_2 T5-XXL (FLUX.1) or CLIP-G (SD3), text_encoder_3 T5-XXL. */
const char *cdf_pipe_text_part(const char *key, bool second_is_t5);
typedef struct cdf_pipe_single_file {
    char model[32];          /* the known model recognised ("flux1-dev", ...), "" if none */
    char config_dir[4096];   /* configs and tokenizers: the given folder or the shipped one */
    char keys[5][16];        /* the components the file gives */
    int n;
    cdf_component_file files[8]; /* the user's component files, then the file for each key */
} cdf_pipe_single_file;
/* Recognises the file, finds its configs and checks the file's shapes against them and that it
 * holds every component the pipeline needs and `given` does not supply (headers only). */
cdf_status cdf_pipe_single_file_resolve(const char *path, const char *config, const cdf_component_file *given, int n_given,
                                        cdf_pipe_single_file *out);
/* lp with the file as every component's weights (out->component_files points into sf). */
cdf_status cdf_pipe_single_file_params(const char *path, const cdf_pipeline_load_params *lp, cdf_pipe_single_file *sf,
                                       cdf_pipeline_load_params *out);

/* params.c: model_index.json's class entries; the request's defaults (cdf_pipeline_resolve_defaults
 * is public). */
cdf_status cdf_model_index_class(const char *dir, const cJSON *idx, const char *key, const char **cls);

/* steps.c: the shared steps */
cdf_status cdf_pipe_tokenize(cdf_pipeline *p, int which, const char *text, int max_length, cdf_tensor **ids);
/* Image out: the VAE's output (x / 2 + 0.5).clamp(0, 1) -> uint8 HWC with numpy's
 * round-half-even, batch element 0; decode_input, decoded and the float image captured
 * ("vae_decode_input", "vae_decode_output", "image"). decoded NULL: the last error. */
cdf_status cdf_pipe_image_out(const cdf_generate_params *gp, cdf_tensor *decode_input, cdf_tensor *decoded, cdf_image *out);
/* x / scaling_factor + shift_factor (as float32 ops, like torch) then vae.decode; without the
 * shift when !with_shift (what StableDiffusion3InpaintPipeline does). */
cdf_tensor *cdf_pipe_vae_decode(cdf_pipeline *p, cdf_tensor *latents, bool with_shift, cdf_tensor **decode_input);
/* vae_tiling.c: the request's vae_tiling / vae_tile_size checked (validate); resolved into
 * p->vae_tile before a generate (AUTO asks the planner against the device budget and says on
 * stderr when it tiles). steps.c: the VAE component inputs for it, added to a decode / encode call. */
cdf_status cdf_pipe_vae_tiling_check(const cdf_pipeline *p, const cdf_generate_params *gp);
void cdf_pipe_vae_tiling_resolve(cdf_pipeline *p, const cdf_generate_params *gp);
cdf_status cdf_pipe_vae_tiling_inputs(cdf_pipeline *p, cdf_tensor_map *in);
/* latents + (sigma_next - sigma) * v in float32. */
cdf_tensor *cdf_pipe_euler_step(cdf_tensor *latents, cdf_tensor *v, float sigma, float sigma_next);
/* u + g * (c - u). */
cdf_tensor *cdf_pipe_cfg(cdf_tensor *uncond, cdf_tensor *cond, float g);
void cdf_pipe_capture(const cdf_generate_params *gp, const char *key, cdf_tensor *t);
/* The schedule's sigmas (N + 1) and timesteps (N, the request's steps) as "sigmas", "timesteps". */
void cdf_pipe_capture_schedule(const cdf_pipeline *p, const cdf_generate_params *gp, const float *sigmas, const float *timesteps);
cdf_tensor *cdf_pipe_scalar_tensor(cdf_device *dev, float v, int64_t n);

/* offload.c: make a freshly loaded component offloadable (and release it with CDF_OFFLOAD_MODEL);
 * bracket generate (per-phase peaks, and with MODEL release every model at the end). */
cdf_status cdf_pipe_offload_adopt(cdf_pipeline *p, cdf_component *c, const char *dir, const char *key);
/* The load options of component `key` (model_index name) under the pipeline's offload mode. */
cdf_load_options cdf_pipe_load_options(const cdf_pipeline *p, const char *key);
void cdf_pipe_generate_begin(cdf_pipeline *p);
/* With offload (and CDIFFUSERS_OFFLOAD_PREFETCH not 0), after generate_begin: the request's plan
 * (planner.c), which phase changes may materialise the next model early and at what peak. */
void cdf_pipe_prefetch_resolve(cdf_pipeline *p, const cdf_generate_params *gp);

cdf_status cdf_pipe_generate_end(cdf_pipeline *p, cdf_status s);
/* step_cache.c: a fresh step-cache report slot for each of the request's n images
 * (cdf_pipeline_cache_report; p->image_index names the image being generated). */
cdf_status cdf_pipe_cache_reports_reset(cdf_pipeline *p, int n);
/* planner.c: before loading, CDF_ERR_OUT_OF_MEMORY if the weights cannot fit the device budget
 * (all of them with NONE, the largest with MODEL); the message says needed vs allowed. */
cdf_status cdf_pipe_check_budget(cdf_pipeline *p, const cJSON *model_index);

/* lora.c: load a LoRA file into named components (the pipeline's, or a test's bare
 * transformer) as adapter `id`. */
typedef struct cdf_lora_components {
    int n;
    const char *name[4]; /* "transformer", "text_encoder", ... */
    cdf_component *c[4]; /* NULL = absent */
    bool materialise;    /* offload: load the released models the file names before matching */
} cdf_lora_components;
cdf_status cdf_lora_load_into(const cdf_lora_components *cs, const char *path, const cdf_lora_params *params, int id,
                              cdf_lora_info *info);
/* ---- denoise.c: the shared loop and the img2img / inpainting start -------------------------- */
/* One output of a component run, kept alive in the current scope. */
cdf_tensor *cdf_pipe_take(cdf_tensor_map *out, const char *key);
/* get_timesteps: the first schedule index that runs for a strength. */
int cdf_pipe_t_start(int num_steps, double strength);
/* The schedule each pipeline sets for a resolved request (gp->height/width/num_inference_steps):
 * the mu its dynamic shifting gets from the image size (FLUX.1 calculate_shift of the packed
 * token count, FLUX.2 compute_empirical_mu of the token count and steps, SD3 calculate_shift
 * only with use_dynamic_shifting; *has_mu false = None), set_timesteps with the Flux pipelines'
 * linspace(1, 1/N, N) sigmas or SD3's default, and the start index of img2img / inpainting
 * (0 without an image, and always 0 for FLUX.2's reference images). Every decision in doubles
 * as the Python makes it (docs/fidelity.md). The schedule is captured ("sigmas", "timesteps").
 * *sched: free with cdf_scheduler_free. */
typedef struct cdf_pipe_schedule_info {
    int t_start;
    bool has_mu;
    double mu;
    int64_t image_seq_len; /* the token count mu was computed from (0 = none) */
} cdf_pipe_schedule_info;
cdf_status cdf_pipe_schedule(const cdf_pipeline *p, const cdf_generate_params *gp, cdf_scheduler **sched,
                             cdf_pipe_schedule_info *info);
/* Its mu and image_seq_len alone (t_start 0), without making the scheduler. */
void cdf_pipe_schedule_mu(const cdf_pipeline *p, const cdf_generate_params *gp, cdf_pipe_schedule_info *info);
/* scheduler.scale_noise: sigma * noise + (1 - sigma) * sample (float32). */
cdf_tensor *cdf_pipe_scale_noise(cdf_tensor *sample, cdf_tensor *noise, float sigma);
/* Row `row` of randn((rows, *shape)) drawn from g (one generator for a batch of `rows`). */
cdf_status cdf_pipe_draw(cdf_pipeline *p, cdf_generator *g, int ndim, const int64_t *shape, int64_t row, int64_t rows,
                         cdf_tensor **out);
/* img2img: gp->image preprocessed and encoded, latent sampled from g: (sample - shift) * scale,
 * [1, C, h, w]. */
cdf_status cdf_pipe_encode_image(cdf_pipeline *p, const cdf_generate_params *gp, cdf_generator *g, int64_t h, int64_t w,
                                 cdf_tensor **image_latents);
/* inpainting: the latent-grid mask (and 1 - mask), packed for Flux ([1, h/2*w/2, C*4]) or not. */
cdf_status cdf_pipe_prepare_mask(cdf_pipeline *p, const cdf_generate_params *gp, int64_t h, int64_t w, bool packed,
                                 cdf_tensor **mask, cdf_tensor **inv_mask);
/* Start latents (unpacked [1, C, h, w]) for batch row p->batch_row: text-to-image = noise;
 * with an image = scale_noise(image latents, noise, sigmas[t_start]) (the VAE sample drawn first,
 * from the same generator). */
typedef struct cdf_pipe_start {
    int t_start;
    cdf_tensor *latents, *noise, *image_latents; /* unpacked; image_latents NULL for text-to-image */
} cdf_pipe_start;
cdf_status cdf_pipe_start_latents(cdf_pipeline *p, const cdf_generate_params *gp, int64_t c, int64_t h, int64_t w,
                                  const float *sigmas, int t_start, cdf_pipe_start *st);
typedef struct cdf_denoise_loop {
    const float *timesteps, *sigmas; /* the whole schedule of set_timesteps (num_steps, num_steps + 1) */
    int num_steps, t_start;          /* steps t_start .. num_steps-1 run */
    cdf_tensor *latents;             /* in: start latents; out: final latents */
    /* the velocity for `latents` at schedule index i (CFG and the model's inputs are the pipeline's) */
    cdf_tensor *(*predict)(void *ctx, cdf_tensor *latents, int i, float t);
    void *ctx;
    /* inpainting (all NULL otherwise), in the loop's layout: latents = inv_mask * x0 + mask * latents
     * after every step, x0 = scale_noise(image_latents, noise, sigmas[i + 1]) (image_latents after
     * the last step) */
    cdf_tensor *mask, *inv_mask, *image_latents, *noise;
    const char *step_key; /* capture key of the latents after step k ("%d"), or NULL */
} cdf_denoise_loop;
cdf_status cdf_pipe_denoise(cdf_pipeline *p, const cdf_generate_params *gp, cdf_denoise_loop *loop);
/* image_input.c: request checks, VaeImageProcessor.preprocess (PIL Lanczos resize) */
cdf_status cdf_pipe_check_inputs(const cdf_generate_params *gp, bool references);
/* FLUX.2 reference image: its size after Flux2Pipeline's area limit and crop, and the pixels. */
void cdf_pipe_reference_size(const cdf_image *img, int *w, int *h);
cdf_status cdf_pipe_preprocess_reference(const cdf_image *img, float **chw, int *W, int *H);
cdf_status cdf_pipe_preprocess_image(const cdf_image *img, int W, int H, float **chw);
cdf_status cdf_pipe_preprocess_mask(const cdf_image *m, int W, int H, float **hw);


#endif
