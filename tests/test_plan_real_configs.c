/* The planner at real sizes: FLUX.1 [dev] (12B transformer, T5-XXL) and SD3.5 Large, planned
 * from header-only checkpoints. Each component folder gets its shipped config
 * (models/configs/<model>) and a safetensors file whose header lists the real tensors
 * (tests/data/plan_headers, from diffusers'/transformers' own classes on the meta device:
 * tools/make-plan-headers) and whose data section is a hole (a sparse file: tens of GB that take
 * no disk). The planner measures every component's forward over virtual buffers (planner.c), so:
 * - planning takes well under a few seconds (asserted < 3 s for the whole pipeline);
 * - it reads no weight data: the process takes far fewer page faults than the weights have
 *   pages (a read of the hole faults in a page per 4 KiB);
 * - the planned transformer weights are the headers' (bf16 matrices, f32 vectors: the loaders' rule). */
#include "testutil.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cdiffusers/cdiffusers.h"
#include "pipelines/planner.h"

typedef struct hdr_buf {
    char *s;
    size_t n, cap;
} hdr_buf;

static void put(hdr_buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char tmp[1024];
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    assert_true(k > 0 && k < (int)sizeof tmp);
    if (b->n + (size_t)k + 1 > b->cap) {
        b->cap = (b->cap + (size_t)k + 1) * 2;
        b->s = realloc(b->s, b->cap);
        assert_non_null(b->s);
    }
    memcpy(b->s + b->n, tmp, (size_t)k + 1);
    b->n += (size_t)k;
}

