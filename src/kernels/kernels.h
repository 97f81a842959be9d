/* kernels/ — the compute layer. Kernels see raw buffers, dtypes, shapes and strides, nothing
 * above them (no tensors, no devices, no queues). The tensor API has already checked every
 * argument, so kernels only assert internal invariants and report impossible states with a
 * cdf_status (never abort).
 *
 * Conventions
 *  - Element counts and strides are in elements (not bytes), int64_t.
 *  - "dt" arguments: CDF_F32, CDF_BF16 or CDF_F16 for float operands (others only where said).
 *    Storage may be bf16/f16; arithmetic is always f32 with f32 accumulation (matmul, reductions,
 *    softmax, norms), rounding once on store (round-to-nearest-even).
 *  - Unless a parameter list has explicit strides, operands are C-contiguous.
 *  - Kernels may use OpenMP internally (they run on the device queue's worker thread).
 *  - These are the *reference* kernels: plain, obviously correct C. Fast paths (AVX-512, AMX,
 *    oneDNN) live beside them and are tested against them (tests/test_kernels*.c). */
#ifndef CDF_KERNELS_H
#define CDF_KERNELS_H

#include <stdbool.h>
#include <stdint.h>

#include "cdiffusers/dtype.h"
#include "cdiffusers/error.h"
#include "core/op_defs.h"


/* Load/store one element as f32. */
static inline float cdf_k_ld(const void *p, cdf_dtype dt, int64_t i) {
    switch (dt) {
    case CDF_F32: return ((const float *)p)[i];
    case CDF_BF16: return cdf_bf16_to_f32(((const uint16_t *)p)[i]);
    case CDF_F16: return cdf_f16_to_f32(((const uint16_t *)p)[i]);
    case CDF_F64: return (float)((const double *)p)[i];
    case CDF_I64: return (float)((const int64_t *)p)[i];
    case CDF_I32: return (float)((const int32_t *)p)[i];
    default: return 0.0f;
    }
}
static inline void cdf_k_st(void *p, cdf_dtype dt, int64_t i, float v) {
    switch (dt) {
    case CDF_F32: ((float *)p)[i] = v; break;
    case CDF_BF16: ((uint16_t *)p)[i] = cdf_f32_to_bf16(v); break;
    case CDF_F16: ((uint16_t *)p)[i] = cdf_f32_to_f16(v); break;
    case CDF_F64: ((double *)p)[i] = v; break;
    case CDF_I64: ((int64_t *)p)[i] = (int64_t)v; break;
    case CDF_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    default: break;
    }
}

/* ---- data movement -------------------------------------------------------------------- */

/* dst[idx] = cast(src[idx]) for every multi-index idx of `shape` (ndim <= CDF_MAX_DIMS), with
 * arbitrary element strides on both sides (0 = broadcast on src). Any dtype pair; integer <->
 * integer copies are exact, float -> int truncates toward zero. ndim 0 = one element. */
cdf_status cdf_k_copy_strided(void *dst, cdf_dtype dst_dt, const int64_t *dst_strides, const void *src,
                              cdf_dtype src_dt, const int64_t *src_strides, int ndim, const int64_t *shape);

/* dst[0..n) = value (cast to dt). */
cdf_status cdf_k_fill(void *dst, cdf_dtype dt, int64_t n, double value);

/* out[i, :] = table[ids[i], :] for i < n; ids are CDF_I64 or CDF_I32; an id outside
 * [0, rows) is an error (CDF_ERR_INVALID_ARG naming the id), not a read out of bounds. */
cdf_status cdf_k_embedding(void *out, cdf_dtype out_dt, const void *table, cdf_dtype table_dt, int64_t rows,
                           int64_t dim, const void *ids, cdf_dtype ids_dt, int64_t n);

/* ---- elementwise ------------------------------------------------------------------------ */


