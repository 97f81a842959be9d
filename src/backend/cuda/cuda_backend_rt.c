/* The CUDA backend: the device interface (backend_impl.h) over the CUDA runtime.
 *
 * One in-order stream per device, the compute stream, carries kernels, cuBLASLt calls,
 * stream-ordered allocations and frees (cudaMallocAsync / cudaFreeAsync from the device's memory
 * pool, so a buffer the host releases while queued kernels still read it is reused only after
 * them) and transfers given no stream. Copy streams (stream_new: cudaStreams) carry transfers
 * beside the compute, joined to it by cudaEvents (cudaStreamWaitEvent); memory a copy stream
 * writes first is allocated on that stream (stream_alloc), so the pool orders its reuse after
 * the compute stream's frees. The copy streams are not yet run on a GPU. A node is launched when it is enqueued and freed at once: the buffers it holds are
 * released in stream order. Errors: a launch that fails is recorded with the op's name and
 * reported at the next synchronize; a fault inside a running kernel surfaces at the next wait
 * and is sticky (the context is unusable: the message says so and names the last op launched;
 * CUDA_LAUNCH_BLOCKING=1 makes it name the faulting one).
 *
 * Only the runtime is linked, never the driver library: without a driver, init registers no
 * device and says why, and the CPU backend runs as usual. The stream, cuBLASLt handle and
 * workspace are created on a device's first use, so a CPU-only run on a GPU machine creates no
 * CUDA context. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_impl.h"
#include "backend/cuda/cuda_plan.h"
#include "backend/lower.h"
#include "core/error_internal.h"

#define MAX_CUDA_DEVICES 16

static cdf_cuda_dev g_dev[MAX_CUDA_DEVICES];
static pthread_mutex_t g_ready_lock = PTHREAD_MUTEX_INITIALIZER;
static bool g_ready[MAX_CUDA_DEVICES];

cdf_status cdf_cuda_fail(cudaError_t e, const char *what) {
    return cdf_error(e == cudaErrorMemoryAllocation ? CDF_ERR_OUT_OF_MEMORY : CDF_ERR_DEVICE, "%s: CUDA error %d (%s: %s)",
                     what, (int)e, cudaGetErrorName(e), cudaGetErrorString(e));
}

/* Errors after which the context is unusable (every later call fails with them). */
static bool is_sticky(cudaError_t e) {
    switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
    case cudaErrorLaunchTimeout:
        return true;
    default:
        return false;
    }
}

/* ---- init ---------------------------------------------------------------------------------- */

static cdf_status cuda_init(int *n_devices, const char **why) {
    *n_devices = 0;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        switch (e) {
        case cudaErrorInsufficientDriver: *why = "no driver"; break; /* or one older than this runtime */
        case cudaErrorNoDevice: *why = "no GPU"; break;
        default: *why = cudaGetErrorString(e); break; /* static text */
        }
        return CDF_OK;
    }
    if (n <= 0) {
        *why = "no GPU";
        return CDF_OK;
    }
    if (n > MAX_CUDA_DEVICES) n = MAX_CUDA_DEVICES;
    int added = 0;
    for (int i = 0; i < n; i++) {
        cdf_cuda_dev *d = &g_dev[i];
        memset(d, 0, sizeof *d);
        d->ordinal = i;
        pthread_mutex_init(&d->lock, NULL);
        if (cudaGetDeviceProperties(&d->prop, i) != cudaSuccess) {
            (void)cudaGetLastError();
            continue;
        }
        if (cdf_backend_add_device(&cdf_cuda_backend_iface, i, d)) added++;
    }
    *n_devices = added;
    if (!added) *why = "no usable GPU (device properties unreadable)";
    return CDF_OK;
}

static cdf_cuda_dev *dev_of(const cdf_device *dev) { return dev->impl; }

/* Make the device current on this thread and create its stream, cuBLASLt handle, workspace and
 * error word on first use. */
