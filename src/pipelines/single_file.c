/* A whole pipeline from one all-in-one file (`--model FILE`): the model recognised by its key
 * names and shapes as diffusers' infer_diffusers_model_type does, the configs and tokenizers
 * taken from the shipped folder of that model (models/configs/<name>, a diffusers folder without
 * weights) or from a given diffusers folder (diffusers' from_single_file(config=)), the shapes
 * the file tells checked against those configs, and every component's weights read from the
 * file (nn/weights_source.c converts its layouts). Only headers are read here: no tensor data. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error_internal.h"
#include "pipelines/pipeline_impl.h"
#include "io/json.h"

#ifndef CDF_SHIPPED_CONFIGS
#define CDF_SHIPPED_CONFIGS ""
#endif

const char *cdf_pipe_text_part(const char *key, bool second_is_t5) {
    if (!key) return NULL;
    if (strcmp(key, "text_encoder") == 0) return "clip_l";
    if (strcmp(key, "text_encoder_2") == 0) return second_is_t5 ? "t5xxl" : "clip_g";
    if (strcmp(key, "text_encoder_3") == 0) return "t5xxl";
    return NULL;
}

/* ---- the file's header ---- */

typedef struct sf_file {
    const char *path;
    cdf_checkpoint *ck;
    cdf_gguf_file *gg;
} sf_file;

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static int sf_count(const sf_file *f) { return f->gg ? cdf_gguf_count(f->gg) : cdf_checkpoint_count(f->ck); }
static const char *sf_name(const sf_file *f, int i) {
    return f->gg ? cdf_gguf_tensor_at(f->gg, i)->name : cdf_checkpoint_name_at(f->ck, i);
}

/* Shape of `pfx` + `name`; false if absent. */
static bool sf_shape(const sf_file *f, const char *pfx, const char *name, int *ndim, int64_t *shape) {
    char full[512];
    snprintf(full, sizeof full, "%s%s", pfx, name);
    if (f->gg) {
        const cdf_gguf_tensor *t = cdf_gguf_find(f->gg, full);
        if (!t) return false;
        *ndim = t->ndim;
        memcpy(shape, t->shape, sizeof t->shape);
        return true;
    }
    const cdf_st_tensor *t;
    if (!cdf_checkpoint_has(f->ck, full) || cdf_checkpoint_find(f->ck, full, NULL, &t) != CDF_OK) return false;
    *ndim = t->ndim;
    memcpy(shape, t->shape, sizeof(int64_t) * CDF_ST_MAX_DIMS);
    return true;
}

static bool sf_has(const sf_file *f, const char *pfx, const char *name) {
    int nd;
    int64_t sh[CDF_ST_MAX_DIMS];
    return sf_shape(f, pfx, name, &nd, sh);
}

/* Dim d of a tensor, -1 if absent or lower-dimensional. */
static int64_t sf_dim(const sf_file *f, const char *pfx, const char *name, int d) {
    int nd;
    int64_t sh[CDF_ST_MAX_DIMS];
    return sf_shape(f, pfx, name, &nd, sh) && d < nd ? sh[d] : -1;
}

/* Number of blocks `pfx` + `blocks` + "<i>." (highest index + 1). */
static int64_t sf_blocks(const sf_file *f, const char *pfx, const char *blocks) {
    char p[256];
    size_t n = (size_t)snprintf(p, sizeof p, "%s%s", pfx, blocks);
    int64_t most = 0;
    for (int i = 0; i < sf_count(f); i++) {
        const char *name = sf_name(f, i);
        if (strncmp(name, p, n) != 0 || name[n] < '0' || name[n] > '9') continue;
        int64_t v = strtoll(name + n, NULL, 10);
        if (v + 1 > most && v < 100000) most = v + 1;
    }
    return most;
}

static bool sf_has_prefix(const sf_file *f, const char *pfx) {
    for (int i = 0; i < sf_count(f); i++)
        if (strncmp(sf_name(f, i), pfx, strlen(pfx)) == 0) return true;
    return false;
}

/* ---- what the file holds ---- */

