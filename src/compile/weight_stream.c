/* Weight streaming for sequential offload (compile/weight_stream.h). */
#include "compile/weight_stream.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "core/error_internal.h"
#include "exec/exec.h"
#include "nn/nn.h"
#include "tensor/tensor_impl.h"

/* ---- sequential offload: host-side block weights, materialised per block call -------------
 * A block whose listed weights are host-side (nn/weights.c, blocks_on_host) runs like this:
 *   1. mark the end of the previous block call's ops with an event on the compute stream, and
 *      wait until the compute has passed the event of the block call `window` calls ago (its
 *      ops have run and dropped its weights), so at most `window` blocks' weights are on the
 *      device at once (default 2: the next block is uploaded while the device still runs the
 *      previous one);
 *   2. copy every host-side weight into a fresh device buffer (conversion to the load dtype on
 *      the host), queued on the device's copy stream (cdf_device_copy_stream: it runs beside
 *      the compute; without one, on the compute stream), then record an event after them on
 *      the copy stream and make the compute stream wait for it (on the device: the host goes
 *      on), so the block's first op runs after its last upload;
 *   3. run the block with a binding host-side buffer -> device copy active on the thread:
 *      every op the block submits (eager, deferred or captured) gets its operands rebound
 *      (cdf_exec_bind_host_weights); with repeated-block compile the device copies are the
 *      graph's bound parameters, exactly as for resident weights;
 *   4. drop the host's references: each copy is freed when the last op reading it has run
 *      (ops hold references to their operands; on a stream-ordered allocator the free is
 *      ordered after them on the compute stream), which releases the group.
 * Nothing here blocks on the device except step 1: the next block's weights are converted and
 * uploaded while the device computes the current one. */

typedef struct weight_group {
    int refs; /* live device copies + 1 for the ring slot; under g_group_lock */
    cdf_device *dev;
    cdf_event *done; /* on the compute stream after the block call's ops (NULL: not yet, or none) */
} weight_group;
static pthread_mutex_t g_group_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_group_released = PTHREAD_COND_INITIALIZER;

#define MAX_WINDOW 8
static _Thread_local weight_group *tl_ring[MAX_WINDOW];
static _Thread_local unsigned tl_ring_pos;

static void group_unref(weight_group *g) {
    pthread_mutex_lock(&g_group_lock);
    bool last = --g->refs == 0;
    if (g->refs <= 1) pthread_cond_broadcast(&g_group_released);
    pthread_mutex_unlock(&g_group_lock);
    if (last) free(g);
}

typedef struct device_copy {
    cdf_device *dev;
    void *data;
    size_t nbytes;
    weight_group *group;
} device_copy;

static void device_copy_release(void *p) {
    device_copy *c = p;
    cdf_device_free(c->dev, c->data, c->nbytes);
    group_unref(c->group);
    free(c);
}

static int sequential_window(void) {
    static int w;
    if (!w) {
        const char *v = getenv("CDIFFUSERS_SEQUENTIAL_WINDOW");
        int x = v ? atoi(v) : 2;
        w = x < 1 ? 1 : x > MAX_WINDOW ? MAX_WINDOW : x;
    }
    return w;
}

/* Wait until group g holds no device copy. A copy still referenced once the device has run
 * every queued op is held by something other than the queue (never expected): stop waiting
 * then rather than hang; the memory is accounted either way. */
static void wait_group(cdf_device *dev, weight_group *g) {
    pthread_mutex_lock(&g_group_lock);
    while (g->refs > 1) {
        cdf_queue_stats q;
        cdf_device_queue_stats(dev, &q);
        if (q.completed >= q.enqueued) {
            pthread_mutex_unlock(&g_group_lock);
            if (dev->iface->wait_idle) dev->iface->wait_idle(dev); /* the last op may still be finishing */
            pthread_mutex_lock(&g_group_lock);
            if (g->refs > 1) break;
            continue;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 2000000;
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&g_group_released, &g_group_lock, &ts);
    }
    pthread_mutex_unlock(&g_group_lock);
}

/* The binding active on this thread while a block with host-side weights runs. */
typedef struct host_binding {
    cdf_storage **host, **dev;
    int n;
} host_binding;
static _Thread_local host_binding *tl_binding;

cdf_status cdf_exec_bind_host_weights(cdf_node *n) {
    for (int k = -1; k < n->n_src; k++) {
        cdf_tensor **slot = k < 0 ? &n->dst : &n->src[k];
        if (!*slot || !(*slot)->storage->host_src) continue;
        const host_binding *b = tl_binding;
        int j = 0;
        while (b && j < b->n && b->host[j] != (*slot)->storage) j++;
        if (k < 0 || !b || j == b->n) {
            char d[96];
            cdf_tensor_describe(*slot, d, sizeof d);
            return cdf_error(CDF_ERR_INTERNAL,
                             "%s: operand %s is a host-side block weight (sequential offload) used %s; only the weights a "
                             "block lists to cdf_block_run are materialised",
                             cdf_op_name(n->kind), d, k < 0 ? "as an output" : "outside its block");
        }
        cdf_tensor *r = cdf_tensor_view_of(b->dev[j], (*slot)->offset, (*slot)->dtype, (*slot)->ndim, (*slot)->shape,
                                           (*slot)->strides);
        if (!r) return cdf_last_status();
        cdf_tensor_release(*slot);
        *slot = r;
    }
    return CDF_OK;
}

