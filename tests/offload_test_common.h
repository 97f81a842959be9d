/* Helpers shared by the offload tests (test_offload.c, test_offload_sequential.c): the random
 * FLUX.1- and SD3.5-architecture pipelines they write with tools/make-random-pipeline, the
 * device's current bytes, and a generate under a budget applied to one phase only.
 * Header-only (static functions; make_random_pipeline.c is compiled into the including test). */
#ifndef CDF_OFFLOAD_TEST_COMMON_H
#define CDF_OFFLOAD_TEST_COMMON_H

#include <stdio.h>
#include <string.h>

#include "cdiffusers/cdiffusers.h"
#include "pipelines/pipeline_impl.h"
#include "testutil.h"

#define MRP_NO_MAIN
#include "../tools/make-random-pipeline/make_random_pipeline.c"

/* preset + the "key=value" settings over it (fails the test on a bad one) */
static void ot_spec(mrp_spec *s, const char *preset, const char *const *sets, size_t n_sets) {
    s->tokenizers = tu_data("tokenizers");
    assert_int_equal(mrp_preset(preset, s), 0);
    for (size_t i = 0; i < n_sets; i++) assert_int_equal(mrp_set(s, sets[i]), 0);
}

/* FLUX.1 architecture: the transformer (7 MB, 2 double- and 2 single-stream blocks) the largest
 * model, the VAE 0.3 MB. */
static const char *const ot_flux_sets[] = {
    "clip_l.hidden=16", "clip_l.intermediate=64", "clip_l.layers=2", "t5.d_model=32",        "t5.d_kv=16", "t5.heads=2",
    "t5.d_ff=64",       "flux.heads=4",           "flux.head_dim=32", "flux.layers=2", "flux.single_layers=2", "seed=7"};

/* SD3.5 architecture (dual attention, qk norm): the text encoders' settings; each test adds its
 * transformer's (sd3.*) and the seed. */
static const char *const ot_sd3_text_sets[] = {"clip_l.hidden=16", "clip_l.projection=16", "clip_l.intermediate=64",
                                               "clip_g.hidden=24", "clip_g.projection=24", "clip_g.intermediate=96",
                                               "t5.d_model=48",    "t5.d_kv=24",           "t5.heads=2",
                                               "t5.d_ff=96"};

/* Writes the FLUX.1 pipeline to <tmp>/<flux_name> (path in flux_out) and the SD3.5 one, with
 * sd3_sets after the text encoders' settings, to <tmp>/<sd3_name> (sd3_out); -1 on failure. */
static int ot_write_pipelines(const char *flux_name, char *flux_out, size_t flux_cap, const char *sd3_name,
                              char *sd3_out, size_t sd3_cap, const char *const *sd3_sets, size_t n_sd3_sets) {
    mrp_spec s;
    snprintf(flux_out, flux_cap, "%s/%s", tu_tmpdir(), flux_name);
    snprintf(sd3_out, sd3_cap, "%s/%s", tu_tmpdir(), sd3_name);
    ot_spec(&s, "tiny-flux", ot_flux_sets, sizeof ot_flux_sets / sizeof *ot_flux_sets);
    if (mrp_write_pipeline(&s, flux_out)) {
        fprintf(stderr, "make-random-pipeline: %s\n", mrp_last_error());
        return -1;
    }
    ot_spec(&s, "tiny-sd3", ot_sd3_text_sets, sizeof ot_sd3_text_sets / sizeof *ot_sd3_text_sets);
    for (size_t i = 0; i < n_sd3_sets; i++) assert_int_equal(mrp_set(&s, sd3_sets[i]), 0);
    if (mrp_write_pipeline(&s, sd3_out)) {
        fprintf(stderr, "make-random-pipeline: %s\n", mrp_last_error());
        return -1;
    }
    return 0;
}

static cdf_device *dev(void) { return tu_cpu(); }

/* The device's bytes in use once its queue is done. */
static uint64_t current_bytes(void) {
    assert_int_equal(cdf_device_synchronize(dev()), CDF_OK);
    cdf_memory_stats st;
    cdf_device_memory_stats(dev(), &st);
    return st.current_bytes;
}

/* generate with a device budget of `limit` bytes during phase ph only: true when it ran, false
 * when it ran out of memory (any other failure fails the test). */
static bool generate_with_phase_budget(cdf_pipeline *p, const cdf_generate_params *gp, int ph, uint64_t limit) {
    p->phase_limit_active = true;
    memset(p->phase_limit, 0, sizeof p->phase_limit);
    p->phase_limit[ph] = limit;
    cdf_image img;
    cdf_status s = cdf_pipeline_generate(p, gp, &img);
    p->phase_limit_active = false;
    if (s == CDF_OK) cdf_image_free(&img);
    else if (s != CDF_ERR_OUT_OF_MEMORY) print_message("unexpected failure: %s\n", cdf_last_error());
    assert_true(s == CDF_OK || s == CDF_ERR_OUT_OF_MEMORY);
    return s == CDF_OK;
}

#endif
