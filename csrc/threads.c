/* threads.c — the persistent worker pool behind ig_parallel and IG_FOR (threads.h).
 *
 * One pool per process, started on the first job that wants more than one thread and grown to
 * the largest count asked for since. A job is published by bumping `gen`; workers notice it
 * while they spin (a decode step's ops come microseconds apart, so they stay awake through a
 * step), or are woken after IG_SPIN_NS of spinning from a futex (Linux; a condition variable
 * elsewhere), which is what lets other programs have the core between steps.
 *
 * A worker takes part in a job only by entering it (a compare-and-swap on `entry`, which holds
 * the job's number, a closed bit and the count of workers in). When the caller has run its share
 * (its IG_FOR loop returns once every index is handed out) it closes the job and waits only for
 * the workers that entered: a worker still asleep, or descheduled before it saw the job, skips it
 * when it comes round and costs the caller nothing. Before this the caller waited for every
 * worker to run the job, found or not, so a worker woken late (a futex wake on a VM takes tens of
 * microseconds) held up the op after each sleep.
 *
 * A busy computer: a worker that shares its core with another process is descheduled for a
 * scheduler slice (milliseconds) now and then, in the middle of a chunk it holds, and the job
 * waits for it: with a busy loop on one of two cores, two threads decoded at half the speed of
 * one. So the caller times each join; when it waited on a worker longer than its own share took
 * (and more than IG_LATE_NS), or ran a share longer than IG_ABSENT_NS that an awake worker never
 * entered (it is not running; left to spin it takes CPU from the caller), three times within a
 * few dozen jobs, the next jobs run on one thread fewer. Joins are not all a busy core costs:
 * the scheduler also puts a worker on the caller's own core (a woken thread goes where its waker
 * runs when no core is idle), where its spinning and its wake-ups take the caller's time without
 * any join looking late. So the caller also counts the jobs a worker entered on the caller's own
 * CPU (sched_getcpu, a few ns, at entry); more than IG_SHARED_MAX of a window of IG_WINDOW_JOBS
 * backs off at once.
 *
 * A backoff lasts IG_BACKOFF_JOBS jobs, and no longer than as many decode jobs take
 * (IG_BACKOFF_JOB_NS each), so a prefill's long jobs do not keep it for seconds; then the full
 * count is tried again (a probe). Those rules are proxies: what counts is whether the steps run
 * faster on all threads. So the executor reports each step's time (ig_pool_step_done), and a
 * probe's first IG_PROBE_STEPS steps (of one model and row count, all of whose jobs ran on all
 * threads) are compared with the last steps on fewer: taking more than IG_PROBE_GAIN percent of
 * their mean time, the probe failed, as it also did when it backs off again within IG_PROBE_JOBS
 * jobs. A failed probe makes the next
 * backoff twice as long, up to IG_BACKOFF_MAX (~2 s of decode), so beside a busy loop the pool
 * re-probes a few times a second at first and then every ~2 s, and the probes' cost stays near
 * 1%; a probe that held (faster, or lasting IG_PROBE_JOBS jobs) resets the length, so a burst of
 * late joins on a VM, or a machine where all threads still pay, costs a few steps on fewer. The
 * policy is a state machine fed by the joins and the steps (backoff_*), driven alone by
 * tests/c/backoff_check.c. Results never depend on it (IG_FOR gives every index the same
 * computation on any thread).
 *
 * IGNIS_POOL_TRACE=1 (read when the pool starts) also times the joins: the caller's share, its
 * wait for the workers, and how long after publication the workers entered (ig_pool_stats). */
#if defined(__linux__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE 1      /* sched_getaffinity, CPU_COUNT, sched_getcpu */
#endif
#include "threads.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(_WIN32)
#define IG_NO_PTHREADS 1
#include <malloc.h>        /* _aligned_malloc */
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

