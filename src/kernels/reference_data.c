/* Reference kernels: data movement (strided copy/cast, fill, embedding gather, nearest upsample). */
#include <string.h>

#include "core/dtype_internal.h"
#include "kernels/reference_internal.h"

/* ---- scalar conversion between any two dtypes ------------------------------------------ */

static int is_int_dt(cdf_dtype dt) {
    return dt == CDF_I64 || dt == CDF_I32 || dt == CDF_I16 || dt == CDF_I8 || dt == CDF_U8 || dt == CDF_BOOL;
}

/* One element held either as an exact integer or as a double (exact for every float dtype). */
typedef struct {
    int is_int;
    int64_t i;
    double d;
} scalar;

static scalar load_scalar(const void *p, cdf_dtype dt, int64_t idx) {
    scalar s = {0, 0, 0.0};
    switch (dt) {
    case CDF_F32: s.d = ((const float *)p)[idx]; break;
    case CDF_BF16: s.d = cdf_bf16_to_f32(((const uint16_t *)p)[idx]); break;
    case CDF_F16: s.d = cdf_f16_to_f32(((const uint16_t *)p)[idx]); break;
    case CDF_F64: s.d = ((const double *)p)[idx]; break;
    case CDF_I64: s.is_int = 1; s.i = ((const int64_t *)p)[idx]; break;
    case CDF_I32: s.is_int = 1; s.i = ((const int32_t *)p)[idx]; break;
    case CDF_I16: s.is_int = 1; s.i = ((const int16_t *)p)[idx]; break;
    case CDF_I8: s.is_int = 1; s.i = ((const int8_t *)p)[idx]; break;
    case CDF_U8: s.is_int = 1; s.i = ((const uint8_t *)p)[idx]; break;
    case CDF_BOOL: s.is_int = 1; s.i = ((const uint8_t *)p)[idx] != 0; break;
    default: break;
    }
    return s;
}

static void store_scalar(void *p, cdf_dtype dt, int64_t idx, scalar s) {
    if (is_int_dt(dt)) {
        int64_t v;
        if (s.is_int) {
            v = s.i;
        } else if (dt == CDF_BOOL) {
            v = s.d != 0.0;
        } else {
            switch (dt) {
            case CDF_I32: v = cdf_trunc_sat(s.d, -2147483648.0, 2147483647.0); break;
            case CDF_I16: v = cdf_trunc_sat(s.d, -32768.0, 32767.0); break;
            case CDF_I8: v = cdf_trunc_sat(s.d, -128.0, 127.0); break;
            case CDF_U8: v = cdf_trunc_sat(s.d, 0.0, 255.0); break;
            default: v = cdf_trunc_sat(s.d, -9223372036854775808.0, 9223372036854775807.0); break;
            }
        }
        switch (dt) {
        case CDF_I64: ((int64_t *)p)[idx] = v; break;
        case CDF_I32: ((int32_t *)p)[idx] = (int32_t)v; break;
        case CDF_I16: ((int16_t *)p)[idx] = (int16_t)v; break;
        case CDF_I8: ((int8_t *)p)[idx] = (int8_t)v; break;
        case CDF_U8: ((uint8_t *)p)[idx] = (uint8_t)v; break;
        case CDF_BOOL: ((uint8_t *)p)[idx] = v != 0; break;
        default: break;
        }
        return;
    }
    if (dt == CDF_F64) {
        ((double *)p)[idx] = s.is_int ? (double)s.i : s.d;
        return;
    }
    /* f32 / bf16 / f16: through f32 (exact for f32 sources; int64 -> f32 rounds once, as torch) */
    float f = s.is_int ? (float)s.i : (float)s.d;
    cdf_k_st(p, dt, idx, f);
}

/* ---- strided copy ------------------------------------------------------------------------ */

