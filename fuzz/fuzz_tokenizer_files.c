/* Fuzz target: tokenizer files. The first input byte picks which file of a small, otherwise
 * valid tokenizer folder the rest of the input replaces:
 *   0 clip/vocab.json    1 clip/merges.txt    2 clip/tokenizer_config.json
 *   3 clip/special_tokens_map.json            4 t5json/tokenizer.json
 *   5 t5json/tokenizer_config.json            6 t5spm/spiece.model
 *   7 the precompiled charsmap inside t5spm/spiece.model (the target wraps it in the protobuf)
 * then cdf_tokenizer_load + cdf_tokenizer_encode of fixed prompts (with and without padding,
 * with truncation), and the original file is put back.
 *
 * The companion files are tiny synthetic tokenizers written at start-up (a byte-level BPE with
 * all 256 byte symbols and a dozen merges; a 40-piece Unigram model), so one execution costs
 * microseconds rather than the ~50 ms of parsing the real 1-2 MB vocabularies. The seeds add the
 * real tokenizer_config.json files and the real T5 nmt_nfkc charsmap from tests/data.
 *
 * Invariants: a failed load leaves a message; a loaded tokenizer encodes every prompt without
 * error or with a message (e.g. no pad token), never writes more than max_length ids, and every
 * id is below vocab_size; encoding twice gives the same ids (the word cache is consistent). */
#include <cjson/cJSON.h>

#include "fuzz_common.h"

enum { MODES = 8 };
static char g_clip[512], g_t5json[512], g_t5spm[512];

/* ---- synthetic CLIP (byte-level BPE) ---- */
static void utf8_put(char **p, uint32_t cp) {
    char *s = *p;
    if (cp < 0x80) *s++ = (char)cp;
    else if (cp < 0x800) *s++ = (char)(0xC0 | cp >> 6), *s++ = (char)(0x80 | (cp & 0x3F));
    else *s++ = (char)(0xE0 | cp >> 12), *s++ = (char)(0x80 | ((cp >> 6) & 0x3F)), *s++ = (char)(0x80 | (cp & 0x3F));
    *p = s;
}

static void byte_symbol(int b, char *out) {
    /* GPT-2's bytes_to_unicode: printable Latin-1 maps to itself, the rest to 256.. in order */
    int extra = 0;
    uint32_t cp = 0;
    for (int x = 0; x <= b; x++) {
        bool printable = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174;
        cp = printable ? (uint32_t)x : 256u + (uint32_t)extra++;
    }
    char *p = out;
    utf8_put(&p, cp);
    *p = 0;
}

