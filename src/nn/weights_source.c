/* Weights sources: diffusers folders, fp8-scaled safetensors, converted single files and GGUF
 * (see weights_source.h). */
#include "nn/weights_source.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "io/io_internal.h"

/* Original layouts a file may hold (an all-in-one file holds several, each under its prefix). */
enum { LAYOUT_FLUX_BFL, LAYOUT_FLUX2_BFL, LAYOUT_SD3_SAI, LAYOUT_LDM_VAE, N_LAYOUTS };

struct cdf_wsrc {
    char *path;
    cdf_checkpoint *ck;  /* safetensors (folder or file) */
    cdf_gguf_file *gg;   /* or GGUF */
    bool has[N_LAYOUTS];
    bool used_layout[N_LAYOUTS];
    const char *prefix[N_LAYOUTS]; /* "model.diffusion_model.", "vae.", ... or "" */
    int vae_up_blocks;   /* LDM VAE: number of decoder.up.N blocks (diffusers numbers them reversed) */
    int sd3_last_block;    /* SD3: index of the last joint block (its context modulation is swapped) */
    bool diffusers_layout; /* none of the original layouts: names are diffusers' */
    /* A text encoder of an all-in-one file ("text_encoders.clip_l.transformer." ...): its names
     * are transformers' under that prefix (diffusers' convert_ldm_clip_checkpoint /
     * convert_sd3_t5_checkpoint_to_diffusers only strip it); "" when this source serves another
     * component or the file has no such part. */
    char te_prefix[64];
    char te_parts[96];      /* the text encoders the file holds, for messages ("clip_l, t5xxl") */
    char te_wanted[16];     /* the part this source was opened for */
    bool te_identity_proj;  /* clip_l: text_projection.weight is the identity (see cdf_wsrc_find) */
    int64_t te_hidden;      /* clip_l: width of its position embedding */
    char format[192];
    bool found_any;
    char hint[600];
    uint8_t *used;       /* per source tensor (converted files) */
};

/* ---- raw source tensors ---- */

typedef struct raw {
    int idx; /* position, for `used` */
    int ndim;
    int64_t shape[CDF_ST_MAX_DIMS];
    const uint8_t *bytes;
    uint64_t nbytes;
    cdf_dtype dtype; /* safetensors dtype, or the cdf dtype of an F32/F16/BF16 GGUF tensor */
    int ggml;        /* GGUF type needing dequantization, else -1 */
} raw;

static int count_raw(const cdf_wsrc *s) { return s->gg ? cdf_gguf_count(s->gg) : cdf_checkpoint_count(s->ck); }

static const char *raw_name_at(const cdf_wsrc *s, int i) {
    return s->gg ? cdf_gguf_tensor_at(s->gg, i)->name : cdf_checkpoint_name_at(s->ck, i);
}

/* The source tensor `pfx` + `name`. */
static bool raw_find(const cdf_wsrc *s, const char *pfx, const char *name, raw *r) {
    char full[600];
    snprintf(full, sizeof full, "%s%s", pfx, name);
    memset(r, 0, sizeof *r);
    r->ggml = -1;
    if (s->gg) {
        const cdf_gguf_tensor *t = cdf_gguf_find(s->gg, full);
        if (!t) return false;
        r->idx = (int)(t - cdf_gguf_tensor_at(s->gg, 0));
        r->ndim = t->ndim;
        memcpy(r->shape, t->shape, sizeof r->shape);
        r->bytes = cdf_gguf_data(s->gg, t);
        r->nbytes = t->nbytes;
        switch (t->type) {
        case CDF_GGML_F32: r->dtype = CDF_F32; break;
        case CDF_GGML_F16: r->dtype = CDF_F16; break;
        case CDF_GGML_BF16: r->dtype = CDF_BF16; break;
        default: r->dtype = CDF_F32, r->ggml = (int)t->type; break;
        }
        return true;
    }
    const cdf_st_file *f;
    const cdf_st_tensor *t;
    if (!cdf_checkpoint_has(s->ck, full) || cdf_checkpoint_find(s->ck, full, &f, &t) != CDF_OK) return false;
    /* names are sorted: binary search for the index */
    int lo = 0, hi = cdf_checkpoint_count(s->ck) - 1;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (strcmp(cdf_checkpoint_name_at(s->ck, mid), full) < 0) lo = mid + 1;
        else hi = mid;
    }
    r->idx = lo;
    r->ndim = t->ndim;
    memcpy(r->shape, t->shape, sizeof r->shape);
    r->bytes = cdf_st_data(f, t);
    r->nbytes = t->nbytes;
    r->dtype = t->dtype;
    return true;
}

/* ---- FLUX: BFL names -> diffusers names (diffusers' convert_flux_transformer_checkpoint_to_diffusers) ---- */

typedef struct key_rename {
    const char *diffusers, *bfl;
} key_rename;

/* Whole-model renames (suffix ".weight"/".bias" appended by the caller). */
static const key_rename k_flux_top[] = {
    {"time_text_embed.timestep_embedder.linear_1", "time_in.in_layer"},
    {"time_text_embed.timestep_embedder.linear_2", "time_in.out_layer"},
    {"time_text_embed.text_embedder.linear_1", "vector_in.in_layer"},
    {"time_text_embed.text_embedder.linear_2", "vector_in.out_layer"},
    {"time_text_embed.guidance_embedder.linear_1", "guidance_in.in_layer"},
    {"time_text_embed.guidance_embedder.linear_2", "guidance_in.out_layer"},
    {"context_embedder", "txt_in"},
    {"x_embedder", "img_in"},
    {"proj_out", "final_layer.linear"},
};

static const key_rename k_flux_double[] = {
    {"norm1.linear", "img_mod.lin"},          {"norm1_context.linear", "txt_mod.lin"},
    {"ff.net.0.proj", "img_mlp.0"},           {"ff.net.2", "img_mlp.2"},
    {"ff_context.net.0.proj", "txt_mlp.0"},   {"ff_context.net.2", "txt_mlp.2"},
    {"attn.to_out.0", "img_attn.proj"},       {"attn.to_add_out", "txt_attn.proj"},
    {"attn.norm_q", "img_attn.norm.query_norm"}, {"attn.norm_k", "img_attn.norm.key_norm"},
    {"attn.norm_added_q", "txt_attn.norm.query_norm"}, {"attn.norm_added_k", "txt_attn.norm.key_norm"},
};

