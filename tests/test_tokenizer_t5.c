/* T5 SentencePiece unigram tokenizer vs the golden ids of transformers' T5TokenizerFast, loaded
 * both from tokenizer.json (FLUX.1 `tokenizer_2/`) and from spiece.model (SD3 `tokenizer_3/`);
 * data in tests/data/tokenizers (copied from the golden text set). */
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cdiffusers/tokenizer.h"
#include "testutil.h"

static cdf_tokenizer *g_json, *g_spm;
static cJSON *g_tokens;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int setup(void **state) {
    (void)state;
    double t0 = now_ms();
    g_json = cdf_tokenizer_load(tu_data("tokenizers/t5"));
    double t1 = now_ms();
    g_spm = cdf_tokenizer_load_from(tu_data("tokenizers/t5"), CDF_TOKENIZER_SOURCE_SPIECE_MODEL);
    double t2 = now_ms();
    if (!g_json || !g_spm) {
        fprintf(stderr, "load failed: %s\n", cdf_last_error());
        return -1;
    }
    fprintf(stderr, "T5 tokenizer loaded in %.1f ms from tokenizer.json, %.1f ms from spiece.model\n", t1 - t0, t2 - t1);
    char *json = tu_read_file(tu_data("tokenizers/tokens.json"), NULL);
    g_tokens = json ? cJSON_Parse(json) : NULL;
    free(json);
    return g_tokens ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    cdf_tokenizer_free(g_json);
    cdf_tokenizer_free(g_spm);
    cJSON_Delete(g_tokens);
    return 0;
}

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

/* ids, mask and untruncated count at max_length 256 and 512, and the untruncated pieces. */
static void check_golden(cdf_tokenizer *tok, const char *label) {
    static int64_t ids[512], mask[512], full[1024];
    const cJSON *prompts = cJSON_GetObjectItem(g_tokens, "prompts"), *p;
    int n_prompts = 0, failures = 0;
    cJSON_ArrayForEach(p, prompts) {
        const char *name = cJSON_GetObjectItem(p, "name")->valuestring;
        int gn = cJSON_GetObjectItem(p, "t5_num_tokens_untruncated")->valueint;
        const cJSON *gtok = cJSON_GetObjectItem(p, "t5_tokens_unpadded");
        size_t len;
        char *text = prompt_bytes(p, &len);
        bool bad = false;
        n_prompts++;
        for (int which = 0; which < 2 && !bad; which++) {
            int max_length = which ? 512 : 256;
            const cJSON *gold = cJSON_GetObjectItem(p, which ? "t5_512" : "t5_256");
            const cJSON *gids = cJSON_GetObjectItem(gold, "input_ids"), *gmask = cJSON_GetObjectItem(gold, "attention_mask");
            int n_out = -1, n_untr = -1;
            cdf_status st = cdf_tokenizer_encode(tok, text, len, max_length, true, ids, mask, &n_out, &n_untr);
            if (st != CDF_OK || n_out != max_length || cJSON_GetArraySize(gids) != max_length) {
                fprintf(stderr, "%s/%s@%d: status %d n_out %d: %s\n", label, name, max_length, st, n_out, cdf_last_error());
                bad = true;
                break;
            }
            if (n_untr != gn) {
                fprintf(stderr, "%s/%s@%d: untruncated %d, golden %d\n", label, name, max_length, n_untr, gn);
                bad = true;
            }
            for (int i = 0; i < max_length && !bad; i++) {
                int64_t g = (int64_t)cJSON_GetArrayItem(gids, i)->valuedouble;
                int64_t gm = (int64_t)cJSON_GetArrayItem(gmask, i)->valuedouble;
                if (ids[i] != g || mask[i] != gm) {
                    fprintf(stderr, "%s/%s@%d: position %d: id %lld mask %lld, golden id %lld mask %lld\n", label, name,
                            max_length, i, (long long)ids[i], (long long)mask[i], (long long)g, (long long)gm);
                    bad = true;
                }
            }
        }
        int n_full = -1;
        if (!bad && (cdf_tokenizer_encode(tok, text, len, 1024, false, full, NULL, &n_full, NULL) != CDF_OK ||
                     n_full != cJSON_GetArraySize(gtok))) {
            fprintf(stderr, "%s/%s: %d untruncated tokens, golden %d\n", label, name, n_full, cJSON_GetArraySize(gtok));
            bad = true;
        }
        for (int i = 0; i < n_full && !bad; i++) {
            if (full[i] == cdf_tokenizer_unk_id(tok)) continue; /* golden shows the unknown text itself */
            const char *piece = cdf_tokenizer_id_to_piece(tok, full[i]);
            if (!piece || strcmp(piece, cJSON_GetArrayItem(gtok, i)->valuestring) != 0) {
                fprintf(stderr, "%s/%s: token %d piece \"%s\", golden \"%s\"\n", label, name, i, piece ? piece : "(null)",
                        cJSON_GetArrayItem(gtok, i)->valuestring);
                bad = true;
            }
        }
        free(text);
        failures += bad;
    }
    fprintf(stderr, "%s: %d prompts, %d failures\n", label, n_prompts, failures);
    assert_int_equal(n_prompts, 47);
    assert_int_equal(failures, 0);
}

