/* The op node: creation, references, names, and the operand contract of matmul (graph/node.h). */
#include "graph/node.h"

#include <stdlib.h>

#include "core/error_internal.h"

static const char *k_op_names[CDF_OP_COUNT] = {
    [CDF_OP_COPY] = "copy",           [CDF_OP_FILL] = "fill",         [CDF_OP_EMBEDDING] = "embedding",
    [CDF_OP_UNARY] = "unary",         [CDF_OP_BINARY] = "binary",     [CDF_OP_MATMUL] = "matmul",
    [CDF_OP_SOFTMAX] = "softmax",     [CDF_OP_LAYER_NORM] = "layer_norm", [CDF_OP_RMS_NORM] = "rms_norm",
    [CDF_OP_GROUP_NORM] = "group_norm", [CDF_OP_REDUCE] = "reduce",   [CDF_OP_CONV2D] = "conv2d",
    [CDF_OP_UPSAMPLE] = "upsample_nearest", [CDF_OP_ATTENTION] = "attention", [CDF_OP_ROPE] = "rope",
    [CDF_OP_TIMESTEP_EMB] = "timestep_embedding", [CDF_OP_FUSED] = "fused_elementwise", [CDF_OP_ROPE_TABLE] = "rope_table",
    [CDF_OP_ALL_REDUCE] = "all_reduce", [CDF_OP_MATMUL_Q] = "matmul_quantized",
};

const char *cdf_op_name(cdf_op_kind k) { return (unsigned)k < CDF_OP_COUNT ? k_op_names[k] : "?"; }

cdf_node *cdf_node_new(cdf_op_kind kind) {
    cdf_node *n = calloc(1, sizeof *n);
    if (!n) {
        cdf_error(CDF_ERR_OUT_OF_MEMORY, "host out of memory (op node)");
        return NULL;
    }
    n->kind = kind;
    return n;
}

void cdf_node_add_src(cdf_node *n, cdf_tensor *t) {
    if (n->n_src < CDF_NODE_MAX_SRC) n->src[n->n_src++] = cdf_tensor_retain(t);
}

void cdf_node_free(cdf_node *n) {
    if (!n) return;
    for (int i = 0; i < n->n_src; i++) cdf_tensor_release(n->src[i]);
    cdf_tensor_release(n->dst);
    if (n->kind == CDF_OP_FUSED) free(n->p.fused.prog);
    if (n->kind == CDF_OP_MATMUL) free(n->p.matmul.epilogue);
    free(n);
}

bool cdf_node_copy_params(cdf_node *dst, const cdf_node *src) {
    cdf_fused_program *const *owned = src->kind == CDF_OP_FUSED    ? &src->p.fused.prog
                                      : src->kind == CDF_OP_MATMUL ? &src->p.matmul.epilogue
                                                                   : NULL;
    cdf_fused_program *copy = NULL;
    if (owned && *owned) {
        copy = malloc(sizeof *copy);
        if (!copy) {
            cdf_error(CDF_ERR_OUT_OF_MEMORY, "host out of memory (op node)");
            return false;
        }
        *copy = **owned;
    }
    dst->p = src->p;
    if (src->kind == CDF_OP_FUSED) dst->p.fused.prog = copy;
    if (src->kind == CDF_OP_MATMUL) dst->p.matmul.epilogue = copy;
    return true;
}

/* The last two dims [rows, cols] as a matrix: unit column stride (row-major) or unit row stride
 * (column-major), with a leading dimension (>= 1) that does not overlap rows/columns. */
static bool matrix_layout(const int64_t *shape, const int64_t *strides, int r, cdf_matrix_layout *m) {
    const int c = r + 1;
    const int64_t rows = shape[r], cols = shape[c];
    if (strides[c] == 1 || cols == 1) { /* rows of contiguous elements (a single row: any row stride) */
        m->trans = false;
        m->ld = rows == 1 ? cols : strides[r];
        if (rows != 1 && strides[r] < cols) return false;
        if (m->ld < 1) m->ld = 1;
        return true;
    }
    if (strides[r] == 1 || rows == 1) { /* columns of contiguous elements: the transpose is row-major */
        m->trans = true;
        m->ld = cols == 1 ? rows : strides[c];
        if (cols != 1 && strides[c] < rows) return false;
        if (m->ld < 1) m->ld = 1;
        return true;
    }
    return false;
}

/* The batch dims [0, nb) as one stride: at most one non-trivial dim, or several forming one
 * arithmetic progression (a contiguous chain), or none (stride 0). */
static bool batch_collapsible(const int64_t *shape, const int64_t *strides, int nb, int64_t *stride) {
    int64_t inner_stride = -1, expect = -1;
    for (int i = nb - 1; i >= 0; i--) {
        if (shape[i] == 1) continue;
        if (inner_stride < 0) {
            inner_stride = strides[i];
            expect = strides[i] * shape[i];
            continue;
        }
        if (strides[i] != expect) return false;
        expect *= shape[i];
    }
    *stride = inner_stride < 0 ? 0 : inner_stride;
    return true;
}

bool cdf_matmul_operand_layout(int ndim, const int64_t *shape, const int64_t *strides, cdf_matrix_layout *m) {
    if (ndim < 2 || ndim > CDF_MAX_DIMS) return false;
    return matrix_layout(shape, strides, ndim - 2, m) && batch_collapsible(shape, strides, ndim - 2, &m->batch_stride);
}

bool cdf_graph_holds_only(cdf_node *const *nodes, int n, cdf_tensor *const *outs, int n_out, const cdf_storage *s,
                          long pins) {
    enum { MAXOBJ = 128 };
    const cdf_tensor *obj[MAXOBJ];
    long cnt[MAXOBJ];
    int nobj = 0;
    for (int i = 0; i <= n; i++) {
        if (i < n && !nodes[i]) continue; /* a slot the fusion pass emptied */
        const int nt = i < n ? nodes[i]->n_src + 1 : n_out;
        for (int k = 0; k < nt; k++) {
            const cdf_tensor *t = i < n ? (k == 0 ? nodes[i]->dst : nodes[i]->src[k - 1]) : outs[k];
            if (!t || t->storage != s) continue;
            int j = 0;
            while (j < nobj && obj[j] != t) j++;
            if (j == nobj) {
                if (nobj == MAXOBJ) return false;
                obj[nobj] = t;
                cnt[nobj++] = 0;
            }
            cnt[j]++;
        }
    }
    if (atomic_load(&((cdf_storage *)s)->refcount) != nobj + pins) return false;
    for (int j = 0; j < nobj; j++)
        if (atomic_load(&((cdf_tensor *)obj[j])->refcount) != cnt[j]) return false;
    return true;
}
