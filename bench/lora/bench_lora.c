/* bench/lora: the cost of a LoRA adapter at run time vs fused (issue #20). One transformer
 * forward of a random-weight FLUX.1 model of real width (3072) and reduced depth (1 double + 1
 * single block, 512 text tokens) with a random adapter of rank 16 or 64 on every linear layer:
 * no adapter, run time (PEFT's W x + s B(A x), the scale a graph parameter) and fused (W + s B A
 * once at load), all in the same process, eager execution. Prints the adapter load time (file
 * read, checks, upload; fusing included), the first call and the mean of the next calls, with
 * ratios to no adapter. Not a test: numbers depend on the machine and its load. */
#define MRP_NO_MAIN
#include "../../tools/make-random-pipeline/make_random_pipeline.c"

#include <unistd.h>

#include "cdiffusers/cdiffusers.h"
#include "models/component.h"
#include "nn/lora.h"
#include "nn/nn.h"
#include "pipelines/pipeline_impl.h"
#include "../flux_bench_inputs.h"

/* the adapters' values */
static uint64_t rng_state = 88172645463325252ull;
static float rnd(float scale) {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return scale * (float)((double)(rng_state >> 11) / 9007199254740992.0 * 2 - 1);
}

static cdf_component *load(const char *dir) {
    cdf_load_options o = cdf_load_options_default();
    o.device = cdf_device_get("cpu");
    cdf_component *c = NULL;
    if (cdf_component_load(dir, &o, &c) != CDF_OK) {
        fprintf(stderr, "load %s: %s\n", dir, cdf_last_error());
        exit(1);
    }
    return c;
}

/* A diffusers-format adapter of rank r on every linear layer of c. Returns the layer count. */
static int write_adapter(cdf_component *c, int64_t r, const char *path) {
    cdf_layer_index *ix = cdf_component_layers(c);
    cdf_st_writer *w = cdf_st_writer_new();
    const int n = cdf_layer_index_count(ix);
    char key[512];
    for (int i = 0; i < n; i++) {
        const char *name;
        cdf_linear_layer *l = cdf_layer_index_at(ix, i, &name);
        const int64_t sa[2] = {r, l->in}, sb[2] = {l->out, r};
        float *a = malloc((size_t)(r * l->in) * sizeof *a), *b = malloc((size_t)(l->out * r) * sizeof *b);
        for (int64_t k = 0; k < r * l->in; k++) a[k] = rnd(0.02f);
        for (int64_t k = 0; k < l->out * r; k++) b[k] = rnd(0.02f);
        snprintf(key, sizeof key, "transformer.%s.lora_A.weight", name);
        if (cdf_st_writer_add(w, key, CDF_F32, 2, sa, a) != CDF_OK) exit(1);
        snprintf(key, sizeof key, "transformer.%s.lora_B.weight", name);
        if (cdf_st_writer_add(w, key, CDF_F32, 2, sb, b) != CDF_OK) exit(1);
        free(a);
        free(b);
    }
    if (cdf_st_writer_save(w, path) != CDF_OK) {
        fprintf(stderr, "%s\n", cdf_last_error());
        exit(1);
    }
    cdf_st_writer_free(w);
    return n;
}

typedef struct result {
    double load, first, steady;
} result;

/* adapter NULL: no adapter */
static void run(const char *dir, const char *adapter, cdf_lora_mode mode, const cdf_tensor_map *in, int calls, result *r) {
    cdf_device *dev = cdf_device_get("cpu");
    cdf_component *c = load(dir);
    r->load = 0;
    if (adapter) {
        cdf_lora_components cs = {.n = 1, .name = {"transformer"}, .c = {c}};
        cdf_lora_params lp = cdf_lora_params_default();
        lp.mode = mode;
        lp.scale = 0.8f;
        const double t0 = now_s();
        if (cdf_lora_load_into(&cs, adapter, &lp, 0, NULL) != CDF_OK) {
            fprintf(stderr, "lora %s: %s\n", adapter, cdf_last_error());
            exit(1);
        }
        cdf_device_synchronize(dev);
        r->load = now_s() - t0;
    }
    cdf_tensor_map out;
    cdf_tensor_map_init(&out);
    double t0 = now_s();
    if (cdf_component_run(c, "forward", in, &out) != CDF_OK || cdf_device_synchronize(dev) != CDF_OK) {
        fprintf(stderr, "forward: %s\n", cdf_last_error());
        exit(1);
    }
    r->first = now_s() - t0;
    t0 = now_s();
    for (int i = 0; i < calls; i++) {
        cdf_tensor_map_clear(&out);
        if (cdf_component_run(c, "forward", in, &out) != CDF_OK || cdf_device_synchronize(dev) != CDF_OK) {
            fprintf(stderr, "forward: %s\n", cdf_last_error());
            exit(1);
        }
    }
    r->steady = (now_s() - t0) / calls;
    cdf_tensor_map_clear(&out);
    cdf_component_free(c);
}