typedef struct sf_contents {
    const char *tpfx;   /* transformer prefix ("" or "model.diffusion_model."), NULL if none */
    int tkind;          /* CDF_PIPE_FLUX (BFL keys), CDF_PIPE_SD3 (Stability keys), CDF_PIPE_FLUX2 */
    const char *vpfx;   /* LDM VAE prefix, NULL if none */
    bool part[3];       /* clip_l, clip_g, t5xxl under text_encoders.<part>.transformer. */
} sf_contents;

static const char *const k_parts[3] = {"clip_l", "clip_g", "t5xxl"};

static void sf_inspect(const sf_file *f, sf_contents *c) {
    memset(c, 0, sizeof *c);
    static const char *const tp[] = {"", "model.diffusion_model."};
    for (int i = 0; i < 2 && !c->tpfx; i++) {
        /* the keys diffusers' CHECKPOINT_KEY_NAMES lists for flux2, sd3 and flux */
        if (sf_has(f, tp[i], "single_stream_modulation.lin.weight")) c->tpfx = tp[i], c->tkind = CDF_PIPE_FLUX2;
        else if (sf_has(f, tp[i], "joint_blocks.0.context_block.adaLN_modulation.1.bias")) c->tpfx = tp[i], c->tkind = CDF_PIPE_SD3;
        else if (sf_has(f, tp[i], "double_blocks.0.img_attn.norm.key_norm.scale")) c->tpfx = tp[i], c->tkind = CDF_PIPE_FLUX;
    }
    static const char *const vp[] = {"vae.", "first_stage_model.", ""};
    for (int i = 0; i < 3 && !c->vpfx; i++)
        if (sf_has(f, vp[i], "encoder.down.0.block.0.conv1.weight")) c->vpfx = vp[i];
    for (int k = 0; k < 3; k++) {
        char p[64];
        snprintf(p, sizeof p, "text_encoders.%s.transformer.", k_parts[k]);
        c->part[k] = sf_has_prefix(f, p);
    }
}

/* The known model (the shipped config folder's name) as infer_diffusers_model_type decides it;
 * NULL with *why set when it is none of them. */
static const char *sf_model(const sf_file *f, const sf_contents *c, char *why, size_t n) {
    if (!c->tpfx) {
        snprintf(why, n, "it holds no FLUX.1 / FLUX.2 (BFL keys) or SD3 (Stability keys) transformer");
        return NULL;
    }
    const char *p = c->tpfx;
    if (c->tkind == CDF_PIPE_FLUX2) return "flux2-dev";
    if (c->tkind == CDF_PIPE_SD3) {
        /* sd3 / sd35_medium: the first block's context modulation is 6 x 1536 wide */
        if (sf_dim(f, p, "joint_blocks.0.context_block.adaLN_modulation.1.bias", 0) == 9216) {
            const int64_t pos = sf_dim(f, p, "pos_embed", 1);
            if (pos == 36864) return "sd3-medium";
            if (pos == 147456) return "sd3.5-medium";
            snprintf(why, n, "an SD3 transformer 1536 wide whose pos_embed holds %lld positions (SD3-Medium 36864, "
                     "SD3.5-Medium 147456)", (long long)pos);
            return NULL;
        }
        if (sf_has(f, p, "joint_blocks.37.x_block.mlp.fc1.weight")) return "sd3.5-large";
        snprintf(why, n, "an SD3 transformer of %lld blocks, %lld wide (known: SD3-Medium, SD3.5-Medium, SD3.5-Large)",
                 (long long)sf_blocks(f, p, "joint_blocks."), (long long)sf_dim(f, p, "x_embedder.proj.weight", 0));
        return NULL;
    }
    if (sf_has(f, p, "guidance_in.in_layer.bias")) {
        const int64_t in = sf_dim(f, p, "img_in.weight", 1);
        if (in == 384 || in == 128) {
            snprintf(why, n, "a FLUX.1 %s transformer (img_in takes %lld channels), which cdiffusers does not run",
                     in == 384 ? "Fill" : "Depth", (long long)in);
            return NULL;
        }
        return "flux1-dev";
    }
    return "flux1-schnell";
}

/* ---- configs against the file's shapes ---- */

static cdf_status load_cfg(const char *dir, const char *key, cJSON **cfg) {
    char sub[4200];
    snprintf(sub, sizeof sub, "%s/%s", dir, key);
    return cdf_config_load(sub, cfg);
}

