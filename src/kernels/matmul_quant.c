/* Matmul on GGUF-quantized weights: decode a panel of weight rows, multiply, next panel.
 *
 * Why panels of decoded rows and not a kernel on the blocks: the decoded panel goes through
 * the same matmul as a plain weight (oneDNN / the ISA chain), so a quantized layer computes bit
 * for bit what its dequantized file computes, and the panel (about 128 MiB) is the
 * only unpacked copy: the model's weights stay quantized. Decoding costs O(N*K) against the
 * product's O(M*N*K), negligible at the DiT's M of 1000-4000 tokens.
 *
 * Where oneDNN runs a bf16 panel (above the AVX2 level), the rows are decoded straight into the
 * primitive's own weight layout (cdf_k_matmul_fast_filled): a plain panel would be reordered
 * into that layout on every call (bf16 weights are reordered once and kept; a panel is
 * overwritten by the next), a second pass over the panel. Elsewhere (f32 panels, the AVX2 and
 * generic levels, a layout the fill does not handle) the plain panel goes through the dispatch.
 *
 * The exception: Q8_0 weights decoded to bf16 at 128 <= M < 1024 on AVX512-BF16 (no AMX) run an
 * own vdpbf16ps GEMM that decodes column slabs into its packed layout (qg_*, below): at those
 * token counts the panels' round trip through DRAM weighs more than the multiply's own losses.
 * Same decoded values and products, f32 sums in another order: not bit for bit the panels.
 * Opt-in (CDIFFUSERS_Q8_INT8=1, AVX512-VNNI without AMX): an int8 GEMM on int8-quantized A (qi_*,
 * below), faster than bf16 weights but with A's quantization error. */
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cdiffusers/io.h"
#include "core/error_internal.h"
#include "core/host_memory.h"
#include "kernels/cpu_features.h"
#include "kernels/dequant_blocks.h"
#include "kernels/dispatch.h"
#include "kernels/fast_onednn.h"
#include "kernels/gemm_vdpbf16.h"
#include "kernels/kernels.h"
#include "kernels/pack_cache.h"
#include "kernels/reference_internal.h"

/* About 128 MiB per panel: every layer of SD3.5-M and FLUX.1 (the largest, a single block's fused
 * linear1, is 21504 x 3072) decodes to bf16 in one. Why so large: a panel narrower than the layer
 * writes a strided slice of C, and oneDNN 2.6 then runs its older gemm:jit kernel instead of
 * brgemm (ONEDNN_VERBOSE: FLUX's Q8_0 matmuls 10-15% slower than its bf16 ones at 16 Mi values a
 * panel). The panel lives in oneDNN's weight workspace (direct decode) or the kept buffer below. */
#define PANEL_BYTES_DEFAULT ((size_t)128 << 20)
static size_t g_panel_bytes_limit = PANEL_BYTES_DEFAULT;

void cdf_k_matmul_q_set_panel_bytes(size_t bytes) { g_panel_bytes_limit = bytes ? bytes : PANEL_BYTES_DEFAULT; }

/* The panel buffer is kept between calls: a fresh 32-64 MiB allocation per layer per forward is
 * a fresh mmap whose every page faults on first touch. One buffer is cached (the backend's
 * queue runs one matmul at a time; a concurrent caller allocates its own) and kept for the
 * process's life: at most one panel, about 128 MiB. */
static pthread_mutex_t g_panel_lock = PTHREAD_MUTEX_INITIALIZER;
static void *g_panel;
static size_t g_panel_bytes;

/* A buffer of at least bytes; *have says how large it is (to give it back). */
static void *panel_take(size_t bytes, size_t *have) {
    pthread_mutex_lock(&g_panel_lock);
    void *p = g_panel;
    *have = g_panel_bytes;
    g_panel = NULL, g_panel_bytes = 0;
    pthread_mutex_unlock(&g_panel_lock);
    if (p && *have >= bytes) return p;
    cdf_host_free_large(p, *have);
    *have = bytes;
    return cdf_host_alloc_large(bytes); /* kept for reuse: core/host_memory.h */
}

/* p holds bytes; the larger of it and a buffer cached meanwhile is kept. */
static void panel_give(void *p, size_t bytes) {
    pthread_mutex_lock(&g_panel_lock);
    if (g_panel_bytes > bytes) {
        pthread_mutex_unlock(&g_panel_lock);
        cdf_host_free_large(p, bytes);
        return;
    }
    void *old = g_panel;
    const size_t old_bytes = g_panel_bytes;
    g_panel = p, g_panel_bytes = bytes;
    pthread_mutex_unlock(&g_panel_lock);
    cdf_host_free_large(old, old_bytes);
}

/* Rows [n0, n0 + np) of the quantized weights, decoded. */
typedef struct q_rows {
    const uint8_t *w; /* the layer's first row */
    uint32_t qtype;
    int64_t be, bb, row_bytes, n0, np, K; /* be, bb: elements and bytes per block */
} q_rows;

/* bad: 2 = out of memory, 1 = a row failed to decode */
static cdf_status decode_error(const q_rows *q, int bad) {
    if (bad & 2)
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "cdf_k_matmul_q: cannot allocate a decode buffer for rows of %lld values",
                         (long long)q->K);
    return cdf_error(CDF_ERR_INTERNAL, "cdf_k_matmul_q: decoding %s rows %lld..%lld failed", cdf_ggml_type_name(q->qtype),
                     (long long)q->n0, (long long)(q->n0 + q->np));
}

/* Decodes the rows into a plain panel [np, K] of w_dt (bf16: rounded to nearest even), with the
 * per-block decoder every backend shares (kernels/dequant_blocks.h, bit-exact against gguf-py). */
