/* PNG writer/reader: pixel and text round trips, the chunk layout checked by parsing the file
 * here, overwrite refusal, folder errors, and atomicity (no temp file left, an existing file
 * untouched on failure).
 *
 * Tests run as root, and chmod-based read-only folders do not stop root, so "cannot write" is
 * exercised with a path under a regular file (ENOTDIR), /sys (EACCES even for root), /proc
 * (ENOENT in an existing folder) and RLIMIT_FSIZE for a failure in the middle of the write. */
#include "testutil.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cdiffusers/io.h"

static const char *sub_path(const char *dir, const char *name) {
    static char buf[8][1200];
    static int slot;
    char *b = buf[slot++ & 7];
    snprintf(b, 1200, "%s/%s", dir, name);
    return b;
}

static const char *fresh_dir(const char *name) {
    static char buf[4][1100];
    static int slot;
    char *b = buf[slot++ & 3];
    snprintf(b, 1100, "%s/%s", tu_tmpdir(), name);
    assert_true(mkdir(b, 0755) == 0 || errno == EEXIST);
    return b;
}

static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) n++;
    closedir(d);
    return n;
}

static bool exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

static uint32_t be32(const uint8_t *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }

/* Finds the first chunk of a type in a PNG file's bytes; returns its data (and length) and the
 * chunk's index in the file. */
static const uint8_t *find_chunk(const uint8_t *png, size_t n, const char *type, uint32_t *len, int *index) {
    size_t pos = 8;
    int i = 0;
    while (pos + 12 <= n) {
        uint32_t l = be32(png + pos);
        if (memcmp(png + pos + 4, type, 4) == 0) {
            *len = l;
            if (index) *index = i;
            return png + pos + 8;
        }
        pos += 12 + (size_t)l;
        i++;
    }
    return NULL;
}

static void test_roundtrip_pixels_and_text(void **state) {
    (void)state;
    const char *dir = fresh_dir("rt");
    const char *path = sub_path(dir, "img.png");
    enum { W = 7, H = 5 };
    uint8_t rgb[H][W][3];
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++)
            for (int c = 0; c < 3; c++) rgb[y][x][c] = (uint8_t)(y * 50 + x * 30 + c * 80);
    const char *params = "a red fox in snow\nSteps: 4, Sampler: Euler, CFG scale: 0, Seed: 42, Size: 7x5";
    const char *keys[] = {"parameters", "Software", "Comment"};
    const char *vals[] = {params, "cdiffusers", "caf\xc3\xa9 \xe2\x98\x95"}; /* UTF-8 -> iTXt */
    assert_int_equal(cdf_png_write(path, W, H, 3, &rgb[0][0][0], keys, vals, 3, false), CDF_OK);
    assert_int_equal(count_entries(dir), 1); /* no temp file left */

    cdf_png_image img;
    assert_int_equal(cdf_png_read(path, &img), CDF_OK);
    assert_int_equal(img.width, W);
    assert_int_equal(img.height, H);
    assert_int_equal(img.channels, 3);
    assert_memory_equal(img.pixels, rgb, sizeof rgb);
    assert_int_equal(img.n_text, 3);
    assert_string_equal(cdf_png_image_text(&img, "parameters"), params);
    assert_string_equal(cdf_png_image_text(&img, "Software"), "cdiffusers");
    assert_string_equal(cdf_png_image_text(&img, "Comment"), vals[2]);
    assert_null(cdf_png_image_text(&img, "absent"));
    cdf_png_image_free(&img);

    /* the chunk layout A1111-style readers expect: a tEXt "parameters\0<text>" before IDAT,
     * the non-Latin-1 value in an uncompressed iTXt */
    size_t n;
    uint8_t *raw = (uint8_t *)tu_read_file(path, &n);
    assert_memory_equal(raw, "\x89PNG\r\n\x1a\n", 8);
    uint32_t len;
    int text_i, idat_i, itxt_i;
    const uint8_t *t = find_chunk(raw, n, "tEXt", &len, &text_i);
    assert_non_null(t);
    assert_int_equal(len, strlen("parameters") + 1 + strlen(params));
    assert_memory_equal(t, "parameters\0", 11);
    assert_memory_equal(t + 11, params, strlen(params));
    assert_non_null(find_chunk(raw, n, "IDAT", &len, &idat_i));
    assert_true(text_i < idat_i);
    const uint8_t *it = find_chunk(raw, n, "iTXt", &len, &itxt_i);
    assert_non_null(it);
    assert_memory_equal(it, "Comment\0\0\0\0\0", 12); /* keyword, flag 0, method 0, no lang/key */
    assert_memory_equal(it + 12, vals[2], strlen(vals[2]));
    free(raw);
}

