/* api.c — the OpenAI-shaped JSON entry points of a compiled model (ignis_model.h): a request body
 * in, a response body (or an OpenAI error object) out, read, checked and answered as `ignis serve`
 * does (ignis/api/server.py reading the body, ignis/api/client.py and ignis/generate/params.py
 * checking it, ignis/generate/loop.py generating), with the same messages, so a program gets the
 * same answers from the library and from the server. tests/test_native_api.py holds the two
 * together. Parsing and writing JSON: json.h; text <-> ids: tokenizer.h; choosing tokens:
 * sampler.h (numpy's generator, so a seed gives the Python path's tokens); a chat answer read as
 * reasoning, content and tool calls: answer.h. */
#if defined(__linux__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE 1
#endif
#include "api.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "answer.h"
#include "chat.h"
#include "json.h"
#include "sampler.h"

#define IG_API __attribute__((visibility("default")))

#define MAX_STOPS 4                   /* params.MAX_STOPS */
#define MAX_NESTING 64                /* params.MAX_NESTING */
#define PARSE_DEPTH 990               /* about where json.loads gives up (RecursionError) */
#define MAX_CHOICES 128               /* api/model.py MAX_CHOICES */
#define MAX_BODY_BYTES ((size_t)4 << 20)  /* server.MAX_BODY_BYTES */
#define COMPLETIONS_MAX_TOKENS 16     /* client.COMPLETIONS_MAX_TOKENS */

/* ---- a growable string ------------------------------------------------------------------------ */

typedef struct {
    char *p;
    size_t n, cap;
    int failed;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->failed) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->failed = 1;
            return;
        }
        b->p = q, b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }
