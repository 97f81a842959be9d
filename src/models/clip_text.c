/* CLIP text tower: transformers CLIPTextModel / CLIPTextModelWithProjection (CLIPTextTransformer).
 *
 *   x = token_embedding[ids] + position_embedding[0:S]                      [B, S, hidden]
 *   per layer:  x += out_proj(attention(layer_norm1(x), causal mask))
 *               x += fc2(act(fc1(layer_norm2(x))))
 *   last_hidden_state = final_layer_norm(x)
 *   pooler_output     = last_hidden_state[b, eos position of row b]          [B, hidden]
 *   text_embeds       = pooler_output @ text_projection^T (WithProjection)   [B, projection_dim]
 *
 * hidden_states (transformers, output_hidden_states=True) = (embeddings, output of layer 1, ...,
 * output of layer L); SD3 uses hidden_states[-2] (no final norm). Only the causal mask is
 * applied: the FLUX and SD3 pipelines do not pass the tokenizer's attention mask. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "models/component.h"
#include "models/text_encoders.h"
#include "io/json.h"

typedef cdf_act clip_act;

typedef struct clip_layer {
    cdf_norm_layer layer_norm1, layer_norm2;
    cdf_linear_layer q_proj, k_proj, v_proj, out_proj; /* all with bias */
    cdf_linear_layer fc1, fc2;
} clip_layer;

struct cdf_clip_text {
    /* config.json */
    int64_t hidden_size, num_heads, head_dim, num_layers, intermediate_size, vocab_size, max_positions;
    int64_t projection_dim; /* 0 = no text_projection (CLIPTextModel) */
    int64_t eos_token_id;
    float layer_norm_eps;
    clip_act act;
    /* weights */
    cdf_tensor *token_embedding;    /* [vocab, hidden] */
    cdf_tensor *position_embedding; /* [max_positions, hidden] f32 */
    clip_layer *layers;             /* [num_layers] */
    cdf_norm_layer final_layer_norm;
    cdf_tensor *text_projection; /* [projection_dim, hidden] or NULL */
    /* tensor parallelism: NULL when whole; else this rank holds local_heads of num_heads */
    cdf_tp *tp;
    int64_t local_heads;
};

/* Tensor-parallel plan (the transformers-style Megatron split): q/k/v column-wise (heads split
 * over the ranks), out_proj row-wise; fc1 column-wise, fc2 row-wise. Embeddings, layer norms and
 * text_projection are replicated. Two all-reduces per layer. */
static const cdf_tp_rule CLIP_TP_PLAN[] = {
    {"text_model.encoder.layers.*.self_attn.q_proj", CDF_TP_COLWISE},
    {"text_model.encoder.layers.*.self_attn.k_proj", CDF_TP_COLWISE},
    {"text_model.encoder.layers.*.self_attn.v_proj", CDF_TP_COLWISE},
    {"text_model.encoder.layers.*.self_attn.out_proj", CDF_TP_ROWWISE},
    {"text_model.encoder.layers.*.mlp.fc1", CDF_TP_COLWISE},
    {"text_model.encoder.layers.*.mlp.fc2", CDF_TP_ROWWISE},
    {NULL, CDF_TP_REPLICATE},
};

/* ---- config ------------------------------------------------------------------------------- */
static cdf_status parse_act(const char *name, clip_act *out) {
    return cdf_act_parse(name, true, "hidden_act", "quick_gelu, gelu, gelu_new, gelu_pytorch_tanh, relu, silu", out);
}

/* A positive integer hyperparameter, bounded so that products of a few of them cannot overflow. */
static cdf_status get_dim(const cJSON *cfg, const char *key, int64_t def, int64_t *out) {
    return cdf_config_get_dim(cfg, key, def, 1 << 24, out);
}

