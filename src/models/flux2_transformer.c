/* FLUX.2 transformer: diffusers Flux2Transformer2DModel (transformer_flux2.py at 58eb52c).
 *
 *   temb = timestep_embedder(time_proj(1000 t)) (+ guidance_embedder(time_proj(1000 g)))   [B, D]
 *   mod_img, mod_txt = double_stream_modulation_{img,txt}(temb)  [B, 6D]  shared by all double blocks
 *   mod_single       = single_stream_modulation(temb)            [B, 3D]  shared by all single blocks
 *   x    = x_embedder(hidden_states)                             [B, Li, D]   D = heads * head_dim
 *   ctx  = context_embedder(encoder_hidden_states)               [B, Lt, D]
 *   cos, sin = Flux2PosEmbed(cat(txt_ids, img_ids))              [Lt + Li, head_dim] (4 axes, theta 2000)
 *   num_layers double-stream blocks (joint attention, SwiGLU feed-forwards)
 *   num_single_layers single-stream blocks over [ctx; x] (fused qkv + MLP-in projection)
 *   out  = proj_out(norm_out(x, temb))                            [B, Li, p*p*out_channels]
 *
 * Differences from FLUX.1 that matter: no biases anywhere, no pooled text embedding, the AdaLN
 * modulation is computed once per forward (not per block), the feed-forwards are SwiGLU
 * (silu(first half) * second half) and the single-stream block's q/k/v and MLP input come out
 * of one linear, and its attention and MLP outputs go through one output linear.
 *
 * Activations are f32; weights are f32 or bf16 (cdf_load_options.weight_dtype). */
#include "models/flux2_transformer.h"

#include "compile/compile.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "tensor/tensor_impl.h"
#include "io/json.h"

#define MODEL "Flux2Transformer2DModel"

typedef struct flux2_double_block {
    cdf_linear_layer to_q, to_k, to_v, to_out;                  /* attn.*, attn.to_out.0 */
    cdf_linear_layer add_q_proj, add_k_proj, add_v_proj, to_add_out;
    cdf_norm_layer norm_q, norm_k, norm_added_q, norm_added_k; /* RMSNorm over head_dim */
    cdf_linear_layer ff_in, ff_out;                             /* ff.linear_in [2F, D], ff.linear_out [D, F] */
    cdf_linear_layer ff_context_in, ff_context_out;
} flux2_double_block;

typedef struct flux2_single_block {
    cdf_linear_layer to_qkv_mlp_proj; /* [3D + 2F, D]: q, k, v, then the SwiGLU gate and value halves */
    cdf_norm_layer norm_q, norm_k;
    cdf_linear_layer to_out; /* [D, D + F] over cat(attention, mlp) */
} flux2_single_block;

typedef struct flux2_model {
    cdf_flux2_config cfg;
    cdf_device *dev;
    cdf_tp *tp;           /* tensor-parallel sharding, NULL when the model is whole */
    int64_t local_inner;  /* this rank's attention width: inner_dim / ranks (its heads) */
    int64_t local_mlp;    /* this rank's SwiGLU width: mlp_hidden_dim / ranks */
    cdf_flux_mlp timestep_embedder, guidance_embedder; /* time_guidance_embed.* */
    cdf_linear_layer mod_img, mod_txt, mod_single;     /* *_modulation.linear */
    cdf_linear_layer x_embedder, context_embedder;
    flux2_double_block *blocks;
    flux2_single_block *single_blocks;
    cdf_linear_layer norm_out; /* AdaLayerNormContinuous .linear [2D, D] -> (scale, shift) */
    cdf_linear_layer proj_out;
} flux2_model;

/* Tensor-parallel plan: diffusers' Flux2Transformer2DModel._tp_plan. q/k/v (both streams)
 * column-wise: each rank owns num_attention_heads / N heads; attention outputs row-wise (one
 * all-reduce each). The SwiGLU input projections are packed column-wise over [gate, value] (each
 * rank gets its slice of both halves, so its local swiglu pairs them up again); their outputs
 * row-wise. The single-stream block's fused to_qkv_mlp_proj is packed column-wise over
 * [q, k, v, gate, value] and its to_out packed row-wise over [attention, MLP]. The shared
 * modulation, QK-norms, embedders and output layers are replicated. */
static const cdf_tp_rule FLUX2_TP_PLAN[] = {
    {"transformer_blocks.*.attn.to_q", CDF_TP_COLWISE},
    {"transformer_blocks.*.attn.to_k", CDF_TP_COLWISE},
    {"transformer_blocks.*.attn.to_v", CDF_TP_COLWISE},
    {"transformer_blocks.*.attn.to_out.0", CDF_TP_ROWWISE},
    {"transformer_blocks.*.attn.add_q_proj", CDF_TP_COLWISE},
    {"transformer_blocks.*.attn.add_k_proj", CDF_TP_COLWISE},
    {"transformer_blocks.*.attn.add_v_proj", CDF_TP_COLWISE},
    {"transformer_blocks.*.attn.to_add_out", CDF_TP_ROWWISE},
    {"transformer_blocks.*.ff.linear_in", CDF_TP_PACKED_COLWISE},
    {"transformer_blocks.*.ff.linear_out", CDF_TP_ROWWISE},
    {"transformer_blocks.*.ff_context.linear_in", CDF_TP_PACKED_COLWISE},
    {"transformer_blocks.*.ff_context.linear_out", CDF_TP_ROWWISE},
    {"single_transformer_blocks.*.attn.to_qkv_mlp_proj", CDF_TP_PACKED_COLWISE},
    {"single_transformer_blocks.*.attn.to_out", CDF_TP_PACKED_ROWWISE},
    {NULL, CDF_TP_REPLICATE},
};

