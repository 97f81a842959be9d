/* `cdiffusers serve`: request parsing and validation (see serve_parse.h). */
#include "serve_parse.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cdiffusers/io.h"
#include "cdiffusers/pipeline.h"
#include "core/error_internal.h"
#include "io/json.h"

void serve_request_free(serve_request *r) {
    if (!r) return;
    free(r->prompt);
    free(r->negative_prompt);
    free(r->cache);
    free(r->image);
    free(r->mask);
    memset(r, 0, sizeof *r);
}

static void request_init(serve_request *r, serve_api api, bool img2img) {
    memset(r, 0, sizeof *r);
    r->api = api;
    r->img2img = img2img;
    r->guidance = -1.0;
    r->seed = -1;
    r->n = 1;
    r->strength = -1.0;
    snprintf(r->image_name, sizeof r->image_name, "%s", api == SERVE_API_A1111 ? "init_image.png" : "image.png");
    snprintf(r->mask_name, sizeof r->mask_name, "mask.png");
}

/* A multipart file name as the PNG text shows it: its last path component, if any. */
static void take_file_name(const char *filename, char *out, size_t n) {
    const char *slash = strrchr(filename, '/'), *base = slash ? slash + 1 : filename;
    if (*base) snprintf(out, n, "%s", base);
}

/* ---- text --------------------------------------------------------------------------------- */
static bool valid_utf8(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint8_t c = s[i];
        size_t k = c < 0x80 ? 0 : (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : (c & 0xF8) == 0xF0 ? 3 : 4;
        if (k == 4 || (k == 1 && c < 0xC2) || (k == 3 && c > 0xF4) || i + k >= n) return false;
        uint32_t cp = k == 0 ? c : k == 1 ? c & 0x1F : k == 2 ? c & 0x0F : c & 0x07;
        for (size_t j = 1; j <= k; j++) {
            if (i + j >= n || (s[i + j] & 0xC0) != 0x80) return false;
            cp = cp << 6 | (s[i + j] & 0x3F);
        }
        if ((k == 2 && cp < 0x800) || (k == 3 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF))
            return false;
        i += k + 1;
    }
    return true;
}

/* A copy of a text field: at most SERVE_MAX_TEXT bytes of UTF-8 without NUL. */
static cdf_status take_text(const char *key, const char *s, size_t n, char **out) {
    if (n > SERVE_MAX_TEXT)
        return cdf_error(CDF_ERR_LIMIT, "'%s' is %zu bytes, over the limit of %d", key, n, SERVE_MAX_TEXT);
    if (memchr(s, 0, n) || !valid_utf8((const uint8_t *)s, n))
        return cdf_error(CDF_ERR_FORMAT, "'%s' must be UTF-8 text without NUL characters", key);
    char *c = malloc(n + 1);
    if (!c) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of memory copying '%s'", key);
    memcpy(c, s, n);
    c[n] = 0;
    free(*out);
    *out = c;
    return CDF_OK;
}

/* ---- numbers from text (multipart fields) ------------------------------------------------- */
/* The field as a C string in buf: false for an empty one or one of size bytes or more. */
static bool field_cstr(const char *s, size_t n, char *buf, size_t size) {
    if (n == 0 || n >= size) return false;
    memcpy(buf, s, n);
    buf[n] = 0;
    return true;
}

static cdf_status text_int(const char *key, const char *s, size_t n, int64_t lo, int64_t hi, int64_t *out) {
    char buf[32], *end;
    if (!field_cstr(s, n, buf, sizeof buf)) return cdf_error(CDF_ERR_FORMAT, "'%s' must be an integer", key);
    errno = 0;
    long long v = strtoll(buf, &end, 10);
    if (errno || *end || end == buf || isspace((unsigned char)buf[0])) return cdf_error(CDF_ERR_FORMAT, "'%s' must be an integer, got '%s'", key, buf);
    if (v < lo || v > hi) return cdf_error(CDF_ERR_INVALID_ARG, "'%s' must be between %lld and %lld (got %lld)", key, (long long)lo, (long long)hi, v);
    *out = v;
    return CDF_OK;
}

