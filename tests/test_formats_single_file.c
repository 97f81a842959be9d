/* A component's weights from one file: the tiny FLUX.1-dev transformer as a BFL-layout
 * .safetensors, the same under ComfyUI's "model.diffusion_model." prefix, as GGUF F32 and as a
 * GGUF with Q8_0/Q4_0/Q5_1/Q4_K/Q6_K weights, the tiny SD3.5-Medium transformer in Stability's layout
 * and the tiny FLUX.2-dev transformer in BFL's FLUX.2 layout (safetensors, bare and prefixed, GGUF F32
 * written here, GGUF Q8_0/Q4_0/Q5_1) (tools/make-format-refs/make_single_file_refs.py, which checks
 * the files against diffusers' own convert_flux_transformer_checkpoint_to_diffusers /
 * convert_sd3_transformer_checkpoint_to_diffusers / convert_flux2_transformer_checkpoint_to_diffusers).
 *
 * - key conversion: every tensor the folder holds comes back bit-identical from each file;
 * - latents: the same generation from the folder and from each file gives identical latents,
 *   and the quantized GGUF gives exactly the latents of a diffusers file holding gguf-py's
 *   dequantization of it;
 * - bad input: missing, extra and misshapen tensors, a file of another model, a truncated GGUF,
 *   an unknown component, a missing file: each a clear error. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cdiffusers/io.h"
#include "cdiffusers/pipeline.h"
#include "nn/nn.h"

#define FS "formats/flux_single/"

/* A copy of the BFL file with a prefix on every name, one tensor left out, one extra tensor, or
 * one tensor replaced by another shape. */
static const char *variant_of(const char *src, const char *out, const char *prefix, const char *drop, const char *extra,
                              const char *reshape) {
    cdf_st_file *f = NULL;
    assert_int_equal(cdf_st_open(tu_data(src), &f), CDF_OK);
    cdf_st_writer *w = cdf_st_writer_new();
    static float junk[4];
    for (int i = 0; i < cdf_st_count(f); i++) {
        const cdf_st_tensor *t = cdf_st_tensor_at(f, i);
        if (drop && strcmp(t->name, drop) == 0) continue;
        char name[512];
        snprintf(name, sizeof name, "%s%s", prefix ? prefix : "", t->name);
        if (reshape && strcmp(t->name, reshape) == 0) {
            /* zeros of the wrong shape, sized for it (the writer copies the whole tensor) */
            float *wrong = calloc((size_t)(t->shape[0] * (t->shape[1] + 1)), sizeof(float));
            assert_non_null(wrong);
            assert_int_equal(cdf_st_writer_add(w, name, CDF_F32, 2, (int64_t[]){t->shape[0], t->shape[1] + 1}, wrong), CDF_OK);
            free(wrong);
        } else {
            assert_int_equal(cdf_st_writer_add(w, name, t->dtype, t->ndim, t->shape, cdf_st_data(f, t)), CDF_OK);
        }
    }
    if (extra) assert_int_equal(cdf_st_writer_add(w, extra, CDF_F32, 1, (int64_t[]){4}, junk), CDF_OK);
    const char *p = tu_tmp_path(out);
    assert_int_equal(cdf_st_writer_save(w, p), CDF_OK);
    cdf_st_writer_free(w);
    cdf_st_close(f);
    return p;
}

static const char *bfl_variant(const char *out, const char *prefix, const char *drop, const char *extra, const char *reshape) {
    return variant_of(FS "flux_bfl.safetensors", out, prefix, drop, extra, reshape);
}

/* Every tensor of the folder comes back bit-identical from each file. */
static void check_conversion(const char *folder, const char *const *files, int nfiles, const char *layout) {
    cdf_checkpoint *ck = NULL;
    assert_int_equal(cdf_checkpoint_open(folder, &ck), CDF_OK);
    for (int k = 0; k < nfiles; k++) {
        cdf_weights_report rep = {0};
        cdf_load_options o = cdf_load_options_default();
        o.device = tu_cpu();
        o.weights_file = files[k];
        o.report = &rep;
        cdf_weights *w = NULL;
        assert_int_equal(cdf_weights_open(folder, &o, &w), CDF_OK);
        for (int i = 0; i < cdf_checkpoint_count(ck); i++) {
            const cdf_st_file *f;
            const cdf_st_tensor *t;
            assert_int_equal(cdf_checkpoint_tensor_at(ck, i, &f, &t), CDF_OK);
            if (strstr(t->name, "num_batches_tracked")) continue; /* BatchNorm's counter: never loaded */
            cdf_tensor *x = cdf_weights_get_f32(w, t->ndim, t->shape, "%s", t->name);
            if (!x) fail_msg("%s from %s: %s", t->name, files[k], cdf_last_error());
            size_t n = (size_t)cdf_st_numel(t);
            float *got = malloc(n * 4);
            assert_int_equal(cdf_tensor_read(x, CDF_F32, got, n * 4), CDF_OK);
            if (memcmp(got, cdf_st_data(f, t), n * 4) != 0) fail_msg("%s from %s differs from the folder's", t->name, files[k]);
            free(got);
            cdf_tensor_release(x);
        }
        cdf_weights_free(w);
        if (rep.unused) fail_msg("%s: unused tensors %s", files[k], rep.unused);
        assert_non_null(strstr(rep.format, layout));
    }
    cdf_checkpoint_close(ck);
}

static void test_key_conversion(void **state) {
    (void)state;
    const char *flux[] = {tu_data(FS "flux_bfl.safetensors"), bfl_variant("comfy.safetensors", "model.diffusion_model.", NULL, NULL, NULL),
                          tu_data(FS "flux_bfl_f32.gguf")};
    check_conversion(tu_data("pipelines/flux1_dev_tiny/transformer"), flux, 3, "BFL FLUX");
    const char *sd3[] = {tu_data("formats/sd3_single/sd3_sai.safetensors"),
                         variant_of("formats/sd3_single/sd3_sai.safetensors", "sd3_comfy.safetensors", "model.diffusion_model.", NULL,
                                    NULL, NULL)};
    check_conversion(tu_data("pipelines/sd35m_tiny/transformer"), sd3, 2, "Stability SD3");
    const char *vae[] = {tu_data(FS "ae_ldm.safetensors"), variant_of(FS "ae_ldm.safetensors", "vae_prefixed.safetensors", "vae.", NULL,
                                                                      NULL, NULL)};
    check_conversion(tu_data("pipelines/flux1_dev_tiny/vae"), vae, 2, "LDM VAE");
}

/* A ComfyUI-style all-in-one file: the BFL transformer under "model.diffusion_model.", the LDM
 * VAE under "vae." and a stand-in text encoder tensor under "text_encoders.". */
static const char *all_in_one(void) {
    static char path[1024];
    if (path[0]) return path;
    cdf_st_writer *w = cdf_st_writer_new();
    const char *srcs[2] = {FS "flux_bfl.safetensors", FS "ae_ldm.safetensors"}, *pfx[2] = {"model.diffusion_model.", "vae."};
    cdf_st_file *fs[2];
    for (int k = 0; k < 2; k++) {
        assert_int_equal(cdf_st_open(tu_data(srcs[k]), &fs[k]), CDF_OK);
        for (int i = 0; i < cdf_st_count(fs[k]); i++) {
            const cdf_st_tensor *t = cdf_st_tensor_at(fs[k], i);
            char name[512];
            snprintf(name, sizeof name, "%s%s", pfx[k], t->name);
            assert_int_equal(cdf_st_writer_add(w, name, t->dtype, t->ndim, t->shape, cdf_st_data(fs[k], t)), CDF_OK);
        }
    }
    static float te[4];
    assert_int_equal(cdf_st_writer_add(w, "text_encoders.t5xxl.transformer.shared.weight", CDF_F32, 1, (int64_t[]){4}, te), CDF_OK);
    snprintf(path, sizeof path, "%s", tu_tmp_path("all_in_one.safetensors"));
    assert_int_equal(cdf_st_writer_save(w, path), CDF_OK);
    cdf_st_writer_free(w);
    cdf_st_close(fs[0]);
    cdf_st_close(fs[1]);
    return path;
}

