/* Kernel dispatch: with CDIFFUSERS_KERNELS=fast, a fast path (oneDNN) where one applies and
 * the reference kernel otherwise; by default (or CDIFFUSERS_KERNELS=reference) the reference
 * kernels run everything. */
#ifndef CDF_KERNELS_DISPATCH_H
#define CDF_KERNELS_DISPATCH_H

#include "kernels/kernels.h"

/* Fast paths (fast_onednn.c, always defined; they decline without oneDNN): return CDF_OK and
 * set *handled = true if they ran the op; *handled = false (and CDF_OK) to decline. */
cdf_status cdf_k_matmul_fast(const cdf_k_matmul_args *a, bool *handled);
cdf_status cdf_k_conv2d_fast(const cdf_k_conv2d_args *a, bool *handled);

cdf_status cdf_k_matmul_dispatch(const cdf_k_matmul_args *a);
cdf_status cdf_k_conv2d_dispatch(const cdf_k_conv2d_args *a);
/* false only when CDIFFUSERS_KERNELS=fast */
bool cdf_k_reference_only(void);

#endif
