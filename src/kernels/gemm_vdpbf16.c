/* Own AVX512-BF16 GEMM core (see gemm_vdpbf16.h): the vdpbf16ps GEMM that first ran on Q8_0
 * weights (kernels/matmul_quant.c, "decode into the tile"), with the slab's fill a parameter so
 * that bf16 weights run it too (their fill is a repack: no decode).
 *
 * Why for bf16 weights (issue #23): at the avx512_bf16 level oneDNN multiplies bf16 weights fast
 * only once they are reordered into its blocked layout and kept (the prepack cache: a second,
 * model-sized copy in memory, +2 GB peak RSS at FLUX width 2+4 blocks, and +9-11 s of page faults
 * in the first forward), and a real model's weights exceed the cache's cap, so most of them run
 * oneDNN's slower unprepacked path anyway. Here each thread repacks a 256-column slab of the plain
 * [N, K] weight into the pair layout, where it stays in L2/L3 while every row of A runs over it:
 * no copy of the weights outlives the slab.
 *
 * Numerics are the bf16 policy's: A rounded to bf16 (nearest even, as cdf_f32_to_bf16), products
 * exact (vdpbf16ps), sums in f32 (a vdpbf16ps lane adds its two products to the accumulator: the
 * order is k pair by k pair within a KC chunk, chunks in k order), bias added after the sum, as
 * oneDNN adds it.
 *
 * Layouts. A: groups of QG_MR rows; group g, k pair p is QG_MR 32-bit words (row r's bf16 of
 * k = 2p in the low half, 2p + 1 in the high) at ap + (g * K / 2 + p) * QG_MR; rows past M zero.
 * B slab: panels of QG_NR columns; panel j, pair p is QG_NR words (column 16h + i: word 16h + i)
 * at bp + (j * K / 2 + p) * QG_NR. Partial sums in a padded per-thread block buffer, the last
 * chunk's into C (f32) with the bias.
 * Blocking: slab (QG_NC columns) per task, then MC-row blocks,
 * KC-deep chunks, NR panels (the panel's KC x NR slice, 32 KiB, used by every row group of the
 * block), MR-row groups; the MC x NC block of sums (~200 KiB) stays in L2 across the chunks.
 * The micro-kernel alone runs at ~97% of the vdpbf16ps register loop.
 * With AMX usable, the same slabs feed an AMX micro-kernel (amx_run below): there oneDNN 2.6
 * (Debian 12's) reaches ~19% of the AMX peak at these shapes, and this one 0.43-0.97x of its time
 * per layer (bench_kernels --bf16, bench/RESULTS.md). */
#include "kernels/gemm_vdpbf16.h"

#include <omp.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "core/host_memory.h"
#include "kernels/cpu_features.h"
#include "kernels/reference_internal.h"

/* KC 512: a micro-kernel call runs 256 k pairs between its loads and stores of the 12 x 32 sums
 * (at KC 256 the loop ran ~4% slower on its own; the B panel's 32 KiB of the slab come from L2) */
enum { QG_MR = CDF_VDP_MR, QG_NR = CDF_VDP_NR, QG_KC = 512, QG_NC = CDF_VDP_NC, QG_MC = 192, QG_LDT = QG_NC + 16 };
/* AMX micro-kernel blocking (see amx_slab): AMX_MC rows x AMX_KC k of A (256 KiB) in L2; the
 * panel's AMX_KC x 32 slice of B (32 KiB) in L1; AMX_PF lines of the next A block prefetched
 * per step (2 and 8 were slower) */
enum { AMX_MC = 256, AMX_KC = 512, AMX_PF = 4 };
/* rows of a thread's block buffer for partial sums: the larger row block of the two kernels */
#define QG_T_ROWS ((int)QG_MC > (int)AMX_MC ? (int)QG_MC : (int)AMX_MC)

int cdf_k_vdp_threads(int64_t N) {
    const int64_t slabs = (N + QG_NC - 1) / QG_NC;
    int nthr = omp_get_max_threads();
    if (nthr > slabs) nthr = (int)slabs;
    return nthr < 1 ? 1 : nthr;
}

