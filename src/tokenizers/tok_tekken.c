/* Byte-level BPE from a Hugging Face tokenizer.json, as the `tokenizers` library runs it. This is
 * the form in which transformers ships Mistral's "tekken" vocabularies (its MistralConverter):
 * FLUX.2's text tokenizer (Mistral-Small-3.1, 131072 ids, ~270k merges).
 *
 *   added tokens:  split out first (tokenizer.c), matched on the raw text;
 *   normaliser:    none (a file asking for one is rejected);
 *   pre-tokeniser: Split(regex, behavior "Isolated"): every match and every gap between matches
 *                  is a piece; then ByteLevel: each UTF-8 byte of a piece becomes one symbol of
 *                  GPT-2's byte -> unicode alphabet (use_regex true would first split with the
 *                  GPT-2 pattern; add_prefix_space is not supported);
 *   model:         BPE. With ignore_merges a piece that is itself a vocabulary entry is emitted
 *                  as that id without merging; otherwise merges are applied lowest rank first,
 *                  leftmost among equal ranks (tokenizers' Word::merge_all), no "</w>" suffix.
 * No special tokens are added around the text: the FLUX.2 pipeline tokenizes a chat-rendered text
 * that already begins with "<s>", and transformers then passes add_special_tokens=False (the
 * file's post_processor is therefore not applied).
 *
 * Regex dialect: tokenizers compiles the pattern with Oniguruma, we with PCRE2 (UTF + UCP). The
 * two agree on the constructs these patterns use except `\s`: PCRE2's also matches U+180E, which
 * is not Unicode White_Space (Oniguruma's \s is exactly White_Space). `\s` / `\S` are therefore
 * rewritten into explicit White_Space classes before compiling. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizers/tok_internal.h"

/* The pre-tokeniser pattern of ByteLevel(use_regex = true) (GPT-2's). */
static const char GPT2_PATTERN[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* Unicode White_Space as the body of a character class (what Oniguruma's \s matches). */
static const char WHITE_SPACE_CLASS[] =
    "\\t-\\r\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}";

#define MAX_PATTERN_BYTES 4096

typedef struct tk_sym {
    int32_t id, prev, next, len; /* len 0: merged into its left neighbour */
} tk_sym;

typedef struct tk_cand {
    int32_t rank, pos, new_id;
} tk_cand;

typedef struct tok_tekken {
    tok_merge_map merges;
    int32_t byte_id[256];   /* id of each byte's symbol, -1 when the vocabulary lacks it */
    uint32_t byte_cp[256];  /* GPT-2 byte -> code point */
    bool ignore_merges, fuse_unk;
    int32_t unk_id;         /* -1: no unk token (unknown symbols are dropped, as tokenizers does) */
    pcre2_code *split_re;   /* the Split pre-tokeniser, NULL if absent */
    pcre2_code *bytelevel_re; /* ByteLevel(use_regex = true), NULL otherwise */
    pcre2_match_data *md;
    /* scratch (used under the tokenizer's lock) */
    tok_buf mapped;         /* byte-level form of one piece */
    tk_sym *syms;
    tk_cand *heap;
    size_t syms_cap;
} tok_tekken;

/* merges: tok_merge_map (tok_util.c), shared with the other BPE tokenizer */


/* ------------------------------------------------------------------ BPE of one piece */

static bool cand_less(tk_cand a, tk_cand b) { return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos); }

static void heap_push(tk_cand *h, size_t *n, tk_cand c) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(c, h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = c;
}

static tk_cand heap_pop(tk_cand *h, size_t *n) {
    tk_cand top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && cand_less(h[c + 1], h[c])) c++;
        if (!cand_less(h[c], last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

static void push_pair(tok_tekken *b, size_t *hn, int32_t pos) {
    int32_t next = b->syms[pos].next;
    if (next < 0) return;
    const tok_merge *m = tok_merge_find(&b->merges, b->syms[pos].id, b->syms[next].id);
    if (m) heap_push(b->heap, hn, (tk_cand){m->rank, pos, m->new_id});
}

static cdf_status oom(const char *what) { return cdf_error(CDF_ERR_OUT_OF_MEMORY, "BPE tokenizer: out of memory (%s)", what); }

/* One pre-token: raw UTF-8 bytes w[0..m). */
static cdf_status bpe_piece(tok_tekken *b, const tok_vocab *vocab, const unsigned char *w, size_t m, tok_ids *out) {
    if (m == 0) return CDF_OK;
    if (b->ignore_merges) {
        /* the piece in the byte-level alphabet, looked up as a whole */
        b->mapped.n = 0;
        for (size_t i = 0; i < m; i++)
            if (!tok_buf_push_cp(&b->mapped, b->byte_cp[w[i]])) return oom("piece");
        int32_t id = tok_vocab_find(vocab, b->mapped.p, b->mapped.n);
        if (id >= 0) return tok_ids_push(out, id) ? CDF_OK : oom("ids");
    }
    if (m > b->syms_cap) {
        size_t cap = m < 64 ? 64 : m;
        tk_sym *s = realloc(b->syms, cap * sizeof *s);
        if (s) b->syms = s;
        tk_cand *h = s ? realloc(b->heap, 3 * cap * sizeof *h) : NULL;
        if (h) b->heap = h;
        if (!s || !h) return oom("word scratch");
        b->syms_cap = cap;
    }
    /* one symbol per byte; a byte without a vocabulary entry becomes unk (consecutive ones fused
     * into one when fuse_unk) or, without an unk token, is dropped */
    int32_t n = 0;
    for (size_t i = 0; i < m; i++) {
        int32_t id = b->byte_id[w[i]];
        if (id < 0) {
            if (b->unk_id < 0) continue;
            if (b->fuse_unk && n > 0 && b->syms[n - 1].id == b->unk_id) {
                b->syms[n - 1].len++;
                continue;
            }
            id = b->unk_id;
        }
        b->syms[n] = (tk_sym){id, n - 1, n + 1, 1};
        n++;
    }
    if (n == 0) return CDF_OK;
    b->syms[n - 1].next = -1;
    size_t hn = 0;
    for (int32_t i = 0; i + 1 < n; i++) push_pair(b, &hn, i);
    /* every merge removes one symbol and pushes at most two pairs: the heap stays below 3n */
    while (hn) {
        tk_cand top = heap_pop(b->heap, &hn);
        tk_sym *s = &b->syms[top.pos];
        if (s->len == 0 || s->next < 0) continue;
        int32_t right = s->next;
        const tok_merge *cur = tok_merge_find(&b->merges, s->id, b->syms[right].id);
        if (!cur || cur->new_id != top.new_id) continue; /* stale entry: its pair changed */
        s->id = top.new_id;
        s->len += b->syms[right].len;
        s->next = b->syms[right].next;
        b->syms[right].len = 0;
        if (s->next >= 0) b->syms[s->next].prev = top.pos;
        if (s->prev >= 0) push_pair(b, &hn, s->prev);
        push_pair(b, &hn, top.pos);
    }
    for (int32_t i = 0; i >= 0; i = b->syms[i].next)
        if (!tok_ids_push(out, b->syms[i].id)) return oom("ids");
    return CDF_OK;
}

/* ------------------------------------------------------------------ pre-tokenisation */

static cdf_status match_error(int rc) {
    PCRE2_UCHAR msg[128];
    pcre2_get_error_message(rc, msg, sizeof msg);
    return cdf_error(rc == PCRE2_ERROR_NOMEMORY ? CDF_ERR_OUT_OF_MEMORY : CDF_ERR_INTERNAL,
                     "BPE tokenizer: pre-tokeniser regex match failed: %s", (const char *)msg);
}

/* Split s[0..n) with `re`, behavior Isolated (as tokenizers' Split and ByteLevel(use_regex) do):
 * every match and every gap between matches is a piece, in order. Level 0 is the Split
 * pre-tokeniser, level 1 ByteLevel's own GPT-2 split; the pieces of the last level go to BPE. */
static cdf_status split_level(cdf_tokenizer *tok, int level, const char *s, size_t n, tok_ids *out) {
    tok_tekken *b = tok->model;
    pcre2_code *re = level == 0 ? b->split_re : level == 1 ? b->bytelevel_re : NULL;
    if (!re) {
        if (level < 1) return split_level(tok, level + 1, s, n, out);
        return bpe_piece(b, &tok->vocab, (const unsigned char *)s, n, out);
    }
    size_t pos = 0, gap = 0;
    while (pos < n) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, b->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) return match_error(rc);
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(b->md);
        size_t a = ov[0], e = ov[1];
        if (e <= a) { /* an empty match splits nothing; move one character on */
            pos = a + 1;
            while (pos < n && ((unsigned char)s[pos] & 0xC0) == 0x80) pos++;
            continue;
        }
        if (a > gap) CDF_TRY(split_level(tok, level + 1, s + gap, a - gap, out));
        CDF_TRY(split_level(tok, level + 1, s + a, e - a, out));
        pos = gap = e;
    }
    if (gap < n) CDF_TRY(split_level(tok, level + 1, s + gap, n - gap, out));
    return CDF_OK;
}

static cdf_status tekken_encode(cdf_tokenizer *tok, const char *s, size_t n, bool at_start, tok_ids *out) {
    (void)at_start;
    return split_level(tok, 0, s, n, out);
}

static cdf_status tekken_normalize(cdf_tokenizer *tok, const char *s, size_t n, tok_buf *out) {
    (void)tok;
    return tok_buf_append(out, s, n) ? CDF_OK : oom("text");
}

static void tekken_free(void *model) {
    tok_tekken *b = model;
    if (!b) return;
    tok_merge_map_free(&b->merges);
    pcre2_match_data_free(b->md);
    pcre2_code_free(b->split_re);
    pcre2_code_free(b->bytelevel_re);
    tok_buf_free(&b->mapped);
    free(b->syms);
    free(b->heap);
    free(b);
}

static const tok_model_ops TEKKEN_OPS = {tekken_normalize, tekken_encode, tekken_free};

/* ------------------------------------------------------------------ regex */

/* Rewrite \s and \S into explicit White_Space classes (see the file comment). Other escapes, \p{..}
 * included, are copied unchanged. \S inside a class cannot be written without set operations and
 * \Q..\E would hide escapes: both are rejected. */
static cdf_status rewrite_pattern(const char *p, size_t n, tok_buf *out, const char *path) {
    bool in_class = false;
    for (size_t i = 0; i < n;) {
        char c = p[i];
        if (c == '\\' && i + 1 < n) {
            char d = p[i + 1];
            bool ok = true;
            if (d == 's') {
                ok = (in_class || tok_buf_append(out, "[", 1)) && tok_buf_append(out, WHITE_SPACE_CLASS, strlen(WHITE_SPACE_CLASS)) &&
                     (in_class || tok_buf_append(out, "]", 1));
            } else if (d == 'S') {
                if (in_class)
                    return cdf_error(CDF_ERR_UNSUPPORTED, "%s: pre-tokeniser regex uses \\S inside a character class", path);
                ok = tok_buf_append(out, "[^", 2) && tok_buf_append(out, WHITE_SPACE_CLASS, strlen(WHITE_SPACE_CLASS)) &&
                     tok_buf_append(out, "]", 1);
            } else if (d == 'Q') {
                return cdf_error(CDF_ERR_UNSUPPORTED, "%s: pre-tokeniser regex uses \\Q...\\E quoting", path);
            } else {
                ok = tok_buf_append(out, p + i, 2);
            }
            if (!ok) return oom("regex");
            i += 2;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            size_t k = i + 1;
            if (k < n && p[k] == '^') k++;
            if (k < n && p[k] == ']') k++; /* a leading ']' is a literal */
            if (!tok_buf_append(out, p + i, k - i)) return oom("regex");
            i = k;
            continue;
        }
        if (in_class && c == '[' && i + 1 < n && p[i + 1] == ':') { /* POSIX class [:name:] */
            const char *end = strstr(p + i + 2, ":]");
            size_t k = end && (size_t)(end - p) < n ? (size_t)(end - p) + 2 : n;
            if (!tok_buf_append(out, p + i, k - i)) return oom("regex");
            i = k;
            continue;
        }
        if (in_class && c == ']') in_class = false;
        if (!tok_buf_append(out, &c, 1)) return oom("regex");
        i++;
    }
    return CDF_OK;
}

static cdf_status compile(const char *pattern, size_t n, bool literal, pcre2_code **re, const char *path) {
    tok_buf rewritten = {0};
    if (!literal) {
        CDF_TRY(rewrite_pattern(pattern, n, &rewritten, path));
        pattern = rewritten.p ? rewritten.p : "";
        n = rewritten.n;
    }
    int err;
    PCRE2_SIZE err_off;
    *re = pcre2_compile((PCRE2_SPTR)pattern, n, PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0), &err, &err_off, NULL);
    tok_buf_free(&rewritten);
    if (!*re) {
        PCRE2_UCHAR msg[128];
        pcre2_get_error_message(err, msg, sizeof msg);
        return cdf_error(CDF_ERR_UNSUPPORTED, "%s: cannot compile the pre-tokeniser regex: %s (at offset %zu)", path,
                         (const char *)msg, (size_t)err_off);
    }
    (void)pcre2_jit_compile(*re, PCRE2_JIT_COMPLETE); /* optional speed-up; interpreted otherwise */
    return CDF_OK;
}

