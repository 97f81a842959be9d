/* The device interface (backend/backend_impl.h): listing and info, transfers through the
 * backend (uploads with conversion, reads of strided views with conversion), stream-ordered
 * copies and events, a copy stream joined to the compute stream by events (ordering, a failed
 * copy, freeing a stream with work pending), the bound on how far the host runs ahead, and the
 * discrete test mode of the cpu backend.
 * ctest runs this file twice:
 * as test_backend and as test_backend_discrete (CDIFFUSERS_CPU_DISCRETE=1), where every device
 * address must fault when dereferenced above the backend. Expected values come from index
 * arithmetic and bf16 rounding done here. */
#include "testutil.h"

#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend_impl.h"
#include "backend/cpu/cpu_impl.h"
#include "cdiffusers/exec.h"
#include "core/error_internal.h"
#include "cdiffusers/tensor.h"
#include "tensor/tensor_impl.h"

static bool discrete_mode(void) {
    const char *e = getenv("CDIFFUSERS_CPU_DISCRETE");
    return e && strcmp(e, "1") == 0;
}

static cdf_device *cpu(void) {
    cdf_device *d = cdf_device_get("cpu");
    assert_non_null(d);
    return d;
}

static void test_listing_and_info(void **state) {
    (void)state;
    assert_true(cdf_device_count() >= 1);
    assert_ptr_equal(cdf_device_at(0), cdf_device_default());
    assert_null(cdf_device_at(cdf_device_count()));
    cdf_device_info info;
    assert_int_equal(cdf_device_get_info(cpu(), &info), CDF_OK);
    assert_string_equal(info.type, "cpu");
    assert_true(strlen(info.description) > 0);
    assert_non_null(strstr(info.features, "isa="));
    assert_true(info.memory_bytes > 0);
    assert_int_equal(info.host_visible, !discrete_mode());
    bool found = false;
    for (int i = 0; i < cdf_backend_compiled_count(); i++)
        if (strcmp(cdf_backend_compiled_name(i), "cpu") == 0) found = cdf_backend_why_no_device(i) == NULL;
    assert_true(found);
    /* an unknown device type names what the build has */
    assert_null(cdf_device_get("nosuch"));
    assert_non_null(strstr(cdf_last_error(), "no backend 'nosuch' in this build (compiled in: cpu"));
    assert_null(cdf_device_get("cpu:7"));
    assert_non_null(strstr(cdf_last_error(), "does not exist"));
}

static void test_upload_converts_and_reads_back(void **state) {
    (void)state;
    cdf_scope_push();
    /* f32 -> bf16 at upload: values with more than 8 mantissa bits round to nearest even */
    enum { N = 600000 }; /* more than one staging chunk (tensor.c) */
    float *src = malloc(N * sizeof *src), *back = malloc(N * sizeof *back);
    for (int i = 0; i < N; i++) src[i] = 1.0f + (float)(i % 1024) / 4096.0f; /* 1 + k/4096 */
    int64_t shape[1] = {N};
    cdf_tensor *t = cdf_tensor_from_host(cpu(), CDF_BF16, 1, shape, src, CDF_F32);
    assert_non_null(t);
    assert_int_equal(cdf_tensor_read(t, CDF_F32, back, N * sizeof *back), CDF_OK);
    for (int i = 0; i < N; i++) {
        /* bf16 keeps 7 fraction bits: 1 + k/4096 -> nearest multiple of 1/128, ties to even */
        int k = i % 1024;
        double q = k / 32.0; /* in units of 1/128 */
        double fl = (double)(int)q, r = q - fl;
        double want = r > 0.5 || (r == 0.5 && ((int)fl & 1)) ? fl + 1 : fl;
        assert_float_equal(back[i], 1.0 + want / 128.0, 0);
    }
    free(src);
    free(back);
    cdf_scope_pop(NULL, 0);
}

