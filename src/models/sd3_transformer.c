/* SD3Transformer2DModel — the MMDiT of Stable Diffusion 3 and 3.5, following diffusers
 * (transformer_sd3.py, attention.py JointTransformerBlock, attention_processor.py
 * JointAttnProcessor2_0, embeddings.py PatchEmbed / CombinedTimestepTextProjEmbeddings,
 * normalization.py AdaLayerNormZero / SD35AdaLayerNormZeroX / AdaLayerNormContinuous).
 *
 * Forward, top to bottom (D = num_attention_heads * attention_head_dim, p = patch_size):
 *   x    = conv_pxp(hidden_states) -> tokens [B, N, D] + centre crop of pos_embed.pos_embed
 *   temb = TimestepEmbedding(sinusoid_256(timestep)) + PixArtAlphaTextProjection(pooled)  [B, D]
 *   ctx  = context_embedder(encoder_hidden_states)                                    [B, T, D]
 *   for each joint block: (ctx, x) = block(x, ctx, temb); the last block only updates x
 *   x = AdaLayerNormContinuous(x, temb); x = proj_out(x); unpatchify to [B, C_out, H, W]
 *
 * Joint attention concatenates the token sequences as [image; text] (JointAttnProcessor2_0
 * cats the sample projections first) and splits them back at N. */
#include "models/sd3_transformer.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "compile/compile.h"
#include "tensor/tensor_impl.h"
#include "io/json.h"

#define SD3_NAME "SD3Transformer2DModel"
/* Sanity bound for config integers: far above any real SD3 size, low enough that products of
 * two of them (weight shapes) cannot overflow int64. */
#define SD3_MAX_CFG_INT (1 << 20)

typedef struct sd3_config {
    int64_t sample_size, patch_size, in_channels, out_channels, num_layers;
    int64_t head_dim, num_heads, inner_dim;
    int64_t joint_attention_dim, caption_projection_dim, pooled_projection_dim;
    int64_t pos_embed_max_size;
    bool qk_rms_norm;       /* qk_norm == "rms_norm" (SD3.5); false for null (SD3) */
    bool *dual_attention;   /* [num_layers]: block i has attn2 (SD35AdaLayerNormZeroX) */
} sd3_config;

/* diffusers Attention with the projections JointAttnProcessor2_0 uses. */
typedef struct sd3_attention {
    cdf_linear_layer to_q, to_k, to_v, to_out;          /* sample stream ("to_out.0") */
    cdf_linear_layer add_q, add_k, add_v, to_add_out;   /* context stream; to_add_out absent when context_pre_only */
    cdf_tensor *norm_q, *norm_k, *norm_added_q, *norm_added_k; /* RMSNorm scales [head_dim] or NULL */
} sd3_attention;

typedef struct sd3_block {
    bool context_pre_only; /* the last block: context only feeds keys/values, its output is dropped */
    bool dual_attention;   /* SD3.5: a second, image-only self-attention attn2 */
    cdf_linear_layer norm1;         /* AdaLayerNormZero [6D, D] or SD35AdaLayerNormZeroX [9D, D] */
    cdf_linear_layer norm1_context; /* AdaLayerNormZero [6D, D] or AdaLayerNormContinuous [2D, D] */
    sd3_attention attn, attn2;
    cdf_linear_layer ff_proj, ff_out;   /* ff.net.0.proj [4D, D], ff.net.2 [D, 4D] */
    cdf_linear_layer ffc_proj, ffc_out; /* ff_context, absent when context_pre_only */
} sd3_block;

typedef struct sd3_model {
    sd3_config cfg;
    cdf_tp *tp; /* tensor-parallel sharding, NULL when the model is whole */
    cdf_conv_layer patch_proj;   /* pos_embed.proj: conv p x p, stride p */
    cdf_tensor *pos_table;       /* pos_embed.pos_embed [1, M*M, D] in the weights' dtype: bf16 under
                                  * the bf16 policy, as diffusers' model.to(bfloat16) casts this buffer
                                  * (0.42 GiB instead of 0.84 for SD3.5's 384 x 384 grid) */
    cdf_linear_layer t_lin1, t_lin2;   /* time_text_embed.timestep_embedder.linear_1/2 */
    cdf_linear_layer p_lin1, p_lin2;   /* time_text_embed.text_embedder.linear_1/2 */
    cdf_linear_layer context_embedder;
    sd3_block *blocks;
    cdf_linear_layer norm_out, proj_out;
} sd3_model;

/* Tensor-parallel plan. diffusers has none for SD3Transformer2DModel; this is the Megatron split
 * FLUX uses, applied to the MMDiT joint block: every attention (attn, and attn2 of the SD3.5
 * dual-attention blocks) shards its heads — q/k/v of both streams column-wise, to_out.0 and
 * to_add_out row-wise — and both feed-forwards split their 4D hidden channels (net.0.proj
 * column-wise, net.2 row-wise). AdaLN modulation, QK RMSNorms (per head_dim, so identical on
 * every rank), the patch/position/time/text embedders and the output layers are replicated.
 * Per joint block: 4 all-reduces (3 for the last, context_pre_only block; +1 with attn2). */
