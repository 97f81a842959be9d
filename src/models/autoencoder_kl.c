/* AutoencoderKL (diffusers models/autoencoders/autoencoder_kl.py + vae.py Encoder/Decoder +
 * unet_2d_blocks.py DownEncoderBlock2D / UpDecoderBlock2D / UNetMidBlock2D + resnet.py
 * ResnetBlock2D + downsampling.py Downsample2D + upsampling.py Upsample2D + the mid-block
 * Attention with AttnProcessor2_0), the VAE of FLUX.1 and SD3. The shared pieces are declared in
 * vae.h so that AutoencoderKLFlux2 reuses them.
 *
 * Memory: the decoder of a 1024x1024 image holds 128-channel 1024x1024 activations (512 MB each
 * in f32). Every forward below therefore keeps its current activation as a reference it owns
 * (recorded in no scope) and replaces it step by step with STEP(), which computes the next value
 * inside a fresh scope and then releases the previous one: the peak is the input of a step, its
 * temporaries and its result, as in PyTorch's eager execution. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/error_internal.h"
#include "models/component.h"
#include "models/vae.h"
#include "io/json.h"

/* GroupNorm eps everywhere in the VAE (Encoder/Decoder pass resnet_eps=1e-6 and eps=1e-6). */
#define VAE_NORM_EPS 1e-6f

/* Replace the owned activation `h` by the value of `expr` (which may read h). expr's temporaries
 * and the old h are released before the next step. NULL propagates (ops accept NULL inputs). */
#define STEP(h, expr)                                                                                              \
    do {                                                                                                           \
        cdf_scope_push();                                                                                          \
        cdf_tensor *step_next_ = cdf_tensor_retain(expr);                                                          \
        cdf_scope_pop(NULL, 0);                                                                                    \
        cdf_tensor_release(h);                                                                                     \
        (h) = step_next_;                                                                                          \
    } while (0)

/* Workaround (see the report to the lead): the eager cpu queue lets the host run up to 4096 ops
 * ahead of the kernels, and a buffer the model releases is only freed once the queued ops that
 * read it have run. Without a bound, a whole 1024x1024 decode (a few hundred ops) is allocated
 * before its first convolution finishes, whatever the model releases. Waiting for the device after
 * each block keeps the peak at about one block's activations; a big block's kernels dwarf the lost
 * host/device overlap. On a queued kernel's failure the activation becomes NULL with the error
 * set, like any failed op. Remove once the queue bounds its run-ahead by bytes. */
static cdf_tensor *settle(cdf_tensor *owned) {
    if (owned && cdf_device_synchronize(cdf_tensor_device(owned)) != CDF_OK) {
        cdf_tensor_release(owned);
        return NULL;
    }
    return owned;
}

/* Hand an owned activation back to the caller like an op result (recorded in its scope). */
static cdf_tensor *to_scope(cdf_tensor *owned) {
    cdf_tensor *r = cdf_contiguous(owned);
    cdf_tensor_release(owned);
    return r;
}

/* ==== config ================================================================================ */

cdf_vae_config cdf_vae_config_kl_defaults(void) {
    cdf_vae_config c;
    memset(&c, 0, sizeof c);
    c.in_channels = 3;
    c.out_channels = 3;
    c.latent_channels = 4;
    c.layers_per_block = 1;
    c.norm_num_groups = 32;
    c.n_blocks = 1;
    c.block_out_channels[0] = 64;
    c.decoder_block_out_channels[0] = 64;
    c.act_fn = CDF_VAE_ACT_SILU;
    c.mid_block_add_attention = true;
    c.use_quant_conv = true;
    c.use_post_quant_conv = true;
    c.force_upcast = true;
    c.scaling_factor = 0.18215;
    c.has_shift_factor = false;
    c.shift_factor = 0.0;
    c.sample_size = 32;
    return c;
}

/* down_block_types / up_block_types: every entry must be `want` (get_down_block/get_up_block
 * also accept it with a "UNetRes" prefix). Absent/null -> diffusers' default of one entry. */
static cdf_status parse_block_types(const cJSON *cfg, const char *key, const char *want, const char *source, int *n) {
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (!arr || cJSON_IsNull(arr)) {
        *n = 1;
        return CDF_OK;
    }
    if (!cJSON_IsArray(arr)) return cdf_error(CDF_ERR_FORMAT, "%s: \"%s\" must be an array of strings", source, key);
    int i = 0;
    for (const cJSON *e = arr->child; e; e = e->next, i++) {
        if (i >= CDF_VAE_MAX_BLOCKS)
            return cdf_error(CDF_ERR_LIMIT, "%s: \"%s\" has more than %d entries", source, key, CDF_VAE_MAX_BLOCKS);
        if (!cJSON_IsString(e)) return cdf_error(CDF_ERR_FORMAT, "%s: \"%s\"[%d] is not a string", source, key, i);
        const char *s = e->valuestring;
        if (strncmp(s, "UNetRes", 7) == 0) s += 7;
        if (strcmp(s, want) != 0)
            return cdf_error(CDF_ERR_UNSUPPORTED, "%s: \"%s\"[%d] = \"%s\" is not supported (only %s)", source, key, i,
                             e->valuestring, want);
    }
    *n = i;
    return CDF_OK;
}

