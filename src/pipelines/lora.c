/* LoRA adapters on a pipeline (cdiffusers/pipeline.h): a parsed file (models/lora_file.c) is
 * matched against the components' layers (every load registers them by module name), checked
 * completely, and only then applied — at run time (nn/lora.c links) or fused into W. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "models/lora_file.h"
#include "nn/lora.h"
#include "pipelines/pipeline_impl.h"

#define MAX_LISTED 12 /* unused keys named in a message; the rest are counted */

cdf_lora_params cdf_lora_params_default(void) {
    return (cdf_lora_params){.scale = 1.0f, .mode = CDF_LORA_RUNTIME, .allow_unused = false};
}

static cdf_component *component_named(const cdf_lora_components *cs, const char *name) {
    for (int i = 0; i < cs->n; i++)
        if (cs->c[i] && strcmp(cs->name[i], name) == 0) return cs->c[i];
    return NULL;
}

static cdf_lora_components pipeline_components(cdf_pipeline *p) {
    return (cdf_lora_components){.n = 4,
                                 .name = {"transformer", "text_encoder", "text_encoder_2", "text_encoder_3"},
                                 .c = {p->transformer, p->text_encoder[0], p->text_encoder[1], p->text_encoder[2]}};
}

/* An entry resolved to its layers: layer[k] gets rows [row0[k], row0[k] + full_out(layer[k])) of B
 * (of which a tensor-parallel shard keeps its own, make_pair). */
typedef struct match {
    const cdf_lora_entry *e;
    cdf_component *c;
    int n;
    cdf_linear_layer *layer[CDF_LORA_MAX_TARGETS];
    int64_t row0[CDF_LORA_MAX_TARGETS];
} match;

/* Resolve e: 1 = matched, 0 = no such component/layer (unused), -1 = error set. */
static int resolve(const cdf_lora_components *cs, const char *path, const cdf_lora_entry *e, match *m) {
    memset(m, 0, sizeof *m);
    m->e = e;
    m->c = component_named(cs, e->target.component);
    if (!m->c) return 0;
    cdf_layer_index *ix = cdf_component_layers(m->c);
    int64_t rows = 0;
    for (int k = 0; k < e->target.n; k++) {
        /* a tensor-parallel shard is matched by the whole layer's widths (the file's) */
        cdf_linear_layer *l = cdf_layer_index_find(ix, e->target.module[k], NULL);
        if (!l) return 0;
        if (cdf_linear_full_in(l) != e->in) {
            cdf_error(CDF_ERR_SHAPE, "LoRA file %s: '%s' (lora_A [%lld, %lld]) fits no layer: %s.%s takes %lld input features",
                      path, e->source, (long long)e->rank, (long long)e->in, e->target.component, e->target.module[k],
                      (long long)cdf_linear_full_in(l));
            return -1;
        }
        m->layer[k] = l;
        m->row0[k] = rows;
        rows += cdf_linear_full_out(l);
    }
    m->n = e->target.n;
    if (rows != e->out) {
        char list[600] = "";
        for (int k = 0; k < m->n; k++) {
            size_t o = strlen(list);
            snprintf(list + o, sizeof list - o, "%s%s (%lld)", k ? " + " : "", e->target.module[k],
                     (long long)cdf_linear_full_out(m->layer[k]));
        }
        cdf_error(CDF_ERR_SHAPE, "LoRA file %s: '%s' (lora_B [%lld, %lld]) fits no layer: %s.%s has %lld output features", path,
                  e->source, (long long)e->out, (long long)e->rank, e->target.component, list, (long long)rows);
        return -1;
    }
    return 1;
}

static cdf_status unused_error(const char *path, const cdf_lora_file *lf, const char *const *extra, int n_extra,
                               bool warn_only) {
    char list[2048] = "";
    const int total = lf->n_unused + n_extra;
    for (int i = 0; i < total && i < MAX_LISTED; i++) {
        size_t o = strlen(list);
        snprintf(list + o, sizeof list - o, "%s%s", i ? ", " : "", i < lf->n_unused ? lf->unused[i] : extra[i - lf->n_unused]);
    }
    if (total > MAX_LISTED) {
        size_t o = strlen(list);
        snprintf(list + o, sizeof list - o, " and %d more", total - MAX_LISTED);
    }
    if (warn_only) {
        fprintf(stderr, "cdiffusers: warning: LoRA file %s: %d key%s matched no layer of the pipeline and were ignored: %s\n",
                path, total, total == 1 ? "" : "s", list);
        return CDF_OK;
    }
    return cdf_error(CDF_ERR_NOT_FOUND, "LoRA file %s: %d key%s match no layer of the pipeline (allow unused keys to ignore "
                     "them): %s", path, total, total == 1 ? "" : "s", list);
}

/* Device tensors of entry m->e for target k: A [r, in], B rows of target k times alpha/r — of a
 * tensor-parallel shard, only its slices (columns of A for a rowwise shard, rows of B for a
 * colwise one): the device never holds more of the adapter than the shard uses. Over the
 * replicas of one process each replica gets its own rank's slices, as the shard's weight does
 * (cdf_linear_shard_tensor), so the run-time term and the fused delta are each replica's part. */
