/* threads.c — the persistent worker pool behind ig_parallel and IG_FOR (threads.h).
 *
 * One pool per process, started on the first job that wants more than one thread and grown to
 * the largest count asked for since. A job is published by bumping `gen`; workers notice it
 * while they spin (a decode step's ops come microseconds apart, so they stay awake through a
 * step), or are woken from a condition variable after IG_SPIN_NS of spinning, which is what lets
 * other programs have the core between steps. The caller runs its share of the job, then waits
 * for the workers the same way.
 *
 * A busy computer: a worker that shares its core with another process is descheduled for a
 * scheduler slice (milliseconds) now and then, and the job it holds a chunk of waits for it: with
 * a busy loop on one of two cores, two threads decoded at half the speed of one. So the caller
 * times each join; when it waited on a worker longer than its own share took (and more than
 * IG_LATE_NS) three times within a few
 * dozen jobs, the next IG_BACKOFF_JOBS jobs run on one thread fewer (doubling while it repeats,
 * up to IG_BACKOFF_MAX), then the full count is tried again. Results never depend on it (IG_FOR
 * gives every index the same computation on any thread). */
#if defined(__linux__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE 1      /* sched_getaffinity, CPU_COUNT */
#endif
#include "threads.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(_WIN32)
#define IG_NO_PTHREADS 1
#else
#include <pthread.h>
#include <sched.h>
#include <unistd.h>
#endif

/* a spin-wait hint (plain asm: no ISA headers outside csrc/arch/) */
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define IG_PAUSE() __asm__ __volatile__("pause")
#elif defined(__aarch64__) && defined(__GNUC__)
#define IG_PAUSE() __asm__ __volatile__("yield")
#else
#define IG_PAUSE() ((void)0)
#endif

#define IG_SPIN_NS 200000         /* spin this long for the next job / the workers, then sleep */
#define IG_LATE_NS 100000         /* and at least this long */
#define IG_BACKOFF_JOBS 512       /* ~3 decode tokens of a 0.5B model */
#define IG_BACKOFF_MAX 65536

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

typedef struct {
    ig_job_fn        fn;
    void            *ctx;
    int              n_threads;     /* taking part: the caller (index 0) and workers 1..n-1 */
    _Alignas(64) _Atomic int64_t next;   /* IG_FOR: the first index not handed out yet (own line) */
    char             pad[56];
} job_t;

static _Thread_local job_t *tl_job;     /* the job this thread is running, or NULL */
static _Thread_local int tl_index;

/* ---- IG_FOR -------------------------------------------------------------------------------- */

ig_for_iter ig_for_begin(int64_t n, int share) {
    ig_for_iter it = {-1, 0, n, NULL};
    job_t *j = tl_job;
    if (!j || j->n_threads <= 1 || !share) {
        if (!j || tl_index == 0) it.hi = n;     /* alone, or the job's first thread does it all */
    } else {
        it.job = j;
    }
    return it;
}

int ig_for_claim(ig_for_iter *it) {
    job_t *j = it->job;
    if (!j) return 0;
    /* guided chunks: half per thread of what is left, so the first ones are long runs (the
     * hardware prefetchers like those), the last ones single indices, and the threads finish
     * together even when one of them runs slower */
    int64_t cur = atomic_load_explicit(&j->next, memory_order_relaxed), chunk;
    do {
        if (cur >= it->n) return 0;
        chunk = (it->n - cur) / (2 * (int64_t)j->n_threads);
        if (chunk < 1) chunk = 1;
    } while (!atomic_compare_exchange_weak_explicit(&j->next, &cur, cur + chunk,
                                                    memory_order_relaxed, memory_order_relaxed));
    it->i = cur;
    it->hi = cur + chunk;
    return 1;
}

#ifdef IG_NO_PTHREADS

void ig_parallel(int n_threads, ig_job_fn fn, void *ctx) {
    (void)n_threads;
    fn(ctx);
}

