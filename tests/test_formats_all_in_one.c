/* A whole pipeline from one all-in-one file (`--model FILE`, cdf_pipeline_load of a file):
 *
 * - the tiny FLUX.1-dev and SD3.5-Medium test pipelines written as one file, in ComfyUI's layout
 *   ("model.diffusion_model." BFL / Stability transformer, "vae." LDM VAE,
 *   "text_encoders.{clip_l,clip_g,t5xxl}.transformer." text encoders) and in Stability's
 *   ("first_stage_model." VAE), loaded with the tiny folder as config: latents identical bit for
 *   bit (f32) to the folder's. The text encoders' names are transformers' under the prefix, as
 *   diffusers' convert_ldm_clip_checkpoint / convert_sd3_t5_checkpoint_to_diffusers take them,
 *   and SD3's CLIP-L gets the identity as its text_projection, as diffusers'
 *   create_diffusers_clip_model_from_ldm gives it (tools/make-format-refs/make_all_in_one_refs.py
 *   checks both rules with those functions on these tiny models and wrote the LDM copy of the
 *   SD3.5 VAE used here); `--text-encoder N=FILE` of such a file reads that encoder's part;
 * - recognition from headers only: sparse files (a real safetensors header with the real models'
 *   shapes, the data a hole) pick the shipped config of FLUX.1-dev / -schnell, SD3-Medium,
 *   SD3.5-Medium / -Large without reading tensor data;
 * - bad input: an unknown model, a FLUX.2 file, a missing component (named, with the option that
 *   supplies it), a shape that contradicts the config, --config with a folder: clear errors;
 * - the command line: generate / info / plan --model FILE [--config DIR]. */
#include "testutil.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cdiffusers/convert.h"
#include "cdiffusers/device.h"
#include "cdiffusers/io.h"
#include "cdiffusers/pipeline.h"
#include "models/component.h"
#include "nn/nn.h"
#include "pipelines/planner.h"

#define FLUX_DIR "pipelines/flux1_dev_tiny"
#define SD3_DIR "pipelines/sd35m_tiny"

/* ---- writing all-in-one files from the tiny models' parts ---- */

typedef struct part {
    const char *file, *prefix;
} part;

/* Every tensor of each part's file under its prefix, plus `extra` (a name, [n] or [n, n] f32). */
static const char *compose(const char *out, const part *parts, int n, const char *const *extra, const int64_t *extra_n) {
    cdf_st_writer *w = cdf_st_writer_new();
    cdf_st_file *fs[8];
    for (int k = 0; k < n; k++) {
        assert_int_equal(cdf_st_open(tu_data(parts[k].file), &fs[k]), CDF_OK);
        for (int i = 0; i < cdf_st_count(fs[k]); i++) {
            const cdf_st_tensor *t = cdf_st_tensor_at(fs[k], i);
            char name[512];
            snprintf(name, sizeof name, "%s%s", parts[k].prefix, t->name);
            assert_int_equal(cdf_st_writer_add(w, name, t->dtype, t->ndim, t->shape, cdf_st_data(fs[k], t)), CDF_OK);
        }
    }
    static float junk[64 * 64];
    for (int i = 0; i < 64 * 64; i++) junk[i] = (float)(i % 17) * 0.1f - 0.7f;
    for (int e = 0; extra && extra[e]; e++)
        assert_int_equal(cdf_st_writer_add(w, extra[e], CDF_F32, extra_n[e] > 0 ? 2 : 1,
                                           (int64_t[]){extra_n[e] > 0 ? extra_n[e] : -extra_n[e], extra_n[e]}, junk),
                         CDF_OK);
    const char *p = tu_tmp_path(out);
    static char keep[8][1024];
    static int slot;
    char *path = keep[slot++ & 7];
    snprintf(path, 1024, "%s", p);
    assert_int_equal(cdf_st_writer_save(w, path), CDF_OK);
    cdf_st_writer_free(w);
    for (int k = 0; k < n; k++) cdf_st_close(fs[k]);
    return path;
}

/* ComfyUI's FLUX.1 all-in-one file; CLIP-L with the text_projection and logit_scale such files
 * carry (diffusers drops them for FLUX's CLIPTextModel). without: a part left out (-1: none). */
