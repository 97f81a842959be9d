/* JSON loading over cJSON, with the limits cJSON does not enforce for us, and typed getters
 * whose errors say which key of which file is wrong. */
#include "cdiffusers/io.h"
#include "core/error_internal.h"
#include "io/io_internal.h"
#include "io/json.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* cJSON's parser recurses once per nesting level; hostile input like 10^5 '[' would exhaust the
 * stack long before cJSON's own limit matters on small thread stacks, so the depth is checked
 * here with a flat scan first. Brackets inside strings do not count. */
cdf_status cdf_json_check_depth_desc(const char *text, size_t len, int max_depth, const char *desc) {
    int depth = 0;
    bool in_string = false;
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (in_string) {
            if (c == '\\') i++; /* skip the escaped character (\" must not end the string) */
            else if (c == '"') in_string = false;
            continue;
        }
        if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            if (++depth > max_depth)
                return cdf_error(CDF_ERR_LIMIT, "%s nests deeper than the limit of %d levels (at byte %zu)",
                                 desc, max_depth, i);
        } else if (c == ']' || c == '}') {
            if (depth > 0) depth--;
        }
    }
    return CDF_OK;
}

cdf_status cdf_json_check_depth(const char *text, size_t len, int max_depth, const char *source) {
    char desc[1100];
    snprintf(desc, sizeof desc, "JSON '%s'", source ? source : "<text>");
    return cdf_json_check_depth_desc(text, len, max_depth, desc);
}

static void line_col(const char *text, size_t pos, int *line, int *col) {
    int l = 1, c = 1;
    for (size_t i = 0; i < pos; i++) {
        if (text[i] == '\n') { l++; c = 1; } else c++;
    }
    *line = l;
    *col = c;
}

cdf_status cdf_json_parse_desc(const char *text, size_t len, const char *desc, const char *tag,
                              cJSON **out) {
    if (!out) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_json_parse: out is NULL");
    *out = NULL;
    if (!text && len) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_json_parse: NULL text");
    CDF_TRY(cdf_json_check_depth_desc(text, len, CDF_JSON_MAX_DEPTH, desc));
    size_t ws = 0;
    while (ws < len && (text[ws] == ' ' || text[ws] == '\t' || text[ws] == '\r' || text[ws] == '\n')) ws++;
    if (ws == len) return cdf_error(CDF_ERR_FORMAT, "%s is empty", desc);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!root) {
        size_t pos = end && end >= text && end <= text + len ? (size_t)(end - text) : 0;
        int line, col;
        line_col(text, pos, &line, &col);
        return cdf_error(CDF_ERR_FORMAT, "%s is not valid JSON: syntax error at line %d, column %d",
                         desc, line, col);
    }
    size_t pos = (size_t)(end - text);
    while (pos < len && (text[pos] == ' ' || text[pos] == '\t' || text[pos] == '\r' || text[pos] == '\n'))
        pos++;
    if (pos < len) {
        int line, col;
        line_col(text, pos, &line, &col);
        cJSON_Delete(root);
        return cdf_error(CDF_ERR_FORMAT,
                         "%s is not valid JSON: unexpected data after the value at line %d, column %d",
                         desc, line, col);
    }
    if (tag) {
        /* Tag the root with its source so getter errors on it can name the file; cJSON frees
         * `string` with the node (and replaces it if the node is ever added to an object). */
        root->string = strdup(tag);
    }
    *out = root;
    return CDF_OK;
}

cdf_status cdf_json_parse(const char *text, size_t len, const char *source, cJSON **out) {
    char desc[1100];
    snprintf(desc, sizeof desc, "JSON '%s'", source ? source : "<text>");
    return cdf_json_parse_desc(text, len, desc, source, out);
}

