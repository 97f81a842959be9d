/* The command-line tool against bad input: every row of the robustness matrix in
 * docs/ROBUSTNESS.md is one test here. Each test builds its broken model folder in a temporary
 * directory (symlinks to the golden tiny FLUX.1-schnell pipeline, with real copies of whatever
 * it damages), runs `cdiffusers` as a child process, and checks three things:
 *   - the exit code (0 ok, 1 failure, 2 usage error, 130 interrupted);
 *   - a specific piece of the message on stderr (the file, tensor, key or limit involved);
 *   - that no output file appeared (or an existing one kept its bytes and mtime), and that no
 *     temporary "*.tmp.*" file was left behind.
 * A sanitizer report on stderr fails every test (the suite also runs under ASan/UBSan). */
#include "testutil.h"

#include "cdiffusers/cdiffusers.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <utime.h>

#define GOLDEN_SCHNELL "pipelines/flux1_schnell_tiny"
#define GOLDEN_SD35 "pipelines/sd35m_tiny"
#define ST_FILE "transformer/diffusion_pytorch_model.safetensors"
/* a quick, valid request for the tiny pipelines (2 steps at 64x64) */
#define GEN_ARGS "generate --model model --prompt 'a red fox' --height 64 --width 64 --steps 2 --seed 1 --output out.png --quiet"

enum { RC_OK = 0, RC_FAIL = 1, RC_USAGE = 2, RC_INTERRUPTED = 130 };

/* One test's scratch folder: <tmp>/<name>/ holding model/ (the pipeline), out.png (the output
 * path every command uses), stdout.txt and stderr.txt. */
typedef struct case_dir {
    char root[512];
    char model[600];
    char out[600];
} case_dir;

static char g_err[1 << 16]; /* stderr of the last command */

static void case_new(case_dir *c, const char *name) {
    snprintf(c->root, sizeof c->root, "%s/%s", tu_tmpdir(), name);
    snprintf(c->model, sizeof c->model, "%s/model", c->root);
    snprintf(c->out, sizeof c->out, "%s/out.png", c->root);
    assert_int_equal(tu_system("rm -rf '%s' && mkdir -p '%s'", c->root, c->root), 0);
}

/* model/ = the golden pipeline `golden` (relative to tests/data) with every top-level entry
 * linked, except the NULL-terminated `copies`, which are real copies (links resolved) that the
 * test may damage. */
static void case_pipeline(case_dir *c, const char *golden, const char *const *copies) {
    const char *g = tu_data(golden);
    assert_int_equal(tu_system("mkdir -p '%s' && cd '%s' && for e in *; do [ \"$e\" = cases ] || ln -s \"$PWD/$e\" '%s/'\"$e\" "
                               "|| exit 1; done",
                               c->model, g, c->model),
                     0);
    for (int i = 0; copies && copies[i]; i++)
        assert_int_equal(tu_system("rm '%s/%s' && cp -rL '%s/%s' '%s/%s'", c->model, copies[i], g, copies[i], c->model, copies[i]), 0);
}

static const char *case_path(const case_dir *c, const char *rel) {
    static char buf[4][1024];
    static int slot;
    char *b = buf[slot++ & 3];
    snprintf(b, 1024, "%s/%s", c->model, rel);
    return b;
}

/* Run `cdiffusers <args>` in c->root with optional environment assignments `env`; returns the
 * exit status and keeps stderr in g_err. */
static int run_cli(const case_dir *c, const char *env, const char *fmt, ...) {
    char args[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    int rc = tu_system("cd '%s' && %s '%s' %s >'%s/stdout.txt' 2>'%s/stderr.txt' </dev/null", c->root, env ? env : "",
                       CDF_CLI_PATH, args, c->root, c->root);
    char path[700];
    snprintf(path, sizeof path, "%s/stderr.txt", c->root);
    size_t n = 0;
    char *e = tu_read_file(path, &n);
    snprintf(g_err, sizeof g_err, "%s", e ? e : "");
    free(e);
    if (getenv("CDF_TEST_VERBOSE")) print_message("$ cdiffusers %s  -> exit %d\n%s", args, rc, g_err);
    if (strstr(g_err, "Sanitizer") || strstr(g_err, "runtime error:")) {
        print_message("sanitizer report from `cdiffusers %s`:\n%s\n", args, g_err);
        fail();
    }
    return rc;
}

/* Exit code and every NULL-terminated needle on stderr, or print the whole stderr and fail. */
static void expect_(int rc, int want, const char *const *needles, const char *file, int line) {
    bool ok = rc == want;
    for (int i = 0; ok && needles[i]; i++) ok = strstr(g_err, needles[i]) != NULL;
    if (!ok) {
        print_message("%s:%d: exit code %d (want %d); stderr:\n%s\nexpected to contain:", file, line, rc, want, g_err);
        for (int i = 0; needles[i]; i++) print_message(" [%s]%s", needles[i], strstr(g_err, needles[i]) ? "" : " <- missing");
        print_message("\n");
        fail();
    }
}
#define expect(rc, want, ...) expect_((rc), (want), (const char *const[]){__VA_ARGS__, NULL}, __FILE__, __LINE__)

/* No output file and no temporary file left in c->root. */
static void expect_no_output(const case_dir *c) {
    struct stat st;
    if (stat(c->out, &st) == 0) {
        print_message("output %s was created\n", c->out);
        fail();
    }
    DIR *d = opendir(c->root);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strstr(e->d_name, ".tmp.")) {
            print_message("temporary file %s/%s was left behind\n", c->root, e->d_name);
            closedir(d);
            fail();
        }
    }
    closedir(d);
}

/* Every load-time failure: generate fails with `needles`, nothing is written; `info` on the same
 * folder does not crash (it reports broken components but need not fail). */
#define expect_generate_fails(c, ...)                                                                             \
    do {                                                                                                          \
        int rc_ = run_cli((c), NULL, GEN_ARGS);                                                                   \
        expect(rc_, RC_FAIL, __VA_ARGS__);                                                                        \
        expect_no_output(c);                                                                                      \
        int irc_ = run_cli((c), NULL, "info --model model");                                                       \
        if (irc_ != RC_OK && irc_ != RC_FAIL) {                                                                   \
            print_message("info crashed (exit %d):\n%s\n", irc_, g_err);                                          \
            fail();                                                                                               \
        }                                                                                                         \
    } while (0)

/* ---- safetensors surgery ------------------------------------------------------------------ */

static void put_le64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

typedef void (*header_edit)(cJSON *header, uint64_t data_size);

/* Rewrite the JSON header of a safetensors file in place; the data section is kept byte for
 * byte (offsets are relative to it, so only the edit changes what they mean). */
static void st_edit(const char *path, header_edit edit) {
    size_t len = 0;
    unsigned char *raw = (unsigned char *)tu_read_file(path, &len);
    assert_non_null(raw);
    assert_true(len >= 8);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | raw[i];
    assert_true(hlen <= len - 8);
    cJSON *h = cJSON_ParseWithLength((const char *)raw + 8, (size_t)hlen);
    assert_non_null(h);
    uint64_t data_size = len - 8 - hlen;
    edit(h, data_size);
    char *js = cJSON_PrintUnformatted(h);
    assert_non_null(js);
    size_t jn = strlen(js);
    unsigned char *out = malloc(8 + jn + data_size);
    assert_non_null(out);
    put_le64(out, jn);
    memcpy(out + 8, js, jn);
    memcpy(out + 8 + jn, raw + 8 + hlen, data_size);
    assert_int_equal(tu_write_file(path, out, 8 + jn + data_size), 0);
    free(out);
    free(js);
    cJSON_Delete(h);
    free(raw);
}

static cJSON *st_entry(cJSON *h, const char *name) {
    cJSON *e = cJSON_GetObjectItemCaseSensitive(h, name);
    if (!e) {
        print_message("golden transformer has no tensor '%s'\n", name);
        fail();
    }
    return e;
}

static void set_offsets(cJSON *e, double begin, double end) {
    cJSON *a = cJSON_CreateArray();
    cJSON_AddItemToArray(a, cJSON_CreateNumber(begin));
    cJSON_AddItemToArray(a, cJSON_CreateNumber(end));
    cJSON_ReplaceItemInObjectCaseSensitive(e, "data_offsets", a);
}

static void set_shape(cJSON *e, int n, const double *dims) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(dims[i]));
    cJSON_ReplaceItemInObjectCaseSensitive(e, "shape", a);
}

static double offset_of(cJSON *e, int which) {
    return cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(e, "data_offsets"), which)->valuedouble;
}

