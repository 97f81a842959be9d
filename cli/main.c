/* The cdiffusers command-line tool: generate, run-model, tokenize, info. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cdiffusers/cdiffusers.h"
#include "cdiffusers/dist.h"
#include "core/error_internal.h"
#include "models/component.h"
#include "batch.h" /* cli/batch.c: --image/--mask, batches, prompt files, numbered outputs */
#include "common.h" /* cli/common.c: what generate shares with serve (cli/serve.c) */
#include "convert.h" /* cli/convert.c: the convert command */
#include "devices.h"
#include "nn/weights_source.h" /* info: a component file's format and tensor types */
#include "pipelines/pipeline_impl.h" /* info: cdf_pipe_text_part */
#include "plan.h"  /* cli/plan.c: the plan command, --memory-stats */
#include "io/json.h"

/* Exit codes */
enum { EXIT_OK = 0, EXIT_FAIL = 1, EXIT_USAGE = 2, EXIT_INTERRUPTED = 130 };

static volatile sig_atomic_t g_interrupted;

/* --device NAME (generate, run-model): NULL = the default device, the best one available. */
static const char *g_device_name;
static cdf_device *cli_device(void) { return g_device_name ? cdf_device_get(g_device_name) : cdf_device_default(); }
static void on_sigint(int sig) {
    (void)sig;
    g_interrupted = 1;
}