/* One tensor of a listing line into the header; returns its data bytes. */
static uint64_t put_tensor(hdr_buf *b, const char *name, const char *dt, const char *dims, uint64_t off, uint64_t *planned) {
    int64_t shape[8], numel = 1;
    int nd = 0;
    for (const char *p = dims; *p && nd < 8;) {
        shape[nd] = strtoll(p, (char **)&p, 10);
        numel *= shape[nd++];
        if (*p == ',') p++;
    }
    assert_string_equal(dt, "BF16");
    put(b, "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":[", b->n > 1 ? "," : "", name);
    for (int i = 0; i < nd; i++) put(b, "%s%lld", i ? "," : "", (long long)shape[i]);
    put(b, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off, (unsigned long long)(off + (uint64_t)numel * 2));
    /* weights.c get_v: f32 vectors, bf16 matrices (SD3's pos_embed table among them, as
     * diffusers' bf16 model holds it: sd3_transformer.c) */
    const bool f32 = nd < 2;
    *planned += (uint64_t)numel * (f32 ? 4 : 2);
    return (uint64_t)numel * 2;
}

/* tests/data/plan_headers/<model>/<comp>.txt -> <dir>/<comp>/<file>: the header, then a hole.
 * Returns the bytes the planner should count for it (see put_tensor). */
static uint64_t write_sparse_checkpoint(const char *model, const char *comp, const char *dir) {
    char path[8192], line[1024];
    snprintf(path, sizeof path, "plan_headers/%s/%s.txt", model, comp);
    FILE *f = fopen(tu_data(path), "r");
    assert_non_null(f);
    hdr_buf b = {0};
    put(&b, "{");
    uint64_t off = 0, planned = 0;
    while (fgets(line, sizeof line, f)) {
        char name[512], dt[16], dims[128], idx[512];
        if (sscanf(line, "%511s %15s %127s %511s", name, dt, dims, idx) != 4) continue;
        if (strcmp(idx, "-") == 0) {
            off += put_tensor(&b, name, dt, dims, off, &planned);
            continue;
        }
        int lo = 0, hi = -1;
        int list[256], nl = 0;
        if (sscanf(idx, "%d-%d", &lo, &hi) == 2 && strchr(idx, '-'))
            for (int i = lo; i <= hi && nl < 256; i++) list[nl++] = i;
        else
            for (char *p = idx; *p && nl < 256;) {
                list[nl++] = (int)strtol(p, &p, 10);
                if (*p == ',') p++;
            }
        char *hash = strchr(name, '#');
        assert_non_null(hash);
        for (int i = 0; i < nl; i++) {
            char nm[600];
            snprintf(nm, sizeof nm, "%.*s%d%s", (int)(hash - name), name, list[i], hash + 1);
            off += put_tensor(&b, nm, dt, dims, off, &planned);
        }
    }
    fclose(f);
    put(&b, "}");
    while ((b.n + 8) % 8) put(&b, " ");
    snprintf(path, sizeof path, "%s/%s", dir, comp);
    assert_int_equal(mkdir(path, 0755), 0);
    char cfg[4096];
    snprintf(cfg, sizeof cfg, "%s/../../models/configs/%s/%s/config.json", CDF_TEST_DATA, model, comp);
    snprintf(path, sizeof path, "%s/%s/config.json", dir, comp);
    assert_int_equal(symlink(cfg, path), 0);
    snprintf(path, sizeof path, "%s/%s/%s", dir, comp, strncmp(comp, "text_encoder", 12) == 0 ? "model.safetensors" : "diffusion_pytorch_model.safetensors");
    FILE *o = fopen(path, "wb");
    assert_non_null(o);
    const uint64_t hl = b.n;
    unsigned char le[8];
    for (int i = 0; i < 8; i++) le[i] = (unsigned char)(hl >> (8 * i));
    assert_int_equal(fwrite(le, 1, 8, o), 8);
    assert_int_equal(fwrite(b.s, 1, b.n, o), b.n);
    assert_int_equal(fflush(o), 0);
    assert_int_equal(ftruncate(fileno(o), (off_t)(8 + hl + off)), 0); /* the data: a hole */
    fclose(o);
    free(b.s);
    return planned;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static long minor_faults(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_minflt + ru.ru_majflt;
}

static void plan_model(const char *model, const char *const *comps, int height) {
    char dir[1024], src[4096];
    snprintf(dir, sizeof dir, "%s", tu_tmp_path(model));
    assert_int_equal(mkdir(dir, 0755), 0);
    snprintf(src, sizeof src, "%s/../../models/configs/%s/model_index.json", CDF_TEST_DATA, model);
    char idx[4096];
    snprintf(idx, sizeof idx, "%s/model_index.json", dir);
    assert_int_equal(symlink(src, idx), 0);
    uint64_t tr_planned = 0, file_bytes = 0;
    for (int i = 0; comps[i]; i++) {
        const uint64_t p = write_sparse_checkpoint(model, comps[i], dir);
        if (strcmp(comps[i], "transformer") == 0) tr_planned = p;
        file_bytes += p;
    }
    cdf_pipeline_load_params lp = cdf_pipeline_load_params_default();
    lp.weight_dtype = CDF_BF16;
    lp.offload = CDF_OFFLOAD_MODEL;
    cdf_generate_params gp = cdf_generate_params_default();
    gp.height = gp.width = height;
    cdf_memory_plan plan;
    const long f0 = minor_faults();
    const double t0 = now_s();
    const cdf_status s = cdf_pipeline_plan_memory(dir, &lp, &gp, &plan);
    const double dt = now_s() - t0;
    const long faults = minor_faults() - f0;
    if (s != CDF_OK) print_message("plan %s: %s\n", model, cdf_last_error());
    assert_int_equal(s, CDF_OK);
    print_message("%s %dx%d: planned in %.3f s, %ld page faults (the weights span %llu pages); peak %.2f GiB\n", model, height,
                  height, dt, faults, (unsigned long long)(file_bytes / 4096), plan.peak_bytes / 1073741824.0);
    for (int i = 0; i < plan.n_components; i++) {
        print_message("  %-15s %-32s weights %.3f GiB, activations %.3f GiB\n", plan.component[i].name, plan.component[i].class_name,
                      plan.component[i].weights_bytes / 1073741824.0, plan.component[i].activation_bytes / 1073741824.0);
        assert_true(plan.component[i].activation_known);
        assert_true(plan.component[i].activation_bytes > 0);
        if (strcmp(plan.component[i].name, "transformer") == 0) assert_int_equal(plan.component[i].weights_bytes, tr_planned);
    }
    assert_true(dt < 3.0);
    /* reading the weights would fault in one page per 4 KiB of them (millions); planning itself
     * touches some thousands */
    assert_true((uint64_t)faults < file_bytes / 4096 / 50);
}

static void test_flux1_dev(void **state) {
    (void)state;
    static const char *const comps[] = {"text_encoder", "text_encoder_2", "transformer", "vae", NULL};
    plan_model("flux1-dev", comps, 1024);
}

static void test_sd35_large(void **state) {
    (void)state;
    static const char *const comps[] = {"text_encoder", "text_encoder_2", "text_encoder_3", "transformer", "vae", NULL};
    plan_model("sd3.5-large", comps, 1024);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flux1_dev),
        cmocka_unit_test(test_sd35_large),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