cdf_status cdf_vae_config_parse(const cJSON *cfg, const cdf_vae_config *defaults, const char *source,
                                cdf_vae_config *out) {
    cdf_vae_config c = *defaults;
    CDF_TRY(cdf_json_get_int(cfg, "in_channels", c.in_channels, &c.in_channels));
    CDF_TRY(cdf_json_get_int(cfg, "out_channels", c.out_channels, &c.out_channels));
    CDF_TRY(cdf_json_get_int(cfg, "latent_channels", c.latent_channels, &c.latent_channels));
    CDF_TRY(cdf_json_get_int(cfg, "layers_per_block", c.layers_per_block, &c.layers_per_block));
    CDF_TRY(cdf_json_get_int(cfg, "norm_num_groups", c.norm_num_groups, &c.norm_num_groups));
    if (cdf_json_has(cfg, "block_out_channels")) {
        int n = 0;
        CDF_TRY(cdf_json_get_int_array(cfg, "block_out_channels", c.block_out_channels, CDF_VAE_MAX_BLOCKS, &n));
        c.n_blocks = n;
    }
    memcpy(c.decoder_block_out_channels, c.block_out_channels, sizeof c.block_out_channels);
    int n_down = 0, n_up = 0;
    CDF_TRY(parse_block_types(cfg, "down_block_types", "DownEncoderBlock2D", source, &n_down));
    CDF_TRY(parse_block_types(cfg, "up_block_types", "UpDecoderBlock2D", source, &n_up));
    if (n_down != c.n_blocks || n_up != c.n_blocks)
        return cdf_error(CDF_ERR_FORMAT,
                         "%s: down_block_types (%d entries) and up_block_types (%d entries) must have one entry per "
                         "block_out_channels entry (%d)",
                         source, n_down, n_up, c.n_blocks);
    const char *act = NULL;
    CDF_TRY(cdf_json_get_string(cfg, "act_fn", "silu", &act));
    /* get_activation lower-cases the name */
    if (strcasecmp(act, "silu") == 0 || strcasecmp(act, "swish") == 0) c.act_fn = CDF_VAE_ACT_SILU;
    else if (strcasecmp(act, "gelu") == 0) c.act_fn = CDF_VAE_ACT_GELU;
    else if (strcasecmp(act, "relu") == 0) c.act_fn = CDF_VAE_ACT_RELU;
    else return cdf_error(CDF_ERR_UNSUPPORTED, "%s: act_fn \"%s\" is not supported (silu, swish, gelu, relu)", source, act);
    CDF_TRY(cdf_json_get_bool(cfg, "mid_block_add_attention", c.mid_block_add_attention, &c.mid_block_add_attention));
    CDF_TRY(cdf_json_get_bool(cfg, "use_quant_conv", c.use_quant_conv, &c.use_quant_conv));
    CDF_TRY(cdf_json_get_bool(cfg, "use_post_quant_conv", c.use_post_quant_conv, &c.use_post_quant_conv));
    CDF_TRY(cdf_json_get_bool(cfg, "force_upcast", c.force_upcast, &c.force_upcast));
    CDF_TRY(cdf_json_get_double(cfg, "scaling_factor", c.scaling_factor, &c.scaling_factor));
    if (cdf_json_has(cfg, "shift_factor")) {
        CDF_TRY(cdf_json_get_double(cfg, "shift_factor", 0.0, &c.shift_factor));
        c.has_shift_factor = true;
    }
    /* sample_size: an int or a list (diffusers then uses its first entry) */
    const cJSON *ss = cJSON_GetObjectItemCaseSensitive(cfg, "sample_size");
    if (ss && cJSON_IsArray(ss)) {
        ss = ss->child;
        if (!ss || !cJSON_IsNumber(ss))
            return cdf_error(CDF_ERR_FORMAT, "%s: \"sample_size\" must be an integer or a list of integers", source);
        c.sample_size = (int64_t)ss->valuedouble;
    } else {
        CDF_TRY(cdf_json_get_int(cfg, "sample_size", c.sample_size, &c.sample_size));
    }
    CDF_TRY(cdf_vae_config_validate(&c, source));
    *out = c;
    return CDF_OK;
}

static cdf_status check_size(const char *source, const char *key, int64_t v, int64_t lo, int64_t hi) {
    if (v < lo || v > hi)
        return cdf_error(CDF_ERR_FORMAT, "%s: %s = %lld is out of range [%lld, %lld]", source, key, (long long)v,
                         (long long)lo, (long long)hi);
    return CDF_OK;
}

cdf_status cdf_vae_config_validate(const cdf_vae_config *c, const char *source) {
    CDF_TRY(check_size(source, "in_channels", c->in_channels, 1, CDF_VAE_MAX_CHANNELS));
    CDF_TRY(check_size(source, "out_channels", c->out_channels, 1, CDF_VAE_MAX_CHANNELS));
    CDF_TRY(check_size(source, "latent_channels", c->latent_channels, 1, CDF_VAE_MAX_CHANNELS));
    CDF_TRY(check_size(source, "layers_per_block", c->layers_per_block, 1, CDF_VAE_MAX_LAYERS_PER_BLOCK));
    CDF_TRY(check_size(source, "norm_num_groups", c->norm_num_groups, 1, CDF_VAE_MAX_CHANNELS));
    if (c->n_blocks < 1 || c->n_blocks > CDF_VAE_MAX_BLOCKS)
        return cdf_error(CDF_ERR_FORMAT, "%s: block_out_channels has %d entries (need 1..%d)", source, c->n_blocks,
                         CDF_VAE_MAX_BLOCKS);
    CDF_TRY(check_size(source, "sample_size", c->sample_size, 1, 1 << 20));
    if (!(c->scaling_factor > 0))
        return cdf_error(CDF_ERR_FORMAT, "%s: scaling_factor = %g must be positive", source, c->scaling_factor);
    for (int pass = 0; pass < 2; pass++) {
        const char *key = pass ? "decoder_block_out_channels" : "block_out_channels";
        const int64_t *ch = pass ? c->decoder_block_out_channels : c->block_out_channels;
        for (int i = 0; i < c->n_blocks; i++) {
            char name[64];
            snprintf(name, sizeof name, "%s[%d]", key, i);
            CDF_TRY(check_size(source, name, ch[i], 1, CDF_VAE_MAX_CHANNELS));
            /* every block's GroupNorms (and the mid block's, conv_norm_out's) have ch[i] channels */
            if (ch[i] % c->norm_num_groups)
                return cdf_error(CDF_ERR_FORMAT,
                                 "%s: %s = %lld is not divisible by norm_num_groups = %lld (GroupNorm needs whole "
                                 "groups)",
                                 source, name, (long long)ch[i], (long long)c->norm_num_groups);
        }
    }
    return CDF_OK;
}

/* ==== loading =============================================================================== */