static cdf_status dev_ready(cdf_cuda_dev *d) {
    cudaError_t e = cudaSetDevice(d->ordinal);
    if (e != cudaSuccess) return cdf_cuda_fail(e, "selecting the GPU");
    pthread_mutex_lock(&g_ready_lock);
    cdf_status s = CDF_OK;
    if (!g_ready[d->ordinal]) {
        if ((e = cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking)) != cudaSuccess) {
            s = cdf_cuda_fail(e, "creating the CUDA stream");
        } else if (cublasLtCreate(&d->lt) != CUBLAS_STATUS_SUCCESS) {
            s = cdf_error(CDF_ERR_DEVICE, "cuBLASLt could not be initialised on cuda:%d", d->ordinal);
        } else {
            /* keep freed blocks in the pool (the default threshold returns them to the driver at
             * every synchronize) */
            cudaMemPool_t pool;
            if (cudaDeviceGetDefaultMemPool(&pool, d->ordinal) == cudaSuccess) {
                uint64_t keep = UINT64_MAX;
                (void)cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
            }
            d->workspace_size = 32u << 20; /* cuBLASLt's split-K / stream-K scratch */
            if ((e = cudaMalloc(&d->workspace, d->workspace_size)) != cudaSuccess) {
                s = cdf_cuda_fail(e, "allocating the cuBLASLt workspace");
            } else if ((e = cudaMalloc((void **)&d->err_word_dev, sizeof *d->err_word_dev)) != cudaSuccess ||
                       (e = cudaMemsetAsync(d->err_word_dev, 0, sizeof *d->err_word_dev, d->stream)) != cudaSuccess) {
                s = cdf_cuda_fail(e, "allocating the kernels' error word");
            } else {
                for (int i = 0; i < CDF_CUDA_EVENT_RING && s == CDF_OK; i++)
                    if ((e = cudaEventCreateWithFlags(&d->events[i], cudaEventDisableTiming)) != cudaSuccess)
                        s = cdf_cuda_fail(e, "creating events");
            }
        }
        if (s == CDF_OK) g_ready[d->ordinal] = true;
        else (void)cudaGetLastError();
    }
    pthread_mutex_unlock(&g_ready_lock);
    return s;
}

static void device_info(const cdf_device *dev, cdf_device_info *out) {
    const cdf_cuda_dev *d = dev_of(dev);
    int rt = 0, drv = 0;
    (void)cudaRuntimeGetVersion(&rt);
    (void)cudaDriverGetVersion(&drv);
    snprintf(out->description, sizeof out->description, "%.80s (sm_%d%d, %d SMs; CUDA runtime %d.%d, driver %d.%d)",
             d->prop.name, d->prop.major, d->prop.minor, d->prop.multiProcessorCount, rt / 1000, (rt % 1000) / 10,
             drv / 1000, (drv % 1000) / 10);
    snprintf(out->features, sizeof out->features, "sm_%d%d%s cublaslt", d->prop.major, d->prop.minor,
             d->prop.major >= 8 ? " bf16 tf32" : "");
    out->memory_bytes = d->prop.totalGlobalMem;
}

/* ---- memory -------------------------------------------------------------------------------- */

/* The stream of a handle: NULL is the compute stream. */
static cudaStream_t stream_of(const cdf_cuda_dev *d, cdf_stream *st) { return st ? (cudaStream_t)st : d->stream; }

/* Memory usable in the order of stream s (allocated on it). */
static void *alloc_on(cdf_cuda_dev *d, cudaStream_t s, size_t nbytes) {
    if (!nbytes || dev_ready(d) != CDF_OK) return NULL;
    void *p = NULL;
    if (cudaMallocAsync(&p, nbytes, s) == cudaSuccess) return p;
    (void)cudaGetLastError(); /* out of memory is not sticky */
    /* the pool keeps freed blocks (release threshold: all): give them back to the device once
     * the queued frees (all on the compute stream) have happened, then try again */
    cudaMemPool_t pool;
    if (cudaStreamSynchronize(d->stream) == cudaSuccess && cudaDeviceGetDefaultMemPool(&pool, d->ordinal) == cudaSuccess &&
        cudaMemPoolTrimTo(pool, 0) == cudaSuccess && cudaMallocAsync(&p, nbytes, s) == cudaSuccess)
        return p;
    (void)cudaGetLastError();
    return NULL;
}

static void *cuda_alloc(cdf_device *dev, size_t nbytes) {
    cdf_cuda_dev *d = dev_of(dev);
    return alloc_on(d, d->stream, nbytes);
}

/* Freed on the compute stream like every buffer (cudaFreeAsync may be on another stream than the
 * allocation): after the kernels that read it, which run after a wait for the copy. */
