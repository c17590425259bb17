/* The native tokenizer (see tokenizer.h): every step mirrors its Python twin in ignis/tokenizer/,
 * whose comments say why each rule is what Hugging Face tokenizers does. The split regexes are not
 * run by a regex engine: each known pattern is a hand-written scanner whose alternatives are tried
 * in the pattern's order with its greedy/backtracking outcome worked out (see scan_qwen). */
#include "tokenizer.h"
#include "tok_unicode.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NONE_ID 0xFFFFFFFFu
#define N_SECTIONS 16
#define HEADER_WORDS 14
#define HEADER_BYTES (8 + 4 * HEADER_WORDS + 8 * N_SECTIONS)

enum { S_POOL, S_TOK_ENDS, S_TOK_FLAGS, S_FIRST_ENDS, S_BYTE_IDS, S_MERGES, S_VOCAB, S_ADDED_RAW,
       S_ADDED_NORM, S_NORM, S_PRE, S_PREFIX, S_SUFFIX, S_EOS };
enum { F_PRESENT = 1, F_SPECIAL = 2, F_BYTE = 4 };
enum { A_SPECIAL = 1, A_LSTRIP = 2, A_RSTRIP = 4, A_SINGLE_WORD = 8 };
enum { N_NFC = 1, N_REPLACE = 2, N_PREPEND = 3 };
enum { P_QWEN2 = 1, P_LLAMA3 = 2, P_GPT2 = 3, P_DIGITS = 4, P_METASPACE = 5, P_STRING = 6 };
enum { B_ISOLATED, B_REMOVED, B_MERGED_PREV, B_MERGED_NEXT, B_CONTIGUOUS };
enum { M_IGNORE_MERGES = 1, M_BYTE_FALLBACK = 2, M_FUSE_UNK = 4 };

/* ------------------------------------------------------------------ Unicode */

static inline unsigned prop(uint32_t c) {
    return c < 0x110000 ? tok_prop_blocks[tok_prop_index[c >> 8]][c & 255] : 0;
}
static inline unsigned ccc(uint32_t c) {
    return c < 0x110000 ? tok_ccc_blocks[tok_ccc_index[c >> 8]][c & 255] : 0;
}

/* Strict UTF-8 (no overlongs, surrogates or values past U+10FFFF): Unicode's Table 3-7. Returns
 * the length of the well-formed sequence at s[0..n), 0 if there is none; *need: bytes the longest
 * well-formed prefix takes (its maximal subpart), and whether it ran out of input (*partial). */
static size_t utf8_seq(const uint8_t *s, size_t n, size_t *sub, int *partial) {
    uint8_t b = s[0];
    size_t len;
    uint8_t lo = 0x80, hi = 0xBF;
    *partial = 0;
    if (b < 0x80) { *sub = 1; return 1; }
    if (b >= 0xC2 && b <= 0xDF) len = 2;
    else if (b >= 0xE0 && b <= 0xEF) { len = 3; if (b == 0xE0) lo = 0xA0; if (b == 0xED) hi = 0x9F; }
    else if (b >= 0xF0 && b <= 0xF4) { len = 4; if (b == 0xF0) lo = 0x90; if (b == 0xF4) hi = 0x8F; }
    else { *sub = 1; return 0; }
    for (size_t k = 1; k < len; k++) {
        if (k >= n) { *sub = k; *partial = 1; return 0; }
        uint8_t c = s[k];
        if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xBF)) { *sub = k; return 0; }
    }
    *sub = len;
    return len;
}

static int utf8_valid(const uint8_t *s, size_t n) {
    size_t i = 0, sub;
    int partial;
    while (i < n) {
        if (s[i] < 0x80) { i++; continue; }
        size_t l = utf8_seq(s + i, n - i, &sub, &partial);
        if (!l) return 0;
        i += l;
    }
    return 1;
}

/* Decode one character of valid UTF-8. */
static inline uint32_t dec(const uint8_t *s, size_t *len) {
    uint8_t b = s[0];
    if (b < 0x80) { *len = 1; return b; }
    if (b < 0xE0) { *len = 2; return ((uint32_t)(b & 0x1F) << 6) | (s[1] & 0x3F); }
    if (b < 0xF0) { *len = 3; return ((uint32_t)(b & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F); }
    *len = 4;
    return ((uint32_t)(b & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) | ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
}

static int in_runs(const uint32_t (*runs)[2], size_t n, uint32_t c) {
    size_t lo = 0, hi = n;          /* the first run that ends at or after c */
    while (lo < hi) {
        const size_t mid = lo + (hi - lo) / 2;
        if (runs[mid][1] < c) lo = mid + 1;
        else hi = mid;
    }
    return lo < n && runs[lo][0] <= c;
}

int ig_unicode_printable(uint32_t c) { return c < 0x110000 && !in_runs(tok_unprintable, TOK_UNPRINTABLE_N, c); }

int ig_unicode_identifier(const char *text, size_t n) {
    const uint8_t *s = (const uint8_t *)text;
    if (!n || !utf8_valid(s, n)) return 0;
    for (size_t i = 0, l; i < n; i += l) {
        const uint32_t c = dec(s + i, &l);
        if (i ? !in_runs(tok_xid_continue, TOK_XID_CONTINUE_N, c) : !in_runs(tok_xid_start, TOK_XID_START_N, c)) return 0;
    }
    return 1;
}

/* The character ending just before s[i] (valid UTF-8, i > 0). */
static inline uint32_t dec_before(const uint8_t *s, size_t i) {
    size_t k = i - 1, l;
    while (k > 0 && (s[k] & 0xC0) == 0x80) k--;
    return dec(s + k, &l);
}

static inline size_t enc(uint32_t c, uint8_t *o) {
    if (c < 0x80) { o[0] = (uint8_t)c; return 1; }
    if (c < 0x800) { o[0] = (uint8_t)(0xC0 | (c >> 6)); o[1] = (uint8_t)(0x80 | (c & 0x3F)); return 2; }
    if (c < 0x10000) {
        o[0] = (uint8_t)(0xE0 | (c >> 12)); o[1] = (uint8_t)(0x80 | ((c >> 6) & 0x3F));
        o[2] = (uint8_t)(0x80 | (c & 0x3F)); return 3;
    }
    o[0] = (uint8_t)(0xF0 | (c >> 18)); o[1] = (uint8_t)(0x80 | ((c >> 12) & 0x3F));
    o[2] = (uint8_t)(0x80 | ((c >> 6) & 0x3F)); o[3] = (uint8_t)(0x80 | (c & 0x3F)); return 4;
}

/* ------------------------------------------------------------------ growable buffers */

typedef struct { uint8_t *p; size_t n, cap; } bbuf;
typedef struct { int32_t *p; size_t n, cap; } ibuf;
typedef struct { uint32_t *p; size_t n, cap; } ubuf;
typedef struct { size_t off, len; } span;
typedef struct { span *p; size_t n, cap; } sbuf;
typedef struct { size_t *p; size_t n, cap; } zbuf;

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 16;
    while (c < need) {
        if (c > ((size_t)-1) / 4 / elem) return -1;
        c *= 2;
    }
    void *q = realloc(*p, c * elem);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}
#define GROW(b, need) grow((void **)&(b)->p, &(b)->cap, (need), sizeof(*(b)->p))

static int bput(bbuf *b, const void *d, size_t n) {
    if (GROW(b, b->n + n + 1)) return -1;
    if (n) memcpy(b->p + b->n, d, n);
    b->n += n;
    return 0;
}
static int iput(ibuf *b, int32_t v) {
    if (GROW(b, b->n + 1)) return -1;
    b->p[b->n++] = v;
    return 0;
}
static int uput(ubuf *b, uint32_t v) {
    if (GROW(b, b->n + 1)) return -1;
    b->p[b->n++] = v;
    return 0;
}
static int zput(zbuf *b, size_t v) {
    if (GROW(b, b->n + 1)) return -1;
    b->p[b->n++] = v;
    return 0;
}
static int sput(sbuf *b, size_t off, size_t len) {
    if (GROW(b, b->n + 1)) return -1;
    b->p[b->n].off = off;
    b->p[b->n].len = len;
    b->n++;
    return 0;
}

/* ------------------------------------------------------------------ the handle */

typedef struct { int32_t child[256]; } trie_root;
typedef struct { int32_t first, next, entry; uint8_t byte; } trie_node;
typedef struct {
    const uint32_t *entries;  /* off, len, id, flags */
    uint32_t n;
    int32_t root[256];
    trie_node *nodes;
    uint32_t n_nodes;
} trie;

struct ig_tok {
    uint8_t *blob;
    size_t len;
    uint32_t V, kind, flags;
    int32_t unk;
    uint32_t dec_kind, strip_char, strip_left, metaspace;
    int32_t bos, pad, eos;
    const uint8_t *pool;
    uint32_t pool_len;
    const uint32_t *tok_ends, *first_ends;
    const uint8_t *tok_flags;
    const int32_t *byte_ids;
    int all_byte_tokens, some_byte_tokens;
    const int32_t *merges;
    uint32_t n_merges, merge_mask;
    int32_t *merge_hash;     /* index into merges, -1 empty */
    const uint32_t *vocab;
    uint32_t n_vocab, vocab_mask;
    int32_t *vocab_hash;
    trie raw, norm;
    const uint32_t *norm_ops, *pre_ops;
    uint32_t n_norm, n_pre;
    const int32_t *prefix, *suffix, *eos_ids;
    uint32_t n_prefix, n_suffix, n_eos;
};

static void set_err(char *err, int err_len, const char *fmt, ...) {
    if (!err || err_len <= 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, (size_t)err_len, fmt, ap);
    va_end(ap);
}

static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static inline uint64_t hash64(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL; x ^= x >> 33;
    return x;
}
static inline uint64_t hash_bytes(const uint8_t *s, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) { h ^= s[i]; h *= 1099511628211ULL; }
    return hash64(h);
}

