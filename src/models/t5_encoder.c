/* T5 encoder: transformers T5EncoderModel (T5 v1.1 as FLUX's text_encoder_2 and SD3's
 * text_encoder_3; the v1.0 ReLU feed-forward is supported too).
 *
 *   x = shared[ids]                                                      [B, L, d_model]
 *   bias[h, i, j] = relative_attention_bias[bucket(j - i), h]           [1, heads, L, L]
 *                   (block 0's table, computed once, added in every block)
 *   per block:  x += o(softmax(q k^T + bias) v)       q, k, v of rms(x); NO 1/sqrt(d_kv) scaling
 *               x += wo(act(wi_0 rms(x)) * wi_1 rms(x))        (gated; v1.0: wo(act(wi rms(x))))
 *   last_hidden_state = rms(x) with encoder.final_layer_norm
 * where rms(x) = x * rsqrt(mean(x^2) + eps) * weight (no mean subtraction, no bias) and no linear
 * has a bias. The pipelines pass no attention mask: padding tokens are attended to. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "models/component.h"
#include "models/text_encoders.h"
#include "io/json.h"

typedef cdf_act t5_act;

typedef struct t5_block {
    cdf_norm_layer attn_norm;              /* layer.0.layer_norm */
    cdf_linear_layer q, k, v, o;           /* layer.0.SelfAttention.{q,k,v,o} */
    cdf_norm_layer ff_norm;                /* layer.1.layer_norm */
    cdf_linear_layer wi_0, wi_1, wi, wo;   /* layer.1.DenseReluDense: wi_0/wi_1 (gated) or wi */
} t5_block;

struct cdf_t5_encoder {
    /* config.json */
    int64_t d_model, d_kv, d_ff, num_layers, num_heads, vocab_size;
    int64_t num_buckets, max_distance;
    float eps;
    bool gated;
    t5_act act;
    /* weights */
    cdf_tensor *shared;     /* [vocab, d_model] */
    cdf_tensor *relative_bias; /* f32 [num_buckets, local_heads]: block 0's relative_attention_bias, this rank's heads */
    t5_block *blocks;       /* [num_layers] */
    cdf_norm_layer final_layer_norm;
    /* tensor parallelism: NULL when whole; else this rank holds local_heads of the heads (the
     * rank's slice of q/k/v and of the relative bias table, so the forward never needs the rank) */
    cdf_tp *tp;
    int64_t local_heads;
};

/* Tensor-parallel plan (Megatron split, as transformers' T5 plans): q/k/v column-wise (heads
 * split over the ranks), o row-wise; wi / wi_0 / wi_1 column-wise, wo row-wise. The relative
 * bias table [buckets, heads] is split by heads like q/k/v (each rank reads the columns of its
 * own heads: cdf_tp_head_table_f32), so the forward is the same for every rank and one program
 * over replicas runs it. The token table and norms are replicated. Two all-reduces per block. */
static const cdf_tp_rule T5_TP_PLAN[] = {
    {"encoder.block.*.layer.0.SelfAttention.q", CDF_TP_COLWISE},
    {"encoder.block.*.layer.0.SelfAttention.k", CDF_TP_COLWISE},
    {"encoder.block.*.layer.0.SelfAttention.v", CDF_TP_COLWISE},
    {"encoder.block.*.layer.0.SelfAttention.o", CDF_TP_ROWWISE},
    {"encoder.block.*.layer.1.DenseReluDense.wi", CDF_TP_COLWISE},
    {"encoder.block.*.layer.1.DenseReluDense.wi_0", CDF_TP_COLWISE},
    {"encoder.block.*.layer.1.DenseReluDense.wi_1", CDF_TP_COLWISE},
    {"encoder.block.*.layer.1.DenseReluDense.wo", CDF_TP_ROWWISE},
    {NULL, CDF_TP_REPLICATE},
};

/* ---- config ------------------------------------------------------------------------------- */
static cdf_status parse_act(const char *name, t5_act *out) {
    return cdf_act_parse(name, false, "feed-forward activation", "relu, gelu, gelu_new, gelu_pytorch_tanh, silu", out);
}

static cdf_status get_dim(const cJSON *cfg, const char *key, int64_t def, int64_t *out) {
    return cdf_config_get_dim(cfg, key, def, 1 << 24, out);
}