int main(int argc, char **argv) {
    const char *work = argc > 1 ? argv[1] : "/tmp/cdf_bench_lora";
    const char *tok = argc > 2 ? argv[2] : "tests/data/tokenizers";
    const int calls = argc > 3 ? atoi(argv[3]) : 2;
    const int res = argc > 4 ? atoi(argv[4]) : 256;
    cdf_device *dev = cdf_device_get("cpu");
    mrp_spec s;
    if (mrp_preset("flux1", &s)) return 1;
    s.tokenizers = tok;
    s.dtype = MRP_F32;
    /* only the transformer matters: tiny text encoders and VAE (pooled widths kept real) */
    s.clip_l = (mrp_clip){.hidden = 768, .layers = 1, .heads = 2, .intermediate = 16, .projection = 0};
    s.clip_g = (mrp_clip){.hidden = 8, .layers = 1, .heads = 2, .intermediate = 16, .projection = 1280};
    s.t5 = (mrp_t5){.d_model = 4096, .layers = 1, .heads = 2, .d_kv = 8, .d_ff = 16};
    s.vae = (mrp_vae){.n_blocks = 4, .channels = {8, 8, 8, 8}, .layers_per_block = 1, .groups = 4};
    s.flux.layers = 1;
    s.flux.single_layers = 1;
    char dir[512], tdir[600];
    snprintf(dir, sizeof dir, "%s/flux", work);
    snprintf(tdir, sizeof tdir, "%s/transformer", dir);
    if (access(tdir, F_OK) != 0 && mrp_write_pipeline(&s, dir)) return 1;

    cdf_tensor_map in;
    cdf_tensor_map_init(&in);
    flux_bench_inputs(dev, res, &in);

    char a16[700], a64[700];
    snprintf(a16, sizeof a16, "%s/lora_r16.safetensors", work);
    snprintf(a64, sizeof a64, "%s/lora_r64.safetensors", work);
    cdf_component *c = load(tdir);
    const int n16 = write_adapter(c, 16, a16);
    write_adapter(c, 64, a64);
    cdf_component_free(c);

    printf("\n### FLUX.1 width (3072), 1 double + 1 single block, 512 text tokens, %dx%d, adapter on all %d linears, "
           "eager, %d steady calls\n\n", res, res, n16, calls);
    printf("| adapter | mode | adapter load s | first call s | steady s | vs none |\n|---|---|---|---|---|---|\n");
    const struct {
        const char *name, *path;
        cdf_lora_mode mode;
    } cases[] = {{"none", NULL, CDF_LORA_RUNTIME},     {"rank 16", a16, CDF_LORA_RUNTIME}, {"rank 16", a16, CDF_LORA_FUSE},
                 {"rank 64", a64, CDF_LORA_RUNTIME},   {"rank 64", a64, CDF_LORA_FUSE},
                 /* again at the end: how far the machine's load moved the baseline during the run */
                 {"none (again)", NULL, CDF_LORA_RUNTIME}};
    result base = {0};
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        result r;
        run(tdir, cases[k].path, cases[k].mode, &in, calls, &r);
        if (k == 0) base = r;
        printf("| %s | %s | %.2f | %.2f | %.2f | %.3fx |\n", cases[k].name,
               !cases[k].path ? "-" : cases[k].mode == CDF_LORA_RUNTIME ? "run time" : "fused", r.load, r.first, r.steady,
               r.steady / base.steady);
        fflush(stdout);
    }
    cdf_tensor_map_clear(&in);
    return 0;
}