static const char *k_merges[][2] = {
    {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o</w>"}, {"f", "o"}, {"fo", "x</w>"}, {"c", "a"},
    {"ca", "f"}, {"r", "e"}, {"re", "d</w>"}, {"t", "h"}, {"th", "e</w>"}, {"o", "f</w>"},
};

static int g_clip_bos_id; /* the two special tokens get the last ids */

static char *clip_vocab_json(void) {
    cJSON *v = cJSON_CreateObject();
    int id = 0;
    char sym[16], w[24];
    for (int b = 0; b < 256; b++) {
        byte_symbol(b, sym);
        cJSON_AddNumberToObject(v, sym, id++);
    }
    for (int b = 0; b < 256; b++) {
        byte_symbol(b, sym);
        snprintf(w, sizeof w, "%s</w>", sym);
        cJSON_AddNumberToObject(v, w, id++);
    }
    for (size_t i = 0; i < sizeof k_merges / sizeof *k_merges; i++) {
        char m[64];
        snprintf(m, sizeof m, "%s%s", k_merges[i][0], k_merges[i][1]);
        if (!cJSON_HasObjectItem(v, m)) cJSON_AddNumberToObject(v, m, id++);
    }
    g_clip_bos_id = id;
    cJSON_AddNumberToObject(v, "<|startoftext|>", id++);
    cJSON_AddNumberToObject(v, "<|endoftext|>", id++);
    char *s = cJSON_PrintUnformatted(v);
    cJSON_Delete(v);
    return s;
}

static char *clip_merges_txt(void) {
    size_t cap = 4096, n = 0;
    char *s = malloc(cap);
    n += (size_t)snprintf(s + n, cap - n, "#version: 0.2\n");
    for (size_t i = 0; i < sizeof k_merges / sizeof *k_merges; i++)
        n += (size_t)snprintf(s + n, cap - n, "%s %s\n", k_merges[i][0], k_merges[i][1]);
    return s;
}

static char k_clip_config[1024];
static const char k_clip_config_fmt[] =
    "{\"tokenizer_class\": \"CLIPTokenizer\", \"model_max_length\": 77, \"do_lower_case\": true,"
    " \"bos_token\": \"<|startoftext|>\", \"eos_token\": \"<|endoftext|>\", \"pad_token\": \"<|endoftext|>\","
    " \"unk_token\": \"<|endoftext|>\", \"added_tokens_decoder\": {"
    " \"%d\": {\"content\": \"<|startoftext|>\", \"special\": true, \"normalized\": true},"
    " \"%d\": {\"content\": \"<|endoftext|>\", \"special\": true, \"normalized\": false}}}";
static const char k_clip_special[] =
    "{\"bos_token\": {\"content\": \"<|startoftext|>\"}, \"eos_token\": \"<|endoftext|>\","
    " \"pad_token\": \"<|endoftext|>\", \"unk_token\": \"<|endoftext|>\"}";

/* ---- synthetic T5 (Unigram) ---- */
static const char *k_pieces[] = {"<pad>", "</s>", "<unk>", "\xE2\x96\x81", "\xE2\x96\x81" "a", "\xE2\x96\x81" "the",
                                 "\xE2\x96\x81" "fox", "fox", "red", "\xE2\x96\x81" "red", ".", ",", "!", "\xC3\xA9",
                                 "a", "b", "c", "d", "e", "f", "h", "i", "l", "n", "o", "p", "r", "s", "t", "u", "w",
                                 "x", "y", "\xE6\x97\xA5", "\xE6\x9C\xAC", "1", "2"};
#define N_PIECES (int)(sizeof k_pieces / sizeof *k_pieces)

static char *t5_tokenizer_json(void) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "version", "1.0");
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
    for (int i = 0; i < 3 + 2; i++) {
        cJSON *t = cJSON_CreateObject();
        char name[32];
        if (i < 3) snprintf(name, sizeof name, "%s", k_pieces[i]);
        else snprintf(name, sizeof name, "<extra_id_%d>", 4 - i);
        cJSON_AddNumberToObject(t, "id", i < 3 ? i : N_PIECES + i - 3);
        cJSON_AddStringToObject(t, "content", name);
        cJSON_AddBoolToObject(t, "special", true);
        cJSON_AddBoolToObject(t, "normalized", false);
        cJSON_AddItemToArray(added, t);
    }
    cJSON *norm = cJSON_Parse("{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Precompiled\", \"precompiled_charsmap\": \"\"},"
                              " {\"type\": \"Strip\", \"strip_left\": false, \"strip_right\": true},"
                              " {\"type\": \"Replace\", \"pattern\": {\"Regex\": \" {2,}\"}, \"content\": \"\xE2\x96\x81\"}]}");
    cJSON_AddItemToObject(root, "normalizer", norm);
    cJSON_AddItemToObject(root, "pre_tokenizer",
                          cJSON_Parse("{\"type\": \"Metaspace\", \"replacement\": \"\xE2\x96\x81\", \"prepend_scheme\": \"first\", \"split\": true}"));
    cJSON_AddItemToObject(root, "post_processor",
                          cJSON_Parse("{\"type\": \"TemplateProcessing\", \"single\": [{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}},"
                                      " {\"SpecialToken\": {\"id\": \"</s>\", \"type_id\": 0}}], \"special_tokens\": {\"</s>\":"
                                      " {\"id\": \"</s>\", \"ids\": [1], \"tokens\": [\"</s>\"]}}}"));
    cJSON *model = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(model, "type", "Unigram");
    cJSON_AddNumberToObject(model, "unk_id", 2);
    cJSON *vocab = cJSON_AddArrayToObject(model, "vocab");
    for (int i = 0; i < N_PIECES; i++) {
        cJSON *e = cJSON_CreateArray();
        cJSON_AddItemToArray(e, cJSON_CreateString(k_pieces[i]));
        cJSON_AddItemToArray(e, cJSON_CreateNumber(i < 3 ? 0.0 : -1.0 - 0.37 * i));
        cJSON_AddItemToArray(vocab, e);
    }
    cJSON_AddBoolToObject(model, "byte_fallback", false);
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

static const char k_t5_config[] = "{\"tokenizer_class\": \"T5Tokenizer\", \"model_max_length\": 512, \"extra_ids\": 2,"
                                  " \"eos_token\": \"</s>\", \"pad_token\": \"<pad>\", \"unk_token\": \"<unk>\", \"legacy\": false}";