static cdf_status parse_config(const cJSON *cfg, cdf_t5_encoder *m) {
    /* defaults: transformers T5Config */
    CDF_TRY(get_dim(cfg, "vocab_size", 32128, &m->vocab_size));
    CDF_TRY(get_dim(cfg, "d_model", 512, &m->d_model));
    CDF_TRY(get_dim(cfg, "d_kv", 64, &m->d_kv));
    CDF_TRY(get_dim(cfg, "d_ff", 2048, &m->d_ff));
    CDF_TRY(get_dim(cfg, "num_layers", 6, &m->num_layers));
    CDF_TRY(get_dim(cfg, "num_heads", 8, &m->num_heads));
    CDF_TRY(get_dim(cfg, "relative_attention_num_buckets", 32, &m->num_buckets));
    CDF_TRY(get_dim(cfg, "relative_attention_max_distance", 128, &m->max_distance));
    if (m->num_buckets < 4)
        return cdf_error(CDF_ERR_FORMAT, "config.json: relative_attention_num_buckets = %lld must be >= 4",
                         (long long)m->num_buckets);
    if ((int64_t)m->num_heads * m->d_kv > (1 << 24))
        return cdf_error(CDF_ERR_FORMAT, "config.json: num_heads %lld x d_kv %lld is too large", (long long)m->num_heads,
                         (long long)m->d_kv);
    double eps;
    CDF_TRY(cdf_json_get_double(cfg, "layer_norm_epsilon", 1e-6, &eps));
    if (!(eps > 0)) return cdf_error(CDF_ERR_FORMAT, "config.json: layer_norm_epsilon = %g must be > 0", eps);
    m->eps = (float)eps;
    /* T5Config: feed_forward_proj "relu" | "gated-gelu" | "<act>" | "gated-<act>"; "gated-gelu" means
     * gelu_new for backwards compatibility. Explicit dense_act_fn / is_gated_act keys (as saved
     * configs carry them) take precedence, as they do when transformers loads a config. */
    const char *ffp;
    CDF_TRY(cdf_json_get_string(cfg, "feed_forward_proj", "relu", &ffp));
    const char *dash = strchr(ffp, '-');
    if (dash && (dash != ffp + 5 || strncmp(ffp, "gated", 5) != 0 || strchr(dash + 1, '-')))
        return cdf_error(CDF_ERR_FORMAT, "config.json: feed_forward_proj '%s' is not '<act>' or 'gated-<act>'", ffp);
    bool gated = dash != NULL;
    const char *act = dash ? dash + 1 : ffp;
    if (strcmp(ffp, "gated-gelu") == 0) act = "gelu_new";
    CDF_TRY(cdf_json_get_bool(cfg, "is_gated_act", gated, &m->gated));
    CDF_TRY(cdf_json_get_string(cfg, "dense_act_fn", act, &act));
    return parse_act(act, &m->act);
}

/* ---- load / free ---------------------------------------------------------------------------- */
static void t5_free(void *impl) {
    cdf_t5_encoder *m = impl;
    if (!m) return;
    cdf_tensor_release(m->shared);
    cdf_tensor_release(m->relative_bias);
    if (m->blocks) {
        for (int64_t i = 0; i < m->num_layers; i++) {
            t5_block *b = &m->blocks[i];
            cdf_norm_free(&b->attn_norm);
            cdf_linear_free(&b->q);
            cdf_linear_free(&b->k);
            cdf_linear_free(&b->v);
            cdf_linear_free(&b->o);
            cdf_norm_free(&b->ff_norm);
            cdf_linear_free(&b->wi_0);
            cdf_linear_free(&b->wi_1);
            cdf_linear_free(&b->wi);
            cdf_linear_free(&b->wo);
        }
        free(m->blocks);
    }
    cdf_norm_free(&m->final_layer_norm);
    cdf_tp_free(m->tp);
    free(m);
}