/* ---- config ------------------------------------------------------------------------------ */
static cdf_status parse_config(const cJSON *json, const char *dir, cdf_flux2_config *c) {
    memset(c, 0, sizeof *c);
    bool ok = cdf_json_get_int(json, "patch_size", 1, &c->patch_size) == CDF_OK &&
              cdf_json_get_int(json, "in_channels", 128, &c->in_channels) == CDF_OK &&
              cdf_json_get_int(json, "out_channels", 0, &c->out_channels) == CDF_OK &&
              cdf_json_get_int(json, "num_layers", 8, &c->num_layers) == CDF_OK &&
              cdf_json_get_int(json, "num_single_layers", 48, &c->num_single_layers) == CDF_OK &&
              cdf_json_get_int(json, "attention_head_dim", 128, &c->attention_head_dim) == CDF_OK &&
              cdf_json_get_int(json, "num_attention_heads", 48, &c->num_attention_heads) == CDF_OK &&
              cdf_json_get_int(json, "joint_attention_dim", 15360, &c->joint_attention_dim) == CDF_OK &&
              cdf_json_get_int(json, "timestep_guidance_channels", 256, &c->timestep_guidance_channels) == CDF_OK &&
              cdf_json_get_double(json, "mlp_ratio", 3.0, &c->mlp_ratio) == CDF_OK &&
              cdf_json_get_double(json, "rope_theta", 2000.0, &c->rope_theta) == CDF_OK &&
              cdf_json_get_double(json, "eps", 1e-6, &c->eps) == CDF_OK &&
              cdf_json_get_bool(json, "guidance_embeds", true, &c->guidance_embeds) == CDF_OK &&
              cdf_json_get_int_array(json, "axes_dims_rope", c->axes_dims_rope, CDF_FLUX_MAX_ROPE_AXES, &c->n_axes) == CDF_OK;
    if (!ok) return cdf_last_status();
    if (!cdf_json_has(json, "axes_dims_rope")) {
        c->n_axes = 4;
        for (int a = 0; a < 4; a++) c->axes_dims_rope[a] = 32;
    }
    if (c->out_channels == 0) c->out_channels = c->in_channels; /* `out_channels or in_channels` */

    /* Sizes: positive and small enough that products below cannot overflow. */
    const cdf_flux_range ranges[] = {
        {"patch_size", c->patch_size, 1, 64},
        {"in_channels", c->in_channels, 1, 1 << 20},
        {"out_channels", c->out_channels, 1, 1 << 20},
        {"num_layers", c->num_layers, 0, 4096},
        {"num_single_layers", c->num_single_layers, 0, 4096},
        {"attention_head_dim", c->attention_head_dim, 2, 1 << 16},
        {"num_attention_heads", c->num_attention_heads, 1, 1 << 16},
        {"joint_attention_dim", c->joint_attention_dim, 1, 1 << 20},
        {"timestep_guidance_channels", c->timestep_guidance_channels, 2, 1 << 16},
    };
    CDF_TRY(cdf_flux_check_ranges(dir, ranges, sizeof ranges / sizeof *ranges));
    if (!(c->mlp_ratio > 0 && c->mlp_ratio <= 64))
        return cdf_error(CDF_ERR_FORMAT, "%s/config.json: mlp_ratio = %g is outside (0, 64]", dir, c->mlp_ratio);
    if (!(c->rope_theta > 0)) return cdf_error(CDF_ERR_FORMAT, "%s/config.json: rope_theta = %g must be positive", dir, c->rope_theta);
    if (!(c->eps > 0 && c->eps < 1)) return cdf_error(CDF_ERR_FORMAT, "%s/config.json: eps = %g is outside (0, 1)", dir, c->eps);
    CDF_TRY(cdf_flux_inner_dim(dir, c->num_attention_heads, c->attention_head_dim, &c->inner_dim));
    c->mlp_hidden_dim = (int64_t)((double)c->inner_dim * c->mlp_ratio); /* python int() truncates */
    if (c->mlp_hidden_dim < 1)
        return cdf_error(CDF_ERR_FORMAT, "%s/config.json: mlp_ratio %g gives an empty feed-forward for width %lld", dir,
                         c->mlp_ratio, (long long)c->inner_dim);

    return cdf_flux_check_rope_axes(dir, c->n_axes, c->axes_dims_rope, c->attention_head_dim);
}

/* ---- loading ------------------------------------------------------------------------------ */
static void free_model(flux2_model *m) {
    if (!m) return;
    cdf_flux_mlp_free(&m->timestep_embedder);
    cdf_flux_mlp_free(&m->guidance_embedder);
    cdf_linear_layer *top[] = {&m->mod_img, &m->mod_txt, &m->mod_single, &m->x_embedder,
                               &m->context_embedder, &m->norm_out, &m->proj_out};
    for (size_t j = 0; j < sizeof top / sizeof *top; j++) cdf_linear_free(top[j]);
    for (int64_t i = 0; m->blocks && i < m->cfg.num_layers; i++) {
        flux2_double_block *b = &m->blocks[i];
        cdf_linear_layer *lin[] = {&b->to_q, &b->to_k, &b->to_v, &b->to_out, &b->add_q_proj, &b->add_k_proj,
                                   &b->add_v_proj, &b->to_add_out, &b->ff_in, &b->ff_out, &b->ff_context_in,
                                   &b->ff_context_out};
        for (size_t j = 0; j < sizeof lin / sizeof *lin; j++) cdf_linear_free(lin[j]);
        cdf_norm_free(&b->norm_q);
        cdf_norm_free(&b->norm_k);
        cdf_norm_free(&b->norm_added_q);
        cdf_norm_free(&b->norm_added_k);
    }
    for (int64_t i = 0; m->single_blocks && i < m->cfg.num_single_layers; i++) {
        flux2_single_block *b = &m->single_blocks[i];
        cdf_linear_free(&b->to_qkv_mlp_proj);
        cdf_linear_free(&b->to_out);
        cdf_norm_free(&b->norm_q);
        cdf_norm_free(&b->norm_k);
    }
    free(m->blocks);
    free(m->single_blocks);
    cdf_tp_free(m->tp);
    free(m);
}

