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
 * Only the bytes of the slice are read from the file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdiffusers/dist.h"
#include "core/error_internal.h"
#include "nn/lora.h"
#include "nn/nn.h"
#include "tensor/tensor_impl.h"

#define MAX_RULES 64
#define MAX_PARTS CDF_LINEAR_MAX_PARTS

struct cdf_tp {
    cdf_process_group *pg;
    int rank, size;
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

/* Find `name` and check that it is [out, in]. */
static cdf_status find_weight(cdf_weights *w, const char *name, int64_t out, int64_t in, const cdf_st_file **f,
                              const cdf_st_tensor **t) {
    cdf_checkpoint *ck = cdf_weights_checkpoint(w);
    if (!ck)
        return cdf_error(CDF_ERR_UNSUPPORTED, "weight '%s': tensor parallelism reads slices of a diffusers folder's "
                         "safetensors; %s is a single file in another layout or GGUF (convert it to a folder)",
                         name, cdf_weights_path(w));
    if (!cdf_checkpoint_has(ck, name))
        return cdf_error(CDF_ERR_NOT_FOUND, "weight '%s' is missing from %s (the config requires it)", name,
                         cdf_weights_path(w));
    CDF_TRY(cdf_checkpoint_find(ck, name, f, t));
    if ((*t)->ndim != 2 || (*t)->shape[0] != out || (*t)->shape[1] != in) {
        char have[96] = "[";
        for (int i = 0; i < (*t)->ndim; i++) {
            size_t o = strlen(have);
            snprintf(have + o, sizeof have - o, "%s%lld", i ? ", " : "", (long long)(*t)->shape[i]);
        }
        strncat(have, "]", sizeof have - strlen(have) - 1);
        return cdf_error(CDF_ERR_SHAPE, "weight '%s' in %s has shape %s but the config implies [%lld, %lld]", name,
                         cdf_weights_path(w), have, (long long)out, (long long)in);
    }
    char scale[600];
    snprintf(scale, sizeof scale, "%.*sscale_weight", (int)strlen(name) - 6, name);
    if (((*t)->dtype == CDF_F8_E4M3 || (*t)->dtype == CDF_F8_E5M2) && cdf_checkpoint_has(ck, scale))
        return cdf_error(CDF_ERR_UNSUPPORTED, "weight '%s' in %s is scaled fp8 ('%s'), which tensor parallelism does not "
                         "read yet", name, cdf_weights_path(w), scale);
    if (!cdf_dtype_is_float((*t)->dtype))
        return cdf_error(CDF_ERR_DTYPE, "weight '%s' in %s has dtype %s; a linear layer needs a float dtype", name,
                         cdf_weights_path(w), cdf_dtype_name((*t)->dtype));
    return CDF_OK;
}

/* Host bytes -> a device tensor in the load policy's dtype (2-D: weight_dtype; 1-D: f32). */
static cdf_tensor *to_device(cdf_weights *w, int ndim, const int64_t *shape, const void *data, cdf_dtype src_dt,
                             const char *name) {
    const cdf_load_options *o = cdf_weights_options(w);
    cdf_dtype dt = ndim >= 2 ? o->weight_dtype : CDF_F32;
    cdf_scope_suppress(1); /* the weight belongs to the model, not to the loader's scope */
    cdf_tensor *r = cdf_tensor_from_host(o->device, dt, ndim, shape, data, src_dt);
    cdf_scope_suppress(-1);
    if (!r) cdf_error_prefix("loading weight '%s' from %s: ", name, cdf_weights_path(w));
    return r;
}

/* Rows [row0, row0 + n) of a 1-D or 2-D tensor, as a device tensor. */
static cdf_tensor *read_rows(cdf_weights *w, const cdf_st_file *f, const cdf_st_tensor *t, int64_t row0, int64_t n,
                             const char *name) {
    const int64_t width = t->ndim == 2 ? t->shape[1] : 1;
    const size_t bytes = (size_t)(n * width) * cdf_dtype_size(t->dtype);
    void *buf = malloc(bytes ? bytes : 1);
    if (!buf) {
        cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory reading rows of '%s' (%zu bytes)", name, bytes);
        return NULL;
    }
    cdf_tensor *r = NULL;
    if (cdf_st_read_rows(f, t, row0, n, buf) == CDF_OK) {
        int64_t shape[2] = {n, width};
        r = to_device(w, t->ndim, shape, buf, t->dtype, name);
    }
    free(buf);
    return r;
}

/* For every part i: columns [off_i + rank*part_i/size, + part_i/size) of the 2-D tensor t,
 * concatenated in part order into one [rows, sum(part_i)/size] device tensor. */
static cdf_tensor *read_col_parts(cdf_weights *w, const cdf_tp *tp, const cdf_st_file *f, const cdf_st_tensor *t,
                                  int n_parts, const int64_t *parts, const char *name) {
    const int64_t rows = t->shape[0];
    const size_t esz = cdf_dtype_size(t->dtype);
    int64_t local = 0, max_part = 0;
    for (int i = 0; i < n_parts; i++) {
        local += parts[i] / tp->size;
        if (parts[i] / tp->size > max_part) max_part = parts[i] / tp->size;
    }
    char *out = malloc((size_t)(rows * local) * esz + 1);
    char *tmp = n_parts > 1 ? malloc((size_t)(rows * max_part) * esz + 1) : NULL;
    if (!out || (n_parts > 1 && !tmp)) {
        free(out);
        free(tmp);
        cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory reading columns of '%s'", name);
        return NULL;
    }
    cdf_status s = CDF_OK;
    int64_t off = 0, dst_col = 0;
    for (int i = 0; i < n_parts && s == CDF_OK; i++) {
        const int64_t n = parts[i] / tp->size, col0 = off + tp->rank * n;
        if (n_parts == 1) {
            s = cdf_st_read_cols(f, t, col0, n, out);
        } else {
            s = cdf_st_read_cols(f, t, col0, n, tmp);
            for (int64_t r = 0; s == CDF_OK && r < rows; r++)
                memcpy(out + (size_t)(r * local + dst_col) * esz, tmp + (size_t)(r * n) * esz, (size_t)n * esz);
        }
        off += parts[i];
        dst_col += n;
    }
    cdf_tensor *r = NULL;
    if (s == CDF_OK) {
        int64_t shape[2] = {rows, local};
        r = to_device(w, 2, shape, out, t->dtype, name);
    }
    free(out);
    free(tmp);
    return r;
}

static cdf_status load_impl(cdf_weights *w, const cdf_tp *tp_c, cdf_linear_layer *l, int n_parts, const int64_t *parts,
                            int64_t out, int bias, const char *prefix) {
    cdf_tp *tp = (cdf_tp *)tp_c; /* hit counters only */
    memset(l, 0, sizeof *l);
    int64_t in = 0;
    for (int i = 0; i < n_parts; i++) in += parts[i];
    const int ri = rule_index(tp, prefix);
    if (ri >= 0) tp->hits[ri]++;
    const cdf_tp_style style = ri < 0 ? CDF_TP_REPLICATE : tp->plan[ri].style;
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
    for (int i = 0; style != CDF_TP_COLWISE && i < n_parts; i++)
        if (parts[i] % tp->size)
            return cdf_error(CDF_ERR_UNSUPPORTED, "tensor parallelism over %d ranks: %s.%s has an input part of %lld features, "
                             "not divisible by %d", tp->size, tp->component, prefix, (long long)parts[i], tp->size);

    char name[512];
    const cdf_st_file *f;
    const cdf_st_tensor *t;
    snprintf(name, sizeof name, "%s.weight", prefix);
    CDF_TRY(find_weight(w, name, out, in, &f, &t));
    l->in = in;
    l->out = out;
    if (style == CDF_TP_COLWISE) {
        const int64_t n = out / tp->size;
        l->out = n;
        l->shard = (cdf_linear_shard){.style = style, .rank = tp->rank, .size = tp->size, .n_parts = 1, .parts = {out}};
        l->w = read_rows(w, f, t, tp->rank * n, n, name);
        if (!l->w) return cdf_last_status();
        snprintf(name, sizeof name, "%s.bias", prefix);
        if (bias == 1 || (bias == -1 && cdf_checkpoint_has(cdf_weights_checkpoint(w), name))) {
            const cdf_st_file *bf;
            const cdf_st_tensor *bt;
            cdf_status s = cdf_checkpoint_find(cdf_weights_checkpoint(w), name, &bf, &bt);
            if (s == CDF_OK && (bt->ndim != 1 || bt->shape[0] != out))
                s = cdf_error(CDF_ERR_SHAPE, "weight '%s' in %s must be [%lld]", name, cdf_weights_path(w), (long long)out);
            if (s == CDF_OK && !(l->b = read_rows(w, bf, bt, tp->rank * n, n, name))) s = cdf_last_status();
            if (s != CDF_OK) {
                cdf_linear_free(l);
                return s;
            }
        }
        cdf_layer_index_add(cdf_weights_options(w)->layers, prefix, l, true);
        return CDF_OK;
    }
    /* rowwise / packed: this rank's input columns; the bias stays whole (added once, by rank 0) */
    l->in = in / tp->size;
    l->shard = (cdf_linear_shard){.style = style, .rank = tp->rank, .size = tp->size, .n_parts = n_parts};
    memcpy(l->shard.parts, parts, (size_t)n_parts * sizeof *parts);
    l->w = read_col_parts(w, tp, f, t, n_parts, parts, name);
    if (!l->w) return cdf_last_status();
    int64_t bs[1] = {out};
    if (bias == 1) l->b = cdf_weights_get(w, 1, bs, "%s.bias", prefix);
    else if (bias == -1) l->b = cdf_weights_get_opt(w, 1, bs, "%s.bias", prefix);
    if ((bias == 1 && !l->b) || (bias == -1 && !l->b && cdf_weights_has(w, "%s.bias", prefix))) {
        cdf_status s = cdf_last_status() != CDF_OK ? cdf_last_status() : CDF_ERR_INTERNAL;
        cdf_linear_free(l);
        return s;
    }
    l->tp = tp;
    cdf_layer_index_add(cdf_weights_options(w)->layers, prefix, l, true);
    return CDF_OK;
}

/* A failed shard load says which slice of which layer this rank was reading. */
static void shard_error_context(const cdf_tp *tp, const char *prefix) {
    const cdf_tp_style st = cdf_tp_style_for(tp, prefix);
    if (st != CDF_TP_REPLICATE && tp->size > 1)
        cdf_error_prefix("%s shard of '%s' (rank %d of %d): ", style_name(st), prefix, tp->rank, tp->size);
}

cdf_status cdf_tp_linear_load(cdf_weights *w, const cdf_tp *tp, cdf_linear_layer *l, int64_t in, int64_t out, int bias,
                              const char *fmt, ...) {
    char prefix[480];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    const int64_t parts[1] = {in};
    cdf_status s = load_impl(w, tp, l, 1, parts, out, bias, prefix);
    if (s != CDF_OK) shard_error_context(tp, prefix);
    return s;
}

cdf_status cdf_tp_linear_load_packed(cdf_weights *w, const cdf_tp *tp, cdf_linear_layer *l, int n_parts,
                                     const int64_t *parts, int64_t out, int bias, const char *fmt, ...) {
    char prefix[480];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    if (n_parts < 1 || n_parts > MAX_PARTS || !parts)
        return cdf_error(CDF_ERR_INVALID_ARG, "%s: %d input parts (1..%d)", prefix, n_parts, MAX_PARTS);
    for (int i = 0; i < n_parts; i++)
        if (parts[i] < 1) return cdf_error(CDF_ERR_INVALID_ARG, "%s: input part %d has %lld features", prefix, i, (long long)parts[i]);
    cdf_status s = load_impl(w, tp, l, n_parts, parts, out, bias, prefix);
    if (s != CDF_OK) shard_error_context(tp, prefix);
    return s;
}

/* ---- packed outputs (PackedColwiseParallel) ------------------------------------------------------- */
/* For every part i: rows [off_i + rank*part_i/size, + part_i/size) of the 1-D or 2-D tensor t,
 * stacked in part order into one device tensor of sum(part_i)/size rows. Rows are contiguous in
 * the file, so each part is one counted slice read straight into its place. */
static cdf_tensor *read_row_parts(cdf_weights *w, const cdf_tp *tp, const cdf_st_file *f, const cdf_st_tensor *t,
                                  int n_parts, const int64_t *parts, const char *name) {
    const int64_t width = t->ndim == 2 ? t->shape[1] : 1;
    const size_t esz = cdf_dtype_size(t->dtype);
    int64_t local = 0;
    for (int i = 0; i < n_parts; i++) local += parts[i] / tp->size;
    char *buf = malloc((size_t)(local * width) * esz + 1);
    if (!buf) {
        cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory reading rows of '%s' (%lld x %lld)", name, (long long)local,
                  (long long)width);
        return NULL;
    }
    cdf_status s = CDF_OK;
    int64_t off = 0, dst_row = 0;
    for (int i = 0; i < n_parts && s == CDF_OK; i++) {
        const int64_t n = parts[i] / tp->size;
        s = cdf_st_read_rows(f, t, off + tp->rank * n, n, buf + (size_t)(dst_row * width) * esz);
        off += parts[i];
        dst_row += n;
    }
    cdf_tensor *r = NULL;
    if (s == CDF_OK) {
        int64_t shape[2] = {local, width};
        r = to_device(w, t->ndim, shape, buf, t->dtype, name);
    }
    free(buf);
    return r;
}

