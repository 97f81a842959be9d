#include "testutil.h"

#include <cjson/cJSON.h>

#include "cdiffusers/pipeline.h"
#include "kernels/dispatch.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>

const char *tu_data(const char *rel) {
    static char buf[8][4096];
    static int slot;
    char *b = buf[slot++ & 7];
    snprintf(b, 4096, "%s/%s", CDF_TEST_DATA, rel);
    return b;
}

const char *tu_tmp_path(const char *name) {
    static char buf[8][4096];
    static int slot;
    char *b = buf[slot++ & 7];
    snprintf(b, 4096, "%s/%s", tu_tmpdir(), name);
    return b;
}

char *tu_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)n + 1);
    if (p && fread(p, 1, (size_t)n, f) != (size_t)n) { free(p); p = NULL; }
    fclose(f);
    if (p) { p[n] = 0; if (len) *len = (size_t)n; }
    return p;
}

cJSON *tu_read_json(const char *path) {
    char *txt = tu_read_file(path, NULL);
    if (!txt) fail_msg("cannot read %s", path);
    cJSON *js = cJSON_Parse(txt);
    free(txt);
    if (!js) fail_msg("%s: not valid JSON", path);
    return js;
}

int tu_write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(data, 1, len, f);
    return (fclose(f) == 0 && w == len) ? 0 : -1;
}

static char g_tmpdir[256];
static void rm_tmpdir(void) {
    if (g_tmpdir[0]) { char cmd[300]; snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmpdir); if (system(cmd)) {} }
}
const char *tu_tmpdir(void) {
    if (!g_tmpdir[0]) {
        snprintf(g_tmpdir, sizeof g_tmpdir, "/tmp/cdf_test_XXXXXX");
        if (!mkdtemp(g_tmpdir)) return "/tmp";
        atexit(rm_tmpdir);
    }
    return g_tmpdir;
}

double tu_max_abs_diff(const float *a, const float *b, size_t n, size_t *worst) {
    double m = 0; size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > m || isnan(d)) { m = isnan(d) ? INFINITY : d; w = i; }
    }
    if (worst) *worst = w;
    return m;
}

void tu_fill_random(float *x, size_t n, uint64_t seed) {
    uint64_t s = seed ? seed : 88172645463325252ull;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        x[i] = (float)((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
}

int tu_system(const char *fmt, ...) {
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int r = system(cmd);
    if (r == -1) return -1;
    return WIFEXITED(r) ? WEXITSTATUS(r) : 128 + WTERMSIG(r);
}

cdf_device *tu_cpu(void) {
    cdf_device *d = cdf_device_get("cpu");
    assert_non_null(d);
    return d;
}

cdf_device *tu_device(void) {
    cdf_device *d = cdf_device_default();
    if (!d) fail_msg("no default device: %s", cdf_last_error());
    return d;
}

bool tu_device_is_cpu(void) {
    cdf_device_info info;
    return cdf_device_get_info(tu_device(), &info) == CDF_OK && strcmp(info.type, "cpu") == 0;
}

void tu_load_map(cdf_tensor_map *m, const char *rel) {
    cdf_tensor_map_init(m);
    cdf_status s = cdf_tensor_map_load(m, tu_data(rel), tu_device());
    if (s != CDF_OK) fail_msg("loading %s: %s", rel, cdf_last_error());
}

cdf_component *tu_load_component(const char *dir, cdf_dtype weight_dtype) {
    cdf_load_options o = cdf_load_options_default();
    o.device = tu_device();
    o.weight_dtype = weight_dtype;
    cdf_component *c = NULL;
    cdf_status s = cdf_component_load(dir, &o, &c);
    if (s != CDF_OK) fail_msg("loading %s: %s", dir, cdf_last_error());
    return c;
}

void tu_attention_counts(int64_t out[2]) { cdf_k_attention_counts(out); }

void tu_expect_attention_policy(const int64_t before[2], cdf_dtype weight_dtype, const char *what) {
    int64_t now[2];
    assert_int_equal(cdf_device_synchronize(tu_device()), CDF_OK); /* the forward's ops have run */
    if (!tu_device_is_cpu()) return; /* the counters are the cpu kernels' own */
    cdf_k_attention_counts(now);
    const int64_t f32 = now[0] - before[0], bf16 = now[1] - before[1];
    const bool want_bf16 = weight_dtype == CDF_BF16;
    if (f32 + bf16 == 0 || (want_bf16 ? f32 : bf16) != 0)
        fail_msg("%s with %s weights: %lld f32 and %lld bf16 attention calls (wanted only %s ones)", what,
                 cdf_dtype_name(weight_dtype), (long long)f32, (long long)bf16, want_bf16 ? "bf16" : "f32");
}

double tu_diff_tensors(cdf_tensor *got, cdf_tensor *want, const char *what) {
    if (!got) fail_msg("%s: output missing (%s)", what, cdf_last_error());
    assert_non_null(want);
    char a[96], b[96];
    int nd = cdf_tensor_ndim(got);
    bool same = nd == cdf_tensor_ndim(want);
    for (int i = 0; same && i < nd; i++) same = cdf_tensor_dim(got, i) == cdf_tensor_dim(want, i);
    if (!same)
        fail_msg("%s: shape %s, golden %s", what, cdf_tensor_describe(got, a, sizeof a), cdf_tensor_describe(want, b, sizeof b));
    float *g = cdf_tensor_read_f32(got), *w = cdf_tensor_read_f32(want);
    assert_non_null(g);
    assert_non_null(w);
    double d = tu_max_abs_diff(g, w, (size_t)cdf_tensor_numel(want), NULL);
    free(g);
    free(w);
    return d;
}

uint64_t tu_device_bytes(void) {
    assert_int_equal(cdf_device_synchronize(tu_cpu()), CDF_OK);
    cdf_memory_stats st;
    cdf_device_memory_stats(tu_cpu(), &st);
    return st.current_bytes;
}

float *tu_generate_capture(struct cdf_pipeline *p, const char *key, size_t *n) {
    cdf_generate_params gp = cdf_generate_params_default();
    gp.prompt = "a red square";
    gp.height = gp.width = 64;
    gp.num_inference_steps = 2;
    gp.seed = 7;
    static const int out_layers[] = {1, 2, 3}; /* FLUX.2: the tiny Mistral has 4 layers */
    if (strcmp(cdf_pipeline_class_name(p), "Flux2Pipeline") == 0) gp.text_encoder_out_layers = out_layers, gp.num_text_encoder_out_layers = 3;
    cdf_tensor_map cap;
    cdf_tensor_map_init(&cap);
    gp.capture = (cdf_capture *)&cap;
    cdf_image img;
    if (cdf_pipeline_generate(p, &gp, &img) != CDF_OK) fail_msg("generate: %s", cdf_last_error());
    cdf_image_free(&img);
    cdf_tensor *l = cdf_tensor_map_get(&cap, key);
    if (!l) fail_msg("generate captured no '%s'", key);
    *n = (size_t)cdf_tensor_numel(l);
    float *v = malloc(*n * 4 + 4);
    assert_non_null(v);
    assert_int_equal(cdf_tensor_read(l, CDF_F32, v, *n * 4), CDF_OK);
    cdf_tensor_map_clear(&cap);
    return v;
}

struct cdf_pipeline *tu_load_tiny_pipeline(const char *name) {
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/%s", tu_data("pipelines"), name);
    cdf_pipeline *pipe = NULL;
    if (cdf_pipeline_load(dir, NULL, &pipe) != CDF_OK) fail_msg("load %s: %s", dir, cdf_last_error());
    return pipe;
}
