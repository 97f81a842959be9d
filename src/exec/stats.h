/* exec/stats — the execution counters behind cdf_exec_get_stats. */
#ifndef CDF_EXEC_STATS_H
#define CDF_EXEC_STATS_H

#include <stdatomic.h>
#include <stdint.h>

/* stats.c: the counters behind cdf_exec_get_stats (exec.c bumps them directly), and the calls
 * that bump them from capture.c and compile/. */
extern struct cdf_exec_counters {
    atomic_ullong ops, kernels, syncs, flushes, fused_kernels, fused_ops, compiles, hits, breaks, epilogues, norm_heads;
} cdf_exec_counters;
void cdf_exec_count_compile(void);
void cdf_exec_count_cache_hit(void);
void cdf_exec_count_graph_break(void);
void cdf_exec_count_kernels(uint64_t n); /* kernels a compiled graph launched */
void cdf_exec_count_fusions(uint64_t epilogues, uint64_t norm_heads); /* what a compile capture's fusion made */

#endif