static cdf_status load_weights(cdf_weights *w, void *model) {
    cdf_t5_encoder *m = model;
    const int64_t D = m->d_model, inner = m->num_heads * m->d_kv, F = m->d_ff;
    const int64_t emb_shape[2] = {m->vocab_size, D};
    /* the token table is tied: checkpoints hold shared.weight, some only encoder.embed_tokens.weight */
    if (!cdf_weights_has(w, "shared.weight") && cdf_weights_has(w, "encoder.embed_tokens.weight"))
        m->shared = cdf_weights_get(w, 2, emb_shape, "encoder.embed_tokens.weight");
    else
        m->shared = cdf_weights_get(w, 2, emb_shape, "shared.weight");
    if (!m->shared) return cdf_last_status();

    /* the bias table (this rank's heads), gathered on the device by bucket (make_position_bias);
     * f32 like torch's addition of the bias to the f32 scores */
    cdf_tensor *rb = cdf_tp_head_table_f32(w, m->tp, m->num_buckets, m->num_heads,
                                           "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight");
    if (!rb) return cdf_last_status();
    m->relative_bias = rb;

    m->blocks = calloc((size_t)m->num_layers, sizeof *m->blocks);
    if (!m->blocks) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (%lld T5 blocks)", (long long)m->num_layers);
    for (int64_t i = 0; i < m->num_layers; i++) {
        t5_block *b = &m->blocks[i];
        const char *p = "encoder.block";
        long long bi = (long long)i;
        CDF_TRY(cdf_norm_load(w, &b->attn_norm, D, 1, 0, m->eps, "%s.%lld.layer.0.layer_norm", p, bi));
        CDF_TRY(cdf_tp_linear_load(w, m->tp, &b->q, D, inner, 0, "%s.%lld.layer.0.SelfAttention.q", p, bi));
        CDF_TRY(cdf_tp_linear_load(w, m->tp, &b->k, D, inner, 0, "%s.%lld.layer.0.SelfAttention.k", p, bi));
        CDF_TRY(cdf_tp_linear_load(w, m->tp, &b->v, D, inner, 0, "%s.%lld.layer.0.SelfAttention.v", p, bi));
        CDF_TRY(cdf_tp_linear_load(w, m->tp, &b->o, inner, D, 0, "%s.%lld.layer.0.SelfAttention.o", p, bi));
        CDF_TRY(cdf_norm_load(w, &b->ff_norm, D, 1, 0, m->eps, "%s.%lld.layer.1.layer_norm", p, bi));
        if (m->gated) {
            CDF_TRY(cdf_tp_linear_load(w, m->tp, &b->wi_0, D, F, 0, "%s.%lld.layer.1.DenseReluDense.wi_0", p, bi));
            CDF_TRY(cdf_tp_linear_load(w, m->tp, &b->wi_1, D, F, 0, "%s.%lld.layer.1.DenseReluDense.wi_1", p, bi));
        } else {
            CDF_TRY(cdf_tp_linear_load(w, m->tp, &b->wi, D, F, 0, "%s.%lld.layer.1.DenseReluDense.wi", p, bi));
        }
        CDF_TRY(cdf_tp_linear_load(w, m->tp, &b->wo, F, D, 0, "%s.%lld.layer.1.DenseReluDense.wo", p, bi));
    }
    return cdf_norm_load(w, &m->final_layer_norm, D, 1, 0, m->eps, "encoder.final_layer_norm");
}

static cdf_status t5_load(const char *dir, const cJSON *cfg, const cdf_load_options *opt, void **impl) {
    *impl = NULL;
    cdf_t5_encoder *m = calloc(1, sizeof *m);
    if (!m) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    cdf_status s = parse_config(cfg, m);
    /* sharded when tensor parallelism is on: heads and the feed-forward width must divide */
    if (s == CDF_OK) s = cdf_tp_for_component(dir, "T5EncoderModel", T5_TP_PLAN, &m->tp);
    if (s == CDF_OK) s = cdf_tp_check_divisible(m->tp, "num_heads", m->num_heads);
    if (s == CDF_OK) s = cdf_tp_check_divisible(m->tp, "d_ff", m->d_ff);
    m->local_heads = m->num_heads / cdf_tp_size(m->tp);
    if (s == CDF_OK) s = cdf_model_load_weights(dir, opt, load_weights, m, NULL, NULL);
    if (s != CDF_OK) {
        t5_free(m);
        return s;
    }
    *impl = m;
    return CDF_OK;
}

cdf_status cdf_t5_encoder_load(const char *dir, const cdf_load_options *opt, cdf_t5_encoder **out) {
    if (!out) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_t5_encoder_load: out is NULL");
    void *impl;
    cdf_status s = cdf_component_load_impl(t5_load, "cdf_t5_encoder_load", "T5 encoder", dir, opt, &impl);
    *out = impl;
    return s;
}

void cdf_t5_encoder_free(cdf_t5_encoder *m) { t5_free(m); }
int64_t cdf_t5_encoder_d_model(const cdf_t5_encoder *m) { return m ? m->d_model : 0; }