static cdf_status resnet_load(cdf_weights *w, cdf_vae_resnet *r, int64_t cin, int64_t cout, const char *prefix) {
    memset(r, 0, sizeof *r);
    CDF_TRY(cdf_norm_load(w, &r->norm1, cin, 1, 1, VAE_NORM_EPS, "%s.norm1", prefix));
    CDF_TRY(cdf_conv_load(w, &r->conv1, cin, cout, 3, 1, 1, 1, "%s.conv1", prefix));
    CDF_TRY(cdf_norm_load(w, &r->norm2, cout, 1, 1, VAE_NORM_EPS, "%s.norm2", prefix));
    CDF_TRY(cdf_conv_load(w, &r->conv2, cout, cout, 3, 1, 1, 1, "%s.conv2", prefix));
    r->has_conv_shortcut = cin != cout;
    if (r->has_conv_shortcut) CDF_TRY(cdf_conv_load(w, &r->conv_shortcut, cin, cout, 1, 1, 0, 1, "%s.conv_shortcut", prefix));
    return CDF_OK;
}

static void resnet_free(cdf_vae_resnet *r) {
    cdf_norm_free(&r->norm1);
    cdf_norm_free(&r->norm2);
    cdf_conv_free(&r->conv1);
    cdf_conv_free(&r->conv2);
    cdf_conv_free(&r->conv_shortcut);
}

static cdf_status attention_load(cdf_weights *w, cdf_vae_attention *a, int64_t ch, const char *prefix) {
    memset(a, 0, sizeof *a);
    CDF_TRY(cdf_norm_load(w, &a->group_norm, ch, 1, 1, VAE_NORM_EPS, "%s.group_norm", prefix));
    /* Checkpoints saved before diffusers 0.15 name the projections query/key/value/proj_attn;
     * diffusers renames them on load (_convert_deprecated_attention_blocks), so do we. */
    bool old = !cdf_weights_has(w, "%s.to_q.weight", prefix) && cdf_weights_has(w, "%s.query.weight", prefix);
    CDF_TRY(cdf_linear_load(w, &a->to_q, ch, ch, 1, "%s.%s", prefix, old ? "query" : "to_q"));
    CDF_TRY(cdf_linear_load(w, &a->to_k, ch, ch, 1, "%s.%s", prefix, old ? "key" : "to_k"));
    CDF_TRY(cdf_linear_load(w, &a->to_v, ch, ch, 1, "%s.%s", prefix, old ? "value" : "to_v"));
    CDF_TRY(cdf_linear_load(w, &a->to_out, ch, ch, 1, "%s.%s", prefix, old ? "proj_attn" : "to_out.0"));
    return CDF_OK;
}

static void attention_free(cdf_vae_attention *a) {
    cdf_norm_free(&a->group_norm);
    cdf_linear_free(&a->to_q);
    cdf_linear_free(&a->to_k);
    cdf_linear_free(&a->to_v);
    cdf_linear_free(&a->to_out);
}

static cdf_status mid_block_load(cdf_weights *w, cdf_vae_mid_block *m, int64_t ch, bool add_attention, const char *prefix) {
    char p[256];
    memset(m, 0, sizeof *m);
    snprintf(p, sizeof p, "%s.resnets.0", prefix);
    CDF_TRY(resnet_load(w, &m->resnets[0], ch, ch, p));
    m->has_attention = add_attention;
    if (add_attention) {
        snprintf(p, sizeof p, "%s.attentions.0", prefix);
        CDF_TRY(attention_load(w, &m->attention, ch, p));
    }
    snprintf(p, sizeof p, "%s.resnets.1", prefix);
    return resnet_load(w, &m->resnets[1], ch, ch, p);
}

static void mid_block_free(cdf_vae_mid_block *m) {
    resnet_free(&m->resnets[0]);
    resnet_free(&m->resnets[1]);
    attention_free(&m->attention);
}

/* One DownEncoderBlock2D / UpDecoderBlock2D: n resnets cin->cout, cout->cout, ..., then the
 * sampler ("downsamplers.0.conv": 3x3 stride 2 pad 0 after an explicit (0,1,0,1) pad, or
 * "upsamplers.0.conv": 3x3 pad 1 after nearest x2). */
static cdf_status block_load(cdf_weights *w, cdf_vae_block *b, int n, int64_t cin, int64_t cout, bool down,
                             bool has_sampler, const char *prefix) {
    memset(b, 0, sizeof *b);
    b->resnets = calloc((size_t)n, sizeof *b->resnets);
    if (!b->resnets) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (%s)", prefix);
    b->n_resnets = n;
    char p[256];
    for (int j = 0; j < n; j++) {
        snprintf(p, sizeof p, "%s.resnets.%d", prefix, j);
        CDF_TRY(resnet_load(w, &b->resnets[j], j == 0 ? cin : cout, cout, p));
    }
    b->has_sampler = has_sampler;
    if (has_sampler) {
        if (down) CDF_TRY(cdf_conv_load(w, &b->sampler, cout, cout, 3, 2, 0, 1, "%s.downsamplers.0.conv", prefix));
        else CDF_TRY(cdf_conv_load(w, &b->sampler, cout, cout, 3, 1, 1, 1, "%s.upsamplers.0.conv", prefix));
    }
    return CDF_OK;
}

static void block_free(cdf_vae_block *b) {
    for (int j = 0; j < b->n_resnets; j++) resnet_free(&b->resnets[j]);
    free(b->resnets);
    b->resnets = NULL;
    b->n_resnets = 0;
    cdf_conv_free(&b->sampler);
}

/* vae.py Encoder(double_z=True). */
static cdf_status encoder_load(cdf_weights *w, const cdf_vae_config *c, cdf_vae_encoder *e) {
    const int64_t *ch = c->block_out_channels;
    const int n = c->n_blocks;
    e->n_blocks = n;
    e->groups = (int)c->norm_num_groups;
    e->act = c->act_fn;
    CDF_TRY(cdf_conv_load(w, &e->conv_in, c->in_channels, ch[0], 3, 1, 1, 1, "encoder.conv_in"));
    int64_t out_ch = ch[0];
    for (int i = 0; i < n; i++) {
        int64_t in_ch = out_ch;
        out_ch = ch[i];
        char p[64];
        snprintf(p, sizeof p, "encoder.down_blocks.%d", i);
        CDF_TRY(block_load(w, &e->down_blocks[i], (int)c->layers_per_block, in_ch, out_ch, true, i < n - 1, p));
    }
    CDF_TRY(mid_block_load(w, &e->mid_block, ch[n - 1], c->mid_block_add_attention, "encoder.mid_block"));
    CDF_TRY(cdf_norm_load(w, &e->conv_norm_out, ch[n - 1], 1, 1, VAE_NORM_EPS, "encoder.conv_norm_out"));
    return cdf_conv_load(w, &e->conv_out, ch[n - 1], 2 * c->latent_channels, 3, 1, 1, 1, "encoder.conv_out");
}

