/* LoRA file formats and key names (see models/lora_file.h). */
#include "models/lora_file.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdiffusers/io.h"
#include "core/error_internal.h"

/* ---- key names ---------------------------------------------------------------------------- */
static const struct {
    const char *suffix;
    cdf_lora_key_kind kind;
    bool kohya;
    bool xlabs; /* only under an XLabs ".processor." module (".down.weight" is too common a name) */
} k_suffixes[] = {
    {".lora_A.weight", CDF_LORA_KEY_A, false, false},      {".lora_B.weight", CDF_LORA_KEY_B, false, false},
    {".lora_down.weight", CDF_LORA_KEY_A, true, false},    {".lora_up.weight", CDF_LORA_KEY_B, true, false},
    {".alpha", CDF_LORA_KEY_ALPHA, false, false},          {".dora_scale", CDF_LORA_KEY_DORA, false, false},
    {".lora_magnitude_vector", CDF_LORA_KEY_DORA, false, false},
    {".lora_magnitude_vector.weight", CDF_LORA_KEY_DORA, false, false},
    {".down.weight", CDF_LORA_KEY_A, false, true},         {".up.weight", CDF_LORA_KEY_B, false, true},
};

/* The first len bytes of key hold ".processor." (XLabs' attention-processor LoRA modules). */
static bool xlabs_module(const char *key, size_t len) {
    static const char needle[] = ".processor.";
    const size_t nl = sizeof needle - 1;
    for (size_t i = 0; i + nl <= len; i++)
        if (memcmp(key + i, needle, nl) == 0) return true;
    return false;
}

cdf_lora_key_kind cdf_lora_key_split(const char *key, char *base, size_t n, bool *kohya) {
    if (n) base[0] = '\0';
    if (kohya) *kohya = false;
    const size_t len = strlen(key);
    for (size_t i = 0; i < sizeof k_suffixes / sizeof *k_suffixes; i++) {
        const size_t sl = strlen(k_suffixes[i].suffix);
        if (len <= sl || strcmp(key + len - sl, k_suffixes[i].suffix) != 0) continue;
        if (k_suffixes[i].xlabs && !xlabs_module(key, len - sl)) continue;
        if (len - sl >= n) return CDF_LORA_KEY_OTHER;
        memcpy(base, key, len - sl);
        base[len - sl] = '\0';
        if (kohya) *kohya = k_suffixes[i].kohya;
        return k_suffixes[i].kind;
    }
    return CDF_LORA_KEY_OTHER;
}

static const char *const k_components[] = {"transformer", "text_encoder", "text_encoder_2", "text_encoder_3"};

bool cdf_lora_diffusers_target(const char *base, cdf_lora_target *t) {
    memset(t, 0, sizeof *t);
    const char *dot = strchr(base, '.');
    if (!dot || !dot[1]) return false;
    const size_t cl = (size_t)(dot - base);
    for (size_t i = 0; i < sizeof k_components / sizeof *k_components; i++) {
        if (strlen(k_components[i]) != cl || strncmp(base, k_components[i], cl) != 0) continue;
        if (strlen(dot + 1) >= CDF_LORA_NAME_MAX) return false;
        snprintf(t->component, sizeof t->component, "%s", k_components[i]);
        snprintf(t->module[0], CDF_LORA_NAME_MAX, "%s", dot + 1);
        t->n = 1;
        return true;
    }
    return false;
}

/* "<digits><end>" at *p: the number (at most 6 digits), p advanced past `end`. */
static bool take_index(const char **p, int *out, char end) {
    const char *s = *p;
    int v = 0, d = 0;
    while (*s >= '0' && *s <= '9') {
        if (++d > 6) return false;
        v = v * 10 + (*s++ - '0');
    }
    if (d == 0 || *s != end) return false;
    *p = s + 1;
    *out = v;
    return true;
}

static bool set_targets(cdf_lora_target *t, const char *component, const char *prefix, int n, const char *const *mods) {
    snprintf(t->component, sizeof t->component, "%s", component);
    t->n = n;
    for (int i = 0; i < n; i++) {
        int w = snprintf(t->module[i], CDF_LORA_NAME_MAX, "%s%s", prefix, mods[i]);
        if (w < 0 || w >= CDF_LORA_NAME_MAX) return false;
    }
    return true;
}

