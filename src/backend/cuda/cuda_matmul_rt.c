/* The matmul node through cuBLASLt: layouts from cuda_plan.c (derived from the tensors' shapes
 * and strides), f32 accumulation always (CUBLAS_COMPUTE_32F: bf16/f16 inputs on tensor cores,
 * f32 inputs without TF32, the exact path the golden tests use), the bias through the BIAS
 * epilogue when its dtype is the output's (else a separate kernel), the heuristic's algorithm
 * cached per problem. */
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

/* Contiguous f32 copy of t in a stream-ordered temporary (for mixed input dtypes). */
static cdf_status to_f32(cdf_cuda_dev *d, const cdf_tensor *t, void **out, int64_t *strides) {
    const int64_t numel = cdf_shape_numel(t->ndim, t->shape);
    cdf_contiguous_strides(t->ndim, t->shape, strides);
    cudaError_t e = cudaMallocAsync(out, (size_t)(numel ? numel : 1) * 4, d->stream);
    if (e != cudaSuccess) return cdf_cuda_fail(e, "matmul: temporary for a dtype conversion");
    int r = cdf_cu_copy_strided(d->stream, *out, CDF_F32, strides, cdf_tensor_device_addr(t), t->dtype, t->strides, t->ndim,
                                t->shape);
    return r ? cdf_cuda_fail((cudaError_t)r, "matmul: dtype conversion") : CDF_OK;
}