static cdf_status text_double(const char *key, const char *s, size_t n, double lo, double hi, double *out) {
    char buf[64], *end;
    if (!field_cstr(s, n, buf, sizeof buf)) return cdf_error(CDF_ERR_FORMAT, "'%s' must be a number", key);
    errno = 0;
    const double v = strtod(buf, &end);
    if (errno || *end || end == buf || !isfinite(v) || isspace((unsigned char)buf[0]))
        return cdf_error(CDF_ERR_FORMAT, "'%s' must be a finite number, got '%s'", key, buf);
    if (v < lo || v > hi) return cdf_error(CDF_ERR_INVALID_ARG, "'%s' must be between %g and %g (got %g)", key, lo, hi, v);
    *out = v;
    return CDF_OK;
}

/* ---- JSON fields -------------------------------------------------------------------------- */
static const cJSON *field(const cJSON *o, const char *key) {
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(o, key);
    return e && !cJSON_IsNull(e) ? e : NULL;
}

static cdf_status json_text(const cJSON *o, const char *key, bool required, char **out) {
    const cJSON *e = field(o, key);
    if (!e) return required ? cdf_error(CDF_ERR_INVALID_ARG, "'%s' is required", key) : CDF_OK;
    if (!cJSON_IsString(e)) return cdf_error(CDF_ERR_FORMAT, "'%s' must be a string", key);
    return take_text(key, e->valuestring, strlen(e->valuestring), out);
}

/* A string field whose value is not used (accepted for compatibility); only its type is checked. */
static cdf_status json_ignored_text(const cJSON *o, const char *key) {
    const cJSON *e = field(o, key);
    if (e && !cJSON_IsString(e)) return cdf_error(CDF_ERR_FORMAT, "'%s' must be a string", key);
    return CDF_OK;
}

static cdf_status json_int(const cJSON *o, const char *key, int64_t lo, int64_t hi, int64_t *out) {
    if (!field(o, key)) return CDF_OK;
    int64_t v;
    if (cdf_json_get_int(o, key, 0, &v) != CDF_OK) return cdf_error(CDF_ERR_FORMAT, "'%s' must be an integer", key);
    if (v < lo || v > hi) return cdf_error(CDF_ERR_INVALID_ARG, "'%s' must be between %lld and %lld (got %lld)", key, (long long)lo, (long long)hi, (long long)v);
    *out = v;
    return CDF_OK;
}

static cdf_status json_double(const cJSON *o, const char *key, double lo, double hi, double *out, bool *given) {
    if (!field(o, key)) return CDF_OK;
    double v;
    if (cdf_json_get_double(o, key, 0, &v) != CDF_OK || !isfinite(v)) return cdf_error(CDF_ERR_FORMAT, "'%s' must be a finite number", key);
    if (v < lo || v > hi) return cdf_error(CDF_ERR_INVALID_ARG, "'%s' must be between %g and %g (got %g)", key, lo, hi, v);
    *out = v;
    if (given) *given = true;
    return CDF_OK;
}

/* A \u0000 escape inside a JSON string: cJSON would cut the string there, silently. */
static bool has_nul_escape(const char *t, size_t n) {
    bool in = false;
    for (size_t i = 0; i < n; i++) {
        if (!in) {
            in = t[i] == '"';
        } else if (t[i] == '"') {
            in = false;
        } else if (t[i] == '\\' && i + 1 < n) {
            if (t[i + 1] == 'u' && i + 5 < n && memcmp(t + i + 2, "0000", 4) == 0) return true;
            i++;
        }
    }
    return false;
}