static void encoder_free(cdf_vae_encoder *e) {
    cdf_conv_free(&e->conv_in);
    for (int i = 0; i < CDF_VAE_MAX_BLOCKS; i++) block_free(&e->down_blocks[i]);
    mid_block_free(&e->mid_block);
    cdf_norm_free(&e->conv_norm_out);
    cdf_conv_free(&e->conv_out);
}

/* vae.py Decoder(norm_type="group"): up blocks walk the channels in reverse and have
 * layers_per_block + 1 resnets each. */
static cdf_status decoder_load(cdf_weights *w, const cdf_vae_config *c, cdf_vae_decoder *d) {
    const int64_t *ch = c->decoder_block_out_channels;
    const int n = c->n_blocks;
    d->n_blocks = n;
    d->groups = (int)c->norm_num_groups;
    d->act = c->act_fn;
    CDF_TRY(cdf_conv_load(w, &d->conv_in, c->latent_channels, ch[n - 1], 3, 1, 1, 1, "decoder.conv_in"));
    CDF_TRY(mid_block_load(w, &d->mid_block, ch[n - 1], c->mid_block_add_attention, "decoder.mid_block"));
    int64_t out_ch = ch[n - 1];
    for (int i = 0; i < n; i++) {
        int64_t prev_ch = out_ch;
        out_ch = ch[n - 1 - i];
        char p[64];
        snprintf(p, sizeof p, "decoder.up_blocks.%d", i);
        CDF_TRY(block_load(w, &d->up_blocks[i], (int)c->layers_per_block + 1, prev_ch, out_ch, false, i < n - 1, p));
    }
    CDF_TRY(cdf_norm_load(w, &d->conv_norm_out, ch[0], 1, 1, VAE_NORM_EPS, "decoder.conv_norm_out"));
    return cdf_conv_load(w, &d->conv_out, ch[0], c->out_channels, 3, 1, 1, 1, "decoder.conv_out");
}

static void decoder_free(cdf_vae_decoder *d) {
    cdf_conv_free(&d->conv_in);
    mid_block_free(&d->mid_block);
    for (int i = 0; i < CDF_VAE_MAX_BLOCKS; i++) block_free(&d->up_blocks[i]);
    cdf_norm_free(&d->conv_norm_out);
    cdf_conv_free(&d->conv_out);
}

cdf_status cdf_autoencoder_kl_load_weights(cdf_weights *w, const cdf_vae_config *c, cdf_autoencoder_kl *m) {
    memset(m, 0, sizeof *m);
    cdf_status s = cdf_vae_config_validate(c, cdf_weights_path(w));
    if (s != CDF_OK) return s;
    m->config = *c;
    const int64_t L = c->latent_channels;
    s = encoder_load(w, c, &m->encoder);
    if (s == CDF_OK) s = decoder_load(w, c, &m->decoder);
    m->has_quant_conv = c->use_quant_conv;
    m->has_post_quant_conv = c->use_post_quant_conv;
    if (s == CDF_OK && c->use_quant_conv) s = cdf_conv_load(w, &m->quant_conv, 2 * L, 2 * L, 1, 1, 0, 1, "quant_conv");
    if (s == CDF_OK && c->use_post_quant_conv)
        s = cdf_conv_load(w, &m->post_quant_conv, L, L, 1, 1, 0, 1, "post_quant_conv");
    if (s != CDF_OK) {
        cdf_autoencoder_kl_release(m);
        return s;
    }
    return CDF_OK;
}

void cdf_autoencoder_kl_release(cdf_autoencoder_kl *m) {
    if (!m) return;
    encoder_free(&m->encoder);
    decoder_free(&m->decoder);
    cdf_conv_free(&m->quant_conv);
    cdf_conv_free(&m->post_quant_conv);
    memset(m, 0, sizeof *m);
}

/* ==== forward =============================================================================== */

static cdf_tensor *activation(cdf_tensor *x, cdf_vae_act act) {
    switch (act) {
    case CDF_VAE_ACT_GELU: return cdf_gelu(x, CDF_GELU_ERF);
    case CDF_VAE_ACT_RELU: return cdf_relu(x);
    case CDF_VAE_ACT_SILU: break;
    }
    return cdf_silu(x);
}

static cdf_tensor *group_norm(const cdf_norm_layer *n, int groups, cdf_tensor *x) {
    return cdf_group_norm(x, groups, n->w, n->b, n->eps);
}

/* ResnetBlock2D (temb None, time_embedding_norm "default", output_scale_factor 1):
 * x + conv2(act(norm2(conv1(act(norm1(x)))))), the residual through conv_shortcut when the
 * channel count changes. Dropout is the identity in eval. */
static cdf_tensor *resnet_forward(const cdf_vae_resnet *r, int groups, cdf_vae_act act, cdf_tensor *x) {
    cdf_tensor *h = cdf_tensor_retain(x);                   /* [B, Cin, H, W] */
    STEP(h, activation(group_norm(&r->norm1, groups, h), act));
    STEP(h, cdf_conv_fwd(&r->conv1, h));                    /* [B, Cout, H, W] */
    STEP(h, activation(group_norm(&r->norm2, groups, h), act));
    STEP(h, cdf_conv_fwd(&r->conv2, h));
    STEP(h, cdf_add(r->has_conv_shortcut ? cdf_conv_fwd(&r->conv_shortcut, x) : x, h));
    return to_scope(h);
}

/* The mid-block Attention (heads = 1, head dim = C, bias, group norm, residual connection,
 * rescale_output_factor 1) as AttnProcessor2_0 runs it on a 4-D input: group norm over the
 * channels, tokens = the H*W positions, softmax(q k^T / sqrt(C)) v, to_out, back to NCHW, + x. */
