/* Mistral language model (transformers MistralModel; the text side of Mistral3ForConditionalGeneration),
 * producing the hidden states FLUX.2 reads (see mistral3_text.h).
 *
 *   x0 = embed_tokens[ids]                                               [B, S, hidden]
 *   per layer:  h = x + o(attn(rms1(x)))
 *               x = h + down(silu(gate(rms2(h))) * up(rms2(h)))           (no biases anywhere)
 *   attn:       q, k, v = rms1(x) @ Wq/Wk/Wv^T   -> [B, heads|kv_heads, S, head_dim]
 *               q, k rotated by RoPE ("default": non-interleaved halves, x*cos + rotate_half(x)*sin)
 *               GQA: query head h reads kv head h / (heads / kv_heads)
 *               softmax(q k^T / sqrt(head_dim) + mask) v,  mask: key j visible from query i iff
 *               j <= i and attention_mask[j] != 0 (and i - j < sliding_window if set)
 *   rms(x) = w * (x * rsqrt(mean(x^2) + eps))
 *   hidden_states[0] = x0, [k] = output of layer k, [L] = final norm(output of layer L).
 * Every value is float32 (weights may be stored bf16: products accumulate in f32). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "models/component.h"
#include "models/mistral3_text.h"
#include "io/json.h"

#define MAX_SEQ 16384  /* the [B, 1, S, S] mask is materialised */
#define MAX_OUT_LAYERS 64

typedef struct mistral_layer {
    cdf_norm_layer input_layernorm, post_attention_layernorm;
    cdf_linear_layer q_proj, k_proj, v_proj, o_proj;
    cdf_linear_layer gate_proj, up_proj, down_proj;
} mistral_layer;

struct cdf_mistral3_text {
    /* config (text_config for Mistral3) */
    int64_t vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, head_dim;
    int64_t sliding_window; /* 0 = none */
    double rope_theta;
    float eps;
    /* weights */
    int64_t n_loaded;       /* layers 0 .. n_loaded-1 are loaded */
    bool has_final_norm;
    cdf_tensor *embed_tokens; /* [vocab, hidden] */
    mistral_layer *layers;
    cdf_norm_layer norm;
    /* tensor parallelism (NULL = whole): this rank's query and key/value heads */
    cdf_tp *tp;
    int64_t local_heads, local_kv_heads;
};

/* Tensor-parallel plan: transformers' MistralConfig.base_model_tp_plan. q/k/v and the MLP's
 * gate/up column-wise (each rank owns num_attention_heads / N query heads and
 * num_key_value_heads / N key/value heads, which keeps grouped-query attention local: query head
 * h of a rank reads its kv head h / (heads / kv_heads)), o_proj and down_proj row-wise (one
 * all-reduce each). Embeddings and norms are replicated. The module names carry the checkpoint's
 * prefix, so there is one plan per prefix form (PREFIXES below, same order). */
#define MISTRAL_TP_PLAN(prefix)                                                                                        \
    {                                                                                                                  \
        {prefix "layers.*.self_attn.q_proj", CDF_TP_COLWISE}, {prefix "layers.*.self_attn.k_proj", CDF_TP_COLWISE},   \
            {prefix "layers.*.self_attn.v_proj", CDF_TP_COLWISE}, {prefix "layers.*.self_attn.o_proj", CDF_TP_ROWWISE}, \
            {prefix "layers.*.mlp.gate_proj", CDF_TP_COLWISE}, {prefix "layers.*.mlp.up_proj", CDF_TP_COLWISE},       \
            {prefix "layers.*.mlp.down_proj", CDF_TP_ROWWISE}, {NULL, CDF_TP_REPLICATE},                              \
    }
static const cdf_tp_rule TP_PLAN_MISTRAL3[] = MISTRAL_TP_PLAN("model.language_model.");
static const cdf_tp_rule TP_PLAN_MISTRAL3_LEGACY[] = MISTRAL_TP_PLAN("language_model.model.");
static const cdf_tp_rule TP_PLAN_CAUSAL_LM[] = MISTRAL_TP_PLAN("model.");
static const cdf_tp_rule TP_PLAN_BASE[] = MISTRAL_TP_PLAN("");

/* ---- config ------------------------------------------------------------------------------------ */
typedef struct mistral_defaults {
    int64_t vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, head_dim, sliding_window;
    double eps, rope_theta;
} mistral_defaults;

/* transformers MistralConfig (head_dim 0 = hidden_size / heads) */
static const mistral_defaults MISTRAL_DEFAULTS = {32000, 4096, 14336, 32, 32, 8, 0, 4096, 1e-6, 10000.0};
/* Mistral3Config's text_config when config.json has none (Mistral-Small-3.1's text model) */
static const mistral_defaults MISTRAL3_TEXT_DEFAULTS = {131072, 5120, 32768, 40, 32, 8, 128, 0, 1e-5, 1e9};

static cdf_status get_dim(const cJSON *cfg, const char *key, int64_t def, int64_t *out) {
    return cdf_config_get_dim(cfg, key, def, 1 << 24, out);
}

