/* JSON loading with typed getters over cJSON trees (private: cJSON's types stay out of the
 * public headers; the library, the CLI, the tests and the fuzzers include this). */
#ifndef CDF_IO_JSON_H
#define CDF_IO_JSON_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cdiffusers/error.h"

#define CDF_JSON_MAX_FILE_BYTES (64ull * 1024 * 1024) /* cdf_json_load_file */
#define CDF_JSON_MAX_DEPTH 128                        /* nesting of [ and { */

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

#endif
