/* Fuzz target: the safetensors reader (cdf_st_open on a file holding the input) and, for every
 * file it accepts, the read functions and a write -> reopen round trip through cdf_st_writer.
 *
 * Invariants after a successful open (docs in include/cdiffusers/io.h): every tensor lies inside
 * the data section, nbytes = numel * dtype size, tensors are in data order and do not overlap,
 * names are unique and found by cdf_st_find, reads return exactly the input's bytes, reads
 * outside a tensor fail, and whatever was read writes back and reopens identically. */
#include "fuzz_common.h"

static uint64_t le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static void write_seeds(const char *dir) {
    static const char *files[] = {
        "io/torch_rand.safetensors",          "io/vae_kl16_io.safetensors",
        "golden/sd3/io.safetensors",          "golden/flux1_schnell/io_bf16.safetensors",
        "golden/vae_kl16/io_bf16.safetensors",
    };
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) fz_seed_file(dir, -1, files[i], 1 << 17);
    /* small synthetic files: every dtype, a scalar, an empty tensor, metadata */
    cdf_st_writer *w = cdf_st_writer_new();
    uint8_t bytes[64];
    for (int i = 0; i < 64; i++) bytes[i] = (uint8_t)(i * 37 + 1);
    for (int dt = 0; dt < CDF_DTYPE_COUNT; dt++) {
        char name[32];
        snprintf(name, sizeof name, "t.%s", cdf_dtype_name((cdf_dtype)dt));
        int64_t shape[2] = {2, 2};
        cdf_st_writer_add(w, name, (cdf_dtype)dt, 2, shape, bytes);
    }
    int64_t empty[3] = {3, 0, 2};
    cdf_st_writer_add(w, "empty", CDF_F32, 3, empty, NULL);
    cdf_st_writer_add(w, "scalar", CDF_F64, 0, NULL, bytes);
    cdf_st_writer_set_metadata(w, "format", "pt");
    cdf_st_writer_set_metadata(w, "note", "fuzz seed");
    const char *p = fz_join(fz_tmp(), "seed.safetensors");
    if (FZ_TRY(cdf_st_writer_save(w, p)) != CDF_OK) abort();
    cdf_st_writer_free(w);
    size_t n = 0;
    uint8_t *d = fz_read(p, &n);
    fz_seed(dir, -1, d, n);
    free(d);
    /* minimal headers */
    static const char *tiny[] = {"{}", "{\"__metadata__\":{}}", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}"};
    for (size_t i = 0; i < sizeof tiny / sizeof *tiny; i++) {
        size_t hl = strlen(tiny[i]);
        uint8_t buf[256] = {0};
        for (int k = 0; k < 8; k++) buf[k] = (uint8_t)(hl >> (8 * k));
        memcpy(buf + 8, tiny[i], hl);
        fz_seed(dir, -1, buf, 8 + hl + 4);
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fz_maybe_write_seeds(write_seeds);
    return 0;
}

