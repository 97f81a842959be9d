/* `cdiffusers plan`: the planner's expected peak device memory per phase, without loading or
 * running anything; and generate's --memory-stats report of what a run measured. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdiffusers/cdiffusers.h"
#include "common.h"
#include "plan.h"

enum { PLAN_OK = 0, PLAN_FAIL = 1, PLAN_USAGE = 2 };

static void fmt(char *buf, size_t n, uint64_t b) {
    if (b >= (1ull << 30)) snprintf(buf, n, "%.2f GiB", b / 1073741824.0);
    else if (b >= (1ull << 20)) snprintf(buf, n, "%.1f MiB", b / 1048576.0);
    else if (b >= 1024) snprintf(buf, n, "%.1f KiB", b / 1024.0);
    else snprintf(buf, n, "%llu B", (unsigned long long)b);
}

void cdf_cli_print_memory_stats(const cdf_pipeline *p) {
    cdf_pipeline_memory_stats ms;
    cdf_pipeline_last_memory_stats(p, &ms);
    char b[32];
    const cdf_offload_mode mode = cdf_pipeline_offload_mode(p);
    fprintf(stderr, "cdiffusers: device memory peaks (offload %s):",
            mode == CDF_OFFLOAD_SEQUENTIAL ? "sequential" : mode == CDF_OFFLOAD_MODEL ? "model" : "none");
    for (int i = 0; i < CDF_PHASE_COUNT; i++) {
        fmt(b, sizeof b, ms.phase_peak_bytes[i]);
        fprintf(stderr, "%s %s %s", i ? "," : "", cdf_pipeline_phase_name((cdf_pipeline_phase)i), b);
    }
    fmt(b, sizeof b, ms.peak_bytes);
    fprintf(stderr, "; peak %s (%llu bytes); models materialised: %d", b, (unsigned long long)ms.peak_bytes, ms.materialisations);
    if (mode != CDF_OFFLOAD_NONE) {
        fprintf(stderr, ", prefetched: %d", ms.prefetches);
        for (int i = 0; i < CDF_PHASE_COUNT; i++)
            if (ms.prefetch_peak_bytes[i]) {
                fmt(b, sizeof b, ms.prefetch_peak_bytes[i]);
                fprintf(stderr, " (during %s, peak %s)", cdf_pipeline_phase_name((cdf_pipeline_phase)i), b);
            }
    }
    fputc('\n', stderr);
}

static int usage_error(const char *fmt_, const char *arg) {
    fprintf(stderr, "cdiffusers: ");
    fprintf(stderr, fmt_, arg);
    fprintf(stderr, "\n(see cdiffusers --help)\n");
    return PLAN_USAGE;
}

static bool parse_long(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

/* CDIFFUSERS_OFFLOAD_PREFETCH=0 (the library's planner reads the same) */
static bool prefetch_env_on(void) {
    const char *e = getenv("CDIFFUSERS_OFFLOAD_PREFETCH");
    return !(e && strcmp(e, "0") == 0);
}

