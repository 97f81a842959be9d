/* The cpu backend: host memory, and in-order asynchronous streams each served by its own worker
 * thread: the compute stream (every op; kernels parallelise internally with OpenMP on its
 * worker, so the host thread is free to keep issuing ops while the device computes: the
 * TPU/CUDA stream model) and, on request, copy streams whose workers run transfers beside the
 * compute (sequential offload's prefetch). Streams are joined by events: a stream waiting for
 * another's event holds a wait item that its worker blocks on only when it reaches it. With
 * CDIFFUSERS_CPU_DISCRETE=1 its memory is not addressable from above the backend (cpu_impl.h). */
#include <omp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <strings.h>

#include "backend/backend_impl.h"
#include "backend/cpu/cpu_impl.h"
#include "core/error_internal.h"
#include "core/host_memory.h"
#include "kernels/cpu_features.h"
#include "kernels/fast_onednn.h"
#include "kernels/pack_cache.h"

bool cdf_cpu_discrete;
cdf_status (*cdf_cpu_copy_test_hook)(size_t nbytes);

#define CPU_QUEUE_CAP 512 /* pending items per stream before enqueue blocks */
/* How far the host may run ahead in bytes: the outputs of the ops queued and not yet finished.
 * Each pending op holds an output buffer the host allocated at the call, so a host 512 ops
 * ahead held about half a forward's activations more than the device was working on: in eager
 * mode the SD3.5-Medium forward (512² CFG) peaked at 12.3 GB instead of 8.4 and, as those
 * buffers outgrew the kept host memory (core/host_memory.c) and were mapped afresh, ran at
 * 20-22 s instead of 15 (page faults: 61 s of system time in 4 forwards; bench/RESULTS.md
 * "Modes"). A few ops ahead are all the worker needs to never wait for the host (an op runs
 * for milliseconds, issuing it takes microseconds). CDIFFUSERS_CPU_QUEUE_MB overrides. */
#define CPU_AHEAD_BYTES_DEFAULT ((size_t)256 << 20)
#define CPU_AHEAD_MIN_ITEMS 2 /* queued whatever their size: one runs while the next is ready */
#define CPU_MAX_STREAMS 8 /* copy streams per device */

/* One queued item: a node to execute, a function to call on the worker in stream order (a
 * transfer, a graph launch), or (neither) a wait until stream wait_stream has completed
 * wait_mark items. A function runs even after an earlier error (to release what it holds) with
 * skip set; a failure returns its status with a message in msg. */
typedef struct cpu_item {
    cdf_node *node;
    cdf_status (*fn)(void *ctx, bool skip, char *msg, size_t cap);
    void *ctx;
    uint64_t wait_stream, wait_mark;
    size_t bytes; /* the node's output storage: counted against the run-ahead bound */
} cpu_item;

struct cpu_device;

/* An in-order stream: a ring of items its worker runs one after the other. */
typedef struct cpu_stream {
    struct cpu_device *dev;
    uint64_t id; /* 0: the compute stream; copy streams count up from 1, never reused */
    pthread_cond_t not_empty, not_full;
    cpu_item ring[CPU_QUEUE_CAP];
    int head, count;
    size_t ahead_bytes; /* bytes of the items queued or running (cpu_item.bytes) */
    size_t running_bytes;
    bool running; /* the worker is executing an item */
    bool stop;    /* stream_free: the worker exits once the ring is empty */
    uint64_t enqueued, completed;
    pthread_t worker;
} cpu_stream;

/* The device: its streams share one lock, one error and the progress/idle signals, so that a
 * wait item can watch another stream and a sync can wait for all of them. */
typedef struct cpu_device {
    pthread_mutex_t lock;
    pthread_cond_t idle;     /* broadcast when a stream runs dry */
    pthread_cond_t progress; /* broadcast after every item of every stream */
    cpu_stream compute;
    cpu_stream *copies[CPU_MAX_STREAMS]; /* live copy streams (NULL: free slot) */
    uint64_t next_id;
    /* first error since the last sync, on any stream; later items are skipped until it is
     * collected */
    cdf_status err;
    char err_msg[2048];
    int threads;
    uint64_t syncs;
    bool exiting; /* the process is exiting (cpu_drain_at_exit): run nothing more */
} cpu_device;