static cdf_status make_pair(cdf_device *dev, const match *m, int k, cdf_tensor **a, cdf_tensor **b) {
    const cdf_lora_entry *e = m->e;
    const cdf_linear_layer *l = m->layer[k];
    *a = cdf_linear_shard_tensor(l, dev, false, e->a, e->rank, 1.0f);
    *b = *a ? cdf_linear_shard_tensor(l, dev, true, e->b + m->row0[k] * e->rank, e->rank, e->mult) : NULL;
    if (!*b) {
        cdf_tensor_release(*a);
        *a = NULL;
        return cdf_last_status();
    }
    return CDF_OK;
}

static cdf_status apply(const match *ms, int nm, const cdf_lora_params *lp, int id, int *layers) {
    *layers = 0;
    cdf_status s = CDF_OK;
    for (int i = 0; i < nm && s == CDF_OK; i++) {
        const match *m = &ms[i];
        cdf_lora_scales *sc = NULL;
        if (lp->mode == CDF_LORA_RUNTIME) {
            sc = cdf_component_lora_scales(m->c, true);
            if (!sc) return cdf_last_status();
            CDF_TRY(cdf_lora_scales_set(sc, id, lp->scale));
        }
        for (int k = 0; k < m->n && s == CDF_OK; k++) {
            char what[CDF_LORA_NAME_MAX + 64];
            snprintf(what, sizeof what, "'%s' -> %s.%s", m->e->source, m->e->target.component, m->e->target.module[k]);
            cdf_tensor *a, *b;
            s = make_pair(cdf_tensor_device(m->layer[k]->w), m, k, &a, &b);
            if (s != CDF_OK) break;
            const bool rt = lp->mode == CDF_LORA_RUNTIME;
            s = rt ? cdf_lora_attach(sc, m->layer[k], id, a, b, what) : cdf_lora_fuse(m->layer[k], a, b, lp->scale, what);
            /* kept for unload (unfuse) and for offload's re-materialised models; fails only out
             * of host memory */
            if (s == CDF_OK) s = cdf_lora_log_add(cdf_component_lora_log(m->c, !rt), m->e->target.module[k], id, a, b, lp->scale);
            cdf_tensor_release(a);
            cdf_tensor_release(b);
            if (s == CDF_OK) (*layers)++;
        }
        cdf_component_weights_changed(m->c); /* the compiled graphs captured the layers as they were */
    }
    return s;
}

cdf_status cdf_lora_load_into(const cdf_lora_components *cs, const char *path, const cdf_lora_params *params, int id,
                              cdf_lora_info *info) {
    const cdf_lora_params lp = params ? *params : cdf_lora_params_default();
    if (!isfinite(lp.scale)) return cdf_error(CDF_ERR_INVALID_ARG, "LoRA %s: scale %g is not a finite number", path, (double)lp.scale);
    if (lp.mode != CDF_LORA_RUNTIME && lp.mode != CDF_LORA_FUSE)
        return cdf_error(CDF_ERR_INVALID_ARG, "LoRA %s: unknown mode %d (runtime = 0, fuse = 1)", path, (int)lp.mode);
    if (id < 0 || id >= CDF_LORA_MAX_ADAPTERS) return cdf_error(CDF_ERR_LIMIT, "LoRA %s: at most %d adapters", path, CDF_LORA_MAX_ADAPTERS);
    cdf_lora_file *lf = NULL;
    /* the key names depend on the model (FLUX.2's kohya names map to other modules than FLUX.1's) */
    const cdf_component *tr = component_named(cs, "transformer");
    const char *cls = tr ? cdf_component_class_name(tr) : NULL;
    const cdf_lora_family fam = cls && strcmp(cls, "Flux2Transformer2DModel") == 0 ? CDF_LORA_FAMILY_FLUX2 : CDF_LORA_FAMILY_DEFAULT;
    CDF_TRY(cdf_lora_file_load(path, fam, &lf));
    match *ms = calloc((size_t)lf->n + 1, sizeof *ms);
    const char **extra = calloc((size_t)lf->n + 1, sizeof *extra);
    char(*names)[2 * CDF_LORA_NAME_MAX + 48] = calloc((size_t)lf->n + 1, sizeof *names);
    cdf_status s = ms && extra && names ? CDF_OK : cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    /* offload: only the models the file names come back (their layers are matched by name) */
    for (int i = 0; i < lf->n && s == CDF_OK && cs->materialise; i++) {
        cdf_component *c = component_named(cs, lf->e[i].target.component);
        if (c) s = cdf_component_ensure_loaded(c);
    }
    int nm = 0, ne = 0;
    for (int i = 0; i < lf->n && s == CDF_OK; i++) {
        int r = resolve(cs, path, &lf->e[i], &ms[nm]);
        if (r < 0) s = cdf_last_status();
        else if (r > 0) nm++;
        else {
            snprintf(names[ne], sizeof names[ne], "%s (-> %s.%s)", lf->e[i].source, lf->e[i].target.component,
                     lf->e[i].target.module[0]);
            extra[ne] = names[ne];
            ne++;
        }
    }
    if (s == CDF_OK && (lf->n_unused || ne)) s = unused_error(path, lf, extra, ne, lp.allow_unused);
    if (s == CDF_OK && nm == 0) s = cdf_error(CDF_ERR_NOT_FOUND, "LoRA file %s: no key matches a layer of the pipeline", path);
    int layers = 0;
    if (s == CDF_OK) s = apply(ms, nm, &lp, id, &layers);
    if (s == CDF_OK && info) *info = (cdf_lora_info){id, layers, lf->n_unused + ne, lf->format};
    free(names);
    free(extra);
    free(ms);
    cdf_lora_file_free(lf);
    return s;
}

