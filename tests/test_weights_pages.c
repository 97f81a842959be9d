/* Loading weights does not keep the checkpoint's pages resident: once a weight is copied to the
 * device, the pages of the file mapping it was read from leave the process (cdf_io_drop_pages),
 * so a model is not held twice (copy + mapped file) at the end of its load. Reads after the drop
 * still see the file's bytes. The same holds for GGUF blocks a linear layer keeps quantized.
 * Resident sizes come from /proc/self/smaps (Linux). */
#include "testutil.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cdiffusers/io.h"
#include "nn/nn.h"

/* Resident kB of this process's mappings of `path` (0 if none), from /proc/self/smaps. */
static long mapped_rss_kb(const char *path) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[4096];
    bool in = false;
    long kb = 0;
    size_t pl = strlen(path);
    while (fgets(line, sizeof line, f)) {
        size_t n = strlen(line);
        while (n && (line[n - 1] == '\n' || line[n - 1] == ' ')) line[--n] = 0;
        const char *sp = strchr(line, ' ');
        if (sp && sp > line && sp[-1] == ':') { /* a "Key: value" field of the current mapping */
            if (in && strncmp(line, "Rss:", 4) == 0) kb += atol(line + 4);
            continue;
        }
        in = false; /* a mapping's header line: start-end perms offset dev inode [path] */
        if (n >= pl && strcmp(line + n - pl, path) == 0) in = true;
    }
    fclose(f);
    return kb;
}

static void test_loaded_weight_pages_dropped(void **state) {
    (void)state;
    char dir[1024], file[1100];
    snprintf(dir, sizeof dir, "%s/pages_dropped", tu_tmpdir());
    mkdir(dir, 0755);
    snprintf(file, sizeof file, "%s/diffusion_pytorch_model.safetensors", dir);
    enum { R = 1024, C = 4096 }; /* 8 MiB of bf16 */
    uint16_t *v = malloc((size_t)R * C * 2);
    assert_non_null(v);
    for (size_t i = 0; i < (size_t)R * C; i++) v[i] = (uint16_t)(0x3c00 + (i * 2654435761u >> 20) % 512); /* finite bf16 */
    float small[16];
    for (int i = 0; i < 16; i++) small[i] = (float)i;
    cdf_st_writer *wr = cdf_st_writer_new();
    assert_int_equal(cdf_st_writer_add(wr, "big.weight", CDF_BF16, 2, (int64_t[]){R, C}, v), CDF_OK);
    assert_int_equal(cdf_st_writer_add(wr, "small.bias", CDF_F32, 1, (int64_t[]){16}, small), CDF_OK);
    assert_int_equal(cdf_st_writer_save(wr, file), CDF_OK);
    cdf_st_writer_free(wr);

    cdf_load_options o = cdf_load_options_default();
    o.device = tu_cpu();
    o.weight_dtype = CDF_BF16;
    cdf_weights *w = NULL;
    assert_int_equal(cdf_weights_open(dir, &o, &w), CDF_OK);
    long before = mapped_rss_kb(file);
    cdf_tensor *x = cdf_weights_get(w, 2, (int64_t[]){R, C}, "big.weight");
    assert_non_null(x);
    cdf_tensor *b = cdf_weights_get(w, 1, (int64_t[]){16}, "small.bias");
    assert_non_null(b);
    long after = mapped_rss_kb(file);
    /* the file stays mapped (w is open); of its 8 MiB only pages shared with the header or the
     * other tensor may stay (a few kB); without the drop all 8192 kB would be resident */
    if (after < 0 || after > 64) fail_msg("mapped checkpoint resident after loading: %ld kB (before: %ld kB)", after, before);

    /* the copy is exact, and the mapping still reads the file's bytes after the drop */
    uint16_t *got = malloc((size_t)R * C * 2);
    assert_non_null(got);
    assert_int_equal(cdf_tensor_read(x, CDF_BF16, got, (size_t)R * C * 2), CDF_OK);
    assert_memory_equal(got, v, (size_t)R * C * 2);
    cdf_tensor *again = cdf_weights_get(w, 2, (int64_t[]){R, C}, "big.weight");
    assert_non_null(again);
    assert_int_equal(cdf_tensor_read(again, CDF_BF16, got, (size_t)R * C * 2), CDF_OK);
    assert_memory_equal(got, v, (size_t)R * C * 2);
    float sb[16];
    assert_int_equal(cdf_tensor_read(b, CDF_F32, sb, sizeof sb), CDF_OK);
    assert_memory_equal(sb, small, sizeof sb);

    cdf_tensor_release(again);
    cdf_tensor_release(x);
    cdf_tensor_release(b);
    cdf_weights_free(w);
    free(got);
    free(v);
}

/* The same for a GGUF layer whose Q8_0 blocks stay in memory (cdf_linear_load without
 * decode_quantized): the blocks are copied to the device and the file's pages leave the process. */
static void test_quantized_block_pages_dropped(void **state) {
    (void)state;
    char dir[1024], file[1100];
    snprintf(dir, sizeof dir, "%s/pages_dropped_gguf", tu_tmpdir());
    mkdir(dir, 0755);
    snprintf(file, sizeof file, "%s/big.gguf", dir);
    enum { OUT = 1024, IN = 4096, ROW = IN / 32 * 34 }; /* 4.25 MiB of Q8_0 blocks */
    uint8_t *q = malloc((size_t)OUT * ROW);
    assert_non_null(q);
    for (size_t i = 0; i < (size_t)OUT * ROW; i++) q[i] = (uint8_t)(i * 2654435761u >> 24);
    for (size_t b = 0; b < (size_t)OUT * ROW; b += 34) q[b] = 0x00, q[b + 1] = 0x2c; /* finite f16 scale 1/16 */
    cdf_gguf_writer *wr = cdf_gguf_writer_new(0);
    assert_non_null(wr);
    assert_int_equal(cdf_gguf_writer_add(wr, "big.weight", CDF_GGML_Q8_0, 2, (int64_t[]){OUT, IN}, q), CDF_OK);
    assert_int_equal(cdf_gguf_writer_save(wr, file, true, NULL, NULL), CDF_OK);
    cdf_gguf_writer_free(wr);

    cdf_load_options o = cdf_load_options_default();
    o.device = tu_cpu();
    o.weight_dtype = CDF_BF16;
    o.weights_file = file;
    cdf_weights *w = NULL;
    if (cdf_weights_open(dir, &o, &w) != CDF_OK) fail_msg("open: %s", cdf_last_error());
    cdf_linear_layer l;
    if (cdf_linear_load(w, &l, IN, OUT, 0, "big") != CDF_OK) fail_msg("linear: %s", cdf_last_error());
    assert_int_equal(l.qtype, CDF_GGML_Q8_0); /* kept as blocks */
    long after = mapped_rss_kb(file);
    if (after < 0 || after > 64) fail_msg("mapped GGUF resident after loading its blocks: %ld kB (of %d)", after, OUT * ROW / 1024);
    /* the device copy holds the file's blocks */
    uint8_t *got = malloc((size_t)OUT * ROW);
    assert_non_null(got);
    assert_int_equal(cdf_tensor_read(l.w, CDF_U8, got, (size_t)OUT * ROW), CDF_OK);
    assert_memory_equal(got, q, (size_t)OUT * ROW);
    cdf_linear_free(&l);
    cdf_weights_free(w);
    free(got);
    free(q);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loaded_weight_pages_dropped),
        cmocka_unit_test(test_quantized_block_pages_dropped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