/* kohya FLUX.1 transformer names after "lora_unet_" (lora_conversion_utils.py,
 * _convert_sd_scripts_to_ai_toolkit). */
static bool kohya_unet(const char *s, cdf_lora_target *t) {
    char prefix[64];
    int i;
    if (strncmp(s, "double_blocks_", 14) == 0) {
        const char *p = s + 14;
        if (!take_index(&p, &i, '_')) return false;
        snprintf(prefix, sizeof prefix, "transformer_blocks.%d.", i);
        const bool img = strncmp(p, "img_", 4) == 0, txt = strncmp(p, "txt_", 4) == 0;
        if (!img && !txt) return false;
        p += 4;
        static const char *const qkv_img[] = {"attn.to_q", "attn.to_k", "attn.to_v"};
        static const char *const qkv_txt[] = {"attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"};
        static const struct {
            const char *part, *img, *txt;
        } one[] = {{"attn_proj", "attn.to_out.0", "attn.to_add_out"},
                   {"mlp_0", "ff.net.0.proj", "ff_context.net.0.proj"},
                   {"mlp_2", "ff.net.2", "ff_context.net.2"},
                   {"mod_lin", "norm1.linear", "norm1_context.linear"}};
        if (strcmp(p, "attn_qkv") == 0) return set_targets(t, "transformer", prefix, 3, img ? qkv_img : qkv_txt);
        for (size_t k = 0; k < sizeof one / sizeof *one; k++)
            if (strcmp(p, one[k].part) == 0) return set_targets(t, "transformer", prefix, 1, img ? &one[k].img : &one[k].txt);
        return false;
    }
    if (strncmp(s, "single_blocks_", 14) == 0) {
        const char *p = s + 14;
        if (!take_index(&p, &i, '_')) return false;
        snprintf(prefix, sizeof prefix, "single_transformer_blocks.%d.", i);
        static const char *const linear1[] = {"attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"};
        static const char *const linear2[] = {"proj_out"}, *const mod[] = {"norm.linear"};
        if (strcmp(p, "linear1") == 0) return set_targets(t, "transformer", prefix, 4, linear1);
        if (strcmp(p, "linear2") == 0) return set_targets(t, "transformer", prefix, 1, linear2);
        if (strcmp(p, "modulation_lin") == 0) return set_targets(t, "transformer", prefix, 1, mod);
        return false;
    }
    static const struct {
        const char *kohya, *diffusers;
    } other[] = {
        {"img_in", "x_embedder"},
        {"txt_in", "context_embedder"},
        {"time_in_in_layer", "time_text_embed.timestep_embedder.linear_1"},
        {"time_in_out_layer", "time_text_embed.timestep_embedder.linear_2"},
        {"vector_in_in_layer", "time_text_embed.text_embedder.linear_1"},
        {"vector_in_out_layer", "time_text_embed.text_embedder.linear_2"},
        {"guidance_in_in_layer", "time_text_embed.guidance_embedder.linear_1"},
        {"guidance_in_out_layer", "time_text_embed.guidance_embedder.linear_2"},
        {"final_layer_linear", "proj_out"},
        {"final_layer_adaLN_modulation_1", "norm_out.linear"},
    };
    for (size_t k = 0; k < sizeof other / sizeof *other; k++)
        if (strcmp(s, other[k].kohya) == 0) {
            if (!set_targets(t, "transformer", "", 1, &other[k].diffusers)) return false;
            /* diffusers: final_layer alphas are dropped, adaLN's lora_up has its halves swapped */
            t->ignore_alpha = strncmp(s, "final_layer_", 12) == 0;
            t->swap_halves = strcmp(s, "final_layer_adaLN_modulation_1") == 0;
            return true;
        }
    return false;
}

/* kohya CLIP-L names after "lora_te_" / "lora_te1_" (_convert_text_encoder_lora_key). */
static bool kohya_te(const char *s, cdf_lora_target *t) {
    const char *p = s;
    if (strncmp(p, "text_model_encoder_layers_", 26) != 0) return false;
    p += 26;
    int i;
    if (!take_index(&p, &i, '_')) return false;
    static const struct {
        const char *kohya, *diffusers;
    } parts[] = {{"self_attn_q_proj", "self_attn.q_proj"},     {"self_attn_k_proj", "self_attn.k_proj"},
                 {"self_attn_v_proj", "self_attn.v_proj"},     {"self_attn_out_proj", "self_attn.out_proj"},
                 {"mlp_fc1", "mlp.fc1"},                       {"mlp_fc2", "mlp.fc2"}};
    char prefix[64];
    snprintf(prefix, sizeof prefix, "text_model.encoder.layers.%d.", i);
    for (size_t k = 0; k < sizeof parts / sizeof *parts; k++)
        if (strcmp(p, parts[k].kohya) == 0) return set_targets(t, "text_encoder", prefix, 1, &parts[k].diffusers);
    return false;
}

