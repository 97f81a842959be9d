/* Kernel dispatch: the compute policy and the ISA fallback chain for matmul, conv2d, attention and
 * the layer / RMS norms.
 *
 * Compute policy (the speed issue's default compute): a matmul / conv whose weights (B / w) are
 * bf16 and whose activations (A / x) are f32 rounds the activations to bf16 (round-to-nearest-
 * even) at its input and accumulates in f32; everything else (f32 weights: the "exact" path,
 * norms, softmax, the residual stream) stays f32. Every ISA level computes this same policy:
 *   avx512_bf16  oneDNN's bf16 kernels (AVX512-BF16 / AMX), A rounded by oneDNN's reorder
 *   avx512       A rounded here, bf16 weights widened to f32 (exact), oneDNN f32 kernels
 *   avx2         the own GEMM (gemm_bf16w.h): A rounded as it is packed, weights kept bf16 and
 *                widened in registers, f32 FMA; what it does not take goes as avx512
 *   generic      A rounded here, the plain C reference kernel (bf16 A is exact in it)
 * so the levels differ only in summation order. The level is the CPU's best, capped by
 * CDIFFUSERS_ISA (kernels/cpu_features.h).
 *
 * Attention (kernels.h, cdf_k_attention_args): q, k and v all bf16 (a model writes them so when
 * the projections feeding the attention have bf16 weights) compute S = Q K^T from the bf16 values
 * with f32 sums, the softmax in f32, and round P to bf16 before O = P V with f32 sums (PyTorch's
 * CPU flash attention for bf16). Every level computes that:
 *   avx512_bf16  vdpbf16ps for both products (K^T and V packed in key / dim pairs)
 *   avx512, avx2 the f32 kernels on the widened (exact) values, P rounded to bf16 in registers
 *   generic      the reference kernel, P rounded the same way
 * Any other q/k/v dtypes: f32 throughout, as before. */
#ifndef CDF_KERNELS_DISPATCH_H
#define CDF_KERNELS_DISPATCH_H

#include "kernels/cpu_features.h"
#include "kernels/kernels.h"

/* Fast paths (fast_onednn.c, always defined; they decline without oneDNN): return CDF_OK and
 * set *handled = true if they ran the op; *handled = false (and CDF_OK) to decline. */
cdf_status cdf_k_matmul_fast(const cdf_k_matmul_args *a, bool *handled);
cdf_status cdf_k_conv2d_fast(const cdf_k_conv2d_args *a, bool *handled);
/* Vectorised flash attention (attention_fast.c): same contract (and policy) as cdf_k_attention;
 * declines (handled = false) below AVX2 or for operands it does not take. */
cdf_status cdf_k_attention_fast(const cdf_k_attention_args *a, bool *handled);
/* The same at a given level (for tests and benchmarks; capped at the CPU's native level). */
cdf_status cdf_k_attention_fast_at(const cdf_k_attention_args *a, cdf_k_isa isa, bool *handled);
/* The AMX body of the bf16 policy at the avx512_bf16 level (attention_fast.c): 1 on where AMX is
 * usable (the default), 0 off (the vdpbf16ps body), -1 back to CDIFFUSERS_AMX_ATTENTION ("0" =
 * off). For tests and A/B measurements; not thread-safe against running attention. */
void cdf_k_attention_amx_set(int on);
/* How many calls the AMX body has run in this process (tests: that it really ran). */
int64_t cdf_k_attention_amx_runs(void);

/* Layer norm and RMS norm 16 rows at a time in AVX-512 lanes (norm_fast.c): the same contract as
 * cdf_k_layer_norm / cdf_k_rms_norm and their results bit for bit; decline (handled = false)
 * below the avx512 level, for f16 in/out, rows longer than 16384, or when turned off
 * (CDIFFUSERS_FAST_NORM=0, or cdf_k_norm_fast_set: 1 on, 0 off, -1 back to the environment). */
cdf_status cdf_k_layer_norm_fast(void *out, cdf_dtype out_dt, const void *in, cdf_dtype in_dt, int64_t rows, int64_t cols,
                                 float eps, const void *weight, const void *bias, cdf_dtype wdt, bool *handled);
cdf_status cdf_k_rms_norm_fast(void *out, cdf_dtype out_dt, const void *in, cdf_dtype in_dt, int64_t rows, int64_t cols,
                               float eps, const void *weight, cdf_dtype wdt, bool *handled);
void cdf_k_norm_fast_set(int on);
/* LayerNorm without weight or bias of nrows <= 16 contiguous rows of in (f32 or bf16, or any
 * float type through the reference) into out (f32 [nrows, cols]), on the calling thread, with the
 * values cdf_k_layer_norm_dispatch stores for them: the head of a fused chain (fused_elementwise.c).
 * lanes: cdf_k_layer_norm_rows_scratch(cols) bytes, 64-byte aligned, for the AVX-512 body. */
void cdf_k_layer_norm_rows(float *out, const void *in, cdf_dtype in_dt, int nrows, int64_t cols, float eps, void *lanes);
size_t cdf_k_layer_norm_rows_scratch(int64_t cols);

cdf_status cdf_k_matmul_dispatch(const cdf_k_matmul_args *a);
cdf_status cdf_k_conv2d_dispatch(const cdf_k_conv2d_args *a);
cdf_status cdf_k_attention_dispatch(const cdf_k_attention_args *a);
/* the fast norms where they take the call, else the reference kernels (kernels.h) */
cdf_status cdf_k_layer_norm_dispatch(void *out, cdf_dtype out_dt, const void *in, cdf_dtype in_dt, int64_t rows,
                                     int64_t cols, float eps, const void *weight, const void *bias, cdf_dtype wdt);
cdf_status cdf_k_rms_norm_dispatch(void *out, cdf_dtype out_dt, const void *in, cdf_dtype in_dt, int64_t rows,
                                   int64_t cols, float eps, const void *weight, cdf_dtype wdt);
/* Attention calls run by this process's cpu kernels so far: out[0] with f32 q (the exact f32
 * path), out[1] with bf16 q (the bf16 attention policy). For tests: that a model hands its
 * attention bf16 q, k, v exactly where its projections compute in bf16. */
void cdf_k_attention_counts(int64_t out[2]);
/* true when the ISA level is generic (CDIFFUSERS_ISA=generic, CDIFFUSERS_KERNELS=reference or a
 * CPU below AVX2): only the reference kernels run */
bool cdf_k_reference_only(void);

#endif
