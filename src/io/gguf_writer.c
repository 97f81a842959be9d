/* GGUF writer (v3): the layout gguf.c reads (see there), written as gguf-py's GGUFWriter does:
 * "GGUF", u32 version 3, u64 tensor count, u64 key/value count, the key/values, the tensor infos
 * (name, u32 dims, u64 ne[] innermost first, u32 ggml type, u64 offset from the data section),
 * zero padding to the alignment, then the tensors, each padded to the alignment. Written through
 * cdf_atomic_file: nothing appears at the target until every byte is written. */
#include "cdiffusers/io.h"
#include "core/error_internal.h"
#include "io/io_internal.h"
#include "io/atomic_file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { KV_U32 = 4, KV_STRING = 8 };

typedef struct wkv {
    char *key;
    int type;
    uint32_t u32;
    char *str;
} wkv;

typedef struct wtensor {
    char *name;
    uint32_t type;
    int ndim;
    int64_t shape[CDF_ST_MAX_DIMS];
    uint64_t nbytes, offset;
    const void *data;
} wtensor;

struct cdf_gguf_writer {
    uint32_t alignment;
    wkv *kv;
    int n_kv, cap_kv;
    wtensor *t;
    int n, cap;
    uint64_t data_bytes; /* the data section, padded */
};

static uint64_t pad_to(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

cdf_gguf_writer *cdf_gguf_writer_new(uint32_t alignment) {
    if (alignment == 0) alignment = 32;
    if (alignment & (alignment - 1)) {
        cdf_error(CDF_ERR_INVALID_ARG, "cdf_gguf_writer_new: alignment %u is not a power of two", alignment);
        return NULL;
    }
    cdf_gguf_writer *w = calloc(1, sizeof *w);
    if (!w) {
        cdf_error(CDF_ERR_OUT_OF_MEMORY, "cdf_gguf_writer_new: out of memory");
        return NULL;
    }
    w->alignment = alignment;
    if (alignment != 32 && cdf_gguf_writer_set_u32(w, "general.alignment", alignment) != CDF_OK) {
        cdf_gguf_writer_free(w);
        return NULL;
    }
    return w;
}

void cdf_gguf_writer_free(cdf_gguf_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->n_kv; i++) free(w->kv[i].key), free(w->kv[i].str);
    for (int i = 0; i < w->n; i++) free(w->t[i].name);
    free(w->kv);
    free(w->t);
    free(w);
}

static cdf_status add_kv(cdf_gguf_writer *w, const char *key, int type, uint32_t u32, const char *str) {
    if (!w || !key || !key[0]) return cdf_error(CDF_ERR_INVALID_ARG, "GGUF writer: a NULL writer or an empty key");
    for (int i = 0; i < w->n_kv; i++)
        if (strcmp(w->kv[i].key, key) == 0) return cdf_error(CDF_ERR_INVALID_ARG, "GGUF writer: key '%s' was already set", key);
    if (w->n_kv == w->cap_kv) {
        int cap = w->cap_kv ? 2 * w->cap_kv : 8;
        wkv *n = realloc(w->kv, (size_t)cap * sizeof *n);
        if (!n) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "GGUF writer: out of memory");
        w->kv = n;
        w->cap_kv = cap;
    }
    wkv *k = &w->kv[w->n_kv];
    *k = (wkv){.key = strdup(key), .type = type, .u32 = u32, .str = str ? strdup(str) : NULL};
    if (!k->key || (str && !k->str)) {
        free(k->key), free(k->str);
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "GGUF writer: out of memory");
    }
    w->n_kv++;
    return CDF_OK;
}

cdf_status cdf_gguf_writer_set_string(cdf_gguf_writer *w, const char *key, const char *value) {
    if (!value) return cdf_error(CDF_ERR_INVALID_ARG, "GGUF writer: key '%s' has a NULL value", key ? key : "");
    return add_kv(w, key, KV_STRING, 0, value);
}

cdf_status cdf_gguf_writer_set_u32(cdf_gguf_writer *w, const char *key, uint32_t value) {
    return add_kv(w, key, KV_U32, value, NULL);
}

cdf_status cdf_gguf_writer_add(cdf_gguf_writer *w, const char *name, uint32_t type, int ndim, const int64_t *shape,
                               const void *data) {
    if (!w || !name || !name[0]) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_gguf_writer_add: a NULL writer or an empty name");
    int64_t be, bb;
    if (!cdf_ggml_type_block(type, &be, &bb))
        return cdf_error(CDF_ERR_INVALID_ARG, "cdf_gguf_writer_add('%s'): unknown ggml type %u", name, type);
    if (ndim < 1 || ndim > 4 || ndim > CDF_ST_MAX_DIMS || !shape) /* GGML_MAX_DIMS is 4 */
        return cdf_error(CDF_ERR_INVALID_ARG, "cdf_gguf_writer_add('%s'): %d dims (GGUF holds 1 to 4)", name, ndim);
    uint64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] <= 0 || (uint64_t)shape[i] > UINT64_MAX / 2 / numel)
            return cdf_error(CDF_ERR_INVALID_ARG, "cdf_gguf_writer_add('%s'): dim %d is %lld", name, i, (long long)shape[i]);
        numel *= (uint64_t)shape[i];
    }
    if (shape[ndim - 1] % be)
        return cdf_error(CDF_ERR_INVALID_ARG, "cdf_gguf_writer_add('%s'): rows of %lld values are not whole %s blocks of %lld",
                         name, (long long)shape[ndim - 1], cdf_ggml_type_name(type), (long long)be);
    for (int i = 0; i < w->n; i++)
        if (strcmp(w->t[i].name, name) == 0)
            return cdf_error(CDF_ERR_INVALID_ARG, "cdf_gguf_writer_add: tensor '%s' was already added", name);
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 16;
        wtensor *n = realloc(w->t, (size_t)cap * sizeof *n);
        if (!n) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "GGUF writer: out of memory");
        w->t = n;
        w->cap = cap;
    }
    wtensor *t = &w->t[w->n];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name))) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "GGUF writer: out of memory");
    t->type = type;
    t->ndim = ndim;
    memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
    t->nbytes = numel / (uint64_t)be * (uint64_t)bb;
    t->offset = w->data_bytes;
    t->data = data;
    w->data_bytes = pad_to(w->data_bytes + t->nbytes, w->alignment);
    w->n++;
    return CDF_OK;
}