cdf_status cdf_json_load_file(const char *path, cJSON **out) {
    if (!out) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_json_load_file: out is NULL");
    *out = NULL;
    if (!path) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_json_load_file: path is NULL");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int err = errno;
        if (err == ENOENT)
            return cdf_error(CDF_ERR_NOT_FOUND, "JSON file '%s' does not exist", path);
        return cdf_error(CDF_ERR_IO, "cannot open JSON file '%s': %s", path, strerror(err));
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        int err = errno;
        bool is_dir = S_ISDIR(st.st_mode);
        close(fd);
        if (is_dir) return cdf_error(CDF_ERR_IO, "JSON path '%s' is a folder, not a file", path);
        return cdf_error(CDF_ERR_IO, "JSON path '%s' is not a regular file (%s)", path,
                         strerror(err ? err : EINVAL));
    }
    if ((uint64_t)st.st_size > CDF_JSON_MAX_FILE_BYTES) {
        close(fd);
        return cdf_error(CDF_ERR_LIMIT, "JSON file '%s' is %lld bytes, over the limit of %llu bytes",
                         path, (long long)st.st_size, (unsigned long long)CDF_JSON_MAX_FILE_BYTES);
    }
    size_t cap = (size_t)st.st_size + 1, len = 0;
    char *buf = malloc(cap);
    if (!buf) {
        close(fd);
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes for JSON file '%s'", cap, path);
    }
    /* read to EOF (not just st_size bytes) in case the file grows, still bounded by the limit */
    for (;;) {
        if (len + 1 >= cap) {
            if (cap > CDF_JSON_MAX_FILE_BYTES) {
                free(buf);
                close(fd);
                return cdf_error(CDF_ERR_LIMIT, "JSON file '%s' is over the limit of %llu bytes",
                                 path, (unsigned long long)CDF_JSON_MAX_FILE_BYTES);
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                close(fd);
                return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of memory reading JSON file '%s'", path);
            }
            buf = nb;
            cap *= 2;
        }
        ssize_t r = read(fd, buf + len, cap - 1 - len);
        if (r < 0) {
            if (errno == EINTR) continue;
            int err = errno;
            free(buf);
            close(fd);
            return cdf_error(CDF_ERR_IO, "cannot read JSON file '%s': %s", path, strerror(err));
        }
        if (r == 0) break;
        len += (size_t)r;
    }
    close(fd);
    if (len > CDF_JSON_MAX_FILE_BYTES) {
        free(buf);
        return cdf_error(CDF_ERR_LIMIT, "JSON file '%s' is over the limit of %llu bytes", path,
                         (unsigned long long)CDF_JSON_MAX_FILE_BYTES);
    }
    buf[len] = 0;
    char desc[1100];
    snprintf(desc, sizeof desc, "JSON file '%s'", path);
    cdf_status s = cdf_json_parse_desc(buf, len, desc, path, out);
    free(buf);
    return s;
}

/* ---- typed getters ---- */

static const char *type_name(const cJSON *v) {
    if (cJSON_IsNull(v)) return "null";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsObject(v)) return "an object";
    return "an invalid value";
}

/* "in 'config.json'" for a tagged root (a root has no siblings), "in object 'text_config'" for a
 * nested object. */
static const char *where(const cJSON *obj, char *buf, size_t n) {
    if (obj->string && !obj->prev && !obj->next) snprintf(buf, n, "in '%s'", obj->string);
    else if (obj->string) snprintf(buf, n, "in object '%s'", obj->string);
    else snprintf(buf, n, "in a JSON object");
    return buf;
}

static cdf_status type_error(const cJSON *obj, const char *key, const char *expected, const cJSON *v) {
    char w[1200];
    return cdf_error(CDF_ERR_FORMAT, "JSON key '%s' %s: expected %s, got %s", key,
                     where(obj, w, sizeof w), expected, type_name(v));
}

/* Looks key up; *v = NULL when absent or null (-> default). */
static cdf_status lookup(const cJSON *obj, const char *key, const char *fn, const cJSON **v) {
    *v = NULL;
    if (!key) return cdf_error(CDF_ERR_INVALID_ARG, "%s: key is NULL", fn);
    if (!obj || !cJSON_IsObject(obj))
        return cdf_error(CDF_ERR_INVALID_ARG, "%s('%s'): not called on a JSON object (%s)", fn, key,
                         obj ? type_name(obj) : "NULL");
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (item && !cJSON_IsNull(item)) *v = item;
    return CDF_OK;
}

bool cdf_json_has(const cJSON *obj, const char *key) {
    if (!obj || !key || !cJSON_IsObject(obj)) return false;
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, key);
    return item && !cJSON_IsNull(item);
}

#define CDF_JSON_INT_LIMIT 9007199254740992.0 /* 2^53: every integer below is exact in a double */

/* Validates a number node as an exact integer; the message names key[index] when index >= 0. */
static cdf_status to_int(const cJSON *obj, const char *key, int index, const cJSON *v, int64_t *out) {
    char w[1200], k[256];
    if (index >= 0) snprintf(k, sizeof k, "%s[%d]", key, index);
    else snprintf(k, sizeof k, "%s", key);
    if (!cJSON_IsNumber(v)) return type_error(obj, k, "an integer", v);
    double d = v->valuedouble;
    if (!isfinite(d) || fabs(d) >= CDF_JSON_INT_LIMIT)
        return cdf_error(CDF_ERR_FORMAT,
                         "JSON key '%s' %s: integer %g is too large (the magnitude must be below "
                         "2^53)",
                         k, where(obj, w, sizeof w), d);
    if (floor(d) != d)
        return cdf_error(CDF_ERR_FORMAT, "JSON key '%s' %s: expected an integer, got %.17g", k,
                         where(obj, w, sizeof w), d);
    *out = (int64_t)d;
    return CDF_OK;
}

