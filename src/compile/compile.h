/* compile/ — capture a forward as a static graph per input signature and replay it.
 *
 * Tracing: while a capture is active on a thread, cdf_exec_submit records nodes instead of
 * running them, and a host read (the only thing that needs a value on the host) is a graph
 * break: an error naming the read when fullgraph is set, otherwise the capture is abandoned,
 * what was recorded runs eagerly, and this signature is remembered as not compilable.
 * A finished capture becomes a plan: the nodes (after the fusion pass) with the traced input
 * buffers marked as parameters. Replaying binds new input buffers in their place, reuses the
 * plan's intermediate buffers (allocated once, at capture) and copies the outputs out. */
#ifndef CDF_COMPILE_COMPILE_H
#define CDF_COMPILE_COMPILE_H

#include "cdiffusers/exec.h"
#include "exec/capture.h"
#include "compile/traced.h" /* cdf_graph_cache, cdf_traced_fn, CDF_COMPILE_MAX_PARAMS */
#include "graph/node.h"

cdf_graph_cache *cdf_graph_cache_new(const char *name, const cdf_compile_options *opt);
void cdf_graph_cache_free(cdf_graph_cache *c);
int cdf_graph_cache_size(const cdf_graph_cache *c);

/* Inputs (by name) whose values select the graph, like torch.compile's specialisation on Python
 * ints: small integer tensors such as a list of layer indices or position ids. Their values are
 * read on the host before a capture and become part of the key, and the forward may read them
 * during the capture without a graph break (a new value compiles a new plan). */
cdf_status cdf_graph_cache_set_static_inputs(cdf_graph_cache *c, const char *const *names);

/* Run fn through the cache: replay the plan for the inputs' signature, or capture one. The
 * signature covers every input's name, dtype and shape (and the values of static inputs). `extra_params` (may be NULL/0) are
 * tensors that are NOT named inputs but must be treated as parameters rather than constants
 * (weights of a repeated block): they are part of the binding, not of the key. */
cdf_status cdf_graph_cache_run(cdf_graph_cache *c, cdf_traced_fn fn, void *ctx, const struct cdf_tensor_map *in,
                               struct cdf_tensor_map *out, cdf_tensor *const *extra_params, int n_extra);

/* ---- repeated-block compile ------------------------------------------------------------
 * A model routes each call of a repeated block (FluxTransformerBlock, JointTransformerBlock,
 * ...) through cdf_block_run with the block's weights listed explicitly. When the running
 * component has repeated-block compile on, the first call per (block class, input signature)
 * captures a graph and every other instance replays it with its own weights bound as
 * parameters: one compile per block class and shape, however many blocks. Otherwise the block
 * simply runs. */
typedef struct cdf_block_caches cdf_block_caches;
cdf_block_caches *cdf_block_caches_new(const cdf_compile_options *opt);
void cdf_block_caches_free(cdf_block_caches *bc);
int cdf_block_caches_graphs(const cdf_block_caches *bc); /* graphs compiled, all classes */
/* Free every graph (and its arena); the set stays usable and recaptures on the next call. */
void cdf_block_caches_clear(cdf_block_caches *bc);
/* Make bc the active set for this thread (NULL = none); returns the previous one. */
cdf_block_caches *cdf_block_caches_activate(cdf_block_caches *bc);
cdf_status cdf_block_run(const char *block_class, cdf_traced_fn fn, void *ctx, const struct cdf_tensor_map *in,
                         struct cdf_tensor_map *out, cdf_tensor *const *weights, int n_weights);

/* Sequential offload (exec.c calls it for every submitted op, through cdf_exec_bind_hook): operands
 * that are host-side block weights are rebound to the device copies cdf_block_run made for the
 * running block; an error
 * naming the op if one is used outside its block. */
cdf_status cdf_exec_bind_host_weights(cdf_node *n);

#endif