cdf_status cdf_cuda_matmul(cdf_cuda_dev *d, const cdf_node *n) {
    const cdf_tensor *A = n->src[0], *B = n->src[1], *bias = n->n_src > 2 ? n->src[2] : NULL, *C = n->dst;
    const void *a_ptr = cdf_tensor_device_addr(A), *b_ptr = cdf_tensor_device_addr(B);
    cdf_dtype in_dt = A->dtype;
    int64_t a_st[CDF_MAX_DIMS], b_st[CDF_MAX_DIMS];
    memcpy(a_st, A->strides, sizeof a_st);
    memcpy(b_st, B->strides, sizeof b_st);
    void *tmp_a = NULL, *tmp_b = NULL;
    cdf_status s = CDF_OK;
    if (A->dtype != B->dtype) { /* mixed: both through f32 (exact) */
        in_dt = CDF_F32;
        if ((s = to_f32(d, A, &tmp_a, a_st)) == CDF_OK) s = to_f32(d, B, &tmp_b, b_st);
        a_ptr = tmp_a;
        b_ptr = tmp_b;
    }
    cdf_cuda_gemm_plan p;
    if (s == CDF_OK)
        s = cdf_cuda_plan_gemm((cdf_cuda_operand){A->ndim, A->shape, a_st}, (cdf_cuda_operand){B->ndim, B->shape, b_st},
                               (cdf_cuda_operand){C->ndim, C->shape, C->strides}, &p);
    /* the epilogue adds the bias in f32 before the one rounding to the output dtype, like the
     * reference kernel; a bias of another dtype goes through a separate kernel */
    const bool epilogue_bias = bias && bias->dtype == C->dtype;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
    const int64_t lt_batch = p.per_batch_calls ? 1 : p.batch;
    if (s == CDF_OK && p.M * p.N > 0 && p.K > 0) {
        cublasStatus_t st = cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
        if (st != CUBLAS_STATUS_SUCCESS) s = lt_fail(st, "descriptor");
        if (s == CDF_OK) {
            cublasOperation_t ta = p.lt_a.op_t ? CUBLAS_OP_T : CUBLAS_OP_N, tb = p.lt_b.op_t ? CUBLAS_OP_T : CUBLAS_OP_N;
            cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
            cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
            if (epilogue_bias) {
                cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
                const void *bp = cdf_tensor_device_addr(bias);
                cudaDataType_t bt = lt_type(bias->dtype);
                cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep);
                cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof bp);
                cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt);
            }
            if ((s = layout(&la, lt_type(in_dt), &p.lt_a, lt_batch)) == CDF_OK &&
                (s = layout(&lb, lt_type(in_dt), &p.lt_b, lt_batch)) == CDF_OK)
                s = layout(&ld, lt_type(C->dtype), &p.lt_d, lt_batch);
        }
        cublasLtMatmulAlgo_t algo;
        const void *c_ptr = cdf_tensor_device_addr(C);
        /* cuBLASLt's A is our B, its B our A (cuda_plan.h) */
        const uint64_t key[12] = {
            (uint64_t)in_dt | (uint64_t)C->dtype << 8 | (uint64_t)p.lt_a.op_t << 16 | (uint64_t)p.lt_b.op_t << 17 |
                (uint64_t)epilogue_bias << 18,
            (uint64_t)p.m, (uint64_t)p.n, (uint64_t)p.k,
            (uint64_t)p.lt_a.ld, (uint64_t)p.lt_b.ld, (uint64_t)p.lt_d.ld,
            (uint64_t)lt_batch ^ ((uint64_t)p.lt_a.batch_stride << 20) ^ ((uint64_t)p.lt_b.batch_stride << 40),
            batch_alignment(b_ptr, p.lt_a.batch_stride, cdf_dtype_size(in_dt)),
            batch_alignment(a_ptr, p.lt_b.batch_stride, cdf_dtype_size(in_dt)),
            batch_alignment(c_ptr, p.lt_d.batch_stride, cdf_dtype_size(C->dtype)),
            epilogue_bias ? alignment(cdf_tensor_device_addr(bias)) : 0,
        };
        if (s == CDF_OK) s = pick_algo(d, key, op, la, lb, ld, &algo);
        const float alpha = n->p.matmul.alpha, beta = 0.0f;
        const size_t ein = cdf_dtype_size(in_dt), eout = cdf_dtype_size(C->dtype);
        for (int64_t i = 0; s == CDF_OK && i < (p.per_batch_calls ? p.batch : 1); i++) {
            const char *pa = (const char *)b_ptr + i * p.lt_a.batch_stride * (int64_t)ein;
            const char *pb = (const char *)a_ptr + i * p.lt_b.batch_stride * (int64_t)ein;
            char *pd = (char *)c_ptr + i * p.lt_d.batch_stride * (int64_t)eout;
            cublasStatus_t st = cublasLtMatmul(d->lt, op, &alpha, pa, la, pb, lb, &beta, pd, ld, pd, ld, &algo, d->workspace,
                                               d->workspace_size, d->stream);
            if (st != CUBLAS_STATUS_SUCCESS) s = lt_fail(st, "matmul");
        }
        if (s == CDF_OK && bias && !epilogue_bias) {
            int r = cdf_cu_bias_add(d->stream, (void *)c_ptr, C->dtype, cdf_tensor_device_addr(bias), bias->dtype,
                                    p.batch * p.M, p.N);
            if (r) s = cdf_cuda_fail((cudaError_t)r, "matmul bias");
        }
    } else if (s == CDF_OK && p.M * p.N > 0) { /* K = 0: an empty sum (cuBLASLt refuses k = 0) */
        int r = cdf_cu_fill(d->stream, cdf_tensor_device_addr(C), C->dtype, C->strides, C->ndim, C->shape, 0.0);
        if (!r && bias)
            r = cdf_cu_bias_add(d->stream, cdf_tensor_device_addr(C), C->dtype, cdf_tensor_device_addr(bias), bias->dtype,
                                p.batch * p.M, p.N);
        if (r) s = cdf_cuda_fail((cudaError_t)r, "matmul (empty inner dim)");
    }
    if (ld) cublasLtMatrixLayoutDestroy(ld);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
    if (tmp_a) (void)cudaFreeAsync(tmp_a, d->stream);
    if (tmp_b) (void)cudaFreeAsync(tmp_b, d->stream);
    return s;
}