static const cdf_tp_rule SD3_TP_PLAN[] = {
    {"transformer_blocks.*.attn.to_q", CDF_TP_COLWISE},
    {"transformer_blocks.*.attn.to_k", CDF_TP_COLWISE},
    {"transformer_blocks.*.attn.to_v", CDF_TP_COLWISE},
    {"transformer_blocks.*.attn.add_q_proj", CDF_TP_COLWISE},
    {"transformer_blocks.*.attn.add_k_proj", CDF_TP_COLWISE},
    {"transformer_blocks.*.attn.add_v_proj", CDF_TP_COLWISE},
    {"transformer_blocks.*.attn.to_out.0", CDF_TP_ROWWISE},
    {"transformer_blocks.*.attn.to_add_out", CDF_TP_ROWWISE},
    {"transformer_blocks.*.attn2.to_q", CDF_TP_COLWISE},
    {"transformer_blocks.*.attn2.to_k", CDF_TP_COLWISE},
    {"transformer_blocks.*.attn2.to_v", CDF_TP_COLWISE},
    {"transformer_blocks.*.attn2.to_out.0", CDF_TP_ROWWISE},
    {"transformer_blocks.*.ff.net.0.proj", CDF_TP_COLWISE},
    {"transformer_blocks.*.ff.net.2", CDF_TP_ROWWISE},
    {"transformer_blocks.*.ff_context.net.0.proj", CDF_TP_COLWISE},
    {"transformer_blocks.*.ff_context.net.2", CDF_TP_ROWWISE},
    {NULL, CDF_TP_REPLICATE},
};

/* ---- config --------------------------------------------------------------------------------- */

static cdf_status cfg_int(const cJSON *j, const char *key, int64_t def, int64_t *out) {
    return cdf_config_get_dim(j, key, def, SD3_MAX_CFG_INT, out);
}

/* Defaults are SD3Transformer2DModel.__init__'s. */
static cdf_status parse_config(const cJSON *j, sd3_config *c) {
    memset(c, 0, sizeof *c);
    CDF_TRY(cfg_int(j, "sample_size", 128, &c->sample_size));
    CDF_TRY(cfg_int(j, "patch_size", 2, &c->patch_size));
    CDF_TRY(cfg_int(j, "in_channels", 16, &c->in_channels));
    CDF_TRY(cfg_int(j, "num_layers", 18, &c->num_layers));
    CDF_TRY(cfg_int(j, "attention_head_dim", 64, &c->head_dim));
    CDF_TRY(cfg_int(j, "num_attention_heads", 18, &c->num_heads));
    CDF_TRY(cfg_int(j, "joint_attention_dim", 4096, &c->joint_attention_dim));
    CDF_TRY(cfg_int(j, "caption_projection_dim", 1152, &c->caption_projection_dim));
    CDF_TRY(cfg_int(j, "pooled_projection_dim", 2048, &c->pooled_projection_dim));
    /* out_channels: null means in_channels (diffusers: `out_channels if not None else in_channels`) */
    CDF_TRY(cfg_int(j, "out_channels", c->in_channels, &c->out_channels));
    /* pos_embed_max_size: an explicit null selects diffusers' non-cropping sincos path, which
     * real SD3 checkpoints never use (their table is a stored buffer). */
    if (cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(j, "pos_embed_max_size")))
        return cdf_error(CDF_ERR_UNSUPPORTED, "config.json: pos_embed_max_size = null (on-the-fly sincos position "
                                              "embedding) is not supported; SD3 checkpoints set it");
    CDF_TRY(cfg_int(j, "pos_embed_max_size", 96, &c->pos_embed_max_size));
    c->inner_dim = c->num_heads * c->head_dim;
    if (c->inner_dim > SD3_MAX_CFG_INT)
        return cdf_error(CDF_ERR_FORMAT, "config.json: num_attention_heads * attention_head_dim = %lld exceeds %d",
                         (long long)c->inner_dim, SD3_MAX_CFG_INT);
    /* The blocks' add_k/add_v projections take `dim` inputs, so the context embedder must
     * produce exactly the inner dimension (true of every SD3 checkpoint). */
    if (c->caption_projection_dim != c->inner_dim)
        return cdf_error(CDF_ERR_UNSUPPORTED,
                         "config.json: caption_projection_dim %lld differs from num_attention_heads * attention_head_dim "
                         "= %lld (the joint blocks need them equal)",
                         (long long)c->caption_projection_dim, (long long)c->inner_dim);

    const char *qk = NULL;
    CDF_TRY(cdf_json_get_string(j, "qk_norm", NULL, &qk));
    if (qk && strcmp(qk, "rms_norm") == 0) c->qk_rms_norm = true;
    else if (qk)
        return cdf_error(CDF_ERR_UNSUPPORTED, "config.json: qk_norm '%s' is not supported (null or \"rms_norm\")", qk);

    c->dual_attention = calloc((size_t)c->num_layers, sizeof *c->dual_attention);
    if (!c->dual_attention) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory for %lld layers", (long long)c->num_layers);
    int64_t *idx = malloc((size_t)c->num_layers * sizeof *idx);
    if (!idx) {
        free(c->dual_attention);
        c->dual_attention = NULL;
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    }
    int n = 0;
    cdf_status s = cdf_json_get_int_array(j, "dual_attention_layers", idx, (int)c->num_layers, &n);
    for (int i = 0; s == CDF_OK && i < n; i++) {
        /* diffusers tests `i in dual_attention_layers`: an index outside 0..num_layers-1 would be
         * silently ignored there; here it is reported, it is certainly a config mistake. */
        if (idx[i] < 0 || idx[i] >= c->num_layers)
            s = cdf_error(CDF_ERR_FORMAT, "config.json: dual_attention_layers[%d] = %lld is outside 0..%lld", i,
                          (long long)idx[i], (long long)c->num_layers - 1);
        else c->dual_attention[idx[i]] = true;
    }
    free(idx);
    if (s != CDF_OK) {
        free(c->dual_attention);
        c->dual_attention = NULL;
    }
    return s;
}

