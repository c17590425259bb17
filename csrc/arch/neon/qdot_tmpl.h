/* qdot_tmpl.h — the integer matmuls (q8, q4, and x16 on every IG_WX_* layout) on NEON, instantiated
 * by each file of csrc/arch/neon/ with its own dot instruction. The includer defines:
 *   IG_NDOT(acc, w, x)  int32x4 acc plus the dot products of the int8x16 w and x, four bytes to a
 *                       lane (any split of the 16 products over the lanes: only the total is read)
 *   IG_NMMLA            (optional) vmmlaq_s32 exists: activation rows go through it in pairs
 *   FN(name)            adds the file's suffix
 *
 * Bit for bit the portable twins (ops/quant.c, ops/quant_x16.c). A tile is one packed group (4
 * weight rows, one per vector lane) against up to 4 activation rows. Per block, the group's 4 x 32
 * integers are decoded once into signed bytes in the twin's order (k[i], i = 0..31; the layout's
 * nibbles, crumbs, fifth or sixth bits and bias undone), and each row's scales and offsets are
 * computed with the twin's float operations. Per activation row the dot of each weight row with the
 * block is an exact int32 (the twin's `s`, per half of 16 for x16: s = 256 * (k . hi) + k . lo),
 * and the lane of each weight row takes the twin's update: acc + (float)s * (d_x * scale), then
 * the offset term, with no fused multiply-add (setup.py compiles aarch64 with -ffp-contract=off).
 * So the result is the twin's whatever the instruction that formed s, the tile or the threads.
 */

#include <arm_neon.h>
#include <string.h>

/* the q4 packing: not an x16 layout, but decoded by the same tile */
#define IG_NQ4 100

/* 16 bits of a 64-bit mask, bit 16r+i (little endian: bit i%8 of byte 2r+i/8), spread to bytes:
 * 0xFF where the bit is set */
