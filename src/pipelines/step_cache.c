/* diffusers' First Block Cache (hooks/first_block_cache.py, 0.42.1) and MagCache (mag_cache.py)
 * around the FLUX.1 transformer's fbc_head / fbc_tail / fbc_skip / cache_embed methods;
 * docs/step-caches.md. */
#include "pipelines/step_cache.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdiffusers/dist.h"
#include "core/error_internal.h"
#include "pipelines/pipeline_impl.h"
#include "tensor/tensor_impl.h"

static const char *const k_context[CDF_STEP_CACHE_PASSES] = {"cond", "uncond"};

static cdf_status status_or_internal(void) { return cdf_last_status() ? cdf_last_status() : CDF_ERR_INTERNAL; }

/* A Python bool as written in a config: True / False (also true / false, 1 / 0). */
static bool parse_bool(const char *v, bool *out) {
    if (strcmp(v, "True") == 0 || strcmp(v, "true") == 0 || strcmp(v, "1") == 0) return *out = true, true;
    if (strcmp(v, "False") == 0 || strcmp(v, "false") == 0 || strcmp(v, "0") == 0) return *out = false, true;
    return false;
}

/* mag_ratios' value at *q: "[r0, r1, ...]" (a Python list as diffusers prints it: finite
 * numbers, ',' between, spaces anywhere) into cfg as float32 (torch.tensor(list)); *q ends
 * after the ']'. */
static cdf_status parse_ratio_list(const char *spec, const char **q, cdf_step_cache_config *cfg) {
    const char *r = *q;
    if (*r != '[')
        return cdf_error(CDF_ERR_INVALID_ARG, "cache '%s': mag_ratios must be a list [r0, r1, ...] (as diffusers' calibration "
                         "prints it)", spec);
    r++;
    int n = 0;
    for (;;) {
        while (*r == ' ') r++;
        if (*r == ']' && n == 0) return cdf_error(CDF_ERR_INVALID_ARG, "cache '%s': mag_ratios is empty", spec);
        char *end = NULL;
        const double v = strtod(r, &end);
        if (end == r || !isfinite(v))
            return cdf_error(CDF_ERR_INVALID_ARG, "cache '%s': mag_ratios: '%.*s' is not a finite number", spec,
                             (int)strcspn(r, ",]"), r);
        if (n == CDF_STEP_CACHE_MAX_RATIOS)
            return cdf_error(CDF_ERR_INVALID_ARG, "more than %d mag_ratios in cache '%.60s...'", CDF_STEP_CACHE_MAX_RATIOS, spec);
        cfg->mag_ratios[n++] = (float)v;
        r = end;
        while (*r == ' ') r++;
        if (*r == ']') break;
        if (*r != ',')
            return cdf_error(CDF_ERR_INVALID_ARG, "cache '%s': mag_ratios: expected ',' or ']' at '%s'", spec, *r ? r : "(end)");
        r++;
    }
    cfg->n_mag_ratios = n;
    *q = r + 1;
    return CDF_OK;
}

/* "key=value,key=value" of MagCacheConfig's fields into cfg. */
static cdf_status parse_mag_fields(const char *spec, const char *p, cdf_step_cache_config *cfg) {
    if (!*p) return cdf_error(CDF_ERR_INVALID_ARG, "cache '%s': nothing after 'mag:' (key=value,...)", spec);
    while (*p) {
        if (strncmp(p, "mag_ratios=", 11) == 0) { /* a list: its commas are not field separators */
            const char *q = p + 11;
            CDF_TRY(parse_ratio_list(spec, &q, cfg));
            if (*q && *q != ',')
                return cdf_error(CDF_ERR_INVALID_ARG, "cache '%s': '%s' after mag_ratios' ']' (fields are separated by ',')", spec, q);
            p = *q ? q + 1 : q;
            if (*q && !*p) return cdf_error(CDF_ERR_INVALID_ARG, "cache '%s': trailing ','", spec);
            continue;
        }
        const char *comma = strchr(p, ','), *end = comma ? comma : p + strlen(p), *eq = memchr(p, '=', (size_t)(end - p));
        char key[32], val[64];
        if (!eq || eq == p || (size_t)(eq - p) >= sizeof key || (size_t)(end - eq - 1) >= sizeof val || end == eq + 1)
            return cdf_error(CDF_ERR_INVALID_ARG, "cache '%s': '%.*s' is not key=value (MagCacheConfig fields: threshold, "
                             "max_skip_steps, retention_ratio, num_inference_steps, mag_ratios, calibrate)", spec, (int)(end - p), p);
        snprintf(key, sizeof key, "%.*s", (int)(eq - p), p);
        snprintf(val, sizeof val, "%.*s", (int)(end - eq - 1), eq + 1);
        char *vend = NULL;
        const double v = strtod(val, &vend);
        const bool num = vend && !*vend && isfinite(v);
        const bool is_int = num && v == floor(v) && v >= 0 && v <= 1000000;
        if (strcmp(key, "threshold") == 0 && num && v >= 0) cfg->threshold = v;
        else if (strcmp(key, "retention_ratio") == 0 && num && v >= 0) cfg->retention_ratio = v;
        else if (strcmp(key, "max_skip_steps") == 0 && is_int) cfg->max_skip_steps = (int)v;
        else if (strcmp(key, "num_inference_steps") == 0 && is_int && v >= 1) cfg->num_inference_steps = (int)v;
        else if (strcmp(key, "calibrate") == 0 && parse_bool(val, &cfg->calibrate))
            ;
        else if (strcmp(key, "calibrate") == 0)
            return cdf_error(CDF_ERR_INVALID_ARG, "cache '%s': calibrate cannot be '%s' (True or False)", spec, val);
        else if (strcmp(key, "threshold") == 0 || strcmp(key, "retention_ratio") == 0 || strcmp(key, "max_skip_steps") == 0 ||
                 strcmp(key, "num_inference_steps") == 0)
            return cdf_error(CDF_ERR_INVALID_ARG, "cache '%s': %s must be a %s, got '%s'", spec, key,
                             key[0] == 't' || key[0] == 'r' ? "finite number >= 0"
                             : key[0] == 'm'                ? "whole number >= 0"
                                                            : "whole number >= 1",
                             val);
        else
            return cdf_error(CDF_ERR_INVALID_ARG, "cache '%s': unknown MagCacheConfig field '%s' (threshold, max_skip_steps, "
                             "retention_ratio, num_inference_steps, mag_ratios, calibrate)", spec, key);
        p = comma ? comma + 1 : end;
        if (comma && !*p) return cdf_error(CDF_ERR_INVALID_ARG, "cache '%s': trailing ','", spec);
    }
    return CDF_OK;
}

