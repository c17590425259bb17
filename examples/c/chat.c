/* chat.c — a streaming chat with a model compiled by `ignis compile`:
 *
 *     ignis compile qwen2.5-coder-0.5b-instruct -o qwen
 *     cc chat.c -Iqwen -Lqwen -lignis_qwen2.5-coder-0.5b-instruct -Wl,-rpath,qwen -o chat
 *     ./chat qwen system "Be brief." user "Write a haiku about C."
 *     ./chat -n 64 qwen user "hi" assistant "Hello!" user "Who are you?"
 *     ./chat -x '"logit_bias": {"198": -100}' qwen user "One line, please."
 *
 * The conversation is given as ROLE CONTENT pairs; the request is the OpenAI
 * /v1/chat/completions body (greedy: temperature 0; -n caps the answer's tokens; -x adds request
 * fields, written as JSON object members). The answer's text is printed as the library streams
 * it: each chunk's delta.content, read from its JSON. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ignis_model.h"

/* s as a JSON string (quotes and escapes); malloc'd */
static char *json_string(const char *s) {
    char *out = malloc(strlen(s) * 6 + 3), *o = out;
    if (!out) return NULL;
    *o++ = '"';
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') *o++ = '\\', *o++ = (char)*p;
        else if (*p < 0x20) o += sprintf(o, "\\u%04x", *p);
        else *o++ = (char)*p;
    }
    *o++ = '"';
    *o = 0;
    return out;
}

static int hex4(const char *p, unsigned *v) {
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return 0;
        *v = *v * 16 + (unsigned)d;
    }
    return 1;
}

static void put_utf8(unsigned cp, FILE *f) {
    if (cp < 0x80) fputc((int)cp, f);
    else if (cp < 0x800) fputc(0xc0 | (int)(cp >> 6), f), fputc(0x80 | (int)(cp & 0x3f), f);
    else if (cp < 0x10000)
        fputc(0xe0 | (int)(cp >> 12), f), fputc(0x80 | (int)((cp >> 6) & 0x3f), f),
        fputc(0x80 | (int)(cp & 0x3f), f);
    else
        fputc(0xf0 | (int)(cp >> 18), f), fputc(0x80 | (int)((cp >> 12) & 0x3f), f),
        fputc(0x80 | (int)((cp >> 6) & 0x3f), f), fputc(0x80 | (int)(cp & 0x3f), f);
}

/* Print the JSON string starting at p (its opening quote), unescaped. Returns 0 if malformed. */
static int print_json_string(const char *p, FILE *f) {
    if (*p++ != '"') return 0;
    while (*p && *p != '"') {
        if (*p != '\\') { fputc(*p++, f); continue; }
        p++;
        unsigned cp, lo;
        switch (*p) {
        case 'n': fputc('\n', f); break;
        case 't': fputc('\t', f); break;
        case 'r': fputc('\r', f); break;
        case 'b': fputc('\b', f); break;
        case 'f': fputc('\f', f); break;
        case 'u':
            if (!hex4(p + 1, &cp)) return 0;
            p += 4;
            if (cp >= 0xd800 && cp < 0xdc00 && p[1] == '\\' && p[2] == 'u' && hex4(p + 3, &lo)
                && lo >= 0xdc00 && lo < 0xe000) {
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                p += 6;
            }
            put_utf8(cp, f);
            break;
        case 0: return 0;
        default: fputc(*p, f);                  /* \" \\ \/ */
        }
        p++;
    }
    return *p == '"';
}

/* A "chat.completion.chunk": print its delta's content, if it has text. */
static int on_chunk(const char *chunk_json, void *user) {
    (void)user;
    const char *delta = strstr(chunk_json, "\"delta\"");
    const char *at = delta ? strstr(delta, "\"content\"") : NULL;
    if (at) {
        at += strlen("\"content\"");
        while (*at == ' ' || *at == ':') at++;
        if (*at == '"' && !print_json_string(at, stdout)) {
            fprintf(stderr, "chat: a chunk's content is not a JSON string: %s\n", chunk_json);
            return 1;                           /* nonzero stops the generation */
        }
        fflush(stdout);
    }
    return 0;
}

int main(int argc, char **argv) {
    int max_tokens = 128, a = 1;
    const char *extra = NULL;
    for (; a + 1 < argc && argv[a][0] == '-'; a += 2) {
        if (strcmp(argv[a], "-n") == 0) max_tokens = atoi(argv[a + 1]);
        else if (strcmp(argv[a], "-x") == 0) extra = argv[a + 1];
        else break;
    }
    if (argc - a < 3 || (argc - a - 1) % 2 != 0 || max_tokens < 1) {
        fprintf(stderr, "usage: %s [-n MAX_TOKENS] [-x '\"FIELD\": VALUE, ...'] DIR ROLE CONTENT "
                "[ROLE CONTENT ...]\n", argv[0]);
        return 2;
    }
    ignis_model *m = ignis_open(argv[a], NULL);
    if (!m) {
        fprintf(stderr, "ignis_open: %s\n", ignis_last_error());
        return 1;
    }
    /* the model's name, from ignis_model_info's "compiled" object */
    char *info = ignis_model_info(m);
    const char *at = info ? strstr(info, "\"model\": \"") : NULL;
    char name[256] = "";
    if (at) sscanf(at + 10, "%255[^\"]", name);
    ignis_free(info);

    /* {"model": ..., "messages": [{"role": ..., "content": ...}, ...], ...} */
    size_t cap = strlen(name) + (extra ? strlen(extra) : 0) + 256;
    for (int i = a + 1; i < argc; i++) cap += strlen(argv[i]) * 6 + 32;
    char *request = malloc(cap);
    if (!request) return 1;
    size_t n = (size_t)snprintf(request, cap, "{\"model\": \"%s\", \"messages\": [", name);
    for (int i = a + 1; i < argc; i += 2) {
        char *role = json_string(argv[i]), *content = json_string(argv[i + 1]);
        if (!role || !content) return 1;
        n += (size_t)snprintf(request + n, cap - n, "%s{\"role\": %s, \"content\": %s}",
                              i > a + 1 ? ", " : "", role, content);
        free(role);
        free(content);
    }
    snprintf(request + n, cap - n, "], \"max_tokens\": %d, \"temperature\": 0, \"stream\": true%s%s}",
             max_tokens, extra ? ", " : "", extra ? extra : "");

    char *response = ignis_chat_completions(m, request, on_chunk, NULL);
    int rc = 0;
    if (!response) {
        fprintf(stderr, "ignis_chat_completions: %s\n", ignis_last_error());
        rc = 1;
    } else if (strncmp(response, "{\"error\"", 8) == 0) {
        fprintf(stderr, "ignis_chat_completions: %s\n", response);
        rc = 1;
    } else {
        printf("\n");
    }
    ignis_free(response);
    free(request);
    ignis_close(m);
    return rc;
}