/* Only the "default" rope is implemented: any scaling type would change the angles. */
static cdf_status check_rope_type(const cJSON *obj, const char *key) {
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!r || cJSON_IsNull(r)) return CDF_OK;
    if (!cJSON_IsObject(r)) return cdf_error(CDF_ERR_FORMAT, "config.json: %s must be an object or null", key);
    const char *type = "default";
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(r, "rope_type");
    if (!t) t = cJSON_GetObjectItemCaseSensitive(r, "type");
    if (cJSON_IsString(t)) type = t->valuestring;
    if (strcmp(type, "default") != 0)
        return cdf_error(CDF_ERR_UNSUPPORTED, "config.json: %s of type '%.32s' is not supported (default rope only)", key, type);
    return CDF_OK;
}

static cdf_status parse_text_config(const cJSON *c, const mistral_defaults *d, cdf_mistral3_text *m) {
    CDF_TRY(get_dim(c, "vocab_size", d->vocab_size, &m->vocab_size));
    CDF_TRY(get_dim(c, "hidden_size", d->hidden_size, &m->hidden_size));
    CDF_TRY(get_dim(c, "intermediate_size", d->intermediate_size, &m->intermediate_size));
    CDF_TRY(get_dim(c, "num_hidden_layers", d->num_layers, &m->num_layers));
    CDF_TRY(get_dim(c, "num_attention_heads", d->num_heads, &m->num_heads));
    CDF_TRY(get_dim(c, "num_key_value_heads", d->num_kv_heads, &m->num_kv_heads));
    if (m->num_layers > 4096) return cdf_error(CDF_ERR_FORMAT, "config.json: num_hidden_layers = %lld is above 4096", (long long)m->num_layers);
    int64_t hd_default = d->head_dim ? d->head_dim : m->hidden_size / m->num_heads;
    CDF_TRY(get_dim(c, "head_dim", hd_default, &m->head_dim)); /* null -> hidden / heads */
    if (m->head_dim % 2)
        return cdf_error(CDF_ERR_FORMAT, "config.json: head_dim = %lld must be even (RoPE rotates halves)", (long long)m->head_dim);
    if (m->num_heads % m->num_kv_heads)
        return cdf_error(CDF_ERR_FORMAT, "config.json: num_attention_heads = %lld is not a multiple of num_key_value_heads = %lld",
                         (long long)m->num_heads, (long long)m->num_kv_heads);
    if (m->num_heads * m->head_dim > (1 << 24))
        return cdf_error(CDF_ERR_FORMAT, "config.json: num_attention_heads %lld x head_dim %lld is too large",
                         (long long)m->num_heads, (long long)m->head_dim);
    double eps;
    CDF_TRY(cdf_json_get_double(c, "rms_norm_eps", d->eps, &eps));
    if (!(eps > 0)) return cdf_error(CDF_ERR_FORMAT, "config.json: rms_norm_eps = %g must be > 0", eps);
    m->eps = (float)eps;
    /* rope_theta (transformers 4.x) or rope_parameters.rope_theta (5.x) */
    CDF_TRY(check_rope_type(c, "rope_scaling"));
    CDF_TRY(check_rope_type(c, "rope_parameters"));
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(c, "rope_parameters");
    double theta = d->rope_theta;
    if (cJSON_IsObject(rp)) CDF_TRY(cdf_json_get_double(rp, "rope_theta", theta, &theta));
    CDF_TRY(cdf_json_get_double(c, "rope_theta", theta, &m->rope_theta));
    if (!(m->rope_theta > 1)) return cdf_error(CDF_ERR_FORMAT, "config.json: rope_theta = %g must be > 1", m->rope_theta);
    /* sliding_window: absent -> the class default, null -> none */
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(c, "sliding_window");
    m->sliding_window = d->sliding_window;
    if (sw && cJSON_IsNull(sw)) m->sliding_window = 0;
    else if (sw) CDF_TRY(get_dim(c, "sliding_window", 0, &m->sliding_window));
    const char *act;
    CDF_TRY(cdf_json_get_string(c, "hidden_act", "silu", &act));
    if (strcmp(act, "silu") != 0 && strcmp(act, "swish") != 0)
        return cdf_error(CDF_ERR_UNSUPPORTED, "config.json: hidden_act '%.32s' is not supported (silu)", act);
    return CDF_OK;
}

static cdf_status parse_config(const cJSON *cfg, cdf_mistral3_text *m) {
    const char *cls = cdf_config_class_name(cfg), *model_type = NULL;
    CDF_TRY(cdf_json_get_string(cfg, "model_type", NULL, &model_type));
    bool mistral3 = (cls && strcmp(cls, "Mistral3ForConditionalGeneration") == 0) ||
                    (model_type && strcmp(model_type, "mistral3") == 0);
    if (!mistral3) return parse_text_config(cfg, &MISTRAL_DEFAULTS, m);
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(cfg, "text_config");
    if (tc && !cJSON_IsNull(tc)) {
        if (!cJSON_IsObject(tc)) return cdf_error(CDF_ERR_FORMAT, "config.json: text_config must be an object");
        cdf_status s = parse_text_config(tc, &MISTRAL_DEFAULTS, m);
        if (s != CDF_OK) cdf_error_prefix("in text_config: ");
        return s;
    }
    cJSON *empty = cJSON_CreateObject();
    if (!empty) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    cdf_status s = parse_text_config(empty, &MISTRAL3_TEXT_DEFAULTS, m);
    cJSON_Delete(empty);
    return s;
}

