/* FLUX.1 transformer: diffusers FluxTransformer2DModel (transformer_flux.py at 58eb52c).
 *
 *   x    = x_embedder(hidden_states)                         [B, Li, D]   D = heads * head_dim
 *   temb = timestep_embedder(time_proj(1000 t))
 *          (+ guidance_embedder(time_proj(1000 g)))  + text_embedder(pooled)   [B, D]
 *   ctx  = context_embedder(encoder_hidden_states)           [B, Lt, D]
 *   cos, sin = FluxPosEmbed(cat(txt_ids, img_ids))           [Lt + Li, head_dim]
 *   num_layers double-stream blocks (separate weights for text and image, joint attention)
 *   num_single_layers single-stream blocks over [ctx; x]
 *   out  = proj_out(norm_out(x, temb))                        [B, Li, p*p*out_channels]
 *
 * Activations are f32; weights are f32 or bf16 (cdf_load_options.weight_dtype). */
#include "compile/compile.h"
#include "models/flux_transformer.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "tensor/tensor_impl.h"
#include "io/json.h"

#define MODEL "FluxTransformer2DModel"

static const float NORM_EPS = 1e-6f; /* every LayerNorm and q/k RMSNorm of the model */
static const double ROPE_THETA = 10000.0;
static const int TIME_PROJ_DIM = 256; /* Timesteps(num_channels=256, flip_sin_to_cos=True, shift=0) */

typedef struct flux_double_block {
    cdf_linear_layer norm1, norm1_context; /* AdaLayerNormZero .linear [6D, D] */
    cdf_linear_layer to_q, to_k, to_v, to_out;
    cdf_linear_layer add_q_proj, add_k_proj, add_v_proj, to_add_out;
    cdf_norm_layer norm_q, norm_k, norm_added_q, norm_added_k; /* RMSNorm over head_dim */
    cdf_linear_layer ff_in, ff_out;                             /* ff.net.0.proj [4D, D], ff.net.2 [D, 4D] */
    cdf_linear_layer ff_context_in, ff_context_out;
} flux_double_block;

typedef struct flux_single_block {
    cdf_linear_layer norm; /* AdaLayerNormZeroSingle .linear [3D, D] */
    cdf_linear_layer to_q, to_k, to_v;
    cdf_norm_layer norm_q, norm_k;
    cdf_linear_layer proj_mlp; /* [M, D] */
    cdf_linear_layer proj_out; /* [D, D + M] over cat(attention, mlp) */
} flux_single_block;

typedef struct flux_model {
    cdf_flux_config cfg;
    cdf_device *dev;
    cdf_tp *tp; /* tensor-parallel sharding, NULL when the model is whole */
    cdf_linear_layer x_embedder, context_embedder;
    cdf_flux_mlp timestep_embedder, guidance_embedder, text_embedder; /* time_text_embed.* */
    flux_double_block *blocks;
    flux_single_block *single_blocks;
    cdf_linear_layer norm_out; /* AdaLayerNormContinuous .linear [2D, D] -> (scale, shift) */
    cdf_linear_layer proj_out;
} flux_model;

/* Tensor-parallel plan (diffusers' FluxTransformer2DModel _tp_plan): q/k/v and MLP-in
 * column-wise (each rank owns num_attention_heads / N heads and 1/N of the MLP channels),
 * attention out and MLP-out row-wise (one all-reduce each), the single-stream proj_out row-wise
 * over its packed [attention, MLP] input. Modulation (norm*.linear), QK-norms, embedders and the
 * output layers are replicated. */
static const cdf_tp_rule FLUX_TP_PLAN[] = {
    {"transformer_blocks.*.attn.to_q", CDF_TP_COLWISE},
    {"transformer_blocks.*.attn.to_k", CDF_TP_COLWISE},
    {"transformer_blocks.*.attn.to_v", CDF_TP_COLWISE},
    {"transformer_blocks.*.attn.add_q_proj", CDF_TP_COLWISE},
    {"transformer_blocks.*.attn.add_k_proj", CDF_TP_COLWISE},
    {"transformer_blocks.*.attn.add_v_proj", CDF_TP_COLWISE},
    {"transformer_blocks.*.attn.to_out.0", CDF_TP_ROWWISE},
    {"transformer_blocks.*.attn.to_add_out", CDF_TP_ROWWISE},
    {"transformer_blocks.*.ff.net.0.proj", CDF_TP_COLWISE},
    {"transformer_blocks.*.ff.net.2", CDF_TP_ROWWISE},
    {"transformer_blocks.*.ff_context.net.0.proj", CDF_TP_COLWISE},
    {"transformer_blocks.*.ff_context.net.2", CDF_TP_ROWWISE},
    {"single_transformer_blocks.*.attn.to_q", CDF_TP_COLWISE},
    {"single_transformer_blocks.*.attn.to_k", CDF_TP_COLWISE},
    {"single_transformer_blocks.*.attn.to_v", CDF_TP_COLWISE},
    {"single_transformer_blocks.*.proj_mlp", CDF_TP_COLWISE},
    {"single_transformer_blocks.*.proj_out", CDF_TP_PACKED_ROWWISE},
    {NULL, CDF_TP_REPLICATE},
};

/* ---- config ------------------------------------------------------------------------------ */
static cdf_status parse_config(const cJSON *json, const char *dir, cdf_flux_config *c) {
    memset(c, 0, sizeof *c);
    bool ok = cdf_json_get_int(json, "patch_size", 1, &c->patch_size) == CDF_OK &&
              cdf_json_get_int(json, "in_channels", 64, &c->in_channels) == CDF_OK &&
              cdf_json_get_int(json, "out_channels", 0, &c->out_channels) == CDF_OK &&
              cdf_json_get_int(json, "num_layers", 19, &c->num_layers) == CDF_OK &&
              cdf_json_get_int(json, "num_single_layers", 38, &c->num_single_layers) == CDF_OK &&
              cdf_json_get_int(json, "attention_head_dim", 128, &c->attention_head_dim) == CDF_OK &&
              cdf_json_get_int(json, "num_attention_heads", 24, &c->num_attention_heads) == CDF_OK &&
              cdf_json_get_int(json, "joint_attention_dim", 4096, &c->joint_attention_dim) == CDF_OK &&
              cdf_json_get_int(json, "pooled_projection_dim", 768, &c->pooled_projection_dim) == CDF_OK &&
              cdf_json_get_bool(json, "guidance_embeds", false, &c->guidance_embeds) == CDF_OK &&
              cdf_json_get_int_array(json, "axes_dims_rope", c->axes_dims_rope, CDF_FLUX_MAX_ROPE_AXES, &c->n_axes) == CDF_OK;
    if (!ok) return cdf_last_status();
    if (!cdf_json_has(json, "axes_dims_rope")) {
        c->n_axes = 3;
        c->axes_dims_rope[0] = 16, c->axes_dims_rope[1] = 56, c->axes_dims_rope[2] = 56;
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
        {"pooled_projection_dim", c->pooled_projection_dim, 1, 1 << 20},
    };
    CDF_TRY(cdf_flux_check_ranges(dir, ranges, sizeof ranges / sizeof *ranges));
    CDF_TRY(cdf_flux_inner_dim(dir, c->num_attention_heads, c->attention_head_dim, &c->inner_dim));
    c->mlp_hidden_dim = c->inner_dim * 4; /* FluxSingleTransformerBlock mlp_ratio 4.0 */

    /* the axes must exactly tile attention_head_dim (diffusers would fail at the first attention
     * with a broadcast error) */
    return cdf_flux_check_rope_axes(dir, c->n_axes, c->axes_dims_rope, c->attention_head_dim);
}