static uint32_t table_size(uint32_t n) {
    uint32_t s = 16;
    while (s < 2 * (uint64_t)n + 1) s *= 2;
    return s;
}

static int merge_find(const ig_tok *t, int32_t a, int32_t b, int32_t *rank, int32_t *merged) {
    if (!t->n_merges) return 0;
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint32_t h = (uint32_t)hash64(key) & t->merge_mask;
    for (;;) {
        int32_t k = t->merge_hash[h];
        if (k < 0) return 0;
        const int32_t *m = t->merges + 4 * (size_t)k;
        if (m[0] == a && m[1] == b) { *merged = m[2]; *rank = m[3]; return 1; }
        h = (h + 1) & t->merge_mask;
    }
}

static int32_t vocab_find(const ig_tok *t, const uint8_t *s, size_t n) {
    if (!t->n_vocab) return -1;
    uint32_t h = (uint32_t)hash_bytes(s, n) & t->vocab_mask;
    for (;;) {
        int32_t k = t->vocab_hash[h];
        if (k < 0) return -1;
        const uint32_t *e = t->vocab + 3 * (size_t)k;
        if (e[1] == n && memcmp(t->pool + e[0], s, n) == 0) return (int32_t)e[2];
        h = (h + 1) & t->vocab_mask;
    }
}

static int trie_build(trie *tr, const uint8_t *pool) {
    for (int i = 0; i < 256; i++) tr->root[i] = -1;
    size_t total = 0;
    for (uint32_t k = 0; k < tr->n; k++) total += tr->entries[4 * (size_t)k + 1];
    tr->nodes = malloc((total + 1) * sizeof(trie_node));
    if (!tr->nodes) return -1;
    tr->n_nodes = 0;
    for (uint32_t k = 0; k < tr->n; k++) {
        const uint32_t *e = tr->entries + 4 * (size_t)k;
        const uint8_t *s = pool + e[0];
        int32_t *link = &tr->root[s[0]];
        int32_t node = -1;
        for (uint32_t i = 0; i < e[1]; i++) {
            if (i > 0) link = &tr->nodes[node].first;
            int32_t c = *link;
            while (c >= 0 && tr->nodes[c].byte != s[i]) c = tr->nodes[c].next;
            if (c < 0) {
                c = (int32_t)tr->n_nodes++;
                tr->nodes[c].byte = s[i];
                tr->nodes[c].first = -1;
                tr->nodes[c].entry = -1;
                tr->nodes[c].next = i > 0 ? tr->nodes[node].first : tr->root[s[0]];
                if (i > 0) tr->nodes[node].first = c;
                else tr->root[s[0]] = c;
            }
            node = c;
        }
        if (tr->nodes[node].entry < 0) tr->nodes[node].entry = (int32_t)k;    /* first spelling wins */
    }
    return 0;
}

/* The longest entry starting at s[0..n): its index, and its length in *mlen; -1 if none. */
static int32_t trie_longest(const trie *tr, const uint8_t *s, size_t n, size_t *mlen) {
    int32_t node = tr->root[s[0]], best = -1;
    size_t i = 0;
    while (node >= 0) {
        if (tr->nodes[node].entry >= 0) { best = tr->nodes[node].entry; *mlen = i + 1; }
        if (++i >= n) break;
        int32_t c = tr->nodes[node].first;
        while (c >= 0 && tr->nodes[c].byte != s[i]) c = tr->nodes[c].next;
        node = c;
    }
    return best;
}

void ig_tok_free(ig_tok *t) {
    if (!t) return;
    free(t->merge_hash);
    free(t->vocab_hash);
    free(t->raw.nodes);
    free(t->norm.nodes);
    free(t->blob);
    free(t);
}

const char *ig_tok_strerror(int code) {
    switch (code) {
    case IG_TOK_OK: return "ok";
    case IG_TOK_ERR_UTF8: return "text is not valid UTF-8";
    case IG_TOK_ERR_NOMEM: return "out of memory";
    case IG_TOK_ERR_ID: return "token id is not in the vocabulary";
    case IG_TOK_ERR_ARG: return "bad argument";
    case IG_TOK_ERR_STATE: return "stream already finished";
    case IG_TOK_ERR_TOO_LONG: return "text longer than IG_TOK_MAX_TEXT bytes";
    default: return "unknown error";
    }
}

#define FAIL(...) do { set_err(err, err_len, __VA_ARGS__); ig_tok_free(t); return NULL; } while (0)

