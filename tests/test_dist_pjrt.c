/* Tensor parallelism in one process over the devices of the pjrt backend (issue #40):
 * `cdiffusers generate --tp 2 --device pjrt` without MPI opens the XLA CPU plugin with 2 devices,
 * loads each rank's slice of every sharded weight onto its device (pjrt:0, pjrt:1) and runs every
 * program as 2 replicas with the all-reduce inside it (stablehlo.all_reduce). The tiny FLUX.1
 * golden case in each execution mode against diffusers' output (tests/data/pipelines): the
 * transformer and CLIP sharded over 2 devices, and the T5 encoder (3 heads) sharded over 3 — its
 * relative position bias table split by heads like q/k/v, so one program serves every replica;
 * a GGUF transformer and --weight-type q8_0 over 2 devices (each replica's slice decoded on the
 * host); LoRA on the sharded layers (each replica its slices of the adapter), run time and fused,
 * against diffusers + PEFT. The bad inputs: a TP degree the plugin has no devices for, a plan that does not divide —
 * each a clear error, never a crash, and none after a weight was read. Skipped (77) in a build
 * without the pjrt backend or without a plugin. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cdiffusers/cdiffusers.h"
#include "cdiffusers/device.h"
#include "cdiffusers/dist.h"
#include "dist_test_common.h"

#define GOLDEN_LATENT_TOL 5e-4 /* test_dist's: |tp - diffusers| of the final latents */

static char g_cache[1100]; /* one program cache for the runs of this test */

static bool have_pjrt(void) {
    if (!cdf_backend_runs_replicas("pjrt")) return false;
    cdf_pjrt_plugin_info p[8];
    const int n = cdf_pjrt_list_plugins(p, 8);
    for (int i = 0; i < n && i < 8; i++)
        if (p[i].chosen && p[i].api_major >= 0) return true;
    return false;
}

/* Runs `cdiffusers generate <args> --device pjrt <extra>` (no MPI launcher) with `env` in front,
 * stderr into *log (malloc'd); returns the exit status (-1 for a signal). */
static int run_cli(const char *env, const char *args, const char *extra, const char *tag, char **log) {
    char path[1100];
    snprintf(path, sizeof path, "%s/%s.log", tu_tmpdir(), tag);
    int rc = tu_system("env -u CDIFFUSERS_COMPILE -u CDIFFUSERS_DEFER_AND_FUSE -u CDIFFUSERS_DEVICE -u OMPI_COMM_WORLD_SIZE "
                       "-u PMI_SIZE CDIFFUSERS_PJRT_CACHE='%s' %s '%s' generate %s --device pjrt %s 2> '%s'",
                       g_cache, env, CDF_CLI_PATH, args, extra, path);
    *log = tu_read_file(path, NULL);
    if (!*log) *log = strdup("");
    return rc;
}

typedef struct mode {
    const char *name, *env, *args;
    bool compiled; /* a graph break would be a host read in the forward */
} mode;

/* The tiny FLUX.1 golden case with `--tp tp --tp-replicate replicate` in every mode against
 * diffusers' latents and image. collectives > 0: exactly that many all-reduces recorded (a check
 * of what was sharded); 0: at least one per denoising step. */
