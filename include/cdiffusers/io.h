/* cdiffusers — model-file IO: safetensors (read via mmap/pread, write atomically), sharded
 * checkpoint folders, JSON loading with typed getters, PNG write/read, atomic file creation.
 *
 * This is the bottom layer: it knows dtypes and error codes, nothing about tensors or devices.
 * Every function that can fail returns a cdf_status and records a message (cdf_last_error())
 * that names the file, the tensor or key, and the offending size or limit. Nothing here aborts
 * on bad input; every size read from a file is checked before it is used.
 *
 * Thread safety: an opened cdf_st_file / cdf_checkpoint is immutable, so any number of threads
 * may look tensors up and read from it concurrently (reads use pread; the byte counter is
 * atomic). Writers (cdf_st_writer, cdf_atomic_file) belong to one thread at a time. */
#ifndef CDIFFUSERS_IO_H
#define CDIFFUSERS_IO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cdiffusers/dtype.h"
#include "cdiffusers/error.h"

#ifdef __cplusplus
extern "C" {
#endif

struct cJSON; /* cJSON's node type (<cjson/cJSON.h>); only pointers cross this API */

/* ------------------------------------------------------------------------------------------
 * Safety limits (each violation is reported with the limit and the offending value)
 * ---------------------------------------------------------------------------------------- */
#define CDF_ST_MAX_DIMS 8                               /* dims per tensor */
#define CDF_ST_MAX_HEADER_BYTES (100ull * 1024 * 1024)  /* safetensors JSON header */
#define CDF_JSON_MAX_FILE_BYTES (64ull * 1024 * 1024)   /* cdf_json_load_file */
#define CDF_JSON_MAX_DEPTH 128                          /* nesting of [ and { */
#define CDF_PNG_MAX_SIDE 65535                          /* width and height, write and read */

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

/* Process-wide count of tensor bytes read from weight files by cdf_st_read* and cdf_st_touch
 * (header parsing and cdf_st_data are not counted). Atomic; reset affects every thread. */
uint64_t cdf_io_bytes_read(void);
void cdf_io_reset_counters(void);

/* ------------------------------------------------------------------------------------------
 * Checkpoint folder (one model component, e.g. "transformer/")
 *
 * cdf_checkpoint_open(path) accepts, in this order of preference:
 *   1. a path to a single .safetensors file;
 *   2. a folder with diffusion_pytorch_model.safetensors.index.json or
 *      model.safetensors.index.json (sharded: weight_map tensor -> shard file);
 *   3. a folder with diffusion_pytorch_model.safetensors or model.safetensors;
 *   4. a folder with exactly one *.safetensors.index.json;
 *   5. a folder with one or more *.safetensors files and no index (merged; a tensor name in two
 *      files is an error).
 * Shards are opened (mmap + header validation) eagerly, so every problem surfaces at open:
 * a shard name that is not a plain file name (contains '/' or '\\', or is "." or ".."),
 * a missing shard (CDF_ERR_NOT_FOUND), a mapped tensor absent from its shard (CDF_ERR_FORMAT).
 * The tensor list of a sharded checkpoint is the index's weight_map; tensors a shard holds but
 * the index does not map are not visible. Variant files (*.fp16.safetensors) get no special
 * treatment. Errors: CDF_ERR_NOT_FOUND (no weights found), plus those of cdf_st_open and
 * cdf_json_load_file.
 * ---------------------------------------------------------------------------------------- */
typedef struct cdf_checkpoint cdf_checkpoint;

cdf_status cdf_checkpoint_open(const char *path, cdf_checkpoint **out);
void cdf_checkpoint_close(cdf_checkpoint *ck); /* NULL is fine */
const char *cdf_checkpoint_path(const cdf_checkpoint *ck);
/* Tensor names, sorted (strcmp order). */
int cdf_checkpoint_count(const cdf_checkpoint *ck);
const char *cdf_checkpoint_name_at(const cdf_checkpoint *ck, int i);
/* i-th tensor in name order with its file; CDF_ERR_INVALID_ARG if i is out of range. */
cdf_status cdf_checkpoint_tensor_at(const cdf_checkpoint *ck, int i, const cdf_st_file **file,
                                    const cdf_st_tensor **t);
/* CDF_ERR_NOT_FOUND (message names the tensor and the folder) if absent. file may be NULL. */
cdf_status cdf_checkpoint_find(const cdf_checkpoint *ck, const char *name,
                               const cdf_st_file **file, const cdf_st_tensor **t);
bool cdf_checkpoint_has(const cdf_checkpoint *ck, const char *name); /* no error recorded */
int cdf_checkpoint_file_count(const cdf_checkpoint *ck);
const cdf_st_file *cdf_checkpoint_file_at(const cdf_checkpoint *ck, int i);

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

/* ggml type ids (the numbers stored in the file). */
enum {
    CDF_GGML_F32 = 0, CDF_GGML_F16 = 1, CDF_GGML_Q4_0 = 2, CDF_GGML_Q4_1 = 3, CDF_GGML_Q5_0 = 6,
    CDF_GGML_Q5_1 = 7, CDF_GGML_Q8_0 = 8, CDF_GGML_Q8_1 = 9, CDF_GGML_Q2_K = 10, CDF_GGML_Q3_K = 11,
    CDF_GGML_Q4_K = 12, CDF_GGML_Q5_K = 13, CDF_GGML_Q6_K = 14, CDF_GGML_Q8_K = 15, CDF_GGML_BF16 = 30,
};

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

/* ggml types: name ("Q4_K"; NULL for an id this library does not know), elements per block and
 * bytes per block (false if unknown). */
const char *cdf_ggml_type_name(uint32_t type);
bool cdf_ggml_type_block(uint32_t type, int64_t *block_elems, int64_t *block_bytes);
/* True for the types cdf_ggml_dequantize handles: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
 * Q2_K, Q3_K, Q4_K, Q5_K, Q6_K. */
bool cdf_ggml_can_dequantize(uint32_t type);
/* Decode n elements (a multiple of the type's block size) of raw blocks into f32, exactly as
 * the gguf Python package's gguf.quants.dequantize (bit for bit). src needs no alignment.
 * Errors: CDF_ERR_UNSUPPORTED (a type it cannot decode, named), CDF_ERR_INVALID_ARG. */
cdf_status cdf_ggml_dequantize(uint32_t type, const void *src, int64_t n, float *dst);
/* Encode n finite f32 values (a multiple of the block size) into blocks of `type`, bit for bit as
 * the reference encoders do: Q8_0 as the gguf Python package's gguf.quants.quantize (dst holds
 * n / 32 * 34 bytes); Q4_K as ggml's quantize_row_q4_K_ref, which is what llama-quantize writes
 * without an importance matrix (gguf-py has no Q4_K encoder; dst holds n / 256 * 144 bytes).
 * Errors: CDF_ERR_UNSUPPORTED (any other type, named), CDF_ERR_INVALID_ARG (n not a whole number
 * of blocks, a NaN or infinite value). */
cdf_status cdf_ggml_quantize(uint32_t type, const float *src, int64_t n, void *dst);

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

/* ------------------------------------------------------------------------------------------
 * JSON (cJSON trees)
 * ---------------------------------------------------------------------------------------- */
/* Read and parse a file. Errors: CDF_ERR_IO (cannot open/read; CDF_ERR_NOT_FOUND if it does not
 * exist), CDF_ERR_LIMIT (file > CDF_JSON_MAX_FILE_BYTES, or nesting deeper than
 * CDF_JSON_MAX_DEPTH, checked before cJSON sees the text), CDF_ERR_FORMAT (syntax error, with
 * line:column). The caller frees the tree with cJSON_Delete. The root's `string` field holds the
 * file path so that getter errors on the root object can name the file. */
cdf_status cdf_json_load_file(const char *path, struct cJSON **out);
/* Same for text in memory (len bytes, need not be NUL-terminated); source names it in messages. */
cdf_status cdf_json_parse(const char *text, size_t len, const char *source, struct cJSON **out);
/* CDF_OK if the nesting of [ and { outside strings never exceeds max_depth, else CDF_ERR_LIMIT. */
cdf_status cdf_json_check_depth(const char *text, size_t len, int max_depth, const char *source);

/* Typed getters on an object. A key that is absent or null yields the default and CDF_OK.
 * Wrong type, non-integer, |integer| > 2^53, non-finite number: CDF_ERR_FORMAT, message names
 * the key and the file (root object) or the enclosing key. obj not an object:
 * CDF_ERR_INVALID_ARG. *out is untouched on error. */
bool cdf_json_has(const struct cJSON *obj, const char *key); /* present and not null */
cdf_status cdf_json_get_int(const struct cJSON *obj, const char *key, int64_t def, int64_t *out);
cdf_status cdf_json_get_double(const struct cJSON *obj, const char *key, double def, double *out);
cdf_status cdf_json_get_bool(const struct cJSON *obj, const char *key, bool def, bool *out);
/* *out points into the tree (valid while it lives); def may be NULL. */
cdf_status cdf_json_get_string(const struct cJSON *obj, const char *key, const char *def,
                               const char **out);
/* Arrays: absent or null -> *n = 0. More than max elements: CDF_ERR_LIMIT. */
cdf_status cdf_json_get_int_array(const struct cJSON *obj, const char *key, int64_t *out, int max,
                                  int *n);
cdf_status cdf_json_get_double_array(const struct cJSON *obj, const char *key, double *out,
                                     int max, int *n);

/* ------------------------------------------------------------------------------------------
 * PNG
 * ---------------------------------------------------------------------------------------- */
/* Write an 8-bit PNG: channels 1 (gray), 3 (RGB) or 4 (RGBA); pixels row-major HWC.
 * Text chunks go before the image data: tEXt for ASCII values, iTXt (UTF-8) otherwise
 * (e.g. key "parameters" with the generation settings, which A1111-style tools display).
 * Keys: 1..79 printable Latin-1 characters without leading/trailing/double spaces.
 * Atomic: written to a temporary file in the same folder, fsync'ed and renamed; on any failure
 * the temporary file is removed and an existing file at path is left untouched.
 * Errors: CDF_ERR_IO when path exists and overwrite is false (message suggests --force), or the
 * folder is missing / not a folder / not writable (errno text); CDF_ERR_INVALID_ARG for bad
 * sizes, channels or text keys. */
cdf_status cdf_png_write(const char *path, int width, int height, int channels,
                         const uint8_t *pixels, const char *const *text_keys,
                         const char *const *text_values, int n_text, bool overwrite);
/* The same PNG in memory (byte for byte what cdf_png_write puts in a file for the same
 * arguments): *out is malloc'ed (free it), *out_len its size. Errors as cdf_png_write without
 * the file ones; nothing is returned on failure. */
cdf_status cdf_png_encode(int width, int height, int channels, const uint8_t *pixels, const char *const *text_keys,
                          const char *const *text_values, int n_text, uint8_t **out, size_t *out_len);

typedef struct cdf_png_image {
    int width, height, channels; /* channels 1, 2 (gray+alpha), 3 or 4; 8 bits each */
    uint8_t *pixels;             /* row-major HWC */
    int n_text;
    char **text_keys, **text_values; /* tEXt, zTXt and iTXt chunks, in file order */
} cdf_png_image;
/* Read any PNG into 8-bit samples (palette -> RGB(A), 16-bit -> 8-bit, low-bit gray -> 8-bit,
 * tRNS -> alpha). Errors: CDF_ERR_NOT_FOUND, CDF_ERR_IO, CDF_ERR_FORMAT (not a PNG / corrupt),
 * CDF_ERR_LIMIT (a side > CDF_PNG_MAX_SIDE). Free with cdf_png_image_free. */
cdf_status cdf_png_read(const char *path, cdf_png_image *out);
/* The same from a PNG in memory (data[0..len)); `what` names it in messages ("image").
 * CDF_ERR_FORMAT also for data that ends before the image does. */
cdf_status cdf_png_read_memory(const uint8_t *data, size_t len, const char *what, cdf_png_image *out);
void cdf_png_image_free(cdf_png_image *img);
/* The value of a text chunk, NULL if absent. */
const char *cdf_png_image_text(const cdf_png_image *img, const char *key);

/* ------------------------------------------------------------------------------------------
 * Atomic file creation (used by the writers above; usable for any output)
 *
 * open: creates "<path>.tmp.XXXXXX" in the same folder (mode 0666 & ~umask).
 * commit: flush + fsync + close, then rename over path (or, without overwrite, a rename that
 *   fails if path appeared meanwhile); fsyncs the folder. Frees af whether or not it succeeds;
 *   on failure the temporary file is removed.
 * abort: removes the temporary file and frees af (NULL is fine).
 * If the process dies in between, a stale *.tmp.XXXXXX file can remain; nothing else changes.
 * ---------------------------------------------------------------------------------------- */
typedef struct cdf_atomic_file cdf_atomic_file;

cdf_status cdf_atomic_file_open(const char *path, bool overwrite, cdf_atomic_file **out);
FILE *cdf_atomic_file_stream(cdf_atomic_file *af);
const char *cdf_atomic_file_temp_path(const cdf_atomic_file *af);
cdf_status cdf_atomic_file_commit(cdf_atomic_file *af);
void cdf_atomic_file_abort(cdf_atomic_file *af);

#ifdef __cplusplus
}
#endif
#endif
