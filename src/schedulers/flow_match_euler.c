/* FlowMatchEulerDiscreteScheduler (diffusers 58eb52c,
 * src/diffusers/schedulers/scheduling_flow_match_euler_discrete.py), reproduced bit for bit.
 *
 * The Python mixes three kinds of arithmetic and we follow each one exactly:
 *  - torch float32 tensors (training sigmas in __init__, timesteps = sigmas * T, step()):
 *    every operation rounded to float32, python scalars converted to float32 first;
 *  - numpy float32 arrays (sigmas passed in by Flux/Flux2): the same float32 rules (numpy 1.x
 *    value-based casting keeps python scalars from promoting the array);
 *  - numpy float64 (SD3's default schedule from np.linspace): double arithmetic, then a
 *    single rounding to float32.
 * Each float32 operation is written as its own statement/cast, and the file is compiled
 * without FMA contraction, so no compiler flag can change a result. */
#include "core/exact_fp.h" /* first: no FMA contraction, no -ffast-math */
#include <float.h>
#if defined(FLT_EVAL_METHOD) && FLT_EVAL_METHOD != 0
#error "src/schedulers needs float arithmetic evaluated in float (FLT_EVAL_METHOD == 0)"
#endif

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdiffusers/scheduler.h"
#include "core/error_internal.h"

#define MAX_CONFIG_BYTES (1 << 20)
#define MAX_TRAIN_TIMESTEPS (1 << 20)
#define MAX_INFERENCE_STEPS 1000000

struct cdf_scheduler {
    cdf_scheduler_config cfg;
    double shift;          /* self._shift (set_shift can change it) */
    double sigma_min;      /* python floats of the float32 training sigmas */
    double sigma_max;
    float *sigmas;         /* n_sigmas values */
    int64_t n_sigmas;
    float *timesteps;      /* n_timesteps values */
    int64_t n_timesteps;
    int64_t step_index;    /* -1 = None */
    int64_t begin_index;   /* -1 = None */
};

/* ---- config ------------------------------------------------------------------------------ */

cdf_scheduler_config cdf_scheduler_config_default(void) {
    cdf_scheduler_config c;
    memset(&c, 0, sizeof c);
    c.num_train_timesteps = 1000;
    c.shift = 1.0;
    c.use_dynamic_shifting = 0;
    c.base_shift = 0.5;
    c.max_shift = 1.15;
    c.base_image_seq_len = 256;
    c.max_image_seq_len = 4096;
    c.invert_sigmas = 0;
    c.has_shift_terminal = 0;
    c.shift_terminal = 0.0;
    c.time_shift_type = CDF_TIME_SHIFT_EXPONENTIAL;
    return c;
}

cdf_status cdf_scheduler_config_validate(const cdf_scheduler_config *c) {
    if (!c) return cdf_error(CDF_ERR_INVALID_ARG, "scheduler config is NULL");
    if (c->num_train_timesteps < 1)
        return cdf_error(CDF_ERR_INVALID_ARG, "scheduler config: num_train_timesteps must be >= 1, got %lld", (long long)c->num_train_timesteps);
    if (c->num_train_timesteps > MAX_TRAIN_TIMESTEPS)
        return cdf_error(CDF_ERR_LIMIT, "scheduler config: num_train_timesteps %lld exceeds the limit %d", (long long)c->num_train_timesteps, MAX_TRAIN_TIMESTEPS);
    if (!isfinite(c->shift)) return cdf_error(CDF_ERR_INVALID_ARG, "scheduler config: shift is not finite");
    /* shift * s / (1 + (shift - 1) * s) over s in (0, 1]: 0 makes the first sigma 0/0, a negative
     * shift divides by zero inside the range or turns sigmas negative. diffusers computes NaNs. */
    if (!(c->shift > 0.0))
        return cdf_error(CDF_ERR_INVALID_ARG, "scheduler config: shift must be > 0, got %g (it would make NaN or negative sigmas)",
                         c->shift);
    if (c->time_shift_type != CDF_TIME_SHIFT_EXPONENTIAL && c->time_shift_type != CDF_TIME_SHIFT_LINEAR)
        return cdf_error(CDF_ERR_INVALID_ARG, "scheduler config: time_shift_type must be exponential or linear (got %d)", (int)c->time_shift_type);
    if (c->has_shift_terminal && !isfinite(c->shift_terminal))
        return cdf_error(CDF_ERR_INVALID_ARG, "scheduler config: shift_terminal is not finite");
    if (c->has_shift_terminal && c->shift_terminal == 1.0)
        return cdf_error(CDF_ERR_INVALID_ARG, "scheduler config: shift_terminal 1.0 divides by zero (1 - shift_terminal)");
    if (c->use_karras_sigmas) return cdf_error(CDF_ERR_UNSUPPORTED, "scheduler config: use_karras_sigmas=true is unsupported");
    if (c->use_exponential_sigmas) return cdf_error(CDF_ERR_UNSUPPORTED, "scheduler config: use_exponential_sigmas=true is unsupported");
    if (c->use_beta_sigmas) return cdf_error(CDF_ERR_UNSUPPORTED, "scheduler config: use_beta_sigmas=true is unsupported");
    if (c->stochastic_sampling) return cdf_error(CDF_ERR_UNSUPPORTED, "scheduler config: stochastic_sampling=true is unsupported");
    return CDF_OK;
}