/* "key=value,..." of TaylorSeerCacheConfig's fields into cfg. */
static cdf_status parse_taylor_fields(const char *spec, const char *p, cdf_step_cache_config *cfg) {
    static const char fields[] =
        "cache_interval, disable_cache_before_step, disable_cache_after_step, max_order, taylor_factors_dtype, use_lite_mode";
    if (!*p) return cdf_error(CDF_ERR_INVALID_ARG, "cache '%s': nothing after 'taylorseer:' (key=value,...)", spec);
    while (*p) {
        const char *comma = strchr(p, ','), *end = comma ? comma : p + strlen(p), *eq = memchr(p, '=', (size_t)(end - p));
        char key[40], val[64];
        if (!eq || eq == p || (size_t)(eq - p) >= sizeof key || (size_t)(end - eq - 1) >= sizeof val || end == eq + 1)
            return cdf_error(CDF_ERR_INVALID_ARG, "cache '%s': '%.*s' is not key=value (TaylorSeerCacheConfig fields: %s)", spec,
                             (int)(end - p), p, fields);
        snprintf(key, sizeof key, "%.*s", (int)(eq - p), p);
        snprintf(val, sizeof val, "%.*s", (int)(end - eq - 1), eq + 1);
        char *vend = NULL;
        const double v = strtod(val, &vend);
        const bool is_int = vend && !*vend && isfinite(v) && v == floor(v) && v >= 0 && v <= 1000000;
        if (strcmp(key, "cache_interval") == 0 && is_int && v >= 1) cfg->cache_interval = (int)v;
        else if (strcmp(key, "disable_cache_before_step") == 0 && is_int) cfg->disable_cache_before_step = (int)v;
        else if (strcmp(key, "disable_cache_after_step") == 0 && (is_int || strcmp(val, "None") == 0))
            cfg->disable_cache_after_step = is_int ? (int)v : -1;
        else if (strcmp(key, "max_order") == 0 && is_int && v <= 8) cfg->max_order = (int)v;
        else if (strcmp(key, "taylor_factors_dtype") == 0 && (strcmp(val, "bfloat16") == 0 || strcmp(val, "float16") == 0 ||
                                                             strcmp(val, "float32") == 0))
            cfg->taylor_factors_dtype = val[5] == '3' ? CDF_F32 : val[0] == 'b' ? CDF_BF16 : CDF_F16;
        else if (strcmp(key, "use_lite_mode") == 0 && parse_bool(val, &cfg->use_lite_mode))
            ;
        else if (strcmp(key, "use_lite_mode") == 0)
            return cdf_error(CDF_ERR_INVALID_ARG, "cache '%s': use_lite_mode cannot be '%s' (True or False)", spec, val);
        else if (strcmp(key, "skip_predict_identifiers") == 0 || strcmp(key, "cache_identifiers") == 0)
            return cdf_error(CDF_ERR_UNSUPPORTED, "cache '%s': TaylorSeerCacheConfig.%s is not supported (diffusers' default "
                             "patterns, every block's attention, or use_lite_mode=True's)", spec, key);
        else if (strstr(fields, key) && strlen(key) > 8)
            return cdf_error(CDF_ERR_INVALID_ARG, "cache '%s': %s cannot be '%s' (%s)", spec, key, val,
                             strcmp(key, "taylor_factors_dtype") == 0 ? "bfloat16, float16 or float32"
                             : strcmp(key, "cache_interval") == 0     ? "a whole number >= 1"
                             : strcmp(key, "max_order") == 0          ? "a whole number 0-8"
                             : strcmp(key, "disable_cache_after_step") == 0 ? "a whole number >= 0 or None"
                                                                             : "a whole number >= 0");
        else
            return cdf_error(CDF_ERR_INVALID_ARG, "cache '%s': unknown TaylorSeerCacheConfig field '%s' (%s)", spec, key, fields);
        p = comma ? comma + 1 : end;
        if (comma && !*p) return cdf_error(CDF_ERR_INVALID_ARG, "cache '%s': trailing ','", spec);
    }
    return CDF_OK;
}

