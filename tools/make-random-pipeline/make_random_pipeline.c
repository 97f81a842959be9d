/* make-random-pipeline: writes a complete diffusers pipeline folder (model_index.json, scheduler,
 * tokenizers, and every component as config.json + a safetensors file) whose weights are
 * pseudo-random, at whatever size the caller asks for. It needs no download and no library:
 * the architectures are described here by the tensor names and shapes their diffusers /
 * transformers checkpoints carry (the same ones cdiffusers' loaders ask for).
 *
 * Used by the offload tests (tests/test_offload.c includes this file with MRP_NO_MAIN defined
 * and calls mrp_write_pipeline) and by bench/offload (built as a program, see README.md).
 *
 * Values: every tensor gets its own xorshift stream seeded by (seed, tensor name), uniform in
 * [-a, a] with a chosen per kind of tensor (1/sqrt(fan_in) for linear and conv weights, about 1
 * for norm scales, small for biases), so the models produce finite, non-degenerate outputs.
 * Large files are streamed in chunks: a multi-GB transformer needs only a few MB of memory. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

typedef enum mrp_kind { MRP_FLUX = 1, MRP_SD3 = 2 } mrp_kind;
typedef enum mrp_dtype { MRP_F32 = 0, MRP_BF16 = 1, MRP_F16 = 2 } mrp_dtype;

typedef struct mrp_clip {
    int hidden, layers, heads, intermediate;
    int projection; /* > 0: CLIPTextModelWithProjection with text_projection [projection, hidden] */
} mrp_clip;

typedef struct mrp_t5 {
    int d_model, layers, heads, d_kv, d_ff;
} mrp_t5;

typedef struct mrp_flux {
    int heads, head_dim, layers, single_layers;
    bool guidance_embeds; /* FLUX.1-dev style guidance embedder */
} mrp_flux;

typedef struct mrp_sd3 {
    int heads, head_dim, layers;
    int dual_layers;        /* the first dual_layers blocks have attn2 (SD3.5: 13 of 24) */
    bool qk_norm;           /* qk_norm "rms_norm" (SD3.5) */
    int pos_embed_max_size; /* SD3.5-Medium: 384 */
    int sample_size;        /* default latent size (128 -> 1024 px) */
} mrp_sd3;

typedef struct mrp_vae {
    int n_blocks;    /* 1..4 */
    int channels[4]; /* block_out_channels */
    int layers_per_block, groups;
} mrp_vae;

typedef struct mrp_spec {
    mrp_kind kind;
    mrp_dtype dtype; /* stored dtype of every float tensor */
    uint64_t seed;
    mrp_clip clip_l, clip_g; /* clip_g: SD3 only */
    mrp_t5 t5;
    bool with_t5; /* SD3 may leave text_encoder_3 out */
    mrp_flux flux;
    mrp_sd3 sd3;
    mrp_vae vae;
    const char *tokenizers; /* folder with clip_l/, clip_g/, t5/ (tests/data/tokenizers) */
} mrp_spec;

#define MRP_LATENT_CHANNELS 16 /* FLUX.1 and SD3 VAEs */
#define MRP_CLIP_VOCAB 49408
#define MRP_T5_VOCAB 32128

/* ---- errors ------------------------------------------------------------------------------- */
static char mrp_err[1024];
static int mrp_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int mrp_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(mrp_err, sizeof mrp_err, fmt, ap);
    va_end(ap);
    return -1;
}
/* The message of the last failure. */
static const char *mrp_last_error(void) { return mrp_err; }

/* ---- tensor lists --------------------------------------------------------------------------- */
typedef enum init_kind { I_WEIGHT, I_BIAS, I_NORM_W, I_NORM_B, I_EMBED, I_SMALL } init_kind;

typedef struct mrp_tensor {
    char name[160];
    int ndim;
    int64_t shape[4];
    init_kind init;
} mrp_tensor;

typedef struct mrp_list {
    mrp_tensor *t;
    int n, cap;
    bool oom;
} mrp_list;

static void add_v(mrp_list *l, init_kind init, int ndim, const int64_t *shape, const char *fmt, va_list ap) {
    if (l->oom) return;
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 256;
        mrp_tensor *p = realloc(l->t, (size_t)cap * sizeof *p);
        if (!p) {
            l->oom = true;
            return;
        }
        l->t = p;
        l->cap = cap;
    }
    mrp_tensor *t = &l->t[l->n++];
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->init = init;
}

