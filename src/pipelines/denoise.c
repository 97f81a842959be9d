/* The denoising loop the three pipelines share, and the start latents of img2img / inpainting
 * (diffusers' get_timesteps, retrieve_latents(..., sample_mode="sample"), scheduler.scale_noise,
 * and the inpaint blend after every step). */
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

static cdf_status status_or_internal(void) { return cdf_last_status() ? cdf_last_status() : CDF_ERR_INTERNAL; }

cdf_tensor *cdf_pipe_take(cdf_tensor_map *out, const char *key) {
    cdf_tensor *t = cdf_tensor_map_get(out, key);
    if (!t) {
        cdf_error(CDF_ERR_INTERNAL, "component produced no '%s'", key);
        return NULL;
    }
    cdf_tensor_retain(t);
    cdf_scope_record(t);
    return t;
}

int cdf_pipe_t_start(int num_steps, double strength) {
    /* get_timesteps: init_timestep = min(N * strength, N) in Python floats; t_start = int(max(N - init, 0)) */
    double init = fmin((double)num_steps * (double)strength, (double)num_steps);
    double r = (double)num_steps - init;
    return (int)(r > 0 ? r : 0);
}

void cdf_pipe_schedule_mu(const cdf_pipeline *p, const cdf_generate_params *gp, cdf_pipe_schedule_info *info) {
    memset(info, 0, sizeof *info);
    const int N = gp->num_inference_steps;
    const int64_t H = gp->height, W = gp->width, vs = p->vae_scale_factor;
    const cdf_scheduler_config *c = &p->sched_cfg;
    if (p->kind == CDF_PIPE_FLUX) {
        /* FluxPipeline: latents (2 * (H // (vs * 2)), ...) packed 2x2: image_seq_len = latents.shape[1];
         * mu = calculate_shift(...) always (set_timesteps ignores it without dynamic shifting) */
        info->image_seq_len = (H / (vs * 2)) * (W / (vs * 2));
        info->mu = cdf_scheduler_calculate_shift(info->image_seq_len, c->base_image_seq_len, c->max_image_seq_len, c->base_shift,
                                       c->max_shift);
        info->has_mu = true;
    } else if (p->kind == CDF_PIPE_FLUX2) {
        /* Flux2Pipeline: image_seq_len = latents.shape[1] (H // (vs * 2) * W // (vs * 2) tokens) */
        info->image_seq_len = (H / (vs * 2)) * (W / (vs * 2));
        info->mu = cdf_scheduler_empirical_mu(info->image_seq_len, N);
        info->has_mu = true;
    } else if (c->use_dynamic_shifting) {
        /* StableDiffusion3Pipeline: (int(height) // vae_scale_factor // patch_size) * (... width ...) */
        const int64_t patch = 2;
        info->image_seq_len = (H / vs / patch) * (W / vs / patch);
        info->mu = cdf_scheduler_calculate_shift(info->image_seq_len, c->base_image_seq_len, c->max_image_seq_len, c->base_shift,
                                       c->max_shift);
        info->has_mu = true;
    }
}

cdf_status cdf_pipe_schedule(const cdf_pipeline *p, const cdf_generate_params *gp, cdf_scheduler **sched,
                             cdf_pipe_schedule_info *info) {
    *sched = NULL;
    cdf_pipe_schedule_mu(p, gp, info);
    const int N = gp->num_inference_steps;
    const bool flux_sigmas = p->kind != CDF_PIPE_SD3;
    cdf_scheduler *s = cdf_scheduler_new(&p->sched_cfg);
    if (!s) return status_or_internal();
    float *sig_in = flux_sigmas ? malloc((size_t)N * sizeof *sig_in) : NULL;
    cdf_status st = CDF_OK;
    if (flux_sigmas) st = sig_in ? cdf_scheduler_flux_sigmas(N, sig_in) : cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    if (st == CDF_OK) st = cdf_scheduler_set_timesteps(s, N, sig_in, flux_sigmas ? N : 0, info->has_mu ? &info->mu : NULL);
    free(sig_in);
    if (st != CDF_OK) {
        cdf_scheduler_free(s);
        return st;
    }
    if (gp->image && p->kind != CDF_PIPE_FLUX2) info->t_start = cdf_pipe_t_start(N, gp->strength);
    cdf_pipe_capture_schedule(p, gp, cdf_scheduler_sigmas(s), cdf_scheduler_timesteps(s));
    *sched = s;
    return CDF_OK;
}

cdf_tensor *cdf_pipe_scale_noise(cdf_tensor *sample, cdf_tensor *noise, float sigma) {
    /* sigma * noise + (1.0 - sigma) * sample, float32 */
    return cdf_add(cdf_scale(noise, sigma), cdf_scale(sample, 1.0f - sigma));
}

