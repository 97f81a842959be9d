/* SentencePiece "precompiled charsmap" normaliser (nmt_nfkc for T5), with the semantics of the
 * tokenizers library's `Precompiled` normaliser (spm_precompiled crate), which is what
 * T5TokenizerFast runs.
 *
 * Blob layout: u32 little-endian trie size in bytes, then that many bytes of u32 double-array
 * units (Darts-clone format), then the replacement strings, each terminated by NUL.
 * A unit encodes: label (bits 0-7, plus bit 31 so that leaf units never match a label),
 * has_leaf (bit 8), offset ((unit >> 10) << (8 if bit 9 else 0)); a leaf unit's value
 * (bits 0-30) is a byte offset into the replacement strings.
 *
 * Normalisation walks extended grapheme clusters: a cluster shorter than 6 bytes is looked up
 * whole first; otherwise (or if that finds nothing) each of its code points is looked up
 * alone. A lookup returns the replacement of the SHORTEST key that is a prefix of the chunk
 * (tokenizers takes the first common-prefix result), which is not SentencePiece's own
 * longest-match rule, but it is what the fast tokenizers (and therefore the golden ids) do. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenizers/tok_internal.h"

cdf_status tok_charsmap_init(tok_charsmap *m, const uint8_t *blob, size_t n, const char *what) {
    memset(m, 0, sizeof *m);
    if (n < 4) return cdf_error(CDF_ERR_FORMAT, "%s: precompiled charsmap of %zu bytes is truncated", what, n);
    uint32_t trie_bytes = (uint32_t)blob[0] | (uint32_t)blob[1] << 8 | (uint32_t)blob[2] << 16 | (uint32_t)blob[3] << 24;
    if (trie_bytes > n - 4)
        return cdf_error(CDF_ERR_FORMAT, "%s: precompiled charsmap declares a %u-byte trie but has only %zu bytes after the header",
                         what, trie_bytes, n - 4);
    size_t units = trie_bytes / 4;
    if (units == 0) return cdf_error(CDF_ERR_FORMAT, "%s: precompiled charsmap has an empty trie", what);
    const uint8_t *norm = blob + 4 + (size_t)trie_bytes; /* like spm_precompiled: a ragged tail byte count is ignored */
    size_t norm_len = n - 4 - trie_bytes;
    if (!tok_utf8_valid((const char *)norm, norm_len))
        return cdf_error(CDF_ERR_FORMAT, "%s: precompiled charsmap replacement strings are not valid UTF-8", what);
    m->units = malloc(units * sizeof *m->units);
    m->normalized = malloc(norm_len + 1);
    if (!m->units || !m->normalized) {
        tok_charsmap_free(m);
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "%s: out of memory for the precompiled charsmap", what);
    }
    for (size_t i = 0; i < units; i++) {
        const uint8_t *p = blob + 4 + 4 * i;
        m->units[i] = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    }
    memcpy(m->normalized, norm, norm_len);
    m->normalized[norm_len] = 0;
    m->n_units = units;
    m->norm_len = norm_len;
    return CDF_OK;
}

void tok_charsmap_free(tok_charsmap *m) {
    free(m->units);
    free(m->normalized);
    memset(m, 0, sizeof *m);
}

static inline size_t unit_offset(uint32_t u) { return (size_t)(u >> 10) << ((u & (1u << 9)) >> 6); }

/* Replacement for the shortest trie key that is a prefix of s[0..n); false if none. Every index
 * is bounds-checked: a hostile trie yields "no replacement", never an out-of-bounds read. */
static bool charsmap_lookup(const tok_charsmap *m, const char *s, size_t n, const char **rep, size_t *rep_n) {
    size_t pos = unit_offset(m->units[0]);
    for (size_t i = 0; i < n; i++) {
        unsigned c = (unsigned char)s[i];
        if (c == 0) return false;
        pos ^= c;
        if (pos >= m->n_units) return false;
        uint32_t u = m->units[pos];
        if ((u & ((1u << 31) | 0xFFu)) != c) return false;
        pos ^= unit_offset(u);
        if ((u >> 8) & 1u) {
            if (pos >= m->n_units) return false;
            size_t at = m->units[pos] & 0x7FFFFFFFu;
            if (at > m->norm_len) return false;
            if (at < m->norm_len && ((unsigned char)m->normalized[at] & 0xC0) == 0x80) return false; /* mid-character */
            size_t end = at;
            while (end < m->norm_len && m->normalized[end]) end++;
            *rep = m->normalized + at;
            *rep_n = end - at;
            return true;
        }
    }
    return false;
}

cdf_status tok_charsmap_normalize(const tok_charsmap *m, const char *s, size_t n, tok_buf *out) {
    if (!tok_buf_reserve(out, n)) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "T5 tokenizer: out of memory normalising");
    size_t g = 0; /* start of the current grapheme cluster */
    utf8proc_int32_t state = 0;
    uint32_t prev = 0;
    for (size_t i = 0; i <= n;) {
        uint32_t cp = 0;
        size_t k = 0;
        bool boundary = i == n;
        if (!boundary) {
            k = tok_utf8_decode(s, n, i, &cp);
            boundary = i > g && utf8proc_grapheme_break_stateful((utf8proc_int32_t)prev, (utf8proc_int32_t)cp, &state);
        }
        if (boundary && i > g) {
            const char *rep;
            size_t rep_n;
            bool ok = true;
            if (i - g < 6 && charsmap_lookup(m, s + g, i - g, &rep, &rep_n)) {
                ok = tok_buf_append(out, rep, rep_n);
            } else {
                for (size_t j = g; ok && j < i;) {
                    uint32_t c;
                    size_t cl = tok_utf8_decode(s, i, j, &c);
                    ok = charsmap_lookup(m, s + j, cl, &rep, &rep_n) ? tok_buf_append(out, rep, rep_n)
                                                                      : tok_buf_append(out, s + j, cl);
                    j += cl;
                }
            }
            if (!ok) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "T5 tokenizer: out of memory normalising");
            g = i;
        }
        if (i == n) break;
        prev = cp;
        i += k;
    }
    return CDF_OK;
}
