/* cdiffusers — status codes and the thread-local error message.
 *
 * Every public function that can fail returns a cdf_status (or NULL for constructors) and, on
 * failure, records a human-readable message that cdf_last_error() returns on the same thread.
 * Library code never calls exit() or abort() on bad input. */
#ifndef CDIFFUSERS_ERROR_H
#define CDIFFUSERS_ERROR_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cdf_status {
    CDF_OK = 0,
    CDF_ERR_INVALID_ARG = 1,   /* a caller passed a bad argument (NULL, negative size, ...) */
    CDF_ERR_OUT_OF_MEMORY = 2, /* a device budget or the host ran out of memory */
    CDF_ERR_IO = 3,            /* open/read/write/rename failed (errno text in the message) */
    CDF_ERR_FORMAT = 4,        /* a file is malformed: safetensors, JSON, tokenizer, PNG */
    CDF_ERR_SHAPE = 5,         /* shapes do not agree (op arguments, config vs checkpoint) */
    CDF_ERR_DTYPE = 6,         /* unsupported or mismatching dtype */
    CDF_ERR_NOT_FOUND = 7,     /* a tensor, file, key or backend does not exist */
    CDF_ERR_UNSUPPORTED = 8,   /* valid request this build/device cannot do */
    CDF_ERR_DEVICE = 9,        /* a queued kernel failed; surfaces at the next sync */
    CDF_ERR_INTERRUPTED = 10,  /* cancelled (SIGINT) */
    CDF_ERR_DIST = 11,         /* a distributed peer failed or disagreed */
    CDF_ERR_LIMIT = 12,        /* a size read from input exceeds a safety limit */
    CDF_ERR_GRAPH_BREAK = 13,  /* compile(fullgraph) met an op that needs the host */
    CDF_ERR_INTERNAL = 14      /* a bug in cdiffusers: please report */
} cdf_status;

/* The message of the last failure on this thread ("" if none). Valid until the next call
 * that fails on this thread. */
const char *cdf_last_error(void);
/* The status of the last failure on this thread (CDF_OK if none). */
cdf_status cdf_last_status(void);
/* A short constant name for a status, e.g. "out of memory". */
const char *cdf_status_str(cdf_status s);
/* Forget the last error on this thread. */
void cdf_clear_error(void);

#ifdef __cplusplus
}
#endif
#endif
