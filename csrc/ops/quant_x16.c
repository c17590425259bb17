/* quant_x16.c — GGUF block layouts read with 16-bit activations (layouts in ignis.h): the
 * activation quantizer every table shares and the portable matmul twin. */
#include "../ignis.h"

#include <string.h>

void ig_quantize_x16_rows_ref(ig_block_x16 *out, float *xsum, const float *x, int64_t ldx, int T,
                              int K) {
    const int nb = K / IG_QK;
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * ldx;
        ig_block_x16 *o = out + (size_t)t * nb;
        for (int b = 0; b < nb; b++) {
            const float *v = xr + (size_t)b * IG_QK;
            const float amax = ig_block_amax(v);
            float sum = 0.0f;
            for (int i = 0; i < IG_QK; i++) sum += v[i];
            const float d = amax / IG_X16_MAX;
            float id = d > 0.0f ? IG_X16_MAX / amax : 0.0f;
            if (!(id < INFINITY)) id = 0.0f;     /* a denormal or tiny maximum: the block rounds to 0 */
            o[b].d = d;
            xsum[(size_t)t * nb + b] = sum;
            o[b].s[0] = o[b].s[1] = 0;
            for (int i = 0; i < IG_QK; i++) {
                long a = id > 0.0f ? lrintf(v[i] * id) : 0;   /* id > 0: every v[i] is finite */
                if (a > 32512) a = 32512;        /* rounding of v * id can pass the bound by one */
                if (a < -32512) a = -32512;
                const int hi = (int)((a + 128) >> 8);   /* floor: lo stays in -128..127 */
                o[b].hi[i] = (int8_t)hi;
                o[b].lo[i] = (int8_t)(a - 256 * hi);
                o[b].s[i / 16] += (int32_t)a;
            }
        }
    }
}

/* Row r's nibbles of a block (16 bytes at q: k[i] low, k[i + 16] high), with the fifth bit from
 * the block's two masks (NULL: none), minus bias. */
static void x16_nibbles(int32_t k[IG_QK], const uint8_t *q, const uint8_t *masks, int r, int32_t bias) {
    uint64_t m[2] = {0, 0};
    if (masks) memcpy(m, masks, sizeof m);
    for (int i = 0; i < 16; i++) {
        k[i] = (int32_t)((q[i] & 15) | ((m[0] >> (16 * r + i)) & 1) << 4) - bias;
        k[i + 16] = (int32_t)((q[i] >> 4) | ((m[1] >> (16 * r + i)) & 1) << 4) - bias;
    }
}

/* Row r's crumbs of block b (its pair's 16 bytes at q, Q6_K's order), with the third bit from the
 * block's two masks (NULL: none), minus bias. */
static void x16_crumbs(int32_t k[IG_QK], const uint8_t *q, int b, const uint8_t *masks, int r,
                       int32_t bias) {
    uint64_t m[2] = {0, 0};
    if (masks) memcpy(m, masks, sizeof m);
    const int sh = 4 * (b & 1);
    for (int i = 0; i < 16; i++) {
        const int e = i < 8 ? i : 8 + i;            /* the low value's index; the high's is e + 8 */
        k[e] = (int32_t)(((q[i] >> sh) & 3) | ((m[0] >> (16 * r + i)) & 1) << 2) - bias;
        k[e + 8] = (int32_t)(((q[i] >> (sh + 2)) & 3) | ((m[1] >> (16 * r + i)) & 1) << 2) - bias;
    }
}

/* Row n's block b of a layout: its integers (k[i]), the scale of each half (16 weights) and the
 * offset: the weights are scale * k - offset (Q2_K: offset[half], each half's own). */
