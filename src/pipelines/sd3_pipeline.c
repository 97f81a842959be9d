/* StableDiffusion3Pipeline (SD3 / SD3.5), as diffusers' pipeline_stable_diffusion_3.py. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error_internal.h"
#include "pipelines/pipeline_impl.h"
#include "tensor/tensor_impl.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static cdf_tensor *take(cdf_tensor_map *out, const char *key) {
    cdf_tensor *t = cdf_tensor_map_get(out, key);
    if (!t) {
        cdf_error(CDF_ERR_INTERNAL, "component produced no '%s'", key);
        return NULL;
    }
    cdf_tensor_retain(t);
    cdf_scope_record(t);
    return t;
}

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

cdf_status cdf_sd3_generate(cdf_pipeline *p, const cdf_generate_params *gp, cdf_image *out) {
    const int N = gp->num_inference_steps;
    const int64_t C = p->latent_channels;
    const int64_t h = gp->height / p->vae_scale_factor, w = gp->width / p->vae_scale_factor;
    const bool cfg = gp->guidance_scale > 1.0f;

    /* 1. text ([negative; positive] with CFG) */
    cdf_tensor *embeds, *pooled, *neg_embeds = NULL, *neg_pooled = NULL;
    CDF_TRY(encode_prompt(p, gp->prompt, gp->max_sequence_length, &embeds, &pooled, gp, ""));
    cdf_pipe_capture(gp, "prompt_embeds", embeds);
    cdf_pipe_capture(gp, "pooled_prompt_embeds", pooled);
    if (cfg) {
        const char *neg = gp->negative_prompt ? gp->negative_prompt : "";
        CDF_TRY(encode_prompt(p, neg, gp->max_sequence_length, &neg_embeds, &neg_pooled, gp, "negative_"));
        cdf_pipe_capture(gp, "negative_prompt_embeds", neg_embeds);
        cdf_pipe_capture(gp, "negative_pooled_prompt_embeds", neg_pooled);
        cdf_tensor *e2[2] = {neg_embeds, embeds}, *p2[2] = {neg_pooled, pooled};
        embeds = cdf_cat(e2, 2, 0);
        pooled = cdf_cat(p2, 2, 0);
        if (!embeds || !pooled) return cdf_last_status();
    }
    const int64_t B = cfg ? 2 : 1;

    /* 2. latents */
    int64_t nshape[4] = {1, C, h, w};
    cdf_tensor *latents = cdf_pipe_noise(p, gp->seed, 4, nshape);
    if (!latents) return cdf_last_status();
    cdf_pipe_capture(gp, "noise", latents);
    cdf_pipe_capture(gp, "latents_initial", latents);

    /* 3. schedule: set_timesteps(N) with the config's shift (mu only with dynamic shifting) */
    cdf_scheduler *sched = cdf_scheduler_new(&p->sched_cfg);
    if (!sched) return cdf_last_status();
    double mu = 0;
    if (p->sched_cfg.use_dynamic_shifting) {
        int64_t patch = 2, seq = (h / patch) * (w / patch);
        mu = cdf_calculate_shift(seq, p->sched_cfg.base_image_seq_len, p->sched_cfg.max_image_seq_len,
                                 p->sched_cfg.base_shift, p->sched_cfg.max_shift);
    }
    cdf_status s = cdf_scheduler_set_timesteps(sched, N, NULL, 0, p->sched_cfg.use_dynamic_shifting ? &mu : NULL);
    if (s != CDF_OK) {
        cdf_scheduler_free(sched);
        return s;
    }
    const float *sigmas = cdf_scheduler_sigmas(sched), *timesteps = cdf_scheduler_timesteps(sched);
    int64_t ns1[1] = {N + 1}, ns[1] = {N};
    cdf_pipe_capture(gp, "sigmas", cdf_tensor_from_host(p->device, CDF_F32, 1, ns1, sigmas, CDF_F32));
    cdf_pipe_capture(gp, "timesteps", cdf_tensor_from_host(p->device, CDF_F32, 1, ns, timesteps, CDF_F32));

    /* 4. denoising loop */
    cdf_tensor_map in, outm;
    cdf_tensor_map_init(&in);
    cdf_tensor_map_init(&outm);
    for (int i = 0; i < N && s == CDF_OK; i++) {
        double t0 = now_s();
        cdf_scope_push();
        cdf_tensor *x = latents;
        if (cfg) {
            cdf_tensor *two[2] = {latents, latents};
            x = cdf_cat(two, 2, 0);
        }
        cdf_tensor *timestep = cdf_pipe_scalar_tensor(p->device, timesteps[i], B);
        cdf_tensor_map_clear(&in);
        cdf_tensor_map_clear(&outm);
        s = cdf_tensor_map_set(&in, "hidden_states", x);
        if (s == CDF_OK) s = cdf_tensor_map_set(&in, "encoder_hidden_states", embeds);
        if (s == CDF_OK) s = cdf_tensor_map_set(&in, "pooled_projections", pooled);
        if (s == CDF_OK) s = cdf_tensor_map_set(&in, "timestep", timestep);
        if (s == CDF_OK) s = cdf_component_run(p->transformer, "forward", &in, &outm);
        cdf_tensor *next = NULL;
        if (s == CDF_OK) {
            cdf_tensor *v = take(&outm, "out.sample");
            cdf_tensor *vel = v;
            if (v && cfg) {
                cdf_tensor *halves[2];
                s = cdf_chunk(v, 2, 0, halves);
                if (s == CDF_OK) vel = cdf_pipe_cfg(halves[0], halves[1], gp->guidance_scale);
                if (s == CDF_OK && gp->capture) {
                    char key[64];
                    snprintf(key, sizeof key, "noise_pred_uncond.%d", i);
                    cdf_pipe_capture(gp, key, halves[0]);
                    snprintf(key, sizeof key, "noise_pred_cond.%d", i);
                    cdf_pipe_capture(gp, key, halves[1]);
                }
            }
            next = (s == CDF_OK && vel) ? cdf_pipe_euler_step(latents, vel, sigmas[i], sigmas[i + 1]) : NULL;
            if (!next && s == CDF_OK) s = cdf_last_status();
            if (s == CDF_OK && gp->capture) {
                char key[64];
                snprintf(key, sizeof key, "noise_pred.%d", i);
                cdf_pipe_capture(gp, key, vel);
                snprintf(key, sizeof key, "latents_after_step.%d", i);
                cdf_pipe_capture(gp, key, next);
            }
        }
        cdf_scope_pop(&next, 1);
        latents = next;
        if (s == CDF_OK && gp->callback) {
            s = cdf_device_synchronize(p->device);
            if (s == CDF_OK && !gp->callback(i + 1, N, now_s() - t0, gp->callback_user))
                s = cdf_error(CDF_ERR_INTERRUPTED, "generation cancelled at step %d of %d", i + 1, N);
        }
    }
    cdf_tensor_map_clear(&in);
    cdf_tensor_map_clear(&outm);
    cdf_scheduler_free(sched);
    if (s != CDF_OK) return s;
    cdf_pipe_capture(gp, "latents_final", latents);

    /* 5. decode */
    cdf_tensor *dec_in = NULL;
    cdf_tensor *decoded = cdf_pipe_vae_decode(p, latents, &dec_in);
    if (!decoded) return cdf_last_status();
    cdf_pipe_capture(gp, "vae_decode_input", dec_in);
    cdf_pipe_capture(gp, "vae_decode_output", decoded);
    cdf_tensor *image = NULL;
    s = cdf_pipe_to_image(decoded, out, &image);
    cdf_pipe_capture(gp, "image", image);
    return s;
}
