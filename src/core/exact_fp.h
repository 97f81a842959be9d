/* Included first by a file whose floating-point results must match torch's or numpy's bit for
 * bit (src/rng, src/schedulers): every float operation rounds as written, so the file is compiled
 * without FMA contraction whatever the global flags are, and never with -ffast-math. */
#ifndef CDF_CORE_EXACT_FP_H
#define CDF_CORE_EXACT_FP_H

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif
#if defined(__FAST_MATH__)
#error "src/rng and src/schedulers must not be compiled with -ffast-math: torch's random numbers and the schedules are reproduced bit for bit"
#endif

#endif
