/* safetensors reader: mmap for zero-copy access, pread for counted range reads.
 *
 * Layout: u64 little-endian header length N, N bytes of JSON header, then the data section.
 * The header maps tensor name -> {dtype, shape, data_offsets:[begin,end)} (offsets relative to
 * the data section) plus an optional "__metadata__" string->string object. Everything in the
 * header is validated at open so that later reads cannot go out of bounds. */
#include "cdiffusers/io.h"
#include "core/error_internal.h"
#include "io/io_internal.h"
#include "io/json.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct cdf_st_file {
    char *path;
    int fd;
    const uint8_t *map;
    size_t file_size;
    uint64_t data_start; /* 8 + header length */
    uint64_t data_size;  /* file_size - data_start */
    int n;
    cdf_st_tensor *tensors; /* data order */
    int *by_name;           /* indices into tensors, sorted by name */
    int n_meta;
    char **meta_keys, **meta_values; /* sorted by key */
};

/* ---- byte counter ---- */

static _Atomic uint64_t g_bytes_read;

void cdf_io_count_bytes(uint64_t n) { atomic_fetch_add_explicit(&g_bytes_read, n, memory_order_relaxed); }
uint64_t cdf_io_bytes_read(void) { return atomic_load_explicit(&g_bytes_read, memory_order_relaxed); }
void cdf_io_reset_counters(void) { atomic_store_explicit(&g_bytes_read, 0, memory_order_relaxed); }

/* ---- dtype names ---- */

/* Valid safetensors dtypes that cdiffusers has no element type for. */
static const char *const k_unsupported_dtypes[] = {
    "F8_E8M0", "F8_E4M3FN", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F4", "F6_E2M3",
    "F6_E3M2", "U16", "U32", "U64", "C64", "E8M0",
};

static int parse_st_dtype(const char *s, cdf_dtype *out) {
    for (int i = 0; i < CDF_DTYPE_COUNT; i++) {
        if (strcmp(s, cdf_dtype_st_name((cdf_dtype)i)) == 0) {
            *out = (cdf_dtype)i;
            return 0;
        }
    }
    for (size_t i = 0; i < sizeof k_unsupported_dtypes / sizeof *k_unsupported_dtypes; i++)
        if (strcmp(s, k_unsupported_dtypes[i]) == 0) return 1;
    return -1;
}

/* ---- helpers ---- */

