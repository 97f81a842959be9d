/* CPU feature detection and the instruction-set level the kernels use (src/kernels/cpu_features.c).
 * Not a public header.
 *
 * One binary runs everywhere: the features are read at run time (cpuid + the register state the
 * OS enabled, XCR0), and the kernel dispatch picks the best level the CPU has. The environment
 * variable CDIFFUSERS_ISA caps the level, to test or measure the fallbacks on a CPU that has more:
 *   CDIFFUSERS_ISA=generic      plain C reference kernels only (no oneDNN, no intrinsics)
 *   CDIFFUSERS_ISA=avx2         AVX2 + FMA: bf16-weight matmuls in the own GEMM (gemm_bf16w.c:
 *                               weights widened in registers, activations rounded to bf16, so the
 *                               result is the bf16 policy's), oneDNN capped at avx2 for the rest
 *                               (f32 compute), f32 attention in 8-wide vectors
 *   CDIFFUSERS_ISA=avx512       AVX-512 (F/BW/DQ/VL) without the bf16 instructions: the same with
 *                               oneDNN capped at avx512_core and 16-wide attention
 *   CDIFFUSERS_ISA=avx512_bf16  + AVX512-BF16 (vdpbf16ps) / AMX-BF16: oneDNN's native bf16 kernels
 *   CDIFFUSERS_ISA=native       (default, also when unset or empty) the best the CPU has
 * A level above what the CPU has is lowered to what it has. CDIFFUSERS_KERNELS=reference (the
 * switch of earlier versions) still means generic. An unknown value is ignored with a warning on
 * stderr (once) and the native level is used. */
#ifndef CDF_KERNELS_CPU_FEATURES_H
#define CDF_KERNELS_CPU_FEATURES_H

#include <stdbool.h>

typedef struct cdf_k_cpu_features {
    bool avx2_fma;    /* AVX2 + FMA, YMM state enabled */
    bool avx512_core; /* AVX-512 F/DQ/BW/VL, ZMM + opmask state enabled */
    bool avx512_bf16; /* + AVX512-BF16 */
    bool amx_bf16;    /* AMX-BF16 + AMX-TILE, tile state enabled in XCR0 (permission is separate) */
    bool avx512_vnni; /* avx512_core + AVX512-VNNI (vpdpbusd: u8 x s8 dot products of 4 into int32) */
} cdf_k_cpu_features;

typedef enum cdf_k_isa {
    CDF_K_ISA_GENERIC = 0,
    CDF_K_ISA_AVX2 = 1,
    CDF_K_ISA_AVX512 = 2,
    CDF_K_ISA_AVX512_BF16 = 3,
} cdf_k_isa;

/* What the CPU and OS support (detected once). */
const cdf_k_cpu_features *cdf_k_cpu(void);
/* The best level the CPU supports, ignoring CDIFFUSERS_ISA. */
cdf_k_isa cdf_k_isa_native(void);
/* The level the kernels use: native, capped by CDIFFUSERS_ISA (read once per process). */
cdf_k_isa cdf_k_isa_level(void);
/* AMX-BF16 may run: the CPU has it, the level is avx512_bf16 (CDIFFUSERS_ISA does not cap it below)
 * and Linux granted this process the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM, asked once
 * per process on the first call: Linux keeps AMX off until a process asks, and an AMX instruction
 * without the permission faults). */
bool cdf_k_amx_usable(void);
/* "generic", "avx2", "avx512", "avx512_bf16". */
const char *cdf_k_isa_name(cdf_k_isa isa);

#endif