static const char *flux_aio(const char *out, int without) {
    const part all[] = {{"formats/flux_single/flux_bfl.safetensors", "model.diffusion_model."},
                        {"formats/flux_single/ae_ldm.safetensors", "vae."},
                        {FLUX_DIR "/text_encoder/model.safetensors", "text_encoders.clip_l.transformer."},
                        {FLUX_DIR "/text_encoder_2/model.safetensors", "text_encoders.t5xxl.transformer."}};
    part parts[4];
    int n = 0;
    for (int k = 0; k < 4; k++)
        if (k != without) parts[n++] = all[k];
    static const char *const extra[] = {"text_encoders.clip_l.transformer.text_projection.weight",
                                        "text_encoders.clip_l.transformer.logit_scale", NULL};
    static const int64_t extra_n[] = {8, -1};
    return compose(out, parts, n, without == 2 ? NULL : extra, extra_n);
}

/* The SD3.5-Medium tiny pipeline in one file: Stability's layout (VAE under "first_stage_model.")
 * or ComfyUI's ("vae."). CLIP-L carries a text_projection of its own, which diffusers replaces by
 * the identity. */
static const char *sd3_aio(const char *out, const char *vae_prefix) {
    const part parts[] = {{"formats/sd3_single/sd3_sai.safetensors", "model.diffusion_model."},
                          {"formats/sd3_single/vae_ldm.safetensors", vae_prefix},
                          {SD3_DIR "/text_encoder/model.safetensors", "text_encoders.clip_l.transformer."},
                          {SD3_DIR "/text_encoder_2/model.safetensors", "text_encoders.clip_g.transformer."},
                          {SD3_DIR "/text_encoder_3/model.safetensors", "text_encoders.t5xxl.transformer."}};
    /* the tiny CLIP-L's own text_projection is in its file already: no extra tensor */
    return compose(out, parts, 5, NULL, NULL);
}

/* The tiny SD3.5 CLIP-L (diffusers names) with the identity as its text_projection: what diffusers'
 * single-file loader makes of the CLIP-L part. */
static const char *sd3_clip_l_identity(void) {
    static char path[1024];
    if (path[0]) return path;
    cdf_st_file *f = NULL;
    assert_int_equal(cdf_st_open(tu_data(SD3_DIR "/text_encoder/model.safetensors"), &f), CDF_OK);
    cdf_st_writer *w = cdf_st_writer_new();
    float *eye = NULL;
    for (int i = 0; i < cdf_st_count(f); i++) {
        const cdf_st_tensor *t = cdf_st_tensor_at(f, i);
        if (strcmp(t->name, "text_projection.weight") == 0) {
            assert_int_equal(t->ndim, 2);
            assert_int_equal(t->shape[0], t->shape[1]);
            const int64_t d = t->shape[0];
            eye = calloc((size_t)(d * d), sizeof *eye);
            for (int64_t k = 0; k < d; k++) eye[k * d + k] = 1.0f;
            assert_int_equal(cdf_st_writer_add(w, t->name, CDF_F32, 2, t->shape, eye), CDF_OK);
        } else {
            assert_int_equal(cdf_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, cdf_st_data(f, t)), CDF_OK);
        }
    }
    assert_non_null(eye);
    snprintf(path, sizeof path, "%s", tu_tmp_path("sd3_clip_l_identity.safetensors"));
    assert_int_equal(cdf_st_writer_save(w, path), CDF_OK);
    cdf_st_writer_free(w);
    cdf_st_close(f);
    free(eye);
    return path;
}

/* ---- generation ---- */

/* latents_final of a 2-step f32 generation of `model` (a folder, or a file with config), or NULL
 * with *st set. */
static float *run(const char *model, const char *config, const cdf_component_file *files, int nfiles, cdf_offload_mode offload,
                  size_t *n, cdf_status *st) {
    cdf_pipeline_load_params lp = cdf_pipeline_load_params_default();
    lp.weight_dtype = CDF_F32;
    lp.config = config;
    lp.component_files = files;
    lp.num_component_files = nfiles;
    lp.offload = offload;
    cdf_pipeline *p = NULL;
    *st = cdf_pipeline_load(model, &lp, &p);
    if (*st != CDF_OK) return NULL;
    float *v = tu_generate_capture(p, "latents_final", n);
    cdf_pipeline_free(p);
    return v;
}