/* rows of the packed A: whole 12-row groups (vdpbf16ps) and whole 32-row blocks (AMX) */
static int64_t a_rows(int64_t M) { return (M + 95) / 96 * 96; }

/* a thread's slab of B (QG_NC columns, all of K, pairs) and its block buffer */
static size_t slab_bytes(int64_t K) { return (size_t)(QG_NC * K) * 2 + (size_t)QG_T_ROWS * QG_LDT * 4; }

size_t cdf_k_vdp_bytes(int64_t M, int64_t K, int nthr) {
    return (size_t)(a_rows(M) * K) * 2 + (size_t)nthr * slab_bytes(K);
}

#ifdef CDF_K_VDP_COMPILED
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,f16c")
#include "kernels/avx512_pairs_impl.h"

/* 16 lanes rounded (bf16_round_512) and the next 16: 32 bf16 in lane order */
static inline __m512i qg_pack32(__m512 lo, __m512 hi) {
    const __m512i idx = _mm512_set_epi16(62, 60, 58, 56, 54, 52, 50, 48, 46, 44, 42, 40, 38, 36, 34, 32, 30, 28, 26, 24,
                                         22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    return _mm512_permutex2var_epi16(bf16_round_512(lo), idx, bf16_round_512(hi));
}

/* A [M, K] (f32 or bf16, row stride lda) into the pair layout, groups [g0, g1) */
static void qg_pack_a(const void *a, cdf_dtype a_dt, int64_t lda, int64_t M, int64_t K, int64_t g0, int64_t g1, uint32_t *ap) {
    const int64_t kp = K / 2;
    for (int64_t g = g0; g < g1; g++) {
        uint32_t *dst = ap + g * kp * QG_MR;
        for (int64_t k = 0; k < K; k += 32) {
            __m512i r[16];
            for (int i = 0; i < 16; i++) {
                const int64_t m = g * QG_MR + i;
                if (i >= QG_MR || m >= M) r[i] = _mm512_setzero_si512();
                else if (a_dt == CDF_F32) {
                    const float *src = (const float *)a + m * lda + k;
                    r[i] = qg_pack32(_mm512_loadu_ps(src), _mm512_loadu_ps(src + 16));
                } else
                    r[i] = _mm512_loadu_si512((const uint16_t *)a + m * lda + k);
            }
            transpose16_epi32(r); /* r[p]: pair k / 2 + p of the 16 rows */
            for (int p = 0; p < 16; p++) _mm512_mask_storeu_epi32(dst + (k / 2 + p) * QG_MR, (__mmask16)0x0fff, r[p]);
        }
    }
}


/* C[0..nr) x [0..32) (ldc) (+)= A group (kp pairs) x B panel; first: C's old contents ignored.
 * out (the last chunk): the sums (+ bias, 32 f32 or NULL) go to out (ldo) instead of C. */
static void qg_ukernel(int64_t kp, const uint32_t *restrict ap, const uint32_t *restrict bp, float *restrict c, int64_t ldc,
                       int nr, bool first, float *restrict out, int64_t ldo, const float *bias) {
    __m512 acc[2 * QG_MR];
#pragma GCC unroll 24
    for (int i = 0; i < 2 * QG_MR; i++)
        acc[i] = first || i / 2 >= nr ? _mm512_setzero_ps() : _mm512_loadu_ps(c + (i / 2) * ldc + (i % 2) * 16);
    /* A's word as a register broadcast: vdpbf16ps with an embedded {1to16} memory operand runs at
     * ~40% of this loop's rate on Zen 4 (measured) */
    for (int64_t p = 0; p < kp; p++, ap += QG_MR, bp += QG_NR) {
        const __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp), b1 = (__m512bh)_mm512_loadu_si512(bp + 16);
#pragma GCC unroll 12
        for (int r = 0; r < QG_MR; r++) {
            const __m512bh x = (__m512bh)_mm512_set1_epi32((int)ap[r]);
            acc[2 * r] = _mm512_dpbf16_ps(acc[2 * r], x, b0);
            acc[2 * r + 1] = _mm512_dpbf16_ps(acc[2 * r + 1], x, b1);
        }
    }
    tile_store32(acc, QG_MR, nr, c, ldc, out, ldo, bias);
}

