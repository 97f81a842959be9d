/* RoPE cos/sin tables computed from position ids on the device (so a forward that needs them
 * has no host read of its inputs and can be captured as one graph). */
#include <math.h>
#include <stdlib.h>

#include "kernels/reference_internal.h"

cdf_status cdf_k_rope_table(float *out, const float *pos, int64_t rows, int n_axes, const int64_t *axes_dim, double theta) {
    static const char *fn = "cdf_k_rope_table";
    if (n_axes <= 0 || n_axes > CDF_MAX_DIMS || rows < 0 || !(theta > 0))
        return cdf_error(CDF_ERR_INVALID_ARG, "%s: bad arguments", fn);
    int64_t width = 0;
    for (int a = 0; a < n_axes; a++) {
        if (axes_dim[a] <= 0 || axes_dim[a] % 2) return cdf_error(CDF_ERR_INVALID_ARG, "%s: axis %d dim %lld", fn, a, (long long)axes_dim[a]);
        width += axes_dim[a];
    }
    if (rows == 0) return CDF_OK;
    CDF_K_CHECK_PTR(fn, "out", out);
    CDF_K_CHECK_PTR(fn, "pos", pos);
    float *cos_t = out, *sin_t = out + rows * width;
    int64_t col0 = 0;
    for (int a = 0; a < n_axes; a++) {
        const int64_t dim = axes_dim[a], half = dim / 2;
        double *freqs = malloc((size_t)half * sizeof *freqs);
        if (!freqs) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
        /* like torch: arange(0, dim, 2, float64) / dim, theta ** that, then 1.0 / it */
        for (int64_t k = 0; k < half; k++) freqs[k] = 1.0 / pow(theta, (double)(2 * k) / (double)dim);
#pragma omp parallel for schedule(static) if (rows * half > CDF_K_PAR_MIN_WORK)
        for (int64_t r = 0; r < rows; r++) {
            const double p = (double)pos[r * n_axes + a]; /* float32 position promoted to float64 */
            float *cr = cos_t + r * width + col0, *sr = sin_t + r * width + col0;
            for (int64_t k = 0; k < half; k++) {
                const double angle = p * freqs[k];
                cr[2 * k] = cr[2 * k + 1] = (float)cos(angle);
                sr[2 * k] = sr[2 * k + 1] = (float)sin(angle);
            }
        }
        free(freqs);
        col0 += dim;
    }
    return CDF_OK;
}
