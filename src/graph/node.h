/* graph/ — the op node. Every tensor op becomes one node: the op kind, its parameters, its
 * source tensors and its destination. Eager mode enqueues the node on the device queue at
 * once; defer-and-fuse and compile record nodes into a graph instead (exec/). Kernels never see
 * nodes: a backend lowers a node into its own kernel call.
 *
 * A node is semantic: it says what the op computes (operands with their shapes, strides and
 * dtypes; the op's parameters), never how a particular backend's kernel wants its arguments
 * (leading dimensions, transposition flags, batch strides are each backend's lowering). */
#ifndef CDF_GRAPH_NODE_H
#define CDF_GRAPH_NODE_H

#include "core/op_defs.h"
#include "graph/value.h"

typedef enum cdf_op_kind {
    CDF_OP_COPY,          /* dst = cast(src0) with any strides (contiguous, cast, cat, pad) */
    CDF_OP_FILL,          /* dst = value */
    CDF_OP_EMBEDDING,     /* dst = src0[src1] */
    CDF_OP_UNARY,
    CDF_OP_BINARY,
    CDF_OP_MATMUL,        /* dst = src0 @ src1 (+ src2 bias) */
    CDF_OP_SOFTMAX,
    CDF_OP_LAYER_NORM,    /* src1 weight, src2 bias (optional) */
    CDF_OP_RMS_NORM,
    CDF_OP_GROUP_NORM,
    CDF_OP_REDUCE,
    CDF_OP_CONV2D,
    CDF_OP_UPSAMPLE,
    CDF_OP_ATTENTION,     /* src0 q, src1 k, src2 v, src3 mask (optional) */
    CDF_OP_ROPE,          /* src0 x, src1 cos, src2 sin */
    CDF_OP_TIMESTEP_EMB,
    CDF_OP_FUSED,         /* an elementwise chain (graph/fuse.c): dst = program(src...) */
    CDF_OP_ROPE_TABLE,    /* dst [2, L, width] = (cos, sin) from positions src0 [L, n_axes] */
    CDF_OP_ALL_REDUCE,    /* dst = sum over the ranks of src0 (a collective: p.all_reduce) */
    CDF_OP_MATMUL_Q,      /* dst = src0 @ dequant(src1)^T (+ src2 bias): a GGUF-quantized weight */
    CDF_OP_COUNT
} cdf_op_kind;

const char *cdf_op_name(cdf_op_kind k);

/* The layout every matmul operand has (the tensor API makes a contiguous copy otherwise), which
 * any BLAS-style kernel can take: [b..., R, C] (shape, element strides) is a matrix with one unit
 * stride among its last two dims (row-major: trans = false, ld = row stride; column-major: trans
 * = true, ld = column stride; ld >= 1 and never overlapping rows/columns) and batch dims that
 * collapse into one stride (batch_stride, 0 = the same matrix for every batch entry). The
 * backends lower the node from these (backend/lower.h). */
typedef struct cdf_matrix_layout {
    bool trans;
    int64_t ld, batch_stride;
} cdf_matrix_layout;
bool cdf_matmul_operand_layout(int ndim, const int64_t *shape, const int64_t *strides, cdf_matrix_layout *m);

#define CDF_NODE_MAX_SRC CDF_FUSE_MAX_INPUTS

/* A collective as an op (the XLA design: the all-reduce is a node of the graph, so compile
 * captures it and eager mode queues it like any kernel instead of syncing the host). The graph
 * and backend layers know nothing of MPI or process groups: the node carries an opaque
 * communicator and the function that reduces a contiguous host-addressable buffer in place over
 * it, both supplied by the layer that created the node (src/dist). The backend copies src0 into
 * dst, then calls reduce(comm, dst data, numel, dtype) on its worker, in queue order. A compiled
 * graph keeps the pointers (a graph belongs to one process, as does its communicator). */
typedef cdf_status (*cdf_collective_reduce_fn)(void *comm, void *data, int64_t n, cdf_dtype dt);

