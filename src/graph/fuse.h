/* graph/ passes over a list of op nodes (the pending graph of defer-and-fuse, or a traced
 * graph of compile). Passes rewrite the list; they never run kernels. */
#ifndef CDF_GRAPH_FUSE_H
#define CDF_GRAPH_FUSE_H

#include "graph/node.h"

typedef struct cdf_fuse_stats {
    int chains;       /* fused kernels created */
    int nodes_fused;  /* nodes absorbed into them */
} cdf_fuse_stats;

/* Elementwise fusion: a chain of unary/binary nodes in which each intermediate result is f32,
 * read exactly once (by the next node of the chain, elementwise) and otherwise unreachable (no
 * handle outside the node list refers to its storage) becomes one CDF_OP_FUSED node at the
 * position of the chain's last node. Rewrites nodes[0..*n) in place; absorbed nodes are freed. */
void cdf_fuse_elementwise(cdf_node **nodes, int *n, cdf_fuse_stats *stats);

#endif