#define IG_SPIN_NS spin_ns        /* spin this long for the next job / the workers, then sleep */
#define IG_LATE_NS 100000         /* and at least this long */
#define IG_ABSENT_NS 30000        /* a share this long without a worker entering: it is not running */
#define IG_BACKOFF_JOBS 512       /* ~3 decode tokens of a 0.5B model */
#define IG_BACKOFF_MAX 32768      /* 64 x IG_BACKOFF_JOBS: ~2.3 s of decode jobs */
#define IG_BACKOFF_JOB_NS 70000   /* and no longer than that many decode jobs take (~70 us each): a
                                   * prefill's jobs take milliseconds, and 512 of them on one thread
                                   * were seconds of a long prompt after one burst of late joins */
#define IG_PROBE_JOBS 4096        /* a full-count trial backed off within this many jobs failed */
#define IG_WINDOW_JOBS 128        /* jobs on all threads per look at shared CPUs and lost CPU time */
#define IG_SHARED_MAX 16          /* more jobs than this of a window entered on the caller's CPU
                                   * (backs off at once) */
#define IG_PROBE_STEPS 4          /* a probe's steps compared with the steps on fewer threads */
#define IG_PROBE_GAIN 97          /* and held when they took under 97% of those's mean time */

/* IG_SPIN_NS: 200 us unless IGNIS_POOL_SPIN_US says otherwise (read when the pool starts) */
static int64_t spin_ns = 200000;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* IG_FOR's indices taken from one thread's region: how many from its front (the low 32 bits, by
 * the thread it belongs to) and from its back (the high 32, by the others; IG_FOR's index is an
 * int); on a cache line of its own */
typedef struct {
    _Alignas(64) _Atomic uint64_t taken;
} region_t;

typedef struct {
    ig_job_fn        fn;
    void            *ctx;
    int              n_threads;     /* taking part: the caller (index 0) and workers 1..n-1 */
    region_t         region[IG_MAX_THREADS];   /* IG_FOR: thread i's share of the indices */
} job_t;

static _Thread_local job_t *tl_job;     /* the job this thread is running, or NULL */
static _Thread_local int tl_index;
/* a step's caller: its address names the thread; the pool's caller changes it had seen when its
 * step began, and whether a job of it ran alone because another caller held the pool */
static _Thread_local char tl_me;
static _Thread_local uint64_t tl_step_switches;
static _Thread_local int tl_step_crowded;

/* ---- IG_FOR -------------------------------------------------------------------------------- */

ig_for_iter ig_for_begin(int64_t n, int share) {
    ig_for_iter it = {-1, 0, n, NULL, 0, 0};
    job_t *j = tl_job;
    if (!j || j->n_threads <= 1 || !share) {
        if (!j || tl_index == 0) it.hi = n;     /* alone, or the job's first thread does it all */
    } else {
        it.job = j;
        it.self = it.from = tl_index;
    }
    return it;
}

/* A chunk of region r (thread r's share, [n r / nt, n (r + 1) / nt)) of the n indices: thread r
 * takes the larger half of what is left from the front, another thread the smaller half (at least
 * one) from the back, so a slower thread's region is shared out and the threads end together. */
static int claim_region(job_t *j, int r, int own, int64_t n, int64_t *lo, int64_t *hi) {
    const int nt = j->n_threads;
    const int64_t r0 = n * r / nt, size = n * (r + 1) / nt - r0;
    _Atomic uint64_t *w = &j->region[r].taken;
    uint64_t cur = atomic_load_explicit(w, memory_order_relaxed), nxt;
    int64_t front, back, c;
    do {
        front = (int64_t)(cur & 0xffffffffu);
        back = (int64_t)(cur >> 32);
        const int64_t left = size - front - back;
        if (left <= 0) return 0;
        c = own ? (left + 1) / 2 : left / 2 > 0 ? left / 2 : 1;
        nxt = own ? cur + (uint64_t)c : cur + ((uint64_t)c << 32);
    } while (!atomic_compare_exchange_weak_explicit(w, &cur, nxt, memory_order_relaxed,
                                                    memory_order_relaxed));
    *lo = own ? r0 + front : r0 + size - back - c;
    *hi = *lo + c;
    return 1;
}

