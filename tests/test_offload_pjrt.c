/* Model and sequential offload on the pjrt backend (issue #40), on the tiny FLUX.1 golden
 * pipeline (tests/data/pipelines/flux1_dev_tiny, case 64x64, diffusers' picture), eager:
 *  - under a device budget below the pipeline's weights (the planned peak / 0.9), model and
 *    sequential offload run on pjrt and draw diffusers' picture (within 1 level); the measured
 *    peak (live buffers plus each running program's compiled temporaries,
 *    PJRT_Executable_GetCompiledMemoryStats) is within 10% of `plan`'s, and so are the
 *    text-encoding and denoising phases';
 *  - the denoising phase alone under a budget of its planned peak / 0.9 runs and under / 1.1
 *    fails (out of memory, not a crash); sequential's denoising budget is one that model offload
 *    cannot run in;
 *  - a budget that cannot hold even one block (or the largest text encoder): the planner's error
 *    at load, before any weight reaches the device.
 * The plan models eager execution, and on the XLA CPU plugin each op's compiled temporaries
 * (planner.c, xla_cpu_scratch: the VAE's convolutions put its decode 25% above a plan without
 * them), so the VAE decode phase is held to 10% too.
 * Offload's prefetch (offload.c): each mode runs with prefetch on and off (CDIFFUSERS_OFFLOAD_PREFETCH=0)
 * under the same budget: the pictures are bit-identical, each phase is within 10% of the plan
 * for that budget (cdf_pipeline_plan_memory_budget: with the prefetches it decides, or none),
 * and the prefetches made are the ones planned; a budget between the text phase's need and its
 * prefetch peak prefetches the VAE but not the transformer.
 * And the backend's transfers (docs/pjrt.md, "Offload and device memory on pjrt"):
 *  - a whole storage set from the host starts its asynchronous upload at once (not at the first
 *    program reading it), and the host bytes the uploads held are freed by the next sync;
 *  - sequential offload keeps each streamed block weight in the plugin's pinned_host memory
 *    (made once) and copies it to device memory per block: the copies are counted, and the
 *    picture is diffusers' with and without that staging (CDIFFUSERS_HOST_STAGING=0);
 *  - a failed asynchronous upload (CDIFFUSERS_PJRT_FAULT=upload:N: the CPU plugin's copies do not
 *    fail) is the generate call's clear error, not a crash, and the next call draws the picture.
 * Skipped (77) in a build without the pjrt backend or without a plugin. */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cdiffusers/cdiffusers.h"
#include "cdiffusers/device.h"
#include "cdiffusers/io.h"
#include "backend/backend_impl.h"
#include "pipelines/pipeline_impl.h"
#include "pipelines/planner.h"

static char g_pipe[1024], g_prompt[512];
static cdf_generate_params g_gp;
static cdf_device *g_dev;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static bool have_pjrt(void) {
    cdf_pjrt_plugin_info p[8];
    const int n = cdf_pjrt_list_plugins(p, 8);
    for (int i = 0; i < n && i < 8; i++)
        if (p[i].chosen && p[i].api_major >= 0) return true;
    return false;
}