ig_tok *ig_tok_open(const void *blob, size_t len, char *err, int err_len) {
    ig_tok *t = NULL;
    const uint16_t one = 1;
    if (*(const uint8_t *)&one != 1) FAIL("tokenizer blob: big-endian hosts are not supported");
    if (!blob) FAIL("tokenizer blob: NULL");
    if (len < HEADER_BYTES) FAIL("tokenizer blob: %zu bytes, shorter than its %d-byte header", len, HEADER_BYTES);
    if (len > 0xFFFFFFF0u) FAIL("tokenizer blob: %zu bytes, more than 4 GB", len);
    const uint8_t *b = blob;
    if (memcmp(b, "IGNTOKB1", 8) != 0) FAIL("tokenizer blob: bad magic (not a tokenizer section)");
    uint32_t h[HEADER_WORDS];
    for (int i = 0; i < HEADER_WORDS; i++) h[i] = rd32(b + 8 + 4 * i);
    if (h[0] != IG_TOK_BLOB_VERSION) FAIL("tokenizer blob: version %u, this library reads version %d", h[0], IG_TOK_BLOB_VERSION);
    if (h[1] != len) FAIL("tokenizer blob: header says %u bytes, got %zu (truncated?)", h[1], len);
    t = calloc(1, sizeof(*t));
    if (!t) FAIL("out of memory");
    t->blob = malloc(len);
    if (!t->blob) FAIL("out of memory");
    memcpy(t->blob, blob, len);
    t->len = len;
    b = t->blob;
    t->V = h[2]; t->kind = h[3]; t->flags = h[4]; t->unk = (int32_t)h[5];
    t->dec_kind = h[6]; t->strip_char = h[7]; t->strip_left = h[8]; t->metaspace = h[9];
    t->bos = (int32_t)h[10]; t->pad = (int32_t)h[11]; t->eos = (int32_t)h[12];
    if (t->V == 0 || t->V > (1u << 24)) FAIL("tokenizer blob: vocab_size %u not in 1..2^24", t->V);
    if (t->kind > 1 || t->dec_kind > 1 || t->flags > 7 || t->metaspace > 1)
        FAIL("tokenizer blob: unknown model/decoder kind or flags");
    if (t->strip_char >= 0x110000 || (t->strip_char >= 0xD800 && t->strip_char < 0xE000))
        FAIL("tokenizer blob: strip character is not a Unicode scalar value");
    const int32_t *optional[] = {&t->unk, &t->bos, &t->pad, &t->eos};
    for (int i = 0; i < 4; i++)
        if (*optional[i] != -1 && (*optional[i] < 0 || (uint32_t)*optional[i] >= t->V))
            FAIL("tokenizer blob: special id %d out of range 0..%u", *optional[i], t->V - 1);
    uint32_t off[N_SECTIONS], sz[N_SECTIONS];
    for (int s = 0; s < N_SECTIONS; s++) {
        off[s] = rd32(b + 8 + 4 * HEADER_WORDS + 8 * s);
        sz[s] = rd32(b + 8 + 4 * HEADER_WORDS + 8 * s + 4);
        if (sz[s] && (off[s] < HEADER_BYTES || off[s] > len || sz[s] > len - off[s] || off[s] % 4))
            FAIL("tokenizer blob: section %d (offset %u, %u bytes) lies outside the blob or is misaligned", s, off[s], sz[s]);
    }
    t->pool = b + off[S_POOL];
    t->pool_len = sz[S_POOL];
#define SEC(s, type) ((const type *)(b + off[s]))
    if (sz[S_TOK_ENDS] != 4 * (t->V + 1)) FAIL("tokenizer blob: tok_ends holds %u bytes, not %u", sz[S_TOK_ENDS], 4 * (t->V + 1));
    if (sz[S_TOK_FLAGS] != t->V) FAIL("tokenizer blob: tok_flags holds %u bytes, not %u", sz[S_TOK_FLAGS], t->V);
    t->tok_ends = SEC(S_TOK_ENDS, uint32_t);
    t->tok_flags = SEC(S_TOK_FLAGS, uint8_t);
    for (uint32_t i = 0; i < t->V; i++)
        if (t->tok_ends[i] > t->tok_ends[i + 1] || t->tok_ends[i + 1] > t->pool_len)
            FAIL("tokenizer blob: token %u's bytes lie outside the pool", i);
    for (uint32_t i = 0; i < t->V; i++) {
        uint8_t f = t->tok_flags[i];
        if (f & ~7u || (!(f & F_PRESENT) && f) || ((f & F_BYTE) && t->tok_ends[i + 1] - t->tok_ends[i] != 1))
            FAIL("tokenizer blob: token %u has bad flags %u", i, f);
    }
    if (t->dec_kind == 1 && t->metaspace) {
        if (sz[S_FIRST_ENDS] != 4 * (t->V + 1)) FAIL("tokenizer blob: metaspace decoder without first_ends");
        t->first_ends = SEC(S_FIRST_ENDS, uint32_t);
        for (uint32_t i = 0; i < t->V; i++)
            if (t->first_ends[i] > t->first_ends[i + 1] || t->first_ends[i + 1] > t->pool_len
                || !utf8_valid(t->pool + t->first_ends[i], t->first_ends[i + 1] - t->first_ends[i]))
                FAIL("tokenizer blob: first_ends of token %u is bad", i);
    }
    for (uint32_t i = 0; t->dec_kind == 1 && i < t->V; i++)
        if ((t->tok_flags[i] & (F_PRESENT | F_BYTE)) == F_PRESENT
            && !utf8_valid(t->pool + t->tok_ends[i], t->tok_ends[i + 1] - t->tok_ends[i]))
            FAIL("tokenizer blob: text token %u is not valid UTF-8", i);
    if (sz[S_BYTE_IDS] != 1024) FAIL("tokenizer blob: byte_ids holds %u bytes, not 1024", sz[S_BYTE_IDS]);
    t->byte_ids = SEC(S_BYTE_IDS, int32_t);
    t->all_byte_tokens = 1;
    for (int i = 0; i < 256; i++) {
        int32_t v = t->byte_ids[i];
        if (v < -1 || v >= (int32_t)t->V) FAIL("tokenizer blob: byte %d's token %d out of range", i, v);
        if (v < 0) t->all_byte_tokens = 0; else t->some_byte_tokens = 1;
    }
    if (sz[S_MERGES] % 16) FAIL("tokenizer blob: merges section is not a whole number of rows");
    t->merges = SEC(S_MERGES, int32_t);
    t->n_merges = sz[S_MERGES] / 16;
    if (t->n_merges) {
        t->merge_mask = table_size(t->n_merges) - 1;
        t->merge_hash = malloc(((size_t)t->merge_mask + 1) * sizeof(int32_t));
        if (!t->merge_hash) FAIL("out of memory");
        memset(t->merge_hash, 0xFF, ((size_t)t->merge_mask + 1) * sizeof(int32_t));
        for (uint32_t k = 0; k < t->n_merges; k++) {
            const int32_t *m = t->merges + 4 * (size_t)k;
            for (int j = 0; j < 3; j++)
                if (m[j] < 0 || (uint32_t)m[j] >= t->V) FAIL("tokenizer blob: merge %u names id %d out of range", k, m[j]);
            if (m[3] < 0) FAIL("tokenizer blob: merge %u has a negative rank", k);
            uint64_t key = ((uint64_t)(uint32_t)m[0] << 32) | (uint32_t)m[1];
            uint32_t hh = (uint32_t)hash64(key) & t->merge_mask;
            while (t->merge_hash[hh] >= 0) {
                const int32_t *o = t->merges + 4 * (size_t)t->merge_hash[hh];
                if (o[0] == m[0] && o[1] == m[1]) FAIL("tokenizer blob: merge %u repeats a pair", k);
                hh = (hh + 1) & t->merge_mask;
            }
            t->merge_hash[hh] = (int32_t)k;
        }
    }
    if (sz[S_VOCAB] % 12) FAIL("tokenizer blob: vocab section is not a whole number of rows");
    t->vocab = SEC(S_VOCAB, uint32_t);
    t->n_vocab = sz[S_VOCAB] / 12;
    if (t->n_vocab) {
        t->vocab_mask = table_size(t->n_vocab) - 1;
        t->vocab_hash = malloc(((size_t)t->vocab_mask + 1) * sizeof(int32_t));
        if (!t->vocab_hash) FAIL("out of memory");
        memset(t->vocab_hash, 0xFF, ((size_t)t->vocab_mask + 1) * sizeof(int32_t));
        for (uint32_t k = 0; k < t->n_vocab; k++) {
            const uint32_t *e = t->vocab + 3 * (size_t)k;
            if (e[0] > t->pool_len || e[1] > t->pool_len - e[0] || e[2] >= t->V)
                FAIL("tokenizer blob: vocabulary entry %u is out of range", k);
            uint32_t hh = (uint32_t)hash_bytes(t->pool + e[0], e[1]) & t->vocab_mask;
            while (t->vocab_hash[hh] >= 0) {
                const uint32_t *o = t->vocab + 3 * (size_t)t->vocab_hash[hh];
                if (o[1] == e[1] && memcmp(t->pool + o[0], t->pool + e[0], e[1]) == 0)
                    FAIL("tokenizer blob: vocabulary entry %u repeats a key", k);
                hh = (hh + 1) & t->vocab_mask;
            }
            t->vocab_hash[hh] = (int32_t)k;
        }
    }
    trie *tries[2] = {&t->raw, &t->norm};
    for (int w = 0; w < 2; w++) {
        int s = w ? S_ADDED_NORM : S_ADDED_RAW;
        if (sz[s] % 16) FAIL("tokenizer blob: added-token section is not a whole number of rows");
        tries[w]->entries = SEC(s, uint32_t);
        tries[w]->n = sz[s] / 16;
        for (uint32_t k = 0; k < tries[w]->n; k++) {
            const uint32_t *e = tries[w]->entries + 4 * (size_t)k;
            if (e[1] == 0 || e[0] > t->pool_len || e[1] > t->pool_len - e[0] || e[2] >= t->V || e[3] > 15
                || !utf8_valid(t->pool + e[0], e[1]))
                FAIL("tokenizer blob: added token %u is out of range, empty or not UTF-8", k);
        }
        for (int i = 0; i < 256; i++) tries[w]->root[i] = -1;
        if (tries[w]->n && trie_build(tries[w], t->pool)) FAIL("out of memory");
    }
    if (sz[S_NORM] % 20 || sz[S_PRE] % 24) FAIL("tokenizer blob: pipeline sections are not whole rows");
    t->norm_ops = SEC(S_NORM, uint32_t);
    t->n_norm = sz[S_NORM] / 20;
    t->pre_ops = SEC(S_PRE, uint32_t);
    t->n_pre = sz[S_PRE] / 24;
    for (uint32_t k = 0; k < t->n_norm; k++) {
        const uint32_t *o = t->norm_ops + 5 * (size_t)k;
        if (o[0] < N_NFC || o[0] > N_PREPEND || o[1] > t->pool_len || o[2] > t->pool_len - o[1]
            || o[3] > t->pool_len || o[4] > t->pool_len - o[3]
            || !utf8_valid(t->pool + o[1], o[2]) || !utf8_valid(t->pool + o[3], o[4])
            || (o[0] == N_REPLACE && o[2] == 0))
            FAIL("tokenizer blob: normalizer %u is malformed", k);
    }
    for (uint32_t k = 0; k < t->n_pre; k++) {
        const uint32_t *o = t->pre_ops + 6 * (size_t)k;
        if (o[0] < P_QWEN2 || o[0] > P_STRING || o[1] > B_CONTIGUOUS || o[2] > 2 || o[3] > 1
            || o[4] > t->pool_len || o[5] > t->pool_len - o[4] || !utf8_valid(t->pool + o[4], o[5]))
            FAIL("tokenizer blob: pre-tokenizer step %u is malformed", k);
        if (o[0] == P_METASPACE) {
            size_t l;
            if (o[5] == 0 || (dec(t->pool + o[4], &l), l != o[5]))
                FAIL("tokenizer blob: Metaspace replacement is not one character");
        }
    }
    const int32_t **lists[3] = {&t->prefix, &t->suffix, &t->eos_ids};
    uint32_t *counts[3] = {&t->n_prefix, &t->n_suffix, &t->n_eos};
    for (int w = 0; w < 3; w++) {
        int s = S_PREFIX + w;
        if (sz[s] % 4) FAIL("tokenizer blob: id list %d is not whole ids", s);
        *lists[w] = SEC(s, int32_t);
        *counts[w] = sz[s] / 4;
        for (uint32_t k = 0; k < *counts[w]; k++)
            if ((*lists[w])[k] < 0 || (uint32_t)(*lists[w])[k] >= t->V)
                FAIL("tokenizer blob: id %d in list %d out of range", (*lists[w])[k], s);
    }
#undef SEC
    return t;
}
#undef FAIL

/* ------------------------------------------------------------------ encode: scratch */

typedef struct { int32_t rank, pos, merged; } hent;     /* a pair to merge, in the BPE heap */
typedef struct { hent *p; size_t n, cap; } hbuf;

typedef struct {
    const ig_tok *t;
    int err;
    ibuf out;
    bbuf norm, norm2, arena;    /* normalized text; pre-tokenizer text */
    bbuf unmask;                /* a piece with its mask characters put back */
    sbuf pieces, pieces2, spans;
    ubuf flags;                 /* is_match per span */
    ubuf cps, cps2;             /* code points */
    zbuf offs;                  /* byte offset of each code point */
    bbuf props;
    ibuf sym, nxt, prv;
    hbuf heap;
} ctx;