bool cdf_lora_kohya_target(const char *base, cdf_lora_target *t) {
    memset(t, 0, sizeof *t);
    /* ComfyUI spellings: dotted module paths under other prefixes */
    char norm[CDF_LORA_NAME_MAX];
    static const struct {
        const char *from, *to;
    } pre[] = {{"diffusion_model.", "lora_unet_"}, {"text_encoders.clip_l.transformer.", "lora_te_"}};
    const char *s = base;
    for (size_t k = 0; k < sizeof pre / sizeof *pre; k++) {
        const size_t fl = strlen(pre[k].from);
        if (strncmp(base, pre[k].from, fl) != 0) continue;
        int w = snprintf(norm, sizeof norm, "%s%s", pre[k].to, base + fl);
        if (w < 0 || (size_t)w >= sizeof norm) return false;
        for (char *c = norm + strlen(pre[k].to); *c; c++)
            if (*c == '.') *c = '_';
        s = norm;
        break;
    }
    if (strncmp(s, "lora_unet_", 10) == 0) return kohya_unet(s + 10, t);
    if (strncmp(s, "lora_te1_", 9) == 0) return kohya_te(s + 9, t);
    if (strncmp(s, "lora_te_", 8) == 0) return kohya_te(s + 8, t);
    return false;
}

/* XLabs names: "[diffusion_model.]double_blocks.<i>.processor.qkv_lora1" etc. (diffusers'
 * _convert_xlabs_flux_lora_to_diffusers: qkv_lora1/2 split in three equal row blocks over the
 * image/text q, k, v; proj_lora1/2 the attention outputs; in single blocks qkv_lora -> q, k, v
 * and proj_lora -> proj_out). */
bool cdf_lora_xlabs_target(const char *base, cdf_lora_target *t) {
    memset(t, 0, sizeof *t);
    const char *p = base;
    if (strncmp(p, "diffusion_model.", 16) == 0) p += 16;
    const bool dbl = strncmp(p, "double_blocks.", 14) == 0, sgl = strncmp(p, "single_blocks.", 14) == 0;
    if (!dbl && !sgl) return false;
    p += 14;
    int i;
    if (!take_index(&p, &i, '.') || strncmp(p, "processor.", 10) != 0) return false;
    p += 10;
    char prefix[64];
    snprintf(prefix, sizeof prefix, "%s.%d.", dbl ? "transformer_blocks" : "single_transformer_blocks", i);
    static const char *const qkv_img[] = {"attn.to_q", "attn.to_k", "attn.to_v"};
    static const char *const qkv_txt[] = {"attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"};
    static const char *const out_img[] = {"attn.to_out.0"}, *const out_txt[] = {"attn.to_add_out"};
    static const char *const proj_out[] = {"proj_out"};
    if (dbl && strcmp(p, "qkv_lora1") == 0) return set_targets(t, "transformer", prefix, 3, qkv_img);
    if (dbl && strcmp(p, "qkv_lora2") == 0) return set_targets(t, "transformer", prefix, 3, qkv_txt);
    if (dbl && strcmp(p, "proj_lora1") == 0) return set_targets(t, "transformer", prefix, 1, out_img);
    if (dbl && strcmp(p, "proj_lora2") == 0) return set_targets(t, "transformer", prefix, 1, out_txt);
    if (sgl && strcmp(p, "qkv_lora") == 0) return set_targets(t, "transformer", prefix, 3, qkv_img);
    if (sgl && strcmp(p, "proj_lora") == 0) return set_targets(t, "transformer", prefix, 1, proj_out);
    return false;
}