static cdf_tensor *attention_forward(const cdf_vae_attention *a, int groups, cdf_tensor *x) {
    const int64_t B = cdf_tensor_dim(x, 0), C = cdf_tensor_dim(x, 1), H = cdf_tensor_dim(x, 2), W = cdf_tensor_dim(x, 3);
    const int64_t tok_shape[3] = {B, C, H * W}, img_shape[4] = {B, C, H, W};
    cdf_tensor *h = cdf_tensor_retain(x);
    STEP(h, group_norm(&a->group_norm, groups, h));
    STEP(h, cdf_contiguous(cdf_transpose(cdf_reshape(h, 3, tok_shape), 1, 2))); /* [B, HW, C] */
    STEP(h, cdf_squeeze(cdf_sdpa(cdf_unsqueeze(cdf_linear_fwd(&a->to_q, h), 1),  /* [B, 1, HW, C] */
                                 cdf_unsqueeze(cdf_linear_fwd(&a->to_k, h), 1),
                                 cdf_unsqueeze(cdf_linear_fwd(&a->to_v, h), 1), NULL, 0.0f),
                        1));                                                      /* [B, HW, C] */
    STEP(h, cdf_linear_fwd(&a->to_out, h));
    STEP(h, cdf_add(cdf_reshape(cdf_transpose(h, 1, 2), 4, img_shape), x)); /* [B, C, H, W] */
    return to_scope(h);
}

/* UNetMidBlock2D (num_layers 1): resnets[0], attentions[0] (if any), resnets[1]. */
static cdf_tensor *mid_block_forward(const cdf_vae_mid_block *m, int groups, cdf_vae_act act, cdf_tensor *x) {
    cdf_tensor *h = cdf_tensor_retain(x);
    STEP(h, resnet_forward(&m->resnets[0], groups, act, h));
    if (m->has_attention) STEP(h, attention_forward(&m->attention, groups, h));
    STEP(h, resnet_forward(&m->resnets[1], groups, act, h));
    return to_scope(h);
}

cdf_tensor *cdf_vae_encoder_forward(const cdf_vae_encoder *e, cdf_tensor *x) {
    if (!x) return NULL;
    const int64_t pad_right_bottom[4] = {0, 1, 0, 1}; /* Downsample2D(padding=0): F.pad(x, (0, 1, 0, 1)) */
    cdf_tensor *h = cdf_tensor_retain(x);             /* [B, in, H, W] */
    STEP(h, cdf_conv_fwd(&e->conv_in, h));            /* [B, ch[0], H, W] */
    for (int i = 0; i < e->n_blocks; i++) {
        const cdf_vae_block *b = &e->down_blocks[i];
        for (int j = 0; j < b->n_resnets; j++) {
            STEP(h, resnet_forward(&b->resnets[j], e->groups, e->act, h));
            h = settle(h);
        }
        if (b->has_sampler) STEP(h, cdf_conv_fwd(&b->sampler, cdf_pad(h, 2, pad_right_bottom, 0.0))); /* H/2, W/2 */
    }
    STEP(h, mid_block_forward(&e->mid_block, e->groups, e->act, h));
    h = settle(h);
    STEP(h, cdf_silu(group_norm(&e->conv_norm_out, e->groups, h))); /* conv_act is nn.SiLU() whatever act_fn */
    STEP(h, cdf_conv_fwd(&e->conv_out, h));                         /* [B, 2L, H/f, W/f] */
    return to_scope(h);
}

cdf_tensor *cdf_vae_decoder_forward(const cdf_vae_decoder *d, cdf_tensor *z) {
    if (!z) return NULL;
    cdf_tensor *h = cdf_tensor_retain(z);  /* [B, L, h, w] */
    STEP(h, cdf_conv_fwd(&d->conv_in, h)); /* [B, ch[-1], h, w] */
    STEP(h, mid_block_forward(&d->mid_block, d->groups, d->act, h));
    h = settle(h);
    for (int i = 0; i < d->n_blocks; i++) {
        const cdf_vae_block *b = &d->up_blocks[i];
        for (int j = 0; j < b->n_resnets; j++) {
            STEP(h, resnet_forward(&b->resnets[j], d->groups, d->act, h));
            h = settle(h);
        }
        if (b->has_sampler) STEP(h, cdf_conv_fwd(&b->sampler, cdf_upsample_nearest(h, 2, 2))); /* 2h, 2w */
    }
    STEP(h, cdf_silu(group_norm(&d->conv_norm_out, d->groups, h)));
    STEP(h, cdf_conv_fwd(&d->conv_out, h)); /* [B, out, h*f, w*f] */
    return to_scope(h);
}

/* Inputs are NCHW with the configured channel count; activations are f32. */
static cdf_tensor *check_input(cdf_tensor *t, int64_t channels, const char *what) {
    if (!t) return NULL;
    char buf[128];
    if (cdf_tensor_ndim(t) != 4 || cdf_tensor_dim(t, 1) != channels) {
        cdf_error(CDF_ERR_SHAPE, "AutoencoderKL: %s is %s but must be [batch, %lld, height, width]", what,
                  cdf_tensor_describe(t, buf, sizeof buf), (long long)channels);
        return NULL;
    }
    return cdf_tensor_dtype(t) == CDF_F32 ? cdf_contiguous(t) : cdf_cast(t, CDF_F32);
}

/* ==== tiling (diffusers AutoencoderKL.tiled_decode / _tiled_encode) ============================ */

cdf_vae_tiling cdf_vae_tiling_with_size(const cdf_vae_config *c, int64_t sample) {
    cdf_vae_tiling t = {.enabled = true, .tile_sample_min_size = sample, .tile_overlap_factor = 0.25};
    /* int(sample_size / (2 ** (len(block_out_channels) - 1))): a float division, truncated */
    t.tile_latent_min_size = (int64_t)((double)sample / ldexp(1.0, c->n_blocks - 1));
    return t;
}

cdf_vae_tiling cdf_vae_tiling_default(const cdf_vae_config *c) { return cdf_vae_tiling_with_size(c, c->sample_size); }

/* Python's int(size * factor) on doubles (truncation toward zero; sizes are positive). */
static int64_t py_int_mul(int64_t size, double factor) { return (int64_t)((double)size * factor); }

