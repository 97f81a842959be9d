/* Matmul epilogues (graph/fuse.c cdf_fuse_matmul_epilogues): the elementwise chain after a matmul
 * (bias, GELU/SiLU, gate, residual, modulation) folded into the matmul node must give results
 * bit-identical to running every op on its own. Each pattern below is a piece of an SD3 / FLUX
 * block, run through the tensor API eagerly (the expected values: one kernel per op, every
 * intermediate stored), under defer-and-fuse and through a compiled graph (capture and replay),
 * compared byte for byte, with the number of epilogues each mode must have made. The pass itself
 * is also run on a hand-built graph: what it must refuse, and a backend that says no. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#include "cdiffusers/cdiffusers.h"
#include "compile/compile.h"
#include "graph/fuse.h"
#include "tensor/tensor_impl.h"

enum { B = 2, L = 77, D = 64, H = 4 * D, HEADS = 2, DH = 32 };

static cdf_tensor *rnd(int ndim, const int64_t *shape, uint64_t seed, cdf_dtype dt) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    float *v = malloc((size_t)n * sizeof *v);
    assert_non_null(v);
    tu_fill_random(v, (size_t)n, seed);
    cdf_tensor *t = cdf_tensor_from_host(tu_cpu(), dt, ndim, shape, v, CDF_F32);
    free(v);
    assert_non_null(t);
    return t;
}

static cdf_tensor *weight(int64_t out, int64_t in, uint64_t seed, cdf_dtype dt) {
    return rnd(2, (int64_t[]){out, in}, seed, dt);
}

static cdf_tensor *vec(int64_t n, uint64_t seed) { return rnd(1, (int64_t[]){n}, seed, CDF_F32); }

/* A pattern's weights (constants of a compiled graph) and its forward over named inputs. */
typedef struct pattern {
    const char *name;
    cdf_dtype wdt;
    int epilogues; /* what the fusion must make of it */
    int norms;     /* of its fused kernels: those headed by a LayerNorm (the modulated norms) */
    cdf_tensor *(*fwd)(const struct pattern *p, const cdf_tensor_map *in);
    cdf_tensor *w[6], *b[6];
} pattern;

#define IN(name) cdf_tensor_map_get(in, name)

static cdf_tensor *modulate(const cdf_tensor_map *in) {
    cdf_tensor *n = cdf_layer_norm(IN("x"), NULL, NULL, 1e-6f);
    return cdf_add(cdf_mul(n, cdf_add_scalar(IN("scale"), 1.0f)), IN("shift"));
}

/* SD3/FLUX FeedForward with the gated residual: res + gate * W2 gelu_tanh(W1 h + b1) + b2 */
static cdf_tensor *ff(const pattern *p, const cdf_tensor_map *in) {
    cdf_tensor *u = cdf_gelu(cdf_linear(modulate(in), p->w[0], p->b[0]), CDF_GELU_TANH);
    return cdf_add(IN("res"), cdf_mul(IN("gate"), cdf_linear(u, p->w[1], p->b[1])));
}

/* FLUX single block: mlp = gelu(W_mlp h), attention stand-in W_a h, proj_out of their concat,
 * gated residual (the gate on the right this time) */
static cdf_tensor *single_block(const pattern *p, const cdf_tensor_map *in) {
    cdf_tensor *h = modulate(in);
    cdf_tensor *mlp = cdf_gelu(cdf_linear(h, p->w[0], p->b[0]), CDF_GELU_TANH);
    cdf_tensor *a = cdf_linear(h, p->w[1], p->b[1]);
    cdf_tensor *cat = cdf_cat((cdf_tensor *[]){a, mlp}, 2, 2);
    return cdf_add(cdf_mul(cdf_linear(cat, p->w[2], p->b[2]), IN("gate")), IN("res"));
}

/* AdaLN: emb = W silu(temb) + b, chunked into shift/scale: the product is read through views
 * (no epilogue), the modulation after it is an elementwise chain of its own */
