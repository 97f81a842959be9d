/* CLIP byte-level BPE (vocab.json + merges.txt), as transformers' CLIPTokenizerFast runs it:
 *   normaliser:    NFC -> every run of White_Space -> " " -> lowercase code point by code point
 *                  (Rust char::to_lowercase: full mapping, no final-sigma rule);
 *   pre-tokeniser: the CLIP regex (matches kept, the rest dropped), then GPT-2's byte -> unicode
 *                  alphabet (one symbol per UTF-8 byte);
 *   model:         BPE with "</w>" appended to the last symbol of each piece, merging the pair of
 *                  lowest rank first (leftmost among equal ranks), exactly like tokenizers' Word.
 * Merges come from merges.txt as tokenizers reads it: lines starting with "#version" skipped, each
 * other line "left right", rank = order in the file. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenizers/tok_internal.h"

/* The pre-tokeniser pattern of transformers' CLIPConverter (contractions are matched after
 * lowercasing, so only the lower-case forms are needed). */
static const char CLIP_PATTERN[] =
    "<\\|startoftext\\|>|<\\|endoftext\\|>|'s|'t|'re|'ve|'m|'ll|'d|[\\p{L}]+|[\\p{N}]|[^\\s\\p{L}\\p{N}]+";

typedef struct bpe_sym {
    int32_t id, prev, next, len; /* len 0: merged into its left neighbour */
} bpe_sym;

typedef struct bpe_cand {
    int32_t rank, pos, new_id;
} bpe_cand;

typedef struct cache_entry {
    uint64_t hash;
    uint32_t key_off, key_len, ids_off, ids_n;
} cache_entry;

#define CACHE_MAX_ENTRIES (1u << 15)
#define CACHE_MAX_WORD 256 /* longer words are not cached */

typedef struct tok_bpe {
    tok_merge_map merges;
    int32_t byte_id[256], byte_eow_id[256]; /* symbol ids of each byte, without / with "</w>" */
    pcre2_code *re;
    pcre2_match_data *md;
    /* word cache: raw piece bytes -> ids */
    int32_t *cache_slots; /* CACHE_MAX_ENTRIES * 2 slots, index into cache_entries or -1 */
    cache_entry *cache_entries;
    uint32_t cache_n;
    tok_buf cache_keys;
    tok_ids cache_ids;
    /* scratch */
    bpe_sym *syms;
    bpe_cand *heap;
    size_t syms_cap, heap_cap;
} tok_bpe;

/* merges: tok_merge_map (tok_util.c), shared with the other BPE tokenizer */


/* ------------------------------------------------------------------ normaliser */

static cdf_status clip_normalize(cdf_tokenizer *tok, const char *s, size_t n, tok_buf *out) {
    (void)tok;
    if (n == 0) return CDF_OK;
    utf8proc_uint8_t *nfc = NULL;
    utf8proc_ssize_t m = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &nfc,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (m < 0) {
        free(nfc);
        return cdf_error(m == UTF8PROC_ERROR_NOMEM ? CDF_ERR_OUT_OF_MEMORY : CDF_ERR_INTERNAL,
                         "CLIP tokenizer: NFC normalisation failed: %s", utf8proc_errmsg(m));
    }
    const char *t = (const char *)nfc;
    size_t tn = (size_t)m;
    bool in_space = false, ok = tok_buf_reserve(out, tn);
    for (size_t i = 0; ok && i < tn;) {
        uint32_t cp;
        i += tok_utf8_decode(t, tn, i, &cp);
        if (tok_is_white_space(cp)) {
            if (!in_space) ok = tok_buf_append(out, " ", 1);
            in_space = true;
            continue;
        }
        in_space = false;
        if (cp == 0x130) /* the one unconditional multi-char lowercase mapping: İ -> i + U+0307 */
            ok = tok_buf_append(out, "i\xCC\x87", 3);
        else
            ok = tok_buf_push_cp(out, (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp));
    }
    free(nfc);
    return ok ? CDF_OK : cdf_error(CDF_ERR_OUT_OF_MEMORY, "CLIP tokenizer: out of memory normalising text");
}

/* ------------------------------------------------------------------ BPE */