/* proj_out.bias and norm_out.linear.bias are both F32 [64]: give the first the second's bytes */
static void edit_overlap(cJSON *h, uint64_t data_size) {
    cJSON *a = st_entry(h, "proj_out.bias"), *b = st_entry(h, "norm_out.linear.bias");
    assert_true(offset_of(a, 1) - offset_of(a, 0) == offset_of(b, 1) - offset_of(b, 0));
    set_offsets(a, offset_of(b, 0), offset_of(b, 1));
}

static void edit_outside(cJSON *h, uint64_t data_size) {
    cJSON *a = st_entry(h, "proj_out.bias");
    double n = offset_of(a, 1) - offset_of(a, 0);
    set_offsets(a, (double)data_size, (double)data_size + n);
}

static void edit_shape_product(cJSON *h, uint64_t data_size) {
    cJSON *a = st_entry(h, "context_embedder.bias"); /* F32 [32]: 128 bytes */
    assert_int_equal((int)(offset_of(a, 1) - offset_of(a, 0)), 128);
    set_shape(a, 1, (const double[]){33});
}

static void edit_unknown_dtype(cJSON *h, uint64_t data_size) {
    cJSON_ReplaceItemInObjectCaseSensitive(st_entry(h, "context_embedder.bias"), "dtype", cJSON_CreateString("F33"));
}

static void edit_drop_tensor(cJSON *h, uint64_t data_size) {
    st_entry(h, "proj_out.weight");
    cJSON_DeleteItemFromObjectCaseSensitive(h, "proj_out.weight");
}

/* context_embedder.weight is [inner 32, joint_attention_dim 24]: [24, 32] has the same bytes,
 * so the file is valid, but it contradicts config.json */
static void edit_transpose(cJSON *h, uint64_t data_size) {
    cJSON *a = st_entry(h, "context_embedder.weight");
    cJSON *s = cJSON_GetObjectItemCaseSensitive(a, "shape");
    assert_int_equal(cJSON_GetArraySize(s), 2);
    assert_int_equal((int)cJSON_GetArrayItem(s, 0)->valuedouble, 32);
    assert_int_equal((int)cJSON_GetArrayItem(s, 1)->valuedouble, 24);
    set_shape(a, 2, (const double[]){24, 32});
}

static void truncate_file(const char *path, double fraction) {
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(truncate(path, (off_t)(st.st_size * fraction)), 0);
}

/* ---- safetensors in the transformer folder ---------------------------------------------------- */

static void test_st_truncated(void **state) {
    case_dir c;
    case_new(&c, "st_truncated");
    case_pipeline(&c, GOLDEN_SCHNELL, (const char *[]){"transformer", NULL});
    truncate_file(case_path(&c, ST_FILE), 0.5);
    expect_generate_fails(&c, "diffusion_pytorch_model.safetensors", "truncated");
}

static void test_st_header_length_beyond_file(void **state) {
    case_dir c;
    case_new(&c, "st_header_len");
    case_pipeline(&c, GOLDEN_SCHNELL, (const char *[]){"transformer", NULL});
    const char *p = case_path(&c, ST_FILE);
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    int fd = open(p, O_WRONLY);
    assert_true(fd >= 0);
    unsigned char le[8];
    put_le64(le, (uint64_t)st.st_size); /* more than the st_size - 8 bytes after the field */
    assert_int_equal(pwrite(fd, le, 8, 0), 8);
    close(fd);
    char want[64];
    snprintf(want, sizeof want, "header length %lld exceeds", (long long)st.st_size);
    expect_generate_fails(&c, "diffusion_pytorch_model.safetensors", want);
}

static void test_st_offsets_overlap(void **state) {
    case_dir c;
    case_new(&c, "st_overlap");
    case_pipeline(&c, GOLDEN_SCHNELL, (const char *[]){"transformer", NULL});
    st_edit(case_path(&c, ST_FILE), edit_overlap);
    expect_generate_fails(&c, "'proj_out.bias'", "'norm_out.linear.bias'", "overlap");
}

static void test_st_offsets_outside_data(void **state) {
    case_dir c;
    case_new(&c, "st_outside");
    case_pipeline(&c, GOLDEN_SCHNELL, (const char *[]){"transformer", NULL});
    st_edit(case_path(&c, ST_FILE), edit_outside);
    expect_generate_fails(&c, "'proj_out.bias'", "beyond the data section");
}

static void test_st_dtype_shape_mismatch(void **state) {
    case_dir c;
    case_new(&c, "st_shape_product");
    case_pipeline(&c, GOLDEN_SCHNELL, (const char *[]){"transformer", NULL});
    st_edit(case_path(&c, ST_FILE), edit_shape_product);
    /* 33 F32 elements need 132 bytes; the offsets span 128 */
    expect_generate_fails(&c, "'context_embedder.bias'", "128", "132");
}

static void test_st_unknown_dtype(void **state) {
    case_dir c;
    case_new(&c, "st_dtype");
    case_pipeline(&c, GOLDEN_SCHNELL, (const char *[]){"transformer", NULL});
    st_edit(case_path(&c, ST_FILE), edit_unknown_dtype);
    expect_generate_fails(&c, "unknown dtype 'F33'", "'context_embedder.bias'");
}

static void test_st_missing_tensor(void **state) {
    case_dir c;
    case_new(&c, "st_missing");
    case_pipeline(&c, GOLDEN_SCHNELL, (const char *[]){"transformer", NULL});
    st_edit(case_path(&c, ST_FILE), edit_drop_tensor);
    expect_generate_fails(&c, "'proj_out.weight'", "missing");
}

static void test_st_shape_vs_config(void **state) {
    case_dir c;
    case_new(&c, "st_shape_config");
    case_pipeline(&c, GOLDEN_SCHNELL, (const char *[]){"transformer", NULL});
    st_edit(case_path(&c, ST_FILE), edit_transpose);
    expect_generate_fails(&c, "'context_embedder.weight'", "[24, 32]", "[32, 24]");
}

/* Not an error: the safetensors format does not require the header to be padded, so the data
 * section may start at any offset and every tensor in it be misaligned for its dtype. Such a
 * file must load and give the same image as the padded original (under UBSan this was a
 * misaligned float load in cdf_convert; see docs/ROBUSTNESS.md, findings). */
static void unpad_header(const char *path) {
    size_t len = 0;
    unsigned char *raw = (unsigned char *)tu_read_file(path, &len);
    assert_non_null(raw);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | raw[i];
    assert_true(hlen <= len - 8);
    cJSON *h = cJSON_ParseWithLength((const char *)raw + 8, (size_t)hlen);
    assert_non_null(h);
    char *js = cJSON_PrintUnformatted(h);
    assert_non_null(js);
    size_t jn = strlen(js), pad = 0;
    while ((8 + jn + pad) % 8 != 1) pad++; /* data at an odd offset: misaligned for every dtype */
    uint64_t data_size = len - 8 - hlen;
    unsigned char *out = malloc(8 + jn + pad + data_size);
    assert_non_null(out);
    put_le64(out, jn + pad);
    memcpy(out + 8, js, jn);
    memset(out + 8 + jn, ' ', pad);
    memcpy(out + 8 + jn + pad, raw + 8 + hlen, data_size);
    assert_int_equal(tu_write_file(path, out, 8 + jn + pad + data_size), 0);
    free(out);
    free(js);
    cJSON_Delete(h);
    free(raw);
}

static void test_st_unaligned_data(void **state) {
    case_dir c;
    case_new(&c, "st_unaligned");
    case_pipeline(&c, GOLDEN_SCHNELL, (const char *[]){"transformer", "text_encoder", NULL});
    int rc = run_cli(&c, NULL, GEN_ARGS);
    expect(rc, RC_OK, "");
    char ref[700];
    snprintf(ref, sizeof ref, "%s/ref.png", c.root);
    assert_int_equal(rename(c.out, ref), 0);
    unpad_header(case_path(&c, ST_FILE));
    unpad_header(case_path(&c, "text_encoder/model.safetensors"));
    rc = run_cli(&c, NULL, GEN_ARGS);
    expect(rc, RC_OK, "");
    size_t na = 0, nb = 0;
    char *a = tu_read_file(ref, &na), *b = tu_read_file(c.out, &nb);
    assert_non_null(a);
    assert_non_null(b);
    assert_true(na == nb && memcmp(a, b, na) == 0);
    free(a);
    free(b);
}

/* ---- config.json / model_index.json / scheduler_config.json ------------------------------------ */

static void write_text(const char *path, const char *text) {
    assert_int_equal(tu_write_file(path, text, strlen(text)), 0);
}

