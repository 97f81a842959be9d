/* The prepacked-weight cache shared by the fast kernels, see kernels/pack_cache.h.
 *
 * A linked list under one mutex: a lookup walks it comparing the source address first (cheap,
 * and different for nearly every entry), then the size and the layout tag. There are a few
 * hundred copies at most (the cap over weights of megabytes each), so a walk costs what the
 * two per-kernel lists it replaces cost. */
#include "kernels/pack_cache.h"

#include "core/host_memory.h"
#include "kernels/cpu_features.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

enum { CHECKSUM_SAMPLES = 64 };
#define DEFAULT_PACK_MB 2048

struct cdf_k_pack {
    struct cdf_k_pack *next;
    cdf_k_pack_kind kind;
    const void *src;
    size_t bytes;
    uint64_t sum;
    void *data;
    int refs;  /* kernels using it now */
    bool dead; /* unlinked (forgotten, stale or cleared): freed when the last user is done */
    size_t layout_size;
    max_align_t layout[]; /* the tag's bytes (aligned for whatever struct the kernel uses) */
};

static struct {
    pthread_mutex_t mu;
    size_t total; /* bytes of all linked copies, every kind */
    cdf_k_pack *list;
    cdf_k_pack_stats stats[CDF_K_PACK_KINDS];
} pc = {.mu = PTHREAD_MUTEX_INITIALIZER};
/* Linked copies: a free (every buffer the backend releases) skips the lock while there are none. */
static atomic_int pc_count;
/* The cap, read without the lock by every matmul (cdf_k_pack_limit); set from the environment
 * on first use. */
static atomic_size_t pc_limit;
static atomic_bool pc_limit_set;

static void init_locked(void) {
    if (atomic_load(&pc_limit_set)) return;
    const char *env = getenv("CDIFFUSERS_PREPACK_MB");
    /* With AMX nothing is prepacked by default: next to the AMX product a kept copy buys little
     * (steady forward: SD3.5-M 512² CFG even, FLUX width 2+4 blocks ~5% faster with copies),
     * costs more in the first forward than it saves (FLUX 3.8-4.4 s vs 2.3 s) and doubles the
     * weights' memory (peak RSS SD3.5-M 7.1 -> 5.0 GB, FLUX 5.1 -> 3.1 GB; bench/RESULTS.md). */
    const long long mb = env && *env ? atoll(env) : cdf_k_amx_usable() ? 0 : DEFAULT_PACK_MB;
    atomic_store(&pc_limit, mb > 0 ? (size_t)mb << 20 : 0);
    atomic_store(&pc_limit_set, true);
}

static void pack_free(cdf_k_pack *p) {
    cdf_host_free_large(p->data, p->bytes);
    free(p);
}

static void unlink_locked(cdf_k_pack **pp) {
    cdf_k_pack *p = *pp;
    *pp = p->next;
    p->dead = true;
    pc.total -= p->bytes;
    pc.stats[p->kind].packed_weights--;
    pc.stats[p->kind].packed_bytes -= (int64_t)p->bytes;
    atomic_fetch_sub(&pc_count, 1);
    if (p->refs == 0) pack_free(p);
}

static bool same_copy(const cdf_k_pack *p, const cdf_k_pack_key *k) {
    if (p->src != k->src || p->kind != k->kind || p->bytes != k->bytes || p->layout_size != k->layout_size)
        return false;
    return k->layout_eq ? k->layout_eq(p->layout, k->layout) : memcmp(p->layout, k->layout, k->layout_size) == 0;
}

