/* The device-memory planner: weights from checkpoint headers, activations measured, both per
 * pipeline phase (text encoding, denoising, VAE decode) and offload mode. Nothing is loaded or
 * run for real: config.json files and safetensors/GGUF headers are all it reads.
 *
 * Activations (eager execution, every component class): each component's forward runs over
 * virtual buffers at the request's shapes (measure_activations below): the loaders build the
 * model with shapes_only weights, exec/capture.h's measure mode logs every buffer the forward
 * allocates and releases while no kernel runs, and compile/memory_plan.c's cdf_memory_peak
 * takes the peak of live bytes from the log. Nodes are dropped as they are submitted, i.e.
 * operands die when eager's queue would have run their last op: the live set the allocator sees
 * when it drains the queue before declaring out-of-memory, which is what a budget measures.
 *
 * Repeated-block compile (CDF_PLAN_REPEATED_BLOCKS) keeps formulas (the *_blocks_elems below):
 * each transformer block is a graph whose buffers are placed by lifetime in one arena, allocated
 * for that block's run and freed after it, which a measured eager forward does not reproduce;
 * the transformer then needs the largest block class's arena plus the block's inputs and
 * outputs (each arena is the live set of the graph's busiest point: a buffer dies at its last
 * use, not at the block's end). They were calibrated against the graphs' arenas with
 * bench/offload/calibrate.c. Whole-model compile is not modelled separately: its one arena per
 * forward is at most the eager live set, so the eager plan is an upper bound there.
 *
 * The per-class formulas for eager execution this planner had before are gone: the measurement
 * replaced them, and bench/offload/calibrate.c compares the measured peaks with real runs. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cdiffusers/io.h"
#include "compile/memory_peak.h"
#include "core/error_internal.h"
#include "graph/node.h"
#include "models/component.h"
#include "models/mistral3_text.h"
#include "nn/nn.h"
#include "pipelines/pipeline_impl.h"
#include "pipelines/planner.h"
#include "pipelines/step_cache.h"
#include "io/json.h"

void cdf_plan_format_bytes(char *buf, size_t n, uint64_t b) {
    if (b >= (1ull << 30)) snprintf(buf, n, "%.2f GiB", b / 1073741824.0);
    else if (b >= (1ull << 20)) snprintf(buf, n, "%.2f MiB", b / 1048576.0);
    else if (b >= 1024) snprintf(buf, n, "%.1f KiB", b / 1024.0);
    else snprintf(buf, n, "%llu B", (unsigned long long)b);
}

/* ---- weights ------------------------------------------------------------------------------- */
static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Device bytes one checkpoint tensor takes once loaded with weight_dtype (the loaders' rules). */
/* Parts of a Mistral3ForConditionalGeneration checkpoint (FLUX.2's text encoder) that
 * mistral3_text.c never loads: it computes hidden states only (no logits) and no image input. In
 * FLUX.2-dev they are ~2.2 GB of the 48 GB (the lm_head and the vision tower). */
static bool never_loaded(const char *name) {
    static const char *const prefixes[] = {"lm_head.", "language_model.lm_head.", "vision_tower.", "multi_modal_projector.",
                                           "model.vision_tower.", "model.multi_modal_projector."};
    for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++)
        if (strncmp(name, prefixes[i], strlen(prefixes[i])) == 0) return true;
    return false;
}

bool cdf_plan_is_linear_weight(const char *class_name, const char *name, int ndim) {
    if (!class_name || ndim != 2 || !ends_with(name, ".weight") || never_loaded(name)) return false;
    /* the transformers load every 2-d weight through a linear layer (no embedding tables) */
    if (strcmp(class_name, "FluxTransformer2DModel") == 0 || strcmp(class_name, "SD3Transformer2DModel") == 0 ||
        strcmp(class_name, "Flux2Transformer2DModel") == 0)
        return true;
    /* the text encoders (clip_text.c, t5_encoder.c, mistral3_text.c): every 2-d weight but the
     * embedding tables (token, position, T5's relative bias) and CLIP's text projection */
    if (strncmp(class_name, "CLIPTextModel", 13) == 0 || strcmp(class_name, "T5EncoderModel") == 0 ||
        strcmp(class_name, "Mistral3ForConditionalGeneration") == 0)
        return !strstr(name, "embed") && !strstr(name, "relative_attention_bias") && strcmp(name, "shared.weight") != 0 &&
               !strstr(name, "text_projection");
    if (strncmp(class_name, "AutoencoderKL", 13) == 0) { /* the mid-block attention (autoencoder_kl.c; + Flux2) */
        static const char *const a[] = {".to_q.weight", ".to_k.weight", ".to_v.weight", ".to_out.0.weight",
                                        ".query.weight", ".key.weight", ".value.weight", ".proj_attn.weight"};
        for (size_t i = 0; i < sizeof a / sizeof *a; i++)
            if (strstr(name, ".attentions.") && ends_with(name, a[i])) return true;
    }
    return false;
}

/* One stored tensor: its name, shape, float dtype (or ggml block type) and stored bytes. */
typedef struct plan_tensor {
    const char *name;
    int ndim;
    const int64_t *shape;
    cdf_dtype dtype; /* safetensors dtype; F32/F16/BF16 for GGUF floats */
    int ggml;        /* a GGUF block type, else -1 */
    uint64_t nbytes;
} plan_tensor;

/* Device bytes one stored tensor takes once loaded (the loaders' rules): float tensors of 2+ dims
 * at weight_dtype, 1-d ones at f32, the exceptions below; a linear layer's weight as blocks when
 * a GGUF file stores it so (kept, unless decoded at load) or --weight-type quantizes it. */
static uint64_t tensor_device_bytes(const plan_tensor *t, cdf_dtype weight_dtype, const cdf_plan_weights_opts *o) {
    if (never_loaded(t->name) || ends_with(t->name, "num_batches_tracked")) return 0; /* BatchNorm's counter (FLUX.2 VAE) */
    /* what an all-in-one file's text encoder part holds besides the weights (weights_source.c
     * leaves them unread): CLIP's logit_scale, ComfyUI's tokenizer bytes, and the CLIP-L
     * text_projection a CLIPTextModel has no use for */
    if (strcmp(t->name, "logit_scale") == 0 || strcmp(t->name, "spiece_model") == 0 ||
        (o && o->class_name && strcmp(o->class_name, "CLIPTextModel") == 0 && strcmp(t->name, "text_projection.weight") == 0))
        return 0;
    int64_t numel = 1;
    for (int i = 0; i < t->ndim; i++) numel *= t->shape[i];
    const bool blocks_ok = weight_dtype == CDF_F32 || weight_dtype == CDF_BF16; /* nn/weights.c get_blocks */
    const bool linear = o && blocks_ok && cdf_plan_is_linear_weight(o->class_name, t->name, t->ndim);
    cdf_dtype src = t->dtype;
    if (t->ggml >= 0) {
        int64_t be = 0;
        if (linear && !o->decode_quantized && cdf_ggml_type_block((uint32_t)t->ggml, &be, NULL) && be >= 2 &&
            cdf_ggml_can_dequantize((uint32_t)t->ggml) && t->shape[1] % be == 0)
            return t->nbytes; /* kept as the file's blocks */
        src = CDF_F32;        /* decoded at load */
    }
    if (!cdf_dtype_is_float(src)) return t->nbytes;
    /* the loaders' exceptions (see clip_text.c, t5_encoder.c, sd3_transformer.c) */
    /* T5 keeps block 0's bucket table on the device in f32 (the other blocks' copies are unused) */
    if (ends_with(t->name, "relative_attention_bias.weight"))
        return strcmp(t->name, "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight") == 0
                   ? (uint64_t)numel * sizeof(float)
                   : 0;
    int64_t qe = 0, qb = 0;
    if (linear && t->ggml < 0 && o->quantize_to && cdf_ggml_type_block(o->quantize_to, &qe, &qb) && qe >= 2 &&
        t->shape[1] % qe == 0)
        return (uint64_t)(numel / qe * qb); /* quantized at load (--weight-type) */
    cdf_dtype dt = t->ndim >= 2 ? weight_dtype : CDF_F32;
    /* CLIP's position table stays f32; SD3's pos_embed takes the weights' dtype */
    if (ends_with(t->name, "position_embedding.weight")) dt = CDF_F32;
    return (uint64_t)numel * cdf_dtype_size(dt);
}

cdf_status cdf_plan_weight_bytes(const char *dir, cdf_dtype weight_dtype, uint64_t *out) {
    cdf_plan_blocks b;
    CDF_TRY(cdf_plan_block_bytes(dir, weight_dtype, &b));
    *out = b.total_bytes;
    return CDF_OK;
}

cdf_status cdf_plan_block_bytes(const char *dir, cdf_dtype weight_dtype, cdf_plan_blocks *out) {
    return cdf_plan_block_bytes_opts(dir, weight_dtype, NULL, out);
}