/* Regions, not one counter: with one shared counter the threads' chunks alternated through the
 * matrix (guided: a quarter of what was left, then an eighth...), so each thread's stream restarted
 * at every chunk, cold for the hardware prefetcher and the tiles' software prefetch, and the
 * counter's cache line moved between the cores at every claim. A thread now works its own region
 * front to back as one stream (its claims meet end to end, on a line only it touches while
 * nobody steals), and a thread done with its own takes from the back of the others' (a late
 * worker's region is done by the others, as before). In one process, q4 / GGUF Q5_0 896 x 896 from
 * memory at 2 threads: 14.6 -> 11.1 us and 15.0 -> 12.6 us a call. */
int ig_for_claim(ig_for_iter *it) {
    job_t *j = it->job;
    if (!j) return 0;
    const int nt = j->n_threads;
    for (; it->from < it->self + nt; it->from++) {    /* its own region, then the next ones */
        const int r = it->from % nt;
        int64_t lo, hi;
        if (claim_region(j, r, r == it->self, it->n, &lo, &hi)) {
            it->i = lo;
            it->hi = hi;
            return 1;
        }
    }
    return 0;
}

int ig_for_range(ig_for_iter *it, int64_t *lo, int64_t *hi) {
    if (it->i + 1 < it->hi) *lo = it->i + 1;      /* alone: the whole loop at once */
    else if (ig_for_claim(it)) *lo = it->i;
    else return 0;
    *hi = it->hi;
    it->i = it->hi - 1;                           /* used up */
    return 1;
}

void ig_alone(ig_job_fn fn, void *ctx) {
    job_t *j = tl_job;
    const int index = tl_index;
    tl_job = NULL;
    fn(ctx);
    tl_job = j;
    tl_index = index;
}

/* ---- per-thread scratch (ig_thread_scratch) -------------------------------------------------- */

static _Thread_local void *tl_scratch;
static _Thread_local size_t tl_scratch_bytes;

#ifdef IG_NO_PTHREADS
static int scratch_keep(void *p) { (void)p; return 1; }   /* no exit hook: freed with the process */
static void *scratch_alloc(size_t bytes) { return _aligned_malloc(bytes, 64); }
static void scratch_free(void *p) { _aligned_free(p); }
#else
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static int scratch_key_ok;
static void scratch_free(void *p) { free(p); }
static void scratch_key_make(void) { scratch_key_ok = pthread_key_create(&scratch_key, scratch_free) == 0; }
/* When the library is unloaded (a Node or ctypes host closing it) while threads that ran a step
 * live on, their exit would call scratch_free where the library was: the key goes with the
 * library, and those threads' buffers are left to the process. */
__attribute__((destructor)) static void scratch_key_drop(void) {
    if (scratch_key_ok) pthread_key_delete(scratch_key);
    scratch_key_ok = 0;
}
/* the thread's exit frees p: the key's destructor */
static int scratch_keep(void *p) {
    pthread_once(&scratch_once, scratch_key_make);
    return scratch_key_ok && pthread_setspecific(scratch_key, p) == 0;
}
static void *scratch_alloc(size_t bytes) {
    void *p = NULL;
    return posix_memalign(&p, 64, bytes) == 0 ? p : NULL;
}
#endif