static void add(mrp_list *l, init_kind init, int ndim, const int64_t *shape, const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static void add(mrp_list *l, init_kind init, int ndim, const int64_t *shape, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    add_v(l, init, ndim, shape, fmt, ap);
    va_end(ap);
}

/* "<prefix>.weight" [out, in] and optionally "<prefix>.bias" [out] */
static void linear(mrp_list *l, int64_t in, int64_t out, bool bias, const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static void linear(mrp_list *l, int64_t in, int64_t out, bool bias, const char *fmt, ...) {
    char p[150];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p, sizeof p, fmt, ap);
    va_end(ap);
    add(l, I_WEIGHT, 2, (int64_t[]){out, in}, "%s.weight", p);
    if (bias) add(l, I_BIAS, 1, (int64_t[]){out}, "%s.bias", p);
}

static void norm(mrp_list *l, int64_t dim, bool bias, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void norm(mrp_list *l, int64_t dim, bool bias, const char *fmt, ...) {
    char p[150];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p, sizeof p, fmt, ap);
    va_end(ap);
    add(l, I_NORM_W, 1, (int64_t[]){dim}, "%s.weight", p);
    if (bias) add(l, I_NORM_B, 1, (int64_t[]){dim}, "%s.bias", p);
}

static void conv(mrp_list *l, int64_t cin, int64_t cout, int k, const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static void conv(mrp_list *l, int64_t cin, int64_t cout, int k, const char *fmt, ...) {
    char p[150];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p, sizeof p, fmt, ap);
    va_end(ap);
    add(l, I_WEIGHT, 4, (int64_t[]){cout, cin, k, k}, "%s.weight", p);
    add(l, I_BIAS, 1, (int64_t[]){cout}, "%s.bias", p);
}

/* ---- architectures ---------------------------------------------------------------------------- */
static void clip_tensors(mrp_list *l, const mrp_clip *c) {
    const int64_t H = c->hidden, I = c->intermediate;
    add(l, I_EMBED, 2, (int64_t[]){MRP_CLIP_VOCAB, H}, "text_model.embeddings.token_embedding.weight");
    add(l, I_SMALL, 2, (int64_t[]){77, H}, "text_model.embeddings.position_embedding.weight");
    for (int i = 0; i < c->layers; i++) {
        const char *p = "text_model.encoder.layers";
        norm(l, H, true, "%s.%d.layer_norm1", p, i);
        linear(l, H, H, true, "%s.%d.self_attn.q_proj", p, i);
        linear(l, H, H, true, "%s.%d.self_attn.k_proj", p, i);
        linear(l, H, H, true, "%s.%d.self_attn.v_proj", p, i);
        linear(l, H, H, true, "%s.%d.self_attn.out_proj", p, i);
        norm(l, H, true, "%s.%d.layer_norm2", p, i);
        linear(l, H, I, true, "%s.%d.mlp.fc1", p, i);
        linear(l, I, H, true, "%s.%d.mlp.fc2", p, i);
    }
    norm(l, H, true, "text_model.final_layer_norm");
    if (c->projection > 0) linear(l, H, c->projection, false, "text_projection");
}

static void t5_tensors(mrp_list *l, const mrp_t5 *c) {
    const int64_t D = c->d_model, inner = (int64_t)c->heads * c->d_kv, F = c->d_ff;
    add(l, I_EMBED, 2, (int64_t[]){MRP_T5_VOCAB, D}, "shared.weight");
    add(l, I_SMALL, 2, (int64_t[]){32, c->heads}, "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight");
    for (int i = 0; i < c->layers; i++) {
        const char *p = "encoder.block";
        norm(l, D, false, "%s.%d.layer.0.layer_norm", p, i);
        linear(l, D, inner, false, "%s.%d.layer.0.SelfAttention.q", p, i);
        linear(l, D, inner, false, "%s.%d.layer.0.SelfAttention.k", p, i);
        linear(l, D, inner, false, "%s.%d.layer.0.SelfAttention.v", p, i);
        linear(l, inner, D, false, "%s.%d.layer.0.SelfAttention.o", p, i);
        norm(l, D, false, "%s.%d.layer.1.layer_norm", p, i);
        linear(l, D, F, false, "%s.%d.layer.1.DenseReluDense.wi_0", p, i);
        linear(l, D, F, false, "%s.%d.layer.1.DenseReluDense.wi_1", p, i);
        linear(l, F, D, false, "%s.%d.layer.1.DenseReluDense.wo", p, i);
    }
    norm(l, D, false, "encoder.final_layer_norm");
}

static void flux_tensors(mrp_list *l, const mrp_spec *s) {
    const mrp_flux *c = &s->flux;
    const int64_t D = (int64_t)c->heads * c->head_dim, hd = c->head_dim, in = 4 * MRP_LATENT_CHANNELS;
    linear(l, in, D, true, "x_embedder");
    linear(l, s->t5.d_model, D, true, "context_embedder");
    linear(l, 256, D, true, "time_text_embed.timestep_embedder.linear_1");
    linear(l, D, D, true, "time_text_embed.timestep_embedder.linear_2");
    if (c->guidance_embeds) {
        linear(l, 256, D, true, "time_text_embed.guidance_embedder.linear_1");
        linear(l, D, D, true, "time_text_embed.guidance_embedder.linear_2");
    }
    linear(l, s->clip_l.hidden, D, true, "time_text_embed.text_embedder.linear_1");
    linear(l, D, D, true, "time_text_embed.text_embedder.linear_2");
    for (int i = 0; i < c->layers; i++) {
        const char *p = "transformer_blocks";
        linear(l, D, 6 * D, true, "%s.%d.norm1.linear", p, i);
        linear(l, D, 6 * D, true, "%s.%d.norm1_context.linear", p, i);
        static const char *const proj[] = {"to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"};
        for (int k = 0; k < 8; k++) linear(l, D, D, true, "%s.%d.attn.%s", p, i, proj[k]);
        static const char *const norms[] = {"norm_q", "norm_k", "norm_added_q", "norm_added_k"};
        for (int k = 0; k < 4; k++) norm(l, hd, false, "%s.%d.attn.%s", p, i, norms[k]);
        linear(l, D, 4 * D, true, "%s.%d.ff.net.0.proj", p, i);
        linear(l, 4 * D, D, true, "%s.%d.ff.net.2", p, i);
        linear(l, D, 4 * D, true, "%s.%d.ff_context.net.0.proj", p, i);
        linear(l, 4 * D, D, true, "%s.%d.ff_context.net.2", p, i);
    }
    for (int i = 0; i < c->single_layers; i++) {
        const char *p = "single_transformer_blocks";
        linear(l, D, 3 * D, true, "%s.%d.norm.linear", p, i);
        linear(l, D, D, true, "%s.%d.attn.to_q", p, i);
        linear(l, D, D, true, "%s.%d.attn.to_k", p, i);
        linear(l, D, D, true, "%s.%d.attn.to_v", p, i);
        norm(l, hd, false, "%s.%d.attn.norm_q", p, i);
        norm(l, hd, false, "%s.%d.attn.norm_k", p, i);
        linear(l, D, 4 * D, true, "%s.%d.proj_mlp", p, i);
        linear(l, 5 * D, D, true, "%s.%d.proj_out", p, i);
    }
    linear(l, D, 2 * D, true, "norm_out.linear");
    linear(l, D, in, true, "proj_out");
}

static void sd3_attention(mrp_list *l, const mrp_sd3 *c, int64_t D, bool joint, bool add_out, const char *p) {
    linear(l, D, D, true, "%s.to_q", p);
    linear(l, D, D, true, "%s.to_k", p);
    linear(l, D, D, true, "%s.to_v", p);
    linear(l, D, D, true, "%s.to_out.0", p);
    if (c->qk_norm) {
        norm(l, c->head_dim, false, "%s.norm_q", p);
        norm(l, c->head_dim, false, "%s.norm_k", p);
    }
    if (!joint) return;
    linear(l, D, D, true, "%s.add_q_proj", p);
    linear(l, D, D, true, "%s.add_k_proj", p);
    linear(l, D, D, true, "%s.add_v_proj", p);
    if (add_out) linear(l, D, D, true, "%s.to_add_out", p);
    if (c->qk_norm) {
        norm(l, c->head_dim, false, "%s.norm_added_q", p);
        norm(l, c->head_dim, false, "%s.norm_added_k", p);
    }
}

static void sd3_tensors(mrp_list *l, const mrp_spec *s) {
    const mrp_sd3 *c = &s->sd3;
    const int64_t D = (int64_t)c->heads * c->head_dim, M = c->pos_embed_max_size;
    add(l, I_WEIGHT, 4, (int64_t[]){D, MRP_LATENT_CHANNELS, 2, 2}, "pos_embed.proj.weight");
    add(l, I_BIAS, 1, (int64_t[]){D}, "pos_embed.proj.bias");
    add(l, I_SMALL, 3, (int64_t[]){1, M * M, D}, "pos_embed.pos_embed");
    linear(l, 256, D, true, "time_text_embed.timestep_embedder.linear_1");
    linear(l, D, D, true, "time_text_embed.timestep_embedder.linear_2");
    linear(l, s->clip_l.projection + s->clip_g.projection, D, true, "time_text_embed.text_embedder.linear_1");
    linear(l, D, D, true, "time_text_embed.text_embedder.linear_2");
    linear(l, s->t5.d_model, D, true, "context_embedder");
    for (int i = 0; i < c->layers; i++) {
        const bool last = i == c->layers - 1, dual = i < c->dual_layers;
        char p[96];
        linear(l, D, (dual ? 9 : 6) * D, true, "transformer_blocks.%d.norm1.linear", i);
        linear(l, D, (last ? 2 : 6) * D, true, "transformer_blocks.%d.norm1_context.linear", i);
        snprintf(p, sizeof p, "transformer_blocks.%d.attn", i);
        sd3_attention(l, c, D, true, !last, p);
        if (dual) {
            snprintf(p, sizeof p, "transformer_blocks.%d.attn2", i);
            sd3_attention(l, c, D, false, false, p);
        }
        linear(l, D, 4 * D, true, "transformer_blocks.%d.ff.net.0.proj", i);
        linear(l, 4 * D, D, true, "transformer_blocks.%d.ff.net.2", i);
        if (!last) {
            linear(l, D, 4 * D, true, "transformer_blocks.%d.ff_context.net.0.proj", i);
            linear(l, 4 * D, D, true, "transformer_blocks.%d.ff_context.net.2", i);
        }
    }
    linear(l, D, 2 * D, true, "norm_out.linear");
    linear(l, D, 4 * MRP_LATENT_CHANNELS, true, "proj_out");
}

static void vae_resnet(mrp_list *l, int64_t cin, int64_t cout, const char *p) {
    norm(l, cin, true, "%s.norm1", p);
    conv(l, cin, cout, 3, "%s.conv1", p);
    norm(l, cout, true, "%s.norm2", p);
    conv(l, cout, cout, 3, "%s.conv2", p);
    if (cin != cout) conv(l, cin, cout, 1, "%s.conv_shortcut", p);
}

static void vae_mid(mrp_list *l, int64_t C, const char *side) {
    char p[96];
    snprintf(p, sizeof p, "%s.mid_block.resnets.0", side);
    vae_resnet(l, C, C, p);
    norm(l, C, true, "%s.mid_block.attentions.0.group_norm", side);
    static const char *const proj[] = {"to_q", "to_k", "to_v", "to_out.0"};
    for (int k = 0; k < 4; k++) linear(l, C, C, true, "%s.mid_block.attentions.0.%s", side, proj[k]);
    snprintf(p, sizeof p, "%s.mid_block.resnets.1", side);
    vae_resnet(l, C, C, p);
}

static void vae_tensors(mrp_list *l, const mrp_vae *c) {
    const int n = c->n_blocks;
    const int *ch = c->channels;
    char p[96];
    /* encoder */
    conv(l, 3, ch[0], 3, "encoder.conv_in");
    int64_t out = ch[0];
    for (int i = 0; i < n; i++) {
        int64_t in = out;
        out = ch[i];
        for (int j = 0; j < c->layers_per_block; j++) {
            snprintf(p, sizeof p, "encoder.down_blocks.%d.resnets.%d", i, j);
            vae_resnet(l, j == 0 ? in : out, out, p);
        }
        if (i < n - 1) conv(l, out, out, 3, "encoder.down_blocks.%d.downsamplers.0.conv", i);
    }
    vae_mid(l, ch[n - 1], "encoder");
    norm(l, ch[n - 1], true, "encoder.conv_norm_out");
    conv(l, ch[n - 1], 2 * MRP_LATENT_CHANNELS, 3, "encoder.conv_out");
    /* decoder: channels in reverse, layers_per_block + 1 resnets per block */
    conv(l, MRP_LATENT_CHANNELS, ch[n - 1], 3, "decoder.conv_in");
    vae_mid(l, ch[n - 1], "decoder");
    out = ch[n - 1];
    for (int i = 0; i < n; i++) {
        int64_t prev = out;
        out = ch[n - 1 - i];
        for (int j = 0; j < c->layers_per_block + 1; j++) {
            snprintf(p, sizeof p, "decoder.up_blocks.%d.resnets.%d", i, j);
            vae_resnet(l, j == 0 ? prev : out, out, p);
        }
        if (i < n - 1) conv(l, out, out, 3, "decoder.up_blocks.%d.upsamplers.0.conv", i);
    }
    norm(l, ch[0], true, "decoder.conv_norm_out");
    conv(l, ch[0], 3, 3, "decoder.conv_out");
}

/* ---- values ------------------------------------------------------------------------------------ */
static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static uint64_t name_seed(uint64_t seed, const char *name) {
    uint64_t h = 1469598103934665603ull ^ mix64(seed + 0x9e3779b97f4a7c15ull);
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) h = (h ^ *p) * 1099511628211ull;
    h = mix64(h);
    return h ? h : 1;
}