static void ctx_free(ctx *c) {
    free(c->out.p); free(c->norm.p); free(c->norm2.p); free(c->arena.p); free(c->unmask.p);
    free(c->pieces.p); free(c->pieces2.p); free(c->spans.p); free(c->flags.p);
    free(c->cps.p); free(c->cps2.p); free(c->offs.p); free(c->props.p);
    free(c->sym.p); free(c->nxt.p); free(c->prv.p);
    free(c->heap.p);
}

#define CHECK(expr) do { if (expr) { c->err = IG_TOK_ERR_NOMEM; return; } } while (0)

/* ------------------------------------------------------------------ BPE */

static inline int hless(const hent *a, const hent *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}
static int hpush(ctx *c, int32_t rank, int32_t pos, int32_t merged) {
    if (GROW(&c->heap, c->heap.n + 1)) return -1;
    hent *h = c->heap.p, e = {rank, pos, merged};
    size_t i = c->heap.n++;
    while (i > 0 && hless(&e, &h[(i - 1) / 2])) { h[i] = h[(i - 1) / 2]; i = (i - 1) / 2; }
    h[i] = e;
    return 0;
}
static void hpop(ctx *c, hent *e) {
    hent *h = c->heap.p;
    *e = h[0];
    size_t n = --c->heap.n;
    if (!n) return;
    hent last = h[n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        const hent *best = &last;
        if (l < n && hless(&h[l], best)) { m = l; best = &h[l]; }
        if (l + 1 < n && hless(&h[l + 1], best)) m = l + 1;
        if (m == i) break;
        h[i] = h[m];
        i = m;
    }
    h[i] = last;
}

/* Merge the symbols c->sym (lowest rank first, leftmost on ties) and append them to c->out:
 * a scan for short words (bpe_word_ref), the heap of tokenizers' Word::merge_all for long ones. */
static void bpe_merge_out(ctx *c) {
    const ig_tok *t = c->t;
    int32_t *s = c->sym.p;
    size_t n = c->sym.n;
    if (n <= 64) {      /* the scan, with each adjacent pair's rank kept (rank[i]: s[i], s[i+1]) */
        int32_t rank[64], made[64], r, m;
        for (size_t i = 0; i + 1 < n; i++) rank[i] = merge_find(t, s[i], s[i + 1], &r, &made[i]) ? r : -1;
        while (n > 1) {
            size_t best = (size_t)-1;
            for (size_t i = 0; i + 1 < n; i++)
                if (rank[i] >= 0 && (best == (size_t)-1 || rank[i] < rank[best])) best = i;
            if (best == (size_t)-1) break;
            s[best] = made[best];
            memmove(s + best + 1, s + best + 2, (n - best - 2) * sizeof(int32_t));
            if (best + 2 < n) {
                memmove(rank + best + 1, rank + best + 2, (n - best - 3) * sizeof(int32_t));
                memmove(made + best + 1, made + best + 2, (n - best - 3) * sizeof(int32_t));
            }
            n--;
            if (best + 1 < n) rank[best] = merge_find(t, s[best], s[best + 1], &r, &m) ? (made[best] = m, r) : -1;
            if (best > 0) rank[best - 1] = merge_find(t, s[best - 1], s[best], &r, &m) ? (made[best - 1] = m, r) : -1;
        }
        for (size_t i = 0; i < n; i++) CHECK(iput(&c->out, s[i]));
        return;
    }
    CHECK(GROW(&c->nxt, n) || GROW(&c->prv, n));
    int32_t *nxt = c->nxt.p, *prv = c->prv.p;    /* prv[i] == -2: merged away */
    c->heap.n = 0;
    for (size_t i = 0; i < n; i++) { nxt[i] = i + 1 < n ? (int32_t)(i + 1) : -1; prv[i] = (int32_t)i - 1; }
    int32_t r, m;
    for (size_t i = 0; i + 1 < n; i++)
        if (merge_find(t, s[i], s[i + 1], &r, &m)) CHECK(hpush(c, r, (int32_t)i, m));
    while (c->heap.n) {
        hent e;
        hpop(c, &e);
        int32_t i = e.pos, j = nxt[i];
        if (prv[i] == -2 || j < 0) continue;
        if (!merge_find(t, s[i], s[j], &r, &m) || m != e.merged) continue;
        s[i] = m;
        prv[j] = -2;
        int32_t k = nxt[j];
        nxt[i] = k;
        if (k >= 0) prv[k] = i;
        int32_t p = prv[i];
        if (p >= 0 && merge_find(t, s[p], m, &r, &m)) CHECK(hpush(c, r, p, m));
        m = s[i];
        if (k >= 0 && merge_find(t, m, s[k], &r, &m)) CHECK(hpush(c, r, i, m));
    }
    for (int32_t i = 0; i >= 0; i = nxt[i]) CHECK(iput(&c->out, s[i]));
}

/* One pre-token of a byte-level model (BPEModel.encode_words). */
static void encode_word_bytes(ctx *c, const uint8_t *w, size_t n) {
    const ig_tok *t = c->t;
    if (t->flags & M_IGNORE_MERGES) {
        int32_t id = vocab_find(t, w, n);
        if (id >= 0) { CHECK(iput(&c->out, id)); return; }
    }
    c->sym.n = 0;
    CHECK(GROW(&c->sym, n + 1));
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_ids[w[i]];
        if (id >= 0) c->sym.p[c->sym.n++] = id;
    }
    bpe_merge_out(c);
}

/* One word of a SentencePiece-style model (CharBPEModel.initial_symbols, then the merges). */
static void encode_word_chars(ctx *c, const uint8_t *w, size_t n) {
    const ig_tok *t = c->t;
    if (!n) return;
    if (t->flags & M_IGNORE_MERGES) {
        int32_t id = vocab_find(t, w, n);
        if (id >= 0) { CHECK(iput(&c->out, id)); return; }
    }
    c->sym.n = 0;
    int unk_pending = 0;
    int fallback = (t->flags & M_BYTE_FALLBACK) != 0;
    for (size_t i = 0; i < n;) {
        size_t l;
        dec(w + i, &l);
        int32_t id = vocab_find(t, w + i, l);
        if (id >= 0) {
            if (unk_pending) { CHECK(iput(&c->sym, t->unk)); unk_pending = 0; }
            CHECK(iput(&c->sym, id));
            i += l;
            continue;
        }
        if (fallback && t->some_byte_tokens) {
            int all = 1;
            for (size_t k = 0; k < l; k++) all &= t->byte_ids[w[i + k]] >= 0;
            if (all) {     /* a pending unk stays pending, as in tokenizers */
                for (size_t k = 0; k < l; k++) CHECK(iput(&c->sym, t->byte_ids[w[i + k]]));
                i += l;
                continue;
            }
        }
        if (t->unk >= 0) {
            if (unk_pending && !(t->flags & M_FUSE_UNK)) CHECK(iput(&c->sym, t->unk));
            unk_pending = 1;
        }
        i += l;
    }
    if (unk_pending) CHECK(iput(&c->sym, t->unk));
    bpe_merge_out(c);
}

/* ------------------------------------------------------------------ normalizers */

static int compose_pair(uint32_t a, uint32_t b, uint32_t *out) {
    if (a >= 0x1100 && a < 0x1113 && b >= 0x1161 && b < 0x1176) {          /* Hangul L + V */
        *out = 0xAC00 + ((a - 0x1100) * 21 + (b - 0x1161)) * 28;
        return 1;
    }
    if (a >= 0xAC00 && a < 0xD7A4 && (a - 0xAC00) % 28 == 0 && b > 0x11A7 && b < 0x11C3) {   /* LV + T */
        *out = a + (b - 0x11A7);
        return 1;
    }
    size_t lo = 0, hi = TOK_N_COMPOSE;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const uint32_t *p = tok_compose[mid];
        if (p[0] < a || (p[0] == a && p[1] < b)) lo = mid + 1;
        else hi = mid;
    }
    if (lo < TOK_N_COMPOSE && tok_compose[lo][0] == a && tok_compose[lo][1] == b) {
        *out = tok_compose[lo][2];
        return 1;
    }
    return 0;
}

static int decompose(uint32_t cp, ubuf *o) {
    if (cp >= 0xAC00 && cp < 0xD7A4) {
        uint32_t s = cp - 0xAC00;
        if (uput(o, 0x1100 + s / 588) || uput(o, 0x1161 + (s % 588) / 28)) return -1;
        return s % 28 ? uput(o, 0x11A7 + s % 28) : 0;
    }
    if (cp >= 0xC0) {
        size_t lo = 0, hi = TOK_N_DECOMP;
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (tok_decomp[mid][0] < cp) lo = mid + 1; else hi = mid;
        }
        if (lo < TOK_N_DECOMP && tok_decomp[lo][0] == cp) {
            for (uint32_t k = 0; k < tok_decomp[lo][2]; k++)
                if (uput(o, tok_decomp_pool[tok_decomp[lo][1] + k])) return -1;
            return 0;
        }
    }
    return uput(o, cp);
}