static inline uint8x16_t FN(nbits)(const uint8_t *m, int r) {
    static const uint8_t sel[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t rep = vcombine_u8(vdup_n_u8(m[2 * r]), vdup_n_u8(m[2 * r + 1]));
    return vtstq_u8(rep, vld1q_u8(sel));
}

/* 4 IEEE halves to f32 (exact, as ig_f16_to_f32) */
static inline float32x4_t FN(nhalf4)(const uint8_t *p) {
    return vcvt_f32_f16(vreinterpret_f16_u8(vld1_u8(p)));
}

/* 8 int8 laid out (row 0 half 0, row 0 half 1, row 1 half 0, ...) to f32 per half */
static inline void FN(nsc8)(float32x4_t out[2], const uint8_t *p, int is_signed) {
    int32x4_t e, o;
    if (is_signed) {
        const int32x4_t w = vreinterpretq_s32_s16(vmovl_s8(vld1_s8((const int8_t *)p)));
        e = vmovl_s16(vmovn_s32(w));
        o = vmovl_s16(vshrn_n_s32(w, 16));
    } else {
        const uint32x4_t w = vreinterpretq_u32_u16(vmovl_u8(vld1_u8(p)));
        e = vreinterpretq_s32_u32(vmovl_u16(vmovn_u32(w)));
        o = vreinterpretq_s32_u32(vmovl_u16(vshrn_n_u32(w, 16)));
    }
    out[0] = vcvtq_f32_s32(e);
    out[1] = vcvtq_f32_s32(o);
}

/* 4 int8 to f32 */
static inline float32x4_t FN(ns4)(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return vcvtq_f32_s32(vmovl_s16(vget_low_s16(vmovl_s8(vreinterpret_s8_s32(vdup_n_s32(v))))));
}

/* One block of a group, decoded: per row r its integers k[r][half] (16 each, the twin's order),
 * per half the rows' scales, and the offsets (off[0]: the one that multiplies xsum; Q2_K: one per
 * half, multiplying d_x * s[half]) */
typedef struct {
    int8x16_t   k[4][2];
    float32x4_t scale[2], off[2];
} FN(nblock);

static inline __attribute__((always_inline)) void FN(ndecode)(FN(nblock) *o, const uint8_t *g,
                                                              int nb, int b, const int FMT) {
    const int64_t sb = IG_Q8P_SCALE_BYTES(nb);
    const uint8x16_t m4 = vdupq_n_u8(15), m2 = vdupq_n_u8(3);
    o->off[0] = o->off[1] = vdupq_n_f32(0.0f);
    if (FMT == IG_WX_Q8) {
        o->scale[0] = o->scale[1] = FN(nhalf4)(g + 8 * (int64_t)b);
        const uint8_t *q = g + sb + (int64_t)b * 128;
        const uint8x16_t flip = vdupq_n_u8(0x80);
        for (int r = 0; r < 4; r++)
            for (int h = 0; h < 2; h++)
                o->k[r][h] = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(q + 32 * r + 16 * h), flip));
        return;
    }
    if (FMT == IG_WX_Q6K || FMT == IG_WX_Q3K || FMT == IG_WX_Q2K) {
        /* values by sub-block of 16 in Q6_K's order: the low pieces hold k[0..7] and k[16..23],
         * the high ones k[8..15] and k[24..31] */
        const int Q6 = FMT == IG_WX_Q6K, Q2 = FMT == IG_WX_Q2K;
        uint8x16_t lo[4], hi[4];
        int8_t bias;
        if (Q2) {
            const uint8_t *sup = g + 32 * (int64_t)(b / 8);
            const float32x4_t d = vld1q_f32((const float *)sup), dmin = vld1q_f32((const float *)(sup + 16));
            const uint8_t *sm = g + IG_Q4KP_D_BYTES(nb) + 8 * (int64_t)b;
            uint8_t sc[8], mn[8];
            for (int i = 0; i < 8; i++) {
                sc[i] = sm[i] & 15;
                mn[i] = sm[i] >> 4;
            }
            float32x4_t s2[2], m2v[2];
            FN(nsc8)(s2, sc, 0);
            FN(nsc8)(m2v, mn, 0);
            for (int h = 0; h < 2; h++) {
                o->scale[h] = vmulq_f32(d, s2[h]);
                o->off[h] = vmulq_f32(dmin, m2v[h]);
            }
            bias = 0;
        } else {
            const float32x4_t d = vld1q_f32((const float *)(g + 16 * (int64_t)(b / 8)));
            float32x4_t sc[2];
            FN(nsc8)(sc, g + IG_Q6KP_D_BYTES(nb) + 8 * (int64_t)b, 1);
            o->scale[0] = vmulq_f32(d, sc[0]);
            o->scale[1] = vmulq_f32(d, sc[1]);
            bias = Q6 ? 32 : 4;
        }
        const int64_t db = Q2 ? IG_Q4KP_D_BYTES(nb) : IG_Q6KP_D_BYTES(nb);
        const uint8_t *mk = g + db + sb;
        if (Q6) {
            const uint8_t *m = mk + (int64_t)b * 32;
            const uint8_t *q = mk + IG_Q6KP_MASK_BYTES(nb) + (int64_t)b * 64;
            const uint8x16_t b16 = vdupq_n_u8(16), b32 = vdupq_n_u8(32);
            for (int r = 0; r < 4; r++) {
                const uint8x16_t v = vld1q_u8(q + 16 * r);
                lo[r] = vorrq_u8(vorrq_u8(vandq_u8(v, m4), vandq_u8(FN(nbits)(m, r), b16)),
                                 vandq_u8(FN(nbits)(m + 8, r), b32));
                hi[r] = vorrq_u8(vorrq_u8(vshrq_n_u8(v, 4), vandq_u8(FN(nbits)(m + 16, r), b16)),
                                 vandq_u8(FN(nbits)(m + 24, r), b32));
            }
        } else {
            const uint8_t *q = mk + (Q2 ? 0 : IG_Q5P_MASK_BYTES(nb)) + (int64_t)(b / 2) * 64;
            const uint8_t *m = mk + (int64_t)b * 16;
            const uint8x16_t b4 = vdupq_n_u8(4);
            for (int r = 0; r < 4; r++) {
                uint8x16_t v = vld1q_u8(q + 16 * r);
                if (b & 1) v = vshrq_n_u8(v, 4);
                lo[r] = vandq_u8(v, m2);
                hi[r] = vandq_u8(vshrq_n_u8(v, 2), m2);
                if (!Q2) {
                    lo[r] = vorrq_u8(lo[r], vandq_u8(FN(nbits)(m, r), b4));
                    hi[r] = vorrq_u8(hi[r], vandq_u8(FN(nbits)(m + 8, r), b4));
                }
            }
        }
        const int8x16_t vb = vdupq_n_s8(bias);
        for (int r = 0; r < 4; r++) {
            const int8x16_t l = vsubq_s8(vreinterpretq_s8_u8(lo[r]), vb);
            const int8x16_t h = vsubq_s8(vreinterpretq_s8_u8(hi[r]), vb);
            o->k[r][0] = vcombine_s8(vget_low_s8(l), vget_low_s8(h));
            o->k[r][1] = vcombine_s8(vget_high_s8(l), vget_high_s8(h));
        }
        return;
    }
    /* the nibble layouts: per row 16 bytes, the low nibbles k[0..15], the high ones k[16..31] */
    const int FIVE = FMT == IG_WX_Q5_0 || FMT == IG_WX_Q5_1 || FMT == IG_WX_Q5K;
    const uint8_t *m = NULL, *q;
    int8_t bias = 0;
    if (FMT == IG_NQ4 || FMT == IG_WX_Q5_0) {
        o->scale[0] = o->scale[1] = FN(nhalf4)(g + 8 * (int64_t)b);
        bias = FMT == IG_NQ4 ? 8 : 16;
        m = g + sb + (int64_t)b * 16;
        q = g + sb + (FIVE ? IG_Q5P_MASK_BYTES(nb) : 0) + (int64_t)b * 64;
    } else if (FMT == IG_WX_Q4_1 || FMT == IG_WX_Q5_1) {
        o->scale[0] = o->scale[1] = FN(nhalf4)(g + 8 * (int64_t)b);
        o->off[0] = vnegq_f32(FN(nhalf4)(g + sb + 8 * (int64_t)b));      /* w = d * q + m */
        m = g + 2 * sb + (int64_t)b * 16;
        q = g + 2 * sb + (FIVE ? IG_Q5P_MASK_BYTES(nb) : 0) + (int64_t)b * 64;
    } else {                                   /* IG_WX_Q4K, IG_WX_Q5K */
        const uint8_t *sup = g + 32 * (int64_t)(b / 8);
        const uint8_t *s = g + IG_Q4KP_D_BYTES(nb) + 8 * (int64_t)b;
        o->scale[0] = o->scale[1] = vmulq_f32(vld1q_f32((const float *)sup), FN(ns4)(s));
        o->off[0] = vmulq_f32(vld1q_f32((const float *)(sup + 16)), FN(ns4)(s + 4));
        const uint8_t *mk = g + IG_Q4KP_D_BYTES(nb) + sb;
        m = mk + (int64_t)b * 16;
        q = mk + (FIVE ? IG_Q5P_MASK_BYTES(nb) : 0) + (int64_t)b * 64;
    }
    const uint8x16_t b16 = vdupq_n_u8(16);
    const int8x16_t vb = vdupq_n_s8(bias);
    for (int r = 0; r < 4; r++) {
        const uint8x16_t v = vld1q_u8(q + 16 * r);
        uint8x16_t l = vandq_u8(v, m4), h = vshrq_n_u8(v, 4);
        if (FIVE) {
            l = vorrq_u8(l, vandq_u8(FN(nbits)(m, r), b16));
            h = vorrq_u8(h, vandq_u8(FN(nbits)(m + 8, r), b16));
        }
        o->k[r][0] = vsubq_s8(vreinterpretq_s8_u8(l), vb);
        o->k[r][1] = vsubq_s8(vreinterpretq_s8_u8(h), vb);
    }
}