static inline float next_uniform(uint64_t *s) { /* [-1, 1) */
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return (float)((int64_t)((x * 0x2545F4914F6CDD1Dull) >> 40) - (1ll << 23)) * (1.0f / (float)(1 << 23));
}

static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even (values here are finite) */
    return (uint16_t)(u >> 16);
}

static uint16_t to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint32_t sign = (u >> 16) & 0x8000u;
    int32_t e = (int32_t)((u >> 23) & 0xff) - 127 + 15;
    uint32_t m = u & 0x7fffffu;
    if (e <= 0) return (uint16_t)sign; /* tiny values: flush to zero (values here are >= 1e-4 or 0) */
    if (e >= 31) return (uint16_t)(sign | 0x7bffu);
    uint32_t h = sign | ((uint32_t)e << 10) | (m >> 13);
    if ((m & 0x1fffu) > 0x1000u || ((m & 0x1fffu) == 0x1000u && (h & 1u))) h++;
    return (uint16_t)h;
}

static int64_t numel(const mrp_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

static float init_scale(const mrp_tensor *t, float *offset) {
    *offset = 0.0f;
    switch (t->init) {
    case I_WEIGHT: {
        int64_t fan_in = 1;
        for (int i = 1; i < t->ndim; i++) fan_in *= t->shape[i];
        return 1.0f / sqrtf((float)fan_in);
    }
    case I_BIAS: return 0.02f;
    case I_NORM_W: *offset = 1.0f; return 0.1f;
    case I_NORM_B: return 0.02f;
    case I_EMBED: return 0.5f;
    case I_SMALL: return 0.1f;
    }
    return 0.0f;
}

static size_t dtype_size(mrp_dtype d) { return d == MRP_F32 ? 4 : 2; }
static const char *dtype_name(mrp_dtype d) { return d == MRP_F32 ? "F32" : d == MRP_BF16 ? "BF16" : "F16"; }

/* Writes the tensors as one safetensors file, streaming the data. */
static int write_safetensors(const char *path, const mrp_list *l, const mrp_spec *s) {
    if (l->oom) return mrp_fail("out of memory building the tensor list for %s", path);
    size_t cap = 4096 + (size_t)l->n * 256, len = 0;
    char *hdr = malloc(cap);
    if (!hdr) return mrp_fail("out of memory (header of %s)", path);
    len += snprintf(hdr + len, cap - len, "{\"__metadata__\":{\"format\":\"pt\",\"generator\":\"make-random-pipeline\"}");
    uint64_t off = 0;
    const size_t es = dtype_size(s->dtype);
    for (int i = 0; i < l->n; i++) {
        const mrp_tensor *t = &l->t[i];
        uint64_t nb = (uint64_t)numel(t) * es;
        len += snprintf(hdr + len, cap - len, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t->name, dtype_name(s->dtype));
        for (int d = 0; d < t->ndim; d++) len += snprintf(hdr + len, cap - len, "%s%lld", d ? "," : "", (long long)t->shape[d]);
        len += snprintf(hdr + len, cap - len, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                        (unsigned long long)(off + nb));
        off += nb;
        if (len + 512 > cap) {
            char *p = realloc(hdr, cap * 2);
            if (!p) {
                free(hdr);
                return mrp_fail("out of memory (header of %s)", path);
            }
            hdr = p;
            cap *= 2;
        }
    }
    len += snprintf(hdr + len, cap - len, "}");
    while (len % 8) hdr[len++] = ' '; /* the data section starts 8-byte aligned */
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(hdr);
        return mrp_fail("cannot create %s: %s", path, strerror(errno));
    }
    uint8_t n8[8];
    for (int i = 0; i < 8; i++) n8[i] = (uint8_t)((uint64_t)len >> (8 * i));
    bool ok = fwrite(n8, 1, 8, f) == 8 && fwrite(hdr, 1, len, f) == len;
    free(hdr);
    enum { CHUNK = 1 << 18 };
    float *vals = malloc(CHUNK * sizeof *vals);
    uint8_t *out = malloc(CHUNK * 4);
    ok = ok && vals && out;
    for (int i = 0; ok && i < l->n; i++) {
        const mrp_tensor *t = &l->t[i];
        uint64_t rng = name_seed(s->seed, t->name);
        float offset, scale = init_scale(t, &offset);
        for (int64_t done = 0, n = numel(t); ok && done < n;) {
            int64_t k = n - done < CHUNK ? n - done : CHUNK;
            for (int64_t j = 0; j < k; j++) vals[j] = offset + scale * next_uniform(&rng);
            if (s->dtype == MRP_F32) memcpy(out, vals, (size_t)k * 4);
            else
                for (int64_t j = 0; j < k; j++) {
                    uint16_t h = s->dtype == MRP_BF16 ? to_bf16(vals[j]) : to_f16(vals[j]);
                    out[2 * j] = (uint8_t)h;
                    out[2 * j + 1] = (uint8_t)(h >> 8);
                }
            ok = fwrite(out, es, (size_t)k, f) == (size_t)k;
            done += k;
        }
    }
    free(vals);
    free(out);
    if (fclose(f) != 0) ok = false;
    if (!ok) return mrp_fail("cannot write %s: %s", path, strerror(errno));
    return 0;
}

