/* The device-parametrised op suite (in the spirit of ggml's test-backend-ops): every op of the
 * tensor API, over a table of cases (ragged and empty shapes, broadcasting, transposed / strided /
 * permuted / expanded operands, f32 / bf16 / f16 / i32 / i64, op parameters), runs on every
 * registered device and is compared with the reference kernels of src/kernels called directly on
 * host copies of the same inputs. A new backend gets its whole correctness check from this file.
 *
 * Only the public tensor API touches devices: inputs go up with cdf_tensor_from_host (then views
 * are taken on the device), results come back with cdf_tensor_read, so the suite also runs with
 * CDIFFUSERS_CPU_DISCRETE=1 and in every execution mode (with CDIFFUSERS_COMPILE set, each op is
 * captured into a graph and replayed: run_compiled below). CDIFFUSERS_TEST_DEVICE=NAME (a backend
 * type such as "cuda", or a device such as "cpu:0") restricts it to one device; a name that
 * matches nothing fails the suite rather than passing it empty.
 *
 * The reference is the plain C kernel (cdf_k_* without _dispatch; for unary ops the scalar
 * definition, cdf_k_unary_span_at(GENERIC)), run with the same storage dtypes as the device op,
 * so a threshold only has to cover differences of implementation (summation order, vectorised
 * transcendental functions, a result that lands on the other side of a bf16 rounding boundary),
 * never the storage format. Where the tensor API defines a compute policy (a bf16 weight rounds
 * f32 activations to bf16 at a matmul / conv input, kernels/dispatch.h) the reference applies it
 * to its host copy first. The comparison is the normalised MSE sum((a - b)^2) / sum(b^2); ops
 * that only move or select data must match exactly. One row per case is printed:
 *   device  op  case  dtype  nmse  threshold  ok|FAIL
 * and each test (one per op family) fails if any of its rows did, after printing all of them.
 *
 * Op kinds (graph/node.h) and where they are exercised: COPY (contiguous, cast, cat, pad),
 * FILL (full, zeros, pad borders), EMBEDDING, UNARY (every unary op of the API), BINARY,
 * MATMUL (matmul, linear), SOFTMAX, LAYER_NORM, RMS_NORM, GROUP_NORM, REDUCE (sum, mean, var,
 * max, argmax), CONV2D, UPSAMPLE, ATTENTION (sdpa), ROPE, TIMESTEP_EMB, ROPE_TABLE, FUSED (a chain
 * run under defer-and-fuse whatever the mode, checked to have fused). ALL_REDUCE needs a group of
 * several processes: here only its group-of-one form (the identity) runs; the collective itself is
 * test_dist's, under mpirun. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdiffusers/dist.h"
#include "cdiffusers/exec.h"
#include "cdiffusers/io.h"
#include "cdiffusers/tensor.h"
#include "compile/compile.h"
#include "nn/nn.h"
#include "kernels/kernels.h"
#include "kernels/reference_internal.h" /* cdf_k_unary_span_at: the scalar unary definitions */

/* ---- thresholds (normalised MSE) ---------------------------------------------------------------
 * Exact (0): copies, casts, fill, embedding, upsample, max and argmax: they only move, convert
 * (round-to-nearest-even, defined bit for bit) or select values.
 * f32 results: THR_EW for elementwise ops (IEEE + - * / are correctly rounded; the vectorised
 * sigmoid family is a few ulps from libm, nmse ~1e-14), THR_ACC for everything that accumulates
 * in f32 (matmul, conv, norms, softmax, reductions, attention: another summation order or a tiled
 * online softmax moves results by ~sqrt(n) ulps, nmse ~1e-13 for our sizes). A wrong operand,
 * stride, broadcast, parameter (eps, scale, groups, padding) or a bf16 intermediate gives 1e-6
 * or more (the eps cases use eps large enough to matter, see each table).
 * bf16 / f16 results: the values the device and the reference compute in f32 differ by a few ulps,
 * and an element whose f32 value lands on the other side of a rounding boundary is stored one
 * bf16 ulp (2^-8..2^-7 relative) or f16 ulp (2^-11..2^-10) away: that happens to a small fraction
 * of elements, and the threshold allows a few percent of them (every element off by one ulp
 * would be ~3e-5 for bf16, ~5e-7 for f16, so a truncating store or bf16 arithmetic fails).
 * The f32 thresholds also mean that a backend must compute f32 operands in f32 (kernels.h): TF32
 * matmuls (10-bit mantissas) land near 1e-7 and fail, as they should. */
#define THR_EXACT 0.0
#define THR_EW 1e-12
#define THR_ACC 1e-10
#define THR_BF16 1e-6
#define THR_F16 1e-8

static double thr_for(cdf_dtype out, double f32_thr) {
    if (f32_thr == THR_EXACT) return THR_EXACT;
    if (out == CDF_BF16) return f32_thr > THR_BF16 ? f32_thr : THR_BF16;
    if (out == CDF_F16) return f32_thr > THR_F16 ? f32_thr : THR_F16;
    return f32_thr;
}

/* ---- devices -------------------------------------------------------------------------------- */

static cdf_device *g_devs[16];
static bool g_compile; /* CDIFFUSERS_COMPILE set: ops are captured and replayed (run_compiled) */
static int g_ndev;

static int setup_devices(void **state) {
    (void)state;
    const char *want = getenv("CDIFFUSERS_TEST_DEVICE"), *comp = getenv("CDIFFUSERS_COMPILE");
    g_compile = comp && *comp && strcmp(comp, "0") != 0;
    if (g_compile) printf("compile mode: every op is captured with decoy inputs and replayed with the case's\n");
    /* a lazily loaded backend (pjrt) registers its devices when first asked for */
    if (want && *want) (void)cdf_device_get(want);
    for (int i = 0; i < cdf_device_count() && g_ndev < 16; i++) {
        cdf_device *d = cdf_device_at(i);
        cdf_device_info info;
        if (cdf_device_get_info(d, &info) != CDF_OK) return -1;
        if (want && *want && strcmp(want, info.type) != 0 && strcmp(want, cdf_device_name(d)) != 0) continue;
        g_devs[g_ndev++] = d;
        printf("device %s: %s [%s]\n", cdf_device_name(d), info.description, info.features);
    }
    if (g_ndev == 0) {
        fprintf(stderr, "test_backend_ops: no registered device matches CDIFFUSERS_TEST_DEVICE=%s\n", want ? want : "");
        return -1;
    }
    return 0;
}

/* ---- per-case bookkeeping: temporaries, rows, failures -------------------------------------- */

static void *g_tmp[512];
static int g_ntmp;
static int g_fail, g_rows;
static cdf_device *g_dev; /* the device of the current case */

static void *tmp(size_t bytes) {
    assert_true(g_ntmp < 512);
    void *p = calloc(1, bytes ? bytes : 1);
    assert_non_null(p);
    return g_tmp[g_ntmp++] = p;
}

static void case_begin(void) { cdf_scope_push(); }
static void case_end(void) {
    cdf_scope_pop(NULL, 0);
    for (int i = 0; i < g_ntmp; i++) free(g_tmp[i]);
    g_ntmp = 0;
}

static int64_t numel(int nd, const int64_t *s) {
    int64_t n = 1;
    for (int i = 0; i < nd; i++) n *= s[i];
    return n;
}

static void cstrides(int nd, const int64_t *s, int64_t *st) {
    int64_t acc = 1;
    for (int i = nd - 1; i >= 0; i--) {
        st[i] = acc;
        acc *= s[i];
    }
}

/* "[17,65]" in a rotating static buffer */
static const char *shp(int nd, const int64_t *s) {
    static char buf[8][64];
    static int slot;
    char *b = buf[slot++ & 7];
    int k = snprintf(b, 64, "[");
    for (int i = 0; i < nd; i++) k += snprintf(b + k, (size_t)(64 - k), i ? ",%lld" : "%lld", (long long)s[i]);
    snprintf(b + k, (size_t)(64 - k), "]");
    return b;
}

static void row(const char *op, const char *cs, cdf_dtype dt, double nmse, double thr, bool ok, const char *note) {
    g_rows++;
    if (!ok) g_fail++;
    printf("  %-7s %-11s %-52s %-4s nmse=%-10.3e thr=%-8.1e %s%s%s\n", cdf_device_name(g_dev), op, cs, cdf_dtype_name(dt),
           nmse, thr, ok ? "ok" : "FAIL", note ? "  " : "", note ? note : "");
}

/* Compare a device result with the reference values (f32, logical order): shape, dtype, then
 * exact equality (thr 0) or nmse <= thr. Empty results compare shapes only. */
static void check(const char *op, const char *cs, cdf_tensor *got, cdf_dtype want_dt, int nd, const int64_t *shape,
                  const float *ref, double thr) {
    if (!got) {
        row(op, cs, want_dt, NAN, thr, false, cdf_last_error());
        return;
    }
    bool same_shape = cdf_tensor_ndim(got) == nd && cdf_tensor_dtype(got) == want_dt;
    for (int i = 0; same_shape && i < nd; i++) same_shape = cdf_tensor_shape(got)[i] == shape[i];
    if (!same_shape) {
        char d[96], msg[160];
        snprintf(msg, sizeof msg, "got %s, want %s %s", cdf_tensor_describe(got, d, sizeof d), shp(nd, shape),
                 cdf_dtype_name(want_dt));
        row(op, cs, want_dt, NAN, thr, false, msg);
        return;
    }
    int64_t n = numel(nd, shape);
    float *a = tmp((size_t)n * sizeof *a);
    cdf_status s = cdf_tensor_read(got, CDF_F32, a, (size_t)n * sizeof *a);
    if (s != CDF_OK) {
        row(op, cs, want_dt, NAN, thr, false, cdf_last_error());
        return;
    }
    double num = 0, den = 0;
    bool exact = true;
    for (int64_t i = 0; i < n; i++) {
        bool same = a[i] == ref[i] || (isnan(a[i]) && isnan(ref[i])); /* equal infinities, NaN where NaN is due */
        if (!same) exact = false;
        double d = same ? 0.0 : (double)a[i] - (double)ref[i];
        num += d * d;
        if (isfinite(ref[i])) den += (double)ref[i] * ref[i];
    }
    double nmse = den > 0 ? num / den : num;
    bool ok = thr == THR_EXACT ? exact : nmse <= thr;
    row(op, cs, want_dt, nmse, thr, ok, n == 0 ? "(empty)" : NULL);
}

/* ---- deterministic inputs -------------------------------------------------------------------- */

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static float urand(float lo, float hi) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return lo + (hi - lo) * (float)((g_rng >> 40) * (1.0 / 16777216.0));
}

/* v rounded to what dtype dt stores (the values the device holds after the upload) */
static void round_to(float *v, int64_t n, cdf_dtype dt) {
    for (int64_t i = 0; i < n; i++) {
        uint64_t cell = 0;
        cdf_k_st(&cell, dt, 0, v[i]);
        v[i] = cdf_k_ld(&cell, dt, 0);
    }
}

