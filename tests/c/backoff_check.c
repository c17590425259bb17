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
    for (int i = 0; i < n; i++) backoff_after(b, NOW, 1, 0, 0);
}

/* three late joins in a row at the full count */
static void late3(backoff_t *b) {
    for (int i = 0; i < 3; i++) backoff_after(b, NOW, 1, 1, 0);
}

/* the whole backoff run on fewer threads, counted in jobs */
static void reduced(backoff_t *b) {
    while (b->reduce) backoff_after(b, NOW, 0, 0, 0);
}

int main(void) {
    backoff_t b = {0};

    /* late joins spread out (one every 65 jobs) never back off */
    for (int i = 0; i < 10; i++) {
        backoff_after(&b, NOW, 1, 1, 0);
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
    for (int i = 0; i < IG_SHARED_MAX; i++) backoff_after(&b, NOW, 1, 0, 1);
    CHECK(b.backoffs == before && b.reduce == 0);
    backoff_after(&b, NOW, 1, 0, 1);
    CHECK(b.backoffs == before + 1 && b.shared_windows == 1 && b.reduce == 1);
    reduced(&b);
    clean(&b, IG_PROBE_JOBS);

    /* as many shared jobs spread over windows do not */
    for (int w = 0; w < 4; w++) {
        for (int i = 0; i < IG_WINDOW_JOBS; i++) backoff_after(&b, NOW, 1, 0, i < IG_SHARED_MAX);
    }
    CHECK(b.backoffs == before + 1 && b.reduce == 0);

    /* jobs on fewer threads (full = 0) feed no window */
    const int64_t quiet_before = b.backoffs;
    for (int i = 0; i < 4 * IG_WINDOW_JOBS; i++) backoff_after(&b, NOW, 0, 0, 1);
    CHECK(b.backoffs == quiet_before);

    /* steps: a probe whose steps are not faster than the steps on fewer threads fails, and
     * doubles the length; one whose steps are faster holds */
    static const int model_a, model_b;
    b = (backoff_t){0};
    late3(&b);
    CHECK(b.reduce == 1 && b.length == IG_BACKOFF_JOBS);
    backoff_step(&b, NOW, &model_a, 1, 1);       /* the step it began in: all threads, no probe */
    CHECK(b.one_n == 0 && b.probe_n == 0);
    for (int k = 0; k < 3; k++) {                /* three steps of 100 jobs on one thread fewer */
        for (int i = 0; i < 100; i++) backoff_after(&b, NOW, 0, 0, 0);
        backoff_step(&b, NOW, &model_a, 1, 1000000);
    }
    CHECK(b.one_n == 3 && b.one_ns == 3000000);
    CHECK(backoff_reduce(&b, b.until_ns) == 0 && b.probing);     /* time's up: the probe */
    for (int i = 0; i < 50; i++) backoff_after(&b, NOW, 1, 0, 0);
    backoff_step(&b, NOW, &model_b, 1, 100);     /* another model's step: not compared */
    backoff_step(&b, NOW, &model_a, 4, 100);     /* another row count: not compared */
    CHECK(b.probe_n == 0 && b.probing);
    for (int k = 0; k < IG_PROBE_STEPS; k++) {   /* as slow as on fewer threads */
        for (int i = 0; i < 100; i++) backoff_after(&b, NOW, 1, 0, 0);
        backoff_step(&b, NOW, &model_a, 1, 1000000);
    }
    CHECK(b.slow_probes == 1 && b.failed_probes == 1 && b.reduce == 1);
    CHECK(b.length == 2 * IG_BACKOFF_JOBS);
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < 100; i++) backoff_after(&b, NOW, 0, 0, 0);
        backoff_step(&b, NOW, &model_a, 1, 1000000);
    }
    CHECK(backoff_reduce(&b, b.until_ns) == 0 && b.probing);
    for (int k = 0; k < IG_PROBE_STEPS; k++) {   /* faster: it holds */
        for (int i = 0; i < 100; i++) backoff_after(&b, NOW, 1, 0, 0);
        backoff_step(&b, NOW, &model_a, 1, 800000);
    }
    CHECK(b.slow_probes == 1 && !b.probing && b.reduce == 0);
    late3(&b);                                   /* so the next backoff starts short */
    CHECK(b.length == IG_BACKOFF_JOBS && b.failed_probes == 1);

    /* a step whose jobs ran partly on all threads and partly on fewer counts for neither */
    for (int i = 0; i < 10; i++) backoff_after(&b, NOW, 0, 0, 0);
    CHECK(backoff_reduce(&b, b.until_ns) == 0);
    for (int i = 0; i < 10; i++) backoff_after(&b, NOW, 1, 0, 0);
    const int one_n = b.one_n;
    backoff_step(&b, NOW, &model_a, 1, 5);
    CHECK(b.one_n == one_n && b.probe_n == 0);

    if (failures) return 1;
    printf("ok\n");
    return 0;
}