static void x16_block(const uint8_t *w, int fmt, int nb, int n, int b, int32_t k[IG_QK],
                      float scale[2], float offset[2]) {
    const int r = n % 4;
    uint16_t h;
    offset[0] = offset[1] = 0.0f;
    if (fmt == IG_WX_Q8) {
        const uint8_t *g = w + (size_t)(n / 4) * IG_Q8P_GROUP_BYTES(nb);
        memcpy(&h, g + ((size_t)b * 4 + r) * 2, sizeof h);
        scale[0] = scale[1] = ig_f16_to_f32(h);
        const uint8_t *q = g + IG_Q8P_SCALE_BYTES(nb) + ((size_t)b * 4 + r) * IG_QK;
        for (int i = 0; i < IG_QK; i++) k[i] = (int32_t)q[i] - 128;
    } else if (fmt == IG_WX_Q5_0) {
        const uint8_t *g = w + (size_t)(n / 4) * IG_Q5P_GROUP_BYTES(nb);
        memcpy(&h, g + ((size_t)b * 4 + r) * 2, sizeof h);
        scale[0] = scale[1] = ig_f16_to_f32(h);
        const uint8_t *mk = g + IG_Q8P_SCALE_BYTES(nb);
        x16_nibbles(k, mk + IG_Q5P_MASK_BYTES(nb) + ((size_t)b * 4 + r) * 16, mk + (size_t)b * 16, r, 16);
    } else if (fmt == IG_WX_Q4K || fmt == IG_WX_Q5K) {
        const int five = fmt == IG_WX_Q5K;
        const uint8_t *g = w + (size_t)(n / 4) * (five ? IG_Q5KP_GROUP_BYTES(nb) : IG_Q4KP_GROUP_BYTES(nb));
        float d, dmin;
        memcpy(&d, g + (size_t)(b / 8) * 32 + (size_t)r * 4, sizeof d);
        memcpy(&dmin, g + (size_t)(b / 8) * 32 + 16 + (size_t)r * 4, sizeof dmin);
        const int8_t *s = (const int8_t *)(g + IG_Q4KP_D_BYTES(nb)) + (size_t)b * 8;
        scale[0] = scale[1] = d * (float)s[r];
        offset[0] = dmin * (float)s[4 + r];
        const uint8_t *mk = g + IG_Q4KP_D_BYTES(nb) + IG_Q8P_SCALE_BYTES(nb);
        x16_nibbles(k, mk + (five ? IG_Q5P_MASK_BYTES(nb) : 0) + ((size_t)b * 4 + r) * 16,
                    five ? mk + (size_t)b * 16 : NULL, r, 0);
    } else if (fmt == IG_WX_Q4_1 || fmt == IG_WX_Q5_1) {
        const int five = fmt == IG_WX_Q5_1;
        const uint8_t *g = w + (size_t)(n / 4) * (five ? IG_Q51P_GROUP_BYTES(nb) : IG_Q41P_GROUP_BYTES(nb));
        memcpy(&h, g + ((size_t)b * 4 + r) * 2, sizeof h);
        scale[0] = scale[1] = ig_f16_to_f32(h);
        memcpy(&h, g + IG_Q8P_SCALE_BYTES(nb) + ((size_t)b * 4 + r) * 2, sizeof h);
        offset[0] = -ig_f16_to_f32(h);                  /* w = d * q + m */
        const uint8_t *mk = g + 2 * IG_Q8P_SCALE_BYTES(nb);
        x16_nibbles(k, mk + (five ? IG_Q5P_MASK_BYTES(nb) : 0) + ((size_t)b * 4 + r) * 16,
                    five ? mk + (size_t)b * 16 : NULL, r, 0);
    } else if (fmt == IG_WX_Q2K) {
        const uint8_t *g = w + (size_t)(n / 4) * IG_Q2KP_GROUP_BYTES(nb);
        float d, dmin;
        memcpy(&d, g + (size_t)(b / 8) * 32 + (size_t)r * 4, sizeof d);
        memcpy(&dmin, g + (size_t)(b / 8) * 32 + 16 + (size_t)r * 4, sizeof dmin);
        const uint8_t *sm = g + IG_Q4KP_D_BYTES(nb) + ((size_t)b * 4 + r) * 2;
        for (int half = 0; half < 2; half++) {
            scale[half] = d * (float)(sm[half] & 15);
            offset[half] = dmin * (float)(sm[half] >> 4);
        }
        x16_crumbs(k, g + IG_Q4KP_D_BYTES(nb) + IG_Q8P_SCALE_BYTES(nb) + ((size_t)(b / 2) * 4 + r) * 16,
                   b, NULL, r, 0);
    } else if (fmt == IG_WX_Q3K) {
        const uint8_t *g = w + (size_t)(n / 4) * IG_Q3KP_GROUP_BYTES(nb);
        float d;
        memcpy(&d, g + ((size_t)(b / 8) * 4 + r) * 4, sizeof d);
        const int8_t *sc = (const int8_t *)(g + IG_Q6KP_D_BYTES(nb)) + ((size_t)b * 4 + r) * 2;
        scale[0] = d * (float)sc[0];
        scale[1] = d * (float)sc[1];
        const uint8_t *mk = g + IG_Q6KP_D_BYTES(nb) + IG_Q8P_SCALE_BYTES(nb);
        x16_crumbs(k, mk + IG_Q5P_MASK_BYTES(nb) + ((size_t)(b / 2) * 4 + r) * 16, b, mk + (size_t)b * 16,
                   r, 4);
    } else {
        const uint8_t *g = w + (size_t)(n / 4) * IG_Q6KP_GROUP_BYTES(nb);
        float d;
        memcpy(&d, g + ((size_t)(b / 8) * 4 + r) * 4, sizeof d);
        const int8_t *sc = (const int8_t *)(g + IG_Q6KP_D_BYTES(nb)) + ((size_t)b * 4 + r) * 2;
        scale[0] = d * (float)sc[0];
        scale[1] = d * (float)sc[1];
        uint64_t m[4];
        memcpy(m, g + IG_Q6KP_D_BYTES(nb) + IG_Q8P_SCALE_BYTES(nb) + (size_t)b * 32, sizeof m);
        const uint8_t *q = g + IG_Q6KP_D_BYTES(nb) + IG_Q8P_SCALE_BYTES(nb) + IG_Q6KP_MASK_BYTES(nb) +
                           ((size_t)b * 4 + r) * 16;
        for (int i = 0; i < 16; i++) {
            const int e = i < 8 ? i : 8 + i;            /* the low nibble's value; the high's is e + 8 */
            const int bit = 16 * r + i;
            k[e] = (int32_t)((q[i] & 15) | ((m[0] >> bit) & 1) << 4 | ((m[1] >> bit) & 1) << 5) - 32;
            k[e + 8] = (int32_t)((q[i] >> 4) | ((m[2] >> bit) & 1) << 4 | ((m[3] >> bit) & 1) << 5) - 32;
        }
    }
}