/* n values uniform in [lo, hi), exactly representable in dt (integers for integer dtypes) */
static float *rnd(int64_t n, float lo, float hi, cdf_dtype dt) {
    float *v = tmp((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = urand(lo, hi);
    if (dt == CDF_I32 || dt == CDF_I64)
        for (int64_t i = 0; i < n; i++) v[i] = floorf(v[i]);
    round_to(v, n, dt);
    return v;
}

/* host f32 values as a buffer of dtype dt (for the reference kernels) and back */
static void *typed(const float *v, int64_t n, cdf_dtype dt) {
    void *p = tmp((size_t)n * cdf_dtype_size(dt));
    cdf_convert(p, dt, v, CDF_F32, (size_t)n);
    return p;
}
static float *as_f32(const void *p, cdf_dtype dt, int64_t n) {
    float *v = tmp((size_t)n * sizeof *v);
    cdf_convert(v, CDF_F32, p, dt, (size_t)n);
    return v;
}

/* ---- device operands with a layout ------------------------------------------------------------
 * The device tensor holds the logical values v (contiguous, shape) but is a view of a buffer laid
 * out differently: TRANS stores the last two dims swapped and transposes them back, PERM stores a
 * 4-D [a,b,c,d] as [a,c,b,d] (the [B, L, H, D] -> [B, H, L, D] of attention), STRIDED keeps every
 * element of the last dim at odd positions of a buffer twice as wide (offset 1, stride 2, the rest
 * a sentinel that would show if read). Expanded operands: up_expand. */
typedef enum layout { CONTIG, TRANS, PERM, STRIDED } layout;
static const char *const k_layout[] = {"", " T", " perm", " strided"};

static cdf_tensor *up(cdf_dtype dt, int nd, const int64_t *shape, const float *v, layout L) {
    if (L == CONTIG || (L == TRANS && nd < 2) || (L == PERM && nd != 4))
        return cdf_tensor_from_host(g_dev, dt, nd, shape, v, CDF_F32);
    int64_t sshape[CDF_MAX_DIMS], cs[CDF_MAX_DIMS], dst_st[CDF_MAX_DIMS], vst[CDF_MAX_DIMS];
    memcpy(sshape, shape, (size_t)nd * sizeof *shape);
    cstrides(nd, shape, vst);
    int64_t n = numel(nd, shape);
    if (L == STRIDED) {
        sshape[nd - 1] = 2 * shape[nd - 1] + 1;
        cstrides(nd, sshape, cs);
        int64_t sn = numel(nd, sshape);
        float *s = tmp((size_t)sn * sizeof *s);
        for (int64_t i = 0; i < sn; i++) s[i] = 777.0f;
        memcpy(dst_st, cs, sizeof cs);
        dst_st[nd - 1] *= 2;
        if (n) assert_int_equal(cdf_k_copy_strided(s + 1, CDF_F32, dst_st, v, CDF_F32, vst, nd, shape), CDF_OK);
        cdf_tensor *st = cdf_tensor_from_host(g_dev, dt, nd, sshape, s, CDF_F32);
        return cdf_slice(st, nd - 1, 1, 1 + 2 * shape[nd - 1], 2);
    }
    int perm[CDF_MAX_DIMS];
    for (int i = 0; i < nd; i++) perm[i] = i;
    if (L == TRANS) {
        perm[nd - 2] = nd - 1;
        perm[nd - 1] = nd - 2;
    } else {
        perm[1] = 2;
        perm[2] = 1;
    }
    for (int i = 0; i < nd; i++) sshape[perm[i]] = shape[i];
    cstrides(nd, sshape, cs);
    for (int i = 0; i < nd; i++) dst_st[i] = cs[perm[i]];
    float *s = tmp((size_t)n * sizeof *s);
    if (n) assert_int_equal(cdf_k_copy_strided(s, CDF_F32, dst_st, v, CDF_F32, vst, nd, shape), CDF_OK);
    cdf_tensor *st = cdf_tensor_from_host(g_dev, dt, nd, sshape, s, CDF_F32);
    return cdf_permute(st, perm);
}

/* v (shape bshape, nb dims) broadcast to shape (nd dims, leading dims added) on the host */
static float *bcast(const float *v, int nb, const int64_t *bshape, int nd, const int64_t *shape) {
    int64_t st[CDF_MAX_DIMS], bst[CDF_MAX_DIMS], dst[CDF_MAX_DIMS];
    cstrides(nb, bshape, bst);
    for (int i = 0; i < nd; i++) {
        int j = i - (nd - nb);
        st[i] = (j >= 0 && bshape[j] != 1) ? bst[j] : 0;
    }
    int64_t n = numel(nd, shape);
    float *out = tmp((size_t)n * sizeof *out);
    cstrides(nd, shape, dst);
    if (n) assert_int_equal(cdf_k_copy_strided(out, CDF_F32, dst, v, CDF_F32, st, nd, shape), CDF_OK);
    return out;
}

/* The device view expand(upload(v: bshape), shape) (stride 0 on the broadcast dims). */
static cdf_tensor *up_expand(cdf_dtype dt, int nb, const int64_t *bshape, const float *v, int nd, const int64_t *shape) {
    cdf_tensor *b = cdf_tensor_from_host(g_dev, dt, nb, bshape, v, CDF_F32);
    return cdf_expand(b, nd, shape);
}

/* a contiguous host copy with dims d0 and d1 swapped (out shape in oshape) */
static float *host_swap(const float *v, int nd, const int64_t *shape, int d0, int d1, int64_t *oshape) {
    int64_t st[CDF_MAX_DIMS] = {0}, dst[CDF_MAX_DIMS];
    memcpy(oshape, shape, (size_t)nd * sizeof *shape);
    oshape[d0] = shape[d1];
    oshape[d1] = shape[d0];
    cstrides(nd, shape, st);
    int64_t t = st[d0];
    st[d0] = st[d1];
    st[d1] = t;
    cstrides(nd, oshape, dst);
    int64_t n = numel(nd, shape);
    float *out = tmp((size_t)n * sizeof *out);
    if (n) assert_int_equal(cdf_k_copy_strided(out, CDF_F32, dst, v, CDF_F32, st, nd, oshape), CDF_OK);
    return out;
}

typedef struct unary_def {
    const char *name;
    cdf_unary_op op;
    float p0, p1, lo, hi; /* parameters; input range (positive where the op needs it) */
} unary_def;

static cdf_tensor *apply_unary(const unary_def *u, cdf_tensor *x) {
    switch (u->op) {
    case CDF_UN_NEG: return cdf_neg(x);
    case CDF_UN_EXP: return cdf_exp(x);
    case CDF_UN_LOG: return cdf_log(x);
    case CDF_UN_SQRT: return cdf_sqrt(x);
    case CDF_UN_RSQRT: return cdf_rsqrt(x);
    case CDF_UN_SIGMOID: return cdf_sigmoid(x);
    case CDF_UN_TANH: return cdf_tanh(x);
    case CDF_UN_SILU: return cdf_silu(x);
    case CDF_UN_RELU: return cdf_relu(x);
    case CDF_UN_GELU_ERF: return cdf_gelu(x, CDF_GELU_ERF);
    case CDF_UN_GELU_TANH: return cdf_gelu(x, CDF_GELU_TANH);
    case CDF_UN_QUICK_GELU: return cdf_quick_gelu(x);
    case CDF_UN_SCALE: return cdf_scale(x, u->p0);
    case CDF_UN_ADD_SCALAR: return cdf_add_scalar(x, u->p0);
    case CDF_UN_AFFINE: return cdf_affine(x, u->p0, u->p1);
    case CDF_UN_CLAMP: return cdf_clamp(x, u->p0, u->p1);
    default: fail_msg("unary op %d has no tensor API call", (int)u->op); return NULL;
    }
}

static cdf_tensor *apply_binary(cdf_binary_op op, cdf_tensor *a, cdf_tensor *b) {
    switch (op) {
    case CDF_BIN_ADD: return cdf_add(a, b);
    case CDF_BIN_SUB: return cdf_sub(a, b);
    case CDF_BIN_MUL: return cdf_mul(a, b);
    case CDF_BIN_DIV: return cdf_div(a, b);
    case CDF_BIN_MAX: return cdf_maximum(a, b);
    default: fail_msg("binary op %d has no tensor API call", (int)op); return NULL;
    }
}

/* ---- running an op: eagerly, or captured and replayed (compile modes) ---------------------------
 * Each case describes its tensor API call as a `call` (the API function, its operands, its
 * parameters). Eager and defer-and-fuse run it as is. With CDIFFUSERS_COMPILE set (any value
 * but 0, as scripts/test.sh runs the suite) the call is captured into a graph (compile/compile.h,
 * fullgraph) with decoy operands of the same shapes and dtypes but other values, and then
 * replayed with the case's operands: the result compared with the reference is the replay's, so
 * the capture, the memory planner's arena and the rebinding of the inputs are checked too (a
 * replay that kept the decoys' values, or a graph break, fails the case). The compile path makes
 * its inputs contiguous before the capture, so the operand layouts are the eager runs' to test. */
typedef enum api {
    A_CONTIGUOUS, A_CAST, A_CAT, A_PAD, A_ALL_REDUCE, A_FULL, A_EMBEDDING, A_UNARY, A_BINARY, A_MATMUL, A_LINEAR,
    A_LINEAR_Q, A_SOFTMAX, A_LAYER_NORM, A_RMS_NORM, A_GROUP_NORM, A_REDUCE, A_CONV2D, A_UPSAMPLE, A_SDPA, A_ROPE, A_ROPE_TABLES,
    A_TIMESTEP_EMB
} api;

typedef struct call {
    api what;
    int n_in;
    cdf_tensor *in[4]; /* NULL = an absent optional operand */
    cdf_dtype dt;      /* cast / full; rope, rms_norm: the result dtype (0: x's) */
    int nd;            /* full */
    const int64_t *shape, *ints; /* full shape; pad widths, rope axes */
    double value;      /* full / pad value, rope theta */
    int dim, i0, i1;   /* dim; groups, upsample factors, embedding dim, axes */
    bool keep, flag;
    float f0, f1, f2;  /* eps, scale, shift, max period */
    const unary_def *u;
    cdf_binary_op bop;
    cdf_reduce_op rop;
    const cdf_conv2d_params *conv;
    cdf_process_group *pg;
} call;

static cdf_status invoke(const call *c, cdf_tensor *const *in, cdf_tensor **out) {
    out[0] = out[1] = NULL;
    switch (c->what) {
    case A_CONTIGUOUS: out[0] = cdf_contiguous(in[0]); break;
    case A_CAST: out[0] = cdf_cast(in[0], c->dt); break;
    case A_CAT: out[0] = cdf_cat(in, c->n_in, c->dim); break;
    case A_PAD: out[0] = cdf_pad(in[0], c->i0, c->ints, c->value); break;
    case A_ALL_REDUCE: out[0] = cdf_all_reduce_sum(in[0], c->pg); break;
    case A_FULL:
        out[0] = c->value == 0.0 ? cdf_tensor_zeros(g_dev, c->dt, c->nd, c->shape) : cdf_tensor_full(g_dev, c->dt, c->nd, c->shape, c->value);
        break;
    case A_EMBEDDING: out[0] = cdf_embedding(in[0], in[1]); break;
    case A_UNARY: out[0] = apply_unary(c->u, in[0]); break;
    case A_BINARY: out[0] = apply_binary(c->bop, in[0], in[1]); break;
    case A_MATMUL: out[0] = cdf_matmul(in[0], in[1]); break;
    case A_LINEAR: out[0] = cdf_linear(in[0], in[1], in[2]); break;
    case A_LINEAR_Q: out[0] = cdf_linear_quantized(in[0], in[1], (uint32_t)c->i0, c->i1, c->dt, in[2]); break;
    case A_SOFTMAX: out[0] = cdf_softmax(in[0], c->dim); break;
    case A_LAYER_NORM: out[0] = cdf_layer_norm(in[0], in[1], in[2], c->f0); break;
    case A_RMS_NORM: out[0] = c->dt ? cdf_rms_norm_as(in[0], in[1], c->f0, c->dt) : cdf_rms_norm(in[0], in[1], c->f0); break;
    case A_GROUP_NORM: out[0] = cdf_group_norm(in[0], c->i0, in[1], in[2], c->f0); break;
    case A_REDUCE:
        switch (c->rop) {
        case CDF_RED_SUM: out[0] = cdf_sum(in[0], c->dim, c->keep); break;
        case CDF_RED_MEAN: out[0] = cdf_mean(in[0], c->dim, c->keep); break;
        case CDF_RED_VAR: out[0] = cdf_var(in[0], c->dim, c->keep); break;
        case CDF_RED_MAX: out[0] = cdf_max(in[0], c->dim, c->keep); break;
        default: out[0] = cdf_argmax(in[0], c->dim, c->keep); break;
        }
        break;
    case A_CONV2D: out[0] = cdf_conv2d(in[0], in[1], in[2], c->conv); break;
    case A_UPSAMPLE: out[0] = cdf_upsample_nearest(in[0], c->i0, c->i1); break;
    case A_SDPA: out[0] = cdf_sdpa(in[0], in[1], in[2], in[3], c->f0); break;
    case A_ROPE: out[0] = c->dt ? cdf_rope_as(in[0], in[1], in[2], c->dt) : cdf_rope(in[0], in[1], in[2]); break;
    case A_ROPE_TABLES: return cdf_rope_tables(in[0], c->i0, c->ints, c->value, &out[0], &out[1]);
    case A_TIMESTEP_EMB: out[0] = cdf_timestep_embedding(in[0], c->i0, c->flag, c->f1, c->f0, c->f2); break;
    }
    return out[0] ? CDF_OK : (cdf_last_status() != CDF_OK ? cdf_last_status() : CDF_ERR_INTERNAL);
}


static cdf_status traced_call(void *ctx, const cdf_tensor_map *in, cdf_tensor_map *out) {
    const call *c = ctx;
    cdf_tensor *t[4] = {0}, *o[2];
    for (int i = 0; i < c->n_in; i++) {
        char name[16];
        snprintf(name, sizeof name, "in%d", i);
        t[i] = cdf_tensor_map_get(in, name);
    }
    cdf_status s = invoke(c, t, o);
    for (int i = 0; s == CDF_OK && i < 2 && o[i]; i++) s = cdf_tensor_map_set(out, i ? "out.1" : "out.0", o[i]);
    return s;
}

/* Capture with decoys, replay with the real operands; new handles on the replay's outputs. */
static cdf_status run_compiled(const call *c, cdf_tensor **out) {
    out[0] = out[1] = NULL;
    cdf_graph_cache *gc = cdf_graph_cache_new("OpSuite.forward", NULL);
    if (!gc) return cdf_last_status();
    cdf_tensor_map m[4]; /* decoy in, decoy out, real in, real out */
    for (int i = 0; i < 4; i++) cdf_tensor_map_init(&m[i]);
    cdf_status s = CDF_OK;
    for (int i = 0; i < c->n_in && s == CDF_OK; i++) {
        if (!c->in[i]) continue;
        char name[16];
        snprintf(name, sizeof name, "in%d", i);
        cdf_dtype dt = cdf_tensor_dtype(c->in[i]);
        bool fl = dt == CDF_F32 || dt == CDF_BF16 || dt == CDF_F16;
        /* integer operands (ids, positions, timesteps) become zeros: still valid indices */
        cdf_tensor *d = fl ? cdf_affine(c->in[i], -0.5f, 0.25f) : cdf_cast(cdf_scale(c->in[i], 0.0f), dt);
        s = d ? cdf_tensor_map_set(&m[0], name, d) : cdf_last_status();
        if (s == CDF_OK) s = cdf_tensor_map_set(&m[2], name, c->in[i]);
    }
    cdf_exec_stats s0, s1;
    cdf_exec_get_stats(&s0);
    if (s == CDF_OK) s = cdf_graph_cache_run(gc, traced_call, (void *)c, &m[0], &m[1], NULL, 0);
    if (s == CDF_OK) s = cdf_graph_cache_run(gc, traced_call, (void *)c, &m[2], &m[3], NULL, 0);
    cdf_exec_get_stats(&s1);
    if (s == CDF_OK && (s1.compiles - s0.compiles != 1 || s1.cache_hits - s0.cache_hits != 1))
        s = cdf_error(CDF_ERR_INTERNAL, "compile: %llu compiles, %llu replays (want 1 and 1)",
                      (unsigned long long)(s1.compiles - s0.compiles), (unsigned long long)(s1.cache_hits - s0.cache_hits));
    for (int i = 0; s == CDF_OK && i < 2; i++) {
        cdf_tensor *t = cdf_tensor_map_get(&m[3], i ? "out.1" : "out.0");
        if (t) out[i] = cdf_contiguous(t); /* a handle recorded in the case's scope */
    }
    for (int i = 0; i < 4; i++) cdf_tensor_map_clear(&m[i]);
    cdf_graph_cache_free(gc);
    return s;
}

/* Run the call; *second (may be NULL) gets a second output (rope tables). NULL on error. */
static cdf_tensor *run2(call c, cdf_tensor **second) {
    cdf_tensor *out[2];
    cdf_status s = g_compile ? run_compiled(&c, out) : invoke(&c, c.in, out);
    if (second) *second = s == CDF_OK ? out[1] : NULL;
    return s == CDF_OK ? out[0] : NULL;
}
static cdf_tensor *run(call c) { return run2(c, NULL); }

#define FOR_EACH_DEVICE for (int di_ = 0; di_ < g_ndev && (g_dev = g_devs[di_]); di_++)
#define END_TEST()                                                                                                 \
    do {                                                                                                           \
        printf("  -- %d rows, %d failed\n", g_rows, g_fail);                                                      \
        int f_ = g_fail;                                                                                           \
        g_fail = g_rows = 0;                                                                                       \
        assert_int_equal(f_, 0);                                                                                   \
    } while (0)

static const cdf_dtype k_float_dts[] = {CDF_F32, CDF_BF16, CDF_F16};

/* ---- COPY: contiguous copies of views, casts, cat, pad, all-reduce over a group of one ----------- */

static void test_copy(void **state) {
    (void)state;
    static const struct {
        int nd;
        int64_t s[CDF_MAX_DIMS];
        layout L;
    } views[] = {
        {2, {17, 65}, TRANS}, {2, {3, 129}, STRIDED}, {4, {2, 3, 5, 7}, PERM}, {3, {1, 1, 1}, TRANS},
        {2, {0, 5}, TRANS},   {1, {129}, STRIDED},    {8, {2, 1, 3, 1, 2, 1, 3, 5}, TRANS}, /* CDF_MAX_DIMS dims */
    };
    static const cdf_dtype dts[] = {CDF_F32, CDF_BF16, CDF_F16, CDF_I32, CDF_I64};
    FOR_EACH_DEVICE {
        for (size_t i = 0; i < sizeof views / sizeof *views; i++)
            for (size_t k = 0; k < sizeof dts / sizeof *dts; k++) {
                case_begin();
                cdf_dtype dt = dts[k];
                int nd = views[i].nd;
                int64_t n = numel(nd, views[i].s);
                float *v = rnd(n, -100, 100, dt);
                cdf_tensor *y = run((call){.what = A_CONTIGUOUS, .n_in = 1, .in = {up(dt, nd, views[i].s, v, views[i].L)}});
                /* reference: the copy kernel from the host view (v itself is the logical value) */
                int64_t st[CDF_MAX_DIMS];
                cstrides(nd, views[i].s, st);
                void *want = tmp((size_t)n * cdf_dtype_size(dt));
                if (n) cdf_k_copy_strided(want, dt, st, typed(v, n, dt), dt, st, nd, views[i].s);
                char cs[96];
                snprintf(cs, sizeof cs, "contiguous %s%s", shp(nd, views[i].s), k_layout[views[i].L]);
                check("copy", cs, y, dt, nd, views[i].s, as_f32(want, dt, n), THR_EXACT);
                case_end();
            }
        /* contiguous copies of expanded views (stride 0), a leading dim added */
        static const struct {
            int nb, nd;
            int64_t b[4], s[4];
        } ex[] = {{2, 2, {1, 65}, {17, 65}}, {3, 4, {3, 1, 5}, {2, 3, 4, 5}}, {1, 2, {1}, {3, 129}}};
        for (size_t i = 0; i < sizeof ex / sizeof *ex; i++)
            for (size_t k = 0; k < 2; k++) {
                case_begin();
                cdf_dtype dt = k ? CDF_BF16 : CDF_I64;
                float *v = rnd(numel(ex[i].nb, ex[i].b), -100, 100, dt);
                cdf_tensor *y = run((call){.what = A_CONTIGUOUS, .n_in = 1, .in = {up_expand(dt, ex[i].nb, ex[i].b, v, ex[i].nd, ex[i].s)}});
                char cs[96];
                snprintf(cs, sizeof cs, "contiguous %s expanded to %s", shp(ex[i].nb, ex[i].b), shp(ex[i].nd, ex[i].s));
                check("copy", cs, y, dt, ex[i].nd, ex[i].s, bcast(v, ex[i].nb, ex[i].b, ex[i].nd, ex[i].s), THR_EXACT);
                case_end();
            }
        /* casts between every pair (float -> int truncates toward zero, float narrowing RNE) */
        for (size_t a = 0; a < sizeof dts / sizeof *dts; a++)
            for (size_t b = 0; b < sizeof dts / sizeof *dts; b++) {
                if (a == b) continue;
                case_begin();
                const int64_t s[3] = {3, 5, 17};
                int64_t n = numel(3, s), st[3];
                cstrides(3, s, st);
                float *v = rnd(n, -300, 300, dts[a]);
                cdf_tensor *y = run((call){.what = A_CAST, .n_in = 1, .in = {up(dts[a], 3, s, v, a % 2 ? TRANS : STRIDED)}, .dt = dts[b]});
                void *want = tmp((size_t)n * cdf_dtype_size(dts[b]));
                cdf_k_copy_strided(want, dts[b], st, typed(v, n, dts[a]), dts[a], st, 3, s);
                char cs[96];
                snprintf(cs, sizeof cs, "cast %s->%s %s%s", cdf_dtype_name(dts[a]), cdf_dtype_name(dts[b]), shp(3, s),
                         k_layout[a % 2 ? TRANS : STRIDED]);
                check("copy", cs, y, dts[b], 3, s, as_f32(want, dts[b], n), THR_EXACT);
                case_end();
            }
        /* cat along the middle dim, mixed dtypes (promoted to f32), one part empty, one a view */
        for (int k = 0; k < 2; k++) {
            case_begin();
            const int64_t s0[3] = {2, 3, 5}, s1[3] = {2, 17, 5}, s2[3] = {2, 0, 5}, so[3] = {2, 20, 5};
            cdf_dtype d0 = CDF_F32, d1 = k ? CDF_BF16 : CDF_F32;
            float *v0 = rnd(30, -1, 1, d0), *v1 = rnd(170, -1, 1, d1);
            cdf_tensor *y = run((call){.what = A_CAT, .n_in = 3, .dim = 1,
                                       .in = {up(d0, 3, s0, v0, CONTIG), up(d1, 3, s2, v0, CONTIG), up(d1, 3, s1, v1, TRANS)}});
            float *want = tmp(200 * sizeof *want);
            int64_t ost[3], st0[3], st1[3];
            cstrides(3, so, ost);
            cstrides(3, s0, st0);
            cstrides(3, s1, st1);
            cdf_k_copy_strided(want, CDF_F32, ost, v0, CDF_F32, st0, 3, s0);
            cdf_k_copy_strided(want + 3 * ost[1], CDF_F32, ost, v1, CDF_F32, st1, 3, s1);
            check("copy", k ? "cat dim1 f32+bf16(empty)+bf16 T" : "cat dim1 f32 x3 (one empty, one T)", y, CDF_F32, 3, so,
                  want, THR_EXACT);
            case_end();
        }
        /* constant pad of the last two dims (fill of the border + copy of the interior) */
        for (size_t k = 0; k < 3; k++) {
            case_begin();
            cdf_dtype dt = k_float_dts[k];
            const int64_t s[3] = {3, 5, 7}, so[3] = {3, 5 + 0 + 3, 7 + 1 + 2};
            const int64_t pads[4] = {1, 2, 0, 3};
            float *v = rnd(105, -1, 1, dt);
            cdf_tensor *y = run((call){.what = A_PAD, .n_in = 1, .in = {up(dt, 3, s, v, STRIDED)}, .i0 = 2, .ints = pads, .value = 0.3});
            int64_t n = numel(3, so), ost[3], st[3];
            void *want = tmp((size_t)n * cdf_dtype_size(dt));
            cdf_k_fill(want, dt, n, 0.3);
            cstrides(3, so, ost);
            cstrides(3, s, st);
            cdf_k_copy_strided((char *)want + (size_t)(1 * ost[2]) * cdf_dtype_size(dt), dt, ost, typed(v, 105, dt), dt,
                               st, 3, s);
            check("copy", "pad [3,5,7] (1,2,0,3) value 0.3 strided", y, dt, 3, so, as_f32(want, dt, n), THR_EXACT);
            case_end();
        }
        /* the all-reduce op over a local group of one is the identity (a contiguous copy); the
         * collective itself over MPI ranks is exercised by test_dist under mpirun */
        {
            case_begin();
            cdf_process_group *pg = NULL;
            assert_int_equal(cdf_dist_init("local", &pg), CDF_OK);
            const int64_t s[2] = {17, 65};
            float *v = rnd(17 * 65, -1, 1, CDF_F32);
            cdf_tensor *y = run((call){.what = A_ALL_REDUCE, .n_in = 1, .in = {up(CDF_F32, 2, s, v, TRANS)}, .pg = pg});
            check("all_reduce", "local group of 1 [17,65] T", y, CDF_F32, 2, s, v, THR_EXACT);
            cdf_dist_finalize(pg);
            case_end();
        }
    }
    END_TEST();
}

/* ---- FILL ------------------------------------------------------------------------------------ */

static void test_fill(void **state) {
    (void)state;
    static const cdf_dtype dts[] = {CDF_F32, CDF_BF16, CDF_F16, CDF_I32, CDF_I64};
    static const struct {
        int nd;
        int64_t s[3];
        double value;
    } cases[] = {{1, {1}, 0.0}, {2, {17, 65}, 0.3}, {3, {3, 0, 5}, 1.0}, {1, {129}, -7.75}, {0, {0}, 2.5}};
    FOR_EACH_DEVICE {
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
            for (size_t k = 0; k < sizeof dts / sizeof *dts; k++) {
                case_begin();
                int64_t n = numel(cases[i].nd, cases[i].s);
                cdf_tensor *y = run((call){.what = A_FULL, .dt = dts[k], .nd = cases[i].nd, .shape = cases[i].s, .value = cases[i].value});
                void *want = tmp((size_t)n * cdf_dtype_size(dts[k]));
                cdf_k_fill(want, dts[k], n, cases[i].value);
                char cs[64];
                snprintf(cs, sizeof cs, "%s %s = %g", cases[i].value == 0.0 ? "zeros" : "full", shp(cases[i].nd, cases[i].s),
                         cases[i].value);
                check("fill", cs, y, dts[k], cases[i].nd, cases[i].s, as_f32(want, dts[k], n), THR_EXACT);
                case_end();
            }
    }
    END_TEST();
}

/* ---- EMBEDDING ------------------------------------------------------------------------------- */

static void test_embedding(void **state) {
    (void)state;
    static const struct {
        int64_t rows, dim;
        int nid;
        int64_t ids[2];
        layout tl, il;
    } cases[] = {
        {17, 65, 2, {3, 5}, CONTIG, CONTIG}, {1, 3, 1, {7}, CONTIG, CONTIG},  {129, 17, 2, {5, 3}, TRANS, TRANS},
        {5, 1, 1, {0}, CONTIG, CONTIG},      {65, 33, 2, {2, 9}, CONTIG, STRIDED},
    };
    FOR_EACH_DEVICE {
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
            for (size_t k = 0; k < 3; k++)
                for (int idt = 0; idt < 2; idt++) {
                    case_begin();
                    cdf_dtype dt = k_float_dts[k], it = idt ? CDF_I32 : CDF_I64;
                    const int64_t ts[2] = {cases[i].rows, cases[i].dim};
                    int64_t nids = numel(cases[i].nid, cases[i].ids);
                    float *tab = rnd(ts[0] * ts[1], -2, 2, dt);
                    float *ids = rnd(nids, 0, (float)cases[i].rows, it); /* repeats included */
                    if (nids) ids[0] = (float)(cases[i].rows - 1);    /* the last row */
                    cdf_tensor *y = run((call){.what = A_EMBEDDING, .n_in = 2,
                                               .in = {up(dt, 2, ts, tab, cases[i].tl), up(it, cases[i].nid, cases[i].ids, ids, cases[i].il)}});
                    int64_t os[3] = {cases[i].ids[0], cases[i].ids[1], ts[1]};
                    os[cases[i].nid] = ts[1];
                    int64_t n = nids * ts[1];
                    void *want = tmp((size_t)n * cdf_dtype_size(dt));
                    assert_int_equal(cdf_k_embedding(want, dt, typed(tab, ts[0] * ts[1], dt), dt, ts[0], ts[1],
                                                     typed(ids, nids, it), it, nids),
                                     CDF_OK);
                    char cs[96];
                    snprintf(cs, sizeof cs, "table %s%s ids %s %s%s", shp(2, ts), k_layout[cases[i].tl],
                             shp(cases[i].nid, cases[i].ids), cdf_dtype_name(it), k_layout[cases[i].il]);
                    check("embedding", cs, y, dt, cases[i].nid + 1, os, as_f32(want, dt, n), THR_EXACT);
                    case_end();
                }
    }
    END_TEST();
}

/* ---- UNARY ----------------------------------------------------------------------------------- */

static const unary_def k_unary[] = {
    {"neg", CDF_UN_NEG, 0, 0, -5, 5},           {"exp", CDF_UN_EXP, 0, 0, -4, 4},
    {"log", CDF_UN_LOG, 0, 0, 0.05f, 8},        {"sqrt", CDF_UN_SQRT, 0, 0, 0, 8},
    {"rsqrt", CDF_UN_RSQRT, 0, 0, 0.05f, 8},    {"sigmoid", CDF_UN_SIGMOID, 0, 0, -8, 8},
    {"tanh", CDF_UN_TANH, 0, 0, -4, 4},         {"silu", CDF_UN_SILU, 0, 0, -8, 8},
    {"relu", CDF_UN_RELU, 0, 0, -5, 5},         {"gelu_erf", CDF_UN_GELU_ERF, 0, 0, -5, 5},
    {"gelu_tanh", CDF_UN_GELU_TANH, 0, 0, -5, 5}, {"quick_gelu", CDF_UN_QUICK_GELU, 0, 0, -5, 5},
    {"scale", CDF_UN_SCALE, -0.37f, 0, -5, 5},  {"add_scalar", CDF_UN_ADD_SCALAR, 1.5f, 0, -5, 5},
    {"affine", CDF_UN_AFFINE, 0.7f, -0.2f, -5, 5}, {"clamp", CDF_UN_CLAMP, -1.0f, 2.0f, -5, 5},
};

/* the reference: the scalar definition of each op (the generic level of the kernels), in f32 */
static float *ref_unary(const unary_def *u, const float *v, int64_t n, cdf_dtype out) {
    float *r = tmp((size_t)n * sizeof *r);
    memcpy(r, v, (size_t)n * sizeof *r);
    cdf_k_unary_span_at(CDF_K_ISA_GENERIC, u->op, r, n, u->p0, u->p1);
    round_to(r, n, out);
    return r;
}

static void test_unary(void **state) {
    (void)state;
    static const struct {
        int nd;
        int64_t s[3];
        layout L;
        cdf_dtype dt;
    } cases[] = {
        {1, {1}, CONTIG, CDF_F32},     {2, {3, 17}, CONTIG, CDF_F32},   {2, {65, 129}, CONTIG, CDF_F32},
        {2, {17, 65}, TRANS, CDF_F32}, {3, {2, 3, 65}, STRIDED, CDF_F32}, {2, {0, 3}, CONTIG, CDF_F32},
        {2, {17, 65}, CONTIG, CDF_BF16}, {2, {3, 129}, TRANS, CDF_BF16}, {2, {17, 33}, STRIDED, CDF_F16},
        {1, {65}, CONTIG, CDF_I32}, /* integers compute as f32, like torch's promotion */
        {2, {257, 513}, CONTIG, CDF_F32},
    };
    FOR_EACH_DEVICE {
        for (size_t o = 0; o < sizeof k_unary / sizeof *k_unary; o++)
            for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
                const unary_def *u = &k_unary[o];
                cdf_dtype dt = cases[i].dt, odt = dt == CDF_I32 ? CDF_F32 : dt;
                if (dt == CDF_I32 && u->lo > 0) continue; /* log/rsqrt of 0 */
                case_begin();
                int64_t n = numel(cases[i].nd, cases[i].s);
                float *v = rnd(n, dt == CDF_I32 ? (u->lo < 0 ? -4.0f : 0.0f) : u->lo, dt == CDF_I32 ? 5 : u->hi, dt);
                cdf_tensor *y = run((call){.what = A_UNARY, .n_in = 1, .in = {up(dt, cases[i].nd, cases[i].s, v, cases[i].L)}, .u = u});
                char cs[96];
                snprintf(cs, sizeof cs, "%s %s%s", u->name, shp(cases[i].nd, cases[i].s), k_layout[cases[i].L]);
                check("unary", cs, y, odt, cases[i].nd, cases[i].s, ref_unary(u, v, n, odt), thr_for(odt, THR_EW));
                case_end();
            }
    }
    END_TEST();
}

/* ---- BINARY (broadcasting) --------------------------------------------------------------------- */

static void test_binary(void **state) {
    (void)state;
    static const char *const names[] = {"add", "sub", "mul", "div", "maximum"};
    static const struct {
        int na, nb;
        int64_t a[4], b[4];
        layout la, lb;
        cdf_dtype da, db;
    } cases[] = {
        {2, 2, {17, 65}, {17, 65}, CONTIG, CONTIG, CDF_F32, CDF_F32},
        {3, 2, {3, 1, 5}, {4, 5}, CONTIG, CONTIG, CDF_F32, CDF_F32},
        {1, 2, {1}, {3, 129}, CONTIG, TRANS, CDF_F32, CDF_F32},
        {2, 2, {17, 65}, {17, 65}, TRANS, STRIDED, CDF_F32, CDF_F32},
        {4, 4, {2, 3, 5, 7}, {2, 1, 5, 1}, PERM, CONTIG, CDF_F32, CDF_F32},
        {2, 1, {0, 5}, {5}, CONTIG, CONTIG, CDF_F32, CDF_F32},
        {2, 2, {17, 65}, {1, 65}, CONTIG, CONTIG, CDF_BF16, CDF_BF16},
        {2, 2, {3, 129}, {3, 129}, STRIDED, CONTIG, CDF_BF16, CDF_F32}, /* promoted to f32 */
        {2, 2, {17, 33}, {17, 1}, TRANS, CONTIG, CDF_F16, CDF_F16},
        {2, 2, {5, 17}, {5, 17}, CONTIG, CONTIG, CDF_I64, CDF_F32},     /* position ids: int -> f32 */
        {2, 2, {17, 65}, {17, 65}, CONTIG, TRANS, CDF_BF16, CDF_F16},   /* promoted to f32 */
        {3, 3, {2, 300, 768}, {2, 1, 768}, CONTIG, CONTIG, CDF_F32, CDF_F32}, /* AdaLN modulation */
    };
    FOR_EACH_DEVICE {
        for (int op = 0; op < 5; op++)
            for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
                case_begin();
                int na = cases[i].na, nb = cases[i].nb, nd = na > nb ? na : nb;
                int64_t os[4];
                for (int d = 0; d < nd; d++) {
                    int ia = d - (nd - na), ib = d - (nd - nb);
                    int64_t x = ia >= 0 ? cases[i].a[ia] : 1, y = ib >= 0 ? cases[i].b[ib] : 1;
                    os[d] = x == 1 ? y : x;
                }
                cdf_dtype da = cases[i].da, db = cases[i].db;
                cdf_dtype odt = (da == db && da != CDF_I64) ? da : CDF_F32;
                int64_t n_a = numel(na, cases[i].a), n_b = numel(nb, cases[i].b), n = numel(nd, os);
                float *va = rnd(n_a, -3, 3, da), *vb = rnd(n_b, -3, 3, db);
                if (op == CDF_BIN_DIV)
                    for (int64_t k = 0; k < n_b; k++) vb[k] = vb[k] < 0 ? vb[k] - 0.5f : vb[k] + 0.5f; /* away from 0 */
                round_to(vb, n_b, db);
                cdf_tensor *y = run((call){.what = A_BINARY, .n_in = 2, .bop = (cdf_binary_op)op,
                                           .in = {up(da, na, cases[i].a, va, cases[i].la), up(db, nb, cases[i].b, vb, cases[i].lb)}});
                /* reference: the binary kernel with broadcast strides on the host copies (ints are
                 * promoted to f32 first, as the tensor API does) */
                int64_t sa[4], sb[4], ca[4], cb[4];
                cstrides(na, cases[i].a, ca);
                cstrides(nb, cases[i].b, cb);
                for (int d = 0; d < nd; d++) {
                    int ia = d - (nd - na), ib = d - (nd - nb);
                    sa[d] = (ia >= 0 && cases[i].a[ia] != 1) ? ca[ia] : 0;
                    sb[d] = (ib >= 0 && cases[i].b[ib] != 1) ? cb[ib] : 0;
                }
                cdf_dtype ka = da == CDF_I64 ? CDF_F32 : da, kb = db == CDF_I64 ? CDF_F32 : db;
                void *want = tmp((size_t)n * cdf_dtype_size(odt));
                if (n)
                    assert_int_equal(cdf_k_binary((cdf_binary_op)op, want, odt, typed(va, n_a, ka), ka, sa, typed(vb, n_b, kb),
                                                  kb, sb, nd, os),
                                     CDF_OK);
                char cs[96];
                snprintf(cs, sizeof cs, "%s %s%s %s %s%s%s%s", names[op], shp(na, cases[i].a), k_layout[cases[i].la],
                         cdf_dtype_name(da), shp(nb, cases[i].b), k_layout[cases[i].lb], da != db ? " " : "",
                         da != db ? cdf_dtype_name(db) : "");
                check("binary", cs, y, odt, nd, os, as_f32(want, odt, n), thr_for(odt, THR_EW));
                case_end();
            }
    }
    END_TEST();
}