cdf_status cdf_plan_block_bytes_opts(const char *dir, cdf_dtype weight_dtype, const cdf_plan_weights_opts *o,
                                     cdf_plan_blocks *out) {
    memset(out, 0, sizeof *out);
    const bool gguf = o && o->file && ends_with(o->file, ".gguf");
    cdf_checkpoint *ck = NULL;
    cdf_gguf_file *gf = NULL;
    CDF_TRY(gguf ? cdf_gguf_open(o->file, &gf) : cdf_checkpoint_open(o && o->file ? o->file : dir, &ck));
    const int n = gguf ? cdf_gguf_count(gf) : cdf_checkpoint_count(ck);
    /* an all-in-one file: only this component's part (its prefix; bare names outside the other
     * components' prefixes) */
    static const char *const parts[] = {"text_encoders.", "model.diffusion_model.", "vae.", "first_stage_model."};
    char pfx[64] = "";
    for (int i = 0; o && o->file && i < n && !pfx[0]; i++) {
        const char *nm = gguf ? cdf_gguf_tensor_at(gf, i)->name : cdf_checkpoint_name_at(ck, i);
        char te[64];
        snprintf(te, sizeof te, "text_encoders.%s.transformer.", o->text_part ? o->text_part : "-");
        if (o->text_part && strncmp(nm, te, strlen(te)) == 0) snprintf(pfx, sizeof pfx, "%s", te);
        else if (o->key && strcmp(o->key, "transformer") == 0 && strncmp(nm, parts[1], strlen(parts[1])) == 0)
            snprintf(pfx, sizeof pfx, "%s", parts[1]);
        else if (o->key && strcmp(o->key, "vae") == 0)
            for (int k = 2; k < 4 && !pfx[0]; k++)
                if (strncmp(nm, parts[k], strlen(parts[k])) == 0) snprintf(pfx, sizeof pfx, "%s", parts[k]);
    }
    /* per block: its prefix ("transformer_blocks.3") and bytes */
    enum { MAXB = 1024 };
    char(*names)[96] = calloc(MAXB, sizeof *names);
    uint64_t *bytes = calloc(MAXB, sizeof *bytes);
    int nb = 0;
    cdf_status s = names && bytes ? CDF_OK : cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    for (int i = 0; i < n && s == CDF_OK; i++) {
        const char *nm = gguf ? cdf_gguf_tensor_at(gf, i)->name : cdf_checkpoint_name_at(ck, i);
        bool mine = strncmp(nm, pfx, strlen(pfx)) == 0;
        for (size_t k = 0; !pfx[0] && k < sizeof parts / sizeof *parts; k++)
            if (o && o->file && strncmp(nm, parts[k], strlen(parts[k])) == 0) mine = false;
        if (!mine) continue;
        plan_tensor pt = {.ggml = -1};
        if (gguf) {
            const cdf_gguf_tensor *g = cdf_gguf_tensor_at(gf, i);
            pt = (plan_tensor){g->name, g->ndim, g->shape, CDF_F32, -1, g->nbytes};
            if (g->type == CDF_GGML_F16) pt.dtype = CDF_F16;
            else if (g->type == CDF_GGML_BF16) pt.dtype = CDF_BF16;
            else if (g->type != CDF_GGML_F32) pt.ggml = (int)g->type;
        } else {
            const cdf_st_file *f;
            const cdf_st_tensor *t;
            if (cdf_checkpoint_tensor_at(ck, i, &f, &t) != CDF_OK) continue;
            pt = (plan_tensor){t->name, t->ndim, t->shape, t->dtype, -1, t->nbytes};
        }
        pt.name += strlen(pfx);
        const uint64_t b = tensor_device_bytes(&pt, weight_dtype, o);
        out->total_bytes += b;
        const size_t pl = cdf_weights_block_prefix(pt.name);
        if (!pl || pl >= sizeof names[0]) continue;
        int j = 0;
        while (j < nb && (strncmp(names[j], pt.name, pl) != 0 || names[j][pl] != 0)) j++;
        if (j == nb) {
            if (nb == MAXB) continue;
            memcpy(names[nb], pt.name, pl);
            names[nb][pl] = 0;
            nb++;
        }
        bytes[j] += b;
        out->blocks_bytes += b;
    }
    out->n_blocks = nb;
    for (int j = 0; j < nb; j++) {
        if (bytes[j] > out->largest_block_bytes) out->largest_block_bytes = bytes[j];
        const int fam = strncmp(names[j], "single_", 7) == 0;
        if (bytes[j] > out->largest_in_family[fam]) out->largest_in_family[fam] = bytes[j];
    }
    free(names);
    free(bytes);
    cdf_checkpoint_close(ck);
    cdf_gguf_close(gf);
    return s;
}

/* ---- model info ------------------------------------------------------------------------------ */
static int64_t geti(const cJSON *cfg, const char *key, int64_t def) {
    int64_t v = def;
    if (cdf_json_get_int(cfg, key, def, &v) != CDF_OK || v < 0 || v > (1 << 24)) v = def;
    return v;
}

cdf_status cdf_plan_model_info_from_config(const char *cls, const cJSON *cfg, cdf_plan_model_info *m) {
    memset(m, 0, sizeof *m);
    m->weight_dtype = CDF_F32;
    if (!cls) return cdf_error(CDF_ERR_INVALID_ARG, "planner: model class is NULL");
    if (strcmp(cls, "CLIPTextModel") == 0 || strcmp(cls, "CLIPTextModelWithProjection") == 0) {
        m->kind = CDF_PLAN_CLIP;
        m->width = geti(cfg, "hidden_size", 512);
        m->layers = geti(cfg, "num_hidden_layers", 12);
        m->heads = geti(cfg, "num_attention_heads", 8);
        m->mlp = geti(cfg, "intermediate_size", 2048);
    } else if (strcmp(cls, "T5EncoderModel") == 0) {
        m->kind = CDF_PLAN_T5;
        m->width = geti(cfg, "d_model", 512);
        m->layers = geti(cfg, "num_layers", 6);
        m->heads = geti(cfg, "num_heads", 8);
        m->head_dim = geti(cfg, "d_kv", 64);
        m->mlp = geti(cfg, "d_ff", 2048);
    } else if (strcmp(cls, "FluxTransformer2DModel") == 0 || strcmp(cls, "SD3Transformer2DModel") == 0) {
        const bool flux = cls[0] == 'F';
        m->kind = flux ? CDF_PLAN_FLUX : CDF_PLAN_SD3;
        m->heads = geti(cfg, "num_attention_heads", flux ? 24 : 18);
        m->head_dim = geti(cfg, "attention_head_dim", flux ? 128 : 64);
        m->width = m->heads * m->head_dim;
        m->mlp = 4 * m->width;
        m->layers = geti(cfg, "num_layers", flux ? 19 : 18);
        m->single_layers = flux ? geti(cfg, "num_single_layers", 38) : 0;
        m->in_channels = geti(cfg, "in_channels", flux ? 64 : 16);
        m->joint_dim = geti(cfg, "joint_attention_dim", 4096);
        m->pooled_dim = geti(cfg, "pooled_projection_dim", flux ? 768 : 2048);
        m->patch = geti(cfg, "patch_size", flux ? 1 : 2);
        if (flux) {
            bool g = false;
            if (cdf_json_get_bool(cfg, "guidance_embeds", false, &g) == CDF_OK) m->guidance_embeds = g;
        } else {
            const cJSON *d = cJSON_GetObjectItemCaseSensitive(cfg, "dual_attention_layers");
            m->dual_layers = cJSON_IsArray(d) ? cJSON_GetArraySize(d) : 0;
            const cJSON *q = cJSON_GetObjectItemCaseSensitive(cfg, "qk_norm");
            m->qk_norm = cJSON_IsString(q);
        }
    } else if (strcmp(cls, "Flux2Transformer2DModel") == 0) {
        m->kind = CDF_PLAN_FLUX2;
        m->heads = geti(cfg, "num_attention_heads", 48);
        m->head_dim = geti(cfg, "attention_head_dim", 128);
        m->width = m->heads * m->head_dim;
        double ratio = 3.0;
        if (cdf_json_get_double(cfg, "mlp_ratio", 3.0, &ratio) != CDF_OK || !(ratio > 0 && ratio < 64)) ratio = 3.0;
        m->mlp = (int64_t)((double)m->width * ratio); /* int(inner_dim * mlp_ratio) */
        m->layers = geti(cfg, "num_layers", 8);
        m->single_layers = geti(cfg, "num_single_layers", 48);
        m->in_channels = geti(cfg, "in_channels", 128);
        m->joint_dim = geti(cfg, "joint_attention_dim", 15360);
        m->patch = geti(cfg, "patch_size", 1);
    } else if (strcmp(cls, "Mistral3ForConditionalGeneration") == 0 || strcmp(cls, "MistralModel") == 0 ||
               strcmp(cls, "MistralForCausalLM") == 0) {
        m->kind = CDF_PLAN_MISTRAL;
        const cJSON *tc = cJSON_GetObjectItemCaseSensitive(cfg, "text_config"); /* Mistral3: the language model's */
        const cJSON *c = cJSON_IsObject(tc) ? tc : cfg;
        m->width = geti(c, "hidden_size", 5120);
        m->layers = geti(c, "num_hidden_layers", 40);
        m->heads = geti(c, "num_attention_heads", 32);
        m->kv_heads = geti(c, "num_key_value_heads", 8);
        m->head_dim = geti(c, "head_dim", m->heads > 0 ? m->width / m->heads : 128);
        m->mlp = geti(c, "intermediate_size", 32768);
    } else if (strcmp(cls, "AutoencoderKL") == 0 || strcmp(cls, "AutoencoderKLFlux2") == 0) {
        /* AutoencoderKLFlux2 decodes with the same Decoder (its BatchNorm denormalisation and
         * unpatchify act on the small latents), with `decoder_block_out_channels or
         * block_out_channels` */
        m->kind = CDF_PLAN_VAE;
        int n = 0;
        const cJSON *dec = cJSON_GetObjectItemCaseSensitive(cfg, "decoder_block_out_channels");
        const bool flux2 = strcmp(cls, "AutoencoderKLFlux2") == 0;
        const char *key = flux2 && cJSON_IsArray(dec) ? "decoder_block_out_channels" : "block_out_channels";
        if (cdf_json_get_int_array(cfg, key, m->channels, 8, &n) != CDF_OK || n < 1) {
            n = 1;
            m->channels[0] = 64;
        }
        m->n_blocks = n;
        m->layers_per_block = geti(cfg, "layers_per_block", 1);
        m->latent_channels = geti(cfg, "latent_channels", 4);
        m->vae_scale_factor = 1 << (n - 1);
        m->out_channels = geti(cfg, "out_channels", 3);
        const cJSON *ss = cJSON_GetObjectItemCaseSensitive(cfg, "sample_size");
        if (cJSON_IsArray(ss)) ss = ss->child;
        m->sample_size = cJSON_IsNumber(ss) ? (int64_t)ss->valuedouble : flux2 ? 1024 : 32;
    } else {
        m->kind = CDF_PLAN_OTHER;
    }
    return CDF_OK;
}

