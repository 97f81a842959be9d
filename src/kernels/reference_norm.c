/* Reference kernels: softmax, layer/RMS/group norm and reductions. f32 arithmetic throughout; sums
 * are cascaded (blocks of CHUNK elements, each summed pairwise) so long rows stay accurate. */
#include <omp.h>

#include "kernels/reference_internal.h"

#define CHUNK 1024

/* sum over k < n of f(x[off + k*stride]) with f(x) = x - shift or (x - shift)^2. */
static float strided_sum(const void *in, cdf_dtype dt, int64_t off, int64_t stride, int64_t n, float shift,
                         int squared) {
    float buf[CHUNK];
    float total = 0.0f;
    for (int64_t c0 = 0; c0 < n; c0 += CHUNK) {
        int64_t len = n - c0 < CHUNK ? n - c0 : CHUNK;
        if (stride == 1) {
            cdf_k_load_row(buf, in, dt, off + c0, len);
        } else {
            for (int64_t k = 0; k < len; k++) buf[k] = cdf_k_ld(in, dt, off + (c0 + k) * stride);
        }
        if (squared) {
            total += cdf_k_sumsq_dev_f32(buf, len, shift);
        } else {
            for (int64_t k = 0; k < len; k++) buf[k] -= shift;
            total += cdf_k_sum_f32(buf, len);
        }
    }
    return total;
}

/* Mean and biased variance (two passes: mean first, then squared deviations). */
static void strided_moments(const void *in, cdf_dtype dt, int64_t off, int64_t stride, int64_t n, float *mean,
                            float *var) {
    float m = strided_sum(in, dt, off, stride, n, 0.0f, 0) / (float)n;
    *mean = m;
    *var = strided_sum(in, dt, off, stride, n, m, 1) / (float)n;
}

/* ---- softmax ------------------------------------------------------------------------------ */

cdf_status cdf_k_softmax(void *out, cdf_dtype out_dt, const void *in, cdf_dtype in_dt, int64_t rows, int64_t cols,
                         float scale) {
    static const char *fn = "cdf_k_softmax";
    CDF_K_CHECK_FLOAT_DT(fn, "out", out_dt);
    CDF_K_CHECK_FLOAT_DT(fn, "in", in_dt);
    CDF_K_CHECK_NONNEG(fn, "rows", rows);
    CDF_K_CHECK_NONNEG(fn, "cols", cols);
    if (rows == 0 || cols == 0) return CDF_OK;
    CDF_K_CHECK_PTR(fn, "out", out);
    CDF_K_CHECK_PTR(fn, "in", in);
    const int nthr = omp_get_max_threads() > 0 ? omp_get_max_threads() : 1;
    float *scratch = malloc(sizeof(float) * (size_t)cols * (size_t)nthr);
    if (!scratch)
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "%s: cannot allocate a %lld-column row buffer", fn, (long long)cols);
#pragma omp parallel for schedule(static) if (rows * cols > CDF_K_PAR_MIN_WORK / 4)
    for (int64_t r = 0; r < rows; r++) {
        float *y = scratch + (size_t)cols * (size_t)omp_get_thread_num();
        cdf_k_load_row(y, in, in_dt, r * cols, cols);
        float m = -INFINITY;
        for (int64_t j = 0; j < cols; j++) {
            y[j] *= scale;
            if (y[j] > m || isnan(y[j])) m = y[j];
        }
        if (m == -INFINITY) {
            /* every entry is -inf: zeros (torch would give NaN), like a fully masked attention row */
            for (int64_t j = 0; j < cols; j++) y[j] = 0.0f;
        } else {
            for (int64_t j = 0; j < cols; j++) y[j] = expf(y[j] - m);
            float inv = 1.0f / cdf_k_sum_f32(y, cols);
            for (int64_t j = 0; j < cols; j++) y[j] *= inv;
        }
        cdf_k_store_row(out, out_dt, r * cols, y, cols);
    }
    free(scratch);
    return CDF_OK;
}

/* ---- layer norm / RMS norm ------------------------------------------------------------------ */