/* NFC of cps[a..b) appended to out as UTF-8 (decompose, order marks, compose). */
static void nfc_segment(ctx *c, const uint32_t *cps, size_t a, size_t b, bbuf *out) {
    uint8_t tmp[4];
    size_t k;
    for (k = a; k < b && !(prop(cps[k]) & TP_NFC_MAYBE); k++) {}
    if (k == b) {       /* nothing NFC could change */
        for (k = a; k < b; k++) CHECK(bput(out, tmp, enc(cps[k], tmp)));
        return;
    }
    ubuf *d = &c->cps2;
    d->n = 0;
    for (size_t i = a; i < b; i++) CHECK(decompose(cps[i], d));
    uint32_t *s = d->p;
    size_t n = d->n;
    for (size_t i = 1; i < n; i++) {          /* canonical order: stable by class, marks only */
        unsigned ci = ccc(s[i]);
        if (!ci) continue;
        size_t j = i;
        while (j > 0 && ccc(s[j - 1]) > ci) { uint32_t x = s[j]; s[j] = s[j - 1]; s[j - 1] = x; j--; }
    }
    if (n) {
        size_t starter = 0, len = 1;
        unsigned last = ccc(s[0]);
        int have_starter = last == 0;
        if (last) last = 256;
        for (size_t i = 1; i < n; i++) {
            uint32_t ch = s[i], comp;
            unsigned cc = ccc(ch);
            if (have_starter && (last < cc || last == 0) && compose_pair(s[starter], ch, &comp)) {
                s[starter] = comp;
                continue;
            }
            if (cc == 0) { starter = len; have_starter = 1; }
            last = cc;
            s[len++] = ch;
        }
        n = len;
    }
    for (size_t i = 0; i < n; i++) CHECK(bput(out, tmp, enc(s[i], tmp)));
}

/* NFC as ignis does it: around the INERT characters (tokenizers' older Unicode leaves them be). */
static void nfc(ctx *c, const uint8_t *s, size_t n, bbuf *out) {
    size_t i;
    for (i = 0; i < n && s[i] < 0x80; i++) {}
    if (i == n) { CHECK(bput(out, s, n)); return; }
    int plain = 1;      /* nothing NFC could change, no INERT boundary: the text is its NFC */
    for (size_t k = i; k < n && plain;) {
        size_t l;
        plain = !(prop(dec(s + k, &l)) & (TP_NFC_MAYBE | TP_INERT));
        k += l;
    }
    if (plain) { CHECK(bput(out, s, n)); return; }
    ubuf *cp = &c->cps;
    cp->n = 0;
    for (size_t k = 0; k < n;) { size_t l; CHECK(uput(cp, dec(s + k, &l))); k += l; }
    size_t start = 0;
    for (size_t k = 0; k < cp->n; k++) {
        if (prop(cp->p[k]) & TP_INERT) {
            nfc_segment(c, cp->p, start, k, out);
            uint8_t tmp[4];
            CHECK(bput(out, tmp, enc(cp->p[k], tmp)));
            start = k + 1;
        }
    }
    nfc_segment(c, cp->p, start, cp->n, out);
}

static void replace_all(ctx *c, const uint8_t *s, size_t n, const uint8_t *pat, size_t pl,
                        const uint8_t *rep, size_t rl, bbuf *out) {
    size_t i = 0;
    while (i < n) {
        if (i + pl <= n && s[i] == pat[0] && memcmp(s + i, pat, pl) == 0) {
            CHECK(bput(out, rep, rl));
            i += pl;
        } else {
            CHECK(bput(out, s + i, 1));
            i++;
        }
    }
}

/* The normalized text of s in c->norm (its bytes: *r, *rn). */
static void normalize(ctx *c, const uint8_t *s, size_t n, const uint8_t **r, size_t *rn) {
    const ig_tok *t = c->t;
    *r = s;
    *rn = n;
    for (uint32_t k = 0; k < t->n_norm && !c->err; k++) {
        const uint32_t *o = t->norm_ops + 5 * (size_t)k;
        bbuf *dst = (*r == c->norm.p) ? &c->norm2 : &c->norm;
        dst->n = 0;
        if (o[0] == N_NFC) nfc(c, *r, *rn, dst);
        else if (o[0] == N_REPLACE) replace_all(c, *r, *rn, t->pool + o[1], o[2], t->pool + o[3], o[4], dst);
        else if (*rn) { CHECK(bput(dst, t->pool + o[1], o[2])); CHECK(bput(dst, *r, *rn)); }
        if (c->err) return;
        if (!dst->p) CHECK(GROW(dst, 1));
        *r = dst->p;
        *rn = dst->n;
    }
}

/* ------------------------------------------------------------------ pre-tokenizers */

static inline int is_ws(unsigned p) { return (p & TP_WS) != 0; }
static inline int is_l(unsigned p) { return (p & TP_L) != 0; }
static inline int is_n(unsigned p) { return (p & TP_N) != 0; }
static inline int is_nl(uint32_t c) { return c == '\r' || c == '\n'; }

/* \s+(?!\S) then \s+, from a whitespace run [i, j): where the match ends (i: none). */
static size_t ws_tail(size_t i, size_t j, size_t n) {
    if (j == i) return i;
    if (j == n) return n;          /* (?!\S) holds at the end */
    if (j - 1 > i) return j - 1;   /* back off one: the last space goes with what follows */
    return j;                      /* \s+ */
}

/* The match of Qwen2's (llama3: Llama 3's) split pattern at i, or i: the alternatives
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d) | [^\r\n\p{L}\p{N}]?\p{L}+ | \p{N} ({1,3} for Llama 3)
 *   | ?[^\s\p{L}\p{N}]+[\r\n]* | \s*[\r\n]+ | \s+(?!\S) | \s+
 * tried in order, as the `regex` package does. */
static size_t scan_qwen(const uint32_t *c, const uint8_t *p, size_t n, size_t i, int llama3) {
    if (c[i] == '\'' && i + 1 < n) {
        uint32_t x = c[i + 1] | 0x20, y = i + 2 < n ? (c[i + 2] | 0x20) : 0;
        if (c[i + 1] == 0x17F || (c[i + 1] < 0x80 && (x == 's' || x == 't' || x == 'm' || x == 'd'))) return i + 2;
        if (c[i + 1] < 0x80 && i + 2 < n && c[i + 2] < 0x80 &&
            ((x == 'r' && y == 'e') || (x == 'v' && y == 'e') || (x == 'l' && y == 'l'))) return i + 3;
    }
    size_t j = i;
    if (!is_nl(c[i]) && !is_l(p[i]) && !is_n(p[i]) && i + 1 < n && is_l(p[i + 1])) j = i + 1;
    if (is_l(p[j])) {
        while (j < n && is_l(p[j])) j++;
        return j;
    }
    if (is_n(p[i])) {
        j = i + 1;
        if (llama3) while (j < n && j < i + 3 && is_n(p[j])) j++;
        return j;
    }
#define PUNCT(k) (!is_ws(p[k]) && !is_l(p[k]) && !is_n(p[k]))
    j = i;
    if (c[j] == ' ' && j + 1 < n && PUNCT(j + 1)) j++;
    if (PUNCT(j)) {
        while (j < n && PUNCT(j)) j++;
        while (j < n && is_nl(c[j])) j++;
        return j;
    }
    j = i;
    while (j < n && is_ws(p[j])) j++;
    if (j > i) {
        for (size_t k = j; k > i; k--)
            if (is_nl(c[k - 1])) return k;      /* \s*[\r\n]+: up to the last line break */
    }
    return ws_tail(i, j, n);
}

/* GPT-2's pattern: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t scan_gpt2(const uint32_t *c, const uint8_t *p, size_t n, size_t i) {
    if (c[i] == '\'' && i + 1 < n) {
        uint32_t x = c[i + 1], y = i + 2 < n ? c[i + 2] : 0;
        if (x == 's' || x == 't' || x == 'm' || x == 'd') return i + 2;
        if ((x == 'r' && y == 'e') || (x == 'v' && y == 'e') || (x == 'l' && y == 'l')) return i + 3;
    }
    /* " ?" then a class: a space is in none of the classes, so the space-less try only matters
     * when c[i] is not a space */
    size_t a = (c[i] == ' ' && i + 1 < n) ? i + 1 : i, j;
    if (is_l(p[a])) { for (j = a; j < n && is_l(p[j]); j++) {} return j; }
    if (is_n(p[a])) { for (j = a; j < n && is_n(p[j]); j++) {} return j; }
    if (PUNCT(a)) { for (j = a; j < n && PUNCT(j); j++) {} return j; }
    j = i;
    while (j < n && is_ws(p[j])) j++;
    return ws_tail(i, j, n);
}
#undef PUNCT