/* path's JSON object with key set to the raw JSON text `value` */
static void json_set_raw(const char *path, const char *key, const char *value) {
    char *text = tu_read_file(path, NULL);
    assert_non_null(text);
    cJSON *root = cJSON_Parse(text);
    assert_non_null(root);
    cJSON *v = cJSON_Parse(value);
    assert_non_null(v);
    if (cJSON_HasObjectItem(root, key)) cJSON_ReplaceItemInObjectCaseSensitive(root, key, v);
    else cJSON_AddItemToObject(root, key, v);
    char *out = cJSON_Print(root);
    write_text(path, out);
    free(out);
    cJSON_Delete(root);
    free(text);
}

static void write_deep_json(const char *path, int depth) {
    size_t n = (size_t)depth * 6 + 16;
    char *s = malloc(n), *p = s;
    for (int i = 0; i < depth; i++) p += sprintf(p, "{\"a\":");
    p += sprintf(p, "1");
    for (int i = 0; i < depth; i++) *p++ = '}';
    *p = 0;
    write_text(path, s);
    free(s);
}

static void test_config_deep_nesting(void **state) {
    case_dir c;
    case_new(&c, "config_deep");
    case_pipeline(&c, GOLDEN_SCHNELL, (const char *[]){"transformer", NULL});
    write_deep_json(case_path(&c, "transformer/config.json"), 100000);
    expect_generate_fails(&c, "transformer/config.json", "deeper than the limit");
}

static void test_config_huge_number(void **state) {
    case_dir c;
    case_new(&c, "config_huge");
    case_pipeline(&c, GOLDEN_SCHNELL, (const char *[]){"transformer", NULL});
    /* an exact integer (below 2^53) far beyond any real model: must be refused before use */
    json_set_raw(case_path(&c, "transformer/config.json"), "num_layers", "4503599627370496");
    expect_generate_fails(&c, "transformer/config.json", "num_layers", "4503599627370496");
    /* beyond 2^53 (not exact in a double) and beyond the double range */
    json_set_raw(case_path(&c, "transformer/config.json"), "num_layers", "1e300");
    expect_generate_fails(&c, "num_layers");
    json_set_raw(case_path(&c, "transformer/config.json"), "num_layers", "-7");
    expect_generate_fails(&c, "num_layers");
}

static void test_config_wrong_type(void **state) {
    case_dir c;
    case_new(&c, "config_type");
    case_pipeline(&c, GOLDEN_SCHNELL, (const char *[]){"transformer", NULL});
    json_set_raw(case_path(&c, "transformer/config.json"), "num_attention_heads", "\"two\"");
    expect_generate_fails(&c, "num_attention_heads", "expected");
    json_set_raw(case_path(&c, "transformer/config.json"), "num_attention_heads", "[2]");
    expect_generate_fails(&c, "num_attention_heads");
    /* the top level is not an object at all */
    write_text(case_path(&c, "transformer/config.json"), "[1, 2, 3]");
    expect_generate_fails(&c, "transformer");
}

static void test_model_index_syntax(void **state) {
    case_dir c;
    case_new(&c, "index_syntax");
    case_pipeline(&c, GOLDEN_SCHNELL, (const char *[]){"model_index.json", NULL});
    truncate_file(case_path(&c, "model_index.json"), 0.5);
    expect_generate_fails(&c, "model_index.json", "not valid JSON");
    write_text(case_path(&c, "model_index.json"), "");
    expect_generate_fails(&c, "model_index.json", "empty");
    write_deep_json(case_path(&c, "model_index.json"), 5000);
    expect_generate_fails(&c, "model_index.json", "deeper than the limit");
}

static void test_model_index_wrong_types(void **state) {
    case_dir c;
    case_new(&c, "index_types");
    case_pipeline(&c, GOLDEN_SCHNELL, (const char *[]){"model_index.json", NULL});
    json_set_raw(case_path(&c, "model_index.json"), "_class_name", "7");
    expect_generate_fails(&c, "_class_name");
    json_set_raw(case_path(&c, "model_index.json"), "_class_name", "\"StableDiffusionXLPipeline\"");
    expect_generate_fails(&c, "StableDiffusionXLPipeline", "not supported");
}

/* A component entry that is present but not ["library", "Class"] is malformed, not absent
 * ([null, null] is diffusers' "left out", and FluxPipeline requires the transformer). */
static void test_model_index_malformed_entry(void **state) {
    case_dir c;
    case_new(&c, "index_entry");
    case_pipeline(&c, GOLDEN_SCHNELL, (const char *[]){"model_index.json", NULL});
    static const char *const malformed[] = {
        "5", "\"FluxTransformer2DModel\"", "{\"diffusers\": 1}", "[\"diffusers\"]", "[\"diffusers\", 12]",
        "[\"diffusers\", \"FluxTransformer2DModel\", \"x\"]", "[7, \"FluxTransformer2DModel\"]", "[]",
    };
    for (size_t i = 0; i < sizeof malformed / sizeof *malformed; i++) {
        json_set_raw(case_path(&c, "model_index.json"), "transformer", malformed[i]);
        expect_generate_fails(&c, "model_index.json", "entry 'transformer' is malformed");
        if (strstr(g_err, "absent")) {
            print_message("transformer = %s reported as absent:\n%s\n", malformed[i], g_err);
            fail();
        }
        /* the planner reads the index the same way (it used to skip such an entry as absent) */
        expect(run_cli(&c, NULL, "plan --model model"), RC_FAIL, "entry 'transformer' is malformed");
    }
    /* a malformed tokenizer entry too */
    json_set_raw(case_path(&c, "model_index.json"), "transformer", "[\"diffusers\", \"FluxTransformer2DModel\"]");
    json_set_raw(case_path(&c, "model_index.json"), "tokenizer_2", "[\"transformers\", false]");
    expect_generate_fails(&c, "entry 'tokenizer_2' is malformed");
    /* absent (null, [null, null]) is still reported as absent */
    json_set_raw(case_path(&c, "model_index.json"), "tokenizer_2", "[\"transformers\", \"T5TokenizerFast\"]");
    json_set_raw(case_path(&c, "model_index.json"), "transformer", "[null, null]");
    expect_generate_fails(&c, "component 'transformer' is required by FluxPipeline but absent");
    json_set_raw(case_path(&c, "model_index.json"), "transformer", "null");
    expect_generate_fails(&c, "component 'transformer' is required by FluxPipeline but absent");
}

static void test_scheduler_config_hostile(void **state) {
    case_dir c;
    case_new(&c, "scheduler_hostile");
    case_pipeline(&c, GOLDEN_SCHNELL, (const char *[]){"scheduler", NULL});
    const char *p = case_path(&c, "scheduler/scheduler_config.json");
    json_set_raw(p, "num_train_timesteps", "1000000000000");
    expect_generate_fails(&c, "scheduler_config.json", "num_train_timesteps");
    json_set_raw(p, "num_train_timesteps", "1000");
    json_set_raw(p, "shift", "\"a lot\"");
    expect_generate_fails(&c, "scheduler_config.json", "shift");
}

static void test_missing_subfolder(void **state) {
    case_dir c;
    case_new(&c, "missing_sub");
    case_pipeline(&c, GOLDEN_SCHNELL, NULL);
    assert_int_equal(unlink(case_path(&c, "vae")), 0);
    expect_generate_fails(&c, "'vae'", "missing");
    assert_int_equal(unlink(case_path(&c, "transformer")), 0);
    expect_generate_fails(&c, "'transformer'", "missing");
}

static void test_missing_subfolder_sd3(void **state) {
    case_dir c;
    case_new(&c, "missing_sub_sd3");
    case_pipeline(&c, GOLDEN_SD35, NULL);
    assert_int_equal(unlink(case_path(&c, "text_encoder_3")), 0);
    expect_generate_fails(&c, "'text_encoder_3'", "missing");
}

/* ---- tokenizer files ------------------------------------------------------------------------- */

static void test_tokenizer_vocab_truncated(void **state) {
    case_dir c;
    case_new(&c, "tok_vocab");
    case_pipeline(&c, GOLDEN_SCHNELL, (const char *[]){"tokenizer", NULL});
    truncate_file(case_path(&c, "tokenizer/vocab.json"), 0.5);
    expect_generate_fails(&c, "tokenizer/vocab.json", "invalid JSON");
    int rc = run_cli(&c, NULL, "tokenize --model model --prompt 'a fox'");
    expect(rc, RC_FAIL, "vocab.json");
}

