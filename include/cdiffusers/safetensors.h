/* cdiffusers — safetensors files: the reader (mmap / pread, the whole header validated at open)
 * and the writer (byte-compatible with Python's safetensors, written atomically). Part of the
 * model-file IO layer (cdiffusers/io.h). Thread safety: an opened cdf_st_file is immutable, so
 * any number of threads may look tensors up and read from it concurrently; a cdf_st_writer
 * belongs to one thread at a time. */
#ifndef CDIFFUSERS_SAFETENSORS_H
#define CDIFFUSERS_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cdiffusers/dtype.h"
#include "cdiffusers/error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CDF_ST_MAX_DIMS 8                               /* dims per tensor */
#define CDF_ST_MAX_HEADER_BYTES (100ull * 1024 * 1024)  /* safetensors JSON header */

/* ------------------------------------------------------------------------------------------
 * safetensors reader
 *
 * cdf_st_open maps the file read-only and validates the whole header up front: JSON syntax and
 * types, dtype names, shapes (0..8 dims, no negative dims, no element-count overflow),
 * data_offsets (ordered, inside the data section, nbytes == numel * dtype size), no two tensors
 * overlapping, no duplicate names, __metadata__ being a string->string object. After a
 * successful open every cdf_st_tensor can be read without further checks failing on format.
 * Gaps between tensors and trailing bytes after the last one are tolerated.
 * ---------------------------------------------------------------------------------------- */
typedef struct cdf_st_file cdf_st_file;

typedef struct cdf_st_tensor {
    const char *name;      /* owned by the file; valid until cdf_st_close */
    cdf_dtype dtype;
    int ndim;              /* 0 for a scalar */
    int64_t shape[CDF_ST_MAX_DIMS];
    uint64_t offset;       /* byte offset from the start of the data section */
    uint64_t nbytes;       /* numel * dtype size (0 for a zero-size tensor) */
} cdf_st_tensor;

/* Open and validate. Errors: CDF_ERR_NOT_FOUND (no such file), CDF_ERR_IO (open/stat/mmap
 * failed or not a regular file, errno text), CDF_ERR_FORMAT (anything
 * malformed; message names the file and the tensor), CDF_ERR_LIMIT (header > 100 MB or nested
 * deeper than CDF_JSON_MAX_DEPTH), CDF_ERR_DTYPE (a valid safetensors dtype this library does
 * not support: F8_E8M0, F4, F6_*, U16, U32, U64, C64), CDF_ERR_INVALID_ARG. */
cdf_status cdf_st_open(const char *path, cdf_st_file **out);
void cdf_st_close(cdf_st_file *f); /* NULL is fine */

const char *cdf_st_path(const cdf_st_file *f);
int cdf_st_count(const cdf_st_file *f);
/* Tensors in data order (ascending offset, ties by name); NULL if i is out of range. */
const cdf_st_tensor *cdf_st_tensor_at(const cdf_st_file *f, int i);
/* Binary search by name; NULL (no error recorded) if absent. */
const cdf_st_tensor *cdf_st_find(const cdf_st_file *f, const char *name);
int64_t cdf_st_numel(const cdf_st_tensor *t);
/* __metadata__ string value for key, NULL if absent. */
const char *cdf_st_metadata(const cdf_st_file *f, const char *key);
int cdf_st_metadata_count(const cdf_st_file *f);
/* i-th metadata entry (sorted by key); returns false if i is out of range. */
bool cdf_st_metadata_at(const cdf_st_file *f, int i, const char **key, const char **value);

/* Zero-copy pointer into the read-only mapping. NOT counted by cdf_io_bytes_read(): the bytes are
 * paged in whenever someone touches them, which the library cannot see. Use it for inspection
 * and tests; a loader that wants its traffic counted uses cdf_st_touch (same pointer, counted)
 * or the read functions below. Never write through it. */
const void *cdf_st_data(const cdf_st_file *f, const cdf_st_tensor *t);
/* cdf_st_data + adds t->nbytes to the byte counter: "I am about to consume this tensor". */
const void *cdf_st_touch(const cdf_st_file *f, const cdf_st_tensor *t);

/* Range reads with pread on the file descriptor (not through the mapping), so exactly the bytes
 * copied are read from the file and counted. dst must hold the bytes asked for.
 * cdf_st_read: bytes [byte_offset, byte_offset+nbytes) of the tensor's data.
 * cdf_st_read_all: the whole tensor (t->nbytes).
 * cdf_st_read_rows: rows [row0, row0+nrows) of dim 0 (each row = prod(shape[1:]) elements);
 *   the result is contiguous [nrows, shape[1:]...]. Needs ndim >= 1.
 * cdf_st_read_cols: columns [col0, col0+ncols) of the LAST dim, the tensor viewed as
 *   [prod(shape[:-1]), shape[-1]] (a 1-D tensor is one row); the result is contiguous
 *   [prod(leading), ncols]. Reads only those bytes of every row (one pread per row unless the
 *   columns are the full width). Needs ndim >= 1.
 * Errors: CDF_ERR_INVALID_ARG (range outside the tensor, negative counts, NULL dst with a
 * non-empty range, 0-d tensor for rows/cols), CDF_ERR_IO (pread failed or the file shrank). */
cdf_status cdf_st_read(const cdf_st_file *f, const cdf_st_tensor *t, uint64_t byte_offset,
                       uint64_t nbytes, void *dst);
cdf_status cdf_st_read_all(const cdf_st_file *f, const cdf_st_tensor *t, void *dst);
cdf_status cdf_st_read_rows(const cdf_st_file *f, const cdf_st_tensor *t, int64_t row0,
                            int64_t nrows, void *dst);
cdf_status cdf_st_read_cols(const cdf_st_file *f, const cdf_st_tensor *t, int64_t col0,
                            int64_t ncols, void *dst);

/* ------------------------------------------------------------------------------------------
 * safetensors writer
 *
 * Output is byte-compatible with the Python safetensors library: header = compact JSON with
 * "__metadata__" first (keys sorted), then the tensors ordered by dtype alignment (8-byte
 * dtypes first, then 4, 2, 1) and by name within a dtype class — the same order Python uses, so
 * data stays aligned — padded with spaces to a multiple of 8 bytes. The file is written to a
 * temporary name in the same folder and renamed into place (an existing file is replaced).
 * ---------------------------------------------------------------------------------------- */
typedef struct cdf_st_writer cdf_st_writer;

cdf_st_writer *cdf_st_writer_new(void); /* NULL if out of memory */
void cdf_st_writer_free(cdf_st_writer *w);
/* Copies data (numel * dtype size bytes; may be NULL when that is 0). Errors:
 * CDF_ERR_INVALID_ARG (empty name, "__metadata__", duplicate name, bad dtype, ndim outside
 * 0..8, negative dim, element count overflow), CDF_ERR_OUT_OF_MEMORY. */
cdf_status cdf_st_writer_add(cdf_st_writer *w, const char *name, cdf_dtype dtype, int ndim,
                             const int64_t *shape, const void *data);
/* Sets (or replaces) a __metadata__ string entry. */
cdf_status cdf_st_writer_set_metadata(cdf_st_writer *w, const char *key, const char *value);
/* Errors: CDF_ERR_IO (folder missing or not writable, disk full; errno text). */
cdf_status cdf_st_writer_save(const cdf_st_writer *w, const char *path);

#ifdef __cplusplus
}
#endif
#endif
