/* FLUX.2's tokenizer (byte-level BPE from tokenizer.json, Mistral tekken vocabulary) and the FLUX.2
 * prompt format, against the golden ids of /work/shared/golden/flux2_text (copied to
 * tests/data/golden/flux2_text: tokens.json = what diffusers' Flux2Pipeline + the Hugging Face
 * tokenizers library produce for 20 prompts; third_party_expected_ids.json = 15 id lists of other
 * projects' tests, encode(text, add_special_tokens=False) with the real FLUX.2 tokenizer.json).
 * Every id must be equal: there is no tolerance for tokenization. */
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cdiffusers/tokenizer.h"
#include "testutil.h"
#include "tokenizers/flux2_prompt.h"

#define TOK_DIR "golden/flux2_text/tokenizer"

static cdf_tokenizer *g_tok;
static cJSON *g_tokens, *g_fixtures;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static cJSON *load_json(const char *rel) {
    char *text = tu_read_file(tu_data(rel), NULL);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    free(text);
    return j;
}

static int setup(void **state) {
    (void)state;
    double t0 = now_ms();
    g_tok = cdf_tokenizer_load(tu_data(TOK_DIR));
    if (!g_tok) {
        fprintf(stderr, "load failed: %s\n", cdf_last_error());
        return -1;
    }
    fprintf(stderr, "FLUX.2 tokenizer loaded in %.0f ms\n", now_ms() - t0);
    g_tokens = load_json("golden/flux2_text/tokens.json");
    g_fixtures = load_json("golden/flux2_text/third_party_expected_ids.json");
    return g_tokens && g_fixtures ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    cdf_tokenizer_free(g_tok);
    cJSON_Delete(g_tokens);
    cJSON_Delete(g_fixtures);
    return 0;
}

