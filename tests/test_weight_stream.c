/* Sequential offload's weight uploads (compile/weight_stream.c) are queued on the device's copy
 * stream, not written by the host, and the compute stream waits for them before the block's
 * ops: with the compute stream held busy by a gate, a block call returns without waiting for
 * it, its uploads run beside the gate (they let go of the checkpoint while the gate is still
 * closed) and once the gate opens the block's result is exact. With every copy slowed down (the
 * cpu backend's copy-test hook) and nothing gating the compute, the block still reads its
 * weights only once they have landed (the compute stream's wait for the copies' event). Without
 * a copy stream (CDIFFUSERS_COPY_STREAM=0: ctest runs test_weight_stream_nocopy) the uploads are
 * items of the compute stream, behind the gate. Covers both upload paths: a weight stored in the
 * load dtype (queued straight from the checkpoint's bytes) and one converted on the host (bf16
 * -> f32, staged). Runs in every mode and with CDIFFUSERS_CPU_DISCRETE=1 (test.sh). */
#include "testutil.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend_impl.h"
#include "backend/cpu/cpu_impl.h"
#include "cdiffusers/exec.h"
#include "cdiffusers/tensor.h"
#include "compile/weight_stream.h"
#include "tensor/tensor_impl.h"

enum { IN = 8, OUT = 4, ROWS = 2 };

/* ---- a gate: a queued op that blocks the device's worker until opened -------------------- */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cond = PTHREAD_COND_INITIALIZER;
static bool g_open, g_entered;

static cdf_status gate_reduce(void *comm, void *data, int64_t n, cdf_dtype dt) {
    (void)comm, (void)data, (void)n, (void)dt;
    pthread_mutex_lock(&g_lock);
    g_entered = true;
    pthread_cond_broadcast(&g_cond);
    while (!g_open) pthread_cond_wait(&g_cond, &g_lock);
    pthread_mutex_unlock(&g_lock);
    return CDF_OK;
}

static void gate_close(cdf_device *dev) {
    g_open = g_entered = false;
    cdf_tensor *t = cdf_tensor_zeros(dev, CDF_F32, 1, (int64_t[]){1});
    assert_non_null(t);
    assert_int_equal(cdf_exec_flush(), CDF_OK); /* the zeros first (defer-and-fuse) */
    cdf_node *n = cdf_node_new(CDF_OP_ALL_REDUCE);
    n->dst = cdf_tensor_retain(t);
    cdf_node_add_src(n, t);
    n->p.all_reduce.reduce = gate_reduce;
    assert_int_equal(cdf_device_enqueue(dev, n), CDF_OK);
    cdf_tensor_release(t);
    /* once the gate runs, everything queued before it has completed: counters are stable */
    pthread_mutex_lock(&g_lock);
    while (!g_entered) pthread_cond_wait(&g_cond, &g_lock);
    pthread_mutex_unlock(&g_lock);
}

static void gate_open(void) {
    pthread_mutex_lock(&g_lock);
    g_open = true;
    pthread_cond_broadcast(&g_cond);
    pthread_mutex_unlock(&g_lock);
}

/* teardown: a failed test must not leave the device gated for the next one */
static int open_gate(void **state) {
    (void)state;
    gate_open();
    return 0;
}

/* ---- host-side weights, as nn/weights.c makes them for sequential offload ----------------- */
static atomic_int g_released; /* the copy stream's worker releases the checkpoint */
static void count_release(void *owner) {
    (void)owner;
    g_released++;
}

static cdf_tensor *host_side(cdf_device *dev, const void *src, cdf_dtype src_dt) {
    cdf_storage *st = cdf_storage_create(dev, (size_t)OUT * IN * sizeof(float));
    assert_non_null(st);
    st->host_src = src;
    st->host_dtype = src_dt;
    st->owner_release = count_release; /* the checkpoint's owner, released after the last user */
    int64_t shape[2] = {OUT, IN}, strides[2] = {IN, 1};
    cdf_tensor *t = cdf_tensor_view_of(st, 0, CDF_F32, 2, shape, strides);
    cdf_storage_release(st);
    return t;
}

typedef struct block {
    cdf_tensor *x, *w1, *w2, *y;
} block;

static cdf_status run_block(void *ctx, const cdf_tensor_map *in, cdf_tensor_map *out) {
    (void)in, (void)out;
    block *b = ctx;
    cdf_tensor *a = cdf_linear(b->x, b->w1, NULL), *c = cdf_linear(b->x, b->w2, NULL);
    b->y = a && c ? cdf_add(a, c) : NULL;
    cdf_tensor_release(a);
    cdf_tensor_release(c);
    return b->y ? CDF_OK : cdf_last_status();
}

static float w1[OUT * IN], w2f[OUT * IN], x[ROWS * IN];
static uint16_t w2[OUT * IN]; /* bf16: converted on the host, staged */

