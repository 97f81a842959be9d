/* Process groups (MPI / local / offline), the 1-D device mesh and collectives on device tensors.
 *
 * Two kinds of collective:
 * - the all-reduce op (cdf_all_reduce_sum): a CDF_OP_ALL_REDUCE node like any other op, queued
 *   (eager), recorded (defer-and-fuse, never fused) or captured into a compiled graph; the device
 *   worker runs it in queue order by calling queued_all_reduce below with the group as the
 *   node's opaque communicator. This is what forwards use: no host read, so no graph break and
 *   no host sync per collective.
 * - host collectives (cdf_dist_all_reduce_sum, broadcast, all-gather, barrier, agree): the host
 *   thread reads the tensor into host memory (cdf_tensor_read), calls MPI on that copy and
 *   writes the result back through the backend (cdf_storage_upload): MPI never sees device
 *   memory, so a discrete device works as the cpu does.
 * MPI runs MPI_THREAD_SERIALIZED: never two threads inside MPI at once, and every rank must issue
 * its collectives in the same order. A queued all-reduce calls MPI from the device worker while
 * the host thread runs ahead, so every host collective first drains every device queue
 * (host_fence): after it no queued collective is running or pending, and none can be queued
 * until the host collective returns (only the host thread submits ops, and it is inside MPI), so
 * the two threads never overlap in MPI and the order of collectives is program order on every
 * rank. A watchdog thread bounds how long any collective may wait for the other ranks. */
#include "cdiffusers/dist.h"

#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/error_internal.h"
#include "exec/exec.h"
#include "tensor/tensor_impl.h"

#ifdef CDF_HAVE_MPI
#include <mpi.h>
#endif

/* PG_DEVICES: one process, the `world` devices of one backend running every program as that
 * many replicas (cdf_dist_init_devices): a "rank" is a replica, the all-reduce is an op inside
 * the program, and the host has nobody to talk to. */
typedef enum pg_kind { PG_LOCAL, PG_OFFLINE, PG_MPI, PG_DEVICES } pg_kind;

#define DEFAULT_TIMEOUT_S 600.0

struct cdf_process_group {
    pg_kind kind;
    int rank, world;
    bool we_initialised_mpi;
    cdf_device *dev; /* PG_DEVICES: the device standing for the replicas */
#ifdef CDF_HAVE_MPI
    MPI_Comm comm;
#endif
    cdf_dist_stats stats;
    uint64_t entered; /* collectives entered (fault injection counts these) */
    /* fault injection (CDIFFUSERS_DIST_FAULT) */
    int fault_rank;
    uint64_t fault_at;
    char fault_action[8];
    /* watchdog: `active` with `deadline` while a collective runs */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    bool thread_running, stop, active;
    double timeout_s, deadline;
    char what[160];
};

