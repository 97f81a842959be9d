/* cdiffusers — processes working together: a process group over MPI, a 1-D device mesh (one
 * device per rank) and the collectives tensor parallelism needs, on device tensors.
 *
 * One process per device, started by an MPI launcher:
 *
 *     mpirun -np 2 cdiffusers generate --model DIR --prompt "..." --tp 2
 *
 * (as root Open MPI also wants --allow-run-as-root; a host file spreads the ranks over machines:
 * mpirun -np 4 --hostfile hosts ...). Every rank runs the same program on the same inputs and
 * calls the same collectives in the same order; the collectives are the only communication.
 *
 * Collectives come in two forms. cdf_all_reduce_sum is an op like cdf_add: it returns a new
 * tensor at once and the all-reduce runs on the device queue in order with the other ops (and is
 * captured by compile like them), so a forward never waits on the host for it. The cdf_dist_*
 * collectives are host-side operations: every device queue is drained (pending ops flushed and
 * waited for), then MPI runs on the tensor's buffer; they block until every rank has
 * contributed. A collective that waits longer than the group's timeout (CDIFFUSERS_DIST_TIMEOUT
 * seconds, default 600, or cdf_dist_set_timeout) means a peer is stuck or gone: the process
 * prints which collective on which rank timed out and exits with status 3, and the MPI launcher
 * then ends every other rank, so a failed job never hangs.
 *
 * Failures that a rank notices itself (a shard it cannot load, an error in a forward) are
 * shared with cdf_dist_agree: every rank learns which rank failed and why.
 *
 * Test hook: CDIFFUSERS_DIST_FAULT="RANK:ACTION:N" makes rank RANK, on entering its N-th
 * collective (1-based), ACTION = "kill" (SIGKILL itself, as a crashed process), "hang" (stop
 * forever, as a stuck one) or "fail" (the collective returns an error without communicating, as
 * if MPI had failed). Meant for the failure tests; unset in normal use.
 *
 * Thread safety: a process group is used by one host thread at a time (MPI is initialised with
 * MPI_THREAD_SERIALIZED; queued all-reduces call MPI from the device's worker thread, and every
 * host-side collective drains the device queues first, so the two never overlap). */
#ifndef CDIFFUSERS_DIST_H
#define CDIFFUSERS_DIST_H

#include <stdbool.h>
#include <stdint.h>

#include "cdiffusers/device.h"
#include "cdiffusers/error.h"
#include "cdiffusers/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Exit status of a process whose collective timed out (see above). */
#define CDF_DIST_EXIT_TIMEOUT 3

typedef struct cdf_process_group cdf_process_group;

/* Whether this build can create groups of the given backend ("mpi" needs Open MPI at build
 * time; "local" always works). */
bool cdf_dist_backend_available(const char *backend);

/* backend "mpi": every process of the MPI job (MPI_COMM_WORLD, duplicated so that the library's
 * messages never mix with the application's); initialises MPI if nobody did (it is then
 * finalised by cdf_dist_finalize). backend "local": a group of one process, no MPI.
 * Errors: CDF_ERR_UNSUPPORTED (backend unknown, or "mpi" in a build without MPI),
 * CDF_ERR_DIST (MPI failed to initialise, with MPI's message). */
cdf_status cdf_dist_init(const char *backend, cdf_process_group **out);

/* One process, no MPI: the n devices of one backend that runs every program as n replicas
 * (cdf_device_open_replicas: "pjrt", devices pjrt:0..n-1). Each "rank" is a replica: models load
 * every rank's slice (each to its device), and cdf_all_reduce_sum is an op inside the program
 * (stablehlo.all_reduce over the replicas), not a host call. Host collectives: agreement returns
 * the process's own status, barrier drains the queues, broadcast from rank 0 writes replica 0's
 * value to every replica; the host all-reduce and all-gather are CDF_ERR_UNSUPPORTED.
 * cdf_dist_rank is 0. Errors: those of cdf_device_open_replicas (a backend without replicas,
 * fewer devices than n). Free it with cdf_dist_finalize. */
cdf_status cdf_dist_init_devices(const char *device, int n, cdf_process_group **out);
/* The replica count of a devices group (its world size); 0 for a group of processes. */
int cdf_dist_replicas(const cdf_process_group *pg);
/* The device standing for a devices group's replicas; NULL for a group of processes. */
cdf_device *cdf_dist_replica_device(const cdf_process_group *pg);

/* A group that only knows its rank and size and cannot communicate: for planning and loading
 * shards without a job (tools that inspect or pre-split checkpoints, tests). Its collectives
 * fail with CDF_ERR_UNSUPPORTED. Errors: CDF_ERR_INVALID_ARG (world < 1, rank outside 0..world-1). */
cdf_status cdf_dist_init_offline(int rank, int world_size, cdf_process_group **out);

/* Free the group; finalises MPI if cdf_dist_init initialised it. NULL is fine. Every rank
 * should call it (MPI_Finalize is collective). */
void cdf_dist_finalize(cdf_process_group *pg);

int cdf_dist_rank(const cdf_process_group *pg);       /* 0 for NULL */
int cdf_dist_world_size(const cdf_process_group *pg); /* 1 for NULL */
const char *cdf_dist_backend_name(const cdf_process_group *pg); /* "mpi", "local", "offline", "devices" */