static void test_tokenizer_merges_truncated(void **state) {
    case_dir c;
    case_new(&c, "tok_merges");
    case_pipeline(&c, GOLDEN_SCHNELL, (const char *[]){"tokenizer", NULL});
    const char *p = case_path(&c, "tokenizer/merges.txt");
    size_t n = 0;
    char *text = tu_read_file(p, &n);
    assert_non_null(text);
    /* cut in the middle of a line, right after its first token */
    char *line = memchr(text + n / 2, '\n', n - n / 2);
    assert_non_null(line);
    line++;
    char *sp = memchr(line, ' ', (size_t)(text + n - line));
    assert_non_null(sp);
    assert_int_equal(truncate(p, (off_t)(sp - text)), 0);
    free(text);
    expect_generate_fails(&c, "tokenizer/merges.txt", "expected two tokens");
}

static void test_tokenizer_json_truncated(void **state) {
    case_dir c;
    case_new(&c, "tok_json");
    case_pipeline(&c, GOLDEN_SCHNELL, (const char *[]){"tokenizer_2", NULL});
    truncate_file(case_path(&c, "tokenizer_2/tokenizer.json"), 0.5);
    expect_generate_fails(&c, "tokenizer_2/tokenizer.json", "invalid JSON");
}

static void test_tokenizer_spiece_truncated(void **state) {
    case_dir c;
    case_new(&c, "tok_spiece");
    case_pipeline(&c, GOLDEN_SCHNELL, (const char *[]){"tokenizer_2", NULL});
    assert_int_equal(unlink(case_path(&c, "tokenizer_2/tokenizer.json")), 0); /* so spiece.model is read */
    truncate_file(case_path(&c, "tokenizer_2/spiece.model"), 0.5);
    expect_generate_fails(&c, "tokenizer_2/spiece.model", "truncated");
    truncate_file(case_path(&c, "tokenizer_2/spiece.model"), 0.0);
    expect_generate_fails(&c, "tokenizer_2/spiece.model");
}

/* ---- request checks -------------------------------------------------------------------------- */

static void test_size_not_multiple_of_16(void **state) {
    case_dir c;
    case_new(&c, "size_multiple");
    case_pipeline(&c, GOLDEN_SCHNELL, NULL);
    int rc = run_cli(&c, NULL, "generate --model model --prompt fox --height 72 --width 64 --steps 2 --quiet");
    expect(rc, RC_FAIL, "multiples of 16", "72");
    expect_no_output(&c);
    rc = run_cli(&c, NULL, "generate --model model --prompt fox --height 64 --width 8 --steps 2 --quiet");
    expect(rc, RC_FAIL, "multiples of 16");
    expect_no_output(&c);
}

/* parse "<number> GB" out of the message */
static double gb_in_message(void) {
    const char *p = strstr(g_err, " GB");
    if (!p) return -1;
    while (p > g_err && (p[-1] == '.' || (p[-1] >= '0' && p[-1] <= '9'))) p--;
    return atof(p);
}

static void test_size_absurd(void **state) {
    case_dir c;
    case_new(&c, "size_absurd");
    case_pipeline(&c, GOLDEN_SCHNELL, NULL);
    /* the budget leaves room for the tiny weights only: an attempt to allocate anything
     * image-sized would end in "out of memory", not in the size check */
    int rc = run_cli(&c, "CDIFFUSERS_CPU_MEMORY_LIMIT=64M",
                     "generate --model model --prompt fox --height 65536 --width 65536 --steps 2 --quiet");
    expect(rc, RC_FAIL, "65536x65536", "limit");
    assert_null(strstr(g_err, "out of memory"));
    /* the message says what it would need; the RGB image alone is 65536^2 * 3 floats */
    double gb = gb_in_message();
    double rgb_gb = 65536.0 * 65536.0 * 3 * 4 / 1e9;
    if (!(gb >= rgb_gb)) {
        print_message("memory estimate %.1f GB is below the %.1f GB of the decoded RGB image:\n%s\n", gb, rgb_gb, g_err);
        fail();
    }
    expect_no_output(&c);
    /* beyond what the command line accepts at all */
    rc = run_cli(&c, NULL, "generate --model model --prompt fox --height 99999999999 --width 64");
    expect(rc, RC_USAGE, "--height", "99999999999");
    expect_no_output(&c);
}

static void test_steps_zero_negative(void **state) {
    case_dir c;
    case_new(&c, "steps");
    case_pipeline(&c, GOLDEN_SCHNELL, NULL);
    int rc = run_cli(&c, NULL, "generate --model model --prompt fox --steps 0");
    expect(rc, RC_USAGE, "--steps", "'0'");
    rc = run_cli(&c, NULL, "generate --model model --prompt fox --steps -3");
    expect(rc, RC_USAGE, "--steps", "'-3'");
    rc = run_cli(&c, NULL, "generate --model model --prompt fox --steps=-3");
    expect(rc, RC_USAGE, "--steps", "'-3'");
    rc = run_cli(&c, NULL, "generate --model model --prompt fox --steps 1001");
    expect(rc, RC_USAGE, "--steps", "'1001'");
    expect_no_output(&c);
}

/* ---- img2img / inpainting / batches ---------------------------------------------------------- */

/* c->root/name: a w x h PNG with `ch` channels of a smooth pattern */
static void write_png(const case_dir *c, const char *name, int w, int h, int ch) {
    uint8_t *px = malloc((size_t)w * h * ch);
    assert_non_null(px);
    for (int i = 0; i < w * h * ch; i++) px[i] = (uint8_t)(i * 7 % 251);
    char path[700];
    snprintf(path, sizeof path, "%s/%s", c->root, name);
    assert_int_equal(cdf_png_write(path, w, h, ch, px, NULL, NULL, 0, true), CDF_OK);
    free(px);
}

