/* Helpers shared by the io/ sources (not part of the public API). */
#ifndef CDF_IO_INTERNAL_H
#define CDF_IO_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "cdiffusers/error.h"

/* malloc'd folder part of a path ("." if none); NULL if out of memory. */
char *cdf_io_dirname(const char *path);
/* A CDF_ERR_IO message for a failed file creation that explains errno in terms of the folder. */
cdf_status cdf_io_create_error(const char *what, const char *path, int err);
struct cJSON;
/* JSON parsing with a caller-worded description for messages ("header of safetensors file 'x'")
 * and an optional tag stored in the root's `string` (see cdf_json_load_file). */
cdf_status cdf_json_parse_desc(const char *text, size_t len, const char *desc, const char *tag,
                              struct cJSON **out);
cdf_status cdf_json_check_depth_desc(const char *text, size_t len, int max_depth, const char *desc);
/* Opens `path` read-only and maps the whole file (min_bytes >= 1). Messages call it
 * "<kind> file '<path>'"; a shorter file is CDF_ERR_FORMAT "... shorter than <min_what>
 * (truncated?)". On failure nothing stays open. */
cdf_status cdf_io_map_file(const char *path, const char *kind, size_t min_bytes, const char *min_what, int *fd,
                           const uint8_t **map, size_t *size);
/* Lets the kernel take back the pages of [p, p + n) inside a mapping cdf_io_map_file made, once
 * their bytes have been copied elsewhere (the weights on the device): without it every page a
 * load reads stays resident in the process until the file is unmapped, so loading a model holds
 * it twice (the copy + the mapped file) at the peak. Only pages wholly inside the range are
 * dropped (a neighbouring tensor may still be read from a shared page). Safe for any range of
 * those mappings: they are read-only and private, never written, so a later read faults the
 * file's bytes back in. Advisory: a failure changes nothing but the resident size. */
void cdf_io_drop_pages(const void *p, size_t n);
/* Adds to the process-wide counter behind cdf_io_bytes_read(). */
void cdf_io_count_bytes(uint64_t n);

#endif