static cdf_tensor *adaln(const pattern *p, const cdf_tensor_map *in) {
    cdf_tensor *e = cdf_linear(cdf_silu(IN("temb")), p->w[0], p->b[0]);
    cdf_tensor *sh = cdf_unsqueeze(cdf_narrow(e, 1, 0, D), 1), *sc = cdf_unsqueeze(cdf_narrow(e, 1, D, D), 1);
    return cdf_add(cdf_mul(IN("x"), cdf_add_scalar(sc, 1.0f)), sh);
}

/* LoRA at run time (PEFT): W x + b + 0.5 * B(A x) */
static cdf_tensor *lora(const pattern *p, const cdf_tensor_map *in) {
    cdf_tensor *base = cdf_linear(IN("x"), p->w[0], p->b[0]);
    cdf_tensor *delta = cdf_linear(cdf_linear(IN("x"), p->w[1], NULL), p->w[2], NULL);
    return cdf_add(base, cdf_scale(delta, 0.5f));
}

/* batched: attention scores q k^T * scale + mask (mask broadcast over batch and heads) */
static cdf_tensor *scores(const pattern *p, const cdf_tensor_map *in) {
    (void)p;
    cdf_tensor *s = cdf_matmul(IN("q"), cdf_transpose(IN("k"), 2, 3));
    return cdf_add(cdf_scale(s, 0.125f), IN("mask"));
}

/* the product read twice (gelu(p) * p): no epilogue, the elementwise part still fuses */
static cdf_tensor *reread(const pattern *p, const cdf_tensor_map *in) {
    cdf_tensor *y = cdf_linear(IN("x"), p->w[0], p->b[0]);
    return cdf_mul(cdf_gelu(y, CDF_GELU_ERF), y);
}

/* bf16 activations: a bf16 product is rounded before the chain reads it, so it stays unfused */
static cdf_tensor *bf16_act(const pattern *p, const cdf_tensor_map *in) {
    cdf_tensor *y = cdf_linear(cdf_cast(IN("x"), CDF_BF16), p->w[0], p->b[0]);
    return cdf_add(IN("res"), cdf_silu(y));
}

/* SD3 / FLUX attention inputs: the modulated norm rounded to bf16 once for the three bf16
 * projections (nn.h: cdf_linear_shared_input), f32 products; the cast must end the modulation's
 * fused chain (the fused kernel stores bf16), not run as a kernel of its own. keep_f32: the same
 * without the cast (the kernel count the cast must not add to). */
static cdf_tensor *shared_in(const pattern *p, const cdf_tensor_map *in, bool keep_f32) {
    cdf_tensor *h = modulate(in);
    if (!keep_f32) h = cdf_cast(h, CDF_BF16);
    cdf_tensor *y[3];
    for (int k = 0; k < 3; k++) y[k] = cdf_linear_as(h, p->w[k], p->b[k], CDF_F32);
    return cdf_cat(y, 3, 2);
}
static cdf_tensor *shared_bf16(const pattern *p, const cdf_tensor_map *in) { return shared_in(p, in, false); }
static cdf_tensor *shared_f32(const pattern *p, const cdf_tensor_map *in) { return shared_in(p, in, true); }

static void make_weights(pattern *p) {
    uint64_t seed = 100;
    const int64_t shapes[][2] = {{H, D}, {D, H}, {D, D + H}};
    for (int k = 0; k < 3; k++) {
        int64_t out = shapes[k][0], inw = shapes[k][1];
        if (p->fwd == single_block) {
            const int64_t sb[][2] = {{H, D}, {D, D}, {D, D + H}};
            out = sb[k][0];
            inw = sb[k][1];
        } else if (p->fwd == adaln) {
            out = 2 * D;
            inw = D;
        } else if (p->fwd == lora) {
            const int64_t lo[][2] = {{D, D}, {8, D}, {D, 8}};
            out = lo[k][0];
            inw = lo[k][1];
        } else if (p->fwd == reread || p->fwd == bf16_act || p->fwd == shared_bf16 || p->fwd == shared_f32) {
            out = D;
            inw = D;
        }
        p->w[k] = weight(out, inw, seed++, p->wdt);
        p->b[k] = vec(out, seed++);
    }
}