static void golden_every_mode(int tp, const char *replicate, unsigned long long collectives) {
    flux_golden g;
    flux_golden_open(&g);
    const char *args = g.args;
    const int steps = g.steps;

    static const mode modes[] = {
        {"eager", "", "", false},
        {"defer-and-fuse", "CDIFFUSERS_DEFER_AND_FUSE=1", "", false},
        {"compile", "", "--mode compile", true},
        {"repeated blocks", "", "--compile-repeated-blocks", true},
    };
    for (size_t m = 0; m < sizeof modes / sizeof *modes; m++) {
        char png[1100], lat[1100], extra[2400], env[200], tag[64];
        snprintf(png, sizeof png, "%s/tp%dp_%zu.png", tu_tmpdir(), tp, m);
        snprintf(lat, sizeof lat, "%s/tp%dp_%zu.safetensors", tu_tmpdir(), tp, m);
        snprintf(extra, sizeof extra, "--tp %d --tp-replicate %s %s --force --output '%s' --latents-out '%s'", tp, replicate,
                 modes[m].args, png, lat);
        snprintf(env, sizeof env, "CDIFFUSERS_LOG=io,pjrt,compile %s", modes[m].env);
        snprintf(tag, sizeof tag, "tp%dp_%zu", tp, m);
        const double t0 = now_s();
        char *log;
        const int rc = run_cli(env, args, extra, tag, &log);
        if (rc != 0) fail_msg("--tp %d --device pjrt (%s) failed (%d): ...%s", tp, modes[m].name, rc, log_tail(log, 1500));
        /* the one-process path ran: tp replicas, the all-reduce inside the programs */
        char replicas[96];
        snprintf(replicas, sizeof replicas, "every program runs as %d replicas (num_replicas=%d)", tp, tp);
        assert_non_null(strstr(log, replicas));
        io_line io[1] = {{0}};
        assert_int_equal(parse_io(log, io, 1), 1);
        assert_int_equal(io[0].world, tp);
        if (collectives) assert_int_equal(io[0].collectives, collectives);
        else assert_true(io[0].collectives > (unsigned long long)steps); /* at least one all-reduce per block per step */
        if (modes[m].compiled) assert_int_equal(count_substr(log, "graph break"), 0);

        double d;
        int lv;
        flux_golden_compare(&g, lat, png, &d, &lv);
        print_message("  --tp %d, %s: %.1f s; %llu all-reduces; latents_final |tp - diffusers| = %.3g (tol %.0e); image within %d "
                      "level(s) of diffusers'\n",
                      tp, modes[m].name, now_s() - t0, io[0].collectives, d, GOLDEN_LATENT_TOL, lv);
        assert_true(d <= GOLDEN_LATENT_TOL);
        assert_true(lv <= 1);
        free(log);
    }
    flux_golden_close(&g);
}

/* The transformer and CLIP over 2 devices (the tiny T5's 3 heads do not divide by 2: whole). */
static void test_flux_tp2_one_process_every_mode(void **state) {
    (void)state;
    if (!have_pjrt()) skip();
    golden_every_mode(2, "text_encoder_2", 0);
}

/* The T5 encoder over 3 devices (1 head each; the transformer's 2 heads and CLIP stay whole):
 * its 2 blocks' attention-out and FFN-out sums are the run's only all-reduces. */
static void test_flux_t5_tp3_one_process_every_mode(void **state) {
    (void)state;
    if (!have_pjrt()) skip();
    golden_every_mode(3, "text_encoder,transformer", 4);
}

/* A GGUF transformer (tests/data/formats/flux_single/flux_bfl_q8.gguf: the tiny FLUX.1 transformer
 * in BFL names, mixed block types) over 2 devices in one process: each replica's slice is decoded
 * on the host as it is read (a rank's rows' blocks; the row-wise cuts of this tiny model fall
 * inside blocks, so those shards hold the whole layer's decoded values). The reference is
 * gguf-py's dequantization of the file (q8_dequant/, written by gguf-py, not by cdiffusers): the
 * run equals, bit for bit, the same --tp 2 run from those values, eager and compiled. (diffusers'
 * golden latents are of the unquantized weights; this tiny random model's latents move far from
 * them under Q8, so they are no reference here.) The programs are those of the folder's
 * transformer (weights are arguments): cached by the test above, each run takes about a second. */
