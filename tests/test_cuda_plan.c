/* The CUDA backend's host-side logic, without a GPU (backend/cuda/cuda_plan.h):
 *  - the cuBLASLt problem derived from tensor strides: executed here by a plain column-major
 *    GEMM that reads memory exactly as cuBLASLt would with the planned transposes, leading
 *    dimensions and batch strides, and compared with a row-major matmul computed from the
 *    operands' own strides (transposed views, linear weights, broadcast and chained batches,
 *    single rows/columns), plus the layouts it must refuse;
 *  - which nodes the backend accepts, with the reason for the others; the input dtype of mixed
 *    products (the bf16 policy) and the plan of the matmul on GGUF weights (panel dtype, size);
 *  - the backend's registration: compiled in (CDF_HAVE_CUDA) it appears in the compiled list,
 *    and on a machine without a driver or GPU it registers no device, says why, and the CPU
 *    stays the default; `cdiffusers devices` prints the reason (with a GPU: its info instead).
 * The ops themselves on a GPU: test_cuda_ops.c. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "backend/cuda/cuda_plan.h"
#include "cdiffusers/device.h"
#include "cdiffusers/tensor.h"
#include "tensor/tensor_impl.h"

/* ---- gemm plans ---------------------------------------------------------------------------- */

typedef struct op_desc {
    int ndim;
    int64_t shape[4], strides[4];
    int64_t extent; /* elements of backing memory */
} op_desc;

static cdf_cuda_operand as_operand(const op_desc *o) {
    return (cdf_cuda_operand){.ndim = o->ndim, .shape = o->shape, .strides = o->strides};
}

/* element at a multi-index over the batch dims + (r, c) */
static double at(const double *mem, const op_desc *o, const int64_t *bidx, int64_t r, int64_t c) {
    int64_t off = 0;
    for (int i = 0; i < o->ndim - 2; i++) off += bidx[i] * o->strides[i];
    off += r * o->strides[o->ndim - 2] + c * o->strides[o->ndim - 1];
    return mem[off];
}

/* What cuBLASLt computes with the plan: D = op(A_lt) op(B_lt), column-major, per batch; the
 * pointers advance by the planned batch strides. */
static void run_plan_colmajor(const cdf_cuda_gemm_plan *p, const double *a_mem, const double *b_mem, double *c_mem) {
    for (int64_t bi = 0; bi < p->batch; bi++) {
        const double *A = b_mem + bi * p->lt_a.batch_stride; /* cuBLASLt's A is our B */
        const double *B = a_mem + bi * p->lt_b.batch_stride;
        double *D = c_mem + bi * p->lt_d.batch_stride;
        for (int64_t j = 0; j < p->n; j++)
            for (int64_t i = 0; i < p->m; i++) {
                double s = 0;
                for (int64_t k = 0; k < p->k; k++) {
                    /* stored column-major [rows, cols] with ld: element (r, c) at r + c*ld */
                    double av = p->lt_a.op_t ? A[k + i * p->lt_a.ld] : A[i + k * p->lt_a.ld];
                    double bv = p->lt_b.op_t ? B[j + k * p->lt_b.ld] : B[k + j * p->lt_b.ld];
                    s += av * bv;
                }
                D[i + j * p->lt_d.ld] = s;
            }
    }
}