static const key_rename k_flux_single[] = {
    {"norm.linear", "modulation.lin"},
    {"proj_out", "linear2"},
    {"attn.norm_q", "norm.query_norm"},
    {"attn.norm_k", "norm.key_norm"},
};

/* Splits "<stem>.<weight|bias>"; the BFL norms call the weight "scale". */
static bool split_param(const char *name, char *stem, size_t n, const char **param) {
    const char *dot = strrchr(name, '.');
    if (!dot || (size_t)(dot - name) >= n) return false;
    memcpy(stem, name, (size_t)(dot - name));
    stem[dot - name] = 0;
    *param = dot + 1;
    return strcmp(*param, "weight") == 0 || strcmp(*param, "bias") == 0;
}

/* Block index after `prefix` ("transformer_blocks."): the rest goes to *rest. */
static bool block_of(const char *name, const char *prefix, int *idx, const char **rest) {
    size_t n = strlen(prefix);
    if (strncmp(name, prefix, n) != 0) return false;
    const char *p = name + n;
    if (*p < '0' || *p > '9') return false;
    int v = 0;
    while (*p >= '0' && *p <= '9' && v < 100000) v = v * 10 + (*p++ - '0');
    if (*p != '.') return false;
    *idx = v;
    *rest = p + 1;
    return true;
}

/* Part k of n equal row chunks of the source tensor (torch.chunk of a divisible dim 0). */
static bool set_chunk(const cdf_wsrc *s, const char *pfx, cdf_wsrc_tensor *t, int k, int n) {
    raw r;
    if (!raw_find(s, pfx, t->src_name, &r) || r.ndim < 1 || r.shape[0] % n) return false;
    t->nrows = r.shape[0] / n;
    t->row0 = k * t->nrows;
    return true;
}

#define N_OF(tab) (sizeof tab / sizeof *tab)

/* BFL's name of diffusers' `rest` in `tab`, or NULL. */
static const char *bfl_name(const key_rename *tab, size_t n, const char *rest) {
    for (size_t k = 0; k < n; k++)
        if (strcmp(rest, tab[k].diffusers) == 0) return tab[k].bfl;
    return NULL;
}

/* The parameter's BFL name: the q/k norms' weight is "scale" (NULL for any other norm param). */
static const char *bfl_param(const char *stem, const char *param) {
    bool norm = strstr(stem, "norm_q") || strstr(stem, "norm_k") || strstr(stem, "norm_added_");
    return norm ? (strcmp(param, "weight") == 0 ? "scale" : NULL) : param;
}

/* Diffusers' `rest` of double block i in a BFL file (FLUX.1 and FLUX.2 alike): renamed by `tab`,
 * or a third of the img / txt fused qkv (torch.chunk(qkv, 3, dim=0)). */
static bool bfl_double(const cdf_wsrc *s, const char *pfx, int i, const char *rest, const char *bparam, const key_rename *tab,
                       size_t n, cdf_wsrc_tensor *t) {
    const char *b = bfl_name(tab, n, rest);
    if (b) {
        snprintf(t->src_name, sizeof t->src_name, "double_blocks.%d.%s.%s", i, b, bparam);
        return true;
    }
    static const char *const qkv[6] = {"attn.to_q", "attn.to_k", "attn.to_v", "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"};
    for (int k = 0; k < 6; k++)
        if (strcmp(rest, qkv[k]) == 0) {
            snprintf(t->src_name, sizeof t->src_name, "double_blocks.%d.%s.qkv.%s", i, k < 3 ? "img_attn" : "txt_attn", bparam);
            return set_chunk(s, pfx, t, k % 3, 3);
        }
    return false;
}

/* Diffusers' `stem` outside the blocks, renamed by `tab`. */
static bool bfl_top(const key_rename *tab, size_t n, const char *stem, const char *param, cdf_wsrc_tensor *t) {
    const char *b = bfl_name(tab, n, stem);
    if (b) snprintf(t->src_name, sizeof t->src_name, "%s.%s", b, param);
    return b != NULL;
}

/* Where diffusers' `name` comes from in a BFL FLUX file; false if nowhere. */
static bool flux_recipe(const cdf_wsrc *s, const char *pfx, const char *name, cdf_wsrc_tensor *t) {
    char stem[512];
    const char *param, *rest, *b;
    int i;
    if (!split_param(name, stem, sizeof stem, &param)) return false;
    const char *bparam = bfl_param(stem, param);
    if (!bparam) return false;
    t->row0 = 0, t->nrows = -1, t->swap_halves = false;
    if (block_of(stem, "transformer_blocks.", &i, &rest))
        return bfl_double(s, pfx, i, rest, bparam, k_flux_double, N_OF(k_flux_double), t);
    if (block_of(stem, "single_transformer_blocks.", &i, &rest)) {
        if ((b = bfl_name(k_flux_single, N_OF(k_flux_single), rest))) {
            snprintf(t->src_name, sizeof t->src_name, "single_blocks.%d.%s.%s", i, b, bparam);
            return true;
        }
        static const char *const parts[4] = {"attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"};
        for (int k = 0; k < 4; k++)
            if (strcmp(rest, parts[k]) == 0) {
                /* linear1 = [q; k; v; mlp]: inner from linear2 ([inner, inner + mlp]) rather than
                 * diffusers' fixed 3072 */
                char l2[512];
                snprintf(l2, sizeof l2, "single_blocks.%d.linear2.weight", i);
                snprintf(t->src_name, sizeof t->src_name, "single_blocks.%d.linear1.%s", i, bparam);
                raw r2, r1;
                if (!raw_find(s, pfx, l2, &r2) || r2.ndim != 2 || !raw_find(s, pfx, t->src_name, &r1) || r1.ndim < 1) return false;
                int64_t inner = r2.shape[0];
                if (r1.shape[0] <= 3 * inner) return false;
                t->row0 = k * inner;
                t->nrows = k < 3 ? inner : r1.shape[0] - 3 * inner;
                return true;
            }
        return false;
    }
    if (strcmp(stem, "norm_out.linear") == 0) {
        snprintf(t->src_name, sizeof t->src_name, "final_layer.adaLN_modulation.1.%s", bparam);
        t->swap_halves = true; /* BFL stores (shift, scale), diffusers (scale, shift) */
        return true;
    }
    return bfl_top(k_flux_top, N_OF(k_flux_top), stem, bparam, t);
}

