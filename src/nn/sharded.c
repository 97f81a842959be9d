/* Tensor-parallel plans and sharded weight loading (declared in nn/nn.h), and the process-wide
 * switch cdf_tp_enable (cdiffusers/dist.h).
 *
 * Megatron-style sharding over a 1-D mesh of N ranks, rank r:
 *   colwise  w [out, in] -> rows [r*out/N, (r+1)*out/N), bias likewise: the layer computes this
 *            rank's slice of the output features (its attention heads, its MLP channels).
 *   rowwise  w -> columns [r*in/N, (r+1)*in/N): the layer consumes the slice a colwise layer
 *            produced and yields a partial sum; one all-reduce completes it. The bias is
 *            replicated and added by rank 0 only, so the sum holds it once.
 *   packed   rowwise where the input is cat(part_0, part_1, ...): columns r*p_i/N.. of every
 *            part, concatenated in part order — what each rank's cat(local parts) lines up with.
 * Only the bytes of the slice are read from a folder's files; a single file or GGUF in place of the
 * folder is read through its converted view (see "where a shard's bytes come from" below). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdiffusers/dist.h"
#include "core/error_internal.h"
#include "nn/nn.h"
#include "nn/weights_source.h"
#include "tensor/tensor_impl.h"

#define MAX_RULES 64
#define MAX_PARTS CDF_LINEAR_MAX_PARTS

struct cdf_tp {
    cdf_process_group *pg;
    int rank, size;
    int replicas; /* > 1: one process over `size` devices (cdf_dist_init_devices): rank is 0 and
                   * every sharded weight holds each rank's slice on that rank's replica */
    char component[128];
    char model[96];
    const cdf_tp_rule *plan;
    int n_rules;
    int hits[MAX_RULES]; /* layers each rule matched (cdf_tp_check_plan_used) */
};

/* ---- process-wide switch --------------------------------------------------------------------- */
static cdf_device_mesh *g_mesh;
static char g_replicate[1024];

cdf_status cdf_tp_enable(cdf_device_mesh *mesh, const char *replicate) {
    if (!mesh) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_tp_enable: mesh is NULL");
    if (replicate && strlen(replicate) >= sizeof g_replicate)
        return cdf_error(CDF_ERR_INVALID_ARG, "cdf_tp_enable: the replicate list is longer than %zu characters",
                         sizeof g_replicate - 1);
    snprintf(g_replicate, sizeof g_replicate, "%s", replicate ? replicate : "");
    g_mesh = mesh;
    return CDF_OK;
}

void cdf_tp_disable(void) {
    g_mesh = NULL;
    g_replicate[0] = '\0';
}

cdf_device_mesh *cdf_tp_mesh(void) { return g_mesh; }

/* Whether `name` is one of the comma-separated entries of list. */
static bool in_list(const char *list, const char *name) {
    const size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0) return true;
        if (!e) break;
        p = e + 1;
    }
    return false;
}

/* The last path component of dir ("pipe/text_encoder_2/" -> "text_encoder_2"). */
static void folder_name(const char *dir, char *out, size_t n) {
    size_t len = strlen(dir);
    while (len > 1 && dir[len - 1] == '/') len--;
    size_t start = len;
    while (start > 0 && dir[start - 1] != '/') start--;
    size_t k = len - start < n - 1 ? len - start : n - 1;
    memcpy(out, dir + start, k);
    out[k] = '\0';
}

cdf_status cdf_tp_new(cdf_process_group *pg, const char *component, const char *model, const cdf_tp_rule *plan,
                      cdf_tp **out) {
    if (!out) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_tp_new: out is NULL");
    *out = NULL;
    if (!pg || !plan) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_tp_new: process group and plan are required");
    cdf_tp *tp = calloc(1, sizeof *tp);
    if (!tp) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (tensor-parallel plan)");
    tp->pg = pg;
    tp->rank = cdf_dist_rank(pg);
    tp->size = cdf_dist_world_size(pg);
    tp->replicas = cdf_dist_replicas(pg);
    snprintf(tp->component, sizeof tp->component, "%s", component ? component : "?");
    snprintf(tp->model, sizeof tp->model, "%s", model ? model : "?");
    tp->plan = plan;
    while (plan[tp->n_rules].pattern) {
        if (++tp->n_rules > MAX_RULES) {
            free(tp);
            return cdf_error(CDF_ERR_INTERNAL, "tensor-parallel plan of %s has more than %d rules", model, MAX_RULES);
        }
    }
    *out = tp;
    return CDF_OK;
}

cdf_status cdf_tp_for_component(const char *dir, const char *model, const cdf_tp_rule *plan, cdf_tp **out) {
    if (!out) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_tp_for_component: out is NULL");
    *out = NULL;
    if (!g_mesh || cdf_device_mesh_size(g_mesh) <= 1) return CDF_OK;
    char name[128];
    folder_name(dir ? dir : "?", name, sizeof name);
    if (in_list(g_replicate, name)) return CDF_OK;
    return cdf_tp_new(cdf_device_mesh_group(g_mesh), name, model, plan, out);
}

void cdf_tp_free(cdf_tp *tp) { free(tp); }
int cdf_tp_rank(const cdf_tp *tp) { return tp ? tp->rank : 0; }
int cdf_tp_size(const cdf_tp *tp) { return tp ? tp->size : 1; }
int cdf_tp_replicas(const cdf_tp *tp) { return tp ? tp->replicas : 0; }
cdf_process_group *cdf_tp_group(const cdf_tp *tp) { return tp ? tp->pg : NULL; }

/* '*' matches exactly one non-empty dotted component; everything else literally. */
static bool pattern_match(const char *pat, const char *name) {
    while (*pat && *name) {
        if (*pat == '*') {
            if (*name == '.') return false;
            while (*name && *name != '.') name++;
            pat++;
        } else if (*pat++ != *name++) {
            return false;
        }
    }
    return !*pat && !*name;
}

static int rule_index(const cdf_tp *tp, const char *module) {
    for (int i = 0; tp && i < tp->n_rules; i++)
        if (pattern_match(tp->plan[i].pattern, module)) return i;
    return -1;
}

cdf_tp_style cdf_tp_style_for(const cdf_tp *tp, const char *module) {
    int i = rule_index(tp, module);
    return i < 0 ? CDF_TP_REPLICATE : tp->plan[i].style;
}