/* out[i] = op(in[i]) for n contiguous elements; p0/p1 are the op's scalar parameters. */
cdf_status cdf_k_unary(cdf_unary_op op, float p0, float p1, void *out, cdf_dtype out_dt, const void *in,
                       cdf_dtype in_dt, int64_t n);


/* out[idx] = a[idx] op b[idx] over `shape`; out is contiguous; a/b have element strides
 * (stride 0 on a dim = broadcast). */
cdf_status cdf_k_binary(cdf_binary_op op, void *out, cdf_dtype out_dt, const void *a, cdf_dtype a_dt,
                        const int64_t *a_strides, const void *b, cdf_dtype b_dt, const int64_t *b_strides,
                        int ndim, const int64_t *shape);

/* ---- fused elementwise chains (defer-and-fuse, compile) ----------------------------------- */


/* out[idx] = program(in[0][idx], in[1][idx], ...) over `shape`, out contiguous, each input with
 * its own element strides (0 = broadcast). Intermediate values stay in f32 registers, which is
 * bit-identical to the unfused ops when their intermediate tensors are f32. */
cdf_status cdf_k_fused_elementwise(const cdf_fused_program *p, void *out, cdf_dtype out_dt, int n_in,
                                   const void *const *in, const cdf_dtype *in_dt, const int64_t *const *in_strides,
                                   int ndim, const int64_t *shape);

/* The same program as a matmul epilogue (graph/fuse.c folds the elementwise chain that follows a
 * matmul into it): out is the matmul's C (batch x [M, N], contiguous), in[0] is C itself (read
 * back in place, row by row as the matmul finishes them; in_strides[0] is set by the check),
 * in[1..n_in) the chain's other operands with their strides over `shape` (0 = broadcast, e.g. a
 * gate [B, 1, N]), the shape the chain ran over: C's elements in the same order (batch*M*N of
 * them, e.g. [B*L, N] as [B, L, N]). Check once before the matmul; cdf_k_fused_epilogue_rows is
 * cdf_k_matmul_args.epilogue with ctx = the struct (it opens no OpenMP region: it runs on the
 * matmul's threads). */
typedef struct cdf_k_fused_epilogue {
    const cdf_fused_program *p;
    void *out; cdf_dtype out_dt;
    int n_in;
    const void *in[CDF_FUSE_MAX_INPUTS];
    cdf_dtype in_dt[CDF_FUSE_MAX_INPUTS];
    const int64_t *in_strides[CDF_FUSE_MAX_INPUTS];
    int ndim;
    const int64_t *shape;
    int64_t batch, M, N;
    int64_t c_strides[CDF_MAX_DIMS]; /* in_strides[0]: filled by the check */
} cdf_k_fused_epilogue;
cdf_status cdf_k_fused_epilogue_check(cdf_k_fused_epilogue *e);
void cdf_k_fused_epilogue_rows(void *ctx, int64_t bi, int64_t row0, int64_t row1);

/* ---- matmul ---------------------------------------------------------------------------- */

/* For each batch index i < batch:
 *   C_i[M,N] = alpha * op(A_i)[M,K] @ op(B_i)[K,N] (+ bias[N]) (+ beta * C_i)
 * op(X) = X or X^T per trans flag. Row-major with leading dimensions lda/ldb/ldc (elements);
 * batch strides sa/sb/sc (0 = the same matrix for every batch, e.g. weights).
 * A: trans_a ? [K,M] : [M,K]; B: trans_b ? [N,K] : [K,N]. Linear layers use trans_b=true
 * with B = weight [out, in]. bias may be NULL. beta is 0 or 1 (accumulate into C). */
