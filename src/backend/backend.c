/* The device registry and generic memory accounting. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "backend/backend_impl.h"
#include "core/error_internal.h"

#define MAX_BACKENDS 8
#define MAX_DEVICES 16

#ifdef CDF_HAVE_CUDA
extern const cdf_backend_iface cdf_cuda_backend_iface; /* backend/cuda/cuda_impl.h */
#endif

static const cdf_backend_iface *const k_builtin[] = {
    &cdf_cpu_backend_iface,
#ifdef CDF_HAVE_CUDA
    &cdf_cuda_backend_iface,
#endif
#ifdef CDF_HAVE_PJRT
    &cdf_pjrt_backend_iface,
#endif
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static const cdf_backend_iface *g_backends[MAX_BACKENDS];
static int g_n_backends;
/* Why a compiled-in backend has no device (its init said so, or failed), by k_builtin index. */
static char g_why_none[sizeof k_builtin / sizeof *k_builtin][160];
static cdf_device g_devices[MAX_DEVICES];
static int g_n_devices;

int64_t cdf_parse_bytes(const char *s) {
    if (!s) return -1;
    while (isspace((unsigned char)*s)) s++;
    char *end;
    double v = strtod(s, &end);
    if (end == s || !(v >= 0) || !isfinite(v)) return -1;
    while (isspace((unsigned char)*end)) end++;
    double mul = 1;
    switch (toupper((unsigned char)*end)) {
    case 0: break;
    case 'K': mul = 1024.0; end++; break;
    case 'M': mul = 1024.0 * 1024; end++; break;
    case 'G': mul = 1024.0 * 1024 * 1024; end++; break;
    case 'T': mul = 1024.0 * 1024 * 1024 * 1024; end++; break;
    case 'B': break;
    default: return -1;
    }
    if (*end == 'i' || *end == 'I') end++;
    if (*end == 'b' || *end == 'B') end++;
    while (isspace((unsigned char)*end)) end++;
    if (*end) return -1;
    double bytes = v * mul;
    if (bytes > 9.0e18) return -1;
    return (int64_t)bytes;
}

cdf_device *cdf_backend_add_device(const cdf_backend_iface *iface, int index, void *impl) {
    if (g_n_devices >= MAX_DEVICES) return NULL;
    cdf_device *d = &g_devices[g_n_devices++];
    memset(d, 0, sizeof *d);
    d->iface = iface;
    d->index = index;
    d->impl = impl;
    snprintf(d->name, sizeof d->name, "%s:%d", iface->name, index);
    /* budget from the environment: CDIFFUSERS_<TYPE>_MEMORY_LIMIT */
    char var[64];
    snprintf(var, sizeof var, "CDIFFUSERS_%s_MEMORY_LIMIT", iface->name);
    for (char *p = var; *p; p++) *p = (char)toupper((unsigned char)*p);
    const char *lim = getenv(var);
    if (lim && *lim) {
        int64_t b = cdf_parse_bytes(lim);
        if (b >= 0) atomic_store(&d->limit_bytes, (unsigned long long)b);
        else fprintf(stderr, "cdiffusers: ignoring malformed %s=%s (expected e.g. 8G, 512M)\n", var, lim);
    }
    return d;
}

static int builtin_index(const cdf_backend_iface *iface) {
    for (size_t i = 0; i < sizeof k_builtin / sizeof *k_builtin; i++)
        if (k_builtin[i] == iface) return (int)i;
    return -1;
}

static cdf_status load_locked(const cdf_backend_iface *iface) {
    for (int i = 0; i < g_n_backends; i++)
        if (g_backends[i] == iface) return CDF_OK;
    if (g_n_backends >= MAX_BACKENDS) return cdf_error(CDF_ERR_LIMIT, "too many backends");
    int n = 0, bi = builtin_index(iface);
    const char *why = NULL;
    cdf_status s = iface->init(&n, &why);
    if (s != CDF_OK) {
        cdf_error_prefix("loading backend '%s': ", iface->name);
        if (bi >= 0) snprintf(g_why_none[bi], sizeof g_why_none[bi], "%s", cdf_last_error());
        return s;
    }
    if (n == 0) { /* compiled in, nothing to run on: not registered, but `devices` says why */
        if (bi >= 0) snprintf(g_why_none[bi], sizeof g_why_none[bi], "%s", why ? why : "no device found");
        return cdf_error(CDF_ERR_NOT_FOUND, "backend '%s' found no device: %s", iface->name, why ? why : "no device found");
    }
    g_backends[g_n_backends++] = iface;
    return CDF_OK;
}

cdf_status cdf_backend_load(const char *name) {
    if (!name) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_backend_load: name is NULL");
    for (size_t i = 0; i < sizeof k_builtin / sizeof *k_builtin; i++) {
        if (strcmp(k_builtin[i]->name, name) == 0) {
            pthread_mutex_lock(&g_lock);
            cdf_status s = load_locked(k_builtin[i]);
            pthread_mutex_unlock(&g_lock);
            return s;
        }
    }
    char known[256] = "";
    for (size_t i = 0; i < sizeof k_builtin / sizeof *k_builtin; i++) {
        strncat(known, i ? ", " : "", sizeof known - strlen(known) - 1);
        strncat(known, k_builtin[i]->name, sizeof known - strlen(known) - 1);
    }
    return cdf_error(CDF_ERR_NOT_FOUND, "unknown backend '%s' (built-in backends: %s)", name, known);
}

/* Whether environment variable name switches something off (0, false, off). */
static bool env_off(const char *name) {
    const char *v = getenv(name);
    return v && (strcmp(v, "0") == 0 || strcasecmp(v, "false") == 0 || strcasecmp(v, "off") == 0);
}

/* Autoload: register every built-in backend when the library loads, unless
 * CDIFFUSERS_BACKEND_AUTOLOAD=0. This object is always linked (cdf_device_get lives here), so
 * the constructor runs for the static library too. */
__attribute__((constructor)) static void cdf_backend_autoload(void) {
    if (env_off("CDIFFUSERS_BACKEND_AUTOLOAD")) return;
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; i < sizeof k_builtin / sizeof *k_builtin; i++)
        if (!k_builtin[i]->lazy) (void)load_locked(k_builtin[i]);
    pthread_mutex_unlock(&g_lock);
}