/* One slab task: columns [n0, n0 + QG_NC) of C for every row. t: the thread's block buffer
 * (QG_MC x QG_LDT f32) for the partial sums: C's rows are ldc apart, a multiple of 4 KiB at FLUX's
 * widths, so a tile's 12 rows would share L1 sets at every chunk's loads; the padded buffer does
 * not. The last chunk writes C (+ bias) once. */
static void qg_slab(const uint32_t *ap, const uint32_t *bp, float *t, float *c, int64_t ldc, const float *bias, int64_t M,
                    int64_t N, int64_t K, int64_t n0) {
    const int64_t kp = K / 2, ncols = N - n0 < QG_NC ? N - n0 : QG_NC, npan = ncols / QG_NR;
    for (int64_t m0 = 0; m0 < M; m0 += QG_MC) {
        const int64_t m1 = M - m0 < QG_MC ? M : m0 + QG_MC;
        for (int64_t pc = 0; pc < K; pc += QG_KC) {
            const int64_t kc = K - pc < QG_KC ? K - pc : QG_KC;
            const bool last = pc + kc == K;
            for (int64_t j = 0; j < npan; j++) {
                const uint32_t *bpan = bp + (j * kp + pc / 2) * QG_NR;
                for (int64_t m = m0; m < m1; m += QG_MR)
                    qg_ukernel(kc / 2, ap + (m / QG_MR * kp + pc / 2) * QG_MR, bpan, t + (m - m0) * QG_LDT + j * QG_NR, QG_LDT,
                               (int)(m1 - m < QG_MR ? m1 - m : QG_MR), pc == 0, last ? c + m * ldc + n0 + j * QG_NR : NULL, ldc,
                               bias ? bias + n0 + j * QG_NR : NULL);
            }
        }
    }
}

static void amx_run(const cdf_k_vdp_gemm_args *g, void *buf, int nthr);

void cdf_k_vdp_run(const cdf_k_vdp_gemm_args *g, void *buf, int nthr) {
    if (g->amx) {
        amx_run(g, buf, nthr);
        return;
    }
    const int64_t M = g->M, N = g->N, K = g->K, groups = (M + QG_MR - 1) / QG_MR, slabs = (N + QG_NC - 1) / QG_NC;
    const size_t ap_bytes = (size_t)(a_rows(M) * K) * 2;
    uint32_t *ap = buf;
#pragma omp parallel num_threads(nthr)
    {
#pragma omp for schedule(static)
        for (int64_t gi = 0; gi < groups; gi++) qg_pack_a(g->a, g->a_dt, g->lda, M, K, gi, gi + 1, ap);
        uint32_t *bp = (uint32_t *)((char *)buf + ap_bytes + (size_t)omp_get_thread_num() * slab_bytes(K));
#pragma omp for schedule(dynamic, 1)
        for (int64_t s = 0; s < slabs; s++) {
            g->fill(g->fill_ctx, s * QG_NC, bp);
            qg_slab(ap, bp, (float *)(bp + QG_NC * K / 2), g->c, g->ldc, g->bias, M, N, K, s * QG_NC);
        }
    }
}

/* ---- bf16 weights ------------------------------------------------------------------------- */

typedef struct bf16_w {
    const uint16_t *w; /* [N, K], row stride ldw */
    int64_t ldw, N, K;
} bf16_w;

/* The bf16 fill: columns [n0, n0 + QG_NC) of W (rows of W past N: zero) into the slab layout,
 * all of K; 16 rows x 32 k at a time, transposed as 32-bit pairs (a pure move of bits). */
