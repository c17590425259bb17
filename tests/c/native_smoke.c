/* native_smoke.c — a C program using a compiled model (ignis compile) through ignis_model.h only:
 * no Python, run by tests/test_native_compile.py with an empty environment.
 * usage: native_smoke DIR MAX_NEW ID [ID...]; prints "abi N" and then the greedy ids on one line,
 * or the library's error on stderr (exit 1). */
#include <stdio.h>
#include <stdlib.h>

#include "ignis_model.h"

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: native_smoke DIR MAX_NEW ID [ID...]\n");
        return 2;
    }
    const int max_new = atoi(argv[2]), n_prompt = argc - 3;
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)n_prompt);
    int32_t *out = malloc(sizeof(int32_t) * (size_t)(max_new > 0 ? max_new : 1));
    if (!prompt || !out) return 2;
    for (int i = 0; i < n_prompt; i++) prompt[i] = (int32_t)atoi(argv[3 + i]);
    printf("abi %d\n", ignis_abi_version());
    int status = 1;
    ignis_model *m = ignis_open(argv[1], NULL);
    if (!m) {
        fprintf(stderr, "ignis_open: %s\n", ignis_last_error());
    } else {
        const int n = ignis_generate_ids(m, prompt, n_prompt, max_new, out, max_new);
        if (n < 0) {
            fprintf(stderr, "ignis_generate_ids: %s\n", ignis_last_error());
        } else {
            for (int i = 0; i < n; i++) printf(i ? " %d" : "%d", (int)out[i]);
            printf("\n");
            status = 0;
        }
        ignis_close(m);
    }
    free(prompt);
    free(out);
    return status;
}