/* latents_final of a 2-step f32 generation (malloc'd, 4 * *n bytes), or NULL with the status. */
static cdf_offload_mode g_offload = CDF_OFFLOAD_NONE; /* of the next runs */

static cdf_dtype g_wdt = CDF_F32; /* the load's weight dtype */
static bool g_decode;             /* decode GGUF blocks at load */
static uint32_t g_quant;          /* quantize float weights at load */
static const char *g_lora;        /* a LoRA adapter loaded before generating */
static cdf_lora_mode g_lora_mode;

static float *run_pipe_key(const char *pipe, const char *key, const cdf_component_file *files, int nfiles, bool allow_unused,
                           size_t *n, cdf_status *st) {
    cdf_pipeline_load_params lp = cdf_pipeline_load_params_default();
    lp.offload = g_offload;
    lp.weight_dtype = g_wdt;
    lp.decode_quantized = g_decode;
    lp.quantize_weights = g_quant;
    lp.component_files = files;
    lp.num_component_files = nfiles;
    lp.allow_unused_keys = allow_unused;
    cdf_pipeline *p = NULL;
    *st = cdf_pipeline_load(tu_data(pipe), &lp, &p);
    if (*st != CDF_OK) return NULL;
    if (g_lora) {
        cdf_lora_params lo = cdf_lora_params_default();
        lo.mode = g_lora_mode;
        lo.scale = 0.8f;
        if ((*st = cdf_pipeline_load_lora(p, g_lora, &lo, NULL)) != CDF_OK) {
            cdf_pipeline_free(p);
            return NULL;
        }
    }
    float *v = tu_generate_capture(p, key, n);
    cdf_pipeline_free(p);
    return v;
}

static float *run_pipe(const char *pipe, const cdf_component_file *files, int nfiles, bool allow_unused, size_t *n, cdf_status *st) {
    return run_pipe_key(pipe, "latents_final", files, nfiles, allow_unused, n, st);
}

static float *run(const cdf_component_file *files, int nfiles, bool allow_unused, size_t *n, cdf_status *st) {
    return run_pipe("pipelines/flux1_dev_tiny", files, nfiles, allow_unused, n, st);
}

/* A diffusers/PEFT adapter for two of the tiny transformer's quantized layers (Q8_0 to_q of
 * block 0, Q5_1 proj_out of single block 1), rank 2, fixed values. */
static const char *small_adapter(void) {
    static const struct { const char *module; int64_t in, out; } mods[] = {
        {"transformer.transformer_blocks.0.attn.to_q", 32, 32}, {"transformer.single_transformer_blocks.1.proj_out", 160, 32}};
    static float va[2 * 160], vb[32 * 2];
    cdf_st_writer *w = cdf_st_writer_new();
    for (int m = 0; m < 2; m++) {
        for (int i = 0; i < 2 * mods[m].in; i++) va[i] = (float)((i * 7 + m) % 13) / 13.0f - 0.5f;
        for (int i = 0; i < 2 * mods[m].out; i++) vb[i] = (float)((i * 5 + m) % 11) / 11.0f - 0.5f;
        char a[160], b[160];
        snprintf(a, sizeof a, "%s.lora_A.weight", mods[m].module);
        snprintf(b, sizeof b, "%s.lora_B.weight", mods[m].module);
        assert_int_equal(cdf_st_writer_add(w, a, CDF_F32, 2, (int64_t[]){2, mods[m].in}, va), CDF_OK);
        assert_int_equal(cdf_st_writer_add(w, b, CDF_F32, 2, (int64_t[]){mods[m].out, 2}, vb), CDF_OK);
    }
    const char *p = tu_tmp_path("small_lora.safetensors");
    assert_int_equal(cdf_st_writer_save(w, p), CDF_OK);
    cdf_st_writer_free(w);
    return p;
}