static void fill_bf16(const void *ctx, int64_t n0, uint32_t *bp) {
    const bf16_w *w = ctx;
    const int64_t K = w->K, kp = K / 2;
    for (int64_t s = 0; s < QG_NC / 16; s++) { /* 16 columns: half s % 2 of panel s / 2 */
        uint32_t *dst = bp + (s / 2) * kp * QG_NR + (s % 2) * 16;
        for (int64_t k = 0; k < K; k += 32) {
            __m512i r[16];
            for (int i = 0; i < 16; i++) {
                const int64_t n = n0 + 16 * s + i;
                r[i] = n < w->N ? _mm512_loadu_si512(w->w + n * w->ldw + k) : _mm512_setzero_si512();
            }
            transpose16_epi32(r);
            for (int p = 0; p < 16; p++) _mm512_storeu_si512(dst + (k / 2 + p) * QG_NR, r[p]);
        }
    }
}
#pragma GCC pop_options

/* ---- the AMX micro-kernel on the same slabs ------------------------------------------------
 * A rounded to bf16 and packed as tiles (amx_tile below: 16 rows x 32 k, 1 KiB each, in the
 * order the loops read them; rows past M zero). Per slab: MC-row blocks, K chunks of KC, the 8
 * panels of the slab, then 32-row blocks: four 16 x 16 f32 accumulator tiles (2 A tiles x 2 B
 * tiles) over the chunk, 32 k per step, B tiles (16 k pairs x 16 columns) straight from the
 * panel's pair layout (its rows are QG_NR words apart).
 * Why this order (measured, bench_kernels --bf16 and a standalone probe, single core): the tile
 * loads, not tdpbf16ps, set the pace. From L1 the 2 x 2 step runs at ~80% of the tdpbf16ps rate;
 * with both operands from L2 at ~55%, and with the slab's 1.5 MB of B at K 3072 no longer fitting
 * L2 beside A, ~30%. Here the panel's KC x 32 slice (32 KiB) stays in L1 while every 32-row block
 * of the MC rows runs over it; A streams from L2 with the no-reuse hint (tileloaddt1) so it does
 * not push B out of L1, and the next A block is prefetched into L2 a few lines per step. The cost
 * is a trip of the partial sums through the thread's block buffer per chunk (L2); per layer
 * 1.15-1.38x faster than the previous whole-K order at FLUX's shapes, even at SD3.5's K 1536
 * (bench/RESULTS.md). Each element's sum still runs in k order, 32 k per tdpbf16ps
 * (its internal order is the hardware's, fixed), the partial sums stored and reloaded as f32
 * (exact): outputs are bit-identical to that order's. The bias is added after the last chunk,
 * rows past M dropped. */
#if __GNUC__ >= 11
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,f16c,avx2,fma,amx-tile,amx-bf16")
#include "kernels/amx_impl.h"

/* A's tile of 16-row group g (of G) and k step s (32 k): the chunk's tiles for every group in
 * a row, group by group, each group's tiles in k order (the last chunk may be shorter) */
static inline int64_t amx_tile(int64_t G, int64_t K, int64_t g, int64_t s) {
    const int64_t c = s / (AMX_KC / 32), tiles = K / 32 - c * (AMX_KC / 32), in_chunk = tiles < AMX_KC / 32 ? tiles : AMX_KC / 32;
    return (c * G * (AMX_KC / 32) + g * in_chunk + s % (AMX_KC / 32)) * 512;
}

/* groups [g0, g1) of A (f32 rounded to nearest even, as cdf_f32_to_bf16, or bf16) into tiles */
static void amx_pack_a(const void *a, cdf_dtype a_dt, int64_t lda, int64_t M, int64_t K, int64_t G, int64_t g0, int64_t g1,
                       uint16_t *ap) {
    for (int64_t m = g0 * 16; m < g1 * 16; m++) {
        for (int64_t s = 0; s < K / 32; s++) {
            uint16_t *dst = ap + amx_tile(G, K, m / 16, s) + (m % 16) * 32;
            if (m >= M) {
                _mm512_storeu_si512(dst, _mm512_setzero_si512());
            } else if (a_dt == CDF_F32) {
                const float *src = (const float *)a + m * lda + s * 32;
                _mm512_storeu_si512(dst, qg_pack32(_mm512_loadu_ps(src), _mm512_loadu_ps(src + 16)));
            } else {
                _mm512_storeu_si512(dst, _mm512_loadu_si512((const uint16_t *)a + m * lda + s * 32));
            }
        }
    }
}