static cpu_device g_cpu;

/* The live stream with this id, NULL once freed (its items have all run then). Under lock. */
static cpu_stream *stream_by_id(cpu_device *d, uint64_t id) {
    if (id == 0) return &d->compute;
    for (int i = 0; i < CPU_MAX_STREAMS; i++)
        if (d->copies[i] && d->copies[i]->id == id) return d->copies[i];
    return NULL;
}

static bool stream_idle(const cpu_stream *q) { return q->count == 0 && !q->running; }

static bool all_idle(const cpu_device *d) {
    if (!stream_idle(&d->compute)) return false;
    for (int i = 0; i < CPU_MAX_STREAMS; i++)
        if (d->copies[i] && !stream_idle(d->copies[i])) return false;
    return true;
}

/* Whether the point (stream id, mark) has passed: that stream completed mark items, or is gone. */
static bool point_passed(cpu_device *d, uint64_t id, uint64_t mark) {
    const cpu_stream *o = stream_by_id(d, id);
    return !o || o->completed >= mark;
}

/* An item of q has finished (under lock). */
static void item_finished(cpu_device *d, cpu_stream *q) {
    q->completed++;
    q->running = false;
    q->ahead_bytes -= q->running_bytes;
    q->running_bytes = 0;
    pthread_cond_broadcast(&q->not_full);
    pthread_cond_broadcast(&d->progress);
    if (q->count == 0) pthread_cond_broadcast(&d->idle);
}

static void *cpu_worker(void *arg) {
    cpu_stream *q = arg;
    cpu_device *d = q->dev;
    int applied_threads = -1;
    for (;;) {
        pthread_mutex_lock(&d->lock);
        while (q->count == 0 && !q->stop) pthread_cond_wait(&q->not_empty, &d->lock);
        if (q->count == 0) { /* stopped and drained (stream_free) */
            pthread_mutex_unlock(&d->lock);
            return NULL;
        }
        cpu_item it = q->ring[q->head];
        cdf_node *n = it.node;
        q->head = (q->head + 1) % CPU_QUEUE_CAP;
        q->count--;
        q->running = true;
        q->running_bytes = it.bytes; /* released when it has finished, not when it starts */
        bool skip = d->err != CDF_OK || d->exiting;
        int want_threads = d->threads;
        pthread_cond_signal(&q->not_full);
        if (!n && !it.fn) {
            /* a wait for another stream's event: kept after an error too (a later transfer on
             * this stream must still not overtake what the other stream does) */
            while (!d->exiting && !point_passed(d, it.wait_stream, it.wait_mark)) pthread_cond_wait(&d->progress, &d->lock);
            item_finished(d, q);
            pthread_mutex_unlock(&d->lock);
            continue;
        }
        pthread_mutex_unlock(&d->lock);

        if (q->id == 0 && want_threads != applied_threads) {
            if (want_threads > 0) omp_set_num_threads(want_threads);
            applied_threads = want_threads;
        }
        cdf_status s = CDF_OK;
        char msg[2048] = "";
        if (!n) {
            s = it.fn(it.ctx, skip, msg, sizeof msg);
        } else {
            if (!skip) {
                cdf_clear_error();
                s = cdf_cpu_execute_node(n, NULL);
                if (s != CDF_OK) snprintf(msg, sizeof msg, "queued op '%s' failed: %s", cdf_op_name(n->kind), cdf_last_error());
            }
            cdf_node_free(n); /* drops buffer references: may free memory the host released */
        }

        pthread_mutex_lock(&d->lock);
        if (s != CDF_OK && d->err == CDF_OK) {
            /* the kernel's own status is in the message; the sync reports a device error */
            d->err = CDF_ERR_DEVICE;
            memcpy(d->err_msg, msg, sizeof msg);
        }
        item_finished(d, q);
        pthread_mutex_unlock(&d->lock);
    }
    return NULL;
}

