/* The CUDA backend's kernels behind a plain C interface (implemented in cuda_kernels.cu).
 *
 * Each launcher enqueues one kernel on `stream` (a cudaStream_t passed as void *, so this header
 * needs no CUDA headers) and returns the launch status as an int (cudaError_t; 0 = success).
 * Pointers are device addresses. Semantics, dtypes and layouts are those of the reference
 * kernel of the same name in kernels/kernels.h, which the op suite compares against; arithmetic
 * is f32 with f32 accumulation as there (cdf_cu_reduce's sums: double), the reduction order
 * differs, so results agree within the reference tolerances, not bit for bit. Launchers with no
 * work return 0 without launching. */
#ifndef CDF_BACKEND_CUDA_KERNELS_H
#define CDF_BACKEND_CUDA_KERNELS_H

#include "kernels/dequant_blocks.h"
#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A device-side error word in device memory: kernels that find bad data (an embedding id out of
 * range) set code/value with an atomic instead of reading out of bounds; the backend reads it
 * when it synchronises. */
typedef struct cdf_cu_error_word {
    int code;      /* 0 = none, CDF_CU_ERR_* */
    long long value;
} cdf_cu_error_word;
#define CDF_CU_ERR_EMBEDDING_ID 1

int cdf_cu_copy_strided(void *stream, void *dst, cdf_dtype dst_dt, const int64_t *dst_strides, const void *src,
                        cdf_dtype src_dt, const int64_t *src_strides, int ndim, const int64_t *shape);
/* dst (with strides) = value. */
int cdf_cu_fill(void *stream, void *dst, cdf_dtype dt, const int64_t *strides, int ndim, const int64_t *shape,
                double value);
int cdf_cu_embedding(void *stream, void *out, cdf_dtype out_dt, const void *table, cdf_dtype table_dt, int64_t rows,
                     int64_t dim, const void *ids, cdf_dtype ids_dt, int64_t n, cdf_cu_error_word *err);
int cdf_cu_unary(void *stream, cdf_unary_op op, float p0, float p1, void *out, cdf_dtype out_dt, const void *in,
                 cdf_dtype in_dt, int64_t n);
/* The fused elementwise program (binary ops are one-step programs). */
int cdf_cu_fused(void *stream, const cdf_fused_program *p, void *out, cdf_dtype out_dt, int n_in,
                 const void *const *in, const cdf_dtype *in_dt, const int64_t *const *in_strides, int ndim,
                 const int64_t *shape);
int cdf_cu_softmax(void *stream, void *out, cdf_dtype out_dt, const void *in, cdf_dtype in_dt, int64_t rows,
                   int64_t cols, float scale);
int cdf_cu_layer_norm(void *stream, void *out, cdf_dtype out_dt, const void *in, cdf_dtype in_dt, int64_t rows,
                      int64_t cols, float eps, const void *weight, const void *bias, cdf_dtype wdt);
int cdf_cu_rms_norm(void *stream, void *out, cdf_dtype out_dt, const void *in, cdf_dtype in_dt, int64_t rows,
                    int64_t cols, float eps, const void *weight, cdf_dtype wdt);
int cdf_cu_group_norm(void *stream, void *out, cdf_dtype out_dt, const void *in, cdf_dtype in_dt, int64_t n,
                      int64_t c, int64_t s, int64_t groups, float eps, const void *weight, const void *bias,
                      cdf_dtype wdt);
int cdf_cu_reduce(void *stream, cdf_reduce_op op, void *out, cdf_dtype out_dt, const void *in, cdf_dtype in_dt,
                  int64_t outer, int64_t red, int64_t inner);
int cdf_cu_conv2d(void *stream, const cdf_k_conv2d_args *a);
int cdf_cu_upsample_nearest(void *stream, void *out, cdf_dtype out_dt, const void *in, cdf_dtype in_dt, int64_t nc,
                            int64_t h, int64_t w, int64_t fh, int64_t fw);
/* Head dims up to CDF_CU_ATTN_MAX_D (larger ones: supports() refuses the node). */
#define CDF_CU_ATTN_MAX_D 512
int cdf_cu_attention(void *stream, const cdf_k_attention_args *a);
int cdf_cu_rope(void *stream, void *out, cdf_dtype out_dt, const void *x, cdf_dtype x_dt, const float *cos_t,
                const float *sin_t, int64_t b, int64_t h, int64_t l, int64_t d);
int cdf_cu_timestep_embedding(void *stream, float *out, const float *t, int64_t n, int64_t dim, bool flip_sin_to_cos,
                              float downscale_freq_shift, float scale, float max_period);
int cdf_cu_rope_table(void *stream, float *out, const float *pos, int64_t rows, int n_axes, const int64_t *axes_dim,
                      double theta);
/* The matmul's bias when cuBLASLt's epilogue does not add it: c [rows, n] with row stride ldc,
 * c[r, j] = p[r, j] + bias[j] in f32, rounded once to c_dt, where p is src (a contiguous f32
 * [rows, n] product: a 16-bit c gets the one rounding of the reference kernel) or, when src is
 * NULL, c itself. */
int cdf_cu_bias_add(void *stream, void *c, cdf_dtype c_dt, int64_t ldc, const float *src, const void *bias,
                    cdf_dtype bias_dt, int64_t rows, int64_t n);
/* The GGUF blocks [n_blocks] of type decoded into out as store says (kernels/dequant_blocks.h:
 * the CPU decoder's per-block code, bit for bit): the weight panel of a quantized matmul.
 * cudaErrorInvalidValue for a type it does not decode. */
int cdf_cu_dequant_panel(void *stream, uint32_t type, const void *blocks, int64_t n_blocks, void *out,
                         cdf_dq_store store);

#ifdef __cplusplus
}
#endif
#endif
