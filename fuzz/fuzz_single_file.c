/* Fuzz target: a component file in place of a folder's weights (nn/weights_source.c): the input
 * is the file (GGUF when it starts with "GGUF", else safetensors), opened as a single-file
 * source; diffusers names of FLUX.1, FLUX.2 and SD3 transformers and of a VAE are looked up, converted (renames, qkv and
 * linear1 row splits from the shapes, swapped halves, dequantization, fp8 scales) and loaded.
 *
 * Invariants: a found tensor's shape has 1..8 non-negative dims whose product the load returns
 * (no read outside the file: ASan), a row split lies inside its source, a failed load says why,
 * and the unused-tensor list is well formed. */
#include "fuzz_common.h"
#include "nn/weights_source.h"

/* The diffusers names of a FLUX transformer with one double and one single block. */
static const char *const k_names[] = {
    "x_embedder.weight", "x_embedder.bias", "context_embedder.weight", "context_embedder.bias",
    "time_text_embed.timestep_embedder.linear_1.weight", "time_text_embed.guidance_embedder.linear_2.bias",
    "time_text_embed.text_embedder.linear_1.weight", "norm_out.linear.weight", "norm_out.linear.bias",
    "proj_out.weight", "proj_out.bias", "transformer_blocks.0.norm1.linear.weight",
    "transformer_blocks.0.attn.to_q.weight", "transformer_blocks.0.attn.to_k.bias",
    "transformer_blocks.0.attn.add_v_proj.weight", "transformer_blocks.0.attn.norm_q.weight",
    "transformer_blocks.0.attn.norm_added_k.weight", "transformer_blocks.0.ff.net.0.proj.weight",
    "transformer_blocks.0.attn.to_out.0.weight", "single_transformer_blocks.0.attn.to_q.weight",
    "single_transformer_blocks.0.attn.to_v.bias", "single_transformer_blocks.0.proj_mlp.weight",
    "single_transformer_blocks.0.proj_mlp.bias", "single_transformer_blocks.0.proj_out.weight",
    "single_transformer_blocks.0.norm.linear.weight", "single_transformer_blocks.0.attn.norm_k.weight",
    "lin.weight", "other.weight", "text_projection.weight", "text_model.embeddings.position_embedding.weight",
    "shared.weight", "encoder.block.0.layer.0.SelfAttention.q.weight",
    /* SD3 names that differ from FLUX's conversions */
    "pos_embed.pos_embed", "pos_embed.proj.weight", "transformer_blocks.0.attn2.to_k.weight",
    "transformer_blocks.0.attn2.norm_q.weight", "transformer_blocks.0.norm1_context.linear.weight",
    "transformer_blocks.1.norm1_context.linear.bias", "transformer_blocks.0.ff_context.net.2.weight",
    /* FLUX.2 names */
    "time_guidance_embed.timestep_embedder.linear_1.weight", "double_stream_modulation_img.linear.weight",
    "single_stream_modulation.linear.weight", "transformer_blocks.0.ff.linear_in.weight",
    "transformer_blocks.0.ff_context.linear_out.weight", "single_transformer_blocks.0.attn.to_qkv_mlp_proj.weight",
    "single_transformer_blocks.0.attn.to_out.weight",
    /* LDM VAE names */
    "encoder.conv_in.weight", "encoder.conv_norm_out.bias", "encoder.down_blocks.0.resnets.0.conv1.weight",
    "encoder.down_blocks.0.downsamplers.0.conv.weight", "encoder.mid_block.resnets.1.norm2.bias",
    "encoder.mid_block.attentions.0.to_q.weight", "decoder.mid_block.attentions.0.to_out.0.weight",
    "decoder.up_blocks.0.resnets.1.conv_shortcut.weight", "decoder.up_blocks.1.upsamplers.0.conv.bias",
    /* the FLUX.2 VAE's: quant convs (inside the encoder / decoder in BFL's file), BatchNorm statistics */
    "quant_conv.weight", "post_quant_conv.bias", "bn.running_mean", "bn.running_var",
};

/* Saves a writer's file as one seed and frees the writer. */
static void seed_writer(const char *dir, cdf_st_writer *w) {
    const char *p = fz_join(fz_tmp(), "seed.safetensors");
    if (cdf_st_writer_save(w, p) != CDF_OK) abort();
    cdf_st_writer_free(w);
    size_t n = 0;
    uint8_t *d = fz_read(p, &n);
    fz_seed(dir, -1, d, n);
    free(d);
}

/* A seed tensor: name, rank, first two dims (a third dim, if any, is 4). */
typedef struct seed_tensor {
    const char *name;
    int ndim;
    int64_t s0, s1;
} seed_tensor;

