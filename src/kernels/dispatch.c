#include "kernels/dispatch.h"

#include <stdlib.h>
#include <string.h>

cdf_status cdf_k_matmul_fast(const cdf_k_matmul_args *a, bool *handled) __attribute__((weak));
cdf_status cdf_k_conv2d_fast(const cdf_k_conv2d_args *a, bool *handled) __attribute__((weak));

bool cdf_k_reference_only(void) {
    static int cached = -1;
    if (cached < 0) {
        const char *v = getenv("CDIFFUSERS_KERNELS");
        cached = v && strcmp(v, "reference") == 0;
    }
    return cached;
}

cdf_status cdf_k_matmul_dispatch(const cdf_k_matmul_args *a) {
    if (cdf_k_matmul_fast && !cdf_k_reference_only()) {
        bool handled = false;
        cdf_status s = cdf_k_matmul_fast(a, &handled);
        if (s != CDF_OK || handled) return s;
    }
    return cdf_k_matmul(a);
}

cdf_status cdf_k_conv2d_dispatch(const cdf_k_conv2d_args *a) {
    if (cdf_k_conv2d_fast && !cdf_k_reference_only()) {
        bool handled = false;
        cdf_status s = cdf_k_conv2d_fast(a, &handled);
        if (s != CDF_OK || handled) return s;
    }
    return cdf_k_conv2d(a);
}
