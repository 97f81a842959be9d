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

#include "compile/memory_peak.h"
#include "graph/node.h"

/* Place the virtual buffers nodes[0..n) and outs[0..n_out) touch (above) and move every
 * reference to them onto one arena placeholder; *arena_param receives a flat f32 view of the
 * placeholder (NULL when the graph has no buffers of its own), which the plan binds like a
 * parameter; *arena_bytes its size. Buffers that are not virtual (parameters, constants) are left
 * alone. Independent of capture: a test can build the nodes by hand (tests/test_memory_plan.c). */
cdf_status cdf_memory_plan(cdf_node **nodes, int n, cdf_tensor **outs, int n_out, size_t *arena_bytes,
                           cdf_tensor **arena_param);

#endif