/* ---- loading ------------------------------------------------------------------------------ */
static void free_model(flux_model *m) {
    if (!m) return;
    cdf_linear_free(&m->x_embedder);
    cdf_linear_free(&m->context_embedder);
    cdf_flux_mlp_free(&m->timestep_embedder);
    cdf_flux_mlp_free(&m->guidance_embedder);
    cdf_flux_mlp_free(&m->text_embedder);
    for (int64_t i = 0; m->blocks && i < m->cfg.num_layers; i++) {
        flux_double_block *b = &m->blocks[i];
        cdf_linear_layer *lin[] = {&b->norm1, &b->norm1_context, &b->to_q, &b->to_k, &b->to_v, &b->to_out,
                                   &b->add_q_proj, &b->add_k_proj, &b->add_v_proj, &b->to_add_out, &b->ff_in,
                                   &b->ff_out, &b->ff_context_in, &b->ff_context_out};
        for (size_t j = 0; j < sizeof lin / sizeof *lin; j++) cdf_linear_free(lin[j]);
        cdf_norm_free(&b->norm_q);
        cdf_norm_free(&b->norm_k);
        cdf_norm_free(&b->norm_added_q);
        cdf_norm_free(&b->norm_added_k);
    }
    for (int64_t i = 0; m->single_blocks && i < m->cfg.num_single_layers; i++) {
        flux_single_block *b = &m->single_blocks[i];
        cdf_linear_layer *lin[] = {&b->norm, &b->to_q, &b->to_k, &b->to_v, &b->proj_mlp, &b->proj_out};
        for (size_t j = 0; j < sizeof lin / sizeof *lin; j++) cdf_linear_free(lin[j]);
        cdf_norm_free(&b->norm_q);
        cdf_norm_free(&b->norm_k);
    }
    free(m->blocks);
    free(m->single_blocks);
    cdf_linear_free(&m->norm_out);
    cdf_linear_free(&m->proj_out);
    cdf_tp_free(m->tp);
    free(m);
}

static cdf_status load_double_block(cdf_weights *w, const cdf_tp *tp, const cdf_flux_config *c, flux_double_block *b,
                                    int64_t i) {
    const int64_t D = c->inner_dim, hd = c->attention_head_dim, F = 4 * D; /* FeedForward mult 4 */
    const char *p = "transformer_blocks";
    CDF_TRY(cdf_linear_load(w, &b->norm1, D, 6 * D, 1, "%s.%lld.norm1.linear", p, (long long)i));
    CDF_TRY(cdf_linear_load(w, &b->norm1_context, D, 6 * D, 1, "%s.%lld.norm1_context.linear", p, (long long)i));
    CDF_TRY(cdf_tp_linear_load(w, tp, &b->to_q, D, D, 1, "%s.%lld.attn.to_q", p, (long long)i));
    CDF_TRY(cdf_tp_linear_load(w, tp, &b->to_k, D, D, 1, "%s.%lld.attn.to_k", p, (long long)i));
    CDF_TRY(cdf_tp_linear_load(w, tp, &b->to_v, D, D, 1, "%s.%lld.attn.to_v", p, (long long)i));
    CDF_TRY(cdf_tp_linear_load(w, tp, &b->to_out, D, D, 1, "%s.%lld.attn.to_out.0", p, (long long)i));
    CDF_TRY(cdf_tp_linear_load(w, tp, &b->add_q_proj, D, D, 1, "%s.%lld.attn.add_q_proj", p, (long long)i));
    CDF_TRY(cdf_tp_linear_load(w, tp, &b->add_k_proj, D, D, 1, "%s.%lld.attn.add_k_proj", p, (long long)i));
    CDF_TRY(cdf_tp_linear_load(w, tp, &b->add_v_proj, D, D, 1, "%s.%lld.attn.add_v_proj", p, (long long)i));
    CDF_TRY(cdf_tp_linear_load(w, tp, &b->to_add_out, D, D, 1, "%s.%lld.attn.to_add_out", p, (long long)i));
    CDF_TRY(cdf_norm_load(w, &b->norm_q, hd, 1, 0, NORM_EPS, "%s.%lld.attn.norm_q", p, (long long)i));
    CDF_TRY(cdf_norm_load(w, &b->norm_k, hd, 1, 0, NORM_EPS, "%s.%lld.attn.norm_k", p, (long long)i));
    CDF_TRY(cdf_norm_load(w, &b->norm_added_q, hd, 1, 0, NORM_EPS, "%s.%lld.attn.norm_added_q", p, (long long)i));
    CDF_TRY(cdf_norm_load(w, &b->norm_added_k, hd, 1, 0, NORM_EPS, "%s.%lld.attn.norm_added_k", p, (long long)i));
    CDF_TRY(cdf_tp_linear_load(w, tp, &b->ff_in, D, F, 1, "%s.%lld.ff.net.0.proj", p, (long long)i));
    CDF_TRY(cdf_tp_linear_load(w, tp, &b->ff_out, F, D, 1, "%s.%lld.ff.net.2", p, (long long)i));
    CDF_TRY(cdf_tp_linear_load(w, tp, &b->ff_context_in, D, F, 1, "%s.%lld.ff_context.net.0.proj", p, (long long)i));
    CDF_TRY(cdf_tp_linear_load(w, tp, &b->ff_context_out, F, D, 1, "%s.%lld.ff_context.net.2", p, (long long)i));
    return CDF_OK;
}

static cdf_status load_single_block(cdf_weights *w, const cdf_tp *tp, const cdf_flux_config *c, flux_single_block *b,
                                    int64_t i) {
    const int64_t D = c->inner_dim, hd = c->attention_head_dim, M = c->mlp_hidden_dim;
    const char *p = "single_transformer_blocks";
    CDF_TRY(cdf_linear_load(w, &b->norm, D, 3 * D, 1, "%s.%lld.norm.linear", p, (long long)i));
    CDF_TRY(cdf_tp_linear_load(w, tp, &b->to_q, D, D, 1, "%s.%lld.attn.to_q", p, (long long)i));
    CDF_TRY(cdf_tp_linear_load(w, tp, &b->to_k, D, D, 1, "%s.%lld.attn.to_k", p, (long long)i));
    CDF_TRY(cdf_tp_linear_load(w, tp, &b->to_v, D, D, 1, "%s.%lld.attn.to_v", p, (long long)i));
    CDF_TRY(cdf_norm_load(w, &b->norm_q, hd, 1, 0, NORM_EPS, "%s.%lld.attn.norm_q", p, (long long)i));
    CDF_TRY(cdf_norm_load(w, &b->norm_k, hd, 1, 0, NORM_EPS, "%s.%lld.attn.norm_k", p, (long long)i));
    CDF_TRY(cdf_tp_linear_load(w, tp, &b->proj_mlp, D, M, 1, "%s.%lld.proj_mlp", p, (long long)i));
    /* its input is cat(attention [D], MLP [M]): a packed plan splits each part */
    const int64_t packed[2] = {D, M};
    CDF_TRY(cdf_tp_linear_load_packed(w, tp, &b->proj_out, 2, packed, D, 1, "%s.%lld.proj_out", p, (long long)i));
    return CDF_OK;
}