static cdf_status decode_rows(const q_rows *q, void *dst, cdf_dtype w_dt) {
    const int64_t np = q->np, K = q->K;
    const cdf_dq_store store = w_dt == CDF_BF16 ? CDF_DQ_STORE_BF16 : CDF_DQ_STORE_F32;
    const size_t wsz = cdf_dtype_size(w_dt);
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad) if (np * K > 65536)
    for (int64_t r = 0; r < np; r++)
        if (!cdf_k_dequant_store_blocks(q->qtype, q->w + (q->n0 + r) * q->row_bytes, K / q->be, (char *)dst + (size_t)(r * K) * wsz,
                                        store))
            bad = 1;
    return bad ? decode_error(q, bad) : CDF_OK;
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) /* clang: no `#pragma GCC target` */
#include <immintrin.h>
#define Q_HAVE_AVX512 1
/* The AVX-512 half of the direct decode, for oneDNN's bf16 layouts that keep a tile's 32 rows side
 * by side (k_run 2, the blocked pair layout: each k pair of the tile is 128 contiguous bytes;
 * k_run 1, plain [K, N]: each k is 64). Why: the tile used to go out 2 or 4 bytes at a time
 * (32 scalar copies per k or k pair) after a Q8_0 decode that ran in the
 * AVX2 clone (target_clones' "arch=skylake-avx512" tests the CPU model, never true on AMD); the
 * two were 9% of a steady FLUX-width Q8_0 forward (perf, AVX512-BF16 Zen 4), the whole gap to
 * bf16 weights. Both here are exact: the decode computes the shared block decoder's products
 * and rounding rule lane by lane, the transpose moves bits. */
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl")

#include "kernels/avx512_pairs_impl.h"

/* n values (a multiple of 32) of Q8_0 blocks to bf16: (float)q * d per value and the rounding
 * of dequant_blocks.h's cdf_dq_q8_0 + cdf_dq_bf16_bits, 16 lanes at a time */
static void q8_0_to_bf16_avx512(const uint8_t *src, int64_t n, uint16_t *dst) {
    for (int64_t b = 0; b < n / 32; b++) {
        const uint8_t *blk = src + b * 34;
        const __m512 d = _mm512_set1_ps(cdf_f16_to_f32((uint16_t)(blk[0] | blk[1] << 8)));
        const __m512 lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const void *)(blk + 2)))), d);
        const __m512 hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const void *)(blk + 18)))), d);
        _mm256_storeu_si256((void *)(dst + b * 32), _mm512_cvtepi32_epi16(bf16_round_512(lo)));
        _mm256_storeu_si256((void *)(dst + b * 32 + 16), _mm512_cvtepi32_epi16(bf16_round_512(hi)));
    }
}

/* 32 rows x nk bf16 values (rb, row stride ld; nk a multiple of 32) written to the pair layout:
 * k pair p of the tile is 32 rows x 4 bytes at d0 + ok[2p] (rows 0-15, then 16-31 at + 64). */
static void tile_to_pairs_avx512(const uint16_t *rb, int64_t ld, int64_t nk, char *d0, const int64_t *ok) {
    /* Each store is one whole cache line of a layer-sized buffer that oneDNN reads only after the
     * fill: streaming stores spare the read of every line before it is overwritten (the fill was
     * 5% of a FLUX-width Q8_0 forward with ordinary stores). Whole lines need 64-byte alignment,
     * which oneDNN's workspace and its 64-row blocks give; otherwise ordinary stores. The caller
     * fences (streaming stores are weakly ordered). */
    bool aligned = ((uintptr_t)d0 & 63) == 0;
    for (int64_t k = 0; k < nk && aligned; k += 2) aligned = (ok[k] & 63) == 0;
    for (int64_t k = 0; k < nk; k += 32) {
        for (int h = 0; h < 2; h++) { /* rows 16h .. 16h + 15 */
            __m512i r[16];
            for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512(rb + (16 * h + i) * ld + k); /* 16 pairs */
            transpose16_epi32(r);
            if (aligned)
                for (int p = 0; p < 16; p++) _mm512_stream_si512((void *)(d0 + ok[k + 2 * p] + 64 * h), r[p]);
            else
                for (int p = 0; p < 16; p++) _mm512_storeu_si512(d0 + ok[k + 2 * p] + 64 * h, r[p]);
        }
    }
}
/* r[0..31] (32 rows of 32 16-bit lanes) transposed in place, by the same block swaps (s = 16 .. 1) */
static inline void transpose32_epi16(__m512i r[32]) {
    for (int s = 16; s >= 1; s >>= 1) {
        __mmask32 hi = 0;
        uint16_t idx[32];
        for (int l = 0; l < 32; l++) {
            idx[l] = (uint16_t)(l ^ s);
            if (l & s) hi |= (__mmask32)(1u << l);
        }
        const __m512i swap = _mm512_loadu_si512(idx);
        for (int i = 0; i < 32; i++) {
            if (i & s) continue;
            const __m512i a = r[i], b = r[i + s];
            r[i] = _mm512_mask_blend_epi16(hi, a, _mm512_permutexvar_epi16(swap, b));
            r[i + s] = _mm512_mask_blend_epi16(hi, _mm512_permutexvar_epi16(swap, a), b);
        }
    }
}

/* The same into a layout that keeps each k's rows side by side (k_run 1: a plain [K, N] B, as
 * oneDNN takes it at the DiT's shapes): k of the tile is 32 rows x 2 bytes at d0 + ok[k]. */
static void tile_to_rows_avx512(const uint16_t *rb, int64_t ld, int64_t nk, char *d0, const int64_t *ok) {
    for (int64_t k = 0; k < nk; k += 32) {
        __m512i r[32];
        for (int i = 0; i < 32; i++) r[i] = _mm512_loadu_si512(rb + i * ld + k);
        transpose32_epi16(r);
        for (int j = 0; j < 32; j++) _mm512_storeu_si512(d0 + ok[k + j], r[j]);
    }
}
static void q_store_fence(void) { _mm_sfence(); }

#pragma GCC pop_options