static char *read_small_file(const char *path, size_t limit, size_t *len_out) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        cdf_error(CDF_ERR_IO, "cannot open scheduler config %s: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = malloc(limit + 1);
    if (!buf) {
        fclose(f);
        cdf_error(CDF_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes to read %s", limit + 1, path);
        return NULL;
    }
    size_t n = fread(buf, 1, limit + 1, f);
    int err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        cdf_error(CDF_ERR_IO, "cannot read scheduler config %s", path);
        return NULL;
    }
    if (n > limit) {
        free(buf);
        cdf_error(CDF_ERR_LIMIT, "scheduler config %s is larger than the %zu-byte limit", path, limit);
        return NULL;
    }
    buf[n] = 0;
    *len_out = n;
    return buf;
}

/* JSON field readers: absent key -> keep *out; wrong type -> CDF_ERR_FORMAT naming file and key. */
static cdf_status json_bool(const cJSON *root, const char *key, const char *path, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v) return CDF_OK;
    if (!cJSON_IsBool(v)) return cdf_error(CDF_ERR_FORMAT, "scheduler config %s: \"%s\" must be true or false", path, key);
    *out = cJSON_IsTrue(v) ? 1 : 0;
    return CDF_OK;
}

static cdf_status json_double(const cJSON *root, const char *key, const char *path, double *out, int allow_null, int *is_null) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (is_null) *is_null = 0;
    if (!v) return CDF_OK;
    if (cJSON_IsNull(v) && allow_null) {
        if (is_null) *is_null = 1;
        return CDF_OK;
    }
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return cdf_error(CDF_ERR_FORMAT, "scheduler config %s: \"%s\" must be a finite number%s", path, key, allow_null ? " or null" : "");
    *out = v->valuedouble;
    return CDF_OK;
}

static cdf_status json_int(const cJSON *root, const char *key, const char *path, int64_t *out, int64_t lo, int64_t hi) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v) return CDF_OK;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
        return cdf_error(CDF_ERR_FORMAT, "scheduler config %s: \"%s\" must be an integer", path, key);
    if (v->valuedouble < (double)lo || v->valuedouble > (double)hi)
        return cdf_error(v->valuedouble > (double)hi ? CDF_ERR_LIMIT : CDF_ERR_FORMAT,
                         "scheduler config %s: \"%s\" = %.17g is outside [%lld, %lld]", path, key, v->valuedouble, (long long)lo, (long long)hi);
    *out = (int64_t)v->valuedouble;
    return CDF_OK;
}

