/* Elementwise fusion and matmul epilogues (see fuse.h). The fused kernel is interpreted
 * (kernels/fused_elementwise.c), so a fused chain needs no code generation: the passes are
 * linear-ish in the pending graph and the same model code yields the same chains at every
 * denoising step. */
#include "graph/fuse.h"

#include <stdlib.h>
#include <string.h>

static bool fusible(const cdf_node *n) {
    if (!n || (n->kind != CDF_OP_UNARY && n->kind != CDF_OP_BINARY)) return false;
    return n->dst->dtype == CDF_F32 && cdf_tensor_is_contiguous(n->dst);
}

/* A cast of an f32 value to bf16 (cdf_cast: a copy node): it may end an elementwise chain, whose
 * fused kernel then stores bf16 (rounded to nearest even as the copy rounds: the same bits) */
static bool bf16_cast(const cdf_node *n) {
    return n && n->kind == CDF_OP_COPY && n->n_src == 1 && n->src[0]->dtype == CDF_F32 && n->dst->dtype == CDF_BF16 &&
           cdf_tensor_is_contiguous(n->dst);
}

static bool reads_whole(const cdf_tensor *view, const cdf_tensor *t) {
    if (view->storage != t->storage || view->offset != t->offset || view->ndim != t->ndim) return false;
    for (int d = 0; d < t->ndim; d++)
        if (view->shape[d] != t->shape[d] || (view->shape[d] != 1 && view->strides[d] != t->strides[d])) return false;
    return true;
}

/* view is t (contiguous) under another contiguous shape with the same elements: a reshape,
 * e.g. a linear layer's [B*L, N] product read as [B, L, N]. */
static bool reads_reshaped(const cdf_tensor *view, const cdf_tensor *t) {
    return view->storage == t->storage && view->offset == t->offset && cdf_tensor_is_contiguous(view) &&
           cdf_tensor_is_contiguous(t) && cdf_shape_numel(view->ndim, view->shape) == cdf_shape_numel(t->ndim, t->shape);
}

/* The single consumer of node c's result among nodes (c, n), or -1. *slot = which source. */
static int single_consumer(cdf_node **nodes, int n, int c, int *slot) {
    const cdf_storage *s = nodes[c]->dst->storage;
    int found = -1, uses = 0;
    for (int j = c + 1; j < n; j++) {
        if (!nodes[j]) continue;
        for (int k = 0; k < nodes[j]->n_src; k++) {
            if (nodes[j]->src[k] && nodes[j]->src[k]->storage == s) {
                uses++;
                found = j;
                *slot = k;
            }
        }
        if (nodes[j]->dst->storage == s) return -1; /* written again (a view of it): keep it */
    }
    return uses == 1 ? found : -1;
}

/* Does a node strictly between positions `from` and `to` write into storage s? The fused node
 * runs at the chain's last position, so every operand it reads is read later than the node that
 * read it before: nothing may have changed it in between. */
static bool written_between(cdf_node *const *nodes, int from, int to, const cdf_storage *s) {
    for (int j = from + 1; j < to; j++)
        if (nodes[j] && nodes[j]->dst->storage == s) return true;
    return false;
}

/* A chain being collected: the program, its inputs (input 0 = the head value) with the position
 * of the node that read each one, and the nodes it absorbs. */
typedef struct chain {
    cdf_fused_program prog;
    cdf_tensor *in[CDF_FUSE_MAX_INPUTS];
    int read_at[CDF_FUSE_MAX_INPUTS];
    int n_in;
    int node[CDF_FUSE_MAX_STEPS + 1];
    int n_nodes;
} chain;

static cdf_fused_step unary_step(const cdf_node *c) {
    return (cdf_fused_step){.binary = false, .input = -1, .op = c->p.unary.op, .p0 = c->p.unary.p0, .p1 = c->p.unary.p1};
}

/* Extend ch from the node at `cur` (the chain's current end) with the elementwise nodes that
 * consume its result elementwise and alone, using at most max_in inputs; returns the new end.
 * reshape_first: the first consumer may read the head's result reshaped (a matmul's product:
 * the chain runs over the element order both share). cast_last: a bf16 cast may be the chain's
 * last node (it adds no step: the fused node stores in the cast's dtype). */
