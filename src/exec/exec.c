#include "exec/exec.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "core/error_internal.h"

static atomic_ullong g_ops, g_kernels, g_syncs;

cdf_node *cdf_node_new(cdf_op_kind kind) {
    cdf_node *n = calloc(1, sizeof *n);
    if (!n) {
        cdf_error(CDF_ERR_OUT_OF_MEMORY, "host out of memory (op node)");
        return NULL;
    }
    n->kind = kind;
    return n;
}

void cdf_node_add_src(cdf_node *n, cdf_tensor *t) {
    if (n->n_src < CDF_NODE_MAX_SRC) n->src[n->n_src++] = cdf_tensor_retain(t);
}

void cdf_node_free(cdf_node *n) {
    if (!n) return;
    for (int i = 0; i < n->n_src; i++) cdf_tensor_release(n->src[i]);
    cdf_tensor_release(n->dst);
    free(n);
}

cdf_status cdf_exec_submit(cdf_node *node) {
    cdf_device *dev = node->dst->storage->dev;
    for (int i = 0; i < node->n_src; i++) {
        if (node->src[i] && node->src[i]->storage->dev != dev) {
            cdf_status s = cdf_error(CDF_ERR_DEVICE, "%s: operands live on different devices (%s and %s)",
                                     cdf_op_name(node->kind), cdf_device_name(dev),
                                     cdf_device_name(node->src[i]->storage->dev));
            cdf_node_free(node);
            return s;
        }
    }
    atomic_fetch_add(&g_ops, 1);
    atomic_fetch_add(&g_kernels, 1);
    return cdf_device_enqueue(dev, node);
}

cdf_status cdf_exec_sync_for_read(const cdf_tensor *t) {
    atomic_fetch_add(&g_syncs, 1);
    return cdf_device_synchronize(t->storage->dev);
}

void cdf_exec_get_counters(cdf_exec_counters *out) {
    out->ops_submitted = atomic_load(&g_ops);
    out->kernels_launched = atomic_load(&g_kernels);
    out->host_syncs = atomic_load(&g_syncs);
}

void cdf_exec_reset_counters(void) {
    atomic_store(&g_ops, 0);
    atomic_store(&g_kernels, 0);
    atomic_store(&g_syncs, 0);
}
