/* Tensor objects, storage, scopes, views and host access. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "core/error_internal.h"
#include "exec/capture.h"
#include "exec/exec.h"
#include "tensor/tensor_impl.h"

/* ---- helpers ------------------------------------------------------------------------- */
/* Shapes from callers are validated once here: dims >= 0 and no int64/size_t overflow. */
static cdf_status check_shape(int ndim, const int64_t *shape, cdf_dtype dt, const char *who) {
    if (ndim < 0 || ndim > CDF_MAX_DIMS)
        return cdf_error(CDF_ERR_INVALID_ARG, "%s: %d dims (at most %d)", who, ndim, CDF_MAX_DIMS);
    if (ndim > 0 && !shape) return cdf_error(CDF_ERR_INVALID_ARG, "%s: shape is NULL", who);
    if (!cdf_dtype_size(dt)) return cdf_error(CDF_ERR_DTYPE, "%s: invalid dtype %d", who, (int)dt);
    uint64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return cdf_error(CDF_ERR_INVALID_ARG, "%s: negative dim %lld", who, (long long)shape[i]);
        if (shape[i] && n > (UINT64_C(1) << 62) / (uint64_t)shape[i] / cdf_dtype_size(dt))
            return cdf_error(CDF_ERR_LIMIT, "%s: tensor too large", who);
        n *= (uint64_t)shape[i];
    }
    return CDF_OK;
}

/* ---- scopes ---------------------------------------------------------------------------- */
typedef struct scope_stack {
    cdf_tensor **items;
    size_t n, cap;
    size_t marks[64];
    int depth;
} scope_stack;
static _Thread_local scope_stack tl_scopes;
static _Thread_local int tl_scope_suppress;

/* Ops manage their internal temporaries by hand; only the tensor an op returns to its caller
 * is recorded in the caller's scope (see cdf_op_begin/cdf_op_end in ops_internal.h). */
void cdf_scope_suppress(int delta) { tl_scope_suppress += delta; }

static void scope_record(cdf_tensor *t) {
    scope_stack *s = &tl_scopes;
    if (s->depth == 0 || tl_scope_suppress > 0) return;
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 256;
        cdf_tensor **p = realloc(s->items, cap * sizeof *p);
        if (!p) return; /* not recorded: the tensor leaks rather than being freed early */
        s->items = p;
        s->cap = cap;
    }
    s->items[s->n++] = t;
}

void cdf_scope_push(void) {
    scope_stack *s = &tl_scopes;
    if (s->depth < 64) s->marks[s->depth] = s->n;
    s->depth++;
}

void cdf_scope_pop(cdf_tensor *const *keep, int n_keep) {
    scope_stack *s = &tl_scopes;
    if (s->depth == 0) return;
    s->depth--;
    size_t mark = s->depth < 64 ? s->marks[s->depth] : s->n;
    size_t end = s->n;
    s->n = mark;
    for (size_t i = mark; i < end; i++) {
        cdf_tensor *t = s->items[i];
        bool kept = false;
        for (int k = 0; k < n_keep; k++) {
            if (keep[k] == t) {
                kept = true;
                break;
            }
        }
        if (kept) {
            /* move to the enclosing scope (if any); only once even if listed twice */
            bool dup = false;
            for (size_t j = mark; j < s->n; j++) dup |= s->items[j] == t;
            if (!dup) {
                int sup = tl_scope_suppress;
                tl_scope_suppress = 0;
                scope_record(t);
                tl_scope_suppress = sup;
            }
        } else {
            cdf_tensor_release(t);
        }
    }
    /* a closed block's intermediates are unreferenced now: the deferred graph may run, fused
     * whole (an error here is the op's: it is set, and the next read or sync reports it) */
    (void)cdf_exec_scope_closed();
    if (s->depth == 0 && s->n == 0) { /* outermost scope closed: a thread that ends (a server's
                                          worker) would otherwise leak its thread-local array */
        free(s->items);
        s->items = NULL;
        s->cap = 0;
    }
}

void cdf_scope_record(cdf_tensor *t) {
    if (t) scope_record(t);
}

/* ---- tensor objects ------------------------------------------------------------------ */
cdf_tensor *cdf_tensor_view_of(cdf_storage *st, int64_t offset, cdf_dtype dt, int ndim, const int64_t *shape,
                               const int64_t *strides) {
    cdf_tensor *t = cdf_value_view(st, offset, dt, ndim, shape, strides);
    if (t) scope_record(t);
    return t;
}

