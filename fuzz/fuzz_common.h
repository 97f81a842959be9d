/* Shared helpers for the libFuzzer targets in fuzz/ (see docs/ROBUSTNESS.md).
 *
 * Every target parses untrusted bytes through the public API the way cdiffusers reads model
 * folders: the input is written to a file in a private temporary folder, then opened. A target
 * fails (abort, reported by libFuzzer) on a sanitizer report, a leak, or a broken invariant
 * checked with FZ_CHECK: a failed call must leave a message, a successful one must return data
 * consistent with the input.
 *
 * Seeds: run a target with CDF_FUZZ_WRITE_SEEDS=<dir> and it writes its seed corpus (copies of
 * tests/data files and small synthetic files) into <dir> and exits; scripts/fuzz.sh does that. */
#ifndef CDF_FUZZ_COMMON_H
#define CDF_FUZZ_COMMON_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cdiffusers/cdiffusers.h"

#ifndef CDF_TEST_DATA
#error "CDF_TEST_DATA (absolute path of tests/data) must be defined by the build"
#endif

#define FZ_UNUSED __attribute__((unused))

#define FZ_CHECK(cond)                                                                                 \
    do {                                                                                               \
        if (!(cond)) {                                                                                 \
            fprintf(stderr, "fuzz invariant failed: %s (%s:%d); last error: %s\n", #cond, __FILE__,    \
                    __LINE__, cdf_last_error());                                                       \
            abort();                                                                                   \
        }                                                                                              \
    } while (0)

/* A failed call must say why: FZ_TRY(call) clears the message first, FZ_CHECK_MESSAGE() then
 * checks that the failure left one. */
#define FZ_TRY(call) (cdf_clear_error(), (call))
#define FZ_CHECK_MESSAGE()                                                                             \
    do {                                                                                               \
        FZ_CHECK(cdf_last_error()[0] != 0);                                                            \
        if (fz_verbose()) fprintf(stderr, "[%s:%d] %s\n", __FILE__, __LINE__, cdf_last_error());        \
    } while (0)

/* CDF_FUZZ_VERBOSE=1 prints every failure message (to check what the seeds reach). */
static inline int fz_verbose(void) {
    static int v = -1;
    if (v < 0) v = getenv("CDF_FUZZ_VERBOSE") != NULL;
    return v;
}

static char fz_tmp_dir[256];

static FZ_UNUSED void fz_rm_tmp(void) {
    if (fz_tmp_dir[0]) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", fz_tmp_dir);
        if (system(cmd)) { /* best effort */
        }
    }
}

/* This process's private scratch folder (removed at exit). In memory (/dev/shm, or
 * $CDF_FUZZ_TMP) where possible: the targets rewrite a file for every input, and on ext4 each
 * rewrite-by-truncation forces a write-back when the file is closed (auto_da_alloc), which made
 * the file-based targets several times slower than their parsing. */
static FZ_UNUSED const char *fz_tmp(void) {
    if (!fz_tmp_dir[0]) {
        const char *base = getenv("CDF_FUZZ_TMP");
        if (!base || !*base) base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
        snprintf(fz_tmp_dir, sizeof fz_tmp_dir, "%s/cdf_fuzz_XXXXXX", base);
        if (!mkdtemp(fz_tmp_dir)) abort();
        atexit(fz_rm_tmp);
    }
    return fz_tmp_dir;
}

/* "<a>/<b>" in a rotating static buffer (8 slots). */
static FZ_UNUSED const char *fz_join(const char *a, const char *b) {
    static char buf[8][1024];
    static int slot;
    char *p = buf[slot++ & 7];
    snprintf(p, 1024, "%s/%s", a, b);
    return p;
}

static FZ_UNUSED void fz_mkdir(const char *path) {
    if (mkdir(path, 0755) != 0 && errno != EEXIST) abort();
}

static FZ_UNUSED void fz_write(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (n && fwrite(data, 1, n, f) != n) abort();
    if (fclose(f) != 0) abort();
}

static FZ_UNUSED void fz_write_str(const char *path, const char *s) { fz_write(path, s, strlen(s)); }

/* Whole file (NULL if it cannot be read); *n its size. */
static FZ_UNUSED uint8_t *fz_read(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc((size_t)len + 1);
    if (p && fread(p, 1, (size_t)len, f) != (size_t)len) {
        free(p);
        p = NULL;
    }
    fclose(f);
    if (p) {
        p[len] = 0;
        *n = (size_t)len;
    }
    return p;
}

/* ---- seeds ---- */

static int fz_seed_count;

/* Write one seed: an optional one-byte prefix (mode selector, -1 for none) + data. */
static FZ_UNUSED void fz_seed(const char *dir, int prefix, const void *data, size_t n) {
    char name[32];
    snprintf(name, sizeof name, "seed_%03d", fz_seed_count++);
    uint8_t *b = malloc(n + 1);
    if (!b) abort();
    size_t k = 0;
    if (prefix >= 0) b[k++] = (uint8_t)prefix;
    if (n) memcpy(b + k, data, n);
    fz_write(fz_join(dir, name), b, n + k);
    free(b);
}

/* A seed from a file under tests/data (skipped when missing or larger than max bytes). */
static FZ_UNUSED void fz_seed_file(const char *dir, int prefix, const char *rel, size_t max) {
    size_t n = 0;
    uint8_t *d = fz_read(fz_join(CDF_TEST_DATA, rel), &n);
    if (!d) {
        fprintf(stderr, "seed %s: not found, skipped\n", rel);
        return;
    }
    if (n <= max) fz_seed(dir, prefix, d, n);
    else fprintf(stderr, "seed %s: %zu bytes > %zu, skipped\n", rel, n, max);
    free(d);
}

/* Called from LLVMFuzzerInitialize: with CDF_FUZZ_WRITE_SEEDS set, write the seeds and exit. */
static FZ_UNUSED void fz_maybe_write_seeds(void (*write_seeds)(const char *dir)) {
    const char *dir = getenv("CDF_FUZZ_WRITE_SEEDS");
    if (!dir || !*dir) return;
    fz_mkdir(dir);
    write_seeds(dir);
    fprintf(stderr, "wrote %d seeds to %s\n", fz_seed_count, dir);
    exit(0);
}

/* The cpu backend, as the command-line tool loads it. */
static FZ_UNUSED void fz_load_backend(void) {
    if (cdf_backend_count() == 0 && cdf_backend_load("cpu") != CDF_OK) {
        fprintf(stderr, "cannot load the cpu backend: %s\n", cdf_last_error());
        abort();
    }
}

#endif
