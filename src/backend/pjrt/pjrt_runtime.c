/* The PJRT runtime (pjrt_runtime.h): plugin discovery and loading, the client, buffers,
 * compile, serialize and execute. */
#include <ctype.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "backend/pjrt/pjrt_runtime.h"
#include "cdiffusers/device.h"
#include "core/error_internal.h"

#define ARGS(T, name) T name; memset(&name, 0, sizeof name); name.struct_size = T##_STRUCT_SIZE

/* ---- finding plugins ----------------------------------------------------------------------- */

/* The packages searched, in the order `--device pjrt` prefers them after the GPU check. */
static const struct {
    const char *package, *rel;
} k_packages[] = {
    {"xla_cpu_pjrt", "xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so"},
    {"xla_cuda13", "jax_plugins/xla_cuda13/xla_cuda_plugin.so"},
    {"libtpu", "libtpu/libtpu.so"},
};

/* Python package folders: scripts/install-deps.sh installs into the first (Debian's pip refuses
 * system-wide installs), then virtual environments and the usual site folders. */
static int site_dirs(char out[][512], int cap) {
    int n = 0;
    const char *env[] = {getenv("CDIFFUSERS_PJRT_SITE"), NULL};
    if (env[0] && *env[0] && n < cap) snprintf(out[n++], 512, "%s", env[0]);
    if (n < cap) snprintf(out[n++], 512, "/usr/local/lib/cdiffusers/python");
    const char *venv = getenv("VIRTUAL_ENV"), *home = getenv("HOME");
    char pat[8][512];
    int np = 0;
    if (venv && *venv) snprintf(pat[np++], 512, "%s/lib/python3*/site-packages", venv);
    if (home && *home) snprintf(pat[np++], 512, "%s/.local/lib/python3*/site-packages", home);
    snprintf(pat[np++], 512, "/usr/local/lib/python3*/dist-packages");
    snprintf(pat[np++], 512, "/usr/local/lib/python3*/site-packages");
    snprintf(pat[np++], 512, "/usr/lib/python3/dist-packages");
    snprintf(pat[np++], 512, "/opt/*/lib/python3*/site-packages");
    if (home && *home) snprintf(pat[np++], 512, "%s/.pyenv/versions/*/lib/python3*/site-packages", home);
    snprintf(pat[np++], 512, "/root/.pyenv/versions/*/lib/python3*/site-packages");
    for (int i = 0; i < np && n < cap; i++) {
        glob_t g;
        if (glob(pat[i], 0, NULL, &g) == 0) {
            for (size_t j = 0; j < g.gl_pathc && n < cap; j++) {
                bool dup = false;
                for (int k = 0; k < n; k++) dup |= strcmp(out[k], g.gl_pathv[j]) == 0;
                if (!dup) snprintf(out[n++], 512, "%s", g.gl_pathv[j]);
            }
        }
        globfree(&g);
    }
    return n;
}

int cdf_pjrt_find_plugins(cdf_pjrt_found *out, int cap) {
    int n = 0;
    const char *env = getenv("CDIFFUSERS_PJRT_PLUGIN");
    if (env && *env && n < cap) {
        snprintf(out[n].path, sizeof out[n].path, "%s", env);
        snprintf(out[n].package, sizeof out[n].package, "env");
        n++;
    }
    char dirs[16][512];
    int nd = site_dirs(dirs, 16);
    for (size_t k = 0; k < sizeof k_packages / sizeof *k_packages; k++) {
        for (int d = 0; d < nd && n < cap; d++) {
            char path[1024];
            snprintf(path, sizeof path, "%.900s/%s", dirs[d], k_packages[k].rel);
            if (access(path, R_OK) != 0) continue;
            bool dup = false;
            for (int i = 0; i < n; i++) dup |= strcmp(out[i].path, path) == 0;
            if (dup) continue;
            memcpy(out[n].path, path, sizeof path);
            snprintf(out[n].package, sizeof out[n].package, "%s", k_packages[k].package);
            n++;
            break; /* the first install of each package */
        }
    }
    return n;
}

bool cdf_pjrt_nvidia_driver_present(void) {
    if (access("/proc/driver/nvidia/version", R_OK) == 0) return true;
    void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
    if (h) dlclose(h);
    return h != NULL;
}

cdf_status cdf_pjrt_choose_plugin(cdf_pjrt_found *out) {
    cdf_pjrt_found f[8];
    int n = cdf_pjrt_find_plugins(f, 8);
    const char *env = getenv("CDIFFUSERS_PJRT_PLUGIN");
    if (env && *env) {
        *out = f[0];
        return CDF_OK;
    }
    const char *order[] = {cdf_pjrt_nvidia_driver_present() ? "xla_cuda13" : NULL, "xla_cpu_pjrt"};
    for (int o = 0; o < 2; o++) {
        for (int i = 0; order[o] && i < n; i++) {
            if (strcmp(f[i].package, order[o]) == 0) {
                *out = f[i];
                return CDF_OK;
            }
        }
    }
    return cdf_error(CDF_ERR_NOT_FOUND,
                     "no PJRT plugin found: set CDIFFUSERS_PJRT_PLUGIN=/path/plugin.so, or install the XLA CPU plugin "
                     "(bash scripts/install-deps.sh puts the xla-cpu-pjrt package in /usr/local/lib/cdiffusers/python; "
                     "also searched: $VIRTUAL_ENV, ~/.local and the system's Python site-packages)");
}