cdf_tensor *cdf_tensor_alloc(cdf_device *dev, cdf_dtype dt, int ndim, const int64_t *shape) {
    if (check_shape(ndim, shape, dt, "tensor") != CDF_OK) return NULL;
    if (!dev) {
        cdf_error(CDF_ERR_INVALID_ARG, "tensor: device is NULL");
        return NULL;
    }
    size_t nbytes = (size_t)cdf_shape_numel(ndim, shape) * cdf_dtype_size(dt);
    bool virt = cdf_exec_capture_tracing();
    cdf_storage *st = virt ? cdf_storage_new_virtual(dev, nbytes) : cdf_storage_new(dev, nbytes);
    if (!st) return NULL;
    if (virt) cdf_exec_capture_note_virtual(st);
    int64_t strides[CDF_MAX_DIMS];
    cdf_contiguous_strides(ndim, shape, strides);
    cdf_tensor *t = cdf_tensor_view_of(st, 0, dt, ndim, shape, strides);
    cdf_storage_release(st);
    return t;
}

cdf_tensor *cdf_tensor_empty(cdf_device *dev, cdf_dtype dt, int ndim, const int64_t *shape) {
    return cdf_tensor_alloc(dev, dt, ndim, shape);
}

cdf_status cdf_tensor_upload_replica(cdf_tensor *t, int replica, const void *data, cdf_dtype src_dt) {
    if (!t || !data) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_tensor_upload_replica: NULL argument");
    if (!cdf_tensor_is_contiguous(t)) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_tensor_upload_replica: a strided view");
    if (cdf_measuring()) return CDF_OK;
    CDF_TRY(cdf_storage_materialize(t->storage));
    return cdf_storage_upload_replica(t->storage, replica, (size_t)t->offset, t->dtype, data, src_dt,
                                      (size_t)cdf_shape_numel(t->ndim, t->shape));
}

cdf_tensor *cdf_tensor_from_host(cdf_device *dev, cdf_dtype dt, int ndim, const int64_t *shape, const void *data,
                                 cdf_dtype src_dt) {
    if (check_shape(ndim, shape, src_dt, "tensor_from_host") != CDF_OK) return NULL;
    cdf_tensor *t = cdf_tensor_alloc(dev, dt, ndim, shape);
    if (!t) return NULL;
    if (cdf_measuring()) return t; /* a measured forward (exec/capture.h): sizes only, no values */
    if (cdf_storage_materialize(t->storage) != CDF_OK) { /* written now, by the host */
        cdf_tensor_release(t);
        return NULL;
    }
    int64_t n = cdf_shape_numel(ndim, shape);
    if (n && !data) {
        cdf_tensor_release(t);
        cdf_error(CDF_ERR_INVALID_ARG, "tensor_from_host: data is NULL");
        return NULL;
    }
    /* the new buffer is not yet visible to any queued op: an unordered upload is safe */
    if (cdf_storage_upload(t->storage, 0, dt, data, src_dt, (size_t)n) != CDF_OK) {
        cdf_tensor_release(t);
        return NULL;
    }
    return t;
}

cdf_tensor *cdf_tensor_full(cdf_device *dev, cdf_dtype dt, int ndim, const int64_t *shape, double value) {
    cdf_tensor *t = cdf_tensor_alloc(dev, dt, ndim, shape);
    if (!t) return NULL;
    cdf_node *n = cdf_node_new(CDF_OP_FILL);
    if (!n) {
        cdf_tensor_release(t);
        return NULL;
    }
    n->p.fill.value = value;
    n->dst = cdf_tensor_retain(t);
    if (cdf_exec_submit(n) != CDF_OK) {
        cdf_tensor_release(t);
        return NULL;
    }
    return t;
}

cdf_tensor *cdf_tensor_zeros(cdf_device *dev, cdf_dtype dt, int ndim, const int64_t *shape) {
    return cdf_tensor_full(dev, dt, ndim, shape, 0.0);
}

cdf_tensor *cdf_tensor_wrap(cdf_device *dev, cdf_dtype dt, int ndim, const int64_t *shape, void *data,
                            void (*owner_release)(void *), void *owner) {
    if (check_shape(ndim, shape, dt, "tensor_wrap") != CDF_OK) return NULL;
    if (!dev) {
        cdf_error(CDF_ERR_INVALID_ARG, "tensor_wrap: device is NULL");
        return NULL;
    }
    if (!dev->iface->host_visible || !dev->iface->host_visible(dev)) {
        cdf_error(CDF_ERR_UNSUPPORTED, "tensor_wrap: %s cannot use host memory as device memory; copy the data with "
                  "cdf_tensor_from_host", dev->name);
        return NULL;
    }
    cdf_storage *s = cdf_storage_create(dev, (size_t)cdf_shape_numel(ndim, shape) * cdf_dtype_size(dt));
    if (!s) return NULL;
    s->data = data;
    s->owner_release = owner_release;
    s->owner = owner;
    int64_t strides[CDF_MAX_DIMS];
    cdf_contiguous_strides(ndim, shape, strides);
    cdf_tensor *t = cdf_tensor_view_of(s, 0, dt, ndim, shape, strides);
    cdf_storage_release(s);
    return t;
}

