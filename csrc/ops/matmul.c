/* matmul.c — the portable f32 matmul with its epilogues: plain loops, the twin every ISA version is
 * tested against. */
#include "../ignis.h"

#include <string.h>

static float dot_seq(const float *x, const float *y, int n) {
    float acc = 0.0f;
    for (int i = 0; i < n; i++) acc += x[i] * y[i];
    return acc;
}

void ig_matmul_f32_ref(const ig_matmul_args *a, int n_threads) {
    const int T = a->T, N = a->N, K = a->K;
    const float *W = a->w, *W2 = a->w2, *X = a->x;
    /* Parallel over output columns only: each value's sum has one order whatever the thread count. */
    IG_FOR(n, N) {
        const float *w = W + (size_t)n * K;
        for (int t = 0; t < T; t++) {
            const float *x = X + (size_t)t * a->ldx;
            a->out[(size_t)t * a->ldo + n] = IG_MATMUL_EPILOGUE(
                a, dot_seq(x, w, K), W2 ? dot_seq(x, W2 + (size_t)n * K, K) : 0.0f, t, n);
        }
    }
    (void)n_threads;
}

static float bf16_dot_seq(const float *x, const uint16_t *w, int n) {
    float acc = 0.0f;
    for (int i = 0; i < n; i++) {
        const uint32_t bits = (uint32_t)w[i] << 16;
        float v;
        memcpy(&v, &bits, sizeof v);
        acc += x[i] * v;
    }
    return acc;
}

void ig_matmul_bf16_ref(const ig_matmul_args *a, int n_threads) {
    const int T = a->T, N = a->N, K = a->K;
    const uint16_t *W = a->w, *W2 = a->w2;
    const float *X = a->x;
    IG_FOR(n, N) {
        const uint16_t *w = W + (size_t)n * K;
        for (int t = 0; t < T; t++) {
            const float *x = X + (size_t)t * a->ldx;
            a->out[(size_t)t * a->ldo + n] = IG_MATMUL_EPILOGUE(
                a, bf16_dot_seq(x, w, K), W2 ? bf16_dot_seq(x, W2 + (size_t)n * K, K) : 0.0f,
                t, n);
        }
    }
    (void)n_threads;
}
