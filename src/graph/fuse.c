/* Elementwise fusion (see fuse.h). The fused kernel is interpreted (kernels/fused_elementwise.c),
 * so a fused chain needs no code generation: the pass is linear-ish in the pending graph and the
 * same model code yields the same chains at every denoising step. */
#include "graph/fuse.h"

#include <stdlib.h>
#include <string.h>

static bool fusible(const cdf_node *n) {
    if (!n || (n->kind != CDF_OP_UNARY && n->kind != CDF_OP_BINARY)) return false;
    return n->dst->dtype == CDF_F32 && cdf_tensor_is_contiguous(n->dst);
}

static bool reads_whole(const cdf_tensor *view, const cdf_tensor *t) {
    if (view->storage != t->storage || view->offset != t->offset || view->ndim != t->ndim) return false;
    for (int d = 0; d < t->ndim; d++)
        if (view->shape[d] != t->shape[d] || (view->shape[d] != 1 && view->strides[d] != t->strides[d])) return false;
    return true;
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

void cdf_fuse_elementwise(cdf_node **nodes, int *n_io, cdf_fuse_stats *stats) {
    int n = *n_io;
    for (int i = 0; i < n; i++) {
        if (!fusible(nodes[i])) continue;
        cdf_fused_program prog = {0};
        cdf_tensor *inputs[CDF_FUSE_MAX_INPUTS];
        int n_in = 0;
        int chain[CDF_FUSE_MAX_STEPS], n_chain = 0;
        /* head */
        cdf_node *h = nodes[i];
        inputs[n_in++] = h->src[0];
        if (h->kind == CDF_OP_UNARY) {
            prog.steps[0] = (cdf_fused_step){.binary = false, .input = -1, .op = h->p.unary.op, .p0 = h->p.unary.p0, .p1 = h->p.unary.p1};
        } else {
            inputs[n_in++] = h->src[1];
            prog.steps[0] = (cdf_fused_step){.binary = true, .input = 1, .op = h->p.binary.op};
        }
        prog.n_steps = 1;
        chain[n_chain++] = i;
        int cur = i;
        for (;;) {
            int slot = -1, j = single_consumer(nodes, n, cur, &slot);
            if (j < 0 || !fusible(nodes[j]) || prog.n_steps == CDF_FUSE_MAX_STEPS) break;
            cdf_node *c = nodes[j];
            const cdf_tensor *mid = nodes[cur]->dst;
            if (!reads_whole(c->src[slot], mid) || c->dst->ndim != mid->ndim) break;
            bool same_shape = true;
            for (int d = 0; d < mid->ndim; d++) same_shape &= c->dst->shape[d] == mid->shape[d];
            if (!same_shape || !cdf_graph_holds_only(nodes, n, NULL, 0, mid->storage, 0) /* nobody else reads it */) break;
            cdf_fused_step st = {0};
            if (c->kind == CDF_OP_UNARY) {
                st = (cdf_fused_step){.binary = false, .input = -1, .op = c->p.unary.op, .p0 = c->p.unary.p0, .p1 = c->p.unary.p1};
            } else {
                cdf_tensor *other = c->src[1 - slot];
                if (other->storage == mid->storage || n_in == CDF_FUSE_MAX_INPUTS) break;
                /* the chain must not read an operand produced later in the list than its head
                 * would run... the fused node runs at j, after every producer of `other` */
                inputs[n_in] = other;
                st = (cdf_fused_step){.binary = true, .input = (int8_t)n_in, .chain_rhs = slot == 1, .op = c->p.binary.op};
                n_in++;
            }
            prog.steps[prog.n_steps++] = st;
            chain[n_chain++] = j;
            cur = j;
        }
        if (n_chain < 2) continue;
        cdf_node *f = cdf_node_new(CDF_OP_FUSED);
        cdf_fused_program *pp = f ? malloc(sizeof *pp) : NULL;
        if (!f || !pp) {
            free(f);
            continue; /* out of memory: leave the chain unfused (still correct) */
        }
        *pp = prog;
        f->p.fused.prog = pp;
        for (int k = 0; k < n_in; k++) cdf_node_add_src(f, inputs[k]);
        f->dst = cdf_tensor_retain(nodes[cur]->dst);
        for (int k = 0; k < n_chain; k++) {
            cdf_node_free(nodes[chain[k]]);
            nodes[chain[k]] = NULL;
        }
        nodes[cur] = f;
        if (stats) {
            stats->chains++;
            stats->nodes_fused += n_chain;
        }
    }
    int w = 0;
    for (int i = 0; i < n; i++)
        if (nodes[i]) nodes[w++] = nodes[i];
    *n_io = w;
}