/* ---- files ------------------------------------------------------------------------------------- */
static int make_dir(const char *path) {
    if (mkdir(path, 0777) != 0 && errno != EEXIST) return mrp_fail("cannot create folder %s: %s", path, strerror(errno));
    return 0;
}

static int write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) return mrp_fail("cannot create %s: %s", path, strerror(errno));
    size_t n = strlen(text);
    bool ok = fwrite(text, 1, n, f) == n;
    if (fclose(f) != 0 || !ok) return mrp_fail("cannot write %s: %s", path, strerror(errno));
    return 0;
}

static int copy_file(const char *from, const char *to) {
    FILE *in = fopen(from, "rb");
    if (!in) return mrp_fail("cannot open %s: %s", from, strerror(errno));
    FILE *out = fopen(to, "wb");
    if (!out) {
        fclose(in);
        return mrp_fail("cannot create %s: %s", to, strerror(errno));
    }
    char buf[1 << 16];
    size_t n;
    bool ok = true;
    while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0) ok = fwrite(buf, 1, n, out) == n;
    ok = ok && !ferror(in);
    fclose(in);
    if (fclose(out) != 0) ok = false;
    if (!ok) return mrp_fail("cannot copy %s to %s", from, to);
    return 0;
}

/* Copies tokenizer files (those that exist) from <tokenizers>/<src>/ to <dir>/<dst>/. */
static int copy_tokenizer(const mrp_spec *s, const char *dir, const char *src, const char *dst) {
    static const char *const files[] = {"vocab.json", "merges.txt", "special_tokens_map.json", "tokenizer_config.json",
                                        "tokenizer.json", "spiece.model"};
    char to[4096], from[4096];
    snprintf(to, sizeof to, "%s/%s", dir, dst);
    if (make_dir(to)) return -1;
    int copied = 0;
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(from, sizeof from, "%s/%s/%s", s->tokenizers, src, files[i]);
        struct stat st;
        if (stat(from, &st) != 0) continue;
        snprintf(to, sizeof to, "%s/%s/%s", dir, dst, files[i]);
        if (copy_file(from, to)) return -1;
        copied++;
    }
    if (!copied) return mrp_fail("no tokenizer files in %s/%s", s->tokenizers, src);
    return 0;
}

