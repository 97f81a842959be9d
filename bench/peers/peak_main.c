/* Measured instruction-throughput peaks of this CPU for bench_peers.py: f32 FMA at the widest
 * vector width the CPU has (AVX-512 or AVX2, both from bench/kernels/peak.c), bf16
 * dot products (AVX512-BF16) and AMX-BF16 tiles where present. Prints one JSON object: GFLOP/s
 * of one thread, and of --threads threads running the loop at the same time (on a loaded
 * machine the second figure shows what this process actually gets).
 *
 *   gcc -O2 -fopenmp bench/peers/peak_main.c bench/kernels/peak.c -o peak && ./peak 2 */
#include <cpuid.h>
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "../kernels/peak.h"

typedef double (*peak_fn)(int64_t);

/* best of 3 single-thread runs; then all threads at once (sum of their rates) */
static void measure(const char *name, peak_fn f, int64_t iters, int threads, int *first) {
    double one = 0;
    for (int r = 0; r < 3; r++) {
        double x = f(iters);
        if (x > one) one = x;
    }
    double all = 0;
#pragma omp parallel num_threads(threads) reduction(+ : all)
    all += f(iters);
    printf("%s\"%s\": {\"gflops_1thread\": %.1f, \"gflops_%dthreads\": %.1f}", *first ? "" : ", ", name, one / 1e9,
           threads, all / 1e9);
    *first = 0;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    if (threads < 1) threads = 1;
    __builtin_cpu_init();
    int first = 1;
    printf("{");
    if (__builtin_cpu_supports("avx512f"))
        measure("f32_fma_avx512", peak_f32_fma, 20000000, threads, &first);
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        measure("f32_fma_avx2", peak_f32_fma_avx2, 20000000, threads, &first);
    if (__builtin_cpu_supports("avx512bf16"))
        measure("bf16_dot_avx512bf16", peak_bf16_dp, 20000000, threads, &first);
#ifdef __linux__
    /* AMX needs the kernel's permission for the tile state (ARCH_REQ_XCOMP_PERM = 0x1023, XTILEDATA = 18) */
    unsigned a, b, c, d;
    __cpuid_count(7, 0, a, b, c, d);
    if ((d >> 22) & 1 && syscall(SYS_arch_prctl, 0x1023, 18) == 0)
        measure("amx_bf16", peak_amx_bf16, 2000000, threads, &first);
#endif
    printf("}\n");
    return 0;
}
