/* Small utilities for the tokenizers: buffers, UTF-8, files, base64, the vocabulary index. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tokenizers/tok_internal.h"

/* ---------------------------------------------------------------- buffers */

bool tok_buf_reserve(tok_buf *b, size_t extra) {
    if (extra > SIZE_MAX / 2 - b->n) return false;
    size_t need = b->n + extra + 1; /* +1: room for a terminating NUL */
    if (need <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return false;
    b->p = p;
    b->cap = cap;
    return true;
}

bool tok_buf_append(tok_buf *b, const void *s, size_t n) {
    if (!tok_buf_reserve(b, n)) return false;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return true;
}

bool tok_buf_push_cp(tok_buf *b, uint32_t cp) {
    char u[4];
    size_t k;
    if (cp < 0x80) {
        u[0] = (char)cp;
        k = 1;
    } else if (cp < 0x800) {
        u[0] = (char)(0xC0 | (cp >> 6));
        u[1] = (char)(0x80 | (cp & 0x3F));
        k = 2;
    } else if (cp < 0x10000) {
        u[0] = (char)(0xE0 | (cp >> 12));
        u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[2] = (char)(0x80 | (cp & 0x3F));
        k = 3;
    } else {
        u[0] = (char)(0xF0 | (cp >> 18));
        u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[3] = (char)(0x80 | (cp & 0x3F));
        k = 4;
    }
    return tok_buf_append(b, u, k);
}

void tok_buf_free(tok_buf *b) {
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

bool tok_ids_push(tok_ids *v, int32_t id) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        int32_t *p = realloc(v->p, cap * sizeof *p);
        if (!p) return false;
        v->p = p;
        v->cap = cap;
    }
    v->p[v->n++] = id;
    return true;
}

void tok_ids_free(tok_ids *v) {
    free(v->p);
    v->p = NULL;
    v->n = v->cap = 0;
}

/* ---------------------------------------------------------------- UTF-8 */

/* Length of the valid UTF-8 sequence at s[i] (1..4), or 0 if invalid; *bad receives how many
 * bytes form the maximal invalid prefix to replace (Unicode "maximal subpart" rule, which is
 * what Rust's from_utf8_lossy and Python's "replace" error handler implement). */
static size_t utf8_seq(const unsigned char *s, size_t n, size_t i, size_t *bad) {
    unsigned c = s[i];
    if (c < 0x80) return 1;
    size_t need;
    unsigned lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c == 0xE0) { need = 2; lo = 0xA0; }
    else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) need = 2;
    else if (c == 0xED) { need = 2; hi = 0x9F; } /* no surrogates */
    else if (c == 0xF0) { need = 3; lo = 0x90; }
    else if (c >= 0xF1 && c <= 0xF3) need = 3;
    else if (c == 0xF4) { need = 3; hi = 0x8F; }
    else { *bad = 1; return 0; }
    for (size_t k = 1; k <= need; k++) {
        if (i + k >= n) { *bad = k; return 0; }
        unsigned d = s[i + k];
        unsigned l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
        if (d < l || d > h) { *bad = k; return 0; }
    }
    return need + 1;
}

bool tok_utf8_sanitize(const char *s, size_t n, tok_buf *out) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0; /* run: start of the pending valid stretch */
    if (!tok_buf_reserve(out, n)) return false;
    while (i < n) {
        size_t bad = 0, k = utf8_seq(u, n, i, &bad);
        if (k) { i += k; continue; }
        if (!tok_buf_append(out, s + run, i - run)) return false;
        if (!tok_buf_append(out, "\xEF\xBF\xBD", 3)) return false;
        i += bad;
        run = i;
    }
    return tok_buf_append(out, s + run, n - run);
}

bool tok_utf8_valid(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t bad, k = utf8_seq(u, n, i, &bad);
        if (!k) return false;
        i += k;
    }
    return true;
}

size_t tok_utf8_decode(const char *s, size_t n, size_t i, uint32_t *cp) {
    const unsigned char *u = (const unsigned char *)s + i;
    size_t k = u[0] < 0x80 ? 1 : u[0] < 0xE0 ? 2 : u[0] < 0xF0 ? 3 : 4;
    if (k > n - i) { *cp = 0xFFFD; return 1; } /* only for invalid input: never read past n */
    switch (k) {
    case 1: *cp = u[0]; break;
    case 2: *cp = ((uint32_t)(u[0] & 0x1F) << 6) | (u[1] & 0x3F); break;
    case 3: *cp = ((uint32_t)(u[0] & 0x0F) << 12) | ((uint32_t)(u[1] & 0x3F) << 6) | (u[2] & 0x3F); break;
    default:
        *cp = ((uint32_t)(u[0] & 0x07) << 18) | ((uint32_t)(u[1] & 0x3F) << 12) |
              ((uint32_t)(u[2] & 0x3F) << 6) | (u[3] & 0x3F);
    }
    return k;
}

bool tok_is_white_space(uint32_t c) {
    if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D);
    if (c < 0x85) return false;
    return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
           c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* ---------------------------------------------------------------- files */

bool tok_file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

cdf_status tok_read_file(const char *path, char **data, size_t *len) {
    *data = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) return cdf_error(CDF_ERR_NOT_FOUND, "tokenizer file %s does not exist", path);
        return cdf_error(CDF_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return cdf_error(CDF_ERR_IO, "%s is not a regular file", path);
    }
    if ((uint64_t)st.st_size > TOK_MAX_FILE_BYTES) {
        close(fd);
        return cdf_error(CDF_ERR_LIMIT, "%s has %lld bytes, more than the tokenizer file limit of %zu",
                         path, (long long)st.st_size, TOK_MAX_FILE_BYTES);
    }
    size_t n = (size_t)st.st_size;
    char *p = malloc(n + 1);
    if (!p) {
        close(fd);
        return cdf_error(CDF_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes for %s", n + 1, path);
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, p + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = r < 0 ? errno : 0;
            free(p);
            close(fd);
            return cdf_error(CDF_ERR_IO, "reading %s failed after %zu of %zu bytes%s%s", path, got, n,
                             e ? ": " : "", e ? strerror(e) : "");
        }
        got += (size_t)r;
    }
    close(fd);
    p[n] = 0;
    *data = p;
    *len = n;
    return CDF_OK;
}

