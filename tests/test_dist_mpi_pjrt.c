/* Tensor parallelism over 2 MPI ranks on the pjrt backend (issue #40): `mpirun -np 2 cdiffusers
 * generate --tp 2 --device pjrt`, each rank its pjrt:0 (the XLA CPU plugin), the all-reduces summed
 * over MPI on host copies between programs. The golden tiny FLUX.1 case (test_dist_pjrt.c's, the
 * transformer and CLIP sharded) in every execution mode — eager, defer-and-fuse, compile and
 * repeated-block compile — against diffusers' latents and picture; in the compiled modes no graph
 * break on either rank (the all-reduces are nodes of the compiled plans, each plan's programs run
 * between them) and every graph compiled once per rank; the same collectives and bytes on both
 * ranks and in every mode. A GGUF transformer over the 2 ranks (each rank's blocks decoded on its
 * device), bit for bit the run from gguf-py's values. Then a dead rank on pjrt: killed (SIGKILL)
 * inside a compiled forward's replay, and hanging there or between the programs of an eager run
 * — each a clear error on the other rank or from the launcher within the watchdog
 * (CDIFFUSERS_DIST_TIMEOUT=2), never a hang, and no output written.
 *
 * Cost (scripts/test.sh runs it once, label pjrt): one program cache for the whole test in its
 * tmp dir, and XLA's LLVM optimisation off (xla_backend_optimization_level=0, scripts/test.sh's
 * pjrt passes say why that changes speed, not results) — compiling dominates these runs. Skipped
 * without MPI, mpirun, the pjrt backend or a plugin. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cdiffusers/cdiffusers.h"
#include "cdiffusers/device.h"
#include "dist_test_common.h"

#define GOLDEN_LATENT_TOL 5e-4 /* test_dist's: |tp - diffusers| of the final latents */

static char g_env[2400]; /* every rank's environment: the cache, the XLA flags, the leak rules */
static unsigned long long g_collectives; /* a rank's collectives in the golden case's run (eager) */

static bool have_pjrt(void) {
    if (!cdf_backend_runs_replicas("pjrt")) return false;
    cdf_pjrt_plugin_info p[8];
    const int n = cdf_pjrt_list_plugins(p, 8);
    for (int i = 0; i < n && i < 8; i++)
        if (p[i].chosen && p[i].api_major >= 0) return true;
    return false;
}

/* The environment given to both ranks (-x), built once. The suite's own mode variables are unset
 * in front of mpirun: each run here picks its mode itself. */
static const char *rank_env(void) {
    if (!g_env[0])
        snprintf(g_env, sizeof g_env, "%s -x CDIFFUSERS_PJRT_CACHE='%s/pjrt-cache' "
                 "-x CDIFFUSERS_PJRT_XLA_FLAGS=xla_backend_optimization_level=0",
                 mpi_env(), tu_tmpdir());
    return g_env;
}
#define UNSET_MODES "env -u CDIFFUSERS_COMPILE -u CDIFFUSERS_DEFER_AND_FUSE -u CDIFFUSERS_DEVICE "

typedef struct mode {
    const char *name, *env, *args;
    const char *compiled[3]; /* graphs each rank compiles exactly once (compiled modes) */
} mode;

