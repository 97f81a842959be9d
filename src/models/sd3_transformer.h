/* SD3Transformer2DModel (Stable Diffusion 3 / 3.5 MMDiT), as diffusers' transformer_sd3.py.
 *
 * Loaded through the component registry (config "_class_name": "SD3Transformer2DModel").
 * run(method "forward") reads, by diffusers' argument names:
 *   hidden_states          [B, in_channels, H, W]  latents, NCHW (not packed)
 *   encoder_hidden_states  [B, T, joint_attention_dim]
 *   pooled_projections     [B, pooled_projection_dim]
 *   timestep               [B] or [1] (or a scalar), on the scheduler's 0..1000 scale
 * and writes out.sample [B, out_channels, H, W].
 * H and W must be multiples of patch_size with H/patch_size and W/patch_size at most
 * pos_embed_max_size (diffusers raises for the latter; see sd3_transformer.c for the former). */
#ifndef CDF_MODELS_SD3_TRANSFORMER_H
#define CDF_MODELS_SD3_TRANSFORMER_H

#include "models/component.h"

extern const cdf_component_class cdf_sd3_transformer_class;

#endif
