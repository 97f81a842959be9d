/* Large host buffers, kept for reuse: see core/host_memory.h.
 *
 * Kept memory is a set of address ranges, each a whole number of aligned 2 MiB units that were
 * mapped and touched before. A request takes the best-fitting range (its head; the rest stays
 * kept), a free returns its range and merges it with kept neighbours, so a freed 108 MiB
 * buffer serves later 6 or 18 MiB requests and six freed 18 MiB buffers a 108 MiB one when they
 * lie side by side. Ranges are plain pages: any aligned sub-range can be handed out, returned
 * or unmapped on its own, whichever mapping it came from. */
#include "core/host_memory.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#define HUGE_PAGE ((size_t)2 << 20)
#define SMALL_ALIGN 64
#define DEFAULT_CACHE_MB 1024
#define MAX_KEPT 256

/* AddressSanitizer must see every large free: a kept range would hide a use-after-free */
#if defined(__SANITIZE_ADDRESS__)
#define KEEP_FREED 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KEEP_FREED 0
#endif
#endif
#ifndef KEEP_FREED
#define KEEP_FREED 1
#endif

typedef struct {
    uint8_t *p;
    size_t len;
    uint64_t stamp; /* when it was last returned: the oldest go first beyond the cap */
} kept_range;

static struct {
    pthread_mutex_t mu;
    bool cap_set;
    size_t cap, total;
    uint64_t clock;
    int n;
    kept_range r[MAX_KEPT]; /* sorted by address, none adjacent (adjacent ones are merged) */
} kept = {.mu = PTHREAD_MUTEX_INITIALIZER};

static size_t small_rounded(size_t nbytes) {
    size_t sz = (nbytes + SMALL_ALIGN - 1) / SMALL_ALIGN * SMALL_ALIGN;
    return sz == 0 ? SMALL_ALIGN : sz;
}