/* ---- activations: repeated-block compile ------------------------------------------------------ */
/* Counts below are in f32 elements (activations are f32 whatever the weight dtype). Eager
 * execution is measured instead (measure_activations further down). */

/* The same three transformers with repeated-block compile: per block class, the arena (the live
 * set at the graph's busiest point, per batch element) is the largest of
 *   - a stream's feed-forward: its input [D] + the MLP's live intermediates [M] for that
 *     stream's tokens, while the other stream holds its block output [D]
 *     (M = in + GELU = 2 F for FLUX.1 and SD3; in [2F] + SiLU + product = 4 F for FLUX.2's SwiGLU);
 *   - the joint attention: q, k, v and their rotated / normed copies and the output, ~6 D per
 *     token with RoPE (FLUX), 5 D per text + 4 D per image token without (SD3; its image stream's
 *     q, k, v are written straight into the joint buffers);
 *   - a single block (FLUX): input and norm [2 D] + the fused MLP branch [M] per token
 *     (FLUX.2: the fused projection [3 D + 2 F], SiLU and product: 4 D + 4 F).
 * Only one block runs at a time (the next block's arena waits for the previous one's under a
 * budget), so the need is the largest class's arena, plus the block's inputs, which the forward
 * holds, and its outputs, copied out of the arena (2 D per token). Read off the graphs'
 * `CDIFFUSERS_LOG=compile` arenas: these match them within 2% on the test pipelines. */
static double double_block_arena(double N, double T, double D, double M, double attn) {
    double img = N * (D + M) + T * D, txt = T * (D + M) + N * D;
    double a = img > txt ? img : txt;
    return a > attn ? a : attn;
}

static void flux_blocks_elems(const cdf_plan_model_info *m, double B, double T, double N, bool swiglu, double fam[2]) {
    const double L = T + N, D = (double)m->width, F = (double)m->mlp;
    const double M = swiglu ? 4.0 * F : 2.0 * F, held = 2.0 * L * D, rope = 2.0 * L * m->head_dim;
    fam[0] = m->layers > 0 ? B * (double_block_arena(N, T, D, M, 6.0 * L * D) + held) + rope : 0;
    fam[1] = m->single_layers > 0 ? B * (L * (swiglu ? 4.0 * D + 4.0 * F : 2.0 * D + 2.0 * F) + held) + rope : 0;
}

/* SD3: the last block is context_pre_only (no text feed-forward); the others run both streams'
 * (dual-attention blocks add an image self-attention, never the largest point here). Plus, as in
 * eager, the patch embedding's outputs the forward holds and the ~40 elements per token. */
static double sd3_blocks_elems(const cdf_plan_model_info *m, double B, double T, double N) {
    const double L = N + T, D = (double)m->width, F = (double)m->mlp;
    const double attn = (5.0 * T + 4.0 * N) * D;
    double a = double_block_arena(N, 0, D, 2.0 * F, attn); /* context_pre_only */
    if (m->layers > 1) {
        const double full = double_block_arena(N, T, D, 2.0 * F, attn);
        if (full > a) a = full;
    }
    return B * (a + 2.0 * L * D + 2.0 * N * D + 40.0 * L + 40.0 * D);
}

void cdf_plan_activation_bytes_by_family(const cdf_plan_model_info *m, const cdf_plan_shape *s, uint64_t out[2]) {
    const double B = s->batch > 0 ? (double)s->batch : 1.0;
    double fam[2] = {0, 0};
    if (s->repeated_blocks && (m->kind == CDF_PLAN_FLUX || m->kind == CDF_PLAN_FLUX2)) {
        const double p = m->patch > 0 ? (double)m->patch : 1.0;
        const double T = (double)s->text_tokens, N = (double)((s->latent_h / 2) * (s->latent_w / 2)) / (p * p);
        flux_blocks_elems(m, B, T, N, m->kind == CDF_PLAN_FLUX2, fam);
    } else if (s->repeated_blocks && m->kind == CDF_PLAN_SD3) {
        const double p = m->patch > 0 ? (double)m->patch : 2.0;
        fam[0] = sd3_blocks_elems(m, B, (double)s->text_tokens, (double)(s->latent_h * s->latent_w) / (p * p));
    }
    out[0] = (uint64_t)(fam[0] * 4.0);
    out[1] = (uint64_t)(fam[1] * 4.0);
}

uint64_t cdf_plan_activation_bytes(const cdf_plan_model_info *m, const cdf_plan_shape *s) {
    uint64_t fam[2];
    cdf_plan_activation_bytes_by_family(m, s, fam);
    return fam[0] > fam[1] ? fam[0] : fam[1];
}

/* ---- pipelines ------------------------------------------------------------------------------------ */
typedef enum { PK_FLUX = 1, PK_SD3 = 2, PK_FLUX2 = 3 } plan_pipeline_kind;

typedef struct plan_component {
    const char *key;
    char class_name[64];
    uint64_t weights;
    cdf_plan_blocks blocks; /* the transformer's repeated blocks */
    cdf_plan_model_info info;
} plan_component;

/* Device bytes of c's weights while it runs under `mode`: with SEQUENTIAL the transformer holds
 * its non-block weights and one block's (under a budget the allocator lets the previous block's
 * ops finish and free its copy before failing, so one block is what is needed): the largest of
 * `family` (cdf_plan_blocks.largest_in_family), or of all blocks for family -1. */
static uint64_t running_weights(const plan_component *c, cdf_offload_mode mode, int family) {
    if (mode == CDF_OFFLOAD_SEQUENTIAL && strcmp(c->key, "transformer") == 0 && c->blocks.n_blocks > 0)
        return c->weights - c->blocks.blocks_bytes +
               (family < 0 ? c->blocks.largest_block_bytes : c->blocks.largest_in_family[family]);
    return c->weights;
}

typedef struct plan_pipeline {
    plan_pipeline_kind kind;
    char class_name[64];
    int n;
    plan_component c[CDF_PLAN_MAX_COMPONENTS];
} plan_pipeline;

/* The components cdf_pipeline_load loads for this pipeline class, with their weights (headers
 * only) and configs. */
/* The load options the weights depend on besides the dtype (component files, quantization). */
typedef struct plan_load {
    const char *file_key[8], *file_path[8];
    int n_files;
    uint32_t quantize_to;
    bool decode_quantized;
    /* the device the plan is for (cdf_pipeline_load_params.device): a values-kind one (pjrt)
     * frees a buffer when the host releases it, and with the XLA CPU plugin each op's compiled
     * temporaries are planned (xla_cpu_scratch) */
    bool values, xla_cpu;
    bool host_memory; /* the device's memory is the host's (the cpu backend): no prefetch by default */
} plan_load;