/* Copy/convert one row of n elements. */
static void copy_row(char *dst, cdf_dtype ddt, int64_t ds, const char *src, cdf_dtype sdt, int64_t ss, int64_t n) {
    if (ddt == sdt) {
        size_t es = cdf_dtype_size(ddt);
        if (ds == 1 && ss == 1) {
            memmove(dst, src, (size_t)n * es);
            return;
        }
        switch (es) {
        case 1: for (int64_t i = 0; i < n; i++) dst[i * ds] = src[i * ss]; return;
        case 2: for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i * ds] = ((const uint16_t *)src)[i * ss]; return;
        case 4: for (int64_t i = 0; i < n; i++) ((uint32_t *)dst)[i * ds] = ((const uint32_t *)src)[i * ss]; return;
        case 8: for (int64_t i = 0; i < n; i++) ((uint64_t *)dst)[i * ds] = ((const uint64_t *)src)[i * ss]; return;
        default: break;
        }
    }
    if (cdf_k_is_float_storage(ddt) && cdf_k_is_float_storage(sdt)) {
        /* the casts around bf16 matmuls and attention: vectors where the row is contiguous, else
         * without the per-element dtype switches (the same values) */
        if (ds == 1 && ss == 1 && cdf_k_convert_span(dst, ddt, src, sdt, n)) return;
        if (sdt == CDF_F32 && ddt == CDF_BF16) {
            for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i * ds] = cdf_f32_to_bf16(((const float *)src)[i * ss]);
            return;
        }
        if (sdt == CDF_BF16 && ddt == CDF_F32) {
            for (int64_t i = 0; i < n; i++) ((float *)dst)[i * ds] = cdf_bf16_to_f32(((const uint16_t *)src)[i * ss]);
            return;
        }
        /* exact f32 round trip for the source, one rounding on store */
        for (int64_t i = 0; i < n; i++) cdf_k_st(dst, ddt, i * ds, cdf_k_ld(src, sdt, i * ss));
        return;
    }
    for (int64_t i = 0; i < n; i++) store_scalar(dst, ddt, i * ds, load_scalar(src, sdt, i * ss));
}

cdf_status cdf_k_copy_strided(void *dst, cdf_dtype dst_dt, const int64_t *dst_strides, const void *src,
                              cdf_dtype src_dt, const int64_t *src_strides, int ndim, const int64_t *shape) {
    static const char *fn = "cdf_k_copy_strided";
    if (ndim < 0 || ndim > CDF_MAX_DIMS)
        return cdf_error(CDF_ERR_INVALID_ARG, "%s: ndim %d outside [0, %d]", fn, ndim, CDF_MAX_DIMS);
    if (cdf_dtype_size(dst_dt) == 0 || cdf_dtype_size(src_dt) == 0)
        return cdf_error(CDF_ERR_DTYPE, "%s: invalid dtype (dst %d, src %d)", fn, (int)dst_dt, (int)src_dt);
    if (ndim > 0) {
        CDF_K_CHECK_PTR(fn, "shape", shape);
        CDF_K_CHECK_PTR(fn, "dst_strides", dst_strides);
        CDF_K_CHECK_PTR(fn, "src_strides", src_strides);
    }
    int64_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0) return cdf_error(CDF_ERR_INVALID_ARG, "%s: shape[%d] = %lld is negative", fn, d, (long long)shape[d]);
        numel *= shape[d];
    }
    if (numel == 0) return CDF_OK;
    CDF_K_CHECK_PTR(fn, "dst", dst);
    CDF_K_CHECK_PTR(fn, "src", src);

    const size_t des = cdf_dtype_size(dst_dt), ses = cdf_dtype_size(src_dt);
    const int64_t inner = ndim > 0 ? shape[ndim - 1] : 1;
    const int64_t ds = ndim > 0 ? dst_strides[ndim - 1] : 0, ss = ndim > 0 ? src_strides[ndim - 1] : 0;
    const int64_t rows = numel / inner;
    const int outer_dims = ndim > 0 ? ndim - 1 : 0;

#pragma omp parallel for schedule(static) if (numel > 4 * CDF_K_PAR_MIN_WORK && rows > 1)
    for (int64_t r = 0; r < rows; r++) {
        /* decompose the row index into the outer multi-index */
        int64_t rem = r, doff = 0, soff = 0;
        for (int d = outer_dims - 1; d >= 0; d--) {
            int64_t idx = rem % shape[d];
            rem /= shape[d];
            doff += idx * dst_strides[d];
            soff += idx * src_strides[d];
        }
        copy_row((char *)dst + doff * (int64_t)des, dst_dt, ds, (const char *)src + soff * (int64_t)ses, src_dt, ss,
                 inner);
    }
    return CDF_OK;
}

/* ---- fill ------------------------------------------------------------------------------ */