typedef struct cdf_node {
    cdf_op_kind kind;
    int n_src;
    cdf_tensor *src[CDF_NODE_MAX_SRC]; /* references held by the node (NULL = absent) */
    cdf_tensor *dst;                   /* reference held by the node */
    union {
        struct { double value; } fill;
        struct { cdf_unary_op op; float p0, p1; } unary;
        struct { cdf_binary_op op; } binary;
        /* dst [..., M, N] = alpha * src0 [..., M, K] @ src1 [..., K, N] (+ src2 [N]); batch dims
         * already broadcast (expanded views); each operand satisfies cdf_matmul_operand_layout.
         * epilogue (graph/fuse.c; owned by the node, NULL = none): the elementwise chain that
         * followed the matmul, run on each finished row of the product in place, so that
         * dst = epilogue(A @ B + bias, src3, src4, ...): program input 0 is the product, input
         * k >= 1 is src[2 + k] (src2, the bias slot, may then be NULL). The chain ran over
         * epi_shape (the product reshaped, e.g. [B*L, N] seen as [B, L, N]; same element count,
         * both contiguous): the inputs' strides index that shape; dst keeps the product's. */
        struct {
            float alpha;
            cdf_fused_program *epilogue;
            int epi_ndim;
            int64_t epi_shape[CDF_MAX_DIMS];
        } matmul;
        struct { int64_t rows, cols; float scale; } softmax;
        struct { int64_t rows, cols; float eps; } norm;
        struct { int64_t n, c, s, groups; float eps; } group_norm;
        struct { cdf_reduce_op op; int64_t outer, red, inner; } reduce;
        struct { cdf_conv2d_params p; } conv;
        struct { int fh, fw; } upsample;
        struct { float scale; } attention;
        struct { bool flip; float shift, scale, max_period; int dim; } temb;
        struct { cdf_fused_program *prog; } fused; /* owned by the node */
        struct { int n_axes; int64_t axes_dim[CDF_MAX_DIMS]; double theta; } rope_table;
        /* comm not owned. replicas > 1: the sum over the `replicas` replicas of the one program
         * a values-kind device runs on its devices (one process, no communicator: reduce is
         * NULL); else reduce(comm, ...) sums over the processes */
        struct { void *comm; cdf_collective_reduce_fn reduce; int replicas; } all_reduce;
        /* dst [M, N] (contiguous) = src0 [M, K] (contiguous) @ W^T (+ src2 [N]), where W [N, K] is
         * src1, a contiguous U8 [N, row bytes] holding GGUF blocks of ggml type qtype, decoded as
         * gguf-py does and rounded to wdt (the load policy's weight dtype), so that the layer
         * computes what the same weights dequantized into a file and loaded would */
        struct { int qtype; int64_t k; cdf_dtype wdt; } matmul_q;
    } p;
} cdf_node;

/* Is storage s reachable only through nodes[0..n) (NULL entries skipped) and outs[0..n_out), plus
 * `pins` references its caller holds? Every tensor referring to it must be held only by those
 * nodes/outputs too. What the fusion pass (an intermediate nobody else can read) and the memory
 * planner (a buffer nothing outside the graph holds may share arena memory) both ask. */
bool cdf_graph_holds_only(cdf_node *const *nodes, int n, cdf_tensor *const *outs, int n_out, const cdf_storage *s,
                          long pins);

/* dst->p = src->p, with a copy of any program src owns (a fused chain, a matmul epilogue):
 * false (dst unchanged) when out of host memory. */
bool cdf_node_copy_params(cdf_node *dst, const cdf_node *src);

/* A new node with no sources (kind set, params zeroed). */
cdf_node *cdf_node_new(cdf_op_kind kind);
/* Adds a source reference (NULL allowed = absent optional operand). */
void cdf_node_add_src(cdf_node *n, cdf_tensor *t);
void cdf_node_free(cdf_node *n); /* drops the references */

#endif