static void test_gguf_tp2_one_process(void **state) {
    (void)state;
    if (!have_pjrt()) skip();
    char pipe[1024], args[4096];
    snprintf(pipe, sizeof pipe, "%s/flux1_dev_tiny", tu_data("pipelines"));
    int steps;
    case_args(pipe, "64x64", args, sizeof args, &steps);
    char *gguf = strdup(tu_data("formats/flux_single/flux_bfl_q8.gguf"));
    char *deq = strdup(tu_data("formats/flux_single/q8_dequant/transformer/diffusion_pytorch_model.safetensors"));
    static const char *const modes[] = {"", "--mode compile"};
    for (size_t m = 0; m < sizeof modes / sizeof *modes; m++) {
        float *lat[2] = {NULL, NULL};
        int64_t n[2] = {0, 0};
        for (int k = 0; k < 2; k++) {
            char out[1100], extra[3600], tag[32];
            snprintf(out, sizeof out, "%s/gguf_%zu_%d.safetensors", tu_tmpdir(), m, k);
            snprintf(extra, sizeof extra, "--tp 2 --tp-replicate text_encoder_2 --transformer '%s' %s --force --output "
                     "'%s/gguf.png' --latents-out '%s'", k == 0 ? gguf : deq, modes[m], tu_tmpdir(), out);
            snprintf(tag, sizeof tag, "gguf_%zu_%d", m, k);
            const double t0 = now_s();
            char *log;
            const int rc = run_cli("CDIFFUSERS_LOG=io,pjrt", args, extra, tag, &log);
            if (rc != 0)
                fail_msg("--tp 2 --device pjrt --transformer %s %s failed (%d): ...%s", k == 0 ? gguf : deq, modes[m], rc,
                         log_tail(log, 1500));
            assert_non_null(strstr(log, "every program runs as 2 replicas (num_replicas=2)"));
            io_line io[1] = {{0}};
            assert_int_equal(parse_io(log, io, 1), 1);
            assert_int_equal(io[0].world, 2);
            assert_true(io[0].collectives > (unsigned long long)steps);
            lat[k] = st_tensor(out, "latents_final", &n[k]);
            print_message("  %s %s: %.1f s\n", k == 0 ? "GGUF" : "gguf-py's values", m ? "compile" : "eager", now_s() - t0);
            free(log);
        }
        assert_int_equal(n[0], n[1]);
        const double d = tu_max_abs_diff(lat[0], lat[1], (size_t)n[0], NULL);
        print_message("  %s: latents_final |GGUF - gguf-py's values| = %.3g (bit for bit: 0)\n", m ? "compile" : "eager", d);
        assert_memory_equal(lat[0], lat[1], (size_t)n[0] * sizeof(float));
        free(lat[0]), free(lat[1]);
    }
    free(gguf), free(deq);

    /* the folder quantized at load (--weight-type q8_0), each replica's shard decoded: near
     * diffusers' unquantized golden latents, within Q8_0's effect on them (0.033 measured, the
     * same on the cpu backend in one process) */
    char golden[1200], out[1100], extra[2400];
    snprintf(golden, sizeof golden, "%s/cases/64x64/expected.safetensors", pipe);
    snprintf(out, sizeof out, "%s/wtype.safetensors", tu_tmpdir());
    snprintf(extra, sizeof extra, "--tp 2 --tp-replicate text_encoder_2 --weight-type q8_0 --force --output '%s/wtype.png' "
             "--latents-out '%s'", tu_tmpdir(), out);
    char *log;
    const int rc = run_cli("CDIFFUSERS_LOG=io,pjrt", args, extra, "wtype", &log);
    if (rc != 0) fail_msg("--tp 2 --device pjrt --weight-type q8_0 failed (%d): ...%s", rc, log_tail(log, 1500));
    assert_non_null(strstr(log, "every program runs as 2 replicas (num_replicas=2)"));
    int64_t ng, n;
    float *fg = st_tensor(golden, "latents_final", &ng), *f = st_tensor(out, "latents_final", &n);
    assert_int_equal(n, ng);
    const double d = tu_max_abs_diff(f, fg, (size_t)n, NULL);
    print_message("  --weight-type q8_0: latents_final |tp - diffusers' f32| = %.3g (tol 5e-2)\n", d);
    assert_true(d <= 5e-2);
    free(f), free(fg), free(log);
}

/* LoRA on sharded layers over the replicas (each replica its rank's slices of A and B, as the
 * MPI path cuts them per rank, test_dist_lora.c): the tiny FLUX.1 pipeline with a PEFT adapter on
 * CLIP-L (sharded over the 2 devices: q/k/v and fc1 column-wise, out_proj and fc2 row-wise) and
 * on the transformer's to_q (column-wise), at 0.7, run time and fused, eager and compiled:
 * diffusers + PEFT's latents of the same call (tests/data/lora/pipe_flux_te.safetensors, made by
 * tools/make-lora-golden) within test_dist_lora's golden tolerance. A wrong slice on a replica
 * moves them by O(1) (the adapter moves them by several units). */
