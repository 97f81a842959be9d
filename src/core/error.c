#include "error_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char tl_msg[2048];
static _Thread_local cdf_status tl_status = CDF_OK;

const char *cdf_last_error(void) { return tl_msg; }
cdf_status cdf_last_status(void) { return tl_status; }
void cdf_clear_error(void) {
    tl_msg[0] = 0;
    tl_status = CDF_OK;
}

const char *cdf_status_str(cdf_status s) {
    switch (s) {
    case CDF_OK: return "ok";
    case CDF_ERR_INVALID_ARG: return "invalid argument";
    case CDF_ERR_OUT_OF_MEMORY: return "out of memory";
    case CDF_ERR_IO: return "I/O error";
    case CDF_ERR_FORMAT: return "malformed file";
    case CDF_ERR_SHAPE: return "shape mismatch";
    case CDF_ERR_DTYPE: return "dtype error";
    case CDF_ERR_NOT_FOUND: return "not found";
    case CDF_ERR_UNSUPPORTED: return "unsupported";
    case CDF_ERR_DEVICE: return "device error";
    case CDF_ERR_INTERRUPTED: return "interrupted";
    case CDF_ERR_DIST: return "distributed error";
    case CDF_ERR_LIMIT: return "limit exceeded";
    case CDF_ERR_GRAPH_BREAK: return "graph break";
    case CDF_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

cdf_status cdf_error(cdf_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tl_msg, sizeof tl_msg, fmt, ap);
    va_end(ap);
    tl_status = s;
    return s;
}

cdf_status cdf_error_prefix(const char *fmt, ...) {
    char prefix[512], old[sizeof tl_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, tl_msg, sizeof old);
    size_t pl = strlen(prefix);
    if (pl >= sizeof tl_msg) pl = sizeof tl_msg - 1;
    memcpy(tl_msg, prefix, pl);
    size_t ol = strlen(old);
    if (pl + ol >= sizeof tl_msg) ol = sizeof tl_msg - 1 - pl;
    memcpy(tl_msg + pl, old, ol);
    tl_msg[pl + ol] = 0;
    return tl_status;
}
