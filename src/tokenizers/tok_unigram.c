/* T5 SentencePiece unigram tokenizer with the semantics of transformers' T5TokenizerFast
 * (tokenizers library), loaded from tokenizer.json or from spiece.model (converted the way
 * transformers' T5Converter does, so both files give the same ids):
 *   normaliser:    precompiled charsmap (nmt_nfkc) -> strip right -> " {2,}" -> "▁";
 *   pre-tokeniser: Metaspace: ' ' -> '▁', prepend '▁' (scheme "first": only to the piece at the
 *                  start of the input; "always": to every piece), split before each '▁';
 *   model:         Viterbi over piece scores per word; a character no piece covers costs
 *                  min_score - 10 as <unk>, and consecutive unknowns fuse into one <unk>. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizers/tok_internal.h"

#define UNK_PENALTY 10.0
#define MAX_REPLACEMENT 16 /* bytes of a Metaspace / Replace replacement string */

typedef enum { PREPEND_NEVER, PREPEND_FIRST, PREPEND_ALWAYS } prepend_scheme;

typedef struct vnode {
    double score;  /* best path score ending here */
    int32_t start; /* start of the last token of that path, -1 if none yet */
    int32_t id;
} vnode;

typedef struct tok_unigram {
    double *score;    /* per id */
    int32_t unk_id;   /* -1: none */
    double min_score;
    int32_t *sorted;  /* ids of the distinct non-empty pieces, sorted bytewise */
    int32_t n_sorted;
    bool has_cmap;
    tok_charsmap cmap;
    bool strip_left, strip_right;
    bool collapse; /* Replace(" {2,}", collapse_to) */
    char collapse_to[MAX_REPLACEMENT];
    size_t collapse_len;
    bool ws_split; /* WhitespaceSplit before Metaspace (older tokenizer.json files) */
    bool metaspace;
    char meta[MAX_REPLACEMENT];
    size_t meta_len;
    prepend_scheme prepend;
    bool meta_split;
    /* scratch */
    tok_buf word;
    vnode *nodes;
    size_t nodes_cap;
    tok_ids path;
} tok_unigram;

/* ------------------------------------------------------------------ normaliser */

static cdf_status t5_normalize(cdf_tokenizer *tok, const char *s, size_t n, tok_buf *out) {
    tok_unigram *u = tok->model;
    tok_buf mapped = {0};
    if (u->has_cmap) {
        cdf_status st = tok_charsmap_normalize(&u->cmap, s, n, &mapped);
        if (st != CDF_OK) { tok_buf_free(&mapped); return st; }
        s = mapped.p ? mapped.p : "";
        n = mapped.n;
    }
    size_t a = 0, b = n;
    if (u->strip_left || u->strip_right) {
        size_t first = n, last_end = 0;
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            size_t k = tok_utf8_decode(s, n, i, &cp);
            if (!tok_is_white_space(cp)) {
                if (first == n) first = i;
                last_end = i + k;
            }
            i += k;
        }
        if (first == n) a = b = 0; /* all whitespace */
        else {
            if (u->strip_left) a = first;
            if (u->strip_right) b = last_end;
        }
    }
    bool ok = tok_buf_reserve(out, b - a);
    for (size_t i = a; ok && i < b;) {
        if (u->collapse && s[i] == ' ' && i + 1 < b && s[i + 1] == ' ') {
            while (i < b && s[i] == ' ') i++;
            ok = tok_buf_append(out, u->collapse_to, u->collapse_len);
            continue;
        }
        size_t j = i + 1;
        while (j < b && !(u->collapse && s[j] == ' ' && j + 1 < b && s[j + 1] == ' ')) j++;
        ok = tok_buf_append(out, s + i, j - i);
        i = j;
    }
    tok_buf_free(&mapped);
    return ok ? CDF_OK : cdf_error(CDF_ERR_OUT_OF_MEMORY, "T5 tokenizer: out of memory normalising");
}

/* ------------------------------------------------------------------ Viterbi */

/* The fuzz build (fuzz/CMakeLists.txt defines CDF_FUZZ_BUILD; clang) traces every comparison for
 * libFuzzer. This binary search over the sorted vocabulary runs for every byte of every prompt
 * and took most of fuzz_prompt's time while its comparisons say nothing about the input, so it
 * is left uninstrumented there. Other builds are unaffected. */
#if defined(__clang__) && defined(CDF_FUZZ_BUILD)
#define TOK_NO_FUZZ_COVERAGE __attribute__((no_sanitize("coverage"), noinline))
#else
#define TOK_NO_FUZZ_COVERAGE
#endif

TOK_NO_FUZZ_COVERAGE static inline const unsigned char *piece_bytes(const cdf_tokenizer *tok, int32_t id) {
    return (const unsigned char *)tok->vocab.arena.p + tok->vocab.off[id];
}

/* Narrow sorted[lo, hi) (all sharing the first d bytes, none of length d) to the pieces whose
 * byte d equals c. */
