/* The PJRT runtime: a plugin loaded at run time (dlopen, no link-time dependency) and the few
 * calls of pjrt_c_api.h the backend needs, each turning the plugin's PJRT_Error into a cdf_error
 * that carries the plugin's message. Nothing here knows nodes or tensors: the backend
 * (pjrt_backend.c) and the program builder (pjrt_program.c) sit above it.
 *
 * The ABI rule every call follows: zero the args struct and set struct_size from the header this
 * file is built with (the 0.81 header of the xla-cpu-pjrt package); newer plugins accept the
 * older, smaller structs. A plugin of another major version is refused at load. Calls the plugin
 * would abort on rather than fail (empty compile options, argument counts that do not match) are
 * validated here before the call. */
#ifndef CDF_BACKEND_PJRT_RUNTIME_H
#define CDF_BACKEND_PJRT_RUNTIME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cdiffusers/dtype.h"
#include "cdiffusers/error.h"
#include "pjrt_c_api.h"

/* ---- finding plugins ---- */

/* Where a plugin comes from: CDIFFUSERS_PJRT_PLUGIN, or the installed Python packages searched
 * in order (xla_plugins/xla_cpu_pjrt, jax_plugins/xla_cuda13, libtpu). */
typedef struct cdf_pjrt_found {
    char path[1024];
    char package[32]; /* "xla_cpu_pjrt", "xla_cuda13", "libtpu", or "env" */
} cdf_pjrt_found;

/* Every plugin found (up to cap), CDIFFUSERS_PJRT_PLUGIN first when set; returns the count. */
int cdf_pjrt_find_plugins(cdf_pjrt_found *out, int cap);
/* The plugin `--device pjrt` opens: CDIFFUSERS_PJRT_PLUGIN if set, else the GPU plugin where an
 * NVIDIA driver is present, else the CPU plugin. CDF_ERR_NOT_FOUND naming the places searched. */
cdf_status cdf_pjrt_choose_plugin(cdf_pjrt_found *out);
/* Whether an NVIDIA driver is present (/proc/driver/nvidia or libcuda.so.1 loadable). */
bool cdf_pjrt_nvidia_driver_present(void);

/* CDIFFUSERS_LOG names pjrt: the plugin's own logging, each compile, the cache's counts at exit. */
bool cdf_pjrt_log_on(void);

/* ---- a loaded plugin and its client ---- */

typedef struct cdf_pjrt {
    void *dl;
    const PJRT_Api *api;
    char path[1024];
    int api_major, api_minor;
    char stablehlo_version[32]; /* the plugin's stablehlo_current_version, "" if unknown */
    char xla_version[32];
    PJRT_Client *client;
    char platform[32], platform_version[128];
    int n_devices;
    PJRT_Device **devices; /* addressable devices (owned by the client) */
    bool is_cpu;           /* the XLA CPU plugin (create options cpu_device_count apply) */
} cdf_pjrt;

/* dlopen the plugin, check its API major, initialise it (never for libtpu unless asked: the
 * caller decides by calling this at all). Errors name the path and CDIFFUSERS_PJRT_PLUGIN. */
cdf_status cdf_pjrt_open(const char *path, cdf_pjrt *p);
/* Create the client: create options from CDIFFUSERS_PJRT_OPTIONS (key=value,...; integers,
 * floats, booleans, strings), cpu_device_count defaulting to `cpu_devices` on the CPU plugin. */
cdf_status cdf_pjrt_client_create(cdf_pjrt *p, int cpu_devices);
void cdf_pjrt_close(cdf_pjrt *p);

/* Describe device i: its kind and the kinds of its memories (space separated). */
void cdf_pjrt_device_describe(const cdf_pjrt *p, int i, char *kind, size_t kind_cap, char *memories, size_t mem_cap);

/* The plugin's error -> cdf_error(code, "<what>: <plugin message>"); destroys it. CDF_OK for NULL. */
cdf_status cdf_pjrt_check(const cdf_pjrt *p, PJRT_Error *e, cdf_status code, const char *what);

/* ---- buffers ---- */

PJRT_Buffer_Type cdf_pjrt_type(cdf_dtype dt); /* PJRT_Buffer_Type_INVALID when it has none */
/* Host -> device: a new buffer of dtype dt and dims holding a copy of data (the call returns when
 * data may be reused). */
cdf_status cdf_pjrt_upload(cdf_pjrt *p, int device, const void *data, cdf_dtype dt, int ndim, const int64_t *dims,
                           PJRT_Buffer **out);
/* Host -> device asynchronously (kImmutableUntilTransferCompletes): data must stay unchanged and
 * allocated until *done has fired (cdf_pjrt_event_ready / cdf_pjrt_event_await; it carries the
 * transfer's error). memory: a memory of the device (its pinned_host, ...) or NULL: device's
 * default. */
