/* The op vocabulary shared by the graph (what a node means) and the kernels (how the cpu backend
 * computes it): elementwise and reduction op codes and the fused elementwise program. Plain
 * data, no functions: both layers include it, neither includes the other. */
#ifndef CDF_CORE_OP_DEFS_H
#define CDF_CORE_OP_DEFS_H

#include <stdbool.h>
#include <stdint.h>

#ifndef CDF_MAX_DIMS
#define CDF_MAX_DIMS 8
#endif

typedef enum cdf_unary_op {
    CDF_UN_NEG, CDF_UN_EXP, CDF_UN_LOG, CDF_UN_SQRT, CDF_UN_RSQRT, CDF_UN_SQUARE, CDF_UN_ABS,
    CDF_UN_SIGMOID, CDF_UN_TANH, CDF_UN_SILU,
    CDF_UN_GELU_ERF,   /* 0.5 x (1 + erf(x / sqrt 2))                                 */
    CDF_UN_GELU_TANH,  /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) ("gelu_new") */
    CDF_UN_QUICK_GELU, /* x * sigmoid(1.702 x)                                          */
    CDF_UN_RELU, CDF_UN_SIN, CDF_UN_COS,
    CDF_UN_SCALE,      /* x * p0                                                        */
    CDF_UN_ADD_SCALAR, /* x + p0                                                        */
    CDF_UN_AFFINE,     /* x * p0 + p1                                                   */
    CDF_UN_CLAMP,      /* min(max(x, p0), p1)                                           */
    CDF_UN_POW,        /* x ^ p0                                                        */
    CDF_UN_COUNT
} cdf_unary_op;

typedef enum cdf_binary_op {
    CDF_BIN_ADD, CDF_BIN_SUB, CDF_BIN_MUL, CDF_BIN_DIV, CDF_BIN_MAX, CDF_BIN_MIN, CDF_BIN_COUNT
} cdf_binary_op;

typedef enum cdf_reduce_op {
    CDF_RED_SUM, CDF_RED_MEAN, CDF_RED_VAR /* biased */, CDF_RED_MAX, CDF_RED_MIN,
    CDF_RED_ARGMAX /* index of the first maximum (torch.argmax); any numeric input, i64 output, exact */
} cdf_reduce_op;

#define CDF_FUSE_MAX_STEPS 16
#define CDF_FUSE_MAX_INPUTS 8

/* One step of a chain: unary: v = op(v); binary: v = op(v, in[input]) or, with chain_rhs,
 * v = op(in[input], v). The chain starts as v = in[0]. */
typedef struct cdf_fused_step {
    bool binary;
    bool chain_rhs;
    int8_t input;
    int op; /* cdf_unary_op or cdf_binary_op */
    float p0, p1;
} cdf_fused_step;

/* norm_head: the chain starts as v = LayerNorm(in[0]) over the last dim (no weight, no bias, eps
 * norm_eps), computed as the CDF_OP_LAYER_NORM node it replaces computes it, instead of v = in[0]:
 * a norm and its modulation in one pass (graph/fuse.c). in[0] is then contiguous with at most
 * CDF_FUSE_NORM_MAX_COLS columns, no step reads it, and n_steps may be 0 (the norm and a bf16
 * cast). Never a matmul epilogue. */
#define CDF_FUSE_NORM_MAX_COLS 16384

typedef struct cdf_fused_program {
    int n_steps;
    cdf_fused_step steps[CDF_FUSE_MAX_STEPS];
    bool norm_head;
    float norm_eps;
} cdf_fused_program;

#endif