/* ---- relative position bias ------------------------------------------------------------------ */
int64_t cdf_t5_relative_position_bucket(int64_t relative_position, bool bidirectional, int64_t num_buckets,
                                        int64_t max_distance) {
    int64_t bucket = 0, n = relative_position;
    if (bidirectional) {
        num_buckets /= 2; /* half the buckets for keys after the query, half for keys before */
        if (n > 0) bucket += num_buckets;
        n = n < 0 ? -n : n;
    } else {
        n = n < 0 ? -n : 0; /* only keys at or before the query */
    }
    const int64_t max_exact = num_buckets / 2;
    if (n < max_exact) return bucket + n; /* small distances: one bucket each */
    /* larger ones: logarithmically spaced up to max_distance, all in float32 like torch
     * (relative_position.float() / max_exact, log, / log(max_distance / max_exact), * count) */
    const float ratio = (float)n / (float)max_exact;
    const float log_range = (float)log((double)max_distance / (double)max_exact);
    const float scaled = logf(ratio) / log_range * (float)(num_buckets - max_exact);
    int64_t large = max_exact + (int64_t)scaled; /* .to(torch.long) truncates */
    if (large > num_buckets - 1) large = num_buckets - 1;
    return bucket + large;
}

/* [1, heads, L, L] additive score bias: bias[h][i][j] = table[bucket(j - i)][h], for this rank's
 * heads (the table holds only those). The buckets depend on L only (computed here, uploaded);
 * the values are gathered from the table on the device. */
static cdf_tensor *make_position_bias(const cdf_t5_encoder *m, cdf_device *dev, int64_t L) {
    const int64_t Hn = m->local_heads;
    int64_t *buckets = malloc((size_t)(L * L) * sizeof *buckets), *bucket_of = malloc((size_t)(2 * L - 1) * sizeof *bucket_of);
    if (!buckets || !bucket_of) {
        free(buckets);
        free(bucket_of);
        cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (T5 position buckets %lld x %lld)", (long long)L, (long long)L);
        return NULL;
    }
    for (int64_t d = -(L - 1); d <= L - 1; d++) /* index d + L - 1 */
        bucket_of[d + L - 1] = cdf_t5_relative_position_bucket(d, true, m->num_buckets, m->max_distance);
    for (int64_t i = 0; i < L; i++)
        for (int64_t j = 0; j < L; j++) buckets[i * L + j] = bucket_of[j - i + L - 1];
    cdf_tensor *ids = cdf_tensor_from_host(dev, CDF_I64, 1, (int64_t[]){L * L}, buckets, CDF_I64);
    free(buckets);
    free(bucket_of);
    cdf_tensor *rows = cdf_reshape(cdf_embedding(m->relative_bias, ids), 3, (int64_t[]){L, L, Hn}); /* [i, j, h] */
    return cdf_contiguous(cdf_unsqueeze(cdf_permute(rows, (int[]){2, 0, 1}), 0));
}

/* ---- forward ---------------------------------------------------------------------------------- */
/* [B, L, heads * d_kv] -> [B, heads, L, d_kv] (a view); this rank's heads */
static cdf_tensor *split_heads(const cdf_t5_encoder *m, cdf_tensor *x, int64_t B, int64_t L) {
    return cdf_transpose(cdf_reshape(x, 4, (int64_t[]){B, L, m->local_heads, m->d_kv}), 1, 2);
}

static cdf_tensor *block_forward(const cdf_t5_encoder *m, const t5_block *b, cdf_tensor *x, cdf_tensor *position_bias,
                                 int64_t B, int64_t L) {
    /* self-attention: softmax(q k^T + bias) v, unscaled (T5 folds the scaling into its init) */
    cdf_tensor *h = cdf_rms_norm(x, b->attn_norm.w, b->attn_norm.eps);
    cdf_tensor *q = split_heads(m, cdf_linear_fwd(&b->q, h), B, L); /* [B, heads, L, d_kv] */
    cdf_tensor *k = split_heads(m, cdf_linear_fwd(&b->k, h), B, L);
    cdf_tensor *v = split_heads(m, cdf_linear_fwd(&b->v, h), B, L);
    cdf_tensor *a = cdf_sdpa(q, k, v, position_bias, 1.0f);
    a = cdf_reshape(cdf_transpose(a, 1, 2), 3, (int64_t[]){B, L, m->local_heads * m->d_kv});
    x = cdf_add(x, cdf_linear_fwd(&b->o, a));
    /* feed-forward                                                                [B, L, d_ff] */
    h = cdf_rms_norm(x, b->ff_norm.w, b->ff_norm.eps);
    cdf_tensor *f = m->gated ? cdf_mul(cdf_act_fwd(m->act, cdf_linear_fwd(&b->wi_0, h)), cdf_linear_fwd(&b->wi_1, h))
                             : cdf_act_fwd(m->act, cdf_linear_fwd(&b->wi, h));
    return cdf_add(x, cdf_linear_fwd(&b->wo, f));
}