static cdf_status to_double(const cJSON *obj, const char *key, int index, const cJSON *v, double *out) {
    char w[1200], k[256];
    if (index >= 0) snprintf(k, sizeof k, "%s[%d]", key, index);
    else snprintf(k, sizeof k, "%s", key);
    if (!cJSON_IsNumber(v)) return type_error(obj, k, "a number", v);
    if (!isfinite(v->valuedouble))
        return cdf_error(CDF_ERR_FORMAT, "JSON key '%s' %s: number is out of the double range", k,
                         where(obj, w, sizeof w));
    *out = v->valuedouble;
    return CDF_OK;
}

cdf_status cdf_json_get_int(const cJSON *obj, const char *key, int64_t def, int64_t *out) {
    if (!out) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_json_get_int: out is NULL");
    const cJSON *v;
    CDF_TRY(lookup(obj, key, "cdf_json_get_int", &v));
    if (!v) { *out = def; return CDF_OK; }
    return to_int(obj, key, -1, v, out);
}

cdf_status cdf_json_get_double(const cJSON *obj, const char *key, double def, double *out) {
    if (!out) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_json_get_double: out is NULL");
    const cJSON *v;
    CDF_TRY(lookup(obj, key, "cdf_json_get_double", &v));
    if (!v) { *out = def; return CDF_OK; }
    return to_double(obj, key, -1, v, out);
}

cdf_status cdf_json_get_bool(const cJSON *obj, const char *key, bool def, bool *out) {
    if (!out) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_json_get_bool: out is NULL");
    const cJSON *v;
    CDF_TRY(lookup(obj, key, "cdf_json_get_bool", &v));
    if (!v) { *out = def; return CDF_OK; }
    if (!cJSON_IsBool(v)) return type_error(obj, key, "a boolean", v);
    *out = cJSON_IsTrue(v);
    return CDF_OK;
}

cdf_status cdf_json_get_string(const cJSON *obj, const char *key, const char *def, const char **out) {
    if (!out) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_json_get_string: out is NULL");
    const cJSON *v;
    CDF_TRY(lookup(obj, key, "cdf_json_get_string", &v));
    if (!v) { *out = def; return CDF_OK; }
    if (!cJSON_IsString(v) || !v->valuestring) return type_error(obj, key, "a string", v);
    *out = v->valuestring;
    return CDF_OK;
}

/* Shared by the array getters: the array node (NULL = absent/null) after type and size checks. */
static cdf_status get_array(const cJSON *obj, const char *key, const char *fn, int max, int *n,
                            const cJSON **arr) {
    *arr = NULL;
    if (!n) return cdf_error(CDF_ERR_INVALID_ARG, "%s: n is NULL", fn);
    if (max < 0) return cdf_error(CDF_ERR_INVALID_ARG, "%s: negative max %d", fn, max);
    const cJSON *v;
    CDF_TRY(lookup(obj, key, fn, &v));
    if (!v) { *n = 0; return CDF_OK; }
    if (!cJSON_IsArray(v)) return type_error(obj, key, "an array", v);
    int count = 0;
    for (const cJSON *e = v->child; e; e = e->next) count++;
    if (count > max) {
        char w[1200];
        return cdf_error(CDF_ERR_LIMIT, "JSON key '%s' %s: array has %d elements, at most %d allowed",
                         key, where(obj, w, sizeof w), count, max);
    }
    *arr = v;
    return CDF_OK;
}

cdf_status cdf_json_get_int_array(const cJSON *obj, const char *key, int64_t *out, int max, int *n) {
    const cJSON *arr;
    CDF_TRY(get_array(obj, key, "cdf_json_get_int_array", max, n, &arr));
    if (!arr) return CDF_OK;
    if (!out && arr->child) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_json_get_int_array: out is NULL");
    int i = 0;
    /* validate everything before writing so *out is untouched on error */
    for (const cJSON *e = arr->child; e; e = e->next, i++) {
        int64_t tmp;
        CDF_TRY(to_int(obj, key, i, e, &tmp));
    }
    i = 0;
    for (const cJSON *e = arr->child; e; e = e->next, i++) to_int(obj, key, i, e, &out[i]);
    *n = i;
    return CDF_OK;
}

cdf_status cdf_json_get_double_array(const cJSON *obj, const char *key, double *out, int max, int *n) {
    const cJSON *arr;
    CDF_TRY(get_array(obj, key, "cdf_json_get_double_array", max, n, &arr));
    if (!arr) return CDF_OK;
    if (!out && arr->child)
        return cdf_error(CDF_ERR_INVALID_ARG, "cdf_json_get_double_array: out is NULL");
    int i = 0;
    for (const cJSON *e = arr->child; e; e = e->next, i++) {
        double tmp;
        CDF_TRY(to_double(obj, key, i, e, &tmp));
    }
    i = 0;
    for (const cJSON *e = arr->child; e; e = e->next, i++) to_double(obj, key, i, e, &out[i]);
    *n = i;
    return CDF_OK;
}