static void sb_fmt(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_fmt(sbuf *b, const char *fmt, ...) {
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof small) {
        sb_put(b, small, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        b->failed = 1;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sb_put(b, big, (size_t)n);
    free(big);
}
static const char *sb_text(const sbuf *b) { return b->p ? b->p : ""; }

/* ---- UTF-8 (generalized: a lone surrogate's three bytes count as one character) ---------------- */

static size_t u8_len(unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

static uint32_t u8_decode(const char *s, size_t avail, size_t *len) {
    const unsigned char *u = (const unsigned char *)s;
    size_t n = u8_len(u[0]);
    if (n > avail) n = avail;
    *len = n;
    if (n == 1) return u[0];
    if (n == 2) return (uint32_t)(u[0] & 0x1F) << 6 | (u[1] & 0x3F);
    if (n == 3) return (uint32_t)(u[0] & 0x0F) << 12 | (uint32_t)(u[1] & 0x3F) << 6 | (u[2] & 0x3F);
    return (uint32_t)(u[0] & 0x07) << 18 | (uint32_t)(u[1] & 0x3F) << 12 | (uint32_t)(u[2] & 0x3F) << 6 | (u[3] & 0x3F);
}

static size_t u8_chars(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i += u8_len((unsigned char)s[i])) c++;
    return c;
}

/* The character index of the first lone surrogate, or -1 (params.lone_surrogate). */
static long lone_surrogate(const char *s, size_t n) {
    long at = 0;
    for (size_t i = 0; i < n; at++) {
        size_t len;
        const uint32_t cp = u8_decode(s + i, n - i, &len);
        if (cp >= 0xD800 && cp <= 0xDFFF) return at;
        i += len;
    }
    return -1;
}

/* ---- Python's repr of a parsed JSON value (what the server's messages quote) ------------------- */

static void repr_str(sbuf *b, const char *s, size_t n) {
    const int has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    const char q = has_sq && !has_dq ? '"' : '\'';
    sb_put(b, &q, 1);
    for (size_t i = 0; i < n;) {
        size_t len;
        const uint32_t c = u8_decode(s + i, n - i, &len);
        if (c == (uint32_t)q || c == '\\') {
            sb_put(b, "\\", 1);
            sb_put(b, s + i, 1);
        } else if (c == '\n') {
            sb_str(b, "\\n");
        } else if (c == '\r') {
            sb_str(b, "\\r");
        } else if (c == '\t') {
            sb_str(b, "\\t");
        } else if (!ig_unicode_printable(c)) {
            if (c < 0x100) sb_fmt(b, "\\x%02x", (unsigned)c);
            else if (c < 0x10000) sb_fmt(b, "\\u%04x", (unsigned)c);
            else sb_fmt(b, "\\U%08x", (unsigned)c);
        } else {
            sb_put(b, s + i, len);
        }
        i += len;
    }
    sb_put(b, &q, 1);
}

static void repr_number(sbuf *b, const ig_json *v) {
    if (v->flags & IG_JSON_INTEGER) {
        if (v->u.num.len == 2 && memcmp(v->u.num.text, "-0", 2) == 0) sb_str(b, "0");
        else sb_put(b, v->u.num.text, v->u.num.len);
        return;
    }
    const double d = v->u.num.d;
    if (isinf(d)) {
        sb_str(b, d < 0 ? "-inf" : "inf");
        return;
    }
    char tmp[40];
    sb_put(b, tmp, (size_t)ig_json_format_double(tmp, d));
}

static void repr(sbuf *b, const ig_json *v) {
    switch (v->type) {
    case IG_JSON_NULL: sb_str(b, "None"); break;
    case IG_JSON_TRUE: sb_str(b, "True"); break;
    case IG_JSON_FALSE: sb_str(b, "False"); break;
    case IG_JSON_NUMBER: repr_number(b, v); break;
    case IG_JSON_STRING: repr_str(b, v->u.str.s, v->u.str.len); break;
    case IG_JSON_ARRAY:
        sb_str(b, "[");
        for (size_t i = 0; i < v->u.arr.n; i++) {
            if (i) sb_str(b, ", ");
            repr(b, v->u.arr.items[i]);
        }
        sb_str(b, "]");
        break;
    case IG_JSON_OBJECT:
        sb_str(b, "{");
        for (size_t i = 0; i < v->u.obj.n; i++) {
            if (i) sb_str(b, ", ");
            repr_str(b, v->u.obj.members[i].key, v->u.obj.members[i].key_len);
            sb_str(b, ": ");
            repr(b, v->u.obj.members[i].value);
        }
        sb_str(b, "}");
        break;
    }
}

/* The bytes of s[0..n)'s first `chars` characters */
static size_t u8_prefix(const char *s, size_t n, size_t chars) {
    size_t i = 0;
    for (size_t c = 0; i < n && c < chars; c++) i += u8_len((unsigned char)s[i]);
    return i < n ? i : n;
}

/* repr(v), cut to `chars` characters when chars > 0 ("{v!r:.40}"); a malloc'd string */
static char *repr_cut(const ig_json *v, size_t chars) {
    sbuf b = {0};
    repr(&b, v);
    if (b.failed) {
        free(b.p);
        return strdup("...");
    }
    if (chars && b.p) b.p[u8_prefix(b.p, b.n, chars)] = 0;
    return b.p ? b.p : strdup("");
}

/* How the server's messages quote a key ("{k!r:.40}"): repr(key) cut to 40 characters, in the
 * caller's buffer (no allocation to fail: "..." when the repr itself could not be written). */
#define KEY_SHOWN_CHARS 40
typedef struct { char s[4 * KEY_SHOWN_CHARS + 1]; } shown_key;

static const char *repr_key(shown_key *out, const char *key, size_t len) {
    sbuf b = {0};
    repr_str(&b, key, len);
    if (b.failed || !b.p) {
        strcpy(out->s, "...");
    } else {
        size_t n = u8_prefix(b.p, b.n, KEY_SHOWN_CHARS);
        if (n > sizeof out->s - 1) n = sizeof out->s - 1;     /* 40 characters are at most 160 bytes */
        memcpy(out->s, b.p, n);
        out->s[n] = 0;
    }
    free(b.p);
    return out->s;
}

static const char *py_type(const ig_json *v) {
    if (v->type == IG_JSON_NUMBER) return v->flags & IG_JSON_INTEGER ? "int" : "float";
    return ig_json_type_name(v->type);
}

static int is_int(const ig_json *v) { return v && v->type == IG_JSON_NUMBER && (v->flags & IG_JSON_INTEGER); }
static int is_bool(const ig_json *v) { return v && (v->type == IG_JSON_TRUE || v->type == IG_JSON_FALSE); }
static int given(const ig_json *v) { return v && v->type != IG_JSON_NULL; }   /* null: not given */
/* bool(v) in Python (absent: None): false for null, false, 0, 0.0, "", [] and {} */
static int truthy(const ig_json *v) {
    if (!v) return 0;
    switch (v->type) {
    case IG_JSON_TRUE: return 1;
    case IG_JSON_NUMBER: return v->u.num.d != 0;     /* an integer's d is its value (inf when past a double) */
    case IG_JSON_STRING: return v->u.str.len != 0;
    case IG_JSON_ARRAY: return v->u.arr.n != 0;
    case IG_JSON_OBJECT: return v->u.obj.n != 0;
    default: return 0;
    }
}

/* ---- one request ------------------------------------------------------------------------------ */

typedef struct {
    ignis_model *m;
    ig_json_doc *doc;
    const ig_json *body;
    /* the error answered, when one is */
    int failed;
    sbuf msg;
    char param[512];
    int has_param;
    const char *code;             /* NULL: null */
    const char *type;
    /* tests only (ig_testonly_chat_forced): the answer's tokens, given rather than sampled */
    const int32_t *forced;
    size_t n_forced;
} req;

static int fail(req *r, const char *param, const char *code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int fail(req *r, const char *param, const char *code, const char *fmt, ...) {
    if (r->failed) return -1;
    r->failed = 1;
    char small[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < sizeof small) {
        sb_put(&r->msg, small, (size_t)n);
    } else if (n >= 0) {
        char *big = malloc((size_t)n + 1);
        if (big) {
            va_start(ap, fmt);
            vsnprintf(big, (size_t)n + 1, fmt, ap);
            va_end(ap);
            sb_put(&r->msg, big, (size_t)n);
            free(big);
        }
    }
    r->has_param = param != NULL;
    snprintf(r->param, sizeof r->param, "%s", param ? param : "");
    r->code = code;
    if (!r->type) r->type = "invalid_request_error";
    return -1;
}

/* {"error": {...}} as starlette's JSONResponse writes it; ignis_last_error gets the message */
static char *error_json(req *r) {
    ig_jw w;
    ig_jw_init(&w, IG_JW_COMPACT);
    ig_jw_begin_object(&w);
    ig_jw_key(&w, "error", 5);
    ig_jw_begin_object(&w);
    ig_jw_key(&w, "message", 7);
    ig_jw_cstr(&w, sb_text(&r->msg));
    ig_jw_key(&w, "type", 4);
    ig_jw_cstr(&w, r->type ? r->type : "invalid_request_error");
    ig_jw_key(&w, "param", 5);
    if (r->has_param) ig_jw_cstr(&w, r->param);
    else ig_jw_null(&w);
    ig_jw_key(&w, "code", 4);
    if (r->code) ig_jw_cstr(&w, r->code);
    else ig_jw_null(&w);
    ig_jw_end_object(&w);
    ig_jw_end_object(&w);
    ig_rt_set_error("%s", sb_text(&r->msg));
    return ig_jw_take(&w);
}

static const char *const LONE_SURROGATE_TAIL =
    "holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff, at character %ld), which is not valid "
    "Unicode text; send characters outside the Basic Multilingual Plane whole (or as a surrogate pair "
    "in JSON)";

/* params.check_text */
static int check_text(req *r, const char *s, size_t n, const char *param, const char *what) {
    const long at = lone_surrogate(s, n);
    if (at < 0) return 0;
    char fmt[400];
    snprintf(fmt, sizeof fmt, "%%s %s", LONE_SURROGATE_TAIL);
    return fail(r, param, "invalid_value", fmt, what ? what : param, at);
}

/* params.field_name: a key with lone surrogates spelled with \udXXX escapes */
static void field_name(sbuf *out, const char *parent, const char *key, size_t len) {
    if (parent && *parent) {
        sb_str(out, parent);
        sb_str(out, ".");
    }
    for (size_t i = 0; i < len;) {
        size_t l;
        const uint32_t c = u8_decode(key + i, len - i, &l);
        if (c >= 0xD800 && c <= 0xDFFF) sb_fmt(out, "\\u%04x", (unsigned)c);
        else sb_put(out, key + i, l);
        i += l;
    }
}

/* params.check_request_value's text check over one value (its depth was bounded by the parser, at
 * 64 levels, so this recursion is too): the first lone surrogate in document order, its place
 * spelled as path() spells it ("stop.[1]", "logit_bias.key") */
static int walk_texts(req *r, const ig_json *v, sbuf *path) {
    if (v->type == IG_JSON_STRING)
        return v->flags & IG_JSON_LONE_SURROGATE ? check_text(r, v->u.str.s, v->u.str.len, sb_text(path), NULL) : 0;
    if (v->type != IG_JSON_ARRAY && v->type != IG_JSON_OBJECT) return 0;
    const int keyed = v->type == IG_JSON_OBJECT;
    const size_t n = keyed ? v->u.obj.n : v->u.arr.n, base = path->n;
    if (keyed)
        for (size_t i = 0; i < n; i++) {
            const ig_json_member *mb = &v->u.obj.members[i];
            if (!(mb->key_flags & IG_JSON_LONE_SURROGATE)) continue;
            sbuf name = {0}, what = {0};
            field_name(&name, sb_text(path), mb->key, mb->key_len);
            sb_fmt(&what, "the field name '%s'", sb_text(&name));
            check_text(r, mb->key, mb->key_len, sb_text(&name), sb_text(&what));
            free(name.p), free(what.p);
            return -1;
        }
    for (size_t i = 0; i < n; i++) {
        const ig_json *x = keyed ? v->u.obj.members[i].value : v->u.arr.items[i];
        if (x->type != IG_JSON_STRING && x->type != IG_JSON_ARRAY && x->type != IG_JSON_OBJECT) continue;
        if (base) sb_str(path, ".");
        if (keyed) {
            if (v->u.obj.members[i].key_len) sb_put(path, v->u.obj.members[i].key, v->u.obj.members[i].key_len);
            else sb_str(path, "\"\"");
        } else {
            sb_fmt(path, "[%zu]", i);
        }
        const int rc = walk_texts(r, x, path);
        path->n = base;
        if (path->p) path->p[base] = 0;
        if (rc) return rc;
    }
    return 0;
}

static int check_value_texts(req *r, const ig_json *v, const char *param) {
    if (!v) return 0;
    sbuf path = {0};
    sb_str(&path, param);
    const int rc = walk_texts(r, v, &path);
    free(path.p);
    return rc;
}

/* ---- field checks: params.py's _number, _int, _stops, _logit_bias; client.py's _optional_* ------ */

static const ig_json *field(const req *r, const char *key) {
    const ig_json *v = ig_json_get(r->body, key);
    return given(v) ? v : NULL;
}

/* params._number: a number (not a bool) in [lo, hi] (or (lo, hi]) */
static int check_number(req *r, const char *name, const ig_json *v, double lo, double hi, int lo_open, double *out) {
    if (v->type != IG_JSON_NUMBER) {
        char *s = repr_cut(v, 40);
        fail(r, name, "invalid_type", "%s must be a number, got %s", name, s);
        free(s);
        return -1;
    }
    const double f = v->u.num.d;       /* an integer past the float range reads as inf, as float() */
    if (!isfinite(f) || f < lo || f > hi || (lo_open && f == lo)) {
        char *s = repr_cut(v, 40);
        fail(r, name, "invalid_value", "%s must be a number in %s%g, %g], got %s", name, lo_open ? "(" : "[", lo, hi, s);
        free(s);
        return -1;
    }
    *out = f;
    return 0;
}

/* params._int: an integer (not a bool) >= lo (and <= hi when has_hi), as int64 (seed: as u64) */
static int check_int(req *r, const char *name, const ig_json *v, int64_t lo, int has_hi, int64_t hi, int64_t *out) {
    if (!is_int(v)) {
        char *s = repr_cut(v, 0);
        fail(r, name, "invalid_type", "%s must be an integer, got %s", name, s);
        free(s);
        return -1;
    }
    const int fits = (v->flags & IG_JSON_FITS_I64) != 0;
    if (!fits || v->u.num.i < lo || (has_hi && v->u.num.i > hi)) {
        char *s = repr_cut(v, 0);
        if (has_hi) fail(r, name, "invalid_value", "%s must be an integer in [%" PRId64 ", %" PRId64 "], got %s", name, lo, hi, s);
        else fail(r, name, "invalid_value", "%s must be an integer >= %" PRId64 ", got %s", name, lo, s);
        free(s);
        return -1;
    }
    *out = v->u.num.i;
    return 0;
}

/* client._optional_bool / params' bool check ("{v!r:.40}" or "{v!r}") */
static int check_bool(req *r, const char *name, const ig_json *v, size_t cut, int *out) {
    if (!is_bool(v)) {
        char *s = repr_cut(v, cut);
        fail(r, name, "invalid_type", "%s must be true or false, got %s", name, s);
        free(s);
        return -1;
    }
    *out = v->type == IG_JSON_TRUE;
    return 0;
}

/* client._optional_int: an integer >= lo ("{v!r:.40}" for the type, the value for the range) */
static int check_optional_int(req *r, const char *name, const ig_json *v, int64_t lo, int64_t *out) {
    if (!is_int(v)) {
        char *s = repr_cut(v, 40);
        fail(r, name, "invalid_type", "%s must be an integer, got %s", name, s);
        free(s);
        return -1;
    }
    if (!(v->flags & IG_JSON_FITS_I64) ? v->u.num.text[0] == '-' : v->u.num.i < lo) {
        char *s = repr_cut(v, 0);
        fail(r, name, "invalid_value", "%s must be an integer >= %" PRId64 ", got %s", name, lo, s);
        free(s);
        return -1;
    }
    *out = (v->flags & IG_JSON_FITS_I64) ? v->u.num.i : INT64_MAX;
    return 0;
}

/* Python's int(str) for a logit_bias key: optional whitespace and sign, ASCII digits with single
 * underscores between them (other Unicode digits, which int() also reads, are refused here) */
static int parse_key_int(const char *s, size_t n, int64_t *out, int *overflow) {
    size_t i = 0, j = n;
    while (i < j && (s[i] == ' ' || (s[i] >= '\t' && s[i] <= '\r'))) i++;
    while (j > i && (s[j - 1] == ' ' || (s[j - 1] >= '\t' && s[j - 1] <= '\r'))) j--;
    int neg = 0;
    if (i < j && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
    if (i >= j || s[i] < '0' || s[i] > '9') return 0;
    uint64_t v = 0;
    *overflow = 0;
    for (; i < j; i++) {
        if (s[i] == '_') {
            if (i + 1 >= j || s[i + 1] < '0' || s[i + 1] > '9' || s[i - 1] == '_') return 0;
            continue;
        }
        if (s[i] < '0' || s[i] > '9') return 0;
        if (v > (UINT64_MAX - 9) / 10) *overflow = 1;
        else v = v * 10 + (uint64_t)(s[i] - '0');
    }
    if (v > INT64_MAX) *overflow = 1;
    *out = neg ? -(int64_t)v : (int64_t)v;
    return 1;
}

/* ---- the request's sampling and stop settings ---------------------------------------------------- */

typedef struct {
    ig_sampling_params sp;
    int32_t *bias_ids;
    double *bias_values;
    const char *stops[MAX_STOPS];
    size_t stop_lens[MAX_STOPS], n_stops;
    int ignore_eos;
    int64_t max_tokens;
} gen_request;

static void gen_request_free(gen_request *g) {
    free(g->bias_ids);
    free(g->bias_values);
}

/* params.resolve_params over the model's generation defaults, for the fields a completions
 * request carries; max_tokens was checked by the caller. */
static int resolve_params(req *r, gen_request *g, const ig_json *logprobs) {
    const gen_defaults *d = &r->m->gen;
    ig_sampling_params *p = &g->sp;
    memset(p, 0, sizeof *p);
    p->temperature = d->do_sample ? d->temperature : 0.0;
    p->top_k = d->do_sample ? d->top_k : 0;
    p->top_p = d->do_sample ? d->top_p : 1.0;
    p->min_p = d->do_sample ? d->min_p : 0.0;
    p->repetition_penalty = d->repetition_penalty;
    const ig_json *v;
    if ((v = field(r, "temperature")) && check_number(r, "temperature", v, 0.0, 2.0, 0, &p->temperature)) return -1;
    if ((v = field(r, "top_k")) && check_int(r, "top_k", v, 0, 0, 0, &p->top_k)) return -1;
    if ((v = field(r, "top_p")) && check_number(r, "top_p", v, 0.0, 1.0, 1, &p->top_p)) return -1;
    if ((v = field(r, "min_p")) && check_number(r, "min_p", v, 0.0, 1.0, 0, &p->min_p)) return -1;
    if ((v = field(r, "repetition_penalty")) &&
        check_number(r, "repetition_penalty", v, 0.0, 10.0, 1, &p->repetition_penalty))
        return -1;
    if ((v = field(r, "presence_penalty")) && check_number(r, "presence_penalty", v, -2.0, 2.0, 0, &p->presence_penalty))
        return -1;
    if ((v = field(r, "frequency_penalty")) &&
        check_number(r, "frequency_penalty", v, -2.0, 2.0, 0, &p->frequency_penalty))
        return -1;
    if ((v = field(r, "logit_bias"))) {
        if (v->type != IG_JSON_OBJECT)
            return fail(r, "logit_bias", "invalid_type", "logit_bias must map token ids to numbers, got %s", py_type(v));
        const size_t n = v->u.obj.n;
        g->bias_ids = malloc((n ? n : 1) * sizeof *g->bias_ids);
        g->bias_values = malloc((n ? n : 1) * sizeof *g->bias_values);
        if (!g->bias_ids || !g->bias_values) return fail(r, NULL, NULL, "out of memory");
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            const ig_json_member *mb = &v->u.obj.members[i];
            int64_t tid;
            int overflow = 0;
            if (!parse_key_int(mb->key, mb->key_len, &tid, &overflow)) {
                sbuf s = {0};
                repr_str(&s, mb->key, mb->key_len);
                fail(r, "logit_bias", "invalid_type", "logit_bias key %s is not a token id", sb_text(&s));
                free(s.p);
                return -1;
            }
            if (overflow || tid < 0 || tid >= r->m->vocab) {
                sbuf s = {0};
                repr_str(&s, mb->key, mb->key_len);
                fail(r, "logit_bias", "invalid_value", "logit_bias key %s is not a token id of this model (0..%d)",
                     sb_text(&s), r->m->vocab - 1);
                free(s.p);
                return -1;
            }
            double x;
            if (check_number(r, "logit_bias", mb->value, -100.0, 100.0, 0, &x)) return -1;
            size_t at = 0;
            while (at < k && g->bias_ids[at] != (int32_t)tid) at++;     /* "5" and "05": one id */
            g->bias_ids[at] = (int32_t)tid;
            g->bias_values[at] = x;
            if (at == k) k++;
        }
        p->bias_ids = g->bias_ids, p->bias_values = g->bias_values, p->n_bias = k;
    }
    if ((v = field(r, "seed"))) {
        /* [-2^63, 2^64 - 1], reduced modulo 2^64 as sampler.py does */
        if (!is_int(v)) {
            char *s = repr_cut(v, 0);
            fail(r, "seed", "invalid_type", "seed must be an integer, got %s", s);
            free(s);
            return -1;
        }
        if (!(v->flags & (IG_JSON_FITS_I64 | IG_JSON_FITS_U64))) {
            char *s = repr_cut(v, 0);
            fail(r, "seed", "invalid_value", "seed must be an integer in [-9223372036854775808, 18446744073709551615], got %s", s);
            free(s);
            return -1;
        }
        p->has_seed = 1;
        p->seed = (v->flags & IG_JSON_FITS_U64) ? v->u.num.u : (uint64_t)v->u.num.i;
    }
    if ((v = field(r, "stop"))) {
        const ig_json *one[1] = {v};
        const ig_json *const *items = one;
        size_t n = 1;
        if (v->type == IG_JSON_ARRAY) {
            items = (const ig_json *const *)v->u.arr.items, n = v->u.arr.n;
        } else if (v->type != IG_JSON_STRING) {
            return fail(r, "stop", "invalid_type", "stop must be a string or a list of strings, got %s", py_type(v));
        }
        if (n > MAX_STOPS) return fail(r, "stop", "invalid_value", "stop takes at most %d strings, got %zu", MAX_STOPS, n);
        for (size_t i = 0; i < n; i++) {
            const ig_json *s = items[i];
            if (s->type != IG_JSON_STRING) {
                char *t = repr_cut(s, 0);
                fail(r, "stop", "invalid_type", "stop strings must be strings, got %s", t);
                free(t);
                return -1;
            }
            if (s->flags & IG_JSON_LONE_SURROGATE) {
                char *t = repr_cut(s, 60);
                sbuf what = {0};
                sb_fmt(&what, "stop string %s", t);
                check_text(r, s->u.str.s, s->u.str.len, "stop", sb_text(&what));
                free(t), free(what.p);
                return -1;
            }
            if (!s->u.str.len)
                return fail(r, "stop", "invalid_value", "stop strings must not be empty (an empty string would match "
                                                        "before the first token)");
            int dup = 0;
            for (size_t j = 0; j < g->n_stops && !dup; j++)
                dup = g->stop_lens[j] == s->u.str.len && memcmp(g->stops[j], s->u.str.s, s->u.str.len) == 0;
            if (!dup) g->stops[g->n_stops] = s->u.str.s, g->stop_lens[g->n_stops++] = s->u.str.len;
        }
    }
    if ((v = field(r, "ignore_eos")) && check_bool(r, "ignore_eos", v, 0, &g->ignore_eos)) return -1;
    if (logprobs) {     /* completions' logprobs N: logprobs=True, top_logprobs=N or None */
        p->logprobs = 1;
        p->top_logprobs = (int)logprobs->u.num.i;
    }
    return 0;
}

/* ---- generating: ignis/generate/loop.py Generation.__iter__ ----------------------------------- */

typedef struct {
    ignis_chunk_cb cb;
    void *user;
    const char *id, *model, *fingerprint;
    size_t model_len;
    long long created;
    int cancelled;
    int chat;                     /* chat.completion.chunk rather than text_completion */
    int64_t index;                /* the choice being generated */
    const ignis_model *m;
    int logprobs;                 /* chunks carry their tokens' logprobs */
    ig_answer *answer;            /* chat: the choice's reader (reasoning, tool calls) */
    ig_deltas deltas;             /* its scratch */
    int failed;                   /* out of memory writing a chunk */
} emitter;

typedef struct {
    int32_t token;
    size_t start;                 /* where its text starts in the completion, in characters */
    size_t start_b, end_b;        /* ... in bytes, and where it ends (SIZE_MAX: not all decoded yet) */
    ig_token_logprob info;
} token_lp;

static void write_chat_logprobs(ig_jw *w, const ignis_model *m, const token_lp *lps, size_t n);
static void write_text_logprobs(ig_jw *w, const ignis_model *m, const token_lp *lps, size_t n);

/* one chat.completion.chunk: a delta with content (NULL: null) and role (NULL: null), or the
 * reader's delta d; lps (with e->logprobs and has_lp): the logprobs of the tokens it completes */
static int emit_chat_delta(emitter *e, const char *content, size_t len, const char *role, const ig_delta *d,
                           const token_lp *lps, size_t n_lps, int has_lp, const char *finish) {
    ig_jw w;
    ig_jw_init(&w, IG_JW_SPACED);
    ig_jw_begin_object(&w);
    ig_jw_key(&w, "id", 2), ig_jw_cstr(&w, e->id);
    ig_jw_key(&w, "choices", 7), ig_jw_begin_array(&w), ig_jw_begin_object(&w);
    ig_jw_key(&w, "delta", 5), ig_jw_begin_object(&w);
    ig_jw_key(&w, "content", 7);
    if (d && d->kind == IG_DELTA_CONTENT) ig_jw_string(&w, d->text, d->len);
    else if (content) ig_jw_string(&w, content, len);
    else ig_jw_null(&w);
    ig_jw_key(&w, "function_call", 13), ig_jw_null(&w);
    ig_jw_key(&w, "refusal", 7), ig_jw_null(&w);
    ig_jw_key(&w, "role", 4);
    if (role) ig_jw_cstr(&w, role);
    else ig_jw_null(&w);
    ig_jw_key(&w, "tool_calls", 10);
    if (d && (d->kind == IG_DELTA_CALL || d->kind == IG_DELTA_ARGUMENTS)) {
        /* as OpenAI streams a call: its id, type and name first, then pieces of its arguments */
        ig_jw_begin_array(&w), ig_jw_begin_object(&w);
        ig_jw_key(&w, "index", 5), ig_jw_int(&w, d->index);
        if (d->kind == IG_DELTA_CALL) {
            ig_jw_key(&w, "id", 2), ig_jw_cstr(&w, d->id);
            ig_jw_key(&w, "type", 4), ig_jw_cstr(&w, "function");
        }
        ig_jw_key(&w, "function", 8), ig_jw_begin_object(&w);
        if (d->kind == IG_DELTA_CALL) ig_jw_key(&w, "name", 4), ig_jw_string(&w, d->name, d->name_len);
        ig_jw_key(&w, "arguments", 9);
        if (d->kind == IG_DELTA_CALL) ig_jw_cstr(&w, "");
        else ig_jw_string(&w, d->text, d->len);
        ig_jw_end_object(&w), ig_jw_end_object(&w), ig_jw_end_array(&w);
    } else {
        ig_jw_null(&w);
    }
    ig_jw_key(&w, "reasoning_content", 17);
    if (d && d->kind == IG_DELTA_REASONING) ig_jw_string(&w, d->text, d->len);
    else ig_jw_null(&w);
    ig_jw_end_object(&w);
    ig_jw_key(&w, "index", 5), ig_jw_int(&w, e->index);
    ig_jw_key(&w, "finish_reason", 13);
    if (finish) ig_jw_cstr(&w, finish);
    else ig_jw_null(&w);
    ig_jw_key(&w, "logprobs", 8);
    if (e->logprobs && has_lp) write_chat_logprobs(&w, e->m, lps, n_lps);
    else ig_jw_null(&w);
    ig_jw_end_object(&w), ig_jw_end_array(&w);
    ig_jw_key(&w, "created", 7), ig_jw_int(&w, e->created);
    ig_jw_key(&w, "model", 5), ig_jw_string(&w, e->model, e->model_len);
    ig_jw_key(&w, "object", 6), ig_jw_cstr(&w, "chat.completion.chunk");
    ig_jw_key(&w, "service_tier", 12), ig_jw_null(&w);
    ig_jw_key(&w, "system_fingerprint", 18), ig_jw_cstr(&w, e->fingerprint);
    ig_jw_key(&w, "usage", 5), ig_jw_null(&w);
    ig_jw_end_object(&w);
    char *s = ig_jw_take(&w);
    if (!s) return -1;
    if (e->cb(s, e->user) != 0) e->cancelled = 1;
    free(s);
    return 0;
}

static int emit_chat(emitter *e, const char *content, size_t len, const char *role, const char *finish) {
    return emit_chat_delta(e, content, len, role, NULL, NULL, 0, 0, finish);
}

/* a piece of a chat answer (client._chunks): as content, or through the choice's reader, the
 * logprobs with the first delta (an empty content delta when there is none) */
static int emit_chat_piece(emitter *e, const char *text, size_t len, const token_lp *lps, size_t n_lps) {
    if (!e->answer || ig_answer_plain(e->answer)) return emit_chat_delta(e, text, len, NULL, NULL, lps, n_lps, 1, NULL);
    ig_deltas *ds = &e->deltas;
    ig_deltas_clear(ds);
    if (ig_answer_feed(e->answer, text, len, ds)) return -1;
    if (!ds->n && e->logprobs) return emit_chat_delta(e, "", 0, NULL, NULL, lps, n_lps, 1, NULL);
    for (size_t k = 0; k < ds->n && !e->cancelled; k++)
        if (emit_chat_delta(e, NULL, 0, NULL, &ds->d[k], lps, n_lps, k == 0, NULL)) return -1;
    return 0;
}

/* one text_completion chunk as the server's stream sends it (json.dumps' separators), or a chat
 * answer's piece; lps: the logprobs of the tokens whose text the piece completes */
static int emit(emitter *e, const char *text, size_t len, const token_lp *lps, size_t n_lps, const char *finish) {
    if (e->chat) return finish ? emit_chat(e, NULL, 0, NULL, finish) : emit_chat_piece(e, text, len, lps, n_lps);
    ig_jw w;
    ig_jw_init(&w, IG_JW_SPACED);
    ig_jw_begin_object(&w);
    ig_jw_key(&w, "id", 2), ig_jw_cstr(&w, e->id);
    ig_jw_key(&w, "choices", 7), ig_jw_begin_array(&w), ig_jw_begin_object(&w);
    ig_jw_key(&w, "finish_reason", 13);
    if (finish) ig_jw_cstr(&w, finish);
    else ig_jw_null(&w);
    ig_jw_key(&w, "index", 5), ig_jw_int(&w, e->index);
    ig_jw_key(&w, "text", 4), ig_jw_string(&w, text, len);
    ig_jw_key(&w, "logprobs", 8);
    if (e->logprobs && !finish) write_text_logprobs(&w, e->m, lps, n_lps);
    else ig_jw_null(&w);
    ig_jw_end_object(&w), ig_jw_end_array(&w);
    ig_jw_key(&w, "created", 7), ig_jw_int(&w, e->created);
    ig_jw_key(&w, "model", 5), ig_jw_string(&w, e->model, e->model_len);
    ig_jw_key(&w, "object", 6), ig_jw_cstr(&w, "text_completion");
    ig_jw_key(&w, "system_fingerprint", 18), ig_jw_cstr(&w, e->fingerprint);
    ig_jw_key(&w, "usage", 5), ig_jw_null(&w);
    ig_jw_end_object(&w);
    char *s = ig_jw_take(&w);
    if (!s) return -1;
    if (e->cb(s, e->user) != 0) e->cancelled = 1;
    free(s);
    return 0;
}

typedef struct {
    sbuf text;                    /* every complete character decoded (Python's dec.text) */
    size_t cut;                   /* the answer is text[:cut] */
    const char *finish;
    int64_t completion_tokens;
    token_lp *lps;                /* with logprobs: each sampled token but an end-of-sequence one */
    size_t n_lps, cap_lps;
    size_t n_sent;                /* ... of which a stream has sent the first n_sent */
} gen_result;

/* Generation's complete_by: the logprobs not sent yet of the tokens with all their text before
 * byte `end`, marked sent */
static size_t release_lps(gen_result *o, size_t end, const token_lp **lps) {
    size_t n = o->n_sent;
    while (n < o->n_lps && o->lps[n].end_b != SIZE_MAX && o->lps[n].end_b <= end) n++;
    *lps = o->lps + o->n_sent;
    const size_t k = n - o->n_sent;
    o->n_sent = n;
    return k;
}

/* StopMatcher.find: the earliest stop string at or after `start - len + 1`; -1 if none */
static long stop_find(const gen_request *g, const sbuf *t, size_t start, size_t *which) {
    long best = -1;
    for (size_t k = 0; k < g->n_stops; k++) {
        const size_t len = g->stop_lens[k];
        const size_t from = start >= len ? start - len + 1 : 0;
        if (t->n < from || t->n - from < len) continue;
        const char *hit = memmem(t->p + from, t->n - from, g->stops[k], len);
        if (hit && (best < 0 || hit - t->p < best)) best = hit - t->p, *which = k;
    }
    return best;
}

/* StopMatcher.safe_end: text before the longest end of text[start:] that begins a stop string
 * and is shorter (in characters) than the longest one */
static size_t stop_safe_end(const gen_request *g, const sbuf *t, size_t start) {
    size_t longest = 0;
    for (size_t k = 0; k < g->n_stops; k++) {
        const size_t c = u8_chars(g->stops[k], g->stop_lens[k]);
        if (c > longest) longest = c;
    }
    /* the start of the tail of (longest - 1) characters, not before `start` */
    size_t p = t->n, chars = 0;
    while (p > start && chars + 1 < longest) {
        p--;
        while (p > start && ((unsigned char)t->p[p] & 0xC0) == 0x80) p--;
        chars++;
    }
    for (; p < t->n; p += u8_len((unsigned char)t->p[p])) {
        const size_t tail = t->n - p;
        for (size_t k = 0; k < g->n_stops; k++)
            if (g->stop_lens[k] >= tail && memcmp(g->stops[k], t->p + p, tail) == 0) return p;
    }
    return t->n;
}

static int is_eos(const ignis_model *m, int32_t tok) {
    for (int i = 0; i < m->n_eos; i++)
        if (m->eos[i] == tok) return 1;
    return 0;
}

/* Generate after `prompt` (checked by the caller); the caller holds m->lock. */
static int generate(req *r, const gen_request *g, const int32_t *prompt, size_t n_prompt, int64_t budget,
                    emitter *e, gen_result *out) {
    ignis_model *m = r->m;
    char err[256];
    ig_sampler *s = ig_sampler_new(&g->sp, m->vocab, m->valid_ids, prompt, n_prompt, err, sizeof err);
    if (!s) return fail(r, NULL, NULL, "%s", err);
    int continuation = 0;
    for (size_t i = 0; i < n_prompt && !continuation; i++) continuation = !ig_tok_is_special(m->tok, prompt[i]);
    const int flags = IG_TOK_STREAM_SKIP_SPECIAL | (continuation ? IG_TOK_STREAM_CONTINUATION : 0);
    ig_tok_stream *chars = ig_tok_stream_new(m->tok, flags | IG_TOK_STREAM_CHARS);
    ig_tok_stream *clusters = ig_tok_stream_new(m->tok, flags);   /* its output ends at final_end() */
    int rc = 0;
    if (!chars || !clusters) {
        rc = fail(r, NULL, NULL, "out of memory");
        goto done;
    }
    out->finish = "length";
    out->cut = (size_t)-1;
    size_t emitted = 0, final_end = 0;
    const float *logits;
    m->n_past = 0;
    if (ig_rt_run_tokens(m, prompt, (int)n_prompt, &logits) != 0) {
        rc = fail(r, NULL, NULL, "%s", ignis_last_error());
        goto done;
    }
    for (;;) {
        ig_token_logprob info;
        const int32_t tok = r->forced ? r->forced[out->completion_tokens]
                                      : ig_sampler_sample(s, logits, NULL, g->sp.logprobs ? &info : NULL);
        if (r->forced) memset(&info, 0, sizeof info);     /* (no logprobs for given tokens) */
        if (tok < 0) {
            rc = fail(r, NULL, NULL, "no token is left to sample from (every id is masked)");
            goto done;
        }
        out->completion_tokens++;
        if (!g->ignore_eos && is_eos(m, tok)) {
            out->finish = "stop";
            break;
        }
        if (g->sp.logprobs) {     /* Generation: the token's text starts where the text ends now */
            if (out->n_lps == out->cap_lps) {
                const size_t cap = out->cap_lps ? 2 * out->cap_lps : 64;
                token_lp *q = realloc(out->lps, cap * sizeof *q);
                if (!q) {
                    rc = fail(r, NULL, NULL, "out of memory");
                    goto done;
                }
                out->lps = q, out->cap_lps = cap;
            }
            out->lps[out->n_lps++] = (token_lp){tok, u8_chars(out->text.p ? out->text.p : "", out->text.n),
                                                out->text.n, SIZE_MAX, info};
        }
        const char *piece;
        size_t len;
        int trc = ig_tok_stream_push(chars, tok, &piece, &len);
        if (trc == 0) sb_put(&out->text, piece, len);
        if (trc == 0 && g->sp.logprobs && ig_tok_stream_whole(chars))     /* dec.whole */
            for (size_t k = out->n_sent; k < out->n_lps; k++)
                if (out->lps[k].end_b == SIZE_MAX) out->lps[k].end_b = out->text.n;
        if (trc == 0) trc = ig_tok_stream_push(clusters, tok, &piece, &len);
        if (trc != 0 || out->text.failed) {
            rc = fail(r, NULL, NULL, "decoding token %d failed: %s", (int)tok, ig_tok_strerror(trc));
            goto done;
        }
        final_end += len;
        if (g->n_stops) {
            size_t which;
            const long hit = stop_find(g, &out->text, emitted, &which);
            if (hit >= 0) {
                out->finish = "stop";
                out->cut = (size_t)hit;
                break;
            }
        }
        size_t end = g->n_stops ? stop_safe_end(g, &out->text, emitted) : out->text.n;
        if (end > final_end) end = final_end;     /* the last grapheme cluster may still grow */
        if (end > emitted) {
            const token_lp *lps;
            const size_t n_lps = release_lps(out, end, &lps);
            if (e && emit(e, out->text.p + emitted, end - emitted, lps, n_lps, NULL) != 0) {
                rc = fail(r, NULL, NULL, "out of memory");
                goto done;
            }
            emitted = end;
            if (e && e->cancelled) goto done;
        }
        if (r->forced && (size_t)out->completion_tokens == r->n_forced) {
            out->finish = "stop";         /* as a grammar's answer ends once it is complete */
            break;
        }
        if (out->completion_tokens >= budget) break;
        if (ig_rt_run_tokens(m, &tok, 1, &logits) != 0) {
            rc = fail(r, NULL, NULL, "%s", ignis_last_error());
            goto done;
        }
    }
    if (out->cut == (size_t)-1) {
        const char *piece;
        size_t len;
        if (ig_tok_stream_finish(chars, &piece, &len) == 0) sb_put(&out->text, piece, len);
        out->cut = out->text.n;
    }
    if (out->text.failed) {
        rc = fail(r, NULL, NULL, "out of memory");
        goto done;
    }
    /* the rest: at a stop string's cut, the tokens whose text starts before it */
    size_t n_rest = 0;
    if (out->finish[0] == 'l' || out->cut == out->text.n)
        n_rest = out->n_lps - out->n_sent;
    else
        while (out->n_sent + n_rest < out->n_lps && out->lps[out->n_sent + n_rest].start_b < out->cut) n_rest++;
    /* cut >= emitted: stop_safe_end never releases text a stop string may begin in, so a stop
     * string found begins after it; clamped all the same, so a broken invariant sends no text
     * rather than a size_t wrapped round to a read past the buffer */
    const size_t tail = out->cut > emitted ? out->cut - emitted : 0;
    if (e && (tail || n_rest) && emit(e, out->text.p + emitted, tail, out->lps + out->n_sent, n_rest, NULL) != 0)
        rc = fail(r, NULL, NULL, "out of memory");
    out->n_sent += n_rest;
done:
    ig_tok_stream_free(chars);
    ig_tok_stream_free(clusters);
    ig_sampler_free(s);
    return rc;
}

static void emit_usage(emitter *e, int64_t prompt, int64_t completion);

/* bytes.decode("utf-8", "replace"): each maximal ill-formed part becomes one U+FFFD */
static void utf8_replace(sbuf *b, const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        const unsigned char c = s[i];
        size_t need = 0;
        unsigned char lo = 0x80, hi = 0xBF;
        if (c < 0x80) {
            sb_put(b, (const char *)s + i++, 1);
            continue;
        }
        if (c >= 0xC2 && c <= 0xDF) need = 1;
        else if (c >= 0xE0 && c <= 0xEF) need = 2, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
        else if (c >= 0xF0 && c <= 0xF4) need = 3, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
        size_t k = 1;
        while (need && k <= need && i + k < n && s[i + k] >= (k == 1 ? lo : 0x80) && s[i + k] <= (k == 1 ? hi : 0xBF)) k++;
        if (need && k == need + 1) sb_put(b, (const char *)s + i, k);
        else sb_str(b, "\xef\xbf\xbd");
        i += need && k == need + 1 ? k : (k > 1 ? k : 1);
    }
}

static void write_token_text(ig_jw *w, const ignis_model *m, int32_t id, int as_key) {
    const char *bytes = "";
    size_t n = 0;
    ig_tok_token_bytes(m->tok, id, &bytes, &n);
    sbuf t = {0};
    utf8_replace(&t, (const unsigned char *)bytes, n);
    if (as_key) ig_jw_key(w, t.p ? t.p : "", t.n);
    else ig_jw_string(w, t.p ? t.p : "", t.n);
    free(t.p);
}

/* The answer's tokens with logprobs: those whose text starts before a stop string's cut, as
 * Generation keeps them */
static size_t kept_lps(const gen_result *o) {
    size_t n = o->n_lps;
    if (o->cut < o->text.n)
        while (n && o->lps[n - 1].start_b >= o->cut) n--;
    return n;
}

/* a token as OpenAI's chat logprobs give it: its text, its bytes, its logprob */
static void write_token_entry(ig_jw *w, const ignis_model *m, int32_t id, double logprob) {
    const char *bytes = "";
    size_t n = 0;
    ig_tok_token_bytes(m->tok, id, &bytes, &n);
    ig_jw_key(w, "token", 5), write_token_text(w, m, id, 0);
    ig_jw_key(w, "bytes", 5), ig_jw_begin_array(w);
    for (size_t i = 0; i < n; i++) ig_jw_int(w, (unsigned char)bytes[i]);
    ig_jw_end_array(w);
    ig_jw_key(w, "logprob", 7), ig_jw_double(w, logprob);
}

/* client._chat_logprobs: ChoiceLogprobs of n tokens, each with its top alternatives */
static void write_chat_logprobs(ig_jw *w, const ignis_model *m, const token_lp *lps, size_t n) {
    ig_jw_begin_object(w);
    ig_jw_key(w, "content", 7), ig_jw_begin_array(w);
    for (size_t i = 0; i < n; i++) {
        const ig_token_logprob *x = &lps[i].info;
        ig_jw_begin_object(w);
        write_token_entry(w, m, lps[i].token, x->logprob);
        ig_jw_key(w, "top_logprobs", 12), ig_jw_begin_array(w);
        for (int k = 0; k < x->n_top; k++) {
            ig_jw_begin_object(w);
            write_token_entry(w, m, x->top[k].token_id, x->top[k].logprob);
            ig_jw_end_object(w);
        }
        ig_jw_end_array(w);
        ig_jw_end_object(w);
    }
    ig_jw_end_array(w);
    ig_jw_key(w, "refusal", 7), ig_jw_null(w);
    ig_jw_end_object(w);
}

/* client._text_logprobs: the legacy logprobs object of n tokens */
static void write_text_logprobs(ig_jw *w, const ignis_model *m, const token_lp *lps, size_t n) {
    ig_jw_begin_object(w);
    ig_jw_key(w, "text_offset", 11), ig_jw_begin_array(w);
    for (size_t i = 0; i < n; i++) ig_jw_int(w, (int64_t)lps[i].start);
    ig_jw_end_array(w);
    ig_jw_key(w, "token_logprobs", 14), ig_jw_begin_array(w);
    for (size_t i = 0; i < n; i++) ig_jw_double(w, lps[i].info.logprob);
    ig_jw_end_array(w);
    ig_jw_key(w, "tokens", 6), ig_jw_begin_array(w);
    for (size_t i = 0; i < n; i++) write_token_text(w, m, lps[i].token, 0);
    ig_jw_end_array(w);
    ig_jw_key(w, "top_logprobs", 12), ig_jw_begin_array(w);
    for (size_t i = 0; i < n; i++) {
        /* a dict: alternatives spelled alike keep the first one's place and the last one's value */
        const ig_token_logprob *x = &lps[i].info;
        ig_jw_begin_object(w);
        for (int k = 0; k < x->n_top; k++) {
            int later = -1;
            sbuf a = {0};
            const char *ab = "";
            size_t an = 0;
            ig_tok_token_bytes(m->tok, x->top[k].token_id, &ab, &an);
            utf8_replace(&a, (const unsigned char *)ab, an);
            int dup = 0;
            for (int j = 0; j < x->n_top; j++) {
                if (j == k) continue;
                sbuf bt = {0};
                const char *bb = "";
                size_t bn = 0;
                ig_tok_token_bytes(m->tok, x->top[j].token_id, &bb, &bn);
                utf8_replace(&bt, (const unsigned char *)bb, bn);
                const int same = bt.n == a.n && (a.n == 0 || memcmp(bt.p, a.p, a.n) == 0);
                free(bt.p);
                if (same && j < k) dup = 1;
                if (same && j > k) later = j;
            }
            if (!dup) {
                ig_jw_key(w, a.p ? a.p : "", a.n);
                ig_jw_double(w, x->top[later >= 0 ? later : k].logprob);
            }
            free(a.p);
        }
        ig_jw_end_object(w);
    }
    ig_jw_end_array(w);
    ig_jw_end_object(w);
}

/* ---- /v1/completions ------------------------------------------------------------------------- */

/* completions.create's parameters (its signature's order: _check_request walks them so), and the
 * extra_body fields the server lifts out of the body (EXTRA_COMPLETIONS, in that order) */
static const char *const COMPLETIONS_FIELDS[] = {
    "model", "prompt", "max_tokens", "temperature", "top_p", "stop", "seed", "logprobs", "echo", "n",
    "best_of", "presence_penalty", "frequency_penalty", "logit_bias", "stream", "stream_options",
    "suffix", "user", "extra_body", NULL};
static const char *const COMPLETIONS_EXTRA[] = {
    "top_k", "min_p", "repetition_penalty", "ignore_eos", "guided_json", "guided_choice", "guided_regex",
    "guided_grammar", "split_special_tokens", "response_format", NULL};

static int listed(const char *const *names, const char *key, size_t len) {
    for (; *names; names++)
        if (strlen(*names) == len && memcmp(*names, key, len) == 0) return 1;
    return 0;
}

/* check_request_value's depth rule (texts=False) as the server applies it after parsing: the
 * first list or object (in document order) more than MAX_NESTING levels deep, its place in
 * `path` as path() spells it. The parser bounds the depth at PARSE_DEPTH, so the recursion is. */
static int too_deep(const ig_json *v, int level, sbuf *path) {
    if (v->type != IG_JSON_ARRAY && v->type != IG_JSON_OBJECT) return 0;
    if (level > MAX_NESTING) return 1;
    const int keyed = v->type == IG_JSON_OBJECT;
    const size_t n = keyed ? v->u.obj.n : v->u.arr.n, base = path->n;
    for (size_t i = 0; i < n; i++) {
        const ig_json *x = keyed ? v->u.obj.members[i].value : v->u.arr.items[i];
        if (x->type != IG_JSON_ARRAY && x->type != IG_JSON_OBJECT) continue;
        if (base) sb_str(path, ".");
        if (!keyed) sb_fmt(path, "[%zu]", i);
        else if (v->u.obj.members[i].key_len) sb_put(path, v->u.obj.members[i].key, v->u.obj.members[i].key_len);
        else sb_str(path, "\"\"");
        if (too_deep(x, level + 1, path)) return 1;
        path->n = base;
        if (path->p) path->p[base] = 0;
    }
    return 0;
}

/* server._json_body: the parse, its errors as the server words them */
static int read_body(req *r, const char *text) {
    ig_json_limits lim = {PARSE_DEPTH, MAX_BODY_BYTES, MAX_BODY_BYTES};
    ig_json_error je;
    r->doc = ig_json_parse(text, strlen(text), &lim, &je);
    if (!r->doc) {
        switch (je.status) {
        case IG_JSON_E_SIZE:
            return fail(r, NULL, "request_too_large", "the request body is larger than %zu bytes", MAX_BODY_BYTES);
        case IG_JSON_E_DEPTH:         /* json.loads' RecursionError: no place named */
            return fail(r, NULL, "invalid_json", "the request body nests JSON arrays and objects more than %d levels "
                        "deep; ignis reads at most %d levels", MAX_NESTING, MAX_NESTING);
        case IG_JSON_E_MEMORY:
            r->type = "server_error";
            return fail(r, NULL, NULL, "out of memory reading the request");
        default:
            return fail(r, NULL, "invalid_json", "the request body is not valid JSON (%s); send a JSON object", je.message);
        }
    }
    r->body = ig_json_root(r->doc);
    if (r->body->type != IG_JSON_OBJECT)
        return fail(r, NULL, "invalid_json", "the request body must be a JSON object, got %s", py_type(r->body));
    sbuf path = {0};
    const int deep = too_deep(r->body, 1, &path);
    if (deep && !path.failed) {
        const size_t n = path.n, cut = u8_chars(path.p, n) > 60;
        size_t at = n;
        if (cut) {
            at = 0;
            for (size_t c = 0; c < 60; c++) at += u8_len((unsigned char)path.p[at]);
        }
        fail(r, path.p, "invalid_json", "the request body nests JSON arrays and objects more than %d levels deep (at "
             "%.*s%s); ignis reads at most %d levels", MAX_NESTING, (int)at, path.p, cut ? "..." : "", MAX_NESTING);
    }
    free(path.p);
    return deep ? -1 : 0;
}

/* sorted(k for k in obj if k in neither list)[0] (UTF-8 byte order is code point order); NULL: none.
 * extra may be NULL. */
static const ig_json_member *smallest_unknown(const ig_json *obj, const char *const *allowed, const char *const *extra) {
    const ig_json_member *first = NULL;
    for (size_t i = 0; i < obj->u.obj.n; i++) {
        const ig_json_member *mb = &obj->u.obj.members[i];
        if (listed(allowed, mb->key, mb->key_len) || (extra && listed(extra, mb->key, mb->key_len))) continue;
        const size_t n = first && first->key_len < mb->key_len ? first->key_len : mb->key_len;
        const int c = first ? memcmp(mb->key, first->key, n) : -1;
        if (c < 0 || (c == 0 && mb->key_len < first->key_len)) first = mb;
    }
    return first;
}

/* server._kwargs: field names, the model's name, required and unknown fields */
static int check_fields(req *r, const char *const *allowed, const char *const *extra, const char *const *required) {
    const ig_json *b = r->body;
    for (size_t i = 0; i < b->u.obj.n; i++) {
        const ig_json_member *mb = &b->u.obj.members[i];
        if (mb->key_flags & IG_JSON_LONE_SURROGATE) {
            sbuf name = {0}, what = {0};
            field_name(&name, NULL, mb->key, mb->key_len);
            sb_fmt(&what, "the field name '%s'", sb_text(&name));
            check_text(r, mb->key, mb->key_len, sb_text(&name), sb_text(&what));
            free(name.p), free(what.p);
            return -1;
        }
    }
    const ig_json *model = ig_json_get(b, "model");
    if (model && model->type == IG_JSON_STRING && check_text(r, model->u.str.s, model->u.str.len, "model", NULL))
        return -1;
    for (; *required; required++)
        if (!ig_json_get(b, *required))
            return fail(r, *required, "missing_required_parameter", "Missing required parameter: '%s'.", *required);
    const ig_json_member *first = smallest_unknown(b, allowed, extra);     /* sorted(unknown)[0] */
    if (first) {
        char param[512];
        snprintf(param, sizeof param, "%.*s", (int)(first->key_len < 500 ? first->key_len : 500), first->key);
        return fail(r, param, "unknown_parameter", "Unrecognized request argument supplied: %s", first->key);
    }
    if (model && model->type == IG_JSON_STRING && model->u.str.len && strcmp(model->u.str.s, r->m->model_name) != 0) {
        sbuf a = {0}, c = {0};
        repr_str(&a, model->u.str.s, model->u.str.len);
        repr_str(&c, r->m->model_name, strlen(r->m->model_name));
        fail(r, "model", "model_not_found", "The model %s does not exist; this server serves %s", sb_text(&a), sb_text(&c));
        free(a.p), free(c.p);
        return -1;
    }
    return 0;
}

/* client._check_request: every value's text, in create()'s parameter order, then the extras */
static int check_all_texts(req *r, const char *const *fields, const char *const *extra) {
    for (int pass = 0; pass < 2; pass++)
        for (const char *const *f = pass ? extra : fields; *f; f++) {
            if (!strcmp(*f, "extra_body")) continue;      /* replaced by the server: never read */
            const ig_json *v = ig_json_get(r->body, *f);
            if (v && check_value_texts(r, v, *f)) return -1;
        }
    return 0;
}

/* client._check_common (n, stream, stream_options, user, max_tokens) */
typedef struct {
    int stream, include_usage;
    int64_t n, max_tokens;        /* max_tokens 0: not given */
} common;

static int check_common(req *r, common *c) {
    const ig_json *v;
    c->n = 1;
    if ((v = field(r, "n"))) {
        if (!is_int(v)) {
            char *s = repr_cut(v, 40);
            fail(r, "n", "invalid_type", "n must be an integer, got %s", s);
            free(s);
            return -1;
        }
        if (!(v->flags & IG_JSON_FITS_I64) || v->u.num.i < 1 || v->u.num.i > MAX_CHOICES) {
            char *s = repr_cut(v, 0);
            fail(r, "n", "invalid_value", "n must be an integer from 1 to %d (choices per request), got %s", MAX_CHOICES, s);
            free(s);
            return -1;
        }
        c->n = v->u.num.i;
    }
    if ((v = field(r, "stream")) && check_bool(r, "stream", v, 40, &c->stream)) return -1;
    if ((v = field(r, "stream_options"))) {
        if (v->type != IG_JSON_OBJECT)
            return fail(r, "stream_options", "invalid_type", "stream_options must be an object, got %s", py_type(v));
        if (!c->stream)
            return fail(r, "stream_options", "invalid_value",
                        "The 'stream_options' parameter is only allowed when 'stream' is enabled.");
        static const char *const OPTIONS[] = {"include_usage", "include_obfuscation", NULL};
        const ig_json_member *first = smallest_unknown(v, OPTIONS, NULL);
        if (first) {
            sbuf param = {0};
            shown_key key;
            if (first->key_len) field_name(&param, "stream_options", first->key, first->key_len);
            else sb_str(&param, "stream_options");
            fail(r, sb_text(&param), "unknown_parameter", "stream_options takes include_usage and include_obfuscation, got %s",
                 repr_key(&key, first->key, first->key_len));
            free(param.p);
            return -1;
        }
        const ig_json *u = ig_json_get(v, "include_usage"), *o = ig_json_get(v, "include_obfuscation");
        int b;
        if (given(u) && check_bool(r, "stream_options.include_usage", u, 40, &b)) return -1;
        if (given(o) && check_bool(r, "stream_options.include_obfuscation", o, 40, &b)) return -1;
        c->include_usage = u && u->type == IG_JSON_TRUE;
    }
    if ((v = field(r, "user")) && v->type != IG_JSON_STRING)
        return fail(r, "user", "invalid_type", "user must be a string, got %s", py_type(v));
    c->max_tokens = 0;
    if ((v = field(r, "max_tokens")) && check_optional_int(r, "max_tokens", v, 1, &c->max_tokens)) return -1;
    return 0;
}

static void random_hex(char *out, size_t n_hex) {
    ig_pcg64 g;
    if (ig_pcg64_seed_entropy(&g) != 0) ig_pcg64_seed(&g, (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)out);
    static const char HEX[] = "0123456789abcdef";
    uint64_t x = 0;
    for (size_t i = 0; i < n_hex; i++) {
        if (i % 16 == 0) x = ig_pcg64_next(&g);
        out[i] = HEX[x & 15];
        x >>= 4;
    }
    out[n_hex] = 0;
}

static void write_usage(ig_jw *w, int64_t prompt, int64_t completion) {
    ig_jw_begin_object(w);
    ig_jw_key(w, "prompt_tokens", 13), ig_jw_int(w, prompt);
    ig_jw_key(w, "completion_tokens", 17), ig_jw_int(w, completion);
    ig_jw_key(w, "total_tokens", 12), ig_jw_int(w, prompt + completion);
    ig_jw_key(w, "prompt_tokens_details", 21), ig_jw_begin_object(w);
    ig_jw_key(w, "cached_tokens", 13), ig_jw_int(w, 0);      /* every call runs its whole prompt */
    ig_jw_key(w, "audio_tokens", 12), ig_jw_null(w);
    ig_jw_end_object(w);
    ig_jw_key(w, "completion_tokens_details", 25), ig_jw_null(w);
    ig_jw_end_object(w);
}

/* client._texts_or_ids: a string, a list of strings, a list of token ids (one input) or a list of
 * token-id lists; *one is value itself (one input) or its first item, *n_inputs the inputs */
static int texts_or_ids(req *r, const ig_json *value, const char *param, const ig_json **one, size_t *n_inputs) {
    *n_inputs = 1;
    static const char *SHAPES = "a string, a list of strings, a list of token ids or a list of token id lists";
    if (value->type == IG_JSON_STRING) {
        *one = value;
    } else if (value->type != IG_JSON_ARRAY) {
        return fail(r, param, "invalid_type", "%s must be %s, got %s", param, SHAPES, py_type(value));
    } else if (!value->u.arr.n) {
        return fail(r, param, "invalid_value", "%s is an empty list; give at least one input", param);
    } else {
        const size_t n = value->u.arr.n;
        int ids = 1, strs = 1, lists = 1;
        for (size_t i = 0; i < n; i++) {
            const ig_json *x = value->u.arr.items[i];
            ids &= is_int(x), strs &= x->type == IG_JSON_STRING, lists &= x->type == IG_JSON_ARRAY;
        }
        if (ids) {
            *one = value;
        } else if (strs || lists) {
            if (lists)
                for (size_t i = 0; i < n; i++) {
                    const ig_json *x = value->u.arr.items[i];
                    for (size_t j = 0; j < x->u.arr.n; j++)
                        if (!is_int(x->u.arr.items[j]))
                            return fail(r, param, "invalid_type", "%s[%zu] must be a list of integer token ids", param, i);
                }
            *n_inputs = n;
            *one = value->u.arr.items[0];
        } else {
            /* sorted type names, each once */
            const char *names[7];
            size_t k = 0;
            for (size_t i = 0; i < n; i++) {
                const char *t = py_type(value->u.arr.items[i]);
                size_t j = 0;
                while (j < k && strcmp(names[j], t)) j++;
                if (j == k && k < 7) names[k++] = t;
            }
            for (size_t i = 1; i < k; i++)
                for (size_t j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
                    const char *t = names[j];
                    names[j] = names[j - 1], names[j - 1] = t;
                }
            sbuf kinds = {0};
            for (size_t i = 0; i < k; i++) sb_fmt(&kinds, "%s%s", i ? ", " : "", names[i]);
            fail(r, param, "invalid_type", "%s must be %s, not a list mixing %s", param, SHAPES, sb_text(&kinds));
            free(kinds.p);
            return -1;
        }
    }
    for (size_t i = 0; i < *n_inputs; i++) {
        const ig_json *x = *n_inputs > 1 || (value->type == IG_JSON_ARRAY && *one != value) ? value->u.arr.items[i] : *one;
        const size_t len = x->type == IG_JSON_STRING ? x->u.str.len : x->u.arr.n;
        if (!len) return fail(r, param, "invalid_value", "%s[%zu] is empty; every input needs at least one token", param, i);
        if (x->type == IG_JSON_ARRAY)
            for (size_t j = 0; j < len; j++)
                if (x->u.arr.items[j]->u.num.text[0] == '-')
                    return fail(r, param, "invalid_value", "%s[%zu] has a negative token id", param, i);
    }
    return 0;
}

static int check_text_size(req *r, const ig_json *value, const char *key);

static char *completions(req *r, const char *text, ignis_chunk_cb cb, void *user) {
    ignis_model *m = r->m;
    static const char *const REQUIRED[] = {"model", "prompt", NULL};
    if (read_body(r, text) || check_fields(r, COMPLETIONS_FIELDS, COMPLETIONS_EXTRA, REQUIRED)) return NULL;
    const ig_json *prompt = ig_json_get(r->body, "prompt");
    if (check_text_size(r, prompt, "prompt")) return NULL;
    /* completions.create */
    if (check_all_texts(r, COMPLETIONS_FIELDS, COMPLETIONS_EXTRA)) return NULL;
    common c = {0, 0, 1, 0};
    if (check_common(r, &c)) return NULL;
    const ig_json *v;
    int b;
    int split = 0;
    if ((v = field(r, "split_special_tokens")) && check_bool(r, "split_special_tokens", v, 40, &split)) return NULL;
    if ((v = field(r, "response_format"))) {
        const ig_json *t = v->type == IG_JSON_OBJECT ? ig_json_get(v, "type") : NULL;
        if (!(v->u.obj.n == 1 && t && t->type == IG_JSON_STRING && !strcmp(t->u.str.s, "text")))
            return fail(r, "response_format", "unsupported_parameter",
                        "response_format other than {\"type\": \"text\"} is not supported by a compiled model "
                        "library (constrained decoding needs ignis serve or ignis.Client)"), NULL;
    }
    if ((v = field(r, "echo"))) {
        if (check_bool(r, "echo", v, 40, &b)) return NULL;
        if (b) return fail(r, "echo", "unsupported_value", "echo=true is not supported"), NULL;
    }
    if ((v = field(r, "suffix"))) {
        if (v->type != IG_JSON_STRING) return fail(r, "suffix", "invalid_type", "suffix must be a string, got %s", py_type(v)), NULL;
        if (v->u.str.len)
            return fail(r, "suffix", "unsupported_parameter", "suffix is not supported (no fill-in-the-middle template)"), NULL;
    }
    if ((v = field(r, "best_of"))) {
        int64_t bo;
        if (check_optional_int(r, "best_of", v, 1, &bo)) return NULL;
        if (bo != 1) return fail(r, "best_of", "unsupported_value", "best_of must be 1"), NULL;
    }
    const ig_json *logprobs = field(r, "logprobs");
    if (logprobs) {
        char *s = repr_cut(logprobs, 40);
        if (!is_int(logprobs)) fail(r, "logprobs", "invalid_type", "logprobs must be an integer in [0, 5], got %s", s);
        else if (!(logprobs->flags & IG_JSON_FITS_I64) || logprobs->u.num.i < 0 || logprobs->u.num.i > 5) {
            free(s);
            s = repr_cut(logprobs, 0);
            fail(r, "logprobs", "invalid_value", "logprobs must be an integer in [0, 5], got %s", s);
        }
        free(s);
        if (r->failed) return NULL;
    }
    /* client._texts_or_ids */
    const ig_json *one = NULL;            /* the prompt: a string or a list of ids */
    size_t n_inputs = 1;
    if (texts_or_ids(r, prompt, "prompt", &one, &n_inputs)) return NULL;
    if (c.stream && !cb)
        return fail(r, "stream", "invalid_value", "stream=true needs a chunk callback (ignis_completions' cb)"), NULL;
    if (c.stream && n_inputs > 1) return fail(r, "prompt", "unsupported_value", "stream=true takes a single prompt"), NULL;
    /* client._model */
    const ig_json *model = ig_json_get(r->body, "model");
    if (model->type != IG_JSON_STRING || !model->u.str.len)
        return fail(r, "model", "invalid_type", "model must be a non-empty string naming a model"), NULL;
    if (!m->tok)
        return fail(r, "prompt", "invalid_value", "this library has no tokenizer (%s), so it cannot write a completion's "
                    "text; use ignis_generate_ids with token ids", m->tok_why), NULL;
    /* every prompt's ids and checks before anything runs, as the Client starts each prompt's
     * choices (validating them) before it iterates any */
    typedef struct {
        int32_t *ids;
        size_t n;
        int from_tok;
        int64_t n_max;
    } prompt_ids;
    prompt_ids *ps = calloc(n_inputs, sizeof *ps);
    gen_result *outs = calloc(n_inputs * (size_t)c.n, sizeof *outs);
    char *result = NULL;
    gen_request g;
    memset(&g, 0, sizeof g);
    if (!ps || !outs) {
        fail(r, NULL, NULL, "out of memory");
        goto out;
    }
    for (size_t p = 0; p < n_inputs; p++) {
        const ig_json *x = prompt->type == IG_JSON_ARRAY && one != prompt ? prompt->u.arr.items[p] : one;
        prompt_ids *q = &ps[p];
        int64_t bad_id = -1;
        const char *bad_text = NULL;
        if (x->type == IG_JSON_STRING) {
            const int trc = ig_tok_encode(m->tok, x->u.str.s, x->u.str.len, 1, !split, &q->ids, &q->n);
            q->from_tok = 1;
            if (trc != 0) {
                fail(r, "prompt", "invalid_value", "the prompt cannot be tokenized: %s", ig_tok_strerror(trc));
                goto out;
            }
        } else {
            q->n = x->u.arr.n;
            q->ids = malloc((q->n ? q->n : 1) * sizeof *q->ids);
            if (!q->ids) {
                fail(r, NULL, NULL, "out of memory");
                goto out;
            }
            for (size_t i = 0; i < q->n; i++) {
                const ig_json *t = x->u.arr.items[i];
                const int fits = (t->flags & IG_JSON_FITS_I64) && t->u.num.i < m->vocab;
                if (!fits && bad_id < 0 && !bad_text) {
                    if (t->flags & IG_JSON_FITS_I64) bad_id = t->u.num.i;
                    else bad_text = t->u.num.text;
                }
                q->ids[i] = fits ? (int32_t)t->u.num.i : 0;
            }
        }
        /* client: the default max_tokens shrinks to the room left */
        const int64_t room = (int64_t)m->max_ctx - (int64_t)q->n;
        q->n_max = c.max_tokens ? c.max_tokens : room < COMPLETIONS_MAX_TOKENS ? (room > 1 ? room : 1) : COMPLETIONS_MAX_TOKENS;
        if (p == 0) {      /* Model.start: resolve_params, then the constraint */
            if (resolve_params(r, &g, logprobs)) goto out;
            for (const char *const *f = COMPLETIONS_EXTRA + 4; f < COMPLETIONS_EXTRA + 8; f++)
                if (field(r, *f)) {
                    fail(r, *f, "unsupported_parameter", "%s is not supported by a compiled model library (constrained "
                         "decoding needs ignis serve or ignis.Client)", *f);
                    goto out;
                }
        }
        /* Generation's checks */
        if (!q->n) {
            fail(r, "prompt", "invalid_value", "the prompt is empty: give at least one token of text");
            goto out;
        }
        if (bad_id >= 0 || bad_text) {
            if (bad_text) fail(r, "prompt", "invalid_value", "prompt token id %.*s is outside the vocabulary 0..%d",
                               (int)strcspn(bad_text, ",] \t\r\n"), bad_text, m->vocab - 1);
            else fail(r, "prompt", "invalid_value", "prompt token id %" PRId64 " is outside the vocabulary 0..%d", bad_id,
                      m->vocab - 1);
            goto out;
        }
        if ((int64_t)q->n >= m->max_ctx || (int64_t)q->n + q->n_max > m->max_ctx) {
            const int fills = (int64_t)q->n >= m->max_ctx;
            sbuf msg = {0};
            sb_fmt(&msg, "This model's maximum context length is %d tokens. ", m->max_ctx);
            if (fills)
                sb_fmt(&msg, "However, your prompt resulted in %zu tokens, which leaves no room for a completion. Please "
                       "reduce the length of the prompt.", q->n);
            else
                sb_fmt(&msg, "However, you requested %" PRId64 " tokens (%zu in the prompt, %" PRId64 " in the "
                       "completion). Please reduce the length of the prompt or completion.", (int64_t)q->n + q->n_max,
                       q->n, q->n_max);
            sb_fmt(&msg, " (ignis: the model was loaded with n_ctx=%d; load it with a larger one, ignis.load(..., "
                   "n_ctx=N) or --ctx N, for a longer context.)", m->max_ctx);
            fail(r, "prompt", "context_length_exceeded", "%s", sb_text(&msg));
            free(msg.p);
            goto out;
        }
    }
    {
        char id[40] = "cmpl-";
        random_hex(id + 5, 32);
        emitter e = {cb, user, id, model->u.str.s, m->fingerprint, model->u.str.len, (long long)time(NULL), 0, 0, 0};
        e.m = m;
        e.logprobs = logprobs != NULL;
        const uint64_t seed = g.sp.seed;
        int64_t n_prompt = 0, n_out = 0;
        int rc = 0;
        pthread_mutex_lock(&m->lock);
        /* the choices in turn, as Choices runs them on one KV slot; choice j is seeded seed + j */
        for (size_t p = 0; p < n_inputs && !rc && !e.cancelled; p++) {
            const int64_t room = (int64_t)m->max_ctx - (int64_t)ps[p].n;
            const int64_t budget = room < ps[p].n_max ? room : ps[p].n_max;
            n_prompt += (int64_t)ps[p].n;
            for (int64_t j = 0; j < c.n && !rc && !e.cancelled; j++) {
                gen_result *o = &outs[p * (size_t)c.n + (size_t)j];
                g.sp.seed = seed + (uint64_t)j;
                e.index = (int64_t)p * c.n + j;
                rc = generate(r, &g, ps[p].ids, ps[p].n, budget, c.stream ? &e : NULL, o);
                n_out += o->completion_tokens;
                if (!rc && !e.cancelled && c.stream) emit(&e, "", 0, NULL, 0, o->finish);
            }
        }
        pthread_mutex_unlock(&m->lock);
        if (rc) goto out;
        if (e.cancelled) {
            fail(r, NULL, "cancelled", "the generation was cancelled: the chunk callback returned nonzero");
            goto out;
        }
        if (c.stream && c.include_usage) emit_usage(&e, n_prompt, n_out);
        ig_jw w;
        ig_jw_init(&w, IG_JW_COMPACT);
        ig_jw_begin_object(&w);
        ig_jw_key(&w, "id", 2), ig_jw_cstr(&w, id);
        ig_jw_key(&w, "choices", 7), ig_jw_begin_array(&w);
        for (size_t k = 0; k < n_inputs * (size_t)c.n; k++) {
            ig_jw_begin_object(&w);
            ig_jw_key(&w, "finish_reason", 13), ig_jw_cstr(&w, outs[k].finish);
            ig_jw_key(&w, "index", 5), ig_jw_int(&w, (int64_t)k);
            ig_jw_key(&w, "text", 4), ig_jw_string(&w, outs[k].text.p ? outs[k].text.p : "", outs[k].cut);
            ig_jw_key(&w, "logprobs", 8);
            if (logprobs) write_text_logprobs(&w, m, outs[k].lps, kept_lps(&outs[k]));
            else ig_jw_null(&w);
            ig_jw_end_object(&w);
        }
        ig_jw_end_array(&w);
        ig_jw_key(&w, "created", 7), ig_jw_int(&w, e.created);
        ig_jw_key(&w, "model", 5), ig_jw_string(&w, e.model, e.model_len);
        ig_jw_key(&w, "object", 6), ig_jw_cstr(&w, "text_completion");
        ig_jw_key(&w, "system_fingerprint", 18), ig_jw_cstr(&w, m->fingerprint);
        ig_jw_key(&w, "usage", 5), write_usage(&w, n_prompt, n_out);
        ig_jw_end_object(&w);
        result = ig_jw_take(&w);
        if (!result) fail(r, NULL, NULL, "out of memory");
    }
out:
    for (size_t k = 0; outs && k < n_inputs * (size_t)c.n; k++) free(outs[k].text.p), free(outs[k].lps);
    free(outs);
    gen_request_free(&g);
    for (size_t p = 0; ps && p < n_inputs; p++) {
        if (ps[p].from_tok) ig_tok_release(ps[p].ids);
        else free(ps[p].ids);
    }
    free(ps);
    return result;
}

/* An entry point: run `body` on the request; any fault becomes the OpenAI error object. */
typedef char *(*entry_body)(req *r, const char *text, ignis_chunk_cb cb, void *user);
typedef struct {
    const int32_t *ids;
    size_t n;
} forced_answer;

/* An entry point's frame: the request answered by `body`, or its error object. forced: the
 * answer's tokens (ig_testonly_chat_forced), NULL for a sampled answer. */
static char *entry(const char *name, entry_body body, ignis_model *m, const char *request_json,
                   const forced_answer *forced, ignis_chunk_cb cb, void *user) {
    ig_rt_clear_error();
    req r;
    memset(&r, 0, sizeof r);
    r.m = m;
    char *out = NULL;
    if (!m || !request_json) {
        fail(&r, NULL, NULL, "%s: the handle or the request is NULL", name);
    } else if (forced && (!forced->ids || !forced->n)) {
        fail(&r, NULL, NULL, "%s: the answer's ids are missing", name);
    } else {
        for (size_t i = 0; forced && i < forced->n && !r.failed; i++)
            if (forced->ids[i] < 0 || forced->ids[i] >= m->vocab)
                fail(&r, NULL, NULL, "%s: id %d is not a token", name, (int)forced->ids[i]);
        if (forced) r.forced = forced->ids, r.n_forced = forced->n;
        if (!r.failed) out = body(&r, request_json, cb, user);
        if (!out && !r.failed) fail(&r, NULL, NULL, "out of memory");
        if (out && r.failed) {            /* cannot happen: a result is written only without a fault */
            free(out);
            out = NULL;
        }
    }
    if (!out) out = error_json(&r);
    ig_json_free(r.doc);
    free(r.msg.p);
    return out;
}

IG_API char *ignis_completions(ignis_model *m, const char *request_json, ignis_chunk_cb cb, void *user) {
    return entry("ignis_completions", completions, m, request_json, NULL, cb, user);
}

/* ---- POST /v1/embeddings ----------------------------------------------------------------------- */

static const char *const EMBEDDINGS_FIELDS[] = {"model", "input", "encoding_format", "dimensions", "user",
                                                "extra_body", NULL};
static const char *const EMBEDDINGS_EXTRA[] = {"pooling", NULL};   /* client.EXTRA_EMBEDDING */
#define EMBED_MAX_INPUTS 2048      /* ignis.api.model: inputs per request, as the OpenAI API allows */
#define EMBED_MAX_CONTEXTS 8       /* ... and at most this many contexts' worth of tokens */

/* server._check_text_size: a string input that cannot fit the context whatever its tokens */
static int check_text_size(req *r, const ig_json *value, const char *key) {
    const ignis_model *m = r->m;
    if (!m->tok) return 0;
    const size_t most = (size_t)m->max_token_bytes, limit = (size_t)m->max_ctx * most;
    const int list = value->type == IG_JSON_ARRAY;
    const size_t n = list ? value->u.arr.n : 1;
    for (size_t i = 0; i < n; i++) {
        const ig_json *s = list ? value->u.arr.items[i] : value;
        if (s->type != IG_JSON_STRING || s->u.str.len <= limit) continue;
        char where[48];
        if (list) snprintf(where, sizeof where, "%s[%zu]", key, i);
        else snprintf(where, sizeof where, "%s", key);
        return fail(r, key, "context_length_exceeded",
                    "This model's maximum context length is %d tokens. However, %s holds %zu bytes of text, at least "
                    "%zu tokens (no token of this model spells more than %zu bytes). Please reduce the length of "
                    "the %s.", m->max_ctx, where, s->u.str.len, (s->u.str.len + most - 1) / most, most, key);
    }
    return 0;
}

static char *embeddings(req *r, const char *text, ignis_chunk_cb cb, void *user) {
    (void)cb, (void)user;
    ignis_model *m = r->m;
    static const char *const REQUIRED[] = {"model", "input", NULL};
    if (read_body(r, text) || check_fields(r, EMBEDDINGS_FIELDS, EMBEDDINGS_EXTRA, REQUIRED)) return NULL;
    const ig_json *input = ig_json_get(r->body, "input");
    if (check_text_size(r, input, "input")) return NULL;
    /* client._Embeddings.create */
    if (check_all_texts(r, EMBEDDINGS_FIELDS, EMBEDDINGS_EXTRA)) return NULL;
    const ig_json *v;
    int base64 = 0;
    if ((v = field(r, "encoding_format"))) {
        const int str = v->type == IG_JSON_STRING;
        if (str && !strcmp(v->u.str.s, "base64") && v->u.str.len == 6) base64 = 1;
        else if (!(str && !strcmp(v->u.str.s, "float") && v->u.str.len == 5)) {
            char *s = repr_cut(v, 40);
            fail(r, "encoding_format", str ? "invalid_value" : "invalid_type",
                 "encoding_format must be one of ['float', 'base64'], got %s", s);
            free(s);
            return NULL;
        }
    }
    int64_t dimensions = 0;
    if ((v = field(r, "dimensions")) && check_optional_int(r, "dimensions", v, 1, &dimensions)) return NULL;
    if ((v = field(r, "user")) && v->type != IG_JSON_STRING)
        return fail(r, "user", "invalid_type", "user must be a string, got %s", py_type(v)), NULL;
    int last = 0;
    if ((v = ig_json_get(r->body, "pooling"))) {        /* extra_body: null is a value here */
        const int str = v->type == IG_JSON_STRING;
        if (str && !strcmp(v->u.str.s, "last") && v->u.str.len == 4) last = 1;
        else if (!(str && !strcmp(v->u.str.s, "mean") && v->u.str.len == 4)) {
            char *s = repr_cut(v, 40);
            fail(r, "pooling", str ? "invalid_value" : "invalid_type", "pooling must be one of ['mean', 'last'], got %s", s);
            free(s);
            return NULL;
        }
    }
    const ig_json *one = NULL;
    size_t n_inputs = 1;
    if (texts_or_ids(r, input, "input", &one, &n_inputs)) return NULL;
    const ig_json *model = ig_json_get(r->body, "model");
    if (model->type != IG_JSON_STRING || !model->u.str.len)
        return fail(r, "model", "invalid_type", "model must be a non-empty string naming a model"), NULL;
    pthread_mutex_lock(&m->lock);
    char *result = NULL;
    int32_t **ids = NULL;
    size_t *lens = NULL;
    unsigned char *from_tok = NULL;
    double *acc = NULL;
    float *vec = NULL;
    ig_jw w;
    ig_jw_init(&w, IG_JW_COMPACT);
    /* the embedding step's width is the model's hidden size: open it before the dimensions check */
    if (ig_rt_embed_width(m) < 0) {
        fail(r, NULL, NULL, "%s", ignis_last_error());
        goto out;
    }
    const int dim = ig_rt_embed_width(m);
    if (dimensions && dimensions != dim) {
        fail(r, "dimensions", "unsupported_parameter", "dimensions=%" PRId64 ": ignis returns the model's full hidden size "
             "(%d) and does not shorten embeddings; omit dimensions", dimensions, dim);
        goto out;
    }
    /* Model.embedding_inputs */
    if (n_inputs > EMBED_MAX_INPUTS) {
        fail(r, "input", "invalid_value", "input has %zu items but one request embeds at most %d (as the OpenAI API); "
             "split them over several requests", n_inputs, EMBED_MAX_INPUTS);
        goto out;
    }
    ids = calloc(n_inputs, sizeof *ids);
    lens = calloc(n_inputs, sizeof *lens);
    from_tok = calloc(n_inputs, 1);
    acc = malloc(sizeof *acc * (size_t)dim);
    vec = malloc(sizeof *vec * (size_t)dim);
    if (!ids || !lens || !from_tok || !acc || !vec) {
        fail(r, NULL, NULL, "out of memory");
        goto out;
    }
    const int64_t n_ctx = m->max_ctx, max_total = EMBED_MAX_CONTEXTS * n_ctx;
    int64_t total = 0;
    for (size_t i = 0; i < n_inputs; i++) {
        const ig_json *x = input->type == IG_JSON_ARRAY && one != input ? input->u.arr.items[i] : one;
        if (x->type == IG_JSON_STRING) {
            if (!m->tok) {
                fail(r, "input", "invalid_value", "this library has no tokenizer (%s), so it cannot embed text; give "
                     "token ids", m->tok_why);
                goto out;
            }
            const int trc = ig_tok_encode(m->tok, x->u.str.s, x->u.str.len, 1, 1, &ids[i], &lens[i]);
            from_tok[i] = 1;
            if (trc != 0) {
                fail(r, "input", "invalid_value", "input[%zu] cannot be tokenized: %s", i, ig_tok_strerror(trc));
                goto out;
            }
        } else {
            lens[i] = x->u.arr.n;
            if (!(ids[i] = malloc(sizeof(int32_t) * (lens[i] ? lens[i] : 1)))) {
                fail(r, NULL, NULL, "out of memory");
                goto out;
            }
            for (size_t j = 0; j < lens[i]; j++) {
                const ig_json *t = x->u.arr.items[j];
                if (!(t->flags & IG_JSON_FITS_I64) || t->u.num.i >= m->vocab) {
                    fail(r, "input", "invalid_value", "input[%zu] has token id %s, outside the vocabulary 0..%d", i,
                         t->u.num.text, m->vocab - 1);
                    goto out;
                }
                ids[i][j] = (int32_t)t->u.num.i;
            }
        }
        if ((int64_t)lens[i] > n_ctx) {
            fail(r, "input", "context_length_exceeded", "input[%zu] has %zu tokens but the context holds %" PRId64 "; "
                 "shorten it or load the model with a larger n_ctx (ignis.load(..., n_ctx=N))", i, lens[i], n_ctx);
            goto out;
        }
        total += (int64_t)lens[i];
        if (total > max_total) {
            fail(r, "input", "invalid_value", "the inputs up to input[%zu] hold %" PRId64 " tokens but one request embeds "
                 "at most %" PRId64 " (%d times the context of %" PRId64 "); split them over several requests", i, total,
                 max_total, EMBED_MAX_CONTEXTS, n_ctx);
            goto out;
        }
    }
    /* Model.embed_ids and the response */
    ig_jw_begin_object(&w);
    ig_jw_key(&w, "data", 4), ig_jw_begin_array(&w);
    for (size_t i = 0; i < n_inputs; i++) {
        if (ig_rt_embed(m, ids[i], (int)lens[i], last, acc) < 0) {
            fail(r, NULL, NULL, "%s", ignis_last_error());
            goto out;
        }
        double ss = 0;
        for (int j = 0; j < dim; j++) ss += acc[j] * acc[j];
        const double norm = sqrt(ss);
        for (int j = 0; j < dim; j++) vec[j] = (float)(norm > 0 ? acc[j] / norm : acc[j]);
        ig_jw_begin_object(&w);
        ig_jw_key(&w, "embedding", 9);
        if (base64) {
            ig_jw_base64_f32(&w, vec, (size_t)dim);
        } else {
            ig_jw_begin_array(&w);
            for (int j = 0; j < dim; j++) ig_jw_double(&w, (double)vec[j]);
            ig_jw_end_array(&w);
        }
        ig_jw_key(&w, "index", 5), ig_jw_int(&w, (int64_t)i);
        ig_jw_key(&w, "object", 6), ig_jw_cstr(&w, "embedding");
        ig_jw_end_object(&w);
    }
    ig_jw_end_array(&w);
    ig_jw_key(&w, "model", 5), ig_jw_string(&w, model->u.str.s, model->u.str.len);
    ig_jw_key(&w, "object", 6), ig_jw_cstr(&w, "list");
    ig_jw_key(&w, "usage", 5), ig_jw_begin_object(&w);
    ig_jw_key(&w, "prompt_tokens", 13), ig_jw_int(&w, total);
    ig_jw_key(&w, "total_tokens", 12), ig_jw_int(&w, total);
    ig_jw_end_object(&w);
    ig_jw_end_object(&w);
    result = ig_jw_take(&w);
    if (!result) fail(r, NULL, NULL, "out of memory");
out:
    pthread_mutex_unlock(&m->lock);
    ig_jw_free(&w);
    for (size_t i = 0; ids && i < n_inputs; i++) {
        if (from_tok[i]) ig_tok_release(ids[i]);
        else free(ids[i]);
    }
    free(ids), free(lens), free(from_tok), free(acc), free(vec);
    return result;
}

IG_API char *ignis_embeddings(ignis_model *m, const char *request_json) {
    return entry("ignis_embeddings", embeddings, m, request_json, NULL, NULL, NULL);
}

/* ---- open / close ------------------------------------------------------------------------------ */

static double conf_number(const ig_json *g, const char *key, double dflt) {
    const ig_json *v = ig_json_get(g, key);
    return v && v->type == IG_JSON_NUMBER ? v->u.num.d : dflt;
}

static int by_length_desc(const void *a, const void *b) {
    const size_t la = strlen(*(char *const *)a), lb = strlen(*(char *const *)b);
    return la < lb ? 1 : la > lb ? -1 : 0;
}

int ig_api_open(ignis_model *h, span tokn, span chat) {
    if (!h->conf.p) {
        ig_rt_set_error("the library has no CONF section: it was not made by ignis compile");
        return 0;
    }
    ig_json_error je;
    ig_json_doc *doc = ig_json_parse((const char *)h->conf.p, h->conf.len, NULL, &je);
    if (!doc || ig_json_root(doc)->type != IG_JSON_OBJECT) {
        ig_rt_set_error("the library's CONF section is damaged (%s)", doc ? "not a JSON object" : je.message);
        ig_json_free(doc);
        return 0;
    }
    const ig_json *c = ig_json_root(doc), *name = ig_json_get(c, "model"), *ver = ig_json_get(c, "ignis_version");
    const ig_json *g = ig_json_get(c, "generation"), *has_tok = ig_json_get(c, "tokenizer");
    h->model_name = strdup(name && name->type == IG_JSON_STRING ? name->u.str.s : "model");
    const char *v = ver && ver->type == IG_JSON_STRING ? ver->u.str.s : "unknown";
    h->fingerprint = malloc(strlen(v) + 16);
    if (h->fingerprint) sprintf(h->fingerprint, "fp_ignis_%s", v);
    const ig_json *ds = ig_json_get(g, "do_sample");
    h->gen.do_sample = ds && ds->type == IG_JSON_TRUE;
    h->gen.temperature = conf_number(g, "temperature", 1.0);
    h->gen.top_k = (int64_t)conf_number(g, "top_k", 0);
    h->gen.top_p = conf_number(g, "top_p", 1.0);
    h->gen.min_p = conf_number(g, "min_p", 0.0);
    h->gen.repetition_penalty = conf_number(g, "repetition_penalty", 1.0);
    const int conf_tok = has_tok && has_tok->type == IG_JSON_TRUE;
    const ig_json *mnt = ig_json_get(g, "max_new_tokens");
    h->max_new_tokens = is_int(mnt) && (mnt->flags & IG_JSON_FITS_I64) ? mnt->u.num.i : -1;
    const ig_json *sp = ig_json_get(c, "chat_added_tokens");
    if (sp && sp->type == IG_JSON_ARRAY && sp->u.arr.n) {
        h->spellings = calloc(sp->u.arr.n, sizeof *h->spellings);
        for (size_t i = 0; h->spellings && i < sp->u.arr.n; i++) {
            const ig_json *x = sp->u.arr.items[i];
            if (x->type != IG_JSON_STRING || !x->u.str.len) continue;
            if (!(h->spellings[h->n_spellings] = strdup(x->u.str.s))) break;
            h->n_spellings++;
        }
        /* the longest spelling at a place first, as TextMasker's pattern matches */
        if (h->spellings) qsort(h->spellings, h->n_spellings, sizeof *h->spellings, by_length_desc);
    }
    ig_json_free(doc);
    if (!h->model_name || !h->fingerprint) {
        ig_rt_set_error("out of memory");
        return 0;
    }
    if (h->valid) {
        h->valid_ids = malloc((size_t)h->vocab);
        if (!h->valid_ids) {
            ig_rt_set_error("out of memory");
            return 0;
        }
        for (int i = 0; i < h->vocab; i++) h->valid_ids[i] = h->valid[i >> 3] >> (i & 7) & 1;
    }
    if (chat.p) {
        char cerr[256] = "";
        h->chat = ig_chat_load(chat.p, chat.len, cerr, sizeof cerr);
        if (!h->chat) {
            ig_rt_set_error("the library's chat template section (CHAT) is damaged: %s", cerr);
            return 0;
        }
    } else {
        snprintf(h->chat_why, sizeof h->chat_why, "%s",
                 tokn.p ? "no C renderer reproduces this model's chat template exactly"
                        : "the library has no tokenizer");
    }
    if (!tokn.p) {
        snprintf(h->tok_why, sizeof h->tok_why, "%s",
                 conf_tok ? "ignis compile could not carry this model's tokenizer into C"
                          : "ignis could not read this model's tokenizer when it was compiled");
        return 1;
    }
    char err[256] = "";
    h->tok = ig_tok_open(tokn.p, tokn.len, err, (int)sizeof err);
    if (!h->tok) {
        ig_rt_set_error("the library's tokenizer (TOKN section) is damaged: %s", err);
        return 0;
    }
    int most = 1;
    for (int32_t i = 0; i < ig_tok_vocab_size(h->tok) && i < h->vocab; i++) {
        if (h->valid_ids && !h->valid_ids[i]) continue;
        const char *b;
        size_t n;
        if (ig_tok_token_bytes(h->tok, i, &b, &n) == 0 && (int)n > most) most = (int)n;
    }
    h->max_token_bytes = most;
    return 1;
}

void ig_api_close(ignis_model *h) {
    ig_tok_free(h->tok);
    ig_chat_template_free(h->chat);
    for (size_t i = 0; i < h->n_spellings; i++) free(h->spellings[i]);
    free(h->spellings);
    free(h->valid_ids);
    free(h->model_name);
    free(h->fingerprint);
}

/* ---- /v1/chat/completions -------------------------------------------------------------------- */

static const char *const CHAT_FIELDS[] = {
    "messages", "model", "stream", "stream_options", "max_tokens", "max_completion_tokens", "temperature",
    "top_p", "stop", "seed", "logprobs", "top_logprobs", "presence_penalty", "frequency_penalty", "logit_bias",
    "n", "response_format", "tools", "tool_choice", "user", "store", "metadata", "parallel_tool_calls",
    "service_tier", "extra_body", NULL};
static const char *const CHAT_EXTRA[] = {
    "top_k", "min_p", "repetition_penalty", "ignore_eos", "guided_json", "guided_choice", "guided_regex",
    "guided_grammar", "chat_template_kwargs", NULL};
/* the guided_* fields of CHAT_EXTRA, in constrain.constraint_spec's order */
static const char *const GUIDED[] = {"guided_json", "guided_choice", "guided_regex", "guided_grammar", NULL};
static const char *const ROLES[] = {"system", "developer", "user", "assistant", "tool", NULL};
/* client.MESSAGE_FIELDS */
static const char *const ROLE_FIELDS[][10] = {
    {"role", "content", "name", NULL},
    {"role", "content", "name", NULL},
    {"role", "content", "name", NULL},
    {"role", "content", "name", "tool_calls", "refusal", "audio", "function_call", "reasoning_content", "annotations", NULL},
    {"role", "content", "tool_call_id", NULL},
};

static void emit_usage(emitter *e, int64_t prompt, int64_t completion) {
    ig_jw w;
    ig_jw_init(&w, IG_JW_SPACED);
    ig_jw_begin_object(&w);
    ig_jw_key(&w, "id", 2), ig_jw_cstr(&w, e->id);
    ig_jw_key(&w, "choices", 7), ig_jw_begin_array(&w), ig_jw_end_array(&w);
    ig_jw_key(&w, "created", 7), ig_jw_int(&w, e->created);
    ig_jw_key(&w, "model", 5), ig_jw_string(&w, e->model, e->model_len);
    ig_jw_key(&w, "object", 6), ig_jw_cstr(&w, e->chat ? "chat.completion.chunk" : "text_completion");
    if (e->chat) ig_jw_key(&w, "service_tier", 12), ig_jw_null(&w);
    ig_jw_key(&w, "system_fingerprint", 18), ig_jw_cstr(&w, e->fingerprint);
    ig_jw_key(&w, "usage", 5), write_usage(&w, prompt, completion);
    ig_jw_end_object(&w);
    char *s = ig_jw_take(&w);
    if (s && e->cb(s, e->user) != 0) e->cancelled = 1;
    free(s);
}

/* client._object: `value` is an object with exactly these fields, each required: of a type, or
 * (value != NULL) that one string */
typedef struct {
    const char *key;
    ig_json_type type;
    const char *value;
} object_field;

static const char *json_type_words(ig_json_type t) {
    return t == IG_JSON_STRING ? "a string" : t == IG_JSON_OBJECT ? "an object" : "an array";
}

static int check_object(req *r, const ig_json *v, const char *param, const object_field *fields) {
    sbuf list = {0};
    sb_str(&list, "[");
    for (int f = 0; fields[f].key; f++) sb_fmt(&list, "%s'%s'", f ? ", " : "", fields[f].key);
    sb_str(&list, "]");
    int rc = 0;
    if (v->type != IG_JSON_OBJECT) {
        rc = fail(r, param, "invalid_type", "%s must be an object with %s, got %s", param, sb_text(&list), py_type(v));
        goto out;
    }
    for (size_t k = 0; k < v->u.obj.n; k++) {
        const ig_json_member *mb = &v->u.obj.members[k];
        int known = 0;
        for (int f = 0; fields[f].key && !known; f++) known = strlen(fields[f].key) == mb->key_len && !strcmp(fields[f].key, mb->key);
        if (known) continue;
        sbuf name = {0};
        shown_key key;
        field_name(&name, param, mb->key, mb->key_len);
        rc = fail(r, sb_text(&name), "unknown_parameter", "%s has an unknown field %s; it takes %s", param,
                  repr_key(&key, mb->key, mb->key_len), sb_text(&list));
        free(name.p);
        goto out;
    }
    for (int f = 0; fields[f].key; f++) {
        const ig_json *x = ig_json_get(v, fields[f].key);
        char at[700];
        snprintf(at, sizeof at, "%s.%s", param, fields[f].key);
        if (!x) {
            rc = fail(r, at, "missing_required_parameter", "%s is missing: %s takes %s", at, param, sb_text(&list));
            goto out;
        }
        if (fields[f].value) {
            if (x->type != IG_JSON_STRING || strcmp(x->u.str.s, fields[f].value) || x->u.str.len != strlen(fields[f].value)) {
                char *shown = repr_cut(x, 40);
                rc = fail(r, at, x->type == IG_JSON_STRING ? "invalid_value" : "invalid_type", "%s must be '%s', got %s", at,
                          fields[f].value, shown);
                free(shown);
                goto out;
            }
        } else if (x->type != fields[f].type) {
            rc = fail(r, at, "invalid_type", "%s must be %s, got %s", at, json_type_words(fields[f].type), py_type(x));
            goto out;
        }
    }
out:
    free(list.p);
    return rc;
}

/* client._tool_calls: arguments that read as a JSON object are held to the request's rules
 * (check_request_value at level 7: its nesting and its text) */
static int check_call_arguments(req *r, const ig_json *args, const char *fn_at) {
    ig_json_limits lim = {PARSE_DEPTH, MAX_BODY_BYTES, MAX_BODY_BYTES};
    ig_json_error je;
    ig_json_doc *d = ig_json_parse(args->u.str.s, args->u.str.len, &lim, &je);
    if (!d) return je.status == IG_JSON_E_MEMORY ? fail(r, NULL, NULL, "out of memory") : 0;
    const ig_json *v = ig_json_root(d);
    int rc = 0;
    if (v->type == IG_JSON_OBJECT) {
        sbuf path = {0};
        sb_fmt(&path, "%s.arguments", fn_at);
        if (too_deep(v, 7, &path) && !path.failed) {
            const size_t n = path.n, cut = u8_chars(path.p, n) > 60;
            size_t at = n;
            if (cut) {
                at = 0;
                for (size_t c = 0; c < 60; c++) at += u8_len((unsigned char)path.p[at]);
            }
            rc = fail(r, path.p, "invalid_value", "%.*s%s is nested too deeply: lists and objects may sit at most %d "
                      "levels deep in a request (the body is level 1)", (int)at, path.p, cut ? "..." : "", MAX_NESTING);
        }
        free(path.p);
        if (!rc) {
            char at[700];
            snprintf(at, sizeof at, "%s.arguments", fn_at);
            rc = check_value_texts(r, v, at);
        }
    }
    ig_json_free(d);
    return rc;
}

/* ---- tools: ignis/generate/tools.py check_tools ------------------------------------------------ */

#define MAX_TOOLS 128                 /* tools.MAX_TOOLS */
#define MAX_SCHEMA_CHARS 65536        /* tools.MAX_SCHEMA_CHARS */

typedef struct {
    int given;                    /* the request has tools (ToolRequest is not None) */
    int choice;                   /* TC_* */
    int parallel;
    const char **names;           /* the functions' names, in order */
    size_t *name_lens, n_names;
} tool_request;

enum { TC_AUTO, TC_NONE, TC_REQUIRED, TC_FUNCTION };

static void tool_request_free(tool_request *t) {
    free(t->names);
    free(t->name_lens);
}

/* _FUNCTION_NAME.match: ^[A-Za-z0-9_-]{1,64}$ ($ also before a final newline) */
static int function_name_ok(const char *s, size_t n) {
    if (n && s[n - 1] == '\n') n--;
    if (!n || n > 64) return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') ||
              s[i] == '_' || s[i] == '-'))
            return 0;
    return 1;
}