static char *hex_bytes(const char *hex, size_t *len) {
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

static int64_t item_i64(const cJSON *a, int i) { return (int64_t)cJSON_GetArrayItem(a, i)->valuedouble; }

/* ids + mask of one prompt at one max length against golden arrays; false (and a message) on mismatch. */
static bool check_ids(const char *name, const char *text, size_t len, int max_length, const cJSON *gids, const cJSON *gmask,
                      int want_tokens, int want_untruncated) {
    static int64_t ids[1024], mask[1024];
    int n_tok = -1, n_untr = -1;
    cdf_status st = cdf_flux2_format_prompt(g_tok, text, len, NULL, max_length, ids, mask, &n_tok, &n_untr);
    if (st != CDF_OK || cJSON_GetArraySize(gids) != max_length) {
        fprintf(stderr, "%s@%d: status %d: %s\n", name, max_length, st, cdf_last_error());
        return false;
    }
    for (int i = 0; i < max_length; i++)
        if (ids[i] != item_i64(gids, i) || mask[i] != item_i64(gmask, i)) {
            fprintf(stderr, "%s@%d: position %d: id %lld mask %lld, golden id %lld mask %lld\n", name, max_length, i,
                    (long long)ids[i], (long long)mask[i], (long long)item_i64(gids, i), (long long)item_i64(gmask, i));
            return false;
        }
    if ((want_tokens >= 0 && n_tok != want_tokens) || n_untr != want_untruncated) {
        fprintf(stderr, "%s@%d: %d tokens (%d untruncated), golden %d (%d)\n", name, max_length, n_tok, n_untr, want_tokens,
                want_untruncated);
        return false;
    }
    return true;
}

/* Every golden prompt: rendered text, ids + attention mask at 512 (and at 64 where the golden has
 * them), token counts, and the token strings of the untruncated encoding. */
static void test_golden_prompts(void **state) {
    (void)state;
    const cJSON *prompts = cJSON_GetObjectItem(g_tokens, "prompts"), *p;
    assert_int_equal(cJSON_GetObjectItem(g_tokens, "pad_id")->valueint, cdf_tokenizer_pad_id(g_tok));
    assert_string_equal(cJSON_GetObjectItem(g_tokens, "system_message")->valuestring, CDF_FLUX2_SYSTEM_MESSAGE);
    int n_prompts = 0, failures = 0, n_short = 0;
    static int64_t full[4096];
    cJSON_ArrayForEach(p, prompts) {
        const char *name = cJSON_GetObjectItem(p, "name")->valuestring;
        size_t len;
        char *text = hex_bytes(cJSON_GetObjectItem(p, "text_utf8_hex")->valuestring, &len);
        const char *want_rendered = cJSON_GetObjectItem(p, "rendered")->valuestring;
        int num_tokens = cJSON_GetObjectItem(p, "num_tokens")->valueint;
        int num_untr = cJSON_GetObjectItem(p, "num_tokens_untruncated")->valueint;
        bool ok = true;
        n_prompts++;

        char *rendered = NULL;
        size_t rlen = 0;
        assert_int_equal(cdf_flux2_render_prompt(text, len, NULL, NULL, &rendered, &rlen), CDF_OK);
        if (rlen != strlen(want_rendered) || memcmp(rendered, want_rendered, rlen) != 0) {
            fprintf(stderr, "%s: rendered text differs:\n  got  %s\n  want %s\n", name, rendered, want_rendered);
            ok = false;
        }
        ok = ok && check_ids(name, text, len, 512, cJSON_GetObjectItem(p, "input_ids"), cJSON_GetObjectItem(p, "attention_mask"),
                             num_tokens, num_untr);
        const cJSON *short_ids = cJSON_GetObjectItem(p, "input_ids_short");
        if (ok && short_ids) {
            int short_len = cJSON_GetObjectItem(p, "short_max_length")->valueint;
            ok = check_ids(name, text, len, short_len, short_ids, cJSON_GetObjectItem(p, "attention_mask_short"), -1, num_untr);
            n_short++;
        }
        /* the untruncated encoding of the rendered text, piece by piece */
        const cJSON *gtok = cJSON_GetObjectItem(p, "tokens_unpadded");
        int n_full = -1;
        if (ok && (cdf_tokenizer_encode(g_tok, rendered, rlen, 4096, false, full, NULL, &n_full, NULL) != CDF_OK ||
                   n_full != num_untr || (num_untr <= 512 && n_full != cJSON_GetArraySize(gtok)))) {
            fprintf(stderr, "%s: %d untruncated tokens, golden %d\n", name, n_full, num_untr);
            ok = false;
        }
        for (int i = 0; ok && i < cJSON_GetArraySize(gtok); i++) {
            const char *piece = cdf_tokenizer_id_to_piece(g_tok, full[i]);
            if (!piece || strcmp(piece, cJSON_GetArrayItem(gtok, i)->valuestring) != 0) {
                fprintf(stderr, "%s: token %d piece \"%s\", golden \"%s\"\n", name, i, piece ? piece : "(null)",
                        cJSON_GetArrayItem(gtok, i)->valuestring);
                ok = false;
            }
        }
        free(rendered);
        free(text);
        failures += !ok;
    }
    fprintf(stderr, "tokens.json: %d prompts (%d also at the short length), %d failures\n", n_prompts, n_short, failures);
    assert_int_equal(n_prompts, 20);
    assert_int_equal(n_short, 2);
    assert_int_equal(failures, 0);
}

/* Third-party id lists: encode(text, add_special_tokens=False) of the real FLUX.2 tokenizer. */
static void test_third_party_fixtures(void **state) {
    (void)state;
    static int64_t ids[1024];
    int n_fix = 0, failures = 0;
    const cJSON *f;
    cJSON_ArrayForEach(f, g_fixtures) {
        const char *text = cJSON_GetArrayItem(f, 1)->valuestring;
        const cJSON *want = cJSON_GetArrayItem(f, 2);
        int n = -1;
        n_fix++;
        assert_int_equal(cdf_tokenizer_encode(g_tok, text, strlen(text), 1024, false, ids, NULL, &n, NULL), CDF_OK);
        bool ok = n == cJSON_GetArraySize(want);
        for (int i = 0; ok && i < n; i++) ok = ids[i] == item_i64(want, i);
        if (!ok) fprintf(stderr, "fixture %d (%s) \"%.60s\": ids differ (%d vs %d ids)\n", n_fix,
                         cJSON_GetArrayItem(f, 0)->valuestring, text, n, cJSON_GetArraySize(want));
        failures += !ok;
    }
    fprintf(stderr, "third-party fixtures: %d, %d failures\n", n_fix, failures);
    assert_int_equal(n_fix, 15);
    assert_int_equal(failures, 0);
}

static void test_accessors(void **state) {
    (void)state;
    assert_int_equal(cdf_tokenizer_kind(g_tok), CDF_TOKENIZER_BPE);
    /* README section 1: 0 <unk>, 1 <s>, 2 </s>, 11 <pad>; 131072 ids; model_max_length 1e30 = unbounded */
    assert_int_equal(cdf_tokenizer_unk_id(g_tok), 0);
    assert_int_equal(cdf_tokenizer_bos_id(g_tok), 1);
    assert_int_equal(cdf_tokenizer_eos_id(g_tok), 2);
    assert_int_equal(cdf_tokenizer_pad_id(g_tok), 11);
    assert_int_equal(cdf_tokenizer_vocab_size(g_tok), 131072);
    assert_int_equal(cdf_tokenizer_model_max_length(g_tok), 0);
    assert_string_equal(cdf_tokenizer_id_to_piece(g_tok, 17), "[SYSTEM_PROMPT]");
    assert_string_equal(cdf_tokenizer_id_to_piece(g_tok, 1000), "\xC4\x80"); /* byte 0x00 -> U+0100 */
    assert_null(cdf_tokenizer_id_to_piece(g_tok, 131072));
}

/* Python semantics of format_input's prompt.replace("[IMG]", ""): one left-to-right pass, so
 * "[IM[IMG]G]" leaves a new "[IMG]" (which then is the special id 10), and a custom system
 * message replaces the default one. */
static void test_render_details(void **state) {
    (void)state;
    char *r;
    size_t n;
    assert_int_equal(cdf_flux2_render_prompt("[IM[IMG]G]x[IMG][IMG]", 21, "sys", "<s>", &r, &n), CDF_OK);
    assert_string_equal(r, "<s>[SYSTEM_PROMPT]sys[/SYSTEM_PROMPT][INST][IMG]x[/INST]");
    assert_int_equal(n, strlen(r));
    free(r);
    /* invalid UTF-8 is replaced first: removing [IMG] cannot join E6 + 97 A5 into a valid 日 */
    assert_int_equal(cdf_flux2_render_prompt("\xE6[IMG]\x97\xA5", 8, "", NULL, &r, &n), CDF_OK);
    assert_string_equal(r, "<s>[SYSTEM_PROMPT][/SYSTEM_PROMPT][INST]\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD[/INST]");
    free(r);
    int64_t ids[64], mask[64];
    int nt, nu;
    assert_int_equal(cdf_flux2_format_prompt(g_tok, "[IM[IMG]G]", 10, "", 64, ids, mask, &nt, &nu), CDF_OK);
    /* <s> [SYSTEM_PROMPT] [/SYSTEM_PROMPT] [INST] [IMG] [/INST], then <pad> */
    const int64_t want[6] = {1, 17, 18, 3, 10, 4};
    assert_int_equal(nt, 6);
    assert_int_equal(nu, 6);
    for (int i = 0; i < 64; i++) {
        assert_int_equal(ids[i], i < 6 ? want[i] : 11);
        assert_int_equal(mask[i], i < 6);
    }
    /* NULL prompt with len 0 is the empty prompt: 31 system ids + [INST] [/INST] (golden "empty": 33) */
    assert_int_equal(cdf_flux2_format_prompt(g_tok, NULL, 0, NULL, 64, ids, NULL, &nt, NULL), CDF_OK);
    assert_int_equal(nt, 33);
    assert_int_equal(ids[31], 3);
    assert_int_equal(ids[32], 4);
}

/* Invalid UTF-8 tokenizes like its U+FFFD replacement; random bytes never fail. */
static void test_invalid_utf8_and_fuzz(void **state) {
    (void)state;
    static int64_t a[512], b[512];
    int na, nb;
    assert_int_equal(cdf_tokenizer_encode(g_tok, "a\xff" "b\xE2\x82", 5, 512, false, a, NULL, &na, NULL), CDF_OK);
    assert_int_equal(cdf_tokenizer_encode(g_tok, "a\xEF\xBF\xBD" "b\xEF\xBF\xBD", 8, 512, false, b, NULL, &nb, NULL), CDF_OK);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, (size_t)na * sizeof *a);
    uint64_t s = 0x9E3779B97F4A7C15ull;
    char buf[600];
    for (int iter = 0; iter < 200; iter++) {
        size_t len = (size_t)(iter * 13 % 599) + 1;
        for (size_t i = 0; i < len; i++) {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            buf[i] = (char)(iter % 4 == 0 ? (s & 0x7F) : (s & 0xFF));
        }
        int nt = -1, nu = -1;
        assert_int_equal(cdf_flux2_format_prompt(g_tok, buf, len, NULL, 512, a, b, &nt, &nu), CDF_OK);
        assert_true(nt >= 33 && nt <= 512); /* 31 system ids + [INST] + [/INST] at least */
        for (int i = 0; i < 512; i++) assert_true(a[i] >= 0 && a[i] < 131072);
    }
}

