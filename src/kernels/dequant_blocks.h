/* ggml's block formats, one block at a time: the decode arithmetic shared by the CPU decoder
 * (dequant.c: cdf_ggml_dequantize) and the CUDA decode kernel (backend/cuda/kernels/
 * cuda_dequant.cu), so that the tests comparing dequant.c bit for bit with gguf-py's
 * `gguf.quants.dequantize` (tests/test_io_gguf.c) cover the very code the GPU runs, and a GGUF
 * layer computes the same weights on every backend.
 *
 * Plain C (dequant.c) and CUDA C++ (nvcc): CDF_DQ_FN is `static inline` in C and
 * `static inline __host__ __device__` under nvcc. Bit-exactness with numpy needs every product and
 * sum rounded to f32 on its own (numpy rounds the product before the subtraction). With today's
 * formats the products that feed a sum happen to be exact (an f16 scale times small integers
 * needs at most 22 significant bits), so an FMA would give the same bits; the guarantee must not
 * rest on that (a wider scale or another format breaks it silently), so no a*b+c may be
 * contracted: every float operation is written through CDF_DQ_MUL / CDF_DQ_ADD / CDF_DQ_SUB. In
 * device code they are __fmul_rn / __fadd_rn / __fsub_rn (PTX mul.rn / add.rn / sub.rn, which
 * are never fused, whereas nvcc contracts plain operators by default, -fmad=true; the .cu file
 * is also compiled with -fmad=false); in C they are the plain operators and dequant.c is
 * compiled with -ffp-contract=off (plus the clang pragma there). Integer -> float conversions
 * here are of small integers: exact.
 *
 * Block layouts: ggml-common.h; the element order inside a block is spelt out per type. */
#ifndef CDF_KERNELS_DEQUANT_BLOCKS_H
#define CDF_KERNELS_DEQUANT_BLOCKS_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "cdiffusers/io.h" /* CDF_GGML_* type codes */

#if defined(__CUDACC__)
#define CDF_DQ_FN static inline __host__ __device__
#else
#define CDF_DQ_FN static inline
#endif

#if defined(__CUDA_ARCH__)
#define CDF_DQ_MUL(a, b) __fmul_rn((a), (b))
#define CDF_DQ_ADD(a, b) __fadd_rn((a), (b))
#define CDF_DQ_SUB(a, b) __fsub_rn((a), (b))
#else
#define CDF_DQ_MUL(a, b) ((a) * (b))
#define CDF_DQ_ADD(a, b) ((a) + (b))
#define CDF_DQ_SUB(a, b) ((a) - (b))
#endif

#define CDF_DQ_QK_K 256
#define CDF_DQ_MAX_BLOCK 256 /* the most values one block holds (the K-quants) */

CDF_DQ_FN float cdf_dq_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* An f16 read from two little-endian bytes, exactly (the value cdf_f16_to_f32 gives: zeros and
 * subnormals are mant * 2^-24, an exact product; infinities and NaNs keep their payload). */
CDF_DQ_FN float cdf_dq_f16(const uint8_t *p) {
    const uint32_t h = (uint32_t)p[0] | (uint32_t)p[1] << 8;
    const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0) {
        const float v = CDF_DQ_MUL((float)mant, 5.9604644775390625e-8f); /* 2^-24 */
        return sign ? -v : v;
    }
    if (exp == 31) return cdf_dq_from_bits(sign | 0x7f800000u | mant << 13);
    return cdf_dq_from_bits(sign | (exp + 112u) << 23 | mant << 13); /* rebias 15 -> 127 */
}

/* f32 -> bf16 bits, round to nearest even, NaN quieted: cdf_f32_to_bf16's rule (what
 * cdf_k_store_row does to a bf16 panel on the CPU). */
CDF_DQ_FN uint16_t cdf_dq_bf16_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Q8_0: f16 d, 32 x i8; value q * d. */
CDF_DQ_FN void cdf_dq_q8_0(const uint8_t *b, float *y) {
    const float d = cdf_dq_f16(b);
    for (int i = 0; i < 32; i++) y[i] = CDF_DQ_MUL((float)(int8_t)b[2 + i], d);
}

/* Q4_0: f16 d, 16 bytes; element j < 16 is the low nibble of byte j, j >= 16 the high nibble of
 * byte j - 16; value d * (q - 8). */
