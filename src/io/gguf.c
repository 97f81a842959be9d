/* GGUF reader: mmap, every field validated at open.
 *
 * Layout (little-endian): "GGUF", u32 version, u64 tensor count, u64 key/value count, the
 * key/value pairs (string key, u32 value type, value), the tensor infos (string name, u32 ndims,
 * u64 ne[ndims] innermost first, u32 ggml type, u64 offset), padding to general.alignment, then
 * the data section, each tensor at its offset from the section's start. A string is a u64 length
 * and that many bytes (no NUL). Version 1 used u32 counts and lengths; 2 and 3 share the layout
 * (3 only allowed big-endian files, which this reader refuses). */
#include "cdiffusers/io.h"
#include "core/error_internal.h"
#include "io/io_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

enum { GGUF_U8, GGUF_I8, GGUF_U16, GGUF_I16, GGUF_U32, GGUF_I32, GGUF_F32, GGUF_BOOL, GGUF_STRING, GGUF_ARRAY,
       GGUF_U64, GGUF_I64, GGUF_F64, GGUF_TYPE_COUNT };

static const char *const k_value_type_names[GGUF_TYPE_COUNT] = {"u8",   "i8",     "u16",   "i16", "u32",
                                                               "i32",  "f32",    "bool",  "string", "array",
                                                               "u64",  "i64",    "f64"};
