/* The tensor API's ops: argument checks and shape inference at the call, then one op node per
 * kernel handed to exec/ (submit_op: submit, release the op's temporaries, free the output on
 * failure). Only the returned tensor is recorded in the caller's scope. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdiffusers/io.h"
#include "core/error_internal.h"
#include "exec/exec.h"
#include "tensor/tensor_impl.h"

#define BEGIN() cdf_scope_suppress(1)
static cdf_tensor *end_op(cdf_tensor *r) {
    cdf_scope_suppress(-1);
    cdf_scope_record(r);
    return r;
}
#define RETURN(r) return end_op(r)
#define FAIL(...)                                                                                                  \
    do {                                                                                                           \
        cdf_error(__VA_ARGS__);                                                                                    \
        RETURN(NULL);                                                                                              \
    } while (0)
#define REL(t) cdf_tensor_release(t)

static const char *desc(const cdf_tensor *t) {
    static _Thread_local char buf[4][128];
    static _Thread_local int slot;
    char *b = buf[slot++ & 3];
    return cdf_tensor_describe(t, b, 128);
}

/* A second handle on the same view (ops always return distinct objects). */
static cdf_tensor *clone_view(cdf_tensor *t) {
    return cdf_tensor_view_of(t->storage, t->offset, t->dtype, t->ndim, t->shape, t->strides);
}

static cdf_device *dev_of(cdf_tensor *t) { return t->storage->dev; }

/* Build a node over srcs -> dst and submit it. Takes no ownership of the arguments. */
static cdf_status submit(cdf_node *n, cdf_tensor *dst, cdf_tensor *s0, cdf_tensor *s1, cdf_tensor *s2, cdf_tensor *s3) {
    cdf_tensor *srcs[4] = {s0, s1, s2, s3};
    int last = -1;
    for (int i = 0; i < 4; i++)
        if (srcs[i]) last = i;
    for (int i = 0; i <= last; i++) {
        if (srcs[i]) cdf_node_add_src(n, srcs[i]);
        else n->src[n->n_src++] = NULL;
    }
    n->dst = cdf_tensor_retain(dst);
    return cdf_exec_submit(n);
}

/* The tail of an op: submits n over the sources -> out (n is NULL when a step before failed:
 * an operand, the output or the node), drops the op's references to the sources (temporaries
 * made for the node, which holds its own) and returns out; NULL, with out released, when
 * anything failed (the message is the failing step's). */
static cdf_tensor *submit_op(cdf_node *n, cdf_tensor *out, cdf_tensor *s0, cdf_tensor *s1, cdf_tensor *s2,
                             cdf_tensor *s3) {
    const cdf_status s = n ? submit(n, out, s0, s1, s2, s3) : CDF_ERR_OUT_OF_MEMORY;
    REL(s0);
    REL(s1);
    REL(s2);
    REL(s3);
    if (s != CDF_OK) {
        REL(out);
        return NULL;
    }
    return out;
}

static bool is_float(cdf_dtype dt) { return dt == CDF_F32 || dt == CDF_BF16 || dt == CDF_F16; }

static cdf_dtype promote(cdf_dtype a, cdf_dtype b) {
    if (a == b) return is_float(a) ? a : CDF_F32;
    return CDF_F32;
}

/* ---- views ------------------------------------------------------------------------------- */

cdf_tensor *cdf_contiguous(cdf_tensor *t) {
    if (!t) return NULL;
    BEGIN();
    if (cdf_tensor_is_contiguous(t)) RETURN(clone_view(t));
    cdf_tensor *out = cdf_tensor_alloc(dev_of(t), t->dtype, t->ndim, t->shape);
    cdf_node *n = out ? cdf_node_new(CDF_OP_COPY) : NULL;
    RETURN(submit_op(n, out, cdf_tensor_retain(t), NULL, NULL, NULL));
}

cdf_tensor *cdf_cast(cdf_tensor *t, cdf_dtype dt) {
    if (!t) return NULL;
    BEGIN();
    if (!cdf_dtype_size(dt)) FAIL(CDF_ERR_DTYPE, "cast: invalid dtype %d", (int)dt);
    if (dt == t->dtype) RETURN(clone_view(t));
    cdf_tensor *out = cdf_tensor_alloc(dev_of(t), dt, t->ndim, t->shape);
    cdf_node *n = out ? cdf_node_new(CDF_OP_COPY) : NULL;
    RETURN(submit_op(n, out, cdf_tensor_retain(t), NULL, NULL, NULL));
}

/* Can `t` be viewed with `shape` without copying? Computes strides if so (torch's algorithm:
 * walk chunks of dims that are contiguous with each other). */
