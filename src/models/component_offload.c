/* Model offload for one component: its weights can be released from the device and
 * re-materialised from the component folder just before the next run.
 *
 * Design: the weights' "host" copy is the component's safetensors files (memory-mapped, so after
 * the first load they sit in the page cache): re-materialising is a conversion to the load
 * policy's dtype, not disk IO. Releasing frees the model (class->free), re-materialising runs
 * class->load again with the same folder and options; the parsed config stays with the
 * component. The same bytes converted the same way give bit-identical weights, so outputs do
 * not depend on whether a model was offloaded in between.
 *
 * Mechanism: an offloadable component gets a wrapper class. Its run() calls the owner's hook
 * (the pipeline releases the other models there), materialises the model if it is offloaded and
 * forwards to the real class; free() releases both. cdf_component_run / cdf_component_free need
 * no change and every caller (pipelines, CLI) gets offload transparently. */
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "compile/compile.h"
#include "models/component_impl.h"
#include "nn/lora.h"
#include "tensor/tensor_impl.h"

typedef struct offload_state {
    const cdf_component_class *inner; /* the model's own class */
    void *inner_impl;                 /* NULL while offloaded */
    char *dir;
    cdf_load_options opt;
    cdf_component_hook before_run;
    void *hook_user;
    cdf_component *owner;
    uint64_t resident_bytes; /* device bytes the weights took at the last materialisation */
    int loads;               /* materialisations, the first (cdf_component_load's) included */
    bool was_compiled;       /* compiled whole before sequential offload switched it to blocks */
} offload_state;

static cdf_status wrapped_load(const char *dir, const struct cJSON *cfg, const cdf_load_options *opt, void **impl) {
    (void)dir, (void)cfg, (void)opt, (void)impl;
    return cdf_error(CDF_ERR_INTERNAL, "the offload wrapper class is never loaded by name");
}

static void wrapped_free(void *impl) {
    offload_state *st = impl;
    if (!st) return;
    if (st->inner_impl) st->inner->free(st->inner_impl);
    free(st->dir);
    free(st);
}

static cdf_device *state_device(const offload_state *st) { return st->opt.device ? st->opt.device : cdf_device_default(); }

static cdf_status materialise(offload_state *st) {
    if (st->inner_impl) return CDF_OK;
    cdf_device *dev = state_device(st);
    if (!dev) return cdf_last_status();
    cdf_memory_stats before, after;
    cdf_device_memory_stats(dev, &before);
    /* Loading runs inside the caller's tensor scope (cdf_component_run pushed one): tensors a
     * loader creates must not be recorded there, or the scope would release what the model
     * keeps. A plain load runs with no scope at all; this makes the reload behave the same
     * (no loader opens scopes of its own, which suppression would stop from releasing). */
    cdf_scope_suppress(1);
    void *impl = NULL;
    cdf_status s = st->inner->load(st->dir, st->owner->cfg, &st->opt, &impl);
    cdf_scope_suppress(-1);
    if (s != CDF_OK) {
        /* layers a failed load registered went with it; the pipeline's prefetch (offload.c) may
         * retry after the previous model is released */
        cdf_layer_index_clear(st->owner->layers);
        return cdf_error_prefix("re-materialising %s from %s: ", st->owner->class_name, st->dir);
    }
    st->inner_impl = impl;
    st->loads++;
    /* the adapters the released model had (pipelines/lora.c logs them) */
    s = st->owner->reapply ? st->owner->reapply(st->owner) : CDF_OK;
    if (s != CDF_OK) {
        cdf_layer_index_clear(st->owner->layers);
        st->inner->free(impl);
        st->inner_impl = NULL;
        return cdf_error_prefix("re-materialising %s from %s: ", st->owner->class_name, st->dir);
    }
    cdf_device_memory_stats(dev, &after);
    st->resident_bytes = after.current_bytes > before.current_bytes ? after.current_bytes - before.current_bytes : 0;
    return CDF_OK;
}

static cdf_status wrapped_run(void *impl, const char *method, const cdf_tensor_map *in, cdf_tensor_map *out) {
    offload_state *st = impl;
    if (st->before_run) CDF_TRY(st->before_run(st->owner, st->hook_user));
    CDF_TRY(materialise(st));
    return st->inner->run(st->inner_impl, method, in, out);
}

/* One class for every wrapped component (the model's own class is in the state). */
static const cdf_component_class k_offload_class = {
    .names = (const char *const[]){"(offload wrapper)", NULL},
    .load = wrapped_load,
    .free = wrapped_free,
    .run = wrapped_run,
};