/* [total of p0, of p1, of p2, of p3] */
static inline int32x4_t FN(nrows)(int32x4_t p0, int32x4_t p1, int32x4_t p2, int32x4_t p3) {
    return vpaddq_s32(vpaddq_s32(p0, p1), vpaddq_s32(p2, p3));
}

/* The exact integer dots of one activation row's block with the group's 4 rows: for q8
 * activations s[0] (the whole block), for x16 s[0] and s[1] (per half). */
static inline __attribute__((always_inline)) void FN(ndot1)(int32x4_t s[2], const FN(nblock) *k,
                                                            const void *xb, const int X16) {
    const int32x4_t z = vdupq_n_s32(0);
    int32x4_t p[4][2];
    if (X16) {
        const ig_block_x16 *x = xb;
        for (int h = 0; h < 2; h++) {
            const int8x16_t xh = vld1q_s8(x->hi + 16 * h), xl = vld1q_s8(x->lo + 16 * h);
            for (int r = 0; r < 4; r++)
                p[r][h] = IG_NDOT(vshlq_n_s32(IG_NDOT(z, k->k[r][h], xh), 8), k->k[r][h], xl);
        }
        s[0] = FN(nrows)(p[0][0], p[1][0], p[2][0], p[3][0]);
        s[1] = FN(nrows)(p[0][1], p[1][1], p[2][1], p[3][1]);
    } else {
        const ig_block_q8 *x = xb;
        const int8x16_t x0 = vld1q_s8(x->qs), x1 = vld1q_s8(x->qs + 16);
        for (int r = 0; r < 4; r++) p[r][0] = IG_NDOT(IG_NDOT(z, k->k[r][0], x0), k->k[r][1], x1);
        s[0] = FN(nrows)(p[0][0], p[1][0], p[2][0], p[3][0]);
    }
}