static __attribute__((unused)) double now_s(void) { /* used by the MPI paths */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

bool cdf_dist_backend_available(const char *backend) {
    if (!backend) return false;
    if (strcmp(backend, "local") == 0) return true;
#ifdef CDF_HAVE_MPI
    if (strcmp(backend, "mpi") == 0) return true;
#endif
    return false;
}

int cdf_dist_rank(const cdf_process_group *pg) { return pg ? pg->rank : 0; }
int cdf_dist_world_size(const cdf_process_group *pg) { return pg ? pg->world : 1; }
const char *cdf_dist_backend_name(const cdf_process_group *pg) {
    if (!pg) return "none";
    return pg->kind == PG_MPI ? "mpi" : pg->kind == PG_OFFLINE ? "offline" : pg->kind == PG_DEVICES ? "devices" : "local";
}
int cdf_dist_replicas(const cdf_process_group *pg) { return pg && pg->kind == PG_DEVICES ? pg->world : 0; }
cdf_device *cdf_dist_replica_device(const cdf_process_group *pg) { return pg && pg->kind == PG_DEVICES ? pg->dev : NULL; }

void cdf_dist_set_timeout(cdf_process_group *pg, double seconds) {
    if (!pg || !(seconds > 0)) return;
    pthread_mutex_lock(&pg->mu);
    pg->timeout_s = seconds;
    pthread_mutex_unlock(&pg->mu);
}
double cdf_dist_timeout(const cdf_process_group *pg) { return pg ? pg->timeout_s : 0; }

/* The stats are updated by whichever thread ran the collective (the device worker for queued
 * all-reduces): read and reset under the group's lock. A queued collective counts once it ran. */
void cdf_dist_get_stats(const cdf_process_group *pg, cdf_dist_stats *out) {
    if (!out) return;
    if (!pg) {
        *out = (cdf_dist_stats){0};
        return;
    }
    cdf_process_group *g = (cdf_process_group *)pg; /* the lock only */
    pthread_mutex_lock(&g->mu);
    *out = g->stats;
    pthread_mutex_unlock(&g->mu);
}
void cdf_dist_reset_stats(cdf_process_group *pg) {
    if (!pg) return;
    pthread_mutex_lock(&pg->mu);
    memset(&pg->stats, 0, sizeof pg->stats);
    pthread_mutex_unlock(&pg->mu);
}

/* ---- watchdog ------------------------------------------------------------------------------ */
#ifdef CDF_HAVE_MPI
static void *watchdog_main(void *arg) {
    cdf_process_group *pg = arg;
    pthread_mutex_lock(&pg->mu);
    while (!pg->stop) {
        if (pg->active && now_s() >= pg->deadline) {
            /* A peer that died is normally reaped by the launcher first; this covers a peer that
             * hangs, or a launcher that cannot see the death (lost host). Exiting is the only
             * way out of a blocked MPI call; the launcher then ends the other ranks. */
            fprintf(stderr,
                    "cdiffusers: rank %d of %d: %s did not complete within %g s: another rank is stuck or has died; "
                    "ending this rank (exit status %d) so that the launcher stops the job\n",
                    pg->rank, pg->world, pg->what, pg->timeout_s, CDF_DIST_EXIT_TIMEOUT);
            fflush(stderr);
            _exit(CDF_DIST_EXIT_TIMEOUT);
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000 * 1000; /* 0.1 s: the precision of the timeout */
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&pg->cv, &pg->mu, &ts);
    }
    pthread_mutex_unlock(&pg->mu);
    return NULL;
}
#endif

static void parse_fault(cdf_process_group *pg) {
    pg->fault_rank = -1;
    const char *f = getenv("CDIFFUSERS_DIST_FAULT");
    if (!f || !*f) return;
    int r = -1;
    unsigned long long n = 0;
    char action[8] = "";
    if (sscanf(f, "%d:%7[a-z]:%llu", &r, action, &n) == 3 && n > 0 &&
        (strcmp(action, "kill") == 0 || strcmp(action, "hang") == 0 || strcmp(action, "fail") == 0)) {
        pg->fault_rank = r;
        pg->fault_at = n;
        snprintf(pg->fault_action, sizeof pg->fault_action, "%s", action);
    } else {
        fprintf(stderr, "cdiffusers: ignoring CDIFFUSERS_DIST_FAULT='%s' (expected RANK:kill|hang|fail:N)\n", f);
    }
}

#ifdef CDF_HAVE_MPI
/* Entering a collective: count it, maybe inject the configured fault, arm the watchdog.
 * Returns MPI_SUCCESS, or the error code the "fail" fault makes the collective return in place of
 * calling MPI (the caller then reports it as MPI's own error). */
static int collective_begin(cdf_process_group *pg, const char *op, uint64_t bytes) {
    pg->entered++;
    if (pg->fault_rank == pg->rank && pg->entered == pg->fault_at) {
        fprintf(stderr, "cdiffusers: rank %d of %d: CDIFFUSERS_DIST_FAULT: %s at collective #%llu (%s)\n", pg->rank, pg->world,
                pg->fault_action, (unsigned long long)pg->entered, op);
        fflush(stderr);
        if (strcmp(pg->fault_action, "kill") == 0) raise(SIGKILL);
        if (strcmp(pg->fault_action, "fail") == 0) return MPI_ERR_OTHER;
        for (;;) pause(); /* hang */
    }
    pthread_mutex_lock(&pg->mu);
    snprintf(pg->what, sizeof pg->what, "%s #%llu (%llu bytes)", op, (unsigned long long)pg->entered,
             (unsigned long long)bytes);
    pg->deadline = now_s() + pg->timeout_s;
    pg->active = true;
    pthread_mutex_unlock(&pg->mu);
    return MPI_SUCCESS;
}

static void collective_end(cdf_process_group *pg, uint64_t bytes, double t0) {
    pthread_mutex_lock(&pg->mu);
    pg->active = false;
    pg->stats.collectives++;
    pg->stats.bytes += bytes;
    pg->stats.seconds += now_s() - t0;
    pthread_mutex_unlock(&pg->mu);
}
#endif

/* ---- group lifetime ------------------------------------------------------------------------- */
static cdf_process_group *pg_alloc(pg_kind kind, int rank, int world) {
    cdf_process_group *pg = calloc(1, sizeof *pg);
    if (!pg) {
        cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (process group)");
        return NULL;
    }
    pg->kind = kind;
    pg->rank = rank;
    pg->world = world;
    pg->timeout_s = DEFAULT_TIMEOUT_S;
    const char *t = getenv("CDIFFUSERS_DIST_TIMEOUT");
    if (t && *t) {
        char *end;
        double v = strtod(t, &end);
        if (end != t && !*end && v > 0) pg->timeout_s = v;
        else fprintf(stderr, "cdiffusers: ignoring CDIFFUSERS_DIST_TIMEOUT='%s' (expected seconds > 0)\n", t);
    }
    pthread_mutex_init(&pg->mu, NULL);
    pthread_cond_init(&pg->cv, NULL);
    parse_fault(pg);
    return pg;
}

static void pg_free(cdf_process_group *pg) {
    if (pg->thread_running) {
        pthread_mutex_lock(&pg->mu);
        pg->stop = true;
        pthread_cond_signal(&pg->cv);
        pthread_mutex_unlock(&pg->mu);
        pthread_join(pg->thread, NULL);
    }
    pthread_mutex_destroy(&pg->mu);
    pthread_cond_destroy(&pg->cv);
    free(pg);
}

#ifdef CDF_HAVE_MPI
static cdf_status mpi_error(int rc, const char *what) {
    char text[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, text, &len);
    return cdf_error(CDF_ERR_DIST, "%s failed: %s (MPI error %d)", what, text, rc);
}

static cdf_status mpi_init(cdf_process_group **out) {
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (finalized) return cdf_error(CDF_ERR_DIST, "MPI was already finalised in this process; it cannot be started again");
    bool ours = false;
    if (!inited) {
        int provided = 0;
        int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
        if (rc != MPI_SUCCESS) return cdf_error(CDF_ERR_DIST, "MPI_Init_thread failed (MPI error %d)", rc);
        ours = true;
    }
    /* errors come back as return codes (turned into messages), never abort inside MPI */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    int rank = 0, world = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    cdf_process_group *pg = pg_alloc(PG_MPI, rank, world);
    if (!pg) {
        if (ours) MPI_Finalize();
        return cdf_last_status();
    }
    pg->we_initialised_mpi = ours;
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &pg->comm);
    if (rc != MPI_SUCCESS) {
        cdf_status s = mpi_error(rc, "MPI_Comm_dup");
        pg_free(pg);
        if (ours) MPI_Finalize();
        return s;
    }
    MPI_Comm_set_errhandler(pg->comm, MPI_ERRORS_RETURN);
    if (pthread_create(&pg->thread, NULL, watchdog_main, pg) == 0) pg->thread_running = true;
    else fprintf(stderr, "cdiffusers: rank %d: could not start the collective watchdog; timeouts are not enforced\n", rank);
    *out = pg;
    return CDF_OK;
}
#endif

