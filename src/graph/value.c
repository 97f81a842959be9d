/* Storages and tensors as values: construction of headers, reference counting, introspection
 * (graph/value.h; the public part is declared in cdiffusers/tensor.h). */
#include "graph/value.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"

void cdf_contiguous_strides(int ndim, const int64_t *shape, int64_t *strides) {
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        strides[i] = s;
        s *= shape[i] > 0 ? shape[i] : 1;
    }
}

int64_t cdf_shape_numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

int cdf_norm_dim(int dim, int ndim) {
    if (dim < 0) dim += ndim;
    return (dim < 0 || dim >= ndim) ? -1 : dim;
}

/* ---- storages ------------------------------------------------------------------------------ */
cdf_storage *cdf_storage_create(cdf_device *dev, size_t nbytes) {
    cdf_storage *s = calloc(1, sizeof *s);
    if (!s) {
        cdf_error(CDF_ERR_OUT_OF_MEMORY, "host out of memory (storage header)");
        return NULL;
    }
    atomic_init(&s->refcount, 1);
    s->dev = dev;
    s->nbytes = nbytes;
    return s;
}

void cdf_storage_retain(cdf_storage *s) { atomic_fetch_add(&s->refcount, 1); }

void cdf_storage_release(cdf_storage *s) {
    if (!s || atomic_fetch_sub(&s->refcount, 1) != 1) return;
    if (s->staged_release) s->staged_release(s->staged);
    if (s->owner_release) s->owner_release(s->owner);
    free(s);
}

/* ---- tensors ------------------------------------------------------------------------------- */
cdf_tensor *cdf_value_view(cdf_storage *st, int64_t offset, cdf_dtype dt, int ndim, const int64_t *shape,
                           const int64_t *strides) {
    cdf_tensor *t = calloc(1, sizeof *t);
    if (!t) {
        cdf_error(CDF_ERR_OUT_OF_MEMORY, "host out of memory (tensor header)");
        return NULL;
    }
    atomic_init(&t->refcount, 1);
    cdf_storage_retain(st);
    t->storage = st;
    t->offset = offset;
    t->dtype = dt;
    t->ndim = ndim;
    if (ndim) {
        memcpy(t->shape, shape, ndim * sizeof *shape);
        memcpy(t->strides, strides, ndim * sizeof *strides);
    }
    return t;
}

cdf_tensor *cdf_tensor_retain(cdf_tensor *t) {
    if (t) atomic_fetch_add(&t->refcount, 1);
    return t;
}

void cdf_tensor_release(cdf_tensor *t) {
    if (!t || atomic_fetch_sub(&t->refcount, 1) != 1) return;
    cdf_storage_release(t->storage);
    free(t);
}

/* ---- introspection --------------------------------------------------------------------- */
int cdf_tensor_ndim(const cdf_tensor *t) { return t ? t->ndim : 0; }
const int64_t *cdf_tensor_shape(const cdf_tensor *t) { return t ? t->shape : NULL; }
const int64_t *cdf_tensor_strides(const cdf_tensor *t) { return t ? t->strides : NULL; }
int64_t cdf_tensor_dim(const cdf_tensor *t, int dim) {
    if (!t) return -1;
    int d = cdf_norm_dim(dim, t->ndim);
    return d < 0 ? -1 : t->shape[d];
}
int64_t cdf_tensor_numel(const cdf_tensor *t) { return t ? cdf_shape_numel(t->ndim, t->shape) : 0; }
cdf_dtype cdf_tensor_dtype(const cdf_tensor *t) { return t ? t->dtype : CDF_F32; }
cdf_device *cdf_tensor_device(const cdf_tensor *t) { return t ? t->storage->dev : NULL; }

bool cdf_tensor_is_contiguous(const cdf_tensor *t) {
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->strides[i] != s) return false;
        s *= t->shape[i];
    }
    return true;
}

const char *cdf_tensor_describe(const cdf_tensor *t, char *buf, size_t n) {
    if (!t) {
        snprintf(buf, n, "(null)");
        return buf;
    }
    size_t o = 0;
    o += snprintf(buf + o, o < n ? n - o : 0, "[");
    for (int i = 0; i < t->ndim; i++)
        o += snprintf(buf + o, o < n ? n - o : 0, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    snprintf(buf + o, o < n ? n - o : 0, "] %s", cdf_dtype_name(t->dtype));
    return buf;
}