static void test_same_latents(void **state) {
    (void)state;
    size_t n0, n;
    cdf_status st;
    float *ref = run(NULL, 0, false, &n0, &st);
    assert_non_null(ref);
    const char *files[] = {tu_data(FS "flux_bfl.safetensors"), bfl_variant("comfy2.safetensors", "model.diffusion_model.", NULL, NULL, NULL),
                           tu_data(FS "flux_bfl_f32.gguf")};
    for (size_t k = 0; k < sizeof files / sizeof *files; k++) {
        cdf_component_file cf = {"transformer", files[k]};
        float *v = run(&cf, 1, false, &n, &st);
        if (!v) fail_msg("%s: %s", files[k], cdf_last_error());
        assert_int_equal(n, n0);
        if (memcmp(v, ref, n * 4) != 0) fail_msg("latents from %s differ from the folder's", files[k]);
        free(v);
    }
    /* quantized: exactly what the dequantized weights give */
    /* own copies: tu_data's buffers are reused by the many runs below */
    char *qpath = strdup(tu_data(FS "flux_bfl_q8.gguf"));
    char *dpath = strdup(tu_data(FS "q8_dequant/transformer/diffusion_pytorch_model.safetensors"));
    cdf_component_file q = {"transformer", qpath};
    cdf_component_file d = {"transformer", dpath};
    float *vq = run(&q, 1, false, &n, &st), *vd = run(&d, 1, false, &n, &st);
    assert_non_null(vq);
    assert_non_null(vd);
    assert_memory_equal(vq, vd, n * 4);
    /* sequential offload keeps the dequantized block weights host-side: the same latents */
    g_offload = CDF_OFFLOAD_SEQUENTIAL;
    float *vs = run(&q, 1, false, &n, &st);
    g_offload = CDF_OFFLOAD_NONE;
    if (!vs) fail_msg("sequential: %s", cdf_last_error());
    assert_memory_equal(vs, vd, n * 4);
    free(vs);
    size_t worst;
    /* the blocks decoded at load instead of in the matmul: the same numbers */
    g_decode = true;
    float *vdec = run(&q, 1, false, &n, &st);
    g_decode = false;
    if (!vdec) fail_msg("decode at load: %s", cdf_last_error());
    assert_memory_equal(vdec, vd, n * 4);
    free(vdec);
    /* a LoRA on the quantized layers, at run time (added to the decoded product) and fused (the
     * layer decoded first): what it gives on the dequantized file */
    g_lora = small_adapter();
    for (int mode = 0; mode < 2; mode++) {
        g_lora_mode = mode ? CDF_LORA_FUSE : CDF_LORA_RUNTIME;
        float *lq = run(&q, 1, false, &n, &st), *ld = run(&d, 1, false, &n, &st);
        if (!lq || !ld) fail_msg("LoRA %s: %s", mode ? "fused" : "run time", cdf_last_error());
        assert_memory_equal(lq, ld, n * 4);
        assert_true(tu_max_abs_diff(lq, vd, n, &worst) > 0); /* the adapter changed something */
        free(lq);
        free(ld);
    }
    g_lora = NULL;
    /* bf16 weights: decoded values rounded to bf16 as the folder's f32 values are at load */
    g_wdt = CDF_BF16;
    float *vq16 = run(&q, 1, false, &n, &st), *vd16 = run(&d, 1, false, &n, &st);
    g_wdt = CDF_F32;
    if (!vq16 || !vd16) fail_msg("bf16: %s", cdf_last_error());
    assert_memory_equal(vq16, vd16, n * 4);
    free(vq16);
    free(vd16);
    /* and not the f32 model's: the quantized weights are what ran (the two K-quant layers hold
     * random blocks, gguf-py having no K quantizer, so the latents are far from the f32 ones) */
    double diff = tu_max_abs_diff(vq, ref, n, &worst);
    print_message("  Q8_0/Q4_0/Q5_1/Q4_K/Q6_K GGUF vs f32 folder: max |latents diff| = %.3g\n", diff);
    assert_true(diff > 0);
    free(vq);
    free(vd);
    free(ref);
    free(qpath);
    free(dpath);

    /* the VAE from LDM names, and transformer + VAE from one all-in-one file: the same decoded image */
    float *img0 = run_pipe_key("pipelines/flux1_dev_tiny", "vae_decode_output", NULL, 0, false, &n0, &st);
    assert_non_null(img0);
    cdf_component_file ae = {"vae", tu_data(FS "ae_ldm.safetensors")};
    float *img = run_pipe_key("pipelines/flux1_dev_tiny", "vae_decode_output", &ae, 1, false, &n, &st);
    if (!img) fail_msg("ae: %s", cdf_last_error());
    assert_int_equal(n, n0);
    assert_memory_equal(img, img0, n * 4);
    free(img);
    cdf_component_file aio[2] = {{"transformer", all_in_one()}, {"vae", all_in_one()}};
    img = run_pipe_key("pipelines/flux1_dev_tiny", "vae_decode_output", aio, 2, false, &n, &st);
    if (!img) fail_msg("all-in-one: %s", cdf_last_error());
    assert_memory_equal(img, img0, n * 4);
    free(img);
    /* under offload the components are loaded again from their files when they run */
    for (int m = 0; m < 2; m++) {
        g_offload = m == 0 ? CDF_OFFLOAD_MODEL : CDF_OFFLOAD_SEQUENTIAL;
        img = run_pipe_key("pipelines/flux1_dev_tiny", "vae_decode_output", aio, 2, false, &n, &st);
        if (!img) fail_msg("all-in-one, offload %d: %s", m, cdf_last_error());
        assert_memory_equal(img, img0, n * 4);
        free(img);
    }
    g_offload = CDF_OFFLOAD_NONE;
    free(img0);

    float *ref0 = run(NULL, 0, false, &n0, &st);
    assert_non_null(ref0);
    /* a text encoder file as ComfyUI ships T5 (transformers' names) carrying a tied copy of the
     * token table, a buffer and an fp8 activation scale: used without complaint */
    {
        const char *t5src = "pipelines/flux1_dev_tiny/text_encoder_2/model.safetensors";
        cdf_st_file *f = NULL;
        assert_int_equal(cdf_st_open(tu_data(t5src), &f), CDF_OK);
        const cdf_st_tensor *sh = cdf_st_find(f, "shared.weight");
        assert_non_null(sh);
        cdf_st_writer *w = cdf_st_writer_new();
        for (int i = 0; i < cdf_st_count(f); i++) {
            const cdf_st_tensor *t = cdf_st_tensor_at(f, i);
            assert_int_equal(cdf_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, cdf_st_data(f, t)), CDF_OK);
        }
        if (!cdf_st_find(f, "encoder.embed_tokens.weight"))
            assert_int_equal(cdf_st_writer_add(w, "encoder.embed_tokens.weight", sh->dtype, sh->ndim, sh->shape, cdf_st_data(f, sh)),
                             CDF_OK);
        static float one = 1;
        assert_int_equal(cdf_st_writer_add(w, "encoder.block.0.layer.0.SelfAttention.q.scale_input", CDF_F32, 0, NULL, &one), CDF_OK);
        const char *t5 = tu_tmp_path("t5xxl.safetensors");
        assert_int_equal(cdf_st_writer_save(w, t5), CDF_OK);
        cdf_st_writer_free(w);
        cdf_st_close(f);
        cdf_component_file te = {"text_encoder_2", t5};
        float *v = run(&te, 1, false, &n, &st);
        if (!v) fail_msg("t5 file: %s", cdf_last_error());
        assert_memory_equal(v, ref0, n * 4);
        free(v);
    }
    free(ref0);

    /* SD3.5-Medium from Stability's layout */
    ref = run_pipe("pipelines/sd35m_tiny", NULL, 0, false, &n0, &st);
    assert_non_null(ref);
    cdf_component_file s3 = {"transformer", tu_data("formats/sd3_single/sd3_sai.safetensors")};
    float *v = run_pipe("pipelines/sd35m_tiny", &s3, 1, false, &n, &st);
    if (!v) fail_msg("sd3: %s", cdf_last_error());
    assert_int_equal(n, n0);
    assert_memory_equal(v, ref, n * 4);
    free(v);
    free(ref);
}

/* Loading `pipe` with these files fails with `status` and a message holding each needle. */
static void expect_pipe_load_error(const char *pipe, const cdf_component_file *files, int nfiles, cdf_status status, const char *n1,
                                   const char *n2) {
    size_t n;
    cdf_status st;
    float *v = run_pipe(pipe, files, nfiles, false, &n, &st);
    assert_null(v);
    const char *m = cdf_last_error();
    if (st != status || !strstr(m, n1) || (n2 && !strstr(m, n2)))
        fail_msg("got status %d '%s'; wanted %d with '%s' and '%s'", st, m, status, n1, n2 ? n2 : "");
}

static void expect_load_error(const cdf_component_file *files, int nfiles, cdf_status status, const char *n1, const char *n2) {
    expect_pipe_load_error("pipelines/flux1_dev_tiny", files, nfiles, status, n1, n2);
}

/* One layer read from the GGUF: its blocks stay in memory (u8 [out, row bytes]) and its forward
 * equals that of the same layer decoded at load, bit for bit; bad quantized operands are refused. */
static void check_layer(const char *name, int64_t in, int64_t out, uint32_t qtype, int64_t row_bytes) {
    cdf_linear_layer lq, ld;
    cdf_weights *w = NULL;
    cdf_load_options o = cdf_load_options_default();
    o.device = tu_cpu();
    o.weights_file = tu_data(FS "flux_bfl_q8.gguf");
    assert_int_equal(cdf_weights_open(tu_data("pipelines/flux1_dev_tiny/transformer"), &o, &w), CDF_OK);
    if (cdf_linear_load(w, &lq, in, out, 1, "%s", name) != CDF_OK) fail_msg("%s: %s", name, cdf_last_error());
    cdf_weights_free(w);
    o.decode_quantized = true;
    assert_int_equal(cdf_weights_open(tu_data("pipelines/flux1_dev_tiny/transformer"), &o, &w), CDF_OK);
    assert_int_equal(cdf_linear_load(w, &ld, in, out, 1, "%s", name), CDF_OK);
    cdf_weights_free(w);
    assert_int_equal(lq.qtype, qtype);
    assert_int_equal(cdf_tensor_dtype(lq.w), CDF_U8);
    assert_int_equal(cdf_tensor_dim(lq.w, 0), out);
    assert_int_equal(cdf_tensor_dim(lq.w, 1), row_bytes);
    assert_int_equal(ld.qtype, 0);
    assert_int_equal(cdf_tensor_dtype(ld.w), CDF_F32);
    float x[3 * 256];
    for (int i = 0; i < 3 * in; i++) x[i] = (float)((i * 37) % 23) / 11.0f - 1.0f;
    cdf_tensor *xt = cdf_tensor_from_host(tu_cpu(), CDF_F32, 2, (int64_t[]){3, in}, x, CDF_F32);
    cdf_tensor *yq = cdf_linear_fwd(&lq, xt), *yd = cdf_linear_fwd(&ld, xt);
    if (!yq || !yd) fail_msg("%s forward: %s", name, cdf_last_error());
    float a[3 * 256], b[3 * 256];
    assert_int_equal(cdf_tensor_read(yq, CDF_F32, a, (size_t)(3 * out) * 4), CDF_OK);
    assert_int_equal(cdf_tensor_read(yd, CDF_F32, b, (size_t)(3 * out) * 4), CDF_OK);
    assert_memory_equal(a, b, (size_t)(3 * out) * 4);
    bool nonzero = false;
    for (int i = 0; i < 3 * out; i++) nonzero |= a[i] != 0.0f;
    assert_true(nonzero);
    /* decoding in place (what fusing a LoRA does first) gives the decoded layer's weights */
    assert_int_equal(cdf_linear_decode(&lq), CDF_OK);
    assert_int_equal(lq.qtype, 0);
    float *wa = malloc((size_t)(in * out) * 4), *wb = malloc((size_t)(in * out) * 4);
    assert_int_equal(cdf_tensor_read(lq.w, CDF_F32, wa, (size_t)(in * out) * 4), CDF_OK);
    assert_int_equal(cdf_tensor_read(ld.w, CDF_F32, wb, (size_t)(in * out) * 4), CDF_OK);
    assert_memory_equal(wa, wb, (size_t)(in * out) * 4);
    free(wa);
    free(wb);
    cdf_tensor_release(xt);
    cdf_tensor_release(yq);
    cdf_tensor_release(yd);
    cdf_linear_free(&lq);
    cdf_linear_free(&ld);
}