/* A long whitespace run and a long letter run are single pieces: no regex or BPE limit is hit. */
static void test_long_pieces(void **state) {
    (void)state;
    size_t n = 200000;
    char *text = malloc(n + 2);
    text[0] = 'a';
    memset(text + 1, ' ', n - 1);
    text[n] = 'b';
    int nt, nu;
    static int64_t ids[512];
    assert_int_equal(cdf_flux2_format_prompt(g_tok, text, n + 1, NULL, 512, ids, NULL, &nt, &nu), CDF_OK);
    assert_int_equal(nt, 512);
    assert_true(nu > 512);
    memset(text, 'x', n);
    assert_int_equal(cdf_flux2_format_prompt(g_tok, text, n, NULL, 512, ids, NULL, &nt, &nu), CDF_OK);
    assert_int_equal(nt, 512);
    free(text);
}

/* ------------------------------------------------------------------ small hand-made files */

static const char *make_dir(const char *name) {
    static char path[8][512];
    static int slot;
    char *p = path[slot++ & 7];
    snprintf(p, 512, "%s/%s", tu_tmpdir(), name);
    mkdir(p, 0755);
    return p;
}

static void write_text(const char *dir, const char *name, const char *text) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    assert_int_equal(tu_write_file(path, text, strlen(text)), 0);
}

