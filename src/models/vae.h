/* The KL autoencoder shared by the FLUX.1 / SD3 VAE (AutoencoderKL, autoencoder_kl.c) and the
 * FLUX.2 VAE (AutoencoderKLFlux2): diffusers' vae.py Encoder / Decoder built from
 * DownEncoderBlock2D / UpDecoderBlock2D / UNetMidBlock2D (ResnetBlock2D, Downsample2D,
 * Upsample2D, the single-head mid-block Attention), the optional 1x1 quant_conv /
 * post_quant_conv, and the DiagonalGaussianDistribution of the encoder's moments.
 *
 * Another model file reuses it by parsing the shared config keys (cdf_vae_config_parse, with its
 * own class defaults), loading a cdf_autoencoder_kl from its weights, and calling the forward
 * functions below. A model whose impl struct starts with a cdf_autoencoder_kl member can also be
 * driven through cdf_vae_decode / cdf_vae_encode_mean (they take that first member).
 *
 * Tensors returned by these functions behave like tensor-op results: a new reference, recorded
 * in the caller's current scope; NULL (with cdf_last_error set) on failure; NULL inputs give
 * NULL. Internally every activation is released as soon as the next one exists, so the peak
 * memory of a 1024x1024 decode is a few activations, not the whole graph. */
#ifndef CDF_MODELS_VAE_H
#define CDF_MODELS_VAE_H

#include <stdbool.h>

#include "models/component.h"
#include "nn/nn.h"

struct cJSON;

/* Limits on config values (checked before anything is allocated from them). */
#define CDF_VAE_MAX_BLOCKS 8
#define CDF_VAE_MAX_LAYERS_PER_BLOCK 64
#define CDF_VAE_MAX_CHANNELS (1 << 16)

/* diffusers get_activation(): "silu"/"swish" -> SiLU, "gelu" -> GELU (erf), "relu" -> ReLU. */
typedef enum cdf_vae_act { CDF_VAE_ACT_SILU, CDF_VAE_ACT_GELU, CDF_VAE_ACT_RELU } cdf_vae_act;

typedef struct cdf_vae_config {
    int64_t in_channels, out_channels, latent_channels;
    int64_t layers_per_block, norm_num_groups;
    int n_blocks; /* len(block_out_channels) = len(down_block_types) = len(up_block_types) */
    int64_t block_out_channels[CDF_VAE_MAX_BLOCKS];         /* encoder */
    int64_t decoder_block_out_channels[CDF_VAE_MAX_BLOCKS]; /* = block_out_channels for AutoencoderKL */
    cdf_vae_act act_fn;
    bool mid_block_add_attention, use_quant_conv, use_post_quant_conv, force_upcast;
    double scaling_factor;
    bool has_shift_factor; /* shift_factor may be null in config.json (SD 1.x/XL VAEs) */
    double shift_factor;
    int64_t sample_size; /* config sample_size (its first entry when a list): the tile size of
                            diffusers' enable_tiling() */
} cdf_vae_config;

/* AutoencoderKL.__init__ defaults (diffusers autoencoder_kl.py). */
cdf_vae_config cdf_vae_config_kl_defaults(void);
/* Read the keys above from config.json (absent/null -> the value in *defaults), then validate.
 * `source` names the file in messages. decoder_block_out_channels is set to block_out_channels
 * (a caller whose class has its own decoder channels overrides it and validates again). */
cdf_status cdf_vae_config_parse(const struct cJSON *cfg, const cdf_vae_config *defaults, const char *source,
                                cdf_vae_config *out);
/* Every size positive and bounded, every channel count divisible by norm_num_groups (GroupNorm),
 * block counts consistent. Messages name the key and value. */
cdf_status cdf_vae_config_validate(const cdf_vae_config *c, const char *source);

/* ---- modules (public so that another model file can embed them) ------------------------ */
typedef struct cdf_vae_resnet { /* ResnetBlock2D, temb None, output_scale_factor 1 */
    cdf_norm_layer norm1, norm2;
    cdf_conv_layer conv1, conv2;
    bool has_conv_shortcut; /* in_channels != out_channels: 1x1 conv on the residual */
    cdf_conv_layer conv_shortcut;
} cdf_vae_resnet;

