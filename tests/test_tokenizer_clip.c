/* CLIP BPE tokenizer vs the golden ids of transformers' CLIPTokenizerFast (tests/data/tokenizers,
 * copied from the golden text set: clip_l = FLUX/SD3 `tokenizer/`, clip_g = SD3 `tokenizer_2/`
 * whose pad token "!" is a special added token). */
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cdiffusers/tokenizer.h"
#include "testutil.h"

static cdf_tokenizer *g_clip_l, *g_clip_g;
static cJSON *g_tokens;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int setup(void **state) {
    (void)state;
    double t0 = now_ms();
    g_clip_l = cdf_tokenizer_load(tu_data("tokenizers/clip_l"));
    double t1 = now_ms();
    g_clip_g = cdf_tokenizer_load(tu_data("tokenizers/clip_g"));
    if (!g_clip_l || !g_clip_g) {
        fprintf(stderr, "load failed: %s\n", cdf_last_error());
        return -1;
    }
    fprintf(stderr, "CLIP-L tokenizer loaded in %.1f ms\n", t1 - t0);
    char *json = tu_read_file(tu_data("tokenizers/tokens.json"), NULL);
    g_tokens = json ? cJSON_Parse(json) : NULL;
    free(json);
    return g_tokens ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    cdf_tokenizer_free(g_clip_l);
    cdf_tokenizer_free(g_clip_g);
    cJSON_Delete(g_tokens);
    return 0;
}

/* The exact prompt bytes from text_utf8_hex (malloc'd). */
static char *prompt_bytes(const cJSON *p, size_t *len) {
    const char *hex = cJSON_GetObjectItem(p, "text_utf8_hex")->valuestring;
    size_t n = strlen(hex) / 2;
    char *s = malloc(n + 1);
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        sscanf(hex + 2 * i, "%2x", &v);
        s[i] = (char)v;
    }
    s[n] = 0;
    *len = n;
    return s;
}

/* Compare every prompt's ids / mask / untruncated count / piece strings with the golden. */
static void check_golden(cdf_tokenizer *tok, const char *key) {
    const cJSON *prompts = cJSON_GetObjectItem(g_tokens, "prompts"), *p;
    int n_prompts = 0, failures = 0;
    cJSON_ArrayForEach(p, prompts) {
        const char *name = cJSON_GetObjectItem(p, "name")->valuestring;
        const cJSON *gold = cJSON_GetObjectItem(p, key);
        const cJSON *gids = cJSON_GetObjectItem(gold, "input_ids"), *gmask = cJSON_GetObjectItem(gold, "attention_mask");
        const cJSON *gtok = cJSON_GetObjectItem(gold, "tokens_unpadded");
        int gn = cJSON_GetObjectItem(gold, "num_tokens_untruncated")->valueint;
        size_t len;
        char *text = prompt_bytes(p, &len);
        int64_t ids[77], mask[77];
        int n_out = -1, n_untr = -1;
        cdf_status st = cdf_tokenizer_encode(tok, text, len, 77, true, ids, mask, &n_out, &n_untr);
        free(text);
        n_prompts++;
        if (st != CDF_OK || n_out != 77 || cJSON_GetArraySize(gids) != 77) {
            fprintf(stderr, "%s/%s: status %d n_out %d: %s\n", key, name, st, n_out, cdf_last_error());
            failures++;
            continue;
        }
        bool bad = n_untr != gn;
        if (bad) fprintf(stderr, "%s/%s: untruncated %d, golden %d\n", key, name, n_untr, gn);
        for (int i = 0; i < 77; i++) {
            int64_t g = (int64_t)cJSON_GetArrayItem(gids, i)->valuedouble;
            int64_t gm = (int64_t)cJSON_GetArrayItem(gmask, i)->valuedouble;
            if (ids[i] != g || mask[i] != gm) {
                fprintf(stderr, "%s/%s: position %d: id %lld mask %lld, golden id %lld mask %lld\n", key, name, i,
                        (long long)ids[i], (long long)mask[i], (long long)g, (long long)gm);
                bad = true;
                break;
            }
        }
        /* without truncation, the pieces are the golden token strings (byte-level alphabet) */
        text = prompt_bytes(p, &len);
        int64_t full[1024];
        int n_full = -1;
        st = cdf_tokenizer_encode(tok, text, len, 1024, false, full, NULL, &n_full, NULL);
        free(text);
        if (st != CDF_OK || n_full != cJSON_GetArraySize(gtok)) {
            fprintf(stderr, "%s/%s: %d untruncated tokens, golden %d\n", key, name, n_full, cJSON_GetArraySize(gtok));
            bad = true;
        }
        for (int i = 0; i < n_full && !bad; i++) {
            const char *piece = cdf_tokenizer_id_to_piece(tok, full[i]);
            if (!piece || strcmp(piece, cJSON_GetArrayItem(gtok, i)->valuestring) != 0) {
                fprintf(stderr, "%s/%s: token %d piece \"%s\", golden \"%s\"\n", key, name, i, piece ? piece : "(null)",
                        cJSON_GetArrayItem(gtok, i)->valuestring);
                bad = true;
            }
        }
        failures += bad;
    }
    fprintf(stderr, "%s: %d prompts, %d failures\n", key, n_prompts, failures);
    assert_int_equal(n_prompts, 47);
    assert_int_equal(failures, 0);
}

