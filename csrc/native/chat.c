/* Chat template renderers in C, one per template family (see chat.h); each function below mirrors
 * its Jinja template statement by statement, in the template's order.
 *
 * Python semantics the templates rely on, reproduced on UTF-8 bytes: str.strip() (Jinja's trim:
 * Unicode whitespace), strip/lstrip/rstrip('\n'), split(sep)[0] / [-1], startswith, endswith, `in`,
 * a string's truthiness (non-empty), and transformers' tojson (json.dumps(ensure_ascii=False):
 * separators ", " and ": ", or indent=4 with "," and ": "). As in ignis's Python path, where the
 * tokenizer masks its added tokens' text in the caller's strings before the template runs
 * (Tokenizer.encode_chat), those string operations do not see text inside such a spelling: with
 * Qwen3's tokenizer, "</think>" written in a message is not where the template splits reasoning.
 * (Not reproduced: TextMasker's fences change a string operation only where a spelling holds
 * whitespace; no supported tokenizer's does.)
 *
 * Section layout (little endian), written by ignis/native/chat_blob.py:
 *   0   magic "IGCHAT\0\0"
 *   8   u32 version (IG_CHAT_SECTION_VERSION), u32 family, u32 flags, u32 number of parameters
 *   24  per parameter: u32 key length, key bytes, u32 value length, value bytes
 * Parameters: "default_system" (Qwen2.5, ChatML), "bos_token" (Llama 3.2; absent: empty, as an
 * undefined bos_token prints in Jinja), "added_tokens" (the spellings the tokenizer masks: u32
 * count, then per spelling u32 length and bytes). Flags: bit 0, developer messages render as
 * system ones (the template does not name the developer role).
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L          /* localtime_r */
#endif
#include "chat.h"
#include "json.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FLAG_DEVELOPER_AS_SYSTEM 1u
#define MAX_PARAMS 16
#define MAX_PARAM_BYTES 65536
#define MAX_SPELLINGS_BYTES ((size_t)64 << 20)
#define MAX_SPELLINGS ((size_t)1 << 20)

struct ig_chat_template {
    int family;
    unsigned flags;
    char *default_system;
    size_t default_system_len;
    char *bos;
    size_t bos_len;
    /* the tokenizer's added-token spellings, which ignis masks in the caller's strings before
     * the template sees them: sorted by first byte, longest first; by_byte[b]..by_byte[b + 1] */
    char *spell_data;
    ig_chat_str *spell;
    size_t n_spell;
    size_t by_byte[257];
};

static const char *const FAMILY_NAMES[IG_CHAT_FAMILY_COUNT] = {
    "none", "qwen2.5", "chatml-default-system", "qwen3", "llama3.2"};
static const char *const ROLE_NAMES[IG_CHAT_ROLE_COUNT] = {
    "system", "developer", "user", "assistant", "tool"};

static void set_err(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || !errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

const char *ig_chat_family_name(int family) {
    return family >= 0 && family < IG_CHAT_FAMILY_COUNT ? FAMILY_NAMES[family] : "?";
}

/* ------------------------------------------------------------------------------------ section */

static uint32_t rd32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static char *dup_bytes(const unsigned char *p, size_t n) {
    char *s = malloc(n + 1);
    if (s) {
        if (n)
            memcpy(s, p, n);
        s[n] = 0;
    }
    return s;
}

static int by_first_byte_longest(const void *a, const void *b) {
    const ig_chat_str *x = a, *y = b;
    unsigned char cx = (unsigned char)x->s[0], cy = (unsigned char)y->s[0];
    if (cx != cy)
        return cx < cy ? -1 : 1;
    return x->len > y->len ? -1 : x->len < y->len ? 1 : 0;
}

/* "added_tokens": u32 count, then per spelling u32 length and its bytes (non-empty).
 * 0, -1 damaged, 1 out of memory. */
static int load_spellings(ig_chat_template *t, const unsigned char *p, size_t len) {
    if (len < 4)
        return -1;
    size_t n = rd32(p), at = 4;
    if (n > MAX_SPELLINGS || n > (len - 4) / 5)
        return -1;
    t->spell_data = malloc(len);
    t->spell = calloc(n ? n : 1, sizeof *t->spell);
    if (!t->spell_data || !t->spell)
        return 1;
    memcpy(t->spell_data, p, len);
    for (size_t i = 0; i < n; i++) {
        if (len - at < 4)
            return -1;
        size_t k = rd32(p + at);
        at += 4;
        if (!k || len - at < k)
            return -1;
        t->spell[i] = (ig_chat_str){t->spell_data + at, k};
        at += k;
    }
    if (at != len)
        return -1;
    t->n_spell = n;
    qsort(t->spell, n, sizeof *t->spell, by_first_byte_longest);
    size_t i = 0;
    for (int b = 0; b < 256; b++) {
        t->by_byte[b] = i;
        while (i < n && (unsigned char)t->spell[i].s[0] == b)
            i++;
    }
    t->by_byte[256] = n;
    return 0;
}

void ig_chat_template_free(ig_chat_template *t) {
    if (!t)
        return;
    free(t->default_system);
    free(t->bos);
    free(t->spell_data);
    free(t->spell);
    free(t);
}

ig_chat_template *ig_chat_load(const void *section, size_t len, char *err, size_t errlen) {
    const unsigned char *p = section;
    if (!p || len < 24 || memcmp(p, "IGCHAT\0\0", 8) != 0) {
        set_err(err, errlen, "the chat section is missing or damaged (bad magic)");
        return NULL;
    }
    uint32_t version = rd32(p + 8), family = rd32(p + 12), flags = rd32(p + 16), n = rd32(p + 20);
    if (version != IG_CHAT_SECTION_VERSION) {
        set_err(err, errlen, "the chat section is version %u; this library reads version %d "
                "(compile the model again with this ignis)", version, IG_CHAT_SECTION_VERSION);
        return NULL;
    }
    if (family >= IG_CHAT_FAMILY_COUNT) {
        set_err(err, errlen, "the chat section names template family %u, which this library does "
                "not render", family);
        return NULL;
    }
    if (n > MAX_PARAMS || (flags & ~FLAG_DEVELOPER_AS_SYSTEM)) {
        set_err(err, errlen, "the chat section is damaged (%u parameters, flags %#x)", n, flags);
        return NULL;
    }
    ig_chat_template *t = calloc(1, sizeof *t);
    if (!t) {
        set_err(err, errlen, "out of memory");
        return NULL;
    }
    t->family = (int)family;
    t->flags = flags;
    size_t at = 24;
    for (uint32_t i = 0; i < n; i++) {
        if (len - at < 4)
            goto damaged;
        size_t kl = rd32(p + at);
        at += 4;
        if (kl > 64 || len - at < kl + 4)
            goto damaged;
        const unsigned char *key = p + at;
        at += kl;
        size_t vl = rd32(p + at);
        at += 4;
        if (len - at < vl)
            goto damaged;
        if (kl == 12 && memcmp(key, "added_tokens", 12) == 0) {
            if (t->spell_data || vl > MAX_SPELLINGS_BYTES)
                goto damaged;
            int st = load_spellings(t, p + at, vl);
            if (st < 0)
                goto damaged;
            if (st > 0) {
                ig_chat_template_free(t);
                set_err(err, errlen, "out of memory");
                return NULL;
            }
            at += vl;
            continue;
        }
        if (vl > MAX_PARAM_BYTES)
            goto damaged;
        char **slot = NULL;
        size_t *slot_len = NULL;
        if (kl == 14 && memcmp(key, "default_system", 14) == 0) {
            slot = &t->default_system;
            slot_len = &t->default_system_len;
        } else if (kl == 9 && memcmp(key, "bos_token", 9) == 0) {
            slot = &t->bos;
            slot_len = &t->bos_len;
        }
        if (slot) {                    /* unknown parameters are skipped: a newer writer's extras */
            if (*slot)
                goto damaged;
            if (!(*slot = dup_bytes(p + at, vl))) {
                ig_chat_template_free(t);
                set_err(err, errlen, "out of memory");
                return NULL;
            }
            *slot_len = vl;
        }
        at += vl;
    }
    if (at != len)
        goto damaged;
    if ((t->family == IG_CHAT_FAMILY_QWEN25 || t->family == IG_CHAT_FAMILY_CHATML) &&
        !t->default_system) {
        set_err(err, errlen, "the chat section of family %s has no default system prompt",
                FAMILY_NAMES[t->family]);
        ig_chat_template_free(t);
        return NULL;
    }
    return t;
damaged:
    set_err(err, errlen, "the chat section is damaged (a parameter runs past its end)");
    ig_chat_template_free(t);
    return NULL;
}

int ig_chat_template_family(const ig_chat_template *t) {
    return t ? t->family : -1;
}

int ig_chat_template_tools(const ig_chat_template *t) {
    return t && (t->family == IG_CHAT_FAMILY_QWEN25 || t->family == IG_CHAT_FAMILY_QWEN3 ||
                 t->family == IG_CHAT_FAMILY_LLAMA3);
}

int ig_chat_reads(const ig_chat_template *t, const char *name) {
    if (!t || !name)
        return IG_CHAT_READS_NO;
    static const char *const reserved[] = {
        "messages", "tools", "documents", "add_generation_prompt", "bos_token", "eos_token",
        "unk_token", "pad_token", "raise_exception", "strftime_now", "range", "dict", "lipsum",
        "cycler", "joiner", "namespace", NULL};
    for (int i = 0; reserved[i]; i++)
        if (strcmp(name, reserved[i]) == 0)
            return IG_CHAT_READS_RESERVED;
    switch (t->family) {
    case IG_CHAT_FAMILY_QWEN3:
        return strcmp(name, "enable_thinking") == 0 ? IG_CHAT_READS_YES : IG_CHAT_READS_NO;
    case IG_CHAT_FAMILY_LLAMA3:
        if (strcmp(name, "date_string") == 0 || strcmp(name, "tools_in_user_message") == 0)
            return IG_CHAT_READS_YES;
        if (strcmp(name, "custom_tools") == 0)
            return IG_CHAT_READS_UNSUPPORTED;
        return IG_CHAT_READS_NO;
    default:
        return IG_CHAT_READS_NO;
    }
}

/* ------------------------------------------------------------------------------------- output */

typedef struct {
    char *buf;
    size_t len, cap;
    ig_chat_span *spans;
    size_t n, scap;
    int status;                       /* IG_CHAT_OK until out of memory or past the limit */
} out_t;

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q)
        return -1;
    *p = q;
    *cap = c;
    return 0;
}

