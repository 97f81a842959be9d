/* compile/traced — the types compile.c's graph caches and weight_stream.c's streaming share (a
 * folder's shared declarations: no .c of this name), so that weight_stream.c needs nothing of
 * compile.c's and compile.c calls down into it alone. */
#ifndef CDF_COMPILE_TRACED_H
#define CDF_COMPILE_TRACED_H

#include "cdiffusers/error.h"
#include "cdiffusers/tensor.h"

typedef struct cdf_graph_cache cdf_graph_cache;

#define CDF_COMPILE_MAX_PARAMS 512 /* named inputs + block weights bound per call */

/* One forward: fn(ctx, inputs, outputs) with named inputs/outputs (tensor maps). */
struct cdf_tensor_map;
typedef cdf_status (*cdf_traced_fn)(void *ctx, const struct cdf_tensor_map *in, struct cdf_tensor_map *out);

/* How a block runs through a graph cache (cdf_graph_cache_run's shape): fn through cache c, with
 * extra_params bound as the graph's parameters. */
typedef cdf_status (*cdf_graph_cache_run_fn)(cdf_graph_cache *c, cdf_traced_fn fn, void *ctx, const struct cdf_tensor_map *in,
                                             struct cdf_tensor_map *out, cdf_tensor *const *extra_params, int n_extra);

#endif
