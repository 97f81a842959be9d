/* CPU feature detection (cpuid + XCR0) and the CDIFFUSERS_ISA cap, see cpu_features.h. */
#include "kernels/cpu_features.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

static unsigned long long read_xcr0(void) {
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}

/* An instruction set counts only if the CPU has it AND the OS saves its registers (XCR0). */
static void detect(cdf_k_cpu_features *c) {
    memset(c, 0, sizeof *c);
    unsigned a, b, cx, d;
    if (!__get_cpuid(1, &a, &b, &cx, &d)) return;
    const bool fma = cx & (1u << 12), osxsave = cx & (1u << 27), avx = cx & (1u << 28);
    if (!osxsave || !avx || __get_cpuid_max(0, NULL) < 7) return;
    const unsigned long long xcr0 = read_xcr0();
    const bool ymm_os = (xcr0 & 0x6) == 0x6;                       /* SSE + AVX state */
    const bool zmm_os = (xcr0 & 0xe6) == 0xe6;                     /* + opmask, ZMM_Hi256, Hi16_ZMM */
    const bool tile_os = (xcr0 & (3ull << 17)) == (3ull << 17);    /* XTILECFG + XTILEDATA */
    unsigned max_sub, b7, c7, d7;
    __cpuid_count(7, 0, max_sub, b7, c7, d7);
    const bool avx2 = b7 & (1u << 5), f = b7 & (1u << 16), dq = b7 & (1u << 17), bw = b7 & (1u << 30),
               vl = b7 & (1u << 31);
    const bool amx_bf16 = d7 & (1u << 22), amx_tile = d7 & (1u << 24);
    unsigned a71 = 0, b71, c71, d71;
    if (max_sub >= 1) __cpuid_count(7, 1, a71, b71, c71, d71);
    c->avx2_fma = avx2 && fma && ymm_os;
    c->avx512_core = c->avx2_fma && f && dq && bw && vl && zmm_os;
    c->avx512_bf16 = c->avx512_core && (a71 & (1u << 5));
    c->amx_bf16 = c->avx512_core && amx_bf16 && amx_tile && tile_os;
    c->avx512_vnni = c->avx512_core && (c7 & (1u << 11)); /* leaf 7 ECX bit 11 */
}
#else
static void detect(cdf_k_cpu_features *c) { memset(c, 0, sizeof *c); }
#endif

static cdf_k_cpu_features g_cpu;
static cdf_k_isa g_native, g_level;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void init_once(void) {
    detect(&g_cpu);
    g_native = g_cpu.avx512_bf16 || g_cpu.amx_bf16 ? CDF_K_ISA_AVX512_BF16
               : g_cpu.avx512_core                 ? CDF_K_ISA_AVX512
               : g_cpu.avx2_fma                    ? CDF_K_ISA_AVX2
                                                   : CDF_K_ISA_GENERIC;
    cdf_k_isa want = g_native;
    const char *v = getenv("CDIFFUSERS_ISA");
    const char *legacy = getenv("CDIFFUSERS_KERNELS");
    if (v && *v) {
        if (strcmp(v, "generic") == 0) want = CDF_K_ISA_GENERIC;
        else if (strcmp(v, "avx2") == 0) want = CDF_K_ISA_AVX2;
        else if (strcmp(v, "avx512") == 0) want = CDF_K_ISA_AVX512;
        else if (strcmp(v, "avx512_bf16") == 0) want = CDF_K_ISA_AVX512_BF16;
        else if (strcmp(v, "native") != 0)
            fprintf(stderr, "cdiffusers: CDIFFUSERS_ISA='%s' is not generic|avx2|avx512|avx512_bf16|native; using native (%s)\n",
                    v, cdf_k_isa_name(g_native));
    } else if (legacy && strcmp(legacy, "reference") == 0) {
        want = CDF_K_ISA_GENERIC;
    }
    g_level = want < g_native ? want : g_native;
}

const cdf_k_cpu_features *cdf_k_cpu(void) {
    pthread_once(&g_once, init_once);
    return &g_cpu;
}

cdf_k_isa cdf_k_isa_native(void) {
    pthread_once(&g_once, init_once);
    return g_native;
}

cdf_k_isa cdf_k_isa_level(void) {
    pthread_once(&g_once, init_once);
    return g_level;
}

static bool g_amx;
static pthread_once_t g_amx_once = PTHREAD_ONCE_INIT;

static void amx_once(void) {
    g_amx = false;
#if (defined(__x86_64__) || defined(__i386__)) && defined(SYS_arch_prctl)
    if (!cdf_k_cpu()->amx_bf16 || cdf_k_isa_level() < CDF_K_ISA_AVX512_BF16) return;
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    g_amx = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#endif
}

bool cdf_k_amx_usable(void) {
    pthread_once(&g_amx_once, amx_once);
    return g_amx;
}

const char *cdf_k_isa_name(cdf_k_isa isa) {
    switch (isa) {
    case CDF_K_ISA_GENERIC: return "generic";
    case CDF_K_ISA_AVX2: return "avx2";
    case CDF_K_ISA_AVX512: return "avx512";
    case CDF_K_ISA_AVX512_BF16: return "avx512_bf16";
    }
    return "?";
}