static void put(out_t *o, const char *s, size_t n, int kind) {
    if (o->status || !n)
        return;
    if (n > IG_CHAT_MAX_OUTPUT - o->len) {
        o->status = IG_CHAT_E_LIMIT;
        return;
    }
    if (grow((void **)&o->buf, &o->cap, o->len + n + 1, 1)) {
        o->status = IG_CHAT_E_MEMORY;
        return;
    }
    memcpy(o->buf + o->len, s, n);
    if (o->n && o->spans[o->n - 1].kind == kind) {
        o->spans[o->n - 1].len += n;
    } else {
        if (grow((void **)&o->spans, &o->scap, o->n + 1, sizeof *o->spans)) {
            o->status = IG_CHAT_E_MEMORY;
            return;
        }
        o->spans[o->n++] = (ig_chat_span){o->len, n, kind};
    }
    o->len += n;
    o->buf[o->len] = 0;
}

/* template markup (a C string literal) and caller text */
#define M(o, lit) put((o), (lit), sizeof(lit) - 1, IG_CHAT_SPAN_MARKUP)
static void markup(out_t *o, const char *s, size_t n) { put(o, s, n, IG_CHAT_SPAN_MARKUP); }
static void text(out_t *o, ig_chat_str s) { put(o, s.s, s.len, IG_CHAT_SPAN_TEXT); }
static void role_markup(out_t *o, int role) {
    markup(o, ROLE_NAMES[role], strlen(ROLE_NAMES[role]));
}

/* ----------------------------------------------------------------- Python string operations */

static ig_chat_str S(const char *s, size_t n) { return (ig_chat_str){s, n}; }

/* A caller's string as the template sees it in ignis: the spellings of the tokenizer's added
 * tokens in it are masked (TextMasker: leftmost-longest, each a private-use character), so Python's
 * string operations neither find nor strip text inside them. ranges: the masked byte ranges,
 * sorted and disjoint. The operations below take a view and a sub-range [a, b) of it. */
typedef struct { size_t a, b; } range_t;
typedef struct {
    ig_chat_str s;
    range_t *r;
    size_t n;
} view_t;

static int view_make(const ig_chat_template *t, ig_chat_str s, view_t *v) {
    v->s = s;
    v->r = NULL;
    v->n = 0;
    size_t cap = 0;
    const unsigned char *u = (const unsigned char *)s.s;
    for (size_t i = 0; t->n_spell && i < s.len;) {
        size_t k = 0;
        for (size_t j = t->by_byte[u[i]]; j < t->by_byte[u[i] + 1]; j++) {
            const ig_chat_str w = t->spell[j];          /* longest first: the first match wins */
            if (w.len <= s.len - i && memcmp(s.s + i, w.s, w.len) == 0) {
                k = w.len;
                break;
            }
        }
        if (!k) {
            i++;
            continue;
        }
        if (grow((void **)&v->r, &cap, v->n + 1, sizeof *v->r))
            return -1;
        v->r[v->n++] = (range_t){i, i + k};
        i += k;
    }
    return 0;
}

/* whether a masked range overlaps [i, j) (i < j) */
static int masked(const view_t *v, size_t i, size_t j) {
    size_t lo = 0, hi = v->n;                /* the first range ending after i */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (v->r[mid].b <= i)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < v->n && v->r[lo].a < j;
}

static int starts(const view_t *v, size_t a, size_t b, const char *lit) {
    size_t n = strlen(lit);
    return b - a >= n && memcmp(v->s.s + a, lit, n) == 0 && !masked(v, a, a + n);
}

static int ends(const view_t *v, size_t a, size_t b, const char *lit) {
    size_t n = strlen(lit);
    return b - a >= n && memcmp(v->s.s + b - n, lit, n) == 0 && !masked(v, b - n, b);
}