static cdf_status parse_config(const cJSON *cfg, cdf_clip_text *m) {
    /* defaults: transformers CLIPTextConfig */
    CDF_TRY(get_dim(cfg, "vocab_size", 49408, &m->vocab_size));
    CDF_TRY(get_dim(cfg, "hidden_size", 512, &m->hidden_size));
    CDF_TRY(get_dim(cfg, "intermediate_size", 2048, &m->intermediate_size));
    CDF_TRY(get_dim(cfg, "num_hidden_layers", 12, &m->num_layers));
    CDF_TRY(get_dim(cfg, "num_attention_heads", 8, &m->num_heads));
    CDF_TRY(get_dim(cfg, "max_position_embeddings", 77, &m->max_positions));
    int64_t projection_dim;
    CDF_TRY(get_dim(cfg, "projection_dim", 512, &projection_dim));
    CDF_TRY(cdf_json_get_int(cfg, "eos_token_id", 49407, &m->eos_token_id));
    double eps;
    CDF_TRY(cdf_json_get_double(cfg, "layer_norm_eps", 1e-5, &eps));
    if (!(eps > 0)) return cdf_error(CDF_ERR_FORMAT, "config.json: layer_norm_eps = %g must be > 0", eps);
    m->layer_norm_eps = (float)eps;
    const char *act;
    CDF_TRY(cdf_json_get_string(cfg, "hidden_act", "quick_gelu", &act));
    CDF_TRY(parse_act(act, &m->act));
    if (m->hidden_size % m->num_heads)
        return cdf_error(CDF_ERR_FORMAT, "config.json: hidden_size %lld is not divisible by num_attention_heads %lld",
                         (long long)m->hidden_size, (long long)m->num_heads);
    m->head_dim = m->hidden_size / m->num_heads;
    /* Only the WithProjection class has the text_projection module; a plain CLIPTextModel ignores
     * the tensor even if a checkpoint carries it. */
    const char *cls = cdf_config_class_name(cfg);
    m->projection_dim = (cls && strcmp(cls, "CLIPTextModelWithProjection") == 0) ? projection_dim : 0;
    return CDF_OK;
}

/* ---- load / free ---------------------------------------------------------------------------- */
static void clip_free(void *impl) {
    cdf_clip_text *m = impl;
    if (!m) return;
    cdf_tensor_release(m->token_embedding);
    cdf_tensor_release(m->position_embedding);
    if (m->layers) {
        for (int64_t i = 0; i < m->num_layers; i++) {
            clip_layer *l = &m->layers[i];
            cdf_norm_free(&l->layer_norm1);
            cdf_norm_free(&l->layer_norm2);
            cdf_linear_free(&l->q_proj);
            cdf_linear_free(&l->k_proj);
            cdf_linear_free(&l->v_proj);
            cdf_linear_free(&l->out_proj);
            cdf_linear_free(&l->fc1);
            cdf_linear_free(&l->fc2);
        }
        free(m->layers);
    }
    cdf_norm_free(&m->final_layer_norm);
    cdf_tensor_release(m->text_projection);
    cdf_tp_free(m->tp);
    free(m);
}

static cdf_status load_weights(cdf_weights *w, void *model) {
    cdf_clip_text *m = model;
    const int64_t H = m->hidden_size, I = m->intermediate_size;
    const float eps = m->layer_norm_eps;
    m->token_embedding = cdf_weights_get(w, 2, (int64_t[]){m->vocab_size, H}, "text_model.embeddings.token_embedding.weight");
    if (!m->token_embedding) return cdf_last_status();
    /* small table, added to f32 activations: keep it f32 whatever the weight policy */
    m->position_embedding =
        cdf_weights_get_f32(w, 2, (int64_t[]){m->max_positions, H}, "text_model.embeddings.position_embedding.weight");
    if (!m->position_embedding) return cdf_last_status();
    m->layers = calloc((size_t)m->num_layers, sizeof *m->layers);
    if (!m->layers) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (%lld CLIP layers)", (long long)m->num_layers);
    for (int64_t i = 0; i < m->num_layers; i++) {
        clip_layer *l = &m->layers[i];
        const char *p = "text_model.encoder.layers";
        long long li = (long long)i;
        CDF_TRY(cdf_norm_load(w, &l->layer_norm1, H, 1, 1, eps, "%s.%lld.layer_norm1", p, li));
        CDF_TRY(cdf_tp_linear_load(w, m->tp, &l->q_proj, H, H, 1, "%s.%lld.self_attn.q_proj", p, li));
        CDF_TRY(cdf_tp_linear_load(w, m->tp, &l->k_proj, H, H, 1, "%s.%lld.self_attn.k_proj", p, li));
        CDF_TRY(cdf_tp_linear_load(w, m->tp, &l->v_proj, H, H, 1, "%s.%lld.self_attn.v_proj", p, li));
        CDF_TRY(cdf_tp_linear_load(w, m->tp, &l->out_proj, H, H, 1, "%s.%lld.self_attn.out_proj", p, li));
        CDF_TRY(cdf_norm_load(w, &l->layer_norm2, H, 1, 1, eps, "%s.%lld.layer_norm2", p, li));
        CDF_TRY(cdf_tp_linear_load(w, m->tp, &l->fc1, H, I, 1, "%s.%lld.mlp.fc1", p, li));
        CDF_TRY(cdf_tp_linear_load(w, m->tp, &l->fc2, I, H, 1, "%s.%lld.mlp.fc2", p, li));
    }
    CDF_TRY(cdf_norm_load(w, &m->final_layer_norm, H, 1, 1, eps, "text_model.final_layer_norm"));
    if (m->projection_dim > 0) {
        m->text_projection = cdf_weights_get(w, 2, (int64_t[]){m->projection_dim, H}, "text_projection.weight");
        if (!m->text_projection) return cdf_last_status();
    }
    return CDF_OK;
}

