/* cdiffusers — backends and devices.
 *
 * Backends register device types when the library loads (autoload). Set
 * CDIFFUSERS_BACKEND_AUTOLOAD=0 to turn that off and load one explicitly with cdf_backend_load()
 * (cdiffusers/backend.h).
 * A device executes ops on an in-order asynchronous queue: an op call returns at once with a
 * tensor whose data is pending; reading it on the host (or cdf_device_synchronize) waits, and an
 * error raised by a queued kernel surfaces at that sync with its message.
 *
 * Device memory is accounted (current and peak bytes) and can be capped with
 * CDIFFUSERS_<TYPE>_MEMORY_LIMIT (e.g. CDIFFUSERS_CPU_MEMORY_LIMIT=8G) or
 * cdf_device_set_memory_limit(). Exceeding the cap fails the allocation with
 * CDF_ERR_OUT_OF_MEMORY and a message naming the request and the budget; the device stays usable. */
#ifndef CDIFFUSERS_DEVICE_H
#define CDIFFUSERS_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cdiffusers/backend.h" /* the backends that provide the devices */
#include "cdiffusers/error.h"
#include "cdiffusers/pjrt.h"    /* the pjrt backend's plugins and cache */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cdf_device cdf_device;

/* The device "type" or "type:index" (e.g. "cpu", "cpu:0"); NULL if its backend is not loaded.
 * Devices live for the whole process. */
cdf_device *cdf_device_get(const char *name);
/* The default device: $CDIFFUSERS_DEVICE when set (a name as cdf_device_get takes, e.g. "pjrt"),
 * else the first device of the first registered backend; NULL (with the error) if none. */
cdf_device *cdf_device_default(void);
const char *cdf_device_name(const cdf_device *dev);

/* Every registered device, in order of preference (the default is the first). */
int cdf_device_count(void);
cdf_device *cdf_device_at(int i); /* NULL if out of range */

typedef struct cdf_device_info {
    char type[32];           /* the backend, e.g. "cpu" */
    char description[160];   /* e.g. the CPU model and thread count, or the GPU's name */
    char features[256];      /* space-separated, e.g. "isa=avx512_bf16 avx2 fma avx512f amx" */
    uint64_t memory_bytes;   /* total memory the device can use (0 = unknown) */
    bool host_visible;       /* device memory is host memory (cdf_tensor_wrap allowed) */
    bool quantized_matmul;   /* multiplies GGUF blocks as stored (else they are dequantized at load) */
    bool values;             /* buffers are immutable values (pjrt), not addressable memory */
} cdf_device_info;
cdf_status cdf_device_get_info(const cdf_device *dev, cdf_device_info *out);

/* One process driving n devices of one backend as the n replicas of every program (tensor
 * parallelism without MPI: cdf_dist_init_devices). name: a backend ("pjrt") or its device 0.
 * Returns device 0, which from then on stands for devices 0..n-1: each of its buffers holds a
 * value per device (the same bytes on every one unless set per replica), every program runs on
 * all n with an all_reduce over them inside it, and host reads see device 0's value. Call it
 * before anything is allocated on the backend (the pjrt backend opens the XLA CPU plugin with n
 * devices when it has not loaded yet). Errors: CDF_ERR_UNSUPPORTED (a backend without it: cpu,
 * cuda), CDF_ERR_INVALID_ARG (fewer than n devices, buffers already exist), the backend's load
 * error. (Whether a backend can: cdf_backend_runs_replicas, cdiffusers/backend.h.) */
cdf_status cdf_device_open_replicas(const char *name, int n, cdf_device **out);
/* n for a device opened so, else 1. */
int cdf_device_replicas(const cdf_device *dev);

/* Wait for every queued op; returns (and clears) the first error a queued kernel raised. */
cdf_status cdf_device_synchronize(cdf_device *dev);

typedef struct cdf_memory_stats {
    uint64_t current_bytes; /* allocated now (including buffers whose release is still queued) */
    uint64_t peak_bytes;    /* highest current_bytes since the last reset */
    uint64_t limit_bytes;   /* 0 = unlimited */
    uint64_t n_allocs;      /* allocations served since the process started */
} cdf_memory_stats;

void cdf_device_memory_stats(const cdf_device *dev, cdf_memory_stats *out);
void cdf_device_reset_peak(cdf_device *dev);
/* 0 removes the cap. Lowering it below current usage is allowed (later allocations fail). */
cdf_status cdf_device_set_memory_limit(cdf_device *dev, uint64_t bytes);
/* Parse "8G", "512M", "1.5GiB", "123456" into bytes; -1 if malformed. */
int64_t cdf_parse_bytes(const char *s);

/* Kernel threads the device may use (0 = all cores). */
void cdf_device_set_threads(cdf_device *dev, int n);

/* Queue counters, for tests and observability. */
typedef struct cdf_queue_stats {
    uint64_t enqueued;  /* ops submitted */
    uint64_t completed; /* ops finished (successfully or not) */
    uint64_t syncs;     /* host waits */
} cdf_queue_stats;
void cdf_device_queue_stats(const cdf_device *dev, cdf_queue_stats *out);

#ifdef __cplusplus
}
#endif
#endif
