/* neon.c — AArch64 Advanced SIMD (armv8-a, every AArch64 CPU): the f32 and bf16 matmuls, the
 * integer matmuls with widening multiplies (no dot-product instruction), the activation quantizers
 * and attention. Compiled with -march=armv8-a; the dotprod and i8mm files add the faster integer
 * dots. */
#if defined(__aarch64__) || defined(_M_ARM64)
#include <arm_neon.h>

#include "neon.h"

#include <math.h>
#include <string.h>

/* ---- the blocked matmul (../matmul_tmpl.h) with 4-lane vectors ---- */
static inline float32x4_t ig_neon_loadn(const float *p, int n) {
    float tmp[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int i = 0; i < n; i++) tmp[i] = p[i];
    return vld1q_f32(tmp);
}
#define V float32x4_t
#define VW 4
#define VZERO() vdupq_n_f32(0.0f)
#define VLOAD(p) vld1q_f32(p)
#define VLOADN(p, n) ig_neon_loadn((p), (n))
#define VFMA(a, b, c) vfmaq_f32((c), (a), (b))
#define VSUM(v) vaddvq_f32(v)
#define FN(name) name##_f32_neon
#include "../matmul_tmpl.h"
#undef FN

/* ---- the same matmul with bf16 weights: widened by a 16-bit shift, then the f32 path ---- */
static inline float32x4_t ig_neon_bf16_loadn(const uint16_t *p, int n) {
    uint16_t tmp[4] = {0, 0, 0, 0};
    for (int i = 0; i < n; i++) tmp[i] = p[i];
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(tmp), 16));
}
#define WT uint16_t
#define WLOAD(p) vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16))
#define WLOADN(p, n) ig_neon_bf16_loadn((p), (n))
#define FN(name) name##_bf16_neon
#include "../matmul_tmpl.h"
#undef FN
#undef V
#undef VW
#undef VZERO
#undef VLOAD
#undef VLOADN
#undef VFMA
#undef VSUM

/* ---- the integer matmuls (qdot_tmpl.h): widening multiplies, pairs added into int32 lanes ---- */
static inline int32x4_t ig_ndot_neon(int32x4_t acc, int8x16_t w, int8x16_t x) {
    /* |w * x| <= 128 * 128: each product fits in int16 */
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(w), vget_low_s8(x)));
    return vpadalq_s16(acc, vmull_high_s8(w, x));
}
#define IG_NDOT(acc, w, x) ig_ndot_neon((acc), (w), (x))
#define FN(name) name##_neon
#include "qdot_tmpl.h"
#undef IG_NDOT

/* ---- activation quantization, 4 lanes at a time: the same bytes as ig_quantize_q8_rows_ref (the
 * maximum is exact, the scale and its inverse are the same two divisions, and vcvtnq rounds to
 * nearest even like lrintf) ---- */
static inline float ig_neon_amax32(const float32x4_t v[8]) {   /* ig_block_amax: by bits, a NaN wins */
    const uint32x4_t abs = vdupq_n_u32(0x7fffffffu);
    uint32x4_t m = vandq_u32(vreinterpretq_u32_f32(v[0]), abs);
    for (int i = 1; i < 8; i++) m = vmaxq_u32(m, vandq_u32(vreinterpretq_u32_f32(v[i]), abs));
    const uint32_t u = vmaxvq_u32(m);
    float amax;
    memcpy(&amax, &u, sizeof amax);
    return amax;
}

void ig_quantize_q8_rows_neon(ig_block_q8 *out, const float *x, int64_t ldx, int T, int K) {
    const int nb = K / IG_QK;
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * ldx;
        ig_block_q8 *o = out + (size_t)t * nb;
        for (int b = 0; b < nb; b++) {
            float32x4_t v[8];
            for (int i = 0; i < 8; i++) v[i] = vld1q_f32(xr + (size_t)b * IG_QK + 4 * i);
            const float amax = ig_neon_amax32(v);
            const float d = amax / 127.0f;
            float id = d > 0.0f ? 127.0f / amax : 0.0f;
            if (!(id < INFINITY)) id = 0.0f;
            o[b].d = d;
            if (id == 0.0f) {       /* the twin's all-zero block (v * id may be NaN or inf here) */
                memset(o[b].qs, 0, IG_QK);
                continue;
            }
            const float32x4_t vid = vdupq_n_f32(id);
            for (int i = 0; i < 8; i += 2) {
                const int16x8_t q = vcombine_s16(vmovn_s32(vcvtnq_s32_f32(vmulq_f32(v[i], vid))),
                                                 vmovn_s32(vcvtnq_s32_f32(vmulq_f32(v[i + 1], vid))));
                vst1_s8(o[b].qs + 4 * i, vmovn_s16(q));
            }
        }
    }
}