/* ---- the own AVX512-BF16 GEMM on Q8_0 weights ("decode into the tile") -----------------------
 *
 * Why: the direct decode above writes every layer's bf16 copy to DRAM and oneDNN reads it back,
 * once per call (~5% of a FLUX-width Q8_0 forward); bf16 weights are prepacked once and pay
 * neither. Here each thread decodes a QG_NC-column slab of W (all of K, QG_NC x K bf16: 1.5 MiB at
 * K = 3072, 7.5 MiB at 15360) into the vdpbf16ps pair layout, where it stays in L2/L3 while every
 * row of A runs over it, and the next slab overwrites it: the weights stay quantized and no
 * layer-sized copy is written. Numerics are the policy's: weights decoded and rounded to bf16
 * exactly as above, A rounded to bf16 (nearest even, as cdf_f32_to_bf16), vdpbf16ps products
 * (exact) summed in f32 as oneDNN's brgemm sums them on this CPU (same instruction), in another
 * order; the bias is added after the sum, as oneDNN does.
 *
 * The GEMM itself (packed A, micro-kernel, blocking) is kernels/gemm_vdpbf16.c; this file
 * keeps the fill, qg_decode_slab. The decode is ~3% of the
 * call at M = 1536. Where it runs: q8_gemm (only where bench_kernels --quant showed it ahead); with
 * AMX the slabs feed the AMX micro-kernel. */
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,f16c")
enum { QG_NR = CDF_VDP_NR, QG_NC = CDF_VDP_NC, QG_MIN_M = 128, QG_MAX_M = 1024 };

/* q8_0_to_bf16_avx512 with vcvtne2ps2bf16 and F16C's scale for the integer rounding and the
 * scalar scale: the same bf16 for every int8 x f16 product (checked exhaustively against
 * cdf_f16_to_f32 + cdf_f32_to_bf16: a product is never an f32 denormal, where the instruction
 * would flush; NaN scales give the same quiet NaNs), about half the instructions. For the
 * panels' fill at the AVX512-BF16 level and the own GEMM's slabs. */
static inline __m512i q8_0_block_bf16(const uint8_t *blk) { /* one block's 32 values */
    const __m512 d = _mm512_set1_ps(_cvtsh_ss((unsigned short)(blk[0] | blk[1] << 8)));
    const __m512 lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const void *)(blk + 2)))), d);
    const __m512 hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const void *)(blk + 18)))), d);
    return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}
static void q8_0_to_bf16_avx512bf16(const uint8_t *src, int64_t n, uint16_t *dst) {
    for (int64_t b = 0; b < n / 32; b++) _mm512_storeu_si512(dst + b * 32, q8_0_block_bf16(src + b * 34));
}

/* Columns [n0, n0 + QG_NC) (rows of W past N: zero) of Q8_0 W (row_bytes a row) decoded into the
 * slab layout, all of K */
static void qg_decode_slab(const uint8_t *w, int64_t row_bytes, int64_t N, int64_t K, int64_t n0, uint32_t *bp) {
    const int64_t kp = K / 2;
    for (int64_t s = 0; s < QG_NC / 16; s++) { /* 16 columns: half s % 2 of panel s / 2 */
        uint32_t *dst = bp + (s / 2) * kp * QG_NR + (s % 2) * 16;
        for (int64_t k = 0; k < K; k += 32) {
            __m512i r[16];
            for (int i = 0; i < 16; i++) {
                const int64_t n = n0 + 16 * s + i;
                if (n >= N) {
                    r[i] = _mm512_setzero_si512();
                    continue;
                }
                r[i] = q8_0_block_bf16(w + n * row_bytes + k / 32 * 34);
            }
            transpose16_epi32(r);
            for (int p = 0; p < 16; p++) _mm512_storeu_si512(dst + (k / 2 + p) * QG_NR, r[p]);
        }
    }
}

/* qg_decode_slab as the GEMM core's fill (kernels/gemm_vdpbf16.h) */
typedef struct q8_slabs {
    const uint8_t *w;
    int64_t row_bytes, N, K;
} q8_slabs;
static void q8_fill(const void *ctx, int64_t n0, uint32_t *bp) {
    const q8_slabs *q = ctx;
    qg_decode_slab(q->w, q->row_bytes, q->N, q->K, n0, bp);
}

#pragma GCC pop_options

/* ---- the int8 AVX512-VNNI GEMM on Q8_0 weights ("q8_0 x q8_0") ------------------------------
 *
 * Why: oneDNN's bf16 brgemm on prepacked bf16 weights already runs near the vdpbf16ps peak, so a
 * Q8_0 layer decoded to bf16 can at best match it. vpdpbusd does 64 int8 multiply-adds per zmm
 * instruction against vdpbf16ps' 32 at the same rate (Zen 4): here A is quantized too, as ggml's
 * q8_0 x q8_0 dot product does, and the weights' int8 values are used as they are.
 *
 * Numerics (not the dequantized weights' bf16 matmul: A is quantized). Per row m of A and 32-value
 * block b of K: amax = max |a|, da = amax / 127, qa = nearest-even(a * (127 / amax)) in
 * [-127, 127] (amax below 2^-96, zero included: da = 0, qa = 0; a non-finite value in the block:
 * da = NaN, so the outputs it touches are NaN, not a silent number). The weights' block: dw (f16, widened exactly) and
 * wq (int8). Then C[m, n] = sum_b (da * dw) * S_b (+ bias) with S_b = sum_k qa * wq computed exactly
 * in int32 (|S_b| <= 32 * 127 * 128), the block terms summed in f32 (one fma per block, in K
 * order, over chunks of QI_KC). The error against the exact product of A with the dequantized
 * weights: |a - qa * da| <= da / 2 + 3u |a| (u = 2^-24: the three f32 roundings of a * (127 /
 * amax) and da), weighted by |dw * wq| and summed, plus the f32 sum's rounding
 * (tests/test_kernels_fast.c checks both bounds).
 *
 * vpdpbusd multiplies unsigned by signed bytes: A goes in as u8 = qa + 128, and the offset's
 * contribution, 128 * sum_k wq per (column, block), is computed when the slab is repacked and
 * starts each block's int32 sum negated: S_b = sum (qa + 128) wq - 128 sum wq, exact.
 *
 * Opt-in (CDIFFUSERS_Q8_INT8=1): by default a Q8_0 layer computes what its dequantized weights
 * give, which this path cannot (bench/RESULTS.md has its speed and a forward's accuracy).
 *
 * Layouts (u32 words of 4 k, "quads"). A: groups of QI_MR rows; group g, quad q is QI_MR words at
 * aq + (g * K / 4 + q) * QI_MR, its scales at as + (g * nb + b) * QI_MR (rows past M: zero).
 * B slab: panels of 32 columns; panel j, quad q: 32 words (column i: word i) at bq + (j * K / 4 +
 * q) * 32; dw as f32 and -128 sum wq as int32 at (j * nb + b) * 32 of their arrays. Blocking as
 * qg_slab: slab (QI_NC columns) per task, MC-row blocks, KC-deep chunks, panels, row groups. */
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,f16c")
/* 6 x 32: 12 int32 + 12 f32 accumulators, 2 weight vectors and a broadcast in the 32 zmm */
enum { QI_MR = 6, QI_NR = 32, QI_KC = 512, QI_NC = 256, QI_MC = 192, QI_LDT = QI_NC + 16 };