static void make_inputs(cdf_tensor_map *in) {
    cdf_tensor_map_init(in);
    const int64_t xs[3] = {B, L, D}, ms[3] = {B, 1, D}, ts[2] = {B, D};
    const int64_t qs[4] = {B, HEADS, L, DH}, mk[4] = {1, 1, L, L};
    cdf_tensor *t[] = {rnd(3, xs, 1, CDF_F32), rnd(3, xs, 2, CDF_F32), rnd(3, ms, 3, CDF_F32), rnd(3, ms, 4, CDF_F32),
                       rnd(3, ms, 5, CDF_F32), rnd(2, ts, 6, CDF_F32),  rnd(4, qs, 7, CDF_F32), rnd(4, qs, 8, CDF_F32),
                       rnd(4, mk, 9, CDF_F32)};
    const char *names[] = {"x", "res", "gate", "shift", "scale", "temb", "q", "k", "mask"};
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
        assert_int_equal(cdf_tensor_map_set(in, names[i], t[i]), CDF_OK);
        cdf_tensor_release(t[i]);
    }
}

static cdf_status traced(void *ctx, const cdf_tensor_map *in, cdf_tensor_map *out) {
    const pattern *p = ctx;
    cdf_tensor *y = p->fwd(p, in);
    return y ? cdf_tensor_map_set(out, "y", y) : cdf_last_status();
}

/* The pattern's output on the host; *n_out its element count. The forward's intermediates are
 * dropped before the sync point, as a model forward's are. */
static float *run_direct(const pattern *p, const cdf_tensor_map *in, int64_t *n_out) {
    cdf_scope_push();
    cdf_tensor *y = p->fwd(p, in);
    assert_non_null(y);
    cdf_scope_pop(&y, 1);
    *n_out = cdf_shape_numel(y->ndim, y->shape);
    float *r = cdf_tensor_read_f32(y);
    assert_non_null(r);
    cdf_tensor_release(y);
    return r;
}

static float *run_compiled(cdf_graph_cache *gc, pattern *p, const cdf_tensor_map *in) {
    cdf_tensor_map out;
    cdf_tensor_map_init(&out);
    assert_int_equal(cdf_graph_cache_run(gc, traced, p, in, &out, NULL, 0), CDF_OK);
    float *r = cdf_tensor_read_f32(cdf_tensor_map_get(&out, "y"));
    assert_non_null(r);
    cdf_tensor_map_clear(&out);
    return r;
}

