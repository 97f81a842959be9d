/* torch-compatible CPU generator: every golden rng/ entry must match bit for bit.
 * Golden data: tests/data/rng/ (byte-identical copies of the golden rng/ folder). */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cdiffusers/rng.h"

/* ---- a tiny self-contained safetensors reader (the test must not depend on src/io) ------ */

typedef struct {
    char *buf;      /* whole file */
    size_t len;
    cJSON *header;
    size_t data_start;
} st_file;

static int st_open(st_file *f, const char *path) {
    memset(f, 0, sizeof *f);
    f->buf = tu_read_file(path, &f->len);
    if (!f->buf || f->len < 8) return -1;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | (unsigned char)f->buf[i];
    if (hlen > f->len - 8) return -1;
    f->header = cJSON_ParseWithLength(f->buf + 8, (size_t)hlen);
    if (!f->header) return -1;
    f->data_start = 8 + (size_t)hlen;
    return 0;
}

static void st_close(st_file *f) {
    cJSON_Delete(f->header);
    free(f->buf);
    memset(f, 0, sizeof *f);
}

/* Data of tensor `key`, its dtype string, byte size and shape; NULL if absent or malformed. */
static const void *st_get(const st_file *f, const char *key, const char **dtype, size_t *nbytes,
                          int64_t *shape, int *ndim) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(f->header, key);
    if (!t) return NULL;
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(t, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(t, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
    if (!cJSON_IsString(dt) || !cJSON_IsArray(sh) || cJSON_GetArraySize(off) != 2) return NULL;
    double b = cJSON_GetArrayItem(off, 0)->valuedouble, e = cJSON_GetArrayItem(off, 1)->valuedouble;
    if (b < 0 || e < b || f->data_start + (size_t)e > f->len) return NULL;
    if (dtype) *dtype = dt->valuestring;
    if (nbytes) *nbytes = (size_t)(e - b);
    if (ndim) {
        int n = cJSON_GetArraySize(sh);
        if (n > 8) return NULL;
        for (int i = 0; i < n; i++) shape[i] = (int64_t)cJSON_GetArrayItem(sh, i)->valuedouble;
        *ndim = n;
    }
    return f->buf + f->data_start + (size_t)b;
}

static cJSON *load_json(const char *rel) {
    char *txt = tu_read_file(tu_data(rel), NULL);
    assert_non_null(txt);
    cJSON *j = cJSON_Parse(txt);
    free(txt);
    assert_non_null(j);
    return j;
}

static int64_t json_shape(const cJSON *e, int64_t *shape, int *ndim) {
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    int n = cJSON_GetArraySize(sh);
    assert_true(n >= 1 && n <= 8);
    int64_t numel = 1;
    for (int i = 0; i < n; i++) {
        shape[i] = (int64_t)cJSON_GetArrayItem(sh, i)->valuedouble;
        numel *= shape[i];
    }
    *ndim = n;
    return numel;
}

static uint64_t json_u64(const cJSON *e, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(e, key);
    assert_true(cJSON_IsNumber(v));
    /* 4294967338 is exact in a double */
    return (uint64_t)v->valuedouble;
}

/* Compare bytes; on mismatch print the first differing element. */
static void expect_same(const char *key, const void *got, const void *want, size_t nbytes, size_t esize) {
    if (memcmp(got, want, nbytes) == 0) return;
    for (size_t i = 0; i < nbytes / esize; i++) {
        if (memcmp((const char *)got + i * esize, (const char *)want + i * esize, esize) != 0) {
            if (esize == 4) {
                float a, b;
                memcpy(&a, (const char *)got + i * 4, 4);
                memcpy(&b, (const char *)want + i * 4, 4);
                print_error("%s: element %zu differs: got %.9g want %.9g\n", key, i, a, b);
            } else if (esize == 8) {
                double a, b;
                memcpy(&a, (const char *)got + i * 8, 8);
                memcpy(&b, (const char *)want + i * 8, 8);
                print_error("%s: element %zu differs: got %.17g want %.17g\n", key, i, a, b);
            } else {
                uint16_t a, b;
                memcpy(&a, (const char *)got + i * 2, 2);
                memcpy(&b, (const char *)want + i * 2, 2);
                print_error("%s: element %zu differs: got 0x%04x want 0x%04x\n", key, i, a, b);
            }
            break;
        }
    }
    fail_msg("%s: not bit-exact", key);
}

static cdf_dtype dtype_of(const char *torch_name) {
    if (strcmp(torch_name, "float32") == 0) return CDF_F32;
    if (strcmp(torch_name, "float64") == 0) return CDF_F64;
    if (strcmp(torch_name, "bfloat16") == 0) return CDF_BF16;
    if (strcmp(torch_name, "float16") == 0) return CDF_F16;
    fail_msg("unknown dtype %s", torch_name);
    return CDF_F32;
}

static const char *st_name(cdf_dtype dt) {
    switch (dt) {
    case CDF_F32: return "F32";
    case CDF_F64: return "F64";
    case CDF_BF16: return "BF16";
    case CDF_F16: return "F16";
    default: return "?";
    }
}

/* Look the golden tensor up and check that its dtype/shape agree with the json entry. */
static const void *golden(const st_file *f, const char *key, cdf_dtype dt, const int64_t *shape, int ndim, size_t *nbytes) {
    const char *sdt = NULL;
    int64_t gshape[8];
    int gndim = 0;
    const void *p = st_get(f, key, &sdt, nbytes, gshape, &gndim);
    if (!p) fail_msg("golden tensor %s missing or malformed", key);
    assert_string_equal(sdt, st_name(dt));
    assert_int_equal(gndim, ndim);
    for (int i = 0; i < ndim; i++) assert_int_equal(gshape[i], shape[i]);
    return p;
}

/* ---- tests ------------------------------------------------------------------------------ */

/* The C++ standard fixes std::mt19937's 10000th output for the default seed 5489: an
 * independent check of the engine and of its seeding. */
static void test_mt19937_standard_value(void **state) {
    (void)state;
    cdf_generator *g = cdf_generator_new(5489);
    assert_non_null(g);
    uint32_t v = 0;
    for (int i = 0; i < 10000; i++) v = cdf_generator_next_u32(g);
    assert_int_equal(v, 4123659995u);
    cdf_generator_free(g);
}

static void test_torch_randn_all(void **state) {
    (void)state;
    st_file f;
    assert_int_equal(st_open(&f, tu_data("rng/torch_randn.safetensors")), 0);
    cJSON *j = load_json("rng/torch_randn.json");
    const cJSON *entries = cJSON_GetObjectItemCaseSensitive(j, "entries");
    int count = 0, big = 0, half = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, entries) {
        const char *key = cJSON_GetObjectItemCaseSensitive(e, "key")->valuestring;
        cdf_dtype dt = dtype_of(cJSON_GetObjectItemCaseSensitive(e, "dtype")->valuestring);
        uint64_t seed = json_u64(e, "seed");
        int64_t shape[8];
        int ndim;
        int64_t numel = json_shape(e, shape, &ndim);
        size_t nbytes;
        const void *want = golden(&f, key, dt, shape, ndim, &nbytes);
        size_t esize = cdf_dtype_size(dt);
        assert_int_equal(nbytes, (size_t)numel * esize);
        void *got = malloc(nbytes);
        assert_non_null(got);
        cdf_generator *g = cdf_generator_new(seed);
        assert_non_null(g);
        switch (dt) {
        case CDF_F32: assert_int_equal(cdf_randn_f32(g, got, numel), CDF_OK); break;
        case CDF_BF16: assert_int_equal(cdf_randn_bf16(g, got, numel), CDF_OK); half++; break;
        case CDF_F16: assert_int_equal(cdf_randn_f16(g, got, numel), CDF_OK); half++; break;
        default: fail();
        }
        expect_same(key, got, want, nbytes, esize);
        /* the dtype-dispatching entry point gives the same numbers */
        cdf_generator_manual_seed(g, seed);
        memset(got, 0, nbytes);
        assert_int_equal(cdf_randn(g, dt, got, numel), CDF_OK);
        expect_same(key, got, want, nbytes, esize);
        if (numel >= 16 * 4096) big++;
        cdf_generator_free(g);
        free(got);
        count++;
    }
    assert_int_equal(count, 67);
    assert_int_equal(big, 3); /* 1x4096x64, 1x16x128x128, 1x128x32x32 */
    assert_int_equal(half, 12);
    cJSON_Delete(j);
    st_close(&f);
}

