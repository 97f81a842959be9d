/* Lowering shared by the backends: a semantic node (graph/node.h) -> the dims, strides and
 * parameters of its kernel call. What is derived from shapes and strides alone is the same for
 * every backend, so it is derived here once; operand addresses are each backend's own (a bound
 * parameter, a translated cpu address, a device pointer), so the helpers leave them to the
 * caller: lower, then fill in the pointers and call the kernel. */
#ifndef CDF_BACKEND_LOWER_H
#define CDF_BACKEND_LOWER_H

#include "graph/node.h"
#include "kernels/kernels.h"

/* One operand as shape and element strides (a tensor's own, or a test's table row). */
typedef struct cdf_lower_operand {
    int ndim;
    const int64_t *shape, *strides;
} cdf_lower_operand;

static inline cdf_lower_operand cdf_lower_operand_of(const cdf_tensor *t) {
    return (cdf_lower_operand){.ndim = t->ndim, .shape = t->shape, .strides = t->strides};
}

/* C [..., M, N] = A [..., M, K] @ B [..., K, N], batch dims equal (the tensor API expands them),
 * each operand in the layout cdf_matmul_operand_layout describes, C row-major (a single row or
 * column of another layout counts as row-major: the same elements in the same order). */
typedef struct cdf_lowered_matmul {
    int64_t batch, M, N, K;
    cdf_matrix_layout a, b, c; /* c.trans is always false */
} cdf_lowered_matmul;

/* Fails with CDF_ERR_INTERNAL naming the operand ("operand a") or the batch dim when the shapes
 * do not chain or a layout is not a matrix layout (a tensor-API or compile-layer bug). */
cdf_status cdf_lower_matmul_operands(cdf_lower_operand a, cdf_lower_operand b, cdf_lower_operand c,
                                     cdf_lowered_matmul *out);
cdf_status cdf_lower_matmul(const cdf_node *n, cdf_lowered_matmul *out);

/* x [N, Cin, H, W], weight [Cout, Cin/groups, KH, KW], bias [Cout] (optional) -> everything but
 * the four pointers (x, weight, bias, out: NULL). */
void cdf_lower_conv2d(const cdf_node *n, cdf_k_conv2d_args *a);

/* q [B, H, Lq, D], k [B, H, Lk, D], v [B, H, Lk, Dv], mask (optional, 4-d, broadcast by stride
 * 0) -> everything but the five pointers (q, k, v, mask, out: NULL). */
void cdf_lower_attention(const cdf_node *n, cdf_k_attention_args *a);

/* A fused elementwise node's inputs (dtypes and strides; the addresses are the caller's). */
typedef struct cdf_lowered_inputs {
    int n;
    cdf_dtype dtype[CDF_NODE_MAX_SRC];
    const int64_t *strides[CDF_NODE_MAX_SRC];
} cdf_lowered_inputs;
void cdf_lower_inputs(const cdf_node *n, cdf_lowered_inputs *in);

#endif