/* offset of the first (last = 0) or last (last = 1) unmasked occurrence of lit in [a, b), or -1 */
static long find(const view_t *v, size_t a, size_t b, const char *lit, int last) {
    size_t n = strlen(lit);
    if (b - a < n)
        return -1;
    const char *s = v->s.s;
    if (!last) {
        for (size_t i = a; i + n <= b; i++)
            if (s[i] == lit[0] && memcmp(s + i, lit, n) == 0 && !masked(v, i, i + n))
                return (long)i;
    } else {
        for (size_t i = b - n + 1; i-- > a;)
            if (s[i] == lit[0] && memcmp(s + i, lit, n) == 0 && !masked(v, i, i + n))
                return (long)i;
    }
    return -1;
}

static void lstrip_nl(const view_t *v, size_t *a, size_t b) {
    while (*a < b && v->s.s[*a] == '\n' && !masked(v, *a, *a + 1))
        (*a)++;
}

static void rstrip_nl(const view_t *v, size_t a, size_t *b) {
    while (*b > a && v->s.s[*b - 1] == '\n' && !masked(v, *b - 1, *b))
        (*b)--;
}

static ig_chat_str sub(const view_t *v, size_t a, size_t b) {
    return (ig_chat_str){v->s.s + a, b - a};
}

/* Python's str.isspace() for one code point */
static int py_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
           c == 0x202f || c == 0x205f || c == 0x3000;
}

/* the code point at s[i..] and its length in bytes (0 if the bytes are not UTF-8 there) */
static int utf8_at(const unsigned char *s, size_t n, size_t i, uint32_t *cp) {
    unsigned c = s[i];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    int k = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 0;
    if (!k || i + (size_t)k > n)
        return 0;
    uint32_t v = c & (0x7f >> k);
    for (int j = 1; j < k; j++) {
        if ((s[i + j] & 0xc0) != 0x80)
            return 0;
        v = v << 6 | (s[i + j] & 0x3f);
    }
    *cp = v;
    return k;
}

/* Jinja's trim: Python's str.strip() on [a, b) */
static void py_strip(const view_t *v, size_t *pa, size_t *pb) {
    const unsigned char *u = (const unsigned char *)v->s.s;
    size_t a = *pa, b = *pb;
    uint32_t cp;
    int k;
    while (a < b && (k = utf8_at(u, b, a, &cp)) && py_space(cp) && !masked(v, a, a + (size_t)k))
        a += (size_t)k;
    while (b > a) {           /* the last code point: back over continuation bytes */
        size_t st = b - 1;
        while (st > a && (u[st] & 0xc0) == 0x80 && b - st < 4)
            st--;
        k = utf8_at(u, b, st, &cp);
        if (!k || st + (size_t)k != b || !py_space(cp) || masked(v, st, b))
            break;
        b = st;
    }
    *pa = a;
    *pb = b;
}

/* ---------------------------------------------------------------------------------- JSON out */

/* json.dumps of a str, ensure_ascii=False: the quotes are markup-free text like the string */
static void json_string(out_t *o, ig_chat_str s) {
    static const char hex[] = "0123456789abcdef";
    put(o, "\"", 1, IG_CHAT_SPAN_TEXT);
    size_t run = 0;
    for (size_t i = 0; i < s.len; i++) {
        unsigned char c = (unsigned char)s.s[i];
        const char *esc = NULL;
        char u[7];
        if (c == '"')
            esc = "\\\"";
        else if (c == '\\')
            esc = "\\\\";
        else if (c == '\n')
            esc = "\\n";
        else if (c == '\r')
            esc = "\\r";
        else if (c == '\t')
            esc = "\\t";
        else if (c == '\b')
            esc = "\\b";
        else if (c == '\f')
            esc = "\\f";
        else if (c < 0x20) {
            memcpy(u, "\\u00", 4);
            u[4] = hex[c >> 4];
            u[5] = hex[c & 15];
            u[6] = 0;
            esc = u;
        }
        if (esc) {
            put(o, s.s + run, i - run, IG_CHAT_SPAN_TEXT);
            put(o, esc, strlen(esc), IG_CHAT_SPAN_TEXT);
            run = i + 1;
        }
    }
    put(o, s.s + run, s.len - run, IG_CHAT_SPAN_TEXT);
    put(o, "\"", 1, IG_CHAT_SPAN_TEXT);
}

static void indent_to(out_t *o, int depth, int indent) {
    static const char nl_spaces[] = "\n                                                                ";
    put(o, "\n", 1, IG_CHAT_SPAN_TEXT);
    size_t n = (size_t)depth * (size_t)indent;
    while (n) {
        size_t k = n < sizeof nl_spaces - 2 ? n : sizeof nl_spaces - 2;
        put(o, nl_spaces + 1, k, IG_CHAT_SPAN_TEXT);
        n -= k;
    }
}

/* A JSON text written again as json.dumps writes it: indent 0, separators ", " and ": " on one
 * line; indent > 0, one item per line ("," and ": "), empty containers as "{}" / "[]". Strings and
 * scalars are copied as they are (the caller wrote them in Python's spelling); whitespace between
 * tokens is dropped. A lexical pass, not a parser: it checks brackets and strings balance, which
 * is all re-indenting needs. Returns 0, or -1 when the text is not one balanced JSON value. */
static int json_rewrite(out_t *o, ig_chat_str js, int indent) {
    const char *s = js.s;
    size_t n = js.len, i = 0;
    char stack[IG_CHAT_MAX_DEPTH];
    int depth = 0, values = 0;
    while (i < n) {
        char c = s[i];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
            i++;
            continue;
        }
        if (c == '"') {
            size_t j = i + 1;
            while (j < n && s[j] != '"')
                j += s[j] == '\\' ? 2 : 1;
            if (j >= n)
                return -1;
            put(o, s + i, j + 1 - i, IG_CHAT_SPAN_TEXT);
            i = j + 1;
            if (!depth)
                values++;
            continue;
        }
        if (c == '{' || c == '[') {
            if (depth == IG_CHAT_MAX_DEPTH)
                return -1;
            if (!depth)
                values++;
            char close = c == '{' ? '}' : ']';
            size_t j = i + 1;
            while (j < n && (s[j] == ' ' || s[j] == '\t' || s[j] == '\n' || s[j] == '\r'))
                j++;
            if (j < n && s[j] == close) {           /* empty: "{}" even with an indent */
                char e[2] = {c, close};
                put(o, e, 2, IG_CHAT_SPAN_TEXT);
                i = j + 1;
                continue;
            }
            stack[depth++] = close;
            put(o, &c, 1, IG_CHAT_SPAN_TEXT);
            if (indent)
                indent_to(o, depth, indent);
            i++;
            continue;
        }
        if (c == '}' || c == ']') {
            if (!depth || stack[depth - 1] != c)
                return -1;
            depth--;
            if (indent)
                indent_to(o, depth, indent);
            put(o, &c, 1, IG_CHAT_SPAN_TEXT);
            i++;
            continue;
        }
        if (c == ',') {
            if (!depth)
                return -1;
            if (indent) {
                put(o, ",", 1, IG_CHAT_SPAN_TEXT);
                indent_to(o, depth, indent);
            } else {
                put(o, ", ", 2, IG_CHAT_SPAN_TEXT);
            }
            i++;
            continue;
        }
        if (c == ':') {
            if (!depth)
                return -1;
            put(o, ": ", 2, IG_CHAT_SPAN_TEXT);
            i++;
            continue;
        }
        /* a number, true, false, null (NaN, Infinity as Python writes them) */
        size_t j = i;
        while (j < n && !strchr(" \t\n\r\",:{}[]", s[j]))
            j++;
        if (!depth)
            values++;
        put(o, s + i, j - i, IG_CHAT_SPAN_TEXT);
        i = j;
    }
    return depth == 0 && values == 1 ? 0 : -1;
}

