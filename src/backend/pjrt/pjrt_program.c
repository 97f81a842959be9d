/* Nodes -> one StableHLO program (pjrt_program.h). The text uses MLIR's generic op form
 * ("stablehlo.add"(%a, %b) : (types) -> type), which every StableHLO version parses the same. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/pjrt/pjrt_program.h"
#include "core/error_internal.h"

#define HMAX 12 /* dims of an intermediate (a view's nested reshape has one more than the view) */

/* ---- text ------------------------------------------------------------------------------------ */

typedef struct sbuf {
    char *p;
    size_t n, cap;
    bool oom;
} sbuf;

static void sb_printf(sbuf *s, const char *fmt, ...) CDF_PRINTF(2, 3);
static void sb_printf(sbuf *s, const char *fmt, ...) {
    if (s->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(s->p ? s->p + s->n : NULL, s->p ? s->cap - s->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            s->oom = true;
            return;
        }
        if (s->p && s->n + (size_t)k < s->cap) {
            s->n += (size_t)k;
            return;
        }
        size_t cap = s->cap ? s->cap * 2 : 4096;
        while (cap < s->n + (size_t)k + 1) cap *= 2;
        char *q = realloc(s->p, cap);
        if (!q) {
            s->oom = true;
            return;
        }
        s->p = q;
        s->cap = cap;
    }
}

/* ---- types and values -------------------------------------------------------------------------- */

typedef struct hty {
    cdf_dtype dt; /* CDF_U8 also stands for i1 (pred) when pred is set */
    bool pred;
    int nd;
    int64_t d[HMAX];
} hty;

typedef struct hv {
    int id; /* %v<id> */
    hty t;
} hv;

static const char *et_name(const hty *t) {
    if (t->pred) return "i1";
    switch (t->dt) {
    case CDF_F32: return "f32";
    case CDF_BF16: return "bf16";
    case CDF_F16: return "f16";
    case CDF_F64: return "f64";
    case CDF_I64: return "i64";
    case CDF_I32: return "i32";
    case CDF_U8: return "ui8";
    default: return "f32";
    }
}

static hty ty(cdf_dtype dt, int nd, const int64_t *d) {
    hty t = {.dt = dt, .nd = nd};
    for (int i = 0; i < nd; i++) t.d[i] = d[i];
    return t;
}
static hty ty_as(hty t, cdf_dtype dt) {
    t.dt = dt;
    t.pred = false;
    return t;
}
static hty ty1(cdf_dtype dt, int64_t n) { return ty(dt, 1, &n); }

static int64_t numel(const hty *t) {
    int64_t n = 1;
    for (int i = 0; i < t->nd; i++) n *= t->d[i];
    return n;
}

/* "tensor<2x3xf32>" */
static void put_type(sbuf *s, const hty *t) {
    sb_printf(s, "tensor<");
    for (int i = 0; i < t->nd; i++) sb_printf(s, "%lldx", (long long)t->d[i]);
    sb_printf(s, "%s>", et_name(t));
}

static void put_i64_list(sbuf *s, int n, const int64_t *v) {
    for (int i = 0; i < n; i++) sb_printf(s, "%s%lld", i ? ", " : "", (long long)v[i]);
}

/* "<sep>name = array<i64: v...>" */
static void put_array_attr(sbuf *s, const char *sep, const char *name, int n, const int64_t *v) {
    sb_printf(s, "%s%s = array<i64%s", sep, name, n ? ": " : "");
    put_i64_list(s, n, v);
    sb_printf(s, ">");
}

/* ---- the builder --------------------------------------------------------------------------------- */

typedef struct storage_state {
    cdf_storage *st;
    bool has_value;
    hv cur;       /* the storage's value now: flat dt[n] */
    bool written; /* a node wrote it */
    bool internal;
} storage_state;

typedef struct builder {
    sbuf body;
    int next_id;
    cdf_pjrt_arg *args;
    int n_args, cap_args;
    hty *arg_ty; /* argument k's type */
    int *arg_id; /* argument k is value %v<arg_id[k]> */
    storage_state *ss;
    int n_ss, cap_ss;
    cdf_pjrt_internal_fn internal;
    void *ctx;
    cdf_pjrt_id_check *checks;
    int n_checks;
    sbuf funcs; /* the module's other functions (composites' decompositions) */
    int n_funcs;
    cdf_status err;
    char why[256];
} builder;

static void fail(builder *b, cdf_status s, const char *fmt, ...) CDF_PRINTF(3, 4);
static void fail(builder *b, cdf_status s, const char *fmt, ...) {
    if (b->err != CDF_OK) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->why, sizeof b->why, fmt, ap);
    va_end(ap);
    b->err = s;
}

static hv new_val(builder *b, hty t) { return (hv){.id = b->next_id++, .t = t}; }

/* A new argument: the signature names it %v<id> like any value. */
static hv add_arg(builder *b, cdf_pjrt_arg a, hty t) {
    hv v = new_val(b, t);
    if (b->n_args == b->cap_args) {
        int cap = b->cap_args ? b->cap_args * 2 : 16;
        cdf_pjrt_arg *na = realloc(b->args, (size_t)cap * sizeof *na);
        if (na) b->args = na;
        hty *nt = na ? realloc(b->arg_ty, (size_t)cap * sizeof *nt) : NULL;
        if (nt) b->arg_ty = nt;
        int *ni = nt ? realloc(b->arg_id, (size_t)cap * sizeof *ni) : NULL;
        if (!ni) {
            fail(b, CDF_ERR_OUT_OF_MEMORY, "out of host memory (program arguments)");
            return v;
        }
        b->arg_id = ni;
        b->cap_args = cap;
    }
    b->args[b->n_args] = a;
    b->arg_ty[b->n_args] = t;
    b->arg_id[b->n_args] = v.id;
    b->n_args++;
    return v;
}

/* ---- emitting ops ---------------------------------------------------------------------------------- */

static void begin_op(builder *b, hv out) { sb_printf(&b->body, "    %%v%d = ", out.id); }

static void put_operands(builder *b, int n, const hv *in) {
    sb_printf(&b->body, "(");
    for (int i = 0; i < n; i++) sb_printf(&b->body, "%s%%v%d", i ? ", " : "", in[i].id);
    sb_printf(&b->body, ")");
}

static void put_sig(builder *b, int n, const hv *in, const hty *out) {
    sb_printf(&b->body, " : (");
    for (int i = 0; i < n; i++) {
        if (i) sb_printf(&b->body, ", ");
        put_type(&b->body, &in[i].t);
    }
    sb_printf(&b->body, ") -> ");
    put_type(&b->body, out);
    sb_printf(&b->body, "\n");
}

/* %out = "stablehlo.<name>"(in...) {attrs} : (...) -> out */
static hv op(builder *b, const char *name, hty out_t, int n, const hv *in, const char *attrs) {
    hv out = new_val(b, out_t);
    begin_op(b, out);
    sb_printf(&b->body, "\"stablehlo.%s\"", name);
    put_operands(b, n, in);
    if (attrs && *attrs) sb_printf(&b->body, " {%s}", attrs);
    put_sig(b, n, in, &out_t);
    return out;
}

static hv op1(builder *b, const char *name, hv x) { return op(b, name, x.t, 1, &x, NULL); }
static hv op2(builder *b, const char *name, hv x, hv y) {
    hv in[2] = {x, y};
    return op(b, name, x.t, 2, in, NULL);
}

static hv constant(builder *b, cdf_dtype dt, double v) {
    hty t = {.dt = dt, .nd = 0};
    hv out = new_val(b, t);
    begin_op(b, out);
    char val[64];
    if (dt == CDF_I64 || dt == CDF_I32 || dt == CDF_U8) snprintf(val, sizeof val, "%lld", (long long)v);
    else if (isinf(v) && dt == CDF_F64) snprintf(val, sizeof val, "%s", v > 0 ? "0x7FF0000000000000" : "0xFFF0000000000000");
    else if (isinf(v) && dt == CDF_BF16) snprintf(val, sizeof val, "%s", v > 0 ? "0x7F80" : "0xFF80");
    else if (isinf(v) && dt == CDF_F16) snprintf(val, sizeof val, "%s", v > 0 ? "0x7C00" : "0xFC00");
    else if (isinf(v)) snprintf(val, sizeof val, "%s", v > 0 ? "0x7F800000" : "0xFF800000");
    else snprintf(val, sizeof val, "%.17g", v);
    if (!strchr(val, '.') && !strchr(val, 'e') && !strchr(val, 'x') && dt != CDF_I64 && dt != CDF_I32 && dt != CDF_U8 &&
        !strchr(val, 'n') && !strchr(val, 'i'))
        strcat(val, ".0");
    sb_printf(&b->body, "\"stablehlo.constant\"() {value = dense<%s> : ", val);
    put_type(&b->body, &t);
    sb_printf(&b->body, "}");
    put_sig(b, 0, NULL, &t);
    return out;
}

