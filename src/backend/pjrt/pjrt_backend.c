/* The pjrt backend: devices of a PJRT plugin (the XLA CPU and GPU plugins, Google's libtpu),
 * the values kind of backend (backend_impl.h).
 *
 * A storage's "device address" is the start of a reserved, inaccessible range of address space
 * (mmap PROT_NONE) as long as the storage: unique, so the byte offsets the layers above add to
 * it (a partial upload or read) lead back to the storage, and a fault if anything above the
 * backend dereferenced it. Behind it a slot holds what the storage is now: nothing, host bytes
 * (uploads collect there until a program reads them, then go up as one buffer of the dtype the
 * program reads), or a PJRT buffer, an immutable value that every node writing the storage
 * replaces with the program's result.
 *
 * Every node, a deferred graph and a compiled plan alike is one program (pjrt_program.h), cached
 * in memory by its text (float parameters are arguments, so a text recurs with new values) and
 * on disk (pjrt_cache.h). Execution is asynchronous: the host waits only to read. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "backend/backend_impl.h"
#include "backend/pjrt/pjrt_cache.h"
#include "backend/pjrt/pjrt_program.h"
#include "backend/pjrt/pjrt_runtime.h"
#include "core/error_internal.h"

#define MAX_REPLICAS 16

/* With replicas (one process driving R devices as the R replicas of every program: tensor
 * parallelism, cdf_device_open_replicas) a storage has a value on each device: buf[r] on
 * pjrt:r. Host bytes are the same on every replica (host) unless a replica's own bytes were set
 * (buffer_set_replica: a weight's slice): then rhost[r] holds replica r's (r >= 1; host is
 * replica 0's). Reads from above see replica 0. */
typedef struct slot {
    char *base;
    size_t nbytes;
    PJRT_Buffer *buf[MAX_REPLICAS]; /* the value on each replica's device, flat dt[n], or NULL */
    cdf_dtype dt;
    int64_t n;
    unsigned char *host;   /* host bytes not yet uploaded (nbytes), or NULL */
    unsigned char **rhost; /* replicas 1.. whose host bytes differ (MAX_REPLICAS entries), or NULL */
} slot;

#define MAX_PENDING 256 /* executions in flight before the host waits for the oldest half */

/* An asynchronous upload (kImmutableUntilTransferCompletes) in flight: the host bytes it reads,
 * owned here until every replica's done_with_host_buffer has fired, and then freed. They are
 * polled before each program (without waiting) and awaited at every sync; an upload's error is
 * the device's queued error, reported by the next sync like a failed program's. */
typedef struct transfer {
    PJRT_Event *done[MAX_REPLICAS];
    const PJRT_Buffer *buf0; /* the value it defines (replica 0's), for finish_upload_of */
    unsigned char *host, **rhost; /* freed when done (rhost: MAX_REPLICAS entries, or NULL) */
    size_t nbytes;                /* per replica */
    uint64_t seq;                 /* the process's upload number (1, 2, ...) */
} transfer;

static struct {
    pthread_mutex_t lock;
    cdf_pjrt rt;
    cdf_pjrt_found found;
    slot **slots; /* sorted by base */
    int n_slots, cap_slots;
    PJRT_Event *pending[MAX_PENDING];
    int n_pending;
    cdf_status err; /* the first queued error since the last sync */
    char err_msg[1024];
    uint64_t enqueued, completed, syncs;
    cdf_pjrt_cache *cache;
    int replicas;      /* R: every program runs as R replicas on pjrt:0..R-1 (1: on pjrt:0) */
    int want_replicas; /* asked for before the backend loaded (the CPU client's device count) */
    cdf_device *dev0;  /* pjrt:0, whose accounting (cdf_device_memory_stats) the programs' temporaries join */
    uint64_t max_temp; /* the largest compiled temporaries of a program run so far, and its name */
    char max_temp_who[96];
    struct transfer *xfers; /* asynchronous uploads in flight (their host bytes), oldest first */
    int n_xfers, cap_xfers;
    uint64_t xfer_seq; /* asynchronous uploads started so far (CDIFFUSERS_PJRT_FAULT counts them) */
    cdf_transfer_stats ts;
    PJRT_Memory *pinned[MAX_REPLICAS], *devmem[MAX_REPLICAS]; /* each replica's device's memories, or NULL */
    bool staging_checked, staging;                            /* pinned_host + CopyToMemory usable */
} g = {.lock = PTHREAD_MUTEX_INITIALIZER, .replicas = 1};

static int R(void) { return g.replicas; }

/* ---- slots' values ------------------------------------------------------------------------------ */
static void finish_upload_of(const PJRT_Buffer *b);

static void drop_bufs(slot *s) {
    /* a value whose asynchronous upload is still in flight is not destroyed under the plugin's
     * copy: the upload is finished (awaited) first */
    if (s->buf[0]) finish_upload_of(s->buf[0]);
    for (int r = 0; r < MAX_REPLICAS; r++) {
        cdf_pjrt_buffer_free(&g.rt, s->buf[r]);
        s->buf[r] = NULL;
    }
}

static void drop_host(slot *s) {
    free(s->host);
    s->host = NULL;
    if (s->rhost)
        for (int r = 0; r < MAX_REPLICAS; r++) free(s->rhost[r]);
    free(s->rhost);
    s->rhost = NULL;
}

/* replica r's host bytes (host + rhost present) */
static unsigned char *host_of(slot *s, int r) { return r > 0 && s->rhost && s->rhost[r] ? s->rhost[r] : s->host; }

static cdf_status record_error(cdf_status s);

static void free_host_set(unsigned char *host, unsigned char **rhost) {
    free(host);
    if (rhost)
        for (int r = 0; r < MAX_REPLICAS; r++) free(rhost[r]);
    free(rhost);
}

/* CDIFFUSERS_PJRT_FAULT=upload:N: the N-th asynchronous upload of the process reports a failure
 * when it completes, as a transfer the plugin failed would (a test of the error's path: the
 * CPU plugin's copies do not fail). */
static bool fault_upload(uint64_t seq) {
    const char *f = getenv("CDIFFUSERS_PJRT_FAULT");
    return f && !strncmp(f, "upload:", 7) && strtoull(f + 7, NULL, 10) == seq;
}

/* Finish transfer t (its events fired, or wait: awaited now): its error recorded, its host bytes
 * freed. Under lock. */
static void transfer_finish(transfer *t) {
    cdf_status st = CDF_OK;
    for (int r = 0; r < MAX_REPLICAS; r++) {
        if (!t->done[r]) continue;
        cdf_status e = cdf_pjrt_event_await(&g.rt, t->done[r], "pjrt: an asynchronous host-to-device upload failed");
        if (e != CDF_OK && st == CDF_OK) {
            st = e;
            record_error(CDF_ERR_DEVICE);
        }
        t->done[r] = NULL;
    }
    if (st == CDF_OK && fault_upload(t->seq)) {
        cdf_error(CDF_ERR_DEVICE, "pjrt: asynchronous host-to-device upload #%llu (%zu bytes) failed: injected by "
                                  "CDIFFUSERS_PJRT_FAULT", (unsigned long long)t->seq, t->nbytes);
        record_error(CDF_ERR_DEVICE);
    }
    free_host_set(t->host, t->rhost);
    g.ts.pending_host_bytes -= t->nbytes;
}

/* The uploads whose host bytes the plugin is done with are finished (wait: all of them, awaiting
 * each). Under lock. */
