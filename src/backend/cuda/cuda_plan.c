/* The CUDA backend's host-side planning (see cuda_plan.h). */
#include "backend/cuda/cuda_plan.h"

#include <stdarg.h>
#include <stdio.h>

#include "core/error_internal.h"

/* The batch stride of dims [0, nb): those of extent 1 do not count; the others must form one
 * arithmetic chain (contiguous batch, or all 0 = broadcast). */
static bool batch_stride(cdf_cuda_operand t, int nb, int64_t *stride) {
    int64_t inner = -1, expect = -1;
    for (int i = nb - 1; i >= 0; i--) {
        if (t.shape[i] == 1) continue;
        if (inner < 0) {
            inner = t.strides[i];
            expect = t.strides[i] * t.shape[i];
            continue;
        }
        if (t.strides[i] != expect) return false;
        expect *= t.shape[i];
    }
    *stride = inner < 0 ? 0 : inner;
    return true;
}

/* The row-major layout of the last two dims [rows, cols]. */
static bool matrix_layout(cdf_cuda_operand t, cdf_cuda_matrix *m) {
    const int64_t rows = t.shape[t.ndim - 2], cols = t.shape[t.ndim - 1];
    const int64_t rs = t.strides[t.ndim - 2], cs = t.strides[t.ndim - 1];
    const int64_t min_ld_rows = cols > 1 ? cols : 1, min_ld_cols = rows > 1 ? rows : 1;
    if (cs == 1 || cols == 1) { /* rows of contiguous elements (a single row: any row stride) */
        m->trans = false;
        m->ld = rows == 1 ? min_ld_rows : rs;
        if (m->ld >= min_ld_rows) return true;
    }
    if (rs == 1 || rows == 1) { /* columns of contiguous elements: the transpose is row-major */
        m->trans = true;
        m->ld = cols == 1 ? min_ld_cols : cs;
        if (m->ld >= min_ld_cols) return true;
    }
    return false;
}

static cdf_status plan_operand(const char *name, cdf_cuda_operand t, int nb, cdf_cuda_matrix *m) {
    if (!matrix_layout(t, m))
        return cdf_error(CDF_ERR_INTERNAL, "cuda matmul: operand %s (strides %lld, %lld) is neither row- nor column-major",
                         name, (long long)t.strides[t.ndim - 2], (long long)t.strides[t.ndim - 1]);
    if (!batch_stride(t, nb, &m->batch_stride))
        return cdf_error(CDF_ERR_INTERNAL, "cuda matmul: the batch dims of operand %s are not one strided chain", name);
    return CDF_OK;
}

cdf_status cdf_cuda_plan_gemm(cdf_cuda_operand a, cdf_cuda_operand b, cdf_cuda_operand c, cdf_cuda_gemm_plan *p) {
    *p = (cdf_cuda_gemm_plan){0};
    if (a.ndim < 2 || a.ndim != b.ndim || a.ndim != c.ndim || a.ndim > CDF_MAX_DIMS)
        return cdf_error(CDF_ERR_INTERNAL, "cuda matmul: operand ranks %d, %d, %d", a.ndim, b.ndim, c.ndim);
    const int nb = a.ndim - 2;
    p->M = a.shape[nb];
    p->K = a.shape[nb + 1];
    p->N = b.shape[nb + 1];
    if (b.shape[nb] != p->K || c.shape[nb] != p->M || c.shape[nb + 1] != p->N)
        return cdf_error(CDF_ERR_INTERNAL, "cuda matmul: shapes do not chain ([%lld, %lld] @ [%lld, %lld] -> [%lld, %lld])",
                         (long long)p->M, (long long)p->K, (long long)b.shape[nb], (long long)p->N,
                         (long long)c.shape[nb], (long long)c.shape[nb + 1]);
    p->batch = 1;
    for (int i = 0; i < nb; i++) {
        if (a.shape[i] != c.shape[i] || b.shape[i] != c.shape[i])
            return cdf_error(CDF_ERR_INTERNAL, "cuda matmul: batch dim %d differs (%lld, %lld, %lld)", i,
                             (long long)a.shape[i], (long long)b.shape[i], (long long)c.shape[i]);
        p->batch *= c.shape[i];
    }
    cdf_status s;
    if ((s = plan_operand("a", a, nb, &p->a)) != CDF_OK) return s;
    if ((s = plan_operand("b", b, nb, &p->b)) != CDF_OK) return s;
    if ((s = plan_operand("c", c, nb, &p->c)) != CDF_OK) return s;
    if (p->c.trans && p->M > 1 && p->N > 1)
        return cdf_error(CDF_ERR_INTERNAL, "cuda matmul: the output is column-major");
    if (p->c.trans) { /* a single row or column: the same bytes as a row-major one */
        p->c.trans = false;
        p->c.ld = p->N;
    }
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

static cdf_cuda_operand operand_of(const cdf_tensor *t) {
    return (cdf_cuda_operand){.ndim = t->ndim, .shape = t->shape, .strides = t->strides};
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
        cdf_cuda_gemm_plan plan;
        if (cdf_cuda_plan_gemm(operand_of(n->src[0]), operand_of(n->src[1]), operand_of(n->dst), &plan) != CDF_OK)
            return refuse(why, why_size, "%s", cdf_last_error());
        break;
    }
    case CDF_OP_MATMUL_Q:
        return refuse(why, why_size, "%s: GGUF-quantized weights have no kernel on this backend yet (--weight-type f32 or bf16 decodes them at load)", op);
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
        if (!t || (n->kind == CDF_OP_EMBEDDING && i == 1)) continue;
        if (!cdf_cuda_float_dtype(t->dtype))
            return refuse(why, why_size, "%s: %s %d of dtype %s (f32, bf16 or f16 expected)", op, i < 0 ? "output" : "operand",
                          i < 0 ? 0 : i, cdf_dtype_name(t->dtype));
    }
    return true;
}