static void test_t5_json_golden(void **state) { (void)state; check_golden(g_json, "tokenizer.json"); }
static void test_t5_spiece_golden(void **state) { (void)state; check_golden(g_spm, "spiece.model"); }

static void test_t5_accessors(void **state) {
    (void)state;
    const cJSON *t5 = cJSON_GetObjectItem(g_tokens, "t5");
    cdf_tokenizer *toks[2] = {g_json, g_spm};
    for (int k = 0; k < 2; k++) {
        cdf_tokenizer *tok = toks[k];
        assert_int_equal(cdf_tokenizer_kind(tok), CDF_TOKENIZER_T5);
        assert_int_equal(cdf_tokenizer_eos_id(tok), cJSON_GetObjectItem(t5, "eos")->valueint);
        assert_int_equal(cdf_tokenizer_pad_id(tok), cJSON_GetObjectItem(t5, "pad")->valueint);
        assert_int_equal(cdf_tokenizer_unk_id(tok), cJSON_GetObjectItem(t5, "unk")->valueint);
        assert_int_equal(cdf_tokenizer_bos_id(tok), -1);
        assert_int_equal(cdf_tokenizer_vocab_size(tok), 32100); /* README: 32000 pieces + 100 extra ids */
        assert_int_equal(cdf_tokenizer_model_max_length(tok), 512);
        assert_string_equal(cdf_tokenizer_id_to_piece(tok, 32099), "<extra_id_0>");
        assert_string_equal(cdf_tokenizer_id_to_piece(tok, 32000), "<extra_id_99>");
        assert_string_equal(cdf_tokenizer_id_to_piece(tok, 1), "</s>");
        assert_null(cdf_tokenizer_id_to_piece(tok, 32100));
    }
}

static int encode(cdf_tokenizer *tok, const char *s, size_t n, int64_t *ids) {
    int n_out = -1;
    assert_int_equal(cdf_tokenizer_encode(tok, s, n, 256, false, ids, NULL, &n_out, NULL), CDF_OK);
    return n_out;
}

static void assert_same_encoding(cdf_tokenizer *tok, const char *a, size_t an, const char *b, size_t bn) {
    int64_t x[256], y[256];
    int nx = encode(tok, a, an, x), ny = encode(tok, b, bn, y);
    assert_int_equal(nx, ny);
    assert_memory_equal(x, y, (size_t)nx * sizeof *x);
}

/* Added (special) tokens are split out of the raw text before normalisation. Under prepend
 * scheme "first" (FLUX tokenizer.json; spiece.model with legacy=false) the text after a leading
 * special token gets no "▁"; ids come from the files: <extra_id_0> = 32099 (added_tokens),
 * "▁hello" = 21820. */