TOK_NO_FUZZ_COVERAGE static void narrow(const cdf_tokenizer *tok, const int32_t *sorted, size_t *lo, size_t *hi, size_t d, unsigned c) {
    size_t l = *lo, h = *hi;
    while (l < h) { /* first with byte >= c */
        size_t mid = l + (h - l) / 2;
        if (piece_bytes(tok, sorted[mid])[d] < c) l = mid + 1;
        else h = mid;
    }
    size_t first = l;
    h = *hi;
    while (l < h) { /* first with byte > c */
        size_t mid = l + (h - l) / 2;
        if (piece_bytes(tok, sorted[mid])[d] <= c) l = mid + 1;
        else h = mid;
    }
    *lo = first;
    *hi = l;
}

static cdf_status viterbi(cdf_tokenizer *tok, const char *w, size_t n, tok_ids *out) {
    tok_unigram *u = tok->model;
    if (n == 0) return CDF_OK;
    if (n + 1 > u->nodes_cap) {
        vnode *p = realloc(u->nodes, (n + 1) * sizeof *p);
        if (!p) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "T5 tokenizer: out of memory for a %zu-byte word", n);
        u->nodes = p;
        u->nodes_cap = n + 1;
    }
    vnode *nodes = u->nodes;
    for (size_t i = 0; i <= n; i++) nodes[i] = (vnode){0.0, -1, -1};
    const double unk_score = u->min_score - UNK_PENALTY;
    const unsigned char *uw = (const unsigned char *)w;
    for (size_t start = 0; start < n;) {
        uint32_t cp;
        size_t mblen = tok_utf8_decode(w, n, start, &cp);
        double base = nodes[start].score;
        bool has_single = false;
        size_t lo = 0, hi = (size_t)u->n_sorted;
        for (size_t d = 0; start + d < n && lo < hi; d++) {
            if (tok->vocab.len[u->sorted[lo]] == d) lo++; /* the piece equal to the prefix so far */
            narrow(tok, u->sorted, &lo, &hi, d, uw[start + d]);
            if (lo >= hi) break;
            int32_t id = u->sorted[lo];
            if (tok->vocab.len[id] != d + 1) continue;
            size_t end = start + d + 1;
            double cand = base + u->score[id];
            if (nodes[end].start < 0 || cand > nodes[end].score) nodes[end] = (vnode){cand, (int32_t)start, id};
            if (d + 1 == mblen) has_single = true;
        }
        if (!has_single) {
            if (u->unk_id < 0)
                return cdf_error(CDF_ERR_UNSUPPORTED, "T5 tokenizer: character U+%04X has no piece and the model has no unk",
                                 (unsigned)cp);
            size_t end = start + mblen;
            double cand = base + unk_score;
            if (nodes[end].start < 0 || cand > nodes[end].score) nodes[end] = (vnode){cand, (int32_t)start, u->unk_id};
        }
        start += mblen;
    }
    /* backtrack (token end positions, last first), then emit forwards; a run of <unk> tokens
     * becomes one token whose text is looked up as a piece again, as tokenizers does */
    tok_ids *path = &u->path;
    path->n = 0;
    for (size_t end = n; end > 0; end = (size_t)nodes[end].start) {
        if (nodes[end].start < 0 || (size_t)nodes[end].start >= end)
            return cdf_error(CDF_ERR_INTERNAL, "T5 tokenizer: broken Viterbi lattice at byte %zu", end);
        if (!tok_ids_push(path, (int32_t)end)) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "T5 tokenizer: out of memory");
    }
    for (size_t t = path->n; t-- > 0;) {
        size_t end = (size_t)path->p[t], start = (size_t)nodes[end].start;
        int32_t id = nodes[end].id;
        if (id == u->unk_id) {
            while (t > 0 && nodes[path->p[t - 1]].id == u->unk_id) end = (size_t)path->p[--t];
            int32_t fused = tok_vocab_find(&tok->vocab, w + start, end - start);
            if (fused >= 0) id = fused;
        }
        if (!tok_ids_push(out, id)) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "T5 tokenizer: out of memory");
    }
    return CDF_OK;
}

