/* safetensors reader/writer, sharded checkpoints, range reads with the byte counter, and a table
 * of malformed files. Golden files in tests/data/io/ are byte copies from the golden set
 * (see tests/data/io/README.md). */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cdiffusers/io.h"
#include "io/json.h"

/* ---------- helpers ---------- */

static void make_dir(const char *path) {
    assert_int_equal(mkdir(path, 0755) == 0 || errno == EEXIST, 1);
}

/* Counts files whose name contains ".tmp." in a folder (leftovers of atomic writes). */
static int count_temp_files(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (strstr(de->d_name, ".tmp.")) n++;
    closedir(d);
    return n;
}

/* Writes u64 header length + header text + ndata zero bytes. */
static void write_raw_st(const char *path, const char *header, size_t ndata) {
    size_t hl = strlen(header);
    size_t total = 8 + hl + ndata;
    uint8_t *b = calloc(1, total);
    assert_non_null(b);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, header, hl);
    assert_int_equal(tu_write_file(path, b, total), 0);
    free(b);
}

static uint64_t le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* ---------- round trip ---------- */

typedef struct rt_case {
    const char *name;
    cdf_dtype dt;
    int ndim;
    int64_t shape[8];
} rt_case;

static void fill_pattern(uint8_t *p, size_t n, cdf_dtype dt, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(i * 37u + seed * 11u + 5u);
    if (dt == CDF_BOOL)
        for (size_t i = 0; i < n; i++) p[i] &= 1;
}

static size_t case_bytes(const rt_case *c) {
    size_t n = 1;
    for (int i = 0; i < c->ndim; i++) n *= (size_t)c->shape[i];
    return n * cdf_dtype_size(c->dt);
}

static void test_roundtrip_all_dtypes(void **state) {
    (void)state;
    rt_case cases[64];
    int nc = 0;
    for (int d = 0; d < CDF_DTYPE_COUNT; d++) {
        static char names[CDF_DTYPE_COUNT][4][64];
        snprintf(names[d][0], 64, "t.%s.2x3", cdf_dtype_name((cdf_dtype)d));
        cases[nc++] = (rt_case){names[d][0], (cdf_dtype)d, 2, {2, 3}};
        snprintf(names[d][1], 64, "t.%s.scalar", cdf_dtype_name((cdf_dtype)d));
        cases[nc++] = (rt_case){names[d][1], (cdf_dtype)d, 0, {0}};
        snprintf(names[d][2], 64, "t.%s.empty", cdf_dtype_name((cdf_dtype)d));
        cases[nc++] = (rt_case){names[d][2], (cdf_dtype)d, 3, {3, 0, 2}};
        snprintf(names[d][3], 64, "t.%s.8d", cdf_dtype_name((cdf_dtype)d));
        cases[nc++] = (rt_case){names[d][3], (cdf_dtype)d, 8, {1, 2, 1, 2, 1, 3, 1, 2}};
    }
    cases[nc++] = (rt_case){"zero_len_1d", CDF_F32, 1, {0}};

    cdf_st_writer *w = cdf_st_writer_new();
    assert_non_null(w);
    uint8_t *data[64];
    for (int i = 0; i < nc; i++) {
        size_t nb = case_bytes(&cases[i]);
        data[i] = malloc(nb + 1);
        fill_pattern(data[i], nb, cases[i].dt, (unsigned)i);
        assert_int_equal(cdf_st_writer_add(w, cases[i].name, cases[i].dt, cases[i].ndim, cases[i].shape,
                                           nb ? data[i] : NULL),
                         CDF_OK);
    }
    const char *meta_val = "quote \" backslash \\ newline \n tab \t ctrl \x01 utf8 \xc3\xbc";
    assert_int_equal(cdf_st_writer_set_metadata(w, "format", "pt"), CDF_OK);
    assert_int_equal(cdf_st_writer_set_metadata(w, "note", "first"), CDF_OK);
    assert_int_equal(cdf_st_writer_set_metadata(w, "note", meta_val), CDF_OK); /* replaces */
    const char *path = tu_tmp_path("roundtrip.safetensors");
    assert_int_equal(cdf_st_writer_save(w, path), CDF_OK);
    cdf_st_writer_free(w);
    assert_int_equal(count_temp_files(tu_tmpdir()), 0);

    /* raw layout facts, read without the library */
    size_t flen;
    uint8_t *raw = (uint8_t *)tu_read_file(path, &flen);
    assert_non_null(raw);
    uint64_t hl = le64(raw);
    assert_int_equal(hl % 8, 0);
    assert_true(hl + 8 <= flen);
    assert_memory_equal(raw + 8, "{\"__metadata__\":{\"format\":\"pt\",\"note\":", 38);
    /* the header is valid JSON for an independent parser */
    cJSON *hj = cJSON_ParseWithLength((const char *)raw + 8, hl);
    assert_non_null(hj);
    const cJSON *note = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(hj, "__metadata__"), "note");
    assert_string_equal(note->valuestring, meta_val);
    cJSON_Delete(hj);

    cdf_st_file *f = NULL;
    assert_int_equal(cdf_st_open(path, &f), CDF_OK);
    assert_int_equal(cdf_st_count(f), nc);
    assert_string_equal(cdf_st_metadata(f, "format"), "pt");
    assert_string_equal(cdf_st_metadata(f, "note"), meta_val);
    assert_null(cdf_st_metadata(f, "absent"));
    assert_int_equal(cdf_st_metadata_count(f), 2);
    for (int i = 0; i < nc; i++) {
        const cdf_st_tensor *t = cdf_st_find(f, cases[i].name);
        assert_non_null(t);
        assert_string_equal(t->name, cases[i].name);
        assert_int_equal(t->dtype, cases[i].dt);
        assert_int_equal(t->ndim, cases[i].ndim);
        for (int d = 0; d < t->ndim; d++) assert_int_equal(t->shape[d], cases[i].shape[d]);
        size_t nb = case_bytes(&cases[i]);
        assert_int_equal(t->nbytes, nb);
        if (cases[i].ndim == 0) assert_int_equal(cdf_st_numel(t), 1);
        const uint8_t *p = cdf_st_data(f, t);
        assert_non_null(p);
        if (nb) assert_memory_equal(p, data[i], nb);
        /* every tensor is aligned to its element size in the file (8-aligned data start) */
        assert_int_equal((8 + hl + t->offset) % cdf_dtype_size(t->dtype), 0);
        uint8_t *buf = malloc(nb + 1);
        assert_int_equal(cdf_st_read_all(f, t, buf), CDF_OK);
        if (nb) assert_memory_equal(buf, data[i], nb);
        free(buf);
    }
    /* data order = descending element size (alignment), then name */
    for (int i = 1; i < nc; i++) {
        const cdf_st_tensor *a = cdf_st_tensor_at(f, i - 1), *b = cdf_st_tensor_at(f, i);
        size_t sa = cdf_dtype_size(a->dtype), sb = cdf_dtype_size(b->dtype);
        assert_true(sa >= sb);
        if (a->dtype == b->dtype) assert_true(strcmp(a->name, b->name) < 0);
        assert_true(b->offset == a->offset + a->nbytes);
    }
    assert_null(cdf_st_tensor_at(f, nc));
    assert_null(cdf_st_tensor_at(f, -1));
    assert_null(cdf_st_find(f, "nope"));
    cdf_st_close(f);
    for (int i = 0; i < nc; i++) free(data[i]);
    free(raw);
}