static void check_pattern(pattern *p) {
    make_weights(p);
    cdf_tensor_map in;
    make_inputs(&in);
    int64_t n = 0, n2 = 0;
    assert_int_equal(cdf_exec_set_mode(CDF_EXEC_EAGER), CDF_OK);
    float *want = run_direct(p, &in, &n);

    cdf_exec_stats s0, s1;
    assert_int_equal(cdf_exec_set_mode(CDF_EXEC_DEFER_AND_FUSE), CDF_OK);
    cdf_exec_get_stats(&s0);
    float *got = run_direct(p, &in, &n2);
    cdf_exec_get_stats(&s1);
    assert_int_equal(n, n2);
    print_message("  %s: defer-and-fuse %llu ops -> %llu kernels, %llu matmul epilogues, %llu norm heads\n", p->name,
                  (unsigned long long)(s1.ops - s0.ops), (unsigned long long)(s1.kernels_launched - s0.kernels_launched),
                  (unsigned long long)(s1.matmul_epilogues - s0.matmul_epilogues),
                  (unsigned long long)(s1.fused_norms - s0.fused_norms));
    assert_int_equal(s1.matmul_epilogues - s0.matmul_epilogues, p->epilogues);
    assert_int_equal(s1.fused_norms - s0.fused_norms, p->norms);
    assert_memory_equal(want, got, (size_t)n * sizeof *want);
    free(got);
    assert_int_equal(cdf_exec_set_mode(CDF_EXEC_EAGER), CDF_OK);

    /* compiled: the capture's epilogues, then a replay with the same inputs */
    cdf_graph_cache *gc = cdf_graph_cache_new(p->name, NULL);
    assert_non_null(gc);
    cdf_exec_get_stats(&s0);
    got = run_compiled(gc, p, &in);
    cdf_exec_get_stats(&s1);
    assert_int_equal(s1.compiles - s0.compiles, 1);
    assert_int_equal(s1.matmul_epilogues - s0.matmul_epilogues, p->epilogues);
    assert_int_equal(s1.fused_norms - s0.fused_norms, p->norms);
    assert_memory_equal(want, got, (size_t)n * sizeof *want);
    free(got);
    got = run_compiled(gc, p, &in);
    cdf_exec_get_stats(&s0);
    assert_int_equal(s0.cache_hits - s1.cache_hits, 1);
    assert_memory_equal(want, got, (size_t)n * sizeof *want);
    free(got);
    cdf_graph_cache_free(gc);

    free(want);
    cdf_tensor_map_clear(&in);
    for (int k = 0; k < 6; k++) {
        cdf_tensor_release(p->w[k]);
        cdf_tensor_release(p->b[k]);
    }
}

#define PATTERN_TEST(fn, dt, n_epi, n_norms)                                                                          \
    static void test_##fn##_##dt(void **state) {                                                                      \
        (void)state;                                                                                                   \
        pattern p = {.name = #fn "_" #dt, .wdt = CDF_##dt, .epilogues = n_epi, .norms = n_norms, .fwd = fn};            \
        check_pattern(&p);                                                                                             \
    }

PATTERN_TEST(ff, F32, 2, 1)
PATTERN_TEST(ff, BF16, 2, 1) /* f32 activations, bf16 weights: the product is f32 */
PATTERN_TEST(single_block, F32, 2, 1)
PATTERN_TEST(adaln, F32, 0, 0)
PATTERN_TEST(lora, F32, 2, 0)
PATTERN_TEST(scores, F32, 1, 0)
PATTERN_TEST(reread, F32, 0, 0)
PATTERN_TEST(bf16_act, BF16, 0, 0)
PATTERN_TEST(shared_bf16, BF16, 0, 1)

/* defer-and-fuse kernels of a pattern's forward */
static uint64_t deferred_kernels(pattern *p) {
    make_weights(p);
    cdf_tensor_map in;
    make_inputs(&in);
    cdf_exec_stats s0, s1;
    assert_int_equal(cdf_exec_set_mode(CDF_EXEC_DEFER_AND_FUSE), CDF_OK);
    cdf_exec_get_stats(&s0);
    int64_t n = 0;
    free(run_direct(p, &in, &n));
    cdf_exec_get_stats(&s1);
    assert_int_equal(cdf_exec_set_mode(CDF_EXEC_EAGER), CDF_OK);
    cdf_tensor_map_clear(&in);
    for (int k = 0; k < 6; k++) {
        cdf_tensor_release(p->w[k]);
        cdf_tensor_release(p->b[k]);
    }
    return s1.kernels_launched - s0.kernels_launched;
}

/* the bf16 cast of the shared input costs no kernel: it is the modulation chain's store */
static void test_shared_input_cast_fused(void **state) {
    (void)state;
    pattern with = {.name = "shared_bf16", .wdt = CDF_BF16, .fwd = shared_bf16};
    pattern without = {.name = "shared_f32", .wdt = CDF_BF16, .fwd = shared_f32};
    const uint64_t kw = deferred_kernels(&with), ko = deferred_kernels(&without);
    print_message("  shared input: %llu kernels with the bf16 cast, %llu without\n", (unsigned long long)kw,
                  (unsigned long long)ko);
    assert_int_equal(kw, ko);
}

