/* The matmul nodes through cuBLASLt: layouts from cuda_plan.c (derived from the tensors' shapes
 * and strides), f32 accumulation always (CUBLAS_COMPUTE_32F: bf16/f16 inputs on tensor cores,
 * f32 inputs without TF32, the exact path the golden tests use), mixed operand dtypes as
 * cdf_cuda_gemm_input_dtype says (the bf16 compute policy), the bias through the BIAS epilogue
 * for an f32 output and bias (else a separate kernel, adding it in f32 before the one rounding
 * to the output's dtype, as the reference kernel does), the heuristic's algorithm cached per
 * problem. The matmul on GGUF-quantized weights decodes its weights panel by panel
 * (cuda_plan.h: cdf_cuda_plan_matmul_q) and multiplies each panel the same way. */
#include <stdio.h>
#include <string.h>

#include "backend/cuda/cuda_impl.h"
#include "backend/cuda/cuda_plan.h"
#include "core/error_internal.h"

static cudaDataType_t lt_type(cdf_dtype dt) {
    switch (dt) {
    case CDF_BF16: return CUDA_R_16BF;
    case CDF_F16: return CUDA_R_16F;
    default: return CUDA_R_32F;
    }
}

/* Largest power of two (<= 256) dividing the address: cuBLASLt's heuristic must not pick a
 * kernel that assumes more alignment than a view (e.g. q of a fused qkv) has. */
static uint64_t alignment(const void *p) {
    uint64_t a = 256;
    while (a > 1 && ((uintptr_t)p % a)) a >>= 1;
    return a;
}

/* The alignment every matrix of a batch keeps: the base's and the batch stride's (in bytes). */
static uint64_t batch_alignment(const void *p, int64_t stride_elems, size_t esize) {
    uint64_t a = alignment(p), s = stride_elems ? alignment((const void *)(uintptr_t)(stride_elems * (int64_t)esize)) : 256;
    return a < s ? a : s;
}

static cdf_status lt_fail(cublasStatus_t st, const char *what) {
    return cdf_error(CDF_ERR_DEVICE, "matmul: cuBLASLt %s failed (status %d)", what, (int)st);
}

static cdf_status layout(cublasLtMatrixLayout_t *l, cudaDataType_t t, const cdf_cuda_lt_matrix *m, int64_t batch) {
    cublasStatus_t st = cublasLtMatrixLayoutCreate(l, t, (uint64_t)m->rows, (uint64_t)m->cols, m->ld);
    if (st != CUBLAS_STATUS_SUCCESS) return lt_fail(st, "layout");
    if (batch > 1) {
        int32_t bc = (int32_t)batch;
        int64_t bs = m->batch_stride;
        cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc);
        cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &bs, sizeof bs);
    }
    return CDF_OK;
}

/* The cached algorithm for key, or a new heuristic result. */
static cdf_status pick_algo(cdf_cuda_dev *d, const uint64_t key[12], cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t la,
                            cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t ld, cublasLtMatmulAlgo_t *algo) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < 12; i++) h = (h ^ key[i]) * 1099511628211ull;
    for (int probe = 0; probe < 8; probe++) {
        cdf_cuda_gemm_entry *e = &d->gemm_cache[(h + (uint64_t)probe) % CDF_CUDA_GEMM_CACHE];
        if (e->used && memcmp(e->key, key, sizeof e->key) == 0) {
            *algo = e->algo;
            return CDF_OK;
        }
        if (!e->used || probe == 7) { /* free slot, or evict the last probed one */
            cublasLtMatmulPreference_t pref;
            cublasStatus_t st = cublasLtMatmulPreferenceCreate(&pref);
            if (st != CUBLAS_STATUS_SUCCESS) return lt_fail(st, "preference");
            uint64_t ws = d->workspace_size;
            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
            const cublasLtMatmulPreferenceAttributes_t al[4] = {
                CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
            for (int i = 0; i < 4; i++) {
                uint32_t v = (uint32_t)key[8 + (i < 3 ? i : 2)];
                cublasLtMatmulPreferenceSetAttribute(pref, al[i], &v, sizeof v);
            }
            cublasLtMatmulHeuristicResult_t res;
            int found = 0;
            st = cublasLtMatmulAlgoGetHeuristic(d->lt, op, la, lb, ld, ld, pref, 1, &res, &found);
            cublasLtMatmulPreferenceDestroy(pref);
            if (st != CUBLAS_STATUS_SUCCESS || found == 0)
                return cdf_error(CDF_ERR_UNSUPPORTED, "matmul: cuBLASLt has no algorithm for this problem (status %d)", (int)st);
            e->used = true;
            memcpy(e->key, key, sizeof e->key);
            e->algo = res.algo;
            *algo = res.algo;
            return CDF_OK;
        }
    }
    return CDF_ERR_INTERNAL; /* unreachable: probe 7 always fills */
}

