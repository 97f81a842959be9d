/* cdiffusers — a generate call's intermediates, for callers that want more than the 8-bit image:
 * the final latents (diffusers' output_type="latent"), the float image (output_type="np"), the
 * latents after each step (callback_on_step_end's "latents"), the prompt embeddings.
 *
 *     cdf_capture *cap; cdf_capture_new(&cap);
 *     gp.capture = cap;                       // cdf_generate_params.capture
 *     cdf_pipeline_generate(pipe, &gp, &img);
 *     cdf_tensor *lat = cdf_capture_get(cap, "latents_final");
 *
 * Keys are the golden pipelines' (tests/data/pipelines/README): "noise", "latents_initial",
 * "latents_after_step.<i>", "latents_final" (FLUX: packed [B, tokens, C*4], as diffusers returns
 * them), "vae_decode_output", "image" ([1, H, W, 3] f32 in [0, 1]), "timesteps", "sigmas",
 * "prompt_embeds", ...; with cdf_pipeline_generate_images image k's are also under "<k>.<key>".
 * The tensors may live on the pipeline's device: read them with cdf_tensor_read. */
#ifndef CDIFFUSERS_CAPTURE_H
#define CDIFFUSERS_CAPTURE_H

#include "cdiffusers/error.h"
#include "cdiffusers/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cdf_capture cdf_capture;

cdf_status cdf_capture_new(cdf_capture **out);
/* Drops every tensor (a capture is reused by clearing it between calls). */
void cdf_capture_clear(cdf_capture *c);
void cdf_capture_free(cdf_capture *c); /* NULL is fine */
/* Borrowed (valid until the capture is cleared or freed); NULL when the call did not store it. */
cdf_tensor *cdf_capture_get(const cdf_capture *c, const char *key);

#ifdef __cplusplus
}
#endif
#endif
