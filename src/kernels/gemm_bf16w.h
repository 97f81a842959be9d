/* Own GEMM for bf16 weights with f32 compute on AVX2 + FMA (kernels/gemm_bf16w.c): the bf16
 * policy's matmul (A rounded to bf16, exact products, f32 accumulation) without an f32 copy of
 * the weights. Not a public header. */
#ifndef CDF_KERNELS_GEMM_BF16W_H
#define CDF_KERNELS_GEMM_BF16W_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"

/* true when cdf_k_gemm_bf16w takes x: bf16 B shared by the batch (sb = 0 or batch 1, either
 * layout), f32 or bf16 A (any layout, rounded to bf16 here), f32/bf16 C and bias, beta 0 or 1,
 * a well-formed non-empty problem, an x86-64 CPU with AVX2 + FMA. */
bool cdf_k_gemm_bf16w_supports(const cdf_k_matmul_args *x);
/* Runs x (and its epilogue) when supported: CDF_OK with *handled = true; otherwise (or when out
 * of memory for its buffers) *handled = false and nothing is written. Uses the CPU's AVX2 + FMA
 * whatever CDIFFUSERS_ISA says: the dispatch decides when to call it. */
cdf_status cdf_k_gemm_bf16w(const cdf_k_matmul_args *x, bool *handled);

/* Its packed weights (kept in the shared prepack cache, kernels/pack_cache.h). */
typedef struct cdf_k_gemm_bf16w_stats {
    int64_t packs, repacks, hits, unpacked_calls; /* counters */
    int64_t packed_weights, packed_bytes;         /* the cache now */
} cdf_k_gemm_bf16w_stats;
void cdf_k_gemm_bf16w_get_stats(cdf_k_gemm_bf16w_stats *out);
void cdf_k_gemm_bf16w_reset_stats(void);

#endif