/* ------------------------------------------------------------------ loading */

static const char *json_type(const cJSON *o) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

static bool json_true(const cJSON *o, const char *key) { return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, key)); }

/* A key that must be absent, null or false (or a given string) for this implementation. */
static bool json_unset(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return !v || cJSON_IsNull(v) || cJSON_IsFalse(v) || (cJSON_IsString(v) && !v->valuestring[0]);
}

static cdf_status parse_split(tok_tekken *b, const cJSON *p, const char *path) {
    if (b->split_re) return cdf_error(CDF_ERR_UNSUPPORTED, "%s: more than one Split pre-tokeniser", path);
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
    const cJSON *regex = cJSON_GetObjectItemCaseSensitive(pat, "Regex"), *str = cJSON_GetObjectItemCaseSensitive(pat, "String");
    const cJSON *use = cJSON_IsString(regex) ? regex : str;
    if (!cJSON_IsString(use) || !use->valuestring[0])
        return cdf_error(CDF_ERR_FORMAT, "%s: Split pre-tokeniser needs a pattern {\"Regex\": ...} or {\"String\": ...}", path);
    size_t n = strlen(use->valuestring);
    if (n > MAX_PATTERN_BYTES)
        return cdf_error(CDF_ERR_LIMIT, "%s: Split pattern of %zu bytes exceeds the limit %d", path, n, MAX_PATTERN_BYTES);
    const cJSON *behavior = cJSON_GetObjectItemCaseSensitive(p, "behavior");
    if (!cJSON_IsString(behavior) || strcmp(behavior->valuestring, "Isolated") != 0)
        return cdf_error(CDF_ERR_UNSUPPORTED, "%s: Split behavior \"%.32s\" is not supported (Isolated)", path,
                         cJSON_IsString(behavior) ? behavior->valuestring : "?");
    if (json_true(p, "invert")) return cdf_error(CDF_ERR_UNSUPPORTED, "%s: Split with invert = true is not supported", path);
    return compile(use->valuestring, n, use == str, &b->split_re, path);
}