cdf_status cdf_k_layer_norm(void *out, cdf_dtype out_dt, const void *in, cdf_dtype in_dt, int64_t rows,
                            int64_t cols, float eps, const void *weight, const void *bias, cdf_dtype wdt) {
    static const char *fn = "cdf_k_layer_norm";
    CDF_K_CHECK_FLOAT_DT(fn, "out", out_dt);
    CDF_K_CHECK_FLOAT_DT(fn, "in", in_dt);
    if (weight || bias) CDF_K_CHECK_FLOAT_DT(fn, "weight/bias", wdt);
    CDF_K_CHECK_NONNEG(fn, "rows", rows);
    CDF_K_CHECK_NONNEG(fn, "cols", cols);
    if (rows == 0 || cols == 0) return CDF_OK;
    CDF_K_CHECK_PTR(fn, "out", out);
    CDF_K_CHECK_PTR(fn, "in", in);
#pragma omp parallel for schedule(static) if (rows * cols > CDF_K_PAR_MIN_WORK / 4)
    for (int64_t r = 0; r < rows; r++) {
        float mean, var;
        strided_moments(in, in_dt, r * cols, 1, cols, &mean, &var);
        const float rstd = 1.0f / sqrtf(var + eps);
        float buf[CHUNK];
        for (int64_t c0 = 0; c0 < cols; c0 += CHUNK) {
            int64_t len = cols - c0 < CHUNK ? cols - c0 : CHUNK;
            cdf_k_load_row(buf, in, in_dt, r * cols + c0, len);
            for (int64_t k = 0; k < len; k++) {
                float y = (buf[k] - mean) * rstd;
                if (weight) y *= cdf_k_ld(weight, wdt, c0 + k);
                if (bias) y += cdf_k_ld(bias, wdt, c0 + k);
                buf[k] = y;
            }
            cdf_k_store_row(out, out_dt, r * cols + c0, buf, len);
        }
    }
    return CDF_OK;
}

cdf_status cdf_k_rms_norm(void *out, cdf_dtype out_dt, const void *in, cdf_dtype in_dt, int64_t rows,
                          int64_t cols, float eps, const void *weight, cdf_dtype wdt) {
    static const char *fn = "cdf_k_rms_norm";
    CDF_K_CHECK_FLOAT_DT(fn, "out", out_dt);
    CDF_K_CHECK_FLOAT_DT(fn, "in", in_dt);
    if (weight) CDF_K_CHECK_FLOAT_DT(fn, "weight", wdt);
    CDF_K_CHECK_NONNEG(fn, "rows", rows);
    CDF_K_CHECK_NONNEG(fn, "cols", cols);
    if (rows == 0 || cols == 0) return CDF_OK;
    CDF_K_CHECK_PTR(fn, "out", out);
    CDF_K_CHECK_PTR(fn, "in", in);
#pragma omp parallel for schedule(static) if (rows * cols > CDF_K_PAR_MIN_WORK / 4)
    for (int64_t r = 0; r < rows; r++) {
        const float ms = strided_sum(in, in_dt, r * cols, 1, cols, 0.0f, 1) / (float)cols;
        const float rs = 1.0f / sqrtf(ms + eps);
        float buf[CHUNK];
        for (int64_t c0 = 0; c0 < cols; c0 += CHUNK) {
            int64_t len = cols - c0 < CHUNK ? cols - c0 : CHUNK;
            cdf_k_load_row(buf, in, in_dt, r * cols + c0, len);
            for (int64_t k = 0; k < len; k++) {
                float y = buf[k] * rs;
                if (weight) y *= cdf_k_ld(weight, wdt, c0 + k);
                buf[k] = y;
            }
            cdf_k_store_row(out, out_dt, r * cols + c0, buf, len);
        }
    }
    return CDF_OK;
}

/* ---- group norm ------------------------------------------------------------------------------ */