cdf_status cdf_step_cache_parse(const char *spec, cdf_step_cache_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    if (!spec || !*spec || strcmp(spec, "none") == 0) return CDF_OK;
    static const char fb[] = "first-block";
    const size_t n = sizeof fb - 1;
    if (strncmp(spec, fb, n) == 0 && (spec[n] == '\0' || spec[n] == ':')) {
        cfg->kind = CDF_STEP_CACHE_FIRST_BLOCK;
        cfg->threshold = 0.05; /* FirstBlockCacheConfig's default */
        if (spec[n] == '\0') return CDF_OK;
        const char *num = spec + n + 1;
        char *end = NULL;
        double t = *num ? strtod(num, &end) : NAN;
        if (!*num || !end || *end || !isfinite(t) || t < 0) {
            memset(cfg, 0, sizeof *cfg);
            return cdf_error(CDF_ERR_INVALID_ARG, "cache '%s': the first-block threshold must be a finite number >= 0 "
                             "(e.g. first-block:0.12), got '%s'", spec, num);
        }
        cfg->threshold = t;
        return CDF_OK;
    }
    if (strncmp(spec, "mag", 3) == 0 && (spec[3] == '\0' || spec[3] == ':')) {
        cfg->kind = CDF_STEP_CACHE_MAG; /* MagCacheConfig's defaults */
        cfg->threshold = 0.06;
        cfg->max_skip_steps = 3;
        cfg->retention_ratio = 0.2;
        cdf_status s = spec[3] ? parse_mag_fields(spec, spec + 4, cfg) : CDF_OK;
        if (s != CDF_OK) memset(cfg, 0, sizeof *cfg);
        return s;
    }
    if (strncmp(spec, "taylorseer", 10) == 0 && (spec[10] == '\0' || spec[10] == ':')) {
        cfg->kind = CDF_STEP_CACHE_TAYLORSEER; /* TaylorSeerCacheConfig's defaults */
        cfg->cache_interval = 5;
        cfg->disable_cache_before_step = 3;
        cfg->disable_cache_after_step = -1;
        cfg->max_order = 1;
        cfg->taylor_factors_dtype = CDF_BF16;
        cdf_status s = spec[10] ? parse_taylor_fields(spec, spec + 11, cfg) : CDF_OK;
        if (s != CDF_OK) memset(cfg, 0, sizeof *cfg);
        return s;
    }
    return cdf_error(CDF_ERR_INVALID_ARG, "unknown cache '%s' (known: none, first-block[:THRESHOLD], mag[:key=value,...], "
                     "taylorseer[:key=value,...])", spec);
}

/* diffusers' hooks/mag_cache.py FLUX_MAG_RATIOS (torch.tensor: float32) */
static const float k_flux_mag_ratios[28] = {1.0f,     1.21094f, 1.11719f, 1.07812f, 1.0625f,  1.03906f, 1.03125f,
                                            1.03906f, 1.02344f, 1.03125f, 1.02344f, 0.98047f, 1.01562f, 1.00781f,
                                            1.0f,     1.00781f, 1.0f,     1.00781f, 1.0f,     1.0f,     0.99609f,
                                            0.99609f, 0.98047f, 0.98828f, 0.96484f, 0.95703f, 0.93359f, 0.89062f};

cdf_status cdf_step_cache_init(cdf_step_cache *sc, const cdf_step_cache_config *cfg, int num_steps) {
    memset(sc, 0, sizeof *sc);
    sc->cfg = *cfg;
    for (int k = 0; k < CDF_STEP_CACHE_PASSES; k++) sc->pass[k].acc_ratio = 1.0f, sc->pass[k].last_update_step = -1;
    if (cfg->kind != CDF_STEP_CACHE_MAG) return CDF_OK;
    if (sc->cfg.num_inference_steps <= 0) sc->cfg.num_inference_steps = num_steps;
    if (cfg->calibrate) return CDF_OK; /* calibration uses no ratios (diffusers does not interpolate them then) */
    const int n = sc->cfg.num_inference_steps, src = cfg->n_mag_ratios ? cfg->n_mag_ratios : 28;
    const float *from = cfg->n_mag_ratios ? cfg->mag_ratios : k_flux_mag_ratios;
    if (!(sc->mag_ratios = malloc((size_t)n * sizeof *sc->mag_ratios))) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    if (n == src) {
        memcpy(sc->mag_ratios, from, (size_t)n * sizeof *from);
    } else if (n == 1) {
        sc->mag_ratios[0] = from[src - 1]; /* nearest_interp: src_array[-1:] */
    } else {
        /* nearest_interp: round(arange(n, float32) * ((src - 1) / (n - 1))), torch.round halves to even */
        const float scale = (float)((double)(src - 1) / (double)(n - 1));
        for (int i = 0; i < n; i++) {
            long j = lrintf((float)i * scale);
            sc->mag_ratios[i] = from[j < 0 ? 0 : j >= src ? src - 1 : j];
        }
    }
    return CDF_OK;
}

static bool log_cache(void) {
    const char *v = getenv("CDIFFUSERS_LOG");
    return v && strstr(v, "cache");
}

static cdf_status record(struct cdf_step_cache_pass *ps, float change, bool computed) {
    if (ps->calls == ps->cap) {
        int cap = ps->cap ? 2 * ps->cap : 64;
        float *c = realloc(ps->change, (size_t)cap * sizeof *c);
        if (c) ps->change = c;
        bool *b = c ? realloc(ps->computed, (size_t)cap * sizeof *b) : NULL;
        if (b) ps->computed = b;
        if (!c || !b) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (cache decisions)");
        ps->cap = cap;
    }
    ps->change[ps->calls] = change;
    ps->computed[ps->calls] = computed;
    ps->calls++;
    return CDF_OK;
}

/* mean(|r - prev|) / mean(|prev|) over every element, float32, read on the host: the one
 * scalar read of the step. |x| = max(x, -x) (exact). */
