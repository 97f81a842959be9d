/* The CUDA backend's host-side planning: pure C, no CUDA headers, always compiled (so CI tests
 * it on machines without the toolkit or a GPU).
 *
 *  - cdf_cuda_plan_gemm: a matmul node's operand layouts derived from the source tensors' shapes
 *    and strides alone (the backends' shared lowering, backend/lower.h), mapped onto cuBLASLt's
 *    column-major problem.
 *  - cdf_cuda_gemm_input_dtype: the dtype a product of two operand dtypes runs in (the bf16
 *    compute policy of kernels/dispatch.h).
 *  - cdf_cuda_plan_matmul_q: the matmul on GGUF-quantized weights (decode panel size and dtype).
 *  - cdf_cuda_check_node: whether the CUDA kernels can run a node (dtypes, shapes), with the
 *    reason when not. */
#ifndef CDF_BACKEND_CUDA_PLAN_H
#define CDF_BACKEND_CUDA_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cdiffusers/error.h"
#include "backend/lower.h"
#include "kernels/dequant_blocks.h"

/* One operand as the planner sees it: shape and element strides (the tensor's own). */
typedef cdf_lower_operand cdf_cuda_operand;

/* cuBLASLt's column-major problem D[m, n] = op(A)[m, k] op(B)[k, n], per batch. The row-major
 * C = A B is computed as C^T = B^T A^T: cuBLASLt's A is our B and its B our A; a row-major
 * matrix with row stride ld is the column-major transpose with leading dimension ld. */
typedef struct cdf_cuda_lt_matrix {
    bool op_t;            /* CUBLAS_OP_T (else CUBLAS_OP_N) */
    int64_t rows, cols;   /* of the stored column-major matrix (before op) */
    int64_t ld, batch_stride;
} cdf_cuda_lt_matrix;

typedef struct cdf_cuda_gemm_plan {
    int64_t batch, M, N, K;           /* row-major: C[M, N] = A[M, K] B[K, N] */
    cdf_matrix_layout a, b, c;        /* row-major layouts (c never transposed): backend/lower.h */
    int64_t m, n, k;                  /* cuBLASLt's problem: m = N, n = M, k = K */
    cdf_cuda_lt_matrix lt_a, lt_b, lt_d;
    /* cuBLASLt's strided batch is only used when every batch stride is non-zero; a broadcast
     * operand (stride 0) with batch > 1 runs one call per batch index instead. */
    bool per_batch_calls;
} cdf_cuda_gemm_plan;

/* Plan C = A @ B for a [..., M, K], b [..., K, N], c [..., M, N] with equal batch dims (the
 * tensor API expands them). Fails as cdf_lower_matmul_operands does (CDF_ERR_INTERNAL naming the
 * operand when a layout is not expressible: the tensor API makes such operands contiguous). */
cdf_status cdf_cuda_plan_gemm(cdf_cuda_operand a, cdf_cuda_operand b, cdf_cuda_operand c, cdf_cuda_gemm_plan *out);

/* The input dtype of cuBLASLt's product C = A @ B for A of a_dt and B of b_dt: equal dtypes as
 * they are; f32 A with bf16 B (weights) bf16, A rounded to bf16 (the bf16 compute policy,
 * kernels/dispatch.h: what every CPU path computes and the op suite's reference expects; a
 * bf16 x bf16 product is exact in the f32 accumulator); any other mix f32 (both widened,
 * exact). */
cdf_dtype cdf_cuda_gemm_input_dtype(cdf_dtype a_dt, cdf_dtype b_dt);

/* The matmul on GGUF-quantized weights (CDF_OP_MATMUL_Q): C [M, N] = X [M, K] @ W^T (+ bias)
 * with W [N, K] stored as ggml blocks, row after row. As on the CPU (kernels/matmul_quant.c),
 * the weights are decoded panel by panel, by the CPU decoder's own per-block code
 * (kernels/dequant_blocks.h), into the dtype the CPU rounds them to, and the panel goes through
 * the ordinary product (cuBLASLt): a quantized layer computes what its dequantized file
 * computes. The panel is a stream-ordered temporary of at most CDF_CUDA_QPANEL_BYTES (or one
 * row, for a row larger than that). */
#define CDF_CUDA_QPANEL_BYTES ((int64_t)64 << 20)
typedef struct cdf_cuda_qmatmul_plan {
    int64_t be, bb, row_bytes; /* values and bytes per block; bytes per weight row */
    cdf_dtype in_dt;           /* the product's input dtype: cdf_cuda_gemm_input_dtype(x, w_dt) */
    cdf_dq_store store;        /* how the panel holds the decoded values (in_dt, w_dt's rounding) */
    int64_t panel_rows;        /* weight rows per panel (a multiple of 64 when below N) */
} cdf_cuda_qmatmul_plan;

/* Plans N rows of K values of qtype decoded to w_dt (f32 or bf16) for activations of x_dt.
 * CDF_ERR_UNSUPPORTED naming the type when it is not a block type the decoder knows;
 * CDF_ERR_INVALID_ARG for K not a positive multiple of the block, or another w_dt. */
cdf_status cdf_cuda_plan_matmul_q(uint32_t qtype, int64_t N, int64_t K, cdf_dtype x_dt, cdf_dtype w_dt,
                                  cdf_cuda_qmatmul_plan *out);

/* The dtypes the CUDA kernels compute in (f32, bf16, f16): every op's float operands. */
bool cdf_cuda_float_dtype(cdf_dtype dt);

/* Largest head dim of the attention kernel (kernels/cuda_kernels.h: CDF_CU_ATTN_MAX_D). */
#define CDF_CUDA_ATTN_MAX_D 512

/* Whether the CUDA backend runs node n; when not, a reason in why (if why != NULL). */
bool cdf_cuda_check_node(const cdf_node *n, char *why, size_t why_size);

#endif
