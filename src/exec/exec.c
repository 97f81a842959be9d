/* Execution modes: eager enqueue, or record + fuse + enqueue at sync points. */
#include "exec/exec.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "core/error_internal.h"
#include "exec/capture.h"
#include "graph/fuse.h"

/* When a pending graph is executed. Every recorded op's output is allocated when it is recorded;
 * what deferring costs in memory is the outputs nothing outside the graph refers to any more
 * (eager execution would have run and freed them): the graph's "held" bytes. The pending graph
 * runs when it reaches PENDING_MAX_NODES ops, when its held bytes reach PENDING_MAX_HELD (checked
 * every PENDING_CHECK_BYTES of recorded outputs), and at the close of a scope that leaves at
 * least PENDING_SCOPE_HELD of them (cdf_exec_scope_closed): a model block's scope, whose
 * intermediates have just become unreachable. That is where fusion can take every chain: an
 * intermediate the model still holds (its block's scope not closed yet) cannot be fused away. A
 * flush on recorded bytes alone came mid-block (one SD3.5-M block at 512² writes ~280 MB), and the
 * chains after it stayed unfused. */
#define PENDING_MAX_NODES 2048
#define PENDING_MAX_HELD ((size_t)256 << 20)
#define PENDING_CHECK_BYTES ((size_t)64 << 20)
#define PENDING_SCOPE_HELD ((size_t)64 << 20)

static atomic_int g_mode = -1;

typedef struct pending_graph {
    cdf_node **nodes;
    int n, cap;
    size_t bytes;      /* recorded outputs */
    size_t next_check; /* bytes at which the held bytes are counted next */
    cdf_status failed; /* a flush at a scope's close failed: the next op or sync reports it */
    char why[256];
} pending_graph;
static _Thread_local pending_graph tl_pending;

static cdf_exec_mode mode_now(void) {
    int m = atomic_load(&g_mode);
    if (m < 0) {
        const char *f = getenv("CDIFFUSERS_DEFER_AND_FUSE");
        const char *e = getenv("CDIFFUSERS_EAGER_MODE");
        m = CDF_EXEC_EAGER;
        if (f && (strcmp(f, "1") == 0 || strcmp(f, "true") == 0 || strcmp(f, "on") == 0)) m = CDF_EXEC_DEFER_AND_FUSE;
        if (e && strcmp(e, "defer_never") == 0) m = CDF_EXEC_EAGER; /* explicit eager wins */
        int expected = -1;
        atomic_compare_exchange_strong(&g_mode, &expected, m);
        m = atomic_load(&g_mode);
    }
    return (cdf_exec_mode)m;
}

cdf_exec_mode cdf_exec_get_mode(void) { return mode_now(); }

const char *cdf_exec_mode_name(cdf_exec_mode m) {
    return m == CDF_EXEC_DEFER_AND_FUSE ? "defer-and-fuse" : "eager";
}

cdf_status cdf_exec_set_mode(cdf_exec_mode m) {
    if (m != CDF_EXEC_EAGER && m != CDF_EXEC_DEFER_AND_FUSE) return cdf_error(CDF_ERR_INVALID_ARG, "unknown execution mode %d", (int)m);
    CDF_TRY(cdf_exec_flush());
    atomic_store(&g_mode, (int)m);
    return CDF_OK;
}

static cdf_status launch(cdf_node *node) {
    atomic_fetch_add(&cdf_exec_counters.kernels, 1);
    return cdf_device_enqueue(node->dst->storage->dev, node);
}

cdf_status cdf_exec_flush(void) {
    pending_graph *pg = &tl_pending;
    if (pg->failed != CDF_OK) { /* the ops after the failed one never ran: whatever reads them fails */
        const cdf_status f = pg->failed;
        pg->failed = CDF_OK;
        for (int i = 0; i < pg->n; i++) cdf_node_free(pg->nodes[i]);
        pg->n = 0;
        pg->bytes = pg->next_check = 0;
        return cdf_error(f, "%s", pg->why);
    }
    if (pg->n == 0) return CDF_OK;
    atomic_fetch_add(&cdf_exec_counters.flushes, 1);
    cdf_device *dev = pg->nodes[0]->dst->storage->dev;
    if (dev->iface->run_nodes) {
        /* the values kind (pjrt): the whole deferred graph, unfused, is one program (the
         * compiler fuses); ops of other devices in it are launched one by one around it */
        bool one_device = true;
        for (int i = 0; i < pg->n; i++) one_device &= pg->nodes[i]->dst->storage->dev == dev;
        if (one_device) {
            atomic_fetch_add(&cdf_exec_counters.kernels, (unsigned long long)pg->n);
            const int n = pg->n;
            pg->n = 0;
            pg->bytes = 0;
            pg->next_check = 0;
            return dev->iface->run_nodes(dev, pg->nodes, n);
        }
    }
    cdf_fuse_stats fs = {0};
    cdf_fuse_matmul_epilogues(pg->nodes, &pg->n, cdf_device_supports_node, &fs);
    cdf_fuse_elementwise(pg->nodes, &pg->n, cdf_device_supports_node, &fs);
    atomic_fetch_add(&cdf_exec_counters.fused_kernels, (unsigned long long)fs.chains);
    atomic_fetch_add(&cdf_exec_counters.fused_ops, (unsigned long long)fs.nodes_fused);
    atomic_fetch_add(&cdf_exec_counters.epilogues, (unsigned long long)fs.epilogues);
    atomic_fetch_add(&cdf_exec_counters.norm_heads, (unsigned long long)fs.norm_heads);
    cdf_status s = CDF_OK;
    int i = 0;
    for (; i < pg->n && s == CDF_OK; i++) s = launch(pg->nodes[i]);
    for (; i < pg->n; i++) cdf_node_free(pg->nodes[i]); /* not launched after a failure */
    pg->n = 0;
    pg->bytes = 0;
    pg->next_check = 0;
    return s;
}