static void check_gemm_case(const op_desc *a, const op_desc *b, int64_t bshape0, int64_t bshape1, int nb) {
    const int64_t M = a->shape[nb], K = a->shape[nb + 1], N = b->shape[nb + 1];
    op_desc c = {.ndim = nb + 2};
    int64_t batch = 1;
    const int64_t bs[2] = {bshape0, bshape1};
    for (int i = 0; i < nb; i++) {
        c.shape[i] = bs[i];
        batch *= bs[i];
    }
    c.shape[nb] = M;
    c.shape[nb + 1] = N;
    cdf_contiguous_strides(c.ndim, c.shape, c.strides);
    c.extent = batch * M * N;
    cdf_cuda_gemm_plan p;
    assert_int_equal(cdf_cuda_plan_gemm(as_operand(a), as_operand(b), as_operand(&c), &p), CDF_OK);
    assert_int_equal(p.M, M);
    assert_int_equal(p.N, N);
    assert_int_equal(p.K, K);
    assert_int_equal(p.batch, batch);
    /* cuBLASLt's rule: the leading dimension covers a stored column */
    assert_true(p.lt_a.ld >= p.lt_a.rows || p.lt_a.cols <= 1);
    assert_true(p.lt_b.ld >= p.lt_b.rows || p.lt_b.cols <= 1);
    assert_true(p.lt_d.ld >= p.lt_d.rows);
    assert_int_equal(p.lt_a.op_t ? p.lt_a.cols : p.lt_a.rows, p.m);
    assert_int_equal(p.lt_b.op_t ? p.lt_b.rows : p.lt_b.cols, p.n);
    double *am = malloc(sizeof(double) * (size_t)a->extent), *bm = malloc(sizeof(double) * (size_t)b->extent);
    double *got = calloc((size_t)c.extent, sizeof(double)), *want = calloc((size_t)c.extent, sizeof(double));
    for (int64_t i = 0; i < a->extent; i++) am[i] = (double)((i * 7919) % 23) - 11;
    for (int64_t i = 0; i < b->extent; i++) bm[i] = (double)((i * 104729) % 19) - 9;
    if (p.per_batch_calls) { /* one call per batch index: the same arithmetic as the batched one */
        for (int64_t bi = 0; bi < p.batch; bi++) {
            cdf_cuda_gemm_plan one = p;
            one.batch = 1;
            run_plan_colmajor(&one, am + bi * p.lt_b.batch_stride, bm + bi * p.lt_a.batch_stride, got + bi * p.lt_d.batch_stride);
        }
    } else {
        run_plan_colmajor(&p, am, bm, got);
    }
    int64_t bidx[2] = {0, 0};
    for (int64_t bi = 0; bi < batch; bi++) {
        if (nb == 1) bidx[0] = bi;
        if (nb == 2) bidx[0] = bi / bs[1], bidx[1] = bi % bs[1];
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double s = 0;
                for (int64_t k = 0; k < K; k++) s += at(am, a, bidx, i, k) * at(bm, b, bidx, k, j);
                want[bi * M * N + i * N + j] = s;
            }
    }
    for (int64_t i = 0; i < c.extent; i++)
        if (got[i] != want[i]) fail_msg("element %lld: planned GEMM %g, row-major matmul %g", (long long)i, got[i], want[i]);
    free(am);
    free(bm);
    free(got);
    free(want);
}

static void test_gemm_plan_2d(void **state) {
    (void)state;
    /* plain row-major A [5, 3] @ B [3, 4] */
    op_desc a = {2, {5, 3}, {3, 1}, 15}, b = {2, {3, 4}, {4, 1}, 12};
    check_gemm_case(&a, &b, 0, 0, 0);
    /* a linear layer: B = W^T of W [4, 3] (column-major view) */
    op_desc wt = {2, {3, 4}, {1, 3}, 12};
    check_gemm_case(&a, &wt, 0, 0, 0);
    /* A transposed (a view of [3, 5]) and padded rows (row stride 6 > 3) */
    op_desc at_ = {2, {5, 3}, {1, 5}, 15}, ap = {2, {5, 3}, {6, 1}, 30};
    check_gemm_case(&at_, &b, 0, 0, 0);
    check_gemm_case(&ap, &wt, 0, 0, 0);
    /* single row / single column operands with arbitrary strides on the extent-1 dim */
    op_desc row = {2, {1, 3}, {99, 1}, 3}, col = {2, {3, 1}, {1, 77}, 3};
    check_gemm_case(&row, &b, 0, 0, 0);
    check_gemm_case(&a, &col, 0, 0, 0);
    /* a row stored as a column (strides (1, 1)) */
    op_desc row2 = {2, {1, 3}, {1, 1}, 3};
    check_gemm_case(&row2, &wt, 0, 0, 0);
}

static void test_gemm_plan_batched(void **state) {
    (void)state;
    /* [2, 5, 3] @ [2, 3, 4], both contiguous */
    op_desc a = {3, {2, 5, 3}, {15, 3, 1}, 30}, b = {3, {2, 3, 4}, {12, 4, 1}, 24};
    check_gemm_case(&a, &b, 2, 0, 1);
    /* weights broadcast over the batch (stride 0): one call per batch index */
    op_desc bw = {3, {2, 3, 4}, {0, 4, 1}, 12};
    check_gemm_case(&a, &bw, 2, 0, 1);
    cdf_cuda_gemm_plan p;
    op_desc c = {3, {2, 5, 4}, {20, 4, 1}, 40};
    assert_int_equal(cdf_cuda_plan_gemm(as_operand(&a), as_operand(&bw), as_operand(&c), &p), CDF_OK);
    assert_true(p.per_batch_calls);
    assert_int_equal(cdf_cuda_plan_gemm(as_operand(&a), as_operand(&b), as_operand(&c), &p), CDF_OK);
    assert_false(p.per_batch_calls);
    /* attention-like: [B=2, H=3] batch chain with k transposed: q [2,3,4,5] @ k^T [2,3,5,6] */
    op_desc q = {4, {2, 3, 4, 5}, {60, 20, 5, 1}, 120}, kt = {4, {2, 3, 5, 6}, {90, 30, 1, 5}, 180};
    check_gemm_case(&q, &kt, 2, 3, 2);
    /* an extent-1 batch dim in the middle does not break the chain */
    op_desc a1 = {4, {2, 1, 5, 3}, {15, 999, 3, 1}, 30}, b1 = {4, {2, 1, 3, 4}, {12, 5, 4, 1}, 24};
    check_gemm_case(&a1, &b1, 2, 1, 2);
}