static void test_blocks_in_memory(void **state) {
    (void)state;
    /* from the fused BFL qkv (rows 0..31 of img_attn.qkv), Q8_0: 32 values in 34 bytes */
    check_layer("transformer_blocks.0.attn.to_q", 32, 32, CDF_GGML_Q8_0, 34);
    /* AdaLayerNormContinuous's halves swapped from BFL's final_layer.adaLN_modulation (Q8_0) */
    check_layer("norm_out.linear", 32, 64, CDF_GGML_Q8_0, 34);
    /* K-quants: 256 values per 144-byte Q4_K block, 210-byte Q6_K block */
    check_layer("time_text_embed.timestep_embedder.linear_1", 256, 32, CDF_GGML_Q4_K, 144);
    check_layer("time_text_embed.guidance_embedder.linear_1", 256, 32, CDF_GGML_Q6_K, 210);
    /* Q4_0 (18 bytes) and Q5_1 (24 bytes) per 32 values */
    check_layer("single_transformer_blocks.1.proj_out", 160, 32, CDF_GGML_Q5_1, 5 * 24);

    /* refused operands */
    cdf_tensor *x = cdf_tensor_zeros(tu_cpu(), CDF_F32, 2, (int64_t[]){2, 48});
    cdf_tensor *wq = cdf_tensor_zeros(tu_cpu(), CDF_U8, 2, (int64_t[]){4, 51});
    assert_null(cdf_linear_quantized(x, wq, CDF_GGML_Q8_0, 48, CDF_F32, NULL));
    assert_int_equal(cdf_last_status(), CDF_ERR_SHAPE);
    assert_non_null(strstr(cdf_last_error(), "not a whole number of Q8_0 blocks"));
    cdf_tensor *x2 = cdf_tensor_zeros(tu_cpu(), CDF_F32, 2, (int64_t[]){2, 64});
    assert_null(cdf_linear_quantized(x2, wq, CDF_GGML_Q8_0, 64, CDF_F32, NULL)); /* 51 bytes, not 68 */
    assert_int_equal(cdf_last_status(), CDF_ERR_SHAPE);
    assert_null(cdf_linear_quantized(x2, wq, CDF_GGML_F32, 64, CDF_F32, NULL));
    assert_int_equal(cdf_last_status(), CDF_ERR_UNSUPPORTED);
    assert_null(cdf_linear_quantized(x2, wq, CDF_GGML_Q8_0, 64, CDF_F16, NULL));
    assert_int_equal(cdf_last_status(), CDF_ERR_INVALID_ARG);
    cdf_tensor *wq68 = cdf_tensor_zeros(tu_cpu(), CDF_U8, 2, (int64_t[]){4, 68});
    assert_null(cdf_linear_quantized(x, wq68, CDF_GGML_Q8_0, 64, CDF_F32, NULL)); /* x has 48 features */
    assert_int_equal(cdf_last_status(), CDF_ERR_SHAPE);
    cdf_tensor *y = cdf_linear_quantized(x2, wq68, CDF_GGML_Q8_0, 64, CDF_F32, NULL); /* zero blocks: d = 0 */
    assert_non_null(y);
    float out[8];
    assert_int_equal(cdf_tensor_read(y, CDF_F32, out, sizeof out), CDF_OK);
    for (int i = 0; i < 8; i++) assert_true(out[i] == 0.0f);
    cdf_tensor_release(y);
    cdf_tensor_release(wq68);
    cdf_tensor_release(x2);
    cdf_tensor_release(wq);
    cdf_tensor_release(x);
}

/* --weight-type q8_0: float linear weights become Q8_0 blocks at load (cdf_ggml_quantize, bit-exact
 * with gguf-py: test_io_gguf), layers without whole blocks per row stay float, and a generation
 * runs on them: latents near the f32 ones but not equal. */
static void test_quantize_at_load(void **state) {
    (void)state;
    cdf_load_options o = cdf_load_options_default();
    o.device = tu_cpu();
    o.quantize_to = CDF_GGML_Q8_0;
    cdf_weights *w = NULL;
    const char *dir = tu_data("pipelines/flux1_dev_tiny/transformer");
    assert_int_equal(cdf_weights_open(dir, &o, &w), CDF_OK);
    cdf_linear_layer lq, lc;
    assert_int_equal(cdf_linear_load(w, &lq, 32, 32, 1, "transformer_blocks.0.attn.to_q"), CDF_OK);
    assert_int_equal(cdf_linear_load(w, &lc, 24, 32, 1, "context_embedder"), CDF_OK); /* 24 inputs: no whole block */
    cdf_weights_free(w);
    assert_int_equal(lq.qtype, CDF_GGML_Q8_0);
    assert_int_equal(cdf_tensor_dtype(lq.w), CDF_U8);
    assert_int_equal(cdf_tensor_dim(lq.w, 1), 34);
    assert_int_equal(lc.qtype, 0);
    assert_int_equal(cdf_tensor_dtype(lc.w), CDF_F32);
    /* the blocks are the quantizer's encoding of the file's values */
    cdf_st_file *f = NULL;
    assert_int_equal(cdf_st_open(tu_data("pipelines/flux1_dev_tiny/transformer/diffusion_pytorch_model.safetensors"), &f), CDF_OK);
    const cdf_st_tensor *t = cdf_st_find(f, "transformer_blocks.0.attn.to_q.weight");
    assert_non_null(t);
    assert_int_equal(t->dtype, CDF_F32);
    uint8_t want[32 * 34], got[32 * 34];
    assert_int_equal(cdf_ggml_quantize(CDF_GGML_Q8_0, cdf_st_data(f, t), 32 * 32, want), CDF_OK);
    cdf_st_close(f);
    assert_int_equal(cdf_tensor_read(lq.w, CDF_U8, got, sizeof got), CDF_OK);
    assert_memory_equal(got, want, sizeof got);
    cdf_linear_free(&lq);
    cdf_linear_free(&lc);

    size_t n0, n;
    cdf_status st;
    float *ref = run(NULL, 0, false, &n0, &st);
    g_quant = CDF_GGML_Q8_0;
    float *vq = run(NULL, 0, false, &n, &st);
    g_quant = 0;
    if (!vq) fail_msg("q8_0 at load: %s", cdf_last_error());
    assert_int_equal(n, n0);
    size_t worst;
    double diff = tu_max_abs_diff(vq, ref, n, &worst), scale = 0;
    for (size_t i = 0; i < n; i++) scale = fabs(ref[i]) > scale ? fabs(ref[i]) : scale;
    print_message("  Q8_0 at load vs f32: max |latents diff| = %.3g (max |latent| %.3g)\n", diff, scale);
    assert_true(diff > 0);            /* the quantized weights are what ran */
    assert_true(diff < 0.05 * scale); /* 8-bit weights: a small perturbation of a 2-step generation */
    free(vq);
    free(ref);
}

