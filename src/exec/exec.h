/* exec/ — decides what happens to each op node, by execution mode (see cdiffusers/exec.h):
 * eager enqueues it on its device at once; defer-and-fuse appends it to the thread's pending
 * graph, which graph/fuse.c optimises at the next sync point. */
#ifndef CDF_EXEC_H
#define CDF_EXEC_H

#include "cdiffusers/exec.h"
#include "exec/stats.h" /* the counters */
#include "graph/node.h"

/* Take ownership of a fully built node (dst allocated, sources retained) and run or record
 * it. On failure the node is freed and the error set. */
cdf_status cdf_exec_submit(cdf_node *node);
/* Called before the host reads t: flushes pending ops and waits for the device. */
cdf_status cdf_exec_sync_for_read(const cdf_tensor *t);
/* Called by cdf_scope_pop after it released the scope's tensors: runs the pending graph when
 * the scope left enough of its outputs unreferenced (exec.c), so that a model block's graph is
 * fused whole. */
cdf_status cdf_exec_scope_closed(void);
/* Flushes this thread's pending ops and waits until every device's queue is empty (a queued
 * op, e.g. a collective, is then running nowhere); returns the first error either found. */
cdf_status cdf_exec_drain_all(void);

/* Set by the layer that streams sequential offload's weights (compile/weight_stream.c): called for
 * every submitted node to rebind host-side block weights to their device copies (a hook, like the
 * backend's pre-OOM hook, so that exec/ does not depend on the layers above it). */
extern cdf_status (*cdf_exec_bind_hook)(cdf_node *n);

#endif