/* the first key of an object not in `allowed`, in document order */
static const ig_json_member *unknown_key(const ig_json *v, const char *const *allowed) {
    for (size_t k = 0; k < v->u.obj.n; k++)
        if (!listed(allowed, v->u.obj.members[k].key, v->u.obj.members[k].key_len)) return &v->u.obj.members[k];
    return NULL;
}

static int fail_unknown(req *r, const char *at, const ig_json_member *mb, const char *tail) {
    sbuf param = {0};
    shown_key key;
    sb_fmt(&param, "%s.", at);
    sb_put(&param, mb->key, mb->key_len);
    fail(r, sb_text(&param), "unknown_parameter", "%s has an unknown field %s; %s", at, repr_key(&key, mb->key, mb->key_len),
         tail);
    free(param.p);
    return -1;
}

/* len(json.dumps(v, ensure_ascii=False)): the characters of v's JSON text as Python writes it */
static int json_chars(req *r, const ig_json *v, size_t *chars) {
    ig_jw w;
    ig_jw_init(&w, IG_JW_SPACED);
    ig_jw_value(&w, v);
    const int failed = w.failed;
    *chars = failed ? 0 : u8_chars(w.buf ? w.buf : "", w.len);
    ig_jw_free(&w);
    return failed ? fail(r, NULL, NULL, "out of memory") : 0;
}