cdf_status cdf_pipe_draw(cdf_pipeline *p, cdf_generator *g, int ndim, const int64_t *shape, int64_t row, int64_t rows,
                         cdf_tensor **out) {
    *out = NULL;
    const int64_t n = cdf_shape_numel(ndim, shape);
    /* torch fills a float32 randn of 16 or more values in blocks of 16 and redraws the last block
     * when the count is not a multiple of 16: with n % 16 == 0 the (rows, ...) tensor is `rows`
     * consecutive (1, ...) draws and row k is the (k + 1)-th; otherwise draw it whole */
    const bool whole = rows > 1 && n % 16 != 0;
    const int64_t len = whole ? n * rows : n;
    float *buf = malloc((size_t)len * sizeof *buf);
    if (!buf) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory drawing the initial noise");
    cdf_status s = CDF_OK;
    for (int64_t k = 0; !whole && k < row && s == CDF_OK; k++) s = cdf_randn_f32(g, buf, n);
    if (s == CDF_OK) s = cdf_randn_f32(g, buf, len);
    const float *src = whole ? buf + row * n : buf;
    if (s == CDF_OK && !(*out = cdf_tensor_from_host(p->device, CDF_F32, ndim, shape, src, CDF_F32))) s = status_or_internal();
    free(buf);
    return s;
}

cdf_status cdf_pipe_encode_image(cdf_pipeline *p, const cdf_generate_params *gp, cdf_generator *g, int64_t h, int64_t w,
                                 cdf_tensor **image_latents) {
    *image_latents = NULL;
    const int H = gp->height, W = gp->width;
    float *chw = NULL;
    CDF_TRY(cdf_pipe_preprocess_image(gp->image, W, H, &chw));
    int64_t ishape[4] = {1, 3, H, W};
    cdf_tensor *x = cdf_tensor_from_host(p->device, CDF_F32, 4, ishape, chw, CDF_F32);
    free(chw);
    if (!x) return status_or_internal();
    cdf_pipe_capture(gp, "init_image", x);
    cdf_tensor_map in, out;
    cdf_tensor_map_init(&in);
    cdf_tensor_map_init(&out);
    cdf_tensor *mean = NULL, *std = NULL;
    cdf_status s = cdf_tensor_map_set(&in, "x", x);
    if (s == CDF_OK) s = cdf_pipe_vae_tiling_inputs(p, &in);
    if (s == CDF_OK) s = cdf_component_run(p->vae, "encode", &in, &out);
    if (s == CDF_OK && (!(mean = cdf_pipe_take(&out, "out.encode_mean")) || !(std = cdf_pipe_take(&out, "out.encode_std"))))
        s = status_or_internal();
    cdf_tensor_map_clear(&in);
    cdf_tensor_map_clear(&out);
    if (s != CDF_OK) {
        cdf_error_prefix("encoding the input image: ");
        return s;
    }
    if (cdf_tensor_ndim(mean) != 4 || cdf_tensor_dim(mean, 1) != p->latent_channels || cdf_tensor_dim(mean, 2) != h ||
        cdf_tensor_dim(mean, 3) != w) {
        char buf[96];
        return cdf_error(CDF_ERR_SHAPE, "the VAE encoded a %dx%d image to %s, expected [1, %lld, %lld, %lld]", W, H,
                         cdf_tensor_describe(mean, buf, sizeof buf), (long long)p->latent_channels, (long long)h, (long long)w);
    }
    /* latent_dist.sample(generator): mean + std * randn(mean.shape), drawn before the noise */
    int64_t lshape[4] = {1, p->latent_channels, h, w};
    cdf_tensor *eps = NULL;
    CDF_TRY(cdf_pipe_draw(p, g, 4, lshape, 0, 1, &eps));
    cdf_tensor *sample = cdf_add(mean, cdf_mul(std, eps));
    /* (latents - shift_factor) * scaling_factor */
    *image_latents = cdf_scale(cdf_add_scalar(sample, -(float)p->vae_shift_factor), (float)p->vae_scaling_factor);
    if (!*image_latents) return status_or_internal();
    cdf_pipe_capture(gp, "image_latents", *image_latents);
    return CDF_OK;
}

cdf_status cdf_pipe_prepare_mask(cdf_pipeline *p, const cdf_generate_params *gp, int64_t h, int64_t w, bool packed,
                                 cdf_tensor **mask, cdf_tensor **inv_mask) {
    *mask = *inv_mask = NULL;
    const int H = gp->height, W = gp->width;
    float *m = NULL;
    CDF_TRY(cdf_pipe_preprocess_mask(gp->mask_image, W, H, &m));
    int64_t mshape[4] = {1, 1, H, W};
    cdf_pipe_capture(gp, "mask_condition", cdf_tensor_from_host(p->device, CDF_F32, 4, mshape, m, CDF_F32));
    /* F.interpolate(mask, size=(h, w)) (mode "nearest": src = floor(dst * (in / out) as float)),
     * repeated over the latent channels; Flux packs it like the latents */
    const int64_t C = p->latent_channels, n = C * h * w;
    float *v = malloc((size_t)n * sizeof *v), *iv = malloc((size_t)n * sizeof *iv);
    if (!v || !iv) {
        free(m), free(v), free(iv);
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (mask)");
    }
    const float sy = (float)H / (float)h, sx = (float)W / (float)w;
    for (int64_t c = 0; c < C; c++)
        for (int64_t y = 0; y < h; y++)
            for (int64_t x = 0; x < w; x++) {
                int64_t iy = (int64_t)floorf((float)y * sy), ix = (int64_t)floorf((float)x * sx);
                if (iy > H - 1) iy = H - 1;
                if (ix > W - 1) ix = W - 1;
                float val = m[iy * W + ix];
                int64_t idx = packed ? ((y / 2) * (w / 2) + x / 2) * (C * 4) + c * 4 + (y % 2) * 2 + (x % 2) : (c * h + y) * w + x;
                v[idx] = val;
                iv[idx] = 1.0f - val;
            }
    free(m);
    int64_t shape_u[4] = {1, C, h, w}, shape_p[3] = {1, (h / 2) * (w / 2), C * 4};
    *mask = cdf_tensor_from_host(p->device, CDF_F32, packed ? 3 : 4, packed ? shape_p : shape_u, v, CDF_F32);
    *inv_mask = cdf_tensor_from_host(p->device, CDF_F32, packed ? 3 : 4, packed ? shape_p : shape_u, iv, CDF_F32);
    free(v);
    free(iv);
    return *mask && *inv_mask ? CDF_OK : status_or_internal();
}