cdf_status cdf_dist_init(const char *backend, cdf_process_group **out) {
    if (!out) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_dist_init: out is NULL");
    *out = NULL;
    if (!backend) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_dist_init: backend is NULL (\"mpi\" or \"local\")");
    if (strcmp(backend, "local") == 0) {
        *out = pg_alloc(PG_LOCAL, 0, 1);
        return *out ? CDF_OK : cdf_last_status();
    }
    if (strcmp(backend, "mpi") == 0) {
#ifdef CDF_HAVE_MPI
        return mpi_init(out);
#else
        return cdf_error(CDF_ERR_UNSUPPORTED, "this build of cdiffusers has no MPI support (Open MPI was not found when it "
                                              "was configured; install libopenmpi-dev and rebuild)");
#endif
    }
    return cdf_error(CDF_ERR_UNSUPPORTED, "process group backend '%s' is unknown (known: mpi, local)", backend);
}

cdf_status cdf_dist_init_devices(const char *device, int n, cdf_process_group **out) {
    if (!out) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_dist_init_devices: out is NULL");
    *out = NULL;
    if (!device) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_dist_init_devices: device is NULL");
    if (n < 1 || n > 4096) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_dist_init_devices: %d devices", n);
    cdf_device *dev = NULL;
    CDF_TRY(cdf_device_open_replicas(device, n, &dev));
    cdf_process_group *pg = pg_alloc(PG_DEVICES, 0, n);
    if (!pg) return cdf_last_status();
    pg->dev = dev;
    *out = pg;
    return CDF_OK;
}

cdf_status cdf_dist_init_offline(int rank, int world_size, cdf_process_group **out) {
    if (!out) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_dist_init_offline: out is NULL");
    *out = NULL;
    if (world_size < 1 || world_size > (1 << 20) || rank < 0 || rank >= world_size)
        return cdf_error(CDF_ERR_INVALID_ARG, "offline process group: rank %d of %d is not valid (0 <= rank < world size)", rank,
                         world_size);
    *out = pg_alloc(PG_OFFLINE, rank, world_size);
    return *out ? CDF_OK : cdf_last_status();
}

void cdf_dist_finalize(cdf_process_group *pg) {
    if (!pg) return;
#ifdef CDF_HAVE_MPI
    /* queued all-reduces point at pg and call MPI: let them finish first (an error they left is
     * collected here and dropped: the group is going away) */
    if (pg->kind == PG_MPI && cdf_exec_drain_all() != CDF_OK)
        fprintf(stderr, "cdiffusers: rank %d: finalising the process group: %s\n", pg->rank, cdf_last_error());
    const bool finalize_mpi = pg->kind == PG_MPI && pg->we_initialised_mpi;
    if (pg->kind == PG_MPI) MPI_Comm_free(&pg->comm);
#endif
    pg_free(pg);
#ifdef CDF_HAVE_MPI
    if (finalize_mpi) MPI_Finalize();
#endif
}