/* ---- FLUX.2 (Flux2LoraLoaderMixin.lora_state_dict) ------------------------------------------ */
static bool flux2_double(const char *part, char sep, cdf_lora_target *t, const char *prefix) {
    /* part is "img_attn<sep>qkv" etc. with sep '_' (kohya) or '.' (ai-toolkit) */
    static const char *const qkv_img[] = {"attn.to_q", "attn.to_k", "attn.to_v"};
    static const char *const qkv_txt[] = {"attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"};
    static const struct {
        const char *orig, *diffusers;
    } one[] = {{"img_attn#proj", "attn.to_out.0"},   {"txt_attn#proj", "attn.to_add_out"},
               {"img_mlp#0", "ff.linear_in"},        {"img_mlp#2", "ff.linear_out"},
               {"txt_mlp#0", "ff_context.linear_in"}, {"txt_mlp#2", "ff_context.linear_out"}};
    char want[32];
    for (int k = 0; k < 2; k++) {
        snprintf(want, sizeof want, "%s_attn%cqkv", k ? "txt" : "img", sep);
        if (strcmp(part, want) == 0) return set_targets(t, "transformer", prefix, 3, k ? qkv_txt : qkv_img);
    }
    for (size_t k = 0; k < sizeof one / sizeof *one; k++) {
        snprintf(want, sizeof want, "%s", one[k].orig);
        *strchr(want, '#') = sep;
        if (strcmp(part, want) == 0) return set_targets(t, "transformer", prefix, 1, &one[k].diffusers);
    }
    return false;
}

static bool flux2_blocks(const char *s, char sep, cdf_lora_target *t) {
    char prefix[64], head[32];
    int i;
    for (int dbl = 0; dbl < 2; dbl++) {
        snprintf(head, sizeof head, "%s_blocks%c", dbl ? "double" : "single", sep);
        const size_t hl = strlen(head);
        if (strncmp(s, head, hl) != 0) continue;
        const char *p = s + hl;
        if (!take_index(&p, &i, sep)) return false;
        if (dbl) {
            snprintf(prefix, sizeof prefix, "transformer_blocks.%d.", i);
            return flux2_double(p, sep, t, prefix);
        }
        snprintf(prefix, sizeof prefix, "single_transformer_blocks.%d.", i);
        static const char *const l1[] = {"attn.to_qkv_mlp_proj"}, *const l2[] = {"attn.to_out"};
        if (strcmp(p, "linear1") == 0) return set_targets(t, "transformer", prefix, 1, l1);
        if (strcmp(p, "linear2") == 0) return set_targets(t, "transformer", prefix, 1, l2);
        return false;
    }
    return false;
}

bool cdf_lora_kohya_flux2_target(const char *base, cdf_lora_target *t) {
    memset(t, 0, sizeof *t);
    if (strncmp(base, "lora_unet_", 10) != 0) return false;
    const char *s = base + 10;
    if (flux2_blocks(s, '_', t)) return true;
    static const struct {
        const char *kohya, *diffusers;
    } other[] = {
        {"img_in", "x_embedder"},
        {"txt_in", "context_embedder"},
        {"time_in_in_layer", "time_guidance_embed.timestep_embedder.linear_1"},
        {"time_in_out_layer", "time_guidance_embed.timestep_embedder.linear_2"},
        {"final_layer_linear", "proj_out"},
    };
    for (size_t k = 0; k < sizeof other / sizeof *other; k++)
        if (strcmp(s, other[k].kohya) == 0) return set_targets(t, "transformer", "", 1, &other[k].diffusers);
    memset(t, 0, sizeof *t);
    return false;
}

