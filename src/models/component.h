/* models/ — every model is a "component": loaded from its folder (config.json + weights) by
 * class name, run with named inputs, producing named outputs. The names are exactly diffusers'
 * / transformers' forward argument names (hidden_states, encoder_hidden_states, timestep, ...)
 * and the golden io files' output keys (out.sample, out.decode_sample, out.last_hidden_state,
 * ...), so `cdiffusers run-model`, the tests and the pipelines all drive models the same way.
 *
 * A model file defines one `const cdf_component_class` and nothing else public; registry.c
 * lists them (weak references, so a model can be left out of a build). The helpers the model
 * files call are in model_load.c, below registry.c. */
#ifndef CDF_COMPONENT_H
#define CDF_COMPONENT_H

#include "cdiffusers/exec.h"
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
    /* Inputs whose values decide the computation itself (layer lists, position grids): read on the
     * host, so under compile they are static inputs of the graph (compile/compile.h). NULL = none. */
    const char *const *static_inputs;
} cdf_component_class;

typedef struct cdf_component cdf_component;

/* Load the component in folder dir, choosing the class from its config.json. Unknown class:
 * CDF_ERR_UNSUPPORTED naming it and listing the supported ones. */
cdf_status cdf_component_load(const char *dir, const cdf_load_options *opt, cdf_component **out);
cdf_status cdf_component_run(cdf_component *c, const char *method, const cdf_tensor_map *in, cdf_tensor_map *out);
void cdf_component_free(cdf_component *c);
/* A model's own entry point (cdf_clip_text_load, cdf_t5_encoder_load): dir's config.json given to
 * the class's load function; a failure is prefixed "loading <what> from <dir>: ", a NULL dir is
 * an error naming fn. *impl stays NULL on failure. */
cdf_status cdf_component_load_impl(cdf_status (*load)(const char *dir, const struct cJSON *cfg, const cdf_load_options *opt,
                                                      void **impl),
                                   const char *fn, const char *what, const char *dir, const cdf_load_options *opt, void **impl);
/* A model's weights from dir (model_load.c): opened, given to load(w, model), closed again (the
 * loaded tensors are device copies); *dev (when not NULL) set to the weights' device before load
 * runs; with tp, its plan then checked to have been used (cdf_tp_check_plan_used). */
cdf_status cdf_model_load_weights(const char *dir, const cdf_load_options *opt, cdf_status (*load)(cdf_weights *w, void *model),
                                  void *model, cdf_device **dev, const cdf_tp *tp);
const char *cdf_component_class_name(const cdf_component *c);
/* The config's parsed JSON (owned by the component). */
const struct cJSON *cdf_component_config(const cdf_component *c);

/* Compile the component: every later run is captured once per input signature and replayed
 * (see cdiffusers/exec.h). With fullgraph a forward that reads device values on the host fails
 * with CDF_ERR_GRAPH_BREAK naming the read. */
cdf_status cdf_component_compile(cdf_component *c, const cdf_compile_options *opt);
/* Compile only the model's repeated blocks (one graph per block class and input shape, shared by
 * every block instance; weights are graph parameters). Models route block calls through
 * cdf_block_run (compile/compile.h); others simply run uncompiled. */
cdf_status cdf_component_compile_repeated_blocks(cdf_component *c, const cdf_compile_options *opt);
/* Number of graphs compiled for the component (all methods, and repeated blocks). */
int cdf_component_compiled_graphs(const cdf_component *c);

/* ---- model offload (component_offload.c) -------------------------------------------------
 * An offloadable component can release its weights from the device and re-materialise them
 * (class->load again from `dir` with `opt`: the safetensors are mmap'ed, so this is a dtype
 * conversion from the page cache, not disk IO) just before its next run. Enabling wraps the
 * component's class: cdf_component_run and cdf_component_free keep working unchanged; code
 * that needs the model's own class or object uses cdf_component_model_class / _model. */
/* Called before every run of a wrapped component (may release other components). */
typedef cdf_status (*cdf_component_hook)(cdf_component *c, void *user);
/* Make c offloadable (it stays loaded). Calling it again only replaces the hook. */
cdf_status cdf_component_enable_offload(cdf_component *c, const char *dir, const cdf_load_options *opt,
                                        cdf_component_hook before_run, void *user);
bool cdf_component_offload_enabled(const cdf_component *c);
/* Release the weights (waits for queued ops first; drops compiled graphs). No-op if released. */
cdf_status cdf_component_offload(cdf_component *c);
/* Re-materialise the weights if they are released. */
cdf_status cdf_component_ensure_loaded(cdf_component *c);
bool cdf_component_is_loaded(const cdf_component *c);
/* Sequential offload: the weights of the model's repeated blocks stay host-side (in the mapped
 * checkpoint) and each block call materialises its own (compile/compile.c, cdf_block_run). Changing
 * it releases the model (the next run materialises it the new way). A component compiled whole
 * (cdf_component_compile) switches to repeated-block compile while it is on, and back after. */
cdf_status cdf_component_set_blocks_on_host(cdf_component *c, bool on);
/* Device bytes the weights took at their last materialisation (offloadable components; else 0). */
uint64_t cdf_component_resident_bytes(const cdf_component *c);
/* Materialisations so far, the initial load included. */
int cdf_component_load_count(const cdf_component *c);
/* The model's own class / object (NULL while offloaded), wrapped or not. */
const cdf_component_class *cdf_component_model_class(const cdf_component *c);
void *cdf_component_model(const cdf_component *c);

/* ---- LoRA (pipelines/lora.c attaches adapters through these) ------------------------------ */
struct cdf_layer_index;
struct cdf_lora_scales;
/* The loaded model's linear layers by module name ("transformer_blocks.0.attn.to_q"). */
struct cdf_layer_index *cdf_component_layers(cdf_component *c);
/* The run-time adapters' scales; created on first use with create (NULL on failure, error set). */
struct cdf_lora_scales *cdf_component_lora_scales(cdf_component *c, bool create);
/* Remove every run-time adapter and drop the compiled graphs (they captured the old layers). */
void cdf_component_lora_reset(cdf_component *c);
/* The logs of adapters fused into this component's weights / attached at run time (nn/lora.h),
 * for adding to. */
struct cdf_lora_log **cdf_component_lora_log(cdf_component *c, bool fused);
/* After a (re-)materialisation: apply the logged adapters to the new layers (fused first, then
 * the run-time ones, each in load order). */
cdf_status cdf_component_lora_replay(cdf_component *c);
/* Take every fused adapter out of the weights again (diffusers' unfuse_lora) and drop the
 * compiled graphs: each fused layer's weight is read again from the folder/file and with the
 * load options the component was loaded with (its own slice for a tensor-parallel shard), bit for
 * bit; where that fails, W -= s B A, the last fused first (a warning; one rounding). A released
 * (offloaded) model only forgets them (its next materialisation reads the original weights).
 * Nothing to do is CDF_OK. */
cdf_status cdf_component_lora_unfuse(cdf_component *c);
/* Drop compiled graphs after the weights changed in place of the old ones (fused LoRA). */
void cdf_component_weights_changed(cdf_component *c);

/* Helpers for model code: a required input (error names it) / an optional one. */
cdf_tensor *cdf_input(const cdf_tensor_map *in, const char *name, const char *model);
static inline cdf_tensor *cdf_input_opt(const cdf_tensor_map *in, const char *name) { return cdf_tensor_map_get(in, name); }

#endif
