/* cdiffusers — text tokenizers (CLIP byte-level BPE, T5 SentencePiece unigram).
 *
 * A tokenizer is loaded from a Hugging Face `tokenizer/` folder and reproduces the ids that the
 * transformers *fast* tokenizers (the Rust `tokenizers` library) produce when the diffusers
 * pipelines call them: `tokenizer(prompt, padding="max_length", max_length=N, truncation=True)`.
 *
 *   CLIP  (FLUX `tokenizer`, SD3 `tokenizer`, `tokenizer_2`): vocab.json + merges.txt
 *         (+ tokenizer_config.json / special_tokens_map.json for the special tokens).
 *         ids = [bos] + content[:N-2] + [eos], padded with the folder's pad id.
 *   T5    (FLUX `tokenizer_2`, SD3 `tokenizer_3`): tokenizer.json (preferred) or spiece.model
 *         (+ tokenizer_config.json). ids = content[:N-1] + [eos], padded with the pad id (0).
 *
 * Input text is UTF-8. Invalid UTF-8 never fails and never crashes: every maximal invalid
 * subsequence is replaced by U+FFFD (the same rule as Rust's String::from_utf8_lossy and
 * Python's bytes.decode("utf-8", "replace")), and the result is tokenized as if the caller had
 * passed that text. (transformers itself cannot receive invalid UTF-8: a Python str is always
 * valid.) Embedded NUL bytes are ordinary characters, the length is explicit.
 *
 * Thread safety: one cdf_tokenizer may be used from several threads; encode serialises on an
 * internal lock (it keeps a word cache).
 */
#ifndef CDIFFUSERS_TOKENIZER_H
#define CDIFFUSERS_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cdiffusers/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cdf_tokenizer cdf_tokenizer;

typedef enum cdf_tokenizer_type {
    CDF_TOKENIZER_CLIP = 1, /* byte-level BPE with "</w>" word ends (OpenAI CLIP / OpenCLIP) */
    CDF_TOKENIZER_T5 = 2,   /* SentencePiece unigram with the nmt_nfkc charsmap (T5 v1.1) */
    CDF_TOKENIZER_BPE = 3   /* byte-level BPE from tokenizer.json (Mistral tekken: FLUX.2) */
} cdf_tokenizer_type;

/* Which files of a folder to read. AUTO: tokenizer_config.json's tokenizer_class decides the
 * type (CLIPTokenizer[Fast] / T5Tokenizer[Fast]); without it, or with another class (FLUX.2's
 * LlamaTokenizerFast), the files present decide (vocab.json + merges.txt -> CLIP; tokenizer.json
 * -> its model type: Unigram -> T5, BPE -> BPE; spiece.model -> T5). A T5 folder with both files
 * uses tokenizer.json, as transformers does.
 *
 *   BPE   (FLUX.2 `tokenizer`): tokenizer.json with a byte-level BPE model (Split regex +
 *         ByteLevel pre-tokenisers, ignore_merges). No special tokens are added: ids = content
 *         [:N], padded with the pad id (<pad> = 11). The FLUX.2 pipeline renders a chat prompt that
 *         already starts with "<s>" and tokenizes it with add_special_tokens=False (see
 *         src/tokenizers/flux2_prompt.h). */
typedef enum cdf_tokenizer_source {
    CDF_TOKENIZER_SOURCE_AUTO = 0,
    CDF_TOKENIZER_SOURCE_VOCAB_MERGES = 1,   /* vocab.json + merges.txt (CLIP) */
    CDF_TOKENIZER_SOURCE_TOKENIZER_JSON = 2, /* tokenizer.json (T5 Unigram or byte-level BPE) */
    CDF_TOKENIZER_SOURCE_SPIECE_MODEL = 3    /* spiece.model (T5 SentencePiece protobuf) */
} cdf_tokenizer_source;

/* Load the tokenizer in `folder`. Returns NULL on failure with cdf_last_error() set:
 * CDF_ERR_INVALID_ARG (NULL folder), CDF_ERR_NOT_FOUND (no usable tokenizer files; the
 * message lists what was looked for), CDF_ERR_IO, CDF_ERR_FORMAT (a malformed file: the
 * message names the file and what is wrong), CDF_ERR_LIMIT (a file or count beyond a safety
 * limit), CDF_ERR_UNSUPPORTED (a valid file asking for a feature not implemented, e.g. a
 * normaliser on a BPE tokenizer.json or byte_fallback), CDF_ERR_OUT_OF_MEMORY. */
cdf_tokenizer *cdf_tokenizer_load(const char *folder);
/* Same, reading only the files of `source` (tokenizer_config.json and special_tokens_map.json
 * are read in every case when present). */
cdf_tokenizer *cdf_tokenizer_load_from(const char *folder, cdf_tokenizer_source source);
/* Free a tokenizer (NULL is fine). */
void cdf_tokenizer_free(cdf_tokenizer *tok);

/* Tokenize `len` bytes of UTF-8 `text` (text may be NULL when len is 0).
 *
 * max_length: total length including special tokens (77 for CLIP; 256 or 512 for T5); <= 0
 *   means the folder's model_max_length. Content is truncated to max_length minus the number of
 *   special tokens (CLIP 2, T5 1), as transformers' truncation=True does.
 * pad_to_max: true -> always write exactly max_length ids, padded with the pad id (mask 0);
 *   false -> write only the real tokens.
 * ids: room for max_length values. mask: NULL or room for max_length values (1 = real token,
 *   0 = padding). n_out: NULL or receives the number of ids written. n_untruncated: NULL or
 *   receives the length the encoding would have without truncation (special tokens included;
 *   transformers' num_tokens before truncation).
 *
 * Returns CDF_OK; CDF_ERR_INVALID_ARG (NULL tok/ids, text NULL with len > 0, max_length smaller
 * than the special tokens or unset with no model_max_length); CDF_ERR_LIMIT (len > 1 MiB or
 * max_length > 1M); CDF_ERR_UNSUPPORTED (pad_to_max but the tokenizer has no pad token, or an
 * unknown character and no unk token); CDF_ERR_OUT_OF_MEMORY. */
cdf_status cdf_tokenizer_encode(cdf_tokenizer *tok, const char *text, size_t len, int max_length,
                                bool pad_to_max, int64_t *ids, int64_t *mask, int *n_out,
                                int *n_untruncated);

/* Accessors. Ids are -1 where the tokenizer has no such token (T5 has no bos). */
cdf_tokenizer_type cdf_tokenizer_kind(const cdf_tokenizer *tok);
int64_t cdf_tokenizer_bos_id(const cdf_tokenizer *tok);
int64_t cdf_tokenizer_eos_id(const cdf_tokenizer *tok);
int64_t cdf_tokenizer_pad_id(const cdf_tokenizer *tok);
int64_t cdf_tokenizer_unk_id(const cdf_tokenizer *tok);
/* Number of ids (largest id + 1): 49408 for CLIP, 32100 for T5 (pieces + <extra_id_*>). */
int64_t cdf_tokenizer_vocab_size(const cdf_tokenizer *tok);
/* model_max_length from tokenizer_config.json (77 CLIP, 512 T5), 0 if absent or unbounded. */
int cdf_tokenizer_model_max_length(const cdf_tokenizer *tok);
/* The piece string of an id (CLIP: GPT-2 byte-level alphabet with "</w>"; T5: "▁"-pieces),
 * NULL when the id is out of range or unused. Valid until cdf_tokenizer_free. */
const char *cdf_tokenizer_id_to_piece(const cdf_tokenizer *tok, int64_t id);

#ifdef __cplusplus
}
#endif
#endif