/* the golden case's call (expected.json) as generate's parameters */
static int setup(void **state) {
    (void)state;
    unsetenv("CDIFFUSERS_COMPILE");
    unsetenv("CDIFFUSERS_DEFER_AND_FUSE");
    char cache[1100]; /* this test's own program cache (a later run of it compiles nothing) */
    snprintf(cache, sizeof cache, "%s/pjrt-cache", tu_tmpdir());
    setenv("CDIFFUSERS_PJRT_CACHE", cache, 1);
    if (!have_pjrt() || !(g_dev = cdf_device_get("pjrt"))) return 0;
    snprintf(g_pipe, sizeof g_pipe, "%s/flux1_dev_tiny", tu_data("pipelines"));
    char path[1200];
    snprintf(path, sizeof path, "%s/cases/64x64/expected.json", g_pipe);
    char *txt = tu_read_file(path, NULL);
    if (!txt) return -1;
    cJSON *js = cJSON_Parse(txt);
    free(txt);
    const cJSON *call = cJSON_GetObjectItem(js, "call");
    if (!call) return -1;
    snprintf(g_prompt, sizeof g_prompt, "%s", cJSON_GetObjectItem(call, "prompt")->valuestring);
    g_gp = cdf_generate_params_default();
    g_gp.prompt = g_prompt;
    g_gp.height = cJSON_GetObjectItem(call, "height")->valueint;
    g_gp.width = cJSON_GetObjectItem(call, "width")->valueint;
    g_gp.num_inference_steps = cJSON_GetObjectItem(call, "num_inference_steps")->valueint;
    g_gp.guidance_scale = cJSON_GetObjectItem(call, "guidance_scale")->valuedouble;
    g_gp.seed = (uint64_t)cJSON_GetObjectItem(call, "seed")->valuedouble;
    g_gp.max_sequence_length = cJSON_GetObjectItem(call, "max_sequence_length")->valueint;
    cJSON_Delete(js);
    return cdf_exec_set_mode(CDF_EXEC_EAGER) == CDF_OK ? 0 : -1;
}

static cdf_pipeline_load_params load_params(cdf_offload_mode mode) {
    cdf_pipeline_load_params lp = cdf_pipeline_load_params_default();
    lp.offload = mode;
    lp.weight_dtype = CDF_F32; /* the golden data's dtype */
    lp.device = "pjrt";
    return lp;
}

static uint64_t current_bytes(void) {
    assert_int_equal(cdf_device_synchronize(g_dev), CDF_OK);
    cdf_memory_stats st;
    cdf_device_memory_stats(g_dev, &st);
    return st.current_bytes;
}

static const char *mode_name(cdf_offload_mode m) { return m == CDF_OFFLOAD_SEQUENTIAL ? "sequential" : "model"; }

/* |measured / planned - 1| <= 10% */
static bool within_10(uint64_t measured, uint64_t planned) {
    return measured >= (uint64_t)(0.9 * planned) && measured <= (uint64_t)(1.1 * planned);
}

/* diffusers' picture, within 1 level */
static void check_image(const cdf_image *img) {
    char golden[1200];
    snprintf(golden, sizeof golden, "%s/cases/64x64/expected.safetensors", g_pipe);
    cdf_st_file *gf;
    assert_int_equal(cdf_st_open(golden, &gf), CDF_OK);
    const cdf_st_tensor *u8 = cdf_st_find(gf, "image_uint8");
    assert_non_null(u8);
    const size_t n = (size_t)img->width * img->height * img->channels;
    assert_int_equal(cdf_st_numel(u8), (int64_t)n);
    const uint8_t *g = cdf_st_data(gf, u8);
    int worst = 0;
    for (size_t i = 0; i < n; i++) {
        const int d = abs((int)g[i] - (int)img->pixels[i]);
        if (d > worst) worst = d;
    }
    print_message("    image within %d level(s) of diffusers'\n", worst);
    assert_true(worst <= 1);
    cdf_st_close(gf);
}

/* generate with a budget during phase ph only: true when it ran, false when out of memory */
static bool generate_phase_budget(cdf_pipeline *p, int ph, uint64_t limit) {
    p->phase_limit_active = true;
    memset(p->phase_limit, 0, sizeof p->phase_limit);
    p->phase_limit[ph] = limit;
    cdf_image img;
    cdf_status s = cdf_pipeline_generate(p, &g_gp, &img);
    p->phase_limit_active = false;
    if (s == CDF_OK) cdf_image_free(&img);
    else if (s != CDF_ERR_OUT_OF_MEMORY) print_message("unexpected failure: %s\n", cdf_last_error());
    assert_true(s == CDF_OK || s == CDF_ERR_OUT_OF_MEMORY);
    return s == CDF_OK;
}

static void set_prefetch(bool on) { assert_int_equal(setenv("CDIFFUSERS_OFFLOAD_PREFETCH", on ? "1" : "0", 1), 0); }

