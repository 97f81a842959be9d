/* Public tokenizer API: folder detection, the shared config files, added-token splitting and
 * the encode driver (truncation, template, padding). The models live in tok_clip.c,
 * tok_unigram.c and tok_tekken.c; see tok_internal.h for the pipeline. */
#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizers/tok_internal.h"

/* ------------------------------------------------------------------ config files */

static void config_free(tok_config *c) {
    free(c->tokenizer_class);
    free(c->bos);
    free(c->eos);
    free(c->pad);
    free(c->unk);
    for (int i = 0; i < c->n_added; i++) free(c->added[i].content);
    free(c->added);
    memset(c, 0, sizeof *c);
}

/* Parse a JSON file; *root = NULL (and CDF_OK) when it does not exist and !required. */
static cdf_status json_load(const char *path, bool required, cJSON **root) {
    *root = NULL;
    if (!required && !tok_file_exists(path)) return CDF_OK;
    char *data;
    size_t n;
    CDF_TRY(tok_read_file(path, &data, &n));
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(data, n, &end, false);
    if (!j) {
        size_t at = end && end >= data && end <= data + n ? (size_t)(end - data) : 0;
        free(data);
        return cdf_error(CDF_ERR_FORMAT, "%s: invalid JSON near byte %zu", path, at);
    }
    free(data);
    *root = j;
    return CDF_OK;
}

/* A special token given as a plain string or as {"content": "..."}; NULL if neither. */
static const char *token_string(const cJSON *v) {
    if (cJSON_IsString(v)) return v->valuestring;
    if (cJSON_IsObject(v)) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(v, "content");
        if (cJSON_IsString(c)) return c->valuestring;
    }
    return NULL;
}

static cdf_status set_str(char **dst, const char *s, const char *path) {
    free(*dst);
    *dst = strdup(s);
    return *dst ? CDF_OK : cdf_error(CDF_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
}

static cdf_status read_special_tokens(tok_config *c, const cJSON *root, const char *path) {
    static const char *keys[4] = {"bos_token", "eos_token", "pad_token", "unk_token"};
    char **dst[4] = {&c->bos, &c->eos, &c->pad, &c->unk};
    for (int k = 0; k < 4; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, keys[k]);
        if (!v || cJSON_IsNull(v)) continue;
        const char *s = token_string(v);
        if (!s) return cdf_error(CDF_ERR_FORMAT, "%s: \"%s\" must be a string or an object with \"content\"", path, keys[k]);
        CDF_TRY(set_str(dst[k], s, path));
    }
    return CDF_OK;
}