/* One value the file's shapes tell against the config's. */
static cdf_status expect(const sf_file *f, const char *dir, const char *key, const cJSON *cfg, const char *field, int64_t mult,
                         int64_t got, const char *what) {
    int64_t v = -1;
    CDF_TRY(cdf_json_get_int(cfg, field, -1, &v));
    if (got >= 0 && v >= 0 && v * mult == got) return CDF_OK;
    char times[64] = "";
    if (mult != 1) snprintf(times, sizeof times, " x attention_head_dim %lld = %lld", (long long)mult, (long long)(v * mult));
    return cdf_error(CDF_ERR_SHAPE, "%s: %s is %lld, but %s/%s/config.json says %s %lld%s: the file is not the model of that "
                     "config", f->path, what, (long long)got, dir, key, field, (long long)v, times);
}

static cdf_status check_transformer(const sf_file *f, const sf_contents *c, const char *dir) {
    cJSON *cfg = NULL;
    CDF_TRY(load_cfg(dir, "transformer", &cfg));
    const char *p = c->tpfx;
    int64_t head = 0;
    cdf_status s = cdf_json_get_int(cfg, "attention_head_dim", 0, &head);
    if (s == CDF_OK && (c->tkind == CDF_PIPE_FLUX || c->tkind == CDF_PIPE_FLUX2)) {
        s = expect(f, dir, "transformer", cfg, "num_attention_heads", head, sf_dim(f, p, "img_in.weight", 0),
                   "the transformer's width (img_in.weight)");
        if (s == CDF_OK) s = expect(f, dir, "transformer", cfg, "in_channels", 1, sf_dim(f, p, "img_in.weight", 1), "img_in's input width");
        if (s == CDF_OK) s = expect(f, dir, "transformer", cfg, "num_layers", 1, sf_blocks(f, p, "double_blocks."), "the number of double_blocks");
        if (s == CDF_OK)
            s = expect(f, dir, "transformer", cfg, "num_single_layers", 1, sf_blocks(f, p, "single_blocks."), "the number of single_blocks");
        if (s == CDF_OK)
            s = expect(f, dir, "transformer", cfg, "joint_attention_dim", 1, sf_dim(f, p, "txt_in.weight", 1), "txt_in's input width");
        if (s == CDF_OK && c->tkind == CDF_PIPE_FLUX) /* FLUX.2 has no pooled text input */
            s = expect(f, dir, "transformer", cfg, "pooled_projection_dim", 1, sf_dim(f, p, "vector_in.in_layer.weight", 1),
                       "vector_in's input width");
        bool ge = false;
        if (s == CDF_OK) s = cdf_json_get_bool(cfg, "guidance_embeds", false, &ge);
        if (s == CDF_OK && ge != sf_has(f, p, "guidance_in.in_layer.weight"))
            s = cdf_error(CDF_ERR_SHAPE, "%s: the transformer %s guidance_in, but %s/transformer/config.json says guidance_embeds %s",
                          f->path, ge ? "has no" : "has a", dir, ge ? "true" : "false");
    } else if (s == CDF_OK && c->tkind == CDF_PIPE_SD3) {
        s = expect(f, dir, "transformer", cfg, "num_attention_heads", head, sf_dim(f, p, "x_embedder.proj.weight", 0),
                   "the transformer's width (x_embedder.proj.weight)");
        if (s == CDF_OK)
            s = expect(f, dir, "transformer", cfg, "in_channels", 1, sf_dim(f, p, "x_embedder.proj.weight", 1), "x_embedder's input channels");
        if (s == CDF_OK)
            s = expect(f, dir, "transformer", cfg, "patch_size", 1, sf_dim(f, p, "x_embedder.proj.weight", 2), "x_embedder's patch size");
        if (s == CDF_OK) s = expect(f, dir, "transformer", cfg, "num_layers", 1, sf_blocks(f, p, "joint_blocks."), "the number of joint_blocks");
        if (s == CDF_OK)
            s = expect(f, dir, "transformer", cfg, "joint_attention_dim", 1, sf_dim(f, p, "context_embedder.weight", 1),
                       "context_embedder's input width");
        if (s == CDF_OK)
            s = expect(f, dir, "transformer", cfg, "pooled_projection_dim", 1, sf_dim(f, p, "y_embedder.mlp.0.weight", 1),
                       "y_embedder's input width");
        int64_t pm = 0, pos = sf_dim(f, p, "pos_embed", 1);
        if (s == CDF_OK) s = cdf_json_get_int(cfg, "pos_embed_max_size", 0, &pm);
        if (s == CDF_OK && pm * pm != pos)
            s = cdf_error(CDF_ERR_SHAPE, "%s: pos_embed holds %lld positions, but %s/transformer/config.json says pos_embed_max_size "
                          "%lld (%lld positions)", f->path, (long long)pos, dir, (long long)pm, (long long)(pm * pm));
    }
    cJSON_Delete(cfg);
    return s;
}