/* Fold (span, is_match) pairs into pieces per behavior (NormalizedString::split). */
static void fold_spans(ctx *c, int behavior, sbuf *out) {
    sbuf *sp = &c->spans;
    const uint32_t *d = c->flags.p;
    size_t n = sp->n;
    if (behavior == B_ISOLATED) {
        for (size_t k = 0; k < n; k++) CHECK(sput(out, sp->p[k].off, sp->p[k].len));
    } else if (behavior == B_REMOVED) {
        for (size_t k = 0; k < n; k++) if (!d[k]) CHECK(sput(out, sp->p[k].off, sp->p[k].len));
    } else if (behavior == B_CONTIGUOUS) {
        size_t start = out->n;
        for (size_t k = 0; k < n; k++) {
            if (k > 0 && d[k] == d[k - 1] && out->n > start) out->p[out->n - 1].len += sp->p[k].len;
            else CHECK(sput(out, sp->p[k].off, sp->p[k].len));
        }
    } else if (behavior == B_MERGED_PREV) {
        size_t start = out->n;
        int prev = 0;
        for (size_t k = 0; k < n; k++) {
            if (d[k] && !prev && out->n > start) out->p[out->n - 1].len += sp->p[k].len;
            else CHECK(sput(out, sp->p[k].off, sp->p[k].len));
            prev = (int)d[k];
        }
    } else {   /* MergedWithNext: the same fold from the right */
        size_t start = out->n;
        int prev = 0;
        for (size_t k = n; k-- > 0;) {
            if (d[k] && !prev && out->n > start) {
                out->p[out->n - 1].off = sp->p[k].off;
                out->p[out->n - 1].len += sp->p[k].len;
            } else CHECK(sput(out, sp->p[k].off, sp->p[k].len));
            prev = (int)d[k];
        }
        for (size_t a = start, b = out->n; a + 1 < b; a++, b--) {
            span x = out->p[a]; out->p[a] = out->p[b - 1]; out->p[b - 1] = x;
        }
    }
}

static void add_span(ctx *c, size_t off, size_t len, int match) {
    CHECK(sput(&c->spans, off, len));
    CHECK(uput(&c->flags, (uint32_t)match));
}

/* Code points, their byte offsets and properties of arena[off..off+len). */
static void load_cps(ctx *c, size_t off, size_t len) {
    c->cps.n = c->offs.n = c->props.n = 0;
    const uint8_t *s = c->arena.p + off;
    for (size_t i = 0; i < len;) {
        size_t l;
        uint32_t cp = dec(s + i, &l);
        uint8_t pr = (uint8_t)prop(cp);
        CHECK(uput(&c->cps, cp) || zput(&c->offs, i) || bput(&c->props, &pr, 1));
        i += l;
    }
    CHECK(zput(&c->offs, len));
}

/* One split step on the piece arena[off..off+len), pieces appended to out. */
static void split_step(ctx *c, const uint32_t *o, size_t off, size_t len, int at_start, sbuf *out) {
    const ig_tok *t = c->t;
    c->spans.n = c->flags.n = 0;
    if (o[0] == P_STRING) {
        const uint8_t *lit = t->pool + o[4], *s = c->arena.p + off;
        size_t ll = o[5], last = 0;
        int invert = (int)o[2];
        int present = 0;
        if (ll) for (size_t i = 0; i + ll <= len && !present; i++) present = memcmp(s + i, lit, ll) == 0;
        if (!ll || (o[3] && !present)) { CHECK(sput(out, off, len)); return; }
        for (size_t i = 0; i + ll <= len;) {
            if (memcmp(s + i, lit, ll) == 0) {
                if (i > last) add_span(c, off + last, i - last, invert);
                add_span(c, off + i, ll, !invert);
                i += ll;
                last = i;
            } else i++;
        }
        if (last < len) add_span(c, off + last, len - last, invert);
        if (c->err) return;
        fold_spans(c, (int)o[1], out);
        return;
    }
    if (o[0] == P_METASPACE) {
        const uint8_t *r = t->pool + o[4];
        size_t rl = o[5];
        size_t base = c->arena.n;
        int prepend = o[2] == 2 || (o[2] == 1 && at_start);
        /* text.replace(" ", r), prepended with r when it does not start with it */
        int starts = 0;
        if (len && c->arena.p[off] == ' ') starts = 1;
        else if (len >= rl && memcmp(c->arena.p + off, r, rl) == 0) starts = 1;
        if (prepend && !starts) CHECK(bput(&c->arena, r, rl));
        for (size_t i = 0; i < len; i++) {
            if (c->arena.p[off + i] == ' ') CHECK(bput(&c->arena, r, rl));
            else { uint8_t ch = c->arena.p[off + i]; CHECK(bput(&c->arena, &ch, 1)); }
        }
        size_t end = c->arena.n;
        if (!o[3]) { CHECK(sput(out, base, end - base)); return; }
        /* split: before every replacement; an empty first part is dropped */
        size_t last = base;
        for (size_t i = base; i + rl <= end;) {
            if (memcmp(c->arena.p + i, r, rl) == 0) {
                if (i > last) CHECK(sput(out, last, i - last));
                last = i;
                i += rl;
            } else i++;
        }
        if (end > last) CHECK(sput(out, last, end - last));
        return;
    }
    load_cps(c, off, len);
    if (c->err) return;
    const uint32_t *cp = c->cps.p;
    const size_t *bo = c->offs.p;
    const uint8_t *pr = c->props.p;
    size_t n = c->cps.n, gap = 0, i = 0;
    while (i < n) {
        size_t j;
        if (o[0] == P_DIGITS) {
            j = i;
            if (pr[i] & TP_RUSTNUM) {
                j = i + 1;
                if (!o[2]) while (j < n && (pr[j] & TP_RUSTNUM)) j++;
            }
        } else if (o[0] == P_GPT2) j = scan_gpt2(cp, pr, n, i);
        else j = scan_qwen(cp, pr, n, i, o[0] == P_LLAMA3);
        if (j == i) { i++; continue; }
        if (i > gap) add_span(c, off + bo[gap], bo[i] - bo[gap], 0);
        add_span(c, off + bo[i], bo[j] - bo[i], 1);
        i = gap = j;
    }
    if (n > gap) add_span(c, off + bo[gap], bo[n] - bo[gap], 0);
    if (c->err) return;
    fold_spans(c, (int)o[1], out);
}

/* Pre-tokenize s (normalized text between added tokens) and BPE the words into c->out. */
static void encode_text(ctx *c, const uint8_t *s, size_t n, int at_start) {
    const ig_tok *t = c->t;
    if (!n) return;
    if (n > IG_TOK_MAX_TEXT) { c->err = IG_TOK_ERR_TOO_LONG; return; }   /* normalizing grew it */
    c->arena.n = 0;
    CHECK(bput(&c->arena, s, n));
    c->pieces.n = 0;
    CHECK(sput(&c->pieces, 0, n));
    for (uint32_t k = 0; k < t->n_pre; k++) {
        const uint32_t *o = t->pre_ops + 6 * (size_t)k;
        c->pieces2.n = 0;
        for (size_t q = 0; q < c->pieces.n; q++) {
            split_step(c, o, c->pieces.p[q].off, c->pieces.p[q].len, at_start && q == 0, &c->pieces2);
            if (c->err) return;
        }
        sbuf x = c->pieces; c->pieces = c->pieces2; c->pieces2 = x;
    }
    for (size_t q = 0; q < c->pieces.n && !c->err; q++) {
        const uint8_t *w = c->arena.p + c->pieces.p[q].off;
        if (t->kind == 0) encode_word_bytes(c, w, c->pieces.p[q].len);
        else encode_word_chars(c, w, c->pieces.p[q].len);
    }
}

/* ------------------------------------------------------------------ added tokens */

/* Split s by the added tokens of tr (tokenizer.py's _AddedMatcher.split): for each text part call
 * text(c, part, index), for each token append its id. skip_special: special tokens stay text. */
typedef void (*part_fn)(ctx *c, const uint8_t *s, size_t n, size_t index, void *user);

static void added_split(ctx *c, const trie *tr, const uint8_t *s, size_t n, int skip_special,
                        part_fn text, void *user) {
    size_t pos = 0, start_offset = 0, index = 0;
    if (!tr->n || !n) { text(c, s, n, 0, user); return; }
    while (pos < n && !c->err) {
        size_t mlen = 0;
        int32_t e = trie_longest(tr, s + pos, n - pos, &mlen);
        if (e < 0) { pos++; continue; }
        const uint32_t *en = tr->entries + 4 * (size_t)e;
        size_t start = pos, stop = pos + mlen;
        pos = stop;
        if (skip_special && (en[3] & A_SPECIAL)) continue;
        if (en[3] & A_SINGLE_WORD) {
            int before_ok = start == 0 || !(prop(dec_before(s, start)) & TP_WORD);
            size_t l;
            int after_ok = stop == n || !(prop(dec(s + stop, &l)) & TP_WORD);
            if (!(before_ok && after_ok)) continue;
        }
        if (en[3] & A_LSTRIP) {
            size_t st = start;
            while (st > 0) {
                uint32_t ch = dec_before(s, st);
                if (!(prop(ch) & TP_WS)) break;
                uint8_t tmp[4];
                st -= enc(ch, tmp);
            }
            start = st > start_offset ? st : start_offset;
        }
        if (en[3] & A_RSTRIP) {
            while (stop < n) {
                size_t l;
                if (!(prop(dec(s + stop, &l)) & TP_WS)) break;
                stop += l;
            }
        }
        if (start > start_offset) text(c, s + start_offset, start - start_offset, index++, user);
        index++;
        CHECK(iput(&c->out, (int32_t)en[2]));
        start_offset = stop;
    }
    if (start_offset != n && !c->err) text(c, s + start_offset, n - start_offset, index, user);
}

