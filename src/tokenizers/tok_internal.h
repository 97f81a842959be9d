/* Internals shared by the tokenizer sources (not a public header).
 *
 * The encode pipeline mirrors the Hugging Face `tokenizers` library, because that is what the
 * diffusers pipelines run (transformers fast tokenizers):
 *   1. invalid UTF-8 -> U+FFFD (lossy, documented in the public header);
 *   2. split out added tokens whose `normalized` flag is false (matched on the raw text,
 *      leftmost-longest);
 *   3. each remaining segment: model normaliser, then split out added tokens with
 *      `normalized` = true (matched on the normalised text);
 *   4. each remaining piece: model pre-tokeniser + model (BPE / unigram) -> ids;
 *   5. truncation, template (bos/eos), padding.
 * Steps 3-4 are per model (tok_model_ops); the rest is tokenizer.c.
 * Models: CLIP BPE (tok_clip.c), T5 unigram (tok_unigram.c), byte-level BPE from tokenizer.json
 * (tok_tekken.c: FLUX.2's Mistral tokenizer). */
#ifndef CDF_TOK_INTERNAL_H
#define CDF_TOK_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cdiffusers/tokenizer.h"
#include "core/error_internal.h"

/* Safety limits for sizes read from files or given by callers. */
#define TOK_MAX_FILE_BYTES ((size_t)512 << 20) /* any single tokenizer file */
#define TOK_MAX_IDS (1 << 24)                  /* vocabulary ids */
#define TOK_MAX_TEXT_BYTES ((size_t)1 << 20)   /* one encode call (a long prompt is a few KiB; BPE
                                                  scratch is ~50 bytes per byte of one word) */
#define TOK_MAX_LENGTH (1 << 20)               /* max_length of one encode call */
#define TOK_MAX_TEMPLATE 8                     /* special tokens before/after the text */
#define TOK_MAX_ADDED 16384                    /* added tokens (T5 has 103, CLIP 2-3) */

/* ---- growable buffers (return false when out of memory) ---- */
typedef struct tok_buf {
    char *p;
    size_t n, cap;
} tok_buf;
bool tok_buf_reserve(tok_buf *b, size_t extra);
bool tok_buf_append(tok_buf *b, const void *s, size_t n);
bool tok_buf_push_cp(tok_buf *b, uint32_t cp); /* UTF-8 encode one code point */
void tok_buf_free(tok_buf *b);

typedef struct tok_ids {
    int32_t *p;
    size_t n, cap;
} tok_ids;
bool tok_ids_push(tok_ids *v, int32_t id);
void tok_ids_free(tok_ids *v);

/* ---- UTF-8 ---- */
/* Decode the code point at s[i] of VALID UTF-8 (after tok_utf8_sanitize); returns its length. */
size_t tok_utf8_decode(const char *s, size_t n, size_t i, uint32_t *cp);
/* Copy s to out replacing every maximal invalid subsequence by U+FFFD (from_utf8_lossy). */
bool tok_utf8_sanitize(const char *s, size_t n, tok_buf *out);
/* Whether s is valid UTF-8 (surrogates and overlongs rejected). */
bool tok_utf8_valid(const char *s, size_t n);
/* Unicode White_Space (Rust char::is_whitespace, Oniguruma \s). */
bool tok_is_white_space(uint32_t cp);

/* ---- files and JSON ---- */
/* Read a whole file (NUL-terminated copy). CDF_ERR_NOT_FOUND if it does not exist. */
cdf_status tok_read_file(const char *path, char **data, size_t *len);
bool tok_file_exists(const char *path);
/* Decode standard base64 (padding optional). NULL + FORMAT error naming `what` on bad input. */
cdf_status tok_base64_decode(const char *s, size_t n, uint8_t **out, size_t *out_n, const char *what);

/* ---- SentencePiece precompiled charsmap (tok_charsmap.c) ---- */
typedef struct tok_charsmap {
    uint32_t *units; /* double-array trie */
    size_t n_units;
    char *normalized; /* NUL-separated replacement strings */
    size_t norm_len;
} tok_charsmap;
/* Parse the binary blob; CDF_ERR_FORMAT naming `what` when malformed. */
cdf_status tok_charsmap_init(tok_charsmap *m, const uint8_t *blob, size_t n, const char *what);
void tok_charsmap_free(tok_charsmap *m);
/* Apply the charsmap to valid UTF-8 s, appending to out. */
cdf_status tok_charsmap_normalize(const tok_charsmap *m, const char *s, size_t n, tok_buf *out);

/* ---- vocabulary: id -> piece, piece -> id ---- */
typedef struct tok_vocab {
    tok_buf arena;   /* NUL-terminated pieces back to back */
    uint32_t *off;   /* per id: offset in arena, UINT32_MAX = no piece */
    uint32_t *len;   /* per id: byte length */
    int32_t n;       /* number of ids */
    int32_t *slots;  /* hash table of ids (-1 empty), power-of-two size */
    uint32_t n_slots;
} tok_vocab;
/* Allocate n ids, all without piece. */
bool tok_vocab_init(tok_vocab *v, int32_t n);
/* Set the piece of id (copied). Returns false on OOM. Call before tok_vocab_build_index. */
bool tok_vocab_set(tok_vocab *v, int32_t id, const char *s, size_t n);
/* Build the piece -> id index; for duplicate pieces the largest id wins (like inserting into
 * a hash map in id order). */