/* Metaspace on one pre-token, then Viterbi per word. */
static cdf_status metaspace_encode(cdf_tokenizer *tok, const char *s, size_t n, bool at_start, tok_ids *out) {
    tok_unigram *u = tok->model;
    if (!u->metaspace) return viterbi(tok, s, n, out);
    if (n == 0) return CDF_OK;
    tok_buf *w = &u->word;
    w->n = 0;
    bool ok = true;
    /* the text after ' ' -> replacement starts with it iff s starts with ' ' or with it */
    bool starts_with_meta = s[0] == ' ' || (n >= u->meta_len && memcmp(s, u->meta, u->meta_len) == 0);
    if ((u->prepend == PREPEND_ALWAYS || (u->prepend == PREPEND_FIRST && at_start)) && !starts_with_meta)
        ok = tok_buf_append(w, u->meta, u->meta_len);
    for (size_t i = 0; ok && i < n; i++)
        ok = s[i] == ' ' ? tok_buf_append(w, u->meta, u->meta_len) : tok_buf_append(w, s + i, 1);
    if (!ok) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "T5 tokenizer: out of memory");
    if (!u->meta_split) return viterbi(tok, w->p, w->n, out);
    /* split so that each replacement char begins a new word (MergedWithNext) */
    size_t from = 0;
    for (size_t i = 1; i + u->meta_len <= w->n; i++) {
        if (memcmp(w->p + i, u->meta, u->meta_len) != 0) continue;
        CDF_TRY(viterbi(tok, w->p + from, i - from, out));
        from = i;
        i += u->meta_len - 1;
    }
    return viterbi(tok, w->p + from, w->n - from, out);
}

static cdf_status t5_encode(cdf_tokenizer *tok, const char *s, size_t n, bool at_start, tok_ids *out) {
    tok_unigram *u = tok->model;
    if (!u->ws_split) return metaspace_encode(tok, s, n, at_start, out);
    for (size_t i = 0; i < n;) { /* WhitespaceSplit: words between whitespace runs */
        uint32_t cp;
        size_t k = tok_utf8_decode(s, n, i, &cp);
        if (tok_is_white_space(cp)) { i += k; continue; }
        size_t j = i;
        while (j < n) {
            k = tok_utf8_decode(s, n, j, &cp);
            if (tok_is_white_space(cp)) break;
            j += k;
        }
        CDF_TRY(metaspace_encode(tok, s + i, j - i, at_start && i == 0, out));
        i = j;
    }
    return CDF_OK;
}

static void t5_free(void *model) {
    tok_unigram *u = model;
    if (!u) return;
    free(u->score);
    free(u->sorted);
    tok_charsmap_free(&u->cmap);
    tok_buf_free(&u->word);
    tok_ids_free(&u->path);
    free(u->nodes);
    free(u);
}

static const tok_model_ops T5_OPS = {t5_normalize, t5_encode, t5_free};

/* ------------------------------------------------------------------ shared build steps */

static int cmp_pieces(const void *pa, const void *pb, void *ctx) {
    const cdf_tokenizer *tok = ctx;
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    uint32_t la = tok->vocab.len[a], lb = tok->vocab.len[b];
    int c = memcmp(piece_bytes(tok, a), piece_bytes(tok, b), la < lb ? la : lb);
    if (c) return c;
    if (la != lb) return la < lb ? -1 : 1;
    return a < b ? -1 : a > b;
}

static tok_unigram *t5_new(cdf_tokenizer *tok, int32_t n_ids) {
    tok_unigram *u = calloc(1, sizeof *u);
    if (!u) return NULL;
    tok->type = CDF_TOKENIZER_T5;
    tok->ops = &T5_OPS;
    tok->model = u;
    u->unk_id = -1;
    u->score = calloc((size_t)n_ids + 1, sizeof *u->score);
    if (!u->score || !tok_vocab_init(&tok->vocab, n_ids)) return NULL;
    return u;
}

/* After pieces and scores are set: index, sort, min score. */
static cdf_status t5_finish(cdf_tokenizer *tok, const char *path) {
    tok_unigram *u = tok->model;
    if (!tok_vocab_build_index(&tok->vocab)) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "%s: out of memory indexing", path);
    u->min_score = INFINITY;
    for (int32_t i = 0; i < tok->vocab.n; i++)
        if (tok->vocab.off[i] != UINT32_MAX && u->score[i] < u->min_score) u->min_score = u->score[i];
    u->sorted = malloc(((size_t)tok->vocab.n + 1) * sizeof *u->sorted);
    if (!u->sorted) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    int32_t k = 0;
    for (int32_t i = 0; i < tok->vocab.n; i++)
        if (tok->vocab.off[i] != UINT32_MAX && tok->vocab.len[i] > 0) u->sorted[k++] = i;
    qsort_r(u->sorted, (size_t)k, sizeof *u->sorted, cmp_pieces, tok);
    /* keep one id per distinct piece: the largest, which is the one piece -> id lookups give */
    int32_t m = 0;
    for (int32_t i = 0; i < k; i++) {
        if (m > 0) {
            int32_t p = u->sorted[m - 1], q = u->sorted[i];
            if (tok->vocab.len[p] == tok->vocab.len[q] && memcmp(piece_bytes(tok, p), piece_bytes(tok, q), tok->vocab.len[p]) == 0) {
                u->sorted[m - 1] = q;
                continue;
            }
        }
        u->sorted[m++] = u->sorted[i];
    }
    u->n_sorted = m;
    if (u->unk_id >= tok->vocab.n)
        return cdf_error(CDF_ERR_FORMAT, "%s: unk id %d is outside the %d pieces", path, (int)u->unk_id, (int)tok->vocab.n);
    tok->unk = u->unk_id;
    return CDF_OK;
}