/* One generate of p under a budget of base + budget bytes on the whole run, prefetch on or off:
 * its phases within 10% of the plan for that budget, the prefetches it made the planned ones;
 * the picture in *img (the caller frees it). */
static void run_within_plan(cdf_pipeline *p, cdf_offload_mode mode, uint64_t base, uint64_t budget, bool prefetch,
                            cdf_image *img) {
    set_prefetch(prefetch); /* the planner reads it too */
    cdf_pipeline_load_params lp = load_params(mode);
    cdf_memory_plan plan;
    assert_int_equal(cdf_pipeline_plan_memory_budget(g_pipe, &lp, &g_gp, CDF_PLAN_EAGER, budget, &plan), CDF_OK);
    assert_int_equal(cdf_device_set_memory_limit(g_dev, base + budget), CDF_OK);
    cdf_status s = cdf_pipeline_generate(p, &g_gp, img);
    assert_int_equal(cdf_device_set_memory_limit(g_dev, 0), CDF_OK);
    if (s != CDF_OK) fail_msg("generate (%s offload on pjrt, prefetch %s): %s", mode_name(mode), prefetch ? "on" : "off",
                              cdf_last_error());
    cdf_pipeline_memory_stats ms;
    cdf_pipeline_last_memory_stats(p, &ms);
    const uint64_t peak = ms.peak_bytes - base;
    print_message("  %s offload on pjrt, prefetch %s, under a %llu-byte budget (weights %llu): peak %llu, planned %llu (%+.1f%%); "
                  "%d prefetch(es)\n",
                  mode_name(mode), prefetch ? "on" : "off", (unsigned long long)budget, (unsigned long long)plan.total_weights_bytes,
                  (unsigned long long)peak, (unsigned long long)plan.peak_bytes, 100.0 * ((double)peak / (double)plan.peak_bytes - 1),
                  ms.prefetches);
    int planned = 0;
    for (int ph = 0; ph < CDF_PHASE_COUNT; ph++) {
        print_message("    %s: measured %llu, planned %llu (%+.1f%%)%s\n", cdf_pipeline_phase_name((cdf_pipeline_phase)ph),
                      (unsigned long long)(ms.phase_peak_bytes[ph] - base), (unsigned long long)plan.phase[ph].peak_bytes,
                      100.0 * ((double)(ms.phase_peak_bytes[ph] - base) / (double)plan.phase[ph].peak_bytes - 1),
                      plan.phase[ph].prefetch ? ", the next model prefetched" : "");
        assert_int_equal(plan.phase[ph].prefetch, ms.prefetch_peak_bytes[ph] != 0);
        assert_true(within_10(ms.phase_peak_bytes[ph] - base, plan.phase[ph].peak_bytes));
        planned += plan.phase[ph].prefetch;
    }
    assert_int_equal(ms.prefetches, planned);
    if (!prefetch) assert_int_equal(planned, 0);
    assert_true(peak <= budget);
    assert_true(within_10(peak, plan.peak_bytes));
}