const void *cdf_k_pack_get(const cdf_k_pack_key *key, cdf_k_pack_fill_fn fill, void *ctx, cdf_k_pack **held) {
    *held = NULL;
    if (!key || !fill || (unsigned)key->kind >= CDF_K_PACK_KINDS || key->bytes == 0) return NULL;
    cdf_k_pack_stats *st = &pc.stats[key->kind];
    bool stale = false;
    pthread_mutex_lock(&pc.mu);
    init_locked();
    for (cdf_k_pack **pp = &pc.list; *pp; pp = &(*pp)->next) {
        cdf_k_pack *p = *pp;
        if (!same_copy(p, key)) continue;
        if (p->sum == key->sum) {
            p->refs++;
            st->hits++;
            pthread_mutex_unlock(&pc.mu);
            *held = p;
            return p->data;
        }
        unlink_locked(pp); /* other data at that address now: pack afresh */
        st->repacks++;
        stale = true;
        break;
    }
    const bool fits = pc.total + key->bytes <= atomic_load(&pc_limit);
    pthread_mutex_unlock(&pc.mu);
    if (!fits) return NULL;

    /* filled outside the lock: packing a large weight must not hold up frees or other lookups */
    cdf_k_pack *p = malloc(offsetof(cdf_k_pack, layout) + key->layout_size);
    /* a copy is megabytes: from the kept large buffers (core/host_memory.h) */
    void *data = p ? cdf_host_alloc_large(key->bytes) : NULL;
    if (!data || !fill(ctx, data)) {
        cdf_host_free_large(data, key->bytes);
        free(p);
        return NULL;
    }
    p->kind = key->kind;
    p->src = key->src;
    p->bytes = key->bytes;
    p->sum = key->sum;
    p->data = data;
    p->refs = 1;
    p->dead = false;
    p->layout_size = key->layout_size;
    memcpy(p->layout, key->layout, key->layout_size);
    pthread_mutex_lock(&pc.mu);
    p->next = pc.list;
    pc.list = p;
    pc.total += p->bytes;
    atomic_fetch_add(&pc_count, 1);
    st->packs++;
    if (stale) st->refreshes++;
    st->packed_weights++;
    st->packed_bytes += (int64_t)p->bytes;
    pthread_mutex_unlock(&pc.mu);
    *held = p;
    return data;
}

void cdf_k_pack_release(cdf_k_pack *p) {
    if (!p) return;
    pthread_mutex_lock(&pc.mu);
    if (--p->refs == 0 && p->dead) pack_free(p);
    pthread_mutex_unlock(&pc.mu);
}

void cdf_k_pack_forget_range(const void *ptr, size_t nbytes) {
    if (!ptr || atomic_load(&pc_count) == 0) return;
    const char *lo = ptr;
    if (nbytes == 0) nbytes = 1;
    pthread_mutex_lock(&pc.mu);
    for (cdf_k_pack **pp = &pc.list; *pp;) {
        const char *s = (*pp)->src;
        if (s >= lo && s < lo + nbytes)
            unlink_locked(pp);
        else
            pp = &(*pp)->next;
    }
    pthread_mutex_unlock(&pc.mu);
}

void cdf_k_pack_clear(void) {
    pthread_mutex_lock(&pc.mu);
    while (pc.list) unlink_locked(&pc.list);
    pthread_mutex_unlock(&pc.mu);
}

void cdf_k_pack_set_limit(size_t bytes) {
    pthread_mutex_lock(&pc.mu);
    init_locked(); /* so the environment's value does not override this later */
    atomic_store(&pc_limit, bytes);
    pthread_mutex_unlock(&pc.mu);
}

size_t cdf_k_pack_limit(void) {
    if (!atomic_load(&pc_limit_set)) {
        pthread_mutex_lock(&pc.mu);
        init_locked();
        pthread_mutex_unlock(&pc.mu);
    }
    return atomic_load(&pc_limit);
}

uint64_t cdf_k_pack_checksum(const void *base, size_t elsz, int64_t rows, int64_t cols, int64_t ld) {
    const unsigned char *b = base;
    const int64_t n = rows * cols;
    uint64_t h = 1469598103934665603ull ^ (uint64_t)n;
    for (int i = 0; i < CHECKSUM_SAMPLES && n > 0; i++) {
        const int64_t e = (int64_t)((unsigned __int128)(n - 1) * (unsigned)i / (CHECKSUM_SAMPLES - 1));
        const unsigned char *v = b + (size_t)((e / cols) * ld + e % cols) * elsz;
        for (size_t k = 0; k < elsz; k++) h = (h ^ v[k]) * 1099511628211ull;
    }
    return h;
}

void cdf_k_pack_get_stats(cdf_k_pack_kind kind, cdf_k_pack_stats *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if ((unsigned)kind >= CDF_K_PACK_KINDS) return;
    pthread_mutex_lock(&pc.mu);
    *out = pc.stats[kind];
    pthread_mutex_unlock(&pc.mu);
}

void cdf_k_pack_reset_stats(cdf_k_pack_kind kind) {
    if ((unsigned)kind >= CDF_K_PACK_KINDS) return;
    pthread_mutex_lock(&pc.mu);
    cdf_k_pack_stats *st = &pc.stats[kind];
    *st = (cdf_k_pack_stats){.packed_weights = st->packed_weights, .packed_bytes = st->packed_bytes};
    pthread_mutex_unlock(&pc.mu);
}
