/* The compile memory planner on hand-built graphs (compile/memory_plan.h), like ggml-alloc's tests:
 * buffers alive at the same time never share bytes, buffers with disjoint lifetimes do, and the
 * arena of a chain is its largest live pair. Expected sizes are worked out by hand from the
 * placement rule (largest first, lowest free offset). */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#include "compile/memory_plan.h"
#include "exec/capture.h"
#include "tensor/tensor_impl.h"

/* A virtual buffer of n f32 elements, as a capture creates it. */
static cdf_tensor *vbuf(int64_t n) {
    cdf_storage *s = cdf_storage_create(tu_cpu(), (size_t)n * 4);
    assert_non_null(s);
    s->is_virtual = true;
    cdf_tensor *t = cdf_tensor_view_of(s, 0, CDF_F32, 1, &n, (int64_t[]){1});
    cdf_storage_release(s);
    return t;
}

static cdf_node *unary(cdf_tensor *dst, cdf_tensor *src) {
    cdf_node *n = cdf_node_new(CDF_OP_UNARY);
    cdf_node_add_src(n, src);
    n->dst = cdf_tensor_retain(dst);
    return n;
}

/* Byte range of a planned reference in the arena. */
static void range_of(const cdf_tensor *t, size_t *lo, size_t *hi) {
    *lo = (size_t)t->offset * 4;
    *hi = *lo + (size_t)cdf_tensor_numel(t) * 4;
}

static void test_chain(void **state) {
    (void)state;
    cdf_scope_push();
    /* x (a parameter, not virtual) -> A(32) -> B(64) -> C(16) -> D(80, output); sizes in f32:
     * bytes 128, 256, 64, 320 (already 64-aligned). Lifetimes (node index): A [0, 1], B [1, 2],
     * C [2, 3], D [3, 4 = output]. Largest first: D @0; B (disjoint from D) @0; A overlaps B ->
     * @256; C overlaps B and D -> @320. Arena = 384 = the largest live pair (A+B, C+D). */
    float xv[32] = {0};
    cdf_tensor *x = cdf_tensor_from_host(tu_cpu(), CDF_F32, 1, (int64_t[]){32}, xv, CDF_F32);
    cdf_tensor *A = vbuf(32), *B = vbuf(64), *C = vbuf(16), *D = vbuf(80);
    cdf_node *nodes[4] = {unary(A, x), unary(B, A), unary(C, B), unary(D, C)};
    cdf_tensor *outs[1] = {cdf_tensor_retain(D)};
    size_t bytes = 0;
    cdf_tensor *arena = NULL;
    assert_int_equal(cdf_memory_plan(nodes, 4, outs, 1, &bytes, &arena), CDF_OK);
    assert_int_equal(bytes, 384);
    assert_non_null(arena);
    /* every planned reference is on the one placeholder; x is left alone */
    const cdf_storage *ph = arena->storage;
    assert_ptr_equal(nodes[0]->src[0]->storage, x->storage);
    size_t lo[4], hi[4];
    range_of(nodes[0]->dst, &lo[0], &hi[0]); /* A */
    range_of(nodes[1]->dst, &lo[1], &hi[1]); /* B */
    range_of(nodes[2]->dst, &lo[2], &hi[2]); /* C */
    range_of(nodes[3]->dst, &lo[3], &hi[3]); /* D */
    for (int i = 0; i < 4; i++) assert_ptr_equal(nodes[i]->dst->storage, ph);
    assert_ptr_equal(outs[0]->storage, ph);
    assert_true(lo[3] == 0 && lo[1] == 0 && lo[0] == 256 && lo[2] == 320);
    /* each node's source is its predecessor's destination, at the same place */
    for (int i = 1; i < 4; i++) {
        assert_ptr_equal(nodes[i]->src[0]->storage, ph);
        assert_int_equal(nodes[i]->src[0]->offset, nodes[i - 1]->dst->offset);
    }
    for (int i = 0; i < 4; i++) cdf_node_free(nodes[i]);
    cdf_tensor_release(outs[0]);
    cdf_tensor_release(arena);
    cdf_scope_pop(NULL, 0);
}