/* ---- FLUX.2: BFL names -> diffusers names (diffusers' convert_flux2_transformer_checkpoint_to_diffusers) ----
 * No biases anywhere in FLUX.2. The three modulations are one layer each, shared by all blocks
 * of their kind; the single blocks' linear1 / linear2 are diffusers' fused to_qkv_mlp_proj /
 * to_out as they are (renamed, not split); only the double blocks' qkv is split. */

static const key_rename k_flux2_top[] = {
    {"x_embedder", "img_in"},
    {"context_embedder", "txt_in"},
    {"time_guidance_embed.timestep_embedder.linear_1", "time_in.in_layer"},
    {"time_guidance_embed.timestep_embedder.linear_2", "time_in.out_layer"},
    {"time_guidance_embed.guidance_embedder.linear_1", "guidance_in.in_layer"},
    {"time_guidance_embed.guidance_embedder.linear_2", "guidance_in.out_layer"},
    {"double_stream_modulation_img.linear", "double_stream_modulation_img.lin"},
    {"double_stream_modulation_txt.linear", "double_stream_modulation_txt.lin"},
    {"single_stream_modulation.linear", "single_stream_modulation.lin"},
    {"proj_out", "final_layer.linear"},
};

static const key_rename k_flux2_double[] = {
    {"attn.norm_q", "img_attn.norm.query_norm"},       {"attn.norm_k", "img_attn.norm.key_norm"},
    {"attn.to_out.0", "img_attn.proj"},                {"ff.linear_in", "img_mlp.0"},
    {"ff.linear_out", "img_mlp.2"},                    {"attn.norm_added_q", "txt_attn.norm.query_norm"},
    {"attn.norm_added_k", "txt_attn.norm.key_norm"},   {"attn.to_add_out", "txt_attn.proj"},
    {"ff_context.linear_in", "txt_mlp.0"},             {"ff_context.linear_out", "txt_mlp.2"},
};

static const key_rename k_flux2_single[] = {
    {"attn.to_qkv_mlp_proj", "linear1"},
    {"attn.to_out", "linear2"},
    {"attn.norm_q", "norm.query_norm"},
    {"attn.norm_k", "norm.key_norm"},
};

static bool flux2_recipe(const cdf_wsrc *s, const char *pfx, const char *name, cdf_wsrc_tensor *t) {
    char stem[512];
    const char *param, *rest, *b;
    int i;
    if (!split_param(name, stem, sizeof stem, &param)) return false;
    const char *bparam = bfl_param(stem, param); /* diffusers renames "scale" inside blocks only */
    if (!bparam) return false;
    t->row0 = 0, t->nrows = -1, t->swap_halves = false;
    if (block_of(stem, "transformer_blocks.", &i, &rest))
        return bfl_double(s, pfx, i, rest, bparam, k_flux2_double, N_OF(k_flux2_double), t);
    if (block_of(stem, "single_transformer_blocks.", &i, &rest)) {
        if (!(b = bfl_name(k_flux2_single, N_OF(k_flux2_single), rest))) return false;
        snprintf(t->src_name, sizeof t->src_name, "single_blocks.%d.%s.%s", i, b, bparam);
        return true;
    }
    if (strcmp(stem, "norm_out.linear") == 0) {
        /* diffusers swaps (shift, scale) -> (scale, shift) for the weight only (FLUX.2 has no bias) */
        if (strcmp(param, "weight") != 0) return false;
        snprintf(t->src_name, sizeof t->src_name, "final_layer.adaLN_modulation.1.weight");
        t->swap_halves = true;
        return true;
    }
    return bfl_top(k_flux2_top, N_OF(k_flux2_top), stem, param, t);
}

/* ---- SD3 / SD3.5: Stability's names (diffusers' convert_sd3_transformer_checkpoint_to_diffusers) ---- */

static const key_rename k_sd3_top[] = {
    {"pos_embed.proj", "x_embedder.proj"},
    {"time_text_embed.timestep_embedder.linear_1", "t_embedder.mlp.0"},
    {"time_text_embed.timestep_embedder.linear_2", "t_embedder.mlp.2"},
    {"time_text_embed.text_embedder.linear_1", "y_embedder.mlp.0"},
    {"time_text_embed.text_embedder.linear_2", "y_embedder.mlp.2"},
    {"context_embedder", "context_embedder"},
    {"proj_out", "final_layer.linear"},
};

static const key_rename k_sd3_block[] = {
    {"attn.norm_q", "x_block.attn.ln_q"},          {"attn.norm_k", "x_block.attn.ln_k"},
    {"attn.norm_added_q", "context_block.attn.ln_q"}, {"attn.norm_added_k", "context_block.attn.ln_k"},
    {"attn2.norm_q", "x_block.attn2.ln_q"},        {"attn2.norm_k", "x_block.attn2.ln_k"},
    {"attn.to_out.0", "x_block.attn.proj"},        {"attn.to_add_out", "context_block.attn.proj"},
    {"attn2.to_out.0", "x_block.attn2.proj"},      {"norm1.linear", "x_block.adaLN_modulation.1"},
    {"ff.net.0.proj", "x_block.mlp.fc1"},          {"ff.net.2", "x_block.mlp.fc2"},
    {"ff_context.net.0.proj", "context_block.mlp.fc1"}, {"ff_context.net.2", "context_block.mlp.fc2"},
};