/* A constant vector of doubles (f64 or f32), e.g. frequencies fixed by the model. */
static hv const_vec(builder *b, cdf_dtype dt, int64_t n, const double *v) {
    hty t = ty1(dt, n);
    hv out = new_val(b, t);
    begin_op(b, out);
    sb_printf(&b->body, "\"stablehlo.constant\"() {value = dense<[");
    for (int64_t i = 0; i < n; i++) sb_printf(&b->body, "%s%.17e", i ? ", " : "", v[i]);
    sb_printf(&b->body, "]> : ");
    put_type(&b->body, &t);
    sb_printf(&b->body, "}");
    put_sig(b, 0, NULL, &t);
    return out;
}

static hv convert(builder *b, hv x, cdf_dtype dt) {
    if (x.t.dt == dt && !x.t.pred) return x;
    return op(b, "convert", ty_as(x.t, dt), 1, &x, NULL);
}

static hv reshape(builder *b, hv x, int nd, const int64_t *d) {
    hty t = ty(x.t.dt, nd, d);
    t.pred = x.t.pred;
    if (t.nd == x.t.nd && !memcmp(t.d, x.t.d, (size_t)nd * sizeof *d)) return x;
    return op(b, "reshape", t, 1, &x, NULL);
}

/* broadcast_in_dim: x's dim i goes to out dim map[i] */
static hv broadcast(builder *b, hv x, int nd, const int64_t *d, const int64_t *map) {
    hty t = ty(x.t.dt, nd, d);
    t.pred = x.t.pred;
    if (t.nd == x.t.nd && !memcmp(t.d, x.t.d, (size_t)nd * sizeof *d)) {
        bool ident = true;
        for (int i = 0; i < x.t.nd; i++) ident &= map[i] == i;
        if (ident) return x;
    }
    sbuf a = {0};
    put_array_attr(&a, "", "broadcast_dimensions", x.t.nd, map);
    hv r = op(b, "broadcast_in_dim", t, 1, &x, a.p);
    free(a.p);
    return r;
}

/* a scalar to shape t */
static hv splat(builder *b, hv s, const hty *t) { return broadcast(b, s, t->nd, t->d, NULL); }

/* x broadcast along the trailing dims: x [d0..dk) -> t with x's dims at t's leading dims */
static hv bcast_lead(builder *b, hv x, const hty *t) {
    int64_t map[HMAX];
    for (int i = 0; i < x.t.nd; i++) map[i] = i;
    return broadcast(b, x, t->nd, t->d, map);
}
/* x broadcast to t with x's dims at t's trailing dims */
static hv bcast_trail(builder *b, hv x, const hty *t) {
    int64_t map[HMAX];
    for (int i = 0; i < x.t.nd; i++) map[i] = t->nd - x.t.nd + i;
    return broadcast(b, x, t->nd, t->d, map);
}

static hv transpose(builder *b, hv x, const int64_t *perm) {
    bool ident = true;
    hty t = x.t;
    for (int i = 0; i < x.t.nd; i++) {
        t.d[i] = x.t.d[perm[i]];
        ident &= perm[i] == i;
    }
    if (ident) return x;
    sbuf a = {0};
    put_array_attr(&a, "", "permutation", x.t.nd, perm);
    hv r = op(b, "transpose", t, 1, &x, a.p);
    free(a.p);
    return r;
}

static hv slice(builder *b, hv x, const int64_t *start, const int64_t *limit) {
    hty t = x.t;
    bool all = true;
    for (int i = 0; i < x.t.nd; i++) {
        t.d[i] = limit[i] - start[i];
        all &= start[i] == 0 && limit[i] == x.t.d[i];
    }
    if (all) return x;
    int64_t ones[HMAX];
    for (int i = 0; i < x.t.nd; i++) ones[i] = 1;
    sbuf a = {0};
    put_array_attr(&a, "", "start_indices", x.t.nd, start);
    put_array_attr(&a, ", ", "limit_indices", x.t.nd, limit);
    put_array_attr(&a, ", ", "strides", x.t.nd, ones);
    hv r = op(b, "slice", t, 1, &x, a.p);
    free(a.p);
    return r;
}

static hv concat(builder *b, hv x, hv y, int dim) {
    hty t = x.t;
    t.d[dim] += y.t.d[dim];
    char attrs[64];
    snprintf(attrs, sizeof attrs, "dimension = %d : i64", dim);
    hv in[2] = {x, y};
    return op(b, "concatenate", t, 2, in, attrs);
}

/* x padded at the end of dim 0 (1-d) with zeros to n */
static hv pad_end(builder *b, hv x, int64_t n) {
    if (x.t.d[0] >= n) return x;
    hv z = constant(b, x.t.dt, 0);
    hty t = x.t;
    t.d[0] = n;
    char attrs[160];
    snprintf(attrs, sizeof attrs,
             "edge_padding_low = array<i64: 0>, edge_padding_high = array<i64: %lld>, interior_padding = array<i64: 0>",
             (long long)(n - x.t.d[0]));
    hv in[2] = {x, z};
    return op(b, "pad", t, 2, in, attrs);
}

/* dynamic_update_slice with constant start indices */
static hv update_slice(builder *b, hv base, hv upd, const int64_t *start) {
    hv in[HMAX + 2];
    in[0] = base;
    in[1] = upd;
    for (int i = 0; i < base.t.nd; i++) in[2 + i] = constant(b, CDF_I64, (double)start[i]);
    return op(b, "dynamic_update_slice", base.t, 2 + base.t.nd, in, NULL);
}

static hv compare(builder *b, hv x, hv y, const char *dir) {
    char attrs[96];
    snprintf(attrs, sizeof attrs, "comparison_direction = #stablehlo<comparison_direction %s>", dir);
    hty t = x.t;
    t.pred = true;
    hv in[2] = {x, y};
    return op(b, "compare", t, 2, in, attrs);
}

static hv select3(builder *b, hv pred, hv x, hv y) {
    hv in[3] = {pred, x, y};
    return op(b, "select", x.t, 3, in, NULL);
}

static hv iota(builder *b, hty t, int dim) {
    char attrs[48];
    snprintf(attrs, sizeof attrs, "iota_dimension = %d : i64", dim);
    return op(b, "iota", t, 0, NULL, attrs);
}

/* The region of a reduction: ({ ^bb0(a, b): r = "stablehlo.<fn>"(a, b); return r }) over scalars
 * of dtype dt (reduce's combiner, all_reduce's sum) */
static void put_scalar_region(builder *b, cdf_dtype dt, const char *fn) {
    const hty s = {.dt = dt, .nd = 0};
    const int p0 = b->next_id++, p1 = b->next_id++, r = b->next_id++;
    sb_printf(&b->body, "({\n    ^bb0(%%v%d: ", p0);
    put_type(&b->body, &s);
    sb_printf(&b->body, ", %%v%d: ", p1);
    put_type(&b->body, &s);
    sb_printf(&b->body, "):\n      %%v%d = \"stablehlo.%s\"(%%v%d, %%v%d) : (", r, fn, p0, p1);
    put_type(&b->body, &s);
    sb_printf(&b->body, ", ");
    put_type(&b->body, &s);
    sb_printf(&b->body, ") -> ");
    put_type(&b->body, &s);
    sb_printf(&b->body, "\n      \"stablehlo.return\"(%%v%d) : (", r);
    put_type(&b->body, &s);
    sb_printf(&b->body, ") -> ()\n    })");
}

/* reduce x over dims[0..nr) with "add" / "maximum" / "minimum" from init */
static hv reduce(builder *b, hv x, int nr, const int64_t *dims, const char *fn, double init) {
    hv z = constant(b, x.t.dt, init);
    hty t = {.dt = x.t.dt, .nd = 0};
    for (int i = 0; i < x.t.nd; i++) {
        bool red = false;
        for (int j = 0; j < nr; j++) red |= dims[j] == i;
        if (!red) t.d[t.nd++] = x.t.d[i];
    }
    hv out = new_val(b, t);
    begin_op(b, out);
    sb_printf(&b->body, "\"stablehlo.reduce\"(%%v%d, %%v%d) ", x.id, z.id);
    put_scalar_region(b, x.t.dt, fn);
    sb_printf(&b->body, " {dimensions = array<i64: ");
    put_i64_list(&b->body, nr, dims);
    sb_printf(&b->body, ">}");
    put_sig(b, 2, (hv[2]){x, z}, &t);
    return out;
}

/* The sum of x over replicas 0..n-1 of the program (one group; the replica count is in the
 * compile options, not in the text) */
static hv all_reduce(builder *b, hv x, int n) {
    hv out = new_val(b, x.t);
    begin_op(b, out);
    sb_printf(&b->body, "\"stablehlo.all_reduce\"(%%v%d) ", x.id);
    put_scalar_region(b, x.t.dt, "add");
    sb_printf(&b->body, " {replica_groups = dense<[[");
    for (int i = 0; i < n; i++) sb_printf(&b->body, "%s%d", i ? ", " : "", i);
    sb_printf(&b->body, "]]> : tensor<1x%dxi64>}", n);
    put_sig(b, 1, &x, &x.t);
    return out;
}

