/* Fuzz target: the JSON request bodies of `cdiffusers serve` (cli/serve_parse.c). The same input
 * goes through the OpenAI generations parser and the AUTOMATIC1111 txt2img and img2img parsers
 * (the latter base64-decodes init_images / mask and reads the PNG header), plus the size parser
 * and a base64 round trip on the raw bytes.
 *
 * Invariants: a failure leaves a message and a zeroed request; a success gives a prompt within
 * the text limit, 1..SERVE_MAX_IMAGES images, sizes 0 (default) or 1..SERVE_MAX_SIDE, and for
 * img2img a PNG image whose header size was read; base64 decode(encode(x)) == x. */
#include <cjson/cJSON.h>
#include <math.h>

#include "fuzz_common.h"
#include "serve_parse.h"

static void write_seeds(const char *dir) {
    static const char *bodies[] = {
        "{\"prompt\":\"a large yellow triangle on a purple background\",\"n\":2,\"size\":\"64x64\",\"response_format\":\"b64_json\"}",
        "{\"prompt\":\"x\",\"seed\":7,\"steps\":20,\"guidance\":3.5,\"negative_prompt\":\"blurry\",\"true_cfg_scale\":3,"
        "\"model\":\"m\",\"quality\":\"hd\",\"output_format\":\"png\"}",
        "{\"prompt\":\"x\",\"response_format\":\"url\"}",
        "{\"prompt\":\"a red circle\",\"negative_prompt\":\"\",\"steps\":8,\"cfg_scale\":0,\"width\":64,\"height\":64,\"seed\":-1,"
        "\"batch_size\":2,\"n_iter\":2,\"sampler_name\":\"Euler\"}",
        /* a 1x1 PNG, base64, as A1111 img2img sends it */
        "{\"prompt\":\"x\",\"init_images\":[\"data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4"
        "z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC\"],\"mask\":\"iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/"
        "pLvAAAAAElFTkSuQmCC\",\"denoising_strength\":0.5}",
        "{\"prompt\":5}", "[]", "{\"size\":\"auto\",\"prompt\":\"\\u00e9\\ud83d\\ude00\"}", "{\"n\":1.5,\"prompt\":\"x\"}",
    };
    for (size_t i = 0; i < sizeof bodies / sizeof *bodies; i++) fz_seed(dir, -1, bodies[i], strlen(bodies[i]));
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fz_maybe_write_seeds(write_seeds);
    return 0;
}

static void check_request(cdf_status s, const serve_request *r, bool img2img) {
    if (s != CDF_OK) {
        FZ_CHECK_MESSAGE();
        FZ_CHECK(!r->prompt && !r->negative_prompt && !r->image && !r->mask);
        return;
    }
    FZ_CHECK(r->prompt && strlen(r->prompt) <= SERVE_MAX_TEXT);
    FZ_CHECK(!r->negative_prompt || strlen(r->negative_prompt) <= SERVE_MAX_TEXT);
    FZ_CHECK(r->n >= 1 && r->n <= SERVE_MAX_IMAGES);
    FZ_CHECK(r->width >= 0 && r->width <= SERVE_MAX_SIDE && r->height >= 0 && r->height <= SERVE_MAX_SIDE);
    FZ_CHECK(r->steps >= 0 && r->seed >= -1);
    FZ_CHECK(r->guidance < 0 || isfinite(r->guidance));
    FZ_CHECK(r->img2img == img2img);
    if (img2img) {
        FZ_CHECK(r->image && r->image_len >= 33 && r->image_width >= 1 && r->image_height >= 1);
        FZ_CHECK(r->strength >= 0 && r->strength <= 1);
        int w, h;
        FZ_CHECK(serve_png_size(r->image, r->image_len, "image", &w, &h) == CDF_OK && w == r->image_width && h == r->image_height);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    serve_request r;
    cdf_status s = FZ_TRY(serve_parse_generation((const char *)data, size, &r));
    check_request(s, &r, false);
    serve_request_free(&r);
    s = FZ_TRY(serve_parse_a1111((const char *)data, size, false, &r));
    check_request(s, &r, false);
    serve_request_free(&r);
    s = FZ_TRY(serve_parse_a1111((const char *)data, size, true, &r));
    check_request(s, &r, true);
    serve_request_free(&r);

    char *text = malloc(size + 1);
    FZ_CHECK(text);
    memcpy(text, data, size);
    text[size] = 0;
    int w = -1, h = -1;
    if (FZ_TRY(serve_parse_size(text, &w, &h)) == CDF_OK) FZ_CHECK(w >= 0 && w <= SERVE_MAX_SIDE && h >= 0 && h <= SERVE_MAX_SIDE);
    else FZ_CHECK_MESSAGE();
    uint8_t *dec = NULL;
    size_t n = 0;
    if (FZ_TRY(serve_base64_decode(text, size, "input", &dec, &n)) != CDF_OK) FZ_CHECK_MESSAGE();
    free(dec);
    free(text);
    size_t len = 0;
    char *enc = serve_base64_encode(data, size, &len);
    FZ_CHECK(enc && len == (size + 2) / 3 * 4 && strlen(enc) == len);
    FZ_CHECK(serve_base64_decode(enc, len, "round trip", &dec, &n) == CDF_OK);
    FZ_CHECK(n == size && (size == 0 || memcmp(dec, data, size) == 0));
    free(dec);
    free(enc);
    cdf_clear_error();
    return 0;
}
