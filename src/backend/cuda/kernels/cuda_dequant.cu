/* The CUDA decode of GGUF blocks into a weight panel (the matmul on quantized weights,
 * cuda_matmul_rt.c): one thread per block, each running cdf_dq_store_block of
 * kernels/dequant_blocks.h, the very per-block code of the CPU decoder (dequant.c), which the
 * tests compare bit for bit with gguf-py. So a GGUF layer gets on the GPU the weights it gets on
 * the CPU, rounded to bf16 by the same rule.
 *
 * Bit-exactness forbids FMA contraction (numpy rounds every product before the sum): the header
 * writes every float operation as __fmul_rn / __fadd_rn / __fsub_rn in device code, which nvcc
 * never contracts, and CMakeLists.txt compiles this file with -fmad=false besides, so nothing
 * here can be contracted whatever a later edit writes. That is also why this kernel is a file of
 * its own: the other kernels keep nvcc's default contraction.
 *
 * One thread per block writes 32 or 256 consecutive values: simple, and O(N*K) against the
 * product's O(M*N*K); a coalesced decode can come with a fast path later. */
#include <cuda_runtime.h>

#include "backend/cuda/kernels/cuda_kernels.h"
#include "kernels/dequant_blocks.h"

namespace {

__global__ void k_dequant_panel(uint32_t type, const uint8_t *blocks, long long n_blocks, void *out, cdf_dq_store store) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n_blocks; i += (long long)gridDim.x * blockDim.x)
        cdf_dq_store_block(type, blocks, i, out, store);
}

} // namespace

extern "C" int cdf_cu_dequant_panel(void *stream, uint32_t type, const void *blocks, int64_t n_blocks, void *out,
                                    cdf_dq_store store) {
    int be, bb;
    if (!cdf_dq_block_size(type, &be, &bb)) return (int)cudaErrorInvalidValue;
    if (n_blocks <= 0) return 0;
    const int threads = 128;
    long long grid = (n_blocks + threads - 1) / threads;
    if (grid > 65535LL * 1024) grid = 65535LL * 1024; /* the grid-stride loop covers the rest */
    k_dequant_panel<<<(unsigned)grid, threads, 0, (cudaStream_t)stream>>>(type, (const uint8_t *)blocks, n_blocks, out,
                                                                         store);
    return (int)cudaGetLastError();
}