/* At process exit, let the streams finish first: exit() runs the libraries' destructors (oneDNN's
 * lazily built statics among them) while the detached worker could still be inside a kernel
 * that uses them — a program that frees its last outputs without a sync and returns from main
 * crashed that way now and then (SIGSEGV in dnnl_primitive_desc_create, "malloc_consolidate():
 * unaligned fastbin chunk", after the last test of a suite had passed). exit() runs handlers in
 * reverse order of registration, so the drain is registered again after each new oneDNN
 * primitive (the calls that build those statics): it then runs before their destructors. After
 * it, queued work is dropped unexecuted. */
static void cpu_drain_at_exit(void) {
    cpu_device *d = &g_cpu;
    pthread_t self = pthread_self();
    if (pthread_equal(self, d->compute.worker)) return; /* a kernel called exit() */
    /* bounded: a collective waiting for a rank that died must not keep the process alive */
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 10;
    pthread_mutex_lock(&d->lock);
    for (int i = 0; i < CPU_MAX_STREAMS; i++)
        if (d->copies[i] && pthread_equal(self, d->copies[i]->worker)) { /* a transfer's callback */
            pthread_mutex_unlock(&d->lock);
            return;
        }
    while (!all_idle(d))
        if (pthread_cond_timedwait(&d->idle, &d->lock, &until) != 0) break;
    d->exiting = true;
    pthread_cond_broadcast(&d->progress); /* wait items give up */
    pthread_mutex_unlock(&d->lock);
}

static void cpu_register_exit_drain(void) {
    static atomic_int registered;
    if (atomic_fetch_add(&registered, 1) < 1024) atexit(cpu_drain_at_exit); /* a few per model shape */
}

static void stream_init(cpu_device *d, cpu_stream *q, uint64_t id) {
    q->dev = d;
    q->id = id;
    pthread_cond_init(&q->not_empty, NULL);
    pthread_cond_init(&q->not_full, NULL);
}

static cdf_status cpu_init(int *n_devices, const char **why) {
    cpu_device *d = &g_cpu;
    const char *disc = getenv("CDIFFUSERS_CPU_DISCRETE");
    cdf_cpu_discrete = disc && (strcmp(disc, "1") == 0 || strcasecmp(disc, "on") == 0 || strcasecmp(disc, "true") == 0);
    pthread_mutex_init(&d->lock, NULL);
    pthread_cond_init(&d->idle, NULL);
    pthread_cond_init(&d->progress, NULL);
    stream_init(d, &d->compute, 0);
    d->next_id = 1;
    d->threads = 0;
    const char *t = getenv("CDIFFUSERS_NUM_THREADS");
    if (t && atoi(t) > 0) d->threads = atoi(t);
    cdf_k_fast_set_new_primitive_hook(cpu_register_exit_drain);
    /* the worker must not keep the process alive or be joined: detach it */
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&d->compute.worker, &attr, cpu_worker, &d->compute);
    pthread_attr_destroy(&attr);
    if (rc != 0) return cdf_error(CDF_ERR_DEVICE, "cannot start the cpu queue thread: %s", strerror(rc));
    cpu_register_exit_drain();
    if (!cdf_backend_add_device(&cdf_cpu_backend_iface, 0, d)) return cdf_error(CDF_ERR_LIMIT, "device table full");
    *n_devices = 1;
    return CDF_OK;
}

static void *cpu_alloc(cdf_device *dev, size_t nbytes) {
    /* large buffers kept for reuse (core/host_memory.h says why) */
    return cdf_cpu_device_ptr(cdf_host_alloc_large(nbytes));
}

static void cpu_free(cdf_device *dev, void *ptr, size_t nbytes) {
    void *p = cdf_cpu_host_ptr(ptr);
    if (!p) return;
    /* prepacked copies of a weight in this buffer die with it: a later buffer at the same
     * address must never meet them (kernels/pack_cache.h) */
    cdf_k_pack_forget_range(p, nbytes);
    cdf_host_free_large(p, nbytes);
}

