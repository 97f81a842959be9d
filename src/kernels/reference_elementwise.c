/* Reference kernels: elementwise unary and (broadcasting) binary ops, f32 arithmetic. */
#include "kernels/reference_internal.h"

#define ELEM_CHUNK 256 /* elements converted to f32 at a time */

cdf_status cdf_k_unary(cdf_unary_op op, float p0, float p1, void *out, cdf_dtype out_dt, const void *in,
                       cdf_dtype in_dt, int64_t n) {
    static const char *fn = "cdf_k_unary";
    if ((unsigned)op >= CDF_UN_COUNT) return cdf_error(CDF_ERR_INVALID_ARG, "%s: unknown op %d", fn, (int)op);
    CDF_K_CHECK_FLOAT_DT(fn, "out", out_dt);
    CDF_K_CHECK_FLOAT_DT(fn, "in", in_dt);
    CDF_K_CHECK_NONNEG(fn, "n", n);
    if (n == 0) return CDF_OK;
    CDF_K_CHECK_PTR(fn, "out", out);
    CDF_K_CHECK_PTR(fn, "in", in);
    const int64_t chunks = (n + ELEM_CHUNK - 1) / ELEM_CHUNK;
    /* chunked through an f32 buffer: works in place (out == in) for any dtype pair of equal size */
#pragma omp parallel for schedule(static) if (n > CDF_K_PAR_MIN_WORK)
    for (int64_t c = 0; c < chunks; c++) {
        float buf[ELEM_CHUNK];
        int64_t off = c * ELEM_CHUNK, len = n - off < ELEM_CHUNK ? n - off : ELEM_CHUNK;
        cdf_k_load_row(buf, in, in_dt, off, len);
        cdf_k_unary_span(op, buf, len, p0, p1);
        cdf_k_store_row(out, out_dt, off, buf, len);
    }
    return CDF_OK;
}

cdf_status cdf_k_binary(cdf_binary_op op, void *out, cdf_dtype out_dt, const void *a, cdf_dtype a_dt,
                        const int64_t *a_strides, const void *b, cdf_dtype b_dt, const int64_t *b_strides,
                        int ndim, const int64_t *shape) {
    static const char *fn = "cdf_k_binary";
    if ((unsigned)op >= CDF_BIN_COUNT) return cdf_error(CDF_ERR_INVALID_ARG, "%s: unknown op %d", fn, (int)op);
    CDF_K_CHECK_FLOAT_DT(fn, "out", out_dt);
    CDF_K_CHECK_FLOAT_DT(fn, "a", a_dt);
    CDF_K_CHECK_FLOAT_DT(fn, "b", b_dt);
    if (ndim < 0 || ndim > CDF_MAX_DIMS)
        return cdf_error(CDF_ERR_INVALID_ARG, "%s: ndim %d outside [0, %d]", fn, ndim, CDF_MAX_DIMS);
    if (ndim > 0) {
        CDF_K_CHECK_PTR(fn, "shape", shape);
        CDF_K_CHECK_PTR(fn, "a_strides", a_strides);
        CDF_K_CHECK_PTR(fn, "b_strides", b_strides);
    }
    int64_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0) return cdf_error(CDF_ERR_INVALID_ARG, "%s: shape[%d] = %lld is negative", fn, d, (long long)shape[d]);
        numel *= shape[d];
    }
    if (numel == 0) return CDF_OK;
    CDF_K_CHECK_PTR(fn, "out", out);
    CDF_K_CHECK_PTR(fn, "a", a);
    CDF_K_CHECK_PTR(fn, "b", b);

    const int64_t inner = ndim > 0 ? shape[ndim - 1] : 1;
    const int64_t as = ndim > 0 ? a_strides[ndim - 1] : 0, bs = ndim > 0 ? b_strides[ndim - 1] : 0;
    const int64_t rows = numel / inner;
    const int outer_dims = ndim > 0 ? ndim - 1 : 0;
    const int all_f32 = out_dt == CDF_F32 && a_dt == CDF_F32 && b_dt == CDF_F32;

#pragma omp parallel for schedule(static) if (numel > CDF_K_PAR_MIN_WORK && rows > 1)
    for (int64_t r = 0; r < rows; r++) {
        int64_t rem = r, aoff = 0, boff = 0;
        for (int d = outer_dims - 1; d >= 0; d--) {
            int64_t idx = rem % shape[d];
            rem /= shape[d];
            aoff += idx * a_strides[d];
            boff += idx * b_strides[d];
        }
        const int64_t ooff = r * inner;
        if (all_f32) {
            const float *pa = (const float *)a + aoff, *pb = (const float *)b + boff;
            float *po = (float *)out + ooff;
            for (int64_t i = 0; i < inner; i++) po[i] = cdf_k_binary_f(op, pa[i * as], pb[i * bs]);
        } else {
            for (int64_t i = 0; i < inner; i++)
                cdf_k_st(out, out_dt, ooff + i,
                         cdf_k_binary_f(op, cdf_k_ld(a, a_dt, aoff + i * as), cdf_k_ld(b, b_dt, boff + i * bs)));
        }
    }
    return CDF_OK;
}