static bool json_flag(const cJSON *obj, const char *key, bool dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

static cdf_status read_added_decoder(tok_config *c, const cJSON *dec, const char *path) {
    if (!cJSON_IsObject(dec)) return cdf_error(CDF_ERR_FORMAT, "%s: \"added_tokens_decoder\" must be an object", path);
    int n = cJSON_GetArraySize(dec);
    if (n > TOK_MAX_ADDED) return cdf_error(CDF_ERR_LIMIT, "%s: %d added tokens exceed the limit %d", path, n, TOK_MAX_ADDED);
    c->added = calloc((size_t)n + 1, sizeof *c->added);
    if (!c->added) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    const cJSON *e;
    cJSON_ArrayForEach(e, dec) {
        char *endp = NULL;
        long id = e->string ? strtol(e->string, &endp, 10) : -1;
        if (!e->string || !*e->string || *endp || id < 0 || id >= TOK_MAX_IDS)
            return cdf_error(CDF_ERR_FORMAT, "%s: added_tokens_decoder key \"%.32s\" is not an id in [0, %d)", path,
                             e->string ? e->string : "", TOK_MAX_IDS);
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(e, "content");
        if (!cJSON_IsString(content) || !content->valuestring[0])
            return cdf_error(CDF_ERR_FORMAT, "%s: added token %ld has no \"content\" string", path, id);
        CDF_TRY(tok_check_added_flags(e, content->valuestring, path));
        tok_added *a = &c->added[c->n_added];
        a->content = strdup(content->valuestring);
        if (!a->content) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
        c->n_added++;
        a->len = (uint32_t)strlen(a->content);
        a->id = (int32_t)id;
        a->special = json_flag(e, "special", false);
        /* transformers' AddedToken default: normalized = not special */
        a->normalized = json_flag(e, "normalized", !a->special);
        a->lstrip = json_flag(e, "lstrip", false);
        a->rstrip = json_flag(e, "rstrip", false);
    }
    return CDF_OK;
}

static cdf_status load_config(const char *folder, tok_config *c, char *path_buf, size_t path_cap) {
    memset(c, 0, sizeof *c);
    c->extra_ids = -1;
    c->legacy = -1;
    cJSON *root = NULL;
    cdf_status st;
    snprintf(path_buf, path_cap, "%s/tokenizer_config.json", folder);
    c->config_path = path_buf;
    if ((st = json_load(path_buf, false, &root)) != CDF_OK) return st;
    if (root) {
        if (!cJSON_IsObject(root)) {
            cJSON_Delete(root);
            return cdf_error(CDF_ERR_FORMAT, "%s: top level must be an object", path_buf);
        }
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "tokenizer_class");
        if (cJSON_IsString(v) && (st = set_str(&c->tokenizer_class, v->valuestring, path_buf)) != CDF_OK) goto done;
        v = cJSON_GetObjectItemCaseSensitive(root, "model_max_length");
        /* transformers writes 1e30 for "unbounded": treat anything beyond our limit as unset */
        if (cJSON_IsNumber(v) && v->valuedouble >= 1 && v->valuedouble <= TOK_MAX_LENGTH)
            c->model_max_length = (int)v->valuedouble;
        v = cJSON_GetObjectItemCaseSensitive(root, "extra_ids");
        if (cJSON_IsNumber(v)) {
            if (!(v->valuedouble >= 0 && v->valuedouble <= 100000) || v->valuedouble != floor(v->valuedouble)) {
                st = cdf_error(CDF_ERR_FORMAT, "%s: \"extra_ids\" must be an integer in [0, 100000]", path_buf);
                goto done;
            }
            c->extra_ids = (int)v->valuedouble;
        }
        v = cJSON_GetObjectItemCaseSensitive(root, "legacy");
        if (cJSON_IsBool(v)) c->legacy = cJSON_IsTrue(v) ? 1 : 0;
        if ((st = read_special_tokens(c, root, path_buf)) != CDF_OK) goto done;
        v = cJSON_GetObjectItemCaseSensitive(root, "added_tokens_decoder");
        if (v && (st = read_added_decoder(c, v, path_buf)) != CDF_OK) goto done;
        cJSON_Delete(root);
        root = NULL;
    }
    /* special_tokens_map.json overrides the config's special tokens, as in transformers */
    char map_path[PATH_MAX];
    snprintf(map_path, sizeof map_path, "%s/special_tokens_map.json", folder);
    if ((st = json_load(map_path, false, &root)) != CDF_OK) return st;
    if (root) {
        if (!cJSON_IsObject(root)) st = cdf_error(CDF_ERR_FORMAT, "%s: top level must be an object", map_path);
        else st = read_special_tokens(c, root, map_path);
    }
done:
    cJSON_Delete(root);
    return st;
}

/* ------------------------------------------------------------------ added tokens */

static bool find_added_content(const cdf_tokenizer *tok, const char *s) {
    size_t n = strlen(s);
    for (int i = 0; i < tok->n_added; i++)
        if (tok->added[i].len == n && memcmp(tok->added[i].content, s, n) == 0) return true;
    return false;
}