static void test_gray_and_rgba(void **state) {
    (void)state;
    const char *dir = fresh_dir("formats");
    uint8_t gray[3 * 4], rgba[2 * 3 * 4];
    for (int i = 0; i < 12; i++) gray[i] = (uint8_t)(i * 21);
    for (int i = 0; i < 24; i++) rgba[i] = (uint8_t)(255 - i * 10);
    const char *pg = sub_path(dir, "g.png"), *pa = sub_path(dir, "a.png");
    assert_int_equal(cdf_png_write(pg, 4, 3, 1, gray, NULL, NULL, 0, false), CDF_OK);
    assert_int_equal(cdf_png_write(pa, 3, 2, 4, rgba, NULL, NULL, 0, false), CDF_OK);
    cdf_png_image img;
    assert_int_equal(cdf_png_read(pg, &img), CDF_OK);
    assert_int_equal(img.channels, 1);
    assert_int_equal(img.n_text, 0);
    assert_memory_equal(img.pixels, gray, sizeof gray);
    cdf_png_image_free(&img);
    assert_int_equal(cdf_png_read(pa, &img), CDF_OK);
    assert_int_equal(img.channels, 4);
    assert_int_equal(img.width, 3);
    assert_memory_equal(img.pixels, rgba, sizeof rgba);
    cdf_png_image_free(&img);
}

