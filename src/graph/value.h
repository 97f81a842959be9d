/* graph/value — the values op nodes refer to: storages (device buffers, reference counted) and
 * tensors (views on a storage: shape, strides, dtype, offset). Plain data and reference counting
 * only: allocating device memory is the backend's (backend/storage.c), scopes and ops are the
 * tensor API's (tensor/). Every layer from the backend up shares these definitions. */
#ifndef CDF_GRAPH_VALUE_H
#define CDF_GRAPH_VALUE_H

#include <stdatomic.h>

#include "cdiffusers/tensor.h"

/* A device buffer. Reference counted: tensors (views) and queued ops hold references, so a
 * buffer released by the host while ops still use it lives until the queue is done with it. */
typedef struct cdf_storage {
    atomic_long refcount;
    cdf_device *dev;
    void *data; /* a device address (see cdf_tensor_device_addr) */
    size_t nbytes;
    /* Called with `owner` when the last reference goes: frees the memory the way it was obtained
     * (device memory: the backend's free, backend/storage.c; wrapped memory: its owner's release;
     * an offload copy; the checkpoint of a host-side weight). NULL = nothing to free. */
    void (*owner_release)(void *);
    void *owner;
    bool is_virtual; /* allocated during a compile capture: no memory until the memory planner
                        places it in the graph's arena (or a graph break materialises it) */
    /* Sequential offload (nn/weights.c): a transformer-block weight kept host-side. Its bytes
     * stay in the memory-mapped checkpoint (host_src, stored as host_dtype; `owner` keeps the
     * checkpoint open); data is NULL and no device memory is held. Ops reach it only inside
     * cdf_block_run, which binds a device copy made just before the block runs (compile/weight_stream.c). */
    const void *host_src;
    cdf_dtype host_dtype;
    /* A copy of host_src's bytes the device's backend keeps in its host-staged memory (pinned_host
     * on pjrt: compile/weight_stream.c makes it at the block's first call), released with the
     * storage by staged_release(staged); NULL when none. */
    void *staged;
    void (*staged_release)(void *staged);
} cdf_storage;

struct cdf_tensor {
    atomic_long refcount;
    cdf_storage *storage;
    int64_t offset; /* in elements */
    cdf_dtype dtype;
    int ndim;
    int64_t shape[CDF_MAX_DIMS];
    int64_t strides[CDF_MAX_DIMS]; /* in elements */
};

/* The one constructor of a storage header: one reference, no memory, no owner (NULL + error
 * when the host is out of memory); its creator fills in the rest (device memory, a virtual
 * buffer, wrapped memory, a compile placeholder, an offload copy, a host-side weight). */
cdf_storage *cdf_storage_create(cdf_device *dev, size_t nbytes);
void cdf_storage_retain(cdf_storage *s);
void cdf_storage_release(cdf_storage *s);

/* A new tensor object over existing storage (takes a new storage reference); not recorded in any
 * scope (tensor/'s cdf_tensor_view_of is this plus the caller's scope). */
cdf_tensor *cdf_value_view(cdf_storage *s, int64_t offset, cdf_dtype dt, int ndim, const int64_t *shape,
                           const int64_t *strides);

/* The device address of t's first element: opaque above the backend (never dereferenced there;
 * bytes move through the backend's transfer calls). */
static inline void *cdf_tensor_device_addr(const cdf_tensor *t) {
    return (char *)t->storage->data + t->offset * (int64_t)cdf_dtype_size(t->dtype);
}
void cdf_contiguous_strides(int ndim, const int64_t *shape, int64_t *strides);
int64_t cdf_shape_numel(int ndim, const int64_t *shape);
/* Normalise a possibly negative dim; -1 if out of range. */
int cdf_norm_dim(int dim, int ndim);

#endif
