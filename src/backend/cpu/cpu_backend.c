/* The cpu backend: host memory, and an in-order asynchronous queue served by one worker thread.
 * Kernels parallelise internally with OpenMP on that worker, so the host thread is free to keep
 * issuing ops while the device computes (the TPU/CUDA stream model). With
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

#define CPU_QUEUE_CAP 512 /* pending ops before enqueue blocks: bounds how far the host runs ahead
                            (each pending op may hold an output buffer) */

/* One queued item: a node to execute, or a function to call on the worker in queue order (a
 * stream-ordered transfer, a graph launch). The function runs even after an earlier error (to
 * release what it holds) with skip set; a failure returns its status with a message in msg. */
typedef struct cpu_item {
    cdf_node *node;
    cdf_status (*fn)(void *ctx, bool skip, char *msg, size_t cap);
    void *ctx;
} cpu_item;

typedef struct cpu_queue {
    pthread_mutex_t lock;
    pthread_cond_t not_empty, not_full, idle, progress;
    cpu_item ring[CPU_QUEUE_CAP];
    int head, count;
    bool running; /* worker is executing a node */
    uint64_t enqueued, completed, syncs;
    /* first error since the last sync; later ops are skipped until it is collected */
    cdf_status err;
    char err_msg[2048];
    int threads;
    pthread_t worker;
    bool exiting; /* the process is exiting (cpu_drain_at_exit): run nothing more */
} cpu_queue;

static cpu_queue g_cpu_queue;