cdf_status cdf_tp_check_divisible(const cdf_tp *tp, const char *key, int64_t value) {
    if (!tp || value % tp->size == 0) return CDF_OK;
    return cdf_error(CDF_ERR_UNSUPPORTED,
                     "tensor parallelism over %d ranks: %s (%s) has %s = %lld, which is not divisible by %d (run it "
                     "unsharded on every rank instead: cdiffusers --tp-replicate %s)",
                     tp->size, tp->component, tp->model, key, (long long)value, tp->size, tp->component);
}

cdf_status cdf_tp_check_plan_used(const cdf_tp *tp) {
    for (int i = 0; tp && i < tp->n_rules; i++)
        if (tp->hits[i] == 0)
            return cdf_error(CDF_ERR_INTERNAL, "tensor-parallel plan of %s: rule '%s' matched no layer of %s", tp->model,
                             tp->plan[i].pattern, tp->component);
    return CDF_OK;
}

/* ---- sharded reads ------------------------------------------------------------------------------ */
static const char *style_name(cdf_tp_style s) {
    switch (s) {
    case CDF_TP_COLWISE: return "colwise";
    case CDF_TP_ROWWISE: return "rowwise";
    case CDF_TP_PACKED_ROWWISE: return "packed_rowwise";
    case CDF_TP_PACKED_COLWISE: return "packed_colwise";
    default: return "replicate";
    }
}

/* ---- where a shard's bytes come from ----------------------------------------------------------
 * A diffusers folder's safetensors tensor is read slice by slice (only the slice's bytes). A
 * single file or GGUF given in place of the folder, and a folder's "fp8_scaled" weight (whose
 * values are weight * scale_weight), are read through the weights source, converted
 * as a whole-layer load converts it: rows by slice as well (a fused qkv's to_q is a row range of
 * the file's qkv), columns cut from the whole converted tensor. A weight the file stores as GGUF
 * blocks stays blocks when every cut falls on a block boundary — rows always do, columns when each
 * part's slice starts and ends on one — so a rank holds its rows' (or its columns') blocks;
 * otherwise it is decoded like any value. */
typedef struct shard_src {
    const char *name;
    cdf_weights *w;
    const cdf_st_file *f;  /* folder */
    const cdf_st_tensor *t;
    cdf_wsrc *ws;          /* or a converted file */
    cdf_wsrc_tensor wt;
    const void *whole;     /* the converted file's whole tensor, once a column cut needed it */
    cdf_wsrc_tensor whole_t;
    int ndim;
    int64_t rows, width;   /* [rows, width] values (1-D: width 1) */
    cdf_dtype dtype;       /* of the values read */
    uint32_t qtype;        /* != 0: the file's blocks may be kept (be values in bb bytes) */
    int64_t be, bb;
    uint32_t quantize_to;  /* != 0: float values are quantized at load (--weight-type), qbe values in qbb bytes */
    int64_t qbe, qbb;
    cdf_tensor *into;      /* != NULL: the slice read goes into this tensor's replica `replica` */
    int replica;
    bool f32;              /* a 2-D table held in f32 whatever the load's weight dtype (cdf_tp_head_table_f32) */
    bool decode;           /* blocks are decoded on the host before they go up (one process over
                            * replicas: each replica's slice decoded by itself, set_replica_decode) */
} shard_src;

static void src_close(shard_src *s) {
    if (s->whole) cdf_wsrc_tensor_release(&s->whole_t);
    s->whole = NULL;
}

