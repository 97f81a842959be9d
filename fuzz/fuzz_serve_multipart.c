/* Fuzz target: the multipart/form-data parser of `cdiffusers serve` (cli/serve_parse.c) and the
 * OpenAI edits request built on it. The input is "<Content-Type header>\n<body>" (no newline:
 * all of it is the body under a fixed boundary).
 *
 * Invariants: a failure leaves a message; every part found lies inside the body, in order, with
 * a non-empty NUL-terminated name; at most SERVE_MAX_PARTS parts; an edit request that parses
 * has a prompt and a PNG image whose header size was read, and a zeroed request on failure. */
#include "fuzz_common.h"
#include "serve_parse.h"

#define FIXED_TYPE "multipart/form-data; boundary=XyZ"

static void write_seeds(const char *dir) {
    uint8_t px[4 * 4 * 3] = {0};
    uint8_t *png = NULL;
    size_t pn = 0;
    if (cdf_png_encode(4, 4, 3, px, NULL, NULL, 0, &png, &pn) != CDF_OK) abort();
    static const char *head =
        "multipart/form-data; boundary=\"----b0undary\"\n"
        "------b0undary\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\nmake it red\r\n"
        "------b0undary\r\nContent-Disposition: form-data; name=\"n\"\r\n\r\n2\r\n"
        "------b0undary\r\nContent-Disposition: form-data; name=\"size\"\r\n\r\n64x64\r\n"
        "------b0undary\r\nContent-Disposition: form-data; name=\"image\"; filename=\"a.png\"\r\nContent-Type: image/png\r\n\r\n";
    static const char *tail = "\r\n------b0undary--\r\n";
    size_t hl = strlen(head), tl = strlen(tail);
    uint8_t *b = malloc(hl + pn + tl);
    if (!b) abort();
    memcpy(b, head, hl);
    memcpy(b + hl, png, pn);
    memcpy(b + hl + pn, tail, tl);
    fz_seed(dir, -1, b, hl + pn + tl);
    free(b);
    free(png);
    static const char *bodies[] = {
        "--XyZ\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\nx\r\n--XyZ--",
        "multipart/form-data; boundary=q\npreamble\r\n--q\r\ncontent-disposition: form-data; name=mask; filename=\"m.png\"\r\n\r\n"
        "\x89PNG\r\n\x1a\n\r\n--q \t\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\n\r\n--q--\r\nepilogue",
        "multipart/form-data; boundary=a\n--a\r\n\r\n\r\n--a--",
        "text/plain\nhello",
    };
    for (size_t i = 0; i < sizeof bodies / sizeof *bodies; i++) fz_seed(dir, -1, bodies[i], strlen(bodies[i]));
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fz_maybe_write_seeds(write_seeds);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nl = memchr(data, '\n', size < 256 ? size : 256);
    char ctype[257];
    const uint8_t *body = data;
    size_t blen = size;
    if (nl) {
        memcpy(ctype, data, (size_t)(nl - data));
        ctype[nl - data] = 0;
        body = nl + 1;
        blen = size - (size_t)(nl - data) - 1;
    } else {
        snprintf(ctype, sizeof ctype, "%s", FIXED_TYPE);
    }
    /* a private copy, so that ASan catches a read past the body */
    uint8_t *copy = malloc(blen ? blen : 1);
    FZ_CHECK(copy);
    if (blen) memcpy(copy, body, blen);
    serve_part parts[SERVE_MAX_PARTS];
    int n = -1;
    if (FZ_TRY(serve_multipart_parse(ctype, copy, blen, parts, SERVE_MAX_PARTS, &n)) == CDF_OK) {
        FZ_CHECK(n >= 0 && n <= SERVE_MAX_PARTS);
        const uint8_t *prev = copy;
        for (int i = 0; i < n; i++) {
            FZ_CHECK(parts[i].name[0] && strlen(parts[i].name) < sizeof parts[i].name);
            FZ_CHECK(parts[i].data >= prev && parts[i].data + parts[i].len <= copy + blen);
            prev = parts[i].data + parts[i].len;
        }
    } else {
        FZ_CHECK_MESSAGE();
    }
    serve_request r;
    if (FZ_TRY(serve_parse_edit(ctype, copy, blen, &r)) == CDF_OK) {
        FZ_CHECK(r.prompt && r.image && r.image_len >= 33 && r.image_width >= 1 && r.image_height >= 1);
        FZ_CHECK(r.img2img && r.n >= 1 && r.n <= SERVE_MAX_IMAGES);
    } else {
        FZ_CHECK_MESSAGE();
        FZ_CHECK(!r.prompt && !r.image && !r.mask);
    }
    serve_request_free(&r);
    free(copy);
    cdf_clear_error();
    return 0;
}