static size_t ahead_limit(void) {
    static atomic_size_t limit; /* 0: not read yet */
    size_t v = atomic_load(&limit);
    if (!v) {
        const char *e = getenv("CDIFFUSERS_CPU_QUEUE_MB");
        const long long mb = e && *e ? atoll(e) : 0;
        v = mb > 0 ? (size_t)mb << 20 : CPU_AHEAD_BYTES_DEFAULT;
        atomic_store(&limit, v);
    }
    return v;
}

/* Blocks while the stream is full: CPU_QUEUE_CAP items, or (beyond the first few) the run-ahead
 * bound in output bytes. Only the host pushes, and a wait item only waits for what was pushed
 * before it, so the worker always drains what blocks the push. */
static cdf_status queue_push(cpu_stream *q, cpu_item it) {
    cpu_device *d = q->dev;
    pthread_mutex_lock(&d->lock);
    const size_t limit = ahead_limit();
    while (q->count == CPU_QUEUE_CAP ||
           (q->count + q->running >= CPU_AHEAD_MIN_ITEMS && q->ahead_bytes + it.bytes > limit))
        pthread_cond_wait(&q->not_full, &d->lock);
    q->ring[(q->head + q->count) % CPU_QUEUE_CAP] = it;
    q->count++;
    q->ahead_bytes += it.bytes;
    q->enqueued++;
    pthread_cond_signal(&q->not_empty);
    pthread_mutex_unlock(&d->lock);
    return CDF_OK;
}

static cpu_stream *stream_of(cdf_device *dev, cdf_stream *st) {
    return st ? (cpu_stream *)st : &((cpu_device *)dev->impl)->compute;
}

static cdf_status cpu_enqueue(cdf_device *dev, cdf_node *node) {
    const cdf_storage *out = node && node->dst ? node->dst->storage : NULL;
    return queue_push(stream_of(dev, NULL), (cpu_item){.node = node, .bytes = out ? out->nbytes : 0});
}

static cdf_status cpu_synchronize(cdf_device *dev) {
    cpu_device *d = dev->impl;
    pthread_mutex_lock(&d->lock);
    d->syncs++;
    while (!all_idle(d)) pthread_cond_wait(&d->idle, &d->lock);
    cdf_status s = d->err;
    char msg[2048];
    memcpy(msg, d->err_msg, sizeof msg);
    d->err = CDF_OK;
    d->err_msg[0] = 0;
    pthread_mutex_unlock(&d->lock);
    if (s != CDF_OK) return cdf_error(s, "%s", msg);
    return CDF_OK;
}

static void cpu_wait_idle(cdf_device *dev) {
    cpu_device *d = dev->impl;
    pthread_mutex_lock(&d->lock);
    while (!all_idle(d)) pthread_cond_wait(&d->idle, &d->lock);
    pthread_mutex_unlock(&d->lock);
}

static bool cpu_supports(cdf_device *dev, const cdf_node *node) { return true; }

static cdf_status cpu_buffer_set(cdf_device *dev, void *dst, const void *src, size_t nbytes) {
    memcpy(cdf_cpu_host_ptr(dst), src, nbytes);
    return CDF_OK;
}

static cdf_status cpu_buffer_get(cdf_device *dev, void *dst, const void *src, size_t nbytes) {
    cpu_wait_idle(dev);
    memcpy(dst, cdf_cpu_host_ptr(src), nbytes);
    return CDF_OK;
}

typedef struct async_set {
    void *dst;
    const void *src;
    size_t nbytes;
    void (*done)(void *);
    void *ctx;
    const char *dev_name;
    uint64_t stream; /* the stream's id, for the message of a failed copy */
} async_set;