/* dot_general: batch dims bl/br, contracting cl/cr; result f32 with the operands' precision */
static hv dot(builder *b, hv l, hv r, int nb, const int64_t *bl, const int64_t *br, int64_t cl, int64_t cr) {
    hty t = {.dt = CDF_F32, .nd = 0};
    for (int i = 0; i < nb; i++) t.d[t.nd++] = l.t.d[bl[i]];
    for (int i = 0; i < l.t.nd; i++) {
        bool skip = i == cl;
        for (int j = 0; j < nb; j++) skip |= bl[j] == i;
        if (!skip) t.d[t.nd++] = l.t.d[i];
    }
    for (int i = 0; i < r.t.nd; i++) {
        bool skip = i == cr;
        for (int j = 0; j < nb; j++) skip |= br[j] == i;
        if (!skip) t.d[t.nd++] = r.t.d[i];
    }
    sbuf a = {0};
    sb_printf(&a, "dot_dimension_numbers = #stablehlo.dot<");
    if (nb) {
        sb_printf(&a, "lhs_batching_dimensions = [");
        put_i64_list(&a, nb, bl);
        sb_printf(&a, "], rhs_batching_dimensions = [");
        put_i64_list(&a, nb, br);
        sb_printf(&a, "], ");
    }
    sb_printf(&a, "lhs_contracting_dimensions = [%lld], rhs_contracting_dimensions = [%lld]>", (long long)cl, (long long)cr);
    /* f32 operands at full precision: a GPU plugin would otherwise use TF32 */
    if (l.t.dt == CDF_F32) sb_printf(&a, ", precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]");
    hv in[2] = {l, r};
    hv out = op(b, "dot_general", t, 2, in, a.p);
    free(a.p);
    return out;
}

/* ---- storages and views -------------------------------------------------------------------------- */

static storage_state *state_of(builder *b, cdf_storage *st) {
    for (int i = 0; i < b->n_ss; i++)
        if (b->ss[i].st == st) return &b->ss[i];
    if (b->n_ss == b->cap_ss) {
        int cap = b->cap_ss ? b->cap_ss * 2 : 32;
        storage_state *n = realloc(b->ss, (size_t)cap * sizeof *n);
        if (!n) {
            fail(b, CDF_ERR_OUT_OF_MEMORY, "out of host memory (program builder)");
            return NULL;
        }
        b->ss = n;
        b->cap_ss = cap;
    }
    storage_state *s = &b->ss[b->n_ss++];
    memset(s, 0, sizeof *s);
    s->st = st;
    s->internal = b->internal && b->internal(b->ctx, st);
    return s;
}

/* flat value v (dt[n]) seen as dtype `to` (bitcast; sizes permitting) */
static hv retype(builder *b, hv v, cdf_dtype to) {
    if (v.t.dt == to) return v;
    size_t fs = cdf_dtype_size(v.t.dt), ts = cdf_dtype_size(to);
    int64_t n = v.t.d[0];
    if (fs == ts) return op(b, "bitcast_convert", ty1(to, n), 1, &v, NULL);
    if (fs > ts) {
        int64_t k = (int64_t)(fs / ts), d2[2] = {n, k};
        hv r = op(b, "bitcast_convert", ty(to, 2, d2), 1, &v, NULL);
        int64_t m = n * k;
        return reshape(b, r, 1, &m);
    }
    int64_t k = (int64_t)(ts / fs);
    if (n % k) {
        fail(b, CDF_ERR_UNSUPPORTED, "pjrt: a %lld-element %s buffer read as %s", (long long)n, cdf_dtype_name(v.t.dt),
             cdf_dtype_name(to));
        return v;
    }
    int64_t d2[2] = {n / k, k};
    hv r = reshape(b, v, 2, d2);
    return op(b, "bitcast_convert", ty1(to, n / k), 1, &r, NULL);
}

/* the storage's value as flat dt[] (a new argument the first time) */
static hv storage_value(builder *b, cdf_storage *st, cdf_dtype dt) {
    storage_state *s = state_of(b, st);
    if (!s) return (hv){0};
    if (!s->has_value) {
        int64_t n = (int64_t)(st->nbytes / cdf_dtype_size(dt));
        if (s->internal && (st->is_virtual || !st->data)) {
            /* a buffer without memory read before any write: unwritten, its contents undefined */
            hv z = constant(b, dt, 0);
            s->cur = splat(b, z, &(hty){.dt = dt, .nd = 1, .d = {n}});
        } else {
            s->cur = add_arg(b, (cdf_pjrt_arg){.kind = CDF_PJRT_ARG_STORAGE, .st = st, .dt = dt, .n = n}, ty1(dt, n));
        }
        s->has_value = true;
    }
    return retype(b, s->cur, dt);
}

/* The dims of a view with a stride other than 0 and a size other than 1, in decreasing stride
 * order: whether they nest (each stride a multiple of the next, no overlap), which makes the view
 * a slice of a reshape of the flat buffer. */
typedef struct view_plan {
    int k;
    int order[CDF_MAX_DIMS]; /* view dims, outermost first */
    bool nested, contiguous;
} view_plan;

static view_plan plan_view(const cdf_tensor *t) {
    view_plan v = {0};
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] != 1 && t->strides[i] != 0) v.order[v.k++] = i;
    for (int i = 1; i < v.k; i++) /* insertion sort, stable, by decreasing stride */
        for (int j = i; j > 0 && t->strides[v.order[j - 1]] < t->strides[v.order[j]]; j--) {
            int x = v.order[j];
            v.order[j] = v.order[j - 1];
            v.order[j - 1] = x;
        }
    v.nested = true;
    for (int i = 0; i < v.k; i++) {
        int64_t s = t->strides[v.order[i]];
        if (s <= 0) v.nested = false;
        if (i + 1 < v.k) {
            int64_t s2 = t->strides[v.order[i + 1]], n2 = t->shape[v.order[i + 1]];
            if (s2 <= 0 || s % s2 || n2 * s2 > s) v.nested = false;
        }
    }
    v.contiguous = v.nested;
    for (int i = 0; i < t->ndim; i++) v.contiguous &= !(t->strides[i] == 0 && t->shape[i] > 1);
    int64_t expect = 1;
    for (int i = v.k - 1; i >= 0 && v.contiguous; i--) {
        if (t->strides[v.order[i]] != expect) v.contiguous = false;
        expect *= t->shape[v.order[i]];
    }
    /* contiguous also needs the view's dims in the view's own order */
    for (int i = 1; i < v.k && v.contiguous; i++) v.contiguous = v.order[i - 1] < v.order[i];
    return v;
}

/* A nested view as a box of the whole flat buffer reshaped to the grid [n/s0, s0/s1, ...,
 * s_k-1/s_k, s_k] (dims outermost first, then the leftover unit stride): a reshape that copies
 * nothing and one slice, where slicing the view's span first needed the buffer padded whenever the
 * span runs past its end (every column block but the first of a row-major matrix: the q / k / v
 * thirds of a fused projection). false when the buffer is not a whole number of outer rows or the
 * box does not fit its grid. */
static bool view_box(const cdf_tensor *t, const view_plan *v, int64_t n, int64_t *grid, int64_t *start, int64_t *limit) {
    const int k = v->k;
    if (k == 0 || n % t->strides[v->order[0]]) return false;
    int64_t rem = t->offset;
    grid[0] = n / t->strides[v->order[0]];
    for (int i = 0; i < k; i++) {
        const int64_t s = t->strides[v->order[i]];
        if (i + 1 < k) grid[i + 1] = s / t->strides[v->order[i + 1]];
        start[i] = rem / s;
        rem %= s;
        limit[i] = start[i] + t->shape[v->order[i]];
        if (limit[i] > grid[i]) return false;
    }
    grid[k] = t->strides[v->order[k - 1]];
    start[k] = rem;
    limit[k] = rem + 1;
    return true;
}

/* the gather / scatter index of every element of t's shape: offset + sum idx_i * stride_i (i64) */
static hv element_indices(builder *b, const cdf_tensor *t) {
    hty it = ty(CDF_I64, t->ndim, t->shape);
    hv acc = splat(b, constant(b, CDF_I64, (double)t->offset), &it);
    for (int i = 0; i < t->ndim; i++) {
        if (t->strides[i] == 0 || t->shape[i] == 1) continue;
        hv io = iota(b, it, i);
        acc = op2(b, "add", acc, op2(b, "multiply", io, splat(b, constant(b, CDF_I64, (double)t->strides[i]), &it)));
    }
    return acc;
}