static cdf_status clip_load(const char *dir, const cJSON *cfg, const cdf_load_options *opt, void **impl) {
    *impl = NULL;
    cdf_clip_text *m = calloc(1, sizeof *m);
    if (!m) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    cdf_status s = parse_config(cfg, m);
    if (s != CDF_OK) {
        clip_free(m);
        return s;
    }
    /* sharded when tensor parallelism is on: heads and the MLP width must divide */
    s = cdf_tp_for_component(dir, cdf_config_class_name(cfg), CLIP_TP_PLAN, &m->tp);
    if (s == CDF_OK) s = cdf_tp_check_divisible(m->tp, "num_attention_heads", m->num_heads);
    if (s == CDF_OK) s = cdf_tp_check_divisible(m->tp, "intermediate_size", m->intermediate_size);
    m->local_heads = m->num_heads / cdf_tp_size(m->tp);
    if (s == CDF_OK) s = cdf_model_load_weights(dir, opt, load_weights, m, NULL, m->tp);
    if (s != CDF_OK) {
        clip_free(m);
        return s;
    }
    *impl = m;
    return CDF_OK;
}

cdf_status cdf_clip_text_load(const char *dir, const cdf_load_options *opt, cdf_clip_text **out) {
    if (!out) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_clip_text_load: out is NULL");
    void *impl;
    cdf_status s = cdf_component_load_impl(clip_load, "cdf_clip_text_load", "CLIP text model", dir, opt, &impl);
    *out = impl;
    return s;
}

void cdf_clip_text_free(cdf_clip_text *m) { clip_free(m); }
int64_t cdf_clip_text_hidden_size(const cdf_clip_text *m) { return m ? m->hidden_size : 0; }
int64_t cdf_clip_text_num_layers(const cdf_clip_text *m) { return m ? m->num_layers : 0; }
int64_t cdf_clip_text_max_positions(const cdf_clip_text *m) { return m ? m->max_positions : 0; }
int64_t cdf_clip_text_projection_dim(const cdf_clip_text *m) { return m ? m->projection_dim : 0; }

/* ---- forward ---------------------------------------------------------------------------------- */
/* [B, S, heads * head_dim] -> [B, heads, S, head_dim] (a view); this rank's heads */
static cdf_tensor *split_heads(const cdf_clip_text *m, cdf_tensor *x, int64_t B, int64_t S) {
    return cdf_transpose(cdf_reshape(x, 4, (int64_t[]){B, S, m->local_heads, m->head_dim}), 1, 2);
}

static cdf_tensor *layer_forward(const cdf_clip_text *m, const clip_layer *l, cdf_tensor *x, cdf_tensor *causal_mask,
                                 int64_t B, int64_t S) {
    /* self-attention: scores * head_dim^-0.5 + causal mask, softmax, @ v */
    cdf_tensor *h = cdf_layer_norm(x, l->layer_norm1.w, l->layer_norm1.b, l->layer_norm1.eps);
    cdf_tensor *q = split_heads(m, cdf_linear_fwd(&l->q_proj, h), B, S); /* [B, heads, S, head_dim] */
    cdf_tensor *k = split_heads(m, cdf_linear_fwd(&l->k_proj, h), B, S);
    cdf_tensor *v = split_heads(m, cdf_linear_fwd(&l->v_proj, h), B, S);
    cdf_tensor *a = cdf_sdpa(q, k, v, causal_mask, 1.0f / sqrtf((float)m->head_dim));
    a = cdf_reshape(cdf_transpose(a, 1, 2), 3, (int64_t[]){B, S, m->local_heads * m->head_dim}); /* [B, S, hidden] */
    x = cdf_add(x, cdf_linear_fwd(&l->out_proj, a));
    /* MLP */
    h = cdf_layer_norm(x, l->layer_norm2.w, l->layer_norm2.b, l->layer_norm2.eps);
    h = cdf_act_fwd(m->act, cdf_linear_fwd(&l->fc1, h)); /* [B, S, intermediate] */
    return cdf_add(x, cdf_linear_fwd(&l->fc2, h));
}

