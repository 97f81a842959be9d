/* cdiffusers — PNG write (atomic, with text chunks) and read (any PNG to 8-bit samples). Part of
 * the model-file IO layer (cdiffusers/io.h). */
#ifndef CDIFFUSERS_PNG_H
#define CDIFFUSERS_PNG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cdiffusers/error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CDF_PNG_MAX_SIDE 65535 /* width and height, write and read */

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

#ifdef __cplusplus
}
#endif
#endif