static cdf_status set_replacement(char *dst, size_t *dst_len, const char *s, const char *path, const char *what) {
    size_t n = strlen(s);
    if (n == 0 || n >= MAX_REPLACEMENT || !tok_utf8_valid(s, n))
        return cdf_error(CDF_ERR_UNSUPPORTED, "%s: %s replacement \"%.32s\" must be a short non-empty string", path, what, s);
    memcpy(dst, s, n);
    *dst_len = n;
    return CDF_OK;
}

/* ------------------------------------------------------------------ tokenizer.json */

static const char *json_type(const cJSON *o) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

static cdf_status parse_one_normalizer(tok_unigram *u, const cJSON *n, int *stage, const char *path) {
    const char *type = json_type(n);
    if (!type) return cdf_error(CDF_ERR_FORMAT, "%s: a normalizer has no \"type\"", path);
    int my_stage;
    if (strcmp(type, "Precompiled") == 0) {
        my_stage = 0;
        const cJSON *cm = cJSON_GetObjectItemCaseSensitive(n, "precompiled_charsmap");
        if (!cJSON_IsString(cm)) return cdf_error(CDF_ERR_FORMAT, "%s: Precompiled normalizer without a precompiled_charsmap string", path);
        if (cm->valuestring[0]) {
            uint8_t *blob;
            size_t blob_n;
            CDF_TRY(tok_base64_decode(cm->valuestring, strlen(cm->valuestring), &blob, &blob_n, path));
            cdf_status st = tok_charsmap_init(&u->cmap, blob, blob_n, path);
            free(blob);
            CDF_TRY(st);
            u->has_cmap = true;
        }
    } else if (strcmp(type, "Strip") == 0) {
        my_stage = 1;
        const cJSON *l = cJSON_GetObjectItemCaseSensitive(n, "strip_left"), *r = cJSON_GetObjectItemCaseSensitive(n, "strip_right");
        u->strip_left = cJSON_IsTrue(l);
        u->strip_right = cJSON_IsTrue(r);
    } else if (strcmp(type, "Replace") == 0) {
        my_stage = 2;
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(n, "pattern");
        const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(n, "content");
        if (!cJSON_IsString(re) || strcmp(re->valuestring, " {2,}") != 0 || !cJSON_IsString(content))
            return cdf_error(CDF_ERR_UNSUPPORTED, "%s: only the Replace normalizer with Regex \" {2,}\" is supported", path);
        CDF_TRY(set_replacement(u->collapse_to, &u->collapse_len, content->valuestring, path, "Replace"));
        u->collapse = true;
    } else {
        return cdf_error(CDF_ERR_UNSUPPORTED, "%s: normalizer \"%.32s\" is not supported (Precompiled, Strip, Replace)", path, type);
    }
    if (my_stage < *stage)
        return cdf_error(CDF_ERR_UNSUPPORTED, "%s: normalizer \"%s\" after a later stage; only Precompiled -> Strip -> Replace is supported",
                         path, type);
    *stage = my_stage + 1;
    return CDF_OK;
}