static void test_strided_reads_convert_on_the_host(void **state) {
    (void)state;
    cdf_scope_push();
    int64_t s[3] = {2, 3, 4};
    float v[24];
    for (int i = 0; i < 24; i++) v[i] = (float)i - 11.5f;
    cdf_tensor *t = cdf_tensor_from_host(cpu(), CDF_F32, 3, s, v, CDF_F32);
    int perm[3] = {2, 0, 1};
    cdf_tensor *p = cdf_permute(t, perm); /* [4, 2, 3]: p[i][j][k] = t[j][k][i] */
    assert_false(cdf_tensor_is_contiguous(p));
    /* as i32: float -> integer truncates toward zero (the copy kernel's rule) */
    int32_t got[24];
    assert_int_equal(cdf_tensor_read(p, CDF_I32, got, sizeof got), CDF_OK);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 2; j++)
            for (int k = 0; k < 3; k++) assert_int_equal(got[(i * 2 + j) * 3 + k], (int32_t)v[j * 12 + k * 4 + i]);
    /* as f64 through item() on a one-element view in the middle of the buffer */
    cdf_tensor *one = cdf_slice(cdf_slice(cdf_slice(t, 0, 1, 2, 1), 1, 2, 3, 1), 2, 3, 4, 1);
    double d;
    assert_int_equal(cdf_tensor_item(one, &d), CDF_OK);
    assert_float_equal(d, v[12 + 8 + 3], 0);
    /* integer tensors stay exact above 2^53 when read as integers */
    int64_t big[2] = {(INT64_C(1) << 60) + 1, -((INT64_C(1) << 55) + 3)}, bs[1] = {2}, bb[2];
    cdf_tensor *bt = cdf_tensor_from_host(cpu(), CDF_I64, 1, bs, big, CDF_I64);
    assert_int_equal(cdf_tensor_read(bt, CDF_I64, bb, sizeof bb), CDF_OK);
    assert_true(bb[0] == big[0] && bb[1] == big[1]);
    /* too small a destination is refused before any transfer */
    assert_int_equal(cdf_tensor_read(p, CDF_F32, got, sizeof got - 1), CDF_ERR_INVALID_ARG);
    cdf_scope_pop(NULL, 0);
}

typedef struct done_flag {
    int calls;
} done_flag;
static void on_done(void *p) { ((done_flag *)p)->calls++; }

static void test_async_set_is_stream_ordered(void **state) {
    (void)state;
    cdf_scope_push();
    cdf_device *dev = cpu();
    int64_t s[1] = {1 << 16};
    cdf_tensor *t = cdf_tensor_full(dev, CDF_F32, 1, s, 1.0); /* queued fill */
    assert_non_null(t);
    assert_int_equal(cdf_device_synchronize(dev), CDF_OK);
    /* a second queued fill, then an async upload: the upload lands after the fill */
    cdf_tensor *t2 = cdf_tensor_full(dev, CDF_F32, 1, s, 5.0);
    cdf_tensor *sum = cdf_add(t, t2); /* queued; reads t before the upload below */
    float *host = malloc(sizeof(float) << 16);
    for (int i = 0; i < (1 << 16); i++) host[i] = (float)i;
    done_flag df = {0};
    /* the backend orders after what was enqueued: deferred ops (defer-and-fuse) go first */
    assert_int_equal(cdf_exec_flush(), CDF_OK);
    assert_int_equal(dev->iface->buffer_set_async(dev, NULL, t->storage->data, host, sizeof(float) << 16, on_done, &df),
                     CDF_OK);
    uint64_t ev = dev->iface->event_record(dev);
    dev->iface->event_synchronize(dev, ev);
    assert_int_equal(df.calls, 1); /* passed the marker: the upload ran and released its source */
    float *a = cdf_tensor_read_f32(t), *b = cdf_tensor_read_f32(sum);
    for (int i = 0; i < (1 << 16); i++) {
        assert_float_equal(a[i], (float)i, 0);
        assert_float_equal(b[i], 6.0f, 0); /* computed from the fill, before the upload */
    }
    free(a);
    free(b);
    free(host);
    cdf_scope_pop(NULL, 0);
}

/* ---- a copy stream joined by events ------------------------------------------------------------
 * The cpu backend's copy-test hook slows every queued copy down (or fails it), so that an op of
 * the compute stream not held back by a wait for the copy's event would read the old bytes. */
enum { CS_N = 4096 };
static atomic_int g_copy_delay_ms;
static atomic_int g_copies_started;
static cdf_status slow_copy(size_t nbytes) {
    (void)nbytes;
    atomic_fetch_add(&g_copies_started, 1);
    usleep((useconds_t)atomic_load(&g_copy_delay_ms) * 1000);
    return CDF_OK;
}
static cdf_status failing_copy(size_t nbytes) {
    (void)nbytes;
    return cdf_error(CDF_ERR_IO, "injected copy failure");
}

