/* Pieces shared by the FLUX transformers (FLUX.1 FluxTransformer2DModel, later FLUX.2):
 * the multi-axis rotary tables (FluxPosEmbed), the two-layer SiLU MLPs of the time/text
 * embedders, AdaLN modulation and the rotary joint attention core.
 *
 * Tensors returned by these helpers behave like tensor-op results: a new reference, recorded in
 * the caller's current scope; NULL (with cdf_last_error set) on failure; NULL inputs give NULL. */
#ifndef CDF_MODELS_FLUX_COMMON_H
#define CDF_MODELS_FLUX_COMMON_H

#include "nn/nn.h"

/* Limits on config values (sizes read from config.json are checked before allocating). */
#define CDF_FLUX_MAX_ROPE_AXES 8

/* FluxPosEmbed: for every row r of pos [rows, n_axes] (the float32 values of ids.float()) and
 * every axis a, diffusers' get_1d_rotary_pos_embed(axes_dim[a], pos[:, a], theta,
 * repeat_interleave_real=True, use_real=True, freqs_dtype=float64): frequencies
 * 1 / theta^(2k / dim) and angles pos * freq in float64, cos/sin of each angle written twice
 * (interleaved pairs), cast once to float32. The axes' blocks are concatenated in axis order, so
 * both tables are [rows, sum(axes_dim)] f32 on dev. Every axes_dim must be even and positive. */
cdf_status cdf_flux_rope_tables(cdf_device *dev, const float *pos, int64_t rows, int n_axes, const int64_t *axes_dim,
                                double theta, cdf_tensor **cos_out, cdf_tensor **sin_out);

/* diffusers TimestepEmbedding (act "silu") and PixArtAlphaTextProjection(act_fn="silu"): both
 * are linear_2(silu(linear_1(x))) with parameters "<prefix>.linear_1" and "<prefix>.linear_2". */
typedef struct cdf_flux_mlp {
    cdf_linear_layer linear_1, linear_2;
} cdf_flux_mlp;
/* bias as for cdf_linear_load (1 required, 0 none, -1 optional), for both linears. */
cdf_status cdf_flux_mlp_load(cdf_weights *w, cdf_flux_mlp *m, int64_t in, int64_t hidden, int64_t out, int bias,
                             const char *prefix);
void cdf_flux_mlp_free(cdf_flux_mlp *m);
cdf_tensor *cdf_flux_mlp_fwd(const cdf_flux_mlp *m, cdf_tensor *x);

/* AdaLN modulation of a token sequence: x [B, L, D] * (1 + scale[:, None]) + shift[:, None],
 * with shift, scale [B, D] (in diffusers' order of operations, so float32 rounding matches). */
cdf_tensor *cdf_flux_modulate(cdf_tensor *x, cdf_tensor *shift, cdf_tensor *scale);
/* Gated residual: residual [B, L, D] + gate[:, None] * y. */
cdf_tensor *cdf_flux_gated_add(cdf_tensor *residual, cdf_tensor *gate, cdf_tensor *y);

/* [B, L, H * head_dim] -> [B, L, H, head_dim] (a view; unflatten(-1, (-1, head_dim))). */
cdf_tensor *cdf_flux_split_heads(cdf_tensor *x, int64_t head_dim);

/* The FluxAttnProcessor core after the q/k norms and the [text; image] concatenation:
 * q, k, v [B, L, H, head_dim] -> RoPE on q and k (cos/sin [L, head_dim], NULL for none) ->
 * softmax(q k^T / sqrt(head_dim)) v -> [B, L, H * head_dim]: f32, or in dt (the dtype attention
 * computes in) when keep_dt — for a result only layers that round their input to dt read
 * (nn.h: cdf_linears_round_input). */
cdf_tensor *cdf_flux_rope_attention(cdf_tensor *q, cdf_tensor *k, cdf_tensor *v, cdf_tensor *cos_t, cdf_tensor *sin_t,
                                    cdf_dtype dt, bool keep_dt);

/* Config checks the FLUX.1 and FLUX.2 loaders share; errors are CDF_ERR_FORMAT naming
 * "<dir>/config.json" and the key. */
typedef struct cdf_flux_range {
    const char *key;
    int64_t v, lo, hi;
} cdf_flux_range;
/* The first of the n values outside its lo..hi. */
cdf_status cdf_flux_check_ranges(const char *dir, const cdf_flux_range *r, size_t n);
/* *inner = heads x head_dim, at most 2^20. */
cdf_status cdf_flux_inner_dim(const char *dir, int64_t heads, int64_t head_dim, int64_t *inner);
/* The rotary table is the concatenation of one block per axis and multiplies q/k per head, so the
 * axes (each positive and even) must exactly tile head_dim. */
cdf_status cdf_flux_check_rope_axes(const char *dir, int n_axes, const int64_t *axes, int64_t head_dim);

/* Helpers the FLUX.1 and FLUX.2 forwards share. */
/* Replace an owned state reference with next (NULL next: the pending error, state untouched). */
cdf_status cdf_flux_replace_state(cdf_tensor **state, cdf_tensor *next);
/* CDF_ERR_SHAPE "<model>: input '<name>' is <shape> but must be <want>". */
cdf_status cdf_flux_input_shape_error(const char *model, const char *name, const cdf_tensor *t, const char *want);
/* timestep / guidance: 1-D with one value per batch entry (or one value for all). */
cdf_status cdf_flux_check_per_batch(const char *model, const char *name, const cdf_tensor *t, int64_t B);

#endif
