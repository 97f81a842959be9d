/* GGUF reader and ggml dequantization.
 *
 * The expected values come from the gguf Python package (tools/make-format-refs/make_gguf_refs.py):
 * dequant_refs.safetensors holds random blocks of every supported type and
 * gguf.quants.dequantize's f32 output, compared here bit for bit; tiny_v3.gguf (written by
 * gguf.GGUFWriter), its v2 twin and a 64-byte-aligned variant are read and dequantized and
 * compared with what gguf's own GGUFReader + dequantize produced. The malformed files of the
 * bad-input table are built here byte by byte. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdiffusers/error.h"
#include "cdiffusers/io.h"
#include "kernels/dequant_blocks.h"

static const char *k_types[] = {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0",
                                "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"};
#define N_TYPES (int)(sizeof k_types / sizeof *k_types)

static uint32_t type_id(const char *name) {
    for (uint32_t i = 0; i < 64; i++)
        if (cdf_ggml_type_name(i) && strcmp(cdf_ggml_type_name(i), name) == 0) return i;
    fail_msg("unknown type %s", name);
    return 0;
}

/* Bitwise equality (NaN payloads included); reports the first difference. */
static void assert_same_bits(const float *got, const float *want, int64_t n, const char *what) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t a, b;
        memcpy(&a, &got[i], 4);
        memcpy(&b, &want[i], 4);
        if (a != b) fail_msg("%s: element %lld is %.9g (0x%08x), the reference %.9g (0x%08x)", what, (long long)i,
                             (double)got[i], a, (double)want[i], b);
    }
}

/* Q8_0 quantization equals gguf.quants.quantize byte for byte (quant_refs.safetensors:
 * several magnitudes, a zero block, halfway products, scales below f16's normal range). */
static void test_quantize_matches_gguf_py(void **state) {
    (void)state;
    cdf_st_file *f = NULL;
    assert_int_equal(cdf_st_open(tu_data("formats/quant_refs.safetensors"), &f), CDF_OK);
    const cdf_st_tensor *in = cdf_st_find(f, "Q8_0.in"), *want = cdf_st_find(f, "Q8_0.blocks");
    assert_non_null(in);
    assert_non_null(want);
    const int64_t n = cdf_st_numel(in);
    assert_int_equal((uint64_t)(n / 32 * 34), want->nbytes);
    uint8_t *got = malloc((size_t)want->nbytes);
    assert_int_equal(cdf_ggml_quantize(CDF_GGML_Q8_0, cdf_st_data(f, in), n, got), CDF_OK);
    for (uint64_t i = 0; i < want->nbytes; i++)
        if (got[i] != ((const uint8_t *)cdf_st_data(f, want))[i])
            fail_msg("Q8_0 byte %llu (block %llu): got %u, gguf-py %u", (unsigned long long)i, (unsigned long long)(i / 34),
                     got[i], ((const uint8_t *)cdf_st_data(f, want))[i]);
    /* and decoding them gives gguf-py's round trip (the reference's own dequantize, tested above) */
    float *back = malloc((size_t)n * 4);
    assert_int_equal(cdf_ggml_dequantize(CDF_GGML_Q8_0, got, n, back), CDF_OK);
    free(back);
    float bad[32] = {0};
    bad[5] = NAN;
    assert_int_equal(cdf_ggml_quantize(CDF_GGML_Q8_0, bad, 32, got), CDF_ERR_INVALID_ARG);
    assert_int_equal(cdf_ggml_quantize(CDF_GGML_Q8_0, bad, 31, got), CDF_ERR_INVALID_ARG);
    assert_int_equal(cdf_ggml_quantize(CDF_GGML_Q5_K, bad, 256, got), CDF_ERR_UNSUPPORTED);
    assert_non_null(strstr(cdf_last_error(), "Q5_K"));
    free(got);
    cdf_st_close(f);
}