static cdf_status parse_config(const cJSON *root, const char *path, cdf_scheduler_config *c) {
    if (!cJSON_IsObject(root)) return cdf_error(CDF_ERR_FORMAT, "scheduler config %s: top level is not a JSON object", path);
    const cJSON *cls = cJSON_GetObjectItemCaseSensitive(root, "_class_name");
    if (cls) {
        if (!cJSON_IsString(cls)) return cdf_error(CDF_ERR_FORMAT, "scheduler config %s: \"_class_name\" must be a string", path);
        if (strcmp(cls->valuestring, "FlowMatchEulerDiscreteScheduler") != 0)
            return cdf_error(CDF_ERR_UNSUPPORTED, "scheduler config %s: scheduler class \"%.200s\" is unsupported (only FlowMatchEulerDiscreteScheduler)", path, cls->valuestring);
    }
    int is_null = 0;
    CDF_TRY(json_int(root, "num_train_timesteps", path, &c->num_train_timesteps, 1, MAX_TRAIN_TIMESTEPS));
    CDF_TRY(json_double(root, "shift", path, &c->shift, 0, NULL));
    CDF_TRY(json_bool(root, "use_dynamic_shifting", path, &c->use_dynamic_shifting));
    CDF_TRY(json_double(root, "base_shift", path, &c->base_shift, 1, NULL));
    CDF_TRY(json_double(root, "max_shift", path, &c->max_shift, 1, NULL));
    CDF_TRY(json_int(root, "base_image_seq_len", path, &c->base_image_seq_len, 0, INT64_C(1) << 40));
    CDF_TRY(json_int(root, "max_image_seq_len", path, &c->max_image_seq_len, 0, INT64_C(1) << 40));
    CDF_TRY(json_bool(root, "invert_sigmas", path, &c->invert_sigmas));
    double st = c->shift_terminal;
    CDF_TRY(json_double(root, "shift_terminal", path, &st, 1, &is_null));
    if (cJSON_GetObjectItemCaseSensitive(root, "shift_terminal") && !is_null) {
        c->has_shift_terminal = 1;
        c->shift_terminal = st;
    } else if (is_null) {
        c->has_shift_terminal = 0;
    }
    CDF_TRY(json_bool(root, "use_karras_sigmas", path, &c->use_karras_sigmas));
    CDF_TRY(json_bool(root, "use_exponential_sigmas", path, &c->use_exponential_sigmas));
    CDF_TRY(json_bool(root, "use_beta_sigmas", path, &c->use_beta_sigmas));
    CDF_TRY(json_bool(root, "stochastic_sampling", path, &c->stochastic_sampling));
    const cJSON *tst = cJSON_GetObjectItemCaseSensitive(root, "time_shift_type");
    if (tst) {
        if (!cJSON_IsString(tst)) return cdf_error(CDF_ERR_FORMAT, "scheduler config %s: \"time_shift_type\" must be a string", path);
        if (strcmp(tst->valuestring, "exponential") == 0)
            c->time_shift_type = CDF_TIME_SHIFT_EXPONENTIAL;
        else if (strcmp(tst->valuestring, "linear") == 0)
            c->time_shift_type = CDF_TIME_SHIFT_LINEAR;
        else
            return cdf_error(CDF_ERR_FORMAT, "scheduler config %s: \"time_shift_type\" must be \"exponential\" or \"linear\", got \"%.100s\"", path, tst->valuestring);
    }
    cdf_status st2 = cdf_scheduler_config_validate(c);
    if (st2 != CDF_OK) return cdf_error_prefix("%s: ", path);
    return CDF_OK;
}

cdf_status cdf_scheduler_config_from_json(const char *path, cdf_scheduler_config *out) {
    if (!path || !out) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_scheduler_config_from_json: %s is NULL", !path ? "path" : "out");
    size_t len = 0;
    char *txt = read_small_file(path, MAX_CONFIG_BYTES, &len);
    if (!txt) return cdf_last_status();
    cJSON *root = cJSON_ParseWithLength(txt, len);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        long off = (at && at >= txt && at <= txt + len) ? (long)(at - txt) : -1;
        free(txt);
        return cdf_error(CDF_ERR_FORMAT, "scheduler config %s is not valid JSON (error near byte %ld)", path, off);
    }
    cdf_scheduler_config c = cdf_scheduler_config_default();
    cdf_status st = parse_config(root, path, &c);
    cJSON_Delete(root);
    free(txt);
    if (st == CDF_OK) *out = c;
    return st;
}