static int check_tools(req *r, tool_request *t) {
    static const char *const TOOL_KEYS[] = {"type", "function", NULL};
    static const char *const FUNCTION_FIELDS[] = {"name", "description", "parameters", "strict", NULL};
    memset(t, 0, sizeof *t);
    t->parallel = 1;
    const ig_json *v, *tools = field(r, "tools");
    if ((v = field(r, "parallel_tool_calls"))) {
        if (!is_bool(v)) {
            char *s = repr_cut(v, 40);
            fail(r, "parallel_tool_calls", "invalid_type", "parallel_tool_calls must be true or false, got %s", s);
            free(s);
            return -1;
        }
        t->parallel = v->type == IG_JSON_TRUE;
    }
    if (tools && tools->type != IG_JSON_ARRAY)
        return fail(r, "tools", "invalid_type", "tools must be a list of tool objects ({'type': 'function', 'function': "
                    "{'name': ..., 'parameters': {...}}}), got %s", py_type(tools));
    const size_t n = tools ? tools->u.arr.n : 0;
    if (n > MAX_TOOLS)
        return fail(r, "tools", "array_above_max_length", "tools has %zu functions; a request takes at most %d", n, MAX_TOOLS);
    t->names = calloc(n ? n : 1, sizeof *t->names);
    t->name_lens = calloc(n ? n : 1, sizeof *t->name_lens);
    if (!t->names || !t->name_lens) return fail(r, NULL, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const ig_json *tool = tools->u.arr.items[i];
        char at[48], p2[96];
        snprintf(at, sizeof at, "tools.[%zu]", i);
        if (tool->type != IG_JSON_OBJECT)
            return fail(r, at, "invalid_type", "%s must be a tool object ({'type': 'function', 'function': {...}}), got %s",
                        at, py_type(tool));
        const ig_json_member *mb = unknown_key(tool, TOOL_KEYS);
        if (mb) return fail_unknown(r, at, mb, "a tool takes 'type' and 'function'");
        const ig_json *type = ig_json_get(tool, "type");
        if (!type || type->type != IG_JSON_STRING || strcmp(type->u.str.s, "function") || type->u.str.len != 8) {
            char *s = type ? repr_cut(type, 40) : strdup("None");
            snprintf(p2, sizeof p2, "%s.type", at);
            fail(r, p2, "invalid_value", "%s.type must be 'function' (the only tool type a chat template renders), got %s",
                 at, s);
            free(s);
            return -1;
        }
        const ig_json *fn = ig_json_get(tool, "function");
        snprintf(p2, sizeof p2, "%s.function", at);
        if (!fn || fn->type != IG_JSON_OBJECT)
            return fail(r, p2, fn ? "invalid_type" : "missing_required_parameter",
                        "%s.function must be an object with name and parameters, got %s", at, fn ? py_type(fn) : "NoneType");
        if ((mb = unknown_key(fn, FUNCTION_FIELDS)))
            return fail_unknown(r, p2, mb, "it takes ['name', 'description', 'parameters', 'strict']");
        const ig_json *name = ig_json_get(fn, "name");
        snprintf(p2, sizeof p2, "%s.function.name", at);
        if (!name || name->type != IG_JSON_STRING || !function_name_ok(name->u.str.s, name->u.str.len)) {
            char *s = name ? repr_cut(name, 70) : strdup("None");
            fail(r, p2, name && name->type == IG_JSON_STRING ? "invalid_value" : "invalid_type",
                 "%s.function.name must be 1 to 64 letters, digits, '_' or '-', got %s", at, s);
            free(s);
            return -1;
        }
        for (size_t k = 0; k < t->n_names; k++)
            if (t->name_lens[k] == name->u.str.len && !memcmp(t->names[k], name->u.str.s, name->u.str.len)) {
                char *s = repr_cut(name, 0);
                fail(r, p2, "invalid_value", "%s.function.name %s is given twice; function names must be unique", at, s);
                free(s);
                return -1;
            }
        t->names[t->n_names] = name->u.str.s, t->name_lens[t->n_names++] = name->u.str.len;
        const ig_json *d = ig_json_get(fn, "description"), *st = ig_json_get(fn, "strict"), *ps = ig_json_get(fn, "parameters");
        if (given(d) && d->type != IG_JSON_STRING) {
            snprintf(p2, sizeof p2, "%s.function.description", at);
            return fail(r, p2, "invalid_type", "%s.function.description must be a string", at);
        }
        if (given(st) && !is_bool(st)) {
            snprintf(p2, sizeof p2, "%s.function.strict", at);
            return fail(r, p2, "invalid_type", "%s.function.strict must be true or false", at);
        }
        if (given(ps)) {
            snprintf(p2, sizeof p2, "%s.function.parameters", at);
            const ig_json *pt = ps->type == IG_JSON_OBJECT ? ig_json_get(ps, "type") : NULL;
            if (ps->type != IG_JSON_OBJECT || (pt && !(pt->type == IG_JSON_STRING && !strcmp(pt->u.str.s, "object") &&
                                                       pt->u.str.len == 6))) {
                char *s = repr_cut(ps, 60);
                fail(r, p2, ps->type != IG_JSON_OBJECT ? "invalid_type" : "invalid_value",
                     "%s.function.parameters must be a JSON Schema of an object (such as {'type': 'object', 'properties': "
                     "{...}}), got %s", at, s);
                free(s);
                return -1;
            }
            size_t size;
            if (json_chars(r, ps, &size)) return -1;
            if (size > MAX_SCHEMA_CHARS)
                return fail(r, p2, "invalid_value", "%s.function.parameters is %zu characters of JSON; a function's schema "
                            "may have at most %d", at, size, MAX_SCHEMA_CHARS);
        }
    }
    /* _tool_choice */
    const ig_json *c = field(r, "tool_choice");
    t->choice = TC_AUTO;
    if (c && c->type == IG_JSON_STRING) {
        static const char *const CHOICES[] = {"auto", "none", "required", NULL};
        int k = 0;
        while (CHOICES[k] && !(strlen(CHOICES[k]) == c->u.str.len && !strcmp(CHOICES[k], c->u.str.s))) k++;
        if (!CHOICES[k]) {
            char *s = repr_cut(c, 40);
            fail(r, "tool_choice", "invalid_value", "tool_choice must be 'none', 'auto', 'required' or {'type': "
                 "'function', 'function': {'name': ...}}, got %s", s);
            free(s);
            return -1;
        }
        t->choice = k;
    } else if (c && c->type != IG_JSON_OBJECT) {
        return fail(r, "tool_choice", "invalid_type", "tool_choice must be 'none', 'auto', 'required' or a tool object, "
                    "got %s", py_type(c));
    } else if (c) {
        const ig_json_member *mb = unknown_key(c, TOOL_KEYS);
        if (mb) return fail_unknown(r, "tool_choice", mb, "it takes 'type' and 'function'");
        const ig_json *type = ig_json_get(c, "type");
        if (!type || type->type != IG_JSON_STRING || strcmp(type->u.str.s, "function") || type->u.str.len != 8) {
            char *s = type ? repr_cut(type, 40) : strdup("None");
            fail(r, "tool_choice.type", "invalid_value", "tool_choice.type must be 'function', got %s", s);
            free(s);
            return -1;
        }
        const ig_json *fn = ig_json_get(c, "function"), *name = fn && fn->type == IG_JSON_OBJECT ? ig_json_get(fn, "name") : NULL;
        if (!name || name->type != IG_JSON_STRING)
            return fail(r, "tool_choice.function", "invalid_type", "tool_choice.function must be an object with the name of "
                        "one of the tools");
        static const char *const NAME_ONLY[] = {"name", NULL};
        const ig_json_member *extra = smallest_unknown(fn, NAME_ONLY, NULL);     /* sorted(set(fn) - {"name"})[0] */
        if (extra) {
            sbuf param = {0};
            shown_key key;
            sb_str(&param, "tool_choice.function.");
            sb_put(&param, extra->key, extra->key_len);
            fail(r, sb_text(&param), "unknown_parameter", "tool_choice.function takes only 'name', got %s",
                 repr_key(&key, extra->key, extra->key_len));
            free(param.p);
            return -1;
        }
        int found = 0;
        for (size_t k = 0; k < t->n_names && !found; k++)
            found = t->name_lens[k] == name->u.str.len && !memcmp(t->names[k], name->u.str.s, name->u.str.len);
        if (!found) {
            /* ', '.join(sorted(names)) or 'none given' */
            size_t *order = malloc((t->n_names ? t->n_names : 1) * sizeof *order);
            if (!order) return fail(r, NULL, NULL, "out of memory");
            for (size_t k = 0; k < t->n_names; k++) order[k] = k;
            for (size_t a = 1; a < t->n_names; a++)
                for (size_t b = a; b > 0; b--) {
                    const size_t x = order[b - 1], y = order[b];
                    const size_t l = t->name_lens[x] < t->name_lens[y] ? t->name_lens[x] : t->name_lens[y];
                    const int cmp = memcmp(t->names[x], t->names[y], l);
                    if (cmp < 0 || (cmp == 0 && t->name_lens[x] <= t->name_lens[y])) break;
                    order[b - 1] = y, order[b] = x;
                }
            sbuf list = {0};
            for (size_t k = 0; k < t->n_names; k++) {
                if (k) sb_str(&list, ", ");
                sb_put(&list, t->names[order[k]], t->name_lens[order[k]]);
            }
            free(order);
            char *s = repr_cut(name, 70);
            fail(r, "tool_choice.function.name", "invalid_value", "tool_choice names the function %s, which is not among "
                 "the tools (%s)", s, t->n_names ? sb_text(&list) : "none given");
            free(s), free(list.p);
            return -1;
        }
        t->choice = TC_FUNCTION;
    }
    if (!t->n_names) {
        if (t->choice == TC_REQUIRED) {
            char *s = repr_cut(c, 60);
            fail(r, "tool_choice", "invalid_value", "tool_choice %s needs tools, and the request has none", s);
            free(s);
            return -1;
        }
        return 0;
    }
    t->given = 1;
    return 0;
}