void cdf_dist_abort(cdf_process_group *pg, int code) {
    /* not fenced (unlike the host collectives): a queued all-reduce may be blocked in MPI waiting
     * for a rank that will never join, and MPI_Abort is the way out of that */
    fflush(stdout);
    fflush(stderr);
#ifdef CDF_HAVE_MPI
    if (pg && pg->kind == PG_MPI) MPI_Abort(MPI_COMM_WORLD, code);
#endif
    (void)pg;
    exit(code);
}

/* ---- helpers ------------------------------------------------------------------------------- */
/* Common argument checks; *trivial = true when there is nobody to talk to (a group of one). */
static cdf_status check_group(cdf_process_group *pg, const char *op, bool *trivial) {
    *trivial = false;
    if (!pg) return cdf_error(CDF_ERR_INVALID_ARG, "%s: process group is NULL", op);
    if (pg->world == 1) {
        *trivial = true;
        return CDF_OK;
    }
    if (pg->kind == PG_OFFLINE)
        return cdf_error(CDF_ERR_UNSUPPORTED, "%s: rank %d of %d belongs to an offline process group, which cannot communicate",
                         op, pg->rank, pg->world);
    return CDF_OK;
}

#ifdef CDF_HAVE_MPI
/* Before the host thread calls MPI: drain every device queue, so that no queued collective is
 * in MPI now or runs before this one (see the top of the file). */
static cdf_status host_fence(const char *op) {
    cdf_status s = cdf_exec_drain_all();
    if (s != CDF_OK) cdf_error_prefix("%s: waiting for the queued ops before it: ", op);
    return s;
}

/* A host copy of t's elements (a host read: a graph break under compile), with every queue
 * drained after it; t must be contiguous. The caller frees *host, and writes the result back
 * with put_back: MPI never sees device memory. */
static cdf_status host_copy(cdf_tensor *t, const char *op, void **host) {
    *host = NULL;
    if (!cdf_tensor_is_contiguous(t)) {
        char d[96];
        return cdf_error(CDF_ERR_INVALID_ARG, "%s: tensor %s is not contiguous", op, cdf_tensor_describe(t, d, sizeof d));
    }
    const size_t bytes = (size_t)cdf_tensor_numel(t) * cdf_dtype_size(t->dtype);
    void *p = malloc(bytes ? bytes : 1);
    if (!p) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "%s: out of host memory (%zu bytes)", op, bytes);
    cdf_status s = cdf_tensor_read(t, t->dtype, p, bytes);
    if (s == CDF_OK) s = host_fence(op);
    if (s != CDF_OK) {
        free(p);
        return s;
    }
    *host = p;
    return CDF_OK;
}

/* Write the collective's result back into t (the queues are drained: no op uses it now). */
static cdf_status put_back(cdf_tensor *t, void *host, cdf_status s) {
    if (s == CDF_OK) s = cdf_storage_upload(t->storage, (size_t)t->offset, t->dtype, host, t->dtype, (size_t)cdf_tensor_numel(t));
    free(host);
    return s;
}
#endif

/* ---- agreement ------------------------------------------------------------------------------ */
typedef struct agree_msg {
    int32_t status;
    char text[500];
} agree_msg;

cdf_status cdf_dist_agree(cdf_process_group *pg, cdf_status local) {
    char mine[sizeof((agree_msg *)0)->text];
    snprintf(mine, sizeof mine, "%s", local != CDF_OK ? cdf_last_error() : "");
    bool trivial;
    CDF_TRY(check_group(pg, "agreement", &trivial));
    if (trivial || pg->kind == PG_DEVICES) return local; /* one process: its status is every replica's */
#ifdef CDF_HAVE_MPI
    /* host_fence; an error the queues held (e.g. a queued collective that failed) becomes this
     * rank's status, so every rank hears of it; the agreement itself must still take place */
    if (cdf_exec_drain_all() != CDF_OK && local == CDF_OK) {
        local = cdf_last_status();
        snprintf(mine, sizeof mine, "%s", cdf_last_error());
    }
    agree_msg msg = {.status = (int32_t)local};
    memcpy(msg.text, mine, sizeof msg.text);
    agree_msg *all = calloc((size_t)pg->world, sizeof *all);
    if (!all) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "agreement: out of host memory");
    const double t0 = now_s();
    int rc = collective_begin(pg, "agreement (all-gather of every rank's status)", sizeof msg);
    if (rc == MPI_SUCCESS) rc = MPI_Allgather(&msg, (int)sizeof msg, MPI_BYTE, all, (int)sizeof msg, MPI_BYTE, pg->comm);
    collective_end(pg, sizeof msg, t0);
    if (rc != MPI_SUCCESS) {
        free(all);
        return mpi_error(rc, "agreement (MPI_Allgather)");
    }
    int first = -1, n_failed = 0;
    for (int r = 0; r < pg->world; r++)
        if (all[r].status != CDF_OK) {
            n_failed++;
            if (first < 0) first = r;
        }
    cdf_status s = CDF_OK;
    if (first >= 0) {
        all[first].text[sizeof all[first].text - 1] = '\0';
        cdf_status st = (all[first].status > 0 && all[first].status <= CDF_ERR_INTERNAL) ? (cdf_status)all[first].status
                                                                                          : CDF_ERR_DIST;
        if (n_failed > 1)
            s = cdf_error(st, "rank %d of %d failed: %s (and %d other rank%s failed too)", first, pg->world, all[first].text,
                          n_failed - 1, n_failed > 2 ? "s" : "");
        else
            s = cdf_error(st, "rank %d of %d failed: %s", first, pg->world, all[first].text);
    }
    free(all);
    return s;