static void amx_slab(const uint16_t *ap, const uint32_t *bp, float *t, float *c, int64_t ldc, const float *bias,
                     int64_t M, int64_t N, int64_t K, int64_t n0) {
    const int64_t kp = K / 2, ncols = N - n0 < QG_NC ? N - n0 : QG_NC, npan = ncols / QG_NR, G = (M + 31) / 32 * 2;
    const size_t bst = QG_NR * 4, tst = QG_LDT * 4;
    for (int64_t mb = 0; mb < M; mb += AMX_MC) {
        const int64_t me = M - mb < AMX_MC ? M : mb + AMX_MC;
        for (int64_t k0 = 0; k0 < K; k0 += AMX_KC) {
            const int64_t kc = K - k0 < AMX_KC ? K - k0 : AMX_KC;
            const bool first = k0 == 0, last = k0 + kc == K;
            /* the next block's A tiles (contiguous), a few lines per step while this one runs */
            const int64_t nk0 = last ? 0 : k0 + kc, nmb = last ? me : mb;
            const char *pf = NULL, *pf_end = NULL;
            if (nmb < M) {
                const int64_t nrows = (M - nmb < AMX_MC ? M - nmb : AMX_MC) + 31;
                pf = (const char *)(ap + amx_tile(G, K, nmb / 16, nk0 / 32));
                pf_end = pf + (size_t)(nrows / 32 * 2) * (size_t)((K - nk0 < AMX_KC ? K - nk0 : AMX_KC) / 32) * 1024;
            }
            for (int64_t j = 0; j < npan; j++) {
                const uint32_t *bj = bp + (j * kp + k0 / 2) * QG_NR;
                for (int64_t m0 = mb; m0 < me; m0 += 32) {
                    const uint16_t *a0 = ap + amx_tile(G, K, m0 / 16, k0 / 32), *a1 = a0 + (kc / 32) * 512;
                    const int64_t nr = me - m0 < 32 ? me - m0 : 32;
                    /* the partial sums between chunks (f32: stored and reloaded exactly) in the
                     * block buffer; the last chunk's straight to C for a whole block without bias */
                    float *pt = t + (m0 - mb) * QG_LDT + j * QG_NR;
                    const bool direct = last && nr == 32 && !bias;
                    float *pc = direct ? c + m0 * ldc + n0 + j * QG_NR : pt;
                    const int64_t ld = direct ? ldc : QG_LDT;
                    const size_t pst = (size_t)ld * 4;
                    if (first) {
                        _tile_zero(0);
                        _tile_zero(1);
                        _tile_zero(2);
                        _tile_zero(3);
                    } else {
                        _tile_loadd(0, pt, tst);
                        _tile_loadd(1, pt + 16, tst);
                        _tile_loadd(2, pt + 16 * QG_LDT, tst);
                        _tile_loadd(3, pt + 16 * QG_LDT + 16, tst);
                    }
                    const uint32_t *b = bj;
                    for (int64_t s = 0; s < kc / 32; s++, b += 16 * QG_NR) {
                        for (int l = 0; l < AMX_PF && pf < pf_end; l++, pf += 64) _mm_prefetch(pf, _MM_HINT_T1);
                        _tile_stream_loadd(4, a0 + s * 512, 64);
                        _tile_loadd(6, b, bst);
                        _tile_dpbf16ps(0, 4, 6);
                        _tile_loadd(7, b + 16, bst);
                        _tile_dpbf16ps(1, 4, 7);
                        _tile_stream_loadd(5, a1 + s * 512, 64);
                        _tile_dpbf16ps(2, 5, 6);
                        _tile_dpbf16ps(3, 5, 7);
                    }
                    _tile_stored(0, pc, pst);
                    _tile_stored(1, pc + 16, pst);
                    _tile_stored(2, pc + 16 * ld, pst);
                    _tile_stored(3, pc + 16 * ld + 16, pst);
                    if (!last || direct) continue;
                    /* the bias after the whole sum; rows < nr to C */
                    const float *bn = bias ? bias + n0 + j * QG_NR : NULL;
                    const __m512 v0 = bn ? _mm512_loadu_ps(bn) : _mm512_setzero_ps(), v1 = bn ? _mm512_loadu_ps(bn + 16) : v0;
                    for (int64_t r = 0; r < nr; r++) {
                        float *out = c + (m0 + r) * ldc + n0 + j * QG_NR;
                        const float *sum = pt + r * QG_LDT;
                        const __m512 s0 = _mm512_loadu_ps(sum), s1 = _mm512_loadu_ps(sum + 16);
                        _mm512_storeu_ps(out, bn ? _mm512_add_ps(s0, v0) : s0);
                        _mm512_storeu_ps(out + 16, bn ? _mm512_add_ps(s1, v1) : s1);
                    }
                }
            }
        }
    }
}

