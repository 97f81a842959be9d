/* exec/ — decides what happens to each op node, by execution mode.
 *  eager (default): the node is enqueued on its device's in-order queue at once.
 *  (defer-and-fuse and compile record nodes instead; see issue #4.) */
#ifndef CDF_EXEC_H
#define CDF_EXEC_H

#include "graph/node.h"

/* Take ownership of a fully built node (dst allocated, sources retained) and run it. On
 * failure the node is freed and the error set. */
cdf_status cdf_exec_submit(cdf_node *node);
/* Called before the host reads t: waits for (or flushes and waits for) its producer. */
cdf_status cdf_exec_sync_for_read(const cdf_tensor *t);

typedef struct cdf_exec_counters {
    uint64_t ops_submitted;   /* op nodes created by the tensor API */
    uint64_t kernels_launched; /* kernels handed to a device queue */
    uint64_t host_syncs;      /* host reads that waited on a device */
} cdf_exec_counters;
void cdf_exec_get_counters(cdf_exec_counters *out);
void cdf_exec_reset_counters(void);

#endif
