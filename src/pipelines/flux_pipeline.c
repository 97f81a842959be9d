/* FluxPipeline (FLUX.1 schnell/dev), as diffusers' pipeline_flux.py computes it; with an image,
 * FluxImg2ImgPipeline (pipeline_flux_img2img.py), and with a mask FluxInpaintPipeline
 * (pipeline_flux_inpaint.py): the same text, schedule and model calls, the loop starting at
 * get_timesteps' index from scale_noise(encoded image, noise). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "pipelines/pipeline_impl.h"
#include "pipelines/step_cache.h"
#include "tensor/tensor_impl.h"

#define take cdf_pipe_take

/* prompt -> (prompt_embeds [1, L, D] from T5, pooled [1, P] from CLIP-L) */
static cdf_status encode_prompt(cdf_pipeline *p, const char *prompt, int max_seq, cdf_tensor **embeds, cdf_tensor **pooled,
                                const cdf_generate_params *gp, const char *prefix) {
    cdf_tensor *clip_ids, *t5_ids;
    CDF_TRY(cdf_pipe_tokenize(p, 0, prompt, 77, &clip_ids));
    CDF_TRY(cdf_pipe_tokenize(p, 1, prompt, max_seq, &t5_ids));
    char key[96];
    snprintf(key, sizeof key, "%sinput_ids.tokenizer", prefix);
    cdf_pipe_capture(gp, key, clip_ids);
    snprintf(key, sizeof key, "%sinput_ids.tokenizer_2", prefix);
    cdf_pipe_capture(gp, key, t5_ids);
    cdf_tensor_map in, out;
    cdf_tensor_map_init(&in);
    cdf_tensor_map_init(&out);
    cdf_status s = cdf_tensor_map_set(&in, "input_ids", clip_ids);
    if (s == CDF_OK) s = cdf_component_run(p->text_encoder[0], "forward", &in, &out);
    if (s == CDF_OK && !(*pooled = take(&out, "out.pooler_output"))) s = cdf_last_status();
    cdf_tensor_map_clear(&in);
    cdf_tensor_map_clear(&out);
    if (s == CDF_OK) s = cdf_tensor_map_set(&in, "input_ids", t5_ids);
    if (s == CDF_OK) s = cdf_component_run(p->text_encoder[1], "forward", &in, &out);
    if (s == CDF_OK && !(*embeds = take(&out, "out.last_hidden_state"))) s = cdf_last_status();
    cdf_tensor_map_clear(&in);
    cdf_tensor_map_clear(&out);
    return s;
}

/* [1, C, h, w] -> [1, (h/2)(w/2), C*4]: token = row*(w/2)+col, channel = c*4 + dy*2 + dx */
static cdf_tensor *pack_latents(cdf_tensor *x, int64_t c, int64_t h, int64_t w) {
    int64_t s6[6] = {1, c, h / 2, 2, w / 2, 2};
    int perm[6] = {0, 2, 4, 1, 3, 5};
    int64_t s3[3] = {1, (h / 2) * (w / 2), c * 4};
    return cdf_reshape(cdf_permute(cdf_reshape(x, 6, s6), perm), 3, s3);
}

static cdf_tensor *unpack_latents(cdf_tensor *x, int64_t c, int64_t h, int64_t w) {
    int64_t s6[6] = {1, h / 2, w / 2, c, 2, 2};
    int perm[6] = {0, 3, 1, 4, 2, 5};
    int64_t s4[4] = {1, c, h, w};
    return cdf_reshape(cdf_permute(cdf_reshape(x, 6, s6), perm), 4, s4);
}

/* The model side of one step: the conditioning the loop does not know about. */
typedef struct flux_step {
    cdf_pipeline *p;
    const cdf_generate_params *gp;
    cdf_tensor *embeds, *pooled, *neg_embeds, *neg_pooled, *txt_ids, *img_ids, *guidance;
    bool true_cfg;
    cdf_step_cache cache; /* --cache (step_cache.c): pass 0 is diffusers' "cond" context, 1 "uncond" */
} flux_step;

