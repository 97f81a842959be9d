/* safetensors writer, byte-compatible with the Python/Rust safetensors library:
 * the same tensor order (descending dtype alignment, then name), compact JSON with
 * "__metadata__" first, the same string escaping (serde_json's), and the header padded with
 * spaces to a multiple of 8 bytes so every tensor's data stays aligned. */
#include "cdiffusers/io.h"
#include "core/error_internal.h"
#include "io/atomic_file.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

typedef struct wtensor {
    char *name;
    cdf_dtype dtype;
    int ndim;
    int64_t shape[CDF_ST_MAX_DIMS];
    uint8_t *data;
    uint64_t nbytes;
} wtensor;

struct cdf_st_writer {
    int n, cap;
    wtensor *t;
    int n_meta, cap_meta;
    char **meta_keys, **meta_values;
};

cdf_st_writer *cdf_st_writer_new(void) { return calloc(1, sizeof(cdf_st_writer)); }

void cdf_st_writer_free(cdf_st_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->n; i++) {
        free(w->t[i].name);
        free(w->t[i].data);
    }
    free(w->t);
    for (int i = 0; i < w->n_meta; i++) {
        free(w->meta_keys[i]);
        free(w->meta_values[i]);
    }
    free(w->meta_keys);
    free(w->meta_values);
    free(w);
}

cdf_status cdf_st_writer_add(cdf_st_writer *w, const char *name, cdf_dtype dtype, int ndim,
                             const int64_t *shape, const void *data) {
    if (!w) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_st_writer_add: writer is NULL");
    if (!name || !name[0]) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_st_writer_add: empty tensor name");
    if (strcmp(name, "__metadata__") == 0)
        return cdf_error(CDF_ERR_INVALID_ARG, "cdf_st_writer_add: '__metadata__' is reserved, not a tensor name");
    if ((unsigned)dtype >= CDF_DTYPE_COUNT)
        return cdf_error(CDF_ERR_INVALID_ARG, "cdf_st_writer_add('%s'): invalid dtype %d", name, (int)dtype);
    if (ndim < 0 || ndim > CDF_ST_MAX_DIMS)
        return cdf_error(CDF_ERR_INVALID_ARG, "cdf_st_writer_add('%s'): ndim %d outside 0..%d", name, ndim,
                         CDF_ST_MAX_DIMS);
    if (ndim > 0 && !shape) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_st_writer_add('%s'): shape is NULL", name);
    uint64_t numel = 1;
    bool zero = false;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return cdf_error(CDF_ERR_INVALID_ARG, "cdf_st_writer_add('%s'): shape[%d] = %lld is negative",
                             name, i, (long long)shape[i]);
        if (shape[i] == 0) zero = true;
    }
    uint64_t esize = cdf_dtype_size(dtype);
    if (zero) {
        numel = 0;
    } else {
        for (int i = 0; i < ndim; i++) {
            if (numel > (uint64_t)INT64_MAX / (uint64_t)shape[i])
                return cdf_error(CDF_ERR_INVALID_ARG, "cdf_st_writer_add('%s'): element count overflows", name);
            numel *= (uint64_t)shape[i];
        }
        if (numel > (uint64_t)INT64_MAX / esize)
            return cdf_error(CDF_ERR_INVALID_ARG, "cdf_st_writer_add('%s'): byte size overflows", name);
    }
    uint64_t nbytes = numel * esize;
    if (nbytes && !data) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_st_writer_add('%s'): data is NULL", name);
    if (nbytes > SIZE_MAX)
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "cdf_st_writer_add('%s'): %llu bytes do not fit in memory",
                         name, (unsigned long long)nbytes);
    for (int i = 0; i < w->n; i++)
        if (strcmp(w->t[i].name, name) == 0)
            return cdf_error(CDF_ERR_INVALID_ARG, "cdf_st_writer_add: tensor '%s' was already added", name);
    if (w->n == w->cap) {
        int cap = w->cap ? w->cap * 2 : 16;
        wtensor *nt = realloc(w->t, (size_t)cap * sizeof *nt);
        if (!nt) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "cdf_st_writer_add('%s'): out of memory", name);
        w->t = nt;
        w->cap = cap;
    }
    wtensor *t = &w->t[w->n];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    t->data = malloc(nbytes ? (size_t)nbytes : 1);
    if (!t->name || !t->data) {
        free(t->name);
        free(t->data);
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "cdf_st_writer_add('%s'): cannot copy %llu bytes", name,
                         (unsigned long long)nbytes);
    }
    if (nbytes) memcpy(t->data, data, (size_t)nbytes);
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->nbytes = nbytes;
    w->n++;
    return CDF_OK;
}