/* ---- MATMUL / linear --------------------------------------------------------------------------- */

/* C = A @ B (+ bias) on the host with the reference kernel: A [batch, M, K] (or its transpose
 * when trans_b describes B as [N, K]), all contiguous; applies the bf16 compute policy (f32 A with
 * bf16 B: A rounded to bf16 first, kernels/dispatch.h). Returns C as f32 values of dtype cdt. */
static float *ref_matmul(int64_t batch, int64_t M, int64_t N, int64_t K, const float *a, cdf_dtype adt, const float *b,
                         cdf_dtype bdt, int64_t sb, bool trans_b, const float *bias, cdf_dtype biasdt, cdf_dtype cdt) {
    cdf_dtype kadt = (adt == CDF_F32 && bdt == CDF_BF16) ? CDF_BF16 : adt;
    int64_t nb = sb ? batch : 1;
    cdf_k_matmul_args m = {
        .batch = batch, .M = M, .N = N, .K = K,
        .a = typed(a, batch * M * K, kadt), .a_dt = kadt, .lda = K, .sa = M * K, .trans_a = false,
        .b = typed(b, nb * K * N, bdt), .b_dt = bdt, .ldb = trans_b ? K : N, .sb = sb, .trans_b = trans_b,
        .bias = bias ? typed(bias, N, biasdt) : NULL, .bias_dt = biasdt,
        .c = tmp((size_t)(batch * M * N) * cdf_dtype_size(cdt)), .c_dt = cdt, .ldc = N, .sc = M * N,
        .alpha = 1.0f, .beta = 0.0f,
    };
    if (batch * M * N != 0) assert_int_equal(cdf_k_matmul(&m), CDF_OK);
    return as_f32(m.c, cdt, batch * M * N);
}

