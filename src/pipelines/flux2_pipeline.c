/* Flux2Pipeline (FLUX.2-dev text-to-image), as diffusers' pipelines/flux2/pipeline_flux2.py at
 * 58eb52c computes it:
 *
 *   ids, mask     = chat-template prompt, tekken BPE, padded to max_sequence_length
 *   prompt_embeds = cat(hidden_states[k] for k in text_encoder_out_layers)   [1, S, 3 * hidden]
 *   text_ids      = (0, 0, 0, l)                                              [1, S, 4]
 *   noise         = randn(1, in_channels, h, w) from the seeded CPU generator, h = H / 16
 *   latents       = pack(noise) [1, h*w, in_channels];  latent_ids = (0, row, col, 0)
 *   sigmas        = linspace(1, 1/N, N), shifted with mu = compute_empirical_mu(h*w, N)
 *   N steps:  v = transformer(latents, t / 1000, guidance, prompt_embeds, text_ids, latent_ids)
 *             latents += (sigma_next - sigma) * v
 *   image         = vae.decode(unpatchify(unpack(latents) * sqrt(bn_var + eps) + bn_mean))
 *
 * With reference images (Flux2Pipeline's `image`), their encoded tokens are appended to the
 * latents at every step (ids with T = 10, 20, ...) and the prediction keeps the first h*w tokens.
 * Caption upsampling is not implemented. */
#include "pipelines/flux2_pipeline.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "models/autoencoder_kl_flux2.h"
#include "models/mistral3_text.h"
#include "pipelines/step_cache.h"
#include "tensor/tensor_impl.h"
#include "tokenizers/flux2_prompt.h"

static cdf_status status_or_internal(void) { return cdf_last_status() ? cdf_last_status() : CDF_ERR_INTERNAL; }

#define take cdf_pipe_take

/* i64 tensor [1, rows, 4] from host values. */
static cdf_tensor *ids_tensor(cdf_device *dev, const int64_t *v, int64_t rows) {
    int64_t shape[3] = {1, rows, 4};
    return cdf_tensor_from_host(dev, CDF_I64, 3, shape, v, CDF_I64);
}

/* _prepare_text_ids: rows (0, 0, 0, l) for l < L. */
static cdf_tensor *text_ids(cdf_device *dev, int64_t L) {
    int64_t *v = calloc((size_t)L * 4, sizeof *v);
    if (!v) {
        cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (text ids)");
        return NULL;
    }
    for (int64_t l = 0; l < L; l++) v[l * 4 + 3] = l;
    cdf_tensor *t = ids_tensor(dev, v, L);
    free(v);
    return t;
}

/* _prepare_latent_ids: rows (0, row, col, 0), row-major over an h x w grid. */
static cdf_tensor *latent_ids(cdf_device *dev, int64_t h, int64_t w) {
    int64_t *v = calloc((size_t)(h * w) * 4, sizeof *v);
    if (!v) {
        cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (latent ids)");
        return NULL;
    }
    for (int64_t r = 0; r < h; r++)
        for (int64_t c = 0; c < w; c++) {
            v[(r * w + c) * 4 + 1] = r;
            v[(r * w + c) * 4 + 2] = c;
        }
    cdf_tensor *t = ids_tensor(dev, v, h * w);
    free(v);
    return t;
}