/* ---------------------------------------------------------------- base64 */

static int b64_value(unsigned char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

cdf_status tok_base64_decode(const char *s, size_t n, uint8_t **out, size_t *out_n, const char *what) {
    *out = NULL;
    *out_n = 0;
    while (n > 0 && s[n - 1] == '=') n--;
    if (n % 4 == 1) return cdf_error(CDF_ERR_FORMAT, "%s: base64 text has an impossible length", what);
    uint8_t *p = malloc(n / 4 * 3 + 3);
    if (!p) return cdf_error(CDF_ERR_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes", what, n / 4 * 3 + 3);
    size_t k = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        int v = b64_value((unsigned char)s[i]);
        if (v < 0) {
            free(p);
            return cdf_error(CDF_ERR_FORMAT, "%s: invalid base64 character at offset %zu", what, i);
        }
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            p[k++] = (uint8_t)(acc >> bits);
        }
    }
    *out = p;
    *out_n = k;
    return CDF_OK;
}

/* ---------------------------------------------------------------- vocabulary */

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a, then a final mix */
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

bool tok_vocab_init(tok_vocab *v, int32_t n) {
    memset(v, 0, sizeof *v);
    if (n < 0 || n > TOK_MAX_IDS) return false;
    v->n = n;
    v->off = malloc(((size_t)n + 1) * sizeof *v->off);
    v->len = calloc((size_t)n + 1, sizeof *v->len);
    if (!v->off || !v->len) return false;
    for (int32_t i = 0; i < n; i++) v->off[i] = UINT32_MAX;
    return true;
}

bool tok_vocab_set(tok_vocab *v, int32_t id, const char *s, size_t n) {
    if (id < 0 || id >= v->n || n >= UINT32_MAX / 2 || v->arena.n + n + 1 >= UINT32_MAX) return false;
    uint32_t off = (uint32_t)v->arena.n;
    if (!tok_buf_append(&v->arena, s, n) || !tok_buf_append(&v->arena, "", 1)) return false;
    v->off[id] = off;
    v->len[id] = (uint32_t)n;
    return true;
}

bool tok_vocab_build_index(tok_vocab *v) {
    uint32_t want = 16;
    while (want < (uint32_t)v->n * 2u + 16u) want *= 2;
    free(v->slots);
    v->slots = malloc((size_t)want * sizeof *v->slots);
    if (!v->slots) return false;
    v->n_slots = want;
    for (uint32_t i = 0; i < want; i++) v->slots[i] = -1;
    for (int32_t id = 0; id < v->n; id++) {
        if (v->off[id] == UINT32_MAX) continue;
        const char *s = v->arena.p + v->off[id];
        uint32_t n = v->len[id];
        uint32_t i = (uint32_t)hash_bytes(s, n) & (want - 1);
        for (;; i = (i + 1) & (want - 1)) {
            int32_t o = v->slots[i];
            if (o < 0) { v->slots[i] = id; break; }
            if (v->len[o] == n && memcmp(v->arena.p + v->off[o], s, n) == 0) { v->slots[i] = id; break; }
        }
    }
    return true;
}

int32_t tok_vocab_find(const tok_vocab *v, const char *s, size_t n) {
    if (!v->slots) return -1;
    uint32_t mask = v->n_slots - 1;
    for (uint32_t i = (uint32_t)hash_bytes(s, n) & mask;; i = (i + 1) & mask) {
        int32_t o = v->slots[i];
        if (o < 0) return -1;
        if (v->len[o] == n && memcmp(v->arena.p + v->off[o], s, n) == 0) return o;
    }
}

void tok_vocab_free(tok_vocab *v) {
    tok_buf_free(&v->arena);
    free(v->off);
    free(v->len);
    free(v->slots);
    memset(v, 0, sizeof *v);
}

/* ---- BPE merge table ------------------------------------------------------------------------ */
bool tok_merge_map_init(tok_merge_map *m, size_t n) {
    uint32_t cap = 16;
    while (cap < n * 2 + 16) cap *= 2;
    m->slots = malloc((size_t)cap * sizeof *m->slots);
    if (!m->slots) return false;
    for (uint32_t i = 0; i < cap; i++) m->slots[i].rank = -1;
    m->mask = cap - 1;
    return true;
}

void tok_merge_map_free(tok_merge_map *m) {
    free(m->slots);
    m->slots = NULL;
    m->mask = 0;
}

const tok_merge *tok_merge_find(const tok_merge_map *m, int32_t left, int32_t right) {
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    for (uint32_t i = (uint32_t)tok_mix64(key) & m->mask;; i = (i + 1) & m->mask) {
        const tok_merge *e = &m->slots[i];
        if (e->rank < 0) return NULL;
        if (e->key == key) return e;
    }
}

void tok_merge_put(tok_merge_map *m, int32_t left, int32_t right, int32_t rank, int32_t new_id) {
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    for (uint32_t i = (uint32_t)tok_mix64(key) & m->mask;; i = (i + 1) & m->mask) {
        tok_merge *e = &m->slots[i];
        if (e->rank < 0 || e->key == key) {
            *e = (tok_merge){key, rank, new_id};
            return;
        }
    }
}