/* [1, 1, S, S]: 0 on and below the diagonal, -inf above (query i sees keys 0..i). */
static cdf_tensor *make_causal_mask(cdf_device *dev, int64_t S) {
    float *mask = malloc((size_t)(S * S) * sizeof *mask);
    if (!mask) {
        cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (causal mask %lld x %lld)", (long long)S, (long long)S);
        return NULL;
    }
    for (int64_t i = 0; i < S; i++)
        for (int64_t j = 0; j < S; j++) mask[i * S + j] = j > i ? -INFINITY : 0.0f;
    cdf_tensor *t = cdf_tensor_from_host(dev, CDF_F32, 4, (int64_t[]){1, 1, S, S}, mask, CDF_F32);
    free(mask);
    return t;
}

/* Checks input_ids' shape and dtype (its values are checked by the embedding lookup on the
 * device: an id outside the vocabulary fails that op, reported at the next sync). */
static cdf_status check_ids(const cdf_clip_text *m, cdf_tensor *input_ids) {
    if (!input_ids) return cdf_error(CDF_ERR_INVALID_ARG, "CLIP text model: input_ids is NULL");
    char d[96];
    cdf_dtype dt = cdf_tensor_dtype(input_ids);
    if (cdf_tensor_ndim(input_ids) != 2 || (dt != CDF_I64 && dt != CDF_I32))
        return cdf_error(CDF_ERR_SHAPE, "CLIP text model: input_ids %s must be [batch, seq] i64 or i32",
                         cdf_tensor_describe(input_ids, d, sizeof d));
    const int64_t B = cdf_tensor_dim(input_ids, 0), S = cdf_tensor_dim(input_ids, 1);
    if (B < 1 || S < 1 || S > m->max_positions || B > (1 << 24) / S)
        return cdf_error(CDF_ERR_SHAPE,
                         "CLIP text model: input_ids %s needs 1 <= seq <= max_position_embeddings %lld and 1 <= batch x seq <= 2^24",
                         cdf_tensor_describe(input_ids, d, sizeof d), (long long)m->max_positions);
    return CDF_OK;
}

/* The row of last_hidden_state viewed as [B * S, hidden] that each prompt pools, as transformers'
 * CLIPTextTransformer picks it, computed on the device (no host read): with the legacy
 * eos_token_id 2, argmax(input_ids) (the first maximum: the eos 49407 is the largest id);
 * otherwise the first position holding eos_token_id (argmax of the 0/1 match; 0 if none).
 * Ids and positions are integers below 2^24 (checked at load), so the f32 steps are exact.
 *                                                                              -> i64 [B] */
static cdf_tensor *pooled_rows(const cdf_clip_text *m, cdf_tensor *input_ids, int64_t B, int64_t S) {
    cdf_tensor *pos;
    if (m->eos_token_id == 2) {
        pos = cdf_argmax(input_ids, 1, false);
    } else {
        cdf_tensor *diff = cdf_add_scalar(cdf_cast(input_ids, CDF_F32), -(float)m->eos_token_id);
        /* 1 where id == eos, else 0: a nonzero integer squared is >= 1 */
        cdf_tensor *match = cdf_affine(cdf_clamp(cdf_mul(diff, diff), 0.0f, 1.0f), -1.0f, 1.0f);
        pos = cdf_argmax(match, 1, false);
    }
    float *base = malloc((size_t)B * sizeof *base);
    if (!base) {
        cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
        return NULL;
    }
    for (int64_t b = 0; b < B; b++) base[b] = (float)(b * S); /* row of prompt b's first token */
    cdf_tensor *start = cdf_tensor_from_host(cdf_tensor_device(input_ids), CDF_F32, 1, (int64_t[]){B}, base, CDF_F32);
    free(base);
    return start && pos ? cdf_cast(cdf_add(cdf_cast(pos, CDF_F32), start), CDF_I64) : NULL;
}