#else
    return cdf_error(CDF_ERR_INTERNAL, "agreement: MPI group in a build without MPI");
#endif
}

/* ---- collectives ---------------------------------------------------------------------------- */
#ifdef CDF_HAVE_MPI
static bool mpi_type(cdf_dtype dt, MPI_Datatype *out) {
    switch (dt) {
    case CDF_F32: *out = MPI_FLOAT; return true;
    case CDF_F64: *out = MPI_DOUBLE; return true;
    case CDF_I32: *out = MPI_INT32_T; return true;
    case CDF_I64: *out = MPI_INT64_T; return true;
    default: return false;
    }
}
#endif

/* MPI counts are int: larger buffers go in pieces of at most this many elements/bytes. */
#define MPI_CHUNK ((int64_t)1 << 30)

#ifdef CDF_HAVE_MPI
/* p[0..n) = its sum over the ranks, in place (the host all-reduce and the queued op share it). */
static cdf_status all_reduce_buffer(cdf_process_group *pg, void *p, int64_t n, cdf_dtype dt, const char *what) {
    MPI_Datatype type;
    if (!mpi_type(dt, &type))
        return cdf_error(CDF_ERR_DTYPE, "%s: dtype %s is not supported (f32, f64, i32, i64)", what, cdf_dtype_name(dt));
    const size_t esz = cdf_dtype_size(dt);
    const uint64_t bytes = (uint64_t)n * esz;
    const double t0 = now_s();
    int rc = collective_begin(pg, what, bytes);
    for (int64_t o = 0; o < n && rc == MPI_SUCCESS; o += MPI_CHUNK) {
        const int64_t c = n - o < MPI_CHUNK ? n - o : MPI_CHUNK;
        rc = MPI_Allreduce(MPI_IN_PLACE, (char *)p + o * (int64_t)esz, (int)c, type, MPI_SUM, pg->comm);
    }
    collective_end(pg, bytes, t0);
    return rc == MPI_SUCCESS ? CDF_OK : mpi_error(rc, "all-reduce (MPI_Allreduce)");
}

/* The CDF_OP_ALL_REDUCE node's reduce function (graph/node.h), run by the device worker. A
 * failure is the node's error: the queue records it, skips what follows and the next sync on the
 * host returns it. */
static cdf_status queued_all_reduce(void *comm, void *data, int64_t n, cdf_dtype dt) {
    return all_reduce_buffer(comm, data, n, dt, "all-reduce (queued op)");
}
#endif

cdf_status cdf_dist_all_reduce_sum(cdf_process_group *pg, cdf_tensor *t) {
    if (!t) return cdf_last_status() != CDF_OK ? cdf_last_status() : cdf_error(CDF_ERR_INVALID_ARG, "all-reduce: tensor is NULL");
    bool trivial;
    CDF_TRY(check_group(pg, "all-reduce", &trivial));
    if (trivial) return CDF_OK;
    if (pg->kind == PG_DEVICES)
        return cdf_error(CDF_ERR_UNSUPPORTED, "all-reduce on the host over the replicas of one process (use the op, "
                                              "cdf_all_reduce_sum)");
#ifdef CDF_HAVE_MPI
    MPI_Datatype type;
    if (!mpi_type(cdf_tensor_dtype(t), &type))
        return cdf_error(CDF_ERR_DTYPE, "all-reduce: dtype %s is not supported (f32, f64, i32, i64)",
                         cdf_dtype_name(cdf_tensor_dtype(t)));
    void *p = NULL;
    CDF_TRY(host_copy(t, "all-reduce", &p));
    return put_back(t, p, all_reduce_buffer(pg, p, cdf_tensor_numel(t), cdf_tensor_dtype(t), "all-reduce"));
#else
    return cdf_error(CDF_ERR_INTERNAL, "all-reduce: MPI group in a build without MPI");
#endif
}

/* The all-reduce op recorded like every op (tensor/ops.c): its result, contiguous, is the only
 * tensor recorded in the caller's scope. reduce: the queued host collective (MPI), or NULL with
 * replicas > 1 for the sum inside the program over a device's replicas. */
