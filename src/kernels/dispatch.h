/* Kernel dispatch: a fast path (oneDNN / AVX-512 / AMX) where one exists and applies, the
 * reference kernel otherwise. CDIFFUSERS_KERNELS=reference forces the reference kernels (the
 * fallback every test suite can be re-run with). */
#ifndef CDF_KERNELS_DISPATCH_H
#define CDF_KERNELS_DISPATCH_H

#include "kernels/kernels.h"

/* Fast paths: return CDF_OK and set *handled = true if they ran the op; *handled = false (and
 * CDF_OK) to decline (unsupported shape/dtype/CPU). Defined weakly: absent in a build = declined. */
cdf_status cdf_k_matmul_fast(const cdf_k_matmul_args *a, bool *handled);
cdf_status cdf_k_conv2d_fast(const cdf_k_conv2d_args *a, bool *handled);

cdf_status cdf_k_matmul_dispatch(const cdf_k_matmul_args *a);
cdf_status cdf_k_conv2d_dispatch(const cdf_k_conv2d_args *a);
/* true when CDIFFUSERS_KERNELS=reference */
bool cdf_k_reference_only(void);

#endif
