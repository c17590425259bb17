/* answer.c — a chat answer read as reasoning, content and tool calls (answer.h), statement by
 * statement as ignis/generate/reasoning.py, ignis/generate/tools.py (ToolCallParser with
 * live=False) and ignis/api/client.py _Answer read it. Text is UTF-8; the markers are ASCII, so
 * byte positions stand for Python's character positions wherever a marker is looked for. */
#include "answer.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "sampler.h"

#define ANSWER_PARSE_DEPTH 990        /* about where json.loads gives up (RecursionError) */

/* ---- text ----------------------------------------------------------------------------------- */

typedef struct {
    char *p;
    size_t n, cap;
} str;

static int put(str *s, const char *t, size_t n) {
    if (s->n + n + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 64;
        while (cap < s->n + n + 1) cap *= 2;
        char *q = realloc(s->p, cap);
        if (!q) return -1;
        s->p = q, s->cap = cap;
    }
    if (n) memcpy(s->p + s->n, t, n);
    s->n += n;
    s->p[s->n] = 0;
    return 0;
}
static void clear(str *s) {
    s->n = 0;
    if (s->p) s->p[0] = 0;
}
/* drop the first n bytes */
static void drop(str *s, size_t n) {
    memmove(s->p, s->p + n, s->n - n);
    s->n -= n;
    s->p[s->n] = 0;
}

static int ws4(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }   /* " \t\r\n" */

static size_t lstrip4(const char *s, size_t n) {
    size_t i = 0;
    while (i < n && ws4(s[i])) i++;
    return i;
}
static size_t rstrip4(const char *s, size_t n) {      /* the length without trailing space */
    while (n && ws4(s[n - 1])) n--;
    return n;
}

static int starts(const char *s, size_t n, const char *p) {
    const size_t k = strlen(p);
    return n >= k && memcmp(s, p, k) == 0;
}

static long find(const char *s, size_t n, const char *p) {
    const size_t k = strlen(p);
    for (size_t i = 0; i + k <= n; i++)
        if (memcmp(s + i, p, k) == 0) return (long)i;
    return -1;
}

/* markers.partial_suffix for one ASCII marker: the longest end of s shorter than the marker that
 * begins it */
static size_t partial_suffix(const char *s, size_t n, const char *marker) {
    const size_t k = strlen(marker);
    for (size_t m = k - 1 < n ? k - 1 : n; m > 0; m--)
        if (memcmp(s + n - m, marker, m) == 0) return m;
    return 0;
}

/* one code point at s (n > 0), its byte length in *len */
static uint32_t cp_at(const char *s, size_t n, size_t *len) {
    const unsigned char *u = (const unsigned char *)s;
    size_t k = u[0] < 0x80 ? 1 : u[0] < 0xE0 ? 2 : u[0] < 0xF0 ? 3 : 4;
    if (k > n) k = n;
    *len = k;
    if (k == 1) return u[0];
    if (k == 2) return (uint32_t)(u[0] & 0x1F) << 6 | (u[1] & 0x3F);
    if (k == 3) return (uint32_t)(u[0] & 0x0F) << 12 | (uint32_t)(u[1] & 0x3F) << 6 | (u[2] & 0x3F);
    return (uint32_t)(u[0] & 0x07) << 18 | (uint32_t)(u[1] & 0x3F) << 12 | (uint32_t)(u[2] & 0x3F) << 6 | (u[3] & 0x3F);
}

/* str.isspace (what Python's \s and str.strip() take for whitespace); api.c's checks use it too */
int ig_py_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

static size_t skip_py_space(const char *s, size_t n, size_t i) {
    while (i < n) {
        size_t l;
        if (!ig_py_space(cp_at(s + i, n - i, &l))) break;
        i += l;
    }
    return i;
}

/* where s[from..to) ends without its trailing whitespace (str.rstrip()), never before `from` */
static size_t rstrip_py(const char *s, size_t from, size_t to) {
    while (to > from) {
        size_t back = 1;          /* the last character's first byte */
        while (back < to - from && ((unsigned char)s[to - back] & 0xC0) == 0x80) back++;
        size_t l;
        if (!ig_py_space(cp_at(s + to - back, back, &l))) break;
        to -= back;
    }
    return to;
}

/* ---- deltas --------------------------------------------------------------------------------- */

void ig_deltas_clear(ig_deltas *ds) {
    for (size_t i = 0; i < ds->n; i++) free(ds->d[i].text), free(ds->d[i].name);
    ds->n = 0;
}

void ig_deltas_free(ig_deltas *ds) {
    ig_deltas_clear(ds);
    free(ds->d);
    ds->d = NULL;
    ds->cap = 0;
}