/* teardown: a failed test must not leave its hook on for the next one */
static int no_hook(void **state) {
    (void)state;
    cdf_cpu_copy_test_hook = NULL;
    return 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A stream and an event of the cpu device, n buffers of CS_N floats holding 1.0 (synchronised),
 * and the values the copies write: host[i] = i + 0.5. */
typedef struct cs_fixture {
    cdf_device *dev;
    cdf_stream *st;
    cdf_event *ev;
    float *host;
} cs_fixture;

static cs_fixture cs_setup(cdf_tensor **t, int n) {
    cs_fixture f = {.dev = cpu()};
    int64_t s[1] = {CS_N};
    for (int k = 0; k < n; k++) t[k] = cdf_tensor_full(f.dev, CDF_F32, 1, s, 1.0);
    assert_int_equal(cdf_device_synchronize(f.dev), CDF_OK);
    f.st = f.dev->iface->stream_new(f.dev);
    f.ev = f.dev->iface->event_new(f.dev);
    assert_non_null(f.st);
    assert_non_null(f.ev);
    f.host = malloc(CS_N * sizeof *f.host);
    for (int i = 0; i < CS_N; i++) f.host[i] = (float)i + 0.5f;
    return f;
}

static void cs_teardown(cs_fixture *f) {
    assert_int_equal(cdf_device_synchronize(f->dev), CDF_OK);
    f->dev->iface->event_free(f->dev, f->ev);
    if (f->st) f->dev->iface->stream_free(f->dev, f->st);
    free(f->host);
}

/* Queue a copy of the values into t on the stream (returns at once). */
static void cs_copy(cs_fixture *f, cdf_tensor *t, done_flag *df) {
    assert_int_equal(f->dev->iface->buffer_set_async(f->dev, f->st, t->storage->data, f->host, CS_N * sizeof(float),
                                                     on_done, df),
                     CDF_OK);
}

/* The compute stream waits for everything queued on the stream so far. */
static void cs_join(cs_fixture *f) {
    assert_int_equal(f->dev->iface->event_record_on(f->dev, f->ev, f->st), CDF_OK);
    assert_int_equal(f->dev->iface->stream_wait_event(f->dev, NULL, f->ev), CDF_OK);
}

/* t + t, computed on the compute stream, is twice the copied values. */
static void cs_expect_doubled(const cs_fixture *f, cdf_tensor *t) {
    float *got = cdf_tensor_read_f32(cdf_add(t, t));
    assert_non_null(got);
    for (int i = 0; i < CS_N; i++) assert_float_equal(got[i], 2.0f * f->host[i], 0);
    free(got);
}

static void test_copy_stream_is_joined_by_events(void **state) {
    (void)state;
    cdf_scope_push();
    cdf_tensor *t;
    cs_fixture f = cs_setup(&t, 1);
    done_flag df = {0};
    atomic_store(&g_copy_delay_ms, 500);
    atomic_store(&g_copies_started, 0);
    cdf_cpu_copy_test_hook = slow_copy;
    cs_copy(&f, t, &df);
    /* the wait is the compute stream's, not the host's: it returns while the copy still runs */
    double t0 = now_s();
    cs_join(&f);
    assert_true(now_s() - t0 < 0.25);
    cdf_tensor *sum = cdf_add(t, t); /* compute stream, after the wait: sees the copied bytes */
    assert_int_equal(cdf_exec_flush(), CDF_OK);
    while (atomic_load(&g_copies_started) == 0) usleep(1000);
    assert_int_equal(df.calls, 0); /* the copy is still running, beside the compute stream */
    float *got = cdf_tensor_read_f32(sum);
    assert_non_null(got);
    for (int i = 0; i < CS_N; i++) assert_float_equal(got[i], 2.0f * f.host[i], 0);
    assert_int_equal(df.calls, 1);
    free(got);
    /* an event the host waits for: passed once the stream has run up to it */
    atomic_store(&g_copy_delay_ms, 100);
    cs_copy(&f, t, &df);
    assert_int_equal(f.dev->iface->event_record_on(f.dev, f.ev, f.st), CDF_OK);
    f.dev->iface->event_host_wait(f.dev, f.ev);
    assert_int_equal(df.calls, 2);
    cdf_cpu_copy_test_hook = NULL;
    cs_teardown(&f);
    cdf_scope_pop(NULL, 0);
}

static void test_failed_copy_is_reported_at_the_sync(void **state) {
    (void)state;
    cdf_scope_push();
    cdf_tensor *t;
    cs_fixture f = cs_setup(&t, 1);
    done_flag df = {0};
    cdf_cpu_copy_test_hook = failing_copy;
    cs_copy(&f, t, &df); /* queued: the failure happens on the device, after the call has returned */
    cs_join(&f);
    cdf_tensor *sum = cdf_add(t, t); /* skipped: it would read bytes the copy never wrote */
    assert_non_null(sum);
    assert_int_equal(cdf_device_synchronize(f.dev), CDF_ERR_DEVICE);
    char want[128];
    snprintf(want, sizeof want, "queued copy of %zu bytes to cpu:0 (copy stream", CS_N * sizeof(float));
    assert_non_null(strstr(cdf_last_error(), want));
    assert_non_null(strstr(cdf_last_error(), "injected copy failure"));
    assert_int_equal(df.calls, 1); /* the source was released all the same */
    cdf_cpu_copy_test_hook = NULL;
    /* the device stays usable: the error was collected, the failed copy wrote nothing, and the
     * stream copies again */
    assert_int_equal(cdf_device_synchronize(f.dev), CDF_OK);
    float *got = cdf_tensor_read_f32(t);
    for (int i = 0; i < CS_N; i++) assert_float_equal(got[i], 1.0f, 0);
    free(got);
    cs_copy(&f, t, &df);
    cs_join(&f);
    cs_expect_doubled(&f, t);
    cs_teardown(&f);
    cdf_scope_pop(NULL, 0);
}

static void test_stream_free_with_pending_work(void **state) {
    (void)state;
    cdf_scope_push();
    enum { K = 3 };
    cdf_tensor *t[K];
    cs_fixture f = cs_setup(t, K);
    done_flag df = {0};
    atomic_store(&g_copy_delay_ms, 100);
    cdf_cpu_copy_test_hook = slow_copy;
    for (int k = 0; k < K; k++) cs_copy(&f, t[k], &df);
    cs_join(&f); /* the compute stream waits for the stream's event */
    /* freeing the stream lets its pending copies run first, and the compute stream's wait for
     * its event ends once it is gone */
    f.dev->iface->stream_free(f.dev, f.st);
    f.st = NULL;
    assert_int_equal(df.calls, K);
    cdf_cpu_copy_test_hook = NULL;
    for (int k = 0; k < K; k++) cs_expect_doubled(&f, t[k]);
    /* an event of a freed stream has passed: a wait for it returns */
    assert_int_equal(f.dev->iface->stream_wait_event(f.dev, NULL, f.ev), CDF_OK);
    f.dev->iface->event_host_wait(f.dev, f.ev);
    cs_teardown(&f);
    cdf_scope_pop(NULL, 0);
}

/* ---- how far the host runs ahead of the compute stream ------------------------------------------
 * A queued copy whose hook holds the compute stream's worker until the host has issued every
 * fill below (or 2 s have passed): the fills' outputs (RA_N x 16 MiB = 384 MiB) exceed the
 * run-ahead bound (256 MiB of pending outputs, cpu_backend.c), so the host must block after
 * RA_BOUND of them and the hook sees the host stuck there. A host that ran ahead freely would
 * issue them all at once and release the hook early. */
enum { RA_N = 24, RA_ELEMS = 4 << 20, RA_BOUND = 16 };
static atomic_int g_ra_issued;
static atomic_bool g_ra_all_issued;
static atomic_int g_ra_issued_at_timeout;
static cdf_status gate_copy(size_t nbytes) {
    (void)nbytes;
    for (int i = 0; i < 200 && !atomic_load(&g_ra_all_issued); i++) usleep(10000);
    atomic_store(&g_ra_issued_at_timeout, atomic_load(&g_ra_all_issued) ? -1 : atomic_load(&g_ra_issued));
    return CDF_OK;
}

static void test_host_run_ahead_is_bounded_in_bytes(void **state) {
    (void)state;
    if (getenv("CDIFFUSERS_CPU_QUEUE_MB")) skip(); /* the bound checked is the default one */
    cdf_scope_push();
    cdf_device *dev = cpu();
    int64_t s1[1] = {4}, s[1] = {RA_ELEMS};
    cdf_tensor *small = cdf_tensor_full(dev, CDF_F32, 1, s1, 0.0);
    assert_int_equal(cdf_device_synchronize(dev), CDF_OK);
    atomic_store(&g_ra_issued, 0);
    atomic_store(&g_ra_all_issued, false);
    atomic_store(&g_ra_issued_at_timeout, -2);
    cdf_cpu_copy_test_hook = gate_copy;
    float host[4] = {1, 2, 3, 4};
    assert_int_equal(cdf_exec_flush(), CDF_OK);
    assert_int_equal(dev->iface->buffer_set_async(dev, NULL, small->storage->data, host, sizeof host, NULL, NULL), CDF_OK);
    cdf_tensor *out[RA_N];
    for (int i = 0; i < RA_N; i++) {
        out[i] = cdf_tensor_full(dev, CDF_F32, 1, s, (double)i); /* one queued fill, 16 MiB out */
        assert_non_null(out[i]);
        assert_int_equal(cdf_exec_flush(), CDF_OK); /* deferring modes: enqueued now */
        atomic_fetch_add(&g_ra_issued, 1);
    }
    atomic_store(&g_ra_all_issued, true);
    assert_int_equal(cdf_device_synchronize(dev), CDF_OK);
    cdf_cpu_copy_test_hook = NULL;
    const int at_timeout = atomic_load(&g_ra_issued_at_timeout);
    /* -1: every fill was issued while the stream was held (nothing bounded the host) */
    assert_true(at_timeout >= 1 && at_timeout <= RA_BOUND);
    for (int i = 0; i < RA_N; i += 7) { /* the held-back fills ran, in order, after the copy */
        float *v = cdf_tensor_read_f32(out[i]);
        assert_float_equal(v[0], (float)i, 0);
        assert_float_equal(v[RA_ELEMS - 1], (float)i, 0);
        free(v);
    }
    float *v = cdf_tensor_read_f32(small);
    for (int i = 0; i < 4; i++) assert_float_equal(v[i], host[i], 0);
    free(v);
    cdf_scope_pop(NULL, 0);
}

static void test_device_memory_is_not_host_memory_in_discrete_mode(void **state) {
    (void)state;
    cdf_scope_push();
    int64_t s[1] = {4};
    float v[4] = {1, 2, 3, 4};
    cdf_tensor *t = cdf_tensor_from_host(cpu(), CDF_F32, 1, s, v, CDF_F32);
    assert_non_null(t);
    assert_int_equal(cdf_device_synchronize(cpu()), CDF_OK);
    /* a child process dereferences the device address from above the backend */
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGSEGV, SIG_DFL); /* cmocka's handler would report and carry on in the child */
        volatile float x = *(volatile float *)cdf_tensor_device_addr(t);
        _exit(x == 1.0f ? 0 : 3);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (discrete_mode()) {
        assert_true(WIFSIGNALED(status));
        assert_int_equal(WTERMSIG(status), SIGSEGV);
        /* host memory cannot stand in for device memory */
        assert_null(cdf_tensor_wrap(cpu(), CDF_F32, 1, s, v, NULL, NULL));
        assert_int_equal(cdf_last_status(), CDF_ERR_UNSUPPORTED);
        assert_non_null(strstr(cdf_last_error(), "cdf_tensor_from_host"));
    } else {
        assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        cdf_tensor *w = cdf_tensor_wrap(cpu(), CDF_F32, 1, s, v, NULL, NULL);
        assert_non_null(w);
        double d;
        assert_int_equal(cdf_tensor_item(cdf_slice(w, 0, 2, 3, 1), &d), CDF_OK);
        assert_float_equal(d, 3.0, 0);
    }
    cdf_scope_pop(NULL, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_listing_and_info),
        cmocka_unit_test(test_upload_converts_and_reads_back),
        cmocka_unit_test(test_strided_reads_convert_on_the_host),
        cmocka_unit_test(test_async_set_is_stream_ordered),
        cmocka_unit_test_teardown(test_copy_stream_is_joined_by_events, no_hook),
        cmocka_unit_test_teardown(test_failed_copy_is_reported_at_the_sync, no_hook),
        cmocka_unit_test_teardown(test_stream_free_with_pending_work, no_hook),
        cmocka_unit_test_teardown(test_host_run_ahead_is_bounded_in_bytes, no_hook),
        cmocka_unit_test(test_device_memory_is_not_host_memory_in_discrete_mode),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
