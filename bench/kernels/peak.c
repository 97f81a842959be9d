/* Instruction-throughput peaks of this CPU, measured from registers (no memory traffic), to
 * put the matmul figures of bench_kernels.c in proportion:
 *   f32 FMA (AVX-512 or AVX2 vfmadd231ps), bf16 dot products (AVX512-BF16 vdpbf16ps) and AMX-BF16 tile
 *   dot products (tdpbf16ps).
 * Each function is compiled for its own ISA through a target attribute (the rest of the
 * program stays generic) and must only be called when cpuid says the ISA is there. Returns
 * FLOP/s of the calling thread. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "peak.h"

static int use_cpu_clock; /* peak_use_cpu_time */

void peak_use_cpu_time(int on) { use_cpu_clock = on; }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(use_cpu_clock ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* 12 independent accumulators in registers hide the FMA latency (4 cycles x up to 2 ports);
 * the loop-carried dependence keeps the compiler from removing the work. */
__attribute__((target("avx512f"))) double peak_f32_fma(int64_t iters) {
    __m512 c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11;
    /* distinct starting values, so the compiler cannot merge the chains */
#define INIT12                                                                                                        \
    c0 = _mm512_set1_ps(0.01f); c1 = _mm512_set1_ps(0.02f); c2 = _mm512_set1_ps(0.03f); c3 = _mm512_set1_ps(0.04f);  \
    c4 = _mm512_set1_ps(0.05f); c5 = _mm512_set1_ps(0.06f); c6 = _mm512_set1_ps(0.07f); c7 = _mm512_set1_ps(0.08f);  \
    c8 = _mm512_set1_ps(0.09f); c9 = _mm512_set1_ps(0.10f); c10 = _mm512_set1_ps(0.11f); c11 = _mm512_set1_ps(0.12f)
    INIT12;
    const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
    double t0 = now_s();
    for (int64_t it = 0; it < iters; it++) {
#define FMA12(op)                                                                                                      \
    c0 = op(c0, a, b); c1 = op(c1, a, b); c2 = op(c2, a, b); c3 = op(c3, a, b); c4 = op(c4, a, b);                    \
    c5 = op(c5, a, b); c6 = op(c6, a, b); c7 = op(c7, a, b); c8 = op(c8, a, b); c9 = op(c9, a, b);                    \
    c10 = op(c10, a, b); c11 = op(c11, a, b)
        FMA12(_mm512_fmadd_ps);
    }
    double t = now_s() - t0;
#define SUM12 _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c0, c1), _mm512_add_ps(c2, c3)), \
    _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c4, c5), _mm512_add_ps(c6, c7)),                \
                  _mm512_add_ps(_mm512_add_ps(c8, c9), _mm512_add_ps(c10, c11))))
    __m512 s = SUM12;
    volatile float sink = _mm512_reduce_add_ps(s);
    (void)sink;
    return (double)iters * 12 * 16 * 2 / t;
}

/* The same with AVX2 ymm registers (8 lanes): the f32 peak of an AVX2+FMA machine. */
__attribute__((target("avx2,fma"))) double peak_f32_fma_avx2(int64_t iters) {
    __m256 c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11;
    c0 = _mm256_set1_ps(0.01f); c1 = _mm256_set1_ps(0.02f); c2 = _mm256_set1_ps(0.03f); c3 = _mm256_set1_ps(0.04f);
    c4 = _mm256_set1_ps(0.05f); c5 = _mm256_set1_ps(0.06f); c6 = _mm256_set1_ps(0.07f); c7 = _mm256_set1_ps(0.08f);
    c8 = _mm256_set1_ps(0.09f); c9 = _mm256_set1_ps(0.10f); c10 = _mm256_set1_ps(0.11f); c11 = _mm256_set1_ps(0.12f);
    const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
    double t0 = now_s();
    for (int64_t it = 0; it < iters; it++) {
        FMA12(_mm256_fmadd_ps);
    }
    double t = now_s() - t0;
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(c2, c3)),
                             _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(c4, c5), _mm256_add_ps(c6, c7)),
                                           _mm256_add_ps(_mm256_add_ps(c8, c9), _mm256_add_ps(c10, c11))));
    float lanes[8];
    _mm256_storeu_ps(lanes, s);
    volatile float sink = lanes[0];
    (void)sink;
    return (double)iters * 12 * 8 * 2 / t;
}

/* vdpbf16ps: 16 lanes x 2 bf16 products, each accumulated = 4 FLOP per lane. */
__attribute__((target("avx512f,avx512bf16"))) double peak_bf16_dp(int64_t iters) {
    __m512 c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11;
    INIT12;
    const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3380);
    double t0 = now_s();
    for (int64_t it = 0; it < iters; it++) {
        FMA12(_mm512_dpbf16_ps);
    }
    double t = now_s() - t0;
    __m512 s = SUM12;
    volatile float sink = _mm512_reduce_add_ps(s);
    (void)sink;
    return (double)iters * 12 * 16 * 4 / t;
}

/* AMX: tiles 0-3 are 16x16 f32 accumulators, 4-5 A (16 rows x 32 bf16), 6-7 B (16 x 32 bf16
 * pairs). One tdpbf16ps = 16*16*32 multiply-adds = 16384 FLOP. The caller must have obtained
 * the XTILEDATA permission (arch_prctl) first. */
typedef struct __attribute__((packed)) tile_config {
    uint8_t palette_id, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

__attribute__((target("amx-tile,amx-bf16"))) double peak_amx_bf16(int64_t iters) {
    static uint16_t abuf[16 * 32] __attribute__((aligned(64)));
    for (int i = 0; i < 16 * 32; i++) abuf[i] = 0x3f80; /* 1.0 */
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    for (int t = 0; t < 8; t++) {
        cfg.colsb[t] = 64;
        cfg.rows[t] = 16;
    }
    _tile_loadconfig(&cfg);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, abuf, 64);
    _tile_loadd(5, abuf, 64);
    _tile_loadd(6, abuf, 64);
    _tile_loadd(7, abuf, 64);
    double t0 = now_s();
    for (int64_t it = 0; it < iters; it++) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    double t = now_s() - t0;
    static float cbuf[16 * 16] __attribute__((aligned(64)));
    _tile_stored(0, cbuf, 64);
    _tile_release();
    volatile float sink = cbuf[0];
    (void)sink;
    return (double)iters * 4 * 16384 / t;
}
