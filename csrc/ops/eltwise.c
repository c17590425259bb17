/* eltwise.c — the executor's elementwise ops (add, mul, silu, swiglu, geglu, scale), portable C.
 * Each element is computed alone, so neither the rows a thread takes nor the vector width the
 * compiler picks changes a bit. */
#include "../ignis.h"

void ig_eltwise_f32_ref(float *out, const float *x, const float *y, int op, int T, int dim,
                        int n_threads) {
    IG_FOR_IF(t, T, T > 1 && (int64_t)T * dim >= IG_ROWS_PAR_MIN) {
        const size_t at = (size_t)t * dim;
        const float *a = x + at;
        float *o = out + at;
        switch (op) {
        case IG_EW_ADD:
            for (int i = 0; i < dim; i++) o[i] = a[i] + y[at + i];
            break;
        case IG_EW_MUL:
            for (int i = 0; i < dim; i++) o[i] = a[i] * y[at + i];
            break;
        case IG_EW_SILU:
            for (int i = 0; i < dim; i++) o[i] = ig_silu_f32(a[i]);
            break;
        case IG_EW_SWIGLU:
            for (int i = 0; i < dim; i++) o[i] = ig_silu_f32(a[i]) * y[at + i];
            break;
        case IG_EW_GEGLU:
            for (int i = 0; i < dim; i++) o[i] = ig_gelu_tanh_f32(a[i]) * y[at + i];
            break;
        case IG_EW_SCALE:
            for (int i = 0; i < dim; i++) o[i] = a[i] * y[i];
            break;
        }
    }
    (void)n_threads;
}