/* A large buffer spans whole 2 MiB units (the unused tail is never touched, so never backed). */
static size_t large_len(size_t nbytes) {
    return (nbytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
}

static void cap_locked(void) {
    if (kept.cap_set) return;
    const char *env = getenv("CDIFFUSERS_HOST_CACHE_MB");
    long long mb = env && *env ? atoll(env) : DEFAULT_CACHE_MB;
    if (!(env && *env)) { /* the default is at most 1/16 of the machine's memory */
        const long pages = sysconf(_SC_PHYS_PAGES), pg = sysconf(_SC_PAGESIZE);
        if (pages > 0 && pg > 0 && (long long)pages * pg / 16 < (mb << 20)) mb = (long long)pages * pg / 16 >> 20;
    }
    kept.cap = mb > 0 ? (size_t)mb << 20 : 0;
    kept.cap_set = true;
}

static void remove_at(int i) {
    kept.total -= kept.r[i].len;
    for (int j = i; j + 1 < kept.n; j++) kept.r[j] = kept.r[j + 1];
    kept.n--;
}

static void *take_kept(size_t len) {
    uint8_t *p = NULL;
    pthread_mutex_lock(&kept.mu);
    int best = -1;
    for (int i = 0; i < kept.n; i++)
        if (kept.r[i].len >= len && (best < 0 || kept.r[i].len < kept.r[best].len)) best = i;
    if (best >= 0) {
        p = kept.r[best].p;
        if (kept.r[best].len == len) {
            remove_at(best);
        } else { /* hand out the head, keep the tail */
            kept.r[best].p += len;
            kept.r[best].len -= len;
            kept.total -= len;
        }
    }
    pthread_mutex_unlock(&kept.mu);
    return p;
}

/* Return [p, p + len) to the kept set, merged with its neighbours; whatever goes beyond the cap
 * (oldest first, or the range itself) is unmapped after the lock. */
static void keep(uint8_t *p, size_t len) {
    kept_range drop[MAX_KEPT + 1];
    int nd = 0;
    pthread_mutex_lock(&kept.mu);
    cap_locked();
    if (!KEEP_FREED || len > kept.cap) {
        drop[nd++] = (kept_range){p, len, 0};
    } else {
        int i = 0;
        while (i < kept.n && kept.r[i].p < p) i++;
        const bool join_prev = i > 0 && kept.r[i - 1].p + kept.r[i - 1].len == p;
        const bool join_next = i < kept.n && p + len == kept.r[i].p;
        const uint64_t now = ++kept.clock;
        if (join_prev && join_next) { /* r[i]'s bytes move into r[i - 1]: the total grows by len */
            kept.r[i - 1].len += len + kept.r[i].len;
            kept.r[i - 1].stamp = now;
            for (int j = i; j + 1 < kept.n; j++) kept.r[j] = kept.r[j + 1];
            kept.n--;
            kept.total += len;
        } else if (join_prev) {
            kept.r[i - 1].len += len, kept.r[i - 1].stamp = now, kept.total += len;
        } else if (join_next) {
            kept.r[i].p = p, kept.r[i].len += len, kept.r[i].stamp = now, kept.total += len;
        } else {
            if (kept.n == MAX_KEPT) { /* no slot: this range goes */
                drop[nd++] = (kept_range){p, len, 0};
                goto evict;
            }
            for (int j = kept.n; j > i; j--) kept.r[j] = kept.r[j - 1];
            kept.r[i] = (kept_range){p, len, now};
            kept.n++;
            kept.total += len;
        }
    evict:
        while (kept.total > kept.cap && kept.n > 0) {
            int old = 0;
            for (int j = 1; j < kept.n; j++)
                if (kept.r[j].stamp < kept.r[old].stamp) old = j;
            drop[nd++] = kept.r[old];
            remove_at(old);
        }
    }
    pthread_mutex_unlock(&kept.mu);
    for (int k = 0; k < nd; k++) munmap(drop[k].p, drop[k].len);
}

void cdf_host_release_kept(void) {
    for (;;) {
        pthread_mutex_lock(&kept.mu);
        if (kept.n == 0) {
            pthread_mutex_unlock(&kept.mu);
            return;
        }
        kept_range last = kept.r[kept.n - 1];
        remove_at(kept.n - 1);
        pthread_mutex_unlock(&kept.mu);
        munmap(last.p, last.len);
    }
}

bool cdf_host_keeps_freed(void) {
    return KEEP_FREED;
}

size_t cdf_host_kept_bytes(void) {
    pthread_mutex_lock(&kept.mu);
    size_t t = kept.total;
    pthread_mutex_unlock(&kept.mu);
    return t;
}

/* A fresh mapping starting on a 2 MiB boundary (over-mapped by one unit, both ends trimmed):
 * where transparent huge pages are on for every mapping ("always") the kernel can back it with
 * them. They are not requested (MADV_HUGEPAGE): on the 2-vCPU VMs measured, zeroing fresh huge
 * pages cost 3-4x the system time of 4 KiB pages under load, for no user-time gain
 * (bench/RESULTS.md "Host buffers"). */
static void *map_aligned(size_t len) {
    uint8_t *raw = mmap(NULL, len + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return NULL;
    uint8_t *p = (uint8_t *)(((uintptr_t)raw + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    if (p > raw) munmap(raw, (size_t)(p - raw));
    const size_t tail = (size_t)(raw + len + HUGE_PAGE - (p + len));
    if (tail) munmap(p + len, tail);
    return p;
}

void *cdf_host_alloc_large(size_t nbytes) {
    if (nbytes < CDF_HOST_LARGE_MIN) return aligned_alloc(SMALL_ALIGN, small_rounded(nbytes));
    if (nbytes > SIZE_MAX - 2 * HUGE_PAGE) return NULL;
    const size_t len = large_len(nbytes);
    void *p = take_kept(len);
    if (p) return p;
    p = map_aligned(len);
    if (!p && cdf_host_kept_bytes() > 0) { /* the kept ranges are what is in the way */
        cdf_host_release_kept();
        p = map_aligned(len);
    }
    return p;
}

void cdf_host_free_large(void *p, size_t nbytes) {
    if (!p) return;
    if (nbytes < CDF_HOST_LARGE_MIN) free(p);
    else keep(p, large_len(nbytes));
}
