/* PNG output (atomic, with tEXt/iTXt generation parameters) and a small reader for tests and
 * tools. libpng reports errors by longjmp; every libpng call sits behind a setjmp whose error
 * path frees what was allocated and removes the temporary file. */
#include "cdiffusers/io.h"
#include "core/error_internal.h"
#include "io/io_internal.h"
#include "io/atomic_file.h"

#include <errno.h>
#include <png.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct png_err_ctx {
    jmp_buf jmp;
    char msg[512];
} png_err_ctx;

static void on_png_error(png_structp png, png_const_charp msg) {
    png_err_ctx *ctx = png_get_error_ptr(png);
    snprintf(ctx->msg, sizeof ctx->msg, "%s", msg ? msg : "libpng error");
    longjmp(ctx->jmp, 1);
}

static void on_png_warning(png_structp png, png_const_charp msg) { (void)png; (void)msg; }

/* PNG keyword rules (PNG spec 11.3.4.2): 1-79 Latin-1 printable characters, no leading,
 * trailing or consecutive spaces. */
static bool valid_keyword(const char *k) {
    size_t n = strlen(k);
    if (n < 1 || n > 79 || k[0] == ' ' || k[n - 1] == ' ') return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)k[i];
        if (!((c >= 32 && c <= 126) || c >= 161)) return false;
        if (c == ' ' && k[i + 1] == ' ') return false;
    }
    return true;
}

static bool is_ascii(const char *s) {
    for (; *s; s++)
        if ((unsigned char)*s >= 0x80) return false;
    return true;
}

/* libpng's output: a growing buffer in memory. */
typedef struct png_mem {
    uint8_t *data;
    size_t len, cap;
} png_mem;

static void on_png_write(png_structp png, png_bytep bytes, png_size_t n) {
    png_mem *m = png_get_io_ptr(png);
    if (n > SIZE_MAX - m->len) png_error(png, "PNG larger than the address space");
    if (m->len + n > m->cap) {
        size_t cap = m->cap ? m->cap : 4096;
        while (cap < m->len + n) cap = cap > SIZE_MAX / 2 ? m->len + n : cap * 2;
        uint8_t *d = realloc(m->data, cap);
        if (!d) png_error(png, "out of memory for the PNG");
        m->data = d;
        m->cap = cap;
    }
    memcpy(m->data + m->len, bytes, n);
    m->len += n;
}

static void on_png_flush(png_structp png) { (void)png; }

/* Checks the arguments; `what` names the output in messages ("cdf_png_write('x.png')"). */
static cdf_status check_png_args(const char *what, int width, int height, int channels, const uint8_t *pixels,
                                 const char *const *text_keys, const char *const *text_values, int n_text) {
    if (width < 1 || height < 1 || width > CDF_PNG_MAX_SIDE || height > CDF_PNG_MAX_SIDE)
        return cdf_error(CDF_ERR_INVALID_ARG, "%s: size %dx%d outside 1..%d", what, width, height, CDF_PNG_MAX_SIDE);
    if (channels != 1 && channels != 3 && channels != 4)
        return cdf_error(CDF_ERR_INVALID_ARG, "%s: %d channels (1, 3 or 4 supported)", what, channels);
    if (!pixels) return cdf_error(CDF_ERR_INVALID_ARG, "%s: pixels is NULL", what);
    if (n_text < 0 || (n_text > 0 && (!text_keys || !text_values)))
        return cdf_error(CDF_ERR_INVALID_ARG, "%s: bad text arrays", what);
    for (int i = 0; i < n_text; i++) {
        if (!text_keys[i] || !text_values[i]) return cdf_error(CDF_ERR_INVALID_ARG, "%s: text entry %d is NULL", what, i);
        if (!valid_keyword(text_keys[i]))
            return cdf_error(CDF_ERR_INVALID_ARG,
                             "%s: text key '%s' is not a valid PNG keyword (1-79 "
                             "printable Latin-1 characters, no leading/trailing/double spaces)",
                             what, text_keys[i]);
    }
    return CDF_OK;
}

/* The one encoder behind cdf_png_write and cdf_png_encode, so a file and a buffer written with
 * the same arguments hold the same bytes. Arguments already checked. */