/* ---- loading -------------------------------------------------------------------------------- */

static cdf_status load_attention(cdf_weights *w, const cdf_tp *tp, const sd3_config *c, sd3_attention *a, bool joint,
                                 bool has_add_out, const char *prefix) {
    const int64_t d = c->inner_dim, hd[1] = {c->head_dim};
    CDF_TRY(cdf_tp_linear_load(w, tp, &a->to_q, d, d, 1, "%s.to_q", prefix));
    CDF_TRY(cdf_tp_linear_load(w, tp, &a->to_k, d, d, 1, "%s.to_k", prefix));
    CDF_TRY(cdf_tp_linear_load(w, tp, &a->to_v, d, d, 1, "%s.to_v", prefix));
    CDF_TRY(cdf_tp_linear_load(w, tp, &a->to_out, d, d, 1, "%s.to_out.0", prefix));
    if (c->qk_rms_norm) {
        if (!(a->norm_q = cdf_weights_get(w, 1, hd, "%s.norm_q.weight", prefix))) return cdf_last_status();
        if (!(a->norm_k = cdf_weights_get(w, 1, hd, "%s.norm_k.weight", prefix))) return cdf_last_status();
    }
    if (!joint) return CDF_OK;
    CDF_TRY(cdf_tp_linear_load(w, tp, &a->add_q, d, d, 1, "%s.add_q_proj", prefix));
    CDF_TRY(cdf_tp_linear_load(w, tp, &a->add_k, d, d, 1, "%s.add_k_proj", prefix));
    CDF_TRY(cdf_tp_linear_load(w, tp, &a->add_v, d, d, 1, "%s.add_v_proj", prefix));
    if (has_add_out) CDF_TRY(cdf_tp_linear_load(w, tp, &a->to_add_out, d, d, 1, "%s.to_add_out", prefix));
    if (c->qk_rms_norm) {
        if (!(a->norm_added_q = cdf_weights_get(w, 1, hd, "%s.norm_added_q.weight", prefix))) return cdf_last_status();
        if (!(a->norm_added_k = cdf_weights_get(w, 1, hd, "%s.norm_added_k.weight", prefix))) return cdf_last_status();
    }
    return CDF_OK;
}

static void free_attention(sd3_attention *a) {
    cdf_linear_layer *ls[] = {&a->to_q, &a->to_k, &a->to_v, &a->to_out, &a->add_q, &a->add_k, &a->add_v, &a->to_add_out};
    for (size_t i = 0; i < sizeof ls / sizeof *ls; i++) cdf_linear_free(ls[i]);
    cdf_tensor_release(a->norm_q);
    cdf_tensor_release(a->norm_k);
    cdf_tensor_release(a->norm_added_q);
    cdf_tensor_release(a->norm_added_k);
    memset(a, 0, sizeof *a);
}

static cdf_status load_block(cdf_weights *w, const cdf_tp *tp, const sd3_config *c, int i, sd3_block *b) {
    const int64_t d = c->inner_dim;
    char p[64];
    b->context_pre_only = (i == c->num_layers - 1);
    b->dual_attention = c->dual_attention[i];
    CDF_TRY(cdf_linear_load(w, &b->norm1, d, (b->dual_attention ? 9 : 6) * d, 1, "transformer_blocks.%d.norm1.linear", i));
    CDF_TRY(cdf_linear_load(w, &b->norm1_context, d, (b->context_pre_only ? 2 : 6) * d, 1,
                            "transformer_blocks.%d.norm1_context.linear", i));
    snprintf(p, sizeof p, "transformer_blocks.%d.attn", i);
    CDF_TRY(load_attention(w, tp, c, &b->attn, true, !b->context_pre_only, p));
    if (b->dual_attention) {
        snprintf(p, sizeof p, "transformer_blocks.%d.attn2", i);
        CDF_TRY(load_attention(w, tp, c, &b->attn2, false, false, p));
    }
    /* FeedForward(dim, dim_out=dim, activation_fn="gelu-approximate"): inner 4 * dim */
    CDF_TRY(cdf_tp_linear_load(w, tp, &b->ff_proj, d, 4 * d, 1, "transformer_blocks.%d.ff.net.0.proj", i));
    CDF_TRY(cdf_tp_linear_load(w, tp, &b->ff_out, 4 * d, d, 1, "transformer_blocks.%d.ff.net.2", i));
    if (!b->context_pre_only) {
        CDF_TRY(cdf_tp_linear_load(w, tp, &b->ffc_proj, d, 4 * d, 1, "transformer_blocks.%d.ff_context.net.0.proj", i));
        CDF_TRY(cdf_tp_linear_load(w, tp, &b->ffc_out, 4 * d, d, 1, "transformer_blocks.%d.ff_context.net.2", i));
    }
    return CDF_OK;
}

static void free_block(sd3_block *b) {
    cdf_linear_layer *ls[] = {&b->norm1, &b->norm1_context, &b->ff_proj, &b->ff_out, &b->ffc_proj, &b->ffc_out};
    for (size_t i = 0; i < sizeof ls / sizeof *ls; i++) cdf_linear_free(ls[i]);
    free_attention(&b->attn);
    free_attention(&b->attn2);
}