/* Masked text (encode_chat): each mask character stands for its text, normalized alone; an
 * added token can never form across one, and BPE sees the text back. */
typedef struct {
    size_t n;
    const uint32_t *chars;
    bbuf texts;          /* normalized texts, concatenated */
    size_t *ends;        /* where text k ends in texts */
} mask_set;

typedef struct { int skip_special; int at_start; mask_set *masks; } piece_args;

static void norm_part(ctx *c, const uint8_t *s, size_t n, size_t index, void *user) {
    piece_args *a = user;
    if (!n) return;
    mask_set *m = a->masks;
    if (m && m->n) {
        bbuf *u = &c->unmask;
        u->n = 0;
        for (size_t i = 0; i < n;) {
            size_t l, k = m->n;
            uint32_t cp = dec(s + i, &l);
            if (cp >= 0xE000)
                for (k = 0; k < m->n && m->chars[k] != cp; k++) {}
            if (k < m->n) {
                size_t from = k ? m->ends[k - 1] : 0;
                CHECK(bput(u, m->texts.p + from, m->ends[k] - from));
            } else CHECK(bput(u, s + i, l));
            i += l;
        }
        if (u->n) encode_text(c, u->p, u->n, a->at_start && index == 0);
        return;
    }
    encode_text(c, s, n, a->at_start && index == 0);
}

static void raw_part(ctx *c, const uint8_t *s, size_t n, size_t index, void *user) {
    const piece_args *outer = user;
    const uint8_t *r;
    size_t rn;
    normalize(c, s, n, &r, &rn);
    if (c->err) return;
    /* r lives in c->norm / c->norm2 (or is s), which nothing below touches */
    piece_args a = {outer->skip_special, index == 0, outer->masks};
    added_split(c, &c->t->norm, r, rn, outer->skip_special, norm_part, &a);
}

static int encode_impl(const ig_tok *t, const char *utf8, size_t len, int add_special, int parse_special,
                       const uint32_t *mask_chars, const char *const *mask_texts, const size_t *mask_lens,
                       size_t n_masks, int32_t **ids, size_t *n) {
    if (!t || !ids || !n || (!utf8 && len) || (n_masks && (!mask_chars || !mask_texts || !mask_lens)))
        return IG_TOK_ERR_ARG;
    *ids = NULL;
    *n = 0;
    const uint8_t *s = (const uint8_t *)utf8;
    if (len > IG_TOK_MAX_TEXT) return IG_TOK_ERR_TOO_LONG;
    if (!utf8_valid(s, len)) return IG_TOK_ERR_UTF8;
    for (size_t k = 0; k < n_masks; k++) {
        uint32_t m = mask_chars[k];
        if (m < 0xE000 || m >= 0x110000 || (!mask_texts[k] && mask_lens[k])) return IG_TOK_ERR_ARG;
        if (mask_lens[k] > IG_TOK_MAX_TEXT) return IG_TOK_ERR_TOO_LONG;
        if (!utf8_valid((const uint8_t *)mask_texts[k], mask_lens[k])) return IG_TOK_ERR_UTF8;
    }
    ctx c;
    memset(&c, 0, sizeof(c));
    c.t = t;
    mask_set ms = {n_masks, mask_chars, {0}, NULL};
    if (n_masks) {
        ms.ends = malloc(n_masks * sizeof(size_t));
        if (!ms.ends) c.err = IG_TOK_ERR_NOMEM;
        for (size_t k = 0; k < n_masks && !c.err; k++) {
            const uint8_t *r;
            size_t rn;
            normalize(&c, (const uint8_t *)mask_texts[k], mask_lens[k], &r, &rn);
            if (!c.err && bput(&ms.texts, r, rn)) c.err = IG_TOK_ERR_NOMEM;
            ms.ends[k] = ms.texts.n;
        }
    }
    if (add_special)
        for (uint32_t k = 0; k < t->n_prefix && !c.err; k++) if (iput(&c.out, t->prefix[k])) c.err = IG_TOK_ERR_NOMEM;
    piece_args a = {!parse_special, 1, n_masks ? &ms : NULL};
    if (!c.err) {
        if (len) added_split(&c, &t->raw, s, len, !parse_special, raw_part, &a);
        else raw_part(&c, s, 0, 0, &a);
    }
    if (add_special)
        for (uint32_t k = 0; k < t->n_suffix && !c.err; k++) if (iput(&c.out, t->suffix[k])) c.err = IG_TOK_ERR_NOMEM;
    if (!c.err && !c.out.p && GROW(&c.out, 1)) c.err = IG_TOK_ERR_NOMEM;
    free(ms.texts.p);
    free(ms.ends);
    if (c.err) { ctx_free(&c); return c.err; }
    *ids = c.out.p;
    *n = c.out.n;
    c.out.p = NULL;
    ctx_free(&c);
    return IG_TOK_OK;
}

int ig_tok_encode(const ig_tok *t, const char *utf8, size_t len, int add_special, int parse_special,
                  int32_t **ids, size_t *n) {
    return encode_impl(t, utf8, len, add_special, parse_special, NULL, NULL, NULL, 0, ids, n);
}

int ig_tok_encode_masked(const ig_tok *t, const char *utf8, size_t len, const uint32_t *mask_chars,
                         const char *const *mask_texts, const size_t *mask_lens, size_t n_masks,
                         int32_t **ids, size_t *n) {
    return encode_impl(t, utf8, len, 0, 1, mask_chars, mask_texts, mask_lens, n_masks, ids, n);
}

void ig_tok_release(void *p) { free(p); }

/* ------------------------------------------------------------------ decode */

static const uint8_t FFFD[3] = {0xEF, 0xBF, 0xBD};

/* Lossy UTF-8 of s[0..n) appended to out, as Python's errors="replace" (one U+FFFD per maximal
 * subpart). !final: an unfinished sequence at the end is left; returns the bytes consumed. */
static int utf8_lossy(bbuf *out, const uint8_t *s, size_t n, int final, size_t *consumed) {
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            size_t j = i;
            while (j < n && s[j] < 0x80) j++;
            if (bput(out, s + i, j - i)) return -1;
            i = j;
            continue;
        }
        size_t sub;
        int partial;
        size_t l = utf8_seq(s + i, n - i, &sub, &partial);
        if (l) { if (bput(out, s + i, l)) return -1; i += l; continue; }
        if (partial && !final) break;
        if (bput(out, FFFD, 3)) return -1;
        i += sub;
    }
    *consumed = i;
    return 0;
}

struct ig_tok_stream {
    const ig_tok *t;
    int skip, done, first, hold;
    uint32_t strip_left;
    bbuf pending;   /* byte-level: an unfinished character; pieces: the byte-token run */
    bbuf text;      /* what the decoder gave for this call */
    bbuf held;      /* decoded, not released: the last grapheme cluster */
    bbuf out;       /* released by this call */
};

ig_tok_stream *ig_tok_stream_new(const ig_tok *t, int flags) {
    if (!t || flags & ~7) return NULL;
    ig_tok_stream *s = calloc(1, sizeof(*s));
    if (!s) return NULL;
    s->t = t;
    s->skip = (flags & IG_TOK_STREAM_SKIP_SPECIAL) != 0;
    s->first = !(flags & IG_TOK_STREAM_CONTINUATION);
    s->strip_left = s->first ? t->strip_left : 0;
    s->hold = !(flags & IG_TOK_STREAM_CHARS);
    return s;
}

void ig_tok_stream_free(ig_tok_stream *s) {
    if (!s) return;
    free(s->pending.p);
    free(s->text.p);
    free(s->held.p);
    free(s->out.p);
    free(s);
}

static inline unsigned gcb(uint32_t c) {
    return c < 0x110000 ? tok_gcb_blocks[tok_gcb_index[c >> 8]][c & 255] : 0;
}

/* Whether a grapheme cluster goes on from prev to cur (UAX 29's rules GB3-GB13, as the `regex`
 * package's \X applies them). ri: regional indicators ending at prev in this cluster; ep: 1 after
 * an Extended_Pictographic and Extends, 2 after its ZWJ; incb: 2 after an InCB Linker and InCB
 * Extend/Linker marks (`regex` joins a Linker to a following consonant with or without a consonant
 * before it, unlike UAX 29's GB9c). */
static int cluster_joins(unsigned prev, unsigned cur, int ri, int ep, int incb) {
    unsigned pg = prev & 15, cg = cur & 15;
    if (pg == GCB_CR && cg == GCB_LF) return 1;
    if (pg == GCB_CR || pg == GCB_LF || pg == GCB_CONTROL) return 0;
    if (cg == GCB_CR || cg == GCB_LF || cg == GCB_CONTROL) return 0;
    if (pg == GCB_L && (cg == GCB_L || cg == GCB_V || cg == GCB_LV || cg == GCB_LVT)) return 1;
    if ((pg == GCB_LV || pg == GCB_V) && (cg == GCB_V || cg == GCB_T)) return 1;
    if ((pg == GCB_LVT || pg == GCB_T) && cg == GCB_T) return 1;
    if (cg == GCB_EXTEND || cg == GCB_ZWJ || cg == GCB_SPACINGMARK) return 1;
    if (pg == GCB_PREPEND) return 1;
    if (incb == 2 && (cur & 0x60) == INCB_CONSONANT) return 1;
    if (ep == 2 && (cur & GCB_EXTPICT)) return 1;
    if (pg == GCB_REGIONAL_INDICATOR && cg == GCB_REGIONAL_INDICATOR && (ri & 1)) return 1;
    return 0;
}