/* A random DAG: every pair of buffers whose lifetimes overlap gets disjoint bytes; the arena is
 * at least the largest live set and at most the sum of all buffers. */
static void test_random_dags_never_overlap_live_buffers(void **state) {
    (void)state;
    uint64_t seed = 12345;
    for (int round = 0; round < 50; round++) {
        cdf_scope_push();
        enum { N = 24 };
        cdf_tensor *buf[N];
        int64_t len[N];
        for (int i = 0; i < N; i++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            len[i] = 1 + (int64_t)((seed >> 33) % 300);
            buf[i] = vbuf(len[i]);
        }
        /* node i writes buf[i] from an earlier buffer (or nothing for i = 0: a fill) */
        cdf_node *nodes[N];
        int src_of[N];
        for (int i = 0; i < N; i++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            src_of[i] = i == 0 ? -1 : (int)((seed >> 33) % (uint64_t)i);
            if (src_of[i] < 0) {
                nodes[i] = cdf_node_new(CDF_OP_FILL);
                nodes[i]->dst = cdf_tensor_retain(buf[i]);
            } else {
                nodes[i] = unary(buf[i], buf[src_of[i]]);
            }
        }
        cdf_tensor *outs[1] = {cdf_tensor_retain(buf[N - 1])};
        /* lifetimes by hand: first = the writer, last = the last reader (or the end for the output) */
        int first[N], last[N];
        for (int i = 0; i < N; i++) first[i] = last[i] = i;
        for (int i = 0; i < N; i++)
            if (src_of[i] >= 0) last[src_of[i]] = i;
        last[N - 1] = N;
        size_t bytes = 0, sum = 0, peak = 0;
        cdf_tensor *arena = NULL;
        assert_int_equal(cdf_memory_plan(nodes, N, outs, 1, &bytes, &arena), CDF_OK);
        for (int i = 0; i < N; i++) sum += (size_t)(len[i] * 4 + 63) / 64 * 64;
        for (int t = 0; t <= N; t++) {
            size_t live = 0;
            for (int i = 0; i < N; i++)
                if (first[i] <= t && t <= last[i]) live += (size_t)(len[i] * 4 + 63) / 64 * 64;
            if (live > peak) peak = live;
        }
        assert_true(bytes >= peak && bytes <= sum);
        for (int i = 0; i < N; i++)
            for (int j = i + 1; j < N; j++) {
                if (last[i] < first[j] || last[j] < first[i]) continue; /* never alive together */
                size_t li, hi_, lj, hj;
                range_of(nodes[i]->dst, &li, &hi_);
                range_of(nodes[j]->dst, &lj, &hj);
                assert_ptr_equal(nodes[i]->dst->storage, nodes[j]->dst->storage);
                assert_true(hi_ <= lj || hj <= li);
            }
        for (int i = 0; i < N; i++) cdf_node_free(nodes[i]);
        cdf_tensor_release(outs[0]);
        cdf_tensor_release(arena);
        cdf_scope_pop(NULL, 0);
    }
}

/* ---- cdf_memory_peak: the peak of an allocation log ----------------------------------------- */
#define AL(i, b) ((cdf_mem_event){CDF_MEM_ALLOC, (i), (b), 0})
#define ALT(i, b, tag) ((cdf_mem_event){CDF_MEM_ALLOC, (i), (b), (tag)})
#define RL(i) ((cdf_mem_event){CDF_MEM_RELEASE, (i), 0, 0})