void *ig_thread_scratch(size_t bytes) {
    if (bytes <= tl_scratch_bytes) return tl_scratch;
    if (bytes > SIZE_MAX - 63) return NULL;
    bytes = (bytes + 63) / 64 * 64;
    void *p = scratch_alloc(bytes);
    if (!p) return NULL;
    if (!scratch_keep(p)) {
        scratch_free(p);
        return NULL;
    }
    scratch_free(tl_scratch);
    tl_scratch = p;
    tl_scratch_bytes = bytes;
    return p;
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

int64_t ig_pool_step_begin(void) { return 0; }

void ig_pool_step_done(const void *model, int T, int64_t begun) {
    (void)model, (void)T, (void)begun;
}

int ig_cpus_available(void) { return 1; }

#else

/* ---- waiting on a 32-bit word: futex on Linux, a condition variable elsewhere --------------- */

#if defined(__linux__) && !defined(IG_POOL_NO_FUTEX)
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>

/* sleep while *w == v (returns at once when it differs; spurious returns are fine) */
static void word_wait(_Atomic uint32_t *w, uint32_t v) {
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT_PRIVATE, v, NULL, NULL, 0);
}
static void word_wake(_Atomic uint32_t *w) {
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}
#else
static pthread_mutex_t word_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t word_cond = PTHREAD_COND_INITIALIZER;

/* the waker changes the word before it takes the lock, and the sleeper checks it under the lock:
 * no wake is lost. One condition for every word: a wake is broadcast, sleepers re-check. */
static void word_wait(_Atomic uint32_t *w, uint32_t v) {
    pthread_mutex_lock(&word_lock);
    if (atomic_load(w) == v) pthread_cond_wait(&word_cond, &word_lock);
    pthread_mutex_unlock(&word_lock);
}
static void word_wake(_Atomic uint32_t *w) {
    (void)w;
    pthread_mutex_lock(&word_lock);
    pthread_cond_broadcast(&word_cond);
    pthread_mutex_unlock(&word_lock);
}
#endif

/* ---- the backoff (see the top of this file): a state machine the caller feeds every job ----- */

typedef struct {
    int     late_recent, jobs_since_late;  /* late joins among the last few dozen jobs */
    int     reduce;          /* threads taken off the next jobs */
    int     length;          /* jobs the current (or the last) backoff lasts */
    int     left;            /* jobs of it left */
    int64_t until_ns;        /* and when its time is up */
    int     probing;         /* the full count is back since a backoff ended, */
    int     probe_jobs;      /* for this many jobs */
    int     win_jobs, win_shared;   /* this window: jobs on all threads, entered on the caller's CPU */
    /* steps: the jobs of the one under way on all threads / on fewer; the kind compared (model,
     * rows); the recent steps of that kind on fewer threads, and the probe's on all */
    int     step_full, step_reduced;
    const void *kind_model;
    int     kind_T;
    int64_t one_ns, probe_ns;
    int     one_n, probe_n;
    int64_t backoffs, failed_probes, slow_probes, shared_windows;
} backoff_t;

static void backoff_start(backoff_t *b, int64_t now) {
    if (b->probing) {              /* the full count failed again within IG_PROBE_JOBS */
        b->length = b->length < IG_BACKOFF_MAX / 2 ? 2 * b->length : IG_BACKOFF_MAX;
        b->failed_probes++;
    } else if (!b->reduce) {
        b->length = IG_BACKOFF_JOBS;
    }                              /* else: lagging while reduced: one thread fewer, as long */
    b->backoffs++;
    b->reduce++;
    b->left = b->length;
    b->until_ns = now + (int64_t)b->length * IG_BACKOFF_JOB_NS;
    b->probing = 0;
    b->late_recent = 0;
    b->win_jobs = b->win_shared = 0;
    b->one_ns = b->one_n = 0;      /* the steps on fewer threads are measured afresh */
}

static void backoff_end(backoff_t *b) {
    b->reduce = 0;
    b->left = 0;
    b->probing = 1;
    b->probe_jobs = 0;
    b->probe_ns = b->probe_n = 0;
}

/* The threads to take off a job that starts now. */
static int backoff_reduce(backoff_t *b, int64_t now) {
    if (b->reduce && now >= b->until_ns) backoff_end(b);      /* its time is up */
    return b->reduce;
}