static cdf_status file_error(const char *path, cdf_status s, const char *fmt, ...) CDF_PRINTF(3, 4);
static cdf_status file_error(const char *path, cdf_status s, const char *fmt, ...) {
    char msg[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return cdf_error(s, "safetensors file '%s': %s", path, msg);
}

static cdf_status tensor_error(const char *path, const char *name, cdf_status s, const char *fmt, ...)
    CDF_PRINTF(4, 5);
static cdf_status tensor_error(const char *path, const char *name, cdf_status s, const char *fmt, ...) {
    char msg[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return cdf_error(s, "safetensors file '%s': tensor '%s': %s", path, name, msg);
}

static const char *json_type(const cJSON *v) {
    if (!v) return "missing";
    if (cJSON_IsNull(v)) return "null";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsObject(v)) return "an object";
    return "invalid";
}

#define ST_INT_LIMIT 9007199254740992.0 /* 2^53: larger JSON numbers are not exact in a double */

/* A JSON number that must be an exact non-negative integer. */
static bool json_uint(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return false;
    double d = v->valuedouble;
    if (!(d >= 0) || d >= ST_INT_LIMIT || floor(d) != d) return false;
    *out = (uint64_t)d;
    return true;
}

static int64_t numel_of(const cdf_st_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

int64_t cdf_st_numel(const cdf_st_tensor *t) { return t ? numel_of(t) : 0; }

/* ---- header parsing ---- */

static cdf_status parse_metadata(cdf_st_file *f, const cJSON *m) {
    if (f->meta_keys) return file_error(f->path, CDF_ERR_FORMAT, "duplicate \"__metadata__\" entry");
    if (!cJSON_IsObject(m))
        return file_error(f->path, CDF_ERR_FORMAT, "\"__metadata__\" is %s, expected an object",
                          json_type(m));
    int n = 0;
    for (const cJSON *e = m->child; e; e = e->next) n++;
    f->meta_keys = calloc((size_t)n + 1, sizeof(char *));
    f->meta_values = calloc((size_t)n + 1, sizeof(char *));
    if (!f->meta_keys || !f->meta_values)
        return file_error(f->path, CDF_ERR_OUT_OF_MEMORY, "out of memory for %d metadata entries", n);
    for (const cJSON *e = m->child; e; e = e->next) {
        if (!cJSON_IsString(e) || !e->valuestring)
            return file_error(f->path, CDF_ERR_FORMAT,
                              "\"__metadata__\" value of key '%s' is %s; only strings are allowed",
                              e->string, json_type(e));
        for (int i = 0; i < f->n_meta; i++)
            if (strcmp(f->meta_keys[i], e->string) == 0)
                return file_error(f->path, CDF_ERR_FORMAT, "\"__metadata__\" has key '%s' twice",
                                  e->string);
        f->meta_keys[f->n_meta] = strdup(e->string);
        f->meta_values[f->n_meta] = strdup(e->valuestring);
        f->n_meta++;
        if (!f->meta_keys[f->n_meta - 1] || !f->meta_values[f->n_meta - 1])
            return file_error(f->path, CDF_ERR_OUT_OF_MEMORY, "out of memory for metadata");
    }
    /* sort by key (insertion sort: metadata has a handful of entries) */
    for (int i = 1; i < f->n_meta; i++) {
        for (int j = i; j > 0 && strcmp(f->meta_keys[j - 1], f->meta_keys[j]) > 0; j--) {
            char *k = f->meta_keys[j], *v = f->meta_values[j];
            f->meta_keys[j] = f->meta_keys[j - 1];
            f->meta_values[j] = f->meta_values[j - 1];
            f->meta_keys[j - 1] = k;
            f->meta_values[j - 1] = v;
        }
    }
    return CDF_OK;
}

static cdf_status parse_entry(cdf_st_file *f, const char *name, const cJSON *e, cdf_st_tensor *t) {
    const char *p = f->path;
    if (!cJSON_IsObject(e)) return tensor_error(p, name, CDF_ERR_FORMAT, "entry is %s, expected an object", json_type(e));

    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    if (!dt) return tensor_error(p, name, CDF_ERR_FORMAT, "missing \"dtype\"");
    if (!cJSON_IsString(dt) || !dt->valuestring)
        return tensor_error(p, name, CDF_ERR_FORMAT, "\"dtype\" is %s, expected a string", json_type(dt));
    int r = parse_st_dtype(dt->valuestring, &t->dtype);
    if (r > 0)
        return cdf_error(CDF_ERR_DTYPE, "safetensors file '%s': unsupported dtype %s for tensor '%s'",
                         p, dt->valuestring, name);
    if (r < 0)
        return cdf_error(CDF_ERR_FORMAT, "safetensors file '%s': unknown dtype '%.64s' for tensor '%s'",
                         p, dt->valuestring, name);

    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    if (!sh) return tensor_error(p, name, CDF_ERR_FORMAT, "missing \"shape\"");
    if (!cJSON_IsArray(sh))
        return tensor_error(p, name, CDF_ERR_FORMAT, "\"shape\" is %s, expected an array", json_type(sh));
    int ndim = 0;
    for (const cJSON *d = sh->child; d; d = d->next) ndim++;
    if (ndim > CDF_ST_MAX_DIMS)
        return tensor_error(p, name, CDF_ERR_FORMAT, "shape has %d dims, more than the %d supported",
                            ndim, CDF_ST_MAX_DIMS);
    t->ndim = ndim;
    int i = 0;
    bool has_zero = false;
    for (const cJSON *d = sh->child; d; d = d->next, i++) {
        uint64_t v;
        if (!json_uint(d, &v)) {
            if (cJSON_IsNumber(d) && d->valuedouble < 0)
                return tensor_error(p, name, CDF_ERR_FORMAT, "shape[%d] is negative (%.0f)", i, d->valuedouble);
            return tensor_error(p, name, CDF_ERR_FORMAT,
                                "shape[%d] is not a non-negative integer below 2^53 (%s)", i,
                                json_type(d));
        }
        t->shape[i] = (int64_t)v;
        if (v == 0) has_zero = true;
    }
    uint64_t esize = cdf_dtype_size(t->dtype), numel = 1;
    if (!has_zero) {
        for (i = 0; i < ndim; i++) {
            uint64_t d = (uint64_t)t->shape[i];
            if (numel > (uint64_t)INT64_MAX / d)
                return tensor_error(p, name, CDF_ERR_FORMAT, "element count of the shape overflows 64 bits");
            numel *= d;
        }
        if (numel > (uint64_t)INT64_MAX / esize)
            return tensor_error(p, name, CDF_ERR_FORMAT, "byte size of the shape overflows 64 bits");
    } else {
        numel = 0;
    }
    uint64_t nbytes = numel * esize;

    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!off) return tensor_error(p, name, CDF_ERR_FORMAT, "missing \"data_offsets\"");
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2)
        return tensor_error(p, name, CDF_ERR_FORMAT, "\"data_offsets\" is %s, expected an array of 2 integers",
                            cJSON_IsArray(off) ? "an array of the wrong length" : json_type(off));
    uint64_t begin, end;
    if (!json_uint(off->child, &begin) || !json_uint(off->child->next, &end))
        return tensor_error(p, name, CDF_ERR_FORMAT,
                            "\"data_offsets\" must hold non-negative integers below 2^53");
    if (end < begin)
        return tensor_error(p, name, CDF_ERR_FORMAT, "data_offsets end %llu is before begin %llu",
                            (unsigned long long)end, (unsigned long long)begin);
    if (end > f->data_size)
        return tensor_error(p, name, CDF_ERR_FORMAT,
                            "data_offsets [%llu, %llu) extend beyond the data section of %llu bytes "
                            "(file truncated?)",
                            (unsigned long long)begin, (unsigned long long)end,
                            (unsigned long long)f->data_size);
    if (end - begin != nbytes)
        return tensor_error(p, name, CDF_ERR_FORMAT,
                            "data_offsets span %llu bytes but dtype %s and the shape need %llu",
                            (unsigned long long)(end - begin), cdf_dtype_st_name(t->dtype),
                            (unsigned long long)nbytes);
    t->offset = begin;
    t->nbytes = nbytes;
    return CDF_OK;
}