static void *cuda_stream_alloc(cdf_device *dev, cdf_stream *st, size_t nbytes) {
    cdf_cuda_dev *d = dev_of(dev);
    return alloc_on(d, stream_of(d, st), nbytes);
}

static void cuda_free(cdf_device *dev, void *ptr, size_t nbytes) {
    cdf_cuda_dev *d = dev_of(dev);
    if (!ptr) return;
    (void)cudaSetDevice(d->ordinal);
    /* stream-ordered: after every kernel already enqueued that may read it */
    if (cudaFreeAsync(ptr, d->stream) != cudaSuccess) (void)cudaGetLastError();
}

static void *cuda_host_alloc(cdf_device *dev, size_t nbytes) {
    cdf_cuda_dev *d = dev_of(dev);
    if (dev_ready(d) != CDF_OK) return NULL;
    void *p = NULL;
    if (cudaHostAlloc(&p, nbytes, cudaHostAllocPortable) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

static void cuda_host_free(cdf_device *dev, void *ptr, size_t nbytes) {
    if (ptr && cudaFreeHost(ptr) != cudaSuccess) (void)cudaGetLastError();
}

/* done() of the async copies whose event has passed (all of them when wait). Host thread only. */
static void run_pending(cdf_cuda_dev *d, bool wait) {
    pthread_mutex_lock(&d->lock);
    cdf_cuda_pending **pp = &d->pending, *ready = NULL;
    while (*pp) {
        cdf_cuda_pending *p = *pp;
        cudaError_t e = wait ? cudaEventSynchronize(p->event) : cudaEventQuery(p->event);
        if (e == cudaErrorNotReady) {
            pp = &p->next;
            continue;
        }
        *pp = p->next; /* done, or failed (then the bytes will never land: release anyway) */
        p->next = ready;
        ready = p;
    }
    pthread_mutex_unlock(&d->lock);
    while (ready) {
        cdf_cuda_pending *p = ready;
        ready = p->next;
        (void)cudaEventDestroy(p->event);
        if (p->done) p->done(p->ctx);
        free(p);
    }
}

static cdf_status cuda_buffer_set(cdf_device *dev, void *dst, const void *src, size_t nbytes) {
    cdf_cuda_dev *d = dev_of(dev);
    cdf_status s = dev_ready(d);
    if (s != CDF_OK) return s;
    cudaError_t e = cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, d->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(d->stream); /* src reusable on return */
    return e == cudaSuccess ? CDF_OK : cdf_cuda_fail(e, "host-to-device copy");
}

static cdf_status cuda_buffer_get(cdf_device *dev, void *dst, const void *src, size_t nbytes) {
    cdf_cuda_dev *d = dev_of(dev);
    cdf_status s = dev_ready(d);
    if (s != CDF_OK) return s;
    cudaError_t e = cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, d->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(d->stream);
    return e == cudaSuccess ? CDF_OK : cdf_cuda_fail(e, "device-to-host copy");
}

static cdf_status cuda_buffer_set_async(cdf_device *dev, cdf_stream *st, void *dst, const void *src, size_t nbytes,
                                        void (*done)(void *), void *ctx) {
    cdf_cuda_dev *d = dev_of(dev);
    cdf_status s = dev_ready(d);
    if (s != CDF_OK) {
        if (done) done(ctx);
        return s;
    }
    run_pending(d, false);
    cdf_cuda_pending *p = calloc(1, sizeof *p);
    if (!p) {
        if (done) done(ctx);
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory queueing a copy to %s", dev->name);
    }
    cudaStream_t cs = stream_of(d, st);
    cudaError_t e = cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, cs);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&p->event, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(p->event, cs);
    if (e != cudaSuccess) {
        if (p->event) (void)cudaEventDestroy(p->event);
        free(p);
        (void)cudaStreamSynchronize(cs); /* the copy may be in flight: src must outlive it */
        if (done) done(ctx);
        return cdf_cuda_fail(e, "asynchronous host-to-device copy");
    }
    p->done = done;
    p->ctx = ctx;
    pthread_mutex_lock(&d->lock);
    p->next = d->pending;
    d->pending = p;
    pthread_mutex_unlock(&d->lock);
    return CDF_OK;
}

/* Events: marker k lives in ring slot k % RING; recording over a slot first waits for the marker
 * it held (RING markers back, long passed in practice), so events_done says which are passed. */
static uint64_t cuda_event_record(cdf_device *dev) {
    cdf_cuda_dev *d = dev_of(dev);
    if (dev_ready(d) != CDF_OK) return 0;
    pthread_mutex_lock(&d->lock);
    uint64_t id = ++d->n_events;
    cudaEvent_t ev = d->events[id % CDF_CUDA_EVENT_RING];
    if (id > CDF_CUDA_EVENT_RING) {
        (void)cudaEventSynchronize(ev);
        if (d->events_done < id - CDF_CUDA_EVENT_RING) d->events_done = id - CDF_CUDA_EVENT_RING;
    }
    if (cudaEventRecord(ev, d->stream) != cudaSuccess) (void)cudaGetLastError();
    pthread_mutex_unlock(&d->lock);
    return id;
}

static void cuda_event_synchronize(cdf_device *dev, uint64_t event) {
    cdf_cuda_dev *d = dev_of(dev);
    if (!event || dev_ready(d) != CDF_OK) return;
    pthread_mutex_lock(&d->lock);
    bool passed = event <= d->events_done || event + CDF_CUDA_EVENT_RING <= d->n_events;
    cudaEvent_t ev = d->events[event % CDF_CUDA_EVENT_RING];
    pthread_mutex_unlock(&d->lock);
    if (!passed) (void)cudaEventSynchronize(ev);
    run_pending(d, false);
}

static bool cuda_host_visible(const cdf_device *dev) { return false; }

/* Record the first error (the caller holds d->lock). */
static void record_error(cdf_cuda_dev *d, cdf_status s, const char *msg) {
    if (d->err != CDF_OK) return;
    d->err = s;
    snprintf(d->err_msg, sizeof d->err_msg, "%s", msg);
}

/* ---- copy streams and events ----------------------------------------------------------------
 * A stream handle is its cudaStream_t, an event handle its cudaEvent_t. */
static cdf_stream *cuda_stream_new(cdf_device *dev) {
    cdf_cuda_dev *d = dev_of(dev);
    if (dev_ready(d) != CDF_OK) return NULL;
    cudaStream_t cs;
    cudaError_t e = cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        cdf_cuda_fail(e, "creating a copy stream");
        return NULL;
    }
    pthread_mutex_lock(&d->lock);
    int i = 0;
    while (i < CDF_CUDA_MAX_STREAMS && d->copies[i]) i++;
    if (i < CDF_CUDA_MAX_STREAMS) d->copies[i] = cs;
    pthread_mutex_unlock(&d->lock);
    if (i == CDF_CUDA_MAX_STREAMS) {
        (void)cudaStreamDestroy(cs);
        cdf_error(CDF_ERR_LIMIT, "%s: more than %d streams besides the compute stream", dev->name, CDF_CUDA_MAX_STREAMS);
        return NULL;
    }
    return (cdf_stream *)cs;
}