static int write_component(const char *dir, const char *sub, const char *config, const char *weights_name,
                           const mrp_list *l, const mrp_spec *s) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, sub);
    if (make_dir(path)) return -1;
    snprintf(path, sizeof path, "%s/%s/config.json", dir, sub);
    if (write_text(path, config)) return -1;
    snprintf(path, sizeof path, "%s/%s/%s", dir, sub, weights_name);
    return write_safetensors(path, l, s);
}

static const char *torch_dtype(const mrp_spec *s) {
    return s->dtype == MRP_F32 ? "float32" : s->dtype == MRP_BF16 ? "bfloat16" : "float16";
}

static int write_clip(const char *dir, const char *sub, const mrp_clip *c, const mrp_spec *s, const char *act) {
    char cfg[2048];
    snprintf(cfg, sizeof cfg,
             "{\n  \"architectures\": [\"%s\"],\n  \"bos_token_id\": 0,\n  \"eos_token_id\": 2,\n  \"pad_token_id\": 1,\n"
             "  \"hidden_act\": \"%s\",\n  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n  \"layer_norm_eps\": 1e-05,\n"
             "  \"max_position_embeddings\": 77,\n  \"model_type\": \"clip_text_model\",\n  \"num_attention_heads\": %d,\n"
             "  \"num_hidden_layers\": %d,\n  \"projection_dim\": %d,\n  \"torch_dtype\": \"%s\",\n  \"vocab_size\": %d\n}\n",
             c->projection > 0 ? "CLIPTextModelWithProjection" : "CLIPTextModel", act, c->hidden, c->intermediate, c->heads,
             c->layers, c->projection > 0 ? c->projection : c->hidden, torch_dtype(s), MRP_CLIP_VOCAB);
    mrp_list l = {0};
    clip_tensors(&l, c);
    int rc = write_component(dir, sub, cfg, "model.safetensors", &l, s);
    free(l.t);
    return rc;
}

static int write_t5(const char *dir, const char *sub, const mrp_spec *s) {
    const mrp_t5 *c = &s->t5;
    char cfg[2048];
    snprintf(cfg, sizeof cfg,
             "{\n  \"architectures\": [\"T5EncoderModel\"],\n  \"d_ff\": %d,\n  \"d_kv\": %d,\n  \"d_model\": %d,\n"
             "  \"dense_act_fn\": \"gelu_new\",\n  \"feed_forward_proj\": \"gated-gelu\",\n  \"is_gated_act\": true,\n"
             "  \"layer_norm_epsilon\": 1e-06,\n  \"model_type\": \"t5\",\n  \"num_heads\": %d,\n  \"num_layers\": %d,\n"
             "  \"relative_attention_max_distance\": 128,\n  \"relative_attention_num_buckets\": 32,\n"
             "  \"torch_dtype\": \"%s\",\n  \"vocab_size\": %d\n}\n",
             c->d_ff, c->d_kv, c->d_model, c->heads, c->layers, torch_dtype(s), MRP_T5_VOCAB);
    mrp_list l = {0};
    t5_tensors(&l, c);
    int rc = write_component(dir, sub, cfg, "model.safetensors", &l, s);
    free(l.t);
    return rc;
}

static int write_vae(const char *dir, const mrp_spec *s) {
    const mrp_vae *c = &s->vae;
    char ch[128] = "", down[512] = "", up[512] = "";
    for (int i = 0; i < c->n_blocks; i++) {
        snprintf(ch + strlen(ch), sizeof ch - strlen(ch), "%s%d", i ? ", " : "", c->channels[i]);
        snprintf(down + strlen(down), sizeof down - strlen(down), "%s\"DownEncoderBlock2D\"", i ? ", " : "");
        snprintf(up + strlen(up), sizeof up - strlen(up), "%s\"UpDecoderBlock2D\"", i ? ", " : "");
    }
    const bool flux = s->kind == MRP_FLUX;
    char cfg[4096];
    snprintf(cfg, sizeof cfg,
             "{\n  \"_class_name\": \"AutoencoderKL\",\n  \"act_fn\": \"silu\",\n  \"block_out_channels\": [%s],\n"
             "  \"down_block_types\": [%s],\n  \"force_upcast\": true,\n  \"in_channels\": 3,\n  \"latent_channels\": %d,\n"
             "  \"layers_per_block\": %d,\n  \"mid_block_add_attention\": true,\n  \"norm_num_groups\": %d,\n"
             "  \"out_channels\": 3,\n  \"sample_size\": 1024,\n  \"scaling_factor\": %s,\n  \"shift_factor\": %s,\n"
             "  \"up_block_types\": [%s],\n  \"use_post_quant_conv\": false,\n  \"use_quant_conv\": false\n}\n",
             ch, down, MRP_LATENT_CHANNELS, c->layers_per_block, c->groups, flux ? "0.3611" : "1.5305", flux ? "0.1159" : "0.0609", up);
    mrp_list l = {0};
    vae_tensors(&l, c);
    int rc = write_component(dir, "vae", cfg, "diffusion_pytorch_model.safetensors", &l, s);
    free(l.t);
    return rc;
}