static void test_torch_rand_all(void **state) {
    (void)state;
    st_file f;
    assert_int_equal(st_open(&f, tu_data("rng/torch_rand.safetensors")), 0);
    cJSON *j = load_json("rng/torch_rand.json");
    int count = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(j, "entries")) {
        const char *key = cJSON_GetObjectItemCaseSensitive(e, "key")->valuestring;
        cdf_dtype dt = dtype_of(cJSON_GetObjectItemCaseSensitive(e, "dtype")->valuestring);
        int64_t shape[8];
        int ndim;
        int64_t numel = json_shape(e, shape, &ndim);
        size_t nbytes;
        const void *want = golden(&f, key, dt, shape, ndim, &nbytes);
        assert_int_equal(nbytes, (size_t)numel * cdf_dtype_size(dt));
        void *got = malloc(nbytes);
        assert_non_null(got);
        cdf_generator *g = cdf_generator_new(json_u64(e, "seed"));
        if (dt == CDF_F32)
            assert_int_equal(cdf_rand_f32(g, got, numel), CDF_OK);
        else
            assert_int_equal(cdf_rand_f64(g, got, numel), CDF_OK);
        expect_same(key, got, want, nbytes, cdf_dtype_size(dt));
        cdf_generator_free(g);
        free(got);
        count++;
    }
    assert_int_equal(count, 12);
    cJSON_Delete(j);
    st_close(&f);
}