static void test_flux_tp2_mpi_every_mode(void **state) {
    (void)state;
    if (!have_mpi() || !have_pjrt()) skip();
    flux_golden g;
    flux_golden_open(&g);
    const char *args = g.args;
    const int steps = g.steps;

    static const mode modes[] = {
        {"eager", "", "", {NULL}},
        {"defer-and-fuse", "-x CDIFFUSERS_DEFER_AND_FUSE=1", "", {NULL}},
        {"compile", "", "--mode compile", {"FluxTransformer2DModel.forward", NULL}},
        {"repeated blocks", "", "--compile-repeated-blocks", {"FluxTransformerBlock", "FluxSingleTransformerBlock", NULL}},
    };
    io_line first[2] = {{0}, {0}};
    for (size_t m = 0; m < sizeof modes / sizeof *modes; m++) {
        char png[1100], lat[1100], log_path[1100];
        snprintf(png, sizeof png, "%s/mpi_%zu.png", tu_tmpdir(), m);
        snprintf(lat, sizeof lat, "%s/mpi_%zu.safetensors", tu_tmpdir(), m);
        snprintf(log_path, sizeof log_path, "%s/mpi_%zu.log", tu_tmpdir(), m);
        const double t0 = now_s();
        const int rc = tu_system(UNSET_MODES MPIRUN " -np 2%s %s -x CDIFFUSERS_LOG=io,compile '%s' generate %s --device pjrt %s "
                                 "--tp 2 --tp-replicate text_encoder_2 --force --output '%s' --latents-out '%s' 2> '%s'",
                                 rank_env(), modes[m].env, CDF_CLI_PATH, args, modes[m].args, png, lat, log_path);
        char *log = tu_read_file(log_path, NULL);
        if (rc != 0) fail_msg("2 ranks on pjrt (%s) failed (%d): %s", modes[m].name, rc, log ? log : "");
        assert_non_null(log);
        /* each rank's io line: both ranks of a world of 2, the same collectives and bytes on
         * both, and the same in every mode (where the sums run changes, not what is summed) */
        io_line io[2] = {{0}, {0}};
        assert_int_equal(parse_io(log, io, 2), 2);
        for (int r = 0; r < 2; r++) {
            assert_int_equal(io[r].world, 2);
            assert_true(io[r].collectives > (unsigned long long)steps); /* at least one all-reduce per block per step */
            assert_int_equal(io[r].collectives, io[0].collectives);
            assert_int_equal(io[r].comm_bytes, io[0].comm_bytes);
            if (m == 0) first[r] = io[r], g_collectives = io[r].collectives;
            assert_int_equal(io[r].collectives, first[r].collectives);
            assert_int_equal(io[r].comm_bytes, first[r].comm_bytes);
        }
        const int breaks = count_substr(log, "graph break");
        for (const char *const *g = modes[m].compiled; *g; g++) {
            char needle[200];
            snprintf(needle, sizeof needle, "cdiffusers: compile %s [", *g);
            if (count_substr(log, needle) != 2) fail_msg("%s: '%s' compiled %d times on 2 ranks (once each expected): %s",
                                                         modes[m].name, *g, count_substr(log, needle), log);
        }
        if (modes[m].compiled[0]) assert_int_equal(breaks, 0);

        double d;
        int lv;
        flux_golden_compare(&g, lat, png, &d, &lv);
        print_message("  2 ranks, %s: %.1f s; %llu collectives per rank; latents_final |tp - diffusers| = %.3g (tol %.0e); image "
                      "within %d level(s) of diffusers'\n",
                      modes[m].name, now_s() - t0, io[0].collectives, d, GOLDEN_LATENT_TOL, lv);
        assert_true(d <= GOLDEN_LATENT_TOL);
        assert_true(lv <= 1);
        free(log);
    }
    flux_golden_close(&g);
}

/* A GGUF transformer over 2 ranks on pjrt (eager): over MPI each rank keeps its slice's blocks
 * (its rows', or its columns' where the cuts fall on block boundaries) and pjrt, which has no
 * quantized matmul, decodes them on the device at load (cdf_linear_decode, from the rank's own
 * view) — a path the one-process replicas do not take (they decode on the host). The reference,
 * as in test_dist_pjrt.c, is the same 2-rank run from gguf-py's dequantization of the file
 * (q8_dequant/, written by gguf-py): equal bit for bit. The programs are the golden case's
 * (weights are arguments), cached by the test above. */