static cdf_status check_vae(const sf_file *f, const sf_contents *c, const char *dir) {
    cJSON *cfg = NULL;
    CDF_TRY(load_cfg(dir, "vae", &cfg));
    cdf_status s = expect(f, dir, "vae", cfg, "latent_channels", 1, sf_dim(f, c->vpfx, "decoder.conv_in.weight", 1),
                          "the VAE decoder's input channels (decoder.conv_in.weight)");
    const cJSON *boc = cJSON_GetObjectItemCaseSensitive(cfg, "block_out_channels");
    const int nb = cJSON_IsArray(boc) ? cJSON_GetArraySize(boc) : 0;
    const int64_t up = sf_blocks(f, c->vpfx, "decoder.up.");
    if (s == CDF_OK && nb != up)
        s = cdf_error(CDF_ERR_SHAPE, "%s: the VAE decoder has %lld up blocks, but %s/vae/config.json lists %d block_out_channels",
                      f->path, (long long)up, dir, nb);
    cJSON_Delete(cfg);
    return s;
}

static cdf_status check_text(const sf_file *f, int part, const char *dir, const char *key) {
    cJSON *cfg = NULL;
    CDF_TRY(load_cfg(dir, key, &cfg));
    char p[64];
    snprintf(p, sizeof p, "text_encoders.%s.transformer.", k_parts[part]);
    cdf_status s;
    if (part < 2) {
        s = expect(f, dir, key, cfg, "hidden_size", 1, sf_dim(f, p, "text_model.embeddings.position_embedding.weight", 1),
                   "the CLIP text encoder's width (position_embedding)");
        if (s == CDF_OK)
            s = expect(f, dir, key, cfg, "num_hidden_layers", 1, sf_blocks(f, p, "text_model.encoder.layers."), "the number of CLIP layers");
    } else {
        int64_t d = sf_dim(f, p, "shared.weight", 1);
        if (d < 0) d = sf_dim(f, p, "encoder.embed_tokens.weight", 1);
        s = expect(f, dir, key, cfg, "d_model", 1, d, "T5's width (shared.weight)");
        if (s == CDF_OK) s = expect(f, dir, key, cfg, "num_layers", 1, sf_blocks(f, p, "encoder.block."), "the number of T5 blocks");
    }
    cJSON_Delete(cfg);
    return s;
}

/* ---- resolve ---- */

static bool is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static cdf_status shipped_dir(const char *model, char *dir, size_t n) {
    const char *env = getenv("CDIFFUSERS_CONFIGS");
    const char *root = env && *env ? env : CDF_SHIPPED_CONFIGS;
    if (!*root || (size_t)snprintf(dir, n, "%s/%s", root, model) >= n || !is_dir(dir))
        return cdf_error(CDF_ERR_NOT_FOUND, "the shipped configs of %s are not found (looked in '%s'; set CDIFFUSERS_CONFIGS "
                         "to the repository's models/configs, or pass a diffusers folder as config / --config DIR)", model,
                         *root ? dir : "(none compiled in)");
    return CDF_OK;
}

static void sf_close(sf_file *f) {
    cdf_checkpoint_close(f->ck);
    cdf_gguf_close(f->gg);
}

static cdf_status sf_open(const char *path, sf_file *f) {
    memset(f, 0, sizeof *f);
    f->path = path;
    return ends_with(path, ".gguf") ? cdf_gguf_open(path, &f->gg) : cdf_checkpoint_open(path, &f->ck);
}