static void test_gemm_plan_refuses(void **state) {
    (void)state;
    op_desc b = {2, {3, 4}, {4, 1}, 12}, c = {2, {5, 4}, {4, 1}, 20};
    cdf_cuda_gemm_plan p;
    /* neither dim unit-stride */
    op_desc a = {2, {5, 3}, {6, 2}, 30};
    assert_int_equal(cdf_cuda_plan_gemm(as_operand(&a), as_operand(&b), as_operand(&c), &p), CDF_ERR_INTERNAL);
    assert_non_null(strstr(cdf_last_error(), "operand a"));
    /* overlapping rows (ld 2 < 3 columns) */
    op_desc ov = {2, {5, 3}, {2, 1}, 12};
    assert_int_equal(cdf_cuda_plan_gemm(as_operand(&ov), as_operand(&b), as_operand(&c), &p), CDF_ERR_INTERNAL);
    /* broadcast inner dim (stride 0) */
    op_desc bc = {2, {3, 4}, {0, 1}, 4};
    op_desc a_ok = {2, {5, 3}, {3, 1}, 15};
    assert_int_equal(cdf_cuda_plan_gemm(as_operand(&a_ok), as_operand(&bc), as_operand(&c), &p), CDF_ERR_INTERNAL);
    assert_non_null(strstr(cdf_last_error(), "operand b"));
    /* batch dims that are not one chain: [2, 3] with strides (1, 2) over matrices of 12 */
    op_desc a4 = {4, {2, 3, 5, 3}, {1, 2, 3, 1}, 200}, b4 = {4, {2, 3, 3, 4}, {36, 12, 4, 1}, 72};
    op_desc c4 = {4, {2, 3, 5, 4}, {60, 20, 4, 1}, 120};
    assert_int_equal(cdf_cuda_plan_gemm(as_operand(&a4), as_operand(&b4), as_operand(&c4), &p), CDF_ERR_INTERNAL);
    assert_non_null(strstr(cdf_last_error(), "batch"));
    /* shapes that do not chain */
    op_desc b_bad = {2, {4, 4}, {4, 1}, 16};
    assert_int_equal(cdf_cuda_plan_gemm(as_operand(&a_ok), as_operand(&b_bad), as_operand(&c), &p), CDF_ERR_INTERNAL);
}

/* ---- node checks ----------------------------------------------------------------------------- */

static cdf_node *node_of(cdf_op_kind k, cdf_tensor *dst, cdf_tensor *s0, cdf_tensor *s1, cdf_tensor *s2) {
    cdf_node *n = cdf_node_new(k);
    assert_non_null(n);
    n->dst = dst;
    cdf_tensor_retain(dst);
    cdf_node_add_src(n, s0);
    if (s1 || s2) cdf_node_add_src(n, s1);
    if (s2) cdf_node_add_src(n, s2);
    return n;
}

