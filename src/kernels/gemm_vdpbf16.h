/* Own AVX512-BF16 (vdpbf16ps) GEMM core (kernels/gemm_vdpbf16.c): C[M, N] (f32) = A[M, K] x B^T
 * (+ bias) where each thread fills a CDF_VDP_NC-column slab of B (all of K) into the packed pair
 * layout, multiplies every row of A over it while it sits in L2/L3, and moves to the next slab:
 * no layer-sized copy of the weights exists. Two fills: the Q8_0 decode (kernels/matmul_quant.c)
 * and the bf16 weights' repack (here, cdf_k_gemm_vdp_bf16). Not a public header. */
#ifndef CDF_KERNELS_GEMM_VDPBF16_H
#define CDF_KERNELS_GEMM_VDPBF16_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"

/* GCC on x86-64 only (clang has no `#pragma GCC target`): elsewhere nothing below runs and
 * cdf_k_gemm_vdp_bf16 declines every call. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CDF_K_VDP_COMPILED 1
#endif

/* Micro-tile rows (A group) and columns (B panel), slab width (columns a thread fills at a time). */
enum { CDF_VDP_MR = 12, CDF_VDP_NR = 32, CDF_VDP_NC = 256 };

/* Writes columns [n0, n0 + CDF_VDP_NC) of op(B) (columns past N zero), all of K, into bp in the
 * slab layout: panel j (CDF_VDP_NR columns), k pair p at bp + (j * K / 2 + p) * CDF_VDP_NR, one
 * 32-bit word per column (bf16 of k = 2p low, 2p + 1 high). Runs on the GEMM's threads. */
typedef void (*cdf_k_vdp_fill)(const void *ctx, int64_t n0, uint32_t *bp);

typedef struct cdf_k_vdp_gemm_args {
    int64_t M, N, K;                /* N a multiple of CDF_VDP_NR, K of 32 */
    const void *a; cdf_dtype a_dt;  /* [M, K] f32 (rounded to bf16 as packed) or bf16, row stride lda */
    int64_t lda;
    cdf_k_vdp_fill fill; const void *fill_ctx;
    float *c; int64_t ldc;          /* [M, N], row stride ldc */
    const float *bias;              /* f32 [N] or NULL, added after the sum */
    bool amx;                       /* the AMX micro-kernel on the same slabs (cdf_k_amx_usable()) */
} cdf_k_vdp_gemm_args;

/* The micro-kernel the slab GEMM can run here: CDF_VDP_NONE (not an x86-64 GCC build, no
 * AVX512-BF16, the ISA level capped below avx512_bf16, or an AMX CPU where AMX is not usable:
 * there oneDNN's AMX kernels are the better choice), CDF_VDP_DPBF16 or CDF_VDP_AMX (AMX usable,
 * GCC 11+). What the bf16 and the Q8_0 paths both check, and what sets cdf_k_vdp_gemm_args.amx. */
typedef enum { CDF_VDP_NONE, CDF_VDP_DPBF16, CDF_VDP_AMX } cdf_k_vdp_kernel;
cdf_k_vdp_kernel cdf_k_vdp_micro_kernel(void);

/* Threads a run uses (at most one per slab) and the scratch it needs for them (packed A and one
 * slab + block buffer per thread). */
int cdf_k_vdp_threads(int64_t N);
size_t cdf_k_vdp_bytes(int64_t M, int64_t K, int nthr);
/* Runs g in one OpenMP region of nthr threads on buf (cdf_k_vdp_bytes). The CPU must have
 * AVX512-BF16 (the caller checks; AMX-BF16 too for g->amx). Each element's summation order
 * depends on K and g->amx only, not on the thread count or the fill: Q8_0 and bf16 weights of
 * the same values give the same bits. */
void cdf_k_vdp_run(const cdf_k_vdp_gemm_args *g, void *buf, int nthr);

/* ---- bf16 weights (the linear layers' case) ---------------------------------------------- */

/* true when cdf_k_gemm_vdp_bf16 takes x: bf16 B [N, K] (trans_b) shared by the batch, A f32 or
 * bf16 not transposed (batch items stacked as rows, 128 rows or more), C f32, alpha 1, beta 0,
 * bias f32/bf16 or none, N % 32 == 0, K % 32 == 0, B not transient (a quantized layer's decoded
 * panel); an AVX512-BF16 CPU at the avx512_bf16 ISA level (with AMX usable: the AMX
 * micro-kernel on the same slabs, where oneDNN 2.6's AMX kernels reach ~19% of the AMX peak
 * at these shapes); not switched off
 * (CDIFFUSERS_BF16_GEMM=0 or the setter). An epilogue is run after the product, as the oneDNN
 * path runs it (cdf_k_matmul_run_epilogue). */
bool cdf_k_gemm_vdp_bf16_supports(const cdf_k_matmul_args *x);
/* Its case but with fewer than 128 rows (batch * M; matrix-vector-like: oneDNN runs those faster).
 * The dispatch then runs oneDNN without a kept prepacked copy (as for a transient B): the weight
 * is read about once per call either way, and a copy would hold memory for these calls only
 * (FLUX.1's AdaLN modulation weights, M = 1: ~0.7 GB of bf16 at width 2+4 blocks). */
bool cdf_k_gemm_vdp_bf16_skips_pack(const cdf_k_matmul_args *x);
/* Runs x when supported (*handled = true); otherwise, or when out of memory for its scratch,
 * *handled = false and nothing is written. */
cdf_status cdf_k_gemm_vdp_bf16(const cdf_k_matmul_args *x, bool *handled);
/* 1 on, 0 off, 2 also below 128 rows (tests), -1 back to CDIFFUSERS_BF16_GEMM (default on).
 * Not synchronised. */
void cdf_k_gemm_vdp_bf16_set(int on);
/* Calls it has run (for tests and benchmarks). */
int64_t cdf_k_gemm_vdp_bf16_calls(void);

#endif