int cdf_pjrt_list_plugins(cdf_pjrt_plugin_info *out, int cap) {
    cdf_pjrt_found f[8], chosen;
    int n = cdf_pjrt_find_plugins(f, 8);
    const bool have_choice = cdf_pjrt_choose_plugin(&chosen) == CDF_OK;
    for (int i = 0; i < n && i < cap; i++) {
        cdf_pjrt_plugin_info *o = &out[i];
        memset(o, 0, sizeof *o);
        memcpy(o->path, f[i].path, sizeof o->path);
        snprintf(o->package, sizeof o->package, "%s", f[i].package);
        o->chosen = have_choice && strcmp(chosen.path, f[i].path) == 0;
        o->api_major = o->api_minor = -1;
        /* the version table only: GetPjrtApi initialises nothing (PJRT_Plugin_Initialize does) */
        void *dl = dlopen(f[i].path, RTLD_LAZY | RTLD_LOCAL);
        if (!dl) {
            snprintf(o->note, sizeof o->note, "cannot be loaded: %s", dlerror());
            continue;
        }
        const PJRT_Api *(*get)(void) = (const PJRT_Api *(*)(void))dlsym(dl, "GetPjrtApi");
        const PJRT_Api *api = get ? get() : NULL;
        if (!api) {
            snprintf(o->note, sizeof o->note, "not a PJRT plugin (no GetPjrtApi)");
        } else {
            o->api_major = api->pjrt_api_version.major_version;
            o->api_minor = api->pjrt_api_version.minor_version;
            if (o->api_major != PJRT_API_MAJOR)
                snprintf(o->note, sizeof o->note, "PJRT API major %d: cdiffusers speaks %d", o->api_major, PJRT_API_MAJOR);
            else if (!strcmp(f[i].package, "libtpu") && !o->chosen)
                snprintf(o->note, sizeof o->note, "found, not probed (set CDIFFUSERS_PJRT_PLUGIN to use it on a TPU VM)");
            else if (!o->chosen)
                snprintf(o->note, sizeof o->note, "found, not probed (CDIFFUSERS_PJRT_PLUGIN picks it)");
        }
        /* the plugin stays mapped: unloading a runtime with threads is not safe */
    }
    return n;
}

/* ---- errors -------------------------------------------------------------------------------- */

cdf_status cdf_pjrt_check(const cdf_pjrt *p, PJRT_Error *e, cdf_status code, const char *what) {
    if (!e) return CDF_OK;
    ARGS(PJRT_Error_Message_Args, m);
    m.error = e;
    p->api->PJRT_Error_Message(&m);
    cdf_status s = cdf_error(code, "%s: %.*s", what, (int)(m.message_size > 1500 ? 1500 : m.message_size), m.message);
    ARGS(PJRT_Error_Destroy_Args, d);
    d.error = e;
    p->api->PJRT_Error_Destroy(&d);
    return s;
}

#define CHECK(p, call, code, what) CDF_TRY(cdf_pjrt_check((p), (call), (code), (what)))

/* The plugin's own logging (absl, to stderr: "cpu_device_count set via create_options", a
 * warning about absl::InitializeLog) is quiet unless CDIFFUSERS_LOG asks for pjrt: stderr goes to
 * /dev/null around the calls that log, and TF_CPP_MIN_LOG_LEVEL quiets the rest. */
bool cdf_pjrt_log_on(void) {
    const char *log = getenv("CDIFFUSERS_LOG");
    return log && strstr(log, "pjrt");
}

static int quiet_begin(void) {
    if (cdf_pjrt_log_on()) return -1;
    fflush(stderr);
    int saved = dup(2), null = open("/dev/null", O_WRONLY);
    if (saved < 0 || null < 0) {
        if (saved >= 0) close(saved);
        if (null >= 0) close(null);
        return -1;
    }
    dup2(null, 2);
    close(null);
    return saved;
}

static void quiet_end(int saved) {
    if (saved < 0) return;
    dup2(saved, 2);
    close(saved);
}

/* ---- loading -------------------------------------------------------------------------------- */

static void copy_str(char *dst, size_t cap, const char *s, size_t n) {
    if (n >= cap) n = cap - 1;
    memcpy(dst, s, n);
    dst[n] = 0;
}

