/* read_bw.c — how fast this machine streams memory into the cores: the bound decode works against.
 * Built by bench_threads.py with the host compiler (-O3 -march=native: a measurement, not a wheel).
 * Each thread reads its own contiguous slice as 4 interleaved streams with 64-byte loads and
 * software prefetch a few KB ahead, and XORs everything so nothing is optimised away. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef long long v8 __attribute__((vector_size(64)));

typedef struct {
    const char *p;
    size_t n;
    v8 sink;
    pthread_barrier_t *bar;
    int reps;
    double best;
} slice_t;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static v8 read_slice(const char *p, size_t n) {
    const size_t q = n / 4 / 256 * 256;   /* 4 streams, each a whole number of 256-byte steps */
    v8 a = {0}, b = {0}, c = {0}, d = {0};
    for (size_t i = 0; i < q; i += 256) {
        for (int s = 0; s < 4; s++) __builtin_prefetch(p + s * q + i + 4096, 0, 0);
        for (int k = 0; k < 256; k += 64) {
            a ^= *(const v8 *)(p + i + k);
            b ^= *(const v8 *)(p + q + i + k);
            c ^= *(const v8 *)(p + 2 * q + i + k);
            d ^= *(const v8 *)(p + 3 * q + i + k);
        }
    }
    return a ^ b ^ c ^ d;
}

static void *run(void *arg) {
    slice_t *s = arg;
    for (int r = 0; r < s->reps; r++) {
        pthread_barrier_wait(s->bar);
        s->sink ^= read_slice(s->p, s->n);
        pthread_barrier_wait(s->bar);
    }
    return NULL;
}

/* The best GB/s over `reps` passes of `threads` threads over `bytes` (64-byte aligned). The caller
 * reads the first slice itself, between the two barriers it times: with one more thread than
 * cores (a caller only waiting, as before), the caller was often not running when the workers
 * started, so its clock started late; on 2 cores a pass now and then took "microseconds" and the
 * best of 5 reported 60-120+ GB/s (or TB/s) where the passes timed right give ~50-55. */
double read_gbps(const void *buf, size_t bytes, int threads, int reps) {
    if (threads < 1) threads = 1;
    if (threads > 64) threads = 64;
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)threads);
    slice_t s[64];
    pthread_t th[64];
    const size_t per = bytes / (size_t)threads / 1024 * 1024;
    for (int t = 0; t < threads; t++) {
        s[t] = (slice_t){(const char *)buf + (size_t)t * per, per, {0}, &bar, reps, 0};
        if (t > 0) pthread_create(&th[t], NULL, run, &s[t]);
    }
    double best = 0;
    for (int r = 0; r < reps; r++) {
        pthread_barrier_wait(&bar);
        const double t0 = now();
        s[0].sink ^= read_slice(s[0].p, s[0].n);
        pthread_barrier_wait(&bar);
        const double gbps = (double)per * threads / (now() - t0) / 1e9;
        if (gbps > best) best = gbps;
    }
    for (int t = 1; t < threads; t++) pthread_join(th[t], NULL);
    pthread_barrier_destroy(&bar);
    volatile long long keep = s[0].sink[0];
    (void)keep;
    return best;
}
