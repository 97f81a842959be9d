/* The fused elementwise kernel: a chain of unary/binary ops evaluated block by block with the
 * intermediate values in f32 registers (one pass over memory instead of one per op). */
#include <string.h>

#include "kernels/reference_internal.h"

#define FUSE_BLOCK 256

static bool is_contiguous(int ndim, const int64_t *shape, const int64_t *strides) {
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        if (shape[i] != 1 && strides[i] != s) return false;
        s *= shape[i];
    }
    return true;
}

/* Load len elements starting at flat index f0 of a strided input into buf (as f32). A strided
 * input is taken in runs along its last dimension: a row (stride 1) is one cdf_k_load_row, a
 * broadcast (stride 0, e.g. an AdaLN shift/scale [B, 1, C] over the tokens of [B, L, C] has it
 * on L, a bias on a [.., C, HW] layout on HW) one value repeated; only other strides go element
 * by element. */
static void load_block(float *buf, const void *p, cdf_dtype dt, const int64_t *strides, bool contig, int ndim,
                       const int64_t *shape, int64_t f0, int64_t len) {
    if (contig) {
        cdf_k_load_row(buf, p, dt, f0, len);
        return;
    }
    int64_t idx[CDF_MAX_DIMS], off = 0, rem = f0;
    for (int d = ndim - 1; d >= 0; d--) {
        idx[d] = shape[d] ? rem % shape[d] : 0;
        rem = shape[d] ? rem / shape[d] : 0;
        off += idx[d] * strides[d];
    }
    const int last = ndim - 1;
    for (int64_t i = 0; i < len;) {
        int64_t run = shape[last] - idx[last];
        if (run > len - i) run = len - i;
        if (strides[last] == 1) {
            cdf_k_load_row(buf + i, p, dt, off, run);
        } else if (strides[last] == 0) {
            const float v = cdf_k_ld(p, dt, off);
            for (int64_t k = 0; k < run; k++) buf[i + k] = v;
        } else {
            for (int64_t k = 0; k < run; k++) buf[i + k] = cdf_k_ld(p, dt, off + k * strides[last]);
        }
        i += run;
        idx[last] += run;
        off += run * strides[last];
        if (idx[last] < shape[last]) break; /* the block ended inside this row */
        off -= strides[last] * shape[last];
        idx[last] = 0;
        for (int d = last - 1; d >= 0; d--) { /* carry into the outer dimensions */
            off += strides[d];
            if (++idx[d] < shape[d]) break;
            off -= strides[d] * shape[d];
            idx[d] = 0;
        }
    }
}

cdf_status cdf_k_fused_elementwise(const cdf_fused_program *p, void *out, cdf_dtype out_dt, int n_in,
                                   const void *const *in, const cdf_dtype *in_dt, const int64_t *const *in_strides,
                                   int ndim, const int64_t *shape) {
    static const char *fn = "cdf_k_fused_elementwise";
    if (!p || n_in < 1 || n_in > CDF_FUSE_MAX_INPUTS || p->n_steps < 1 || p->n_steps > CDF_FUSE_MAX_STEPS ||
        ndim < 0 || ndim > CDF_MAX_DIMS)
        return cdf_error(CDF_ERR_INVALID_ARG, "%s: malformed program", fn);
    CDF_K_CHECK_FLOAT_DT(fn, "out", out_dt);
    for (int k = 0; k < n_in; k++) CDF_K_CHECK_FLOAT_DT(fn, "input", in_dt[k]);
    for (int s = 0; s < p->n_steps; s++)
        if (p->steps[s].binary && (p->steps[s].input < 0 || p->steps[s].input >= n_in))
            return cdf_error(CDF_ERR_INVALID_ARG, "%s: step %d reads input %d of %d", fn, s, p->steps[s].input, n_in);
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    if (n == 0) return CDF_OK;
    bool contig[CDF_FUSE_MAX_INPUTS];
    for (int k = 0; k < n_in; k++) contig[k] = is_contiguous(ndim, shape, in_strides[k]);
    bool used[CDF_FUSE_MAX_INPUTS] = {true};
    for (int s = 0; s < p->n_steps; s++)
        if (p->steps[s].binary) used[p->steps[s].input] = true;
    const int64_t blocks = (n + FUSE_BLOCK - 1) / FUSE_BLOCK;
#pragma omp parallel for schedule(static) if (n > CDF_K_PAR_MIN_WORK)
    for (int64_t b = 0; b < blocks; b++) {
        float v[FUSE_BLOCK], x[CDF_FUSE_MAX_INPUTS][FUSE_BLOCK];
        int64_t f0 = b * FUSE_BLOCK, len = n - f0 < FUSE_BLOCK ? n - f0 : FUSE_BLOCK;
        for (int k = 1; k < n_in; k++)
            if (used[k]) load_block(x[k], in[k], in_dt[k], in_strides[k], contig[k], ndim, shape, f0, len);
        load_block(v, in[0], in_dt[0], in_strides[0], contig[0], ndim, shape, f0, len);
        for (int s = 0; s < p->n_steps; s++) {
            const cdf_fused_step *st = &p->steps[s];
            if (!st->binary) {
                cdf_k_unary_span((cdf_unary_op)st->op, v, len, st->p0, st->p1);
            } else if (st->input == 0) {
                /* in[0] is the chain's head; an op on it again means it is also an operand */
                float h[FUSE_BLOCK];
                load_block(h, in[0], in_dt[0], in_strides[0], contig[0], ndim, shape, f0, len);
                for (int64_t i = 0; i < len; i++)
                    v[i] = st->chain_rhs ? cdf_k_binary_f((cdf_binary_op)st->op, h[i], v[i])
                                         : cdf_k_binary_f((cdf_binary_op)st->op, v[i], h[i]);
            } else {
                const float *o = x[st->input];
                for (int64_t i = 0; i < len; i++)
                    v[i] = st->chain_rhs ? cdf_k_binary_f((cdf_binary_op)st->op, o[i], v[i])
                                         : cdf_k_binary_f((cdf_binary_op)st->op, v[i], o[i]);
            }
        }
        cdf_k_store_row(out, out_dt, f0, v, len);
    }
    return CDF_OK;
}
