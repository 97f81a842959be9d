/* cdiffusers — the backends: the ones compiled in, the ones loaded (each provides devices:
 * cdiffusers/device.h). */
#ifndef CDIFFUSERS_BACKEND_H
#define CDIFFUSERS_BACKEND_H

#include <stdbool.h>

#include "cdiffusers/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Load (register) a built-in backend by name ("cpu"). Loading an already loaded backend is a
 * no-op returning CDF_OK; an unknown name gives CDF_ERR_NOT_FOUND listing the known ones. */
cdf_status cdf_backend_load(const char *name);
/* Number of registered backends and their names. */
int cdf_backend_count(void);
const char *cdf_backend_name(int i);

/* The backends compiled into this library, whether or not they found a device, and for one
 * that has none, why (e.g. "no driver"); NULL when it has devices. */
int cdf_backend_compiled_count(void);
const char *cdf_backend_compiled_name(int i);
const char *cdf_backend_why_no_device(int i);
/* Whether the backend of device `name` ("pjrt", "pjrt:0", "cpu") can run one program over n
 * devices as replicas (cdf_device_open_replicas), without loading it; false for an unknown name. */
bool cdf_backend_runs_replicas(const char *name);

#ifdef __cplusplus
}
#endif
#endif