/* A block whose max |a| is below 2^-96 counts as zero (da = 0, qa = 0): 127 / amax stays finite
 * and da a normal number; what it drops from an output is below 2^-96 sum |wf| over the block */
#define QI_TINY_BITS 0x0f800000u /* 2^-96 as f32 bits */

/* Row group g of A (f32 or bf16 [M, K]) quantized into the group layout (rows past M: zero) */
static void qi_quant_a(const void *a, cdf_dtype a_dt, int64_t M, int64_t K, int64_t g, uint32_t *aq, float *as) {
    const int64_t nb = K / 32;
    uint32_t *dq = aq + g * (K / 4) * QI_MR;
    float *ds = as + g * nb * QI_MR;
    for (int r = 0; r < QI_MR; r++) {
        const int64_t m = g * QI_MR + r;
        for (int64_t b = 0; b < nb; b++) {
            if (m >= M) {
                ds[b * QI_MR + r] = 0.0f;
                for (int q = 0; q < 8; q++) dq[(b * 8 + q) * QI_MR + r] = 0x80808080u; /* qa = 0 */
                continue;
            }
            __m512 lo, hi;
            if (a_dt == CDF_F32) {
                const float *src = (const float *)a + m * K + b * 32;
                lo = _mm512_loadu_ps(src), hi = _mm512_loadu_ps(src + 16);
            } else {
                const uint16_t *src = (const uint16_t *)a + m * K + b * 32;
                lo = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const void *)src)), 16));
                hi = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const void *)(src + 16))), 16));
            }
            /* max |a| as the largest magnitude bit pattern: NaN and infinity above every finite value */
            const __m512i mag = _mm512_set1_epi32(0x7fffffff);
            const uint32_t amax_bits = _mm512_reduce_max_epu32(_mm512_max_epu32(_mm512_and_si512(_mm512_castps_si512(lo), mag),
                                                                                _mm512_and_si512(_mm512_castps_si512(hi), mag)));
            float amax;
            memcpy(&amax, &amax_bits, sizeof amax);
            __m512i qlo = _mm512_setzero_si512(), qhi = qlo;
            float da = 0.0f;
            if (amax_bits >= 0x7f800000u) da = NAN;
            else if (amax_bits >= QI_TINY_BITS) {
                da = amax / 127.0f;
                const __m512 id = _mm512_set1_ps(127.0f / amax);
                /* nearest even (the default MXCSR mode); |a * id| <= 127 (1 + 2u) rounds into [-127, 127] */
                qlo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, id)), qhi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, id));
            }
            const __m512i off = _mm512_set1_epi32(128);
            uint32_t w[8];
            _mm_storeu_si128((void *)w, _mm512_cvtepi32_epi8(_mm512_add_epi32(qlo, off)));
            _mm_storeu_si128((void *)(w + 4), _mm512_cvtepi32_epi8(_mm512_add_epi32(qhi, off)));
            ds[b * QI_MR + r] = da;
            for (int q = 0; q < 8; q++) dq[(b * 8 + q) * QI_MR + r] = w[q];
        }
    }
}

/* Columns [n0, n0 + QI_NC) of Q8_0 W (rows of W past N: zero) into the slab layout, all of K */
static void qi_pack_slab(const uint8_t *w, int64_t row_bytes, int64_t N, int64_t K, int64_t n0, uint32_t *bq, float *bs,
                         int32_t *bc) {
    const int64_t kq = K / 4, nb = K / 32;
    const __m512i ones = _mm512_set1_epi8(1);
    for (int64_t s = 0; s < QI_NC / 16; s++) { /* 16 columns: half s % 2 of panel s / 2 */
        const int64_t j = s / 2, h = s % 2;
        uint32_t *dst = bq + j * kq * QI_NR + h * 16;
        for (int64_t b = 0; b < nb; b += 2) { /* two blocks: 16 quads */
            const bool two = b + 1 < nb;
            __m512i r[16];
            for (int i = 0; i < 16; i++) {
                const int64_t n = n0 + 16 * s + i;
                float *d = bs + (j * nb + b) * QI_NR + h * 16 + i;
                if (n >= N) {
                    r[i] = _mm512_setzero_si512();
                    d[0] = 0.0f;
                    if (two) d[QI_NR] = 0.0f;
                    continue;
                }
                const uint8_t *blk = w + n * row_bytes + b * 34;
                d[0] = _cvtsh_ss((unsigned short)(blk[0] | blk[1] << 8));
                __m256i hi = _mm256_setzero_si256();
                if (two) {
                    hi = _mm256_loadu_si256((const void *)(blk + 36));
                    d[QI_NR] = _cvtsh_ss((unsigned short)(blk[34] | blk[35] << 8));
                }
                r[i] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const void *)(blk + 2))), hi, 1);
            }
            transpose16_epi32(r); /* r[q]: quad 8b + q of the 16 columns */
            __m512i sum0 = _mm512_setzero_si512(), sum1 = sum0;
            for (int q = 0; q < 8; q++) sum0 = _mm512_dpbusd_epi32(sum0, ones, r[q]), sum1 = _mm512_dpbusd_epi32(sum1, ones, r[8 + q]);
            const __m512i zero = _mm512_setzero_si512(); /* -128 sum wq */
            _mm512_storeu_si512(bc + (j * nb + b) * QI_NR + h * 16, _mm512_sub_epi32(zero, _mm512_slli_epi32(sum0, 7)));
            if (two) _mm512_storeu_si512(bc + (j * nb + b + 1) * QI_NR + h * 16, _mm512_sub_epi32(zero, _mm512_slli_epi32(sum1, 7)));
            for (int q = 0; q < (two ? 16 : 8); q++) _mm512_storeu_si512(dst + (b * 8 + q) * QI_NR, r[q]);
        }
    }
}