static cdf_status parse_object(const char *body, size_t len, cJSON **root) {
    *root = NULL;
    if (has_nul_escape(body, len))
        return cdf_error(CDF_ERR_FORMAT, "text fields must be UTF-8 text without NUL characters (\\u0000)");
    CDF_TRY(cdf_json_parse(body, len, "request body", root));
    if (!cJSON_IsObject(*root)) {
        cJSON_Delete(*root);
        *root = NULL;
        return cdf_error(CDF_ERR_FORMAT, "the request body must be a JSON object");
    }
    return CDF_OK;
}

#define SEED_MAX ((int64_t)1 << 53) /* integers JSON numbers hold exactly */

/* The fields the OpenAI requests share (JSON); the multipart edit reads the same names as text. */
static cdf_status response_format_ok(const char *v) {
    if (strcmp(v, "b64_json") == 0) return CDF_OK;
    if (strcmp(v, "url") == 0)
        return cdf_error(CDF_ERR_UNSUPPORTED, "response_format 'url' is not supported: this server keeps no files; use "
                                              "'b64_json' (the default)");
    return cdf_error(CDF_ERR_INVALID_ARG, "response_format must be 'b64_json', got '%.64s'", v);
}

static cdf_status output_format_ok(const char *v) {
    if (strcmp(v, "png") == 0) return CDF_OK;
    return cdf_error(CDF_ERR_UNSUPPORTED, "output_format '%.64s' is not supported: this server writes PNG", v);
}

cdf_status serve_parse_size(const char *s, int *w, int *h) {
    if (strcmp(s, "auto") == 0) {
        *w = *h = 0;
        return CDF_OK;
    }
    long v[2];
    const char *p = s;
    for (int i = 0; i < 2; i++) {
        if (!isdigit((unsigned char)*p)) goto bad;
        v[i] = 0;
        for (; isdigit((unsigned char)*p); p++) {
            v[i] = v[i] * 10 + (*p - '0');
            if (v[i] > SERVE_MAX_SIDE) goto bad;
        }
        if (v[i] < 1) goto bad;
        if (i == 0 && *p++ != 'x') goto bad;
    }
    if (*p) goto bad;
    *w = (int)v[0];
    *h = (int)v[1];
    return CDF_OK;
bad:
    return cdf_error(CDF_ERR_INVALID_ARG, "size must be \"WIDTHxHEIGHT\" (e.g. \"64x64\", each side 1..%d) or \"auto\", got \"%.32s\"",
                     SERVE_MAX_SIDE, s);
}

/* the request's step cache ("cache"): what generate --cache takes (cdf_pipeline_cache_check) */
static cdf_status cache_ok(const char *cache) {
    cdf_status s = cache ? cdf_pipeline_cache_check(cache) : CDF_OK;
    if (s != CDF_OK) cdf_error_prefix("field 'cache': ");
    return s;
}

cdf_status serve_parse_generation(const char *body, size_t len, serve_request *out) {
    request_init(out, SERVE_API_OPENAI, false);
    cJSON *root;
    CDF_TRY(parse_object(body, len, &root));
    int64_t n = 1, seed = -1, steps = 0;
    char *size = NULL, *fmt = NULL, *ofmt = NULL;
    bool given = false;
    cdf_status s = json_text(root, "prompt", true, &out->prompt);
    if (s == CDF_OK) s = json_text(root, "negative_prompt", false, &out->negative_prompt);
    if (s == CDF_OK) s = json_int(root, "n", 1, SERVE_MAX_IMAGES, &n);
    if (s == CDF_OK) s = json_text(root, "size", false, &size);
    if (s == CDF_OK && size) s = serve_parse_size(size, &out->width, &out->height);
    if (s == CDF_OK) s = json_text(root, "response_format", false, &fmt);
    if (s == CDF_OK && fmt) s = response_format_ok(fmt);
    if (s == CDF_OK) s = json_text(root, "output_format", false, &ofmt);
    if (s == CDF_OK && ofmt) s = output_format_ok(ofmt);
    static const char *const ignored[] = {"model", "quality", "style", "user", "background", "moderation"};
    for (size_t i = 0; s == CDF_OK && i < sizeof ignored / sizeof *ignored; i++) s = json_ignored_text(root, ignored[i]);
    if (s == CDF_OK) s = json_int(root, "seed", -1, SEED_MAX, &seed);
    if (s == CDF_OK) s = json_int(root, "steps", 1, 1 << 20, &steps);
    if (s == CDF_OK) s = json_double(root, "guidance", 0, 1e6, &out->guidance, NULL);
    if (s == CDF_OK) s = json_double(root, "true_cfg_scale", 0, 1e6, &out->true_cfg_scale, &given);
    out->have_true_cfg = given;
    if (s == CDF_OK) s = json_text(root, "cache", false, &out->cache);
    if (s == CDF_OK) s = cache_ok(out->cache);
    out->n = (int)n;
    out->seed = seed;
    out->steps = (int)steps;
    free(size);
    free(fmt);
    free(ofmt);
    cJSON_Delete(root);
    if (s != CDF_OK) serve_request_free(out);
    return s;
}