/* Expected bytes written by hand from the format definition (u64 LE length, compact JSON,
 * space padding to 8). */
static void test_writer_exact_bytes(void **state) {
    (void)state;
    const char *path = tu_tmp_path("exact.safetensors");
    float v[6] = {0, 1, 2, 3, 4, 5};
    int64_t shape[3] = {1, 2, 3};
    cdf_st_writer *w = cdf_st_writer_new();
    assert_int_equal(cdf_st_writer_add(w, "attn.0", CDF_F32, 3, shape, v), CDF_OK);
    assert_int_equal(cdf_st_writer_save(w, path), CDF_OK);
    cdf_st_writer_free(w);
    const char *hdr = "{\"attn.0\":{\"dtype\":\"F32\",\"shape\":[1,2,3],\"data_offsets\":[0,24]}}";
    assert_int_equal(strlen(hdr), 64); /* already a multiple of 8: no padding */
    size_t n;
    uint8_t *b = (uint8_t *)tu_read_file(path, &n);
    assert_int_equal(n, 8 + 64 + 24);
    assert_int_equal(le64(b), 64);
    assert_memory_equal(b + 8, hdr, 64);
    assert_memory_equal(b + 72, v, 24);
    free(b);

    /* no tensors: "{}" padded with 6 spaces */
    w = cdf_st_writer_new();
    assert_int_equal(cdf_st_writer_save(w, path), CDF_OK);
    b = (uint8_t *)tu_read_file(path, &n);
    assert_int_equal(n, 16);
    assert_int_equal(le64(b), 8);
    assert_memory_equal(b + 8, "{}      ", 8);
    free(b);
    /* metadata only: 35 bytes of JSON + 5 spaces */
    assert_int_equal(cdf_st_writer_set_metadata(w, "framework", "pt"), CDF_OK);
    assert_int_equal(cdf_st_writer_save(w, path), CDF_OK);
    cdf_st_writer_free(w);
    b = (uint8_t *)tu_read_file(path, &n);
    assert_int_equal(n, 48);
    assert_int_equal(le64(b), 40);
    assert_memory_equal(b + 8, "{\"__metadata__\":{\"framework\":\"pt\"}}     ", 40);
    free(b);
    cdf_st_file *f;
    assert_int_equal(cdf_st_open(path, &f), CDF_OK);
    assert_int_equal(cdf_st_count(f), 0);
    assert_string_equal(cdf_st_metadata(f, "framework"), "pt");
    cdf_st_close(f);
}

/* Re-writing a golden file (written by the reference generator with the safetensors layout)
 * through reader + writer must reproduce it byte for byte: same order, JSON and padding. */
static void rewrite_identical(const char *golden) {
    cdf_st_file *f = NULL;
    assert_int_equal(cdf_st_open(golden, &f), CDF_OK);
    cdf_st_writer *w = cdf_st_writer_new();
    for (int i = 0; i < cdf_st_count(f); i++) {
        const cdf_st_tensor *t = cdf_st_tensor_at(f, i);
        assert_int_equal(cdf_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, cdf_st_data(f, t)), CDF_OK);
    }
    const char *k, *v;
    for (int i = 0; cdf_st_metadata_at(f, i, &k, &v); i++) assert_int_equal(cdf_st_writer_set_metadata(w, k, v), CDF_OK);
    const char *out = tu_tmp_path("rewrite.safetensors");
    assert_int_equal(cdf_st_writer_save(w, out), CDF_OK);
    cdf_st_writer_free(w);
    cdf_st_close(f);
    size_t n1, n2;
    char *a = tu_read_file(golden, &n1), *b = tu_read_file(out, &n2);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(n1, n2);
    assert_memory_equal(a, b, n1);
    free(a);
    free(b);
}

static void test_golden_rewrite_identical(void **state) {
    (void)state;
    rewrite_identical(tu_data("io/vae_kl16_bf16/diffusion_pytorch_model.safetensors")); /* BF16, metadata */
    rewrite_identical(tu_data("io/torch_rand.safetensors"));  /* F64 + F32 mixed, no metadata */
    rewrite_identical(tu_data("io/vae_kl16_io.safetensors")); /* F32, other metadata */
}