typedef struct cdf_vae_attention { /* Attention(_from_deprecated_attn_block): 1 head of dim C */
    cdf_norm_layer group_norm;
    cdf_linear_layer to_q, to_k, to_v, to_out;
} cdf_vae_attention;

typedef struct cdf_vae_mid_block { /* UNetMidBlock2D, num_layers 1: resnet, [attention], resnet */
    cdf_vae_resnet resnets[2];
    bool has_attention;
    cdf_vae_attention attention;
} cdf_vae_mid_block;

typedef struct cdf_vae_block { /* DownEncoderBlock2D / UpDecoderBlock2D */
    int n_resnets;
    cdf_vae_resnet *resnets;
    bool has_sampler;       /* downsamplers.0 / upsamplers.0 (all blocks but the last) */
    cdf_conv_layer sampler; /* its .conv: 3x3 stride 2 pad 0 (down) / 3x3 stride 1 pad 1 (up) */
} cdf_vae_block;

typedef struct cdf_vae_encoder {
    cdf_conv_layer conv_in;
    int n_blocks;
    cdf_vae_block down_blocks[CDF_VAE_MAX_BLOCKS];
    cdf_vae_mid_block mid_block;
    cdf_norm_layer conv_norm_out;
    cdf_conv_layer conv_out; /* -> 2 * latent_channels (mean, logvar) */
    int groups;
    cdf_vae_act act;
} cdf_vae_encoder;

typedef struct cdf_vae_decoder {
    cdf_conv_layer conv_in;
    cdf_vae_mid_block mid_block;
    int n_blocks;
    cdf_vae_block up_blocks[CDF_VAE_MAX_BLOCKS];
    cdf_norm_layer conv_norm_out;
    cdf_conv_layer conv_out;
    int groups;
    cdf_vae_act act;
} cdf_vae_decoder;

typedef struct cdf_autoencoder_kl {
    cdf_vae_config config;
    cdf_vae_encoder encoder;
    cdf_vae_decoder decoder;
    bool has_quant_conv, has_post_quant_conv;
    cdf_conv_layer quant_conv, post_quant_conv; /* 1x1, 2L -> 2L / L -> L */
} cdf_autoencoder_kl;

/* Load "encoder.*", "decoder.*" and (per config) "quant_conv.*", "post_quant_conv.*" into *m
 * (m->config = *c). Missing / wrong-shaped tensors: the error names the tensor. On failure
 * everything loaded so far is released and *m is zeroed. Other tensors in the file are ignored. */
cdf_status cdf_autoencoder_kl_load_weights(cdf_weights *w, const cdf_vae_config *c, cdf_autoencoder_kl *m);
/* Release the tensors *m holds (not m itself); safe on a zeroed struct. */
void cdf_autoencoder_kl_release(cdf_autoencoder_kl *m);

/* Encoder(x) [B, in, H, W] -> moments [B, 2L, H/f, W/f]; then quant_conv if present. */
cdf_tensor *cdf_autoencoder_kl_encode_moments(const cdf_autoencoder_kl *m, cdf_tensor *x);
/* post_quant_conv if present, then Decoder: z [B, L, h, w] -> sample [B, out, h*f, w*f]. */
cdf_tensor *cdf_autoencoder_kl_decode(const cdf_autoencoder_kl *m, cdf_tensor *z);
/* DiagonalGaussianDistribution(moments): mean, logvar = chunk(moments, 2, dim=1); logvar clamped
 * to [-30, 20]; std = exp(0.5 * logvar). Any output pointer may be NULL. Outputs are recorded in
 * the caller's scope. */
cdf_status cdf_vae_posterior(cdf_tensor *moments, cdf_tensor **mean, cdf_tensor **logvar, cdf_tensor **std);