static void test_offload_on_pjrt_within_plan(void **state) {
    (void)state;
    if (!g_dev) skip();
    cdf_memory_plan pmodel;
    {
        cdf_pipeline_load_params lp = load_params(CDF_OFFLOAD_MODEL);
        assert_int_equal(cdf_pipeline_plan_memory(g_pipe, &lp, &g_gp, &pmodel), CDF_OK);
    }
    static const cdf_offload_mode modes[] = {CDF_OFFLOAD_MODEL, CDF_OFFLOAD_SEQUENTIAL};
    for (size_t m = 0; m < 2; m++) {
        const double t0 = now_s();
        cdf_pipeline_load_params lp = load_params(modes[m]);
        cdf_memory_plan plan; /* without prefetch: the need */
        assert_int_equal(cdf_pipeline_plan_memory(g_pipe, &lp, &g_gp, &plan), CDF_OK);
        const uint64_t budget = (uint64_t)(plan.peak_bytes / 0.9);
        assert_true(budget < plan.total_weights_bytes); /* the weights do not fit at once */
        const uint64_t base = current_bytes();
        assert_int_equal(cdf_device_set_memory_limit(g_dev, base + budget), CDF_OK);
        cdf_pipeline *p = NULL;
        cdf_status s = cdf_pipeline_load(g_pipe, &lp, &p);
        assert_int_equal(cdf_device_set_memory_limit(g_dev, 0), CDF_OK);
        if (s != CDF_OK) fail_msg("load (%s): %s", mode_name(modes[m]), cdf_last_error());
        cdf_image img, off;
        run_within_plan(p, modes[m], base, budget, true, &img);
        check_image(&img);
        run_within_plan(p, modes[m], base, budget, false, &off);
        assert_memory_equal(img.pixels, off.pixels, (size_t)img.width * img.height * img.channels);
        cdf_image_free(&off);
        /* a budget between the text phase's need and its prefetch peak: the VAE is prefetched, not the transformer */
        set_prefetch(true);
        cdf_memory_plan pf;
        assert_int_equal(cdf_pipeline_plan_memory_budget(g_pipe, &lp, &g_gp, CDF_PLAN_EAGER, UINT64_MAX, &pf), CDF_OK);
        const uint64_t tn = plan.phase[CDF_PHASE_TEXT].peak_bytes, tp = pf.phase[CDF_PHASE_TEXT].prefetch_peak_bytes;
        (void)tn;
        /* pjrt counts no queued work (buffers go at their release), so a run needs its planned
         * need within the plan's few percent (the runs above): halfway to the prefetch peak runs */
        if (tp > plan.peak_bytes + plan.peak_bytes / 25) {
            const uint64_t between = (tp + plan.peak_bytes) / 2;
            cdf_memory_plan pb;
            assert_int_equal(cdf_pipeline_plan_memory_budget(g_pipe, &lp, &g_gp, CDF_PLAN_EAGER, between, &pb), CDF_OK);
            assert_false(pb.phase[CDF_PHASE_TEXT].prefetch);
            assert_true(pb.phase[CDF_PHASE_DENOISE].prefetch);
            run_within_plan(p, modes[m], base, between, true, &off);
            assert_memory_equal(img.pixels, off.pixels, (size_t)img.width * img.height * img.channels);
            cdf_image_free(&off);
        } else {
            print_message("    (the transformer's prefetch peak %llu is within the budget's margin: no budget between)\n",
                          (unsigned long long)tp);
        }
        cdf_image_free(&img);
        unsetenv("CDIFFUSERS_OFFLOAD_PREFETCH");

        /* the denoising phase alone: its plan / 0.9 runs, / 1.1 does not */
        const uint64_t dn = plan.phase[CDF_PHASE_DENOISE].peak_bytes;
        assert_true(generate_phase_budget(p, CDF_PHASE_DENOISE, base + (uint64_t)(dn / 0.9)));
        assert_false(generate_phase_budget(p, CDF_PHASE_DENOISE, base + (uint64_t)(dn / 1.1)));
        cdf_pipeline_free(p);
        if (modes[m] == CDF_OFFLOAD_SEQUENTIAL) {
            /* a denoising budget sequential runs in and model offload cannot */
            assert_true(dn / 0.9 < 0.9 * pmodel.phase[CDF_PHASE_DENOISE].peak_bytes);
            cdf_pipeline_load_params lm = load_params(CDF_OFFLOAD_MODEL);
            assert_int_equal(cdf_pipeline_load(g_pipe, &lm, &p), CDF_OK);
            assert_false(generate_phase_budget(p, CDF_PHASE_DENOISE, base + (uint64_t)(dn / 0.9)));
            cdf_pipeline_free(p);
        }
        assert_int_equal(current_bytes(), base);
        print_message("    %.1f s\n", now_s() - t0);
    }
}