CDF_DQ_FN void cdf_dq_q4_0(const uint8_t *b, float *y) {
    const float d = cdf_dq_f16(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) {
        y[j] = CDF_DQ_MUL(d, (float)((qs[j] & 0x0F) - 8));
        y[j + 16] = CDF_DQ_MUL(d, (float)((qs[j] >> 4) - 8));
    }
}

/* Q4_1: f16 d, f16 m, 16 bytes as Q4_0; value d * q + m (the product rounded first). */
CDF_DQ_FN void cdf_dq_q4_1(const uint8_t *b, float *y) {
    const float d = cdf_dq_f16(b), m = cdf_dq_f16(b + 2);
    const uint8_t *qs = b + 4;
    for (int j = 0; j < 16; j++) {
        y[j] = CDF_DQ_ADD(CDF_DQ_MUL(d, (float)(qs[j] & 0x0F)), m);
        y[j + 16] = CDF_DQ_ADD(CDF_DQ_MUL(d, (float)(qs[j] >> 4)), m);
    }
}

/* Q5_0: f16 d, u32 qh (bit j = fifth bit of element j), 16 bytes of nibbles as Q4_0;
 * value d * (q - 16). */
CDF_DQ_FN void cdf_dq_q5_0(const uint8_t *b, float *y) {
    const float d = cdf_dq_f16(b);
    const uint32_t qh = (uint32_t)b[2] | (uint32_t)b[3] << 8 | (uint32_t)b[4] << 16 | (uint32_t)b[5] << 24;
    const uint8_t *qs = b + 6;
    for (int j = 0; j < 16; j++) {
        const int lo = (qs[j] & 0x0F) | (int)((qh >> j) & 1) << 4;
        const int hi = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
        y[j] = CDF_DQ_MUL(d, (float)(lo - 16));
        y[j + 16] = CDF_DQ_MUL(d, (float)(hi - 16));
    }
}

/* Q5_1: f16 d, f16 m, u32 qh, 16 bytes; value d * q + m. */
CDF_DQ_FN void cdf_dq_q5_1(const uint8_t *b, float *y) {
    const float d = cdf_dq_f16(b), m = cdf_dq_f16(b + 2);
    const uint32_t qh = (uint32_t)b[4] | (uint32_t)b[5] << 8 | (uint32_t)b[6] << 16 | (uint32_t)b[7] << 24;
    const uint8_t *qs = b + 8;
    for (int j = 0; j < 16; j++) {
        const int lo = (qs[j] & 0x0F) | (int)((qh >> j) & 1) << 4;
        const int hi = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
        y[j] = CDF_DQ_ADD(CDF_DQ_MUL(d, (float)lo), m);
        y[j + 16] = CDF_DQ_ADD(CDF_DQ_MUL(d, (float)hi), m);
    }
}

/* Q2_K: 16 scale bytes (low nibble scale, high nibble min, one per 16 elements), 64 bytes of
 * 2-bit values, f16 d, f16 dmin. Element e = h*128 + k*32 + l takes bits 2k of byte h*32 + l;
 * value (d * sc) * q - (dmin * mn). */
CDF_DQ_FN void cdf_dq_q2_k(const uint8_t *b, float *y) {
    const uint8_t *sc = b, *qs = b + 16;
    const float d = cdf_dq_f16(b + 80), dmin = cdf_dq_f16(b + 82);
    for (int e = 0; e < CDF_DQ_QK_K; e++) {
        const int h = e >> 7, k = (e >> 5) & 3, l = e & 31, s = e >> 4;
        const float dl = CDF_DQ_MUL(d, (float)(sc[s] & 0x0F)), ml = CDF_DQ_MUL(dmin, (float)(sc[s] >> 4));
        const float q = (float)((qs[h * 32 + l] >> (2 * k)) & 3);
        y[e] = CDF_DQ_SUB(CDF_DQ_MUL(dl, q), ml);
    }
}

/* Q3_K: 32 bytes hmask, 64 bytes of 2-bit values, 12 bytes of 6-bit scales, f16 d.
 * Element e = h*128 + k*32 + l: low bits (qs[h*32 + l] >> 2k) & 3, high-bit mask bit (e >> 5) of
 * hmask[l] (a clear bit subtracts 4). Scale i (16 of them): low 4 bits from byte i & 7 (nibble
 * i >> 3), high 2 bits from byte 8 + (i & 3) (bits 2 * (i >> 2)); minus 32. */