/* Write every tensor and the metadata back out, reopen, compare. */
static void round_trip(const cdf_st_file *f) {
    cdf_st_writer *w = cdf_st_writer_new();
    FZ_CHECK(w);
    int n = cdf_st_count(f);
    for (int i = 0; i < n; i++) {
        const cdf_st_tensor *t = cdf_st_tensor_at(f, i);
        if (FZ_TRY(cdf_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, cdf_st_data(f, t))) != CDF_OK) {
            /* the writer is stricter about names (e.g. empty) than the reader: not a bug */
            FZ_CHECK_MESSAGE();
            cdf_st_writer_free(w);
            return;
        }
    }
    for (int i = 0; i < cdf_st_metadata_count(f); i++) {
        const char *k, *v;
        FZ_CHECK(cdf_st_metadata_at(f, i, &k, &v));
        FZ_CHECK(cdf_st_writer_set_metadata(w, k, v) == CDF_OK);
    }
    const char *out = fz_join(fz_tmp(), "roundtrip.safetensors");
    FZ_CHECK(cdf_st_writer_save(w, out) == CDF_OK);
    cdf_st_writer_free(w);
    cdf_st_file *g = NULL;
    FZ_CHECK(cdf_st_open(out, &g) == CDF_OK);
    FZ_CHECK(cdf_st_count(g) == n);
    for (int i = 0; i < n; i++) {
        const cdf_st_tensor *t = cdf_st_tensor_at(f, i);
        const cdf_st_tensor *u = cdf_st_find(g, t->name);
        FZ_CHECK(u);
        FZ_CHECK(u->dtype == t->dtype && u->ndim == t->ndim && u->nbytes == t->nbytes);
        FZ_CHECK(memcmp(u->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim) == 0);
        if (t->nbytes) FZ_CHECK(memcmp(cdf_st_data(g, u), cdf_st_data(f, t), t->nbytes) == 0);
    }
    FZ_CHECK(cdf_st_metadata_count(g) == cdf_st_metadata_count(f));
    for (int i = 0; i < cdf_st_metadata_count(f); i++) {
        const char *k, *v;
        cdf_st_metadata_at(f, i, &k, &v);
        const char *v2 = cdf_st_metadata(g, k);
        FZ_CHECK(v2 && strcmp(v, v2) == 0);
    }
    cdf_st_close(g);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fz_join(fz_tmp(), "in.safetensors");
    fz_write(path, data, size);
    cdf_st_file *f = (cdf_st_file *)1;
    if (FZ_TRY(cdf_st_open(path, &f)) != CDF_OK) {
        FZ_CHECK(f == NULL);
        FZ_CHECK_MESSAGE();
        return 0;
    }
    FZ_CHECK(size >= 8);
    uint64_t hlen = le64(data);
    FZ_CHECK(hlen <= size - 8);
    uint64_t data_start = 8 + hlen, data_size = size - data_start;
    int n = cdf_st_count(f);
    uint64_t prev_end = 0, total = 0;
    for (int i = 0; i < n; i++) {
        const cdf_st_tensor *t = cdf_st_tensor_at(f, i);
        FZ_CHECK(t && t->name);
        FZ_CHECK(t->ndim >= 0 && t->ndim <= CDF_ST_MAX_DIMS);
        unsigned __int128 numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            FZ_CHECK(t->shape[d] >= 0);
            numel *= (uint64_t)t->shape[d];
        }
        FZ_CHECK(numel * cdf_dtype_size(t->dtype) == t->nbytes);
        FZ_CHECK(t->offset <= data_size && t->nbytes <= data_size - t->offset);
        if (t->nbytes) {
            FZ_CHECK(t->offset >= prev_end); /* data order, no overlap */
            prev_end = t->offset + t->nbytes;
        }
        FZ_CHECK(cdf_st_find(f, t->name) == t);
        const uint8_t *mapped = cdf_st_data(f, t);
        FZ_CHECK(mapped);
        if (t->nbytes) FZ_CHECK(memcmp(mapped, data + data_start + t->offset, t->nbytes) == 0);
        total += t->nbytes;
        if (t->nbytes <= (1u << 20)) {
            uint8_t *buf = malloc(t->nbytes + 1);
            FZ_CHECK(cdf_st_read_all(f, t, buf) == CDF_OK);
            if (t->nbytes) FZ_CHECK(memcmp(buf, mapped, t->nbytes) == 0);
            /* one byte past the end must be refused */
            FZ_CHECK(FZ_TRY(cdf_st_read(f, t, t->nbytes, 1, buf)) != CDF_OK);
            FZ_CHECK_MESSAGE();
            if (t->ndim >= 1 && t->shape[0] > 0) {
                uint64_t row = t->nbytes / (uint64_t)t->shape[0];
                FZ_CHECK(cdf_st_read_rows(f, t, t->shape[0] - 1, 1, buf) == CDF_OK);
                if (row) FZ_CHECK(memcmp(buf, mapped + t->nbytes - row, row) == 0);
                FZ_CHECK(cdf_st_read_rows(f, t, t->shape[0], 1, buf) != CDF_OK);
            }
            if (t->ndim >= 1 && t->shape[t->ndim - 1] > 0 && t->nbytes) {
                int64_t cols = t->shape[t->ndim - 1];
                size_t esz = cdf_dtype_size(t->dtype);
                uint64_t rows = t->nbytes / esz / (uint64_t)cols;
                FZ_CHECK(cdf_st_read_cols(f, t, cols - 1, 1, buf) == CDF_OK);
                for (uint64_t r = 0; r < rows; r++)
                    FZ_CHECK(memcmp(buf + r * esz, mapped + ((r + 1) * (uint64_t)cols - 1) * esz, esz) == 0);
            }
            free(buf);
        }
    }
    FZ_CHECK(cdf_st_tensor_at(f, n) == NULL && cdf_st_tensor_at(f, -1) == NULL);
    for (int i = 0; i < cdf_st_metadata_count(f); i++) {
        const char *k, *v;
        FZ_CHECK(cdf_st_metadata_at(f, i, &k, &v));
        FZ_CHECK(cdf_st_metadata(f, k) == v);
    }
    if (n <= 256 && total <= (1u << 20)) round_trip(f);
    cdf_st_close(f);
    return 0;
}