bool cdf_lora_aitk_flux2_target(const char *base, cdf_lora_target *t) {
    memset(t, 0, sizeof *t);
    if (strncmp(base, "diffusion_model.", 16) != 0) return false;
    const char *s = base + 16;
    /* diffusers' block names already (and the "sformer_blocks." alias of some exports) */
    static const struct {
        const char *from, *to;
    } pass[] = {{"single_transformer_blocks.", "single_transformer_blocks."},
                {"transformer_blocks.", "transformer_blocks."},
                {"sformer_blocks.", "transformer_blocks."}};
    for (size_t k = 0; k < sizeof pass / sizeof *pass; k++) {
        const size_t fl = strlen(pass[k].from);
        if (strncmp(s, pass[k].from, fl) != 0) continue;
        const char *rest = s + fl;
        return set_targets(t, "transformer", pass[k].to, 1, &rest);
    }
    if (flux2_blocks(s, '.', t)) return true;
    static const struct {
        const char *orig, *diffusers;
    } other[] = {
        {"img_in", "x_embedder"},
        {"txt_in", "context_embedder"},
        {"time_in.in_layer", "time_guidance_embed.timestep_embedder.linear_1"},
        {"time_in.out_layer", "time_guidance_embed.timestep_embedder.linear_2"},
        {"guidance_in.in_layer", "time_guidance_embed.guidance_embedder.linear_1"},
        {"guidance_in.out_layer", "time_guidance_embed.guidance_embedder.linear_2"},
        {"final_layer.linear", "proj_out"},
        {"final_layer.adaLN_modulation.1", "norm_out.linear"}, /* no scale/shift swap here (unlike FLUX.1 kohya) */
        {"single_stream_modulation.lin", "single_stream_modulation.linear"},
        {"double_stream_modulation_img.lin", "double_stream_modulation_img.linear"},
        {"double_stream_modulation_txt.lin", "double_stream_modulation_txt.linear"},
    };
    for (size_t k = 0; k < sizeof other / sizeof *other; k++)
        if (strcmp(s, other[k].orig) == 0) return set_targets(t, "transformer", "", 1, &other[k].diffusers);
    memset(t, 0, sizeof *t);
    return false;
}

/* ---- files ---------------------------------------------------------------------------------- */
typedef struct group {
    char base[CDF_LORA_NAME_MAX];
    const cdf_st_tensor *a, *b, *alpha;
    bool kohya;
} group;

void cdf_lora_file_free(cdf_lora_file *f) {
    if (!f) return;
    for (int i = 0; i < f->n; i++) {
        free(f->e[i].a);
        free(f->e[i].b);
    }
    free(f->e);
    for (int i = 0; i < f->n_unused; i++) free(f->unused[i]);
    free(f->unused);
    free(f);
}

static cdf_status add_unused(cdf_lora_file *lf, const char *key) {
    char **u = realloc(lf->unused, (size_t)(lf->n_unused + 1) * sizeof *u);
    if (!u) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    lf->unused = u;
    if (!(u[lf->n_unused] = strdup(key))) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    lf->n_unused++;
    return CDF_OK;
}

/* The tensor as a malloc'ed f32 array, every value checked finite. */
static float *read_finite(const cdf_st_file *f, const cdf_st_tensor *t, const char *path) {
    if (!cdf_dtype_is_float(t->dtype)) {
        cdf_error(CDF_ERR_DTYPE, "LoRA file %s: '%s' has dtype %s (a float dtype is needed)", path, t->name,
                  cdf_dtype_name(t->dtype));
        return NULL;
    }
    const int64_t n = cdf_st_numel(t);
    float *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    if (!v) {
        cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory reading '%s' from %s", t->name, path);
        return NULL;
    }
    const void *src = cdf_st_touch(f, t);
    if (!src && n) {
        free(v);
        cdf_error(CDF_ERR_FORMAT, "LoRA file %s: data of '%s' is not readable", path, t->name);
        return NULL;
    }
    cdf_convert(v, CDF_F32, src, t->dtype, (size_t)n);
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(v[i])) {
            cdf_error(CDF_ERR_FORMAT, "LoRA file %s: '%s' holds a non-finite value (%g at element %lld)", path, t->name,
                      (double)v[i], (long long)i);
            free(v);
            return NULL;
        }
    return v;
}