static void sd3_free(void *impl) {
    sd3_model *m = impl;
    if (!m) return;
    cdf_conv_free(&m->patch_proj);
    cdf_tensor_release(m->pos_table);
    cdf_linear_layer *ls[] = {&m->t_lin1, &m->t_lin2, &m->p_lin1, &m->p_lin2, &m->context_embedder, &m->norm_out, &m->proj_out};
    for (size_t i = 0; i < sizeof ls / sizeof *ls; i++) cdf_linear_free(ls[i]);
    if (m->blocks)
        for (int64_t i = 0; i < m->cfg.num_layers; i++) free_block(&m->blocks[i]);
    free(m->blocks);
    free(m->cfg.dual_attention);
    cdf_tp_free(m->tp);
    free(m);
}

static cdf_status load_all(cdf_weights *w, void *model) {
    sd3_model *m = model;
    const sd3_config *c = &m->cfg;
    const int64_t d = c->inner_dim, pp = c->patch_size;
    CDF_TRY(cdf_conv_load(w, &m->patch_proj, c->in_channels, d, (int)pp, (int)pp, 0, 1, "pos_embed.proj"));
    /* a stored (persistent) buffer in SD3 checkpoints: read it, never recompute the sincos table */
    const int64_t pos_shape[3] = {1, c->pos_embed_max_size * c->pos_embed_max_size, d};
    if (!(m->pos_table = cdf_weights_get(w, 3, pos_shape, "pos_embed.pos_embed"))) return cdf_last_status();
    /* CombinedTimestepTextProjEmbeddings: Timesteps(256) -> TimestepEmbedding(256, D) */
    CDF_TRY(cdf_linear_load(w, &m->t_lin1, 256, d, 1, "time_text_embed.timestep_embedder.linear_1"));
    CDF_TRY(cdf_linear_load(w, &m->t_lin2, d, d, 1, "time_text_embed.timestep_embedder.linear_2"));
    CDF_TRY(cdf_linear_load(w, &m->p_lin1, c->pooled_projection_dim, d, 1, "time_text_embed.text_embedder.linear_1"));
    CDF_TRY(cdf_linear_load(w, &m->p_lin2, d, d, 1, "time_text_embed.text_embedder.linear_2"));
    CDF_TRY(cdf_linear_load(w, &m->context_embedder, c->joint_attention_dim, c->caption_projection_dim, 1, "context_embedder"));
    m->blocks = calloc((size_t)c->num_layers, sizeof *m->blocks);
    if (!m->blocks) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory for %lld blocks", (long long)c->num_layers);
    for (int i = 0; i < (int)c->num_layers; i++) CDF_TRY(load_block(w, m->tp, c, i, &m->blocks[i]));
    CDF_TRY(cdf_linear_load(w, &m->norm_out, d, 2 * d, 1, "norm_out.linear"));
    CDF_TRY(cdf_linear_load(w, &m->proj_out, d, pp * pp * c->out_channels, 1, "proj_out"));
    return CDF_OK;
}

static cdf_status sd3_load(const char *dir, const cJSON *cfg, const cdf_load_options *opt, void **impl) {
    sd3_model *m = calloc(1, sizeof *m);
    if (!m) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    cdf_status s = parse_config(cfg, &m->cfg);
    if (s != CDF_OK) {
        free(m);
        return s;
    }
    /* sharded when tensor parallelism is on: heads (and so the 4D feed-forward) must divide */
    s = cdf_tp_for_component(dir, SD3_NAME, SD3_TP_PLAN, &m->tp);
    if (s == CDF_OK) s = cdf_tp_check_divisible(m->tp, "num_attention_heads", m->cfg.num_heads);
    if (s == CDF_OK) s = cdf_model_load_weights(dir, opt, load_all, m, NULL, NULL);
    if (s != CDF_OK) {
        sd3_free(m);
        return s;
    }
    *impl = m;
    return CDF_OK;
}

/* ---- forward pieces --------------------------------------------------------------------------- */

/* x * (1 + scale[:, None]) + shift[:, None]; x [B, L, D], shift/scale [B, D] */
static cdf_tensor *modulate(cdf_tensor *x, cdf_tensor *shift, cdf_tensor *scale) {
    return cdf_add(cdf_mul(x, cdf_unsqueeze(cdf_add_scalar(scale, 1.0f), 1)), cdf_unsqueeze(shift, 1));
}

/* x + gate[:, None] * y */
static cdf_tensor *gated_residual(cdf_tensor *x, cdf_tensor *gate, cdf_tensor *y) {
    return cdf_add(x, cdf_mul(cdf_unsqueeze(gate, 1), y));
}

/* nn.LayerNorm(D, elementwise_affine=False, eps=1e-6) used by every norm in the model */
static cdf_tensor *plain_layer_norm(cdf_tensor *x) { return cdf_layer_norm(x, NULL, NULL, 1e-6f); }

/* linear(silu(temb)) split into n chunks [B, D] (views), in diffusers' chunk order */
static cdf_status ada_chunks(const cdf_linear_layer *l, cdf_tensor *temb, int n, cdf_tensor **out) {
    cdf_tensor *emb = cdf_linear_fwd(l, cdf_silu(temb)); /* [B, n*D] */
    if (!emb) return cdf_last_status();
    return cdf_chunk(emb, n, 1, out);
}

/* FeedForward with GELU(approximate="tanh"): net.2(gelu(net.0.proj(x))) */
static cdf_tensor *feed_forward(const cdf_linear_layer *proj, const cdf_linear_layer *out, cdf_tensor *x) {
    return cdf_linear_fwd(out, cdf_gelu(cdf_linear_fwd(proj, cdf_linear_shared_input(x, 1, &proj)), CDF_GELU_TANH));
}

