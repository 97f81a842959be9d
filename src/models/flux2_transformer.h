/* FLUX.2 Flux2Transformer2DModel (diffusers models/transformers/transformer_flux2.py) — the C-level
 * entry point the Flux2Pipeline uses besides the generic component interface
 * (cdf_flux2_transformer_class, class name "Flux2Transformer2DModel"). Covers FLUX.2-dev
 * (guidance embedding) and FLUX.2-klein (none); the KV-cache reference-image modes of diffusers'
 * forward are not implemented. */
#ifndef CDF_MODELS_FLUX2_TRANSFORMER_H
#define CDF_MODELS_FLUX2_TRANSFORMER_H

#include <stdbool.h>

#include "models/component.h"
#include "models/flux_common.h"

/* config.json, with diffusers' defaults for absent keys. */
typedef struct cdf_flux2_config {
    int64_t patch_size;                 /* 1 */
    int64_t in_channels;                /* 128 (32 latent channels x 2x2 patch) */
    int64_t out_channels;               /* null -> in_channels */
    int64_t num_layers;                 /* 8 double-stream blocks */
    int64_t num_single_layers;          /* 48 single-stream blocks */
    int64_t attention_head_dim;         /* 128 */
    int64_t num_attention_heads;        /* 48 */
    int64_t joint_attention_dim;        /* 15360 (3 Mistral layers x 5120) */
    int64_t timestep_guidance_channels; /* 256 (sinusoidal projection width) */
    double mlp_ratio;                   /* 3.0 */
    double rope_theta;                  /* 2000 */
    double eps;                         /* 1e-6: every LayerNorm and q/k RMSNorm */
    bool guidance_embeds;               /* true (dev); false (klein) */
    int n_axes;                         /* len(axes_dims_rope) */
    int64_t axes_dims_rope[CDF_FLUX_MAX_ROPE_AXES]; /* (32, 32, 32, 32); must sum to attention_head_dim */
    /* derived */
    int64_t inner_dim;      /* num_attention_heads * attention_head_dim */
    int64_t mlp_hidden_dim; /* int(inner_dim * mlp_ratio): SwiGLU width of every feed-forward */
} cdf_flux2_config;

extern const cdf_component_class cdf_flux2_transformer_class;

/* The forward arguments, named like diffusers' (the golden io names). ids are integer (i64/i32)
 * or float tensors [L, n] or [N, L, n] (entry 0 is used, as diffusers does) with n >= n_axes
 * (the first n_axes columns are used, like Flux2PosEmbed). guidance is used only when the model
 * has a guidance embedding; as in diffusers, it may be NULL (then no guidance term is added) and
 * is ignored by models without one (klein). */
typedef struct cdf_flux2_inputs {
    cdf_tensor *hidden_states;         /* [B, L_img, in_channels] packed latents */
    cdf_tensor *encoder_hidden_states; /* [B, L_txt, joint_attention_dim] */
    cdf_tensor *timestep;              /* [B] or [1], sigma-scale (t / 1000); multiplied by 1000 inside */
    cdf_tensor *img_ids;               /* [L_img, n_axes] or [N, L_img, n_axes] */
    cdf_tensor *txt_ids;               /* [L_txt, n_axes] or [N, L_txt, n_axes] */
    cdf_tensor *guidance;              /* [B] or [1], or NULL; multiplied by 1000 inside */
} cdf_flux2_inputs;

/* impl: the object cdf_flux2_transformer_class.load returned. On success *sample is
 * [B, L_img, patch_size^2 * out_channels] f32, a new reference recorded in the caller's current
 * scope like any tensor-op result. Intermediates are released block by block. Errors:
 * CDF_ERR_NOT_FOUND (a required input is NULL), CDF_ERR_SHAPE (an input disagrees with the
 * config or the others; the message names it), plus those of the tensor ops. */
cdf_status cdf_flux2_transformer_forward(void *impl, const cdf_flux2_inputs *in, cdf_tensor **sample);
/* MagCache's parts (docs/step-caches.md), results in the caller's scope: the forward with its
 * residual over every block (the last block's image tokens - the embedded latents); the
 * embeddings only (*x the embedded latents, *temb); the output layers on x + residual. */
cdf_status cdf_flux2_cache_full(void *impl, const cdf_flux2_inputs *in, cdf_tensor **sample, cdf_tensor **residual);
cdf_status cdf_flux2_cache_embed(void *impl, const cdf_flux2_inputs *in, cdf_tensor **x, cdf_tensor **temb);
cdf_status cdf_flux2_cache_skip(void *impl, cdf_tensor *x, cdf_tensor *residual, cdf_tensor *temb, cdf_tensor **sample);
const cdf_flux2_config *cdf_flux2_transformer_config(const void *impl);

#endif