/* ---- images ------------------------------------------------------------------------------- */
cdf_status serve_png_size(const uint8_t *d, size_t n, const char *what, int *w, int *h) {
    static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
    if (n < 8 || memcmp(d, sig, 8) != 0) return cdf_error(CDF_ERR_FORMAT, "%s is not a PNG image (bad signature)", what);
    if (n < 33 || memcmp(d + 12, "IHDR", 4) != 0 || d[8] || d[9] || d[10] || d[11] != 13)
        return cdf_error(CDF_ERR_FORMAT, "%s is a truncated or corrupt PNG (no IHDR chunk)", what);
    uint32_t W = (uint32_t)d[16] << 24 | (uint32_t)d[17] << 16 | (uint32_t)d[18] << 8 | d[19];
    uint32_t H = (uint32_t)d[20] << 24 | (uint32_t)d[21] << 16 | (uint32_t)d[22] << 8 | d[23];
    if (W < 1 || H < 1 || W > SERVE_MAX_IMAGE_SIDE || H > SERVE_MAX_IMAGE_SIDE)
        return cdf_error(CDF_ERR_LIMIT, "%s is %ux%u, outside 1..%d per side", what, (unsigned)W, (unsigned)H,
                         SERVE_MAX_IMAGE_SIDE);
    *w = (int)W;
    *h = (int)H;
    return CDF_OK;
}

static const char b64_chars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *serve_base64_encode(const uint8_t *d, size_t n, size_t *out_len) {
    size_t len = (n + 2) / 3 * 4;
    char *o = malloc(len + 1);
    if (!o) return NULL;
    size_t j = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)d[i] << 16 | (i + 1 < n ? (uint32_t)d[i + 1] << 8 : 0) | (i + 2 < n ? d[i + 2] : 0);
        o[j++] = b64_chars[v >> 18 & 63];
        o[j++] = b64_chars[v >> 12 & 63];
        o[j++] = i + 1 < n ? b64_chars[v >> 6 & 63] : '=';
        o[j++] = i + 2 < n ? b64_chars[v & 63] : '=';
    }
    o[j] = 0;
    if (out_len) *out_len = j;
    return o;
}