/* The reader agrees with a header parsed independently here, and with facts from io.json. */
static void test_golden_header_independent(void **state) {
    (void)state;
    const char *path = tu_data("io/vae_kl16_bf16/diffusion_pytorch_model.safetensors");
    size_t n;
    uint8_t *raw = (uint8_t *)tu_read_file(path, &n);
    assert_non_null(raw);
    uint64_t hl = le64(raw);
    cJSON *h = cJSON_ParseWithLength((const char *)raw + 8, hl);
    assert_non_null(h);
    cdf_st_file *f;
    assert_int_equal(cdf_st_open(path, &f), CDF_OK);
    int count = 0;
    double total_numel = 0;
    for (const cJSON *e = h->child; e; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0) {
            assert_string_equal(cdf_st_metadata(f, "format"), cJSON_GetObjectItem(e, "format")->valuestring);
            continue;
        }
        count++;
        const cdf_st_tensor *t = cdf_st_find(f, e->string);
        assert_non_null(t);
        assert_string_equal(cdf_dtype_st_name(t->dtype), cJSON_GetObjectItem(e, "dtype")->valuestring);
        const cJSON *shape = cJSON_GetObjectItem(e, "shape");
        assert_int_equal(t->ndim, cJSON_GetArraySize(shape));
        double numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            assert_int_equal(t->shape[d], (int64_t)cJSON_GetArrayItem(shape, d)->valuedouble);
            numel *= cJSON_GetArrayItem(shape, d)->valuedouble;
        }
        total_numel += numel;
        const cJSON *off = cJSON_GetObjectItem(e, "data_offsets");
        uint64_t b = (uint64_t)cJSON_GetArrayItem(off, 0)->valuedouble, en = (uint64_t)cJSON_GetArrayItem(off, 1)->valuedouble;
        assert_int_equal(t->offset, b);
        assert_int_equal(t->nbytes, en - b);
        assert_int_equal(t->nbytes, (uint64_t)numel * 2);
        /* zero-copy pointer = the bytes at 8 + hl + begin in the raw file */
        assert_memory_equal(cdf_st_data(f, t), raw + 8 + hl + b, en - b);
    }
    assert_int_equal(cdf_st_count(f), count);
    cJSON_Delete(h);

    /* io.json: the model has 148 weight tensors and 252627 parameters */
    cJSON *io = NULL;
    assert_int_equal(cdf_json_load_file(tu_data("io/vae_kl16_io.json"), &io), CDF_OK);
    int64_t n_tensors, n_params;
    assert_int_equal(cdf_json_get_int(cJSON_GetObjectItem(io, "weight_init"), "n_tensors", -1, &n_tensors), CDF_OK);
    assert_int_equal(cdf_json_get_int(io, "n_parameters", -1, &n_params), CDF_OK);
    assert_int_equal(count, n_tensors);
    assert_true(total_numel == (double)n_params);
    const cdf_st_tensor *t = cdf_st_find(f, "decoder.conv_in.weight");
    assert_non_null(t);
    assert_int_equal(t->dtype, CDF_BF16);
    assert_int_equal(t->ndim, 4);
    assert_int_equal(t->shape[0], 32);
    assert_int_equal(t->shape[1], 16);
    cdf_st_close(f);

    /* values: statistics of the stored inputs, recomputed in double, match io.json */
    assert_int_equal(cdf_st_open(tu_data("io/vae_kl16_io.safetensors"), &f), CDF_OK);
    const char *keys[] = {"z", "x", "z_pipeline"};
    for (int k = 0; k < 3; k++) {
        t = cdf_st_find(f, keys[k]);
        assert_non_null(t);
        assert_int_equal(t->dtype, CDF_F32);
        int64_t ne = cdf_st_numel(t);
        float *x = malloc((size_t)t->nbytes);
        assert_int_equal(cdf_st_read_all(f, t, x), CDF_OK);
        double sum = 0, sum_abs = 0, max_abs = 0;
        for (int64_t i = 0; i < ne; i++) {
            sum += x[i];
            sum_abs += fabs(x[i]);
            if (fabs(x[i]) > max_abs) max_abs = fabs(x[i]);
        }
        const cJSON *st = cJSON_GetObjectItem(cJSON_GetObjectItem(io, "input_stats"), keys[k]);
        assert_non_null(st);
        double mean, mean_abs, mx;
        assert_int_equal(cdf_json_get_double(st, "mean", NAN, &mean), CDF_OK);
        assert_int_equal(cdf_json_get_double(st, "mean_abs", NAN, &mean_abs), CDF_OK);
        assert_int_equal(cdf_json_get_double(st, "max_abs", NAN, &mx), CDF_OK);
        assert_true(fabs(sum / ne - mean) < 1e-6);
        assert_true(fabs(sum_abs / ne - mean_abs) < 1e-6);
        assert_true(fabs(max_abs - mx) < 1e-7);
        free(x);
    }
    cdf_st_close(f);
    cJSON_Delete(io);
    free(raw);
}

/* ---------- slices and the byte counter ---------- */