#ifdef IG_NMMLA
/* rows (row-pair) x (activation pair) products over 16 bytes: [r.t0, r.t1, r'.t0, r'.t1] */
static inline int32x4_t FN(nmm16)(int32x4_t acc, int8x16_t r0, int8x16_t r1, int8x16_t t0,
                                  int8x16_t t1) {
    const int8x16_t a1 = vreinterpretq_s8_s64(vzip1q_s64(vreinterpretq_s64_s8(r0), vreinterpretq_s64_s8(r1)));
    const int8x16_t a2 = vreinterpretq_s8_s64(vzip2q_s64(vreinterpretq_s64_s8(r0), vreinterpretq_s64_s8(r1)));
    const int8x16_t b1 = vreinterpretq_s8_s64(vzip1q_s64(vreinterpretq_s64_s8(t0), vreinterpretq_s64_s8(t1)));
    const int8x16_t b2 = vreinterpretq_s8_s64(vzip2q_s64(vreinterpretq_s64_s8(t0), vreinterpretq_s64_s8(t1)));
    return vmmlaq_s32(vmmlaq_s32(acc, a1, b1), a2, b2);
}

/* ndot1 for two activation rows at once: s0 for the first, s1 for the second */
static inline __attribute__((always_inline)) void FN(ndot2)(int32x4_t s0[2], int32x4_t s1[2],
                                                            const FN(nblock) *k, const void *xa,
                                                            const void *xb, const int X16) {
    const int32x4_t z = vdupq_n_s32(0);
    if (X16) {
        const ig_block_x16 *a = xa, *b = xb;
        for (int h = 0; h < 2; h++) {
            const int8x16_t ha = vld1q_s8(a->hi + 16 * h), la = vld1q_s8(a->lo + 16 * h);
            const int8x16_t hb = vld1q_s8(b->hi + 16 * h), lb = vld1q_s8(b->lo + 16 * h);
            int32x4_t p[2];
            for (int r = 0; r < 2; r++) {
                const int8x16_t w0 = k->k[2 * r][h], w1 = k->k[2 * r + 1][h];
                p[r] = FN(nmm16)(vshlq_n_s32(FN(nmm16)(z, w0, w1, ha, hb), 8), w0, w1, la, lb);
            }
            s0[h] = vuzp1q_s32(p[0], p[1]);
            s1[h] = vuzp2q_s32(p[0], p[1]);
        }
    } else {
        const ig_block_q8 *a = xa, *b = xb;
        const int8x16_t a0 = vld1q_s8(a->qs), a1 = vld1q_s8(a->qs + 16);
        const int8x16_t b0 = vld1q_s8(b->qs), b1 = vld1q_s8(b->qs + 16);
        int32x4_t p[2];
        for (int r = 0; r < 2; r++)
            p[r] = FN(nmm16)(FN(nmm16)(z, k->k[2 * r][0], k->k[2 * r + 1][0], a0, b0),
                             k->k[2 * r][1], k->k[2 * r + 1][1], a1, b1);
        s0[0] = vuzp1q_s32(p[0], p[1]);
        s1[0] = vuzp2q_s32(p[0], p[1]);
    }
}
#endif