static cdf_status load_packed_out_impl(cdf_weights *w, const cdf_tp *tp_c, cdf_linear_layer *l, int64_t in, int n_parts,
                                       const int64_t *parts, int bias, const char *prefix) {
    cdf_tp *tp = (cdf_tp *)tp_c; /* hit counters only */
    memset(l, 0, sizeof *l);
    int64_t out = 0;
    for (int i = 0; i < n_parts; i++) out += parts[i];
    const int ri = rule_index(tp, prefix);
    if (ri >= 0) tp->hits[ri]++;
    const cdf_tp_style style = ri < 0 ? CDF_TP_REPLICATE : tp->plan[ri].style;
    if (style == CDF_TP_REPLICATE || tp->size == 1) return cdf_linear_load(w, l, in, out, bias, "%s", prefix);
    if (style != CDF_TP_PACKED_COLWISE)
        return cdf_error(CDF_ERR_INTERNAL, "tensor-parallel plan of %s: %s is '%s' but its output is packed from %d parts "
                         "(use packed_colwise)", tp->model, prefix, style_name(style), n_parts);
    for (int i = 0; i < n_parts; i++)
        if (parts[i] % tp->size)
            return cdf_error(CDF_ERR_UNSUPPORTED, "tensor parallelism over %d ranks: %s.%s has an output part of %lld "
                             "features, not divisible by %d", tp->size, tp->component, prefix, (long long)parts[i], tp->size);
    char name[512];
    const cdf_st_file *f;
    const cdf_st_tensor *t;
    snprintf(name, sizeof name, "%s.weight", prefix);
    CDF_TRY(find_weight(w, name, out, in, &f, &t));
    l->in = in;
    l->out = out / tp->size;
    l->shard = (cdf_linear_shard){.style = style, .rank = tp->rank, .size = tp->size, .n_parts = n_parts};
    memcpy(l->shard.parts, parts, (size_t)n_parts * sizeof *parts);
    if (!(l->w = read_row_parts(w, tp, f, t, n_parts, parts, name))) return cdf_last_status();
    snprintf(name, sizeof name, "%s.bias", prefix);
    if (bias == 1 || (bias == -1 && cdf_checkpoint_has(cdf_weights_checkpoint(w), name))) {
        const cdf_st_file *bf;
        const cdf_st_tensor *bt;
        cdf_status s = cdf_checkpoint_find(cdf_weights_checkpoint(w), name, &bf, &bt);
        if (s == CDF_OK && (bt->ndim != 1 || bt->shape[0] != out))
            s = cdf_error(CDF_ERR_SHAPE, "weight '%s' in %s must be [%lld]", name, cdf_weights_path(w), (long long)out);
        if (s == CDF_OK && !(l->b = read_row_parts(w, tp, bf, bt, n_parts, parts, name))) s = cdf_last_status();
        if (s != CDF_OK) {
            cdf_linear_free(l);
            return s;
        }
    }
    cdf_layer_index_add(cdf_weights_options(w)->layers, prefix, l, true);
    return CDF_OK;
}