static void usage(FILE *f) {
    fprintf(f,
            "cdiffusers %s — diffusers text-to-image pipelines in C\n"
            "\n"
            "usage:\n"
            "  cdiffusers generate [--model DIR] --prompt TEXT [options]\n"
            "      --model DIR              FluxPipeline/SD3/FLUX.2 folder (default: the bundled models/shapes-flux-tiny;\n"
            "                               DIR/cdiffusers_defaults.json, if present, sets the defaults below)\n"
            "      --model FILE             an all-in-one .safetensors (ComfyUI / Stability: transformer, VAE, text\n"
            "                               encoders) of FLUX.1-dev/-schnell, SD3-Medium, SD3.5-Medium/-Large, with\n"
            "                               the configs shipped for it (models/configs); what it lacks: --vae FILE,\n"
            "                               --text-encoder N=FILE\n"
            "      --config DIR             with --model FILE: configs and tokenizers from this diffusers folder\n"
            "                               (its weights are not read), as diffusers' from_single_file(config=)\n"
            "      --negative-prompt TEXT   negative prompt (SD3 CFG; Flux true CFG with --true-cfg-scale)\n"
            "      --height H --width W     image size (multiples of 16; default: the model's)\n"
            "      --steps N                denoising steps (default 28)\n"
            "      --guidance G             guidance scale (Flux-dev embedded guidance, SD3 CFG; default 3.5 / 7.0)\n"
            "      --true-cfg-scale G       Flux true classifier-free guidance (needs --negative-prompt)\n"
            "      --seed S                 seed of torch.Generator('cpu').manual_seed(S) (default 0)\n"
            "      --output FILE.png        where to write the image (default out.png)\n"
            "      --force                  overwrite an existing output file\n"
            "      --threads N              compute threads (default: all cores)\n"
            "      --dtype bf16|f32         bf16 (default): bf16 weights, matmul/conv inputs rounded to bf16, f32\n"
            "                               accumulation, f32 elsewhere; f32: the exact path\n"
            "      --weight-type q8_0|q4_k|f32|bf16  q8_0 / q4_k: quantize linear layers' weights at load (as\n"
            "                               gguf-py's Q8_0 / ggml's Q4_K encoders);\n"
            "                               f32|bf16 (= --dtype): decode a .gguf's blocks at load (default: they\n"
            "                               stay quantized in memory, decoded inside each matmul)\n"
            "      --max-sequence-length N  T5 tokens (default Flux 512, SD3 256)\n"
            "      --text-encoder-out-layers A,B,C  FLUX.2: text encoder layers stacked into the prompt embedding\n"
            "                               (default 10,20,30)\n"
            "      --latents-out FILE       also write latents_initial / latents_final (safetensors)\n"
            "      --device NAME            device to run on, e.g. cpu, cpu:0, pjrt (the XLA CPU / GPU plugin or a TPU;\n"
            "                               default: the best available or $CDIFFUSERS_DEVICE; see cdiffusers devices)\n"
            "      --pjrt-cache DIR|off     where the pjrt backend keeps compiled programs (default\n"
            "                               $XDG_CACHE_HOME/cdiffusers/pjrt or ~/.cache/cdiffusers/pjrt; also $CDIFFUSERS_PJRT_CACHE)\n"
            "      --image IN.png           img2img (FluxImg2ImgPipeline / StableDiffusion3Img2ImgPipeline): start from\n"
            "                               this RGB picture, resized to --height x --width (default: its own size\n"
            "                               rounded down to a multiple of 16). FLUX.2: a reference image the prompt\n"
            "                               refers to (repeat --image for up to 10)\n"
            "      --strength S             img2img / inpainting: how much of the schedule runs, in (0, 1] (default 0.6)\n"
            "      --mask MASK.png          inpainting (Flux/SD3 InpaintPipeline): white = repaint, black = keep;\n"
            "                               grayscale or RGB, the size of --image\n"
            "      --num-images N           N images from one generator (diffusers' num_images_per_prompt)\n"
            "      --batch-seeds 1,2,3      one image per seed (a list of generators; each equals its --seed image, but\n"
            "                               an --image is encoded with the first seed, as diffusers does)\n"
            "      --prompts-file FILE      one prompt per line, instead of --prompt (the model is loaded once)\n"
            "                               several images are written as OUTPUT-000.png, OUTPUT-001.png, ...\n"
            "      --device-memory SIZE     device memory budget, e.g. 8G\n"
            "      --offload none|model|sequential  none (default): every model resident, fails up front if the\n"
            "                               weights exceed the budget; model: one model on the device at a time;\n"
            "                               sequential: model, and the transformer's blocks one (or two) at a time\n"
            "      --memory-stats           print the measured device peak of each phase to stderr\n"
            "      --cache first-block[:T]  diffusers' First Block Cache (FLUX.1): skip all but the first block on\n"
            "                               steps where its residual changed by at most T (relative; default\n"
            "                               0.05, diffusers' FirstBlockCacheConfig); see docs/step-caches.md\n"
            "      --cache mag[:key=value,...]  diffusers' MagCache (FLUX.1, FLUX.2): threshold (0.06),\n"
            "                               max_skip_steps (3), retention_ratio (0.2), num_inference_steps (--steps),\n"
            "                               mag_ratios ('[r0, r1, ...]', FLUX_MAG_RATIOS), calibrate (False; True:\n"
            "                               never skip, print the measured ratios on stdout to pass back as mag_ratios)\n"
            "      --cache taylorseer[:key=value,...]  diffusers' TaylorSeer (FLUX.1): cache_interval (5),\n"
            "                               disable_cache_before_step (3), disable_cache_after_step (None),\n"
            "                               max_order (1), taylor_factors_dtype (bfloat16), use_lite_mode (False)\n"
            "      --vae-tiling auto|on|off decode (and encode) the image in overlapping tiles, as diffusers'\n"
            "                               vae.enable_tiling(): the VAE's memory stops growing with the image\n"
            "                               (the picture differs slightly). auto (default): only when the planner\n"
            "                               says the untiled decode would not fit --device-memory (noted on stderr)\n"
            "      --vae-tile-size PX       tile size in pixels (default: the VAE config's sample_size, e.g. 1024:\n"
            "                               use 512 to tile a 1024x1024 image)\n"
            "      --tp N                   tensor parallelism over the N processes of an MPI job: each rank loads\n"
            "                               only its shard of the transformer and text encoders; rank 0 writes\n"
            "                               (mpirun -np N cdiffusers generate ... --tp N); with --device pjrt and\n"
            "                               no mpirun: one process over pjrt:0..N-1, the all-reduce in the programs\n"
            "      --tp-replicate A,B       components to keep whole on every rank (e.g. text_encoder_2)\n"
            "      --transformer FILE       the transformer's weights from one file in place of DIR/transformer's:\n"
            "                               .safetensors (diffusers, BFL FLUX or ComfyUI model.diffusion_model.*\n"
            "                               key names; fp8 and fp8_scaled too) or .gguf (F32..Q6_K, dequantized at\n"
            "                               load); DIR still gives the configs, tokenizers and other components\n"
            "      --vae FILE               the same for the VAE (diffusers key names)\n"
            "      --text-encoder N=FILE    the same for text encoder N (1, 2, 3) or a model_index name\n"
            "      --allow-unused-keys      load even if a --transformer/--vae/--text-encoder file holds tensors\n"
            "                               the model does not use (listed; refused by default)\n"
            "      --lora FILE[:SCALE]      apply a LoRA adapter (diffusers/PEFT or kohya file; scale default 1);\n"
            "                               repeatable: the adapters add up\n"
            "      --lora-mode runtime|fuse runtime (default): added to the layers' outputs, weights untouched;\n"
            "                               fuse: merged into the weights once at load (faster steps)\n"
            "      --lora-allow-unused      keys of a LoRA file that match no layer are a warning, not an error\n"
            "      --quiet                  no progress bar\n"
            "      --mode eager|fuse|compile  execution mode (default eager; env CDIFFUSERS_DEFER_AND_FUSE=1 = fuse)\n"
            "      --compile-repeated-blocks  compile only the transformer's repeated blocks (one graph per block class)\n"
            "  cdiffusers run-model --model COMPONENT_DIR --inputs IN.safetensors --output OUT.safetensors\n"
            "                       [--method forward|encode|decode] [--dtype f32|bf16] [--weight-type q8_0|q4_k|f32|bf16]\n"
            "                       [--weights FILE.safetensors|FILE.gguf] [--repeat N] [--force]\n"
            "                       [--mode eager|fuse|compile] [--no-fullgraph] [--compile-repeated-blocks]\n"
            "                       [--tp N [--tp-replicate A,B]]  (under mpirun -np N; rank 0 writes) [--device NAME]\n"
            "      one forward of one component, chosen by its config.json; inputs by diffusers' argument\n"
            "      names, outputs as out.<name>. With --repeat N prints forward_ms=<ms> per forward to stderr.\n"
            "  cdiffusers plan --model DIR [--height H --width W] [--offload none|model|sequential] [--dtype f32|bf16]\n"
            "                  [--max-sequence-length N] [--guidance G] [--negative-prompt TEXT] [--true-cfg-scale G]\n"
            "                  [--mode eager|fuse|compile] [--compile-repeated-blocks] [--cache first-block[:T]|mag[:k=v,...]|taylorseer[:k=v,...]]\n"
            "                  [--vae-tiling auto|on|off]\n"
            "                  [--vae-tile-size PX] [--transformer FILE] [--vae FILE] [--weight-type q8_0|q4_k|f32|bf16]\n"
            "                  [--config DIR] [--device-memory SIZE] [--device NAME]  (--model FILE: an all-in-one file, as generate)\n"
            "      expected peak device memory per phase (weights + activations) without loading or running,\n"
            "      for the execution generate would use with the same options (and CDIFFUSERS_COMPILE); with\n"
            "      offload, whether the next model is prefetched under --device-memory (the budget left to the run)\n",
            CDIFFUSERS_VERSION);
    cdf_cli_serve_usage(f);
    fprintf(f,
            "  cdiffusers tokenize --model DIR --prompt TEXT [--max-length N]\n"
            "      DIR is a tokenizer folder or a pipeline folder (then every tokenizer_* is used)\n"
            "  cdiffusers info --model DIR|FILE [--config DIR] [--transformer FILE] [--vae FILE] [--text-encoder N=FILE]\n"
            "  cdiffusers convert --model DIR [--component NAME] [--transformer|--vae|--weights FILE]\n"
            "                     --output OUT.gguf [--type f32|bf16|q8_0|q4_k] [--force] [--format gguf|diffusers]\n"
            "      one component (default transformer) as a GGUF v3 file in diffusers names that --transformer\n"
            "      loads back; q8_0/q4_k quantize linear weights as --weight-type does, other tensors stay float;\n"
            "      --format diffusers --output DIR: a diffusers component folder (f32|bf16 safetensors)\n"
            "  cdiffusers devices\n"
            "      the compiled-in backends, the PJRT plugins found, the devices (the first is the default), and why a\n"
            "      backend found none\n"
            "  cdiffusers cache list|clear\n"
            "      the pjrt backend's compiled programs on disk (docs/pjrt.md)\n"
            "  cdiffusers --help | --version\n"
            "\n"
            "environment: CDIFFUSERS_CPU_MEMORY_LIMIT=8G, CDIFFUSERS_NUM_THREADS=N,\n"
            "             CDIFFUSERS_BACKEND_AUTOLOAD=0 (load backends explicitly),\n"
            "             CDIFFUSERS_CPU_DISCRETE=1 (test mode: cpu memory not addressable above the backend),\n"
            "             CDIFFUSERS_LOG=io (per-rank weight bytes read, peak memory, communication),\n"
            "             CDIFFUSERS_DIST_TIMEOUT=S (seconds a rank waits for the others, default 600)\n"
            "exit codes: 0 ok, 1 failure, 2 usage error, 130 interrupted\n");
}

static int fail(const char *what) {
    fprintf(stderr, "cdiffusers: %s%s%s\n", what ? what : "", what && *what ? ": " : "", cdf_last_error());
    return cdf_last_status() == CDF_ERR_INTERRUPTED ? EXIT_INTERRUPTED : EXIT_FAIL;
}

static int usage_error(const char *fmt, const char *arg) {
    fprintf(stderr, "cdiffusers: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(see cdiffusers --help)\n");
    return EXIT_USAGE;
}