static int grow(cdf_node **nodes, int n, chain *ch, int cur, int max_in, bool reshape_first, bool cast_last) {
    for (bool first = true;; first = false) {
        int slot = -1, j = single_consumer(nodes, n, cur, &slot);
        if (j < 0) break;
        cdf_node *c = nodes[j];
        if (cast_last && bf16_cast(c)) {
            const cdf_tensor *mid = nodes[cur]->dst;
            if (reads_whole(c->src[0], mid) && cdf_graph_holds_only(nodes, n, NULL, 0, mid->storage, 0)) {
                ch->node[ch->n_nodes++] = j;
                cur = j;
            }
            break;
        }
        if (!fusible(c) || ch->prog.n_steps == CDF_FUSE_MAX_STEPS) break;
        const cdf_tensor *mid = nodes[cur]->dst, *rd = c->src[slot];
        if (!reads_whole(rd, mid) && !(first && reshape_first && reads_reshaped(rd, mid))) break;
        if (c->dst->ndim != rd->ndim) break;
        bool same_shape = true;
        for (int d = 0; d < rd->ndim; d++) same_shape &= c->dst->shape[d] == rd->shape[d];
        if (!same_shape || !cdf_graph_holds_only(nodes, n, NULL, 0, mid->storage, 0) /* nobody else reads it */) break;
        cdf_fused_step st;
        if (c->kind == CDF_OP_UNARY) {
            st = unary_step(c);
        } else {
            cdf_tensor *other = c->src[1 - slot];
            if (other->storage == mid->storage || ch->n_in == max_in) break;
            ch->in[ch->n_in] = other;
            ch->read_at[ch->n_in] = j;
            st = (cdf_fused_step){.binary = true, .input = (int8_t)ch->n_in, .chain_rhs = slot == 1, .op = c->p.binary.op};
            ch->n_in++;
        }
        ch->prog.steps[ch->prog.n_steps++] = st;
        ch->node[ch->n_nodes++] = j;
        cur = j;
    }
    return cur;
}

/* A LayerNorm without weight or bias over the last dim of a contiguous input, storing f32: it may
 * head a chain (the fused kernel normalises each row into cache and runs the chain from there). */
static bool norm_head(const cdf_node *n) {
    if (!n || n->kind != CDF_OP_LAYER_NORM || n->n_src < 1 || !n->src[0]) return false;
    for (int k = 1; k < n->n_src; k++)
        if (n->src[k]) return false;
    const cdf_tensor *x = n->src[0], *y = n->dst;
    if (y->dtype != CDF_F32 || !cdf_tensor_is_contiguous(y) || !cdf_tensor_is_contiguous(x) || y->ndim < 1 ||
        x->ndim != y->ndim)
        return false;
    for (int d = 0; d < y->ndim; d++)
        if (x->shape[d] != y->shape[d]) return false;
    return y->shape[y->ndim - 1] == n->p.norm.cols && n->p.norm.cols <= CDF_FUSE_NORM_MAX_COLS;
}

/* Inputs [first, n_in) still hold at the chain's end `last`. */
static bool inputs_unchanged(cdf_node *const *nodes, const chain *ch, int first, int last) {
    for (int k = first; k < ch->n_in; k++)
        if (written_between(nodes, ch->read_at[k], last, ch->in[k]->storage)) return false;
    return true;
}

/* Put f at the chain's end and free the chain's nodes. */
static void replace_chain(cdf_node **nodes, const chain *ch, int last, cdf_node *f, cdf_fuse_stats *stats) {
    for (int k = 0; k < ch->n_nodes; k++) {
        cdf_node_free(nodes[ch->node[k]]);
        nodes[ch->node[k]] = NULL;
    }
    nodes[last] = f;
    if (stats) {
        stats->chains++;
        stats->nodes_fused += ch->n_nodes;
    }
}

static void compact(cdf_node **nodes, int *n_io) {
    int w = 0;
    for (int i = 0; i < *n_io; i++)
        if (nodes[i]) nodes[w++] = nodes[i];
    *n_io = w;
}

/* The chain ch (nodes ch.node[], ending at `last`) as one fused node, or NULL when out of memory. */
static cdf_node *fused_node(cdf_node **nodes, const chain *ch, int last) {
    cdf_node *f = cdf_node_new(CDF_OP_FUSED);
    cdf_fused_program *pp = f ? malloc(sizeof *pp) : NULL;
    if (!f || !pp) {
        free(f);
        return NULL;
    }
    *pp = ch->prog;
    f->p.fused.prog = pp;
    for (int k = 0; k < ch->n_in; k++) cdf_node_add_src(f, ch->in[k]);
    f->dst = cdf_tensor_retain(nodes[last]->dst);
    return f;
}

/* A chain headed by the norm at i (norm_head(nodes[i])): true when it replaced its nodes. */
static bool fuse_norm_chain(cdf_node **nodes, int n, int i, bool (*supports)(const cdf_node *node),
                            cdf_fuse_stats *stats) {
    cdf_node *h = nodes[i];
    chain ch = {.n_in = 1};
    ch.in[0] = h->src[0];
    ch.read_at[0] = i;
    ch.prog.norm_head = true;
    ch.prog.norm_eps = h->p.norm.eps;
    ch.node[ch.n_nodes++] = i;
    int last = grow(nodes, n, &ch, i, CDF_FUSE_MAX_INPUTS, false, true);
    if (ch.n_nodes < 2 || !inputs_unchanged(nodes, &ch, 0, last)) return false;
    cdf_node *f = fused_node(nodes, &ch, last);
    if (!f) return false; /* out of memory: leave the chain unfused (still correct) */
    if (supports && !supports(f)) { /* a backend without norm heads: the chain after the norm may still fuse */
        cdf_node_free(f);
        return false;
    }
    replace_chain(nodes, &ch, last, f, stats);
    if (stats) stats->norm_heads++;
    return true;
}