static void test_img2img_bad_inputs(void **state) {
    case_dir c;
    case_new(&c, "img2img_bad");
    case_pipeline(&c, GOLDEN_SCHNELL, NULL);
    write_png(&c, "rgb.png", 64, 64, 3);
    write_png(&c, "rgba.png", 64, 64, 4);
    write_png(&c, "gray.png", 64, 64, 1);
    write_png(&c, "gray_small.png", 32, 64, 1);
    write_text(case_path(&c, "../notpng.png"), "this is not a PNG file at all");
    assert_int_equal(tu_system("head -c 100 '%s/rgb.png' > '%s/truncated.png'", c.root, c.root), 0);
    static const struct {
        const char *args;
        int rc;
        const char *needle1, *needle2;
    } rows[] = {
        {"--image missing.png", RC_FAIL, "--image", "missing.png"},
        {"--image notpng.png", RC_FAIL, "notpng.png", "not a PNG"},
        {"--image truncated.png", RC_FAIL, "truncated.png", "corrupt"},
        {"--image rgba.png", RC_FAIL, "4 channel", "RGB"},
        {"--image gray.png", RC_FAIL, "1 channel", "RGB"},
        {"--image rgb.png --mask gray_small.png", RC_FAIL, "32x64", "same size"},
        {"--image rgb.png --mask rgba.png", RC_FAIL, "mask", "grayscale"},
        {"--image rgb.png --mask missing.png", RC_FAIL, "--mask", "missing.png"},
        {"--mask gray.png", RC_USAGE, "--mask", "--image"},
        {"--strength 0.5", RC_USAGE, "--strength", "--image"},
        {"--image rgb.png --strength 0", RC_USAGE, "--strength", "(0, 1]"},
        {"--image rgb.png --strength 1.5", RC_USAGE, "--strength", "'1.5'"},
        {"--image rgb.png --strength -0.2", RC_USAGE, "--strength", "'-0.2'"},
        {"--image rgb.png --strength nan", RC_USAGE, "--strength", "'nan'"},
        {"--image rgb.png --strength 1e-30", RC_FAIL, "strength", "no denoising step"},
        {"--num-images 0", RC_USAGE, "--num-images", "'0'"},
        {"--batch-seeds 1,,2", RC_USAGE, "--batch-seeds", "'1,,2'"},
        {"--batch-seeds 1,2 --num-images 3", RC_USAGE, "--num-images", "--batch-seeds"},
        {"--num-images 2 --latents-out l.safetensors", RC_FAIL, "--latents-out", "2 images"},
        {"--prompts-file missing.txt", RC_FAIL, "--prompts-file", "missing.txt"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
        int rc = run_cli(&c, NULL, "generate --model model --height 64 --width 64 --steps 2 --quiet %s %s",
                         strstr(rows[i].args, "--prompts-file") ? "" : "--prompt fox", rows[i].args);
        expect(rc, rows[i].rc, rows[i].needle1, rows[i].needle2);
        expect_no_output(&c);
        struct stat st;
        char p[800];
        snprintf(p, sizeof p, "%s/out-000.png", c.root);
        assert_int_not_equal(stat(p, &st), 0);
    }
    /* an empty prompts file */
    write_text(case_path(&c, "../empty.txt"), "\n\n");
    int rc = run_cli(&c, NULL, "generate --model model --prompts-file empty.txt --steps 2 --quiet");
    expect(rc, RC_FAIL, "empty.txt", "no prompt");
    expect_no_output(&c);
    /* FLUX.2 reference images: more than the model takes, too small; then two that work */
    case_dir c2;
    case_new(&c2, "img2img_flux2");
    case_pipeline(&c2, "pipelines/flux2_dev_tiny", NULL);
    write_png(&c2, "rgb.png", 64, 64, 3);
    write_png(&c2, "small.png", 64, 40, 3);
    write_png(&c2, "wide.png", 100, 70, 3);
    char eleven[600] = "";
    for (int i = 0; i < 11; i++) strcat(eleven, " --image rgb.png");
    rc = run_cli(&c2, NULL, "generate --model model --prompt fox --steps 2 --quiet%s", eleven);
    expect(rc, RC_FAIL, "11 reference images", "at most 10");
    expect_no_output(&c2);
    rc = run_cli(&c2, NULL, "generate --model model --prompt fox --steps 2 --quiet --image rgb.png --image small.png");
    expect(rc, RC_FAIL, "reference image 2", "64x40", "at least 64");
    expect_no_output(&c2);
    rc = run_cli(&c2, NULL, "generate --model model --prompt fox --steps 2 --quiet --text-encoder-out-layers 1,2,3 "
                            "--image wide.png --image rgb.png");
    expect(rc, RC_OK, "");
    char path[800];
    snprintf(path, sizeof path, "%s/out.png", c2.root);
    cdf_png_image png;
    assert_int_equal(cdf_png_read(path, &png), CDF_OK);
    assert_int_equal(png.width, 96); /* the first reference's size, cropped to multiples of 16 */
    assert_int_equal(png.height, 64);
    assert_non_null(strstr(cdf_png_image_text(&png, "parameters"), "Reference images: wide.png; rgb.png"));
    cdf_png_image_free(&png);
}

/* PNG text chunk "parameters" of c->root/name */
static char *png_parameters(const case_dir *c, const char *name) {
    char path[800];
    snprintf(path, sizeof path, "%s/%s", c->root, name);
    cdf_png_image img;
    if (cdf_png_read(path, &img) != CDF_OK) fail_msg("%s: %s", path, cdf_last_error());
    const char *t = cdf_png_image_text(&img, "parameters");
    char *r = t ? strdup(t) : NULL;
    cdf_png_image_free(&img);
    assert_non_null(r);
    return r;
}

static void test_img2img_batch_outputs(void **state) {
    case_dir c;
    case_new(&c, "img2img_batch");
    case_pipeline(&c, GOLDEN_SCHNELL, NULL);
    write_png(&c, "rgb.png", 70, 50, 3);
    write_png(&c, "mask.png", 70, 50, 1);
    /* img2img + inpainting, two images from one generator, size from the image (64x48) */
    int rc = run_cli(&c, NULL, "generate --model model --prompt fox --steps 2 --quiet --image rgb.png --mask mask.png "
                               "--strength 0.5 --num-images 2 --seed 9");
    expect(rc, RC_OK, "");
    char *p0 = png_parameters(&c, "out-000.png"), *p1 = png_parameters(&c, "out-001.png");
    assert_non_null(strstr(p1, "Seed: 9, Batch index: 1 of 2"));
    assert_non_null(strstr(p0, "Size: 64x48, Strength: 0.5, Init image: rgb.png, Mask: mask.png"));
    free(p0);
    free(p1);
    expect_no_output(&c); /* no out.png itself */
    /* a seed list and a prompts file: out-000 .. out-003, each with its own seed */
    write_text(case_path(&c, "../prompts.txt"), "a fox\r\n\na cat\n");
    rc = run_cli(&c, NULL, "generate --model model --prompts-file prompts.txt --height 32 --width 32 --steps 2 --quiet "
                           "--batch-seeds 4,5 --output b.png");
    expect(rc, RC_OK, "");
    char *b3 = png_parameters(&c, "b-003.png");
    assert_non_null(strstr(b3, "a cat\n"));
    assert_non_null(strstr(b3, "Seed: 5,"));
    free(b3);
    /* an existing numbered output refuses the whole run before any work: nothing is written */
    write_text(case_path(&c, "../c-001.png"), "keep me");
    rc = run_cli(&c, NULL, "generate --model model --prompt fox --height 32 --width 32 --steps 2 --quiet --num-images 2 "
                           "--output c.png");
    expect(rc, RC_FAIL, "c-001.png", "already exists");
    struct stat st;
    char p[800];
    snprintf(p, sizeof p, "%s/c-000.png", c.root);
    assert_int_not_equal(stat(p, &st), 0);
}

/* The strength is the double strtod reads (the Python float of the text), and the PNG text gives
 * it back with the digits that read as the same double (a %g would write 0.123457); a seed list
 * with an input image names the seed the image was encoded with (diffusers' generator[0]). */
static void test_img2img_strength_and_seed_list_text(void **state) {
    case_dir c;
    case_new(&c, "img2img_strength");
    case_pipeline(&c, GOLDEN_SCHNELL, NULL);
    write_png(&c, "rgb.png", 64, 48, 3);
    int rc = run_cli(&c, NULL, "generate --model model --prompt fox --steps 2 --quiet --image rgb.png "
                               "--strength 0.123456789 --batch-seeds 3,4");
    expect(rc, RC_OK, "");
    char *p0 = png_parameters(&c, "out-000.png"), *p1 = png_parameters(&c, "out-001.png");
    assert_non_null(strstr(p0, "Seed: 3, Size: 64x48, Strength: 0.123456789, Init image: rgb.png"));
    assert_non_null(strstr(p1, "Seed: 4, Batch index: 1 of 2, Image encoded with seed: 3, Size: 64x48, Strength: 0.123456789,"));
    free(p0);
    free(p1);
    (void)state;
}

/* --cache: bad strings are usage errors before any work; the PNG text names the cache and the
 * steps each image ran in full; CDIFFUSERS_LOG=cache prints every decision. */
static void test_cache_option(void **state) {
    (void)state;
    case_dir c;
    case_new(&c, "cache");
    case_pipeline(&c, GOLDEN_SCHNELL, NULL);
    const char *gen = "generate --model model --prompt fox --steps 4 --height 32 --width 32 --quiet";
    int rc = run_cli(&c, NULL, "%s --cache first-block:bogus", gen);
    expect(rc, RC_USAGE, "--cache", "first-block:bogus", "finite number");
    rc = run_cli(&c, NULL, "%s --cache firstblock", gen);
    expect(rc, RC_USAGE, "unknown cache 'firstblock'", "first-block[:THRESHOLD]");
    rc = run_cli(&c, NULL, "%s --cache taylorseer:use_lite_mode=maybe", gen);
    expect(rc, RC_USAGE, "use_lite_mode cannot be 'maybe' (True or False)");
    rc = run_cli(&c, NULL, "%s --cache 'mag:mag_ratios=[1.0, x]'", gen);
    expect(rc, RC_USAGE, "mag_ratios: 'x' is not a finite number");
    expect_no_output(&c);
    rc = run_cli(&c, NULL, "%s --cache first-block:0 --num-images 2", gen);
    expect(rc, RC_OK, "");
    for (int k = 0; k < 2; k++) {
        char *p = png_parameters(&c, k ? "out-001.png" : "out-000.png");
        assert_non_null(strstr(p, ", Cache: first-block:0, full steps 0,1,2,3 (4 of 4), "));
        free(p);
    }
    rc = run_cli(&c, "CDIFFUSERS_LOG=cache", "%s --cache first-block:1e9 --output big.png", gen);
    expect(rc, RC_OK, "cache: first-block cond call 0: change nan (first call)", "cond call 3: change",
           "<= threshold 1e+09 -> skip");
    char *p = png_parameters(&c, "big.png");
    assert_non_null(strstr(p, ", Cache: first-block:1e+09, full steps 0 (1 of 4), "));
    free(p);
    /* MagCache's defaults at 4 steps: FLUX_MAG_RATIOS at 0, 9, 18, 27 = 1, 1.03125, 1, 0.89062; from step
     * int(0.2 * 4 + 0.5) = 1 the error accumulates 0.03125 (skip), 0.0625 (> 0.06: full), 0.109 (full) */
    rc = run_cli(&c, NULL, "%s --cache mag --output mag.png", gen);
    expect(rc, RC_OK, "");
    p = png_parameters(&c, "mag.png");
    assert_non_null(strstr(p, ", Cache: mag:threshold=0.06,max_skip_steps=3,retention_ratio=0.2,num_inference_steps=4, full steps 0,2,3 (3 of 4), "));
    free(p);
    /* TaylorSeer's defaults at 4 steps: steps 0-2 computed (before step 3), step 3 predicted
     * ((3 - 3 - 1) % 5 = 4 in Python) */
    rc = run_cli(&c, NULL, "%s --cache taylorseer --output ts.png", gen);
    expect(rc, RC_OK, "");
    p = png_parameters(&c, "ts.png");
    assert_non_null(strstr(p, ", Cache: taylorseer:cache_interval=5,disable_cache_before_step=3,disable_cache_after_step=None,"
                              "max_order=1,taylor_factors_dtype=bfloat16, full steps 0,1,2 (3 of 4), "));
    free(p);
    /* lite mode, the same schedule: the whole output predicted at step 3 */
    rc = run_cli(&c, NULL, "%s --cache taylorseer:use_lite_mode=True --output lite.png", gen);
    expect(rc, RC_OK, "");
    p = png_parameters(&c, "lite.png");
    assert_non_null(strstr(p, ", Cache: taylorseer:cache_interval=5,disable_cache_before_step=3,disable_cache_after_step=None,"
                              "max_order=1,taylor_factors_dtype=bfloat16,use_lite_mode=True, full steps 0,1,2 (3 of 4), "));
    free(p);
    /* MagCache's calibration prints the ratios on stdout as diffusers does (their values against
     * diffusers': test_step_cache); pasted back as mag_ratios they run */
    rc = run_cli(&c, NULL, "%s --cache mag:calibrate=True --output cal.png", gen);
    expect(rc, RC_OK, "");
    char so[1100];
    snprintf(so, sizeof so, "%s/stdout.txt", c.root);
    char *printed = tu_read_file(so, NULL);
    static const char head[] = "\n[MagCache] Calibration Complete. Copy these values to MagCacheConfig(mag_ratios=...):\n[1.0, ";
    assert_non_null(printed);
    assert_memory_equal(printed, head, sizeof head - 1);
    char *list = printed + sizeof head - 7, *end = strchr(list, '\n');
    assert_non_null(end);
    assert_string_equal(end, "\n\n");
    *end = '\0';
    int commas = 0;
    for (const char *q = list; *q; q++) commas += *q == ',';
    assert_int_equal(commas, 3); /* 4 ratios */
    p = png_parameters(&c, "cal.png");
    assert_non_null(strstr(p, ",calibrate=True, full steps 0,1,2,3 (4 of 4), calibrated mag_ratios [1.0, "));
    free(p);
    rc = run_cli(&c, NULL, "%s --cache 'mag:mag_ratios=%s,threshold=0.5' --output back.png", gen, list);
    expect(rc, RC_OK, "");
    p = png_parameters(&c, "back.png");
    assert_non_null(strstr(p, ",num_inference_steps=4,mag_ratios=[1, "));
    free(p);
    free(printed);
    rc = run_cli(&c, NULL, "%s --cache mag:threshold=x", gen);
    expect(rc, RC_USAGE, "threshold must be a finite number");
    rc = run_cli(&c, NULL, "%s --output none.png", gen);
    expect(rc, RC_OK, "");
    p = png_parameters(&c, "none.png");
    assert_null(strstr(p, "Cache:"));
    free(p);
}

/* ---- output path ------------------------------------------------------------------------------ */

static void test_output_missing_folder(void **state) {
    case_dir c;
    case_new(&c, "out_missing_dir");
    case_pipeline(&c, GOLDEN_SCHNELL, NULL);
    int rc = run_cli(&c, NULL, "generate --model model --prompt fox --height 64 --width 64 --steps 2 --quiet "
                               "--output no_such_folder/out.png");
    expect(rc, RC_FAIL, "no_such_folder", "does not exist");
    struct stat st;
    char p[700];
    snprintf(p, sizeof p, "%s/no_such_folder", c.root);
    assert_int_not_equal(stat(p, &st), 0); /* not created either */
    expect_no_output(&c);
}

static void test_output_under_regular_file(void **state) {
    case_dir c;
    case_new(&c, "out_enotdir");
    case_pipeline(&c, GOLDEN_SCHNELL, NULL);
    char p[700];
    snprintf(p, sizeof p, "%s/afile", c.root);
    write_text(p, "plain file");
    int rc = run_cli(&c, NULL, "generate --model model --prompt fox --height 64 --width 64 --steps 2 --quiet "
                               "--output afile/out.png");
    expect(rc, RC_FAIL, "afile/out.png", "not a folder");
    char *after = tu_read_file(p, NULL);
    assert_string_equal(after, "plain file");
    free(after);
    expect_no_output(&c);
}

static void test_output_unwritable(void **state) {
    case_dir c;
    case_new(&c, "out_sys");
    case_pipeline(&c, GOLDEN_SCHNELL, NULL);
    /* sysfs refuses new files even to root */
    int rc = run_cli(&c, NULL, "generate --model model --prompt fox --height 64 --width 64 --steps 2 --quiet "
                               "--output /sys/cdf_test_out.png");
    expect(rc, RC_FAIL, "/sys/cdf_test_out.png");
    struct stat st;
    assert_int_not_equal(stat("/sys/cdf_test_out.png", &st), 0);
    expect_no_output(&c);
}

static void test_output_exists_without_force(void **state) {
    case_dir c;
    case_new(&c, "out_exists");
    case_pipeline(&c, GOLDEN_SCHNELL, NULL);
    const char *content = "an older picture that must survive";
    write_text(c.out, content);
    struct utimbuf old = {.actime = 1000000000, .modtime = 1000000000};
    assert_int_equal(utime(c.out, &old), 0);
    int rc = run_cli(&c, NULL, GEN_ARGS);
    expect(rc, RC_FAIL, "out.png", "already exists", "--force");
    size_t n = 0;
    char *after = tu_read_file(c.out, &n);
    assert_non_null(after);
    assert_int_equal(n, strlen(content));
    assert_memory_equal(after, content, n);
    free(after);
    struct stat st;
    assert_int_equal(stat(c.out, &st), 0);
    assert_int_equal((long long)st.st_mtime, 1000000000LL);
    /* the same for --latents-out */
    rc = run_cli(&c, NULL, "generate --model model --prompt fox --height 64 --width 64 --steps 2 --quiet --output new.png "
                           "--latents-out out.png");
    expect(rc, RC_FAIL, "out.png", "already exists", "--force");
    assert_int_equal(stat(c.out, &st), 0);
    assert_int_equal((long long)st.st_mtime, 1000000000LL);
    char p[700];
    snprintf(p, sizeof p, "%s/new.png", c.root);
    assert_int_not_equal(stat(p, &st), 0);
}

/* ---- memory budget ------------------------------------------------------------------------------ */

static void test_out_of_memory_loading(void **state) {
    case_dir c;
    case_new(&c, "oom_load");
    case_pipeline(&c, GOLDEN_SCHNELL, NULL);
    int rc = run_cli(&c, "CDIFFUSERS_CPU_MEMORY_LIMIT=1M", GEN_ARGS);
    expect(rc, RC_FAIL, "out of memory", "1.00 MiB budget");
    expect_no_output(&c);
    rc = run_cli(&c, NULL, GEN_ARGS " --device-memory 1M");
    expect(rc, RC_FAIL, "out of memory", "1.00 MiB budget");
    expect_no_output(&c);
}

static void test_out_of_memory_mid_run(void **state) {
    case_dir c;
    case_new(&c, "oom_run");
    case_pipeline(&c, GOLDEN_SCHNELL, NULL);
    /* 16 MiB holds the tiny pipeline's weights (about 3.3 MB) but not a 1024x1024 run (the VAE's
     * first up-block alone is 16 channels x 1024 x 1024 f32 = 64 MiB) */
    int rc = run_cli(&c, NULL, "generate --model model --prompt fox --height 1024 --width 1024 --steps 2 --quiet "
                               "--device-memory 16M");
    expect(rc, RC_FAIL, "generate", "out of memory", "16.00 MiB budget");
    assert_null(strstr(g_err, "loading the pipeline")); /* it failed while running, not loading */
    expect_no_output(&c);
}

/* ---- SIGINT ------------------------------------------------------------------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* utime + stime of a process from /proc/<pid>/stat (fields 14 and 15, after the ")") */
static double cpu_seconds(pid_t pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')');
    unsigned long long ut = 0, st = 0;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2) return 0;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static void test_sigint_during_generate(void **state) {
    case_dir c;
    case_new(&c, "sigint");
    case_pipeline(&c, GOLDEN_SCHNELL, NULL);
    char err_path[700];
    snprintf(err_path, sizeof err_path, "%s/stderr.txt", c.root);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int nul = open("/dev/null", O_RDWR);
        if (fd < 0 || nul < 0 || chdir(c.root) != 0) _exit(127);
        dup2(nul, 0);
        dup2(nul, 1);
        dup2(fd, 2);
        /* long enough to be still running when the signal arrives, on any machine */
        execl(CDF_CLI_PATH, "cdiffusers", "generate", "--model", "model", "--prompt", "a red fox", "--height", "128", "--width",
              "128", "--steps", "1000", "--output", "out.png", "--quiet", (char *)NULL);
        _exit(127);
    }
    /* let it load and start denoising: wait until it has used 0.5 s of CPU (loading the tiny
     * pipeline takes about 0.1 s), or 10 s at most. The handler is installed before loading,
     * so an early signal is handled the same way: generation is cancelled at its first step. */
    int status = 0;
    double t0 = now_s();
    pid_t w = 0;
    while (now_s() - t0 < 10.0 && cpu_seconds(pid) < 0.5 && (w = waitpid(pid, &status, WNOHANG)) == 0) usleep(20000);
    if (w == pid) {
        print_message("generate ended before the signal (status 0x%x)\n", status);
        fail();
    }
    assert_int_equal(kill(pid, SIGINT), 0);
    double t1 = now_s();
    while ((w = waitpid(pid, &status, WNOHANG)) == 0 && now_s() - t1 < 60.0) usleep(20000);
    if (w == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        print_message("generate did not stop within 60 s of SIGINT\n");
        fail();
    }
    char *err = tu_read_file(err_path, NULL);
    snprintf(g_err, sizeof g_err, "%s", err ? err : "");
    free(err);
    if (!WIFEXITED(status)) {
        print_message("generate died from signal %d instead of exiting; stderr:\n%s\n", WTERMSIG(status), g_err);
        fail();
    }
    expect(WEXITSTATUS(status), RC_INTERRUPTED, "interrupted");
    assert_null(strstr(g_err, "Sanitizer"));
    expect_no_output(&c);
}

