/* LD_PRELOAD shim that counts libgomp parallel regions (GOMP_parallel*: what GCC emits for
 * `#pragma omp parallel [for]`), split into regions that ran on one thread (an `if` clause that
 * said no, or OMP_NUM_THREADS=1) and regions that started the team — each of those costs a
 * wake-up and at least one barrier. Prints the counts to stderr at exit and, with
 * OMP_REGIONS_EVERY=N, a line every N team regions (to see how many one forward takes, divide
 * the difference between two runs with different --repeat).
 *
 *   gcc -O2 -shared -fPIC -o omp_regions.so bench/peers/omp_regions.c -ldl
 *   LD_PRELOAD=./omp_regions.so cdiffusers run-model ...
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

static atomic_long n_team, n_single;

static void count(unsigned num_threads) {
    /* num_threads 1: the `if` clause was false (GCC passes 1) or the team is one thread */
    if (num_threads == 1)
        atomic_fetch_add(&n_single, 1);
    else
        atomic_fetch_add(&n_team, 1);
}

__attribute__((destructor)) static void report(void) {
    fprintf(stderr, "omp_regions: %ld parallel regions with a team, %ld on one thread\n", atomic_load(&n_team),
            atomic_load(&n_single));
}

#define NEXT(name) static void (*real)() = NULL; if (!real) real = (void (*)())dlsym(RTLD_NEXT, name)

void GOMP_parallel(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags) {
    NEXT("GOMP_parallel");
    count(num_threads);
    real(fn, data, num_threads, flags);
}

void GOMP_parallel_loop_static(void (*fn)(void *), void *data, unsigned num_threads, long start, long end, long incr,
                               long chunk, unsigned flags) {
    NEXT("GOMP_parallel_loop_static");
    count(num_threads);
    real(fn, data, num_threads, start, end, incr, chunk, flags);
}

void GOMP_parallel_loop_dynamic(void (*fn)(void *), void *data, unsigned num_threads, long start, long end, long incr,
                                long chunk, unsigned flags) {
    NEXT("GOMP_parallel_loop_dynamic");
    count(num_threads);
    real(fn, data, num_threads, start, end, incr, chunk, flags);
}

void GOMP_parallel_loop_guided(void (*fn)(void *), void *data, unsigned num_threads, long start, long end, long incr,
                               long chunk, unsigned flags) {
    NEXT("GOMP_parallel_loop_guided");
    count(num_threads);
    real(fn, data, num_threads, start, end, incr, chunk, flags);
}