/* A norm head at DiT width: LayerNorm over 1536 columns (rows longer than the fused kernel's
 * 256-element blocks), 2 x 37 rows (not whole groups of 16), then modulation, GELU and a bf16
 * store: defer-and-fuse makes one kernel of it (and one of 1 + scale), equal byte for byte to the
 * ops run one by one. */
static void test_norm_head_wide(void **state) {
    (void)state;
    const int64_t W = 1536, xs[3] = {2, 37, W}, ms[3] = {2, 1, W}, n = 2 * 37 * W;
    cdf_tensor *x = rnd(3, xs, 11, CDF_F32), *sc = rnd(3, ms, 12, CDF_F32), *sh = rnd(3, ms, 13, CDF_F32);
    uint16_t *out[2];
    for (int fused = 0; fused < 2; fused++) {
        assert_int_equal(cdf_exec_set_mode(fused ? CDF_EXEC_DEFER_AND_FUSE : CDF_EXEC_EAGER), CDF_OK);
        cdf_exec_stats s0, s1;
        cdf_exec_get_stats(&s0);
        cdf_scope_push();
        cdf_tensor *h = cdf_add(cdf_mul(cdf_layer_norm(x, NULL, NULL, 1e-6f), cdf_add_scalar(sc, 1.0f)), sh);
        cdf_tensor *y = cdf_cast(cdf_gelu(h, CDF_GELU_TANH), CDF_BF16);
        assert_non_null(y);
        cdf_scope_pop(&y, 1);
        out[fused] = malloc((size_t)n * sizeof **out);
        assert_non_null(out[fused]);
        assert_int_equal(cdf_tensor_read(y, CDF_BF16, out[fused], (size_t)n * sizeof **out), CDF_OK);
        cdf_exec_get_stats(&s1);
        cdf_tensor_release(y);
        if (fused) {
            assert_int_equal(s1.fused_norms - s0.fused_norms, 1);
            assert_int_equal(s1.kernels_launched - s0.kernels_launched, 2);
        }
    }
    assert_int_equal(cdf_exec_set_mode(CDF_EXEC_EAGER), CDF_OK);
    assert_memory_equal(out[0], out[1], (size_t)n * sizeof **out);
    free(out[0]);
    free(out[1]);
    cdf_tensor_release(x);
    cdf_tensor_release(sc);
    cdf_tensor_release(sh);
}

/* ---- the pass on a hand-built graph ---------------------------------------------------------- */

typedef struct mini {
    cdf_node *nodes[4];
    int n;
    cdf_tensor *y; /* the chain's result (held) */
} mini;

/* a node of kind k reading src[0..n_src) (NULL = an absent operand) into dst */
static cdf_node *node_of(cdf_op_kind k, cdf_tensor *dst, int n_src, cdf_tensor *const *src) {
    cdf_node *n = cdf_node_new(k);
    assert_non_null(n);
    for (int i = 0; i < n_src; i++) cdf_node_add_src(n, src[i]);
    n->dst = cdf_tensor_retain(dst);
    return n;
}

/* y = gelu(x @ w^T) as two nodes whose intermediate only they hold; keep_mid: the caller keeps it */
static void build_mini(mini *g, bool keep_mid, cdf_tensor **mid_out) {
    cdf_device *d = tu_cpu();
    cdf_tensor *x = cdf_tensor_zeros(d, CDF_F32, 2, (int64_t[]){5, 3});
    cdf_tensor *w = cdf_tensor_zeros(d, CDF_F32, 2, (int64_t[]){3, 4});
    cdf_tensor *mid = cdf_tensor_zeros(d, CDF_F32, 2, (int64_t[]){5, 4});
    g->y = cdf_tensor_zeros(d, CDF_F32, 2, (int64_t[]){5, 4});
    assert_int_equal(cdf_device_synchronize(d), CDF_OK); /* the queue drops its references to them */
    assert_true(x && w && mid && g->y);
    g->nodes[0] = node_of(CDF_OP_MATMUL, mid, 2, (cdf_tensor *[]){x, w});
    g->nodes[0]->p.matmul.alpha = 1.0f;
    g->nodes[1] = node_of(CDF_OP_UNARY, g->y, 1, &mid);
    g->nodes[1]->p.unary.op = CDF_UN_GELU_TANH;
    g->n = 2;
    cdf_tensor_release(x);
    cdf_tensor_release(w);
    if (keep_mid) *mid_out = mid;
    else cdf_tensor_release(mid);
}

