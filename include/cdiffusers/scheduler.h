/* cdiffusers — FlowMatchEulerDiscreteScheduler (diffusers 58eb52c), bit for bit.
 *
 * Mirrors diffusers' scheduler object: construct from a scheduler_config.json, call
 * set_timesteps() (the "prepare timesteps" step of FluxPipeline / StableDiffusion3Pipeline /
 * Flux2Pipeline), then step() once per timestep. Every number is computed with the float
 * types diffusers uses (float32 torch/numpy arithmetic, or float64 numpy where the Python does
 * that), so sigmas, timesteps and Euler steps equal diffusers' exactly.
 *
 * Typical FLUX.1 use:
 *   cdf_scheduler_config cfg;
 *   cdf_scheduler_config_from_json("scheduler/scheduler_config.json", &cfg);
 *   cdf_scheduler *s = cdf_scheduler_new(&cfg);
 *   float sig[N];  cdf_scheduler_flux_sigmas(N, sig);
 *   double mu = cdf_scheduler_calculate_shift(seq_len, cfg.base_image_seq_len, cfg.max_image_seq_len,
 *                                   cfg.base_shift, cfg.max_shift);
 *   cdf_scheduler_set_timesteps(s, N, sig, N, &mu);
 *   cdf_scheduler_set_begin_index(s, 0);
 *   for i in 0..N-1: t = cdf_scheduler_timesteps(s)[i]; ...model...;
 *                    cdf_scheduler_step(s, model_out, latents, latents, numel);
 *
 * Not supported (CDF_ERR_UNSUPPORTED): use_karras_sigmas, use_exponential_sigmas,
 * use_beta_sigmas, stochastic_sampling, per-token timesteps, custom `timesteps` lists. */
#ifndef CDIFFUSERS_SCHEDULER_H
#define CDIFFUSERS_SCHEDULER_H

#include <stdint.h>

#include "cdiffusers/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cdf_time_shift_type {
    CDF_TIME_SHIFT_EXPONENTIAL = 0, /* exp(mu) / (exp(mu) + (1/t - 1)) */
    CDF_TIME_SHIFT_LINEAR = 1       /* mu / (mu + (1/t - 1)) */
} cdf_time_shift_type;

/* The fields of FlowMatchEulerDiscreteScheduler's scheduler_config.json (defaults = diffusers'). */
typedef struct cdf_scheduler_config {
    int64_t num_train_timesteps;          /* 1000 */
    double shift;                         /* 1.0 */
    int use_dynamic_shifting;             /* 0 */
    double base_shift;                    /* 0.5  (JSON null keeps the default) */
    double max_shift;                     /* 1.15 (JSON null keeps the default) */
    int64_t base_image_seq_len;           /* 256 */
    int64_t max_image_seq_len;            /* 4096 */
    int invert_sigmas;                    /* 0 */
    int has_shift_terminal;               /* 0: shift_terminal is None */
    double shift_terminal;                /* used when has_shift_terminal and != 0 */
    int use_karras_sigmas;                /* must be 0 (unsupported) */
    int use_exponential_sigmas;           /* must be 0 (unsupported) */
    int use_beta_sigmas;                  /* must be 0 (unsupported) */
    cdf_time_shift_type time_shift_type;  /* exponential */
    int stochastic_sampling;              /* must be 0 (unsupported) */
} cdf_scheduler_config;

typedef struct cdf_scheduler cdf_scheduler;

/* diffusers' defaults. */
cdf_scheduler_config cdf_scheduler_config_default(void);
/* Read a scheduler_config.json: missing keys keep their defaults, unknown keys are ignored,
 * "_class_name" (if present) must be "FlowMatchEulerDiscreteScheduler".
 * CDF_ERR_IO (cannot read), CDF_ERR_LIMIT (file > 1 MiB, num_train_timesteps > 2^20),
 * CDF_ERR_FORMAT (not JSON / a key has the wrong type or an invalid value),
 * CDF_ERR_UNSUPPORTED (another scheduler class, karras/exponential/beta sigmas, stochastic
 * sampling). *out is written only on success. */
cdf_status cdf_scheduler_config_from_json(const char *path, cdf_scheduler_config *out);
/* Check a config the way cdf_scheduler_new does (same errors as above). */
cdf_status cdf_scheduler_config_validate(const cdf_scheduler_config *cfg);

/* A scheduler in diffusers' post-__init__ state: sigmas/timesteps hold the
 * num_train_timesteps training values (no terminal sigma) until set_timesteps is called.
 * NULL on error (invalid/unsupported config, out of memory; see cdf_last_error()). */