/* One operand of a product: device address, dtype, shape and element strides. */
typedef struct gemm_operand {
    const void *ptr;
    cdf_dtype dt;
    int ndim;
    const int64_t *shape, *strides;
} gemm_operand;

static gemm_operand operand_of(const cdf_tensor *t) {
    return (gemm_operand){cdf_tensor_device_addr(t), t->dtype, t->ndim, t->shape, t->strides};
}

/* A contiguous copy of t as dt in a stream-ordered temporary (freed by the caller on the stream);
 * *t is updated to describe it, strides in st. */
static cdf_status convert(cdf_cuda_dev *d, gemm_operand *t, cdf_dtype dt, void **tmp, int64_t *st) {
    const int64_t numel = cdf_shape_numel(t->ndim, t->shape);
    cdf_contiguous_strides(t->ndim, t->shape, st);
    cudaError_t e = cudaMallocAsync(tmp, (size_t)(numel ? numel : 1) * cdf_dtype_size(dt), d->stream);
    if (e != cudaSuccess) return cdf_cuda_fail(e, "matmul: temporary for a dtype conversion");
    int r = cdf_cu_copy_strided(d->stream, *tmp, dt, st, t->ptr, t->dt, t->strides, t->ndim, t->shape);
    if (r) return cdf_cuda_fail((cudaError_t)r, "matmul: dtype conversion");
    *t = (gemm_operand){*tmp, dt, t->ndim, t->shape, st};
    return CDF_OK;
}

/* C = alpha A @ B (+ bias [N]) for A and B of one dtype, C contiguous across the batch (the
 * tensor API's outputs; a panel's columns of one are a single matrix). */