static void test_slices_and_counter(void **state) {
    (void)state;
    enum { R = 6, C = 10 };
    float m[R][C];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) m[r][c] = (float)(r * 100 + c);
    uint16_t t3[4][3][5];
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 3; b++)
            for (int c = 0; c < 5; c++) t3[a][b][c] = (uint16_t)(a * 1000 + b * 10 + c);
    int16_t v1[7] = {-3, -2, -1, 0, 1, 2, 3};
    double scalar = 2.5;
    cdf_st_writer *w = cdf_st_writer_new();
    assert_int_equal(cdf_st_writer_add(w, "m", CDF_F32, 2, (int64_t[]){R, C}, m), CDF_OK);
    assert_int_equal(cdf_st_writer_add(w, "t3", CDF_BF16, 3, (int64_t[]){4, 3, 5}, t3), CDF_OK);
    assert_int_equal(cdf_st_writer_add(w, "v1", CDF_I16, 1, (int64_t[]){7}, v1), CDF_OK);
    assert_int_equal(cdf_st_writer_add(w, "s", CDF_F64, 0, NULL, &scalar), CDF_OK);
    const char *path = tu_tmp_path("slices.safetensors");
    assert_int_equal(cdf_st_writer_save(w, path), CDF_OK);
    cdf_st_writer_free(w);

    cdf_st_file *f;
    assert_int_equal(cdf_st_open(path, &f), CDF_OK);
    const cdf_st_tensor *tm = cdf_st_find(f, "m"), *tt3 = cdf_st_find(f, "t3"), *tv = cdf_st_find(f, "v1"),
                        *ts = cdf_st_find(f, "s");
    assert_non_null(tm);

    /* header parsing and zero-copy access are not counted */
    cdf_io_reset_counters();
    assert_int_equal(cdf_io_bytes_read(), 0);
    assert_non_null(cdf_st_data(f, tm));
    assert_int_equal(cdf_io_bytes_read(), 0);
    /* cdf_st_touch counts the whole tensor */
    assert_ptr_equal(cdf_st_touch(f, tm), cdf_st_data(f, tm));
    assert_int_equal(cdf_io_bytes_read(), sizeof m);
    cdf_io_reset_counters();

    /* rows 1..3 of m */
    float rows[3][C];
    assert_int_equal(cdf_st_read_rows(f, tm, 1, 3, rows), CDF_OK);
    assert_int_equal(cdf_io_bytes_read(), 3 * C * 4);
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < C; c++) assert_true(rows[r][c] == (float)((r + 1) * 100 + c));
    assert_memory_equal(rows, &m[1][0], sizeof rows);

    /* columns 2..6 of m: strided, only those bytes */
    cdf_io_reset_counters();
    float cols[R][5];
    assert_int_equal(cdf_st_read_cols(f, tm, 2, 5, cols), CDF_OK);
    assert_int_equal(cdf_io_bytes_read(), R * 5 * 4);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < 5; c++) assert_true(cols[r][c] == m[r][c + 2]);

    /* last-dim slice of a 3-D tensor: viewed as [12, 5] */
    cdf_io_reset_counters();
    uint16_t c3[4][3][2];
    assert_int_equal(cdf_st_read_cols(f, tt3, 1, 2, c3), CDF_OK);
    assert_int_equal(cdf_io_bytes_read(), 4 * 3 * 2 * 2);
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 3; b++)
            for (int c = 0; c < 2; c++) assert_int_equal(c3[a][b][c], t3[a][b][c + 1]);
    /* dim-0 rows of the 3-D tensor: contiguous [2, 3, 5] */
    cdf_io_reset_counters();
    uint16_t r3[2][3][5];
    assert_int_equal(cdf_st_read_rows(f, tt3, 2, 2, r3), CDF_OK);
    assert_int_equal(cdf_io_bytes_read(), sizeof r3);
    assert_memory_equal(r3, t3[2], sizeof r3);

    /* 1-D tensor: one row */
    cdf_io_reset_counters();
    int16_t c1[4];
    assert_int_equal(cdf_st_read_cols(f, tv, 2, 4, c1), CDF_OK);
    assert_int_equal(cdf_io_bytes_read(), 8);
    assert_memory_equal(c1, &v1[2], 8);

    /* full width = full read; byte range read */
    cdf_io_reset_counters();
    float full[R][C];
    assert_int_equal(cdf_st_read_cols(f, tm, 0, C, full), CDF_OK);
    assert_memory_equal(full, m, sizeof m);
    assert_int_equal(cdf_io_bytes_read(), sizeof m);
    cdf_io_reset_counters();
    float mid[3];
    assert_int_equal(cdf_st_read(f, tm, 4 * 7, 12, mid), CDF_OK);
    assert_int_equal(cdf_io_bytes_read(), 12);
    assert_true(mid[0] == m[0][7] && mid[2] == m[0][9]);
    double sv;
    assert_int_equal(cdf_st_read_all(f, ts, &sv), CDF_OK);
    assert_true(sv == 2.5);

    /* empty ranges read nothing; bad ranges fail without reading */
    cdf_io_reset_counters();
    assert_int_equal(cdf_st_read_rows(f, tm, R, 0, NULL), CDF_OK);
    assert_int_equal(cdf_st_read_cols(f, tm, 3, 0, NULL), CDF_OK);
    assert_int_equal(cdf_st_read(f, tm, sizeof m, 0, NULL), CDF_OK);
    assert_int_equal(cdf_st_read_rows(f, tm, 4, 3, rows), CDF_ERR_INVALID_ARG);
    assert_non_null(strstr(cdf_last_error(), "outside dim 0"));
    assert_int_equal(cdf_st_read_rows(f, tm, -1, 1, rows), CDF_ERR_INVALID_ARG);
    assert_int_equal(cdf_st_read_cols(f, tm, 8, 3, cols), CDF_ERR_INVALID_ARG);
    assert_non_null(strstr(cdf_last_error(), "'m'"));
    assert_int_equal(cdf_st_read_cols(f, tm, 0, -1, cols), CDF_ERR_INVALID_ARG);
    assert_int_equal(cdf_st_read(f, tm, sizeof m - 4, 8, mid), CDF_ERR_INVALID_ARG);
    assert_int_equal(cdf_st_read(f, tm, UINT64_MAX, 1, mid), CDF_ERR_INVALID_ARG);
    assert_int_equal(cdf_st_read_rows(f, ts, 0, 1, &sv), CDF_ERR_INVALID_ARG);
    assert_non_null(strstr(cdf_last_error(), "0-d"));
    assert_int_equal(cdf_st_read_cols(f, ts, 0, 1, &sv), CDF_ERR_INVALID_ARG);
    /* a tensor descriptor that is not from this file is refused */
    cdf_st_tensor fake = *tm;
    assert_int_equal(cdf_st_read_all(f, &fake, full), CDF_ERR_INVALID_ARG);
    assert_null(cdf_st_data(f, &fake));
    assert_int_equal(cdf_io_bytes_read(), 0);
    cdf_st_close(f);
}

/* ---------- checkpoints ---------- */

static void write_shard(const char *path, const char *n1, float v1, const char *n2, int64_t len2) {
    cdf_st_writer *w = cdf_st_writer_new();
    float a[4] = {v1, v1 + 1, v1 + 2, v1 + 3};
    assert_int_equal(cdf_st_writer_add(w, n1, CDF_F32, 2, (int64_t[]){2, 2}, a), CDF_OK);
    float b[8] = {0};
    for (int i = 0; i < 8; i++) b[i] = v1 * 10 + (float)i;
    assert_int_equal(cdf_st_writer_add(w, n2, CDF_F32, 1, (int64_t[]){len2}, len2 ? b : NULL), CDF_OK);
    assert_int_equal(cdf_st_writer_set_metadata(w, "format", "pt"), CDF_OK);
    assert_int_equal(cdf_st_writer_save(w, path), CDF_OK);
    cdf_st_writer_free(w);
}