int32_t tok_token_id(const cdf_tokenizer *tok, const char *s) {
    if (!s) return -1;
    size_t n = strlen(s);
    for (int i = 0; i < tok->n_added; i++)
        if (tok->added[i].len == n && memcmp(tok->added[i].content, s, n) == 0) return tok->added[i].id;
    return tok_vocab_find(&tok->vocab, s, n);
}

/* Index the added tokens by (normalized flag, first byte) so that matching only looks at the
 * tokens that can start at a given byte. */
static cdf_status index_added(cdf_tokenizer *tok) {
    free(tok->added_order);
    tok->added_order = malloc(((size_t)tok->n_added + 1) * sizeof *tok->added_order);
    if (!tok->added_order) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
    int k = 0;
    for (int flag = 0; flag < 2; flag++)
        for (int c = 0; c < 256; c++) {
            tok->added_bucket[flag][c] = k;
            for (int i = 0; i < tok->n_added; i++)
                if (tok->added[i].normalized == flag && (unsigned char)tok->added[i].content[0] == c)
                    tok->added_order[k++] = i;
        }
    /* the end of bucket (flag, 255) is the start of (flag + 1, 0), or n_added */
    tok->added_bucket[0][256] = tok->added_bucket[1][0];
    tok->added_bucket[1][256] = k;
    return CDF_OK;
}

/* Leftmost-longest match of an added token with the given `normalized` flag in s[from..n),
 * as the tokenizers library's Aho-Corasick (MatchKind::LeftmostLongest) finds it. */
static bool find_added(const cdf_tokenizer *tok, bool normalized, const char *s, size_t n, size_t from,
                       size_t *at, size_t *len, int32_t *id, const tok_added **which) {
    const int *bucket = tok->added_bucket[normalized];
    if (tok->n_added == 0 || bucket[0] == bucket[256]) return false;
    for (size_t i = from; i < n; i++) {
        unsigned c = (unsigned char)s[i];
        size_t best = 0;
        for (int k = bucket[c]; k < bucket[c + 1]; k++) {
            const tok_added *a = &tok->added[tok->added_order[k]];
            if (a->len > n - i || a->len <= best) continue;
            if (memcmp(a->content, s + i, a->len) == 0) {
                best = a->len;
                *id = a->id;
                *which = a;
            }
        }
        if (best) {
            *at = i;
            *len = best;
            return true;
        }
    }
    return false;
}

static bool is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

/* An added token with lstrip/rstrip also consumes the whitespace before/after it (the
 * tokenizers library extends the match over it), so that whitespace reaches no model. */
static void strip_around(const tok_added *a, const char *s, size_t seg_start, size_t *seg_end, size_t *next, size_t n) {
    if (a->lstrip)
        while (*seg_end > seg_start && is_ws((unsigned char)s[*seg_end - 1])) (*seg_end)--;
    if (a->rstrip)
        while (*next < n && is_ws((unsigned char)s[*next])) (*next)++;
}

/* Normalise one raw segment, split out normalised added tokens, run the model on the rest. */
static cdf_status encode_segment(cdf_tokenizer *tok, const char *s, size_t n, bool at_start) {
    tok->norm.n = 0;
    CDF_TRY(tok->ops->normalize(tok, s, n, &tok->norm));
    const char *t = tok->norm.p;
    size_t tn = tok->norm.n, pos = 0, at, len;
    int32_t id;
    const tok_added *a;
    while (find_added(tok, true, t, tn, pos, &at, &len, &id, &a)) {
        size_t seg_end = at, next = at + len;
        strip_around(a, t, pos, &seg_end, &next, tn);
        if (seg_end > pos) CDF_TRY(tok->ops->encode(tok, t + pos, seg_end - pos, at_start && pos == 0, &tok->content));
        if (!tok_ids_push(&tok->content, id)) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
        pos = next;
    }
    if (pos < tn) CDF_TRY(tok->ops->encode(tok, t + pos, tn - pos, at_start && pos == 0, &tok->content));
    return CDF_OK;
}