/* `x | tojson` of a tool call's arguments: an object's JSON, or a string quoted */
static int tojson_arguments(out_t *o, const ig_chat_tool_call *c, int indent) {
    if (!c->arguments_is_object) {
        json_string(o, c->arguments);
        return 0;
    }
    return json_rewrite(o, c->arguments, indent);
}

/* ------------------------------------------------------------------------- checked messages */

typedef struct {
    int role;                  /* after developer -> system */
    int has_content;
    ig_chat_str content;       /* the parts joined (in ctx_t.joined) */
    view_t cv, rv;             /* content and reasoning_content as the template sees them */
    const ig_chat_message *m;
} msg_t;

typedef struct {
    const ig_chat_template *t;
    const ig_chat_request *r;
    msg_t *msgs;
    size_t n;
    char *joined;              /* every message's joined parts */
    out_t o;
    char *err;
    size_t errlen;
} ctx_t;

static int str_ok(ig_chat_str s) {
    return s.s || !s.len;
}

/* whether js is one balanced JSON value starting with `first` (json_rewrite's check, dry run) */
static int is_json(ig_chat_str js, char first) {
    size_t i = 0;
    while (i < js.len && (js.s[i] == ' ' || js.s[i] == '\t' || js.s[i] == '\n' || js.s[i] == '\r'))
        i++;
    if (i == js.len || js.s[i] != first)
        return 0;
    out_t scratch = {0};
    int ok = json_rewrite(&scratch, js, 0) == 0 && !scratch.status;
    free(scratch.buf);
    free(scratch.spans);
    return ok;
}

/* The request's fields checked (pointers, counts, roles) and each message's parts joined. */
static int check_request(ctx_t *c) {
    const ig_chat_request *r = c->r;
    if (r->n_messages == 0) {
        set_err(c->err, c->errlen, "the conversation has no messages");
        return IG_CHAT_E_ARG;
    }
    if (r->n_messages > IG_CHAT_MAX_MESSAGES) {
        set_err(c->err, c->errlen, "the conversation has %zu messages; the renderer takes at most %d",
                r->n_messages, IG_CHAT_MAX_MESSAGES);
        return IG_CHAT_E_LIMIT;
    }
    if (!r->messages) {
        set_err(c->err, c->errlen, "messages is NULL");
        return IG_CHAT_E_ARG;
    }
    if (r->n_tools > IG_CHAT_MAX_TOOLS) {
        set_err(c->err, c->errlen, "%zu tools; the renderer takes at most %d", r->n_tools,
                IG_CHAT_MAX_TOOLS);
        return IG_CHAT_E_LIMIT;
    }
    if (r->n_tools && !r->tools) {
        set_err(c->err, c->errlen, "tools is NULL with n_tools %zu", r->n_tools);
        return IG_CHAT_E_ARG;
    }
    for (size_t i = 0; i < r->n_tools; i++) {
        if (!str_ok(r->tools[i])) {
            set_err(c->err, c->errlen, "tools[%zu] is NULL", i);
            return IG_CHAT_E_ARG;
        }
        if (!is_json(r->tools[i], '{')) {
            set_err(c->err, c->errlen, "tools[%zu] is not the JSON text of one object", i);
            return IG_CHAT_E_ARG;
        }
    }
    if (r->has_date_string && !str_ok(r->date_string)) {
        set_err(c->err, c->errlen, "date_string is NULL");
        return IG_CHAT_E_ARG;
    }
    size_t total = 0;
    for (size_t i = 0; i < r->n_messages; i++) {
        const ig_chat_message *m = &r->messages[i];
        if (m->role < 0 || m->role >= IG_CHAT_ROLE_COUNT) {
            set_err(c->err, c->errlen, "message %zu has role %d, not an ig_chat_role", i, m->role);
            return IG_CHAT_E_ARG;
        }
        if (m->n_content > IG_CHAT_MAX_PARTS || m->n_tool_calls > IG_CHAT_MAX_CALLS) {
            set_err(c->err, c->errlen, "message %zu has %zu content parts and %zu tool calls; the "
                    "renderer takes at most %d and %d", i, m->n_content, m->n_tool_calls,
                    IG_CHAT_MAX_PARTS, IG_CHAT_MAX_CALLS);
            return IG_CHAT_E_LIMIT;
        }
        if ((m->n_content && !m->content) || (m->n_tool_calls && !m->tool_calls) ||
            !str_ok(m->reasoning_content) || !str_ok(m->name) || !str_ok(m->tool_call_id)) {
            set_err(c->err, c->errlen, "message %zu has a NULL pointer with a nonzero length", i);
            return IG_CHAT_E_ARG;
        }
        if (!m->has_content && m->n_content) {
            set_err(c->err, c->errlen, "message %zu has content parts but has_content 0", i);
            return IG_CHAT_E_ARG;
        }
        /* check_messages: content is required, except an assistant's that has tool calls */
        if (!m->has_content && !(m->role == IG_CHAT_ASSISTANT && m->has_tool_calls &&
                                 m->n_tool_calls)) {
            set_err(c->err, c->errlen, "message %zu (%s) has no content", i, ROLE_NAMES[m->role]);
            return IG_CHAT_E_REFUSED;
        }
        for (size_t k = 0; k < m->n_content; k++) {
            if (!str_ok(m->content[k])) {
                set_err(c->err, c->errlen, "message %zu content part %zu is NULL", i, k);
                return IG_CHAT_E_ARG;
            }
            if (m->content[k].len > IG_CHAT_MAX_OUTPUT - total) {
                set_err(c->err, c->errlen, "the conversation's text is over %zu bytes",
                        (size_t)IG_CHAT_MAX_OUTPUT);
                return IG_CHAT_E_LIMIT;
            }
            total += m->content[k].len;
        }
        for (size_t k = 0; k < m->n_tool_calls; k++) {
            const ig_chat_tool_call *tc = &m->tool_calls[k];
            if (!str_ok(tc->name) || !str_ok(tc->arguments)) {
                set_err(c->err, c->errlen, "message %zu tool call %zu has a NULL string", i, k);
                return IG_CHAT_E_ARG;
            }
            if (tc->arguments_is_object && !is_json(tc->arguments, '{')) {
                set_err(c->err, c->errlen, "message %zu tool call %zu: arguments_is_object is set "
                        "but the arguments are not the JSON text of one object", i, k);
                return IG_CHAT_E_ARG;
            }
        }
    }
    c->msgs = calloc(r->n_messages, sizeof *c->msgs);
    c->joined = malloc(total + 1);
    if (!c->msgs || !c->joined) {
        set_err(c->err, c->errlen, "out of memory");
        return IG_CHAT_E_MEMORY;
    }
    size_t at = 0;
    for (size_t i = 0; i < r->n_messages; i++) {
        const ig_chat_message *m = &r->messages[i];
        msg_t *x = &c->msgs[i];
        x->m = m;
        x->role = m->role;
        if (m->role == IG_CHAT_DEVELOPER && (c->t->flags & FLAG_DEVELOPER_AS_SYSTEM))
            x->role = IG_CHAT_SYSTEM;
        x->has_content = m->has_content;
        x->content = S(c->joined + at, 0);
        for (size_t k = 0; k < m->n_content; k++) {
            if (m->content[k].len)
                memcpy(c->joined + at, m->content[k].s, m->content[k].len);
            at += m->content[k].len;
            x->content.len += m->content[k].len;
        }
        c->n = i + 1;                  /* the views made so far are freed */
        if (view_make(c->t, x->content, &x->cv) ||
            view_make(c->t, m->has_reasoning_content ? m->reasoning_content : S("", 0), &x->rv)) {
            set_err(c->err, c->errlen, "out of memory");
            return IG_CHAT_E_MEMORY;
        }
    }
    return IG_CHAT_OK;
}