static cdf_status relative_change(cdf_tensor *r, cdf_tensor *prev, float *change) {
    cdf_scope_push();
    int64_t flat[1] = {cdf_tensor_numel(r)};
    cdf_tensor *d = cdf_reshape(cdf_contiguous(cdf_sub(r, prev)), 1, flat);
    cdf_tensor *p = cdf_reshape(cdf_contiguous(prev), 1, flat);
    cdf_tensor *num = cdf_mean(cdf_maximum(d, cdf_neg(d)), 0, true), *den = cdf_mean(cdf_maximum(p, cdf_neg(p)), 0, true);
    cdf_tensor *ratio = cdf_div(num, den);
    cdf_status s = ratio ? CDF_OK : status_or_internal();
    /* tensor parallelism: every rank holds the whole (all-reduced) residual, but its sums may
     * round differently per rank: rank 0's value decides for all, so no rank skips alone */
    cdf_device_mesh *mesh = cdf_tp_mesh();
    if (s == CDF_OK && mesh && cdf_device_mesh_size(mesh) > 1) s = cdf_dist_broadcast(cdf_device_mesh_group(mesh), ratio, 0);
    float *v = s == CDF_OK ? cdf_tensor_read_f32(ratio) : NULL;
    if (s == CDF_OK && !v) s = status_or_internal();
    if (v) *change = v[0];
    free(v);
    cdf_scope_pop(NULL, 0);
    return s;
}

static void replace(cdf_tensor **slot, cdf_tensor *t) {
    cdf_tensor_retain(t);
    cdf_tensor_release(*slot);
    *slot = t;
}

/* The fbc_head outputs the tail takes (x, ctx, temb, cos, sin). */
static cdf_status tail_inputs(cdf_tensor_map *hout, cdf_tensor_map *tin) {
    static const char *const keys[5] = {"x", "ctx", "temb", "cos", "sin"};
    cdf_status s = CDF_OK;
    for (int i = 0; i < 5 && s == CDF_OK; i++) {
        char k[16];
        snprintf(k, sizeof k, "out.%s", keys[i]);
        cdf_tensor *t = cdf_tensor_map_get(hout, k);
        s = t ? cdf_tensor_map_set(tin, keys[i], t) : cdf_error(CDF_ERR_INTERNAL, "fbc_head produced no '%s'", k);
    }
    return s;
}

/* MagCache's calibration step (_perform_calibration_step): mean over tokens of
 * |cur| / (|prev| + 1e-8), the norms over the last dim, float32 on the device, read on the host
 * (.item()); under tensor parallelism rank 0's value. */
static cdf_status calibration_ratio(cdf_tensor *cur, cdf_tensor *prev, double *ratio) {
    cdf_scope_push();
    const int last = cdf_tensor_ndim(cur) - 1;
    int64_t flat[1] = {cdf_tensor_numel(cur) / cdf_tensor_dim(cur, last)};
    cdf_tensor *cn = cdf_sqrt(cdf_sum(cdf_mul(cur, cur), last, false)), *pn = cdf_sqrt(cdf_sum(cdf_mul(prev, prev), last, false));
    cdf_tensor *r = cdf_mean(cdf_reshape(cdf_contiguous(cdf_div(cn, cdf_add_scalar(pn, 1e-8f))), 1, flat), 0, true);
    cdf_status s = r ? CDF_OK : status_or_internal();
    cdf_device_mesh *mesh = cdf_tp_mesh();
    if (s == CDF_OK && mesh && cdf_device_mesh_size(mesh) > 1) s = cdf_dist_broadcast(cdf_device_mesh_group(mesh), r, 0);
    float *v = s == CDF_OK ? cdf_tensor_read_f32(r) : NULL;
    if (s == CDF_OK && !v) s = status_or_internal();
    if (v) *ratio = v[0];
    free(v);
    cdf_scope_pop(NULL, 0);
    return s;
}

/* Python's repr of a float (the shortest string that reads back as the same double; fixed
 * notation for exponents -4..15, else d.ddde+XX), as diffusers' print of the ratio list shows it. */
static void py_float_repr(double v, char *out, size_t cap) {
    if (isnan(v) || isinf(v)) {
        snprintf(out, cap, "%s", isnan(v) ? "nan" : v < 0 ? "-inf" : "inf");
        return;
    }
    char e[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, v);
        if (strtod(e, NULL) == v) break;
    }
    /* e: [-]d[.ddd]e(+|-)XX */
    const bool neg = e[0] == '-';
    char digits[24];
    int nd = 0;
    const char *c = e + neg;
    for (; *c && *c != 'e'; c++)
        if (*c != '.') digits[nd++] = *c;
    digits[nd] = '\0';
    const int x = atoi(c + 1);
    char t[64];
    size_t n = 0;
    if (neg) t[n++] = '-';
    if (x < -4 || x >= 16) {
        n += (size_t)sprintf(t + n, "%c%s%se%c%02d", digits[0], nd > 1 ? "." : "", digits + 1, x < 0 ? '-' : '+', abs(x));
    } else if (x < 0) { /* 0.000ddd */
        t[n++] = '0', t[n++] = '.';
        for (int i = 0; i < -x - 1; i++) t[n++] = '0';
        n += (size_t)sprintf(t + n, "%s", digits);
    } else { /* ddd.ddd, at least one digit after the point */
        for (int i = 0; i <= x; i++) t[n++] = i < nd ? digits[i] : '0';
        t[n++] = '.';
        if (nd > x + 1) n += (size_t)sprintf(t + n, "%s", digits + x + 1);
        else t[n++] = '0';
    }
    t[n] = '\0';
    snprintf(out, cap, "%s", t);
}