static cdf_status shape_error(const shard_src *s, int ndim, const int64_t *shape, int want_ndim, int64_t out, int64_t in) {
    char have[96] = "[";
    for (int i = 0; i < ndim; i++) {
        size_t o = strlen(have);
        snprintf(have + o, sizeof have - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    }
    strncat(have, "]", sizeof have - strlen(have) - 1);
    if (want_ndim == 1)
        return cdf_error(CDF_ERR_SHAPE, "weight '%s' in %s must be [%lld] (it is %s)", s->name, cdf_weights_path(s->w),
                         (long long)out, have);
    return cdf_error(CDF_ERR_SHAPE, "weight '%s' in %s has shape %s but the config implies [%lld, %lld]", s->name,
                     cdf_weights_path(s->w), have, (long long)out, (long long)in);
}

/* `--weight-type q8_0|q4_k`: a float weight is quantized after its slice is read, as a whole
 * layer is at load (cdf_linear_load), when the slice's rows are whole blocks at the whole layer's
 * block boundaries (then its blocks are the whole layer's blocks of that slice). */
static void set_quantize(shard_src *s) {
    const cdf_load_options *o = cdf_weights_options(s->w);
    if (s->ndim == 2 && !s->qtype && o->quantize_to && (o->weight_dtype == CDF_F32 || o->weight_dtype == CDF_BF16) &&
        cdf_dtype_is_float(s->dtype) && cdf_ggml_type_block(o->quantize_to, &s->qbe, &s->qbb) && s->qbe >= 2)
        s->quantize_to = o->quantize_to;
}

/* Opens `name`, which must be [out, in] (ndim 2) or [out] (ndim 1). */
static cdf_status src_open(cdf_weights *w, const char *name, int ndim, int64_t out, int64_t in, shard_src *s) {
    memset(s, 0, sizeof *s);
    s->name = name;
    s->w = w;
    s->ndim = ndim;
    s->rows = out;
    s->width = ndim == 2 ? in : 1;
    cdf_checkpoint *ck = cdf_weights_checkpoint(w);
    char scale[600];
    snprintf(scale, sizeof scale, "%.*sscale_weight", (int)strlen(name) - 6, name);
    const cdf_st_file *sf;
    const cdf_st_tensor *st;
    /* a folder's "fp8_scaled" weight: read through the source too, which applies the scale */
    const bool scaled = ck && cdf_checkpoint_has(ck, name) && cdf_checkpoint_has(ck, scale) &&
                        cdf_checkpoint_find(ck, name, &sf, &st) == CDF_OK && (st->dtype == CDF_F8_E4M3 || st->dtype == CDF_F8_E5M2);
    if (!ck || scaled) {
        s->ws = cdf_weights_source(w);
        if (!cdf_wsrc_find(s->ws, name, &s->wt))
            return cdf_error(CDF_ERR_NOT_FOUND, "weight '%s' is missing from %s (the config requires it)%s", name,
                             cdf_weights_path(w), cdf_wsrc_missing_hint(s->ws));
        if (s->wt.ndim != ndim || s->wt.shape[0] != out || (ndim == 2 && s->wt.shape[1] != in))
            return shape_error(s, s->wt.ndim, s->wt.shape, ndim, out, in);
        if (!cdf_dtype_is_float(s->wt.dtype))
            return cdf_error(CDF_ERR_DTYPE, "weight '%s' in %s has dtype %s; a linear layer needs a float dtype", name,
                             cdf_weights_path(w), cdf_dtype_name(s->wt.dtype));
        s->dtype = s->wt.dtype;
        const cdf_load_options *o = cdf_weights_options(w);
        if (ndim == 2 && s->wt.qtype >= 0 && !o->decode_quantized && (o->weight_dtype == CDF_F32 || o->weight_dtype == CDF_BF16) &&
            cdf_ggml_type_block((uint32_t)s->wt.qtype, &s->be, &s->bb) && s->be >= 2 &&
            cdf_ggml_can_dequantize((uint32_t)s->wt.qtype) && in % s->be == 0)
            s->qtype = (uint32_t)s->wt.qtype;
        set_quantize(s);
        return CDF_OK;
    }
    if (!cdf_checkpoint_has(ck, name))
        return cdf_error(CDF_ERR_NOT_FOUND, "weight '%s' is missing from %s (the config requires it)", name, cdf_weights_path(w));
    CDF_TRY(cdf_checkpoint_find(ck, name, &s->f, &s->t));
    /* read from the checkpoint directly: a component file in diffusers' names still counts it
     * as used (else its unused list names every sharded weight) */
    cdf_wsrc_tensor seen;
    (void)cdf_wsrc_find(cdf_weights_source(w), name, &seen);
    if (s->t->ndim != ndim || s->t->shape[0] != out || (ndim == 2 && s->t->shape[1] != in))
        return shape_error(s, s->t->ndim, s->t->shape, ndim, out, in);
    if (!cdf_dtype_is_float(s->t->dtype))
        return cdf_error(CDF_ERR_DTYPE, "weight '%s' in %s has dtype %s; a linear layer needs a float dtype", name,
                         cdf_weights_path(w), cdf_dtype_name(s->t->dtype));
    s->dtype = s->t->dtype;
    set_quantize(s);
    return CDF_OK;
}

/* Bytes of one row of n values (or of their blocks). */
static size_t row_bytes(const shard_src *s, bool blocks, int64_t n) {
    return blocks ? (size_t)(n / s->be * s->bb) : (size_t)n * cdf_dtype_size(s->dtype);
}

/* The converted file's whole tensor (values, or blocks), loaded once per source. */
static const uint8_t *src_whole(shard_src *s, bool blocks) {
    if (!s->whole) {
        s->whole_t = s->wt;
        int64_t rb = 0;
        s->whole = blocks ? cdf_wsrc_load_blocks(s->ws, &s->whole_t, s->name, &rb) : cdf_wsrc_load(s->ws, &s->whole_t, s->name);
        if (s->whole && blocks && (size_t)rb != row_bytes(s, true, s->width)) {
            cdf_error(CDF_ERR_FORMAT, "weight '%s' in %s: %lld bytes per row, but %lld %s values take %zu", s->name,
                      cdf_weights_path(s->w), (long long)rb, (long long)s->width, cdf_ggml_type_name(s->qtype),
                      row_bytes(s, true, s->width));
            cdf_wsrc_tensor_release(&s->whole_t);
            s->whole = NULL;
        }
    }
    return s->whole;
}

/* Rows [row0, row0 + n) into dst (n rows of row_bytes(s, blocks, width)). */
static cdf_status src_read_rows(shard_src *s, bool blocks, int64_t row0, int64_t n, uint8_t *dst) {
    if (s->t) return cdf_st_read_rows(s->f, s->t, row0, n, dst);
    const size_t rb = row_bytes(s, blocks, s->width);
    if (s->wt.swap_halves) { /* the rows are reordered as a whole: take them from the whole tensor */
        const uint8_t *all = src_whole(s, blocks);
        if (!all) return cdf_last_status();
        memcpy(dst, all + (size_t)row0 * rb, (size_t)n * rb);
        return CDF_OK;
    }
    cdf_wsrc_tensor t = s->wt; /* the same source rows, narrowed: only the slice is read */
    t.row0 = (s->wt.nrows >= 0 ? s->wt.row0 : 0) + row0;
    t.nrows = n;
    t.shape[0] = n;
    int64_t got = 0;
    const void *p = blocks ? cdf_wsrc_load_blocks(s->ws, &t, s->name, &got) : cdf_wsrc_load(s->ws, &t, s->name);
    if (!p) return cdf_last_status();
    if (blocks && (size_t)got != rb) {
        cdf_wsrc_tensor_release(&t);
        return cdf_error(CDF_ERR_FORMAT, "weight '%s' in %s: %lld bytes per row, but %lld %s values take %zu", s->name,
                         cdf_weights_path(s->w), (long long)got, (long long)s->width, cdf_ggml_type_name(s->qtype), rb);
    }
    memcpy(dst, p, (size_t)n * rb);
    cdf_wsrc_tensor_release(&t);
    return CDF_OK;
}

/* Columns [col0, col0 + n) of every row into dst (rows of row_bytes(s, blocks, n)). */
static cdf_status src_read_cols(shard_src *s, bool blocks, int64_t col0, int64_t n, uint8_t *dst) {
    if (s->t) return cdf_st_read_cols(s->f, s->t, col0, n, dst);
    /* (s->whole may be preset by read_col_parts_requantized: then no file is read) */
    const uint8_t *all = src_whole(s, blocks);
    if (!all) return cdf_last_status();
    const size_t rb = row_bytes(s, blocks, s->width), off = row_bytes(s, blocks, col0), nb = row_bytes(s, blocks, n);
    for (int64_t r = 0; r < s->rows; r++) memcpy(dst + (size_t)r * nb, all + (size_t)r * rb + off, nb);
    return CDF_OK;
}

/* Host bytes -> a device tensor: values in the load policy's dtype (2-D: weight_dtype; 1-D:
 * f32), or blocks as U8 [rows, row bytes]. */
static cdf_tensor *to_device(const shard_src *s, bool blocks, int64_t rows, int64_t cols, const void *data) {
    if (blocks && s->decode) { /* the blocks' values (cdf_linear_decode's numbers: f32, then the weight dtype) */
        float *vals = malloc(sizeof(float) * (size_t)(rows * cols) + 1);
        cdf_tensor *r = NULL;
        if (!vals) {
            cdf_error(CDF_ERR_OUT_OF_MEMORY, "weight '%s': out of host memory to decode its shard", s->name);
        } else if (cdf_ggml_dequantize(s->qtype, data, rows * cols, vals) == CDF_OK) {
            shard_src d = *s;
            d.decode = false, d.dtype = CDF_F32;
            r = to_device(&d, false, rows, cols, vals);
        } else {
            cdf_error_prefix("weight '%s' in %s: ", s->name, cdf_weights_path(s->w));
        }
        free(vals);
        return r;
    }
    const cdf_load_options *o = cdf_weights_options(s->w);
    const int64_t shape[2] = {rows, blocks ? (int64_t)row_bytes(s, true, cols) : cols};
    const cdf_dtype dt = blocks ? CDF_U8 : s->ndim >= 2 && !s->f32 ? o->weight_dtype : CDF_F32;
    if (s->into) { /* another replica's slice, into the tensor replica 0's made */
        if (s->into->ndim != s->ndim || s->into->shape[0] != shape[0] || (s->ndim > 1 && s->into->shape[1] != shape[1]) ||
            s->into->dtype != dt) {
            cdf_error(CDF_ERR_INTERNAL, "loading weight '%s': replica %d's slice differs in shape from replica 0's", s->name,
                      s->replica);
            return NULL;
        }
        if (cdf_tensor_upload_replica(s->into, s->replica, data, blocks ? CDF_U8 : s->dtype) != CDF_OK) {
            cdf_error_prefix("loading weight '%s' (replica %d) from %s: ", s->name, s->replica, cdf_weights_path(s->w));
            return NULL;
        }
        return s->into;
    }
    cdf_scope_suppress(1); /* the weight belongs to the model, not to the loader's scope */
    cdf_tensor *r = cdf_tensor_from_host(o->device, dt, s->ndim, shape, data, blocks ? CDF_U8 : s->dtype);
    cdf_scope_suppress(-1);
    if (!r) cdf_error_prefix("loading weight '%s' from %s: ", s->name, cdf_weights_path(s->w));
    return r;
}

/* Values [rows, cols] quantized to s->quantize_to (whole blocks per row), as blocks on the device. */
static cdf_tensor *quantized_to_device(const shard_src *s, int64_t rows, int64_t cols, const void *vals) {
    const size_t n = (size_t)(rows * cols);
    float *f32 = s->dtype == CDF_F32 ? NULL : malloc(sizeof(float) * n + 1);
    uint8_t *blocks = malloc((size_t)(rows * (cols / s->qbe * s->qbb)) + 1);
    cdf_tensor *r = NULL;
    if ((s->dtype != CDF_F32 && !f32) || !blocks) {
        cdf_error(CDF_ERR_OUT_OF_MEMORY, "weight '%s': out of host memory to quantize its shard", s->name);
    } else {
        if (f32) cdf_convert(f32, CDF_F32, vals, s->dtype, n);
        if (cdf_ggml_quantize(s->quantize_to, f32 ? f32 : vals, (int64_t)n, blocks) == CDF_OK) {
            shard_src q = *s; /* the blocks of the quantized type */
            q.qtype = s->quantize_to, q.be = s->qbe, q.bb = s->qbb;
            r = to_device(&q, true, rows, cols, blocks);
        } else {
            cdf_error_prefix("weight '%s' in %s: ", s->name, cdf_weights_path(s->w));
        }
    }
    free(f32);
    free(blocks);
    return r;
}

/* How a shard's weight is held: values, the file's blocks, or values quantized at load. */
typedef enum { HOLD_VALUES, HOLD_BLOCKS, HOLD_QUANTIZED } hold;

/* The shard's weight as a linear layer holds it: w, and the block type when it holds blocks. */
static cdf_status set_weight(cdf_linear_layer *l, const shard_src *s, hold h, cdf_tensor *t) {
    if (!t) return cdf_last_status();
    l->w = t;
    if (h != HOLD_VALUES && !s->decode) {
        l->qtype = h == HOLD_BLOCKS ? s->qtype : s->quantize_to;
        l->qwdt = cdf_weights_options(s->w)->weight_dtype;
        /* a device without a quantized matmul (the values kind): the blocks' decoded values */
        if (!cdf_device_runs_quantized(cdf_tensor_device(t))) return cdf_linear_decode(l);
    }
    return CDF_OK;
}

/* For every part i: rows [off_i + rank*part_i/size, + part_i/size) of the 1-D or 2-D source,
 * stacked in part order into one device tensor of sum(part_i)/size rows (one part: a colwise
 * shard). Rows are contiguous in the file, so each part is one counted slice read. */
static cdf_tensor *read_row_parts(shard_src *s, const cdf_tp *tp, int n_parts, const int64_t *parts, hold h) {
    const bool blocks = h == HOLD_BLOCKS;
    const size_t rb = row_bytes(s, blocks, s->width);
    int64_t local = 0;
    for (int i = 0; i < n_parts; i++) local += parts[i] / tp->size;
    uint8_t *buf = malloc((size_t)local * rb + 1);
    if (!buf) {
        cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory reading rows of '%s' (%lld x %lld)", s->name, (long long)local,
                  (long long)s->width);
        return NULL;
    }
    cdf_status st = CDF_OK;
    int64_t off = 0, dst_row = 0;
    for (int i = 0; i < n_parts && st == CDF_OK; i++) {
        const int64_t n = parts[i] / tp->size;
        st = src_read_rows(s, blocks, off + tp->rank * n, n, buf + (size_t)dst_row * rb);
        off += parts[i];
        dst_row += n;
    }
    cdf_tensor *r = st != CDF_OK          ? NULL
                    : h == HOLD_QUANTIZED ? quantized_to_device(s, local, s->width, buf)
                                          : to_device(s, blocks, local, s->width, buf);
    free(buf);
    return r;
}

