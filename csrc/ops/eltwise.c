/* eltwise.c — the executor's elementwise ops (add, mul, silu, swiglu, geglu, scale), portable C.
 * Each element is computed alone, so neither the rows a thread takes nor the vector width the
 * compiler picks changes a bit. */
#include "../ignis.h"

/* ig_expf_f32's table: the bits of 2^(i/32) rounded to the nearest double, less i << 47, so that
 * adding k << 47 for k = 32 q + i scales it by 2^q (the table glibc's expf uses; each entry is
 * derived from exact arithmetic in tests/test_kernels.py) */
const uint64_t ig_expf_tab[32] = {
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51,
    0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
    0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585,
    0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
    0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069,
    0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540,
};

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