/* The building blocks, for a caller that assembles its own encoder/decoder. */
cdf_tensor *cdf_vae_encoder_forward(const cdf_vae_encoder *e, cdf_tensor *x);
cdf_tensor *cdf_vae_decoder_forward(const cdf_vae_decoder *d, cdf_tensor *z);

/* ---- tiling (diffusers' enable_tiling(): AutoencoderKL / AutoencoderKLFlux2 tiled_decode and
 * _tiled_encode) ------------------------------------------------------------------------------
 * The image is split into tiles of tile_sample_min_size pixels (tile_latent_min_size latent
 * rows/columns) that overlap by tile_overlap_factor, each is run through the whole encoder /
 * decoder on its own, and every tile is blended into the one above and the one to its left
 * (linear ramps over int(tile * overlap) rows/columns of the output, in raster order, each tile
 * already blended with its own neighbours) before the tiles are cropped and concatenated. Only
 * one tile's activations exist at a time, so the peak no longer grows with the image. The result
 * differs from the untiled one (each tile sees only its own context); it equals diffusers' tiled
 * output. As in diffusers, an input no larger than one tile is not tiled. */
typedef struct cdf_vae_tiling {
    bool enabled;
    int64_t tile_sample_min_size; /* pixels */
    int64_t tile_latent_min_size; /* latent rows / columns */
    double tile_overlap_factor;   /* 0.25 */
} cdf_vae_tiling;
/* enable_tiling() on this config: sample = config sample_size, latent =
 * int(sample / 2^(n_blocks - 1)), overlap 0.25 (enabled = true). */
cdf_vae_tiling cdf_vae_tiling_default(const cdf_vae_config *c);
/* The same with the sample tile set to `sample` pixels (the latent tile derived the same way). */
cdf_vae_tiling cdf_vae_tiling_with_size(const cdf_vae_config *c, int64_t sample);
/* Sizes positive, overlap in [0, 1) with a positive step between tiles; the message names the value. */
cdf_status cdf_vae_tiling_validate(const cdf_vae_tiling *t);
/* The component inputs that switch tiling on (static inputs: the values are read on the host and
 * key the compiled graph): "tile_sample_min_size" (pixels; present = tiling on),
 * "tile_latent_min_size" (default derived from it) and "tile_overlap_factor" (default 0.25),
 * each a one-element tensor. Absent: *t = {enabled = false}. */
#define CDF_VAE_TILING_INPUTS "tile_sample_min_size", "tile_latent_min_size", "tile_overlap_factor"
cdf_status cdf_vae_tiling_from_inputs(const cdf_vae_config *c, const cdf_tensor_map *in, const char *model, cdf_vae_tiling *t);
/* decode / encode_moments with tiling (t NULL or disabled: the untiled forward). */
cdf_tensor *cdf_autoencoder_kl_decode_tiled(const cdf_autoencoder_kl *m, cdf_tensor *z, const cdf_vae_tiling *t);
cdf_tensor *cdf_autoencoder_kl_encode_moments_tiled(const cdf_autoencoder_kl *m, cdf_tensor *x, const cdf_vae_tiling *t);

/* ---- entry points for the pipelines ------------------------------------------------------
 * The component class ("AutoencoderKL"); a pipeline can call its .load(dir, cfg, opt, &impl)
 * directly to get an impl for the functions below. */
extern const cdf_component_class cdf_autoencoder_kl_class;
/* impl: what cdf_autoencoder_kl_class.load returned (a cdf_autoencoder_kl *), or any impl whose
 * first member is a cdf_autoencoder_kl. */
/* vae.decode(z).sample (the caller applies z / scaling_factor + shift_factor first). */
cdf_tensor *cdf_vae_decode(void *impl, cdf_tensor *z);
/* vae.encode(x).latent_dist.mean (= .mode()). */
cdf_tensor *cdf_vae_encode_mean(void *impl, cdf_tensor *x);
/* config scaling_factor; shift_factor (0 when the config has none). */
double cdf_vae_scaling_factor(const void *impl);
double cdf_vae_shift_factor(const void *impl);

#endif