static int cmp_offset(const void *a, const void *b) {
    const cdf_st_tensor *x = a, *y = b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* qsort has no context argument in C17: sort (name, index) pairs rather than indices into a
 * global array, so concurrent opens stay thread-safe. */
typedef struct name_idx {
    const char *name;
    int idx;
} name_idx;

static int cmp_name_idx(const void *a, const void *b) {
    return strcmp(((const name_idx *)a)->name, ((const name_idx *)b)->name);
}

static cdf_status parse_header(cdf_st_file *f, const char *text, size_t len) {
    char desc[1200];
    snprintf(desc, sizeof desc, "header of safetensors file '%s'", f->path);
    cJSON *root = NULL;
    cdf_status s = cdf_json_parse_desc(text, len, desc, NULL, &root); /* checks the depth first */
    if (s != CDF_OK) return s; /* message already names the file and the position */
    if (!cJSON_IsObject(root)) {
        s = file_error(f->path, CDF_ERR_FORMAT, "header is %s, expected a JSON object", json_type(root));
        cJSON_Delete(root);
        return s;
    }
    int n = 0;
    for (const cJSON *e = root->child; e; e = e->next)
        if (strcmp(e->string, "__metadata__") != 0) n++;
    f->tensors = calloc((size_t)n + 1, sizeof *f->tensors);
    f->by_name = calloc((size_t)n + 1, sizeof *f->by_name);
    name_idx *order = calloc((size_t)n + 1, sizeof *order);
    if (!f->tensors || !f->by_name || !order) {
        free(order);
        cJSON_Delete(root);
        return file_error(f->path, CDF_ERR_OUT_OF_MEMORY, "out of memory for %d tensor entries", n);
    }
    for (const cJSON *e = root->child; e && s == CDF_OK; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0) {
            s = parse_metadata(f, e);
            continue;
        }
        cdf_st_tensor *t = &f->tensors[f->n];
        t->name = strdup(e->string);
        if (!t->name) {
            s = file_error(f->path, CDF_ERR_OUT_OF_MEMORY, "out of memory for tensor names");
            break;
        }
        f->n++;
        s = parse_entry(f, t->name, e, t);
    }
    cJSON_Delete(root);
    if (s != CDF_OK) {
        free(order);
        return s;
    }

    /* overlap check in data order; zero-size tensors occupy no bytes and cannot overlap */
    qsort(f->tensors, (size_t)f->n, sizeof *f->tensors, cmp_offset);
    const cdf_st_tensor *prev = NULL;
    for (int i = 0; i < f->n; i++) {
        const cdf_st_tensor *t = &f->tensors[i];
        if (t->nbytes == 0) continue;
        if (prev && t->offset < prev->offset + prev->nbytes) {
            s = cdf_error(CDF_ERR_FORMAT,
                          "safetensors file '%s': tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) "
                          "overlap",
                          f->path, prev->name, (unsigned long long)prev->offset,
                          (unsigned long long)(prev->offset + prev->nbytes), t->name,
                          (unsigned long long)t->offset, (unsigned long long)(t->offset + t->nbytes));
            free(order);
            return s;
        }
        prev = t;
    }
    for (int i = 0; i < f->n; i++) order[i] = (name_idx){f->tensors[i].name, i};
    qsort(order, (size_t)f->n, sizeof *order, cmp_name_idx);
    for (int i = 0; i < f->n; i++) {
        if (i > 0 && strcmp(order[i - 1].name, order[i].name) == 0) {
            s = file_error(f->path, CDF_ERR_FORMAT, "tensor name '%s' appears more than once in the header",
                           order[i].name);
            free(order);
            return s;
        }
        f->by_name[i] = order[i].idx;
    }
    free(order);
    return CDF_OK;
}

