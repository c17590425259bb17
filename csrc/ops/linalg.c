/* linalg.c — portable reference kernels: plain loops, the twins every ISA version is tested against. */
#include "../ignis.h"

float ig_dot_f32_ref(const float *x, const float *y, int n) {
    float acc = 0.0f;
    for (int i = 0; i < n; i++) acc += x[i] * y[i];
    return acc;
}

void ig_gemv_f32_ref(float *out, const float *w, const float *x, int rows, int cols, int n_threads) {
    /* Parallel over output rows only: each row's sum has one fixed order, whatever the thread count. */
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(n_threads > 0 ? n_threads : 1)
#endif
    for (int r = 0; r < rows; r++) out[r] = ig_dot_f32_ref(w + (size_t)r * cols, x, cols);
    (void)n_threads;
}

int32_t ig_dot_i8_ref(const int8_t *x, const int8_t *y, int n) {
    int32_t acc = 0;
    for (int i = 0; i < n; i++) acc += (int32_t)x[i] * (int32_t)y[i];
    return acc;
}