static int refuse(ctx_t *c, const char *why) {
    set_err(c->err, c->errlen, "the chat template refused the conversation: %s", why);
    return IG_CHAT_E_REFUSED;
}

static int bad_arguments(ctx_t *c, size_t i) {
    set_err(c->err, c->errlen, "message %zu: a tool call's arguments are not one JSON value", i);
    return IG_CHAT_E_ARG;
}

/* --------------------------------------------------------------------------------- Qwen 2.5 */

static void qwen25_tools(ctx_t *c) {
    out_t *o = &c->o;
    for (size_t i = 0; i < c->r->n_tools; i++) {
        M(o, "\n");                                            /* {{- "\n" }}               */
        (void)json_rewrite(o, c->r->tools[i], 0);              /* {{- tool | tojson }}      */
    }
}

static int render_qwen25(ctx_t *c) {
    out_t *o = &c->o;
    const ig_chat_template *t = c->t;
    msg_t *ms = c->msgs;
    int tools = c->r->has_tools && c->r->n_tools;                       /* {%- if tools %} */
    if (tools) {
        M(o, "<|im_start|>system\n");
        if (ms[0].role == IG_CHAT_SYSTEM)
            text(o, ms[0].content);
        else
            markup(o, t->default_system, t->default_system_len);
        M(o, "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
             "You are provided with function signatures within <tools></tools> XML tags:\n<tools>");
        qwen25_tools(c);
        M(o, "\n</tools>\n\nFor each function call, return a json object with function name and "
             "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
             "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n");
    } else if (ms[0].role == IG_CHAT_SYSTEM) {
        M(o, "<|im_start|>system\n");
        text(o, ms[0].content);
        M(o, "<|im_end|>\n");
    } else {
        M(o, "<|im_start|>system\n");
        markup(o, t->default_system, t->default_system_len);
        M(o, "<|im_end|>\n");
    }
    for (size_t i = 0; i < c->n; i++) {
        const msg_t *x = &ms[i];
        const ig_chat_message *m = x->m;
        int calls = m->has_tool_calls && m->n_tool_calls;
        if (x->role == IG_CHAT_USER || (x->role == IG_CHAT_SYSTEM && i) ||
            (x->role == IG_CHAT_ASSISTANT && !calls)) {
            M(o, "<|im_start|>");
            role_markup(o, x->role);
            M(o, "\n");
            text(o, x->content);
            M(o, "<|im_end|>\n");
        } else if (x->role == IG_CHAT_ASSISTANT) {
            M(o, "<|im_start|>assistant");
            if (x->has_content && x->content.len) {                 /* {%- if message.content %} */
                M(o, "\n");
                text(o, x->content);
            }
            for (size_t k = 0; k < m->n_tool_calls; k++) {
                M(o, "\n<tool_call>\n{\"name\": \"");
                text(o, m->tool_calls[k].name);
                M(o, "\", \"arguments\": ");
                if (tojson_arguments(o, &m->tool_calls[k], 0))
                    return bad_arguments(c, i);
                M(o, "}\n</tool_call>");
            }
            M(o, "<|im_end|>\n");
        } else if (x->role == IG_CHAT_TOOL) {
            if (i == 0 || ms[i - 1].role != IG_CHAT_TOOL)
                M(o, "<|im_start|>user");
            M(o, "\n<tool_response>\n");
            text(o, x->content);
            M(o, "\n</tool_response>");
            if (i + 1 == c->n || ms[i + 1].role != IG_CHAT_TOOL)
                M(o, "<|im_end|>\n");
        }
    }
    if (c->r->add_generation_prompt)
        M(o, "<|im_start|>assistant\n");
    return IG_CHAT_OK;
}

/* -------------------------------------------------------------- ChatML + default system */

static int render_chatml(ctx_t *c) {
    out_t *o = &c->o;
    for (size_t i = 0; i < c->n; i++) {
        const msg_t *x = &c->msgs[i];
        if (i == 0 && c->msgs[0].role != IG_CHAT_SYSTEM) {
            M(o, "<|im_start|>system\n");
            markup(o, c->t->default_system, c->t->default_system_len);
            M(o, "<|im_end|>\n");
        }
        if (!x->has_content)           /* '...' + message['content'] with no content */
            return refuse(c, "'dict object' has no attribute 'content'");
        M(o, "<|im_start|>");
        role_markup(o, x->role);
        M(o, "\n");
        text(o, x->content);
        M(o, "<|im_end|>\n");
    }
    if (c->r->add_generation_prompt)
        M(o, "<|im_start|>assistant\n");
    return IG_CHAT_OK;
}

/* ------------------------------------------------------------------------------------ Qwen3 */