static void reap_transfers(bool wait) {
    int k = 0;
    for (int i = 0; i < g.n_xfers; i++) {
        transfer *t = &g.xfers[i];
        bool ready = wait;
        if (!ready) {
            ready = true;
            for (int r = 0; r < MAX_REPLICAS && ready; r++) ready = cdf_pjrt_event_ready(&g.rt, t->done[r]);
        }
        if (ready) transfer_finish(t);
        else g.xfers[k++] = *t;
    }
    g.n_xfers = k;
}

/* The upload that defines buffer b, if still in flight, finished now (its copy awaited) and
 * removed: b may then be destroyed. Under lock. */
static void finish_upload_of(const PJRT_Buffer *b) {
    for (int i = 0; i < g.n_xfers; i++)
        if (g.xfers[i].buf0 == b) {
            transfer_finish(&g.xfers[i]);
            memmove(&g.xfers[i], &g.xfers[i + 1], (size_t)(g.n_xfers - i - 1) * sizeof *g.xfers);
            g.n_xfers--;
            return;
        }
}

/* CDIFFUSERS_PJRT_ASYNC_UPLOADS=0: every upload waits for its copy and happens when a program
 * first reads the storage (the path before asynchronous uploads: a comparison for benchmarks, a
 * way around a plugin whose asynchronous copies misbehave). */
static bool async_uploads(void) {
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("CDIFFUSERS_PJRT_ASYNC_UPLOADS");
        on = !(e && !strcmp(e, "0"));
    }
    return on;
}

/* Replica r's buffers b[0..R) from host bytes host_of-like (bytes[r]) as dt[n], asynchronously:
 * the transfer owns host and rhost from here (freed when it completes, also on failure). Under
 * lock. */
static cdf_status upload_owned(unsigned char *host, unsigned char **rhost, cdf_dtype dt, int64_t n, PJRT_Buffer **b) {
    const size_t nbytes = (size_t)n * cdf_dtype_size(dt);
    if (!async_uploads()) {
        cdf_status st = CDF_OK;
        for (int r = 0; r < R() && st == CDF_OK; r++)
            st = cdf_pjrt_upload(&g.rt, r, r > 0 && rhost && rhost[r] ? rhost[r] : host, dt, 1, &n, &b[r]);
        if (st != CDF_OK)
            for (int r = 0; r < R(); r++) cdf_pjrt_buffer_free(&g.rt, b[r]), b[r] = NULL;
        free_host_set(host, rhost);
        return st;
    }
    if (g.n_xfers == g.cap_xfers) {
        int cap = g.cap_xfers ? 2 * g.cap_xfers : 64;
        transfer *x = realloc(g.xfers, (size_t)cap * sizeof *x);
        if (!x) {
            free_host_set(host, rhost);
            return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
        }
        g.xfers = x;
        g.cap_xfers = cap;
    }
    transfer *t = &g.xfers[g.n_xfers++];
    *t = (transfer){.host = host, .rhost = rhost, .nbytes = nbytes * (size_t)R(), .seq = ++g.xfer_seq};
    g.ts.pending_host_bytes += t->nbytes;
    cdf_status st = CDF_OK;
    for (int r = 0; r < R() && st == CDF_OK; r++) {
        const unsigned char *src = r > 0 && rhost && rhost[r] ? rhost[r] : host;
        st = cdf_pjrt_upload_async(&g.rt, r, NULL, src, dt, 1, &n, &b[r], &t->done[r]);
    }
    t->buf0 = b[0];
    g.ts.async_uploads++;
    g.ts.async_upload_bytes += t->nbytes;
    if (st != CDF_OK) {
        /* the events of the replicas that did start must fire before their bytes go */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", cdf_last_error());
        transfer_finish(t); /* before the buffers go: not under the plugin's copy */
        g.n_xfers--;
        for (int r = 0; r < R(); r++) {
            cdf_pjrt_buffer_free(&g.rt, b[r]);
            b[r] = NULL;
        }
        return cdf_error(st, "%s", msg);
    }
    return CDF_OK;
}

/* ---- slots ------------------------------------------------------------------------------------------ */

/* the slot whose range holds p (under lock) */
static slot *slot_at(const void *p, size_t *off) {
    int lo = 0, hi = g.n_slots - 1;
    const char *c = p;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        slot *s = g.slots[mid];
        if (c < s->base) hi = mid - 1;
        else if (c >= s->base + (s->nbytes ? s->nbytes : 1)) lo = mid + 1;
        else {
            if (off) *off = (size_t)(c - s->base);
            return s;
        }
    }
    return NULL;
}

static void *pjrt_alloc(cdf_device *dev, size_t nbytes) {
    (void)dev;
    slot *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    void *base = mmap(NULL, nbytes ? nbytes : 1, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) {
        free(s);
        return NULL;
    }
    s->base = base;
    s->nbytes = nbytes;
    pthread_mutex_lock(&g.lock);
    if (g.n_slots == g.cap_slots) {
        int cap = g.cap_slots ? g.cap_slots * 2 : 1024;
        slot **n = realloc(g.slots, (size_t)cap * sizeof *n);
        if (!n) {
            pthread_mutex_unlock(&g.lock);
            munmap(base, nbytes ? nbytes : 1);
            free(s);
            return NULL;
        }
        g.slots = n;
        g.cap_slots = cap;
    }
    int i = g.n_slots;
    while (i > 0 && g.slots[i - 1]->base > s->base) {
        g.slots[i] = g.slots[i - 1];
        i--;
    }
    g.slots[i] = s;
    g.n_slots++;
    pthread_mutex_unlock(&g.lock);
    return base;
}

static void pjrt_free(cdf_device *dev, void *ptr, size_t nbytes) {
    (void)dev;
    if (!ptr) return;
    pthread_mutex_lock(&g.lock);
    slot *s = slot_at(ptr, NULL);
    if (s) {
        int i = 0;
        while (g.slots[i] != s) i++;
        memmove(&g.slots[i], &g.slots[i + 1], (size_t)(g.n_slots - i - 1) * sizeof *g.slots);
        g.n_slots--;
        /* PJRT keeps the buffer alive for the executions still using it */
        drop_bufs(s);
        drop_host(s);
        munmap(s->base, nbytes ? nbytes : 1);
        free(s);
    }
    pthread_mutex_unlock(&g.lock);
}

/* the slot's bytes on the host (downloading its value; with replicas each replica's, kept
 * apart where they differ from replica 0's; under lock) */
static cdf_status slot_to_host(slot *s) {
    if (s->host) return CDF_OK;
    s->host = calloc(1, s->nbytes ? s->nbytes : 1);
    if (!s->host) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (%zu bytes)", s->nbytes);
    if (!s->buf[0]) return CDF_OK;
    size_t vb = (size_t)s->n * cdf_dtype_size(s->dt);
    cdf_status st = cdf_pjrt_download(&g.rt, s->buf[0], s->host, vb);
    for (int r = 1; r < R() && st == CDF_OK; r++) {
        if (!s->rhost && !(s->rhost = calloc(MAX_REPLICAS, sizeof *s->rhost))) {
            st = cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
            break;
        }
        if (!(s->rhost[r] = calloc(1, s->nbytes ? s->nbytes : 1))) {
            st = cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (%zu bytes)", s->nbytes);
            break;
        }
        st = cdf_pjrt_download(&g.rt, s->buf[r], s->rhost[r], vb);
        if (st == CDF_OK && !memcmp(s->rhost[r], s->host, s->nbytes)) { /* the same value: no copy kept */
            free(s->rhost[r]);
            s->rhost[r] = NULL;
        }
    }
    if (st != CDF_OK) drop_host(s);
    return st;
}