cdf_status cdf_pipe_denoise(cdf_pipeline *p, const cdf_generate_params *gp, cdf_denoise_loop *L) {
    const int N = L->num_steps, n_run = N - L->t_start;
    cdf_tensor *latents = L->latents;
    cdf_status s = CDF_OK;
    for (int i = L->t_start; i < N && s == CDF_OK; i++) {
        const int k = i - L->t_start; /* steps run so far */
        double t0 = now_s();
        cdf_scope_push();
        cdf_tensor *v = L->predict(L->ctx, latents, i, L->timesteps[i]);
        /* the transformer's last forward is queued: offload may start the VAE's load beside it */
        if (v && i == N - 1 && p->last_forward_queued) s = p->last_forward_queued(p);
        cdf_tensor *next = v ? cdf_pipe_euler_step(latents, v, L->sigmas[i], L->sigmas[i + 1]) : NULL;
        if (next && L->mask) {
            /* inpainting: keep the known region at the noise level of the next step */
            cdf_tensor *x0 = i < N - 1 ? cdf_pipe_scale_noise(L->image_latents, L->noise, L->sigmas[i + 1]) : L->image_latents;
            next = cdf_add(cdf_mul(L->inv_mask, x0), cdf_mul(L->mask, next));
        }
        if (!next && s == CDF_OK) s = status_or_internal();
        if (s == CDF_OK && gp->capture && L->step_key) {
            char key[64];
            snprintf(key, sizeof key, L->step_key, k);
            cdf_pipe_capture(gp, key, next);
        }
        cdf_scope_pop(next ? &next : NULL, next ? 1 : 0);
        if (s != CDF_OK) break;
        latents = next;
        if (gp->callback) {
            /* the callback reports wall time per step, so it waits for the step to finish */
            s = cdf_device_synchronize(p->device);
            if (s == CDF_OK && !gp->callback(k + 1, n_run, now_s() - t0, gp->callback_user))
                s = cdf_error(CDF_ERR_INTERRUPTED, "generation cancelled at step %d of %d", k + 1, n_run);
        }
    }
    L->latents = latents;
    return s;
}

cdf_status cdf_pipe_start_latents(cdf_pipeline *p, const cdf_generate_params *gp, int64_t c, int64_t h, int64_t w,
                                  const float *sigmas, int t_start, cdf_pipe_start *st) {
    memset(st, 0, sizeof *st);
    cdf_generator *g = cdf_generator_new(gp->seed);
    if (!g) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (generator)");
    int64_t shape[4] = {1, c, h, w};
    cdf_status s = CDF_OK;
    if (gp->image) {
        st->t_start = t_start; /* cdf_pipe_schedule's; >= 1 step left: checked by validate() */
        /* a seed list's image k > 0: the sample from generator[0]'s first draw, the noise from the
         * image's own generator, fresh */
        cdf_generator *ge = p->encode_seed_set ? cdf_generator_new(p->encode_seed) : g;
        s = ge ? cdf_pipe_encode_image(p, gp, ge, h, w, &st->image_latents)
               : cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (generator)");
        if (ge != g) cdf_generator_free(ge);
    }
    if (s == CDF_OK) s = cdf_pipe_draw(p, g, 4, shape, p->batch_row, p->batch_rows, &st->noise);
    cdf_generator_free(g);
    if (s != CDF_OK) return s;
    cdf_pipe_capture(gp, "noise", st->noise);
    /* StableDiffusion3InpaintPipeline: `latents = noise if is_strength_max else scale_noise(...)` with
     * is_strength_max = strength == 1.0 (FluxInpaintPipeline and the img2img pipelines always scale) */
    const bool noise_only = p->kind == CDF_PIPE_SD3 && gp->mask_image && gp->strength == 1.0;
    st->latents = st->image_latents && !noise_only ? cdf_pipe_scale_noise(st->image_latents, st->noise, sigmas[st->t_start])
                                                   : st->noise;
    return st->latents ? CDF_OK : status_or_internal();
}
