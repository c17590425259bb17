/* cpu_pair.c — where the host has put this guest's two vCPUs, and what two threads can read there.
 *
 *     gcc -O2 -march=native -pthread benchmarks/cpu_pair.c -o /tmp/cpu_pair && /tmp/cpu_pair [seconds]
 *
 * A measurement tool, not part of ignis. Every ~60 ms it prints one line: the round trip of a
 * cache line between a thread pinned to CPU 0 and one pinned to CPU 1 (ns), and the read bandwidth
 * of one thread and of both (GB/s, 256 MB of huge pages, each thread its half). On the 2-vCPU EPYC
 * KVM guest of benchmarks/RESULTS.md the round trip is ~80-140 ns while the host runs both vCPUs on
 * one CCD (one L3, one link to memory: ~50 GB/s for two threads) and ~380-470 ns while it runs
 * them on two (~65-85 GB/s); the host moves them every few seconds, whatever the guest runs, so a
 * decode's 2-thread speed is bimodal by process. "near" / "far" at the end of a line says which. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

typedef long long v8 __attribute__((vector_size(64)));

#define BUF_BYTES ((size_t)256 << 20)
#define PINGS 20000

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

static _Alignas(64) _Atomic int flag;
static pthread_barrier_t bar;
static const char *buf;
static double secs_of[2];
static volatile int mode;            /* what both threads do next: 0 ping-pong, 1 read, -1 stop */
static volatile v8 sink;

/* XOR of n bytes at p, 256 bytes a step, prefetched 4 KB ahead */
static v8 read_bytes(const char *p, size_t n) {
    v8 a = {0}, b = {0}, c = {0}, d = {0};
    for (size_t i = 0; i < n; i += 256) {
        __builtin_prefetch(p + i + 4096, 0, 0);
        __builtin_prefetch(p + i + 4096 + 128, 0, 0);
        a ^= *(const v8 *)(p + i);
        b ^= *(const v8 *)(p + i + 64);
        c ^= *(const v8 *)(p + i + 128);
        d ^= *(const v8 *)(p + i + 192);
    }
    return a ^ b ^ c ^ d;
}

static void work(int id) {
    if (mode == 0) {
        const double t = now();
        for (int i = 0; i < PINGS; i++) {
            if (id == 0) {
                atomic_store(&flag, 1);
                while (atomic_load(&flag) != 0) {}
            } else {
                while (atomic_load(&flag) != 1) {}
                atomic_store(&flag, 0);
            }
        }
        secs_of[id] = now() - t;
    } else {
        const double t = now();
        sink = read_bytes(buf + id * (BUF_BYTES / 2), BUF_BYTES / 2);
        secs_of[id] = now() - t;
    }
}

static void *second(void *arg) {
    (void)arg;
    pin(1);
    for (;;) {
        pthread_barrier_wait(&bar);
        if (mode < 0) return NULL;
        work(1);
        pthread_barrier_wait(&bar);
    }
}

static void both(int m) {
    mode = m;
    pthread_barrier_wait(&bar);
    work(0);
    pthread_barrier_wait(&bar);
}

int main(int argc, char **argv) {
    const double secs = argc > 1 ? atof(argv[1]) : 10.0;
    pin(0);
    char *b = aligned_alloc((size_t)2 << 20, BUF_BYTES);
    if (!b) return 1;
    madvise(b, BUF_BYTES, MADV_HUGEPAGE);
    memset(b, 1, BUF_BYTES);
    buf = b;
    pthread_barrier_init(&bar, NULL, 2);
    pthread_t t;
    if (pthread_create(&t, NULL, second, NULL) != 0) return 1;
    const double t0 = now();
    while (now() - t0 < secs) {
        both(0);
        const double rt = secs_of[0] / PINGS * 1e9;
        double t1 = now();
        sink = read_bytes(buf, BUF_BYTES / 2);
        const double one = BUF_BYTES / 2 / (now() - t1) / 1e9;
        both(1);
        const double two = BUF_BYTES / (secs_of[0] > secs_of[1] ? secs_of[0] : secs_of[1]) / 1e9;
        printf("%7.2f s  round trip %5.0f ns  read 1 thread %5.1f GB/s  2 threads %5.1f GB/s  %s\n",
               now() - t0, rt, one, two, rt < 250 ? "near" : "far");
        fflush(stdout);
    }
    mode = -1;
    pthread_barrier_wait(&bar);
    pthread_join(t, NULL);
    free(b);
    return 0;
}