int cdf_backend_count(void) { return g_n_backends; }
const char *cdf_backend_name(int i) { return (i >= 0 && i < g_n_backends) ? g_backends[i]->name : NULL; }

cdf_device *cdf_device_get(const char *name) {
    if (!name) {
        cdf_error(CDF_ERR_INVALID_ARG, "cdf_device_get: name is NULL");
        return NULL;
    }
    char type[32];
    int index = 0;
    const char *colon = strchr(name, ':');
    size_t tl = colon ? (size_t)(colon - name) : strlen(name);
    if (tl == 0 || tl >= sizeof type) {
        cdf_error(CDF_ERR_INVALID_ARG, "malformed device name '%s' (expected e.g. cpu or cpu:0)", name);
        return NULL;
    }
    memcpy(type, name, tl);
    type[tl] = 0;
    if (colon) {
        char *end;
        long v = strtol(colon + 1, &end, 10);
        if (*end || end == colon + 1 || v < 0) {
            cdf_error(CDF_ERR_INVALID_ARG, "malformed device index in '%s'", name);
            return NULL;
        }
        index = (int)v;
    }
    for (int i = 0; i < g_n_devices; i++)
        if (strcmp(g_devices[i].iface->name, type) == 0 && g_devices[i].index == index) return &g_devices[i];
    /* a lazily loaded backend (pjrt) is loaded by the first request for one of its devices */
    for (size_t i = 0; i < sizeof k_builtin / sizeof *k_builtin; i++) {
        if (!k_builtin[i]->lazy || strcmp(k_builtin[i]->name, type) != 0 || g_why_none[i][0]) continue;
        pthread_mutex_lock(&g_lock);
        cdf_status ls = load_locked(k_builtin[i]);
        pthread_mutex_unlock(&g_lock);
        if (ls != CDF_OK) return NULL; /* its error names the plugin and why */
        for (int d = 0; d < g_n_devices; d++)
            if (strcmp(g_devices[d].iface->name, type) == 0 && g_devices[d].index == index) return &g_devices[d];
    }
    bool loaded = false;
    for (int i = 0; i < g_n_backends; i++) loaded |= strcmp(g_backends[i]->name, type) == 0;
    int bi = -1;
    for (int i = 0; i < cdf_backend_compiled_count(); i++)
        if (strcmp(k_builtin[i]->name, type) == 0) bi = i;
    if (loaded) {
        cdf_error(CDF_ERR_NOT_FOUND, "device '%s' does not exist", name);
    } else if (bi < 0) {
        char known[256] = "";
        for (int i = 0; i < cdf_backend_compiled_count(); i++) {
            strncat(known, i ? ", " : "", sizeof known - strlen(known) - 1);
            strncat(known, k_builtin[i]->name, sizeof known - strlen(known) - 1);
        }
        cdf_error(CDF_ERR_NOT_FOUND, "no backend '%s' in this build (compiled in: %s; see cdiffusers devices)", type, known);
    } else if (g_why_none[bi][0]) {
        cdf_error(CDF_ERR_NOT_FOUND, "device '%s': the %s backend found no device (%s)", name, type, g_why_none[bi]);
    } else {
        cdf_error(CDF_ERR_NOT_FOUND, "no backend '%s' is loaded (autoload off? call cdf_backend_load(\"%s\"))", type, type);
    }
    return NULL;
}