/* client._messages: each message's fields as the OpenAI API reference gives them */
static int check_messages(req *r, const ig_json *msgs) {
    if (msgs->type != IG_JSON_ARRAY)
        return fail(r, "messages", "invalid_type", "messages must be a non-empty list of {role, content} objects");
    if (!msgs->u.arr.n) return fail(r, "messages", "invalid_value", "messages must be a non-empty list of {role, content} objects");
    for (size_t i = 0; i < msgs->u.arr.n; i++) {
        const ig_json *m = msgs->u.arr.items[i];
        char at[64], param[600];
        snprintf(at, sizeof at, "messages.[%zu]", i);
        if (m->type != IG_JSON_OBJECT)
            return fail(r, at, "invalid_type", "messages[%zu] must be an object with role and content", i);
        const ig_json *role = ig_json_get(m, "role");
        int ri = -1;
        for (int k = 0; ROLES[k] && role && role->type == IG_JSON_STRING; k++)
            if (!strcmp(role->u.str.s, ROLES[k]) && strlen(ROLES[k]) == role->u.str.len) ri = k;
        if (ri < 0) {
            char *s = role ? repr_cut(role, 40) : strdup("None");
            snprintf(param, sizeof param, "%s.role", at);
            fail(r, param, !role || role->type == IG_JSON_STRING || role->type == IG_JSON_NULL ? "invalid_value" : "invalid_type",
                 "messages[%zu].role is %s; expected one of ['system', 'developer', 'user', 'assistant', 'tool']", i, s);
            free(s);
            return -1;
        }
        for (size_t k = 0; k < m->u.obj.n; k++) {
            const ig_json_member *mb = &m->u.obj.members[k];
            if (listed((const char *const *)ROLE_FIELDS[ri], mb->key, mb->key_len)) continue;
            sbuf name = {0}, list = {0};
            shown_key key;
            field_name(&name, at, mb->key, mb->key_len);
            for (int f = 0; ROLE_FIELDS[ri][f]; f++) sb_fmt(&list, "%s'%s'", f ? ", " : "", ROLE_FIELDS[ri][f]);
            fail(r, mb->key_len ? sb_text(&name) : at, "unknown_parameter",
                 "messages[%zu] (%s) has an unknown field %s; a %s message takes [%s]", i, ROLES[ri],
                 repr_key(&key, mb->key, mb->key_len), ROLES[ri], sb_text(&list));
            free(name.p), free(list.p);
            return -1;
        }
        const ig_json *content = ig_json_get(m, "content");
        snprintf(param, sizeof param, "%s.content", at);
        if (content && content->type == IG_JSON_ARRAY) {
            if (!content->u.arr.n)
                return fail(r, param, "empty_array", "Invalid 'messages[%zu].content': empty array. Expected an array with "
                            "minimum length 1, but got an empty array instead.", i);
            for (size_t j = 0; j < content->u.arr.n; j++) {
                const ig_json *part = content->u.arr.items[j], *t = ig_json_get(part, "type"), *x = ig_json_get(part, "text");
                if (part->type != IG_JSON_OBJECT || !t || t->type != IG_JSON_STRING || strcmp(t->u.str.s, "text") ||
                    t->u.str.len != 4 || !x || x->type != IG_JSON_STRING)
                    return fail(r, param, "invalid_value", "messages[%zu].content parts must be {'type': 'text', 'text': "
                                "str}; this model reads text only", i);
            }
        }
        const ig_json *calls = ig_json_get(m, "tool_calls"), *fcall = ig_json_get(m, "function_call");
        const int has_calls = truthy(calls) || truthy(fcall);    /* m.get("tool_calls") or m.get("function_call") */
        if (!given(content) && !(ri == 3 && has_calls))
            return fail(r, param, "invalid_value", "messages[%zu] (%s) has no content", i, ROLES[ri]);
        if (given(content) && content->type != IG_JSON_STRING && content->type != IG_JSON_ARRAY)
            return fail(r, param, "invalid_type", "messages[%zu].content must be a string or a list of text parts", i);
        static const char *const STRS[] = {"name", "tool_call_id", "refusal", "reasoning_content"};
        for (int k = 0; k < 4; k++) {
            const ig_json *v = ig_json_get(m, STRS[k]);
            if (given(v) && v->type != IG_JSON_STRING) {
                snprintf(param, sizeof param, "%s.%s", at, STRS[k]);
                return fail(r, param, "invalid_type", "%s must be a string, got %s", param, py_type(v));
            }
        }
        static const object_field AUDIO[] = {{"id", IG_JSON_STRING, NULL}, {NULL, 0, NULL}};
        static const object_field CALL_FN[] = {{"name", IG_JSON_STRING, NULL}, {"arguments", IG_JSON_STRING, NULL},
                                               {NULL, 0, NULL}};
        static const object_field CALL[] = {{"id", IG_JSON_STRING, NULL}, {"type", IG_JSON_STRING, "function"},
                                            {"function", IG_JSON_OBJECT, NULL}, {NULL, 0, NULL}};
        const ig_json *audio = ig_json_get(m, "audio");
        if (given(audio)) {
            snprintf(param, sizeof param, "%s.audio", at);
            if (check_object(r, audio, param, AUDIO)) return -1;
        }
        if (given(fcall)) {
            snprintf(param, sizeof param, "%s.function_call", at);
            if (check_object(r, fcall, param, CALL_FN)) return -1;
        }
        if (given(calls)) {       /* client._tool_calls */
            snprintf(param, sizeof param, "%s.tool_calls", at);
            if (calls->type != IG_JSON_ARRAY) return fail(r, param, "invalid_type", "%s must be a list of tool calls", param);
            for (size_t j = 0; j < calls->u.arr.n; j++) {
                char call_at[640], fn_at[660];
                snprintf(call_at, sizeof call_at, "%s.[%zu]", param, j);
                snprintf(fn_at, sizeof fn_at, "%s.function", call_at);
                const ig_json *call = calls->u.arr.items[j];
                if (check_object(r, call, call_at, CALL) || check_object(r, ig_json_get(call, "function"), fn_at, CALL_FN))
                    return -1;
                if (check_call_arguments(r, ig_json_get(ig_json_get(call, "function"), "arguments"), fn_at)) return -1;
            }
        }
    }
    return 0;
}

