/* cdiffusers — the tensor API.
 *
 * A cdf_tensor is a handle: shape, strides, dtype, device and a reference to storage. Views
 * (reshape where possible, permute, transpose, narrow/slice, expand, unsqueeze) share storage.
 * Every op checks its arguments and infers the output shape at the call (errors are reported
 * there, never later), then hands the op to the execution layer, which runs it according to the
 * context's mode (eager: enqueued on the device's in-order queue at once).
 *
 * Ownership: creating functions return a new reference. cdf_tensor_release() drops it.
 * To keep model code readable, tensors can be collected by scopes: between cdf_scope_push() and
 * cdf_scope_pop(keep, n) every new tensor handle created on this thread is recorded, and pop
 * releases all of them except those in keep[] (which move to the enclosing scope).
 *
 * Errors: an op returns NULL and sets cdf_last_error(). Ops accept NULL inputs and then return
 * NULL without touching the error, so a chain of ops can be checked once at the end. */
#ifndef CDIFFUSERS_TENSOR_H
#define CDIFFUSERS_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cdiffusers/device.h"
#include "cdiffusers/dtype.h"
#include "cdiffusers/error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CDF_MAX_DIMS 8

typedef struct cdf_tensor cdf_tensor;

/* ---- creation / lifetime --------------------------------------------------------------- */
cdf_tensor *cdf_tensor_empty(cdf_device *dev, cdf_dtype dt, int ndim, const int64_t *shape);
/* Copies n = numel elements from host memory `data` of dtype `src_dt` (converted to dt). */
cdf_tensor *cdf_tensor_from_host(cdf_device *dev, cdf_dtype dt, int ndim, const int64_t *shape, const void *data,
                                 cdf_dtype src_dt);
cdf_tensor *cdf_tensor_full(cdf_device *dev, cdf_dtype dt, int ndim, const int64_t *shape, double value);
cdf_tensor *cdf_tensor_zeros(cdf_device *dev, cdf_dtype dt, int ndim, const int64_t *shape);
/* Wrap external memory without copying (e.g. an mmap'ed weight). `owner_release(owner)` is
 * called when the last reference goes (may be NULL). The memory is not accounted to the device. */
cdf_tensor *cdf_tensor_wrap(cdf_device *dev, cdf_dtype dt, int ndim, const int64_t *shape, void *data,
                            void (*owner_release)(void *), void *owner);
cdf_tensor *cdf_tensor_retain(cdf_tensor *t);
void cdf_tensor_release(cdf_tensor *t);

void cdf_scope_push(void);
void cdf_scope_pop(cdf_tensor *const *keep, int n_keep);

/* ---- introspection --------------------------------------------------------------------- */
int cdf_tensor_ndim(const cdf_tensor *t);
const int64_t *cdf_tensor_shape(const cdf_tensor *t);
const int64_t *cdf_tensor_strides(const cdf_tensor *t);
/* dim may be negative (counted from the end). */
int64_t cdf_tensor_dim(const cdf_tensor *t, int dim);
int64_t cdf_tensor_numel(const cdf_tensor *t);
cdf_dtype cdf_tensor_dtype(const cdf_tensor *t);
cdf_device *cdf_tensor_device(const cdf_tensor *t);
bool cdf_tensor_is_contiguous(const cdf_tensor *t);
/* "[1, 64, 3072] bf16" into buf. */
const char *cdf_tensor_describe(const cdf_tensor *t, char *buf, size_t n);

/* ---- host access (sync points) ----------------------------------------------------------- */
/* Wait for t, then copy it (any strides) into dst as contiguous elements of dtype `as`.
 * dst_bytes must be >= numel * size(as). Returns a queued kernel's error if one failed. */
cdf_status cdf_tensor_read(const cdf_tensor *t, cdf_dtype as, void *dst, size_t dst_bytes);
/* Convenience: a malloc'ed f32 copy (NULL on error); the caller frees it. */
float *cdf_tensor_read_f32(const cdf_tensor *t);
/* Read one element as double (for scalars). */
cdf_status cdf_tensor_item(const cdf_tensor *t, double *out);