static void test_checkpoint_sharded(void **state) {
    (void)state;
    char dir[1024], p[1100];
    snprintf(dir, sizeof dir, "%s/sharded", tu_tmpdir());
    make_dir(dir);
    snprintf(p, sizeof p, "%s/diffusion_pytorch_model-00001-of-00002.safetensors", dir);
    write_shard(p, "blocks.0.weight", 1, "blocks.0.bias", 8);
    snprintf(p, sizeof p, "%s/diffusion_pytorch_model-00002-of-00002.safetensors", dir);
    write_shard(p, "blocks.1.weight", 5, "empty", 0);
    snprintf(p, sizeof p, "%s/diffusion_pytorch_model.safetensors.index.json", dir);
    const char *index =
        "{\"metadata\": {\"total_size\": 64},\n \"weight_map\": {\n"
        "  \"blocks.0.weight\": \"diffusion_pytorch_model-00001-of-00002.safetensors\",\n"
        "  \"blocks.0.bias\": \"diffusion_pytorch_model-00001-of-00002.safetensors\",\n"
        "  \"blocks.1.weight\": \"diffusion_pytorch_model-00002-of-00002.safetensors\",\n"
        "  \"empty\": \"diffusion_pytorch_model-00002-of-00002.safetensors\"}}\n";
    assert_int_equal(tu_write_file(p, index, strlen(index)), 0);

    cdf_checkpoint *ck = NULL;
    assert_int_equal(cdf_checkpoint_open(dir, &ck), CDF_OK);
    assert_int_equal(cdf_checkpoint_count(ck), 4);
    assert_int_equal(cdf_checkpoint_file_count(ck), 2);
    const char *expect_names[] = {"blocks.0.bias", "blocks.0.weight", "blocks.1.weight", "empty"};
    for (int i = 0; i < 4; i++) assert_string_equal(cdf_checkpoint_name_at(ck, i), expect_names[i]);
    assert_null(cdf_checkpoint_name_at(ck, 4));
    const cdf_st_file *f;
    const cdf_st_tensor *t;
    assert_int_equal(cdf_checkpoint_find(ck, "blocks.1.weight", &f, &t), CDF_OK);
    assert_non_null(strstr(cdf_st_path(f), "00002-of-00002"));
    float buf[8];
    assert_int_equal(cdf_st_read_all(f, t, buf), CDF_OK);
    assert_true(buf[0] == 5 && buf[3] == 8);
    assert_int_equal(cdf_checkpoint_find(ck, "blocks.0.bias", &f, &t), CDF_OK);
    assert_non_null(strstr(cdf_st_path(f), "00001-of-00002"));
    assert_int_equal(cdf_st_read_cols(f, t, 6, 2, buf), CDF_OK);
    assert_true(buf[0] == 16 && buf[1] == 17);
    assert_int_equal(cdf_checkpoint_find(ck, "empty", NULL, &t), CDF_OK);
    assert_int_equal(t->nbytes, 0);
    assert_int_equal(cdf_checkpoint_tensor_at(ck, 1, &f, &t), CDF_OK);
    assert_string_equal(t->name, "blocks.0.weight");
    assert_int_equal(cdf_checkpoint_tensor_at(ck, 9, &f, &t), CDF_ERR_INVALID_ARG);
    assert_true(cdf_checkpoint_has(ck, "empty"));
    assert_false(cdf_checkpoint_has(ck, "blocks.2.weight"));
    assert_int_equal(cdf_checkpoint_find(ck, "blocks.2.weight", &f, &t), CDF_ERR_NOT_FOUND);
    assert_non_null(strstr(cdf_last_error(), "blocks.2.weight"));
    assert_non_null(strstr(cdf_last_error(), dir));
    cdf_checkpoint_close(ck);

    /* a folder with the single-file name; also the file path itself */
    assert_int_equal(cdf_checkpoint_open(tu_data("io/vae_kl16_bf16"), &ck), CDF_OK);
    assert_int_equal(cdf_checkpoint_count(ck), 148);
    assert_true(cdf_checkpoint_has(ck, "encoder.conv_in.weight"));
    cdf_checkpoint_close(ck);
    assert_int_equal(cdf_checkpoint_open(tu_data("io/torch_rand.safetensors"), &ck), CDF_OK);
    assert_int_equal(cdf_checkpoint_file_count(ck), 1);
    assert_true(cdf_checkpoint_count(ck) > 0);
    cdf_checkpoint_close(ck);

    /* several files, no index: merged */
    snprintf(dir, sizeof dir, "%s/multi", tu_tmpdir());
    make_dir(dir);
    snprintf(p, sizeof p, "%s/a.safetensors", dir);
    write_shard(p, "x", 1, "y", 2);
    snprintf(p, sizeof p, "%s/b.safetensors", dir);
    write_shard(p, "z", 1, "w", 2);
    assert_int_equal(cdf_checkpoint_open(dir, &ck), CDF_OK);
    assert_int_equal(cdf_checkpoint_count(ck), 4);
    assert_string_equal(cdf_checkpoint_name_at(ck, 0), "w");
    cdf_checkpoint_close(ck);
    /* ... a name in two files is an error */
    snprintf(p, sizeof p, "%s/c.safetensors", dir);
    write_shard(p, "x", 1, "q", 2);
    assert_int_equal(cdf_checkpoint_open(dir, &ck), CDF_ERR_FORMAT);
    assert_null(ck);
    assert_non_null(strstr(cdf_last_error(), "'x' is in both"));

    /* empty folder / missing path */
    snprintf(dir, sizeof dir, "%s/emptyck", tu_tmpdir());
    make_dir(dir);
    assert_int_equal(cdf_checkpoint_open(dir, &ck), CDF_ERR_NOT_FOUND);
    assert_non_null(strstr(cdf_last_error(), "no safetensors weights"));
    assert_int_equal(cdf_checkpoint_open(tu_tmp_path("does-not-exist"), &ck), CDF_ERR_NOT_FOUND);
}

/* ---------- malformed files ---------- */

typedef struct bad_case {
    const char *label;
    const char *header; /* NULL: use raw */
    size_t ndata;
    cdf_status status;
    const char *substring;
} bad_case;