/* Tokenizer.encode_chat by the renderer's spans: the added-token spellings inside the caller's
 * text (and a fence where its text begins or ends with part of one) become private-use mask
 * characters put back as plain text by ig_tok_encode_masked, as TextMasker does; without any,
 * the text is encoded as it is. The fence test: whether s begins with a tail of a spelling
 * (at_end 0) or ends with a head of one (at_end 1), a piece cut at a character boundary and not
 * all whitespace. */
static int touches_spelling(const ignis_model *m, const char *s, size_t n, int at_end) {
    for (size_t k = 0; k < m->n_spellings; k++) {
        const char *t = m->spellings[k];
        const size_t tl = strlen(t);
        for (size_t i = 1; i < tl; i++) {
            if (((unsigned char)t[i] & 0xC0) == 0x80) continue;
            const char *piece = at_end ? t : t + i;
            const size_t len = at_end ? i : tl - i;
            int blank = 1;
            for (size_t j = 0; j < len && blank; j++) blank = piece[j] == ' ' || (piece[j] >= '\t' && piece[j] <= '\r');
            if (!blank && len <= n && memcmp(at_end ? s + n - len : s, piece, len) == 0) return 1;
        }
    }
    return 0;
}

static void put_cp(sbuf *b, uint32_t c) {
    char u[4] = {(char)(0xE0 | c >> 12), (char)(0x80 | (c >> 6 & 63)), (char)(0x80 | (c & 63)), 0};
    sb_put(b, u, 3);
}

