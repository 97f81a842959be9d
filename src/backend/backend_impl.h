/* Private backend interface: registry -> backend -> device -> stream -> buffer.
 *
 * A backend is a vtable plus a list of devices. A CUDA or PJRT backend implements the same
 * vtable; nothing above exec/ knows which backend runs an op. Memory accounting and the
 * budget are done here, generically, around the backend's raw alloc/free.
 *
 * A device has one compute stream (an in-order queue: every op, graph launch and transfer
 * below that takes no stream, or a NULL one, runs on it) and may hand out more streams (a copy
 * stream for transfers that run beside the compute); streams are ordered among themselves only
 * by events (see "streams and events"). */
#ifndef CDF_BACKEND_IMPL_H
#define CDF_BACKEND_IMPL_H

#include <pthread.h>
#include <stdatomic.h>

#include "cdiffusers/device.h"
#include "graph/node.h"
#include "graph/value.h"

/* Opaque handles a backend hands out and only it dereferences (each backend casts them to its
 * own types): an in-order stream of a device other than its compute stream, and an event, a
 * point recorded in a stream's order. */
typedef struct cdf_stream cdf_stream;
typedef struct cdf_event cdf_event;

/* What a device's transfers did (cdf_device_transfer_stats): zeros on a backend without them. */
typedef struct cdf_transfer_stats {
    uint64_t async_uploads, async_upload_bytes; /* host -> device uploads started without waiting */
    uint64_t pending_host_bytes;                /* host bytes held now by uploads still in flight */
    uint64_t staged, staged_bytes;              /* host-staged values alive now (pinned_host on pjrt) */
    uint64_t staged_made;                       /* host-staged values made so far */
    uint64_t staged_copies, staged_copy_bytes;  /* staged -> device copies queued */
} cdf_transfer_stats;