/* Q4_K quantization equals ggml's quantize_row_q4_K_ref byte for byte (q4k_refs.safetensors,
 * made by tools/make-format-refs/make_q4k_refs.py from ggml's own C code, since gguf-py has no
 * Q4_K encoder): gaussian rows of several magnitudes, weight-like rows with outliers, zero,
 * constant, all-positive and all-negative blocks, sub-blocks whose coded scale rounds to 0,
 * narrow sub-blocks far from 0, f16-subnormal scales, rounding ties. */
static void test_quantize_q4_k_matches_ggml(void **state) {
    (void)state;
    cdf_st_file *f = NULL;
    assert_int_equal(cdf_st_open(tu_data("formats/q4k_refs.safetensors"), &f), CDF_OK);
    const cdf_st_tensor *in = cdf_st_find(f, "Q4_K.in"), *want = cdf_st_find(f, "Q4_K.blocks");
    assert_non_null(in);
    assert_non_null(want);
    const int64_t n = cdf_st_numel(in), nb = n / 256;
    assert_int_equal((uint64_t)(nb * 144), want->nbytes);
    const float *x = cdf_st_data(f, in);
    const uint8_t *ref = cdf_st_data(f, want);
    uint8_t *got = malloc((size_t)want->nbytes);
    assert_int_equal(cdf_ggml_quantize(CDF_GGML_Q4_K, x, n, got), CDF_OK);
    for (uint64_t i = 0; i < want->nbytes; i++)
        if (got[i] != ref[i])
            fail_msg("Q4_K byte %llu (block %llu, offset %llu): got %u, ggml %u", (unsigned long long)i,
                     (unsigned long long)(i / 144), (unsigned long long)(i % 144), got[i], ref[i]);

    /* Error bound of the decoded blocks (the dequantizer is gguf-py's, tested above). Q4_K codes
     * element x of sub-block j as q = clamp(round((x + m_j) / s_j), 0, 15) with the coded step
     * s_j = d * sc_j and offset m_j = dmin * mn_j, and decodes s_j * q - m_j. So:
     *  - where the rounding was not clamped, |y - x| <= s_j / 2 (plus f32 rounding of the decode,
     *    allowed as 1e-6 relative);
     *  - everywhere, |y - x| <= s_j / 2 + dmin / 2 + 7.5 d: the fitted grid is coded with 6-bit
     *    step and offset multiples, which moves the offset by at most dmin / 2 and each of the up
     *    to 15 levels by at most d / 2, so a value the fitted grid covered falls off the coded grid
     *    by at most that much (clamped outliers included).
     * Blocks whose d or dmin is an f16 subnormal are left out of the second bound: there the f16
     * scale, not the encoder, loses the precision (a block of 1e-6 values decodes to its offset). */
    float *y = malloc((size_t)n * 4);
    assert_int_equal(cdf_ggml_dequantize(CDF_GGML_Q4_K, got, n, y), CDF_OK);
    int bounded_blocks = 0;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = got + 144 * b, *s = blk + 4;
        const float d = cdf_f16_to_f32((uint16_t)(blk[0] | blk[1] << 8)), dmin = cdf_f16_to_f32((uint16_t)(blk[2] | blk[3] << 8));
        const bool normal = (d == 0.0f || d >= 6.1035156e-05f) && (dmin == 0.0f || dmin >= 6.1035156e-05f);
        bounded_blocks += normal;
        for (int j = 0; j < 8; j++) {
            const int sc = j < 4 ? s[j] & 63 : (s[j + 4] & 0x0F) | (s[j - 4] >> 6) << 4;
            const int mn = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | (s[j] >> 6) << 4;
            const float step = d * (float)sc, off = dmin * (float)mn;
            for (int l = 0; l < 32; l++) {
                const int64_t e = 256 * b + 32 * j + l;
                const float err = fabsf(y[e] - x[e]), slop = 1e-6f * fabsf(x[e]);
                const double t = step > 0 ? ((double)x[e] + off) / step : -1.0;
                if (step > 0 && t >= -0.5 && t <= 15.5 && err > 0.5f * step * (1.0f + 1e-6f) + slop)
                    fail_msg("Q4_K block %lld element %d: |%.9g - %.9g| > half step %.9g", (long long)b, 32 * j + l,
                             (double)y[e], (double)x[e], 0.5 * step);
                if (normal && err > 0.5f * step + 0.5f * dmin + 7.5f * d + slop)
                    fail_msg("Q4_K block %lld element %d: |%.9g - %.9g| over the coding bound (d %g, dmin %g, step %g)",
                             (long long)b, 32 * j + l, (double)y[e], (double)x[e], (double)d, (double)dmin, (double)step);
            }
        }
    }
    assert_true(bounded_blocks >= 20); /* the bound was applied, not skipped */
    free(y);
    float bad[256] = {0};
    bad[200] = INFINITY;
    assert_int_equal(cdf_ggml_quantize(CDF_GGML_Q4_K, bad, 256, got), CDF_ERR_INVALID_ARG);
    assert_int_equal(cdf_ggml_quantize(CDF_GGML_Q4_K, bad, 128, got), CDF_ERR_INVALID_ARG); /* half a block */
    free(got);
    cdf_st_close(f);
}

