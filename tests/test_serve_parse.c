/* The request parsers of `cdiffusers serve` (cli/serve_parse.c) on exact inputs: base64 both
 * ways (known vectors, data URLs, bad characters), sizes, the PNG header, multipart bodies
 * (quoted and bare boundaries, preamble and epilogue, file parts with binary data, malformed
 * delimiters and headers, the part limit), and the OpenAI / A1111 request fields with their
 * defaults and refusals. The HTTP side is tests/serve/test_serve.sh. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#include "cdiffusers/io.h"
#include "serve_parse.h"

static void test_base64(void **state) {
    (void)state;
    static const struct { const char *raw, *b64; } v[] = {
        {"", ""}, {"f", "Zg=="}, {"fo", "Zm8="}, {"foo", "Zm9v"}, {"foob", "Zm9vYg=="}, {"fooba", "Zm9vYmE="}, {"foobar", "Zm9vYmFy"},
    };
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
        size_t n = 99;
        char *e = serve_base64_encode((const uint8_t *)v[i].raw, strlen(v[i].raw), &n);
        assert_string_equal(e, v[i].b64);
        assert_int_equal(n, strlen(v[i].b64));
        uint8_t *d;
        assert_int_equal(serve_base64_decode(e, n, "x", &d, &n), CDF_OK);
        assert_int_equal(n, strlen(v[i].raw));
        assert_memory_equal(d, v[i].raw, n);
        free(d);
        free(e);
    }
    uint8_t *d;
    size_t n;
    const char *url = "data:image/png;base64,Zm9vYmFy";
    assert_int_equal(serve_base64_decode(url, strlen(url), "x", &d, &n), CDF_OK);
    assert_int_equal(n, 6);
    assert_memory_equal(d, "foobar", 6);
    free(d);
    assert_int_equal(serve_base64_decode("Zm9v*mFy", 8, "init_images[0]", &d, &n), CDF_ERR_FORMAT);
    assert_non_null(strstr(cdf_last_error(), "init_images[0] is not valid base64"));
    assert_null(d);
    assert_int_equal(serve_base64_decode("Zm9vY", 5, "x", &d, &n), CDF_ERR_FORMAT); /* 4k+1 characters */
    assert_int_equal(serve_base64_decode("data:text/plain,abc", 19, "x", &d, &n), CDF_ERR_FORMAT);
}

static void test_size(void **state) {
    (void)state;
    int w = -1, h = -1;
    assert_int_equal(serve_parse_size("1024x768", &w, &h), CDF_OK);
    assert_int_equal(w, 1024);
    assert_int_equal(h, 768);
    assert_int_equal(serve_parse_size("auto", &w, &h), CDF_OK);
    assert_int_equal(w, 0);
    assert_int_equal(h, 0);
    static const char *bad[] = {"", "64", "64x", "x64", "64x64x", "0x64", "64X64", "-64x64", " 64x64", "99999999999x1", "65536x1"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_int_equal(serve_parse_size(bad[i], &w, &h), CDF_ERR_INVALID_ARG);
        assert_non_null(strstr(cdf_last_error(), "WIDTHxHEIGHT"));
    }
}

/* A 3x2 PNG from the library's own encoder. */
static uint8_t *small_png(size_t *n) {
    uint8_t px[3 * 2 * 3] = {0};
    uint8_t *png = NULL;
    assert_int_equal(cdf_png_encode(3, 2, 3, px, NULL, NULL, 0, &png, n), CDF_OK);
    return png;
}

static void test_png_size(void **state) {
    (void)state;
    size_t n;
    uint8_t *png = small_png(&n);
    int w, h;
    assert_int_equal(serve_png_size(png, n, "image", &w, &h), CDF_OK);
    assert_int_equal(w, 3);
    assert_int_equal(h, 2);
    png[18] = 0x10; /* width 4099: over the input limit, refused before anything is decoded */
    png[19] = 0x03;
    assert_int_equal(serve_png_size(png, n, "image", &w, &h), CDF_ERR_LIMIT);
    assert_non_null(strstr(cdf_last_error(), "image is 4099x2, outside 1..4096 per side"));
    png[18] = 0;
    assert_int_equal(serve_png_size(png, 20, "image", &w, &h), CDF_ERR_FORMAT); /* cut inside IHDR */
    assert_non_null(strstr(cdf_last_error(), "truncated"));
    png[0] = 'G';
    assert_int_equal(serve_png_size(png, n, "mask", &w, &h), CDF_ERR_FORMAT);
    assert_non_null(strstr(cdf_last_error(), "mask is not a PNG"));
    free(png);
}

