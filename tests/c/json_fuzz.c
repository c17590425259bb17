/* A bounded fuzz run of csrc/native/json.c, built with -fsanitize=address,undefined by
 * tests/test_native_json.py: random documents (generated, then mutated, truncated or nested past
 * the limit) are parsed with random limits; each one read is written, read back and written again,
 * which must give the same bytes; the getters walk it. Any memory error, leak or undefined
 * behaviour aborts under the sanitizers; a broken invariant exits 1.
 *     json_fuzz [documents] [seed]
 * With "locale NAME": under that locale (one writing decimal commas) numbers are still written and
 * read with a point; exits 2 if the locale is not installed. */
#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

static unsigned long long rng_state;
static unsigned long long next(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static size_t below(size_t n) { return n ? (size_t)(next() % n) : 0; }

typedef struct { char *b; size_t len, cap; } buf;
static void put(buf *o, const char *s, size_t n) {
    if (o->len + n + 1 > o->cap) {
        o->cap = (o->len + n + 1) * 2;
        o->b = realloc(o->b, o->cap);
        if (!o->b) abort();
    }
    memcpy(o->b + o->len, s, n);
    o->len += n;
    o->b[o->len] = 0;
}
static void puts_(buf *o, const char *s) { put(o, s, strlen(s)); }

static const char *pieces[] = {
    "\"\\u00e9\"", "\"\\ud83d\\ude00\"", "\"\\ud800\"", "\"\xed\xa0\x80\"", "\"\xc3\xa9\xf0\x9f\x98\x80\"",
    "\"a\\n\\t\\\"\\\\\\/\"", "0", "-0", "1.5", "-1e-7", "1E400", "12345678901234567890123",
    "18446744073709551615", "-9223372036854775808", "true", "false", "null", "\"\"", "0.1",
};

static void gen(buf *o, int depth) {
    size_t r = below(depth > 90 || o->len > 2048 ? 3 : 10);
    if (r < 6) {
        puts_(o, pieces[below(sizeof pieces / sizeof *pieces)]);
    } else if (r < 8) {
        puts_(o, "[");
        size_t n = below(5);
        for (size_t i = 0; i < n; i++) {
            if (i) puts_(o, below(4) ? "," : " , ");
            gen(o, depth + 1);
        }
        puts_(o, "]");
    } else {
        puts_(o, "{");
        size_t n = below(25);
        for (size_t i = 0; i < n; i++) {
            char key[16];
            if (i) puts_(o, ",");
            snprintf(key, sizeof key, "\"k%zu\":", below(8));   /* duplicates on purpose */
            puts_(o, key);
            gen(o, depth + 1);
        }
        puts_(o, "}");
    }
}

static void mutate(buf *o) {
    static const char alphabet[] = "{}[]\":,.-+eE0123456789 \\\nutrfalse\xc3\xa9\xed\xa0\x80\xff";
    size_t k = 1 + below(4);
    for (size_t i = 0; i < k && o->len; i++) {
        size_t at = below(o->len);
        switch (below(4)) {
        case 0: memmove(o->b + at, o->b + at + 1, o->len - at); o->len--; break;
        case 1: o->b[at] = alphabet[below(sizeof alphabet - 1)]; break;
        case 2: o->len = at; o->b[at] = 0; break;
        default: o->b[at] = (char)below(256); break;
        }
    }
}

/* every getter on every value, for the sanitizers' sake */
static void walk(const ig_json *v, int depth) {
    ig_json_error e;
    const char *s;
    size_t n;
    double d;
    int64_t i;
    uint64_t u;
    int b;
    ig_json_get_string(v, "s", &s, &n, &e);
    ig_json_get_number(v, "d", &d, &e);
    ig_json_get_int(v, "i", &i, &e);
    ig_json_get_u64(v, "u", &u, &e);
    ig_json_get_bool(v, "b", &b, &e);
    (void)ig_json_len(v);
    if (v->type == IG_JSON_ARRAY)
        for (size_t k = 0; k <= v->u.arr.n; k++) {
            const ig_json *c = ig_json_at(v, k);
            if (c) walk(c, depth + 1);
        }
    if (v->type == IG_JSON_OBJECT)
        for (size_t k = 0; k < v->u.obj.n; k++) {
            const ig_json_member *m = &v->u.obj.members[k];
            /* keys are unique: the lookup finds this very member (keys without a NUL) */
            if (strlen(m->key) == m->key_len && ig_json_get(v, m->key) != m->value) {
                printf("lookup of key %s found another member\n", m->key);
                exit(1);
            }
            walk(v->u.obj.members[k].value, depth + 1);
        }
}

static char *write_doc(const ig_json_doc *doc, int style) {
    ig_jw w;
    ig_jw_init(&w, style);
    ig_jw_value(&w, ig_json_root(doc));
    return ig_jw_take(&w);
}

static int locale_check(const char *name) {
    if (!setlocale(LC_ALL, name)) return 2;
    char b[40];
    snprintf(b, sizeof b, "%.1f", 0.5);
    if (strcmp(b, "0,5") != 0) {
        printf("locale %s writes 0.5 as %s, not with a decimal comma\n", name, b);
        return 2;
    }
    ig_json_format_double(b, 0.25);
    if (strcmp(b, "0.25") != 0) {
        printf("0.25 written as %s under %s\n", b, name);
        return 1;
    }
    ig_json_error err;
    ig_json_doc *doc = ig_json_parse("[2.5e1]", 7, NULL, &err);
    if (!doc || ig_json_at(ig_json_root(doc), 0)->u.num.d != 25.0) {
        printf("[2.5e1] misread under %s\n", name);
        return 1;
    }
    ig_json_free(doc);
    printf("locale %s: numbers written and read with a point\n", name);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 2 && strcmp(argv[1], "locale") == 0) return locale_check(argv[2]);
    long count = argc > 1 ? atol(argv[1]) : 10000;
    rng_state = argc > 2 ? strtoull(argv[2], NULL, 10) * 2654435761u + 1 : 1;
    long parsed = 0, refused = 0;
    for (long t = 0; t < count; t++) {
        buf o = {0};
        put(&o, "", 0);
        size_t kind = below(10);
        if (kind == 0) {                           /* deep */
            size_t levels = below(3000);
            for (size_t i = 0; i < levels; i++) puts_(&o, below(2) ? "[" : "{\"a\":");
        } else {
            gen(&o, 0);
            if (kind < 5) mutate(&o);
        }
        ig_json_limits lim = {(int)below(120), below(3) ? 0 : below(4096), below(3) ? 0 : below(300)};
        ig_json_error err;
        ig_json_doc *doc = ig_json_parse(o.b, o.len, &lim, &err);
        if (!doc) {
            refused++;
            if (err.status == IG_JSON_OK || !err.message[0]) {
                printf("refused without a message: %s\n", o.b);
                return 1;
            }
        } else {
            parsed++;
            walk(ig_json_root(doc), 0);
            for (int style = 0; style < 2; style++) {
                char *text = write_doc(doc, style);
                if (!text) {
                    printf("could not write back: %s\n", o.b);
                    return 1;
                }
                if (!strstr(text, "Infinity")) {     /* 1E400 is written as Python writes inf */
                    ig_json_limits wide = {1000, (size_t)1 << 30, (size_t)1 << 30};
                    ig_json_doc *again = ig_json_parse(text, strlen(text), &wide, &err);
                    if (!again) {
                        printf("own output refused (%s): %s\n", err.message, text);
                        return 1;
                    }
                    char *text2 = write_doc(again, style);
                    if (!text2 || strcmp(text, text2) != 0) {
                        printf("not idempotent:\n%s\n%s\n", text, text2 ? text2 : "(null)");
                        return 1;
                    }
                    free(text2);
                    ig_json_free(again);
                }
                free(text);
            }
            ig_json_free(doc);
        }
        free(o.b);
    }
    /* the writer's builder, misused and used */
    ig_jw w;
    ig_jw_init(&w, IG_JW_SPACED);
    ig_jw_begin_object(&w);
    ig_jw_key(&w, "embedding", 9);
    float v[5] = {1.0f, -2.5f, 0.1f, 3e38f, -0.0f};
    ig_jw_base64_f32(&w, v, 5);
    ig_jw_key(&w, "x", 1);
    ig_jw_double(&w, 0.1);
    ig_jw_end_object(&w);
    char *text = ig_jw_take(&w);
    if (!text) return 1;
    free(text);
    ig_jw_init(&w, IG_JW_COMPACT);
    for (int i = 0; i < 300; i++) ig_jw_begin_array(&w);    /* deeper than the writer goes */
    if (ig_jw_take(&w) != NULL) return 1;
    printf("documents: %ld read: %ld refused: %ld\n", count, parsed, refused);
    return 0;
}