static int write_transformer(const char *dir, const mrp_spec *s) {
    char cfg[4096];
    mrp_list l = {0};
    if (s->kind == MRP_FLUX) {
        const mrp_flux *c = &s->flux;
        /* rope axes (t, h, w) splitting head_dim like FLUX.1's 16 + 56 + 56 of 128: even parts */
        int a0 = (c->head_dim / 8) & ~1, a1 = ((c->head_dim - a0) / 2) & ~1, a2 = c->head_dim - a0 - a1;
        if (a0 < 2) a0 = 2, a1 = ((c->head_dim - 2) / 2) & ~1, a2 = c->head_dim - a0 - a1;
        snprintf(cfg, sizeof cfg,
                 "{\n  \"_class_name\": \"FluxTransformer2DModel\",\n  \"attention_head_dim\": %d,\n"
                 "  \"axes_dims_rope\": [%d, %d, %d],\n  \"guidance_embeds\": %s,\n  \"in_channels\": %d,\n"
                 "  \"joint_attention_dim\": %d,\n  \"num_attention_heads\": %d,\n  \"num_layers\": %d,\n"
                 "  \"num_single_layers\": %d,\n  \"out_channels\": null,\n  \"patch_size\": 1,\n  \"pooled_projection_dim\": %d\n}\n",
                 c->head_dim, a0, a1, a2, c->guidance_embeds ? "true" : "false", 4 * MRP_LATENT_CHANNELS, s->t5.d_model,
                 c->heads, c->layers, c->single_layers, s->clip_l.hidden);
        flux_tensors(&l, s);
    } else {
        const mrp_sd3 *c = &s->sd3;
        char dual[2048] = "";
        for (int i = 0; i < c->dual_layers; i++) snprintf(dual + strlen(dual), sizeof dual - strlen(dual), "%s%d", i ? ", " : "", i);
        snprintf(cfg, sizeof cfg,
                 "{\n  \"_class_name\": \"SD3Transformer2DModel\",\n  \"attention_head_dim\": %d,\n"
                 "  \"caption_projection_dim\": %d,\n  \"dual_attention_layers\": [%s],\n  \"in_channels\": %d,\n"
                 "  \"joint_attention_dim\": %d,\n  \"num_attention_heads\": %d,\n  \"num_layers\": %d,\n"
                 "  \"out_channels\": %d,\n  \"patch_size\": 2,\n  \"pooled_projection_dim\": %d,\n"
                 "  \"pos_embed_max_size\": %d,\n  \"qk_norm\": %s,\n  \"sample_size\": %d\n}\n",
                 c->head_dim, c->heads * c->head_dim, dual, MRP_LATENT_CHANNELS, s->t5.d_model, c->heads, c->layers,
                 MRP_LATENT_CHANNELS, s->clip_l.projection + s->clip_g.projection, c->pos_embed_max_size,
                 c->qk_norm ? "\"rms_norm\"" : "null", c->sample_size);
        sd3_tensors(&l, s);
    }
    int rc = write_component(dir, "transformer", cfg, "diffusion_pytorch_model.safetensors", &l, s);
    free(l.t);
    return rc;
}

static int check_spec(const mrp_spec *s) {
    if (s->kind != MRP_FLUX && s->kind != MRP_SD3) return mrp_fail("kind must be flux or sd3");
    if (!s->tokenizers) return mrp_fail("the tokenizers folder is not set");
    const mrp_clip *clips[2] = {&s->clip_l, s->kind == MRP_SD3 ? &s->clip_g : NULL};
    for (int i = 0; i < 2; i++) {
        const mrp_clip *c = clips[i];
        if (!c) continue;
        if (c->hidden < 1 || c->layers < 1 || c->heads < 1 || c->intermediate < 1 || c->hidden % c->heads)
            return mrp_fail("clip %d: hidden %d must be a positive multiple of heads %d (layers %d, intermediate %d)", i,
                            c->hidden, c->heads, c->layers, c->intermediate);
        if (s->kind == MRP_SD3 && c->projection < 1) return mrp_fail("SD3 CLIP encoders need projection > 0");
    }
    const mrp_t5 *t = &s->t5;
    if (t->d_model < 1 || t->layers < 1 || t->heads < 1 || t->d_kv < 1 || t->d_ff < 1)
        return mrp_fail("t5: every size must be positive");
    if (s->kind == MRP_FLUX) {
        const mrp_flux *f = &s->flux;
        if (f->heads < 1 || f->head_dim < 6 || f->head_dim % 2 || f->layers < 0 || f->single_layers < 0)
            return mrp_fail("flux: heads >= 1, an even head_dim >= 6, layers >= 0 needed");
    } else {
        const mrp_sd3 *c = &s->sd3;
        if (c->heads < 1 || c->head_dim < 1 || c->layers < 1 || c->dual_layers < 0 || c->dual_layers > c->layers ||
            c->pos_embed_max_size < 1 || c->sample_size < 1)
            return mrp_fail("sd3: heads, head_dim, layers, pos_embed_max_size, sample_size must be positive, dual_layers <= layers");
        if (s->clip_l.hidden + s->clip_g.hidden > t->d_model)
            return mrp_fail("sd3: CLIP widths %d + %d exceed the T5 width %d (the pipeline pads CLIP to it)", s->clip_l.hidden,
                            s->clip_g.hidden, t->d_model);
    }
    const mrp_vae *v = &s->vae;
    if (v->n_blocks < 1 || v->n_blocks > 4 || v->layers_per_block < 1 || v->groups < 1)
        return mrp_fail("vae: 1..4 blocks, layers_per_block >= 1, groups >= 1");
    for (int i = 0; i < v->n_blocks; i++)
        if (v->channels[i] < 1 || v->channels[i] % v->groups)
            return mrp_fail("vae: channels[%d] = %d must be a positive multiple of groups %d", i, v->channels[i], v->groups);
    return 0;
}

/* Writes the whole pipeline folder `dir` (created if needed; existing files are replaced).
 * Returns 0, or -1 with mrp_last_error() naming what failed. */