/* t's logical value (its shape, its dtype) out of the flat value */
static hv read_view(builder *b, const cdf_tensor *t) {
    hv flat = storage_value(b, t->storage, t->dtype);
    if (b->err) return flat;
    const int64_t n = flat.t.d[0], total = cdf_shape_numel(t->ndim, t->shape);
    hty out_t = ty(t->dtype, t->ndim, t->shape);
    if (total == 0) return splat(b, constant(b, t->dtype, 0), &out_t);
    view_plan v = plan_view(t);
    if (v.contiguous) {
        int64_t st = t->offset, lim = t->offset + total;
        hv s = slice(b, flat, &st, &lim);
        return reshape(b, s, t->ndim, t->shape);
    }
    if (!v.nested) {
        /* general strides: a gather of every element */
        hv idx = element_indices(b, t);
        int64_t d[HMAX];
        for (int i = 0; i < t->ndim; i++) d[i] = t->shape[i];
        d[t->ndim] = 1;
        idx = reshape(b, idx, t->ndim + 1, d);
        char attrs[256];
        snprintf(attrs, sizeof attrs,
                 "dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0], start_index_map = [0], "
                 "index_vector_dim = %d>, slice_sizes = array<i64: 1>", t->ndim);
        hv in[2] = {flat, idx};
        return op(b, "gather", out_t, 2, in, attrs);
    }
    /* nested: slice [offset, offset + n0 * s0), reshape to [n0, s0/s1, ..., s_k-1], keep the first
     * n_i of each, then put the dims back in the view's order and broadcast the rest */
    const int k = v.k;
    int64_t rd[HMAX], lim[HMAX], zero[HMAX] = {0}, box0[HMAX], box1[HMAX];
    hv f;
    if (view_box(t, &v, n, rd, box0, box1)) {
        f = slice(b, reshape(b, flat, k + 1, rd), box0, box1);
    } else {
        int64_t s0 = k ? t->strides[v.order[0]] : 1, n0 = k ? t->shape[v.order[0]] : 1;
        int64_t end = t->offset + n0 * s0;
        f = end > n ? pad_end(b, flat, end) : flat;
        int64_t st = t->offset;
        f = slice(b, f, &st, &end);
        rd[0] = n0;
        for (int i = 1; i < k; i++) rd[i] = t->strides[v.order[i - 1]] / t->strides[v.order[i]];
        rd[k] = k ? t->strides[v.order[k - 1]] : 1;
        f = reshape(b, f, k + 1, rd);
        for (int i = 0; i < k; i++) lim[i] = t->shape[v.order[i]];
        lim[k] = 1;
        f = slice(b, f, zero, lim);
    }
    for (int i = 0; i < k; i++) lim[i] = t->shape[v.order[i]];
    f = reshape(b, f, k, lim);
    /* f's dim i is view dim order[i]: transpose to increasing view dims, then broadcast */
    int64_t perm[HMAX], sorted[CDF_MAX_DIMS];
    int ns = 0;
    for (int d = 0; d < t->ndim; d++)
        for (int i = 0; i < k; i++)
            if (v.order[i] == d) {
                perm[ns] = i;
                sorted[ns++] = d;
            }
    f = transpose(b, f, perm);
    return broadcast(b, f, t->ndim, t->shape, sorted);
}

/* the storage of t takes value x (t's shape) at t's elements */
static void write_view(builder *b, const cdf_tensor *t, hv x) {
    storage_state *s = state_of(b, t->storage);
    if (!s || b->err) return;
    x = convert(b, x, t->dtype);
    const int64_t total = cdf_shape_numel(t->ndim, t->shape), n = (int64_t)(t->storage->nbytes / cdf_dtype_size(t->dtype));
    view_plan v = plan_view(t);
    s->written = true;
    if (v.contiguous && t->offset == 0 && total == n) { /* the whole buffer */
        s->cur = reshape(b, x, 1, &n);
        s->has_value = true;
        return;
    }
    hv flat = storage_value(b, t->storage, t->dtype);
    if (b->err) return;
    if (total == 0) return;
    if (v.contiguous) {
        int64_t off = t->offset;
        s->cur = update_slice(b, flat, reshape(b, x, 1, &total), &off);
        return;
    }
    bool broadcast_dims = false;
    for (int i = 0; i < t->ndim; i++) broadcast_dims |= t->strides[i] == 0 && t->shape[i] > 1;
    if (!v.nested || broadcast_dims) {
        /* general strides: a scatter of every element (the last write of a repeated index wins) */
        hv idx = element_indices(b, t);
        int64_t d[HMAX];
        for (int i = 0; i < t->ndim; i++) d[i] = t->shape[i];
        d[t->ndim] = 1;
        idx = reshape(b, idx, t->ndim + 1, d);
        hty sc = {.dt = t->dtype, .nd = 0};
        int p0 = b->next_id++, p1 = b->next_id++;
        hv out = new_val(b, flat.t);
        begin_op(b, out);
        sb_printf(&b->body, "\"stablehlo.scatter\"(%%v%d, %%v%d, %%v%d) ({\n    ^bb0(%%v%d: ", flat.id, idx.id, x.id, p0);
        put_type(&b->body, &sc);
        sb_printf(&b->body, ", %%v%d: ", p1);
        put_type(&b->body, &sc);
        sb_printf(&b->body, "):\n      \"stablehlo.return\"(%%v%d) : (", p1);
        put_type(&b->body, &sc);
        sb_printf(&b->body,
                  ") -> ()\n    }) {scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0], "
                  "scatter_dims_to_operand_dims = [0], index_vector_dim = %d>}", t->ndim);
        put_sig(b, 3, (hv[3]){flat, idx, x}, &flat.t);
        s->cur = out;
        return;
    }
    /* nested: the inverse of read_view's reshape, then two dynamic_update_slices */
    const int k = v.k;
    int64_t sorted[CDF_MAX_DIMS] = {0}, perm[HMAX] = {0};
    int ns = 0;
    for (int d = 0; d < t->ndim; d++)
        for (int i = 0; i < k; i++)
            if (v.order[i] == d) sorted[ns++] = d;
    /* x [view shape] -> [the k dims in the view's order] -> [k dims outermost first] */
    int64_t kd[HMAX] = {0};
    for (int i = 0; i < ns; i++) kd[i] = t->shape[sorted[i]];
    hv y = reshape(b, x, ns, kd);
    for (int i = 0; i < k; i++)
        for (int j = 0; j < ns; j++)
            if (sorted[j] == v.order[i]) perm[i] = j;
    y = transpose(b, y, perm);
    int64_t yd[HMAX];
    for (int i = 0; i < k; i++) yd[i] = t->shape[v.order[i]];
    yd[k] = 1;
    y = reshape(b, y, k + 1, yd);
    int64_t gd[HMAX], box0[HMAX], box1[HMAX];
    if (view_box(t, &v, n, gd, box0, box1)) { /* in place in the reshaped buffer */
        s->cur = reshape(b, update_slice(b, reshape(b, flat, k + 1, gd), y, box0), 1, &n);
        return;
    }
    int64_t s0 = k ? t->strides[v.order[0]] : 1, n0 = k ? t->shape[v.order[0]] : 1;
    int64_t end = t->offset + n0 * s0, st = t->offset;
    hv f = end > n ? pad_end(b, flat, end) : flat;
    hv region = slice(b, f, &st, &end);
    int64_t rd[HMAX], zero[HMAX] = {0};
    rd[0] = n0;
    for (int i = 1; i < k; i++) rd[i] = t->strides[v.order[i - 1]] / t->strides[v.order[i]];
    rd[k] = k ? t->strides[v.order[k - 1]] : 1;
    region = reshape(b, region, k + 1, rd);
    region = update_slice(b, region, y, zero);
    int64_t span = n0 * s0;
    region = reshape(b, region, 1, &span);
    f = update_slice(b, f, region, &st);
    if (end > n) {
        int64_t z0 = 0;
        f = slice(b, f, &z0, &n);
    }
    s->cur = f;
}

/* ---- float parameters as arguments ---------------------------------------------------------------- */

static hv scalar_arg(builder *b, float v) {
    return add_arg(b, (cdf_pjrt_arg){.kind = CDF_PJRT_ARG_F32, .value = v}, (hty){.dt = CDF_F32, .nd = 0});
}
/* a float parameter broadcast to t */
static hv param(builder *b, float v, const hty *t) { return splat(b, scalar_arg(b, v), t); }
static hv cst(builder *b, double v, const hty *t) { return splat(b, constant(b, t->dt, v), t); }

/* ---- elementwise ops -------------------------------------------------------------------------------- */

