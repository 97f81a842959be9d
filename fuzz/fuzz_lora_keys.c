/* Fuzz target: LoRA key names (models/lora_file.c). The input, split at newlines, is a list of
 * tensor names as a LoRA file's header would hold them; each goes through cdf_lora_key_split and
 * then the kohya, XLabs, FLUX.2 kohya / ai-toolkit and diffusers name mappings, as
 * cdf_lora_file_load does.
 *
 * Invariants: the module part is a NUL-terminated prefix of the key (kind OTHER gives ""), never
 * longer than the buffer; a mapped target has 1..CDF_LORA_MAX_TARGETS modules, each non-empty
 * and NUL-terminated within CDF_LORA_NAME_MAX, and a known component name; mapping is a pure
 * function (the same name maps the same way twice). */
#include <string.h>

#include "fuzz_common.h"
#include "models/lora_file.h"

static void write_seeds(const char *dir) {
    static const char *seeds[] = {
        "transformer.transformer_blocks.0.attn.to_q.lora_A.weight\ntransformer.transformer_blocks.0.attn.to_q.alpha",
        "lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight\nlora_unet_single_blocks_37_linear1.lora_up.weight",
        "lora_unet_final_layer_adaLN_modulation_1.lora_up.weight\nlora_te1_text_model_encoder_layers_11_mlp_fc2.alpha",
        "diffusion_model.double_blocks.3.txt_attn.qkv.lora_down.weight\ntext_encoders.clip_l.transformer.text_model."
        "encoder.layers.0.self_attn.q_proj.lora_up.weight",
        "transformer.x.dora_scale\n.alpha\nlora_unet_double_blocks__img_attn_qkv.alpha",
        "double_blocks.0.processor.qkv_lora1.down.weight\ndiffusion_model.single_blocks.9.processor.proj_lora.up.weight",
        "diffusion_model.double_blocks.1.txt_mlp.2.lora_A.weight\ndiffusion_model.sformer_blocks.0.attn.to_q.lora_B.weight\n"
        "diffusion_model.double_stream_modulation_img.lin.lora_A.weight\nlora_unet_single_blocks_7_linear1.lora_down.weight",
    };
    for (size_t i = 0; i < sizeof seeds / sizeof *seeds; i++) fz_seed(dir, 0, seeds[i], strlen(seeds[i]));
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fz_maybe_write_seeds(write_seeds);
    return 0;
}

static void check_target(const cdf_lora_target *t) {
    if (t->n < 1 || t->n > CDF_LORA_MAX_TARGETS) abort();
    if (!memchr(t->component, 0, sizeof t->component) || !t->component[0]) abort();
    for (int i = 0; i < t->n; i++)
        if (!memchr(t->module[i], 0, CDF_LORA_NAME_MAX) || !t->module[i][0]) abort();
}

static void one(const char *key) {
    char base[CDF_LORA_NAME_MAX];
    bool kohya;
    const cdf_lora_key_kind k = cdf_lora_key_split(key, base, sizeof base, &kohya);
    if (!memchr(base, 0, sizeof base)) abort();
    if (k == CDF_LORA_KEY_OTHER) {
        if (base[0]) abort();
        return;
    }
    if (strncmp(key, base, strlen(base)) != 0) abort();
    cdf_lora_target t1, t2;
    static bool (*const mappers[])(const char *, cdf_lora_target *) = {
        cdf_lora_kohya_target, cdf_lora_xlabs_target, cdf_lora_kohya_flux2_target, cdf_lora_aitk_flux2_target};
    for (size_t i = 0; i < sizeof mappers / sizeof *mappers; i++)
        if (mappers[i](base, &t1)) {
            check_target(&t1);
            if (!mappers[i](base, &t2) || memcmp(&t1, &t2, sizeof t1) != 0) abort();
        }
    if (cdf_lora_diffusers_target(base, &t1)) {
        check_target(&t1);
        if (t1.n != 1) abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *buf = malloc(size + 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    buf[size] = '\0';
    for (char *p = buf, *e; p; p = e ? e + 1 : NULL) {
        e = strchr(p, '\n');
        if (e) *e = '\0';
        one(p);
    }
    free(buf);
    return 0;
}