static cdf_status parse_normalizer(tok_unigram *u, const cJSON *n, const char *path) {
    if (!n || cJSON_IsNull(n)) return CDF_OK;
    int stage = 0;
    const char *type = json_type(n);
    if (type && strcmp(type, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(n, "normalizers"), *e;
        if (!cJSON_IsArray(list)) return cdf_error(CDF_ERR_FORMAT, "%s: Sequence normalizer without a \"normalizers\" list", path);
        cJSON_ArrayForEach(e, list) CDF_TRY(parse_one_normalizer(u, e, &stage, path));
        return CDF_OK;
    }
    return parse_one_normalizer(u, n, &stage, path);
}

static cdf_status parse_metaspace(tok_unigram *u, const cJSON *m, const char *path) {
    const cJSON *rep = cJSON_GetObjectItemCaseSensitive(m, "replacement");
    if (!cJSON_IsString(rep)) return cdf_error(CDF_ERR_FORMAT, "%s: Metaspace without a \"replacement\" string", path);
    CDF_TRY(set_replacement(u->meta, &u->meta_len, rep->valuestring, path, "Metaspace"));
    const cJSON *scheme = cJSON_GetObjectItemCaseSensitive(m, "prepend_scheme");
    if (cJSON_IsString(scheme)) {
        if (strcmp(scheme->valuestring, "first") == 0) u->prepend = PREPEND_FIRST;
        else if (strcmp(scheme->valuestring, "always") == 0) u->prepend = PREPEND_ALWAYS;
        else if (strcmp(scheme->valuestring, "never") == 0) u->prepend = PREPEND_NEVER;
        else return cdf_error(CDF_ERR_FORMAT, "%s: unknown Metaspace prepend_scheme \"%.32s\"", path, scheme->valuestring);
    } else {
        /* older files: add_prefix_space true means "always" */
        const cJSON *aps = cJSON_GetObjectItemCaseSensitive(m, "add_prefix_space");
        u->prepend = cJSON_IsFalse(aps) ? PREPEND_NEVER : PREPEND_ALWAYS;
    }
    const cJSON *split = cJSON_GetObjectItemCaseSensitive(m, "split");
    u->meta_split = !cJSON_IsFalse(split);
    u->metaspace = true;
    return CDF_OK;
}

static cdf_status parse_pre_tokenizer(tok_unigram *u, const cJSON *p, const char *path) {
    if (!p || cJSON_IsNull(p)) return CDF_OK;
    const char *type = json_type(p);
    if (type && strcmp(type, "Metaspace") == 0) return parse_metaspace(u, p, path);
    if (type && strcmp(type, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers"), *e;
        if (!cJSON_IsArray(list)) return cdf_error(CDF_ERR_FORMAT, "%s: Sequence pre_tokenizer without \"pretokenizers\"", path);
        int i = 0;
        cJSON_ArrayForEach(e, list) {
            const char *t = json_type(e);
            int n = cJSON_GetArraySize(list);
            if (t && strcmp(t, "WhitespaceSplit") == 0 && i == 0 && n == 2) u->ws_split = true;
            else if (t && strcmp(t, "Metaspace") == 0 && i == n - 1) CDF_TRY(parse_metaspace(u, e, path));
            else return cdf_error(CDF_ERR_UNSUPPORTED, "%s: pre_tokenizer sequence element \"%.32s\" is not supported "
                                  "(Metaspace, optionally after WhitespaceSplit)", path, t ? t : "?");
            i++;
        }
        return CDF_OK;
    }
    return cdf_error(CDF_ERR_UNSUPPORTED, "%s: pre_tokenizer \"%.32s\" is not supported (Metaspace)", path, type ? type : "?");
}

static cdf_status parse_post_processor(cdf_tokenizer *tok, const cJSON *p, const char *path) {
    if (!p || cJSON_IsNull(p)) return CDF_OK;
    const char *type = json_type(p);
    if (!type || strcmp(type, "TemplateProcessing") != 0)
        return cdf_error(CDF_ERR_UNSUPPORTED, "%s: post_processor \"%.32s\" is not supported (TemplateProcessing)", path,
                         type ? type : "?");
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(p, "single"), *specials = cJSON_GetObjectItemCaseSensitive(p, "special_tokens");
    if (!cJSON_IsArray(single)) return cdf_error(CDF_ERR_FORMAT, "%s: TemplateProcessing without a \"single\" list", path);
    bool seen_sequence = false;
    const cJSON *item;
    cJSON_ArrayForEach(item, single) {
        const cJSON *seq = cJSON_GetObjectItemCaseSensitive(item, "Sequence");
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(item, "SpecialToken");
        if (seq) {
            if (seen_sequence) return cdf_error(CDF_ERR_FORMAT, "%s: the single template has two sequences", path);
            seen_sequence = true;
            continue;
        }
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(sp, "id");
        if (!cJSON_IsString(name)) return cdf_error(CDF_ERR_FORMAT, "%s: template item is neither Sequence nor SpecialToken", path);
        const cJSON *def = cJSON_GetObjectItemCaseSensitive(specials, name->valuestring);
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(def, "ids"), *idv;
        if (!cJSON_IsArray(ids))
            return cdf_error(CDF_ERR_FORMAT, "%s: template special token \"%.32s\" has no ids in special_tokens", path, name->valuestring);
        cJSON_ArrayForEach(idv, ids) {
            double v = idv->valuedouble;
            if (!cJSON_IsNumber(idv) || !(v >= 0 && v < TOK_MAX_IDS) || v != floor(v))
                return cdf_error(CDF_ERR_FORMAT, "%s: special token \"%.32s\" has an invalid id", path, name->valuestring);
            int *cnt = seen_sequence ? &tok->n_suffix : &tok->n_prefix;
            int32_t *arr = seen_sequence ? tok->suffix : tok->prefix;
            if (*cnt >= TOK_MAX_TEMPLATE)
                return cdf_error(CDF_ERR_LIMIT, "%s: more than %d template special tokens", path, TOK_MAX_TEMPLATE);
            arr[(*cnt)++] = (int32_t)v;
        }
    }
    if (!seen_sequence) return cdf_error(CDF_ERR_FORMAT, "%s: the single template has no Sequence", path);
    return CDF_OK;
}

cdf_status tok_t5_load_json(cdf_tokenizer *tok, const char *path, const tok_config *cfg) {
    (void)cfg;
    char *data;
    size_t len;
    CDF_TRY(tok_read_file(path, &data, &len));
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(data, len, &end, false);
    if (!root) {
        size_t at = end && end >= data && end <= data + len ? (size_t)(end - data) : 0;
        free(data);
        return cdf_error(CDF_ERR_FORMAT, "%s: invalid JSON near byte %zu", path, at);
    }
    free(data);
    cdf_status st = CDF_OK;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const char *type = json_type(model);
    if (!type) {
        st = cdf_error(CDF_ERR_FORMAT, "%s: no \"model\" object with a \"type\"", path);
        goto done;
    }
    if (strcmp(type, "Unigram") != 0) {
        st = cdf_error(CDF_ERR_UNSUPPORTED, "%s: model type \"%.32s\" is not supported here (Unigram)", path, type);
        goto done;
    }
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    int n = cJSON_IsArray(vocab) ? cJSON_GetArraySize(vocab) : -1;
    if (n <= 0) {
        st = cdf_error(CDF_ERR_FORMAT, "%s: model.vocab must be a non-empty list of [piece, score]", path);
        goto done;
    }
    if (n > TOK_MAX_IDS) {
        st = cdf_error(CDF_ERR_LIMIT, "%s: %d pieces exceed the limit %d", path, n, TOK_MAX_IDS);
        goto done;
    }
    tok_unigram *u = t5_new(tok, n);
    if (!u) {
        st = cdf_error(CDF_ERR_OUT_OF_MEMORY, "%s: out of memory for %d pieces", path, n);
        goto done;
    }
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback"))) {
        st = cdf_error(CDF_ERR_UNSUPPORTED, "%s: Unigram byte_fallback is not supported", path);
        goto done;
    }
    int32_t i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        const cJSON *piece = cJSON_GetArrayItem(e, 0), *score = cJSON_GetArrayItem(e, 1);
        if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) != 2 || !cJSON_IsString(piece) || !cJSON_IsNumber(score) ||
            !isfinite(score->valuedouble) || !tok_utf8_valid(piece->valuestring, strlen(piece->valuestring))) {
            st = cdf_error(CDF_ERR_FORMAT, "%s: model.vocab[%d] must be [UTF-8 piece string, finite score]", path, (int)i);
            goto done;
        }
        if (!tok_vocab_set(&tok->vocab, i, piece->valuestring, strlen(piece->valuestring))) {
            st = cdf_error(CDF_ERR_OUT_OF_MEMORY, "%s: out of memory storing pieces", path);
            goto done;
        }
        u->score[i++] = score->valuedouble;
    }
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_id");
    if (cJSON_IsNumber(unk)) {
        double v = unk->valuedouble;
        if (!(v >= 0 && v < n) || v != floor(v)) {
            st = cdf_error(CDF_ERR_FORMAT, "%s: model.unk_id %g is not a piece index below %d", path, v, n);
            goto done;
        }
        u->unk_id = (int32_t)v;
    } else if (unk && !cJSON_IsNull(unk)) {
        st = cdf_error(CDF_ERR_FORMAT, "%s: model.unk_id must be an integer or null", path);
        goto done;
    }
    if ((st = t5_finish(tok, path)) != CDF_OK) goto done;
    if ((st = parse_normalizer(u, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), path)) != CDF_OK) goto done;
    if ((st = parse_pre_tokenizer(u, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), path)) != CDF_OK) goto done;
    if ((st = parse_post_processor(tok, cJSON_GetObjectItemCaseSensitive(root, "post_processor"), path)) != CDF_OK) goto done;
    st = tok_add_tokens_json(tok, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"), path);
done:
    cJSON_Delete(root);
    return st;
}