/* the slot holding [p, p + nbytes) (under lock): NULL with an error when no slot holds it all */
static slot *slot_span(const void *p, size_t nbytes, const char *what, size_t *off) {
    slot *s = slot_at(p, off);
    if (s && *off + nbytes <= s->nbytes) return s;
    cdf_error(CDF_ERR_INTERNAL, "pjrt: %s of %zu bytes outside any buffer", what, nbytes);
    return NULL;
}

static cdf_status pjrt_buffer_set(cdf_device *dev, void *dst, const void *src, size_t nbytes) {
    (void)dev;
    pthread_mutex_lock(&g.lock);
    size_t off = 0;
    slot *s = slot_span(dst, nbytes, "upload", &off);
    cdf_status st = s ? slot_to_host(s) : cdf_last_status();
    if (s) {
        if (st == CDF_OK) {
            memcpy(s->host + off, src, nbytes); /* every replica's bytes */
            if (s->rhost)
                for (int r = 1; r < MAX_REPLICAS; r++)
                    if (s->rhost[r]) memcpy(s->rhost[r] + off, src, nbytes);
            drop_bufs(s); /* the host bytes are the value now */
        }
    }
    pthread_mutex_unlock(&g.lock);
    return st;
}

/* replica r's bytes only (a weight's slice in one-process tensor parallelism) */
static cdf_status pjrt_buffer_set_replica(cdf_device *dev, int replica, void *dst, const void *src, size_t nbytes) {
    (void)dev;
    pthread_mutex_lock(&g.lock);
    cdf_status st = CDF_OK;
    size_t off = 0;
    slot *s = NULL;
    if (replica < 0 || replica >= R()) st = cdf_error(CDF_ERR_INVALID_ARG, "pjrt: replica %d of %d", replica, R());
    else if (!(s = slot_span(dst, nbytes, "upload", &off))) st = cdf_last_status();
    if (st == CDF_OK) st = slot_to_host(s);
    if (st == CDF_OK && replica > 0 && !s->rhost && !(s->rhost = calloc(MAX_REPLICAS, sizeof *s->rhost)))
        st = cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    if (st == CDF_OK && replica > 0 && !s->rhost[replica]) {
        if (!(s->rhost[replica] = malloc(s->nbytes ? s->nbytes : 1))) st = cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
        else memcpy(s->rhost[replica], s->host, s->nbytes);
    }
    if (st == CDF_OK && replica == 0 && R() > 1) {
        /* replica 0's bytes are `host`: the others keep what they had */
        if (!s->rhost && !(s->rhost = calloc(MAX_REPLICAS, sizeof *s->rhost))) st = cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
        for (int r = 1; r < R() && st == CDF_OK; r++) {
            if (s->rhost[r]) continue;
            if (!(s->rhost[r] = malloc(s->nbytes ? s->nbytes : 1))) st = cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
            else memcpy(s->rhost[r], s->host, s->nbytes);
        }
    }
    if (st == CDF_OK) {
        memcpy(host_of(s, replica) + off, src, nbytes);
        drop_bufs(s);
    }
    pthread_mutex_unlock(&g.lock);
    return st;
}

static cdf_status pjrt_buffer_get(cdf_device *dev, void *dst, const void *src, size_t nbytes) {
    (void)dev;
    pthread_mutex_lock(&g.lock);
    size_t off = 0;
    slot *s = slot_span(src, nbytes, "download", &off);
    cdf_status st = CDF_OK;
    if (!s) {
        st = cdf_last_status();
    } else if (s->host) {
        memcpy(dst, s->host + off, nbytes);
    } else if (!s->buf[0]) {
        memset(dst, 0, nbytes);
    } else { /* replica 0's value */
        size_t vb = (size_t)s->n * cdf_dtype_size(s->dt);
        if (off == 0 && nbytes == vb) {
            st = cdf_pjrt_download(&g.rt, s->buf[0], dst, nbytes);
        } else {
            unsigned char *tmp = malloc(vb ? vb : 1);
            if (!tmp) st = cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (%zu bytes)", vb);
            else st = cdf_pjrt_download(&g.rt, s->buf[0], tmp, vb);
            if (st == CDF_OK) {
                size_t avail = off < vb ? vb - off : 0;
                memcpy(dst, tmp + off, nbytes < avail ? nbytes : avail);
                if (nbytes > avail) memset((char *)dst + avail, 0, nbytes - avail);
            }
            free(tmp);
        }
    }
    pthread_mutex_unlock(&g.lock);
    return st;
}

/* ---- executables --------------------------------------------------------------------------------------- */

static cdf_status record_error(cdf_status s) {
    if (g.err == CDF_OK) {
        g.err = s;
        snprintf(g.err_msg, sizeof g.err_msg, "%s", cdf_last_error());
    }
    return s;
}

/* wait for the oldest executions (all when n_keep is 0), recording their first error */
static void drain(int n_keep) {
    if (!n_keep) reap_transfers(true);
    int n_wait = g.n_pending - n_keep;
    for (int i = 0; i < n_wait; i++) {
        if (cdf_pjrt_event_await(&g.rt, g.pending[i], "pjrt: a queued program failed") != CDF_OK) record_error(CDF_ERR_DEVICE);
        g.completed++;
    }
    memmove(g.pending, g.pending + n_wait, (size_t)n_keep * sizeof *g.pending);
    g.n_pending = n_keep;
}

/* the executable of a program text: memory, then disk, then a compile (under lock) */
static cdf_status executable_for(const cdf_pjrt_program *p, const char *who, cdf_pjrt_exe **out) {
    return cdf_pjrt_cache_get(g.cache, &g.rt, p->text, p->len, R(), who, out);
}

/* Run an executable on every replica: args[r][0..n_args) -> outs[r][0..n_out); its completion
 * events join the pending ones (under lock). */
static cdf_status execute(cdf_pjrt_exe *x, PJRT_Buffer *const *const *args, size_t n_args, PJRT_Buffer **const *outs,
                          size_t n_out) {
    PJRT_Event *done[MAX_REPLICAS];
    CDF_TRY(cdf_pjrt_execute(&g.rt, x->exe, R(), args, n_args, outs, n_out, done));
    g.enqueued++;
    for (int r = 0; r < R(); r++) {
        if (!done[r]) continue;
        if (g.n_pending == MAX_PENDING) drain(MAX_PENDING / 2);
        g.pending[g.n_pending++] = done[r];
    }
    return CDF_OK;
}