/* Where the last grapheme cluster of s[0..n) starts, segmenting from s[0] (0 when n is 0). */
static size_t last_cluster_start(const uint8_t *s, size_t n) {
    size_t start = 0, i = 0, l;
    unsigned prev = 0;
    int ri = 0, ep = 0, incb = 0;
    while (i < n) {
        unsigned cur = gcb(dec(s + i, &l));
        int join = i > 0 && cluster_joins(prev, cur, ri, ep, incb);
        if (!join) { start = i; ri = ep = incb = 0; }
        ri = (cur & 15) == GCB_REGIONAL_INDICATOR ? ri + 1 : 0;
        if (cur & GCB_EXTPICT) ep = 1;
        else if (ep == 1 && (cur & 15) == GCB_EXTEND) ep = 1;
        else if (ep == 1 && (cur & 15) == GCB_ZWJ) ep = 2;
        else ep = 0;
        if ((cur & 0x60) == INCB_LINKER) incb = 2;
        else if (!(incb && (cur & 0x60) == INCB_EXTEND)) incb = 0;
        prev = cur;
        i += l;
    }
    return start;
}

/* text less the leading strip characters still to remove (Strip acts on the fused text). */
static int emit_stripped(ig_tok_stream *s, const uint8_t *p, size_t n) {
    size_t i = 0;
    while (s->strip_left && i < n) {
        size_t l;
        if (dec(p + i, &l) != s->t->strip_char) { s->strip_left = 0; break; }
        i += l;
        s->strip_left--;
    }
    return bput(&s->text, p + i, n - i);
}

/* The byte-fallback run as text: its UTF-8, or U+FFFD per byte when it is not valid. */
static int close_run(ig_tok_stream *s, bbuf *o) {
    if (!s->pending.n) return 0;
    int rc = 0;
    if (utf8_valid(s->pending.p, s->pending.n)) rc = bput(o, s->pending.p, s->pending.n);
    else for (size_t i = 0; i < s->pending.n && !rc; i++) rc = bput(o, FFFD, 3);
    s->pending.n = 0;
    return rc;
}

static int stream_feed(ig_tok_stream *s, int32_t id) {
    const ig_tok *t = s->t;
    if (id < 0 || (uint32_t)id >= t->V || !(t->tok_flags[id] & F_PRESENT)) return IG_TOK_ERR_ID;
    if (s->skip && (t->tok_flags[id] & F_SPECIAL)) return IG_TOK_OK;
    const uint8_t *d = t->pool + t->tok_ends[id];
    size_t dn = t->tok_ends[id + 1] - t->tok_ends[id];
    if (t->dec_kind == 0) {
        if (bput(&s->pending, d, dn)) return IG_TOK_ERR_NOMEM;
        size_t used;
        if (utf8_lossy(&s->text, s->pending.p, s->pending.n, 0, &used)) return IG_TOK_ERR_NOMEM;
        memmove(s->pending.p, s->pending.p + used, s->pending.n - used);
        s->pending.n -= used;
        return IG_TOK_OK;
    }
    int first = s->first;
    s->first = 0;
    if (t->tok_flags[id] & F_BYTE) return bput(&s->pending, d, dn) ? IG_TOK_ERR_NOMEM : IG_TOK_OK;
    if (first && t->metaspace) {
        d = t->pool + t->first_ends[id];
        dn = t->first_ends[id + 1] - t->first_ends[id];
    }
    bbuf run = {0};
    int rc = close_run(s, &run) || bput(&run, d, dn) || emit_stripped(s, run.p, run.n);
    free(run.p);
    return rc ? IG_TOK_ERR_NOMEM : IG_TOK_OK;
}

static int stream_flush(ig_tok_stream *s) {
    if (s->t->dec_kind == 0) {
        size_t used;
        int rc = utf8_lossy(&s->text, s->pending.p, s->pending.n, 1, &used);
        s->pending.n = 0;
        return rc ? IG_TOK_ERR_NOMEM : IG_TOK_OK;
    }
    bbuf run = {0};
    int rc = close_run(s, &run) || (run.n && emit_stripped(s, run.p, run.n));
    free(run.p);
    return rc ? IG_TOK_ERR_NOMEM : IG_TOK_OK;
}

/* What this call releases: the decoder's text, or with hold everything before the last grapheme
 * cluster (all of it when final), which may still grow (StreamDecoder.final_end). */
static int stream_release(ig_tok_stream *s, int final, const char **text, size_t *len) {
    bbuf *o = &s->text;
    if (s->hold) {
        if (bput(&s->held, s->text.p, s->text.n)) return IG_TOK_ERR_NOMEM;
        size_t k = final ? s->held.n : last_cluster_start(s->held.p, s->held.n);
        s->out.n = 0;
        if (bput(&s->out, s->held.p, k)) return IG_TOK_ERR_NOMEM;
        memmove(s->held.p, s->held.p + k, s->held.n - k);
        s->held.n -= k;
        o = &s->out;
    }
    if (GROW(o, o->n + 1)) return IG_TOK_ERR_NOMEM;
    o->p[o->n] = 0;
    *text = (const char *)o->p;
    *len = o->n;
    return IG_TOK_OK;
}

int ig_tok_stream_push(ig_tok_stream *s, int32_t id, const char **text, size_t *len) {
    if (!s || !text || !len) return IG_TOK_ERR_ARG;
    *text = "";
    *len = 0;
    if (s->done) return IG_TOK_ERR_STATE;
    s->text.n = 0;
    int rc = stream_feed(s, id);
    return rc ? rc : stream_release(s, 0, text, len);
}

int ig_tok_stream_whole(const ig_tok_stream *s) { return s && s->pending.n == 0; }

int ig_tok_stream_finish(ig_tok_stream *s, const char **text, size_t *len) {
    if (!s || !text || !len) return IG_TOK_ERR_ARG;
    *text = "";
    *len = 0;
    if (s->done) return IG_TOK_OK;
    s->done = 1;
    s->text.n = 0;
    int rc = stream_flush(s);
    return rc ? rc : stream_release(s, 1, text, len);
}

int ig_tok_decode(const ig_tok *t, const int32_t *ids, size_t n, int skip_special, char **text, size_t *len) {
    if (!t || !text || !len || (!ids && n)) return IG_TOK_ERR_ARG;
    *text = NULL;
    *len = 0;
    ig_tok_stream s;
    memset(&s, 0, sizeof(s));
    s.t = t;
    s.skip = skip_special;
    s.first = 1;
    s.strip_left = t->strip_left;
    bbuf all = {0};
    int rc = IG_TOK_OK;
    for (size_t i = 0; i < n && !rc; i++) {
        s.text.n = 0;
        rc = stream_feed(&s, ids[i]);
        if (!rc && bput(&all, s.text.p, s.text.n)) rc = IG_TOK_ERR_NOMEM;
    }
    if (!rc) {
        s.text.n = 0;
        rc = stream_flush(&s);
        if (!rc && (bput(&all, s.text.p, s.text.n) || GROW(&all, all.n + 1))) rc = IG_TOK_ERR_NOMEM;
    }
    free(s.pending.p);
    free(s.text.p);
    if (rc) { free(all.p); return rc; }
    all.p[all.n] = 0;
    *text = (char *)all.p;
    *len = all.n;
    return IG_TOK_OK;
}

/* ------------------------------------------------------------------ vocabulary */

int ig_tok_token_bytes(const ig_tok *t, int32_t id, const char **bytes, size_t *len) {
    if (!t || !bytes || !len) return IG_TOK_ERR_ARG;
    if (id < 0 || (uint32_t)id >= t->V || !(t->tok_flags[id] & F_PRESENT)) return IG_TOK_ERR_ID;
    *bytes = (const char *)t->pool + t->tok_ends[id];
    *len = t->tok_ends[id + 1] - t->tok_ends[id];
    return IG_TOK_OK;
}

int32_t ig_tok_vocab_size(const ig_tok *t) { return t ? (int32_t)t->V : 0; }
int ig_tok_is_special(const ig_tok *t, int32_t id) {
    return t && id >= 0 && (uint32_t)id < t->V && (t->tok_flags[id] & F_SPECIAL) != 0;
}
int ig_tok_is_byte_token(const ig_tok *t, int32_t id) {
    return t && id >= 0 && (uint32_t)id < t->V && (t->tok_flags[id] & F_BYTE) != 0;
}
int32_t ig_tok_bos_id(const ig_tok *t) { return t ? t->bos : -1; }
int32_t ig_tok_eos_id(const ig_tok *t) { return t ? t->eos : -1; }
int32_t ig_tok_pad_id(const ig_tok *t) { return t ? t->pad : -1; }
size_t ig_tok_eos_ids(const ig_tok *t, const int32_t **ids) {
    if (!t || !ids) return 0;
    *ids = t->eos_ids;
    return t->n_eos;
}
size_t ig_tok_prefix_ids(const ig_tok *t, const int32_t **ids) {
    if (!t || !ids) return 0;
    *ids = t->prefix;
    return t->n_prefix;
}