static cdf_status encode_locked(cdf_tokenizer *tok, const char *text, size_t len) {
    tok->clean.n = 0;
    tok->content.n = 0;
    if (!tok_utf8_sanitize(text ? text : "", len, &tok->clean))
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "tokenizer: out of memory copying %zu bytes of text", len);
    const char *s = tok->clean.p;
    size_t n = tok->clean.n, pos = 0, at, mlen;
    int32_t id;
    const tok_added *a;
    while (find_added(tok, false, s, n, pos, &at, &mlen, &id, &a)) {
        size_t seg_end = at, next = at + mlen;
        strip_around(a, s, pos, &seg_end, &next, n);
        if (seg_end > pos) CDF_TRY(encode_segment(tok, s + pos, seg_end - pos, pos == 0));
        if (!tok_ids_push(&tok->content, id)) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "tokenizer: out of memory");
        pos = next;
    }
    if (pos < n) CDF_TRY(encode_segment(tok, s + pos, n - pos, pos == 0));
    return CDF_OK;
}

cdf_status cdf_tokenizer_encode(cdf_tokenizer *tok, const char *text, size_t len, int max_length, bool pad_to_max,
                                int64_t *ids, int64_t *mask, int *n_out, int *n_untruncated) {
    if (n_out) *n_out = 0;
    if (n_untruncated) *n_untruncated = 0;
    if (!tok || !ids) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_tokenizer_encode: %s is NULL", tok ? "ids" : "tokenizer");
    if (!text && len) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_tokenizer_encode: text is NULL but len is %zu", len);
    if (len > TOK_MAX_TEXT_BYTES)
        return cdf_error(CDF_ERR_LIMIT, "cdf_tokenizer_encode: text of %zu bytes exceeds the limit of %zu bytes", len,
                         TOK_MAX_TEXT_BYTES);
    if (max_length <= 0) max_length = tok->model_max_length;
    if (max_length <= 0)
        return cdf_error(CDF_ERR_INVALID_ARG, "cdf_tokenizer_encode: max_length not given and the tokenizer has no model_max_length");
    if (max_length > TOK_MAX_LENGTH)
        return cdf_error(CDF_ERR_LIMIT, "cdf_tokenizer_encode: max_length %d exceeds the limit %d", max_length, TOK_MAX_LENGTH);
    int n_special = tok->n_prefix + tok->n_suffix;
    if (max_length < n_special)
        return cdf_error(CDF_ERR_INVALID_ARG, "cdf_tokenizer_encode: max_length %d is smaller than the %d special tokens",
                         max_length, n_special);
    if (pad_to_max && tok->pad < 0)
        return cdf_error(CDF_ERR_UNSUPPORTED, "cdf_tokenizer_encode: padding requested but the tokenizer has no pad token");

    pthread_mutex_lock(&tok->lock);
    cdf_status st = encode_locked(tok, text, len);
    if (st == CDF_OK) {
        size_t keep = tok->content.n;
        if (keep > (size_t)(max_length - n_special)) keep = (size_t)(max_length - n_special);
        int k = 0;
        for (int i = 0; i < tok->n_prefix; i++) ids[k++] = tok->prefix[i];
        for (size_t i = 0; i < keep; i++) ids[k++] = tok->content.p[i];
        for (int i = 0; i < tok->n_suffix; i++) ids[k++] = tok->suffix[i];
        int n_real = k;
        if (pad_to_max)
            while (k < max_length) ids[k++] = tok->pad;
        if (mask)
            for (int i = 0; i < k; i++) mask[i] = i < n_real;
        if (n_out) *n_out = k;
        if (n_untruncated) *n_untruncated = (int)tok->content.n + n_special;
    }
    /* do not let one huge prompt pin its scratch memory forever */
    if (tok->clean.cap > ((size_t)1 << 20)) tok_buf_free(&tok->clean);
    if (tok->norm.cap > ((size_t)1 << 20)) tok_buf_free(&tok->norm);
    if (tok->content.cap > ((size_t)1 << 18)) tok_ids_free(&tok->content);
    pthread_mutex_unlock(&tok->lock);
    return st;
}