/* After a job. full: it ran on every thread asked for (none taken off); late: its join was late;
 * shared: a worker entered it on the caller's CPU. */
static void backoff_after(backoff_t *b, int64_t now, int full, int late, int shared) {
    if (full) b->step_full++;
    else b->step_reduced++;
    if (b->left > 0 && --b->left == 0) backoff_end(b);
    if (full && b->probing && ++b->probe_jobs >= IG_PROBE_JOBS) b->probing = 0;   /* it held */
    if (late) {
        b->late_recent++;
        b->jobs_since_late = 0;
    } else if (++b->jobs_since_late > 64) {
        b->late_recent = 0;
    }
    int back = b->late_recent >= 3;
    if (full) {
        b->win_jobs++;
        /* at once, not at the window's end: a probe on a shared core costs the caller every job */
        if ((b->win_shared += shared != 0) > IG_SHARED_MAX) {
            b->shared_windows++;
            back = 1;
        }
        if (b->win_jobs >= IG_WINDOW_JOBS) b->win_jobs = b->win_shared = 0;
    }
    if (back) backoff_start(b, now);
}

/* After a step of `model` with T rows that took ns. Only steps whose jobs all ran one way count:
 * on fewer threads during a backoff, on all of them in a probe; a probe's first IG_PROBE_STEPS of
 * the kind last measured on fewer decide it. */
static void backoff_step(backoff_t *b, int64_t now, const void *model, int T, int64_t ns) {
    const int full = b->step_full > 0 && b->step_reduced == 0;
    const int reduced = b->step_reduced > 0 && b->step_full == 0;
    b->step_full = b->step_reduced = 0;
    if (reduced && b->reduce) {
        if (model != b->kind_model || T != b->kind_T) {
            b->kind_model = model;
            b->kind_T = T;
            b->one_ns = b->one_n = 0;
        }
        if (b->one_n == 8) {       /* a recent mean: the context grows step by step */
            b->one_ns /= 2;
            b->one_n /= 2;
        }
        b->one_ns += ns;
        b->one_n++;
    } else if (full && b->probing && b->one_n && b->probe_n < IG_PROBE_STEPS &&
               model == b->kind_model && T == b->kind_T) {
        b->probe_ns += ns;
        if (++b->probe_n == IG_PROBE_STEPS) {
            /* mean on all threads against IG_PROBE_GAIN% of the mean on fewer */
            if (b->probe_ns * b->one_n * 100 > b->one_ns * b->probe_n * IG_PROBE_GAIN) {
                b->slow_probes++;
                backoff_start(b, now);
            } else {
                b->probing = 0;    /* it held: the next backoff starts short */
            }
        }
    }
}

/* ---- the pool ------------------------------------------------------------------------------ */

#define ENTRY_CLOSED ((uint64_t)1 << 15)
#define ENTRY_COUNT  (ENTRY_CLOSED - 1)

/* what one worker counts, on its own cache line (read racily by ig_pool_get_stats) */
typedef struct {
    _Alignas(64) _Atomic int64_t entered, missed, sleeps, lag_ns;
} worker_stats;