/* Wait for copy stream cs; a failure is recorded as the device's error (caller: no lock held). */
static void sync_copy_stream(cdf_cuda_dev *d, cdf_device *dev, cudaStream_t cs) {
    cudaError_t e = cudaStreamSynchronize(cs);
    if (e == cudaSuccess) return;
    char msg[700];
    pthread_mutex_lock(&d->lock);
    d->sticky = d->sticky || is_sticky(e);
    snprintf(msg, sizeof msg, "%s: a copy on a copy stream failed: %s (%s)%s", dev->name, cudaGetErrorName(e),
             cudaGetErrorString(e), d->sticky ? "; the CUDA context is unusable, restart the process" : "");
    record_error(d, CDF_ERR_DEVICE, msg);
    pthread_mutex_unlock(&d->lock);
    if (!d->sticky) (void)cudaGetLastError();
}

static void cuda_stream_free(cdf_device *dev, cdf_stream *st) {
    cdf_cuda_dev *d = dev_of(dev);
    if (!st) return;
    cudaStream_t cs = (cudaStream_t)st;
    (void)cudaSetDevice(d->ordinal);
    sync_copy_stream(d, dev, cs);
    run_pending(d, false); /* the done() of its copies */
    pthread_mutex_lock(&d->lock);
    for (int i = 0; i < CDF_CUDA_MAX_STREAMS; i++)
        if (d->copies[i] == cs) d->copies[i] = NULL;
    pthread_mutex_unlock(&d->lock);
    if (cudaStreamDestroy(cs) != cudaSuccess) (void)cudaGetLastError();
}