typedef struct cdf_backend_iface {
    const char *name; /* device type, e.g. "cpu" */
    /* The kind of backend. false: addressable memory (cpu, cuda): buffers are bytes at device
     * addresses, kernels write into them in place, compile plans an arena. true: values (pjrt):
     * a buffer is an immutable value the backend replaces when a node writes it, and a whole
     * graph is one program that plans its own memory and fuses by itself, so the layers above
     * hand it graphs unfused and without an arena (run_nodes, graph_instantiate). */
    bool values;
    /* Not loaded when the library loads (its init is costly: a plugin, threads), only when a
     * device of it is asked for by name (cdf_device_get) or cdf_backend_load. */
    bool lazy;
    /* Create the backend's devices; called once by cdf_backend_load. A backend compiled in but
     * finding no device returns CDF_OK with *n_devices = 0 and says why in *why (static text,
     * e.g. "no driver"), which `cdiffusers devices` prints. */
    cdf_status (*init)(int *n_devices, const char **why);
    /* Describe a device (name, memory, features) for `cdiffusers devices`. */
    void (*device_info)(const cdf_device *dev, cdf_device_info *out);

    /* ---- buffers ----
     * Device memory (no accounting). The returned address is opaque to every layer above the
     * backend: only the backend's own kernels and the transfer calls below may dereference it
     * (byte offsets may be added to it). NULL if the device is out of memory. */
    void *(*alloc)(cdf_device *dev, size_t nbytes);
    void (*free)(cdf_device *dev, void *ptr, size_t nbytes);
    /* Host staging memory for transfers and conversions (pinned where the backend has it):
     * ordinary host-addressable memory. NULL members = malloc/free. */
    void *(*host_alloc)(cdf_device *dev, size_t nbytes);
    void (*host_free)(cdf_device *dev, void *ptr, size_t nbytes);
    /* Host -> device bytes; returns when src may be reused. NOT ordered after queued ops: dst
     * must be memory no queued op uses (a fresh buffer, or a drained queue). */
    cdf_status (*buffer_set)(cdf_device *dev, void *dst, const void *src, size_t nbytes);
    /* Device -> host bytes, ordered after every op enqueued so far (waits for them, without
     * collecting their error: the caller synchronises first when it wants it). */
    cdf_status (*buffer_get)(cdf_device *dev, void *dst, const void *src, size_t nbytes);
    /* ---- one program over several devices (optional; NULL = the backend has none) ----
     * set_replicas: from now on the device stands for its backend's devices 0..n-1 running
     * every program as n replicas (tensor parallelism in one process); dev NULL: asked before
     * the backend loads (it then opens enough devices where it can). replicas: that n (1 when
     * never set). buffer_set_replica: as buffer_set, into replica r's value only (the other
     * replicas keep theirs; buffer_set writes every replica, buffer_get reads replica 0). */
    cdf_status (*set_replicas)(cdf_device *dev, int n);
    int (*replicas)(const cdf_device *dev);
    cdf_status (*buffer_set_replica)(cdf_device *dev, int replica, void *dst, const void *src, size_t nbytes);
    /* Host -> device bytes in the order of stream st (NULL: the compute stream, after every op
     * enqueued so far); src must stay valid until done(ctx) is called, on any thread, once the
     * bytes are on the device. done is called exactly once: also when the call fails (before it
     * returns) and when the copy fails on the device (then the device's next synchronize
     * reports the copy). */
    cdf_status (*buffer_set_async)(cdf_device *dev, cdf_stream *st, void *dst, const void *src, size_t nbytes,
                                   void (*done)(void *), void *ctx);
    /* ---- whole values and host-staged weights (optional; NULL = the backend has none) ----
     * buffer_set_value: dst's whole storage (dst its start, nbytes its size) becomes src's nbytes,
     * dtype dt's elements, on every replica. src is a malloc'd buffer the backend takes (it frees
     * it with free, also when the call fails). Ordered as buffer_set. A values backend starts the
     * transfer now, as dt, beside the programs still running, instead of when a program first
     * reads the storage (a read as another dtype is then a retype of the value). */
    cdf_status (*buffer_set_value)(cdf_device *dev, void *dst, void *src, size_t nbytes, cdf_dtype dt);
    /* staged_new: a copy of src (n elements of src_dt, converted to dt) in the host memory the device copies
     * from best (PJRT's pinned_host), made once and copied to the device many times (sequential
     * offload's block weights); NULL + CDF_ERR_UNSUPPORTED where the device has no such memory
     * (the caller keeps its own path). It is host memory: never in the device's accounting.
     * staged_to_device: dst's whole storage (nbytes) takes the staged value, the copy queued,
     * ordered as buffer_set. staged_free: frees it (copies in flight keep what they need). */
    void *(*staged_new)(cdf_device *dev, const void *src, cdf_dtype src_dt, cdf_dtype dt, size_t n);
    cdf_status (*staged_to_device)(cdf_device *dev, void *staged, void *dst, size_t nbytes);
    void (*staged_free)(cdf_device *dev, void *staged);
    /* The counters above (NULL: zeros). */
    void (*transfer_stats)(const cdf_device *dev, cdf_transfer_stats *out);
    /* Markers of the compute stream: a marker after every op enqueued so far; event_synchronize
     * waits until the device has passed it (ops after it may still be running). */
    uint64_t (*event_record)(cdf_device *dev);
    void (*event_synchronize)(cdf_device *dev, uint64_t event);
    /* Whether device memory is host memory (cdf_tensor_wrap of a host pointer is allowed). */
    bool (*host_visible)(const cdf_device *dev);

    /* ---- whole graphs (optional: NULL = exec/ enqueues a bound copy of each node) ----
     * A compiled plan's nodes reference its params (placeholder tensors whose buffers each replay
     * supplies: inputs, the arena, a repeated block's weights). graph_instantiate takes the nodes
     * and params once (both stay owned by the plan, which frees the graph before them);
     * graph_launch runs the whole graph in queue order with params[i]'s buffer bound to
     * bound[i]'s. Only base addresses change between launches (same shapes, strides, offsets
     * relative to the buffer), so a backend may patch them into an instantiated graph (the
     * update of a CUDA graph); a launch holds references to the bound tensors until it has run.
     * graph_free waits until no launch of the graph is pending. who names the graph in messages
     * (the compiled component, e.g. "FluxTransformer2DModel transformer_blocks.0"). */
    void *(*graph_instantiate)(cdf_device *dev, cdf_node *const *nodes, int n_nodes, cdf_tensor *const *params,
                               int n_params, const char *who);
    cdf_status (*graph_launch)(cdf_device *dev, void *graph, cdf_tensor *const *bound);
    void (*graph_free)(cdf_device *dev, void *graph);

    /* ---- execution ---- */
    /* Take ownership of node and run it asynchronously in submission order. */
    cdf_status (*enqueue)(cdf_device *dev, cdf_node *node);
    /* The values kind: take ownership of nodes[0..n) (a deferred graph, unfused) and run them as
     * one program; buffers only these nodes hold stay inside it. NULL: enqueue each. */
    cdf_status (*run_nodes)(cdf_device *dev, cdf_node **nodes, int n);
    /* Wait until every node enqueued so far has run; return the first queued error. */
    cdf_status (*synchronize)(cdf_device *dev);
    /* Wait until the queue is empty WITHOUT collecting its error (used by the allocator to let
     * queued releases happen before declaring out-of-memory). */
    void (*wait_idle)(cdf_device *dev);
    /* Whether this device can execute the node (shapes/dtypes). */
    bool (*supports)(cdf_device *dev, const cdf_node *node);
    void (*set_threads)(cdf_device *dev, int n);
    /* Items enqueued and completed over all the device's streams (a cross-stream wait is one). */
    void (*queue_stats)(const cdf_device *dev, cdf_queue_stats *out);

    /* ---- streams and events (optional: NULL stream_new = the compute stream is the only one; a
     * backend with stream_new has every member below but stream_alloc) ----
     * Like CUDA streams: two streams run beside each other, and only an event orders them; a
     * stream waiting for an event waits on the device (the host does not block; the wait takes
     * effect when the stream reaches it in its order). Errors are the device's, whichever stream
     * they happen on: the first since the last sync is recorded with its message (a failed copy
     * names the copy and its stream), later ops on every stream are skipped (a transfer may
     * still run: it only fills its own destination), and synchronize reports and clears it (the
     * device stays usable). synchronize, wait_idle and buffer_get wait
     * for every stream of the device. Every st argument may be NULL: the compute stream. */
    /* A new in-order stream (for transfers); NULL + cdf_error when none can be made. */
    cdf_stream *(*stream_new)(cdf_device *dev);
    /* Waits until the stream's queued work has run (or been skipped after an error, which stays
     * the device's), then frees it. Events recorded on it count as passed afterwards. */
    void (*stream_free)(cdf_device *dev, cdf_stream *st);
    /* Device memory usable in st's order (a stream-ordered allocator allocates on st: its
     * memory may be in use by earlier work of another stream); NULL member = alloc. No
     * accounting (cdf_device_alloc_on does it); freed with free. */
    void *(*stream_alloc)(cdf_device *dev, cdf_stream *st, size_t nbytes);
    /* An event, not yet recorded (a wait on it is passed at once); NULL + cdf_error. */
    cdf_event *(*event_new)(cdf_device *dev);
    /* Frees ev; waits already enqueued on it keep their point. */
    void (*event_free)(cdf_device *dev, cdf_event *ev);
    /* Record ev at the current end of st: it is passed once everything enqueued on st so far
     * has run. Recording it again moves it (waits already enqueued keep the old point). */
    cdf_status (*event_record_on)(cdf_device *dev, cdf_event *ev, cdf_stream *st);
    /* Everything enqueued on st after this call runs after ev's point (device-side wait). */
    cdf_status (*stream_wait_event)(cdf_device *dev, cdf_stream *st, cdf_event *ev);
    /* The host waits until ev's point has passed (without collecting errors). */
    void (*event_host_wait)(cdf_device *dev, cdf_event *ev);
} cdf_backend_iface;

