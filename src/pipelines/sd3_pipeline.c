/* StableDiffusion3Pipeline (SD3 / SD3.5), as diffusers' pipeline_stable_diffusion_3.py; with an
 * image StableDiffusion3Img2ImgPipeline, with a mask StableDiffusion3InpaintPipeline (the loop
 * starts at get_timesteps' index from scale_noise(encoded image, noise); inpainting blends the
 * known region back after every step). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "pipelines/pipeline_impl.h"
#include "tensor/tensor_impl.h"

#define take cdf_pipe_take

static cdf_status run_text(cdf_pipeline *p, int which, cdf_tensor *ids, const char *k1, cdf_tensor **o1, const char *k2,
                           cdf_tensor **o2) {
    cdf_tensor_map in, out;
    cdf_tensor_map_init(&in);
    cdf_tensor_map_init(&out);
    cdf_status s = cdf_tensor_map_set(&in, "input_ids", ids);
    if (s == CDF_OK) s = cdf_component_run(p->text_encoder[which], "forward", &in, &out);
    if (s == CDF_OK && !(*o1 = take(&out, k1))) s = cdf_last_status();
    if (s == CDF_OK && k2 && !(*o2 = take(&out, k2))) s = cdf_last_status();
    cdf_tensor_map_clear(&in);
    cdf_tensor_map_clear(&out);
    return s;
}

/* prompt -> prompt_embeds [1, 77 + L, D_t5], pooled [1, P_l + P_g] */
static cdf_status encode_prompt(cdf_pipeline *p, const char *prompt, int max_seq, cdf_tensor **embeds, cdf_tensor **pooled,
                                const cdf_generate_params *gp, const char *prefix) {
    cdf_tensor *ids[3] = {0}, *seq[3] = {0}, *pool[2] = {0};
    static const char *const tok_names[3] = {"tokenizer", "tokenizer_2", "tokenizer_3"};
    for (int i = 0; i < 2; i++) {
        CDF_TRY(cdf_pipe_tokenize(p, i, prompt, 77, &ids[i]));
        CDF_TRY(run_text(p, i, ids[i], "out.hidden_states_penultimate", &seq[i], "out.text_embeds", &pool[i]));
    }
    if (p->tokenizer[2] && p->text_encoder[2]) {
        CDF_TRY(cdf_pipe_tokenize(p, 2, prompt, max_seq, &ids[2]));
        CDF_TRY(run_text(p, 2, ids[2], "out.last_hidden_state", &seq[2], NULL, NULL));
    } else {
        /* no T5 in the folder: diffusers uses zeros of the joint attention width */
        int64_t zs[3] = {1, max_seq, p->joint_attention_dim};
        seq[2] = cdf_tensor_zeros(p->device, CDF_F32, 3, zs);
    }
    for (int i = 0; i < 3; i++) {
        if (!ids[i]) continue;
        char key[96];
        snprintf(key, sizeof key, "%sinput_ids.%s", prefix, tok_names[i]);
        cdf_pipe_capture(gp, key, ids[i]);
    }
    cdf_tensor *clip = cdf_cat(seq, 2, -1);
    if (!clip || !seq[2]) return cdf_last_status();
    int64_t d_clip = cdf_tensor_dim(clip, -1), d_t5 = cdf_tensor_dim(seq[2], -1);
    if (d_clip > d_t5)
        return cdf_error(CDF_ERR_SHAPE, "SD3: CLIP hidden sizes (%lld) exceed the T5 width (%lld)", (long long)d_clip, (long long)d_t5);
    int64_t pads[2] = {0, d_t5 - d_clip};
    cdf_tensor *clip_pad = cdf_pad(clip, 1, pads, 0.0);
    cdf_tensor *parts[2] = {clip_pad, seq[2]};
    *embeds = cdf_cat(parts, 2, -2);
    *pooled = cdf_cat(pool, 2, -1);
    return (*embeds && *pooled) ? CDF_OK : cdf_last_status();
}

typedef struct sd3_step {
    cdf_pipeline *p;
    const cdf_generate_params *gp;
    cdf_tensor *embeds, *pooled; /* [negative; positive] with CFG */
    bool cfg;
} sd3_step;

static cdf_tensor *sd3_predict(void *ctx, cdf_tensor *latents, int i, float t) {
    sd3_step *ss = ctx;
    const cdf_generate_params *gp = ss->gp;
    cdf_tensor *x = latents;
    if (ss->cfg) {
        cdf_tensor *two[2] = {latents, latents};
        x = cdf_cat(two, 2, 0);
    }
    cdf_tensor *timestep = cdf_pipe_scalar_tensor(ss->p->device, t, ss->cfg ? 2 : 1);
    cdf_tensor_map in, outm;
    cdf_tensor_map_init(&in);
    cdf_tensor_map_init(&outm);
    cdf_status s = x && timestep ? cdf_tensor_map_set(&in, "hidden_states", x) : cdf_last_status();
    if (s == CDF_OK) s = cdf_tensor_map_set(&in, "encoder_hidden_states", ss->embeds);
    if (s == CDF_OK) s = cdf_tensor_map_set(&in, "pooled_projections", ss->pooled);
    if (s == CDF_OK) s = cdf_tensor_map_set(&in, "timestep", timestep);
    if (s == CDF_OK) s = cdf_component_run(ss->p->transformer, "forward", &in, &outm);
    cdf_tensor *v = s == CDF_OK ? take(&outm, "out.sample") : NULL;
    cdf_tensor_map_clear(&in);
    cdf_tensor_map_clear(&outm);
    cdf_tensor *vel = v;
    if (v && ss->cfg) {
        cdf_tensor *halves[2];
        if (cdf_chunk(v, 2, 0, halves) != CDF_OK) return NULL;
        vel = cdf_pipe_cfg(halves[0], halves[1], (float)gp->guidance_scale); /* torch: float32 scalar */
        if (gp->capture) {
            char key[64];
            snprintf(key, sizeof key, "noise_pred_uncond.%d", i);
            cdf_pipe_capture(gp, key, halves[0]);
            snprintf(key, sizeof key, "noise_pred_cond.%d", i);
            cdf_pipe_capture(gp, key, halves[1]);
        }
    }
    if (vel && gp->capture) {
        char key[64];
        snprintf(key, sizeof key, "noise_pred.%d", i);
        cdf_pipe_capture(gp, key, vel);
    }
    return vel;
}