/* "[r0, r1, ...]" as Python prints a list of floats (malloc'd). */
static char *py_float_list(const double *v, int n) {
    char *t = malloc(32 * (size_t)n + 3);
    if (!t) return NULL;
    size_t k = 0;
    t[k++] = '[';
    for (int i = 0; i < n; i++) {
        char r[40];
        py_float_repr(v[i], r, sizeof r);
        k += (size_t)sprintf(t + k, "%s%s", i ? ", " : "", r);
    }
    t[k++] = ']';
    t[k] = '\0';
    return t;
}

/* MagCache (hooks/mag_cache.py): the decision from the ratios alone (no read); a computed call
 * is the forward that also returns its residual over every block (cache_full), a skipped one
 * runs no block: output layers on embedded latents + that residual (cache_embed, fbc_skip). */
static cdf_status mag_predict(cdf_step_cache *sc, cdf_component *transformer, int pass, const cdf_tensor_map *in,
                              cdf_tensor **sample) {
    struct cdf_step_cache_pass *ps = &sc->pass[pass];
    const cdf_step_cache_config *c = &sc->cfg;
    const int step = ps->step_index;
    bool compute = true;
    float err = NAN;
    const int retention_step = (int)(c->retention_ratio * c->num_inference_steps + 0.5);
    if (!c->calibrate && step >= retention_step) { /* calibration never skips */
        /* float32 arithmetic, as on diffusers' 0-dim float32 tensors; the comparisons cast the
         * Python thresholds to float32 as torch does */
        const float scale = step < c->num_inference_steps ? sc->mag_ratios[step] : 1.0f;
        ps->acc_ratio *= scale;
        ps->acc_steps += 1;
        ps->acc_err += fabsf(1.0f - ps->acc_ratio);
        err = ps->acc_err;
        if (ps->prev_residual && ps->acc_err <= (float)c->threshold && ps->acc_steps <= c->max_skip_steps) {
            compute = false;
        } else {
            ps->acc_ratio = 1.0f;
            ps->acc_steps = 0;
            ps->acc_err = 0.0f;
        }
    }
    if (log_cache())
        fprintf(stderr, "cache: mag %s call %d (step_index %d): accumulated error %.6g (threshold %g, %d of at most %d "
                "skipped) -> %s\n", k_context[pass], ps->calls, step, (double)err, c->threshold, compute ? 0 : ps->acc_steps,
                c->max_skip_steps, compute ? "full" : "skip");
    cdf_tensor_map hout, tin, tout;
    cdf_tensor_map_init(&hout);
    cdf_tensor_map_init(&tin);
    cdf_tensor_map_init(&tout);
    cdf_status s = CDF_OK;
    if (compute) {
        cdf_tensor *residual = NULL;
        s = cdf_component_run(transformer, "cache_full", in, &tout);
        if (s == CDF_OK && (!(*sample = cdf_pipe_take(&tout, "out.sample")) || !(residual = cdf_pipe_take(&tout, "out.residual"))))
            s = status_or_internal();
        if (s == CDF_OK && c->calibrate) { /* before the residual is replaced: ratio 1.0 at the first step */
            double ratio = 1.0;
            if (ps->prev_residual) s = calibration_ratio(residual, ps->prev_residual, &ratio);
            double *grown = s == CDF_OK ? realloc(ps->calib, (size_t)(ps->n_calib + 1) * sizeof *grown) : NULL;
            if (s == CDF_OK && !grown) s = cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (calibration)");
            if (s == CDF_OK) ps->calib = grown, ps->calib[ps->n_calib++] = ratio;
        }
        if (s == CDF_OK) replace(&ps->prev_residual, residual);
    } else {
        cdf_tensor *x = NULL, *temb = NULL;
        s = cdf_component_run(transformer, "cache_embed", in, &hout);
        if (s == CDF_OK && (!(x = cdf_tensor_map_get(&hout, "out.x")) || !(temb = cdf_tensor_map_get(&hout, "out.temb"))))
            s = cdf_error(CDF_ERR_INTERNAL, "cache_embed produced no x / temb");
        if (s == CDF_OK) s = cdf_tensor_map_set(&tin, "x", x);
        if (s == CDF_OK) s = cdf_tensor_map_set(&tin, "tail_residual", ps->prev_residual);
        if (s == CDF_OK) s = cdf_tensor_map_set(&tin, "temb", temb);
        if (s == CDF_OK) s = cdf_component_run(transformer, "fbc_skip", &tin, &tout);
        if (s == CDF_OK && !(*sample = cdf_pipe_take(&tout, "out.sample"))) s = status_or_internal();
    }
    if (s == CDF_OK) s = record(ps, err, compute);
    /* _advance_step: at num_inference_steps the state starts over */
    if (s == CDF_OK && ++ps->step_index >= c->num_inference_steps) {
        if (c->calibrate) {
            /* diffusers prints the list (stdout) for the user to pass back as mag_ratios; under
             * tensor parallelism rank 0 alone */
            char *list = py_float_list(ps->calib, ps->n_calib);
            cdf_device_mesh *mesh = cdf_tp_mesh();
            if (list && (!mesh || cdf_device_mesh_rank(mesh) == 0)) {
                printf("\n[MagCache] Calibration Complete. Copy these values to MagCacheConfig(mag_ratios=...):\n%s\n\n", list);
                fflush(stdout);
            }
            free(list);
            free(ps->calib_done);
            ps->calib_done = ps->calib, ps->n_calib_done = ps->n_calib;
            ps->calib = NULL, ps->n_calib = 0;
        }
        ps->step_index = 0;
        ps->acc_ratio = 1.0f;
        ps->acc_steps = 0;
        ps->acc_err = 0.0f;
        cdf_tensor_release(ps->prev_residual);
        ps->prev_residual = NULL;
    }
    cdf_tensor_map_clear(&hout);
    cdf_tensor_map_clear(&tin);
    cdf_tensor_map_clear(&tout);
    if (s != CDF_OK) *sample = NULL;
    return s;
}

