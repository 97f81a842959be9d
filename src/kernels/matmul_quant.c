/* Matmul on GGUF-quantized weights: decode a panel of weight rows, multiply, next panel.
 *
 * Why panels of decoded rows and not a kernel on the blocks: the decoded panel goes through
 * the same matmul dispatch as a plain weight (oneDNN / the ISA chain), so a quantized layer
 * computes bit for bit what its dequantized file computes, and the panel (at most
 * PANEL_ELEMS values) is the only unpacked copy: the model's weights stay quantized. Decoding
 * costs O(N*K) against the product's O(M*N*K), negligible at the DiT's M of 1000-4000 tokens. */
#include <pthread.h>
#include <stdlib.h>

#include "cdiffusers/io.h"
#include "core/error_internal.h"
#include "kernels/dispatch.h"
#include "kernels/kernels.h"
#include "kernels/pack_cache.h"
#include "kernels/reference_internal.h"

/* 16 Mi values (64 MiB of f32) per panel: whole layers of SD3.5-M / FLUX fit in one to three. */
#define PANEL_ELEMS ((int64_t)16 << 20)

/* The panel buffer is kept between calls: a fresh 32-64 MiB allocation per layer per forward is
 * a fresh mmap whose every page faults on first touch. One buffer is cached (the backend's
 * queue runs one matmul at a time; a concurrent caller allocates its own) and kept for the
 * process's life: at most one panel, PANEL_ELEMS values. */
static pthread_mutex_t g_panel_lock = PTHREAD_MUTEX_INITIALIZER;
static void *g_panel;
static size_t g_panel_bytes;

static void *panel_take(size_t bytes) {
    pthread_mutex_lock(&g_panel_lock);
    void *p = g_panel;
    const size_t have = g_panel_bytes;
    g_panel = NULL, g_panel_bytes = 0;
    pthread_mutex_unlock(&g_panel_lock);
    if (p && have >= bytes) return p;
    free(p);
    return malloc(bytes);
}

/* p holds at least bytes; the larger of it and a buffer cached meanwhile is kept. */
static void panel_give(void *p, size_t bytes) {
    pthread_mutex_lock(&g_panel_lock);
    if (g_panel_bytes > bytes) {
        pthread_mutex_unlock(&g_panel_lock);
        free(p);
        return;
    }
    void *old = g_panel;
    g_panel = p, g_panel_bytes = bytes;
    pthread_mutex_unlock(&g_panel_lock);
    free(old);
}

cdf_status cdf_k_matmul_q(const cdf_k_matmul_q_args *a) {
    const char *fn = "cdf_k_matmul_q";
    if (!a) return cdf_error(CDF_ERR_INVALID_ARG, "%s: no arguments", fn);
    int64_t be = 0, bb = 0;
    if (!cdf_ggml_type_block(a->qtype, &be, &bb) || !cdf_ggml_can_dequantize(a->qtype))
        return cdf_error(CDF_ERR_UNSUPPORTED, "%s: ggml type %u cannot be decoded", fn, a->qtype);
    if (a->M < 0 || a->N < 0 || a->K <= 0 || a->K % be)
        return cdf_error(CDF_ERR_INVALID_ARG, "%s: K = %lld is not a multiple of %s's %lld-element blocks", fn,
                         (long long)a->K, cdf_ggml_type_name(a->qtype), (long long)be);
    if (a->w_dt != CDF_F32 && a->w_dt != CDF_BF16)
        return cdf_error(CDF_ERR_INVALID_ARG, "%s: weights decode to f32 or bf16, not %s", fn, cdf_dtype_name(a->w_dt));
    if (a->M == 0 || a->N == 0) return CDF_OK;
    const int64_t row_bytes = a->K / be * bb;
    int64_t panel = a->N * a->K <= PANEL_ELEMS ? a->N : PANEL_ELEMS / a->K;
    if (panel < 1) panel = 1;
    const size_t wsz = cdf_dtype_size(a->w_dt), panel_bytes = (size_t)(panel * a->K) * wsz;
    void *buf = panel_take(panel_bytes);
    if (!buf)
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "%s: cannot allocate a %lld x %lld panel of decoded weights", fn,
                         (long long)panel, (long long)a->K);
    const size_t csz = cdf_dtype_size(a->c_dt), bsz = a->bias ? cdf_dtype_size(a->bias_dt) : 0;
    const uint8_t *w = a->w;
    cdf_status st = CDF_OK;
    for (int64_t n0 = 0; n0 < a->N && st == CDF_OK; n0 += panel) {
        const int64_t np = a->N - n0 < panel ? a->N - n0 : panel;
        int bad = 0;
#pragma omp parallel reduction(| : bad) if (np * a->K > 65536)
        {
            /* bf16 panels: each row decodes into this thread's f32 row, then narrows into the panel */
            float *tmp = a->w_dt == CDF_BF16 ? malloc(sizeof(float) * (size_t)a->K) : NULL;
            if (a->w_dt == CDF_BF16 && !tmp) bad = 2;
#pragma omp for schedule(static)
            for (int64_t r = 0; r < np; r++) {
                if (bad) continue;
                float *row = tmp ? tmp : (float *)buf + r * a->K;
                if (cdf_ggml_dequantize(a->qtype, w + (n0 + r) * row_bytes, a->K, row) != CDF_OK) bad = 1;
                else if (tmp) cdf_k_store_row(buf, CDF_BF16, r * a->K, row, a->K);
            }
            free(tmp);
        }
        if (bad & 2) {
            st = cdf_error(CDF_ERR_OUT_OF_MEMORY, "%s: cannot allocate a decode row of %lld values", fn, (long long)a->K);
            break;
        }
        if (bad) {
            st = cdf_error(CDF_ERR_INTERNAL, "%s: decoding %s rows %lld..%lld failed", fn, cdf_ggml_type_name(a->qtype),
                           (long long)n0, (long long)(n0 + np));
            break;
        }
        const void *b = buf;
        cdf_k_matmul_args m = {
            .batch = 1, .M = a->M, .N = np, .K = a->K,
            .a = a->a, .a_dt = a->a_dt, .lda = a->K, .sa = 0, .trans_a = false,
            .b = b, .b_dt = a->w_dt, .ldb = a->K, .sb = 0, .trans_b = true,
            .bias = a->bias ? (const char *)a->bias + (size_t)n0 * bsz : NULL, .bias_dt = a->bias_dt,
            .c = (char *)a->c + (size_t)n0 * csz, .c_dt = a->c_dt, .ldc = a->N, .sc = 0,
            .alpha = 1.0f, .beta = 0.0f, .b_transient = true,
        };
        st = cdf_k_matmul_dispatch(&m);
        /* the next panel reuses this buffer: b_transient keeps the matmuls from prepacking it;
         * should a copy exist anyway, it must not survive */
        cdf_k_pack_forget_range(b, (size_t)(np * a->K) * wsz);
    }
    panel_give(buf, panel_bytes);
    return st;
}