static cdf_status load_double_block(cdf_weights *w, const cdf_tp *tp, const cdf_flux2_config *c, flux2_double_block *b,
                                    int64_t i) {
    const int64_t D = c->inner_dim, hd = c->attention_head_dim, F = c->mlp_hidden_dim;
    const float eps = (float)c->eps;
    const char *p = "transformer_blocks";
    const long long n = (long long)i;
    CDF_TRY(cdf_tp_linear_load(w, tp, &b->to_q, D, D, 0, "%s.%lld.attn.to_q", p, n));
    CDF_TRY(cdf_tp_linear_load(w, tp, &b->to_k, D, D, 0, "%s.%lld.attn.to_k", p, n));
    CDF_TRY(cdf_tp_linear_load(w, tp, &b->to_v, D, D, 0, "%s.%lld.attn.to_v", p, n));
    CDF_TRY(cdf_tp_linear_load(w, tp, &b->to_out, D, D, 0, "%s.%lld.attn.to_out.0", p, n));
    CDF_TRY(cdf_tp_linear_load(w, tp, &b->add_q_proj, D, D, 0, "%s.%lld.attn.add_q_proj", p, n));
    CDF_TRY(cdf_tp_linear_load(w, tp, &b->add_k_proj, D, D, 0, "%s.%lld.attn.add_k_proj", p, n));
    CDF_TRY(cdf_tp_linear_load(w, tp, &b->add_v_proj, D, D, 0, "%s.%lld.attn.add_v_proj", p, n));
    CDF_TRY(cdf_tp_linear_load(w, tp, &b->to_add_out, D, D, 0, "%s.%lld.attn.to_add_out", p, n));
    CDF_TRY(cdf_norm_load(w, &b->norm_q, hd, 1, 0, eps, "%s.%lld.attn.norm_q", p, n));
    CDF_TRY(cdf_norm_load(w, &b->norm_k, hd, 1, 0, eps, "%s.%lld.attn.norm_k", p, n));
    CDF_TRY(cdf_norm_load(w, &b->norm_added_q, hd, 1, 0, eps, "%s.%lld.attn.norm_added_q", p, n));
    CDF_TRY(cdf_norm_load(w, &b->norm_added_k, hd, 1, 0, eps, "%s.%lld.attn.norm_added_k", p, n));
    /* SwiGLU input: [gate (F); value (F)] rows, split per half (PackedColwiseParallel([1, 1])) */
    const int64_t swiglu_parts[2] = {F, F};
    CDF_TRY(cdf_tp_linear_load_packed_out(w, tp, &b->ff_in, D, 2, swiglu_parts, 0, "%s.%lld.ff.linear_in", p, n));
    CDF_TRY(cdf_tp_linear_load(w, tp, &b->ff_out, F, D, 0, "%s.%lld.ff.linear_out", p, n));
    CDF_TRY(cdf_tp_linear_load_packed_out(w, tp, &b->ff_context_in, D, 2, swiglu_parts, 0, "%s.%lld.ff_context.linear_in", p, n));
    CDF_TRY(cdf_tp_linear_load(w, tp, &b->ff_context_out, F, D, 0, "%s.%lld.ff_context.linear_out", p, n));
    return CDF_OK;
}

static cdf_status load_single_block(cdf_weights *w, const cdf_tp *tp, const cdf_flux2_config *c, flux2_single_block *b,
                                    int64_t i) {
    const int64_t D = c->inner_dim, hd = c->attention_head_dim, F = c->mlp_hidden_dim;
    const float eps = (float)c->eps;
    const char *p = "single_transformer_blocks";
    const long long n = (long long)i;
    /* rows [q (D); k (D); v (D); gate (F); value (F)], each part split across the ranks */
    const int64_t qkv_mlp_parts[5] = {D, D, D, F, F};
    CDF_TRY(cdf_tp_linear_load_packed_out(w, tp, &b->to_qkv_mlp_proj, D, 5, qkv_mlp_parts, 0, "%s.%lld.attn.to_qkv_mlp_proj",
                                          p, n));
    CDF_TRY(cdf_norm_load(w, &b->norm_q, hd, 1, 0, eps, "%s.%lld.attn.norm_q", p, n));
    CDF_TRY(cdf_norm_load(w, &b->norm_k, hd, 1, 0, eps, "%s.%lld.attn.norm_k", p, n));
    /* its input is cat(attention [D], MLP [F]): a packed row-wise plan splits each part */
    const int64_t out_parts[2] = {D, F};
    CDF_TRY(cdf_tp_linear_load_packed(w, tp, &b->to_out, 2, out_parts, D, 0, "%s.%lld.attn.to_out", p, n));
    return CDF_OK;
}

static cdf_status load_weights(cdf_weights *w, void *model) {
    flux2_model *m = model;
    const cdf_flux2_config *c = &m->cfg;
    const int64_t D = c->inner_dim, T = c->timestep_guidance_channels;
    CDF_TRY(cdf_flux_mlp_load(w, &m->timestep_embedder, T, D, D, 0, "time_guidance_embed.timestep_embedder"));
    if (c->guidance_embeds)
        CDF_TRY(cdf_flux_mlp_load(w, &m->guidance_embedder, T, D, D, 0, "time_guidance_embed.guidance_embedder"));
    CDF_TRY(cdf_linear_load(w, &m->mod_img, D, 6 * D, 0, "double_stream_modulation_img.linear"));
    CDF_TRY(cdf_linear_load(w, &m->mod_txt, D, 6 * D, 0, "double_stream_modulation_txt.linear"));
    CDF_TRY(cdf_linear_load(w, &m->mod_single, D, 3 * D, 0, "single_stream_modulation.linear"));
    CDF_TRY(cdf_linear_load(w, &m->x_embedder, c->in_channels, D, 0, "x_embedder"));
    CDF_TRY(cdf_linear_load(w, &m->context_embedder, c->joint_attention_dim, D, 0, "context_embedder"));
    for (int64_t i = 0; i < c->num_layers; i++) CDF_TRY(load_double_block(w, m->tp, c, &m->blocks[i], i));
    for (int64_t i = 0; i < c->num_single_layers; i++) CDF_TRY(load_single_block(w, m->tp, c, &m->single_blocks[i], i));
    CDF_TRY(cdf_linear_load(w, &m->norm_out, D, 2 * D, 0, "norm_out.linear"));
    CDF_TRY(cdf_linear_load(w, &m->proj_out, D, c->patch_size * c->patch_size * c->out_channels, 0, "proj_out"));
    return CDF_OK;
}