static int mrp_write_pipeline(const mrp_spec *s, const char *dir) {
    if (check_spec(s)) return -1;
    if (make_dir(dir)) return -1;
    const bool flux = s->kind == MRP_FLUX;
    char path[4096], idx[2048];
    snprintf(idx, sizeof idx,
             "{\n  \"_class_name\": \"%s\",\n  \"_diffusers_version\": \"0.32.0\",\n"
             "  \"scheduler\": [\"diffusers\", \"FlowMatchEulerDiscreteScheduler\"],\n"
             "  \"text_encoder\": [\"transformers\", \"%s\"],\n  \"text_encoder_2\": [\"transformers\", \"%s\"],\n"
             "%s"
             "  \"tokenizer\": [\"transformers\", \"CLIPTokenizer\"],\n  \"tokenizer_2\": [\"transformers\", \"%s\"],\n"
             "%s"
             "  \"transformer\": [\"diffusers\", \"%s\"],\n  \"vae\": [\"diffusers\", \"AutoencoderKL\"]\n}\n",
             flux ? "FluxPipeline" : "StableDiffusion3Pipeline", flux ? "CLIPTextModel" : "CLIPTextModelWithProjection",
             flux ? "T5EncoderModel" : "CLIPTextModelWithProjection",
             flux ? "" : s->with_t5 ? "  \"text_encoder_3\": [\"transformers\", \"T5EncoderModel\"],\n" : "  \"text_encoder_3\": [null, null],\n",
             flux ? "T5TokenizerFast" : "CLIPTokenizer",
             flux ? "" : s->with_t5 ? "  \"tokenizer_3\": [\"transformers\", \"T5TokenizerFast\"],\n" : "  \"tokenizer_3\": [null, null],\n",
             flux ? "FluxTransformer2DModel" : "SD3Transformer2DModel");
    snprintf(path, sizeof path, "%s/model_index.json", dir);
    if (write_text(path, idx)) return -1;
    snprintf(path, sizeof path, "%s/scheduler", dir);
    if (make_dir(path)) return -1;
    snprintf(path, sizeof path, "%s/scheduler/scheduler_config.json", dir);
    const char *sched = flux ? "{\n  \"_class_name\": \"FlowMatchEulerDiscreteScheduler\",\n  \"base_image_seq_len\": 256,\n"
                               "  \"base_shift\": 0.5,\n  \"max_image_seq_len\": 4096,\n  \"max_shift\": 1.15,\n"
                               "  \"num_train_timesteps\": 1000,\n  \"shift\": 3.0,\n  \"use_dynamic_shifting\": true\n}\n"
                             : "{\n  \"_class_name\": \"FlowMatchEulerDiscreteScheduler\",\n  \"num_train_timesteps\": 1000,\n"
                               "  \"shift\": 3.0\n}\n";
    if (write_text(path, sched)) return -1;
    if (copy_tokenizer(s, dir, "clip_l", "tokenizer")) return -1;
    if (flux) {
        if (copy_tokenizer(s, dir, "t5", "tokenizer_2")) return -1;
        if (write_clip(dir, "text_encoder", &s->clip_l, s, "quick_gelu")) return -1;
        if (write_t5(dir, "text_encoder_2", s)) return -1;
    } else {
        if (copy_tokenizer(s, dir, "clip_g", "tokenizer_2")) return -1;
        if (s->with_t5 && copy_tokenizer(s, dir, "t5", "tokenizer_3")) return -1;
        if (write_clip(dir, "text_encoder", &s->clip_l, s, "quick_gelu")) return -1;
        if (write_clip(dir, "text_encoder_2", &s->clip_g, s, "gelu")) return -1;
        if (s->with_t5 && write_t5(dir, "text_encoder_3", s)) return -1;
    }
    if (write_transformer(dir, s)) return -1;
    return write_vae(dir, s);
}

/* ---- presets ------------------------------------------------------------------------------------ */
/* "tiny-flux" / "tiny-sd3": kilobyte-sized models (the golden tiny pipelines' shapes).
 * "sd35-medium": Stable Diffusion 3.5 Medium's real shapes (transformer 2.5 B parameters, CLIP-L,
 * CLIP-G, T5-XXL 4.8 B, VAE 84 M). "flux1": FLUX.1-dev's (12 B transformer). */
static int mrp_preset(const char *name, mrp_spec *s) {
    const char *tok = s->tokenizers;
    memset(s, 0, sizeof *s);
    s->tokenizers = tok;
    s->seed = 1;
    s->dtype = MRP_F32;
    if (strcmp(name, "tiny-flux") == 0 || strcmp(name, "tiny-sd3") == 0) {
        const bool flux = name[5] == 'f';
        s->kind = flux ? MRP_FLUX : MRP_SD3;
        s->clip_l = (mrp_clip){.hidden = 8, .layers = 3, .heads = 2, .intermediate = 32, .projection = flux ? 0 : 8};
        s->clip_g = (mrp_clip){.hidden = 12, .layers = 3, .heads = 2, .intermediate = 48, .projection = 12};
        s->t5 = (mrp_t5){.d_model = 24, .layers = 2, .heads = 3, .d_kv = 8, .d_ff = 48};
        s->with_t5 = true;
        s->flux = (mrp_flux){.heads = 2, .head_dim = 16, .layers = 2, .single_layers = 2};
        s->sd3 = (mrp_sd3){.heads = 2, .head_dim = 16, .layers = 3, .dual_layers = 2, .qk_norm = true, .pos_embed_max_size = 16,
                           .sample_size = 32};
        s->vae = (mrp_vae){.n_blocks = 4, .channels = {8, 16, 16, 16}, .layers_per_block = 1, .groups = 4};
        return 0;
    }
    if (strcmp(name, "sd35-medium") == 0) {
        s->kind = MRP_SD3;
        s->dtype = MRP_BF16;
        s->clip_l = (mrp_clip){.hidden = 768, .layers = 12, .heads = 12, .intermediate = 3072, .projection = 768};
        s->clip_g = (mrp_clip){.hidden = 1280, .layers = 32, .heads = 20, .intermediate = 5120, .projection = 1280};
        s->t5 = (mrp_t5){.d_model = 4096, .layers = 24, .heads = 64, .d_kv = 64, .d_ff = 10240};
        s->with_t5 = true;
        s->sd3 = (mrp_sd3){.heads = 24, .head_dim = 64, .layers = 24, .dual_layers = 13, .qk_norm = true,
                           .pos_embed_max_size = 384, .sample_size = 128};
        s->vae = (mrp_vae){.n_blocks = 4, .channels = {128, 256, 512, 512}, .layers_per_block = 2, .groups = 32};
        return 0;
    }
    if (strcmp(name, "flux1") == 0) {
        s->kind = MRP_FLUX;
        s->dtype = MRP_BF16;
        s->clip_l = (mrp_clip){.hidden = 768, .layers = 12, .heads = 12, .intermediate = 3072};
        s->t5 = (mrp_t5){.d_model = 4096, .layers = 24, .heads = 64, .d_kv = 64, .d_ff = 10240};
        s->flux = (mrp_flux){.heads = 24, .head_dim = 128, .layers = 19, .single_layers = 38, .guidance_embeds = true};
        s->vae = (mrp_vae){.n_blocks = 4, .channels = {128, 256, 512, 512}, .layers_per_block = 2, .groups = 32};
        return 0;
    }
    return mrp_fail("unknown preset '%s' (tiny-flux, tiny-sd3, sd35-medium, flux1)", name);
}