#define T1(dt, shape, off) "{\"a\":{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":" off "}}"

static const bad_case k_bad[] = {
    {"bad_json", "{\"a\": ", 0, CDF_ERR_FORMAT, "is not valid JSON"},
    {"trailing_garbage", "{} x", 0, CDF_ERR_FORMAT, "unexpected data after"},
    {"not_object", "[1, 2]  ", 0, CDF_ERR_FORMAT, "expected a JSON object"},
    {"entry_not_object", "{\"a\": 5}", 0, CDF_ERR_FORMAT, "tensor 'a': entry is a number"},
    {"missing_dtype", "{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, CDF_ERR_FORMAT, "tensor 'a': missing \"dtype\""},
    {"missing_shape", "{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, CDF_ERR_FORMAT, "missing \"shape\""},
    {"missing_offsets", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, CDF_ERR_FORMAT, "missing \"data_offsets\""},
    {"dtype_not_string", "{\"a\":{\"dtype\":5,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, CDF_ERR_FORMAT, "\"dtype\" is a number"},
    {"shape_not_array", T1("F32", "4", "[0,16]"), 16, CDF_ERR_FORMAT, "\"shape\" is a number"},
    {"unknown_dtype", T1("Q4K", "[1]", "[0,4]"), 4, CDF_ERR_FORMAT, "unknown dtype 'Q4K' for tensor 'a'"},
    {"lowercase_dtype", T1("f32", "[1]", "[0,4]"), 4, CDF_ERR_FORMAT, "unknown dtype 'f32'"},
    {"fp8_e8m0_dtype", T1("F8_E8M0", "[4]", "[0,4]"), 4, CDF_ERR_DTYPE, "unsupported dtype F8_E8M0 for tensor 'a'"},
    {"u32_dtype", T1("U32", "[1]", "[0,4]"), 4, CDF_ERR_DTYPE, "unsupported dtype U32"},
    {"negative_dim", T1("F32", "[2,-3]", "[0,4]"), 4, CDF_ERR_FORMAT, "shape[1] is negative"},
    {"fraction_dim", T1("F32", "[2.5]", "[0,4]"), 4, CDF_ERR_FORMAT, "shape[0] is not a non-negative integer"},
    {"string_dim", T1("F32", "[\"2\"]", "[0,8]"), 8, CDF_ERR_FORMAT, "shape[0] is not a non-negative integer"},
    {"too_many_dims", T1("F32", "[1,1,1,1,1,1,1,1,1]", "[0,4]"), 4, CDF_ERR_FORMAT, "9 dims, more than the 8"},
    {"numel_overflow", T1("F32", "[4294967296,4294967296]", "[0,4]"), 4, CDF_ERR_FORMAT, "overflows"},
    {"bytes_overflow", T1("F64", "[2147483648,2147483648]", "[0,4]"), 4, CDF_ERR_FORMAT, "byte size of the shape overflows"},
    {"dim_over_2p53", T1("F32", "[9007199254740993]", "[0,4]"), 4, CDF_ERR_FORMAT, "below 2^53"},
    {"huge_offset", T1("F32", "[1]", "[0,1e300]"), 4, CDF_ERR_FORMAT, "below 2^53"},
    {"offsets_len", T1("F32", "[1]", "[0]"), 4, CDF_ERR_FORMAT, "expected an array of 2"},
    {"offsets_reversed", T1("F32", "[1]", "[8,4]"), 8, CDF_ERR_FORMAT, "end 4 is before begin 8"},
    {"offsets_beyond", T1("F32", "[4]", "[0,16]"), 12, CDF_ERR_FORMAT, "beyond the data section of 12 bytes"},
    {"nbytes_mismatch", T1("F32", "[2]", "[0,4]"), 8, CDF_ERR_FORMAT, "span 4 bytes but dtype F32 and the shape need 8"},
    {"overlap",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
     12, CDF_ERR_FORMAT, "'a' [0, 8) and 'b' [4, 12) overlap"},
    {"duplicate_name",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
     "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
     8, CDF_ERR_FORMAT, "'a' appears more than once"},
    {"metadata_not_object", "{\"__metadata__\": [1]}", 0, CDF_ERR_FORMAT, "\"__metadata__\" is an array"},
    {"metadata_not_string", "{\"__metadata__\": {\"k\": 1}}", 0, CDF_ERR_FORMAT, "key 'k' is a number; only strings"},
    {"deep_nesting", NULL, 0, CDF_ERR_LIMIT, "nests deeper than the limit of 128"},
    {"header_len_1", "{", 0, CDF_ERR_FORMAT, "too small for a JSON object"},
};