/* ---- compiled temporaries (pjrt with the XLA CPU plugin) -------------------------------------
 * On pjrt every eager op is an XLA program, and the device peak counts the temporaries its
 * compiled form needs while it runs (PJRT_Executable_GetCompiledMemoryStats; pjrt_backend.c
 * account_temporaries). Read off the XLA CPU plugin (xla_cpu_pjrt, PJRT API 0.81, StableHLO
 * 1.13.3) op by op, over 22 convolution shapes (1x1 and 3x3, 3 to 512 channels, 8x8 to 128x128,
 * H != W) and the ops of the FLUX.1 / VAE forwards, exact on all of them:
 *   - conv2d (NCHW): XLA CPU convolves in NHWC, so the output is computed into a transposed copy
 *     (its size); with more input than output channels the input is transposed too, and the
 *     transposed kernel stays beside them only when it is larger than the output (below, its
 *     buffer is shared); otherwise only the kernel is transposed: in + out (+ w if w > out), or
 *     out + w;
 *   - attention (one program: scores and probabilities materialised): 2 x B H Lq Lk plus the
 *     row statistics B H Lq, in f32 (exact for the VAE's one-head attention; the text encoders'
 *     and transformer's small-head ones measured up to 25% more, a few KiB at these sizes);
 *   - matmul with a bias: the product before the bias, M N (M > 1), or the weight transposed,
 *     K N (one row); without a bias none;
 *   - group_norm: 1/32 of its input (partial sums), plus 16 bytes.
 * Other ops (elementwise, layer/RMS norms' few bytes) are left out. The VAE decode's peak is at
 * its largest convolution (the last up block's), where these temporaries are the size of an
 * activation or more: without them the plan was 25% under the measured decode peak. */
static uint64_t tensor_bytes(const cdf_tensor *t) {
    if (!t) return 0;
    uint64_t n = cdf_dtype_size(cdf_tensor_dtype(t));
    for (int i = 0; i < cdf_tensor_ndim(t); i++) n *= (uint64_t)cdf_tensor_dim(t, i);
    return n;
}

static uint64_t xla_cpu_scratch(const cdf_node *n, void *user) {
    (void)user;
    const cdf_tensor *a = n->src[0], *b = n->n_src > 1 ? n->src[1] : NULL;
    switch (n->kind) {
    case CDF_OP_CONV2D: {
        if (!a || !b || cdf_tensor_ndim(a) != 4 || cdf_tensor_ndim(b) != 4) return 0;
        const uint64_t in = tensor_bytes(a), w = tensor_bytes(b), out = tensor_bytes(n->dst);
        if (cdf_tensor_dim(a, 1) > cdf_tensor_dim(b, 0)) return in + out + (w > out ? w : 0);
        return out + w;
    }
    case CDF_OP_ATTENTION: {
        const cdf_tensor *k = b;
        if (!a || !k || cdf_tensor_ndim(a) < 2 || cdf_tensor_ndim(k) < 2) return 0;
        const int nd = cdf_tensor_ndim(a);
        uint64_t bh = 1;
        for (int i = 0; i + 2 < nd; i++) bh *= (uint64_t)cdf_tensor_dim(a, i);
        const uint64_t lq = (uint64_t)cdf_tensor_dim(a, nd - 2), lk = (uint64_t)cdf_tensor_dim(k, cdf_tensor_ndim(k) - 2);
        return 4 * (2 * bh * lq * lk + bh * lq);
    }
    case CDF_OP_MATMUL: {
        if (!a || !b || n->n_src < 3 || !n->src[2] || cdf_tensor_ndim(a) < 2) return 0;
        const int64_t m = cdf_tensor_dim(a, cdf_tensor_ndim(a) - 2);
        return m > 1 ? tensor_bytes(n->dst) : tensor_bytes(b);
    }
    case CDF_OP_GROUP_NORM: return a ? tensor_bytes(a) / 32 + 16 : 0;
    default: return 0;
    }
}

/* What the plan's device is (see plan_load): the named one, else the default; a device that
 * cannot be opened is planned as the cpu backend would run it. */
static void plan_target(const char *name, plan_load *pl) {
    cdf_device *d = name ? cdf_device_get(name) : cdf_device_default();
    cdf_device_info info;
    if (!d || cdf_device_get_info(d, &info) != CDF_OK) {
        cdf_clear_error();
        return;
    }
    pl->values = info.values;
    pl->host_memory = info.host_visible;
    pl->xla_cpu = info.values && strstr(info.description, "platform cpu") != NULL;
}

static cdf_status plan_collect(const char *dir, const cJSON *idx, cdf_dtype wdt, const plan_load *pl, plan_pipeline *pp) {
    memset(pp, 0, sizeof *pp);
    const char *cls = NULL;
    CDF_TRY(cdf_json_get_string(idx, "_class_name", NULL, &cls));
    if (!cls) return cdf_error(CDF_ERR_FORMAT, "%s/model_index.json: no _class_name", dir);
    snprintf(pp->class_name, sizeof pp->class_name, "%s", cls);
    static const char *const flux_keys[] = {"text_encoder", "text_encoder_2", "transformer", "vae", NULL};
    static const char *const sd3_keys[] = {"text_encoder", "text_encoder_2", "text_encoder_3", "transformer", "vae", NULL};
    static const char *const flux2_keys[] = {"text_encoder", "transformer", "vae", NULL};
    const char *const *keys;
    if (strcmp(cls, "FluxPipeline") == 0) pp->kind = PK_FLUX, keys = flux_keys;
    else if (strcmp(cls, "StableDiffusion3Pipeline") == 0) pp->kind = PK_SD3, keys = sd3_keys;
    else if (strcmp(cls, "Flux2Pipeline") == 0) pp->kind = PK_FLUX2, keys = flux2_keys;
    else
        return cdf_error(CDF_ERR_UNSUPPORTED, "%s/model_index.json: pipeline class '%s' is not supported by the planner "
                         "(FluxPipeline, StableDiffusion3Pipeline, Flux2Pipeline)", dir, cls);
    for (int i = 0; keys[i]; i++) {
        const char *entry = NULL;
        CDF_TRY(cdf_model_index_class(dir, idx, keys[i], &entry)); /* a malformed entry is an error, */
        if (!entry) continue;                                      /* an absent one optional (SD3's T5) */
        plan_component *c = &pp->c[pp->n];
        c->key = keys[i];
        char sub[4096];
        snprintf(sub, sizeof sub, "%s/%s", dir, keys[i]);
        cJSON *cfg = NULL;
        CDF_TRY(cdf_config_load(sub, &cfg));
        const char *ccls = cdf_config_class_name(cfg);
        snprintf(c->class_name, sizeof c->class_name, "%s", ccls ? ccls : "?");
        cdf_status s = cdf_plan_model_info_from_config(c->class_name, cfg, &c->info);
        cJSON_Delete(cfg);
        if (s != CDF_OK) return s;
        c->info.weight_dtype = wdt;
        cdf_plan_weights_opts wo = {.class_name = c->class_name, .quantize_to = pl->quantize_to,
                                    .decode_quantized = pl->decode_quantized, .key = keys[i],
                                    .text_part = cdf_pipe_text_part(keys[i], pp->kind == PK_FLUX)};
        for (int k = 0; k < pl->n_files; k++)
            if (strcmp(pl->file_key[k], keys[i]) == 0) wo.file = pl->file_path[k];
        CDF_TRY(cdf_plan_block_bytes_opts(sub, wdt, &wo, &c->blocks));
        c->weights = c->blocks.total_bytes;
        pp->n++;
    }
    return CDF_OK;
}

static void device_type_upper(const cdf_device *dev, char *buf, size_t n) {
    snprintf(buf, n, "%s", cdf_device_name(dev));
    char *colon = strchr(buf, ':');
    if (colon) *colon = 0;
    for (char *q = buf; *q; q++)
        if (*q >= 'a' && *q <= 'z') *q = (char)(*q - 'a' + 'A');
}

/* ---- measured activations ------------------------------------------------------------------ */
/* The activation peak of a component's forward, measured: the component is loaded with
 * shapes_only weights (buffers without memory, sized from the checkpoint headers; no weight byte
 * is read) and its forward runs in measure mode (exec/capture.h: no kernel runs, every buffer is
 * virtual, each allocation and final release is logged); compile/memory_plan.c's cdf_memory_peak
 * turns the log into the peak of live bytes, per block family. What the forward allocates is
 * what eager holds once the queue has drained (the allocator drains it before declaring
 * out-of-memory), so the ±10% checks of tests/test_offload*.c hold for it as for a run. */
/* An input the forward only needs the shape of: a virtual buffer (no device memory, no values),
 * made in a measurement of its own whose log is dropped, so the forward's log leaves it out. The
 * planner runs during generate too (vae_tiling.c's AUTO decision, under a budget): its inputs
 * must not take device memory. */
