/* compile for components: a graph cache per method in front of the class's run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "compile/compile.h"
#include "models/component_impl.h"
#include "nn/lora.h"

/* the step caches' parts of a transformer (docs/step-caches.md) are graphs of their own */
static const char *const k_methods[CDF_COMPONENT_METHODS] = {"forward", "encode", "decode", "fbc_head",
                                                             "fbc_tail", "fbc_skip", "cache_full", "cache_embed",
                                                             "taylor_update", "taylor_predict"};

cdf_status cdf_component_compile(cdf_component *c, const cdf_compile_options *opt) {
    if (!c) return cdf_error(CDF_ERR_INVALID_ARG, "compile: component is NULL");
    cdf_compile_options o = opt ? *opt : cdf_compile_options_default();
    if (o.dynamic) return cdf_error(CDF_ERR_UNSUPPORTED, "compile: dynamic=true is not supported (graphs are static per input shape)");
    /* compile follows the component's device: the backend option may only name a backend of
     * this build (the device the weights are on decides where the graphs run) */
    if (o.backend && *o.backend) {
        bool known = false;
        for (int i = 0; i < cdf_backend_compiled_count(); i++) known |= strcmp(cdf_backend_compiled_name(i), o.backend) == 0;
        if (!known) return cdf_error(CDF_ERR_UNSUPPORTED, "compile: backend '%s' is not in this build (see cdiffusers devices)", o.backend);
    }
    cdf_component_drop_graphs(c);
    c->compile_opt = o;
    c->compiled = true;
    return CDF_OK;
}

void cdf_component_drop_graphs(cdf_component *c) {
    for (int i = 0; i < CDF_COMPONENT_METHODS; i++) {
        cdf_graph_cache_free(c->graphs[i]);
        c->graphs[i] = NULL;
    }
    cdf_block_caches_free(c->blocks);
    c->blocks = NULL;
}

cdf_status cdf_component_compile_repeated_blocks(cdf_component *c, const cdf_compile_options *opt) {
    if (!c) return cdf_error(CDF_ERR_INVALID_ARG, "compile: component is NULL");
    cdf_compile_options o = opt ? *opt : cdf_compile_options_default();
    if (o.dynamic) return cdf_error(CDF_ERR_UNSUPPORTED, "compile: dynamic=true is not supported (graphs are static per input shape)");
    cdf_component_drop_graphs(c);
    c->compiled = false;
    c->blocks = cdf_block_caches_new(&o);
    return c->blocks ? CDF_OK : cdf_last_status();
}

int cdf_component_compiled_graphs(const cdf_component *c) {
    int n = 0;
    for (int i = 0; c && i < CDF_COMPONENT_METHODS; i++) n += cdf_graph_cache_size(c->graphs[i]);
    return n + (c ? cdf_block_caches_graphs(c->blocks) : 0);
}

typedef struct run_ctx {
    cdf_component *c;
    const char *method;
} run_ctx;

static cdf_status run_adapter(void *ctx, const cdf_tensor_map *in, cdf_tensor_map *out) {
    run_ctx *r = ctx;
    return r->c->cls->run(r->c->impl, r->method, in, out);
}

cdf_status cdf_component_run_compiled(cdf_component *c, const char *method, const cdf_tensor_map *in, cdf_tensor_map *out) {
    int m = 0;
    while (m < CDF_COMPONENT_METHODS && strcmp(k_methods[m], method) != 0) m++;
    if (m == CDF_COMPONENT_METHODS) return c->cls->run(c->impl, method, in, out); /* unknown method: the class reports it */
    if (!c->graphs[m]) {
        char name[200];
        snprintf(name, sizeof name, "%s.%s", c->class_name, method);
        c->graphs[m] = cdf_graph_cache_new(name, &c->compile_opt);
        if (!c->graphs[m]) return cdf_last_status();
        if (cdf_graph_cache_set_static_inputs(c->graphs[m], c->cls->static_inputs) != CDF_OK) {
            cdf_graph_cache_free(c->graphs[m]);
            c->graphs[m] = NULL;
            return cdf_last_status();
        }
    }
    run_ctx r = {c, method};
    /* run-time LoRA scales are parameters, not constants: a new scale replays the same graph */
    cdf_tensor *scales[64];
    const int ns = cdf_lora_scales_tensors(c->lora_scales, scales, 64);
    if (ns > 64) return cdf_error(CDF_ERR_LIMIT, "compile: %d distinct LoRA scale sets (at most 64)", ns);
    return cdf_graph_cache_run(c->graphs[m], run_adapter, &r, in, out, ns ? scales : NULL, ns);
}

/* CDIFFUSERS_COMPILE=1 compiles every component at load (fullgraph off: modules with host reads,
 * like the text encoders, run eagerly after their first graph break). Used to run whole test
 * suites in compile mode. */
cdf_status cdf_component_apply_env_compile(cdf_component *c) {
    const char *v = getenv("CDIFFUSERS_COMPILE");
    if (!v || !*v || strcmp(v, "0") == 0) return CDF_OK;
    cdf_compile_options o = cdf_compile_options_default();
    o.fullgraph = strcmp(v, "fullgraph") == 0;
    if (strcmp(v, "blocks") == 0) return cdf_component_compile_repeated_blocks(c, &o);
    return cdf_component_compile(c, &o);
}