static cdf_status run_async_set(void *p, bool skip, char *msg, size_t cap) {
    async_set *a = p;
    cdf_status s = CDF_OK;
    if (!skip && cdf_cpu_copy_test_hook) {
        cdf_clear_error();
        s = cdf_cpu_copy_test_hook(a->nbytes);
    }
    /* after an earlier error the bytes are copied all the same (harmless: nothing waits for
     * them that is not skipped); a failed copy writes none */
    if (s == CDF_OK) memcpy(cdf_cpu_host_ptr(a->dst), a->src, a->nbytes);
    else if (a->stream == 0)
        snprintf(msg, cap, "queued copy of %zu bytes to %s (compute stream) failed: %s", a->nbytes, a->dev_name, cdf_last_error());
    else
        snprintf(msg, cap, "queued copy of %zu bytes to %s (copy stream %llu) failed: %s", a->nbytes, a->dev_name,
                 (unsigned long long)a->stream, cdf_last_error());
    if (a->done) a->done(a->ctx); /* frees the source */
    free(a);
    return s;
}

/* ---- whole graphs: one queue item runs every node of a compiled plan with its parameters
 * bound (no per-node copies or queue hand-offs) ---- */
typedef struct cpu_graph {
    cdf_node **nodes; /* borrowed from the plan */
    int n;
    cdf_tensor **params; /* borrowed tensors, own array (the plan's may move) */
    int n_params;
} cpu_graph;

typedef struct cpu_launch {
    const cpu_graph *g;
    cdf_tensor *bound[]; /* n_params references, held until the launch has run */
} cpu_launch;

static void *cpu_graph_instantiate(cdf_device *dev, cdf_node *const *nodes, int n, cdf_tensor *const *params, int np,
                                   const char *who) {
    (void)who;
    cpu_graph *g = calloc(1, sizeof *g);
    if (g) {
        g->nodes = malloc((size_t)(n ? n : 1) * sizeof *g->nodes);
        g->params = malloc((size_t)(np ? np : 1) * sizeof *g->params);
    }
    if (!g || !g->nodes || !g->params) {
        if (g) free(g->nodes), free(g->params);
        free(g);
        cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (graph of %d nodes)", n);
        return NULL;
    }
    memcpy(g->nodes, nodes, (size_t)n * sizeof *nodes);
    memcpy(g->params, params, (size_t)np * sizeof *params);
    g->n = n;
    g->n_params = np;
    return g;
}

static cdf_status run_launch(void *p, bool skip, char *msg, size_t cap) {
    cpu_launch *l = p;
    const cpu_graph *g = l->g;
    const cdf_cpu_binding b = {g->params, l->bound, g->n_params};
    cdf_status s = CDF_OK;
    for (int i = 0; i < g->n && !skip && s == CDF_OK; i++) {
        cdf_clear_error();
        s = cdf_cpu_execute_node(g->nodes[i], &b);
        if (s != CDF_OK)
            snprintf(msg, cap, "queued op '%s' failed (node %d of a compiled graph): %s", cdf_op_name(g->nodes[i]->kind), i,
                     cdf_last_error());
    }
    for (int j = 0; j < g->n_params; j++) cdf_tensor_release(l->bound[j]); /* may free the arena */
    free(l);
    return s;
}

static cdf_status cpu_graph_launch(cdf_device *dev, void *graph, cdf_tensor *const *bound) {
    const cpu_graph *g = graph;
    cpu_launch *l = malloc(sizeof *l + (size_t)g->n_params * sizeof l->bound[0]);
    if (!l) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (graph launch)");
    l->g = g;
    for (int j = 0; j < g->n_params; j++) l->bound[j] = cdf_tensor_retain(bound[j]);
    return queue_push(stream_of(dev, NULL), (cpu_item){.fn = run_launch, .ctx = l});
}

static void cpu_graph_free(cdf_device *dev, void *graph) {
    cpu_graph *g = graph;
    if (!g) return;
    cpu_wait_idle(dev); /* no pending launch may still read its nodes */
    free(g->nodes);
    free(g->params);
    free(g);
}