cdf_status cdf_k_group_norm(void *out, cdf_dtype out_dt, const void *in, cdf_dtype in_dt, int64_t n, int64_t c,
                            int64_t s, int64_t groups, float eps, const void *weight, const void *bias,
                            cdf_dtype wdt) {
    static const char *fn = "cdf_k_group_norm";
    CDF_K_CHECK_FLOAT_DT(fn, "out", out_dt);
    CDF_K_CHECK_FLOAT_DT(fn, "in", in_dt);
    if (weight || bias) CDF_K_CHECK_FLOAT_DT(fn, "weight/bias", wdt);
    CDF_K_CHECK_NONNEG(fn, "n", n);
    CDF_K_CHECK_NONNEG(fn, "c", c);
    CDF_K_CHECK_NONNEG(fn, "s", s);
    if (groups <= 0 || c % groups != 0)
        return cdf_error(CDF_ERR_INVALID_ARG, "%s: %lld channels are not divisible into %lld groups", fn,
                         (long long)c, (long long)groups);
    if (n == 0 || c == 0 || s == 0) return CDF_OK;
    CDF_K_CHECK_PTR(fn, "out", out);
    CDF_K_CHECK_PTR(fn, "in", in);
    const int64_t cpg = c / groups;
#pragma omp parallel for schedule(dynamic, 1) if (n * c * s > CDF_K_PAR_MIN_WORK / 4)
    for (int64_t ng = 0; ng < n * groups; ng++) {
        /* the group's channels are one contiguous block of cpg * s elements */
        const int64_t base = ng * cpg * s;
        float mean, var;
        strided_moments(in, in_dt, base, 1, cpg * s, &mean, &var);
        const float rstd = 1.0f / sqrtf(var + eps);
        float buf[CHUNK];
        for (int64_t ch = 0; ch < cpg; ch++) {
            const int64_t cidx = (ng % groups) * cpg + ch;
            const float w = weight ? cdf_k_ld(weight, wdt, cidx) : 1.0f;
            const float b = bias ? cdf_k_ld(bias, wdt, cidx) : 0.0f;
            for (int64_t s0 = 0; s0 < s; s0 += CHUNK) {
                int64_t len = s - s0 < CHUNK ? s - s0 : CHUNK;
                const int64_t off = base + ch * s + s0;
                cdf_k_load_row(buf, in, in_dt, off, len);
                for (int64_t k = 0; k < len; k++) buf[k] = (buf[k] - mean) * rstd * w + b;
                cdf_k_store_row(out, out_dt, off, buf, len);
            }
        }
    }
    return CDF_OK;
}

/* ---- reductions ------------------------------------------------------------------------------ */

static bool is_int_input(cdf_dtype dt) {
    return dt == CDF_I64 || dt == CDF_I32 || dt == CDF_I16 || dt == CDF_I8 || dt == CDF_U8 || dt == CDF_BOOL;
}

/* Element idx of an integer dtype, exactly. */
static int64_t ld_int(const void *p, cdf_dtype dt, int64_t idx) {
    switch (dt) {
    case CDF_I64: return ((const int64_t *)p)[idx];
    case CDF_I32: return ((const int32_t *)p)[idx];
    case CDF_I16: return ((const int16_t *)p)[idx];
    case CDF_I8: return ((const int8_t *)p)[idx];
    default: return ((const uint8_t *)p)[idx]; /* u8, bool */
    }
}