/* ---- host-staged weights ------------------------------------------------------------------
 * Where the device's backend keeps host-staged values (staged_new: pinned_host memory on pjrt,
 * which has no copy stream), a host-side weight is converted to its load dtype once, at its
 * block's first call, into that memory and kept with the weight's storage (released with it).
 * Every call then only queues a copy to device memory (PJRT_Buffer_CopyToMemory), which runs
 * beside the programs still queued for the blocks before (within the window, as the copy
 * stream's uploads do), instead of converting and uploading host bytes again. Elsewhere (and
 * where making one fails) the weight is uploaded from its host bytes, as before. */
typedef struct staged_weight {
    cdf_device *dev;
    void *handle;
    cdf_dtype dt;
} staged_weight;

static void staged_weight_release(void *p) {
    staged_weight *w = p;
    cdf_device_staged_free(w->dev, w->handle);
    free(w);
}

/* h's staged copy as dt (made now on first use), or NULL: upload from host bytes */
static staged_weight *staged_for(cdf_storage *h, cdf_dtype dt) {
    if (!h->dev->iface->staged_new) return NULL;
    pthread_mutex_lock(&g_group_lock);
    staged_weight *w = h->staged_release == staged_weight_release ? h->staged : NULL;
    const bool taken = h->staged_release != NULL;
    pthread_mutex_unlock(&g_group_lock);
    if (taken) return w && w->dt == dt ? w : NULL;
    void *handle = cdf_device_staged_new(h->dev, h->host_src, h->host_dtype, dt, h->nbytes / cdf_dtype_size(dt));
    if (!handle) return NULL; /* none on this device (its error is not the block's) */
    w = malloc(sizeof *w);
    if (!w) {
        cdf_device_staged_free(h->dev, handle);
        return NULL;
    }
    *w = (staged_weight){h->dev, handle, dt};
    pthread_mutex_lock(&g_group_lock);
    staged_weight *won = w;
    if (h->staged_release) won = h->staged_release == staged_weight_release ? h->staged : NULL; /* another thread's */
    else h->staged = w, h->staged_release = staged_weight_release;
    pthread_mutex_unlock(&g_group_lock);
    if (won != w) staged_weight_release(w);
    return won && won->dt == dt ? won : NULL;
}

/* A device buffer for h's bytes, usable in the order of stream st (the copy stream or NULL). */
static cdf_storage *materialise_weight(const cdf_storage *h, weight_group *g, cdf_stream *st) {
    cdf_storage *s = cdf_storage_create(h->dev, h->nbytes);
    device_copy *c = s ? calloc(1, sizeof *c) : NULL;
    if (!s || !c) {
        free(s);
        if (s) cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
        return NULL;
    }
    if (cdf_device_alloc_on(h->dev, st, h->nbytes, &c->data) != CDF_OK) {
        free(s);
        free(c);
        return NULL;
    }
    c->dev = h->dev;
    c->nbytes = h->nbytes;
    c->group = g;
    pthread_mutex_lock(&g_group_lock);
    g->refs++;
    pthread_mutex_unlock(&g_group_lock);
    s->data = c->data;
    s->owner = c;
    s->owner_release = device_copy_release;
    return s;
}

