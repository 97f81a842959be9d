/* Fuzz target: prompts. Arbitrary bytes (invalid UTF-8, NULs, combining marks, special-token
 * look-alikes) through cdf_tokenizer_encode of the real tokenizers in tests/data, loaded once:
 * CLIP-L and CLIP-G (vocab.json + merges.txt), T5 from tokenizer.json and from spiece.model,
 * and SD3.5's T5 tokenizer.json.
 *
 * Invariants: encode never fails on text (only limits and missing tokens may fail, with a
 * message); with padding exactly max_length ids come back, else at most that many; every id is
 * below vocab_size; the mask is 1 for the first n real tokens and 0 after; CLIP starts with
 * bos and ends with eos (T5 ends with eos) unless padding follows; n_untruncated >= n; the same
 * text encodes to the same ids a second time (word cache) and with a larger max_length the
 * shorter result is a prefix of the longer one, up to the final special token; T5 loaded from
 * tokenizer.json and from spiece.model give the same ids. */
#include <cjson/cJSON.h>

#include "fuzz_common.h"

typedef struct loaded {
    const char *rel;
    int source; /* cdf_tokenizer_source */
    cdf_tokenizer *tok;
} loaded;

static loaded g_toks[] = {
    {"tokenizers/clip_l", CDF_TOKENIZER_SOURCE_AUTO, NULL},
    {"tokenizers/clip_g", CDF_TOKENIZER_SOURCE_AUTO, NULL},
    {"tokenizers/t5", CDF_TOKENIZER_SOURCE_TOKENIZER_JSON, NULL},
    {"tokenizers/t5", CDF_TOKENIZER_SOURCE_SPIECE_MODEL, NULL},
    {"pipelines/sd35m_tiny/tokenizer_3", CDF_TOKENIZER_SOURCE_TOKENIZER_JSON, NULL},
};
#define N_TOKS (sizeof g_toks / sizeof *g_toks)

static void write_seeds(const char *dir) {
    static const char *prompts[] = {
        "a photo of a red fox in a snowy forest",
        "A cat holding a sign that says hello world",
        "caf\xC3\xA9 na\xC3\xAFve \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xF0\x9F\x98\x80 \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9",
        "<|startoftext|>x<|endoftext|> </s> <pad> <unk> <extra_id_99> <extra_id_0>",
        "   leading and   multiple   spaces   \t\n tabs\r\n",
        "\xFF\xFE\xC3\x28\xE2\x82\x28\xF0\x28\x8C\x28 \xED\xA0\x80 \xC0\xAF",
        "I'm you're it's we've they'll he'd 'S 'T'",
        "\xEF\xBC\xA1\xEF\xBC\xA2 \xE2\x91\xA0 \xEF\xAC\x81 \xE2\x84\xAB \xC3\x85\xCC\x8A",
        "0123456789 3.14159 1,000,000",
    };
    for (size_t i = 0; i < sizeof prompts / sizeof *prompts; i++) fz_seed(dir, -1, prompts[i], strlen(prompts[i]));
    static const char with_nul[] = "before\0after";
    fz_seed(dir, -1, with_nul, sizeof with_nul - 1);
    /* the prompts of the golden tokenizer tests (prompts[].text) */
    size_t n = 0;
    uint8_t *t = fz_read(fz_join(CDF_TEST_DATA, "tokenizers/tokens.json"), &n);
    cJSON *root = t ? cJSON_ParseWithLength((const char *)t, n) : NULL;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(root, "prompts")) {
        const cJSON *text = cJSON_GetObjectItem(e, "text");
        if (cJSON_IsString(text) && strlen(text->valuestring) <= 4096) fz_seed(dir, -1, text->valuestring, strlen(text->valuestring));
    }
    cJSON_Delete(root);
    free(t);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fz_maybe_write_seeds(write_seeds);
    for (size_t i = 0; i < N_TOKS; i++) {
        g_toks[i].tok = cdf_tokenizer_load_from(fz_join(CDF_TEST_DATA, g_toks[i].rel), (cdf_tokenizer_source)g_toks[i].source);
        if (!g_toks[i].tok) {
            fprintf(stderr, "cannot load %s: %s\n", g_toks[i].rel, cdf_last_error());
            abort();
        }
    }
    return 0;
}

