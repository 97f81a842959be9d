/* The prepacked-weight cache (src/kernels/pack_cache.c) on its own, and tied to the backend's
 * buffers: a copy is made once and reused, made again when the checksum shows other data at the
 * address, dropped when its source range is forgotten (also while a kernel holds it: the copy
 * stays readable until released), bounded by one cap over every kernel's copies; and a weight
 * tensor's copy dies with its buffer, so a new weight at a reused address whose sampled elements
 * all agree with the old one is still packed afresh. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#include "cdiffusers/device.h"
#include "cdiffusers/tensor.h"
#include "graph/value.h"
#include "kernels/cpu_features.h"
#include "kernels/fast_onednn.h"
#include "kernels/pack_cache.h"

/* A fill that stamps its call number into every byte of the copy. */
typedef struct stamp {
    int calls;
    size_t bytes;
} stamp;

static bool fill_stamp(void *ctx, void *dst) {
    stamp *s = ctx;
    s->calls++;
    memset(dst, s->calls, s->bytes);
    return true;
}

static bool fill_fails(void *ctx, void *dst) {
    (void)ctx;
    (void)dst;
    return false;
}

static char g_weight[4096]; /* a source address (the cache never reads it: the caller's checksum) */

static cdf_k_pack_key key_at(cdf_k_pack_kind kind, const void *src, size_t bytes, const int64_t *layout, uint64_t sum) {
    return (cdf_k_pack_key){.kind = kind, .src = src, .bytes = bytes, .layout = layout,
                            .layout_size = 2 * sizeof(int64_t), .sum = sum};
}

static int64_t weights_of(cdf_k_pack_kind kind) {
    cdf_k_pack_stats st;
    cdf_k_pack_get_stats(kind, &st);
    return st.packed_weights;
}

/* Gets k's copy and releases it: after `calls` fills in all, its bytes are stamp `want`. */
static void get_expect(const cdf_k_pack_key *k, stamp *s, int calls, int want) {
    cdf_k_pack *held;
    const unsigned char *d = cdf_k_pack_get(k, fill_stamp, s, &held);
    assert_non_null(d);
    assert_non_null(held);
    assert_int_equal(s->calls, calls);
    assert_int_equal(d[0], want);
    assert_int_equal(d[s->bytes - 1], want);
    cdf_k_pack_release(held);
}

static void test_reuse_repack_forget(void **state) {
    (void)state;
    cdf_k_pack_clear();
    cdf_k_pack_set_limit((size_t)1 << 20);
    cdf_k_pack_reset_stats(CDF_K_PACK_OWN_GEMM);
    const int64_t lay[2] = {64, 32}, other_lay[2] = {32, 64};
    stamp s = {.bytes = 256};
    cdf_k_pack *held;
    const cdf_k_pack_key k = key_at(CDF_K_PACK_OWN_GEMM, g_weight + 128, 256, lay, 7);

    get_expect(&k, &s, 1, 1);
    get_expect(&k, &s, 1, 1); /* same key: the cached copy */

    /* another layout of the same source is another copy */
    const cdf_k_pack_key k2 = key_at(CDF_K_PACK_OWN_GEMM, g_weight + 128, 256, other_lay, 7);
    get_expect(&k2, &s, 2, 2);
    assert_int_equal(weights_of(CDF_K_PACK_OWN_GEMM), 2);

    /* other data at the address (the checksum differs): packed afresh, the old copy dropped */
    cdf_k_pack_key changed = k;
    changed.sum = 8;
    get_expect(&changed, &s, 3, 3);
    cdf_k_pack_stats st;
    cdf_k_pack_get_stats(CDF_K_PACK_OWN_GEMM, &st);
    assert_int_equal(st.packs, 3);
    assert_int_equal(st.repacks, 1);
    assert_int_equal(st.refreshes, 1);
    assert_int_equal(st.hits, 1);
    assert_int_equal(st.packed_weights, 2);
    assert_int_equal(st.packed_bytes, 512);

    /* the buffer holding the source is freed while a kernel uses the copy: it leaves the cache at
     * once, stays readable until released */
    const unsigned char *d = cdf_k_pack_get(&changed, fill_stamp, &s, &held);
    assert_int_equal(s.calls, 3);
    cdf_k_pack_forget_range(g_weight, 129); /* covers the source's first byte only */
    assert_int_equal(weights_of(CDF_K_PACK_OWN_GEMM), 0);
    assert_int_equal(d[0], 3);
    assert_int_equal(d[255], 3);
    cdf_k_pack_release(held);

    /* a new buffer at that address with data agreeing on every sample (same checksum): a fresh
     * copy, never the freed buffer's */
    get_expect(&changed, &s, 4, 4);

    /* a range ending just before the source leaves it */
    cdf_k_pack_forget_range(g_weight, 128);
    assert_int_equal(weights_of(CDF_K_PACK_OWN_GEMM), 1);
    cdf_k_pack_forget_range(g_weight + 128, 0); /* nbytes 0: the byte at ptr */
    assert_int_equal(weights_of(CDF_K_PACK_OWN_GEMM), 0);

    /* a failed fill caches nothing */
    assert_null(cdf_k_pack_get(&k, fill_fails, NULL, &held));
    assert_null(held);
    assert_int_equal(weights_of(CDF_K_PACK_OWN_GEMM), 0);
}