/* projection -> [B, L, H, Dh], then the per-head RMSNorm(eps 1e-6) when configured, which writes
 * its result in dt, the dtype attention computes in (computed in f32 and rounded once: the values
 * a cast would give, without the cast's pass) */
static cdf_tensor *project_heads(const cdf_linear_layer *l, cdf_tensor *x, cdf_tensor *norm_w, const sd3_config *c,
                                 cdf_dtype dt) {
    cdf_tensor *y = cdf_linear_fwd(l, x);
    if (!y) return NULL;
    /* -1: this rank's heads (all of them unless the projection is a column-wise shard) */
    const int64_t shape[4] = {cdf_tensor_dim(y, 0), cdf_tensor_dim(y, 1), -1, c->head_dim};
    y = cdf_reshape(y, 4, shape);
    return norm_w ? cdf_rms_norm_as(y, norm_w, 1e-6f, dt) : y;
}

/* softmax(QK^T / sqrt(Dh)) V over [B, L, H, Dh] inputs; returns [B, L, H*Dh] f32, or in dt when
 * every layer in outs (n_outs) rounds its input to dt anyway (the same values, half the bytes).
 * dt: the dtype attention computes in (bf16 where the projections run the bf16 policy: q, k, v
 * are cast to it, and the attention runs the bf16 attention policy, kernels/dispatch.h; f32: as
 * they are). */
static cdf_tensor *attention_core(cdf_tensor *q, cdf_tensor *k, cdf_tensor *v, cdf_dtype dt, int n_outs,
                                  const cdf_linear_layer *const *outs) {
    cdf_tensor *o = cdf_sdpa(cdf_cast(cdf_transpose(q, 1, 2), dt), cdf_cast(cdf_transpose(k, 1, 2), dt),
                             cdf_cast(cdf_transpose(v, 1, 2), dt), NULL, 0.0f);
    o = cdf_transpose(o, 1, 2); /* [B, L, H, Dh] */
    if (!o) return NULL;
    /* the copy the reshape below would make */
    o = cdf_tensor_dtype(o) == CDF_F32 || cdf_linears_round_input(n_outs, outs) ? cdf_contiguous(o) : cdf_cast(o, CDF_F32);
    const int64_t shape[3] = {cdf_tensor_dim(o, 0), cdf_tensor_dim(o, 1), -1};
    return cdf_reshape(o, 3, shape);
}

/* JointAttnProcessor2_0 with a context stream: attention over [x; ctx], split back at N.
 * *ctx_out is NULL for a context_pre_only block (to_add_out does not exist there). */
static cdf_status joint_attention(const sd3_attention *a, const sd3_config *c, cdf_tensor *x, cdf_tensor *ctx,
                                  cdf_tensor **x_out, cdf_tensor **ctx_out) {
    const int64_t n = cdf_tensor_dim(x, 1), t = cdf_tensor_dim(ctx, 1);
    const cdf_dtype dt = cdf_linear_compute_dtype(&a->to_q);
    const cdf_linear_layer *xl[] = {&a->to_q, &a->to_k, &a->to_v}, *cl[] = {&a->add_q, &a->add_k, &a->add_v};
    x = cdf_linear_shared_input(x, 3, xl);
    ctx = cdf_linear_shared_input(ctx, 3, cl);
    cdf_tensor *q[2] = {project_heads(&a->to_q, x, a->norm_q, c, dt), project_heads(&a->add_q, ctx, a->norm_added_q, c, dt)};
    cdf_tensor *k[2] = {project_heads(&a->to_k, x, a->norm_k, c, dt), project_heads(&a->add_k, ctx, a->norm_added_k, c, dt)};
    cdf_tensor *v[2] = {project_heads(&a->to_v, x, NULL, c, dt), project_heads(&a->add_v, ctx, NULL, c, dt)};
    cdf_tensor *o = NULL;
    if (q[0] && q[1] && k[0] && k[1] && v[0] && v[1])
        o = attention_core(cdf_cat(q, 2, 1), cdf_cat(k, 2, 1), cdf_cat(v, 2, 1), dt, a->to_add_out.w ? 2 : 1,
                           (const cdf_linear_layer *[]){&a->to_out, &a->to_add_out}); /* [B, N+T, D] */
    *x_out = cdf_linear_fwd(&a->to_out, cdf_narrow(o, 1, 0, n));
    *ctx_out = a->to_add_out.w ? cdf_linear_fwd(&a->to_add_out, cdf_narrow(o, 1, n, t)) : NULL;
    if (!*x_out || (a->to_add_out.w && !*ctx_out)) return cdf_last_status() ? cdf_last_status() : CDF_ERR_INTERNAL;
    return CDF_OK;
}

/* JointAttnProcessor2_0 without a context (attn2): plain self-attention of the image tokens */
static cdf_tensor *self_attention(const sd3_attention *a, const sd3_config *c, cdf_tensor *x) {
    const cdf_dtype dt = cdf_linear_compute_dtype(&a->to_q);
    const cdf_linear_layer *xl[] = {&a->to_q, &a->to_k, &a->to_v};
    x = cdf_linear_shared_input(x, 3, xl);
    cdf_tensor *q = project_heads(&a->to_q, x, a->norm_q, c, dt);
    cdf_tensor *k = project_heads(&a->to_k, x, a->norm_k, c, dt);
    cdf_tensor *v = project_heads(&a->to_v, x, NULL, c, dt);
    return cdf_linear_fwd(&a->to_out, attention_core(q, k, v, dt, 1, (const cdf_linear_layer *[]){&a->to_out}));
}