static int encode_rendered(req *r, const ig_chat_output *o, int32_t **ids, size_t *n_ids) {
    const ignis_model *m = r->m;
    sbuf text = {0};
    uint32_t chars[256];
    const char *texts[256];
    size_t lens[256], n_masks = 0;
    uint32_t next = 0xE000;
    int any = 0;
    for (size_t k = 0; k < o->n_spans; k++) {
        const ig_chat_span *sp = &o->spans[k];
        const char *s = o->text + sp->offset;
        if (sp->kind != IG_CHAT_SPAN_TEXT || !m->n_spellings) {
            sb_put(&text, s, sp->len);
            continue;
        }
        const int fence_start = touches_spelling(m, s, sp->len, 0), fence_end = touches_spelling(m, s, sp->len, 1);
        /* mask_of(""): one fence character, and one per spelling, in first-use order */
#define MASK_OF(T, L)                                                                                  \
    do {                                                                                               \
        size_t q = 0;                                                                                  \
        while (q < n_masks && !(lens[q] == (L) && memcmp(texts[q], (T), (L)) == 0)) q++;               \
        if (q == n_masks) {                                                                            \
            if (n_masks == 256) goto too_many;                                                         \
            while (memmem(o->text, o->len, (char[]){(char)(0xE0 | next >> 12), (char)(0x80 | (next >> 6 & 63)), \
                                                    (char)(0x80 | (next & 63))}, 3))                    \
                next++;                                                                                \
            if (next > 0xF8FF) goto too_many;                                                          \
            chars[q] = next++, texts[q] = (T), lens[q] = (L), n_masks++;                               \
        }                                                                                              \
        put_cp(&text, chars[q]);                                                                       \
        any = 1;                                                                                       \
    } while (0)
        if (fence_start) MASK_OF("", 0);
        for (size_t p = 0; p < sp->len;) {
            size_t hit = 0;
            for (size_t q = 0; q < m->n_spellings && !hit; q++) {
                const size_t tl = strlen(m->spellings[q]);
                if (tl <= sp->len - p && memcmp(s + p, m->spellings[q], tl) == 0) hit = tl;
            }
            if (hit) {
                MASK_OF(s + p, hit);
                p += hit;
            } else {
                const size_t l = u8_len((unsigned char)s[p]);
                sb_put(&text, s + p, l);
                p += l;
            }
        }
        if (fence_end) MASK_OF("", 0);
#undef MASK_OF
    }
    if (text.failed) {
        free(text.p);
        return fail(r, NULL, NULL, "out of memory");
    }
    int trc;
    if (!any) trc = ig_tok_encode(m->tok, o->text, o->len, 0, 1, ids, n_ids);
    else trc = ig_tok_encode_masked(m->tok, text.p, text.n, chars, texts, lens, n_masks, ids, n_ids);
    free(text.p);
    if (trc != 0) return fail(r, "messages", "invalid_value", "the conversation cannot be tokenized: %s", ig_tok_strerror(trc));
    return 0;
too_many:
    free(text.p);
    return fail(r, "messages", "invalid_value", "the conversation uses every private-use character; cannot keep its "
                "token text apart from the template's");
}

static char *chat_checked(req *r, const common *c, int64_t limit, const tool_request *tr, ignis_chunk_cb cb, void *user);

#define TEMPLATE_KWARGS_MAX_CHARS 16384   /* model.TEMPLATE_KWARGS_MAX_CHARS */
#define TEMPLATE_KWARGS_MAX_DEPTH 8

/* model.reserved_template_names(): the renderer's own names (its parameters, the special tokens,
 * Jinja's globals) */
static const char *const RESERVED_TEMPLATE_NAMES[] = {
    "add_generation_prompt", "bos_token", "chat_template", "cycler", "dict", "documents", "eos_token", "joiner",
    "lipsum", "messages", "namespace", "pad_token", "raise_exception", "range", "self", "special_tokens",
    "strftime_now", "template", "tools", "unk_token", NULL};

/* model._check_json: finite numbers, at most TEMPLATE_KWARGS_MAX_DEPTH lists or objects deep */
static int check_kwarg_json(req *r, const ig_json *v, sbuf *at, int depth) {
    if (v->type == IG_JSON_NUMBER && !(v->flags & IG_JSON_INTEGER) && !isfinite(v->u.num.d))
        return fail(r, sb_text(at), "invalid_value", "%s must be a finite number", sb_text(at));
    if (v->type != IG_JSON_ARRAY && v->type != IG_JSON_OBJECT) return 0;
    if (depth >= TEMPLATE_KWARGS_MAX_DEPTH)
        return fail(r, sb_text(at), "invalid_value", "%s is nested more than %d lists or objects deep", sb_text(at),
                    TEMPLATE_KWARGS_MAX_DEPTH);
    const size_t base = at->n, n = v->type == IG_JSON_OBJECT ? v->u.obj.n : v->u.arr.n;
    for (size_t i = 0; i < n; i++) {
        if (v->type == IG_JSON_OBJECT) {
            sb_str(at, ".");
            sb_put(at, v->u.obj.members[i].key, v->u.obj.members[i].key_len);
        } else {
            sb_fmt(at, "[%zu]", i);
        }
        const int rc = check_kwarg_json(r, v->type == IG_JSON_OBJECT ? v->u.obj.members[i].value : v->u.arr.items[i], at,
                                        depth + 1);
        at->n = base;
        if (at->p) at->p[base] = 0;
        if (rc) return rc;
    }
    return 0;
}

/* model.check_template_kwargs: the request's chat template variables */
static int check_template_kwargs(req *r, const ig_json *kw) {
    static const char *const P = "chat_template_kwargs";
    if (kw->type != IG_JSON_OBJECT)
        return fail(r, P, "invalid_type", "%s must be an object of chat template variables, got %s", P, py_type(kw));
    for (size_t i = 0; i < kw->u.obj.n; i++) {
        const ig_json_member *mb = &kw->u.obj.members[i];
        if (!ig_unicode_identifier(mb->key, mb->key_len)) {      /* str.isidentifier */
            shown_key key;
            return fail(r, P, "invalid_value", "%s key %s is not a template variable name", P,
                        repr_key(&key, mb->key, mb->key_len));
        }
        sbuf at = {0};
        sb_fmt(&at, "%s.", P);
        sb_put(&at, mb->key, mb->key_len);
        int rc = 0;
        if (listed(RESERVED_TEMPLATE_NAMES, mb->key, mb->key_len)) {
            sbuf k = {0};
            repr_str(&k, mb->key, mb->key_len);
            rc = fail(r, sb_text(&at), "invalid_value", "%s may not set %s: ignis sets it itself (the conversation, the "
                      "tools, the template and its helpers come from the request and the model)", P, sb_text(&k));
            free(k.p);
        } else {
            rc = check_kwarg_json(r, mb->value, &at, 0);
        }
        free(at.p);
        if (rc) return rc;
    }
    const ig_json *et = ig_json_get(kw, "enable_thinking");
    if (et && !is_bool(et))
        return fail(r, "chat_template_kwargs.enable_thinking", "invalid_type", "%s.enable_thinking must be true or false", P);
    size_t size;
    if (json_chars(r, kw, &size)) return -1;
    if (size > TEMPLATE_KWARGS_MAX_CHARS)
        return fail(r, P, "invalid_value", "%s is %zu characters of JSON; at most %d are taken", P, size,
                    TEMPLATE_KWARGS_MAX_CHARS);
    return 0;
}

static char *chat_completions(req *r, const char *body_text, ignis_chunk_cb cb, void *user) {
    ignis_model *m = r->m;
    static const char *const REQUIRED[] = {"model", "messages", NULL};
    if (read_body(r, body_text) || check_fields(r, CHAT_FIELDS, CHAT_EXTRA, REQUIRED)) return NULL;
    const ig_json *msgs = ig_json_get(r->body, "messages");
    if (m->tok && msgs->type == IG_JSON_ARRAY) {        /* server._check_text_size */
        size_t n = 0;
        for (size_t i = 0; i < msgs->u.arr.n; i++) {
            const ig_json *c = ig_json_get(msgs->u.arr.items[i], "content");
            if (c && c->type == IG_JSON_STRING) n += c->u.str.len;
            for (size_t j = 0; c && c->type == IG_JSON_ARRAY && j < c->u.arr.n; j++) {
                const ig_json *t = ig_json_get(c->u.arr.items[j], "text");
                if (t && t->type == IG_JSON_STRING) n += t->u.str.len;
            }
        }
        const size_t most = (size_t)m->max_token_bytes;
        if (n > (size_t)m->max_ctx * most)
            return fail(r, "messages", "context_length_exceeded",
                        "This model's maximum context length is %d tokens. However, messages holds %zu bytes of text, at "
                        "least %zu tokens (no token of this model spells more than %zu bytes). Please reduce the length "
                        "of the messages.", m->max_ctx, n, (n + most - 1) / most, most), NULL;
    }
    if (check_all_texts(r, CHAT_FIELDS, CHAT_EXTRA)) return NULL;
    common c = {0, 0, 1, 0};
    if (check_common(r, &c)) return NULL;
    const ig_json *v;
    int64_t mct = 0;
    if ((v = field(r, "max_completion_tokens")) && check_optional_int(r, "max_completion_tokens", v, 1, &mct)) return NULL;
    if (c.max_tokens && mct && c.max_tokens != mct)
        return fail(r, "max_tokens", "invalid_value", "max_tokens and max_completion_tokens disagree; pass one of them"), NULL;
    const int64_t limit = mct ? mct : c.max_tokens;        /* 0: not given */
    if ((v = field(r, "response_format"))) {
        const ig_json *t = v->type == IG_JSON_OBJECT ? ig_json_get(v, "type") : NULL;
        if (!(v->u.obj.n == 1 && t && t->type == IG_JSON_STRING && !strcmp(t->u.str.s, "text")))
            return fail(r, "response_format", "unsupported_parameter",
                        "response_format other than {\"type\": \"text\"} is not supported by a compiled model "
                        "library (constrained decoding needs ignis serve or ignis.Client)"), NULL;
    }
    tool_request tr;
    if (check_tools(r, &tr)) {
        tool_request_free(&tr);
        return NULL;
    }
    char *result = chat_checked(r, &c, limit, &tr, cb, user);
    tool_request_free(&tr);
    return result;
}

/* constrain.constraint_spec's checks of the guided_* fields (the library refuses response_format
 * other than text before this): the server makes them once the prompt is rendered, before the
 * sampling fields; then, with tool_choice "required" or a named function, it refuses a second
 * grammar (Model.chat_constraint). *n_given: how many guided fields ask for a grammar. */