/* a budget that holds no block (nor the largest text encoder): the planner's error at load */
static void test_budget_below_one_block_refused_before_loading(void **state) {
    (void)state;
    if (!g_dev) skip();
    const uint64_t base = current_bytes();
    assert_int_equal(cdf_device_set_memory_limit(g_dev, base + 64 * 1024), CDF_OK);
    cdf_pipeline_load_params lp = load_params(CDF_OFFLOAD_SEQUENTIAL);
    cdf_pipeline *p = NULL;
    assert_int_equal(cdf_pipeline_load(g_pipe, &lp, &p), CDF_ERR_OUT_OF_MEMORY);
    assert_null(p);
    print_message("  %s\n", cdf_last_error());
    assert_non_null(strstr(cdf_last_error(), "out of memory even with --offload sequential"));
    assert_non_null(strstr(cdf_last_error(), "pjrt:0"));
    assert_int_equal(current_bytes(), base); /* nothing reached the device */
    assert_int_equal(cdf_device_set_memory_limit(g_dev, 0), CDF_OK);
}

static cdf_transfer_stats transfers(void) {
    cdf_transfer_stats t;
    cdf_device_transfer_stats(g_dev, &t);
    return t;
}

/* a whole tensor set from the host is on its way to the device before any program reads it */
static void test_whole_upload_starts_at_once(void **state) {
    (void)state;
    if (!g_dev) skip();
    enum { N = 1 << 18 }; /* 1 MiB of f32: above the CPU plugin's 100 KB synchronous-copy bound */
    float *h = malloc(N * sizeof *h);
    assert_non_null(h);
    for (int i = 0; i < N; i++) h[i] = (float)i * 0.5f;
    const cdf_transfer_stats t0 = transfers();
    const int64_t shape[1] = {N};
    cdf_tensor *t = cdf_tensor_from_host(g_dev, CDF_F32, 1, shape, h, CDF_F32);
    assert_non_null(t);
    const cdf_transfer_stats t1 = transfers();
    assert_int_equal(t1.async_uploads, t0.async_uploads + 1);
    assert_int_equal(t1.async_upload_bytes - t0.async_upload_bytes, (uint64_t)N * sizeof(float));
    /* the same bytes come back (the upload owns a copy: h may change at once) */
    memset(h, 0, N * sizeof *h);
    float *back = malloc(N * sizeof *back);
    assert_non_null(back);
    assert_int_equal(cdf_tensor_read(t, CDF_F32, back, N * sizeof *back), CDF_OK);
    for (int i = 0; i < N; i++)
        if (back[i] != (float)i * 0.5f) fail_msg("element %d: %g", i, back[i]);
    cdf_tensor_release(t);
    assert_int_equal(cdf_device_synchronize(g_dev), CDF_OK);
    assert_int_equal(transfers().pending_host_bytes, 0);
    free(back);
    free(h);
}

/* sequential offload: pinned_host staging used (counted), diffusers' picture with and without it;
 * model offload: its uploads asynchronous; every upload's host bytes freed by the sync */
