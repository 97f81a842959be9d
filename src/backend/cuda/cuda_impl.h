/* Private to the CUDA backend (the *_rt.c files, built only with the toolkit). */
#ifndef CDF_BACKEND_CUDA_IMPL_H
#define CDF_BACKEND_CUDA_IMPL_H

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "backend/backend_impl.h"
#include "backend/cuda/kernels/cuda_kernels.h"

#define CDF_CUDA_EVENT_RING 64
#define CDF_CUDA_MAX_STREAMS 8 /* copy streams per device */
#define CDF_CUDA_GEMM_CACHE 256

/* A cached cuBLASLt heuristic: the algorithm chosen for one problem (types, shape, layouts,
 * epilogue and pointer alignments). */
typedef struct cdf_cuda_gemm_entry {
    bool used;
    uint64_t key[12];
    cublasLtMatmulAlgo_t algo;
} cdf_cuda_gemm_entry;

/* Async host->device copies waiting for their done() callback (called from the host thread once
 * the copy's event has passed: a CUDA host function may not call CUDA, and done() frees staging
 * memory with cudaFreeHost). */
typedef struct cdf_cuda_pending {
    cudaEvent_t event;
    void (*done)(void *);
    void *ctx;
    struct cdf_cuda_pending *next;
} cdf_cuda_pending;

typedef struct cdf_cuda_dev {
    int ordinal;
    cudaStream_t stream; /* the compute stream: every kernel, free, and copy given no stream */
    cudaStream_t copies[CDF_CUDA_MAX_STREAMS]; /* streams handed out by stream_new (NULL: free slot) */
    cublasLtHandle_t lt;
    void *workspace;
    size_t workspace_size;
    pthread_mutex_t lock;
    /* first error since the last synchronize (message names the op); sticky = context lost */
    cdf_status err;
    char err_msg[768];
    bool sticky;
    const char *last_op; /* the last op launched (named when an asynchronous fault surfaces) */
    cdf_cu_error_word *err_word_dev; /* device memory kernels flag bad data in (read at sync) */
    cudaEvent_t events[CDF_CUDA_EVENT_RING];
    uint64_t n_events, events_done;
    cdf_cuda_pending *pending;
    uint64_t enqueued, syncs;
    cdf_cuda_gemm_entry gemm_cache[CDF_CUDA_GEMM_CACHE];
    struct cudaDeviceProp prop;
} cdf_cuda_dev;

extern const cdf_backend_iface cdf_cuda_backend_iface;

/* The matmul node through cuBLASLt (cuda_matmul_rt.c). Returns CDF_OK or an error naming the
 * cause (cdf_error). */
cdf_status cdf_cuda_matmul(cdf_cuda_dev *d, const cdf_node *n);
/* The matmul on GGUF-quantized weights (CDF_OP_MATMUL_Q): the weights decoded panel by panel
 * into a stream-ordered temporary (cuda_plan.h: cdf_cuda_plan_matmul_q), each panel through the
 * same cuBLASLt path. */
cdf_status cdf_cuda_matmul_q(cdf_cuda_dev *d, const cdf_node *n);

/* cdf_error for a failed CUDA runtime call. */
cdf_status cdf_cuda_fail(cudaError_t e, const char *what);

#endif
