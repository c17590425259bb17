/* The native tokenizer: text <-> ids without Python, exactly as ignis's Python tokenizer
 * (ignis/tokenizer/, itself exact to Hugging Face tokenizers), from the blob that
 * ignis.native.tokenizer_blob.tokenizer_section writes. Byte-level BPE (Qwen2, Llama 3, SmolLM2,
 * GPT-2 splits) and SentencePiece-style BPE with byte fallback (Gemma); NFC, Replace, Prepend
 * normalizers; added/special tokens; ByteLevel and Replace/ByteFallback/Fuse/Strip/Metaspace
 * decoders; an incremental decoder that only hands out complete UTF-8.
 *
 * An ig_tok is read-only once opened: any number of threads may encode and decode on one handle
 * at once (every call keeps its scratch to itself). A stream belongs to one thread at a time.
 *
 * Blob layout (version 1, little-endian; every offset is from the blob's start and 4-byte aligned):
 *   u8  magic[8] = "IGNTOKB1"
 *   u32 h[14]: version, total length, vocab_size V, model kind (0 byte-level, 1 characters),
 *              model flags (1 ignore_merges, 2 byte_fallback, 4 fuse_unk), unk id,
 *              decoder kind (0 byte-level, 1 pieces), strip character, strip count,
 *              metaspace decoder, bos id, pad id, eos id, reserved   (ids: 0xFFFFFFFF = none)
 *   u32 sections[16][2]: offset and byte length of
 *     0 pool        bytes every other section points into
 *     1 tok_ends    u32[V+1]  token i's bytes are pool[tok_ends[i] .. tok_ends[i+1])
 *     2 tok_flags   u8[V]     1 has a token, 2 special, 4 byte-fallback token ("<0xNN>")
 *     3 first_ends  u32[V+1]  (metaspace decoder only) a first token's text, like tok_ends
 *     4 byte_ids    i32[256]  byte-level: the token of each byte; characters: "<0xNN>" tokens
 *     5 merges      i32[4*M]  left, right, merged id, rank (distinct pairs)
 *     6 vocab       u32[3*K]  key offset, key length, id (characters: the token's text; byte-level
 *                             with ignore_merges: the bytes of tokens spelled in the byte alphabet)
 *     7 added_raw   u32[4*A]  text offset, length, id, flags (1 special, 2 lstrip, 4 rstrip,
 *                             8 single_word): added tokens matched before normalization
 *     8 added_norm  u32[4*A]  the same, matched after it (their text normalized)
 *     9 normalizer  u32[5*N]  kind (1 NFC, 2 Replace a->b, 3 Prepend a), a offset, a length,
 *                             b offset, b length
 *    10 pre         u32[6*P]  kind (1 Qwen2 split, 2 Llama 3 split, 3 GPT-2 split, 4 Digits,
 *                             5 Metaspace, 6 Split on a string), behavior (0 Isolated, 1 Removed,
 *                             2 MergedWithPrevious, 3 MergedWithNext, 4 Contiguous), x, y,
 *                             a offset, a length. Digits: x individual. Metaspace: a replacement,
 *                             x prepend scheme (0 never, 1 first, 2 always), y split. String:
 *                             x invert, y skip text without the string.
 *    11 prefix      i32[]     ids add_special puts before the text (BOS)
 *    12 suffix      i32[]     ids add_special puts after it
 *    13 eos_ids     i32[]     the ids generation stops at
 *    14, 15         reserved (empty)
 */
#ifndef IG_TOKENIZER_H
#define IG_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define IG_TOK_BLOB_VERSION 1

enum {
    IG_TOK_OK = 0,
    IG_TOK_ERR_UTF8 = -1,     /* input text is not valid UTF-8 */
    IG_TOK_ERR_NOMEM = -2,
    IG_TOK_ERR_ID = -3,       /* an id that is not a token of this vocabulary */
    IG_TOK_ERR_ARG = -4,      /* NULL where a pointer is needed */
    IG_TOK_ERR_STATE = -5,    /* push after finish */
    IG_TOK_ERR_TOO_LONG = -6, /* text (or its normalized form) past IG_TOK_MAX_TEXT bytes */
};

/* The longest text one encode call takes (ids and positions are int32 inside). */
#define IG_TOK_MAX_TEXT ((size_t)1 << 30)

typedef struct ig_tok ig_tok;
typedef struct ig_tok_stream ig_tok_stream;

/* Validates and copies the blob. NULL on error, with the reason in err (err_len bytes, may be 0). */
ig_tok *ig_tok_open(const void *blob, size_t len, char *err, int err_len);
void ig_tok_free(ig_tok *t);
const char *ig_tok_strerror(int code);