/* ---- views (no copy) --------------------------------------------------------------------- */
/* reshape: one dim may be -1; a copy is made only when the strides do not allow a view. */
cdf_tensor *cdf_reshape(cdf_tensor *t, int ndim, const int64_t *shape);
cdf_tensor *cdf_permute(cdf_tensor *t, const int *dims);
cdf_tensor *cdf_transpose(cdf_tensor *t, int d0, int d1);
cdf_tensor *cdf_narrow(cdf_tensor *t, int dim, int64_t start, int64_t length);
cdf_tensor *cdf_slice(cdf_tensor *t, int dim, int64_t start, int64_t end, int64_t step);
/* expand: -1 keeps a dim; new leading dims may be added; only size-1 dims expand (stride 0). */
cdf_tensor *cdf_expand(cdf_tensor *t, int ndim, const int64_t *shape);
cdf_tensor *cdf_unsqueeze(cdf_tensor *t, int dim);
cdf_tensor *cdf_squeeze(cdf_tensor *t, int dim);
/* Split `dim` into n equal chunks (views); out[] gets n new references. */
cdf_status cdf_chunk(cdf_tensor *t, int n, int dim, cdf_tensor **out);

/* ---- copies and casts ------------------------------------------------------------------ */
cdf_tensor *cdf_contiguous(cdf_tensor *t); /* new reference to t itself if already contiguous */
cdf_tensor *cdf_cast(cdf_tensor *t, cdf_dtype dt); /* round-to-nearest-even for float narrowing */
cdf_tensor *cdf_cat(cdf_tensor *const *ts, int n, int dim);
/* Constant pad of the last n_pairs dims (torch.nn.functional.pad order: last dim first). */
cdf_tensor *cdf_pad(cdf_tensor *t, int n_pairs, const int64_t *pads, double value);
/* out[..., :] = table[ids[...], :]; ids i64/i32; out dtype = table dtype. */
cdf_tensor *cdf_embedding(cdf_tensor *table, cdf_tensor *ids);

/* ---- elementwise (broadcasting like torch; output dtype = promoted float dtype) ---------- */
cdf_tensor *cdf_add(cdf_tensor *a, cdf_tensor *b);
cdf_tensor *cdf_sub(cdf_tensor *a, cdf_tensor *b);
cdf_tensor *cdf_mul(cdf_tensor *a, cdf_tensor *b);
cdf_tensor *cdf_div(cdf_tensor *a, cdf_tensor *b);
cdf_tensor *cdf_maximum(cdf_tensor *a, cdf_tensor *b);
cdf_tensor *cdf_scale(cdf_tensor *a, float s);
cdf_tensor *cdf_add_scalar(cdf_tensor *a, float s);
cdf_tensor *cdf_affine(cdf_tensor *a, float mul, float add); /* a * mul + add */
cdf_tensor *cdf_clamp(cdf_tensor *a, float lo, float hi);
cdf_tensor *cdf_neg(cdf_tensor *a);
cdf_tensor *cdf_exp(cdf_tensor *a);
cdf_tensor *cdf_log(cdf_tensor *a);
cdf_tensor *cdf_sqrt(cdf_tensor *a);
cdf_tensor *cdf_rsqrt(cdf_tensor *a);
cdf_tensor *cdf_sigmoid(cdf_tensor *a);
cdf_tensor *cdf_tanh(cdf_tensor *a);
cdf_tensor *cdf_silu(cdf_tensor *a);
cdf_tensor *cdf_relu(cdf_tensor *a);
typedef enum cdf_gelu_approx { CDF_GELU_ERF = 0, CDF_GELU_TANH = 1 } cdf_gelu_approx;
cdf_tensor *cdf_gelu(cdf_tensor *a, cdf_gelu_approx approx);
cdf_tensor *cdf_quick_gelu(cdf_tensor *a);

/* ---- linear algebra -------------------------------------------------------------------- */
/* Batched matmul with broadcasting of leading dims: [..., M, K] @ [..., K, N]. */
cdf_tensor *cdf_matmul(cdf_tensor *a, cdf_tensor *b);
/* x [..., in] @ w[out, in]^T + b[out] (b may be NULL). */
cdf_tensor *cdf_linear(cdf_tensor *x, cdf_tensor *w, cdf_tensor *b);
/* The same with a GGUF-quantized weight: wq is U8 [out, row bytes] holding each output row's
 * blocks of ggml type qtype (cdiffusers/io.h), `in` the input features (a multiple of the type's
 * block size). The weights are decoded as gguf-py does and rounded to wdt (CDF_F32 or CDF_BF16,
 * the load policy's weight dtype) inside the kernel; only the blocks stay in memory. */
cdf_tensor *cdf_linear_quantized(cdf_tensor *x, cdf_tensor *wq, uint32_t qtype, int64_t in, cdf_dtype wdt, cdf_tensor *b);
/* Both with the product in out_dt (a float dtype) whatever x's dtype: e.g. a bf16 x (rounded once
 * for several layers, nn.h: cdf_linear_shared_input) multiplied into an f32 product. Without
 * _as the product takes x's dtype where x and the weights share it, else f32. */