/* Whether the file holds the pipeline's component `key` (and which text encoder part it is). */
static void sf_holds(const sf_contents *c, bool second_is_t5, const char *key, bool *holds, int *part) {
    *part = -1;
    const char *tp = cdf_pipe_text_part(key, second_is_t5);
    if (strcmp(key, "transformer") == 0) *holds = c->tpfx != NULL;
    else if (strcmp(key, "vae") == 0) *holds = c->vpfx != NULL;
    else if (tp) {
        *part = strcmp(tp, "clip_l") == 0 ? 0 : strcmp(tp, "clip_g") == 0 ? 1 : 2;
        *holds = c->part[*part];
    } else {
        *holds = false;
    }
}

static const char *option_for(const char *key) {
    if (strcmp(key, "transformer") == 0) return "--transformer FILE";
    if (strcmp(key, "vae") == 0) return "--vae FILE";
    if (strcmp(key, "text_encoder") == 0) return "--text-encoder 1=FILE";
    if (strcmp(key, "text_encoder_2") == 0) return "--text-encoder 2=FILE";
    if (strcmp(key, "text_encoder_3") == 0) return "--text-encoder 3=FILE";
    return "a component file";
}

static const char *what_for(const char *key, int part) {
    if (strcmp(key, "transformer") == 0)
        return "transformer (BFL FLUX.1 / FLUX.2 or Stability SD3 keys, bare or under \"model.diffusion_model.\")";
    if (strcmp(key, "vae") == 0) return "VAE (LDM keys under \"vae.\" or \"first_stage_model.\")";
    return part == 0 ? "CLIP-L text encoder (\"text_encoders.clip_l.transformer.\")"
           : part == 1 ? "CLIP-G text encoder (\"text_encoders.clip_g.transformer.\")"
                       : "T5-XXL text encoder (\"text_encoders.t5xxl.transformer.\")";
}