/* A tokenizer.json with the 256 byte symbols (ids 0..255 in GPT-2 order of bytes) plus `extra`
 * vocabulary entries, `merges`, and the given pre_tokenizer / model options. */
static void write_tiny(const char *dir, const char *extra_vocab, const char *merges, const char *model_opts,
                       const char *pre_tokenizer, const char *normalizer) {
    size_t cap = 1 << 16, k = 0;
    char *j = malloc(cap);
    k += (size_t)snprintf(j + k, cap - k, "{\"version\":\"1.0\",\"normalizer\":%s,\"pre_tokenizer\":%s,"
                                          "\"added_tokens\":[{\"id\":%d,\"content\":\"<pad>\",\"special\":true}],"
                                          "\"model\":{\"type\":\"BPE\",%s\"vocab\":{",
                          normalizer, pre_tokenizer, 256 + 16, model_opts);
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        unsigned cp = printable ? (unsigned)b : 256 + (unsigned)extra++;
        /* JSON \u escapes keep the file ASCII; quote and backslash need them anyway */
        k += (size_t)snprintf(j + k, cap - k, "%s\"\\u%04x\":%d", b ? "," : "", cp, b);
    }
    k += (size_t)snprintf(j + k, cap - k, "%s%s},\"merges\":[%s]}}", extra_vocab[0] ? "," : "", extra_vocab, merges);
    write_text(dir, "tokenizer.json", j);
    free(j);
}

