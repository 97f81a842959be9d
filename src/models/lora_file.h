/* LoRA files: format detection and key names -> (component, module) of diffusers' models, as
 * diffusers' FluxLoraLoaderMixin / SD3LoraLoaderMixin.lora_state_dict and
 * loaders/lora_conversion_utils.py (_convert_kohya_flux_lora_to_diffusers) read them.
 *
 * Formats:
 *  - diffusers / PEFT (also what ai-toolkit writes): "<component>.<module>.lora_A.weight",
 *    ".lora_B.weight", network alphas "<component>.<module>.alpha" (scaling alpha / rank; rank
 *    = lora_B's columns; no alpha: scaling 1).
 *  - kohya / sd-scripts FLUX.1: "lora_unet_double_blocks_<i>_img_attn_qkv.lora_down.weight",
 *    ".lora_up.weight", ".alpha" (no alpha: alpha = rank). Fused projections split lora_up's
 *    rows over their targets (qkv -> to_q/to_k/to_v, single-block linear1 -> to_q/to_k/to_v/
 *    proj_mlp) with lora_down shared; ComfyUI's "diffusion_model.double_blocks.0..." spelling
 *    and kohya text-encoder keys "lora_te1_text_model_encoder_layers_<i>_..." (text_encoder).
 *  - XLabs (x-flux) FLUX.1: "double_blocks.<i>.processor.qkv_lora1.down.weight", ".up.weight",
 *    no alphas (detected, as diffusers does, by "processor" in a key of a non-kohya file):
 *    qkv_lora1/qkv_lora2 split over the image/text q, k, v, proj_lora1/2 the attention outputs,
 *    single blocks' qkv_lora -> q, k, v and proj_lora -> proj_out.
 * DoRA ("dora_scale", "lora_magnitude_vector") is refused, never dropped. */
#ifndef CDF_MODELS_LORA_FILE_H
#define CDF_MODELS_LORA_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cdiffusers/error.h"

#define CDF_LORA_NAME_MAX 256
#define CDF_LORA_MAX_TARGETS 4

/* ---- key names (pure string functions; fuzz/fuzz_lora_keys.c) ----------------------------- */
typedef enum cdf_lora_key_kind {
    CDF_LORA_KEY_OTHER = 0, /* not a LoRA tensor name */
    CDF_LORA_KEY_A,         /* lora_A / lora_down: [rank, in] */
    CDF_LORA_KEY_B,         /* lora_B / lora_up:   [out, rank] */
    CDF_LORA_KEY_ALPHA,     /* network alpha (scalar) */
    CDF_LORA_KEY_DORA,      /* DoRA magnitude (dora_scale / lora_magnitude_vector) */
} cdf_lora_key_kind;

/* Split a key into its module part (written to base, at most n bytes with the NUL) and kind.
 * *kohya is set for lora_down/lora_up spellings. Returns OTHER (base empty) if the key has no
 * LoRA suffix or the module part does not fit. */
cdf_lora_key_kind cdf_lora_key_split(const char *key, char *base, size_t n, bool *kohya);

/* A target: component ("transformer", "text_encoder") and module name in diffusers' naming. */
typedef struct cdf_lora_target {
    char component[32];
    int n;                                         /* modules: > 1 splits lora_B's rows */
    char module[CDF_LORA_MAX_TARGETS][CDF_LORA_NAME_MAX];
    bool swap_halves;  /* diffusers' swap_scale_shift of lora_B (kohya final_layer adaLN) */
    bool ignore_alpha; /* diffusers drops this key's alpha (kohya final_layer) */
} cdf_lora_target;

/* diffusers/PEFT module part "transformer.transformer_blocks.0.attn.to_q" -> target. false if it
 * names no component. */
bool cdf_lora_diffusers_target(const char *base, cdf_lora_target *t);
/* kohya module part ("lora_unet_double_blocks_0_img_attn_qkv", "lora_te1_text_model_..." or
 * ComfyUI's dotted "diffusion_model.double_blocks.0.img_attn.qkv") -> target. false if unknown. */
bool cdf_lora_kohya_target(const char *base, cdf_lora_target *t);

/* XLabs module part ("double_blocks.0.processor.qkv_lora1", "[diffusion_model.]single_blocks.
 * 3.processor.proj_lora") -> target. false if unknown. */
bool cdf_lora_xlabs_target(const char *base, cdf_lora_target *t);

/* FLUX.2 names as diffusers' Flux2LoraLoaderMixin converts them (lora_conversion_utils.py):
 * kohya "lora_unet_double_blocks_0_img_attn_qkv" (_convert_kohya_flux2_lora_to_diffusers:
 * double-block attention and MLPs, single-block linear1 -> the fused attn.to_qkv_mlp_proj, not
 * split, linear2 -> attn.to_out, img_in, txt_in, time_in, final_layer_linear; nothing else:
 * diffusers drops the rest with a warning, cdiffusers reports them unused) and ai-toolkit
 * "diffusion_model.double_blocks.0.img_attn.qkv" (_convert_non_diffusers_flux2_lora_to_diffusers:
 * the same plus guidance_in, final_layer.adaLN_modulation.1 (no swap), the shared modulations,
 * and diffusers block names passed through). false if unknown. */
bool cdf_lora_kohya_flux2_target(const char *base, cdf_lora_target *t);
bool cdf_lora_aitk_flux2_target(const char *base, cdf_lora_target *t);

/* ---- files ----------------------------------------------------------------------------------- */
typedef struct cdf_lora_entry {
    cdf_lora_target target;
    char source[CDF_LORA_NAME_MAX]; /* the file's module part, for messages */
    int64_t rank, in, out;
    float *a, *b; /* host f32 [rank, in], [out, rank] */
    float mult;   /* alpha / rank (1 without alpha) */
} cdf_lora_entry;

typedef struct cdf_lora_file {
    const char *format; /* "diffusers", "kohya", "XLabs", "ai-toolkit" */
    int n;
    cdf_lora_entry *e;
    int n_unused;       /* keys that are not (complete) LoRA pairs of a known module */
    char **unused;
} cdf_lora_file;

/* Read and validate a LoRA safetensors file: every lora_A has its lora_B and the ranks agree,
 * tensors are 2-D float (alphas scalar float), every value is finite. Errors name the file and
 * the key. Keys that map to no known module are listed in `unused` (the caller decides). */
typedef enum cdf_lora_family {
    CDF_LORA_FAMILY_DEFAULT = 0, /* FLUX.1 and SD3: diffusers/PEFT, kohya FLUX.1, XLabs */
    CDF_LORA_FAMILY_FLUX2,       /* Flux2Transformer2DModel: diffusers/PEFT, kohya and ai-toolkit FLUX.2 */
} cdf_lora_family;
cdf_status cdf_lora_file_load(const char *path, cdf_lora_family family, cdf_lora_file **out);
void cdf_lora_file_free(cdf_lora_file *f);

#endif