static cdf_event *cuda_event_new(cdf_device *dev) {
    cdf_cuda_dev *d = dev_of(dev);
    if (dev_ready(d) != CDF_OK) return NULL;
    cudaEvent_t ev;
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        cdf_cuda_fail(e, "creating an event");
        return NULL;
    }
    return (cdf_event *)ev;
}

/* A recorded event still pending is released by CUDA once it completes; enqueued waits keep it. */
static void cuda_event_free(cdf_device *dev, cdf_event *ev) {
    (void)cudaSetDevice(dev_of(dev)->ordinal);
    if (cudaEventDestroy((cudaEvent_t)ev) != cudaSuccess) (void)cudaGetLastError();
}

static cdf_status cuda_event_record_on(cdf_device *dev, cdf_event *ev, cdf_stream *st) {
    cdf_cuda_dev *d = dev_of(dev);
    CDF_TRY(dev_ready(d));
    cudaError_t e = cudaEventRecord((cudaEvent_t)ev, stream_of(d, st));
    return e == cudaSuccess ? CDF_OK : cdf_cuda_fail(e, "recording an event");
}

static cdf_status cuda_stream_wait_event(cdf_device *dev, cdf_stream *st, cdf_event *ev) {
    cdf_cuda_dev *d = dev_of(dev);
    CDF_TRY(dev_ready(d));
    cudaError_t e = cudaStreamWaitEvent(stream_of(d, st), (cudaEvent_t)ev, 0);
    return e == cudaSuccess ? CDF_OK : cdf_cuda_fail(e, "a stream's wait for an event");
}

static void cuda_event_host_wait(cdf_device *dev, cdf_event *ev) {
    cdf_cuda_dev *d = dev_of(dev);
    (void)cudaSetDevice(d->ordinal);
    if (cudaEventSynchronize((cudaEvent_t)ev) != cudaSuccess) (void)cudaGetLastError(); /* reported at the sync */
    run_pending(d, false);
}

/* ---- execution ------------------------------------------------------------------------------ */

#define SRC(i) (n->src[i])
#define PTR(t) ((t) ? cdf_tensor_device_addr(t) : NULL)

static cdf_status launch_status(int e, const cdf_node *n) {
    if (e == 0) return CDF_OK;
    return cdf_cuda_fail((cudaError_t)e, cdf_op_name(n->kind));
}

/* The host-staged all-reduce: dst = src0 on the device, then the node's reduce function sums a
 * host copy over the ranks, and the sum goes back. The stream waits for it (a collective is a
 * synchronisation point anyway); NCCL on the stream replaces this later. */
static cdf_status all_reduce_staged(cdf_cuda_dev *d, cdf_device *dev, const cdf_node *n) {
    cdf_tensor *dst = n->dst, *src = SRC(0);
    cdf_status s = launch_status(cdf_cu_copy_strided(d->stream, PTR(dst), dst->dtype, dst->strides, PTR(src), src->dtype,
                                                     src->strides, dst->ndim, dst->shape), n);
    if (s != CDF_OK) return s;
    if (!n->p.all_reduce.reduce) return cdf_error(CDF_ERR_INTERNAL, "all_reduce: node has no reduce function");
    const int64_t numel = cdf_shape_numel(dst->ndim, dst->shape);
    const size_t nbytes = (size_t)numel * cdf_dtype_size(dst->dtype);
    void *host = cuda_host_alloc(dev, nbytes ? nbytes : 1);
    if (!host) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "all_reduce: no pinned staging buffer of %zu bytes", nbytes);
    cudaError_t e = cudaMemcpyAsync(host, PTR(dst), nbytes, cudaMemcpyDeviceToHost, d->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(d->stream);
    if (e != cudaSuccess) s = cdf_cuda_fail(e, "all_reduce staging");
    if (s == CDF_OK) s = n->p.all_reduce.reduce(n->p.all_reduce.comm, host, numel, dst->dtype);
    if (s == CDF_OK) {
        e = cudaMemcpyAsync(PTR(dst), host, nbytes, cudaMemcpyHostToDevice, d->stream);
        if (e == cudaSuccess) e = cudaStreamSynchronize(d->stream);
        if (e != cudaSuccess) s = cdf_cuda_fail(e, "all_reduce staging");
    }
    cuda_host_free(dev, host, nbytes);
    return s;
}