/* prompt -> input_ids, attention_mask [1, S] -> the text encoder's prompt_embeds [1, S, n * hidden]. */
static cdf_status encode_prompt(cdf_pipeline *p, const cdf_generate_params *gp, cdf_tensor **embeds) {
    *embeds = NULL;
    if (!p->tokenizer[0] || !p->text_encoder[0])
        return cdf_error(CDF_ERR_INVALID_ARG, "%s: this pipeline has no tokenizer/text encoder loaded", p->class_name);
    int layers[CDF_FLUX2_MAX_OUT_LAYERS] = CDF_FLUX2_TEXT_LAYERS_DEFAULT, n_layers = 3;
    if (gp->num_text_encoder_out_layers > 0) {
        if (!gp->text_encoder_out_layers || gp->num_text_encoder_out_layers > CDF_FLUX2_MAX_OUT_LAYERS)
            return cdf_error(CDF_ERR_INVALID_ARG, "text_encoder_out_layers: %d layers given (1..%d, with a list)",
                             gp->num_text_encoder_out_layers, CDF_FLUX2_MAX_OUT_LAYERS);
        n_layers = gp->num_text_encoder_out_layers;
        memcpy(layers, gp->text_encoder_out_layers, (size_t)n_layers * sizeof *layers);
    }
    const int S = gp->max_sequence_length;
    int64_t *ids = malloc((size_t)S * sizeof *ids), *mask = malloc((size_t)S * sizeof *mask);
    cdf_status s = ids && mask ? CDF_OK : cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (token ids)");
    int n_tokens = 0, n_untruncated = 0;
    if (s == CDF_OK)
        s = cdf_flux2_format_prompt(p->tokenizer[0], gp->prompt, strlen(gp->prompt), NULL, S, ids, mask, &n_tokens, &n_untruncated);
    cdf_tensor *ids_t = NULL, *mask_t = NULL, *layers_t = NULL;
    if (s == CDF_OK) {
        int64_t shape[2] = {1, S}, lv[CDF_FLUX2_MAX_OUT_LAYERS], ln[1] = {n_layers};
        for (int i = 0; i < n_layers; i++) lv[i] = layers[i];
        ids_t = cdf_tensor_from_host(p->device, CDF_I64, 2, shape, ids, CDF_I64);
        mask_t = cdf_tensor_from_host(p->device, CDF_I64, 2, shape, mask, CDF_I64);
        layers_t = cdf_tensor_from_host(p->device, CDF_I64, 1, ln, lv, CDF_I64);
        if (!ids_t || !mask_t || !layers_t) s = status_or_internal();
    }
    free(ids);
    free(mask);
    if (s != CDF_OK) return s;
    cdf_pipe_capture(gp, "input_ids", ids_t);
    cdf_pipe_capture(gp, "attention_mask", mask_t);

    cdf_tensor_map in, out;
    cdf_tensor_map_init(&in);
    cdf_tensor_map_init(&out);
    s = cdf_tensor_map_set(&in, "input_ids", ids_t);
    if (s == CDF_OK) s = cdf_tensor_map_set(&in, "attention_mask", mask_t);
    if (s == CDF_OK) s = cdf_tensor_map_set(&in, "text_encoder_out_layers", layers_t);
    if (s == CDF_OK) s = cdf_component_run(p->text_encoder[0], "forward", &in, &out);
    if (s == CDF_OK && !(*embeds = take(&out, "out.prompt_embeds"))) s = status_or_internal();
    cdf_tensor_map_clear(&in);
    cdf_tensor_map_clear(&out);
    if (s != CDF_OK) cdf_error_prefix("%s text encoder: ", p->class_name);
    return s;
}

/* The model side of one step. */
typedef struct flux2_step {
    cdf_pipeline *p;
    const cdf_generate_params *gp;
    cdf_tensor *embeds, *txt_ids, *img_ids, *guidance;
    cdf_tensor *ref_latents; /* reference image tokens appended to the latents, or NULL */
    int64_t seq;             /* the generated image's tokens (the part of the output the step uses) */
    cdf_step_cache cache;    /* --cache mag (step_cache.c): one context, as Flux2Pipeline sets none */
} flux2_step;

static cdf_tensor *flux2_predict(void *ctx, cdf_tensor *latents, int i, float t) {
    flux2_step *fs = ctx;
    cdf_tensor *timestep = cdf_pipe_scalar_tensor(fs->p->device, t / 1000.0f, 1); /* float32 division */
    cdf_tensor *v = NULL;
    cdf_tensor_map in, outm;
    cdf_tensor_map_init(&in);
    cdf_tensor_map_init(&outm);
    cdf_tensor *x = latents;
    if (fs->ref_latents) { /* [latents; reference tokens], their ids likewise (fs->img_ids) */
        cdf_tensor *two[2] = {latents, fs->ref_latents};
        x = cdf_cat(two, 2, 1);
    }
    cdf_status s = timestep && x ? cdf_tensor_map_set(&in, "hidden_states", x) : status_or_internal();
    if (s == CDF_OK) s = cdf_tensor_map_set(&in, "encoder_hidden_states", fs->embeds);
    if (s == CDF_OK) s = cdf_tensor_map_set(&in, "timestep", timestep);
    if (s == CDF_OK) s = cdf_tensor_map_set(&in, "img_ids", fs->img_ids);
    if (s == CDF_OK) s = cdf_tensor_map_set(&in, "txt_ids", fs->txt_ids);
    if (s == CDF_OK && fs->guidance) s = cdf_tensor_map_set(&in, "guidance", fs->guidance);
    if (s == CDF_OK && fs->cache.cfg.kind != CDF_STEP_CACHE_NONE) s = cdf_step_cache_predict(&fs->cache, fs->p->transformer, 0, &in, &v);
    else if (s == CDF_OK) s = cdf_component_run(fs->p->transformer, "forward", &in, &outm);
    if (s == CDF_OK && !v) v = take(&outm, "out.sample");
    if (v && fs->ref_latents) v = cdf_narrow(v, 1, 0, fs->seq); /* noise_pred[:, :latents.size(1)] */
    cdf_tensor_map_clear(&in);
    cdf_tensor_map_clear(&outm);
    if (v && fs->gp->capture) {
        char key[64];
        snprintf(key, sizeof key, "step%02d.transformer_timestep", i);
        cdf_pipe_capture(fs->gp, key, timestep);
        snprintf(key, sizeof key, "step%02d.noise_pred", i);
        cdf_pipe_capture(fs->gp, key, v);
    }
    return v;
}