void ig_pool_get_stats(ig_pool_stats *out) {
    memset(out, 0, sizeof *out);
    out->threads_now = 1;
}

int ig_cpus_available(void) { return 1; }

#else

/* ---- the pool ------------------------------------------------------------------------------ */

static struct {
    pthread_mutex_t  run;           /* one job at a time; held by the caller of the running job */
    pthread_mutex_t  lock;          /* the sleepers' condition variables */
    pthread_cond_t   wake_workers, wake_caller;
    pthread_t        th[IG_MAX_THREADS];
    uint64_t         start_gen[IG_MAX_THREADS];
    int              n_workers;
    job_t            job;
    /* what the waiting threads spin on, each in its own cache line, apart from the claims */
    _Alignas(64) _Atomic uint64_t gen;   /* per job: its number * 512 + its thread count */
    _Alignas(64) _Atomic int pending;    /* workers of the current job not done yet */
    _Alignas(64) int unused;
    _Atomic int      sleeping_workers, caller_sleeping;
    /* backoff: see the top of this file */
    int              late_recent, jobs_since_late, reduce, backoff, backoff_left;
    int64_t          jobs, reduced_jobs, late_joins;
} P = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
       PTHREAD_COND_INITIALIZER};

static void *worker_main(void *arg) {
    const int index = (int)(intptr_t)arg;
    uint64_t seen = P.start_gen[index];   /* the job count when it was started, not when it runs */
    for (;;) {
        /* wait for a job newer than the last one seen: spin, then sleep */
        uint64_t g;
        const int64_t t0 = now_ns();
        for (int k = 0; (g = atomic_load_explicit(&P.gen, memory_order_acquire)) == seen; k++) {
            IG_PAUSE();
            if ((k & 255) == 255 && now_ns() - t0 > IG_SPIN_NS) {
                pthread_mutex_lock(&P.lock);
                atomic_fetch_add(&P.sleeping_workers, 1);
                while ((g = atomic_load(&P.gen)) == seen) pthread_cond_wait(&P.wake_workers, &P.lock);
                atomic_fetch_sub(&P.sleeping_workers, 1);
                pthread_mutex_unlock(&P.lock);
                break;
            }
        }
        seen = g;
        job_t *j = &P.job;
        /* the thread count from the same word: a later job's may already be in j */
        if (index >= (int)(g % 512)) continue;    /* not part of this job */
        tl_job = j;
        tl_index = index;
        j->fn(j->ctx);
        tl_job = NULL;
        if (atomic_fetch_sub(&P.pending, 1) == 1 &&
            atomic_load(&P.caller_sleeping)) {
            pthread_mutex_lock(&P.lock);
            pthread_cond_signal(&P.wake_caller);
            pthread_mutex_unlock(&P.lock);
        }
    }
    return NULL;
}

/* Start workers up to n - 1; returns how many threads a job can have (1 when none could start). */
static int grow(int n) {
    while (P.n_workers < n - 1) {
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, 1 << 20);   /* kernels keep a head's floats on the stack */
        P.start_gen[P.n_workers + 1] = atomic_load(&P.gen);
        const int ok = pthread_create(&P.th[P.n_workers], &attr, worker_main,
                                      (void *)(intptr_t)(P.n_workers + 1)) == 0;
        pthread_attr_destroy(&attr);
        if (!ok) break;
        pthread_detach(P.th[P.n_workers]);
        P.n_workers++;
    }
    return P.n_workers + 1 < n ? P.n_workers + 1 : n;
}

