/* Storages backed by a device: accounted device memory, virtual buffers of a capture, and host
 * uploads through the backend (declared in backend/backend_impl.h). */
#include <stdlib.h>

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

cdf_status cdf_storage_upload(cdf_storage *s, size_t at, cdf_dtype dt, const void *src, cdf_dtype src_dt, size_t n) {
    const size_t dsz = cdf_dtype_size(dt), ssz = cdf_dtype_size(src_dt);
    if (!n) return CDF_OK;
    if (s->is_virtual || !s->data)
        return cdf_error(CDF_ERR_INTERNAL, "upload into a buffer without device memory");
    if ((at + n) * dsz > s->nbytes)
        return cdf_error(CDF_ERR_INTERNAL, "upload of %zu elements at %zu overruns a %zu-byte buffer", n, at, s->nbytes);
    char *dst = (char *)s->data + at * dsz;
    if (dt == src_dt) return cdf_device_buffer_set(s->dev, dst, src, n * dsz);
    const size_t chunk = n < UPLOAD_CHUNK_ELEMS ? n : UPLOAD_CHUNK_ELEMS;
    void *stage = cdf_device_host_alloc(s->dev, chunk * dsz);
    if (!stage) return cdf_last_status();
    cdf_status st = CDF_OK;
    for (size_t o = 0; o < n && st == CDF_OK; o += chunk) {
        const size_t c = n - o < chunk ? n - o : chunk;
        cdf_convert(stage, dt, (const char *)src + o * ssz, src_dt, c);
        st = cdf_device_buffer_set(s->dev, dst + o * dsz, stage, c * dsz);
    }
    cdf_device_host_free(s->dev, stage, chunk * dsz);
    return st;
}