static const uint8_t k_value_size[GGUF_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

typedef struct gguf_kv {
    char *key;
    int type;
    uint64_t at;   /* file offset of the value (after the type field) */
    char *string;  /* a string value, NUL-terminated copy */
    int elem_type; /* arrays */
    uint64_t count;
} gguf_kv;

struct cdf_gguf_file {
    char *path;
    int fd;
    const uint8_t *map;
    uint64_t size;
    uint32_t version;
    uint64_t alignment;
    uint64_t data_start;
    int n;
    cdf_gguf_tensor *tensors;
    int *by_name; /* indices sorted by name */
    int n_kv;
    gguf_kv *kv;
};

/* ---- parsing ---- */

typedef struct cursor {
    cdf_gguf_file *f;
    uint64_t at;
} cursor;

static cdf_status gguf_error(const cdf_gguf_file *f, cdf_status s, const char *fmt, ...) CDF_PRINTF(3, 4);
static cdf_status gguf_error(const cdf_gguf_file *f, cdf_status s, const char *fmt, ...) {
    char msg[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return cdf_error(s, "GGUF file '%s': %s", f->path, msg);
}

/* Needs n more bytes at the cursor; `what` names the field for the truncation message. */
static cdf_status need(const cursor *c, uint64_t n, const char *what) {
    if (n > c->f->size - c->at)
        return gguf_error(c->f, CDF_ERR_FORMAT, "%s at byte %llu needs %llu bytes but the file ends at %llu (truncated?)",
                          what, (unsigned long long)c->at, (unsigned long long)n, (unsigned long long)c->f->size);
    return CDF_OK;
}

static uint64_t le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static cdf_status rd(cursor *c, int n, const char *what, uint64_t *v) {
    CDF_TRY(need(c, (uint64_t)n, what));
    *v = le(c->f->map + c->at, n);
    c->at += (uint64_t)n;
    return CDF_OK;
}

static cdf_status rd32(cursor *c, const char *what, uint32_t *v) {
    uint64_t x;
    CDF_TRY(rd(c, 4, what, &x));
    *v = (uint32_t)x;
    return CDF_OK;
}

/* A string: returns its bytes' offset and length, checked against the file. */
static cdf_status rd_string(cursor *c, const char *what, uint64_t *at, uint64_t *len) {
    uint64_t n;
    CDF_TRY(rd(c, 8, what, &n));
    if (n > CDF_GGUF_MAX_STRING_BYTES)
        return gguf_error(c->f, CDF_ERR_LIMIT, "%s at byte %llu has length %llu, over the limit of %llu", what,
                          (unsigned long long)(c->at - 8), (unsigned long long)n,
                          (unsigned long long)CDF_GGUF_MAX_STRING_BYTES);
    CDF_TRY(need(c, n, what));
    *at = c->at;
    *len = n;
    c->at += n;
    return CDF_OK;
}

static char *dup_bytes(const uint8_t *p, uint64_t n) {
    char *s = malloc((size_t)n + 1);
    if (!s) return NULL;
    memcpy(s, p, (size_t)n);
    s[n] = 0;
    return s;
}

static cdf_status skip_value(cursor *c, int type, int depth, const char *key);

static cdf_status skip_array(cursor *c, int depth, const char *key, int *elem_type, uint64_t *count) {
    if (depth >= CDF_GGUF_MAX_ARRAY_DEPTH)
        return gguf_error(c->f, CDF_ERR_LIMIT, "key '%s': arrays nested more than %d deep", key, CDF_GGUF_MAX_ARRAY_DEPTH);
    uint32_t et;
    uint64_t n;
    CDF_TRY(rd32(c, "array element type", &et));
    CDF_TRY(rd(c, 8, "array length", &n));
    if (et >= GGUF_TYPE_COUNT)
        return gguf_error(c->f, CDF_ERR_FORMAT, "key '%s': unknown array element type %u", key, et);
    /* every element takes at least one byte: a count larger than what is left is malformed,
     * and checking it first bounds the loop below by the file size */
    if (n > c->f->size - c->at)
        return gguf_error(c->f, CDF_ERR_FORMAT, "key '%s': array of %llu elements does not fit in the %llu bytes left (truncated?)",
                          key, (unsigned long long)n, (unsigned long long)(c->f->size - c->at));
    if (elem_type) *elem_type = (int)et;
    if (count) *count = n;
    if (k_value_size[et]) {
        uint64_t bytes = n * k_value_size[et]; /* n <= file size: no overflow */
        CDF_TRY(need(c, bytes, "array data"));
        c->at += bytes;
        return CDF_OK;
    }
    for (uint64_t i = 0; i < n; i++) CDF_TRY(skip_value(c, (int)et, depth + 1, key));
    return CDF_OK;
}

static cdf_status skip_value(cursor *c, int type, int depth, const char *key) {
    if (type == GGUF_STRING) {
        uint64_t at, len;
        return rd_string(c, "string value", &at, &len);
    }
    if (type == GGUF_ARRAY) return skip_array(c, depth, key, NULL, NULL);
    CDF_TRY(need(c, k_value_size[type], "value"));
    c->at += k_value_size[type];
    return CDF_OK;
}

static cdf_status parse_kv(cursor *c, gguf_kv *kv) {
    uint64_t at, len;
    CDF_TRY(rd_string(c, "key", &at, &len));
    kv->key = dup_bytes(c->f->map + at, len);
    if (!kv->key) return gguf_error(c->f, CDF_ERR_OUT_OF_MEMORY, "out of memory for keys");
    if (strlen(kv->key) != len)
        return gguf_error(c->f, CDF_ERR_FORMAT, "key at byte %llu contains a NUL byte", (unsigned long long)at);
    uint32_t type;
    CDF_TRY(rd32(c, "value type", &type));
    if (type >= GGUF_TYPE_COUNT)
        return gguf_error(c->f, CDF_ERR_FORMAT, "key '%s' has unknown value type %u", kv->key, type);
    kv->type = (int)type;
    kv->at = c->at;
    if (type == GGUF_STRING) {
        CDF_TRY(rd_string(c, "string value", &at, &len));
        kv->string = dup_bytes(c->f->map + at, len);
        if (!kv->string) return gguf_error(c->f, CDF_ERR_OUT_OF_MEMORY, "out of memory for values");
        return CDF_OK;
    }
    if (type == GGUF_ARRAY) return skip_array(c, 0, kv->key, &kv->elem_type, &kv->count);
    return skip_value(c, (int)type, 0, kv->key);
}

static const gguf_kv *find_kv(const cdf_gguf_file *f, const char *key) {
    if (!f || !key) return NULL;
    for (int i = 0; i < f->n_kv; i++)
        if (strcmp(f->kv[i].key, key) == 0) return &f->kv[i];
    return NULL;
}

static cdf_status parse_tensor_info(cursor *c, cdf_gguf_tensor *t) {
    uint64_t at, len;
    CDF_TRY(rd_string(c, "tensor name", &at, &len));
    char *name = dup_bytes(c->f->map + at, len);
    if (!name) return gguf_error(c->f, CDF_ERR_OUT_OF_MEMORY, "out of memory for tensor names");
    t->name = name;
    if (strlen(name) != len || len == 0)
        return gguf_error(c->f, CDF_ERR_FORMAT, "tensor name at byte %llu is empty or contains a NUL byte",
                          (unsigned long long)at);
    uint32_t nd;
    CDF_TRY(rd32(c, "tensor dim count", &nd));
    if (nd < 1 || nd > CDF_ST_MAX_DIMS)
        return gguf_error(c->f, CDF_ERR_FORMAT, "tensor '%s' has %u dims (1..%d supported)", name, nd, CDF_ST_MAX_DIMS);
    t->ndim = (int)nd;
    uint64_t ne[CDF_ST_MAX_DIMS];
    for (uint32_t i = 0; i < nd; i++) CDF_TRY(rd(c, 8, "tensor dim", &ne[i]));
    uint32_t type;
    CDF_TRY(rd32(c, "tensor type", &type));
    CDF_TRY(rd(c, 8, "tensor offset", &t->offset));
    t->type = type;
    int64_t be, bb;
    if (!cdf_ggml_type_block(type, &be, &bb))
        return gguf_error(c->f, CDF_ERR_FORMAT, "tensor '%s' has unknown ggml type %u", name, type);
    uint64_t numel = 1;
    for (uint32_t i = 0; i < nd; i++) {
        if (ne[i] > (uint64_t)INT64_MAX || (ne[i] && numel > (uint64_t)INT64_MAX / ne[i]))
            return gguf_error(c->f, CDF_ERR_FORMAT, "tensor '%s': element count overflows 64 bits", name);
        numel *= ne[i];
        t->shape[nd - 1 - i] = (int64_t)ne[i];
    }
    if (ne[0] % (uint64_t)be != 0)
        return gguf_error(c->f, CDF_ERR_FORMAT, "tensor '%s' of type %s: row length %llu is not a multiple of the block size %lld",
                          name, cdf_ggml_type_name(type), (unsigned long long)ne[0], (long long)be);
    /* numel / be * bb <= numel * 292 / 32... fits: numel < 2^63 and bb / be <= 9 is not
     * guaranteed for every type, so check */
    uint64_t blocks = numel / (uint64_t)be;
    if (blocks > (uint64_t)INT64_MAX / (uint64_t)bb)
        return gguf_error(c->f, CDF_ERR_FORMAT, "tensor '%s': byte size overflows 64 bits", name);
    t->nbytes = blocks * (uint64_t)bb;
    return CDF_OK;
}

typedef struct name_idx {
    const char *name;
    int idx;
} name_idx;

static int cmp_name_idx(const void *a, const void *b) { return strcmp(((const name_idx *)a)->name, ((const name_idx *)b)->name); }

typedef struct span {
    uint64_t begin, end;
    int idx;
} span;

static int cmp_span(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->idx - y->idx;
}

/* Offsets aligned and inside the file, no overlap, unique names. */
static cdf_status check_tensors(cdf_gguf_file *f) {
    uint64_t data_size = f->size > f->data_start ? f->size - f->data_start : 0;
    span *sp = calloc((size_t)f->n + 1, sizeof *sp);
    name_idx *order = calloc((size_t)f->n + 1, sizeof *order);
    cdf_status s = CDF_OK;
    if (!sp || !order) {
        s = gguf_error(f, CDF_ERR_OUT_OF_MEMORY, "out of memory for %d tensors", f->n);
        goto done;
    }
    int ns = 0;
    for (int i = 0; i < f->n && s == CDF_OK; i++) {
        const cdf_gguf_tensor *t = &f->tensors[i];
        if (t->offset % f->alignment != 0)
            s = gguf_error(f, CDF_ERR_FORMAT, "tensor '%s': data offset %llu is not a multiple of the alignment %llu",
                           t->name, (unsigned long long)t->offset, (unsigned long long)f->alignment);
        else if (t->offset > data_size || t->nbytes > data_size - t->offset)
            s = gguf_error(f, CDF_ERR_FORMAT,
                           "tensor '%s': data [%llu, +%llu) extends beyond the data section of %llu bytes (truncated?)",
                           t->name, (unsigned long long)t->offset, (unsigned long long)t->nbytes,
                           (unsigned long long)data_size);
        else if (t->nbytes)
            sp[ns++] = (span){t->offset, t->offset + t->nbytes, i};
        order[i] = (name_idx){t->name, i};
    }
    if (s != CDF_OK) goto done;
    qsort(sp, (size_t)ns, sizeof *sp, cmp_span);
    for (int i = 1; i < ns; i++) {
        if (sp[i].begin < sp[i - 1].end) {
            s = gguf_error(f, CDF_ERR_FORMAT, "tensors '%s' and '%s' overlap", f->tensors[sp[i - 1].idx].name,
                           f->tensors[sp[i].idx].name);
            goto done;
        }
    }
    qsort(order, (size_t)f->n, sizeof *order, cmp_name_idx);
    for (int i = 0; i < f->n; i++) {
        if (i > 0 && strcmp(order[i - 1].name, order[i].name) == 0) {
            s = gguf_error(f, CDF_ERR_FORMAT, "tensor name '%s' appears more than once", order[i].name);
            goto done;
        }
        f->by_name[i] = order[i].idx;
    }
done:
    free(sp);
    free(order);
    return s;
}

static cdf_status parse(cdf_gguf_file *f) {
    cursor c = {f, 0};
    uint64_t magic;
    CDF_TRY(rd(&c, 4, "magic", &magic));
    if (memcmp(f->map, "GGUF", 4) != 0)
        return gguf_error(f, CDF_ERR_FORMAT, "not a GGUF file (the first 4 bytes are not \"GGUF\")");
    uint32_t v;
    CDF_TRY(rd32(&c, "version", &v));
    if (v == 0x02000000u || v == 0x03000000u)
        return gguf_error(f, CDF_ERR_UNSUPPORTED, "big-endian GGUF files are not supported");
    if (v == 1) return gguf_error(f, CDF_ERR_UNSUPPORTED, "GGUF version 1 is not supported (only 2 and 3)");
    if (v != 2 && v != 3) return gguf_error(f, CDF_ERR_FORMAT, "unknown GGUF version %u (2 and 3 are supported)", v);
    f->version = v;
    uint64_t nt, nkv;
    CDF_TRY(rd(&c, 8, "tensor count", &nt));
    CDF_TRY(rd(&c, 8, "key/value count", &nkv));
    /* a key/value pair takes at least 13 bytes (length, type, a 1-byte value) and a tensor info
     * at least 32 (name length + 1 byte, dim count, one dim, type, offset) */
    uint64_t left = f->size - c.at;
    if (nkv > left / 13 || nt > left / 32 || nkv * 13 + nt * 32 > left)
        return gguf_error(f, CDF_ERR_FORMAT, "%llu tensors and %llu keys cannot fit in the %llu bytes that follow (truncated or corrupt counts)",
                          (unsigned long long)nt, (unsigned long long)nkv, (unsigned long long)left);
    f->kv = calloc((size_t)nkv + 1, sizeof *f->kv);
    f->tensors = calloc((size_t)nt + 1, sizeof *f->tensors);
    f->by_name = calloc((size_t)nt + 1, sizeof *f->by_name);
    if (!f->kv || !f->tensors || !f->by_name) return gguf_error(f, CDF_ERR_OUT_OF_MEMORY, "out of memory for the header");
    for (uint64_t i = 0; i < nkv; i++) {
        cdf_status s = parse_kv(&c, &f->kv[f->n_kv]);
        f->n_kv++; /* counted even on failure so that close frees it */
        if (s != CDF_OK) return s;
        for (int j = 0; j < f->n_kv - 1; j++)
            if (strcmp(f->kv[j].key, f->kv[f->n_kv - 1].key) == 0)
                return gguf_error(f, CDF_ERR_FORMAT, "key '%s' appears more than once", f->kv[j].key);
    }
    f->alignment = 32;
    const gguf_kv *al = find_kv(f, "general.alignment");
    if (al) {
        if (al->type != GGUF_U32)
            return gguf_error(f, CDF_ERR_FORMAT, "general.alignment is %s, expected u32", k_value_type_names[al->type]);
        uint64_t a = le(f->map + al->at, 4);
        if (a == 0 || (a & (a - 1)) != 0)
            return gguf_error(f, CDF_ERR_FORMAT, "general.alignment %llu is not a power of two", (unsigned long long)a);
        f->alignment = a;
    }
    for (uint64_t i = 0; i < nt; i++) {
        cdf_status s = parse_tensor_info(&c, &f->tensors[f->n]);
        f->n++;
        if (s != CDF_OK) return s;
    }
    /* the data section starts at the next multiple of the alignment (the padding may be absent
     * when there is no data) */
    uint64_t pad = (f->alignment - c.at % f->alignment) % f->alignment;
    f->data_start = c.at + pad;
    return check_tensors(f);
}

cdf_status cdf_gguf_open(const char *path, cdf_gguf_file **out) {
    if (!out) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_gguf_open: out is NULL");
    *out = NULL;
    if (!path || !path[0]) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_gguf_open: empty path");
    cdf_gguf_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "cdf_gguf_open: out of memory");
    }
    f->fd = -1;
    size_t size = 0;
    cdf_status s = cdf_io_map_file(path, "GGUF", 24, "the 24-byte GGUF header", &f->fd, &f->map, &size);
    f->size = size;
    if (s != CDF_OK) goto fail;
    s = parse(f);
    if (s != CDF_OK) goto fail;
    *out = f;
    return CDF_OK;
fail:
    cdf_gguf_close(f);
    return s;
}