/* The vtable members every backend implements, named after the backend (p##_init, p##_alloc,
 * ...): one list for every backend's table instead of a copy per backend. */
#define CDF_BACKEND_IFACE_CORE(p)                                                                                  \
    .init = p##_init, .alloc = p##_alloc, .free = p##_free, .buffer_set = p##_buffer_set, .buffer_get = p##_buffer_get, \
    .event_record = p##_event_record, .event_synchronize = p##_event_synchronize, .host_visible = p##_host_visible,  \
    .enqueue = p##_enqueue, .synchronize = p##_synchronize, .wait_idle = p##_wait_idle, .supports = p##_supports,     \
    .set_threads = p##_set_threads, .queue_stats = p##_queue_stats
/* The streams-and-events members of a backend that has them (see the iface). */
#define CDF_BACKEND_IFACE_STREAMS(p)                                                                               \
    .stream_new = p##_stream_new, .stream_free = p##_stream_free, .event_new = p##_event_new,                     \
    .event_free = p##_event_free, .event_record_on = p##_event_record_on, .stream_wait_event = p##_stream_wait_event, \
    .event_host_wait = p##_event_host_wait

struct cdf_device {
    const cdf_backend_iface *iface;
    char name[32];
    int index;
    atomic_ullong current_bytes, peak_bytes, limit_bytes, n_allocs;
    void *impl; /* backend private state (the queue) */
};