static void expect_same(const float *ref, size_t n0, const char *model, const char *config, const cdf_component_file *files,
                        int nfiles, cdf_offload_mode offload, const char *what) {
    size_t n;
    cdf_status st;
    float *v = run(model, config, files, nfiles, offload, &n, &st);
    if (!v) fail_msg("%s: %s", what, cdf_last_error());
    assert_int_equal(n, n0);
    if (memcmp(v, ref, n * 4) != 0) fail_msg("%s: latents differ from the folder's", what);
    free(v);
}

static void test_flux_same_latents(void **state) {
    (void)state;
    size_t n0;
    cdf_status st;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", tu_data(FLUX_DIR));
    float *ref = run(dir, NULL, NULL, 0, CDF_OFFLOAD_NONE, &n0, &st);
    assert_non_null(ref);
    const char *aio = flux_aio("flux_aio.safetensors", -1);
    expect_same(ref, n0, aio, dir, NULL, 0, CDF_OFFLOAD_NONE, "FLUX all-in-one --model FILE --config DIR");
    /* under model offload each component is loaded again from the file when it runs */
    expect_same(ref, n0, aio, dir, NULL, 0, CDF_OFFLOAD_MODEL, "FLUX all-in-one, model offload");
    /* each text encoder's part alone, beside the folder */
    cdf_component_file te[2] = {{"text_encoder", aio}, {"text_encoder_2", aio}};
    expect_same(ref, n0, dir, NULL, te, 2, CDF_OFFLOAD_NONE, "FLUX folder + --text-encoder 1=AIO 2=AIO");
    /* convert reads a text encoder's part: CLIP-L and T5 from the all-in-one file to GGUF, loaded back */
    cdf_component_file conv[2] = {{"text_encoder", NULL}, {"text_encoder_2", NULL}};
    char outs[2][1024];
    for (int k = 0; k < 2; k++) {
        cdf_convert_params cp = cdf_convert_params_default();
        cp.model = dir;
        cp.component = conv[k].component;
        cp.weights_file = aio;
        snprintf(outs[k], sizeof outs[k], "%s/%s_from_aio.gguf", tu_tmpdir(), conv[k].component);
        cp.output = outs[k];
        if (cdf_convert_to_gguf(&cp, NULL) != CDF_OK) fail_msg("convert %s: %s", cp.component, cdf_last_error());
        conv[k].path = outs[k];
    }
    expect_same(ref, n0, dir, NULL, conv, 2, CDF_OFFLOAD_NONE, "FLUX folder + text encoders converted from the all-in-one file");
    /* a file without the VAE: --vae FILE supplies it */
    const char *novae = flux_aio("flux_novae.safetensors", 1);
    cdf_component_file vae = {"vae", tu_data("formats/flux_single/ae_ldm.safetensors")};
    expect_same(ref, n0, novae, dir, &vae, 1, CDF_OFFLOAD_NONE, "FLUX all-in-one without VAE + --vae FILE");
    free(ref);
}

static void test_sd3_same_latents(void **state) {
    (void)state;
    size_t n0, n;
    cdf_status st;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", tu_data(SD3_DIR));
    /* the reference: the folder with CLIP-L's text_projection the identity, as diffusers loads
     * the single file */
    cdf_component_file eye = {"text_encoder", sd3_clip_l_identity()};
    float *ref = run(dir, NULL, &eye, 1, CDF_OFFLOAD_NONE, &n0, &st);
    if (!ref) fail_msg("%s", cdf_last_error());
    /* the identity matters: the folder's own projection gives other latents */
    float *plain = run(dir, NULL, NULL, 0, CDF_OFFLOAD_NONE, &n, &st);
    assert_non_null(plain);
    assert_int_equal(n, n0);
    assert_true(memcmp(plain, ref, n * 4) != 0);
    free(plain);
    expect_same(ref, n0, sd3_aio("sd3_sai_aio.safetensors", "first_stage_model."), dir, NULL, 0, CDF_OFFLOAD_NONE,
                "SD3.5 all-in-one, Stability's layout");
    const char *comfy = sd3_aio("sd3_comfy_aio.safetensors", "vae.");
    expect_same(ref, n0, comfy, dir, NULL, 0, CDF_OFFLOAD_NONE, "SD3.5 all-in-one, ComfyUI's layout");
    /* CLIP-G and T5 parts beside the folder (CLIP-L from the folder: its own projection) */
    cdf_component_file te[2] = {{"text_encoder_2", comfy}, {"text_encoder_3", comfy}};
    float *ref2 = run(dir, NULL, NULL, 0, CDF_OFFLOAD_NONE, &n, &st);
    expect_same(ref2, n, dir, NULL, te, 2, CDF_OFFLOAD_NONE, "SD3.5 folder + --text-encoder 2=AIO 3=AIO");
    free(ref2);
    free(ref);
}

