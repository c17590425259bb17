/* JSON for the native library: a strict DOM parser for untrusted request bodies and a writer for
 * responses, both matching Python's json module as `ignis serve` uses it, so the library and the
 * server accept the same requests, refuse the same ones with the same messages, and send the same
 * bytes.
 *
 * Parsing (ig_json_parse) follows RFC 8259 and Python's json.loads(bytes) where they differ:
 *  - the text is UTF-8, checked whole before any syntax, with the messages of Python's decoder
 *    ("'utf-8' codec can't decode byte 0xff in position 3: invalid start byte"). Like json.loads,
 *    which decodes with 'surrogatepass', a UTF-16 surrogate spelled in three bytes (ED A0..BF xx)
 *    is accepted, and so is a lone surrogate escape ("\ud800"): such a string is kept in its
 *    generalized UTF-8 bytes (WTF-8) and flagged IG_JSON_LONE_SURROGATE, so that the caller can
 *    refuse it as the server does (params.check_text) with the place it came from. One leading
 *    UTF-8 byte order mark is skipped (json.loads(bytes) skips it too).
 *  - refused: trailing commas, comments, single quotes, NaN / Infinity / -Infinity (the server
 *    refuses them: "NaN is not valid JSON"), leading zeros, control characters in strings,
 *    integers of more than 4300 digits (Python's int limit; the message is Python's without its
 *    advice to call sys.set_int_max_str_digits()), anything after the value.
 *  - documented difference: Python also reads UTF-16 and UTF-32 bodies (guessed from NUL bytes);
 *    this parser reads UTF-8 only, where a NUL byte is a syntax error.
 *  - duplicate keys: the last value wins, at the place of the first (a Python dict's rule).
 *  - syntax errors carry Python's message and position, in characters, e.g.
 *    "Expecting ',' delimiter: line 1 column 8 (char 7)", and the byte offset.
 *  - limits (ig_json_limits): nesting depth (the body is level 1, as in params.MAX_NESTING), total
 *    bytes, total values; exceeding one is a typed error, never a crash: the parser does not
 *    recurse. A depth error names the place as check_request_value does ("messages.[0].content").
 *    The limits apply as the text is read: a document too deep before a syntax error further on
 *    is refused as too deep (the server parses all of it first and calls it malformed).
 * Mapping to the server's answers (ignis/api/server.py _json_body): E_SYNTAX, E_UTF8, E_CONSTANT,
 * E_NUMBER -> 400 invalid_json "the request body is not valid JSON (<message>); send a JSON
 * object"; E_DEPTH -> 400 invalid_json naming `path`; E_SIZE -> 413 request_too_large.
 * One arena holds a document's nodes and strings; ig_json_free releases all of it at once.
 *
 * Writing (ig_jw_*): a builder appending to a growable buffer. Strings are escaped as Python's
 * json.dumps(..., ensure_ascii=False) does (\" \\ \n \r \t \b \f, other controls as \u00XX, the
 * rest as UTF-8); a lone surrogate's WTF-8 bytes are written as its \udXXX escape (what json.loads
 * turns back into the same str) and other invalid UTF-8 as U+FFFD. Doubles are written as Python's
 * repr (shortest digits that read back to the same double: "0.1", "1e-05", "1e+16", "-0.0"; NaN and
 * infinities as json.dumps writes them: NaN, Infinity, -Infinity). Separators are compact (",", ":")
 * as starlette's JSONResponse, or spaced (", ", ": ") as json.dumps' defaults. Numbers are written
 * in the C locale whatever the process's locale.
 */
#ifndef IG_NATIVE_JSON_H
#define IG_NATIVE_JSON_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    IG_JSON_NULL, IG_JSON_FALSE, IG_JSON_TRUE, IG_JSON_NUMBER, IG_JSON_STRING, IG_JSON_ARRAY,
    IG_JSON_OBJECT
} ig_json_type;

/* ig_json.flags */
enum {
    IG_JSON_INTEGER = 1,         /* a number spelled without fraction or exponent */
    IG_JSON_FITS_I64 = 2,        /* ... whose value is in int64 (num.i) */
    IG_JSON_FITS_U64 = 4,        /* ... whose value is in uint64 (num.u): a 64-bit seed */
    IG_JSON_LONE_SURROGATE = 8,  /* a string (or, on a member, its key) holding a lone surrogate */
};

typedef struct ig_json ig_json;
typedef struct ig_json_member ig_json_member;

struct ig_json {
    ig_json_type type;
    uint32_t flags;
    size_t offset;               /* byte offset of the value's first byte in the parsed text */
    union {
        struct { const char *text; size_t len; int64_t i; uint64_t u; double d; } num;
        struct { const char *s; size_t len; } str;          /* NUL-terminated UTF-8 (WTF-8) */
        struct { ig_json **items; size_t n; } arr;
        struct { ig_json_member *members; size_t n; } obj;   /* document order, keys unique */
    } u;
};

struct ig_json_member {
    const char *key;             /* NUL-terminated UTF-8 (WTF-8 with IG_JSON_LONE_SURROGATE) */
    size_t key_len;
    uint32_t key_flags;
    size_t key_offset;
    ig_json *value;
};