/* Register a device of a backend (called from a backend's init). */
cdf_device *cdf_backend_add_device(const cdf_backend_iface *iface, int index, void *impl);

/* Set by exec/: runs the calling thread's deferred ops, so that buffers only they still hold
 * can be released before an allocation is declared out of memory. */
extern cdf_status (*cdf_backend_pre_oom_hook)(void);

/* Accounted allocation: fails with CDF_ERR_OUT_OF_MEMORY (message names request and budget). */
cdf_status cdf_device_alloc(cdf_device *dev, size_t nbytes, void **out);
void cdf_device_free(cdf_device *dev, void *ptr, size_t nbytes);
cdf_status cdf_device_enqueue(cdf_device *dev, cdf_node *node);
/* Whether the device of node's destination can run it (its backend's `supports`): what the
 * graph passes ask before they make a node kind a backend may lack (a matmul epilogue). */
bool cdf_device_supports_node(const cdf_node *node);
/* Wait for the device's queue and collect its error (no exec-level flush). */
cdf_status cdf_backend_device_synchronize(cdf_device *dev);
/* Wait until the queue of every device is empty; returns (and clears) the first queued error
 * found, in device order (a later device's error stays queued for its next sync). */
cdf_status cdf_backend_synchronize_all(void);

/* Transfers through the device's backend (the only way bytes cross between host and device
 * memory; see the iface above for the ordering of each). */
cdf_status cdf_device_buffer_set(cdf_device *dev, void *dst, const void *src, size_t nbytes);
cdf_status cdf_device_buffer_get(cdf_device *dev, void *dst, const void *src, size_t nbytes);
/* buffer_set_replica (CDF_ERR_UNSUPPORTED where the backend has none, or replica is outside
 * the device's replicas) */
cdf_status cdf_device_buffer_set_replica(cdf_device *dev, int replica, void *dst, const void *src, size_t nbytes);
void *cdf_device_host_alloc(cdf_device *dev, size_t nbytes); /* NULL + error on failure */
/* The host-staged values of the iface (staged_new NULL + CDF_ERR_UNSUPPORTED where the backend
 * has none, or CDIFFUSERS_HOST_STAGING=0) and the transfer counters (zeros where none). */
void *cdf_device_staged_new(cdf_device *dev, const void *src, cdf_dtype src_dt, cdf_dtype dt, size_t n);
cdf_status cdf_device_staged_to_device(cdf_device *dev, void *staged, void *dst, size_t nbytes);
void cdf_device_staged_free(cdf_device *dev, void *staged);
void cdf_device_transfer_stats(const cdf_device *dev, cdf_transfer_stats *out);

void cdf_device_host_free(cdf_device *dev, void *ptr, size_t nbytes);