cdf_status cdf_st_open(const char *path, cdf_st_file **out) {
    if (!out) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_st_open: out is NULL");
    *out = NULL;
    if (!path || !path[0]) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_st_open: empty path");

    cdf_st_file *f = calloc(1, sizeof *f);
    if (!f) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "cdf_st_open: out of memory");
    f->fd = -1;
    f->path = strdup(path);
    if (!f->path) {
        free(f);
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "cdf_st_open: out of memory");
    }
    cdf_status s = cdf_io_map_file(path, "safetensors", 8, "the 8-byte header length field", &f->fd, &f->map, &f->file_size);
    if (s != CDF_OK) goto fail;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | f->map[i]; /* little-endian on any host */
    if (hlen > (uint64_t)f->file_size - 8) {
        s = file_error(path, CDF_ERR_FORMAT,
                       "header length %llu exceeds the %zu bytes that follow the length field "
                       "(truncated or not a safetensors file)",
                       (unsigned long long)hlen, f->file_size - 8);
        goto fail;
    }
    if (hlen > CDF_ST_MAX_HEADER_BYTES) {
        s = file_error(path, CDF_ERR_LIMIT, "header length %llu is over the limit of %llu bytes",
                       (unsigned long long)hlen, (unsigned long long)CDF_ST_MAX_HEADER_BYTES);
        goto fail;
    }
    if (hlen < 2) {
        s = file_error(path, CDF_ERR_FORMAT, "header length %llu is too small for a JSON object",
                       (unsigned long long)hlen);
        goto fail;
    }
    f->data_start = 8 + hlen;
    f->data_size = (uint64_t)f->file_size - f->data_start;
    s = parse_header(f, (const char *)f->map + 8, (size_t)hlen);
    if (s != CDF_OK) goto fail;
    *out = f;
    return CDF_OK;
