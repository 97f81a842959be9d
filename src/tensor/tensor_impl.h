/* Private layout of tensors and storage, shared by tensor/, exec/ and backends. */
#ifndef CDF_TENSOR_IMPL_H
#define CDF_TENSOR_IMPL_H

#include <stdatomic.h>

#include "cdiffusers/tensor.h"

/* A device buffer. Reference counted: tensors (views) and queued ops hold references, so a
 * buffer released by the host while ops still use it lives until the queue is done with it. */
typedef struct cdf_storage {
    atomic_long refcount;
    cdf_device *dev;
    void *data; /* a device address (see cdf_tensor_device_addr) */
    size_t nbytes;
    bool device_owned;              /* allocated (and accounted) by the device */
    void (*owner_release)(void *);  /* external memory (cdf_tensor_wrap), or the arena of a planned buffer */
    void *owner;
    bool is_virtual; /* allocated during a compile capture: no memory until the memory planner
                        places it in the graph's arena (or a graph break materialises it) */
    /* Sequential offload (nn/weights.c): a transformer-block weight kept host-side. Its bytes
     * stay in the memory-mapped checkpoint (host_src, stored as host_dtype; `owner` keeps the
     * checkpoint open); data is NULL and no device memory is held. Ops reach it only inside
     * cdf_block_run, which binds a device copy made just before the block runs (exec/compile.c). */
    const void *host_src;
    cdf_dtype host_dtype;
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
 * when the host is out of memory); the callers below and the other layers' special buffers
 * (placeholders, host-side weights, offload copies) fill in the rest. */
cdf_storage *cdf_storage_create(cdf_device *dev, size_t nbytes);
cdf_storage *cdf_storage_new(cdf_device *dev, size_t nbytes); /* + accounted device memory */
/* Write n elements of host data (src_dt) into s at element offset `at` of dtype dt, converting
 * in host staging buffers; the bytes cross through the backend. s must not be in use by a queued
 * op (a new buffer, or queues drained). */
cdf_status cdf_storage_upload(cdf_storage *s, size_t at, cdf_dtype dt, const void *src, cdf_dtype src_dt, size_t n);
/* Give a virtual storage its own device memory (no-op for a real one). */
cdf_status cdf_storage_materialize(cdf_storage *s);
void cdf_storage_retain(cdf_storage *s);
void cdf_storage_release(cdf_storage *s);

/* A tensor object over existing storage (takes a new storage reference). Registered in the
 * current scope. */
cdf_tensor *cdf_tensor_view_of(cdf_storage *s, int64_t offset, cdf_dtype dt, int ndim, const int64_t *shape,
                               const int64_t *strides);
/* Allocate a new contiguous tensor (not initialised). */
cdf_tensor *cdf_tensor_alloc(cdf_device *dev, cdf_dtype dt, int ndim, const int64_t *shape);

/* Scope bookkeeping for ops (see tensor.c). */
void cdf_scope_suppress(int delta);
void cdf_scope_record(cdf_tensor *t);

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