static hv unary_f32(builder *b, cdf_unary_op o, hv x, float p0, float p1) {
    const hty *t = &x.t;
    switch (o) {
    case CDF_UN_NEG: return op1(b, "negate", x);
    case CDF_UN_EXP: return op1(b, "exponential", x);
    case CDF_UN_LOG: return op1(b, "log", x);
    case CDF_UN_SQRT: return op1(b, "sqrt", x);
    case CDF_UN_RSQRT: return op1(b, "rsqrt", x);
    case CDF_UN_SQUARE: return op2(b, "multiply", x, x);
    case CDF_UN_ABS: return op1(b, "abs", x);
    case CDF_UN_SIGMOID: return op1(b, "logistic", x);
    case CDF_UN_TANH: return op1(b, "tanh", x);
    case CDF_UN_SILU: return op2(b, "multiply", x, op1(b, "logistic", x));
    case CDF_UN_GELU_ERF: {
        /* 0.5 x (1 + erf(x / sqrt 2)): erf through CHLO, which every plugin legalises */
        hv u = op2(b, "multiply", x, cst(b, 0.70710678118654752440, t));
        hv e = new_val(b, *t);
        begin_op(b, e);
        sb_printf(&b->body, "\"chlo.erf\"(%%v%d)", u.id);
        put_sig(b, 1, &u, t);
        return op2(b, "multiply", op2(b, "multiply", x, cst(b, 0.5, t)), op2(b, "add", e, cst(b, 1.0, t)));
    }
    case CDF_UN_GELU_TANH: {
        hv x3 = op2(b, "multiply", op2(b, "multiply", x, x), x);
        hv in = op2(b, "multiply", cst(b, 0.7978845608028654, t), op2(b, "add", x, op2(b, "multiply", cst(b, 0.044715, t), x3)));
        return op2(b, "multiply", op2(b, "multiply", x, cst(b, 0.5, t)), op2(b, "add", op1(b, "tanh", in), cst(b, 1.0, t)));
    }
    case CDF_UN_QUICK_GELU: return op2(b, "multiply", x, op1(b, "logistic", op2(b, "multiply", x, cst(b, 1.702, t))));
    case CDF_UN_RELU: return op2(b, "maximum", x, cst(b, 0.0, t));
    case CDF_UN_SIN: return op1(b, "sine", x);
    case CDF_UN_COS: return op1(b, "cosine", x);
    case CDF_UN_SCALE: return op2(b, "multiply", x, param(b, p0, t));
    case CDF_UN_ADD_SCALAR: return op2(b, "add", x, param(b, p0, t));
    case CDF_UN_AFFINE: return op2(b, "add", op2(b, "multiply", x, param(b, p0, t)), param(b, p1, t));
    case CDF_UN_CLAMP: return op2(b, "minimum", op2(b, "maximum", x, param(b, p0, t)), param(b, p1, t));
    case CDF_UN_POW: return op2(b, "power", x, param(b, p0, t));
    case CDF_UN_COUNT: break;
    }
    fail(b, CDF_ERR_UNSUPPORTED, "pjrt: unary op %d", (int)o);
    return x;
}

static const char *binary_name(cdf_binary_op o) {
    switch (o) {
    case CDF_BIN_ADD: return "add";
    case CDF_BIN_SUB: return "subtract";
    case CDF_BIN_MUL: return "multiply";
    case CDF_BIN_DIV: return "divide";
    case CDF_BIN_MAX: return "maximum";
    case CDF_BIN_MIN: return "minimum";
    case CDF_BIN_COUNT: break;
    }
    return "add";
}

/* rows of x [..., cols] (f32): mean over the last dim, kept as [..., 1] broadcast back */
static hv row_mean(builder *b, hv x) {
    int64_t last = x.t.nd - 1;
    hv s = reduce(b, x, 1, &last, "add", 0.0);
    hv m = op2(b, "divide", s, cst(b, (double)x.t.d[last], &s.t));
    return bcast_lead(b, m, &x.t);
}

/* LayerNorm (no affine) of x [..., cols] f32 as kernels.h computes it: biased variance */
static hv layer_norm(builder *b, hv x, float eps) {
    hv c = op2(b, "subtract", x, row_mean(b, x));
    hv var = row_mean(b, op2(b, "multiply", c, c));
    return op2(b, "multiply", c, op1(b, "rsqrt", op2(b, "add", var, cst(b, eps, &x.t))));
}

static hv read_f32(builder *b, const cdf_tensor *t) { return convert(b, read_view(b, t), CDF_F32); }

/* t read as a 2-d [rows, cols] f32 (a contiguous tensor) */
static hv read_rows(builder *b, const cdf_tensor *t, int64_t rows, int64_t cols) {
    int64_t d[2] = {rows, cols};
    return reshape(b, read_f32(b, t), 2, d);
}

static hv fused_chain(builder *b, const cdf_node *n) {
    const cdf_fused_program *p = n->p.fused.prog;
    const cdf_tensor *d = n->dst;
    hty t = ty(CDF_F32, d->ndim, d->shape);
    hv in[CDF_NODE_MAX_SRC];
    for (int i = 0; i < n->n_src; i++) {
        /* each input is an expanded view over dst's shape */
        in[i] = read_f32(b, n->src[i]);
        if (in[i].t.nd != t.nd) in[i] = reshape(b, in[i], t.nd, t.d);
    }
    hv v = in[0];
    if (p->norm_head) {
        int64_t cols = d->shape[d->ndim - 1], rows = cdf_shape_numel(d->ndim, d->shape) / (cols ? cols : 1);
        int64_t d2[2] = {rows, cols};
        v = reshape(b, layer_norm(b, reshape(b, in[0], 2, d2), p->norm_eps), t.nd, t.d);
    }
    for (int i = 0; i < p->n_steps; i++) {
        const cdf_fused_step *s = &p->steps[i];
        if (!s->binary) {
            v = unary_f32(b, (cdf_unary_op)s->op, v, s->p0, s->p1);
        } else {
            hv o = in[s->input];
            v = s->chain_rhs ? op2(b, binary_name((cdf_binary_op)s->op), o, v) : op2(b, binary_name((cdf_binary_op)s->op), v, o);
        }
    }
    return v;
}

/* ---- matmul, attention, convolution ------------------------------------------------------------------- */

/* the compute policy (kernels/dispatch.h): bf16 weights round f32 activations to bf16 */
static void matmul_operands(builder *b, hv *a, hv *w) {
    if (w->t.dt == CDF_BF16 && a->t.dt != CDF_BF16) *a = convert(b, convert(b, *a, CDF_F32), CDF_BF16);
    if (a->t.dt == CDF_BF16 && w->t.dt != CDF_BF16) *a = convert(b, *a, CDF_F32);
    if (a->t.dt != CDF_BF16) {
        *a = convert(b, *a, CDF_F32);
        *w = convert(b, *w, CDF_F32);
    }
}

/* the operand as [batch..., R, C], or as [R, C] (*shared) when it has no batch dims or every
 * batch dim is a broadcast (a weight) */
static hv matmul_operand(builder *b, const cdf_tensor *t, bool *shared) {
    *shared = true;
    for (int i = 0; i < t->ndim - 2; i++) *shared &= t->strides[i] == 0 || t->shape[i] == 1;
    if (!*shared || t->ndim == 2) return read_view(b, t);
    cdf_tensor m = *t;
    m.ndim = 2;
    m.shape[0] = t->shape[t->ndim - 2];
    m.shape[1] = t->shape[t->ndim - 1];
    m.strides[0] = t->strides[t->ndim - 2];
    m.strides[1] = t->strides[t->ndim - 1];
    return read_view(b, &m);
}

static hv lower_matmul(builder *b, const cdf_node *n) {
    const cdf_tensor *D = n->dst;
    const int nd = D->ndim, nb = nd - 2;
    bool as, ws;
    hv a = matmul_operand(b, n->src[0], &as), w = matmul_operand(b, n->src[1], &ws);
    matmul_operands(b, &a, &w);
    hv c;
    if (ws) {
        /* [batch..., M, K] . [K, N] -> [batch..., M, N] (a weight: no batch dims to carry) */
        c = dot(b, a, w, 0, NULL, NULL, a.t.nd - 1, 0);
    } else {
        if (as) { /* a shared left operand against a batched right one: broadcast it */
            int64_t dd[HMAX], map[2] = {nb, nb + 1};
            for (int i = 0; i < nb; i++) dd[i] = D->shape[i];
            dd[nb] = a.t.d[0];
            dd[nb + 1] = a.t.d[1];
            a = broadcast(b, a, nd, dd, map);
        }
        int64_t bd[HMAX];
        for (int i = 0; i < nb; i++) bd[i] = i;
        c = dot(b, a, w, nb, bd, bd, nd - 1, nd - 2);
    }
    if (c.t.nd != nd) { /* both operands shared: the one product broadcast over the batch */
        const hty full = ty(CDF_F32, nd, D->shape);
        c = bcast_trail(b, c, &full);
    }
    if (n->p.matmul.alpha != 1.0f) c = op2(b, "multiply", c, param(b, n->p.matmul.alpha, &c.t));
    if (n->src[2]) c = op2(b, "add", c, bcast_trail(b, read_f32(b, n->src[2]), &c.t));
    return c;
}