/* Consecutive calls on one generator, including the cached second normal value of the
 * numel<16 path surviving rand and numel>=16 calls. */
static void test_call_sequences(void **state) {
    (void)state;
    st_file f;
    assert_int_equal(st_open(&f, tu_data("rng/torch_rng_sequences.safetensors")), 0);
    cJSON *j = load_json("rng/torch_rng_sequences.json");
    cdf_generator *g = NULL;
    uint64_t cur_seed = UINT64_MAX;
    int expect_index = 0, count = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(j, "entries")) {
        const char *key = cJSON_GetObjectItemCaseSensitive(e, "key")->valuestring;
        const char *call = cJSON_GetObjectItemCaseSensitive(e, "call")->valuestring;
        uint64_t seed = json_u64(e, "seed");
        int idx = (int)json_u64(e, "call_index");
        if (seed != cur_seed) {
            cdf_generator_free(g);
            g = cdf_generator_new(seed);
            cur_seed = seed;
            expect_index = 0;
        }
        assert_int_equal(idx, expect_index); /* entries are listed in call order */
        expect_index++;
        int64_t shape[8];
        int ndim;
        int64_t numel = json_shape(e, shape, &ndim);
        size_t nbytes;
        const float *want = golden(&f, key, CDF_F32, shape, ndim, &nbytes);
        float *got = malloc(nbytes);
        assert_non_null(got);
        if (strncmp(call, "torch.randn(", 12) == 0)
            assert_int_equal(cdf_randn_f32(g, got, numel), CDF_OK);
        else if (strncmp(call, "torch.rand(", 11) == 0)
            assert_int_equal(cdf_rand_f32(g, got, numel), CDF_OK);
        else
            fail_msg("unknown call %s", call);
        expect_same(key, got, want, nbytes, 4);
        free(got);
        count++;
    }
    assert_int_equal(count, 14);
    cdf_generator_free(g);
    cJSON_Delete(j);
    st_close(&f);
}