cdf_device *cdf_device_default(void) {
    const char *want = getenv("CDIFFUSERS_DEVICE");
    if (want && *want) return cdf_device_get(want);
    if (g_n_devices == 0) {
        cdf_error(CDF_ERR_NOT_FOUND, "no backend is loaded (CDIFFUSERS_BACKEND_AUTOLOAD=0? call cdf_backend_load(\"cpu\"))");
        return NULL;
    }
    return &g_devices[0];
}

const char *cdf_device_name(const cdf_device *dev) { return dev ? dev->name : "(null)"; }

/* The queue-level sync (exec/ wraps it as the public cdf_device_synchronize, flushing
 * deferred ops first). */
cdf_status cdf_backend_device_synchronize(cdf_device *dev) { return dev->iface->synchronize(dev); }

cdf_status cdf_backend_synchronize_all(void) {
    pthread_mutex_lock(&g_lock);
    const int n = g_n_devices;
    pthread_mutex_unlock(&g_lock);
    cdf_status first = CDF_OK;
    for (int i = 0; i < n; i++) {
        cdf_device *d = &g_devices[i];
        if (first == CDF_OK) first = d->iface->synchronize(d);
        else d->iface->wait_idle(d); /* keep the first message; this device's error stays queued */
    }
    return first;
}

void cdf_device_memory_stats(const cdf_device *dev, cdf_memory_stats *out) {
    memset(out, 0, sizeof *out);
    if (!dev) return;
    out->current_bytes = atomic_load(&((cdf_device *)dev)->current_bytes);
    out->peak_bytes = atomic_load(&((cdf_device *)dev)->peak_bytes);
    out->limit_bytes = atomic_load(&((cdf_device *)dev)->limit_bytes);
    out->n_allocs = atomic_load(&((cdf_device *)dev)->n_allocs);
}

void cdf_device_reset_peak(cdf_device *dev) {
    if (dev) atomic_store(&dev->peak_bytes, atomic_load(&dev->current_bytes));
}

cdf_status cdf_device_set_memory_limit(cdf_device *dev, uint64_t bytes) {
    if (!dev) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_device_set_memory_limit: device is NULL");
    atomic_store(&dev->limit_bytes, bytes);
    return CDF_OK;
}

void cdf_device_set_threads(cdf_device *dev, int n) {
    if (dev && dev->iface->set_threads) dev->iface->set_threads(dev, n);
}

void cdf_device_queue_stats(const cdf_device *dev, cdf_queue_stats *out) {
    memset(out, 0, sizeof *out);
    if (dev && dev->iface->queue_stats) dev->iface->queue_stats(dev, out);
}

static void fmt_bytes(char *buf, size_t n, uint64_t b) {
    if (b >= (1ull << 30)) snprintf(buf, n, "%.2f GiB", b / 1073741824.0);
    else if (b >= (1ull << 20)) snprintf(buf, n, "%.2f MiB", b / 1048576.0);
    else if (b >= 1024) snprintf(buf, n, "%.1f KiB", b / 1024.0);
    else snprintf(buf, n, "%llu B", (unsigned long long)b);
}

cdf_status (*cdf_backend_pre_oom_hook)(void);