bool tok_vocab_build_index(tok_vocab *v);
/* Id of a piece, -1 if absent. */
int32_t tok_vocab_find(const tok_vocab *v, const char *s, size_t n);
static inline const char *tok_vocab_piece(const tok_vocab *v, int32_t id) {
    return (id >= 0 && id < v->n && v->off[id] != UINT32_MAX) ? v->arena.p + v->off[id] : NULL;
}
void tok_vocab_free(tok_vocab *v);

/* ---- added (special) tokens ---- */
typedef struct tok_added {
    char *content; /* as matched: normalised already when `normalized` is set */
    uint32_t len;
    int32_t id;
    bool normalized, special;
    bool lstrip, rstrip; /* the match also swallows whitespace on its left / right */
} tok_added;

/* ---- model interface ---- */
typedef struct tok_model_ops {
    /* normalise a text segment (append to out) */
    cdf_status (*normalize)(cdf_tokenizer *tok, const char *s, size_t n, tok_buf *out);
    /* pre-tokenise + model on a normalised piece; `at_start`: the piece begins at offset 0 of
     * the input (T5's Metaspace prepend_scheme "first"). Appends ids. */
    cdf_status (*encode)(cdf_tokenizer *tok, const char *s, size_t n, bool at_start, tok_ids *out);
    void (*free)(void *model);
} tok_model_ops;

struct cdf_tokenizer {
    cdf_tokenizer_type type;
    const tok_model_ops *ops;
    void *model;
    tok_vocab vocab;     /* model vocabulary */
    tok_added *added;    /* added tokens; ids may lie outside the model vocabulary */
    int n_added;
    /* added-token index for matching: by (normalized flag, first byte); built after loading */
    int *added_order;
    int added_bucket[2][257];
    int32_t prefix[TOK_MAX_TEMPLATE], suffix[TOK_MAX_TEMPLATE];
    int n_prefix, n_suffix;
    int64_t bos, eos, pad, unk;
    int model_max_length;
    pthread_mutex_t lock;
    /* scratch reused by encode (under lock) */
    tok_buf clean, norm;
    tok_ids content;
};

/* ---- loaders (tok_clip.c, tok_unigram.c) ---- */
/* The shared bits of tokenizer_config.json / special_tokens_map.json. */
typedef struct tok_config {
    char *tokenizer_class;
    char *bos, *eos, *pad, *unk; /* token strings, NULL if unset */
    int model_max_length;        /* 0 if absent or unbounded */
    int extra_ids;               /* -1 if absent */
    int legacy;                  /* -1 absent, 0 false, 1 true */
    tok_added *added;            /* added_tokens_decoder (ids from the config) */
    int n_added;
    const char *config_path;     /* for messages */
} tok_config;

cdf_status tok_clip_load(cdf_tokenizer *tok, const char *folder, const tok_config *cfg);
cdf_status tok_t5_load_json(cdf_tokenizer *tok, const char *path, const tok_config *cfg);
cdf_status tok_t5_load_spiece(cdf_tokenizer *tok, const char *path, const tok_config *cfg);
/* Byte-level BPE (tok_tekken.c) from the already parsed tokenizer.json `root` (not kept). */
struct cJSON;
cdf_status tok_bpe_load_json(cdf_tokenizer *tok, const char *path, const struct cJSON *root, const tok_config *cfg);

/* tokenizer.c helpers for loaders */
/* Add an added token (content copied; normalised with the model normaliser when `normalized`). */
cdf_status tok_add_token(cdf_tokenizer *tok, const char *content, size_t len, int32_t id,
                         bool normalized, bool special);
/* Set lstrip/rstrip on the added token with this content (after tok_add_token). */
void tok_set_added_strip(cdf_tokenizer *tok, const char *content, size_t len, bool lstrip, bool rstrip);
/* Reject added-token options this implementation does not perform (single_word is false for
 * CLIP and T5): silently ignoring them would change ids. lstrip/rstrip are supported (SD3's
 * tokenizer_3 sets them on the <extra_id_*> tokens). */
struct cJSON;
cdf_status tok_check_added_flags(const struct cJSON *obj, const char *content, const char *path);
/* tokenizer.json's "added_tokens" (absent or null: none): each entry's integer "id" and non-empty
 * "content" checked, its flags applied (special; normalized, default !special; lstrip / rstrip). */
cdf_status tok_add_tokens_json(cdf_tokenizer *tok, const struct cJSON *list, const char *path);
/* Id of a token string: added tokens first, then the vocabulary; -1 if absent. */
int32_t tok_token_id(const cdf_tokenizer *tok, const char *s);


/* A 64-bit mixer (murmur3's finaliser) for the hash tables. */
static inline uint64_t tok_mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

/* ---- BPE merge table (CLIP and tekken): open addressing on (left id, right id) ---- */
typedef struct tok_merge {
    uint64_t key;   /* left id << 32 | right id */
    int32_t rank;   /* < 0: empty slot */
    int32_t new_id;
} tok_merge;

typedef struct tok_merge_map {
    tok_merge *slots;
    uint32_t mask;
} tok_merge_map;

/* Room for n merges (load factor <= 1/2); false if out of memory. */
bool tok_merge_map_init(tok_merge_map *m, size_t n);
void tok_merge_map_free(tok_merge_map *m);
const tok_merge *tok_merge_find(const tok_merge_map *m, int32_t left, int32_t right);
/* Insert or overwrite (a later duplicate wins, as when tokenizers collects merges into a map). */
void tok_merge_put(tok_merge_map *m, int32_t left, int32_t right, int32_t rank, int32_t new_id);

#endif