static cdf_status generate(cdf_pipeline *p, const cdf_generate_params *gp, cdf_image *out) {
    const int N = gp->num_inference_steps;
    const int64_t C = p->latent_channels;
    const int64_t h = gp->height / p->vae_scale_factor, w = gp->width / p->vae_scale_factor;
    sd3_step ss = {.p = p, .gp = gp, .cfg = gp->guidance_scale > 1.0}; /* do_classifier_free_guidance, on the Python float */

    /* 1. text ([negative; positive] with CFG) */
    cdf_tensor *embeds, *pooled, *neg_embeds = NULL, *neg_pooled = NULL;
    /* precomputed embeddings (prompt_embeds=, ...: one row on the device, pipeline.c) replace the encoding */
    if (gp->prompt_embeds) embeds = (cdf_tensor *)gp->prompt_embeds, pooled = (cdf_tensor *)gp->pooled_prompt_embeds;
    else CDF_TRY(encode_prompt(p, gp->prompt, gp->max_sequence_length, &embeds, &pooled, gp, ""));
    cdf_pipe_capture(gp, "prompt_embeds", embeds);
    cdf_pipe_capture(gp, "pooled_prompt_embeds", pooled);
    if (ss.cfg) {
        const char *neg = gp->negative_prompt ? gp->negative_prompt : "";
        if (gp->negative_prompt_embeds)
            neg_embeds = (cdf_tensor *)gp->negative_prompt_embeds, neg_pooled = (cdf_tensor *)gp->negative_pooled_prompt_embeds;
        else CDF_TRY(encode_prompt(p, neg, gp->max_sequence_length, &neg_embeds, &neg_pooled, gp, "negative_"));
        cdf_pipe_capture(gp, "negative_prompt_embeds", neg_embeds);
        cdf_pipe_capture(gp, "negative_pooled_prompt_embeds", neg_pooled);
        cdf_tensor *e2[2] = {neg_embeds, embeds}, *p2[2] = {neg_pooled, pooled};
        embeds = cdf_cat(e2, 2, 0);
        pooled = cdf_cat(p2, 2, 0);
        if (!embeds || !pooled) return cdf_last_status();
    }
    ss.embeds = embeds;
    ss.pooled = pooled;

    /* 2. schedule: set_timesteps(N) with the config's shift (mu only with dynamic shifting) */
    cdf_scheduler *sched = NULL;
    cdf_pipe_schedule_info si;
    cdf_status s = cdf_pipe_schedule(p, gp, &sched, &si);
    if (s != CDF_OK) return s;
    const float *sigmas = cdf_scheduler_sigmas(sched), *timesteps = cdf_scheduler_timesteps(sched);

    /* 3. latents: [the image's VAE sample, then] one randn */
    cdf_pipe_start st;
    s = cdf_pipe_start_latents(p, gp, C, h, w, sigmas, si.t_start, &st);
    cdf_denoise_loop loop = {.timesteps = timesteps, .sigmas = sigmas, .num_steps = N, .t_start = st.t_start,
                             .latents = st.latents, .predict = sd3_predict, .ctx = &ss, .step_key = "latents_after_step.%d"};
    if (s == CDF_OK && gp->mask_image) {
        s = cdf_pipe_prepare_mask(p, gp, h, w, false, &loop.mask, &loop.inv_mask);
        loop.image_latents = st.image_latents;
        loop.noise = st.noise;
    }
    cdf_pipe_capture(gp, "latents_initial", loop.latents);

    /* 4. denoising loop */
    if (s == CDF_OK) s = cdf_pipe_denoise(p, gp, &loop);
    cdf_scheduler_free(sched);
    if (s != CDF_OK) return s;
    cdf_pipe_capture(gp, "latents_final", loop.latents);

    /* 5. decode. StableDiffusion3InpaintPipeline decodes latents / scaling_factor without adding
     * the VAE's shift_factor back (unlike its img2img and text-to-image siblings); we follow it so
     * the picture equals diffusers'. */
    cdf_tensor *dec_in = NULL;
    cdf_tensor *decoded = cdf_pipe_vae_decode(p, loop.latents, gp->mask_image == NULL, &dec_in);
    return cdf_pipe_image_out(gp, dec_in, decoded, out);
}

const cdf_pipeline_class cdf_sd3_pipeline_class = {.name = "StableDiffusion3Pipeline", .kind = CDF_PIPE_SD3, .generate = generate};