static void test_gguf_tp2_mpi(void **state) {
    (void)state;
    if (!have_mpi() || !have_pjrt()) skip();
    char pipe[1024], args[4096];
    snprintf(pipe, sizeof pipe, "%s/flux1_dev_tiny", tu_data("pipelines"));
    int steps;
    case_args(pipe, "64x64", args, sizeof args, &steps);
    char *src[2] = {strdup(tu_data("formats/flux_single/flux_bfl_q8.gguf")),
                    strdup(tu_data("formats/flux_single/q8_dequant/transformer/diffusion_pytorch_model.safetensors"))};
    float *lat[2] = {NULL, NULL};
    int64_t n[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        char out[1100], log_path[1100];
        snprintf(out, sizeof out, "%s/gguf_%d.safetensors", tu_tmpdir(), k);
        snprintf(log_path, sizeof log_path, "%s/gguf_%d.log", tu_tmpdir(), k);
        const double t0 = now_s();
        const int rc = tu_system(UNSET_MODES MPIRUN " -np 2%s '%s' generate %s --device pjrt --tp 2 --tp-replicate text_encoder_2 "
                                 "--transformer '%s' --force --output '%s/gguf.png' --latents-out '%s' 2> '%s'",
                                 rank_env(), CDF_CLI_PATH, args, src[k], tu_tmpdir(), out, log_path);
        char *log = tu_read_file(log_path, NULL);
        if (rc != 0) fail_msg("2 ranks on pjrt, --transformer %s failed (%d): %s", src[k], rc, log ? log : "");
        free(log);
        lat[k] = st_tensor(out, "latents_final", &n[k]);
        print_message("  2 ranks, %s transformer: %.1f s\n", k == 0 ? "GGUF" : "gguf-py's values", now_s() - t0);
    }
    assert_int_equal(n[0], n[1]);
    print_message("  latents_final |GGUF - gguf-py's values| = %.3g (bit for bit: 0)\n",
                  tu_max_abs_diff(lat[0], lat[1], (size_t)n[0], NULL));
    assert_memory_equal(lat[0], lat[1], (size_t)n[0] * sizeof(float));
    /* and the runs used the given transformer, not the folder's: Q8 moves this tiny random
     * model's latents far from diffusers' of the unquantized weights */
    char golden[1200];
    snprintf(golden, sizeof golden, "%s/cases/64x64/expected.safetensors", pipe);
    int64_t ng;
    float *fg = st_tensor(golden, "latents_final", &ng);
    assert_int_equal(ng, n[0]);
    const double dq = tu_max_abs_diff(lat[0], fg, (size_t)ng, NULL);
    print_message("  latents_final |GGUF - diffusers' unquantized| = %.3g (> 1e-3: the GGUF weights ran)\n", dq);
    assert_true(dq > 1e-3);
    free(fg);
    free(lat[0]), free(lat[1]), free(src[0]), free(src[1]);
}

/* A dead rank on pjrt, three jobs side by side (they mostly wait: for the launcher, for the
 * watchdog), with the golden case's call, whose programs the test above cached. A rank's
 * collectives there (68 now: the mesh's all-gather, the agreement after loading, 6 in CLIP's 3
 * layers, then 10 per transformer forward — 2 double-stream blocks x 4, 2 single-stream x 1 — in
 * each of 6 steps): the fault hits the 15th from the end, the fifth all-reduce of the fifth
 * forward — in compile mode a replay of the compiled plan (the first forward captured it),
 * whatever is added before the denoising loop. */