static bool sd3_recipe(const cdf_wsrc *s, const char *pfx, const char *name, cdf_wsrc_tensor *t) {
    char stem[512];
    const char *param, *rest;
    int i;
    t->row0 = 0, t->nrows = -1, t->swap_halves = false;
    if (strcmp(name, "pos_embed.pos_embed") == 0) {
        snprintf(t->src_name, sizeof t->src_name, "pos_embed");
        return true;
    }
    if (!split_param(name, stem, sizeof stem, &param)) return false;
    if (block_of(stem, "transformer_blocks.", &i, &rest)) {
        for (size_t k = 0; k < sizeof k_sd3_block / sizeof *k_sd3_block; k++)
            if (strcmp(rest, k_sd3_block[k].diffusers) == 0) {
                snprintf(t->src_name, sizeof t->src_name, "joint_blocks.%d.%s.%s", i, k_sd3_block[k].bfl, param);
                return true;
            }
        if (strcmp(rest, "norm1_context.linear") == 0) {
            snprintf(t->src_name, sizeof t->src_name, "joint_blocks.%d.context_block.adaLN_modulation.1.%s", i, param);
            t->swap_halves = i == s->sd3_last_block; /* the last block's (shift, scale) */
            return true;
        }
        static const char *const qkv[9] = {"attn.to_q", "attn.to_k", "attn.to_v", "attn.add_q_proj", "attn.add_k_proj",
                                           "attn.add_v_proj", "attn2.to_q", "attn2.to_k", "attn2.to_v"};
        static const char *const src[3] = {"x_block.attn", "context_block.attn", "x_block.attn2"};
        for (int k = 0; k < 9; k++)
            if (strcmp(rest, qkv[k]) == 0) {
                snprintf(t->src_name, sizeof t->src_name, "joint_blocks.%d.%s.qkv.%s", i, src[k / 3], param);
                return set_chunk(s, pfx, t, k % 3, 3);
            }
        return false;
    }
    if (strcmp(stem, "norm_out.linear") == 0) {
        snprintf(t->src_name, sizeof t->src_name, "final_layer.adaLN_modulation.1.%s", param);
        t->swap_halves = true;
        return true;
    }
    for (size_t k = 0; k < sizeof k_sd3_top / sizeof *k_sd3_top; k++)
        if (strcmp(stem, k_sd3_top[k].diffusers) == 0) {
            snprintf(t->src_name, sizeof t->src_name, "%s.%s", k_sd3_top[k].bfl, param);
            return true;
        }
    return false;
}

/* ---- LDM VAE (FLUX's ae.safetensors, "first_stage_model." / "vae." in checkpoints): diffusers'
 * convert_ldm_vae_checkpoint ---- */

static const key_rename k_vae_top[] = {
    {"encoder.conv_norm_out", "encoder.norm_out"}, {"decoder.conv_norm_out", "decoder.norm_out"},
    {"encoder.conv_in", "encoder.conv_in"},        {"encoder.conv_out", "encoder.conv_out"},
    {"decoder.conv_in", "decoder.conv_in"},        {"decoder.conv_out", "decoder.conv_out"},
    {"quant_conv", "quant_conv"},                  {"post_quant_conv", "post_quant_conv"},
};

static const key_rename k_vae_attn[] = {
    {"group_norm", "norm"}, {"to_q", "q"}, {"to_k", "k"}, {"to_v", "v"}, {"to_out.0", "proj_out"},
};

static bool has_raw(const cdf_wsrc *s, const char *full);

/* FLUX.2's autoencoder (BFL's flux2 VAE file; diffusers' scripts/convert_flux2_to_diffusers.py,
 * convert_flux2_vae_checkpoint_to_diffusers) keeps its quant convs inside the encoder and the
 * decoder (and adds the latent BatchNorm's statistics, bn.running_mean / _var, under diffusers'
 * names). */
static const key_rename k_vae_flux2[] = {
    {"quant_conv", "encoder.quant_conv"}, {"post_quant_conv", "decoder.post_quant_conv"},
};

static bool vae_recipe(const cdf_wsrc *s, const char *pfx, const char *name, cdf_wsrc_tensor *t) {
    char stem[512];
    const char *param, *rest;
    int i, j;
    t->row0 = 0, t->nrows = -1, t->swap_halves = false;
    if (strcmp(name, "bn.running_mean") == 0 || strcmp(name, "bn.running_var") == 0) {
        snprintf(t->src_name, sizeof t->src_name, "%s", name); /* FLUX.2's latent statistics: same names */
        return true;
    }
    if (!split_param(name, stem, sizeof stem, &param)) return false;
    for (size_t k = 0; k < sizeof k_vae_flux2 / sizeof *k_vae_flux2; k++)
        if (strcmp(stem, k_vae_flux2[k].diffusers) == 0) {
            char full[600];
            snprintf(t->src_name, sizeof t->src_name, "%s.%s", k_vae_flux2[k].bfl, param);
            snprintf(full, sizeof full, "%s%s", pfx, t->src_name);
            if (has_raw(s, full)) return true; /* else the LDM name (FLUX.1's VAE, SD3's) */
        }
    for (size_t k = 0; k < sizeof k_vae_top / sizeof *k_vae_top; k++)
        if (strcmp(stem, k_vae_top[k].diffusers) == 0) {
            snprintf(t->src_name, sizeof t->src_name, "%s.%s", k_vae_top[k].bfl, param);
            return true;
        }
    const char *side = strncmp(stem, "encoder.", 8) == 0 ? "encoder" : strncmp(stem, "decoder.", 8) == 0 ? "decoder" : NULL;
    if (!side) return false;
    const char *p = stem + 8;
    if (block_of(p, "mid_block.resnets.", &j, &rest)) {
        snprintf(t->src_name, sizeof t->src_name, "%s.mid.block_%d.%s.%s", side, j + 1,
                 strcmp(rest, "conv_shortcut") == 0 ? "nin_shortcut" : rest, param);
        return true;
    }
    if (strncmp(p, "mid_block.attentions.0.", 23) == 0) {
        for (size_t k = 0; k < sizeof k_vae_attn / sizeof *k_vae_attn; k++)
            if (strcmp(p + 23, k_vae_attn[k].diffusers) == 0) {
                snprintf(t->src_name, sizeof t->src_name, "%s.mid.attn_1.%s.%s", side, k_vae_attn[k].bfl, param);
                return true; /* 1x1 conv weights: the caller drops the unit dims */
            }
        return false;
    }
    bool enc = side[0] == 'e';
    if (!block_of(p, enc ? "down_blocks." : "up_blocks.", &i, &rest)) return false;
    int b = enc ? i : s->vae_up_blocks - 1 - i; /* diffusers' up_blocks run in reverse */
    if (b < 0) return false;
    if (block_of(rest, "resnets.", &j, &rest)) {
        snprintf(t->src_name, sizeof t->src_name, "%s.%s.%d.block.%d.%.200s.%s", side, enc ? "down" : "up", b, j,
                 strcmp(rest, "conv_shortcut") == 0 ? "nin_shortcut" : rest, param);
        return true;
    }
    if (strcmp(rest, enc ? "downsamplers.0.conv" : "upsamplers.0.conv") == 0) {
        snprintf(t->src_name, sizeof t->src_name, "%s.%s.%d.%s.conv.%s", side, enc ? "down" : "up", b,
                 enc ? "downsample" : "upsample", param);
        return true;
    }
    return false;
}