static void test_dequant_matches_gguf_py(void **state) {
    (void)state;
    cdf_st_file *f = NULL;
    assert_int_equal(cdf_st_open(tu_data("formats/dequant_refs.safetensors"), &f), CDF_OK);
    for (int i = 0; i < N_TYPES; i++) {
        char rn[32], on[32];
        snprintf(rn, sizeof rn, "%s.raw", k_types[i]);
        snprintf(on, sizeof on, "%s.out", k_types[i]);
        const cdf_st_tensor *raw = cdf_st_find(f, rn), *out = cdf_st_find(f, on);
        assert_non_null(raw);
        assert_non_null(out);
        uint32_t t = type_id(k_types[i]);
        assert_true(cdf_ggml_can_dequantize(t));
        int64_t be, bb, n = cdf_st_numel(out);
        assert_true(cdf_ggml_type_block(t, &be, &bb));
        assert_int_equal((uint64_t)(n / be * bb), raw->nbytes);
        assert_true(n >= 4 * be);
        float *got = malloc((size_t)n * 4);
        assert_int_equal(cdf_ggml_dequantize(t, cdf_st_data(f, raw), n, got), CDF_OK);
        assert_same_bits(got, cdf_st_data(f, out), n, k_types[i]);
        /* a partial block is refused */
        if (be > 1) assert_int_equal(cdf_ggml_dequantize(t, cdf_st_data(f, raw), be - 1, got), CDF_ERR_INVALID_ARG);
        free(got);
    }
    cdf_st_close(f);
    /* a type the reader knows but cannot decode: a clear error */
    float y[256];
    uint8_t z[256] = {0};
    assert_false(cdf_ggml_can_dequantize(23)); /* IQ4_XS */
    assert_int_equal(cdf_ggml_dequantize(23, z, 256, y), CDF_ERR_UNSUPPORTED);
    assert_non_null(strstr(cdf_last_error(), "cannot be dequantized"));
}

/* The CUDA decode kernel's per-thread work (cdf_dq_store_block of kernels/dequant_blocks.h, one
 * block per thread), run here on the host over gguf-py's blocks: the f32 panel is gguf-py's
 * output bit for bit, the bf16 panels its values rounded by cdf_f32_to_bf16 (what the CPU's
 * matmul_quant rounds them with), so the GPU's decode is tested without a GPU. */
