/* JSON parser and writer of the native library (json.h says what they accept and write, and why).
 * The parser is a loop over an explicit stack of open arrays/objects, never a recursion, so a
 * hostile nesting depth costs an error, not the C stack. */
#define _POSIX_C_SOURCE 200809L
#include "json.h"

#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __APPLE__
#include <xlocale.h>
#endif

/* ---- the C locale, for strtod and snprintf whatever the process set ---- */

static locale_t c_locale;
static pthread_once_t c_locale_once = PTHREAD_ONCE_INIT;
static void c_locale_init(void) { c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0); }
static locale_t c_locale_begin(void) {
    pthread_once(&c_locale_once, c_locale_init);
    return c_locale ? uselocale(c_locale) : (locale_t)0;
}
static void c_locale_end(locale_t old) { if (old) uselocale(old); }

/* ---- arena: one per document, freed at once ---- */

typedef struct chunk { struct chunk *next; size_t used, cap; } chunk;
#define CHUNK_BYTES ((size_t)64 << 10)

struct ig_json_doc {
    chunk *chunks;
    ig_json *root;
};

static void *arena_alloc(ig_json_doc *d, size_t n) {
    n = (n + 15) & ~(size_t)15;
    chunk *c = d->chunks;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > CHUNK_BYTES / 2 ? n : CHUNK_BYTES;
        size_t head = (sizeof(chunk) + 15) & ~(size_t)15;
        chunk *fresh = malloc(head + cap);
        if (!fresh) return NULL;
        fresh->used = head;
        fresh->cap = head + cap;
        if (c && n > CHUNK_BYTES / 2) {     /* a big block: keep filling the current chunk */
            fresh->next = c->next;
            c->next = fresh;
        } else {
            fresh->next = c;
            d->chunks = fresh;
        }
        c = fresh;
    }
    void *p = (char *)c + c->used;
    c->used += n;
    return p;
}

void ig_json_free(ig_json_doc *d) {
    if (!d) return;
    chunk *c = d->chunks;
    while (c) {
        chunk *next = c->next;
        free(c);
        c = next;
    }
    free(d);
}

const ig_json *ig_json_root(const ig_json_doc *d) { return d ? d->root : NULL; }

/* ---- errors ---- */

/* Python's position of byte `off`: characters (code points; a surrogate's three bytes are one),
 * line and column from 1, counted from `start` (after a byte order mark). */
static void python_position(const unsigned char *s, size_t start, size_t off, ig_json_error *e) {
    size_t pos = 0, line = 1, line_start = 0;
    for (size_t i = start; i < off; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            if (s[i] == '\n') {
                line++;
                line_start = pos + 1;
            }
            pos++;
        }
    }
    e->pos = pos;
    e->line = line;
    e->column = pos - line_start + 1;
}

static void set_error(ig_json_error *e, ig_json_status st, size_t off, const char *fmt, ...) {
    if (!e) return;
    e->status = st;
    e->offset = off;
    e->path[0] = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}

/* ---- UTF-8, as Python decodes bytes with 'surrogatepass' ---- */

static int check_utf8(const unsigned char *s, size_t n, size_t base, ig_json_error *e) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int need;
        unsigned lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) need = 1;
        else if (c >= 0xE0 && c <= 0xEF) {
            need = 2;
            if (c == 0xE0) lo = 0xA0;
            /* 0xED: 80..9F strictly; A0..BF is a surrogate, which 'surrogatepass' takes whole */
            if (c == 0xED && i + 2 < n && s[i + 1] >= 0xA0 && s[i + 1] <= 0xBF &&
                (s[i + 2] & 0xC0) == 0x80) {
                i += 3;
                continue;
            }
            if (c == 0xED) hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 3;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else {
            set_error(e, IG_JSON_E_UTF8, base + i, "'utf-8' codec can't decode byte 0x%02x in "
                      "position %zu: invalid start byte", c, base + i);
            return -1;
        }
        size_t j = i + 1;
        const char *why = NULL;
        for (int k = 0; k < need; k++, j++) {
            if (j >= n) {
                why = "unexpected end of data";
                break;
            }
            unsigned b = s[j];
            if (b < (k == 0 ? lo : 0x80) || b > (k == 0 ? hi : 0xBF)) {
                why = "invalid continuation byte";
                break;
            }
        }
        if (why) {
            if (j - i == 1)
                set_error(e, IG_JSON_E_UTF8, base + i, "'utf-8' codec can't decode byte 0x%02x in "
                          "position %zu: %s", c, base + i, why);
            else
                set_error(e, IG_JSON_E_UTF8, base + i, "'utf-8' codec can't decode bytes in "
                          "position %zu-%zu: %s", base + i, base + j - 1, why);
            return -1;
        }
        i = j;
    }
    return 0;
}

/* ---- the parser ---- */

typedef struct {
    ig_json *v;                  /* the container */
    size_t start;                /* first entry of this container on the item stack */
    int is_object;
    size_t count;                /* members/items so far (the index of the next) */
    const char *key;             /* the member being read (objects) */
    size_t key_len;
} frame;

typedef struct {
    const unsigned char *s;
    size_t n, start;             /* text, its length, where the JSON begins (after a BOM) */
    ig_json_doc *doc;
    ig_json_error *err;
    ig_json_limits lim;
    size_t elements;
    ig_json_member *items;       /* open containers' children (arrays use .value) */
    size_t n_items, cap_items;
    char *scratch;               /* one string being decoded */
    size_t cap_scratch;
    frame *frames;
    int depth;
} parser;

