/* Reference kernel: direct 2-D convolution, NCHW, any kernel/stride/padding/dilation/groups.
 * Input and weights are converted to f32 once; each output plane is accumulated in f32 and
 * rounded to the output dtype once. */
#include <omp.h>

#include "kernels/reference_internal.h"

/* A whole operand as f32: `src` itself when it is f32, otherwise a converted copy in *owned. */
static const float *as_f32(const void *src, cdf_dtype dt, int64_t n, float **owned) {
    *owned = NULL;
    if (dt == CDF_F32) return src;
    float *p = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    if (!p) return NULL;
    cdf_k_load_row(p, src, dt, 0, n);
    *owned = p;
    return p;
}

cdf_status cdf_k_conv2d(const cdf_k_conv2d_args *a) {
    static const char *fn = "cdf_k_conv2d";
    CDF_K_CHECK_PTR(fn, "args", a);
    CDF_K_CHECK_FLOAT_DT(fn, "x", a->x_dt);
    CDF_K_CHECK_FLOAT_DT(fn, "weight", a->w_dt);
    CDF_K_CHECK_FLOAT_DT(fn, "out", a->out_dt);
    if (a->bias) CDF_K_CHECK_FLOAT_DT(fn, "bias", a->b_dt);
    CDF_K_CHECK_NONNEG(fn, "n", a->n);
    CDF_K_CHECK_NONNEG(fn, "h", a->h);
    CDF_K_CHECK_NONNEG(fn, "w", a->w);
    CDF_K_CHECK_NONNEG(fn, "pad_h", a->pad_h);
    CDF_K_CHECK_NONNEG(fn, "pad_w", a->pad_w);
    if (a->kh < 1 || a->kw < 1 || a->stride_h < 1 || a->stride_w < 1 || a->dil_h < 1 || a->dil_w < 1)
        return cdf_error(CDF_ERR_INVALID_ARG, "%s: kernel %lldx%lld, stride %lldx%lld, dilation %lldx%lld must be >= 1",
                         fn, (long long)a->kh, (long long)a->kw, (long long)a->stride_h, (long long)a->stride_w,
                         (long long)a->dil_h, (long long)a->dil_w);
    if (a->groups < 1 || a->cin < 1 || a->cout < 1 || a->cin % a->groups || a->cout % a->groups)
        return cdf_error(CDF_ERR_INVALID_ARG, "%s: cin %lld / cout %lld not divisible into %lld groups", fn,
                         (long long)a->cin, (long long)a->cout, (long long)a->groups);
    const int64_t oh = (a->h + 2 * a->pad_h - a->dil_h * (a->kh - 1) - 1) / a->stride_h + 1;
    const int64_t ow = (a->w + 2 * a->pad_w - a->dil_w * (a->kw - 1) - 1) / a->stride_w + 1;
    if (a->h + 2 * a->pad_h < a->dil_h * (a->kh - 1) + 1 || a->w + 2 * a->pad_w < a->dil_w * (a->kw - 1) + 1)
        return cdf_error(CDF_ERR_SHAPE, "%s: padded input %lldx%lld is smaller than the dilated kernel", fn,
                         (long long)(a->h + 2 * a->pad_h), (long long)(a->w + 2 * a->pad_w));
    if (a->n == 0) return CDF_OK;
    CDF_K_CHECK_PTR(fn, "x", a->x);
    CDF_K_CHECK_PTR(fn, "weight", a->weight);
    CDF_K_CHECK_PTR(fn, "out", a->out);

    const int64_t cin_g = a->cin / a->groups, cout_g = a->cout / a->groups;
    const int64_t in_plane = a->h * a->w, out_plane = oh * ow;
    float *x_owned = NULL, *w_owned = NULL;
    const float *x = as_f32(a->x, a->x_dt, a->n * a->cin * in_plane, &x_owned);
    const float *wt = x ? as_f32(a->weight, a->w_dt, a->cout * cin_g * a->kh * a->kw, &w_owned) : NULL;
    const int nthr = omp_get_max_threads() > 0 ? omp_get_max_threads() : 1;
    float *acc_all = wt ? malloc(sizeof(float) * (size_t)out_plane * (size_t)nthr) : NULL;
    if (!acc_all) {
        free(x_owned);
        free(w_owned);
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "%s: cannot allocate f32 buffers (input %lldx%lldx%lldx%lld)", fn,
                         (long long)a->n, (long long)a->cin, (long long)a->h, (long long)a->w);
    }

    const double work = (double)a->n * (double)a->cout * (double)out_plane * (double)(cin_g * a->kh * a->kw);
#pragma omp parallel for schedule(dynamic, 1) if (work > CDF_K_PAR_MIN_WORK)
    for (int64_t nco = 0; nco < a->n * a->cout; nco++) {
        const int64_t n = nco / a->cout, co = nco % a->cout, g = co / cout_g;
        float *acc = acc_all + (size_t)out_plane * (size_t)omp_get_thread_num();
        const float b = a->bias ? cdf_k_ld(a->bias, a->b_dt, co) : 0.0f;
        for (int64_t i = 0; i < out_plane; i++) acc[i] = b;
        for (int64_t ky = 0; ky < a->kh; ky++) {
            for (int64_t kx = 0; kx < a->kw; kx++) {
                /* output columns whose input column ix = ox*sw - pw + kx*dw lies inside [0, w) */
                const int64_t xoff = kx * a->dil_w - a->pad_w;
                int64_t ox0 = 0, ox1 = ow;
                while (ox0 < ow && ox0 * a->stride_w + xoff < 0) ox0++;
                while (ox1 > ox0 && (ox1 - 1) * a->stride_w + xoff >= a->w) ox1--;
                for (int64_t ci = 0; ci < cin_g; ci++) {
                    const float *plane = x + (n * a->cin + g * cin_g + ci) * in_plane;
                    const float wv = wt[((co * cin_g + ci) * a->kh + ky) * a->kw + kx];
                    for (int64_t oy = 0; oy < oh; oy++) {
                        const int64_t iy = oy * a->stride_h - a->pad_h + ky * a->dil_h;
                        if (iy < 0 || iy >= a->h) continue;
                        const float *row = plane + iy * a->w;
                        float *orow = acc + oy * ow;
                        if (a->stride_w == 1) {
                            for (int64_t ox = ox0; ox < ox1; ox++) orow[ox] += wv * row[ox + xoff];
                        } else {
                            for (int64_t ox = ox0; ox < ox1; ox++) orow[ox] += wv * row[ox * a->stride_w + xoff];
                        }
                    }
                }
            }
        }
        cdf_k_store_row(a->out, a->out_dt, nco * out_plane, acc, out_plane);
    }
    free(acc_all);
    free(x_owned);
    free(w_owned);
    return CDF_OK;
}
