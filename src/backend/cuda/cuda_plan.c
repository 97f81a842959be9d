/* The CUDA backend's host-side planning (see cuda_plan.h). */
#include "backend/cuda/cuda_plan.h"

#include <stdarg.h>
#include <stdio.h>

#include "core/error_internal.h"

cdf_status cdf_cuda_plan_gemm(cdf_cuda_operand a, cdf_cuda_operand b, cdf_cuda_operand c, cdf_cuda_gemm_plan *p) {
    *p = (cdf_cuda_gemm_plan){0};
    cdf_lowered_matmul L;
    cdf_status s = cdf_lower_matmul_operands(a, b, c, &L);
    if (s != CDF_OK) return s;
    p->batch = L.batch;
    p->M = L.M;
    p->N = L.N;
    p->K = L.K;
    p->a = L.a;
    p->b = L.b;
    p->c = L.c;
    /* column-major: D^T = C [N x M per column-major], A_lt = B, B_lt = A */
    p->m = p->N;
    p->n = p->M;
    p->k = p->K;
    p->lt_a = (cdf_cuda_lt_matrix){.op_t = p->b.trans, .rows = p->b.trans ? p->K : p->N, .cols = p->b.trans ? p->N : p->K,
                                   .ld = p->b.ld, .batch_stride = p->b.batch_stride};
    p->lt_b = (cdf_cuda_lt_matrix){.op_t = p->a.trans, .rows = p->a.trans ? p->M : p->K, .cols = p->a.trans ? p->K : p->M,
                                   .ld = p->a.ld, .batch_stride = p->a.batch_stride};
    p->lt_d = (cdf_cuda_lt_matrix){.op_t = false, .rows = p->N, .cols = p->M, .ld = p->c.ld, .batch_stride = p->c.batch_stride};
    p->per_batch_calls = p->batch > 1 && (p->a.batch_stride == 0 || p->b.batch_stride == 0 || p->c.batch_stride == 0);
    return CDF_OK;
}

bool cdf_cuda_float_dtype(cdf_dtype dt) { return dt == CDF_F32 || dt == CDF_BF16 || dt == CDF_F16; }

cdf_dtype cdf_cuda_gemm_input_dtype(cdf_dtype a_dt, cdf_dtype b_dt) {
    if (a_dt == b_dt) return a_dt;
    if (a_dt == CDF_F32 && b_dt == CDF_BF16) return CDF_BF16;
    return CDF_F32;
}

cdf_status cdf_cuda_plan_matmul_q(uint32_t qtype, int64_t N, int64_t K, cdf_dtype x_dt, cdf_dtype w_dt,
                                  cdf_cuda_qmatmul_plan *p) {
    *p = (cdf_cuda_qmatmul_plan){0};
    int be = 0, bb = 0;
    if (!cdf_dq_block_size(qtype, &be, &bb)) {
        const char *name = cdf_ggml_type_name(qtype);
        return cdf_error(CDF_ERR_UNSUPPORTED,
                         "matmul on ggml type %u (%s): no decoder for it (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, "
                         "Q4_K, Q5_K and Q6_K are decoded)",
                         qtype, name ? name : "unknown");
    }
    if (K <= 0 || K % be)
        return cdf_error(CDF_ERR_INVALID_ARG, "matmul on %s weights: K = %lld is not a positive multiple of the %d-value block",
                         cdf_ggml_type_name(qtype), (long long)K, be);
    if (w_dt != CDF_F32 && w_dt != CDF_BF16)
        return cdf_error(CDF_ERR_INVALID_ARG, "matmul on %s weights: they decode to f32 or bf16, not %s",
                         cdf_ggml_type_name(qtype), cdf_dtype_name(w_dt));
    if (N < 0) return cdf_error(CDF_ERR_INVALID_ARG, "matmul on %s weights: N = %lld", cdf_ggml_type_name(qtype), (long long)N);
    p->be = be;
    p->bb = bb;
    p->row_bytes = K / be * bb;
    p->in_dt = cdf_cuda_gemm_input_dtype(x_dt, w_dt);
    /* the panel holds the values the CPU multiplies: w_dt's rounding, in the product's dtype */
    p->store = p->in_dt == CDF_BF16 ? CDF_DQ_STORE_BF16 : (w_dt == CDF_BF16 ? CDF_DQ_STORE_F32_BF16R : CDF_DQ_STORE_F32);
    const int64_t rows = CDF_CUDA_QPANEL_BYTES / (K * (int64_t)cdf_dtype_size(p->in_dt));
    /* a multiple of 64 rows keeps each panel's output columns and bias 128-byte aligned */
    p->panel_rows = rows >= N ? N : (rows >= 64 ? rows - rows % 64 : (rows > 0 ? rows : 1));
    return CDF_OK;
}