/* Flux2Pipeline.prepare_image_latents: each reference image preprocessed, encoded (the VAE mean,
 * patchified and BatchNorm-normalised: out.pipeline_encode_latents), packed to tokens; ids
 * (T = 10 + 10 i, row, col, 0). All images' tokens and ids concatenated. */
static cdf_status encode_references(cdf_pipeline *p, const cdf_generate_params *gp, cdf_tensor **tokens, cdf_tensor **ids) {
    *tokens = *ids = NULL;
    const int n = gp->num_input_images > 0 ? gp->num_input_images : 1;
    cdf_tensor *tok[CDF_FLUX2_MAX_REFERENCE_IMAGES] = {0}, *idt[CDF_FLUX2_MAX_REFERENCE_IMAGES] = {0};
    cdf_tensor_map in, out;
    cdf_tensor_map_init(&in);
    cdf_tensor_map_init(&out);
    cdf_status s = CDF_OK;
    for (int i = 0; i < n && s == CDF_OK; i++) {
        float *chw = NULL;
        int W = 0, H = 0;
        s = cdf_pipe_preprocess_reference(&gp->image[i], &chw, &W, &H);
        if (s != CDF_OK) break;
        int64_t ishape[4] = {1, 3, H, W};
        cdf_tensor *x = cdf_tensor_from_host(p->device, CDF_F32, 4, ishape, chw, CDF_F32);
        free(chw);
        if (i == 0) cdf_pipe_capture(gp, "init_image", x);
        cdf_tensor *lat = NULL;
        cdf_tensor_map_clear(&in);
        cdf_tensor_map_clear(&out);
        s = x ? cdf_tensor_map_set(&in, "x", x) : status_or_internal();
        if (s == CDF_OK) s = cdf_pipe_vae_tiling_inputs(p, &in);
        if (s == CDF_OK) s = cdf_component_run(p->vae, "encode", &in, &out);
        if (s == CDF_OK && !(lat = take(&out, "out.pipeline_encode_latents"))) s = status_or_internal();
        if (s != CDF_OK) {
            cdf_error_prefix("encoding reference image %d: ", i + 1);
            break;
        }
        const int64_t c4 = cdf_tensor_dim(lat, 1), h = cdf_tensor_dim(lat, 2), w = cdf_tensor_dim(lat, 3);
        int64_t s3[3] = {1, c4, h * w};
        tok[i] = cdf_contiguous(cdf_transpose(cdf_reshape(lat, 3, s3), 1, 2)); /* [1, h*w, C4] */
        int64_t *v = calloc((size_t)(h * w) * 4, sizeof *v);
        if (!v) {
            s = cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (reference ids)");
            break;
        }
        for (int64_t r = 0; r < h; r++)
            for (int64_t c = 0; c < w; c++) {
                v[(r * w + c) * 4 + 0] = 10 + 10 * (int64_t)i;
                v[(r * w + c) * 4 + 1] = r;
                v[(r * w + c) * 4 + 2] = c;
            }
        idt[i] = ids_tensor(p->device, v, h * w);
        free(v);
        if (!tok[i] || !idt[i]) s = status_or_internal();
    }
    cdf_tensor_map_clear(&in);
    cdf_tensor_map_clear(&out);
    if (s != CDF_OK) return s;
    *tokens = cdf_cat(tok, n, 1);
    *ids = cdf_cat(idt, n, 1);
    if (!*tokens || !*ids) return status_or_internal();
    cdf_pipe_capture(gp, "image_latents", *tokens);
    cdf_pipe_capture(gp, "image_latent_ids", *ids);
    return CDF_OK;
}

