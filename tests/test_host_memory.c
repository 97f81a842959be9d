/* Large host buffers (src/core/host_memory.c): 2 MiB-aligned mappings for large requests, kept
 * after free and reused — best fit, the head of a larger range with its tail still kept, freed
 * neighbours merged back into one range — and bounded by the cap (oldest unmapped first).
 * Every reuse is checked by address and by bytes written through the old pointer. In
 * AddressSanitizer builds nothing is kept and only the shapes of the allocations are checked. */
#include "testutil.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/host_memory.h"

#define MIB ((size_t)1 << 20)

static void fill(void *p, size_t n, int v) {
    memset(p, v, n);
}

static void test_small_and_large_shapes(void **state) {
    (void)state;
    cdf_host_release_kept();
    void *s = cdf_host_alloc_large(1000);
    assert_non_null(s);
    assert_int_equal((uintptr_t)s % 64, 0);
    fill(s, 1000, 1);
    cdf_host_free_large(s, 1000);
    assert_int_equal(cdf_host_kept_bytes(), 0); /* small buffers are malloc's business */

    void *z = cdf_host_alloc_large(0);
    assert_non_null(z);
    cdf_host_free_large(z, 0);

    const size_t n = CDF_HOST_LARGE_MIN + 12345; /* not a whole number of pages */
    uint8_t *p = cdf_host_alloc_large(n);
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % (2 * MIB), 0);
    fill(p, n, 7);
    assert_int_equal(p[n - 1], 7);
    cdf_host_free_large(p, n);
    if (cdf_host_keeps_freed()) assert_int_equal(cdf_host_kept_bytes(), 6 * MIB); /* rounded to 2 MiB units */
    else assert_int_equal(cdf_host_kept_bytes(), 0);
    cdf_host_release_kept();
    assert_int_equal(cdf_host_kept_bytes(), 0);
    assert_null(cdf_host_alloc_large(SIZE_MAX - 100)); /* impossible: refused, no crash */
}

static void test_reuse_split_merge(void **state) {
    (void)state;
    if (!cdf_host_keeps_freed()) skip();
    cdf_host_release_kept();
    uint8_t *a = cdf_host_alloc_large(16 * MIB);
    assert_non_null(a);
    fill(a, 16 * MIB, 0x5a);
    cdf_host_free_large(a, 16 * MIB);
    assert_int_equal(cdf_host_kept_bytes(), 16 * MIB);

    /* the same size again: the same pages, still holding what was written */
    uint8_t *b = cdf_host_alloc_large(16 * MIB);
    assert_ptr_equal(b, a);
    assert_int_equal(b[16 * MIB - 1], 0x5a);
    assert_int_equal(cdf_host_kept_bytes(), 0);
    cdf_host_free_large(b, 16 * MIB);

    /* smaller requests take the head of the kept range, one after the other */
    uint8_t *c = cdf_host_alloc_large(6 * MIB);
    uint8_t *d = cdf_host_alloc_large(5 * MIB); /* rounds to 6 MiB */
    assert_ptr_equal(c, a);
    assert_ptr_equal(d, a + 6 * MIB);
    assert_int_equal(cdf_host_kept_bytes(), 4 * MIB);
    fill(c, 6 * MIB, 1);
    fill(d, 5 * MIB, 2);

    /* freed in the other order, they merge with the tail back into one 16 MiB range */
    cdf_host_free_large(d, 5 * MIB);
    assert_int_equal(cdf_host_kept_bytes(), 10 * MIB);
    cdf_host_free_large(c, 6 * MIB);
    assert_int_equal(cdf_host_kept_bytes(), 16 * MIB);
    uint8_t *e = cdf_host_alloc_large(16 * MIB);
    assert_ptr_equal(e, a);
    assert_int_equal(e[0], 1);
    assert_int_equal(e[6 * MIB], 2);
    assert_int_equal(cdf_host_kept_bytes(), 0);

    /* and in address order: the second joins both its freed neighbours */
    cdf_host_free_large(e, 16 * MIB);
    c = cdf_host_alloc_large(6 * MIB);
    d = cdf_host_alloc_large(6 * MIB);
    assert_ptr_equal(d, a + 6 * MIB);
    cdf_host_free_large(c, 6 * MIB);
    cdf_host_free_large(d, 6 * MIB);
    assert_int_equal(cdf_host_kept_bytes(), 16 * MIB);
    e = cdf_host_alloc_large(16 * MIB);
    assert_ptr_equal(e, a);

    /* best fit: of a 20 MiB and an 8 MiB range, an 8 MiB request takes the 8 MiB one */
    uint8_t *big = cdf_host_alloc_large(20 * MIB);
    uint8_t *small = cdf_host_alloc_large(8 * MIB);
    cdf_host_free_large(big, 20 * MIB);
    cdf_host_free_large(small, 8 * MIB);
    assert_ptr_equal(cdf_host_alloc_large(8 * MIB), small);
    cdf_host_free_large(small, 8 * MIB);
    cdf_host_free_large(e, 16 * MIB);
    cdf_host_release_kept();
    assert_int_equal(cdf_host_kept_bytes(), 0);
}

/* Run first in the process: the cap is read from the environment on first use (main sets it
 * to 64 MiB). */
static void test_cap_unmaps_oldest(void **state) {
    (void)state;
    if (!cdf_host_keeps_freed()) skip();
    cdf_host_release_kept();
    uint8_t *p[3];
    for (int i = 0; i < 3; i++) {
        p[i] = cdf_host_alloc_large(30 * MIB);
        assert_non_null(p[i]);
        fill(p[i], 30 * MIB, 10 + i);
    }
    /* free p[0], p[1], then p[2]: 90 MiB against a 64 MiB cap, so p[0] (the oldest) goes
     * unless it merged with a neighbour, which the mappings' order decides; either way the
     * kept bytes never exceed the cap and the newest range is kept */
    for (int i = 0; i < 3; i++) {
        cdf_host_free_large(p[i], 30 * MIB);
        assert_true(cdf_host_kept_bytes() <= 64 * MIB);
    }
    assert_true(cdf_host_kept_bytes() >= 30 * MIB);
    uint8_t *q = cdf_host_alloc_large(30 * MIB);
    assert_non_null(q);
    /* a range larger than the cap is never kept */
    uint8_t *huge = cdf_host_alloc_large(100 * MIB);
    assert_non_null(huge);
    const size_t before = cdf_host_kept_bytes();
    cdf_host_free_large(huge, 100 * MIB);
    assert_int_equal(cdf_host_kept_bytes(), before);
    cdf_host_free_large(q, 30 * MIB);
    cdf_host_release_kept();
}

int main(void) {
    setenv("CDIFFUSERS_HOST_CACHE_MB", "64", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cap_unmaps_oldest),
        cmocka_unit_test(test_small_and_large_shapes),
        cmocka_unit_test(test_reuse_split_merge),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