/* ---- load / free --------------------------------------------------------------------------------- */
static void mistral_free(void *impl) {
    cdf_mistral3_text *m = impl;
    if (!m) return;
    cdf_tensor_release(m->embed_tokens);
    if (m->layers) {
        for (int64_t i = 0; i < m->n_loaded; i++) {
            mistral_layer *l = &m->layers[i];
            cdf_norm_free(&l->input_layernorm);
            cdf_norm_free(&l->post_attention_layernorm);
            cdf_linear_free(&l->q_proj);
            cdf_linear_free(&l->k_proj);
            cdf_linear_free(&l->v_proj);
            cdf_linear_free(&l->o_proj);
            cdf_linear_free(&l->gate_proj);
            cdf_linear_free(&l->up_proj);
            cdf_linear_free(&l->down_proj);
        }
        free(m->layers);
    }
    cdf_norm_free(&m->norm);
    cdf_tp_free(m->tp);
    free(m);
}

/* Where the language model's tensors are: transformers >= 4.52 Mistral3, legacy Mistral3 (what
 * FLUX.2-dev's text_encoder holds), MistralForCausalLM, MistralModel. */
static const char *const PREFIXES[] = {"model.language_model.", "language_model.model.", "model.", ""};
static const cdf_tp_rule *const TP_PLANS[] = {TP_PLAN_MISTRAL3, TP_PLAN_MISTRAL3_LEGACY, TP_PLAN_CAUSAL_LM, TP_PLAN_BASE};

static cdf_status find_prefix(cdf_weights *w, const char **prefix, const cdf_tp_rule **plan) {
    for (size_t i = 0; i < sizeof PREFIXES / sizeof *PREFIXES; i++)
        if (cdf_weights_has(w, "%sembed_tokens.weight", PREFIXES[i])) {
            *prefix = PREFIXES[i];
            *plan = TP_PLANS[i];
            return CDF_OK;
        }
    return cdf_error(CDF_ERR_NOT_FOUND,
                     "no token embedding in the checkpoint (looked for model.language_model.embed_tokens.weight, "
                     "language_model.model.embed_tokens.weight, model.embed_tokens.weight, embed_tokens.weight)");
}

/* Sharding of the text encoder in dir under the process-wide tensor-parallel switch: both head
 * counts and the MLP width must divide by the ranks (the error names the one that does not). */
static cdf_status setup_tp(const char *dir, const cdf_tp_rule *plan, cdf_mistral3_text *m) {
    CDF_TRY(cdf_tp_for_component(dir, "Mistral language model", plan, &m->tp));
    CDF_TRY(cdf_tp_check_divisible(m->tp, "num_attention_heads", m->num_heads));
    CDF_TRY(cdf_tp_check_divisible(m->tp, "num_key_value_heads", m->num_kv_heads));
    CDF_TRY(cdf_tp_check_divisible(m->tp, "intermediate_size", m->intermediate_size));
    m->local_heads = m->num_heads / cdf_tp_size(m->tp);
    m->local_kv_heads = m->num_kv_heads / cdf_tp_size(m->tp);
    return CDF_OK;
}

