/* threads.h — how a kernel runs on several cores: one persistent pool of workers, and IG_FOR.
 *
 * ig_parallel(n, fn, ctx) runs fn(ctx) on n threads at once, the caller being one of them (a
 * kernel call is one such job; the executor makes one per parallel op). Inside, a kernel's one
 * parallel loop is written
 *     IG_FOR(b, n_blocks) { ... }                     (was: #pragma omp parallel for + for (...))
 *     IG_FOR_IF(t, T, T * dim >= IG_ROWS_PAR_MIN) ... (shared only when worth it, else one thread)
 * and its indices are handed out in dynamic chunks, so a thread that is slow or descheduled takes
 * fewer of them. Each index is one unit of output computed by one thread in one order, so the
 * result does not depend on which thread took it, nor on the thread count. Outside a job (a
 * direct call, or n = 1) IG_FOR is a plain loop. Everything else in a kernel runs on every thread
 * of the job, so it must be pure (sizes, pointers): one IG_FOR per kernel.
 *
 * Workers wait for the next job by spinning for a bounded time, then sleep on a futex; the caller
 * waits for the workers that entered its job the same way (a worker that comes late finds the job
 * closed and skips it). When the caller keeps waiting on a worker that is not running (a core
 * taken by another process), the pool runs the next jobs on fewer threads for a while, then tries
 * again: see threads.c. */
#ifndef IGNIS_THREADS_H
#define IGNIS_THREADS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define IG_MAX_THREADS 256

typedef void (*ig_job_fn)(void *ctx);

/* Run fn(ctx) on up to n_threads threads (the caller included) and return when all are done.
 * n_threads <= 1, a call from inside a job, or a call while another thread's job runs: fn runs
 * once, on the caller alone. */
void ig_parallel(int n_threads, ig_job_fn fn, void *ctx);

/* IG_FOR's iterator: the chunk [i, hi) being worked on. */
typedef struct {
    int64_t i, hi, n;
    void   *job;      /* the job whose regions hand out chunks; NULL: this thread does [0, n) */
    int     self, from;   /* this thread's index in the job; the region it claims from now */
} ig_for_iter;

/* n < 2^31: the loop variable is an int, and a region's taken counts are 32-bit halves of one word */
ig_for_iter ig_for_begin(int64_t n, int share);
/* The rest of the current chunk, or the next chunk claimed, whole: [*lo, *hi); 0 when none is
 * left. For a job that hands its ranges to kernels itself (ig_alone) instead of index by index. */
int ig_for_range(ig_for_iter *it, int64_t *lo, int64_t *hi);
/* Inside a job: fn(ctx) on this thread as if no job ran (its IG_FOR loops whole), so a job can
 * run a kernel written with IG_FOR on a piece of a larger loop it shares out with ig_for_range. */
void ig_alone(ig_job_fn fn, void *ctx);
/* Advance to the next index (claiming a chunk when this one is used up); 0 when none is left. */
static inline int ig_for_next(ig_for_iter *it);
int ig_for_claim(ig_for_iter *it);

static inline int ig_for_next(ig_for_iter *it) {
    if (++it->i < it->hi) return 1;
    return ig_for_claim(it);
}

/* The loop variable is an int; `continue` works, `break` acts as `continue` (as in an omp for,
 * where it is not allowed). */
#define IG_FOR_IF(var, n, share)                                                                  \
    for (ig_for_iter ig_it_##var = ig_for_begin((int64_t)(n), (share)); ig_for_next(&ig_it_##var);) \
        for (int var = (int)ig_it_##var.i, ig_once_##var = 1; ig_once_##var; ig_once_##var = 0)
#define IG_FOR(var, n) IG_FOR_IF(var, n, 1)

/* The pool's view of the last jobs, for tests and benchmarks. */
typedef struct {
    int64_t jobs;          /* jobs run on more than one thread */
    int64_t reduced_jobs;  /* jobs run on fewer threads than asked, because a worker lagged */
    int64_t late_joins;    /* joins where the caller waited long on a worker */
    int64_t backoffs;      /* times the pool went to fewer threads for a while */
    int64_t failed_probes; /* of them: soon after the full count was tried again (so twice as long) */
    int64_t slow_probes;   /* of those: the probe's steps were not faster than the steps before */
    int64_t shared_windows;/* windows of jobs many of which a worker entered on the caller's CPU */
    int     backoff_jobs;  /* jobs the current (or the last) backoff lasts */
    int     workers;       /* worker threads started */
    int     threads_now;   /* threads a job asking for all of them would get now */
    int     traced;        /* IGNIS_POOL_TRACE=1 was set when the pool started: the _ns fields count */
    int64_t entered;       /* worker entries into jobs (summed over workers) */
    int64_t missed;        /* jobs a worker reached after the caller had closed them */
    int64_t sleeps;        /* times a worker stopped spinning and slept */
    int64_t own_ns;        /* traced: the caller's share of the jobs */
    int64_t wait_ns;       /* traced: the caller waiting for workers after its share */
    int64_t lag_ns;        /* traced: from a job's publication to a worker entering it (summed) */
} ig_pool_stats;
void ig_pool_get_stats(ig_pool_stats *out);

/* A step (one pass over a model's tape, a job per parallel op) between the two: the pool compares
 * steps run on all threads with steps run on fewer (threads.c). model: any pointer that tells
 * models apart (NULL: the step failed, weigh nothing); T: the step's rows; begun: what
 * ig_pool_step_begin returned. Both on the thread that runs the step; only a step whose jobs all
 * came from that thread and ran on the pool is weighed. */
int64_t ig_pool_step_begin(void);
void ig_pool_step_done(const void *model, int T, int64_t begun);

/* CPUs this process may run on: the affinity mask (Linux), else the online CPUs. */
int ig_cpus_available(void);

/* This thread's scratch: at least `bytes` bytes, 64-byte aligned, for a kernel whose working set is
 * too large for a thread's stack (a caller's thread may have 128 KiB, musl's default). Allocated on
 * the thread's first call and again only when a larger size is asked (the contents are not kept
 * then), freed when the thread exits; NULL when it cannot be allocated (the old buffer stays). A
 * kernel holds it for one call, on the thread that asked, and calls no other kernel meanwhile. */
void *ig_thread_scratch(size_t bytes);

#ifdef __cplusplus
}
#endif
#endif /* IGNIS_THREADS_H */