static void test_lora_tp2_one_process(void **state) {
    (void)state;
    if (!have_pjrt()) skip();
    const char *args = "--model '" CDF_TEST_DATA "/pipelines/flux1_dev_tiny' --prompt 'A capybara wearing a tiny astronaut "
                       "helmet, studio photo' --height 64 --width 64 --steps 3 --guidance 3.5 --max-sequence-length 64 --seed 1234 "
                       "--threads 1 --quiet --dtype f32";
    static const char *const exec[] = {"", "--mode compile"}, *const lmode[] = {"runtime", "fuse"};
    for (int e = 0; e < 2; e++)
        for (int m = 0; m < 2; m++) {
            char out[1100], extra[3000], tag[32], key[128];
            snprintf(out, sizeof out, "%s/lora_%d_%d.safetensors", tu_tmpdir(), e, m);
            snprintf(extra, sizeof extra, "--tp 2 --tp-replicate text_encoder_2 --lora '%s/lora/pipe_flux_te_peft.safetensors:0.7' "
                     "--lora-mode %s %s --force --output '%s/lora.png' --latents-out '%s'", CDF_TEST_DATA, lmode[m], exec[e],
                     tu_tmpdir(), out);
            snprintf(tag, sizeof tag, "lora_%d_%d", e, m);
            const double t0 = now_s();
            char *log;
            const int rc = run_cli("CDIFFUSERS_LOG=io,pjrt", args, extra, tag, &log);
            if (rc != 0)
                fail_msg("--tp 2 --device pjrt --lora (%s, %s) failed (%d): ...%s", lmode[m], e ? "compile" : "eager", rc,
                         log_tail(log, 1500));
            assert_non_null(strstr(log, "every program runs as 2 replicas (num_replicas=2)"));
            free(log);
            snprintf(key, sizeof key, "pipe_flux_te_peft.%s_s07.latents_final", m ? "fused" : "runtime");
            int64_t n, ng;
            float *f = st_tensor(out, "latents_final", &n), *g = st_tensor(CDF_TEST_DATA "/lora/pipe_flux_te.safetensors", key, &ng);
            assert_int_equal(n, ng);
            const double d = tu_max_abs_diff(f, g, (size_t)n, NULL);
            print_message("  LoRA %s, %s: %.1f s; latents_final |tp - diffusers| = %.3g (tol %.0e)\n", lmode[m],
                          e ? "compile" : "eager", now_s() - t0, d, GOLDEN_LATENT_TOL);
            assert_true(d <= GOLDEN_LATENT_TOL);
            free(f), free(g);
        }
}

/* The fused adapter taken out again over the replicas (cdf_pipeline_unload_lora, in this
 * process): each fused shard's weight is read again from its file — every replica its own rank's
 * slice (nn/sharded.c cdf_linear_reload_weight), not replica 0's everywhere — and the run after
 * the unload is diffusers' after unfuse_lora + unload_lora_weights and its base run
 * (pipe_flux_te.safetensors "…unloaded", "base"; test_lora_pipeline's tolerance). */
static double latents_vs(cdf_pipeline *pipe, const char *key) {
    cdf_generate_params gp = cdf_generate_params_default();
    gp.prompt = "A capybara wearing a tiny astronaut helmet, studio photo";
    gp.height = gp.width = 64;
    gp.num_inference_steps = 3;
    gp.guidance_scale = 3.5f;
    gp.max_sequence_length = 64;
    gp.seed = 1234;
    cdf_tensor_map cap;
    cdf_tensor_map_init(&cap);
    gp.capture = (cdf_capture *)&cap;
    cdf_image img;
    if (cdf_pipeline_generate(pipe, &gp, &img) != CDF_OK) fail_msg("generate: %s", cdf_last_error());
    cdf_tensor *got = cdf_tensor_map_get(&cap, "latents_final");
    assert_non_null(got);
    float *g = cdf_tensor_read_f32(got);
    assert_non_null(g);
    int64_t n;
    float *w = st_tensor(CDF_TEST_DATA "/lora/pipe_flux_te.safetensors", key, &n);
    assert_int_equal(cdf_tensor_numel(got), n);
    const double d = tu_max_abs_diff(g, w, (size_t)n, NULL);
    free(g), free(w);
    cdf_image_free(&img);
    cdf_tensor_map_clear(&cap);
    return d;
}

