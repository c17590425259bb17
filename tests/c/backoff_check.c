/* backoff_check.c — the pool's backoff policy (csrc/threads.c backoff_*) alone: a state machine
 * fed with made-up joins, no threads and no clock, so every step is exact. threads.c is included
 * whole to reach its static functions. tests/test_threads.py builds and runs it.
 *
 *     backoff_check                    prints "ok" or the first check that failed, and exits 1 */
#include "threads.c"

#include <stdio.h>

static int failures;

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, #cond);               \
            failures++;                                                              \
        }                                                                            \
    } while (0)

static const int64_t NOW = 1000000000;   /* any clock value: the policy only compares to it */

/* n jobs at the full count, none late, none shared, none sampled */
static void clean(backoff_t *b, int n) {
    for (int i = 0; i < n; i++) backoff_after(b, NOW, 1, 0, 0, 0, -1);
}

/* three late joins in a row at the full count */
static void late3(backoff_t *b) {
    for (int i = 0; i < 3; i++) backoff_after(b, NOW, 1, 1, 0, 0, -1);
}

/* the whole backoff run on fewer threads, counted in jobs */
static void reduced(backoff_t *b) {
    while (b->reduce) backoff_after(b, NOW, 0, 0, 0, 0, -1);
}

int main(void) {
    backoff_t b = {0};

    /* late joins spread out (one every 65 jobs) never back off */
    for (int i = 0; i < 10; i++) {
        backoff_after(&b, NOW, 1, 1, 0, 0, -1);
        clean(&b, 65);
    }
    CHECK(b.backoffs == 0 && b.reduce == 0);

    /* three close together do: the base length, on one thread fewer, bounded in time too */
    late3(&b);
    CHECK(b.backoffs == 1 && b.reduce == 1 && b.length == IG_BACKOFF_JOBS);
    CHECK(b.left == IG_BACKOFF_JOBS && b.until_ns == NOW + IG_BACKOFF_JOBS * (int64_t)IG_BACKOFF_JOB_NS);
    CHECK(backoff_reduce(&b, NOW) == 1);
    reduced(&b);
    CHECK(b.reduce == 0 && b.probing);

    /* a probe that fails at once doubles the length, each time, up to the cap */
    int64_t want = IG_BACKOFF_JOBS;
    for (int k = 1; k <= 10; k++) {
        late3(&b);
        want = want * 2 < IG_BACKOFF_MAX ? want * 2 : IG_BACKOFF_MAX;
        CHECK(b.length == want && b.failed_probes == k);
        reduced(&b);
    }
    CHECK(b.length == IG_BACKOFF_MAX);

    /* a backoff whose time is up ends on the next job, counted jobs left or not */
    late3(&b);
    CHECK(b.reduce == 1 && b.left == IG_BACKOFF_MAX);
    CHECK(backoff_reduce(&b, b.until_ns - 1) == 1);
    CHECK(backoff_reduce(&b, b.until_ns) == 0 && b.probing && b.left == 0);

    /* a probe that holds for IG_PROBE_JOBS jobs: the next backoff is the base length again */
    clean(&b, IG_PROBE_JOBS);
    CHECK(!b.probing);
    const int64_t failed = b.failed_probes;
    late3(&b);
    CHECK(b.length == IG_BACKOFF_JOBS && b.failed_probes == failed);
    reduced(&b);
    clean(&b, IG_PROBE_JOBS);

    /* a worker entering jobs on the caller's CPU: backs off at the job that makes it too many */
    const int64_t before = b.backoffs;
    for (int i = 0; i < IG_SHARED_MAX; i++) backoff_after(&b, NOW, 1, 0, 1, 0, -1);
    CHECK(b.backoffs == before && b.reduce == 0);
    backoff_after(&b, NOW, 1, 0, 1, 0, -1);
    CHECK(b.backoffs == before + 1 && b.shared_windows == 1 && b.reduce == 1);
    reduced(&b);
    clean(&b, IG_PROBE_JOBS);

    /* as many shared jobs spread over windows do not */
    for (int w = 0; w < 4; w++) {
        for (int i = 0; i < IG_WINDOW_JOBS; i++) backoff_after(&b, NOW, 1, 0, i < IG_SHARED_MAX, 0, -1);
    }
    CHECK(b.backoffs == before + 1 && b.reduce == 0);

    /* the caller off its CPU: one window of it is a burst, two in a row a busy core */
    const int64_t robbed_before = b.backoffs;
    for (int i = 0; i < IG_WINDOW_JOBS; i++)     /* half the sampled wall time on a CPU */
        backoff_after(&b, NOW, 1, 0, 0, 100000, i % IG_ROB_EVERY ? -1 : 50000);
    CHECK(b.backoffs == robbed_before);
    for (int i = 0; i < IG_WINDOW_JOBS; i++)     /* all of it: the streak is broken */
        backoff_after(&b, NOW, 1, 0, 0, 100000, i % IG_ROB_EVERY ? -1 : 100000);
    for (int i = 0; i < IG_WINDOW_JOBS; i++)
        backoff_after(&b, NOW, 1, 0, 0, 100000, i % IG_ROB_EVERY ? -1 : 50000);
    CHECK(b.backoffs == robbed_before && b.robbed_windows == 0);
    for (int i = 0; i < IG_WINDOW_JOBS; i++)
        backoff_after(&b, NOW, 1, 0, 0, 100000, i % IG_ROB_EVERY ? -1 : 50000);
    CHECK(b.backoffs == robbed_before + 1 && b.robbed_windows == 1 && b.reduce == 1);

    /* jobs on fewer threads (full = 0) feed neither window */
    reduced(&b);
    const int64_t quiet_before = b.backoffs;
    for (int i = 0; i < 4 * IG_WINDOW_JOBS; i++) backoff_after(&b, NOW, 0, 0, 1, 100000, 0);
    CHECK(b.backoffs == quiet_before);

    if (failures) return 1;
    printf("ok\n");
    return 0;
}