/* softmax(q k^T * scale + mask) v on values already in the compute dtype (the decomposition) */
static hv sdpa(builder *b, hv q, hv k, hv v, hv scale, const hv *mask, bool bf) {
    int64_t bd[2] = {0, 1};
    hv s = dot(b, q, k, 2, bd, bd, 3, 3); /* [B, H, Lq, Lk] */
    s = op2(b, "multiply", s, splat(b, scale, &s.t));
    if (mask) s = op2(b, "add", s, *mask);
    int64_t last = 3;
    hv mx = reduce(b, s, 1, &last, "maximum", -INFINITY);
    /* a fully masked row: its max is -inf; use 0 so exp gives 0 and the row sums to 0 */
    hv finite = compare(b, mx, splat(b, constant(b, CDF_F32, -INFINITY), &mx.t), "GT");
    mx = select3(b, finite, mx, splat(b, constant(b, CDF_F32, 0.0), &mx.t));
    if (bf) {
        /* the cpu policy (kernels.h): P = 2^(S log2(e) - M) for M the row max in log2 units
         * rounded UP to an integer, so that P's rounding to bf16 is the cpu backend's */
        hv l2e = splat(b, constant(b, CDF_F32, 1.4426950408889634), &mx.t);
        hv ln2 = splat(b, constant(b, CDF_F32, 0.6931471805599453), &mx.t);
        mx = op2(b, "multiply", op1(b, "ceil", op2(b, "multiply", mx, l2e)), ln2);
    }
    hv p = op1(b, "exponential", op2(b, "subtract", s, bcast_lead(b, mx, &s.t)));
    hv l = reduce(b, p, 1, &last, "add", 0.0);
    if (bf) p = convert(b, p, CDF_BF16);
    hv o = dot(b, p, v, 2, bd, bd, 3, 2); /* [B, H, Lq, Dv] */
    hv lz = compare(b, l, splat(b, constant(b, CDF_F32, 0.0), &l.t), "GT");
    l = select3(b, lz, l, splat(b, constant(b, CDF_F32, 1.0), &l.t));
    return op2(b, "divide", o, bcast_lead(b, l, &o.t));
}

/* Attention as a stablehlo.composite "cdiffusers.sdpa" whose decomposition (a private function)
 * is dot_general + softmax: every plugin runs the decomposition, and a plugin with its own
 * attention kernel can match the name instead. */
static hv lower_attention(builder *b, const cdf_node *n) {
    const cdf_tensor *Q = n->src[0], *K = n->src[1], *V = n->src[2], *M = n->n_src > 3 ? n->src[3] : NULL;
    const bool bf = Q->dtype == CDF_BF16 && K->dtype == CDF_BF16 && V->dtype == CDF_BF16;
    const cdf_dtype cdt = bf ? CDF_BF16 : CDF_F32;
    hv in[5];
    int ni = 0;
    in[ni++] = convert(b, read_view(b, Q), cdt);
    in[ni++] = convert(b, read_view(b, K), cdt);
    in[ni++] = convert(b, read_view(b, V), cdt);
    if (M) in[ni++] = read_f32(b, M);
    in[ni++] = scalar_arg(b, n->p.attention.scale);
    const int64_t od[4] = {Q->shape[0], Q->shape[1], Q->shape[2], V->shape[3]};
    const hty out_t = ty(CDF_F32, 4, od);
    /* the decomposition, written into the module's functions */
    sbuf body = b->body;
    b->body = (sbuf){0};
    hv p[5];
    for (int i = 0; i < ni; i++) p[i] = new_val(b, in[i].t);
    hv r = sdpa(b, p[0], p[1], p[2], p[ni - 1], M ? &p[3] : NULL, bf);
    const int fn = b->n_funcs++;
    sb_printf(&b->funcs, "  func.func private @sdpa_%d(", fn);
    for (int i = 0; i < ni; i++) {
        sb_printf(&b->funcs, "%s%%v%d: ", i ? ", " : "", p[i].id);
        put_type(&b->funcs, &p[i].t);
    }
    sb_printf(&b->funcs, ") -> ");
    put_type(&b->funcs, &r.t);
    sb_printf(&b->funcs, " {\n%.*s    \"func.return\"(%%v%d) : (", (int)b->body.n, b->body.p ? b->body.p : "", r.id);
    put_type(&b->funcs, &r.t);
    sb_printf(&b->funcs, ") -> ()\n  }\n");
    b->funcs.oom |= b->body.oom;
    free(b->body.p);
    b->body = body;
    char attrs[160];
    snprintf(attrs, sizeof attrs, "name = \"cdiffusers.sdpa\", composite_attributes = {}, decomposition = @sdpa_%d", fn);
    hv o = new_val(b, out_t);
    begin_op(b, o);
    sb_printf(&b->body, "\"stablehlo.composite\"");
    put_operands(b, ni, in);
    sb_printf(&b->body, " {%s}", attrs);
    put_sig(b, ni, in, &out_t);
    return o;
}

static hv lower_conv2d(builder *b, const cdf_node *n) {
    const cdf_conv2d_params *c = &n->p.conv.p;
    hv x = read_view(b, n->src[0]), w = read_view(b, n->src[1]);
    matmul_operands(b, &x, &w);
    const cdf_tensor *D = n->dst;
    hty t = ty(CDF_F32, 4, D->shape);
    char attrs[512];
    snprintf(attrs, sizeof attrs,
             "batch_group_count = 1 : i64, dimension_numbers = #stablehlo.conv<[b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1]>, "
             "feature_group_count = %lld : i64, lhs_dilation = array<i64: 1, 1>, "
             "padding = dense<[[%lld, %lld], [%lld, %lld]]> : tensor<2x2xi64>, rhs_dilation = array<i64: %lld, %lld>, "
             "window_strides = array<i64: %lld, %lld>%s",
             (long long)c->groups, (long long)c->pad_h, (long long)c->pad_h, (long long)c->pad_w, (long long)c->pad_w,
             (long long)c->dil_h, (long long)c->dil_w, (long long)c->stride_h, (long long)c->stride_w,
             x.t.dt == CDF_F32 ? ", precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]" : "");
    hv in[2] = {x, w};
    hv y = op(b, "convolution", t, 2, in, attrs);
    if (n->src[2]) {
        int64_t map[1] = {1};
        y = op2(b, "add", y, broadcast(b, read_f32(b, n->src[2]), 4, t.d, map));
    }
    return y;
}

/* ---- one node ---------------------------------------------------------------------------------------- */