cdf_status cdf_device_alloc_on(cdf_device *dev, cdf_stream *st, size_t nbytes, void **out) {
    *out = NULL;
    uint64_t limit = atomic_load(&dev->limit_bytes);
    unsigned long long cur = atomic_load(&dev->current_bytes);
    bool drained = false;
    for (;;) {
        if (limit && (nbytes > limit || cur > limit - nbytes) && !drained && dev->iface->wait_idle) {
            /* buffers the host already released may still be held by deferred or queued ops:
             * run the deferred ones and let the queue run dry (which frees them) before
             * declaring out-of-memory */
            if (cdf_backend_pre_oom_hook) (void)cdf_backend_pre_oom_hook();
            dev->iface->wait_idle(dev);
            drained = true;
            cur = atomic_load(&dev->current_bytes);
            continue;
        }
        if (limit && (nbytes > limit || cur > limit - nbytes)) {
            char req[32], used[32], lim[32], type[32];
            snprintf(type, sizeof type, "%s", dev->iface->name);
            for (char *p = type; *p; p++) *p = (char)toupper((unsigned char)*p);
            fmt_bytes(req, sizeof req, nbytes);
            fmt_bytes(used, sizeof used, cur);
            fmt_bytes(lim, sizeof lim, limit);
            return cdf_error(CDF_ERR_OUT_OF_MEMORY,
                             "out of memory on %s: cannot allocate %s (%zu bytes); %s of the %s budget is in use "
                             "(raise CDIFFUSERS_%s_MEMORY_LIMIT / --device-memory, or use --offload model)",
                             dev->name, req, nbytes, used, lim, type);
        }
        if (atomic_compare_exchange_weak(&dev->current_bytes, &cur, cur + nbytes)) break;
    }
    void *p = st && dev->iface->stream_alloc ? dev->iface->stream_alloc(dev, st, nbytes) : dev->iface->alloc(dev, nbytes);
    if (!p && nbytes) {
        atomic_fetch_sub(&dev->current_bytes, nbytes);
        char req[32];
        fmt_bytes(req, sizeof req, nbytes);
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of memory on %s: the system refused %s (%zu bytes)", dev->name, req,
                         nbytes);
    }
    unsigned long long now = cur + nbytes, peak = atomic_load(&dev->peak_bytes);
    while (now > peak && !atomic_compare_exchange_weak(&dev->peak_bytes, &peak, now)) {}
    atomic_fetch_add(&dev->n_allocs, 1);
    *out = p;
    return CDF_OK;
}

cdf_status cdf_device_alloc(cdf_device *dev, size_t nbytes, void **out) { return cdf_device_alloc_on(dev, NULL, nbytes, out); }

void cdf_device_free(cdf_device *dev, void *ptr, size_t nbytes) {
    if (!ptr && !nbytes) return;
    dev->iface->free(dev, ptr, nbytes);
    atomic_fetch_sub(&dev->current_bytes, nbytes);
}

cdf_status cdf_device_enqueue(cdf_device *dev, cdf_node *node) { return dev->iface->enqueue(dev, node); }

bool cdf_device_supports_node(const cdf_node *node) {
    cdf_device *dev = node && node->dst ? node->dst->storage->dev : NULL;
    return dev && dev->iface->supports && dev->iface->supports(dev, node);
}

/* ---- transfers -------------------------------------------------------------------------------- */
cdf_status cdf_device_buffer_set(cdf_device *dev, void *dst, const void *src, size_t nbytes) {
    if (!nbytes) return CDF_OK;
    cdf_status s = dev->iface->buffer_set(dev, dst, src, nbytes);
    return s == CDF_OK ? s : cdf_error_prefix("copy of %zu bytes to %s: ", nbytes, dev->name);
}

void *cdf_device_staged_new(cdf_device *dev, const void *src, cdf_dtype src_dt, cdf_dtype dt, size_t n) {
    const char *e = getenv("CDIFFUSERS_HOST_STAGING");
    if (!dev->iface->staged_new || (e && !strcmp(e, "0"))) {
        cdf_error(CDF_ERR_UNSUPPORTED, "%s has no host-staged memory%s", dev->name, dev->iface->staged_new ? " (CDIFFUSERS_HOST_STAGING=0)" : "");
        return NULL;
    }
    return dev->iface->staged_new(dev, src, src_dt, dt, n);
}

cdf_status cdf_device_staged_to_device(cdf_device *dev, void *staged, void *dst, size_t nbytes) {
    if (!dev->iface->staged_to_device) return cdf_error(CDF_ERR_UNSUPPORTED, "%s has no host-staged memory", dev->name);
    cdf_status s = dev->iface->staged_to_device(dev, staged, dst, nbytes);
    return s == CDF_OK ? s : cdf_error_prefix("copy of %zu staged bytes to %s: ", nbytes, dev->name);
}

