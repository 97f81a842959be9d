/* cdiffusers — a random number generator that reproduces torch's CPU generator bit for bit.
 *
 * torch.Generator('cpu').manual_seed(seed) is an mt19937 seeded with the low 32 bits of the seed
 * (so seed 2^32 + 42 gives the same numbers as 42), plus a one-value cache for the second
 * Box-Muller output of its scalar normal path. cdf_generator holds exactly that state, and the
 * draw functions below consume it in the same order as the matching torch calls:
 *
 *   cdf_randn_f32(g, out, n)   == torch.randn(shape, generator=g, dtype=torch.float32), numel n
 *   cdf_randn_bf16 / _f16      == the same with dtype=torch.bfloat16 / torch.float16
 *   cdf_rand_f32 / _f64        == torch.rand(shape, generator=g, dtype=float32 / float64)
 *   cdf_randn_tensor(...)      == diffusers.utils.torch_utils.randn_tensor with CPU generator(s)
 *
 * torch picks its normal kernel from the element count only (for a contiguous tensor): fewer
 * than 16 elements take a per-element double-precision path that caches its second value,
 * 16 or more take a vectorised float path (float32) or a scalar path in the element type
 * (bf16/f16). The float32 path reproduces torch's AVX2 kernel as built on x86-64 (the golden
 * build); results do not depend on the flags cdiffusers itself is compiled with.
 *
 * A generator is not thread-safe: one generator per thread, or external locking. */
#ifndef CDIFFUSERS_RNG_H
#define CDIFFUSERS_RNG_H

#include <stdint.h>

#include "cdiffusers/dtype.h"
#include "cdiffusers/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cdf_generator cdf_generator;

/* A generator seeded like torch.Generator('cpu').manual_seed(seed). NULL if out of memory. */
cdf_generator *cdf_generator_new(uint64_t seed);
/* Free a generator (NULL is fine). */
void cdf_generator_free(cdf_generator *g);
/* Re-seed: resets the mt19937 state and clears the cached normal value, as manual_seed does. */
void cdf_generator_manual_seed(cdf_generator *g, uint64_t seed);
/* The seed last given (the full 64-bit value, like torch's initial_seed()). */
uint64_t cdf_generator_initial_seed(const cdf_generator *g);
/* A new generator in exactly the same state (the stream continues identically in both). */
cdf_generator *cdf_generator_clone(const cdf_generator *g);
/* Copy the whole state of src into dst (snapshot / restore). CDF_ERR_INVALID_ARG on NULL. */
cdf_status cdf_generator_copy(cdf_generator *dst, const cdf_generator *src);
/* One raw 32-bit mt19937 output (torch's generator->random()). Advances the state. */
uint32_t cdf_generator_next_u32(cdf_generator *g);

/* Standard normal samples for a tensor of n elements (n >= 0; n == 0 draws nothing).
 * CDF_ERR_INVALID_ARG for a NULL generator/output or a negative n. */
cdf_status cdf_randn_f32(cdf_generator *g, float *out, int64_t n);
/* bfloat16 / float16 results as raw bit patterns (drawn directly in that dtype, as torch does;
 * NOT the float32 numbers rounded). */
cdf_status cdf_randn_bf16(cdf_generator *g, uint16_t *out, int64_t n);
cdf_status cdf_randn_f16(cdf_generator *g, uint16_t *out, int64_t n);
/* Dispatch on dtype: CDF_F32, CDF_BF16, CDF_F16 or CDF_F64 (CDF_ERR_DTYPE otherwise). */
cdf_status cdf_randn(cdf_generator *g, cdf_dtype dtype, void *out, int64_t n);

/* Uniform [0, 1) samples (torch.rand). */
cdf_status cdf_rand_f32(cdf_generator *g, float *out, int64_t n);
cdf_status cdf_rand_f64(cdf_generator *g, double *out, int64_t n);

/* diffusers randn_tensor(shape, generator=gens, dtype) with CPU generators.
 * n_gens == 1: one torch.randn(shape) draw from gens[0].
 * n_gens  > 1: a list of generators; n_gens must equal shape[0] and batch element b is
 *              torch.randn((1,) + shape[1:]) from gens[b] (so each element picks its kernel
 *              from its own element count), concatenated along dim 0.
 * out holds prod(shape) elements of dtype (CDF_F32, CDF_BF16, CDF_F16, CDF_F64).
 * Errors: NULL arguments, n_gens < 1, ndim < 1 or > 16, a negative dimension, element count
 * overflow (CDF_ERR_INVALID_ARG / CDF_ERR_SHAPE), n_gens != shape[0] (CDF_ERR_SHAPE). */
cdf_status cdf_randn_tensor(cdf_generator *const *gens, int n_gens, const int64_t *shape, int ndim,
                            cdf_dtype dtype, void *out);
/* The float32 form of cdf_randn_tensor. */
cdf_status cdf_randn_tensor_f32(cdf_generator *const *gens, int n_gens, const int64_t *shape,
                                int ndim, float *out);

#ifdef __cplusplus
}
#endif
#endif