/* One node -> one kernel (or cuBLASLt call) on the stream. */
static cdf_status execute(cdf_cuda_dev *d, cdf_device *dev, const cdf_node *n) {
    cdf_tensor *dt = n->dst;
    void *st = d->stream, *dp = PTR(dt);
    for (int i = -1; i < n->n_src; i++) {
        const cdf_tensor *t = i < 0 ? dt : n->src[i];
        if (t && (t->storage->is_virtual || (!t->storage->data && t->storage->nbytes)))
            return cdf_error(CDF_ERR_INTERNAL, "%s: operand %d has no device memory", cdf_op_name(n->kind), i);
    }
    char why[256];
    if (!cdf_cuda_check_node(n, why, sizeof why)) return cdf_error(CDF_ERR_UNSUPPORTED, "cuda backend: %s", why);
    switch (n->kind) {
    case CDF_OP_COPY:
        return launch_status(cdf_cu_copy_strided(st, dp, dt->dtype, dt->strides, PTR(SRC(0)), SRC(0)->dtype,
                                                 SRC(0)->strides, dt->ndim, dt->shape), n);
    case CDF_OP_FILL:
        return launch_status(cdf_cu_fill(st, dp, dt->dtype, dt->strides, dt->ndim, dt->shape, n->p.fill.value), n);
    case CDF_OP_EMBEDDING: {
        cdf_tensor *tab = SRC(0), *ids = SRC(1);
        return launch_status(cdf_cu_embedding(st, dp, dt->dtype, PTR(tab), tab->dtype, tab->shape[0], tab->shape[1],
                                              PTR(ids), ids->dtype, cdf_shape_numel(ids->ndim, ids->shape),
                                              d->err_word_dev), n);
    }
    case CDF_OP_UNARY:
        return launch_status(cdf_cu_unary(st, n->p.unary.op, n->p.unary.p0, n->p.unary.p1, dp, dt->dtype, PTR(SRC(0)),
                                          SRC(0)->dtype, cdf_shape_numel(dt->ndim, dt->shape)), n);
    case CDF_OP_BINARY: { /* a one-step fused program: v = in0 op in1 */
        cdf_fused_program prog = {.n_steps = 1, .steps = {{.binary = true, .input = 1, .op = n->p.binary.op}}};
        const void *in[2] = {PTR(SRC(0)), PTR(SRC(1))};
        const cdf_dtype idt[2] = {SRC(0)->dtype, SRC(1)->dtype};
        const int64_t *ist[2] = {SRC(0)->strides, SRC(1)->strides};
        return launch_status(cdf_cu_fused(st, &prog, dp, dt->dtype, 2, in, idt, ist, dt->ndim, dt->shape), n);
    }
    case CDF_OP_FUSED: {
        cdf_lowered_inputs li;
        const void *in[CDF_NODE_MAX_SRC];
        cdf_lower_inputs(n, &li);
        for (int i = 0; i < n->n_src; i++) in[i] = PTR(SRC(i));
        return launch_status(cdf_cu_fused(st, n->p.fused.prog, dp, dt->dtype, li.n, in, li.dtype, li.strides, dt->ndim, dt->shape), n);
    }
    case CDF_OP_MATMUL:
        return cdf_cuda_matmul(d, n);
    case CDF_OP_SOFTMAX:
        return launch_status(cdf_cu_softmax(st, dp, dt->dtype, PTR(SRC(0)), SRC(0)->dtype, n->p.softmax.rows,
                                            n->p.softmax.cols, n->p.softmax.scale), n);
    case CDF_OP_LAYER_NORM: {
        cdf_dtype wdt = SRC(1) ? SRC(1)->dtype : (SRC(2) ? SRC(2)->dtype : CDF_F32);
        return launch_status(cdf_cu_layer_norm(st, dp, dt->dtype, PTR(SRC(0)), SRC(0)->dtype, n->p.norm.rows,
                                               n->p.norm.cols, n->p.norm.eps, PTR(SRC(1)), PTR(SRC(2)), wdt), n);
    }
    case CDF_OP_RMS_NORM:
        return launch_status(cdf_cu_rms_norm(st, dp, dt->dtype, PTR(SRC(0)), SRC(0)->dtype, n->p.norm.rows, n->p.norm.cols,
                                             n->p.norm.eps, PTR(SRC(1)), SRC(1) ? SRC(1)->dtype : CDF_F32), n);
    case CDF_OP_GROUP_NORM: {
        cdf_dtype wdt = SRC(1) ? SRC(1)->dtype : (SRC(2) ? SRC(2)->dtype : CDF_F32);
        return launch_status(cdf_cu_group_norm(st, dp, dt->dtype, PTR(SRC(0)), SRC(0)->dtype, n->p.group_norm.n,
                                               n->p.group_norm.c, n->p.group_norm.s, n->p.group_norm.groups,
                                               n->p.group_norm.eps, PTR(SRC(1)), PTR(SRC(2)), wdt), n);
    }
    case CDF_OP_REDUCE:
        return launch_status(cdf_cu_reduce(st, n->p.reduce.op, dp, dt->dtype, PTR(SRC(0)), SRC(0)->dtype, n->p.reduce.outer,
                                           n->p.reduce.red, n->p.reduce.inner), n);
    case CDF_OP_CONV2D: {
        cdf_k_conv2d_args a;
        cdf_lower_conv2d(n, &a);
        a.x = PTR(SRC(0)); a.weight = PTR(SRC(1)); a.bias = PTR(SRC(2)); a.out = dp;
        return launch_status(cdf_cu_conv2d(st, &a), n);
    }
    case CDF_OP_UPSAMPLE: {
        cdf_tensor *x = SRC(0);
        int64_t h = x->shape[x->ndim - 2], w = x->shape[x->ndim - 1];
        int64_t nc = cdf_shape_numel(x->ndim, x->shape) / (h * w > 0 ? h * w : 1);
        return launch_status(cdf_cu_upsample_nearest(st, dp, dt->dtype, PTR(x), x->dtype, nc, h, w, n->p.upsample.fh,
                                                     n->p.upsample.fw), n);
    }
    case CDF_OP_ATTENTION: {
        cdf_k_attention_args a;
        cdf_lower_attention(n, &a);
        a.q = PTR(SRC(0)); a.k = PTR(SRC(1)); a.v = PTR(SRC(2)); a.mask = PTR(SRC(3)); a.out = dp;
        return launch_status(cdf_cu_attention(st, &a), n);
    }
    case CDF_OP_ROPE: {
        cdf_tensor *x = SRC(0);
        return launch_status(cdf_cu_rope(st, dp, dt->dtype, PTR(x), x->dtype, PTR(SRC(1)), PTR(SRC(2)), x->shape[0],
                                         x->shape[1], x->shape[2], x->shape[3]), n);
    }
    case CDF_OP_TIMESTEP_EMB:
        return launch_status(cdf_cu_timestep_embedding(st, dp, PTR(SRC(0)), SRC(0)->shape[0], n->p.temb.dim, n->p.temb.flip,
                                                       n->p.temb.shift, n->p.temb.scale, n->p.temb.max_period), n);
    case CDF_OP_ROPE_TABLE:
        return launch_status(cdf_cu_rope_table(st, dp, PTR(SRC(0)), SRC(0)->shape[0], n->p.rope_table.n_axes,
                                               n->p.rope_table.axes_dim, n->p.rope_table.theta), n);
    case CDF_OP_ALL_REDUCE:
        return all_reduce_staged(d, dev, n);
    case CDF_OP_MATMUL_Q:
        return cdf_cuda_matmul_q(d, n);
    case CDF_OP_COUNT:
        break;
    }
    return cdf_error(CDF_ERR_INTERNAL, "cuda backend: unknown op kind %d", (int)n->kind);
}