static cdf_status load_weights(const char *dir, cdf_weights *w, cdf_mistral3_text *m, int max_hidden_state) {
    const int64_t H = m->hidden_size, F = m->intermediate_size, q_out = m->num_heads * m->head_dim,
                  kv_out = m->num_kv_heads * m->head_dim;
    const char *p = "";
    const cdf_tp_rule *plan = NULL;
    CDF_TRY(find_prefix(w, &p, &plan));
    CDF_TRY(setup_tp(dir, plan, m));
    m->embed_tokens = cdf_weights_get(w, 2, (int64_t[]){m->vocab_size, H}, "%sembed_tokens.weight", p);
    if (!m->embed_tokens) return cdf_last_status();
    m->n_loaded = max_hidden_state < 0 || max_hidden_state > m->num_layers ? m->num_layers : max_hidden_state;
    m->layers = calloc((size_t)m->n_loaded + 1, sizeof *m->layers);
    if (!m->layers) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (%lld Mistral layers)", (long long)m->n_loaded);
    for (int64_t i = 0; i < m->n_loaded; i++) {
        mistral_layer *l = &m->layers[i];
        long long li = (long long)i;
        CDF_TRY(cdf_norm_load(w, &l->input_layernorm, H, 1, 0, m->eps, "%slayers.%lld.input_layernorm", p, li));
        CDF_TRY(cdf_tp_linear_load(w, m->tp, &l->q_proj, H, q_out, 0, "%slayers.%lld.self_attn.q_proj", p, li));
        CDF_TRY(cdf_tp_linear_load(w, m->tp, &l->k_proj, H, kv_out, 0, "%slayers.%lld.self_attn.k_proj", p, li));
        CDF_TRY(cdf_tp_linear_load(w, m->tp, &l->v_proj, H, kv_out, 0, "%slayers.%lld.self_attn.v_proj", p, li));
        CDF_TRY(cdf_tp_linear_load(w, m->tp, &l->o_proj, q_out, H, 0, "%slayers.%lld.self_attn.o_proj", p, li));
        CDF_TRY(cdf_norm_load(w, &l->post_attention_layernorm, H, 1, 0, m->eps, "%slayers.%lld.post_attention_layernorm", p, li));
        CDF_TRY(cdf_tp_linear_load(w, m->tp, &l->gate_proj, H, F, 0, "%slayers.%lld.mlp.gate_proj", p, li));
        CDF_TRY(cdf_tp_linear_load(w, m->tp, &l->up_proj, H, F, 0, "%slayers.%lld.mlp.up_proj", p, li));
        CDF_TRY(cdf_tp_linear_load(w, m->tp, &l->down_proj, F, H, 0, "%slayers.%lld.mlp.down_proj", p, li));
    }
    m->has_final_norm = m->n_loaded == m->num_layers;
    if (m->has_final_norm) CDF_TRY(cdf_norm_load(w, &m->norm, H, 1, 0, m->eps, "%snorm", p));
    return m->n_loaded > 0 ? cdf_tp_check_plan_used(m->tp) : CDF_OK;
}

static cdf_status mistral_load_impl(const char *dir, const cJSON *cfg, const cdf_load_options *opt, int max_hidden_state,
                                    cdf_mistral3_text **out) {
    *out = NULL;
    cdf_mistral3_text *m = calloc(1, sizeof *m);
    if (!m) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    cdf_status s = parse_config(cfg, m);
    cdf_weights *w = NULL;
    if (s == CDF_OK) s = cdf_weights_open(dir, opt, &w);
    if (s == CDF_OK) s = load_weights(dir, w, m, max_hidden_state);
    cdf_weights_free(w); /* the tensors hold their own copies */
    if (s != CDF_OK) {
        mistral_free(m);
        return s;
    }
    *out = m;
    return CDF_OK;
}

static cdf_status mistral_load(const char *dir, const cJSON *cfg, const cdf_load_options *opt, void **impl) {
    cdf_mistral3_text *m;
    cdf_status s = mistral_load_impl(dir, cfg, opt, -1, &m);
    *impl = m;
    return s;
}

cdf_status cdf_mistral3_text_load(const char *dir, const cdf_load_options *opt, int max_hidden_state,
                                  cdf_mistral3_text **out) {
    if (!out) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_mistral3_text_load: out is NULL");
    *out = NULL;
    if (!dir) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_mistral3_text_load: dir is NULL");
    cJSON *cfg = NULL;
    CDF_TRY(cdf_config_load(dir, &cfg));
    cdf_status s = mistral_load_impl(dir, cfg, opt, max_hidden_state, out);
    cJSON_Delete(cfg);
    if (s != CDF_OK) cdf_error_prefix("loading Mistral text encoder from %s: ", dir);
    return s;
}

void cdf_mistral3_text_free(cdf_mistral3_text *m) { mistral_free(m); }
int64_t cdf_mistral3_text_hidden_size(const cdf_mistral3_text *m) { return m ? m->hidden_size : 0; }
int64_t cdf_mistral3_text_num_layers(const cdf_mistral3_text *m) { return m ? m->num_layers : 0; }

/* ---- RoPE and mask ------------------------------------------------------------------------------ */
cdf_status cdf_mistral3_rope_tables(const cdf_mistral3_text *m, int64_t seq_len, float *inv_freq, float *cos_out,
                                    float *sin_out) {
    if (!m) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_mistral3_rope_tables: model is NULL");
    if (seq_len < 0 || seq_len > MAX_SEQ)
        return cdf_error(CDF_ERR_INVALID_ARG, "cdf_mistral3_rope_tables: seq_len %lld is outside 0..%d", (long long)seq_len, MAX_SEQ);
    const int64_t d = m->head_dim, half = d / 2;
    float *inv = malloc((size_t)half * sizeof *inv);
    if (!inv) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (RoPE table of %lld)", (long long)half);
    /* torch, in float32: theta ** (arange(0, d, 2).float() / d), 1 / that, then pos * inv_freq,
     * cos/sin of the float32 angle (each step rounded to float as torch rounds it) */
    for (int64_t i = 0; i < half; i++) {
        const float e = (float)(2 * i) / (float)d;
        const float p = (float)pow((double)(float)m->rope_theta, (double)e);
        inv[i] = 1.0f / p;
        if (inv_freq) inv_freq[i] = inv[i];
    }
    for (int64_t pos = 0; pos < seq_len && (cos_out || sin_out); pos++)
        for (int64_t j = 0; j < d; j++) {
            const float angle = (float)pos * inv[j % half];
            if (cos_out) cos_out[pos * d + j] = (float)cos((double)angle);
            if (sin_out) sin_out[pos * d + j] = (float)sin((double)angle);
        }
    free(inv);
    return CDF_OK;
}

