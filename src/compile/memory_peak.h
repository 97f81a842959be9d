/* compile/memory_peak — the peak of an allocation log (implemented in memory_plan.c, next to the
 * arena placement it complements). Its own header because the pipeline layer's planner includes
 * it, and memory_plan.h's cdf_memory_plan would clash with the public cdf_memory_plan type. */
#ifndef CDF_COMPILE_MEMORY_PEAK_H
#define CDF_COMPILE_MEMORY_PEAK_H

#include <stddef.h>
#include <stdint.h>

#include "exec/capture.h" /* cdf_mem_event */

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
