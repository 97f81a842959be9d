/* Named weights from a checkpoint folder, materialised on a device with shape checks. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "nn/nn.h"
#include "nn/weights_source.h"
#include "tensor/tensor_impl.h"
#include "io/json.h"

/* The open checkpoint, shared by the loader and by every host-side weight (sequential offload)
 * whose bytes are its mapping: closed when the last of them is released. */
typedef struct shared_checkpoint {
    atomic_long refs;
    cdf_wsrc *src;
} shared_checkpoint;

static void shared_checkpoint_release(void *p) {
    shared_checkpoint *h = p;
    if (!h || atomic_fetch_sub(&h->refs, 1) != 1) return;
    cdf_wsrc_close(h->src);
    free(h);
}

struct cdf_weights {
    cdf_wsrc *src; /* a folder, or opt.weights_file (weights_source.c) */
    cdf_checkpoint *ck; /* the folder's checkpoint; NULL for a converted single file or GGUF */
    shared_checkpoint *shared;
    cdf_load_options opt;
    char *path;
    uint64_t loaded_bytes;
};

cdf_load_options cdf_load_options_default(void) {
    return (cdf_load_options){.device = NULL, .weight_dtype = CDF_F32, .compute_dtype = CDF_F32};
}

cdf_status cdf_weights_open(const char *dir, const cdf_load_options *opt, cdf_weights **out) {
    *out = NULL;
    cdf_weights *w = calloc(1, sizeof *w);
    if (!w) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    w->opt = opt ? *opt : cdf_load_options_default();
    if (!w->opt.device) w->opt.device = cdf_device_default();
    if (!w->opt.device) {
        free(w);
        return cdf_last_status();
    }
    w->path = strdup(dir);
    w->shared = calloc(1, sizeof *w->shared);
    cdf_status s = !w->path || !w->shared ? cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory")
                                          : cdf_wsrc_open(w->opt.weights_file ? w->opt.weights_file : dir, w->opt.weights_file != NULL,
                                                         w->opt.weights_part, &w->src);
    if (s != CDF_OK) {
        free(w->shared);
        free(w->path);
        free(w);
        return s;
    }
    atomic_init(&w->shared->refs, 1);
    w->shared->src = w->src;
    w->ck = cdf_wsrc_checkpoint(w->src);
    *out = w;
    return CDF_OK;
}

void cdf_weights_free(cdf_weights *w) {
    if (!w) return;
    if (w->opt.report && w->opt.weights_file) {
        free(w->opt.report->unused);
        w->opt.report->unused = cdf_wsrc_unused(w->src, &w->opt.report->n_unused);
        snprintf(w->opt.report->format, sizeof w->opt.report->format, "%s", cdf_wsrc_format(w->src));
    }
    shared_checkpoint_release(w->shared); /* closes it unless host-side weights still map it */
    free(w->path);
    free(w);
}

const char *cdf_weights_path(const cdf_weights *w) { return w->opt.weights_file ? w->opt.weights_file : w->path; }
const cdf_load_options *cdf_weights_options(const cdf_weights *w) { return &w->opt; }
cdf_checkpoint *cdf_weights_checkpoint(cdf_weights *w) { return w->ck; }
cdf_wsrc *cdf_weights_source(cdf_weights *w) { return w->src; }
uint64_t cdf_weights_loaded_bytes(const cdf_weights *w) { return w->loaded_bytes; }

