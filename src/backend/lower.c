/* Lowering shared by the backends (see lower.h). */
#include "backend/lower.h"

#include "core/error_internal.h"

static cdf_status lower_operand(const char *name, cdf_lower_operand t, cdf_matrix_layout *m) {
    if (cdf_matmul_operand_layout(t.ndim, t.shape, t.strides, m)) return CDF_OK;
    return cdf_error(CDF_ERR_INTERNAL,
                     "matmul: operand %s (strides %lld, %lld) is neither row- nor column-major, or its batch dims are "
                     "not one strided chain",
                     name, (long long)t.strides[t.ndim - 2], (long long)t.strides[t.ndim - 1]);
}

cdf_status cdf_lower_matmul_operands(cdf_lower_operand a, cdf_lower_operand b, cdf_lower_operand c,
                                     cdf_lowered_matmul *p) {
    *p = (cdf_lowered_matmul){0};
    if (a.ndim < 2 || a.ndim != b.ndim || a.ndim != c.ndim || a.ndim > CDF_MAX_DIMS)
        return cdf_error(CDF_ERR_INTERNAL, "matmul: operand ranks %d, %d, %d", a.ndim, b.ndim, c.ndim);
    const int nb = a.ndim - 2;
    p->M = a.shape[nb];
    p->K = a.shape[nb + 1];
    p->N = b.shape[nb + 1];
    if (b.shape[nb] != p->K || c.shape[nb] != p->M || c.shape[nb + 1] != p->N)
        return cdf_error(CDF_ERR_INTERNAL, "matmul: shapes do not chain ([%lld, %lld] @ [%lld, %lld] -> [%lld, %lld])",
                         (long long)p->M, (long long)p->K, (long long)b.shape[nb], (long long)p->N,
                         (long long)c.shape[nb], (long long)c.shape[nb + 1]);
    p->batch = 1;
    for (int i = 0; i < nb; i++) {
        if (a.shape[i] != c.shape[i] || b.shape[i] != c.shape[i])
            return cdf_error(CDF_ERR_INTERNAL, "matmul: batch dim %d differs (%lld, %lld, %lld)", i,
                             (long long)a.shape[i], (long long)b.shape[i], (long long)c.shape[i]);
        p->batch *= c.shape[i];
    }
    cdf_status s;
    if ((s = lower_operand("a", a, &p->a)) != CDF_OK) return s;
    if ((s = lower_operand("b", b, &p->b)) != CDF_OK) return s;
    if ((s = lower_operand("c", c, &p->c)) != CDF_OK) return s;
    if (p->c.trans && p->M > 1 && p->N > 1) return cdf_error(CDF_ERR_INTERNAL, "matmul: the output is column-major");
    if (p->c.trans) { /* a single row or column: the same bytes as a row-major one */
        p->c.trans = false;
        p->c.ld = p->N > 0 ? p->N : 1;
    }
    return CDF_OK;
}

cdf_status cdf_lower_matmul(const cdf_node *n, cdf_lowered_matmul *out) {
    return cdf_lower_matmul_operands(cdf_lower_operand_of(n->src[0]), cdf_lower_operand_of(n->src[1]),
                                     cdf_lower_operand_of(n->dst), out);
}

void cdf_lower_conv2d(const cdf_node *n, cdf_k_conv2d_args *a) {
    const cdf_tensor *x = n->src[0], *w = n->src[1], *b = n->n_src > 2 ? n->src[2] : NULL;
    const cdf_conv2d_params *p = &n->p.conv.p;
    *a = (cdf_k_conv2d_args){
        .n = x->shape[0], .cin = x->shape[1], .h = x->shape[2], .w = x->shape[3],
        .cout = w->shape[0], .kh = w->shape[2], .kw = w->shape[3],
        .stride_h = p->stride_h, .stride_w = p->stride_w, .pad_h = p->pad_h, .pad_w = p->pad_w,
        .dil_h = p->dil_h, .dil_w = p->dil_w, .groups = p->groups,
        .x_dt = x->dtype, .w_dt = w->dtype, .b_dt = b ? b->dtype : CDF_F32, .out_dt = n->dst->dtype,
    };
}

void cdf_lower_attention(const cdf_node *n, cdf_k_attention_args *a) {
    const cdf_tensor *q = n->src[0], *k = n->src[1], *v = n->src[2], *m = n->n_src > 3 ? n->src[3] : NULL;
    *a = (cdf_k_attention_args){
        .b = q->shape[0], .h = q->shape[1], .lq = q->shape[2], .lk = k->shape[2], .d = q->shape[3], .dv = v->shape[3],
        .q_dt = q->dtype, .q_sb = q->strides[0], .q_sh = q->strides[1], .q_sl = q->strides[2],
        .k_dt = k->dtype, .k_sb = k->strides[0], .k_sh = k->strides[1], .k_sl = k->strides[2],
        .v_dt = v->dtype, .v_sb = v->strides[0], .v_sh = v->strides[1], .v_sl = v->strides[2],
        .mask_dt = m ? m->dtype : CDF_F32,
        .m_sb = m ? m->strides[0] : 0, .m_sh = m ? m->strides[1] : 0,
        .m_sq = m ? m->strides[2] : 0, .m_sk = m ? m->strides[3] : 0,
        .out_dt = n->dst->dtype, .scale = n->p.attention.scale,
    };
}

void cdf_lower_inputs(const cdf_node *n, cdf_lowered_inputs *in) {
    in->n = n->n_src;
    for (int i = 0; i < n->n_src; i++) {
        in->dtype[i] = n->src[i]->dtype;
        in->strides[i] = n->src[i]->strides;
    }
}