/* One cap over every kernel's copies: a copy of one kind takes room from the other. */
static void test_one_cap(void **state) {
    (void)state;
    cdf_k_pack_clear();
    cdf_k_pack_set_limit(3000);
    const int64_t lay[2] = {1, 2};
    stamp s = {.bytes = 2048};
    cdf_k_pack *held;
    const cdf_k_pack_key a = key_at(CDF_K_PACK_OWN_GEMM, g_weight, 2048, lay, 1);
    const cdf_k_pack_key b = key_at(CDF_K_PACK_ONEDNN, g_weight + 2048, 2048, lay, 1);
    assert_non_null(cdf_k_pack_get(&a, fill_stamp, &s, &held));
    cdf_k_pack_release(held);
    assert_int_equal(s.calls, 1);
    /* 2048 + 2048 > 3000: no copy, not even filled (the kernel packs per call) */
    assert_null(cdf_k_pack_get(&b, fill_stamp, &s, &held));
    assert_null(held);
    assert_int_equal(s.calls, 1);
    assert_int_equal(weights_of(CDF_K_PACK_ONEDNN), 0);
    /* freeing the first makes room */
    cdf_k_pack_forget_range(g_weight, 2048);
    assert_non_null(cdf_k_pack_get(&b, fill_stamp, &s, &held));
    cdf_k_pack_release(held);
    assert_int_equal(s.calls, 2);
    assert_int_equal(weights_of(CDF_K_PACK_ONEDNN), 1);
    /* a lower cap keeps existing copies but takes no new ones; 0 = no caching */
    cdf_k_pack_set_limit(0);
    assert_int_equal(cdf_k_pack_limit(), 0);
    assert_non_null(cdf_k_pack_get(&b, fill_stamp, &s, &held));
    cdf_k_pack_release(held);
    assert_null(cdf_k_pack_get(&a, fill_stamp, &s, &held));
    assert_int_equal(s.calls, 2);
    cdf_k_pack_clear();
    assert_int_equal(weights_of(CDF_K_PACK_ONEDNN), 0);
    cdf_k_pack_set_limit((size_t)64 << 20);
}

