/* The native chat renderers under ASan + UBSan (run by tests/test_native_chat.py): damaged
 * sections and random hostile conversations (bad roles, NULLs with lengths, invalid UTF-8, token
 * spellings and <think> markers cut anywhere, arguments that are not JSON, deep nesting) give a
 * status every time, never a memory error, a leak or undefined behaviour; a rendered prompt is
 * NUL-terminated and its spans cover it.
 *
 * ig_chat_render_json gets the same on requests joined from hostile JSON pieces.
 *
 * usage: chat_check RUNS SEED SECTION_FILE...
 */
#include "chat.h"
#include "json.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state;

static uint32_t rnd(uint32_t n) {          /* splitmix64, uniform enough for a fuzzer */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return n ? (uint32_t)(z % n) : 0;
}

static const char *const PIECES[] = {
    "", "hello", " ", "\n", "\n\n", "\t", "<think>", "</think>", "<tool_response>",
    "</tool_response>", "<|im_end|>", "<|im_start|>", "<|im_", "end|>", "<|eot_id|>",
    "<|begin_of_text|>", "\xc2\xa0", "\xe3\x80\x80", "\xc2\x85", "\xe2\x80\x8b", "\xff", "\xc3",
    "\xe3\x80", "\xf0\x9f\x9a\x80", "\"", "\\", "{", "}", "[", "]", ",", ":", "\x01", "\x7f",
    "caf\xc3\xa9", "\xed\xa0\x80", "null", "1e+300", "-0.0",
};
#define N_PIECES (sizeof PIECES / sizeof *PIECES)

static const char *const JSONS[] = {
    "{}", "{\"a\": 1}", "{\"a\":[1,2.5,{\"b\":null}],\"c\":\"x\\\"y\"}", "{ \"k\" : [ ] , \"e\" : { } }",
    "{", "}", "[]", "{}{}", "\"s\"", "", "{\"a\": \"unterminated}", "{\"a\": [}", "{]",
    "{\"a\": \"\\\\\"}", "{\"a\": \"\\\"\"}", "  {\"ws\":\n\t1}  ", "{\"a\": 1,}",
};
#define N_JSONS (sizeof JSONS / sizeof *JSONS)

/* a random string of pieces, in a buffer the caller frees */
static char *random_text(size_t *len) {
    size_t n = rnd(8), at = 0;
    char *s = malloc(n * 32 + 1);          /* every piece is shorter than 32 bytes */
    for (size_t i = 0; i < n; i++) {
        const char *p = PIECES[rnd(N_PIECES)];
        size_t k = strlen(p);
        memcpy(s + at, p, k);
        at += k;
    }
    s[at] = 0;
    *len = at;
    return s;
}

typedef struct {
    char *bufs[4096];
    size_t n;
} pool_t;

static ig_chat_str text_in(pool_t *p) {
    size_t len;
    char *s = random_text(&len);
    if (p->n < sizeof p->bufs / sizeof *p->bufs)
        p->bufs[p->n++] = s;
    else
        free(s), s = NULL, len = 0;
    return (ig_chat_str){s, len};
}

static void check_output(const ig_chat_output *o) {
    if (!o->text || o->text[o->len] != 0) {
        fprintf(stderr, "output not NUL-terminated\n");
        abort();
    }
    size_t at = 0;
    for (size_t i = 0; i < o->n_spans; i++) {
        if (o->spans[i].offset != at || !o->spans[i].len ||
            (i && o->spans[i].kind == o->spans[i - 1].kind)) {
            fprintf(stderr, "spans do not tile the output at %zu\n", i);
            abort();
        }
        at += o->spans[i].len;
    }
    if (at != o->len) {
        fprintf(stderr, "spans cover %zu of %zu bytes\n", at, o->len);
        abort();
    }
}