/* ---- open ---- */

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static bool has_raw(const cdf_wsrc *s, const char *full) {
    return s->gg ? cdf_gguf_find(s->gg, full) != NULL : cdf_checkpoint_has(s->ck, full);
}

/* The text encoder parts of an all-in-one file (ComfyUI's / Stability's "text_encoders.<part>.
 * transformer." prefixes) and, when `part` is one of them, this source's prefix. */
static void find_text_parts(cdf_wsrc *s, const char *part) {
    snprintf(s->te_wanted, sizeof s->te_wanted, "%s", part ? part : "");
    static const char *const parts[] = {"clip_l", "clip_g", "t5xxl"};
    for (size_t k = 0; k < sizeof parts / sizeof *parts; k++) {
        char pfx[64];
        snprintf(pfx, sizeof pfx, "text_encoders.%s.transformer.", parts[k]);
        bool found = false;
        /* names are sorted (safetensors) or few (GGUF): a scan of the names is cheap */
        for (int i = 0; i < count_raw(s) && !found; i++) found = strncmp(raw_name_at(s, i), pfx, strlen(pfx)) == 0;
        if (!found) continue;
        size_t o = strlen(s->te_parts);
        snprintf(s->te_parts + o, sizeof s->te_parts - o, "%s%s", o ? ", " : "", parts[k]);
        if (part && strcmp(part, parts[k]) == 0) snprintf(s->te_prefix, sizeof s->te_prefix, "%s", pfx);
    }
    /* diffusers (create_diffusers_clip_model_from_ldm) gives SD3's CLIP-L the identity as its
     * text_projection, whatever the file holds: SD3 was trained on its unprojected pooled output */
    if (part && strcmp(part, "clip_l") == 0 && s->te_prefix[0]) {
        char k[160];
        snprintf(k, sizeof k, "%stext_model.embeddings.position_embedding.weight", s->te_prefix);
        raw r;
        /* (a width beyond any CLIP's is left to the shape check: the model then misses the tensor) */
        if (raw_find(s, "", k, &r) && r.ndim == 2 && r.shape[1] > 0 && r.shape[1] <= 65536)
            s->te_identity_proj = true, s->te_hidden = r.shape[1];
    }
}

cdf_status cdf_wsrc_open(const char *path, bool single_file, const char *part, cdf_wsrc **out) {
    *out = NULL;
    cdf_wsrc *s = calloc(1, sizeof *s);
    if (!s || !(s->path = strdup(path))) {
        free(s);
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    }
    bool gguf = ends_with(path, ".gguf");
    cdf_status st = gguf ? cdf_gguf_open(path, &s->gg) : cdf_checkpoint_open(path, &s->ck);
    if (st != CDF_OK) {
        cdf_wsrc_close(s);
        return st;
    }
    /* the layouts, by the keys diffusers' infer_diffusers_model_type looks at */
    static const struct {
        int layout;
        const char *key, *prefixes[3];
    } k_detect[] = {
        {LAYOUT_FLUX_BFL, "double_blocks.0.img_attn.norm.key_norm.scale", {"", "model.diffusion_model."}},
        {LAYOUT_FLUX2_BFL, "single_stream_modulation.lin.weight", {"", "model.diffusion_model."}},
        {LAYOUT_SD3_SAI, "joint_blocks.0.context_block.adaLN_modulation.1.bias", {"", "model.diffusion_model."}},
        {LAYOUT_LDM_VAE, "encoder.down.0.block.0.conv1.weight", {"", "first_stage_model.", "vae."}},
    };
    for (size_t d = 0; d < sizeof k_detect / sizeof *k_detect; d++)
        for (int p = 0; p < 3 && k_detect[d].prefixes[p]; p++) {
            char k[160];
            snprintf(k, sizeof k, "%s%s", k_detect[d].prefixes[p], k_detect[d].key);
            if (has_raw(s, k)) s->has[k_detect[d].layout] = true, s->prefix[k_detect[d].layout] = k_detect[d].prefixes[p];
        }
    /* FLUX.2's blocks carry FLUX.1's key too: its shared modulation tells them apart (as in
     * infer_diffusers_model_type, where flux2 is tested before flux) */
    if (s->has[LAYOUT_FLUX2_BFL] && s->has[LAYOUT_FLUX_BFL] && strcmp(s->prefix[LAYOUT_FLUX2_BFL], s->prefix[LAYOUT_FLUX_BFL]) == 0)
        s->has[LAYOUT_FLUX_BFL] = false;
    /* block counts the conversions need */
    s->sd3_last_block = -1;
    for (int i = 0; i < count_raw(s); i++) {
        const char *n = raw_name_at(s, i), *rest;
        int b;
        if (s->has[LAYOUT_SD3_SAI] && strncmp(n, s->prefix[LAYOUT_SD3_SAI], strlen(s->prefix[LAYOUT_SD3_SAI])) == 0 &&
            block_of(n + strlen(s->prefix[LAYOUT_SD3_SAI]), "joint_blocks.", &b, &rest) && b > s->sd3_last_block)
            s->sd3_last_block = b;
        if (s->has[LAYOUT_LDM_VAE] && strncmp(n, s->prefix[LAYOUT_LDM_VAE], strlen(s->prefix[LAYOUT_LDM_VAE])) == 0 &&
            block_of(n + strlen(s->prefix[LAYOUT_LDM_VAE]), "decoder.up.", &b, &rest) && b + 1 > s->vae_up_blocks)
            s->vae_up_blocks = b + 1;
    }
    static const char *const layout_names[N_LAYOUTS] = {"BFL FLUX keys", "BFL FLUX.2 keys", "Stability SD3 keys",
                                                         "LDM VAE keys"};
    int o = snprintf(s->format, sizeof s->format, "%s", gguf ? "GGUF" : "safetensors");
    for (int l = 0; l < N_LAYOUTS && o > 0 && (size_t)o < sizeof s->format; l++)
        if (s->has[l])
            o += snprintf(s->format + o, sizeof s->format - (size_t)o, ", %s%s%s", layout_names[l], *s->prefix[l] ? " under " : "",
                          s->prefix[l]);
    find_text_parts(s, part);
    if (s->te_parts[0] && (size_t)o < sizeof s->format)
        snprintf(s->format + o, sizeof s->format - (size_t)o, ", text encoders %s", s->te_parts);
    bool original = s->te_parts[0];
    for (int l = 0; l < N_LAYOUTS; l++) original |= s->has[l];
    s->diffusers_layout = !original;
    if (single_file || original || gguf) {
        s->used = calloc((size_t)count_raw(s) + 1, 1);
        if (!s->used) {
            cdf_wsrc_close(s);
            return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
        }
    }
    *out = s;
    return CDF_OK;
}