/* A storage's value as the flat dt[n] a program takes, on each replica: out[r] (under lock). */
static cdf_status slot_value(slot *s, cdf_dtype dt, int64_t n, PJRT_Buffer **out) {
    if (s->buf[0] && s->dt == dt && s->n == n) {
        for (int r = 0; r < R(); r++) out[r] = s->buf[r];
        return CDF_OK;
    }
    if (s->buf[0] && !s->host) {
        /* another dtype: the same bytes retyped by a small program (kept as the new value) */
        cdf_pjrt_program bp;
        CDF_TRY(cdf_pjrt_program_bitcast(s->dt, s->n, dt, n, &bp));
        cdf_pjrt_exe *x;
        cdf_status st = executable_for(&bp, "bitcast", &x);
        PJRT_Buffer *res[MAX_REPLICAS] = {0};
        PJRT_Buffer *const *al[MAX_REPLICAS];
        PJRT_Buffer **ol[MAX_REPLICAS];
        for (int r = 0; r < R(); r++) al[r] = &s->buf[r], ol[r] = &res[r];
        if (st == CDF_OK) st = execute(x, al, 1, ol, 1);
        cdf_pjrt_program_free(&bp);
        if (st != CDF_OK) return st;
        drop_bufs(s);
        for (int r = 0; r < R(); r++) out[r] = s->buf[r] = res[r];
        s->dt = dt;
        s->n = n;
        return CDF_OK;
    }
    /* host bytes (or nothing: zeros) go up as dt[n], each replica's to its device */
    if (!s->host) {
        s->host = calloc(1, s->nbytes ? s->nbytes : 1);
        if (!s->host) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (%zu bytes)", s->nbytes);
    }
    if ((size_t)n * cdf_dtype_size(dt) > s->nbytes)
        return cdf_error(CDF_ERR_INTERNAL, "pjrt: a %zu-byte buffer read as %lld x %s", s->nbytes, (long long)n, cdf_dtype_name(dt));
    if (cdf_pjrt_type(dt) == PJRT_Buffer_Type_INVALID) /* refused while the slot still has its bytes */
        return cdf_error(CDF_ERR_UNSUPPORTED, "pjrt: no PJRT element type for dtype %s", cdf_dtype_name(dt));
    PJRT_Buffer *b[MAX_REPLICAS] = {0};
    /* the host bytes go with the upload, which frees them once the plugin has copied them */
    unsigned char *host = s->host, **rhost = s->rhost;
    s->host = NULL;
    s->rhost = NULL;
    CDF_TRY(upload_owned(host, rhost, dt, n, b));
    drop_bufs(s);
    for (int r = 0; r < R(); r++) out[r] = s->buf[r] = b[r];
    s->dt = dt;
    s->n = n;
    return CDF_OK;
}

/* A binding of a compiled plan: storage params[j] stands for bound[j]'s */
typedef struct binding {
    cdf_tensor *const *params, *const *bound;
    int n;
} binding;

static cdf_storage *resolve(const binding *b, cdf_storage *st) {
    for (int j = 0; b && j < b->n; j++)
        if (b->params[j]->storage == st) return b->bound[j]->storage;
    return st;
}

/* The program's embedding ids that are still host bytes, each within its table: false (the
 * device's queued error set, as the cpu backend's embedding kernel reports it) if one is not. */
static bool ids_in_range(const cdf_pjrt_program *p, const binding *bind) {
    for (int c = 0; c < p->n_checks; c++) {
        const cdf_tensor *t = &p->checks[c].ids;
        cdf_storage *s = resolve(bind, t->storage);
        slot *sl = s->data ? slot_at(s->data, NULL) : NULL;
        if (!sl || (!sl->host && !sl->buf[0])) continue; /* made inside this program: XLA clamps (not checked) */
        /* ids on the device come down (a few hundred integers, once per text encoder forward) */
        if (!sl->host && slot_to_host(sl) != CDF_OK) {
            record_error(CDF_ERR_DEVICE);
            return false;
        }
        const int64_t n = cdf_shape_numel(t->ndim, t->shape);
        for (int64_t i = 0; i < n; i++) {
            int64_t off = t->offset, r = i;
            for (int d = t->ndim - 1; d >= 0; d--) {
                off += (r % t->shape[d]) * t->strides[d];
                r /= t->shape[d];
            }
            const size_t esz = cdf_dtype_size(t->dtype);
            if ((size_t)(off + 1) * esz > sl->nbytes) break;
            int64_t id = t->dtype == CDF_I64 ? ((const int64_t *)sl->host)[off] : ((const int32_t *)sl->host)[off];
            if (id < 0 || id >= p->checks[c].rows) {
                cdf_error(CDF_ERR_INVALID_ARG, "queued op 'embedding' failed: id %lld at position %lld is outside the table [0, %lld)",
                          (long long)id, (long long)i, (long long)p->checks[c].rows);
                record_error(CDF_ERR_DEVICE);
                return false;
            }
        }
    }
    return true;
}

static void fmt_bytes(char *buf, size_t n, uint64_t b) {
    if (b >= (1ull << 30)) snprintf(buf, n, "%.2f GiB", b / 1073741824.0);
    else if (b >= (1ull << 20)) snprintf(buf, n, "%.2f MiB", b / 1048576.0);
    else if (b >= 1024) snprintf(buf, n, "%.1f KiB", b / 1024.0);
    else snprintf(buf, n, "%llu B", (unsigned long long)b);
}

/* The device peak on pjrt is its live buffers (counted at their allocation, as on every
 * backend: a program's arguments and outputs among them) plus the compiled temporaries of the
 * program running (PJRT_Executable_GetCompiledMemoryStats): a program about to run raises the
 * peak to the bytes in use + its temporaries, and under a budget (--device-memory,
 * CDIFFUSERS_PJRT_MEMORY_LIMIT) one whose temporaries do not fit beside them is refused with
 * the budget's out-of-memory error before it runs. Under lock. */
static cdf_status account_temporaries(const cdf_pjrt_exe *x, const char *who) {
    cdf_device *d = g.dev0;
    if (!d || !x->temp_bytes) return CDF_OK;
    const unsigned long long limit = atomic_load(&d->limit_bytes), cur = atomic_load(&d->current_bytes);
    if (limit && (x->temp_bytes > limit || cur > limit - x->temp_bytes)) {
        char req[32], used[32], lim[32];
        fmt_bytes(req, sizeof req, x->temp_bytes);
        fmt_bytes(used, sizeof used, cur);
        fmt_bytes(lim, sizeof lim, limit);
        return cdf_error(CDF_ERR_OUT_OF_MEMORY,
                         "out of memory on %s: %s needs %s (%llu bytes) of compiled temporaries; %s of the %s budget is in "
                         "use (raise CDIFFUSERS_PJRT_MEMORY_LIMIT / --device-memory, or use --offload model)",
                         d->name, who, req, (unsigned long long)x->temp_bytes, used, lim);
    }
    unsigned long long now = cur + x->temp_bytes, peak = atomic_load(&d->peak_bytes);
    while (now > peak && !atomic_compare_exchange_weak(&d->peak_bytes, &peak, now)) {}
    if (x->temp_bytes > g.max_temp) {
        g.max_temp = x->temp_bytes;
        snprintf(g.max_temp_who, sizeof g.max_temp_who, "%s", who);
    }
    return CDF_OK;
}

/* Run a built program: its arguments from the slots (and uploaded float parameters), its results
 * the slots' new values. Under lock. */
