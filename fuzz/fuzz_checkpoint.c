/* Fuzz target: a sharded checkpoint folder whose model.safetensors.index.json is the input.
 * The folder holds two valid shards (written once at start-up) and the fuzzed index, so the
 * index parser, the shard-name checks and the tensor -> shard mapping are exercised together.
 *
 * Invariants after a successful open: names are sorted and unique, each one is found by
 * cdf_checkpoint_find / _has and belongs to one of the opened files, and its bytes can be read. */
#include "fuzz_common.h"

#define SHARD1 "model-00001-of-00002.safetensors"
#define SHARD2 "model-00002-of-00002.safetensors"

static const char *g_dir;

static void write_shards(const char *dir) {
    float a[6] = {1, 2, 3, 4, 5, 6};
    uint16_t b[4] = {0x3f80, 0x4000, 0x4040, 0x4080};
    int64_t c = 42;
    cdf_st_writer *w = cdf_st_writer_new();
    cdf_st_writer_add(w, "a.weight", CDF_F32, 2, (const int64_t[]){2, 3}, a);
    cdf_st_writer_add(w, "a.bias", CDF_F32, 1, (const int64_t[]){3}, a);
    if (FZ_TRY(cdf_st_writer_save(w, fz_join(dir, SHARD1))) != CDF_OK) abort();
    cdf_st_writer_free(w);
    w = cdf_st_writer_new();
    cdf_st_writer_add(w, "b.weight", CDF_BF16, 1, (const int64_t[]){4}, b);
    cdf_st_writer_add(w, "c", CDF_I64, 0, NULL, &c);
    cdf_st_writer_add(w, "empty", CDF_F32, 2, (const int64_t[]){0, 5}, NULL);
    if (FZ_TRY(cdf_st_writer_save(w, fz_join(dir, SHARD2))) != CDF_OK) abort();
    cdf_st_writer_free(w);
}

static void write_seeds(const char *dir) {
    static const char *seeds[] = {
        "{\"metadata\": {\"total_size\": 44}, \"weight_map\": {\"a.weight\": \"" SHARD1 "\", \"a.bias\": \"" SHARD1
        "\", \"b.weight\": \"" SHARD2 "\", \"c\": \"" SHARD2 "\", \"empty\": \"" SHARD2 "\"}}",
        "{\"weight_map\": {\"a.weight\": \"" SHARD1 "\"}}",
        "{\"weight_map\": {\"c\": \"" SHARD2 "\", \"a.bias\": \"" SHARD1 "\"}}",
        "{\"weight_map\": {}}",
        "{\"weight_map\": {\"a.weight\": \"../" SHARD1 "\"}}",
        "{\"weight_map\": {\"a.weight\": \"" SHARD2 "\"}}",
        "{\"weight_map\": {\"a.weight\": \"" SHARD1 "\", \"a.weight\": \"" SHARD1 "\"}}",
    };
    for (size_t i = 0; i < sizeof seeds / sizeof *seeds; i++) fz_seed(dir, -1, seeds[i], strlen(seeds[i]));
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fz_maybe_write_seeds(write_seeds);
    static char dir[512];
    snprintf(dir, sizeof dir, "%s", fz_join(fz_tmp(), "ck"));
    fz_mkdir(dir);
    write_shards(dir);
    g_dir = dir;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_write(fz_join(g_dir, "model.safetensors.index.json"), data, size);
    cdf_checkpoint *ck = (cdf_checkpoint *)1;
    if (FZ_TRY(cdf_checkpoint_open(g_dir, &ck)) != CDF_OK) {
        FZ_CHECK(ck == NULL);
        FZ_CHECK_MESSAGE();
        return 0;
    }
    int n = cdf_checkpoint_count(ck), nf = cdf_checkpoint_file_count(ck);
    FZ_CHECK(n >= 0 && nf >= 0 && nf <= 2);
    for (int i = 0; i < n; i++) {
        const char *name = cdf_checkpoint_name_at(ck, i);
        FZ_CHECK(name);
        if (i > 0) FZ_CHECK(strcmp(cdf_checkpoint_name_at(ck, i - 1), name) < 0);
        const cdf_st_file *f = NULL, *f2 = NULL;
        const cdf_st_tensor *t = NULL, *t2 = NULL;
        FZ_CHECK(cdf_checkpoint_tensor_at(ck, i, &f, &t) == CDF_OK);
        FZ_CHECK(f && t && strcmp(t->name, name) == 0);
        FZ_CHECK(cdf_checkpoint_find(ck, name, &f2, &t2) == CDF_OK && f2 == f && t2 == t);
        FZ_CHECK(cdf_checkpoint_has(ck, name));
        bool mine = false;
        for (int k = 0; k < nf; k++) mine |= cdf_checkpoint_file_at(ck, k) == f;
        FZ_CHECK(mine);
        uint8_t buf[64];
        FZ_CHECK(t->nbytes <= sizeof buf);
        FZ_CHECK(cdf_st_read_all(f, t, buf) == CDF_OK);
    }
    const cdf_st_file *f;
    const cdf_st_tensor *t;
    FZ_CHECK(cdf_checkpoint_tensor_at(ck, n, &f, &t) != CDF_OK);
    FZ_CHECK(cdf_checkpoint_find(ck, "no such tensor", NULL, NULL) == CDF_ERR_NOT_FOUND);
    cdf_checkpoint_close(ck);
    return 0;
}