static int syntax(parser *p, size_t at, const char *what) {
    ig_json_error *e = p->err;
    if (!e) return -1;
    python_position(p->s, p->start, at, e);
    set_error(e, IG_JSON_E_SYNTAX, at, "%s: line %zu column %zu (char %zu)", what, e->line,
              e->column, e->pos);
    return -1;
}

static int oom(parser *p, size_t at) {
    set_error(p->err, IG_JSON_E_MEMORY, at, "out of memory reading the JSON text");
    return -1;
}

static size_t skip_ws(const parser *p, size_t i) {
    while (i < p->n && (p->s[i] == ' ' || p->s[i] == '\t' || p->s[i] == '\n' || p->s[i] == '\r'))
        i++;
    return i;
}

static ig_json *new_value(parser *p, ig_json_type t, size_t at) {
    if (++p->elements > p->lim.max_elements) {
        set_error(p->err, IG_JSON_E_ELEMENTS, at, "the JSON text holds more than %zu values",
                  p->lim.max_elements);
        return NULL;
    }
    ig_json *v = arena_alloc(p->doc, sizeof *v);
    if (!v) {
        oom(p, at);
        return NULL;
    }
    memset(v, 0, sizeof *v);
    v->type = t;
    v->offset = at;
    return v;
}

static int scratch_put(parser *p, size_t *len, const void *b, size_t k) {
    if (*len + k + 1 > p->cap_scratch) {
        size_t cap = p->cap_scratch ? p->cap_scratch : 256;
        while (cap < *len + k + 1) cap *= 2;
        char *fresh = realloc(p->scratch, cap);
        if (!fresh) return -1;
        p->scratch = fresh;
        p->cap_scratch = cap;
    }
    memcpy(p->scratch + *len, b, k);
    *len += k;
    return 0;
}

static int hex4(const unsigned char *s, unsigned *out) {
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        unsigned c = s[k], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return -1;
        v = v * 16 + d;
    }
    *out = v;
    return 0;
}

static size_t put_utf8(unsigned char *b, unsigned c) {
    if (c < 0x80) { b[0] = (unsigned char)c; return 1; }
    if (c < 0x800) { b[0] = 0xC0 | (c >> 6); b[1] = 0x80 | (c & 0x3F); return 2; }
    if (c < 0x10000) {          /* a lone surrogate too: its WTF-8 bytes */
        b[0] = 0xE0 | (c >> 12); b[1] = 0x80 | ((c >> 6) & 0x3F); b[2] = 0x80 | (c & 0x3F);
        return 3;
    }
    b[0] = 0xF0 | (c >> 18); b[1] = 0x80 | ((c >> 12) & 0x3F); b[2] = 0x80 | ((c >> 6) & 0x3F);
    b[3] = 0x80 | (c & 0x3F);
    return 4;
}

/* The string whose opening quote is at p->s[q]: decoded into the arena; *end: past the closing
 * quote. Checks in Python's scanstring order, with its messages and positions. */
static int parse_string(parser *p, size_t q, const char **out, size_t *out_len, uint32_t *flags,
                        size_t *end) {
    const unsigned char *s = p->s;
    size_t n = p->n, i = q + 1, len = 0;
    uint32_t fl = 0;
    for (;;) {
        size_t run = i;
        while (i < n && s[i] != '"' && s[i] != '\\') {
            if (s[i] <= 0x1F) return syntax(p, i, "Invalid control character at");
            /* a surrogate's three bytes, passed through from the raw text */
            if (s[i] == 0xED && i + 1 < n && s[i + 1] >= 0xA0) fl |= IG_JSON_LONE_SURROGATE;
            i++;
        }
        if (i >= n) return syntax(p, q, "Unterminated string starting at");
        if (i > run && scratch_put(p, &len, s + run, i - run)) return oom(p, i);
        if (s[i] == '"') {
            i++;
            break;
        }
        i++;                                     /* past the backslash */
        if (i >= n) return syntax(p, q, "Unterminated string starting at");
        unsigned char c = s[i];
        if (c != 'u') {
            char o;
            switch (c) {
            case '"': o = '"'; break;
            case '\\': o = '\\'; break;
            case '/': o = '/'; break;
            case 'b': o = '\b'; break;
            case 'f': o = '\f'; break;
            case 'n': o = '\n'; break;
            case 'r': o = '\r'; break;
            case 't': o = '\t'; break;
            default: return syntax(p, i - 1, "Invalid \\escape");
            }
            if (scratch_put(p, &len, &o, 1)) return oom(p, i);
            i++;
            continue;
        }
        size_t u = i;                            /* the 'u' */
        size_t e = u + 5;                        /* past the four digits */
        unsigned cp, lo;
        if (e >= n) return syntax(p, u, "Invalid \\uXXXX escape");
        if (hex4(s + u + 1, &cp)) return syntax(p, u, "Invalid \\uXXXX escape");
        if (cp >= 0xD800 && cp <= 0xDBFF && e + 6 < n && s[e] == '\\' && s[e + 1] == 'u') {
            if (hex4(s + e + 2, &lo)) return syntax(p, e + 1, "Invalid \\uXXXX escape");
            if (lo >= 0xDC00 && lo <= 0xDFFF) {
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                e += 6;
            }
        }
        if (cp >= 0xD800 && cp <= 0xDFFF) fl |= IG_JSON_LONE_SURROGATE;
        unsigned char b[4];
        if (scratch_put(p, &len, b, put_utf8(b, cp))) return oom(p, i);
        i = e;
    }
    char *str = arena_alloc(p->doc, len + 1);
    if (!str) return oom(p, q);
    if (len) memcpy(str, p->scratch, len);
    str[len] = 0;
    *out = str;
    *out_len = len;
    *flags = fl;
    *end = i;
    return 0;
}