static void test_lora_fused_unload_one_process(void **state) {
    (void)state;
    if (!have_pjrt()) skip();
    setenv("CDIFFUSERS_PJRT_CACHE", g_cache, 1);
    cdf_process_group *pg = NULL;
    cdf_device_mesh *mesh = NULL;
    assert_int_equal(cdf_dist_init_devices("pjrt", 2, &pg), CDF_OK);
    assert_int_equal(cdf_device_mesh_new(pg, cdf_dist_replica_device(pg), &mesh), CDF_OK);
    assert_int_equal(cdf_tp_enable(mesh, "text_encoder_2"), CDF_OK);
    cdf_pipeline_load_params lp = cdf_pipeline_load_params_default();
    lp.weight_dtype = CDF_F32;
    lp.device = "pjrt";
    cdf_pipeline *pipe = NULL;
    if (cdf_pipeline_load(CDF_TEST_DATA "/pipelines/flux1_dev_tiny", &lp, &pipe) != CDF_OK) fail_msg("load: %s", cdf_last_error());
    cdf_lora_params lo = cdf_lora_params_default();
    lo.mode = CDF_LORA_FUSE;
    lo.scale = 0.7f;
    assert_int_equal(cdf_pipeline_load_lora(pipe, CDF_TEST_DATA "/lora/pipe_flux_te_peft.safetensors", &lo, NULL), CDF_OK);
    const double fused = latents_vs(pipe, "pipe_flux_te_peft.fused_s07.latents_final");
    assert_int_equal(cdf_pipeline_unload_lora(pipe), CDF_OK);
    const double unloaded = latents_vs(pipe, "pipe_flux_te_peft.unloaded.latents_final"),
                 base = latents_vs(pipe, "base.latents_final");
    print_message("  fused then unloaded, 2 devices: latents_final |fused - diffusers| = %.3g, |unloaded - diffusers| = %.3g, "
                  "|unloaded - base| = %.3g (tol %.0e)\n", fused, unloaded, base, GOLDEN_LATENT_TOL);
    assert_true(fused <= GOLDEN_LATENT_TOL);
    assert_true(unloaded <= GOLDEN_LATENT_TOL);
    assert_true(base <= GOLDEN_LATENT_TOL);
    cdf_pipeline_free(pipe);
    cdf_tp_disable();
    cdf_device_mesh_free(mesh);
    cdf_dist_finalize(pg);
}

/* A bad --tp: a clear error (exit status 1 or 2, never a signal), naming the cause, with no
 * weight read (no io line: CDIFFUSERS_LOG=io prints one after loading) and nothing written. */
static void expect_refused(const char *env, const char *args, const char *extra, const char *tag, const char *needle) {
    char *log;
    const int rc = run_cli(env, args, extra, tag, &log);
    print_message("  %s: exit %d: %s", tag, rc, log);
    assert_true(rc == 1 || rc == 2);
    if (!strstr(log, needle)) fail_msg("%s: expected '%s' in: %s", tag, needle, log);
    assert_null(strstr(log, "cdiffusers: io: "));
    assert_null(strstr(log, "Assertion"));
    assert_null(strstr(log, "Check failed"));
    free(log);
}

static void test_bad_inputs(void **state) {
    (void)state;
    if (!have_pjrt()) skip();
    char pipe[1024], args[4096], out[1200];
    snprintf(pipe, sizeof pipe, "%s/flux1_dev_tiny", tu_data("pipelines"));
    int steps;
    case_args(pipe, "64x64", args, sizeof args, &steps);
    snprintf(out, sizeof out, "--force --output '%s/bad.png'", tu_tmpdir());
    char extra[1400];
    /* more devices than the plugin has: the CPU plugin told to make 1 */
    snprintf(extra, sizeof extra, "--tp 2 --tp-replicate text_encoder_2 %s", out);
    expect_refused("CDIFFUSERS_LOG=io CDIFFUSERS_PJRT_OPTIONS=cpu_device_count=1", args, extra, "too_few_devices",
                   "has 1 device(s)");
    /* a plan that does not divide: the tiny transformer's 2 heads over 3 devices */
    snprintf(extra, sizeof extra, "--tp 3 --tp-replicate text_encoder_2 %s", out);
    expect_refused("CDIFFUSERS_LOG=io", args, extra, "not_divisible", "not divisible by 3");
    /* T5 (3 heads) sharded over 2: the MPI path's error, naming the config key */
    snprintf(extra, sizeof extra, "--tp 2 --tp-replicate text_encoder,transformer %s", out);
    expect_refused("CDIFFUSERS_LOG=io", args, extra, "t5_not_divisible", "num_heads = 3, which is not divisible by 2");
    assert_int_not_equal(access(tu_tmp_path("bad.png"), F_OK), 0);
}

int main(void) {
    snprintf(g_cache, sizeof g_cache, "%s/pjrt-cache", tu_tmpdir());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test(test_flux_tp2_one_process_every_mode),
        cmocka_unit_test(test_flux_t5_tp3_one_process_every_mode),
        cmocka_unit_test(test_gguf_tp2_one_process),
        cmocka_unit_test(test_lora_tp2_one_process),
        cmocka_unit_test(test_lora_fused_unload_one_process),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