static int one_render(const ig_chat_template *t) {
    pool_t pool = {.n = 0};
    size_t n = rnd(7);
    ig_chat_message *ms = calloc(n ? n : 1, sizeof *ms);
    ig_chat_str parts[7][3];
    ig_chat_tool_call calls[7][3];
    for (size_t i = 0; i < n; i++) {
        ig_chat_message *m = &ms[i];
        m->role = rnd(20) ? (int)rnd(IG_CHAT_ROLE_COUNT) : (int)rnd(9) - 2;
        size_t np = rnd(4);
        for (size_t k = 0; k < np; k++)
            parts[i][k] = text_in(&pool);
        m->content = np ? parts[i] : NULL;
        m->n_content = np;
        m->has_content = np ? (rnd(30) != 0) : (int)rnd(2);
        if (rnd(3) == 0) {
            m->reasoning_content = text_in(&pool);
            m->has_reasoning_content = 1;
        }
        if (rnd(3) == 0) {
            size_t nc = rnd(4);
            for (size_t k = 0; k < nc; k++) {
                calls[i][k].name = text_in(&pool);
                const char *j = JSONS[rnd(N_JSONS)];
                calls[i][k].arguments = rnd(2) ? (ig_chat_str){j, strlen(j)} : text_in(&pool);
                calls[i][k].arguments_is_object = (int)rnd(2);
            }
            m->tool_calls = nc ? calls[i] : NULL;
            m->n_tool_calls = nc;
            m->has_tool_calls = 1;
        }
        if (rnd(50) == 0)
            m->content = NULL;                                   /* NULL with parts counted */
        if (rnd(50) == 0)
            m->reasoning_content = (ig_chat_str){NULL, 3};
    }
    ig_chat_str tools[3];
    size_t nt = rnd(4);
    for (size_t k = 0; k < nt; k++) {
        const char *j = JSONS[rnd(N_JSONS)];
        tools[k] = (ig_chat_str){j, strlen(j)};
    }
    ig_chat_request r = {
        .messages = ms, .n_messages = n, .tools = nt ? tools : NULL, .n_tools = nt,
        .has_tools = (int)rnd(2), .add_generation_prompt = (int)rnd(2),
        .enable_thinking = (int)rnd(4) - 1, .tools_in_user_message = (int)rnd(3) - 1,
    };
    if (rnd(3) == 0) {
        r.date_string = text_in(&pool);
        r.has_date_string = 1;
    }
    if (rnd(40) == 0)
        r.n_messages = (size_t)1 << (20 + rnd(40));
    if (rnd(40) == 0)
        r.n_tools = SIZE_MAX - rnd(3);
    ig_chat_output out;
    char err[200];
    int st = ig_chat_render(t, &r, &out, err, sizeof err);
    if (st < 0 || st > IG_CHAT_E_MEMORY) {
        fprintf(stderr, "status %d out of range\n", st);
        abort();
    }
    if (st == IG_CHAT_OK)
        check_output(&out);
    else if (out.text || out.spans || !err[0]) {
        fprintf(stderr, "a failed render left output or no message (status %d)\n", st);
        abort();
    }
    ig_chat_output_free(&out);
    for (size_t i = 0; i < pool.n; i++)
        free(pool.bufs[i]);
    free(ms);
    return st;
}

/* ig_chat_render_json on requests joined from hostile pieces (wrong types, nulls, missing fields) */
static const char *const JMSGS[] = {
    "{\"role\": \"user\", \"content\": \"hi <|im_end|>\"}", "{\"role\": \"system\", \"content\": null}",
    "{\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"function\": {\"name\": \"f\", "
    "\"arguments\": \"{\\\"a\\\": [1, 2.5e300, {}]}\"}}]}",
    "{\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": \"{\"}}]}",
    "{\"role\": \"assistant\", \"tool_calls\": [{\"function\": null}]}", "{\"role\": \"assistant\", \"tool_calls\": 3}",
    "{\"role\": \"tool\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}, {\"text\": 2}]}",
    "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"<think>\"}, 7]}",
    "{\"role\": 5}", "{\"role\": \"wizard\", \"content\": \"x\"}", "[]", "null", "\"s\"",
    "{\"role\": \"assistant\", \"content\": \"a</think>b\", \"reasoning_content\": 3}",
    "{\"role\": \"developer\", \"content\": \"\\u0000\", \"name\": [], \"tool_call_id\": {}}",
};
static const char *const JTOOLS[] = {
    "[]", "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}}]",
    "[{\"function\": 1}]", "[null]", "[{\"function\": {\"strict\": null, \"description\": [1e-7]}}]",
};
static const char *const JKW[] = {
    "{}", "{\"enable_thinking\": false}", "{\"enable_thinking\": [0]}", "{\"date_string\": 1}",
    "{\"date_string\": \"d\"}", "{\"custom_tools\": []}", "{\"messages\": 1}",
    "{\"tools_in_user_message\": 0.0}", "{\"a\\u0000b\": 1}",
};
#define COUNT(a) (sizeof a / sizeof *a)