typedef enum {
    IG_JSON_OK = 0,
    IG_JSON_E_SYNTAX,            /* not JSON: Python's json.loads message and position */
    IG_JSON_E_UTF8,              /* the text is not UTF-8: Python's decoder's message */
    IG_JSON_E_CONSTANT,          /* NaN, Infinity, -Infinity */
    IG_JSON_E_NUMBER,            /* an integer of more than 4300 digits */
    IG_JSON_E_DEPTH,             /* arrays and objects nested deeper than limits.max_depth */
    IG_JSON_E_SIZE,              /* the text is longer than limits.max_bytes */
    IG_JSON_E_ELEMENTS,          /* more values than limits.max_elements */
    IG_JSON_E_MEMORY,            /* out of memory */
    IG_JSON_E_TYPE,              /* a getter found another type than it expected */
    IG_JSON_E_MISSING,           /* a getter did not find the member */
} ig_json_status;

typedef struct {
    ig_json_status status;
    size_t offset;               /* byte offset of the fault in the text given */
    size_t pos, line, column;    /* Python's position: characters, line and column from 1 */
    char message[256];           /* what was wrong, e.g. "Expecting value: line 1 column 1 (char 0)" */
    char path[128];              /* IG_JSON_E_DEPTH: the place, as check_request_value spells it */
} ig_json_error;

typedef struct {
    int max_depth;               /* levels of arrays/objects, the top one being 1; 0: 64 */
    size_t max_bytes;            /* 0: 4 MiB (the server's MAX_BODY_BYTES) */
    size_t max_elements;         /* values of every kind, keys not counted; 0: 1 << 20 */
} ig_json_limits;

#define IG_JSON_DEFAULT_DEPTH 64
#define IG_JSON_DEFAULT_BYTES ((size_t)4 << 20)
#define IG_JSON_DEFAULT_ELEMENTS ((size_t)1 << 20)
#define IG_JSON_MAX_INT_DIGITS 4300

typedef struct ig_json_doc ig_json_doc;

/* Parse `len` bytes (not necessarily NUL-terminated). Returns the document (ig_json_root) or NULL
 * with *err filled. limits may be NULL (the defaults). */
ig_json_doc *ig_json_parse(const char *text, size_t len, const ig_json_limits *limits,
                           ig_json_error *err);
const ig_json *ig_json_root(const ig_json_doc *doc);
void ig_json_free(ig_json_doc *doc);

/* ---- lookup ---- */
const char *ig_json_type_name(ig_json_type t);   /* Python's names: "dict", "list", "str", "int"... */
const ig_json *ig_json_get(const ig_json *obj, const char *key);      /* NULL if absent/not object */
const ig_json *ig_json_at(const ig_json *arr, size_t i);               /* NULL if out of range */
size_t ig_json_len(const ig_json *v);            /* members, items or bytes of a string; else 0 */
/* Typed getters: 0 on success; else fill err (IG_JSON_E_TYPE "expected a number, got str" or
 * IG_JSON_E_MISSING) naming `what` and return -1. A boolean is neither an int nor a number (as the
 * server's validation has it). ig_json_get_int needs an integer literal within int64;
 * ig_json_get_u64 accepts any integer in [-2^63, 2^64) and returns it modulo 2^64 (a seed). */
int ig_json_get_string(const ig_json *v, const char *what, const char **s, size_t *len,
                       ig_json_error *err);
int ig_json_get_number(const ig_json *v, const char *what, double *d, ig_json_error *err);
int ig_json_get_int(const ig_json *v, const char *what, int64_t *i, ig_json_error *err);
int ig_json_get_u64(const ig_json *v, const char *what, uint64_t *u, ig_json_error *err);
int ig_json_get_bool(const ig_json *v, const char *what, int *b, ig_json_error *err);

/* ---- writing ---- */
enum { IG_JW_COMPACT = 0, IG_JW_SPACED = 1 };

typedef struct {
    char *buf;
    size_t len, cap;
    int failed;                  /* out of memory or misuse: the text is incomplete */
    int style;
    int depth;                   /* open arrays/objects */
    unsigned char first[256];    /* per depth: nothing written yet there; an object */
    unsigned char after_key;     /* a key was written: the value follows without a comma */
} ig_jw;

void ig_jw_init(ig_jw *w, int style);
void ig_jw_reset(ig_jw *w);                 /* empty, keep the buffer */
void ig_jw_free(ig_jw *w);
char *ig_jw_take(ig_jw *w);                 /* the NUL-terminated text (malloc'd; free()) or NULL */

void ig_jw_begin_object(ig_jw *w);
void ig_jw_end_object(ig_jw *w);
void ig_jw_begin_array(ig_jw *w);
void ig_jw_end_array(ig_jw *w);
void ig_jw_key(ig_jw *w, const char *key, size_t len);
void ig_jw_string(ig_jw *w, const char *s, size_t len);
void ig_jw_cstr(ig_jw *w, const char *s);
void ig_jw_int(ig_jw *w, int64_t v);
void ig_jw_uint(ig_jw *w, uint64_t v);
void ig_jw_double(ig_jw *w, double v);
void ig_jw_bool(ig_jw *w, int v);
void ig_jw_null(ig_jw *w);
void ig_jw_raw(ig_jw *w, const char *json, size_t len);   /* an already-serialized value */
void ig_jw_value(ig_jw *w, const ig_json *v);              /* a parsed value, as json.dumps would */
/* The base64 text (standard alphabet, padded: Python's base64.b64encode) of n floats' little-endian
 * float32 bytes, as a JSON string: OpenAI's embeddings with encoding_format "base64". */
void ig_jw_base64_f32(ig_jw *w, const float *v, size_t n);   /* v:(n,) */

/* Python's repr of a double into out (at least 32 bytes); returns its length. */
int ig_json_format_double(char *out, double v);

#ifdef __cplusplus
}
#endif
#endif