/* the twin's update of each row's sum with one activation block (d_x, its half sums, xsum) */
static inline __attribute__((always_inline)) float32x4_t FN(naccum)(
        float32x4_t acc, const int32x4_t s[2], const FN(nblock) *k, const void *xb, float xsum,
        const int FMT, const int X16) {
    if (!X16) {
        const float dx = ((const ig_block_q8 *)xb)->d;
        return vaddq_f32(acc, vmulq_f32(vcvtq_f32_s32(s[0]), vmulq_f32(vdupq_n_f32(dx), k->scale[0])));
    }
    const ig_block_x16 *x = xb;
    const float32x4_t dx = vdupq_n_f32(x->d);
    acc = vaddq_f32(acc, vmulq_f32(vcvtq_f32_s32(s[0]), vmulq_f32(dx, k->scale[0])));
    acc = vaddq_f32(acc, vmulq_f32(vcvtq_f32_s32(s[1]), vmulq_f32(dx, k->scale[1])));
    if (FMT == IG_WX_Q2K)
        return vsubq_f32(acc, vmulq_f32(dx, vaddq_f32(vmulq_f32(k->off[0], vdupq_n_f32((float)x->s[0])),
                                                      vmulq_f32(k->off[1], vdupq_n_f32((float)x->s[1])))));
    return vsubq_f32(acc, vmulq_f32(k->off[0], vdupq_n_f32(xsum)));
}

/* acc[t] = the 4 rows of the group g against activation rows t < TT (x: ldx blocks apart) */
static inline __attribute__((always_inline)) void FN(ntile)(
        float32x4_t acc[4], const void *x, const float *xs, int64_t ldx, const uint8_t *g, int nb,
        const int FMT, const int X16, const int TT) {
    for (int t = 0; t < TT; t++) acc[t] = vdupq_n_f32(0.0f);
    const size_t xbytes = X16 ? sizeof(ig_block_x16) : sizeof(ig_block_q8);
    for (int b = 0; b < nb; b++) {
        FN(nblock) k;
        FN(ndecode)(&k, g, nb, b, FMT);
        int t = 0;
#ifdef IG_NMMLA
        for (; t + 2 <= TT; t += 2) {
            const void *xa = (const char *)x + ((size_t)t * ldx + b) * xbytes;
            const void *xb = (const char *)x + ((size_t)(t + 1) * ldx + b) * xbytes;
            int32x4_t s0[2], s1[2];
            FN(ndot2)(s0, s1, &k, xa, xb, X16);
            acc[t] = FN(naccum)(acc[t], s0, &k, xa, X16 ? xs[t * ldx + b] : 0.0f, FMT, X16);
            acc[t + 1] = FN(naccum)(acc[t + 1], s1, &k, xb, X16 ? xs[(t + 1) * ldx + b] : 0.0f, FMT, X16);
        }
#endif
        for (; t < TT; t++) {
            const void *xb = (const char *)x + ((size_t)t * ldx + b) * xbytes;
            int32x4_t s[2];
            FN(ndot1)(s, &k, xb, X16);
            acc[t] = FN(naccum)(acc[t], s, &k, xb, X16 ? xs[t * ldx + b] : 0.0f, FMT, X16);
        }
    }
}

#define IG_NTILE_TT(FMT, X16)                                                                      \
    do {                                                                                           \
        if (tt == 4) FN(ntile)(acc, x, xs, nb, g, nb, FMT, X16, 4);                                \
        else if (tt == 3) FN(ntile)(acc, x, xs, nb, g, nb, FMT, X16, 3);                           \
        else if (tt == 2) FN(ntile)(acc, x, xs, nb, g, nb, FMT, X16, 2);                           \
        else FN(ntile)(acc, x, xs, nb, g, nb, FMT, X16, 1);                                        \
    } while (0)

/* one tile of the packing (IG_PACK_Q8, IG_PACK_Q4 or IG_PACK_X16 with its layout fmt): each
 * layout's tile compiled for it */
static void FN(ngroup)(float32x4_t acc[4], int packing, int fmt, const void *x, const float *xs,
                       const uint8_t *g, int nb, int tt) {
    if (packing == IG_PACK_Q8) {
        IG_NTILE_TT(IG_WX_Q8, 0);
        return;
    }
    if (packing == IG_PACK_Q4) {
        IG_NTILE_TT(IG_NQ4, 0);
        return;
    }
    switch (fmt) {
    case IG_WX_Q5_0: IG_NTILE_TT(IG_WX_Q5_0, 1); return;
    case IG_WX_Q6K: IG_NTILE_TT(IG_WX_Q6K, 1); return;
    case IG_WX_Q4K: IG_NTILE_TT(IG_WX_Q4K, 1); return;
    case IG_WX_Q4_1: IG_NTILE_TT(IG_WX_Q4_1, 1); return;
    case IG_WX_Q5_1: IG_NTILE_TT(IG_WX_Q5_1, 1); return;
    case IG_WX_Q5K: IG_NTILE_TT(IG_WX_Q5K, 1); return;
    case IG_WX_Q3K: IG_NTILE_TT(IG_WX_Q3K, 1); return;
    case IG_WX_Q2K: IG_NTILE_TT(IG_WX_Q2K, 1); return;
    default: IG_NTILE_TT(IG_WX_Q8, 1); return;
    }
}
#undef IG_NTILE_TT