static void test_clip_l_golden(void **state) { (void)state; check_golden(g_clip_l, "clip_l"); }
static void test_clip_g_golden(void **state) { (void)state; check_golden(g_clip_g, "clip_g"); }

static void test_clip_accessors(void **state) {
    (void)state;
    const cJSON *ids = cJSON_GetObjectItem(g_tokens, "clip_l"), *idg = cJSON_GetObjectItem(g_tokens, "clip_g");
    assert_int_equal(cdf_tokenizer_kind(g_clip_l), CDF_TOKENIZER_CLIP);
    assert_int_equal(cdf_tokenizer_bos_id(g_clip_l), cJSON_GetObjectItem(ids, "bos")->valueint);
    assert_int_equal(cdf_tokenizer_eos_id(g_clip_l), cJSON_GetObjectItem(ids, "eos")->valueint);
    assert_int_equal(cdf_tokenizer_pad_id(g_clip_l), cJSON_GetObjectItem(ids, "pad")->valueint);
    assert_int_equal(cdf_tokenizer_pad_id(g_clip_g), cJSON_GetObjectItem(idg, "pad")->valueint);
    assert_string_equal(cdf_tokenizer_id_to_piece(g_clip_g, cdf_tokenizer_pad_id(g_clip_g)),
                        cJSON_GetObjectItem(idg, "pad_token")->valuestring);
    assert_int_equal(cdf_tokenizer_vocab_size(g_clip_l), 49408);
    assert_int_equal(cdf_tokenizer_model_max_length(g_clip_l), cJSON_GetObjectItem(g_tokens, "clip_max_length")->valueint);
    assert_string_equal(cdf_tokenizer_id_to_piece(g_clip_l, 49406), "<|startoftext|>");
    assert_null(cdf_tokenizer_id_to_piece(g_clip_l, 49408));
    assert_null(cdf_tokenizer_id_to_piece(g_clip_l, -1));
}

/* pad_to_max = false writes only the real tokens; max_length <= 0 means model_max_length. */
static void test_clip_unpadded(void **state) {
    (void)state;
    const cJSON *p;
    cJSON_ArrayForEach(p, cJSON_GetObjectItem(g_tokens, "prompts")) {
        const cJSON *gold = cJSON_GetObjectItem(p, "clip_l");
        int gn = cJSON_GetObjectItem(gold, "num_tokens_untruncated")->valueint;
        size_t len;
        char *text = prompt_bytes(p, &len);
        int64_t ids[77];
        int n_out = -1, n_untr = -1;
        assert_int_equal(cdf_tokenizer_encode(g_clip_l, text, len, 0, false, ids, NULL, &n_out, &n_untr), CDF_OK);
        free(text);
        assert_int_equal(n_out, gn < 77 ? gn : 77);
        assert_int_equal(n_untr, gn);
        for (int i = 0; i < n_out; i++)
            assert_int_equal(ids[i], (int64_t)cJSON_GetArrayItem(cJSON_GetObjectItem(gold, "input_ids"), i)->valuedouble);
    }
}

