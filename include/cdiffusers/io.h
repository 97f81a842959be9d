/* cdiffusers — model-file IO: safetensors (cdiffusers/safetensors.h), checkpoint folders
 * (checkpoint.h), GGUF and ggml types (gguf.h, ggml.h), PNG (png.h); this header includes them
 * all and holds the layer's read counters.
 *
 * This is the bottom layer: it knows dtypes and error codes, nothing about tensors or devices.
 * Every function that can fail returns a cdf_status and records a message (cdf_last_error())
 * that names the file, the tensor or key, and the offending size or limit. Nothing here aborts
 * on bad input; every size read from a file is checked before it is used. */
#ifndef CDIFFUSERS_IO_H
#define CDIFFUSERS_IO_H

#include <stdint.h>

#include "cdiffusers/checkpoint.h"
#include "cdiffusers/ggml.h"
#include "cdiffusers/gguf.h"
#include "cdiffusers/png.h"
#include "cdiffusers/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Process-wide count of tensor bytes read from weight files by cdf_st_read* and cdf_st_touch
 * (header parsing and cdf_st_data are not counted). Atomic; reset affects every thread. */
uint64_t cdf_io_bytes_read(void);
void cdf_io_reset_counters(void);

#ifdef __cplusplus
}
#endif
#endif
