/* complete.c — a streaming text completion from a model compiled by `ignis compile`:
 *
 *     ignis compile qwen2.5-coder-0.5b-instruct -o qwen
 *     cc complete.c -Iqwen -Lqwen -lignis_qwen2.5-coder-0.5b-instruct -Wl,-rpath,qwen -o complete
 *     ./complete qwen "def fibonacci(n):" 64
 *
 * The request is the OpenAI /v1/completions body; each chunk the library streams is printed as
 * a server-sent event line ("data: {...}"), then the whole response. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ignis_model.h"

static int on_chunk(const char *chunk_json, void *user) {
    (void)user;
    printf("data: %s\n", chunk_json);
    fflush(stdout);
    return 0;                                   /* nonzero would stop the generation */
}

/* s as a JSON string (quotes and escapes) appended to out */
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

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s DIR PROMPT [MAX_TOKENS]\n", argv[0]);
        return 2;
    }
    const int max_tokens = argc > 3 ? atoi(argv[3]) : 32;
    ignis_model *m = ignis_open(argv[1], NULL);
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

    char *prompt = json_string(argv[2]);
    const size_t cap = strlen(prompt) + strlen(name) + 128;
    char *request = malloc(cap);
    if (!prompt || !request) return 1;
    snprintf(request, cap, "{\"model\": \"%s\", \"prompt\": %s, \"max_tokens\": %d, \"temperature\": 0, "
             "\"stream\": true}", name, prompt, max_tokens);
    char *response = ignis_completions(m, request, on_chunk, NULL);
    int rc = 0;
    if (!response) {
        fprintf(stderr, "ignis_completions: %s\n", ignis_last_error());
        rc = 1;
    } else {
        printf("response: %s\n", response);
        rc = strstr(response, "{\"error\"") == response;
    }
    ignis_free(response);
    free(prompt);
    free(request);
    ignis_close(m);
    return rc;
}