static void read_attributes(cdf_pjrt *p) {
    if (!p->api->PJRT_Plugin_Attributes) return;
    ARGS(PJRT_Plugin_Attributes_Args, a);
    if (p->api->PJRT_Plugin_Attributes(&a)) return; /* an error here only loses the versions */
    for (size_t i = 0; i < a.num_attributes; i++) {
        const PJRT_NamedValue *v = &a.attributes[i];
        if (v->name_size == strlen("stablehlo_current_version") && memcmp(v->name, "stablehlo_current_version", v->name_size) == 0 &&
            v->type == PJRT_NamedValue_kInt64List && v->value_size == 3)
            snprintf(p->stablehlo_version, sizeof p->stablehlo_version, "%lld.%lld.%lld",
                     (long long)v->int64_array_value[0], (long long)v->int64_array_value[1],
                     (long long)v->int64_array_value[2]);
        if (v->name_size == strlen("xla_version") && memcmp(v->name, "xla_version", v->name_size) == 0 && v->type == PJRT_NamedValue_kInt64)
            snprintf(p->xla_version, sizeof p->xla_version, "%lld", (long long)v->int64_value);
    }
}

cdf_status cdf_pjrt_open(const char *path, cdf_pjrt *p) {
    memset(p, 0, sizeof *p);
    snprintf(p->path, sizeof p->path, "%s", path);
    /* the plugin logs through absl to stderr: quiet unless CDIFFUSERS_LOG asks for pjrt */
    if (!cdf_pjrt_log_on()) setenv("TF_CPP_MIN_LOG_LEVEL", "2", 0);
    if (access(path, R_OK) != 0)
        return cdf_error(CDF_ERR_NOT_FOUND, "PJRT plugin '%s' does not exist or is unreadable (CDIFFUSERS_PJRT_PLUGIN)",
                         path);
    p->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!p->dl)
        return cdf_error(CDF_ERR_IO, "cannot load PJRT plugin '%s' (CDIFFUSERS_PJRT_PLUGIN): %s", path, dlerror());
    const PJRT_Api *(*get)(void) = (const PJRT_Api *(*)(void))dlsym(p->dl, "GetPjrtApi");
    if (!get) {
        dlclose(p->dl);
        p->dl = NULL;
        return cdf_error(CDF_ERR_FORMAT, "'%s' is not a PJRT plugin: it has no GetPjrtApi (CDIFFUSERS_PJRT_PLUGIN)", path);
    }
    p->api = get();
    if (!p->api || p->api->struct_size < offsetof(PJRT_Api, PJRT_Client_Create)) {
        dlclose(p->dl);
        p->dl = NULL;
        return cdf_error(CDF_ERR_FORMAT, "'%s': GetPjrtApi returned no usable table (CDIFFUSERS_PJRT_PLUGIN)", path);
    }
    p->api_major = p->api->pjrt_api_version.major_version;
    p->api_minor = p->api->pjrt_api_version.minor_version;
    if (p->api_major != PJRT_API_MAJOR) {
        cdf_status s = cdf_error(CDF_ERR_UNSUPPORTED,
                                 "PJRT plugin '%s' implements PJRT API %d.%d; cdiffusers speaks major version %d "
                                 "(CDIFFUSERS_PJRT_PLUGIN)", path, p->api_major, p->api_minor, PJRT_API_MAJOR);
        dlclose(p->dl);
        p->dl = NULL;
        return s;
    }
    /* the calls this backend uses must all be in the table */
    if (p->api->struct_size < offsetof(PJRT_Api, PJRT_Executable_GetCompiledMemoryStats)) {
        dlclose(p->dl);
        p->dl = NULL;
        return cdf_error(CDF_ERR_UNSUPPORTED, "PJRT plugin '%s' (API %d.%d) is too old: cdiffusers needs 0.%d or newer",
                         path, p->api_major, p->api_minor, 40);
    }
    ARGS(PJRT_Plugin_Initialize_Args, ia);
    int q = quiet_begin();
    PJRT_Error *ie = p->api->PJRT_Plugin_Initialize(&ia);
    quiet_end(q);
    cdf_status s = cdf_pjrt_check(p, ie, CDF_ERR_DEVICE, "initialising the PJRT plugin");
    if (s != CDF_OK) {
        cdf_error_prefix("%s: ", path);
        return s;
    }
    read_attributes(p);
    p->is_cpu = strstr(path, "cpu") != NULL;
    return CDF_OK;
}

/* ---- the client ------------------------------------------------------------------------------ */

/* CDIFFUSERS_PJRT_OPTIONS=key=value,...: an integer, true/false, or a string. */
static int parse_options(char *spec, PJRT_NamedValue *nv, int cap, char *why, size_t why_cap) {
    int n = 0;
    for (char *save = NULL, *tok = strtok_r(spec, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq || eq == tok) {
            snprintf(why, why_cap, "'%s' is not key=value", tok);
            return -1;
        }
        if (n >= cap) {
            snprintf(why, why_cap, "more than %d options", cap);
            return -1;
        }
        *eq = 0;
        const char *val = eq + 1;
        PJRT_NamedValue *v = &nv[n++];
        memset(v, 0, sizeof *v);
        v->struct_size = PJRT_NamedValue_STRUCT_SIZE;
        v->name = tok;
        v->name_size = strlen(tok);
        char *end;
        long long iv = strtoll(val, &end, 10);
        if (*val && !*end) {
            v->type = PJRT_NamedValue_kInt64;
            v->int64_value = iv;
            v->value_size = 1;
        } else if (*val && (strtof(val, &end), !*end)) { /* e.g. the GPU plugin's memory_fraction=0.5 */
            v->type = PJRT_NamedValue_kFloat;
            v->float_value = strtof(val, NULL);
            v->value_size = 1;
        } else if (!strcasecmp(val, "true") || !strcasecmp(val, "false")) {
            v->type = PJRT_NamedValue_kBool;
            v->bool_value = !strcasecmp(val, "true");
            v->value_size = 1;
        } else {
            v->type = PJRT_NamedValue_kString;
            v->string_value = val;
            v->value_size = strlen(val);
        }
    }
    return n;
}