/* Python's a % b for b > 0 */
static int py_mod(int a, int b) { return ((a % b) + b) % b; }

/* TaylorSeer (hooks/taylorseer_cache.py) over every attention module: the schedule decides (no
 * read); a computed call runs the forward and updates each module's Taylor factors from its
 * outputs, a predicted one runs the forward with each module's output replaced by
 * sum f(k) offset^k / k! (the attention not run). Lite mode: the one module is proj_out, the
 * computed call the plain forward, the predicted one its prediction alone (no block runs). */
static cdf_status taylor_predict(cdf_step_cache *sc, cdf_component *transformer, int pass, const cdf_tensor_map *in,
                                 cdf_tensor **sample) {
    struct cdf_step_cache_pass *ps = &sc->pass[pass];
    const cdf_step_cache_config *c = &sc->cfg;
    const int step = ps->step_index++, orders = c->max_order + 1; /* current_step, from 0 */
    const bool compute = step < c->disable_cache_before_step ||
                         py_mod(step - c->disable_cache_before_step - 1, c->cache_interval) == 0 ||
                         (c->disable_cache_after_step >= 0 && step >= c->disable_cache_after_step) || ps->last_update_step < 0;
    if (log_cache())
        fprintf(stderr, "cache: taylorseer %s call %d: %s (last update at %d)\n", k_context[pass], step, compute ? "full" : "predict",
                ps->last_update_step);
    cdf_tensor_map pin, out;
    cdf_tensor_map_init(&pin);
    cdf_tensor_map_init(&out);
    cdf_status s = CDF_OK;
    char key[40];
    if (compute) {
        /* lite mode: the one active module is proj_out, whose output is the sample (the blocks'
         * hooks only count and, on a predicted step, return zeros nothing reads) */
        s = cdf_component_run(transformer, c->use_lite_mode ? "forward" : "taylor_update", in, &out);
        if (s == CDF_OK && !(*sample = cdf_pipe_take(&out, "out.sample"))) s = status_or_internal();
        int n = c->use_lite_mode ? 1 : 0;
        for (; !c->use_lite_mode; n++) { /* the modules: out.attn.0 .. */
            snprintf(key, sizeof key, "out.attn.%d", n);
            if (!cdf_tensor_map_get(&out, key)) break;
        }
        if (s == CDF_OK && !ps->factors) {
            ps->n_modules = n;
            ps->factors = calloc((size_t)n * orders + 1, sizeof *ps->factors);
            ps->n_orders = calloc((size_t)n + 1, sizeof *ps->n_orders);
            if (!ps->factors || !ps->n_orders) s = cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (Taylor factors)");
        }
        if (s == CDF_OK && n != ps->n_modules) s = cdf_error(CDF_ERR_INTERNAL, "taylorseer: %d attention modules, then %d", ps->n_modules, n);
        for (int k = 0; k < n && s == CDF_OK; k++) {
            cdf_scope_push();
            snprintf(key, sizeof key, "out.attn.%d", k);
            cdf_tensor *nf[9] = {c->use_lite_mode ? *sample : cdf_tensor_map_get(&out, key)}; /* new factors, float32 */
            int no = 1;
            if (ps->last_update_step >= 0) {
                cdf_tensor *delta = cdf_pipe_scalar_tensor(cdf_tensor_device(nf[0]), (float)(step - ps->last_update_step), 1);
                for (int j = 0; j < c->max_order && j < ps->n_orders[k]; j++, no++) /* (f_j - prev f_j) / delta */
                    nf[j + 1] = cdf_div(cdf_sub(nf[j], cdf_cast(ps->factors[k * orders + j], cdf_tensor_dtype(nf[0]))), delta);
            }
            cdf_tensor *kept[9];
            for (int j = 0; j < no; j++) kept[j] = cdf_cast(nf[j], c->taylor_factors_dtype);
            for (int j = 0; j < no && s == CDF_OK; j++)
                if (!kept[j]) s = status_or_internal();
            if (s == CDF_OK) {
                for (int j = 0; j < orders; j++) {
                    cdf_tensor_release(ps->factors[k * orders + j]);
                    ps->factors[k * orders + j] = j < no ? cdf_tensor_retain(kept[j]) : NULL;
                }
                ps->n_orders[k] = no;
            }
            cdf_scope_pop(NULL, 0);
        }
        if (s == CDF_OK) ps->last_update_step = step;
    } else {
        const int offset = step - ps->last_update_step;
        for (int k = 0; k < ps->n_modules && s == CDF_OK; k++) {
            /* zeros + sum_o f_o * (offset^o / o!) in float32, the coefficient a Python float */
            cdf_tensor *acc = NULL;
            double fact = 1.0, pw = 1.0;
            for (int o = 0; o < ps->n_orders[k]; o++) {
                if (o > 0) fact *= o, pw *= offset;
                cdf_tensor *term = cdf_scale(cdf_cast(ps->factors[k * orders + o], CDF_F32), (float)(pw / fact));
                acc = acc ? cdf_add(acc, term) : term;
            }
            snprintf(key, sizeof key, "attn.%d", k);
            if (c->use_lite_mode) *sample = acc; /* proj_out's prediction is the sample: nothing runs */
            s = acc ? c->use_lite_mode ? CDF_OK : cdf_tensor_map_set(&pin, key, acc) : status_or_internal();
        }
        if (!c->use_lite_mode) {
            for (int i = 0; i < in->n && s == CDF_OK; i++) s = cdf_tensor_map_set(&pin, in->names[i], in->tensors[i]);
            if (s == CDF_OK) s = cdf_component_run(transformer, "taylor_predict", &pin, &out);
            if (s == CDF_OK && !(*sample = cdf_pipe_take(&out, "out.sample"))) s = status_or_internal();
        }
    }
    if (s == CDF_OK) s = record(ps, NAN, compute);
    cdf_tensor_map_clear(&pin);
    cdf_tensor_map_clear(&out);
    if (s != CDF_OK) *sample = NULL;
    return s;
}