/* One seed file of the n tensors (f32 zeros), plus `pad` one-element tensors "x0".. (a different
 * file length, which the fuzzer maps to a different component part). */
static void seed_table(const char *dir, const seed_tensor *t, size_t n, int pad) {
    static float v[256];
    cdf_st_writer *w = cdf_st_writer_new();
    for (size_t i = 0; i < n; i++) {
        int64_t shape[3] = {t[i].s0, t[i].s1, 4};
        cdf_st_writer_add(w, t[i].name, CDF_F32, t[i].ndim, shape, v);
    }
    for (int k = 0; k < pad; k++) {
        char name[32];
        snprintf(name, sizeof name, "x%d", k);
        cdf_st_writer_add(w, name, CDF_F32, 1, (int64_t[]){1}, v);
    }
    seed_writer(dir, w);
}

static void write_seeds(const char *dir) {
    fz_seed_file(dir, -1, "formats/fp8_scaled/model.safetensors", 1 << 16);
    /* a small SD3 file: two joint blocks, the last with (shift, scale) context modulation */
    static const seed_tensor sd3[] = {
        {"joint_blocks.0.context_block.adaLN_modulation.1.bias", 1, 24, 0},
        {"joint_blocks.0.context_block.adaLN_modulation.1.weight", 2, 24, 4},
        {"joint_blocks.1.context_block.adaLN_modulation.1.bias", 1, 8, 0},
        {"joint_blocks.1.context_block.adaLN_modulation.1.weight", 2, 8, 4},
        {"joint_blocks.0.x_block.attn2.qkv.weight", 2, 12, 4},
        {"joint_blocks.0.x_block.attn2.ln_q.weight", 1, 2, 0},
        {"joint_blocks.0.context_block.mlp.fc2.weight", 2, 4, 8},
        {"pos_embed", 3, 1, 16},
        {"x_embedder.proj.weight", 2, 4, 4},
    };
    seed_table(dir, sd3, sizeof sd3 / sizeof *sd3, 0);
    /* an all-in-one file's text encoders: CLIP-L (width 8, with its own projection and
     * logit_scale), CLIP-G, T5 with both copies of its token table; seeds of every length
     * modulo 4 open it for each part */
    static const seed_tensor te[] = {
        {"text_encoders.clip_l.transformer.text_model.embeddings.position_embedding.weight", 2, 4, 8},
        {"text_encoders.clip_l.transformer.text_projection.weight", 2, 8, 8},
        {"text_encoders.clip_l.transformer.logit_scale", 1, 1, 0},
        {"text_encoders.clip_g.transformer.text_model.embeddings.position_embedding.weight", 2, 4, 12},
        {"text_encoders.clip_g.transformer.text_projection.weight", 2, 12, 12},
        {"text_encoders.t5xxl.transformer.shared.weight", 2, 6, 4},
        {"text_encoders.t5xxl.transformer.encoder.embed_tokens.weight", 2, 6, 4},
        {"text_encoders.t5xxl.transformer.encoder.block.0.layer.0.SelfAttention.q.weight", 2, 4, 4},
        {"model.diffusion_model.img_in.weight", 2, 4, 4},
    };
    for (int pad = 0; pad < 4; pad++) seed_table(dir, te, sizeof te / sizeof *te, pad);
    fz_seed_file(dir, -1, "formats/tiny_v3.gguf", 1 << 16);
    fz_seed_file(dir, -1, "formats/flux_single/ae_ldm.safetensors", 1 << 19); /* the tiny LDM VAE */
    fz_seed_file(dir, -1, "formats/flux2_single/flux2_bfl_q8.gguf", 1 << 19);  /* the tiny FLUX.2, Q8_0/Q4_0/Q5_1 */
    fz_seed_file(dir, -1, "formats/flux2_single/ae_flux2.safetensors", 1 << 19); /* the tiny FLUX.2 VAE, BFL names */
    /* a small BFL FLUX.2 file: inner 4, no biases */
    static const seed_tensor f2[] = {
        {"single_stream_modulation.lin.weight", 2, 12, 4},       {"double_stream_modulation_img.lin.weight", 2, 24, 4},
        {"double_blocks.0.img_attn.norm.key_norm.scale", 1, 2, 0}, {"double_blocks.0.img_attn.qkv.weight", 2, 12, 4},
        {"double_blocks.0.txt_mlp.2.weight", 2, 4, 8},           {"single_blocks.0.linear1.weight", 2, 28, 4},
        {"single_blocks.0.linear2.weight", 2, 4, 12},            {"final_layer.adaLN_modulation.1.weight", 2, 8, 4},
        {"time_in.in_layer.weight", 2, 4, 8},
    };
    seed_table(dir, f2, sizeof f2 / sizeof *f2, 0);
    /* a small BFL FLUX file: inner 4, mlp 8 */
    static const seed_tensor t[] = {
        {"double_blocks.0.img_attn.norm.key_norm.scale", 1, 2, 0}, {"double_blocks.0.img_attn.norm.query_norm.scale", 1, 2, 0},
        {"double_blocks.0.img_attn.qkv.weight", 2, 12, 4},       {"double_blocks.0.img_attn.qkv.bias", 1, 12, 0},
        {"double_blocks.0.txt_attn.qkv.weight", 2, 12, 4},       {"double_blocks.0.img_mod.lin.weight", 2, 24, 4},
        {"double_blocks.0.img_mlp.0.weight", 2, 8, 4},           {"double_blocks.0.img_attn.proj.weight", 2, 4, 4},
        {"single_blocks.0.linear1.weight", 2, 20, 4},            {"single_blocks.0.linear1.bias", 1, 20, 0},
        {"single_blocks.0.linear2.weight", 2, 4, 12},            {"single_blocks.0.modulation.lin.weight", 2, 12, 4},
        {"final_layer.adaLN_modulation.1.weight", 2, 8, 4},      {"final_layer.adaLN_modulation.1.bias", 1, 8, 0},
        {"final_layer.linear.weight", 2, 4, 4},                  {"img_in.weight", 2, 4, 4},
        {"txt_in.weight", 2, 4, 3},                              {"time_in.in_layer.weight", 2, 4, 8},
    };
    for (int prefixed = 0; prefixed < 2; prefixed++) {
        cdf_st_writer *w = cdf_st_writer_new();
        static float v[128];
        for (int i = 0; i < 128; i++) v[i] = (float)i * 0.25f - 3;
        for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
            char name[160];
            snprintf(name, sizeof name, "%s%s", prefixed ? "model.diffusion_model." : "", t[i].name);
            int64_t shape[2] = {t[i].s0, t[i].s1};
            cdf_st_writer_add(w, name, i % 3 == 2 ? CDF_BF16 : CDF_F32, t[i].ndim, shape, v);
        }
        seed_writer(dir, w);
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fz_maybe_write_seeds(write_seeds);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    bool gguf = size >= 4 && memcmp(data, "GGUF", 4) == 0;
    const char *path = fz_join(fz_tmp(), gguf ? "in.gguf" : "in.safetensors");
    fz_write(path, data, size);
    cdf_wsrc *s = NULL;
    /* the text encoder part of an all-in-one file, chosen by the input's length */
    static const char *const parts[] = {NULL, "clip_l", "clip_g", "t5xxl"};
    if (FZ_TRY(cdf_wsrc_open(path, true, parts[size % 4], &s)) != CDF_OK) {
        FZ_CHECK(s == NULL);
        FZ_CHECK_MESSAGE();
        return 0;
    }
    FZ_CHECK(cdf_wsrc_format(s)[0]);
    for (size_t i = 0; i < sizeof k_names / sizeof *k_names; i++) {
        cdf_wsrc_tensor t;
        if (!cdf_wsrc_find(s, k_names[i], &t)) continue;
        FZ_CHECK(t.ndim >= 0 && t.ndim <= CDF_ST_MAX_DIMS);
        unsigned __int128 numel = 1;
        for (int d = 0; d < t.ndim; d++) {
            FZ_CHECK(t.shape[d] >= 0);
            numel *= (uint64_t)t.shape[d];
        }
        if (numel * cdf_dtype_size(t.dtype) > (1u << 22)) continue;
        const void *p = FZ_TRY(cdf_wsrc_load(s, &t, k_names[i]));
        if (!p) {
            FZ_CHECK_MESSAGE();
        } else if (numel) {
            /* touch every byte: ASan reports a read outside the mapping or the buffer */
            const uint8_t *b = p;
            uint8_t x = 0;
            for (size_t k = 0; k < (size_t)numel * cdf_dtype_size(t.dtype); k++) x ^= b[k];
            (void)x;
        }
        cdf_wsrc_tensor_release(&t);
    }
    (void)cdf_wsrc_missing_hint(s);
    int n = -1;
    char *u = cdf_wsrc_unused(s, &n);
    FZ_CHECK(n >= 0 && (n == 0) == (u == NULL));
    free(u);
    cdf_wsrc_close(s);
    return 0;
}
