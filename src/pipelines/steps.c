/* The steps every pipeline shares: tokenize, the float scalars it feeds the models, classifier-free
 * guidance and the Euler step, VAE decode (with the request's VAE tile), image out, and storing intermediates in the request's
 * capture map. The per-model pipelines (flux_pipeline.c, sd3_pipeline.c, flux2_pipeline.c), the
 * denoising loop (denoise.c) and the step caches call these; they call nothing above them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "pipelines/pipeline_impl.h"
#include "tensor/tensor_impl.h"

cdf_status cdf_pipe_tokenize(cdf_pipeline *p, int which, const char *text, int max_length, cdf_tensor **ids) {
    *ids = NULL;
    int64_t *buf = calloc((size_t)max_length, sizeof *buf);
    if (!buf) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    int n = 0, nu = 0;
    cdf_status s = cdf_tokenizer_encode(p->tokenizer[which], text, strlen(text), max_length, true, buf, NULL, &n, &nu);
    if (s == CDF_OK) {
        int64_t shape[2] = {1, n};
        *ids = cdf_tensor_from_host(p->device, CDF_I64, 2, shape, buf, CDF_I64);
        if (!*ids) s = cdf_last_status();
    }
    free(buf);
    return s;
}

cdf_tensor *cdf_pipe_scalar_tensor(cdf_device *dev, float v, int64_t n) {
    int64_t s[1] = {n};
    return cdf_tensor_full(dev, CDF_F32, 1, s, v);
}

cdf_tensor *cdf_pipe_vae_decode(cdf_pipeline *p, cdf_tensor *latents, bool with_shift, cdf_tensor **decode_input) {
    /* torch: latents / scaling_factor + shift_factor, each a float32 op with the scalar as float */
    cdf_tensor *sf = cdf_pipe_scalar_tensor(p->device, (float)p->vae_scaling_factor, 1);
    cdf_tensor *z = cdf_div(latents, sf);
    if (with_shift) z = cdf_add_scalar(z, (float)p->vae_shift_factor);
    if (!z) return NULL;
    if (decode_input) *decode_input = z;
    cdf_tensor_map in, out;
    cdf_tensor_map_init(&in);
    cdf_tensor_map_init(&out);
    cdf_tensor *r = NULL;
    if (cdf_tensor_map_set(&in, "z", z) == CDF_OK && cdf_pipe_vae_tiling_inputs(p, &in) == CDF_OK &&
        cdf_component_run(p->vae, "decode", &in, &out) == CDF_OK) {
        r = cdf_tensor_map_get(&out, "out.decode_sample");
        if (r) {
            r = cdf_tensor_retain(r);
            cdf_scope_record(r);
        } else {
            cdf_error(CDF_ERR_INTERNAL, "VAE decode produced no out.decode_sample");
        }
    }
    cdf_tensor_map_clear(&in);
    cdf_tensor_map_clear(&out);
    return r;
}

/* (x / 2 + 0.5).clamp(0, 1) -> uint8 HWC with numpy's round-half-even, batch element 0. */
static cdf_status to_image(cdf_tensor *decoded, cdf_image *out, cdf_tensor **image_f32) {
    if (!decoded) return cdf_last_status();
    if (cdf_tensor_ndim(decoded) != 4 || cdf_tensor_dim(decoded, 1) != 3)
        return cdf_error(CDF_ERR_SHAPE, "VAE output must be [B, 3, H, W]");
    cdf_tensor *img = cdf_clamp(cdf_add_scalar(cdf_scale(decoded, 0.5f), 0.5f), 0.0f, 1.0f);
    int perm[4] = {0, 2, 3, 1};
    cdf_tensor *hwc = cdf_contiguous(cdf_narrow(cdf_permute(img, perm), 0, 0, 1));
    if (!hwc) return cdf_last_status();
    if (image_f32) *image_f32 = hwc;
    int h = (int)cdf_tensor_dim(hwc, 1), w = (int)cdf_tensor_dim(hwc, 2);
    float *px = cdf_tensor_read_f32(hwc);
    if (!px) return cdf_last_status();
    out->pixels = malloc((size_t)h * w * 3);
    if (!out->pixels) {
        free(px);
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    }
    for (size_t i = 0; i < (size_t)h * w * 3; i++) out->pixels[i] = (uint8_t)rintf(px[i] * 255.0f); /* half-even */
    free(px);
    out->width = w;
    out->height = h;
    out->channels = 3;
    return CDF_OK;
}

cdf_tensor *cdf_pipe_euler_step(cdf_tensor *latents, cdf_tensor *v, float sigma, float sigma_next) {
    float dt = sigma_next - sigma; /* float32, as the scheduler's tensors */
    return cdf_add(latents, cdf_scale(v, dt));
}

cdf_tensor *cdf_pipe_cfg(cdf_tensor *uncond, cdf_tensor *cond, float g) {
    return cdf_add(uncond, cdf_scale(cdf_sub(cond, uncond), g));
}

void cdf_pipe_capture(const cdf_generate_params *gp, const char *key, cdf_tensor *t) {
    if (gp->capture && t) (void)cdf_tensor_map_set((cdf_tensor_map *)gp->capture, key, t);
}

void cdf_image_free(cdf_image *img) {
    if (!img) return;
    free(img->pixels);
    img->pixels = NULL;
}

cdf_status cdf_pipe_image_out(const cdf_generate_params *gp, cdf_tensor *decode_input, cdf_tensor *decoded, cdf_image *out) {
    if (!decoded) return cdf_last_status();
    cdf_pipe_capture(gp, "vae_decode_input", decode_input);
    cdf_pipe_capture(gp, "vae_decode_output", decoded);
    cdf_tensor *image = NULL;
    cdf_status s = to_image(decoded, out, &image);
    cdf_pipe_capture(gp, "image", image);
    return s;
}

cdf_status cdf_pipe_vae_tiling_inputs(cdf_pipeline *p, cdf_tensor_map *in) {
    if (p->vae_tile <= 0) return CDF_OK;
    const int64_t one = 1;
    cdf_tensor *t = cdf_tensor_from_host(p->device, CDF_I64, 1, &one, &p->vae_tile, CDF_I64);
    if (!t) return cdf_last_status() ? cdf_last_status() : cdf_error(CDF_ERR_INTERNAL, "VAE tiling input");
    return cdf_tensor_map_set(in, "tile_sample_min_size", t);
}

void cdf_pipe_capture_schedule(const cdf_pipeline *p, const cdf_generate_params *gp, const float *sigmas, const float *timesteps) {
    /* made only when asked for: cdf_pipe_schedule also runs outside any scope (the fidelity
     * sweeps), where an uncaptured tensor would have no owner */
    if (!gp->capture) return;
    const int N = gp->num_inference_steps;
    int64_t ns1[1] = {N + 1}, ns[1] = {N};
    cdf_pipe_capture(gp, "sigmas", cdf_tensor_from_host(p->device, CDF_F32, 1, ns1, sigmas, CDF_F32));
    cdf_pipe_capture(gp, "timesteps", cdf_tensor_from_host(p->device, CDF_F32, 1, ns, timesteps, CDF_F32));
}