/* ------------------------------------------------------------------ spiece.model (protobuf) */

/* Minimal protobuf reader: just enough wire format for sentencepiece's ModelProto. */
typedef struct pb_reader {
    const uint8_t *p, *end;
} pb_reader;

typedef struct pb_field {
    uint32_t number, wire;
    uint64_t varint;          /* wire 0 */
    const uint8_t *data;      /* wire 1, 2, 5 */
    size_t len;
} pb_field;

static bool pb_varint(pb_reader *r, uint64_t *v) {
    uint64_t x = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (r->p >= r->end) return false;
        uint8_t b = *r->p++;
        x |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            *v = x;
            return true;
        }
    }
    return false;
}

/* Next field; false at the end (*bad set when the data is malformed). */
static bool pb_next(pb_reader *r, pb_field *f, bool *bad) {
    *bad = false;
    if (r->p >= r->end) return false;
    uint64_t key;
    if (!pb_varint(r, &key) || (key >> 3) == 0 || (key >> 3) > 0x1FFFFFFF) { *bad = true; return false; }
    f->number = (uint32_t)(key >> 3);
    f->wire = (uint32_t)(key & 7);
    size_t left;
    switch (f->wire) {
    case 0: if (!pb_varint(r, &f->varint)) { *bad = true; return false; } return true;
    case 1: f->len = 8; break;
    case 5: f->len = 4; break;
    case 2: {
        uint64_t n;
        if (!pb_varint(r, &n)) { *bad = true; return false; }
        left = (size_t)(r->end - r->p);
        if (n > left) { *bad = true; return false; }
        f->len = (size_t)n;
        break;
    }
    default: *bad = true; return false; /* groups (3, 4) and reserved types */
    }
    left = (size_t)(r->end - r->p);
    if (f->len > left) { *bad = true; return false; }
    f->data = r->p;
    r->p += f->len;
    return true;
}