static cdf_status flux2_load(const char *dir, const cJSON *cfg, const cdf_load_options *opt, void **impl) {
    *impl = NULL;
    flux2_model *m = calloc(1, sizeof *m);
    if (!m) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    cdf_status s = parse_config(cfg, dir, &m->cfg);
    if (s == CDF_OK) {
        m->blocks = calloc((size_t)m->cfg.num_layers + 1, sizeof *m->blocks);
        m->single_blocks = calloc((size_t)m->cfg.num_single_layers + 1, sizeof *m->single_blocks);
        if (!m->blocks || !m->single_blocks) s = cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (block tables)");
    }
    /* sharded when tensor parallelism is on: heads and the SwiGLU width must divide */
    if (s == CDF_OK) s = cdf_tp_for_component(dir, MODEL, FLUX2_TP_PLAN, &m->tp);
    if (s == CDF_OK) s = cdf_tp_check_divisible(m->tp, "num_attention_heads", m->cfg.num_attention_heads);
    if (s == CDF_OK) s = cdf_tp_check_divisible(m->tp, "mlp_hidden_dim (int(inner_dim x mlp_ratio))", m->cfg.mlp_hidden_dim);
    if (s == CDF_OK) {
        m->local_inner = m->cfg.inner_dim / cdf_tp_size(m->tp);
        m->local_mlp = m->cfg.mlp_hidden_dim / cdf_tp_size(m->tp);
    }
    /* the plan is checked where both block kinds exist (a test model may have none of one) */
    const bool whole = m->cfg.num_layers > 0 && m->cfg.num_single_layers > 0;
    if (s == CDF_OK) s = cdf_model_load_weights(dir, opt, load_weights, m, &m->dev, whole ? m->tp : NULL);
    if (s != CDF_OK) {
        free_model(m);
        return s;
    }
    *impl = m;
    return CDF_OK;
}

static void flux2_free(void *impl) { free_model(impl); }

const cdf_flux2_config *cdf_flux2_transformer_config(const void *impl) {
    return impl ? &((const flux2_model *)impl)->cfg : NULL;
}

/* ---- forward ------------------------------------------------------------------------------ */

static cdf_status status_or_internal(void) { return cdf_last_status() ? cdf_last_status() : CDF_ERR_INTERNAL; }


/* Flux2SwiGLU after a fused linear: x [..., 2F] -> silu(x[..., :F]) * x[..., F:]. */
static cdf_tensor *swiglu(cdf_tensor *x) {
    if (!x) return NULL;
    const int64_t two_f = cdf_tensor_dim(x, -1), f = two_f / 2;
    const int last = cdf_tensor_ndim(x) - 1;
    return cdf_mul(cdf_silu(cdf_narrow(x, last, 0, f)), cdf_narrow(x, last, f, two_f - f));
}

/* Flux2FeedForward: linear_out(swiglu(linear_in(x))). */
static cdf_tensor *feed_forward(const cdf_linear_layer *in, const cdf_linear_layer *out, cdf_tensor *x) {
    return cdf_linear_fwd(out, swiglu(cdf_linear_fwd(in, cdf_linear_shared_input(x, 1, &in))));
}

/* [B, L, H*hd] -> [B, L, H, hd], then RMSNorm over hd (for q and k). */
static cdf_tensor *heads_normed(cdf_tensor *x, const cdf_norm_layer *n, int64_t hd) {
    return cdf_rms_norm(cdf_flux_split_heads(x, hd), n->w, n->eps);
}

/* Flux2TransformerBlock: x [B, Li, D], ctx [B, Lt, D] updated in place (owned references).
 * mi / mt: the image / text modulation chunks (shift, scale, gate) x (attention, feed-forward). */
static cdf_status double_block(const flux2_model *m, const flux2_double_block *b, cdf_tensor **x_io, cdf_tensor **ctx_io,
                               cdf_tensor *const *mi, cdf_tensor *const *mt, cdf_tensor *cos_t, cdf_tensor *sin_t) {
    const int64_t hd = m->cfg.attention_head_dim;
    const float eps = (float)m->cfg.eps;
    cdf_tensor *x = *x_io, *ctx = *ctx_io;
    const int64_t Lt = cdf_tensor_dim(ctx, 1), Li = cdf_tensor_dim(x, 1);
    cdf_scope_push();

    /* (1 + scale) * LayerNorm(.) + shift for both streams */
    cdf_tensor *nx = cdf_flux_modulate(cdf_layer_norm(x, NULL, NULL, eps), mi[0], mi[1]);
    cdf_tensor *nctx = cdf_flux_modulate(cdf_layer_norm(ctx, NULL, NULL, eps), mt[0], mt[1]);
    nx = cdf_linear_shared_input(nx, 3, (const cdf_linear_layer *[]){&b->to_q, &b->to_k, &b->to_v});
    nctx = cdf_linear_shared_input(nctx, 3, (const cdf_linear_layer *[]){&b->add_q_proj, &b->add_k_proj, &b->add_v_proj});

    /* joint attention over [text; image], RoPE on the whole joint sequence */
    cdf_tensor *q = heads_normed(cdf_linear_fwd(&b->to_q, nx), &b->norm_q, hd);
    cdf_tensor *k = heads_normed(cdf_linear_fwd(&b->to_k, nx), &b->norm_k, hd);
    cdf_tensor *v = cdf_flux_split_heads(cdf_linear_fwd(&b->to_v, nx), hd);
    cdf_tensor *cq = heads_normed(cdf_linear_fwd(&b->add_q_proj, nctx), &b->norm_added_q, hd);
    cdf_tensor *ck = heads_normed(cdf_linear_fwd(&b->add_k_proj, nctx), &b->norm_added_k, hd);
    cdf_tensor *cv = cdf_flux_split_heads(cdf_linear_fwd(&b->add_v_proj, nctx), hd);
    cdf_tensor *attn = cdf_flux_rope_attention(cdf_cat((cdf_tensor *[]){cq, q}, 2, 1), cdf_cat((cdf_tensor *[]){ck, k}, 2, 1),
                                               cdf_cat((cdf_tensor *[]){cv, v}, 2, 1), cos_t, sin_t,
                                               cdf_linear_compute_dtype(&b->to_q),
                                               cdf_linears_round_input(2, (const cdf_linear_layer *[]){&b->to_add_out, &b->to_out}));
    /* attn: [B, Lt+Li, D] */
    cdf_tensor *ctx_attn = cdf_linear_fwd(&b->to_add_out, cdf_narrow(attn, 1, 0, Lt));
    cdf_tensor *x_attn = cdf_linear_fwd(&b->to_out, cdf_narrow(attn, 1, Lt, Li));

    /* image stream: gated attention residual, then modulated LayerNorm -> SwiGLU feed-forward */
    x = cdf_flux_gated_add(x, mi[2], x_attn);
    cdf_tensor *ff_in = cdf_flux_modulate(cdf_layer_norm(x, NULL, NULL, eps), mi[3], mi[4]);
    x = cdf_flux_gated_add(x, mi[5], feed_forward(&b->ff_in, &b->ff_out, ff_in));

    /* text stream, same with its own weights */
    ctx = cdf_flux_gated_add(ctx, mt[2], ctx_attn);
    cdf_tensor *cff_in = cdf_flux_modulate(cdf_layer_norm(ctx, NULL, NULL, eps), mt[3], mt[4]);
    ctx = cdf_flux_gated_add(ctx, mt[5], feed_forward(&b->ff_context_in, &b->ff_context_out, cff_in));

    cdf_status s = (x && ctx) ? CDF_OK : status_or_internal();
    if (s == CDF_OK) {
        cdf_flux_replace_state(x_io, x);
        cdf_flux_replace_state(ctx_io, ctx);
    }
    cdf_scope_pop(NULL, 0);
    return s;
}