cdf_status cdf_pjrt_client_create(cdf_pjrt *p, int cpu_devices) {
    PJRT_NamedValue nv[16];
    int n = 0;
    char spec[1024] = "", why[160] = "";
    const char *env = getenv("CDIFFUSERS_PJRT_OPTIONS");
    if (env) snprintf(spec, sizeof spec, "%s", env);
    if (*spec && (n = parse_options(spec, nv, 15, why, sizeof why)) < 0)
        return cdf_error(CDF_ERR_INVALID_ARG, "CDIFFUSERS_PJRT_OPTIONS=%s: %s", env, why);
    bool has_count = false;
    for (int i = 0; i < n; i++) has_count |= strcmp(nv[i].name, "cpu_device_count") == 0;
    if (p->is_cpu && !has_count) {
        /* the CPU client defaults to 4 devices and 4 worker threads even on 2 cores */
        PJRT_NamedValue *v = &nv[n++];
        memset(v, 0, sizeof *v);
        v->struct_size = PJRT_NamedValue_STRUCT_SIZE;
        v->name = "cpu_device_count";
        v->name_size = strlen(v->name);
        v->type = PJRT_NamedValue_kInt64;
        v->int64_value = cpu_devices > 0 ? cpu_devices : 1;
        v->value_size = 1;
    }
    ARGS(PJRT_Client_Create_Args, c);
    c.create_options = nv;
    c.num_options = (size_t)n;
    int q = quiet_begin();
    PJRT_Error *ce = p->api->PJRT_Client_Create(&c);
    quiet_end(q);
    CHECK(p, ce, CDF_ERR_DEVICE, "creating the PJRT client");
    p->client = c.client;

    ARGS(PJRT_Client_PlatformName_Args, pn);
    pn.client = p->client;
    if (!p->api->PJRT_Client_PlatformName(&pn)) copy_str(p->platform, sizeof p->platform, pn.platform_name, pn.platform_name_size);
    ARGS(PJRT_Client_PlatformVersion_Args, pv);
    pv.client = p->client;
    if (!p->api->PJRT_Client_PlatformVersion(&pv))
        copy_str(p->platform_version, sizeof p->platform_version, pv.platform_version, pv.platform_version_size);
    ARGS(PJRT_Client_AddressableDevices_Args, ad);
    ad.client = p->client;
    CHECK(p, p->api->PJRT_Client_AddressableDevices(&ad), CDF_ERR_DEVICE, "listing the PJRT devices");
    p->devices = (PJRT_Device **)ad.addressable_devices;
    p->n_devices = (int)ad.num_addressable_devices;
    return CDF_OK;
}

void cdf_pjrt_close(cdf_pjrt *p) {
    if (p->client) {
        ARGS(PJRT_Client_Destroy_Args, d);
        d.client = p->client;
        PJRT_Error *e = p->api->PJRT_Client_Destroy(&d);
        (void)cdf_pjrt_check(p, e, CDF_ERR_DEVICE, "destroying the PJRT client");
        p->client = NULL;
    }
    /* the plugin stays mapped: its threads and static destructors may still run at exit */
}

void cdf_pjrt_device_describe(const cdf_pjrt *p, int i, char *kind, size_t kind_cap, char *memories, size_t mem_cap) {
    kind[0] = memories[0] = 0;
    if (i < 0 || i >= p->n_devices) return;
    ARGS(PJRT_Device_GetDescription_Args, g);
    g.device = p->devices[i];
    if (p->api->PJRT_Device_GetDescription(&g)) return;
    ARGS(PJRT_DeviceDescription_Kind_Args, k);
    k.device_description = g.device_description;
    if (!p->api->PJRT_DeviceDescription_Kind(&k)) copy_str(kind, kind_cap, k.device_kind, k.device_kind_size);
    ARGS(PJRT_Device_AddressableMemories_Args, m);
    m.device = p->devices[i];
    if (p->api->PJRT_Device_AddressableMemories(&m)) return;
    for (size_t j = 0; j < m.num_memories; j++) {
        ARGS(PJRT_Memory_Kind_Args, mk);
        mk.memory = m.memories[j];
        if (p->api->PJRT_Memory_Kind(&mk)) continue;
        size_t used = strlen(memories);
        snprintf(memories + used, mem_cap - used, "%s%.*s", used ? " " : "", (int)mk.kind_size, mk.kind);
    }
}

/* ---- buffers ---------------------------------------------------------------------------------- */