static cdf_dtype promoted(cdf_dtype a, cdf_dtype b) { return a == b ? a : CDF_F32; }

static void test_matmul(void **state) {
    (void)state;
    /* cdf_matmul: a [..., M, K] @ b [..., K, N] with broadcast batch dims */
    static const struct {
        int na, nb;
        int64_t a[4], b[4];
        layout la, lb;
        cdf_dtype da, db;
    } cases[] = {
        {2, 2, {1, 1}, {1, 1}, CONTIG, CONTIG, CDF_F32, CDF_F32},
        {2, 2, {3, 17}, {17, 65}, CONTIG, CONTIG, CDF_F32, CDF_F32},
        {2, 2, {65, 129}, {129, 17}, TRANS, CONTIG, CDF_F32, CDF_F32},
        {2, 2, {17, 65}, {65, 3}, STRIDED, TRANS, CDF_F32, CDF_F32},
        {3, 2, {2, 17, 33}, {33, 65}, CONTIG, CONTIG, CDF_F32, CDF_F32},       /* shared weights */
        {4, 4, {2, 1, 5, 17}, {1, 3, 17, 9}, CONTIG, CONTIG, CDF_F32, CDF_F32}, /* both broadcast */
        {4, 4, {2, 3, 17, 8}, {2, 3, 8, 17}, PERM, TRANS, CDF_F32, CDF_F32},  /* q @ k^T from [B,L,H,D] */
        {2, 2, {0, 17}, {17, 5}, CONTIG, CONTIG, CDF_F32, CDF_F32},
        {2, 2, {5, 0}, {0, 3}, CONTIG, CONTIG, CDF_F32, CDF_F32},               /* K = 0: zeros */
        {2, 2, {17, 65}, {65, 33}, CONTIG, CONTIG, CDF_F32, CDF_BF16},          /* bf16 policy */
        {3, 2, {2, 9, 129}, {129, 65}, CONTIG, TRANS, CDF_F32, CDF_BF16},
        {2, 2, {17, 65}, {65, 33}, CONTIG, CONTIG, CDF_BF16, CDF_BF16},
        {4, 4, {1, 2, 17, 64}, {1, 2, 64, 65}, CONTIG, TRANS, CDF_BF16, CDF_BF16},
        {2, 2, {17, 65}, {65, 33}, TRANS, CONTIG, CDF_F16, CDF_F16},
        {2, 2, {17, 65}, {65, 33}, CONTIG, CONTIG, CDF_F32, CDF_F16},           /* no policy: f16 widened */
        {2, 2, {257, 1025}, {1025, 129}, CONTIG, CONTIG, CDF_F32, CDF_F32},     /* big enough to be blocked */
        {2, 2, {257, 1025}, {1025, 129}, CONTIG, TRANS, CDF_F32, CDF_BF16},
        {3, 2, {2, 100, 513}, {513, 257}, CONTIG, CONTIG, CDF_BF16, CDF_BF16},
    };
    FOR_EACH_DEVICE {
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
            case_begin();
            int na = cases[i].na, nb = cases[i].nb, nd = na > nb ? na : nb;
            int64_t M = cases[i].a[na - 2], K = cases[i].a[na - 1], N = cases[i].b[nb - 1];
            int64_t os[4], fa[4], fb[4];
            for (int d = 0; d < nd - 2; d++) {
                int ia = d - (nd - na), ib = d - (nd - nb);
                int64_t x = ia >= 0 ? cases[i].a[ia] : 1, y = ib >= 0 ? cases[i].b[ib] : 1;
                os[d] = fa[d] = fb[d] = x == 1 ? y : x;
            }
            os[nd - 2] = fa[nd - 2] = M;
            os[nd - 1] = fb[nd - 1] = N;
            fa[nd - 1] = fb[nd - 2] = K;
            int64_t batch = numel(nd - 2, os);
            cdf_dtype da = cases[i].da, db = cases[i].db, odt = promoted(da, db);
            float *va = rnd(numel(na, cases[i].a), -1, 1, da), *vb = rnd(numel(nb, cases[i].b), -1, 1, db);
            cdf_tensor *y = run((call){.what = A_MATMUL, .n_in = 2,
                                       .in = {up(da, na, cases[i].a, va, cases[i].la), up(db, nb, cases[i].b, vb, cases[i].lb)}});
            float *want = ref_matmul(batch, M, N, K, bcast(va, na, cases[i].a, nd, fa), da, bcast(vb, nb, cases[i].b, nd, fb),
                                     db, K * N, false, NULL, CDF_F32, odt);
            char cs[96];
            snprintf(cs, sizeof cs, "%s%s %s @ %s%s %s", shp(na, cases[i].a), k_layout[cases[i].la], cdf_dtype_name(da),
                     shp(nb, cases[i].b), k_layout[cases[i].lb], cdf_dtype_name(db));
            check("matmul", cs, y, odt, nd, os, want, thr_for(odt, THR_ACC));
            case_end();
        }
        /* cdf_linear: x [..., in] @ w[out, in]^T + b */
        static const struct {
            int nx;
            int64_t x[3], out;
            bool bias;
            layout lx;
            cdf_dtype dx, dw;
        } lin[] = {
            {3, {2, 17, 65}, 33, true, CONTIG, CDF_F32, CDF_F32},   {2, {1, 3}, 1, true, CONTIG, CDF_F32, CDF_F32},
            {2, {129, 17}, 65, false, TRANS, CDF_F32, CDF_F32},     {3, {2, 17, 65}, 33, true, CONTIG, CDF_F32, CDF_BF16},
            {2, {9, 129}, 17, true, STRIDED, CDF_F32, CDF_BF16},    {3, {2, 17, 64}, 129, true, CONTIG, CDF_BF16, CDF_BF16},
            {2, {0, 17}, 5, true, CONTIG, CDF_F32, CDF_BF16},
            {3, {2, 300, 512}, 768, true, CONTIG, CDF_F32, CDF_BF16},  /* a DiT projection, small */
        };
        for (size_t i = 0; i < sizeof lin / sizeof *lin; i++) {
            case_begin();
            int nx = lin[i].nx;
            int64_t in = lin[i].x[nx - 1], out = lin[i].out, rows = numel(nx - 1, lin[i].x);
            const int64_t ws[2] = {out, in};
            int64_t os[3];
            memcpy(os, lin[i].x, sizeof os);
            os[nx - 1] = out;
            cdf_dtype dx = lin[i].dx, dw = lin[i].dw, odt = promoted(dx, dw);
            float *vx = rnd(rows * in, -1, 1, dx), *vw = rnd(out * in, -0.5f, 0.5f, dw);
            float *vbias = lin[i].bias ? rnd(out, -1, 1, dw) : NULL;
            cdf_tensor *y = run((call){.what = A_LINEAR, .n_in = 3,
                                       .in = {up(dx, nx, lin[i].x, vx, lin[i].lx), up(dw, 2, ws, vw, CONTIG),
                                              vbias ? up(dw, 1, &out, vbias, CONTIG) : NULL}});
            float *want = ref_matmul(1, rows, out, in, vx, dx, vw, dw, 0, true, vbias, dw, odt);
            char cs[96];
            snprintf(cs, sizeof cs, "linear %s%s %s w [%lld,%lld] %s%s", shp(nx, lin[i].x), k_layout[lin[i].lx],
                     cdf_dtype_name(dx), (long long)out, (long long)in, cdf_dtype_name(dw), lin[i].bias ? " +b" : "");
            check("matmul", cs, y, odt, nx, os, want, thr_for(odt, THR_ACC));
            case_end();
        }
    }
    END_TEST();
}