static void heap_push(bpe_cand *h, size_t *n, bpe_cand c) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p].rank < c.rank || (h[p].rank == c.rank && h[p].pos <= c.pos)) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = c;
}

static bpe_cand heap_pop(bpe_cand *h, size_t *n) {
    bpe_cand top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && (h[c + 1].rank < h[c].rank || (h[c + 1].rank == h[c].rank && h[c + 1].pos < h[c].pos))) c++;
        if (last.rank < h[c].rank || (last.rank == h[c].rank && last.pos <= h[c].pos)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

static void push_pair(tok_bpe *b, size_t *hn, int32_t pos) {
    int32_t next = b->syms[pos].next;
    if (next < 0) return;
    const tok_merge *m = tok_merge_find(&b->merges, b->syms[pos].id, b->syms[next].id);
    if (m) heap_push(b->heap, hn, (bpe_cand){m->rank, pos, m->new_id});
}

/* BPE of one pre-token (raw UTF-8 bytes; each byte is one byte-level symbol). */
static cdf_status bpe_word(tok_bpe *b, const unsigned char *w, size_t m, tok_ids *out) {
    if (m > b->syms_cap) {
        size_t cap = m < 64 ? 64 : m;
        bpe_sym *s = realloc(b->syms, cap * sizeof *s);
        if (s) b->syms = s;
        bpe_cand *h = s ? realloc(b->heap, 3 * cap * sizeof *h) : NULL;
        if (h) b->heap = h;
        if (!s || !h) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "CLIP tokenizer: out of memory for a %zu-byte word", m);
        b->syms_cap = cap;
        b->heap_cap = 3 * cap;
    }
    for (size_t i = 0; i < m; i++)
        b->syms[i] = (bpe_sym){i + 1 == m ? b->byte_eow_id[w[i]] : b->byte_id[w[i]], (int32_t)i - 1,
                               i + 1 == m ? -1 : (int32_t)i + 1, 1};
    size_t hn = 0;
    for (size_t i = 0; i + 1 < m; i++) push_pair(b, &hn, (int32_t)i);
    /* every merge removes a symbol and pushes at most two pairs: the heap never exceeds 3m */
    while (hn) {
        bpe_cand top = heap_pop(b->heap, &hn);
        bpe_sym *s = &b->syms[top.pos];
        if (s->len == 0 || s->next < 0) continue;
        int32_t right = s->next;
        const tok_merge *cur = tok_merge_find(&b->merges, s->id, b->syms[right].id);
        if (!cur || cur->new_id != top.new_id) continue; /* stale entry */
        s->id = top.new_id;
        s->len += b->syms[right].len;
        s->next = b->syms[right].next;
        b->syms[right].len = 0;
        if (s->next >= 0) b->syms[s->next].prev = top.pos;
        if (s->prev >= 0) push_pair(b, &hn, s->prev);
        push_pair(b, &hn, top.pos);
    }
    for (int32_t i = 0; i >= 0; i = b->syms[i].next)
        if (!tok_ids_push(out, b->syms[i].id)) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "CLIP tokenizer: out of memory");
    return CDF_OK;
}

static uint64_t hash_word(const unsigned char *w, size_t m) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < m; i++) h = (h ^ w[i]) * 1099511628211ull;
    return tok_mix64(h);
}

static void cache_clear(tok_bpe *b) {
    for (uint32_t i = 0; i < 2 * CACHE_MAX_ENTRIES; i++) b->cache_slots[i] = -1;
    b->cache_n = 0;
    b->cache_keys.n = 0;
    b->cache_ids.n = 0;
}

/* BPE through the word cache (prompts repeat words; the cache is bounded and simply cleared
 * when full). */