PJRT_Buffer_Type cdf_pjrt_type(cdf_dtype dt) {
    switch (dt) {
    case CDF_F32: return PJRT_Buffer_Type_F32;
    case CDF_BF16: return PJRT_Buffer_Type_BF16;
    case CDF_F16: return PJRT_Buffer_Type_F16;
    case CDF_F64: return PJRT_Buffer_Type_F64;
    case CDF_I64: return PJRT_Buffer_Type_S64;
    case CDF_I32: return PJRT_Buffer_Type_S32;
    case CDF_U8: return PJRT_Buffer_Type_U8;
    default: return PJRT_Buffer_Type_INVALID;
    }
}

cdf_status cdf_pjrt_event_await(cdf_pjrt *p, PJRT_Event *ev, const char *what) {
    if (!ev) return CDF_OK;
    ARGS(PJRT_Event_Await_Args, a);
    a.event = ev;
    cdf_status s = cdf_pjrt_check(p, p->api->PJRT_Event_Await(&a), CDF_ERR_DEVICE, what);
    ARGS(PJRT_Event_Destroy_Args, d);
    d.event = ev;
    p->api->PJRT_Event_Destroy(&d);
    return s;
}

/* PJRT_Client_BufferFromHostBuffer onto a device (or a memory of it, e.g. pinned_host) with the
 * given host-buffer semantics; *done: the event that says the host bytes may be reused. */
static cdf_status buffer_from_host(cdf_pjrt *p, int device, PJRT_Memory *memory, const void *data, cdf_dtype dt, int ndim,
                                   const int64_t *dims, PJRT_HostBufferSemantics semantics, PJRT_Buffer **out,
                                   PJRT_Event **done) {
    *out = NULL;
    *done = NULL;
    PJRT_Buffer_Type t = cdf_pjrt_type(dt);
    if (t == PJRT_Buffer_Type_INVALID)
        return cdf_error(CDF_ERR_UNSUPPORTED, "pjrt: no PJRT element type for dtype %s", cdf_dtype_name(dt));
    ARGS(PJRT_Client_BufferFromHostBuffer_Args, a);
    a.client = p->client;
    a.data = data;
    a.type = t;
    a.dims = dims;
    a.num_dims = (size_t)ndim;
    a.host_buffer_semantics = semantics;
    if (memory) a.memory = memory;
    else a.device = p->devices[device];
    CHECK(p, p->api->PJRT_Client_BufferFromHostBuffer(&a), CDF_ERR_DEVICE, "pjrt: host-to-device copy");
    *out = a.buffer;
    *done = a.done_with_host_buffer;
    return CDF_OK;
}

cdf_status cdf_pjrt_upload(cdf_pjrt *p, int device, const void *data, cdf_dtype dt, int ndim, const int64_t *dims,
                           PJRT_Buffer **out) {
    PJRT_Event *done;
    CDF_TRY(buffer_from_host(p, device, NULL, data, dt, ndim, dims, PJRT_HostBufferSemantics_kImmutableOnlyDuringCall, out,
                             &done));
    /* kImmutableOnlyDuringCall: the host copy is done when the call returns; the event only
     * says so */
    return cdf_pjrt_event_await(p, done, "pjrt: host-to-device copy");
}

/* whether the plugin's table reaches member fn (an older plugin's table is shorter) */
#define HAS_CALL(p, fn) ((p)->api->struct_size >= offsetof(PJRT_Api, fn) + sizeof(void *) && (p)->api->fn)

cdf_status cdf_pjrt_upload_async(cdf_pjrt *p, int device, PJRT_Memory *memory, const void *data, cdf_dtype dt, int ndim,
                                 const int64_t *dims, PJRT_Buffer **out, PJRT_Event **done) {
    /* not kImmutableZeroCopy: the CPU plugin aliases 64-byte-aligned host memory then, and its
     * done event fires only when the buffer is destroyed (awaiting it earlier deadlocks). Until
     * the transfer completes, the CPU plugin copies on its own threads (measured: the call
     * returns in 12 ms for 256 MiB, the event fires 0.35 s later); below 100 KB it copies
     * during the call. */
    return buffer_from_host(p, device, memory, data, dt, ndim, dims, PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes,
                            out, done);
}

bool cdf_pjrt_event_ready(cdf_pjrt *p, PJRT_Event *ev) {
    if (!ev) return true;
    ARGS(PJRT_Event_IsReady_Args, a);
    a.event = ev;
    PJRT_Error *e = p->api->PJRT_Event_IsReady(&a);
    if (e) { /* cannot tell: the caller awaits it (which reports the error) */
        (void)cdf_pjrt_check(p, e, CDF_ERR_DEVICE, "pjrt: polling an event");
        return true;
    }
    return a.is_ready;
}

PJRT_Memory *cdf_pjrt_memory_of_kind(cdf_pjrt *p, int device, const char *kind) {
    if (device < 0 || device >= p->n_devices || !HAS_CALL(p, PJRT_Device_AddressableMemories) || !HAS_CALL(p, PJRT_Memory_Kind))
        return NULL;
    ARGS(PJRT_Device_AddressableMemories_Args, m);
    m.device = p->devices[device];
    if (cdf_pjrt_check(p, p->api->PJRT_Device_AddressableMemories(&m), CDF_ERR_DEVICE, "pjrt: device memories") != CDF_OK)
        return NULL;
    for (size_t j = 0; j < m.num_memories; j++) {
        ARGS(PJRT_Memory_Kind_Args, mk);
        mk.memory = m.memories[j];
        if (cdf_pjrt_check(p, p->api->PJRT_Memory_Kind(&mk), CDF_ERR_DEVICE, "pjrt: memory kind") != CDF_OK) continue;
        if (mk.kind_size == strlen(kind) && !memcmp(mk.kind, kind, mk.kind_size)) return m.memories[j];
    }
    return NULL;
}