/* A number at p->s[i] as Python's scanner matches it (the longest valid prefix; what follows is
 * left for the caller to refuse). Returns 1 if no number starts there. */
static int parse_number(parser *p, size_t i, ig_json **out, size_t *end) {
    const unsigned char *s = p->s;
    size_t n = p->n, at = i;
    int is_float = 0;
    if (s[i] == '-') {
        i++;
        if (i >= n) return 1;
    }
    size_t digits_at = i;
    if (s[i] >= '1' && s[i] <= '9') {
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
    } else if (s[i] == '0') {
        i++;
    } else {
        return 1;
    }
    size_t int_digits = i - digits_at;
    if (i + 1 < n && s[i] == '.' && s[i + 1] >= '0' && s[i + 1] <= '9') {
        is_float = 1;
        i += 2;
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
    }
    if (i + 1 < n && (s[i] == 'e' || s[i] == 'E')) {
        size_t e = i++;
        if (i + 1 < n && (s[i] == '-' || s[i] == '+')) i++;
        while (i < n && s[i] >= '0' && s[i] <= '9') i++;
        if (s[i - 1] >= '0' && s[i - 1] <= '9') is_float = 1;
        else i = e;
    }
    if (!is_float && int_digits > IG_JSON_MAX_INT_DIGITS) {
        set_error(p->err, IG_JSON_E_NUMBER, at, "Exceeds the limit (%d digits) for integer string "
                  "conversion: value has %zu digits", IG_JSON_MAX_INT_DIGITS, int_digits);
        return -1;
    }
    ig_json *v = new_value(p, IG_JSON_NUMBER, at);
    if (!v) return -1;
    size_t len = i - at;
    char *text = arena_alloc(p->doc, len + 1);
    if (!text) return oom(p, at);
    memcpy(text, s + at, len);
    text[len] = 0;
    v->u.num.text = text;
    v->u.num.len = len;
    if (is_float) v->u.num.d = strtod(text, NULL);         /* the caller holds the C locale */
    else {
        v->flags |= IG_JSON_INTEGER;
        int neg = s[at] == '-';
        uint64_t mag = 0;
        int over = 0;
        for (size_t k = digits_at; k < digits_at + int_digits; k++) {
            unsigned d = s[k] - '0';
            if (mag > (UINT64_MAX - d) / 10) { over = 1; break; }
            mag = mag * 10 + d;
        }
        /* an integer converts to the nearest double, as Python's float(int) and strtod do */
        if (over) v->u.num.d = strtod(text, NULL);
        else v->u.num.d = neg ? -(double)mag : (double)mag;
        if (!over) {
            if (!neg) {
                v->u.num.u = mag;
                v->flags |= IG_JSON_FITS_U64;
                if (mag <= (uint64_t)INT64_MAX) {
                    v->u.num.i = (int64_t)mag;
                    v->flags |= IG_JSON_FITS_I64;
                }
            } else if (mag <= (uint64_t)INT64_MAX + 1) {
                v->u.num.i = mag == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)mag;
                v->flags |= IG_JSON_FITS_I64;
                if (mag == 0) {
                    v->u.num.u = 0;
                    v->flags |= IG_JSON_FITS_U64;
                }
            }
        }
    }
    *out = v;
    *end = i;
    return 0;
}

static int push_item(parser *p, ig_json_member m, size_t at) {
    if (p->n_items == p->cap_items) {
        size_t cap = p->cap_items ? p->cap_items * 2 : 64;
        ig_json_member *fresh = realloc(p->items, cap * sizeof *fresh);
        if (!fresh) return oom(p, at);
        p->items = fresh;
        p->cap_items = cap;
    }
    p->items[p->n_items++] = m;
    return 0;
}

/* the place of the open container's next value, as check_request_value spells it */
static void depth_path(parser *p, char *out, size_t cap) {
    size_t len = 0;
    out[0] = 0;
    for (int d = 0; d < p->depth; d++) {
        frame *f = &p->frames[d];
        char label[64];
        const char *text;
        size_t tlen;
        if (f->is_object) {
            text = f->key_len ? f->key : "\"\"";
            tlen = f->key_len ? f->key_len : 2;
        } else {
            snprintf(label, sizeof label, "[%zu]", f->count);
            text = label;
            tlen = strlen(label);
        }
        if (d > 0 && len + 1 < cap) out[len++] = '.';
        size_t k = tlen < cap - 1 - len ? tlen : cap - 1 - len;
        memcpy(out + len, text, k);
        len += k;
        out[len] = 0;
    }
}

typedef struct { const char *key; size_t len; size_t index; } key_ref;

static int key_cmp(const void *a, const void *b) {
    const key_ref *x = a, *y = b;
    size_t m = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->key, y->key, m);
    if (c) return c;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

/* Duplicate keys of one object's members: the last value at the first key's place (a dict's
 * rule). Returns the number of members kept (compacted in place), or -1 out of memory. */