/* C[0..nr) x [0..32) (ldc) (+)= A group x B panel over nbk blocks; first: C's old contents
 * ignored. out (the last chunk): the sums (+ bias, 32 f32 or NULL) go to out (ldo) instead. */
static void qi_ukernel(int64_t nbk, const uint32_t *restrict aq, const float *restrict as, const uint32_t *restrict bq,
                       const float *restrict bs, const int32_t *restrict bc, float *restrict c, int64_t ldc, int nr, bool first,
                       float *restrict out, int64_t ldo, const float *bias) {
    __m512 acc[2 * QI_MR];
#pragma GCC unroll 12
    for (int i = 0; i < 2 * QI_MR; i++)
        acc[i] = first || i / 2 >= nr ? _mm512_setzero_ps() : _mm512_loadu_ps(c + (i / 2) * ldc + (i % 2) * 16);
    for (int64_t b = 0; b < nbk; b++, as += QI_MR, bs += QI_NR, bc += QI_NR) {
        const __m512i c0 = _mm512_loadu_si512(bc), c1 = _mm512_loadu_si512(bc + 16);
        __m512i s[2 * QI_MR];
#pragma GCC unroll 12
        for (int r = 0; r < QI_MR; r++) s[2 * r] = c0, s[2 * r + 1] = c1;
#pragma GCC unroll 8
        for (int q = 0; q < 8; q++, aq += QI_MR, bq += QI_NR) {
            const __m512i b0 = _mm512_loadu_si512(bq), b1 = _mm512_loadu_si512(bq + 16);
#pragma GCC unroll 6
            for (int r = 0; r < QI_MR; r++) {
                const __m512i x = _mm512_set1_epi32((int)aq[r]);
                s[2 * r] = _mm512_dpbusd_epi32(s[2 * r], x, b0);
                s[2 * r + 1] = _mm512_dpbusd_epi32(s[2 * r + 1], x, b1);
            }
        }
        const __m512 w0 = _mm512_loadu_ps(bs), w1 = _mm512_loadu_ps(bs + 16);
#pragma GCC unroll 6
        for (int r = 0; r < QI_MR; r++) {
            const __m512 d = _mm512_set1_ps(as[r]);
            acc[2 * r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[2 * r]), _mm512_mul_ps(d, w0), acc[2 * r]);
            acc[2 * r + 1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[2 * r + 1]), _mm512_mul_ps(d, w1), acc[2 * r + 1]);
        }
    }
    tile_store32(acc, QI_MR, nr, c, ldc, out, ldo, bias);
}

/* One slab task: columns [n0, n0 + QI_NC) of C for every row (t: the thread's QI_MC x QI_LDT
 * block buffer of partial sums, as qg_slab's) */
static void qi_slab(const uint32_t *aq, const float *as, const uint32_t *bq, const float *bs, const int32_t *bc, float *t, float *c,
                    const float *bias, int64_t M, int64_t N, int64_t K, int64_t n0) {
    const int64_t kq = K / 4, nb = K / 32, ncols = N - n0 < QI_NC ? N - n0 : QI_NC, npan = ncols / QI_NR;
    for (int64_t m0 = 0; m0 < M; m0 += QI_MC) {
        const int64_t m1 = M - m0 < QI_MC ? M : m0 + QI_MC;
        for (int64_t pc = 0; pc < K; pc += QI_KC) {
            const int64_t kc = K - pc < QI_KC ? K - pc : QI_KC, b0 = pc / 32;
            const bool last = pc + kc == K;
            for (int64_t j = 0; j < npan; j++) {
                const uint32_t *bpan = bq + (j * kq + pc / 4) * QI_NR;
                const float *bspan = bs + (j * nb + b0) * QI_NR;
                const int32_t *bcpan = bc + (j * nb + b0) * QI_NR;
                for (int64_t m = m0; m < m1; m += QI_MR) {
                    const int64_t g = m / QI_MR;
                    qi_ukernel(kc / 32, aq + (g * kq + pc / 4) * QI_MR, as + (g * nb + b0) * QI_MR, bpan, bspan, bcpan,
                               t + (m - m0) * QI_LDT + j * QI_NR, QI_LDT, (int)(m1 - m < QI_MR ? m1 - m : QI_MR), pc == 0,
                               last ? c + m * N + n0 + j * QI_NR : NULL, N, bias ? bias + n0 + j * QI_NR : NULL);
                }
            }
        }
    }
}
#pragma GCC pop_options
#endif

/* Tiles of the direct decode: TILE_ROWS rows x TILE_K values (a multiple of every block size,
 * 32 and 256). oneDNN's layouts put a few k of 16-64 consecutive rows in one cache line (bf16
 * [K, N] row-major: 32 rows; blocked 16a64b2a: 2 k of 32 rows), so a row at a time would come
 * back to each line again and again (K / 2 lines per row, evicted in between for large K); a
 * tile of 32 rows writes whole lines while they are cached (32 KiB of bf16 decode per thread). */
enum { TILE_ROWS = 32, TILE_K = 512 };

/* Decodes the rows into oneDNN's weight buffer at l's offsets (cdf_k_matmul_fast_filled), as
 * l->dt: bf16 values rounded as decode_rows rounds a plain panel (an f32 layout gets them widened
 * back, exactly), so the primitive sees the values a reorder of the plain panel would give it. */
