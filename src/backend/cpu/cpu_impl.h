/* Private to the cpu backend: device addresses and the discrete test mode.
 *
 * CDIFFUSERS_CPU_DISCRETE=1 makes the cpu device behave like an accelerator with its own
 * memory, to prove without a GPU that no layer above the backend touches device memory: the
 * addresses its alloc hands out are the real ones moved by CDF_CPU_DISCRETE_TAG into the
 * non-canonical half of the x86-64 address space, so any load or store through them outside the
 * backend faults at once (SIGSEGV), while the backend's executor and transfer calls translate
 * them back (cdf_cpu_host_ptr). Off (the default), the addresses are the host ones. */
#ifndef CDF_BACKEND_CPU_IMPL_H
#define CDF_BACKEND_CPU_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cdiffusers/error.h"

#define CDF_CPU_DISCRETE_TAG ((uintptr_t)1 << 62)

extern bool cdf_cpu_discrete; /* set once at backend init */

/* Tests only (NULL otherwise): called by a stream's worker before each queued host->device copy
 * (buffer_set_async) it runs, with the copy's size. A slow hook makes a copy stream slow, so a
 * missing cross-stream wait shows as stale bytes; a failing one (status + cdf_error) makes the
 * copy fail on the device: its bytes are not written and the device's next sync reports it. Set
 * it while the device is idle. */
extern cdf_status (*cdf_cpu_copy_test_hook)(size_t nbytes);

/* The host address of a cpu device address (identity unless in discrete mode). */
static inline void *cdf_cpu_host_ptr(const void *dev_ptr) {
    if (!dev_ptr || !cdf_cpu_discrete) return (void *)dev_ptr;
    return (void *)((uintptr_t)dev_ptr - CDF_CPU_DISCRETE_TAG);
}

static inline void *cdf_cpu_device_ptr(void *host_ptr) {
    if (!host_ptr || !cdf_cpu_discrete) return host_ptr;
    return (void *)((uintptr_t)host_ptr + CDF_CPU_DISCRETE_TAG);
}

#endif
