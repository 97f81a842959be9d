/* Large host buffers, kept for reuse.
 *
 * The cpu device's buffers, the prepacked weight copies and the matmul workspaces are megabytes
 * to gigabytes. glibc maps such sizes afresh and unmaps them on free, and every fresh page is
 * zeroed by the kernel on first touch: an eager forward allocates all its activations anew, and
 * on the 2-vCPU VMs measured that zeroing (clear_page) was 40% of an eager FLUX.1-width forward's
 * profile (bench/RESULTS.md "Host buffers"). So buffers of CDF_HOST_LARGE_MIN bytes or more get
 * their own mapping (2 MiB-aligned, whole 2 MiB units), and a freed one is kept, up to
 * CDIFFUSERS_HOST_CACHE_MB (default 1024, at most 1/16 of the machine's memory; 0 keeps none),
 * for later requests: best fit, split, merged with freed neighbours (host_memory.c). Smaller
 * buffers come from malloc. Either way the memory is 64-byte aligned.
 *
 * Kept ranges cost resident memory but no device-budget bytes (the backend accounts live
 * buffers); they are unmapped oldest first beyond the cap, and all of them before a new mapping
 * is refused. Builds with AddressSanitizer keep none. Reused memory is not zeroed: device memory
 * never promised zeros. */
#ifndef CDF_CORE_HOST_MEMORY_H
#define CDF_CORE_HOST_MEMORY_H

#include <stdbool.h>
#include <stddef.h>

#define CDF_HOST_LARGE_MIN ((size_t)4 << 20)

/* NULL when the system refuses (or nbytes is 0: then a 64-byte block, never NULL for that). */
void *cdf_host_alloc_large(size_t nbytes);
/* p from cdf_host_alloc_large with the same nbytes (NULL is ignored). */
void cdf_host_free_large(void *p, size_t nbytes);
/* Unmap every kept mapping now; and the bytes kept (both for tests and memory pressure). */
void cdf_host_release_kept(void);
size_t cdf_host_kept_bytes(void);
/* false in AddressSanitizer builds, which unmap every large free at once */
bool cdf_host_keeps_freed(void);

#endif