/* protobuf writer for spiece.model */
typedef struct pb {
    uint8_t *p;
    size_t n, cap;
} pb;
static void pb_bytes(pb *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        if (!b->p) abort();
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void pb_varint(pb *b, uint64_t v) {
    do {
        uint8_t c = (uint8_t)(v & 0x7F);
        v >>= 7;
        if (v) c |= 0x80;
        pb_bytes(b, &c, 1);
    } while (v);
}
static void pb_tag(pb *b, int field, int wire) { pb_varint(b, (uint64_t)field << 3 | (uint64_t)wire); }
static void pb_len(pb *b, int field, const void *d, size_t n) {
    pb_tag(b, field, 2);
    pb_varint(b, n);
    pb_bytes(b, d, n);
}

static pb spiece_model(const uint8_t *charsmap, size_t charsmap_len) {
    pb m = {0};
    for (int i = 0; i < N_PIECES; i++) {
        pb sp = {0};
        pb_len(&sp, 1, k_pieces[i], strlen(k_pieces[i]));
        float score = i < 3 ? 0.0f : -1.0f - 0.37f * (float)i;
        uint32_t bits;
        memcpy(&bits, &score, 4);
        uint8_t le[4] = {(uint8_t)bits, (uint8_t)(bits >> 8), (uint8_t)(bits >> 16), (uint8_t)(bits >> 24)};
        pb_tag(&sp, 2, 5);
        pb_bytes(&sp, le, 4);
        pb_tag(&sp, 3, 0);
        pb_varint(&sp, i == 2 ? 2 : i < 2 ? 3 : 1); /* unknown / control / normal */
        pb_len(&m, 1, sp.p, sp.n);
        free(sp.p);
    }
    pb tr = {0};
    pb_tag(&tr, 3, 0), pb_varint(&tr, 1);   /* model_type UNIGRAM */
    pb_tag(&tr, 40, 0), pb_varint(&tr, 2);  /* unk_id */
    pb_tag(&tr, 42, 0), pb_varint(&tr, 1);  /* eos_id */
    pb_len(&m, 2, tr.p, tr.n);
    free(tr.p);
    pb ns = {0};
    pb_len(&ns, 1, "nmt_nfkc", 8);
    if (charsmap) pb_len(&ns, 2, charsmap, charsmap_len);
    pb_tag(&ns, 3, 0), pb_varint(&ns, 1); /* add_dummy_prefix */
    pb_len(&m, 3, ns.p, ns.n);
    free(ns.p);
    return m;
}

/* ---- the real charsmap, for the seeds ---- */
static int b64(int c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
}

static uint8_t *real_charsmap(size_t *n) {
    size_t len = 0;
    uint8_t *text = fz_read(fz_join(CDF_TEST_DATA, "tokenizers/t5/tokenizer.json"), &len);
    if (!text) return NULL;
    cJSON *root = cJSON_ParseWithLength((const char *)text, len);
    free(text);
    const cJSON *list = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "normalizer"), "normalizers");
    const cJSON *cm = cJSON_GetObjectItem(cJSON_GetArrayItem(list, 0), "precompiled_charsmap");
    uint8_t *out = NULL;
    if (cJSON_IsString(cm)) {
        const char *s = cm->valuestring;
        size_t sl = strlen(s), k = 0;
        out = malloc(sl / 4 * 3 + 3);
        uint32_t acc = 0;
        int bits = 0;
        for (size_t i = 0; i < sl; i++) {
            int v = b64((unsigned char)s[i]);
            if (v < 0) continue;
            acc = acc << 6 | (uint32_t)v;
            bits += 6;
            if (bits >= 8) {
                bits -= 8;
                out[k++] = (uint8_t)(acc >> bits);
            }
        }
        *n = k;
    }
    cJSON_Delete(root);
    return out;
}

/* ---- folder set-up ---- */
typedef struct file_slot {
    const char *dir, *name;
    uint8_t *orig;
    size_t orig_n;
} file_slot;
static file_slot g_slots[MODES];

static void set_slot(int mode, const char *dir, const char *name, const void *data, size_t n) {
    g_slots[mode].dir = dir;
    g_slots[mode].name = name;
    g_slots[mode].orig = malloc(n + 1);
    memcpy(g_slots[mode].orig, data, n);
    g_slots[mode].orig_n = n;
    fz_write(fz_join(dir, name), data, n);
}

static void build_folders(void) {
    snprintf(g_clip, sizeof g_clip, "%s", fz_join(fz_tmp(), "clip"));
    snprintf(g_t5json, sizeof g_t5json, "%s", fz_join(fz_tmp(), "t5json"));
    snprintf(g_t5spm, sizeof g_t5spm, "%s", fz_join(fz_tmp(), "t5spm"));
    fz_mkdir(g_clip);
    fz_mkdir(g_t5json);
    fz_mkdir(g_t5spm);
    char *vocab = clip_vocab_json(), *merges = clip_merges_txt(), *t5 = t5_tokenizer_json();
    snprintf(k_clip_config, sizeof k_clip_config, k_clip_config_fmt, g_clip_bos_id, g_clip_bos_id + 1);
    set_slot(0, g_clip, "vocab.json", vocab, strlen(vocab));
    set_slot(1, g_clip, "merges.txt", merges, strlen(merges));
    set_slot(2, g_clip, "tokenizer_config.json", k_clip_config, strlen(k_clip_config));
    set_slot(3, g_clip, "special_tokens_map.json", k_clip_special, strlen(k_clip_special));
    set_slot(4, g_t5json, "tokenizer.json", t5, strlen(t5));
    set_slot(5, g_t5json, "tokenizer_config.json", k_t5_config, strlen(k_t5_config));
    pb m = spiece_model(NULL, 0);
    set_slot(6, g_t5spm, "spiece.model", m.p, m.n);
    free(m.p);
    fz_write_str(fz_join(g_t5spm, "tokenizer_config.json"), k_t5_config);
    g_slots[7] = g_slots[6]; /* mode 7 replaces spiece.model too */
    free(vocab);
    free(merges);
    free(t5);
}