/* ---- x16 activation quantization: the same bytes and sums as ig_quantize_x16_rows_ref (the same
 * divisions, nearest even, the clamp, floor shifts; the f32 sum in the scalar order) ---- */
void ig_quantize_x16_rows_neon(ig_block_x16 *out, float *xsum, const float *x, int64_t ldx, int T,
                               int K) {
    const int nb = K / IG_QK;
    const int32x4_t lim = vdupq_n_s32(32512), nlim = vdupq_n_s32(-32512), c128 = vdupq_n_s32(128);
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * ldx;
        ig_block_x16 *o = out + (size_t)t * nb;
        for (int b = 0; b < nb; b++) {
            const float *v = xr + (size_t)b * IG_QK;
            float32x4_t vv[8];
            for (int i = 0; i < 8; i++) vv[i] = vld1q_f32(v + 4 * i);
            const float amax = ig_neon_amax32(vv);
            float sum = 0.0f;
            for (int i = 0; i < IG_QK; i++) sum += v[i];
            xsum[(size_t)t * nb + b] = sum;
            const float d = amax / IG_X16_MAX;
            float id = d > 0.0f ? IG_X16_MAX / amax : 0.0f;
            if (!(id < INFINITY)) id = 0.0f;
            o[b].d = d;
            if (id == 0.0f) {       /* the twin's all-zero block (v * id may be NaN or inf here) */
                memset(o[b].hi, 0, IG_QK), memset(o[b].lo, 0, IG_QK);
                o[b].s[0] = o[b].s[1] = 0;
                continue;
            }
            const float32x4_t vid = vdupq_n_f32(id);
            for (int h = 0; h < 2; h++) {
                int32x4_t a[4], hi[4], lo[4];
                for (int i = 0; i < 4; i++) {
                    a[i] = vcvtnq_s32_f32(vmulq_f32(vv[4 * h + i], vid));
                    a[i] = vmaxq_s32(vminq_s32(a[i], lim), nlim);
                    hi[i] = vshrq_n_s32(vaddq_s32(a[i], c128), 8);
                    lo[i] = vsubq_s32(a[i], vshlq_n_s32(hi[i], 8));
                }
                o[b].s[h] = vaddvq_s32(vaddq_s32(vaddq_s32(a[0], a[1]), vaddq_s32(a[2], a[3])));
                const int16x8_t h0 = vcombine_s16(vmovn_s32(hi[0]), vmovn_s32(hi[1]));
                const int16x8_t h1 = vcombine_s16(vmovn_s32(hi[2]), vmovn_s32(hi[3]));
                const int16x8_t l0 = vcombine_s16(vmovn_s32(lo[0]), vmovn_s32(lo[1]));
                const int16x8_t l1 = vcombine_s16(vmovn_s32(lo[2]), vmovn_s32(lo[3]));
                vst1q_s8(o[b].hi + 16 * h, vcombine_s8(vmovn_s16(h0), vmovn_s16(h1)));
                vst1q_s8(o[b].lo + 16 * h, vcombine_s8(vmovn_s16(l0), vmovn_s16(l1)));
            }
        }
    }
}

/* ---- attention (ops/attention_tmpl.h) compiled with this file's flags, f16 cache rows widened
 * by fcvtl (exact: the floats ig_f16_to_f32 gives) ---- */
#define ATTN(name) name##_neon
#define IG_ATTN_F16_ROW 1
static inline void ATTN(f16_row)(float *buf, const uint16_t *h, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(buf + i, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h + i))));
    for (; i < n; i++) buf[i] = vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h[i]))), 0);
}
#include "../../ops/attention_tmpl.h"
#undef ATTN
#endif