/* Truncation at other lengths keeps bos + content[:L-2] + eos. */
static void test_clip_short_max_length(void **state) {
    (void)state;
    const char *text = "a photo of a cat";
    int64_t full[77], ids[5], mask[5];
    int n_full, n_out, n_untr;
    assert_int_equal(cdf_tokenizer_encode(g_clip_l, text, strlen(text), 77, false, full, NULL, &n_full, NULL), CDF_OK);
    assert_int_equal(n_full, 7);
    assert_int_equal(cdf_tokenizer_encode(g_clip_l, text, strlen(text), 5, true, ids, mask, &n_out, &n_untr), CDF_OK);
    assert_int_equal(n_out, 5);
    assert_int_equal(n_untr, 7);
    int64_t want[5] = {full[0], full[1], full[2], full[3], 49407};
    for (int i = 0; i < 5; i++) {
        assert_int_equal(ids[i], want[i]);
        assert_int_equal(mask[i], 1);
    }
    /* exactly the two special tokens */
    assert_int_equal(cdf_tokenizer_encode(g_clip_l, text, strlen(text), 2, true, ids, mask, &n_out, NULL), CDF_OK);
    assert_int_equal(n_out, 2);
    assert_int_equal(ids[0], 49406);
    assert_int_equal(ids[1], 49407);
}

static void encode_unpadded(cdf_tokenizer *tok, const char *s, size_t n, int64_t *ids, int *n_out) {
    assert_int_equal(cdf_tokenizer_encode(tok, s, n, 77, false, ids, NULL, n_out, NULL), CDF_OK);
}

/* Special tokens in the text are split out first (ids from tokenizer_config.json's
 * added_tokens_decoder): <|endoftext|> (normalized: false) on the raw text, <|startoftext|>
 * (normalized: true) on the normalised, i.e. lower-cased, text. */
static void test_clip_special_tokens_in_text(void **state) {
    (void)state;
    int64_t ids[77], plain[77];
    int n, np;
    encode_unpadded(g_clip_l, "a<|endoftext|>b", 15, ids, &n);
    encode_unpadded(g_clip_l, "a b", 3, plain, &np);
    assert_int_equal(n, 5);
    assert_int_equal(np, 4);
    assert_int_equal(ids[1], plain[1]);
    assert_int_equal(ids[2], 49407);
    assert_int_equal(ids[3], plain[2]);
    encode_unpadded(g_clip_l, "<|STARTOFTEXT|>", 15, ids, &n);
    assert_int_equal(n, 3);
    assert_int_equal(ids[1], 49406);
    encode_unpadded(g_clip_l, "<|ENDOFTEXT|>", 13, ids, &n); /* not normalised: no match, plain BPE */
    assert_true(n > 3);
    for (int i = 1; i < n - 1; i++) assert_true(ids[i] < 49406);
    /* CLIP-G: "!" is its pad token and a special added token: each "!" is id 0 */
    encode_unpadded(g_clip_g, "a!!b", 4, ids, &n);
    assert_int_equal(n, 6);
    assert_int_equal(ids[2], 0);
    assert_int_equal(ids[3], 0);
}

static void assert_same_encoding(cdf_tokenizer *tok, const char *a, size_t an, const char *b, size_t bn) {
    int64_t x[77], y[77];
    int nx, ny;
    encode_unpadded(tok, a, an, x, &nx);
    encode_unpadded(tok, b, bn, y, &ny);
    assert_int_equal(nx, ny);
    assert_memory_equal(x, y, (size_t)nx * sizeof *x);
}

