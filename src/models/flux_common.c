/* Shared FLUX building blocks (see flux_common.h). */
#include "models/flux_common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"

/* ---- rotary tables (FluxPosEmbed) ------------------------------------------------------- */
cdf_status cdf_flux_rope_tables(cdf_device *dev, const float *pos, int64_t rows, int n_axes, const int64_t *axes_dim,
                                double theta, cdf_tensor **cos_out, cdf_tensor **sin_out) {
    *cos_out = *sin_out = NULL;
    if (n_axes <= 0 || n_axes > CDF_FLUX_MAX_ROPE_AXES)
        return cdf_error(CDF_ERR_INVALID_ARG, "rope tables: %d axes (expected 1..%d)", n_axes, CDF_FLUX_MAX_ROPE_AXES);
    if (rows < 0 || (rows > 0 && !pos)) return cdf_error(CDF_ERR_INVALID_ARG, "rope tables: bad positions (%lld rows)", (long long)rows);
    int64_t width = 0;
    for (int a = 0; a < n_axes; a++) {
        if (axes_dim[a] <= 0 || axes_dim[a] % 2 || axes_dim[a] > (1 << 20))
            return cdf_error(CDF_ERR_INVALID_ARG, "rope tables: axis %d has dim %lld (must be even, 2..%d)", a,
                             (long long)axes_dim[a], 1 << 20);
        width += axes_dim[a];
    }
    if (rows > (int64_t)(SIZE_MAX / 2 / sizeof(float)) / width)
        return cdf_error(CDF_ERR_LIMIT, "rope tables: %lld rows x %lld columns is too large", (long long)rows, (long long)width);
    size_t n = (size_t)(rows * width);
    float *c = malloc((n ? n : 1) * sizeof *c), *s = malloc((n ? n : 1) * sizeof *s);
    double *freqs = malloc((size_t)width * sizeof *freqs);
    if (!c || !s || !freqs) {
        free(c);
        free(s);
        free(freqs);
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "rope tables: cannot allocate %lld x %lld", (long long)rows, (long long)width);
    }
    int64_t col0 = 0;
    for (int a = 0; a < n_axes; a++) {
        const int64_t dim = axes_dim[a], half = dim / 2;
        /* like torch: arange(0, dim, 2, float64) / dim, theta ** that, then 1.0 / it, all float64 */
        for (int64_t k = 0; k < half; k++) freqs[k] = 1.0 / pow(theta, (double)(2 * k) / (double)dim);
        for (int64_t r = 0; r < rows; r++) {
            const double p = (double)pos[r * n_axes + a]; /* float32 position promoted to float64 */
            float *cr = c + r * width + col0, *sr = s + r * width + col0;
            for (int64_t k = 0; k < half; k++) {
                const double angle = p * freqs[k];
                cr[2 * k] = cr[2 * k + 1] = (float)cos(angle);
                sr[2 * k] = sr[2 * k + 1] = (float)sin(angle);
            }
        }
        col0 += dim;
    }
    free(freqs);
    int64_t shape[2] = {rows, width};
    *cos_out = cdf_tensor_from_host(dev, CDF_F32, 2, shape, c, CDF_F32);
    *sin_out = *cos_out ? cdf_tensor_from_host(dev, CDF_F32, 2, shape, s, CDF_F32) : NULL;
    free(c);
    free(s);
    if (!*cos_out || !*sin_out) {
        cdf_status st = cdf_last_status() ? cdf_last_status() : CDF_ERR_INTERNAL;
        cdf_tensor_release(*cos_out);
        cdf_tensor_release(*sin_out);
        *cos_out = *sin_out = NULL;
        return st;
    }
    return CDF_OK;
}