/* Seconds a collective may wait for its peers (> 0). */
void cdf_dist_set_timeout(cdf_process_group *pg, double seconds);
double cdf_dist_timeout(const cdf_process_group *pg);

/* End the whole job now (MPI_Abort on an MPI group; exit(code) otherwise). Use it after a local
 * failure the other ranks cannot learn about through cdf_dist_agree, e.g. in the middle of a
 * forward where they wait in a collective. Does not return. */
void cdf_dist_abort(cdf_process_group *pg, int code) __attribute__((noreturn));

/* ---- agreement ------------------------------------------------------------------------------ */
/* Every rank passes its own status (and, when it is not CDF_OK, its cdf_last_error() message is
 * sent along). Returns CDF_OK on every rank if every rank passed CDF_OK; otherwise, on every
 * rank, the status of the lowest failing rank with the message
 * "rank R of N failed: <its message>" (plus how many other ranks failed). */
cdf_status cdf_dist_agree(cdf_process_group *pg, cdf_status local);

/* ---- collectives on device tensors ------------------------------------------------------------
 * Every rank calls them in the same order with tensors of the same shape and dtype. A tensor
 * still being computed is waited for first. */

/* In place: t = sum over ranks of t. t contiguous, dtype f32, f64, i32 or i64. Host-side: waits
 * for t (a graph break while compiling) and drains every device queue. */
cdf_status cdf_dist_all_reduce_sum(cdf_process_group *pg, cdf_tensor *t);
/* The all-reduce as an op: a new contiguous tensor = sum over ranks of x (x any layout, dtype
 * f32, f64, i32 or i64). Queued like any op: eager mode does not wait for it, compile captures
 * it (no graph break), defer-and-fuse never fuses it. An MPI failure (or timeout, see above)
 * while it runs surfaces as CDF_ERR_DEVICE at the next sync. A group of one returns x's values
 * (cdf_contiguous). NULL with the error set on bad arguments (offline group, dtype). */
cdf_tensor *cdf_all_reduce_sum(cdf_tensor *x, cdf_process_group *pg);
/* The concatenation along `dim` of every rank's t, in rank order (a new tensor on t's device). */
cdf_tensor *cdf_dist_all_gather(cdf_process_group *pg, cdf_tensor *t, int dim);
/* In place: t = root's t on every rank. t contiguous, any dtype. */
cdf_status cdf_dist_broadcast(cdf_process_group *pg, cdf_tensor *t, int root);
cdf_status cdf_dist_barrier(cdf_process_group *pg);

/* What this rank communicated since the group was created (or the last reset). bytes counts
 * each collective's payload on this rank once (the size of the tensor all-reduced or broadcast,
 * or of this rank's part of an all-gather); a ring all-reduce moves about 2 (N-1)/N times that
 * over the wire. */
typedef struct cdf_dist_stats {
    uint64_t collectives;
    uint64_t bytes;
    double seconds; /* wall time inside collectives, waiting for peers included */
} cdf_dist_stats;
void cdf_dist_get_stats(const cdf_process_group *pg, cdf_dist_stats *out);
void cdf_dist_reset_stats(cdf_process_group *pg);

/* ---- 1-D device mesh ------------------------------------------------------------------------ */
/* The group's ranks in rank order, each with its local device. Tensor-parallel plans split
 * along this one dimension. The mesh borrows the group (free the mesh first). */
typedef struct cdf_device_mesh cdf_device_mesh;

/* local: this rank's device (NULL = the default device). Over an MPI group it is a collective
 * (every rank calls it): ranks on different backends, or different pjrt plugins / device kinds,
 * get CDF_ERR_DIST on every rank, naming both. */
cdf_status cdf_device_mesh_new(cdf_process_group *pg, cdf_device *local, cdf_device_mesh **out);
void cdf_device_mesh_free(cdf_device_mesh *mesh); /* NULL is fine */
int cdf_device_mesh_size(const cdf_device_mesh *mesh);
int cdf_device_mesh_rank(const cdf_device_mesh *mesh);
cdf_device *cdf_device_mesh_local_device(const cdf_device_mesh *mesh);
cdf_process_group *cdf_device_mesh_group(const cdf_device_mesh *mesh);

/* ---- tensor parallelism (process-wide switch used by model loading) ----------------------------
 * While enabled, every component whose model class has a tensor-parallel plan (FLUX.1 and SD3
 * transformers, CLIP text, T5 encoder) is loaded sharded over the mesh: each rank reads only its
 * slice of every sharded weight, and the forwards sum partial results with all-reduces. Other
 * components (VAE, or those named in `replicate`) are loaded whole by every rank.
 * replicate: comma-separated component folder names (e.g. "text_encoder_2"), or NULL.
 * A model whose head count or width does not divide by the mesh size fails to load with an
 * error that names the component, the config key, its value and the mesh size.
 * Errors: CDF_ERR_INVALID_ARG (NULL mesh, replicate list too long). */
cdf_status cdf_tp_enable(cdf_device_mesh *mesh, const char *replicate);
void cdf_tp_disable(void);
/* The enabled mesh, or NULL. */
cdf_device_mesh *cdf_tp_mesh(void);

#ifdef __cplusplus
}
#endif
#endif