cdf_status cdf_weight_stream_run(cdf_graph_cache_run_fn run, cdf_graph_cache *cache, cdf_traced_fn fn, void *ctx,
                                 const cdf_tensor_map *in, cdf_tensor_map *out, cdf_tensor *const *weights, int n_weights) {
    cdf_device *dev = NULL;
    for (int i = 0; i < n_weights && !dev; i++)
        if (weights[i] && weights[i]->storage->host_src) dev = weights[i]->storage->dev;
    for (int i = 0; i < n_weights; i++)
        if (weights[i] && weights[i]->storage->host_src && weights[i]->storage->dev != dev)
            return cdf_error(CDF_ERR_INTERNAL, "a block's host-side weights are on two devices (%s, %s)", dev->name,
                             weights[i]->storage->dev->name);
    /* 1. the window: the group `window` calls back must be gone before this one is made */
    CDF_TRY(cdf_exec_flush()); /* deferred ops may hold it; the previous call's ops are now all queued */
    const int window = sequential_window();
    weight_group *last = tl_ring_pos ? tl_ring[(tl_ring_pos - 1) % (unsigned)window] : NULL;
    if (last && !last->done) {
        /* without an event (none could be made) step 1 waits on the references alone */
        last->done = cdf_device_event_new(last->dev);
        if (last->done && cdf_device_event_record(last->dev, last->done, NULL) != CDF_OK) {
            cdf_device_event_free(last->dev, last->done);
            last->done = NULL;
        }
    }
    weight_group **slot = &tl_ring[tl_ring_pos % (unsigned)window];
    if (*slot) {
        pthread_mutex_lock(&g_group_lock);
        const bool held = (*slot)->refs > 1; /* some copy of it not yet released */
        pthread_mutex_unlock(&g_group_lock);
        if ((*slot)->done) {
            if (held) cdf_device_event_wait((*slot)->dev, (*slot)->done);
            cdf_device_event_free((*slot)->dev, (*slot)->done);
            (*slot)->done = NULL;
        }
        wait_group((*slot)->dev, *slot); /* their last readers have run: at once, but for a straggler */
        group_unref(*slot);
        *slot = NULL;
    }
    weight_group *g = calloc(1, sizeof *g);
    if (!g) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    g->refs = 1;
    g->dev = dev;
    *slot = g;
    tl_ring_pos++;
    cdf_stream *copies = cdf_device_copy_stream(dev); /* NULL: the compute stream */

    /* 2. device copies, one per host-side buffer */
    cdf_storage *host[CDF_COMPILE_MAX_PARAMS], *copy[CDF_COMPILE_MAX_PARAMS];
    cdf_tensor *bound[CDF_COMPILE_MAX_PARAMS] = {0};
    int nb = 0;
    cdf_status s = n_weights > CDF_COMPILE_MAX_PARAMS ? cdf_error(CDF_ERR_LIMIT, "block with more than %d weights", CDF_COMPILE_MAX_PARAMS) : CDF_OK;
    cdf_scope_suppress(1);
    for (int i = 0; i < n_weights && s == CDF_OK; i++) {
        cdf_tensor *w = weights[i];
        if (!w || !w->storage->host_src) {
            bound[i] = cdf_tensor_retain(w);
            continue;
        }
        int j = 0;
        while (j < nb && host[j] != w->storage) j++;
        if (j == nb) {
            cdf_storage *h = w->storage;
            cdf_storage *d = materialise_weight(h, g, copies);
            if (!d) {
                s = cdf_last_status();
                break;
            }
            /* the checkpoint's bytes converted as the loader converts them (cdf_tensor_from_host):
             * the same values as a resident load, bit for bit. Queued on the copy stream, so the
             * host goes on converting and queueing while the device still runs the blocks before;
             * h (the checkpoint's owner) and d stay referenced until the copy has run. */
            const staged_weight *sw = staged_for(h, w->dtype);
            if (sw) s = cdf_device_staged_to_device(dev, sw->handle, d->data, d->nbytes);
            else
                s = cdf_storage_upload_async(d, copies, 0, w->dtype, h->host_src, h->host_dtype,
                                             h->nbytes / cdf_dtype_size(w->dtype), h);
            /* released at 4., behind the join below even when the upload failed: its memory
             * may belong to the copy stream's order (a stream-ordered allocator) */
            host[nb] = h;
            copy[nb++] = d;
            if (s != CDF_OK) break;
        }
        bound[i] = cdf_tensor_view_of(copy[j], w->offset, w->dtype, w->ndim, w->shape, w->strides);
        if (!bound[i]) s = cdf_last_status();
    }
    cdf_scope_suppress(-1);
    /* the block's first op (everything the compute stream gets from now on, the copies' frees
     * included) after the uploads */
    if (copies && nb) {
        cdf_event *up = cdf_device_event_new(dev);
        cdf_status j = up ? cdf_device_event_record(dev, up, copies) : cdf_last_status();
        if (j == CDF_OK) j = cdf_device_stream_wait(dev, NULL, up);
        cdf_device_event_free(dev, up);
        if (s == CDF_OK) s = j;
    }

    /* 3. the block, with the binding active */
    if (s == CDF_OK) {
        host_binding b = {host, copy, nb}, *prev = tl_binding;
        tl_binding = &b;
        if (cache) s = run(cache, fn, ctx, in, out, bound, n_weights);
        else s = fn(ctx, in, out);
        tl_binding = prev;
    }
    /* 4. the queue frees the copies once their readers have run */
    for (int i = 0; i < n_weights && i < CDF_COMPILE_MAX_PARAMS; i++) cdf_tensor_release(bound[i]);
    for (int j = 0; j < nb; j++) cdf_storage_release(copy[j]);
    return s;
}


__attribute__((constructor)) static void weight_stream_register_hook(void) { cdf_exec_bind_hook = cdf_exec_bind_host_weights; }
