/* What `generate` and `serve` share (cli/common.c): the default model, a model folder's own
 * defaults, the execution mode, and the PNG text chunks, so that a server response and a
 * `generate` file made with the same settings hold the same bytes. */
#ifndef CDF_CLI_COMMON_H
#define CDF_CLI_COMMON_H

#include <getopt.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "cdiffusers/pipeline.h"

#define CDF_CLI_DEFAULT_MODEL_NAME "shapes-flux-tiny"

/* The model used without --model (models/shapes-flux-tiny, shipped in the repository):
 * $CDIFFUSERS_DEFAULT_MODEL, else next to the executable (build/cdiffusers -> ../models/, an
 * installed bin/cdiffusers -> ../share/cdiffusers/models/), else the source tree this binary was
 * compiled from. false when none exists. */
bool cdf_cli_find_default_model(char *out, size_t n);

/* DIR/cdiffusers_defaults.json (optional): the model's own defaults for what the user did not
 * pass, e.g. {"height": 64, "width": 64, "num_inference_steps": 20, "guidance_scale": 0.0,
 * "max_sequence_length": 24, "true_cfg_scale": 3.0, "negative_prompt": ""}. */
typedef struct cdf_cli_model_defaults {
    long height, width, steps, max_sequence_length; /* 0 = none */
    double guidance_scale;                           /* < 0 = none */
    double true_cfg_scale;                           /* 1 = none */
    bool have_negative;
    char negative_prompt[1024];
} cdf_cli_model_defaults;
/* Reads the file (all "none" when it does not exist); on error the message names the file. */
cdf_status cdf_cli_model_defaults_load(const char *dir, cdf_cli_model_defaults *out);
/* Fills what gp leaves at its default. user_scale: the user gave true_cfg_scale. gp may point
 * into d (negative_prompt), so d must outlive gp's use. */
void cdf_cli_model_defaults_apply(const cdf_cli_model_defaults *d, cdf_generate_params *gp, bool user_scale);

/* "cdiffusers: " + fmt with arg + the --help hint on stderr; returns the usage exit code (2). */
int cdf_cli_usage_error(const char *fmt, const char *arg);
/* A whole decimal integer in [lo, hi]. */
bool cdf_cli_parse_long(const char *s, long lo, long hi, long *out);
/* strtod's correctly rounded double, finite: the Python float of the same text. */
bool cdf_cli_parse_double(const char *s, double *out);
/* "none" / "model" / "sequential" -> mode; 0, or -1 for anything else. */
int cdf_cli_parse_offload(const char *s, cdf_offload_mode *out);

/* --mode eager|fuse|compile (see cdiffusers/exec.h). */
enum { CDF_CLI_MODE_DEFAULT = -1, CDF_CLI_MODE_EAGER = 0, CDF_CLI_MODE_FUSE = 1, CDF_CLI_MODE_COMPILE = 2 };
int cdf_cli_parse_mode(const char *s); /* -1 for an unknown name */
/* The process-wide part of a mode (fuse); CDF_CLI_MODE_DEFAULT leaves the environment's. */
cdf_status cdf_cli_apply_mode(int mode);
/* After loading: compile the pipeline for --mode compile or --compile-repeated-blocks. */
cdf_status cdf_cli_compile(cdf_pipeline *pipe, int mode, bool repeated_blocks);

/* The options of the commands that load weights and run them (generate, run-model, serve): one
 * spelling, one check and one message each. A command's getopt_long table lists
 * CDF_CLI_RUN_OPTIONS (and CDF_CLI_LOAD_OPTIONS where it loads a whole pipeline) beside its
 * own options and is read with cdf_cli_next_option. */
typedef struct cdf_cli_run_opts {
    const char *model;         /* NULL: not given */
    const char *dtype;         /* "bf16" (default) or "f32" */
    const char *offload;       /* "none" (default), "model" or "sequential" */
    const char *device_memory; /* NULL: not given */
    int mode;                  /* CDF_CLI_MODE_* (default: CDF_CLI_MODE_DEFAULT) */
    bool blocks;               /* --compile-repeated-blocks */
    long threads;              /* 0: the device's default */
} cdf_cli_run_opts;
cdf_cli_run_opts cdf_cli_run_opts_default(void);
#define CDF_CLI_RUN_OPTIONS                                                                   \
    {"model", required_argument, 0, 'm'}, {"dtype", required_argument, 0, 'd'},               \
        {"threads", required_argument, 0, 't'}, {"mode", required_argument, 0, 'E'},          \
        {"compile-repeated-blocks", no_argument, 0, 'B'}, {"pjrt-cache", required_argument, 0, 900}