static cdf_tensor *flux_predict(void *ctx, cdf_tensor *latents, int i, float t) {
    flux_step *fs = ctx;
    cdf_tensor *timestep = cdf_pipe_scalar_tensor(fs->p->device, t / 1000.0f, 1); /* float32 division, as the pipeline */
    cdf_tensor *v = NULL, *v_neg = NULL;
    cdf_tensor_map in, outm;
    cdf_tensor_map_init(&in);
    cdf_tensor_map_init(&outm);
    cdf_status s = timestep ? CDF_OK : cdf_last_status();
    for (int pass = 0; pass < (fs->true_cfg ? 2 : 1) && s == CDF_OK; pass++) {
        cdf_tensor_map_clear(&in);
        cdf_tensor_map_clear(&outm);
        s = cdf_tensor_map_set(&in, "hidden_states", latents);
        if (s == CDF_OK) s = cdf_tensor_map_set(&in, "encoder_hidden_states", pass ? fs->neg_embeds : fs->embeds);
        if (s == CDF_OK) s = cdf_tensor_map_set(&in, "pooled_projections", pass ? fs->neg_pooled : fs->pooled);
        if (s == CDF_OK) s = cdf_tensor_map_set(&in, "timestep", timestep);
        if (s == CDF_OK) s = cdf_tensor_map_set(&in, "img_ids", fs->img_ids);
        if (s == CDF_OK) s = cdf_tensor_map_set(&in, "txt_ids", fs->txt_ids);
        if (s == CDF_OK && fs->guidance) s = cdf_tensor_map_set(&in, "guidance", fs->guidance);
        cdf_tensor *r = NULL;
        if (s == CDF_OK && fs->cache.cfg.kind != CDF_STEP_CACHE_NONE) s = cdf_step_cache_predict(&fs->cache, fs->p->transformer, pass, &in, &r);
        else if (s == CDF_OK) s = cdf_component_run(fs->p->transformer, "forward", &in, &outm);
        if (s == CDF_OK) {
            if (!r && !(r = take(&outm, "out.sample"))) s = cdf_last_status();
            if (pass) v_neg = r;
            else v = r;
        }
    }
    cdf_tensor_map_clear(&in);
    cdf_tensor_map_clear(&outm);
    if (s != CDF_OK) return NULL;
    if (fs->gp->capture) {
        char key[64];
        snprintf(key, sizeof key, "noise_pred_cond.%d", i);
        cdf_pipe_capture(fs->gp, key, v);
    }
    return fs->true_cfg ? cdf_pipe_cfg(v_neg, v, (float)fs->gp->true_cfg_scale) : v; /* torch: float32 scalar */
}

