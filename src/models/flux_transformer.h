/* FLUX.1 FluxTransformer2DModel (diffusers models/transformers/transformer_flux.py) — the C-level
 * entry point the FluxPipeline uses besides the generic component interface
 * (cdf_flux_transformer_class, class name "FluxTransformer2DModel"). */
#ifndef CDF_MODELS_FLUX_TRANSFORMER_H
#define CDF_MODELS_FLUX_TRANSFORMER_H

#include <stdbool.h>

#include "models/component.h"
#include "models/flux_common.h"

/* config.json, with diffusers' defaults for absent keys. */
typedef struct cdf_flux_config {
    int64_t patch_size;            /* 1 */
    int64_t in_channels;           /* 64 */
    int64_t out_channels;          /* null -> in_channels */
    int64_t num_layers;            /* 19 double-stream blocks */
    int64_t num_single_layers;     /* 38 single-stream blocks */
    int64_t attention_head_dim;    /* 128 */
    int64_t num_attention_heads;   /* 24 */
    int64_t joint_attention_dim;   /* 4096 (T5 width) */
    int64_t pooled_projection_dim; /* 768 (CLIP pooled width) */
    bool guidance_embeds;          /* false (schnell); true for dev */
    int n_axes;                    /* len(axes_dims_rope) */
    int64_t axes_dims_rope[CDF_FLUX_MAX_ROPE_AXES]; /* (16, 56, 56); must sum to attention_head_dim */
    /* derived */
    int64_t inner_dim;      /* num_attention_heads * attention_head_dim */
    int64_t mlp_hidden_dim; /* int(inner_dim * 4.0) (single-stream blocks' MLP) */
} cdf_flux_config;

extern const cdf_component_class cdf_flux_transformer_class;

/* The forward arguments, named like diffusers' (the golden io names). guidance is NULL when the
 * model has no guidance embedding (schnell); required when it has (dev). ids may be [L, n_axes]
 * or the deprecated [1, L, n_axes] (the first batch entry is used, as diffusers does). */
typedef struct cdf_flux_inputs {
    cdf_tensor *hidden_states;         /* [B, L_img, in_channels] packed latents */
    cdf_tensor *encoder_hidden_states; /* [B, L_txt, joint_attention_dim] */
    cdf_tensor *pooled_projections;    /* [B, pooled_projection_dim] */
    cdf_tensor *timestep;              /* [B] or [1], sigma-scale (t / 1000); multiplied by 1000 inside */
    cdf_tensor *img_ids;               /* [L_img, n_axes] */
    cdf_tensor *txt_ids;               /* [L_txt, n_axes] */
    cdf_tensor *guidance;              /* [B] or [1], or NULL; multiplied by 1000 inside */
} cdf_flux_inputs;

/* impl: the object cdf_flux_transformer_class.load returned. On success *sample is
 * [B, L_img, patch_size^2 * out_channels] f32, a new reference recorded in the caller's current
 * scope like any tensor op result (with no scope open, the caller releases it). Intermediates
 * are released block by block. Errors: CDF_ERR_NOT_FOUND (a required input is NULL),
 * CDF_ERR_SHAPE (an input disagrees with the config or with the others; the message names it),
 * plus those of the tensor ops. */
cdf_status cdf_flux_transformer_forward(void *impl, const cdf_flux_inputs *in, cdf_tensor **sample);
/* The same, and (residual non-NULL) *residual = the last block's image stream - the embedded
 * latents [B, Li, D] (MagCache's residual over every block). */
cdf_status cdf_flux_transformer_forward_residual(void *impl, const cdf_flux_inputs *in, cdf_tensor **sample, cdf_tensor **residual);
/* TaylorSeer (docs/step-caches.md): the attention modules, in block order: double block i is
 * attn[2i] (image, after to_out) and attn[2i + 1] (text, after to_add_out), single block j is
 * attn[2 num_layers + j] (the attention over the joint sequence). predict false: the forward,
 * and attn[k] = new references to every module's output; true: the forward with attn[k] in
 * place of every attention module (not run). */
int cdf_flux_attention_modules(const void *impl);
cdf_status cdf_flux_transformer_forward_taylor(void *impl, const cdf_flux_inputs *in, bool predict, cdf_tensor **attn,
                                               cdf_tensor **sample);
const cdf_flux_config *cdf_flux_transformer_config(const void *impl);

/* diffusers' First Block Cache (docs/step-caches.md) splits the forward at the first block:
 * head = embeddings + transformer_blocks.0, tail = the other blocks + output layers, skip = the
 * output layers on head output + cached tail residual. All tensors are new references recorded
 * in the caller's scope. */
typedef struct cdf_flux_fbc_state {
    cdf_tensor *x, *ctx;      /* image [B, Li, D] and text [B, Lt, D] streams after the head block */
    cdf_tensor *temb;         /* [B, D] */
    cdf_tensor *cos_t, *sin_t; /* RoPE tables of the joint sequence */
    cdf_tensor *residual;     /* head block output - input, image stream [B, Li, D] */
} cdf_flux_fbc_state;
/* Needs num_layers >= 1 and num_layers + num_single_layers >= 2 (else CDF_ERR_UNSUPPORTED). */
cdf_status cdf_flux_fbc_head(void *impl, const cdf_flux_inputs *in, cdf_flux_fbc_state *st);
/* st: x, ctx, temb, cos_t, sin_t of fbc_head. *tail_residual: tail output - head output (image). */
cdf_status cdf_flux_fbc_tail(void *impl, const cdf_flux_fbc_state *st, cdf_tensor **sample, cdf_tensor **tail_residual);
cdf_status cdf_flux_fbc_skip(void *impl, cdf_tensor *x, cdf_tensor *tail_residual, cdf_tensor *temb, cdf_tensor **sample);
/* The embeddings only: *x the embedded latents [B, Li, D], *temb [B, D] (MagCache skips every
 * block: its skipped step is fbc_skip(x, residual, temb)). */
cdf_status cdf_flux_cache_embed(void *impl, const cdf_flux_inputs *in, cdf_tensor **x, cdf_tensor **temb);

#endif