static cdf_status run_program(const cdf_pjrt_program *p, const binding *bind, const char *who) {
    if (g.n_xfers) reap_transfers(false); /* the uploads done since: their host bytes go */
    if (!ids_in_range(p, bind)) return CDF_OK; /* reported by the next sync */
    cdf_pjrt_exe *x;
    CDF_TRY(executable_for(p, who, &x));
    if ((size_t)p->n_outs != x->n_outputs)
        return cdf_error(CDF_ERR_INTERNAL, "pjrt: %s: the program returns %zu values, %d expected", who, x->n_outputs, p->n_outs);
    const int nr = R(), na_ = p->n_args ? p->n_args : 1, no_ = p->n_outs ? p->n_outs : 1;
    PJRT_Buffer **args = calloc((size_t)(nr * na_ + nr * no_), sizeof *args), **outs = args ? args + nr * na_ : NULL;
    if (!args) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    PJRT_Buffer *const *al[MAX_REPLICAS];
    PJRT_Buffer **ol[MAX_REPLICAS];
    for (int r = 0; r < nr; r++) al[r] = args + r * na_, ol[r] = outs + r * no_;
    bool scalar[na_];
    PJRT_Buffer *col[MAX_REPLICAS];
    cdf_status st = CDF_OK;
    int na = 0;
    for (; na < p->n_args && st == CDF_OK; na++) {
        const cdf_pjrt_arg *a = &p->args[na];
        scalar[na] = a->kind == CDF_PJRT_ARG_F32;
        memset(col, 0, sizeof col);
        if (scalar[na]) {
            for (int r = 0; r < nr && st == CDF_OK; r++) st = cdf_pjrt_upload(&g.rt, r, &a->value, CDF_F32, 0, NULL, &col[r]);
        } else {
            cdf_storage *s = resolve(bind, a->st);
            slot *sl = s->data ? slot_at(s->data, NULL) : NULL;
            if (!sl) st = cdf_error(CDF_ERR_INTERNAL, "pjrt: %s: argument %d is a buffer without memory", who, na);
            else st = slot_value(sl, a->dt, a->n, col);
        }
        for (int r = 0; r < nr; r++) args[r * na_ + na] = col[r];
    }
    if (st == CDF_OK) st = account_temporaries(x, who);
    if (st == CDF_OK) {
        st = execute(x, al, (size_t)p->n_args, ol, (size_t)p->n_outs);
        if (st != CDF_OK) {
            cdf_error_prefix("%s: ", who);
        } else {
            for (int i = 0; i < p->n_outs; i++) {
                cdf_storage *s = resolve(bind, p->outs[i].st);
                slot *sl = s->data ? slot_at(s->data, NULL) : NULL;
                if (!sl) {
                    for (int r = 0; r < nr; r++) cdf_pjrt_buffer_free(&g.rt, outs[r * no_ + i]);
                    continue;
                }
                drop_bufs(sl);
                drop_host(sl);
                for (int r = 0; r < nr; r++) sl->buf[r] = outs[r * no_ + i];
                sl->dt = p->outs[i].dt;
                sl->n = p->outs[i].n;
            }
        }
    }
    for (int i = 0; i < na; i++)
        if (scalar[i])
            for (int r = 0; r < nr; r++) cdf_pjrt_buffer_free(&g.rt, args[r * na_ + i]);
    free(args);
    return st;
}

/* ---- nodes ---------------------------------------------------------------------------------------------- */

static bool never_internal(void *ctx, const cdf_storage *st) {
    (void)ctx;
    (void)st;
    return false;
}

/* all_reduce: the copy as a program, the sum over the ranks on the host (the communicator's
 * reduce), the result the storage's host bytes (under lock; bind: a compiled graph's binding) */
static cdf_status run_all_reduce(cdf_node *n, const binding *bind) {
    cdf_node copy = *n;
    copy.kind = CDF_OP_COPY;
    copy.n_src = 1;
    cdf_node *one = &copy;
    cdf_pjrt_program p;
    CDF_TRY(cdf_pjrt_program_build(&one, 1, never_internal, NULL, &p));
    cdf_status st = run_program(&p, bind, "all_reduce");
    cdf_pjrt_program_free(&p);
    if (st != CDF_OK) return st;
    const cdf_tensor *d = n->dst;
    const cdf_storage *ds = resolve(bind, d->storage);
    slot *sl = ds->data ? slot_at(ds->data, NULL) : NULL;
    if (!sl) return cdf_error(CDF_ERR_INTERNAL, "pjrt: all_reduce into a buffer without memory");
    CDF_TRY(slot_to_host(sl));
    drop_bufs(sl);
    if (!n->p.all_reduce.reduce) return cdf_error(CDF_ERR_INTERNAL, "all_reduce: node has no reduce function");
    return n->p.all_reduce.reduce(n->p.all_reduce.comm, sl->host + d->offset * (int64_t)cdf_dtype_size(d->dtype),
                                  cdf_shape_numel(d->ndim, d->shape), d->dtype);
}

/* An all_reduce summed on the host between programs (over processes: MPI); one over this
 * device's replicas is an op of the program like any other. */
static bool host_reduce(const cdf_node *n) { return n->kind == CDF_OP_ALL_REDUCE && n->p.all_reduce.replicas < 2; }

/* nodes[0..n) against this device's replicas: an all_reduce over another count is refused */
static cdf_status check_replicas(cdf_node *const *nodes, int n) {
    for (int i = 0; i < n; i++)
        if (nodes[i]->kind == CDF_OP_ALL_REDUCE && nodes[i]->p.all_reduce.replicas > 1 && nodes[i]->p.all_reduce.replicas != R())
            return cdf_error(CDF_ERR_INVALID_ARG, "pjrt: an all_reduce over %d replicas on a device running %d",
                             nodes[i]->p.all_reduce.replicas, R());
    return CDF_OK;
}

static cdf_status pjrt_enqueue(cdf_device *dev, cdf_node *node) {
    (void)dev;
    pthread_mutex_lock(&g.lock);
    cdf_status st;
    if (g.err != CDF_OK) {
        st = CDF_OK; /* skipped after an error, reported by the next sync */
    } else if ((st = check_replicas(&node, 1)) != CDF_OK) {
    } else if (host_reduce(node)) {
        st = run_all_reduce(node, NULL);
    } else {
        cdf_pjrt_program p;
        st = cdf_pjrt_program_build(&node, 1, never_internal, NULL, &p);
        if (st == CDF_OK) st = run_program(&p, NULL, cdf_op_name(node->kind));
        cdf_pjrt_program_free(&p);
    }
    pthread_mutex_unlock(&g.lock);
    cdf_node_free(node);
    return st;
}

/* ---- deferred graphs and compiled plans ------------------------------------------------------------------- */

typedef struct graph_ctx {
    cdf_node *const *nodes;
    int n;
    cdf_tensor *const *params;
    int n_params;
} graph_ctx;

/* a compiled plan: buffers without memory are its own; a deferred graph: also what only its
 * nodes hold */
static bool graph_internal(void *ctx, const cdf_storage *st) {
    const graph_ctx *c = ctx;
    for (int j = 0; j < c->n_params; j++)
        if (c->params[j]->storage == st) return false;
    if (st->is_virtual || !st->data) return true;
    return !c->params && cdf_graph_holds_only(c->nodes, c->n, NULL, 0, st, 0);
}

static cdf_status pjrt_run_nodes(cdf_device *dev, cdf_node **nodes, int n) {
    (void)dev;
    pthread_mutex_lock(&g.lock);
    cdf_status st = check_replicas(nodes, n);
    if (g.err == CDF_OK && st == CDF_OK) {
        /* an all_reduce on the host: the nodes around it are programs of their own */
        int i = 0;
        while (i < n && st == CDF_OK) {
            int j = i;
            while (j < n && !host_reduce(nodes[j])) j++;
            if (j > i) {
                graph_ctx c = {.nodes = nodes + i, .n = j - i};
                cdf_pjrt_program p;
                st = cdf_pjrt_program_build(nodes + i, j - i, graph_internal, &c, &p);
                if (st == CDF_OK) st = run_program(&p, NULL, "deferred ops");
                cdf_pjrt_program_free(&p);
            }
            if (j < n && st == CDF_OK) st = run_all_reduce(nodes[j], NULL);
            i = j + 1;
        }
    }
    pthread_mutex_unlock(&g.lock);
    for (int i = 0; i < n; i++) cdf_node_free(nodes[i]);
    return st;
}

