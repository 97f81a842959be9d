/* Storages backed by a device: accounted device memory, virtual buffers of a capture, and host
 * uploads through the backend (declared in backend/backend_impl.h). */
#include <stdlib.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "core/error_internal.h"

/* owner_release of device memory (graph/value.h): owner is the storage itself */
static void free_device_memory(void *owner) {
    cdf_storage *s = owner;
    cdf_device_free(s->dev, s->data, s->nbytes);
}

cdf_storage *cdf_storage_new(cdf_device *dev, size_t nbytes) {
    cdf_storage *s = cdf_storage_create(dev, nbytes);
    if (s && cdf_device_alloc(dev, nbytes, &s->data) != CDF_OK) {
        free(s);
        return NULL;
    }
    if (s) {
        s->owner_release = free_device_memory;
        s->owner = s;
    }
    return s;
}

/* A buffer created while a compile capture records ops: its memory comes later from the
 * graph's arena (compile/memory_plan.c), so capturing a forward does not hold every intermediate. */
cdf_storage *cdf_storage_new_virtual(cdf_device *dev, size_t nbytes) {
    cdf_storage *s = cdf_storage_create(dev, nbytes);
    if (s) s->is_virtual = true;
    return s;
}

cdf_status cdf_storage_materialize(cdf_storage *s) {
    if (!s->is_virtual) return CDF_OK;
    CDF_TRY(cdf_device_alloc(s->dev, s->nbytes, &s->data));
    s->is_virtual = false;
    s->owner_release = free_device_memory;
    s->owner = s;
    return CDF_OK;
}

/* Elements converted per staging chunk: big enough to amortise a transfer, small enough to stay
 * in cache (and to bound the staging memory). */
#define UPLOAD_CHUNK_ELEMS ((size_t)1 << 18)

static cdf_status check_upload(const cdf_storage *s, size_t at, size_t dsz, size_t n) {
    if (s->is_virtual || !s->data)
        return cdf_error(CDF_ERR_INTERNAL, "upload into a buffer without device memory");
    if ((at + n) * dsz > s->nbytes)
        return cdf_error(CDF_ERR_INTERNAL, "upload of %zu elements at %zu overruns a %zu-byte buffer", n, at, s->nbytes);
    return CDF_OK;
}

/* replica < 0: every replica (buffer_set) */
static cdf_status set_bytes(cdf_storage *s, int replica, void *dst, const void *src, size_t nbytes) {
    return replica < 0 ? cdf_device_buffer_set(s->dev, dst, src, nbytes) : cdf_device_buffer_set_replica(s->dev, replica, dst, src, nbytes);
}

static cdf_status upload(cdf_storage *s, int replica, size_t at, cdf_dtype dt, const void *src, cdf_dtype src_dt, size_t n) {
    const size_t dsz = cdf_dtype_size(dt), ssz = cdf_dtype_size(src_dt);
    if (!n) return CDF_OK;
    CDF_TRY(check_upload(s, at, dsz, n));
    char *dst = (char *)s->data + at * dsz;
    if (replica < 0 && at == 0 && n * dsz == s->nbytes && s->dev->iface->buffer_set_value) {
        /* the whole storage as a value of dt: the backend may start its transfer now, beside the
         * programs still running (pjrt), rather than when a program first reads it */
        void *v = malloc(n * dsz);
        if (!v) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (%zu bytes)", n * dsz);
        if (dt == src_dt) memcpy(v, src, n * dsz);
        else cdf_convert(v, dt, src, src_dt, n);
        cdf_status st = s->dev->iface->buffer_set_value(s->dev, dst, v, n * dsz, dt);
        return st == CDF_OK ? st : cdf_error_prefix("copy of %zu bytes to %s: ", n * dsz, s->dev->name);
    }
    if (dt == src_dt) return set_bytes(s, replica, dst, src, n * dsz);
    const size_t chunk = n < UPLOAD_CHUNK_ELEMS ? n : UPLOAD_CHUNK_ELEMS;
    void *stage = cdf_device_host_alloc(s->dev, chunk * dsz);
    if (!stage) return cdf_last_status();
    cdf_status st = CDF_OK;
    for (size_t o = 0; o < n && st == CDF_OK; o += chunk) {
        const size_t c = n - o < chunk ? n - o : chunk;
        cdf_convert(stage, dt, (const char *)src + o * ssz, src_dt, c);
        st = set_bytes(s, replica, dst + o * dsz, stage, c * dsz);
    }
    cdf_device_host_free(s->dev, stage, chunk * dsz);
    return st;
}

cdf_status cdf_storage_upload(cdf_storage *s, size_t at, cdf_dtype dt, const void *src, cdf_dtype src_dt, size_t n) {
    return upload(s, -1, at, dt, src, src_dt, n);
}

cdf_status cdf_storage_upload_replica(cdf_storage *s, int replica, size_t at, cdf_dtype dt, const void *src, cdf_dtype src_dt,
                                      size_t n) {
    if (replica < 0) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_storage_upload_replica: replica %d", replica);
    return upload(s, replica, at, dt, src, src_dt, n);
}


/* What a queued upload holds until the backend has copied it (its done callback). */
typedef struct queued_upload {
    cdf_storage *dst, *keep; /* references: the destination, the source's owner (or NULL) */
    void *stage;             /* a staging buffer of stage_bytes (or NULL) */
    size_t stage_bytes;
} queued_upload;

static void queued_upload_done(void *p) {
    queued_upload *u = p;
    cdf_device_host_free(u->dst->dev, u->stage, u->stage_bytes);
    cdf_storage_release(u->keep);
    cdf_storage_release(u->dst); /* may free the buffer: nothing else may hold it any more */
    free(u);
}

/* A stream-ordered copy of src to dst; staged: src is a staging buffer the upload owns. */
static cdf_status queue_upload(cdf_storage *s, cdf_stream *st, char *dst, void *src, size_t nbytes, bool staged,
                               cdf_storage *keep) {
    queued_upload *u = malloc(sizeof *u);
    if (!u) {
        if (staged) cdf_device_host_free(s->dev, src, nbytes);
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (queued upload)");
    }
    cdf_storage_retain(s);
    if (keep) cdf_storage_retain(keep);
    *u = (queued_upload){s, keep, staged ? src : NULL, staged ? nbytes : 0};
    /* on failure the backend has called queued_upload_done already */
    cdf_status r = s->dev->iface->buffer_set_async(s->dev, st, dst, src, nbytes, queued_upload_done, u);
    return r == CDF_OK ? CDF_OK : cdf_error_prefix("queued copy of %zu bytes to %s: ", nbytes, s->dev->name);
}

cdf_status cdf_storage_upload_async(cdf_storage *s, cdf_stream *st, size_t at, cdf_dtype dt, const void *src,
                                    cdf_dtype src_dt, size_t n, cdf_storage *keep) {
    if (!s->dev->iface->buffer_set_async) return cdf_storage_upload(s, at, dt, src, src_dt, n);
    const size_t dsz = cdf_dtype_size(dt);
    if (!n) return CDF_OK;
    CDF_TRY(check_upload(s, at, dsz, n));
    char *dst = (char *)s->data + at * dsz;
    if (dt == src_dt) return queue_upload(s, st, dst, (void *)src, n * dsz, false, keep);
    /* one staging buffer for the whole upload (pinned allocations are costly on an accelerator),
     * held by the queue until copied */
    void *stage = cdf_device_host_alloc(s->dev, n * dsz);
    if (!stage) return cdf_last_status();
    cdf_convert(stage, dt, src, src_dt, n);
    return queue_upload(s, st, dst, stage, n * dsz, true, NULL);
}