/* ---- numpy helpers ----------------------------------------------------------------------- */

cdf_status cdf_scheduler_linspace(double start, double stop, int64_t n, double *out) {
    if (n < 0) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_scheduler_linspace: negative count %lld", (long long)n);
    if (n > 0 && !out) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_scheduler_linspace: output is NULL");
    if (n == 0) return CDF_OK;
    const double delta = stop - start;
    if (n == 1) {
        out[0] = 0.0 * delta + start; /* numpy: arange(1) * delta + start */
        return CDF_OK;
    }
    const double div = (double)(n - 1);
    const double step = delta / div;
    for (int64_t i = 0; i < n; i++) {
        double y;
        if (step == 0.0) {
            y = (double)i / div; /* numpy's denormal-step branch: y /= div; y *= delta */
            y = y * delta;
        } else {
            y = (double)i * step;
        }
        out[i] = y + start;
    }
    out[n - 1] = stop;
    return CDF_OK;
}

cdf_status cdf_scheduler_flux_sigmas(int n, float *out) {
    if (n <= 0) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_scheduler_flux_sigmas: number of steps must be >= 1, got %d", n);
    if (n > MAX_INFERENCE_STEPS) return cdf_error(CDF_ERR_LIMIT, "cdf_scheduler_flux_sigmas: %d steps exceed the limit %d", n, MAX_INFERENCE_STEPS);
    if (!out) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_scheduler_flux_sigmas: output is NULL");
    double *tmp = malloc((size_t)n * sizeof(double));
    if (!tmp) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "cdf_scheduler_flux_sigmas: cannot allocate %d doubles", n);
    cdf_scheduler_linspace(1.0, 1.0 / (double)n, n, tmp);
    for (int i = 0; i < n; i++) out[i] = (float)tmp[i];
    free(tmp);
    return CDF_OK;
}

double cdf_scheduler_calculate_shift(int64_t image_seq_len, int64_t base_seq, int64_t max_seq, double base_shift, double max_shift) {
    if (max_seq == base_seq) return NAN;
    const double m = (max_shift - base_shift) / (double)(max_seq - base_seq);
    const double mb = m * (double)base_seq;
    const double b = base_shift - mb;
    const double ms = (double)image_seq_len * m;
    return ms + b;
}

double cdf_scheduler_empirical_mu(int64_t image_seq_len, int num_steps) {
    const double a1 = 8.73809524e-05, b1 = 1.89833333;
    const double a2 = 0.00016927, b2 = 0.45666666;
    const double seq = (double)image_seq_len;
    if (image_seq_len > 4300) {
        const double p = a2 * seq;
        return p + b2;
    }
    const double p200 = a2 * seq;
    const double m_200 = p200 + b2;
    const double p10 = a1 * seq;
    const double m_10 = p10 + b1;
    const double a = (m_200 - m_10) / 190.0;
    const double a200 = 200.0 * a;
    const double b = m_200 - a200;
    const double an = a * (double)num_steps;
    return an + b;
}

/* ---- scheduler --------------------------------------------------------------------------- */

/* shift * s / (1 + (shift - 1) * s) on float32 values, as torch/numpy evaluate it with python
 * float scalars: the scalars are rounded to float32, every operation is rounded to float32. */
static float shift_f32(double shift, float s) {
    const float shift_f = (float)shift;
    const float shift_m1 = (float)(shift - 1.0);
    const float num = shift_f * s;
    const float t = shift_m1 * s;
    const float den = 1.0f + t;
    return num / den;
}

static double shift_f64(double shift, double s) {
    const double num = shift * s;
    const double t = (shift - 1.0) * s;
    const double den = 1.0 + t;
    return num / den;
}