static void test_overwrite(void **state) {
    (void)state;
    const char *dir = fresh_dir("overwrite");
    const char *path = sub_path(dir, "o.png");
    uint8_t a[4 * 4 * 3], b[4 * 4 * 3];
    memset(a, 10, sizeof a);
    memset(b, 200, sizeof b);
    assert_int_equal(cdf_png_write(path, 4, 4, 3, a, NULL, NULL, 0, false), CDF_OK);
    size_t n1;
    char *before = tu_read_file(path, &n1);
    cdf_status s = cdf_png_write(path, 4, 4, 3, b, NULL, NULL, 0, false);
    assert_int_equal(s, CDF_ERR_IO);
    assert_non_null(strstr(cdf_last_error(), "already exists"));
    assert_non_null(strstr(cdf_last_error(), "--force"));
    assert_non_null(strstr(cdf_last_error(), path));
    size_t n2;
    char *after = tu_read_file(path, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(before, after, n1);
    free(after);
    assert_int_equal(count_entries(dir), 1);
    /* with overwrite the new pixels replace the old */
    assert_int_equal(cdf_png_write(path, 4, 4, 3, b, NULL, NULL, 0, true), CDF_OK);
    cdf_png_image img;
    assert_int_equal(cdf_png_read(path, &img), CDF_OK);
    assert_memory_equal(img.pixels, b, sizeof b);
    cdf_png_image_free(&img);
    assert_int_equal(count_entries(dir), 1);
    free(before);
    /* an existing folder at the path is never replaced */
    const char *sub = fresh_dir("overwrite/sub.png");
    assert_int_equal(cdf_png_write(sub, 4, 4, 3, b, NULL, NULL, 0, true), CDF_ERR_IO);
    assert_non_null(strstr(cdf_last_error(), "existing folder"));
}

static void test_folder_errors(void **state) {
    (void)state;
    uint8_t px[2 * 2 * 3] = {0};
    char p[1200];
    /* missing folder */
    snprintf(p, sizeof p, "%s/missing_dir/x.png", tu_tmpdir());
    assert_int_equal(cdf_png_write(p, 2, 2, 3, px, NULL, NULL, 0, false), CDF_ERR_IO);
    assert_non_null(strstr(cdf_last_error(), "missing_dir' does not exist"));
    assert_non_null(strstr(cdf_last_error(), "No such file or directory"));
    assert_false(exists(p));
    /* a path below a regular file: ENOTDIR */
    const char *dir = fresh_dir("errs");
    const char *regular = sub_path(dir, "file.txt");
    assert_int_equal(tu_write_file(regular, "x", 1), 0);
    snprintf(p, sizeof p, "%s/x.png", regular);
    assert_int_equal(cdf_png_write(p, 2, 2, 3, px, NULL, NULL, 0, false), CDF_ERR_IO);
    assert_non_null(strstr(cdf_last_error(), "is not a folder"));
    assert_non_null(strstr(cdf_last_error(), "Not a directory"));
    assert_int_equal(count_entries(dir), 1);
    /* folders that refuse new files even for root */
    if (exists("/proc/self")) {
        assert_int_equal(cdf_png_write("/proc/cdf_test_out.png", 2, 2, 3, px, NULL, NULL, 0, false), CDF_ERR_IO);
        assert_non_null(strstr(cdf_last_error(), "cannot create file '/proc/cdf_test_out.png'"));
    }
    if (exists("/sys/kernel")) {
        assert_int_equal(cdf_png_write("/sys/cdf_test_out.png", 2, 2, 3, px, NULL, NULL, 0, false), CDF_ERR_IO);
        assert_non_null(strstr(cdf_last_error(), "/sys"));
    }
    /* argument errors create nothing */
    const char *q = sub_path(dir, "bad.png");
    assert_int_equal(cdf_png_write(q, 0, 2, 3, px, NULL, NULL, 0, false), CDF_ERR_INVALID_ARG);
    assert_int_equal(cdf_png_write(q, 2, 2, 2, px, NULL, NULL, 0, false), CDF_ERR_INVALID_ARG);
    assert_int_equal(cdf_png_write(q, 2, 2, 3, NULL, NULL, NULL, 0, false), CDF_ERR_INVALID_ARG);
    const char *bad_keys[] = {" lead", "trail ", "dou  ble", "", "x\ty",
                              "0123456789012345678901234567890123456789012345678901234567890123456789012345678901"};
    for (size_t i = 0; i < sizeof bad_keys / sizeof *bad_keys; i++) {
        const char *v = "v";
        assert_int_equal(cdf_png_write(q, 2, 2, 3, px, &bad_keys[i], &v, 1, false), CDF_ERR_INVALID_ARG);
        assert_non_null(strstr(cdf_last_error(), "not a valid PNG keyword"));
    }
    assert_int_equal(count_entries(dir), 1);
}

/* A write that fails half-way (file size limit -> EFBIG) leaves the old file and no temp. */
static void test_failure_midway_is_atomic(void **state) {
    (void)state;
    const char *dir = fresh_dir("midway");
    const char *path = sub_path(dir, "m.png");
    uint8_t small[2 * 2 * 3] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    assert_int_equal(cdf_png_write(path, 2, 2, 3, small, NULL, NULL, 0, false), CDF_OK);
    size_t n0;
    char *orig = tu_read_file(path, &n0);
    /* incompressible pixels so the PNG is far bigger than the limit */
    enum { S = 256 };
    float *noise = malloc(sizeof(float) * S * S * 3);
    uint8_t *big = malloc(S * S * 3);
    tu_fill_random(noise, S * S * 3, 7);
    for (int i = 0; i < S * S * 3; i++) big[i] = (uint8_t)((noise[i] + 1) * 127.5f);
    free(noise);
    struct rlimit old;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = {16384, old.rlim_max};
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    cdf_status s = cdf_png_write(path, S, S, 3, big, NULL, NULL, 0, true);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, prev);
    free(big);
    if (s != CDF_ERR_IO) print_error("status %d: %s\n", s, cdf_last_error());
    assert_int_equal(s, CDF_ERR_IO);
    assert_non_null(strstr(cdf_last_error(), path));
    assert_int_equal(count_entries(dir), 1);
    size_t n1;
    char *now = tu_read_file(path, &n1);
    assert_int_equal(n0, n1);
    assert_memory_equal(orig, now, n0);
    free(orig);
    free(now);
}

static void test_read_errors(void **state) {
    (void)state;
    const char *dir = fresh_dir("readerr");
    cdf_png_image img;
    assert_int_equal(cdf_png_read(sub_path(dir, "none.png"), &img), CDF_ERR_NOT_FOUND);
    assert_non_null(strstr(cdf_last_error(), "does not exist"));
    const char *p = sub_path(dir, "text.png");
    assert_int_equal(tu_write_file(p, "hello, not a png", 16), 0);
    assert_int_equal(cdf_png_read(p, &img), CDF_ERR_FORMAT);
    assert_non_null(strstr(cdf_last_error(), "not a PNG file"));
    /* a valid PNG cut in the middle */
    const char *good = sub_path(dir, "good.png");
    uint8_t px[16 * 16 * 3];
    for (int i = 0; i < (int)sizeof px; i++) px[i] = (uint8_t)(i * 7);
    assert_int_equal(cdf_png_write(good, 16, 16, 3, px, NULL, NULL, 0, false), CDF_OK);
    size_t n;
    char *raw = tu_read_file(good, &n);
    const char *cut = sub_path(dir, "cut.png");
    assert_int_equal(tu_write_file(cut, raw, n / 2), 0);
    free(raw);
    assert_int_equal(cdf_png_read(cut, &img), CDF_ERR_FORMAT);
    assert_non_null(strstr(cdf_last_error(), cut));
    assert_null(img.pixels);
}