/* ---- guidance, sequence length, empty text ------------------------------------------------------- */

/* A negative guidance used to be taken as "unset" and silently replaced by the pipeline
 * default: now it is a usage error, checked before the model is read. 0 stays valid. */
static void test_guidance_negative(void **state) {
    case_dir c;
    case_new(&c, "guidance_negative");
    case_pipeline(&c, GOLDEN_SCHNELL, NULL);
    static const char *const bad[] = {"--guidance -5", "--guidance=-5", "--guidance -0.001", "--guidance -1e-30"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int rc = run_cli(&c, NULL, GEN_ARGS " %s", bad[i]);
        expect(rc, RC_USAGE, "--guidance needs a number >= 0", "got '-");
        expect_no_output(&c);
    }
    int rc = run_cli(&c, NULL, GEN_ARGS " --guidance 0");
    expect(rc, RC_OK, "");
    struct stat st;
    assert_int_equal(stat(c.out, &st), 0);
}

/* The prompt edge cases of FLUX.1: an empty prompt is zero text tokens (T5 gives only </s>,
 * CLIP only bos/eos), and --max-sequence-length 1 leaves room for nothing but </s>; both are
 * what diffusers accepts, so they must generate. 0 and 513 are refused as usage errors. */
static void test_max_sequence_length_edges(void **state) {
    case_dir c;
    case_new(&c, "max_seq_len");
    case_pipeline(&c, GOLDEN_SCHNELL, NULL);
    static const char *const bad[] = {"0", "-1", "513", "1e3"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int rc = run_cli(&c, NULL, GEN_ARGS " --max-sequence-length %s", bad[i]);
        expect(rc, RC_USAGE, "--max-sequence-length needs an integer between 1 and 512");
        expect_no_output(&c);
    }
    static const char *const ok[] = {"--prompt '' --max-sequence-length 1", "--prompt 'a red fox' --max-sequence-length 1"};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        int rc = run_cli(&c, NULL, "generate --model model %s --height 64 --width 64 --steps 1 --seed 1 --output out.png --quiet --force", ok[i]);
        expect(rc, RC_OK, "");
        struct stat st;
        assert_int_equal(stat(c.out, &st), 0);
        assert_true(st.st_size > 0);
        assert_int_equal(unlink(c.out), 0);
    }
}