static void test_pinned_staging_and_async_uploads(void **state) {
    (void)state;
    if (!g_dev) skip();
    for (int staging = 1; staging >= 0; staging--) {
        if (!staging) setenv("CDIFFUSERS_HOST_STAGING", "0", 1);
        cdf_pipeline_load_params lp = load_params(CDF_OFFLOAD_SEQUENTIAL);
        cdf_pipeline *p = NULL;
        if (cdf_pipeline_load(g_pipe, &lp, &p) != CDF_OK) fail_msg("load: %s", cdf_last_error());
        const cdf_transfer_stats t0 = transfers();
        cdf_image img;
        if (cdf_pipeline_generate(p, &g_gp, &img) != CDF_OK) fail_msg("generate: %s", cdf_last_error());
        const cdf_transfer_stats t1 = transfers();
        print_message("  sequential, staging %s: %llu weights staged in pinned_host (%llu live, %llu bytes), %llu copies to "
                      "the device (%llu bytes), %llu asynchronous uploads\n", staging ? "on" : "off",
                      (unsigned long long)(t1.staged_made - t0.staged_made), (unsigned long long)t1.staged,
                      (unsigned long long)t1.staged_bytes,
                      (unsigned long long)(t1.staged_copies - t0.staged_copies),
                      (unsigned long long)(t1.staged_copy_bytes - t0.staged_copy_bytes),
                      (unsigned long long)(t1.async_uploads - t0.async_uploads));
        check_image(&img);
        cdf_image_free(&img);
        if (staging) {
            const uint64_t made = t1.staged_made - t0.staged_made, copies = t1.staged_copies - t0.staged_copies;
            assert_true(made > 0);
            /* staged once, copied at every block call (2 denoising steps: twice as many) */
            assert_true(copies >= 2 * made);
        } else {
            assert_int_equal(t1.staged_copies, t0.staged_copies);
        }
        assert_int_equal(cdf_device_synchronize(g_dev), CDF_OK);
        assert_int_equal(transfers().pending_host_bytes, 0);
        cdf_pipeline_free(p);
        assert_int_equal(transfers().staged, 0); /* released with the weights */
        unsetenv("CDIFFUSERS_HOST_STAGING");
    }
    cdf_pipeline_load_params lp = load_params(CDF_OFFLOAD_MODEL);
    cdf_pipeline *p = NULL;
    assert_int_equal(cdf_pipeline_load(g_pipe, &lp, &p), CDF_OK);
    const cdf_transfer_stats t0 = transfers();
    cdf_image img;
    if (cdf_pipeline_generate(p, &g_gp, &img) != CDF_OK) fail_msg("generate: %s", cdf_last_error());
    const cdf_transfer_stats t1 = transfers();
    print_message("  model offload: %llu asynchronous uploads (%llu bytes)\n", (unsigned long long)(t1.async_uploads - t0.async_uploads),
                  (unsigned long long)(t1.async_upload_bytes - t0.async_upload_bytes));
    check_image(&img);
    cdf_image_free(&img);
    assert_true(t1.async_uploads > t0.async_uploads);
    assert_int_equal(cdf_device_synchronize(g_dev), CDF_OK);
    assert_int_equal(transfers().pending_host_bytes, 0);
    cdf_pipeline_free(p);
}

/* an asynchronous upload that fails: generate's error names it; the device stays usable */
static void test_failed_upload_is_an_error(void **state) {
    (void)state;
    if (!g_dev) skip();
    cdf_pipeline_load_params lp = load_params(CDF_OFFLOAD_MODEL);
    cdf_pipeline *p = NULL;
    assert_int_equal(cdf_pipeline_load(g_pipe, &lp, &p), CDF_OK);
    char f[64];
    snprintf(f, sizeof f, "upload:%llu", (unsigned long long)(transfers().async_uploads + 3));
    setenv("CDIFFUSERS_PJRT_FAULT", f, 1);
    cdf_image img;
    cdf_status s = cdf_pipeline_generate(p, &g_gp, &img);
    unsetenv("CDIFFUSERS_PJRT_FAULT");
    print_message("  %s: %s\n", f, s == CDF_OK ? "(no error)" : cdf_last_error());
    if (s == CDF_OK) cdf_image_free(&img);
    assert_int_equal(s, CDF_ERR_DEVICE);
    assert_non_null(strstr(cdf_last_error(), "asynchronous host-to-device upload"));
    assert_int_equal(cdf_device_synchronize(g_dev), CDF_OK); /* reported once */
    assert_int_equal(transfers().pending_host_bytes, 0);
    if (cdf_pipeline_generate(p, &g_gp, &img) != CDF_OK) fail_msg("generate after the failure: %s", cdf_last_error());
    check_image(&img);
    cdf_image_free(&img);
    cdf_pipeline_free(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_offload_on_pjrt_within_plan),
        cmocka_unit_test(test_budget_below_one_block_refused_before_loading),
        cmocka_unit_test(test_whole_upload_starts_at_once),
        cmocka_unit_test(test_pinned_staging_and_async_uploads),
        cmocka_unit_test(test_failed_upload_is_an_error),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