/* ---- time / text embedders ---------------------------------------------------------------- */
cdf_status cdf_flux_mlp_load(cdf_weights *w, cdf_flux_mlp *m, int64_t in, int64_t hidden, int64_t out, int bias,
                             const char *prefix) {
    cdf_status s = cdf_linear_load(w, &m->linear_1, in, hidden, bias, "%s.linear_1", prefix);
    if (s != CDF_OK) return s;
    s = cdf_linear_load(w, &m->linear_2, hidden, out, bias, "%s.linear_2", prefix);
    if (s != CDF_OK) cdf_linear_free(&m->linear_1);
    return s;
}

void cdf_flux_mlp_free(cdf_flux_mlp *m) {
    cdf_linear_free(&m->linear_1);
    cdf_linear_free(&m->linear_2);
}

cdf_tensor *cdf_flux_mlp_fwd(const cdf_flux_mlp *m, cdf_tensor *x) {
    return cdf_linear_fwd(&m->linear_2, cdf_silu(cdf_linear_fwd(&m->linear_1, x)));
}

/* ---- modulation ---------------------------------------------------------------------------- */
cdf_tensor *cdf_flux_modulate(cdf_tensor *x, cdf_tensor *shift, cdf_tensor *scale) {
    cdf_tensor *one_plus_scale = cdf_unsqueeze(cdf_add_scalar(scale, 1.0f), 1); /* [B, 1, D] */
    return cdf_add(cdf_mul(x, one_plus_scale), cdf_unsqueeze(shift, 1));
}

cdf_tensor *cdf_flux_gated_add(cdf_tensor *residual, cdf_tensor *gate, cdf_tensor *y) {
    return cdf_add(residual, cdf_mul(cdf_unsqueeze(gate, 1), y));
}

/* ---- attention ------------------------------------------------------------------------------ */
cdf_tensor *cdf_flux_split_heads(cdf_tensor *x, int64_t head_dim) {
    if (!x) return NULL;
    if (cdf_tensor_ndim(x) != 3 || head_dim <= 0 || cdf_tensor_dim(x, 2) % head_dim) {
        char buf[96];
        cdf_error(CDF_ERR_SHAPE, "flux attention: %s cannot be split into heads of %lld", cdf_tensor_describe(x, buf, sizeof buf),
                  (long long)head_dim);
        return NULL;
    }
    int64_t shape[4] = {cdf_tensor_dim(x, 0), cdf_tensor_dim(x, 1), -1, head_dim};
    return cdf_reshape(x, 4, shape);
}

cdf_tensor *cdf_flux_rope_attention(cdf_tensor *q, cdf_tensor *k, cdf_tensor *v, cdf_tensor *cos_t, cdf_tensor *sin_t,
                                    cdf_dtype dt, bool keep_dt) {
    if (!q || !k || !v) return NULL;
    if (!cos_t != !sin_t) {
        cdf_error(CDF_ERR_INVALID_ARG, "flux attention: rotary cos and sin tables must be given together");
        return NULL;
    }
    /* diffusers applies the rotation with sequence_dim=1 on [B, L, H, D]; cdf_rope wants
     * [B, H, L, D], which is also the layout attention runs in */
    cdf_tensor *qh = cdf_transpose(q, 1, 2), *kh = cdf_transpose(k, 1, 2), *vh = cdf_transpose(v, 1, 2);
    /* dt bf16: q and k written as bf16 by RoPE (the op that writes them anyway), v by a cast (the
     * projection writes f32); the attention then runs the bf16 policy. f32: as they are. */
    if (cos_t || sin_t) {
        qh = cdf_rope_as(qh, cos_t, sin_t, dt);
        kh = cdf_rope_as(kh, cos_t, sin_t, dt);
    } else {
        qh = cdf_cast(qh, dt);
        kh = cdf_cast(kh, dt);
    }
    vh = cdf_cast(vh, dt);
    cdf_tensor *o = cdf_sdpa(qh, kh, vh, NULL, 0.0f); /* [B, H, L, D] in dt, scale 1/sqrt(D) */
    /* [B, L, H, D] f32 (the residual stream's dtype; a bf16 o loses nothing the next projection,
     * rounding its input to bf16, would keep), or in dt with keep_dt (every consumer rounds its
     * input to dt: the same values in half the bytes): one copy either way */
    cdf_tensor *tr = cdf_transpose(o, 1, 2);
    cdf_tensor *ot = tr && !keep_dt && cdf_tensor_dtype(tr) != CDF_F32 ? cdf_cast(tr, CDF_F32) : cdf_contiguous(tr);
    if (!ot) return NULL;
    int64_t shape[3] = {cdf_tensor_dim(ot, 0), cdf_tensor_dim(ot, 1), cdf_tensor_dim(ot, 2) * cdf_tensor_dim(ot, 3)};
    return cdf_reshape(ot, 3, shape);
}