static void test_gpu_decode_matches_gguf_py(void **state) {
    (void)state;
    cdf_st_file *f = NULL;
    assert_int_equal(cdf_st_open(tu_data("formats/dequant_refs.safetensors"), &f), CDF_OK);
    int tested = 0;
    for (int i = 0; i < N_TYPES; i++) {
        const uint32_t t = type_id(k_types[i]);
        int64_t be, bb;
        assert_true(cdf_ggml_type_block(t, &be, &bb));
        char rn[32], on[32];
        snprintf(rn, sizeof rn, "%s.raw", k_types[i]);
        snprintf(on, sizeof on, "%s.out", k_types[i]);
        const cdf_st_tensor *raw = cdf_st_find(f, rn), *out = cdf_st_find(f, on);
        const int64_t n = cdf_st_numel(out), nb = n / be;
        const float *want = cdf_st_data(f, out);
        float *got = malloc((size_t)n * 4);
        uint16_t *got16 = malloc((size_t)n * 2);
        if (be == 1) { /* F32/F16/BF16 never reach the quantized matmul (tensor/ops.c) */
            assert_false(cdf_k_dequant_store_blocks(t, cdf_st_data(f, raw), nb, got, CDF_DQ_STORE_F32));
        } else {
            assert_true(cdf_k_dequant_store_blocks(t, cdf_st_data(f, raw), nb, got, CDF_DQ_STORE_F32));
            assert_same_bits(got, want, n, k_types[i]);
            assert_true(cdf_k_dequant_store_blocks(t, cdf_st_data(f, raw), nb, got16, CDF_DQ_STORE_BF16));
            for (int64_t k = 0; k < n; k++)
                if (got16[k] != cdf_f32_to_bf16(want[k]))
                    fail_msg("%s bf16: element %lld is 0x%04x, want 0x%04x", k_types[i], (long long)k, got16[k],
                             cdf_f32_to_bf16(want[k]));
            assert_true(cdf_k_dequant_store_blocks(t, cdf_st_data(f, raw), nb, got, CDF_DQ_STORE_F32_BF16R));
            for (int64_t k = 0; k < n; k++) got16[k] = cdf_f32_to_bf16(want[k]);
            float *widened = malloc((size_t)n * 4);
            for (int64_t k = 0; k < n; k++) widened[k] = cdf_bf16_to_f32(got16[k]);
            assert_same_bits(got, widened, n, k_types[i]);
            free(widened);
            tested++;
        }
        free(got);
        free(got16);
    }
    assert_int_equal(tested, 10); /* every block type the CPU decodes */
    cdf_st_close(f);
    uint8_t z[256] = {0};
    float y[256];
    assert_false(cdf_k_dequant_store_blocks(23, z, 1, y, CDF_DQ_STORE_F32)); /* IQ4_XS: no decoder */
}

static void check_tiny(const char *rel, uint32_t version, uint64_t alignment) {
    cdf_gguf_file *g = NULL;
    assert_int_equal(cdf_gguf_open(tu_data(rel), &g), CDF_OK);
    assert_int_equal(cdf_gguf_version(g), version);
    assert_int_equal(cdf_gguf_alignment(g), alignment);
    assert_string_equal(cdf_gguf_get_string(g, "general.architecture"), "flux");
    assert_string_equal(cdf_gguf_get_string(g, "general.name"), "cdiffusers tiny reference");
    int64_t v;
    assert_true(cdf_gguf_get_int(g, "test.u8", &v) && v == 200);
    assert_true(cdf_gguf_get_int(g, "test.i8", &v) && v == -5);
    assert_true(cdf_gguf_get_int(g, "test.u16", &v) && v == 60000);
    assert_true(cdf_gguf_get_int(g, "test.i16", &v) && v == -30000);
    assert_true(cdf_gguf_get_int(g, "test.u32", &v) && v == 4000000000ll);
    assert_true(cdf_gguf_get_int(g, "test.i32", &v) && v == -2000000000ll);
    assert_true(cdf_gguf_get_int(g, "test.bool", &v) && v == 1);
    assert_true(cdf_gguf_get_int(g, "test.i64", &v) && v == -(1ll << 62));
    assert_false(cdf_gguf_get_int(g, "test.u64", &v)); /* 2^63 + 5 does not fit */
    assert_false(cdf_gguf_get_int(g, "test.f32", &v));
    assert_false(cdf_gguf_get_int(g, "absent", &v));
    assert_null(cdf_gguf_get_string(g, "test.u8"));
    assert_int_equal(cdf_gguf_kv_type(g, "test.f64"), 12);
    int et;
    uint64_t cnt;
    assert_true(cdf_gguf_get_array_info(g, "test.arr_str", &et, &cnt) && et == 8 && cnt == 3);
    assert_true(cdf_gguf_get_array_info(g, "test.arr_nested", &et, &cnt) && et == 9 && cnt == 2);
    assert_false(cdf_gguf_get_array_info(g, "test.u8", &et, &cnt));

    cdf_st_file *e = NULL;
    assert_int_equal(cdf_st_open(tu_data("formats/tiny_v3.expect.safetensors"), &e), CDF_OK);
    assert_int_equal(cdf_gguf_count(g), N_TYPES);
    assert_int_equal(cdf_st_count(e), N_TYPES);
    for (int i = 0; i < cdf_gguf_count(g); i++) {
        const cdf_gguf_tensor *t = cdf_gguf_tensor_at(g, i);
        assert_ptr_equal(cdf_gguf_find(g, t->name), t);
        assert_non_null(cdf_gguf_data(g, t));
        assert_int_equal(t->offset % alignment, 0);
        assert_string_equal(cdf_ggml_type_name(t->type), k_types[i]); /* written in this order */
        const cdf_st_tensor *x = cdf_st_find(e, t->name);
        assert_non_null(x);
        assert_int_equal(t->ndim, x->ndim);
        for (int d = 0; d < t->ndim; d++) assert_int_equal(t->shape[d], x->shape[d]);
        int64_t n = cdf_gguf_numel(t);
        float *got = malloc((size_t)n * 4);
        assert_int_equal(cdf_ggml_dequantize(t->type, cdf_gguf_data(g, t), n, got), CDF_OK);
        assert_same_bits(got, cdf_st_data(e, x), n, t->name);
        free(got);
    }
    assert_null(cdf_gguf_find(g, "nope"));
    assert_null(cdf_gguf_tensor_at(g, N_TYPES));
    cdf_st_close(e);
    cdf_gguf_close(g);
}