/* ---- planning an all-in-one file ---- */

/* The planner counts exactly the device bytes each component's load from the file takes. */
static void check_plan(const char *dir, const char *aio, const char *const *keys, const char *const *parts, int n) {
    for (int k = 0; k < n; k++)
        for (int d = 0; d < 2; d++) {
            char sub[4200];
            snprintf(sub, sizeof sub, "%s/%s", dir, keys[k]);
            cdf_load_options o = cdf_load_options_default();
            o.device = tu_cpu();
            o.weight_dtype = d ? CDF_BF16 : CDF_F32;
            o.weights_file = aio;
            o.weights_part = parts[k];
            const uint64_t before = tu_device_bytes();
            cdf_component *c = NULL;
            if (cdf_component_load(sub, &o, &c) != CDF_OK) fail_msg("%s from %s: %s", keys[k], aio, cdf_last_error());
            const uint64_t loaded = tu_device_bytes() - before;
            char cls[64];
            snprintf(cls, sizeof cls, "%s", cdf_component_class_name(c));
            cdf_component_free(c);
            cdf_plan_weights_opts wo = {.class_name = cls, .file = aio, .key = keys[k], .text_part = parts[k]};
            cdf_plan_blocks b;
            assert_int_equal(cdf_plan_block_bytes_opts(sub, o.weight_dtype, &wo, &b), CDF_OK);
            if (b.total_bytes != loaded)
                fail_msg("%s of %s (%s): planned %llu bytes, loaded %llu", keys[k], aio, d ? "bf16" : "f32",
                         (unsigned long long)b.total_bytes, (unsigned long long)loaded);
        }
}

static void test_plan(void **state) {
    (void)state;
    static const char *const fk[] = {"text_encoder", "text_encoder_2", "transformer", "vae"};
    static const char *const fp[] = {"clip_l", "t5xxl", NULL, NULL};
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", tu_data(FLUX_DIR));
    check_plan(dir, flux_aio("plan_flux.safetensors", -1), fk, fp, 4);
    static const char *const sk[] = {"text_encoder", "text_encoder_2", "text_encoder_3", "transformer", "vae"};
    static const char *const sp[] = {"clip_l", "clip_g", "t5xxl", NULL, NULL};
    snprintf(dir, sizeof dir, "%s", tu_data(SD3_DIR));
    check_plan(dir, sd3_aio("plan_sd3.safetensors", "first_stage_model."), sk, sp, 5);
}

/* ---- sparse files with the real models' shapes ---- */

typedef struct hdr {
    char *json;
    size_t len, cap;
    uint64_t off;
    int n;
} hdr;

static void hdr_add(hdr *h, const char *name, int ndim, const int64_t *shape) {
    uint64_t bytes = 2;
    char dims[128] = "";
    for (int i = 0; i < ndim; i++) {
        bytes *= (uint64_t)shape[i];
        snprintf(dims + strlen(dims), sizeof dims - strlen(dims), "%s%lld", i ? "," : "", (long long)shape[i]);
    }
    if (h->len + 1024 > h->cap) h->json = realloc(h->json, h->cap = h->cap * 2 + 65536);
    h->len += (size_t)snprintf(h->json + h->len, h->cap - h->len, "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":[%s],\"data_offsets\":[%llu,%llu]}",
                               h->n++ ? "," : "{", name, dims, (unsigned long long)h->off, (unsigned long long)(h->off + bytes));
    h->off += bytes;
}
#define ADD(h, name, ...) hdr_add(h, name, (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__})

