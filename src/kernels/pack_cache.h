/* The prepacked-weight cache (kernels/pack_cache.c), shared by every kernel that keeps a copy of
 * a constant weight in its own layout: oneDNN's blocked reorders (fast_onednn.c) and the own
 * GEMM's bf16 panels (gemm_bf16w.c). Not a public header.
 *
 * A copy is keyed by its source address, the copy's byte size and a layout tag (bytes the kernel
 * chooses, compared exactly or with the kernel's own equality), and guarded by a checksum of
 * sampled source elements. Its lifetime is the source buffer's: the cpu backend reports every
 * free (cdf_k_pack_forget_range, cpu_backend.c), so a freed-and-reused address
 * never meets a stale copy; the checksum is the second defence, for memory the backend never
 * frees (cdf_tensor_wrap of host memory): a different weight of the same layout at the same
 * address agreeing on all sampled elements would reuse the old copy. One cap bounds all copies
 * together (CDIFFUSERS_PREPACK_MB, default 2048, 0 where AMX is usable; 0 disables prepacking); past it a kernel packs
 * per call.
 *
 * Threading: one mutex, held only for list walks and counters, never while a copy is filled or
 * used, so the backend's frees (from the host thread) never wait for a kernel. A copy in use is
 * held by a reference: a free or a clear meanwhile unlinks it and the last release frees it. */
#ifndef CDF_KERNELS_PACK_CACHE_H
#define CDF_KERNELS_PACK_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Which kernel a copy belongs to: the counters are kept per kind. */
typedef enum cdf_k_pack_kind {
    CDF_K_PACK_ONEDNN = 0, /* oneDNN's reorders into its blocked layouts (fast_onednn.c) */
    CDF_K_PACK_OWN_GEMM,   /* the own GEMM's 16-column bf16 panels (gemm_bf16w.c) */
    CDF_K_PACK_KINDS
} cdf_k_pack_kind;

typedef struct cdf_k_pack_key {
    cdf_k_pack_kind kind;
    const void *src;    /* the source weight's first element */
    size_t bytes;       /* the packed copy's size */
    const void *layout; /* layout tag: layout_size bytes describing source and packed layouts */
    size_t layout_size;
    bool (*layout_eq)(const void *a, const void *b); /* NULL: memcmp of the tags */
    uint64_t sum;       /* cdf_k_pack_checksum of the source */
} cdf_k_pack_key;

typedef struct cdf_k_pack cdf_k_pack; /* one cached copy */

/* Writes the packed copy into dst (key->bytes); false when that failed (the caller's ctx says
 * why). Runs without the cache's lock. */
typedef bool (*cdf_k_pack_fill_fn)(void *ctx, void *dst);

/* The cached copy for key, filled by fill(ctx, ...) on a miss or when the checksum shows other
 * data at the address now (the old copy is dropped: a repack). Returns the copy with *held set
 * (cdf_k_pack_release it when done), or NULL with *held = NULL when there is none: the cap leaves
 * no room, out of memory, or fill failed. */
const void *cdf_k_pack_get(const cdf_k_pack_key *key, cdf_k_pack_fill_fn fill, void *ctx, cdf_k_pack **held);
void cdf_k_pack_release(cdf_k_pack *p); /* NULL: nothing */

/* Drops the copies whose source lies in [ptr, ptr + nbytes) (nbytes 0 = the byte at ptr). */
void cdf_k_pack_forget_range(const void *ptr, size_t nbytes);
/* Drops every copy. */
void cdf_k_pack_clear(void);
/* The cap on all copies together, in bytes (0 disables caching; existing copies are kept). */
void cdf_k_pack_set_limit(size_t bytes);
size_t cdf_k_pack_limit(void);

/* FNV-1a over 64 elements (elsz bytes each) spread evenly over a rows x cols matrix whose rows
 * are ld elements apart, the first and last element included. */
uint64_t cdf_k_pack_checksum(const void *base, size_t elsz, int64_t rows, int64_t cols, int64_t ld);

typedef struct cdf_k_pack_stats {
    int64_t packs;     /* copies made and cached (repacks included) */
    int64_t repacks;   /* copies found stale (other data at a known address) and dropped */
    int64_t refreshes; /* copies made in place of a stale one (subset of packs) */
    int64_t hits;      /* lookups served from the cache */
    int64_t packed_weights, packed_bytes; /* this kind's copies now */
} cdf_k_pack_stats;
void cdf_k_pack_get_stats(cdf_k_pack_kind kind, cdf_k_pack_stats *out);
/* Zeroes kind's counters (packed_weights / packed_bytes describe the cache and stay). */
void cdf_k_pack_reset_stats(cdf_k_pack_kind kind);

#endif