static cdf_status cpu_buffer_set_async(cdf_device *dev, cdf_stream *st, void *dst, const void *src, size_t nbytes,
                                       void (*done)(void *), void *ctx) {
    async_set *a = malloc(sizeof *a);
    if (!a) {
        if (done) done(ctx);
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (queued copy)");
    }
    cpu_stream *q = stream_of(dev, st);
    *a = (async_set){dst, src, nbytes, done, ctx, dev->name, q->id};
    return queue_push(q, (cpu_item){.fn = run_async_set, .ctx = a});
}

static uint64_t cpu_event_record(cdf_device *dev) {
    cpu_device *d = dev->impl;
    pthread_mutex_lock(&d->lock);
    uint64_t e = d->compute.enqueued;
    pthread_mutex_unlock(&d->lock);
    return e;
}

static void cpu_event_synchronize(cdf_device *dev, uint64_t event) {
    cpu_device *d = dev->impl;
    pthread_mutex_lock(&d->lock);
    /* in order: the items up to the marker are done when `completed` reaches it */
    while (d->compute.completed < event) pthread_cond_wait(&d->progress, &d->lock);
    pthread_mutex_unlock(&d->lock);
}

/* ---- copy streams and events ---- */
static cdf_stream *cpu_stream_new(cdf_device *dev) {
    cpu_device *d = dev->impl;
    cpu_stream *q = calloc(1, sizeof *q);
    if (!q) {
        cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (a stream of %s)", dev->name);
        return NULL;
    }
    pthread_mutex_lock(&d->lock);
    int slot = 0;
    while (slot < CPU_MAX_STREAMS && d->copies[slot]) slot++;
    if (slot == CPU_MAX_STREAMS) {
        pthread_mutex_unlock(&d->lock);
        free(q);
        cdf_error(CDF_ERR_LIMIT, "%s: more than %d streams besides the compute stream", dev->name, CPU_MAX_STREAMS);
        return NULL;
    }
    stream_init(d, q, d->next_id++);
    d->copies[slot] = q; /* idle until its first item: a sync meanwhile does not wait for it */
    pthread_mutex_unlock(&d->lock);
    /* joinable: stream_free joins it; never waited for at exit (cpu_drain_at_exit drains it) */
    int rc = pthread_create(&q->worker, NULL, cpu_worker, q);
    if (rc != 0) {
        pthread_mutex_lock(&d->lock);
        d->copies[slot] = NULL;
        pthread_mutex_unlock(&d->lock);
        free(q);
        cdf_error(CDF_ERR_DEVICE, "%s: cannot start a stream's thread: %s", dev->name, strerror(rc));
        return NULL;
    }
    return (cdf_stream *)q;
}

static void cpu_stream_free(cdf_device *dev, cdf_stream *st) {
    cpu_stream *q = (cpu_stream *)st;
    if (!q) return;
    cpu_device *d = dev->impl;
    pthread_mutex_lock(&d->lock);
    while (!stream_idle(q)) pthread_cond_wait(&d->idle, &d->lock);
    for (int i = 0; i < CPU_MAX_STREAMS; i++)
        if (d->copies[i] == q) d->copies[i] = NULL;
    q->stop = true;
    pthread_cond_signal(&q->not_empty);
    pthread_cond_broadcast(&d->progress); /* its events are passed now */
    pthread_mutex_unlock(&d->lock);
    pthread_join(q->worker, NULL);
    pthread_cond_destroy(&q->not_empty);
    pthread_cond_destroy(&q->not_full);
    free(q);
}

/* An event: the point "stream `stream` has completed `mark` items" (mark 0: never recorded). */
typedef struct cpu_event {
    uint64_t stream, mark;
} cpu_event;

static cdf_event *cpu_event_new(cdf_device *dev) {
    cpu_event *e = calloc(1, sizeof *e);
    if (!e) cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (an event of %s)", dev->name);
    return (cdf_event *)e;
}

static void cpu_event_free(cdf_device *dev, cdf_event *ev) { free(ev); }