static void test_randn_tensor(void **state) {
    (void)state;
    st_file f;
    assert_int_equal(st_open(&f, tu_data("rng/randn_tensor.safetensors")), 0);
    int64_t shape1[4] = {1, 16, 8, 8}, shape2[4] = {2, 16, 8, 8};
    size_t nbytes;
    const float *want1 = golden(&f, "randn_tensor_s0_1x16x8x8", CDF_F32, shape1, 4, &nbytes);
    assert_int_equal(nbytes, 1024 * 4);
    float got[2048];
    cdf_generator *g0 = cdf_generator_new(0), *g1 = cdf_generator_new(1);
    assert_int_equal(cdf_randn_tensor_f32(&g0, 1, shape1, 4, got), CDF_OK);
    expect_same("randn_tensor_s0_1x16x8x8", got, want1, nbytes, 4);

    const float *want2 = golden(&f, "randn_tensor_list_s0-1_2x16x8x8", CDF_F32, shape2, 4, &nbytes);
    assert_int_equal(nbytes, 2048 * 4);
    cdf_generator_manual_seed(g0, 0);
    cdf_generator *gens[2] = {g0, g1};
    assert_int_equal(cdf_randn_tensor_f32(gens, 2, shape2, 4, got), CDF_OK);
    expect_same("randn_tensor_list_s0-1_2x16x8x8", got, want2, nbytes, 4);

    /* A list of generators differs from one generator drawing the whole batch. */
    float single[2048];
    cdf_generator_manual_seed(g0, 0);
    assert_int_equal(cdf_randn_tensor_f32(&g0, 1, shape2, 4, single), CDF_OK);
    assert_memory_not_equal(single + 1024, got + 1024, 1024 * 4);

    /* Errors: generator count must match the batch; NULLs; bad dims; bad dtype. */
    cdf_generator *three[3] = {g0, g1, g0};
    assert_int_equal(cdf_randn_tensor_f32(three, 3, shape2, 4, got), CDF_ERR_SHAPE);
    assert_non_null(strstr(cdf_last_error(), "3 generators"));
    cdf_generator *withnull[2] = {g0, NULL};
    assert_int_equal(cdf_randn_tensor_f32(withnull, 2, shape2, 4, got), CDF_ERR_INVALID_ARG);
    assert_int_equal(cdf_randn_tensor_f32(gens, 0, shape2, 4, got), CDF_ERR_INVALID_ARG);
    assert_int_equal(cdf_randn_tensor_f32(gens, 2, shape2, 0, got), CDF_ERR_INVALID_ARG);
    int64_t neg[2] = {2, -1};
    assert_int_equal(cdf_randn_tensor_f32(gens, 2, neg, 2, got), CDF_ERR_SHAPE);
    int64_t huge[3] = {2, INT64_MAX / 4, 8};
    assert_int_equal(cdf_randn_tensor_f32(gens, 2, huge, 3, got), CDF_ERR_SHAPE);
    assert_int_equal(cdf_randn_tensor(gens, 2, shape2, 4, CDF_I64, got), CDF_ERR_DTYPE);
    /* bf16 through randn_tensor equals cdf_randn_bf16 per batch element */
    uint16_t hb[2048], hb2[1024];
    cdf_generator_manual_seed(g0, 0);
    cdf_generator_manual_seed(g1, 1);
    assert_int_equal(cdf_randn_tensor(gens, 2, shape2, 4, CDF_BF16, hb), CDF_OK);
    cdf_generator_manual_seed(g1, 1);
    assert_int_equal(cdf_randn_bf16(g1, hb2, 1024), CDF_OK);
    assert_memory_equal(hb + 1024, hb2, 1024 * 2);

    cdf_generator_free(g0);
    cdf_generator_free(g1);
    st_close(&f);
}

/* manual_seed clears the cached normal; clone/copy continue the stream identically;
 * a seed >= 2^32 keeps its full value as initial_seed but seeds with the low 32 bits. */
static void test_state_handling(void **state) {
    (void)state;
    st_file f;
    assert_int_equal(st_open(&f, tu_data("rng/torch_randn.safetensors")), 0);
    int64_t shp[1] = {1};
    size_t nbytes;
    const float *want = golden(&f, "randn_f32_s0_1", CDF_F32, shp, 1, &nbytes);

    cdf_generator *g = cdf_generator_new(0);
    float a[64], b[64];
    assert_int_equal(cdf_randn_f32(g, a, 1), CDF_OK); /* caches a second value */
    cdf_generator_manual_seed(g, 0);
    assert_int_equal(cdf_randn_f32(g, b, 1), CDF_OK);
    assert_memory_equal(b, want, 4);

    /* clone in the middle of a stream, with a cached value pending */
    cdf_generator_manual_seed(g, 7);
    assert_int_equal(cdf_randn_f32(g, a, 3), CDF_OK);
    cdf_generator *c = cdf_generator_clone(g);
    assert_non_null(c);
    assert_int_equal(cdf_randn_f32(g, a, 1), CDF_OK);
    assert_int_equal(cdf_randn_f32(g, a + 1, 40), CDF_OK);
    assert_int_equal(cdf_randn_f32(c, b, 1), CDF_OK);
    assert_int_equal(cdf_randn_f32(c, b + 1, 40), CDF_OK);
    assert_memory_equal(a, b, 41 * 4);

    /* snapshot / restore with copy */
    cdf_generator *snap = cdf_generator_new(123);
    assert_int_equal(cdf_generator_copy(snap, g), CDF_OK);
    assert_int_equal(cdf_randn_f32(g, a, 5), CDF_OK);
    assert_int_equal(cdf_generator_copy(g, snap), CDF_OK);
    assert_int_equal(cdf_randn_f32(g, b, 5), CDF_OK);
    assert_memory_equal(a, b, 5 * 4);
    assert_int_equal(cdf_generator_copy(NULL, g), CDF_ERR_INVALID_ARG);
    assert_null(cdf_generator_clone(NULL));

    cdf_generator_manual_seed(g, 4294967338ull);
    assert_true(cdf_generator_initial_seed(g) == 4294967338ull);
    cdf_generator_free(g);
    cdf_generator_free(c);
    cdf_generator_free(snap);
    st_close(&f);
}