static cdf_status gemm(cdf_cuda_dev *d, gemm_operand A, gemm_operand B, gemm_operand C, const void *bias,
                       cdf_dtype bias_dt, float alpha) {
    if (A.dt != B.dt)
        return cdf_error(CDF_ERR_INTERNAL, "matmul: operands of dtypes %s and %s reached cuBLASLt", cdf_dtype_name(A.dt),
                         cdf_dtype_name(B.dt));
    const cdf_dtype in_dt = A.dt;
    cdf_cuda_gemm_plan p;
    cdf_status s = cdf_cuda_plan_gemm((cdf_cuda_operand){A.ndim, A.shape, A.strides}, (cdf_cuda_operand){B.ndim, B.shape, B.strides},
                                      (cdf_cuda_operand){C.ndim, C.shape, C.strides}, &p);
    if (s != CDF_OK) return s;
    if (p.M * p.N == 0) return CDF_OK;
    if (p.batch > 1 && p.c.batch_stride != p.M * p.c.ld)
        return cdf_error(CDF_ERR_INTERNAL, "matmul: output batches not contiguous (stride %lld for %lld rows of %lld)",
                         (long long)p.c.batch_stride, (long long)p.M, (long long)p.c.ld);
    const int64_t rows = p.batch * p.M;
    if (p.K == 0) { /* an empty sum (cuBLASLt refuses k = 0) */
        int r = cdf_cu_fill(d->stream, (void *)C.ptr, C.dt, C.strides, C.ndim, C.shape, 0.0);
        if (!r && bias) r = cdf_cu_bias_add(d->stream, (void *)C.ptr, C.dt, p.c.ld, NULL, bias, bias_dt, rows, p.N);
        return r ? cdf_cuda_fail((cudaError_t)r, "matmul (empty inner dim)") : CDF_OK;
    }
    /* the epilogue adds an f32 bias into an f32 output. A 16-bit output with a bias gets the
     * product in an f32 temporary, then one kernel adds the bias in f32 and rounds once, as the
     * reference kernel does: cuBLASLt does not document in which precision its BIAS epilogue
     * adds into a bf16 output, and on the GPU the op suite's bf16 linear layer with a bf16 bias
     * failed (nmse 7e-6 against 1e-6, as if about a quarter of the elements were rounded twice)
     * while the bf16 products without a bias passed. A bias of another dtype than an f32
     * output's is added by the same kernel into the f32 product (one rounding, to f32). */
    const bool epilogue_bias = bias && bias_dt == C.dt && C.dt == CDF_F32;
    const bool via_f32 = bias && C.dt != CDF_F32;
    void *tmp_d = NULL;
    cdf_dtype d_dt = C.dt;
    if (via_f32) {
        cudaError_t e = cudaMallocAsync(&tmp_d, (size_t)(rows * p.N) * sizeof(float), d->stream);
        if (e != cudaSuccess) return cdf_cuda_fail(e, "matmul: f32 temporary of a 16-bit product with a bias");
        d_dt = CDF_F32;
        p.lt_d.ld = p.N;
        p.lt_d.batch_stride = p.M * p.N;
    }
    const void *a_ptr = A.ptr, *b_ptr = B.ptr, *d_ptr = via_f32 ? tmp_d : C.ptr;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
    const int64_t lt_batch = p.per_batch_calls ? 1 : p.batch;
    cublasStatus_t st = cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (st != CUBLAS_STATUS_SUCCESS) s = lt_fail(st, "descriptor");
    if (s == CDF_OK) {
        cublasOperation_t ta = p.lt_a.op_t ? CUBLAS_OP_T : CUBLAS_OP_N, tb = p.lt_b.op_t ? CUBLAS_OP_T : CUBLAS_OP_N;
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
        if (epilogue_bias) {
            cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
            cudaDataType_t bt = lt_type(bias_dt);
            cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep);
            cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
            cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt);
        }
        if ((s = layout(&la, lt_type(in_dt), &p.lt_a, lt_batch)) == CDF_OK &&
            (s = layout(&lb, lt_type(in_dt), &p.lt_b, lt_batch)) == CDF_OK)
            s = layout(&ld, lt_type(d_dt), &p.lt_d, lt_batch);
    }
    cublasLtMatmulAlgo_t algo;
    /* cuBLASLt's A is our B, its B our A (cuda_plan.h) */
    const uint64_t key[12] = {
        (uint64_t)in_dt | (uint64_t)d_dt << 8 | (uint64_t)p.lt_a.op_t << 16 | (uint64_t)p.lt_b.op_t << 17 |
            (uint64_t)epilogue_bias << 18,
        (uint64_t)p.m, (uint64_t)p.n, (uint64_t)p.k,
        (uint64_t)p.lt_a.ld, (uint64_t)p.lt_b.ld, (uint64_t)p.lt_d.ld,
        (uint64_t)lt_batch ^ ((uint64_t)p.lt_a.batch_stride << 20) ^ ((uint64_t)p.lt_b.batch_stride << 40),
        batch_alignment(b_ptr, p.lt_a.batch_stride, cdf_dtype_size(in_dt)),
        batch_alignment(a_ptr, p.lt_b.batch_stride, cdf_dtype_size(in_dt)),
        batch_alignment(d_ptr, p.lt_d.batch_stride, cdf_dtype_size(d_dt)),
        epilogue_bias ? alignment(bias) : 0,
    };
    if (s == CDF_OK) s = pick_algo(d, key, op, la, lb, ld, &algo);
    const float beta = 0.0f;
    const size_t ein = cdf_dtype_size(in_dt), eout = cdf_dtype_size(d_dt);
    for (int64_t i = 0; s == CDF_OK && i < (p.per_batch_calls ? p.batch : 1); i++) {
        const char *pa = (const char *)b_ptr + i * p.lt_a.batch_stride * (int64_t)ein;
        const char *pb = (const char *)a_ptr + i * p.lt_b.batch_stride * (int64_t)ein;
        char *pd = (char *)d_ptr + i * p.lt_d.batch_stride * (int64_t)eout;
        st = cublasLtMatmul(d->lt, op, &alpha, pa, la, pb, lb, &beta, pd, ld, pd, ld, &algo, d->workspace, d->workspace_size,
                            d->stream);
        if (st != CUBLAS_STATUS_SUCCESS) s = lt_fail(st, "matmul");
    }
    if (s == CDF_OK && bias && !epilogue_bias) {
        int r = cdf_cu_bias_add(d->stream, (void *)C.ptr, C.dt, p.c.ld, via_f32 ? tmp_d : NULL, bias, bias_dt, rows, p.N);
        if (r) s = cdf_cuda_fail((cudaError_t)r, "matmul bias");
    }
    if (ld) cublasLtMatrixLayoutDestroy(ld);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
    if (tmp_d) (void)cudaFreeAsync(tmp_d, d->stream);
    return s;
}