static offload_state *state_of(const cdf_component *c) {
    return (c && c->cls == &k_offload_class) ? (offload_state *)c->impl : NULL;
}

cdf_status cdf_component_enable_offload(cdf_component *c, const char *dir, const cdf_load_options *opt,
                                        cdf_component_hook before_run, void *user) {
    if (!c || !dir) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_component_enable_offload: NULL component or folder");
    offload_state *st = state_of(c);
    if (st) { /* already wrapped: update the hook only */
        st->before_run = before_run;
        st->hook_user = user;
        return CDF_OK;
    }
    if (!c->impl) return cdf_error(CDF_ERR_INVALID_ARG, "%s: component has no loaded model to wrap", c->class_name);
    st = calloc(1, sizeof *st);
    char *d = strdup(dir);
    if (!st || !d) {
        free(st);
        free(d);
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    }
    st->inner = c->cls;
    st->inner_impl = c->impl;
    st->dir = d;
    st->opt = opt ? *opt : cdf_load_options_default();
    st->opt.layers = c->layers; /* a re-materialised model registers its layers again */
    st->before_run = before_run;
    st->hook_user = user;
    st->owner = c;
    st->loads = 1;
    c->cls = &k_offload_class;
    c->impl = st;
    return CDF_OK;
}

const cdf_component_class *cdf_component_model_class(const cdf_component *c) {
    const offload_state *st = state_of(c);
    return st ? st->inner : (c ? c->cls : NULL);
}

void *cdf_component_model(const cdf_component *c) {
    const offload_state *st = state_of(c);
    return st ? st->inner_impl : (c ? c->impl : NULL);
}

bool cdf_component_offload_enabled(const cdf_component *c) { return state_of(c) != NULL; }

bool cdf_component_is_loaded(const cdf_component *c) {
    const offload_state *st = state_of(c);
    return st ? st->inner_impl != NULL : (c && c->impl != NULL);
}

cdf_status cdf_component_offload(cdf_component *c) {
    offload_state *st = state_of(c);
    if (!st) return cdf_error(CDF_ERR_INVALID_ARG, "%s: offload is not enabled for this component",
                              c ? c->class_name : "(null)");
    if (!st->inner_impl) return CDF_OK;
    /* buffers still read by queued ops are freed when those ops finish; waiting here makes the
     * memory available to whatever is loaded next (and surfaces a queued error now) */
    cdf_device *dev = state_device(st);
    if (dev) CDF_TRY(cdf_device_synchronize(dev));
    /* compiled whole-model graphs hold the weights as constants: drop them, the next run
     * recaptures. Repeated-block graphs are kept: they bind their weights per call (a plan keeps
     * no reference to a weight's buffer, compile.c's unpin_params) and hold no device memory
     * (each replay allocates its arena), so the re-materialised model replays them and a second
     * call with the same shapes compiles nothing (as diffusers' compile_repeated_blocks with
     * enable_model_cpu_offload). */
    if (c->compiled) cdf_component_drop_graphs(c);
    cdf_layer_index_clear(c->layers); /* the layers go with the model */
    st->inner->free(st->inner_impl);
    st->inner_impl = NULL;
    return CDF_OK;
}

cdf_status cdf_component_ensure_loaded(cdf_component *c) {
    offload_state *st = state_of(c);
    if (!st) return c ? CDF_OK : cdf_error(CDF_ERR_INVALID_ARG, "cdf_component_ensure_loaded: component is NULL");
    return materialise(st);
}

uint64_t cdf_component_resident_bytes(const cdf_component *c) {
    const offload_state *st = state_of(c);
    return st ? st->resident_bytes : 0;
}

int cdf_component_load_count(const cdf_component *c) {
    const offload_state *st = state_of(c);
    return st ? st->loads : 1;
}

cdf_status cdf_component_set_blocks_on_host(cdf_component *c, bool on) {
    offload_state *st = state_of(c);
    if (!st) return cdf_error(CDF_ERR_INVALID_ARG, "%s: offload is not enabled for this component", c ? c->class_name : "(null)");
    if (st->opt.blocks_on_host != on) {
        CDF_TRY(cdf_component_offload(c));
        st->opt.blocks_on_host = on;
    }
    if (on && c->compiled) {
        /* a whole-forward graph would hold every block's weights as constants */
        cdf_compile_options o = c->compile_opt;
        CDF_TRY(cdf_component_compile_repeated_blocks(c, &o));
        st->was_compiled = true;
    } else if (!on && st->was_compiled) {
        cdf_compile_options o = c->compile_opt;
        CDF_TRY(cdf_component_compile(c, &o));
        st->was_compiled = false;
    }
    return CDF_OK;
}