/* JointTransformerBlock.forward. x [B, N, D], ctx [B, T, D], temb [B, D].
 * Replaces *x and *ctx with new references (the caller's scope owns them); *ctx becomes NULL
 * after the context_pre_only block. */
static cdf_status joint_block(const sd3_block *b, const sd3_config *c, cdf_tensor **xp, cdf_tensor **ctxp,
                              cdf_tensor *temb) {
    cdf_tensor *x = *xp, *ctx = *ctxp;
    /* norm1: shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp[, shift_msa2, scale_msa2, gate_msa2] */
    cdf_tensor *m[9] = {0};
    CDF_TRY(ada_chunks(&b->norm1, temb, b->dual_attention ? 9 : 6, m));
    cdf_tensor *x_ln = plain_layer_norm(x);
    cdf_tensor *x_norm = modulate(x_ln, m[0], m[1]);
    cdf_tensor *x_norm2 = b->dual_attention ? modulate(x_ln, m[6], m[7]) : NULL;

    /* norm1_context: AdaLayerNormZero (6 chunks) or, for the last block, AdaLayerNormContinuous
     * whose linear output splits as (scale, shift) — the reverse of AdaLayerNormZero's order */
    cdf_tensor *cm[6] = {0}, *ctx_norm;
    if (b->context_pre_only) {
        CDF_TRY(ada_chunks(&b->norm1_context, temb, 2, cm));
        ctx_norm = modulate(plain_layer_norm(ctx), cm[1], cm[0]);
    } else {
        CDF_TRY(ada_chunks(&b->norm1_context, temb, 6, cm));
        ctx_norm = modulate(plain_layer_norm(ctx), cm[0], cm[1]);
    }
    if (!x_norm || !ctx_norm || (b->dual_attention && !x_norm2)) return cdf_last_status();

    cdf_tensor *attn_x, *attn_ctx;
    CDF_TRY(joint_attention(&b->attn, c, x_norm, ctx_norm, &attn_x, &attn_ctx));
    x = gated_residual(x, m[2], attn_x);
    if (b->dual_attention) x = gated_residual(x, m[8], self_attention(&b->attn2, c, x_norm2));
    x = gated_residual(x, m[5], feed_forward(&b->ff_proj, &b->ff_out, modulate(plain_layer_norm(x), m[3], m[4])));

    if (b->context_pre_only) {
        ctx = NULL;
    } else {
        ctx = gated_residual(ctx, cm[2], attn_ctx);
        ctx = gated_residual(ctx, cm[5],
                             feed_forward(&b->ffc_proj, &b->ffc_out, modulate(plain_layer_norm(ctx), cm[3], cm[4])));
        if (!ctx) return cdf_last_status();
    }
    if (!x) return cdf_last_status();
    *xp = x;
    *ctxp = ctx;
    return CDF_OK;
}

/* ---- repeated-block compile: each block call goes through cdf_block_run with its weights ---- */

static int add_attention(cdf_tensor **w, int n, const sd3_attention *a) {
    const cdf_linear_layer *lin[] = {&a->to_q, &a->to_k, &a->to_v, &a->to_out, &a->add_q, &a->add_k, &a->add_v, &a->to_add_out};
    for (size_t k = 0; k < sizeof lin / sizeof *lin; k++) n = cdf_linear_list_weights(w, n, lin[k]);
    cdf_tensor *norms[] = {a->norm_q, a->norm_k, a->norm_added_q, a->norm_added_k};
    for (size_t k = 0; k < sizeof norms / sizeof *norms; k++)
        if (norms[k]) w[n++] = norms[k];
    return n;
}

typedef struct joint_ctx {
    const sd3_block *b;
    const sd3_config *c;
} joint_ctx;

/* inputs x, ctx, temb -> outputs x (and ctx unless context_pre_only) */
static cdf_status joint_block_traced(void *vctx, const cdf_tensor_map *in, cdf_tensor_map *out) {
    const joint_ctx *jc = vctx;
    cdf_tensor *x = cdf_tensor_map_get(in, "x"), *ctx = cdf_tensor_map_get(in, "ctx");
    cdf_status s = joint_block(jc->b, jc->c, &x, &ctx, cdf_tensor_map_get(in, "temb"));
    if (s == CDF_OK) s = cdf_tensor_map_set(out, "x", x);
    if (s == CDF_OK && ctx) s = cdf_tensor_map_set(out, "ctx", ctx);
    return s;
}

/* joint_block through the repeated-block compiler: same contract as joint_block (results are
 * recorded in the caller's scope). */
