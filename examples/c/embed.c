/* embed.c — sentence embeddings from a model compiled by `ignis compile`, and how alike they are:
 *
 *     ignis compile qwen2.5-coder-0.5b-instruct -o qwen
 *     cc embed.c -Iqwen -Lqwen -lignis_qwen2.5-coder-0.5b-instruct -Wl,-rpath,qwen -lm -o embed
 *     ./embed qwen "sort a list" "order the items of an array" "the weather in Paris"
 *
 * The request is the OpenAI /v1/embeddings body with every TEXT as one input; the response's
 * vectors (unit length, the mean of the last hidden states, as `ignis serve` answers) are read
 * back from its JSON. Printed: each input's dimension and first values, then the cosine
 * similarity of every pair (the dot product of unit vectors). */
#include <math.h>
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

/* The numbers of the `index`-th "embedding": [...] array of the response, malloc'd; *n gets how
 * many. The library writes each data item as {"object":"embedding","index":i,"embedding":[...]}
 * in index order. */
static double *read_vector(const char *response, int index, int *n) {
    const char *at = response;
    for (int i = 0; i <= index;) {
        at = strstr(at, "\"embedding\"");
        if (!at) return NULL;
        at += strlen("\"embedding\"");
        at += strspn(at, " :");
        if (*at == '[') at++, i++;           /* the key, not the value of "object" */
    }
    int cap = 256, k = 0;
    double *v = malloc(sizeof *v * (size_t)cap);
    while (v && *at && *at != ']') {
        char *end;
        const double x = strtod(at, &end);
        if (end == at) break;
        if (k == cap) {
            double *grown = realloc(v, sizeof *v * (size_t)(cap *= 2));
            if (!grown) {
                free(v);
                return NULL;
            }
            v = grown;
        }
        v[k++] = x;
        at = end + strspn(end, ", ");
    }
    *n = k;
    return v;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s DIR TEXT [TEXT ...]\n", argv[0]);
        return 2;
    }
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

    const int n_texts = argc - 2;
    size_t cap = strlen(name) + 64;
    for (int i = 2; i < argc; i++) cap += strlen(argv[i]) * 6 + 4;
    char *request = malloc(cap);
    if (!request) return 1;
    size_t len = (size_t)snprintf(request, cap, "{\"model\": \"%s\", \"input\": [", name);
    for (int i = 2; i < argc; i++) {
        char *text = json_string(argv[i]);
        if (!text) return 1;
        len += (size_t)snprintf(request + len, cap - len, "%s%s", i > 2 ? ", " : "", text);
        free(text);
    }
    snprintf(request + len, cap - len, "]}");

    char *response = ignis_embeddings(m, request);
    free(request);
    int rc = 0;
    if (!response) {
        fprintf(stderr, "ignis_embeddings: %s\n", ignis_last_error());
        ignis_close(m);
        return 1;
    }
    if (strstr(response, "{\"error\"") == response) {
        fprintf(stderr, "%s\n", response);
        rc = 1;
    }
    double **vec = calloc((size_t)n_texts, sizeof *vec);
    if (!vec) rc = 1;
    int dim = 0;
    for (int i = 0; !rc && i < n_texts; i++) {
        int n = 0;
        vec[i] = read_vector(response, i, &n);
        if (!vec[i] || n < 3 || (i && n != dim)) {
            fprintf(stderr, "the response has no embedding %d\n", i);
            rc = 1;
            break;
        }
        dim = n;
        printf("embedding %d: dim %d, first values %.6f %.6f %.6f\n", i, dim, vec[i][0], vec[i][1],
               vec[i][2]);
    }
    for (int i = 0; !rc && i < n_texts; i++)
        for (int j = i + 1; j < n_texts; j++) {
            double dot = 0, ni = 0, nj = 0;
            for (int k = 0; k < dim; k++)
                dot += vec[i][k] * vec[j][k], ni += vec[i][k] * vec[i][k], nj += vec[j][k] * vec[j][k];
            printf("similarity %d %d: %.6f\n", i, j, dot / sqrt(ni * nj));
        }
    for (int i = 0; vec && i < n_texts; i++) free(vec[i]);
    free(vec);
    ignis_free(response);
    ignis_close(m);
    return rc;
}