/* Whether the column cuts of read_col_parts fall on boundaries of be-value blocks. */
static bool cuts_on_blocks(int64_t be, const cdf_tp *tp, int n_parts, const int64_t *parts) {
    int64_t off = 0;
    for (int i = 0; i < n_parts; i++) {
        const int64_t n = parts[i] / tp->size;
        if ((off + tp->rank * n) % be || n % be) return false;
        off += parts[i];
    }
    return true;
}

/* How a shard of s is held: its rows (split_rows) or its columns (parts). */
static hold hold_for(const shard_src *s, bool split_rows, const cdf_tp *tp, int n_parts, const int64_t *parts) {
    if (s->qtype && (split_rows || cuts_on_blocks(s->be, tp, n_parts, parts))) return HOLD_BLOCKS;
    if (s->quantize_to && s->width % s->qbe == 0 && (split_rows || cuts_on_blocks(s->qbe, tp, n_parts, parts)))
        return HOLD_QUANTIZED;
    return HOLD_VALUES;
}

/* For every part i: columns [off_i + rank*part_i/size, + part_i/size) of the 2-D source,
 * concatenated in part order into one [rows, sum(part_i)/size] device tensor. */
static cdf_tensor *read_col_parts(shard_src *s, const cdf_tp *tp, int n_parts, const int64_t *parts, hold h);