static void test_read_tiny_files(void **state) {
    (void)state;
    check_tiny("formats/tiny_v3.gguf", 3, 32);
    check_tiny("formats/tiny_v2.gguf", 2, 32);
    check_tiny("formats/tiny_align64.gguf", 3, 64);
}

/* ---------- malformed files, built byte by byte ---------- */

typedef struct bb {
    uint8_t *p;
    size_t n, cap;
} bb;

static void put(bb *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void put_le(bb *b, uint64_t v, int n) {
    for (int i = 0; i < n; i++) {
        uint8_t c = i < 8 ? (uint8_t)(v >> (8 * i)) : 0; /* n > 8: zero padding */
        put(b, &c, 1);
    }
}
static void put_str(bb *b, const char *s) {
    put_le(b, strlen(s), 8);
    put(b, s, strlen(s));
}

/* One tensor description for build(). */
typedef struct tdesc {
    const char *name;
    uint32_t ndim;
    uint64_t ne[4];
    uint32_t type;
    uint64_t offset;
} tdesc;

/* A GGUF file: header, a string key, optional alignment key, tensor infos, padding to `align`,
 * then `data` bytes of a pattern. */
static bb build(uint32_t version, const tdesc *ts, int nt, int64_t align_kv, size_t data) {
    bb b = {0};
    put(&b, "GGUF", 4);
    put_le(&b, version, 4);
    put_le(&b, (uint64_t)nt, 8);
    put_le(&b, align_kv >= 0 ? 2 : 1, 8);
    put_str(&b, "general.architecture");
    put_le(&b, 8, 4);
    put_str(&b, "flux");
    if (align_kv >= 0) {
        put_str(&b, "general.alignment");
        put_le(&b, 4, 4);
        put_le(&b, (uint64_t)align_kv, 4);
    }
    for (int i = 0; i < nt; i++) {
        put_str(&b, ts[i].name);
        put_le(&b, ts[i].ndim, 4);
        for (uint32_t d = 0; d < ts[i].ndim; d++) put_le(&b, ts[i].ne[d], 8);
        put_le(&b, ts[i].type, 4);
        put_le(&b, ts[i].offset, 8);
    }
    uint64_t al = align_kv > 0 ? (uint64_t)align_kv : 32;
    while (b.n % al) put_le(&b, 0, 1);
    for (size_t i = 0; i < data; i++) put_le(&b, (i * 7 + 3) & 0x3f, 1);
    return b;
}

static const char *write_tmp(const bb *b, const char *name) {
    static char path[8][1024];
    static int slot;
    char *p = path[slot++ & 7];
    snprintf(p, 1024, "%s/%s", tu_tmpdir(), name);
    assert_int_equal(tu_write_file(p, b->p, b->n), 0);
    return p;
}

/* Opening fails with `status` and a message containing `needle`. */
static void expect_open_error(const bb *b, cdf_status status, const char *needle, const char *what) {
    const char *p = write_tmp(b, "bad.gguf");
    cdf_gguf_file *g = (cdf_gguf_file *)1;
    cdf_status s = cdf_gguf_open(p, &g);
    if (s != status || !strstr(cdf_last_error(), needle))
        fail_msg("%s: got status %d, message '%s'; wanted %d and '%s'", what, s, cdf_last_error(), status, needle);
    assert_null(g);
    assert_non_null(strstr(cdf_last_error(), p)); /* the message names the file */
}

static void test_malformed(void **state) {
    (void)state;
    tdesc ok[2] = {{"a.weight", 2, {32, 2}, CDF_GGML_Q8_0, 0}, {"b.bias", 1, {4}, CDF_GGML_F32, 96}};
    /* a valid file to start from: 2 x 34 bytes of Q8_0 padded to 96, then 16 bytes of f32 */
    bb good = build(3, ok, 2, -1, 112);
    {
        cdf_gguf_file *g = NULL;
        assert_int_equal(cdf_gguf_open(write_tmp(&good, "good.gguf"), &g), CDF_OK);
        assert_int_equal(cdf_gguf_count(g), 2);
        const cdf_gguf_tensor *t = cdf_gguf_find(g, "a.weight");
        assert_int_equal(t->shape[0], 2);
        assert_int_equal(t->shape[1], 32);
        assert_int_equal(t->nbytes, 68);
        cdf_gguf_close(g);
    }
    /* every truncation fails cleanly */
    for (size_t len = 0; len < good.n; len++) {
        bb cut = {good.p, len, len};
        const char *p = write_tmp(&cut, "cut.gguf");
        cdf_gguf_file *g = (cdf_gguf_file *)1;
        cdf_status s = cdf_gguf_open(p, &g);
        if (s != CDF_ERR_FORMAT) fail_msg("truncated to %zu bytes: status %d (%s)", len, s, cdf_last_error());
        assert_null(g);
        assert_true(strstr(cdf_last_error(), "truncated") || strstr(cdf_last_error(), "not a GGUF"));
    }
    free(good.p);

    bb b = build(3, ok, 2, -1, 112);
    memcpy(b.p, "GGUG", 4);
    expect_open_error(&b, CDF_ERR_FORMAT, "not a GGUF file", "wrong magic");
    free(b.p);
    b = build(1, ok, 2, -1, 112);
    expect_open_error(&b, CDF_ERR_UNSUPPORTED, "version 1", "version 1");
    free(b.p);
    b = build(4, ok, 2, -1, 112);
    expect_open_error(&b, CDF_ERR_FORMAT, "unknown GGUF version 4", "version 4");
    free(b.p);
    b = build(0x03000000u, ok, 2, -1, 112);
    expect_open_error(&b, CDF_ERR_UNSUPPORTED, "big-endian", "big-endian");
    free(b.p);

    /* one field of the valid file changed */
    static const struct {
        int tensor;
        const char *field;
        uint64_t value;
        const char *needle, *what;
    } cases[] = {
        {1, "offset", 100, "tensor 'b.bias': data offset 100 is not a multiple of the alignment 32", "misaligned"},
        {1, "offset", 128, "tensor 'b.bias': data [128, +16) extends beyond", "out of range"},
        {1, "offset", 32, "overlap", "overlap"}, /* inside a.weight's 68 bytes */
        {1, "type", 99, "tensor 'b.bias' has unknown ggml type 99", "unknown type"},
        {0, "ne0", 48, "not a multiple of the block size 32", "partial block"},
        {0, "ne1", 1ull << 62, "overflows 64 bits", "overflow"},
        {0, "ndim", 0, "has 0 dims", "0 dims"},
        {1, "name", 0, "'a.weight' appears more than once", "duplicate"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tdesc t[2];
        memcpy(t, ok, sizeof t);
        tdesc *x = &t[cases[i].tensor];
        const char *f = cases[i].field;
        if (strcmp(f, "offset") == 0) x->offset = cases[i].value;
        else if (strcmp(f, "type") == 0) x->type = (uint32_t)cases[i].value;
        else if (strcmp(f, "ne0") == 0) x->ne[0] = cases[i].value;
        else if (strcmp(f, "ne1") == 0) x->ne[1] = cases[i].value, x->ne[0] = 64;
        else if (strcmp(f, "ndim") == 0) x->ndim = (uint32_t)cases[i].value;
        else x->name = "a.weight";
        b = build(3, t, 2, -1, 112);
        expect_open_error(&b, CDF_ERR_FORMAT, cases[i].needle, cases[i].what);
        free(b.p);
    }
    b = build(3, ok, 2, 48, 112);
    expect_open_error(&b, CDF_ERR_FORMAT, "general.alignment 48 is not a power of two", "alignment 48");
    free(b.p);
    b = build(3, ok, 2, 0, 112);
    expect_open_error(&b, CDF_ERR_FORMAT, "general.alignment 0", "alignment 0");
    free(b.p);

    /* header fields patched in place */
    b = build(3, ok, 2, -1, 112);
    b.p[8] = 0xff, b.p[15] = 0x7f; /* tensor count ~2^63 */
    expect_open_error(&b, CDF_ERR_FORMAT, "cannot fit", "tensor count");
    free(b.p);
    b = build(3, ok, 2, -1, 112);
    b.p[16] = 0xff, b.p[17] = 0xff; /* 65535 keys */
    expect_open_error(&b, CDF_ERR_FORMAT, "cannot fit", "kv count");
    free(b.p);
    b = build(3, ok, 2, -1, 112);
    b.p[24 + 7] = 0x01; /* key length 2^56 + 20 */
    expect_open_error(&b, CDF_ERR_LIMIT, "over the limit", "key length");
    free(b.p);
    b = build(3, ok, 2, -1, 112);
    b.p[24] = 0xe8, b.p[25] = 0x03; /* key length 1000, past the end of the file */
    expect_open_error(&b, CDF_ERR_FORMAT, "truncated", "key past the end");
    free(b.p);
    b = build(3, ok, 2, -1, 112);
    b.p[24 + 8 + 20] = 13; /* value type 13 */
    expect_open_error(&b, CDF_ERR_FORMAT, "unknown value type 13", "value type");
    free(b.p);

    /* arrays nested deeper than the limit */
    bb n = {0};
    put(&n, "GGUF", 4);
    put_le(&n, 3, 4);
    put_le(&n, 0, 8);
    put_le(&n, 1, 8);
    put_str(&n, "deep");
    put_le(&n, 9, 4);
    for (int i = 0; i < CDF_GGUF_MAX_ARRAY_DEPTH + 1; i++) {
        put_le(&n, 9, 4);
        put_le(&n, 1, 8);
    }
    put_le(&n, 0, 64);
    expect_open_error(&n, CDF_ERR_LIMIT, "nested more than", "deep arrays");
    free(n.p);

    /* an empty file with no tensors is valid */
    b = build(2, NULL, 0, -1, 0);
    cdf_gguf_file *g = NULL;
    assert_int_equal(cdf_gguf_open(write_tmp(&b, "empty.gguf"), &g), CDF_OK);
    assert_int_equal(cdf_gguf_count(g), 0);
    cdf_gguf_close(g);
    free(b.p);
    assert_int_equal(cdf_gguf_open(tu_data("formats/absent.gguf"), &g), CDF_ERR_NOT_FOUND);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dequant_matches_gguf_py), cmocka_unit_test(test_gpu_decode_matches_gguf_py),
        cmocka_unit_test(test_quantize_matches_gguf_py),
        cmocka_unit_test(test_quantize_q4_k_matches_ggml),
        cmocka_unit_test(test_read_tiny_files),
        cmocka_unit_test(test_malformed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