static bool parse_int(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

/* "10,20,30" -> up to max integers in [lo, hi]; false on anything else (empty items, junk). */
static bool parse_int_list(const char *s, long lo, long hi, int *out, int max, int *n) {
    *n = 0;
    for (const char *p = s;; p++) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < lo || v > hi || *n >= max) return false;
        out[(*n)++] = (int)v;
        p = end;
        if (*p == '\0') return true;
        if (*p != ',') return false;
    }
}

static bool parse_float(const char *s, float *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || !isfinite((float)v)) return false;
    *out = (float)v;
    return true;
}


/* ---- progress ---------------------------------------------------------------------------- */
typedef struct progress {
    bool tty;
    double total_s;
} progress;

static bool on_step(int step, int n, double step_s, void *user) {
    progress *pr = user;
    pr->total_s += step_s;
    if (pr->tty) {
        int width = 30, done = step * width / n;
        double eta = pr->total_s / step * (n - step);
        fprintf(stderr, "\r[");
        for (int i = 0; i < width; i++) fputc(i < done ? '#' : '.', stderr);
        fprintf(stderr, "] %d/%d  %.2f s/step  ETA %.1f s ", step, n, step_s, eta);
        if (step == n) fputc('\n', stderr);
        fflush(stderr);
    }
    return !g_interrupted;
}

/* ---- tensor parallelism (MPI) ---------------------------------------------------------------- */
typedef struct tp_run {
    cdf_process_group *pg; /* NULL for a run without tensor parallelism */
    cdf_device_mesh *mesh;
    int rank, world;
} tp_run;

/* How many processes the MPI launcher started (0 when not started by one). */
static long launcher_world_size(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
        long v;
        const char *e = getenv(vars[i]);
        if (e && parse_int(e, 1, 1L << 30, &v)) return v;
    }
    return 0;
}

/* The device --tp runs on (--device, else CDIFFUSERS_DEVICE), or NULL for the default. */
static const char *tp_device_name(void) {
    const char *e = getenv("CDIFFUSERS_DEVICE");
    return g_device_name ? g_device_name : e && *e ? e : NULL;
}

/* --tp N without an MPI launcher on a backend that runs one program over N devices (pjrt):
 * one process, the all-reduce inside the programs. */
static bool tp_in_one_process(long tp) {
    return tp > 1 && launcher_world_size() == 0 && cdf_backend_runs_replicas(tp_device_name());
}

/* Before any MPI call: the --tp value and the way the process was started must agree. */
static int check_launch(long tp) {
    const long world = launcher_world_size();
    char msg[256];
    if (tp <= 1 && world > 1) {
        snprintf(msg, sizeof msg, "this process is one of %ld started by an MPI launcher but --tp is not given (every rank "
                 "would compute and write the whole image); add --tp %ld", world, world);
        return usage_error("%s", msg);
    }
    if (tp <= 1 || tp_in_one_process(tp)) return EXIT_OK;
    if (!cdf_dist_backend_available("mpi")) {
        fprintf(stderr, "cdiffusers: --tp %ld needs MPI, and this build of cdiffusers has none (Open MPI was not found when it "
                "was configured)\n", tp);
        return EXIT_FAIL;
    }
    if (world == 0) {
        snprintf(msg, sizeof msg, "--tp %ld needs %ld processes: start it with mpirun -np %ld cdiffusers ... --tp %ld", tp, tp,
                 tp, tp);
        return usage_error("%s", msg);
    }
    if (world != tp) {
        snprintf(msg, sizeof msg, "--tp %ld but the MPI launcher started %ld processes (use mpirun -np %ld)", tp, world, tp);
        return usage_error("%s", msg);
    }
    return EXIT_OK;
}

/* The mesh over the group on `dev` and tensor parallelism on; on failure both are undone. */
static int tp_mesh(tp_run *tr, cdf_device *dev, const char *replicate) {
    if (cdf_device_mesh_new(tr->pg, dev, &tr->mesh) != CDF_OK || cdf_tp_enable(tr->mesh, replicate) != CDF_OK) {
        int rc = fail("--tp");
        cdf_device_mesh_free(tr->mesh);
        cdf_dist_finalize(tr->pg);
        return rc;
    }
    return EXIT_OK;
}

/* --tp N > 1: join the MPI job (or, in one process, open N devices of the backend) and shard
 * every model with a tensor-parallel plan over it. */
static int tp_start(tp_run *tr, long tp, const char *replicate) {
    memset(tr, 0, sizeof *tr);
    tr->world = 1;
    if (tp <= 1) return EXIT_OK;
    if (tp_in_one_process(tp)) {
        /* a TP degree the plugin has no devices for fails here, before any weight is read */
        if (cdf_dist_init_devices(tp_device_name(), (int)tp, &tr->pg) != CDF_OK) return fail("--tp");
        tr->world = (int)tp;
        return tp_mesh(tr, cdf_dist_replica_device(tr->pg), replicate);
    }
    if (cdf_dist_init("mpi", &tr->pg) != CDF_OK) return fail("--tp");
    tr->rank = cdf_dist_rank(tr->pg);
    tr->world = cdf_dist_world_size(tr->pg);
    if (tr->world != tp) { /* the launcher's variables lied; every rank sees the same sizes */
        fprintf(stderr, "cdiffusers: --tp %ld but the MPI job has %d processes\n", tp, tr->world);
        cdf_dist_finalize(tr->pg);
        return EXIT_USAGE;
    }
    return tp_mesh(tr, cli_device(), replicate);
}

static void tp_end(tp_run *tr) {
    if (!tr->pg) return;
    cdf_tp_disable();
    cdf_device_mesh_free(tr->mesh);
    cdf_dist_finalize(tr->pg);
    memset(tr, 0, sizeof *tr);
}

/* CDIFFUSERS_LOG=io: one line per rank with what it read, held and sent. */
static void log_io(const tp_run *tr, cdf_device *dev, uint64_t weight_bytes) {
    const char *log = getenv("CDIFFUSERS_LOG");
    if (!log || !strstr(log, "io")) return;
    cdf_memory_stats ms = {0};
    if (dev) cdf_device_memory_stats(dev, &ms);
    cdf_dist_stats ds;
    cdf_dist_get_stats(tr->pg, &ds);
    fprintf(stderr,
            "cdiffusers: io: rank=%d world=%d weight_bytes_read=%llu device_peak_bytes=%llu collectives=%llu "
            "comm_bytes=%llu comm_seconds=%.3f\n",
            tr->rank, tr->world, (unsigned long long)weight_bytes, (unsigned long long)ms.peak_bytes,
            (unsigned long long)ds.collectives, (unsigned long long)ds.bytes, ds.seconds);
}

/* ---- component files: cli/common.h (CDF_CLI_OPT_*, cdf_cli_add_component_file) ----------------- */
enum { OPT_VAE_TILING = CDF_CLI_OPT_NEXT, OPT_VAE_TILE_SIZE, OPT_CACHE };

