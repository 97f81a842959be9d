/* The fused elementwise kernel: a chain of unary/binary ops evaluated block by block with the
 * intermediate values in f32 registers (one pass over memory instead of one per op). */
#include <omp.h>
#include <stdlib.h>

#include "core/host_memory.h"
#include "kernels/dispatch.h"
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
 * input is read in runs along its last dim (a row of a broadcast gate/shift/scale [B, 1, N] is
 * one contiguous load), then the multi-index moves on to the next row. */
static void load_block(float *buf, const void *p, cdf_dtype dt, const int64_t *strides, bool contig, int ndim,
                       const int64_t *shape, int64_t f0, int64_t len) {
    if (contig) {
        cdf_k_load_row(buf, p, dt, f0, len);
        return;
    }
    if (ndim == 0) {
        for (int64_t i = 0; i < len; i++) buf[i] = cdf_k_ld(p, dt, 0);
        return;
    }
    int64_t idx[CDF_MAX_DIMS], off = 0, rem = f0;
    for (int d = ndim - 1; d >= 0; d--) {
        idx[d] = shape[d] ? rem % shape[d] : 0;
        rem = shape[d] ? rem / shape[d] : 0;
        off += idx[d] * strides[d];
    }
    const int last = ndim - 1;
    const int64_t ls = strides[last];
    for (int64_t i = 0; i < len;) {
        int64_t run = shape[last] - idx[last];
        if (run > len - i) run = len - i;
        if (ls == 1) {
            cdf_k_load_row(buf + i, p, dt, off, run);
        } else if (ls == 0) {
            const float v = cdf_k_ld(p, dt, off);
            for (int64_t r = 0; r < run; r++) buf[i + r] = v;
        } else {
            for (int64_t r = 0; r < run; r++) buf[i + r] = cdf_k_ld(p, dt, off + r * ls);
        }
        i += run;
        off += run * ls;
        idx[last] += run;
        if (idx[last] < shape[last]) break; /* the block ended inside this row */
        /* next row: carry the multi-index */
        off -= ls * shape[last];
        idx[last] = 0;
        for (int d = last - 1; d >= 0; d--) {
            off += strides[d];
            if (++idx[d] < shape[d]) break;
            off -= strides[d] * shape[d];
            idx[d] = 0;
        }
    }
}

/* What every block of one call shares: the program, the operands, which inputs are read. */
typedef struct fused_call {
    const cdf_fused_program *p;
    void *out;
    cdf_dtype out_dt;
    int n_in, ndim;
    const void *const *in;
    const cdf_dtype *in_dt;
    const int64_t *const *in_strides;
    const int64_t *shape;
    /* operand[k]: a binary step reads input k (input 0, the chain's head, is also loaded as the
     * starting values) */
    bool contig[CDF_FUSE_MAX_INPUTS], operand[CDF_FUSE_MAX_INPUTS];
} fused_call;

static cdf_status prepare(fused_call *c, const char *fn) {
    const cdf_fused_program *p = c->p;
    if (!p || c->n_in < 1 || c->n_in > CDF_FUSE_MAX_INPUTS || p->n_steps < (p->norm_head ? 0 : 1) ||
        p->n_steps > CDF_FUSE_MAX_STEPS || c->ndim < 0 || c->ndim > CDF_MAX_DIMS)
        return cdf_error(CDF_ERR_INVALID_ARG, "%s: malformed program", fn);
    CDF_K_CHECK_FLOAT_DT(fn, "out", c->out_dt);
    for (int k = 0; k < c->n_in; k++) CDF_K_CHECK_FLOAT_DT(fn, "input", c->in_dt[k]);
    for (int s = 0; s < p->n_steps; s++)
        if (p->steps[s].binary && (p->steps[s].input < 0 || p->steps[s].input >= c->n_in))
            return cdf_error(CDF_ERR_INVALID_ARG, "%s: step %d reads input %d of %d", fn, s, p->steps[s].input, c->n_in);
    for (int k = 0; k < c->n_in; k++) {
        c->contig[k] = is_contiguous(c->ndim, c->shape, c->in_strides[k]);
        c->operand[k] = false;
    }
    for (int s = 0; s < p->n_steps; s++)
        if (p->steps[s].binary) c->operand[p->steps[s].input] = true;
    if (p->norm_head && (c->ndim < 1 || !c->contig[0] || c->operand[0] || c->shape[c->ndim - 1] > CDF_FUSE_NORM_MAX_COLS))
        return cdf_error(CDF_ERR_INVALID_ARG, "%s: a norm head needs a contiguous input 0 of at most %d columns that no step reads",
                         fn, CDF_FUSE_NORM_MAX_COLS);
    return CDF_OK;
}