/* Invalid UTF-8: each maximal invalid subsequence reads as one U+FFFD (from_utf8_lossy). */
static void test_clip_invalid_utf8(void **state) {
    (void)state;
    cdf_tokenizer *tok = g_clip_l;
    assert_same_encoding(tok, "a\xff" "b", 3, "a\xEF\xBF\xBD" "b", 5);
    assert_same_encoding(tok, "x\xE2\x82", 3, "x\xEF\xBF\xBD", 4);                        /* truncated 3-byte */
    assert_same_encoding(tok, "\xF0\x9F\x98 cat", 7, "\xEF\xBF\xBD cat", 7);               /* truncated 4-byte */
    assert_same_encoding(tok, "\xC0\xAF", 2, "\xEF\xBF\xBD\xEF\xBF\xBD", 6);               /* overlong: 2 */
    assert_same_encoding(tok, "\xED\xA0\x80", 3, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD", 9); /* surrogate: 3 */
    /* U+FFFD is EF BF BD in the byte-level alphabet: three byte symbols merged by BPE, never unk */
    int64_t ids[77];
    int n;
    encode_unpadded(tok, "\xff", 1, ids, &n);
    assert_true(n >= 3);
    for (int i = 1; i < n - 1; i++) assert_true(ids[i] >= 0 && ids[i] < 49406);
    /* embedded NUL is an ordinary character (the length is explicit) */
    encode_unpadded(tok, "a\0b", 3, ids, &n);
    assert_true(n >= 4);
    int64_t ab[77];
    int nab;
    encode_unpadded(tok, "ab", 2, ab, &nab);
    assert_true(n > nab);
}

/* Random bytes never crash and always give in-range ids (run under ASan in CI). */
static void test_clip_fuzz(void **state) {
    (void)state;
    uint64_t s = 0x9E3779B97F4A7C15ull;
    char buf[300];
    for (int iter = 0; iter < 300; iter++) {
        size_t len = (size_t)(iter % 299) + 1;
        for (size_t i = 0; i < len; i++) {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            buf[i] = (char)(iter % 3 == 0 ? (s & 0x7F) : (s & 0xFF));
        }
        cdf_tokenizer *tok = iter & 1 ? g_clip_g : g_clip_l;
        int64_t ids[77], mask[77];
        int n_out, n_untr;
        assert_int_equal(cdf_tokenizer_encode(tok, buf, len, 77, true, ids, mask, &n_out, &n_untr), CDF_OK);
        assert_int_equal(n_out, 77);
        assert_true(n_untr >= 2);
        for (int i = 0; i < 77; i++) assert_true(ids[i] >= 0 && ids[i] < 49408);
    }
}

static void test_clip_bad_args(void **state) {
    (void)state;
    int64_t ids[77];
    assert_int_equal(cdf_tokenizer_encode(NULL, "a", 1, 77, true, ids, NULL, NULL, NULL), CDF_ERR_INVALID_ARG);
    assert_int_equal(cdf_tokenizer_encode(g_clip_l, "a", 1, 77, true, NULL, NULL, NULL, NULL), CDF_ERR_INVALID_ARG);
    assert_int_equal(cdf_tokenizer_encode(g_clip_l, NULL, 5, 77, true, ids, NULL, NULL, NULL), CDF_ERR_INVALID_ARG);
    assert_int_equal(cdf_tokenizer_encode(g_clip_l, "a", 1, 1, true, ids, NULL, NULL, NULL), CDF_ERR_INVALID_ARG);
    assert_non_null(strstr(cdf_last_error(), "max_length 1"));
    assert_int_equal(cdf_tokenizer_encode(g_clip_l, "a", 1, 1 << 21, true, ids, NULL, NULL, NULL), CDF_ERR_LIMIT);
    size_t big = ((size_t)1 << 20) + 1; /* one byte over the documented 1 MiB limit */
    char *huge = malloc(big);
    assert_non_null(huge);
    memset(huge, 'a', big);
    assert_int_equal(cdf_tokenizer_encode(g_clip_l, huge, big, 77, true, ids, NULL, NULL, NULL), CDF_ERR_LIMIT);
    free(huge);
    int n;
    assert_int_equal(cdf_tokenizer_encode(g_clip_l, NULL, 0, 77, true, ids, NULL, &n, NULL), CDF_OK);
    assert_int_equal(n, 77);
    assert_null(cdf_tokenizer_load(NULL));
    assert_int_equal(cdf_last_status(), CDF_ERR_INVALID_ARG);
    cdf_tokenizer_free(NULL);
}

/* ------------------------------------------------------------------ hand-made tokenizers */

static void write_text(const char *dir, const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    assert_int_equal(tu_write_file(path, text, strlen(text)), 0);
}

static const char *make_dir(const char *name) {
    static char path[8][512];
    static int slot;
    char *p = path[slot++ & 7];
    snprintf(p, 512, "%s/%s", tu_tmpdir(), name);
    mkdir(p, 0755);
    return p;
}

/* A tiny vocabulary (no byte symbols except a, b, c: the rest map to unk) checks the merge order
 * independently of the golden set: "abc" with merges [b c</w>] (rank 0) then [a b] (rank 1)
 * must give a + bc</w> (lowest rank first), not ab + c</w> (leftmost first). */
static void test_clip_merge_order(void **state) {
    (void)state;
    const char *dir = make_dir("tiny_clip");
    write_text(dir, "vocab.json",
               "{\"a\": 0, \"b\": 1, \"c\": 2, \"a</w>\": 3, \"b</w>\": 4, \"c</w>\": 5, \"bc</w>\": 6, \"ab\": 7,"
               " \"abc</w>\": 8, \"<|startoftext|>\": 9, \"<|endoftext|>\": 10}");
    write_text(dir, "merges.txt", "#version: 0.2\nb c</w>\na b\n");
    cdf_tokenizer *tok = cdf_tokenizer_load(dir);
    assert_non_null(tok);
    int64_t ids[16];
    int n;
    assert_int_equal(cdf_tokenizer_encode(tok, "ABC", 3, 16, false, ids, NULL, &n, NULL), CDF_OK);
    assert_int_equal(n, 4);
    assert_int_equal(ids[0], 9);
    assert_int_equal(ids[1], 0); /* a */
    assert_int_equal(ids[2], 6); /* bc</w> */
    assert_int_equal(ids[3], 10);
    /* a byte without a symbol becomes unk (<|endoftext|> = 10), like the BPE model's unk */
    assert_int_equal(cdf_tokenizer_encode(tok, "a z", 3, 16, false, ids, NULL, &n, NULL), CDF_OK);
    assert_int_equal(n, 4);
    assert_int_equal(ids[1], 3);
    assert_int_equal(ids[2], 10);
    /* without tokenizer_config.json the CLIPTokenizer specials are added tokens */
    assert_int_equal(cdf_tokenizer_encode(tok, "a<|endoftext|>b", 15, 16, false, ids, NULL, &n, NULL), CDF_OK);
    assert_int_equal(n, 5);
    assert_int_equal(ids[1], 3);
    assert_int_equal(ids[2], 10);
    assert_int_equal(ids[3], 4);
    cdf_tokenizer_free(tok);
}

static void expect_load_error(const char *dir, cdf_status want, const char *needle1, const char *needle2) {
    cdf_tokenizer *tok = cdf_tokenizer_load(dir);
    if (tok) cdf_tokenizer_free(tok);
    assert_null(tok);
    if (cdf_last_status() != want || (needle1 && !strstr(cdf_last_error(), needle1)) ||
        (needle2 && !strstr(cdf_last_error(), needle2)))
        fprintf(stderr, "unexpected: status %d message \"%s\"\n", cdf_last_status(), cdf_last_error());
    assert_int_equal(cdf_last_status(), want);
    if (needle1) assert_non_null(strstr(cdf_last_error(), needle1));
    if (needle2) assert_non_null(strstr(cdf_last_error(), needle2));
}

static void test_clip_bad_files(void **state) {
    (void)state;
    size_t vn, mn;
    char *vocab = tu_read_file(tu_data("tokenizers/clip_l/vocab.json"), &vn);
    char *merges = tu_read_file(tu_data("tokenizers/clip_l/merges.txt"), &mn);
    assert_non_null(vocab);
    assert_non_null(merges);
    char path[512];

    const char *d = make_dir("empty");
    expect_load_error(d, CDF_ERR_NOT_FOUND, "no tokenizer files", NULL);

    d = make_dir("trunc_vocab"); /* vocab.json cut in the middle */
    snprintf(path, sizeof path, "%s/vocab.json", d);
    assert_int_equal(tu_write_file(path, vocab, vn / 2), 0);
    snprintf(path, sizeof path, "%s/merges.txt", d);
    assert_int_equal(tu_write_file(path, merges, mn), 0);
    expect_load_error(d, CDF_ERR_FORMAT, "vocab.json", "invalid JSON");

    d = make_dir("trunc_merges"); /* merges.txt cut two bytes into a line: a line with one token */
    snprintf(path, sizeof path, "%s/vocab.json", d);
    assert_int_equal(tu_write_file(path, vocab, vn), 0);
    snprintf(path, sizeof path, "%s/merges.txt", d);
    const char *cut = memchr(merges + 200000, '\n', mn - 200000);
    assert_non_null(cut);
    assert_int_equal(tu_write_file(path, merges, (size_t)(cut - merges) + 2), 0);
    expect_load_error(d, CDF_ERR_FORMAT, "merges.txt line", "two tokens");

    d = make_dir("bad_merge_line");
    write_text(d, "vocab.json", "{\"a\": 0, \"b\": 1, \"<|startoftext|>\": 2, \"<|endoftext|>\": 3}");
    write_text(d, "merges.txt", "#version: 0.2\na b c\n");
    expect_load_error(d, CDF_ERR_FORMAT, "merges.txt line 2", "two tokens");

    d = make_dir("unknown_merge");
    write_text(d, "vocab.json", "{\"a\": 0, \"b\": 1, \"<|startoftext|>\": 2, \"<|endoftext|>\": 3}");
    write_text(d, "merges.txt", "#version: 0.2\na b\n");
    expect_load_error(d, CDF_ERR_FORMAT, "\"ab\" is not in vocab.json", NULL);

    d = make_dir("vocab_not_object");
    write_text(d, "vocab.json", "[1, 2, 3]");
    write_text(d, "merges.txt", "");
    expect_load_error(d, CDF_ERR_FORMAT, "vocab.json", "object");

    d = make_dir("vocab_bad_id");
    write_text(d, "vocab.json", "{\"a\": 1e12}");
    write_text(d, "merges.txt", "");
    expect_load_error(d, CDF_ERR_FORMAT, "vocab.json", "\"a\"");

    d = make_dir("vocab_sparse"); /* a few bytes must not allocate 2^24 slots */
    write_text(d, "vocab.json", "{\"a\": 16000000}");
    write_text(d, "merges.txt", "");
    expect_load_error(d, CDF_ERR_FORMAT, "vocab.json", "dense");

    d = make_dir("vocab_dup_id");
    write_text(d, "vocab.json", "{\"a\": 0, \"b\": 0}");
    write_text(d, "merges.txt", "");
    expect_load_error(d, CDF_ERR_FORMAT, "id 0", NULL);

    d = make_dir("no_specials"); /* a CLIP tokenizer needs bos and eos */
    write_text(d, "vocab.json", "{\"a\": 0}");
    write_text(d, "merges.txt", "");
    write_text(d, "tokenizer_config.json", "{\"tokenizer_class\": \"CLIPTokenizer\", \"unk_token\": \"a\"}");
    expect_load_error(d, CDF_ERR_FORMAT, "bos", NULL);

    d = make_dir("bad_config");
    write_text(d, "vocab.json", "{\"a\": 0}");
    write_text(d, "merges.txt", "");
    write_text(d, "tokenizer_config.json", "{\"tokenizer_class\": ");
    expect_load_error(d, CDF_ERR_FORMAT, "tokenizer_config.json", "invalid JSON");

    d = make_dir("other_class");
    write_text(d, "tokenizer_config.json", "{\"tokenizer_class\": \"BertTokenizer\"}");
    expect_load_error(d, CDF_ERR_UNSUPPORTED, "BertTokenizer", NULL);

    d = make_dir("single_word");
    write_text(d, "vocab.json", "{\"a\": 0, \"<|startoftext|>\": 1, \"<|endoftext|>\": 2}");
    write_text(d, "merges.txt", "");
    write_text(d, "tokenizer_config.json",
               "{\"tokenizer_class\": \"CLIPTokenizer\", \"added_tokens_decoder\": {\"1\": {\"content\": \"<|startoftext|>\","
               " \"single_word\": true, \"special\": true}}}");
    expect_load_error(d, CDF_ERR_UNSUPPORTED, "single_word", NULL);

    d = make_dir("bad_special_map");
    write_text(d, "vocab.json", "{\"a\": 0}");
    write_text(d, "merges.txt", "");
    write_text(d, "special_tokens_map.json", "{\"bos_token\": 5}");
    expect_load_error(d, CDF_ERR_FORMAT, "special_tokens_map.json", "bos_token");

    free(vocab);
    free(merges);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_clip_l_golden),     cmocka_unit_test(test_clip_g_golden),
        cmocka_unit_test(test_clip_accessors),    cmocka_unit_test(test_clip_unpadded),
        cmocka_unit_test(test_clip_short_max_length), cmocka_unit_test(test_clip_invalid_utf8),
        cmocka_unit_test(test_clip_fuzz),         cmocka_unit_test(test_clip_bad_args),
        cmocka_unit_test(test_clip_special_tokens_in_text),
        cmocka_unit_test(test_clip_merge_order),  cmocka_unit_test(test_clip_bad_files),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
