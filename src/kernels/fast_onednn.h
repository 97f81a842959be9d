/* Fast matmul / conv2d on oneDNN (src/kernels/fast_onednn.c): the definitions of
 * cdf_k_matmul_fast / cdf_k_conv2d_fast that kernels/dispatch.c calls, plus a few controls and
 * counters for tests, benchmarks and the memory owner. Not a public header.
 *
 * What the fast paths do (everything else is declined, *handled = false, and the reference
 * kernel runs it):
 *  - matmul, f32 x f32 -> f32 ("exact" path): oneDNN f32 matmul, f32 throughout.
 *  - matmul with bf16 weights (b_dt == CDF_BF16): A is rounded to bf16 (round-to-nearest-even)
 *    at the matmul input, then bf16 x bf16 with f32 accumulation; C is f32 or bf16 (rounded
 *    once on store). This is NOT what the reference does (it keeps A in f32): it is the
 *    "default compute" of the speed work, and deliberately differs by A's bf16 rounding.
 *  - conv2d NCHW, f32 weights (f32 compute) or bf16 weights (input rounded to bf16, f32
 *    accumulation), f32 or bf16 output.
 *  - bias (f32/bf16), alpha, beta 0/1, transposes and leading dims / batch strides (0 =
 *    broadcast) as in cdf_k_matmul_args.
 *  - bf16 weights on a CPU (or a CDIFFUSERS_ISA level, kernels/cpu_features.h) without native
 *    bf16 kernels: f32 compute on the weights widened exactly to f32 (a reorder, prepacked like
 *    bf16 weights). A must then already be bf16 (the dispatch rounds it, so every level computes
 *    the same bf16 policy); an f32 A with bf16 weights is declined there. Likewise conv2d.
 * They decline when oneDNN is not built in, when the CPU or CDIFFUSERS_ISA is below AVX2+FMA,
 * for f16 operands, and when oneDNN would only offer its slow reference implementation for a
 * shape. oneDNN's ISA is capped to the CDIFFUSERS_ISA level (avx2 / avx512_core).
 *
 * Weight prepacking. Constant weights are reordered once into oneDNN's blocked layout and the
 * copy is kept in the prepack cache shared with the own GEMM (kernels/pack_cache.h: its
 * lifetime, checksum and cap), keyed by (data pointer, user layout, target layout):
 *  - matmul: only bf16 B with one matrix for the whole batch (batch stride 0 or batch 1);
 *    other B (f32, or per-batch) is never cached: with >= 1024 rows (M) it is reordered per
 *    call, with fewer it is handed to oneDNN as it is;
 *  - conv2d: always (conv weights are module parameters).
 * Past the cap (CDIFFUSERS_PREPACK_MB), weights are reordered per call instead. Weights made
 * per call (decoded quantized panels, cdf_k_matmul_fast_filled) are written by their maker
 * straight into the primitive's layout: neither cached nor reordered.
 *
 * Threading: one mutex guards the primitive cache and is held while a primitive runs (oneDNN's shared
 * scratchpad is not safe for concurrent execution). oneDNN (Debian build) uses the same
 * libgomp OpenMP runtime as the rest of the library, so its parallel regions share our thread
 * count (omp_get_max_threads) instead of adding a second pool. */
#ifndef CDF_KERNELS_FAST_ONEDNN_H
#define CDF_KERNELS_FAST_ONEDNN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/dispatch.h"

typedef struct cdf_k_fast_info {
    bool available;              /* oneDNN built in and initialised, CPU (and oneDNN's ISA cap,
                                  * ONEDNN_MAX_CPU_ISA) allow AVX2+FMA at least */
    bool avx2_fma, avx512_core;  /* CPU + OS state (cpuid, xgetbv) */
    bool avx512_bf16, amx_bf16;  /* bf16 dot-product instructions / AMX tiles (cpuid + OS state) */
    bool amx_permitted;          /* arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) succeeded */
    bool bf16_supported;         /* the bf16 matmul/conv paths may run (CPU and oneDNN's ISA cap) */
    char onednn_version[32];     /* "2.6.3", or "" without oneDNN */
    char onednn_isa[48];         /* oneDNN's effective ISA, e.g. "avx512_core_bf16" */
    char level[16];              /* the kernels' ISA level (cdf_k_isa_name of cdf_k_isa_level) */
} cdf_k_fast_info;
/* Initialises the fast paths on first use (idempotent, thread-safe) and describes them. */
void cdf_k_fast_get_info(cdf_k_fast_info *out);

typedef struct cdf_k_fast_stats {
    int64_t matmul_handled, matmul_declined, conv_handled, conv_declined;
    int64_t primitives;      /* cached primitive entries, including "declined" ones */
    int64_t packed_weights;  /* weights currently held prepacked */
    int64_t packed_bytes;    /* their bytes */
    int64_t packs, repacks;  /* first prepack reorders; repacks = checksum changed at a known address */
    int64_t unpacked_reorders; /* per-call weight reorders (prepack cap reached or not eligible) */
    int64_t direct_fills;    /* weights written by the caller straight into the primitive's layout */
    char last_impl[64];      /* oneDNN implementation of the last primitive run, e.g. "brg:avx512_core_bf16" */
} cdf_k_fast_stats;
void cdf_k_fast_get_stats(cdf_k_fast_stats *out);
void cdf_k_fast_reset_stats(void);

/* Weights written by the caller into the primitive's own layout (no reorder): op(B)'s element
 * (k, n) goes to byte offset off_k[k] + off_n[n] of dst, as a dt value. Every blocked layout's
 * offset is such a sum; its padding is already zero when the fill is called. */
typedef struct cdf_k_fast_b_layout {
    int64_t K, N;                 /* op(B) [K, N] */
    const int64_t *off_k, *off_n; /* [K], [N] */
    cdf_dtype dt;                 /* CDF_BF16, or CDF_F32 (bf16 values widened: the exact reorder) */
    int64_t k_run;                /* off_k[k + i] = off_k[k] + i * element size for i < k_run and k a
                                   * multiple of k_run: K (each n's values contiguous), 2 (oneDNN's
                                   * bf16 k pairs) or 1 */
} cdf_k_fast_b_layout;
typedef cdf_status (*cdf_k_fast_b_fill)(void *ctx, void *dst, const cdf_k_fast_b_layout *l);
/* cdf_k_matmul_fast for a batch-1 x whose B (x->b unused) has bf16 values that `fill` writes
 * into the primitive's weight buffer: the same primitive and the same weight values as
 * cdf_k_matmul_fast on those values in x's B layout, so the same result bit for bit, without the
 * per-call reorder of B. Declines (*handled = false, fill not called) where cdf_k_matmul_fast
 * would, and for weight layouts it cannot describe by offsets; a fill's error is returned. */
cdf_status cdf_k_matmul_fast_filled(const cdf_k_matmul_args *x, cdf_k_fast_b_fill fill, void *ctx, bool *handled);

/* Drop every cache: primitives, prepacked weights (every kernel's), workspaces. */
void cdf_k_fast_clear(void);
/* Called after each new oneDNN primitive (a call that can construct oneDNN's lazily built
 * statics, whose destructors exit() runs): the cpu backend sets it to re-register its
 * at-exit drain, so that the drain runs before those destructors (cpu_backend.c). */
void cdf_k_fast_set_new_primitive_hook(void (*hook)(void));

#endif