static long dedupe(ig_json_member *m, size_t n) {
    if (n < 2) return (long)n;
    unsigned char *gone = calloc(n, 1);
    if (!gone) return -1;
    size_t dropped = 0;
    if (n <= 16) {
        for (size_t j = 1; j < n; j++)
            for (size_t i = 0; i < j; i++)
                if (!gone[i] && m[i].key_len == m[j].key_len &&
                    memcmp(m[i].key, m[j].key, m[j].key_len) == 0) {
                    m[i].value = m[j].value;
                    gone[j] = 1;
                    dropped++;
                    break;
                }
    } else {
        key_ref *r = malloc(n * sizeof *r);
        if (!r) { free(gone); return -1; }
        for (size_t i = 0; i < n; i++) r[i] = (key_ref){m[i].key, m[i].key_len, i};
        qsort(r, n, sizeof *r, key_cmp);
        for (size_t a = 0; a < n;) {
            size_t b = a + 1;
            while (b < n && r[b].len == r[a].len && memcmp(r[b].key, r[a].key, r[a].len) == 0) b++;
            if (b - a > 1) {
                m[r[a].index].value = m[r[b - 1].index].value;
                for (size_t k = a + 1; k < b; k++) gone[r[k].index] = 1;
                dropped += b - a - 1;
            }
            a = b;
        }
        free(r);
    }
    size_t k = 0;
    if (dropped)
        for (size_t i = 0; i < n; i++)
            if (!gone[i]) m[k++] = m[i];
    free(gone);
    return (long)(n - dropped);
}

/* Close the innermost container: its children move from the item stack into the arena. */
static ig_json *close_container(parser *p, size_t at) {
    frame *f = &p->frames[p->depth - 1];
    ig_json *v = f->v;
    size_t n = p->n_items - f->start;
    ig_json_member *kids = p->items + f->start;
    if (f->is_object) {
        long kept = dedupe(kids, n);
        if (kept < 0) { oom(p, at); return NULL; }
        ig_json_member *m = kept ? arena_alloc(p->doc, (size_t)kept * sizeof *m) : NULL;
        if (kept && !m) { oom(p, at); return NULL; }
        if (kept) memcpy(m, kids, (size_t)kept * sizeof *m);
        v->u.obj.members = m;
        v->u.obj.n = (size_t)kept;
    } else {
        ig_json **a = n ? arena_alloc(p->doc, n * sizeof *a) : NULL;
        if (n && !a) { oom(p, at); return NULL; }
        for (size_t i = 0; i < n; i++) a[i] = kids[i].value;
        v->u.arr.items = a;
        v->u.arr.n = n;
    }
    p->n_items = f->start;
    p->depth--;
    return v;
}

/* after '{' or ',' in an object: the key and its ':' (Python's _parse_object order) */
static int read_key(parser *p, size_t *i) {
    frame *f = &p->frames[p->depth - 1];
    if (*i >= p->n || p->s[*i] != '"')
        return syntax(p, *i, "Expecting property name enclosed in double quotes");
    ig_json_member m = {0};
    m.key_offset = *i;
    if (parse_string(p, *i, &m.key, &m.key_len, &m.key_flags, i)) return -1;
    *i = skip_ws(p, *i);
    if (*i >= p->n || p->s[*i] != ':') return syntax(p, *i, "Expecting ':' delimiter");
    *i = skip_ws(p, *i + 1);
    f->key = m.key;
    f->key_len = m.key_len;
    return push_item(p, m, *i);
}

static int parse_text(parser *p) {
    const unsigned char *s = p->s;
    size_t n = p->n;
    size_t i = skip_ws(p, p->start);
    ig_json *done = NULL;              /* a value just completed, to place in its container */
    for (;;) {
        if (!done) {                   /* a value starts at i (Python's scan_once) */
            if (i >= n) return syntax(p, i, "Expecting value");
            unsigned char c = s[i];
            if (c == '"') {
                ig_json *v = new_value(p, IG_JSON_STRING, i);
                if (!v) return -1;
                if (parse_string(p, i, &v->u.str.s, &v->u.str.len, &v->flags, &i)) return -1;
                done = v;
            } else if (c == '{' || c == '[') {
                int obj = c == '{';
                if (p->depth >= p->lim.max_depth) {
                    if (p->err) {
                        set_error(p->err, IG_JSON_E_DEPTH, i, "the JSON text nests arrays and "
                                  "objects more than %d levels deep", p->lim.max_depth);
                        depth_path(p, p->err->path, sizeof p->err->path);
                        python_position(s, p->start, i, p->err);
                    }
                    return -1;
                }
                ig_json *v = new_value(p, obj ? IG_JSON_OBJECT : IG_JSON_ARRAY, i);
                if (!v) return -1;
                p->frames[p->depth++] = (frame){.v = v, .start = p->n_items, .is_object = obj};
                i = skip_ws(p, i + 1);
                if (i < n && s[i] == (obj ? '}' : ']')) {
                    if (!(done = close_container(p, i + 1))) return -1;
                    i++;
                } else if (obj) {
                    if (read_key(p, &i)) return -1;
                    continue;
                } else {
                    continue;
                }
            } else if (c == 'n' && i + 3 < n && memcmp(s + i, "null", 4) == 0) {
                if (!(done = new_value(p, IG_JSON_NULL, i))) return -1;
                i += 4;
            } else if (c == 't' && i + 3 < n && memcmp(s + i, "true", 4) == 0) {
                if (!(done = new_value(p, IG_JSON_TRUE, i))) return -1;
                i += 4;
            } else if (c == 'f' && i + 4 < n && memcmp(s + i, "false", 5) == 0) {
                if (!(done = new_value(p, IG_JSON_FALSE, i))) return -1;
                i += 5;
            } else if (c == 'N' && i + 2 < n && memcmp(s + i, "NaN", 3) == 0) {
                set_error(p->err, IG_JSON_E_CONSTANT, i, "NaN is not valid JSON");
                return -1;
            } else if (c == 'I' && i + 7 < n && memcmp(s + i, "Infinity", 8) == 0) {
                set_error(p->err, IG_JSON_E_CONSTANT, i, "Infinity is not valid JSON");
                return -1;
            } else if (c == '-' && i + 8 < n && memcmp(s + i, "-Infinity", 9) == 0) {
                set_error(p->err, IG_JSON_E_CONSTANT, i, "-Infinity is not valid JSON");
                return -1;
            } else {
                int r = parse_number(p, i, &done, &i);
                if (r < 0) return -1;
                if (r > 0) return syntax(p, i, "Expecting value");
            }
        }
        /* place `done` */
        if (p->depth == 0) {
            p->doc->root = done;
            i = skip_ws(p, i);
            if (i != n) return syntax(p, i, "Extra data");
            return 0;
        }
        frame *f = &p->frames[p->depth - 1];
        if (f->is_object) p->items[p->n_items - 1].value = done;
        else if (push_item(p, (ig_json_member){.value = done}, i)) return -1;
        f->count++;
        done = NULL;
        i = skip_ws(p, i);
        unsigned char close = f->is_object ? '}' : ']';
        if (i < n && s[i] == close) {
            if (!(done = close_container(p, i + 1))) return -1;
            i++;
            continue;                                 /* placed in its parent on the next turn */
        }
        if (i >= n || s[i] != ',') return syntax(p, i, "Expecting ',' delimiter");
        i = skip_ws(p, i + 1);
        if (f->is_object && read_key(p, &i)) return -1;
    }
}