void cdf_wsrc_close(cdf_wsrc *s) {
    if (!s) return;
    cdf_checkpoint_close(s->ck);
    cdf_gguf_close(s->gg);
    free(s->used);
    free(s->path);
    free(s);
}

cdf_checkpoint *cdf_wsrc_checkpoint(cdf_wsrc *s) { return s && s->diffusers_layout ? s->ck : NULL; }
const char *cdf_wsrc_format(const cdf_wsrc *s) { return s->format; }

/* ---- lookup and load ---- */

/* "<x>.weight" -> "<x>.scale_weight" (ComfyUI's fp8_scaled files). */
static bool scale_name(const char *src, char *out, size_t n) {
    if (!ends_with(src, ".weight")) return false;
    snprintf(out, n, "%.*sscale_weight", (int)(strlen(src) - 6), src);
    return true;
}

static bool is_fp8(cdf_dtype dt) { return dt == CDF_F8_E4M3 || dt == CDF_F8_E5M2; }

bool cdf_wsrc_find(cdf_wsrc *s, const char *name, cdf_wsrc_tensor *t) {
    memset(t, 0, sizeof *t);
    t->nrows = -1;
    raw r;
    bool found = false;
    if (s->diffusers_layout) {
        snprintf(t->src_name, sizeof t->src_name, "%s", name);
        found = raw_find(s, "", t->src_name, &r);
    }
    if (s->te_prefix[0]) { /* a text encoder's part of an all-in-one file: only that part */
        t->prefix = s->te_prefix;
        if (s->te_identity_proj && strcmp(name, "text_projection.weight") == 0) {
            snprintf(t->src_name, sizeof t->src_name, "%s", name);
            t->identity = true;
            t->ndim = 2;
            t->shape[0] = t->shape[1] = s->te_hidden;
            t->dtype = CDF_F32;
            t->qtype = -1;
            s->found_any = true;
            return true;
        }
        snprintf(t->src_name, sizeof t->src_name, "%s", name);
        found = raw_find(s, t->prefix, t->src_name, &r);
    }
    /* an all-in-one file holds several layouts: the first whose conversion finds the tensor */
    for (int l = 0; l < N_LAYOUTS && !found && !s->te_prefix[0]; l++) {
        if (!s->has[l]) continue;
        t->prefix = s->prefix[l];
        bool ok = l == LAYOUT_FLUX_BFL    ? flux_recipe(s, t->prefix, name, t)
                  : l == LAYOUT_FLUX2_BFL ? flux2_recipe(s, t->prefix, name, t)
                  : l == LAYOUT_SD3_SAI   ? sd3_recipe(s, t->prefix, name, t)
                                          : vae_recipe(s, t->prefix, name, t);
        found = ok && raw_find(s, t->prefix, t->src_name, &r);
        if (found) s->used_layout[l] = true;
        /* LDM 1x1 conv attention weights [C, C, 1, 1] are diffusers' linear [C, C] */
        if (found && l == LAYOUT_LDM_VAE && strstr(t->src_name, ".mid.attn_1.") && strstr(t->src_name, ".weight") &&
            !strstr(t->src_name, ".norm."))
            while (r.ndim > 2 && r.shape[r.ndim - 1] == 1) r.ndim--;
    }
    if (!found) return false;
    if (!t->prefix) t->prefix = "";
    if (s->used) s->used[r.idx] = 1;
    s->found_any = true;
    t->ndim = r.ndim;
    memcpy(t->shape, r.shape, sizeof t->shape);
    if (t->nrows >= 0) t->shape[0] = t->nrows;
    t->dtype = r.dtype;
    t->qtype = r.ggml;
    t->zero_copy = r.ggml < 0 && !t->swap_halves;
    char sn[600];
    raw sr;
    if (is_fp8(r.dtype) && scale_name(t->src_name, sn, sizeof sn) && raw_find(s, t->prefix, sn, &sr)) {
        if (s->used) s->used[sr.idx] = 1;
        t->dtype = CDF_F32; /* scaled on the host */
        t->zero_copy = false;
    }
    return true;
}

/* rows [0, n/2) and [n/2, n) of buf (n rows of row_bytes) trade places */
static bool swap_row_halves(uint8_t *buf, int64_t nrows, size_t row_bytes, const char *name) {
    size_t hb = row_bytes * (size_t)(nrows / 2);
    uint8_t *tmp = nrows % 2 ? NULL : malloc(hb + 1);
    if (!tmp) {
        cdf_error(nrows % 2 ? CDF_ERR_SHAPE : CDF_ERR_OUT_OF_MEMORY, "weight '%s': cannot swap the halves of %lld rows", name,
                  (long long)nrows);
        return false;
    }
    memcpy(tmp, buf, hb);
    memmove(buf, buf + hb, hb);
    memcpy(buf + hb, tmp, hb);
    free(tmp);
    return true;
}