/* cdf_linear_quantized: x [rows, in] @ decode(w)^T + b with w as GGUF blocks of every type the
 * library decodes. The blocks are random bytes below 0x40 (so every f16 scale inside them is a
 * finite number below 2); the reference decodes them with cdf_ggml_dequantize (bit-exact with
 * gguf-py, tests/test_io_gguf.c), rounds to the weight dtype and multiplies with the reference
 * kernel. The last case has more than one decoded panel (kernels/matmul_quant.c: 16 Mi values). */
static void test_matmul_quantized(void **state) {
    (void)state;
    static const struct {
        uint32_t q;
        int64_t rows, in, out;
        bool bias;
        cdf_dtype dx, dw;
    } cases[] = {
        {CDF_GGML_Q8_0, 17, 64, 33, true, CDF_F32, CDF_F32},   {CDF_GGML_Q8_0, 17, 64, 33, true, CDF_F32, CDF_BF16},
        {CDF_GGML_Q4_0, 5, 96, 7, false, CDF_F32, CDF_BF16},   {CDF_GGML_Q4_1, 5, 32, 9, true, CDF_F32, CDF_F32},
        {CDF_GGML_Q5_0, 3, 64, 17, true, CDF_BF16, CDF_BF16},  {CDF_GGML_Q5_1, 9, 160, 32, true, CDF_F32, CDF_F32},
        {CDF_GGML_Q2_K, 4, 256, 9, true, CDF_F32, CDF_F32},    {CDF_GGML_Q3_K, 4, 256, 9, false, CDF_F32, CDF_BF16},
        {CDF_GGML_Q4_K, 33, 512, 65, true, CDF_F32, CDF_BF16}, {CDF_GGML_Q5_K, 4, 256, 9, true, CDF_F32, CDF_F32},
        {CDF_GGML_Q6_K, 7, 256, 31, true, CDF_F32, CDF_F32},   {CDF_GGML_Q8_0, 0, 64, 5, true, CDF_F32, CDF_F32},
        {CDF_GGML_Q8_0, 2, 4096, 4100, true, CDF_F32, CDF_F32}, /* two panels: 4096 rows, then 4 */
    };
    FOR_EACH_DEVICE {
        cdf_device_info info;
        assert_int_equal(cdf_device_get_info(g_dev, &info), CDF_OK);
        if (!info.quantized_matmul) { /* the loader dequantizes GGUF blocks for this backend (pjrt) */
            printf("  %-7s matmul_quantized: not an op of this backend (GGUF weights are dequantized at load)\n",
                   cdf_device_name(g_dev));
            continue;
        }
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
            case_begin();
            const uint32_t q = cases[i].q;
            const int64_t rows = cases[i].rows, in = cases[i].in, out = cases[i].out;
            int64_t be = 0, bb = 0;
            assert_true(cdf_ggml_type_block(q, &be, &bb));
            const int64_t rb = in / be * bb;
            uint8_t *blocks = tmp((size_t)(out * rb));
            for (int64_t k = 0; k < out * rb; k++) blocks[k] = (uint8_t)(urand(0, 64));
            float *vw = tmp((size_t)(out * in) * sizeof *vw);
            assert_int_equal(cdf_ggml_dequantize(q, blocks, out * in, vw), CDF_OK);
            round_to(vw, out * in, cases[i].dw);
            const cdf_dtype dx = cases[i].dx, odt = promoted(dx, cases[i].dw);
            const int64_t xs[2] = {rows, in}, os[2] = {rows, out};
            float *vx = rnd(rows * in, -1, 1, dx), *vb = cases[i].bias ? rnd(out, -1, 1, CDF_F32) : NULL;
            cdf_tensor *wq = cdf_tensor_from_host(g_dev, CDF_U8, 2, (int64_t[]){out, rb}, blocks, CDF_U8);
            cdf_tensor *y = run((call){.what = A_LINEAR_Q, .n_in = 3, .i0 = (int)q, .i1 = (int)in, .dt = cases[i].dw,
                                       .in = {up(dx, 2, xs, vx, CONTIG), wq, vb ? up(CDF_F32, 1, &out, vb, CONTIG) : NULL}});
            float *want = ref_matmul(1, rows, out, in, vx, dx, vw, cases[i].dw, 0, true, vb, CDF_F32, odt);
            char cs[96];
            snprintf(cs, sizeof cs, "linear %s [%lld,%lld] w [%lld,%lld] %s -> %s%s", cdf_ggml_type_name(q), (long long)rows,
                     (long long)in, (long long)out, (long long)in, cdf_dtype_name(dx), cdf_dtype_name(cases[i].dw),
                     vb ? " +b" : "");
            check("matmul_quantized", cs, y, odt, 2, os, want, thr_for(odt, THR_ACC));
            case_end();
        }
    }
    END_TEST();
}

/* ---- SOFTMAX --------------------------------------------------------------------------------- */

static void test_softmax(void **state) {
    (void)state;
    static const struct {
        int nd;
        int64_t s[3];
        int dim;
        layout L;
        cdf_dtype dt;
    } cases[] = {
        {2, {1, 1}, -1, CONTIG, CDF_F32},   {2, {3, 17}, -1, CONTIG, CDF_F32},  {2, {5, 129}, 1, TRANS, CDF_F32},
        {3, {2, 65, 3}, 1, CONTIG, CDF_F32}, {3, {2, 3, 65}, 0, STRIDED, CDF_F32}, {2, {0, 7}, -1, CONTIG, CDF_F32},
        {2, {17, 65}, -1, CONTIG, CDF_BF16}, {2, {17, 33}, 0, TRANS, CDF_BF16},  {2, {9, 65}, -1, CONTIG, CDF_F16},
        {2, {64, 4097}, -1, CONTIG, CDF_F32},
    };
    FOR_EACH_DEVICE {
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
            case_begin();
            int nd = cases[i].nd, d = cases[i].dim < 0 ? cases[i].dim + nd : cases[i].dim;
            cdf_dtype dt = cases[i].dt;
            int64_t n = numel(nd, cases[i].s), ms[3], bs[3];
            float *v = rnd(n, -8, 8, dt);
            cdf_tensor *y = run((call){.what = A_SOFTMAX, .n_in = 1, .in = {up(dt, nd, cases[i].s, v, cases[i].L)}, .dim = cases[i].dim});
            /* reference: move dim d last, the row kernel, move it back */
            float *moved = host_swap(v, nd, cases[i].s, d, nd - 1, ms);
            int64_t cols = ms[nd - 1], rows = cols ? n / cols : 0;
            void *out = tmp((size_t)n * cdf_dtype_size(dt));
            if (n) assert_int_equal(cdf_k_softmax(out, dt, typed(moved, n, dt), dt, rows, cols, 1.0f), CDF_OK);
            float *want = host_swap(as_f32(out, dt, n), nd, ms, d, nd - 1, bs);
            char cs[64];
            snprintf(cs, sizeof cs, "%s%s dim %d", shp(nd, cases[i].s), k_layout[cases[i].L], cases[i].dim);
            check("softmax", cs, y, dt, nd, cases[i].s, want, thr_for(dt, THR_ACC));
            case_end();
        }
    }
    END_TEST();
}

/* ---- LAYER_NORM / RMS_NORM ------------------------------------------------------------------- */