static void *cpu_worker(void *arg) {
    cpu_queue *q = arg;
    int applied_threads = -1;
    for (;;) {
        pthread_mutex_lock(&q->lock);
        while (q->count == 0) pthread_cond_wait(&q->not_empty, &q->lock);
        cpu_item it = q->ring[q->head];
        cdf_node *n = it.node;
        q->head = (q->head + 1) % CPU_QUEUE_CAP;
        q->count--;
        q->running = true;
        bool skip = q->err != CDF_OK || q->exiting;
        int want_threads = q->threads;
        pthread_cond_signal(&q->not_full);
        pthread_mutex_unlock(&q->lock);

        if (want_threads != applied_threads) {
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

        pthread_mutex_lock(&q->lock);
        if (s != CDF_OK && q->err == CDF_OK) {
            /* the kernel's own status is in the message; the sync reports a device error */
            q->err = CDF_ERR_DEVICE;
            memcpy(q->err_msg, msg, sizeof msg);
        }
        q->completed++;
        q->running = false;
        pthread_cond_broadcast(&q->progress);
        if (q->count == 0) pthread_cond_broadcast(&q->idle);
        pthread_mutex_unlock(&q->lock);
    }
    return NULL;
}

/* At process exit, let the queue finish first: exit() runs the libraries' destructors (oneDNN's
 * lazily built statics among them) while the detached worker could still be inside a kernel
 * that uses them — a program that frees its last outputs without a sync and returns from main
 * crashed that way now and then (SIGSEGV in dnnl_primitive_desc_create, "malloc_consolidate():
 * unaligned fastbin chunk", after the last test of a suite had passed). exit() runs handlers in
 * reverse order of registration, so the drain is registered again after each new oneDNN
 * primitive (the calls that build those statics): it then runs before their destructors. After
 * it, queued work is dropped unexecuted. */
static void cpu_drain_at_exit(void) {
    cpu_queue *q = &g_cpu_queue;
    if (pthread_equal(pthread_self(), q->worker)) return; /* a kernel called exit() */
    /* bounded: a collective waiting for a rank that died must not keep the process alive */
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 10;
    pthread_mutex_lock(&q->lock);
    while (q->count > 0 || q->running)
        if (pthread_cond_timedwait(&q->idle, &q->lock, &until) != 0) break;
    q->exiting = true;
    pthread_mutex_unlock(&q->lock);
}

static void cpu_register_exit_drain(void) {
    static atomic_int registered;
    if (atomic_fetch_add(&registered, 1) < 1024) atexit(cpu_drain_at_exit); /* a few per model shape */
}

static cdf_status cpu_init(int *n_devices, const char **why) {
    cpu_queue *q = &g_cpu_queue;
    const char *disc = getenv("CDIFFUSERS_CPU_DISCRETE");
    cdf_cpu_discrete = disc && (strcmp(disc, "1") == 0 || strcasecmp(disc, "on") == 0 || strcasecmp(disc, "true") == 0);
    pthread_mutex_init(&q->lock, NULL);
    pthread_cond_init(&q->not_empty, NULL);
    pthread_cond_init(&q->not_full, NULL);
    pthread_cond_init(&q->idle, NULL);
    pthread_cond_init(&q->progress, NULL);
    q->threads = 0;
    const char *t = getenv("CDIFFUSERS_NUM_THREADS");
    if (t && atoi(t) > 0) q->threads = atoi(t);
    cdf_k_fast_set_new_primitive_hook(cpu_register_exit_drain);
    /* the worker must not keep the process alive or be joined: detach it */
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&q->worker, &attr, cpu_worker, q);
    pthread_attr_destroy(&attr);
    if (rc != 0) return cdf_error(CDF_ERR_DEVICE, "cannot start the cpu queue thread: %s", strerror(rc));
    cpu_register_exit_drain();
    if (!cdf_backend_add_device(&cdf_cpu_backend_iface, 0, q)) return cdf_error(CDF_ERR_LIMIT, "device table full");
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

static cdf_status queue_push(cpu_queue *q, cpu_item it) {
    pthread_mutex_lock(&q->lock);
    while (q->count == CPU_QUEUE_CAP) pthread_cond_wait(&q->not_full, &q->lock);
    q->ring[(q->head + q->count) % CPU_QUEUE_CAP] = it;
    q->count++;
    q->enqueued++;
    pthread_cond_signal(&q->not_empty);
    pthread_mutex_unlock(&q->lock);
    return CDF_OK;
}

static cdf_status cpu_enqueue(cdf_device *dev, cdf_node *node) {
    return queue_push(dev->impl, (cpu_item){.node = node});
}

static cdf_status cpu_synchronize(cdf_device *dev) {
    cpu_queue *q = dev->impl;
    pthread_mutex_lock(&q->lock);
    q->syncs++;
    while (q->count > 0 || q->running) pthread_cond_wait(&q->idle, &q->lock);
    cdf_status s = q->err;
    char msg[2048];
    memcpy(msg, q->err_msg, sizeof msg);
    q->err = CDF_OK;
    q->err_msg[0] = 0;
    pthread_mutex_unlock(&q->lock);
    if (s != CDF_OK) return cdf_error(s, "%s", msg);
    return CDF_OK;
}

static void cpu_wait_idle(cdf_device *dev) {
    cpu_queue *q = dev->impl;
    pthread_mutex_lock(&q->lock);
    while (q->count > 0 || q->running) pthread_cond_wait(&q->idle, &q->lock);
    pthread_mutex_unlock(&q->lock);
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
} async_set;

static cdf_status run_async_set(void *p, bool skip, char *msg, size_t cap) {
    async_set *a = p;
    memcpy(cdf_cpu_host_ptr(a->dst), a->src, a->nbytes); /* harmless after an error; frees the source */
    if (a->done) a->done(a->ctx);
    free(a);
    return CDF_OK;
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

static void *cpu_graph_instantiate(cdf_device *dev, cdf_node *const *nodes, int n, cdf_tensor *const *params, int np) {
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
    return queue_push(dev->impl, (cpu_item){.fn = run_launch, .ctx = l});
}

static void cpu_graph_free(cdf_device *dev, void *graph) {
    cpu_graph *g = graph;
    if (!g) return;
    cpu_wait_idle(dev); /* no pending launch may still read its nodes */
    free(g->nodes);
    free(g->params);
    free(g);
}

static cdf_status cpu_buffer_set_async(cdf_device *dev, void *dst, const void *src, size_t nbytes, void (*done)(void *),
                                       void *ctx) {
    async_set *a = malloc(sizeof *a);
    if (!a) {
        if (done) done(ctx);
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (queued copy)");
    }
    *a = (async_set){dst, src, nbytes, done, ctx};
    return queue_push(dev->impl, (cpu_item){.fn = run_async_set, .ctx = a});
}

static uint64_t cpu_event_record(cdf_device *dev) {
    cpu_queue *q = dev->impl;
    pthread_mutex_lock(&q->lock);
    uint64_t e = q->enqueued;
    pthread_mutex_unlock(&q->lock);
    return e;
}

static void cpu_event_synchronize(cdf_device *dev, uint64_t event) {
    cpu_queue *q = dev->impl;
    pthread_mutex_lock(&q->lock);
    /* in order: the items up to the marker are done when `completed` reaches it */
    while (q->completed < event) pthread_cond_wait(&q->progress, &q->lock);
    pthread_mutex_unlock(&q->lock);
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
    cpu_queue *q = dev->impl;
    pthread_mutex_lock(&q->lock);
    q->threads = n;
    pthread_mutex_unlock(&q->lock);
}

static void cpu_queue_stats(const cdf_device *dev, cdf_queue_stats *out) {
    cpu_queue *q = dev->impl;
    pthread_mutex_lock(&q->lock);
    out->enqueued = q->enqueued;
    out->completed = q->completed;
    out->syncs = q->syncs;
    pthread_mutex_unlock(&q->lock);
}

const cdf_backend_iface cdf_cpu_backend_iface = {
    .name = "cpu",
    .init = cpu_init,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .enqueue = cpu_enqueue,
    .synchronize = cpu_synchronize,
    .wait_idle = cpu_wait_idle,
    .supports = cpu_supports,
    .device_info = cpu_device_info,
    .buffer_set = cpu_buffer_set,
    .buffer_get = cpu_buffer_get,
    .buffer_set_async = cpu_buffer_set_async,
    .event_record = cpu_event_record,
    .event_synchronize = cpu_event_synchronize,
    .host_visible = cpu_host_visible,
    .graph_instantiate = cpu_graph_instantiate,
    .graph_launch = cpu_graph_launch,
    .graph_free = cpu_graph_free,
    .set_threads = cpu_set_threads,
    .queue_stats = cpu_queue_stats,
};
