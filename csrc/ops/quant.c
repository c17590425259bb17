/* quant.c — the q8 block format: activation quantization (shared by every table, so all tables see
 * the same integers) and the portable q8 matmul twin. */
#include "../ignis.h"

#include <string.h>

void ig_quantize_q8_rows_ref(ig_block_q8 *out, const float *x, int64_t ldx, int T, int K) {
    const int nb = K / IG_QK;
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * ldx;
        ig_block_q8 *o = out + (size_t)t * nb;
        for (int b = 0; b < nb; b++) {
            const float *v = xr + (size_t)b * IG_QK;
            const float amax = ig_block_amax(v);
            const float d = amax / 127.0f;
            float id = d > 0.0f ? 127.0f / amax : 0.0f;
            if (!(id < INFINITY)) id = 0.0f;    /* a denormal or tiny maximum: the block rounds to 0 */
            o[b].d = d;
            /* id > 0: every v[i] is finite and |v[i] * id| <= 127 (after rounding) */
            for (int i = 0; i < IG_QK; i++) o[b].qs[i] = id > 0.0f ? (int8_t)lrintf(v[i] * id) : 0;
        }
    }
}

/* The packed form's block b of row n: its scale and its 32 integers (stored plus 128). */
static inline float q8p_scale(const uint8_t *w, int nb, int n, int b) {
    const uint8_t *g = w + (size_t)(n / IG_Q8P_ROWS) * IG_Q8P_GROUP_BYTES(nb);
    uint16_t h;
    memcpy(&h, g + ((size_t)b * IG_Q8P_ROWS + n % IG_Q8P_ROWS) * 2, sizeof h);
    return ig_f16_to_f32(h);
}

static inline const uint8_t *q8p_qs(const uint8_t *w, int nb, int n, int b) {
    const uint8_t *g = w + (size_t)(n / IG_Q8P_ROWS) * IG_Q8P_GROUP_BYTES(nb);
    return g + IG_Q8P_SCALE_BYTES(nb) + ((size_t)b * IG_Q8P_ROWS + n % IG_Q8P_ROWS) * IG_QK;
}

static float dot_q8(const ig_block_q8 *x, const uint8_t *w, int nb, int n) {
    float acc = 0.0f;
    for (int b = 0; b < nb; b++) {
        const uint8_t *q = q8p_qs(w, nb, n, b);
        int32_t s = 0;
        for (int i = 0; i < IG_QK; i++) s += (int32_t)x[b].qs[i] * ((int32_t)q[i] - 128);
        acc += (float)s * (x[b].d * q8p_scale(w, nb, n, b));
    }
    return acc;
}

/* The portable integer matmul, given the dot of an activation row with weight row n. */
typedef float (*ig_q_dot)(const ig_block_q8 *x, const uint8_t *w, int nb, int n);

static void q_matmul_ref(const ig_matmul_args *a, ig_q_dot dot, int n_threads) {
    const int T = a->T, N = a->N, nb = a->K / IG_QK;
    const ig_block_q8 *X = a->x;
    IG_FOR(n, N) {
        for (int t = 0; t < T; t++) {
            const ig_block_q8 *x = X + (size_t)t * nb;
            a->out[(size_t)t * a->ldo + n] = IG_MATMUL_EPILOGUE(
                a, dot(x, a->w, nb, n), a->w2 ? dot(x, a->w2, nb, n) : 0.0f, t, n);
        }
    }
    (void)n_threads;
}

void ig_matmul_q8_ref(const ig_matmul_args *a, int n_threads) {
    q_matmul_ref(a, dot_q8, n_threads);
}

/* ---- q4: the packed 4-bit twin (layout in ignis.h) ---- */

static float dot_q4(const ig_block_q8 *x, const uint8_t *w, int nb, int n) {
    const uint8_t *g = w + (size_t)(n / 4) * IG_Q4P_GROUP_BYTES(nb);
    float acc = 0.0f;
    for (int b = 0; b < nb; b++) {
        uint16_t h;
        memcpy(&h, g + ((size_t)b * 4 + n % 4) * 2, sizeof h);
        const float d = ig_f16_to_f32(h);
        const uint8_t *q = g + IG_Q4P_SCALE_BYTES(nb) + ((size_t)b * 4 + n % 4) * 16;
        int32_t s = 0;
        for (int i = 0; i < 16; i++) {
            s += (int32_t)x[b].qs[i] * ((int32_t)(q[i] & 15) - 8);
            s += (int32_t)x[b].qs[i + 16] * ((int32_t)(q[i] >> 4) - 8);
        }
        acc += (float)s * (x[b].d * d);
    }
    return acc;
}

void ig_matmul_q4_ref(const ig_matmul_args *a, int n_threads) {
    q_matmul_ref(a, dot_q4, n_threads);
}