/* Additive mask [B, 1, S, S]: 0 where key j is visible from query i, -inf elsewhere. The causal
 * (and sliding-window) part depends on S only and is built here; the padding part comes from
 * attention_mask [B, S] on the device (no host read): a nonzero entry keeps its key. */
static cdf_tensor *make_mask(const cdf_mistral3_text *m, cdf_device *dev, cdf_tensor *attention_mask, int64_t S) {
    float *mask = malloc((size_t)(S * S) * sizeof *mask);
    if (!mask) {
        cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (attention mask %lld x %lld)", (long long)S, (long long)S);
        return NULL;
    }
    for (int64_t i = 0; i < S; i++)
        for (int64_t j = 0; j < S; j++) {
            bool visible = j <= i && (m->sliding_window == 0 || i - j < m->sliding_window);
            mask[i * S + j] = visible ? 0.0f : -INFINITY;
        }
    cdf_tensor *causal = cdf_tensor_from_host(dev, CDF_F32, 4, (int64_t[]){1, 1, S, S}, mask, CDF_F32);
    free(mask);
    if (!attention_mask || !causal) return causal;
    /* keep -> 0, padding -> -inf: log(min(|x| * 1e30, 1)) is log 1 = 0 for any |x| >= 1e-30, log 0 = -inf */
    const int64_t B = cdf_tensor_dim(attention_mask, 0);
    cdf_tensor *x = cdf_cast(attention_mask, CDF_F32);
    cdf_tensor *pad = cdf_log(cdf_clamp(cdf_scale(cdf_maximum(x, cdf_neg(x)), 1e30f), 0.0f, 1.0f));
    return cdf_add(causal, cdf_reshape(pad, 4, (int64_t[]){B, 1, 1, S})); /* [B, 1, S, S] */
}

/* ---- forward -------------------------------------------------------------------------------------- */
/* x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x[..., d/2:], x[..., :d/2]); x [B, h, S, d] */
static cdf_tensor *apply_rope(cdf_tensor *x, cdf_tensor *cos_t, cdf_tensor *sin_t, int64_t d) {
    cdf_tensor *x1 = cdf_narrow(x, 3, 0, d / 2), *x2 = cdf_narrow(x, 3, d / 2, d / 2);
    cdf_tensor *rot = cdf_cat((cdf_tensor *[]){cdf_neg(x2), x1}, 2, 3);
    return cdf_add(cdf_mul(x, cos_t), cdf_mul(rot, sin_t));
}

/* [B, kv_heads, S, d] -> [B, heads, S, d], kv head g serving query heads g*n_rep .. g*n_rep+n_rep-1 */
static cdf_tensor *repeat_kv(cdf_tensor *x, int64_t n_rep, int64_t B, int64_t kvh, int64_t S, int64_t d) {
    if (n_rep == 1) return x;
    cdf_tensor *e = cdf_expand(cdf_unsqueeze(x, 2), 5, (int64_t[]){B, kvh, n_rep, S, d});
    return cdf_reshape(e, 4, (int64_t[]){B, kvh * n_rep, S, d});
}

static cdf_tensor *layer_forward(const cdf_mistral3_text *m, const mistral_layer *l, cdf_tensor *x, cdf_tensor *mask,
                                 cdf_tensor *cos_t, cdf_tensor *sin_t, int64_t B, int64_t S) {
    /* this rank's heads (all of them unsharded): q/k/v are column shards, o_proj sums the ranks */
    const int64_t nh = m->local_heads, kvh = m->local_kv_heads, d = m->head_dim;
    /* self-attention                                                        q [B, heads, S, d] */
    cdf_tensor *h = cdf_rms_norm(x, l->input_layernorm.w, l->input_layernorm.eps);
    cdf_tensor *q = cdf_transpose(cdf_reshape(cdf_linear_fwd(&l->q_proj, h), 4, (int64_t[]){B, S, nh, d}), 1, 2);
    cdf_tensor *k = cdf_transpose(cdf_reshape(cdf_linear_fwd(&l->k_proj, h), 4, (int64_t[]){B, S, kvh, d}), 1, 2);
    cdf_tensor *v = cdf_transpose(cdf_reshape(cdf_linear_fwd(&l->v_proj, h), 4, (int64_t[]){B, S, kvh, d}), 1, 2);
    q = apply_rope(q, cos_t, sin_t, d);
    k = apply_rope(k, cos_t, sin_t, d);
    k = repeat_kv(k, nh / kvh, B, kvh, S, d);
    v = repeat_kv(v, nh / kvh, B, kvh, S, d);
    cdf_tensor *a = cdf_sdpa(q, k, v, mask, (float)(1.0 / sqrt((double)d)));
    a = cdf_reshape(cdf_transpose(a, 1, 2), 3, (int64_t[]){B, S, nh * d});
    x = cdf_add(x, cdf_linear_fwd(&l->o_proj, a));
    /* SwiGLU MLP                                                   [B, S, intermediate_size] */
    h = cdf_rms_norm(x, l->post_attention_layernorm.w, l->post_attention_layernorm.eps);
    cdf_tensor *f = cdf_mul(cdf_silu(cdf_linear_fwd(&l->gate_proj, h)), cdf_linear_fwd(&l->up_proj, h));
    return cdf_add(x, cdf_linear_fwd(&l->down_proj, f));
}