static cdf_status cuda_enqueue(cdf_device *dev, cdf_node *node) {
    cdf_cuda_dev *d = dev_of(dev);
    cdf_status s = dev_ready(d);
    pthread_mutex_lock(&d->lock);
    d->enqueued++;
    if (s != CDF_OK) {
        record_error(d, s, cdf_last_error());
    } else if (d->sticky) {
        /* nothing runs on a lost context; the sync reports the first error */
    } else if (d->err == CDF_OK) { /* after a failed op, later ones are skipped until the sync */
        d->last_op = cdf_op_name(node->kind);
        s = execute(d, dev, node);
        if (s != CDF_OK) {
            char msg[700];
            cudaError_t again = cudaGetLastError();
            d->sticky = is_sticky(again);
            snprintf(msg, sizeof msg, "%s: %s%s", dev->name, cdf_last_error(),
                     d->sticky ? " (the CUDA context is unusable after this fault; restart the process)" : "");
            record_error(d, s, msg);
        }
    }
    pthread_mutex_unlock(&d->lock);
    /* the node's buffers are released in stream order (cudaFreeAsync), after its kernel */
    cdf_node_free(node);
    return CDF_OK;
}

/* Wait for the stream; returns the first error (recorded, a fault of a running kernel, or a
 * kernel's error word) and clears it unless the context is lost. */