typedef struct cdf_k_matmul_args {
    int64_t batch, M, N, K;
    const void *a; cdf_dtype a_dt; int64_t lda, sa; bool trans_a;
    const void *b; cdf_dtype b_dt; int64_t ldb, sb; bool trans_b;
    const void *bias; cdf_dtype bias_dt;
    void *c; cdf_dtype c_dt; int64_t ldc, sc;
    float alpha, beta;
    /* B's memory is overwritten right after the call (a panel of decoded quantized weights): no
     * prepacked copy of it is kept (it would be packed, checksummed and dropped per call). */
    bool b_transient;
    /* Optional: called once the rows [row0, row1) of batch item `bi` of C are final (from the thread that computed them; disjoint row ranges may run concurrently). NULL = none. */
    void (*epilogue)(void *ctx, int64_t bi, int64_t row0, int64_t row1);
    void *epilogue_ctx;
} cdf_k_matmul_args;
cdf_status cdf_k_matmul(const cdf_k_matmul_args *args);

/* ---- matmul on GGUF-quantized weights --------------------------------------------------- */

/* C[M,N] = A[M,K] @ W^T (+ bias[N]) where W [N,K] is stored as ggml blocks of type qtype, row by
 * row (K a multiple of the block size; each row K / block_elems blocks). The weights are decoded
 * panel by panel exactly as cdf_ggml_dequantize does (gguf-py's numbers), rounded to w_dt (F32 or
 * BF16), and multiplied by cdf_k_matmul_dispatch: the result is what the same decoded weights
 * loaded as w_dt give, while only one panel of them exists unpacked at a time. A, C contiguous.
 * Except Q8_0 to BF16 at 128 <= M < 1024 on AVX512-BF16 CPUs without AMX, and at M >= 128 with
 * AMX (GCC builds): an own GEMM on the same values, summing in another order
 * (cdf_k_matmul_q_set_own_gemm); there the same weights loaded as bf16 run the own bf16 GEMM
 * (kernels/gemm_vdpbf16.h) while the panels keep oneDNN: equal within f32 summation, not bit for
 * bit (CDIFFUSERS_BF16_GEMM=0); with AMX both run the same AMX kernel: the bf16 weights' result
 * bit for bit; and, only when turned on (cdf_k_matmul_q_set_int8), Q8_0 to BF16 on int8-quantized A. */
typedef struct cdf_k_matmul_q_args {
    int64_t M, N, K;
    const void *a; cdf_dtype a_dt;
    const void *w; uint32_t qtype; cdf_dtype w_dt;
    const void *bias; cdf_dtype bias_dt;
    void *c; cdf_dtype c_dt;
} cdf_k_matmul_q_args;
cdf_status cdf_k_matmul_q(const cdf_k_matmul_q_args *args);
/* The decode panel's bound in bytes (default 128 MiB: every layer of FLUX.1 and SD3 in one bf16
 * panel); tests lower it to reach the multi-panel path on small layers. 0 restores the default.
 * Not synchronised: set it while no quantized matmul runs. */
void cdf_k_matmul_q_set_panel_bytes(size_t bytes);
/* The own AVX512-BF16 GEMM on Q8_0 weights (matmul_quant.c: each thread decodes a column slab of
 * the weights into its packed layout, no decoded copy of the layer): 1 where it applies (the
 * default; CDIFFUSERS_Q8_GEMM=0 turns it off), 2 wherever it can run (outside the M range where
 * it is ahead too: for benchmarks), 0 off (decode panels + the matmul dispatch, bit for bit the
 * dequantized file's matmul), -1 back to the environment's choice. Not synchronised. */
void cdf_k_matmul_q_set_own_gemm(int on);
/* The int8 AVX512-VNNI GEMM on Q8_0 weights under the bf16 policy (matmul_quant.c: A quantized
 * per row and 32-value block to int8 as ggml's q8_0 x q8_0 does, int32 block sums: not the
 * dequantized weights' numbers, see there for the bound; AVX512-VNNI without AMX, GCC builds):
 * 1 or 2 on wherever it can run, 0 off (the default; then cdf_k_matmul_q_set_own_gemm decides),
 * -1 back to the environment's choice (CDIFFUSERS_Q8_INT8=1 turns it on). Not synchronised. */
void cdf_k_matmul_q_set_int8(int on);
/* How many calls the int8 GEMM ran (process-wide, not synchronised): tests check which path ran. */
uint64_t cdf_k_matmul_q_int8_calls(void);