/* Streams and events through the device's backend (see the iface; st NULL = the compute
 * stream). The device's copy stream, made on first use and kept for the process: NULL when
 * the backend has no streams, making one failed, or CDIFFUSERS_COPY_STREAM=0 (then callers
 * use the compute stream, as when no copy stream existed). */
cdf_stream *cdf_device_copy_stream(cdf_device *dev);
/* cdf_device_alloc, the memory usable in st's order (the iface's stream_alloc). */
cdf_status cdf_device_alloc_on(cdf_device *dev, cdf_stream *st, size_t nbytes, void **out);
/* NULL (with an error) when the backend has no events or none can be made. */
cdf_event *cdf_device_event_new(cdf_device *dev);
void cdf_device_event_free(cdf_device *dev, cdf_event *ev);
cdf_status cdf_device_event_record(cdf_device *dev, cdf_event *ev, cdf_stream *st);
cdf_status cdf_device_stream_wait(cdf_device *dev, cdf_stream *st, cdf_event *ev);
void cdf_device_event_wait(cdf_device *dev, cdf_event *ev);

/* Storages backed by a device (backend/storage.c). */
cdf_storage *cdf_storage_new(cdf_device *dev, size_t nbytes); /* accounted device memory; NULL + error */
/* A buffer created while a compile capture records ops: no memory until the memory planner
 * places it in the graph's arena (or a graph break materialises it). */
cdf_storage *cdf_storage_new_virtual(cdf_device *dev, size_t nbytes);
/* Give a virtual storage its own device memory (no-op for a real one). */
cdf_status cdf_storage_materialize(cdf_storage *s);
/* Write n elements of host data (src_dt) into s at element offset `at` of dtype dt, converting
 * in host staging buffers; the bytes cross through the backend. s must not be in use by a queued
 * op (a new buffer, or queues drained). */
cdf_status cdf_storage_upload(cdf_storage *s, size_t at, cdf_dtype dt, const void *src, cdf_dtype src_dt, size_t n);
/* The same into one replica's value of a device running its programs as replicas (the others
 * keep theirs): CDF_ERR_UNSUPPORTED on a device without replicas. */
cdf_status cdf_storage_upload_replica(cdf_storage *s, int replica, size_t at, cdf_dtype dt, const void *src, cdf_dtype src_dt,
                                      size_t n);
/* The same, stream-ordered where the backend has buffer_set_async (else as cdf_storage_upload):
 * the bytes land in the order of stream st (NULL: the compute stream, after every op enqueued
 * on s's device so far and before every op enqueued after; another stream: after its earlier
 * work, and ops of the compute stream see them only behind a wait on an event recorded after
 * it), and the call returns without waiting for the device. A conversion is done here, into
 * staging buffers the queue frees once copied; an unconverted upload reads src when the queue
 * reaches it, so keep (a storage owning src, or NULL when src outlives the queue) is held until
 * then, as is s. */
cdf_status cdf_storage_upload_async(cdf_storage *s, cdf_stream *st, size_t at, cdf_dtype dt, const void *src,
                                    cdf_dtype src_dt, size_t n, cdf_storage *keep);

/* Whether the device multiplies GGUF blocks as stored (a CDF_OP_MATMUL_Q node); else the loader
 * dequantizes them (the pjrt backend). */
bool cdf_device_runs_quantized(const cdf_device *dev);
/* Whether dev's backend is of the values kind (see cdf_backend_iface.values). */
static inline bool cdf_device_is_values_kind(const cdf_device *dev) { return dev && dev->iface->values; }

/* Built-in backends. */
extern const cdf_backend_iface cdf_cpu_backend_iface;
extern const cdf_backend_iface cdf_pjrt_backend_iface; /* only with CDF_HAVE_PJRT */

/* Run one node with the reference/fast kernels on the host (the cpu backend's executor). With a
 * binding, operands whose buffer is params[j]'s use bound[j]'s buffer instead (a graph launch). */
typedef struct cdf_cpu_binding {
    cdf_tensor *const *params, *const *bound;
    int n;
} cdf_cpu_binding;
cdf_status cdf_cpu_execute_node(const cdf_node *node, const cdf_cpu_binding *binding);

#endif