cdf_tensor *cdf_linear_as(cdf_tensor *x, cdf_tensor *w, cdf_tensor *b, cdf_dtype out_dt);
cdf_tensor *cdf_linear_quantized_as(cdf_tensor *x, cdf_tensor *wq, uint32_t qtype, int64_t in, cdf_dtype wdt, cdf_tensor *b,
                                    cdf_dtype out_dt);

/* ---- normalisation / reductions -------------------------------------------------------- */
cdf_tensor *cdf_softmax(cdf_tensor *x, int dim);
/* Over the last dim; weight/bias may be NULL. */
cdf_tensor *cdf_layer_norm(cdf_tensor *x, cdf_tensor *weight, cdf_tensor *bias, float eps);
cdf_tensor *cdf_rms_norm(cdf_tensor *x, cdf_tensor *weight, float eps);
/* The same with the result stored as dt (a float dtype; computed in f32, rounded once at the
 * store): SD3's q/k norms write attention's inputs in the dtype it computes in (cdf_rope_as). */
cdf_tensor *cdf_rms_norm_as(cdf_tensor *x, cdf_tensor *weight, float eps, cdf_dtype dt);
/* x [N, C, ...]; weight/bias [C] or NULL. */
cdf_tensor *cdf_group_norm(cdf_tensor *x, int groups, cdf_tensor *weight, cdf_tensor *bias, float eps);
cdf_tensor *cdf_sum(cdf_tensor *x, int dim, bool keepdim);
cdf_tensor *cdf_mean(cdf_tensor *x, int dim, bool keepdim);
cdf_tensor *cdf_var(cdf_tensor *x, int dim, bool keepdim); /* biased (unbiased=False) */
cdf_tensor *cdf_max(cdf_tensor *x, int dim, bool keepdim);
/* torch.argmax: i64 index of the first maximum along dim (any numeric dtype, compared exactly). */
cdf_tensor *cdf_argmax(cdf_tensor *x, int dim, bool keepdim);

/* ---- convolution / resampling ----------------------------------------------------------- */
typedef struct cdf_conv2d_params {
    int stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups;
} cdf_conv2d_params;
cdf_conv2d_params cdf_conv2d_params_default(void); /* stride 1, pad 0, dilation 1, groups 1 */
/* x [N, Cin, H, W], w [Cout, Cin/groups, KH, KW], b [Cout] or NULL. */
cdf_tensor *cdf_conv2d(cdf_tensor *x, cdf_tensor *w, cdf_tensor *b, const cdf_conv2d_params *p);
/* Nearest-neighbour upsample of the last two dims by integer factors. */
cdf_tensor *cdf_upsample_nearest(cdf_tensor *x, int fh, int fw);

/* ---- attention / positional ---------------------------------------------------------------- */
/* q [B, H, Lq, D], k [B, H, Lk, D], v [B, H, Lk, Dv]; mask NULL or additive, broadcastable to
 * [B, H, Lq, Lk]; scale <= 0 means 1/sqrt(D). Never materialises the full score matrix. */
cdf_tensor *cdf_sdpa(cdf_tensor *q, cdf_tensor *k, cdf_tensor *v, cdf_tensor *mask, float scale);
/* x [B, H, L, D]; cos/sin [L, D] f32 (diffusers Flux layout, interleaved pairs). */
cdf_tensor *cdf_rope(cdf_tensor *x, cdf_tensor *cos_t, cdf_tensor *sin_t);
/* The same with the result stored as dt (a float dtype; computed in f32 either way, rounded once
 * at the store): lets the op that writes attention's q and k write them in the dtype the attention
 * computes in (bf16 under the bf16 policy) without another pass. */
cdf_tensor *cdf_rope_as(cdf_tensor *x, cdf_tensor *cos_t, cdf_tensor *sin_t, cdf_dtype dt);
/* RoPE tables from positions pos [L, n_axes] (any numeric dtype, used as float32 like
 * ids.float()): per axis diffusers' get_1d_rotary_pos_embed(theta, repeat_interleave_real,
 * float64 angles), concatenated; returns cos and sin [L, sum(axes_dim)] f32 (views of one
 * buffer). Computed on the device: no host read of the positions. */
cdf_status cdf_rope_tables(cdf_tensor *pos, int n_axes, const int64_t *axes_dim, double theta, cdf_tensor **cos_out,
                           cdf_tensor **sin_out);
/* diffusers get_timestep_embedding: t [N] -> [N, dim] f32. */
cdf_tensor *cdf_timestep_embedding(cdf_tensor *t, int dim, bool flip_sin_to_cos, float downscale_freq_shift,
                                   float scale, float max_period);

#ifdef __cplusplus
}
#endif
#endif