static void test_t5_added_tokens(void **state) {
    (void)state;
    cdf_tokenizer *toks[2] = {g_json, g_spm};
    for (int k = 0; k < 2; k++) {
        int64_t ids[256];
        int n = encode(toks[k], "hello</s>", 9, ids);
        assert_int_equal(n, 3);
        assert_int_equal(ids[0], 21820);
        assert_int_equal(ids[1], 1);
        assert_int_equal(ids[2], 1);
        n = encode(toks[k], "<extra_id_0>hello", 17, ids);
        assert_true(n >= 3);
        assert_int_equal(ids[0], 32099);
        const char *piece = cdf_tokenizer_id_to_piece(toks[k], ids[1]);
        assert_non_null(piece);
        assert_true(strncmp(piece, "\xE2\x96\x81", 3) != 0); /* "first": no ▁ before "hello" */
        assert_int_equal(ids[n - 1], 1);
    }
    /* "a <pad> b<unk>" = encode("a") + <pad> + encode(" b") + <unk> + </s>: the specials split the
     * text into segments that are normalised and tokenized on their own */
    for (int k = 0; k < 2; k++) {
        int64_t ids[256], a[256], b[256];
        int n = encode(toks[k], "a <pad> b<unk>", 14, ids);
        int na = encode(toks[k], "a", 1, a) - 1, nb = encode(toks[k], " b", 2, b) - 1;
        assert_int_equal(n, na + 1 + nb + 2);
        assert_memory_equal(ids, a, (size_t)na * sizeof *ids);
        assert_int_equal(ids[na], 0);
        assert_memory_equal(ids + na + 1, b, (size_t)nb * sizeof *ids);
        assert_int_equal(ids[n - 2], 2);
        assert_int_equal(ids[n - 1], 1);
    }
}

/* spiece.model without added_tokens_decoder and with legacy=true: the specials come from the
 * control/unknown pieces + extra ids, and the prepend scheme is "always". */
static void test_t5_spiece_legacy(void **state) {
    (void)state;
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/t5_legacy", tu_tmpdir());
    mkdir(dir, 0755);
    size_t n;
    char *spm = tu_read_file(tu_data("tokenizers/t5/spiece.model"), &n);
    assert_non_null(spm);
    snprintf(path, sizeof path, "%s/spiece.model", dir);
    assert_int_equal(tu_write_file(path, spm, n), 0);
    free(spm);
    const char *cfg = "{\"tokenizer_class\": \"T5Tokenizer\", \"legacy\": true, \"extra_ids\": 100}";
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    assert_int_equal(tu_write_file(path, cfg, strlen(cfg)), 0);
    cdf_tokenizer *tok = cdf_tokenizer_load(dir);
    assert_non_null(tok);
    int64_t ids[256];
    int k = encode(tok, "<extra_id_0>hello", 17, ids);
    assert_int_equal(k, 3);
    assert_int_equal(ids[0], 32099);
    assert_int_equal(ids[1], 21820); /* "always": ▁hello */
    assert_int_equal(ids[2], 1);
    assert_int_equal(cdf_tokenizer_pad_id(tok), 0);
    assert_int_equal(cdf_tokenizer_model_max_length(tok), 0);
    /* same ids as the golden tokenizer on ordinary text */
    int64_t ref[256];
    const char *text = "A cat holding a sign that says hello world";
    int kr = encode(g_json, text, strlen(text), ref);
    k = encode(tok, text, strlen(text), ids);
    assert_int_equal(k, kr);
    assert_memory_equal(ids, ref, (size_t)k * sizeof *ids);
    cdf_tokenizer_free(tok);
}