/* After a join: count late ones and set how many threads the next jobs get. */
static void after_join(int late) {
    if (P.backoff_left > 0 && --P.backoff_left == 0) P.reduce = 0;   /* try the full count again */
    if (late) {
        P.late_joins++;
        P.late_recent++;
        P.jobs_since_late = 0;
    } else if (++P.jobs_since_late > 64) {
        P.late_recent = 0;
        if (P.backoff > IG_BACKOFF_JOBS && P.backoff_left == 0) P.backoff /= 2;
    }
    if (P.late_recent >= 3) {
        P.late_recent = 0;
        P.backoff = P.backoff ? (P.backoff < IG_BACKOFF_MAX ? 2 * P.backoff : P.backoff)
                              : IG_BACKOFF_JOBS;
        P.reduce++;
        P.backoff_left = P.backoff;
    }
}

void ig_parallel(int n_threads, ig_job_fn fn, void *ctx) {
    if (n_threads > IG_MAX_THREADS) n_threads = IG_MAX_THREADS;
    if (n_threads <= 1 || tl_job || pthread_mutex_trylock(&P.run) != 0) {
        fn(ctx);        /* alone: no job, so its IG_FOR loops run whole */
        return;
    }
    int n = grow(n_threads);
    if (P.reduce) {
        n -= P.reduce;
        if (n < 1) n = 1;
        P.reduced_jobs++;
    }
    if (n <= 1) {
        fn(ctx);
        after_join(0);
        pthread_mutex_unlock(&P.run);
        return;
    }
    P.jobs++;
    job_t *j = &P.job;
    j->fn = fn;
    j->ctx = ctx;
    j->n_threads = n;
    atomic_store_explicit(&j->next, 0, memory_order_relaxed);
    atomic_store_explicit(&P.pending, n - 1, memory_order_relaxed);
    const uint64_t g = atomic_load_explicit(&P.gen, memory_order_relaxed);
    /* seq_cst: either a sleeper sees it, or we see the sleeper */
    atomic_store(&P.gen, (g / 512 + 1) * 512 + (uint64_t)n);
    if (atomic_load(&P.sleeping_workers)) {
        pthread_mutex_lock(&P.lock);
        pthread_cond_broadcast(&P.wake_workers);
        pthread_mutex_unlock(&P.lock);
    }
    tl_job = j;
    tl_index = 0;
    const int64_t t_own = now_ns();
    fn(ctx);
    tl_job = NULL;
    /* the join: late when the caller waits longer than its own share took (dynamic chunks keep
     * that short unless a worker is not running), and more than IG_LATE_NS */
    const int64_t t0 = now_ns(), own = t0 - t_own;
    int late = 0;
    for (int k = 0; atomic_load_explicit(&P.pending, memory_order_acquire) > 0; k++) {
        IG_PAUSE();
        if ((k & 255) == 255) {
            const int64_t waited = now_ns() - t0;
            if (waited > IG_LATE_NS && waited > own) late = 1;
            if (waited > IG_SPIN_NS) {
                pthread_mutex_lock(&P.lock);
                atomic_store(&P.caller_sleeping, 1);
                while (atomic_load(&P.pending) > 0) pthread_cond_wait(&P.wake_caller, &P.lock);
                atomic_store(&P.caller_sleeping, 0);
                pthread_mutex_unlock(&P.lock);
                const int64_t w = now_ns() - t0;
                late = w > IG_LATE_NS && w > own;
                break;
            }
        }
    }
    after_join(late);
    pthread_mutex_unlock(&P.run);
}

void ig_pool_get_stats(ig_pool_stats *out) {
    pthread_mutex_lock(&P.run);
    out->jobs = P.jobs;
    out->reduced_jobs = P.reduced_jobs;
    out->late_joins = P.late_joins;
    out->workers = P.n_workers;
    out->threads_now = P.n_workers + 1 - P.reduce > 1 ? P.n_workers + 1 - P.reduce : 1;
    pthread_mutex_unlock(&P.run);
}

int ig_cpus_available(void) {
#if defined(__linux__)
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        const int n = CPU_COUNT(&set);
        if (n >= 1) return n;
    }
#endif
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n >= 1 ? (int)n : 1;
}

#endif