static cdf_status drain(cdf_cuda_dev *d, cdf_device *dev, bool collect) {
    cudaStream_t copies[CDF_CUDA_MAX_STREAMS];
    pthread_mutex_lock(&d->lock);
    memcpy(copies, d->copies, sizeof copies);
    pthread_mutex_unlock(&d->lock);
    for (int i = 0; i < CDF_CUDA_MAX_STREAMS; i++)
        if (copies[i]) sync_copy_stream(d, dev, copies[i]);
    cudaError_t e = cudaStreamSynchronize(d->stream);
    run_pending(d, true);
    pthread_mutex_lock(&d->lock);
    d->syncs++;
    if (e != cudaSuccess) {
        char msg[700];
        d->sticky = d->sticky || is_sticky(e);
        snprintf(msg, sizeof msg,
                 "%s: a kernel failed: %s (%s); the last op launched was %s (set CUDA_LAUNCH_BLOCKING=1 to name the "
                 "faulting one)%s",
                 dev->name, cudaGetErrorName(e), cudaGetErrorString(e), d->last_op ? d->last_op : "none",
                 d->sticky ? "; the CUDA context is unusable, restart the process" : "");
        record_error(d, CDF_ERR_DEVICE, msg);
        if (!d->sticky) (void)cudaGetLastError();
    }
    cdf_cu_error_word w = {0};
    /* on the stream: the legacy default stream does not order with this non-blocking one */
    if (e == cudaSuccess && cudaMemcpyAsync(&w, d->err_word_dev, sizeof w, cudaMemcpyDeviceToHost, d->stream) == cudaSuccess &&
        cudaStreamSynchronize(d->stream) == cudaSuccess && w.code) {
        char msg[200];
        snprintf(msg, sizeof msg, "%s: embedding: id %lld is out of range for the table", dev->name, w.value);
        record_error(d, CDF_ERR_INVALID_ARG, msg);
        if (collect) (void)cudaMemsetAsync(d->err_word_dev, 0, sizeof w, d->stream);
    }
    cdf_status s = CDF_OK;
    if (collect && d->err != CDF_OK) {
        s = cdf_error(d->err, "%s", d->err_msg);
        if (!d->sticky) d->err = CDF_OK;
    }
    pthread_mutex_unlock(&d->lock);
    return s;
}

static cdf_status cuda_synchronize(cdf_device *dev) {
    cdf_cuda_dev *d = dev_of(dev);
    if (!g_ready[d->ordinal]) return CDF_OK; /* never used */
    (void)cudaSetDevice(d->ordinal);
    return drain(d, dev, true);
}

static void cuda_wait_idle(cdf_device *dev) {
    cdf_cuda_dev *d = dev_of(dev);
    if (!g_ready[d->ordinal]) return;
    (void)cudaSetDevice(d->ordinal);
    (void)drain(d, dev, false);
}

static bool cuda_supports(cdf_device *dev, const cdf_node *node) { return cdf_cuda_check_node(node, NULL, 0); }

static void cuda_set_threads(cdf_device *dev, int n) {}

static void cuda_queue_stats(const cdf_device *dev, cdf_queue_stats *out) {
    cdf_cuda_dev *d = dev_of(dev);
    pthread_mutex_lock(&d->lock);
    out->enqueued = d->enqueued;
    /* ops are launched at enqueue and complete in order; completion of each is not tracked */
    out->completed = d->enqueued;
    out->syncs = d->syncs;
    pthread_mutex_unlock(&d->lock);
}

const cdf_backend_iface cdf_cuda_backend_iface = {
    .name = "cuda", CDF_BACKEND_IFACE_CORE(cuda), CDF_BACKEND_IFACE_STREAMS(cuda), .device_info = device_info,
    .host_alloc = cuda_host_alloc, .host_free = cuda_host_free, .buffer_set_async = cuda_buffer_set_async,
    .stream_alloc = cuda_stream_alloc};