const void *cdf_wsrc_load(cdf_wsrc *s, cdf_wsrc_tensor *t, const char *name) {
    raw r;
    if (t->identity) { /* [n, n] f32, made here: no source tensor */
        const int64_t n = t->shape[0];
        float *eye = calloc((size_t)(n * n) + 1, sizeof *eye);
        if (!eye) {
            cdf_error(CDF_ERR_OUT_OF_MEMORY, "weight '%s': out of host memory for the %lld x %lld identity", name, (long long)n,
                      (long long)n);
            return NULL;
        }
        for (int64_t i = 0; i < n; i++) eye[i * n + i] = 1.0f;
        t->owned = eye;
        return eye;
    }
    if (!raw_find(s, t->prefix, t->src_name, &r)) {
        cdf_error(CDF_ERR_INTERNAL, "weight '%s': source tensor '%s' vanished from %s", name, t->src_name, s->path);
        return NULL;
    }
    int64_t rows = r.ndim ? r.shape[0] : 1;
    uint64_t row_bytes = rows ? r.nbytes / (uint64_t)rows : 0;
    int64_t row0 = t->nrows >= 0 ? t->row0 : 0, nrows = t->nrows >= 0 ? t->nrows : rows;
    const uint8_t *bytes = r.bytes + (uint64_t)row0 * row_bytes;
    int64_t numel = 1;
    for (int i = 0; i < t->ndim; i++) numel *= t->shape[i];
    cdf_io_count_bytes((uint64_t)nrows * row_bytes);
    char sn[600];
    raw sr;
    bool scaled = is_fp8(r.dtype) && t->dtype == CDF_F32 && scale_name(t->src_name, sn, sizeof sn) && raw_find(s, t->prefix, sn, &sr);
    const uint64_t src_bytes = (uint64_t)nrows * row_bytes;
    if (t->zero_copy) {
        t->mapped = bytes;
        t->mapped_bytes = src_bytes;
        return bytes;
    }

    size_t esz = cdf_dtype_size(t->dtype);
    uint8_t *buf = malloc((size_t)numel * esz + 1);
    if (!buf) {
        cdf_error(CDF_ERR_OUT_OF_MEMORY, "weight '%s': out of host memory for %lld values", name, (long long)numel);
        return NULL;
    }
    t->owned = buf;
    if (r.ggml >= 0) {
        if (cdf_ggml_dequantize((uint32_t)r.ggml, bytes, numel, (float *)buf) != CDF_OK) {
            cdf_error_prefix("weight '%s' (tensor '%s%s' in %s): ", name, t->prefix, t->src_name, s->path);
            return NULL;
        }
    } else if (scaled) {
        int64_t sn_el = 1;
        for (int i = 0; i < sr.ndim; i++) sn_el *= sr.shape[i];
        if (sn_el != 1 || !cdf_dtype_is_float(sr.dtype)) {
            cdf_error(CDF_ERR_FORMAT, "weight '%s': its scale '%s' in %s is not one float", name, sn, s->path);
            return NULL;
        }
        float scale;
        cdf_convert(&scale, CDF_F32, sr.bytes, sr.dtype, 1);
        float *y = (float *)buf;
        cdf_convert(y, CDF_F32, bytes, r.dtype, (size_t)numel);
        for (int64_t i = 0; i < numel; i++) y[i] *= scale; /* torch: w.to(f32) * scale_weight */
    } else {
        memcpy(buf, bytes, (size_t)numel * esz);
    }
    cdf_io_drop_pages(bytes, (size_t)src_bytes); /* copied: the mapped pages are not needed here again */
    if (t->swap_halves && !swap_row_halves(buf, nrows, (size_t)(numel / (nrows ? nrows : 1)) * esz, name)) return NULL;
    return buf;
}

const void *cdf_wsrc_load_blocks(cdf_wsrc *s, cdf_wsrc_tensor *t, const char *name, int64_t *row_bytes) {
    raw r;
    if (t->qtype < 0 || !raw_find(s, t->prefix, t->src_name, &r)) {
        cdf_error(CDF_ERR_INTERNAL, "weight '%s': source tensor '%s' has no blocks in %s", name, t->src_name, s->path);
        return NULL;
    }
    const int64_t rows = r.ndim ? r.shape[0] : 1;
    const uint64_t rb = rows ? r.nbytes / (uint64_t)rows : 0;
    const int64_t row0 = t->nrows >= 0 ? t->row0 : 0, nrows = t->nrows >= 0 ? t->nrows : rows;
    const uint8_t *bytes = r.bytes + (uint64_t)row0 * rb;
    *row_bytes = (int64_t)rb;
    cdf_io_count_bytes((uint64_t)nrows * rb);
    if (!t->swap_halves) { /* mapped, like zero-copy values: their pages go at cdf_wsrc_tensor_release */
        t->mapped = bytes;
        t->mapped_bytes = (uint64_t)nrows * rb;
        return bytes;
    }
    uint8_t *buf = malloc((size_t)(nrows * (int64_t)rb) + 1);
    if (!buf) {
        cdf_error(CDF_ERR_OUT_OF_MEMORY, "weight '%s': out of host memory for %lld rows of blocks", name, (long long)nrows);
        return NULL;
    }
    memcpy(buf, bytes, (size_t)(nrows * (int64_t)rb));
    cdf_io_drop_pages(bytes, (size_t)(nrows * (int64_t)rb)); /* copied */
    t->owned = buf;
    return swap_row_halves(buf, nrows, (size_t)rb, name) ? buf : NULL;
}

void cdf_wsrc_tensor_release(cdf_wsrc_tensor *t) {
    free(t->owned);
    t->owned = NULL;
    if (t->mapped) cdf_io_drop_pages(t->mapped, (size_t)t->mapped_bytes);
    t->mapped = NULL;
}