/* Evaluate the program on the len (<= FUSE_BLOCK) elements from flat index f0. head: the chain's
 * starting values for them (a norm head's output, evaluated there in place), or NULL: input 0
 * loaded. */
static void run_block(const fused_call *c, int64_t f0, int64_t len, float *head) {
    const cdf_fused_program *p = c->p;
    const void *const *in = c->in;
    const cdf_dtype *in_dt = c->in_dt;
    const int64_t *const *in_strides = c->in_strides;
    const int ndim = c->ndim;
    const int64_t *shape = c->shape;
    float vbuf[FUSE_BLOCK], x[CDF_FUSE_MAX_INPUTS][FUSE_BLOCK];
    float *v = head ? head : vbuf;
    /* operands (the head too, when a step reads it again): a contiguous f32 input is read where
     * it is (a copy into x would only add a pass through L1), the others converted into x once */
    const float *xp[CDF_FUSE_MAX_INPUTS];
    for (int k = 0; k < c->n_in; k++) {
        if (!c->operand[k]) continue;
        if (c->contig[k] && in_dt[k] == CDF_F32) {
            xp[k] = (const float *)in[k] + f0;
        } else {
            load_block(x[k], in[k], in_dt[k], in_strides[k], c->contig[k], ndim, shape, f0, len);
            xp[k] = x[k];
        }
    }
    if (!head) load_block(v, in[0], in_dt[0], in_strides[0], c->contig[0], ndim, shape, f0, len);
    for (int s = 0; s < p->n_steps; s++) {
        const cdf_fused_step *st = &p->steps[s];
        if (!st->binary) cdf_k_unary_span((cdf_unary_op)st->op, v, len, st->p0, st->p1);
        else cdf_k_binary_span((cdf_binary_op)st->op, st->chain_rhs, v, xp[st->input], len);
    }
    cdf_k_store_row(c->out, c->out_dt, f0, v, len);
}

/* A norm head: groups of up to 16 rows (the fast norm's lane width; row r0 of each group a multiple
 * of 16, as in the norm kernel's own split) are normalised into a per-thread f32 buffer that stays
 * in cache, and the chain runs over them from there: the norm's output never goes to memory. */
static cdf_status run_norm_head(const fused_call *c, int64_t n) {
    const int64_t cols = c->shape[c->ndim - 1], rows = cols ? n / cols : 0, groups = (rows + 15) / 16;
    const size_t esz = cdf_dtype_size(c->in_dt[0]), lanes_bytes = cdf_k_layer_norm_rows_scratch(cols);
    const size_t per_thread = lanes_bytes + (size_t)(16 * cols) * sizeof(float);
    const int nthr = omp_get_max_threads() > 0 ? omp_get_max_threads() : 1;
    /* a kept large buffer (core/host_memory.h): at every norm of every block, a fresh mapping
     * would fault its pages in again */
    const size_t bytes = (size_t)nthr * per_thread < CDF_HOST_LARGE_MIN ? CDF_HOST_LARGE_MIN : (size_t)nthr * per_thread;
    unsigned char *scratch = cdf_host_alloc_large(bytes);
    if (!scratch)
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "cdf_k_fused_elementwise: %zu bytes of scratch for a norm head", bytes);
    const float eps = c->p->norm_eps;