static void free_mini(mini *g) {
    for (int i = 0; i < g->n; i++) cdf_node_free(g->nodes[i]);
    cdf_tensor_release(g->y);
}

static bool say_no(const cdf_node *n) { return n->kind != CDF_OP_MATMUL || !n->p.matmul.epilogue; }
static bool no_norm_heads(const cdf_node *n) { return n->kind != CDF_OP_FUSED || !n->p.fused.prog->norm_head; }

/* y = silu(layer_norm(x) * s) as three nodes (s: a second input), the norm with a weight when
 * affine (which no norm head takes) */
static void build_norm_chain(mini *g, bool affine) {
    cdf_device *d = tu_cpu();
    const int64_t sh[2] = {5, 8};
    cdf_tensor *x = cdf_tensor_zeros(d, CDF_F32, 2, sh), *s = cdf_tensor_zeros(d, CDF_F32, 2, sh);
    cdf_tensor *w = affine ? cdf_tensor_zeros(d, CDF_F32, 1, (int64_t[]){8}) : NULL;
    cdf_tensor *n1 = cdf_tensor_zeros(d, CDF_F32, 2, sh), *n2 = cdf_tensor_zeros(d, CDF_F32, 2, sh);
    g->y = cdf_tensor_zeros(d, CDF_F32, 2, sh);
    assert_int_equal(cdf_device_synchronize(d), CDF_OK);
    assert_true(x && s && n1 && n2 && g->y && (w || !affine));
    cdf_node *ln = node_of(CDF_OP_LAYER_NORM, n1, 3, (cdf_tensor *[]){x, w, NULL});
    ln->p.norm.rows = 5;
    ln->p.norm.cols = 8;
    ln->p.norm.eps = 1e-5f;
    g->nodes[0] = ln;
    g->nodes[1] = node_of(CDF_OP_BINARY, n2, 2, (cdf_tensor *[]){n1, s});
    g->nodes[1]->p.binary.op = CDF_BIN_MUL;
    g->nodes[2] = node_of(CDF_OP_UNARY, g->y, 1, &n2);
    g->nodes[2]->p.unary.op = CDF_UN_SILU;
    g->n = 3;
    cdf_tensor *drop[] = {x, s, w, n1, n2};
    for (int k = 0; k < 5; k++) cdf_tensor_release(drop[k]);
}