/* The block's inputs: x on the device, w1 (f32) and w2 (bf16) host-side. */
static block make_block(cdf_device *dev) {
    for (int i = 0; i < OUT * IN; i++) {
        w1[i] = (float)(i % 7) - 3.0f;
        w2f[i] = 0.25f * (float)(i % 5) - 0.5f; /* exact in bf16 */
    }
    cdf_convert(w2, CDF_BF16, w2f, CDF_F32, OUT * IN);
    for (int i = 0; i < ROWS * IN; i++) x[i] = (float)(i % 3) + 1.0f;
    block b = {.x = cdf_tensor_from_host(dev, CDF_F32, 2, (int64_t[]){ROWS, IN}, x, CDF_F32)};
    b.w1 = host_side(dev, w1, CDF_F32);
    b.w2 = host_side(dev, w2, CDF_BF16);
    assert_int_equal(cdf_device_synchronize(dev), CDF_OK);
    atomic_store(&g_released, 0);
    return b;
}

/* y = x w1^T + x w2^T, from the host's copies */
static void check_block_output(block *b) {
    float y[ROWS * OUT];
    assert_int_equal(cdf_tensor_read(b->y, CDF_F32, y, sizeof y), CDF_OK);
    for (int r = 0; r < ROWS; r++)
        for (int o = 0; o < OUT; o++) {
            double want = 0;
            for (int k = 0; k < IN; k++) want += (double)x[r * IN + k] * (w1[o * IN + k] + w2f[o * IN + k]);
            assert_float_equal(y[r * OUT + o], want, 1e-4);
        }
}

static void test_uploads_are_queued_before_their_use(void **state) {
    (void)state;
    cdf_device *dev = tu_cpu();
    const bool copy_stream = cdf_device_copy_stream(dev) != NULL;
    const char *cs_env = getenv("CDIFFUSERS_COPY_STREAM");
    assert_int_equal(copy_stream, !(cs_env && strcmp(cs_env, "0") == 0));
    block b = make_block(dev);

    gate_close(dev);
    cdf_queue_stats before, after;
    cdf_device_queue_stats(dev, &before);
    cdf_tensor *weights[2] = {b.w1, b.w2};
    assert_int_equal(cdf_weight_stream_run(NULL, NULL, run_block, &b, NULL, NULL, weights, 2), CDF_OK);
    /* the host did not wait for the device: at least the two uploads are queued (with a copy
     * stream, the compute stream's wait for them is queued only if they had not run yet: the
     * cpu backend elides a wait for a point already passed, so it is not counted on) */
    cdf_device_queue_stats(dev, &after);
    assert_true(after.enqueued >= before.enqueued + 2);
    /* the model drops its weights: a queued upload still holds the same-dtype source */
    cdf_tensor_release(b.w1);
    cdf_tensor_release(b.w2);
    if (copy_stream) {
        /* the uploads run beside the gated compute stream: the same-dtype one lets go of the
         * checkpoint while the gate is closed, and nothing of the compute stream has run */
        for (int i = 0; i < 5000 && after.completed < before.completed + 2; i++) {
            usleep(1000);
            cdf_device_queue_stats(dev, &after);
        }
        assert_true(after.completed == before.completed + 2);
        assert_int_equal(atomic_load(&g_released), 2);
    } else {
        cdf_device_queue_stats(dev, &after);
        assert_true(after.completed == before.completed); /* nothing has run since the gate */
        assert_int_equal(atomic_load(&g_released), 1); /* w2's bytes were staged at the call: its owner is free */
    }

    gate_open();
    check_block_output(&b);
    assert_int_equal(atomic_load(&g_released), 2); /* the upload ran and let go of the checkpoint */
    cdf_tensor_release(b.y);
    cdf_tensor_release(b.x);
}

static int no_hook(void **state) {
    (void)state;
    cdf_cpu_copy_test_hook = NULL;
    return 0;
}

static cdf_status slow_copy(size_t nbytes) {
    (void)nbytes;
    usleep(150 * 1000);
    return CDF_OK;
}

/* Slow copies and a free compute stream: the block's ops still wait for its uploads. */
static void test_block_waits_for_slow_uploads(void **state) {
    (void)state;
    cdf_device *dev = tu_cpu();
    block b = make_block(dev);
    cdf_tensor *weights[2] = {b.w1, b.w2};
    cdf_cpu_copy_test_hook = slow_copy;
    assert_int_equal(cdf_weight_stream_run(NULL, NULL, run_block, &b, NULL, NULL, weights, 2), CDF_OK);
    cdf_tensor_release(b.w1);
    cdf_tensor_release(b.w2);
    check_block_output(&b);
    cdf_cpu_copy_test_hook = NULL;
    assert_int_equal(atomic_load(&g_released), 2);
    cdf_tensor_release(b.y);
    cdf_tensor_release(b.x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_uploads_are_queued_before_their_use, open_gate),
        cmocka_unit_test_teardown(test_block_waits_for_slow_uploads, no_hook),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