/* ------------------------------------------------------------------ loading */

static bool class_is(const char *cls, const char *base) {
    size_t n = strlen(base);
    return cls && strncmp(cls, base, n) == 0 && (cls[n] == 0 || strcmp(cls + n, "Fast") == 0);
}

static cdf_status resolve_specials(cdf_tokenizer *tok, const tok_config *cfg, const char *folder) {
    if (tok->type == CDF_TOKENIZER_CLIP) {
        /* CLIPTokenizer defaults when the config files do not name them */
        const char *bos = cfg->bos ? cfg->bos : "<|startoftext|>";
        const char *eos = cfg->eos ? cfg->eos : "<|endoftext|>";
        tok->bos = tok_token_id(tok, bos);
        tok->eos = tok_token_id(tok, eos);
        tok->pad = tok_token_id(tok, cfg->pad ? cfg->pad : eos);
        tok->unk = tok_token_id(tok, cfg->unk ? cfg->unk : "<|endoftext|>");
        if (tok->bos < 0 || tok->eos < 0)
            return cdf_error(CDF_ERR_FORMAT, "%s: CLIP tokenizer without %s token \"%s\" in its vocabulary", folder,
                             tok->bos < 0 ? "bos" : "eos", tok->bos < 0 ? bos : eos);
        tok->prefix[0] = (int32_t)tok->bos;
        tok->suffix[0] = (int32_t)tok->eos;
        tok->n_prefix = tok->n_suffix = 1;
    } else {
        tok->bos = cfg->bos ? tok_token_id(tok, cfg->bos) : -1;
        tok->eos = tok_token_id(tok, cfg->eos ? cfg->eos : "</s>");
        tok->pad = tok_token_id(tok, cfg->pad ? cfg->pad : "<pad>");
        if (cfg->unk && tok_token_id(tok, cfg->unk) >= 0) tok->unk = tok_token_id(tok, cfg->unk);
        /* the loader set the template (tokenizer.json post_processor, or [eos] for spiece) */
    }
    return CDF_OK;
}

/* tokenizer.json of a folder whose class does not fix the model: its model type decides. */
static cdf_status load_tokenizer_json(cdf_tokenizer *tok, const char *path, const tok_config *cfg) {
    cJSON *root;
    CDF_TRY(json_load(path, true, &root));
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    cdf_status st;
    if (cJSON_IsString(type) && strcmp(type->valuestring, "BPE") == 0) {
        st = tok_bpe_load_json(tok, path, root, cfg);
    } else if (cJSON_IsString(type) && strcmp(type->valuestring, "Unigram") == 0) {
        cJSON_Delete(root); /* the unigram loader reads the file itself */
        return tok_t5_load_json(tok, path, cfg);
    } else {
        st = cJSON_IsString(type) ? cdf_error(CDF_ERR_UNSUPPORTED, "%s: model type \"%.32s\" is not supported (BPE, Unigram)",
                                              path, type->valuestring)
                                  : cdf_error(CDF_ERR_FORMAT, "%s: no \"model\" object with a \"type\"", path);
    }
    cJSON_Delete(root);
    return st;
}

