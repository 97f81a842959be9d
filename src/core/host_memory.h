/* Large host buffers on huge pages.
 *
 * The cpu device's buffers and the prepacked weight copies are megabytes to gigabytes, written
 * once right after they are allocated. glibc maps such sizes afresh at 4 KiB pages, so every
 * eager forward faulted its activations in page by page: on a 2-vCPU VM that system time was
 * as large as the kernels' own (FLUX.1 width 2+4 blocks, 512², bf16: 12-25 s per eager forward
 * with 3.7 M page faults, 6.8-7.4 s with 0.64 M on huge pages; bench/RESULTS.md "Host buffers").
 * Buffers of CDF_HOST_LARGE_MIN bytes or more get their own mapping starting on a 2 MiB
 * boundary with transparent huge pages requested (madvise: the kernel's default THP mode);
 * smaller ones come from malloc. Either way the memory is 64-byte aligned.
 *
 * Fresh pages are zeroed by the kernel on first touch, which on these VMs cost as much again
 * (clear_page was 40% of an eager forward's profile even on huge pages), so a freed large
 * buffer is kept, up to CDIFFUSERS_HOST_CACHE_MB (default 1024; 0 = keep none), for the next
 * request of the same length: an eager forward asks for the same sizes every time. The kept
 * mappings cost resident memory but no device-budget bytes (the backend accounts live
 * buffers); they are unmapped oldest first beyond the cap, and all of them before a new
 * mapping is refused. Builds with AddressSanitizer keep none. Reused memory is not zeroed:
 * device memory never promised zeros. */
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