/* The checksum sees every sampled element and the layout's rows (ld). */
static void test_checksum(void **state) {
    (void)state;
    uint16_t w[48 * 64];
    for (int i = 0; i < 48 * 64; i++) w[i] = (uint16_t)(i * 2654435761u >> 7);
    const uint64_t h = cdf_k_pack_checksum(w, 2, 64, 48, 48);
    assert_true(h == cdf_k_pack_checksum(w, 2, 64, 48, 48));
    w[48 * 64 - 1] ^= 1; /* the last element is always sampled */
    assert_true(h != cdf_k_pack_checksum(w, 2, 64, 48, 48));
    w[48 * 64 - 1] ^= 1;
    w[0] ^= 0x100; /* the first, high byte */
    assert_true(h != cdf_k_pack_checksum(w, 2, 64, 48, 48));
    w[0] ^= 0x100;
    assert_true(h != cdf_k_pack_checksum(w, 2, 32, 48, 96)); /* other rows */
}

/* A linear layer's bf16 weight through the tensor API: the fast path packs it; releasing the
 * weight frees its buffer and the copy with it. A second weight, equal to the first on every
 * sampled element but not elsewhere, usually lands at the same address: its product must be its
 * own (compared with the same product computed after clearing every cache). */
static void test_copy_dies_with_buffer(void **state) {
    (void)state;
    cdf_k_fast_info info;
    cdf_k_fast_get_info(&info);
    const cdf_k_isa level = cdf_k_isa_level();
    if (!(level == CDF_K_ISA_AVX2 || (level > CDF_K_ISA_AVX2 && info.available))) {
        printf("  [skip] no prepacking fast path at this ISA level / build\n");
        return;
    }
    cdf_k_fast_clear();
    cdf_k_pack_set_limit((size_t)64 << 20);
    cdf_device *dev = tu_cpu();
    enum { M = 17, N = 64, K = 48 };
    static float x[M * K], w[N * K];
    tu_fill_random(x, M * K, 11);
    tu_fill_random(w, N * K, 12);
    w[1] = 0.0f; /* not a sampled element (samples: (N K - 1) i / 63, i.e. 0, 48, ...) */
    const int64_t xs[2] = {M, K}, ws[2] = {N, K};
    cdf_tensor *tx = cdf_tensor_from_host(dev, CDF_F32, 2, xs, x, CDF_F32);
    cdf_tensor *tw = cdf_tensor_from_host(dev, CDF_BF16, 2, ws, w, CDF_F32);
    assert_non_null(tx);
    assert_non_null(tw);
    const void *addr1 = cdf_tensor_device_addr(tw);
    cdf_tensor *y = cdf_linear(tx, tw, NULL);
    assert_non_null(y);
    assert_int_equal(cdf_device_synchronize(dev), CDF_OK);
    assert_int_equal(weights_of(CDF_K_PACK_ONEDNN) + weights_of(CDF_K_PACK_OWN_GEMM), 1);
    cdf_tensor_release(y);
    cdf_tensor_release(tw);
    assert_int_equal(cdf_device_synchronize(dev), CDF_OK);
    assert_int_equal(weights_of(CDF_K_PACK_ONEDNN) + weights_of(CDF_K_PACK_OWN_GEMM), 0);

    w[1] = 100.0f; /* x[:, 1] is not 0: column 0 of the product changes in every row */
    tw = cdf_tensor_from_host(dev, CDF_BF16, 2, ws, w, CDF_F32);
    assert_non_null(tw);
    printf("  second weight %s the first one's address\n", cdf_tensor_device_addr(tw) == addr1 ? "reuses" : "is not at");
    y = cdf_linear(tx, tw, NULL);
    float *got = cdf_tensor_read_f32(y);
    assert_non_null(got);
    cdf_tensor_release(y);
    cdf_k_fast_clear();
    y = cdf_linear(tx, tw, NULL);
    float *want = cdf_tensor_read_f32(y);
    assert_non_null(want);
    assert_memory_equal(got, want, sizeof(float) * M * N);
    free(got);
    free(want);
    cdf_tensor_release(y);
    cdf_tensor_release(tw);
    cdf_tensor_release(tx);
    cdf_k_fast_clear();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reuse_repack_forget),
        cmocka_unit_test(test_one_cap),
        cmocka_unit_test(test_checksum),
        cmocka_unit_test(test_copy_dies_with_buffer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