/* Flux2SingleTransformerBlock on the joint sequence h = [ctx; x] [B, Lt+Li, D]; ms = (shift,
 * scale, gate). One linear gives q, k, v and both SwiGLU halves; one linear maps
 * cat(attention, mlp) back to D. */
static cdf_status single_block(const flux2_model *m, const flux2_single_block *b, cdf_tensor **h_io, cdf_tensor *const *ms,
                               cdf_tensor *cos_t, cdf_tensor *sin_t) {
    /* this rank's widths: its heads' q/k/v and its slice of the SwiGLU (all of them unsharded) */
    const int64_t hd = m->cfg.attention_head_dim, D = m->local_inner, F = m->local_mlp;
    cdf_tensor *h = *h_io;
    cdf_scope_push();

    cdf_tensor *nh = cdf_flux_modulate(cdf_layer_norm(h, NULL, NULL, (float)m->cfg.eps), ms[0], ms[1]);
    nh = cdf_linear_shared_input(nh, 1, (const cdf_linear_layer *[]){&b->to_qkv_mlp_proj});
    cdf_tensor *proj = cdf_linear_fwd(&b->to_qkv_mlp_proj, nh); /* [B, L, 3D + 2F] */
    cdf_tensor *q = heads_normed(cdf_narrow(proj, 2, 0, D), &b->norm_q, hd);
    cdf_tensor *k = heads_normed(cdf_narrow(proj, 2, D, D), &b->norm_k, hd);
    cdf_tensor *v = cdf_flux_split_heads(cdf_narrow(proj, 2, 2 * D, D), hd);
    cdf_tensor *attn = cdf_flux_rope_attention(q, k, v, cos_t, sin_t, cdf_linear_compute_dtype(&b->to_qkv_mlp_proj), false);
    /* attn: [B, L, D] */
    cdf_tensor *mlp = swiglu(cdf_narrow(proj, 2, 3 * D, 2 * F));          /* [B, L, F] */
    cdf_tensor *both = cdf_cat((cdf_tensor *[]){attn, mlp}, 2, 2);        /* [B, L, D + F] */
    h = cdf_flux_gated_add(h, ms[2], cdf_linear_fwd(&b->to_out, both));

    cdf_status s = h ? CDF_OK : status_or_internal();
    if (s == CDF_OK) cdf_flux_replace_state(h_io, h);
    cdf_scope_pop(NULL, 0);
    return s;
}



/* ---- repeated-block compile: every block call goes through cdf_block_run -------------------
 * With its weights listed explicitly (all of them: repeated-block compile binds them as the
 * graph's parameters, and sequential offload materialises exactly these before the block runs),
 * so the two block classes compile one graph each per shape, whatever the number of blocks. The
 * shared modulation enters as whole [B, 6D] / [B, 3D] tensors and is chunked inside the block:
 * the chunks are views, and a graph input should be one tensor, not six views of one buffer. */

typedef struct block_ctx {
    const flux2_model *m;
    const void *block;
} block_ctx;

/* inputs x, ctx, mod_img, mod_txt, cos, sin -> outputs x, ctx */
static cdf_status double_block_traced(void *vctx, const cdf_tensor_map *in, cdf_tensor_map *out) {
    const block_ctx *bc = vctx;
    cdf_tensor *x = cdf_tensor_retain(cdf_tensor_map_get(in, "x")), *ctx = cdf_tensor_retain(cdf_tensor_map_get(in, "ctx"));
    cdf_scope_push();
    cdf_tensor *mi[6] = {0}, *mt[6] = {0};
    cdf_chunk(cdf_tensor_map_get(in, "mod_img"), 6, 1, mi);
    cdf_chunk(cdf_tensor_map_get(in, "mod_txt"), 6, 1, mt);
    cdf_status s = mi[5] && mt[5] ? double_block(bc->m, bc->block, &x, &ctx, mi, mt, cdf_tensor_map_get(in, "cos"),
                                                 cdf_tensor_map_get(in, "sin"))
                                  : status_or_internal();
    cdf_scope_pop(NULL, 0);
    if (s == CDF_OK) s = cdf_tensor_map_set(out, "x", x);
    if (s == CDF_OK) s = cdf_tensor_map_set(out, "ctx", ctx);
    cdf_tensor_release(x);
    cdf_tensor_release(ctx);
    return s;
}

/* inputs h, mod_single, cos, sin -> output h */
static cdf_status single_block_traced(void *vctx, const cdf_tensor_map *in, cdf_tensor_map *out) {
    const block_ctx *bc = vctx;
    cdf_tensor *h = cdf_tensor_retain(cdf_tensor_map_get(in, "h"));
    cdf_scope_push();
    cdf_tensor *ms[3] = {0};
    cdf_chunk(cdf_tensor_map_get(in, "mod_single"), 3, 1, ms);
    cdf_status s = ms[2] ? single_block(bc->m, bc->block, &h, ms, cdf_tensor_map_get(in, "cos"), cdf_tensor_map_get(in, "sin"))
                         : status_or_internal();
    cdf_scope_pop(NULL, 0);
    if (s == CDF_OK) s = cdf_tensor_map_set(out, "h", h);
    cdf_tensor_release(h);
    return s;
}

/* Sets the inputs every block class shares; the map holds its own references. */
static cdf_status set_common(cdf_tensor_map *in, cdf_tensor *cos_t, cdf_tensor *sin_t) {
    cdf_status s = cdf_tensor_map_set(in, "cos", cos_t);
    return s == CDF_OK ? cdf_tensor_map_set(in, "sin", sin_t) : s;
}

/* Replaces *state (an owned reference) by the output `name` of a block run. */
static void take_state(cdf_tensor **state, const cdf_tensor_map *out, const char *name) {
    cdf_tensor_release(*state);
    *state = cdf_tensor_retain(cdf_tensor_map_get(out, name));
}