/* ---- generate ---------------------------------------------------------------------------- */
static int cmd_generate(int argc, char **argv) {
    const char *output = "out.png", *latents_out = NULL, *tp_replicate = NULL, *weight_type = NULL;
    const char *config = NULL; /* --config DIR: configs and tokenizers for --model FILE */
    cdf_cli_run_opts ro = cdf_cli_run_opts_default();
    bool force = false, quiet = false, memory_stats = false;
    bool user_true_cfg = false, user_strength = false, user_vae_tiling = false;
    long tp = 0;
    cdf_generate_params gp = cdf_generate_params_default();
    gp.prompt = NULL;
    static const struct option opts[] = {
        CDF_CLI_RUN_OPTIONS,                         CDF_CLI_LOAD_OPTIONS,
        {"prompt", required_argument, 0, 'p'},
        {"negative-prompt", required_argument, 0, 'n'}, {"height", required_argument, 0, 'H'},
        {"width", required_argument, 0, 'W'},        {"steps", required_argument, 0, 's'},
        {"guidance", required_argument, 0, 'g'},     {"true-cfg-scale", required_argument, 0, 'T'},
        {"seed", required_argument, 0, 'S'},         {"output", required_argument, 0, 'o'},
        {"force", no_argument, 0, 'f'},              {"max-sequence-length", required_argument, 0, 'L'},
        {"latents-out", required_argument, 0, 'l'},
        {"quiet", no_argument, 0, 'q'},              {"help", no_argument, 0, 'h'},
        {"tp", required_argument, 0, 'P'},           {"tp-replicate", required_argument, 0, 'R'},
        {"text-encoder-out-layers", required_argument, 0, 'Y'},
        {"memory-stats", no_argument, 0, 'K'},
        CDF_CLI_COMPONENT_OPTIONS,
        {"vae-tiling", required_argument, 0, OPT_VAE_TILING}, {"vae-tile-size", required_argument, 0, OPT_VAE_TILE_SIZE},
        {"cache", required_argument, 0, OPT_CACHE},
        {"device", required_argument, 0, 'D'},
        {"lora", required_argument, 0, 'A'},         {"lora-mode", required_argument, 0, 'Z'},
        {"lora-allow-unused", no_argument, 0, 'U'},
        {"image", required_argument, 0, 'I'},        {"mask", required_argument, 0, 'J'},
        {"strength", required_argument, 0, 'X'},     {"num-images", required_argument, 0, 'N'},
        {"batch-seeds", required_argument, 0, 'Q'},  {"prompts-file", required_argument, 0, 'F'},
        {0, 0, 0, 0},
    };
    int c;
    long v;
    int te_layers[16];
    cdf_cli_component_files cf = {0};
    bool allow_unused = false;
    enum { MAX_LORA = 16 };
    char lora_path[MAX_LORA][4096];
    float lora_scale[MAX_LORA];
    int n_lora = 0;
    cdf_lora_params lora_p = cdf_lora_params_default();
    static cdf_cli_gen g; /* static: the seed list is large */
    memset(&g, 0, sizeof g);
    optind = 1;
    g_device_name = NULL; /* cdf_cli_main may run many times in one process (fuzz_cli): no stale argv */
    while ((c = cdf_cli_next_option(argc, argv, opts, &ro)) != -1) {
        switch (c) {
        case 'p': gp.prompt = optarg; break;
        case 'n': gp.negative_prompt = optarg; break;
        case 'H':
            if (!parse_int(optarg, 1, 1 << 20, &v)) return usage_error("--height needs a positive integer, got '%s'", optarg);
            gp.height = (int)v;
            break;
        case 'W':
            if (!parse_int(optarg, 1, 1 << 20, &v)) return usage_error("--width needs a positive integer, got '%s'", optarg);
            gp.width = (int)v;
            break;
        case 's':
            if (!parse_int(optarg, 1, 1000, &v)) return usage_error("--steps needs an integer between 1 and 1000, got '%s'", optarg);
            gp.num_inference_steps = (int)v;
            break;
        case 'g':
            /* negative is refused, not passed on: the library reads a negative guidance_scale as
             * "the pipeline default", so -5 would silently become 3.5 / 7.0. diffusers takes it
             * (SD3: no CFG, as for any scale <= 1; Flux-dev/FLUX.2: an embedded guidance far
             * outside what the model was distilled on), but no supported model means anything
             * useful by it; 0 stays valid. */
            if (!cdf_cli_parse_double(optarg, &gp.guidance_scale) || !isfinite((float)gp.guidance_scale) || gp.guidance_scale < 0)
                return usage_error("--guidance needs a number >= 0, got '%s'", optarg);
            break;
        case 'T':
            if (!cdf_cli_parse_double(optarg, &gp.true_cfg_scale) || !isfinite((float)gp.true_cfg_scale)) return usage_error("--true-cfg-scale needs a number, got '%s'", optarg);
            user_true_cfg = true;
            break;
        case 'S': {
            char *end;
            errno = 0;
            unsigned long long s = strtoull(optarg, &end, 10);
            if (errno || end == optarg || *end || optarg[0] == '-') return usage_error("--seed needs a non-negative integer, got '%s'", optarg);
            gp.seed = s;
            break;
        }
        case 'o': output = optarg; break;
        case 'f': force = true; break;
        case 'L':
            if (!parse_int(optarg, 1, 512, &v)) return usage_error("--max-sequence-length needs an integer between 1 and 512, got '%s'", optarg);
            gp.max_sequence_length = (int)v;
            break;
        case 'l': latents_out = optarg; break;
        case 'Y':
            if (!parse_int_list(optarg, -4097, 4096, te_layers, 16, &gp.num_text_encoder_out_layers))
                return usage_error("--text-encoder-out-layers needs 1 to 16 comma-separated layer indices, e.g. 10,20,30, got '%s'",
                                   optarg);
            gp.text_encoder_out_layers = te_layers;
            break;
        case 'D': g_device_name = optarg; break;
        case 'q': quiet = true; break;
        case 'P':
            if (!parse_int(optarg, 1, 4096, &tp)) return usage_error("--tp needs a positive number of ranks, got '%s'", optarg);
            break;
        case 'R': tp_replicate = optarg; break;
        case 'K': memory_stats = true; break;
        case CDF_CLI_OPT_ALLOW_UNUSED_KEYS: allow_unused = true; break;
        case CDF_CLI_OPT_WEIGHT_TYPE: weight_type = optarg; break;
        case CDF_CLI_OPT_CONFIG: config = optarg; break;
        case OPT_VAE_TILING:
            if (strcmp(optarg, "auto") == 0) gp.vae_tiling = CDF_VAE_TILING_AUTO;
            else if (strcmp(optarg, "on") == 0) gp.vae_tiling = CDF_VAE_TILING_ON;
            else if (strcmp(optarg, "off") == 0) gp.vae_tiling = CDF_VAE_TILING_OFF;
            else return usage_error("--vae-tiling needs auto, on or off, got '%s'", optarg);
            user_vae_tiling = true;
            break;
        case OPT_CACHE:
            if (cdf_pipeline_cache_check(optarg) != CDF_OK) return usage_error("--cache: %s", cdf_last_error());
            gp.cache = optarg;
            break;
        case OPT_VAE_TILE_SIZE:
            if (!parse_int(optarg, 1, 4096, &v)) return usage_error("--vae-tile-size needs a number of pixels, got '%s'", optarg);
            gp.vae_tile_size = (int)v;
            if (!user_vae_tiling) gp.vae_tiling = CDF_VAE_TILING_ON; /* a tile size asks for tiles */
            break;
        case CDF_CLI_OPT_TRANSFORMER_FILE:
        case CDF_CLI_OPT_VAE_FILE:
        case CDF_CLI_OPT_TEXT_ENCODER_FILE:
            if (cdf_cli_add_component_file(&cf, c, optarg) != EXIT_OK) return EXIT_USAGE;
            break;
        case 'A': {
            if (n_lora == MAX_LORA) return usage_error("%s", "at most 16 --lora adapters");
            if (strlen(optarg) >= sizeof lora_path[0]) return usage_error("%s", "--lora: the path is too long");
            /* FILE[:SCALE]: a trailing ":<number>" is the scale (a path may contain ':') */
            snprintf(lora_path[n_lora], sizeof lora_path[0], "%s", optarg);
            lora_scale[n_lora] = 1.0f;
            char *colon = strrchr(lora_path[n_lora], ':');
            if (colon && colon[1]) {
                float sc;
                if (parse_float(colon + 1, &sc)) {
                    *colon = '\0';
                    lora_scale[n_lora] = sc;
                } else if (strspn(colon + 1, "0123456789.+-eEinfINFaA") == strlen(colon + 1)) {
                    return usage_error("--lora %s: the scale must be a finite number", optarg);
                }
            }
            if (!lora_path[n_lora][0]) return usage_error("--lora needs FILE[:SCALE], got '%s'", optarg);
            n_lora++;
            break;
        }
        case 'Z':
            if (strcmp(optarg, "runtime") == 0) lora_p.mode = CDF_LORA_RUNTIME;
            else if (strcmp(optarg, "fuse") == 0) lora_p.mode = CDF_LORA_FUSE;
            else return usage_error("--lora-mode must be runtime or fuse, got '%s'", optarg);
            break;
        case 'U': lora_p.allow_unused = true; break;
        case 'I':
            if (g.n_images == CDF_CLI_MAX_IMAGES) return usage_error("--image given more than 16 times (at '%s')", optarg);
            g.image_paths[g.n_images++] = optarg;
            break;
        case 'J': g.mask_path = optarg; break;
        case 'X':
            /* refused here, not passed on: (0, 1] is all diffusers accepts */
            if (!cdf_cli_parse_double(optarg, &gp.strength) || !(gp.strength > 0.0 && gp.strength <= 1.0))
                return usage_error("--strength needs a number in (0, 1], got '%s'", optarg);
            user_strength = true;
            break;
        case 'N':
            if (!parse_int(optarg, 1, CDF_CLI_MAX_SEEDS, &v)) return usage_error("--num-images needs an integer between 1 and 256, got '%s'", optarg);
            gp.num_images = (int)v;
            break;
        case 'Q':
            if (!cdf_cli_parse_seeds(optarg, &g))
                return usage_error("--batch-seeds needs 1 to 256 comma-separated non-negative integers, e.g. 1,2,3, got '%s'", optarg);
            break;
        case 'F': g.prompts_file = optarg; break;
        case 'h': usage(stdout); return EXIT_OK;
        default: return EXIT_USAGE;
        }
    }
    if (optind < argc) return usage_error("unexpected argument '%s'", argv[optind]);
    char default_model[4096];
    if (!ro.model) {
        if (!cdf_cli_find_default_model(default_model, sizeof default_model))
            return usage_error("%s", "generate needs --model DIR (the default model " CDF_CLI_DEFAULT_MODEL_NAME " was not found "
                               "next to the executable, in the source tree, or in $CDIFFUSERS_DEFAULT_MODEL)");
        ro.model = default_model;
    }
    const char *model = ro.model, *dtype = ro.dtype;
    cdf_cli_model_defaults model_defaults; /* outlives gp: gp.negative_prompt may point into it */
    if (cdf_cli_model_defaults_load(config ? config : model, &model_defaults) != CDF_OK) return fail(NULL);
    cdf_cli_model_defaults_apply(&model_defaults, &gp, user_true_cfg);
    int rc_tp = check_launch(tp);
    if (rc_tp != EXIT_OK) return rc_tp;
    if (!gp.prompt && !g.prompts_file) return usage_error("%s", "generate needs --prompt TEXT (or --prompts-file FILE)");
    if (gp.prompt && g.prompts_file) return usage_error("%s", "generate takes --prompt or --prompts-file, not both");
    if (user_strength && !g.n_images)
        return usage_error("%s", "--strength needs --image (img2img / inpainting)");
    if (g.mask_path && !g.n_images) return usage_error("%s", "--mask needs --image (the picture to inpaint)");
    if (g.n_seeds > 0 && gp.num_images > 1 && gp.num_images != g.n_seeds)
        return usage_error("%s", "--num-images and --batch-seeds disagree (--batch-seeds alone makes one image per seed)");
    cdf_pipeline_load_params lp = cdf_pipeline_load_params_default();
    lp.device = g_device_name;
    int64_t mem_bytes;
    if (!cdf_cli_run_opts_load(&ro, &lp, &mem_bytes)) return EXIT_USAGE;
    lp.component_files = cf.files;
    lp.num_component_files = cf.n;
    lp.allow_unused_keys = allow_unused;
    lp.config = config;
    const char *wt_err = cdf_cli_parse_weight_type(weight_type, dtype, &lp.decode_quantized, &lp.quantize_weights);
    if (wt_err) return usage_error("%s", wt_err);

    /* From here on, with --tp every rank must reach the agreement below: a failure is held in
     * `st` (with the stage it happened in), not returned, so that no rank is left waiting. */
    tp_run tr;
    int rc_start = tp_start(&tr, tp, tp_replicate);
    if (rc_start != EXIT_OK) return rc_start;
    const bool writer = tr.rank == 0; /* rank 0 writes; the other ranks write nothing */
    if (!writer) quiet = true;
    cdf_status st = CDF_OK;
    const char *stage = NULL;
    /* refuse early, before any work: nothing is lost, nothing is overwritten (the input image,
     * mask and prompts file are read here, so a bad one fails before the model loads) */
    g.output = output, g.latents_out = latents_out, g.model = model, g.dtype = dtype, g.force = force, g.quiet = quiet;
    if ((st = cdf_cli_gen_prepare(&g, &gp)) != CDF_OK) stage = "reading the inputs";
    if (st == CDF_OK && writer) st = cdf_cli_gen_check_outputs(&g, &gp);
    cdf_device *dev = st == CDF_OK ? cli_device() : NULL;
    if (st == CDF_OK && !dev) {
        st = cdf_last_status();
        stage = "device";
    }
    if (st == CDF_OK) {
        if (ro.threads) cdf_device_set_threads(dev, (int)ro.threads);
        if (mem_bytes >= 0) cdf_device_set_memory_limit(dev, (uint64_t)mem_bytes);
    }
    signal(SIGINT, on_sigint);
    cdf_pipeline *pipe = NULL;
    if (st == CDF_OK && cdf_cli_apply_mode(ro.mode) != CDF_OK) {
        st = cdf_last_status();
        stage = "setting the execution mode";
    }
    if (st == CDF_OK && cdf_pipeline_load(model, &lp, &pipe) != CDF_OK) {
        st = cdf_last_status();
        stage = "loading the pipeline";
    }
    for (int i = 0; i < n_lora && st == CDF_OK; i++) {
        cdf_lora_params p1 = lora_p;
        p1.scale = lora_scale[i];
        cdf_lora_info info;
        if (cdf_pipeline_load_lora(pipe, lora_path[i], &p1, &info) != CDF_OK) {
            st = cdf_last_status();
            stage = "loading a LoRA adapter";
        } else if (writer) {
            fprintf(stderr, "cdiffusers: LoRA %s (%s format): %d layer%s, scale %g, %s%s\n", lora_path[i], info.format,
                    info.layers, info.layers == 1 ? "" : "s", (double)p1.scale, p1.mode == CDF_LORA_FUSE ? "fused" : "run time",
                    info.unused_keys ? " (some keys unused, see the warning)" : "");
        }
    }
    if (st == CDF_OK && cdf_cli_compile(pipe, ro.mode, ro.blocks) != CDF_OK) {
        st = cdf_last_status();
        stage = "compiling";
    }
    const uint64_t weight_bytes = cdf_io_bytes_read();
    if (tr.pg) {
        if (st != CDF_OK && stage) cdf_error_prefix("%s: ", stage);
        st = cdf_dist_agree(tr.pg, st); /* on failure: "rank R of N failed: <its cause>", on every rank */
        stage = NULL;
    }
    if (st != CDF_OK) {
        int rc = fail(stage);
        cdf_cli_gen_free(&g);
        cdf_pipeline_free(pipe);
        tp_end(&tr);
        return rc;
    }
    progress pr = {.tty = !quiet && isatty(2)};
    gp.callback = on_step;
    gp.callback_user = &pr;
    bool generating = true;
    cdf_status s = cdf_cli_gen_run(&g, pipe, &gp, writer, &generating);
    if (s != CDF_OK && generating) {
        if (tr.pg) {
            /* the other ranks may be waiting in a collective this rank will never join: end the
             * job (the launcher stops them) after saying which rank failed and why */
            fprintf(stderr, "cdiffusers: rank %d of %d: generate: %s\n", tr.rank, tr.world, cdf_last_error());
            cdf_dist_abort(tr.pg, g_interrupted ? EXIT_INTERRUPTED : EXIT_FAIL);
        }
        int rc = g_interrupted ? EXIT_INTERRUPTED : fail("generate");
        if (g_interrupted) fprintf(stderr, "\ncdiffusers: interrupted; no output written\n");
        cdf_cli_gen_free(&g);
        cdf_pipeline_free(pipe);
        return rc;
    }
    int rc = s == CDF_OK ? EXIT_OK : fail(NULL);
    if (rc == EXIT_OK && memory_stats && writer) cdf_cli_print_memory_stats(pipe);
    log_io(&tr, dev, weight_bytes);
    cdf_cli_gen_free(&g);
    cdf_pipeline_free(pipe);
    tp_end(&tr);
    return rc;
}

