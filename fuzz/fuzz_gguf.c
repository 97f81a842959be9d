/* Fuzz target: the GGUF reader (cdf_gguf_open on a file holding the input) and, for every file
 * it accepts, the metadata getters and the dequantization of each tensor it can decode.
 *
 * Invariants after a successful open (include/cdiffusers/io.h): every tensor's bytes lie inside
 * the file after the header, its offset is a multiple of the alignment (a power of two), nbytes
 * = numel / block size * block bytes, tensors do not overlap, names are unique and found by
 * cdf_gguf_find, and every key is found again by its getters. */
#include "fuzz_common.h"

static void write_seeds(const char *dir) {
    static const char *files[] = {"formats/tiny_v3.gguf", "formats/tiny_v2.gguf", "formats/tiny_align64.gguf"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) fz_seed_file(dir, -1, files[i], 1 << 16);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fz_maybe_write_seeds(write_seeds);
    return 0;
}

typedef struct span {
    uint64_t b, e;
} span;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fz_join(fz_tmp(), "in.gguf");
    fz_write(path, data, size);
    cdf_gguf_file *g = (cdf_gguf_file *)1;
    if (FZ_TRY(cdf_gguf_open(path, &g)) != CDF_OK) {
        FZ_CHECK(g == NULL);
        FZ_CHECK_MESSAGE();
        return 0;
    }
    FZ_CHECK(size >= 24 && memcmp(data, "GGUF", 4) == 0);
    uint32_t v = cdf_gguf_version(g);
    FZ_CHECK(v == 2 || v == 3);
    uint64_t al = cdf_gguf_alignment(g);
    FZ_CHECK(al && (al & (al - 1)) == 0);
    int n = cdf_gguf_count(g);
    span *sp = calloc((size_t)n + 1, sizeof *sp);
    FZ_CHECK(sp);
    for (int i = 0; i < n; i++) {
        const cdf_gguf_tensor *t = cdf_gguf_tensor_at(g, i);
        FZ_CHECK(t && t->name && t->name[0]);
        FZ_CHECK(cdf_gguf_find(g, t->name) == t);
        FZ_CHECK(t->ndim >= 1 && t->ndim <= CDF_ST_MAX_DIMS);
        int64_t be, bb;
        FZ_CHECK(cdf_ggml_type_block(t->type, &be, &bb));
        unsigned __int128 numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            FZ_CHECK(t->shape[d] >= 0);
            numel *= (uint64_t)t->shape[d];
        }
        FZ_CHECK(t->shape[t->ndim - 1] % be == 0);
        FZ_CHECK(numel / (uint64_t)be * (uint64_t)bb == t->nbytes);
        FZ_CHECK(t->offset % al == 0);
        const uint8_t *p = cdf_gguf_data(g, t);
        FZ_CHECK(p);
        sp[i] = (span){t->offset, t->offset + t->nbytes};
        if (t->nbytes) {
            /* inside the file: the mapping holds exactly the input's bytes there */
            FZ_CHECK(t->nbytes <= size);
            FZ_CHECK(p[0] == p[0] && p[t->nbytes - 1] == p[t->nbytes - 1]);
        }
        if (t->nbytes <= (1u << 16) && cdf_ggml_can_dequantize(t->type)) {
            int64_t ne = (int64_t)numel;
            float *y = malloc((size_t)ne * 4 + 4);
            FZ_CHECK(y);
            FZ_CHECK(cdf_ggml_dequantize(t->type, p, ne, y) == CDF_OK);
            free(y);
        } else if (!cdf_ggml_can_dequantize(t->type)) {
            float y[1];
            FZ_CHECK(FZ_TRY(cdf_ggml_dequantize(t->type, p, 0, y)) != CDF_OK);
            FZ_CHECK_MESSAGE();
        }
    }
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n && n <= 256; j++)
            if (sp[i].e > sp[i].b && sp[j].e > sp[j].b) FZ_CHECK(sp[i].e <= sp[j].b || sp[j].e <= sp[i].b);
    free(sp);
    FZ_CHECK(cdf_gguf_tensor_at(g, n) == NULL && cdf_gguf_tensor_at(g, -1) == NULL);
    for (int i = 0; i < cdf_gguf_kv_count(g); i++) {
        const char *k = cdf_gguf_kv_key_at(g, i);
        FZ_CHECK(k);
        int ty = cdf_gguf_kv_type(g, k);
        FZ_CHECK(ty >= 0 && ty <= 12);
        if (ty == 8) FZ_CHECK(cdf_gguf_get_string(g, k));
        int64_t x;
        (void)cdf_gguf_get_int(g, k, &x);
        int et;
        uint64_t cnt;
        FZ_CHECK(cdf_gguf_get_array_info(g, k, &et, &cnt) == (ty == 9));
    }
    cdf_gguf_close(g);
    return 0;
}