static cdf_status fill_rows(void *ctx, void *dst, const cdf_k_fast_b_layout *l) {
    const q_rows *q = ctx;
    if (l->N != q->np || l->K != q->K)
        return cdf_error(CDF_ERR_INTERNAL, "cdf_k_matmul_q: weight layout [%lld, %lld] for a %lld x %lld panel",
                         (long long)l->K, (long long)l->N, (long long)q->K, (long long)q->np);
    const int64_t np = q->np, K = q->K, kt = TILE_K < K ? TILE_K : K;
    /* work items: (row tile, k chunk), a thread's run of items mostly the chunks of one tile */
    const int64_t n_kc = (K + kt - 1) / kt, n_items = (np + TILE_ROWS - 1) / TILE_ROWS * n_kc;
    char *out = dst;
#ifdef Q_HAVE_AVX512
    const bool avx512 = cdf_k_isa_level() >= CDF_K_ISA_AVX512;
    const bool bf16cvt = cdf_k_isa_level() >= CDF_K_ISA_AVX512_BF16 && cdf_k_cpu()->avx512_bf16;
#endif
    int bad = 0;
#pragma omp parallel reduction(| : bad) if (np * K > 65536)
    {
        uint16_t *rb = malloc(sizeof(uint16_t) * (size_t)(TILE_ROWS * kt)); /* [TILE_ROWS, kt], rounded to bf16 */
        if (!rb) bad = 2;
#pragma omp for schedule(static)
        for (int64_t t = 0; t < n_items; t++) {
            if (bad) continue;
            const int64_t r0 = t / n_kc * TILE_ROWS, nr = np - r0 < TILE_ROWS ? np - r0 : TILE_ROWS;
            const int64_t k0 = t % n_kc * kt, nk = K - k0 < kt ? K - k0 : kt;
            for (int64_t i = 0; i < nr && !bad; i++) {
                const uint8_t *src = q->w + (q->n0 + r0 + i) * q->row_bytes + k0 / q->be * q->bb;
#ifdef Q_HAVE_AVX512
                if (bf16cvt && q->qtype == CDF_GGML_Q8_0) q8_0_to_bf16_avx512bf16(src, nk, rb + i * kt);
                else if (avx512 && q->qtype == CDF_GGML_Q8_0) q8_0_to_bf16_avx512(src, nk, rb + i * kt);
                else
#endif
                if (!cdf_k_dequant_store_blocks(q->qtype, src, nk / q->be, rb + i * kt, CDF_DQ_STORE_BF16)) bad = 1;
            }
            if (bad) continue;
            const int64_t *ok = l->off_k + k0; /* k0 is a multiple of k_run (K, or 2 | kt) */
            /* blocked bf16 layouts keep a block's rows side by side for each k (run): then the
             * tile goes out k by k, each k's rows as one contiguous run, instead of row by row
             * with a jump per k (oneDNN's pair layout: 4 bytes per row, 64 rows a block) */
            const int64_t run = l->k_run == 2 ? 2 : 1, step = run * (int64_t)sizeof(uint16_t);
            bool rows_adjacent = l->dt == CDF_BF16 && l->k_run != K && nr > 1;
            for (int64_t i = 1; rows_adjacent && i < nr; i++) rows_adjacent = l->off_n[r0 + i] - l->off_n[r0] == i * step;
#ifdef Q_HAVE_AVX512
            /* the AVX-512 route: whole 32-row tiles of a layout keeping them side by side */
            const bool wide = avx512 && nr == TILE_ROWS && nk % 32 == 0 && l->dt == CDF_BF16 && l->k_run <= 2;
            if (rows_adjacent && wide) {
                if (run == 2) tile_to_pairs_avx512(rb, kt, nk, out + l->off_n[r0], ok);
                else tile_to_rows_avx512(rb, kt, nk, out + l->off_n[r0], ok);
                continue;
            }
#endif
            if (rows_adjacent) {
                char *d0 = out + l->off_n[r0];
                for (int64_t k = 0; k < nk; k += run) {
                    char *d = d0 + ok[k];
                    if (run == 2)
                        for (int64_t i = 0; i < nr; i++) memcpy(d + i * 4, rb + i * kt + k, 4);
                    else
                        for (int64_t i = 0; i < nr; i++) memcpy(d + i * 2, rb + i * kt + k, 2);
                }
                continue;
            }
            for (int64_t i = 0; i < nr; i++) {
                char *d = out + l->off_n[r0 + i];
                const uint16_t *rbi = rb + i * kt;
                if (l->dt == CDF_F32)
                    for (int64_t k = 0; k < nk; k++) *(float *)(d + ok[k]) = cdf_bf16_to_f32(rbi[k]);
                else if (l->k_run == K) /* the plain [N, K] panel's layout */
                    memcpy(d + ok[0], rbi, sizeof(uint16_t) * (size_t)nk);
                else if (l->k_run == 2)
                    for (int64_t k = 0; k < nk; k += 2) memcpy(d + ok[k], rbi + k, 2 * sizeof(uint16_t));
                else
                    for (int64_t k = 0; k < nk; k++) memcpy(d + ok[k], rbi + k, sizeof(uint16_t));
            }
        }
        free(rb);
#ifdef Q_HAVE_AVX512
        if (avx512) q_store_fence(); /* this thread's streaming stores, before the region's barrier */
#endif
    }
    return bad ? decode_error(q, bad) : CDF_OK;
}

/* The own Q8_0 GEMM: 1 (default) in its M range, 2 wherever it can run, 0 off (CDIFFUSERS_Q8_GEMM=0, or the setter) */
static int g_q8_gemm = -1;
void cdf_k_matmul_q_set_own_gemm(int on) { g_q8_gemm = on < 0 ? -1 : on > 2 ? 2 : on; }
#ifdef Q_HAVE_AVX512
static bool q8_gemm_enabled(void) {
    if (g_q8_gemm < 0) {
        const char *e = getenv("CDIFFUSERS_Q8_GEMM");
        g_q8_gemm = !(e && strcmp(e, "0") == 0);
    }
    return g_q8_gemm != 0;
}
#endif

/* The int8 VNNI GEMM: off unless CDIFFUSERS_Q8_INT8=1 (or the setter: 1 or 2, the same today),
 * though it is ahead at every M measured: its numbers are not the dequantized weights' (A is
 * quantized), and a Q8_0 file under the bf16 policy is meant to give exactly what its dequantized
 * file gives (tests/test_formats_single_file.c checks that bit for bit) */
static int g_q8_int8 = -1;
static uint64_t g_q8_int8_calls; /* for tests: which path ran */
void cdf_k_matmul_q_set_int8(int on) { g_q8_int8 = on < 0 ? -1 : on > 2 ? 2 : on; }
uint64_t cdf_k_matmul_q_int8_calls(void) { return g_q8_int8_calls; }