static cdf_tensor *shape_in(cdf_device *dev, cdf_dtype dt, int ndim, const int64_t *shape) {
    if (cdf_measure_begin() != CDF_OK) return NULL;
    cdf_tensor *t = cdf_tensor_empty(dev, dt, ndim, shape);
    cdf_mem_event *log = NULL;
    size_t n = 0;
    const cdf_status s = cdf_measure_end(&log, &n);
    free(log);
    if (s != CDF_OK) {
        cdf_tensor_release(t);
        return NULL;
    }
    return t;
}

static cdf_status set_in(cdf_tensor_map *in, const char *name, cdf_tensor *t) {
    if (!t) return cdf_last_status() ? cdf_last_status() : cdf_error(CDF_ERR_INTERNAL, "planner: input '%s'", name);
    return cdf_tensor_map_set(in, name, t);
}

/* The inputs the pipelines give c's forward for shape sh (flux_pipeline.c, sd3_pipeline.c,
 * flux2_pipeline.c, pipeline.c's decode): shapes only, except the few values a forward reads on
 * the host (Mistral's layer list, the VAE's tile size: real, a few bytes). *method: "forward" or
 * "decode". */
static cdf_status measured_inputs(const plan_component *c, const cJSON *cfg, const cdf_plan_shape *sh, cdf_device *dev,
                                  const cdf_generate_params *gp, cdf_tensor_map *in, const char **method) {
    const int64_t B = sh->batch > 0 ? sh->batch : 1, T = sh->text_tokens;
    *method = "forward";
    switch (c->info.kind) {
    case CDF_PLAN_CLIP:
    case CDF_PLAN_T5: return set_in(in, "input_ids", shape_in(dev, CDF_I64, 2, (int64_t[]){1, T}));
    case CDF_PLAN_FLUX: {
        const int64_t N = (sh->latent_h / 2) * (sh->latent_w / 2), joint = geti(cfg, "joint_attention_dim", 4096);
        CDF_TRY(set_in(in, "hidden_states", shape_in(dev, CDF_F32, 3, (int64_t[]){B, N, c->info.in_channels})));
        CDF_TRY(set_in(in, "encoder_hidden_states", shape_in(dev, CDF_F32, 3, (int64_t[]){B, T, joint})));
        CDF_TRY(set_in(in, "pooled_projections", shape_in(dev, CDF_F32, 2, (int64_t[]){B, geti(cfg, "pooled_projection_dim", 768)})));
        CDF_TRY(set_in(in, "timestep", shape_in(dev, CDF_F32, 1, (int64_t[]){B})));
        CDF_TRY(set_in(in, "img_ids", shape_in(dev, CDF_F32, 2, (int64_t[]){N, 3})));
        CDF_TRY(set_in(in, "txt_ids", shape_in(dev, CDF_F32, 2, (int64_t[]){T, 3})));
        const cJSON *g = cJSON_GetObjectItemCaseSensitive(cfg, "guidance_embeds");
        if (cJSON_IsTrue(g)) CDF_TRY(set_in(in, "guidance", shape_in(dev, CDF_F32, 1, (int64_t[]){B})));
        return CDF_OK;
    }
    case CDF_PLAN_MISTRAL: { /* flux2_pipeline.c encode_prompt: the request's layers (read on the host) */
        int64_t lv[CDF_FLUX2_MAX_OUT_LAYERS] = CDF_FLUX2_TEXT_LAYERS_DEFAULT, nl = 3;
        if (gp->num_text_encoder_out_layers > 0 && gp->text_encoder_out_layers &&
            gp->num_text_encoder_out_layers <= CDF_FLUX2_MAX_OUT_LAYERS) {
            nl = gp->num_text_encoder_out_layers;
            for (int64_t k = 0; k < nl; k++) lv[k] = gp->text_encoder_out_layers[k];
        }
        CDF_TRY(set_in(in, "input_ids", shape_in(dev, CDF_I64, 2, (int64_t[]){1, T})));
        CDF_TRY(set_in(in, "attention_mask", shape_in(dev, CDF_I64, 2, (int64_t[]){1, T})));
        return set_in(in, "text_encoder_out_layers", cdf_tensor_from_host(dev, CDF_I64, 1, &nl, lv, CDF_I64));
    }
    case CDF_PLAN_FLUX2: { /* flux2_pipeline.c flux2_predict: ids [1, rows, 4] */
        const int64_t p = c->info.patch > 0 ? c->info.patch : 1, N = (sh->latent_h / 2) * (sh->latent_w / 2) / (p * p);
        CDF_TRY(set_in(in, "hidden_states", shape_in(dev, CDF_F32, 3, (int64_t[]){B, N, c->info.in_channels})));
        CDF_TRY(set_in(in, "encoder_hidden_states", shape_in(dev, CDF_F32, 3, (int64_t[]){B, T, c->info.joint_dim})));
        CDF_TRY(set_in(in, "timestep", shape_in(dev, CDF_F32, 1, (int64_t[]){B})));
        CDF_TRY(set_in(in, "img_ids", shape_in(dev, CDF_I64, 3, (int64_t[]){1, N, 4})));
        CDF_TRY(set_in(in, "txt_ids", shape_in(dev, CDF_I64, 3, (int64_t[]){1, T, 4})));
        const cJSON *g = cJSON_GetObjectItemCaseSensitive(cfg, "guidance_embeds");
        if (cJSON_IsTrue(g)) CDF_TRY(set_in(in, "guidance", shape_in(dev, CDF_F32, 1, (int64_t[]){B})));
        return CDF_OK;
    }
    case CDF_PLAN_SD3:
        CDF_TRY(set_in(in, "hidden_states", shape_in(dev, CDF_F32, 4, (int64_t[]){B, c->info.in_channels, sh->latent_h, sh->latent_w})));
        CDF_TRY(set_in(in, "encoder_hidden_states",
                       shape_in(dev, CDF_F32, 3, (int64_t[]){B, T, geti(cfg, "joint_attention_dim", 4096)})));
        CDF_TRY(set_in(in, "pooled_projections", shape_in(dev, CDF_F32, 2, (int64_t[]){B, geti(cfg, "pooled_projection_dim", 2048)})));
        return set_in(in, "timestep", shape_in(dev, CDF_F32, 1, (int64_t[]){B}));
    case CDF_PLAN_VAE: {
        *method = "decode";
        if (strcmp(c->class_name, "AutoencoderKLFlux2") == 0) /* flux2_pipeline.c: the 2x2-patchified latents */
            CDF_TRY(set_in(in, "unpacked_latents",
                           shape_in(dev, CDF_F32, 4, (int64_t[]){1, 4 * c->info.latent_channels, sh->latent_h / 2, sh->latent_w / 2})));
        else
            CDF_TRY(set_in(in, "z", shape_in(dev, CDF_F32, 4, (int64_t[]){1, c->info.latent_channels, sh->latent_h, sh->latent_w})));
        if (sh->vae_tile_latent <= 0) return CDF_OK;
        const int64_t tile = sh->vae_tile_latent * (c->info.vae_scale_factor > 0 ? c->info.vae_scale_factor : 8);
        return set_in(in, "tile_sample_min_size", cdf_tensor_from_host(dev, CDF_I64, 1, (int64_t[]){1}, &tile, CDF_I64));
    }
    default: return cdf_error(CDF_ERR_UNSUPPORTED, "planner: no measured forward for %s", c->class_name);
    }
}

/* Whether c's activations are measured (above) for this execution; otherwise the formulas further
 * up give them. Not measured, and why:
 *  - repeated-block compile (CDF_PLAN_REPEATED_BLOCKS): each block runs as a graph whose buffers
 *    share one arena placed by compile/memory_plan.c, which a measured eager forward does not
 *    model; the *_blocks_elems formulas give the arenas (CDF_PLAN_OTHER: nothing is known). */
static bool activations_measured(const plan_component *c, const cdf_plan_shape *sh) {
    const cdf_plan_model_kind k = c->info.kind;
    if (sh->repeated_blocks && (k == CDF_PLAN_FLUX || k == CDF_PLAN_FLUX2 || k == CDF_PLAN_SD3)) return false;
    return k != CDF_PLAN_OTHER;
}

/* Measure c's forward at shape sh (see above): fam[0] the peak outside single-stream blocks (or
 * the whole peak), fam[1] the peak while a single-stream block runs (0 when the model has none),
 * the split cdf_plan_activation_bytes_by_family makes. */