/* A compiled plan: programs between its all_reduce nodes (the sums run on the host between
 * them, as in eager mode), each a segment. */
typedef struct pjrt_segment {
    cdf_pjrt_program prog; /* when all_reduce is NULL */
    cdf_node *all_reduce;  /* the plan's node (the plan owns it) */
} pjrt_segment;

typedef struct pjrt_graph {
    pjrt_segment *seg;
    int n_seg;
    cdf_tensor **params; /* a copy of the plan's array (the tensors stay the plan's) */
    int n_params;
    char who[128]; /* the compiled component, for messages */
} pjrt_graph;

static void pjrt_graph_free(cdf_device *dev, void *graph) {
    (void)dev;
    pjrt_graph *gr = graph;
    if (!gr) return;
    for (int i = 0; i < gr->n_seg; i++) cdf_pjrt_program_free(&gr->seg[i].prog);
    free(gr->seg);
    free(gr->params);
    free(gr);
}

/* With all_reduce nodes, a value that crosses from one segment to another leaves its program:
 * a buffer of the capture (no memory yet) used on both sides gets memory of its own. */
static cdf_status materialize_crossing(cdf_node *const *nodes, int n) {
    for (int i = 0; i < n; i++) {
        for (int k = -1; k < nodes[i]->n_src; k++) {
            cdf_storage *st = k < 0 ? nodes[i]->dst->storage : nodes[i]->src[k] ? nodes[i]->src[k]->storage : NULL;
            if (!st || !st->is_virtual) continue;
            int seg_i = 0, seg_j = 0; /* segment of node i, and of each other user */
            for (int j = 0; j < i; j++) seg_i += host_reduce(nodes[j]);
            bool crosses = host_reduce(nodes[i]);
            for (int j = 0; j < n && !crosses; j++) {
                if (j) seg_j += host_reduce(nodes[j - 1]);
                bool uses = nodes[j]->dst->storage == st;
                for (int m = 0; m < nodes[j]->n_src; m++) uses |= nodes[j]->src[m] && nodes[j]->src[m]->storage == st;
                crosses = uses && (seg_j != seg_i || host_reduce(nodes[j]));
            }
            if (crosses) CDF_TRY(cdf_storage_materialize(st));
        }
    }
    return CDF_OK;
}

static void *pjrt_graph_instantiate(cdf_device *dev, cdf_node *const *nodes, int n, cdf_tensor *const *params,
                                    int n_params, const char *who) {
    (void)dev;
    if (check_replicas(nodes, n) != CDF_OK) return NULL;
    int n_ar = 0;
    for (int i = 0; i < n; i++) n_ar += host_reduce(nodes[i]);
    pjrt_graph *gr = calloc(1, sizeof *gr);
    if (gr) gr->seg = calloc((size_t)(2 * n_ar + 1), sizeof *gr->seg);
    if (gr && gr->seg) gr->params = malloc(sizeof *gr->params * (size_t)(n_params ? n_params : 1));
    if (!gr || !gr->seg || !gr->params) {
        pjrt_graph_free(dev, gr);
        cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
        return NULL;
    }
    memcpy(gr->params, params, sizeof *gr->params * (size_t)n_params);
    gr->n_params = n_params;
    snprintf(gr->who, sizeof gr->who, "%s", who && *who ? who : "a compiled graph");
    cdf_status st = n_ar ? materialize_crossing(nodes, n) : CDF_OK;
    for (int i = 0; i < n && st == CDF_OK;) {
        int j = i;
        while (j < n && !host_reduce(nodes[j])) j++;
        if (j > i) {
            graph_ctx c = {.nodes = nodes + i, .n = j - i, .params = params, .n_params = n_params};
            st = cdf_pjrt_program_build(nodes + i, j - i, graph_internal, &c, &gr->seg[gr->n_seg++].prog);
        }
        if (j < n) gr->seg[gr->n_seg++].all_reduce = nodes[j];
        i = j + 1;
    }
    if (st != CDF_OK) {
        cdf_error_prefix("%s: ", gr->who);
        pjrt_graph_free(dev, gr);
        return NULL;
    }
    return gr;
}

static cdf_status pjrt_graph_launch(cdf_device *dev, void *graph, cdf_tensor *const *bound) {
    (void)dev;
    pjrt_graph *gr = graph;
    for (int j = 0; j < gr->n_params; j++)
        if (bound[j]->offset != gr->params[j]->offset || bound[j]->storage->nbytes != gr->params[j]->storage->nbytes)
            return cdf_error(CDF_ERR_UNSUPPORTED,
                             "pjrt: a compiled graph bound to a buffer laid out unlike its parameter %d (offset %lld, %zu "
                             "bytes; traced %lld, %zu)", j, (long long)bound[j]->offset, bound[j]->storage->nbytes,
                             (long long)gr->params[j]->offset, gr->params[j]->storage->nbytes);
    binding b = {.params = gr->params, .bound = bound, .n = gr->n_params};
    pthread_mutex_lock(&g.lock);
    cdf_status st = CDF_OK;
    for (int i = 0; i < gr->n_seg && st == CDF_OK && g.err == CDF_OK; i++)
        st = gr->seg[i].all_reduce ? run_all_reduce(gr->seg[i].all_reduce, &b) : run_program(&gr->seg[i].prog, &b, gr->who);
    pthread_mutex_unlock(&g.lock);
    return st;
}

/* ---- queue ------------------------------------------------------------------------------------------------- */

static cdf_status pjrt_synchronize(cdf_device *dev) {
    (void)dev;
    pthread_mutex_lock(&g.lock);
    drain(0);
    g.syncs++;
    cdf_status st = g.err;
    if (st != CDF_OK) {
        cdf_error(st, "%s", g.err_msg);
        g.err = CDF_OK;
    }
    pthread_mutex_unlock(&g.lock);
    return st;
}

static void pjrt_wait_idle(cdf_device *dev) {
    (void)dev;
    pthread_mutex_lock(&g.lock);
    drain(0);
    pthread_mutex_unlock(&g.lock);
}

/* ---- whole values, host-staged weights --------------------------------------------------------------- */

/* The whole storage as dt's elements, its upload started now (every replica). */
static cdf_status pjrt_buffer_set_value(cdf_device *dev, void *dst, void *src, size_t nbytes, cdf_dtype dt) {
    (void)dev;
    pthread_mutex_lock(&g.lock);
    size_t off = 0;
    slot *s = slot_span(dst, nbytes, "upload", &off);
    cdf_status st = s ? CDF_OK : cdf_last_status();
    const size_t dsz = cdf_dtype_size(dt);
    if (st == CDF_OK && (off || nbytes != s->nbytes || nbytes % dsz || !nbytes || !async_uploads() ||
                         cdf_pjrt_type(dt) == PJRT_Buffer_Type_INVALID)) {
        /* not a whole storage (or uploads at first read): as buffer_set (into its host bytes) */
        pthread_mutex_unlock(&g.lock);
        st = pjrt_buffer_set(dev, dst, src, nbytes);
        free(src);
        return st;
    }
    if (st == CDF_OK) {
        if (g.n_xfers) reap_transfers(false);
        PJRT_Buffer *b[MAX_REPLICAS] = {0};
        const int64_t n = (int64_t)(nbytes / dsz);
        st = upload_owned(src, NULL, dt, n, b);
        src = NULL;
        if (st == CDF_OK) {
            drop_bufs(s);
            drop_host(s);
            for (int r = 0; r < R(); r++) s->buf[r] = b[r];
            s->dt = dt;
            s->n = n;
        }
    }
    free(src);
    pthread_mutex_unlock(&g.lock);
    return st;
}