static void test_peak_of_hand_built_logs(void **state) {
    (void)state;
    uint64_t peak = 1, end = 1;
    /* live: A 100 -> +B 300 -> -A 200 -> +C 250 -> -B 50 -> +D 350 -> -D 50 */
    const cdf_mem_event a[] = {AL(1, 100), AL(2, 200), RL(1), AL(3, 50), RL(2), AL(4, 300), RL(4)};
    assert_int_equal(cdf_memory_peak(a, 7, &peak, &end, NULL), CDF_OK);
    assert_int_equal(peak, 350);
    assert_int_equal(end, 50);
    /* a RELEASE counts the size its id was allocated with, not its own field; an id may be reused
     * once released: 64, then 0, then 128 + 32 */
    const cdf_mem_event b[] = {AL(7, 64), (cdf_mem_event){CDF_MEM_RELEASE, 7, 999, 0}, AL(7, 128), AL(8, 32)};
    assert_int_equal(cdf_memory_peak(b, 4, &peak, &end, NULL), CDF_OK);
    assert_int_equal(peak, 160);
    assert_int_equal(end, 160);
    /* a chain x_i -> x_{i+1}, each released after its successor exists: sizes 10, 40, 20, 30, 5
     * peak at the largest neighbouring pair, 40 + 20 = 60 */
    const cdf_mem_event c[] = {AL(0, 10), AL(1, 40), RL(0), AL(2, 20), RL(1), AL(3, 30), RL(2), AL(4, 5), RL(3)};
    assert_int_equal(cdf_memory_peak(c, 9, &peak, NULL, NULL), CDF_OK);
    assert_int_equal(peak, 60);
    /* tags: the peak while each tag's allocations are made. live: [t0] 100, [t1] 150, -> 50 (the
     * t0 buffer goes), [t2] 250, -> 200, [t1] 230, [t0] 260 */
    const cdf_mem_event d[] = {ALT(1, 100, 0), ALT(2, 50, 1), RL(1), ALT(3, 200, 2), RL(2), ALT(4, 30, 1), ALT(5, 30, 0)};
    uint64_t tags[CDF_MEM_TAGS];
    assert_int_equal(cdf_memory_peak(d, 7, &peak, &end, tags), CDF_OK);
    assert_int_equal(peak, 260);
    assert_int_equal(end, 260);
    assert_int_equal(tags[0], 260);
    assert_int_equal(tags[1], 230);
    assert_int_equal(tags[2], 250);
    assert_int_equal(tags[3], 0);
    const cdf_mem_event bad_tag[] = {ALT(1, 8, CDF_MEM_TAGS)};
    assert_int_equal(cdf_memory_peak(bad_tag, 1, &peak, NULL, NULL), CDF_ERR_INVALID_ARG);
    /* empty log */
    assert_int_equal(cdf_memory_peak(NULL, 0, &peak, &end, NULL), CDF_OK);
    assert_int_equal(peak, 0);
    assert_int_equal(end, 0);
}

static void test_peak_rejects_broken_logs(void **state) {
    (void)state;
    uint64_t peak = 0;
    const cdf_mem_event unknown[] = {AL(1, 8), RL(2)};
    assert_int_equal(cdf_memory_peak(unknown, 2, &peak, NULL, NULL), CDF_ERR_INVALID_ARG);
    assert_non_null(strstr(cdf_last_error(), "event 1 releases id 2"));
    const cdf_mem_event twice[] = {AL(1, 8), AL(1, 8)};
    assert_int_equal(cdf_memory_peak(twice, 2, &peak, NULL, NULL), CDF_ERR_INVALID_ARG);
    const cdf_mem_event double_free[] = {AL(1, 8), RL(1), RL(1)};
    assert_int_equal(cdf_memory_peak(double_free, 3, &peak, NULL, NULL), CDF_ERR_INVALID_ARG);
}

/* Random logs over few ids (many collisions and reuses, so the live table's deletions are
 * exercised) against a plain list of live buffers. */
static void test_peak_matches_a_live_list(void **state) {
    (void)state;
    srand(17);
    enum { N = 60, IDS = 40 }; /* short logs: a small table, so probe chains collide */
    cdf_mem_event *ev = malloc(N * sizeof *ev);
    uint64_t *size_of = calloc(IDS, sizeof *size_of); /* 0 = not live */
    assert_non_null(ev);
    assert_non_null(size_of);
    for (int round = 0; round < 5000; round++) {
        memset(size_of, 0, IDS * sizeof *size_of);
        /* random distinct ids: their home slots collide (evenly spaced ones would not) */
        uint64_t pool[IDS];
        for (int k = 0; k < IDS; k++) pool[k] = ((uint64_t)rand() << 40) ^ ((uint64_t)rand() << 8) ^ (uint64_t)k; /* low byte k */
        uint64_t live = 0, want_peak = 0;
        for (int i = 0; i < N; i++) {
            const uint64_t k = (uint64_t)(rand() % IDS), id = pool[k];
            if (size_of[k]) {
                ev[i] = RL(id);
                live -= size_of[k];
                size_of[k] = 0;
            } else {
                size_of[k] = 1 + (uint64_t)(rand() % 1000);
                ev[i] = AL(id, size_of[k]);
                live += size_of[k];
                if (live > want_peak) want_peak = live;
            }
        }
        uint64_t peak = 0, end = 0;
        assert_int_equal(cdf_memory_peak(ev, N, &peak, &end, NULL), CDF_OK);
        assert_int_equal(peak, want_peak);
        assert_int_equal(end, live);
    }
    free(ev);
    free(size_of);
}

