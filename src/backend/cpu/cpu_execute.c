/* The cpu backend's executor: one node -> one kernel call. Source operands arrive with their
 * own strides; the tensor API guarantees the layouts each kernel documents (contiguous where
 * required), so this file only resolves pointers and forwards parameters (matmul, conv2d and
 * attention through the lowering the backends share, backend/lower.h). */
#include "backend/backend_impl.h"
#include "backend/cpu/cpu_impl.h"
#include "backend/lower.h"
#include "core/error_internal.h"
#include "kernels/dispatch.h"

#define SRC(i) (n->src[i])
/* the host address of an operand's first element (bound, then translated: cpu_impl.h) */
#define PTR(t) operand_addr(bind, (t))

/* The buffer an operand uses in this run: its own, or the one bound in place of a graph's
 * parameter (the same element offset relative to the buffer's start). */
static const cdf_storage *resolve(const cdf_cpu_binding *b, const cdf_tensor *t, int64_t *offset) {
    *offset = t->offset;
    for (int j = 0; b && j < b->n; j++) {
        if (t->storage == b->params[j]->storage) {
            *offset = t->offset - b->params[j]->offset + b->bound[j]->offset;
            return b->bound[j]->storage;
        }
    }
    return t->storage;
}

static void *operand_addr(const cdf_cpu_binding *b, const cdf_tensor *t) {
    if (!t) return NULL;
    int64_t off;
    const cdf_storage *st = resolve(b, t, &off);
    return cdf_cpu_host_ptr((char *)st->data + off * (int64_t)cdf_dtype_size(t->dtype));
}