static void test_check_node(void **state) {
    (void)state;
    cdf_device *cpu = tu_cpu();
    cdf_scope_push();
    const int64_t s2[2] = {4, 8}, s4[4] = {1, 2, 3, 8}, big[4] = {1, 1, 2, 1024}, ids_shape[1] = {4};
    cdf_tensor *f = cdf_tensor_alloc(cpu, CDF_F32, 2, s2), *bf = cdf_tensor_alloc(cpu, CDF_BF16, 2, s2);
    cdf_tensor *i64 = cdf_tensor_alloc(cpu, CDF_I64, 2, s2), *ids = cdf_tensor_alloc(cpu, CDF_I64, 1, ids_shape);
    cdf_tensor *fids = cdf_tensor_alloc(cpu, CDF_F32, 1, ids_shape);
    cdf_tensor *q = cdf_tensor_alloc(cpu, CDF_BF16, 4, s4), *qb = cdf_tensor_alloc(cpu, CDF_BF16, 4, big);
    char why[256];

    cdf_node *n = node_of(CDF_OP_UNARY, bf, f, NULL, NULL);
    assert_true(cdf_cuda_check_node(n, why, sizeof why));
    cdf_node_free(n);
    n = node_of(CDF_OP_UNARY, f, i64, NULL, NULL); /* integer input to a float op */
    assert_false(cdf_cuda_check_node(n, why, sizeof why));
    assert_non_null(strstr(why, "unary"));
    assert_non_null(strstr(why, "i64"));
    cdf_node_free(n);
    n = node_of(CDF_OP_COPY, f, i64, NULL, NULL); /* copies convert any dtype */
    assert_true(cdf_cuda_check_node(n, why, sizeof why));
    cdf_node_free(n);
    n = node_of(CDF_OP_EMBEDDING, f, f, ids, NULL);
    assert_true(cdf_cuda_check_node(n, why, sizeof why));
    cdf_node_free(n);
    n = node_of(CDF_OP_EMBEDDING, f, f, fids, NULL);
    assert_false(cdf_cuda_check_node(n, why, sizeof why));
    assert_non_null(strstr(why, "ids"));
    cdf_node_free(n);
    n = node_of(CDF_OP_ATTENTION, q, q, q, q);
    assert_true(cdf_cuda_check_node(n, why, sizeof why));
    cdf_node_free(n);
    n = node_of(CDF_OP_ATTENTION, qb, qb, qb, qb); /* head dim 1024 > the kernel's 512 */
    assert_false(cdf_cuda_check_node(n, why, sizeof why));
    assert_non_null(strstr(why, "head dim 1024"));
    cdf_node_free(n);
    /* matmul: a [4, 8] @ a^T-shaped operand that is neither row- nor column-major */
    const int64_t s84[2] = {8, 4};
    cdf_tensor *w = cdf_tensor_alloc(cpu, CDF_F32, 2, s84), *o = cdf_tensor_alloc(cpu, CDF_F32, 2, (int64_t[]){4, 4});
    n = node_of(CDF_OP_MATMUL, o, f, w, NULL);
    assert_true(cdf_cuda_check_node(n, why, sizeof why));
    n->src[1]->strides[0] = 8; /* rows overlapping differently: strides (8, 2) */
    n->src[1]->strides[1] = 2;
    assert_false(cdf_cuda_check_node(n, why, sizeof why));
    assert_non_null(strstr(why, "operand b"));
    n->src[1]->strides[0] = 4;
    n->src[1]->strides[1] = 1;
    /* a matmul carrying an elementwise epilogue (graph/fuse.c asks first): not on this backend */
    n->p.matmul.epilogue = calloc(1, sizeof *n->p.matmul.epilogue);
    assert_non_null(n->p.matmul.epilogue);
    n->p.matmul.epilogue->n_steps = 1;
    assert_false(cdf_cuda_check_node(n, why, sizeof why));
    assert_non_null(strstr(why, "epilogue"));
    cdf_node_free(n); /* frees the program */
    /* a fused chain: yes; headed by a LayerNorm (graph/fuse.c asks first): not on this backend */
    n = node_of(CDF_OP_FUSED, f, f, f, NULL);
    n->p.fused.prog = calloc(1, sizeof *n->p.fused.prog);
    assert_non_null(n->p.fused.prog);
    *n->p.fused.prog = (cdf_fused_program){.n_steps = 1, .steps = {{.binary = true, .input = 1, .op = CDF_BIN_MUL}}};
    assert_true(cdf_cuda_check_node(n, why, sizeof why));
    n->p.fused.prog->norm_head = true;
    assert_false(cdf_cuda_check_node(n, why, sizeof why));
    assert_non_null(strstr(why, "LayerNorm"));
    cdf_node_free(n);
    n = node_of(CDF_OP_REDUCE, ids, f, NULL, NULL);
    n->p.reduce.op = CDF_RED_ARGMAX; /* i64 output is the argmax's */
    assert_true(cdf_cuda_check_node(n, why, sizeof why));
    n->p.reduce.op = CDF_RED_SUM;
    assert_false(cdf_cuda_check_node(n, why, sizeof why));
    cdf_node_free(n);
    cdf_scope_pop(NULL, 0);
}

/* ---- products of mixed dtypes, the matmul on GGUF weights ------------------------------------ */