/* ---- run-model --------------------------------------------------------------------------- */
static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static int cmd_run_model(int argc, char **argv) {
    const char *inputs = NULL, *output = NULL, *method = "forward";
    const char *tp_replicate = NULL, *weight_type = NULL, *weights_file = NULL;
    cdf_cli_run_opts ro = cdf_cli_run_opts_default(); /* as generate */
    long repeat = 1, tp = 0;
    bool force = false, no_fullgraph = false;
    static const struct option opts[] = {
        CDF_CLI_RUN_OPTIONS,
        {"inputs", required_argument, 0, 'i'},
        {"output", required_argument, 0, 'o'}, {"method", required_argument, 0, 'x'},
        {"repeat", required_argument, 0, 'r'}, {"force", no_argument, 0, 'f'},
        {"no-fullgraph", no_argument, 0, 'G'},
        {"tp", required_argument, 0, 'P'},     {"tp-replicate", required_argument, 0, 'R'},
        {"device", required_argument, 0, 'D'}, {"help", no_argument, 0, 'h'},
        {"weight-type", required_argument, 0, CDF_CLI_OPT_WEIGHT_TYPE}, {"weights", required_argument, 0, CDF_CLI_OPT_TRANSFORMER_FILE},
        {0, 0, 0, 0},
    };
    int c;
    optind = 1;
    g_device_name = NULL; /* cdf_cli_main may run many times in one process (fuzz_cli): no stale argv */
    while ((c = cdf_cli_next_option(argc, argv, opts, &ro)) != -1) {
        switch (c) {
        case CDF_CLI_OPT_WEIGHT_TYPE: weight_type = optarg; break;
        case CDF_CLI_OPT_TRANSFORMER_FILE: weights_file = optarg; break;
        case 'i': inputs = optarg; break;
        case 'o': output = optarg; break;
        case 'x': method = optarg; break;
        case 'r':
            if (!parse_int(optarg, 1, 100000, &repeat)) return usage_error("--repeat needs a positive integer, got '%s'", optarg);
            break;
        case 'G': no_fullgraph = true; break;
        case 'P':
            if (!parse_int(optarg, 1, 4096, &tp)) return usage_error("--tp needs a positive number of ranks, got '%s'", optarg);
            break;
        case 'R': tp_replicate = optarg; break;
        case 'D': g_device_name = optarg; break;
        case 'f': force = true; break;
        case 'h': usage(stdout); return EXIT_OK;
        default: return EXIT_USAGE;
        }
    }
    if (optind < argc) return usage_error("unexpected argument '%s'", argv[optind]);
    const char *model = ro.model;
    if (!model || !inputs || !output) return usage_error("%s", "run-model needs --model, --inputs and --output");
    int rc_tp = check_launch(tp);
    if (rc_tp != EXIT_OK) return rc_tp;
    if (strcmp(method, "forward") && strcmp(method, "encode") && strcmp(method, "decode"))
        return usage_error("--method must be forward, encode or decode, got '%s'", method);
    cdf_load_options opt = cdf_load_options_default();
    if (!cdf_cli_run_opts_dtype(&ro, &opt.weight_dtype)) return EXIT_USAGE;
    const char *wt_err = cdf_cli_parse_weight_type(weight_type, ro.dtype, &opt.decode_quantized, &opt.quantize_to);
    if (wt_err) return usage_error("%s", wt_err);
    opt.weights_file = weights_file;
    if (!force && cdf_cli_file_exists(output)) {
        fprintf(stderr, "cdiffusers: %s already exists (use --force to overwrite)\n", output);
        return EXIT_FAIL;
    }
    if (!cdf_cli_output_writable(output, force)) return fail(NULL);
    /* --tp: as in generate, every rank reaches the agreement after loading (a failure is held in
     * st with its stage, not returned), and only rank 0 writes the outputs */
    tp_run tr;
    int rc = tp_start(&tr, tp, tp_replicate);
    if (rc != EXIT_OK) return rc;
    cdf_status st = CDF_OK;
    const char *stage = NULL;
    opt.device = cli_device();
    if (!opt.device) st = cdf_last_status(), stage = "device";
    if (st == CDF_OK && ro.threads) cdf_device_set_threads(opt.device, (int)ro.threads);
    cdf_component *comp = NULL;
    if (st == CDF_OK && cdf_cli_apply_mode(ro.mode) != CDF_OK) st = cdf_last_status(), stage = "setting the execution mode";
    cdf_weights_report rep = {0};
    if (weights_file) opt.report = &rep; /* a file's tensors the model does not read: refused, as generate does */
    if (st == CDF_OK && cdf_component_load(model, &opt, &comp) != CDF_OK) st = cdf_last_status(), stage = "loading the model";
    if (st == CDF_OK && rep.unused)
        st = cdf_error(CDF_ERR_FORMAT, "%s: %d tensors the model does not read: %s", weights_file, rep.n_unused, rep.unused),
        stage = "loading the model";
    free(rep.unused);
    if (st == CDF_OK && (ro.mode == CDF_CLI_MODE_COMPILE || ro.blocks)) {
        cdf_compile_options co = cdf_compile_options_default();
        co.fullgraph = !no_fullgraph;
        if ((ro.blocks ? cdf_component_compile_repeated_blocks(comp, &co) : cdf_component_compile(comp, &co)) != CDF_OK)
            st = cdf_last_status(), stage = "compiling";
    }
    cdf_tensor_map in, out;
    cdf_tensor_map_init(&in);
    cdf_tensor_map_init(&out);
    if (st == CDF_OK && cdf_tensor_map_load(&in, inputs, opt.device) != CDF_OK) st = cdf_last_status(), stage = "reading inputs";
    const uint64_t weight_bytes = cdf_io_bytes_read();
    if (tr.pg) {
        if (st != CDF_OK && stage) cdf_error_prefix("%s: ", stage);
        st = cdf_dist_agree(tr.pg, st); /* on failure: "rank R of N failed: <its cause>", on every rank */
        stage = NULL;
    }
    if (st != CDF_OK) rc = fail(stage);
    for (long r = 0; r < repeat && rc == EXIT_OK; r++) {
        cdf_tensor_map_clear(&out);
        double t0 = now_ms();
        if (cdf_component_run(comp, method, &in, &out) != CDF_OK || cdf_device_synchronize(opt.device) != CDF_OK) {
            if (tr.pg) { /* the other ranks may wait in a collective this one will never join */
                fprintf(stderr, "cdiffusers: rank %d of %d: run-model: %s\n", tr.rank, tr.world, cdf_last_error());
                cdf_dist_abort(tr.pg, EXIT_FAIL);
            }
            rc = fail("running the model");
            break;
        }
        if (repeat > 1) fprintf(stderr, "forward_ms=%.3f\n", now_ms() - t0);
    }
    if (rc == EXIT_OK && tr.rank == 0 && cdf_tensor_map_save(&out, output, false) != CDF_OK) rc = fail("writing outputs");
    if (rc == EXIT_OK) log_io(&tr, opt.device, weight_bytes);
    cdf_tensor_map_clear(&in);
    cdf_tensor_map_clear(&out);
    cdf_component_free(comp);
    tp_end(&tr);
    return rc;
}