cdf_status cdf_flux_replace_state(cdf_tensor **state, cdf_tensor *next) {
    if (!next) return cdf_last_status() ? cdf_last_status() : CDF_ERR_INTERNAL;
    cdf_tensor_release(*state);
    *state = cdf_tensor_retain(next);
    return CDF_OK;
}

cdf_status cdf_flux_input_shape_error(const char *model, const char *name, const cdf_tensor *t, const char *want) {
    char buf[128];
    return cdf_error(CDF_ERR_SHAPE, "%s: input '%s' is %s but must be %s", model, name, cdf_tensor_describe(t, buf, sizeof buf),
                     want);
}

cdf_status cdf_flux_check_per_batch(const char *model, const char *name, const cdf_tensor *t, int64_t B) {
    if (cdf_tensor_ndim(t) != 1 || (cdf_tensor_dim(t, 0) != B && cdf_tensor_dim(t, 0) != 1)) {
        char want[64];
        if (B == 1) snprintf(want, sizeof want, "[1] (one value per batch entry)");
        else snprintf(want, sizeof want, "[%lld] or [1] (one value per batch entry, or one for all)", (long long)B);
        return cdf_flux_input_shape_error(model, name, t, want);
    }
    return CDF_OK;
}

/* ---- config checks ---------------------------------------------------------------------- */
cdf_status cdf_flux_check_ranges(const char *dir, const cdf_flux_range *r, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (r[i].v < r[i].lo || r[i].v > r[i].hi)
            return cdf_error(CDF_ERR_FORMAT, "%s/config.json: %s = %lld is outside %lld..%lld", dir, r[i].key, (long long)r[i].v,
                             (long long)r[i].lo, (long long)r[i].hi);
    return CDF_OK;
}

cdf_status cdf_flux_inner_dim(const char *dir, int64_t heads, int64_t head_dim, int64_t *inner) {
    *inner = heads * head_dim;
    if (*inner > (1 << 20))
        return cdf_error(CDF_ERR_FORMAT, "%s/config.json: num_attention_heads %lld x attention_head_dim %lld = %lld exceeds %d",
                         dir, (long long)heads, (long long)head_dim, (long long)*inner, 1 << 20);
    return CDF_OK;
}

cdf_status cdf_flux_check_rope_axes(const char *dir, int n_axes, const int64_t *axes, int64_t head_dim) {
    if (n_axes <= 0) return cdf_error(CDF_ERR_FORMAT, "%s/config.json: axes_dims_rope is empty", dir);
    int64_t sum = 0;
    char list[160] = "";
    for (int a = 0; a < n_axes; a++) {
        if (axes[a] <= 0 || axes[a] % 2)
            return cdf_error(CDF_ERR_FORMAT, "%s/config.json: axes_dims_rope[%d] = %lld must be a positive even number", dir, a,
                             (long long)axes[a]);
        sum += axes[a];
        size_t o = strlen(list);
        snprintf(list + o, sizeof list - o, "%s%lld", a ? " + " : "", (long long)axes[a]);
    }
    if (sum != head_dim)
        return cdf_error(CDF_ERR_FORMAT,
                         "%s/config.json: axes_dims_rope sums to %s = %lld but attention_head_dim is %lld (the rotary "
                         "embedding must cover exactly one attention head)",
                         dir, list, (long long)sum, (long long)head_dim);
    return CDF_OK;
}