/* Check the inputs' shapes and dtypes. Their values are used on the device only: an id outside
 * the vocabulary fails the embedding lookup (reported at the next sync, naming the id). */
static cdf_status check_inputs(cdf_tensor *input_ids, cdf_tensor *attention_mask, int64_t *B, int64_t *S) {
    char d1[96], d2[96];
    if (!input_ids) return cdf_error(CDF_ERR_INVALID_ARG, "Mistral text encoder: input_ids is NULL");
    const cdf_dtype dt = cdf_tensor_dtype(input_ids);
    if (cdf_tensor_ndim(input_ids) != 2 || (dt != CDF_I64 && dt != CDF_I32))
        return cdf_error(CDF_ERR_SHAPE, "Mistral text encoder: input_ids %s must be [batch, seq] i64 or i32",
                         cdf_tensor_describe(input_ids, d1, sizeof d1));
    *B = cdf_tensor_dim(input_ids, 0);
    *S = cdf_tensor_dim(input_ids, 1);
    if (*B < 1 || *S < 1 || *S > MAX_SEQ || *B > (1 << 16))
        return cdf_error(CDF_ERR_SHAPE, "Mistral text encoder: input_ids %s needs 1 <= batch <= 65536 and 1 <= seq <= %d",
                         cdf_tensor_describe(input_ids, d1, sizeof d1), MAX_SEQ);
    if (attention_mask && (cdf_tensor_ndim(attention_mask) != 2 || cdf_tensor_dim(attention_mask, 0) != *B ||
                           cdf_tensor_dim(attention_mask, 1) != *S))
        return cdf_error(CDF_ERR_SHAPE, "Mistral text encoder: attention_mask %s does not match input_ids %s",
                         cdf_tensor_describe(attention_mask, d1, sizeof d1), cdf_tensor_describe(input_ids, d2, sizeof d2));
    return CDF_OK;
}

/* Normalise the requested indices (Python-style negatives) and check them against what is loaded. */
static cdf_status check_layers(const cdf_mistral3_text *m, const int *layers, int n, int *idx, int *top) {
    if (!layers || n < 1 || n > MAX_OUT_LAYERS)
        return cdf_error(CDF_ERR_INVALID_ARG, "Mistral text encoder: %d hidden-state layers requested (1..%d)", layers ? n : 0,
                         MAX_OUT_LAYERS);
    const int64_t L = m->num_layers;
    *top = 0;
    for (int i = 0; i < n; i++) {
        int64_t k = layers[i] < 0 ? layers[i] + L + 1 : layers[i];
        if (k < 0 || k > L)
            return cdf_error(CDF_ERR_INVALID_ARG,
                             "Mistral text encoder: hidden-state layer %d is out of range (the model has %lld layers: "
                             "indices 0..%lld or -%lld..-1)",
                             layers[i], (long long)L, (long long)L, (long long)L + 1);
        if (k > m->n_loaded || (k == L && !m->has_final_norm))
            return cdf_error(CDF_ERR_INVALID_ARG,
                             "Mistral text encoder: hidden-state layer %d needs layers the model was not loaded with "
                             "(loaded up to hidden state %lld)",
                             layers[i], (long long)m->n_loaded);
        idx[i] = (int)k;
        if (idx[i] > *top) *top = idx[i];
    }
    return CDF_OK;
}

/* Runs the layers up to the largest requested index; got[i] receives an owned reference to
 * hidden_states[idx[i]] (the caller releases them). Runs inside the caller's scope. */