/* Flux2TransformerBlock i through the repeated-block compiler; *x, *ctx owned, replaced. */
static cdf_status run_double_block(const flux2_model *m, int64_t i, cdf_tensor **x, cdf_tensor **ctx, cdf_tensor *mod_img,
                                   cdf_tensor *mod_txt, cdf_tensor *cos_t, cdf_tensor *sin_t) {
    const flux2_double_block *d = &m->blocks[i];
    cdf_tensor *w[CDF_BLOCK_MAX_WEIGHTS];
    int nw = 0;
    const cdf_linear_layer *lin[] = {&d->to_q, &d->to_k, &d->to_v, &d->to_out, &d->add_q_proj, &d->add_k_proj,
                                     &d->add_v_proj, &d->to_add_out, &d->ff_in, &d->ff_out, &d->ff_context_in,
                                     &d->ff_context_out};
    for (size_t k = 0; k < sizeof lin / sizeof *lin; k++) nw = cdf_linear_list_weights(w, nw, lin[k]);
    const cdf_norm_layer *nrm[] = {&d->norm_q, &d->norm_k, &d->norm_added_q, &d->norm_added_k};
    for (size_t k = 0; k < sizeof nrm / sizeof *nrm; k++) nw = cdf_norm_list_weights(w, nw, nrm[k]);
    block_ctx bc = {m, d};
    cdf_tensor_map in, out;
    cdf_tensor_map_init(&in);
    cdf_tensor_map_init(&out);
    cdf_status s = cdf_tensor_map_set(&in, "x", *x);
    if (s == CDF_OK) s = cdf_tensor_map_set(&in, "ctx", *ctx);
    if (s == CDF_OK) s = cdf_tensor_map_set(&in, "mod_img", mod_img);
    if (s == CDF_OK) s = cdf_tensor_map_set(&in, "mod_txt", mod_txt);
    if (s == CDF_OK) s = set_common(&in, cos_t, sin_t);
    if (s == CDF_OK) s = cdf_block_run("Flux2TransformerBlock", double_block_traced, &bc, &in, &out, w, nw);
    if (s == CDF_OK) {
        take_state(x, &out, "x");
        take_state(ctx, &out, "ctx");
    }
    cdf_tensor_map_clear(&in);
    cdf_tensor_map_clear(&out);
    return s;
}

/* Flux2SingleTransformerBlock i through the repeated-block compiler; *h owned, replaced. */
static cdf_status run_single_block(const flux2_model *m, int64_t i, cdf_tensor **h, cdf_tensor *mod_single, cdf_tensor *cos_t,
                                   cdf_tensor *sin_t) {
    const flux2_single_block *d = &m->single_blocks[i];
    cdf_tensor *w[CDF_BLOCK_MAX_WEIGHTS];
    int nw = 0;
    nw = cdf_linear_list_weights(w, nw, &d->to_qkv_mlp_proj);
    nw = cdf_norm_list_weights(w, nw, &d->norm_q);
    nw = cdf_norm_list_weights(w, nw, &d->norm_k);
    nw = cdf_linear_list_weights(w, nw, &d->to_out);
    block_ctx bc = {m, d};
    cdf_tensor_map in, out;
    cdf_tensor_map_init(&in);
    cdf_tensor_map_init(&out);
    cdf_status s = cdf_tensor_map_set(&in, "h", *h);
    if (s == CDF_OK) s = cdf_tensor_map_set(&in, "mod_single", mod_single);
    if (s == CDF_OK) s = set_common(&in, cos_t, sin_t);
    if (s == CDF_OK) s = cdf_block_run("Flux2SingleTransformerBlock", single_block_traced, &bc, &in, &out, w, nw);
    if (s == CDF_OK) take_state(h, &out, "h");
    cdf_tensor_map_clear(&in);
    cdf_tensor_map_clear(&out);
    return s;
}

/* ids [L, n] or [N, L, n] (entry 0 is used), n >= n_axes: the first n_axes columns as float32
 * rows (ids.float()) into pos. */
/* ids [L, >=n_axes] or [N, L, >=n_axes] (entry 0, the first n_axes columns): checks the shape and
 * returns the rows as a view (recorded in the current scope). The positions stay on the device:
 * the RoPE tables are computed there, so the forward has no host read (compilable). */
static cdf_status ids_rows(const char *name, cdf_tensor *ids, int64_t L, int n_axes, cdf_tensor **rows) {
    char want[128];
    snprintf(want, sizeof want, "[%lld, >=%d] or [N, %lld, >=%d] (one row of %d position axes per token)", (long long)L, n_axes,
             (long long)L, n_axes, n_axes);
    const int nd = cdf_tensor_ndim(ids);
    if ((nd != 2 && nd != 3) || (nd == 3 && cdf_tensor_dim(ids, 0) < 1) || cdf_tensor_dim(ids, -2) != L ||
        cdf_tensor_dim(ids, -1) < n_axes)
        return cdf_flux_input_shape_error(MODEL, name, ids, want);
    cdf_tensor *r = nd == 3 ? cdf_squeeze(cdf_narrow(ids, 0, 0, 1), 0) : ids;
    *rows = cdf_narrow(r, 1, 0, n_axes);
    return *rows ? CDF_OK : cdf_last_status();
}

/* Timesteps(flip_sin_to_cos=True, shift 0) of 1000 * t (t cast to f32 first, like
 * `timestep.to(hidden_states.dtype) * 1000`), then the embedder MLP. */
static cdf_tensor *embed_time(const cdf_flux_mlp *mlp, cdf_tensor *t, int64_t channels) {
    cdf_tensor *t1000 = cdf_scale(cdf_cast(t, CDF_F32), 1000.0f);
    return cdf_flux_mlp_fwd(mlp, cdf_timestep_embedding(t1000, (int)channels, true, 0.0f, 1.0f, 10000.0f));
}

/* The output layers: AdaLayerNormContinuous (scale first, then shift) and the projection of the
 * image tokens xi (a result in the current scope). */
static cdf_tensor *output_layers(const flux2_model *m, cdf_tensor *xi, cdf_tensor *temb) {
    cdf_tensor *mod[2] = {0};
    cdf_chunk(cdf_linear_fwd(&m->norm_out, cdf_silu(temb)), 2, 1, mod); /* scale, shift */
    return cdf_linear_fwd(&m->proj_out, cdf_flux_modulate(cdf_layer_norm(xi, NULL, NULL, (float)m->cfg.eps), mod[1], mod[0]));
}