fail:
    cdf_st_close(f);
    return s;
}

void cdf_st_close(cdf_st_file *f) {
    if (!f) return;
    if (f->map) munmap((void *)f->map, f->file_size);
    if (f->fd >= 0) close(f->fd);
    for (int i = 0; i < f->n; i++) free((char *)f->tensors[i].name);
    free(f->tensors);
    free(f->by_name);
    for (int i = 0; i < f->n_meta; i++) {
        free(f->meta_keys[i]);
        free(f->meta_values[i]);
    }
    free(f->meta_keys);
    free(f->meta_values);
    free(f->path);
    free(f);
}

/* ---- queries ---- */

const char *cdf_st_path(const cdf_st_file *f) { return f ? f->path : NULL; }
int cdf_st_count(const cdf_st_file *f) { return f ? f->n : 0; }

const cdf_st_tensor *cdf_st_tensor_at(const cdf_st_file *f, int i) {
    if (!f || i < 0 || i >= f->n) return NULL;
    return &f->tensors[i];
}

const cdf_st_tensor *cdf_st_find(const cdf_st_file *f, const char *name) {
    if (!f || !name) return NULL;
    int lo = 0, hi = f->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        const cdf_st_tensor *t = &f->tensors[f->by_name[mid]];
        int c = strcmp(name, t->name);
        if (c == 0) return t;
        if (c < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return NULL;
}

const char *cdf_st_metadata(const cdf_st_file *f, const char *key) {
    if (!f || !key) return NULL;
    for (int i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta_keys[i], key) == 0) return f->meta_values[i];
    return NULL;
}

int cdf_st_metadata_count(const cdf_st_file *f) { return f ? f->n_meta : 0; }

bool cdf_st_metadata_at(const cdf_st_file *f, int i, const char **key, const char **value) {
    if (!f || i < 0 || i >= f->n_meta) return false;
    if (key) *key = f->meta_keys[i];
    if (value) *value = f->meta_values[i];
    return true;
}

static bool owns(const cdf_st_file *f, const cdf_st_tensor *t) {
    return f && t && t >= f->tensors && t < f->tensors + f->n;
}

const void *cdf_st_data(const cdf_st_file *f, const cdf_st_tensor *t) {
    if (!owns(f, t)) return NULL;
    return f->map + f->data_start + t->offset;
}

const void *cdf_st_touch(const cdf_st_file *f, const cdf_st_tensor *t) {
    const void *p = cdf_st_data(f, t);
    if (p) cdf_io_count_bytes(t->nbytes);
    return p;
}

/* ---- counted reads ---- */

static cdf_status check_tensor(const cdf_st_file *f, const cdf_st_tensor *t, const char *fn) {
    if (!f || !t) return cdf_error(CDF_ERR_INVALID_ARG, "%s: NULL file or tensor", fn);
    if (!owns(f, t))
        return cdf_error(CDF_ERR_INVALID_ARG, "%s: tensor '%s' does not belong to safetensors file '%s'",
                         fn, t->name ? t->name : "?", f->path);
    return CDF_OK;
}

/* pread exactly n bytes at tensor byte offset `at`, retrying short reads and EINTR. */
static cdf_status pread_exact(const cdf_st_file *f, const cdf_st_tensor *t, uint64_t at, uint64_t n,
                              uint8_t *dst) {
    uint64_t file_off = f->data_start + t->offset + at;
    uint64_t done = 0;
    while (done < n) {
        uint64_t chunk = n - done;
        if (chunk > (1u << 30)) chunk = 1u << 30; /* Linux caps one read at ~2 GiB */
        ssize_t r = pread(f->fd, dst + done, (size_t)chunk, (off_t)(file_off + done));
        if (r < 0) {
            if (errno == EINTR) continue;
            return tensor_error(f->path, t->name, CDF_ERR_IO, "read of %llu bytes at file offset %llu failed: %s",
                                (unsigned long long)chunk, (unsigned long long)(file_off + done),
                                strerror(errno));
        }
        if (r == 0)
            return tensor_error(f->path, t->name, CDF_ERR_IO,
                                "unexpected end of file at offset %llu (the file shrank after it was "
                                "opened?)",
                                (unsigned long long)(file_off + done));
        done += (uint64_t)r;
        cdf_io_count_bytes((uint64_t)r);
    }
    return CDF_OK;
}