bool cdf_pjrt_has_copy_to_memory(const cdf_pjrt *p) { return HAS_CALL(p, PJRT_Buffer_CopyToMemory); }

cdf_status cdf_pjrt_copy_to_memory(cdf_pjrt *p, PJRT_Buffer *b, PJRT_Memory *memory, PJRT_Buffer **out) {
    *out = NULL;
    if (!cdf_pjrt_has_copy_to_memory(p)) return cdf_error(CDF_ERR_UNSUPPORTED, "pjrt: the plugin has no PJRT_Buffer_CopyToMemory");
    ARGS(PJRT_Buffer_CopyToMemory_Args, a);
    a.buffer = b;
    a.dst_memory = memory;
    CHECK(p, p->api->PJRT_Buffer_CopyToMemory(&a), CDF_ERR_DEVICE, "pjrt: copy between memories");
    *out = a.dst_buffer;
    return CDF_OK;
}

cdf_status cdf_pjrt_download(cdf_pjrt *p, PJRT_Buffer *b, void *dst, size_t nbytes) {
    ARGS(PJRT_Buffer_ToHostBuffer_Args, q);
    q.src = b;
    CHECK(p, p->api->PJRT_Buffer_ToHostBuffer(&q), CDF_ERR_DEVICE, "pjrt: device-to-host copy");
    if (q.dst_size != nbytes)
        return cdf_error(CDF_ERR_INTERNAL, "pjrt: device-to-host copy of %zu bytes from a %zu-byte buffer", nbytes,
                         q.dst_size);
    ARGS(PJRT_Buffer_ToHostBuffer_Args, a);
    a.src = b;
    a.dst = dst;
    a.dst_size = nbytes;
    CHECK(p, p->api->PJRT_Buffer_ToHostBuffer(&a), CDF_ERR_DEVICE, "pjrt: device-to-host copy");
    return cdf_pjrt_event_await(p, a.event, "pjrt: device-to-host copy (or the computation that made the buffer)");
}

void cdf_pjrt_buffer_free(cdf_pjrt *p, PJRT_Buffer *b) {
    if (!b) return;
    ARGS(PJRT_Buffer_Destroy_Args, d);
    d.buffer = b;
    (void)cdf_pjrt_check(p, p->api->PJRT_Buffer_Destroy(&d), CDF_ERR_DEVICE, "pjrt: freeing a buffer");
}

cdf_status cdf_pjrt_buffer_await(cdf_pjrt *p, PJRT_Buffer *b) {
    ARGS(PJRT_Buffer_ReadyEvent_Args, r);
    r.buffer = b;
    CHECK(p, p->api->PJRT_Buffer_ReadyEvent(&r), CDF_ERR_DEVICE, "pjrt: waiting for a buffer");
    return cdf_pjrt_event_await(p, r.event, "pjrt: a queued computation");
}

/* ---- programs ------------------------------------------------------------------------------------ */

/* protobuf varint */
static size_t put_varint(uint8_t *b, size_t at, uint64_t v) {
    do {
        b[at++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v);
    return at;
}

/* a length-delimited field: tag, length, bytes (0 when it does not fit) */
static size_t put_bytes(uint8_t *b, size_t at, size_t cap, int field, const void *p, size_t n) {
    uint8_t hdr[16];
    size_t h = put_varint(hdr, 0, ((uint64_t)field << 3) | 2);
    h = put_varint(hdr, h, n);
    if (at + h + n > cap) return 0;
    memcpy(b + at, hdr, h);
    memcpy(b + at + h, p, n);
    return at + h + n;
}

/* XLA debug options as env_option_overrides (CompileOptionsProto field 7, a map<string,
 * OptionOverrideProto{string 1, bool 2, int64 3}>) from "key=value,key=value" */
static size_t put_overrides(uint8_t *b, size_t at, size_t cap, const char *spec) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", spec);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok && at; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq) continue;
        *eq = 0;
        const char *val = eq + 1;
        uint8_t v[160], e[320];
        size_t nv = 0;
        char *end;
        long long iv = strtoll(val, &end, 10);
        if (*val && !*end) {
            v[nv++] = 3 << 3;
            nv = put_varint(v, nv, (uint64_t)iv);
        } else if (!strcmp(val, "true") || !strcmp(val, "false")) {
            v[nv++] = 2 << 3;
            v[nv++] = !strcmp(val, "true");
        } else {
            nv = put_bytes(v, 0, sizeof v, 1, val, strlen(val));
        }
        size_t ne = put_bytes(e, 0, sizeof e, 1, tok, strlen(tok));
        ne = ne ? put_bytes(e, ne, sizeof e, 2, v, nv) : 0;
        at = ne ? put_bytes(b, at, cap, 7, e, ne) : 0;
    }
    return at;
}

