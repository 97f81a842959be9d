/* ggml's tensor types: names and block sizes (ggml.h / gguf-py's GGML_QUANT_SIZES). In core
 * because the GGUF reader (io), the block decoders (kernels) and the quantized matmul's argument
 * checks (tensor) all need them, like dtypes. */
#include <stdbool.h>
#include <stdint.h>

#include "cdiffusers/io.h"

static const struct {
    const char *name;
    uint16_t block, bytes;
} k_types[] = {
    [0] = {"F32", 1, 4},       [1] = {"F16", 1, 2},      [2] = {"Q4_0", 32, 18},     [3] = {"Q4_1", 32, 20},
    [6] = {"Q5_0", 32, 22},    [7] = {"Q5_1", 32, 24},   [8] = {"Q8_0", 32, 34},     [9] = {"Q8_1", 32, 40},
    [10] = {"Q2_K", 256, 84},  [11] = {"Q3_K", 256, 110}, [12] = {"Q4_K", 256, 144}, [13] = {"Q5_K", 256, 176},
    [14] = {"Q6_K", 256, 210}, [15] = {"Q8_K", 256, 292}, [16] = {"IQ2_XXS", 256, 66}, [17] = {"IQ2_XS", 256, 74},
    [18] = {"IQ3_XXS", 256, 98}, [19] = {"IQ1_S", 256, 50}, [20] = {"IQ4_NL", 32, 18}, [21] = {"IQ3_S", 256, 110},
    [22] = {"IQ2_S", 256, 82}, [23] = {"IQ4_XS", 256, 136}, [24] = {"I8", 1, 1},      [25] = {"I16", 1, 2},
    [26] = {"I32", 1, 4},      [27] = {"I64", 1, 8},     [28] = {"F64", 1, 8},       [29] = {"IQ1_M", 256, 56},
    [30] = {"BF16", 1, 2},     [34] = {"TQ1_0", 256, 54}, [35] = {"TQ2_0", 256, 66}, [39] = {"MXFP4", 32, 17},
};

const char *cdf_ggml_type_name(uint32_t type) {
    return type < sizeof k_types / sizeof *k_types ? k_types[type].name : NULL;
}

bool cdf_ggml_type_block(uint32_t type, int64_t *block_elems, int64_t *block_bytes) {
    if (!cdf_ggml_type_name(type)) return false;
    if (block_elems) *block_elems = k_types[type].block;
    if (block_bytes) *block_bytes = k_types[type].bytes;
    return true;
}