static int check_guided(req *r, int *n_given) {
    const char *given[2] = {NULL, NULL};
    *n_given = 0;
    for (const char *const *f = GUIDED; *f; f++) {
        const ig_json *v = field(r, *f);
        if (!v) continue;
        if (!strcmp(*f, "guided_json")) {
            const ig_json *schema = v;
            ig_json_doc *doc = NULL;
            if (v->type == IG_JSON_STRING) {       /* json.loads of the text */
                ig_json_error err;
                if (!(doc = ig_json_parse(v->u.str.s, v->u.str.len, NULL, &err)))
                    return fail(r, *f, "invalid_value", "guided_json is not valid JSON (%s)", err.message);
                schema = ig_json_root(doc);
            }
            const int bad = schema->type != IG_JSON_OBJECT;
            if (bad)
                fail(r, *f, "invalid_type", "guided_json must be a JSON Schema object (such as {'type': 'object', "
                     "'properties': {...}}), got %s", py_type(schema));
            ig_json_free(doc);
            if (bad) return -1;
        } else if (!strcmp(*f, "guided_choice")) {
            if (v->type != IG_JSON_ARRAY)
                return fail(r, *f, "invalid_type", "guided_choice must be a list of strings, got %s", py_type(v));
            if (!v->u.arr.n)
                return fail(r, *f, "invalid_value", "guided_choice is empty: give at least one string the answer may be");
            for (size_t i = 0; i < v->u.arr.n; i++) {
                const ig_json *c = v->u.arr.items[i];
                if (c->type != IG_JSON_STRING) {
                    char *shown = repr_cut(c, 40);
                    fail(r, *f, "invalid_type", "guided_choice must hold strings only, got %s", shown);
                    free(shown);
                    return -1;
                }
                if (!c->u.str.len) return fail(r, *f, "invalid_value", "guided_choice holds an empty string, which is no answer");
            }
        } else {                                   /* guided_regex, guided_grammar */
            if (v->type != IG_JSON_STRING) return fail(r, *f, "invalid_type", "%s must be a string, got %s", *f, py_type(v));
            size_t i = 0, len;
            while (i < v->u.str.len && ig_py_space(u8_decode(v->u.str.s + i, v->u.str.len - i, &len))) i += len;
            if (i == v->u.str.len) return fail(r, *f, "invalid_value", "%s is empty", *f);
        }
        if (*n_given < 2) given[*n_given] = *f;
        ++*n_given;
    }
    /* every field is checked first, then a second one is refused */
    if (*n_given > 1)
        return fail(r, given[1], "invalid_value", "%s and %s both constrain the answer; give one of them", given[0],
                    given[1]);
    return 0;
}

static char *chat_checked(req *r, const common *cp, int64_t limit, const tool_request *tr, ignis_chunk_cb cb, void *user) {
    ignis_model *m = r->m;
    const common c = *cp;
    const ig_json *v, *msgs = ig_json_get(r->body, "messages");
    const ig_json *kwargs = field(r, "chat_template_kwargs");
    if (kwargs && check_template_kwargs(r, kwargs)) return NULL;
    int b;
    if ((v = field(r, "store")) && check_bool(r, "store", v, 40, &b)) return NULL;
    if ((v = field(r, "metadata")) && v->type != IG_JSON_OBJECT)
        return fail(r, "metadata", "invalid_type", "metadata must be an object of string keys and string values, got %s",
                    py_type(v)), NULL;
    if ((v = field(r, "service_tier"))) {
        static const char *const TIERS[] = {"auto", "default", "flex", "scale", "priority", "fast", NULL};
        if (v->type != IG_JSON_STRING || !listed(TIERS, v->u.str.s, v->u.str.len)) {
            char *s = repr_cut(v, 40);
            fail(r, "service_tier", v->type == IG_JSON_STRING ? "invalid_value" : "invalid_type",
                 "service_tier must be one of ['auto', 'default', 'flex', 'scale', 'priority', 'fast'], got %s", s);
            free(s);
            return NULL;
        }
    }
    if (check_messages(r, msgs)) return NULL;
    const ig_json *model = ig_json_get(r->body, "model");
    if (model->type != IG_JSON_STRING || !model->u.str.len)
        return fail(r, "model", "invalid_type", "model must be a non-empty string naming a model"), NULL;
    if (c.stream && !cb)
        return fail(r, "stream", "invalid_value", "stream=true needs a chunk callback (ignis_chat_completions' cb)"), NULL;
    if (!m->tok)
        return fail(r, "messages", "invalid_value", "this library has no tokenizer (%s), so it cannot read a "
                    "conversation; use ignis_generate_ids with token ids", m->tok_why), NULL;
    if (!m->chat)
        return fail(r, "messages", "invalid_value", "this library has no chat template renderer (%s); send the text "
                    "as a completion (ignis_completions)", m->chat_why), NULL;
    const int family = ig_chat_template_family(m->chat);
    const int calls = tr->given && tr->choice != TC_NONE;     /* "none": the tools stay out of the prompt */
    if (calls && !ig_chat_template_tools(m->chat)) {           /* Model.check_tool_support */
        sbuf name = {0};
        repr_str(&name, m->model_name, strlen(m->model_name));
        fail(r, "tools", "unsupported_parameter", "model %s cannot take tools: %s (ignis reads Qwen2.5/Qwen3 <tool_call> "
             "blocks and Llama 3.1/3.2 JSON calls); send the request without tools", sb_text(&name),
             family == IG_CHAT_FAMILY_NONE ? "it has no chat template" : "its chat template does not render tool definitions");
        free(name.p);
        return NULL;
    }
    if (family == IG_CHAT_FAMILY_NONE) {
        sbuf name = {0};
        repr_str(&name, m->model_name, strlen(m->model_name));
        fail(r, "messages", "no_chat_template", "model %s has no chat template (its tokenizer defines none: a base model); "
             "send the text as a completion (/v1/completions, Model.generate, `ignis run`) instead of chat messages",
             sb_text(&name));
        free(name.p);
        return NULL;
    }
    /* the prompt */
    ig_chat_output o;
    memset(&o, 0, sizeof o);
    char cerr[512] = "";
    const ig_json *tools = calls ? ig_json_get(r->body, "tools") : NULL;
    const int crc = ig_chat_render_json(m->chat, msgs, tools, kwargs, 1, &o, cerr, sizeof cerr);
    if (crc != IG_CHAT_OK) {
        ig_chat_output_free(&o);
        if (crc == IG_CHAT_E_MEMORY) return fail(r, NULL, NULL, "out of memory"), NULL;
        return fail(r, crc == IG_CHAT_E_REFUSED ? NULL : "messages", NULL, "%s", cerr), NULL;
    }
    int32_t *ids = NULL;
    size_t n_ids = 0;
    const int erc = encode_rendered(r, &o, &ids, &n_ids);
    ig_chat_output_free(&o);
    if (erc) return NULL;
    int n_guided;
    if (check_guided(r, &n_guided)) {
        ig_tok_release(ids);
        return NULL;
    }
    if (n_guided && calls && (tr->choice == TC_REQUIRED || tr->choice == TC_FUNCTION)) {
        if (tr->choice == TC_REQUIRED) {
            fail(r, "tool_choice", "invalid_value", "tool_choice required makes the answer tool calls; it cannot also "
                 "follow response_format, a guided_* field or another constraint");
        } else {
            const ig_json *fn = ig_json_get(ig_json_get(field(r, "tool_choice"), "function"), "name");
            sbuf name = {0};
            repr_str(&name, fn->u.str.s, fn->u.str.len);
            fail(r, "tool_choice", "invalid_value", "tool_choice function %s makes the answer tool calls; it cannot also "
                 "follow response_format, a guided_* field or another constraint", sb_text(&name));
            free(name.p);
        }
        ig_tok_release(ids);
        return NULL;
    }
    char *result = NULL;
    gen_request g;
    memset(&g, 0, sizeof g);
    ig_answer **answers = calloc((size_t)c.n, sizeof *answers);
    gen_result *outs = calloc((size_t)c.n, sizeof *outs);
    /* how each choice's answer is read (client._Answer): Qwen3's reasoning, the calls */
    ig_answer_config ac = {0};
    ac.thinking = family == IG_CHAT_FAMILY_QWEN3;
    if (ac.thinking) {        /* Model.opens_thinking: the last 8 prompt ids' text opens a think block */
        char *tail = NULL;
        size_t tail_len = 0;
        const size_t k = n_ids < 8 ? n_ids : 8;
        if (ig_tok_decode(m->tok, ids + n_ids - k, k, 0, &tail, &tail_len) == 0 && tail) {
            long open = -1, close = -1;
            for (size_t i = 0; i + 7 <= tail_len; i++) {
                if (!memcmp(tail + i, "<think>", 7)) open = (long)i;
                if (i + 8 <= tail_len && !memcmp(tail + i, "</think>", 8)) close = (long)i;
            }
            ac.open_in_prompt = open > close;
        }
        free(tail);
    }
    if (calls) {
        ac.tools = family == IG_CHAT_FAMILY_LLAMA3 ? IG_TOOLS_LLAMA3_JSON : IG_TOOLS_HERMES;
        ac.parallel = tr->parallel;
        ac.names = tr->names, ac.name_lens = tr->name_lens, ac.n_names = tr->n_names;
    }
    for (int64_t j = 0; answers && j < c.n; j++)
        if (!(answers[j] = ig_answer_new(&ac))) {
            fail(r, NULL, NULL, "out of memory");
            goto out;
        }
    if (!outs || !answers) {
        fail(r, NULL, NULL, "out of memory");
        goto out;
    }
    const int64_t n_max = limit ? limit : m->max_new_tokens;      /* -1: none */
    if (resolve_params(r, &g, NULL)) goto out;
    int lp = 0;
    if ((v = field(r, "logprobs")) && check_bool(r, "logprobs", v, 0, &lp)) goto out;
    if ((v = field(r, "top_logprobs"))) {
        int64_t t;
        if (check_int(r, "top_logprobs", v, 0, 1, IG_MAX_TOP_LOGPROBS, &t)) goto out;
        if (t > 0 && !lp) {
            fail(r, "top_logprobs", "invalid_value", "top_logprobs needs logprobs=true");
            goto out;
        }
    }
    for (const char *const *f = GUIDED; *f; f++)
        if (field(r, *f)) {
            fail(r, *f, "unsupported_parameter", "%s is not supported by a compiled model library (constrained decoding "
                 "needs ignis serve or ignis.Client)", *f);
            goto out;
        }
    if (lp && r->forced) {        /* given tokens were not sampled: there are no logprobs to tell */
        fail(r, "logprobs", "unsupported_value", "ig_testonly_chat_forced: the answer's tokens are given, not sampled, "
             "so it has no logprobs; ask without logprobs");
        goto out;
    }
    if (lp) {
        g.sp.logprobs = 1;
        g.sp.top_logprobs = (v = field(r, "top_logprobs")) ? (int)v->u.num.i : 0;
    }
    if (!n_ids) {
        fail(r, "messages", "invalid_value", "the prompt is empty: give at least one token of text");
        goto out;
    }
    if ((int64_t)n_ids >= m->max_ctx || (limit && (int64_t)n_ids + limit > m->max_ctx)) {
        sbuf msg = {0};
        sb_fmt(&msg, "This model's maximum context length is %d tokens. ", m->max_ctx);
        if ((int64_t)n_ids >= m->max_ctx)
            sb_fmt(&msg, "However, your messages resulted in %zu tokens, which leaves no room for a completion. Please "
                   "reduce the length of the messages.", n_ids);
        else
            sb_fmt(&msg, "However, you requested %" PRId64 " tokens (%zu in the messages, %" PRId64 " in the completion). "
                   "Please reduce the length of the messages or completion.", (int64_t)n_ids + limit, n_ids, limit);
        sb_fmt(&msg, " (ignis: the model was loaded with n_ctx=%d; load it with a larger one, ignis.load(..., n_ctx=N) "
               "or --ctx N, for a longer context.)", m->max_ctx);
        fail(r, "messages", "context_length_exceeded", "%s", sb_text(&msg));
        free(msg.p);
        goto out;
    }
    /* Last: ignis serve takes what the library cannot do, so every check it makes (the rendering,
     * the sampling fields, the prompt's size above) must answer first, as the server would */
    if (calls && (tr->choice == TC_REQUIRED || tr->choice == TC_FUNCTION)) {   /* Model.chat_constraint */
        fail(r, "tool_choice", "unsupported_value", "tool_choice %s makes the answer tool calls, which needs "
             "constrained decoding (a grammar over the calls): a compiled model library does not have it; use "
             "tool_choice \"auto\" or ignis serve", tr->choice == TC_REQUIRED ? "'required'" : "naming a function");
        goto out;
    }
    {
        char id[48] = "chatcmpl-";
        random_hex(id + 9, 32);
        emitter e = {cb, user, id, model->u.str.s, m->fingerprint, model->u.str.len, (long long)time(NULL), 0, 1, 0};
        e.m = m;
        e.logprobs = lp;
        int64_t budget = (int64_t)m->max_ctx - (int64_t)n_ids, n_out = 0;
        if (n_max >= 0 && n_max < budget) budget = n_max;
        /* every choice opens with its role (content "" for a plain answer, null for one read for
         * reasoning or calls), then the choices run in turn (Choices on one slot) */
        const int plain = ig_answer_plain(answers[0]);
        for (e.index = 0; c.stream && e.index < c.n && !e.cancelled; e.index++)
            emit_chat(&e, plain ? "" : NULL, 0, "assistant", NULL);
        const uint64_t seed = g.sp.seed;
        int rc = 0;
        pthread_mutex_lock(&m->lock);
        for (int64_t j = 0; j < c.n && !rc && !e.cancelled; j++) {
            g.sp.seed = seed + (uint64_t)j;
            e.index = j;
            e.answer = answers[j];
            rc = generate(r, &g, ids, n_ids, budget, c.stream ? &e : NULL, &outs[j]);
            n_out += outs[j].completion_tokens;
            if (rc || e.cancelled) break;
            /* the answer read whole (streamed: its last deltas), then the choice's end */
            ig_deltas_clear(&e.deltas);
            if ((!c.stream && ig_answer_feed(answers[j], outs[j].text.p ? outs[j].text.p : "", outs[j].cut, &e.deltas)) ||
                ig_answer_finish(answers[j], &e.deltas)) {
                rc = fail(r, NULL, NULL, "out of memory");
                break;
            }
            const ig_answer_call *cs;
            if (outs[j].finish[0] == 's' && ig_answer_calls(answers[j], &cs)) outs[j].finish = "tool_calls";
            for (size_t k = 0; c.stream && k < e.deltas.n && !e.cancelled; k++)
                if (emit_chat_delta(&e, NULL, 0, NULL, &e.deltas.d[k], NULL, 0, 0, NULL)) rc = fail(r, NULL, NULL, "out of memory");
            if (!rc && !e.cancelled && c.stream) emit_chat(&e, NULL, 0, NULL, outs[j].finish);
        }
        pthread_mutex_unlock(&m->lock);
        ig_deltas_free(&e.deltas);
        if (rc) goto out;
        if (e.cancelled) {
            fail(r, NULL, "cancelled", "the generation was cancelled: the chunk callback returned nonzero");
            goto out;
        }
        if (c.stream && c.include_usage) emit_usage(&e, (int64_t)n_ids, n_out);
        ig_jw w;
        ig_jw_init(&w, IG_JW_COMPACT);
        ig_jw_begin_object(&w);
        ig_jw_key(&w, "id", 2), ig_jw_cstr(&w, id);
        ig_jw_key(&w, "choices", 7), ig_jw_begin_array(&w);
        for (int64_t j = 0; j < c.n; j++) {
            ig_jw_begin_object(&w);
            ig_jw_key(&w, "finish_reason", 13), ig_jw_cstr(&w, outs[j].finish);
            ig_jw_key(&w, "index", 5), ig_jw_int(&w, j);
            ig_jw_key(&w, "message", 7), ig_jw_begin_object(&w);
            const ig_answer *a = answers[j];
            size_t len;
            const char *t = ig_answer_plain(a) ? (len = outs[j].cut, outs[j].text.p ? outs[j].text.p : "")
                                               : ig_answer_content(a, &len);
            ig_jw_key(&w, "content", 7);
            if (t) ig_jw_string(&w, t, len);
            else ig_jw_null(&w);
            ig_jw_key(&w, "role", 4), ig_jw_cstr(&w, "assistant");
            static const char *const NULLS[] = {"refusal", "annotations", "audio", "function_call"};
            for (int k = 0; k < 4; k++) ig_jw_key(&w, NULLS[k], strlen(NULLS[k])), ig_jw_null(&w);
            ig_jw_key(&w, "tool_calls", 10);
            const ig_answer_call *cs;
            const size_t n_calls = ig_answer_calls(a, &cs);
            if (n_calls) {
                ig_jw_begin_array(&w);
                for (size_t k = 0; k < n_calls; k++) {
                    ig_jw_begin_object(&w);
                    ig_jw_key(&w, "id", 2), ig_jw_cstr(&w, cs[k].id);
                    ig_jw_key(&w, "type", 4), ig_jw_cstr(&w, "function");
                    ig_jw_key(&w, "function", 8), ig_jw_begin_object(&w);
                    ig_jw_key(&w, "name", 4), ig_jw_string(&w, cs[k].name, cs[k].name_len);
                    ig_jw_key(&w, "arguments", 9), ig_jw_string(&w, cs[k].arguments, cs[k].arguments_len);
                    ig_jw_end_object(&w), ig_jw_end_object(&w);
                }
                ig_jw_end_array(&w);
            } else {
                ig_jw_null(&w);
            }
            ig_jw_key(&w, "reasoning_content", 17);
            if ((t = ig_answer_reasoning(a, &len))) ig_jw_string(&w, t, len);
            else ig_jw_null(&w);
            ig_jw_end_object(&w);
            ig_jw_key(&w, "logprobs", 8);
            if (lp) write_chat_logprobs(&w, m, outs[j].lps, kept_lps(&outs[j]));
            else ig_jw_null(&w);
            ig_jw_end_object(&w);
        }
        ig_jw_end_array(&w);
        ig_jw_key(&w, "created", 7), ig_jw_int(&w, e.created);
        ig_jw_key(&w, "model", 5), ig_jw_string(&w, e.model, e.model_len);
        ig_jw_key(&w, "object", 6), ig_jw_cstr(&w, "chat.completion");
        ig_jw_key(&w, "service_tier", 12), ig_jw_null(&w);
        ig_jw_key(&w, "system_fingerprint", 18), ig_jw_cstr(&w, m->fingerprint);
        ig_jw_key(&w, "usage", 5), write_usage(&w, (int64_t)n_ids, n_out);
        ig_jw_end_object(&w);
        result = ig_jw_take(&w);
        if (!result) fail(r, NULL, NULL, "out of memory");
    }
out:
    for (int64_t j = 0; outs && j < c.n; j++) free(outs[j].text.p), free(outs[j].lps);
    for (int64_t j = 0; answers && j < c.n; j++) ig_answer_free(answers[j]);
    free(outs);
    free(answers);
    gen_request_free(&g);
    ig_tok_release(ids);
    return result;
}

IG_API char *ignis_chat_completions(ignis_model *m, const char *request_json, ignis_chunk_cb cb, void *user) {
    return entry("ignis_chat_completions", chat_completions, m, request_json, NULL, cb, user);
}

/* For tests only (not in ignis_model.h, not part of the ABI: it may change or go in any version):
 * ignis_chat_completions with the answer's tokens given instead of sampled, so the answer's reader
 * (reasoning_content, tool calls) can be held to the Python path's on known text; a random test
 * model writes no tags on cue. The ids must be in the vocabulary; a request asking for logprobs
 * is answered with an error object (given tokens have none). */
IG_API char *ig_testonly_chat_forced(ignis_model *m, const char *request_json, const int32_t *ids, size_t n_ids,
                                     ignis_chunk_cb cb, void *user) {
    const forced_answer forced = {ids, n_ids};
    return entry("ig_testonly_chat_forced", chat_completions, m, request_json, &forced, cb, user);
}
