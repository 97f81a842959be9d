/* diffusers' First Block Cache (hooks/first_block_cache.py, 0.42.1) around the FLUX.1
 * transformer's fbc_head / fbc_tail / fbc_skip methods; docs/step-caches.md. */
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
    if (strncmp(spec, "taylorseer", 10) == 0 || strncmp(spec, "mag", 3) == 0)
        return cdf_error(CDF_ERR_UNSUPPORTED, "cache '%s': TaylorSeer and MagCache are not implemented yet (only "
                         "first-block[:THRESHOLD]; docs/step-caches.md)", spec);
    return cdf_error(CDF_ERR_INVALID_ARG, "unknown cache '%s' (known: none, first-block[:THRESHOLD])", spec);
}

void cdf_step_cache_init(cdf_step_cache *sc, const cdf_step_cache_config *cfg) {
    memset(sc, 0, sizeof *sc);
    sc->cfg = *cfg;
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

cdf_status cdf_step_cache_predict(cdf_step_cache *sc, cdf_component *transformer, int pass, const cdf_tensor_map *in,
                                  cdf_tensor **sample) {
    *sample = NULL;
    if (pass < 0 || pass >= CDF_STEP_CACHE_PASSES) return cdf_error(CDF_ERR_INTERNAL, "step cache: pass %d", pass);
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
        static const char *const keys[5] = {"x", "ctx", "temb", "cos", "sin"};
        for (int i = 0; i < 5 && s == CDF_OK; i++) {
            char k[16];
            snprintf(k, sizeof k, "out.%s", keys[i]);
            cdf_tensor *t = cdf_tensor_map_get(&hout, k);
            s = t ? cdf_tensor_map_set(&tin, keys[i], t) : cdf_error(CDF_ERR_INTERNAL, "fbc_head produced no '%s'", k);
        }
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
    size_t cap = 96;
    for (int k = 0; k < CDF_STEP_CACHE_PASSES; k++) cap += 32 + 12 * (size_t)sc->pass[k].calls;
    char *rep = malloc(cap);
    if (rep) {
        int n = snprintf(rep, cap, "first-block:%g, full steps", sc->cfg.threshold);
        for (int k = 0; k < CDF_STEP_CACHE_PASSES; k++) {
            const struct cdf_step_cache_pass *ps = &sc->pass[k];
            if (!ps->calls) continue;
            n += snprintf(rep + n, cap - (size_t)n, "%s%s%s", k ? ", " : " ", two ? k_context[k] : "", two ? " " : "");
            int full = 0;
            for (int i = 0; i < ps->calls; i++)
                if (ps->computed[i]) n += snprintf(rep + n, cap - (size_t)n, "%s%d", full++ ? "," : "", i);
            n += snprintf(rep + n, cap - (size_t)n, " (%d of %d)", full, ps->calls);
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
            cdf_scope_pop(NULL, 0);
            free(flags);
        }
        cdf_tensor_release(ps->prev_residual);
        cdf_tensor_release(ps->tail_residual);
        free(ps->change);
        free(ps->computed);
    }
    memset(sc, 0, sizeof *sc);
}