static cdf_status load_weights(cdf_weights *w, void *model) {
    flux_model *m = model;
    const cdf_flux_config *c = &m->cfg;
    const int64_t D = c->inner_dim;
    CDF_TRY(cdf_linear_load(w, &m->x_embedder, c->in_channels, D, 1, "x_embedder"));
    CDF_TRY(cdf_linear_load(w, &m->context_embedder, c->joint_attention_dim, D, 1, "context_embedder"));
    CDF_TRY(cdf_flux_mlp_load(w, &m->timestep_embedder, TIME_PROJ_DIM, D, D, 1, "time_text_embed.timestep_embedder"));
    if (c->guidance_embeds)
        CDF_TRY(cdf_flux_mlp_load(w, &m->guidance_embedder, TIME_PROJ_DIM, D, D, 1, "time_text_embed.guidance_embedder"));
    CDF_TRY(cdf_flux_mlp_load(w, &m->text_embedder, c->pooled_projection_dim, D, D, 1, "time_text_embed.text_embedder"));
    for (int64_t i = 0; i < c->num_layers; i++) CDF_TRY(load_double_block(w, m->tp, c, &m->blocks[i], i));
    for (int64_t i = 0; i < c->num_single_layers; i++) CDF_TRY(load_single_block(w, m->tp, c, &m->single_blocks[i], i));
    CDF_TRY(cdf_linear_load(w, &m->norm_out, D, 2 * D, 1, "norm_out.linear"));
    CDF_TRY(cdf_linear_load(w, &m->proj_out, D, c->patch_size * c->patch_size * c->out_channels, 1, "proj_out"));
    return CDF_OK;
}

