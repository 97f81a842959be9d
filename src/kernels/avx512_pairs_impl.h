/* AVX-512 helpers shared by the Q8_0 decode and int8 GEMM (kernels/matmul_quant.c) and the
 * vdpbf16ps GEMM (kernels/gemm_vdpbf16.c). Include inside a `#pragma GCC target` region enabling at least
 * avx512f and avx512bw (the functions are static inline and take that region's target). */
#ifndef CDF_KERNELS_AVX512_PAIRS_IMPL_H
#define CDF_KERNELS_AVX512_PAIRS_IMPL_H

#include <immintrin.h>
#include <stdint.h>

/* f32 lanes rounded to bf16 as cdf_f32_to_bf16 does (nearest even; NaN kept quiet), in the low
 * 16 bits of each 32-bit lane */
static inline __m512i bf16_round_512(__m512 f) {
    const __m512i u = _mm512_castps_si512(f);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
    return _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
}

/* r[0..15] (16 rows of 16 32-bit lanes) transposed in place: row i lane l goes to row l lane i.
 * In-lane interleaves of 32-bit, then 64-bit words (after them t[4g + c] holds rows 4g..4g+3 of
 * column 4L + c in its 128-bit lane L), then two rounds of 128-bit lane shuffles gather each
 * column's four lanes: 64 single-cycle shuffles, where swapping blocks with cross-lane permutes
 * and blends took 128 (the decode's largest part). */
static inline void transpose16_epi32(__m512i r[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 16; i += 2) t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]), t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    for (int g = 0; g < 4; g++) { /* rows 4g..4g+3 */
        const __m512i *q = t + 4 * g;
        u[4 * g + 0] = _mm512_unpacklo_epi64(q[0], q[2]), u[4 * g + 1] = _mm512_unpackhi_epi64(q[0], q[2]);
        u[4 * g + 2] = _mm512_unpacklo_epi64(q[1], q[3]), u[4 * g + 3] = _mm512_unpackhi_epi64(q[1], q[3]);
    }
    for (int c = 0; c < 4; c++) {
        const __m512i v = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x88), w = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xdd);
        const __m512i v2 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x88), w2 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xdd);
        r[c] = _mm512_shuffle_i32x4(v, v2, 0x88), r[8 + c] = _mm512_shuffle_i32x4(v, v2, 0xdd);
        r[4 + c] = _mm512_shuffle_i32x4(w, w2, 0x88), r[12 + c] = _mm512_shuffle_i32x4(w, w2, 0xdd);
    }
}

/* The end of the own GEMMs' micro-kernels: rows [0, nr) of a tile of 32-column f32 accumulators
 * (acc[2r], acc[2r + 1]: row r) stored to the partial-sum buffer c (ldc), or with the bias (32
 * f32 or NULL) to out (ldo) after the last chunk */
static inline __attribute__((always_inline)) void tile_store32(const __m512 *acc, int mr, int nr, float *c, int64_t ldc,
                                                               float *out, int64_t ldo, const float *bias) {
    if (out) {
        const __m512 v0 = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps(), v1 = bias ? _mm512_loadu_ps(bias + 16) : v0;
#pragma GCC unroll 24
        for (int i = 0; i < 2 * mr; i++)
            if (i / 2 < nr) _mm512_storeu_ps(out + (i / 2) * ldo + (i % 2) * 16, bias ? _mm512_add_ps(acc[i], i % 2 ? v1 : v0) : acc[i]);
        return;
    }
#pragma GCC unroll 24
    for (int i = 0; i < 2 * mr; i++)
        if (i / 2 < nr) _mm512_storeu_ps(c + (i / 2) * ldc + (i % 2) * 16, acc[i]);
}

#endif