/* ---- tokenize ------------------------------------------------------------------------------ */
static int tokenize_one(const char *dir, const char *label, const char *prompt, long max_len) {
    cdf_tokenizer *tok = cdf_tokenizer_load(dir);
    if (!tok) return fail("loading the tokenizer"); /* the message names the folder and file */
    int ml = max_len > 0 ? (int)max_len : cdf_tokenizer_model_max_length(tok);
    if (ml <= 0 || ml > 4096) ml = 512;
    int64_t *ids = calloc((size_t)ml, sizeof *ids);
    int n = 0, nu = 0;
    int rc = EXIT_OK;
    if (!ids || cdf_tokenizer_encode(tok, prompt, strlen(prompt), ml, false, ids, NULL, &n, &nu) != CDF_OK) {
        rc = fail("tokenize");
    } else {
        printf("%s: %d tokens%s:", label, n, nu > n ? " (truncated)" : "");
        for (int i = 0; i < n; i++) printf(" %lld", (long long)ids[i]);
        printf("\n");
    }
    free(ids);
    cdf_tokenizer_free(tok);
    return rc;
}

static int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *prompt = NULL;
    long max_len = 0;
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'}, {"prompt", required_argument, 0, 'p'},
        {"max-length", required_argument, 0, 'L'}, {0, 0, 0, 0},
    };
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'p': prompt = optarg; break;
        case 'L':
            if (!parse_int(optarg, 1, 4096, &max_len)) return usage_error("--max-length needs a positive integer, got '%s'", optarg);
            break;
        default: return EXIT_USAGE;
        }
    }
    if (!model || !prompt) return usage_error("%s", "tokenize needs --model DIR and --prompt TEXT");
    char path[4096];
    snprintf(path, sizeof path, "%s/model_index.json", model);
    if (!cdf_cli_file_exists(path)) return tokenize_one(model, "tokens", prompt, max_len);
    static const char *const subs[] = {"tokenizer", "tokenizer_2", "tokenizer_3"};
    int rc = EXIT_OK;
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", model, subs[i]);
        if (cdf_cli_file_exists(path) && tokenize_one(path, subs[i], prompt, max_len) != EXIT_OK) rc = EXIT_FAIL;
    }
    return rc;
}