static cdf_status parse_bytelevel(tok_tekken *b, const cJSON *p, const char *path, bool *seen) {
    if (*seen) return cdf_error(CDF_ERR_UNSUPPORTED, "%s: more than one ByteLevel pre-tokeniser", path);
    *seen = true;
    if (json_true(p, "add_prefix_space"))
        return cdf_error(CDF_ERR_UNSUPPORTED, "%s: ByteLevel add_prefix_space = true is not supported", path);
    /* tokenizers' default for use_regex is true */
    const cJSON *ur = cJSON_GetObjectItemCaseSensitive(p, "use_regex");
    if (!cJSON_IsFalse(ur)) return compile(GPT2_PATTERN, strlen(GPT2_PATTERN), false, &b->bytelevel_re, path);
    return CDF_OK;
}

static cdf_status parse_pre_tokenizer(tok_tekken *b, const cJSON *p, const char *path) {
    const char *type = json_type(p);
    if (!type) return cdf_error(CDF_ERR_UNSUPPORTED, "%s: a BPE tokenizer without a ByteLevel pre-tokeniser is not supported", path);
    const cJSON *list = NULL, *one = p;
    if (strcmp(type, "Sequence") == 0) {
        list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
        if (!cJSON_IsArray(list)) return cdf_error(CDF_ERR_FORMAT, "%s: Sequence pre-tokeniser without a \"pretokenizers\" list", path);
        one = list->child;
    }
    bool seen_bytelevel = false;
    for (; one; one = list ? one->next : NULL) {
        const char *t = json_type(one);
        if (seen_bytelevel)
            return cdf_error(CDF_ERR_UNSUPPORTED, "%s: pre-tokeniser \"%.32s\" after ByteLevel is not supported", path, t ? t : "?");
        if (t && strcmp(t, "Split") == 0) CDF_TRY(parse_split(b, one, path));
        else if (t && strcmp(t, "ByteLevel") == 0) CDF_TRY(parse_bytelevel(b, one, path, &seen_bytelevel));
        else
            return cdf_error(CDF_ERR_UNSUPPORTED, "%s: pre-tokeniser \"%.32s\" is not supported (Split, ByteLevel)", path,
                             t ? t : "?");
        if (!list) break;
    }
    if (!seen_bytelevel)
        return cdf_error(CDF_ERR_UNSUPPORTED, "%s: a BPE tokenizer without a ByteLevel pre-tokeniser is not supported", path);
    return CDF_OK;
}