/* Everything after the text encoder. */
static cdf_status generate_image(cdf_pipeline *p, const cdf_generate_params *gp, cdf_tensor *embeds, cdf_image *out) {
    const int N = gp->num_inference_steps;
    const int64_t C4 = p->latent_channels * 4; /* transformer in_channels: 2x2-patchified VAE channels */
    /* latent grid: (2 * (H // (vae_scale * 2))) // 2 tokens per side */
    const int64_t h = gp->height / (p->vae_scale_factor * 2), w = gp->width / (p->vae_scale_factor * 2);
    const int64_t seq = h * w;
    char want[160];
    if (!embeds || cdf_tensor_ndim(embeds) != 3 || cdf_tensor_dim(embeds, 0) != 1 || cdf_tensor_dim(embeds, 1) < 1 ||
        cdf_tensor_dim(embeds, 2) != p->joint_attention_dim) {
        char buf[96];
        snprintf(want, sizeof want, "[1, L, %lld] (the transformer's joint_attention_dim)", (long long)p->joint_attention_dim);
        return cdf_error(CDF_ERR_SHAPE,
                         "%s: prompt_embeds %s must be %s; the text encoder's width is len(text_encoder_out_layers) x its "
                         "hidden size",
                         p->class_name, embeds ? cdf_tensor_describe(embeds, buf, sizeof buf) : "(none)", want);
    }
    cdf_pipe_capture(gp, "prompt_embeds", embeds);
    cdf_tensor *txt_ids = text_ids(p->device, cdf_tensor_dim(embeds, 1));
    if (!txt_ids) return status_or_internal();
    cdf_pipe_capture(gp, "text_ids", txt_ids);

    /* latents: one randn of the patchified shape, then packed to tokens */
    int64_t nshape[4] = {1, C4, h, w};
    cdf_generator *g = cdf_generator_new(gp->seed);
    cdf_tensor *noise = NULL;
    cdf_status s = g ? cdf_pipe_draw(p, g, 4, nshape, p->batch_row, p->batch_rows, &noise) : cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    cdf_generator_free(g);
    if (s != CDF_OK) return s;
    int64_t s3[3] = {1, C4, seq};
    cdf_tensor *latents = cdf_contiguous(cdf_transpose(cdf_reshape(noise, 3, s3), 1, 2)); /* [1, h*w, C4] */
    cdf_tensor *img_ids = latent_ids(p->device, h, w);
    if (!latents || !img_ids) return status_or_internal();
    cdf_pipe_capture(gp, "initial_noise", noise);
    cdf_pipe_capture(gp, "initial_latents", latents);
    cdf_pipe_capture(gp, "latents_initial", latents); /* the CLI's --latents-out name */
    cdf_pipe_capture(gp, "latent_ids", img_ids);

    /* schedule: sigmas linspace(1, 1/N, N), mu from the image sequence length and step count */
    cdf_scheduler *sched = NULL;
    cdf_pipe_schedule_info si;
    s = cdf_pipe_schedule(p, gp, &sched, &si);
    if (s != CDF_OK) return s;
    const float *sigmas = cdf_scheduler_sigmas(sched), *timesteps = cdf_scheduler_timesteps(sched);
    /* torch.full([1], guidance_scale, float32), passed at every step (a model without a guidance
     * embedder ignores it) */
    flux2_step fs = {.p = p, .gp = gp, .embeds = embeds, .txt_ids = txt_ids, .img_ids = img_ids, .seq = seq,
                     .guidance = cdf_pipe_scalar_tensor(p->device, (float)gp->guidance_scale, 1)};
    cdf_pipe_capture(gp, "guidance", fs.guidance);
    if (gp->image) {
        cdf_tensor *ref_ids = NULL;
        s = encode_references(p, gp, &fs.ref_latents, &ref_ids);
        cdf_tensor *two[2] = {img_ids, ref_ids};
        if (s == CDF_OK && !(fs.img_ids = cdf_cat(two, 2, 1))) s = status_or_internal();
        if (s != CDF_OK) {
            cdf_scheduler_free(sched);
            return s;
        }
    }

    /* denoising loop */
    cdf_denoise_loop loop = {.timesteps = timesteps, .sigmas = sigmas, .num_steps = N, .latents = latents,
                             .predict = flux2_predict, .ctx = &fs, .step_key = "step%02d.latents"};
    cdf_step_cache_config cache_cfg;
    s = cdf_step_cache_parse(gp->cache, &cache_cfg);
    /* diffusers' First Block Cache and TaylorSeer fail on Flux2Pipeline: docs/step-caches.md */
    if (s == CDF_OK && cache_cfg.kind == CDF_STEP_CACHE_TAYLORSEER)
        s = cdf_error(CDF_ERR_UNSUPPORTED, CDF_STEP_CACHE_TAYLORSEER_FLUX2_REFUSAL, gp->cache);
    else if (s == CDF_OK && cache_cfg.kind == CDF_STEP_CACHE_FIRST_BLOCK)
        s = cdf_error(CDF_ERR_UNSUPPORTED, "cache '%s': runs on FLUX.1 only (FLUX.2: --cache mag)", gp->cache);
    if (s == CDF_OK) s = cdf_step_cache_init(&fs.cache, &cache_cfg, N);
    if (s == CDF_OK) s = cdf_pipe_denoise(p, gp, &loop);
    cdf_step_cache_finish(&fs.cache, p, gp);
    cdf_scheduler_free(sched);
    if (s != CDF_OK) return s;
    latents = loop.latents;
    cdf_tensor_map in, outm;
    cdf_tensor_map_init(&in);
    cdf_tensor_map_init(&outm);
    cdf_pipe_capture(gp, "final_latents", latents);
    cdf_pipe_capture(gp, "latents_final", latents);

    /* decode: unpack by ids here (it reads the ids on the host: outside the VAE, so that a compiled
     * decode has no graph break), then BatchNorm de-normalisation, unpatchify and vae.decode
     * inside the VAE */
    cdf_tensor *dec_in = NULL, *decoded = NULL;
    s = cdf_tensor_map_set(&in, "unpacked_latents", cdf_flux2_unpack_latents_with_ids(latents, img_ids));
    if (s == CDF_OK) s = cdf_pipe_vae_tiling_inputs(p, &in);
    if (s == CDF_OK) s = cdf_component_run(p->vae, "decode", &in, &outm);
    if (s == CDF_OK && (!(dec_in = take(&outm, "out.pipeline_decode_latents")) || !(decoded = take(&outm, "out.pipeline_decode_sample"))))
        s = status_or_internal();
    cdf_tensor_map_clear(&in);
    cdf_tensor_map_clear(&outm);
    if (s != CDF_OK) return s;
    return cdf_pipe_image_out(gp, dec_in, decoded, out);
}

