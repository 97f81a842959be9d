/* Added tokens (tokenizer.json's added_tokens, tokenizer_config.json's added_tokens_decoder): the
 * table the models fill while they load (tok_clip.c, tok_unigram.c, tok_tekken.c) and tokenizer.c
 * matches during encode. In a file of their own so that the models call down into it, not back
 * into tokenizer.c, which chooses and loads them. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "tokenizers/tok_internal.h"

cdf_status tok_check_added_flags(const cJSON *obj, const char *content, const char *path) {
    static const char *unsupported[1] = {"single_word"};
    for (int k = 0; k < 1; k++)
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(obj, unsupported[k])))
            return cdf_error(CDF_ERR_UNSUPPORTED, "%s: added token \"%.64s\" sets %s, which is not supported",
                             path, content, unsupported[k]);
    return CDF_OK;
}

cdf_status tok_add_token(cdf_tokenizer *tok, const char *content, size_t len, int32_t id, bool normalized,
                         bool special) {
    if (id < 0 || id >= TOK_MAX_IDS) return cdf_error(CDF_ERR_FORMAT, "added token id %d out of range", (int)id);
    tok_buf norm = {0};
    if (normalized) {
        /* matched against normalised text, so its content is normalised too (as tokenizers does) */
        cdf_status st = tok->ops->normalize(tok, content, len, &norm);
        if (st != CDF_OK) { tok_buf_free(&norm); return st; }
        content = norm.p ? norm.p : "";
        len = norm.n;
    }
    if (len == 0) { tok_buf_free(&norm); return CDF_OK; } /* can never match */
    if (tok->n_added >= TOK_MAX_ADDED) {
        tok_buf_free(&norm);
        return cdf_error(CDF_ERR_LIMIT, "more than %d added tokens", TOK_MAX_ADDED);
    }
    for (int i = 0; i < tok->n_added; i++) {
        tok_added *a = &tok->added[i];
        if (a->len == len && memcmp(a->content, content, len) == 0) { /* later definition wins */
            a->id = id;
            a->normalized = normalized;
            a->special = special;
            tok_buf_free(&norm);
            return CDF_OK;
        }
    }
    tok_added *grown = realloc(tok->added, ((size_t)tok->n_added + 1) * sizeof *grown);
    char *copy = malloc(len + 1);
    if (grown) tok->added = grown;
    if (!grown || !copy) {
        free(copy);
        tok_buf_free(&norm);
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "out of memory adding token %d", (int)id);
    }
    memcpy(copy, content, len);
    copy[len] = 0;
    tok->added[tok->n_added++] = (tok_added){copy, (uint32_t)len, id, normalized, special, false, false};
    tok_buf_free(&norm);
    return CDF_OK;
}

void tok_set_added_strip(cdf_tokenizer *tok, const char *content, size_t len, bool lstrip, bool rstrip) {
    for (int i = 0; i < tok->n_added; i++) {
        tok_added *a = &tok->added[i];
        if (a->len == len && memcmp(a->content, content, len) == 0) {
            a->lstrip = lstrip;
            a->rstrip = rstrip;
        }
    }
}

static cdf_status add_token_json(cdf_tokenizer *tok, const cJSON *e, int i, const char *path) {
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id"), *content = cJSON_GetObjectItemCaseSensitive(e, "content");
    double v = cJSON_IsNumber(id) ? id->valuedouble : -1;
    if (!(v >= 0 && v < TOK_MAX_IDS) || v != floor(v) || !cJSON_IsString(content) || !content->valuestring[0])
        return cdf_error(CDF_ERR_FORMAT, "%s: added_tokens[%d] needs an integer \"id\" and a non-empty \"content\"", path, i);
    const char *c = content->valuestring;
    CDF_TRY(tok_check_added_flags(e, c, path));
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(e, "normalized");
    bool special = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "special"));
    bool normalized = cJSON_IsBool(norm) ? cJSON_IsTrue(norm) : !special;
    CDF_TRY(tok_add_token(tok, c, strlen(c), (int32_t)v, normalized, special));
    const bool ls = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "lstrip")),
               rs = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "rstrip"));
    if (ls || rs) tok_set_added_strip(tok, c, strlen(c), ls, rs);
    return CDF_OK;
}

cdf_status tok_add_tokens_json(cdf_tokenizer *tok, const cJSON *list, const char *path) {
    if (!list || cJSON_IsNull(list)) return CDF_OK;
    if (!cJSON_IsArray(list)) return cdf_error(CDF_ERR_FORMAT, "%s: \"added_tokens\" must be a list", path);
    const cJSON *e;
    int i = 0;
    cJSON_ArrayForEach(e, list) {
        CDF_TRY(add_token_json(tok, e, i, path));
        i++;
    }
    return CDF_OK;
}