/* --weight-type q4_k: float linear weights with whole 256-value blocks per row become Q4_K blocks
 * at load (cdf_ggml_quantize, byte-exact with ggml's encoder: test_io_gguf). In the tiny FLUX.1
 * transformer only the timestep and guidance embedders' first layers (256 inputs) have whole
 * blocks; the others (32-160 inputs) stay f32.
 *  - exact: the generation equals, bit for bit, the one from a diffusers file holding those two
 *    weights replaced by the decoded Q4_K blocks (the quantized matmul decodes exactly as the
 *    dequantizer and multiplies through the same path);
 *  - near f32: max |latents diff| < 0.1 * max |latent|. Why that much: Q4_K's rms error is about 7-8%
 *    of a gaussian row's rms (q4k_refs rows), ~20x Q8_0's, whose test allows 5%; but the error only
 *    enters through the time/guidance embedding (which modulates every block), not every matmul,
 *    over 2 steps, so a few percent is expected and 10% still rejects a wrong encoding (a wrong
 *    scale or nibble order moves the embedding by its own size). */
static void test_quantize_q4_k_at_load(void **state) {
    (void)state;
    static const char *const q_names[] = {"time_text_embed.timestep_embedder.linear_1",
                                          "time_text_embed.guidance_embedder.linear_1"};
    cdf_load_options o = cdf_load_options_default();
    o.device = tu_cpu();
    o.quantize_to = CDF_GGML_Q4_K;
    cdf_weights *w = NULL;
    const char *tdir = tu_data("pipelines/flux1_dev_tiny/transformer");
    assert_int_equal(cdf_weights_open(tdir, &o, &w), CDF_OK);
    cdf_linear_layer lq, lf;
    assert_int_equal(cdf_linear_load(w, &lq, 256, 32, 1, q_names[0]), CDF_OK);
    assert_int_equal(cdf_linear_load(w, &lf, 32, 32, 1, "transformer_blocks.0.attn.to_q"), CDF_OK); /* 32 inputs */
    cdf_weights_free(w);
    assert_int_equal(lq.qtype, CDF_GGML_Q4_K);
    assert_int_equal(cdf_tensor_dtype(lq.w), CDF_U8);
    assert_int_equal(cdf_tensor_dim(lq.w, 1), 144);
    assert_int_equal(lf.qtype, 0);
    assert_int_equal(cdf_tensor_dtype(lf.w), CDF_F32);

    /* the loaded blocks are the encoder's; the reference file holds their decoded values */
    cdf_st_file *f = NULL;
    assert_int_equal(cdf_st_open(tu_data("pipelines/flux1_dev_tiny/transformer/diffusion_pytorch_model.safetensors"), &f), CDF_OK);
    cdf_st_writer *wr = cdf_st_writer_new();
    static uint8_t blocks[2][32 * 144];
    static float dec[2][32 * 256];
    int replaced = 0;
    for (int i = 0; i < cdf_st_count(f); i++) {
        const cdf_st_tensor *t = cdf_st_tensor_at(f, i);
        const void *data = cdf_st_data(f, t);
        for (int k = 0; k < 2; k++) {
            char wn[256];
            snprintf(wn, sizeof wn, "%s.weight", q_names[k]);
            if (strcmp(t->name, wn) != 0) continue;
            assert_int_equal(t->dtype, CDF_F32);
            assert_int_equal(cdf_st_numel(t), 32 * 256);
            assert_int_equal(cdf_ggml_quantize(CDF_GGML_Q4_K, data, 32 * 256, blocks[k]), CDF_OK);
            assert_int_equal(cdf_ggml_dequantize(CDF_GGML_Q4_K, blocks[k], 32 * 256, dec[k]), CDF_OK);
            data = dec[k];
            replaced++;
        }
        assert_int_equal(cdf_st_writer_add(wr, t->name, t->dtype, t->ndim, t->shape, data), CDF_OK);
    }
    assert_int_equal(replaced, 2);
    const char *dq_path = tu_tmp_path("q4k_decoded.safetensors");
    assert_int_equal(cdf_st_writer_save(wr, dq_path), CDF_OK);
    cdf_st_writer_free(wr);
    cdf_st_close(f);
    uint8_t got[32 * 144];
    assert_int_equal(cdf_tensor_read(lq.w, CDF_U8, got, sizeof got), CDF_OK);
    assert_memory_equal(got, blocks[0], sizeof got);
    cdf_linear_free(&lq);
    cdf_linear_free(&lf);

    size_t n0, n1, n;
    cdf_status st;
    float *ref = run(NULL, 0, false, &n0, &st);
    cdf_component_file dq = {"transformer", dq_path};
    float *vd = run(&dq, 1, false, &n1, &st);
    if (!vd) fail_msg("decoded Q4_K file: %s", cdf_last_error());
    g_quant = CDF_GGML_Q4_K;
    float *vq = run(NULL, 0, false, &n, &st);
    g_quant = 0;
    if (!vq) fail_msg("q4_k at load: %s", cdf_last_error());
    assert_int_equal(n, n0);
    assert_int_equal(n1, n0);
    assert_memory_equal(vq, vd, n * 4); /* bit for bit the decoded weights' generation */
    size_t worst;
    double diff = tu_max_abs_diff(vq, ref, n, &worst), scale = 0;
    for (size_t i = 0; i < n; i++) scale = fabs(ref[i]) > scale ? fabs(ref[i]) : scale;
    print_message("  Q4_K at load vs f32: max |latents diff| = %.3g (max |latent| %.3g)\n", diff, scale);
    assert_true(diff > 0);           /* the quantized weights are what ran */
    assert_true(diff < 0.1 * scale); /* see above */
    free(vq);
    free(vd);
    free(ref);
}

static void test_bad_inputs(void **state) {
    (void)state;
    cdf_component_file f = {"transformer", bfl_variant("missing.safetensors", NULL, "double_blocks.1.txt_attn.qkv.weight", NULL, NULL)};
    expect_load_error(&f, 1, CDF_ERR_NOT_FOUND, "weight 'transformer_blocks.1.attn.add_q_proj.weight' is missing", "missing.safetensors");

    f.path = bfl_variant("extra.safetensors", NULL, NULL, "lora_unet.extra.alpha", NULL);
    expect_load_error(&f, 1, CDF_ERR_FORMAT, "1 tensor(s)", "lora_unet.extra.alpha");
    size_t n;
    cdf_status st;
    float *v = run(&f, 1, true, &n, &st); /* allowed on request */
    assert_non_null(v);
    free(v);

    f.path = bfl_variant("shape.safetensors", NULL, NULL, NULL, "img_in.weight");
    expect_load_error(&f, 1, CDF_ERR_SHAPE, "weight 'x_embedder.weight'", "has shape [32, 65]");

    cdf_component_file vae = {"vae", tu_data(FS "flux_bfl.safetensors")};
    expect_load_error(&vae, 1, CDF_ERR_NOT_FOUND, "none of the 84 tensors", "double_blocks.0");

    size_t len;
    char *g = tu_read_file(tu_data(FS "flux_bfl_f32.gguf"), &len);
    assert_non_null(g);
    const char *cut = tu_tmp_path("cut.gguf");
    assert_int_equal(tu_write_file(cut, g, len / 2), 0);
    free(g);
    f.path = cut;
    expect_load_error(&f, 1, CDF_ERR_FORMAT, "cut.gguf", "truncated");

    cdf_component_file u = {"unet", tu_data(FS "flux_bfl.safetensors")};
    expect_load_error(&u, 1, CDF_ERR_INVALID_ARG, "component 'unet'", NULL);
    cdf_component_file nf = {"transformer", "/nonexistent/x.gguf"};
    expect_load_error(&nf, 1, CDF_ERR_NOT_FOUND, "/nonexistent/x.gguf", NULL);
}

