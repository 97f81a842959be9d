/* compile/weight_stream — sequential offload's weight streaming. A transformer block whose weights
 * are host-side (nn/weights.c: bytes in the memory-mapped checkpoint, no device memory) runs
 * through cdf_weight_stream_run: a device copy of each of its weights is made (converted as a
 * resident load converts it) just before the block, bound in place of the host-side tensor for
 * the block's ops (cdf_exec_bind_host_weights), and released after; at most a window of blocks'
 * copies exists at once (CDIFFUSERS_SEQUENTIAL_WINDOW). Uploads are queued on the device's copy
 * stream (converted on the host first) and the compute stream waits for them, on the device,
 * before the block's first op: the next block's weights are converted and uploaded while the
 * device still computes the current one. */
#ifndef CDF_EXEC_WEIGHT_STREAM_H
#define CDF_EXEC_WEIGHT_STREAM_H

#include "compile/traced.h"

/* Run fn (a block) with its host-side weights materialised; through run(cache, ...) (repeated-block
 * compile: compile.c passes cdf_graph_cache_run, and the copies are bound as the graph's
 * parameters) or directly when cache is NULL. */
cdf_status cdf_weight_stream_run(cdf_graph_cache_run_fn run, cdf_graph_cache *cache, cdf_traced_fn fn, void *ctx,
                                 const struct cdf_tensor_map *in, struct cdf_tensor_map *out, cdf_tensor *const *weights,
                                 int n_weights);

#endif