static void test_malformed_table(void **state) {
    (void)state;
    char path[1100];
    for (size_t i = 0; i < sizeof k_bad / sizeof *k_bad; i++) {
        const bad_case *c = &k_bad[i];
        snprintf(path, sizeof path, "%s/bad_%s.safetensors", tu_tmpdir(), c->label);
        if (c->header) {
            write_raw_st(path, c->header, c->ndata);
        } else { /* deep_nesting */
            char deep[512];
            memset(deep, '[', 300);
            strcpy(deep + 300, "");
            char hdr[600];
            snprintf(hdr, sizeof hdr, "{\"a\":%s}", deep);
            write_raw_st(path, hdr, 0);
        }
        cdf_st_file *f = (cdf_st_file *)(uintptr_t)1;
        cdf_status s = cdf_st_open(path, &f);
        if (s != c->status || !strstr(cdf_last_error(), c->substring) || !strstr(cdf_last_error(), path))
            print_error("case %s: status %d (want %d), message: %s\n", c->label, s, c->status, cdf_last_error());
        assert_int_equal(s, c->status);
        assert_non_null(strstr(cdf_last_error(), c->substring));
        assert_non_null(strstr(cdf_last_error(), path));
        assert_null(f);
    }

    /* raw-byte cases */
    cdf_st_file *f;
    snprintf(path, sizeof path, "%s/bad_short.safetensors", tu_tmpdir());
    assert_int_equal(tu_write_file(path, "\x10\0\0\0\0", 5), 0);
    assert_int_equal(cdf_st_open(path, &f), CDF_ERR_FORMAT);
    assert_non_null(strstr(cdf_last_error(), "5 bytes, shorter than the 8-byte"));
    snprintf(path, sizeof path, "%s/bad_empty.safetensors", tu_tmpdir());
    assert_int_equal(tu_write_file(path, "", 0), 0);
    assert_int_equal(cdf_st_open(path, &f), CDF_ERR_FORMAT);

    /* header length larger than the file (a truncated download) */
    snprintf(path, sizeof path, "%s/bad_truncated.safetensors", tu_tmpdir());
    uint8_t tr[8 + 10] = {0xe8, 0x03}; /* 1000 */
    memcpy(tr + 8, "{\"a\":{\"dt", 10);
    assert_int_equal(tu_write_file(path, tr, sizeof tr), 0);
    assert_int_equal(cdf_st_open(path, &f), CDF_ERR_FORMAT);
    assert_non_null(strstr(cdf_last_error(), "header length 1000 exceeds the 10 bytes"));
    /* a valid file cut short inside its data section */
    snprintf(path, sizeof path, "%s/bad_cut.safetensors", tu_tmpdir());
    write_raw_st(path, T1("F32", "[4]", "[0,16]"), 16);
    assert_int_equal(truncate(path, 8 + (off_t)strlen(T1("F32", "[4]", "[0,16]")) + 10), 0);
    assert_int_equal(cdf_st_open(path, &f), CDF_ERR_FORMAT);
    assert_non_null(strstr(cdf_last_error(), "beyond the data section of 10 bytes"));

    /* absurd header length in a (sparse) file big enough to hold it */
    snprintf(path, sizeof path, "%s/bad_absurd.safetensors", tu_tmpdir());
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    uint64_t absurd = 120ull * 1024 * 1024;
    uint8_t lenb[8];
    for (int i = 0; i < 8; i++) lenb[i] = (uint8_t)(absurd >> (8 * i));
    assert_int_equal(write(fd, lenb, 8), 8);
    assert_int_equal(ftruncate(fd, (off_t)(8 + absurd + 16)), 0);
    close(fd);
    assert_int_equal(cdf_st_open(path, &f), CDF_ERR_LIMIT);
    assert_non_null(strstr(cdf_last_error(), "over the limit of 104857600 bytes"));
    unlink(path);

    /* not a file / missing */
    assert_int_equal(cdf_st_open(tu_tmpdir(), &f), CDF_ERR_IO);
    assert_non_null(strstr(cdf_last_error(), "not a regular file"));
    assert_int_equal(cdf_st_open(tu_tmp_path("missing.safetensors"), &f), CDF_ERR_NOT_FOUND);
    assert_non_null(strstr(cdf_last_error(), "does not exist"));
    assert_int_equal(cdf_st_open(NULL, &f), CDF_ERR_INVALID_ARG);

    /* tolerated: gaps between tensors and trailing bytes; zero-size tensors anywhere */
    snprintf(path, sizeof path, "%s/ok_gaps.safetensors", tu_tmpdir());
    write_raw_st(path,
                 "{\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[8,10]},"
                 "\"e\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[9,9]},"
                 "\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}",
                 16);
    assert_int_equal(cdf_st_open(path, &f), CDF_OK);
    assert_string_equal(cdf_st_tensor_at(f, 0)->name, "a"); /* data order */
    assert_string_equal(cdf_st_tensor_at(f, 1)->name, "b");
    assert_string_equal(cdf_st_tensor_at(f, 2)->name, "e"); /* zero-size: occupies no bytes */
    assert_non_null(cdf_st_find(f, "e"));
    cdf_st_close(f);
}

static void test_malformed_index(void **state) {
    (void)state;
    struct {
        const char *label, *index;
        cdf_status status;
        const char *substring;
    } cases[] = {
        {"missing_shard", "{\"weight_map\":{\"x\":\"shard1.safetensors\",\"q\":\"shard9.safetensors\"}}",
         CDF_ERR_NOT_FOUND, "names shard 'shard9.safetensors', which does not exist"},
        {"dotdot_shard", "{\"weight_map\":{\"x\":\"../shard1.safetensors\"}}", CDF_ERR_FORMAT,
         "shard file name '../shard1.safetensors' for tensor 'x' must be a plain file name"},
        {"subdir_shard", "{\"weight_map\":{\"x\":\"sub/shard1.safetensors\"}}", CDF_ERR_FORMAT, "plain file name"},
        {"abs_shard", "{\"weight_map\":{\"x\":\"/etc/passwd\"}}", CDF_ERR_FORMAT, "plain file name"},
        {"dotdot_only", "{\"weight_map\":{\"x\":\"..\"}}", CDF_ERR_FORMAT, "plain file name"},
        {"backslash", "{\"weight_map\":{\"x\":\"..\\\\shard1.safetensors\"}}", CDF_ERR_FORMAT, "plain file name"},
        {"tensor_not_in_shard", "{\"weight_map\":{\"x\":\"shard1.safetensors\",\"nope\":\"shard1.safetensors\"}}",
         CDF_ERR_FORMAT, "maps tensor 'nope' to shard 'shard1.safetensors', but that shard has no such tensor"},
        {"no_weight_map", "{\"metadata\":{}}", CDF_ERR_FORMAT, "missing \"weight_map\""},
        {"value_not_string", "{\"weight_map\":{\"x\":3}}", CDF_ERR_FORMAT, "entry for tensor 'x' is not a string"},
        {"duplicate_key", "{\"weight_map\":{\"x\":\"shard1.safetensors\",\"x\":\"shard1.safetensors\"}}",
         CDF_ERR_FORMAT, "tensor 'x' appears twice"},
        {"bad_json", "{\"weight_map\":", CDF_ERR_FORMAT, "is not valid JSON"},
    };
    char dir[1100], p[1200];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        snprintf(dir, sizeof dir, "%s/idx_%s", tu_tmpdir(), cases[i].label);
        make_dir(dir);
        snprintf(p, sizeof p, "%s/shard1.safetensors", dir);
        write_shard(p, "x", 1, "y", 2);
        snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
        assert_int_equal(tu_write_file(p, cases[i].index, strlen(cases[i].index)), 0);
        cdf_checkpoint *ck = (cdf_checkpoint *)(uintptr_t)1;
        cdf_status s = cdf_checkpoint_open(dir, &ck);
        if (s != cases[i].status || !strstr(cdf_last_error(), cases[i].substring))
            print_error("case %s: status %d (want %d), message: %s\n", cases[i].label, s, cases[i].status,
                        cdf_last_error());
        assert_int_equal(s, cases[i].status);
        assert_non_null(strstr(cdf_last_error(), cases[i].substring));
        assert_null(ck);
    }
    /* a bad shard surfaces its own error through the checkpoint */
    snprintf(dir, sizeof dir, "%s/idx_bad_shard", tu_tmpdir());
    make_dir(dir);
    snprintf(p, sizeof p, "%s/s.safetensors", dir);
    write_raw_st(p, T1("F32", "[-1]", "[0,4]"), 4);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    const char *idx = "{\"weight_map\":{\"a\":\"s.safetensors\"}}";
    assert_int_equal(tu_write_file(p, idx, strlen(idx)), 0);
    cdf_checkpoint *ck;
    assert_int_equal(cdf_checkpoint_open(dir, &ck), CDF_ERR_FORMAT);
    assert_non_null(strstr(cdf_last_error(), "s.safetensors': tensor 'a': shape[0] is negative"));
}

