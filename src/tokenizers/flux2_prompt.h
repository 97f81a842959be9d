/* FLUX.2's text prompt, built and tokenized exactly as diffusers' Flux2Pipeline does it
 * (`format_input` + PixtralProcessor.apply_chat_template(..., padding="max_length",
 * truncation=True, max_length=max_sequence_length)) at diffusers commit 58eb52c0.
 *
 *   1. the prompt loses every "[IMG]" (Python str.replace: one left-to-right pass);
 *   2. the chat template renders
 *        <s>[SYSTEM_PROMPT]{system message}[/SYSTEM_PROMPT][INST]{prompt}[/INST]
 *      (no spaces or newlines added; an empty prompt gives "[INST][/INST]");
 *   3. that text is tokenized with add_special_tokens=False: the literal "<s>", "[INST]", ...
 *      (also when they appear inside the prompt) are their special ids, the rest byte-level BPE;
 *   4. truncated from the right to max_sequence_length (a long prompt loses its end, "[/INST]"
 *      included) and right-padded with <pad> (11); attention mask 1 on real tokens, 0 on padding.
 *
 * Invalid UTF-8 in the prompt is replaced by U+FFFD before step 1 (as the tokenizers do). */
#ifndef CDF_FLUX2_PROMPT_H
#define CDF_FLUX2_PROMPT_H

#include <stddef.h>
#include <stdint.h>

#include "cdiffusers/tokenizer.h"

/* diffusers pipelines/flux2/system_messages.py SYSTEM_MESSAGE (note the newline after "object"). */
#define CDF_FLUX2_SYSTEM_MESSAGE                                                                                      \
    "You are an AI that reasons about image descriptions. You give structured responses focusing on object "        \
    "relationships, object\nattribution and actions without speculation."
/* Flux2Pipeline's default max_sequence_length. */
#define CDF_FLUX2_MAX_SEQUENCE_LENGTH 512

/* Steps 1-2: the rendered chat text (malloc'ed, NUL-terminated; *out_len bytes without the NUL).
 * system_message NULL = CDF_FLUX2_SYSTEM_MESSAGE; bos_token NULL = "<s>".
 * Errors: CDF_ERR_INVALID_ARG (NULL out, prompt NULL with len > 0), CDF_ERR_LIMIT (prompt over
 * 1 MiB), CDF_ERR_OUT_OF_MEMORY. */
cdf_status cdf_flux2_render_prompt(const char *prompt, size_t len, const char *system_message, const char *bos_token,
                                   char **out, size_t *out_len);

/* Steps 1-4 with the FLUX.2 tokenizer `tok` (a CDF_TOKENIZER_BPE folder; its bos token string is
 * used for "<s>"). max_sequence_length <= 0 means 512. input_ids and attention_mask (may be
 * NULL) receive exactly max_sequence_length values. n_tokens (may be NULL): real tokens kept;
 * n_untruncated (may be NULL): the length before truncation. Errors: those of
 * cdf_flux2_render_prompt and cdf_tokenizer_encode; CDF_ERR_INVALID_ARG for a tokenizer that is
 * not byte-level BPE. */
cdf_status cdf_flux2_format_prompt(cdf_tokenizer *tok, const char *prompt, size_t len, const char *system_message,
                                   int max_sequence_length, int64_t *input_ids, int64_t *attention_mask, int *n_tokens,
                                   int *n_untruncated);

#endif