static cdf_status flux_load(const char *dir, const cJSON *cfg, const cdf_load_options *opt, void **impl) {
    *impl = NULL;
    flux_model *m = calloc(1, sizeof *m);
    if (!m) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    cdf_status s = parse_config(cfg, dir, &m->cfg);
    if (s == CDF_OK) {
        m->blocks = calloc((size_t)m->cfg.num_layers + 1, sizeof *m->blocks);
        m->single_blocks = calloc((size_t)m->cfg.num_single_layers + 1, sizeof *m->single_blocks);
        if (!m->blocks || !m->single_blocks) s = cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (block tables)");
    }
    /* sharded when tensor parallelism is on: heads (and so every split width) must divide */
    if (s == CDF_OK) s = cdf_tp_for_component(dir, MODEL, FLUX_TP_PLAN, &m->tp);
    if (s == CDF_OK) s = cdf_tp_check_divisible(m->tp, "num_attention_heads", m->cfg.num_attention_heads);
    if (s == CDF_OK) s = cdf_tp_check_divisible(m->tp, "mlp_hidden_dim (4 x inner_dim)", m->cfg.mlp_hidden_dim);
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

static void flux_free(void *impl) { free_model(impl); }

const cdf_flux_config *cdf_flux_transformer_config(const void *impl) { return impl ? &((const flux_model *)impl)->cfg : NULL; }

/* ---- forward ------------------------------------------------------------------------------ */

/* Run a block's body inside its own scope: the new state tensors get an owned reference (kept
 * outside every scope), the block's intermediates are released, and the previous state is
 * dropped, so memory holds one block's worth of activations at a time. */

/* q/k/v of one stream: linear -> [B, L, H, hd], RMSNorm over hd for q and k. */
static void project_qkv(const cdf_linear_layer *lq, const cdf_linear_layer *lk, const cdf_linear_layer *lv,
                        const cdf_norm_layer *nq, const cdf_norm_layer *nk, int64_t hd, cdf_tensor *x, cdf_tensor **q,
                        cdf_tensor **k, cdf_tensor **v) {
    x = cdf_linear_shared_input(x, 3, (const cdf_linear_layer *[]){lq, lk, lv});
    *q = cdf_rms_norm(cdf_flux_split_heads(cdf_linear_fwd(lq, x), hd), nq->w, nq->eps);
    *k = cdf_rms_norm(cdf_flux_split_heads(cdf_linear_fwd(lk, x), hd), nk->w, nk->eps);
    *v = cdf_flux_split_heads(cdf_linear_fwd(lv, x), hd);
}

/* FluxTransformerBlock: x [B, Li, D], ctx [B, Lt, D] updated in place (owned references). */
/* TaylorSeer (docs/step-caches.md) per block: attn_in = the attention module's outputs to use
 * instead of computing it (predicted), attn_out = slots that receive its computed outputs (new
 * references); both NULL for the plain block. Double blocks: [image after to_out, text after
 * to_add_out]; single blocks: [the attention over the joint sequence]. */
static cdf_status double_block(const flux_model *m, const flux_double_block *b, cdf_tensor **x_io, cdf_tensor **ctx_io,
                               cdf_tensor *temb, cdf_tensor *cos_t, cdf_tensor *sin_t, cdf_tensor *const *attn_in,
                               cdf_tensor **attn_out) {
    const int64_t hd = m->cfg.attention_head_dim;
    cdf_tensor *x = *x_io, *ctx = *ctx_io;
    const int64_t Lt = cdf_tensor_dim(ctx, 1), Li = cdf_tensor_dim(x, 1);
    cdf_scope_push();

    /* AdaLayerNormZero: silu(temb) -> linear -> shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp */
    cdf_tensor *mod[6] = {0}, *cmod[6] = {0};
    cdf_tensor *silu_temb = cdf_silu(temb);
    cdf_chunk(cdf_linear_fwd(&b->norm1, silu_temb), 6, 1, mod);
    cdf_chunk(cdf_linear_fwd(&b->norm1_context, silu_temb), 6, 1, cmod);
    cdf_tensor *x_attn, *ctx_attn;
    if (attn_in) {
        x_attn = attn_in[0], ctx_attn = attn_in[1];
    } else {
        cdf_tensor *nx = cdf_flux_modulate(cdf_layer_norm(x, NULL, NULL, NORM_EPS), mod[0], mod[1]);
        cdf_tensor *nctx = cdf_flux_modulate(cdf_layer_norm(ctx, NULL, NULL, NORM_EPS), cmod[0], cmod[1]);

        /* joint attention over [text; image], RoPE on the whole joint sequence */
        cdf_tensor *q, *k, *v, *cq, *ck, *cv;
        project_qkv(&b->to_q, &b->to_k, &b->to_v, &b->norm_q, &b->norm_k, hd, nx, &q, &k, &v);
        project_qkv(&b->add_q_proj, &b->add_k_proj, &b->add_v_proj, &b->norm_added_q, &b->norm_added_k, hd, nctx, &cq, &ck, &cv);
        cdf_tensor *attn = cdf_flux_rope_attention(cdf_cat((cdf_tensor *[]){cq, q}, 2, 1), cdf_cat((cdf_tensor *[]){ck, k}, 2, 1),
                                                   cdf_cat((cdf_tensor *[]){cv, v}, 2, 1), cos_t, sin_t,
                                                   cdf_linear_compute_dtype(&b->to_q),
                                                   cdf_linears_round_input(2, (const cdf_linear_layer *[]){&b->to_add_out, &b->to_out}));
        /* attn: [B, Lt+Li, D] */
        ctx_attn = cdf_linear_fwd(&b->to_add_out, cdf_narrow(attn, 1, 0, Lt));
        x_attn = cdf_linear_fwd(&b->to_out, cdf_narrow(attn, 1, Lt, Li));
        if (attn_out) attn_out[0] = cdf_tensor_retain(x_attn), attn_out[1] = cdf_tensor_retain(ctx_attn);
    }

    /* image stream: gated attention residual, then modulated LayerNorm -> GELU(tanh) MLP */
    x = cdf_flux_gated_add(x, mod[2], x_attn);
    cdf_tensor *ff_in = cdf_linear_shared_input(cdf_flux_modulate(cdf_layer_norm(x, NULL, NULL, NORM_EPS), mod[3], mod[4]), 1,
                                                (const cdf_linear_layer *[]){&b->ff_in});
    x = cdf_flux_gated_add(x, mod[5], cdf_linear_fwd(&b->ff_out, cdf_gelu(cdf_linear_fwd(&b->ff_in, ff_in), CDF_GELU_TANH)));

    /* text stream, same with its own weights */
    ctx = cdf_flux_gated_add(ctx, cmod[2], ctx_attn);
    cdf_tensor *cff_in = cdf_linear_shared_input(cdf_flux_modulate(cdf_layer_norm(ctx, NULL, NULL, NORM_EPS), cmod[3], cmod[4]),
                                                 1, (const cdf_linear_layer *[]){&b->ff_context_in});
    ctx = cdf_flux_gated_add(
        ctx, cmod[5], cdf_linear_fwd(&b->ff_context_out, cdf_gelu(cdf_linear_fwd(&b->ff_context_in, cff_in), CDF_GELU_TANH)));

    cdf_status s = (x && ctx) ? CDF_OK : (cdf_last_status() ? cdf_last_status() : CDF_ERR_INTERNAL);
    if (s == CDF_OK) {
        cdf_flux_replace_state(x_io, x);
        cdf_flux_replace_state(ctx_io, ctx);
    }
    cdf_scope_pop(NULL, 0);
    return s;
}

/* FluxSingleTransformerBlock on the joint sequence h = [ctx; x] [B, Lt+Li, D]. diffusers splits h
 * into (ctx, x) after every block and concatenates them again at the next one; keeping h whole
 * computes exactly the same values without the copies. */
static cdf_status single_block(const flux_model *m, const flux_single_block *b, cdf_tensor **h_io, cdf_tensor *temb,
                               cdf_tensor *cos_t, cdf_tensor *sin_t, cdf_tensor *const *attn_in, cdf_tensor **attn_out) {
    const int64_t hd = m->cfg.attention_head_dim;
    cdf_tensor *h = *h_io;
    cdf_scope_push();

    /* AdaLayerNormZeroSingle: shift, scale, gate */
    cdf_tensor *mod[3] = {0};
    cdf_chunk(cdf_linear_fwd(&b->norm, cdf_silu(temb)), 3, 1, mod);
    cdf_tensor *nh = cdf_flux_modulate(cdf_layer_norm(h, NULL, NULL, NORM_EPS), mod[0], mod[1]);
    nh = attn_in ? cdf_linear_shared_input(nh, 1, (const cdf_linear_layer *[]){&b->proj_mlp})
                 : cdf_linear_shared_input(nh, 4, (const cdf_linear_layer *[]){&b->proj_mlp, &b->to_q, &b->to_k, &b->to_v});

    /* parallel MLP and attention branches, fused by one output projection */
    cdf_tensor *mlp = cdf_gelu(cdf_linear_fwd(&b->proj_mlp, nh), CDF_GELU_TANH); /* [B, L, M] */
    cdf_tensor *attn = attn_in ? attn_in[0] : NULL;
    if (!attn_in) {
        cdf_tensor *q, *k, *v;
        project_qkv(&b->to_q, &b->to_k, &b->to_v, &b->norm_q, &b->norm_k, hd, nh, &q, &k, &v);
        attn = cdf_flux_rope_attention(q, k, v, cos_t, sin_t, cdf_linear_compute_dtype(&b->to_q), false); /* [B, L, D] */
        if (attn_out) attn_out[0] = cdf_tensor_retain(attn);
    }
    cdf_tensor *both = cdf_cat((cdf_tensor *[]){attn, mlp}, 2, 2);       /* [B, L, D + M] */
    h = cdf_flux_gated_add(h, mod[2], cdf_linear_fwd(&b->proj_out, both));

    cdf_status s = h ? CDF_OK : (cdf_last_status() ? cdf_last_status() : CDF_ERR_INTERNAL);
    if (s == CDF_OK) cdf_flux_replace_state(h_io, h);
    cdf_scope_pop(NULL, 0);
    return s;
}

/* ---- repeated-block compile: each block call goes through cdf_block_run with its weights ---- */

typedef struct block_ctx {
    const flux_model *m;
    const void *block;
    int taylor; /* 0 plain, 1 outputs the attention ("a0", "a1"), 2 takes it as inputs */
} block_ctx;

/* The attention outputs of a TaylorSeer block between the traced map and the block. */
static const char *const k_attn_keys[2] = {"a0", "a1"};

static cdf_status attn_to_map(cdf_tensor_map *out, cdf_tensor **attn, int n) {
    cdf_status s = CDF_OK;
    for (int i = 0; i < n; i++) {
        if (s == CDF_OK) s = cdf_tensor_map_set(out, k_attn_keys[i], attn[i]);
        cdf_tensor_release(attn[i]);
    }
    return s;
}

/* inputs x, ctx, temb, cos, sin [, a0, a1] -> outputs x, ctx [, a0, a1] */
static cdf_status double_block_traced(void *vctx, const cdf_tensor_map *in, cdf_tensor_map *out) {
    const block_ctx *bc = vctx;
    cdf_tensor *x = cdf_tensor_retain(cdf_tensor_map_get(in, "x")), *ctx = cdf_tensor_retain(cdf_tensor_map_get(in, "ctx"));
    cdf_tensor *a_in[2] = {cdf_tensor_map_get(in, "a0"), cdf_tensor_map_get(in, "a1")}, *a_out[2] = {NULL, NULL};
    cdf_status s = double_block(bc->m, bc->block, &x, &ctx, cdf_tensor_map_get(in, "temb"), cdf_tensor_map_get(in, "cos"),
                                cdf_tensor_map_get(in, "sin"), bc->taylor == 2 ? a_in : NULL, bc->taylor == 1 ? a_out : NULL);
    if (s == CDF_OK) s = cdf_tensor_map_set(out, "x", x);
    if (s == CDF_OK) s = cdf_tensor_map_set(out, "ctx", ctx);
    if (bc->taylor == 1) {
        cdf_status s2 = attn_to_map(out, a_out, 2);
        if (s == CDF_OK) s = s2;
    }
    cdf_tensor_release(x);
    cdf_tensor_release(ctx);
    return s;
}

static cdf_status single_block_traced(void *vctx, const cdf_tensor_map *in, cdf_tensor_map *out) {
    const block_ctx *bc = vctx;
    cdf_tensor *h = cdf_tensor_retain(cdf_tensor_map_get(in, "h"));
    cdf_tensor *a_in[1] = {cdf_tensor_map_get(in, "a0")}, *a_out[1] = {NULL};
    cdf_status s = single_block(bc->m, bc->block, &h, cdf_tensor_map_get(in, "temb"), cdf_tensor_map_get(in, "cos"),
                                cdf_tensor_map_get(in, "sin"), bc->taylor == 2 ? a_in : NULL, bc->taylor == 1 ? a_out : NULL);
    if (s == CDF_OK) s = cdf_tensor_map_set(out, "h", h);
    if (bc->taylor == 1) {
        cdf_status s2 = attn_to_map(out, a_out, 1);
        if (s == CDF_OK) s = s2;
    }
    cdf_tensor_release(h);
    return s;
}

/* Runs block i (double or single) through the repeated-block compiler; *a (and *b) are the
 * stream states (owned references, replaced). attn_in / attn_out: TaylorSeer's (double_block);
 * each variant is a block class of its own (its own graphs). */
static cdf_status run_block(const flux_model *m, bool dbl, int64_t i, cdf_tensor **a, cdf_tensor **b, cdf_tensor *temb,
                            cdf_tensor *cos_t, cdf_tensor *sin_t, cdf_tensor *const *attn_in, cdf_tensor **attn_out) {
    cdf_tensor *w[CDF_BLOCK_MAX_WEIGHTS];
    int nw = 0;
    block_ctx bc = {m, NULL, attn_in ? 2 : attn_out ? 1 : 0};
    const int n_attn = dbl ? 2 : 1;
    cdf_tensor_map in, out;
    cdf_tensor_map_init(&in);
    cdf_tensor_map_init(&out);
    cdf_status s = CDF_OK;
    if (dbl) {
        const flux_double_block *d = &m->blocks[i];
        bc.block = d;
        const cdf_linear_layer *lin[] = {&d->norm1, &d->norm1_context, &d->to_q, &d->to_k, &d->to_v, &d->to_out,
                                         &d->add_q_proj, &d->add_k_proj, &d->add_v_proj, &d->to_add_out, &d->ff_in,
                                         &d->ff_out, &d->ff_context_in, &d->ff_context_out};
        for (size_t k = 0; k < sizeof lin / sizeof *lin; k++) nw = cdf_linear_list_weights(w, nw, lin[k]);
        const cdf_norm_layer *nrm[] = {&d->norm_q, &d->norm_k, &d->norm_added_q, &d->norm_added_k};
        for (size_t k = 0; k < sizeof nrm / sizeof *nrm; k++) nw = cdf_norm_list_weights(w, nw, nrm[k]);
        s = cdf_tensor_map_set(&in, "x", *a);
        if (s == CDF_OK) s = cdf_tensor_map_set(&in, "ctx", *b);
    } else {
        const flux_single_block *d = &m->single_blocks[i];
        bc.block = d;
        const cdf_linear_layer *lin[] = {&d->norm, &d->to_q, &d->to_k, &d->to_v, &d->proj_mlp, &d->proj_out};
        for (size_t k = 0; k < sizeof lin / sizeof *lin; k++) nw = cdf_linear_list_weights(w, nw, lin[k]);
        nw = cdf_norm_list_weights(w, nw, &d->norm_q);
        nw = cdf_norm_list_weights(w, nw, &d->norm_k);
        s = cdf_tensor_map_set(&in, "h", *a);
    }
    if (s == CDF_OK) s = cdf_tensor_map_set(&in, "temb", temb);
    if (s == CDF_OK) s = cdf_tensor_map_set(&in, "cos", cos_t);
    if (s == CDF_OK) s = cdf_tensor_map_set(&in, "sin", sin_t);
    for (int k = 0; attn_in && k < n_attn && s == CDF_OK; k++) s = cdf_tensor_map_set(&in, k_attn_keys[k], attn_in[k]);
    static const char *const names[2][3] = {
        {"FluxSingleTransformerBlock", "FluxSingleTransformerBlock.taylor_update", "FluxSingleTransformerBlock.taylor_predict"},
        {"FluxTransformerBlock", "FluxTransformerBlock.taylor_update", "FluxTransformerBlock.taylor_predict"}};
    if (s == CDF_OK)
        s = cdf_block_run(names[dbl][bc.taylor], dbl ? double_block_traced : single_block_traced, &bc, &in, &out, w, nw);
    if (s == CDF_OK) {
        cdf_tensor_release(*a);
        *a = cdf_tensor_retain(cdf_tensor_map_get(&out, dbl ? "x" : "h"));
        if (dbl) {
            cdf_tensor_release(*b);
            *b = cdf_tensor_retain(cdf_tensor_map_get(&out, "ctx"));
        }
        for (int k = 0; attn_out && k < n_attn; k++) attn_out[k] = cdf_tensor_retain(cdf_tensor_map_get(&out, k_attn_keys[k]));
    }
    cdf_tensor_map_clear(&in);
    cdf_tensor_map_clear(&out);
    return s;
}



/* ids [L, n_axes] or the deprecated [N, L, n_axes] (entry 0 is used): checks the shape and
 * returns the [L, n_axes] rows as a view (recorded in the current scope). The positions stay on
 * the device: the RoPE tables are computed there (no host read, so the forward can be compiled
 * as one graph). */
static cdf_status ids_rows(const char *name, cdf_tensor *ids, int64_t L, int n_axes, cdf_tensor **rows) {
    char want[96];
    snprintf(want, sizeof want, "[%lld, %d] (or [1, %lld, %d])", (long long)L, n_axes, (long long)L, n_axes);
    const int nd = cdf_tensor_ndim(ids);
    if ((nd != 2 && nd != 3) || (nd == 3 && cdf_tensor_dim(ids, 0) < 1) || cdf_tensor_dim(ids, -2) != L ||
        cdf_tensor_dim(ids, -1) != n_axes)
        return cdf_flux_input_shape_error(MODEL, name, ids, want);
    *rows = nd == 3 ? cdf_squeeze(cdf_narrow(ids, 0, 0, 1), 0) : cdf_narrow(ids, 0, 0, L);
    return *rows ? CDF_OK : cdf_last_status();
}

/* The forward's input checks (names and shapes against the config and each other). */
static cdf_status check_inputs(const flux_model *m, const cdf_flux_inputs *in) {
    const cdf_flux_config *c = &m->cfg;
    const struct {
        const char *name;
        cdf_tensor *t;
    } required[] = {{"hidden_states", in->hidden_states}, {"encoder_hidden_states", in->encoder_hidden_states},
                    {"pooled_projections", in->pooled_projections}, {"timestep", in->timestep},
                    {"img_ids", in->img_ids}, {"txt_ids", in->txt_ids}};
    for (size_t i = 0; i < sizeof required / sizeof *required; i++)
        if (!required[i].t) return cdf_error(CDF_ERR_NOT_FOUND, "%s: required input '%s' is missing", MODEL, required[i].name);
    if (c->guidance_embeds && !in->guidance)
        return cdf_error(CDF_ERR_NOT_FOUND, "%s: input 'guidance' is required (config guidance_embeds = true)", MODEL);
    if (!c->guidance_embeds && in->guidance)
        return cdf_error(CDF_ERR_INVALID_ARG, "%s: input 'guidance' was given but the model has no guidance embedding "
                         "(config guidance_embeds = false)", MODEL);

    /* shapes */
    char want[128];
    const cdf_tensor *hs = in->hidden_states, *ehs = in->encoder_hidden_states, *pp = in->pooled_projections;
    if (cdf_tensor_ndim(hs) != 3 || cdf_tensor_dim(hs, 2) != c->in_channels || cdf_tensor_dim(hs, 0) < 1 ||
        cdf_tensor_dim(hs, 1) < 1) {
        snprintf(want, sizeof want, "[B, L_img, %lld] (in_channels)", (long long)c->in_channels);
        return cdf_flux_input_shape_error(MODEL, "hidden_states", hs, want);
    }
    const int64_t B = cdf_tensor_dim(hs, 0);
    /* L_txt >= 1: the pipeline always pads the prompt to max_sequence_length >= 1, and an empty
     * text sequence would only fail later, inside a reshape, without naming the input */
    if (cdf_tensor_ndim(ehs) != 3 || cdf_tensor_dim(ehs, 0) != B || cdf_tensor_dim(ehs, 1) < 1 ||
        cdf_tensor_dim(ehs, 2) != c->joint_attention_dim) {
        snprintf(want, sizeof want, "[%lld, L_txt >= 1, %lld] (batch of hidden_states, joint_attention_dim)", (long long)B,
                 (long long)c->joint_attention_dim);
        return cdf_flux_input_shape_error(MODEL, "encoder_hidden_states", ehs, want);
    }
    if (cdf_tensor_ndim(pp) != 2 || cdf_tensor_dim(pp, 0) != B || cdf_tensor_dim(pp, 1) != c->pooled_projection_dim) {
        snprintf(want, sizeof want, "[%lld, %lld] (batch, pooled_projection_dim)", (long long)B, (long long)c->pooled_projection_dim);
        return cdf_flux_input_shape_error(MODEL, "pooled_projections", pp, want);
    }
    CDF_TRY(cdf_flux_check_per_batch(MODEL, "timestep", in->timestep, B));
    if (in->guidance) CDF_TRY(cdf_flux_check_per_batch(MODEL, "guidance", in->guidance, B));
    return CDF_OK;
}

/* The forward's state between its parts: owned references (outside every scope). */
typedef struct flux_fwd {
    cdf_tensor *x, *ctx, *temb, *cos_t, *sin_t;
    /* TaylorSeer: 0 plain, 1 every attention module's outputs into attn, 2 taken from attn
     * (double block i: attn[2i], attn[2i + 1]; single block j: attn[2 num_layers + j]) */
    int taylor;
    cdf_tensor **attn;
} flux_fwd;

static void fwd_release(flux_fwd *f) {
    cdf_tensor *owned[] = {f->x, f->ctx, f->temb, f->cos_t, f->sin_t};
    for (size_t i = 0; i < sizeof owned / sizeof *owned; i++) cdf_tensor_release(owned[i]);
    f->x = f->ctx = f->temb = f->cos_t = f->sin_t = NULL;
}

/* Embeddings and RoPE tables of checked inputs into f. */
static cdf_status fwd_embed(const flux_model *m, const cdf_flux_inputs *in, flux_fwd *f) {
    const cdf_flux_config *c = &m->cfg;
    const int64_t Li = cdf_tensor_dim(in->hidden_states, 1), Lt = cdf_tensor_dim(in->encoder_hidden_states, 1);
    cdf_tensor *x = NULL, *ctx = NULL, *temb = NULL, *cos_t = NULL, *sin_t = NULL;
    cdf_scope_push();
    /* positions: rows = cat(txt_ids, img_ids), as float32 like ids.float() */
    cdf_tensor *txt_rows = NULL, *img_rows = NULL;
    cdf_status s = ids_rows("txt_ids", in->txt_ids, Lt, c->n_axes, &txt_rows);
    if (s == CDF_OK) s = ids_rows("img_ids", in->img_ids, Li, c->n_axes, &img_rows);
    if (s == CDF_OK) {
        cdf_tensor *both_rows[2] = {cdf_cast(txt_rows, CDF_F32), cdf_cast(img_rows, CDF_F32)};
        s = cdf_rope_tables(cdf_cat(both_rows, 2, 0), c->n_axes, c->axes_dims_rope, ROPE_THETA, &cos_t, &sin_t);
    }
    if (s == CDF_OK) {
        cdf_tensor_retain(cos_t);
        cdf_tensor_retain(sin_t);
        /* timestep.to(f32) * 1000 -> sinusoidal projection (float32 frequency table, like torch) */
        cdf_tensor *t1000 = cdf_scale(cdf_cast(in->timestep, CDF_F32), 1000.0f);
        cdf_tensor *e = cdf_flux_mlp_fwd(&m->timestep_embedder, cdf_timestep_embedding(t1000, TIME_PROJ_DIM, true, 0.0f, 1.0f, 10000.0f));
        if (in->guidance) {
            cdf_tensor *g1000 = cdf_scale(cdf_cast(in->guidance, CDF_F32), 1000.0f);
            e = cdf_add(e, cdf_flux_mlp_fwd(&m->guidance_embedder,
                                            cdf_timestep_embedding(g1000, TIME_PROJ_DIM, true, 0.0f, 1.0f, 10000.0f)));
        }
        e = cdf_add(e, cdf_flux_mlp_fwd(&m->text_embedder, cdf_cast(in->pooled_projections, CDF_F32))); /* [B, D] */
        cdf_tensor *xe = cdf_linear_fwd(&m->x_embedder, cdf_cast(in->hidden_states, CDF_F32));                /* [B, Li, D] */
        cdf_tensor *ce = cdf_linear_fwd(&m->context_embedder, cdf_cast(in->encoder_hidden_states, CDF_F32)); /* [B, Lt, D] */
        if (e && xe && ce) {
            /* a single timestep for a batch broadcasts here: temb is [B, D] because pooled is */
            temb = cdf_tensor_retain(e);
            x = cdf_tensor_retain(xe);
            ctx = cdf_tensor_retain(ce);
        } else {
            s = cdf_last_status() ? cdf_last_status() : CDF_ERR_INTERNAL;
        }
    }
    cdf_scope_pop(NULL, 0);

    f->x = x, f->ctx = ctx, f->temb = temb, f->cos_t = cos_t, f->sin_t = sin_t;
    return s;
}

/* Double-stream blocks [from, to) on f's streams. */
static cdf_status fwd_doubles(const flux_model *m, flux_fwd *f, int64_t from, int64_t to) {
    cdf_status s = CDF_OK;
    for (int64_t i = from; s == CDF_OK && i < to; i++) {
        cdf_tensor **a = f->taylor ? f->attn + 2 * i : NULL;
        s = run_block(m, true, i, &f->x, &f->ctx, f->temb, f->cos_t, f->sin_t, f->taylor == 2 ? a : NULL, f->taylor == 1 ? a : NULL);
        if (s != CDF_OK) cdf_error_prefix("%s transformer_blocks.%lld: ", MODEL, (long long)i);
    }
    return s;
}

/* The single-stream blocks on [ctx; x]: *h gets the joint sequence after them (owned). */
static cdf_status fwd_singles(const flux_model *m, flux_fwd *f, cdf_tensor **h) {
    cdf_scope_push();
    cdf_status s = cdf_flux_replace_state(h, cdf_cat((cdf_tensor *[]){f->ctx, f->x}, 2, 1));
    cdf_scope_pop(NULL, 0);
    for (int64_t i = 0; s == CDF_OK && i < m->cfg.num_single_layers; i++) {
        cdf_tensor **a = f->taylor ? f->attn + 2 * m->cfg.num_layers + i : NULL;
        s = run_block(m, false, i, h, NULL, f->temb, f->cos_t, f->sin_t, f->taylor == 2 ? a : NULL, f->taylor == 1 ? a : NULL);
        if (s != CDF_OK) cdf_error_prefix("%s single_transformer_blocks.%lld: ", MODEL, (long long)i);
    }
    return s;
}

/* The image part [B, Li, D] of the joint sequence (a view in the current scope). */
static cdf_tensor *image_part(cdf_tensor *h, const flux_fwd *f) {
    return cdf_narrow(h, 1, cdf_tensor_dim(f->ctx, 1), cdf_tensor_dim(f->x, 1));
}

/* Output: AdaLayerNormContinuous (scale first, then shift) and the projection of the image
 * stream xi; the result is in the current scope (NULL on error, set). */
static cdf_tensor *fwd_output(const flux_model *m, cdf_tensor *xi, cdf_tensor *temb) {
    cdf_tensor *mod[2] = {0};
    cdf_chunk(cdf_linear_fwd(&m->norm_out, cdf_silu(temb)), 2, 1, mod); /* scale, shift */
    return cdf_linear_fwd(&m->proj_out, cdf_flux_modulate(cdf_layer_norm(xi, NULL, NULL, NORM_EPS), mod[1], mod[0]));
}

static cdf_status status_or_internal(void) { return cdf_last_status() ? cdf_last_status() : CDF_ERR_INTERNAL; }

/* forward, with MagCache's residual (residual non-NULL) or TaylorSeer's attention outputs
 * (taylor 1: new references into attn; 2: taken from attn). */
static cdf_status forward_impl(void *impl, const cdf_flux_inputs *in, int taylor, cdf_tensor **attn, cdf_tensor **sample,
                               cdf_tensor **residual) {
    if (sample) *sample = NULL;
    if (residual) *residual = NULL;
    if (!impl || !in || !sample) return cdf_error(CDF_ERR_INVALID_ARG, "%s: forward needs the model, inputs and an output", MODEL);
    const flux_model *m = impl;
    CDF_TRY(check_inputs(m, in));
    cdf_scope_push(); /* the forward's scope: only the results leave it */
    flux_fwd f = {.taylor = taylor, .attn = attn};
    cdf_tensor *h = NULL, *out[2] = {NULL, NULL}; /* h owned: the joint sequence [ctx; x] of the single-stream blocks */
    cdf_status s = fwd_embed(m, in, &f);
    cdf_tensor *x0 = s == CDF_OK && residual ? cdf_tensor_retain(f.x) : NULL; /* the embedded latents */
    if (s == CDF_OK) s = fwd_doubles(m, &f, 0, m->cfg.num_layers);
    if (s == CDF_OK) s = fwd_singles(m, &f, &h);
    if (s == CDF_OK && !(out[0] = fwd_output(m, image_part(h, &f), f.temb))) s = status_or_internal();
    if (s == CDF_OK && residual && !(out[1] = cdf_sub(image_part(h, &f), x0))) s = status_or_internal();
    cdf_tensor_release(x0);
    cdf_tensor_release(h);
    fwd_release(&f);
    const int n = s != CDF_OK ? 0 : residual ? 2 : 1;
    cdf_scope_pop(out, n); /* the results move to the caller's scope */
    if (s != CDF_OK) return s;
    *sample = out[0];
    if (residual) *residual = out[1];
    return CDF_OK;
}

cdf_status cdf_flux_transformer_forward(void *impl, const cdf_flux_inputs *in, cdf_tensor **sample) {
    return forward_impl(impl, in, 0, NULL, sample, NULL);
}

cdf_status cdf_flux_transformer_forward_residual(void *impl, const cdf_flux_inputs *in, cdf_tensor **sample, cdf_tensor **residual) {
    return forward_impl(impl, in, 0, NULL, sample, residual);
}

int cdf_flux_attention_modules(const void *impl) {
    const flux_model *m = impl;
    return m ? (int)(2 * m->cfg.num_layers + m->cfg.num_single_layers) : 0;
}

cdf_status cdf_flux_transformer_forward_taylor(void *impl, const cdf_flux_inputs *in, bool predict, cdf_tensor **attn,
                                               cdf_tensor **sample) {
    const int n = cdf_flux_attention_modules(impl);
    if (!predict)
        for (int i = 0; i < n; i++) attn[i] = NULL;
    for (int i = 0; predict && i < n; i++)
        if (!attn[i]) return cdf_error(CDF_ERR_NOT_FOUND, "%s: taylor_predict needs every attention output (%d missing)", MODEL, i);
    cdf_status s = forward_impl(impl, in, predict ? 2 : 1, attn, sample, NULL);
    if (s != CDF_OK && !predict)
        for (int i = 0; i < n; i++) cdf_tensor_release(attn[i]), attn[i] = NULL;
    return s;
}

/* ---- First Block Cache parts (docs/step-caches.md): the forward split at the head block ---- */

cdf_status cdf_flux_fbc_head(void *impl, const cdf_flux_inputs *in, cdf_flux_fbc_state *st) {
    memset(st, 0, sizeof *st);
    if (!impl || !in) return cdf_error(CDF_ERR_INVALID_ARG, "%s: fbc_head needs the model and inputs", MODEL);
    const flux_model *m = impl;
    if (m->cfg.num_layers < 1 || m->cfg.num_layers + m->cfg.num_single_layers < 2)
        return cdf_error(CDF_ERR_UNSUPPORTED, "%s: the first-block cache needs a double-stream head block and at least one "
                         "more block (num_layers %lld, num_single_layers %lld)", MODEL, (long long)m->cfg.num_layers,
                         (long long)m->cfg.num_single_layers);
    CDF_TRY(check_inputs(m, in));
    cdf_scope_push();
    flux_fwd f = {0};
    cdf_status s = fwd_embed(m, in, &f);
    cdf_tensor *x0 = s == CDF_OK ? cdf_tensor_retain(f.x) : NULL, *res = NULL;
    if (s == CDF_OK) s = fwd_doubles(m, &f, 0, 1);
    if (s == CDF_OK && !(res = cdf_sub(f.x, x0))) s = status_or_internal(); /* head_out - head_in, image stream */
    cdf_tensor_release(x0);
    cdf_tensor *keep[5] = {f.x, f.ctx, f.temb, f.cos_t, f.sin_t};
    if (s == CDF_OK) {
        st->x = f.x, st->ctx = f.ctx, st->temb = f.temb, st->cos_t = f.cos_t, st->sin_t = f.sin_t, st->residual = res;
        cdf_scope_pop(&res, 1);
        for (int i = 0; i < 5; i++) cdf_scope_record(keep[i]); /* the owned state moves to the caller's scope */
        return CDF_OK;
    }
    fwd_release(&f);
    cdf_scope_pop(NULL, 0);
    return s;
}

cdf_status cdf_flux_cache_embed(void *impl, const cdf_flux_inputs *in, cdf_tensor **x, cdf_tensor **temb) {
    *x = *temb = NULL;
    if (!impl || !in) return cdf_error(CDF_ERR_INVALID_ARG, "%s: cache_embed needs the model and inputs", MODEL);
    const flux_model *m = impl;
    CDF_TRY(check_inputs(m, in));
    cdf_scope_push();
    flux_fwd f = {0};
    cdf_status s = fwd_embed(m, in, &f);
    cdf_tensor *keep[2] = {f.x, f.temb};
    if (s == CDF_OK) {
        f.x = f.temb = NULL;
        fwd_release(&f);
        cdf_scope_pop(NULL, 0);
        for (int i = 0; i < 2; i++) cdf_scope_record(keep[i]);
        *x = keep[0], *temb = keep[1];
        return CDF_OK;
    }
    fwd_release(&f);
    cdf_scope_pop(NULL, 0);
    return s;
}

cdf_status cdf_flux_fbc_tail(void *impl, const cdf_flux_fbc_state *st, cdf_tensor **sample, cdf_tensor **tail_residual) {
    *sample = *tail_residual = NULL;
    const flux_model *m = impl;
    cdf_scope_push();
    flux_fwd f = {.x = cdf_tensor_retain(st->x), .ctx = cdf_tensor_retain(st->ctx), .temb = cdf_tensor_retain(st->temb),
                  .cos_t = cdf_tensor_retain(st->cos_t), .sin_t = cdf_tensor_retain(st->sin_t)};
    cdf_tensor *h = NULL, *out[2] = {NULL, NULL};
    cdf_status s = fwd_doubles(m, &f, 1, m->cfg.num_layers);
    if (s == CDF_OK) s = fwd_singles(m, &f, &h);
    if (s == CDF_OK) {
        cdf_tensor *xi = image_part(h, &f);
        out[0] = fwd_output(m, xi, f.temb);
        out[1] = cdf_sub(xi, st->x); /* tail_out - head_out, image stream */
        if (!out[0] || !out[1]) s = status_or_internal();
    }
    cdf_tensor_release(h);
    fwd_release(&f);
    cdf_scope_pop(s == CDF_OK ? out : NULL, s == CDF_OK ? 2 : 0);
    if (s != CDF_OK) return s;
    *sample = out[0], *tail_residual = out[1];
    return CDF_OK;
}

cdf_status cdf_flux_fbc_skip(void *impl, cdf_tensor *x, cdf_tensor *tail_residual, cdf_tensor *temb, cdf_tensor **sample) {
    *sample = NULL;
    const flux_model *m = impl;
    if (!x || !tail_residual || !temb) return cdf_error(CDF_ERR_NOT_FOUND, "%s: fbc_skip needs x, tail_residual and temb", MODEL);
    cdf_scope_push();
    /* diffusers: hidden_states = tail_block_residuals[0] + head output */
    cdf_tensor *out = fwd_output(m, cdf_add(tail_residual, x), temb);
    cdf_scope_pop(out ? &out : NULL, out ? 1 : 0);
    if (!out) return status_or_internal();
    *sample = out;
    return CDF_OK;
}

/* ---- component interface ---------------------------------------------------------------------- */
/* The step caches' parts as methods (each its own graph under compile):
 *   fbc_head (forward's inputs) -> out.x, out.ctx, out.temb, out.cos, out.sin, out.residual
 *   fbc_tail (x, ctx, temb, cos, sin) -> out.sample, out.tail_residual
 *   fbc_skip (x, tail_residual, temb) -> out.sample
 *   cache_full (forward's inputs) -> out.sample, out.residual (last block's image stream - embedded
 *     latents: MagCache's computed step)
 *   cache_embed (forward's inputs) -> out.x, out.temb (MagCache's skipped step: no block runs)
 *   taylor_update (forward's inputs) -> out.sample, out.attn.<k> (every attention module's outputs)
 *   taylor_predict (forward's inputs, attn.<k>) -> out.sample (the attention modules not run) */
static cdf_status fbc_run(void *impl, const char *method, const cdf_flux_inputs *fi, const cdf_tensor_map *in,
                          cdf_tensor_map *out) {
    if (strcmp(method, "fbc_head") == 0) {
        cdf_flux_fbc_state st;
        CDF_TRY(cdf_flux_fbc_head(impl, fi, &st));
        const char *names[6] = {"out.x", "out.ctx", "out.temb", "out.cos", "out.sin", "out.residual"};
        cdf_tensor *t[6] = {st.x, st.ctx, st.temb, st.cos_t, st.sin_t, st.residual};
        for (int i = 0; i < 6; i++) CDF_TRY(cdf_tensor_map_set(out, names[i], t[i]));
        return CDF_OK;
    }
    if (strcmp(method, "taylor_update") == 0 || strcmp(method, "taylor_predict") == 0) {
        const bool predict = method[7] == 'p';
        const int n = cdf_flux_attention_modules(impl);
        cdf_tensor **attn = calloc((size_t)n + 1, sizeof *attn), *sample = NULL;
        if (!attn) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
        char key[32];
        for (int i = 0; predict && i < n; i++) {
            snprintf(key, sizeof key, "attn.%d", i);
            attn[i] = cdf_tensor_map_get(in, key);
        }
        cdf_status s = cdf_flux_transformer_forward_taylor(impl, fi, predict, attn, &sample);
        if (s == CDF_OK) s = cdf_tensor_map_set(out, "out.sample", sample);
        for (int i = 0; !predict && i < n; i++) {
            snprintf(key, sizeof key, "out.attn.%d", i);
            if (s == CDF_OK) s = cdf_tensor_map_set(out, key, attn[i]);
            cdf_tensor_release(attn[i]);
        }
        free(attn);
        return s;
    }
    if (strcmp(method, "cache_full") == 0) {
        cdf_tensor *sample = NULL, *residual = NULL;
        CDF_TRY(cdf_flux_transformer_forward_residual(impl, fi, &sample, &residual));
        CDF_TRY(cdf_tensor_map_set(out, "out.sample", sample));
        return cdf_tensor_map_set(out, "out.residual", residual);
    }
    if (strcmp(method, "cache_embed") == 0) {
        cdf_tensor *x = NULL, *temb = NULL;
        CDF_TRY(cdf_flux_cache_embed(impl, fi, &x, &temb));
        CDF_TRY(cdf_tensor_map_set(out, "out.x", x));
        return cdf_tensor_map_set(out, "out.temb", temb);
    }
    if (strcmp(method, "fbc_tail") == 0) {
        cdf_flux_fbc_state st = {.x = cdf_input(in, "x", MODEL), .ctx = cdf_input(in, "ctx", MODEL),
                                 .temb = cdf_input(in, "temb", MODEL), .cos_t = cdf_input(in, "cos", MODEL),
                                 .sin_t = cdf_input(in, "sin", MODEL)};
        if (!st.x || !st.ctx || !st.temb || !st.cos_t || !st.sin_t) return cdf_last_status();
        cdf_tensor *sample = NULL, *tail = NULL;
        CDF_TRY(cdf_flux_fbc_tail(impl, &st, &sample, &tail));
        CDF_TRY(cdf_tensor_map_set(out, "out.sample", sample));
        return cdf_tensor_map_set(out, "out.tail_residual", tail);
    }
    cdf_tensor *sample = NULL;
    CDF_TRY(cdf_flux_fbc_skip(impl, cdf_input(in, "x", MODEL), cdf_input(in, "tail_residual", MODEL), cdf_input(in, "temb", MODEL),
                              &sample));
    return cdf_tensor_map_set(out, "out.sample", sample);
}

static cdf_status flux_run(void *impl, const char *method, const cdf_tensor_map *in, cdf_tensor_map *out) {
    const bool fbc = method && (strcmp(method, "fbc_head") == 0 || strcmp(method, "fbc_tail") == 0 || strcmp(method, "fbc_skip") == 0 ||
                                strcmp(method, "cache_full") == 0 || strcmp(method, "cache_embed") == 0 ||
                                strcmp(method, "taylor_update") == 0 || strcmp(method, "taylor_predict") == 0);
    if (method && strcmp(method, "forward") != 0 && !fbc)
        return cdf_error(CDF_ERR_UNSUPPORTED, "%s: method '%s' is not supported (only 'forward' and the step caches' "
                         "'fbc_head', 'fbc_tail', 'fbc_skip', 'cache_full', 'cache_embed', 'taylor_update', 'taylor_predict')",
                         MODEL, method);
    cdf_flux_inputs fi = {
        .hidden_states = cdf_tensor_map_get(in, "hidden_states"),
        .encoder_hidden_states = cdf_tensor_map_get(in, "encoder_hidden_states"),
        .pooled_projections = cdf_tensor_map_get(in, "pooled_projections"),
        .timestep = cdf_tensor_map_get(in, "timestep"),
        .img_ids = cdf_tensor_map_get(in, "img_ids"),
        .txt_ids = cdf_tensor_map_get(in, "txt_ids"),
        .guidance = cdf_tensor_map_get(in, "guidance"),
    };
    if (fbc) return fbc_run(impl, method, &fi, in, out);
    cdf_tensor *sample = NULL;
    CDF_TRY(cdf_flux_transformer_forward(impl, &fi, &sample));
    return cdf_tensor_map_set(out, "out.sample", sample);
}

const cdf_component_class cdf_flux_transformer_class = {
    .names = (const char *const[]){MODEL, NULL},
    .load = flux_load,
    .free = flux_free,
    .run = flux_run,
};
