/* Helpers shared by the tensor-parallel tests (test_dist*.c): how they start
 * mpirun, and small file/string utilities. Header-only (static functions). */
#ifndef CDF_DIST_TEST_COMMON_H
#define CDF_DIST_TEST_COMMON_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cdiffusers/dist.h"
#include "cdiffusers/io.h"
#include "cdiffusers/png.h"
#include "testutil.h"

#define MPIRUN "mpirun --allow-run-as-root --oversubscribe --mca btl_vader_single_copy_mechanism none"

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Environment for every rank (mpirun's -x applies to one app context, so it is repeated in each).
 * Open MPI's own start-up and progress thread leave allocations LeakSanitizer reports in a
 * sanitizer build; they are suppressed by library, with full stacks so that the suppressions
 * can see the MPI frames (our own leaks still fail). Harmless in a normal build. Jobs that are
 * meant to fail (and whose ranks get killed) skip the leak check: full stacks are slow. */
static inline const char *mpi_env_no_leak_check(void) { return " -x ASAN_OPTIONS=detect_leaks=0"; }

static inline const char *mpi_env(void) {
    static char env[1400];
    if (!env[0]) {
        char supp[1100];
        snprintf(supp, sizeof supp, "%s/lsan_mpi.supp", tu_tmpdir());
        const char *rules = "leak:libmpi.so\nleak:libopen-pal.so\nleak:libopen-rte.so\nleak:libevent\nleak:libhwloc\n"
                            "leak:libpmix\nleak:MPI_Init_thread\nleak:ompi_mpi_finalize\n";
        assert_int_equal(tu_write_file(supp, rules, strlen(rules)), 0);
        snprintf(env, sizeof env, " -x LSAN_OPTIONS=suppressions=%s:print_suppressions=0 -x ASAN_OPTIONS=fast_unwind_on_malloc=0",
                 supp);
    }
    return env;
}

static inline bool have_mpi(void) {
    return cdf_dist_backend_available("mpi") && tu_system("command -v mpirun >/dev/null 2>&1") == 0;
}

/* The last n characters of a log (a failure's cause is at its end; cmocka cuts long messages). */
static inline const char *log_tail(const char *log, size_t n) {
    if (!log) return "";
    const size_t len = strlen(log);
    return len > n ? log + len - n : log;
}

static inline int count_substr(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay; p && (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

/* Runs this test binary again as 2 MPI ranks with --mpi-worker (its main's worker branch),
 * prints the whole log (print_message cuts long text), fails the test unless mpirun exits 0
 * and each rank printed `ok_line`. */
static inline void run_self_as_two_ranks(const char *log_name, const char *ok_line) {
    char self[1024];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    assert_true(n > 0);
    self[n] = '\0';
    const char *out = tu_tmp_path(log_name);
    int rc = tu_system(MPIRUN " -np 2%s '%s' --mpi-worker > '%s' 2>&1", mpi_env(), self, out);
    char *log = tu_read_file(out, NULL);
    fputs(log ? log : "(no output)\n", stdout);
    assert_int_equal(rc, 0);
    assert_int_equal(count_substr(log, ok_line), 2);
    free(log);
}

/* Tensor parallelism in a compiled mode: runs `cdiffusers generate <args> <mode> --tp 2 --output OUT
 * --latents-out LAT` as 2 ranks (one app context: rank 1 writes nothing) with
 * CDIFFUSERS_LOG=io,compile (and without CDIFFUSERS_COMPILE), fails the test on a non-zero exit, and checks the log: no graph break
 * on any rank (the all-reduces are ops of the graph, not host reads) and every graph named in
 * `compiled` (NULL-terminated, e.g. "FluxTransformer2DModel.forward" or a repeated-block class)
 * compiled exactly once on each rank (for a block class: one graph shared by all its blocks).
 * Returns the log (free it). */
static inline char *run_tp_compiled(const char *args, const char *mode, const char *out, const char *lat,
                                    const char *const *compiled) {
    char log_path[1100];
    snprintf(log_path, sizeof log_path, "%.1000s.log", out);
    const double t0 = now_s();
    /* CDIFFUSERS_COMPILE (the whole-suite compile modes of scripts/test.sh) is unset: it would also
     * compile the text encoders, whose host reads are graph breaks by design */
    int rc = tu_system("env -u CDIFFUSERS_COMPILE " MPIRUN " -np 2%s -x CDIFFUSERS_LOG=io,compile '%s' generate %s %s --tp 2 --force --output '%s' "
                              "--latents-out '%s' 2> '%s'",
                       mpi_env(), CDF_CLI_PATH, args, mode, out, lat, log_path);
    char *log = tu_read_file(log_path, NULL);
    if (rc != 0) fail_msg("2-rank run with %s failed (%d): %s", mode, rc, log ? log : "");
    assert_non_null(log);
    print_message("  2 ranks, %s: %.2f s; graph breaks in the log: %d\n", mode, now_s() - t0, count_substr(log, "graph break"));
    assert_int_equal(count_substr(log, "graph break"), 0);
    for (const char *const *g = compiled; g && *g; g++) {
        char needle[200];
        snprintf(needle, sizeof needle, "cdiffusers: compile %s [", *g);
        const int n = count_substr(log, needle);
        print_message("  %s: compiled %d times (2 ranks)\n", *g, n);
        assert_int_equal(n, 2);
    }
    return log;
}


/* Rank `rank` of an offline 2-rank group and a tensor-parallel context over it with `plan` (the
 * in-process sharding tests: loads need only the rank and the size). */
static inline void offline_tp(int rank, const cdf_tp_rule *plan, cdf_process_group **pg, cdf_tp **tp) {
    assert_int_equal(cdf_dist_init_offline(rank, 2, pg), CDF_OK);
    assert_int_equal(cdf_tp_new(*pg, "transformer", "test plan", plan, tp), CDF_OK);
}

/* ---- reading the jobs' results --------------------------------------------------------------- */
static inline bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* One "cdiffusers: io:" line (CDIFFUSERS_LOG=io) of a rank. */
typedef struct io_line {
    int rank, world;
    unsigned long long weight_bytes, peak_bytes, collectives, comm_bytes;
} io_line;

/* Parses every "cdiffusers: io:" line of a log into out[rank]; returns how many were found. */
static inline int parse_io(const char *log, io_line *out, int max) {
    int n = 0;
    for (const char *p = log; p && (p = strstr(p, "cdiffusers: io: ")); p++) {
        io_line l;
        double secs;
        if (sscanf(p, "cdiffusers: io: rank=%d world=%d weight_bytes_read=%llu device_peak_bytes=%llu collectives=%llu "
                      "comm_bytes=%llu comm_seconds=%lf",
                   &l.rank, &l.world, &l.weight_bytes, &l.peak_bytes, &l.collectives, &l.comm_bytes, &secs) == 7 &&
            l.rank >= 0 && l.rank < max) {
            out[l.rank] = l;
            n++;
        }
    }
    return n;
}

/* Tensor `key` of a safetensors file as f32 (malloc'ed, *n elements); fails the test if absent. */
static inline float *st_tensor(const char *path, const char *key, int64_t *n) {
    cdf_st_file *f;
    if (cdf_st_open(path, &f) != CDF_OK) fail_msg("%s: %s", path, cdf_last_error());
    const cdf_st_tensor *t = cdf_st_find(f, key);
    if (!t) fail_msg("%s has no '%s'", path, key);
    *n = cdf_st_numel(t);
    float *p = malloc((size_t)*n * sizeof *p);
    assert_non_null(p);
    cdf_convert(p, CDF_F32, cdf_st_data(f, t), t->dtype, (size_t)*n);
    cdf_st_close(f);
    return p;
}

/* A TP run in a compile mode (its log and latents file) against the single-process latents and
 * the eager TP run's per-rank io lines: latents_final within tol, and the same collectives and
 * communicated bytes on every rank (all-reduce as a graph op changes where, not what). Frees log. */
static inline void expect_compiled_tp_matches(char *log, const char *lat, const char *one_lat, const io_line eager[2],
                                              double tol, const char *what) {
    int64_t n1 = 0, n2 = 0;
    float *one = st_tensor(one_lat, "latents_final", &n1), *got = st_tensor(lat, "latents_final", &n2);
    assert_int_equal(n1, n2);
    const double d = tu_max_abs_diff(one, got, (size_t)n1, NULL);
    print_message("  %s: latents_final |tp - one| = %.3g (tol %.0e)\n", what, d, tol);
    assert_true(d <= tol);
    free(one), free(got);
    io_line tc[2] = {{0}, {0}};
    assert_int_equal(parse_io(log, tc, 2), 2);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(tc[r].collectives, eager[r].collectives);
        assert_int_equal(tc[r].comm_bytes, eager[r].comm_bytes);
    }
    free(log);
}

/* The golden case's call as CLI arguments. */
static inline void case_args(const char *pipe, const char *case_name, char *args, size_t n, int *steps) {
    char path[1200];
    snprintf(path, sizeof path, "%s/cases/%s/expected.json", pipe, case_name);
    char *txt = tu_read_file(path, NULL);
    assert_non_null(txt);
    cJSON *js = cJSON_Parse(txt);
    free(txt);
    const cJSON *call = cJSON_GetObjectItem(js, "call");
    assert_non_null(call);
    const char *prompt = cJSON_GetObjectItem(call, "prompt")->valuestring;
    assert_null(strchr(prompt, '\''));
    size_t o = snprintf(args, n, "--model '%s' --prompt '%s' --height %d --width %d --steps %d --guidance %g --seed %.0f", pipe,
                        prompt, cJSON_GetObjectItem(call, "height")->valueint, cJSON_GetObjectItem(call, "width")->valueint,
                        cJSON_GetObjectItem(call, "num_inference_steps")->valueint,
                        cJSON_GetObjectItem(call, "guidance_scale")->valuedouble, cJSON_GetObjectItem(call, "seed")->valuedouble);
    *steps = cJSON_GetObjectItem(call, "num_inference_steps")->valueint;
    const cJSON *neg = cJSON_GetObjectItem(call, "negative_prompt");
    if (cJSON_IsString(neg)) {
        assert_null(strchr(neg->valuestring, '\''));
        o += snprintf(args + o, n - o, " --negative-prompt '%s'", neg->valuestring);
    }
    const cJSON *msl = cJSON_GetObjectItem(call, "max_sequence_length");
    if (cJSON_IsNumber(msl)) o += snprintf(args + o, n - o, " --max-sequence-length %d", msl->valueint);
    const cJSON *tcfg = cJSON_GetObjectItem(call, "true_cfg_scale");
    if (cJSON_IsNumber(tcfg)) o += snprintf(args + o, n - o, " --true-cfg-scale %g", tcfg->valuedouble);
    snprintf(args + o, n - o, " --threads 1 --quiet --dtype f32"); /* golden: the exact path */
    cJSON_Delete(js);
}

/* Largest difference between two 8-bit images, in levels. */
static inline int max_level_diff(const uint8_t *a, const uint8_t *b, size_t n) {
    int m = 0;
    for (size_t i = 0; i < n; i++) {
        int d = abs((int)a[i] - (int)b[i]);
        if (d > m) m = d;
    }
    return m;
}

/* The tiny FLUX.1-dev golden case (flux1_dev_tiny, 64x64, made by diffusers) that the pjrt
 * tensor-parallel tests run: its call as CLI arguments, diffusers' final latents and image. */
typedef struct flux_golden {
    char pipe[1024], args[4096];
    int steps;
    float *latents; /* latents_final, n of them */
    int64_t n;
    cdf_st_file *file;
    const cdf_st_tensor *image; /* image_uint8 */
} flux_golden;

static inline void flux_golden_open(flux_golden *g) {
    snprintf(g->pipe, sizeof g->pipe, "%s/flux1_dev_tiny", tu_data("pipelines"));
    case_args(g->pipe, "64x64", g->args, sizeof g->args, &g->steps);
    char path[1200];
    snprintf(path, sizeof path, "%s/cases/64x64/expected.safetensors", g->pipe);
    g->latents = st_tensor(path, "latents_final", &g->n);
    assert_int_equal(cdf_st_open(path, &g->file), CDF_OK);
    g->image = cdf_st_find(g->file, "image_uint8");
    assert_non_null(g->image);
}

static inline void flux_golden_close(flux_golden *g) {
    cdf_st_close(g->file);
    free(g->latents);
}

/* A run's final latents (safetensors file lat) and picture (png) against diffusers':
 * *d = max |run - diffusers| of the latents, *levels = the picture's largest difference. The
 * caller asserts its tolerances (after printing them). */
static inline void flux_golden_compare(const flux_golden *g, const char *lat, const char *png, double *d, int *levels) {
    int64_t n;
    float *f = st_tensor(lat, "latents_final", &n);
    assert_int_equal(n, g->n);
    *d = tu_max_abs_diff(f, g->latents, (size_t)n, NULL);
    cdf_png_image img;
    assert_int_equal(cdf_png_read(png, &img), CDF_OK);
    const size_t npx = (size_t)img.width * img.height * img.channels;
    assert_int_equal(cdf_st_numel(g->image), (int64_t)npx);
    *levels = max_level_diff(cdf_st_data(g->file, g->image), img.pixels, npx);
    cdf_png_image_free(&img);
    free(f);
}

#endif