static void test_t5_invalid_utf8(void **state) {
    (void)state;
    cdf_tokenizer *toks[2] = {g_json, g_spm};
    for (int k = 0; k < 2; k++) {
        cdf_tokenizer *tok = toks[k];
        assert_same_encoding(tok, "a\xff" "b", 3, "a\xEF\xBF\xBD" "b", 5);
        assert_same_encoding(tok, "x\xE2\x82", 3, "x\xEF\xBF\xBD", 4);
        assert_same_encoding(tok, "\xF0\x9F\x98 cat", 7, "\xEF\xBF\xBD cat", 7);
        assert_same_encoding(tok, "\xC0\xAF", 2, "\xEF\xBF\xBD\xEF\xBF\xBD", 6);
        int64_t ids[256];
        int n = encode(tok, "a\0b", 3, ids); /* NUL: an ordinary (unknown) character */
        assert_true(n >= 2);
    }
}

static void test_t5_fuzz(void **state) {
    (void)state;
    uint64_t s = 0xD1B54A32D192ED03ull;
    char buf[400];
    static int64_t ids[512], mask[512];
    for (int iter = 0; iter < 300; iter++) {
        size_t len = (size_t)(iter * 7 % 399) + 1;
        for (size_t i = 0; i < len; i++) {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            buf[i] = (char)(iter % 3 == 0 ? (s & 0x7F) : (s & 0xFF));
        }
        int n_out, n_untr;
        cdf_tokenizer *tok = iter & 1 ? g_spm : g_json;
        assert_int_equal(cdf_tokenizer_encode(tok, buf, len, 512, true, ids, mask, &n_out, &n_untr), CDF_OK);
        assert_int_equal(n_out, 512);
        assert_true(n_untr >= 1);
        for (int i = 0; i < 512; i++) assert_true(ids[i] >= 0 && ids[i] < 32100);
        /* the two loaders agree on arbitrary input too */
        static int64_t other[512];
        assert_int_equal(cdf_tokenizer_encode(iter & 1 ? g_json : g_spm, buf, len, 512, true, other, NULL, NULL, NULL), CDF_OK);
        assert_memory_equal(ids, other, sizeof other);
    }
}

/* ------------------------------------------------------------------ malformed files */

static const char *make_dir(const char *name) {
    static char path[8][512];
    static int slot;
    char *p = path[slot++ & 7];
    snprintf(p, 512, "%s/%s", tu_tmpdir(), name);
    mkdir(p, 0755);
    return p;
}

static void write_file(const char *dir, const char *name, const void *data, size_t n) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    assert_int_equal(tu_write_file(path, data, n), 0);
}

static void expect_error(cdf_tokenizer *tok, cdf_status want, const char *needle1, const char *needle2) {
    if (tok) fprintf(stderr, "loaded although an error (%s) was expected\n", needle1 ? needle1 : "");
    if (tok) cdf_tokenizer_free(tok);
    assert_null(tok);
    if (cdf_last_status() != want || (needle1 && !strstr(cdf_last_error(), needle1)) ||
        (needle2 && !strstr(cdf_last_error(), needle2)))
        fprintf(stderr, "unexpected: status %d message \"%s\"\n", cdf_last_status(), cdf_last_error());
    assert_int_equal(cdf_last_status(), want);
    if (needle1) assert_non_null(strstr(cdf_last_error(), needle1));
    if (needle2) assert_non_null(strstr(cdf_last_error(), needle2));
}

/* Replace the first occurrence of `from` by `to` (same or different length). */
static char *replace_once(const char *s, size_t n, const char *from, const char *to, size_t *out_n) {
    const char *at = strstr(s, from);
    assert_non_null(at);
    size_t fl = strlen(from), tl = strlen(to), pre = (size_t)(at - s);
    char *r = malloc(n - fl + tl + 1);
    memcpy(r, s, pre);
    memcpy(r + pre, to, tl);
    memcpy(r + pre + tl, at + fl, n - pre - fl);
    *out_n = n - fl + tl;
    r[*out_n] = 0;
    return r;
}