cdf_status cdf_st_writer_set_metadata(cdf_st_writer *w, const char *key, const char *value) {
    if (!w || !key || !value)
        return cdf_error(CDF_ERR_INVALID_ARG, "cdf_st_writer_set_metadata: NULL writer, key or value");
    for (int i = 0; i < w->n_meta; i++) {
        if (strcmp(w->meta_keys[i], key) == 0) {
            char *v = strdup(value);
            if (!v) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "cdf_st_writer_set_metadata: out of memory");
            free(w->meta_values[i]);
            w->meta_values[i] = v;
            return CDF_OK;
        }
    }
    if (w->n_meta == w->cap_meta) {
        int cap = w->cap_meta ? w->cap_meta * 2 : 4;
        char **k = realloc(w->meta_keys, (size_t)cap * sizeof *k);
        if (!k) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "cdf_st_writer_set_metadata: out of memory");
        w->meta_keys = k;
        char **v = realloc(w->meta_values, (size_t)cap * sizeof *v);
        if (!v) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "cdf_st_writer_set_metadata: out of memory");
        w->meta_values = v;
        w->cap_meta = cap;
    }
    char *k = strdup(key), *v = strdup(value);
    if (!k || !v) {
        free(k);
        free(v);
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "cdf_st_writer_set_metadata: out of memory");
    }
    w->meta_keys[w->n_meta] = k;
    w->meta_values[w->n_meta] = v;
    w->n_meta++;
    return CDF_OK;
}

/* ---- header text ---- */

typedef struct sbuf {
    char *p;
    size_t len, cap;
    bool oom;
} sbuf;

static void sb_putn(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *np = realloc(b->p, cap);
        if (!np) {
            b->oom = true;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}
static void sb_puts(sbuf *b, const char *s) { sb_putn(b, s, strlen(s)); }
static void sb_u64(sbuf *b, uint64_t v) {
    char tmp[32];
    snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v);
    sb_puts(b, tmp);
}

/* JSON string with serde_json's escaping: \" \\ \b \f \n \r \t, other control characters as
 * \u00xx (lower-case hex), everything else (UTF-8 included) verbatim. */
static void sb_json_string(sbuf *b, const char *s) {
    static const char hex[] = "0123456789abcdef";
    sb_putn(b, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        switch (*c) {
        case '"': sb_putn(b, "\\\"", 2); break;
        case '\\': sb_putn(b, "\\\\", 2); break;
        case '\b': sb_putn(b, "\\b", 2); break;
        case '\f': sb_putn(b, "\\f", 2); break;
        case '\n': sb_putn(b, "\\n", 2); break;
        case '\r': sb_putn(b, "\\r", 2); break;
        case '\t': sb_putn(b, "\\t", 2); break;
        default:
            if (*c < 0x20) {
                char u[6] = {'\\', 'u', '0', '0', hex[*c >> 4], hex[*c & 15]};
                sb_putn(b, u, 6);
            } else {
                sb_putn(b, (const char *)c, 1);
            }
        }
    }
    sb_putn(b, "\"", 1);
}

/* Position of each dtype in safetensors' Dtype enum, which is declared in increasing alignment
 * order; the library sorts tensors by this rank, descending, then by name. */
static int dtype_rank(cdf_dtype dt) {
    switch (dt) {
    case CDF_BOOL: return 0;
    case CDF_U8: return 1;
    case CDF_I8: return 2;
    case CDF_I16: return 5;
    case CDF_F16: return 7;
    case CDF_BF16: return 8;
    case CDF_I32: return 9;
    case CDF_F32: return 11;
    case CDF_F64: return 12;
    case CDF_I64: return 13;
    default: return -1;
    }
}

