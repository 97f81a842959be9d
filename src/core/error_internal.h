/* Internal helpers for setting the thread-local error. */
#ifndef CDF_ERROR_INTERNAL_H
#define CDF_ERROR_INTERNAL_H
#include "cdiffusers/error.h"

#if defined(__GNUC__)
#define CDF_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define CDF_PRINTF(a, b)
#endif

/* Record status + formatted message; returns the status so callers can `return cdf_error(...)`. */
cdf_status cdf_error(cdf_status s, const char *fmt, ...) CDF_PRINTF(2, 3);
/* Prefix the current message with context ("loading transformer: " + old message). */
cdf_status cdf_error_prefix(const char *fmt, ...) CDF_PRINTF(1, 2);

#define CDF_TRY(expr)                                                                              \
    do {                                                                                           \
        cdf_status cdf_try_s_ = (expr);                                                            \
        if (cdf_try_s_ != CDF_OK) return cdf_try_s_;                                               \
    } while (0)

#endif