/* Runs a on the int8 VNNI GEMM where it applies (*handled = true). */
static cdf_status q8_int8(const cdf_k_matmul_q_args *a, bool *handled) {
    *handled = false;
#ifdef Q_HAVE_AVX512
    /* AVX512-VNNI without AMX (oneDNN's AMX bf16 kernels are several times faster), under the
     * bf16 policy only: the f32 policy (w_dt f32) asks for the exact dequantized weights */
    const cdf_k_cpu_features *cpu = cdf_k_cpu();
    if (a->qtype != CDF_GGML_Q8_0 || a->w_dt != CDF_BF16 || cdf_k_isa_level() < CDF_K_ISA_AVX512 || !cpu->avx512_vnni ||
        cpu->amx_bf16)
        return CDF_OK;
    if (g_q8_int8 < 0) { /* opt-in: see cdf_k_matmul_q_set_int8 */
        const char *e = getenv("CDIFFUSERS_Q8_INT8");
        g_q8_int8 = e && strcmp(e, "1") == 0;
    }
    if (g_q8_int8 == 0) return CDF_OK;
    if ((a->a_dt != CDF_F32 && a->a_dt != CDF_BF16) || a->c_dt != CDF_F32 || a->N % QI_NR || a->K % 32) return CDF_OK;
    if (a->bias && a->bias_dt != CDF_F32 && a->bias_dt != CDF_BF16) return CDF_OK;
    /* once on, at every M: ahead of bf16 weights from M = 16 on and of the other Q8_0 paths at
     * every M measured (bench_kernels --quant, bench/RESULTS.md: CPU-s 0.64-0.79 of bf16's at M
     * 64-4096; M = 2 1.13 of bf16's, 0.35 of the panels') */
#define align64(n) (((size_t)(n) + 63) & ~(size_t)63)
    const int64_t M = a->M, N = a->N, K = a->K, nb = K / 32, groups = (M + QI_MR - 1) / QI_MR, slabs = (N + QI_NC - 1) / QI_NC;
    int nthr = omp_get_max_threads();
    if (nthr > slabs) nthr = (int)slabs;
    if (nthr < 1) nthr = 1;
    const size_t aq_bytes = align64((size_t)(groups * QI_MR * K)), as_bytes = align64((size_t)(groups * QI_MR * nb) * 4);
    const size_t bq_bytes = align64((size_t)(QI_NC * K)), bs_bytes = align64((size_t)(QI_NC * nb) * 4);
    const size_t slab_bytes = bq_bytes + 2 * bs_bytes + align64((size_t)(QI_MC * QI_LDT) * 4);
    const size_t need = aq_bytes + as_bytes + (size_t)nthr * slab_bytes + (a->bias ? (size_t)N * sizeof(float) : 0);
    size_t have = 0;
    char *buf = panel_take(need, &have);
    if (!buf) return CDF_OK; /* the panels need less */
    uint32_t *aq = (uint32_t *)buf;
    float *as = (float *)(buf + aq_bytes);
    float *bias = a->bias ? (float *)(buf + aq_bytes + as_bytes + (size_t)nthr * slab_bytes) : NULL;
    if (bias) cdf_convert(bias, CDF_F32, a->bias, a->bias_dt, (size_t)N);
    const int64_t row_bytes = K / 32 * 34;
#pragma omp parallel num_threads(nthr)
    {
#pragma omp for schedule(static)
        for (int64_t g = 0; g < groups; g++) qi_quant_a(a->a, a->a_dt, M, K, g, aq, as);
        char *mine = buf + aq_bytes + as_bytes + (size_t)omp_get_thread_num() * slab_bytes;
        uint32_t *bq = (uint32_t *)mine;
        float *bs = (float *)(mine + bq_bytes), *t = (float *)(mine + bq_bytes + 2 * bs_bytes);
        int32_t *bc = (int32_t *)(mine + bq_bytes + bs_bytes);
#pragma omp for schedule(dynamic, 1)
        for (int64_t s = 0; s < slabs; s++) {
            qi_pack_slab(a->w, row_bytes, N, K, s * QI_NC, bq, bs, bc);
            qi_slab(aq, as, bq, bs, bc, t, a->c, bias, M, N, K, s * QI_NC);
        }
    }
    panel_give(buf, have);
    *handled = true;
    g_q8_int8_calls++;
#undef align64
#else
    (void)a;
#endif
    return CDF_OK;
}

/* Runs a on the own Q8_0 GEMM where it applies (*handled = true), else leaves it to the panels. */
static cdf_status q8_gemm(const cdf_k_matmul_q_args *a, bool *handled) {
    *handled = false;
#ifdef Q_HAVE_AVX512
    /* with AMX, where AMX is usable: the slabs then feed the AMX micro-kernel (gemm_vdpbf16.c) */
    const cdf_k_vdp_kernel kernel = cdf_k_vdp_micro_kernel();
    if (a->qtype != CDF_GGML_Q8_0 || a->w_dt != CDF_BF16 || kernel == CDF_VDP_NONE || !q8_gemm_enabled()) return CDF_OK;
    const bool amx = kernel == CDF_VDP_AMX;
    if ((a->a_dt != CDF_F32 && a->a_dt != CDF_BF16) || a->c_dt != CDF_F32 || a->N % QG_NR || a->K % 32) return CDF_OK;
    if (a->bias && a->bias_dt != CDF_F32 && a->bias_dt != CDF_BF16) return CDF_OK;
    /* where it is ahead of the panels (bench_kernels --quant, bench/RESULTS.md). vdpbf16ps (Zen 4):
     * M 128-512 by 3-15% in CPU time (FLUX's text stream); from M = 1024 on the two are even
     * within the noise, and the panels ahead at K = 12288 (its packed A, 36 MiB at M = 1536, outgrows
     * L3 and is read again per column slab), so they keep those. AMX (Xeon): from M = 128 up
     * (0.45-0.77x the panels' time to M = 4096, oneDNN 2.6's AMX kernels running at ~19% of the
     * peak), where the same weights loaded as bf16 run the same AMX kernel (gemm_vdpbf16.c,
     * VDP_MIN_M): a Q8_0 file gives its dequantized file's numbers bit for bit. Below, the panels
     * (oneDNN, as bf16 weights there), though the own GEMM took half their time at M = 2-64. */
    if (g_q8_gemm != 2 && (a->M < QG_MIN_M || (!amx && a->M >= QG_MAX_M))) return CDF_OK;
    const int64_t M = a->M, N = a->N, K = a->K;
    const int nthr = cdf_k_vdp_threads(N);
    const size_t core = cdf_k_vdp_bytes(M, K, nthr), bias_bytes = a->bias ? (size_t)N * sizeof(float) : 0;
    const size_t need = core + bias_bytes + 64;
    size_t have = 0;
    char *buf = panel_take(need, &have);
    if (!buf) return CDF_OK; /* the panels need less */
    float *bias = a->bias ? (float *)(buf + core) : NULL;
    if (bias) cdf_convert(bias, CDF_F32, a->bias, a->bias_dt, (size_t)N);
    const q8_slabs q = {.w = a->w, .row_bytes = K / 32 * 34, .N = N, .K = K};
    const cdf_k_vdp_gemm_args g = {.M = M, .N = N, .K = K, .a = a->a, .a_dt = a->a_dt, .lda = K, .fill = q8_fill,
                                   .fill_ctx = &q, .c = a->c, .ldc = N, .bias = bias, .amx = amx};
    cdf_k_vdp_run(&g, buf, nthr);
    panel_give(buf, have);
    *handled = true;
#else
    (void)a;
#endif
    return CDF_OK;
}