void cdf_device_staged_free(cdf_device *dev, void *staged) {
    if (staged && dev->iface->staged_free) dev->iface->staged_free(dev, staged);
}

void cdf_device_transfer_stats(const cdf_device *dev, cdf_transfer_stats *out) {
    memset(out, 0, sizeof *out);
    if (dev && dev->iface->transfer_stats) dev->iface->transfer_stats(dev, out);
}

cdf_status cdf_device_buffer_set_replica(cdf_device *dev, int replica, void *dst, const void *src, size_t nbytes) {
    if (!dev->iface->buffer_set_replica || replica < 0 || replica >= cdf_device_replicas(dev))
        return cdf_error(CDF_ERR_UNSUPPORTED, "copy to replica %d of %s: the device runs %d replica(s)", replica, dev->name,
                         cdf_device_replicas(dev));
    if (!nbytes) return CDF_OK;
    cdf_status s = dev->iface->buffer_set_replica(dev, replica, dst, src, nbytes);
    return s == CDF_OK ? s : cdf_error_prefix("copy of %zu bytes to %s (replica %d): ", nbytes, dev->name, replica);
}

bool cdf_backend_runs_replicas(const char *name) {
    if (!name) return false;
    const char *colon = strchr(name, ':');
    const size_t tl = colon ? (size_t)(colon - name) : strlen(name);
    for (size_t i = 0; i < sizeof k_builtin / sizeof *k_builtin; i++)
        if (strlen(k_builtin[i]->name) == tl && strncmp(k_builtin[i]->name, name, tl) == 0) return k_builtin[i]->set_replicas != NULL;
    return false;
}

int cdf_device_replicas(const cdf_device *dev) { return dev && dev->iface->replicas ? dev->iface->replicas(dev) : 1; }

cdf_status cdf_device_open_replicas(const char *name, int n, cdf_device **out) {
    if (!out) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_device_open_replicas: out is NULL");
    *out = NULL;
    if (!name) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_device_open_replicas: name is NULL");
    const char *colon = strchr(name, ':');
    const size_t tl = colon ? (size_t)(colon - name) : strlen(name);
    if (colon && strcmp(colon, ":0") != 0)
        return cdf_error(CDF_ERR_INVALID_ARG, "tensor parallelism in one process runs on devices 0..N-1 of a backend: name "
                         "the backend ('%.*s'), not device '%s'", (int)tl, name, name);
    const cdf_backend_iface *iface = NULL;
    for (size_t i = 0; i < sizeof k_builtin / sizeof *k_builtin; i++)
        if (strlen(k_builtin[i]->name) == tl && strncmp(k_builtin[i]->name, name, tl) == 0) iface = k_builtin[i];
    if (!iface) {
        cdf_device *d = cdf_device_get(name); /* its error names what exists */
        if (!d) return cdf_last_status();
        iface = d->iface;
    }
    if (!iface->set_replicas)
        return cdf_error(CDF_ERR_UNSUPPORTED, "the %s backend cannot run one program over several devices in one process "
                         "(tensor parallelism on it runs over MPI: mpirun -np %d cdiffusers ... --tp %d)", iface->name, n, n);
    if (n < 1) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_device_open_replicas: %d devices", n);
    bool loaded = false;
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < g_n_backends; i++) loaded |= g_backends[i] == iface;
    pthread_mutex_unlock(&g_lock);
    if (!loaded) CDF_TRY(iface->set_replicas(NULL, n)); /* before it opens its devices */
    char dev0[48];
    snprintf(dev0, sizeof dev0, "%s:0", iface->name);
    cdf_device *d = cdf_device_get(dev0);
    if (!d) return cdf_last_status();
    CDF_TRY(iface->set_replicas(d, n));
    *out = d;
    return CDF_OK;
}

cdf_status cdf_device_buffer_get(cdf_device *dev, void *dst, const void *src, size_t nbytes) {
    if (!nbytes) return CDF_OK;
    cdf_status s = dev->iface->buffer_get(dev, dst, src, nbytes);
    return s == CDF_OK ? s : cdf_error_prefix("copy of %zu bytes from %s: ", nbytes, dev->name);
}

void *cdf_device_host_alloc(cdf_device *dev, size_t nbytes) {
    void *p = dev->iface->host_alloc ? dev->iface->host_alloc(dev, nbytes ? nbytes : 1) : malloc(nbytes ? nbytes : 1);
    if (!p) cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory: staging buffer of %zu bytes for %s", nbytes, dev->name);
    return p;
}