static cdf_tensor *record_all_reduce(cdf_tensor *x, cdf_process_group *pg, cdf_collective_reduce_fn reduce, int replicas) {
    cdf_scope_suppress(1);
    cdf_tensor *out = cdf_tensor_alloc(x->storage->dev, x->dtype, x->ndim, x->shape);
    cdf_node *n = out ? cdf_node_new(CDF_OP_ALL_REDUCE) : NULL;
    cdf_status s = n ? CDF_OK : cdf_last_status();
    if (n) {
        n->p.all_reduce.comm = pg;
        n->p.all_reduce.reduce = reduce;
        n->p.all_reduce.replicas = replicas;
        cdf_node_add_src(n, x);
        n->dst = cdf_tensor_retain(out);
        s = cdf_exec_submit(n); /* frees the node on failure */
    }
    if (s != CDF_OK) {
        cdf_tensor_release(out);
        out = NULL;
    }
    cdf_scope_suppress(-1);
    cdf_scope_record(out);
    return out;
}

/* The all-reduce over the replicas of a devices group: an op inside the program the device
 * runs on every replica (no communicator; counted when it is recorded). */
static cdf_tensor *replica_all_reduce(cdf_tensor *x, cdf_process_group *pg) {
    char d[96];
    if (x->dtype != CDF_F32 && x->dtype != CDF_F64 && x->dtype != CDF_I32 && x->dtype != CDF_I64) {
        cdf_error(CDF_ERR_DTYPE, "all-reduce: %s: dtype %s is not supported (f32, f64, i32, i64)",
                  cdf_tensor_describe(x, d, sizeof d), cdf_dtype_name(x->dtype));
        return NULL;
    }
    if (x->storage->dev != pg->dev) {
        cdf_error(CDF_ERR_DEVICE, "all-reduce: %s is on %s, not on the replicas' device %s", cdf_tensor_describe(x, d, sizeof d),
                  cdf_device_name(x->storage->dev), cdf_device_name(pg->dev));
        return NULL;
    }
    cdf_tensor *out = record_all_reduce(x, pg, NULL, pg->world);
    if (out) {
        pthread_mutex_lock(&pg->mu);
        pg->stats.collectives++;
        pg->stats.bytes += (uint64_t)cdf_tensor_numel(out) * cdf_dtype_size(out->dtype);
        pthread_mutex_unlock(&pg->mu);
    }
    return out;
}

cdf_tensor *cdf_all_reduce_sum(cdf_tensor *x, cdf_process_group *pg) {
    if (!x) return NULL;
    bool trivial;
    if (check_group(pg, "all-reduce", &trivial) != CDF_OK) return NULL;
    if (trivial) return cdf_contiguous(x);
    if (pg->kind == PG_DEVICES) return replica_all_reduce(x, pg);
#ifdef CDF_HAVE_MPI
    MPI_Datatype type;
    if (!mpi_type(x->dtype, &type)) {
        char d[96];
        cdf_error(CDF_ERR_DTYPE, "all-reduce: %s: dtype %s is not supported (f32, f64, i32, i64)",
                  cdf_tensor_describe(x, d, sizeof d), cdf_dtype_name(x->dtype));
        return NULL;
    }
    return record_all_reduce(x, pg, queued_all_reduce, 0);
#else
    cdf_error(CDF_ERR_INTERNAL, "all-reduce: MPI group in a build without MPI");
    return NULL;
#endif
}

cdf_status cdf_dist_broadcast(cdf_process_group *pg, cdf_tensor *t, int root) {
    if (!t) return cdf_last_status() != CDF_OK ? cdf_last_status() : cdf_error(CDF_ERR_INVALID_ARG, "broadcast: tensor is NULL");
    bool trivial;
    CDF_TRY(check_group(pg, "broadcast", &trivial));
    if (root < 0 || root >= pg->world)
        return cdf_error(CDF_ERR_INVALID_ARG, "broadcast: root rank %d is outside 0..%d", root, pg->world - 1);
    if (trivial) return CDF_OK;
    if (pg->kind == PG_DEVICES) {
        /* replica 0's value (what a host read sees) written back to every replica */
        if (root != 0) return cdf_error(CDF_ERR_UNSUPPORTED, "broadcast from replica %d of one process (only from 0)", root);
        if (!cdf_tensor_is_contiguous(t)) return cdf_error(CDF_ERR_INVALID_ARG, "broadcast: the tensor is not contiguous");
        const size_t bytes = (size_t)cdf_tensor_numel(t) * cdf_dtype_size(t->dtype);
        void *p = malloc(bytes ? bytes : 1);
        if (!p) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "broadcast: out of host memory (%zu bytes)", bytes);
        cdf_status s = cdf_tensor_read(t, t->dtype, p, bytes);
        if (s == CDF_OK) s = cdf_exec_drain_all();
        if (s == CDF_OK) s = cdf_storage_upload(t->storage, (size_t)t->offset, t->dtype, p, t->dtype, (size_t)cdf_tensor_numel(t));
        free(p);
        return s;
    }
