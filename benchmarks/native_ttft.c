/* native_ttft.c — benchmarks/bench_native.py's C side: open a compiled model and produce the first
 * greedy token, then optionally decode, printing what it took.
 * usage: native_ttft DIR MAX_NEW ID [ID...]
 * prints "first ID open_ms X first_ms Y" as soon as the first token exists, then with MAX_NEW > 1
 * "decode N ms Z": N ids decoded in Z ms after the first (a warm call for 1 id and one for
 * MAX_NEW ids from the same prompt; Z is their difference, so the prefill cancels). */
#define _POSIX_C_SOURCE 200112L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "ignis_model.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int main(int argc, char **argv) {
    if (argc < 4) return 2;
    const int max_new = atoi(argv[2]), n = argc - 3;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n), *out = malloc(sizeof(int32_t) * (size_t)(max_new + 1));
    for (int i = 0; i < n; i++) ids[i] = atoi(argv[3 + i]);
    const double t0 = now_ms();
    ignis_model *m = ignis_open(argv[1], NULL);
    if (!m) {
        fprintf(stderr, "%s\n", ignis_last_error());
        return 1;
    }
    const double t1 = now_ms();
    if (ignis_generate_ids(m, ids, n, 1, out, 1) < 1) {
        fprintf(stderr, "no token: %s\n", ignis_last_error());
        return 1;
    }
    const double t2 = now_ms();
    printf("first %d open_ms %.1f first_ms %.1f\n", (int)out[0], t1 - t0, t2 - t1);
    fflush(stdout);
    if (max_new > 1) {
        const double t3 = now_ms();
        ignis_generate_ids(m, ids, n, 1, out, 1);
        const double t4 = now_ms();
        const int k = ignis_generate_ids(m, ids, n, max_new, out, max_new);
        printf("decode %d ms %.1f\n", k - 1, (now_ms() - t4) - (t4 - t3));
    }
    ignis_close(m);
    return 0;
}