/* float64 randn (no golden file): the uniforms are golden (torch.rand float64 draws the same
 * 53-bit numbers) and the Box-Muller transform is evaluated here in double as torch's generic
 * normal_fill does; numel<16 must equal the float32 path before its final cast. */
static void test_randn_f64(void **state) {
    (void)state;
    st_file f;
    assert_int_equal(st_open(&f, tu_data("rng/torch_rand.safetensors")), 0);
    int64_t shp[1] = {16};
    size_t nbytes;
    const double *u = golden(&f, "rand_f64_s0_16", CDF_F64, shp, 1, &nbytes);
    double want[16], got[16];
    for (int j = 0; j < 8; j++) {
        double r = sqrt(-2.0 * log(1.0 - u[j])), th = 2.0 * M_PI * u[j + 8];
        want[j] = r * cos(th);
        want[j + 8] = r * sin(th);
    }
    cdf_generator *g = cdf_generator_new(0);
    assert_int_equal(cdf_randn(g, CDF_F64, got, 16), CDF_OK);
    for (int i = 0; i < 16; i++) assert_true(fabs(got[i] - want[i]) <= 1e-15 * (1 + fabs(want[i])));

    double d7[7];
    float f7[7];
    cdf_generator_manual_seed(g, 42);
    assert_int_equal(cdf_randn(g, CDF_F64, d7, 7), CDF_OK);
    cdf_generator_manual_seed(g, 42);
    assert_int_equal(cdf_randn_f32(g, f7, 7), CDF_OK);
    for (int i = 0; i < 7; i++) assert_true((float)d7[i] == f7[i]);
    cdf_generator_free(g);
    st_close(&f);
}

static void test_errors(void **state) {
    (void)state;
    cdf_generator *g = cdf_generator_new(0);
    float x[4];
    assert_int_equal(cdf_randn_f32(NULL, x, 4), CDF_ERR_INVALID_ARG);
    assert_non_null(strstr(cdf_last_error(), "generator is NULL"));
    assert_int_equal(cdf_randn_f32(g, x, -1), CDF_ERR_INVALID_ARG);
    assert_non_null(strstr(cdf_last_error(), "negative element count -1"));
    assert_int_equal(cdf_randn_f32(g, NULL, 4), CDF_ERR_INVALID_ARG);
    assert_int_equal(cdf_rand_f32(g, NULL, 4), CDF_ERR_INVALID_ARG);
    assert_int_equal(cdf_rand_f64(NULL, NULL, 4), CDF_ERR_INVALID_ARG);
    assert_int_equal(cdf_randn_bf16(g, NULL, 20), CDF_ERR_INVALID_ARG);
    assert_int_equal(cdf_randn(g, CDF_I32, x, 4), CDF_ERR_DTYPE);
    /* n == 0 draws nothing: the stream is unchanged */
    assert_int_equal(cdf_randn_f32(g, NULL, 0), CDF_OK);
    cdf_generator *fresh = cdf_generator_new(0);
    assert_int_equal(cdf_generator_next_u32(g), cdf_generator_next_u32(fresh));
    cdf_generator_free(fresh);
    cdf_generator_free(g);
    cdf_generator_free(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mt19937_standard_value),
        cmocka_unit_test(test_torch_randn_all),
        cmocka_unit_test(test_torch_rand_all),
        cmocka_unit_test(test_call_sequences),
        cmocka_unit_test(test_randn_tensor),
        cmocka_unit_test(test_state_handling),
        cmocka_unit_test(test_randn_f64),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
