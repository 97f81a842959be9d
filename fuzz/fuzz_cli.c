/* Fuzz target: command-line parsing. cli/main.c is compiled into this target with
 * -Dmain=cdf_cli_main; the input is split at NUL bytes into argv (at most 32 arguments after
 * the program name) and the tool's main runs in-process.
 *
 * To keep every run fast and side-effect free, the target works in an empty scratch folder and
 * replaces '/' in every argument with '_', so all paths are relative names inside it. What
 * exists there: "pipe", a folder whose model_index.json is an empty object, and "p", the tiny
 * FLUX.1-schnell pipeline without its tokenizer files (so `plan` and `info` run for real on
 * fuzzed sizes and flags, while `generate` stops at the first tokenizer, before loading any
 * weights). No command can get as far as computing, so no file is ever written (outputs only
 * appear after a successful generation). Without --model, `generate` uses the default model:
 * $CDIFFUSERS_DEFAULT_MODEL is set to "p" so that it too stops at the tokenizer (the shipped
 * model would really draw). Tokenizers and models have their own targets.
 *
 * Invariants: the exit code is 0, 1 or 2 (130 needs SIGINT). Leaks and memory errors are caught
 * by the sanitizers. */
#include <getopt.h>

#include "fuzz_common.h"

int cdf_cli_main(int argc, char **argv);

static void write_seeds(const char *dir) {
    static const char *const cmds[][24] = {
        {"generate", "--model", "pipe", "--prompt", "a fox", "--height", "064", "--width", "x"},
        {"generate", "--model", "pipe", "--prompt", "a fox", "--steps", "-3", "--seed", "18446744073709551615", "--output", "o.png",
         "--force"},
        {"generate", "--model", "pipe", "--prompt", "p", "--negative-prompt", "n", "--guidance", "1e39", "--true-cfg-scale", "inf"},
        {"generate", "--model", "pipe", "--prompt", "p", "--dtype", "bf16", "--threads", "4", "--max-sequence-length", "512",
         "--device-memory", "8G", "--quiet"},
        {"generate", "--model", "pipe", "--prompt", "p", "--latents-out", "l.safetensors", "--output", "out.png"},
        {"generate", "-x", "--model=pipe", "--prompt=p", "stray"},
        {"generate", "--prompt", "p", "--output", "out.png"}, /* the default model */
        {"generate", "--mod", "pipe", "--prom", "p", "--h", "16"},
        {"run-model", "--model", "pipe", "--inputs", "in.safetensors", "--output", "out.safetensors", "--method", "decode",
         "--repeat", "3"},
        {"tokenize", "--model", "tok", "--prompt", "a photo of a cat", "--max-length", "8"},
        {"info", "--model", "pipe"},
        {"serve", "--model", "p", "--host", "::1", "--port", "0", "--queue", "2", "--api-key", "k", "--max-body-mb", "1"},
        {"plan", "--model", "p", "--height", "1024", "--width", "1024", "--offload", "model", "--dtype", "bf16"},
        {"plan", "--model", "p", "--height", "4096", "--width", "16", "--max-sequence-length", "512", "--guidance", "4",
         "--negative-prompt", "n", "--true-cfg-scale", "2"},
        {"info", "--model", "p"},
        {"generate", "--model", "p", "--prompt", "x", "--offload", "model", "--memory-stats", "--tp", "2", "--mode", "fuse"},
        {"info", "--model", ".."},
        {"--help"},
        {"--version"},
        {"frobnicate", "--x"},
    };
    for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
        char buf[1024];
        size_t n = 0;
        for (int k = 0; k < 24 && cmds[i][k]; k++) {
            size_t l = strlen(cmds[i][k]);
            memcpy(buf + n, cmds[i][k], l + 1); /* arguments are separated by NUL */
            n += l + 1;
        }
        fz_seed(dir, -1, buf, n);
    }
}

/* The scratch working folder, entered at the first input rather than in LLVMFuzzerInitialize so
 * that relative paths given to libFuzzer (a reproducer, a corpus) are read from where the
 * command was started. */
static void enter_scratch_folder(void) {
    /* <tmp>/a/b is the working folder, so ".." is <tmp>/a, which holds nothing else either */
    const char *a = fz_join(fz_tmp(), "a");
    fz_mkdir(a);
    const char *b = fz_join(a, "b");
    fz_mkdir(b);
    if (chdir(b) != 0) abort();
    fz_mkdir("pipe");
    fz_write_str("pipe/model_index.json", "{}");
    /* "p": the tiny FLUX.1-schnell folder without tokenizer files: `plan` computes for real,
     * `generate` stops at the first tokenizer */
    static const char *const files[] = {"model_index.json", "scheduler/scheduler_config.json", "transformer/config.json",
                                        "vae/config.json", "text_encoder/config.json", "text_encoder_2/config.json"};
    static const char *const dirs[] = {"p", "p/scheduler", "p/transformer", "p/vae", "p/text_encoder", "p/text_encoder_2",
                                       "p/tokenizer", "p/tokenizer_2"};
    for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++) fz_mkdir(dirs[i]);
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "pipelines/flux1_schnell_tiny/%s", files[i]);
        size_t n = 0;
        uint8_t *d = fz_read(fz_join(CDF_TEST_DATA, rel), &n);
        if (!d) abort();
        fz_write(fz_join("p", files[i]), d, n);
        free(d);
    }
    static const char *const weights[] = {"text_encoder/model.safetensors", "text_encoder_2/model.safetensors",
                                          "transformer/diffusion_pytorch_model.safetensors",
                                          "vae/diffusion_pytorch_model.safetensors"};
    for (size_t i = 0; i < sizeof weights / sizeof *weights; i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "pipelines/flux1_schnell_tiny/%s", weights[i]);
        if (symlink(fz_join(CDF_TEST_DATA, rel), fz_join("p", weights[i])) != 0) abort();
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fz_maybe_write_seeds(write_seeds);
    setenv("CDIFFUSERS_DEFAULT_MODEL", "p", 1); /* relative to the scratch folder */
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static bool entered;
    if (!entered) {
        enter_scratch_folder();
        entered = true;
    }
    if (size > 4096) return 0;
    enum { MAX_ARGS = 32 };
    char *buf = malloc(size + 1);
    memcpy(buf, data, size);
    buf[size] = 0;
    char *argv[MAX_ARGS + 2];
    int argc = 0;
    argv[argc++] = "cdiffusers";
    size_t start = 0;
    for (size_t i = 0; i <= size && argc <= MAX_ARGS; i++) {
        if (i == size || buf[i] == 0) {
            if (i > start || i < size) argv[argc++] = buf + start;
            start = i + 1;
        }
    }
    for (int k = 1; k < argc; k++)
        for (char *p = argv[k]; *p; p++)
            if (*p == '/') *p = '_';
    argv[argc] = NULL;
    /* glibc's getopt keeps a pointer into the previous argv between calls unless optind is 0
     * (full re-initialisation); the tool sets optind = 1, which is right for a process that
     * parses once, so reset it here with a throw-away scan. */
    optind = 0;
    char *reset_argv[] = {"x", NULL};
    while (getopt(1, reset_argv, "") != -1) {
    }
    int rc = cdf_cli_main(argc, argv);
    FZ_CHECK(rc == 0 || rc == 1 || rc == 2);
    /* no command may leave a file behind */
    FZ_CHECK(access("out.png", F_OK) != 0);
    free(buf);
    return 0;
}