static cdf_status measure_activations(const char *sub, const plan_component *c, const plan_load *pl, bool flux_pipe,
                                      cdf_dtype wdt, const cdf_plan_shape *sh, const cdf_generate_params *gp, uint64_t fam[2]) {
    cdf_load_options opt = cdf_load_options_default();
    opt.device = cdf_device_default();
    if (!opt.device) return cdf_last_status();
    opt.weight_dtype = wdt;
    opt.shapes_only = true;
    opt.decode_quantized = true; /* activations do not depend on how a weight is stored */
    for (int k = 0; pl && k < pl->n_files; k++)
        if (strcmp(pl->file_key[k], c->key) == 0) opt.weights_file = pl->file_path[k], opt.weights_part = cdf_pipe_text_part(c->key, flux_pipe);
    cdf_component *comp = NULL;
    /* loading runs in a measurement too: a loader's ops (casts, concatenations) must not run on
     * weights without memory; its log is dropped */
    cdf_mem_event *log = NULL;
    size_t n = 0;
    CDF_TRY(cdf_measure_begin());
    cdf_status s = cdf_component_load(sub, &opt, &comp);
    cdf_status e = cdf_measure_end(&log, &n);
    free(log);
    log = NULL;
    if (s == CDF_OK) s = e;
    if (s != CDF_OK) {
        cdf_component_free(comp);
        return cdf_error_prefix("planner: measuring %s (%s): ", c->key, c->class_name);
    }
    cdf_tensor_map in, out;
    cdf_tensor_map_init(&in);
    cdf_tensor_map_init(&out);
    const char *method = "forward";
    cdf_scope_push();
    s = measured_inputs(c, cdf_component_config(comp), sh, opt.device, gp, &in, &method);
    if (s == CDF_OK && (s = cdf_measure_begin()) == CDF_OK) {
        if (pl && pl->xla_cpu) cdf_measure_set_scratch(xla_cpu_scratch, NULL);
        cdf_scope_push();
        s = cdf_component_run(comp, method, &in, &out);
        cdf_tensor_map_clear(&out);
        cdf_scope_pop(NULL, 0);
        e = cdf_measure_end(&log, &n);
        if (s == CDF_OK) s = e;
    }
    cdf_tensor_map_clear(&in);
    cdf_scope_pop(NULL, 0);
    cdf_component_free(comp);
    uint64_t peak = 0, tags[CDF_MEM_TAGS] = {0};
    if (s == CDF_OK) s = cdf_memory_peak(log, n, &peak, NULL, tags);
    free(log);
    if (s != CDF_OK) return cdf_error_prefix("planner: measuring %s (%s): ", c->key, c->class_name);
    /* tags (compile.c cdf_block_run): 0 outside blocks, 1 double-stream blocks, 2 single-stream */
    const uint64_t outside = tags[0];
    fam[0] = tags[1] > outside ? tags[1] : outside;
    fam[1] = tags[2] ? (tags[2] > outside ? tags[2] : outside) : 0;
    if (!tags[1] && !tags[2]) fam[0] = peak;
    return CDF_OK;
}

cdf_status cdf_plan_measure_activation_bytes(const char *dir, cdf_dtype weight_dtype, const cdf_plan_shape *s, uint64_t out[2]) {
    out[0] = out[1] = 0;
    plan_component c = {.key = "component"};
    cJSON *cfg = NULL;
    CDF_TRY(cdf_config_load(dir, &cfg));
    const char *cls = cdf_config_class_name(cfg);
    snprintf(c.class_name, sizeof c.class_name, "%s", cls ? cls : "?");
    cdf_status st = cdf_plan_model_info_from_config(c.class_name, cfg, &c.info);
    cJSON_Delete(cfg);
    CDF_TRY(st);
    c.info.weight_dtype = weight_dtype;
    if (!activations_measured(&c, s)) {
        cdf_plan_activation_bytes_by_family(&c.info, s, out);
        return CDF_OK;
    }
    const cdf_generate_params gp = cdf_generate_params_default();
    return measure_activations(dir, &c, NULL, false, weight_dtype, s, &gp, out);
}

cdf_status cdf_pipe_check_budget(cdf_pipeline *p, const cJSON *idx) {
    cdf_memory_stats st;
    cdf_device_memory_stats(p->device, &st);
    if (!st.limit_bytes) return CDF_OK;
    plan_pipeline pp;
    plan_load pl = {.n_files = p->n_files, .quantize_to = p->opt.quantize_to, .decode_quantized = p->opt.decode_quantized};
    for (int i = 0; i < p->n_files && i < 8; i++) pl.file_key[i] = p->file_key[i], pl.file_path[i] = p->file_path[i];
    if (plan_collect(p->dir, idx, p->opt.weight_dtype, &pl, &pp) != CDF_OK) {
        /* a broken folder: let the loaders report it in their own words */
        cdf_clear_error();
        return CDF_OK;
    }
    uint64_t total = 0, largest = 0, largest_seq = 0;
    int li = 0, lsi = 0;
    char list[1024] = "", b1[32], b2[32], b3[32], b4[32], b5[32], type[32];
    for (int i = 0; i < pp.n; i++) {
        total += pp.c[i].weights;
        if (pp.c[i].weights > largest) largest = pp.c[i].weights, li = i;
        const uint64_t sq = running_weights(&pp.c[i], CDF_OFFLOAD_SEQUENTIAL, -1);
        if (sq > largest_seq) largest_seq = sq, lsi = i;
        cdf_plan_format_bytes(b1, sizeof b1, pp.c[i].weights);
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s %s", i ? ", " : "", pp.c[i].key, b1);
    }
    device_type_upper(p->device, type, sizeof type);
    const uint64_t avail = st.limit_bytes > st.current_bytes ? st.limit_bytes - st.current_bytes : 0;
    char used[96] = "";
    if (st.current_bytes) {
        cdf_plan_format_bytes(b4, sizeof b4, st.current_bytes);
        snprintf(used, sizeof used, ", of which %s is already in use", b4);
    }
    cdf_plan_format_bytes(b2, sizeof b2, st.limit_bytes);
    cdf_plan_format_bytes(b3, sizeof b3, largest);
    /* worded like the allocator's own out-of-memory error ("... budget"), which it replaces */
    if (p->offload == CDF_OFFLOAD_NONE && total > avail) {
        cdf_plan_format_bytes(b1, sizeof b1, total);
        return cdf_error(CDF_ERR_OUT_OF_MEMORY,
                         "%s: out of memory with --offload none (every model resident): the weights need %s (%s) but "
                         "%s has a %s budget%s (CDIFFUSERS_%s_MEMORY_LIMIT / --device-memory); use --offload model, which "
                         "keeps one model at a time (the largest, %s, needs %s plus activations; see cdiffusers plan)",
                         p->dir, b1, list, cdf_device_name(p->device), b2, used, type, pp.c[li].key, b3);
    }
    cdf_plan_format_bytes(b5, sizeof b5, largest_seq);
    char seq_hint[256] = "";
    if (largest_seq < largest && largest_seq <= avail)
        snprintf(seq_hint, sizeof seq_hint, "; use --offload sequential, which also keeps the transformer's blocks "
                 "host-side (then the largest, %s, needs %s plus activations)", pp.c[lsi].key, b5);
    if (p->offload == CDF_OFFLOAD_MODEL && largest > avail)
        return cdf_error(CDF_ERR_OUT_OF_MEMORY,
                         "%s: out of memory even with --offload model: the largest model, %s, needs %s but %s has a %s "
                         "budget%s (CDIFFUSERS_%s_MEMORY_LIMIT / --device-memory)%s",
                         p->dir, pp.c[li].key, b3, cdf_device_name(p->device), b2, used, type,
                         seq_hint[0] ? seq_hint : "; a smaller weight dtype (--dtype bf16) or a larger budget is needed");
    if (p->offload == CDF_OFFLOAD_SEQUENTIAL && largest_seq > avail)
        return cdf_error(CDF_ERR_OUT_OF_MEMORY,
                         "%s: out of memory even with --offload sequential: %s needs %s%s but %s has a %s budget%s "
                         "(CDIFFUSERS_%s_MEMORY_LIMIT / --device-memory); a smaller weight dtype (--dtype bf16) or a larger "
                         "budget is needed",
                         p->dir, pp.c[lsi].key, b5,
                         strcmp(pp.c[lsi].key, "transformer") == 0 ? " (its other weights plus its largest block)" : "",
                         cdf_device_name(p->device), b2, used, type);
    return CDF_OK;
}

/* Tensors the pipeline holds (its generate scope keeps every intermediate it made) besides the
 * running forward's own inputs, which the activation formulas leave out. One prompt-encoding
 * pass leaves: FLUX the T5 sequence and the pooled CLIP vector; SD3 both CLIP sequences (the
 * penultimate hidden states and their concatenation), the T5 sequence, the zero-padded CLIP part
 * and the joint sequence, plus, with CFG, the two passes concatenated. */
typedef struct plan_held {
    double pass_text;  /* what one encoding pass leaves */
    double clip_pass;  /* the CLIP part of it (held while T5 runs in the same pass) */
    double after_text; /* everything left after the text phase */
} plan_held;