static void write_seeds(const char *dir) {
    build_folders();
    for (int m = 0; m < 7; m++) fz_seed(dir, m, g_slots[m].orig, g_slots[m].orig_n);
    fz_seed_file(dir, 2, "tokenizers/clip_l/tokenizer_config.json", 1 << 16);
    fz_seed_file(dir, 2, "tokenizers/clip_g/tokenizer_config.json", 1 << 16);
    fz_seed_file(dir, 3, "tokenizers/clip_l/special_tokens_map.json", 1 << 16);
    fz_seed_file(dir, 5, "tokenizers/t5/tokenizer_config.json", 1 << 16);
    fz_seed_file(dir, 5, "pipelines/sd35m_tiny/tokenizer_3/tokenizer_config.json", 1 << 16);
    size_t n = 0;
    uint8_t *cm = real_charsmap(&n);
    if (cm) fz_seed(dir, 7, cm, n);
    free(cm);
    static const char small_json[] = "{\"model\": {\"type\": \"Unigram\", \"unk_id\": 0, \"vocab\": [[\"<unk>\", 0], [\"a\", -1]]}}";
    fz_seed(dir, 4, small_json, strlen(small_json));
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fz_maybe_write_seeds(write_seeds);
    build_folders();
    return 0;
}

static const char *const k_prompts[] = {
    "a photo of a red fox",
    "Hello,   World!  caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC <|endoftext|> </s> <extra_id_0>x  ",
    "",
    "\xFF\xFE a \xC3 \xE2\x96",
    "the the the the the the the the the the the the the the the the the the the the the the the the",
};

static void encode_all(cdf_tokenizer *tok) {
    int64_t vocab = cdf_tokenizer_vocab_size(tok);
    FZ_CHECK(vocab > 0);
    int64_t ids[80], ids2[80], mask[80];
    for (size_t p = 0; p < sizeof k_prompts / sizeof *k_prompts; p++) {
        const char *text = k_prompts[p];
        static const struct {
            int max;
            bool pad;
        } modes[] = {{77, true}, {0, false}, {3, true}, {2, false}};
        for (size_t m = 0; m < sizeof modes / sizeof *modes; m++) {
            int max = modes[m].max;
            int eff = max > 0 ? max : cdf_tokenizer_model_max_length(tok);
            if (eff <= 0 || eff > 77) continue; /* our buffers hold 80 ids */
            int n = -1, nu = -1, n2 = -1;
            cdf_clear_error();
            cdf_status st = cdf_tokenizer_encode(tok, text, strlen(text), max, modes[m].pad, ids, mask, &n, &nu);
            if (st != CDF_OK) {
                FZ_CHECK_MESSAGE();
                continue;
            }
            FZ_CHECK(n >= 0 && n <= eff);
            if (modes[m].pad) FZ_CHECK(n == eff);
            for (int i = 0; i < n; i++) FZ_CHECK(ids[i] >= 0 && ids[i] < vocab && (mask[i] == 0 || mask[i] == 1));
            FZ_CHECK(cdf_tokenizer_encode(tok, text, strlen(text), max, modes[m].pad, ids2, NULL, &n2, NULL) == CDF_OK);
            FZ_CHECK(n2 == n && memcmp(ids, ids2, (size_t)n * sizeof *ids) == 0);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int mode = data[0] % MODES;
    const uint8_t *body = data + 1;
    size_t n = size - 1;
    const file_slot *s = &g_slots[mode];
    const char *path = fz_join(s->dir, s->name);
    if (mode == 7) {
        pb m = spiece_model(body, n);
        fz_write(path, m.p, m.n);
        free(m.p);
    } else {
        fz_write(path, body, n);
    }
    cdf_clear_error();
    cdf_tokenizer *tok = cdf_tokenizer_load(s->dir);
    if (fz_verbose()) fprintf(stderr, "mode %d: %s\n", mode, tok ? "loaded" : "load failed");
    if (!tok) {
        FZ_CHECK_MESSAGE();
    } else {
        encode_all(tok);
        cdf_tokenizer_free(tok);
    }
    fz_write(path, s->orig, s->orig_n);
    return 0;
}