/* ---- FLUX.2-dev in BFL's layout (formats/flux2_single, made and checked against diffusers'
 * convert_flux2_transformer_checkpoint_to_diffusers by tools/make-format-refs/make_single_file_refs.py) ---- */

#define F2S "formats/flux2_single/"
#define F2_PIPE "pipelines/flux2_dev_tiny"

/* The BFL file as GGUF F32, written here by cdiffusers' GGUF writer (names and values as they are). */
static const char *flux2_f32_gguf(void) {
    static char path[1024];
    if (path[0]) return path;
    cdf_st_file *f = NULL;
    assert_int_equal(cdf_st_open(tu_data(F2S "flux2_bfl.safetensors"), &f), CDF_OK);
    cdf_gguf_writer *gw = cdf_gguf_writer_new(0);
    for (int i = 0; i < cdf_st_count(f); i++) {
        const cdf_st_tensor *t = cdf_st_tensor_at(f, i);
        assert_int_equal(t->dtype, CDF_F32);
        assert_int_equal(cdf_gguf_writer_add(gw, t->name, CDF_GGML_F32, t->ndim, t->shape, cdf_st_data(f, t)), CDF_OK);
    }
    snprintf(path, sizeof path, "%s", tu_tmp_path("flux2_bfl_f32.gguf"));
    assert_int_equal(cdf_gguf_writer_save(gw, path, true, NULL, NULL), CDF_OK);
    cdf_gguf_writer_free(gw);
    cdf_st_close(f);
    return path;
}

static const char *flux2_variant(const char *out, const char *prefix, const char *drop, const char *extra, const char *reshape) {
    return variant_of(F2S "flux2_bfl.safetensors", out, prefix, drop, extra, reshape);
}

/* Every tensor of the folder from the BFL file (bare, under ComfyUI's prefix, as GGUF F32), and
 * the pipeline's latents from each bit for bit the folder's. */
static void test_flux2_bfl(void **state) {
    (void)state;
    char *files[3] = {strdup(tu_data(F2S "flux2_bfl.safetensors")),
                      strdup(flux2_variant("flux2_comfy.safetensors", "model.diffusion_model.", NULL, NULL, NULL)),
                      strdup(flux2_f32_gguf())};
    check_conversion(tu_data(F2_PIPE "/transformer"), (const char *const *)files, 3, "BFL FLUX.2 keys");
    size_t n0, n;
    cdf_status st;
    float *ref = run_pipe(F2_PIPE, NULL, 0, false, &n0, &st);
    assert_non_null(ref);
    for (int k = 0; k < 3; k++) {
        cdf_component_file cf = {"transformer", files[k]};
        float *v = run_pipe(F2_PIPE, &cf, 1, false, &n, &st);
        if (!v) fail_msg("%s: %s", files[k], cdf_last_error());
        assert_int_equal(n, n0);
        if (memcmp(v, ref, n * 4) != 0) fail_msg("FLUX.2 latents from %s differ from the folder's", files[k]);
        free(v);
        free(files[k]);
    }
    /* quantized (city96-style: Q8_0 / Q4_0 / Q5_1 weights, F32 norms): exactly the latents of
     * the diffusers file holding gguf-py's dequantization of it (as the FLUX.1 GGUF above) */
    char *qpath = strdup(tu_data(F2S "flux2_bfl_q8.gguf"));
    char *dpath = strdup(tu_data(F2S "q8_dequant/transformer/diffusion_pytorch_model.safetensors"));
    cdf_component_file q = {"transformer", qpath}, d = {"transformer", dpath};
    float *vq = run_pipe(F2_PIPE, &q, 1, false, &n, &st);
    if (!vq) fail_msg("%s: %s", qpath, cdf_last_error());
    float *vd = run_pipe(F2_PIPE, &d, 1, false, &n, &st);
    if (!vd) fail_msg("%s: %s", dpath, cdf_last_error());
    assert_int_equal(n, n0);
    assert_memory_equal(vq, vd, n * 4);
    /* the blocks decoded at load: the same numbers */
    g_decode = true;
    float *vdec = run_pipe(F2_PIPE, &q, 1, false, &n, &st);
    g_decode = false;
    if (!vdec) fail_msg("decode at load: %s", cdf_last_error());
    assert_memory_equal(vdec, vd, n * 4);
    size_t worst;
    double diff = tu_max_abs_diff(vq, ref, n, &worst);
    print_message("  FLUX.2 Q8_0/Q4_0/Q5_1 GGUF vs f32 folder: max |latents diff| = %.3g\n", diff);
    assert_true(diff > 0); /* the quantized weights are what ran */
    free(vdec);
    free(vq);
    free(vd);
    free(ref);
    free(qpath);
    free(dpath);
}

static void test_flux2_bad_inputs(void **state) {
    (void)state;
    cdf_component_file f = {"transformer", flux2_variant("f2_missing.safetensors", NULL, "double_blocks.1.txt_attn.qkv.weight", NULL, NULL)};
    expect_pipe_load_error(F2_PIPE, &f, 1, CDF_ERR_NOT_FOUND, "weight 'transformer_blocks.1.attn.add_q_proj.weight' is missing",
                           "f2_missing.safetensors");
    f.path = flux2_variant("f2_missing_mod.safetensors", NULL, "single_stream_modulation.lin.weight", NULL, NULL);
    /* without its FLUX.2 marker the file reads as FLUX.1 keys: nothing FLUX.2 needs beyond the blocks is found */
    expect_pipe_load_error(F2_PIPE, &f, 1, CDF_ERR_NOT_FOUND, "is missing", "f2_missing_mod.safetensors");
    f.path = flux2_variant("f2_extra.safetensors", NULL, NULL, "final_layer.adaLN_modulation.1.bias", NULL);
    expect_pipe_load_error(F2_PIPE, &f, 1, CDF_ERR_FORMAT, "1 tensor(s)", "final_layer.adaLN_modulation.1.bias");
    f.path = flux2_variant("f2_shape.safetensors", NULL, NULL, NULL, "img_in.weight");
    expect_pipe_load_error(F2_PIPE, &f, 1, CDF_ERR_SHAPE, "weight 'x_embedder.weight'", "has shape [64, 33]");
    f.path = flux2_variant("f2_shape2.safetensors", NULL, NULL, NULL, "single_blocks.0.linear2.weight");
    expect_pipe_load_error(F2_PIPE, &f, 1, CDF_ERR_SHAPE, "single_transformer_blocks.0.attn.to_out", "[64, 257]");
    /* a FLUX.2 file is no FLUX.1 transformer, and the other way round */
    f.path = tu_data(F2S "flux2_bfl.safetensors");
    expect_load_error(&f, 1, CDF_ERR_SHAPE, "weight 'x_embedder.weight'", "flux2_bfl.safetensors");
    f.path = tu_data(FS "flux_bfl.safetensors");
    expect_pipe_load_error(F2_PIPE, &f, 1, CDF_ERR_NOT_FOUND, "is missing", "flux_bfl.safetensors");
    /* --model FILE alone: refused, saying what to do and what is not shipped */
    char model[64], dir[1024];
    assert_int_equal(cdf_pipeline_single_file_model(tu_data(F2S "flux2_bfl.safetensors"), NULL, model, sizeof model, dir, sizeof dir),
                     CDF_ERR_UNSUPPORTED);
    const char *m = cdf_last_error();
    if (!strstr(m, "FLUX.2-dev transformer single file") || !strstr(m, "--transformer FILE") || !strstr(m, "tokenizer"))
        fail_msg("--model FILE message: %s", m);
}