cdf_scheduler *cdf_scheduler_new(const cdf_scheduler_config *cfg);
void cdf_scheduler_free(cdf_scheduler *s);
const cdf_scheduler_config *cdf_scheduler_get_config(const cdf_scheduler *s);

/* set_timesteps(num_inference_steps, sigmas=..., mu=...).
 * sigmas == NULL (n_sigmas must be 0): SD3's default schedule, linspace between the training
 *   sigma_max and sigma_min in float64.
 * sigmas != NULL: n_sigmas values (what the pipeline passes, already rounded to float32 — diffusers
 *   casts them to float32 first thing); n_sigmas must equal num_steps.
 * mu (NULL = None) is required when use_dynamic_shifting and ignored otherwise; it is a double
 *   because diffusers evaluates exp(mu) on the Python float.
 * Afterwards: num_steps timesteps, num_steps + 1 sigmas (terminal 0, or 1 with invert_sigmas),
 * step index and begin index reset.
 * Errors: num_steps <= 0 or > 1000000, sigmas/n_sigmas mismatch (CDF_ERR_INVALID_ARG),
 * dynamic shifting without mu (CDF_ERR_INVALID_ARG), out of memory. */
cdf_status cdf_scheduler_set_timesteps(cdf_scheduler *s, int num_steps, const float *sigmas, int n_sigmas,
                                       const double *mu);

int64_t cdf_scheduler_num_timesteps(const cdf_scheduler *s);
const float *cdf_scheduler_timesteps(const cdf_scheduler *s);
int64_t cdf_scheduler_num_sigmas(const cdf_scheduler *s);
const float *cdf_scheduler_sigmas(const cdf_scheduler *s);

/* Flux and Flux2 pipelines call set_begin_index(0) before the loop; SD3 does not (then the
 * first step looks its timestep up, see cdf_scheduler_step_timestep). */
cdf_status cdf_scheduler_set_begin_index(cdf_scheduler *s, int64_t begin_index);
/* -1 stands for diffusers' None. */
int64_t cdf_scheduler_begin_index(const cdf_scheduler *s);
int64_t cdf_scheduler_step_index(const cdf_scheduler *s);
/* set_shift(): the shift used by later set_timesteps calls without dynamic shifting. */
void cdf_scheduler_set_shift(cdf_scheduler *s, double shift);
double cdf_scheduler_shift(const cdf_scheduler *s);

/* One Euler step over n float32 elements: prev = sample + (sigma[i+1] - sigma[i]) * model_output,
 * then the step index advances. prev_sample may alias sample or model_output.
 * If no step was taken yet, i = begin_index when set, else the index diffusers' lookup gives for
 * the first timestep (timesteps[0]; the second match if it occurs twice).
 * Errors: NULL pointers, n < 0, stepping past the last sigma. */
cdf_status cdf_scheduler_step(cdf_scheduler *s, const float *model_output, const float *sample, float *prev_sample,
                              int64_t n);
/* step(model_output, timestep, sample) exactly as diffusers: when the step index is not set and
 * no begin index was given, the index is looked up from `timestep` (CDF_ERR_NOT_FOUND if it is
 * not one of the scheduler's timesteps); otherwise `timestep` is ignored, as in diffusers. */
cdf_status cdf_scheduler_step_timestep(cdf_scheduler *s, float timestep, const float *model_output,
                                       const float *sample, float *prev_sample, int64_t n);

/* ---- pipeline helpers -------------------------------------------------------------------- */

/* FluxPipeline's calculate_shift (float64, as the Python): the dynamic-shifting mu for an image
 * of image_seq_len latent tokens. NaN if max_seq == base_seq (Python would raise). */
double cdf_scheduler_calculate_shift(int64_t image_seq_len, int64_t base_seq, int64_t max_seq, double base_shift,
                           double max_shift);
/* Flux2Pipeline's compute_empirical_mu(image_seq_len, num_steps). */
double cdf_scheduler_empirical_mu(int64_t image_seq_len, int num_steps);
/* numpy.linspace(start, stop, n) in float64, reproducing numpy's rounding exactly
 * (i * step + start, last element = stop). CDF_ERR_INVALID_ARG for n < 0 or NULL out. */
cdf_status cdf_scheduler_linspace(double start, double stop, int64_t n, double *out);
/* The Flux/Flux2 pipelines' default sigmas: np.linspace(1.0, 1/n, n) in float64, rounded to
 * float32 as set_timesteps does. CDF_ERR_INVALID_ARG for n <= 0 or NULL out. */
cdf_status cdf_scheduler_flux_sigmas(int n, float *out);

#ifdef __cplusplus
}
#endif
#endif