static int64_t FN(ngroup_bytes)(int packing, int fmt, int nb) {
    if (packing == IG_PACK_Q8) return IG_Q8P_GROUP_BYTES(nb);
    if (packing == IG_PACK_Q4) return IG_Q4P_GROUP_BYTES(nb);
    switch (fmt) {
    case IG_WX_Q5_0: return IG_Q5P_GROUP_BYTES(nb);
    case IG_WX_Q6K: return IG_Q6KP_GROUP_BYTES(nb);
    case IG_WX_Q4K: return IG_Q4KP_GROUP_BYTES(nb);
    case IG_WX_Q4_1: return IG_Q41P_GROUP_BYTES(nb);
    case IG_WX_Q5_1: return IG_Q51P_GROUP_BYTES(nb);
    case IG_WX_Q5K: return IG_Q5KP_GROUP_BYTES(nb);
    case IG_WX_Q3K: return IG_Q3KP_GROUP_BYTES(nb);
    case IG_WX_Q2K: return IG_Q2KP_GROUP_BYTES(nb);
    default: return IG_Q8P_GROUP_BYTES(nb);
    }
}

#define IG_NGROUPS 4   /* packed groups (4 rows each) per parallel block */

/* The driver of the three packings: parallel over blocks of IG_NGROUPS groups; per group, tiles of
 * up to 4 activation rows, w's dots and w2's (the SwiGLU form), then the epilogue. */
static void FN(nmatmul)(const ig_matmul_args *a, int packing, int n_threads) {
    const int T = a->T, N = a->N, nb = a->K / IG_QK;
    const int X16 = packing == IG_PACK_X16;
    const size_t xbytes = X16 ? sizeof(ig_block_x16) : sizeof(ig_block_q8);
    const int64_t gb = FN(ngroup_bytes)(packing, a->layout, nb);
    const int64_t gb2 = a->w2 ? FN(ngroup_bytes)(packing, a->layout2, nb) : 0;
    const int n_groups = (N + 3) / 4, n_par = (n_groups + IG_NGROUPS - 1) / IG_NGROUPS;
    IG_FOR(blk, n_par) {
        const int g0 = blk * IG_NGROUPS;
        const int g1 = g0 + IG_NGROUPS < n_groups ? g0 + IG_NGROUPS : n_groups;
        float32x4_t acc[4], acc2[4];
        float v[4][4], u[4][4];
        for (int t = 0; t < T; t += 4) {
            const int tt = T - t < 4 ? T - t : 4;
            const void *x = (const char *)a->x + (size_t)t * nb * xbytes;
            const float *xs = X16 ? a->xsum + (size_t)t * nb : NULL;
            for (int gi = g0; gi < g1; gi++) {
                FN(ngroup)(acc, packing, a->layout, x, xs, (const uint8_t *)a->w + gi * gb, nb, tt);
                for (int i = 0; i < tt; i++) vst1q_f32(v[i], acc[i]);
                if (a->w2) {
                    FN(ngroup)(acc2, packing, a->layout2, x, xs, (const uint8_t *)a->w2 + gi * gb2, nb, tt);
                    for (int i = 0; i < tt; i++) vst1q_f32(u[i], acc2[i]);
                }
                const int n = gi * 4, nt = N - n < 4 ? N - n : 4;
                for (int i = 0; i < tt; i++)
                    for (int j = 0; j < nt; j++)
                        a->out[(size_t)(t + i) * a->ldo + n + j] =
                            IG_MATMUL_EPILOGUE(a, v[i][j], a->w2 ? u[i][j] : 0.0f, t + i, n + j);
            }
        }
    }
    (void)n_threads;
}
#undef IG_NGROUPS

void FN(ig_matmul_q8)(const ig_matmul_args *a, int n_threads) { FN(nmatmul)(a, IG_PACK_Q8, n_threads); }
void FN(ig_matmul_q4)(const ig_matmul_args *a, int n_threads) { FN(nmatmul)(a, IG_PACK_Q4, n_threads); }
void FN(ig_matmul_x16)(const ig_matmul_args *a, int n_threads) { FN(nmatmul)(a, IG_PACK_X16, n_threads); }

#undef IG_NQ4