static int encode_ids(cdf_tokenizer *tok, const char *s, int64_t *ids) {
    int n = -1;
    assert_int_equal(cdf_tokenizer_encode(tok, s, strlen(s), 64, false, ids, NULL, &n, NULL), CDF_OK);
    return n;
}

#define BYTELEVEL_ONLY "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}"

/* Merge order and ignore_merges on a hand-made vocabulary whose expected ids follow from the BPE
 * rules alone (ids: byte b -> b for printable ASCII). */
static void test_tiny_bpe_rules(void **state) {
    (void)state;
    /* lowest rank first: "abc" -> (b,c) rank 0 -> a + bc -> (a,bc) rank 2 -> abc; "ab" -> (a,b) rank 1 */
    const char *d = make_dir("bpe_rules");
    write_tiny(d, "\"bc\":256,\"ab\":257,\"abc\":258,\"xyz\":259", "[\"b\",\"c\"],[\"a\",\"b\"],\"a bc\"",
               "\"ignore_merges\":false,", BYTELEVEL_ONLY, "null");
    cdf_tokenizer *tok = cdf_tokenizer_load(d);
    if (!tok) fail_msg("%s", cdf_last_error());
    assert_int_equal(cdf_tokenizer_kind(tok), CDF_TOKENIZER_BPE);
    int64_t ids[64];
    assert_int_equal(encode_ids(tok, "abc", ids), 1);
    assert_int_equal(ids[0], 258);
    assert_int_equal(encode_ids(tok, "abab", ids), 2); /* leftmost first among equal ranks */
    assert_int_equal(ids[0], 257);
    assert_int_equal(ids[1], 257);
    /* "xyz" is in the vocabulary but no merge leads there: without ignore_merges it stays x y z */
    assert_int_equal(encode_ids(tok, "xyz", ids), 3);
    assert_int_equal(ids[0], 'x');
    assert_int_equal(ids[2], 'z');
    assert_int_equal(encode_ids(tok, "<pad>xyz", ids), 4); /* added token split out first */
    assert_int_equal(ids[0], 272);
    assert_int_equal(cdf_tokenizer_pad_id(tok), 272);
    cdf_tokenizer_free(tok);

    d = make_dir("bpe_ignore_merges");
    write_tiny(d, "\"bc\":256,\"ab\":257,\"abc\":258,\"xyz\":259", "[\"b\",\"c\"],[\"a\",\"b\"],[\"a\",\"bc\"]",
               "\"ignore_merges\":true,", BYTELEVEL_ONLY, "null");
    tok = cdf_tokenizer_load(d);
    assert_non_null(tok);
    assert_int_equal(encode_ids(tok, "xyz", ids), 1);
    assert_int_equal(ids[0], 259);
    assert_int_equal(encode_ids(tok, "xyzx", ids), 4); /* only a whole piece is looked up */
    cdf_tokenizer_free(tok);

    /* Split (Isolated) keeps matches and gaps as pieces: merges never cross a piece boundary,
     * and \s in the pattern is White_Space: "b c" -> "b", " ", "c" (no "bc") */
    d = make_dir("bpe_split");
    write_tiny(d, "\"bc\":256", "[\"b\",\"c\"]", "",
               "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\s+\"},"
               "\"behavior\":\"Isolated\",\"invert\":false}," BYTELEVEL_ONLY "]}",
               "null");
    tok = cdf_tokenizer_load(d);
    if (!tok) fail_msg("%s", cdf_last_error());
    const int64_t want[5] = {256, ' ', 'b', ' ', 'c'}; /* "bc" " " "b" " " "c" (byte b has id b) */
    assert_int_equal(encode_ids(tok, "bc b c", ids), 5);
    for (int i = 0; i < 5; i++) assert_int_equal(ids[i], want[i]);
    cdf_tokenizer_free(tok);
}

