/* FluxPipeline (FLUX.1 schnell/dev), as diffusers' pipeline_flux.py computes it. */
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

/* One output of a component run, kept alive in the current scope. */
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

cdf_status cdf_flux_generate(cdf_pipeline *p, const cdf_generate_params *gp, cdf_image *out) {
    const int N = gp->num_inference_steps;
    const int64_t C = p->latent_channels;
    /* latent size: 2 * (H // (vae_scale * 2)) */
    const int64_t h = 2 * (gp->height / (p->vae_scale_factor * 2)), w = 2 * (gp->width / (p->vae_scale_factor * 2));
    const int64_t seq = (h / 2) * (w / 2);

    /* 1. text */
    cdf_tensor *embeds = NULL, *pooled = NULL, *neg_embeds = NULL, *neg_pooled = NULL;
    CDF_TRY(encode_prompt(p, gp->prompt, gp->max_sequence_length, &embeds, &pooled, gp, ""));
    bool do_true_cfg = gp->true_cfg_scale > 1.0f && gp->negative_prompt != NULL;
    if (do_true_cfg) CDF_TRY(encode_prompt(p, gp->negative_prompt, gp->max_sequence_length, &neg_embeds, &neg_pooled, gp, "negative_"));
    cdf_pipe_capture(gp, "prompt_embeds", embeds);
    cdf_pipe_capture(gp, "pooled_prompt_embeds", pooled);
    cdf_pipe_capture(gp, "negative_prompt_embeds", neg_embeds);
    cdf_pipe_capture(gp, "negative_pooled_prompt_embeds", neg_pooled);
    int64_t L = cdf_tensor_dim(embeds, 1);
    int64_t tshape[2] = {L, 3};
    cdf_tensor *txt_ids = cdf_tensor_zeros(p->device, CDF_F32, 2, tshape);
    cdf_pipe_capture(gp, "text_ids", txt_ids);

    /* 2. latents: one randn of the unpacked shape, then 2x2 packing */
    int64_t nshape[4] = {1, C, h, w};
    cdf_tensor *noise = cdf_pipe_noise(p, gp->seed, 4, nshape);
    cdf_tensor *latents = pack_latents(noise, C, h, w);
    if (!latents) return cdf_last_status();
    cdf_pipe_capture(gp, "noise", noise);
    cdf_pipe_capture(gp, "latents_initial", latents);
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
    cdf_tensor *img_ids = cdf_tensor_from_host(p->device, CDF_F32, 2, ishape, ids, CDF_F32);
    free(ids);
    cdf_pipe_capture(gp, "latent_image_ids", img_ids);

    /* 3. schedule: sigmas linspace(1, 1/N, N); mu from the image sequence length */
    cdf_scheduler *sched = cdf_scheduler_new(&p->sched_cfg);
    if (!sched) return cdf_last_status();
    float *sig_in = malloc((size_t)N * sizeof *sig_in);
    double mu = cdf_calculate_shift(seq, p->sched_cfg.base_image_seq_len, p->sched_cfg.max_image_seq_len,
                                    p->sched_cfg.base_shift, p->sched_cfg.max_shift);
    cdf_status s = sig_in ? cdf_flux_default_sigmas(N, sig_in) : cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    if (s == CDF_OK) s = cdf_scheduler_set_timesteps(sched, N, sig_in, N, &mu);
    free(sig_in);
    if (s != CDF_OK) {
        cdf_scheduler_free(sched);
        return s;
    }
    const float *sigmas = cdf_scheduler_sigmas(sched), *timesteps = cdf_scheduler_timesteps(sched);
    int64_t ns1[1] = {N + 1}, ns[1] = {N};
    cdf_pipe_capture(gp, "sigmas", cdf_tensor_from_host(p->device, CDF_F32, 1, ns1, sigmas, CDF_F32));
    cdf_pipe_capture(gp, "timesteps", cdf_tensor_from_host(p->device, CDF_F32, 1, ns, timesteps, CDF_F32));
    cdf_tensor *guidance = p->guidance_embeds ? cdf_pipe_scalar_tensor(p->device, gp->guidance_scale, 1) : NULL;
    cdf_pipe_capture(gp, "guidance", guidance);

    /* 4. denoising loop */
    cdf_tensor_map in, outm;
    cdf_tensor_map_init(&in);
    cdf_tensor_map_init(&outm);
    for (int i = 0; i < N && s == CDF_OK; i++) {
        double t0 = now_s();
        cdf_scope_push();
        float t_in = timesteps[i] / 1000.0f; /* float32 division, as the pipeline */
        cdf_tensor *timestep = cdf_pipe_scalar_tensor(p->device, t_in, 1);
        cdf_tensor *v = NULL, *v_neg = NULL;
        for (int pass = 0; pass < (do_true_cfg ? 2 : 1) && s == CDF_OK; pass++) {
            cdf_tensor_map_clear(&in);
            cdf_tensor_map_clear(&outm);
            s = cdf_tensor_map_set(&in, "hidden_states", latents);
            if (s == CDF_OK) s = cdf_tensor_map_set(&in, "encoder_hidden_states", pass ? neg_embeds : embeds);
            if (s == CDF_OK) s = cdf_tensor_map_set(&in, "pooled_projections", pass ? neg_pooled : pooled);
            if (s == CDF_OK) s = cdf_tensor_map_set(&in, "timestep", timestep);
            if (s == CDF_OK) s = cdf_tensor_map_set(&in, "img_ids", img_ids);
            if (s == CDF_OK) s = cdf_tensor_map_set(&in, "txt_ids", txt_ids);
            if (s == CDF_OK && guidance) s = cdf_tensor_map_set(&in, "guidance", guidance);
            if (s == CDF_OK) s = cdf_component_run(p->transformer, "forward", &in, &outm);
            if (s == CDF_OK) {
                cdf_tensor *r = take(&outm, "out.sample");
                if (!r) s = cdf_last_status();
                if (pass) v_neg = r;
                else v = r;
            }
        }
        cdf_tensor *next = NULL;
        if (s == CDF_OK) {
            cdf_tensor *vel = do_true_cfg ? cdf_pipe_cfg(v_neg, v, gp->true_cfg_scale) : v;
            next = cdf_pipe_euler_step(latents, vel, sigmas[i], sigmas[i + 1]);
            if (!next) s = cdf_last_status();
            if (gp->capture && s == CDF_OK) {
                char key[64];
                snprintf(key, sizeof key, "noise_pred_cond.%d", i);
                cdf_pipe_capture(gp, key, v);
                snprintf(key, sizeof key, "latents_after_step.%d", i);
                cdf_pipe_capture(gp, key, next);
            }
        }
        cdf_scope_pop(&next, 1);
        latents = next;
        if (s == CDF_OK && gp->callback) {
            /* the callback reports wall time per step, so it waits for the step to finish */
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
    cdf_tensor *unpacked = unpack_latents(latents, C, h, w);
    cdf_tensor *dec_in = NULL;
    cdf_tensor *decoded = cdf_pipe_vae_decode(p, unpacked, &dec_in);
    if (!decoded) return cdf_last_status();
    cdf_pipe_capture(gp, "vae_decode_input", dec_in);
    cdf_pipe_capture(gp, "vae_decode_output", decoded);
    cdf_tensor *image = NULL;
    s = cdf_pipe_to_image(decoded, out, &image);
    cdf_pipe_capture(gp, "image", image);
    return s;
}