cdf_status cdf_pjrt_upload_async(cdf_pjrt *p, int device, PJRT_Memory *memory, const void *data, cdf_dtype dt, int ndim,
                                 const int64_t *dims, PJRT_Buffer **out, PJRT_Event **done);
/* Whether the event has fired (without waiting; an event that cannot be polled counts as fired:
 * awaiting it then reports). */
bool cdf_pjrt_event_ready(cdf_pjrt *p, PJRT_Event *ev);
/* Device d's memory of that kind ("device", "pinned_host", "unpinned_host"), NULL when it has
 * none (or the plugin cannot list memories). */
PJRT_Memory *cdf_pjrt_memory_of_kind(cdf_pjrt *p, int device, const char *kind);
/* PJRT_Buffer_CopyToMemory: a new buffer in memory holding b's value, made asynchronously (its
 * ready event, and the programs reading it, carry the copy's error). */
bool cdf_pjrt_has_copy_to_memory(const cdf_pjrt *p);
cdf_status cdf_pjrt_copy_to_memory(cdf_pjrt *p, PJRT_Buffer *b, PJRT_Memory *memory, PJRT_Buffer **out);
/* Device -> host: the whole buffer (nbytes must be its size), waiting for it. */
cdf_status cdf_pjrt_download(cdf_pjrt *p, PJRT_Buffer *b, void *dst, size_t nbytes);
void cdf_pjrt_buffer_free(cdf_pjrt *p, PJRT_Buffer *b);
/* Wait until the buffer's value is computed; the error of the computation that made it. */
cdf_status cdf_pjrt_buffer_await(cdf_pjrt *p, PJRT_Buffer *b);

/* ---- programs ---- */

/* The serialized CompileOptionsProto for n_replicas x n_partitions (never empty: an empty one
 * aborts the CPU plugin), with XLA debug options "key=value,..." (NULL: none) as its
 * env_option_overrides. Returns its length (<= cap; 0 when it does not fit). */
size_t cdf_pjrt_compile_options(uint8_t *buf, size_t cap, int n_replicas, int n_partitions, const char *xla_flags);
/* Compile StableHLO MLIR text with those options, for n_replicas replicas (1..the client's
 * devices; replica d runs on device d). */
cdf_status cdf_pjrt_compile(cdf_pjrt *p, const char *mlir, size_t len, const char *xla_flags, int n_replicas,
                            PJRT_LoadedExecutable **out);
/* Whether the executable runs its n_replicas replicas on devices 0..n_replicas-1 in order (what
 * cdf_pjrt_execute's argument and output lists assume). */
cdf_status cdf_pjrt_check_assignment(cdf_pjrt *p, PJRT_LoadedExecutable *e, int n_replicas);
/* Serialize / load a compiled executable (the disk cache). *bytes is malloc'd. */
cdf_status cdf_pjrt_serialize(cdf_pjrt *p, PJRT_LoadedExecutable *e, char **bytes, size_t *len);
cdf_status cdf_pjrt_deserialize(cdf_pjrt *p, const char *bytes, size_t len, PJRT_LoadedExecutable **out);
void cdf_pjrt_executable_free(cdf_pjrt *p, PJRT_LoadedExecutable *e);
/* The number of outputs the executable returns (what execute's out array must hold). */
cdf_status cdf_pjrt_num_outputs(cdf_pjrt *p, PJRT_LoadedExecutable *e, size_t *n);
/* What a compiled program needs of device memory beside its arguments and outputs
 * (PJRT_Executable_GetCompiledMemoryStats; the CPU plugin reports it): temp_bytes, the
 * temporaries live while it runs, is what the device's peak adds for a running program.
 * CDF_ERR_UNSUPPORTED (all zeros) where the plugin does not report it. */
typedef struct cdf_pjrt_compiled_mem {
    uint64_t temp_bytes, argument_bytes, output_bytes, alias_bytes, code_bytes, peak_bytes;
} cdf_pjrt_compiled_mem;
cdf_status cdf_pjrt_compiled_memory(cdf_pjrt *p, PJRT_LoadedExecutable *e, cdf_pjrt_compiled_mem *out);
/* Run on n_dev devices (the executable's replicas, n_dev its replica count), asynchronously:
 * args[d][0..n_args) -> out[d][0..n_out) on device d (out filled with new buffers; n_out must be
 * the executable's output count, cdf_pjrt_num_outputs). done (when not NULL) receives n_dev
 * events of the run's completion on each device, for cdf_pjrt_event_await. */
cdf_status cdf_pjrt_execute(cdf_pjrt *p, PJRT_LoadedExecutable *e, int n_dev, PJRT_Buffer *const *const *args,
                            size_t n_args, PJRT_Buffer **const *out, size_t n_out, PJRT_Event **done);/* Wait for an event and destroy it; the error of what it marks. */
cdf_status cdf_pjrt_event_await(cdf_pjrt *p, PJRT_Event *ev, const char *what);

#endif