cdf_status cdf_k_fill(void *dst, cdf_dtype dt, int64_t n, double value) {
    static const char *fn = "cdf_k_fill";
    CDF_K_CHECK_NONNEG(fn, "n", n);
    if (cdf_dtype_size(dt) == 0) return cdf_error(CDF_ERR_DTYPE, "%s: invalid dtype %d", fn, (int)dt);
    if (n == 0) return CDF_OK;
    CDF_K_CHECK_PTR(fn, "dst", dst);
    /* convert once, then replicate the bytes */
    unsigned char elem[8] = {0};
    scalar s = {0, 0, value};
    store_scalar(elem, dt, 0, s);
    size_t es = cdf_dtype_size(dt);
    char *d = dst;
#pragma omp parallel for schedule(static) if (n > 4 * CDF_K_PAR_MIN_WORK)
    for (int64_t i = 0; i < n; i++) memcpy(d + i * (int64_t)es, elem, es);
    return CDF_OK;
}

/* ---- embedding ------------------------------------------------------------------------- */

cdf_status cdf_k_embedding(void *out, cdf_dtype out_dt, const void *table, cdf_dtype table_dt, int64_t rows,
                           int64_t dim, const void *ids, cdf_dtype ids_dt, int64_t n) {
    static const char *fn = "cdf_k_embedding";
    CDF_K_CHECK_FLOAT_DT(fn, "out", out_dt);
    CDF_K_CHECK_FLOAT_DT(fn, "table", table_dt);
    if (ids_dt != CDF_I64 && ids_dt != CDF_I32)
        return cdf_error(CDF_ERR_DTYPE, "%s: ids dtype %s is not i64/i32", fn, cdf_dtype_name(ids_dt));
    CDF_K_CHECK_NONNEG(fn, "rows", rows);
    CDF_K_CHECK_NONNEG(fn, "dim", dim);
    CDF_K_CHECK_NONNEG(fn, "n", n);
    if (n == 0) return CDF_OK;
    CDF_K_CHECK_PTR(fn, "ids", ids);
    /* validate every id before writing anything */
    for (int64_t i = 0; i < n; i++) {
        int64_t id = ids_dt == CDF_I64 ? ((const int64_t *)ids)[i] : ((const int32_t *)ids)[i];
        if (id < 0 || id >= rows)
            return cdf_error(CDF_ERR_INVALID_ARG, "%s: id %lld at position %lld is outside the table [0, %lld)", fn,
                             (long long)id, (long long)i, (long long)rows);
    }
    if (dim == 0) return CDF_OK;
    CDF_K_CHECK_PTR(fn, "out", out);
    CDF_K_CHECK_PTR(fn, "table", table);
    for (int64_t i = 0; i < n; i++) {
        int64_t id = ids_dt == CDF_I64 ? ((const int64_t *)ids)[i] : ((const int32_t *)ids)[i];
        copy_row((char *)out + i * dim * (int64_t)cdf_dtype_size(out_dt), out_dt, 1,
                 (const char *)table + id * dim * (int64_t)cdf_dtype_size(table_dt), table_dt, 1, dim);
    }
    return CDF_OK;
}

/* ---- nearest upsample -------------------------------------------------------------------- */

cdf_status cdf_k_upsample_nearest(void *out, cdf_dtype out_dt, const void *in, cdf_dtype in_dt, int64_t nc,
                                  int64_t h, int64_t w, int64_t fh, int64_t fw) {
    static const char *fn = "cdf_k_upsample_nearest";
    CDF_K_CHECK_FLOAT_DT(fn, "out", out_dt);
    CDF_K_CHECK_FLOAT_DT(fn, "in", in_dt);
    CDF_K_CHECK_NONNEG(fn, "nc", nc);
    CDF_K_CHECK_NONNEG(fn, "h", h);
    CDF_K_CHECK_NONNEG(fn, "w", w);
    if (fh < 1 || fw < 1)
        return cdf_error(CDF_ERR_INVALID_ARG, "%s: factors %lldx%lld must be >= 1", fn, (long long)fh, (long long)fw);
    if (nc == 0 || h == 0 || w == 0) return CDF_OK;
    CDF_K_CHECK_PTR(fn, "out", out);
    CDF_K_CHECK_PTR(fn, "in", in);
    const int64_t oh = h * fh, ow = w * fw;
#pragma omp parallel for schedule(static) if (nc * oh * ow > 4 * CDF_K_PAR_MIN_WORK)
    for (int64_t p = 0; p < nc * oh; p++) {
        int64_t plane = p / oh, y = p % oh;
        int64_t src_row = (plane * h + y / fh) * w, dst_row = p * ow;
        for (int64_t x = 0; x < ow; x++) cdf_k_st(out, out_dt, dst_row + x, cdf_k_ld(in, in_dt, src_row + x / fw));
    }
    return CDF_OK;
}