static cdf_status run_joint_block(const sd3_block *b, const sd3_config *c, cdf_tensor **xp, cdf_tensor **ctxp, cdf_tensor *temb) {
    cdf_tensor *w[CDF_BLOCK_MAX_WEIGHTS];
    int nw = 0;
    const cdf_linear_layer *lin[] = {&b->norm1, &b->norm1_context, &b->ff_proj, &b->ff_out, &b->ffc_proj, &b->ffc_out};
    for (size_t k = 0; k < sizeof lin / sizeof *lin; k++) nw = cdf_linear_list_weights(w, nw, lin[k]);
    nw = add_attention(w, nw, &b->attn);
    if (b->dual_attention) nw = add_attention(w, nw, &b->attn2);
    joint_ctx jc = {b, c};
    cdf_tensor_map in, out;
    cdf_tensor_map_init(&in);
    cdf_tensor_map_init(&out);
    cdf_status s = cdf_tensor_map_set(&in, "x", *xp);
    if (s == CDF_OK) s = cdf_tensor_map_set(&in, "ctx", *ctxp);
    if (s == CDF_OK) s = cdf_tensor_map_set(&in, "temb", temb);
    const char *cls = b->context_pre_only ? "JointTransformerBlock[context_pre_only]"
                      : b->dual_attention ? "JointTransformerBlock[dual_attention]" : "JointTransformerBlock";
    if (s == CDF_OK) s = cdf_block_run(cls, joint_block_traced, &jc, &in, &out, w, nw);
    if (s == CDF_OK) {
        *xp = cdf_tensor_retain(cdf_tensor_map_get(&out, "x"));
        cdf_scope_record(*xp);
        cdf_tensor *nc = cdf_tensor_map_get(&out, "ctx");
        *ctxp = nc ? cdf_tensor_retain(nc) : NULL;
        if (nc) cdf_scope_record(*ctxp);
    }
    cdf_tensor_map_clear(&in);
    cdf_tensor_map_clear(&out);
    return s;
}

/* PatchEmbed: conv p x p / stride p, flatten to tokens, + centre crop of the position table.
 * hidden [B, C, H, W] -> [B, h*w, D] with h = H/p, w = W/p. */
static cdf_tensor *patch_embed(const sd3_model *m, cdf_tensor *hidden, int64_t h, int64_t w) {
    const sd3_config *c = &m->cfg;
    const int64_t M = c->pos_embed_max_size, d = c->inner_dim;
    cdf_tensor *y = cdf_conv_fwd(&m->patch_proj, hidden); /* [B, D, h, w] */
    const int64_t flat[3] = {cdf_tensor_dim(hidden, 0), d, h * w};
    y = cdf_transpose(cdf_reshape(y, 3, flat), 1, 2); /* [B, h*w, D] */
    /* cropped_pos_embed: rows top..top+h, cols left..left+w of the M x M grid */
    const int64_t top = (M - h) / 2, left = (M - w) / 2;
    const int64_t grid[3] = {M, M, d}, crop[3] = {1, h * w, d};
    cdf_tensor *pos = cdf_reshape(cdf_narrow(cdf_narrow(cdf_reshape(m->pos_table, 3, grid), 0, top, h), 1, left, w), 3, crop);
    return cdf_add(y, pos);
}

/* CombinedTimestepTextProjEmbeddings: temb [B, D] */
static cdf_tensor *time_text_embed(const sd3_model *m, cdf_tensor *timestep, cdf_tensor *pooled) {
    const int64_t n[1] = {cdf_tensor_numel(timestep)};
    cdf_tensor *t = cdf_reshape(cdf_cast(timestep, CDF_F32), 1, n);
    /* Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=0) on the raw 0..1000 value */
    cdf_tensor *t_proj = cdf_timestep_embedding(t, 256, true, 0.0f, 1.0f, 10000.0f);
    cdf_tensor *t_emb = cdf_linear_fwd(&m->t_lin2, cdf_silu(cdf_linear_fwd(&m->t_lin1, t_proj)));
    /* PixArtAlphaTextProjection(act_fn="silu") */
    cdf_tensor *p_emb = cdf_linear_fwd(&m->p_lin2, cdf_silu(cdf_linear_fwd(&m->p_lin1, pooled)));
    return cdf_add(t_emb, p_emb);
}

/* ---- run ------------------------------------------------------------------------------------- */

static cdf_status check_inputs(const sd3_config *c, cdf_tensor *hs, cdf_tensor *ehs, cdf_tensor *pooled, cdf_tensor *ts) {
    char d0[96], d1[96], d2[96];
    if (cdf_tensor_ndim(hs) != 4 || cdf_tensor_dim(hs, 1) != c->in_channels || cdf_tensor_dim(hs, 0) < 1)
        return cdf_error(CDF_ERR_SHAPE, SD3_NAME ": hidden_states %s must be [B, %lld, H, W] (NCHW latents)",
                         cdf_tensor_describe(hs, d0, sizeof d0), (long long)c->in_channels);
    const int64_t B = cdf_tensor_dim(hs, 0), H = cdf_tensor_dim(hs, 2), W = cdf_tensor_dim(hs, 3), p = c->patch_size;
    /* diffusers' conv would drop a remainder row/column and return a smaller output; report it */
    if (H % p || W % p || H == 0 || W == 0)
        return cdf_error(CDF_ERR_SHAPE, SD3_NAME ": hidden_states %s: height and width must be positive multiples of "
                                        "patch_size %lld",
                         cdf_tensor_describe(hs, d0, sizeof d0), (long long)p);
    if (H / p > c->pos_embed_max_size)
        return cdf_error(CDF_ERR_SHAPE, SD3_NAME ": Height (%lld) cannot be greater than `pos_embed_max_size`: %lld "
                                        "(latent height %lld / patch_size %lld)",
                         (long long)(H / p), (long long)c->pos_embed_max_size, (long long)H, (long long)p);
    if (W / p > c->pos_embed_max_size)
        return cdf_error(CDF_ERR_SHAPE, SD3_NAME ": Width (%lld) cannot be greater than `pos_embed_max_size`: %lld "
                                        "(latent width %lld / patch_size %lld)",
                         (long long)(W / p), (long long)c->pos_embed_max_size, (long long)W, (long long)p);
    if (cdf_tensor_ndim(ehs) != 3 || cdf_tensor_dim(ehs, 0) != B || cdf_tensor_dim(ehs, 2) != c->joint_attention_dim ||
        cdf_tensor_dim(ehs, 1) < 1)
        return cdf_error(CDF_ERR_SHAPE, SD3_NAME ": encoder_hidden_states %s must be [%lld, T, %lld] (hidden_states %s)",
                         cdf_tensor_describe(ehs, d1, sizeof d1), (long long)B, (long long)c->joint_attention_dim,
                         cdf_tensor_describe(hs, d0, sizeof d0));
    if (cdf_tensor_ndim(pooled) != 2 || cdf_tensor_dim(pooled, 0) != B ||
        cdf_tensor_dim(pooled, 1) != c->pooled_projection_dim)
        return cdf_error(CDF_ERR_SHAPE, SD3_NAME ": pooled_projections %s must be [%lld, %lld]",
                         cdf_tensor_describe(pooled, d1, sizeof d1), (long long)B, (long long)c->pooled_projection_dim);
    const int64_t nt = cdf_tensor_numel(ts);
    if (cdf_tensor_ndim(ts) > 1 || (nt != B && nt != 1))
        return cdf_error(CDF_ERR_SHAPE, SD3_NAME ": timestep %s must be [%lld], [1] or a scalar",
                         cdf_tensor_describe(ts, d2, sizeof d2), (long long)B);
    return CDF_OK;
}