cdf_status cdf_cuda_matmul(cdf_cuda_dev *d, const cdf_node *n) {
    const cdf_tensor *bias = n->n_src > 2 ? n->src[2] : NULL;
    gemm_operand A = operand_of(n->src[0]), B = operand_of(n->src[1]);
    const cdf_dtype in_dt = cdf_cuda_gemm_input_dtype(A.dt, B.dt);
    int64_t a_st[CDF_MAX_DIMS], b_st[CDF_MAX_DIMS];
    void *tmp_a = NULL, *tmp_b = NULL;
    cdf_status s = CDF_OK;
    if (A.dt != in_dt) s = convert(d, &A, in_dt, &tmp_a, a_st);
    if (s == CDF_OK && B.dt != in_dt) s = convert(d, &B, in_dt, &tmp_b, b_st);
    if (s == CDF_OK)
        s = gemm(d, A, B, operand_of(n->dst), bias ? cdf_tensor_device_addr(bias) : NULL, bias ? bias->dtype : CDF_F32,
                 n->p.matmul.alpha);
    if (tmp_a) (void)cudaFreeAsync(tmp_a, d->stream);
    if (tmp_b) (void)cudaFreeAsync(tmp_b, d->stream);
    return s;
}

cdf_status cdf_cuda_matmul_q(cdf_cuda_dev *d, const cdf_node *n) {
    const cdf_tensor *X = n->src[0], *W = n->src[1], *bias = n->n_src > 2 ? n->src[2] : NULL, *C = n->dst;
    const uint32_t qtype = (uint32_t)n->p.matmul_q.qtype;
    const int64_t M = X->shape[0], K = n->p.matmul_q.k, N = C->shape[1];
    cdf_cuda_qmatmul_plan q;
    cdf_status s = cdf_cuda_plan_matmul_q(qtype, N, K, X->dtype, n->p.matmul_q.wdt, &q);
    if (s != CDF_OK || M == 0 || N == 0) return s;
    gemm_operand A = operand_of(X);
    int64_t a_st[CDF_MAX_DIMS];
    void *tmp_a = NULL, *panel = NULL;
    if (A.dt != q.in_dt) s = convert(d, &A, q.in_dt, &tmp_a, a_st);
    const size_t esz = cdf_dtype_size(q.in_dt), csz = cdf_dtype_size(C->dtype), bsz = bias ? cdf_dtype_size(bias->dtype) : 0;
    if (s == CDF_OK) {
        /* one panel buffer for all: each panel's decode is queued after the previous product */
        cudaError_t e = cudaMallocAsync(&panel, (size_t)(q.panel_rows * K) * esz, d->stream);
        if (e != cudaSuccess) s = cdf_cuda_fail(e, "matmul_quantized: the decoded weight panel");
    }
    const char *w = cdf_tensor_device_addr(W);
    for (int64_t n0 = 0; s == CDF_OK && n0 < N; n0 += q.panel_rows) {
        const int64_t np = N - n0 < q.panel_rows ? N - n0 : q.panel_rows;
        int r = cdf_cu_dequant_panel(d->stream, qtype, w + n0 * q.row_bytes, np * (K / q.be), panel, q.store);
        if (r) {
            s = cdf_cuda_fail((cudaError_t)r, "matmul_quantized: decoding the weights");
            break;
        }
        /* B = panel^T: [K, np] over the decoded rows [np, K]; C's columns n0 .. n0 + np */
        const int64_t b_shape[2] = {K, np}, b_strides[2] = {1, K}, c_shape[2] = {M, np};
        const gemm_operand B = {panel, q.in_dt, 2, b_shape, b_strides};
        const gemm_operand Cp = {(const char *)cdf_tensor_device_addr(C) + (size_t)n0 * csz, C->dtype, 2, c_shape, C->strides};
        s = gemm(d, A, B, Cp, bias ? (const char *)cdf_tensor_device_addr(bias) + (size_t)n0 * bsz : NULL,
                 bias ? bias->dtype : CDF_F32, 1.0f);
    }
    if (panel) (void)cudaFreeAsync(panel, d->stream);
    if (tmp_a) (void)cudaFreeAsync(tmp_a, d->stream);
    return s;
}