cdf_status cdf_pipeline_load_lora(cdf_pipeline *p, const char *path, const cdf_lora_params *params, cdf_lora_info *info) {
    if (!p || !path) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_pipeline_load_lora: pipeline or path is NULL");
    const cdf_lora_mode mode = params ? params->mode : CDF_LORA_RUNTIME;
    if (p->offload == CDF_OFFLOAD_SEQUENTIAL && mode == CDF_LORA_FUSE)
        return cdf_error(CDF_ERR_UNSUPPORTED, "LoRA %s: fusing with sequential offload is not supported (the transformer's "
                         "block weights stay host-side); use the run-time mode", path);
    if (p->tracking) return cdf_error(CDF_ERR_INVALID_ARG, "LoRA %s: cannot load an adapter during generate", path);
    if (p->n_lora >= (int)(sizeof p->lora_mode / sizeof *p->lora_mode))
        return cdf_error(CDF_ERR_LIMIT, "LoRA %s: at most %d adapters", path, (int)(sizeof p->lora_mode / sizeof *p->lora_mode));
    cdf_lora_components cs = pipeline_components(p);
    /* with offload the models the file names are materialised for the load, the adapters logged
     * on their components (replayed at every later materialisation), and the models released
     * again */
    cs.materialise = p->offload != CDF_OFFLOAD_NONE;
    cdf_status s = cdf_lora_load_into(&cs, path, params, p->n_lora, info);
    /* a failure while applying (out of memory) can leave part of a run-time adapter attached:
     * the id stays taken so that unload removes it */
    if (s == CDF_OK || (mode == CDF_LORA_RUNTIME && cdf_last_status() == CDF_ERR_OUT_OF_MEMORY)) p->lora_mode[p->n_lora++] = mode;
    if (p->offload != CDF_OFFLOAD_NONE) {
        const cdf_status r = cdf_pipeline_set_offload(p, p->offload);
        if (s == CDF_OK) s = r;
    }
    return s;
}

cdf_status cdf_pipeline_set_lora_scale(cdf_pipeline *p, int adapter, float scale) {
    if (!p) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_pipeline_set_lora_scale: pipeline is NULL");
    if (adapter < 0 || adapter >= p->n_lora)
        return cdf_error(CDF_ERR_INVALID_ARG, "LoRA scale: no adapter %d (%d loaded)", adapter, p->n_lora);
    if (p->lora_mode[adapter] == CDF_LORA_FUSE)
        return cdf_error(CDF_ERR_UNSUPPORTED, "LoRA scale: adapter %d was fused into the weights at load; its scale is fixed "
                         "(load it in run-time mode to change it)", adapter);
    if (!isfinite(scale)) return cdf_error(CDF_ERR_INVALID_ARG, "LoRA scale %g is not a finite number", (double)scale);
    if (p->tracking) return cdf_error(CDF_ERR_INVALID_ARG, "LoRA scale: cannot change it during generate");
    const cdf_lora_components cs = pipeline_components(p);
    for (int i = 0; i < cs.n; i++) {
        cdf_lora_scales *sc = cdf_component_lora_scales(cs.c[i], false);
        if (sc) CDF_TRY(cdf_lora_scales_set(sc, adapter, scale));
    }
    return CDF_OK;
}

cdf_status cdf_pipeline_unload_lora(cdf_pipeline *p) {
    if (!p) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_pipeline_unload_lora: pipeline is NULL");
    if (p->tracking) return cdf_error(CDF_ERR_INVALID_ARG, "LoRA unload: cannot unload adapters during generate");
    /* fused adapters: unfuse (diffusers' unfuse_lora + unload_lora_weights), then run-time ones */
    const cdf_lora_components cs = pipeline_components(p);
    cdf_status s = CDF_OK;
    for (int i = 0; i < cs.n; i++) {
        cdf_status e = cdf_component_lora_unfuse(cs.c[i]);
        if (s == CDF_OK) s = e;
        cdf_component_lora_reset(cs.c[i]);
    }
    p->n_lora = 0;
    return s;
}

int cdf_pipeline_lora_count(const cdf_pipeline *p) { return p ? p->n_lora : 0; }