static cdf_status bpe_word_cached(tok_bpe *b, const unsigned char *w, size_t m, tok_ids *out) {
    if (m > CACHE_MAX_WORD) return bpe_word(b, w, m, out);
    uint64_t h = hash_word(w, m);
    const uint32_t mask = 2 * CACHE_MAX_ENTRIES - 1;
    uint32_t i = (uint32_t)h & mask;
    for (;; i = (i + 1) & mask) {
        int32_t e = b->cache_slots[i];
        if (e < 0) break;
        const cache_entry *c = &b->cache_entries[e];
        if (c->hash == h && c->key_len == m && memcmp(b->cache_keys.p + c->key_off, w, m) == 0) {
            for (uint32_t k = 0; k < c->ids_n; k++)
                if (!tok_ids_push(out, b->cache_ids.p[c->ids_off + k]))
                    return cdf_error(CDF_ERR_OUT_OF_MEMORY, "CLIP tokenizer: out of memory");
            return CDF_OK;
        }
    }
    size_t first = out->n;
    CDF_TRY(bpe_word(b, w, m, out));
    if (b->cache_n == CACHE_MAX_ENTRIES || b->cache_keys.n > ((size_t)16 << 20)) {
        cache_clear(b);
        for (i = (uint32_t)h & mask; b->cache_slots[i] >= 0; i = (i + 1) & mask) {}
    }
    uint32_t key_off = (uint32_t)b->cache_keys.n, ids_off = (uint32_t)b->cache_ids.n;
    if (!tok_buf_append(&b->cache_keys, w, m)) return CDF_OK; /* caching is optional */
    for (size_t k = first; k < out->n; k++)
        if (!tok_ids_push(&b->cache_ids, out->p[k])) {
            b->cache_keys.n = key_off;
            b->cache_ids.n = ids_off;
            return CDF_OK;
        }
    b->cache_entries[b->cache_n] = (cache_entry){h, key_off, (uint32_t)m, ids_off, (uint32_t)(out->n - first)};
    b->cache_slots[i] = (int32_t)b->cache_n++;
    return CDF_OK;
}

