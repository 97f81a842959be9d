/* Helpers shared by the tensor-parallel tests (test_dist.c, test_dist_failures.c): how they start
 * mpirun, and small file/string utilities. Header-only (static functions). */
#ifndef CDF_DIST_TEST_COMMON_H
#define CDF_DIST_TEST_COMMON_H

#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cdiffusers/dist.h"
#include "testutil.h"

#define MPIRUN "mpirun --allow-run-as-root --oversubscribe --mca btl_vader_single_copy_mechanism none"

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Environment for every rank (mpirun's -x applies to one app context, so it is repeated in each).
 * Open MPI's own start-up and progress thread leave allocations LeakSanitizer reports in a
 * sanitizer build; they are suppressed by library, with full stacks so that the suppressions
 * can see the MPI frames (our own leaks still fail). Harmless in a normal build. Jobs that are
 * meant to fail (and whose ranks get killed) skip the leak check: full stacks are slow. */
static inline const char *mpi_env_no_leak_check(void) { return " -x ASAN_OPTIONS=detect_leaks=0"; }

static inline const char *mpi_env(void) {
    static char env[1400];
    if (!env[0]) {
        char supp[1100];
        snprintf(supp, sizeof supp, "%s/lsan_mpi.supp", tu_tmpdir());
        const char *rules = "leak:libmpi.so\nleak:libopen-pal.so\nleak:libopen-rte.so\nleak:libevent\nleak:libhwloc\n"
                            "leak:libpmix\nleak:MPI_Init_thread\nleak:ompi_mpi_finalize\n";
        assert_int_equal(tu_write_file(supp, rules, strlen(rules)), 0);
        snprintf(env, sizeof env, " -x LSAN_OPTIONS=suppressions=%s:print_suppressions=0 -x ASAN_OPTIONS=fast_unwind_on_malloc=0",
                 supp);
    }
    return env;
}

static inline bool have_mpi(void) {
    return cdf_dist_backend_available("mpi") && tu_system("command -v mpirun >/dev/null 2>&1") == 0;
}

static inline int count_substr(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay; p && (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

static inline const char *tmp_path(const char *name) {
    static char buf[8][1024];
    static int slot;
    char *b = buf[slot++ & 7];
    snprintf(b, 1024, "%s/%s", tu_tmpdir(), name);
    return b;
}


#endif