/* "--B\r\n<headers>\r\n\r\n<data>\r\n" ... "--B--" built with binary data (NULs, CR/LF). */
static void test_multipart(void **state) {
    (void)state;
    static const uint8_t bin[] = {0, '\r', '\n', '-', '-', 'B', 'x', 0xff, 0};
    char body[512];
    size_t k = 0;
    k += (size_t)sprintf(body + k, "preamble\r\n--B\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\na fox\r\n");
    k += (size_t)sprintf(body + k, "--B  \r\ncontent-disposition: form-data; name=img; filename=\"a \\\"b\\\".png\"\r\n"
                                   "Content-Type: image/png\r\n\r\n");
    memcpy(body + k, bin, sizeof bin);
    k += sizeof bin;
    k += (size_t)sprintf(body + k, "\r\n--B--\r\nepilogue");
    serve_part parts[4];
    int n = -1;
    assert_int_equal(serve_multipart_parse("multipart/form-data; charset=utf-8; boundary=B", (uint8_t *)body, k, parts, 4, &n), CDF_OK);
    assert_int_equal(n, 2);
    assert_string_equal(parts[0].name, "prompt");
    assert_int_equal(parts[0].len, 5);
    assert_memory_equal(parts[0].data, "a fox", 5);
    assert_string_equal(parts[1].name, "img");
    assert_string_equal(parts[1].filename, "a \"b\".png");
    assert_string_equal(parts[1].content_type, "image/png");
    assert_int_equal(parts[1].len, sizeof bin);
    assert_memory_equal(parts[1].data, bin, sizeof bin);
    /* the same with a quoted boundary starting the body */
    const char *q = "--a:b\r\nContent-Disposition: form-data; name=\"n\"\r\n\r\n2\r\n--a:b--";
    assert_int_equal(serve_multipart_parse("multipart/form-data; boundary=\"a:b\"", (const uint8_t *)q, strlen(q), parts, 4, &n), CDF_OK);
    assert_int_equal(n, 1);
    assert_int_equal(parts[0].len, 1);
    static const struct { const char *type, *body, *msg; } bad[] = {
        {"application/json", "{}", "must be multipart/form-data"},
        {"multipart/form-data", "--B--", "needs a boundary"},
        {"multipart/form-data; boundary=B", "no delimiter at all", "never occurs"},
        {"multipart/form-data; boundary=B", "--B\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\nunclosed", "not closed"},
        {"multipart/form-data; boundary=B", "--B\r\nContent-Type: text/plain\r\n\r\nx\r\n--B--", "no Content-Disposition"},
        {"multipart/form-data; boundary=B", "--B\r\nContent-Disposition: attachment; name=\"x\"\r\n\r\nx\r\n--B--", "must be form-data"},
        {"multipart/form-data; boundary=B", "--B\r\nContent-Disposition: form-data\r\n\r\nx\r\n--B--", "no (or too long a) name"},
        {"multipart/form-data; boundary=B", "--Bjunk\r\n", "malformed delimiter"},
        {"multipart/form-data; boundary=B", "--B\r\n\r\nx\r\n--B--", "no headers"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_int_not_equal(serve_multipart_parse(bad[i].type, (const uint8_t *)bad[i].body, strlen(bad[i].body), parts, 4, &n), CDF_OK);
        if (!strstr(cdf_last_error(), bad[i].msg)) fail_msg("case %zu: '%s' lacks '%s'", i, cdf_last_error(), bad[i].msg);
    }
    /* more parts than allowed */
    char many[1024];
    k = 0;
    for (int i = 0; i < 5; i++) k += (size_t)sprintf(many + k, "--B\r\nContent-Disposition: form-data; name=\"f%d\"\r\n\r\nv\r\n", i);
    k += (size_t)sprintf(many + k, "--B--");
    assert_int_equal(serve_multipart_parse("multipart/form-data; boundary=B", (uint8_t *)many, k, parts, 4, &n), CDF_ERR_LIMIT);
}

static void test_generation_fields(void **state) {
    (void)state;
    serve_request r;
    const char *ok = "{\"prompt\":\"a fox\",\"n\":3,\"size\":\"128x64\",\"seed\":9,\"steps\":4,\"guidance\":2.5,"
                     "\"negative_prompt\":\"blur\",\"true_cfg_scale\":1.5,\"model\":\"any\",\"user\":\"u\"}";
    assert_int_equal(serve_parse_generation(ok, strlen(ok), &r), CDF_OK);
    assert_string_equal(r.prompt, "a fox");
    assert_string_equal(r.negative_prompt, "blur");
    assert_int_equal(r.n, 3);
    assert_int_equal(r.width, 128);
    assert_int_equal(r.height, 64);
    assert_int_equal(r.seed, 9);
    assert_int_equal(r.steps, 4);
    assert_true(r.guidance == 2.5 && r.have_true_cfg && r.true_cfg_scale == 1.5);
    assert_null(r.cache); /* not given: the server's --cache */
    serve_request_free(&r);
    const char *cached = "{\"prompt\":\"x\",\"cache\":\"first-block:0.2\"}";
    assert_int_equal(serve_parse_generation(cached, strlen(cached), &r), CDF_OK);
    assert_string_equal(r.cache, "first-block:0.2");
    serve_request_free(&r);
    const char *def = "{\"prompt\":\"\"}";
    assert_int_equal(serve_parse_generation(def, strlen(def), &r), CDF_OK);
    assert_true(r.n == 1 && r.width == 0 && r.height == 0 && r.steps == 0 && r.seed == -1 && r.guidance < 0 && !r.have_true_cfg);
    assert_null(r.negative_prompt);
    serve_request_free(&r);
    static const struct { const char *body, *msg; } bad[] = {
        {"{\"prompt\":\"x\",\"n\":0}", "'n' must be between 1 and 8"},
        {"{\"prompt\":\"x\",\"user\":5}", "'user' must be a string"},
        {"{\"prompt\":\"x\",\"seed\":1e300}", "'seed' must be an integer"},
        {"{\"prompt\":\"x\",\"guidance\":\"3\"}", "'guidance' must be a finite number"},
        {"{\"prompt\":\"x\",\"response_format\":\"png\"}", "must be 'b64_json'"},
        {"{\"prompt\":\"a\\u0000b\"}", "without NUL"},
        {"{\"prompt\":\"x\"} trailing", "not valid JSON"},
        {"{\"prompt\":\"x\",\"cache\":\"first-block:-1\"}", "field 'cache': cache 'first-block:-1'"},
        {"{\"prompt\":\"x\",\"cache\":\"fbc\"}", "unknown cache 'fbc'"},
        {"{\"prompt\":\"x\",\"cache\":0.1}", "'cache' must be a string"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        memset(&r, 0x55, sizeof r);
        assert_int_not_equal(serve_parse_generation(bad[i].body, strlen(bad[i].body), &r), CDF_OK);
        if (!strstr(cdf_last_error(), bad[i].msg)) fail_msg("case %zu: '%s' lacks '%s'", i, cdf_last_error(), bad[i].msg);
        assert_null(r.prompt); /* nothing to free after a failure */
    }
}

static void test_a1111_and_edit(void **state) {
    (void)state;
    serve_request r;
    const char *t2i = "{\"width\":64,\"height\":32,\"batch_size\":2,\"n_iter\":3,\"cfg_scale\":7,\"seed\":-1}";
    assert_int_equal(serve_parse_a1111(t2i, strlen(t2i), false, &r), CDF_OK);
    assert_string_equal(r.prompt, ""); /* A1111's default */
    assert_true(r.n == 6 && r.width == 64 && r.height == 32 && r.guidance == 7 && r.seed == -1 && !r.img2img);
    serve_request_free(&r);
    const char *a_cache = "{\"cache\":\"first-block\"}", *a_bad = "{\"cache\":\"taylorseer:cache_identifiers=x\"}";
    assert_int_equal(serve_parse_a1111(a_cache, strlen(a_cache), false, &r), CDF_OK);
    assert_string_equal(r.cache, "first-block");
    serve_request_free(&r);
    const char *a_ratios = "{\"cache\":\"mag:mag_ratios=[1.0, 0.9],calibrate=True\"}"; /* a list in the field */
    assert_int_equal(serve_parse_a1111(a_ratios, strlen(a_ratios), false, &r), CDF_OK);
    assert_string_equal(r.cache, "mag:mag_ratios=[1.0, 0.9],calibrate=True");
    serve_request_free(&r);
    assert_int_equal(serve_parse_a1111(a_bad, strlen(a_bad), false, &r), CDF_ERR_UNSUPPORTED);
    assert_non_null(strstr(cdf_last_error(), "field 'cache'"));
    size_t pn;
    uint8_t *png = small_png(&pn);
    char *b64 = serve_base64_encode(png, pn, NULL);
    char body[1024];
    snprintf(body, sizeof body, "{\"prompt\":\"p\",\"init_images\":[\"%s\"],\"denoising_strength\":0.3}", b64);
    assert_int_equal(serve_parse_a1111(body, strlen(body), true, &r), CDF_OK);
    assert_true(r.img2img && r.image_len == pn && r.image_width == 3 && r.image_height == 2 && r.strength == 0.3);
    assert_memory_equal(r.image, png, pn);
    assert_string_equal(r.image_name, "init_image.png"); /* the name the PNG text shows */
    serve_request_free(&r);
    snprintf(body, sizeof body, "{\"init_images\":[\"%s\",\"%s\"]}", b64, b64);
    assert_int_equal(serve_parse_a1111(body, strlen(body), true, &r), CDF_ERR_INVALID_ARG);
    assert_non_null(strstr(cdf_last_error(), "array of one"));
    /* OpenAI edits: multipart with the image, text fields parsed as numbers */
    char mp[2048];
    size_t k = (size_t)sprintf(mp, "--Z\r\nContent-Disposition: form-data; name=\"image\"; filename=\"dir/i.png\"\r\n\r\n");
    memcpy(mp + k, png, pn);
    k += pn;
    k += (size_t)sprintf(mp + k, "\r\n--Z\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\nred\r\n"
                                 "--Z\r\nContent-Disposition: form-data; name=\"n\"\r\n\r\n2\r\n"
                                 "--Z\r\nContent-Disposition: form-data; name=\"cache\"\r\n\r\nfirst-block:0.1\r\n"
                                 "--Z\r\nContent-Disposition: form-data; name=\"size\"\r\n\r\n64x64\r\n--Z--\r\n");
    assert_int_equal(serve_parse_edit("multipart/form-data; boundary=Z", (uint8_t *)mp, k, &r), CDF_OK);
    assert_true(r.img2img && r.n == 2 && r.width == 64 && r.image_len == pn);
    assert_string_equal(r.prompt, "red");
    assert_string_equal(r.cache, "first-block:0.1");
    assert_string_equal(r.image_name, "i.png"); /* the file name's last component, as `generate` shows a path */
    assert_string_equal(r.mask_name, "mask.png");
    serve_request_free(&r);
    k = (size_t)sprintf(mp, "--Z\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\nred\r\n"
                            "--Z\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\nblue\r\n--Z--");
    assert_int_equal(serve_parse_edit("multipart/form-data; boundary=Z", (uint8_t *)mp, k, &r), CDF_ERR_INVALID_ARG);
    assert_non_null(strstr(cdf_last_error(), "given twice"));
    free(b64);
    free(png);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_base64),    cmocka_unit_test(test_size),
        cmocka_unit_test(test_png_size),  cmocka_unit_test(test_multipart),
        cmocka_unit_test(test_generation_fields), cmocka_unit_test(test_a1111_and_edit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