/* ---- info ---------------------------------------------------------------------------------- */
static void info_component(const char *dir, const char *name, const cdf_cli_component_files *cf) {
    char sub[4096];
    snprintf(sub, sizeof sub, "%s/%s", dir, name);
    for (int i = 0; cf && i < cf->n; i++) {
        if (strcmp(cf->files[i].component, name) != 0) continue;
        cdf_wsrc *s;
        cJSON *cfg = NULL;
        const char *cls = "?";
        if (cdf_config_load(sub, &cfg) == CDF_OK && cdf_config_class_name(cfg)) cls = cdf_config_class_name(cfg);
        const char *part = cdf_pipe_text_part(name, strcmp(cls, "T5EncoderModel") == 0); /* of an all-in-one file */
        if (cdf_wsrc_open(cf->files[i].path, true, part, &s) != CDF_OK) {
            printf("  %-16s %-32s (weights file unreadable: %s)\n", name, cls, cdf_last_error());
        } else {
            char summary[512];
            cdf_wsrc_summary(s, summary, sizeof summary);
            printf("  %-16s %-32s from %s (%s): %s\n", name, cls, cf->files[i].path, cdf_wsrc_format(s), summary);
            cdf_wsrc_close(s);
        }
        cJSON_Delete(cfg);
        return;
    }
    cdf_checkpoint *ck;
    if (cdf_checkpoint_open(sub, &ck) != CDF_OK) {
        printf("  %-16s (no weights: %s)\n", name, cdf_last_error());
        return;
    }
    uint64_t bytes = 0, params = 0;
    int n = cdf_checkpoint_count(ck);
    cdf_dtype dt = CDF_F32;
    for (int i = 0; i < n; i++) {
        const cdf_st_file *f;
        const cdf_st_tensor *t;
        if (cdf_checkpoint_tensor_at(ck, i, &f, &t) != CDF_OK) continue;
        bytes += t->nbytes;
        params += (uint64_t)cdf_st_numel(t);
        dt = t->dtype;
    }
    cJSON *cfg = NULL;
    const char *cls = "?";
    if (cdf_config_load(sub, &cfg) == CDF_OK && cdf_config_class_name(cfg)) cls = cdf_config_class_name(cfg);
    printf("  %-16s %-32s %6d tensors %12llu params %9.2f MB (%s)\n", name, cls, n, (unsigned long long)params, bytes / 1e6,
           cdf_dtype_st_name(dt));
    cJSON_Delete(cfg);
    cdf_checkpoint_close(ck);
}