ig_json_doc *ig_json_parse(const char *text, size_t len, const ig_json_limits *limits,
                           ig_json_error *err) {
    if (err) memset(err, 0, sizeof *err);
    parser p = {0};
    p.s = (const unsigned char *)text;
    p.n = len;
    p.err = err;
    p.lim.max_depth = limits && limits->max_depth > 0 ? limits->max_depth : IG_JSON_DEFAULT_DEPTH;
    p.lim.max_bytes = limits && limits->max_bytes ? limits->max_bytes : IG_JSON_DEFAULT_BYTES;
    p.lim.max_elements = limits && limits->max_elements ? limits->max_elements
                                                        : IG_JSON_DEFAULT_ELEMENTS;
    if (!text && len) {
        set_error(err, IG_JSON_E_SYNTAX, 0, "no JSON text (NULL)");
        return NULL;
    }
    if (len > p.lim.max_bytes) {
        set_error(err, IG_JSON_E_SIZE, p.lim.max_bytes, "the JSON text is larger than %zu bytes",
                  p.lim.max_bytes);
        return NULL;
    }
    if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0) p.start = 3;
    if (check_utf8(p.s + p.start, len - p.start, p.start, err)) return NULL;
    p.doc = calloc(1, sizeof *p.doc);
    p.frames = malloc((size_t)p.lim.max_depth * sizeof *p.frames);
    if (!p.doc || !p.frames) {
        free(p.frames);
        free(p.doc);
        set_error(err, IG_JSON_E_MEMORY, 0, "out of memory reading the JSON text");
        return NULL;
    }
    locale_t old = c_locale_begin();
    int r = parse_text(&p);
    c_locale_end(old);
    free(p.items);
    free(p.scratch);
    free(p.frames);
    if (r) {
        ig_json_free(p.doc);
        return NULL;
    }
    return p.doc;
}

/* ---- lookup ---- */

const char *ig_json_type_name(ig_json_type t) {
    switch (t) {
    case IG_JSON_NULL: return "NoneType";
    case IG_JSON_FALSE: case IG_JSON_TRUE: return "bool";
    case IG_JSON_NUMBER: return "number";
    case IG_JSON_STRING: return "str";
    case IG_JSON_ARRAY: return "list";
    case IG_JSON_OBJECT: return "dict";
    }
    return "?";
}

static const char *value_type_name(const ig_json *v) {
    if (v->type == IG_JSON_NUMBER) return v->flags & IG_JSON_INTEGER ? "int" : "float";
    return ig_json_type_name(v->type);
}

const ig_json *ig_json_get(const ig_json *obj, const char *key) {
    if (!obj || obj->type != IG_JSON_OBJECT || !key) return NULL;
    size_t len = strlen(key);
    for (size_t i = 0; i < obj->u.obj.n; i++) {
        const ig_json_member *m = &obj->u.obj.members[i];
        if (m->key_len == len && memcmp(m->key, key, len) == 0) return m->value;
    }
    return NULL;
}

const ig_json *ig_json_at(const ig_json *arr, size_t i) {
    if (!arr || arr->type != IG_JSON_ARRAY || i >= arr->u.arr.n) return NULL;
    return arr->u.arr.items[i];
}

size_t ig_json_len(const ig_json *v) {
    if (!v) return 0;
    if (v->type == IG_JSON_OBJECT) return v->u.obj.n;
    if (v->type == IG_JSON_ARRAY) return v->u.arr.n;
    if (v->type == IG_JSON_STRING) return v->u.str.len;
    return 0;
}

static int type_error(const ig_json *v, const char *what, const char *expected, ig_json_error *err) {
    if (!v) {
        set_error(err, IG_JSON_E_MISSING, 0, "%s is missing", what ? what : "the value");
        return -1;
    }
    set_error(err, IG_JSON_E_TYPE, v->offset, "%s must be %s, got %s", what ? what : "the value",
              expected, value_type_name(v));
    return -1;
}

int ig_json_get_string(const ig_json *v, const char *what, const char **s, size_t *len,
                       ig_json_error *err) {
    if (!v || v->type != IG_JSON_STRING) return type_error(v, what, "a string", err);
    *s = v->u.str.s;
    if (len) *len = v->u.str.len;
    return 0;
}

int ig_json_get_number(const ig_json *v, const char *what, double *d, ig_json_error *err) {
    if (!v || v->type != IG_JSON_NUMBER) return type_error(v, what, "a number", err);
    *d = v->u.num.d;
    return 0;
}