static void test_t5_bad_spiece(void **state) {
    (void)state;
    size_t n;
    char *spm = tu_read_file(tu_data("tokenizers/t5/spiece.model"), &n);
    assert_non_null(spm);
    const char *d = make_dir("spm_trunc");
    write_file(d, "spiece.model", spm, 1000); /* cut inside the piece list */
    expect_error(cdf_tokenizer_load(d), CDF_ERR_FORMAT, "spiece.model", NULL);

    d = make_dir("spm_trunc_end"); /* cut inside the normalizer spec (after all pieces) */
    write_file(d, "spiece.model", spm, n - 100);
    expect_error(cdf_tokenizer_load(d), CDF_ERR_FORMAT, "spiece.model", NULL);

    d = make_dir("spm_garbage");
    char garbage[4096];
    uint64_t s = 12345;
    for (size_t i = 0; i < sizeof garbage; i++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        garbage[i] = (char)s;
    }
    write_file(d, "spiece.model", garbage, sizeof garbage);
    expect_error(cdf_tokenizer_load(d), CDF_ERR_FORMAT, "spiece.model", NULL);

    d = make_dir("spm_no_specs"); /* cut exactly after the 32000 pieces: a valid but truncated protobuf */
    write_file(d, "spiece.model", spm, 553301);
    expect_error(cdf_tokenizer_load(d), CDF_ERR_FORMAT, "spiece.model", "no trainer_spec");

    d = make_dir("spm_empty");
    write_file(d, "spiece.model", "", 0);
    expect_error(cdf_tokenizer_load(d), CDF_ERR_FORMAT, "no pieces", NULL);

    /* a hand-made model: pieces "<unk>", "</s>", "▁a" and a charsmap whose trie is larger than
     * the blob -> the charsmap is rejected */
    static const unsigned char bad_cmap[] = {
        0x0a, 0x09, 0x0a, 0x05, '<', 'u', 'n', 'k', '>', 0x18, 0x02,       /* piece <unk>, UNKNOWN */
        0x0a, 0x08, 0x0a, 0x04, '<', '/', 's', '>', 0x18, 0x03,            /* piece </s>, CONTROL */
        0x0a, 0x0b, 0x0a, 0x04, 0xE2, 0x96, 0x81, 'a', 0x15, 0, 0, 0x80, 0xBF, /* piece ▁a, score -1 */
        0x12, 0x03, 0xC0, 0x02, 0x00,                                      /* trainer_spec unk_id 0 */
        0x1a, 0x08, 0x12, 0x06, 0xff, 0x00, 0x00, 0x00, 0x01, 0x02,        /* charsmap: trie 255 bytes */
    };
    d = make_dir("spm_bad_cmap");
    write_file(d, "spiece.model", bad_cmap, sizeof bad_cmap);
    expect_error(cdf_tokenizer_load(d), CDF_ERR_FORMAT, "spiece.model", "charsmap");
    /* the same model with an empty normalizer spec loads and tokenizes by the rules above */
    unsigned char tiny[sizeof bad_cmap];
    memcpy(tiny, bad_cmap, sizeof bad_cmap - 10);
    memcpy(tiny + sizeof bad_cmap - 10, "\x1a\x02\x18\x01", 4); /* add_dummy_prefix: true */
    d = make_dir("spm_tiny");
    write_file(d, "spiece.model", tiny, sizeof bad_cmap - 6);
    cdf_tokenizer *tok = cdf_tokenizer_load(d);
    if (!tok) fprintf(stderr, "%s\n", cdf_last_error());
    assert_non_null(tok);
    int64_t ids[16];
    int k;
    assert_int_equal(cdf_tokenizer_encode(tok, "a a xy", 6, 16, false, ids, NULL, &k, NULL), CDF_OK);
    /* "▁a", "▁a", then "▁xy": no piece covers ▁, x, y -> one fused <unk>; then </s>
     * (ids: <unk> 0, </s> 1, ▁a 2, then the 100 extra ids) */
    assert_int_equal(k, 4);
    assert_int_equal(ids[0], 2);
    assert_int_equal(ids[1], 2);
    assert_int_equal(ids[2], 0);
    assert_int_equal(ids[3], 1);
    assert_int_equal(cdf_tokenizer_vocab_size(tok), 103);
    free(spm);
    cdf_tokenizer_free(tok);
}