cdf_status cdf_cpu_execute_node(const cdf_node *n, const cdf_cpu_binding *bind) {
    cdf_tensor *d = n->dst;
    /* a buffer still without memory here is a compile-layer bug: refuse rather than touch NULL */
    for (int i = -1; i < n->n_src; i++) {
        const cdf_tensor *t = i < 0 ? d : n->src[i];
        int64_t off;
        const cdf_storage *st = t ? resolve(bind, t, &off) : NULL;
        if (st && (st->is_virtual || (!st->data && st->nbytes)))
            return cdf_error(CDF_ERR_INTERNAL, "%s: operand %d has no memory (an unplanned or unbound compile buffer)",
                             cdf_op_name(n->kind), i);
    }
    void *dp = PTR(d);
    switch (n->kind) {
    case CDF_OP_COPY:
        return cdf_k_copy_strided(dp, d->dtype, d->strides, PTR(SRC(0)), SRC(0)->dtype, SRC(0)->strides, d->ndim,
                                  d->shape);
    case CDF_OP_FILL: {
        /* fill writes through dst's strides: it may be a view (e.g. the border of a pad) */
        int64_t numel = cdf_shape_numel(d->ndim, d->shape);
        if (cdf_tensor_is_contiguous(d)) return cdf_k_fill(dp, d->dtype, numel, n->p.fill.value);
        double v = n->p.fill.value;
        int64_t zero[CDF_MAX_DIMS] = {0};
        return cdf_k_copy_strided(dp, d->dtype, d->strides, &v, CDF_F64, zero, d->ndim, d->shape);
    }
    case CDF_OP_EMBEDDING: {
        cdf_tensor *tab = SRC(0), *ids = SRC(1);
        return cdf_k_embedding(dp, d->dtype, PTR(tab), tab->dtype, tab->shape[0], tab->shape[1], PTR(ids), ids->dtype,
                               cdf_shape_numel(ids->ndim, ids->shape));
    }
    case CDF_OP_UNARY:
        return cdf_k_unary(n->p.unary.op, n->p.unary.p0, n->p.unary.p1, dp, d->dtype, PTR(SRC(0)), SRC(0)->dtype,
                           cdf_shape_numel(d->ndim, d->shape));
    case CDF_OP_BINARY:
        return cdf_k_binary(n->p.binary.op, dp, d->dtype, PTR(SRC(0)), SRC(0)->dtype, SRC(0)->strides, PTR(SRC(1)),
                            SRC(1)->dtype, SRC(1)->strides, d->ndim, d->shape);
    case CDF_OP_MATMUL: {
        /* dst is contiguous [..., M, N] (a fresh tensor of the tensor API) */
        cdf_lowered_matmul L;
        cdf_status s = cdf_lower_matmul(n, &L);
        if (s != CDF_OK) return s;
        cdf_tensor *a = SRC(0), *b = SRC(1);
        cdf_k_matmul_args args = {
            .batch = L.batch, .M = L.M, .N = L.N, .K = L.K,
            .a = PTR(a), .a_dt = a->dtype, .lda = L.a.ld, .sa = L.a.batch_stride, .trans_a = L.a.trans,
            .b = PTR(b), .b_dt = b->dtype, .ldb = L.b.ld, .sb = L.b.batch_stride, .trans_b = L.b.trans,
            .bias = PTR(SRC(2)), .bias_dt = SRC(2) ? SRC(2)->dtype : CDF_F32,
            .c = dp, .c_dt = d->dtype, .ldc = L.N, .sc = L.M * L.N,
            .alpha = n->p.matmul.alpha, .beta = 0.0f,
        };
        cdf_k_fused_epilogue epi;
        if (n->p.matmul.epilogue) {
            /* the elementwise chain folded into this matmul (graph/fuse.c), run on C's rows in
             * place as they are final: input 0 is C, input k >= 1 is src[2 + k] */
            epi = (cdf_k_fused_epilogue){.p = n->p.matmul.epilogue, .out = dp, .out_dt = d->dtype, .n_in = 1,
                                         .ndim = n->p.matmul.epi_ndim, .shape = n->p.matmul.epi_shape,
                                         .batch = args.batch, .M = L.M, .N = L.N};
            epi.in[0] = dp;
            epi.in_dt[0] = d->dtype;
            for (int k = 3; k < n->n_src && epi.n_in < CDF_FUSE_MAX_INPUTS; k++, epi.n_in++) {
                epi.in[epi.n_in] = PTR(SRC(k));
                epi.in_dt[epi.n_in] = SRC(k)->dtype;
                epi.in_strides[epi.n_in] = SRC(k)->strides;
            }
            CDF_TRY(cdf_k_fused_epilogue_check(&epi));
            args.epilogue = cdf_k_fused_epilogue_rows;
            args.epilogue_ctx = &epi;
        }
        return cdf_k_matmul_dispatch(&args);
    }
    case CDF_OP_SOFTMAX:
        return cdf_k_softmax(dp, d->dtype, PTR(SRC(0)), SRC(0)->dtype, n->p.softmax.rows, n->p.softmax.cols,
                             n->p.softmax.scale);
    case CDF_OP_LAYER_NORM: {
        cdf_dtype wdt = SRC(1) ? SRC(1)->dtype : (SRC(2) ? SRC(2)->dtype : CDF_F32);
        return cdf_k_layer_norm_dispatch(dp, d->dtype, PTR(SRC(0)), SRC(0)->dtype, n->p.norm.rows, n->p.norm.cols,
                                n->p.norm.eps, PTR(SRC(1)), PTR(SRC(2)), wdt);
    }
    case CDF_OP_RMS_NORM:
        return cdf_k_rms_norm_dispatch(dp, d->dtype, PTR(SRC(0)), SRC(0)->dtype, n->p.norm.rows, n->p.norm.cols, n->p.norm.eps,
                              PTR(SRC(1)), SRC(1) ? SRC(1)->dtype : CDF_F32);
    case CDF_OP_GROUP_NORM: {
        cdf_dtype wdt = SRC(1) ? SRC(1)->dtype : (SRC(2) ? SRC(2)->dtype : CDF_F32);
        return cdf_k_group_norm(dp, d->dtype, PTR(SRC(0)), SRC(0)->dtype, n->p.group_norm.n, n->p.group_norm.c,
                                n->p.group_norm.s, n->p.group_norm.groups, n->p.group_norm.eps, PTR(SRC(1)),
                                PTR(SRC(2)), wdt);
    }
    case CDF_OP_REDUCE:
        return cdf_k_reduce(n->p.reduce.op, dp, d->dtype, PTR(SRC(0)), SRC(0)->dtype, n->p.reduce.outer,
                            n->p.reduce.red, n->p.reduce.inner);
    case CDF_OP_CONV2D: {
        cdf_k_conv2d_args a;
        cdf_lower_conv2d(n, &a);
        a.x = PTR(SRC(0)); a.weight = PTR(SRC(1)); a.bias = PTR(SRC(2)); a.out = dp;
        return cdf_k_conv2d_dispatch(&a);
    }
    case CDF_OP_UPSAMPLE: {
        cdf_tensor *x = SRC(0);
        int64_t h = x->shape[x->ndim - 2], w = x->shape[x->ndim - 1];
        int64_t nc = cdf_shape_numel(x->ndim, x->shape) / (h * w > 0 ? h * w : 1);
        return cdf_k_upsample_nearest(dp, d->dtype, PTR(x), x->dtype, nc, h, w, n->p.upsample.fh, n->p.upsample.fw);
    }
    case CDF_OP_ATTENTION: {
        cdf_k_attention_args a;
        cdf_lower_attention(n, &a);
        a.q = PTR(SRC(0)); a.k = PTR(SRC(1)); a.v = PTR(SRC(2)); a.mask = PTR(SRC(3)); a.out = dp;
        return cdf_k_attention_dispatch(&a);
    }
    case CDF_OP_ROPE: {
        cdf_tensor *x = SRC(0);
        return cdf_k_rope(dp, d->dtype, PTR(x), x->dtype, PTR(SRC(1)), PTR(SRC(2)), x->shape[0], x->shape[1],
                          x->shape[2], x->shape[3]);
    }
    case CDF_OP_TIMESTEP_EMB:
        return cdf_k_timestep_embedding(dp, PTR(SRC(0)), SRC(0)->shape[0], n->p.temb.dim, n->p.temb.flip,
                                        n->p.temb.shift, n->p.temb.scale, n->p.temb.max_period);
    case CDF_OP_FUSED: {
        cdf_lowered_inputs li;
        const void *in[CDF_NODE_MAX_SRC];
        cdf_lower_inputs(n, &li);
        for (int i = 0; i < n->n_src; i++) in[i] = PTR(SRC(i));
        return cdf_k_fused_elementwise(n->p.fused.prog, dp, d->dtype, li.n, in, li.dtype, li.strides, d->ndim, d->shape);
    }
    case CDF_OP_ROPE_TABLE:
        return cdf_k_rope_table(dp, PTR(SRC(0)), SRC(0)->shape[0], n->p.rope_table.n_axes, n->p.rope_table.axes_dim,
                                n->p.rope_table.theta);
    case CDF_OP_ALL_REDUCE: {
        /* out of place: dst = src0, then the communicator sums dst in place over the ranks (on
         * this worker thread, in queue order; see graph/node.h). dst is contiguous (tensor API). */
        cdf_status s = cdf_k_copy_strided(dp, d->dtype, d->strides, PTR(SRC(0)), SRC(0)->dtype, SRC(0)->strides,
                                          d->ndim, d->shape);
        if (s != CDF_OK) return s;
        if (!n->p.all_reduce.reduce) return cdf_error(CDF_ERR_INTERNAL, "all_reduce: node has no reduce function");
        return n->p.all_reduce.reduce(n->p.all_reduce.comm, dp, cdf_shape_numel(d->ndim, d->shape), d->dtype);
    }
    case CDF_OP_MATMUL_Q: {
        cdf_tensor *x = SRC(0), *b = SRC(2);
        cdf_k_matmul_q_args a = {
            .M = x->shape[0], .N = d->shape[1], .K = n->p.matmul_q.k,
            .a = PTR(x), .a_dt = x->dtype,
            .w = PTR(SRC(1)), .qtype = (uint32_t)n->p.matmul_q.qtype, .w_dt = n->p.matmul_q.wdt,
            .bias = PTR(b), .bias_dt = b ? b->dtype : CDF_F32, .c = dp, .c_dt = d->dtype,
        };
        return cdf_k_matmul_q(&a);
    }
    case CDF_OP_COUNT: break;
    }
    return cdf_error(CDF_ERR_INTERNAL, "cpu backend: unknown op kind %d", (int)n->kind);
}