static void amx_run(const cdf_k_vdp_gemm_args *g, void *buf, int nthr) {
    const int64_t M = g->M, N = g->N, K = g->K, G = (M + 31) / 32 * 2, slabs = (N + QG_NC - 1) / QG_NC;
    const size_t ap_bytes = (size_t)(a_rows(M) * K) * 2;
    uint16_t *ap = buf;
#pragma omp parallel num_threads(nthr)
    {
#pragma omp for schedule(static)
        for (int64_t gi = 0; gi < G; gi += 2) amx_pack_a(g->a, g->a_dt, g->lda, M, K, G, gi, gi + 2, ap);
        uint32_t *bp = (uint32_t *)((char *)buf + ap_bytes + (size_t)omp_get_thread_num() * slab_bytes(K));
        amx_config_16x64();
#pragma omp for schedule(dynamic, 1)
        for (int64_t s = 0; s < slabs; s++) {
            g->fill(g->fill_ctx, s * QG_NC, bp);
            amx_slab(ap, bp, (float *)(bp + QG_NC * K / 2), g->c, g->ldc, g->bias, M, N, K, s * QG_NC);
        }
        _tile_release();
    }
}
#pragma GCC pop_options
#else
static void amx_run(const cdf_k_vdp_gemm_args *g, void *buf, int nthr) { (void)g, (void)buf, (void)nthr; }
#endif
#endif

static int g_on = -1;
static _Atomic int64_t g_calls;
void cdf_k_gemm_vdp_bf16_set(int on) { g_on = on < 0 ? -1 : on > 2 ? 2 : on; }
int64_t cdf_k_gemm_vdp_bf16_calls(void) { return atomic_load(&g_calls); }

/* Its case but for the row count (batch items stacked): below VDP_MIN_M rows a call is a few
 * matrix-vector products, bound by reading the weight, and the slab's repack (written, then
 * read back) costs more than oneDNN's direct read: bench_kernels --bf16, M = 1 x 3072 -> 18432
 * (AdaLN): 1.7x oneDNN's CPU time; M = 333: even; M >= 512: at or below it. */
enum { VDP_MIN_M = 128 };
cdf_k_vdp_kernel cdf_k_vdp_micro_kernel(void) {
#ifdef CDF_K_VDP_COMPILED
    const cdf_k_cpu_features *cpu = cdf_k_cpu();
    if (cdf_k_isa_level() < CDF_K_ISA_AVX512_BF16 || !cpu->avx512_bf16) return CDF_VDP_NONE;
    if (!cpu->amx_bf16) return CDF_VDP_DPBF16;
    /* GCC 11+ has the AMX intrinsics; the OS must grant the tile state */
    return __GNUC__ >= 11 && cdf_k_amx_usable() ? CDF_VDP_AMX : CDF_VDP_NONE;
#else
    return CDF_VDP_NONE;
#endif
}