static void test_norms(void **state) {
    (void)state;
    static const struct {
        int nd;
        int64_t s[3];
        bool w, b;
        float eps;
        layout L;
        cdf_dtype dt, wdt, odt; /* odt: cdf_rms_norm_as's result dtype (0: x's; rms only) */
    } cases[] = {
        {2, {1, 1}, true, true, 1e-5f, CONTIG, CDF_F32, CDF_F32, 0},      /* one column: (x - mean) = 0 */
        {2, {3, 17}, true, true, 1e-6f, CONTIG, CDF_F32, CDF_F32, 0},
        {3, {2, 5, 129}, false, false, 0.1f, CONTIG, CDF_F32, CDF_F32, 0}, /* eps that matters */
        {2, {17, 65}, true, false, 1e-5f, TRANS, CDF_F32, CDF_F32, 0},
        {2, {65, 3}, false, true, 0.5f, STRIDED, CDF_F32, CDF_F32, 0},
        {3, {2, 17, 64}, true, true, 1e-6f, CONTIG, CDF_F32, CDF_BF16, 0}, /* bf16 weights, f32 activations */
        {2, {5, 65}, true, true, 0.2f, STRIDED, CDF_BF16, CDF_F32, 0},     /* and the other way round */
        {2, {17, 129}, true, true, 1e-5f, CONTIG, CDF_BF16, CDF_BF16, 0},
        {2, {9, 33}, true, true, 1e-3f, TRANS, CDF_F16, CDF_F16, 0},
        {2, {0, 17}, true, true, 1e-6f, CONTIG, CDF_F32, CDF_F32, 0},
        {3, {1, 300, 3072}, false, false, 1e-6f, CONTIG, CDF_F32, CDF_F32, 0}, /* a DiT hidden state */
        /* f32 x, bf16 result: SD3's q/k norms under the bf16 attention policy (one rounding, at the store) */
        {3, {2, 33, 64}, true, false, 1e-6f, STRIDED, CDF_F32, CDF_F32, CDF_BF16},
    };
    FOR_EACH_DEVICE {
        for (int rms = 0; rms < 2; rms++)
            for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
                if (cases[i].odt && !rms) continue; /* layer_norm has no result-dtype variant */
                case_begin();
                int nd = cases[i].nd;
                cdf_dtype dt = cases[i].dt, wdt = cases[i].wdt, odt = cases[i].odt ? cases[i].odt : dt;
                int64_t n = numel(nd, cases[i].s), cols = cases[i].s[nd - 1], rows = cols ? n / cols : 0;
                bool hb = cases[i].b && !rms;
                float *v = rnd(n, -2, 3, dt);
                float *w = cases[i].w ? rnd(cols, 0.5f, 1.5f, wdt) : NULL, *b = hb ? rnd(cols, -1, 1, wdt) : NULL;
                cdf_tensor *x = up(dt, nd, cases[i].s, v, cases[i].L);
                cdf_tensor *tw = w ? up(wdt, 1, &cols, w, CONTIG) : NULL, *tb = b ? up(wdt, 1, &cols, b, CONTIG) : NULL;
                cdf_tensor *y = run((call){.what = rms ? A_RMS_NORM : A_LAYER_NORM, .n_in = 3, .in = {x, tw, tb}, .f0 = cases[i].eps,
                                           .dt = cases[i].odt});
                void *out = tmp((size_t)n * cdf_dtype_size(odt));
                void *kw = w ? typed(w, cols, wdt) : NULL, *kb = b ? typed(b, cols, wdt) : NULL;
                if (n) {
                    cdf_status s = rms ? cdf_k_rms_norm(out, odt, typed(v, n, dt), dt, rows, cols, cases[i].eps, kw, wdt)
                                       : cdf_k_layer_norm(out, dt, typed(v, n, dt), dt, rows, cols, cases[i].eps, kw, kb, wdt);
                    assert_int_equal(s, CDF_OK);
                }
                char cs[96];
                snprintf(cs, sizeof cs, "%s%s eps %g%s%s%s%s%s%s", shp(nd, cases[i].s), k_layout[cases[i].L], (double)cases[i].eps,
                         w ? " w" : "", hb ? " b" : "", (w || hb) && wdt != dt ? " params " : "",
                         (w || hb) && wdt != dt ? cdf_dtype_name(wdt) : "", odt != dt ? " -> " : "", odt != dt ? cdf_dtype_name(odt) : "");
                check(rms ? "rms_norm" : "layer_norm", cs, y, odt, nd, cases[i].s, as_f32(out, odt, n), thr_for(odt, THR_ACC));
                case_end();
            }
    }
    END_TEST();
}

/* ---- GROUP_NORM ------------------------------------------------------------------------------ */

static void test_group_norm(void **state) {
    (void)state;
    static const struct {
        int nd;
        int64_t s[4];
        int groups;
        bool wb;
        float eps;
        layout L;
        cdf_dtype dt, wdt;
    } cases[] = {
        {4, {2, 6, 5, 7}, 3, true, 1e-6f, CONTIG, CDF_F32, CDF_F32},   {4, {1, 6, 3, 3}, 6, true, 1e-5f, CONTIG, CDF_F32, CDF_F32},
        {4, {2, 4, 9, 1}, 1, false, 0.25f, PERM, CDF_F32, CDF_F32},    {3, {2, 8, 17}, 2, true, 1e-6f, STRIDED, CDF_F32, CDF_F32},
        {4, {1, 32, 4, 4}, 32, true, 1e-6f, CONTIG, CDF_F32, CDF_F32}, {4, {2, 6, 5, 7}, 2, true, 1e-6f, TRANS, CDF_BF16, CDF_BF16},
        {4, {1, 4, 3, 5}, 2, true, 1e-3f, CONTIG, CDF_F16, CDF_F16},
        {4, {1, 64, 33, 33}, 32, true, 1e-6f, CONTIG, CDF_F32, CDF_F32},
        {4, {2, 8, 3, 5}, 4, true, 0.1f, CONTIG, CDF_F32, CDF_BF16}, /* a VAE with bf16 weights */
    };
    FOR_EACH_DEVICE {
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
            case_begin();
            int nd = cases[i].nd;
            cdf_dtype dt = cases[i].dt;
            int64_t n = numel(nd, cases[i].s), C = cases[i].s[1], S = numel(nd - 2, cases[i].s + 2);
            float *v = rnd(n, -2, 3, dt);
            cdf_dtype wdt = cases[i].wdt;
            float *w = cases[i].wb ? rnd(C, 0.5f, 1.5f, wdt) : NULL, *b = cases[i].wb ? rnd(C, -1, 1, wdt) : NULL;
            cdf_tensor *y = run((call){.what = A_GROUP_NORM, .n_in = 3, .i0 = cases[i].groups, .f0 = cases[i].eps,
                                       .in = {up(dt, nd, cases[i].s, v, cases[i].L), w ? up(wdt, 1, &C, w, CONTIG) : NULL,
                                              b ? up(wdt, 1, &C, b, CONTIG) : NULL}});
            void *out = tmp((size_t)n * cdf_dtype_size(dt));
            assert_int_equal(cdf_k_group_norm(out, dt, typed(v, n, dt), dt, cases[i].s[0], C, S, cases[i].groups, cases[i].eps,
                                              w ? typed(w, C, wdt) : NULL, b ? typed(b, C, wdt) : NULL, wdt),
                             CDF_OK);
            char cs[96];
            snprintf(cs, sizeof cs, "%s%s groups %d eps %g%s%s", shp(nd, cases[i].s), k_layout[cases[i].L], cases[i].groups,
                     (double)cases[i].eps, cases[i].wb ? " w b" : "", cases[i].wb && wdt != dt ? " params bf16" : "");
            check("group_norm", cs, y, dt, nd, cases[i].s, as_f32(out, dt, n), thr_for(dt, THR_ACC));
            case_end();
        }
    }
    END_TEST();
}

/* ---- REDUCE (sum, mean, var, max, argmax) ---------------------------------------------------- */

static void test_reduce(void **state) {
    (void)state;
    static const char *const names[] = {"sum", "mean", "var", "max", "min", "argmax"};
    static const cdf_reduce_op ops[] = {CDF_RED_SUM, CDF_RED_MEAN, CDF_RED_VAR, CDF_RED_MAX, CDF_RED_ARGMAX};
    static const struct {
        int nd;
        int64_t s[3];
        int dim;
        bool keep;
        layout L;
        cdf_dtype dt;
    } cases[] = {
        {3, {3, 17, 5}, 1, false, CONTIG, CDF_F32}, {3, {3, 17, 5}, 0, true, CONTIG, CDF_F32},
        {1, {129}, 0, false, CONTIG, CDF_F32},      {3, {2, 1, 65}, -1, true, STRIDED, CDF_F32},
        {2, {17, 65}, 1, false, TRANS, CDF_F32},    {3, {2, 1, 65}, 1, false, CONTIG, CDF_F32},
        {2, {17, 65}, 0, false, CONTIG, CDF_BF16},  {2, {9, 33}, -1, true, TRANS, CDF_F16},
        {2, {5, 17}, 1, false, CONTIG, CDF_I64},    {2, {17, 5}, 0, true, TRANS, CDF_I32},
        {2, {3, 0}, 0, false, CONTIG, CDF_F32}, /* empty result */
        {2, {3, 100003}, 1, false, CONTIG, CDF_F32}, {3, {4, 4099, 3}, 1, true, CONTIG, CDF_F32},
    };
    FOR_EACH_DEVICE {
        for (size_t o = 0; o < sizeof ops / sizeof *ops; o++)
            for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
                cdf_reduce_op op = ops[o];
                cdf_dtype dt = cases[i].dt;
                bool ints = dt == CDF_I64 || dt == CDF_I32;
                if (ints && op != CDF_RED_ARGMAX) continue; /* the float reductions of ints promote: covered by unary/binary */
                case_begin();
                int nd = cases[i].nd, d = cases[i].dim < 0 ? cases[i].dim + nd : cases[i].dim;
                int64_t n = numel(nd, cases[i].s);
                /* few distinct values so that maxima tie (argmax takes the first) */
                float *v = op == CDF_RED_ARGMAX ? rnd(n, -4, 4, ints ? dt : CDF_I32) : rnd(n, -2, 3, dt);
                round_to(v, n, dt);
                cdf_tensor *y = run((call){.what = A_REDUCE, .n_in = 1, .in = {up(dt, nd, cases[i].s, v, cases[i].L)}, .rop = op,
                                           .dim = cases[i].dim, .keep = cases[i].keep});
                int64_t os[3], outer = numel(d, cases[i].s), red = cases[i].s[d], inner = numel(nd - d - 1, cases[i].s + d + 1);
                int ond = 0;
                for (int k = 0; k < nd; k++)
                    if (k != d) os[ond++] = cases[i].s[k];
                    else if (cases[i].keep) os[ond++] = 1;
                cdf_dtype odt = op == CDF_RED_ARGMAX ? CDF_I64 : dt;
                int64_t on = outer * inner;
                void *out = tmp((size_t)on * cdf_dtype_size(odt));
                if (on) assert_int_equal(cdf_k_reduce(op, out, odt, typed(v, n, dt), dt, outer, red, inner), CDF_OK);
                double thr = (op == CDF_RED_MAX || op == CDF_RED_ARGMAX) ? THR_EXACT : thr_for(odt, THR_ACC);
                char cs[64];
                snprintf(cs, sizeof cs, "%s %s%s dim %d%s", names[op], shp(nd, cases[i].s), k_layout[cases[i].L], cases[i].dim,
                         cases[i].keep ? " keepdim" : "");
                check(op == CDF_RED_ARGMAX ? "argmax" : "reduce", cs, y, odt, ond, os, as_f32(out, odt, on), thr);
                case_end();
            }
    }
    END_TEST();
}

/* ---- CONV2D ---------------------------------------------------------------------------------- */