static cdf_status build_entry(const cdf_st_file *f, const group *g, const cdf_lora_target *tg, const char *path,
                              cdf_lora_entry *e) {
    memset(e, 0, sizeof *e);
    e->target = *tg;
    snprintf(e->source, sizeof e->source, "%s", g->base);
    const cdf_st_tensor *a = g->a, *b = g->b;
    if (a->ndim != 2 || b->ndim != 2)
        return cdf_error(CDF_ERR_SHAPE, "LoRA file %s: '%s' has %d-D lora_A and %d-D lora_B (2-D matrices are needed; "
                         "convolution LoRAs are not supported)", path, g->base, a->ndim, b->ndim);
    if (a->shape[0] != b->shape[1])
        return cdf_error(CDF_ERR_SHAPE, "LoRA file %s: '%s': rank mismatch: lora_A is [%lld, %lld] (rank %lld) but lora_B is "
                         "[%lld, %lld] (rank %lld)", path, g->base, (long long)a->shape[0], (long long)a->shape[1],
                         (long long)a->shape[0], (long long)b->shape[0], (long long)b->shape[1], (long long)b->shape[1]);
    if (a->shape[0] < 1 || a->shape[1] < 1 || b->shape[0] < 1)
        return cdf_error(CDF_ERR_SHAPE, "LoRA file %s: '%s' has an empty matrix", path, g->base);
    e->rank = a->shape[0];
    e->in = a->shape[1];
    e->out = b->shape[0];
    e->mult = 1.0f;
    if (g->alpha && !tg->ignore_alpha) {
        if (cdf_st_numel(g->alpha) != 1)
            return cdf_error(CDF_ERR_SHAPE, "LoRA file %s: '%s.alpha' must be a single number", path, g->base);
        float *al = read_finite(f, g->alpha, path);
        if (!al) return cdf_last_status();
        e->mult = (float)((double)al[0] / (double)e->rank);
        free(al);
    }
    if (!(e->a = read_finite(f, a, path)) || !(e->b = read_finite(f, b, path))) return cdf_last_status();
    if (tg->swap_halves) {
        if (e->out % 2) return cdf_error(CDF_ERR_SHAPE, "LoRA file %s: '%s' lora_up has an odd row count", path, g->base);
        /* diffusers' swap_scale_shift: (shift, scale) rows -> (scale, shift) */
        const size_t half = (size_t)(e->out / 2 * e->rank);
        float *sw = malloc(half * 2 * sizeof *sw);
        if (!sw) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
        memcpy(sw, e->b + half, half * sizeof *sw);
        memcpy(sw + half, e->b, half * sizeof *sw);
        free(e->b);
        e->b = sw;
    }
    return CDF_OK;
}