cdf_status serve_base64_decode(const char *s, size_t n, const char *what, uint8_t **out, size_t *out_len) {
    *out = NULL;
    *out_len = 0;
    if (n >= 5 && strncmp(s, "data:", 5) == 0) { /* a data URL: the payload after ";base64," */
        const char *comma = memchr(s, ',', n);
        if (!comma || comma - s < 12 || strncmp(comma - 7, ";base64", 7) != 0)
            return cdf_error(CDF_ERR_FORMAT, "%s: a data URL must be base64 (data:image/png;base64,...)", what);
        n -= (size_t)(comma + 1 - s);
        s = comma + 1;
    }
    while (n && s[n - 1] == '=') n--;
    if (n % 4 == 1) return cdf_error(CDF_ERR_FORMAT, "%s is not valid base64 (bad length)", what);
    uint8_t *o = malloc(n / 4 * 3 + 3);
    if (!o) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of memory decoding %s", what);
    size_t j = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        const char *p = s[i] ? strchr(b64_chars, s[i]) : NULL;
        if (!p) {
            free(o);
            return cdf_error(CDF_ERR_FORMAT, "%s is not valid base64 (character %zu)", what, i);
        }
        acc = acc << 6 | (uint32_t)(p - b64_chars);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            o[j++] = (uint8_t)(acc >> bits);
            acc &= (1u << bits) - 1;
        }
    }
    *out = o;
    *out_len = j;
    return CDF_OK;
}

static cdf_status take_image(const char *what, const uint8_t *d, size_t n, uint8_t **out, size_t *out_len, int *w, int *h) {
    int W = 0, H = 0;
    CDF_TRY(serve_png_size(d, n, what, &W, &H));
    uint8_t *c = malloc(n);
    if (!c) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of memory copying %s", what);
    memcpy(c, d, n);
    free(*out);
    *out = c;
    *out_len = n;
    if (w) *w = W, *h = H;
    return CDF_OK;
}

/* ---- AUTOMATIC1111 -------------------------------------------------------------------------- */
static cdf_status a1111_image(const cJSON *e, const char *what, serve_request *r, bool mask) {
    if (!cJSON_IsString(e)) return cdf_error(CDF_ERR_FORMAT, "%s must be a base64 string", what);
    uint8_t *png;
    size_t n;
    CDF_TRY(serve_base64_decode(e->valuestring, strlen(e->valuestring), what, &png, &n));
    cdf_status s = mask ? take_image(what, png, n, &r->mask, &r->mask_len, NULL, NULL)
                        : take_image(what, png, n, &r->image, &r->image_len, &r->image_width, &r->image_height);
    free(png);
    return s;
}

cdf_status serve_parse_a1111(const char *body, size_t len, bool img2img, serve_request *out) {
    request_init(out, SERVE_API_A1111, img2img);
    cJSON *root;
    CDF_TRY(parse_object(body, len, &root));
    int64_t w = 0, h = 0, steps = 0, seed = -1, batch = 1, iters = 1;
    cdf_status s = json_text(root, "prompt", false, &out->prompt);
    if (s == CDF_OK && !out->prompt) s = take_text("prompt", "", 0, &out->prompt); /* A1111: "" by default */
    if (s == CDF_OK) s = json_text(root, "negative_prompt", false, &out->negative_prompt);
    if (s == CDF_OK) s = json_int(root, "width", 1, SERVE_MAX_SIDE, &w);
    if (s == CDF_OK) s = json_int(root, "height", 1, SERVE_MAX_SIDE, &h);
    if (s == CDF_OK) s = json_int(root, "steps", 1, 1 << 20, &steps);
    if (s == CDF_OK) s = json_double(root, "cfg_scale", 0, 1e6, &out->guidance, NULL);
    if (s == CDF_OK) s = json_double(root, "true_cfg_scale", 0, 1e6, &out->true_cfg_scale, &out->have_true_cfg);
    if (s == CDF_OK) s = json_text(root, "cache", false, &out->cache);
    if (s == CDF_OK) s = cache_ok(out->cache);
    if (s == CDF_OK) s = json_int(root, "seed", -1, SEED_MAX, &seed);
    if (s == CDF_OK) s = json_int(root, "batch_size", 1, SERVE_MAX_IMAGES, &batch);
    if (s == CDF_OK) s = json_int(root, "n_iter", 1, SERVE_MAX_IMAGES, &iters);
    if (s == CDF_OK && batch * iters > SERVE_MAX_IMAGES)
        s = cdf_error(CDF_ERR_LIMIT, "batch_size * n_iter is %lld, over the limit of %d images per request",
                      (long long)(batch * iters), SERVE_MAX_IMAGES);
    if (s == CDF_OK) s = json_ignored_text(root, "sampler_name");
    if (s == CDF_OK && img2img) {
        const cJSON *imgs = field(root, "init_images");
        if (!cJSON_IsArray(imgs) || cJSON_GetArraySize(imgs) != 1)
            s = cdf_error(CDF_ERR_INVALID_ARG, "init_images must be an array of one base64 PNG image");
        else s = a1111_image(cJSON_GetArrayItem(imgs, 0), "init_images[0]", out, false);
        const cJSON *mask = field(root, "mask");
        if (s == CDF_OK && mask) s = a1111_image(mask, "mask", out, true);
        out->strength = 0.75; /* A1111's default denoising strength */
        if (s == CDF_OK) s = json_double(root, "denoising_strength", 0, 1, &out->strength, NULL);
    }
    out->width = (int)w;
    out->height = (int)h;
    out->steps = (int)steps;
    out->seed = seed;
    out->n = (int)(batch * iters);
    cJSON_Delete(root);
    if (s != CDF_OK) serve_request_free(out);
    return s;
}