cdf_scheduler *cdf_scheduler_new(const cdf_scheduler_config *cfg) {
    if (cdf_scheduler_config_validate(cfg) != CDF_OK) return NULL;
    cdf_scheduler *s = calloc(1, sizeof *s);
    const int64_t T = cfg->num_train_timesteps;
    if (s) {
        s->sigmas = malloc((size_t)T * sizeof(float));
        s->timesteps = malloc((size_t)T * sizeof(float));
    }
    if (!s || !s->sigmas || !s->timesteps) {
        cdf_scheduler_free(s);
        cdf_error(CDF_ERR_OUT_OF_MEMORY, "cdf_scheduler_new: cannot allocate %lld training sigmas", (long long)T);
        return NULL;
    }
    s->cfg = *cfg;
    s->shift = cfg->shift;
    s->step_index = -1;
    s->begin_index = -1;
    /* np.linspace(1, T, T, float32)[::-1] is T, T-1, ..., 1 exactly; torch then divides by T
     * in float32 and, without dynamic shifting, applies the static shift in float32. */
    const float Tf = (float)T;
    for (int64_t i = 0; i < T; i++) {
        const float t = (float)(T - i);
        float sig = t / Tf;
        if (!cfg->use_dynamic_shifting) sig = shift_f32(cfg->shift, sig);
        s->sigmas[i] = sig;
        s->timesteps[i] = sig * Tf;
    }
    s->n_sigmas = T;
    s->n_timesteps = T;
    s->sigma_max = (double)s->sigmas[0];
    s->sigma_min = (double)s->sigmas[T - 1];
    return s;
}

void cdf_scheduler_free(cdf_scheduler *s) {
    if (!s) return;
    free(s->sigmas);
    free(s->timesteps);
    free(s);
}

const cdf_scheduler_config *cdf_scheduler_get_config(const cdf_scheduler *s) { return s ? &s->cfg : NULL; }

/* Dynamic time shift on float32 values (numpy float32 array, python float mu). */
static float time_shift_f32(const cdf_scheduler_config *c, double mu, float t) {
    const float m = c->time_shift_type == CDF_TIME_SHIFT_EXPONENTIAL ? (float)exp(mu) : (float)mu;
    const float inv = 1.0f / t;
    const float r = inv - 1.0f; /* ** 1.0 is exact */
    const float den = m + r;
    return m / den;
}

static double time_shift_f64(const cdf_scheduler_config *c, double mu, double t) {
    const double m = c->time_shift_type == CDF_TIME_SHIFT_EXPONENTIAL ? exp(mu) : mu;
    const double inv = 1.0 / t;
    const double r = inv - 1.0;
    const double den = m + r;
    return m / den;
}