/* The FLUX.2 VAE in BFL's names (formats/flux2_single/ae_flux2.safetensors, made and checked
 * against diffusers' scripts/convert_flux2_to_diffusers.py by
 * tools/make-format-refs/make_flux2_vae_refs.py): every tensor of the folder, bare and under
 * "vae.", and the pipeline's decoded image bit for bit the folder's. */
static void test_flux2_vae_bfl(void **state) {
    (void)state;
    char *files[2] = {strdup(tu_data(F2S "ae_flux2.safetensors")),
                      strdup(variant_of(F2S "ae_flux2.safetensors", "ae_flux2_prefixed.safetensors", "vae.", NULL, NULL, NULL))};
    check_conversion(tu_data(F2_PIPE "/vae"), (const char *const *)files, 2, "LDM VAE keys");
    size_t n0, n;
    cdf_status st;
    float *img0 = run_pipe_key(F2_PIPE, "vae_decode_output", NULL, 0, false, &n0, &st);
    assert_non_null(img0);
    for (int k = 0; k < 2; k++) {
        cdf_component_file ae = {"vae", files[k]};
        float *img = run_pipe_key(F2_PIPE, "vae_decode_output", &ae, 1, false, &n, &st);
        if (!img) fail_msg("%s: %s", files[k], cdf_last_error());
        assert_int_equal(n, n0);
        if (memcmp(img, img0, n * 4) != 0) fail_msg("FLUX.2 image from %s differs from the folder's", files[k]);
        free(img);
        free(files[k]);
    }
    free(img0);
    /* a BatchNorm counter in the file is no unused key; a missing statistic or quant conv is named */
    cdf_component_file f = {"vae", variant_of(F2S "ae_flux2.safetensors", "ae_f2_nbt.safetensors", NULL, NULL, "bn.num_batches_tracked", NULL)};
    float *img = run_pipe_key(F2_PIPE, "vae_decode_output", &f, 1, false, &n, &st);
    if (!img) fail_msg("with bn.num_batches_tracked: %s", cdf_last_error());
    free(img);
    f.path = variant_of(F2S "ae_flux2.safetensors", "ae_f2_nobn.safetensors", NULL, "bn.running_var", NULL, NULL);
    expect_pipe_load_error(F2_PIPE, &f, 1, CDF_ERR_NOT_FOUND, "weight 'bn.running_var' is missing", "ae_f2_nobn.safetensors");
    f.path = variant_of(F2S "ae_flux2.safetensors", "ae_f2_noqc.safetensors", NULL, "encoder.quant_conv.weight", NULL, NULL);
    expect_pipe_load_error(F2_PIPE, &f, 1, CDF_ERR_NOT_FOUND, "weight 'quant_conv.weight' is missing", "ae_f2_noqc.safetensors");
    /* the tiny FLUX.1 VAE is no FLUX.2 VAE (its widths differ: the first mismatch is named) */
    f.path = tu_data(FS "ae_ldm.safetensors");
    expect_pipe_load_error(F2_PIPE, &f, 1, CDF_ERR_SHAPE, "has shape", "ae_ldm.safetensors");
}

/* The command line: the FLUX.2 transformer from its GGUF, `info` on it, and --model FILE refused. */
static void test_flux2_cli(void **state) {
    (void)state;
    const char *dir = tu_tmpdir();
    char *model = strdup(tu_data(F2_PIPE)), *q8 = strdup(tu_data(F2S "flux2_bfl_q8.gguf"));
    const char *common = "generate --prompt 'a red square' --steps 1 --height 64 --width 64 --text-encoder-out-layers 1,2,3 --quiet --force";
    int rc = tu_system("cd '%s' && '%s' %s --model '%s' --output f2.png --transformer '%s' 2>err.txt", dir, CDF_CLI_PATH, common, model, q8);
    if (rc != 0) fail_msg("generate with the FLUX.2 GGUF: rc %d: %s", rc, tu_read_file(tu_tmp_path("err.txt"), NULL));
    assert_int_equal(tu_system("test -s '%s'", tu_tmp_path("f2.png")), 0);
    rc = tu_system("'%s' info --model '%s' --transformer '%s' >'%s/f2info.txt' 2>&1", CDF_CLI_PATH, model, q8, dir);
    assert_int_equal(rc, 0);
    char *info = tu_read_file(tu_tmp_path("f2info.txt"), NULL);
    assert_non_null(info);
    /* 43 tensors: 11 outside the blocks, 12 per double block, 4 per single block (gguf-py's reader
     * counts 13 F32, 20 Q8_0, 8 Q4_0, 2 Q5_1) */
    if (!strstr(info, "flux2_bfl_q8.gguf (GGUF, BFL FLUX.2 keys): 43 tensors") || !strstr(info, "13 F32, 8 Q4_0, 2 Q5_1, 20 Q8_0"))
        fail_msg("info output: %s", info);
    free(info);
    rc = tu_system("cd '%s' && '%s' %s --model '%s' --output bad2.png 2>err.txt", dir, CDF_CLI_PATH, common, q8);
    assert_int_equal(rc, 1);
    char *err = tu_read_file(tu_tmp_path("err.txt"), NULL);
    if (!strstr(err, "FLUX.2-dev transformer single file") || !strstr(err, "--model DIR --transformer FILE")) fail_msg("stderr: %s", err);
    free(err);
    assert_int_equal(tu_system("test -e '%s'", tu_tmp_path("bad2.png")), 1);
    /* --model FILE --config DIR: the folder gives the configs, the other components from their
     * files (the Mistral file carries its unused vision tower and lm_head), and the file's shapes
     * are checked against the config's */
    const char *bfl = tu_data(F2S "flux2_bfl.safetensors");
    char *others = malloc(4096);
    snprintf(others, 4096, "--text-encoder '1=%s/text_encoder/model.safetensors' --vae '%s/vae/diffusion_pytorch_model.safetensors' "
             "--allow-unused-keys", model, model);
    rc = tu_system("cd '%s' && '%s' %s --model '%s' --config '%s' %s --output cfg.png 2>err.txt", dir, CDF_CLI_PATH, common, bfl, model,
                   others);
    if (rc != 0) fail_msg("--model FILE --config DIR: rc %d: %s", rc, tu_read_file(tu_tmp_path("err.txt"), NULL));
    rc = tu_system("cd '%s' && rm -rf cfg3 && cp -rL '%s' cfg3 && sed -i 's/\"num_single_layers\": 2/\"num_single_layers\": 3/' "
                   "cfg3/transformer/config.json && grep -q '\"num_single_layers\": 3' cfg3/transformer/config.json", dir, model);
    assert_int_equal(rc, 0);
    rc = tu_system("cd '%s' && '%s' %s --model '%s' --config cfg3 %s --output bad3.png 2>err.txt", dir, CDF_CLI_PATH, common, bfl, others);
    assert_int_equal(rc, 1);
    err = tu_read_file(tu_tmp_path("err.txt"), NULL);
    if (!strstr(err, "the number of single_blocks is 2") || !strstr(err, "num_single_layers 3")) fail_msg("stderr: %s", err);
    free(err);
    assert_int_equal(tu_system("test -e '%s'", tu_tmp_path("bad3.png")), 1);
    free(others);
    free(model);
    free(q8);
}

