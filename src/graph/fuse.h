/* graph/ passes over a list of op nodes (the pending graph of defer-and-fuse, or a traced
 * graph of compile). Passes rewrite the list; they never run kernels. */
#ifndef CDF_GRAPH_FUSE_H
#define CDF_GRAPH_FUSE_H

#include "graph/node.h"

typedef struct cdf_fuse_stats {
    int chains;       /* fused kernels created */
    int nodes_fused;  /* nodes absorbed into them */
    int epilogues;    /* of the chains: those folded into a matmul (cdf_fuse_matmul_epilogues) */
    int norm_heads;   /* of the chains: those headed by a LayerNorm (cdf_fuse_elementwise) */
} cdf_fuse_stats;

/* Elementwise fusion: a chain of unary/binary nodes in which each intermediate result is f32,
 * read exactly once (by the next node of the chain, elementwise) and otherwise unreachable (no
 * handle outside the node list refers to its storage) becomes one CDF_OP_FUSED node at the
 * position of the chain's last node. A cast of the chain's f32 result to bf16 (a copy node) may
 * end it: the fused node then stores bf16, rounded as the cast rounds (the bf16 input shared by
 * several bf16 matmuls, nn.h: cdf_linear_shared_input, is written once, as bf16). A LayerNorm
 * without weight or bias (f32 out, contiguous in, at most CDF_FUSE_NORM_MAX_COLS columns) may head
 * such a chain (the modulation after each DiT norm: x_ln * (1 + scale) + shift): the fused node
 * reads the norm's input and normalises it row by row as it goes (op_defs.h, norm_head), so the
 * norm's output is never stored; supports(candidate) is asked first (NULL = always), and a backend
 * that refuses keeps the norm as its own node. Rewrites nodes[0..*n) in place; absorbed nodes are
 * freed. */
void cdf_fuse_elementwise(cdf_node **nodes, int *n, bool (*supports)(const cdf_node *node), cdf_fuse_stats *stats);

/* Matmul epilogues: a matmul whose f32 product starts such a chain (read whole, elementwise, by
 * its only consumer, and otherwise unreachable) becomes one matmul node carrying the chain as its
 * epilogue program (node.h), at the chain's last position: the product is written once, into the
 * chain's destination, and each finished row is rewritten in place by the program (the same
 * scalar code as the plain kernels, so bit-identical to the unfused graph). supports(candidate)
 * is asked before a chain is replaced (the device's backend: one without epilogues refuses, and
 * the chain stays for the elementwise pass); NULL = always. Run before cdf_fuse_elementwise. */
void cdf_fuse_matmul_epilogues(cdf_node **nodes, int *n, bool (*supports)(const cdf_node *node),
                               cdf_fuse_stats *stats);

#endif