/* Under --weight-type, a column slice whose cuts fall inside blocks cannot hold blocks; it holds
 * the values the whole layer's blocks decode to (quantized whole rows, decoded, cut), so that
 * the ranks compute with the weights one process would: the whole tensor is read for it. */
static cdf_tensor *read_col_parts_requantized(shard_src *s, const cdf_tp *tp, int n_parts, const int64_t *parts) {
    const size_t n = (size_t)(s->rows * s->width);
    uint8_t *vals = malloc(n * cdf_dtype_size(s->dtype) + 1), *blocks = malloc(n / (size_t)s->qbe * (size_t)s->qbb + 1);
    float *f32 = malloc(n * sizeof(float) + 1);
    cdf_tensor *r = NULL;
    if (!vals || !blocks || !f32) {
        cdf_error(CDF_ERR_OUT_OF_MEMORY, "weight '%s': out of host memory to quantize it", s->name);
    } else if (src_read_rows(s, false, 0, s->rows, vals) == CDF_OK) {
        cdf_convert(f32, CDF_F32, vals, s->dtype, n);
        if (cdf_ggml_quantize(s->quantize_to, f32, (int64_t)n, blocks) == CDF_OK &&
            cdf_ggml_dequantize(s->quantize_to, blocks, (int64_t)n, f32) == CDF_OK) {
            shard_src d = *s; /* the decoded whole tensor as the source of the cut */
            d.f = NULL, d.t = NULL, d.ws = NULL, d.dtype = CDF_F32, d.quantize_to = 0;
            d.whole = f32;
            r = read_col_parts(&d, tp, n_parts, parts, HOLD_VALUES);
        } else {
            cdf_error_prefix("weight '%s' in %s: ", s->name, cdf_weights_path(s->w));
        }
    }
    free(vals), free(blocks), free(f32);
    return r;
}

static cdf_tensor *read_col_parts(shard_src *s, const cdf_tp *tp, int n_parts, const int64_t *parts, hold h) {
    if (h == HOLD_VALUES && s->quantize_to && s->width % s->qbe == 0) return read_col_parts_requantized(s, tp, n_parts, parts);
    const bool blocks = h == HOLD_BLOCKS;
    int64_t local = 0, max_part = 0;
    for (int i = 0; i < n_parts; i++) {
        local += parts[i] / tp->size;
        if (parts[i] / tp->size > max_part) max_part = parts[i] / tp->size;
    }
    const size_t lb = row_bytes(s, blocks, local);
    uint8_t *out = malloc((size_t)s->rows * lb + 1);
    uint8_t *tmp = n_parts > 1 ? malloc((size_t)s->rows * row_bytes(s, blocks, max_part) + 1) : NULL;
    if (!out || (n_parts > 1 && !tmp)) {
        free(out);
        free(tmp);
        cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory reading columns of '%s'", s->name);
        return NULL;
    }
    cdf_status st = CDF_OK;
    int64_t off = 0;
    size_t dst = 0;
    for (int i = 0; i < n_parts && st == CDF_OK; i++) {
        const int64_t n = parts[i] / tp->size, col0 = off + tp->rank * n;
        const size_t nb = row_bytes(s, blocks, n);
        if (n_parts == 1) {
            st = src_read_cols(s, blocks, col0, n, out);
        } else {
            st = src_read_cols(s, blocks, col0, n, tmp);
            for (int64_t r = 0; st == CDF_OK && r < s->rows; r++) memcpy(out + (size_t)r * lb + dst, tmp + (size_t)r * nb, nb);
        }
        off += parts[i];
        dst += nb;
    }
    cdf_tensor *r = st != CDF_OK          ? NULL
                    : h == HOLD_QUANTIZED ? quantized_to_device(s, s->rows, local, out)
                                          : to_device(s, blocks, s->rows, local, out);
    free(out);
    free(tmp);
    return r;
}

/* One process over replicas (tp->replicas > 1): rank 0's slice makes the tensor, then every
 * other rank's slice is read (only its bytes, as that rank's process would) into its replica. */
static cdf_tensor *each_replica(shard_src *s, const cdf_tp *tp, int n_parts, const int64_t *parts, hold h, bool rows) {
    cdf_tensor *t = rows ? read_row_parts(s, tp, n_parts, parts, h) : read_col_parts(s, tp, n_parts, parts, h);
    for (int r = 1; t && r < tp->replicas; r++) {
        cdf_tp tr = *tp;
        tr.rank = r;
        s->into = t;
        s->replica = r;
        cdf_tensor *u = rows ? read_row_parts(s, &tr, n_parts, parts, h) : read_col_parts(s, &tr, n_parts, parts, h);
        s->into = NULL;
        if (!u) {
            cdf_tensor_release(t);
            t = NULL;
        }
    }
    return t;
}
static cdf_tensor *rows_of_each(shard_src *s, const cdf_tp *tp, int n_parts, const int64_t *parts, hold h) {
    return each_replica(s, tp, n_parts, parts, h, true);
}
static cdf_tensor *cols_of_each(shard_src *s, const cdf_tp *tp, int n_parts, const int64_t *parts, hold h) {
    return each_replica(s, tp, n_parts, parts, h, false);
}

/* The bias of a layer whose outputs are split: this rank's rows of every part. */
static cdf_status load_split_bias(cdf_weights *w, const cdf_tp *tp, cdf_linear_layer *l, int bias, int n_parts,
                                  const int64_t *parts, int64_t out, const char *prefix) {
    char name[512];
    snprintf(name, sizeof name, "%s.bias", prefix);
    if (bias == 0 || (bias == -1 && !cdf_weights_has(w, "%s", name))) return CDF_OK;
    shard_src b;
    cdf_status st = src_open(w, name, 1, out, 1, &b);
    if (st == CDF_OK && !(l->b = rows_of_each(&b, tp, n_parts, parts, HOLD_VALUES))) st = cdf_last_status();
    src_close(&b);
    return st;
}

/* The plan's style for the layer being loaded, counted as a hit of its rule (cdf_tp_check_plan_used). */
static cdf_tp_style count_style(const cdf_tp *tp_c, const char *prefix) {
    cdf_tp *tp = (cdf_tp *)tp_c; /* hit counters only */
    const int ri = rule_index(tp, prefix);
    if (ri >= 0) tp->hits[ri]++;
    return ri < 0 ? CDF_TP_REPLICATE : tp->plan[ri].style;
}