static float dot_x16(const ig_block_x16 *x, const float *xsum, const uint8_t *w, int fmt, int nb,
                     int n) {
    float acc = 0.0f;
    int32_t k[IG_QK];
    float scale[2], offset[2];
    for (int b = 0; b < nb; b++) {
        x16_block(w, fmt, nb, n, b, k, scale, offset);
        for (int half = 0; half < 2; half++) {
            int32_t s = 0;
            for (int i = 16 * half; i < 16 * half + 16; i++)
                s += k[i] * (256 * (int32_t)x[b].hi[i] + (int32_t)x[b].lo[i]);
            acc += (float)s * (x[b].d * scale[half]);
        }
        if (fmt == IG_WX_Q2K)     /* per half: the sums of the quantized activations */
            acc -= x[b].d * (offset[0] * (float)x[b].s[0] + offset[1] * (float)x[b].s[1]);
        else
            acc -= offset[0] * xsum[b];
    }
    return acc;
}

void ig_matmul_x16_ref(const ig_matmul_args *a, int n_threads) {
    const int T = a->T, N = a->N, nb = a->K / IG_QK;
    const ig_block_x16 *X = a->x;
    IG_FOR(n, N) {
        for (int t = 0; t < T; t++) {
            const ig_block_x16 *x = X + (size_t)t * nb;
            const float *xs = a->xsum + (size_t)t * nb;
            const float v = dot_x16(x, xs, a->w, a->layout, nb, n);
            const float u = a->w2 ? dot_x16(x, xs, a->w2, a->layout2, nb, n) : 0.0f;
            a->out[(size_t)t * a->ldo + n] = IG_MATMUL_EPILOGUE(a, v, u, t, n);
        }
    }
    (void)n_threads;
}