cdf_status cdf_vae_tiling_validate(const cdf_vae_tiling *t) {
    if (!t || !t->enabled) return CDF_OK;
    if (t->tile_sample_min_size < 1 || t->tile_sample_min_size > (1 << 20))
        return cdf_error(CDF_ERR_INVALID_ARG, "VAE tiling: tile_sample_min_size = %lld is out of range [1, %d]",
                         (long long)t->tile_sample_min_size, 1 << 20);
    if (t->tile_latent_min_size < 1 || t->tile_latent_min_size > (1 << 20))
        return cdf_error(CDF_ERR_INVALID_ARG,
                         "VAE tiling: tile_latent_min_size = %lld is out of range [1, %d] (a sample tile of %lld pixels "
                         "smaller than the VAE's downscaling factor?)",
                         (long long)t->tile_latent_min_size, 1 << 20, (long long)t->tile_sample_min_size);
    if (!(t->tile_overlap_factor >= 0.0 && t->tile_overlap_factor < 1.0))
        return cdf_error(CDF_ERR_INVALID_ARG, "VAE tiling: tile_overlap_factor = %g must be in [0, 1)", t->tile_overlap_factor);
    /* range(0, size, overlap_size) needs a positive step on both sides */
    const double keep = 1.0 - t->tile_overlap_factor;
    if (py_int_mul(t->tile_latent_min_size, keep) < 1 || py_int_mul(t->tile_sample_min_size, keep) < 1)
        return cdf_error(CDF_ERR_INVALID_ARG,
                         "VAE tiling: tiles of %lld pixels / %lld latents with overlap %g leave no step between tiles",
                         (long long)t->tile_sample_min_size, (long long)t->tile_latent_min_size, t->tile_overlap_factor);
    return CDF_OK;
}

/* One optional one-element input, read on the host (a static input of the component). */
static cdf_status tiling_input(const cdf_tensor_map *in, const char *name, const char *model, bool *present, double *v) {
    cdf_tensor *t = cdf_tensor_map_get(in, name);
    *present = t != NULL;
    if (!t) return CDF_OK;
    if (cdf_tensor_numel(t) != 1)
        return cdf_error(CDF_ERR_SHAPE, "%s: input '%s' must have one element (it has %lld)", model, name,
                         (long long)cdf_tensor_numel(t));
    CDF_TRY(cdf_tensor_read(t, CDF_F64, v, sizeof *v));
    if (!isfinite(*v)) return cdf_error(CDF_ERR_INVALID_ARG, "%s: input '%s' is not finite", model, name);
    return CDF_OK;
}

static cdf_status tiling_size_input(double v, const char *name, const char *model, int64_t *out) {
    if (!(v >= 1 && v <= (double)(1 << 20)) || v != floor(v))
        return cdf_error(CDF_ERR_INVALID_ARG, "%s: input '%s' = %g must be a whole number in [1, %d]", model, name, v, 1 << 20);
    *out = (int64_t)v;
    return CDF_OK;
}

cdf_status cdf_vae_tiling_from_inputs(const cdf_vae_config *c, const cdf_tensor_map *in, const char *model, cdf_vae_tiling *t) {
    memset(t, 0, sizeof *t);
    bool has_s, has_l, has_f;
    double vs = 0, vl = 0, vf = 0;
    CDF_TRY(tiling_input(in, "tile_sample_min_size", model, &has_s, &vs));
    CDF_TRY(tiling_input(in, "tile_latent_min_size", model, &has_l, &vl));
    CDF_TRY(tiling_input(in, "tile_overlap_factor", model, &has_f, &vf));
    if (!has_s) {
        if (has_l || has_f)
            return cdf_error(CDF_ERR_INVALID_ARG, "%s: tile_latent_min_size / tile_overlap_factor need tile_sample_min_size "
                             "(which switches tiling on)", model);
        return CDF_OK;
    }
    int64_t sample = 0;
    CDF_TRY(tiling_size_input(vs, "tile_sample_min_size", model, &sample));
    *t = cdf_vae_tiling_with_size(c, sample);
    if (has_l) CDF_TRY(tiling_size_input(vl, "tile_latent_min_size", model, &t->tile_latent_min_size));
    if (has_f) t->tile_overlap_factor = vf;
    cdf_status s = cdf_vae_tiling_validate(t);
    if (s != CDF_OK) cdf_error_prefix("%s: ", model);
    return s;
}

/* blend_v (dim 2) / blend_h (dim 3): the first e rows/columns of b become
 * a[-e + y] * (1 - y / e) + b[y] * (y / e), e = min(a's extent, b's extent, blend_extent). The
 * weights are Python floats (double), which torch applies to float32 tensors as float32 scalars:
 * two float32 products and a float32 sum, as here. Returns b blended (recorded in the scope). */
static cdf_tensor *blend(cdf_tensor *a, cdf_tensor *b, int dim, int64_t blend_extent) {
    const int64_t na = cdf_tensor_dim(a, dim), nb = cdf_tensor_dim(b, dim);
    int64_t e = na < nb ? na : nb;
    if (blend_extent < e) e = blend_extent;
    if (e <= 0) return b;
    float *w = malloc(2 * (size_t)e * sizeof *w);
    if (!w) {
        cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (VAE tile blend)");
        return NULL;
    }
    for (int64_t y = 0; y < e; y++) {
        w[y] = (float)(1.0 - (double)y / (double)e); /* weight of a */
        w[e + y] = (float)((double)y / (double)e);   /* weight of b */
    }
    int64_t shape[4] = {1, 1, 1, 1};
    shape[dim] = e;
    cdf_device *dev = cdf_tensor_device(b);
    cdf_tensor *wa = cdf_tensor_from_host(dev, CDF_F32, 4, shape, w, CDF_F32);
    cdf_tensor *wb = wa ? cdf_tensor_from_host(dev, CDF_F32, 4, shape, w + e, CDF_F32) : NULL;
    free(w);
    if (!wb) return NULL;
    cdf_tensor *parts[2] = {cdf_add(cdf_mul(cdf_narrow(a, dim, na - e, e), wa), cdf_mul(cdf_narrow(b, dim, 0, e), wb)), NULL};
    if (e == nb) return parts[0];
    parts[1] = cdf_narrow(b, dim, e, nb - e);
    return cdf_cat(parts, 2, dim);
}

typedef cdf_tensor *(*tile_fn)(const cdf_autoencoder_kl *m, cdf_tensor *tile);

/* vae.decode of one latent tile: post_quant_conv (if any), then the decoder. */
static cdf_tensor *decode_tile(const cdf_autoencoder_kl *m, cdf_tensor *z) {
    cdf_tensor *h = cdf_tensor_retain(z);
    if (m->has_post_quant_conv) STEP(h, cdf_conv_fwd(&m->post_quant_conv, h));
    STEP(h, cdf_vae_decoder_forward(&m->decoder, h));
    return to_scope(h);
}