static void test_conv2d(void **state) {
    (void)state;
    static const struct {
        int64_t n, cin, h, w, cout, kh, kw;
        cdf_conv2d_params p;
        bool bias;
        layout L;
        cdf_dtype dx, dw;
    } cases[] = {
        {1, 3, 17, 17, 5, 3, 3, {1, 1, 1, 1, 1, 1, 1}, true, CONTIG, CDF_F32, CDF_F32},
        {2, 4, 9, 13, 6, 3, 3, {2, 2, 1, 1, 1, 1, 1}, true, CONTIG, CDF_F32, CDF_F32},   /* stride 2 */
        {1, 4, 17, 11, 4, 3, 3, {1, 1, 2, 2, 2, 2, 1}, false, CONTIG, CDF_F32, CDF_F32}, /* dilation 2 */
        {1, 6, 7, 9, 4, 3, 1, {1, 2, 1, 0, 1, 1, 2}, true, PERM, CDF_F32, CDF_F32},      /* groups 2, asymmetric */
        {2, 8, 5, 5, 8, 3, 3, {1, 1, 1, 1, 1, 1, 8}, true, CONTIG, CDF_F32, CDF_F32},    /* depthwise */
        {1, 65, 3, 5, 17, 1, 1, {1, 1, 0, 0, 1, 1, 1}, true, TRANS, CDF_F32, CDF_F32},   /* 1x1 */
        {1, 3, 1, 1, 2, 1, 1, {1, 1, 0, 0, 1, 1, 1}, false, CONTIG, CDF_F32, CDF_F32},
        {1, 16, 9, 9, 32, 3, 3, {1, 1, 1, 1, 1, 1, 1}, true, CONTIG, CDF_F32, CDF_BF16}, /* bf16 policy */
        {2, 5, 8, 8, 7, 4, 4, {2, 2, 1, 1, 1, 1, 1}, true, CONTIG, CDF_F32, CDF_BF16},
        {1, 16, 9, 9, 32, 3, 3, {1, 1, 1, 1, 1, 1, 1}, true, CONTIG, CDF_BF16, CDF_BF16},
        {1, 4, 6, 7, 4, 3, 3, {1, 1, 1, 1, 1, 1, 1}, true, STRIDED, CDF_F16, CDF_F16},
        {1, 64, 33, 33, 64, 3, 3, {1, 1, 1, 1, 1, 1, 1}, true, CONTIG, CDF_F32, CDF_F32}, /* a VAE layer, small */
        {1, 64, 33, 33, 32, 3, 3, {2, 2, 1, 1, 1, 1, 1}, true, CONTIG, CDF_F32, CDF_BF16},
    };
    FOR_EACH_DEVICE {
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
            case_begin();
            const cdf_conv2d_params *p = &cases[i].p;
            const int64_t xs[4] = {cases[i].n, cases[i].cin, cases[i].h, cases[i].w};
            const int64_t ws[4] = {cases[i].cout, cases[i].cin / p->groups, cases[i].kh, cases[i].kw};
            int64_t oh = (xs[2] + 2 * p->pad_h - p->dil_h * (ws[2] - 1) - 1) / p->stride_h + 1;
            int64_t ow = (xs[3] + 2 * p->pad_w - p->dil_w * (ws[3] - 1) - 1) / p->stride_w + 1;
            const int64_t os[4] = {xs[0], ws[0], oh, ow};
            cdf_dtype dx = cases[i].dx, dw = cases[i].dw, odt = promoted(dx, dw);
            float *vx = rnd(numel(4, xs), -1, 1, dx), *vw = rnd(numel(4, ws), -0.5f, 0.5f, dw);
            float *vb = cases[i].bias ? rnd(ws[0], -1, 1, dw) : NULL;
            cdf_tensor *y = run((call){.what = A_CONV2D, .n_in = 3, .conv = p,
                                       .in = {up(dx, 4, xs, vx, cases[i].L), up(dw, 4, ws, vw, CONTIG),
                                              vb ? up(dw, 1, ws, vb, CONTIG) : NULL}});
            cdf_dtype kx = (dx == CDF_F32 && dw == CDF_BF16) ? CDF_BF16 : dx; /* the bf16 policy */
            cdf_k_conv2d_args a = {
                .n = xs[0], .cin = xs[1], .h = xs[2], .w = xs[3], .cout = ws[0], .kh = ws[2], .kw = ws[3],
                .stride_h = p->stride_h, .stride_w = p->stride_w, .pad_h = p->pad_h, .pad_w = p->pad_w,
                .dil_h = p->dil_h, .dil_w = p->dil_w, .groups = p->groups,
                .x = typed(vx, numel(4, xs), kx), .x_dt = kx, .weight = typed(vw, numel(4, ws), dw), .w_dt = dw,
                .bias = vb ? typed(vb, ws[0], dw) : NULL, .b_dt = dw,
                .out = tmp((size_t)numel(4, os) * cdf_dtype_size(odt)), .out_dt = odt,
            };
            assert_int_equal(cdf_k_conv2d(&a), CDF_OK);
            char cs[112];
            snprintf(cs, sizeof cs, "x %s%s %s w %s %s s%d,%d p%d,%d d%d,%d g%d%s", shp(4, xs), k_layout[cases[i].L],
                     cdf_dtype_name(dx), shp(4, ws), cdf_dtype_name(dw), p->stride_h, p->stride_w, p->pad_h, p->pad_w, p->dil_h,
                     p->dil_w, p->groups, vb ? " +b" : "");
            check("conv2d", cs, y, odt, 4, os, as_f32(a.out, odt, numel(4, os)), thr_for(odt, THR_ACC));
            case_end();
        }
    }
    END_TEST();
}

/* ---- UPSAMPLE -------------------------------------------------------------------------------- */

static void test_upsample(void **state) {
    (void)state;
    static const struct {
        int nd;
        int64_t s[4];
        int fh, fw;
        layout L;
        cdf_dtype dt;
    } cases[] = {
        {4, {2, 3, 5, 7}, 2, 2, CONTIG, CDF_F32}, {4, {1, 2, 3, 1}, 1, 3, PERM, CDF_F32},
        {3, {3, 17, 5}, 2, 1, TRANS, CDF_BF16},    {2, {1, 1}, 3, 2, CONTIG, CDF_F16},
        {4, {1, 4, 9, 9}, 2, 2, STRIDED, CDF_BF16},
    };
    FOR_EACH_DEVICE {
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
            case_begin();
            int nd = cases[i].nd;
            cdf_dtype dt = cases[i].dt;
            int64_t n = numel(nd, cases[i].s), h = cases[i].s[nd - 2], w = cases[i].s[nd - 1], os[4];
            memcpy(os, cases[i].s, sizeof os);
            os[nd - 2] *= cases[i].fh;
            os[nd - 1] *= cases[i].fw;
            float *v = rnd(n, -1, 1, dt);
            cdf_tensor *y = run((call){.what = A_UPSAMPLE, .n_in = 1, .in = {up(dt, nd, cases[i].s, v, cases[i].L)}, .i0 = cases[i].fh,
                                       .i1 = cases[i].fw});
            int64_t on = numel(nd, os);
            void *out = tmp((size_t)on * cdf_dtype_size(dt));
            assert_int_equal(cdf_k_upsample_nearest(out, dt, typed(v, n, dt), dt, n / (h * w), h, w, cases[i].fh, cases[i].fw),
                             CDF_OK);
            char cs[64];
            snprintf(cs, sizeof cs, "%s%s x(%d,%d)", shp(nd, cases[i].s), k_layout[cases[i].L], cases[i].fh, cases[i].fw);
            check("upsample", cs, y, dt, nd, os, as_f32(out, dt, on), THR_EXACT);
            case_end();
        }
    }
    END_TEST();
}

/* ---- ATTENTION ------------------------------------------------------------------------------- */

typedef enum mask_kind { NO_MASK, MASK_LQ_LK, MASK_KEYPAD, MASK_FULLROW } mask_kind;

static void test_attention(void **state) {
    (void)state;
    static const char *const mask_names[] = {"", " mask[Lq,Lk]", " mask[B,1,1,Lk]", " mask[B,H,Lq,Lk] (a row all -inf)"};
    static const struct {
        int64_t b, h, lq, lk, d, dv;
        int64_t hk; /* heads of k/v before expand (GQA) */
        mask_kind mask;
        float scale; /* 0 = 1/sqrt(d) */
        layout L;
        cdf_dtype dt, mdt;
    } cases[] = {
        {1, 1, 1, 1, 8, 8, 1, NO_MASK, 0, CONTIG, CDF_F32, CDF_F32},
        {2, 3, 17, 65, 64, 64, 3, NO_MASK, 0, CONTIG, CDF_F32, CDF_F32},
        {1, 2, 65, 17, 40, 24, 2, MASK_LQ_LK, 0.3f, CONTIG, CDF_F32, CDF_F32},
        {2, 2, 33, 129, 64, 64, 2, MASK_KEYPAD, 0, PERM, CDF_F32, CDF_F32}, /* [B, L, H, D] views */
        {1, 4, 9, 17, 32, 32, 1, NO_MASK, 0, CONTIG, CDF_F32, CDF_F32},     /* GQA: k/v expanded */
        {2, 4, 5, 33, 16, 16, 2, MASK_FULLROW, 0, CONTIG, CDF_F32, CDF_F32},
        {1, 2, 129, 129, 128, 128, 2, NO_MASK, 0, CONTIG, CDF_F32, CDF_F32},
        {2, 3, 17, 65, 64, 64, 3, MASK_KEYPAD, 0, CONTIG, CDF_BF16, CDF_BF16},
        {1, 2, 65, 33, 128, 128, 2, MASK_LQ_LK, 0, PERM, CDF_BF16, CDF_F32},
        {1, 4, 9, 17, 64, 64, 2, NO_MASK, 0, CONTIG, CDF_BF16, CDF_F32},
        {1, 2, 17, 33, 32, 32, 2, NO_MASK, 0, CONTIG, CDF_F16, CDF_F32},
        {1, 1, 0, 5, 8, 8, 1, NO_MASK, 0, CONTIG, CDF_F32, CDF_F32},
        {1, 2, 513, 1031, 64, 64, 2, MASK_KEYPAD, 0, PERM, CDF_F32, CDF_F32}, /* many key tiles */
        {1, 2, 257, 515, 128, 128, 2, NO_MASK, 0, CONTIG, CDF_BF16, CDF_F32},
    };
    FOR_EACH_DEVICE {
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
            case_begin();
            int64_t B = cases[i].b, H = cases[i].h, Lq = cases[i].lq, Lk = cases[i].lk, D = cases[i].d, Dv = cases[i].dv;
            int64_t Hk = cases[i].hk;
            cdf_dtype dt = cases[i].dt, mdt = cases[i].mdt;
            const int64_t qs[4] = {B, H, Lq, D}, ks[4] = {B, H, Lk, D}, vs[4] = {B, H, Lk, Dv}, os[4] = {B, H, Lq, Dv};
            const int64_t kbs[4] = {B, Hk, Lk, D}, vbs[4] = {B, Hk, Lk, Dv}, ms[4] = {B, H, Lq, Lk};
            float *q = rnd(numel(4, qs), -2, 2, dt), *k = rnd(numel(4, kbs), -2, 2, dt), *v = rnd(numel(4, vbs), -1, 1, dt);
            cdf_tensor *tq = up(dt, 4, qs, q, cases[i].L), *tk, *tv;
            if (Hk != H) { /* GQA: each k/v head shared by H / Hk query heads, through expand */
                const int64_t k5[5] = {B, Hk, 1, Lk, D}, v5[5] = {B, Hk, 1, Lk, Dv};
                const int64_t ke[5] = {B, Hk, H / Hk, Lk, D}, ve[5] = {B, Hk, H / Hk, Lk, Dv};
                tk = cdf_reshape(up_expand(dt, 5, k5, k, 5, ke), 4, ks);
                tv = cdf_reshape(up_expand(dt, 5, v5, v, 5, ve), 4, vs);
                k = bcast(k, 5, k5, 5, ke);
                v = bcast(v, 5, v5, 5, ve);
            } else {
                tk = up(dt, 4, ks, k, cases[i].L);
                tv = up(dt, 4, vs, v, cases[i].L);
            }
            float *m = NULL;
            cdf_tensor *tm = NULL;
            if (cases[i].mask == MASK_LQ_LK) {
                const int64_t m2[2] = {Lq, Lk};
                float *mv = rnd(Lq * Lk, -3, 1, mdt);
                for (int64_t r = 0; r < Lq; r++) mv[r * Lk + (r * 7) % Lk] = -INFINITY; /* some -inf, never a whole row */
                tm = up(mdt, 2, m2, mv, TRANS);
                m = bcast(mv, 2, m2, 4, ms);
            } else if (cases[i].mask == MASK_KEYPAD) {
                const int64_t m4[4] = {B, 1, 1, Lk};
                float *mv = tmp((size_t)(B * Lk) * sizeof *mv);
                for (int64_t bb = 0; bb < B; bb++)
                    for (int64_t j = 0; j < Lk; j++) mv[bb * Lk + j] = j >= Lk - 5 * (bb + 1) ? -INFINITY : 0.0f;
                tm = up(mdt, 4, m4, mv, CONTIG);
                m = bcast(mv, 4, m4, 4, ms);
            } else if (cases[i].mask == MASK_FULLROW) {
                m = rnd(numel(4, ms), -2, 0, mdt);
                for (int64_t j = 0; j < Lk; j++) m[(1 * H + 2) * Lq * Lk + 3 * Lk + j] = -INFINITY; /* b1 h2 q3 */
                tm = up(mdt, 4, ms, m, CONTIG);
            }
            cdf_tensor *y = run((call){.what = A_SDPA, .n_in = 4, .in = {tq, tk, tv, tm}, .f0 = cases[i].scale});
            cdf_k_attention_args a = {
                .b = B, .h = H, .lq = Lq, .lk = Lk, .d = D, .dv = Dv,
                .q = typed(q, numel(4, qs), dt), .q_dt = dt, .q_sb = H * Lq * D, .q_sh = Lq * D, .q_sl = D,
                .k = typed(k, numel(4, ks), dt), .k_dt = dt, .k_sb = H * Lk * D, .k_sh = Lk * D, .k_sl = D,
                .v = typed(v, numel(4, vs), dt), .v_dt = dt, .v_sb = H * Lk * Dv, .v_sh = Lk * Dv, .v_sl = Dv,
                .mask = m ? typed(m, numel(4, ms), mdt) : NULL, .mask_dt = mdt,
                .m_sb = H * Lq * Lk, .m_sh = Lq * Lk, .m_sq = Lk, .m_sk = 1,
                .out = tmp((size_t)numel(4, os) * cdf_dtype_size(dt)), .out_dt = dt,
                .scale = cases[i].scale > 0 ? cases[i].scale : 1.0f / sqrtf((float)D),
            };
            if (numel(4, os)) assert_int_equal(cdf_k_attention(&a), CDF_OK);
            char cs[112];
            snprintf(cs, sizeof cs, "q %s k %s%s%s%s%s", shp(4, qs), shp(4, ks), Hk != H ? " (GQA expand)" : "",
                     k_layout[cases[i].L], mask_names[cases[i].mask], cases[i].scale > 0 ? " scale 0.3" : "");
            check("attention", cs, y, dt, 4, os, as_f32(a.out, dt, numel(4, os)), thr_for(dt, THR_ACC));
            case_end();
        }
    }
    END_TEST();
}