/* run-model on the FLUX.1 transformer with an empty text sequence (encoder_hidden_states
 * [1, 0, 24], txt_ids [0, 3]): refused at the input check, naming the input, instead of a
 * reshape error deep inside. The same inputs with 4 text tokens run (control). */
static void write_flux_inputs(const char *path, int64_t txt_len) {
    const int64_t img_len = 4;
    static float zeros[4 * 64];
    int64_t hs[3] = {1, img_len, 64}, ehs[3] = {1, txt_len, 24}, pp[2] = {1, 8}, ts[1] = {1}, img[2] = {img_len, 3},
            txt[2] = {txt_len, 3};
    float t[1] = {0.5f};
    cdf_st_writer *w = cdf_st_writer_new();
    assert_non_null(w);
    assert_int_equal(cdf_st_writer_add(w, "hidden_states", CDF_F32, 3, hs, zeros), CDF_OK);
    assert_int_equal(cdf_st_writer_add(w, "encoder_hidden_states", CDF_F32, 3, ehs, zeros), CDF_OK);
    assert_int_equal(cdf_st_writer_add(w, "pooled_projections", CDF_F32, 2, pp, zeros), CDF_OK);
    assert_int_equal(cdf_st_writer_add(w, "timestep", CDF_F32, 1, ts, t), CDF_OK);
    assert_int_equal(cdf_st_writer_add(w, "img_ids", CDF_F32, 2, img, zeros), CDF_OK);
    assert_int_equal(cdf_st_writer_add(w, "txt_ids", CDF_F32, 2, txt, zeros), CDF_OK);
    assert_int_equal(cdf_st_writer_save(w, path), CDF_OK);
    cdf_st_writer_free(w);
}

static void test_flux_empty_text_sequence(void **state) {
    case_dir c;
    case_new(&c, "flux_empty_text");
    case_pipeline(&c, GOLDEN_SCHNELL, NULL);
    char in[700], out[700];
    snprintf(in, sizeof in, "%s/in.safetensors", c.root);
    snprintf(out, sizeof out, "%s/out.safetensors", c.root);
    struct stat st;
    write_flux_inputs(in, 0);
    int rc = run_cli(&c, NULL, "run-model --model model/transformer --inputs in.safetensors --output out.safetensors --dtype f32");
    expect(rc, RC_FAIL, "input 'encoder_hidden_states' is [1, 0, 24]", "L_txt >= 1");
    assert_int_not_equal(stat(out, &st), 0);
    expect_no_output(&c);
    write_flux_inputs(in, 4);
    rc = run_cli(&c, NULL, "run-model --model model/transformer --inputs in.safetensors --output out.safetensors --dtype f32");
    expect(rc, RC_OK, "");
    assert_int_equal(stat(out, &st), 0);
}

/* ---- FLUX.2 ------------------------------------------------------------------------------------- */

#define GOLDEN_FLUX2 "pipelines/flux2_dev_tiny"
#define GEN_ARGS_FLUX2 "generate --model model --prompt 'a red fox' --height 64 --width 64 --steps 1 --seed 1 --output out.png --quiet"

/* --text-encoder-out-layers against a text encoder that has fewer layers (the tiny Mistral has
 * 4: hidden states 0..4, or -5..-1), including the default 10,20,30 of the real model; and a
 * count of layers whose stacked width disagrees with the transformer. 1,2,3 runs (control). */