#define CDF_CLI_LOAD_OPTIONS {"offload", required_argument, 0, 'O'}, {"device-memory", required_argument, 0, 'M'}
/* getopt_long over a command's table (the caller sets optind = 1 before the first call), the
 * shared options taken into o:
 * returns the next other option, -1 at the end, or '?' (as getopt_long for an unknown option)
 * after printing the usage error of a bad shared value. */
int cdf_cli_next_option(int argc, char **argv, const struct option *opts, cdf_cli_run_opts *o);
/* --dtype as a weight dtype: false (the usage error printed) for anything but f32 / bf16. */
bool cdf_cli_run_opts_dtype(const cdf_cli_run_opts *o, cdf_dtype *out);
/* --dtype, --offload and --device-memory (bytes, -1 = not given) into a pipeline's load
 * parameters: false (the usage error printed) on a bad value. */
bool cdf_cli_run_opts_load(const cdf_cli_run_opts *o, cdf_pipeline_load_params *lp, int64_t *device_memory);

/* The PNG text chunks of an image: "parameters" (A1111-style generation settings) and
 * "Software". keys/values point into the struct itself (do not copy it). */
typedef struct cdf_cli_png_text {
    const char *keys[2], *values[2];
    char parameters[12288], software[64];
} cdf_cli_png_text;
/* gp: the request as generated (defaults resolved here); dtype "bf16"/"f32"; model as given;
 * seed: the one that reproduces the image; batch (", Batch index: ...") and init (the input
 * images, cdf_cli_png_init_text) are inserted as given, NULL = none; image: the image's index
 * in the request (its step-cache report, cdf_pipeline_cache_report). `generate` and `serve`
 * write the same text, so the same request gives the same PNG bytes. */
void cdf_cli_png_text_make(cdf_cli_png_text *t, const cdf_pipeline *pipe, const cdf_generate_params *gp, const char *dtype,
                           const char *model, unsigned long long seed, const char *batch, const char *init, int image);
/* The input images as the PNG text names them: img2img / inpainting ", Strength: S, Init
 * image: NAME[, Mask: MASK]", FLUX.2 ", Reference images: A; B"; "" without gp->image. */
void cdf_cli_png_init_text(char *buf, size_t n, const cdf_pipeline *pipe, const cdf_generate_params *gp,
                           const char *const *image_names, int n_names, const char *mask_name);

/* `cdiffusers serve ...` (cli/serve.c; argv[0] is the program); returns the exit code. */
int cdf_cli_serve(int argc, char **argv);
void cdf_cli_serve_usage(FILE *f); /* its lines of the --help text */

/* ---- component files and how weights load: generate, info and serve take them alike -------- */
/* getopt codes of --transformer FILE, --vae FILE, --text-encoder N=FILE, --allow-unused-keys,
 * --weight-type T, --config DIR; a command's own codes start at CDF_CLI_OPT_NEXT */
enum {
    CDF_CLI_OPT_TRANSFORMER_FILE = 1001, CDF_CLI_OPT_VAE_FILE, CDF_CLI_OPT_TEXT_ENCODER_FILE, CDF_CLI_OPT_ALLOW_UNUSED_KEYS,
    CDF_CLI_OPT_WEIGHT_TYPE, CDF_CLI_OPT_CONFIG, CDF_CLI_OPT_NEXT
};
#define CDF_CLI_COMPONENT_OPTIONS                                                                                   \
    {"transformer", required_argument, 0, CDF_CLI_OPT_TRANSFORMER_FILE}, {"vae", required_argument, 0, CDF_CLI_OPT_VAE_FILE}, \
        {"text-encoder", required_argument, 0, CDF_CLI_OPT_TEXT_ENCODER_FILE},                                     \
        {"allow-unused-keys", no_argument, 0, CDF_CLI_OPT_ALLOW_UNUSED_KEYS},                                      \
        {"weight-type", required_argument, 0, CDF_CLI_OPT_WEIGHT_TYPE}, {"config", required_argument, 0, CDF_CLI_OPT_CONFIG}
typedef struct cdf_cli_component_files {
    cdf_component_file files[8];
    char keys[8][32];
    int n;
} cdf_cli_component_files;
/* opt: CDF_CLI_OPT_TRANSFORMER_FILE, _VAE_FILE or _TEXT_ENCODER_FILE (arg N=FILE, N = 1, 2, 3 or a
 * component name). 0, or the usage error's exit status after printing it. */
int cdf_cli_add_component_file(cdf_cli_component_files *cf, int opt, const char *arg);
/* --weight-type: q8_0 / q4_k quantize float linear weights at load; f32/bf16 decode GGUF blocks at
 * load to that dtype (which must then agree with --dtype, the compute policy). NULL (wt NULL or
 * valid) or the usage error's text. */
const char *cdf_cli_parse_weight_type(const char *wt, const char *dtype, bool *decode, uint32_t *quantize);

#endif
