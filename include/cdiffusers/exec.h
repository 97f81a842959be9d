/* cdiffusers — execution modes and their counters.
 *
 *  eager (default; CDIFFUSERS_EAGER_MODE=defer_never): every op is handed to its device's
 *      in-order queue at the call and runs asynchronously; the host waits only when it reads.
 *  defer-and-fuse (CDIFFUSERS_DEFER_AND_FUSE=1, or cdf_exec_set_mode): ops are recorded
 *      instead; at a sync point (a host read, cdf_device_synchronize, cdf_exec_flush, the end
 *      of a model forward, or when the pending graph reaches its size limit) the pending graph
 *      is optimised — chains of elementwise ops whose intermediates nobody else can see become
 *      one fused kernel — and executed. Results are bit-identical to eager (f32 intermediates).
 *
 * The mode is process-wide; pending graphs are per host thread. */
#ifndef CDIFFUSERS_EXEC_H
#define CDIFFUSERS_EXEC_H

#include <stdbool.h>
#include <stdint.h>

#include "cdiffusers/compile.h" /* compile: the execution mode of a whole forward */
#include "cdiffusers/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cdf_exec_mode { CDF_EXEC_EAGER = 0, CDF_EXEC_DEFER_AND_FUSE = 1 } cdf_exec_mode;

/* Switching flushes this thread's pending ops first. */
cdf_status cdf_exec_set_mode(cdf_exec_mode mode);
cdf_exec_mode cdf_exec_get_mode(void);
const char *cdf_exec_mode_name(cdf_exec_mode mode);
/* Run this thread's pending ops (defer-and-fuse); no-op in eager mode. Does not wait. */
cdf_status cdf_exec_flush(void);

typedef struct cdf_exec_stats {
    uint64_t ops;              /* op nodes created by the tensor API */
    uint64_t kernels_launched; /* nodes handed to device queues (after fusion) */
    uint64_t host_syncs;       /* host reads that waited on a device */
    uint64_t flushes;          /* pending graphs executed (defer-and-fuse) */
    uint64_t fused_kernels;    /* fused kernels created */
    uint64_t fused_ops;        /* ops absorbed into fused kernels */
    uint64_t compiles;         /* graphs compiled (compile mode) */
    uint64_t cache_hits;       /* compiled graphs reused */
    uint64_t graph_breaks;     /* forwards that could not be captured as one graph */
    uint64_t matmul_epilogues; /* elementwise chains folded into a matmul (defer-and-fuse flushes and
                                  compile captures; each also counts in fused_kernels) */
    uint64_t fused_norms;      /* fused kernels headed by a LayerNorm (the norm and its modulation in
                                  one pass; counted like matmul_epilogues, and in fused_kernels) */
} cdf_exec_stats;

void cdf_exec_get_stats(cdf_exec_stats *out);
void cdf_exec_reset_stats(void);

#ifdef __cplusplus
}
#endif
#endif