/* The encoder's moments of one image tile: the encoder, then quant_conv (if any). */
static cdf_tensor *encode_tile(const cdf_autoencoder_kl *m, cdf_tensor *x) {
    cdf_tensor *h = cdf_tensor_retain(x);
    STEP(h, cdf_vae_encoder_forward(&m->encoder, h));
    if (m->has_quant_conv) STEP(h, cdf_conv_fwd(&m->quant_conv, h));
    return to_scope(h);
}

/* The loop shared by tiled_decode and _tiled_encode: tiles of `tile_in` input rows/columns start
 * every int(tile_in * (1 - overlap)) (the last ones are cut by the edge), each runs through `fn`
 * on its own, then in raster order each output tile is blended into by the tile above and the
 * tile to its left (both already blended: diffusers blends the tiles of its lists in place),
 * cropped to its first tile_out - int(tile_out * overlap) rows/columns and concatenated. Only the
 * running tile's activations and the (small) finished output tiles are alive at a time. */
static cdf_tensor *tiled_forward(const cdf_autoencoder_kl *m, cdf_tensor *x, int64_t tile_in, int64_t tile_out, double overlap,
                                 tile_fn fn) {
    const int64_t H = cdf_tensor_dim(x, 2), W = cdf_tensor_dim(x, 3);
    const int64_t step = py_int_mul(tile_in, 1.0 - overlap), blend_extent = py_int_mul(tile_out, overlap);
    const int64_t row_limit = tile_out - blend_extent;
    const int64_t nr = (H + step - 1) / step, nc = (W + step - 1) / step;
    if (nr * nc > 65536) {
        cdf_error(CDF_ERR_LIMIT, "VAE tiling: %lldx%lld tiles (at most 65536); use larger tiles", (long long)nr, (long long)nc);
        return NULL;
    }
    cdf_tensor **tiles = calloc((size_t)(nr * nc + nc + nr), sizeof *tiles);
    if (!tiles) {
        cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (VAE tiles)");
        return NULL;
    }
    cdf_tensor **row_parts = tiles + nr * nc, **rows = row_parts + nc;
    cdf_tensor *result = NULL;
    bool ok = true;
    for (int64_t i = 0; ok && i < nr; i++)
        for (int64_t j = 0; ok && j < nc; j++) {
            const int64_t y0 = i * step, x0 = j * step;
            const int64_t th = H - y0 < tile_in ? H - y0 : tile_in, tw = W - x0 < tile_in ? W - x0 : tile_in;
            cdf_tensor *h = NULL;
            STEP(h, cdf_contiguous(cdf_narrow(cdf_narrow(x, 2, y0, th), 3, x0, tw)));
            STEP(h, fn(m, h));
            h = settle(h); /* one tile's activations at a time, also in eager */
            tiles[i * nc + j] = h;
            ok = h != NULL;
        }
    for (int64_t i = 0; ok && i < nr; i++) {
        cdf_scope_push(); /* the crops (views) of this row */
        for (int64_t j = 0; ok && j < nc; j++) {
            cdf_tensor **t = &tiles[i * nc + j];
            if (i > 0) STEP(*t, blend(tiles[(i - 1) * nc + j], *t, 2, blend_extent));
            if (j > 0 && *t) STEP(*t, blend(tiles[i * nc + j - 1], *t, 3, blend_extent));
            if (!*t) {
                ok = false;
                break;
            }
            const int64_t ch = cdf_tensor_dim(*t, 2) < row_limit ? cdf_tensor_dim(*t, 2) : row_limit;
            const int64_t cw = cdf_tensor_dim(*t, 3) < row_limit ? cdf_tensor_dim(*t, 3) : row_limit;
            row_parts[j] = cdf_narrow(cdf_narrow(*t, 2, 0, ch), 3, 0, cw);
        }
        if (ok) rows[i] = cdf_tensor_retain(cdf_cat(row_parts, (int)nc, 3));
        cdf_scope_pop(NULL, 0);
        ok = ok && rows[i];
        /* the row above is no longer needed once this row is blended */
        for (int64_t j = 0; i > 0 && j < nc; j++) {
            cdf_tensor_release(tiles[(i - 1) * nc + j]);
            tiles[(i - 1) * nc + j] = NULL;
        }
    }
    if (ok) STEP(result, cdf_cat(rows, (int)nr, 2));
    for (int64_t k = 0; k < nr * nc + nr; k++) cdf_tensor_release(k < nr * nc ? tiles[k] : rows[k - nr * nc]);
    free(tiles);
    return result ? to_scope(result) : NULL;
}

static bool tiling_applies(const cdf_vae_tiling *t, cdf_tensor *x, int64_t limit) {
    return t && t->enabled && x && (cdf_tensor_dim(x, 2) > limit || cdf_tensor_dim(x, 3) > limit);
}

/* fn over the whole input, or tiled when t is on and the input is larger than tile_in a side. */
static cdf_tensor *maybe_tiled(const cdf_autoencoder_kl *m, cdf_tensor *x, int64_t channels, const char *what,
                               const cdf_vae_tiling *t, bool decode, tile_fn fn) {
    if (t && t->enabled && cdf_vae_tiling_validate(t) != CDF_OK) return NULL;
    cdf_scope_push();
    cdf_tensor *xx = check_input(x, channels, what);
    const int64_t tile_in = !t ? 0 : decode ? t->tile_latent_min_size : t->tile_sample_min_size;
    const int64_t tile_out = !t ? 0 : decode ? t->tile_sample_min_size : t->tile_latent_min_size;
    cdf_tensor *r = tiling_applies(t, xx, tile_in) ? tiled_forward(m, xx, tile_in, tile_out, t->tile_overlap_factor, fn)
                                                   : (xx ? fn(m, xx) : NULL);
    cdf_scope_pop(&r, 1);
    return r;
}

cdf_tensor *cdf_autoencoder_kl_decode_tiled(const cdf_autoencoder_kl *m, cdf_tensor *z, const cdf_vae_tiling *t) {
    return maybe_tiled(m, z, m->config.latent_channels, "the latent z", t, true, decode_tile);
}

