/* cdiffusers — ggml's tensor types as GGUF files store them: the type ids, their block layout,
 * and the (de)quantizers of the types this library reads and writes (cdiffusers/gguf.h). */
#ifndef CDIFFUSERS_GGML_H
#define CDIFFUSERS_GGML_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cdiffusers/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ggml type ids (the numbers stored in the file). */
enum {
    CDF_GGML_F32 = 0, CDF_GGML_F16 = 1, CDF_GGML_Q4_0 = 2, CDF_GGML_Q4_1 = 3, CDF_GGML_Q5_0 = 6,
    CDF_GGML_Q5_1 = 7, CDF_GGML_Q8_0 = 8, CDF_GGML_Q8_1 = 9, CDF_GGML_Q2_K = 10, CDF_GGML_Q3_K = 11,
    CDF_GGML_Q4_K = 12, CDF_GGML_Q5_K = 13, CDF_GGML_Q6_K = 14, CDF_GGML_Q8_K = 15, CDF_GGML_BF16 = 30,
};

/* ggml types: name ("Q4_K"; NULL for an id this library does not know), elements per block and
 * bytes per block (false if unknown). */
const char *cdf_ggml_type_name(uint32_t type);
bool cdf_ggml_type_block(uint32_t type, int64_t *block_elems, int64_t *block_bytes);
/* True for the types cdf_ggml_dequantize handles: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
 * Q2_K, Q3_K, Q4_K, Q5_K, Q6_K. */
bool cdf_ggml_can_dequantize(uint32_t type);
/* Decode n elements (a multiple of the type's block size) of raw blocks into f32, exactly as
 * the gguf Python package's gguf.quants.dequantize (bit for bit). src needs no alignment.
 * Errors: CDF_ERR_UNSUPPORTED (a type it cannot decode, named), CDF_ERR_INVALID_ARG. */
cdf_status cdf_ggml_dequantize(uint32_t type, const void *src, int64_t n, float *dst);
/* Encode n finite f32 values (a multiple of the block size) into blocks of `type`, bit for bit as
 * the reference encoders do: Q8_0 as the gguf Python package's gguf.quants.quantize (dst holds
 * n / 32 * 34 bytes); Q4_K as ggml's quantize_row_q4_K_ref, which is what llama-quantize writes
 * without an importance matrix (gguf-py has no Q4_K encoder; dst holds n / 256 * 144 bytes).
 * Errors: CDF_ERR_UNSUPPORTED (any other type, named), CDF_ERR_INVALID_ARG (n not a whole number
 * of blocks, a NaN or infinite value). */
cdf_status cdf_ggml_quantize(uint32_t type, const float *src, int64_t n, void *dst);

#ifdef __cplusplus
}
#endif
#endif