void cdf_device_host_free(cdf_device *dev, void *ptr, size_t nbytes) {
    if (!ptr) return;
    if (dev->iface->host_free) dev->iface->host_free(dev, ptr, nbytes);
    else free(ptr);
}

/* ---- streams and events ----------------------------------------------------------------------- */
/* Each device's copy stream, made on first use (by index into g_devices). */
static cdf_stream *g_copy_stream[MAX_DEVICES];
static bool g_copy_stream_tried[MAX_DEVICES];

cdf_stream *cdf_device_copy_stream(cdf_device *dev) {
    if (!dev || !dev->iface->stream_new || env_off("CDIFFUSERS_COPY_STREAM")) return NULL;
    const int i = (int)(dev - g_devices);
    pthread_mutex_lock(&g_lock);
    if (!g_copy_stream_tried[i]) {
        g_copy_stream_tried[i] = true;
        g_copy_stream[i] = dev->iface->stream_new(dev);
        if (!g_copy_stream[i]) /* the compute stream carries the copies, as it always could */
            fprintf(stderr, "cdiffusers: %s: no copy stream (%s); transfers use the compute stream\n", dev->name,
                    cdf_last_error());
    }
    cdf_stream *st = g_copy_stream[i];
    pthread_mutex_unlock(&g_lock);
    return st;
}

cdf_event *cdf_device_event_new(cdf_device *dev) {
    if (!dev->iface->event_new) {
        cdf_error(CDF_ERR_UNSUPPORTED, "%s: the %s backend has no events", dev->name, dev->iface->name);
        return NULL;
    }
    return dev->iface->event_new(dev);
}

void cdf_device_event_free(cdf_device *dev, cdf_event *ev) {
    if (ev) dev->iface->event_free(dev, ev);
}

cdf_status cdf_device_event_record(cdf_device *dev, cdf_event *ev, cdf_stream *st) {
    return dev->iface->event_record_on(dev, ev, st);
}

cdf_status cdf_device_stream_wait(cdf_device *dev, cdf_stream *st, cdf_event *ev) {
    return dev->iface->stream_wait_event(dev, st, ev);
}

void cdf_device_event_wait(cdf_device *dev, cdf_event *ev) { dev->iface->event_host_wait(dev, ev); }

/* ---- listing ---------------------------------------------------------------------------------- */
int cdf_device_count(void) { return g_n_devices; }
cdf_device *cdf_device_at(int i) { return (i >= 0 && i < g_n_devices) ? &g_devices[i] : NULL; }

cdf_status cdf_device_get_info(const cdf_device *dev, cdf_device_info *out) {
    if (!dev || !out) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_device_get_info: NULL argument");
    memset(out, 0, sizeof *out);
    snprintf(out->type, sizeof out->type, "%s", dev->iface->name);
    if (dev->iface->device_info) dev->iface->device_info(dev, out);
    out->host_visible = dev->iface->host_visible ? dev->iface->host_visible(dev) : false;
    out->quantized_matmul = cdf_device_runs_quantized(dev);
    out->values = dev->iface->values;
    return CDF_OK;
}

/* the addressable kind runs GGUF blocks (each backend's CDF_OP_MATMUL_Q); the values kind has no
 * such op and dequantizes at load */
bool cdf_device_runs_quantized(const cdf_device *dev) { return dev && !dev->iface->values; }

#ifndef CDF_HAVE_PJRT
int cdf_pjrt_list_plugins(cdf_pjrt_plugin_info *out, int cap) {
    (void)out;
    (void)cap;
    return 0;
}
void cdf_pjrt_cache_folder(char *out, size_t cap) {
    if (cap) out[0] = 0;
}
#endif

int cdf_backend_compiled_count(void) { return (int)(sizeof k_builtin / sizeof *k_builtin); }
const char *cdf_backend_compiled_name(int i) {
    return (i >= 0 && i < cdf_backend_compiled_count()) ? k_builtin[i]->name : NULL;
}
const char *cdf_backend_why_no_device(int i) {
    if (i < 0 || i >= cdf_backend_compiled_count()) return NULL;
    for (int j = 0; j < g_n_backends; j++)
        if (g_backends[j] == k_builtin[i]) return NULL;
    if (g_why_none[i][0]) return g_why_none[i];
    return k_builtin[i]->lazy ? "loaded when a device of it is asked for (--device NAME)" : "not loaded (CDIFFUSERS_BACKEND_AUTOLOAD=0?)";
}
