/* Private layout of a loaded component, for the files that extend components (registry,
 * offload, compile) without widening the public component API. */
#ifndef CDF_COMPONENT_IMPL_H
#define CDF_COMPONENT_IMPL_H

#include <cjson/cJSON.h>

#include "cdiffusers/exec.h"
#include "models/component.h"
#include "nn/nn.h"

/* methods with a graph cache of their own under compile (component_compile.c) */
#define CDF_COMPONENT_METHODS 10

struct cdf_component {
    const cdf_component_class *cls;
    void *impl; /* NULL while offloaded (weights released) */
    cJSON *cfg;
    char class_name[128];
    /* compile (cdf_component_compile): one graph cache per method ("forward", "encode",
     * "decode", the step caches' "fbc_head", "fbc_tail", "fbc_skip", "cache_full", "cache_embed", "taylor_update", "taylor_predict"), NULL when the component runs uncompiled */
    bool compiled;
    cdf_compile_options compile_opt;
    struct cdf_graph_cache *graphs[CDF_COMPONENT_METHODS]; /* per method (component_compile.c) */
    /* compile_repeated_blocks: the block graphs, active on the thread while the model runs */
    struct cdf_block_caches *blocks;
    /* LoRA (nn/lora.h): the model's linear layers by module name (filled by every load), and the
     * run-time adapters' scales (NULL until an adapter is attached); whole-model compile binds
     * the scale tensors as graph parameters */
    struct cdf_layer_index *layers;
    struct cdf_lora_scales *lora_scales;
    /* the adapters applied, fused and at run time (NULL if none): fused ones for undoing them,
     * both for re-applying them when offload re-materialises the model */
    struct cdf_lora_log *lora_fused, *lora_runtime;
    /* where the weights came from and how they were loaded (no layer index, no report): undoing
     * a fused adapter reads a layer's original weight again (cdf_component_lora_unfuse) */
    char *dir, *weights_file;
    cdf_load_options load_opt;
    /* after offload re-materialises the model: its adapters applied again. Set by
     * cdf_component_load to cdf_component_lora_replay (registry.c), so that component_offload.c,
     * below the registry, calls up through this hook and not by name. */
    cdf_status (*reapply)(cdf_component *c);
};

/* component_compile.c */
cdf_status cdf_component_run_compiled(cdf_component *c, const char *method, const cdf_tensor_map *in, cdf_tensor_map *out);
void cdf_component_drop_graphs(cdf_component *c);
cdf_status cdf_component_apply_env_compile(cdf_component *c);

#endif