static cdf_status encode(const char *what, int width, int height, int channels, const uint8_t *pixels,
                         const char *const *text_keys, const char *const *text_values, int n_text, png_mem *m) {
    png_err_ctx ctx = {0};
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &ctx, on_png_error, on_png_warning);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    png_text *volatile texts = NULL;
    if (!png || !info) {
        png_destroy_write_struct(png ? &png : NULL, NULL);
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "%s: cannot create libpng writer", what);
    }
    if (setjmp(ctx.jmp)) {
        png_destroy_write_struct(&png, &info);
        free(texts);
        free(m->data);
        memset(m, 0, sizeof *m);
        return cdf_error(CDF_ERR_IO, "%s: encoding the PNG failed: %s", what, ctx.msg);
    }
    png_set_write_fn(png, m, on_png_write, on_png_flush);
    int color = channels == 1 ? PNG_COLOR_TYPE_GRAY : channels == 3 ? PNG_COLOR_TYPE_RGB : PNG_COLOR_TYPE_RGBA;
    png_set_IHDR(png, info, (png_uint_32)width, (png_uint_32)height, 8, color, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    if (n_text > 0) {
        texts = calloc((size_t)n_text, sizeof(png_text));
        if (!texts) png_error(png, "out of memory for text chunks");
        for (int i = 0; i < n_text; i++) {
            png_text *t = &texts[i];
            t->key = (png_charp)text_keys[i];
            t->text = (png_charp)text_values[i];
            if (is_ascii(text_values[i])) {
                t->compression = PNG_TEXT_COMPRESSION_NONE; /* tEXt */
                t->text_length = strlen(text_values[i]);
            } else {
                t->compression = PNG_ITXT_COMPRESSION_NONE; /* iTXt: UTF-8 */
                t->itxt_length = strlen(text_values[i]);
                t->lang = NULL;
                t->lang_key = NULL;
            }
        }
        png_set_text(png, info, texts, n_text);
    }
    png_write_info(png, info);
    size_t stride = (size_t)width * (size_t)channels;
    for (int y = 0; y < height; y++) png_write_row(png, (png_const_bytep)(pixels + (size_t)y * stride));
    png_write_end(png, info);
    png_destroy_write_struct(&png, &info);
    free(texts);
    return CDF_OK;
}

cdf_status cdf_png_encode(int width, int height, int channels, const uint8_t *pixels, const char *const *text_keys,
                          const char *const *text_values, int n_text, uint8_t **out, size_t *out_len) {
    if (!out || !out_len) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_png_encode: out is NULL");
    *out = NULL;
    *out_len = 0;
    CDF_TRY(check_png_args("cdf_png_encode", width, height, channels, pixels, text_keys, text_values, n_text));
    png_mem m = {0};
    CDF_TRY(encode("cdf_png_encode", width, height, channels, pixels, text_keys, text_values, n_text, &m));
    *out = m.data;
    *out_len = m.len;
    return CDF_OK;
}

cdf_status cdf_png_write(const char *path, int width, int height, int channels, const uint8_t *pixels,
                         const char *const *text_keys, const char *const *text_values, int n_text,
                         bool overwrite) {
    if (!path || !path[0]) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_png_write: empty path");
    char what[512];
    snprintf(what, sizeof what, "cdf_png_write('%s')", path);
    CDF_TRY(check_png_args(what, width, height, channels, pixels, text_keys, text_values, n_text));
    cdf_atomic_file *af = NULL;
    CDF_TRY(cdf_atomic_file_open(path, overwrite, &af));
    png_mem m = {0};
    cdf_status s = encode(what, width, height, channels, pixels, text_keys, text_values, n_text, &m);
    if (s == CDF_OK && fwrite(m.data, 1, m.len, cdf_atomic_file_stream(af)) != m.len)
        s = cdf_error(CDF_ERR_IO, "writing PNG '%s' failed: %s", path, strerror(errno));
    free(m.data);
    if (s != CDF_OK) {
        cdf_atomic_file_abort(af);
        return s;
    }
    return cdf_atomic_file_commit(af);
}

/* ---- reader ---- */

void cdf_png_image_free(cdf_png_image *img) {
    if (!img) return;
    free(img->pixels);
    for (int i = 0; i < img->n_text; i++) {
        free(img->text_keys[i]);
        free(img->text_values[i]);
    }
    free(img->text_keys);
    free(img->text_values);
    memset(img, 0, sizeof *img);
}

const char *cdf_png_image_text(const cdf_png_image *img, const char *key) {
    if (!img || !key) return NULL;
    for (int i = 0; i < img->n_text; i++)
        if (strcmp(img->text_keys[i], key) == 0) return img->text_values[i];
    return NULL;
}

/* Appends libpng's current text chunks (those not yet taken) to img. */
static bool take_text(png_structp png, png_infop info, cdf_png_image *img) {
    png_textp text = NULL;
    int n = 0;
    png_get_text(png, info, &text, &n);
    if (n <= img->n_text) return true;
    char **k = realloc(img->text_keys, (size_t)n * sizeof *k);
    if (!k) return false;
    img->text_keys = k;
    char **v = realloc(img->text_values, (size_t)n * sizeof *v);
    if (!v) return false;
    img->text_values = v;
    for (int i = img->n_text; i < n; i++) {
        size_t len = text[i].compression >= PNG_ITXT_COMPRESSION_NONE ? text[i].itxt_length : text[i].text_length;
        img->text_keys[i] = strdup(text[i].key ? text[i].key : "");
        img->text_values[i] = malloc(len + 1);
        if (!img->text_keys[i] || !img->text_values[i]) {
            free(img->text_keys[i]);
            free(img->text_values[i]);
            return false;
        }
        if (len) memcpy(img->text_values[i], text[i].text, len);
        img->text_values[i][len] = 0;
        img->n_text = i + 1;
    }
    return true;
}