static bool takes_shape(const cdf_k_matmul_args *x) {
#ifdef CDF_K_VDP_COMPILED
    if (g_on < 0) {
        const char *e = getenv("CDIFFUSERS_BF16_GEMM");
        g_on = !(e && strcmp(e, "0") == 0);
    }
    if (!g_on || cdf_k_vdp_micro_kernel() == CDF_VDP_NONE) return false;
    if (!x || x->batch < 1 || x->M < 1 || x->N < 1 || x->K < 1 || !x->a || !x->b || !x->c) return false;
    if (x->b_dt != CDF_BF16 || !x->trans_b || x->trans_a || (x->a_dt != CDF_F32 && x->a_dt != CDF_BF16) || x->c_dt != CDF_F32)
        return false;
    if (x->alpha != 1.0f || x->beta != 0.0f || (x->bias && x->bias_dt != CDF_F32 && x->bias_dt != CDF_BF16)) return false;
    /* a transient B is a quantized layer's decoded panel (matmul_quant.c): those keep oneDNN, the
     * path their panels are decoded for and checked against bit for bit */
    if (x->b_transient) return false;
    if (x->N % QG_NR || x->K % 32 || x->lda < x->K || x->ldb < x->K || x->ldc < x->N) return false;
    /* batch items share the weight and stack as rows of one [batch * M, K] A and C */
    if (x->batch > 1 && (x->sb != 0 || x->sa != x->M * x->lda || x->sc != x->M * x->ldc)) return false;
    return true;
#else
    (void)x;
    return false;
#endif
}

bool cdf_k_gemm_vdp_bf16_supports(const cdf_k_matmul_args *x) {
    return takes_shape(x) && (g_on == 2 || x->batch * x->M >= VDP_MIN_M);
}

bool cdf_k_gemm_vdp_bf16_skips_pack(const cdf_k_matmul_args *x) {
    return takes_shape(x) && g_on != 2 && x->batch * x->M < VDP_MIN_M;
}

cdf_status cdf_k_gemm_vdp_bf16(const cdf_k_matmul_args *x, bool *handled) {
    if (!handled) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_k_gemm_vdp_bf16: handled is NULL");
    *handled = false;
#ifdef CDF_K_VDP_COMPILED
    if (!cdf_k_gemm_vdp_bf16_supports(x)) return CDF_OK;
    const int64_t M = x->batch * x->M, N = x->N, K = x->K;
    const int nthr = cdf_k_vdp_threads(N);
    const size_t core = cdf_k_vdp_bytes(M, K, nthr), bias_bytes = x->bias ? (size_t)N * sizeof(float) : 0;
    /* kept for reuse when freed (core/host_memory.h): a fresh mapping per call would have the
     * kernel zero its pages again every call */
    const size_t bytes = core + bias_bytes;
    char *buf = cdf_host_alloc_large(bytes);
    if (!buf) return CDF_OK; /* oneDNN or the reference may need less */
    float *bias = x->bias ? (float *)(buf + core) : NULL;
    if (bias) cdf_convert(bias, CDF_F32, x->bias, x->bias_dt, (size_t)N);
    const bf16_w w = {.w = x->b, .ldw = x->ldb, .N = N, .K = K};
    const cdf_k_vdp_gemm_args g = {.M = M, .N = N, .K = K, .a = x->a, .a_dt = x->a_dt, .lda = x->lda, .fill = fill_bf16,
                                   .fill_ctx = &w, .c = x->c, .ldc = x->ldc, .bias = bias,
                                   .amx = cdf_k_vdp_micro_kernel() == CDF_VDP_AMX};
    cdf_k_vdp_run(&g, buf, nthr);
    cdf_host_free_large(buf, bytes);
    atomic_fetch_add(&g_calls, 1);
    *handled = true;
    cdf_k_matmul_run_epilogue(x);
#else
    (void)x;
#endif
    return CDF_OK;
}