/* ---- multipart/form-data ---------------------------------------------------------------------- */
/* The value of parameter `name` in a header value like `form-data; name="x"; filename="y"`
 * (case-insensitive name, quoted or token value); false when absent or too long. */
static bool header_param(const char *v, const char *name, char *out, size_t n) {
    size_t nl = strlen(name);
    for (const char *p = strchr(v, ';'); p; p = strchr(p + 1, ';')) {
        const char *q = p + 1;
        while (*q == ' ' || *q == '\t') q++;
        if (strncasecmp(q, name, nl) != 0 || q[nl] != '=') continue;
        q += nl + 1;
        size_t k = 0;
        if (*q == '"') {
            for (q++; *q && *q != '"'; q++) {
                if (*q == '\\' && q[1]) q++;
                if (k + 1 >= n) return false;
                out[k++] = *q;
            }
            if (*q != '"') return false;
        } else {
            for (; *q && *q != ';' && *q != ' ' && *q != '\t'; q++) {
                if (k + 1 >= n) return false;
                out[k++] = *q;
            }
        }
        out[k] = 0;
        return true;
    }
    return false;
}

static cdf_status part_headers(const char *h, size_t n, serve_part *p) {
    char line[SERVE_MAX_PART_HEADER + 1];
    bool disposition = false;
    for (size_t i = 0; i < n;) {
        const char *e = memchr(h + i, '\n', n - i);
        size_t k = e ? (size_t)(e - (h + i)) : n - i;
        size_t len = k && h[i + k - 1] == '\r' ? k - 1 : k;
        memcpy(line, h + i, len);
        line[len] = 0;
        i += k + 1;
        if (memchr(line, 0, len)) return cdf_error(CDF_ERR_FORMAT, "multipart: a part header contains a NUL byte");
        char *colon = strchr(line, ':');
        if (!colon) return cdf_error(CDF_ERR_FORMAT, "multipart: malformed part header line");
        *colon = 0;
        char *v = colon + 1;
        while (*v == ' ' || *v == '\t') v++;
        if (strcasecmp(line, "Content-Disposition") == 0) {
            if (strncasecmp(v, "form-data", 9) != 0) return cdf_error(CDF_ERR_FORMAT, "multipart: Content-Disposition must be form-data");
            if (!header_param(v, "name", p->name, sizeof p->name) || !p->name[0])
                return cdf_error(CDF_ERR_FORMAT, "multipart: a part has no (or too long a) name");
            if (strstr(v, "filename") && !header_param(v, "filename", p->filename, sizeof p->filename)) p->filename[0] = 0;
            disposition = true;
        } else if (strcasecmp(line, "Content-Type") == 0) {
            snprintf(p->content_type, sizeof p->content_type, "%s", v);
        }
    }
    if (!disposition) return cdf_error(CDF_ERR_FORMAT, "multipart: a part has no Content-Disposition header");
    return CDF_OK;
}