static struct {
    pthread_mutex_t  run;           /* one job at a time; held by the caller of the running job */
    pthread_t        th[IG_MAX_THREADS];
    uint64_t         start_gen[IG_MAX_THREADS];
    int              n_workers, trace;
    job_t            job;
    int64_t          published_ns;  /* IGNIS_POOL_TRACE: when the job was published */
    /* what the waiting threads spin on, each in its own cache line, apart from the claims */
    _Alignas(64) _Atomic uint64_t gen;       /* per job: its number * 512 + its thread count */
    _Alignas(64) _Atomic uint64_t entry;     /* job number << 16 | ENTRY_CLOSED | workers in */
    _Alignas(64) _Atomic uint32_t finished;  /* workers of the current job done (futex word) */
    _Atomic int      shared;        /* a worker entered the current job on the caller's CPU */
    int              caller_cpu;    /* the caller's CPU when it published the job (-1: unknown) */
    _Alignas(64) _Atomic uint32_t wake;      /* bumped to wake sleeping workers (futex word) */
    _Atomic int      sleeping_workers, caller_sleeping;
    _Alignas(64) backoff_t b;       /* see the top of this file */
    const char      *step_by;       /* the thread whose jobs b's step counts hold (its tl_me) */
    _Atomic uint64_t switches;      /* times the pool's jobs came from another thread than before */
    int64_t          jobs, reduced_jobs, late_joins, wait_ns, own_ns;
    worker_stats     ws[IG_MAX_THREADS];
} P = {PTHREAD_MUTEX_INITIALIZER};

/* Wait for a job newer than `seen`: spin for IG_SPIN_NS, then sleep on `wake`. */
static uint64_t wait_for_job(uint64_t seen, worker_stats *st) {
    uint64_t g;
    const int64_t t0 = now_ns();
    for (int k = 0; (g = atomic_load_explicit(&P.gen, memory_order_acquire)) == seen; k++) {
        IG_PAUSE();
        if ((k & 255) == 255 && now_ns() - t0 > IG_SPIN_NS) {
            atomic_store_explicit(&st->sleeps, atomic_load_explicit(&st->sleeps, memory_order_relaxed) + 1,
                                  memory_order_relaxed);
            /* seq_cst: either the publisher sees this count, or this thread sees its gen */
            atomic_fetch_add(&P.sleeping_workers, 1);
            for (;;) {
                const uint32_t w = atomic_load(&P.wake);
                if ((g = atomic_load(&P.gen)) != seen) break;
                word_wait(&P.wake, w);
            }
            atomic_fetch_sub(&P.sleeping_workers, 1);
            break;
        }
    }
    return g;
}

/* Enter job g: 1 when this worker is in (the caller will wait for it), 0 when the job is closed
 * or already replaced by a later one. */
static int enter_job(uint64_t g) {
    const uint64_t want = (g / 512) & ((UINT64_C(1) << 48) - 1);
    uint64_t e = atomic_load_explicit(&P.entry, memory_order_acquire);
    while ((e >> 16) == want && !(e & ENTRY_CLOSED))
        if (atomic_compare_exchange_weak_explicit(&P.entry, &e, e + 1, memory_order_acq_rel,
                                                  memory_order_acquire))
            return 1;
    return 0;
}

static void bump(_Atomic int64_t *c, int64_t by) {     /* a counter only its own thread writes */
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + by, memory_order_relaxed);
}

/* The CPU this thread runs on, or -1 (a few ns: glibc reads it from rseq or the vDSO). */
static int this_cpu(void) {
#if defined(__linux__)
    return sched_getcpu();
#else
    return -1;
#endif
}

static void *worker_main(void *arg) {
    const int index = (int)(intptr_t)arg;
    worker_stats *st = &P.ws[index];
    uint64_t seen = P.start_gen[index];   /* the job count when it was started, not when it runs */
    for (;;) {
        const uint64_t g = wait_for_job(seen, st);
        seen = g;
        /* the thread count from the same word: a later job's may already be in j */
        if (index >= (int)(g % 512)) continue;    /* not part of this job */
        if (!enter_job(g)) {
            bump(&st->missed, 1);
            continue;
        }
        job_t *j = &P.job;
        if (P.caller_cpu >= 0 && this_cpu() == P.caller_cpu)
            atomic_store_explicit(&P.shared, 1, memory_order_relaxed);
        if (P.trace) bump(&st->lag_ns, now_ns() - P.published_ns);
        bump(&st->entered, 1);
        tl_job = j;
        tl_index = index;
        j->fn(j->ctx);
        tl_job = NULL;
        /* seq_cst both: either the caller sees this count, or this thread sees it asleep */
        atomic_fetch_add(&P.finished, 1);
        if (atomic_load(&P.caller_sleeping)) word_wake(&P.finished);
    }
    return NULL;
}