/* ---- normalisation / softmax / reductions -------------------------------------------- */

/* Row-wise over [rows, cols] contiguous: out = softmax(in * scale) along cols (max-subtracted). */
cdf_status cdf_k_softmax(void *out, cdf_dtype out_dt, const void *in, cdf_dtype in_dt, int64_t rows, int64_t cols,
                         float scale);

/* Row-wise LayerNorm: y = (x - mean) / sqrt(var + eps) [* w + b], biased variance (as torch).
 * weight/bias may be NULL (elementwise_affine=False). */
cdf_status cdf_k_layer_norm(void *out, cdf_dtype out_dt, const void *in, cdf_dtype in_dt, int64_t rows,
                            int64_t cols, float eps, const void *weight, const void *bias, cdf_dtype wdt);

/* Row-wise RMSNorm: y = x * rsqrt(mean(x^2) + eps) [* w]. weight may be NULL. */
cdf_status cdf_k_rms_norm(void *out, cdf_dtype out_dt, const void *in, cdf_dtype in_dt, int64_t rows,
                          int64_t cols, float eps, const void *weight, cdf_dtype wdt);

/* GroupNorm over x [N, C, S] (S = H*W): per (n, group) mean/var over C/groups * S elements,
 * y = (x - mean)/sqrt(var + eps) * w[c] + b[c]; weight/bias may be NULL. */
cdf_status cdf_k_group_norm(void *out, cdf_dtype out_dt, const void *in, cdf_dtype in_dt, int64_t n, int64_t c,
                            int64_t s, int64_t groups, float eps, const void *weight, const void *bias,
                            cdf_dtype wdt);

/* out[o, i] = reduce_{r < red} in[o, r, i] over a contiguous [outer, red, inner] view (f32 accum). */
cdf_status cdf_k_reduce(cdf_reduce_op op, void *out, cdf_dtype out_dt, const void *in, cdf_dtype in_dt,
                        int64_t outer, int64_t red, int64_t inner);

/* ---- convolution / resampling --------------------------------------------------------- */

/* conv2d NCHW: x [N, Cin, H, W], w [Cout, Cin/groups, KH, KW], bias [Cout] or NULL,
 * out [N, Cout, OH, OW] with OH = (H + 2*pad_h - dil_h*(KH-1) - 1)/stride_h + 1 (likewise OW). */
typedef struct cdf_k_conv2d_args {
    int64_t n, cin, h, w, cout, kh, kw, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups;
    const void *x; cdf_dtype x_dt;
    const void *weight; cdf_dtype w_dt;
    const void *bias; cdf_dtype b_dt;
    void *out; cdf_dtype out_dt;
} cdf_k_conv2d_args;
cdf_status cdf_k_conv2d(const cdf_k_conv2d_args *args);

/* Nearest-neighbour upsample by integer factors: in [N*C, H, W] -> out [N*C, H*fh, W*fw]. */
cdf_status cdf_k_upsample_nearest(void *out, cdf_dtype out_dt, const void *in, cdf_dtype in_dt, int64_t nc,
                                  int64_t h, int64_t w, int64_t fh, int64_t fw);

/* ---- attention / positional ----------------------------------------------------------- */