static plan_held held_text(const plan_pipeline *pp, int64_t L, int passes, bool sd3_cfg) {
    double clip = 0, dj = 0, pooled = 0;
    for (int i = 0; i < pp->n; i++) {
        const cdf_plan_model_info *m = &pp->c[i].info;
        if (m->kind == CDF_PLAN_CLIP) clip += (double)m->width, pooled += (double)m->width;
        if (m->kind == CDF_PLAN_T5) dj = (double)m->width;
        if (m->kind == CDF_PLAN_FLUX2) dj = (double)m->joint_dim; /* the stacked text-encoder layers */
    }
    plan_held h = {0};
    if (pp->kind == PK_SD3) {
        h.clip_pass = 2.0 * 77 * clip + pooled;
        h.pass_text = h.clip_pass + 2.0 * (77 + L) * dj;
        h.after_text = passes * h.pass_text + (sd3_cfg ? 2.0 * (77 + L) * dj + 2 * pooled : 0);
    } else {
        h.clip_pass = pooled;
        h.pass_text = pooled + (double)L * dj + 3.0 * L;
        h.after_text = passes * h.pass_text;
    }
    return h;
}

cdf_status cdf_pipeline_plan_memory(const char *dir, const cdf_pipeline_load_params *lp, const cdf_generate_params *gp,
                                    cdf_memory_plan *out) {
    return cdf_pipeline_plan_memory_exec(dir, lp, gp, CDF_PLAN_EAGER, out);
}

cdf_status cdf_pipeline_plan_memory_exec(const char *dir, const cdf_pipeline_load_params *lp, const cdf_generate_params *gp,
                                         cdf_plan_execution exec, cdf_memory_plan *out) {
    return cdf_pipeline_plan_memory_budget(dir, lp, gp, exec, 0, out);
}

bool cdf_plan_prefetch_enabled(bool host_memory) {
    const char *e = getenv("CDIFFUSERS_OFFLOAD_PREFETCH");
    if (e && strcmp(e, "0") == 0) return false;
    if (e && strcmp(e, "1") == 0) return true;
    return !host_memory;
}