/* Memory source for libpng's reader. */
typedef struct png_src {
    const uint8_t *data;
    size_t len, pos;
} png_src;

static void on_png_read(png_structp png, png_bytep bytes, png_size_t n) {
    png_src *src = png_get_io_ptr(png);
    if (n > src->len - src->pos) png_error(png, "the data ends before the image does (truncated PNG)");
    memcpy(bytes, src->data + src->pos, n);
    src->pos += n;
}

/* The one decoder behind cdf_png_read and cdf_png_read_memory: from fp, or from src when fp is
 * NULL. The 8 signature bytes are already read and checked. name says what in messages
 * ("PNG file 'x.png'", "image"). */
static cdf_status decode(const char *name, FILE *fp, png_src *src, cdf_png_image *out) {
    png_err_ctx ctx = {0};
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &ctx, on_png_error, on_png_warning);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    png_bytep *volatile rows = NULL;
    if (!png || !info) {
        png_destroy_read_struct(png ? &png : NULL, NULL, NULL);
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "%s: cannot create libpng reader", name);
    }
    if (setjmp(ctx.jmp)) {
        png_destroy_read_struct(&png, &info, NULL);
        free(rows);
        cdf_png_image_free(out);
        return cdf_error(CDF_ERR_FORMAT, "%s is corrupt or unsupported: %s", name, ctx.msg);
    }
    if (fp) png_init_io(png, fp);
    else png_set_read_fn(png, src, on_png_read);
    png_set_sig_bytes(png, 8);
    png_read_info(png, info);
    png_uint_32 w = png_get_image_width(png, info), h = png_get_image_height(png, info);
    if (w > CDF_PNG_MAX_SIDE || h > CDF_PNG_MAX_SIDE) {
        png_destroy_read_struct(&png, &info, NULL);
        cdf_png_image_free(out);
        return cdf_error(CDF_ERR_LIMIT, "%s is %ux%u, over the limit of %d per side", name, (unsigned)w, (unsigned)h,
                         CDF_PNG_MAX_SIDE);
    }
    int color = png_get_color_type(png, info), depth = png_get_bit_depth(png, info);
    if (depth == 16) png_set_strip_16(png);
    if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    if (png_get_valid(png, info, PNG_INFO_tRNS)) png_set_tRNS_to_alpha(png);
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    int ch = png_get_channels(png, info);
    size_t rowbytes = png_get_rowbytes(png, info);
    if (ch < 1 || ch > 4 || rowbytes != (size_t)w * (size_t)ch) png_error(png, "unexpected pixel layout");
    if (!take_text(png, info, out)) png_error(png, "out of memory for text chunks");
    out->pixels = malloc(rowbytes * h);
    rows = malloc(sizeof(png_bytep) * h);
    if (!out->pixels || !rows) png_error(png, "out of memory for pixels");
    for (png_uint_32 y = 0; y < h; y++) rows[y] = out->pixels + (size_t)y * rowbytes;
    png_read_image(png, rows);
    png_read_end(png, info); /* text chunks after the image data */
    if (!take_text(png, info, out)) png_error(png, "out of memory for text chunks");
    out->width = (int)w;
    out->height = (int)h;
    out->channels = ch;
    png_destroy_read_struct(&png, &info, NULL);
    free(rows);
    return CDF_OK;
}

cdf_status cdf_png_read(const char *path, cdf_png_image *out) {
    if (!out) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_png_read: out is NULL");
    memset(out, 0, sizeof *out);
    if (!path) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_png_read: path is NULL");
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        int err = errno;
        if (err == ENOENT) return cdf_error(CDF_ERR_NOT_FOUND, "PNG file '%s' does not exist", path);
        return cdf_error(CDF_ERR_IO, "cannot open PNG file '%s': %s", path, strerror(err));
    }
    uint8_t sig[8];
    if (fread(sig, 1, 8, fp) != 8 || png_sig_cmp(sig, 0, 8) != 0) {
        fclose(fp);
        return cdf_error(CDF_ERR_FORMAT, "'%s' is not a PNG file (bad signature)", path);
    }
    char name[4200];
    snprintf(name, sizeof name, "PNG file '%s'", path);
    cdf_status s = decode(name, fp, NULL, out);
    fclose(fp);
    return s;
}

cdf_status cdf_png_read_memory(const uint8_t *data, size_t len, const char *what, cdf_png_image *out) {
    if (!out) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_png_read_memory: out is NULL");
    memset(out, 0, sizeof *out);
    if (!what) what = "PNG data";
    if (!data && len) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_png_read_memory: data is NULL");
    if (len < 8 || png_sig_cmp(data, 0, 8) != 0) return cdf_error(CDF_ERR_FORMAT, "%s is not a PNG (bad signature)", what);
    png_src src = {.data = data, .len = len, .pos = 8};
    return decode(what, NULL, &src, out);
}