/* Writes the header and makes the file as long as its data, which stays a hole. */
static const char *hdr_save(hdr *h, const char *name) {
    h->len += (size_t)snprintf(h->json + h->len, h->cap - h->len, "}");
    while (h->len % 8) h->json[h->len++] = ' ';
    const char *p = tu_tmp_path(name);
    int fd = open(p, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    assert_true(fd >= 0);
    uint64_t hl = h->len;
    assert_int_equal(write(fd, &hl, 8), 8);
    assert_int_equal(write(fd, h->json, h->len), (ssize_t)h->len);
    assert_int_equal(ftruncate(fd, (off_t)(8 + h->len + h->off)), 0);
    close(fd);
    free(h->json);
    memset(h, 0, sizeof *h);
    return p;
}

static void sparse_vae(hdr *h) {
    ADD(h, "first_stage_model.encoder.down.0.block.0.conv1.weight", 128, 128, 3, 3);
    ADD(h, "first_stage_model.decoder.conv_in.weight", 512, 16, 3, 3);
    for (int i = 0; i < 4; i++) {
        char n[128];
        snprintf(n, sizeof n, "first_stage_model.decoder.up.%d.block.0.conv1.weight", i);
        ADD(h, n, 512, 512, 3, 3);
    }
}

static void sparse_clip(hdr *h, const char *part, int64_t width, int layers) {
    char n[256];
    snprintf(n, sizeof n, "text_encoders.%s.transformer.text_model.embeddings.position_embedding.weight", part);
    ADD(h, n, 77, width);
    for (int i = 0; i < layers; i++) {
        snprintf(n, sizeof n, "text_encoders.%s.transformer.text_model.encoder.layers.%d.mlp.fc1.weight", part, i);
        ADD(h, n, 4 * width, width);
    }
}

static void sparse_t5(hdr *h) {
    ADD(h, "text_encoders.t5xxl.transformer.shared.weight", 32128, 4096);
    for (int i = 0; i < 24; i++) {
        char n[256];
        snprintf(n, sizeof n, "text_encoders.t5xxl.transformer.encoder.block.%d.layer.0.SelfAttention.q.weight", i);
        ADD(h, n, 4096, 4096);
    }
}

/* FLUX.1 in BFL names under ComfyUI's prefix: dev with guidance_in (img_in taking `in` channels). */
static const char *sparse_flux(const char *name, bool guidance, int64_t in, int doubles) {
    hdr h = {0};
    ADD(&h, "model.diffusion_model.img_in.weight", 3072, in);
    ADD(&h, "model.diffusion_model.txt_in.weight", 3072, 4096);
    ADD(&h, "model.diffusion_model.vector_in.in_layer.weight", 3072, 768);
    if (guidance) {
        ADD(&h, "model.diffusion_model.guidance_in.in_layer.weight", 3072, 256);
        ADD(&h, "model.diffusion_model.guidance_in.in_layer.bias", 3072);
    }
    char n[256];
    for (int i = 0; i < doubles; i++) {
        snprintf(n, sizeof n, "model.diffusion_model.double_blocks.%d.img_attn.norm.key_norm.scale", i);
        ADD(&h, n, 128);
    }
    for (int i = 0; i < 38; i++) {
        snprintf(n, sizeof n, "model.diffusion_model.single_blocks.%d.linear1.weight", i);
        ADD(&h, n, 21504, 3072);
    }
    sparse_vae(&h);
    sparse_clip(&h, "clip_l", 768, 12);
    sparse_t5(&h);
    return hdr_save(&h, name);
}

/* SD3 in Stability's names: `blocks` joint blocks `width` wide, pos_embed of `pos` positions. */
static const char *sparse_sd3(const char *name, int blocks, int64_t width, int64_t pos) {
    hdr h = {0};
    ADD(&h, "model.diffusion_model.pos_embed", 1, pos, width);
    ADD(&h, "model.diffusion_model.x_embedder.proj.weight", width, 16, 2, 2);
    ADD(&h, "model.diffusion_model.context_embedder.weight", width, 4096);
    ADD(&h, "model.diffusion_model.y_embedder.mlp.0.weight", width, 2048);
    char n[256];
    for (int i = 0; i < blocks; i++) {
        snprintf(n, sizeof n, "model.diffusion_model.joint_blocks.%d.context_block.adaLN_modulation.1.bias", i);
        ADD(&h, n, 6 * width);
        snprintf(n, sizeof n, "model.diffusion_model.joint_blocks.%d.x_block.mlp.fc1.weight", i);
        ADD(&h, n, 4 * width, width);
    }
    sparse_vae(&h);
    sparse_clip(&h, "clip_l", 768, 12);
    sparse_clip(&h, "clip_g", 1280, 32);
    sparse_t5(&h);
    return hdr_save(&h, name);
}

static void expect_model(const char *path, const char *config, const char *want) {
    char model[64] = "?", dir[4096] = "";
    const uint64_t before = cdf_io_bytes_read();
    if (cdf_pipeline_single_file_model(path, config, model, sizeof model, dir, sizeof dir) != CDF_OK)
        fail_msg("%s: %s", path, cdf_last_error());
    assert_string_equal(model, want);
    assert_int_equal(cdf_io_bytes_read(), before); /* headers only */
    if (!config) {
        char tail[128];
        snprintf(tail, sizeof tail, "/models/configs/%s", want);
        if (strlen(dir) < strlen(tail) || strcmp(dir + strlen(dir) - strlen(tail), tail) != 0) fail_msg("%s: configs from %s", want, dir);
    }
}

static void expect_error(const char *path, const char *config, cdf_status status, const char *m1, const char *m2) {
    char model[64], dir[4096];
    cdf_status s = cdf_pipeline_single_file_model(path, config, model, sizeof model, dir, sizeof dir);
    if (s != status || !strstr(cdf_last_error(), m1) || (m2 && !strstr(cdf_last_error(), m2)))
        fail_msg("%s: expected status %d with '%s' / '%s', got %d: %s", path, status, m1, m2 ? m2 : "", s, cdf_last_error());
}

static void test_recognise(void **state) {
    (void)state;
    expect_model(sparse_flux("flux1-dev.safetensors", true, 64, 19), NULL, "flux1-dev");
    expect_model(sparse_flux("flux1-schnell.safetensors", false, 64, 19), NULL, "flux1-schnell");
    expect_model(sparse_sd3("sd3-medium.safetensors", 24, 1536, 36864), NULL, "sd3-medium");
    expect_model(sparse_sd3("sd3.5-medium.safetensors", 24, 1536, 147456), NULL, "sd3.5-medium");
    expect_model(sparse_sd3("sd3.5-large.safetensors", 38, 2432, 36864), NULL, "sd3.5-large");
    /* the tiny models with their folders as config, checked against the folder: FLUX.1 keys with
     * guidance_in read as FLUX.1-dev (as diffusers infers them), the tiny SD3.5 as none */
    expect_model(flux_aio("flux_aio_r.safetensors", -1), tu_data(FLUX_DIR), "flux1-dev");
    expect_model(sd3_aio("sd3_aio_r.safetensors", "first_stage_model."), tu_data(SD3_DIR), "");
}

static void test_bad_inputs(void **state) {
    (void)state;
    /* shapes that contradict the shipped config */
    expect_error(sparse_flux("flux1-dev-18.safetensors", true, 64, 18), NULL, CDF_ERR_SHAPE, "number of double_blocks is 18",
                 "num_layers 19");
    expect_error(sparse_sd3("sd3.5-medium-23.safetensors", 23, 1536, 147456), NULL, CDF_ERR_SHAPE, "number of joint_blocks is 23",
                 "num_layers 24");
    /* the tiny model against the shipped FLUX.1-dev config, a real model's file against the tiny folder */
    expect_error(flux_aio("flux_aio_b.safetensors", -1), NULL, CDF_ERR_SHAPE, "models/configs/flux1-dev/text_encoder/config.json",
                 "says hidden_size 768");
    expect_error(tu_tmp_path("flux1-dev.safetensors"), tu_data(FLUX_DIR), CDF_ERR_SHAPE, "flux1_dev_tiny/text_encoder/config.json", "says hidden_size 8");
    /* an SD3 file with a FLUX folder */
    expect_error(tu_tmp_path("sd3-medium.safetensors"), tu_data(FLUX_DIR), CDF_ERR_FORMAT, "SD3 transformer", "FluxPipeline");
    /* unknown models */
    expect_error(sparse_flux("flux1-fill.safetensors", true, 384, 19), NULL, CDF_ERR_UNSUPPORTED, "not a single file of a model",
                 "Fill");
    expect_error(tu_data("formats/flux_single/ae_ldm.safetensors"), NULL, CDF_ERR_UNSUPPORTED, "holds no FLUX.1", "--config DIR");
    expect_error(tu_data(FLUX_DIR "/text_encoder/model.safetensors"), NULL, CDF_ERR_UNSUPPORTED, "not a single file of a model", NULL);
    hdr h = {0};
    ADD(&h, "model.diffusion_model.single_stream_modulation.lin.weight", 18432, 6144);
    expect_error(hdr_save(&h, "flux2.safetensors"), NULL, CDF_ERR_UNSUPPORTED, "FLUX.2-dev", "tokenizer");
    /* a transformer-only file: the first component it lacks, and the option that supplies it */
    expect_error(tu_data("formats/flux_single/flux_bfl.safetensors"), tu_data(FLUX_DIR), CDF_ERR_NOT_FOUND,
                 "holds no CLIP-L text encoder", "--text-encoder 1=FILE");
    expect_error(flux_aio("flux_novae2.safetensors", 1), tu_data(FLUX_DIR), CDF_ERR_NOT_FOUND, "holds no VAE", "--vae FILE");
    expect_error(flux_aio("flux_not5.safetensors", 3), tu_data(FLUX_DIR), CDF_ERR_NOT_FOUND, "T5-XXL", "--text-encoder 2=FILE");
    expect_error(tu_data("formats/flux_single/flux_bfl.safetensors"), "/nonexistent/config", CDF_ERR_NOT_FOUND, "/nonexistent/config",
                 NULL);
    /* the same through cdf_pipeline_load: nothing loaded */
    cdf_pipeline_load_params lp = cdf_pipeline_load_params_default();
    lp.config = tu_data(FLUX_DIR);
    cdf_pipeline *p = (cdf_pipeline *)1;
    assert_int_equal(cdf_pipeline_load(flux_aio("flux_novae3.safetensors", 1), &lp, &p), CDF_ERR_NOT_FOUND);
    assert_null(p);
    /* config goes with a file only */
    assert_int_equal(cdf_pipeline_load(tu_data(FLUX_DIR), &lp, &p), CDF_ERR_INVALID_ARG);
    assert_non_null(strstr(cdf_last_error(), "single-file"));
    /* a text encoder's part missing from a file given as that encoder */
    cdf_component_file te = {"text_encoder_2", tu_data("formats/flux_single/flux_bfl.safetensors")};
    lp.config = NULL;
    lp.component_files = &te;
    lp.num_component_files = 1;
    lp.weight_dtype = CDF_F32;
    assert_int_not_equal(cdf_pipeline_load(tu_data(FLUX_DIR), &lp, &p), CDF_OK);
    te.path = flux_aio("flux_not5b.safetensors", 3); /* all-in-one without T5, given as text_encoder_2 */
    assert_int_equal(cdf_pipeline_load(tu_data(FLUX_DIR), &lp, &p), CDF_ERR_NOT_FOUND);
    if (!strstr(cdf_last_error(), "no \"text_encoders.t5xxl.transformer.\" part")) fail_msg("%s", cdf_last_error());
}

static void test_cli(void **state) {
    (void)state;
    char tiny[4096];
    snprintf(tiny, sizeof tiny, "%s", tu_data(FLUX_DIR));
    const char *dir = tu_tmpdir();
    const char *aio = flux_aio("cli_aio.safetensors", -1);
    const char *common = "generate --prompt 'a red square' --steps 1 --height 64 --width 64 --quiet --force";
    int rc = tu_system("cd '%s' && '%s' %s --model '%s' --config '%s' --output ok.png 2>err.txt", dir, CDF_CLI_PATH, common, aio, tiny);
    if (rc != 0) fail_msg("generate --model FILE --config DIR: exit %d: %s", rc, tu_read_file(tu_tmp_path("err.txt"), NULL));
    rc = tu_system("cd '%s' && '%s' %s --model '%s' --config '%s' --output bad.png 2>err.txt", dir, CDF_CLI_PATH, common,
                   tu_data("formats/flux_single/flux_bfl.safetensors"), tiny);
    assert_int_equal(rc, 1);
    char *err = tu_read_file(tu_tmp_path("err.txt"), NULL);
    if (!strstr(err, "--text-encoder 1=FILE")) fail_msg("%s", err);
    free(err);
    assert_int_equal(tu_system("test -e '%s'", tu_tmp_path("bad.png")), 1);
    rc = tu_system("'%s' info --model '%s' --config '%s' >'%s/info.txt' 2>&1", CDF_CLI_PATH, aio, tiny, dir);
    char *info = tu_read_file(tu_tmp_path("info.txt"), NULL);
    if (rc != 0 || !strstr(info, "text encoders clip_l, t5xxl") || !strstr(info, "text_encoder_2"))
        fail_msg("info: exit %d: %s", rc, info);
    free(info);
    /* what the file lacks, given beside it */
    rc = tu_system("'%s' info --model '%s' --config '%s' --vae '%s' >'%s/info.txt' 2>&1", CDF_CLI_PATH,
                   flux_aio("cli_novae.safetensors", 1), tiny, tu_data("formats/flux_single/ae_ldm.safetensors"), dir);
    info = tu_read_file(tu_tmp_path("info.txt"), NULL);
    if (rc != 0 || !strstr(info, "from ") || !strstr(info, "ae_ldm.safetensors (safetensors, LDM VAE keys)"))
        fail_msg("info with --vae: exit %d: %s", rc, info);
    free(info);
    rc = tu_system("'%s' info --model '%s' >'%s/info.txt' 2>&1", CDF_CLI_PATH, tu_tmp_path("flux1-schnell.safetensors"), dir);
    info = tu_read_file(tu_tmp_path("info.txt"), NULL);
    if (rc != 0 || !strstr(info, "recognised as flux1-schnell")) fail_msg("info: exit %d: %s", rc, info);
    free(info);
    /* the shipped configs' tokenizers (links to models/shapes-flux-tiny's files, SD3's own
     * configs for CLIP-G and T5) tokenize as the golden pipelines' real ones */
    static const char *const pairs[][2] = {{"flux1-dev", FLUX_DIR}, {"flux1-schnell", "pipelines/flux1_schnell_tiny"},
                                           {"sd3.5-medium", SD3_DIR}, {"sd3-medium", SD3_DIR}, {"sd3.5-large", SD3_DIR}};
    for (int k = 0; k < 5; k++) {
        const char *prompt = "a red fox, <|endoftext|> in the snow! 1234 naïve café</s> ok";
        rc = tu_system("'%s' tokenize --model '%s/../models/configs/%s' --prompt '%s' >'%s/t1.txt' 2>&1 && "
                       "'%s' tokenize --model '%s' --prompt '%s' >'%s/t2.txt' 2>&1", CDF_CLI_PATH, CDF_TEST_DATA "/..", pairs[k][0],
                       prompt, dir, CDF_CLI_PATH, tu_data(pairs[k][1]), prompt, dir);
        char *t1 = tu_read_file(tu_tmp_path("t1.txt"), NULL), *t2 = tu_read_file(tu_tmp_path("t2.txt"), NULL);
        if (rc != 0 || !t1 || !t2 || strcmp(t1, t2) != 0 || !strstr(t1, "tokenizer_2: "))
            fail_msg("tokenizers of models/configs/%s: exit %d:\n%s\nvs %s:\n%s", pairs[k][0], rc, t1, pairs[k][1], t2);
        free(t1);
        free(t2);
    }
    rc = tu_system("'%s' plan --model '%s' --config '%s' --height 64 --width 64 >'%s/plan.txt' 2>&1", CDF_CLI_PATH, aio, tiny, dir);
    char *plan = tu_read_file(tu_tmp_path("plan.txt"), NULL);
    if (rc != 0 || !strstr(plan, "expected peak")) fail_msg("plan: exit %d: %s", rc, plan);
    free(plan);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_recognise),
        cmocka_unit_test(test_flux_same_latents),
        cmocka_unit_test(test_sd3_same_latents),
        cmocka_unit_test(test_plan),
        cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
