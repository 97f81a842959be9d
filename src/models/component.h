/* models/ — every model is a "component": loaded from its folder (config.json + weights) by
 * class name, run with named inputs, producing named outputs. The names are exactly diffusers'
 * / transformers' forward argument names (hidden_states, encoder_hidden_states, timestep, ...)
 * and the golden io files' output keys (out.sample, out.decode_sample, out.last_hidden_state,
 * ...), so `cdiffusers run-model`, the tests and the pipelines all drive models the same way.
 *
 * A model file defines one `const cdf_component_class` and nothing else public; registry.c
 * lists them (weak references, so a model can be left out of a build). */
#ifndef CDF_COMPONENT_H
#define CDF_COMPONENT_H

#include "nn/nn.h"

typedef struct cdf_component_class {
    /* config.json "_class_name" / architectures[0] values this class loads (NULL-terminated) */
    const char *const *names;
    /* Parse cfg, load weights from dir. On failure set the error and return it (impl untouched). */
    cdf_status (*load)(const char *dir, const struct cJSON *cfg, const cdf_load_options *opt, void **impl);
    void (*free)(void *impl);
    /* One forward. method: "forward" (default), "encode" or "decode" (VAEs). Reads inputs by
     * name from `in` (absent = None), writes outputs into `out` under "out.<name>". Runs inside
     * a tensor scope owned by the caller. */
    cdf_status (*run)(void *impl, const char *method, const cdf_tensor_map *in, cdf_tensor_map *out);
} cdf_component_class;

typedef struct cdf_component cdf_component;

/* Load the component in folder dir, choosing the class from its config.json. Unknown class:
 * CDF_ERR_UNSUPPORTED naming it and listing the supported ones. */
cdf_status cdf_component_load(const char *dir, const cdf_load_options *opt, cdf_component **out);
cdf_status cdf_component_run(cdf_component *c, const char *method, const cdf_tensor_map *in, cdf_tensor_map *out);
void cdf_component_free(cdf_component *c);
const char *cdf_component_class_name(const cdf_component *c);
/* The config's parsed JSON (owned by the component). */
const struct cJSON *cdf_component_config(const cdf_component *c);

/* Helpers for model code: a required input (error names it) / an optional one. */
cdf_tensor *cdf_input(const cdf_tensor_map *in, const char *name, const char *model);
static inline cdf_tensor *cdf_input_opt(const cdf_tensor_map *in, const char *name) { return cdf_tensor_map_get(in, name); }

#endif
