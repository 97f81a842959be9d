/* cdf_convert_to_gguf / `cdiffusers convert` and the GGUF writer under it.
 *
 * - writer: a file with metadata, an alignment of 64 and tensors of several types reads back
 *   through cdf_gguf_open with the same names, shapes, types and bytes; bad tensors are refused;
 * - round trips through the tiny FLUX.1 pipeline (2-step f32 generations, latents_final):
 *   F32 file == the folder, bit for bit (and the same from the BFL-layout file);
 *   Q8_0 / Q4_K file: its blocks are the load-time encoder's, and the generation equals the
 *   folder's under --weight-type q8_0 / q4_k bit for bit (the option then only reaches the text
 *   encoders, which it quantizes in both runs);
 *   the same for the tiny SD3.5 and FLUX.2 transformers (F32, Q8_0);
 * - --format diffusers: the BFL file as a sharded diffusers folder in a copy of the pipeline gives
 *   the folder's latents;
 * - failures: an output folder that does not exist, an existing output without overwrite, a
 *   file-size limit hit mid-write (the command line under `ulimit -f`), a bad type, a missing
 *   component: a clear error each, and no partial file left behind. */
#include "testutil.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdiffusers/convert.h"
#include "cdiffusers/io.h"
#include "cdiffusers/pipeline.h"

#define MODEL "pipelines/flux1_dev_tiny"