static void expect_load_error(const char *dir, cdf_status want, const char *needle) {
    cdf_tokenizer *tok = cdf_tokenizer_load(dir);
    if (tok) cdf_tokenizer_free(tok);
    assert_null(tok);
    fprintf(stderr, "  error: %s\n", cdf_last_error());
    assert_int_equal(cdf_last_status(), want);
    assert_non_null(strstr(cdf_last_error(), needle));
}

static void test_bad_files(void **state) {
    (void)state;
    const char *d = make_dir("bpe_bad_merge");
    write_tiny(d, "", "[\"a\",\"q\\u00e9\"]", "", BYTELEVEL_ONLY, "null");
    expect_load_error(d, CDF_ERR_FORMAT, "model.merges[0]");
    d = make_dir("bpe_normalizer");
    write_tiny(d, "", "", "", BYTELEVEL_ONLY, "{\"type\":\"NFC\"}");
    expect_load_error(d, CDF_ERR_UNSUPPORTED, "normalizer \"NFC\"");
    d = make_dir("bpe_no_bytelevel");
    write_tiny(d, "", "", "", "{\"type\":\"Whitespace\"}", "null");
    expect_load_error(d, CDF_ERR_UNSUPPORTED, "Whitespace");
    d = make_dir("bpe_suffix");
    write_tiny(d, "", "", "\"end_of_word_suffix\":\"</w>\",", BYTELEVEL_ONLY, "null");
    expect_load_error(d, CDF_ERR_UNSUPPORTED, "end_of_word_suffix");
    d = make_dir("bpe_bad_regex");
    write_tiny(d, "", "", "",
               "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(a\"},"
               "\"behavior\":\"Isolated\"}," BYTELEVEL_ONLY "]}",
               "null");
    expect_load_error(d, CDF_ERR_UNSUPPORTED, "regex");
    d = make_dir("bpe_removed");
    write_tiny(d, "", "", "",
               "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"a\"},"
               "\"behavior\":\"Removed\"}," BYTELEVEL_ONLY "]}",
               "null");
    expect_load_error(d, CDF_ERR_UNSUPPORTED, "Removed");
    d = make_dir("bpe_sparse");
    write_text(d, "tokenizer.json", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":9000000},\"merges\":[]},"
                                    "\"pre_tokenizer\":" BYTELEVEL_ONLY "}");
    expect_load_error(d, CDF_ERR_FORMAT, "dense");
    d = make_dir("bpe_wordpiece");
    write_text(d, "tokenizer.json", "{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}}");
    expect_load_error(d, CDF_ERR_UNSUPPORTED, "WordPiece");
    /* a class that is neither CLIP nor T5 needs a tokenizer.json */
    d = make_dir("bpe_class_only");
    write_text(d, "tokenizer_config.json", "{\"tokenizer_class\": \"LlamaTokenizerFast\"}");
    expect_load_error(d, CDF_ERR_UNSUPPORTED, "LlamaTokenizerFast");
    /* the prompt format refuses a tokenizer of another kind */
    d = make_dir("bpe_ok");
    write_tiny(d, "", "", "", BYTELEVEL_ONLY, "null");
    cdf_tokenizer *tok = cdf_tokenizer_load(d);
    assert_non_null(tok);
    cdf_tokenizer_free(tok);
    int64_t ids[8];
    assert_int_equal(cdf_flux2_format_prompt(NULL, "a", 1, NULL, 8, ids, NULL, NULL, NULL), CDF_ERR_INVALID_ARG);
    assert_int_equal(cdf_flux2_format_prompt(g_tok, NULL, 3, NULL, 8, ids, NULL, NULL, NULL), CDF_ERR_INVALID_ARG);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_prompts),
        cmocka_unit_test(test_third_party_fixtures),
        cmocka_unit_test(test_accessors),
        cmocka_unit_test(test_render_details),
        cmocka_unit_test(test_invalid_utf8_and_fuzz),
        cmocka_unit_test(test_long_pieces),
        cmocka_unit_test(test_tiny_bpe_rules),
        cmocka_unit_test(test_bad_files),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