static int64_t sum_parts(int n_parts, const int64_t *parts) {
    int64_t n = 0;
    for (int i = 0; i < n_parts; i++) n += parts[i];
    return n;
}

/* Every part of the split dimension ("input" / "output") must divide by the ranks. */
static cdf_status check_parts_divide(const cdf_tp *tp, const char *prefix, const char *dim, int n_parts, const int64_t *parts) {
    for (int i = 0; i < n_parts; i++)
        if (parts[i] % tp->size)
            return cdf_error(CDF_ERR_UNSUPPORTED, "tensor parallelism over %d ranks: %s.%s has an %s part of %lld features, "
                             "not divisible by %d", tp->size, tp->component, prefix, dim, (long long)parts[i], tp->size);
    return CDF_OK;
}

/* One process over replicas: GGUF blocks and --weight-type blocks are decoded on the host as
 * each replica's slice is read (a values-kind device decodes a whole layer's blocks at load
 * too, cdf_linear_decode, but from one view: replica 0's, which one slice per replica would not
 * survive). The slices cut are those of the MPI path: a rank's rows' blocks, or its columns'
 * where the cuts fall on block boundaries, else the decoded values of the whole layer's blocks. */
static cdf_status set_replica_decode(const cdf_tp *tp, shard_src *s) {
    if (tp->replicas > 1 && (s->qtype || s->quantize_to)) s->decode = true;
    return CDF_OK;
}

/* The layer's "<prefix>.weight" [out, in] opened for reading slices. */
static cdf_status open_weight(cdf_weights *w, const char *prefix, int64_t out, int64_t in, shard_src *src) {
    char name[512];
    snprintf(name, sizeof name, "%s.weight", prefix);
    return src_open(w, name, 2, out, in, src);
}

/* The last step of both loaders: a failed load frees what it holds; a loaded shard is indexed. */
static cdf_status finish_load(cdf_weights *w, cdf_linear_layer *l, cdf_status st, const char *prefix) {
    if (st != CDF_OK) {
        cdf_linear_free(l);
        return st;
    }
    cdf_layer_index_add(cdf_weights_options(w)->layers, prefix, l, true);
    return CDF_OK;
}

static cdf_status load_impl(cdf_weights *w, const cdf_tp *tp_c, cdf_linear_layer *l, int n_parts, const int64_t *parts,
                            int64_t out, int bias, const char *prefix) {
    cdf_tp *tp = (cdf_tp *)tp_c;
    memset(l, 0, sizeof *l);
    const int64_t in = sum_parts(n_parts, parts);
    const cdf_tp_style style = count_style(tp, prefix);
    if (style == CDF_TP_REPLICATE || tp->size == 1) return cdf_linear_load(w, l, in, out, bias, "%s", prefix);
    if (style == CDF_TP_PACKED_COLWISE)
        return cdf_error(CDF_ERR_INTERNAL, "tensor-parallel plan of %s: %s is 'packed_colwise' but the model does not load it "
                         "as a layer with packed outputs", tp->model, prefix);

    /* the widths this style splits must divide (the model's own checks name the config key;
     * this catches a plan applied to a layer the model did not check) */
    if (style == CDF_TP_COLWISE && out % tp->size)
        return cdf_error(CDF_ERR_UNSUPPORTED, "tensor parallelism over %d ranks: %s.%s has %lld output features, not divisible by %d",
                         tp->size, tp->component, prefix, (long long)out, tp->size);
    if (style == CDF_TP_ROWWISE && n_parts > 1)
        return cdf_error(CDF_ERR_INTERNAL, "tensor-parallel plan of %s: %s is 'rowwise' but its input is packed from %d parts "
                         "(use packed_rowwise)", tp->model, prefix, n_parts);
    if (style != CDF_TP_COLWISE) CDF_TRY(check_parts_divide(tp, prefix, "input", n_parts, parts));

    shard_src src;
    cdf_status st = open_weight(w, prefix, out, in, &src);
    if (st == CDF_OK) st = set_replica_decode(tp, &src);
    l->in = in;
    l->out = out;
    if (st == CDF_OK && style == CDF_TP_COLWISE) {
        l->out = out / tp->size;
        l->shard = (cdf_linear_shard){.style = style, .rank = tp->rank, .size = tp->size, .replicas = tp->replicas, .n_parts = 1, .parts = {out}};
        const int64_t whole_out[1] = {out};
        const hold h = hold_for(&src, true, tp, 1, whole_out);
        st = set_weight(l, &src, h, rows_of_each(&src, tp, 1, whole_out, h));
        if (st == CDF_OK) st = load_split_bias(w, tp, l, bias, 1, whole_out, out, prefix);
    } else if (st == CDF_OK) {
        /* rowwise / packed: this rank's input columns; the bias stays whole (added once, by rank 0) */
        l->in = in / tp->size;
        l->shard = (cdf_linear_shard){.style = style, .rank = tp->rank, .size = tp->size, .replicas = tp->replicas, .n_parts = n_parts};
        memcpy(l->shard.parts, parts, (size_t)n_parts * sizeof *parts);
        const hold h = hold_for(&src, false, tp, n_parts, parts);
        st = set_weight(l, &src, h, cols_of_each(&src, tp, n_parts, parts, h));
        int64_t bs[1] = {out};
        if (st == CDF_OK && bias == 1) l->b = cdf_weights_get(w, 1, bs, "%s.bias", prefix);
        else if (st == CDF_OK && bias == -1) l->b = cdf_weights_get_opt(w, 1, bs, "%s.bias", prefix);
        if (st == CDF_OK && ((bias == 1 && !l->b) || (bias == -1 && !l->b && cdf_weights_has(w, "%s.bias", prefix))))
            st = cdf_last_status() != CDF_OK ? cdf_last_status() : CDF_ERR_INTERNAL;
        /* replicas: the bias on replica 0, zeros on the others (the sum holds it once, as rank
         * 0 alone adds it over MPI) */
        if (st == CDF_OK && l->b && tp->replicas > 1) {
            float *zeros = calloc((size_t)out, sizeof *zeros);
            if (!zeros) st = cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
            for (int r = 1; st == CDF_OK && r < tp->replicas; r++) st = cdf_tensor_upload_replica(l->b, r, zeros, CDF_F32);
            free(zeros);
        }
        l->tp = tp;
    }
    src_close(&src);
    return finish_load(w, l, st, prefix);
}