static int cmp_wtensor(const void *a, const void *b) {
    const wtensor *x = *(const wtensor *const *)a, *y = *(const wtensor *const *)b;
    int rx = dtype_rank(x->dtype), ry = dtype_rank(y->dtype);
    if (rx != ry) return ry - rx;
    return strcmp(x->name, y->name);
}

cdf_status cdf_st_writer_save(const cdf_st_writer *w, const char *path) {
    if (!w || !path) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_st_writer_save: NULL writer or path");
    const wtensor **order = malloc(((size_t)w->n + 1) * sizeof *order);
    int *meta_order = malloc(((size_t)w->n_meta + 1) * sizeof *meta_order);
    if (!order || !meta_order) {
        free(order);
        free(meta_order);
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "cdf_st_writer_save: out of memory");
    }
    for (int i = 0; i < w->n; i++) order[i] = &w->t[i];
    qsort(order, (size_t)w->n, sizeof *order, cmp_wtensor);
    for (int i = 0; i < w->n_meta; i++) meta_order[i] = i;
    /* few metadata keys: insertion sort by key */
    for (int i = 1; i < w->n_meta; i++)
        for (int j = i; j > 0 && strcmp(w->meta_keys[meta_order[j - 1]], w->meta_keys[meta_order[j]]) > 0; j--) {
            int tmp = meta_order[j];
            meta_order[j] = meta_order[j - 1];
            meta_order[j - 1] = tmp;
        }

    sbuf h = {0};
    sb_putn(&h, "{", 1);
    bool first = true;
    if (w->n_meta > 0) {
        sb_puts(&h, "\"__metadata__\":{");
        for (int i = 0; i < w->n_meta; i++) {
            if (i) sb_putn(&h, ",", 1);
            sb_json_string(&h, w->meta_keys[meta_order[i]]);
            sb_putn(&h, ":", 1);
            sb_json_string(&h, w->meta_values[meta_order[i]]);
        }
        sb_putn(&h, "}", 1);
        first = false;
    }
    uint64_t offset = 0;
    for (int i = 0; i < w->n; i++) {
        const wtensor *t = order[i];
        if (!first) sb_putn(&h, ",", 1);
        first = false;
        sb_json_string(&h, t->name);
        sb_puts(&h, ":{\"dtype\":\"");
        sb_puts(&h, cdf_dtype_st_name(t->dtype));
        sb_puts(&h, "\",\"shape\":[");
        for (int d = 0; d < t->ndim; d++) {
            if (d) sb_putn(&h, ",", 1);
            sb_u64(&h, (uint64_t)t->shape[d]);
        }
        sb_puts(&h, "],\"data_offsets\":[");
        sb_u64(&h, offset);
        sb_putn(&h, ",", 1);
        sb_u64(&h, offset + t->nbytes);
        sb_puts(&h, "]}");
        offset += t->nbytes;
    }
    sb_putn(&h, "}", 1);
    while (!h.oom && h.len % 8 != 0) sb_putn(&h, " ", 1);
    free(meta_order);
    if (h.oom) {
        free(h.p);
        free(order);
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "cdf_st_writer_save: out of memory for the header");
    }

    cdf_atomic_file *af = NULL;
    cdf_status s = cdf_atomic_file_open(path, true, &af);
    if (s != CDF_OK) {
        free(h.p);
        free(order);
        return s;
    }
    FILE *fp = cdf_atomic_file_stream(af);
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)h.len >> (8 * i));
    bool ok = fwrite(len8, 1, 8, fp) == 8 && fwrite(h.p, 1, h.len, fp) == h.len;
    for (int i = 0; ok && i < w->n; i++)
        if (order[i]->nbytes) ok = fwrite(order[i]->data, 1, (size_t)order[i]->nbytes, fp) == order[i]->nbytes;
    int err = errno;
    free(h.p);
    free(order);
    if (!ok) {
        cdf_atomic_file_abort(af);
        return cdf_error(CDF_ERR_IO, "writing safetensors file '%s' failed: %s", path,
                         strerror(err ? err : EIO));
    }
    return cdf_atomic_file_commit(af);
}