cdf_status cdf_step_cache_predict(cdf_step_cache *sc, cdf_component *transformer, int pass, const cdf_tensor_map *in,
                                  cdf_tensor **sample) {
    *sample = NULL;
    if (pass < 0 || pass >= CDF_STEP_CACHE_PASSES) return cdf_error(CDF_ERR_INTERNAL, "step cache: pass %d", pass);
    if (sc->cfg.kind == CDF_STEP_CACHE_MAG) return mag_predict(sc, transformer, pass, in, sample);
    if (sc->cfg.kind == CDF_STEP_CACHE_TAYLORSEER) return taylor_predict(sc, transformer, pass, in, sample);
    struct cdf_step_cache_pass *ps = &sc->pass[pass];
    cdf_tensor_map hout, tin, tout;
    cdf_tensor_map_init(&hout);
    cdf_tensor_map_init(&tin);
    cdf_tensor_map_init(&tout);
    cdf_status s = cdf_component_run(transformer, "fbc_head", in, &hout);
    cdf_tensor *x = NULL, *r = NULL, *temb = NULL;
    if (s == CDF_OK && (!(x = cdf_pipe_take(&hout, "out.x")) || !(r = cdf_pipe_take(&hout, "out.residual")) ||
                        !(temb = cdf_pipe_take(&hout, "out.temb"))))
        s = status_or_internal();
    /* the decision: compute when there is no previous residual, or change > threshold */
    float change = NAN;
    bool compute = true;
    if (s == CDF_OK && ps->prev_residual) {
        s = relative_change(r, ps->prev_residual, &change);
        compute = (double)change > sc->cfg.threshold;
    }
    if (s == CDF_OK && log_cache())
        fprintf(stderr, "cache: first-block %s call %d: change %.6g %s threshold %g -> %s\n", k_context[pass], ps->calls,
                (double)change, isnan(change) ? "(first call)" : compute ? ">" : "<=", sc->cfg.threshold,
                compute ? "full" : "skip");
    if (s == CDF_OK && compute) {
        s = tail_inputs(&hout, &tin);
        if (s == CDF_OK) s = cdf_component_run(transformer, "fbc_tail", &tin, &tout);
        cdf_tensor *tail = NULL;
        if (s == CDF_OK && (!(*sample = cdf_pipe_take(&tout, "out.sample")) || !(tail = cdf_pipe_take(&tout, "out.tail_residual"))))
            s = status_or_internal();
        if (s == CDF_OK) {
            replace(&ps->prev_residual, r);
            replace(&ps->tail_residual, tail);
        }
    } else if (s == CDF_OK) {
        s = cdf_tensor_map_set(&tin, "x", x);
        if (s == CDF_OK) s = cdf_tensor_map_set(&tin, "tail_residual", ps->tail_residual);
        if (s == CDF_OK) s = cdf_tensor_map_set(&tin, "temb", temb);
        if (s == CDF_OK) s = cdf_component_run(transformer, "fbc_skip", &tin, &tout);
        if (s == CDF_OK && !(*sample = cdf_pipe_take(&tout, "out.sample"))) s = status_or_internal();
    }
    if (s == CDF_OK) s = record(ps, change, compute);
    cdf_tensor_map_clear(&hout);
    cdf_tensor_map_clear(&tin);
    cdf_tensor_map_clear(&tout);
    if (s != CDF_OK) *sample = NULL;
    return s;
}