static cdf_status cpu_event_record_on(cdf_device *dev, cdf_event *ev, cdf_stream *st) {
    cpu_device *d = dev->impl;
    cpu_stream *q = stream_of(dev, st);
    cpu_event *e = (cpu_event *)ev;
    pthread_mutex_lock(&d->lock);
    e->stream = q->id;
    e->mark = q->enqueued;
    pthread_mutex_unlock(&d->lock);
    return CDF_OK;
}

static cdf_status cpu_stream_wait_event(cdf_device *dev, cdf_stream *st, cdf_event *ev) {
    cpu_device *d = dev->impl;
    cpu_stream *q = stream_of(dev, st);
    const cpu_event e = *(cpu_event *)ev;
    pthread_mutex_lock(&d->lock);
    /* a point of the same stream is behind anything enqueued later anyway */
    bool needed = e.stream != q->id && !point_passed(d, e.stream, e.mark);
    pthread_mutex_unlock(&d->lock);
    return needed ? queue_push(q, (cpu_item){.wait_stream = e.stream, .wait_mark = e.mark}) : CDF_OK;
}

static void cpu_event_host_wait(cdf_device *dev, cdf_event *ev) {
    cpu_device *d = dev->impl;
    const cpu_event e = *(cpu_event *)ev;
    pthread_mutex_lock(&d->lock);
    while (!point_passed(d, e.stream, e.mark)) pthread_cond_wait(&d->progress, &d->lock);
    pthread_mutex_unlock(&d->lock);
}

static bool cpu_host_visible(const cdf_device *dev) { return !cdf_cpu_discrete; }

static void cpu_device_info(const cdf_device *dev, cdf_device_info *out) {
    char model[128] = "unknown CPU";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f)) {
            if (strncmp(line, "model name", 10) != 0) continue;
            const char *c = strchr(line, ':');
            if (!c) continue;
            c++;
            while (*c == ' ' || *c == '\t') c++;
            snprintf(model, sizeof model, "%s", c);
            model[strcspn(model, "\n")] = 0;
            break;
        }
        fclose(f);
    }
    snprintf(out->description, sizeof out->description, "%s, %d threads%s", model, omp_get_num_procs(),
             cdf_cpu_discrete ? " (discrete test mode)" : "");
    const cdf_k_cpu_features *ft = cdf_k_cpu();
    snprintf(out->features, sizeof out->features, "isa=%s%s%s%s%s", cdf_k_isa_name(cdf_k_isa_level()),
             ft->avx2_fma ? " avx2 fma" : "", ft->avx512_core ? " avx512" : "", ft->avx512_bf16 ? " avx512_bf16" : "",
             ft->amx_bf16 ? " amx_bf16" : "");
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGE_SIZE);
    out->memory_bytes = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 0;
}

static void cpu_set_threads(cdf_device *dev, int n) {
    cpu_device *d = dev->impl;
    pthread_mutex_lock(&d->lock);
    d->threads = n;
    pthread_mutex_unlock(&d->lock);
}

static void cpu_queue_stats(const cdf_device *dev, cdf_queue_stats *out) {
    cpu_device *d = dev->impl;
    pthread_mutex_lock(&d->lock);
    out->enqueued = d->compute.enqueued;
    out->completed = d->compute.completed;
    for (int i = 0; i < CPU_MAX_STREAMS; i++)
        if (d->copies[i]) {
            out->enqueued += d->copies[i]->enqueued;
            out->completed += d->copies[i]->completed;
        }
    out->syncs = d->syncs;
    pthread_mutex_unlock(&d->lock);
}

const cdf_backend_iface cdf_cpu_backend_iface = {
    .name = "cpu", CDF_BACKEND_IFACE_CORE(cpu), CDF_BACKEND_IFACE_STREAMS(cpu), .device_info = cpu_device_info,
    .buffer_set_async = cpu_buffer_set_async, .graph_instantiate = cpu_graph_instantiate,
    .graph_launch = cpu_graph_launch, .graph_free = cpu_graph_free};