/* The parts a caller gives for a packed dimension ("input" / "output"): 1..MAX_PARTS, each >= 1. */
static cdf_status check_parts(const char *prefix, const char *dim, int n_parts, const int64_t *parts) {
    if (n_parts < 1 || n_parts > MAX_PARTS || !parts)
        return cdf_error(CDF_ERR_INVALID_ARG, "%s: %d %s parts (1..%d)", prefix, n_parts, dim, MAX_PARTS);
    for (int i = 0; i < n_parts; i++)
        if (parts[i] < 1) return cdf_error(CDF_ERR_INVALID_ARG, "%s: %s part %d has %lld features", prefix, dim, i, (long long)parts[i]);
    return CDF_OK;
}

/* A failed shard load says which slice of which layer this rank was reading. */
static cdf_status with_context(const cdf_tp *tp, const char *prefix, cdf_status s) {
    const cdf_tp_style st = s != CDF_OK ? cdf_tp_style_for(tp, prefix) : CDF_TP_REPLICATE;
    if (st != CDF_TP_REPLICATE && tp->size > 1)
        cdf_error_prefix("%s shard of '%s' (rank %d of %d): ", style_name(st), prefix, tp->rank, tp->size);
    return s;
}

cdf_status cdf_tp_linear_load(cdf_weights *w, const cdf_tp *tp, cdf_linear_layer *l, int64_t in, int64_t out, int bias,
                              const char *fmt, ...) {
    char prefix[480];
    CDF_NN_FORMAT_NAME(prefix, fmt);
    const int64_t parts[1] = {in};
    return with_context(tp, prefix, load_impl(w, tp, l, 1, parts, out, bias, prefix));
}

cdf_status cdf_tp_linear_load_packed(cdf_weights *w, const cdf_tp *tp, cdf_linear_layer *l, int n_parts,
                                     const int64_t *parts, int64_t out, int bias, const char *fmt, ...) {
    char prefix[480];
    CDF_NN_FORMAT_NAME(prefix, fmt);
    CDF_TRY(check_parts(prefix, "input", n_parts, parts));
    return with_context(tp, prefix, load_impl(w, tp, l, n_parts, parts, out, bias, prefix));
}

cdf_tensor *cdf_tp_head_table_f32(cdf_weights *w, const cdf_tp *tp, int64_t rows, int64_t cols, const char *fmt, ...) {
    char name[480];
    CDF_NN_FORMAT_NAME(name, fmt);
    if (!tp || tp->size == 1) return cdf_weights_get_f32(w, 2, (int64_t[]){rows, cols}, "%s", name);
    if (cols % tp->size) {
        cdf_error(CDF_ERR_UNSUPPORTED, "tensor parallelism over %d ranks: %s.%s has %lld heads, not divisible by %d", tp->size,
                  tp->component, name, (long long)cols, tp->size);
        return NULL;
    }
    shard_src src;
    cdf_tensor *t = NULL;
    if (src_open(w, name, 2, rows, cols, &src) == CDF_OK) {
        src.qtype = 0, src.quantize_to = 0, src.f32 = true; /* values, as cdf_weights_get_f32 holds them */
        const int64_t whole_cols[1] = {cols};
        t = cols_of_each(&src, tp, 1, whole_cols, HOLD_VALUES);
    }
    src_close(&src);
    if (!t) cdf_error_prefix("column shard of '%s' (rank %d of %d): ", name, tp->rank, tp->size);
    return t;
}

/* ---- packed outputs (PackedColwiseParallel) ------------------------------------------------------- */
static cdf_status load_packed_out_impl(cdf_weights *w, const cdf_tp *tp, cdf_linear_layer *l, int64_t in, int n_parts,
                                       const int64_t *parts, int bias, const char *prefix) {
    memset(l, 0, sizeof *l);
    const int64_t out = sum_parts(n_parts, parts);
    const cdf_tp_style style = count_style(tp, prefix);
    if (style == CDF_TP_REPLICATE || tp->size == 1) return cdf_linear_load(w, l, in, out, bias, "%s", prefix);
    if (style != CDF_TP_PACKED_COLWISE)
        return cdf_error(CDF_ERR_INTERNAL, "tensor-parallel plan of %s: %s is '%s' but its output is packed from %d parts "
                         "(use packed_colwise)", tp->model, prefix, style_name(style), n_parts);
    CDF_TRY(check_parts_divide(tp, prefix, "output", n_parts, parts));
    shard_src src;
    cdf_status st = open_weight(w, prefix, out, in, &src);
    if (st == CDF_OK) st = set_replica_decode(tp, &src);
    l->in = in;
    l->out = out / tp->size;
    l->shard = (cdf_linear_shard){.style = style, .rank = tp->rank, .size = tp->size, .replicas = tp->replicas, .n_parts = n_parts};
    memcpy(l->shard.parts, parts, (size_t)n_parts * sizeof *parts);
    const hold h = hold_for(&src, true, tp, n_parts, parts);
    if (st == CDF_OK) st = set_weight(l, &src, h, rows_of_each(&src, tp, n_parts, parts, h));
    src_close(&src);
    if (st == CDF_OK) st = load_split_bias(w, tp, l, bias, n_parts, parts, out, prefix);
    return finish_load(w, l, st, prefix);
}

cdf_status cdf_tp_linear_load_packed_out(cdf_weights *w, const cdf_tp *tp, cdf_linear_layer *l, int64_t in, int n_parts,
                                         const int64_t *out_parts, int bias, const char *fmt, ...) {
    char prefix[480];
    CDF_NN_FORMAT_NAME(prefix, fmt);
    CDF_TRY(check_parts(prefix, "output", n_parts, out_parts));
    return with_context(tp, prefix, load_packed_out_impl(w, tp, l, in, n_parts, out_parts, bias, prefix));
}

/* ---- the slice a shard holds (what LoRA adapters are cut to) ---------------------------------- */
static bool splits_out(const cdf_linear_shard *s) { return s->style == CDF_TP_COLWISE || s->style == CDF_TP_PACKED_COLWISE; }
static bool splits_in(const cdf_linear_shard *s) { return s->style == CDF_TP_ROWWISE || s->style == CDF_TP_PACKED_ROWWISE; }

static int64_t whole(const cdf_linear_shard *s) {
    int64_t n = 0;
    for (int i = 0; i < s->n_parts; i++) n += s->parts[i];
    return n;
}

int64_t cdf_linear_full_in(const cdf_linear_layer *l) { return splits_in(&l->shard) ? whole(&l->shard) : l->in; }
int64_t cdf_linear_full_out(const cdf_linear_layer *l) { return splits_out(&l->shard) ? whole(&l->shard) : l->out; }

/* Both walk the parts of the split dimension: part i (starting at off_i in the whole layer)
 * gives this rank its indices [off_i + rank*n_i, + n_i), n_i = p_i/size, placed after those of
 * the parts before it — the order the loaders stacked the shard's weight in. */