static cdf_status generate(cdf_pipeline *p, const cdf_generate_params *gp, cdf_image *out) {
    const int N = gp->num_inference_steps;
    const int64_t C = p->latent_channels;
    /* latent size: 2 * (H // (vae_scale * 2)) */
    const int64_t h = 2 * (gp->height / (p->vae_scale_factor * 2)), w = 2 * (gp->width / (p->vae_scale_factor * 2));
    const int64_t seq = (h / 2) * (w / 2);
    flux_step fs = {.p = p, .gp = gp};

    /* 1. text */
    /* precomputed embeddings (prompt_embeds=, ...: one row on the device, pipeline.c) replace the encoding */
    if (gp->prompt_embeds) fs.embeds = (cdf_tensor *)gp->prompt_embeds, fs.pooled = (cdf_tensor *)gp->pooled_prompt_embeds;
    else CDF_TRY(encode_prompt(p, gp->prompt, gp->max_sequence_length, &fs.embeds, &fs.pooled, gp, ""));
    /* do_true_cfg, on the Python float: a negative prompt or negative embeddings */
    fs.true_cfg = gp->true_cfg_scale > 1.0 && (gp->negative_prompt != NULL || gp->negative_prompt_embeds);
    if (fs.true_cfg && gp->negative_prompt_embeds)
        fs.neg_embeds = (cdf_tensor *)gp->negative_prompt_embeds, fs.neg_pooled = (cdf_tensor *)gp->negative_pooled_prompt_embeds;
    else if (fs.true_cfg)
        CDF_TRY(encode_prompt(p, gp->negative_prompt, gp->max_sequence_length, &fs.neg_embeds, &fs.neg_pooled, gp, "negative_"));
    cdf_pipe_capture(gp, "prompt_embeds", fs.embeds);
    cdf_pipe_capture(gp, "pooled_prompt_embeds", fs.pooled);
    cdf_pipe_capture(gp, "negative_prompt_embeds", fs.neg_embeds);
    cdf_pipe_capture(gp, "negative_pooled_prompt_embeds", fs.neg_pooled);
    int64_t L = cdf_tensor_dim(fs.embeds, 1);
    int64_t tshape[2] = {L, 3};
    fs.txt_ids = cdf_tensor_zeros(p->device, CDF_F32, 2, tshape);
    cdf_pipe_capture(gp, "text_ids", fs.txt_ids);
    float *ids = malloc((size_t)seq * 3 * sizeof *ids);
    if (!ids) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    for (int64_t r = 0; r < h / 2; r++)
        for (int64_t c = 0; c < w / 2; c++) {
            float *row = ids + (r * (w / 2) + c) * 3;
            row[0] = 0.0f;
            row[1] = (float)r;
            row[2] = (float)c;
        }
    int64_t ishape[2] = {seq, 3};
    fs.img_ids = cdf_tensor_from_host(p->device, CDF_F32, 2, ishape, ids, CDF_F32);
    free(ids);
    cdf_pipe_capture(gp, "latent_image_ids", fs.img_ids);

    /* 2. schedule: sigmas linspace(1, 1/N, N); mu from the image sequence length */
    cdf_scheduler *sched = NULL;
    cdf_pipe_schedule_info si;
    cdf_status s = cdf_pipe_schedule(p, gp, &sched, &si);
    if (s != CDF_OK) return s;
    const float *sigmas = cdf_scheduler_sigmas(sched), *timesteps = cdf_scheduler_timesteps(sched);
    fs.guidance = p->guidance_embeds ? cdf_pipe_scalar_tensor(p->device, (float)gp->guidance_scale, 1) : NULL;
    cdf_pipe_capture(gp, "guidance", fs.guidance);

    /* 3. latents: [the image's VAE sample, then] one randn of the unpacked shape, 2x2 packing */
    cdf_pipe_start st;
    s = cdf_pipe_start_latents(p, gp, C, h, w, sigmas, si.t_start, &st);
    cdf_denoise_loop loop = {.timesteps = timesteps, .sigmas = sigmas, .num_steps = N, .t_start = st.t_start,
                             .predict = flux_predict, .ctx = &fs, .step_key = "latents_after_step.%d"};
    if (s == CDF_OK && !(loop.latents = pack_latents(st.latents, C, h, w))) s = cdf_last_status();
    if (s == CDF_OK && gp->mask_image) {
        s = cdf_pipe_prepare_mask(p, gp, h, w, true, &loop.mask, &loop.inv_mask);
        loop.image_latents = pack_latents(st.image_latents, C, h, w);
        loop.noise = pack_latents(st.noise, C, h, w);
        if (s == CDF_OK && (!loop.image_latents || !loop.noise)) s = cdf_last_status();
    }
    cdf_pipe_capture(gp, "latents_initial", loop.latents);

    /* 4. denoising loop */
    cdf_step_cache_config cache_cfg;
    if (s == CDF_OK) s = cdf_step_cache_parse(gp->cache, &cache_cfg); /* checked by validate() */
    if (s == CDF_OK) s = cdf_step_cache_init(&fs.cache, &cache_cfg, N);
    if (s == CDF_OK) s = cdf_pipe_denoise(p, gp, &loop);
    cdf_step_cache_finish(&fs.cache, p, gp);
    cdf_scheduler_free(sched);
    if (s != CDF_OK) return s;
    cdf_pipe_capture(gp, "latents_final", loop.latents);

    /* 5. decode */
    cdf_tensor *unpacked = unpack_latents(loop.latents, C, h, w);
    cdf_tensor *dec_in = NULL;
    cdf_tensor *decoded = cdf_pipe_vae_decode(p, unpacked, true, &dec_in);
    return cdf_pipe_image_out(gp, dec_in, decoded, out);
}

const cdf_pipeline_class cdf_flux_pipeline_class = {.name = "FluxPipeline", .kind = CDF_PIPE_FLUX, .generate = generate};