size_t cdf_pjrt_compile_options(uint8_t *buf, size_t cap, int n_replicas, int n_partitions, const char *xla_flags) {
    /* CompileOptionsProto { executable_build_options (field 3) = ExecutableBuildOptionsProto {
     * num_replicas (4), num_partitions (5) }, env_option_overrides (7) } */
    uint8_t inner[32];
    size_t n = 0;
    inner[n++] = 4 << 3; /* field 4, varint */
    n = put_varint(inner, n, (uint64_t)(n_replicas > 0 ? n_replicas : 1));
    inner[n++] = 5 << 3;
    n = put_varint(inner, n, (uint64_t)(n_partitions > 0 ? n_partitions : 1));
    size_t m = put_bytes(buf, 0, cap, 3, inner, n);
    if (m && xla_flags && *xla_flags) m = put_overrides(buf, m, cap, xla_flags);
    return m;
}

cdf_status cdf_pjrt_compile(cdf_pjrt *p, const char *mlir, size_t len, const char *xla_flags, int n_replicas,
                            PJRT_LoadedExecutable **out) {
    /* more replicas than devices: refused here (the plugin's device assignment would fail) */
    if (n_replicas < 1 || n_replicas > p->n_devices)
        return cdf_error(CDF_ERR_INVALID_ARG, "pjrt: a program over %d replicas on a client of %d device(s)", n_replicas,
                         p->n_devices);
    uint8_t opts[1024];
    size_t no = cdf_pjrt_compile_options(opts, sizeof opts, n_replicas, 1, xla_flags);
    if (!no) return cdf_error(CDF_ERR_INVALID_ARG, "pjrt: compile options too long (%s)", xla_flags ? xla_flags : "");
    ARGS(PJRT_Program, prog);
    prog.code = (char *)mlir;
    prog.code_size = len;
    prog.format = "mlir";
    prog.format_size = 4;
    ARGS(PJRT_Client_Compile_Args, c);
    c.client = p->client;
    c.program = &prog;
    c.compile_options = (const char *)opts;
    c.compile_options_size = no;
    CHECK(p, p->api->PJRT_Client_Compile(&c), CDF_ERR_UNSUPPORTED, "the PJRT plugin refused the program");
    *out = c.executable;
    return CDF_OK;
}

static cdf_status get_executable(cdf_pjrt *p, PJRT_LoadedExecutable *e, PJRT_Executable **out) {
    ARGS(PJRT_LoadedExecutable_GetExecutable_Args, g);
    g.loaded_executable = e;
    CHECK(p, p->api->PJRT_LoadedExecutable_GetExecutable(&g), CDF_ERR_DEVICE, "pjrt: executable");
    *out = g.executable;
    return CDF_OK;
}

static void executable_release(cdf_pjrt *p, PJRT_Executable *x) {
    ARGS(PJRT_Executable_Destroy_Args, d);
    d.executable = x;
    (void)cdf_pjrt_check(p, p->api->PJRT_Executable_Destroy(&d), CDF_ERR_DEVICE, "pjrt: executable");
}

cdf_status cdf_pjrt_serialize(cdf_pjrt *p, PJRT_LoadedExecutable *e, char **bytes, size_t *len) {
    PJRT_Executable *x;
    CDF_TRY(get_executable(p, e, &x));
    ARGS(PJRT_Executable_Serialize_Args, s);
    s.executable = x;
    cdf_status st = cdf_pjrt_check(p, p->api->PJRT_Executable_Serialize(&s), CDF_ERR_DEVICE, "pjrt: serializing an executable");
    if (st == CDF_OK) {
        *bytes = malloc(s.serialized_bytes_size ? s.serialized_bytes_size : 1);
        if (!*bytes) st = cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (serialized executable)");
        else memcpy(*bytes, s.serialized_bytes, s.serialized_bytes_size);
        *len = s.serialized_bytes_size;
        if (s.serialized_executable_deleter) s.serialized_executable_deleter(s.serialized_executable);
    }
    executable_release(p, x);
    return st;
}

cdf_status cdf_pjrt_deserialize(cdf_pjrt *p, const char *bytes, size_t len, PJRT_LoadedExecutable **out) {
    ARGS(PJRT_Executable_DeserializeAndLoad_Args, d);
    d.client = p->client;
    d.serialized_executable = bytes;
    d.serialized_executable_size = len;
    CHECK(p, p->api->PJRT_Executable_DeserializeAndLoad(&d), CDF_ERR_FORMAT, "pjrt: loading a cached executable");
    *out = d.loaded_executable;
    return CDF_OK;
}

void cdf_pjrt_executable_free(cdf_pjrt *p, PJRT_LoadedExecutable *e) {
    if (!e) return;
    ARGS(PJRT_LoadedExecutable_Destroy_Args, d);
    d.executable = e;
    (void)cdf_pjrt_check(p, p->api->PJRT_LoadedExecutable_Destroy(&d), CDF_ERR_DEVICE, "pjrt: freeing an executable");
}