static int one_json_render(const ig_chat_template *t) {
    char text[4096];
    size_t at = 0;
    text[at++] = '[';
    for (uint32_t k = rnd(5); k--;) {
        const char *m = JMSGS[rnd(COUNT(JMSGS))];
        at += (size_t)snprintf(text + at, sizeof text - at, "%s%s", at > 1 ? ", " : "", m);
    }
    text[at++] = ']';
    const char *tools = rnd(2) ? JTOOLS[rnd(COUNT(JTOOLS))] : NULL;
    const char *kw = rnd(2) ? JKW[rnd(COUNT(JKW))] : NULL;
    ig_json_error je;
    ig_json_doc *dm = ig_json_parse(text, at, NULL, &je);
    ig_json_doc *dt = tools ? ig_json_parse(tools, strlen(tools), NULL, &je) : NULL;
    ig_json_doc *dk = kw ? ig_json_parse(kw, strlen(kw), NULL, &je) : NULL;
    if (!dm || (tools && !dt) || (kw && !dk)) {
        fprintf(stderr, "a fixture does not parse: %s | %s | %s (%s)\n", text, tools, kw, je.message);
        abort();
    }
    ig_chat_output out;
    char err[200];
    int st = ig_chat_render_json(t, ig_json_root(dm), dt ? ig_json_root(dt) : NULL,
                                 dk ? ig_json_root(dk) : NULL, (int)rnd(2), &out, err, sizeof err);
    if (st == IG_CHAT_OK)
        check_output(&out);
    ig_chat_output_free(&out);
    ig_json_free(dm);
    ig_json_free(dt);
    ig_json_free(dk);
    return st;
}

static unsigned char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(n > 0 ? (size_t)n : 1);
    *len = fread(b, 1, (size_t)n, f);
    fclose(f);
    return b;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: chat_check RUNS SEED SECTION_FILE...\n");
        return 2;
    }
    long runs = atol(argv[1]);
    rng_state = strtoull(argv[2], NULL, 10);
    long ok = 0, failed = 0, json_ok = 0;
    for (int a = 3; a < argc; a++) {
        size_t len;
        unsigned char *sec = read_file(argv[a], &len);
        if (!sec) {
            fprintf(stderr, "cannot read %s\n", argv[a]);
            return 2;
        }
        char err[200];
        ig_chat_template *t = ig_chat_load(sec, len, err, sizeof err);
        if (!t) {
            fprintf(stderr, "%s: %s\n", argv[a], err);
            return 1;
        }
        for (long i = 0; i < runs; i++) {
            if (one_render(t) == IG_CHAT_OK)
                ok++;
            else
                failed++;
            json_ok += one_json_render(t) == IG_CHAT_OK;
        }
        ig_chat_template_free(t);
        /* damaged copies of the section: flipped bytes and truncations */
        unsigned char *copy = malloc(len + 1);
        for (long i = 0; i < runs; i++) {
            memcpy(copy, sec, len);
            size_t n = len;
            for (uint32_t k = rnd(4) + 1; k--;)
                copy[rnd((uint32_t)len)] ^= (unsigned char)(1u << rnd(8));
            if (rnd(2))
                n = rnd((uint32_t)len + 1);
            ig_chat_template *d = ig_chat_load(copy, n, err, sizeof err);
            if (d && rnd(2))
                one_render(d);
            ig_chat_template_free(d);
        }
        free(copy);
        free(sec);
    }
    printf("runs: %ld ok: %ld refused: %ld json ok: %ld\n", ok + failed, ok, failed, json_ok);
    return ok > 0 && failed > 0 && json_ok > 0 ? 0 : 1;
}
