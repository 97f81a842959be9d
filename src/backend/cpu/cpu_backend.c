/* The cpu backend: host memory, and an in-order asynchronous queue served by one worker thread.
 * Kernels parallelise internally with OpenMP on that worker, so the host thread is free to keep
 * issuing ops while the device computes (the TPU/CUDA stream model). */
#include <omp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend_impl.h"
#include "core/error_internal.h"
#include "kernels/fast_onednn.h"

#define CPU_QUEUE_CAP 512 /* pending ops before enqueue blocks: bounds how far the host runs ahead
                            (each pending op may hold an output buffer) */
#define CPU_ALIGN 64

typedef struct cpu_queue {
    pthread_mutex_t lock;
    pthread_cond_t not_empty, not_full, idle;
    cdf_node *ring[CPU_QUEUE_CAP];
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
        cdf_node *n = q->ring[q->head];
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
        if (!skip) {
            cdf_clear_error();
            s = cdf_cpu_execute_node(n);
            if (s != CDF_OK) snprintf(msg, sizeof msg, "queued op '%s' failed: %s", cdf_op_name(n->kind), cdf_last_error());
        }
        cdf_node_free(n); /* drops buffer references: may free memory the host released */

        pthread_mutex_lock(&q->lock);
        if (s != CDF_OK && q->err == CDF_OK) {
            /* the kernel's own status is in the message; the sync reports a device error */
            q->err = CDF_ERR_DEVICE;
            memcpy(q->err_msg, msg, sizeof msg);
        }
        q->completed++;
        q->running = false;
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

static cdf_status cpu_init(int *n_devices) {
    cpu_queue *q = &g_cpu_queue;
    pthread_mutex_init(&q->lock, NULL);
    pthread_cond_init(&q->not_empty, NULL);
    pthread_cond_init(&q->not_full, NULL);
    pthread_cond_init(&q->idle, NULL);
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
    size_t sz = (nbytes + CPU_ALIGN - 1) / CPU_ALIGN * CPU_ALIGN;
    if (sz == 0) sz = CPU_ALIGN;
    return aligned_alloc(CPU_ALIGN, sz);
}

static void cpu_free(cdf_device *dev, void *ptr, size_t nbytes) { free(ptr); }

static cdf_status cpu_enqueue(cdf_device *dev, cdf_node *node) {
    cpu_queue *q = dev->impl;
    pthread_mutex_lock(&q->lock);
    while (q->count == CPU_QUEUE_CAP) pthread_cond_wait(&q->not_full, &q->lock);
    q->ring[(q->head + q->count) % CPU_QUEUE_CAP] = node;
    q->count++;
    q->enqueued++;
    pthread_cond_signal(&q->not_empty);
    pthread_mutex_unlock(&q->lock);
    return CDF_OK;
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

static cdf_status cpu_copy(cdf_device *dev, void *dst, const void *src, size_t nbytes) {
    memcpy(dst, src, nbytes);
    return CDF_OK;
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
    .copy_to_host = cpu_copy,
    .copy_from_host = cpu_copy,
    .set_threads = cpu_set_threads,
    .queue_stats = cpu_queue_stats,
};