static void lower_node(builder *b, const cdf_node *n) {
    const cdf_tensor *D = n->dst;
    hty dt32 = ty(CDF_F32, D->ndim, D->shape);
    hv r;
    switch (n->kind) {
    case CDF_OP_COPY: {
        hv x = read_view(b, n->src[0]);
        if (x.t.dt != D->dtype && (x.t.dt == CDF_F64 || D->dtype == CDF_F64) && D->dtype != CDF_F32 && x.t.dt != CDF_F32 &&
            cdf_dtype_is_float(D->dtype))
            x = convert(b, x, CDF_F32); /* through f32, as cdf_k_copy_strided */
        r = convert(b, x, D->dtype);
        break;
    }
    case CDF_OP_FILL: {
        /* a value a float holds is an argument (a new value does not recompile); others are text */
        const double v = n->p.fill.value;
        if (cdf_dtype_is_float(D->dtype) && isfinite(v) && (double)(float)v == v) {
            r = param(b, (float)v, &dt32);
        } else {
            cdf_dtype cdt = cdf_dtype_is_float(D->dtype) ? CDF_F64 : D->dtype;
            hty t = ty(cdt, D->ndim, D->shape);
            r = cst(b, v, &t);
            if (D->dtype == CDF_BF16 || D->dtype == CDF_F16) r = convert(b, r, CDF_F32); /* through f32, as the cpu fill */
        }
        break;
    }
    case CDF_OP_EMBEDDING: {
        const cdf_tensor *tab = n->src[0], *ids = n->src[1];
        cdf_pjrt_id_check *nc = realloc(b->checks, (size_t)(b->n_checks + 1) * sizeof *nc);
        if (!nc) {
            fail(b, CDF_ERR_OUT_OF_MEMORY, "out of host memory (program)");
            return;
        }
        b->checks = nc;
        b->checks[b->n_checks++] = (cdf_pjrt_id_check){.ids = *ids, .rows = tab->shape[0]};
        hv tv = read_view(b, tab);
        int64_t ni = cdf_shape_numel(ids->ndim, ids->shape);
        int64_t d2[2] = {ni, 1};
        hv iv = reshape(b, convert(b, read_view(b, ids), CDF_I64), 2, d2);
        int64_t od[2] = {ni, tab->shape[1]};
        char attrs[256];
        snprintf(attrs, sizeof attrs,
                 "dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], "
                 "index_vector_dim = 1>, slice_sizes = array<i64: 1, %lld>", (long long)tab->shape[1]);
        hv in[2] = {tv, iv};
        r = op(b, "gather", ty(tab->dtype, 2, od), 2, in, attrs);
        r = convert(b, r, CDF_F32);
        break;
    }
    case CDF_OP_UNARY: r = unary_f32(b, n->p.unary.op, read_f32(b, n->src[0]), n->p.unary.p0, n->p.unary.p1); break;
    case CDF_OP_BINARY:
        r = op2(b, binary_name(n->p.binary.op), read_f32(b, n->src[0]), read_f32(b, n->src[1]));
        break;
    case CDF_OP_MATMUL:
        if (n->p.matmul.epilogue) {
            fail(b, CDF_ERR_UNSUPPORTED, "pjrt: a matmul epilogue (XLA fuses by itself)");
            return;
        }
        r = lower_matmul(b, n);
        break;
    case CDF_OP_SOFTMAX: {
        hv x = read_rows(b, n->src[0], n->p.softmax.rows, n->p.softmax.cols);
        x = op2(b, "multiply", x, param(b, n->p.softmax.scale, &x.t));
        int64_t last = 1;
        hv mx = reduce(b, x, 1, &last, "maximum", -INFINITY);
        hv e = op1(b, "exponential", op2(b, "subtract", x, bcast_lead(b, mx, &x.t)));
        hv s = reduce(b, e, 1, &last, "add", 0.0);
        r = op2(b, "divide", e, bcast_lead(b, s, &e.t));
        break;
    }
    case CDF_OP_LAYER_NORM:
    case CDF_OP_RMS_NORM: {
        hv x = read_rows(b, n->src[0], n->p.norm.rows, n->p.norm.cols);
        if (n->kind == CDF_OP_LAYER_NORM) {
            r = layer_norm(b, x, n->p.norm.eps);
        } else {
            hv ms = row_mean(b, op2(b, "multiply", x, x));
            r = op2(b, "multiply", x, op1(b, "rsqrt", op2(b, "add", ms, cst(b, n->p.norm.eps, &x.t))));
        }
        if (n->src[1]) r = op2(b, "multiply", r, bcast_trail(b, read_f32(b, n->src[1]), &r.t));
        if (n->kind == CDF_OP_LAYER_NORM && n->n_src > 2 && n->src[2])
            r = op2(b, "add", r, bcast_trail(b, read_f32(b, n->src[2]), &r.t));
        break;
    }
    case CDF_OP_GROUP_NORM: {
        const int64_t N = n->p.group_norm.n, C = n->p.group_norm.c, S = n->p.group_norm.s, G = n->p.group_norm.groups;
        int64_t d3[3] = {N, G, C / G * S}, dc[3] = {N, C, S};
        hv x = reshape(b, read_f32(b, n->src[0]), 3, d3);
        r = reshape(b, layer_norm(b, x, n->p.group_norm.eps), 3, dc);
        int64_t map[1] = {1};
        if (n->src[1]) r = op2(b, "multiply", r, broadcast(b, read_f32(b, n->src[1]), 3, dc, map));
        if (n->n_src > 2 && n->src[2]) r = op2(b, "add", r, broadcast(b, read_f32(b, n->src[2]), 3, dc, map));
        break;
    }
    case CDF_OP_REDUCE: {
        const int64_t o = n->p.reduce.outer, red = n->p.reduce.red, in = n->p.reduce.inner;
        int64_t d3[3] = {o, red, in}, one = 1;
        hv x = reshape(b, read_f32(b, n->src[0]), 3, d3);
        switch (n->p.reduce.op) {
        case CDF_RED_SUM: r = reduce(b, x, 1, &one, "add", 0.0); break;
        case CDF_RED_MEAN: r = reduce(b, x, 1, &one, "add", 0.0), r = op2(b, "divide", r, cst(b, (double)red, &r.t)); break;
        case CDF_RED_VAR: {
            hv m = op2(b, "divide", reduce(b, x, 1, &one, "add", 0.0), cst(b, (double)red, &(hty){.dt = CDF_F32, .nd = 2, .d = {o, in}}));
            int64_t map[2] = {0, 2};
            hv c = op2(b, "subtract", x, broadcast(b, m, 3, d3, map));
            r = reduce(b, op2(b, "multiply", c, c), 1, &one, "add", 0.0);
            r = op2(b, "divide", r, cst(b, (double)red, &r.t));
            break;
        }
        case CDF_RED_MAX: r = reduce(b, x, 1, &one, "maximum", -INFINITY); break;
        case CDF_RED_MIN: r = reduce(b, x, 1, &one, "minimum", INFINITY); break;
        case CDF_RED_ARGMAX: {
            /* the first index holding the maximum: min over r of (x == max ? r : red) */
            hv xs = reshape(b, read_view(b, n->src[0]), 3, d3);
            xs = convert(b, xs, xs.t.dt == CDF_I64 || xs.t.dt == CDF_I32 ? xs.t.dt : CDF_F32);
            hv mx = reduce(b, xs, 1, &one, "maximum", xs.t.dt == CDF_F32 ? -INFINITY : xs.t.dt == CDF_I32 ? -2147483648.0 : -9.2e18);
            int64_t map[2] = {0, 2};
            hv eq = compare(b, xs, broadcast(b, mx, 3, d3, map), "EQ");
            hty it = ty(CDF_I64, 3, d3);
            hv idx = select3(b, eq, iota(b, it, 1), cst(b, (double)red, &it));
            r = reduce(b, idx, 1, &one, "minimum", (double)red);
            break;
        }
        }
        break;
    }
    case CDF_OP_CONV2D: r = lower_conv2d(b, n); break;
    case CDF_OP_UPSAMPLE: {
        const cdf_tensor *x = n->src[0];
        int64_t h = x->shape[x->ndim - 2], w = x->shape[x->ndim - 1], nc = h * w > 0 ? cdf_shape_numel(x->ndim, x->shape) / (h * w) : 0;
        int64_t fh = n->p.upsample.fh, fw = n->p.upsample.fw;
        int64_t d3[3] = {nc, h, w}, d5[5] = {nc, h, fh, w, fw}, map[3] = {0, 1, 3};
        hv v = reshape(b, read_f32(b, x), 3, d3);
        r = broadcast(b, v, 5, d5, map);
        break;
    }
    case CDF_OP_ATTENTION: r = lower_attention(b, n); break;
    case CDF_OP_ROPE: {
        const cdf_tensor *x = n->src[0];
        int64_t B = x->shape[0], H = x->shape[1], L = x->shape[2], Dd = x->shape[3];
        int64_t d5[5] = {B, H, L, Dd / 2, 2}, s0[5] = {0}, l0[5] = {B, H, L, Dd / 2, 1}, s1[5] = {0, 0, 0, 0, 1},
                l1[5] = {B, H, L, Dd / 2, 2};
        hv xv = read_f32(b, x);
        hv x5 = reshape(b, xv, 5, d5);
        hv xe = slice(b, x5, s0, l0), xo = slice(b, x5, s1, l1);
        hv rot = reshape(b, concat(b, op1(b, "negate", xo), xe, 4), 4, x->shape);
        int64_t map[2] = {2, 3};
        hv c = broadcast(b, read_f32(b, n->src[1]), 4, x->shape, map), s = broadcast(b, read_f32(b, n->src[2]), 4, x->shape, map);
        r = op2(b, "add", op2(b, "multiply", xv, c), op2(b, "multiply", rot, s));
        break;
    }
    case CDF_OP_TIMESTEP_EMB: {
        const int64_t dim = n->p.temb.dim, half = dim / 2, N = n->src[0]->shape[0];
        double fr[4096];
        if (half > 4096 || half < 1) {
            fail(b, CDF_ERR_UNSUPPORTED, "pjrt: timestep embedding of dim %lld", (long long)dim);
            return;
        }
        const float nlp = (float)(-log((double)n->p.temb.max_period));
        const float den = (float)((double)half - (double)n->p.temb.shift);
        for (int64_t k = 0; k < half; k++) fr[k] = (double)expf((nlp * (float)k) / den);
        hv f = const_vec(b, CDF_F32, half, fr);
        int64_t d2[2] = {N, half}, m0[1] = {0}, m1[1] = {1};
        hty t2 = ty(CDF_F32, 2, d2);
        hv tv = broadcast(b, reshape(b, read_f32(b, n->src[0]), 1, &(int64_t){N}), 2, d2, m0);
        hv arg = op2(b, "multiply", cst(b, n->p.temb.scale, &t2), op2(b, "multiply", tv, broadcast(b, f, 2, d2, m1)));
        hv a64 = convert(b, arg, CDF_F64);
        hv sn = convert(b, op1(b, "sine", a64), CDF_F32), cs = convert(b, op1(b, "cosine", a64), CDF_F32);
        r = n->p.temb.flip ? concat(b, cs, sn, 1) : concat(b, sn, cs, 1);
        if (dim % 2) {
            const int64_t dz[2] = {N, 1};
            const hty zt = ty(CDF_F32, 2, dz);
            r = concat(b, r, cst(b, 0.0, &zt), 1); /* an odd dim: a zero column, as diffusers pads */
        }
        break;
    }
    case CDF_OP_FUSED: r = fused_chain(b, n); break;
    case CDF_OP_ROPE_TABLE: {
        const cdf_tensor *pos = n->src[0];
        const int64_t rows = pos->shape[0];
        const int na = n->p.rope_table.n_axes;
        int64_t width = 0;
        for (int a = 0; a < na; a++) width += n->p.rope_table.axes_dim[a];
        if (width > 4096 || width < 2) {
            fail(b, CDF_ERR_UNSUPPORTED, "pjrt: rope table of width %lld", (long long)width);
            return;
        }
        /* per column: its axis and its frequency (each repeated twice), in f64 as torch */
        double fr[4096], col_axis[4096];
        int64_t c0 = 0;
        for (int a = 0; a < na; a++) {
            const int64_t dim = n->p.rope_table.axes_dim[a];
            for (int64_t k = 0; k < dim / 2; k++) {
                fr[c0 + 2 * k] = fr[c0 + 2 * k + 1] = 1.0 / pow(n->p.rope_table.theta, (double)(2 * k) / (double)dim);
                col_axis[c0 + 2 * k] = col_axis[c0 + 2 * k + 1] = a;
            }
            c0 += dim;
        }
        hv pv = convert(b, read_view(b, pos), CDF_F64); /* [rows, n_axes] */
        /* each column's position: pos[:, axis(c)], as a masked sum over the axes (exact in f64) */
        int64_t d2[2] = {rows, width};
        hty t64 = ty(CDF_F64, 2, d2);
        hv acc = cst(b, 0.0, &t64);
        for (int a = 0; a < na; a++) {
            int64_t st[2] = {0, a}, li[2] = {rows, a + 1};
            hv col = reshape(b, slice(b, pv, st, li), 1, &(int64_t){rows});
            int64_t m0[1] = {0}, m1[1] = {1};
            double mask[4096];
            for (int64_t c = 0; c < width; c++) mask[c] = col_axis[c] == a ? 1.0 : 0.0;
            hv mk = broadcast(b, const_vec(b, CDF_F64, width, mask), 2, d2, m1);
            acc = op2(b, "add", acc, op2(b, "multiply", broadcast(b, col, 2, d2, m0), mk));
        }
        int64_t m1[1] = {1};
        hv ang = op2(b, "multiply", acc, broadcast(b, const_vec(b, CDF_F64, width, fr), 2, d2, m1));
        hv c = convert(b, op1(b, "cosine", ang), CDF_F32), s = convert(b, op1(b, "sine", ang), CDF_F32);
        int64_t d3[3] = {1, rows, width};
        r = concat(b, reshape(b, c, 3, d3), reshape(b, s, 3, d3), 0);
        break;
    }
    case CDF_OP_ALL_REDUCE:
        if (n->p.all_reduce.replicas < 2) {
            fail(b, CDF_ERR_UNSUPPORTED, "pjrt: all_reduce over processes inside a program (it runs on the host between programs)");
            return;
        }
        r = all_reduce(b, convert(b, read_view(b, n->src[0]), D->dtype), n->p.all_reduce.replicas);
        break;
    case CDF_OP_MATMUL_Q:
        fail(b, CDF_ERR_UNSUPPORTED, "pjrt: a GGUF-quantized matmul (weights are dequantized at load on this backend)");
        return;
    default:
        fail(b, CDF_ERR_UNSUPPORTED, "pjrt: op kind %d", (int)n->kind);
        return;
    }
    if (b->err) return;
    if (r.t.nd != D->ndim || numel(&r.t) != cdf_shape_numel(D->ndim, D->shape)) {
        if (numel(&r.t) != cdf_shape_numel(D->ndim, D->shape)) {
            fail(b, CDF_ERR_INTERNAL, "pjrt: %s lowered to %lld elements for a %lld-element destination", cdf_op_name(n->kind),
                 (long long)numel(&r.t), (long long)cdf_shape_numel(D->ndim, D->shape));
            return;
        }
    }
    r = reshape(b, r, D->ndim, D->shape);
    write_view(b, D, r);
}

