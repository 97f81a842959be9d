/* Private helpers for dtype conversion, shared by the host conversions (core/dtype.c) and the
 * copy kernel (kernels/reference_data.c) so that both convert identically. */
#ifndef CDF_CORE_DTYPE_INTERNAL_H
#define CDF_CORE_DTYPE_INTERNAL_H

#include <math.h>
#include <stdint.h>

/* Float -> integer: toward zero, saturated to [lo, hi], NaN -> 0 (a C cast would be undefined
 * behaviour there; torch leaves it unspecified). */
static inline int64_t cdf_trunc_sat(double d, double lo, double hi) {
    if (isnan(d)) return 0;
    if (d <= lo) return (int64_t)lo;
    if (d >= hi) return hi >= 9223372036854775807.0 ? INT64_MAX : (int64_t)hi;
    return (int64_t)d;
}

#endif