static cdf_status sd3_run(void *impl, const char *method, const cdf_tensor_map *in, cdf_tensor_map *out) {
    const sd3_model *m = impl;
    const sd3_config *c = &m->cfg;
    if (method && strcmp(method, "forward") != 0)
        return cdf_error(CDF_ERR_UNSUPPORTED, SD3_NAME ": method '%s' does not exist (only 'forward')", method);
    cdf_tensor *hs, *ehs, *pooled, *ts; /* the first missing one is reported */
    if (!(hs = cdf_input(in, "hidden_states", SD3_NAME)) || !(ehs = cdf_input(in, "encoder_hidden_states", SD3_NAME)) ||
        !(pooled = cdf_input(in, "pooled_projections", SD3_NAME)) || !(ts = cdf_input(in, "timestep", SD3_NAME)))
        return cdf_last_status();
    CDF_TRY(check_inputs(c, hs, ehs, pooled, ts));
    const int64_t B = cdf_tensor_dim(hs, 0), p = c->patch_size;
    const int64_t h = cdf_tensor_dim(hs, 2) / p, w = cdf_tensor_dim(hs, 3) / p;
    /* activations are f32 whatever dtype the caller's inputs have */
    hs = cdf_cast(hs, CDF_F32);
    ehs = cdf_cast(ehs, CDF_F32);
    pooled = cdf_cast(pooled, CDF_F32);

    cdf_tensor *x = patch_embed(m, hs, h, w);          /* [B, N, D] */
    cdf_tensor *temb = time_text_embed(m, ts, pooled);  /* [B, D] */
    cdf_tensor *ctx = cdf_linear_fwd(&m->context_embedder, ehs); /* [B, T, D] */
    if (!x || !temb || !ctx) return cdf_last_status();

    /* The running x / ctx are held by our own references rather than by a scope, so each
     * block's inputs are released as soon as its outputs exist (a scope would keep every
     * block's outputs alive until the end of the forward). */
    x = cdf_tensor_retain(x);
    ctx = cdf_tensor_retain(ctx);
    for (int64_t i = 0; i < c->num_layers; i++) {
        cdf_scope_push(); /* the block's intermediates */
        cdf_tensor *nx = x, *nctx = ctx;
        cdf_status s = run_joint_block(&m->blocks[i], c, &nx, &nctx, temb);
        if (s == CDF_OK) {
            cdf_tensor_retain(nx);
            cdf_tensor_retain(nctx); /* NULL after the context_pre_only block */
        }
        cdf_scope_pop(NULL, 0);
        cdf_tensor_release(x);
        cdf_tensor_release(ctx);
        if (s != CDF_OK) return cdf_error_prefix(SD3_NAME " transformer_blocks.%lld: ", (long long)i);
        x = nx;
        ctx = nctx;
    }
    cdf_tensor_release(ctx); /* NULL: the last (context_pre_only) block drops the context stream */
    cdf_tensor *x_blocks = x;

    /* norm_out: AdaLayerNormContinuous, linear output split as (scale, shift) */
    cdf_tensor *ss[2] = {0};
    cdf_status s = ada_chunks(&m->norm_out, temb, 2, ss);
    x = s == CDF_OK ? cdf_linear_fwd(&m->proj_out, modulate(plain_layer_norm(x_blocks), ss[1], ss[0])) : NULL;
    cdf_tensor_release(x_blocks); /* what follows holds its own references */
    if (!x) return cdf_last_status(); /* [B, N, p*p*C] */

    /* unpatchify: [B, h, w, p, q, C] -> einsum nhwpqc->nchpwq -> [B, C, h*p, w*p] */
    const int64_t C = c->out_channels;
    const int64_t six[6] = {B, h, w, p, p, C}, nchw[4] = {B, C, h * p, w * p};
    const int perm[6] = {0, 5, 1, 3, 2, 4};
    cdf_tensor *sample = cdf_reshape(cdf_contiguous(cdf_permute(cdf_reshape(x, 6, six), perm)), 4, nchw);
    if (!sample) return cdf_last_status();
    return cdf_tensor_map_set(out, "out.sample", sample);
}

const cdf_component_class cdf_sd3_transformer_class = {
    .names = (const char *const[]){SD3_NAME, NULL},
    .load = sd3_load,
    .free = sd3_free,
    .run = sd3_run,
};