#define MAXL 512

/* Three encodes per tokenizer (every input goes through five tokenizers, so the number of
 * encodes is what sets this target's speed): one unpadded with room for MAXL ids, then padded
 * to the model length (77 CLIP, 256 T5) and padded to 8 (truncation). The padded results must
 * repeat the unpadded one (same text, same ids: the word cache) up to the closing special
 * token. The unpadded ids are returned in big/n_big for the T5 cross-check. */
static void check_one(cdf_tokenizer *tok, const char *text, size_t len, int64_t *big, int *n_big) {
    static int64_t ids[MAXL], mask[MAXL];
    int64_t vocab = cdf_tokenizer_vocab_size(tok);
    bool clip = cdf_tokenizer_kind(tok) == CDF_TOKENIZER_CLIP;
    int64_t bos = cdf_tokenizer_bos_id(tok), eos = cdf_tokenizer_eos_id(tok);
    int nb = -1, nbu = -1;
    cdf_clear_error();
    cdf_status sb = cdf_tokenizer_encode(tok, text, len, MAXL, false, big, NULL, &nb, &nbu);
    *n_big = sb == CDF_OK ? nb : -1;
    if (sb != CDF_OK) {
        FZ_CHECK_MESSAGE();
        FZ_CHECK(sb != CDF_ERR_INTERNAL);
    } else {
        FZ_CHECK(nb >= 1 && nb <= MAXL && nbu >= nb);
        for (int i = 0; i < nb; i++) FZ_CHECK(big[i] >= 0 && big[i] < vocab);
        FZ_CHECK(big[nb - 1] == eos);
        if (clip) FZ_CHECK(big[0] == bos);
    }
    int lens[2] = {clip ? 77 : 256, 8};
    for (int li = 0; li < 2; li++) {
        int max = lens[li];
        int n = -1, nu = -1;
        cdf_clear_error();
        cdf_status st = cdf_tokenizer_encode(tok, text, len, max, true, ids, mask, &n, &nu);
        if (st != CDF_OK) {
            FZ_CHECK_MESSAGE();
            FZ_CHECK(st != CDF_ERR_INTERNAL);
            continue;
        }
        FZ_CHECK(sb == CDF_OK); /* the text was encodable a moment ago */
        FZ_CHECK(n == max);
        FZ_CHECK(nu == nbu);
        int real = 0;
        while (real < n && mask[real] == 1) real++;
        for (int i = real; i < n; i++) FZ_CHECK(mask[i] == 0);
        for (int i = 0; i < n; i++) FZ_CHECK(ids[i] >= 0 && ids[i] < vocab);
        FZ_CHECK(real >= 1 && real == (nu < max ? nu : max));
        if (clip) FZ_CHECK(ids[0] == bos);
        FZ_CHECK(ids[real - 1] == eos);
        /* same ids as the unpadded encode; truncation keeps a prefix of the content */
        FZ_CHECK(nb >= real);
        FZ_CHECK(memcmp(ids, big, (size_t)(real - 1) * sizeof *ids) == 0);
        if (real == nb) FZ_CHECK(ids[real - 1] == big[nb - 1]);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 2048) return 0; /* long prompts only repeat the same paths, slowly */
    static int64_t big[N_TOKS][MAXL];
    int n_big[N_TOKS];
    for (size_t i = 0; i < N_TOKS; i++) check_one(g_toks[i].tok, (const char *)data, size, big[i], &n_big[i]);
    /* T5 from tokenizer.json and from spiece.model are the same tokenizer (transformers
     * converts the second into the first): they must agree on every prompt */
    FZ_CHECK((n_big[2] < 0) == (n_big[3] < 0));
    if (n_big[2] >= 0) FZ_CHECK(n_big[2] == n_big[3] && memcmp(big[2], big[3], (size_t)n_big[2] * sizeof **big) == 0);
    return 0;
}
