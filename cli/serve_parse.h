/* `cdiffusers serve`: request bodies -> a validated request (cli/serve_parse.c). No sockets, no
 * pipeline: pure functions over bytes, so that fuzz/fuzz_serve_*.c can drive them. Every failure
 * returns a cdf_status with a message (cdf_last_error) a client can act on; the server answers it
 * with 400. The checks that need the loaded model (size multiple, size and step limits) are the
 * pipeline's own (cdf_pipeline_validate), made by the server after these. */
#ifndef CDF_CLI_SERVE_PARSE_H
#define CDF_CLI_SERVE_PARSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cdiffusers/error.h"

#define SERVE_MAX_TEXT (32 * 1024) /* bytes of a prompt / negative prompt / other text field */
#define SERVE_MAX_IMAGES 8         /* images per request (n, batch_size * n_iter) */
#define SERVE_MAX_PARTS 32         /* multipart parts */
#define SERVE_MAX_PART_HEADER 4096 /* bytes of one part's headers */
#define SERVE_MAX_SIDE 65535       /* request width/height before the pipeline's own limit */
/* An input image's (or mask's) width/height, checked from its PNG header before it is decoded:
 * a small body must not unpack into gigabytes (the pipeline generates at most 4096 a side). */
#define SERVE_MAX_IMAGE_SIDE 4096

typedef enum serve_api { SERVE_API_OPENAI = 0, SERVE_API_A1111 = 1 } serve_api;

typedef struct serve_request {
    serve_api api;
    bool img2img;             /* an edit / img2img request */
    char *prompt;             /* malloc'ed, never NULL after a successful parse */
    char *negative_prompt;    /* NULL = not given (the model's default applies) */
    int width, height;        /* 0 = the model's default */
    int steps;                /* 0 = default */
    double guidance;          /* < 0 = default */
    double true_cfg_scale;    /* with have_true_cfg */
    bool have_true_cfg;
    int64_t seed;             /* -1 = a random seed */
    int n;                    /* images, 1..SERVE_MAX_IMAGES */
    double strength;          /* img2img denoising strength in [0, 1]; < 0 = default */
    char *cache;              /* step cache ("first-block:0.1", "none"), checked; NULL = the server's --cache */
    uint8_t *image, *mask;    /* img2img: the PNG bytes (malloc'ed), mask optional */
    size_t image_len, mask_len;
    int image_width, image_height; /* from the image's PNG header */
    /* how the PNG text names the inputs (as `generate` writes their paths): the multipart file
     * names (last path component; "image.png"/"mask.png" when none), A1111: "init_image.png" and
     * "mask.png". Only text: never a path the server opens. */
    char image_name[256], mask_name[256];
} serve_request;

void serve_request_free(serve_request *r); /* NULL and a zeroed request are fine */

/* OpenAI POST /v1/images/generations (also the body of POST /v1/jobs): prompt, n, size "WxH",
 * response_format b64_json (url is refused: this server keeps no files), output_format png,
 * and the extras seed, steps, guidance, negative_prompt, true_cfg_scale, cache. */
cdf_status serve_parse_generation(const char *body, size_t len, serve_request *out);
/* AUTOMATIC1111 POST /sdapi/v1/txt2img (img2img false) or /sdapi/v1/img2img (init_images[0]
 * base64 PNG, optional mask, denoising_strength). */
cdf_status serve_parse_a1111(const char *body, size_t len, bool img2img, serve_request *out);
/* OpenAI POST /v1/images/edits: multipart/form-data with image (PNG file), optional mask,
 * prompt, n, size, response_format, and the extras above. */
cdf_status serve_parse_edit(const char *content_type, const uint8_t *body, size_t len, serve_request *out);

/* ---- building blocks (exposed for the fuzzers and tests) ------------------------------------ */
typedef struct serve_part {
    char name[128], filename[256], content_type[128];
    const uint8_t *data; /* into the body */
    size_t len;
} serve_part;
/* multipart/form-data (RFC 7578) over a whole body; content_type is the request's header
 * (boundary parameter, quoted or not). parts[0..*n) point into body. */
cdf_status serve_multipart_parse(const char *content_type, const uint8_t *body, size_t len, serve_part *parts, int max,
                                 int *n);
/* "WxH" with 1 <= W, H <= SERVE_MAX_SIDE; "auto" = 0x0 (the model's default). */
cdf_status serve_parse_size(const char *s, int *w, int *h);
/* Standard base64 with padding; *out_len its length; NULL when out of memory. */
char *serve_base64_encode(const uint8_t *data, size_t n, size_t *out_len);
/* Standard base64 (padding optional, no whitespace), after an optional "data:...;base64," prefix.
 * *out malloc'ed. */
cdf_status serve_base64_decode(const char *s, size_t n, const char *what, uint8_t **out, size_t *out_len);
/* A PNG's size from its header (signature + IHDR), each side 1..SERVE_MAX_IMAGE_SIDE; the pixels
 * are not decoded. */
cdf_status serve_png_size(const uint8_t *data, size_t n, const char *what, int *w, int *h);

#endif