cdf_status cdf_scheduler_set_timesteps(cdf_scheduler *s, int num_steps, const float *sigmas, int n_sigmas, const double *mu) {
    const char *fn = "cdf_scheduler_set_timesteps";
    if (!s) return cdf_error(CDF_ERR_INVALID_ARG, "%s: scheduler is NULL", fn);
    const cdf_scheduler_config *c = &s->cfg;
    if (num_steps <= 0) return cdf_error(CDF_ERR_INVALID_ARG, "%s: num_inference_steps must be >= 1, got %d", fn, num_steps);
    if (num_steps > MAX_INFERENCE_STEPS) return cdf_error(CDF_ERR_LIMIT, "%s: %d inference steps exceed the limit %d", fn, num_steps, MAX_INFERENCE_STEPS);
    if (!sigmas && n_sigmas != 0) return cdf_error(CDF_ERR_INVALID_ARG, "%s: n_sigmas is %d but sigmas is NULL", fn, n_sigmas);
    if (sigmas && n_sigmas != num_steps)
        return cdf_error(CDF_ERR_INVALID_ARG, "%s: %d sigmas given for %d inference steps (they must have the same length)", fn, n_sigmas, num_steps);
    if (c->use_dynamic_shifting && !mu)
        return cdf_error(CDF_ERR_INVALID_ARG, "%s: mu must be passed when use_dynamic_shifting is true", fn);
    if (mu && c->use_dynamic_shifting && !isfinite(*mu)) return cdf_error(CDF_ERR_INVALID_ARG, "%s: mu is not finite", fn);
    if (!c->use_dynamic_shifting && !(s->shift > 0.0))
        return cdf_error(CDF_ERR_INVALID_ARG, "%s: shift must be > 0, got %g (set_shift)", fn, s->shift);

    const int64_t N = num_steps;
    float *sig = malloc((size_t)(N + 1) * sizeof(float));
    float *ts = malloc((size_t)N * sizeof(float));
    double *work = sigmas ? NULL : malloc((size_t)N * sizeof(double));
    if (!sig || !ts || (!sigmas && !work)) {
        free(sig);
        free(ts);
        free(work);
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "%s: cannot allocate %lld sigmas", fn, (long long)N);
    }
    const int stretch = c->has_shift_terminal && c->shift_terminal != 0.0; /* `if shift_terminal:` */

    if (!sigmas) {
        /* float64 numpy: timesteps = linspace(sigma_max*T, sigma_min*T, N); sigmas = timesteps / T */
        const double T = (double)c->num_train_timesteps;
        cdf_scheduler_linspace(s->sigma_max * T, s->sigma_min * T, N, work);
        for (int64_t i = 0; i < N; i++) {
            double v = work[i] / T;
            v = c->use_dynamic_shifting ? time_shift_f64(c, *mu, v) : shift_f64(s->shift, v);
            work[i] = v;
        }
        if (stretch) {
            const double scale = (1.0 - work[N - 1]) / (1.0 - c->shift_terminal);
            for (int64_t i = 0; i < N; i++) {
                const double omz = 1.0 - work[i];
                work[i] = 1.0 - omz / scale;
            }
        }
        for (int64_t i = 0; i < N; i++) sig[i] = (float)work[i];
    } else {
        /* np.array(sigmas).astype(float32), then float32 numpy arithmetic */
        for (int64_t i = 0; i < N; i++) {
            const float v = sigmas[i];
            sig[i] = c->use_dynamic_shifting ? time_shift_f32(c, *mu, v) : shift_f32(s->shift, v);
        }
        if (stretch) {
            /* one_minus_z[-1] / (1 - shift_terminal) is a numpy float32 scalar over a python float:
             * float64 in numpy 1.x; dividing the float32 array by it rounds it to float32. */
            const float omz_last = 1.0f - sig[N - 1];
            const float scale = (float)((double)omz_last / (1.0 - c->shift_terminal));
            for (int64_t i = 0; i < N; i++) {
                const float omz = 1.0f - sig[i];
                const float q = omz / scale;
                sig[i] = 1.0f - q;
            }
        }
    }
    free(work);
    /* what the checks above cannot rule out (a linear time shift whose mu cancels 1/t - 1, a
     * stretch of a degenerate schedule): a sigma that is not a number is refused, not stepped */
    for (int64_t i = 0; i < N; i++)
        if (!isfinite(sig[i])) {
            const float bad = sig[i];
            free(sig);
            free(ts);
            return cdf_error(CDF_ERR_INVALID_ARG, "%s: the schedule's sigma %lld of %lld is %g (shift %g, mu %g)", fn, (long long)i,
                             (long long)N, (double)bad, s->shift, mu ? *mu : 0.0);
        }

    /* torch float32: timesteps = sigmas * T; optional inversion; terminal sigma appended. */
    const float Tf = (float)c->num_train_timesteps;
    if (c->invert_sigmas) {
        for (int64_t i = 0; i < N; i++) sig[i] = 1.0f - sig[i];
    }
    for (int64_t i = 0; i < N; i++) ts[i] = sig[i] * Tf;
    sig[N] = c->invert_sigmas ? 1.0f : 0.0f;

    free(s->sigmas);
    free(s->timesteps);
    s->sigmas = sig;
    s->n_sigmas = N + 1;
    s->timesteps = ts;
    s->n_timesteps = N;
    s->step_index = -1;
    s->begin_index = -1;
    return CDF_OK;
}