static char *dup_n(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (p) {
        if (n) memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

static ig_delta *push_delta(ig_deltas *ds, int kind) {
    if (ds->n == ds->cap) {
        const size_t cap = ds->cap ? 2 * ds->cap : 8;
        ig_delta *q = realloc(ds->d, cap * sizeof *q);
        if (!q) return NULL;
        ds->d = q, ds->cap = cap;
    }
    ig_delta *d = &ds->d[ds->n++];
    memset(d, 0, sizeof *d);
    d->kind = kind;
    return d;
}

/* a delta of text; content (and arguments of the same call, not just begun) joins the last one,
 * as _Answer._deltas merges them */
static int text_delta(ig_deltas *ds, size_t from, int kind, const char *t, size_t n, int index) {
    if (ds->n > from) {
        ig_delta *last = &ds->d[ds->n - 1];
        if (last->kind == kind && (kind == IG_DELTA_CONTENT || (kind == IG_DELTA_ARGUMENTS && last->index == index))) {
            char *q = realloc(last->text, last->len + n + 1);
            if (!q) return -1;
            memcpy(q + last->len, t, n);
            last->text = q, last->len += n;
            q[last->len] = 0;
            return 0;
        }
    }
    ig_delta *d = push_delta(ds, kind);
    if (!d) return -1;
    d->index = index;
    d->text = dup_n(t, n);
    d->len = n;
    return d->text ? 0 : -1;
}

/* ---- the reasoning: ReasoningSplitter ------------------------------------------------------- */

enum { R_START, R_REASONING, R_CONTENT };
static const char OPEN[] = "<think>", CLOSE[] = "</think>";

typedef struct {
    int state, lead;
    str buf, held, reasoning, content;
} splitter;

/* a piece of the split: kind R_REASONING or R_CONTENT, appended to pieces as (kind, text) */
typedef struct {
    int kind;
    size_t at, len;               /* in the pieces' text */
} piece;

typedef struct {
    piece *p;
    size_t n, cap;
    str text;
} pieces;

static int add_piece(pieces *ps, int kind, const char *t, size_t n) {
    if (ps->n == ps->cap) {
        const size_t cap = ps->cap ? 2 * ps->cap : 8;
        piece *q = realloc(ps->p, cap * sizeof *q);
        if (!q) return -1;
        ps->p = q, ps->cap = cap;
    }
    ps->p[ps->n++] = (piece){kind, ps->text.n, n};
    return put(&ps->text, t, n);
}

static int split_out(splitter *s, int kind, const char *t, size_t n, pieces *out) {
    str joined = {0};
    if (s->lead) {
        const size_t k = lstrip4(t, n);
        t += k, n -= k;
        if (!n) return 0;
        s->lead = 0;
    }
    if (kind == R_REASONING) {      /* trailing space waits: it may be the space before </think> */
        const size_t body = rstrip4(t, n);
        if (!body) return put(&s->held, t, n);
        if (put(&joined, s->held.p ? s->held.p : "", s->held.n) || put(&joined, t, body)) goto oom;
        clear(&s->held);
        if (put(&s->held, t + body, n - body)) goto oom;
        t = joined.p, n = joined.n;
    }
    if (n && (put(kind == R_REASONING ? &s->reasoning : &s->content, t, n) || add_piece(out, kind, t, n))) goto oom;
    free(joined.p);
    return 0;
oom:
    free(joined.p);
    return -1;
}

static int split_feed(splitter *s, const char *text, size_t len, pieces *out) {
    if (put(&s->buf, text, len)) return -1;
    while (s->buf.n) {
        if (s->state == R_START) {
            const size_t k = lstrip4(s->buf.p, s->buf.n);
            const char *t = s->buf.p + k;
            const size_t tn = s->buf.n - k;
            if (starts(t, tn, OPEN)) {
                drop(&s->buf, k + strlen(OPEN));
                s->state = R_REASONING;
                continue;
            }
            if (tn <= strlen(OPEN) && memcmp(OPEN, t, tn) == 0) return 0;    /* part of <think> */
            s->state = R_CONTENT;
            continue;
        }
        if (s->state == R_REASONING) {
            const long i = find(s->buf.p, s->buf.n, CLOSE);
            if (i < 0) {
                const size_t keep = partial_suffix(s->buf.p, s->buf.n, CLOSE);
                if (split_out(s, R_REASONING, s->buf.p, s->buf.n - keep, out)) return -1;
                drop(&s->buf, s->buf.n - keep);
                return 0;
            }
            if (split_out(s, R_REASONING, s->buf.p, (size_t)i, out)) return -1;
            clear(&s->held);
            drop(&s->buf, (size_t)i + strlen(CLOSE));
            s->state = R_CONTENT;
            s->lead = 1;
            continue;
        }
        if (split_out(s, R_CONTENT, s->buf.p, s->buf.n, out)) return -1;
        clear(&s->buf);
    }
    return 0;
}

static int split_finish(splitter *s, pieces *out) {
    if (!s->buf.n) return 0;
    if (s->state == R_START) s->state = R_CONTENT;      /* only space or part of <think> */
    const int rc = split_out(s, s->state, s->buf.p, s->buf.n, out);
    clear(&s->buf);
    return rc;
}

/* ---- tool calls: ToolCallParser (live=False) ------------------------------------------------ */

typedef struct {
    int fmt, parallel;
    const char *const *names;
    const size_t *name_lens;
    size_t n_names;
    int bare;                     /* 0 no, 1 maybe, 2 yes */
    str bare_text;
    ig_answer_call *calls;
    size_t n_calls, cap_calls;
    str content, buf, held_ws;
    int after_call;
    int in_call;                  /* hermes: a <tool_call> block is open */
    str call_text, call_space;
    char call_id[32];
    int started, whole;           /* llama3_json */
    ig_pcg64 rng;
} parser;

static const char HERMES_OPEN[] = "<tool_call>", HERMES_CLOSE[] = "</tool_call>", PYTHON_TAG[] = "<|python_tag|>";

static void new_call_id(parser *p, char *out) {
    static const char HEX[] = "0123456789abcdef";
    memcpy(out, "call_", 5);
    uint64_t x = 0;
    for (int i = 0; i < 24; i++) {
        if (i % 16 == 0) x = ig_pcg64_next(&p->rng);
        out[5 + i] = HEX[x & 15];
        x >>= 4;
    }
    out[29] = 0;
}

/* _text: content, without the whitespace that joins it to a call */
static int p_text(parser *p, const char *t, size_t n, ig_deltas *out, size_t from) {
    if (p->after_call) {
        const size_t k = lstrip4(t, n);
        t += k, n -= k;
        if (!n) return 0;
        p->after_call = 0;
    }
    const size_t stripped = rstrip4(t, n);
    if (stripped) {
        str piece = {0};
        if (put(&piece, p->held_ws.p ? p->held_ws.p : "", p->held_ws.n) || put(&piece, t, stripped) ||
            put(&p->content, piece.p, piece.n) || text_delta(out, from, IG_DELTA_CONTENT, piece.p, piece.n, 0)) {
            free(piece.p);
            return -1;
        }
        free(piece.p);
        clear(&p->held_ws);
    }
    return put(&p->held_ws, t + stripped, n - stripped);
}

static int p_flush_ws(parser *p, ig_deltas *out, size_t from) {
    int rc = 0;
    if (p->held_ws.n && !p->after_call)
        rc = put(&p->content, p->held_ws.p, p->held_ws.n) ||
             text_delta(out, from, IG_DELTA_CONTENT, p->held_ws.p, p->held_ws.n, 0);
    clear(&p->held_ws);
    return rc ? -1 : 0;
}

/* a JSON string literal's value (json.loads of it); NULL if it is not one */
static char *json_string_value(const char *s, size_t n, size_t *len) {
    ig_json_error je;
    ig_json_doc *d = ig_json_parse(s, n, NULL, &je);
    char *out = NULL;
    if (d && ig_json_root(d)->type == IG_JSON_STRING) {
        *len = ig_json_root(d)->u.str.len;
        out = dup_n(ig_json_root(d)->u.str.s, *len);
    }
    ig_json_free(d);
    return out;
}

/* _HEAD at the start of a call's text: `\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(arguments|
 * parameters)"\s*:\s*`; the name literal's span and where the match ends, or 0 */
static int match_head(const char *t, size_t n, size_t *name_at, size_t *name_end, size_t *end) {
    size_t i = skip_py_space(t, n, 0);
    if (i >= n || t[i] != '{') return 0;
    i = skip_py_space(t, n, i + 1);
    if (!starts(t + i, n - i, "\"name\"")) return 0;
    i = skip_py_space(t, n, i + 6);
    if (i >= n || t[i] != ':') return 0;
    i = skip_py_space(t, n, i + 1);
    if (i >= n || t[i] != '"') return 0;
    *name_at = i++;
    for (;;) {
        if (i >= n) return 0;
        if (t[i] == '"') break;
        if (t[i] == '\\') {
            if (i + 1 >= n || t[i + 1] == '\n') return 0;
            size_t l;
            cp_at(t + i + 1, n - i - 1, &l);
            i += 1 + l;
            continue;
        }
        size_t l;
        cp_at(t + i, n - i, &l);
        i += l;
    }
    *name_end = ++i;
    i = skip_py_space(t, n, i);
    if (i >= n || t[i] != ',') return 0;
    i = skip_py_space(t, n, i + 1);
    if (starts(t + i, n - i, "\"arguments\"")) i += 11;
    else if (starts(t + i, n - i, "\"parameters\"")) i += 12;
    else return 0;
    i = skip_py_space(t, n, i);
    if (i >= n || t[i] != ':') return 0;
    *end = skip_py_space(t, n, i + 1);
    return 1;
}

/* where the JSON object or array at t[at] ends (one past its closing bracket), or 0 when it does
 * not close (_Call._advance's scanner) */
static size_t scan_close(const char *t, size_t n, size_t at) {
    int depth = 0, in_str = 0, esc = 0;
    for (size_t i = at; i < n; i++) {
        const char c = t[i];
        if (in_str) {
            if (esc) esc = 0;
            else if (c == '\\') esc = 1;
            else if (c == '"') in_str = 0;
        } else if (c == '"') {
            in_str = 1;
        } else if (c == '{' || c == '[') {
            depth++;
        } else if (c == '}' || c == ']') {
            if (--depth == 0) return i + 1;
        }
    }
    return 0;
}

/* json.dumps(v, ensure_ascii=False) */
static char *dumps(const ig_json *v, size_t *len) {
    ig_jw w;
    ig_jw_init(&w, IG_JW_SPACED);
    ig_jw_value(&w, v);
    const size_t n = w.len;
    char *s = ig_jw_take(&w);
    *len = s ? n : 0;
    return s;
}

/* the call a call's text spells (_Call.feed over all of it, then result(text)): 1 with its name
 * and arguments (malloc'd), the name the stream's "call" event would carry (the head's), 0 when it
 * is no call, -1 out of memory. head: the text was fed to a _Call (its head may be read). */
static int read_call(const char *t, size_t n, int head, char **name, size_t *name_len, char **args, size_t *args_len,
                     char **event_name, size_t *event_name_len) {
    *name = *args = *event_name = NULL;
    int rc = 0;
    ig_json_limits lim = {ANSWER_PARSE_DEPTH, (size_t)-1 >> 1, (size_t)-1 >> 1};
    ig_json_error je;
    ig_json_doc *doc = ig_json_parse(t, n, &lim, &je), *inner = NULL;
    if (!doc) return je.status == IG_JSON_E_MEMORY ? -1 : 0;
    const ig_json *obj = ig_json_root(doc), *nm = ig_json_get(obj, "name");
    if (obj->type != IG_JSON_OBJECT || !nm || nm->type != IG_JSON_STRING || !nm->u.str.len) goto out;
    const ig_json *a = ig_json_get(obj, "arguments"), *pa = ig_json_get(obj, "parameters");
    if ((a != NULL) == (pa != NULL) || obj->u.obj.n != 2) goto out;
    const ig_json *args_v = a ? a : pa;
    if (args_v->type == IG_JSON_STRING) {
        inner = ig_json_parse(args_v->u.str.s, args_v->u.str.len, &lim, &je);
        if (!inner) {
            rc = je.status == IG_JSON_E_MEMORY ? -1 : 0;
            goto out;
        }
        args_v = ig_json_root(inner);
    }
    if (args_v->type != IG_JSON_OBJECT) goto out;
    /* the head, as the stream read it: the name literal, where the arguments start and end */
    size_t name_at, name_end, args_at, args_end = 0;
    char *head_name = NULL;
    size_t head_len = 0;
    if (head && match_head(t, n, &name_at, &name_end, &args_at) && args_at < n &&
        (head_name = json_string_value(t + name_at, name_end - name_at, &head_len)) && t[args_at] == '{')
        args_end = scan_close(t, n, args_at);
    if (args_end && head_len == nm->u.str.len && memcmp(head_name, nm->u.str.s, head_len) == 0) {
        *args = dup_n(t + args_at, args_end - args_at);       /* the model's own text */
        *args_len = args_end - args_at;
    } else {
        *args = dumps(args_v, args_len);
    }
    *name = dup_n(nm->u.str.s, nm->u.str.len);
    *name_len = nm->u.str.len;
    /* the stream's events stand when they spelled these arguments: then its call event has the
     * head's name; else the call is given out again, with the object's */
    const size_t sent_end = args_end ? args_end : n;
    const int kept = head_name && t[args_at] == '{' && *args && sent_end - args_at == *args_len &&
                     memcmp(t + args_at, *args, *args_len) == 0;
    if (kept) {
        *event_name = head_name, *event_name_len = head_len;
        head_name = NULL;
    } else {
        *event_name = dup_n(nm->u.str.s, nm->u.str.len), *event_name_len = nm->u.str.len;
    }
    free(head_name);
    rc = *name && *args && *event_name ? 1 : -1;
    if (rc < 0) {
        free(*name), free(*args), free(*event_name);
        *name = *args = *event_name = NULL;
    }
out:
    ig_json_free(inner);
    ig_json_free(doc);
    return rc;
}

/* _take: a valid call recorded and given out (only the first without parallel_tool_calls);
 * takes the strings */
static int p_take(parser *p, const char *id, char *name, size_t name_len, char *args, size_t args_len, char *ev_name,
                  size_t ev_name_len, ig_deltas *out) {
    if (p->n_calls && !p->parallel) {
        free(name), free(args), free(ev_name);
        return 0;
    }
    if (p->n_calls == p->cap_calls) {
        const size_t cap = p->cap_calls ? 2 * p->cap_calls : 4;
        ig_answer_call *q = realloc(p->calls, cap * sizeof *q);
        if (!q) {
            free(name), free(args), free(ev_name);
            return -1;
        }
        p->calls = q, p->cap_calls = cap;
    }
    const int index = (int)p->n_calls;
    ig_answer_call *c = &p->calls[p->n_calls++];
    memcpy(c->id, id, 30);
    c->name = name, c->name_len = name_len, c->arguments = args, c->arguments_len = args_len;
    clear(&p->held_ws);
    p->after_call = 1;
    ig_delta *d = push_delta(out, IG_DELTA_CALL);
    if (!d) {
        free(ev_name);
        return -1;
    }
    d->index = index;
    memcpy(d->id, id, 30);
    d->name = ev_name, d->name_len = ev_name_len;
    d = push_delta(out, IG_DELTA_ARGUMENTS);
    if (!d) return -1;
    d->index = index;
    d->text = dup_n(args, args_len);
    d->len = args_len;
    return d->text ? 0 : -1;
}

/* _close_block: the open block's text read as a call, or given back as content */
static int p_close_block(parser *p, int closed, ig_deltas *out, size_t from) {
    p->in_call = 0;
    char *name, *args, *ev;
    size_t nl, al, el;
    const int rc = read_call(p->call_text.p ? p->call_text.p : "", p->call_text.n, 1, &name, &nl, &args, &al, &ev, &el);
    if (rc < 0) return -1;
    if (rc > 0) return p_take(p, p->call_id, name, nl, args, al, ev, el, out);
    str back = {0};
    int bad = put(&back, p->call_space.p ? p->call_space.p : "", p->call_space.n) ||
              put(&back, HERMES_OPEN, strlen(HERMES_OPEN)) || put(&back, p->call_text.p ? p->call_text.p : "", p->call_text.n) ||
              (closed && put(&back, HERMES_CLOSE, strlen(HERMES_CLOSE)));
    if (!bad) bad = p_text(p, back.p, back.n, out, from);
    free(back.p);
    return bad ? -1 : 0;
}

static int p_feed_blocks(parser *p, ig_deltas *out, size_t from) {
    while (p->buf.n) {
        if (!p->in_call) {
            const long i = find(p->buf.p, p->buf.n, HERMES_OPEN);
            if (i < 0) {
                const size_t keep = partial_suffix(p->buf.p, p->buf.n, HERMES_OPEN);
                if (p_text(p, p->buf.p, p->buf.n - keep, out, from)) return -1;
                drop(&p->buf, p->buf.n - keep);
                return 0;
            }
            if (p_text(p, p->buf.p, (size_t)i, out, from)) return -1;
            drop(&p->buf, (size_t)i + strlen(HERMES_OPEN));
            p->in_call = 1;
            new_call_id(p, p->call_id);
            clear(&p->call_text), clear(&p->call_space);
            /* the space before the call goes with it (back to content if it is no call) */
            if (put(&p->call_space, p->held_ws.p ? p->held_ws.p : "", p->held_ws.n)) return -1;
            clear(&p->held_ws);
            continue;
        }
        const long j = find(p->buf.p, p->buf.n, HERMES_CLOSE);
        const size_t upto = j >= 0 ? (size_t)j : p->buf.n - partial_suffix(p->buf.p, p->buf.n, HERMES_CLOSE);
        if (upto) {
            if (put(&p->call_text, p->buf.p, upto)) return -1;
            drop(&p->buf, upto);
        }
        if (j < 0) return 0;
        drop(&p->buf, strlen(HERMES_CLOSE));
        if (p_close_block(p, 1, out, from)) return -1;
    }
    return 0;
}

static int p_feed_whole(parser *p, ig_deltas *out, size_t from) {
    if (!p->started) {
        size_t k = lstrip4(p->buf.p, p->buf.n);
        const char *t = p->buf.p + k;
        size_t tn = p->buf.n - k;
        if (starts(t, tn, PYTHON_TAG)) {
            t += strlen(PYTHON_TAG), tn -= strlen(PYTHON_TAG);
            const size_t k2 = lstrip4(t, tn);
            t += k2, tn -= k2;
        } else if (tn && tn <= strlen(PYTHON_TAG) && memcmp(PYTHON_TAG, t, tn) == 0) {
            return 0;           /* part of the prefix so far */
        }
        if (!tn) return 0;
        p->started = 1;
        p->whole = t[0] == '{';
        if (p->whole) drop(&p->buf, (size_t)(t - p->buf.p));
    }
    if (!p->whole) {
        const int rc = p_text(p, p->buf.p, p->buf.n, out, from);
        clear(&p->buf);
        return rc;
    }
    return 0;                   /* read whole at finish */
}

/* _finish_whole (not live): the answer as call objects joined by space and ";", else content */
static int p_finish_whole(parser *p, ig_deltas *out, size_t from) {
    const char *t = p->buf.p;
    const size_t n = p->buf.n;
    typedef struct {
        char id[32];
        char *name, *args, *ev;
        size_t nl, al, el;
    } found;
    found *fs = NULL;
    size_t nf = 0, pos = 0;
    int ok = 1, rc = 0;
    while (pos < n && ok) {
        const size_t end = t[pos] == '{' ? scan_close(t, n, pos) : 0;
        if (!end) {
            ok = 0;
            break;
        }
        found *q = realloc(fs, (nf + 1) * sizeof *q);
        if (!q) {
            rc = -1;
            break;
        }
        fs = q;
        found *f = &fs[nf];
        const int r = read_call(t + pos, end - pos, 1, &f->name, &f->nl, &f->args, &f->al, &f->ev, &f->el);
        if (r < 0) {
            rc = -1;
            break;
        }
        if (r == 0) {
            ok = 0;
            break;
        }
        new_call_id(p, f->id);
        nf++;
        pos = end;
        while (pos < n && (ws4(t[pos]) || t[pos] == ';')) pos++;
    }
    if (!rc && ok && nf) {
        for (size_t i = 0; i < nf && !rc; i++) {
            /* the calls are given out again, with the object's name */
            free(fs[i].ev);
            char *ev = dup_n(fs[i].name, fs[i].nl);
            if (!ev) {
                free(fs[i].name), free(fs[i].args);
                rc = -1;
            } else {
                rc = p_take(p, fs[i].id, fs[i].name, fs[i].nl, fs[i].args, fs[i].al, ev, fs[i].nl, out);
            }
            fs[i].name = fs[i].args = fs[i].ev = NULL;
        }
    } else if (!rc) {
        rc = p_text(p, t, n, out, from);
    }
    for (size_t i = 0; i < nf; i++) free(fs[i].name), free(fs[i].args), free(fs[i].ev);
    free(fs);
    clear(&p->buf);
    return rc;
}

/* _bare_start: 1 ("maybe") while the text may still begin a bare call, 2 ("yes") once it does,
 * 0 ("no") once it cannot */
static int bare_start(const char *s, size_t n) {
    static const char HEAD[] = "{\"name\":\"";
    size_t i = lstrip4(s, n);
    if (i < n && s[i] == '`') {
        const long nl = find(s + i, n - i, "\n");
        if (nl < 0) {
            size_t e = n;
            while (e > i && (s[e - 1] == ' ' || s[e - 1] == '\t')) e--;
            const size_t k = e - i;
            return (k <= 7 && memcmp("```json", s + i, k) == 0) ? 1 : 0;
        }
        /* t[:nl].strip() in ("```", "```json") */
        const size_t a = skip_py_space(s, i + (size_t)nl, i), b = rstrip_py(s, a, i + (size_t)nl);
        if (!((b - a == 3 && memcmp(s + a, "```", 3) == 0) || (b - a == 7 && memcmp(s + a, "```json", 7) == 0))) return 0;
        i += (size_t)nl + 1;
    }
    /* the text without whitespace, against the head */
    size_t k = 0;
    while (i < n && k < 9) {
        size_t l;
        const uint32_t c = cp_at(s + i, n - i, &l);
        if (!ig_py_space(c)) {
            if (l != 1 || s[i] != HEAD[k]) return 0;
            k++;
        }
        i += l;
    }
    return k == 9 ? 2 : 1;
}

/* _FENCE.fullmatch: `\s*```(?:json)?[ \t]*\n(.*)\n[ \t]*```\s*` (re.S); the body, or 0 */
static int fence_body(const char *s, size_t n, size_t *at, size_t *len) {
    size_t i = skip_py_space(s, n, 0);
    if (!starts(s + i, n - i, "```")) return 0;
    i += 3;
    size_t j = i;
    if (starts(s + j, n - j, "json")) j += 4;
    for (int pass = 0; pass < 2; pass++) {       /* with "json" first, then without */
        size_t k = pass ? i : j;
        if (pass && j == i) break;
        while (k < n && (s[k] == ' ' || s[k] == '\t')) k++;
        if (k < n && s[k] == '\n') {
            i = k + 1;
            goto body;
        }
    }
    return 0;
body:;
    /* the end: trailing whitespace, ```, [ \t]*, \n, as late as the greedy body allows (the last
     * "```" followed by whitespace only) */
    const size_t end = rstrip_py(s, i, n);
    if (end < i + 4 || memcmp(s + end - 3, "```", 3) != 0) return 0;
    size_t q = end - 3;
    while (q > i && (s[q - 1] == ' ' || s[q - 1] == '\t')) q--;
    if (q > i && s[q - 1] == '\n') {
        *at = i, *len = q - 1 - i;
        return 1;
    }
    return 0;
}

/* _bare_calls: the calls of an answer that is only a call object (or a list of them) naming an
 * offered function; 1 and the calls taken, 0 when it is anything else */
static int p_bare_calls(parser *p, ig_deltas *out) {
    const char *t = p->bare_text.p ? p->bare_text.p : "";
    size_t at = 0, len = p->bare_text.n;
    if (!fence_body(t, p->bare_text.n, &at, &len)) at = 0, len = p->bare_text.n;
    ig_json_limits lim = {ANSWER_PARSE_DEPTH, (size_t)-1 >> 1, (size_t)-1 >> 1};
    ig_json_error je;
    ig_json_doc *doc = ig_json_parse(t + at, len, &lim, &je);
    if (!doc) return je.status == IG_JSON_E_MEMORY ? -1 : 0;
    const ig_json *v = ig_json_root(doc);
    const ig_json *const *items = (const ig_json *const *)&v;
    size_t n = 1;
    if (v->type == IG_JSON_ARRAY && v->u.arr.n) items = (const ig_json *const *)v->u.arr.items, n = v->u.arr.n;
    int rc = 1;
    for (size_t i = 0; i < n && rc > 0; i++) {
        const ig_json *nm = items[i]->type == IG_JSON_OBJECT ? ig_json_get(items[i], "name") : NULL;
        int known = 0;
        for (size_t k = 0; nm && nm->type == IG_JSON_STRING && k < p->n_names && !known; k++)
            known = p->name_lens[k] == nm->u.str.len && memcmp(p->names[k], nm->u.str.s, nm->u.str.len) == 0;
        if (!known) rc = 0;
    }
    /* each item read as result(json.dumps(item)): a _Call never fed, its arguments dumped */
    char **texts = calloc(n, sizeof *texts);
    size_t *lens = calloc(n, sizeof *lens);
    if (!texts || !lens) rc = -1;
    for (size_t i = 0; i < n && rc > 0; i++) {
        texts[i] = dumps(items[i], &lens[i]);
        if (!texts[i]) rc = -1;
    }
    typedef struct {
        char *name, *args, *ev;
        size_t nl, al, el;
    } found;
    found *fs = rc > 0 ? calloc(n, sizeof *fs) : NULL;
    if (rc > 0 && !fs) rc = -1;
    for (size_t i = 0; i < n && rc > 0; i++) {
        const int r = read_call(texts[i], lens[i], 0, &fs[i].name, &fs[i].nl, &fs[i].args, &fs[i].al, &fs[i].ev, &fs[i].el);
        if (r <= 0) rc = r;
    }
    for (size_t i = 0; i < n && rc > 0; i++) {
        char id[32];
        new_call_id(p, id);
        if (p_take(p, id, fs[i].name, fs[i].nl, fs[i].args, fs[i].al, fs[i].ev, fs[i].el, out)) rc = -1;
        fs[i].name = fs[i].args = fs[i].ev = NULL;
    }
    for (size_t i = 0; fs && i < n; i++) free(fs[i].name), free(fs[i].args), free(fs[i].ev);
    for (size_t i = 0; texts && i < n; i++) free(texts[i]);
    free(fs), free(texts), free(lens);
    ig_json_free(doc);
    return rc;
}

static int p_feed(parser *p, const char *text, size_t len, ig_deltas *out, size_t from) {
    if (p->bare) {
        if (put(&p->bare_text, text, len)) return -1;
        if (p->bare == 1) p->bare = bare_start(p->bare_text.p, p->bare_text.n);
        if (p->bare) return 0;
        if (put(&p->buf, p->bare_text.p, p->bare_text.n)) return -1;
        clear(&p->bare_text);
    } else if (put(&p->buf, text, len)) {
        return -1;
    }
    return p->fmt == IG_TOOLS_HERMES ? p_feed_blocks(p, out, from) : p_feed_whole(p, out, from);
}

static int p_finish(parser *p, ig_deltas *out, size_t from) {
    if (p->bare) {
        p->bare = 0;
        const int rc = p_bare_calls(p, out);
        if (rc < 0) return -1;
        if (rc == 0 && put(&p->buf, p->bare_text.p ? p->bare_text.p : "", p->bare_text.n)) return -1;
        clear(&p->bare_text);
    }
    if (p->fmt == IG_TOOLS_HERMES) {
        if (p->in_call) {
            if (p->buf.n && put(&p->call_text, p->buf.p, p->buf.n)) return -1;
            clear(&p->buf);
            if (p_close_block(p, 0, out, from)) return -1;
        } else if (p->buf.n) {
            if (p_text(p, p->buf.p, p->buf.n, out, from)) return -1;
            clear(&p->buf);
        }
    } else if (p->whole) {
        if (p_finish_whole(p, out, from)) return -1;
    } else if (p->buf.n) {
        if (p_text(p, p->buf.p, p->buf.n, out, from)) return -1;
        clear(&p->buf);
    }
    return p_flush_ws(p, out, from);
}

/* ---- the answer: client._Answer ------------------------------------------------------------- */

struct ig_answer {
    int thinking, tools, done;
    splitter split;
    parser calls;
    pieces ps;
};

ig_answer *ig_answer_new(const ig_answer_config *c) {
    ig_answer *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->thinking = c->thinking;
    a->split.state = c->open_in_prompt ? R_REASONING : R_START;
    a->split.lead = 1;
    a->tools = c->tools;
    parser *p = &a->calls;
    p->fmt = c->tools, p->parallel = c->parallel;
    p->names = c->names, p->name_lens = c->name_lens, p->n_names = c->n_names;
    p->bare = c->tools == IG_TOOLS_HERMES && c->n_names ? 1 : 0;
    if (ig_pcg64_seed_entropy(&p->rng) != 0) ig_pcg64_seed(&p->rng, (uint64_t)(uintptr_t)a);
    return a;
}

static void free_str(str *s) {
    free(s->p);
    s->p = NULL;
    s->n = s->cap = 0;
}

void ig_answer_free(ig_answer *a) {
    if (!a) return;
    free_str(&a->split.buf), free_str(&a->split.held), free_str(&a->split.reasoning), free_str(&a->split.content);
    parser *p = &a->calls;
    for (size_t i = 0; i < p->n_calls; i++) free(p->calls[i].name), free(p->calls[i].arguments);
    free(p->calls);
    free_str(&p->bare_text), free_str(&p->content), free_str(&p->buf), free_str(&p->held_ws);
    free_str(&p->call_text), free_str(&p->call_space);
    free(a->ps.p);
    free_str(&a->ps.text);
    free(a);
}

int ig_answer_plain(const ig_answer *a) { return !a->thinking && a->tools == IG_TOOLS_NONE; }

/* _content: the content part, through the call reader when there is one */
static int content_part(ig_answer *a, const char *t, size_t n, ig_deltas *out) {
    if (a->tools == IG_TOOLS_NONE) return n ? text_delta(out, out->n, IG_DELTA_CONTENT, t, n, 0) : 0;
    const size_t from = out->n;   /* one _deltas list: merged within it only */
    return p_feed(&a->calls, t, n, out, from);
}

static int split_pieces(ig_answer *a, ig_deltas *out) {
    for (size_t i = 0; i < a->ps.n; i++) {
        const piece *pc = &a->ps.p[i];
        const char *t = a->ps.text.p + pc->at;
        if (pc->kind == R_REASONING) {
            ig_delta *d = push_delta(out, IG_DELTA_REASONING);
            if (!d || !(d->text = dup_n(t, pc->len))) return -1;
            d->len = pc->len;
        } else if (content_part(a, t, pc->len, out)) {
            return -1;
        }
    }
    a->ps.n = 0;
    clear(&a->ps.text);
    return 0;
}

int ig_answer_feed(ig_answer *a, const char *text, size_t len, ig_deltas *out) {
    if (!a->thinking) return content_part(a, text, len, out);
    if (split_feed(&a->split, text, len, &a->ps)) return -1;
    return split_pieces(a, out);
}

int ig_answer_finish(ig_answer *a, ig_deltas *out) {
    if (a->done) return 0;
    a->done = 1;
    if (a->thinking && (split_finish(&a->split, &a->ps) || split_pieces(a, out))) return -1;
    return a->tools != IG_TOOLS_NONE ? p_finish(&a->calls, out, out->n) : 0;
}

const char *ig_answer_reasoning(const ig_answer *a, size_t *len) {
    *len = a->split.reasoning.n;
    return a->thinking && a->split.reasoning.n ? a->split.reasoning.p : NULL;
}

const char *ig_answer_content(const ig_answer *a, size_t *len) {
    if (a->tools != IG_TOOLS_NONE) {
        *len = a->calls.content.n;
        return a->calls.content.n ? a->calls.content.p : NULL;
    }
    /* content or ("" if reasoning is None else None) */
    *len = a->split.content.n;
    if (a->split.content.n) return a->split.content.p;
    return a->split.reasoning.n ? NULL : "";
}

size_t ig_answer_calls(const ig_answer *a, const ig_answer_call **calls) {
    *calls = a->calls.calls;
    return a->calls.n_calls;
}