cdf_status cdf_clip_text_encode(cdf_clip_text *m, cdf_tensor *input_ids, int clip_skip, cdf_clip_text_output *out) {
    if (!out) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_clip_text_encode: out is NULL");
    memset(out, 0, sizeof *out);
    if (!m) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_clip_text_encode: model is NULL");
    if (clip_skip < 0 || clip_skip >= m->num_layers)
        return cdf_error(CDF_ERR_INVALID_ARG, "CLIP text model: clip_skip %d is outside 0..%lld (the model has %lld layers)",
                         clip_skip, (long long)m->num_layers - 1, (long long)m->num_layers);
    CDF_TRY(check_ids(m, input_ids));
    const int64_t B = cdf_tensor_dim(input_ids, 0), S = cdf_tensor_dim(input_ids, 1), H = m->hidden_size;
    cdf_device *dev = cdf_tensor_device(m->token_embedding);
    /* hidden_states[-(clip_skip + 2)] of the L + 1 entries is entry L - 1 - clip_skip
     * (entry 0 = embeddings, entry i = output of layer i) */
    const int64_t wanted_entry = m->num_layers - 1 - clip_skip;

    cdf_scope_push();
    cdf_tensor *pool_idx = pooled_rows(m, input_ids, B, S); /* [B] */

    /* embeddings: token + position                                                    [B, S, H] */
    cdf_tensor *x = cdf_cast(cdf_embedding(m->token_embedding, input_ids), CDF_F32);
    x = cdf_add(x, cdf_narrow(m->position_embedding, 0, 0, S));
    cdf_tensor *mask = make_causal_mask(dev, S);
    cdf_tensor *selected = wanted_entry == 0 ? x : NULL;
    for (int64_t i = 0; i < m->num_layers && x && mask; i++) {
        cdf_scope_push();
        x = layer_forward(m, &m->layers[i], x, mask, B, S);
        cdf_scope_pop(&x, 1);
        if (i + 1 == wanted_entry) selected = x;
    }
    cdf_tensor *last = (x && mask) ? cdf_layer_norm(x, m->final_layer_norm.w, m->final_layer_norm.b, m->final_layer_norm.eps)
                                   : NULL;
    /* pooler_output: one row per prompt, gathered with an embedding lookup             [B, H] */
    cdf_tensor *pooled = cdf_embedding(cdf_reshape(last, 2, (int64_t[]){B * S, H}), pool_idx);
    cdf_tensor *embeds = m->text_projection ? cdf_linear(pooled, m->text_projection, NULL) : NULL;
    const bool ok = last && selected && pooled && (!m->text_projection || embeds);
    cdf_tensor *keep[4] = {last, selected, pooled, embeds};
    cdf_status s = ok ? cdf_device_synchronize(dev) : (cdf_last_status() ? cdf_last_status() : CDF_ERR_INTERNAL);
    if (s != CDF_OK) {
        cdf_scope_pop(NULL, 0);
        return s;
    }
    cdf_scope_pop(keep, embeds ? 4 : 3);
    *out = (cdf_clip_text_output){.last_hidden_state = last, .hidden_state = selected, .pooler_output = pooled,
                                  .text_embeds = embeds};
    return CDF_OK;
}

/* ---- component ---------------------------------------------------------------------------------- */
static cdf_status clip_run(void *impl, const char *method, const cdf_tensor_map *in, cdf_tensor_map *out) {
    cdf_clip_text *m = impl;
    if (method && strcmp(method, "forward") != 0)
        return cdf_error(CDF_ERR_UNSUPPORTED, "CLIP text model: method '%s' is not supported (only forward)", method);
    if (cdf_input_opt(in, "attention_mask"))
        return cdf_error(CDF_ERR_UNSUPPORTED,
                         "CLIP text model: a padding attention_mask is not supported (the FLUX/SD3 pipelines pass none)");
    cdf_tensor *ids = cdf_input(in, "input_ids", "CLIP text model");
    if (!ids) return cdf_last_status();
    cdf_clip_text_output o;
    CDF_TRY(cdf_clip_text_encode(m, ids, 0, &o));
    CDF_TRY(cdf_tensor_map_set(out, "out.last_hidden_state", o.last_hidden_state));
    CDF_TRY(cdf_tensor_map_set(out, "out.hidden_states_penultimate", o.hidden_state));
    CDF_TRY(cdf_tensor_map_set(out, "out.pooler_output", o.pooler_output));
    if (o.text_embeds) CDF_TRY(cdf_tensor_map_set(out, "out.text_embeds", o.text_embeds));
    return CDF_OK;
}

const cdf_component_class cdf_clip_text_class = {
    .names = (const char *const[]){"CLIPTextModel", "CLIPTextModelWithProjection", NULL},
    .load = clip_load,
    .free = clip_free,
    .run = clip_run,
};