/* ---- host access ------------------------------------------------------------------------ */
static cdf_status read_to_host(const cdf_tensor *t, cdf_dtype as, void *dst, size_t n);

cdf_status cdf_tensor_read(const cdf_tensor *t, cdf_dtype as, void *dst, size_t dst_bytes) {
    if (!t) return cdf_last_status() != CDF_OK ? cdf_last_status() : cdf_error(CDF_ERR_INVALID_ARG, "read: tensor is NULL");
    int64_t n = cdf_tensor_numel(t);
    if (dst_bytes < (size_t)n * cdf_dtype_size(as))
        return cdf_error(CDF_ERR_INVALID_ARG, "read: destination holds %zu bytes, tensor needs %zu", dst_bytes,
                         (size_t)n * cdf_dtype_size(as));
    CDF_TRY(cdf_exec_sync_for_read(t));
    if (n == 0) return CDF_OK;
    return read_to_host(t, as, dst, (size_t)n);
}

/* A contiguous copy of t on its own device (*out; the caller releases it), made by a copy op run
 * at once: not through exec/, since this copy is part of a read, never recorded or deferred. */
static cdf_status device_contiguous_copy(const cdf_tensor *t, size_t n, cdf_storage **out) {
    cdf_device *dev = t->storage->dev;
    *out = NULL;
    cdf_storage *tmp = cdf_storage_new(dev, n * cdf_dtype_size(t->dtype));
    if (!tmp) return cdf_last_status();
    cdf_node *node = cdf_node_new(CDF_OP_COPY);
    if (!node) {
        cdf_storage_release(tmp);
        return cdf_last_status();
    }
    int64_t strides[CDF_MAX_DIMS];
    cdf_contiguous_strides(t->ndim, t->shape, strides);
    cdf_scope_suppress(1); /* the node alone owns its view */
    node->dst = cdf_tensor_view_of(tmp, 0, t->dtype, t->ndim, t->shape, strides);
    cdf_scope_suppress(-1);
    cdf_node_add_src(node, (cdf_tensor *)t);
    cdf_status s = node->dst ? cdf_device_enqueue(dev, node) : cdf_last_status();
    if (s != CDF_OK) cdf_node_free(node); /* not taken by the device */
    if (s == CDF_OK) s = cdf_backend_device_synchronize(dev);
    if (s != CDF_OK) {
        cdf_storage_release(tmp);
        return s;
    }
    *out = tmp;
    return CDF_OK;
}

/* t's elements, in row-major order, into host memory as dtype `as`. Only the backend touches
 * device memory: a strided view is first made contiguous on the device, then the bytes are
 * fetched and converted on the host. The caller has synchronised t. */
static cdf_status read_to_host(const cdf_tensor *t, cdf_dtype as, void *dst, size_t n) {
    cdf_device *dev = t->storage->dev;
    const size_t nbytes = n * cdf_dtype_size(t->dtype);
    cdf_storage *tmp = NULL;
    if (!cdf_tensor_is_contiguous(t)) CDF_TRY(device_contiguous_copy(t, n, &tmp));
    const void *src = tmp ? tmp->data : cdf_tensor_device_addr(t);
    cdf_status s;
    if (as == t->dtype) {
        s = cdf_device_buffer_get(dev, dst, src, nbytes);
    } else { /* fetched into a host staging buffer, converted from there */
        void *stage = cdf_device_host_alloc(dev, nbytes);
        s = stage ? cdf_device_buffer_get(dev, stage, src, nbytes) : cdf_last_status();
        if (s == CDF_OK) cdf_convert(dst, as, stage, t->dtype, n);
        cdf_device_host_free(dev, stage, nbytes);
    }
    cdf_storage_release(tmp);
    return s;
}

float *cdf_tensor_read_f32(const cdf_tensor *t) {
    if (!t) return NULL;
    size_t n = (size_t)cdf_tensor_numel(t);
    float *p = malloc((n ? n : 1) * sizeof(float));
    if (!p) {
        cdf_error(CDF_ERR_OUT_OF_MEMORY, "host out of memory reading a tensor");
        return NULL;
    }
    if (cdf_tensor_read(t, CDF_F32, p, n * sizeof(float)) != CDF_OK) {
        free(p);
        return NULL;
    }
    return p;
}

cdf_status cdf_tensor_item(const cdf_tensor *t, double *out) {
    if (!t) return cdf_error(CDF_ERR_INVALID_ARG, "item: tensor is NULL");
    if (cdf_tensor_numel(t) != 1) return cdf_error(CDF_ERR_SHAPE, "item: tensor has %lld elements, not 1", (long long)cdf_tensor_numel(t));
    return cdf_tensor_read(t, CDF_F64, out, sizeof *out);
}
