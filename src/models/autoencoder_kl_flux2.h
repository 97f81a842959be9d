/* FLUX.2 VAE: diffusers AutoencoderKLFlux2 (models/autoencoders/autoencoder_kl_flux2.py) and the
 * latent bookkeeping Flux2Pipeline does around it (pipelines/flux2/pipeline_flux2.py):
 *
 *   encode:  x -> Encoder -> quant_conv -> DiagonalGaussian (mean, logvar, std)
 *   decode:  z -> post_quant_conv -> Decoder -> sample
 *   the pipeline's latents are 2x2-patchified VAE latents normalised by the VAE's BatchNorm
 *   running statistics (`bn`, affine=False, never run as a layer):
 *     _encode_vae_image:  (patchify(mean) - running_mean) / sqrt(running_var + eps)
 *     decode:             unpatchify(unpack(packed, ids) * sqrt(running_var + eps) + running_mean)
 *
 * The component class is cdf_autoencoder_kl_flux2_class ("AutoencoderKLFlux2"); its impl is a
 * cdf_flux2_vae, whose first member is the shared cdf_autoencoder_kl, so cdf_vae_decode /
 * cdf_vae_encode_mean (models/vae.h) also accept it.
 *
 * Tensors returned here behave like tensor-op results: a new reference recorded in the caller's
 * current scope; NULL (with cdf_last_error set) on failure; NULL inputs give NULL. */
#ifndef CDF_MODELS_AUTOENCODER_KL_FLUX2_H
#define CDF_MODELS_AUTOENCODER_KL_FLUX2_H

#include "models/component.h"
#include "models/vae.h"

typedef struct cdf_flux2_vae {
    cdf_autoencoder_kl kl;   /* first member (see above) */
    cdf_tensor *bn_mean;     /* bn.running_mean [bn_channels] f32 */
    cdf_tensor *bn_var;      /* bn.running_var  [bn_channels] f32 */
    int64_t bn_channels;     /* prod(patch_size) * latent_channels */
    double batch_norm_eps;   /* config batch_norm_eps (1e-4) */
    int n_patch;             /* len(patch_size) */
    int64_t patch_size[4];   /* config patch_size ((2, 2)) */
} cdf_flux2_vae;

extern const cdf_component_class cdf_autoencoder_kl_flux2_class;

/* ---- latent layout helpers (pure views/copies, no model needed) ---------------------------- */
/* Flux2Pipeline._patchify_latents: [B, C, H, W] -> [B, 4C, H/2, W/2], channel c*4 + dy*2 + dx.
 * H and W must be even (CDF_ERR_SHAPE otherwise). */
cdf_tensor *cdf_flux2_patchify_latents(cdf_tensor *x);
/* _unpatchify_latents, the inverse: [B, 4C, h, w] -> [B, C, 2h, 2w]. */
cdf_tensor *cdf_flux2_unpatchify_latents(cdf_tensor *x);
/* _pack_latents: [B, C, H, W] -> [B, H*W, C] (token = row * W + col), contiguous. */
cdf_tensor *cdf_flux2_pack_latents(cdf_tensor *x);
/* _unpack_latents_with_ids: tokens x [B, L, C] scattered to [B, C, h, w] by their position ids
 * [B, L, n] (or [L, n] / [1, L, n] for every batch entry; n >= 3): column 1 is the row, column 2
 * the column, h = max(row) + 1, w = max(col) + 1; cells no token names stay 0. Ids must be
 * non-negative and give the same grid for every batch entry (torch.stack would fail otherwise). */
cdf_tensor *cdf_flux2_unpack_latents_with_ids(cdf_tensor *x, cdf_tensor *ids);

/* ---- BatchNorm statistics (the pipeline's latent normalisation) --------------------------- */
/* (x - running_mean) / sqrt(running_var + eps) and x * sqrt(running_var + eps) + running_mean,
 * per channel of x [B, bn_channels, h, w], each step a float32 op in torch's order. */
cdf_tensor *cdf_flux2_vae_bn_normalize(const cdf_flux2_vae *v, cdf_tensor *x);
cdf_tensor *cdf_flux2_vae_bn_denormalize(const cdf_flux2_vae *v, cdf_tensor *x);

/* ---- what Flux2Pipeline does with the VAE ----------------------------------------------- */
/* Final decode: packed [B, L, bn_channels] + ids -> unpack -> denormalize -> unpatchify
 * (= *decode_latents [B, latent_channels, 2h, 2w] if non-NULL, also scope-recorded) -> decode ->
 * sample [B, out_channels, 2h*f, 2w*f]. */
cdf_tensor *cdf_flux2_vae_decode_packed(const cdf_flux2_vae *v, cdf_tensor *packed, cdf_tensor *ids,
                                        cdf_tensor **decode_latents);
/* Flux2Pipeline._encode_vae_image: image [B, in_channels, H, W] -> normalize(patchify(
 * encode(image).latent_dist.mode())) [B, bn_channels, H/(2f), W/(2f)]. */
cdf_tensor *cdf_flux2_vae_encode_latents(const cdf_flux2_vae *v, cdf_tensor *image);

#endif
