/* FLUX.2 prompt rendering and tokenization (see flux2_prompt.h). */
#include <stdlib.h>
#include <string.h>

#include "tokenizers/flux2_prompt.h"
#include "tokenizers/tok_internal.h"

cdf_status cdf_flux2_render_prompt(const char *prompt, size_t len, const char *system_message, const char *bos_token,
                                   char **out, size_t *out_len) {
    if (!out) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_flux2_render_prompt: out is NULL");
    *out = NULL;
    if (out_len) *out_len = 0;
    if (!prompt && len) return cdf_error(CDF_ERR_INVALID_ARG, "cdf_flux2_render_prompt: prompt is NULL but len is %zu", len);
    if (len > TOK_MAX_TEXT_BYTES)
        return cdf_error(CDF_ERR_LIMIT, "cdf_flux2_render_prompt: prompt of %zu bytes exceeds the limit of %zu bytes", len,
                         TOK_MAX_TEXT_BYTES);
    if (!system_message) system_message = CDF_FLUX2_SYSTEM_MESSAGE;
    if (!bos_token) bos_token = "<s>";
    /* a Python str is valid text: replace invalid bytes first, so that removing "[IMG]" can never
     * join two invalid fragments into a valid character */
    tok_buf clean = {0}, sys = {0}, r = {0};
    cdf_status st = CDF_OK;
    if (!tok_utf8_sanitize(prompt ? prompt : "", len, &clean) ||
        !tok_utf8_sanitize(system_message, strlen(system_message), &sys)) {
        st = cdf_error(CDF_ERR_OUT_OF_MEMORY, "cdf_flux2_render_prompt: out of memory");
        goto done;
    }
    static const char IMG[] = "[IMG]";
    const size_t img_len = sizeof IMG - 1;
    bool ok = tok_buf_append(&r, bos_token, strlen(bos_token)) && tok_buf_append(&r, "[SYSTEM_PROMPT]", 15) &&
              tok_buf_append(&r, sys.p ? sys.p : "", sys.n) && tok_buf_append(&r, "[/SYSTEM_PROMPT][INST]", 22);
    /* str.replace("[IMG]", ""): non-overlapping occurrences, left to right, one pass */
    for (size_t i = 0; ok && i < clean.n;) {
        if (clean.n - i >= img_len && memcmp(clean.p + i, IMG, img_len) == 0) {
            i += img_len;
            continue;
        }
        size_t j = i + 1;
        while (j < clean.n && clean.p[j] != '[') j++;
        ok = tok_buf_append(&r, clean.p + i, j - i);
        i = j;
    }
    ok = ok && tok_buf_append(&r, "[/INST]", 7);
    if (!ok) {
        st = cdf_error(CDF_ERR_OUT_OF_MEMORY, "cdf_flux2_render_prompt: out of memory");
        goto done;
    }
    *out = r.p;
    if (out_len) *out_len = r.n;
    r.p = NULL;
done:
    tok_buf_free(&clean);
    tok_buf_free(&sys);
    tok_buf_free(&r);
    return st;
}

cdf_status cdf_flux2_format_prompt(cdf_tokenizer *tok, const char *prompt, size_t len, const char *system_message,
                                   int max_sequence_length, int64_t *input_ids, int64_t *attention_mask, int *n_tokens,
                                   int *n_untruncated) {
    if (n_tokens) *n_tokens = 0;
    if (n_untruncated) *n_untruncated = 0;
    if (!tok || !input_ids)
        return cdf_error(CDF_ERR_INVALID_ARG, "cdf_flux2_format_prompt: %s is NULL", tok ? "input_ids" : "tokenizer");
    if (cdf_tokenizer_kind(tok) != CDF_TOKENIZER_BPE)
        return cdf_error(CDF_ERR_INVALID_ARG,
                         "cdf_flux2_format_prompt: the tokenizer is not FLUX.2's byte-level BPE (kind %d; a CLIP/T5 "
                         "tokenizer would add its own special tokens)",
                         (int)cdf_tokenizer_kind(tok));
    if (max_sequence_length <= 0) max_sequence_length = CDF_FLUX2_MAX_SEQUENCE_LENGTH;
    const char *bos = cdf_tokenizer_id_to_piece(tok, cdf_tokenizer_bos_id(tok));
    char *text;
    size_t text_len;
    CDF_TRY(cdf_flux2_render_prompt(prompt, len, system_message, bos, &text, &text_len));
    int untruncated = 0;
    cdf_status st = cdf_tokenizer_encode(tok, text, text_len, max_sequence_length, true, input_ids, attention_mask, NULL,
                                         &untruncated);
    free(text);
    if (st != CDF_OK) return st;
    /* no special tokens are added (add_special_tokens=False): the real tokens are the content */
    if (n_tokens) *n_tokens = untruncated < max_sequence_length ? untruncated : max_sequence_length;
    if (n_untruncated) *n_untruncated = untruncated;
    return CDF_OK;
}