cdf_status cdf_t5_encode(cdf_t5_encoder *m, cdf_tensor *input_ids, cdf_tensor **last_hidden_state) {
    if (!last_hidden_state) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_t5_encode: last_hidden_state is NULL");
    *last_hidden_state = NULL;
    if (!m) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_t5_encode: model is NULL");
    if (!input_ids) return cdf_error(CDF_ERR_INVALID_ARG, "T5 encoder: input_ids is NULL");
    char d[96];
    const cdf_dtype dt = cdf_tensor_dtype(input_ids);
    if (cdf_tensor_ndim(input_ids) != 2 || (dt != CDF_I64 && dt != CDF_I32))
        return cdf_error(CDF_ERR_SHAPE, "T5 encoder: input_ids %s must be [batch, seq] i64 or i32",
                         cdf_tensor_describe(input_ids, d, sizeof d));
    const int64_t B = cdf_tensor_dim(input_ids, 0), L = cdf_tensor_dim(input_ids, 1);
    /* the bias is materialised [heads, L, L]: bound L (the pipelines use <= 512). The ids' values
     * are checked by the embedding lookup on the device (an id outside the vocabulary fails that
     * op, reported at the next sync): no host read in the forward. */
    if (B < 1 || L < 1 || L > 16384)
        return cdf_error(CDF_ERR_SHAPE, "T5 encoder: input_ids %s needs batch >= 1 and 1 <= seq <= 16384",
                         cdf_tensor_describe(input_ids, d, sizeof d));
    cdf_device *dev = cdf_tensor_device(m->shared);
    cdf_status s;

    cdf_scope_push();
    cdf_tensor *x = cdf_cast(cdf_embedding(m->shared, input_ids), CDF_F32); /* [B, L, d_model] */
    cdf_tensor *position_bias = make_position_bias(m, dev, L);           /* [1, heads, L, L] */
    for (int64_t i = 0; i < m->num_layers && x && position_bias; i++) {
        cdf_scope_push();
        x = block_forward(m, &m->blocks[i], x, position_bias, B, L);
        cdf_scope_pop(&x, 1);
    }
    cdf_tensor *out = position_bias ? cdf_rms_norm(x, m->final_layer_norm.w, m->final_layer_norm.eps) : NULL;
    s = out ? cdf_device_synchronize(dev) : (cdf_last_status() ? cdf_last_status() : CDF_ERR_INTERNAL);
    if (s != CDF_OK) {
        cdf_scope_pop(NULL, 0);
        return s;
    }
    cdf_scope_pop(&out, 1);
    *last_hidden_state = out;
    return CDF_OK;
}

/* ---- component ---------------------------------------------------------------------------------- */
static cdf_status t5_run(void *impl, const char *method, const cdf_tensor_map *in, cdf_tensor_map *out) {
    if (method && strcmp(method, "forward") != 0)
        return cdf_error(CDF_ERR_UNSUPPORTED, "T5 encoder: method '%s' is not supported (only forward)", method);
    if (cdf_input_opt(in, "attention_mask"))
        return cdf_error(CDF_ERR_UNSUPPORTED,
                         "T5 encoder: a padding attention_mask is not supported (the FLUX/SD3 pipelines pass none)");
    cdf_tensor *ids = cdf_input(in, "input_ids", "T5 encoder");
    if (!ids) return cdf_last_status();
    cdf_tensor *h;
    CDF_TRY(cdf_t5_encode(impl, ids, &h));
    return cdf_tensor_map_set(out, "out.last_hidden_state", h);
}

const cdf_component_class cdf_t5_encoder_class = {
    .names = (const char *const[]){"T5EncoderModel", NULL},
    .load = t5_load,
    .free = t5_free,
    .run = t5_run,
};