/* forward, or a step cache's part of it (docs/step-caches.md): embed_only: *sample = the
 * embedded latents [B, Li, D] and *extra = temb (MagCache's skipped step); else *sample and, with
 * extra, *extra = the last block's image tokens - the embedded latents (its residual). */
static cdf_status forward_parts(void *impl, const cdf_flux2_inputs *in, bool embed_only, cdf_tensor **sample, cdf_tensor **extra);

cdf_status cdf_flux2_transformer_forward(void *impl, const cdf_flux2_inputs *in, cdf_tensor **sample) {
    return forward_parts(impl, in, false, sample, NULL);
}

cdf_status cdf_flux2_cache_full(void *impl, const cdf_flux2_inputs *in, cdf_tensor **sample, cdf_tensor **residual) {
    if (!residual) return cdf_error(CDF_ERR_INVALID_ARG, "%s: cache_full needs a residual output", MODEL);
    return forward_parts(impl, in, false, sample, residual);
}

cdf_status cdf_flux2_cache_embed(void *impl, const cdf_flux2_inputs *in, cdf_tensor **x, cdf_tensor **temb) {
    if (!temb) return cdf_error(CDF_ERR_INVALID_ARG, "%s: cache_embed needs a temb output", MODEL);
    return forward_parts(impl, in, true, x, temb);
}

cdf_status cdf_flux2_cache_skip(void *impl, cdf_tensor *x, cdf_tensor *residual, cdf_tensor *temb, cdf_tensor **sample) {
    *sample = NULL;
    if (!impl || !x || !residual || !temb) return cdf_error(CDF_ERR_NOT_FOUND, "%s: fbc_skip needs x, tail_residual and temb", MODEL);
    cdf_scope_push();
    cdf_tensor *out = output_layers(impl, cdf_add(x, residual), temb); /* MagCache: head input + residual */
    cdf_scope_pop(out ? &out : NULL, out ? 1 : 0);
    if (!out) return status_or_internal();
    *sample = out;
    return CDF_OK;
}

static cdf_status forward_parts(void *impl, const cdf_flux2_inputs *in, bool embed_only, cdf_tensor **sample, cdf_tensor **extra) {
    if (sample) *sample = NULL;
    if (extra) *extra = NULL;
    if (!impl || !in || !sample) return cdf_error(CDF_ERR_INVALID_ARG, "%s: forward needs the model, inputs and an output", MODEL);
    const flux2_model *m = impl;
    const cdf_flux2_config *c = &m->cfg;
    const struct {
        const char *name;
        cdf_tensor *t;
    } required[] = {{"hidden_states", in->hidden_states}, {"encoder_hidden_states", in->encoder_hidden_states},
                    {"timestep", in->timestep}, {"img_ids", in->img_ids}, {"txt_ids", in->txt_ids}};
    for (size_t i = 0; i < sizeof required / sizeof *required; i++)
        if (!required[i].t) return cdf_error(CDF_ERR_NOT_FOUND, "%s: required input '%s' is missing", MODEL, required[i].name);
    /* as diffusers: guidance is only embedded by a model that has a guidance embedder */
    cdf_tensor *guidance = c->guidance_embeds ? in->guidance : NULL;

    /* shapes */
    char want[128];
    const cdf_tensor *hs = in->hidden_states, *ehs = in->encoder_hidden_states;
    if (cdf_tensor_ndim(hs) != 3 || cdf_tensor_dim(hs, 2) != c->in_channels || cdf_tensor_dim(hs, 0) < 1 ||
        cdf_tensor_dim(hs, 1) < 1) {
        snprintf(want, sizeof want, "[B, L_img, %lld] (in_channels)", (long long)c->in_channels);
        return cdf_flux_input_shape_error(MODEL, "hidden_states", hs, want);
    }
    const int64_t B = cdf_tensor_dim(hs, 0), Li = cdf_tensor_dim(hs, 1);
    /* L_txt >= 1, as in FLUX.1: an empty text sequence would only fail later, without naming it */
    if (cdf_tensor_ndim(ehs) != 3 || cdf_tensor_dim(ehs, 0) != B || cdf_tensor_dim(ehs, 1) < 1 ||
        cdf_tensor_dim(ehs, 2) != c->joint_attention_dim) {
        snprintf(want, sizeof want, "[%lld, L_txt >= 1, %lld] (batch of hidden_states, joint_attention_dim)", (long long)B,
                 (long long)c->joint_attention_dim);
        return cdf_flux_input_shape_error(MODEL, "encoder_hidden_states", ehs, want);
    }
    const int64_t Lt = cdf_tensor_dim(ehs, 1);
    CDF_TRY(cdf_flux_check_per_batch(MODEL, "timestep", in->timestep, B));
    if (guidance) CDF_TRY(cdf_flux_check_per_batch(MODEL, "guidance", guidance, B));

    cdf_scope_push(); /* the forward's scope: only the result leaves it */
    /* owned references that live across the blocks */
    cdf_tensor *x = NULL, *ctx = NULL, *temb = NULL, *cos_t = NULL, *sin_t = NULL;
    cdf_tensor *mod_img = NULL, *mod_txt = NULL, *mod_single = NULL; /* [B, 6D], [B, 6D], [B, 3D] */

    /* ---- embeddings and the shared modulation ---- */
    cdf_scope_push();
    /* positions: rows = cat(txt_ids, img_ids), as float32 like ids.float() */
    cdf_tensor *txt_rows = NULL, *img_rows = NULL;
    cdf_status s = ids_rows("txt_ids", in->txt_ids, Lt, c->n_axes, &txt_rows);
    if (s == CDF_OK) s = ids_rows("img_ids", in->img_ids, Li, c->n_axes, &img_rows);
    if (s == CDF_OK) {
        cdf_tensor *both_rows[2] = {cdf_cast(txt_rows, CDF_F32), cdf_cast(img_rows, CDF_F32)};
        s = cdf_rope_tables(cdf_cat(both_rows, 2, 0), c->n_axes, c->axes_dims_rope, c->rope_theta, &cos_t, &sin_t);
    }
    if (s == CDF_OK) {
        cdf_tensor_retain(cos_t);
        cdf_tensor_retain(sin_t);
        cdf_tensor *e = embed_time(&m->timestep_embedder, in->timestep, c->timestep_guidance_channels); /* [B or 1, D] */
        if (guidance) e = cdf_add(e, embed_time(&m->guidance_embedder, guidance, c->timestep_guidance_channels));
        cdf_tensor *silu_e = cdf_silu(e);
        /* chunked inside the blocks: (shift, scale, gate) x (attention, feed-forward) / (shift, scale, gate) */
        cdf_tensor *mi = cdf_linear_fwd(&m->mod_img, silu_e), *mt = cdf_linear_fwd(&m->mod_txt, silu_e);
        cdf_tensor *ms = cdf_linear_fwd(&m->mod_single, silu_e);
        cdf_tensor *xe = cdf_linear_fwd(&m->x_embedder, cdf_cast(in->hidden_states, CDF_F32));                /* [B, Li, D] */
        cdf_tensor *ce = cdf_linear_fwd(&m->context_embedder, cdf_cast(in->encoder_hidden_states, CDF_F32)); /* [B, Lt, D] */
        if (e && xe && ce && mi && mt && ms) {
            temb = cdf_tensor_retain(e);
            x = cdf_tensor_retain(xe);
            ctx = cdf_tensor_retain(ce);
            mod_img = cdf_tensor_retain(mi);
            mod_txt = cdf_tensor_retain(mt);
            mod_single = cdf_tensor_retain(ms);
        } else {
            s = status_or_internal();
        }
    }
    cdf_scope_pop(NULL, 0);
    if (s == CDF_OK && embed_only) { /* x and temb move to the caller's scope */
        cdf_tensor *owned[] = {ctx, cos_t, sin_t, mod_img, mod_txt, mod_single};
        for (size_t i = 0; i < sizeof owned / sizeof *owned; i++) cdf_tensor_release(owned[i]);
        cdf_scope_pop(NULL, 0);
        cdf_scope_record(x);
        cdf_scope_record(temb);
        *sample = x, *extra = temb;
        return CDF_OK;
    }
    cdf_tensor *x0 = s == CDF_OK && extra ? cdf_tensor_retain(x) : NULL; /* the embedded latents */

    /* ---- transformer blocks ---- */
    for (int64_t i = 0; s == CDF_OK && i < c->num_layers; i++) {
        s = run_double_block(m, i, &x, &ctx, mod_img, mod_txt, cos_t, sin_t);
        if (s != CDF_OK) cdf_error_prefix("%s transformer_blocks.%lld: ", MODEL, (long long)i);
    }
    cdf_tensor *h = NULL; /* owned: the joint sequence [ctx; x] of the single-stream blocks */
    if (s == CDF_OK) {
        cdf_scope_push();
        s = cdf_flux_replace_state(&h, cdf_cat((cdf_tensor *[]){ctx, x}, 2, 1));
        cdf_scope_pop(NULL, 0);
    }
    for (int64_t i = 0; s == CDF_OK && i < c->num_single_layers; i++) {
        s = run_single_block(m, i, &h, mod_single, cos_t, sin_t);
        if (s != CDF_OK) cdf_error_prefix("%s single_transformer_blocks.%lld: ", MODEL, (long long)i);
    }

    /* ---- output ---- */
    cdf_tensor *out[2] = {NULL, NULL};
    if (s == CDF_OK) {
        cdf_tensor *xi = cdf_narrow(h, 1, Lt, Li);
        out[0] = output_layers(m, xi, temb);
        if (extra) out[1] = cdf_sub(xi, x0); /* MagCache's residual over every block */
        if (!out[0] || (extra && !out[1])) s = status_or_internal();
    }
    cdf_tensor *owned[] = {x, x0, ctx, h, temb, cos_t, sin_t, mod_img, mod_txt, mod_single};
    for (size_t i = 0; i < sizeof owned / sizeof *owned; i++) cdf_tensor_release(owned[i]);
    cdf_scope_pop(out, s != CDF_OK ? 0 : extra ? 2 : 1); /* the results move to the caller's scope */
    if (s != CDF_OK) return s;
    *sample = out[0];
    if (extra) *extra = out[1];
    return CDF_OK;
}