cdf_status cdf_pipeline_plan_memory_budget(const char *dir, const cdf_pipeline_load_params *lp_in, const cdf_generate_params *gp_in,
                                           cdf_plan_execution exec, uint64_t budget, cdf_memory_plan *out) {
    if (!out) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_pipeline_plan_memory: out is NULL");
    memset(out, 0, sizeof *out);
    if (exec != CDF_PLAN_EAGER && exec != CDF_PLAN_REPEATED_BLOCKS)
        return cdf_error(CDF_ERR_INVALID_ARG, "cdf_pipeline_plan_memory: unknown execution %d", (int)exec);
    if (!dir) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_pipeline_plan_memory: folder is NULL");
    cdf_pipeline_load_params lp = lp_in ? *lp_in : cdf_pipeline_load_params_default();
    struct stat fst;
    if (stat(dir, &fst) == 0 && S_ISREG(fst.st_mode)) { /* one all-in-one file: its configs' folder, the file as every component */
        cdf_pipe_single_file *sf = calloc(1, sizeof *sf);
        if (!sf) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
        cdf_pipeline_load_params fl;
        cdf_status s = cdf_pipe_single_file_params(dir, &lp, sf, &fl);
        if (s == CDF_OK) s = cdf_pipeline_plan_memory_budget(sf->config_dir, &fl, gp_in, exec, budget, out);
        free(sf);
        return s;
    }
    cdf_generate_params gp = gp_in ? *gp_in : cdf_generate_params_default();
    char path[4096];
    snprintf(path, sizeof path, "%s/model_index.json", dir);
    cJSON *idx = NULL;
    CDF_TRY(cdf_json_load_file(path, &idx));
    plan_pipeline pp;
    plan_load pl = {.quantize_to = lp.quantize_weights, .decode_quantized = lp.decode_quantized};
    for (int i = 0; i < lp.num_component_files && i < 8 && lp.component_files; i++)
        pl.file_key[pl.n_files] = lp.component_files[i].component, pl.file_path[pl.n_files++] = lp.component_files[i].path;
    plan_target(lp.device, &pl);
    cdf_status s = plan_collect(dir, idx, lp.weight_dtype, &pl, &pp);
    cJSON_Delete(idx);
    CDF_TRY(s);

    /* the request, resolved as cdf_pipeline_resolve_defaults does */
    const plan_component *tr = NULL, *vae = NULL;
    for (int i = 0; i < pp.n; i++) {
        if (strcmp(pp.c[i].key, "transformer") == 0) tr = &pp.c[i];
        if (strcmp(pp.c[i].key, "vae") == 0) vae = &pp.c[i];
    }
    if (!tr || !vae) return cdf_error(CDF_ERR_FORMAT, "%s/model_index.json: the pipeline needs a transformer and a vae", dir);
    const int vsf = vae->info.vae_scale_factor > 0 ? vae->info.vae_scale_factor : 8;
    int64_t sample = 128;
    if (pp.kind == PK_SD3) {
        char sub[4096];
        snprintf(sub, sizeof sub, "%s/transformer", dir);
        cJSON *tcfg = NULL;
        if (cdf_config_load(sub, &tcfg) == CDF_OK) {
            sample = geti(tcfg, "sample_size", 128);
            cJSON_Delete(tcfg);
        }
    }
    if (gp.height <= 0) gp.height = (int)(sample * vsf);
    if (gp.width <= 0) gp.width = (int)(sample * vsf);
    if (gp.max_sequence_length <= 0) gp.max_sequence_length = pp.kind == PK_SD3 ? 256 : 512;
    if (gp.guidance_scale < 0) gp.guidance_scale = pp.kind == PK_FLUX ? 3.5 : pp.kind == PK_FLUX2 ? 4.0 : 7.0;
    if (gp.true_cfg_scale <= 0) gp.true_cfg_scale = 1.0;
    if (gp.height <= 0 || gp.width <= 0 || gp.height % (2 * vsf) || gp.width % (2 * vsf))
        return cdf_error(CDF_ERR_INVALID_ARG, "height and width must be positive multiples of %d (got %dx%d)", 2 * vsf, gp.height,
                         gp.width);
    const int64_t L = gp.max_sequence_length;
    const bool sd3_cfg = pp.kind == PK_SD3 && gp.guidance_scale > 1.0;
    const bool flux_true_cfg = pp.kind == PK_FLUX && gp.true_cfg_scale > 1.0 && gp.negative_prompt;
    const int passes = (sd3_cfg || flux_true_cfg) ? 2 : 1;
    const int64_t B = sd3_cfg ? 2 : 1;
    const int64_t lh = gp.height / vsf, lw = gp.width / vsf; /* VAE latent */

    snprintf(out->pipeline_class, sizeof out->pipeline_class, "%s", pp.class_name);
    out->height = gp.height;
    out->width = gp.width;
    out->max_sequence_length = gp.max_sequence_length;
    out->batch = (int)B;
    out->offload = lp.offload;
    out->weight_dtype = lp.weight_dtype;
    out->execution = exec;
    out->n_components = pp.n;

    /* every model's largest forward in this request (per block family: see running_weights) */
    uint64_t fam_act[CDF_PLAN_MAX_COMPONENTS][2];
    for (int i = 0; i < pp.n; i++) {
        const plan_component *c = &pp.c[i];
        cdf_plan_shape sh = {.batch = 1, .repeated_blocks = exec == CDF_PLAN_REPEATED_BLOCKS};
        switch (c->info.kind) {
        case CDF_PLAN_CLIP: sh.text_tokens = 77; break;
        case CDF_PLAN_T5:
        case CDF_PLAN_MISTRAL: sh.text_tokens = L; break;
        case CDF_PLAN_FLUX:
        case CDF_PLAN_FLUX2:
        case CDF_PLAN_SD3:
            sh.batch = B;
            sh.text_tokens = c->info.kind == CDF_PLAN_SD3 ? 77 + L : L;
            sh.latent_h = pp.kind != PK_SD3 ? 2 * (gp.height / (2 * vsf)) : lh;
            sh.latent_w = pp.kind != PK_SD3 ? 2 * (gp.width / (2 * vsf)) : lw;
            break;
        case CDF_PLAN_VAE:
            sh.latent_h = lh;
            sh.latent_w = lw;
            /* tiling on (AUTO plans the untiled decode: it tiles only when that does not fit) */
            if (gp.vae_tiling == CDF_VAE_TILING_ON)
                sh.vae_tile_latent = (gp.vae_tile_size > 0 ? gp.vae_tile_size : c->info.sample_size) / vsf;
            break;
        case CDF_PLAN_OTHER: break;
        }
        snprintf(out->component[i].name, sizeof out->component[i].name, "%s", c->key);
        snprintf(out->component[i].class_name, sizeof out->component[i].class_name, "%s", c->class_name);
        out->component[i].weights_bytes = c->weights;
        char sub[4096];
        snprintf(sub, sizeof sub, "%s/%s", dir, c->key);
        if (activations_measured(c, &sh))
            CDF_TRY(measure_activations(sub, c, &pl, pp.kind == PK_FLUX, lp.weight_dtype, &sh, &gp, fam_act[i]));
        else
            cdf_plan_activation_bytes_by_family(&c->info, &sh, fam_act[i]);
        out->component[i].activation_bytes = fam_act[i][0] > fam_act[i][1] ? fam_act[i][0] : fam_act[i][1];
        out->component[i].activation_known = c->info.kind != CDF_PLAN_OTHER;
        out->total_weights_bytes += c->weights;
        if (c->weights > out->largest_weights_bytes) out->largest_weights_bytes = c->weights;
        if (c == tr) {
            out->n_blocks = c->blocks.n_blocks;
            out->blocks_weights_bytes = c->blocks.blocks_bytes;
            out->largest_block_bytes = c->blocks.largest_block_bytes;
        }
    }

    /* what the pipeline itself holds in each phase */
    const double in_ch = (double)tr->info.in_channels;
    const double latent = (double)lh * lw * (pp.kind != PK_SD3 ? in_ch / 4 : in_ch);
    const plan_held ht = held_text(&pp, L, passes, sd3_cfg);
    double held[CDF_PHASE_COUNT];
    held[CDF_PHASE_TEXT] = (passes - 1) * ht.pass_text + ht.clip_pass;
    /* + noise, latents, the step's (CFG-doubled) input, its output and the updated latents */
    held[CDF_PHASE_DENOISE] = ht.after_text + latent * (4 + 2 * B);
    /* + the final latents and the scaled decoder input */
    held[CDF_PHASE_DECODE] = ht.after_text + latent * 4;
    /* Step caches (step_cache.c). First Block Cache: per pass the previous head residual and the tail residual
     * ([1, tokens, width] f32 each) for the whole loop; during a computed step also the new head
     * residual, the head output the tail residual is taken from and the new tail residual */
    cdf_step_cache_config cache;
    CDF_TRY(cdf_step_cache_parse(gp.cache, &cache));
    out->cache_bytes = 0;
    if (cache.kind == CDF_STEP_CACHE_TAYLORSEER && cache.use_lite_mode && pp.kind == PK_FLUX) {
        /* TaylorSeer's lite mode: per pass (max_order + 1) factors of the transformer's output
         * (tokens x in_channels) in taylor_factors_dtype; during a step the float32 prediction */
        const double tokens = (double)(gp.height / (2 * vsf)) * (gp.width / (2 * vsf)), per = tokens * in_ch;
        out->cache_bytes = (uint64_t)(passes * (cache.max_order + 1) * per * cdf_dtype_size(cache.taylor_factors_dtype));
        held[CDF_PHASE_DENOISE] += (double)out->cache_bytes / 4.0 + per;
    } else if (cache.kind == CDF_STEP_CACHE_TAYLORSEER && pp.kind == PK_FLUX) {
        /* TaylorSeer: per pass and attention module (max_order + 1) factors of its outputs (the
         * joint sequence, tokens + text, x width) in taylor_factors_dtype; during a step the
         * float32 outputs (computed or predicted) of every module are live too */
        const double joint = (double)(gp.height / (2 * vsf)) * (gp.width / (2 * vsf)) + (double)L;
        const double per_module = joint * (double)tr->info.width, modules = (double)(tr->info.layers + tr->info.single_layers);
        out->cache_bytes = (uint64_t)(passes * modules * (cache.max_order + 1) * per_module * cdf_dtype_size(cache.taylor_factors_dtype));
        held[CDF_PHASE_DENOISE] += (double)out->cache_bytes / 4.0 + modules * per_module;
    } else if ((cache.kind != CDF_STEP_CACHE_NONE && pp.kind == PK_FLUX) || (cache.kind == CDF_STEP_CACHE_MAG && pp.kind == PK_FLUX2)) {
        /* MagCache: per pass one residual (tail output - embedded latents); during a computed
         * step also the embedded latents and the new residual */
        const double tokens = (double)(gp.height / (2 * vsf)) * (gp.width / (2 * vsf)), kept = cache.kind == CDF_STEP_CACHE_MAG ? 1 : 2;
        out->cache_bytes = (uint64_t)(kept * passes * tokens * (double)tr->info.width * 4.0);
        held[CDF_PHASE_DENOISE] += (kept * passes + (kept == 1 ? 2.0 : 3.0)) * tokens * (double)tr->info.width;
    }

    for (int ph = 0; ph < CDF_PHASE_COUNT; ph++) {
        uint64_t best_w = 0, best_a = 0;
        for (int i = 0; i < pp.n; i++) {
            const plan_component *c = &pp.c[i];
            const int cph = c == tr ? CDF_PHASE_DENOISE : c == vae ? CDF_PHASE_DECODE : CDF_PHASE_TEXT;
            if (cph != ph) continue;
            for (int f = 0; f < 2; f++) {
                if (f == 1 && !fam_act[i][1]) continue; /* no second block family */
                const uint64_t w = lp.offload == CDF_OFFLOAD_NONE ? out->total_weights_bytes : running_weights(c, lp.offload, f);
                const uint64_t a = fam_act[i][f] + (uint64_t)(held[ph] * 4.0);
                if (w + a > best_w + best_a) best_w = w, best_a = a;
            }
        }
        out->phase[ph].weights_bytes = best_w;
        out->phase[ph].activation_bytes = best_a;
        out->phase[ph].peak_bytes = best_w + best_a;
        if (out->phase[ph].peak_bytes > out->need_bytes) out->need_bytes = out->phase[ph].peak_bytes;
    }

    /* Offload's prefetch (offload.c): at a phase change the next phase's model is materialised
     * before the previous model's queued work has finished, so its weights (those it puts on the
     * device: with SEQUENTIAL the transformer's non-block ones) can meet the last forward of the
     * ending phase at that forward's peak: the ending phase's last model (the last text encoder
     * that runs, T5 or FLUX.2's Mistral; the transformer) plus its activations and the held
     * tensors, plus the next model. Only the last model of the phase counts: an earlier text
     * encoder has finished (and been released) before the last one runs. Counted at the peak
     * rather than at what the queue still holds when the host gets there (timing): generate
     * prefetches only when this fits, so the prefetch never stalls on the allocator nor fails. */
    out->budget_bytes = budget;
    const bool prefetch_on = lp.offload != CDF_OFFLOAD_NONE && cdf_plan_prefetch_enabled(pl.host_memory);
    for (int ph = 0; ph + 1 < CDF_PHASE_COUNT && lp.offload != CDF_OFFLOAD_NONE; ph++) {
        const plan_component *last = NULL, *next = NULL;
        int li = -1;
        for (int i = 0; i < pp.n; i++) {
            const plan_component *c = &pp.c[i];
            const int cph = c == tr ? CDF_PHASE_DENOISE : c == vae ? CDF_PHASE_DECODE : CDF_PHASE_TEXT;
            if (cph == ph) last = c, li = i; /* pp.c is in the order the pipelines run them */
            if (cph == ph + 1 && !next) next = c;
        }
        if (!last || !next) continue;
        uint64_t w = 0, a = 0;
        for (int f = 0; f < 2; f++) {
            if (f == 1 && !fam_act[li][1]) continue;
            const uint64_t fw = running_weights(last, lp.offload, f), fa = fam_act[li][f] + (uint64_t)(held[ph] * 4.0);
            if (fw + fa > w + a) w = fw, a = fa;
        }
        /* what materialising `next` puts on the device (sequential: the transformer's blocks stay host-side) */
        const uint64_t wn = lp.offload == CDF_OFFLOAD_SEQUENTIAL && next == tr && next->blocks.n_blocks > 0
                                ? next->weights - next->blocks.blocks_bytes
                                : next->weights;
        /* by the time the host reaches the next model's hook the pipeline has also made what
         * the next phase starts with (the prompt embeddings joined, the latents and the first
         * step's input: held[ph + 1] bounds it; the VAE's prefetch starts within the last step,
         * held[ph]) while the last forward's own activations may be gone: the last model's
         * weights carry either */
        const double hs = held[ph] > held[ph + 1] ? held[ph] : held[ph + 1];
        const uint64_t at_switch = (uint64_t)(hs * 4.0);
        /* a values-kind device (pjrt) frees a buffer when the host releases it, not when the
         * program reading it has run: by the hook the last forward's activations are gone */
        const uint64_t over = w + (a > at_switch && !pl.values ? a : at_switch) + wn;
        out->phase[ph].prefetch_peak_bytes = over > out->phase[ph].peak_bytes ? over : out->phase[ph].peak_bytes;
        out->phase[ph].prefetch = prefetch_on && budget && out->phase[ph].prefetch_peak_bytes <= budget;
        if (out->phase[ph].prefetch && over > out->phase[ph].peak_bytes) {
            out->phase[ph].weights_bytes = w + wn;
            out->phase[ph].activation_bytes = over - w - wn;
            out->phase[ph].peak_bytes = over;
        }
    }
    for (int ph = 0; ph < CDF_PHASE_COUNT; ph++)
        if (out->phase[ph].peak_bytes > out->peak_bytes) out->peak_bytes = out->phase[ph].peak_bytes;
    return CDF_OK;
}