static void test_quantized_matmul_plan(void **state) {
    (void)state;
    /* operand dtypes -> cuBLASLt's input dtype: f32 activations with bf16 weights round to bf16
     * (the bf16 compute policy every CPU path computes), any other mix is widened to f32 */
    assert_int_equal(cdf_cuda_gemm_input_dtype(CDF_F32, CDF_F32), CDF_F32);
    assert_int_equal(cdf_cuda_gemm_input_dtype(CDF_BF16, CDF_BF16), CDF_BF16);
    assert_int_equal(cdf_cuda_gemm_input_dtype(CDF_F16, CDF_F16), CDF_F16);
    assert_int_equal(cdf_cuda_gemm_input_dtype(CDF_F32, CDF_BF16), CDF_BF16);
    assert_int_equal(cdf_cuda_gemm_input_dtype(CDF_BF16, CDF_F32), CDF_F32);
    assert_int_equal(cdf_cuda_gemm_input_dtype(CDF_F32, CDF_F16), CDF_F32);
    assert_int_equal(cdf_cuda_gemm_input_dtype(CDF_F16, CDF_BF16), CDF_F32);

    cdf_cuda_qmatmul_plan q;
    /* a FLUX projection, Q4_K decoded to bf16 for f32 activations: a bf16 product, one panel */
    assert_int_equal(cdf_cuda_plan_matmul_q(CDF_GGML_Q4_K, 3072, 3072, CDF_F32, CDF_BF16, &q), CDF_OK);
    assert_int_equal(q.be, 256);
    assert_int_equal(q.bb, 144);
    assert_int_equal(q.row_bytes, 12 * 144);
    assert_int_equal(q.in_dt, CDF_BF16);
    assert_int_equal(q.store, CDF_DQ_STORE_BF16);
    assert_int_equal(q.panel_rows, 3072);
    /* f32 weights, 4096 values a row: 64 MiB hold 4096 rows (the op suite's two-panel case) */
    assert_int_equal(cdf_cuda_plan_matmul_q(CDF_GGML_Q8_0, 4100, 4096, CDF_F32, CDF_F32, &q), CDF_OK);
    assert_int_equal(q.store, CDF_DQ_STORE_F32);
    assert_int_equal(q.panel_rows, 4096);
    /* FLUX's MLP down projection in f32 (3072 x 12288, 144 MiB decoded): 1365 rows fit, 1344 =
     * 21 * 64 per panel */
    assert_int_equal(cdf_cuda_plan_matmul_q(CDF_GGML_Q6_K, 3072, 12288, CDF_F32, CDF_F32, &q), CDF_OK);
    assert_int_equal(q.panel_rows, 1344);
    assert_true(q.panel_rows * 12288 * 4 <= CDF_CUDA_QPANEL_BYTES);
    /* f16 activations, bf16 weights: an f32 product of the bf16-rounded weights */
    assert_int_equal(cdf_cuda_plan_matmul_q(CDF_GGML_Q5_0, 17, 64, CDF_F16, CDF_BF16, &q), CDF_OK);
    assert_int_equal(q.in_dt, CDF_F32);
    assert_int_equal(q.store, CDF_DQ_STORE_F32_BF16R);
    /* one row above the bound: a row per panel */
    assert_int_equal(cdf_cuda_plan_matmul_q(CDF_GGML_Q8_0, 3, (int64_t)32 << 20, CDF_F32, CDF_F32, &q), CDF_OK);
    assert_int_equal(q.panel_rows, 1);
    /* refused, with the reason */
    assert_int_equal(cdf_cuda_plan_matmul_q(23, 8, 256, CDF_F32, CDF_F32, &q), CDF_ERR_UNSUPPORTED); /* IQ4_XS */
    assert_non_null(strstr(cdf_last_error(), "no decoder"));
    assert_int_equal(cdf_cuda_plan_matmul_q(CDF_GGML_F16, 8, 256, CDF_F32, CDF_F32, &q), CDF_ERR_UNSUPPORTED);
    assert_int_equal(cdf_cuda_plan_matmul_q(CDF_GGML_Q4_K, 8, 200, CDF_F32, CDF_F32, &q), CDF_ERR_INVALID_ARG);
    assert_non_null(strstr(cdf_last_error(), "K = 200"));
    assert_int_equal(cdf_cuda_plan_matmul_q(CDF_GGML_Q8_0, 8, 64, CDF_F32, CDF_F16, &q), CDF_ERR_INVALID_ARG);
    assert_non_null(strstr(cdf_last_error(), "f16"));

    /* the node: x [4, 64] f32, Q8_0 blocks u8 [8, 2 * 34], bias [8], out [4, 8] */
    cdf_device *cpu = tu_cpu();
    cdf_scope_push();
    cdf_tensor *x = cdf_tensor_alloc(cpu, CDF_F32, 2, (int64_t[]){4, 64});
    cdf_tensor *wq = cdf_tensor_alloc(cpu, CDF_U8, 2, (int64_t[]){8, 68});
    cdf_tensor *wbad = cdf_tensor_alloc(cpu, CDF_U8, 2, (int64_t[]){8, 60});
    cdf_tensor *b = cdf_tensor_alloc(cpu, CDF_F32, 1, (int64_t[]){8}), *o = cdf_tensor_alloc(cpu, CDF_F32, 2, (int64_t[]){4, 8});
    char why[256];
    cdf_node *n = node_of(CDF_OP_MATMUL_Q, o, x, wq, b);
    n->p.matmul_q.qtype = CDF_GGML_Q8_0;
    n->p.matmul_q.k = 64;
    n->p.matmul_q.wdt = CDF_BF16;
    assert_true(cdf_cuda_check_node(n, why, sizeof why));
    n->p.matmul_q.qtype = 23;
    assert_false(cdf_cuda_check_node(n, why, sizeof why));
    assert_non_null(strstr(why, "matmul_quantized"));
    assert_non_null(strstr(why, "no decoder"));
    cdf_node_free(n);
    n = node_of(CDF_OP_MATMUL_Q, o, x, wbad, b); /* 60 bytes a row are not two Q8_0 blocks */
    n->p.matmul_q.qtype = CDF_GGML_Q8_0;
    n->p.matmul_q.k = 64;
    n->p.matmul_q.wdt = CDF_F32;
    assert_false(cdf_cuda_check_node(n, why, sizeof why));
    assert_non_null(strstr(why, "u8 [N, 68]"));
    cdf_node_free(n);
    cdf_scope_pop(NULL, 0);
}