int ig_json_get_int(const ig_json *v, const char *what, int64_t *i, ig_json_error *err) {
    if (!v || v->type != IG_JSON_NUMBER || !(v->flags & IG_JSON_INTEGER))
        return type_error(v, what, "an integer", err);
    if (!(v->flags & IG_JSON_FITS_I64)) {
        set_error(err, IG_JSON_E_TYPE, v->offset, "%s must be an integer within 64 bits, got %.40s",
                  what ? what : "the value", v->u.num.text);
        return -1;
    }
    *i = v->u.num.i;
    return 0;
}

int ig_json_get_u64(const ig_json *v, const char *what, uint64_t *u, ig_json_error *err) {
    if (!v || v->type != IG_JSON_NUMBER || !(v->flags & IG_JSON_INTEGER))
        return type_error(v, what, "an integer", err);
    if (v->flags & IG_JSON_FITS_U64) *u = v->u.num.u;
    else if (v->flags & IG_JSON_FITS_I64) *u = (uint64_t)v->u.num.i;
    else {
        set_error(err, IG_JSON_E_TYPE, v->offset, "%s must be an integer in [-2**63, 2**64), got "
                  "%.40s", what ? what : "the value", v->u.num.text);
        return -1;
    }
    return 0;
}

int ig_json_get_bool(const ig_json *v, const char *what, int *b, ig_json_error *err) {
    if (!v || (v->type != IG_JSON_TRUE && v->type != IG_JSON_FALSE))
        return type_error(v, what, "true or false", err);
    *b = v->type == IG_JSON_TRUE;
    return 0;
}

/* ---- writer ---- */

/* first[depth]: LEVEL_EMPTY while nothing is written at that level; LEVEL_OBJECT in an object */
#define LEVEL_EMPTY 1
#define LEVEL_OBJECT 2


void ig_jw_init(ig_jw *w, int style) {
    memset(w, 0, sizeof *w);
    w->style = style;
    w->first[0] = LEVEL_EMPTY;
}

void ig_jw_reset(ig_jw *w) {
    w->len = 0;
    w->failed = 0;
    w->depth = 0;
    w->after_key = 0;
    w->first[0] = LEVEL_EMPTY;
}

void ig_jw_free(ig_jw *w) {
    free(w->buf);
    w->buf = NULL;
    w->len = w->cap = 0;
}

char *ig_jw_take(ig_jw *w) {
    if (w->failed || w->depth != 0 || !w->buf) {
        ig_jw_free(w);
        return NULL;
    }
    char *out = w->buf;
    w->buf = NULL;
    w->len = w->cap = 0;
    return out;
}

static void put(ig_jw *w, const void *b, size_t n) {
    if (w->failed) return;
    if (w->len + n + 1 > w->cap) {
        size_t cap = w->cap ? w->cap : 256;
        while (cap < w->len + n + 1) {
            if (cap > SIZE_MAX / 2) { w->failed = 1; return; }
            cap *= 2;
        }
        char *fresh = realloc(w->buf, cap);
        if (!fresh) {
            w->failed = 1;
            return;
        }
        w->buf = fresh;
        w->cap = cap;
    }
    memcpy(w->buf + w->len, b, n);
    w->len += n;
    w->buf[w->len] = 0;
}

/* a value begins: the separator before it, if any (in an object, the key wrote it) */
static void before_value(ig_jw *w) {
    if (w->after_key) {
        w->after_key = 0;
        return;
    }
    if (w->depth == 0) {
        if (!(w->first[0] & LEVEL_EMPTY)) w->failed = 1;    /* one value per text */
        w->first[0] = 0;
        return;
    }
    if (w->first[w->depth] & LEVEL_OBJECT) {                 /* a value without its key */
        w->failed = 1;
        return;
    }
    if (!(w->first[w->depth] & LEVEL_EMPTY)) put(w, w->style == IG_JW_SPACED ? ", " : ",", w->style + 1);
    w->first[w->depth] &= (unsigned char)~LEVEL_EMPTY;
}

static void open_level(ig_jw *w, char c) {
    before_value(w);
    put(w, &c, 1);
    if (w->depth + 1 >= (int)sizeof w->first) {
        w->failed = 1;
        return;
    }
    w->first[++w->depth] = LEVEL_EMPTY | (c == '{' ? LEVEL_OBJECT : 0);
}

static void close_level(ig_jw *w, char c) {
    if (w->depth == 0 || w->after_key || !(w->first[w->depth] & LEVEL_OBJECT) != (c == ']')) {
        w->failed = 1;
        return;
    }
    w->depth--;
    put(w, &c, 1);
}

void ig_jw_begin_object(ig_jw *w) { open_level(w, '{'); }
void ig_jw_end_object(ig_jw *w) { close_level(w, '}'); }
void ig_jw_begin_array(ig_jw *w) { open_level(w, '['); }
void ig_jw_end_array(ig_jw *w) { close_level(w, ']'); }