cdf_tensor *cdf_autoencoder_kl_encode_moments_tiled(const cdf_autoencoder_kl *m, cdf_tensor *x, const cdf_vae_tiling *t) {
    return maybe_tiled(m, x, m->config.in_channels, "the image x", t, false, encode_tile);
}

cdf_tensor *cdf_autoencoder_kl_encode_moments(const cdf_autoencoder_kl *m, cdf_tensor *x) {
    return cdf_autoencoder_kl_encode_moments_tiled(m, x, NULL);
}

cdf_tensor *cdf_autoencoder_kl_decode(const cdf_autoencoder_kl *m, cdf_tensor *z) {
    return cdf_autoencoder_kl_decode_tiled(m, z, NULL);
}

cdf_status cdf_vae_posterior(cdf_tensor *moments, cdf_tensor **mean, cdf_tensor **logvar, cdf_tensor **std) {
    if (mean) *mean = NULL;
    if (logvar) *logvar = NULL;
    if (std) *std = NULL;
    if (!moments) return cdf_last_status() ? cdf_last_status() : cdf_error(CDF_ERR_INVALID_ARG, "vae posterior: moments is NULL");
    cdf_tensor *parts[2] = {NULL, NULL};
    /* mean, logvar = torch.chunk(parameters, 2, dim=1) (views, recorded in the caller's scope) */
    CDF_TRY(cdf_chunk(moments, 2, 1, parts));
    cdf_tensor *m = cdf_contiguous(parts[0]);
    cdf_tensor *lv = cdf_clamp(parts[1], -30.0f, 20.0f);
    cdf_tensor *sd = cdf_exp(cdf_scale(lv, 0.5f)); /* 0.5 * logvar is exact in float32 */
    if (!m || !lv || !sd) return cdf_last_status() ? cdf_last_status() : CDF_ERR_INTERNAL;
    if (mean) *mean = m;
    if (logvar) *logvar = lv;
    if (std) *std = sd;
    return CDF_OK;
}

/* ==== pipeline entry points ================================================================== */

cdf_tensor *cdf_vae_decode(void *impl, cdf_tensor *z) {
    if (!impl) {
        cdf_error(CDF_ERR_INVALID_ARG, "cdf_vae_decode: impl is NULL");
        return NULL;
    }
    return cdf_autoencoder_kl_decode((const cdf_autoencoder_kl *)impl, z);
}

cdf_tensor *cdf_vae_encode_mean(void *impl, cdf_tensor *x) {
    if (!impl) {
        cdf_error(CDF_ERR_INVALID_ARG, "cdf_vae_encode_mean: impl is NULL");
        return NULL;
    }
    cdf_scope_push();
    cdf_tensor *mean = NULL;
    cdf_tensor *moments = cdf_autoencoder_kl_encode_moments((const cdf_autoencoder_kl *)impl, x);
    if (moments) cdf_vae_posterior(moments, &mean, NULL, NULL);
    cdf_scope_pop(&mean, 1);
    return mean;
}

double cdf_vae_scaling_factor(const void *impl) { return impl ? ((const cdf_autoencoder_kl *)impl)->config.scaling_factor : 0.0; }
double cdf_vae_shift_factor(const void *impl) {
    const cdf_autoencoder_kl *m = impl;
    return m && m->config.has_shift_factor ? m->config.shift_factor : 0.0;
}

/* ==== component class ========================================================================= */

static cdf_status kl_load(const char *dir, const cJSON *cfg, const cdf_load_options *opt, void **impl) {
    char source[4200];
    snprintf(source, sizeof source, "%s/config.json", dir);
    const cdf_vae_config defaults = cdf_vae_config_kl_defaults();
    cdf_vae_config c;
    CDF_TRY(cdf_vae_config_parse(cfg, &defaults, source, &c));
    cdf_autoencoder_kl *m = calloc(1, sizeof *m);
    if (!m) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    cdf_weights *w = NULL;
    cdf_status s = cdf_weights_open(dir, opt, &w);
    if (s == CDF_OK) s = cdf_autoencoder_kl_load_weights(w, &c, m);
    cdf_weights_free(w); /* the loaded tensors are device copies */
    if (s != CDF_OK) {
        free(m);
        return s;
    }
    *impl = m;
    return CDF_OK;
}

static void kl_free(void *impl) {
    cdf_autoencoder_kl_release(impl);
    free(impl);
}

static cdf_status kl_run(void *impl, const char *method, const cdf_tensor_map *in, cdf_tensor_map *out) {
    const cdf_autoencoder_kl *m = impl;
    cdf_vae_tiling tiling;
    CDF_TRY(cdf_vae_tiling_from_inputs(&m->config, in, "AutoencoderKL", &tiling));
    if (strcmp(method, "decode") == 0) {
        cdf_tensor *z = cdf_input(in, "z", "AutoencoderKL.decode");
        if (!z) return cdf_last_status();
        cdf_tensor *sample = cdf_autoencoder_kl_decode_tiled(m, z, &tiling);
        if (!sample) return cdf_last_status() ? cdf_last_status() : cdf_error(CDF_ERR_INTERNAL, "AutoencoderKL.decode failed");
        return cdf_tensor_map_set(out, "out.decode_sample", sample);
    }
    if (strcmp(method, "encode") == 0) {
        cdf_tensor *x = cdf_input(in, "x", "AutoencoderKL.encode");
        if (!x) return cdf_last_status();
        cdf_tensor *mean, *logvar, *std;
        CDF_TRY(cdf_vae_posterior(cdf_autoencoder_kl_encode_moments_tiled(m, x, &tiling), &mean, &logvar, &std));
        CDF_TRY(cdf_tensor_map_set(out, "out.encode_mean", mean));
        CDF_TRY(cdf_tensor_map_set(out, "out.encode_logvar", logvar));
        return cdf_tensor_map_set(out, "out.encode_std", std);
    }
    return cdf_error(CDF_ERR_UNSUPPORTED, "AutoencoderKL: method '%s' is not supported (decode, encode)", method);
}

const cdf_component_class cdf_autoencoder_kl_class = {
    .names = (const char *const[]){"AutoencoderKL", NULL},
    .load = kl_load,
    .free = kl_free,
    .run = kl_run,
    .static_inputs = (const char *const[]){CDF_VAE_TILING_INPUTS, NULL},
};