static bool view_strides(const cdf_tensor *t, int ndim, const int64_t *shape, int64_t *out) {
    int64_t numel = cdf_tensor_numel(t);
    if (numel == 0) {
        cdf_contiguous_strides(ndim, shape, out);
        return true;
    }
    int view_d = ndim - 1;
    int64_t chunk_base_stride = t->ndim ? t->strides[t->ndim - 1] : 1;
    int64_t tensor_numel = 1, view_numel = 1;
    for (int tensor_d = t->ndim - 1; tensor_d >= 0; tensor_d--) {
        tensor_numel *= t->shape[tensor_d];
        if (tensor_d == 0 || (t->shape[tensor_d - 1] != 1 &&
                              t->strides[tensor_d - 1] != tensor_numel * chunk_base_stride)) {
            while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
                out[view_d] = view_numel * chunk_base_stride;
                view_numel *= shape[view_d];
                view_d--;
            }
            if (view_numel != tensor_numel) return false;
            if (tensor_d > 0) {
                chunk_base_stride = t->strides[tensor_d - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    return view_d == -1;
}

cdf_tensor *cdf_reshape(cdf_tensor *t, int ndim, const int64_t *shape_in) {
    if (!t) return NULL;
    BEGIN();
    if (ndim < 0 || ndim > CDF_MAX_DIMS) FAIL(CDF_ERR_INVALID_ARG, "reshape: %d dims", ndim);
    int64_t shape[CDF_MAX_DIMS];
    int infer = -1;
    int64_t known = 1;
    for (int i = 0; i < ndim; i++) {
        shape[i] = shape_in[i];
        if (shape[i] == -1) {
            if (infer >= 0) FAIL(CDF_ERR_SHAPE, "reshape: more than one -1 in the target shape");
            infer = i;
        } else if (shape[i] < 0) {
            FAIL(CDF_ERR_SHAPE, "reshape: negative dim %lld", (long long)shape[i]);
        } else {
            known *= shape[i];
        }
    }
    int64_t numel = cdf_tensor_numel(t);
    if (infer >= 0) {
        if (known == 0 || numel % known) FAIL(CDF_ERR_SHAPE, "reshape: cannot infer -1 for %s", desc(t));
        shape[infer] = numel / known;
        known *= shape[infer];
    }
    if (known != numel) FAIL(CDF_ERR_SHAPE, "reshape: %s has %lld elements, target has %lld", desc(t), (long long)numel, (long long)known);
    int64_t strides[CDF_MAX_DIMS];
    if (view_strides(t, ndim, shape, strides)) RETURN(cdf_tensor_view_of(t->storage, t->offset, t->dtype, ndim, shape, strides));
    cdf_tensor *c = cdf_contiguous(t);
    if (!c) RETURN(NULL);
    cdf_contiguous_strides(ndim, shape, strides);
    cdf_tensor *r = cdf_tensor_view_of(c->storage, c->offset, c->dtype, ndim, shape, strides);
    REL(c);
    RETURN(r);
}

cdf_tensor *cdf_permute(cdf_tensor *t, const int *dims) {
    if (!t) return NULL;
    BEGIN();
    int64_t shape[CDF_MAX_DIMS], strides[CDF_MAX_DIMS];
    bool seen[CDF_MAX_DIMS] = {0};
    for (int i = 0; i < t->ndim; i++) {
        int d = cdf_norm_dim(dims[i], t->ndim);
        if (d < 0 || seen[d]) FAIL(CDF_ERR_INVALID_ARG, "permute: invalid permutation for %s", desc(t));
        seen[d] = true;
        shape[i] = t->shape[d];
        strides[i] = t->strides[d];
    }
    RETURN(cdf_tensor_view_of(t->storage, t->offset, t->dtype, t->ndim, shape, strides));
}

cdf_tensor *cdf_transpose(cdf_tensor *t, int d0, int d1) {
    if (!t) return NULL;
    int a = cdf_norm_dim(d0, t->ndim), b = cdf_norm_dim(d1, t->ndim);
    if (a < 0 || b < 0) {
        cdf_error(CDF_ERR_INVALID_ARG, "transpose: dims %d, %d out of range for %s", d0, d1, desc(t));
        return NULL;
    }
    int perm[CDF_MAX_DIMS];
    for (int i = 0; i < t->ndim; i++) perm[i] = i;
    perm[a] = b;
    perm[b] = a;
    return cdf_permute(t, perm);
}

cdf_tensor *cdf_slice(cdf_tensor *t, int dim, int64_t start, int64_t end, int64_t step) {
    if (!t) return NULL;
    BEGIN();
    int d = cdf_norm_dim(dim, t->ndim);
    if (d < 0) FAIL(CDF_ERR_INVALID_ARG, "slice: dim %d out of range for %s", dim, desc(t));
    if (step <= 0) FAIL(CDF_ERR_INVALID_ARG, "slice: step must be positive (got %lld)", (long long)step);
    int64_t n = t->shape[d];
    if (start < 0) start += n;
    if (end < 0) end += n;
    if (start < 0) start = 0;
    if (end > n) end = n;
    if (start > n) start = n;
    if (end < start) end = start;
    int64_t shape[CDF_MAX_DIMS], strides[CDF_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    memcpy(strides, t->strides, sizeof strides);
    shape[d] = (end - start + step - 1) / step;
    strides[d] = t->strides[d] * step;
    RETURN(cdf_tensor_view_of(t->storage, t->offset + start * t->strides[d], t->dtype, t->ndim, shape, strides));
}

cdf_tensor *cdf_narrow(cdf_tensor *t, int dim, int64_t start, int64_t length) {
    if (!t) return NULL;
    int d = cdf_norm_dim(dim, t->ndim);
    if (d < 0 || start < 0 || length < 0 || start + length > t->shape[d]) {
        cdf_error(CDF_ERR_INVALID_ARG, "narrow: [%lld, %lld) out of range on dim %d of %s", (long long)start,
                  (long long)(start + length), dim, desc(t));
        return NULL;
    }
    return cdf_slice(t, d, start, start + length, 1);
}

cdf_tensor *cdf_expand(cdf_tensor *t, int ndim, const int64_t *shape_in) {
    if (!t) return NULL;
    BEGIN();
    if (ndim < t->ndim || ndim > CDF_MAX_DIMS) FAIL(CDF_ERR_SHAPE, "expand: %d dims for %s", ndim, desc(t));
    int64_t shape[CDF_MAX_DIMS], strides[CDF_MAX_DIMS];
    int lead = ndim - t->ndim;
    for (int i = 0; i < ndim; i++) {
        int64_t want = shape_in[i];
        if (i < lead) {
            if (want < 0) FAIL(CDF_ERR_SHAPE, "expand: -1 not allowed for a new leading dim");
            shape[i] = want;
            strides[i] = 0;
            continue;
        }
        int64_t have = t->shape[i - lead];
        if (want == -1 || want == have) {
            shape[i] = have;
            strides[i] = t->strides[i - lead];
        } else if (have == 1 && want >= 0) {
            shape[i] = want;
            strides[i] = 0;
        } else {
            FAIL(CDF_ERR_SHAPE, "expand: dim %d of %s has size %lld, cannot expand to %lld", i - lead, desc(t),
                 (long long)have, (long long)want);
        }
    }
    RETURN(cdf_tensor_view_of(t->storage, t->offset, t->dtype, ndim, shape, strides));
}

cdf_tensor *cdf_unsqueeze(cdf_tensor *t, int dim) {
    if (!t) return NULL;
    BEGIN();
    int d = dim < 0 ? dim + t->ndim + 1 : dim;
    if (d < 0 || d > t->ndim || t->ndim >= CDF_MAX_DIMS) FAIL(CDF_ERR_INVALID_ARG, "unsqueeze: dim %d for %s", dim, desc(t));
    int64_t shape[CDF_MAX_DIMS], strides[CDF_MAX_DIMS];
    for (int i = 0, j = 0; i <= t->ndim; i++) {
        if (i == d) {
            shape[i] = 1;
            strides[i] = (j < t->ndim) ? t->strides[j] * t->shape[j] : 1;
        } else {
            shape[i] = t->shape[j];
            strides[i] = t->strides[j];
            j++;
        }
    }
    RETURN(cdf_tensor_view_of(t->storage, t->offset, t->dtype, t->ndim + 1, shape, strides));
}

cdf_tensor *cdf_squeeze(cdf_tensor *t, int dim) {
    if (!t) return NULL;
    BEGIN();
    int d = cdf_norm_dim(dim, t->ndim);
    if (d < 0 || t->shape[d] != 1) FAIL(CDF_ERR_INVALID_ARG, "squeeze: dim %d of %s is not 1", dim, desc(t));
    int64_t shape[CDF_MAX_DIMS], strides[CDF_MAX_DIMS];
    for (int i = 0, j = 0; i < t->ndim; i++) {
        if (i == d) continue;
        shape[j] = t->shape[i];
        strides[j] = t->strides[i];
        j++;
    }
    RETURN(cdf_tensor_view_of(t->storage, t->offset, t->dtype, t->ndim - 1, shape, strides));
}

cdf_status cdf_chunk(cdf_tensor *t, int n, int dim, cdf_tensor **out) {
    if (!t) return cdf_last_status() ? cdf_last_status() : cdf_error(CDF_ERR_INVALID_ARG, "chunk: NULL tensor");
    int d = cdf_norm_dim(dim, t->ndim);
    if (d < 0 || n <= 0 || t->shape[d] % n)
        return cdf_error(CDF_ERR_SHAPE, "chunk: cannot split dim %d of %s into %d equal chunks", dim, desc(t), n);
    int64_t len = t->shape[d] / n;
    for (int i = 0; i < n; i++) {
        out[i] = cdf_narrow(t, d, i * len, len);
        if (!out[i]) return cdf_last_status();
    }
    return CDF_OK;
}

/* ---- copies ----------------------------------------------------------------------------- */

cdf_tensor *cdf_cat(cdf_tensor *const *ts, int n, int dim) {
    if (n <= 0) {
        cdf_error(CDF_ERR_INVALID_ARG, "cat: no tensors");
        return NULL;
    }
    for (int i = 0; i < n; i++)
        if (!ts[i]) return NULL;
    BEGIN();
    const cdf_tensor *t0 = ts[0];
    int d = cdf_norm_dim(dim, t0->ndim);
    if (d < 0) FAIL(CDF_ERR_INVALID_ARG, "cat: dim %d out of range for %s", dim, desc(t0));
    int64_t shape[CDF_MAX_DIMS];
    memcpy(shape, t0->shape, sizeof shape);
    shape[d] = 0;
    cdf_dtype dt = t0->dtype;
    for (int i = 0; i < n; i++) {
        if (ts[i]->ndim != t0->ndim) FAIL(CDF_ERR_SHAPE, "cat: %s and %s differ in rank", desc(t0), desc(ts[i]));
        for (int k = 0; k < t0->ndim; k++)
            if (k != d && ts[i]->shape[k] != t0->shape[k])
                FAIL(CDF_ERR_SHAPE, "cat along dim %d: %s and %s differ in dim %d", d, desc(t0), desc(ts[i]), k);
        if (ts[i]->dtype != dt) dt = promote(dt, ts[i]->dtype);
        if (ts[i]->storage->dev != t0->storage->dev) FAIL(CDF_ERR_DEVICE, "cat: tensors on different devices");
        shape[d] += ts[i]->shape[d];
    }
    cdf_tensor *out = cdf_tensor_alloc(dev_of(ts[0]), dt, t0->ndim, shape);
    if (!out) RETURN(NULL);
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        int64_t len = ts[i]->shape[d];
        if (len == 0) continue;
        cdf_tensor *view = cdf_narrow(out, d, off, len);
        cdf_node *nd = view ? cdf_node_new(CDF_OP_COPY) : NULL;
        cdf_status s = nd ? submit(nd, view, ts[i], NULL, NULL, NULL) : cdf_last_status();
        REL(view);
        if (s != CDF_OK) {
            REL(out);
            RETURN(NULL);
        }
        off += len;
    }
    RETURN(out);
}

cdf_tensor *cdf_pad(cdf_tensor *t, int n_pairs, const int64_t *pads, double value) {
    if (!t) return NULL;
    BEGIN();
    if (n_pairs < 0 || n_pairs > t->ndim) FAIL(CDF_ERR_INVALID_ARG, "pad: %d pairs for %s", n_pairs, desc(t));
    int64_t shape[CDF_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    for (int i = 0; i < n_pairs; i++) {
        int d = t->ndim - 1 - i;
        if (pads[2 * i] < 0 || pads[2 * i + 1] < 0) FAIL(CDF_ERR_INVALID_ARG, "pad: negative padding is not supported");
        shape[d] += pads[2 * i] + pads[2 * i + 1];
    }
    cdf_tensor *out = cdf_tensor_full(dev_of(t), t->dtype, t->ndim, shape, value);
    if (!out) RETURN(NULL);
    cdf_tensor *view = clone_view(out);
    for (int i = 0; i < n_pairs && view; i++) {
        int d = t->ndim - 1 - i;
        cdf_tensor *v2 = cdf_narrow(view, d, pads[2 * i], t->shape[d]);
        REL(view);
        view = v2;
    }
    cdf_node *nd = view ? cdf_node_new(CDF_OP_COPY) : NULL;
    cdf_status s = nd ? submit(nd, view, t, NULL, NULL, NULL) : cdf_last_status();
    REL(view);
    if (s != CDF_OK) {
        REL(out);
        RETURN(NULL);
    }
    RETURN(out);
}

cdf_tensor *cdf_embedding(cdf_tensor *table, cdf_tensor *ids) {
    if (!table || !ids) return NULL;
    BEGIN();
    if (table->ndim != 2) FAIL(CDF_ERR_SHAPE, "embedding: table must be 2-D, got %s", desc(table));
    if (ids->dtype != CDF_I64 && ids->dtype != CDF_I32) FAIL(CDF_ERR_DTYPE, "embedding: ids must be i64/i32, got %s", desc(ids));
    if (ids->ndim >= CDF_MAX_DIMS) FAIL(CDF_ERR_SHAPE, "embedding: ids have too many dims");
    int64_t shape[CDF_MAX_DIMS];
    memcpy(shape, ids->shape, ids->ndim * sizeof *shape);
    shape[ids->ndim] = table->shape[1];
    cdf_tensor *tc = cdf_contiguous(table), *ic = cdf_contiguous(ids);
    cdf_tensor *out = (tc && ic) ? cdf_tensor_alloc(dev_of(table), table->dtype, ids->ndim + 1, shape) : NULL;
    cdf_node *nd = out ? cdf_node_new(CDF_OP_EMBEDDING) : NULL;
    RETURN(submit_op(nd, out, tc, ic, NULL, NULL));
}

/* ---- elementwise --------------------------------------------------------------------------- */

static cdf_tensor *unary(cdf_tensor *a, cdf_unary_op op, float p0, float p1) {
    if (!a) return NULL;
    BEGIN();
    cdf_dtype dt = is_float(a->dtype) ? a->dtype : CDF_F32;
    cdf_tensor *c = is_float(a->dtype) ? cdf_contiguous(a) : cdf_cast(a, CDF_F32); /* ints compute as f32 */
    cdf_tensor *out = c ? cdf_tensor_alloc(dev_of(a), dt, a->ndim, a->shape) : NULL;
    cdf_node *n = out ? cdf_node_new(CDF_OP_UNARY) : NULL;
    if (n) {
        n->p.unary.op = op;
        n->p.unary.p0 = p0;
        n->p.unary.p1 = p1;
    }
    RETURN(submit_op(n, out, c, NULL, NULL, NULL));
}

cdf_tensor *cdf_scale(cdf_tensor *a, float s) { return unary(a, CDF_UN_SCALE, s, 0); }
cdf_tensor *cdf_add_scalar(cdf_tensor *a, float s) { return unary(a, CDF_UN_ADD_SCALAR, s, 0); }
cdf_tensor *cdf_affine(cdf_tensor *a, float mul, float add) { return unary(a, CDF_UN_AFFINE, mul, add); }
cdf_tensor *cdf_clamp(cdf_tensor *a, float lo, float hi) { return unary(a, CDF_UN_CLAMP, lo, hi); }
cdf_tensor *cdf_neg(cdf_tensor *a) { return unary(a, CDF_UN_NEG, 0, 0); }
cdf_tensor *cdf_exp(cdf_tensor *a) { return unary(a, CDF_UN_EXP, 0, 0); }
cdf_tensor *cdf_log(cdf_tensor *a) { return unary(a, CDF_UN_LOG, 0, 0); }
cdf_tensor *cdf_sqrt(cdf_tensor *a) { return unary(a, CDF_UN_SQRT, 0, 0); }
cdf_tensor *cdf_rsqrt(cdf_tensor *a) { return unary(a, CDF_UN_RSQRT, 0, 0); }
cdf_tensor *cdf_sigmoid(cdf_tensor *a) { return unary(a, CDF_UN_SIGMOID, 0, 0); }
cdf_tensor *cdf_tanh(cdf_tensor *a) { return unary(a, CDF_UN_TANH, 0, 0); }
cdf_tensor *cdf_silu(cdf_tensor *a) { return unary(a, CDF_UN_SILU, 0, 0); }
cdf_tensor *cdf_relu(cdf_tensor *a) { return unary(a, CDF_UN_RELU, 0, 0); }
cdf_tensor *cdf_gelu(cdf_tensor *a, cdf_gelu_approx approx) {
    return unary(a, approx == CDF_GELU_TANH ? CDF_UN_GELU_TANH : CDF_UN_GELU_ERF, 0, 0);
}
cdf_tensor *cdf_quick_gelu(cdf_tensor *a) { return unary(a, CDF_UN_QUICK_GELU, 0, 0); }

/* Broadcast shapes like torch; fills out shape and per-operand strides (0 on broadcast dims). */
static cdf_status broadcast2(const cdf_tensor *a, const cdf_tensor *b, int *ndim, int64_t *shape, int64_t *sa,
                             int64_t *sb, const char *who) {
    int nd = a->ndim > b->ndim ? a->ndim : b->ndim;
    for (int i = 0; i < nd; i++) {
        int ia = i - (nd - a->ndim), ib = i - (nd - b->ndim);
        int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
        if (da != db && da != 1 && db != 1)
            return cdf_error(CDF_ERR_SHAPE, "%s: shapes %s and %s do not broadcast (dim %d: %lld vs %lld)", who,
                             desc(a), desc(b), i, (long long)da, (long long)db);
        shape[i] = da == 1 ? db : da;
        sa[i] = (ia >= 0 && da != 1) ? a->strides[ia] : 0;
        sb[i] = (ib >= 0 && db != 1) ? b->strides[ib] : 0;
    }
    *ndim = nd;
    return CDF_OK;
}

static cdf_tensor *binary(cdf_tensor *a, cdf_tensor *b, cdf_binary_op op, const char *who) {
    if (!a || !b) return NULL;
    if (!is_float(a->dtype) || !is_float(b->dtype)) {
        /* integer operands (e.g. position ids) are promoted to f32 here, as the kernels only
         * compute on floats: torch would promote int64 + float32 to float32 as well */
        BEGIN();
        cdf_tensor *fa = is_float(a->dtype) ? cdf_tensor_retain(a) : cdf_cast(a, CDF_F32);
        cdf_tensor *fb = is_float(b->dtype) ? cdf_tensor_retain(b) : cdf_cast(b, CDF_F32);
        cdf_tensor *r = (fa && fb) ? binary(fa, fb, op, who) : NULL;
        REL(fa);
        REL(fb);
        RETURN(r);
    }
    BEGIN();
    int nd = 0; /* set by broadcast2 on success (GCC cannot see it through RETURN) */
    int64_t shape[CDF_MAX_DIMS], sa[CDF_MAX_DIMS], sb[CDF_MAX_DIMS];
    if (broadcast2(a, b, &nd, shape, sa, sb, who) != CDF_OK) RETURN(NULL);
    cdf_tensor *out = cdf_tensor_alloc(dev_of(a), promote(a->dtype, b->dtype), nd, shape);
    if (!out) RETURN(NULL);
    /* the node's sources are views with the broadcast strides, so the kernel sees them as is */
    cdf_tensor *va = cdf_tensor_view_of(a->storage, a->offset, a->dtype, nd, shape, sa);
    cdf_tensor *vb = cdf_tensor_view_of(b->storage, b->offset, b->dtype, nd, shape, sb);
    cdf_node *n = (va && vb) ? cdf_node_new(CDF_OP_BINARY) : NULL;
    if (n) n->p.binary.op = op;
    RETURN(submit_op(n, out, va, vb, NULL, NULL));
}

cdf_tensor *cdf_add(cdf_tensor *a, cdf_tensor *b) { return binary(a, b, CDF_BIN_ADD, "add"); }
cdf_tensor *cdf_sub(cdf_tensor *a, cdf_tensor *b) { return binary(a, b, CDF_BIN_SUB, "sub"); }
cdf_tensor *cdf_mul(cdf_tensor *a, cdf_tensor *b) { return binary(a, b, CDF_BIN_MUL, "mul"); }
cdf_tensor *cdf_div(cdf_tensor *a, cdf_tensor *b) { return binary(a, b, CDF_BIN_DIV, "div"); }
cdf_tensor *cdf_maximum(cdf_tensor *a, cdf_tensor *b) { return binary(a, b, CDF_BIN_MAX, "maximum"); }

/* ---- matmul ---------------------------------------------------------------------------- */

/* out_dt: the product's dtype, or NULL for the operands' promoted dtype */
static cdf_tensor *matmul_impl(cdf_tensor *a, cdf_tensor *b, cdf_tensor *bias, const cdf_dtype *out_dt, const char *who) {
    BEGIN();
    if (a->ndim < 2 || b->ndim < 2) FAIL(CDF_ERR_SHAPE, "%s: operands must be at least 2-D: %s, %s", who, desc(a), desc(b));
    int64_t M = a->shape[a->ndim - 2], K = a->shape[a->ndim - 1], N = b->shape[b->ndim - 1];
    if (b->shape[b->ndim - 2] != K) FAIL(CDF_ERR_SHAPE, "%s: inner dims differ: %s @ %s", who, desc(a), desc(b));
    if (bias && (bias->ndim != 1 || bias->shape[0] != N)) FAIL(CDF_ERR_SHAPE, "%s: bias %s does not match %lld outputs", who, desc(bias), (long long)N);
    /* broadcast batch dims */
    int na = a->ndim - 2, nbd = b->ndim - 2, nd = na > nbd ? na : nbd;
    int64_t bshape[CDF_MAX_DIMS];
    for (int i = 0; i < nd; i++) {
        int ia = i - (nd - na), ib = i - (nd - nbd);
        int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
        if (da != db && da != 1 && db != 1) FAIL(CDF_ERR_SHAPE, "%s: batch dims do not broadcast: %s @ %s", who, desc(a), desc(b));
        bshape[i] = da == 1 ? db : da;
    }
    int64_t full_a[CDF_MAX_DIMS], full_b[CDF_MAX_DIMS];
    memcpy(full_a, bshape, nd * sizeof *bshape);
    memcpy(full_b, bshape, nd * sizeof *bshape);
    full_a[nd] = M; full_a[nd + 1] = K;
    full_b[nd] = K; full_b[nd + 1] = N;
    cdf_tensor *ea = cdf_expand(a, nd + 2, full_a), *eb = cdf_expand(b, nd + 2, full_b);
    cdf_tensor *bc = bias ? cdf_contiguous(bias) : NULL;
    if (!ea || !eb || (bias && !bc)) {
        REL(ea); REL(eb); REL(bc);
        RETURN(NULL);
    }
    /* operands in a matrix layout (graph/node.h), copied to contiguous otherwise */
    cdf_matrix_layout lay;
    if (!cdf_matmul_operand_layout(ea->ndim, ea->shape, ea->strides, &lay)) {
        cdf_tensor *c = cdf_contiguous(ea);
        REL(ea);
        ea = c;
        if (!ea) { REL(eb); REL(bc); RETURN(NULL); }
    }
    if (!cdf_matmul_operand_layout(eb->ndim, eb->shape, eb->strides, &lay)) {
        cdf_tensor *c = cdf_contiguous(eb);
        REL(eb);
        eb = c;
        if (!eb) { REL(ea); REL(bc); RETURN(NULL); }
    }
    int64_t oshape[CDF_MAX_DIMS];
    memcpy(oshape, bshape, nd * sizeof *bshape);
    oshape[nd] = M;
    oshape[nd + 1] = N;
    const cdf_dtype odt = out_dt ? *out_dt : promote(a->dtype, b->dtype);
    cdf_tensor *out = cdf_tensor_alloc(dev_of(a), odt, nd + 2, oshape);
    cdf_node *n = out ? cdf_node_new(CDF_OP_MATMUL) : NULL;
    if (n) n->p.matmul.alpha = 1.0f;
    RETURN(submit_op(n, out, ea, eb, bc, NULL));
}

cdf_tensor *cdf_matmul(cdf_tensor *a, cdf_tensor *b) {
    if (!a || !b) return NULL;
    return matmul_impl(a, b, NULL, NULL, "matmul");
}

/* y2 [rows, out] of a linear layer back in x's leading dims: [..., out]. Takes y2's reference. */
static cdf_tensor *linear_unflatten(cdf_tensor *x, cdf_tensor *y2, int64_t out) {
    int64_t oshape[CDF_MAX_DIMS];
    memcpy(oshape, x->shape, x->ndim * sizeof *oshape);
    oshape[x->ndim - 1] = out;
    cdf_tensor *y = cdf_reshape(y2, x->ndim, oshape);
    REL(y2);
    return y;
}

static cdf_tensor *linear_impl(cdf_tensor *x, cdf_tensor *w, cdf_tensor *b, const cdf_dtype *out_dt) {
    if (!x || !w) return NULL;
    BEGIN();
    if (out_dt && !is_float(*out_dt)) FAIL(CDF_ERR_DTYPE, "linear: the product's dtype must be a float type, not %s", cdf_dtype_name(*out_dt));
    if (w->ndim != 2) FAIL(CDF_ERR_SHAPE, "linear: weight must be 2-D, got %s", desc(w));
    if (x->ndim < 1 || x->shape[x->ndim - 1] != w->shape[1])
        FAIL(CDF_ERR_SHAPE, "linear: input %s does not match weight %s (in_features %lld)", desc(x), desc(w),
             (long long)w->shape[1]);
    int64_t rows = cdf_tensor_numel(x) / (w->shape[1] ? w->shape[1] : 1);
    int64_t s2[2] = {rows, w->shape[1]};
    if (w->shape[1] == 0) s2[0] = cdf_shape_numel(x->ndim - 1, x->shape);
    cdf_tensor *x2 = cdf_reshape(x, 2, s2);
    cdf_tensor *wt = cdf_transpose(w, 0, 1);
    cdf_tensor *y2 = (x2 && wt) ? matmul_impl(x2, wt, b, out_dt, "linear") : NULL;
    REL(x2);
    REL(wt);
    if (!y2) RETURN(NULL);
    RETURN(linear_unflatten(x, y2, w->shape[0]));
}

cdf_tensor *cdf_linear(cdf_tensor *x, cdf_tensor *w, cdf_tensor *b) { return linear_impl(x, w, b, NULL); }
cdf_tensor *cdf_linear_as(cdf_tensor *x, cdf_tensor *w, cdf_tensor *b, cdf_dtype out_dt) { return linear_impl(x, w, b, &out_dt); }

static cdf_tensor *linear_quantized_impl(cdf_tensor *x, cdf_tensor *wq, uint32_t qtype, int64_t in, cdf_dtype wdt,
                                         cdf_tensor *b, const cdf_dtype *out_dt) {
    if (!x || !wq) return NULL;
    BEGIN();
    if (out_dt && !is_float(*out_dt)) FAIL(CDF_ERR_DTYPE, "linear: the product's dtype must be a float type, not %s", cdf_dtype_name(*out_dt));
    int64_t be = 0, bb = 0;
    if (!cdf_ggml_type_block(qtype, &be, &bb) || be < 2)
        FAIL(CDF_ERR_UNSUPPORTED, "linear: ggml type %u (%s) is not a block type this library computes with", qtype,
             cdf_ggml_type_name(qtype) ? cdf_ggml_type_name(qtype) : "unknown");
    if (wdt != CDF_F32 && wdt != CDF_BF16)
        FAIL(CDF_ERR_INVALID_ARG, "linear: quantized weights decode to f32 or bf16, not %s", cdf_dtype_name(wdt));
    if (in <= 0 || in % be)
        FAIL(CDF_ERR_SHAPE, "linear: %lld input features are not a whole number of %s blocks (%lld)", (long long)in,
             cdf_ggml_type_name(qtype), (long long)be);
    if (wq->dtype != CDF_U8 || wq->ndim != 2 || wq->shape[1] != in / be * bb)
        FAIL(CDF_ERR_SHAPE, "linear: quantized weight %s is not u8 [out, %lld] (%lld %s blocks of %lld bytes per row)",
             desc(wq), (long long)(in / be * bb), (long long)(in / be), cdf_ggml_type_name(qtype), (long long)bb);
    const int64_t N = wq->shape[0];
    if (x->ndim < 1 || x->shape[x->ndim - 1] != in)
        FAIL(CDF_ERR_SHAPE, "linear: input %s does not match a quantized weight of %lld input features", desc(x), (long long)in);
    if (b && (b->ndim != 1 || b->shape[0] != N)) FAIL(CDF_ERR_SHAPE, "linear: bias %s does not match %lld outputs", desc(b), (long long)N);
    int64_t s2[2] = {cdf_tensor_numel(x) / in, in};
    cdf_tensor *x2 = cdf_reshape(x, 2, s2);
    cdf_tensor *xc = x2 ? cdf_contiguous(x2) : NULL;
    cdf_tensor *wc = cdf_contiguous(wq);
    cdf_tensor *bc = b ? cdf_contiguous(b) : NULL;
    REL(x2);
    const int64_t os[2] = {s2[0], N};
    cdf_tensor *out = xc && wc && (!b || bc) ? cdf_tensor_alloc(dev_of(x), out_dt ? *out_dt : promote(x->dtype, wdt), 2, os) : NULL;
    cdf_node *n = out ? cdf_node_new(CDF_OP_MATMUL_Q) : NULL;
    if (n) {
        n->p.matmul_q.qtype = (int)qtype;
        n->p.matmul_q.k = in;
        n->p.matmul_q.wdt = wdt;
    }
    out = submit_op(n, out, xc, wc, bc, NULL);
    RETURN(out ? linear_unflatten(x, out, N) : NULL);
}

cdf_tensor *cdf_linear_quantized(cdf_tensor *x, cdf_tensor *wq, uint32_t qtype, int64_t in, cdf_dtype wdt, cdf_tensor *b) {
    return linear_quantized_impl(x, wq, qtype, in, wdt, b, NULL);
}
cdf_tensor *cdf_linear_quantized_as(cdf_tensor *x, cdf_tensor *wq, uint32_t qtype, int64_t in, cdf_dtype wdt, cdf_tensor *b,
                                    cdf_dtype out_dt) {
    return linear_quantized_impl(x, wq, qtype, in, wdt, b, &out_dt);
}

/* ---- normalisation / reductions ------------------------------------------------------- */

cdf_tensor *cdf_softmax(cdf_tensor *x, int dim) {
    if (!x) return NULL;
    BEGIN();
    int d = cdf_norm_dim(dim, x->ndim);
    if (d < 0) FAIL(CDF_ERR_INVALID_ARG, "softmax: dim %d out of range for %s", dim, desc(x));
    cdf_tensor *moved = cdf_transpose(x, d, x->ndim - 1);
    cdf_tensor *c = moved ? cdf_contiguous(moved) : NULL;
    REL(moved);
    if (!c) RETURN(NULL);
    cdf_tensor *out = cdf_tensor_alloc(dev_of(x), is_float(x->dtype) ? x->dtype : CDF_F32, c->ndim, c->shape);
    cdf_node *n = out ? cdf_node_new(CDF_OP_SOFTMAX) : NULL;
    if (n) {
        n->p.softmax.cols = c->shape[c->ndim - 1];
        n->p.softmax.rows = n->p.softmax.cols ? cdf_tensor_numel(c) / n->p.softmax.cols : 0;
        n->p.softmax.scale = 1.0f;
    }
    out = submit_op(n, out, c, NULL, NULL, NULL);
    if (!out) RETURN(NULL);
    cdf_tensor *back = cdf_transpose(out, d, x->ndim - 1);
    REL(out);
    RETURN(back);
}

/* out_dt: the result's dtype (0: x's, or f32 for a non-float x) */
static cdf_tensor *row_norm(cdf_op_kind kind, cdf_tensor *x, cdf_tensor *w, cdf_tensor *b, float eps, cdf_dtype out_dt,
                            const char *who) {
    BEGIN();
    if (out_dt && !is_float(out_dt)) FAIL(CDF_ERR_DTYPE, "%s: the result dtype %s is not a float dtype", who, cdf_dtype_name(out_dt));
    if (x->ndim < 1) FAIL(CDF_ERR_SHAPE, "%s: input must have at least 1 dim", who);
    int64_t cols = x->shape[x->ndim - 1];
    if (w && (w->ndim != 1 || w->shape[0] != cols)) FAIL(CDF_ERR_SHAPE, "%s: weight %s does not match %s", who, desc(w), desc(x));
    if (b && (b->ndim != 1 || b->shape[0] != cols)) FAIL(CDF_ERR_SHAPE, "%s: bias %s does not match %s", who, desc(b), desc(x));
    if (w && b && w->dtype != b->dtype) FAIL(CDF_ERR_DTYPE, "%s: weight and bias dtypes differ", who);
    cdf_tensor *c = cdf_contiguous(x), *wc = w ? cdf_contiguous(w) : NULL, *bc = b ? cdf_contiguous(b) : NULL;
    const cdf_dtype odt = out_dt ? out_dt : is_float(x->dtype) ? x->dtype : CDF_F32;
    cdf_tensor *out = c ? cdf_tensor_alloc(dev_of(x), odt, x->ndim, x->shape) : NULL;
    cdf_node *n = out ? cdf_node_new(kind) : NULL;
    if (n) {
        n->p.norm.cols = cols;
        n->p.norm.rows = cols ? cdf_tensor_numel(x) / cols : 0;
        n->p.norm.eps = eps;
    }
    RETURN(submit_op(n, out, c, wc, bc, NULL));
}

cdf_tensor *cdf_layer_norm(cdf_tensor *x, cdf_tensor *w, cdf_tensor *b, float eps) {
    if (!x) return NULL;
    return row_norm(CDF_OP_LAYER_NORM, x, w, b, eps, 0, "layer_norm");
}

cdf_tensor *cdf_rms_norm(cdf_tensor *x, cdf_tensor *w, float eps) {
    if (!x) return NULL;
    return row_norm(CDF_OP_RMS_NORM, x, w, NULL, eps, 0, "rms_norm");
}

cdf_tensor *cdf_rms_norm_as(cdf_tensor *x, cdf_tensor *w, float eps, cdf_dtype dt) {
    if (!x) return NULL;
    return row_norm(CDF_OP_RMS_NORM, x, w, NULL, eps, dt, "rms_norm");
}

cdf_tensor *cdf_group_norm(cdf_tensor *x, int groups, cdf_tensor *w, cdf_tensor *b, float eps) {
    if (!x) return NULL;
    BEGIN();
    if (x->ndim < 2) FAIL(CDF_ERR_SHAPE, "group_norm: input %s must be [N, C, ...]", desc(x));
    int64_t C = x->shape[1];
    if (groups <= 0 || C % groups) FAIL(CDF_ERR_SHAPE, "group_norm: %lld channels not divisible into %d groups", (long long)C, groups);
    if (w && (w->ndim != 1 || w->shape[0] != C)) FAIL(CDF_ERR_SHAPE, "group_norm: weight %s does not match %lld channels", desc(w), (long long)C);
    if (b && (b->ndim != 1 || b->shape[0] != C)) FAIL(CDF_ERR_SHAPE, "group_norm: bias %s does not match %lld channels", desc(b), (long long)C);
    cdf_tensor *c = cdf_contiguous(x), *wc = w ? cdf_contiguous(w) : NULL, *bc = b ? cdf_contiguous(b) : NULL;
    cdf_tensor *out = c ? cdf_tensor_alloc(dev_of(x), is_float(x->dtype) ? x->dtype : CDF_F32, x->ndim, x->shape) : NULL;
    cdf_node *n = out ? cdf_node_new(CDF_OP_GROUP_NORM) : NULL;
    if (n) {
        n->p.group_norm.n = x->shape[0];
        n->p.group_norm.c = C;
        n->p.group_norm.s = cdf_shape_numel(x->ndim - 2, x->shape + 2);
        n->p.group_norm.groups = groups;
        n->p.group_norm.eps = eps;
    }
    RETURN(submit_op(n, out, c, wc, bc, NULL));
}

static cdf_tensor *reduce(cdf_tensor *x, int dim, bool keepdim, cdf_reduce_op op, const char *who) {
    if (!x) return NULL;
    BEGIN();
    int d = cdf_norm_dim(dim, x->ndim);
    if (d < 0) FAIL(CDF_ERR_INVALID_ARG, "%s: dim %d out of range for %s", who, dim, desc(x));
    cdf_tensor *c = cdf_contiguous(x);
    if (!c) RETURN(NULL);
    int64_t shape[CDF_MAX_DIMS];
    int nd = 0;
    for (int i = 0; i < x->ndim; i++) {
        if (i == d) {
            if (keepdim) shape[nd++] = 1;
        } else {
            shape[nd++] = x->shape[i];
        }
    }
    if (x->shape[d] == 0 && (op == CDF_RED_MAX || op == CDF_RED_ARGMAX)) {
        REL(c);
        FAIL(CDF_ERR_INVALID_ARG, "%s: reduction over the empty dim %d of %s", who, dim, desc(x));
    }
    const cdf_dtype odt = op == CDF_RED_ARGMAX ? CDF_I64 : is_float(x->dtype) ? x->dtype : CDF_F32;
    cdf_tensor *out = cdf_tensor_alloc(dev_of(x), odt, nd, shape);
    cdf_node *n = out ? cdf_node_new(CDF_OP_REDUCE) : NULL;
    if (n) {
        n->p.reduce.op = op;
        n->p.reduce.outer = cdf_shape_numel(d, x->shape);
        n->p.reduce.red = x->shape[d];
        n->p.reduce.inner = cdf_shape_numel(x->ndim - d - 1, x->shape + d + 1);
    }
    RETURN(submit_op(n, out, c, NULL, NULL, NULL));
}

cdf_tensor *cdf_sum(cdf_tensor *x, int dim, bool keepdim) { return reduce(x, dim, keepdim, CDF_RED_SUM, "sum"); }
cdf_tensor *cdf_mean(cdf_tensor *x, int dim, bool keepdim) { return reduce(x, dim, keepdim, CDF_RED_MEAN, "mean"); }
cdf_tensor *cdf_var(cdf_tensor *x, int dim, bool keepdim) { return reduce(x, dim, keepdim, CDF_RED_VAR, "var"); }
cdf_tensor *cdf_max(cdf_tensor *x, int dim, bool keepdim) { return reduce(x, dim, keepdim, CDF_RED_MAX, "max"); }
cdf_tensor *cdf_argmax(cdf_tensor *x, int dim, bool keepdim) { return reduce(x, dim, keepdim, CDF_RED_ARGMAX, "argmax"); }

/* ---- convolution / resampling ---------------------------------------------------------- */

cdf_conv2d_params cdf_conv2d_params_default(void) {
    return (cdf_conv2d_params){.stride_h = 1, .stride_w = 1, .pad_h = 0, .pad_w = 0, .dil_h = 1, .dil_w = 1, .groups = 1};
}

cdf_tensor *cdf_conv2d(cdf_tensor *x, cdf_tensor *w, cdf_tensor *b, const cdf_conv2d_params *pp) {
    if (!x || !w) return NULL;
    BEGIN();
    cdf_conv2d_params p = pp ? *pp : cdf_conv2d_params_default();
    if (x->ndim != 4 || w->ndim != 4) FAIL(CDF_ERR_SHAPE, "conv2d: input %s and weight %s must be 4-D", desc(x), desc(w));
    if (p.groups <= 0 || p.stride_h <= 0 || p.stride_w <= 0 || p.dil_h <= 0 || p.dil_w <= 0 || p.pad_h < 0 || p.pad_w < 0)
        FAIL(CDF_ERR_INVALID_ARG, "conv2d: invalid stride/padding/dilation/groups");
    int64_t cin = x->shape[1], cout = w->shape[0];
    if (cin % p.groups || cout % p.groups || w->shape[1] * p.groups != cin)
        FAIL(CDF_ERR_SHAPE, "conv2d: input %s does not match weight %s with %d groups", desc(x), desc(w), p.groups);
    if (b && (b->ndim != 1 || b->shape[0] != cout)) FAIL(CDF_ERR_SHAPE, "conv2d: bias %s does not match %lld channels", desc(b), (long long)cout);
    int64_t oh = (x->shape[2] + 2 * p.pad_h - p.dil_h * (w->shape[2] - 1) - 1) / p.stride_h + 1;
    int64_t ow = (x->shape[3] + 2 * p.pad_w - p.dil_w * (w->shape[3] - 1) - 1) / p.stride_w + 1;
    if (oh <= 0 || ow <= 0) FAIL(CDF_ERR_SHAPE, "conv2d: kernel larger than the padded input %s", desc(x));
    cdf_tensor *xc = cdf_contiguous(x), *wc = cdf_contiguous(w), *bc = b ? cdf_contiguous(b) : NULL;
    int64_t oshape[4] = {x->shape[0], cout, oh, ow};
    cdf_tensor *out = (xc && wc) ? cdf_tensor_alloc(dev_of(x), promote(x->dtype, w->dtype), 4, oshape) : NULL;
    cdf_node *n = out ? cdf_node_new(CDF_OP_CONV2D) : NULL;
    if (n) n->p.conv.p = p;
    RETURN(submit_op(n, out, xc, wc, bc, NULL));
}

cdf_tensor *cdf_upsample_nearest(cdf_tensor *x, int fh, int fw) {
    if (!x) return NULL;
    BEGIN();
    if (x->ndim < 2 || fh <= 0 || fw <= 0) FAIL(CDF_ERR_INVALID_ARG, "upsample_nearest: bad input %s or factors", desc(x));
    cdf_tensor *c = cdf_contiguous(x);
    int64_t shape[CDF_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[x->ndim - 2] *= fh;
    shape[x->ndim - 1] *= fw;
    cdf_tensor *out = c ? cdf_tensor_alloc(dev_of(x), x->dtype, x->ndim, shape) : NULL;
    cdf_node *n = out ? cdf_node_new(CDF_OP_UPSAMPLE) : NULL;
    if (n) {
        n->p.upsample.fh = fh;
        n->p.upsample.fw = fw;
    }
    RETURN(submit_op(n, out, c, NULL, NULL, NULL));
}

/* ---- attention / positional ------------------------------------------------------------- */

static cdf_tensor *last_dim_unit(cdf_tensor *t) {
    if (t->strides[t->ndim - 1] == 1 || t->shape[t->ndim - 1] == 1) return clone_view(t);
    return cdf_contiguous(t);
}

cdf_tensor *cdf_sdpa(cdf_tensor *q, cdf_tensor *k, cdf_tensor *v, cdf_tensor *mask, float scale) {
    if (!q || !k || !v) return NULL;
    BEGIN();
    if (q->ndim != 4 || k->ndim != 4 || v->ndim != 4) FAIL(CDF_ERR_SHAPE, "sdpa: q %s, k %s, v %s must be [B, H, L, D]", desc(q), desc(k), desc(v));
    if (k->shape[0] != q->shape[0] || v->shape[0] != q->shape[0] || k->shape[1] != q->shape[1] ||
        v->shape[1] != q->shape[1] || k->shape[3] != q->shape[3] || v->shape[2] != k->shape[2])
        FAIL(CDF_ERR_SHAPE, "sdpa: q %s, k %s, v %s do not agree", desc(q), desc(k), desc(v));
    int64_t B = q->shape[0], H = q->shape[1], Lq = q->shape[2], Lk = k->shape[2];
    cdf_tensor *qc = last_dim_unit(q), *kc = last_dim_unit(k), *vc = last_dim_unit(v), *mc = NULL;
    if (mask) {
        int64_t ms[4] = {B, H, Lq, Lk};
        if (mask->ndim > 4) FAIL(CDF_ERR_SHAPE, "sdpa: mask %s has more than 4 dims", desc(mask));
        mc = cdf_expand(mask, 4, ms);
    }
    int64_t oshape[4] = {B, H, Lq, v->shape[3]};
    cdf_tensor *out = (qc && kc && vc && (!mask || mc)) ? cdf_tensor_alloc(dev_of(q), q->dtype, 4, oshape) : NULL;
    cdf_node *n = out ? cdf_node_new(CDF_OP_ATTENTION) : NULL;
    if (n) n->p.attention.scale = scale > 0 ? scale : 1.0f / sqrtf((float)q->shape[3]);
    RETURN(submit_op(n, out, qc, kc, vc, mc));
}

cdf_tensor *cdf_rope(cdf_tensor *x, cdf_tensor *cos_t, cdf_tensor *sin_t) {
    if (!x) return NULL;
    return cdf_rope_as(x, cos_t, sin_t, x->dtype);
}

cdf_tensor *cdf_rope_as(cdf_tensor *x, cdf_tensor *cos_t, cdf_tensor *sin_t, cdf_dtype dt) {
    if (!x || !cos_t || !sin_t) return NULL;
    BEGIN();
    if (x->ndim != 4 || x->shape[3] % 2) FAIL(CDF_ERR_SHAPE, "rope: x %s must be [B, H, L, D] with even D", desc(x));
    if (!is_float(dt)) FAIL(CDF_ERR_DTYPE, "rope: the result dtype %s is not a float dtype", cdf_dtype_name(dt));
    int64_t L = x->shape[2], D = x->shape[3];
    for (int i = 0; i < 2; i++) {
        cdf_tensor *t = i ? sin_t : cos_t;
        if (t->ndim != 2 || t->shape[0] != L || t->shape[1] != D)
            FAIL(CDF_ERR_SHAPE, "rope: table %s must be [%lld, %lld] for x %s", desc(t), (long long)L, (long long)D, desc(x));
    }
    cdf_tensor *xc = cdf_contiguous(x);
    cdf_tensor *cc = cdf_cast(cos_t, CDF_F32), *sc = cdf_cast(sin_t, CDF_F32);
    cdf_tensor *cc2 = cc ? cdf_contiguous(cc) : NULL, *sc2 = sc ? cdf_contiguous(sc) : NULL;
    REL(cc);
    REL(sc);
    cdf_tensor *out = (xc && cc2 && sc2) ? cdf_tensor_alloc(dev_of(x), dt, 4, x->shape) : NULL;
    cdf_node *n = out ? cdf_node_new(CDF_OP_ROPE) : NULL;
    RETURN(submit_op(n, out, xc, cc2, sc2, NULL));
}

cdf_tensor *cdf_timestep_embedding(cdf_tensor *t, int dim, bool flip_sin_to_cos, float downscale_freq_shift,
                                   float scale, float max_period) {
    if (!t) return NULL;
    BEGIN();
    if (t->ndim != 1 || dim <= 0) FAIL(CDF_ERR_SHAPE, "timestep_embedding: t %s must be 1-D and dim > 0", desc(t));
    cdf_tensor *tf = cdf_cast(t, CDF_F32), *tc = tf ? cdf_contiguous(tf) : NULL;
    REL(tf);
    int64_t oshape[2] = {t->shape[0], dim};
    cdf_tensor *out = tc ? cdf_tensor_alloc(dev_of(t), CDF_F32, 2, oshape) : NULL;
    cdf_node *n = out ? cdf_node_new(CDF_OP_TIMESTEP_EMB) : NULL;
    if (n) {
        n->p.temb.dim = dim;
        n->p.temb.flip = flip_sin_to_cos;
        n->p.temb.shift = downscale_freq_shift;
        n->p.temb.scale = scale;
        n->p.temb.max_period = max_period;
    }
    RETURN(submit_op(n, out, tc, NULL, NULL, NULL));
}

cdf_status cdf_rope_tables(cdf_tensor *pos, int n_axes, const int64_t *axes_dim, double theta, cdf_tensor **cos_out,
                           cdf_tensor **sin_out) {
    *cos_out = *sin_out = NULL;
    if (!pos) return cdf_last_status() ? cdf_last_status() : cdf_error(CDF_ERR_INVALID_ARG, "rope_tables: pos is NULL");
    if (n_axes <= 0 || n_axes > CDF_MAX_DIMS || !(theta > 0))
        return cdf_error(CDF_ERR_INVALID_ARG, "rope_tables: %d axes, theta %g", n_axes, theta);
    if (pos->ndim != 2 || pos->shape[1] != n_axes)
        return cdf_error(CDF_ERR_SHAPE, "rope_tables: positions %s must be [L, %d]", desc(pos), n_axes);
    int64_t width = 0;
    for (int a = 0; a < n_axes; a++) {
        if (axes_dim[a] <= 0 || axes_dim[a] % 2 || axes_dim[a] > (1 << 20))
            return cdf_error(CDF_ERR_INVALID_ARG, "rope_tables: axis %d has dim %lld (must be even)", a, (long long)axes_dim[a]);
        width += axes_dim[a];
    }
    cdf_scope_suppress(1);
    cdf_tensor *pf = cdf_cast(pos, CDF_F32), *pc = pf ? cdf_contiguous(pf) : NULL;
    cdf_tensor_release(pf);
    int64_t oshape[3] = {2, pos->shape[0], width};
    cdf_tensor *out = pc ? cdf_tensor_alloc(dev_of(pos), CDF_F32, 3, oshape) : NULL;
    cdf_node *n = out ? cdf_node_new(CDF_OP_ROPE_TABLE) : NULL;
    cdf_status s = cdf_last_status() ? cdf_last_status() : CDF_ERR_OUT_OF_MEMORY;
    if (n) {
        n->p.rope_table.n_axes = n_axes;
        for (int a = 0; a < n_axes; a++) n->p.rope_table.axes_dim[a] = axes_dim[a];
        n->p.rope_table.theta = theta;
        s = submit(n, out, pc, NULL, NULL, NULL);
    }
    cdf_tensor_release(pc);
    if (s == CDF_OK) {
        cdf_tensor *c3 = cdf_narrow(out, 0, 0, 1), *s3 = cdf_narrow(out, 0, 1, 1);
        *cos_out = cdf_squeeze(c3, 0);
        *sin_out = cdf_squeeze(s3, 0);
        cdf_tensor_release(c3);
        cdf_tensor_release(s3);
        if (!*cos_out || !*sin_out) s = cdf_last_status();
    }
    cdf_tensor_release(out);
    cdf_scope_suppress(-1);
    if (s != CDF_OK) {
        cdf_tensor_release(*cos_out);
        cdf_tensor_release(*sin_out);
        *cos_out = *sin_out = NULL;
        return s;
    }
    cdf_scope_record(*cos_out);
    cdf_scope_record(*sin_out);
    return CDF_OK;
}