static void put_escaped(ig_jw *w, const char *str, size_t len) {
    static const char hex[] = "0123456789abcdef";
    const unsigned char *s = (const unsigned char *)str;
    put(w, "\"", 1);
    size_t run = 0, i = 0;
    while (i < len) {
        unsigned c = s[i];
        if (c >= 0x20 && c != '"' && c != '\\' && c < 0x80) {
            i++;
            continue;
        }
        size_t seq = 0;                     /* a valid UTF-8 sequence's length, to copy */
        unsigned surrogate = 0;
        if (c >= 0x80) {
            if (c >= 0xC2 && c <= 0xDF && i + 1 < len && (s[i + 1] & 0xC0) == 0x80) seq = 2;
            else if (c >= 0xE0 && c <= 0xEF && i + 2 < len && (s[i + 1] & 0xC0) == 0x80 &&
                     (s[i + 2] & 0xC0) == 0x80 && !(c == 0xE0 && s[i + 1] < 0xA0)) {
                if (c == 0xED && s[i + 1] >= 0xA0)
                    surrogate = 0xD000 | ((s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
                else seq = 3;
            } else if (c >= 0xF0 && c <= 0xF4 && i + 3 < len && (s[i + 1] & 0xC0) == 0x80 &&
                       (s[i + 2] & 0xC0) == 0x80 && (s[i + 3] & 0xC0) == 0x80 &&
                       !(c == 0xF0 && s[i + 1] < 0x90) && !(c == 0xF4 && s[i + 1] > 0x8F))
                seq = 4;
            if (seq) {
                i += seq;
                continue;
            }
        }
        put(w, s + run, i - run);
        char e[8];
        size_t k = 2;
        e[0] = '\\';
        switch (c) {
        case '"': e[1] = '"'; break;
        case '\\': e[1] = '\\'; break;
        case '\n': e[1] = 'n'; break;
        case '\r': e[1] = 'r'; break;
        case '\t': e[1] = 't'; break;
        case '\b': e[1] = 'b'; break;
        case '\f': e[1] = 'f'; break;
        default:
            if (c < 0x20 || surrogate) {
                unsigned v = surrogate ? surrogate : c;
                e[1] = 'u';
                e[2] = hex[(v >> 12) & 15];
                e[3] = hex[(v >> 8) & 15];
                e[4] = hex[(v >> 4) & 15];
                e[5] = hex[v & 15];
                k = 6;
            } else {                        /* invalid UTF-8: U+FFFD */
                memcpy(e, "\xEF\xBF\xBD", 3);
                k = 3;
            }
        }
        put(w, e, k);
        i += surrogate ? 3 : 1;
        run = i;
    }
    put(w, s + run, len - run);
    put(w, "\"", 1);
}

void ig_jw_key(ig_jw *w, const char *key, size_t len) {
    if (w->depth == 0 || w->after_key || !(w->first[w->depth] & LEVEL_OBJECT)) {
        w->failed = 1;
        return;
    }
    if (!(w->first[w->depth] & LEVEL_EMPTY)) put(w, w->style == IG_JW_SPACED ? ", " : ",", w->style + 1);
    w->first[w->depth] &= (unsigned char)~LEVEL_EMPTY;
    put_escaped(w, key, len);
    put(w, w->style == IG_JW_SPACED ? ": " : ":", w->style + 1);
    w->after_key = 1;
}

void ig_jw_string(ig_jw *w, const char *s, size_t len) {
    before_value(w);
    put_escaped(w, s, len);
}

void ig_jw_cstr(ig_jw *w, const char *s) { ig_jw_string(w, s, strlen(s)); }

static void put_decimal(ig_jw *w, int neg, uint64_t mag) {
    char b[24];
    size_t k = sizeof b;
    do {
        b[--k] = (char)('0' + mag % 10);
        mag /= 10;
    } while (mag);
    if (neg) b[--k] = '-';
    put(w, b + k, sizeof b - k);
}

void ig_jw_int(ig_jw *w, int64_t v) {
    before_value(w);
    put_decimal(w, v < 0, v < 0 ? 0 - (uint64_t)v : (uint64_t)v);
}

void ig_jw_uint(ig_jw *w, uint64_t v) {
    before_value(w);
    put_decimal(w, 0, v);
}

/* t: v rounded to 16 significant digits ("%.15e"), which did not read back to v. The 16-digit
 * number one unit of the last digit nearer to v may still do (Python's repr finds it: 2^-24 is
 * 5.960464477539063e-08, not the 17 digits ...0625): step the last digit towards v; into b if it
 * reads back. */
static int next16_reads_back(char *b, const char *t, double v) {
    char c[40];
    memcpy(c, t, 40);
    char *e = strchr(c, 'e');
    if (!e) return 0;
    const int up = (strtod(t, NULL) < v) != (c[0] == '-');     /* away from zero in magnitude */
    for (char *d = e - 1; d >= c; d--) {
        if (*d == '.') continue;
        if (*d < '0' || *d > '9') return 0;
        if (up ? *d < '9' : *d > '0') {
            *d += up ? 1 : -1;
            break;
        }
        *d = up ? '0' : '9';            /* carry or borrow on */
        if (d == c || (d == c + 1 && c[0] == '-')) return 0;   /* 9.99.. -> 10: leave it to 17 */
    }
    if (c[0] == '0' || (c[0] == '-' && c[1] == '0')) return 0;  /* 1.000.. - 1 unit */
    if (strtod(c, NULL) != v) return 0;
    memcpy(b, c, 40);
    return 1;
}

int ig_json_format_double(char *out, double v) {
    if (isnan(v)) return (int)strlen(strcpy(out, "NaN"));
    if (isinf(v)) return (int)strlen(strcpy(out, v > 0 ? "Infinity" : "-Infinity"));
    if (v == 0) return (int)strlen(strcpy(out, signbit(v) ? "-0.0" : "0.0"));
    locale_t old = c_locale_begin();
    /* the fewest significant digits that read back to v: rounding to more digits only moves
     * closer to v, so "reads back" is monotone in the digit count. Doubles made from float32
     * (logprobs, embeddings) mostly need 16 or 17: try 15, 16, 17 first, bisect below 15. */
    char b[40], t[40];
    int lo = 1, hi;
#define READS_BACK(p) (snprintf(t, sizeof t, "%.*e", (p) - 1, v), strtod(t, NULL) == v ? \
                       (memcpy(b, t, sizeof t), 1) : 0)
    if (READS_BACK(15)) {
        hi = 15;
        while (lo < hi) {
            int mid = (lo + hi) / 2;
            if (READS_BACK(mid)) hi = mid;
            else lo = mid + 1;
        }
    } else if (!READS_BACK(16) && !next16_reads_back(b, t, v)) {
        READS_BACK(17);                  /* 17 digits always read back */
    }
#undef READS_BACK
    c_locale_end(old);
    /* b: [-]d[.ddd]e[+-]XX -> digits and exponent, then Python's repr layout */
    char digits[24];
    int nd = 0, neg = 0;
    const char *q = b;
    if (*q == '-') { neg = 1; q++; }
    for (; *q && *q != 'e'; q++)
        if (*q >= '0' && *q <= '9') digits[nd++] = *q;
    int exp10 = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    char *o = out;
    if (neg) *o++ = '-';
    if (exp10 >= -4 && exp10 < 16) {
        if (exp10 < 0) {
            *o++ = '0';
            *o++ = '.';
            for (int k = -1; k > exp10; k--) *o++ = '0';
            for (int k = 0; k < nd; k++) *o++ = digits[k];
        } else {
            for (int k = 0; k <= exp10; k++) *o++ = k < nd ? digits[k] : '0';
            *o++ = '.';
            if (nd > exp10 + 1)
                for (int k = exp10 + 1; k < nd; k++) *o++ = digits[k];
            else *o++ = '0';
        }
    } else {
        *o++ = digits[0];
        if (nd > 1) {
            *o++ = '.';
            for (int k = 1; k < nd; k++) *o++ = digits[k];
        }
        o += sprintf(o, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    }
    *o = 0;
    return (int)(o - out);
}

void ig_jw_double(ig_jw *w, double v) {
    char b[40];
    before_value(w);
    put(w, b, (size_t)ig_json_format_double(b, v));
}

void ig_jw_bool(ig_jw *w, int v) {
    before_value(w);
    put(w, v ? "true" : "false", v ? 4 : 5);
}

void ig_jw_null(ig_jw *w) {
    before_value(w);
    put(w, "null", 4);
}

void ig_jw_raw(ig_jw *w, const char *json, size_t len) {
    before_value(w);
    put(w, json, len);
}

void ig_jw_value(ig_jw *w, const ig_json *v) {
    /* iterative: (container, next child) pairs, as deep as the writer's own levels */
    struct { const ig_json *c; size_t next; } stack[sizeof w->first];
    int top = 0;
    for (;;) {
        if (v) {
            switch (v->type) {
            case IG_JSON_NULL: ig_jw_null(w); break;
            case IG_JSON_FALSE: ig_jw_bool(w, 0); break;
            case IG_JSON_TRUE: ig_jw_bool(w, 1); break;
            case IG_JSON_STRING: ig_jw_string(w, v->u.str.s, v->u.str.len); break;
            case IG_JSON_NUMBER:
                if (!(v->flags & IG_JSON_INTEGER)) ig_jw_double(w, v->u.num.d);
                else if (v->flags & IG_JSON_FITS_I64) ig_jw_int(w, v->u.num.i);
                else if (v->flags & IG_JSON_FITS_U64) ig_jw_uint(w, v->u.num.u);
                else ig_jw_raw(w, v->u.num.text, v->u.num.len);   /* a big int's own digits */
                break;
            case IG_JSON_ARRAY:
            case IG_JSON_OBJECT:
                if (top == (int)(sizeof stack / sizeof stack[0])) {
                    w->failed = 1;
                    return;
                }
                if (v->type == IG_JSON_ARRAY) ig_jw_begin_array(w);
                else ig_jw_begin_object(w);
                stack[top].c = v;
                stack[top++].next = 0;
                break;
            }
        }
        if (top == 0 || w->failed) return;
        const ig_json *c = stack[top - 1].c;
        size_t i = stack[top - 1].next++;
        if (c->type == IG_JSON_ARRAY) {
            if (i < c->u.arr.n) {
                v = c->u.arr.items[i];
                continue;
            }
            ig_jw_end_array(w);
        } else {
            if (i < c->u.obj.n) {
                ig_jw_key(w, c->u.obj.members[i].key, c->u.obj.members[i].key_len);
                v = c->u.obj.members[i].value;
                continue;
            }
            ig_jw_end_object(w);
        }
        top--;
        v = NULL;
    }
}

void ig_jw_base64_f32(ig_jw *w, const float *v, size_t n) {
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    before_value(w);
    put(w, "\"", 1);
    size_t nbytes = n * 4;
    unsigned char in[3];
    char out[4];
    size_t k = 0;
    for (size_t b = 0; b < nbytes; b++) {
        uint32_t bits;
        memcpy(&bits, &v[b / 4], 4);
        in[k++] = (unsigned char)(bits >> (8 * (b % 4)));    /* little-endian on any host */
        if (k == 3 || b + 1 == nbytes) {
            uint32_t t = (uint32_t)in[0] << 16 | (k > 1 ? (uint32_t)in[1] << 8 : 0) |
                         (k > 2 ? in[2] : 0);
            out[0] = abc[(t >> 18) & 63];
            out[1] = abc[(t >> 12) & 63];
            out[2] = k > 1 ? abc[(t >> 6) & 63] : '=';
            out[3] = k > 2 ? abc[t & 63] : '=';
            put(w, out, 4);
            k = 0;
        }
    }
    put(w, "\"", 1);
}