cdf_status cdf_pjrt_num_outputs(cdf_pjrt *p, PJRT_LoadedExecutable *e, size_t *n) {
    PJRT_Executable *x;
    CDF_TRY(get_executable(p, e, &x));
    ARGS(PJRT_Executable_NumOutputs_Args, a);
    a.executable = x;
    cdf_status s = cdf_pjrt_check(p, p->api->PJRT_Executable_NumOutputs(&a), CDF_ERR_DEVICE, "pjrt: executable outputs");
    *n = a.num_outputs;
    executable_release(p, x);
    return s;
}

cdf_status cdf_pjrt_compiled_memory(cdf_pjrt *p, PJRT_LoadedExecutable *e, cdf_pjrt_compiled_mem *out) {
    memset(out, 0, sizeof *out);
    if (p->api->struct_size < offsetof(PJRT_Api, PJRT_Executable_GetCompiledMemoryStats) + sizeof(void *) ||
        !p->api->PJRT_Executable_GetCompiledMemoryStats)
        return cdf_error(CDF_ERR_UNSUPPORTED, "pjrt: the plugin has no PJRT_Executable_GetCompiledMemoryStats");
    PJRT_Executable *x;
    CDF_TRY(get_executable(p, e, &x));
    ARGS(PJRT_Executable_GetCompiledMemoryStats_Args, a);
    a.executable = x;
    cdf_status s = cdf_pjrt_check(p, p->api->PJRT_Executable_GetCompiledMemoryStats(&a), CDF_ERR_UNSUPPORTED,
                                  "pjrt: the compiled program's memory stats");
    if (s == CDF_OK) {
        /* negative values (a plugin reporting "unknown") count as nothing */
        out->temp_bytes = a.temp_size_in_bytes > 0 ? (uint64_t)a.temp_size_in_bytes : 0;
        out->argument_bytes = a.argument_size_in_bytes > 0 ? (uint64_t)a.argument_size_in_bytes : 0;
        out->output_bytes = a.output_size_in_bytes > 0 ? (uint64_t)a.output_size_in_bytes : 0;
        out->alias_bytes = a.alias_size_in_bytes > 0 ? (uint64_t)a.alias_size_in_bytes : 0;
        out->code_bytes = a.generated_code_size_in_bytes > 0 ? (uint64_t)a.generated_code_size_in_bytes : 0;
        out->peak_bytes = a.peak_memory_in_bytes > 0 ? (uint64_t)a.peak_memory_in_bytes : 0;
    }
    executable_release(p, x);
    return s;
}

cdf_status cdf_pjrt_execute(cdf_pjrt *p, PJRT_LoadedExecutable *e, int n_dev, PJRT_Buffer *const *const *args,
                            size_t n_args, PJRT_Buffer **const *out, size_t n_out, PJRT_Event **done) {
    if (n_dev < 1 || n_dev > p->n_devices)
        return cdf_error(CDF_ERR_INTERNAL, "pjrt: a program run on %d devices of %d", n_dev, p->n_devices);
    for (int d = 0; d < n_dev; d++)
        for (size_t i = 0; i < n_args; i++)
            if (!args[d][i]) return cdf_error(CDF_ERR_INTERNAL, "pjrt: argument %zu of a program has no buffer (replica %d)", i, d);
    ARGS(PJRT_ExecuteOptions, o);
    ARGS(PJRT_LoadedExecutable_Execute_Args, x);
    x.executable = e;
    x.options = &o;
    x.argument_lists = args;
    x.num_devices = (size_t)n_dev;
    x.num_args = n_args;
    x.output_lists = out;
    x.device_complete_events = done;
    /* execute_device stays NULL: the executable's device assignment (replica d on pjrt:d,
     * checked by cdf_pjrt_check_assignment) */
    for (int d = 0; d < n_dev; d++)
        for (size_t i = 0; i < n_out; i++) out[d][i] = NULL;
    if (done)
        for (int d = 0; d < n_dev; d++) done[d] = NULL;
    CHECK(p, p->api->PJRT_LoadedExecutable_Execute(&x), CDF_ERR_DEVICE, "pjrt: running a program");
    return CDF_OK;
}

cdf_status cdf_pjrt_check_assignment(cdf_pjrt *p, PJRT_LoadedExecutable *e, int n_replicas) {
    ARGS(PJRT_LoadedExecutable_AddressableDevices_Args, a);
    a.executable = e;
    CHECK(p, p->api->PJRT_LoadedExecutable_AddressableDevices(&a), CDF_ERR_DEVICE, "pjrt: the devices of a program");
    if ((int)a.num_addressable_devices != n_replicas)
        return cdf_error(CDF_ERR_DEVICE, "pjrt: a program compiled for %d replicas runs on %zu devices", n_replicas,
                         a.num_addressable_devices);
    for (int d = 0; d < n_replicas; d++)
        if (a.addressable_devices[d] != p->devices[d])
            return cdf_error(CDF_ERR_DEVICE, "pjrt: the plugin placed replica %d of a program on another device than pjrt:%d", d, d);
    return CDF_OK;
}