/* ---- ROPE, ROPE_TABLE, TIMESTEP_EMB ------------------------------------------------------------- */

static void test_rope(void **state) {
    (void)state;
    static const struct {
        int64_t b, h, l, d;
        layout L;
        cdf_dtype dt, tdt, odt; /* odt: cdf_rope_as's result dtype (0: cdf_rope, x's) */
    } cases[] = {
        {1, 1, 1, 2, CONTIG, CDF_F32, CDF_F32, 0},   {2, 3, 17, 64, CONTIG, CDF_F32, CDF_F32, 0},
        {1, 4, 65, 128, PERM, CDF_F32, CDF_F32, 0}, {2, 2, 9, 16, STRIDED, CDF_F32, CDF_BF16, 0},
        {1, 3, 33, 64, CONTIG, CDF_BF16, CDF_F32, 0}, {1, 2, 17, 32, PERM, CDF_F16, CDF_F32, 0},
        /* f32 x, bf16 result: the attention inputs of a bf16-weight FLUX (one rounding, at the store) */
        {1, 4, 65, 128, PERM, CDF_F32, CDF_F32, CDF_BF16},
    };
    FOR_EACH_DEVICE {
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
            case_begin();
            const int64_t xs[4] = {cases[i].b, cases[i].h, cases[i].l, cases[i].d}, ts[2] = {cases[i].l, cases[i].d};
            cdf_dtype dt = cases[i].dt, tdt = cases[i].tdt, odt = cases[i].odt ? cases[i].odt : dt;
            int64_t n = numel(4, xs);
            float *x = rnd(n, -2, 2, dt), *c = rnd(ts[0] * ts[1], -1, 1, tdt), *s = rnd(ts[0] * ts[1], -1, 1, tdt);
            cdf_tensor *y = run((call){.what = A_ROPE, .n_in = 3,
                                       .in = {up(dt, 4, xs, x, cases[i].L), up(tdt, 2, ts, c, CONTIG), up(tdt, 2, ts, s, TRANS)},
                                       .dt = cases[i].odt});
            void *out = tmp((size_t)n * cdf_dtype_size(odt));
            assert_int_equal(cdf_k_rope(out, odt, typed(x, n, dt), dt, c, s, xs[0], xs[1], xs[2], xs[3]), CDF_OK);
            char cs[80];
            snprintf(cs, sizeof cs, "x %s%s tables %s%s%s", shp(4, xs), k_layout[cases[i].L], cdf_dtype_name(tdt),
                     cases[i].odt ? " -> " : "", cases[i].odt ? cdf_dtype_name(odt) : "");
            check("rope", cs, y, odt, 4, xs, as_f32(out, odt, n), thr_for(odt, THR_EW));
            case_end();
        }
        /* the tables from positions (FLUX's three axes, and ragged small ones), positions i64 or f32 */
        static const struct {
            int64_t rows;
            int n_axes;
            int64_t axes[3];
            double theta;
            cdf_dtype pdt;
        } tabs[] = {
            {17, 3, {16, 56, 56}, 10000.0, CDF_I64}, {1, 1, {2}, 10000.0, CDF_F32},
            {65, 2, {6, 4}, 256.0, CDF_F32},        {5, 3, {4, 8, 2}, 10000.0, CDF_I32},
        };
        for (size_t i = 0; i < sizeof tabs / sizeof *tabs; i++) {
            case_begin();
            const int64_t ps[2] = {tabs[i].rows, tabs[i].n_axes};
            int64_t width = 0;
            for (int a = 0; a < tabs[i].n_axes; a++) width += tabs[i].axes[a];
            float *pos = rnd(ps[0] * ps[1], 0, 200, tabs[i].pdt == CDF_F32 ? CDF_F32 : CDF_I32);
            cdf_tensor *tsn = NULL;
            cdf_tensor *tc = run2((call){.what = A_ROPE_TABLES, .n_in = 1, .in = {up(tabs[i].pdt, 2, ps, pos, TRANS)},
                                         .i0 = tabs[i].n_axes, .ints = tabs[i].axes, .value = tabs[i].theta},
                                  &tsn);
            float *out = tmp((size_t)(2 * ps[0] * width) * sizeof *out);
            assert_int_equal(cdf_k_rope_table(out, pos, ps[0], tabs[i].n_axes, tabs[i].axes, tabs[i].theta), CDF_OK);
            const int64_t os[2] = {ps[0], width};
            char cs[80];
            snprintf(cs, sizeof cs, "pos %s T %s axes %d theta %g", shp(2, ps), cdf_dtype_name(tabs[i].pdt), tabs[i].n_axes,
                     tabs[i].theta);
            check("rope_table", cs, tc, CDF_F32, 2, os, out, THR_EW);
            check("rope_table", cs, tsn, CDF_F32, 2, os, out + ps[0] * width, THR_EW);
            case_end();
        }
        /* diffusers get_timestep_embedding: even and odd dims, flip, shift, scale; t f32/i64/bf16 */
        static const struct {
            int64_t n;
            int dim;
            bool flip;
            float shift, scale, max_period;
            cdf_dtype tdt;
        } temb[] = {
            {1, 256, true, 0, 1, 10000, CDF_F32},   {3, 129, false, 1, 1, 10000, CDF_F32},
            {2, 64, true, 1, 1000, 10000, CDF_F32}, {5, 32, false, 0, 1, 100, CDF_I64},
            {2, 17, true, 0, 1, 10000, CDF_BF16},
        };
        for (size_t i = 0; i < sizeof temb / sizeof *temb; i++) {
            case_begin();
            float *t = rnd(temb[i].n, 0, 1000, temb[i].tdt == CDF_I64 ? CDF_I64 : temb[i].tdt);
            if (temb[i].scale > 1)
                for (int64_t k = 0; k < temb[i].n; k++) t[k] /= 1000.0f; /* sigmas in [0, 1) */
            round_to(t, temb[i].n, temb[i].tdt);
            cdf_tensor *y = run((call){.what = A_TIMESTEP_EMB, .n_in = 1, .in = {up(temb[i].tdt, 1, &temb[i].n, t, CONTIG)},
                                       .i0 = temb[i].dim, .flag = temb[i].flip, .f1 = temb[i].shift, .f0 = temb[i].scale,
                                       .f2 = temb[i].max_period});
            float *out = tmp((size_t)(temb[i].n * temb[i].dim) * sizeof *out);
            assert_int_equal(cdf_k_timestep_embedding(out, t, temb[i].n, temb[i].dim, temb[i].flip, temb[i].shift, temb[i].scale,
                                                      temb[i].max_period),
                             CDF_OK);
            const int64_t os[2] = {temb[i].n, temb[i].dim};
            char cs[96];
            snprintf(cs, sizeof cs, "t [%lld] %s dim %d%s shift %g scale %g period %g", (long long)temb[i].n,
                     cdf_dtype_name(temb[i].tdt), temb[i].dim, temb[i].flip ? " flip" : "", (double)temb[i].shift,
                     (double)temb[i].scale, (double)temb[i].max_period);
            check("timestep_emb", cs, y, CDF_F32, 2, os, out, THR_EW);
            case_end();
        }
    }
    END_TEST();
}

/* ---- FUSED: elementwise chains under defer-and-fuse ---------------------------------------------
 * The chain becomes one CDF_OP_FUSED node (graph/fuse.c) when its intermediates are released
 * before the sync, as a model forward does; the reference runs the plain kernels one op at a time
 * with f32 intermediates. The case fails if no fused kernel was made (the op would go untested). */

static void test_fused(void **state) {
    (void)state;
    static const struct {
        int64_t s[3];
        layout L;
        cdf_dtype dt;
    } cases[] = {
        {{2, 17, 65}, CONTIG, CDF_F32}, {{1, 3, 129}, TRANS, CDF_F32}, {{3, 5, 17}, STRIDED, CDF_BF16}, {{1, 1, 1}, CONTIG, CDF_F32},
    };
    cdf_exec_mode prev = cdf_exec_get_mode();
    assert_int_equal(cdf_exec_set_mode(CDF_EXEC_DEFER_AND_FUSE), CDF_OK);
    FOR_EACH_DEVICE {
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
            case_begin();
            const int64_t *s = cases[i].s, ms[3] = {s[0], 1, s[2]};
            cdf_dtype dt = cases[i].dt;
            int64_t n = numel(3, s), nm = numel(3, ms);
            float *x = rnd(n, -3, 3, dt), *scale = rnd(nm, -1, 1, CDF_F32), *shift = rnd(nm, -1, 1, CDF_F32);
            float *res = rnd(n, -1, 1, CDF_F32);
            cdf_exec_stats s0, s1;
            cdf_exec_get_stats(&s0);
            /* res + gelu_tanh(silu(x * (1 + scale) + shift)) * 0.5: the AdaLN modulation of a DiT block */
            cdf_scope_push();
            cdf_tensor *tx = up(dt, 3, s, x, cases[i].L), *tsc = up(CDF_F32, 3, ms, scale, CONTIG);
            cdf_tensor *tsh = up(CDF_F32, 3, ms, shift, CONTIG), *tres = up(CDF_F32, 3, s, res, CONTIG);
            cdf_tensor *h = cdf_add(cdf_mul(tx, cdf_add_scalar(tsc, 1.0f)), tsh);
            cdf_tensor *y = cdf_add(tres, cdf_scale(cdf_gelu(cdf_silu(h), CDF_GELU_TANH), 0.5f));
            cdf_scope_pop(&y, 1);
            /* reference: one kernel per op on the host, f32 intermediates */
            int64_t st[3], mst[3] = {s[2], 0, 1};
            cstrides(3, s, st);
            float *sc1 = tmp((size_t)nm * sizeof *sc1), *t = tmp((size_t)n * sizeof *t);
            memcpy(sc1, scale, (size_t)nm * sizeof *sc1);
            cdf_k_unary_span_at(CDF_K_ISA_GENERIC, CDF_UN_ADD_SCALAR, sc1, nm, 1.0f, 0);
            assert_int_equal(cdf_k_binary(CDF_BIN_MUL, t, CDF_F32, typed(x, n, dt), dt, st, sc1, CDF_F32, mst, 3, s), CDF_OK);
            assert_int_equal(cdf_k_binary(CDF_BIN_ADD, t, CDF_F32, t, CDF_F32, st, shift, CDF_F32, mst, 3, s), CDF_OK);
            cdf_k_unary_span_at(CDF_K_ISA_GENERIC, CDF_UN_SILU, t, n, 0, 0);
            cdf_k_unary_span_at(CDF_K_ISA_GENERIC, CDF_UN_GELU_TANH, t, n, 0, 0);
            cdf_k_unary_span_at(CDF_K_ISA_GENERIC, CDF_UN_SCALE, t, n, 0.5f, 0);
            assert_int_equal(cdf_k_binary(CDF_BIN_ADD, t, CDF_F32, res, CDF_F32, st, t, CDF_F32, st, 3, s), CDF_OK);
            char cs[96];
            snprintf(cs, sizeof cs, "res+gelu(silu(x*(1+sc)+sh))*.5 x %s%s %s", shp(3, s), k_layout[cases[i].L],
                     cdf_dtype_name(dt));
            check("fused", cs, y, CDF_F32, 3, s, t, THR_EW);
            cdf_exec_get_stats(&s1);
            cdf_device_info info;
            assert_int_equal(cdf_device_get_info(g_dev, &info), CDF_OK);
            /* the values kind (pjrt) gets the chain unfused, as part of one program its compiler fuses */
            if (s1.fused_kernels == s0.fused_kernels && !info.values)
                row("fused", cs, CDF_F32, NAN, THR_EW, false, "no fused kernel was made");
            case_end();
        }
    }
    assert_int_equal(cdf_exec_set_mode(prev), CDF_OK);
    END_TEST();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_copy),      cmocka_unit_test(test_fill),       cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_unary),     cmocka_unit_test(test_binary),     cmocka_unit_test(test_matmul), cmocka_unit_test(test_matmul_quantized),
        cmocka_unit_test(test_softmax),   cmocka_unit_test(test_norms),      cmocka_unit_test(test_group_norm),
        cmocka_unit_test(test_reduce),    cmocka_unit_test(test_conv2d),     cmocka_unit_test(test_upsample),
        cmocka_unit_test(test_attention), cmocka_unit_test(test_rope),       cmocka_unit_test(test_fused),
    };
    return cmocka_run_group_tests(tests, setup_devices, NULL);
}