/* Hostile charsmap trie contents: loads (the layout is plausible) and never reads out of bounds. */
static void test_t5_hostile_charsmap(void **state) {
    (void)state;
    unsigned char m[200];
    size_t k = 0;
    m[k++] = 0x0a; m[k++] = 0x09; m[k++] = 0x0a; m[k++] = 0x05; memcpy(m + k, "<unk>", 5); k += 5; m[k++] = 0x18; m[k++] = 0x02;
    m[k++] = 0x0a; m[k++] = 0x08; m[k++] = 0x0a; m[k++] = 0x04; memcpy(m + k, "</s>", 4); k += 4; m[k++] = 0x18; m[k++] = 0x03;
    m[k++] = 0x12; m[k++] = 0x03; m[k++] = 0xC0; m[k++] = 0x02; m[k++] = 0x00; /* trainer_spec: unk_id 0 */
    m[k++] = 0x1a; m[k++] = 1 + 1 + 4 + 64 + 8; /* normalizer_spec */
    m[k++] = 0x12; m[k++] = 4 + 64 + 8;         /* precompiled_charsmap */
    m[k++] = 64; m[k++] = 0; m[k++] = 0; m[k++] = 0; /* 16 units */
    uint64_t s = 777;
    for (int i = 0; i < 64; i++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        m[k++] = (unsigned char)s;
    }
    memcpy(m + k, "xy\0zzzz\0", 8);
    k += 8;
    const char *d = make_dir("spm_hostile");
    write_file(d, "spiece.model", m, k);
    cdf_tokenizer *tok = cdf_tokenizer_load(d);
    assert_non_null(tok);
    for (int iter = 0; iter < 200; iter++) {
        char text[32];
        for (int i = 0; i < 32; i++) {
            s ^= s << 13; s ^= s >> 7; s ^= s << 17;
            text[i] = (char)s;
        }
        int64_t ids[64];
        cdf_status st = cdf_tokenizer_encode(tok, text, 32, 64, false, ids, NULL, NULL, NULL);
        if (st) fprintf(stderr, "%s\n", cdf_last_error());
        assert_int_equal(st, CDF_OK);
    }
    cdf_tokenizer_free(tok);
}