typedef struct spm_info {
    bool has_trainer, has_normalizer;
    int64_t model_type, unk_id, eos_id;
    bool byte_fallback, add_dummy_prefix;
    const uint8_t *charsmap;
    size_t charsmap_len;
} spm_info;

#define PB_FAIL(...) return cdf_error(CDF_ERR_FORMAT, __VA_ARGS__)

static cdf_status spm_parse_specs(const uint8_t *data, size_t n, spm_info *info, int32_t *n_pieces, const char *path) {
    pb_reader r = {data, data + n};
    pb_field f;
    bool bad;
    int64_t count = 0;
    while (pb_next(&r, &f, &bad)) {
        if (f.number == 1 && f.wire == 2) {
            count++;
        } else if (f.number == 2 && f.wire == 2) { /* TrainerSpec */
            info->has_trainer = true;
            pb_reader t = {f.data, f.data + f.len};
            pb_field g;
            while (pb_next(&t, &g, &bad)) {
                if (g.wire != 0) continue;
                if (g.number == 3) info->model_type = (int64_t)g.varint;
                else if (g.number == 40) info->unk_id = (int32_t)g.varint;
                else if (g.number == 42) info->eos_id = (int32_t)g.varint;
                else if (g.number == 35) info->byte_fallback = g.varint != 0;
            }
            if (bad) PB_FAIL("%s: malformed trainer_spec", path);
        } else if (f.number == 3 && f.wire == 2) { /* NormalizerSpec */
            info->has_normalizer = true;
            pb_reader t = {f.data, f.data + f.len};
            pb_field g;
            while (pb_next(&t, &g, &bad)) {
                if (g.number == 2 && g.wire == 2) {
                    info->charsmap = g.data;
                    info->charsmap_len = g.len;
                } else if (g.number == 3 && g.wire == 0) {
                    info->add_dummy_prefix = g.varint != 0;
                }
            }
            if (bad) PB_FAIL("%s: malformed normalizer_spec", path);
        }
    }
    if (bad) PB_FAIL("%s: malformed protobuf (truncated or invalid field at byte %zu)", path, (size_t)(r.p - data));
    if (count == 0) PB_FAIL("%s: no pieces (not a SentencePiece model?)", path);
    /* protobuf has no end marker: a file cut between two messages parses; every real model has
     * both specs after the pieces, so their absence means truncation */
    if (!info->has_trainer || !info->has_normalizer)
        PB_FAIL("%s: no %s (truncated file?)", path, !info->has_trainer ? "trainer_spec" : "normalizer_spec");
    if (count > TOK_MAX_IDS) return cdf_error(CDF_ERR_LIMIT, "%s: %lld pieces exceed the limit %d", path, (long long)count, TOK_MAX_IDS);
    *n_pieces = (int32_t)count;
    return CDF_OK;
}

