/* tensor/ internals shared with the layers above the tensor API (nn, dist, compile, models):
 * scope-recorded views and allocation. The value types themselves are graph/value.h; storage
 * allocation and transfers backend/storage.c (declared in backend/backend_impl.h). */
#ifndef CDF_TENSOR_IMPL_H
#define CDF_TENSOR_IMPL_H

#include "backend/backend_impl.h"
#include "graph/value.h"

/* A tensor object over existing storage (takes a new storage reference). Registered in the
 * current scope. */
cdf_tensor *cdf_tensor_view_of(cdf_storage *s, int64_t offset, cdf_dtype dt, int ndim, const int64_t *shape,
                               const int64_t *strides);
/* Allocate a new contiguous tensor (not initialised). */
cdf_tensor *cdf_tensor_alloc(cdf_device *dev, cdf_dtype dt, int ndim, const int64_t *shape);

/* Replica r's value of t (a contiguous tensor of a device running replicas, cdf_device_replicas
 * > 1) from host data of src_dt; the other replicas keep theirs (tensor parallelism in one
 * process: each replica its slice). The tensor must not be in use by a queued op. */
cdf_status cdf_tensor_upload_replica(cdf_tensor *t, int replica, const void *data, cdf_dtype src_dt);

/* Scope bookkeeping for ops (see tensor.c). */
void cdf_scope_suppress(int delta);
void cdf_scope_record(cdf_tensor *t);

#endif