cdf_status cdf_k_matmul_q(const cdf_k_matmul_q_args *a) {
    const char *fn = "cdf_k_matmul_q";
    if (!a) return cdf_error(CDF_ERR_INVALID_ARG, "%s: no arguments", fn);
    int64_t be = 0, bb = 0;
    if (!cdf_ggml_type_block(a->qtype, &be, &bb) || !cdf_ggml_can_dequantize(a->qtype))
        return cdf_error(CDF_ERR_UNSUPPORTED, "%s: ggml type %u cannot be decoded", fn, a->qtype);
    if (a->M < 0 || a->N < 0 || a->K <= 0 || a->K % be)
        return cdf_error(CDF_ERR_INVALID_ARG, "%s: K = %lld is not a multiple of %s's %lld-element blocks", fn,
                         (long long)a->K, cdf_ggml_type_name(a->qtype), (long long)be);
    if (a->w_dt != CDF_F32 && a->w_dt != CDF_BF16)
        return cdf_error(CDF_ERR_INVALID_ARG, "%s: weights decode to f32 or bf16, not %s", fn, cdf_dtype_name(a->w_dt));
    if (a->M == 0 || a->N == 0) return CDF_OK;
    bool own = false;
    cdf_status own_st = q8_int8(a, &own);
    if (own_st != CDF_OK || own) return own_st;
    own_st = q8_gemm(a, &own);
    if (own_st != CDF_OK || own) return own_st;
    const int64_t row_bytes = a->K / be * bb;
    /* equal panels of a multiple of 64 rows where a layer needs several (a few rows over the
     * bound at most): oneDNN's kernels block N by 64 */
    const int64_t panel_elems = (int64_t)(g_panel_bytes_limit / cdf_dtype_size(a->w_dt));
    int64_t panel = a->N;
    if (a->N * a->K > panel_elems) {
        const int64_t n_panels = (a->N * a->K + panel_elems - 1) / panel_elems;
        panel = (a->N + n_panels - 1) / n_panels;
        panel = (panel + 63) / 64 * 64;
        if (panel > a->N) panel = a->N;
    }
    const size_t wsz = cdf_dtype_size(a->w_dt), panel_bytes = (size_t)(panel * a->K) * wsz;
    /* oneDNN is what cdf_k_matmul_dispatch runs first on a bf16 B above the AVX2 level */
    const bool try_direct = a->w_dt == CDF_BF16 && cdf_k_isa_level() > CDF_K_ISA_AVX2;
    void *buf = NULL; /* the plain panel, taken when first needed */
    size_t buf_bytes = 0;
    const size_t csz = cdf_dtype_size(a->c_dt), bsz = a->bias ? cdf_dtype_size(a->bias_dt) : 0;
    const uint8_t *w = a->w;
    cdf_status st = CDF_OK;
    for (int64_t n0 = 0; n0 < a->N && st == CDF_OK; n0 += panel) {
        const int64_t np = a->N - n0 < panel ? a->N - n0 : panel;
        const q_rows q = {.w = w, .qtype = a->qtype, .be = be, .bb = bb, .row_bytes = row_bytes, .n0 = n0, .np = np, .K = a->K};
        cdf_k_matmul_args m = {
            .batch = 1, .M = a->M, .N = np, .K = a->K,
            .a = a->a, .a_dt = a->a_dt, .lda = a->K, .sa = 0, .trans_a = false,
            .b = NULL, .b_dt = a->w_dt, .ldb = a->K, .sb = 0, .trans_b = true,
            .bias = a->bias ? (const char *)a->bias + (size_t)n0 * bsz : NULL, .bias_dt = a->bias_dt,
            .c = (char *)a->c + (size_t)n0 * csz, .c_dt = a->c_dt, .ldc = a->N, .sc = 0,
            .alpha = 1.0f, .beta = 0.0f, .b_transient = true,
        };
        if (try_direct) {
            bool handled = false;
            st = cdf_k_matmul_fast_filled(&m, fill_rows, (void *)&q, &handled);
            if (st != CDF_OK || handled) continue;
        }
        if (!buf && !(buf = panel_take(panel_bytes, &buf_bytes))) {
            st = cdf_error(CDF_ERR_OUT_OF_MEMORY, "%s: cannot allocate a %lld x %lld panel of decoded weights", fn,
                           (long long)panel, (long long)a->K);
            break;
        }
        st = decode_rows(&q, buf, a->w_dt);
        if (st != CDF_OK) break;
        m.b = buf;
        st = cdf_k_matmul_dispatch(&m);
        /* the next panel reuses this buffer: b_transient keeps the matmuls from prepacking it;
         * should a copy exist anyway, it must not survive */
        cdf_k_pack_forget_range(buf, (size_t)(np * a->K) * wsz);
    }
    if (buf) panel_give(buf, buf_bytes);
    return st;
}