/* ---- the program ------------------------------------------------------------------------------------- */

bool cdf_pjrt_program_supports(const cdf_node *n) {
    switch (n->kind) {
    case CDF_OP_ALL_REDUCE:
    case CDF_OP_MATMUL_Q: return false;
    case CDF_OP_MATMUL: return n->p.matmul.epilogue == NULL;
    default: return n->kind < CDF_OP_COUNT;
    }
}

static bool is_result(const storage_state *s) { return s->written && !s->internal; }

static void put_results(sbuf *s, const builder *b, bool types) {
    int k = 0;
    for (int i = 0; i < b->n_ss; i++) {
        if (!is_result(&b->ss[i])) continue;
        sb_printf(s, "%s", k++ ? ", " : "");
        if (types) put_type(s, &b->ss[i].cur.t);
        else sb_printf(s, "%%v%d", b->ss[i].cur.id);
    }
}

static cdf_status finish(builder *b, cdf_pjrt_program *out) {
    sbuf s = {0};
    sb_printf(&s, "module @cdiffusers {\n  func.func public @main(");
    for (int i = 0; i < b->n_args; i++) {
        sb_printf(&s, "%s%%v%d: ", i ? ", " : "", b->arg_id[i]);
        put_type(&s, &b->arg_ty[i]);
    }
    sb_printf(&s, ") -> (");
    put_results(&s, b, true);
    sb_printf(&s, ") {\n%.*s    \"func.return\"(", (int)b->body.n, b->body.p ? b->body.p : "");
    put_results(&s, b, false);
    sb_printf(&s, ") : (");
    put_results(&s, b, true);
    sb_printf(&s, ") -> ()\n  }\n%.*s}\n", (int)b->funcs.n, b->funcs.p ? b->funcs.p : "");
    int n_out = 0;
    for (int i = 0; i < b->n_ss; i++) n_out += is_result(&b->ss[i]);
    out->outs = calloc((size_t)(n_out ? n_out : 1), sizeof *out->outs);
    if (s.oom || !out->outs) {
        free(s.p);
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (program text)");
    }
    out->text = s.p;
    out->len = s.n;
    out->args = b->args;
    out->n_args = b->n_args;
    b->args = NULL;
    out->checks = b->checks;
    out->n_checks = b->n_checks;
    b->checks = NULL;
    for (int i = 0; i < b->n_ss; i++)
        if (is_result(&b->ss[i]))
            out->outs[out->n_outs++] = (cdf_pjrt_out){.st = b->ss[i].st, .dt = b->ss[i].cur.t.dt, .n = b->ss[i].cur.t.d[0]};
    return CDF_OK;
}

static void builder_free(builder *b) {
    free(b->body.p);
    free(b->args);
    free(b->arg_ty);
    free(b->arg_id);
    free(b->ss);
    free(b->checks);
    free(b->funcs.p);
}

cdf_status cdf_pjrt_program_build(cdf_node *const *nodes, int n, cdf_pjrt_internal_fn internal, void *ctx,
                                  cdf_pjrt_program *out) {
    memset(out, 0, sizeof *out);
    builder b = {.internal = internal, .ctx = ctx};
    for (int i = 0; i < n && b.err == CDF_OK; i++) {
        lower_node(&b, nodes[i]);
        if (b.err != CDF_OK) cdf_error(b.err, "%s (node %d of %d): %s", cdf_op_name(nodes[i]->kind), i, n, b.why);
    }
    cdf_status s = b.err;
    if (s == CDF_OK && (b.body.oom || b.funcs.oom)) s = cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (program text)");
    if (s == CDF_OK) s = finish(&b, out);
    if (s != CDF_OK) cdf_pjrt_program_free(out);
    builder_free(&b);
    return s;
}

cdf_status cdf_pjrt_program_bitcast(cdf_dtype from, int64_t n_from, cdf_dtype to, int64_t n_to, cdf_pjrt_program *out) {
    memset(out, 0, sizeof *out);
    builder b = {0};
    hv x = add_arg(&b, (cdf_pjrt_arg){.kind = CDF_PJRT_ARG_STORAGE, .dt = from, .n = n_from}, ty1(from, n_from));
    hv y = retype(&b, x, to);
    cdf_status s = b.err != CDF_OK ? cdf_error(b.err, "%s", b.why) : CDF_OK;
    if (s == CDF_OK && y.t.d[0] != n_to) s = cdf_error(CDF_ERR_INTERNAL, "pjrt: bitcast to %lld elements, not %lld", (long long)y.t.d[0], (long long)n_to);
    if (s == CDF_OK) {
        b.n_ss = 0;
        storage_state st = {.has_value = true, .cur = y, .written = true};
        b.ss = malloc(sizeof st);
        if (!b.ss) s = cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
        else {
            b.ss[0] = st;
            b.n_ss = b.cap_ss = 1;
            s = finish(&b, out);
        }
    }
    builder_free(&b);
    return s;
}

void cdf_pjrt_program_free(cdf_pjrt_program *p) {
    free(p->text);
    free(p->args);
    free(p->outs);
    free(p->checks);
    memset(p, 0, sizeof *p);
}