int cdf_gguf_writer_count(const cdf_gguf_writer *w) { return w ? w->n : 0; }

static uint64_t header_bytes(const cdf_gguf_writer *w) {
    uint64_t n = 4 + 4 + 8 + 8;
    for (int i = 0; i < w->n_kv; i++)
        n += 8 + strlen(w->kv[i].key) + 4 + (w->kv[i].type == KV_STRING ? 8 + strlen(w->kv[i].str) : 4);
    for (int i = 0; i < w->n; i++) n += 8 + strlen(w->t[i].name) + 4 + 8 * (uint64_t)w->t[i].ndim + 4 + 8;
    return n;
}

uint64_t cdf_gguf_writer_file_size(const cdf_gguf_writer *w) {
    return w ? pad_to(header_bytes(w), w->alignment) + w->data_bytes : 0;
}

/* ---- save ---- */

typedef struct out {
    FILE *fp;
    bool ok;
} out;

static void put(out *o, const void *p, size_t n) {
    if (o->ok && n) o->ok = fwrite(p, 1, n, o->fp) == n;
}

static void put_le(out *o, uint64_t v, int n) {
    uint8_t b[8];
    for (int i = 0; i < n; i++) b[i] = (uint8_t)(v >> (8 * i));
    put(o, b, (size_t)n);
}

static void put_str(out *o, const char *s) {
    size_t n = strlen(s);
    put_le(o, n, 8);
    put(o, s, n);
}

static void put_zeros(out *o, uint64_t n) {
    static const uint8_t z[64];
    while (n) {
        size_t k = n < sizeof z ? (size_t)n : sizeof z;
        put(o, z, k);
        n -= k;
    }
}

cdf_status cdf_gguf_writer_save(const cdf_gguf_writer *w, const char *path, bool overwrite, cdf_gguf_fill_fn fill, void *ctx) {
    if (!w || !path) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_gguf_writer_save: NULL writer or path");
    uint64_t largest = 0;
    for (int i = 0; i < w->n; i++) {
        if (!w->t[i].data && !fill)
            return cdf_error(CDF_ERR_INVALID_ARG, "cdf_gguf_writer_save: tensor '%s' has no data and no fill function was given",
                             w->t[i].name);
        if (!w->t[i].data && w->t[i].nbytes > largest) largest = w->t[i].nbytes;
    }
    void *buf = NULL;
    if (largest && !(buf = malloc((size_t)largest)))
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "writing GGUF file '%s': no host memory for a %llu-byte tensor", path,
                         (unsigned long long)largest);
    cdf_atomic_file *af = NULL;
    cdf_status s = cdf_atomic_file_open(path, overwrite, &af);
    if (s != CDF_OK) {
        free(buf);
        return s;
    }
    out o = {cdf_atomic_file_stream(af), true};
    put(&o, "GGUF", 4);
    put_le(&o, 3, 4);
    put_le(&o, (uint64_t)w->n, 8);
    put_le(&o, (uint64_t)w->n_kv, 8);
    for (int i = 0; i < w->n_kv; i++) {
        put_str(&o, w->kv[i].key);
        put_le(&o, (uint64_t)w->kv[i].type, 4);
        if (w->kv[i].type == KV_STRING) put_str(&o, w->kv[i].str);
        else put_le(&o, w->kv[i].u32, 4);
    }
    for (int i = 0; i < w->n; i++) {
        const wtensor *t = &w->t[i];
        put_str(&o, t->name);
        put_le(&o, (uint64_t)t->ndim, 4);
        for (int d = t->ndim - 1; d >= 0; d--) put_le(&o, (uint64_t)t->shape[d], 8); /* innermost first */
        put_le(&o, t->type, 4);
        put_le(&o, t->offset, 8);
    }
    const uint64_t head = header_bytes(w);
    put_zeros(&o, pad_to(head, w->alignment) - head);
    for (int i = 0; o.ok && s == CDF_OK && i < w->n; i++) {
        const wtensor *t = &w->t[i];
        const void *data = t->data;
        if (!data) {
            s = fill(ctx, i, buf, t->nbytes);
            data = buf;
        }
        if (s == CDF_OK) {
            put(&o, data, (size_t)t->nbytes);
            put_zeros(&o, pad_to(t->nbytes, w->alignment) - t->nbytes);
        }
    }
    int err = errno;
    free(buf);
    if (s != CDF_OK || !o.ok) {
        cdf_atomic_file_abort(af);
        if (s != CDF_OK) {
            cdf_error_prefix("writing GGUF file '%s': ", path);
            return s;
        }
        return cdf_error(CDF_ERR_IO, "writing GGUF file '%s' failed: %s", path, strerror(err ? err : EIO));
    }
    return cdf_atomic_file_commit(af);
}