void cdf_step_cache_finish(cdf_step_cache *sc, cdf_pipeline *p, const cdf_generate_params *gp) {
    if (sc->cfg.kind == CDF_STEP_CACHE_NONE) return;
    /* report: "first-block:T, full steps 0,5,8 (3 of 10)", with true CFG per context:
     * "first-block:T, full steps cond 0,3 (2 of 10), uncond 0,1,2 (3 of 10)" */
    const bool two = sc->pass[1].calls > 0;
    size_t cap = 256 + 40 * (size_t)sc->cfg.n_mag_ratios;
    for (int k = 0; k < CDF_STEP_CACHE_PASSES; k++) cap += 64 + 12 * (size_t)sc->pass[k].calls + 32 * (size_t)sc->pass[k].n_calib_done;
    char *rep = malloc(cap);
    if (rep) {
        char after[16];
        snprintf(after, sizeof after, "%d", sc->cfg.disable_cache_after_step);
        int n = sc->cfg.kind == CDF_STEP_CACHE_TAYLORSEER
                    ? snprintf(rep, cap, "taylorseer:cache_interval=%d,disable_cache_before_step=%d,disable_cache_after_step=%s,"
                               "max_order=%d,taylor_factors_dtype=%s%s, full steps", sc->cfg.cache_interval,
                               sc->cfg.disable_cache_before_step, sc->cfg.disable_cache_after_step < 0 ? "None" : after,
                               sc->cfg.max_order, sc->cfg.taylor_factors_dtype == CDF_F32 ? "float32"
                                                  : sc->cfg.taylor_factors_dtype == CDF_F16 ? "float16" : "bfloat16",
                               sc->cfg.use_lite_mode ? ",use_lite_mode=True" : "")
                : sc->cfg.kind == CDF_STEP_CACHE_MAG
                    ? snprintf(rep, cap, "mag:threshold=%g,max_skip_steps=%d,retention_ratio=%g,num_inference_steps=%d",
                               sc->cfg.threshold, sc->cfg.max_skip_steps, sc->cfg.retention_ratio, sc->cfg.num_inference_steps)
                    : snprintf(rep, cap, "first-block:%g, full steps", sc->cfg.threshold);
        if (sc->cfg.kind == CDF_STEP_CACHE_MAG) {
            /* the given ratios (each the shortest text that reads back as the same float32), calibrate */
            for (int i = 0; i < sc->cfg.n_mag_ratios; i++) {
                const float v = sc->cfg.mag_ratios[i];
                char t[32];
                for (int prec = 1; prec <= 9; prec++) {
                    snprintf(t, sizeof t, "%.*g", prec, (double)v);
                    if (strtof(t, NULL) == v) break;
                }
                n += snprintf(rep + n, cap - (size_t)n, "%s%s", i ? ", " : ",mag_ratios=[", t);
            }
            n += snprintf(rep + n, cap - (size_t)n, "%s%s, full steps", sc->cfg.n_mag_ratios ? "]" : "",
                          sc->cfg.calibrate ? ",calibrate=True" : "");
        }
        for (int k = 0; k < CDF_STEP_CACHE_PASSES; k++) {
            const struct cdf_step_cache_pass *ps = &sc->pass[k];
            if (!ps->calls) continue;
            n += snprintf(rep + n, cap - (size_t)n, "%s%s%s", k ? ", " : " ", two ? k_context[k] : "", two ? " " : "");
            int full = 0;
            for (int i = 0; i < ps->calls; i++)
                if (ps->computed[i]) n += snprintf(rep + n, cap - (size_t)n, "%s%d", full++ ? "," : "", i);
            n += snprintf(rep + n, cap - (size_t)n, " (%d of %d)", full, ps->calls);
        }
        /* calibration: the measured ratios as diffusers prints them (the last completed list) */
        for (int k = 0; k < CDF_STEP_CACHE_PASSES; k++) {
            const struct cdf_step_cache_pass *ps = &sc->pass[k];
            char *list = ps->n_calib_done ? py_float_list(ps->calib_done, ps->n_calib_done) : NULL;
            if (list)
                n += snprintf(rep + n, cap - (size_t)n, "%s%s%s%s", k && sc->pass[0].n_calib_done ? ", " : ", calibrated mag_ratios ",
                              two ? k_context[k] : "", two ? " " : "", list);
            free(list);
        }
    }
    if (p->image_index >= 0 && p->image_index < p->n_cache_reports) {
        free(p->cache_reports[p->image_index]);
        p->cache_reports[p->image_index] = rep;
    } else {
        free(rep);
    }
    for (int k = 0; k < CDF_STEP_CACHE_PASSES; k++) {
        struct cdf_step_cache_pass *ps = &sc->pass[k];
        if (gp->capture && ps->calls) {
            float *flags = malloc((size_t)ps->calls * sizeof *flags);
            for (int i = 0; flags && i < ps->calls; i++) flags[i] = ps->computed[i] ? 1.0f : 0.0f;
            int64_t shape[1] = {ps->calls};
            char key[64];
            cdf_scope_push();
            snprintf(key, sizeof key, "cache_computed.%s", k_context[k]);
            if (flags) cdf_pipe_capture(gp, key, cdf_tensor_from_host(p->device, CDF_F32, 1, shape, flags, CDF_F32));
            snprintf(key, sizeof key, "cache_change.%s", k_context[k]);
            cdf_pipe_capture(gp, key, cdf_tensor_from_host(p->device, CDF_F32, 1, shape, ps->change, CDF_F32));
            float *calib = ps->n_calib_done ? malloc((size_t)ps->n_calib_done * sizeof *calib) : NULL;
            for (int i = 0; calib && i < ps->n_calib_done; i++) calib[i] = (float)ps->calib_done[i]; /* float32 values */
            int64_t cshape[1] = {ps->n_calib_done};
            snprintf(key, sizeof key, "cache_calibration.%s", k_context[k]);
            if (calib) cdf_pipe_capture(gp, key, cdf_tensor_from_host(p->device, CDF_F32, 1, cshape, calib, CDF_F32));
            free(calib);
            cdf_scope_pop(NULL, 0);
            free(flags);
        }
        cdf_tensor_release(ps->prev_residual);
        cdf_tensor_release(ps->tail_residual);
        for (int i = 0; ps->factors && i < ps->n_modules * (sc->cfg.max_order + 1); i++) cdf_tensor_release(ps->factors[i]);
        free(ps->factors);
        free(ps->n_orders);
        free(ps->change);
        free(ps->computed);
        free(ps->calib);
        free(ps->calib_done);
    }
    free(sc->mag_ratios);
    memset(sc, 0, sizeof *sc);
}

/* The last generate's reports, one slot per image (pipeline.c resets them per request). */
const char *cdf_pipeline_cache_report(const cdf_pipeline *p, int image) {
    return p && image >= 0 && image < p->n_cache_reports ? p->cache_reports[image] : NULL;
}

cdf_status cdf_pipe_cache_reports_reset(cdf_pipeline *p, int n) {
    for (int i = 0; i < p->n_cache_reports; i++) free(p->cache_reports[i]);
    free(p->cache_reports);
    p->n_cache_reports = p->image_index = 0;
    if (!(p->cache_reports = calloc((size_t)n, sizeof *p->cache_reports))) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    p->n_cache_reports = n;
    return CDF_OK;
}