/* The next delimiter (CRLF "--" boundary) at or after p that is followed by "--" or by optional
 * padding and CRLF: a boundary-like run inside a part's data is data. */
static const uint8_t *find_delimiter(const uint8_t *p, const uint8_t *end, const char *delim, size_t dl) {
    for (; p < end && (p = memmem(p, (size_t)(end - p), delim, dl)); p++) {
        const uint8_t *q = p + dl;
        if (end - q >= 2 && q[0] == '-' && q[1] == '-') return p;
        while (q < end && (*q == ' ' || *q == '\t')) q++;
        if (end - q >= 2 && q[0] == '\r' && q[1] == '\n') return p;
    }
    return NULL;
}

cdf_status serve_multipart_parse(const char *content_type, const uint8_t *body, size_t len, serve_part *parts, int max, int *n) {
    *n = 0;
    if (!content_type || strncasecmp(content_type, "multipart/form-data", 19) != 0)
        return cdf_error(CDF_ERR_FORMAT, "the request must be multipart/form-data");
    char boundary[80] = "\r\n--"; /* every delimiter after the first is preceded by CRLF */
    if (!header_param(content_type + 19, "boundary", boundary + 4, sizeof boundary - 4) || !boundary[4] || strlen(boundary + 4) > 70)
        return cdf_error(CDF_ERR_FORMAT, "multipart/form-data needs a boundary of 1 to 70 characters");
    const size_t bl = strlen(boundary);
    /* the first delimiter may start the body (no CRLF before it) */
    const uint8_t *p;
    if (len >= bl - 2 && memcmp(body, boundary + 2, bl - 2) == 0) p = body + bl - 2;
    else {
        p = find_delimiter(body, body + len, boundary, bl);
        if (!p) return cdf_error(CDF_ERR_FORMAT, "multipart: the boundary never occurs in the body");
        p += bl;
    }
    const uint8_t *end = body + len;
    for (;;) {
        if (end - p >= 2 && p[0] == '-' && p[1] == '-') return CDF_OK; /* the close delimiter */
        while (p < end && (*p == ' ' || *p == '\t')) p++;               /* transport padding */
        if (end - p < 2 || p[0] != '\r' || p[1] != '\n') return cdf_error(CDF_ERR_FORMAT, "multipart: malformed delimiter line");
        p += 2;
        if (*n >= max) return cdf_error(CDF_ERR_LIMIT, "multipart: more than %d parts", max);
        if (end - p >= 2 && p[0] == '\r' && p[1] == '\n')
            return cdf_error(CDF_ERR_FORMAT, "multipart: a part has no headers (Content-Disposition is required)");
        const uint8_t *hend = memmem(p, (size_t)(end - p), "\r\n\r\n", 4);
        if (!hend) return cdf_error(CDF_ERR_FORMAT, "multipart: a part's headers never end");
        serve_part *part = &parts[*n];
        memset(part, 0, sizeof *part);
        size_t hl = (size_t)(hend - p);
        if (hl > SERVE_MAX_PART_HEADER) return cdf_error(CDF_ERR_LIMIT, "multipart: part headers over %d bytes", SERVE_MAX_PART_HEADER);
        CDF_TRY(part_headers((const char *)p, hl, part));
        const uint8_t *data = hend + 4;
        const uint8_t *next = find_delimiter(data, end, boundary, bl);
        if (!next) return cdf_error(CDF_ERR_FORMAT, "multipart: part '%s' is not closed by the boundary", part->name);
        part->data = data;
        part->len = (size_t)(next - data);
        (*n)++;
        p = next + bl;
    }
}