static void test_dead_rank(void **state) {
    (void)state;
    if (!have_mpi() || !have_pjrt()) skip();
    char pipe[1024], args[4096], base[6000];
    snprintf(pipe, sizeof pipe, "%s/flux1_dev_tiny", tu_data("pipelines"));
    int steps;
    case_args(pipe, "64x64", args, sizeof args, &steps);
    snprintf(base, sizeof base, "'%s' generate %s --device pjrt --tp 2 --tp-replicate text_encoder_2", CDF_CLI_PATH, args);
    assert_int_equal(steps, 6);
    assert_true(g_collectives > 60); /* counted by the test above */
    const unsigned long long at = g_collectives - 15;
    enum { NJOBS = 3 };
    static const char *const names[NJOBS] = {"rank 1 killed, compiled", "rank 1 hangs, eager", "rank 1 hangs, compiled"};
    char cmd[NJOBS][16384];
    /* killed inside the compiled transformer's replay: its all-reduces run between the plan's
     * programs, so the other rank is running one of them or waiting in the sum; the launcher
     * must end it and name the dead rank */
    snprintf(cmd[0], sizeof cmd[0], UNSET_MODES MPIRUN " -np 2%s%s -x CDIFFUSERS_DIST_FAULT=1:kill:%llu %s --mode compile "
             "--output '%s'", rank_env(), mpi_env_no_leak_check(), at, base, tu_tmp_path("dead0.png"));
    /* stops between two eager programs: rank 0's watchdog ends it (naming itself, the
     * collective and the timeout), then the launcher ends the job */
    snprintf(cmd[1], sizeof cmd[1], UNSET_MODES MPIRUN " -np 2%s%s -x CDIFFUSERS_DIST_FAULT=1:hang:%llu -x CDIFFUSERS_DIST_TIMEOUT=2 %s "
             "--output '%s'", rank_env(), mpi_env_no_leak_check(), at, base, tu_tmp_path("dead1.png"));
    /* stops in the compiled forward's replay: rank 0 finishes the program before the sum and
     * waits in it; its watchdog ends it the same way */
    snprintf(cmd[2], sizeof cmd[2], UNSET_MODES MPIRUN " -np 2%s%s -x CDIFFUSERS_DIST_FAULT=1:hang:%llu -x CDIFFUSERS_DIST_TIMEOUT=2 %s "
             "--mode compile --output '%s'", rank_env(), mpi_env_no_leak_check(), at, base, tu_tmp_path("dead2.png"));
    char script[40000];
    size_t o = 0;
    for (int i = 0; i < NJOBS; i++)
        o += snprintf(script + o, sizeof script - o,
                      "( sleep 0.%d; s=$(date +%%s.%%N); %s > '%s/dead%d.log' 2>&1; echo $? $s $(date +%%s.%%N) > '%s/dead%d.rc' ) & ",
                      4 * i, cmd[i], tu_tmpdir(), i, tu_tmpdir(), i);
    snprintf(script + o, sizeof script - o, "wait");
    assert_int_equal(tu_system("%s", script), 0);
    for (int i = 0; i < NJOBS; i++) {
        char p[1100];
        snprintf(p, sizeof p, "%s/dead%d.rc", tu_tmpdir(), i);
        char *rcs = tu_read_file(p, NULL);
        assert_non_null(rcs);
        int rc = 0;
        double s0 = 0, s1 = 0;
        assert_int_equal(sscanf(rcs, "%d %lf %lf", &rc, &s0, &s1), 3);
        free(rcs);
        snprintf(p, sizeof p, "%s/dead%d.log", tu_tmpdir(), i);
        char *log = tu_read_file(p, NULL);
        assert_non_null(log);
        print_message("  %-24s exit %d after %.1f s\n", names[i], rc, s1 - s0);
        char reached[96];
        snprintf(reached, sizeof reached, "CDIFFUSERS_DIST_FAULT: %s at collective #%llu", i ? "hang" : "kill", at);
        bool ok = rc != 0 && s1 - s0 < 60 /* bounded: no hang */ &&
                  strstr(log, reached) != NULL; /* the fault was reached: the run got that far */
        if (i == 0) ok = ok && strstr(log, "rank 1") && strstr(log, "signal 9");
        else ok = ok && strstr(log, "did not complete within 2 s: another rank is stuck or has died") &&
                  (rc == CDF_DIST_EXIT_TIMEOUT || rc > 128);
        if (!ok) fail_msg("the '%s' job (exit %d after %.1f s) did not end as expected; its output:\n%s", names[i], rc, s1 - s0, log);
        free(log);
    }
    for (int i = 0; i < NJOBS; i++) {
        char f[16];
        snprintf(f, sizeof f, "dead%d.png", i);
        assert_int_not_equal(access(tu_tmp_path(f), F_OK), 0); /* nothing written */
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flux_tp2_mpi_every_mode),
        cmocka_unit_test(test_gguf_tp2_mpi),
        cmocka_unit_test(test_dead_rank),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
