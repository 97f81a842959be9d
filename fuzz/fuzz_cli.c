/* Fuzz target: command-line parsing. cli/main.c is compiled into this target with
 * -Dmain=cdf_cli_main; the input is split at NUL bytes into argv (at most 32 arguments after
 * the program name) and the tool's main runs in-process.
 *
 * To keep every run fast and side-effect free, the target works in an empty scratch folder and
 * replaces '/' in every argument with '_', so all paths are relative names inside it: the only
 * thing that exists there is "pipe", a pipeline folder whose only content is an empty
 * model_index.json object (`generate` and `info` get as far as reading it). Nothing can reach a
 * real model or tokenizer, so every command ends before computing, and no file is ever written
 * (outputs only appear after a successful generation). Tokenizers and models have their own
 * targets.
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
        {"generate", "--mod", "pipe", "--prom", "p", "--h", "16"},
        {"run-model", "--model", "pipe", "--inputs", "in.safetensors", "--output", "out.safetensors", "--method", "decode",
         "--repeat", "3"},
        {"tokenize", "--model", "tok", "--prompt", "a photo of a cat", "--max-length", "8"},
        {"info", "--model", "pipe"},
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

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fz_maybe_write_seeds(write_seeds);
    /* <tmp>/a/b is the working folder, so ".." is <tmp>/a, which holds nothing else either */
    const char *a = fz_join(fz_tmp(), "a");
    fz_mkdir(a);
    const char *b = fz_join(a, "b");
    fz_mkdir(b);
    if (chdir(b) != 0) abort();
    fz_mkdir("pipe");
    fz_write_str("pipe/model_index.json", "{}");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
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