cdf_tokenizer *cdf_tokenizer_load_from(const char *folder, cdf_tokenizer_source source) {
    if (!folder || !*folder) {
        cdf_error(CDF_ERR_INVALID_ARG, "cdf_tokenizer_load: folder is NULL or empty");
        return NULL;
    }
    if (source < CDF_TOKENIZER_SOURCE_AUTO || source > CDF_TOKENIZER_SOURCE_SPIECE_MODEL) {
        cdf_error(CDF_ERR_INVALID_ARG, "cdf_tokenizer_load_from: invalid source %d", (int)source);
        return NULL;
    }
    if (strlen(folder) > PATH_MAX - 64) {
        cdf_error(CDF_ERR_INVALID_ARG, "cdf_tokenizer_load: folder path of %zu bytes is too long", strlen(folder));
        return NULL;
    }
    char cfg_path[PATH_MAX], vocab_path[PATH_MAX], merges_path[PATH_MAX], json_path[PATH_MAX], spm_path[PATH_MAX];
    snprintf(vocab_path, sizeof vocab_path, "%s/vocab.json", folder);
    snprintf(merges_path, sizeof merges_path, "%s/merges.txt", folder);
    snprintf(json_path, sizeof json_path, "%s/tokenizer.json", folder);
    snprintf(spm_path, sizeof spm_path, "%s/spiece.model", folder);

    tok_config cfg;
    cdf_status st = load_config(folder, &cfg, cfg_path, sizeof cfg_path);
    if (st != CDF_OK) {
        config_free(&cfg);
        return NULL;
    }
    const char *cls = cfg.tokenizer_class;
    bool is_clip = class_is(cls, "CLIPTokenizer"), is_t5 = class_is(cls, "T5Tokenizer");
    bool has_vm = tok_file_exists(vocab_path) && tok_file_exists(merges_path);
    bool has_json = tok_file_exists(json_path), has_spm = tok_file_exists(spm_path);
    /* another class (FLUX.2: LlamaTokenizerFast) is fine when tokenizer.json says what to run */
    bool other_class = cls && !is_clip && !is_t5;
    if (other_class && !has_json) {
        cdf_error(CDF_ERR_UNSUPPORTED,
                  "%s: tokenizer_class \"%.64s\" is not supported without a tokenizer.json (CLIPTokenizer, T5Tokenizer)",
                  cfg_path, cls);
        config_free(&cfg);
        return NULL;
    }
    if (source == CDF_TOKENIZER_SOURCE_AUTO) {
        if (is_clip) source = CDF_TOKENIZER_SOURCE_VOCAB_MERGES;
        else if (is_t5) source = has_json ? CDF_TOKENIZER_SOURCE_TOKENIZER_JSON : CDF_TOKENIZER_SOURCE_SPIECE_MODEL;
        else if (other_class) source = CDF_TOKENIZER_SOURCE_TOKENIZER_JSON;
        else if (has_vm) source = CDF_TOKENIZER_SOURCE_VOCAB_MERGES;
        else if (has_json) source = CDF_TOKENIZER_SOURCE_TOKENIZER_JSON;
        else if (has_spm) source = CDF_TOKENIZER_SOURCE_SPIECE_MODEL;
        else {
            cdf_error(CDF_ERR_NOT_FOUND,
                      "%s: no tokenizer files (looked for vocab.json + merges.txt, tokenizer.json, spiece.model)", folder);
            config_free(&cfg);
            return NULL;
        }
    }
    if ((source == CDF_TOKENIZER_SOURCE_VOCAB_MERGES && is_t5) ||
        (source != CDF_TOKENIZER_SOURCE_VOCAB_MERGES && is_clip)) {
        cdf_error(CDF_ERR_UNSUPPORTED, "%s: a %s cannot be loaded from %s", folder, cls,
                  source == CDF_TOKENIZER_SOURCE_VOCAB_MERGES ? "vocab.json + merges.txt"
                  : source == CDF_TOKENIZER_SOURCE_TOKENIZER_JSON ? "tokenizer.json (not implemented for CLIP)"
                                                                  : "spiece.model");
        config_free(&cfg);
        return NULL;
    }

    cdf_tokenizer *tok = calloc(1, sizeof *tok);
    if (!tok) {
        cdf_error(CDF_ERR_OUT_OF_MEMORY, "cdf_tokenizer_load: out of memory");
        config_free(&cfg);
        return NULL;
    }
    pthread_mutex_init(&tok->lock, NULL);
    tok->bos = tok->eos = tok->pad = tok->unk = -1;
    tok->model_max_length = cfg.model_max_length;
    switch (source) {
    case CDF_TOKENIZER_SOURCE_VOCAB_MERGES: st = tok_clip_load(tok, folder, &cfg); break;
    case CDF_TOKENIZER_SOURCE_TOKENIZER_JSON:
        st = is_t5 ? tok_t5_load_json(tok, json_path, &cfg) : load_tokenizer_json(tok, json_path, &cfg);
        break;
    default: st = tok_t5_load_spiece(tok, spm_path, &cfg); break;
    }
    /* added tokens of tokenizer_config.json not already defined by the model files */
    for (int i = 0; st == CDF_OK && i < cfg.n_added; i++) {
        const tok_added *a = &cfg.added[i];
        if (source == CDF_TOKENIZER_SOURCE_TOKENIZER_JSON && find_added_content(tok, a->content)) continue;
        st = tok_add_token(tok, a->content, a->len, a->id, a->normalized, a->special);
        if (st == CDF_OK && (a->lstrip || a->rstrip)) tok_set_added_strip(tok, a->content, a->len, a->lstrip, a->rstrip);
    }
    if (st == CDF_OK) st = resolve_specials(tok, &cfg, folder);
    if (st == CDF_OK) st = index_added(tok);
    config_free(&cfg);
    if (st != CDF_OK) {
        cdf_tokenizer_free(tok);
        return NULL;
    }
    return tok;
}