static bool refuse(char *why, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool refuse(char *why, size_t n, const char *fmt, ...) {
    if (why && n) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, n, fmt, ap);
        va_end(ap);
    }
    return false;
}

bool cdf_cuda_check_node(const cdf_node *n, char *why, size_t why_size) {
    if ((unsigned)n->kind >= CDF_OP_COUNT) return refuse(why, why_size, "unknown op kind %d", (int)n->kind);
    const char *op = cdf_op_name(n->kind);
    /* copy/fill/all_reduce move any dtype, argmax reads any numeric input, embedding ids are
     * integers; everything else computes in f32/bf16/f16 */
    switch (n->kind) {
    case CDF_OP_COPY:
    case CDF_OP_FILL:
    case CDF_OP_ALL_REDUCE:
        return true;
    case CDF_OP_EMBEDDING:
        if (n->src[1]->dtype != CDF_I64 && n->src[1]->dtype != CDF_I32)
            return refuse(why, why_size, "%s: ids of dtype %s (i64 or i32 expected)", op, cdf_dtype_name(n->src[1]->dtype));
        break;
    case CDF_OP_REDUCE:
        if (n->p.reduce.op == CDF_RED_ARGMAX) return true;
        break;
    case CDF_OP_MATMUL: {
        /* graph/fuse.c asks before it folds an elementwise chain into a matmul: not here (yet) */
        if (n->p.matmul.epilogue) return refuse(why, why_size, "%s: an elementwise epilogue is not implemented", op);
        cdf_lowered_matmul plan;
        if (cdf_lower_matmul(n, &plan) != CDF_OK)
            return refuse(why, why_size, "%s", cdf_last_error());
        break;
    }
    case CDF_OP_MATMUL_Q: {
        /* x [M, K], blocks u8 [N, row bytes], dst [M, N] (tensor/ops.c: cdf_linear_quantized) */
        const cdf_tensor *w = n->src[1];
        cdf_cuda_qmatmul_plan qp;
        if (cdf_cuda_plan_matmul_q((uint32_t)n->p.matmul_q.qtype, n->dst->shape[n->dst->ndim - 1], n->p.matmul_q.k,
                                   n->src[0]->dtype, n->p.matmul_q.wdt, &qp) != CDF_OK)
            return refuse(why, why_size, "%s: %s", op, cdf_last_error());
        if (w->dtype != CDF_U8 || w->ndim != 2 || w->shape[1] != qp.row_bytes)
            return refuse(why, why_size, "%s: weight blocks of dtype %s, %d-d (u8 [N, %lld] expected)", op,
                          cdf_dtype_name(w->dtype), w->ndim, (long long)qp.row_bytes);
        break;
    }
    case CDF_OP_FUSED:
        /* graph/fuse.c asks before it lets a LayerNorm head a chain: the CUDA fused kernel has no
         * row pass (yet), so the norm stays a node of its own there */
        if (n->p.fused.prog && n->p.fused.prog->norm_head) return refuse(why, why_size, "%s: a LayerNorm head is not implemented", op);
        break;
    case CDF_OP_ATTENTION: {
        const int64_t d = n->src[0]->shape[3], dv = n->src[2]->shape[3];
        if (d > CDF_CUDA_ATTN_MAX_D || dv > CDF_CUDA_ATTN_MAX_D)
            return refuse(why, why_size, "%s: head dim %lld above the kernel's limit %d", op, (long long)(d > dv ? d : dv),
                          CDF_CUDA_ATTN_MAX_D);
        break;
    }
    default:
        break;
    }
    for (int i = -1; i < n->n_src; i++) {
        const cdf_tensor *t = i < 0 ? n->dst : n->src[i];
        if (!t || ((n->kind == CDF_OP_EMBEDDING || n->kind == CDF_OP_MATMUL_Q) && i == 1)) continue; /* ids, blocks */
        if (!cdf_cuda_float_dtype(t->dtype))
            return refuse(why, why_size, "%s: %s %d of dtype %s (f32, bf16 or f16 expected)", op, i < 0 ? "output" : "operand",
                          i < 0 ? 0 : i, cdf_dtype_name(t->dtype));
    }
    return true;
}