/* Files in the temporary folder whose name starts with `prefix` (temporaries are "<name>.tmp.*"). */
static int count_files(const char *prefix) {
    DIR *d = opendir(tu_tmpdir());
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

static void test_writer_reads_back(void **state) {
    (void)state;
    cdf_gguf_writer *w = cdf_gguf_writer_new(64);
    assert_non_null(w);
    float a[3 * 5];
    for (int i = 0; i < 15; i++) a[i] = (float)i - 7.5f;
    uint16_t b[4] = {0x3f80, 0xc000, 0x0001, 0x7f80}; /* bf16 1, -2, a subnormal, inf */
    float q[2 * 256];
    tu_fill_random(q, 512, 5);
    uint8_t qb[2 * 144];
    assert_int_equal(cdf_ggml_quantize(CDF_GGML_Q4_K, q, 512, qb), CDF_OK);
    assert_int_equal(cdf_gguf_writer_set_string(w, "general.architecture", "flux"), CDF_OK);
    assert_int_equal(cdf_gguf_writer_set_u32(w, "x.count", 7), CDF_OK);
    assert_int_equal(cdf_gguf_writer_set_u32(w, "x.count", 8), CDF_ERR_INVALID_ARG); /* repeated key */
    assert_int_equal(cdf_gguf_writer_add(w, "a.weight", CDF_GGML_F32, 2, (int64_t[]){3, 5}, a), CDF_OK);
    assert_int_equal(cdf_gguf_writer_add(w, "b.bias", CDF_GGML_BF16, 1, (int64_t[]){4}, b), CDF_OK);
    assert_int_equal(cdf_gguf_writer_add(w, "q.weight", CDF_GGML_Q4_K, 2, (int64_t[]){2, 256}, qb), CDF_OK);
    assert_int_equal(cdf_gguf_writer_add(w, "a.weight", CDF_GGML_F32, 1, (int64_t[]){1}, a), CDF_ERR_INVALID_ARG);
    assert_int_equal(cdf_gguf_writer_add(w, "r.weight", CDF_GGML_Q8_0, 2, (int64_t[]){2, 48}, qb), CDF_ERR_INVALID_ARG);
    assert_non_null(strstr(cdf_last_error(), "not whole Q8_0 blocks"));
    assert_int_equal(cdf_gguf_writer_add(w, "z.weight", CDF_GGML_F32, 2, (int64_t[]){0, 4}, a), CDF_ERR_INVALID_ARG);
    assert_int_equal(cdf_gguf_writer_add(w, "t.weight", 99, 1, (int64_t[]){4}, a), CDF_ERR_INVALID_ARG);
    assert_int_equal(cdf_gguf_writer_count(w), 3);
    const char *path = tu_tmp_path("w.gguf");
    assert_int_equal(cdf_gguf_writer_save(w, path, false, NULL, NULL), CDF_OK);
    size_t len;
    char *bytes = tu_read_file(path, &len);
    assert_non_null(bytes);
    assert_int_equal(len, cdf_gguf_writer_file_size(w));
    assert_memory_equal(bytes, "GGUF\x03\0\0\0", 8);
    free(bytes);
    cdf_gguf_writer_free(w);

    cdf_gguf_file *f = NULL;
    assert_int_equal(cdf_gguf_open(path, &f), CDF_OK);
    assert_int_equal(cdf_gguf_version(f), 3);
    assert_int_equal(cdf_gguf_alignment(f), 64);
    assert_string_equal(cdf_gguf_get_string(f, "general.architecture"), "flux");
    int64_t v = 0;
    assert_true(cdf_gguf_get_int(f, "x.count", &v));
    assert_int_equal(v, 7);
    assert_int_equal(cdf_gguf_count(f), 3);
    const struct { const char *name; uint32_t type; int ndim; int64_t d0, d1; const void *data; size_t n; } want[] = {
        {"a.weight", CDF_GGML_F32, 2, 3, 5, a, sizeof a}, {"b.bias", CDF_GGML_BF16, 1, 4, 0, b, sizeof b},
        {"q.weight", CDF_GGML_Q4_K, 2, 2, 256, qb, sizeof qb}};
    for (int i = 0; i < 3; i++) {
        const cdf_gguf_tensor *t = cdf_gguf_tensor_at(f, i);
        assert_string_equal(t->name, want[i].name);
        assert_int_equal(t->type, want[i].type);
        assert_int_equal(t->ndim, want[i].ndim);
        assert_int_equal(t->shape[0], want[i].d0);
        if (t->ndim == 2) assert_int_equal(t->shape[1], want[i].d1);
        assert_int_equal(t->nbytes, want[i].n);
        assert_int_equal(t->offset % 64, 0);
        assert_memory_equal(cdf_gguf_data(f, t), want[i].data, want[i].n);
    }
    cdf_gguf_close(f);
    /* an existing file is not replaced unless asked */
    w = cdf_gguf_writer_new(0);
    assert_int_equal(cdf_gguf_writer_add(w, "a.weight", CDF_GGML_F32, 1, (int64_t[]){4}, NULL), CDF_OK);
    assert_int_equal(cdf_gguf_writer_save(w, path, true, NULL, NULL), CDF_ERR_INVALID_ARG); /* no data, no fill */
    assert_int_equal(cdf_gguf_writer_save(w, tu_tmp_path("nodir/x.gguf"), false, NULL, NULL), CDF_ERR_INVALID_ARG);
    cdf_gguf_writer_free(w);
    assert_int_equal(count_files("w.gguf"), 1);
}

/* latents_final of a 2-step f32 generation of the tiny FLUX.1 pipeline (malloc'd, *n floats). */
static float *generate_model(const char *model, const char *transformer_file, uint32_t quantize, size_t *n) {
    cdf_pipeline_load_params lp = cdf_pipeline_load_params_default();
    lp.device = "cpu";
    lp.weight_dtype = CDF_F32;
    lp.quantize_weights = quantize;
    cdf_component_file cf = {"transformer", transformer_file};
    if (transformer_file) lp.component_files = &cf, lp.num_component_files = 1;
    cdf_pipeline *p = NULL;
    if (cdf_pipeline_load(tu_data(model), &lp, &p) != CDF_OK) fail_msg("load: %s", cdf_last_error());
    float *v = tu_generate_capture(p, "latents_final", n);
    cdf_pipeline_free(p);
    return v;
}

static float *generate(const char *transformer_file, uint32_t quantize, size_t *n) {
    return generate_model(MODEL, transformer_file, quantize, n);
}

static const char *convert(const char *out, uint32_t type, const char *weights_file, cdf_convert_report *r) {
    cdf_convert_params p = cdf_convert_params_default();
    p.model = tu_data(MODEL);
    p.output = tu_tmp_path(out);
    p.type = type;
    p.weights_file = weights_file;
    if (cdf_convert_to_gguf(&p, r) != CDF_OK) fail_msg("convert to %s: %s", out, cdf_last_error());
    return p.output;
}

/* The number of tensors of ggml type `type` in a GGUF file. */
static int count_type(const char *path, uint32_t type) {
    cdf_gguf_file *f = NULL;
    assert_int_equal(cdf_gguf_open(path, &f), CDF_OK);
    int n = 0;
    for (int i = 0; i < cdf_gguf_count(f); i++) n += cdf_gguf_tensor_at(f, i)->type == type;
    cdf_gguf_close(f);
    return n;
}

/* The tensors of `type` in a GGUF file whose blocks equal cdf_ggml_quantize of the folder's
 * values (what --weight-type does at load, test_formats_single_file); fails on any other. */
static int same_blocks_as_encoder(const char *path, uint32_t type) {
    cdf_gguf_file *f = NULL;
    cdf_st_file *src = NULL;
    assert_int_equal(cdf_gguf_open(path, &f), CDF_OK);
    assert_int_equal(cdf_st_open(tu_data(MODEL "/transformer/diffusion_pytorch_model.safetensors"), &src), CDF_OK);
    int n = 0;
    for (int i = 0; i < cdf_gguf_count(f); i++) {
        const cdf_gguf_tensor *t = cdf_gguf_tensor_at(f, i);
        if (t->type != type) continue;
        const cdf_st_tensor *st = cdf_st_find(src, t->name);
        assert_non_null(st);
        assert_int_equal(st->dtype, CDF_F32);
        uint8_t *want = malloc(t->nbytes);
        assert_int_equal(cdf_ggml_quantize(type, cdf_st_data(src, st), cdf_st_numel(st), want), CDF_OK);
        if (memcmp(want, cdf_gguf_data(f, t), t->nbytes) != 0) fail_msg("%s: blocks differ from the encoder's", t->name);
        free(want);
        n++;
    }
    cdf_st_close(src);
    cdf_gguf_close(f);
    return n;
}

static void test_round_trips(void **state) {
    (void)state;
    size_t n0, n;
    float *folder = generate(NULL, 0, &n0);
    cdf_convert_report r;

    const char *f32 = convert("t_f32.gguf", CDF_GGML_F32, NULL, &r);
    assert_int_equal(r.tensors, 112); /* every tensor of the transformer folder */
    assert_int_equal(r.quantized, 0);
    assert_int_equal(count_type(f32, CDF_GGML_F32), 112);
    float *v = generate(f32, 0, &n);
    assert_int_equal(n, n0);
    assert_memory_equal(v, folder, n * 4);
    free(v);

    /* from the BFL-layout single file (fused qkv split, renamed) to the same diffusers tensors */
    const char *bfl = convert("t_bfl.gguf", CDF_GGML_F32, tu_data("formats/flux_single/flux_bfl.safetensors"), &r);
    assert_int_equal(r.tensors, 112);
    v = generate(bfl, 0, &n);
    assert_memory_equal(v, folder, n * 4);
    free(v);

    /* Q8_0: every linear weight with whole 32-value rows is Q8_0 (48 here; the 24-input
     * context_embedder and 8-input text embedder are not), norms and biases stay F32. Each block
     * tensor is the load-time encoder's output for the folder's values. --weight-type applies to
     * every component (the text encoders too), so the folder's q8_0 generation is compared with
     * the file's under the same option: the file's transformer weights are blocks already (kept as
     * they are), the 2 float linear weights cannot be quantized, so the option only reaches the
     * text encoders, as in the folder's run. */
    float *q8_folder = generate(NULL, CDF_GGML_Q8_0, &n);
    const char *q8 = convert("t_q8.gguf", CDF_GGML_Q8_0, NULL, &r);
    assert_int_equal(r.quantized, 48);
    assert_int_equal(count_type(q8, CDF_GGML_Q8_0), 48);
    assert_int_equal(count_type(q8, CDF_GGML_F32), 112 - 48);
    assert_int_equal(same_blocks_as_encoder(q8, CDF_GGML_Q8_0), 48);
    v = generate(q8, CDF_GGML_Q8_0, &n);
    assert_memory_equal(v, q8_folder, n * 4);
    assert_memory_not_equal(v, folder, n * 4);
    free(v);
    /* converting that file to Q8_0 again copies its blocks: the same file */
    cdf_convert_params p = cdf_convert_params_default();
    p.model = tu_data(MODEL);
    p.weights_file = q8;
    p.output = tu_tmp_path("t_q8_again.gguf");
    p.type = CDF_GGML_Q8_0;
    assert_int_equal(cdf_convert_to_gguf(&p, &r), CDF_OK);
    size_t la, lb;
    char *a = tu_read_file(q8, &la), *b = tu_read_file(p.output, &lb);
    assert_int_equal(la, lb);
    assert_memory_equal(a, b, la);
    free(a);
    free(b);
    free(q8_folder);

    /* Q4_K: the two 256-input embedder layers */
    float *q4_folder = generate(NULL, CDF_GGML_Q4_K, &n);
    const char *q4 = convert("t_q4k.gguf", CDF_GGML_Q4_K, NULL, &r);
    assert_int_equal(r.quantized, 2);
    assert_int_equal(count_type(q4, CDF_GGML_Q4_K), 2);
    assert_int_equal(same_blocks_as_encoder(q4, CDF_GGML_Q4_K), 2);
    v = generate(q4, CDF_GGML_Q4_K, &n);
    assert_memory_equal(v, q4_folder, n * 4);
    free(v);
    free(q4_folder);

    /* BF16: 2-d tensors BF16, 1-d F32 */
    const char *bf = convert("t_bf16.gguf", CDF_GGML_BF16, NULL, &r);
    assert_int_equal(count_type(bf, CDF_GGML_BF16) + count_type(bf, CDF_GGML_F32), 112);
    assert_true(count_type(bf, CDF_GGML_BF16) >= 48);
    free(folder);
}

/* The SD3.5 and FLUX.2 transformers: F32 and Q8_0 files round-trip the same way. */
static void test_round_trips_sd3_flux2(void **state) {
    (void)state;
    static const char *const models[] = {"pipelines/sd35m_tiny", "pipelines/flux2_dev_tiny"};
    for (int m = 0; m < 2; m++) {
        size_t n0, n;
        float *folder = generate_model(models[m], NULL, 0, &n0), *q8_folder = generate_model(models[m], NULL, CDF_GGML_Q8_0, &n);
        cdf_convert_params p = cdf_convert_params_default();
        p.model = tu_data(models[m]);
        for (int q = 0; q < 2; q++) {
            p.type = q ? CDF_GGML_Q8_0 : CDF_GGML_F32;
            p.output = tu_tmp_path(q ? "m_q8.gguf" : "m_f32.gguf");
            p.overwrite = true;
            cdf_convert_report r;
            if (cdf_convert_to_gguf(&p, &r) != CDF_OK) fail_msg("%s: %s", models[m], cdf_last_error());
            assert_true(q ? r.quantized > 0 : r.quantized == 0);
            float *v = generate_model(models[m], p.output, q ? CDF_GGML_Q8_0 : 0, &n);
            assert_int_equal(n, n0);
            assert_memory_equal(v, q ? q8_folder : folder, n * 4);
            free(v);
        }
        free(folder);
        free(q8_folder);
    }
}

/* --format diffusers: the transformer of the BFL-layout file as a sharded diffusers folder (small
 * shards so there are several, with the index), put into a copy of the pipeline folder in place of
 * the original transformer: the same latents. */
static void test_diffusers_folder(void **state) {
    (void)state;
    size_t n0, n;
    float *folder = generate(NULL, 0, &n0);
    cdf_convert_params p = cdf_convert_params_default();
    p.model = tu_data(MODEL);
    p.weights_file = tu_data("formats/flux_single/flux_bfl.safetensors");
    p.output = tu_tmp_path("pipe/transformer");
    p.max_shard_bytes = 100000;
    assert_int_equal(tu_system("mkdir -p '%s/pipe' && cd '%s' && for f in *; do [ \"$f\" = transformer ] || ln -s \"$PWD/$f\" '%s/pipe/'; done",
                               tu_tmpdir(), tu_data(MODEL), tu_tmpdir()),
                     0);
    cdf_convert_report r;
    if (cdf_convert_to_diffusers(&p, &r) != CDF_OK) fail_msg("%s", cdf_last_error());
    assert_int_equal(r.tensors, 112);
    assert_int_equal(tu_system("test -f '%s/diffusion_pytorch_model.safetensors.index.json' && test -f '%s/config.json' && "
                               "ls '%s' | grep -c 'diffusion_pytorch_model-0000[0-9]-of-0000[0-9].safetensors' | grep -qv '^[01]$'",
                               p.output, p.output, p.output),
                     0);
    /* generate from the new pipeline folder */
    char pipe[1024];
    snprintf(pipe, sizeof pipe, "%s/pipe", tu_tmpdir());
    cdf_pipeline_load_params l2 = cdf_pipeline_load_params_default();
    l2.device = "cpu";
    l2.weight_dtype = CDF_F32;
    cdf_pipeline *pl = NULL;
    if (cdf_pipeline_load(pipe, &l2, &pl) != CDF_OK) fail_msg("load: %s", cdf_last_error());
    float *v = tu_generate_capture(pl, "latents_final", &n);
    assert_int_equal(n, n0);
    cdf_pipeline_free(pl);
    assert_memory_equal(v, folder, n * 4);
    free(v);
    free(folder);
    /* an existing folder is not replaced; block types do not go into safetensors */
    assert_int_equal(cdf_convert_to_diffusers(&p, NULL), CDF_ERR_IO);
    assert_non_null(strstr(cdf_last_error(), "already exists"));
    p.output = tu_tmp_path("pipe/q8");
    p.type = CDF_GGML_Q8_0;
    assert_int_equal(cdf_convert_to_diffusers(&p, NULL), CDF_ERR_INVALID_ARG);
    p.type = CDF_GGML_F32;
    p.output = tu_tmp_path("nodir/sub/t");
    assert_int_equal(cdf_convert_to_diffusers(&p, NULL), CDF_ERR_IO);
    assert_int_equal(count_files("nodir"), 0);
    assert_int_equal(tu_system("ls '%s/pipe' | grep -q tmp", tu_tmpdir()), 1); /* no temporary left */
}

static void test_failures(void **state) {
    (void)state;
    cdf_convert_params p = cdf_convert_params_default();
    p.model = tu_data(MODEL);
    p.type = CDF_GGML_F32;

    p.output = tu_tmp_path("missing/out.gguf");
    assert_int_equal(cdf_convert_to_gguf(&p, NULL), CDF_ERR_IO);
    assert_non_null(strstr(cdf_last_error(), "does not exist"));
    assert_int_equal(count_files("missing"), 0);

    p.output = tu_tmp_path("exists.gguf");
    assert_int_equal(tu_write_file(p.output, "keep", 4), 0);
    assert_int_equal(cdf_convert_to_gguf(&p, NULL), CDF_ERR_IO);
    char *kept = tu_read_file(p.output, NULL);
    assert_string_equal(kept, "keep"); /* untouched */
    free(kept);
    assert_int_equal(count_files("exists.gguf"), 1); /* and no temporary left */

    p.output = tu_tmp_path("bad.gguf");
    p.type = CDF_GGML_Q5_K;
    assert_int_equal(cdf_convert_to_gguf(&p, NULL), CDF_ERR_INVALID_ARG);
    assert_non_null(strstr(cdf_last_error(), "Q5_K"));
    p.type = CDF_GGML_F32;
    p.component = "unet";
    assert_int_equal(cdf_convert_to_gguf(&p, NULL), CDF_ERR_NOT_FOUND);
    assert_non_null(strstr(cdf_last_error(), "unet"));
    p.component = NULL;
    p.weights_file = "/nonexistent/t.gguf";
    assert_int_equal(cdf_convert_to_gguf(&p, NULL), CDF_ERR_NOT_FOUND);
    p.weights_file = tu_data("formats/flux_single/ae_ldm.safetensors"); /* a VAE file as the transformer */
    assert_int_equal(cdf_convert_to_gguf(&p, NULL), CDF_ERR_NOT_FOUND);
    assert_int_equal(count_files("bad.gguf"), 0);

    /* the command line: a file-size limit of 128 KiB stops the 0.5 MiB F32 file mid-write */
    const char *dir = tu_tmpdir(), *model = tu_data(MODEL);
    int rc = tu_system("cd '%s' && (ulimit -f 128; '%s' convert --model '%s' --output cut.gguf --type f32) 2>err.txt", dir,
                       CDF_CLI_PATH, model);
    assert_int_equal(rc, 1);
    char *err = tu_read_file(tu_tmp_path("err.txt"), NULL);
    assert_non_null(err);
    if (!strstr(err, "cut.gguf") || !strstr(err, "too large")) fail_msg("stderr: %s", err);
    free(err);
    assert_int_equal(count_files("cut.gguf"), 0);
    /* usage errors */
    rc = tu_system("cd '%s' && '%s' convert --model '%s' --output u.gguf --type q5_k 2>err.txt", dir, CDF_CLI_PATH, model);
    assert_int_equal(rc, 2);
    rc = tu_system("cd '%s' && '%s' convert --output u.gguf 2>err.txt", dir, CDF_CLI_PATH);
    assert_int_equal(rc, 2);
    rc = tu_system("cd '%s' && '%s' convert --model '%s' --output ok.gguf --type q8_0 --quiet 2>err.txt", dir, CDF_CLI_PATH,
                   model);
    assert_int_equal(rc, 0);
    assert_int_equal(count_type(tu_tmp_path("ok.gguf"), CDF_GGML_Q8_0), 48);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_writer_reads_back),
        cmocka_unit_test(test_round_trips),
        cmocka_unit_test(test_round_trips_sd3_flux2),
        cmocka_unit_test(test_diffusers_folder),
        cmocka_unit_test(test_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