static cdf_status parse(const cdf_st_file *f, const char *path, cdf_lora_family family, cdf_lora_file *lf) {
    const int nt = cdf_st_count(f);
    group *g = calloc((size_t)nt + 1, sizeof *g);
    if (!g) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    int ng = 0;
    bool kohya = false, xlabs = false;
    cdf_status s = CDF_OK;
    for (int i = 0; i < nt && s == CDF_OK; i++) {
        const cdf_st_tensor *t = cdf_st_tensor_at(f, i);
        char base[CDF_LORA_NAME_MAX];
        bool ko;
        const cdf_lora_key_kind kind = cdf_lora_key_split(t->name, base, sizeof base, &ko);
        if (kind == CDF_LORA_KEY_DORA) {
            s = cdf_error(CDF_ERR_UNSUPPORTED, "LoRA file %s is a DoRA adapter ('%s'): DoRA is not supported (its magnitude "
                          "vectors cannot be dropped without changing the result)", path, t->name);
            break;
        }
        if (kind == CDF_LORA_KEY_OTHER) {
            s = add_unused(lf, t->name);
            continue;
        }
        int j = 0;
        while (j < ng && strcmp(g[j].base, base) != 0) j++;
        if (j == ng) snprintf(g[ng++].base, CDF_LORA_NAME_MAX, "%s", base);
        const cdf_st_tensor **slot = kind == CDF_LORA_KEY_A ? &g[j].a : kind == CDF_LORA_KEY_B ? &g[j].b : &g[j].alpha;
        if (*slot) {
            s = cdf_error(CDF_ERR_FORMAT, "LoRA file %s: '%s' and '%s' are the same tensor in two spellings", path, (*slot)->name,
                          t->name);
            break;
        }
        *slot = t;
        if (kind != CDF_LORA_KEY_ALPHA) g[j].kohya |= ko;
        kohya |= ko;
        xlabs |= strstr(t->name, "processor") != NULL;
    }
    /* as diffusers: any lora_down key makes the file kohya; within it, "transformer."-prefixed
     * modules are PEFT names with kohya suffixes. Otherwise any key with "processor" makes it
     * XLabs (whose converter passes other keys through unchanged, so diffusers names still load).
     * FLUX.2 (Flux2LoraLoaderMixin): kohya as well (its own converter, which keeps nothing but
     * "lora_unet_" names), no XLabs, and a key starting "diffusion_model." makes the file
     * ai-toolkit's (whose converter rejects anything else, alphas included). */
    const bool flux2 = family == CDF_LORA_FAMILY_FLUX2;
    bool aitk = false, peft_saved = false;
    /* FLUX.2 files saved by PEFT itself ("base_model.model.double_blocks.0..."): diffusers renames
     * the prefix to "diffusion_model." before anything else, so they are ai-toolkit files */
    for (int j = 0; flux2 && !kohya && j < ng; j++)
        if (strncmp(g[j].base, "base_model.model.", 17) == 0) {
            char renamed[CDF_LORA_NAME_MAX];
            snprintf(renamed, sizeof renamed, "diffusion_model.%s", g[j].base + 17);
            memcpy(g[j].base, renamed, sizeof renamed);
            peft_saved = true;
        }
    for (int j = 0; flux2 && !kohya && j < ng; j++) aitk |= strncmp(g[j].base, "diffusion_model.", 16) == 0;
    xlabs &= !kohya && !flux2;
    lf->format = kohya ? "kohya" : xlabs ? "XLabs" : peft_saved ? "PEFT (base_model.model.)" : aitk ? "ai-toolkit" : "diffusers";
    for (int j = 0; j < ng && s == CDF_OK; j++) {
        cdf_lora_target tg;
        const bool peft = strncmp(g[j].base, "transformer.", 12) == 0;
        bool known;
        if (flux2 && kohya) known = cdf_lora_kohya_flux2_target(g[j].base, &tg);
        else if (aitk) known = cdf_lora_aitk_flux2_target(g[j].base, &tg);
        else
            known = kohya && !peft                               ? cdf_lora_kohya_target(g[j].base, &tg)
                    : xlabs && strstr(g[j].base, ".processor.") ? cdf_lora_xlabs_target(g[j].base, &tg)
                                                                 : cdf_lora_diffusers_target(g[j].base, &tg);
        if (known && aitk && g[j].alpha) {
            s = add_unused(lf, g[j].alpha->name); /* diffusers' ai-toolkit FLUX.2 converter takes no alphas */
            g[j].alpha = NULL;
        }
        if (known && xlabs && !peft && g[j].alpha) {
            /* diffusers' XLabs loader takes no alphas (its converter rejects or misfiles them):
             * reported as unused rather than applied or dropped silently */
            s = add_unused(lf, g[j].alpha->name);
            g[j].alpha = NULL;
        }
        if (!known || !g[j].a || !g[j].b) {
            if (known && (g[j].a || g[j].b)) {
                s = cdf_error(CDF_ERR_FORMAT, "LoRA file %s: '%s' has %s but no %s", path, g[j].base,
                              g[j].a ? "lora_A (lora_down)" : "lora_B (lora_up)", g[j].a ? "lora_B (lora_up)" : "lora_A (lora_down)");
                break;
            }
            const cdf_st_tensor *ts[3] = {g[j].a, g[j].b, g[j].alpha};
            for (int k = 0; k < 3 && s == CDF_OK; k++)
                if (ts[k]) s = add_unused(lf, ts[k]->name);
            continue;
        }
        cdf_lora_entry *ne = realloc(lf->e, (size_t)(lf->n + 1) * sizeof *ne);
        if (!ne) {
            s = cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
            break;
        }
        lf->e = ne;
        s = build_entry(f, &g[j], &tg, path, &lf->e[lf->n]);
        lf->n++; /* freed with the file even when partly built */
    }
    free(g);
    if (s == CDF_OK && lf->n == 0)
        s = cdf_error(CDF_ERR_FORMAT, "LoRA file %s holds no LoRA weights of a known module (%d tensors%s%s)", path, nt,
                      lf->n_unused ? ", e.g. " : "", lf->n_unused ? lf->unused[0] : "");
    return s;
}

cdf_status cdf_lora_file_load(const char *path, cdf_lora_family family, cdf_lora_file **out) {
    *out = NULL;
    cdf_st_file *f = NULL;
    cdf_status s = cdf_st_open(path, &f);
    if (s != CDF_OK) return cdf_error_prefix("LoRA file: ");
    cdf_lora_file *lf = calloc(1, sizeof *lf);
    s = lf ? parse(f, path, family, lf) : cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    cdf_st_close(f);
    if (s != CDF_OK) {
        cdf_lora_file_free(lf);
        return s;
    }
    *out = lf;
    return CDF_OK;
}