static cdf_status run_layers(cdf_mistral3_text *m, cdf_tensor *input_ids, cdf_tensor *attention_mask, const int *idx, int n,
                             int top, cdf_tensor **got) {
    int64_t B = 0, S = 0;
    float *cos_h = NULL, *sin_h = NULL;
    cdf_status s = check_inputs(input_ids, attention_mask, &B, &S);
    const int64_t d = m->head_dim;
    if (s == CDF_OK) { /* positions 0..S-1: the tables depend on S only */
        cos_h = malloc((size_t)(S * d) * sizeof *cos_h);
        sin_h = malloc((size_t)(S * d) * sizeof *sin_h);
        s = cos_h && sin_h ? cdf_mistral3_rope_tables(m, S, NULL, cos_h, sin_h)
                           : cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (RoPE tables)");
    }
    cdf_device *dev = cdf_tensor_device(m->embed_tokens);
    cdf_tensor *mask = NULL, *cos_t = NULL, *sin_t = NULL, *x = NULL;
    if (s == CDF_OK) {
        mask = make_mask(m, dev, attention_mask, S);                                       /* [B|1, 1, S, S] */
        cos_t = cdf_tensor_from_host(dev, CDF_F32, 2, (int64_t[]){S, d}, cos_h, CDF_F32); /* [S, d] */
        sin_t = cdf_tensor_from_host(dev, CDF_F32, 2, (int64_t[]){S, d}, sin_h, CDF_F32);
        if (!mask || !cos_t || !sin_t) s = cdf_last_status() ? cdf_last_status() : CDF_ERR_INTERNAL;
    }
    free(cos_h);
    free(sin_h);
    if (s != CDF_OK) return s;

    /* x: an owned reference (not scope-recorded), so that every layer's output is released as soon
     * as the next one exists unless it is one of the requested hidden states */
    cdf_scope_push();
    x = cdf_tensor_retain(cdf_cast(cdf_embedding(m->embed_tokens, input_ids), CDF_F32)); /* [B, S, hidden] */
    cdf_scope_pop(NULL, 0);
    bool failed = !x;
    for (int layer = 0; !failed; layer++) {
        /* x is the output of layer `layer` (the embeddings for 0); hidden_states[L] is its final norm */
        cdf_tensor *state = x;
        if (layer == m->num_layers) {
            cdf_scope_push();
            state = cdf_tensor_retain(cdf_rms_norm(x, m->norm.w, m->norm.eps));
            cdf_scope_pop(NULL, 0);
            if (!state) break;
        } else {
            cdf_tensor_retain(state);
        }
        for (int i = 0; i < n; i++)
            if (idx[i] == layer) got[i] = cdf_tensor_retain(state);
        cdf_tensor_release(state);
        if (layer == top) break;
        cdf_scope_push();
        cdf_tensor *y = cdf_tensor_retain(layer_forward(m, &m->layers[layer], x, mask, cos_t, sin_t, B, S));
        cdf_scope_pop(NULL, 0);
        cdf_tensor_release(x);
        x = y;
        failed = !x;
    }
    cdf_tensor_release(x);
    for (int i = 0; i < n; i++) failed = failed || !got[i];
    /* a queued kernel's failure surfaces at the synchronisation */
    return failed ? (cdf_last_status() ? cdf_last_status() : CDF_ERR_INTERNAL) : cdf_device_synchronize(dev);
}

static cdf_status hidden_states_impl(cdf_mistral3_text *m, cdf_tensor *input_ids, cdf_tensor *attention_mask,
                                     const int *layers, int n_layers, bool flatten, cdf_tensor **out) {
    if (!out) return cdf_error(CDF_ERR_INVALID_ARG, "Mistral text encoder: output pointer is NULL");
    *out = NULL;
    if (!m) return cdf_error(CDF_ERR_INVALID_ARG, "Mistral text encoder: model is NULL");
    int idx[MAX_OUT_LAYERS], top;
    CDF_TRY(check_layers(m, layers, n_layers, idx, &top));
    cdf_tensor *got[MAX_OUT_LAYERS] = {0};
    cdf_scope_push();
    cdf_status s = run_layers(m, input_ids, attention_mask, idx, n_layers, top, got);
    cdf_tensor *r = NULL;
    if (s == CDF_OK) {
        if (flatten) { /* [B, S, n * hidden]: channel i * hidden + h */
            r = cdf_cat(got, n_layers, 2);
        } else {       /* [B, n, S, hidden] */
            cdf_tensor *u[MAX_OUT_LAYERS];
            for (int i = 0; i < n_layers; i++) u[i] = cdf_unsqueeze(got[i], 1);
            r = cdf_cat(u, n_layers, 1);
        }
        r = cdf_contiguous(r);
        if (!r) s = cdf_last_status() ? cdf_last_status() : CDF_ERR_INTERNAL;
        else s = cdf_device_synchronize(cdf_tensor_device(r));
    }
    for (int i = 0; i < n_layers; i++) cdf_tensor_release(got[i]);
    if (s != CDF_OK) {
        cdf_scope_pop(NULL, 0);
        return s;
    }
    cdf_scope_pop(&r, 1);
    *out = r;
    return CDF_OK;
}

cdf_status cdf_mistral3_hidden_states(cdf_mistral3_text *m, cdf_tensor *input_ids, cdf_tensor *attention_mask,
                                      const int *layers, int n_layers, cdf_tensor **hidden_states) {
    return hidden_states_impl(m, input_ids, attention_mask, layers, n_layers, false, hidden_states);
}

cdf_status cdf_mistral3_encode(cdf_mistral3_text *m, cdf_tensor *input_ids, cdf_tensor *attention_mask, const int *layers,
                               int n_layers, cdf_tensor **prompt_embeds) {
    return hidden_states_impl(m, input_ids, attention_mask, layers, n_layers, true, prompt_embeds);
}