/* A value kept in each replica's device's pinned_host memory (PJRT_Client_BufferFromHostBuffer
 * into that memory, once), copied to device memory on demand (PJRT_Buffer_CopyToMemory). */
typedef struct staged {
    PJRT_Buffer *buf[MAX_REPLICAS];
    cdf_dtype dt;
    int64_t n;
    size_t nbytes;
    int replicas;
} staged;

/* Whether every replica's device has pinned_host and the plugin has CopyToMemory (under lock;
 * asked once). */
static bool staging_usable(void) {
    if (g.staging_checked) return g.staging;
    g.staging_checked = true;
    g.staging = cdf_pjrt_has_copy_to_memory(&g.rt);
    for (int r = 0; r < R() && g.staging; r++) {
        g.pinned[r] = cdf_pjrt_memory_of_kind(&g.rt, r, "pinned_host");
        g.devmem[r] = cdf_pjrt_memory_of_kind(&g.rt, r, "device");
        g.staging = g.pinned[r] && g.devmem[r];
    }
    if (cdf_pjrt_log_on())
        fprintf(stderr, "cdiffusers: pjrt: host-staged weights: %s\n",
                g.staging ? "in pinned_host memory, copied to device memory per use (PJRT_Buffer_CopyToMemory)"
                          : "none (the plugin lacks pinned_host memory or PJRT_Buffer_CopyToMemory): uploads from host bytes");
    return g.staging;
}

static void *pjrt_staged_new(cdf_device *dev, const void *src, cdf_dtype src_dt, cdf_dtype dt, size_t n_elems) {
    (void)dev;
    const size_t dsz = cdf_dtype_size(dt), nbytes = n_elems * dsz;
    if (!n_elems) {
        cdf_error(CDF_ERR_UNSUPPORTED, "pjrt: an empty value staged");
        return NULL;
    }
    pthread_mutex_lock(&g.lock);
    const bool usable = staging_usable();
    pthread_mutex_unlock(&g.lock);
    if (!usable) {
        cdf_error(CDF_ERR_UNSUPPORTED, "pjrt: the plugin has no pinned_host memory to stage weights in");
        return NULL;
    }
    /* converted outside the lock (the programs queued go on meanwhile) */
    void *conv = NULL;
    if (src_dt != dt) {
        if (!(conv = malloc(nbytes))) {
            cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (%zu bytes)", nbytes);
            return NULL;
        }
        cdf_convert(conv, dt, src, src_dt, n_elems);
        src = conv;
    }
    pthread_mutex_lock(&g.lock);
    staged *h = calloc(1, sizeof *h);
    if (!h) {
        cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory");
    } else {
        *h = (staged){.dt = dt, .n = (int64_t)(nbytes / dsz), .nbytes = nbytes, .replicas = R()};
        cdf_status st = CDF_OK;
        for (int r = 0; r < R() && st == CDF_OK; r++) {
            PJRT_Event *done = NULL;
            st = cdf_pjrt_upload_async(&g.rt, r, g.pinned[r], src, dt, 1, &h->n, &h->buf[r], &done);
            /* src is the caller's until this returns: the copy into pinned_host waits here (once
             * per weight, at the block's first call) */
            cdf_status e = cdf_pjrt_event_await(&g.rt, done, "pjrt: a copy into pinned_host memory");
            if (st == CDF_OK) st = e;
        }
        if (st != CDF_OK) {
            for (int r = 0; r < MAX_REPLICAS; r++) cdf_pjrt_buffer_free(&g.rt, h->buf[r]);
            free(h);
            h = NULL;
        } else {
            g.ts.staged++;
            g.ts.staged_made++;
            g.ts.staged_bytes += nbytes * (size_t)R();
        }
    }
    pthread_mutex_unlock(&g.lock);
    free(conv);
    return h;
}

static cdf_status pjrt_staged_to_device(cdf_device *dev, void *handle, void *dst, size_t nbytes) {
    (void)dev;
    staged *h = handle;
    pthread_mutex_lock(&g.lock);
    size_t off = 0;
    slot *s = slot_span(dst, nbytes, "staged copy", &off);
    cdf_status st = s ? CDF_OK : cdf_last_status();
    if (st == CDF_OK && (off || nbytes != s->nbytes || nbytes != h->nbytes || h->replicas != R()))
        st = cdf_error(CDF_ERR_INTERNAL, "pjrt: a %zu-byte staged value into %zu bytes at %zu of a %zu-byte buffer (%d / %d replicas)",
                       h->nbytes, nbytes, off, s->nbytes, h->replicas, R());
    PJRT_Buffer *b[MAX_REPLICAS] = {0};
    for (int r = 0; r < R() && st == CDF_OK; r++) st = cdf_pjrt_copy_to_memory(&g.rt, h->buf[r], g.devmem[r], &b[r]);
    if (st == CDF_OK) {
        drop_bufs(s);
        drop_host(s);
        for (int r = 0; r < R(); r++) s->buf[r] = b[r];
        s->dt = h->dt;
        s->n = h->n;
        g.ts.staged_copies++;
        g.ts.staged_copy_bytes += nbytes * (size_t)R();
    } else {
        for (int r = 0; r < R(); r++) cdf_pjrt_buffer_free(&g.rt, b[r]);
    }
    pthread_mutex_unlock(&g.lock);
    return st;
}

static void pjrt_staged_free(cdf_device *dev, void *handle) {
    (void)dev;
    staged *h = handle;
    if (!h) return;
    pthread_mutex_lock(&g.lock);
    /* PJRT keeps the buffer alive for the copies still reading it */
    for (int r = 0; r < MAX_REPLICAS; r++) cdf_pjrt_buffer_free(&g.rt, h->buf[r]);
    g.ts.staged--;
    g.ts.staged_bytes -= h->nbytes * (size_t)h->replicas;
    pthread_mutex_unlock(&g.lock);
    free(h);
}

static void pjrt_transfer_stats(const cdf_device *dev, cdf_transfer_stats *out) {
    (void)dev;
    pthread_mutex_lock(&g.lock);
    *out = g.ts;
    pthread_mutex_unlock(&g.lock);
}

static uint64_t pjrt_event_record(cdf_device *dev) {
    (void)dev;
    return 0;
}

static void pjrt_event_synchronize(cdf_device *dev, uint64_t ev) {
    (void)ev;
    pjrt_wait_idle(dev);
}

static bool pjrt_host_visible(const cdf_device *dev) {
    (void)dev;
    return false;
}

static bool pjrt_supports(cdf_device *dev, const cdf_node *node) {
    (void)dev;
    return node->kind == CDF_OP_ALL_REDUCE || cdf_pjrt_program_supports(node);
}