/* ---------- writer errors and atomicity ---------- */

static void test_writer_errors(void **state) {
    (void)state;
    cdf_st_writer *w = cdf_st_writer_new();
    float x[4] = {1, 2, 3, 4};
    assert_int_equal(cdf_st_writer_add(w, "a", CDF_F32, 1, (int64_t[]){4}, x), CDF_OK);
    assert_int_equal(cdf_st_writer_add(w, "a", CDF_F32, 1, (int64_t[]){4}, x), CDF_ERR_INVALID_ARG);
    assert_non_null(strstr(cdf_last_error(), "'a' was already added"));
    assert_int_equal(cdf_st_writer_add(w, "__metadata__", CDF_F32, 1, (int64_t[]){4}, x), CDF_ERR_INVALID_ARG);
    assert_int_equal(cdf_st_writer_add(w, "", CDF_F32, 1, (int64_t[]){4}, x), CDF_ERR_INVALID_ARG);
    assert_int_equal(cdf_st_writer_add(w, "n", CDF_F32, 2, (int64_t[]){4, -1}, x), CDF_ERR_INVALID_ARG);
    assert_non_null(strstr(cdf_last_error(), "shape[1] = -1 is negative"));
    assert_int_equal(cdf_st_writer_add(w, "n", CDF_F32, 9, (int64_t[]){1, 1, 1, 1, 1, 1, 1, 1, 1}, x), CDF_ERR_INVALID_ARG);
    assert_int_equal(cdf_st_writer_add(w, "n", CDF_DTYPE_COUNT, 1, (int64_t[]){4}, x), CDF_ERR_INVALID_ARG);
    assert_int_equal(cdf_st_writer_add(w, "n", CDF_F32, 1, (int64_t[]){4}, NULL), CDF_ERR_INVALID_ARG);
    assert_int_equal(cdf_st_writer_add(w, "n", CDF_F32, 2, (int64_t[]){INT64_MAX, 4}, x), CDF_ERR_INVALID_ARG);
    assert_non_null(strstr(cdf_last_error(), "overflow"));

    /* missing folder: error names it, nothing is created */
    char p[1200];
    snprintf(p, sizeof p, "%s/no_such_dir/w.safetensors", tu_tmpdir());
    assert_int_equal(cdf_st_writer_save(w, p), CDF_ERR_IO);
    assert_non_null(strstr(cdf_last_error(), "no_such_dir' does not exist"));
    /* a path under a regular file */
    const char *reg = tu_tmp_path("regular_file");
    assert_int_equal(tu_write_file(reg, "x", 1), 0);
    snprintf(p, sizeof p, "%s/w.safetensors", reg);
    assert_int_equal(cdf_st_writer_save(w, p), CDF_ERR_IO);
    assert_non_null(strstr(cdf_last_error(), "is not a folder"));

    /* an existing file is replaced atomically; a failed save leaves it untouched */
    char dir[1100];
    snprintf(dir, sizeof dir, "%s/atomic_st", tu_tmpdir());
    make_dir(dir);
    snprintf(p, sizeof p, "%s/w.safetensors", dir);
    assert_int_equal(tu_write_file(p, "old", 3), 0);
    assert_int_equal(cdf_st_writer_save(w, p), CDF_OK);
    cdf_st_file *f;
    assert_int_equal(cdf_st_open(p, &f), CDF_OK);
    assert_int_equal(cdf_st_count(f), 1);
    cdf_st_close(f);
    size_t good_len;
    char *good = tu_read_file(p, &good_len);

    float *big = calloc(1 << 18, sizeof(float));
    assert_int_equal(cdf_st_writer_add(w, "big", CDF_F32, 1, (int64_t[]){1 << 18}, big), CDF_OK);
    free(big);
    /* make writes fail with EFBIG past 64 KiB (works as root, unlike chmod) */
    struct rlimit old;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = {65536, old.rlim_max};
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    cdf_status s = cdf_st_writer_save(w, p);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, prev);
    assert_int_equal(s, CDF_ERR_IO);
    assert_non_null(strstr(cdf_last_error(), p));
    size_t now_len;
    char *now = tu_read_file(p, &now_len);
    assert_int_equal(now_len, good_len);
    assert_memory_equal(now, good, good_len);
    assert_int_equal(count_temp_files(dir), 0);
    free(now);
    free(good);
    cdf_st_writer_free(w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_all_dtypes),
        cmocka_unit_test(test_writer_exact_bytes),
        cmocka_unit_test(test_golden_rewrite_identical),
        cmocka_unit_test(test_golden_header_independent),
        cmocka_unit_test(test_slices_and_counter),
        cmocka_unit_test(test_checkpoint_sharded),
        cmocka_unit_test(test_malformed_table),
        cmocka_unit_test(test_malformed_index),
        cmocka_unit_test(test_writer_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