void cdf_gguf_close(cdf_gguf_file *f) {
    if (!f) return;
    if (f->map) munmap((void *)f->map, (size_t)f->size);
    if (f->fd >= 0) close(f->fd);
    for (int i = 0; i < f->n; i++) free((char *)f->tensors[i].name);
    for (int i = 0; i < f->n_kv; i++) {
        free(f->kv[i].key);
        free(f->kv[i].string);
    }
    free(f->tensors);
    free(f->by_name);
    free(f->kv);
    free(f->path);
    free(f);
}

/* ---- queries ---- */

const char *cdf_gguf_path(const cdf_gguf_file *f) { return f ? f->path : NULL; }
uint32_t cdf_gguf_version(const cdf_gguf_file *f) { return f ? f->version : 0; }
uint64_t cdf_gguf_alignment(const cdf_gguf_file *f) { return f ? f->alignment : 0; }
int cdf_gguf_count(const cdf_gguf_file *f) { return f ? f->n : 0; }

const cdf_gguf_tensor *cdf_gguf_tensor_at(const cdf_gguf_file *f, int i) {
    return f && i >= 0 && i < f->n ? &f->tensors[i] : NULL;
}

const cdf_gguf_tensor *cdf_gguf_find(const cdf_gguf_file *f, const char *name) {
    if (!f || !name) return NULL;
    int lo = 0, hi = f->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        const cdf_gguf_tensor *t = &f->tensors[f->by_name[mid]];
        int c = strcmp(name, t->name);
        if (c == 0) return t;
        if (c < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return NULL;
}

int64_t cdf_gguf_numel(const cdf_gguf_tensor *t) {
    if (!t) return 0;
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

const void *cdf_gguf_data(const cdf_gguf_file *f, const cdf_gguf_tensor *t) {
    if (!f || !t || t < f->tensors || t >= f->tensors + f->n) return NULL;
    return f->map + f->data_start + t->offset;
}

const void *cdf_gguf_touch(const cdf_gguf_file *f, const cdf_gguf_tensor *t) {
    const void *p = cdf_gguf_data(f, t);
    if (p) cdf_io_count_bytes(t->nbytes);
    return p;
}

int cdf_gguf_kv_count(const cdf_gguf_file *f) { return f ? f->n_kv : 0; }
const char *cdf_gguf_kv_key_at(const cdf_gguf_file *f, int i) { return f && i >= 0 && i < f->n_kv ? f->kv[i].key : NULL; }

int cdf_gguf_kv_type(const cdf_gguf_file *f, const char *key) {
    const gguf_kv *kv = find_kv(f, key);
    return kv ? kv->type : -1;
}

const char *cdf_gguf_get_string(const cdf_gguf_file *f, const char *key) {
    const gguf_kv *kv = find_kv(f, key);
    return kv ? kv->string : NULL;
}

bool cdf_gguf_get_int(const cdf_gguf_file *f, const char *key, int64_t *out) {
    const gguf_kv *kv = find_kv(f, key);
    if (!kv) return false;
    const uint8_t *p = f->map + kv->at;
    int64_t v;
    switch (kv->type) {
    case GGUF_U8: case GGUF_BOOL: v = p[0]; break;
    case GGUF_I8: v = (int8_t)p[0]; break;
    case GGUF_U16: v = (int64_t)le(p, 2); break;
    case GGUF_I16: v = (int16_t)le(p, 2); break;
    case GGUF_U32: v = (int64_t)le(p, 4); break;
    case GGUF_I32: v = (int32_t)le(p, 4); break;
    case GGUF_I64: v = (int64_t)le(p, 8); break;
    case GGUF_U64:
        if (le(p, 8) > (uint64_t)INT64_MAX) return false;
        v = (int64_t)le(p, 8);
        break;
    default: return false;
    }
    if (out) *out = v;
    return true;
}

bool cdf_gguf_get_array_info(const cdf_gguf_file *f, const char *key, int *elem_type, uint64_t *count) {
    const gguf_kv *kv = find_kv(f, key);
    if (!kv || kv->type != GGUF_ARRAY) return false;
    if (elem_type) *elem_type = kv->elem_type;
    if (count) *count = kv->count;
    return true;
}