cdf_status tok_t5_load_spiece(cdf_tokenizer *tok, const char *path, const tok_config *cfg) {
    char *raw;
    size_t n;
    CDF_TRY(tok_read_file(path, &raw, &n));
    const uint8_t *data = (const uint8_t *)raw;
    spm_info info = {.model_type = 1, .unk_id = 0, .eos_id = 2, .add_dummy_prefix = true}; /* proto defaults */
    int32_t n_pieces = 0;
    cdf_status st = spm_parse_specs(data, n, &info, &n_pieces, path);
    int extra = cfg->extra_ids >= 0 ? cfg->extra_ids : 100; /* T5Tokenizer's default */
    uint8_t *types = NULL;
    tok_unigram *u = NULL;
    if (st != CDF_OK) goto done;
    if (info.model_type != 1) {
        st = cdf_error(CDF_ERR_UNSUPPORTED, "%s: SentencePiece model type %lld is not supported (unigram = 1)", path,
                       (long long)info.model_type);
        goto done;
    }
    if (info.byte_fallback) {
        st = cdf_error(CDF_ERR_UNSUPPORTED, "%s: byte_fallback is not supported", path);
        goto done;
    }
    if ((int64_t)n_pieces + extra > TOK_MAX_IDS) {
        st = cdf_error(CDF_ERR_LIMIT, "%s: %d pieces + %d extra ids exceed the limit %d", path, (int)n_pieces, extra, TOK_MAX_IDS);
        goto done;
    }
    u = t5_new(tok, n_pieces + extra);
    types = malloc((size_t)n_pieces);
    if (!u || !types) {
        st = cdf_error(CDF_ERR_OUT_OF_MEMORY, "%s: out of memory for %d pieces", path, (int)n_pieces);
        goto done;
    }
    pb_reader r = {data, data + n};
    pb_field f;
    bool bad;
    int32_t i = 0;
    while (pb_next(&r, &f, &bad)) {
        if (f.number != 1 || f.wire != 2) continue;
        if (i >= n_pieces) break;
        pb_reader t = {f.data, f.data + f.len};
        pb_field g;
        const uint8_t *piece = NULL;
        size_t piece_len = 0;
        float score = 0.0f;
        uint64_t type = 1;
        while (pb_next(&t, &g, &bad)) {
            if (g.number == 1 && g.wire == 2) {
                piece = g.data;
                piece_len = g.len;
            } else if (g.number == 2 && g.wire == 5) {
                uint32_t bits = (uint32_t)g.data[0] | (uint32_t)g.data[1] << 8 | (uint32_t)g.data[2] << 16 | (uint32_t)g.data[3] << 24;
                memcpy(&score, &bits, 4);
            } else if (g.number == 3 && g.wire == 0) {
                type = g.varint;
            }
        }
        if (bad || !piece || !piece_len || !tok_utf8_valid((const char *)piece, piece_len) || !isfinite(score)) {
            st = cdf_error(CDF_ERR_FORMAT, "%s: piece %d is malformed (needs a non-empty UTF-8 piece and a finite score)", path, (int)i);
            goto done;
        }
        if (!tok_vocab_set(&tok->vocab, i, (const char *)piece, piece_len)) {
            st = cdf_error(CDF_ERR_OUT_OF_MEMORY, "%s: out of memory storing pieces", path);
            goto done;
        }
        u->score[i] = (double)score;
        types[i] = (uint8_t)(type > 255 ? 0 : type);
        i++;
    }
    /* T5Converter appends <extra_id_{extra-1}> ... <extra_id_0> with score 0 */
    for (int k = 0; k < extra; k++) {
        char name[32];
        int len = snprintf(name, sizeof name, "<extra_id_%d>", extra - 1 - k);
        if (!tok_vocab_set(&tok->vocab, n_pieces + k, name, (size_t)len)) {
            st = cdf_error(CDF_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
            goto done;
        }
    }
    if (info.unk_id < 0 || info.unk_id >= n_pieces) {
        st = cdf_error(CDF_ERR_FORMAT, "%s: trainer_spec.unk_id %lld is not a piece index below %d", path,
                       (long long)info.unk_id, (int)n_pieces);
        goto done;
    }
    u->unk_id = (int32_t)info.unk_id;
    if ((st = t5_finish(tok, path)) != CDF_OK) goto done;
    if (info.charsmap_len) {
        if ((st = tok_charsmap_init(&u->cmap, info.charsmap, info.charsmap_len, path)) != CDF_OK) goto done;
        u->has_cmap = true;
    }
    /* transformers' SpmConverter: Strip(right) + Replace(" {2,}", "▁"), Metaspace("▁") whose
     * prepend scheme is "first" for legacy=false tokenizers and "always" otherwise */
    u->strip_right = true;
    u->collapse = true;
    memcpy(u->collapse_to, "\xE2\x96\x81", 3);
    u->collapse_len = 3;
    u->metaspace = true;
    memcpy(u->meta, "\xE2\x96\x81", 3);
    u->meta_len = 3;
    u->meta_split = true;
    u->prepend = !info.add_dummy_prefix ? PREPEND_NEVER : cfg->legacy == 0 ? PREPEND_FIRST : PREPEND_ALWAYS;
    /* template: text + eos */
    const char *eos_name = cfg->eos ? cfg->eos : "</s>";
    int32_t eos = tok_vocab_find(&tok->vocab, eos_name, strlen(eos_name));
    if (eos < 0) eos = info.eos_id >= 0 && info.eos_id < n_pieces ? (int32_t)info.eos_id : -1;
    if (eos < 0) {
        st = cdf_error(CDF_ERR_FORMAT, "%s: no eos piece \"%s\"", path, eos_name);
        goto done;
    }
    tok->suffix[0] = eos;
    tok->n_suffix = 1;
    /* without tokenizer_config.json's added_tokens_decoder: control/unknown/user pieces and the
     * extra ids are the added tokens, as T5TokenizerFast registers them */
    if (cfg->n_added == 0) {
        for (int32_t k = 0; k < n_pieces && st == CDF_OK; k++)
            if (types[k] == 2 || types[k] == 3 || types[k] == 4)
                st = tok_add_token(tok, tok_vocab_piece(&tok->vocab, k), tok->vocab.len[k], k, false, types[k] != 4);
        for (int k = 0; k < extra && st == CDF_OK; k++)
            st = tok_add_token(tok, tok_vocab_piece(&tok->vocab, n_pieces + k), tok->vocab.len[n_pieces + k], n_pieces + k,
                               false, true);
    }
done:
    free(types);
    free(raw);
    return st;
}