/* The command line: exit codes, the message on stderr, no image written on failure. */
/* GGUF writers that count dims up to the last non-unit one (stable-diffusion.cpp's convert) store
 * SD3's pos_embed [1, N, C] as [N, C]: a weight whose shape differs from the config's only by
 * leading unit dims loads with the config's shape; any other difference is still an error. */
static void test_gguf_dropped_unit_dims(void **state) {
    (void)state;
    float v[24];
    for (int i = 0; i < 24; i++) v[i] = (float)i - 7.5f;
    const char *path = tu_tmp_path("unit_dims.gguf");
    cdf_gguf_writer *gw = cdf_gguf_writer_new(0);
    assert_int_equal(cdf_gguf_writer_add(gw, "pos_embed.pos_embed", CDF_GGML_F32, 2, (int64_t[]){4, 6}, v), CDF_OK);
    assert_int_equal(cdf_gguf_writer_save(gw, path, true, NULL, NULL), CDF_OK);
    cdf_gguf_writer_free(gw);
    cdf_load_options o = cdf_load_options_default();
    o.device = tu_cpu();
    o.weights_file = path;
    cdf_weights *w;
    assert_int_equal(cdf_weights_open(tu_tmpdir(), &o, &w), CDF_OK);
    cdf_tensor *t = cdf_weights_get(w, 3, (int64_t[]){1, 4, 6}, "pos_embed.pos_embed");
    if (!t) fail_msg("%s", cdf_last_error());
    assert_int_equal(cdf_tensor_ndim(t), 3);
    assert_int_equal(cdf_tensor_dim(t, 0), 1);
    float *got = cdf_tensor_read_f32(t);
    for (int i = 0; i < 24; i++) assert_true(got[i] == v[i]);
    free(got);
    cdf_tensor_release(t);
    assert_null(cdf_weights_get(w, 3, (int64_t[]){2, 2, 6}, "pos_embed.pos_embed"));
    assert_int_equal(cdf_last_status(), CDF_ERR_SHAPE);
    assert_null(cdf_weights_get(w, 3, (int64_t[]){1, 6, 4}, "pos_embed.pos_embed"));
    assert_int_equal(cdf_last_status(), CDF_ERR_SHAPE);
    cdf_weights_free(w);
}

static void test_cli(void **state) {
    (void)state;
    const char *dir = tu_tmpdir(), *model = tu_data("pipelines/flux1_dev_tiny");
    const char *common = "generate --prompt 'a red square' --steps 1 --height 64 --width 64 --quiet --force";
    int rc = tu_system("cd '%s' && '%s' %s --model '%s' --output ok.png --transformer '%s' 2>err.txt", dir, CDF_CLI_PATH, common,
                       model, tu_data(FS "flux_bfl_q8.gguf"));
    assert_int_equal(rc, 0);
    const char *extra = bfl_variant("extra_cli.safetensors", NULL, NULL, "lora_unet.extra.alpha", NULL);
    rc = tu_system("cd '%s' && '%s' %s --model '%s' --output bad.png --transformer '%s' 2>err.txt", dir, CDF_CLI_PATH, common, model,
                   extra);
    assert_int_equal(rc, 1);
    char *err = tu_read_file(tu_tmp_path("err.txt"), NULL);
    assert_non_null(err);
    assert_non_null(strstr(err, "lora_unet.extra.alpha"));
    assert_non_null(strstr(err, "--allow-unused-keys"));
    free(err);
    assert_int_equal(tu_system("test -e '%s'", tu_tmp_path("bad.png")), 1); /* nothing written */
    rc = tu_system("cd '%s' && '%s' %s --model '%s' --output ok2.png --transformer '%s' --allow-unused-keys 2>err.txt", dir,
                   CDF_CLI_PATH, common, model, extra);
    assert_int_equal(rc, 0);
    rc = tu_system("cd '%s' && '%s' %s --model '%s' --output bad.png --text-encoder '%s' 2>err.txt", dir, CDF_CLI_PATH, common, model,
                   tu_data(FS "flux_bfl.safetensors"));
    assert_int_equal(rc, 2); /* usage: N=FILE */
    rc = tu_system("cd '%s' && '%s' %s --model '%s' --output bad.png --text-encoder '2=%s' 2>err.txt", dir, CDF_CLI_PATH, common,
                   model, tu_data(FS "flux_bfl.safetensors"));
    assert_int_equal(rc, 1); /* a FLUX transformer file is no T5 */
    err = tu_read_file(tu_tmp_path("err.txt"), NULL);
    assert_non_null(strstr(err, "none of the 84 tensors"));
    free(err);
    assert_int_equal(tu_system("test -e '%s'", tu_tmp_path("bad.png")), 1);

    /* --weight-type: q8_0 / q4_k quantize at load, f32/bf16 decode a .gguf at load (= --dtype) */
    rc = tu_system("cd '%s' && '%s' %s --model '%s' --output q8.png --weight-type q8_0 2>err.txt", dir, CDF_CLI_PATH, common, model);
    assert_int_equal(rc, 0);
    rc = tu_system("cd '%s' && '%s' %s --model '%s' --output q4k.png --weight-type q4_k 2>err.txt", dir, CDF_CLI_PATH, common, model);
    assert_int_equal(rc, 0);
    rc = tu_system("cd '%s' && '%s' %s --model '%s' --output dec.png --dtype f32 --weight-type f32 --transformer '%s' 2>err.txt", dir,
                   CDF_CLI_PATH, common, model, tu_data(FS "flux_bfl_q8.gguf"));
    assert_int_equal(rc, 0);
    static const char *const bad_wt[][2] = {{"--weight-type q5_k", "must be q8_0, q4_k, f32 or bf16"},
                                            {"--weight-type f32", "same --dtype"},
                                            {"--weight-type int4", "must be q8_0, q4_k, f32 or bf16"}};
    for (int k = 0; k < 3; k++) {
        rc = tu_system("cd '%s' && '%s' %s --model '%s' --output bad.png %s 2>err.txt", dir, CDF_CLI_PATH, common, model, bad_wt[k][0]);
        assert_int_equal(rc, 2);
        err = tu_read_file(tu_tmp_path("err.txt"), NULL);
        if (!strstr(err, bad_wt[k][1])) fail_msg("%s: %s", bad_wt[k][0], err);
        free(err);
    }
    assert_int_equal(tu_system("test -e '%s'", tu_tmp_path("bad.png")), 1);

    /* info names each component's source, its format and its tensor types */
    rc = tu_system("'%s' info --model '%s' --transformer '%s' >'%s/info.txt' 2>&1", CDF_CLI_PATH, model, tu_data(FS "flux_bfl_q8.gguf"),
                   dir);
    assert_int_equal(rc, 0);
    char *info = tu_read_file(tu_tmp_path("info.txt"), NULL);
    assert_non_null(info);
    if (!strstr(info, "flux_bfl_q8.gguf (GGUF, BFL FLUX keys): 84 tensors") || !strstr(info, "50 F32, 8 Q4_0, 2 Q5_1, 22 Q8_0, 1 Q4_K, 1 Q6_K"))
        fail_msg("info output: %s", info);
    free(info);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_conversion),
        cmocka_unit_test(test_same_latents),
        cmocka_unit_test(test_blocks_in_memory),
        cmocka_unit_test(test_quantize_at_load),
        cmocka_unit_test(test_quantize_q4_k_at_load),
        cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test(test_gguf_dropped_unit_dims),
        cmocka_unit_test(test_flux2_bfl),
        cmocka_unit_test(test_flux2_bad_inputs),
        cmocka_unit_test(test_flux2_vae_bfl),
        cmocka_unit_test(test_flux2_cli),
        cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
