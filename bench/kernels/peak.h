/* Register-only throughput loops (bench/kernels/peak.c). FLOP/s of the calling thread; call
 * only when the CPU has the ISA (peak_amx_bf16 also needs the AMX permission). */
#ifndef CDF_BENCH_PEAK_H
#define CDF_BENCH_PEAK_H
#include <stdint.h>
/* on: the peaks are FLOP per CPU-second of the calling thread (not per wall second): on a loaded
 * machine a descheduled thread does not count against them */
void peak_use_cpu_time(int on);
double peak_f32_fma(int64_t iters);
double peak_f32_fma_avx2(int64_t iters);
double peak_bf16_dp(int64_t iters);
double peak_amx_bf16(int64_t iters);
#endif