/* Ids of utf8[0..len). add_special: the post-processor's ids (BOS...), as add_special_tokens.
 * parse_special: 1, special-token text becomes its id; 0, it is plain text (untrusted content).
 * *ids is malloc'ed (free with ig_tok_release), *n its count. */
int ig_tok_encode(const ig_tok *t, const char *utf8, size_t len, int add_special, int parse_special,
                  int32_t **ids, size_t *n);
/* Ids of a chat template's output whose message strings were masked (ignis.tokenizer.chat's
 * TextMasker: each added-token spelling in a string became one private-use character, fences at
 * a string's edges stand for ""): as Tokenizer.encode_chat, the added tokens found are the
 * template's own markup, and each mask character mask_chars[k] is put back as the plain text
 * mask_texts[k] (mask_lens[k] bytes, normalized on its own) before BPE. No post-processor ids. */
int ig_tok_encode_masked(const ig_tok *t, const char *utf8, size_t len, const uint32_t *mask_chars,
                         const char *const *mask_texts, const size_t *mask_lens, size_t n_masks,
                         int32_t **ids, size_t *n);
/* Text of ids (invalid UTF-8 becomes U+FFFD as the decoder does), NUL-terminated, malloc'ed. */
int ig_tok_decode(const ig_tok *t, const int32_t *ids, size_t n, int skip_special,
                  char **text, size_t *len);
void ig_tok_release(void *p);

/* The raw bytes an id stands for (a view into the handle). */
int ig_tok_token_bytes(const ig_tok *t, int32_t id, const char **bytes, size_t *len);
int32_t ig_tok_vocab_size(const ig_tok *t);     /* one past the largest id (holes possible) */
int ig_tok_is_special(const ig_tok *t, int32_t id);
int ig_tok_is_byte_token(const ig_tok *t, int32_t id);
int32_t ig_tok_bos_id(const ig_tok *t);         /* -1: none */
int32_t ig_tok_eos_id(const ig_tok *t);
int32_t ig_tok_pad_id(const ig_tok *t);
size_t ig_tok_eos_ids(const ig_tok *t, const int32_t **ids);
size_t ig_tok_prefix_ids(const ig_tok *t, const int32_t **ids);

/* Python's str.isidentifier of UTF-8 text (XID_Start or '_', then XID_Continue, by the Unicode
 * version tok_unicode.h was generated from); 0 for ill-formed UTF-8 (a lone surrogate too). */
int ig_unicode_identifier(const char *text, size_t n);
/* Python's str.isprintable of one code point (a surrogate too): what repr() shows unescaped. */
int ig_unicode_printable(uint32_t c);

/* Incremental decoding, one id at a time, as ignis.tokenizer.StreamDecoder: push returns the text
 * that is now final, finish the rest (an unfinished character becomes U+FFFD). Final text never
 * ends inside a UTF-8 character or a byte-fallback run that may still grow, and holds whole
 * grapheme clusters: the last one waits for the next to start, since a combining mark or a ZWJ
 * may still extend it. The pieces concatenate to ig_tok_decode of the same ids. *text stays valid
 * until the next call on the stream. Flags:
 *   IG_TOK_STREAM_SKIP_SPECIAL   special tokens give no text (skip_special_tokens)
 *   IG_TOK_STREAM_CONTINUATION   the ids continue text decoded before: a SentencePiece decoder's
 *                                strip of the leading space (and Metaspace's) does not apply
 *   IG_TOK_STREAM_CHARS          release every complete character at once (no grapheme hold),
 *                                for a caller with its own hold-back rules (stop strings) */
#define IG_TOK_STREAM_SKIP_SPECIAL 1
#define IG_TOK_STREAM_CONTINUATION 2
#define IG_TOK_STREAM_CHARS 4
/* NULL on unknown flags or out of memory. push after finish: IG_TOK_ERR_STATE. */
ig_tok_stream *ig_tok_stream_new(const ig_tok *t, int flags);
int ig_tok_stream_push(ig_tok_stream *s, int32_t id, const char **text, size_t *len);
int ig_tok_stream_finish(ig_tok_stream *s, const char **text, size_t *len);
/* No byte waits for the rest of its character: every id pushed has all its text out (or held as
 * a grapheme cluster), StreamDecoder.whole */
int ig_tok_stream_whole(const ig_tok_stream *s);
void ig_tok_stream_free(ig_tok_stream *s);

#ifdef __cplusplus
}
#endif
#endif