/* Start workers up to n - 1; returns how many threads a job can have (1 when none could start). */
static int grow(int n) {
    if (P.n_workers == 0) {
        const char *t = getenv("IGNIS_POOL_TRACE");
        P.trace = t && t[0] == '1';
        const char *sp = getenv("IGNIS_POOL_SPIN_US");
        if (sp && *sp) {
            char *end;
            const long us = strtol(sp, &end, 10);
            if (*end == 0 && us >= 0 && us <= 10000000) spin_ns = (int64_t)us * 1000;
        }
    }
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

void ig_parallel(int n_threads, ig_job_fn fn, void *ctx) {
    if (n_threads > IG_MAX_THREADS) n_threads = IG_MAX_THREADS;
    if (n_threads <= 1 || tl_job || pthread_mutex_trylock(&P.run) != 0) {
        if (n_threads > 1 && !tl_job) tl_step_crowded = 1;     /* another caller has the pool */
        fn(ctx);        /* alone: no job, so its IG_FOR loops run whole */
        return;
    }
    if (P.step_by != &tl_me) {      /* another thread's steps: its counts are not this one's */
        P.step_by = &tl_me;
        atomic_fetch_add_explicit(&P.switches, 1, memory_order_relaxed);
        P.b.step_full = P.b.step_reduced = 0;
    }
    int n = grow(n_threads);
    const int reduce = P.b.reduce ? backoff_reduce(&P.b, now_ns()) : 0;
    if (reduce) {
        n -= reduce;
        if (n < 1) n = 1;
        P.reduced_jobs++;
    }
    if (n <= 1) {
        fn(ctx);
        backoff_after(&P.b, now_ns(), 0, 0, 0);
        pthread_mutex_unlock(&P.run);
        return;
    }
    P.jobs++;
    job_t *j = &P.job;
    j->fn = fn;
    j->ctx = ctx;
    j->n_threads = n;
    for (int r = 0; r < n; r++) atomic_store_explicit(&j->region[r].taken, 0, memory_order_relaxed);
    atomic_store_explicit(&P.finished, 0, memory_order_relaxed);
    atomic_store_explicit(&P.shared, 0, memory_order_relaxed);
    P.caller_cpu = this_cpu();
    const uint64_t g = (atomic_load_explicit(&P.gen, memory_order_relaxed) / 512 + 1) * 512 +
                       (uint64_t)n;
    if (P.trace) P.published_ns = now_ns();
    /* the entry word first (release: with it the job's fields), so a worker that sees gen finds
     * it open */
    atomic_store_explicit(&P.entry, ((g / 512) & ((UINT64_C(1) << 48) - 1)) << 16,
                          memory_order_release);
    /* seq_cst: either a sleeper sees it, or we see the sleeper */
    atomic_store(&P.gen, g);
    const int woken = atomic_load(&P.sleeping_workers) > 0;
    if (woken) {
        atomic_fetch_add(&P.wake, 1);
        word_wake(&P.wake);
    }
    tl_job = j;
    tl_index = 0;
    const int64_t t_own = now_ns();
    fn(ctx);
    tl_job = NULL;
    /* every index is handed out now: close the job to workers that have not entered it */
    uint64_t e = atomic_load_explicit(&P.entry, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(&P.entry, &e, e | ENTRY_CLOSED,
                                                  memory_order_acq_rel, memory_order_relaxed)) {
    }
    const uint32_t in = (uint32_t)(e & ENTRY_COUNT);
    /* the join: late when the caller waits longer than its own share took (dynamic chunks keep
     * that short unless a worker is not running), and more than IG_LATE_NS */
    const int64_t t0 = now_ns(), own = t0 - t_own;
    int late = 0;
    for (int k = 0; atomic_load_explicit(&P.finished, memory_order_acquire) != in; k++) {
        IG_PAUSE();
        if ((k & 255) == 255) {
            const int64_t waited = now_ns() - t0;
            if (waited > IG_LATE_NS && waited > own) late = 1;
            if (waited > IG_SPIN_NS) {
                atomic_store(&P.caller_sleeping, 1);
                for (uint32_t f; (f = atomic_load(&P.finished)) != in;) word_wait(&P.finished, f);
                atomic_store(&P.caller_sleeping, 0);
                const int64_t w = now_ns() - t0;
                late = w > IG_LATE_NS && w > own;
                break;
            }
        }
    }
    /* a worker that did not enter a job this long is not running either (a spinning one enters
     * within a microsecond or two): run the next jobs without it as for a late one, or it spins
     * beside the caller, and a third thread (another program) takes the caller's core share.
     * Not after a wake-up: a sleeping worker takes tens of microseconds to get going. */
    if (!woken && (int)in < n - 1 && own > IG_ABSENT_NS) late = 1;
    const int64_t t1 = now_ns();
    if (late) P.late_joins++;
    if (P.trace) {
        P.own_ns += own;
        P.wait_ns += t1 - t0;
    }
    backoff_after(&P.b, t1, !reduce, late, atomic_load_explicit(&P.shared, memory_order_relaxed));
    pthread_mutex_unlock(&P.run);
}

void ig_pool_get_stats(ig_pool_stats *out) {
    pthread_mutex_lock(&P.run);
    out->jobs = P.jobs;
    out->reduced_jobs = P.reduced_jobs;
    out->late_joins = P.late_joins;
    out->workers = P.n_workers;
    /* as the next job would see it (a backoff whose time is up is over) */
    const int reduce = P.b.reduce && now_ns() < P.b.until_ns ? P.b.reduce : 0;
    out->threads_now = P.n_workers + 1 - reduce > 1 ? P.n_workers + 1 - reduce : 1;
    out->backoffs = P.b.backoffs;
    out->failed_probes = P.b.failed_probes;
    out->slow_probes = P.b.slow_probes;
    out->shared_windows = P.b.shared_windows;
    out->backoff_jobs = P.b.length;
    out->entered = out->missed = out->sleeps = out->lag_ns = 0;
    for (int i = 1; i <= P.n_workers; i++) {
        out->entered += atomic_load_explicit(&P.ws[i].entered, memory_order_relaxed);
        out->missed += atomic_load_explicit(&P.ws[i].missed, memory_order_relaxed);
        out->sleeps += atomic_load_explicit(&P.ws[i].sleeps, memory_order_relaxed);
        out->lag_ns += atomic_load_explicit(&P.ws[i].lag_ns, memory_order_relaxed);
    }
    out->wait_ns = P.wait_ns;
    out->own_ns = P.own_ns;
    out->traced = P.trace;
    pthread_mutex_unlock(&P.run);
}

int64_t ig_pool_step_begin(void) {
    tl_step_switches = atomic_load_explicit(&P.switches, memory_order_relaxed);
    tl_step_crowded = 0;
    return now_ns();
}

/* A step judged only when all its jobs were this thread's and ran on the pool: two engines
 * stepping in two threads, or a step that failed part way (model NULL), judge nothing. */
void ig_pool_step_done(const void *model, int T, int64_t begun) {
    if (pthread_mutex_trylock(&P.run) != 0) return;     /* another caller's job: not ours to judge */
    const int64_t now = now_ns();
    if (model && !tl_step_crowded && P.step_by == &tl_me &&
        atomic_load_explicit(&P.switches, memory_order_relaxed) == tl_step_switches)
        backoff_step(&P.b, now, model, T, now - begun);
    else if (P.step_by == &tl_me)
        P.b.step_full = P.b.step_reduced = 0;
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