/* ---- registration ---------------------------------------------------------------------------- */

static int compiled_index(const char *name) {
    for (int i = 0; i < cdf_backend_compiled_count(); i++)
        if (strcmp(cdf_backend_compiled_name(i), name) == 0) return i;
    return -1;
}

static void test_registration(void **state) {
    (void)state;
    const int ci = compiled_index("cuda");
#ifdef CDF_HAVE_CUDA
    assert_true(ci >= 0);
#else
    assert_int_equal(ci, -1);
    assert_null(cdf_device_get("cuda"));
    assert_non_null(strstr(cdf_last_error(), "no backend 'cuda' in this build"));
    skip();
#endif
    /* the CPU stays the default whether or not a GPU is present */
    assert_string_equal(cdf_device_name(cdf_device_default()), "cpu:0");
    const char *why = cdf_backend_why_no_device(ci);
    if (why) { /* no driver / no GPU here: no device registered, and the reason is given */
        assert_true(strlen(why) > 0);
        assert_null(cdf_device_get("cuda"));
        assert_non_null(strstr(cdf_last_error(), why));
        assert_null(cdf_device_get("cuda:1"));
        char *out = NULL;
        size_t len = 0;
        char path[512];
        snprintf(path, sizeof path, "%s/devices.txt", tu_tmpdir());
        assert_int_equal(tu_system("'%s' devices > '%s' 2>&1", CDF_CLI_PATH, path), 0);
        out = tu_read_file(path, &len);
        assert_non_null(out);
        char expect[256];
        snprintf(expect, sizeof expect, "cuda: no device (%s)", why);
        if (!strstr(out, expect)) fail_msg("`cdiffusers devices` lacks \"%s\":\n%s", expect, out);
        free(out);
    } else { /* a GPU: listed with its memory and sm version */
        cdf_device *g = cdf_device_get("cuda:0");
        assert_non_null(g);
        cdf_device_info info;
        assert_int_equal(cdf_device_get_info(g, &info), CDF_OK);
        assert_string_equal(info.type, "cuda");
        assert_non_null(strstr(info.features, "sm_"));
        assert_true(info.memory_bytes > 0);
        assert_false(info.host_visible);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm_plan_2d),     cmocka_unit_test(test_gemm_plan_batched),
        cmocka_unit_test(test_gemm_plan_refuses), cmocka_unit_test(test_check_node),
        cmocka_unit_test(test_quantized_matmul_plan), cmocka_unit_test(test_registration),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