/* OpenAI edits: the same fields as generations, from multipart text parts, plus the images. */
cdf_status serve_parse_edit(const char *content_type, const uint8_t *body, size_t len, serve_request *out) {
    request_init(out, SERVE_API_OPENAI, true);
    serve_part *parts = calloc(SERVE_MAX_PARTS, sizeof *parts);
    if (!parts) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of memory parsing the form");
    int np = 0;
    cdf_status s = serve_multipart_parse(content_type, body, len, parts, SERVE_MAX_PARTS, &np);
    int64_t v;
    for (int i = 0; s == CDF_OK && i < np; i++) {
        const serve_part *p = &parts[i];
        const char *txt = (const char *)p->data;
        for (int j = 0; j < i; j++)
            if (strcmp(parts[j].name, p->name) == 0) s = cdf_error(CDF_ERR_INVALID_ARG, "field '%s' is given twice", p->name);
        if (s != CDF_OK) break;
        if (strcmp(p->name, "image") == 0 || strcmp(p->name, "image[]") == 0)
        {
            s = take_image("image", p->data, p->len, &out->image, &out->image_len, &out->image_width, &out->image_height);
            take_file_name(p->filename, out->image_name, sizeof out->image_name);
        } else if (strcmp(p->name, "mask") == 0) {
            s = take_image("mask", p->data, p->len, &out->mask, &out->mask_len, NULL, NULL);
            take_file_name(p->filename, out->mask_name, sizeof out->mask_name);
        }
        else if (strcmp(p->name, "prompt") == 0) s = take_text("prompt", txt, p->len, &out->prompt);
        else if (strcmp(p->name, "negative_prompt") == 0) s = take_text("negative_prompt", txt, p->len, &out->negative_prompt);
        else if (strcmp(p->name, "n") == 0) {
            if ((s = text_int("n", txt, p->len, 1, SERVE_MAX_IMAGES, &v)) == CDF_OK) out->n = (int)v;
        } else if (strcmp(p->name, "seed") == 0) {
            if ((s = text_int("seed", txt, p->len, -1, SEED_MAX, &v)) == CDF_OK) out->seed = v;
        } else if (strcmp(p->name, "steps") == 0) {
            if ((s = text_int("steps", txt, p->len, 1, 1 << 20, &v)) == CDF_OK) out->steps = (int)v;
        } else if (strcmp(p->name, "guidance") == 0) s = text_double("guidance", txt, p->len, 0, 1e6, &out->guidance);
        else if (strcmp(p->name, "strength") == 0) s = text_double("strength", txt, p->len, 0, 1, &out->strength);
        else if (strcmp(p->name, "cache") == 0) {
            if ((s = take_text("cache", txt, p->len, &out->cache)) == CDF_OK) s = cache_ok(out->cache);
        } else if (strcmp(p->name, "true_cfg_scale") == 0) {
            s = text_double("true_cfg_scale", txt, p->len, 0, 1e6, &out->true_cfg_scale);
            out->have_true_cfg = s == CDF_OK;
        } else if (strcmp(p->name, "size") == 0 || strcmp(p->name, "response_format") == 0 ||
                   strcmp(p->name, "output_format") == 0) {
            char *t = NULL;
            s = take_text(p->name, txt, p->len, &t);
            if (s == CDF_OK)
                s = p->name[0] == 's' ? serve_parse_size(t, &out->width, &out->height)
                    : p->name[0] == 'r' ? response_format_ok(t) : output_format_ok(t);
            free(t);
        }
        /* other fields (model, quality, user, ...) are accepted and not used */
    }
    if (s == CDF_OK && !out->image) s = cdf_error(CDF_ERR_INVALID_ARG, "'image' (a PNG file) is required");
    if (s == CDF_OK && !out->prompt) s = cdf_error(CDF_ERR_INVALID_ARG, "'prompt' is required");
    free(parts);
    if (s != CDF_OK) serve_request_free(out);
    return s;
}