static cdf_status parse_vocab(cdf_tokenizer *tok, const cJSON *vocab, const char *path) {
    if (!cJSON_IsObject(vocab)) return cdf_error(CDF_ERR_FORMAT, "%s: model.vocab must be an object mapping tokens to ids", path);
    int32_t max_id = -1, count = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        double v = e->valuedouble;
        if (!cJSON_IsNumber(e) || !(v >= 0 && v < TOK_MAX_IDS) || v != floor(v))
            return cdf_error(CDF_ERR_FORMAT, "%s: the id of token \"%.64s\" is not an integer in [0, %d)", path,
                             e->string ? e->string : "", TOK_MAX_IDS);
        if ((int32_t)v > max_id) max_id = (int32_t)v;
        count++;
    }
    if (max_id < 0) return cdf_error(CDF_ERR_FORMAT, "%s: model.vocab is empty", path);
    /* ids are dense in real vocabularies; a tiny file must not make us allocate 2^24 slots */
    if ((int64_t)max_id > 2 * (int64_t)count + 1024)
        return cdf_error(CDF_ERR_FORMAT, "%s: largest id %d is far beyond the %d tokens (ids must be dense)", path,
                         (int)max_id, (int)count);
    if (!tok_vocab_init(&tok->vocab, max_id + 1)) return oom("vocabulary");
    cJSON_ArrayForEach(e, vocab) {
        int32_t id = (int32_t)e->valuedouble;
        const char *s = e->string ? e->string : "";
        if (tok->vocab.off[id] != UINT32_MAX)
            return cdf_error(CDF_ERR_FORMAT, "%s: id %d is given to both \"%.64s\" and \"%.64s\"", path, (int)id,
                             tok_vocab_piece(&tok->vocab, id), s);
        if (!tok_vocab_set(&tok->vocab, id, s, strlen(s))) return oom("vocabulary");
    }
    return tok_vocab_build_index(&tok->vocab) ? CDF_OK : oom("vocabulary index");
}

