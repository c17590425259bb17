/* nn.c — row-wise kernels (RMSNorm, rotary embedding) and causal GQA attention over the KV cache.
 * Portable C; each row or head is computed by one thread in one fixed order. */
#include "../ignis.h"

#include <string.h>

void ig_rmsnorm_f32_ref(float *out, const float *x, const float *w, int T, int dim, float eps,
                        int n_threads) {
    IG_FOR_IF(t, T, T > 1 && (int64_t)T * dim >= IG_ROWS_PAR_MIN) {
        const float *xr = x + (size_t)t * dim;
        float *o = out + (size_t)t * dim;
        /* The sum of squares in double: cheap next to the matmuls, and no cancellation worries. */
        double ss = 0.0;
        for (int i = 0; i < dim; i++) ss += (double)xr[i] * xr[i];
        const float r = 1.0f / sqrtf((float)(ss / dim) + eps);
        if (w) {
            for (int i = 0; i < dim; i++) o[i] = (xr[i] * r) * w[i];
        } else {
            for (int i = 0; i < dim; i++) o[i] = xr[i] * r;
        }
    }
    (void)n_threads;
}

void ig_rope_f32_ref(float *out, int64_t ldo, const float *x, int64_t ldx, const int32_t *pos,
                     const float *inv_freq, int T, int n_heads, int head_dim, float theta,
                     int n_threads) {
    const int half = head_dim / 2;
    /* a row's angles cost head_dim/2 pow, cos and sin each: a few rows already pay for threads */
    IG_FOR_IF(t, T, T >= 4) {
        float c[IG_MAX_HEAD_DIM / 2], s[IG_MAX_HEAD_DIM / 2];
        /* transformers: inv_freq = 1 / theta^(2j/d) in f32 (or the config's table), angle =
         * pos * inv_freq in f32; the angle's rounding matters at large positions, so it is
         * reproduced, not improved on. */
        for (int j = 0; j < half; j++) {
            const float e = (float)(2 * j) / (float)head_dim;
            const float inv = inv_freq ? inv_freq[j] : 1.0f / (float)pow((double)theta, (double)e);
            const float ang = (float)pos[t] * inv;
            c[j] = (float)cos((double)ang);
            s[j] = (float)sin((double)ang);
        }
        const float *xrow = x + (size_t)t * ldx;
        float *orow = out + (size_t)t * ldo;
        for (int h = 0; h < n_heads; h++) {
            const float *xa = xrow + (size_t)h * head_dim, *xb = xa + half;
            float *oa = orow + (size_t)h * head_dim, *ob = oa + half;
            for (int j = 0; j < half; j++) {
                const float x0 = xa[j], x1 = xb[j];
                oa[j] = x0 * c[j] - x1 * s[j];
                ob[j] = x1 * c[j] + x0 * s[j];
            }
        }
    }
    (void)n_threads;
}

uint16_t ig_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    const uint32_t mant = x & 0x7fffffu;
    const int exp = (int)((x >> 23) & 0xffu);
    if (exp == 0xff) return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0u));   /* inf, nan */
    const int e = exp - 127 + 15;
    if (e >= 31) return (uint16_t)(sign | 0x7c00u);                             /* overflow */
    if (e <= 0) {                                                                /* subnormal */
        if (e < -10) return sign;
        const uint32_t m = mant | 0x800000u;
        const int shift = 14 - e;
        uint32_t h = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1u), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (h & 1u))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)e << 10) | (mant >> 13);
    const uint32_t rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;   /* a carry rounds up to inf: right */
    return (uint16_t)(sign | h);
}

float ig_f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const int exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ffu, x;
    if (exp == 0) {
        if (mant == 0) {
            x = sign;
        } else {                      /* subnormal: shift the leading one into place */
            int e = -1;
            do {
                e++;
                mant <<= 1;
            } while (!(mant & 0x400u));
            x = sign | ((uint32_t)(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        x = sign | 0x7f800000u | (mant << 13);
    } else {
        x = sign | ((uint32_t)(exp - 15 + 127) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

void ig_f32_to_f16_row(uint16_t *out, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = ig_f32_to_f16(x[i]);
}

#define ATTN(name) name##_ref
#include "attention_tmpl.h"
#undef ATTN