CDF_DQ_FN void cdf_dq_q3_k(const uint8_t *b, float *y) {
    const uint8_t *hm = b, *qs = b + 32, *sc = b + 96;
    const float d = cdf_dq_f16(b + 108);
    float dl[16];
    for (int i = 0; i < 16; i++) {
        const int lo = (sc[i & 7] >> (4 * (i >> 3))) & 0x0F;
        const int hi = (sc[8 + (i & 3)] >> (2 * (i >> 2))) & 3;
        dl[i] = CDF_DQ_MUL(d, (float)((lo | hi << 4) - 32));
    }
    for (int e = 0; e < CDF_DQ_QK_K; e++) {
        const int h = e >> 7, k = (e >> 5) & 3, l = e & 31;
        int q = (qs[h * 32 + l] >> (2 * k)) & 3;
        if (!((hm[l] >> (e >> 5)) & 1)) q -= 4;
        y[e] = CDF_DQ_MUL(dl[e >> 4], (float)q);
    }
}

/* The 8 six-bit scales and mins of Q4_K/Q5_K packed in 12 bytes. */
CDF_DQ_FN void cdf_dq_k4_scale_min(const uint8_t *s, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Q4_K: f16 d, f16 dmin, 12 scale bytes, 128 bytes; sub-block j (32 elements) reads byte
 * (j/2)*32 + l, low nibble for even j, high for odd; value (d * sc) * q - (dmin * mn). */
CDF_DQ_FN void cdf_dq_q4_k(const uint8_t *b, float *y) {
    const float d = cdf_dq_f16(b), dmin = cdf_dq_f16(b + 2);
    const uint8_t *scales = b + 4, *qs = b + 16;
    for (int j = 0; j < 8; j++) {
        int sc, mn;
        cdf_dq_k4_scale_min(scales, j, &sc, &mn);
        const float dd = CDF_DQ_MUL(d, (float)sc), dm = CDF_DQ_MUL(dmin, (float)mn);
        for (int l = 0; l < 32; l++) {
            const int q = (qs[(j >> 1) * 32 + l] >> (4 * (j & 1))) & 0x0F;
            y[j * 32 + l] = CDF_DQ_SUB(CDF_DQ_MUL(dd, (float)q), dm);
        }
    }
}

/* Q5_K: as Q4_K plus 32 bytes qh before the nibbles: bit j of qh[l] is the fifth bit. */
CDF_DQ_FN void cdf_dq_q5_k(const uint8_t *b, float *y) {
    const float d = cdf_dq_f16(b), dmin = cdf_dq_f16(b + 2);
    const uint8_t *scales = b + 4, *qh = b + 16, *qs = b + 48;
    for (int j = 0; j < 8; j++) {
        int sc, mn;
        cdf_dq_k4_scale_min(scales, j, &sc, &mn);
        const float dd = CDF_DQ_MUL(d, (float)sc), dm = CDF_DQ_MUL(dmin, (float)mn);
        for (int l = 0; l < 32; l++) {
            const int q = ((qs[(j >> 1) * 32 + l] >> (4 * (j & 1))) & 0x0F) | ((qh[l] >> j) & 1) << 4;
            y[j * 32 + l] = CDF_DQ_SUB(CDF_DQ_MUL(dd, (float)q), dm);
        }
    }
}

/* Q6_K: 128 bytes ql, 64 bytes qh, 16 i8 scales, f16 d. Element e = h*128 + r (r < 128): low
 * nibble (ql[h*64 + (r & 63)] >> 4*(r >> 6)) & 15, high bits (qh[h*32 + (r & 31)] >> 2*(r >> 5)) & 3;
 * value (d * scale[e / 16]) * (q - 32). */
CDF_DQ_FN void cdf_dq_q6_k(const uint8_t *b, float *y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    const float d = cdf_dq_f16(b + 208);
    for (int e = 0; e < CDF_DQ_QK_K; e++) {
        const int h = e >> 7, r = e & 127;
        const int lo = (ql[h * 64 + (r & 63)] >> (4 * (r >> 6))) & 0x0F;
        const int hi = (qh[h * 32 + (r & 31)] >> (2 * (r >> 5))) & 3;
        const float dd = CDF_DQ_MUL(d, (float)sc[e >> 4]);
        y[e] = CDF_DQ_MUL(dd, (float)((lo | hi << 4) - 32));
    }
}

/* Values and bytes per block of the block types decoded here (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
 * Q2_K .. Q6_K); false for any other type. */
CDF_DQ_FN bool cdf_dq_block_size(uint32_t type, int *be, int *bb) {
    switch (type) {
    case CDF_GGML_Q8_0: *be = 32; *bb = 34; return true;
    case CDF_GGML_Q4_0: *be = 32; *bb = 18; return true;
    case CDF_GGML_Q4_1: *be = 32; *bb = 20; return true;
    case CDF_GGML_Q5_0: *be = 32; *bb = 22; return true;
    case CDF_GGML_Q5_1: *be = 32; *bb = 24; return true;
    case CDF_GGML_Q2_K: *be = CDF_DQ_QK_K; *bb = 84; return true;
    case CDF_GGML_Q3_K: *be = CDF_DQ_QK_K; *bb = 110; return true;
    case CDF_GGML_Q4_K: *be = CDF_DQ_QK_K; *bb = 144; return true;
    case CDF_GGML_Q5_K: *be = CDF_DQ_QK_K; *bb = 176; return true;
    case CDF_GGML_Q6_K: *be = CDF_DQ_QK_K; *bb = 210; return true;
    default: return false;
    }
}

/* One block of type at b decoded into y (cdf_dq_block_size values); false for an unknown type. */
CDF_DQ_FN bool cdf_dq_block(uint32_t type, const uint8_t *b, float *y) {
    switch (type) {
    case CDF_GGML_Q8_0: cdf_dq_q8_0(b, y); return true;
    case CDF_GGML_Q4_0: cdf_dq_q4_0(b, y); return true;
    case CDF_GGML_Q4_1: cdf_dq_q4_1(b, y); return true;
    case CDF_GGML_Q5_0: cdf_dq_q5_0(b, y); return true;
    case CDF_GGML_Q5_1: cdf_dq_q5_1(b, y); return true;
    case CDF_GGML_Q2_K: cdf_dq_q2_k(b, y); return true;
    case CDF_GGML_Q3_K: cdf_dq_q3_k(b, y); return true;
    case CDF_GGML_Q4_K: cdf_dq_q4_k(b, y); return true;
    case CDF_GGML_Q5_K: cdf_dq_q5_k(b, y); return true;
    case CDF_GGML_Q6_K: cdf_dq_q6_k(b, y); return true;
    default: return false;
    }
}

/* How a decoded weight panel is stored (the GPU's matmul input). */
typedef enum cdf_dq_store {
    CDF_DQ_STORE_F32,       /* the decoded f32 values (an f32 weight) */
    CDF_DQ_STORE_BF16,      /* rounded to bf16 (a bf16 weight in a bf16 product) */
    CDF_DQ_STORE_F32_BF16R, /* rounded to bf16 and widened back (a bf16 weight in an f32 product) */
} cdf_dq_store;

/* Block i of a run of contiguous blocks of type, decoded into out (values i*be .. (i+1)*be) as
 * `store` says; the bf16 rounding is the CPU's (cdf_dq_bf16_bits). This is the whole per-thread
 * work of the CUDA decode kernel; tests/test_io_gguf.c runs it on the CPU against
 * cdf_ggml_dequantize. False for an unknown type (nothing written). */
CDF_DQ_FN bool cdf_dq_store_block(uint32_t type, const uint8_t *blocks, int64_t i, void *out, cdf_dq_store store) {
    int be, bb;
    float y[CDF_DQ_MAX_BLOCK];
    if (!cdf_dq_block_size(type, &be, &bb) || !cdf_dq_block(type, blocks + i * bb, y)) return false;
    if (store == CDF_DQ_STORE_BF16) {
        uint16_t *o = (uint16_t *)out + i * be;
        for (int k = 0; k < be; k++) o[k] = cdf_dq_bf16_bits(y[k]);
    } else {
        float *o = (float *)out + i * be;
        if (store == CDF_DQ_STORE_F32)
            for (int k = 0; k < be; k++) o[k] = y[k];
        else
            for (int k = 0; k < be; k++) o[k] = cdf_dq_from_bits((uint32_t)cdf_dq_bf16_bits(y[k]) << 16);
    }
    return true;
}

#ifndef __CUDACC__
/* cdf_dq_store_block for blocks 0 .. n_blocks - 1 on the host, compiled as dequant.c is (no
 * contraction): what the CUDA decode kernel writes, for tests on machines without a GPU. False
 * for an unknown type. */
bool cdf_k_dequant_store_blocks(uint32_t type, const void *blocks, int64_t n_blocks, void *out, cdf_dq_store store);
#endif

#endif