/* Scaled dot-product attention, q [B, H, Lq, D], k [B, H, Lk, D], v [B, H, Lk, Dv] with element
 * strides for (b, h, l) given per tensor (last dim contiguous), out [B, H, Lq, Dv] contiguous.
 *   out = softmax(q k^T * scale + mask) v
 * mask: optional additive f32/bf16 mask with strides (mb, mh, mq, mk) (0 = broadcast);
 * -INFINITY entries are allowed; a fully masked row yields zeros. Tiled over Lk with an online
 * softmax so at most one tile of scores per thread exists at any time.
 * Compute policy (dispatch.h), by the operands' dtypes:
 *   q, k and v all bf16: S = q k^T from the bf16 values (their products are exact in f32) with f32
 *     sums, times scale in f32, + mask; the online softmax in f32, the row sum l from the f32
 *     weights P; P rounded to bf16 (round-to-nearest-even) before O += P V (exact products, f32
 *     sums); out = O / l. That is PyTorch's CPU flash attention for bf16 inputs, and what lets
 *     the kernels multiply in bf16 (vdpbf16ps), with one refinement: P = 2^(S log2(e) - M) for
 *     M the running row max in log2 units rounded UP TO AN INTEGER. Rescaling by powers of two
 *     commutes with rounding to bf16, so the rounded weights are the same whatever the key
 *     tiling (with the exact running max they would depend on where the tiles start, and ISA
 *     levels with different tiles would differ by ~2^-9 of the weights, not by summation order).
 *   otherwise: everything in f32 (bf16/f16 operands widened exactly, P in f32).
 * Every ISA level computes the same; they differ in summation order (and exp approximations). */
typedef struct cdf_k_attention_args {
    int64_t b, h, lq, lk, d, dv;
    const void *q; cdf_dtype q_dt; int64_t q_sb, q_sh, q_sl;
    const void *k; cdf_dtype k_dt; int64_t k_sb, k_sh, k_sl;
    const void *v; cdf_dtype v_dt; int64_t v_sb, v_sh, v_sl;
    const void *mask; cdf_dtype mask_dt; int64_t m_sb, m_sh, m_sq, m_sk;
    void *out; cdf_dtype out_dt;
    float scale;
} cdf_k_attention_args;
cdf_status cdf_k_attention(const cdf_k_attention_args *args);
/* true when the bf16 attention policy above applies (q, k and v all bf16) */
static inline bool cdf_k_attention_bf16_policy(const cdf_k_attention_args *a) {
    return a->q_dt == CDF_BF16 && a->k_dt == CDF_BF16 && a->v_dt == CDF_BF16;
}

/* Rotary embedding, diffusers' Flux layout (use_real, repeat_interleave_real=True):
 * x [B, H, L, D] contiguous, cos/sin [L, D] f32 (each frequency repeated twice).
 * For each pair (x[2i], x[2i+1]): out[2i] = x[2i]*cos[2i] - x[2i+1]*sin[2i],
 *                                 out[2i+1] = x[2i+1]*cos[2i+1] + x[2i]*sin[2i+1].
 * Computed in f32 as diffusers does (x.float()). */
cdf_status cdf_k_rope(void *out, cdf_dtype out_dt, const void *x, cdf_dtype x_dt, const float *cos_t,
                      const float *sin_t, int64_t b, int64_t h, int64_t l, int64_t d);

/* RoPE tables from positions, as diffusers' get_1d_rotary_pos_embed(use_real=True,
 * repeat_interleave_real=True, freqs_dtype=float64) per axis, concatenated over axes:
 * pos [rows, n_axes] f32; out [2, rows, width] f32 = (cos, sin), width = sum(axes_dim);
 * freq_k = 1 / theta^(2k/dim) and angle = pos * freq_k in float64, cast once to f32. */
cdf_status cdf_k_rope_table(float *out, const float *pos, int64_t rows, int n_axes, const int64_t *axes_dim, double theta);

/* diffusers get_timestep_embedding(t, dim, flip_sin_to_cos, downscale_freq_shift, scale,
 * max_period) for n timesteps (t f32), out [n, dim] f32:
 *   half = dim/2; exponent[k] = -ln(max_period) * k / (half - downscale_freq_shift) (f32)
 *   freqs = exp(exponent) (f32); arg = t * freqs (f32); emb = scale * arg;
 *   out = [sin(emb) | cos(emb)], swapped to [cos | sin] when flip_sin_to_cos; zero pad if dim odd. */
cdf_status cdf_k_timestep_embedding(float *out, const float *t, int64_t n, int64_t dim, bool flip_sin_to_cos,
                                    float downscale_freq_shift, float scale, float max_period);

#endif