/* ---- component ------------------------------------------------------------------------------------ */
/* Inputs: input_ids [B, S]; attention_mask [B, S] (optional); text_encoder_out_layers (optional,
 * integer [n], default FLUX.2's (10, 20, 30)); output_hidden_states (optional scalar, nonzero =
 * also return every hidden state). Outputs: out.prompt_embeds [B, S, n * hidden],
 * out.last_hidden_state [B, S, hidden] (= hidden_states[L]), and out.hidden_states
 * [B, L + 1, S, hidden] when asked for. */
static cdf_status mistral_run(void *impl, const char *method, const cdf_tensor_map *in, cdf_tensor_map *out) {
    cdf_mistral3_text *m = impl;
    if (method && strcmp(method, "forward") != 0)
        return cdf_error(CDF_ERR_UNSUPPORTED, "Mistral text encoder: method '%s' is not supported (only forward)", method);
    cdf_tensor *ids = cdf_input(in, "input_ids", "Mistral text encoder");
    if (!ids) return cdf_last_status();
    cdf_tensor *mask = cdf_input_opt(in, "attention_mask");
    int layers[MAX_OUT_LAYERS] = CDF_FLUX2_TEXT_LAYERS_DEFAULT, n = 3;
    cdf_tensor *lt = cdf_input_opt(in, "text_encoder_out_layers");
    if (lt) {
        int64_t cnt = cdf_tensor_numel(lt);
        char d[96];
        if (cdf_tensor_ndim(lt) > 1 || cnt < 1 || cnt > MAX_OUT_LAYERS)
            return cdf_error(CDF_ERR_SHAPE, "Mistral text encoder: text_encoder_out_layers %s must be a list of 1..%d layers",
                             cdf_tensor_describe(lt, d, sizeof d), MAX_OUT_LAYERS);
        int64_t v[MAX_OUT_LAYERS];
        CDF_TRY(cdf_tensor_read(lt, CDF_I64, v, sizeof v[0] * (size_t)cnt));
        n = (int)cnt;
        for (int i = 0; i < n; i++) {
            if (v[i] < -4097 || v[i] > 4096)
                return cdf_error(CDF_ERR_INVALID_ARG, "Mistral text encoder: text_encoder_out_layers[%d] = %lld is out of range",
                                 i, (long long)v[i]);
            layers[i] = (int)v[i];
        }
    }
    cdf_tensor *ohs = cdf_input_opt(in, "output_hidden_states");
    double want_all = 0;
    if (ohs) CDF_TRY(cdf_tensor_item(ohs, &want_all));
    /* one forward: every hidden state, or the requested ones + the last one */
    const int L = (int)m->num_layers;
    int idx[MAX_OUT_LAYERS], top, list[MAX_OUT_LAYERS], n_list = 0, at[MAX_OUT_LAYERS];
    CDF_TRY(check_layers(m, layers, n, idx, &top));
    if (want_all != 0) {
        if (L + 1 > MAX_OUT_LAYERS)
            return cdf_error(CDF_ERR_LIMIT, "Mistral text encoder: output_hidden_states is limited to %d layers", MAX_OUT_LAYERS - 1);
        for (int i = 0; i <= L; i++) list[n_list++] = i;
        for (int i = 0; i < n; i++) at[i] = idx[i];
    } else {
        if (n + 1 > MAX_OUT_LAYERS)
            return cdf_error(CDF_ERR_LIMIT, "Mistral text encoder: text_encoder_out_layers is limited to %d layers", MAX_OUT_LAYERS - 1);
        for (int i = 0; i < n; i++) at[i] = n_list, list[n_list++] = idx[i];
        list[n_list++] = L;
    }
    cdf_tensor *hs; /* [B, n_list, S, hidden] */
    CDF_TRY(hidden_states_impl(m, ids, mask, list, n_list, false, &hs));
    cdf_tensor *pick[MAX_OUT_LAYERS];
    for (int i = 0; i < n; i++) pick[i] = cdf_squeeze(cdf_narrow(hs, 1, at[i], 1), 1);
    cdf_tensor *pe = cdf_contiguous(cdf_cat(pick, n, 2)); /* [B, S, n * hidden] */
    cdf_tensor *last = cdf_contiguous(cdf_squeeze(cdf_narrow(hs, 1, n_list - 1, 1), 1));
    if (!pe || !last) return cdf_last_status();
    CDF_TRY(cdf_tensor_map_set(out, "out.prompt_embeds", pe));
    CDF_TRY(cdf_tensor_map_set(out, "out.last_hidden_state", last));
    return want_all != 0 ? cdf_tensor_map_set(out, "out.hidden_states", hs) : CDF_OK;
}

const cdf_component_class cdf_mistral3_text_class = {
    .names = (const char *const[]){"Mistral3ForConditionalGeneration", "MistralModel", "MistralForCausalLM", NULL},
    .load = mistral_load,
    .free = mistral_free,
    .run = mistral_run,
    .static_inputs = (const char *const[]){"text_encoder_out_layers", "output_hidden_states", NULL},
};