cdf_status cdf_st_read(const cdf_st_file *f, const cdf_st_tensor *t, uint64_t byte_offset,
                       uint64_t nbytes, void *dst) {
    CDF_TRY(check_tensor(f, t, "cdf_st_read"));
    if (byte_offset > t->nbytes || nbytes > t->nbytes - byte_offset)
        return tensor_error(f->path, t->name, CDF_ERR_INVALID_ARG,
                            "byte range [%llu, +%llu) is outside the tensor's %llu bytes",
                            (unsigned long long)byte_offset, (unsigned long long)nbytes,
                            (unsigned long long)t->nbytes);
    if (nbytes == 0) return CDF_OK;
    if (!dst) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_st_read: dst is NULL");
    return pread_exact(f, t, byte_offset, nbytes, dst);
}

cdf_status cdf_st_read_all(const cdf_st_file *f, const cdf_st_tensor *t, void *dst) {
    CDF_TRY(check_tensor(f, t, "cdf_st_read_all"));
    return cdf_st_read(f, t, 0, t->nbytes, dst);
}

cdf_status cdf_st_read_rows(const cdf_st_file *f, const cdf_st_tensor *t, int64_t row0, int64_t nrows,
                            void *dst) {
    CDF_TRY(check_tensor(f, t, "cdf_st_read_rows"));
    if (t->ndim < 1)
        return tensor_error(f->path, t->name, CDF_ERR_INVALID_ARG, "cannot take rows of a 0-d tensor");
    int64_t rows = t->shape[0];
    if (row0 < 0 || nrows < 0 || row0 > rows || nrows > rows - row0)
        return tensor_error(f->path, t->name, CDF_ERR_INVALID_ARG,
                            "rows [%lld, %lld + %lld) are outside dim 0 of size %lld", (long long)row0,
                            (long long)row0, (long long)nrows, (long long)rows);
    if (nrows == 0) return CDF_OK;
    uint64_t row_bytes = t->nbytes / (uint64_t)rows; /* exact: nbytes = rows * row_bytes */
    return cdf_st_read(f, t, (uint64_t)row0 * row_bytes, (uint64_t)nrows * row_bytes, dst);
}

cdf_status cdf_st_read_cols(const cdf_st_file *f, const cdf_st_tensor *t, int64_t col0, int64_t ncols,
                            void *dst) {
    CDF_TRY(check_tensor(f, t, "cdf_st_read_cols"));
    if (t->ndim < 1)
        return tensor_error(f->path, t->name, CDF_ERR_INVALID_ARG, "cannot take columns of a 0-d tensor");
    int64_t cols = t->shape[t->ndim - 1];
    if (col0 < 0 || ncols < 0 || col0 > cols || ncols > cols - col0)
        return tensor_error(f->path, t->name, CDF_ERR_INVALID_ARG,
                            "columns [%lld, %lld + %lld) are outside the last dim of size %lld",
                            (long long)col0, (long long)col0, (long long)ncols, (long long)cols);
    if (ncols == 0 || t->nbytes == 0) return CDF_OK;
    if (!dst) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_st_read_cols: dst is NULL");
    if (ncols == cols) return pread_exact(f, t, 0, t->nbytes, dst);
    uint64_t esize = cdf_dtype_size(t->dtype);
    uint64_t row_bytes = (uint64_t)cols * esize;
    uint64_t lead = t->nbytes / row_bytes;
    uint64_t piece = (uint64_t)ncols * esize;
    uint8_t *d = dst;
    for (uint64_t r = 0; r < lead; r++)
        CDF_TRY(pread_exact(f, t, r * row_bytes + (uint64_t)col0 * esize, piece, d + r * piece));
    return CDF_OK;
}