static int render_qwen3(ctx_t *c) {
    out_t *o = &c->o;
    msg_t *ms = c->msgs;
    size_t n = c->n;
    if (c->r->has_tools && c->r->n_tools) {
        M(o, "<|im_start|>system\n");
        if (ms[0].role == IG_CHAT_SYSTEM) {
            text(o, ms[0].content);
            M(o, "\n\n");
        }
        M(o, "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
             "You are provided with function signatures within <tools></tools> XML tags:\n<tools>");
        qwen25_tools(c);
        M(o, "\n</tools>\n\nFor each function call, return a json object with function name and "
             "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
             "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n");
    } else if (ms[0].role == IG_CHAT_SYSTEM) {
        M(o, "<|im_start|>system\n");
        text(o, ms[0].content);
        M(o, "<|im_end|>\n");
    }
    /* the last user query: the latest user message that is not a wrapped tool response */
    size_t last_query = n - 1;
    for (size_t k = n; k-- > 0;) {
        const msg_t *x = &ms[k];
        size_t len = x->content.len;
        if (x->role == IG_CHAT_USER && x->has_content &&
            !(starts(&x->cv, 0, len, "<tool_response>") && ends(&x->cv, 0, len, "</tool_response>"))) {
            last_query = k;
            break;
        }
    }
    for (size_t i = 0; i < n; i++) {
        const msg_t *x = &ms[i];
        const ig_chat_message *m = x->m;
        /* content: [ca, cb) of the message's content ('' when it has none) */
        const view_t *cv = &x->cv;
        size_t ca = 0, cb = x->content.len;
        if (x->role == IG_CHAT_USER || (x->role == IG_CHAT_SYSTEM && i)) {
            M(o, "<|im_start|>");
            role_markup(o, x->role);
            M(o, "\n");
            text(o, x->content);
            M(o, "<|im_end|>\n");
        } else if (x->role == IG_CHAT_ASSISTANT) {
            const view_t *rv = &x->rv;             /* reasoning: [ra, rb) of rv or of cv */
            size_t ra = 0, rb = 0;
            if (m->has_reasoning_content) {
                rb = m->reasoning_content.len;
            } else if (find(cv, ca, cb, "</think>", 0) >= 0) {
                /* content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') */
                rv = cv;
                ra = 0;
                rb = (size_t)find(cv, ca, cb, "</think>", 0);
                rstrip_nl(cv, ra, &rb);
                long open = find(cv, ra, rb, "<think>", 1);
                if (open >= 0)
                    ra = (size_t)open + 7;
                lstrip_nl(cv, &ra, rb);
                /* content.split('</think>')[-1].lstrip('\n') */
                ca = (size_t)find(cv, ca, cb, "</think>", 1) + 8;
                lstrip_nl(cv, &ca, cb);
            }
            if (i > last_query && (i + 1 == n || rb > ra)) {
                M(o, "<|im_start|>assistant\n<think>\n");
                lstrip_nl(rv, &ra, rb);                     /* reasoning_content.strip('\n') */
                rstrip_nl(rv, ra, &rb);
                text(o, sub(rv, ra, rb));
                M(o, "\n</think>\n\n");
                size_t la = ca;                             /* content.lstrip('\n') */
                lstrip_nl(cv, &la, cb);
                text(o, sub(cv, la, cb));
            } else {
                M(o, "<|im_start|>assistant\n");
                text(o, sub(cv, ca, cb));
            }
            if (m->has_tool_calls) {
                for (size_t k = 0; k < m->n_tool_calls; k++) {
                    if ((k == 0 && cb > ca) || k)
                        M(o, "\n");
                    M(o, "<tool_call>\n{\"name\": \"");
                    text(o, m->tool_calls[k].name);
                    M(o, "\", \"arguments\": ");
                    if (m->tool_calls[k].arguments_is_object) {
                        if (json_rewrite(o, m->tool_calls[k].arguments, 0))
                            return bad_arguments(c, i);
                    } else {
                        text(o, m->tool_calls[k].arguments);   /* a string is printed as it is */
                    }
                    M(o, "}\n</tool_call>");
                }
            }
            M(o, "<|im_end|>\n");
        } else if (x->role == IG_CHAT_TOOL) {
            if (i == 0 || ms[i - 1].role != IG_CHAT_TOOL)
                M(o, "<|im_start|>user");
            M(o, "\n<tool_response>\n");
            text(o, x->content);
            M(o, "\n</tool_response>");
            if (i + 1 == n || ms[i + 1].role != IG_CHAT_TOOL)
                M(o, "<|im_end|>\n");
        }
    }
    if (c->r->add_generation_prompt) {
        M(o, "<|im_start|>assistant\n");
        if (c->r->enable_thinking == IG_CHAT_FALSE)
            M(o, "<think>\n\n</think>\n\n");
    }
    return IG_CHAT_OK;
}

/* ---------------------------------------------------------------------------------- Llama 3.2 */

/* strftime_now("%d %b %Y") in the C locale's month names, from local time as datetime.now() */
static void today(char out[32]) {
    static const char *const mon[12] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                        "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    time_t now = time(NULL);
    struct tm tm;
    if (!localtime_r(&now, &tm)) {
        memset(&tm, 0, sizeof tm);
        tm.tm_mday = 1;
        tm.tm_year = 70;
    }
    snprintf(out, 32, "%02d %s %04d", tm.tm_mday, mon[tm.tm_mon % 12], tm.tm_year + 1900);
}

/* message['content'] | trim (an absent content is Undefined, which trims to "") */
static ig_chat_str trimmed(const msg_t *x) {
    size_t a = 0, b = x->content.len;
    py_strip(&x->cv, &a, &b);
    return sub(&x->cv, a, b);
}

static void llama_tool_list(ctx_t *c) {
    for (size_t i = 0; i < c->r->n_tools; i++) {
        (void)json_rewrite(&c->o, c->r->tools[i], 4);          /* {{- t | tojson(indent=4) }} */
        M(&c->o, "\n\n");
    }
}