/* cdf_png_encode gives the bytes cdf_png_write puts in the file (the server relies on it to
 * answer with what `generate` writes), text chunks included; bad arguments return nothing. */
static void test_encode_matches_write(void **state) {
    (void)state;
    uint8_t px[5 * 3 * 3];
    for (size_t i = 0; i < sizeof px; i++) px[i] = (uint8_t)(i * 37 + 11);
    const char *keys[2] = {"parameters", "Software"};
    const char *vals[2] = {"a fox\nNegative prompt: caf\xc3\xa9", "cdiffusers"};
    const char *path = sub_path(fresh_dir("encode"), "a.png");
    assert_int_equal(cdf_png_write(path, 5, 3, 3, px, keys, vals, 2, false), CDF_OK);
    size_t flen = 0;
    char *file = tu_read_file(path, &flen);
    assert_non_null(file);
    uint8_t *mem = NULL;
    size_t mlen = 0;
    assert_int_equal(cdf_png_encode(5, 3, 3, px, keys, vals, 2, &mem, &mlen), CDF_OK);
    assert_int_equal(mlen, flen);
    assert_memory_equal(mem, file, flen);
    free(mem);
    free(file);
    mem = (uint8_t *)1;
    assert_int_equal(cdf_png_encode(0, 3, 3, px, NULL, NULL, 0, &mem, &mlen), CDF_ERR_INVALID_ARG);
    assert_null(mem);
    assert_int_equal(mlen, 0);
    const char *bad[1] = {" lead"};
    assert_int_equal(cdf_png_encode(5, 3, 3, px, bad, vals, 1, &mem, &mlen), CDF_ERR_INVALID_ARG);
    assert_non_null(strstr(cdf_last_error(), "not a valid PNG keyword"));
}

/* cdf_png_read_memory decodes what cdf_png_read decodes from the same bytes (the server reads
 * uploaded images with it); a non-PNG and a truncated PNG are format errors naming `what`. */
static void test_read_memory(void **state) {
    (void)state;
    uint8_t px[6 * 4 * 3];
    for (size_t i = 0; i < sizeof px; i++) px[i] = (uint8_t)(i * 53 + 7);
    const char *keys[1] = {"parameters"}, *vals[1] = {"a fox"};
    const char *path = sub_path(fresh_dir("readmem"), "a.png");
    assert_int_equal(cdf_png_write(path, 6, 4, 3, px, keys, vals, 1, false), CDF_OK);
    size_t len = 0;
    uint8_t *data = (uint8_t *)tu_read_file(path, &len);
    assert_non_null(data);
    cdf_png_image f, m;
    assert_int_equal(cdf_png_read(path, &f), CDF_OK);
    assert_int_equal(cdf_png_read_memory(data, len, "image", &m), CDF_OK);
    assert_true(m.width == 6 && m.height == 4 && m.channels == 3 && m.n_text == 1);
    assert_memory_equal(m.pixels, f.pixels, sizeof px);
    assert_memory_equal(m.pixels, px, sizeof px);
    assert_string_equal(cdf_png_image_text(&m, "parameters"), "a fox");
    cdf_png_image_free(&m);
    cdf_png_image_free(&f);
    assert_int_equal(cdf_png_read_memory(data, len / 2, "image", &m), CDF_ERR_FORMAT);
    assert_non_null(strstr(cdf_last_error(), "image is corrupt"));
    assert_null(m.pixels);
    assert_int_equal(cdf_png_read_memory((const uint8_t *)"{\"a\":1}", 7, "mask", &m), CDF_ERR_FORMAT);
    assert_non_null(strstr(cdf_last_error(), "mask is not a PNG"));
    free(data);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read_memory),
        cmocka_unit_test(test_encode_matches_write),
        cmocka_unit_test(test_roundtrip_pixels_and_text),
        cmocka_unit_test(test_gray_and_rgba),
        cmocka_unit_test(test_overwrite),
        cmocka_unit_test(test_folder_errors),
        cmocka_unit_test(test_failure_midway_is_atomic),
        cmocka_unit_test(test_read_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
