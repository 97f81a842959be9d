/* The execution counters (cdiffusers/exec.h's cdf_exec_stats): bumped by exec.c, capture.c and
 * compile/, read and reset here. In a file of their own so that capture.c can count a graph
 * break without calling back into exec.c. */
#include "exec/stats.h"

#include <stddef.h>

#include "cdiffusers/exec.h"

struct cdf_exec_counters cdf_exec_counters;

void cdf_exec_count_compile(void) { atomic_fetch_add(&cdf_exec_counters.compiles, 1); }
void cdf_exec_count_cache_hit(void) { atomic_fetch_add(&cdf_exec_counters.hits, 1); }
void cdf_exec_count_graph_break(void) { atomic_fetch_add(&cdf_exec_counters.breaks, 1); }
void cdf_exec_count_kernels(uint64_t n) { atomic_fetch_add(&cdf_exec_counters.kernels, n); }
void cdf_exec_count_fusions(uint64_t epilogues, uint64_t norm_heads) {
    atomic_fetch_add(&cdf_exec_counters.epilogues, epilogues);
    atomic_fetch_add(&cdf_exec_counters.norm_heads, norm_heads);
}

void cdf_exec_get_stats(cdf_exec_stats *o) {
    o->ops = atomic_load(&cdf_exec_counters.ops);
    o->kernels_launched = atomic_load(&cdf_exec_counters.kernels);
    o->host_syncs = atomic_load(&cdf_exec_counters.syncs);
    o->flushes = atomic_load(&cdf_exec_counters.flushes);
    o->fused_kernels = atomic_load(&cdf_exec_counters.fused_kernels);
    o->fused_ops = atomic_load(&cdf_exec_counters.fused_ops);
    o->compiles = atomic_load(&cdf_exec_counters.compiles);
    o->cache_hits = atomic_load(&cdf_exec_counters.hits);
    o->graph_breaks = atomic_load(&cdf_exec_counters.breaks);
    o->matmul_epilogues = atomic_load(&cdf_exec_counters.epilogues);
    o->fused_norms = atomic_load(&cdf_exec_counters.norm_heads);
}

void cdf_exec_reset_stats(void) {
    atomic_ullong *all[] = {&cdf_exec_counters.ops, &cdf_exec_counters.kernels, &cdf_exec_counters.syncs, &cdf_exec_counters.flushes, &cdf_exec_counters.fused_kernels, &cdf_exec_counters.fused_ops, &cdf_exec_counters.compiles, &cdf_exec_counters.hits, &cdf_exec_counters.breaks,
                           &cdf_exec_counters.epilogues, &cdf_exec_counters.norm_heads};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) atomic_store(all[i], 0);
}