int cdf_cli_plan(int argc, char **argv) {
    const char *model = NULL, *dtype = "bf16", *offload = "none"; /* generate's defaults */
    cdf_generate_params gp = cdf_generate_params_default();
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},  {"height", required_argument, 0, 'H'},
        {"width", required_argument, 0, 'W'},  {"offload", required_argument, 0, 'O'},
        {"dtype", required_argument, 0, 'd'},  {"max-sequence-length", required_argument, 0, 'L'},
        {"guidance", required_argument, 0, 'g'}, {"negative-prompt", required_argument, 0, 'n'},
        {"true-cfg-scale", required_argument, 0, 'T'}, {"mode", required_argument, 0, 'M'},
        {"compile-repeated-blocks", no_argument, 0, 'B'}, {"vae-tiling", required_argument, 0, 'V'},
        {"vae-tile-size", required_argument, 0, 'S'}, {"transformer", required_argument, 0, 'F'},
        {"vae", required_argument, 0, 'E'},     {"weight-type", required_argument, 0, 'Q'},
        {"config", required_argument, 0, 'C'},  {"cache", required_argument, 0, 'K'},
        {"device-memory", required_argument, 0, 'D'}, {"device", required_argument, 0, 'v'},
        {0, 0, 0, 0},
    };
    /* --transformer / --vae FILE (a .gguf is planned from its own tensors), --weight-type as generate */
    cdf_component_file files[2];
    int n_files = 0;
    const char *weight_type = NULL, *config = NULL; /* --config DIR: with --model FILE */
    uint64_t budget = 0; /* --device-memory: the budget the prefetch decisions are planned for */
    const char *device = NULL; /* --device: pjrt plans its buffers' release and (XLA CPU) its programs' temporaries */
    /* as generate runs: CDIFFUSERS_COMPILE=blocks compiles the blocks, =1 / fullgraph the whole
     * model (which sequential offload turns into repeated-block compile) */
    const char *env = getenv("CDIFFUSERS_COMPILE");
    bool blocks = env && strcmp(env, "blocks") == 0;
    bool whole = env && *env && strcmp(env, "0") != 0 && !blocks;
    int c;
    long v;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'H':
            if (!parse_long(optarg, 1, 1 << 16, &v)) return usage_error("--height needs a positive integer, got '%s'", optarg);
            gp.height = (int)v;
            break;
        case 'W':
            if (!parse_long(optarg, 1, 1 << 16, &v)) return usage_error("--width needs a positive integer, got '%s'", optarg);
            gp.width = (int)v;
            break;
        case 'O': offload = optarg; break;
        case 'd': dtype = optarg; break;
        case 'L':
            if (!parse_long(optarg, 1, 512, &v)) return usage_error("--max-sequence-length needs an integer between 1 and 512, got '%s'", optarg);
            gp.max_sequence_length = (int)v;
            break;
        case 'g':
            if (!cdf_cli_parse_double(optarg, &gp.guidance_scale)) return usage_error("--guidance needs a number, got '%s'", optarg);
            break;
        case 'n': gp.negative_prompt = optarg; break;
        case 'T':
            if (!cdf_cli_parse_double(optarg, &gp.true_cfg_scale)) return usage_error("--true-cfg-scale needs a number, got '%s'", optarg);
            break;
        case 'M':
            if (strcmp(optarg, "compile") == 0) whole = true;
            else if (strcmp(optarg, "eager") == 0 || strcmp(optarg, "fuse") == 0) whole = false;
            else return usage_error("--mode must be eager, fuse or compile, got '%s'", optarg);
            break;
        case 'B': blocks = true; break;
        case 'V': /* auto plans the untiled decode (generate tiles only when that does not fit) */
            if (strcmp(optarg, "on") == 0) gp.vae_tiling = CDF_VAE_TILING_ON;
            else if (strcmp(optarg, "off") == 0 || strcmp(optarg, "auto") == 0) gp.vae_tiling = CDF_VAE_TILING_OFF;
            else return usage_error("--vae-tiling needs auto, on or off, got '%s'", optarg);
            break;
        case 'S':
            if (!parse_long(optarg, 1, 4096, &v)) return usage_error("--vae-tile-size needs a number of pixels, got '%s'", optarg);
            gp.vae_tile_size = (int)v;
            gp.vae_tiling = CDF_VAE_TILING_ON;
            break;
        case 'F':
        case 'E': files[n_files < 2 ? n_files++ : 1] = (cdf_component_file){c == 'F' ? "transformer" : "vae", optarg}; break;
        case 'Q': weight_type = optarg; break;
        case 'C': config = optarg; break;
        case 'v': device = optarg; break;
        case 'D': {
            const int64_t b = cdf_parse_bytes(optarg);
            if (b <= 0) return usage_error("--device-memory needs a size like 8G or 512M, got '%s'", optarg);
            budget = (uint64_t)b;
            break;
        }
        case 'K':
            if (cdf_pipeline_cache_check(optarg) != CDF_OK) return usage_error("--cache: %s", cdf_last_error());
            gp.cache = optarg;
            break;
        default: return PLAN_USAGE;
        }
    }
    if (optind < argc) return usage_error("unexpected argument '%s'", argv[optind]);
    if (!model) return usage_error("%s", "plan needs --model DIR (or --model FILE, an all-in-one file)");
    cdf_pipeline_load_params lp = cdf_pipeline_load_params_default();
    if (strcmp(dtype, "f32") == 0) lp.weight_dtype = CDF_F32;
    else if (strcmp(dtype, "bf16") == 0) lp.weight_dtype = CDF_BF16;
    else return usage_error("--dtype must be f32 or bf16, got '%s'", dtype);
    if (cdf_cli_parse_offload(offload, &lp.offload) != 0) return usage_error("--offload must be none, model or sequential, got '%s'", offload);
    lp.component_files = files;
    lp.num_component_files = n_files;
    lp.device = device;
    lp.config = config;
    if (weight_type && (strcmp(weight_type, "q8_0") == 0 || strcmp(weight_type, "q4_k") == 0))
        lp.quantize_weights = weight_type[1] == '8' ? CDF_GGML_Q8_0 : CDF_GGML_Q4_K;
    else if (weight_type && strcmp(weight_type, dtype) == 0)
        lp.decode_quantized = true;
    else if (weight_type)
        return usage_error("--weight-type must be q8_0, q4_k, or the --dtype (decode blocks at load), got '%s'", weight_type);
    if (whole && lp.offload == CDF_OFFLOAD_SEQUENTIAL) blocks = true;
    const cdf_plan_execution exec = blocks ? CDF_PLAN_REPEATED_BLOCKS : CDF_PLAN_EAGER;
    cdf_memory_plan plan;
    if (cdf_pipeline_plan_memory_budget(model, &lp, &gp, exec, budget, &plan) != CDF_OK) {
        fprintf(stderr, "cdiffusers: plan: %s\n", cdf_last_error());
        return PLAN_FAIL;
    }
    char b1[32], b2[32], b3[32];
    printf("%s (%s): %dx%d, max_sequence_length %d, batch %d%s, weights %s, offload %s\n", model, plan.pipeline_class,
           plan.width, plan.height, plan.max_sequence_length, plan.batch, plan.batch > 1 ? " (CFG)" : "",
           cdf_dtype_name(plan.weight_dtype), offload);
    printf("\n%-16s %-30s %12s %14s\n", "component", "class", "weights", "activations");
    bool unknown = false;
    for (int i = 0; i < plan.n_components; i++) {
        fmt(b1, sizeof b1, plan.component[i].weights_bytes);
        fmt(b2, sizeof b2, plan.component[i].activation_bytes);
        printf("%-16s %-30s %12s %14s\n", plan.component[i].name, plan.component[i].class_name, b1,
               plan.component[i].activation_known ? b2 : "unknown");
        unknown |= !plan.component[i].activation_known;
    }
    if (plan.n_blocks > 0) {
        fmt(b1, sizeof b1, plan.blocks_weights_bytes);
        fmt(b2, sizeof b2, plan.largest_block_bytes);
        printf("transformer blocks: %d, %s in all, the largest %s%s\n", plan.n_blocks, b1, b2,
               plan.offload == CDF_OFFLOAD_SEQUENTIAL ? " (sequential: host-side, materialised one at a time)" : "");
    }
    if (plan.cache_bytes) {
        fmt(b1, sizeof b1, plan.cache_bytes);
        printf("step cache %s: %s kept across steps (in the denoising activations)\n", gp.cache, b1);
    }
    printf("\n%-16s %12s %14s %12s\n", "phase", "weights", "activations", "peak");
    for (int ph = 0; ph < CDF_PHASE_COUNT; ph++) {
        fmt(b1, sizeof b1, plan.phase[ph].weights_bytes);
        fmt(b2, sizeof b2, plan.phase[ph].activation_bytes);
        fmt(b3, sizeof b3, plan.phase[ph].peak_bytes);
        printf("%-16s %12s %14s %12s\n", cdf_pipeline_phase_name((cdf_pipeline_phase)ph), b1, b2, b3);
    }
    /* offload's prefetch: where the next model is materialised before the phase's work ends */
    static const char *const next_model[CDF_PHASE_COUNT] = {"the transformer", "the VAE", ""};
    for (int ph = 0; ph < CDF_PHASE_COUNT; ph++) {
        if (!plan.phase[ph].prefetch_peak_bytes) continue;
        fmt(b1, sizeof b1, plan.phase[ph].prefetch_peak_bytes);
        if (!prefetch_env_on())
            printf("prefetch of %s during %s: off (CDIFFUSERS_OFFLOAD_PREFETCH=0)\n", next_model[ph],
                   cdf_pipeline_phase_name((cdf_pipeline_phase)ph));
        else if (!budget)
            printf("prefetch of %s during %s: when the budget left holds %s (that phase's peak then)\n", next_model[ph],
                   cdf_pipeline_phase_name((cdf_pipeline_phase)ph), b1);
        else
            printf("prefetch of %s during %s: %s (%s needed, --device-memory %llu)\n", next_model[ph],
                   cdf_pipeline_phase_name((cdf_pipeline_phase)ph), plan.phase[ph].prefetch ? "yes" : "no, it does not fit",
                   b1, (unsigned long long)budget);
    }
    fmt(b1, sizeof b1, plan.peak_bytes);
    fmt(b2, sizeof b2, plan.total_weights_bytes);
    fmt(b3, sizeof b3, plan.largest_weights_bytes);
    printf("\nexpected peak: %s (%llu bytes); all weights %s, largest model %s\n", b1, (unsigned long long)plan.peak_bytes, b2, b3);
    if (plan.need_bytes != plan.peak_bytes) {
        fmt(b1, sizeof b1, plan.need_bytes);
        printf("(with the prefetches above; without them %s (%llu bytes): the smallest --device-memory under which "
               "generate should run, %s)\n", b1, (unsigned long long)plan.need_bytes,
               blocks ? "with repeated-block compile" : whole ? "eager execution: whole-model compile needs at most this"
                                                             : "eager or defer-and-fuse execution");
    } else
        printf("(the smallest --device-memory / CDIFFUSERS_CPU_MEMORY_LIMIT under which generate should run, %s)\n",
               blocks  ? "with repeated-block compile"
               : whole ? "eager execution: whole-model compile needs at most this"
                       : "eager or defer-and-fuse execution");
    if (unknown) printf("note: no activation formula for some classes: their activations are not counted\n");
    return PLAN_OK;
}