void cdf_linear_shard_out_rows(const cdf_linear_layer *l, const float *src, int64_t width, float *dst) {
    const cdf_linear_shard *s = &l->shard;
    if (!splits_out(s)) {
        memcpy(dst, src, (size_t)(l->out * width) * sizeof *dst);
        return;
    }
    int64_t off = 0, d = 0;
    for (int i = 0; i < s->n_parts; i++) {
        const int64_t n = s->parts[i] / s->size;
        memcpy(dst + d * width, src + (off + s->rank * n) * width, (size_t)(n * width) * sizeof *dst);
        off += s->parts[i];
        d += n;
    }
}

void cdf_linear_shard_in_cols(const cdf_linear_layer *l, const float *src, int64_t rows, float *dst) {
    const cdf_linear_shard *s = &l->shard;
    if (!splits_in(s)) {
        memcpy(dst, src, (size_t)(rows * l->in) * sizeof *dst);
        return;
    }
    const int64_t full = whole(s);
    for (int64_t r = 0; r < rows; r++) {
        int64_t off = 0, d = 0;
        for (int i = 0; i < s->n_parts; i++) {
            const int64_t n = s->parts[i] / s->size;
            memcpy(dst + r * l->in + d, src + r * full + off + s->rank * n, (size_t)n * sizeof *dst);
            off += s->parts[i];
            d += n;
        }
    }
}

cdf_tensor *cdf_linear_shard_tensor(const cdf_linear_layer *l, cdf_device *dev, bool out_rows, const float *src, int64_t n,
                                    float mult) {
    const int64_t rows = out_rows ? l->out : n, cols = out_rows ? n : l->in;
    float *buf = malloc((size_t)(rows * cols) * sizeof *buf);
    if (!buf) {
        cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
        return NULL;
    }
    cdf_tensor *t = NULL;
    const int reps = l->shard.style != CDF_TP_REPLICATE && l->shard.replicas > 1 ? l->shard.replicas : 1;
    for (int r = 0; r < reps; r++) {
        cdf_linear_layer lr = *l; /* only its slice description is read */
        if (reps > 1) lr.shard.rank = r;
        if (out_rows) cdf_linear_shard_out_rows(&lr, src, n, buf);
        else cdf_linear_shard_in_cols(&lr, src, n, buf);
        if (mult != 1.0f)
            for (int64_t i = 0; i < rows * cols; i++) buf[i] *= mult;
        /* replica 0's values make the tensor (on every replica), each other replica gets its own */
        if (r == 0) t = cdf_tensor_from_host(dev, CDF_F32, 2, (int64_t[]){rows, cols}, buf, CDF_F32);
        else if (cdf_tensor_upload_replica(t, r, buf, CDF_F32) != CDF_OK) {
            cdf_tensor_release(t);
            t = NULL;
        }
        if (!t) break;
    }
    free(buf);
    return t;
}

cdf_status cdf_linear_reload_weight(cdf_weights *w, cdf_linear_layer *l, const char *prefix) {
    if (!w || !l || !prefix) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_linear_reload_weight: bad arguments");
    if (cdf_weights_options(w)->layers)
        return cdf_error(CDF_ERR_INVALID_ARG, "cdf_linear_reload_weight: the weights must be opened without a layer index");
    cdf_linear_layer t;
    memset(&t, 0, sizeof t);
    const cdf_linear_shard *s = &l->shard;
    if (s->style == CDF_TP_REPLICATE) {
        CDF_TRY(cdf_linear_load(w, &t, l->in, l->out, 0, "%s", prefix)); /* whole: as any model loads it */
    } else {
        char name[512];
        snprintf(name, sizeof name, "%s.weight", prefix);
        shard_src src;
        cdf_status st = src_open(w, name, 2, cdf_linear_full_out(l), cdf_linear_full_in(l), &src);
        /* the readers need only the rank, the size and the replicas; blocks come back as the load
         * kept them (over replicas: each replica's slice, decoded as at load) */
        const cdf_tp tp = {.rank = s->rank, .size = s->size, .replicas = s->replicas};
        if (st == CDF_OK) st = set_replica_decode(&tp, &src);
        const hold h = hold_for(&src, splits_out(s), &tp, s->n_parts, s->parts);
        if (st == CDF_OK)
            st = set_weight(&t, &src, h,
                            splits_out(s) ? rows_of_each(&src, &tp, s->n_parts, s->parts, h)
                                          : cols_of_each(&src, &tp, s->n_parts, s->parts, h));
        src_close(&src);
        if (st != CDF_OK) return st;
    }
    if (cdf_tensor_dim(t.w, 0) != cdf_tensor_dim(l->w, 0) || (!t.qtype && cdf_tensor_dim(t.w, 1) != l->in)) {
        cdf_linear_free(&t);
        return cdf_error(CDF_ERR_SHAPE, "re-reading '%s' from %s: it no longer has the layer's shape", prefix, cdf_weights_path(w));
    }
    cdf_tensor_release(l->w);
    l->w = t.w;
    l->qtype = t.qtype;
    l->qwdt = t.qwdt;
    return CDF_OK;
}

/* ---- forward ----------------------------------------------------------------------------------- */
cdf_tensor *cdf_tp_linear_rowwise_fwd(const cdf_linear_layer *l, cdf_tensor *x) {
    if (!x) return NULL;
    const cdf_tp *tp = l->tp;
    /* partial products summed by the all-reduce op: queued with the other ops and captured by
     * compile (a host-side all-reduce would be a graph break and a host sync per layer) */
    cdf_scope_push();
    cdf_tensor *b = tp->rank == 0 ? l->b : NULL;
    cdf_tensor *y = l->qtype ? cdf_linear_quantized(x, l->w, l->qtype, l->in, l->qwdt, b) : cdf_linear(x, l->w, b);
    /* run-time LoRA: this rank holds the columns of A its inputs are and all of B, so
     * B (s * A_r x_r) is its partial of B (s * A x): added before the all-reduce, the sum holds the
     * adapter once (as it holds the bias once), and no second collective is needed */
    if (y && l->lora) {
        cdf_tensor *d = l->lora->delta(l->lora, x);
        y = d ? cdf_add(y, d) : NULL;
    }
    cdf_tensor *r = y ? cdf_all_reduce_sum(y, tp->pg) : NULL;
    if (!r && y) cdf_error_prefix("%s: ", tp->component);
    cdf_scope_pop(r ? &r : NULL, r ? 1 : 0);
    return r;
}