void cdf_fuse_elementwise(cdf_node **nodes, int *n_io, bool (*supports)(const cdf_node *node), cdf_fuse_stats *stats) {
    int n = *n_io;
    for (int i = 0; i < n; i++) {
        if (norm_head(nodes[i]) && fuse_norm_chain(nodes, n, i, supports, stats)) continue;
        if (!fusible(nodes[i])) continue;
        chain ch = {.n_in = 0};
        /* head */
        cdf_node *h = nodes[i];
        ch.in[ch.n_in] = h->src[0];
        ch.read_at[ch.n_in++] = i;
        if (h->kind == CDF_OP_UNARY) {
            ch.prog.steps[0] = unary_step(h);
        } else {
            ch.in[ch.n_in] = h->src[1];
            ch.read_at[ch.n_in++] = i;
            ch.prog.steps[0] = (cdf_fused_step){.binary = true, .input = 1, .op = h->p.binary.op};
        }
        ch.prog.n_steps = 1;
        ch.node[ch.n_nodes++] = i;
        int last = grow(nodes, n, &ch, i, CDF_FUSE_MAX_INPUTS, false, true);
        if (ch.n_nodes < 2 || !inputs_unchanged(nodes, &ch, 0, last)) continue;
        cdf_node *f = fused_node(nodes, &ch, last);
        if (!f) continue; /* out of memory: leave the chain unfused (still correct) */
        replace_chain(nodes, &ch, last, f, stats);
    }
    compact(nodes, n_io);
}

/* The matmul node absorbs the chain as its epilogue: sources A, B, bias slot, then the chain's
 * inputs 1.. (node.h). The product is written straight into the chain's destination (viewed in
 * the product's shape), whose rows the epilogue then rewrites in place, so no operand may share
 * its storage. */
static cdf_node *epilogue_node(const cdf_node *mm, const chain *ch, const cdf_tensor *dst) {
    for (int k = 0; k < 3; k++)
        if (k < mm->n_src && mm->src[k] && mm->src[k]->storage == dst->storage) return NULL;
    for (int k = 1; k < ch->n_in; k++)
        if (ch->in[k]->storage == dst->storage) return NULL;
    const cdf_tensor *p = mm->dst;
    cdf_node *f = cdf_node_new(CDF_OP_MATMUL);
    cdf_fused_program *pp = f ? malloc(sizeof *pp) : NULL;
    cdf_tensor *out = pp ? cdf_value_view(dst->storage, dst->offset, p->dtype, p->ndim, p->shape, p->strides) : NULL;
    if (!out) {
        free(pp);
        free(f);
        return NULL; /* out of memory: leave the chain unfused (still correct) */
    }
    *pp = ch->prog;
    f->p.matmul.alpha = mm->p.matmul.alpha;
    f->p.matmul.epilogue = pp;
    f->p.matmul.epi_ndim = dst->ndim;
    memcpy(f->p.matmul.epi_shape, dst->shape, sizeof dst->shape);
    for (int k = 0; k < 3; k++) cdf_node_add_src(f, k < mm->n_src ? mm->src[k] : NULL);
    for (int k = 1; k < ch->n_in; k++) cdf_node_add_src(f, ch->in[k]);
    f->dst = out;
    return f;
}

void cdf_fuse_matmul_epilogues(cdf_node **nodes, int *n_io, bool (*supports)(const cdf_node *node),
                               cdf_fuse_stats *stats) {
    int n = *n_io;
    for (int i = 0; i < n; i++) {
        cdf_node *mm = nodes[i];
        /* the product must be f32 (the chain reads it as stored, which in place is its f32 value) */
        if (!mm || mm->kind != CDF_OP_MATMUL || mm->p.matmul.epilogue || mm->dst->dtype != CDF_F32 ||
            !cdf_tensor_is_contiguous(mm->dst))
            continue;
        chain ch = {.n_in = 1};
        ch.in[0] = mm->dst; /* the product itself, not a source of the fused node */
        ch.read_at[0] = i;
        ch.node[ch.n_nodes++] = i;
        /* 3 node sources go to A, B and the bias: the rest is left for the chain's inputs */
        int last = grow(nodes, n, &ch, i, CDF_NODE_MAX_SRC - 2, true, false);
        if (ch.prog.n_steps < 1 || !inputs_unchanged(nodes, &ch, 1, last)) continue;
        bool moved_ok = true; /* A, B and the bias are now read at `last` */
        for (int k = 0; k < mm->n_src && k < 3; k++)
            if (mm->src[k] && written_between(nodes, i, last, mm->src[k]->storage)) moved_ok = false;
        if (!moved_ok) continue;
        cdf_node *f = epilogue_node(mm, &ch, nodes[last]->dst);
        if (!f) continue;
        if (supports && !supports(f)) { /* a backend without epilogues: leave it to the elementwise pass */
            cdf_node_free(f);
            continue;
        }
        replace_chain(nodes, &ch, last, f, stats);
        if (stats) stats->epilogues++;
    }
    compact(nodes, n_io);
}