int64_t cdf_scheduler_num_timesteps(const cdf_scheduler *s) { return s ? s->n_timesteps : 0; }
const float *cdf_scheduler_timesteps(const cdf_scheduler *s) { return s ? s->timesteps : NULL; }
int64_t cdf_scheduler_num_sigmas(const cdf_scheduler *s) { return s ? s->n_sigmas : 0; }
const float *cdf_scheduler_sigmas(const cdf_scheduler *s) { return s ? s->sigmas : NULL; }

cdf_status cdf_scheduler_set_begin_index(cdf_scheduler *s, int64_t begin_index) {
    if (!s) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_scheduler_set_begin_index: scheduler is NULL");
    if (begin_index < 0) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_scheduler_set_begin_index: begin index %lld is negative", (long long)begin_index);
    s->begin_index = begin_index;
    return CDF_OK;
}

int64_t cdf_scheduler_begin_index(const cdf_scheduler *s) { return s ? s->begin_index : -1; }
int64_t cdf_scheduler_step_index(const cdf_scheduler *s) { return s ? s->step_index : -1; }
void cdf_scheduler_set_shift(cdf_scheduler *s, double shift) {
    if (s) s->shift = shift;
}
double cdf_scheduler_shift(const cdf_scheduler *s) { return s ? s->shift : NAN; }

/* index_for_timestep: the position of `t` in the timesteps; the second match if there are
 * several (diffusers does this so that img2img starting mid-schedule never skips a sigma). */
static int64_t index_for_timestep(const cdf_scheduler *s, float t) {
    int64_t first = -1;
    for (int64_t i = 0; i < s->n_timesteps; i++) {
        if (s->timesteps[i] == t) {
            if (first >= 0) return i;
            first = i;
        }
    }
    return first;
}

static cdf_status do_step(cdf_scheduler *s, const float *timestep, const float *model_output, const float *sample, float *prev, int64_t n) {
    const char *fn = "cdf_scheduler_step";
    if (!s) return cdf_error(CDF_ERR_INVALID_ARG, "%s: scheduler is NULL", fn);
    if (n < 0) return cdf_error(CDF_ERR_INVALID_ARG, "%s: negative element count %lld", fn, (long long)n);
    if (n > 0 && (!model_output || !sample || !prev))
        return cdf_error(CDF_ERR_INVALID_ARG, "%s: %s is NULL", fn, !model_output ? "model_output" : !sample ? "sample" : "prev_sample");
    int64_t idx = s->step_index;
    if (idx < 0) {
        if (s->begin_index >= 0) {
            idx = s->begin_index;
        } else {
            if (s->n_timesteps < 1) return cdf_error(CDF_ERR_INVALID_ARG, "%s: the scheduler has no timesteps", fn);
            const float t = timestep ? *timestep : s->timesteps[0];
            idx = index_for_timestep(s, t);
            if (idx < 0) return cdf_error(CDF_ERR_NOT_FOUND, "%s: timestep %.9g is not one of the scheduler's %lld timesteps", fn, (double)t, (long long)s->n_timesteps);
        }
    }
    if (idx + 1 >= s->n_sigmas)
        return cdf_error(CDF_ERR_INVALID_ARG, "%s: step index %lld is past the last step (%lld sigmas; call set_timesteps again)", fn, (long long)idx, (long long)s->n_sigmas);
    const float dt = s->sigmas[idx + 1] - s->sigmas[idx];
    for (int64_t i = 0; i < n; i++) {
        const float d = dt * model_output[i];
        prev[i] = sample[i] + d;
    }
    s->step_index = idx + 1;
    return CDF_OK;
}

cdf_status cdf_scheduler_step(cdf_scheduler *s, const float *model_output, const float *sample, float *prev_sample, int64_t n) {
    return do_step(s, NULL, model_output, sample, prev_sample, n);
}

cdf_status cdf_scheduler_step_timestep(cdf_scheduler *s, float timestep, const float *model_output, const float *sample, float *prev_sample, int64_t n) {
    return do_step(s, &timestep, model_output, sample, prev_sample, n);
}