cdf_tokenizer *cdf_tokenizer_load(const char *folder) {
    return cdf_tokenizer_load_from(folder, CDF_TOKENIZER_SOURCE_AUTO);
}

void cdf_tokenizer_free(cdf_tokenizer *tok) {
    if (!tok) return;
    if (tok->ops && tok->model) tok->ops->free(tok->model);
    tok_vocab_free(&tok->vocab);
    for (int i = 0; i < tok->n_added; i++) free(tok->added[i].content);
    free(tok->added);
    free(tok->added_order);
    tok_buf_free(&tok->clean);
    tok_buf_free(&tok->norm);
    tok_ids_free(&tok->content);
    pthread_mutex_destroy(&tok->lock);
    free(tok);
}

/* ------------------------------------------------------------------ accessors */

cdf_tokenizer_type cdf_tokenizer_kind(const cdf_tokenizer *tok) { return tok ? tok->type : (cdf_tokenizer_type)0; }
int64_t cdf_tokenizer_bos_id(const cdf_tokenizer *tok) { return tok ? tok->bos : -1; }
int64_t cdf_tokenizer_eos_id(const cdf_tokenizer *tok) { return tok ? tok->eos : -1; }
int64_t cdf_tokenizer_pad_id(const cdf_tokenizer *tok) { return tok ? tok->pad : -1; }
int64_t cdf_tokenizer_unk_id(const cdf_tokenizer *tok) { return tok ? tok->unk : -1; }
int cdf_tokenizer_model_max_length(const cdf_tokenizer *tok) { return tok ? tok->model_max_length : 0; }

int64_t cdf_tokenizer_vocab_size(const cdf_tokenizer *tok) {
    if (!tok) return 0;
    int64_t n = tok->vocab.n;
    for (int i = 0; i < tok->n_added; i++)
        if (tok->added[i].id >= n) n = (int64_t)tok->added[i].id + 1;
    return n;
}

const char *cdf_tokenizer_id_to_piece(const cdf_tokenizer *tok, int64_t id) {
    if (!tok || id < 0 || id >= TOK_MAX_IDS) return NULL;
    const char *p = tok_vocab_piece(&tok->vocab, (int32_t)id);
    if (p) return p;
    for (int i = 0; i < tok->n_added; i++)
        if (tok->added[i].id == id) return tok->added[i].content;
    return NULL;
}