static void test_pass_rules(void **state) {
    (void)state;
    mini g;
    cdf_fuse_stats fs = {0};
    /* folded: one matmul node carrying a one-step program, writing the chain's result */
    build_mini(&g, false, NULL);
    cdf_fuse_matmul_epilogues(g.nodes, &g.n, NULL, &fs);
    assert_int_equal(g.n, 1);
    assert_int_equal(fs.epilogues, 1);
    assert_int_equal(g.nodes[0]->kind, CDF_OP_MATMUL);
    assert_non_null(g.nodes[0]->p.matmul.epilogue);
    assert_int_equal(g.nodes[0]->p.matmul.epilogue->n_steps, 1);
    assert_int_equal(g.nodes[0]->p.matmul.epilogue->steps[0].op, CDF_UN_GELU_TANH);
    assert_ptr_equal(g.nodes[0]->dst->storage, g.y->storage);
    assert_int_equal(g.nodes[0]->n_src, 3); /* A, B, the (empty) bias slot */
    assert_null(g.nodes[0]->src[2]);
    /* a copy of the node (compile's binding) owns its own program */
    cdf_node *c = cdf_node_new(CDF_OP_MATMUL);
    assert_true(cdf_node_copy_params(c, g.nodes[0]));
    assert_true(c->p.matmul.epilogue && c->p.matmul.epilogue != g.nodes[0]->p.matmul.epilogue);
    cdf_node_free(c);
    free_mini(&g);

    /* a backend that cannot run epilogues: the graph stays as it was */
    build_mini(&g, false, NULL);
    fs = (cdf_fuse_stats){0};
    cdf_fuse_matmul_epilogues(g.nodes, &g.n, say_no, &fs);
    assert_int_equal(g.n, 2);
    assert_int_equal(fs.epilogues, 0);
    assert_null(g.nodes[0]->p.matmul.epilogue);
    free_mini(&g);

    /* the product still held by the caller: it must exist, so no folding */
    cdf_tensor *mid = NULL;
    build_mini(&g, true, &mid);
    cdf_fuse_matmul_epilogues(g.nodes, &g.n, NULL, &fs);
    assert_int_equal(g.n, 2);
    cdf_tensor_release(mid);
    free_mini(&g);

    /* a node between the matmul and its chain overwrites A: the matmul cannot move past it */
    build_mini(&g, false, NULL);
    cdf_node *fill = cdf_node_new(CDF_OP_FILL);
    fill->dst = cdf_tensor_retain(g.nodes[0]->src[0]);
    g.nodes[2] = g.nodes[1];
    g.nodes[1] = fill;
    g.n = 3;
    fs = (cdf_fuse_stats){0};
    cdf_fuse_matmul_epilogues(g.nodes, &g.n, NULL, &fs);
    assert_int_equal(g.n, 3);
    assert_int_equal(fs.epilogues, 0);
    free_mini(&g);

    /* a plain LayerNorm heads the chain after it: one fused node reading the norm's input */
    build_norm_chain(&g, false);
    cdf_tensor *x = cdf_tensor_retain(g.nodes[0]->src[0]);
    fs = (cdf_fuse_stats){0};
    cdf_fuse_elementwise(g.nodes, &g.n, NULL, &fs);
    assert_int_equal(g.n, 1);
    assert_int_equal(fs.norm_heads, 1);
    assert_int_equal(g.nodes[0]->kind, CDF_OP_FUSED);
    assert_true(g.nodes[0]->p.fused.prog->norm_head);
    assert_true(g.nodes[0]->p.fused.prog->norm_eps == 1e-5f);
    assert_int_equal(g.nodes[0]->p.fused.prog->n_steps, 2);
    assert_ptr_equal(g.nodes[0]->src[0]->storage, x->storage);
    assert_ptr_equal(g.nodes[0]->dst->storage, g.y->storage);
    cdf_tensor_release(x);
    free_mini(&g);

    /* a backend without norm heads, or a norm with a weight: the norm stays, the chain after it
     * still fuses */
    for (int affine = 0; affine < 2; affine++) {
        build_norm_chain(&g, affine);
        fs = (cdf_fuse_stats){0};
        cdf_fuse_elementwise(g.nodes, &g.n, affine ? NULL : no_norm_heads, &fs);
        assert_int_equal(g.n, 2);
        assert_int_equal(fs.norm_heads, 0);
        assert_int_equal(g.nodes[0]->kind, CDF_OP_LAYER_NORM);
        assert_int_equal(g.nodes[1]->kind, CDF_OP_FUSED);
        assert_false(g.nodes[1]->p.fused.prog->norm_head);
        free_mini(&g);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ff_F32),     cmocka_unit_test(test_ff_BF16),   cmocka_unit_test(test_single_block_F32),
        cmocka_unit_test(test_adaln_F32),  cmocka_unit_test(test_lora_F32),  cmocka_unit_test(test_scores_F32),
        cmocka_unit_test(test_reread_F32), cmocka_unit_test(test_bf16_act_BF16), cmocka_unit_test(test_shared_bf16_BF16),
        cmocka_unit_test(test_shared_input_cast_fused), cmocka_unit_test(test_norm_head_wide),
        cmocka_unit_test(test_pass_rules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