static void pjrt_set_threads(cdf_device *dev, int n) {
    (void)dev;
    (void)n;
}

static void pjrt_queue_stats(const cdf_device *dev, cdf_queue_stats *out) {
    (void)dev;
    out->enqueued = g.enqueued;
    out->completed = g.completed;
    out->syncs = g.syncs;
}

static void pjrt_device_info(const cdf_device *dev, cdf_device_info *out) {
    char kind[64], mem[128];
    cdf_pjrt_device_describe(&g.rt, dev->index, kind, sizeof kind, mem, sizeof mem);
    snprintf(out->description, sizeof out->description, "%.40s, platform %.24s %.40s (%.40s)", kind, g.rt.platform,
             g.rt.platform_version, g.found.package);
    snprintf(out->features, sizeof out->features, "pjrt_api=%d.%d stablehlo=%s memories=%s", g.rt.api_major, g.rt.api_minor,
             g.rt.stablehlo_version[0] ? g.rt.stablehlo_version : "?", mem);
    out->memory_bytes = 0;
}

/* CDIFFUSERS_LOG=pjrt: what the program cache did in this process, at exit (the cross-process
 * cache test reads "0 compiled") */
static void log_cache_at_exit(void) {
    cdf_pjrt_cache_stats st;
    cdf_pjrt_cache_get_stats(g.cache, &st);
    fprintf(stderr, "cdiffusers: pjrt: programs: %llu compiled, %llu loaded from the disk cache, %llu from memory; "
                    "%.2f s compiling, %.2f s loading; %llu written to %s, %llu cache errors\n",
            (unsigned long long)st.compiles, (unsigned long long)st.disk_hits, (unsigned long long)st.memory_hits,
            st.compile_seconds, st.load_seconds,
            (unsigned long long)st.disk_writes, cdf_pjrt_cache_dir(g.cache)[0] ? cdf_pjrt_cache_dir(g.cache) : "(no disk cache)",
            (unsigned long long)st.disk_errors);
    {
        char a[32], p[32], c[32];
        fmt_bytes(a, sizeof a, g.ts.async_upload_bytes);
        fmt_bytes(p, sizeof p, g.ts.staged_bytes);
        fmt_bytes(c, sizeof c, g.ts.staged_copy_bytes);
        fprintf(stderr, "cdiffusers: pjrt: uploads: %llu asynchronous (%s); pinned_host: %llu copies to the device (%s), %llu "
                        "weights staged at exit (%s of host memory)\n", (unsigned long long)g.ts.async_uploads, a,
                (unsigned long long)g.ts.staged_copies, c, (unsigned long long)g.ts.staged, p);
    }
    if (g.max_temp) {
        char b[32];
        fmt_bytes(b, sizeof b, g.max_temp);
        fprintf(stderr, "cdiffusers: pjrt: the largest compiled temporaries: %s (%s), counted in the device peak\n", b,
                g.max_temp_who);
    }
}

/* ---- init ---------------------------------------------------------------------------------------------------- */

static cdf_status pjrt_init(int *n_devices, const char **why) {
    *n_devices = 0;
    cdf_status s = cdf_pjrt_choose_plugin(&g.found);
    if (s != CDF_OK) {
        *why = "no PJRT plugin found (CDIFFUSERS_PJRT_PLUGIN, or scripts/install-deps.sh for the CPU plugin)";
        return s;
    }
    s = cdf_pjrt_open(g.found.path, &g.rt);
    /* the CPU client's device count: 1, or the replicas asked for (--tp N) */
    if (s == CDF_OK) s = cdf_pjrt_client_create(&g.rt, g.want_replicas > 1 ? g.want_replicas : 1);
    if (s != CDF_OK) return s;
    s = cdf_pjrt_cache_open(&g.cache, &g.rt);
    if (s != CDF_OK) return s;
    for (int i = 0; i < g.rt.n_devices; i++) {
        cdf_device *d = cdf_backend_add_device(&cdf_pjrt_backend_iface, i, NULL);
        if (!d) break;
        if (i == 0) g.dev0 = d;
        (*n_devices)++;
    }
    if (cdf_pjrt_log_on()) atexit(log_cache_at_exit);
    if (cdf_pjrt_log_on())
        fprintf(stderr, "cdiffusers: pjrt: %s (%s %s, PJRT API %d.%d, StableHLO %s): %d device(s)\n", g.rt.path, g.rt.platform,
                g.rt.platform_version, g.rt.api_major, g.rt.api_minor, g.rt.stablehlo_version, g.rt.n_devices);
    if (!*n_devices) *why = "the plugin has no addressable device";
    return CDF_OK;
}

/* One process, R devices: every program from now on runs as R replicas on pjrt:0..R-1 (dev
 * NULL: asked before the backend loads; the CPU client is then created with R devices). */
static cdf_status pjrt_set_replicas(cdf_device *dev, int n) {
    if (n < 1 || n > MAX_REPLICAS)
        return cdf_error(CDF_ERR_INVALID_ARG, "pjrt: %d replicas (one process drives 1 to %d devices)", n, MAX_REPLICAS);
    if (!dev) {
        g.want_replicas = n;
        return CDF_OK;
    }
    pthread_mutex_lock(&g.lock);
    cdf_status st = CDF_OK;
    if (n == g.replicas) {
    } else if (g.rt.n_devices < n) {
        char hint[256] = "";
        if (g.rt.is_cpu)
            snprintf(hint, sizeof hint, " (the CPU plugin's client was created with %d: %s)", g.rt.n_devices,
                     g.want_replicas == n ? "CDIFFUSERS_PJRT_OPTIONS sets cpu_device_count" : "the backend was opened before");
        st = cdf_error(CDF_ERR_INVALID_ARG, "tensor parallelism over %d pjrt devices in one process: the plugin %s has %d device(s)%s",
                       n, g.rt.path, g.rt.n_devices, hint);
    } else if (g.n_slots) {
        st = cdf_error(CDF_ERR_INVALID_ARG, "pjrt: %d replicas asked for while %d buffers exist on pjrt (ask before loading anything)",
                       n, g.n_slots);
    } else {
        g.replicas = n;
        if (cdf_pjrt_log_on())
            fprintf(stderr, "cdiffusers: pjrt: one process over pjrt:0..%d: every program runs as %d replicas (num_replicas=%d), "
                            "all_reduce inside the programs (stablehlo.all_reduce)\n", n - 1, n, n);
    }
    pthread_mutex_unlock(&g.lock);
    return st;
}

static int pjrt_replicas(const cdf_device *dev) {
    (void)dev;
    return g.replicas;
}

const cdf_backend_iface cdf_pjrt_backend_iface = {
    .name = "pjrt", .values = true, .lazy = true, CDF_BACKEND_IFACE_CORE(pjrt), .run_nodes = pjrt_run_nodes,
    .device_info = pjrt_device_info, .graph_instantiate = pjrt_graph_instantiate, .graph_launch = pjrt_graph_launch,
    .graph_free = pjrt_graph_free, .set_replicas = pjrt_set_replicas, .replicas = pjrt_replicas,
    .buffer_set_replica = pjrt_buffer_set_replica, .buffer_set_value = pjrt_buffer_set_value,
    .staged_new = pjrt_staged_new, .staged_to_device = pjrt_staged_to_device, .staged_free = pjrt_staged_free,
    .transfer_stats = pjrt_transfer_stats};