static cdf_status generate(cdf_pipeline *p, const cdf_generate_params *gp, cdf_image *out) {
    cdf_tensor *embeds = NULL;
    CDF_TRY(encode_prompt(p, gp, &embeds));
    return generate_image(p, gp, embeds, out);
}

const cdf_pipeline_class cdf_flux2_pipeline_class = {.name = "Flux2Pipeline", .kind = CDF_PIPE_FLUX2, .generate = generate};

cdf_status cdf_flux2_generate_from_embeds(cdf_pipeline *p, const cdf_generate_params *params, cdf_tensor *prompt_embeds,
                                          cdf_image *out) {
    if (!p || !params || !prompt_embeds || !out) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_flux2_generate_from_embeds: NULL argument");
    if (p->kind != CDF_PIPE_FLUX2)
        return cdf_error(CDF_ERR_INVALID_ARG, "cdf_flux2_generate_from_embeds: the pipeline is a %s, not a Flux2Pipeline", p->class_name);
    memset(out, 0, sizeof *out);
    cdf_generate_params gp = *params;
    cdf_pipeline_resolve_defaults(p, &gp);
    const int mult = p->vae_scale_factor * 2;
    if (gp.height <= 0 || gp.width <= 0 || gp.height % mult || gp.width % mult || gp.height > 4096 || gp.width > 4096)
        return cdf_error(CDF_ERR_INVALID_ARG, "height and width must be positive multiples of %d up to 4096 (got %dx%d)", mult,
                         gp.height, gp.width);
    if (gp.num_inference_steps <= 0 || gp.num_inference_steps > 1000)
        return cdf_error(CDF_ERR_INVALID_ARG, "steps must be between 1 and 1000 (got %d)", gp.num_inference_steps);
    if (!isfinite((float)gp.guidance_scale)) return cdf_error(CDF_ERR_INVALID_ARG, "guidance scale must be a finite number");
    CDF_TRY(cdf_pipe_check_inputs(&gp, true));
    CDF_TRY(cdf_pipe_cache_reports_reset(p, 1));
    cdf_scope_push();
    cdf_status s = generate_image(p, &gp, prompt_embeds, out);
    cdf_scope_pop(NULL, 0);
    if (s == CDF_OK) s = cdf_device_synchronize(p->device);
    else (void)cdf_device_synchronize(p->device);
    if (s != CDF_OK) cdf_image_free(out);
    return s;
}