/* ---- component interface ---------------------------------------------------------------------- */
/* forward, and MagCache's parts (docs/step-caches.md; each its own graph under compile):
 *   cache_full (forward's inputs) -> out.sample, out.residual
 *   cache_embed (forward's inputs) -> out.x, out.temb
 *   fbc_skip (x, tail_residual, temb) -> out.sample (the output layers on x + tail_residual) */
static cdf_status flux2_run(void *impl, const char *method, const cdf_tensor_map *in, cdf_tensor_map *out) {
    if (method && strcmp(method, "fbc_skip") == 0) {
        cdf_tensor *sample = NULL;
        CDF_TRY(cdf_flux2_cache_skip(impl, cdf_input(in, "x", MODEL), cdf_input(in, "tail_residual", MODEL),
                                     cdf_input(in, "temb", MODEL), &sample));
        return cdf_tensor_map_set(out, "out.sample", sample);
    }
    const bool full = method && strcmp(method, "cache_full") == 0, embed = method && strcmp(method, "cache_embed") == 0;
    if (method && strcmp(method, "forward") != 0 && !full && !embed)
        return cdf_error(CDF_ERR_UNSUPPORTED, "%s: method '%s' is not supported (only 'forward' and MagCache's 'cache_full', "
                         "'cache_embed', 'fbc_skip')", MODEL, method);
    cdf_flux2_inputs fi = {
        .hidden_states = cdf_tensor_map_get(in, "hidden_states"),
        .encoder_hidden_states = cdf_tensor_map_get(in, "encoder_hidden_states"),
        .timestep = cdf_tensor_map_get(in, "timestep"),
        .img_ids = cdf_tensor_map_get(in, "img_ids"),
        .txt_ids = cdf_tensor_map_get(in, "txt_ids"),
        .guidance = cdf_tensor_map_get(in, "guidance"),
    };
    cdf_tensor *sample = NULL, *extra = NULL;
    CDF_TRY(forward_parts(impl, &fi, embed, &sample, full || embed ? &extra : NULL));
    CDF_TRY(cdf_tensor_map_set(out, embed ? "out.x" : "out.sample", sample));
    return extra ? cdf_tensor_map_set(out, embed ? "out.temb" : "out.residual", extra) : CDF_OK;
}

const cdf_component_class cdf_flux2_transformer_class = {
    .names = (const char *const[]){MODEL, NULL},
    .load = flux2_load,
    .free = flux2_free,
    .run = flux2_run,
};