/* ---- measure mode (exec/capture.h): a forward over virtual buffers, logged --------------------- */
static void test_measured_forward_logs_eager_lifetimes(void **state) {
    (void)state;
    float xv[256];
    for (int i = 0; i < 256; i++) xv[i] = (float)i;
    cdf_scope_push();
    cdf_tensor *x = cdf_tensor_from_host(tu_cpu(), CDF_F32, 1, (int64_t[]){256}, xv, CDF_F32); /* 1 KiB, real */
    assert_non_null(x);
    assert_int_equal(cdf_device_synchronize(tu_cpu()), CDF_OK);
    cdf_memory_stats st0, st1;
    cdf_device_memory_stats(tu_cpu(), &st0);
    assert_int_equal(cdf_measure_begin(), CDF_OK);
    assert_int_equal(cdf_measure_begin(), CDF_ERR_INVALID_ARG); /* not nestable */
    cdf_scope_push();
    cdf_scope_push();
    cdf_tensor *a = cdf_scale(x, 2.0f); /* a: 1 KiB */
    cdf_tensor *b = cdf_silu(a);        /* b: 1 KiB, a + b live */
    cdf_scope_pop(&b, 1);               /* a released: its op was dropped, nothing else holds it */
    cdf_tensor *c = cdf_add(b, b);      /* b + c live */
    assert_non_null(c);
    float v[256] = {0};
    assert_int_equal(cdf_tensor_read(x, CDF_F32, v, sizeof v), CDF_OK); /* an input: it has values */
    assert_true(v[255] == 255.0f);
    cdf_device_memory_stats(tu_cpu(), &st1);
    assert_int_equal(st1.current_bytes, st0.current_bytes); /* virtual: no device memory */
    cdf_scope_pop(NULL, 0);
    cdf_mem_event *log = NULL;
    size_t n = 0;
    assert_int_equal(cdf_measure_end(&log, &n), CDF_OK);
    /* ALLOC a, ALLOC b, RELEASE a, ALLOC c, then b and c released */
    assert_int_equal(n, 6);
    uint64_t peak = 0, end = 1;
    assert_int_equal(cdf_memory_peak(log, n, &peak, &end, NULL), CDF_OK);
    assert_int_equal(peak, 2048); /* a + b, then b + c: never all three (1 KiB each) */
    assert_int_equal(end, 0);
    free(log);
    /* a host read of a computed (virtual) buffer ends the measurement with an error naming it */
    assert_int_equal(cdf_measure_begin(), CDF_OK);
    cdf_scope_push();
    cdf_tensor *d = cdf_scale(x, 3.0f);
    assert_int_equal(cdf_tensor_read(d, CDF_F32, v, sizeof v), CDF_ERR_GRAPH_BREAK);
    cdf_scope_pop(NULL, 0);
    assert_int_equal(cdf_measure_end(&log, &n), CDF_ERR_GRAPH_BREAK);
    assert_non_null(strstr(cdf_last_error(), "reads a computed"));
    assert_null(log);
    cdf_scope_pop(NULL, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chain),
        cmocka_unit_test(test_random_dags_never_overlap_live_buffers),
        cmocka_unit_test(test_peak_of_hand_built_logs),
        cmocka_unit_test(test_peak_rejects_broken_logs),
        cmocka_unit_test(test_peak_matches_a_live_list),
        cmocka_unit_test(test_measured_forward_logs_eager_lifetimes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