#ifdef CDF_HAVE_MPI
    void *p = NULL;
    CDF_TRY(host_copy(t, "broadcast", &p));
    const uint64_t bytes = (uint64_t)cdf_tensor_numel(t) * cdf_dtype_size(cdf_tensor_dtype(t));
    const double t0 = now_s();
    int rc = collective_begin(pg, "broadcast", bytes);
    for (uint64_t o = 0; o < bytes && rc == MPI_SUCCESS; o += (uint64_t)MPI_CHUNK) {
        const uint64_t c = bytes - o < (uint64_t)MPI_CHUNK ? bytes - o : (uint64_t)MPI_CHUNK;
        rc = MPI_Bcast((char *)p + o, (int)c, MPI_BYTE, root, pg->comm);
    }
    collective_end(pg, bytes, t0);
    return put_back(t, p, rc == MPI_SUCCESS ? CDF_OK : mpi_error(rc, "broadcast (MPI_Bcast)"));
#else
    return cdf_error(CDF_ERR_INTERNAL, "broadcast: MPI group in a build without MPI");
#endif
}

cdf_status cdf_dist_barrier(cdf_process_group *pg) {
    bool trivial;
    CDF_TRY(check_group(pg, "barrier", &trivial));
    if (trivial) return CDF_OK;
    if (pg->kind == PG_DEVICES) return cdf_exec_drain_all();
#ifdef CDF_HAVE_MPI
    CDF_TRY(host_fence("barrier"));
    const double t0 = now_s();
    int rc = collective_begin(pg, "barrier", 0);
    if (rc == MPI_SUCCESS) rc = MPI_Barrier(pg->comm);
    collective_end(pg, 0, t0);
    return rc == MPI_SUCCESS ? CDF_OK : mpi_error(rc, "barrier (MPI_Barrier)");
#else
    return cdf_error(CDF_ERR_INTERNAL, "barrier: MPI group in a build without MPI");
#endif
}

cdf_tensor *cdf_dist_all_gather(cdf_process_group *pg, cdf_tensor *t, int dim) {
    if (!t) return NULL;
    bool trivial;
    if (check_group(pg, "all-gather", &trivial) != CDF_OK) return NULL;
    const int nd = cdf_tensor_ndim(t);
    const int d = cdf_norm_dim(dim, nd);
    if (nd < 1 || d < 0) {
        char s[96];
        cdf_error(CDF_ERR_INVALID_ARG, "all-gather: dim %d is not a dimension of %s", dim, cdf_tensor_describe(t, s, sizeof s));
        return NULL;
    }
    if (trivial) return cdf_contiguous(t);
    if (pg->kind == PG_DEVICES) {
        cdf_error(CDF_ERR_UNSUPPORTED, "all-gather over the replicas of one process is not implemented");
        return NULL;
    }
#ifdef CDF_HAVE_MPI
    const cdf_dtype dt = cdf_tensor_dtype(t);
    const uint64_t bytes = (uint64_t)cdf_tensor_numel(t) * cdf_dtype_size(dt);
    if (bytes > (uint64_t)INT_MAX) {
        cdf_error(CDF_ERR_LIMIT, "all-gather: %llu bytes per rank exceeds the %d-byte limit of one MPI call",
                  (unsigned long long)bytes, INT_MAX);
        return NULL;
    }
    char *mine = malloc(bytes ? bytes : 1), *all = malloc(bytes * (uint64_t)pg->world + 1);
    if (!mine || !all) {
        free(mine);
        free(all);
        cdf_error(CDF_ERR_OUT_OF_MEMORY, "all-gather: out of host memory (%llu bytes x %d ranks)", (unsigned long long)bytes,
                  pg->world);
        return NULL;
    }
    if (cdf_tensor_read(t, dt, mine, bytes) != CDF_OK || host_fence("all-gather") != CDF_OK) {
        free(mine);
        free(all);
        return NULL;
    }
    const double t0 = now_s();
    int rc = collective_begin(pg, "all-gather", bytes);
    if (rc == MPI_SUCCESS) rc = MPI_Allgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, pg->comm);
    collective_end(pg, bytes, t0);
    free(mine);
    if (rc != MPI_SUCCESS) {
        free(all);
        mpi_error(rc, "all-gather (MPI_Allgather)");
        return NULL;
    }
    /* [world, shape...] -> move the rank axis in front of `dim` -> merge it with `dim` */
    int64_t stacked[CDF_MAX_DIMS + 1], merged[CDF_MAX_DIMS];
    int perm[CDF_MAX_DIMS + 1];
    if (nd + 1 > CDF_MAX_DIMS) {
        free(all);
        cdf_error(CDF_ERR_LIMIT, "all-gather: a %d-d tensor cannot be stacked (limit %d dims)", nd, CDF_MAX_DIMS);
        return NULL;
    }
    stacked[0] = pg->world;
    for (int i = 0; i < nd; i++) {
        stacked[i + 1] = cdf_tensor_dim(t, i);
        merged[i] = cdf_tensor_dim(t, i) * (i == d ? pg->world : 1);
    }
    int k = 0;
    for (int i = 0; i < d; i++) perm[k++] = i + 1;
    perm[k++] = 0;
    for (int i = d; i < nd; i++) perm[k++] = i + 1;
    cdf_scope_push();
    cdf_tensor *st = cdf_tensor_from_host(cdf_tensor_device(t), dt, nd + 1, stacked, all, dt);
    free(all);
    cdf_tensor *r = cdf_reshape(cdf_contiguous(cdf_permute(st, perm)), nd, merged);
    cdf_scope_pop(r ? &r : NULL, r ? 1 : 0);
    return r;
