/* Step caches (docs/step-caches.md): diffusers' First Block Cache and MagCache for the FLUX.1
 * transformer, one decision per transformer call (FBC: one scalar read; MagCache: host
 * arithmetic only), one state per cache context (the positive pass "cond", true CFG's negative
 * pass "uncond"), fresh for every generation. */
#ifndef CDF_PIPELINES_STEP_CACHE_H
#define CDF_PIPELINES_STEP_CACHE_H

#include <stdbool.h>

#include "cdiffusers/pipeline.h"
#include "models/component.h"

typedef enum cdf_step_cache_kind {
    CDF_STEP_CACHE_NONE = 0,
    CDF_STEP_CACHE_FIRST_BLOCK = 1,
    CDF_STEP_CACHE_MAG = 2,
    CDF_STEP_CACHE_TAYLORSEER = 3,
} cdf_step_cache_kind;

#define CDF_STEP_CACHE_MAX_RATIOS 1000 /* mag_ratios given: at most this many (the step limit) */

typedef struct cdf_step_cache_config {
    cdf_step_cache_kind kind;
    double threshold; /* FirstBlockCacheConfig.threshold / MagCacheConfig.threshold */
    /* MagCacheConfig (mag_ratios: the given ones, else diffusers' FLUX_MAG_RATIOS; interpolated to
     * num_inference_steps) */
    int max_skip_steps;
    double retention_ratio;
    int num_inference_steps; /* 0 = the request's step count */
    int n_mag_ratios;        /* 0: FLUX_MAG_RATIOS */
    float mag_ratios[CDF_STEP_CACHE_MAX_RATIOS]; /* as torch.tensor(list): float32 */
    bool calibrate; /* never skip; measure the ratios and print them as diffusers does */
    /* TaylorSeerCacheConfig (the default attention-module patterns) */
    int cache_interval, disable_cache_before_step;
    int disable_cache_after_step; /* -1 = None */
    int max_order;
    cdf_dtype taylor_factors_dtype; /* CDF_BF16 (torch.bfloat16), CDF_F16 or CDF_F32 */
    /* use_lite_mode: diffusers' _PROJ_OUT_IDENTIFIERS active (the transformer's output predicted),
     * _BLOCK_IDENTIFIERS inactive (the blocks return zeros on a predicted step: nothing runs) */
    bool use_lite_mode;
} cdf_step_cache_config;

/* The --cache / params.cache string: NULL, "" or "none" = off; "first-block" (threshold 0.05,
 * diffusers' default) or "first-block:T" (T a finite number >= 0); "mag" or
 * "mag:key=value,..." with MagCacheConfig's fields threshold (0.06), max_skip_steps (3),
 * retention_ratio (0.2), num_inference_steps (the request's), mag_ratios ([r0, r1, ...]: a
 * Python list of finite numbers, spaces allowed; FLUX_MAG_RATIOS), calibrate (False; True); "taylorseer" or
 * "taylorseer:key=value,..." with TaylorSeerCacheConfig's cache_interval (5),
 * disable_cache_before_step (3), disable_cache_after_step (None), max_order (1),
 * taylor_factors_dtype (bfloat16; float16, float32), use_lite_mode (False; True). Anything else is
 * CDF_ERR_INVALID_ARG (CDF_ERR_UNSUPPORTED for what is not implemented) naming the string and
 * what is accepted. */
cdf_status cdf_step_cache_parse(const char *spec, cdf_step_cache_config *cfg);

/* The error for TaylorSeer on FLUX.2 (one %s: the cache string): diffusers 0.42.1 cannot run it
 * there (tools/make-step-cache-golden: check_flux2_taylorseer_fails). */
#define CDF_STEP_CACHE_TAYLORSEER_FLUX2_REFUSAL                                                                                \
    "cache '%s': TaylorSeer does not run on FLUX.2: diffusers 0.42.1 fails there (Flux2Pipeline sets no cache context and "   \
    "TaylorSeer's hooks set none: 'ValueError: No cache context is set'), so cdiffusers has no reference to follow "          \
    "(FLUX.2: --cache mag; docs/step-caches.md)"

#define CDF_STEP_CACHE_PASSES 2 /* cache contexts: 0 "cond", 1 "uncond" */

typedef struct cdf_step_cache {
    cdf_step_cache_config cfg;
    float *mag_ratios; /* MagCache: FLUX_MAG_RATIOS at cfg.num_inference_steps (float32, as torch) */
    struct cdf_step_cache_pass {
        /* FBC: the head residual of the last computed call; MagCache: its residual over every
         * block (tail output - embedded latents) (owned) */
        cdf_tensor *prev_residual;
        cdf_tensor *tail_residual; /* FBC: image-stream tail residual of the last computed call (owned) */
        float acc_ratio, acc_err; /* MagCache's accumulators (float32 0-dim tensors in diffusers) */
        int acc_steps, step_index;
        /* TaylorSeer: per attention module its factors [orders] (taylor_factors_dtype, owned),
         * the last step that updated them (-1: none) */
        int n_modules, *n_orders, last_update_step;
        cdf_tensor **factors; /* [n_modules * (max_order + 1)] */
        /* MagCache's calibration: the ratios of the steps so far, the last completed list (owned) */
        double *calib, *calib_done;
        int n_calib, n_calib_done;
        int calls, cap;
        float *change;  /* per call: FBC the relative change, MagCache the accumulated error (NaN: none) */
        bool *computed; /* per call: the whole transformer ran */
    } pass[CDF_STEP_CACHE_PASSES];
} cdf_step_cache;

/* *sc = a fresh state for cfg (kind NONE: the pipeline runs the plain forward); num_steps: the
 * request's step count (MagCache's default num_inference_steps). */
cdf_status cdf_step_cache_init(cdf_step_cache *sc, const cdf_step_cache_config *cfg, int num_steps);
/* One transformer call of pass `pass` with forward's inputs `in`: head, the decision, then the
 * tail or the cached skip. *sample is recorded in the current scope. */
cdf_status cdf_step_cache_predict(cdf_step_cache *sc, cdf_component *transformer, int pass, const cdf_tensor_map *in,
                                  cdf_tensor **sample);
/* After a generation: the decisions under the capture keys cache_computed.<context> and
 * cache_change.<context> (f32 [calls]), MagCache's calibrated ratios under cache_calibration.<context>
 * (f32, the last completed list), the report text of image p->image_index (cdf_pipeline_cache_report),
 * and the state released. */
void cdf_step_cache_finish(cdf_step_cache *sc, cdf_pipeline *p, const cdf_generate_params *gp);

#endif