/* One merge: ["left", "right"] (tokenizers >= 0.20) or "left right" (older files). */
static cdf_status merge_parts(const cJSON *e, int rank, const char **l, size_t *ln, const char **r, size_t *rn, const char *path) {
    if (cJSON_IsArray(e)) {
        const cJSON *a = cJSON_GetArrayItem(e, 0), *c = cJSON_GetArrayItem(e, 1);
        if (cJSON_GetArraySize(e) != 2 || !cJSON_IsString(a) || !cJSON_IsString(c))
            return cdf_error(CDF_ERR_FORMAT, "%s: model.merges[%d] must be a pair of strings", path, rank);
        *l = a->valuestring;
        *ln = strlen(a->valuestring);
        *r = c->valuestring;
        *rn = strlen(c->valuestring);
        return CDF_OK;
    }
    if (cJSON_IsString(e)) {
        const char *s = e->valuestring, *sp = strchr(s, ' ');
        if (!sp || strchr(sp + 1, ' '))
            return cdf_error(CDF_ERR_FORMAT, "%s: model.merges[%d] \"%.64s\" is not two tokens separated by one space", path, rank, s);
        *l = s;
        *ln = (size_t)(sp - s);
        *r = sp + 1;
        *rn = strlen(sp + 1);
        return CDF_OK;
    }
    return cdf_error(CDF_ERR_FORMAT, "%s: model.merges[%d] must be a string or a pair of strings", path, rank);
}

static cdf_status parse_merges(tok_tekken *b, const tok_vocab *v, const cJSON *merges, const char *path) {
    int n = cJSON_IsArray(merges) ? cJSON_GetArraySize(merges) : -1;
    if (n < 0) return cdf_error(CDF_ERR_FORMAT, "%s: model.merges must be a list", path);
    if (n > TOK_MAX_IDS * 2) return cdf_error(CDF_ERR_LIMIT, "%s: %d merges exceed the limit %d", path, n, TOK_MAX_IDS * 2);
    if (!tok_merge_map_init(&b->merges, (size_t)n)) return oom("merge table");
    tok_buf joined = {0};
    cdf_status st = CDF_OK;
    int rank = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, merges) {
        const char *l, *r;
        size_t ln, rn;
        if ((st = merge_parts(e, rank, &l, &ln, &r, &rn, path)) != CDF_OK) break;
        joined.n = 0;
        if (!tok_buf_append(&joined, l, ln) || !tok_buf_append(&joined, r, rn)) {
            st = oom("merges");
            break;
        }
        int32_t left = tok_vocab_find(v, l, ln), right = tok_vocab_find(v, r, rn), merged = tok_vocab_find(v, joined.p, joined.n);
        if (left < 0 || right < 0 || merged < 0) {
            const char *what = left < 0 ? l : right < 0 ? r : joined.p;
            size_t wn = left < 0 ? ln : right < 0 ? rn : joined.n;
            st = cdf_error(CDF_ERR_FORMAT, "%s: model.merges[%d]: token \"%.*s\" is not in model.vocab", path, rank,
                           (int)(wn > 64 ? 64 : wn), what);
            break;
        }
        tok_merge_put(&b->merges, left, right, rank++, merged);
    }
    tok_buf_free(&joined);
    return st;
}