#pragma omp parallel for schedule(static) if (n > CDF_K_PAR_MIN_WORK / 4)
    for (int64_t g = 0; g < groups; g++) {
        unsigned char *mine = scratch + (size_t)omp_get_thread_num() * per_thread;
        float *head = (float *)(mine + lanes_bytes);
        const int nrows = rows - 16 * g < 16 ? (int)(rows - 16 * g) : 16;
        cdf_k_layer_norm_rows(head, (const unsigned char *)c->in[0] + (size_t)(16 * g * cols) * esz, c->in_dt[0], nrows,
                              cols, eps, mine);
        const int64_t g0 = 16 * g * cols, g1 = g0 + nrows * cols;
        for (int64_t f0 = g0; f0 < g1; f0 += FUSE_BLOCK)
            run_block(c, f0, g1 - f0 < FUSE_BLOCK ? g1 - f0 : FUSE_BLOCK, head + (f0 - g0));
    }
    cdf_host_free_large(scratch, bytes);
    return CDF_OK;
}

cdf_status cdf_k_fused_elementwise(const cdf_fused_program *p, void *out, cdf_dtype out_dt, int n_in,
                                   const void *const *in, const cdf_dtype *in_dt, const int64_t *const *in_strides,
                                   int ndim, const int64_t *shape) {
    fused_call c = {.p = p, .out = out, .out_dt = out_dt, .n_in = n_in, .ndim = ndim, .in = in, .in_dt = in_dt,
                    .in_strides = in_strides, .shape = shape};
    CDF_TRY(prepare(&c, "cdf_k_fused_elementwise"));
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    if (n == 0) return CDF_OK;
    if (p->norm_head) return run_norm_head(&c, n);
    const int64_t blocks = (n + FUSE_BLOCK - 1) / FUSE_BLOCK;
#pragma omp parallel for schedule(static) if (n > CDF_K_PAR_MIN_WORK)
    for (int64_t b = 0; b < blocks; b++) {
        int64_t f0 = b * FUSE_BLOCK, len = n - f0 < FUSE_BLOCK ? n - f0 : FUSE_BLOCK;
        run_block(&c, f0, len, NULL);
    }
    return CDF_OK;
}

/* ---- the program as a matmul epilogue ---- */

cdf_status cdf_k_fused_epilogue_check(cdf_k_fused_epilogue *e) {
    static const char *fn = "cdf_k_fused_epilogue";
    if (!e || e->ndim < 0 || e->ndim > CDF_MAX_DIMS || e->batch < 0 || e->M < 0 || e->N < 0)
        return cdf_error(CDF_ERR_INVALID_ARG, "%s: malformed arguments", fn);
    int64_t n = 1;
    for (int d = 0; d < e->ndim; d++) n *= e->shape[d];
    if (n != e->batch * e->M * e->N)
        return cdf_error(CDF_ERR_INVALID_ARG, "%s: the chain's shape holds %lld elements, the product %lld x %lld x %lld",
                         fn, (long long)n, (long long)e->batch, (long long)e->M, (long long)e->N);
    int64_t s = 1;
    for (int d = e->ndim - 1; d >= 0; d--) {
        e->c_strides[d] = s;
        s *= e->shape[d];
    }
    if (e->p && e->p->norm_head) return cdf_error(CDF_ERR_INVALID_ARG, "%s: a norm head cannot be an epilogue", fn);
    e->in_strides[0] = e->c_strides;
    fused_call c = {.p = e->p, .out = e->out, .out_dt = e->out_dt, .n_in = e->n_in, .ndim = e->ndim, .in = e->in,
                    .in_dt = e->in_dt, .in_strides = e->in_strides, .shape = e->shape};
    return prepare(&c, fn);
}

void cdf_k_fused_epilogue_rows(void *ctx, int64_t bi, int64_t row0, int64_t row1) {
    const cdf_k_fused_epilogue *e = ctx;
    fused_call c = {.p = e->p, .out = e->out, .out_dt = e->out_dt, .n_in = e->n_in, .ndim = e->ndim, .in = e->in,
                    .in_dt = e->in_dt, .in_strides = e->in_strides, .shape = e->shape};
    if (prepare(&c, "cdf_k_fused_epilogue") != CDF_OK) return; /* refused by the check before the matmul */
    /* no OpenMP region here: the matmul calls this from its own threads, one row panel each */
    const int64_t f1 = (bi * e->M + row1) * e->N;
    for (int64_t f0 = (bi * e->M + row0) * e->N; f0 < f1; f0 += FUSE_BLOCK)
        run_block(&c, f0, f1 - f0 < FUSE_BLOCK ? f1 - f0 : FUSE_BLOCK, NULL);
}
