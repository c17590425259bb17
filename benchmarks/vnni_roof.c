/* vnni_roof.c — the compute roof the integer and bf16 GEMMs work against: how many dot-product
 * instructions one core retires per second with every operand in registers (so in L1 at worst).
 * Built by bench_kernels.py --roof with the host compiler (-O2 -march=native: a measurement, not a
 * wheel). The loops are inline assembly so the compiler can neither fold nor reorder them: 12
 * independent accumulators (more than latency x throughput of any of these on current cores), 8
 * steps of 12 instructions per iteration. */
#include <pthread.h>
#include <stdint.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

#define IG_R12(op) \
    op " %%zmm13, %%zmm14, %%zmm0\n\t" op " %%zmm13, %%zmm14, %%zmm1\n\t"     \
    op " %%zmm13, %%zmm14, %%zmm2\n\t" op " %%zmm13, %%zmm14, %%zmm3\n\t"     \
    op " %%zmm13, %%zmm14, %%zmm4\n\t" op " %%zmm13, %%zmm14, %%zmm5\n\t"     \
    op " %%zmm13, %%zmm14, %%zmm6\n\t" op " %%zmm13, %%zmm14, %%zmm7\n\t"     \
    op " %%zmm13, %%zmm14, %%zmm8\n\t" op " %%zmm13, %%zmm14, %%zmm9\n\t"     \
    op " %%zmm13, %%zmm14, %%zmm10\n\t" op " %%zmm13, %%zmm14, %%zmm11\n\t"
#define IG_R96(op) IG_R12(op) IG_R12(op) IG_R12(op) IG_R12(op) IG_R12(op) IG_R12(op) IG_R12(op) IG_R12(op)
#define IG_CLOBBER "zmm0", "zmm1", "zmm2", "zmm3", "zmm4", "zmm5", "zmm6", "zmm7", "zmm8", "zmm9", \
                   "zmm10", "zmm11", "zmm13", "zmm14", "memory"

/* iters x 96 instructions of kind `which`: 0 vpdpbusd, 1 vpdpwssd, 2 vdpbf16ps (512-bit) */
static void run(int which, long iters) {
    __asm__ volatile("vpxord %%zmm13, %%zmm13, %%zmm13\n\tvpxord %%zmm14, %%zmm14, %%zmm14" ::: IG_CLOBBER);
    for (long i = 0; i < iters; i++) {
        if (which == 0) __asm__ volatile(IG_R96("vpdpbusd") ::: IG_CLOBBER);
        else if (which == 1) __asm__ volatile(IG_R96("vpdpwssd") ::: IG_CLOBBER);
        else __asm__ volatile(IG_R96("vdpbf16ps") ::: IG_CLOBBER);
    }
}

typedef struct {
    int which;
    long iters;
    pthread_barrier_t *bar;
    double secs;
} job_t;

static void *worker(void *p) {
    job_t *j = p;
    run(j->which, j->iters / 10);            /* warm up: clocks up, code in cache */
    pthread_barrier_wait(j->bar);
    const double t = now();
    run(j->which, j->iters);
    j->secs = now() - t;
    return NULL;
}

/* Instructions per second per thread (the slowest thread's rate) with n_threads threads each
 * running `iters` x 96 instructions of kind `which` at once. */
double roof_insn_per_s(int which, long iters, int n_threads) {
    pthread_t th[64];
    job_t jobs[64];
    pthread_barrier_t bar;
    if (n_threads < 1 || n_threads > 64) return -1.0;
    pthread_barrier_init(&bar, NULL, (unsigned)n_threads);
    for (int i = 0; i < n_threads; i++) {
        jobs[i] = (job_t){which, iters, &bar, 0.0};
        pthread_create(&th[i], NULL, worker, &jobs[i]);
    }
    double worst = 0.0;
    for (int i = 0; i < n_threads; i++) {
        pthread_join(th[i], NULL);
        if (jobs[i].secs > worst) worst = jobs[i].secs;
    }
    pthread_barrier_destroy(&bar);
    return (double)iters * 96.0 / worst;
}