/* (there is no normaliser, so an added token's "normalized" changes nothing but the matching order) */
static cdf_status parse_added_tokens(cdf_tokenizer *tok, const cJSON *list, const char *path) {
    if (cJSON_IsArray(list) && cJSON_GetArraySize(list) > TOK_MAX_ADDED)
        return cdf_error(CDF_ERR_LIMIT, "%s: %d added tokens exceed the limit %d", path, cJSON_GetArraySize(list), TOK_MAX_ADDED);
    return tok_add_tokens_json(tok, list, path);
}

/* GPT-2's reversible byte -> code point table: printable Latin-1 bytes map to themselves, the
 * others to 256, 257, ... in byte order. */
static void bytes_to_unicode(uint32_t table[256]) {
    uint32_t extra = 0;
    for (uint32_t b = 0; b < 256; b++) {
        bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        table[b] = printable ? b : 256 + extra++;
    }
}

cdf_status tok_bpe_load_json(cdf_tokenizer *tok, const char *path, const cJSON *root, const tok_config *cfg) {
    (void)cfg;
    tok->type = CDF_TOKENIZER_BPE;
    tok_tekken *b = calloc(1, sizeof *b);
    if (!b) return oom("model");
    tok->ops = &TEKKEN_OPS;
    tok->model = b;
    b->unk_id = -1;

    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const char *type = json_type(model);
    if (!type || strcmp(type, "BPE") != 0)
        return cdf_error(CDF_ERR_FORMAT, "%s: model type \"%.32s\" is not BPE", path, type ? type : "?");
    static const char *const unsupported[] = {"dropout", "continuing_subword_prefix", "end_of_word_suffix", "byte_fallback"};
    for (size_t k = 0; k < sizeof unsupported / sizeof *unsupported; k++)
        if (!json_unset(model, unsupported[k]))
            return cdf_error(CDF_ERR_UNSUPPORTED, "%s: BPE option model.%s is set, which is not supported", path, unsupported[k]);
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    if (norm && !cJSON_IsNull(norm))
        return cdf_error(CDF_ERR_UNSUPPORTED, "%s: a BPE tokenizer with normalizer \"%.32s\" is not supported (none)", path,
                         json_type(norm) ? json_type(norm) : "?");
    b->ignore_merges = json_true(model, "ignore_merges");
    b->fuse_unk = json_true(model, "fuse_unk");

    CDF_TRY(parse_vocab(tok, cJSON_GetObjectItemCaseSensitive(model, "vocab"), path));
    CDF_TRY(parse_merges(b, &tok->vocab, cJSON_GetObjectItemCaseSensitive(model, "merges"), path));
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    if (cJSON_IsString(unk)) {
        b->unk_id = tok_vocab_find(&tok->vocab, unk->valuestring, strlen(unk->valuestring));
        if (b->unk_id < 0)
            return cdf_error(CDF_ERR_FORMAT, "%s: model.unk_token \"%.64s\" is not in model.vocab", path, unk->valuestring);
    }
    bytes_to_unicode(b->byte_cp);
    for (int i = 0; i < 256; i++) {
        tok_buf sym = {0};
        bool ok = tok_buf_push_cp(&sym, b->byte_cp[i]);
        b->byte_id[i] = ok ? tok_vocab_find(&tok->vocab, sym.p, sym.n) : -1;
        tok_buf_free(&sym);
        if (!ok) return oom("byte symbols");
    }
    CDF_TRY(parse_pre_tokenizer(b, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), path));
    b->md = pcre2_match_data_create(1, NULL);
    if (!b->md) return oom("regex match data");
    return parse_added_tokens(tok, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"), path);
}
