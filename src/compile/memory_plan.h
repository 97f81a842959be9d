/* compile/memory_plan — where a compiled graph's buffers live.
 * Every buffer the capture created is virtual. Each one the plan uses gets a slot in one arena:
 * its lifetime is [first node that touches it, last node that touches it] (outputs live to the
 * end: they are copied out after the graph); slots are placed largest first at the lowest offset
 * that does not collide with a slot whose lifetime overlaps. Buffers whose lifetimes do not
 * overlap share memory, so a replay needs about the live set of the forward, not its sum.
 *
 * The arena is not kept with the plan: every reference to a slot becomes a view on one
 * placeholder buffer without memory, which each replay binds to an arena allocated for that
 * replay (like the parameters, see bind_node). The arena is freed when the replay's last kernel
 * has run, so a graph holds device memory only while it runs — graphs of different shapes and
 * block classes do not each keep one, and nothing outlives the forward (as eager execution). */
#ifndef CDF_EXEC_MEMORY_PLAN_H
#define CDF_EXEC_MEMORY_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "exec/capture.h" /* cdf_mem_event */
#include "graph/node.h"

/* Place the virtual buffers nodes[0..n) and outs[0..n_out) touch (above) and move every
 * reference to them onto one arena placeholder; *arena_param receives a flat f32 view of the
 * placeholder (NULL when the graph has no buffers of its own), which the plan binds like a
 * parameter; *arena_bytes its size. Buffers that are not virtual (parameters, constants) are left
 * alone. Independent of capture: a test can build the nodes by hand (tests/test_memory_plan.c). */
cdf_status cdf_memory_plan(cdf_node **nodes, int n, cdf_tensor **outs, int n_out, size_t *arena_bytes,
                           cdf_tensor **arena_param);

/* ---- the peak of an allocation log ----------------------------------------------------------
 * What a forward holds at its busiest point, from the order in which its buffers were allocated
 * and released (the planner records such a log by running the forward over virtual buffers: see
 * exec/capture.h, cdf_measure_begin). Live bytes rise by an ALLOC's size and fall by the size its
 * id was allocated with at the matching RELEASE; the peak is the largest live total after any
 * ALLOC. Ids are any 64-bit values and may be reused once released. Pure: no device, no nodes. */

/* *peak: the largest live total; *live_at_end (may be NULL): bytes still live after the last
 * event (buffers the forward returns); tag_peaks (may be NULL; CDF_MEM_TAGS entries): per tag,
 * the largest live total right after an ALLOC with that tag (0 for a tag no ALLOC has). A
 * RELEASE of an id that is not live, an ALLOC of one that is, or a tag out of range is
 * CDF_ERR_INVALID_ARG naming the event's index (the log is broken). */
cdf_status cdf_memory_peak(const cdf_mem_event *ev, size_t n, uint64_t *peak, uint64_t *live_at_end, uint64_t *tag_peaks);

#endif