static int cmd_info(int argc, char **argv) {
    const char *model = NULL, *config = NULL;
    static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                         {"config", required_argument, 0, CDF_CLI_OPT_CONFIG},
                                         {"transformer", required_argument, 0, CDF_CLI_OPT_TRANSFORMER_FILE},
                                         {"vae", required_argument, 0, CDF_CLI_OPT_VAE_FILE},
                                         {"text-encoder", required_argument, 0, CDF_CLI_OPT_TEXT_ENCODER_FILE},
                                         {0, 0, 0, 0}};
    int c;
    cdf_cli_component_files cf = {0};
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (c == 'm') model = optarg;
        else if (c == CDF_CLI_OPT_CONFIG) config = optarg;
        else if (c == CDF_CLI_OPT_TRANSFORMER_FILE || c == CDF_CLI_OPT_VAE_FILE || c == CDF_CLI_OPT_TEXT_ENCODER_FILE) {
            if (cdf_cli_add_component_file(&cf, c, optarg) != EXIT_OK) return EXIT_USAGE;
        } else return EXIT_USAGE;
    }
    if (!model) return usage_error("%s", "info needs --model DIR");
    char path[4200];
    struct stat mst;
    const char *file = NULL; /* an all-in-one file: its recognised model, then the config folder's listing */
    if (stat(model, &mst) == 0 && S_ISREG(mst.st_mode)) {
        static cdf_pipe_single_file sf; /* what the file is, with the components given beside it */
        if (cdf_pipe_single_file_resolve(model, config, cf.files, cf.n, &sf) != CDF_OK) return fail("reading the single file");
        printf("%s: %s%s, configs and tokenizers from %s\n", model, sf.model[0] ? "recognised as " : "an all-in-one file",
               sf.model, sf.config_dir);
        file = model;
        model = sf.config_dir;
    } else if (config) {
        return usage_error("--config DIR goes with --model FILE (an all-in-one file), not the folder '%s'", model);
    }
    snprintf(path, sizeof path, "%s/model_index.json", model);
    cJSON *idx = NULL;
    if (cdf_cli_file_exists(path)) {
        if (cdf_json_load_file(path, &idx) != CDF_OK) return fail("reading model_index.json");
        const char *cls = NULL;
        cdf_json_get_string(idx, "_class_name", "?", &cls);
        printf("%s: %s\n", model, cls);
        const cJSON *e;
        cJSON_ArrayForEach(e, idx) {
            if (e->string[0] == '_' || !cJSON_IsArray(e) || !cJSON_IsString(cJSON_GetArrayItem(e, 1))) continue;
            const char *ccls = cJSON_GetArrayItem(e, 1)->valuestring;
            if (strstr(ccls, "Tokenizer")) printf("  %-16s %s\n", e->string, ccls);
            else if (strstr(ccls, "Scheduler")) printf("  %-16s %s\n", e->string, ccls);
            else {
                bool given = false; /* a component the user gave its own file for; else the all-in-one file's */
                for (int i = 0; i < cf.n; i++) given = given || strcmp(cf.files[i].component, e->string) == 0;
                if (file && !given && cf.n < 8) cf.files[cf.n++] = (cdf_component_file){e->string, file};
                info_component(model, e->string, &cf);
            }
        }
        cJSON_Delete(idx);
        return EXIT_OK;
    }
    snprintf(path, sizeof path, "%s/config.json", model);
    if (!cdf_cli_file_exists(path)) {
        fprintf(stderr, "cdiffusers: %s has neither model_index.json nor config.json\n", model);
        return EXIT_FAIL;
    }
    printf("%s:\n", model);
    info_component(model, ".", NULL);
    return EXIT_OK;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        usage(stdout);
        return EXIT_OK;
    }
    if (strcmp(cmd, "--version") == 0) {
        printf("cdiffusers %s\n", CDIFFUSERS_VERSION);
        return EXIT_OK;
    }
    if (cdf_backend_count() == 0 && cdf_backend_load("cpu") != CDF_OK) return fail("loading the cpu backend");
    argv[1] = argv[0];
    if (strcmp(cmd, "generate") == 0) return cmd_generate(argc - 1, argv + 1);
    if (strcmp(cmd, "run-model") == 0) return cmd_run_model(argc - 1, argv + 1);
    if (strcmp(cmd, "tokenize") == 0) return cmd_tokenize(argc - 1, argv + 1);
    if (strcmp(cmd, "info") == 0) return cmd_info(argc - 1, argv + 1);
    if (strcmp(cmd, "plan") == 0) return cdf_cli_plan(argc - 1, argv + 1);
    if (strcmp(cmd, "convert") == 0) return cdf_cli_convert(argc - 1, argv + 1);
    if (strcmp(cmd, "devices") == 0) return cdf_cli_devices(argc - 1, argv + 1);
    if (strcmp(cmd, "cache") == 0) return cdf_cli_cache(argc - 1, argv + 1);
    if (strcmp(cmd, "serve") == 0) return cdf_cli_serve(argc - 1, argv + 1);
    fprintf(stderr, "cdiffusers: unknown command '%s' (see cdiffusers --help)\n", cmd);
    return EXIT_USAGE;
}
