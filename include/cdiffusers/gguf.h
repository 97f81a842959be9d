/* cdiffusers — GGUF files (llama.cpp / ggml's weight format): the reader and the writer. Part of
 * the model-file IO layer (cdiffusers/io.h); the ggml types themselves are in cdiffusers/ggml.h. */
#ifndef CDIFFUSERS_GGUF_H
#define CDIFFUSERS_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cdiffusers/error.h"
#include "cdiffusers/ggml.h"
#include "cdiffusers/safetensors.h" /* CDF_ST_MAX_DIMS */

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------
 * GGUF reader (llama.cpp / ggml's weight format; versions 2 and 3, little-endian)
 *
 * cdf_gguf_open maps the file read-only and validates everything before returning: the magic
 * and version, the tensor and key/value counts against the bytes that remain, every string
 * length and value type (arrays nest at most CDF_GGUF_MAX_ARRAY_DEPTH deep), general.alignment
 * (a u32 power of two, default 32), every tensor's dims (1..CDF_ST_MAX_DIMS, no overflow, the
 * row a whole number of blocks), its type (a ggml type id this library knows the block layout
 * of; an unknown id is an error naming the tensor) and its data (offset aligned, inside the
 * file, no two tensors overlapping, no duplicate names). After a successful open every tensor's
 * bytes can be read through the mapping. Types are known to the reader even when they cannot be
 * dequantized (IQ*, TQ*, ...): cdf_ggml_dequantize refuses those with a message.
 *
 * Shapes are given in torch order (outermost first), i.e. GGUF's ne[] reversed: a linear
 * weight [out, in] has ne = {in, out} in the file, and blocks run along the last torch dim.
 * ---------------------------------------------------------------------------------------- */
#define CDF_GGUF_MAX_ARRAY_DEPTH 8
#define CDF_GGUF_MAX_STRING_BYTES (64ull * 1024 * 1024) /* one key, name or string value */

typedef struct cdf_gguf_file cdf_gguf_file;

typedef struct cdf_gguf_tensor {
    const char *name;      /* owned by the file; valid until cdf_gguf_close */
    uint32_t type;         /* ggml type id */
    int ndim;
    int64_t shape[CDF_ST_MAX_DIMS]; /* torch order */
    uint64_t offset;       /* from the start of the data section (a multiple of the alignment) */
    uint64_t nbytes;       /* numel / block size * type size */
} cdf_gguf_tensor;

/* Errors: CDF_ERR_NOT_FOUND, CDF_ERR_IO (as cdf_st_open), CDF_ERR_FORMAT (anything malformed or
 * truncated; the message names the file, the byte offset and the key or tensor),
 * CDF_ERR_UNSUPPORTED (version 1, big-endian files), CDF_ERR_LIMIT (a string over
 * CDF_GGUF_MAX_STRING_BYTES or arrays nested too deep), CDF_ERR_INVALID_ARG. */
cdf_status cdf_gguf_open(const char *path, cdf_gguf_file **out);
void cdf_gguf_close(cdf_gguf_file *f); /* NULL is fine */
const char *cdf_gguf_path(const cdf_gguf_file *f);
uint32_t cdf_gguf_version(const cdf_gguf_file *f);
uint64_t cdf_gguf_alignment(const cdf_gguf_file *f);
int cdf_gguf_count(const cdf_gguf_file *f);
/* Tensors in the file's order; NULL if i is out of range. */
const cdf_gguf_tensor *cdf_gguf_tensor_at(const cdf_gguf_file *f, int i);
/* NULL (no error recorded) if absent. */
const cdf_gguf_tensor *cdf_gguf_find(const cdf_gguf_file *f, const char *name);
int64_t cdf_gguf_numel(const cdf_gguf_tensor *t);
/* Zero-copy pointer into the mapping (not counted); cdf_gguf_touch counts t->nbytes. */
const void *cdf_gguf_data(const cdf_gguf_file *f, const cdf_gguf_tensor *t);
const void *cdf_gguf_touch(const cdf_gguf_file *f, const cdf_gguf_tensor *t);