/* "component.field=value" overrides, e.g. "transformer.layers=4", "t5.layers=6", "vae.channels=64,128,256,256". */
static int mrp_set(mrp_spec *s, const char *kv) {
    const char *eq = strchr(kv, '=');
    if (!eq) return mrp_fail("--set '%s' is not key=value", kv);
    char key[64];
    size_t kl = (size_t)(eq - kv);
    if (kl >= sizeof key) return mrp_fail("--set key too long in '%s'", kv);
    memcpy(key, kv, kl);
    key[kl] = 0;
    const char *val = eq + 1;
    if (strcmp(key, "vae.channels") == 0) {
        int n = 0;
        const char *p = val;
        while (*p && n < 4) {
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p || v < 1 || v > 65536) return mrp_fail("vae.channels: bad list '%s'", val);
            s->vae.channels[n++] = (int)v;
            p = *end == ',' ? end + 1 : end;
            if (*end && *end != ',') return mrp_fail("vae.channels: bad list '%s'", val);
        }
        if (*p) return mrp_fail("vae.channels: at most 4 entries");
        s->vae.n_blocks = n;
        return 0;
    }
    if (strcmp(key, "dtype") == 0) {
        if (strcmp(val, "f32") == 0) s->dtype = MRP_F32;
        else if (strcmp(val, "bf16") == 0) s->dtype = MRP_BF16;
        else if (strcmp(val, "f16") == 0) s->dtype = MRP_F16;
        else return mrp_fail("dtype must be f32, bf16 or f16");
        return 0;
    }
    char *end;
    errno = 0;
    long v = strtol(val, &end, 10);
    if (errno || end == val || *end || v < 0 || v > (1 << 24)) return mrp_fail("--set %s: '%s' is not an integer 0..%d", key, val, 1 << 24);
    struct {
        const char *key;
        int *field;
    } ints[] = {
        {"clip_l.hidden", &s->clip_l.hidden},       {"clip_l.layers", &s->clip_l.layers},
        {"clip_l.heads", &s->clip_l.heads},         {"clip_l.intermediate", &s->clip_l.intermediate},
        {"clip_l.projection", &s->clip_l.projection}, {"clip_g.hidden", &s->clip_g.hidden},
        {"clip_g.layers", &s->clip_g.layers},       {"clip_g.heads", &s->clip_g.heads},
        {"clip_g.intermediate", &s->clip_g.intermediate}, {"clip_g.projection", &s->clip_g.projection},
        {"t5.d_model", &s->t5.d_model},             {"t5.layers", &s->t5.layers},
        {"t5.heads", &s->t5.heads},                 {"t5.d_kv", &s->t5.d_kv},
        {"t5.d_ff", &s->t5.d_ff},                   {"flux.heads", &s->flux.heads},
        {"flux.head_dim", &s->flux.head_dim},       {"flux.layers", &s->flux.layers},
        {"flux.single_layers", &s->flux.single_layers}, {"sd3.heads", &s->sd3.heads},
        {"sd3.head_dim", &s->sd3.head_dim},         {"sd3.layers", &s->sd3.layers},
        {"sd3.dual_layers", &s->sd3.dual_layers},   {"sd3.pos_embed_max_size", &s->sd3.pos_embed_max_size},
        {"sd3.sample_size", &s->sd3.sample_size},   {"vae.layers_per_block", &s->vae.layers_per_block},
        {"vae.groups", &s->vae.groups},
    };
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++)
        if (strcmp(ints[i].key, key) == 0) {
            *ints[i].field = (int)v;
            return 0;
        }
    if (strcmp(key, "t5.enabled") == 0) s->with_t5 = v != 0;
    else if (strcmp(key, "flux.guidance_embeds") == 0) s->flux.guidance_embeds = v != 0;
    else if (strcmp(key, "sd3.qk_norm") == 0) s->sd3.qk_norm = v != 0;
    else if (strcmp(key, "seed") == 0) s->seed = (uint64_t)v;
    else return mrp_fail("unknown --set key '%s'", key);
    return 0;
}

#ifndef MRP_NO_MAIN
static void usage(FILE *f) {
    fprintf(f, "usage: make-random-pipeline --preset NAME --out DIR --tokenizers DIR [--set key=value]...\n"
               "  presets: tiny-flux, tiny-sd3, sd35-medium, flux1\n"
               "  keys: dtype=f32|bf16|f16, seed=N, clip_l.{hidden,layers,heads,intermediate,projection},\n"
               "        clip_g.{...}, t5.{d_model,layers,heads,d_kv,d_ff,enabled}, flux.{heads,head_dim,layers,\n"
               "        single_layers,guidance_embeds}, sd3.{heads,head_dim,layers,dual_layers,pos_embed_max_size,\n"
               "        sample_size,qk_norm}, vae.{channels=a,b,c,d,layers_per_block,groups}\n"
               "  --tokenizers: a folder with clip_l/, clip_g/ and t5/ (e.g. tests/data/tokenizers)\n");
}

int main(int argc, char **argv) {
    const char *preset = NULL, *out = NULL, *tok = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            usage(stderr);
            return 2;
        }
        if (strcmp(a, "--preset") == 0) preset = argv[++i];
        else if (strcmp(a, "--out") == 0) out = argv[++i];
        else if (strcmp(a, "--tokenizers") == 0) tok = argv[++i];
        else if (strcmp(a, "--set") == 0) i++; /* applied after the preset */
        else {
            fprintf(stderr, "make-random-pipeline: unknown option %s\n", a);
            return 2;
        }
    }
    if (!preset || !out || !tok) {
        usage(stderr);
        return 2;
    }
    mrp_spec s = {.tokenizers = tok};
    if (mrp_preset(preset, &s)) {
        fprintf(stderr, "make-random-pipeline: %s\n", mrp_last_error());
        return 2;
    }
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--set") == 0 && mrp_set(&s, argv[++i])) {
            fprintf(stderr, "make-random-pipeline: %s\n", mrp_last_error());
            return 2;
        }
    if (mrp_write_pipeline(&s, out)) {
        fprintf(stderr, "make-random-pipeline: %s\n", mrp_last_error());
        return 1;
    }
    return 0;
}
#endif