static void test_flux2_out_layers(void **state) {
    case_dir c;
    case_new(&c, "flux2_out_layers");
    case_pipeline(&c, GOLDEN_FLUX2, NULL);
    static const struct {
        const char *flag, *needle;
    } cases[] = {
        {"--text-encoder-out-layers 1,2,99", "hidden-state layer 99 is out of range (the model has 4 layers"},
        {"--text-encoder-out-layers 1,-6,2", "hidden-state layer -6 is out of range (the model has 4 layers"},
        {"", "hidden-state layer 10 is out of range (the model has 4 layers"},
        {"--text-encoder-out-layers 1", "joint_attention_dim"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int rc = run_cli(&c, NULL, GEN_ARGS_FLUX2 " %s", cases[i].flag);
        expect(rc, RC_FAIL, cases[i].needle);
        expect_no_output(&c);
    }
    int rc = run_cli(&c, NULL, GEN_ARGS_FLUX2 " --text-encoder-out-layers 1,2,3");
    expect(rc, RC_OK, "");
    struct stat st;
    assert_int_equal(stat(c.out, &st), 0);
}

/* FLUX.2 load-time failures: the Mistral text encoder's weights truncated, the transformer
 * folder missing, the FLUX.2 VAE's config of the wrong type. */
static void test_flux2_bad_files(void **state) {
    case_dir c;
    case_new(&c, "flux2_bad_files");
    case_pipeline(&c, GOLDEN_FLUX2, (const char *[]){"text_encoder", "vae", NULL});
    truncate_file(case_path(&c, "text_encoder/model.safetensors"), 0.5);
    int rc = run_cli(&c, NULL, GEN_ARGS_FLUX2 " --text-encoder-out-layers 1,2,3");
    expect(rc, RC_FAIL, "text_encoder", "model.safetensors", "truncated");
    expect_no_output(&c);
    assert_int_equal(tu_system("rm -r '%s' && cp -rL '%s/text_encoder' '%s/'", case_path(&c, "text_encoder"), tu_data(GOLDEN_FLUX2), c.model), 0);
    json_set_raw(case_path(&c, "vae/config.json"), "latent_channels", "\"many\"");
    rc = run_cli(&c, NULL, GEN_ARGS_FLUX2 " --text-encoder-out-layers 1,2,3");
    expect(rc, RC_FAIL, "vae", "latent_channels");
    expect_no_output(&c);
    assert_int_equal(unlink(case_path(&c, "transformer")), 0);
    rc = run_cli(&c, NULL, GEN_ARGS_FLUX2 " --text-encoder-out-layers 1,2,3");
    expect(rc, RC_FAIL, "sub-folder 'transformer' (Flux2Transformer2DModel) is missing");
    expect_no_output(&c);
}

/* ---- usage errors ------------------------------------------------------------------------------- */

static void test_usage_errors(void **state) {
    case_dir c;
    case_new(&c, "usage");
    static const struct {
        const char *args, *needle;
    } cases[] = {
        {"", "usage"},
        {"frobnicate", "unknown command 'frobnicate'"},
        {"generate --frobnicate", "frobnicate"},
        {"generate", "generate needs"}, /* --model may be omitted (the bundled default model); --prompt may not */
        {"generate --model m", "--prompt"},
        {"generate --model m --prompt fox stray", "unexpected argument 'stray'"},
        {"generate --model m --prompt fox --height abc", "--height"},
        {"generate --model m --prompt fox --width 12x", "--width"},
        {"generate --model m --prompt fox --height", "height"},
        {"generate --model m --prompt fox --seed -1", "--seed"},
        {"generate --model m --prompt fox --seed 99999999999999999999999", "--seed"},
        {"generate --model m --prompt fox --guidance nan", "--guidance"},
        {"generate --model m --prompt fox --guidance inf", "--guidance"},
        {"generate --model m --prompt fox --guidance 1e39", "--guidance"},
        {"generate --model m --prompt fox --guidance -5", "--guidance needs a number >= 0, got '-5'"},
        {"generate --model m --prompt fox --true-cfg-scale x", "--true-cfg-scale"},
        {"generate --model m --prompt fox --threads 0", "--threads"},
        {"generate --model m --prompt fox --dtype f64", "--dtype"},
        {"generate --model m --prompt fox --max-sequence-length 513", "--max-sequence-length"},
        {"generate --model m --prompt fox --device-memory 12Q", "--device-memory"},
        {"generate --model m --prompt fox --device-memory -5G", "--device-memory"},
        {"run-model --model m", "run-model needs"},
        {"run-model --model m --inputs i --output o --method backward", "--method"},
        {"run-model --model m --inputs i --output o --repeat 0", "--repeat"},
        {"tokenize --model m", "tokenize needs"},
        {"tokenize --model m --prompt p --max-length -1", "--max-length"},
        {"info", "info needs"},
        {"info --model", "model"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int rc = run_cli(&c, NULL, "%s", cases[i].args);
        if (rc != RC_USAGE || !strstr(g_err, cases[i].needle)) {
            print_message("`cdiffusers %s`: exit %d (want 2), stderr lacks [%s]?\n%s\n", cases[i].args, rc, cases[i].needle, g_err);
            fail();
        }
    }
    expect_no_output(&c);
    /* --help and --version are not errors */
    assert_int_equal(run_cli(&c, NULL, "--help"), RC_OK);
    assert_int_equal(run_cli(&c, NULL, "--version"), RC_OK);
}

/* A folder that is not a model at all, and a prompt that is not UTF-8, through every command. */
static void test_not_a_model(void **state) {
    case_dir c;
    case_new(&c, "not_a_model");
    assert_int_equal(tu_system("mkdir -p '%s/model' && echo hi > '%s/model/readme.txt'", c.root, c.root), 0);
    int rc = run_cli(&c, NULL, GEN_ARGS);
    expect(rc, RC_FAIL, "model_index.json");
    expect_no_output(&c);
    rc = run_cli(&c, NULL, "generate --model does_not_exist --prompt fox --quiet");
    expect(rc, RC_FAIL, "does_not_exist");
    rc = run_cli(&c, NULL, "info --model model");
    expect(rc, RC_FAIL, "model");
    rc = run_cli(&c, NULL, "tokenize --model model --prompt fox");
    expect(rc, RC_FAIL, "model");
    rc = run_cli(&c, NULL, "run-model --model model --inputs nothing.safetensors --output o.safetensors");
    expect(rc, RC_FAIL, "model");
    rc = run_cli(&c, NULL, "tokenize --model '%s' --prompt \"$(printf 'caf\\303 \\377\\376 ok')\"", tu_data(GOLDEN_SCHNELL));
    assert_int_equal(rc, RC_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_usage_errors),
        cmocka_unit_test(test_cache_option),
        cmocka_unit_test(test_steps_zero_negative),
        cmocka_unit_test(test_not_a_model),
        cmocka_unit_test(test_st_truncated),
        cmocka_unit_test(test_st_header_length_beyond_file),
        cmocka_unit_test(test_st_offsets_overlap),
        cmocka_unit_test(test_st_offsets_outside_data),
        cmocka_unit_test(test_st_dtype_shape_mismatch),
        cmocka_unit_test(test_st_unknown_dtype),
        cmocka_unit_test(test_st_missing_tensor),
        cmocka_unit_test(test_st_shape_vs_config),
        cmocka_unit_test(test_st_unaligned_data),
        cmocka_unit_test(test_config_deep_nesting),
        cmocka_unit_test(test_config_huge_number),
        cmocka_unit_test(test_config_wrong_type),
        cmocka_unit_test(test_model_index_syntax),
        cmocka_unit_test(test_model_index_wrong_types),
        cmocka_unit_test(test_model_index_malformed_entry),
        cmocka_unit_test(test_guidance_negative),
        cmocka_unit_test(test_max_sequence_length_edges),
        cmocka_unit_test(test_flux_empty_text_sequence),
        cmocka_unit_test(test_flux2_out_layers),
        cmocka_unit_test(test_flux2_bad_files),
        cmocka_unit_test(test_scheduler_config_hostile),
        cmocka_unit_test(test_missing_subfolder),
        cmocka_unit_test(test_missing_subfolder_sd3),
        cmocka_unit_test(test_tokenizer_vocab_truncated),
        cmocka_unit_test(test_tokenizer_merges_truncated),
        cmocka_unit_test(test_tokenizer_json_truncated),
        cmocka_unit_test(test_tokenizer_spiece_truncated),
        cmocka_unit_test(test_size_not_multiple_of_16),
        cmocka_unit_test(test_size_absurd),
        cmocka_unit_test(test_output_missing_folder),
        cmocka_unit_test(test_output_under_regular_file),
        cmocka_unit_test(test_output_unwritable),
        cmocka_unit_test(test_output_exists_without_force),
        cmocka_unit_test(test_out_of_memory_loading),
        cmocka_unit_test(test_out_of_memory_mid_run),
        cmocka_unit_test(test_sigint_during_generate),
        cmocka_unit_test(test_img2img_bad_inputs),
        cmocka_unit_test(test_img2img_batch_outputs),
        cmocka_unit_test(test_img2img_strength_and_seed_list_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