const char *cdf_wsrc_missing_hint(cdf_wsrc *s) {
    if (s->found_any || !s->used) return "";
    int n = count_raw(s);
    if (s->te_parts[0] && !s->te_prefix[0]) { /* an all-in-one file without this component's part */
        if (s->te_wanted[0])
            snprintf(s->hint, sizeof s->hint, "; this all-in-one file (%s) holds the text encoders %s but no \"text_encoders.%s."
                     "transformer.\" part", s->format, s->te_parts, s->te_wanted);
        else if (!s->has[LAYOUT_FLUX_BFL] && !s->has[LAYOUT_FLUX2_BFL] && !s->has[LAYOUT_SD3_SAI] && !s->has[LAYOUT_LDM_VAE])
            snprintf(s->hint, sizeof s->hint, "; this file holds only the text encoders %s (under \"text_encoders.<name>."
                     "transformer.\"), none of which is this component", s->te_parts);
        if (s->hint[0]) return s->hint;
    }
    int o = snprintf(s->hint, sizeof s->hint, "; none of the %d tensors of this file (%s) belong to this model: it is "
                     "not in diffusers', BFL FLUX.1's or FLUX.2's, Stability SD3's or LDM's layout for it", n, s->format);
    for (int i = 0; i < n && i < 2 && o > 0 && (size_t)o < sizeof s->hint; i++)
        o += snprintf(s->hint + o, sizeof s->hint - (size_t)o, "%s'%s'", i ? ", " : "; it holds ", raw_name_at(s, i));
    if (n > 2 && o > 0 && (size_t)o < sizeof s->hint) snprintf(s->hint + o, sizeof s->hint - (size_t)o, ", ...");
    return s->hint;
}

void cdf_wsrc_summary(const cdf_wsrc *s, char *buf, size_t n) {
    enum { MAXT = 64 };
    int counts[MAXT] = {0}; /* ggml type ids, or cdf dtypes for safetensors */
    uint64_t bytes = 0;
    int total = count_raw(s);
    for (int i = 0; i < total; i++) {
        if (s->gg) {
            const cdf_gguf_tensor *t = cdf_gguf_tensor_at(s->gg, i);
            bytes += t->nbytes;
            if (t->type < MAXT) counts[t->type]++;
        } else {
            const cdf_st_tensor *t;
            if (cdf_checkpoint_tensor_at(s->ck, i, NULL, &t) != CDF_OK) continue;
            bytes += t->nbytes;
            if ((int)t->dtype < MAXT) counts[t->dtype]++;
        }
    }
    int o = snprintf(buf, n, "%d tensors, %.2f MB", total, (double)bytes / 1e6);
    const char *sep = ": ";
    for (int k = 0; k < MAXT && o > 0 && (size_t)o < n; k++) {
        if (!counts[k]) continue;
        const char *name = s->gg ? cdf_ggml_type_name((uint32_t)k) : cdf_dtype_st_name((cdf_dtype)k);
        o += snprintf(buf + o, n - (size_t)o, "%s%d %s", sep, counts[k], name ? name : "?");
        sep = ", ";
    }
}

/* Whether source tensor `name` is left out of the unused list: another component's part of an
 * all-in-one file (under the prefix of a layout this component did not use, or of a text
 * encoder), or something that is not a weight. */
static bool other_component(const cdf_wsrc *s, const char *name) {
    for (int l = 0; l < N_LAYOUTS; l++)
        if (s->has[l] && !s->used_layout[l] && *s->prefix[l] && strncmp(name, s->prefix[l], strlen(s->prefix[l])) == 0)
            return true;
    const size_t tp = strlen(s->te_prefix);
    if (tp && strncmp(name, s->te_prefix, tp) == 0) {
        /* this text encoder's own part: what diffusers drops is not unused (CLIP-L's own
         * text_projection, replaced by the identity or absent from CLIPTextModel; CLIP's
         * logit_scale; a tokenizer's bytes), nor is T5's tied copy of its token table */
        const char *rest = name + tp;
        if (strcmp(rest, "text_projection.weight") == 0 && strstr(s->te_prefix, ".clip_l.")) return true;
        if (strcmp(rest, "logit_scale") == 0) return true;
        if (strcmp(rest, "spiece_model") == 0) return true; /* ComfyUI keeps the tokenizer's sentencepiece model here */
        if (strcmp(rest, "encoder.embed_tokens.weight") == 0) {
            char k[160];
            snprintf(k, sizeof k, "%sshared.weight", s->te_prefix);
            if (has_raw(s, k)) return true;
        }
    } else if (tp || strncmp(name, "text_encoders.", 14) == 0) {
        /* another component's part: the text encoders' (for the transformer or the VAE), or, for
         * a text encoder, everything outside its own part */
        return true;
    }
    static const char *const text[] = {"cond_stage_model.", "conditioner."};
    for (size_t k = 0; k < sizeof text / sizeof *text; k++)
        if (strncmp(name, text[k], strlen(text[k])) == 0) return true;
    /* not weights: the fp8_scaled marker, fp8 activation scales (this loader dequantizes), buffers */
    static const char *const suffixes[] = {".scale_input", ".position_ids", ".num_batches_tracked"}; /* (BatchNorm's counter) */
    for (size_t k = 0; k < sizeof suffixes / sizeof *suffixes; k++) {
        size_t a = strlen(name), b = strlen(suffixes[k]);
        if (a >= b && strcmp(name + a - b, suffixes[k]) == 0) return true;
    }
    /* T5's token table is tied: a file holding both copies is read through one */
    if (strcmp(name, "encoder.embed_tokens.weight") == 0 && has_raw(s, "shared.weight")) return true;
    return strcmp(name, "scaled_fp8") == 0;
}

char *cdf_wsrc_unused(const cdf_wsrc *s, int *count) {
    if (count) *count = 0;
    if (!s->used) return NULL;
    size_t len = 1, n = 0;
    int total = count_raw(s);
    for (int i = 0; i < total; i++)
        if (!s->used[i] && !other_component(s, raw_name_at(s, i))) len += strlen(raw_name_at(s, i)) + 2, n++;
    if (!n) return NULL;
    char *out = malloc(len);
    if (!out) return NULL;
    out[0] = 0;
    for (int i = 0; i < total; i++)
        if (!s->used[i] && !other_component(s, raw_name_at(s, i))) {
            if (out[0]) strcat(out, ", ");
            strcat(out, raw_name_at(s, i));
        }
    if (count) *count = (int)n;
    return out;
}