/* Bytes of the pending outputs (each storage once) that nothing outside the graph refers to. */
static size_t held_bytes(const pending_graph *pg) {
    size_t held = 0;
    for (int i = 0; i < pg->n; i++) {
        const cdf_storage *st = pg->nodes[i]->dst->storage;
        bool seen = false;
        for (int j = 0; j < i && !seen; j++) seen = pg->nodes[j]->dst->storage == st;
        if (!seen && cdf_graph_holds_only(pg->nodes, pg->n, NULL, 0, st, 0)) held += st->nbytes;
    }
    return held;
}

cdf_status cdf_exec_scope_closed(void) {
    pending_graph *pg = &tl_pending;
    if (pg->failed != CDF_OK || pg->bytes < PENDING_SCOPE_HELD || held_bytes(pg) < PENDING_SCOPE_HELD) return CDF_OK;
    const cdf_status s = cdf_exec_flush();
    if (s != CDF_OK) { /* nobody here to tell: kept for the next op or sync */
        pg->failed = s;
        snprintf(pg->why, sizeof pg->why, "%s", cdf_last_error());
    }
    return s;
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
    /* sequential offload: host-side block weights rebound to their device copies (compile/weight_stream.c) */
    cdf_status bs = cdf_exec_bind_hook ? cdf_exec_bind_hook(node) : CDF_OK;
    if (bs != CDF_OK) {
        cdf_node_free(node);
        return bs;
    }
    atomic_fetch_add(&cdf_exec_counters.ops, 1);
    if (tl_pending.failed != CDF_OK) { /* an earlier deferred op failed: this one fails with it */
        cdf_node_free(node);
        return cdf_exec_flush();
    }
    if (cdf_exec_capture_record(node)) return CDF_OK; /* captured into a graph being compiled */
    if (mode_now() == CDF_EXEC_EAGER) return launch(node);
    pending_graph *pg = &tl_pending;
    if (pg->n == pg->cap) {
        int cap = pg->cap ? pg->cap * 2 : 256;
        cdf_node **p = realloc(pg->nodes, (size_t)cap * sizeof *p);
        if (!p) { /* cannot record: run what we have, then this node, eagerly */
            cdf_status s = cdf_exec_flush();
            if (s != CDF_OK) {
                cdf_node_free(node);
                return s;
            }
            return launch(node);
        }
        pg->nodes = p;
        pg->cap = cap;
    }
    pg->nodes[pg->n++] = node;
    pg->bytes += (size_t)cdf_shape_numel(node->dst->ndim, node->dst->shape) * cdf_dtype_size(node->dst->dtype);
    if (pg->n >= PENDING_MAX_NODES) return cdf_exec_flush();
    if (pg->bytes >= pg->next_check + PENDING_CHECK_BYTES) {
        if (held_bytes(pg) >= PENDING_MAX_HELD) return cdf_exec_flush();
        pg->next_check = pg->bytes;
    }
    return CDF_OK;
}

cdf_status cdf_exec_sync_for_read(const cdf_tensor *t) {
    if (t->storage->host_src) /* sequential offload: no device copy outside its block */
        return cdf_error(CDF_ERR_INVALID_ARG, "read: the tensor is a host-side block weight (sequential offload)");
    atomic_fetch_add(&cdf_exec_counters.syncs, 1);
    CDF_TRY(cdf_exec_capture_host_read(t));
    CDF_TRY(cdf_exec_flush());
    return cdf_backend_device_synchronize(t->storage->dev);
}

/* The public device sync: pending (deferred) ops of this thread first, then the queue. */
cdf_status cdf_device_synchronize(cdf_device *dev) {
    if (!dev) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_device_synchronize: device is NULL");
    cdf_status f = cdf_exec_flush();
    cdf_status s = cdf_backend_device_synchronize(dev);
    return f != CDF_OK ? f : s;
}

/* Everything this thread deferred, then every device's queue until it is empty. */
cdf_status cdf_exec_drain_all(void) {
    cdf_status f = cdf_exec_flush();
    cdf_status s = cdf_backend_synchronize_all();
    return f != CDF_OK ? f : s;
}

cdf_status (*cdf_exec_bind_hook)(cdf_node *n);

__attribute__((constructor)) static void exec_register_hooks(void) { cdf_backend_pre_oom_hook = cdf_exec_flush; }