static void test_t5_bad_json(void **state) {
    (void)state;
    size_t n;
    char *json = tu_read_file(tu_data("tokenizers/t5/tokenizer.json"), &n);
    assert_non_null(json);
    const char *d = make_dir("json_trunc");
    write_file(d, "tokenizer.json", json, n / 3);
    expect_error(cdf_tokenizer_load(d), CDF_ERR_FORMAT, "tokenizer.json", "invalid JSON");

    size_t m;
    char *bpe = replace_once(json, n, "\"type\": \"Unigram\"", "\"type\": \"BPE\"", &m);
    d = make_dir("json_bpe");
    write_file(d, "tokenizer.json", bpe, m);
    expect_error(cdf_tokenizer_load(d), CDF_ERR_UNSUPPORTED, "tokenizer.json", "BPE");
    free(bpe);

    char *b64 = replace_once(json, n, "\"precompiled_charsmap\": \"", "\"precompiled_charsmap\": \"*", &m);
    d = make_dir("json_b64");
    write_file(d, "tokenizer.json", b64, m);
    expect_error(cdf_tokenizer_load(d), CDF_ERR_FORMAT, "tokenizer.json", "base64");
    free(b64);

    char *cm = replace_once(json, n, "\"precompiled_charsmap\": \"", "\"precompiled_charsmap\": \"AAAA", &m);
    d = make_dir("json_cmap"); /* 3 extra zero bytes in front shift the header: the trie size is wrong */
    write_file(d, "tokenizer.json", cm, m);
    cdf_tokenizer *tok = cdf_tokenizer_load(d);
    if (tok) cdf_tokenizer_free(tok);
    assert_null(tok);
    assert_int_equal(cdf_last_status(), CDF_ERR_FORMAT);
    free(cm);

    char *piece = replace_once(json, n, "[\n        \"<pad>\",\n        0.0\n      ]", "[\"<pad>\"]", &m);
    d = make_dir("json_piece");
    write_file(d, "tokenizer.json", piece, m);
    expect_error(cdf_tokenizer_load(d), CDF_ERR_FORMAT, "model.vocab[0]", NULL);
    free(piece);

    char *unk = replace_once(json, n, "\"unk_id\": 2", "\"unk_id\": 99999", &m);
    d = make_dir("json_unk");
    write_file(d, "tokenizer.json", unk, m);
    expect_error(cdf_tokenizer_load(d), CDF_ERR_FORMAT, "unk_id", NULL);
    free(unk);

    char *pre = replace_once(json, n, "\"type\": \"Metaspace\"", "\"type\": \"ByteLevel\"", &m);
    d = make_dir("json_pre");
    write_file(d, "tokenizer.json", pre, m);
    expect_error(cdf_tokenizer_load(d), CDF_ERR_UNSUPPORTED, "pre_tokenizer", "ByteLevel");
    free(pre);

    char *norm = replace_once(json, n, "\"type\": \"Strip\"", "\"type\": \"NFD\"", &m);
    d = make_dir("json_norm");
    write_file(d, "tokenizer.json", norm, m);
    expect_error(cdf_tokenizer_load(d), CDF_ERR_UNSUPPORTED, "normalizer", "NFD");
    free(norm);

    /* prepend_scheme "always" (SD3's tokenizer.json): ▁ before text after a leading special token */
    char *always = replace_once(json, n, "\"prepend_scheme\": \"first\"", "\"prepend_scheme\": \"always\"", &m);
    d = make_dir("json_always");
    write_file(d, "tokenizer.json", always, m);
    free(always);
    tok = cdf_tokenizer_load(d);
    assert_non_null(tok);
    int64_t ids[256];
    int k = encode(tok, "<extra_id_0>hello", 17, ids);
    assert_int_equal(k, 3);
    assert_int_equal(ids[0], 32099);
    assert_int_equal(ids[1], 21820);
    assert_int_equal(ids[2], 1);
    cdf_tokenizer_free(tok);
    free(json);
}

/* SD3's tokenizer_3 marks the <extra_id_*> tokens lstrip/rstrip: whitespace around them is
 * swallowed by the match, so spacing around them cannot change the ids. */
static void test_t5_added_token_strip(void **state) {
    (void)state;
    cdf_tokenizer *tok = cdf_tokenizer_load(tu_data("pipelines/sd35m_tiny/tokenizer_3"));
    if (!tok) fail_msg("load: %s", cdf_last_error());
    int64_t a[32], b[32];
    int na = 0, nb = 0, nu;
    const char *spaced = "red   <extra_id_0>  fox", *tight = "red<extra_id_0>fox";
    assert_int_equal(cdf_tokenizer_encode(tok, spaced, strlen(spaced), 32, false, a, NULL, &na, &nu), CDF_OK);
    assert_int_equal(cdf_tokenizer_encode(tok, tight, strlen(tight), 32, false, b, NULL, &nb, &nu), CDF_OK);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, na * sizeof *a);
    bool has_extra = false;
    for (int i = 0; i < na; i++) has_extra |= a[i] == 32099;
    assert_true(has_extra);
    cdf_tokenizer_free(tok);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_t5_json_golden),      cmocka_unit_test(test_t5_spiece_golden),
        cmocka_unit_test(test_t5_accessors),        cmocka_unit_test(test_t5_added_tokens),
        cmocka_unit_test(test_t5_spiece_legacy),    cmocka_unit_test(test_t5_invalid_utf8),
        cmocka_unit_test(test_t5_fuzz),             cmocka_unit_test(test_t5_bad_spiece),
        cmocka_unit_test(test_t5_hostile_charsmap), cmocka_unit_test(test_t5_bad_json), cmocka_unit_test(test_t5_added_token_strip),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