static int render_llama3(ctx_t *c) {
    out_t *o = &c->o;
    const ig_chat_request *r = c->r;
    markup(o, c->t->bos, c->t->bos_len);                                 /* {{- bos_token }} */
    int in_user = r->tools_in_user_message != IG_CHAT_FALSE;             /* default true */
    int tools = r->has_tools;                                            /* tools is not none */
    msg_t *ms = c->msgs;
    size_t n = c->n, first = 0;
    ig_chat_str system = S("", 0);
    if (ms[0].role == IG_CHAT_SYSTEM) {
        system = trimmed(&ms[0]);
        first = 1;
    }
    M(o, "<|start_header_id|>system<|end_header_id|>\n\n");
    if (tools)
        M(o, "Environment: ipython\n");
    M(o, "Cutting Knowledge Date: December 2023\nToday Date: ");
    if (r->has_date_string) {
        text(o, r->date_string);
    } else {
        char d[32];
        today(d);
        markup(o, d, strlen(d));
    }
    M(o, "\n\n");
    if (tools && !in_user) {
        M(o, "You have access to the following functions. To call a function, please respond "
             "with JSON for a function call.Respond in the format {\"name\": function name, "
             "\"parameters\": dictionary of argument name and its value}.Do not use variables.\n\n");
        llama_tool_list(c);
    }
    text(o, system);
    M(o, "<|eot_id|>");
    if (in_user && tools) {
        if (first == n)
            return refuse(c, "Cannot put tools in the first user message when there's no first "
                             "user message!");
        /* messages[0]['content']|trim: an absent content is Undefined, which trims to "" */
        ig_chat_str u = trimmed(&ms[first]);
        first++;
        M(o, "<|start_header_id|>user<|end_header_id|>\n\n");
        M(o, "Given the following functions, please respond with a JSON for a function call with "
             "its proper arguments that best answers the given prompt.\n\nRespond in the format "
             "{\"name\": function name, \"parameters\": dictionary of argument name and its "
             "value}.Do not use variables.\n\n");
        llama_tool_list(c);
        text(o, u);
        M(o, "<|eot_id|>");
    }
    for (size_t i = first; i < n; i++) {
        const msg_t *x = &ms[i];
        const ig_chat_message *m = x->m;
        if (!(x->role == IG_CHAT_TOOL || m->has_tool_calls)) {
            M(o, "<|start_header_id|>");
            role_markup(o, x->role);
            M(o, "<|end_header_id|>\n\n");
            text(o, trimmed(x));
            M(o, "<|eot_id|>");
        } else if (m->has_tool_calls) {
            if (m->n_tool_calls != 1)
                return refuse(c, "This model only supports single tool-calls at once!");
            const ig_chat_tool_call *call = &m->tool_calls[0];
            M(o, "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"");
            text(o, call->name);
            M(o, "\", \"parameters\": ");
            if (tojson_arguments(o, call, 0))
                return bad_arguments(c, i);
            M(o, "}<|eot_id|>");
        } else {
            M(o, "<|start_header_id|>ipython<|end_header_id|>\n\n");
            json_string(o, x->content);      /* a string is iterable: message.content | tojson */
            M(o, "<|eot_id|>");
        }
    }
    if (r->add_generation_prompt)
        M(o, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    return IG_CHAT_OK;
}

/* ------------------------------------------------------------------------------------ render */

void ig_chat_output_free(ig_chat_output *out) {
    if (!out)
        return;
    free(out->text);
    free(out->spans);
    memset(out, 0, sizeof *out);
}

int ig_chat_render(const ig_chat_template *t, const ig_chat_request *req, ig_chat_output *out,
                   char *err, size_t errlen) {
    if (err && errlen)
        err[0] = 0;
    if (out)
        memset(out, 0, sizeof *out);
    if (!t || !req || !out) {
        set_err(err, errlen, "ig_chat_render: %s is NULL", !t ? "the template" : !req ?
                "the request" : "the output");
        return IG_CHAT_E_ARG;
    }
    if (t->family == IG_CHAT_FAMILY_NONE) {
        set_err(err, errlen, "this model has no chat template (its tokenizer defines none: a base "
                "model); send the text as a completion instead of chat messages");
        return IG_CHAT_E_NO_TEMPLATE;
    }
    ctx_t c = {.t = t, .r = req, .err = err, .errlen = errlen};
    int st = check_request(&c);
    if (st == IG_CHAT_OK) {
        switch (t->family) {
        case IG_CHAT_FAMILY_QWEN25: st = render_qwen25(&c); break;
        case IG_CHAT_FAMILY_CHATML: st = render_chatml(&c); break;
        case IG_CHAT_FAMILY_QWEN3: st = render_qwen3(&c); break;
        case IG_CHAT_FAMILY_LLAMA3: st = render_llama3(&c); break;
        default:
            set_err(err, errlen, "unknown chat template family %d", t->family);
            st = IG_CHAT_E_SECTION;
        }
    }
    if (st == IG_CHAT_OK && c.o.status) {
        st = c.o.status;
        set_err(err, errlen, st == IG_CHAT_E_LIMIT ? "the rendered prompt is over %zu bytes"
                : "out of memory rendering the prompt (%zu bytes)", c.o.len);
    }
    if (st == IG_CHAT_OK && !c.o.buf) {             /* an empty render: still a valid string */
        c.o.buf = calloc(1, 1);
        if (!c.o.buf) {
            set_err(err, errlen, "out of memory");
            st = IG_CHAT_E_MEMORY;
        }
    }
    for (size_t i = 0; i < c.n; i++) {
        free(c.msgs[i].cv.r);
        free(c.msgs[i].rv.r);
    }
    free(c.msgs);
    free(c.joined);
    if (st != IG_CHAT_OK) {
        free(c.o.buf);
        free(c.o.spans);
        return st;
    }
    out->text = c.o.buf;
    out->len = c.o.len;
    out->spans = c.o.spans;
    out->n_spans = c.o.n;
    return IG_CHAT_OK;
}

/* --------------------------------------------------------------------------- from parsed JSON */

typedef struct {
    ig_chat_message *msgs;
    ig_chat_str *parts;         /* every message's content parts, one array */
    ig_chat_tool_call *calls;
    ig_chat_str *tools;
    char **owned;               /* texts written here (arguments, tools) */
    size_t n_owned;
} json_fill_t;

static void json_fill_free(json_fill_t *f) {
    for (size_t i = 0; i < f->n_owned; i++)
        free(f->owned[i]);
    free(f->owned);
    free(f->msgs);
    free(f->parts);
    free(f->calls);
    free(f->tools);
}

static int jstr(const ig_json *v, ig_chat_str *out) {
    if (!v || v->type != IG_JSON_STRING)
        return -1;
    *out = (ig_chat_str){v->u.str.s, v->u.str.len};
    return 0;
}

static const ig_json *member(const ig_json *obj, const char *key) {
    const ig_json *v = ig_json_get(obj, key);
    return v && v->type == IG_JSON_NULL ? NULL : v;      /* null is absent (check_messages) */
}

/* a written text kept until the render ends; -1 out of memory */
static int own(json_fill_t *f, ig_jw *w, ig_chat_str *out) {
    char *text = ig_jw_take(w);
    if (!text)
        return -1;
    f->owned[f->n_owned++] = text;
    *out = (ig_chat_str){text, strlen(text)};
    return 0;
}

/* Python's truthiness of a JSON value */
static int truthy(const ig_json *v) {
    switch (v->type) {
    case IG_JSON_NULL: case IG_JSON_FALSE: return 0;
    case IG_JSON_TRUE: return 1;
    case IG_JSON_NUMBER: return v->u.num.d != 0.0;
    case IG_JSON_STRING: return v->u.str.len != 0;
    case IG_JSON_ARRAY: return v->u.arr.n != 0;
    default: return v->u.obj.n != 0;
    }
}

int ig_chat_render_json(const ig_chat_template *t, const struct ig_json *messages,
                        const struct ig_json *tools, const struct ig_json *kwargs,
                        int add_generation_prompt, ig_chat_output *out, char *err, size_t errlen) {
    if (out)
        memset(out, 0, sizeof *out);
    if (!t || !messages || !out) {
        set_err(err, errlen, "ig_chat_render_json: %s is NULL", !t ? "the template" : !messages ?
                "messages" : "the output");
        return IG_CHAT_E_ARG;
    }
    if (messages->type != IG_JSON_ARRAY || (tools && tools->type != IG_JSON_ARRAY) ||
        (kwargs && kwargs->type != IG_JSON_OBJECT)) {
        set_err(err, errlen, "messages and tools must be arrays, chat_template_kwargs an object");
        return IG_CHAT_E_ARG;
    }
    size_t n = messages->u.arr.n, n_parts = 0, n_calls = 0, n_tools = tools ? tools->u.arr.n : 0;
    if (n > IG_CHAT_MAX_MESSAGES || n_tools > IG_CHAT_MAX_TOOLS) {
        set_err(err, errlen, "%zu messages and %zu tools; the renderer takes at most %d and %d", n,
                n_tools, IG_CHAT_MAX_MESSAGES, IG_CHAT_MAX_TOOLS);
        return IG_CHAT_E_LIMIT;
    }
    for (size_t i = 0; i < n; i++) {
        const ig_json *m = messages->u.arr.items[i];
        const ig_json *c = m->type == IG_JSON_OBJECT ? member(m, "content") : NULL;
        const ig_json *tc = m->type == IG_JSON_OBJECT ? member(m, "tool_calls") : NULL;
        n_parts += c && c->type == IG_JSON_ARRAY ? c->u.arr.n : 1;
        n_calls += tc && tc->type == IG_JSON_ARRAY ? tc->u.arr.n : 0;
    }
    json_fill_t f = {0};
    f.msgs = calloc(n ? n : 1, sizeof *f.msgs);
    f.parts = calloc(n_parts ? n_parts : 1, sizeof *f.parts);
    f.calls = calloc(n_calls ? n_calls : 1, sizeof *f.calls);
    f.tools = calloc(n_tools ? n_tools : 1, sizeof *f.tools);
    f.owned = calloc(n_calls + n_tools + 1, sizeof *f.owned);
    int st = IG_CHAT_OK;
    if (!f.msgs || !f.parts || !f.calls || !f.tools || !f.owned) {
        set_err(err, errlen, "out of memory");
        json_fill_free(&f);
        return IG_CHAT_E_MEMORY;
    }
    size_t at_part = 0, at_call = 0;
    for (size_t i = 0; i < n && st == IG_CHAT_OK; i++) {
        const ig_json *m = messages->u.arr.items[i];
        ig_chat_message *x = &f.msgs[i];
        ig_chat_str role;
        if (m->type != IG_JSON_OBJECT || jstr(member(m, "role"), &role)) {
            set_err(err, errlen, "messages[%zu] must be an object with a role", i);
            st = IG_CHAT_E_ARG;
            break;
        }
        x->role = -1;
        for (int r = 0; r < IG_CHAT_ROLE_COUNT; r++)
            if (role.len == strlen(ROLE_NAMES[r]) && memcmp(role.s, ROLE_NAMES[r], role.len) == 0)
                x->role = r;
        const ig_json *c = member(m, "content");
        x->content = f.parts + at_part;
        if (c && c->type == IG_JSON_STRING) {
            f.parts[at_part++] = (ig_chat_str){c->u.str.s, c->u.str.len};
            x->n_content = 1;
        } else if (c && c->type == IG_JSON_ARRAY) {
            for (size_t k = 0; k < c->u.arr.n; k++)
                if (jstr(member(c->u.arr.items[k], "text"), &f.parts[at_part++])) {
                    set_err(err, errlen, "messages[%zu].content[%zu] is not a text part", i, k);
                    st = IG_CHAT_E_ARG;
                }
            x->n_content = c->u.arr.n;
        } else if (c) {
            set_err(err, errlen, "messages[%zu].content must be a string or a list of text parts", i);
            st = IG_CHAT_E_ARG;
        }
        x->has_content = c != NULL;
        const ig_json *v;
        if ((v = member(m, "reasoning_content")) && !jstr(v, &x->reasoning_content))
            x->has_reasoning_content = 1;
        if ((v = member(m, "name")))
            (void)jstr(v, &x->name);
        if ((v = member(m, "tool_call_id")))
            (void)jstr(v, &x->tool_call_id);
        const ig_json *tc = member(m, "tool_calls");
        if (tc && tc->type != IG_JSON_ARRAY) {
            set_err(err, errlen, "messages[%zu].tool_calls must be a list", i);
            st = IG_CHAT_E_ARG;
        } else if (tc) {
            x->tool_calls = f.calls + at_call;
            x->n_tool_calls = tc->u.arr.n;
            x->has_tool_calls = 1;
            for (size_t k = 0; k < tc->u.arr.n && st == IG_CHAT_OK; k++) {
                ig_chat_tool_call *call = &f.calls[at_call++];
                const ig_json *fn = member(tc->u.arr.items[k], "function");
                if (jstr(member(fn, "name"), &call->name) ||
                    jstr(member(fn, "arguments"), &call->arguments)) {
                    set_err(err, errlen, "messages[%zu].tool_calls[%zu].function needs string name "
                            "and arguments", i, k);
                    st = IG_CHAT_E_ARG;
                    break;
                }
                /* arguments that read as a JSON object reach the template as that object */
                ig_json_error je;
                ig_json_doc *doc = ig_json_parse(call->arguments.s, call->arguments.len, NULL, &je);
                if (doc && ig_json_root(doc)->type == IG_JSON_OBJECT) {
                    ig_jw w;
                    ig_jw_init(&w, IG_JW_SPACED);
                    ig_jw_value(&w, ig_json_root(doc));
                    if (w.failed || own(&f, &w, &call->arguments)) {
                        ig_jw_free(&w);
                        set_err(err, errlen, "out of memory");
                        st = IG_CHAT_E_MEMORY;
                    }
                    call->arguments_is_object = 1;
                }
                ig_json_free(doc);
            }
        }
    }
    for (size_t i = 0; i < n_tools && st == IG_CHAT_OK; i++) {
        /* check_tools' rebuilt object: type, then the function's known fields in order */
        static const char *const fields[] = {"name", "description", "parameters", "strict"};
        const ig_json *fn = member(tools->u.arr.items[i], "function");
        if (!fn || fn->type != IG_JSON_OBJECT) {
            set_err(err, errlen, "tools[%zu].function must be an object", i);
            st = IG_CHAT_E_ARG;
            break;
        }
        ig_jw w;
        ig_jw_init(&w, IG_JW_SPACED);
        ig_jw_begin_object(&w);
        ig_jw_key(&w, "type", 4);
        ig_jw_cstr(&w, "function");
        ig_jw_key(&w, "function", 8);
        ig_jw_begin_object(&w);
        for (int k = 0; k < 4; k++) {
            const ig_json *v = member(fn, fields[k]);
            if (v) {
                ig_jw_key(&w, fields[k], strlen(fields[k]));
                ig_jw_value(&w, v);
            }
        }
        ig_jw_end_object(&w);
        ig_jw_end_object(&w);
        if (w.failed || own(&f, &w, &f.tools[i])) {
            ig_jw_free(&w);
            set_err(err, errlen, "out of memory writing tools[%zu]", i);
            st = IG_CHAT_E_MEMORY;
        }
    }
    ig_chat_request req = {.messages = f.msgs, .n_messages = n, .tools = f.tools,
                           .n_tools = n_tools, .has_tools = tools && n_tools,
                           .add_generation_prompt = add_generation_prompt,
                           .enable_thinking = IG_CHAT_UNSET, .tools_in_user_message = IG_CHAT_UNSET};
    for (size_t i = 0; kwargs && i < kwargs->u.obj.n && st == IG_CHAT_OK; i++) {
        const ig_json_member *kv = &kwargs->u.obj.members[i];
        const ig_json *v = kv->value;
        /* a key holding a NUL names no variable a template reads */
        int reads = strlen(kv->key) == kv->key_len ? ig_chat_reads(t, kv->key) : IG_CHAT_READS_NO;
        if (reads == IG_CHAT_READS_NO)
            continue;
        if (reads != IG_CHAT_READS_YES) {
            set_err(err, errlen, "chat_template_kwargs.%s is %s", kv->key,
                    reads == IG_CHAT_READS_RESERVED ? "the renderer's own variable" :
                    "read by this template but not by the native library's renderer");
            st = IG_CHAT_E_ARG;
        } else if (strcmp(kv->key, "enable_thinking") == 0) {
            req.enable_thinking = v->type == IG_JSON_FALSE ? IG_CHAT_FALSE :
                                  v->type == IG_JSON_TRUE ? IG_CHAT_TRUE : IG_CHAT_OTHER;
        } else if (strcmp(kv->key, "tools_in_user_message") == 0) {
            req.tools_in_user_message = truthy(v) ? IG_CHAT_TRUE : IG_CHAT_FALSE;
        } else if (strcmp(kv->key, "date_string") == 0) {
            if (jstr(v, &req.date_string)) {
                set_err(err, errlen, "the chat template failed on this conversation: TypeError: "
                        "date_string must be a string");
                st = IG_CHAT_E_REFUSED;
            }
            req.has_date_string = 1;
        }
    }
    if (st == IG_CHAT_OK)
        st = ig_chat_render(t, &req, out, err, errlen);
    json_fill_free(&f);
    return st;
}