cdf_status cdf_tp_linear_load_packed_out(cdf_weights *w, const cdf_tp *tp, cdf_linear_layer *l, int64_t in, int n_parts,
                                         const int64_t *out_parts, int bias, const char *fmt, ...) {
    char prefix[480];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    if (n_parts < 1 || n_parts > MAX_PARTS || !out_parts)
        return cdf_error(CDF_ERR_INVALID_ARG, "%s: %d output parts (1..%d)", prefix, n_parts, MAX_PARTS);
    for (int i = 0; i < n_parts; i++)
        if (out_parts[i] < 1)
            return cdf_error(CDF_ERR_INVALID_ARG, "%s: output part %d has %lld features", prefix, i, (long long)out_parts[i]);
    cdf_status s = load_packed_out_impl(w, tp, l, in, n_parts, out_parts, bias, prefix);
    if (s != CDF_OK) shard_error_context(tp, prefix);
    return s;
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
        const cdf_st_file *f;
        const cdf_st_tensor *st;
        snprintf(name, sizeof name, "%s.weight", prefix);
        CDF_TRY(find_weight(w, name, cdf_linear_full_out(l), cdf_linear_full_in(l), &f, &st));
        /* the readers need only the rank and the size */
        const cdf_tp tp = {.rank = s->rank, .size = s->size};
        t.w = splits_out(s) ? read_row_parts(w, &tp, f, st, s->n_parts, s->parts, name)
                            : read_col_parts(w, &tp, f, st, s->n_parts, s->parts, name);
        if (!t.w) return cdf_last_status();
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
    cdf_tensor *y = cdf_linear(x, l->w, tp->rank == 0 ? l->b : NULL);
    /* run-time LoRA: this rank holds the columns of A its inputs are and all of B, so
     * B (s * A_r x_r) is its partial of B (s * A x): added before the all-reduce, the sum holds the
     * adapter once (as it holds the bias once), and no second collective is needed */
    if (y && l->lora) {
        cdf_tensor *d = cdf_lora_delta_fwd(l->lora, x);
        y = d ? cdf_add(y, d) : NULL;
    }
    cdf_tensor *r = y ? cdf_all_reduce_sum(y, tp->pg) : NULL;
    if (!r && y) cdf_error_prefix("%s: ", tp->component);
    cdf_scope_pop(r ? &r : NULL, r ? 1 : 0);
    return r;
}