/* Key/value metadata, in file order. The value type is GGUF's (0 u8 ... 8 string, 9 array,
 * 10 u64, 11 i64, 12 f64). */
int cdf_gguf_kv_count(const cdf_gguf_file *f);
const char *cdf_gguf_kv_key_at(const cdf_gguf_file *f, int i);
int cdf_gguf_kv_type(const cdf_gguf_file *f, const char *key); /* -1 if absent */
/* A string value (NUL-terminated copy owned by the file), NULL if absent or not a string. */
const char *cdf_gguf_get_string(const cdf_gguf_file *f, const char *key);
/* An integer or bool value that fits int64_t; false if absent or another type. */
bool cdf_gguf_get_int(const cdf_gguf_file *f, const char *key, int64_t *out);
/* An array's element type and count; false if absent or not an array. */
bool cdf_gguf_get_array_info(const cdf_gguf_file *f, const char *key, int *elem_type, uint64_t *count);

/* ------------------------------------------------------------------------------------------
 * GGUF writer (version 3, little-endian), as gguf-py's GGUFWriter lays files out: header, the
 * key/values in the order set, the tensor infos in the order added, zero padding to the
 * alignment, then each tensor's bytes at its aligned offset (zero padding between them). The file
 * is written to a temporary next to the target and renamed into place (cdf_atomic_file): a
 * failure leaves no partial output. Tensor data is not copied at add: either the pointer given
 * stays valid until save, or (data NULL) save asks `fill` for the tensor's bytes, one tensor at a
 * time, so a converter never holds more than one converted tensor.
 * ---------------------------------------------------------------------------------------- */
typedef struct cdf_gguf_writer cdf_gguf_writer;
/* Writes tensor `index`'s nbytes bytes into buf (called in add order during save). */
typedef cdf_status (*cdf_gguf_fill_fn)(void *ctx, int index, void *buf, uint64_t nbytes);

/* alignment: a power of two, 0 = GGUF's default 32 (other values are stored as general.alignment).
 * NULL if out of memory. */
cdf_gguf_writer *cdf_gguf_writer_new(uint32_t alignment);
void cdf_gguf_writer_free(cdf_gguf_writer *w); /* NULL is fine */
/* Metadata (keys unique: a repeated key is CDF_ERR_INVALID_ARG). */
cdf_status cdf_gguf_writer_set_string(cdf_gguf_writer *w, const char *key, const char *value);
cdf_status cdf_gguf_writer_set_u32(cdf_gguf_writer *w, const char *key, uint32_t value);
/* A tensor of ggml type `type`, shape in torch order (the file gets it reversed); the last dim
 * must be a whole number of the type's blocks. data: the bytes (numel / block * block bytes), or
 * NULL to have save call fill. Errors: CDF_ERR_INVALID_ARG (empty or repeated name, unknown
 * type, bad shape, rows not whole blocks), CDF_ERR_OUT_OF_MEMORY. */
cdf_status cdf_gguf_writer_add(cdf_gguf_writer *w, const char *name, uint32_t type, int ndim, const int64_t *shape,
                               const void *data);
int cdf_gguf_writer_count(const cdf_gguf_writer *w);
/* Bytes the file will take. */
uint64_t cdf_gguf_writer_file_size(const cdf_gguf_writer *w);
/* Write the file. overwrite: replace an existing file (else CDF_ERR_IO naming it). Errors:
 * CDF_ERR_IO (cannot create or write: the message names the path and why; nothing is left at
 * path), a status from fill (its message kept), CDF_ERR_INVALID_ARG (a tensor without data and no
 * fill), CDF_ERR_OUT_OF_MEMORY. */
cdf_status cdf_gguf_writer_save(const cdf_gguf_writer *w, const char *path, bool overwrite, cdf_gguf_fill_fn fill, void *ctx);

#ifdef __cplusplus
}
#endif
#endif