#else
    cdf_error(CDF_ERR_INTERNAL, "all-gather: MPI group in a build without MPI");
    return NULL;
#endif
}

/* ---- mesh ------------------------------------------------------------------------------------ */
struct cdf_device_mesh {
    cdf_process_group *pg;
    cdf_device *local;
};

/* What a rank computes on, for comparing ranks: the backend, and for a values backend (pjrt) the
 * plugin, platform and device kind too (its description), since programs and their numerics are
 * the plugin's. A cpu or cuda device's description (the CPU or GPU model) may differ between
 * hosts of one job without changing what is computed, so only the backend is compared there. */
static void device_identity(cdf_device *dev, char *out, size_t n) {
    cdf_device_info info;
    if (cdf_device_get_info(dev, &info) != CDF_OK) {
        snprintf(out, n, "(unknown device)");
        return;
    }
    if (info.values) snprintf(out, n, "%s (%s)", info.type, info.description);
    else snprintf(out, n, "%s", info.type);
}

/* Every rank of an MPI job must run on the same backend and plugin: the shard plan, the
 * programs and the host-side sums assume one kind of device, and a mixed job (one rank given
 * --device pjrt, another cpu; ranks on hosts whose plugins differ) would otherwise fail late or
 * draw a picture neither backend alone would. An all-gather of each rank's identity, before any
 * weight is read; a difference is the same clear error on every rank. */
static cdf_status check_same_backend(cdf_process_group *pg, cdf_device *local) {
#ifdef CDF_HAVE_MPI
    if (pg->kind != PG_MPI || pg->world < 2) return CDF_OK; /* one process: one backend */
    char mine[256] = {0};
    device_identity(local, mine, sizeof mine);
    char *all = calloc((size_t)pg->world, sizeof mine);
    if (!all) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "device mesh: out of host memory");
    const double t0 = now_s();
    int rc = collective_begin(pg, "device mesh (all-gather of every rank's backend)", sizeof mine);
    if (rc == MPI_SUCCESS) rc = MPI_Allgather(mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE, pg->comm);
    collective_end(pg, sizeof mine, t0);
    if (rc != MPI_SUCCESS) {
        free(all);
        return mpi_error(rc, "device mesh (MPI_Allgather)");
    }
    cdf_status s = CDF_OK;
    for (int r = 1; r < pg->world && s == CDF_OK; r++) {
        const char *first = all, *other = all + (size_t)r * sizeof mine;
        if (strncmp(first, other, sizeof mine) != 0)
            s = cdf_error(CDF_ERR_DIST,
                          "tensor parallelism: rank 0 of %d runs on %.*s but rank %d on %.*s: every rank must use the "
                          "same backend and plugin (--device, CDIFFUSERS_DEVICE, CDIFFUSERS_PJRT_PLUGIN)",
                          pg->world, (int)sizeof mine, first, r, (int)sizeof mine, other);
    }
    free(all);
    return s;
#else
    (void)pg, (void)local;
    return CDF_OK;
#endif
}

cdf_status cdf_device_mesh_new(cdf_process_group *pg, cdf_device *local, cdf_device_mesh **out) {
    if (!out) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_device_mesh_new: out is NULL");
    *out = NULL;
    if (!pg) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_device_mesh_new: process group is NULL");
    if (!local) local = cdf_device_default();
    if (!local) return cdf_last_status() != CDF_OK ? cdf_last_status() : cdf_error(CDF_ERR_NOT_FOUND, "device mesh: no device");
    CDF_TRY(check_same_backend(pg, local));
    cdf_device_mesh *m = calloc(1, sizeof *m);
    if (!m) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of host memory (device mesh)");
    m->pg = pg;
    m->local = local;
    *out = m;
    return CDF_OK;
}

void cdf_device_mesh_free(cdf_device_mesh *mesh) { free(mesh); }
int cdf_device_mesh_size(const cdf_device_mesh *mesh) { return mesh ? mesh->pg->world : 1; }
int cdf_device_mesh_rank(const cdf_device_mesh *mesh) { return mesh ? mesh->pg->rank : 0; }
cdf_device *cdf_device_mesh_local_device(const cdf_device_mesh *mesh) { return mesh ? mesh->local : NULL; }
cdf_process_group *cdf_device_mesh_group(const cdf_device_mesh *mesh) { return mesh ? mesh->pg : NULL; }