cdf_status cdf_pipe_single_file_resolve(const char *path, const char *config, const cdf_component_file *given, int n_given,
                                        cdf_pipe_single_file *out) {
    memset(out, 0, sizeof *out);
    sf_file f;
    CDF_TRY(sf_open(path, &f));
    sf_contents c;
    sf_inspect(&f, &c);
    char why[300] = "";
    const char *model = sf_model(&f, &c, why, sizeof why);
    cdf_status s = CDF_OK;
    if (model) snprintf(out->model, sizeof out->model, "%s", model);
    if (config) {
        if (!is_dir(config)) s = cdf_error(CDF_ERR_NOT_FOUND, "config folder '%s' does not exist or is not a folder", config);
        else snprintf(out->config_dir, sizeof out->config_dir, "%s", config);
    } else if (!model) {
        s = cdf_error(CDF_ERR_UNSUPPORTED, "%s is not a single file of a model cdiffusers knows (FLUX.1-dev, FLUX.1-schnell, "
                      "SD3-Medium, SD3.5-Medium, SD3.5-Large, FLUX.2-dev): %s; pass its diffusers folder as --config DIR "
                      "(C API: cdf_pipeline_load_params.config)", path, why);
    } else if (strcmp(model, "flux2-dev") == 0) {
        /* the shipped models/configs/flux2-dev holds the transformer's and the VAE's configs only */
        s = cdf_error(CDF_ERR_UNSUPPORTED, "%s is a FLUX.2-dev transformer single file: load it with a FLUX.2 diffusers folder, "
                      "--model DIR --transformer FILE (C API: component_files {\"transformer\", path}) or --model FILE "
                      "--config DIR; it cannot run alone: the shipped models/configs/flux2-dev holds only the transformer and "
                      "VAE configs, not the model_index.json, the scheduler and Mistral text encoder configs or the Mistral "
                      "tokenizer (17 MB)", path);
    } else {
        s = shipped_dir(model, out->config_dir, sizeof out->config_dir);
    }
    cJSON *idx = NULL;
    if (s == CDF_OK) {
        char ip[4200];
        snprintf(ip, sizeof ip, "%s/model_index.json", out->config_dir);
        s = cdf_json_load_file(ip, &idx);
    }
    const char *cls = NULL;
    if (s == CDF_OK) s = cdf_json_get_string(idx, "_class_name", NULL, &cls);
    const bool second_is_t5 = cls && strcmp(cls, "FluxPipeline") == 0;
    if (s == CDF_OK && c.tpfx && cls &&
        ((c.tkind == CDF_PIPE_SD3) != (strcmp(cls, "StableDiffusion3Pipeline") == 0) ||
         (c.tkind == CDF_PIPE_FLUX2) != (strcmp(cls, "Flux2Pipeline") == 0)))
        s = cdf_error(CDF_ERR_FORMAT, "%s holds a %s transformer, but %s is a %s folder", path,
                      c.tkind == CDF_PIPE_SD3 ? "SD3" : c.tkind == CDF_PIPE_FLUX2 ? "FLUX.2" : "FLUX.1", out->config_dir, cls);
    static const char *const keys[] = {"text_encoder", "text_encoder_2", "text_encoder_3", "transformer", "vae"};
    for (size_t k = 0; s == CDF_OK && k < sizeof keys / sizeof *keys; k++) {
        const char *ccls = NULL;
        s = cdf_model_index_class(out->config_dir, idx, keys[k], &ccls);
        if (s != CDF_OK || !ccls) continue;
        bool user = false;
        for (int i = 0; i < n_given && !user; i++) user = given[i].component && strcmp(given[i].component, keys[k]) == 0;
        bool holds;
        int part;
        sf_holds(&c, second_is_t5, keys[k], &holds, &part);
        if (user) continue; /* the user's file: checked by its own load */
        if (!holds) {
            s = cdf_error(CDF_ERR_NOT_FOUND, "%s holds no %s for the pipeline's '%s': pass it with %s (C API: component_files "
                          "{\"%s\", path})", path,
                          c.tkind == CDF_PIPE_FLUX2 && part >= 0 ? "Mistral3 text encoder (transformers' names)" : what_for(keys[k], part),
                          keys[k], option_for(keys[k]), keys[k]);
            break;
        }
        if (strcmp(keys[k], "transformer") == 0) s = check_transformer(&f, &c, out->config_dir);
        else if (strcmp(keys[k], "vae") == 0) s = check_vae(&f, &c, out->config_dir);
        else s = check_text(&f, part, out->config_dir, keys[k]);
        if (s == CDF_OK) snprintf(out->keys[out->n++], sizeof out->keys[0], "%s", keys[k]);
    }
    cJSON_Delete(idx);
    sf_close(&f);
    return s;
}

cdf_status cdf_pipeline_single_file_model(const char *path, const char *config, char *model, size_t model_n, char *config_dir,
                                          size_t dir_n) {
    if (!path) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_pipeline_single_file_model: path is NULL");
    cdf_pipe_single_file *sf = calloc(1, sizeof *sf);
    if (!sf) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    cdf_status s = cdf_pipe_single_file_resolve(path, config, NULL, 0, sf);
    if (s == CDF_OK && model) snprintf(model, model_n, "%s", sf->model);
    if (s == CDF_OK && config_dir) snprintf(config_dir, dir_n, "%s", sf->config_dir);
    free(sf);
    return s;
}

cdf_status cdf_pipe_single_file_params(const char *path, const cdf_pipeline_load_params *lp, cdf_pipe_single_file *sf,
                                       cdf_pipeline_load_params *out) {
    *out = *lp;
    if (lp->num_component_files < 0 || lp->num_component_files > 8 || (lp->num_component_files && !lp->component_files))
        return cdf_error(CDF_ERR_INVALID_ARG, "component_files: %d entries (0..8 allowed)", lp->num_component_files);
    CDF_TRY(cdf_pipe_single_file_resolve(path, lp->config, lp->component_files, lp->num_component_files, sf));
    int n = 0;
    for (int i = 0; i < lp->num_component_files; i++) sf->files[n++] = lp->component_files[i];
    for (int k = 0; k < sf->n; k++) {
        if (n == 8) return cdf_error(CDF_ERR_INVALID_ARG, "component_files: more than 8 with the single file's components");
        sf->files[n++] = (cdf_component_file){sf->keys[k], path};
    }
    out->component_files = sf->files;
    out->num_component_files = n;
    out->config = NULL;
    return CDF_OK;
}