/* torch.argmax: the first index of the maximum; a NaN counts as the maximum (its first one). */
static cdf_status reduce_argmax(void *out, cdf_dtype out_dt, const void *in, cdf_dtype in_dt, int64_t outer, int64_t red,
                                int64_t inner) {
    static const char *fn = "cdf_k_reduce(argmax)";
    if (out_dt != CDF_I64) return cdf_error(CDF_ERR_DTYPE, "%s: out dtype %s is not i64", fn, cdf_dtype_name(out_dt));
    if (!cdf_dtype_size(in_dt) || in_dt == CDF_DTYPE_COUNT)
        return cdf_error(CDF_ERR_DTYPE, "%s: invalid input dtype %d", fn, (int)in_dt);
    CDF_K_CHECK_NONNEG(fn, "outer", outer);
    CDF_K_CHECK_NONNEG(fn, "red", red);
    CDF_K_CHECK_NONNEG(fn, "inner", inner);
    if (outer == 0 || inner == 0) return CDF_OK;
    if (red == 0) return cdf_error(CDF_ERR_INVALID_ARG, "%s: argmax over an empty dimension", fn);
    CDF_K_CHECK_PTR(fn, "out", out);
    CDF_K_CHECK_PTR(fn, "in", in);
    const bool ints = is_int_input(in_dt);
    for (int64_t oi = 0; oi < outer * inner; oi++) {
        const int64_t o = oi / inner, i = oi % inner, off = o * red * inner + i;
        int64_t best = 0;
        if (ints) { /* compared as integers: exact beyond 2^53 */
            int64_t v = ld_int(in, in_dt, off);
            for (int64_t r = 1; r < red; r++) {
                const int64_t e = ld_int(in, in_dt, off + r * inner);
                if (e > v) v = e, best = r;
            }
        } else {
            double v = in_dt == CDF_F64 ? ((const double *)in)[off] : cdf_k_ld(in, in_dt, off);
            for (int64_t r = 1; r < red && !isnan(v); r++) {
                const double e = in_dt == CDF_F64 ? ((const double *)in)[off + r * inner] : cdf_k_ld(in, in_dt, off + r * inner);
                if (isnan(e) || e > v) v = e, best = r;
            }
        }
        ((int64_t *)out)[oi] = best;
    }
    return CDF_OK;
}

cdf_status cdf_k_reduce(cdf_reduce_op op, void *out, cdf_dtype out_dt, const void *in, cdf_dtype in_dt,
                        int64_t outer, int64_t red, int64_t inner) {
    static const char *fn = "cdf_k_reduce";
    if (op == CDF_RED_ARGMAX) return reduce_argmax(out, out_dt, in, in_dt, outer, red, inner);
    if (op != CDF_RED_SUM && op != CDF_RED_MEAN && op != CDF_RED_VAR && op != CDF_RED_MAX && op != CDF_RED_MIN)
        return cdf_error(CDF_ERR_INVALID_ARG, "%s: unknown op %d", fn, (int)op);
    CDF_K_CHECK_FLOAT_DT(fn, "out", out_dt);
    CDF_K_CHECK_FLOAT_DT(fn, "in", in_dt);
    CDF_K_CHECK_NONNEG(fn, "outer", outer);
    CDF_K_CHECK_NONNEG(fn, "red", red);
    CDF_K_CHECK_NONNEG(fn, "inner", inner);
    if (outer == 0 || inner == 0) return CDF_OK;
    if (red == 0 && (op == CDF_RED_MAX || op == CDF_RED_MIN))
        return cdf_error(CDF_ERR_INVALID_ARG, "%s: max/min over an empty dimension", fn);
    CDF_K_CHECK_PTR(fn, "out", out);
    if (red > 0) CDF_K_CHECK_PTR(fn, "in", in);
#pragma omp parallel for schedule(static) if (outer * red * inner > CDF_K_PAR_MIN_WORK / 4)
    for (int64_t oi = 0; oi < outer * inner; oi++) {
        const int64_t o = oi / inner, i = oi % inner;
        const int64_t off = o * red * inner + i;
        float v;
        switch (op) {
        case CDF_RED_SUM: v = red ? strided_sum(in, in_dt, off, inner, red, 0.0f, 0) : 0.0f; break;
        case CDF_RED_MEAN: v = red ? strided_sum(in, in_dt, off, inner, red, 0.0f, 0) / (float)red : NAN; break;
        case CDF_RED_VAR: {
            float mean, var = NAN;
            if (red) strided_moments(in, in_dt, off, inner, red, &mean, &var);
            v = var;
            break;
        }
        default: { /* max / min, NaN propagates as in torch */
            v = cdf_k_ld(in, in_dt, off);
            for (int64_t r = 1; r < red && !isnan(v); r++) {
                float e = cdf_k_ld(in, in_dt, off + r * inner);
                if (isnan(e) || (op == CDF_RED_MAX ? e > v : e < v)) v = e;
            }
            break;
        }
        }
        cdf_k_st(out, out_dt, oi, v);
    }
    return CDF_OK;
}