static cdf_status clip_encode(cdf_tokenizer *tok, const char *s, size_t n, bool at_start, tok_ids *out) {
    (void)at_start;
    tok_bpe *b = tok->model;
    size_t pos = 0;
    while (pos < n) {
        int rc = pcre2_match(b->re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, b->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[128];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return cdf_error(CDF_ERR_INTERNAL, "CLIP tokenizer: regex match failed: %s", (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(b->md);
        size_t a = ov[0], e = ov[1];
        if (e <= a) { /* the pattern cannot match empty; guard against looping anyway */
            pos = a + 1;
            while (pos < n && ((unsigned char)s[pos] & 0xC0) == 0x80) pos++;
            continue;
        }
        CDF_TRY(bpe_word_cached(b, (const unsigned char *)s + a, e - a, out));
        pos = e;
    }
    return CDF_OK;
}

static void clip_free(void *model) {
    tok_bpe *b = model;
    if (!b) return;
    tok_merge_map_free(&b->merges);
    pcre2_match_data_free(b->md);
    pcre2_code_free(b->re);
    free(b->cache_slots);
    free(b->cache_entries);
    tok_buf_free(&b->cache_keys);
    tok_ids_free(&b->cache_ids);
    free(b->syms);
    free(b->heap);
    free(b);
}

static const tok_model_ops CLIP_OPS = {clip_normalize, clip_encode, clip_free};

/* ------------------------------------------------------------------ loading */

/* GPT-2's reversible byte -> code point table: printable Latin-1 bytes map to themselves, the
 * others to 256, 257, ... in byte order. */
static void bytes_to_unicode(uint32_t table[256]) {
    uint32_t extra = 0;
    for (uint32_t b = 0; b < 256; b++) {
        bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        table[b] = printable ? b : 256 + extra++;
    }
}

static cdf_status load_vocab_json(cdf_tokenizer *tok, const char *path) {
    char *data;
    size_t n;
    CDF_TRY(tok_read_file(path, &data, &n));
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(data, n, &end, false);
    if (!root) {
        size_t at = end && end >= data && end <= data + n ? (size_t)(end - data) : 0;
        free(data);
        return cdf_error(CDF_ERR_FORMAT, "%s: invalid JSON near byte %zu", path, at);
    }
    free(data);
    cdf_status st = CDF_OK;
    if (!cJSON_IsObject(root)) {
        st = cdf_error(CDF_ERR_FORMAT, "%s: expected an object mapping tokens to ids", path);
        goto done;
    }
    int32_t max_id = -1, count = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, root) {
        count++;
        double v = e->valuedouble;
        if (!cJSON_IsNumber(e) || !(v >= 0 && v < TOK_MAX_IDS) || v != floor(v)) {
            st = cdf_error(CDF_ERR_FORMAT, "%s: the id of token \"%.64s\" is not an integer in [0, %d)", path,
                           e->string ? e->string : "", TOK_MAX_IDS);
            goto done;
        }
        if ((int32_t)v > max_id) max_id = (int32_t)v;
    }
    if (max_id < 0) {
        st = cdf_error(CDF_ERR_FORMAT, "%s: the vocabulary is empty", path);
        goto done;
    }
    /* ids are dense in real vocabularies; a tiny file must not make us allocate 2^24 slots */
    if ((int64_t)max_id > 2 * (int64_t)count + 1024) {
        st = cdf_error(CDF_ERR_FORMAT, "%s: largest id %d is far beyond the %d tokens (ids must be dense)", path,
                       (int)max_id, (int)count);
        goto done;
    }
    if (!tok_vocab_init(&tok->vocab, max_id + 1)) {
        st = cdf_error(CDF_ERR_OUT_OF_MEMORY, "%s: cannot allocate %d vocabulary entries", path, max_id + 1);
        goto done;
    }
    cJSON_ArrayForEach(e, root) {
        int32_t id = (int32_t)e->valuedouble;
        if (tok->vocab.off[id] != UINT32_MAX) {
            st = cdf_error(CDF_ERR_FORMAT, "%s: id %d is given to both \"%.64s\" and \"%.64s\"", path, (int)id,
                           tok_vocab_piece(&tok->vocab, id), e->string ? e->string : "");
            goto done;
        }
        if (!tok_vocab_set(&tok->vocab, id, e->string ? e->string : "", e->string ? strlen(e->string) : 0)) {
            st = cdf_error(CDF_ERR_OUT_OF_MEMORY, "%s: out of memory storing the vocabulary", path);
            goto done;
        }
    }
    if (!tok_vocab_build_index(&tok->vocab)) st = cdf_error(CDF_ERR_OUT_OF_MEMORY, "%s: out of memory indexing", path);
done:
    cJSON_Delete(root);
    return st;
}

static cdf_status load_merges(tok_bpe *b, const tok_vocab *v, const char *path) {
    char *data;
    size_t n;
    CDF_TRY(tok_read_file(path, &data, &n));
    size_t n_lines = 1;
    for (size_t i = 0; i < n; i++) n_lines += data[i] == '\n';
    if (n_lines > (size_t)TOK_MAX_IDS * 2) {
        free(data);
        return cdf_error(CDF_ERR_LIMIT, "%s: %zu lines exceed the limit of %d merges", path, n_lines, TOK_MAX_IDS * 2);
    }
    tok_buf joined = {0};
    cdf_status st = CDF_OK;
    if (!tok_merge_map_init(&b->merges, n_lines)) {
        st = cdf_error(CDF_ERR_OUT_OF_MEMORY, "%s: cannot allocate the merge table for %zu lines", path, n_lines);
        goto done;
    }
    int32_t rank = 0;
    size_t line_no = 0;
    for (size_t pos = 0; pos < n;) {
        size_t eol = pos;
        while (eol < n && data[eol] != '\n') eol++;
        size_t len = eol - pos;
        const char *line = data + pos;
        pos = eol + 1;
        line_no++;
        if (len && line[len - 1] == '\r') len--;
        if (len == 0 || (len >= 8 && memcmp(line, "#version", 8) == 0)) continue;
        const char *sp = memchr(line, ' ', len);
        if (!sp || sp == line || sp == line + len - 1 || memchr(sp + 1, ' ', (size_t)(line + len - sp - 1))) {
            st = cdf_error(CDF_ERR_FORMAT, "%s line %zu: expected two tokens separated by one space, got \"%.*s\"",
                           path, line_no, (int)(len > 64 ? 64 : len), line);
            goto done;
        }
        size_t ln = (size_t)(sp - line), rn = len - ln - 1;
        int32_t left = tok_vocab_find(v, line, ln), right = tok_vocab_find(v, sp + 1, rn);
        joined.n = 0;
        if (!tok_buf_append(&joined, line, ln) || !tok_buf_append(&joined, sp + 1, rn)) {
            st = cdf_error(CDF_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
            goto done;
        }
        int32_t merged = tok_vocab_find(v, joined.p, joined.n);
        if (left < 0 || right < 0 || merged < 0) {
            const char *what = left < 0 ? line : right < 0 ? sp + 1 : joined.p;
            size_t wn = left < 0 ? ln : right < 0 ? rn : joined.n;
            st = cdf_error(CDF_ERR_FORMAT, "%s line %zu: token \"%.*s\" is not in vocab.json", path, line_no,
                           (int)(wn > 64 ? 64 : wn), what);
            goto done;
        }
        tok_merge_put(&b->merges, left, right, rank++, merged);
    }
done:
    tok_buf_free(&joined);
    free(data);
    return st;
}

cdf_status tok_clip_load(cdf_tokenizer *tok, const char *folder, const tok_config *cfg) {
    char vocab_path[PATH_MAX], merges_path[PATH_MAX];
    snprintf(vocab_path, sizeof vocab_path, "%s/vocab.json", folder);
    snprintf(merges_path, sizeof merges_path, "%s/merges.txt", folder);
    tok->type = CDF_TOKENIZER_CLIP;
    tok_bpe *b = calloc(1, sizeof *b);
    if (!b) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "CLIP tokenizer: out of memory");
    tok->ops = &CLIP_OPS;
    tok->model = b;
    CDF_TRY(load_vocab_json(tok, vocab_path));
    CDF_TRY(load_merges(b, &tok->vocab, merges_path));

    /* byte symbols; a missing one becomes the unk token, as the BPE model does */
    int32_t unk = tok_vocab_find(&tok->vocab, cfg->unk ? cfg->unk : "<|endoftext|>",
                                 strlen(cfg->unk ? cfg->unk : "<|endoftext|>"));
    uint32_t table[256];
    bytes_to_unicode(table);
    for (int i = 0; i < 256; i++) {
        tok_buf sym = {0};
        bool ok = tok_buf_push_cp(&sym, table[i]);
        int32_t plain = ok ? tok_vocab_find(&tok->vocab, sym.p, sym.n) : -1;
        ok = ok && tok_buf_append(&sym, "</w>", 4);
        int32_t eow = ok ? tok_vocab_find(&tok->vocab, sym.p, sym.n) : -1;
        tok_buf_free(&sym);
        if (!ok) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "CLIP tokenizer: out of memory");
        if ((plain < 0 || eow < 0) && unk < 0)
            return cdf_error(CDF_ERR_FORMAT, "%s: no entry for the byte-level symbol of byte 0x%02x%s and no unk token",
                             vocab_path, i, plain < 0 ? "" : " + </w>");
        b->byte_id[i] = plain >= 0 ? plain : unk;
        b->byte_eow_id[i] = eow >= 0 ? eow : unk;
    }

    int err;
    PCRE2_SIZE err_off;
    b->re = pcre2_compile((PCRE2_SPTR)CLIP_PATTERN, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err, &err_off, NULL);
    if (!b->re) return cdf_error(CDF_ERR_INTERNAL, "CLIP tokenizer: cannot compile the pre-tokeniser regex (%d)", err);
    (void)pcre2_jit_compile(b->re, PCRE2_JIT_COMPLETE); /* optional speed-up; interpreted otherwise */
    b->md = pcre2_match_data_create_from_pattern(b->re, NULL);
    b->cache_slots = malloc(2 * CACHE_MAX_ENTRIES * sizeof *b->cache_slots);
    b->cache_entries = malloc(CACHE_MAX_ENTRIES * sizeof *b->cache_entries);
    if (!b->md || !b->cache_slots || !b->cache_entries)
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "CLIP tokenizer: out of memory");
    cache_clear(b);

    /* without tokenizer_config.json's added_tokens_decoder, register the CLIPTokenizer specials */
    if (cfg->n_added == 0) {
        const char *names[2] = {cfg->bos ? cfg->bos : "<|startoftext|>", cfg->eos ? cfg->eos : "<|endoftext|>"};
        for (int k = 0; k < 2; k++) {
            int32_t id = tok_vocab_find(&tok->vocab, names[k], strlen(names[k]));
            if (id >= 0) CDF_TRY(tok_add_token(tok, names[k], strlen(names[k]), id, false, true));
        }
    }
    return CDF_OK;
}