static void fmt_shape(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t o = snprintf(buf, n, "[");
    for (int i = 0; i < ndim && o < n; i++) o += snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

size_t cdf_weights_block_prefix(const char *name) {
    for (const char *p = strstr(name, "blocks."); p; p = strstr(p + 1, "blocks.")) {
        const char *d = p + 7;
        if (*d < '0' || *d > '9') continue;
        while (*d >= '0' && *d <= '9') d++;
        if (*d == '.') return (size_t)(d - name);
    }
    return 0;
}

static bool is_block_weight(const char *name) { return cdf_weights_block_prefix(name) > 0; }

/* Sequential offload: the weight as a host-side tensor — shape and dtype as if loaded, no device
 * memory; its storage points at the checkpoint mapping and keeps the checkpoint open, or owns
 * the host buffer the source made (dequantized, scaled or reordered values). */
static cdf_tensor *host_side_weight(cdf_weights *w, const char *name, cdf_wsrc_tensor *t, const void *src, cdf_dtype dt);

/* A host-side block weight (sequential offload) for a device without a quantized matmul: the
 * blocks decoded now into host values of the layer's weight dtype, which the block's upload then
 * moves like any value weight (the blocks themselves are dropped). */
static bool host_side_decoded(cdf_weights *w, cdf_linear_layer *l, const char *name, cdf_wsrc_tensor *t, const void *blocks,
                              uint32_t qt, cdf_tensor **wt) {
    const int64_t rows = l->out, n = l->out * l->in;
    const cdf_dtype wdt = w->opt.weight_dtype;
    float *vals = malloc(sizeof(float) * (size_t)n + 1);
    void *out = vals && wdt != CDF_F32 ? malloc(cdf_dtype_size(wdt) * (size_t)n + 1) : vals;
    cdf_status s = !vals || !out ? cdf_error(CDF_ERR_OUT_OF_MEMORY, "decoding weight '%s': out of host memory", name)
                                 : cdf_ggml_dequantize(qt, blocks, n, vals);
    if (s == CDF_OK && out != vals) cdf_convert(out, wdt, vals, CDF_F32, (size_t)n);
    if (out != vals) free(vals);
    cdf_wsrc_tensor_release(t); /* the blocks */
    if (s != CDF_OK) {
        free(out);
        *wt = NULL;
        return false;
    }
    t->owned = out; /* the storage takes the values over */
    t->ndim = 2;
    t->shape[0] = rows;
    t->shape[1] = l->in;
    t->dtype = wdt;
    *wt = host_side_weight(w, name, t, out, wdt);
    return *wt != NULL; /* l->qtype stays 0: a value weight */
}

static cdf_tensor *host_side_weight(cdf_weights *w, const char *name, cdf_wsrc_tensor *t, const void *src, cdf_dtype dt) {
    if (!src) { /* the source said why */
        cdf_wsrc_tensor_release(t);
        return NULL;
    }
    int64_t numel = 1;
    for (int i = 0; i < t->ndim; i++) numel *= t->shape[i];
    cdf_storage *st = cdf_storage_create(w->opt.device, (size_t)numel * cdf_dtype_size(dt));
    if (!st) {
        cdf_wsrc_tensor_release(t);
        cdf_error_prefix("weight '%s' in %s: ", name, cdf_weights_path(w));
        return NULL;
    }
    st->host_src = src;
    st->host_dtype = t->dtype;
    if (t->owned) { /* the storage takes the buffer over */
        st->owner = t->owned;
        st->owner_release = free;
        t->owned = NULL;
    } else {
        atomic_fetch_add(&w->shared->refs, 1);
        st->owner = w->shared;
        st->owner_release = shared_checkpoint_release;
    }
    int64_t strides[CDF_MAX_DIMS];
    cdf_contiguous_strides(t->ndim, t->shape, strides);
    cdf_tensor *r = cdf_tensor_view_of(st, 0, dt, t->ndim, t->shape, strides);
    cdf_storage_release(st);
    return r;
}

/* opt.shapes_only: the weight as a buffer without memory (the planner's measured forwards never
 * run a kernel on it); nothing is read from the checkpoint but its header. */
static cdf_tensor *shapes_only_weight(cdf_weights *w, cdf_wsrc_tensor *t, cdf_dtype dt) {
    int64_t shape[CDF_ST_MAX_DIMS], strides[CDF_ST_MAX_DIMS];
    const int ndim = t->ndim;
    memcpy(shape, t->shape, sizeof(int64_t) * (size_t)ndim);
    cdf_wsrc_tensor_release(t);
    cdf_storage *st = cdf_storage_create(w->opt.device, (size_t)cdf_shape_numel(ndim, shape) * cdf_dtype_size(dt));
    if (!st) return NULL;
    st->is_virtual = true;
    cdf_contiguous_strides(ndim, shape, strides);
    cdf_tensor *r = cdf_tensor_view_of(st, 0, dt, ndim, shape, strides);
    cdf_storage_release(st);
    if (r) w->loaded_bytes += (uint64_t)cdf_tensor_numel(r) * cdf_dtype_size(dt);
    return r;
}

/* Whether the shapes are equal once leading unit dims are dropped from both (no -1 in want). */
static bool leading_ones_only(int nwant, const int64_t *want, int nhave, const int64_t *have) {
    int a = 0, b = 0;
    for (int i = 0; i < nwant; i++)
        if (want[i] < 0) return false;
    while (a < nwant && want[a] == 1) a++;
    while (b < nhave && have[b] == 1) b++;
    if (nwant - a != nhave - b || nwant > CDF_ST_MAX_DIMS) return false;
    for (int i = 0; a + i < nwant; i++)
        if (want[a + i] != have[b + i]) return false;
    return true;
}

static cdf_tensor *get_v(cdf_weights *w, bool optional, int force_dt, int ndim, const int64_t *shape, const char *fmt,
                         va_list ap) {
    char name[512];
    vsnprintf(name, sizeof name, fmt, ap);
    cdf_wsrc_tensor ts, *t = &ts;
    if (!cdf_wsrc_find(w->src, name, t)) {
        if (optional) return NULL;
        cdf_error(CDF_ERR_NOT_FOUND, "weight '%s' is missing from %s (the config requires it)%s", name, cdf_weights_path(w),
                  cdf_wsrc_missing_hint(w->src));
        return NULL;
    }
    bool ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = shape[i] < 0 || shape[i] == t->shape[i];
    if (!ok && leading_ones_only(ndim, shape, t->ndim, t->shape)) {
        /* e.g. SD3's pos_embed [1, 147456, 1536] stored as [147456, 1536]: ggml counts a tensor's
         * dims up to its last non-unit one, so GGUF writers (stable-diffusion.cpp's convert) drop
         * leading unit dims; the values are laid out the same */
        t->ndim = ndim;
        memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
        ok = true;
    }
    if (!ok) {
        char want[160], have[160];
        fmt_shape(want, sizeof want, ndim, shape);
        fmt_shape(have, sizeof have, t->ndim, t->shape);
        cdf_error(CDF_ERR_SHAPE, "weight '%s' in %s has shape %s but the config implies %s", name, cdf_weights_path(w),
                  have, want);
        return NULL;
    }
    if (w->opt.on_read) w->opt.on_read(w->opt.on_read_ctx, name, false);
    cdf_dtype dt = t->dtype;
    if (cdf_dtype_is_float(dt)) {
        if (force_dt >= 0) dt = (cdf_dtype)force_dt;
        else dt = (t->ndim >= 2) ? w->opt.weight_dtype : CDF_F32;
    }
    if (w->opt.shapes_only) return shapes_only_weight(w, t, dt);
    if (w->opt.blocks_on_host && is_block_weight(name))
        return host_side_weight(w, name, t, cdf_wsrc_load(w->src, t, name), dt);
    const void *src = cdf_wsrc_load(w->src, t, name);
    cdf_tensor *r = src ? cdf_tensor_from_host(w->opt.device, dt, t->ndim, t->shape, src, t->dtype) : NULL;
    cdf_wsrc_tensor_release(t);
    if (!r) {
        if (src) cdf_error_prefix("loading weight '%s' from %s: ", name, cdf_weights_path(w));
        return NULL;
    }
    w->loaded_bytes += (uint64_t)cdf_tensor_numel(r) * cdf_dtype_size(dt);
    return r;
}

/* Loaded weights belong to the model, not to whatever scope the loader runs in. */
#define GET_BODY(optional, force)                                                                                  \
    cdf_scope_suppress(1);                                                                                         \
    va_list ap;                                                                                                    \
    va_start(ap, fmt);                                                                                             \
    cdf_tensor *r = get_v(w, optional, force, ndim, shape, fmt, ap);                                               \
    va_end(ap);                                                                                                    \
    cdf_scope_suppress(-1);                                                                                        \
    return r;

cdf_tensor *cdf_weights_get(cdf_weights *w, int ndim, const int64_t *shape, const char *fmt, ...) { GET_BODY(false, -1) }
cdf_tensor *cdf_weights_get_opt(cdf_weights *w, int ndim, const int64_t *shape, const char *fmt, ...) { GET_BODY(true, -1) }
cdf_tensor *cdf_weights_get_f32(cdf_weights *w, int ndim, const int64_t *shape, const char *fmt, ...) { GET_BODY(false, CDF_F32) }

bool cdf_weights_has(cdf_weights *w, const char *fmt, ...) {
    char name[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    cdf_wsrc_tensor t;
    return cdf_wsrc_find(w->src, name, &t);
}

/* ---- config ------------------------------------------------------------------------------ */
cdf_status cdf_config_load(const char *dir, cJSON **out) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    return cdf_json_load_file(path, out);
}

const char *cdf_config_class_name(const cJSON *cfg) {
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(cfg, "_class_name");
    if (cJSON_IsString(c)) return c->valuestring;
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(cfg, "architectures");
    if (cJSON_IsArray(a) && cJSON_IsString(cJSON_GetArrayItem(a, 0))) return cJSON_GetArrayItem(a, 0)->valuestring;
    return NULL;
}

cdf_status cdf_config_get_dim(const cJSON *cfg, const char *key, int64_t def, int64_t max, int64_t *out) {
    CDF_TRY(cdf_json_get_int(cfg, key, def, out));
    if (*out < 1 || *out > max)
        return cdf_error(CDF_ERR_FORMAT, "config.json: %s = %lld is outside 1..%lld", key, (long long)*out, (long long)max);
    return CDF_OK;
}

/* ---- building blocks ------------------------------------------------------------------------ */

/* --weight-type q8_0: the float weight t read as f32 and encoded as blocks of qt (as gguf-py's
 * quantize), in a buffer t then owns. */
static const void *quantize_rows(cdf_weights *w, cdf_wsrc_tensor *t, const char *name, uint32_t qt, int64_t *row_bytes) {
    int64_t be = 0, bb = 0;
    cdf_ggml_type_block(qt, &be, &bb);
    const int64_t n = t->shape[0] * t->shape[1];
    *row_bytes = t->shape[1] / be * bb;
    const void *vals = cdf_wsrc_load(w->src, t, name);
    if (!vals) return NULL;
    float *f32 = t->dtype == CDF_F32 ? NULL : malloc(sizeof(float) * (size_t)n + 1);
    uint8_t *blocks = malloc((size_t)(t->shape[0] * *row_bytes) + 1);
    cdf_status s = (!f32 && t->dtype != CDF_F32) || !blocks
                       ? cdf_error(CDF_ERR_OUT_OF_MEMORY, "weight '%s': out of host memory to quantize it", name)
                       : CDF_OK;
    if (s == CDF_OK && f32) cdf_convert(f32, CDF_F32, vals, t->dtype, (size_t)n);
    if (s == CDF_OK) s = cdf_ggml_quantize(qt, f32 ? f32 : vals, n, blocks);
    free(f32);
    cdf_wsrc_tensor_release(t); /* the values, if the source made them */
    if (s != CDF_OK) {
        free(blocks);
        cdf_error_prefix("weight '%s' in %s: ", name, cdf_weights_path(w));
        return NULL;
    }
    t->owned = blocks;
    return blocks;
}

/* A linear layer's weight kept as its GGUF blocks (U8 [out, row bytes]; l->qtype set), when the
 * source stores it in a block type the matmul can decode and the options allow it. Returns true
 * with *wt NULL when the weight is not such a tensor (the caller loads it as values). */
static bool get_blocks(cdf_weights *w, cdf_linear_layer *l, const char *prefix, cdf_tensor **wt) {
    *wt = NULL;
    char name[512];
    snprintf(name, sizeof name, "%s.weight", prefix);
    const cdf_dtype wdt = w->opt.weight_dtype;
    cdf_wsrc_tensor t;
    if ((wdt != CDF_F32 && wdt != CDF_BF16) || !cdf_wsrc_find(w->src, name, &t) || t.ndim != 2 || t.shape[0] != l->out ||
        t.shape[1] != l->in)
        return true; /* the value path loads (and checks) it */
    if (w->opt.on_read) w->opt.on_read(w->opt.on_read_ctx, name, true);
    /* stored blocks are kept unless decoding was asked for; float values are quantized if asked */
    const bool keep = t.qtype >= 0 && !w->opt.decode_quantized;
    const bool quantize = t.qtype < 0 && w->opt.quantize_to && cdf_dtype_is_float(t.dtype);
    const uint32_t qt = keep ? (uint32_t)t.qtype : w->opt.quantize_to;
    int64_t be = 0, bb = 0;
    if ((!keep && !quantize) || !cdf_ggml_type_block(qt, &be, &bb) || be < 2 || !cdf_ggml_can_dequantize(qt) || l->in % be)
        return true;
    int64_t row_bytes = 0;
    const void *src = keep ? cdf_wsrc_load_blocks(w->src, &t, name, &row_bytes) : quantize_rows(w, &t, name, qt, &row_bytes);
    if (src && row_bytes != l->in / be * bb) {
        cdf_wsrc_tensor_release(&t);
        cdf_error(CDF_ERR_FORMAT, "weight '%s' in %s: %lld bytes per row, but %lld %s values take %lld", name,
                  cdf_weights_path(w), (long long)row_bytes, (long long)l->in, cdf_ggml_type_name(qt),
                  (long long)(l->in / be * bb));
        return false;
    }
    if (src && w->opt.blocks_on_host && is_block_weight(name) && !cdf_device_runs_quantized(w->opt.device))
        return host_side_decoded(w, l, name, &t, src, qt, wt);
    t.ndim = 2;
    t.shape[1] = row_bytes;
    t.dtype = CDF_U8;
    if (w->opt.blocks_on_host && is_block_weight(name)) {
        *wt = host_side_weight(w, name, &t, src, CDF_U8);
    } else {
        *wt = src ? cdf_tensor_from_host(w->opt.device, CDF_U8, 2, t.shape, src, CDF_U8) : NULL;
        cdf_wsrc_tensor_release(&t);
        if (*wt) w->loaded_bytes += (uint64_t)(t.shape[0] * row_bytes);
        else if (src) cdf_error_prefix("loading weight '%s' from %s: ", name, cdf_weights_path(w));
    }
    if (!*wt) return false;
    l->qtype = qt;
    l->qwdt = wdt;
    /* a device without a quantized matmul (the values kind) gets the blocks' decoded values: the
     * numbers the cpu backend's quantized matmul multiplies by */
    if (!(w->opt.blocks_on_host && is_block_weight(name)) && !cdf_device_runs_quantized(w->opt.device) &&
        cdf_linear_decode(l) != CDF_OK) {
        cdf_error_prefix("decoding weight '%s' for %s: ", name, cdf_device_name(w->opt.device));
        return false;
    }
    return true;
}

cdf_status cdf_linear_decode(cdf_linear_layer *l) {
    if (!l->qtype) return CDF_OK;
    const int64_t rows = l->w->shape[0], row_bytes = l->w->shape[1];
    uint8_t *blocks = malloc((size_t)(rows * row_bytes) + 1);
    float *vals = malloc(sizeof(float) * (size_t)(rows * l->in) + 1);
    cdf_status s = !blocks || !vals ? cdf_error(CDF_ERR_OUT_OF_MEMORY, "decoding a %lld x %lld quantized weight: out of host memory",
                                                (long long)rows, (long long)l->in)
                                    : cdf_tensor_read(l->w, CDF_U8, blocks, (size_t)(rows * row_bytes));
    if (s == CDF_OK) s = cdf_ggml_dequantize(l->qtype, blocks, rows * l->in, vals);
    cdf_tensor *nw = NULL;
    if (s == CDF_OK) {
        cdf_scope_suppress(1);
        nw = cdf_tensor_from_host(cdf_tensor_device(l->w), l->qwdt, 2, (int64_t[]){rows, l->in}, vals, CDF_F32);
        cdf_scope_suppress(-1);
        if (!nw) s = cdf_last_status();
    }
    free(blocks);
    free(vals);
    if (s != CDF_OK) return s;
    cdf_tensor_release(l->w);
    l->w = nw;
    l->qtype = 0;
    return CDF_OK;
}

cdf_status cdf_linear_load(cdf_weights *w, cdf_linear_layer *l, int64_t in, int64_t out, int bias, const char *fmt, ...) {
    char prefix[480];
    CDF_NN_FORMAT_NAME(prefix, fmt);
    memset(l, 0, sizeof *l);
    l->in = in;
    l->out = out;
    int64_t ws[2] = {out, in}, bs[1] = {out};
    cdf_scope_suppress(1); /* a loaded weight belongs to the model (as in cdf_weights_get) */
    bool ok = get_blocks(w, l, prefix, &l->w);
    cdf_scope_suppress(-1);
    if (!ok) return cdf_last_status();
    if (!l->w) l->w = cdf_weights_get(w, 2, ws, "%s.weight", prefix);
    if (!l->w) return cdf_last_status();
    if (bias == 1) l->b = cdf_weights_get(w, 1, bs, "%s.bias", prefix);
    else if (bias == -1) l->b = cdf_weights_get_opt(w, 1, bs, "%s.bias", prefix);
    if (bias == 1 && !l->b) {
        cdf_linear_free(l);
        return cdf_last_status();
    }
    if (bias == -1 && !l->b && cdf_last_status() != CDF_OK && cdf_weights_has(w, "%s.bias", prefix)) {
        cdf_linear_free(l);
        return cdf_last_status();
    }
    cdf_layer_index_add(w->opt.layers, prefix, l, false);
    return CDF_OK;
}

void cdf_linear_free(cdf_linear_layer *l) {
    if (l->lora) l->lora->free(l->lora);
    l->lora = NULL;
    cdf_tensor_release(l->w);
    cdf_tensor_release(l->b);
    l->w = l->b = NULL;
}

cdf_tensor *cdf_linear_hooked_fwd(const cdf_linear_layer *l, cdf_tensor *x) {
    if (!x) return NULL;
    cdf_scope_push();
    cdf_tensor *y = cdf_linear_base_fwd(l, x);
    cdf_tensor *d = l->lora->delta(l->lora, x);
    cdf_tensor *r = y && d ? cdf_add(y, d) : NULL;
    cdf_scope_pop(r ? &r : NULL, r ? 1 : 0);
    return r;
}

cdf_status cdf_norm_load(cdf_weights *w, cdf_norm_layer *n, int64_t dim, int weight, int bias, float eps, const char *fmt, ...) {
    char prefix[480];
    CDF_NN_FORMAT_NAME(prefix, fmt);
    memset(n, 0, sizeof *n);
    n->eps = eps;
    int64_t s[1] = {dim};
    cdf_clear_error();
    if (weight == 1) n->w = cdf_weights_get(w, 1, s, "%s.weight", prefix);
    else if (weight == -1) n->w = cdf_weights_get_opt(w, 1, s, "%s.weight", prefix);
    if (bias == 1) n->b = cdf_weights_get(w, 1, s, "%s.bias", prefix);
    else if (bias == -1) n->b = cdf_weights_get_opt(w, 1, s, "%s.bias", prefix);
    if ((weight == 1 && !n->w) || (bias == 1 && !n->b) || cdf_last_status() != CDF_OK) {
        cdf_status st = cdf_last_status() ? cdf_last_status() : CDF_ERR_INTERNAL;
        cdf_norm_free(n);
        return st;
    }
    return CDF_OK;
}

void cdf_norm_free(cdf_norm_layer *n) {
    cdf_tensor_release(n->w);
    cdf_tensor_release(n->b);
    n->w = n->b = NULL;
}

cdf_status cdf_conv_load(cdf_weights *w, cdf_conv_layer *c, int64_t cin, int64_t cout, int k, int stride, int pad, int bias,
                         const char *fmt, ...) {
    char prefix[480];
    CDF_NN_FORMAT_NAME(prefix, fmt);
    memset(c, 0, sizeof *c);
    c->p = cdf_conv2d_params_default();
    c->p.stride_h = c->p.stride_w = stride;
    c->p.pad_h = c->p.pad_w = pad;
    int64_t ws[4] = {cout, cin, k, k}, bs[1] = {cout};
    c->w = cdf_weights_get(w, 4, ws, "%s.weight", prefix);
    if (!c->w) return cdf_last_status();
    if (bias) {
        c->b = cdf_weights_get(w, 1, bs, "%s.bias", prefix);
        if (!c->b) {
            cdf_conv_free(c);
            return cdf_last_status();
        }
    }
    return CDF_OK;
}

void cdf_conv_free(cdf_conv_layer *c) {
    cdf_tensor_release(c->w);
    cdf_tensor_release(c->b);
    c->w = c->b = NULL;
}
