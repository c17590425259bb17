/* attention_avx2.h — the AVX2 parts of the attention template (ops/attention_tmpl.h): f16 cache
 * rows widened by F16C; the tiled path's block of 16 keys against 16 queries (lanes as the vector
 * lanes) and its weighted sums; its decode shape (few lanes: keys as the vector lanes, element d of
 * a block's 16 keys two 8-lane vectors read from the transposed key block in place, values read in
 * place where the whole block is read). Included by arch/avx2.c, with its flags and ATTN defined,
 * before the template.
 *
 * Same bits as the template's tiled block (ATTN(tile_block_ref), ATTN(tile_pv_ref)), and so as the
 * portable twin: each score is q_0*k_0 + q_1*k_1 + ... one product and one sum at a time in the
 * order of d, from 0, then the scale; each output o * al, then + p_j * v_j in the order of j. The
 * sources are compiled as ISO C (-std=c11: no contraction), so the template's products and sums
 * are separate roundings, and so are these (mul then add, never fma). The online softmax step is
 * the template's in vectors, its exp ig_expf_f32's (expf4_edges_avx2 in arch/avx2.c). */
#include "../ops/attention_tile.h"

#define IG_ATTN_F16_ROW 1   /* ATTN(f16_row) below replaces the template's */

static inline void ATTN(f16_row)(float *buf, const uint16_t *h, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(buf + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
    for (; i < n; i++) buf[i] = _cvtsh_ss(h[i]);
}

/* 8 values of a cache at element i: f32 as stored, or f16 widened (exactly) by vcvtph2ps */
static inline __attribute__((always_inline)) __m256 ATTN(load8)(const void *cache, size_t i,
                                                                const int f16) {
    return f16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)cache + i)))
               : _mm256_loadu_ps((const float *)cache + i);
}

/* The online softmax step of four lanes (at l) for the block at k0, x[j] their scaled scores for
 * key j: ATTN(tile_block_ref)'s arithmetic lane by lane, so its bits. The maximum is vertical (x > m
 * ? x : m in key order, as the scalar compare), each exp is ig_expf_f32 of four lanes, each lane's
 * sum l * alpha + p_0 + ... + p_15 a chain of vector adds in key order; a key outside a lane's
 * range [lf, lp] weighs 0 and its exp is not taken (its argument is 0). */
static inline void ATTN(step4)(ig_attn_tile *tl, int l, const __m128 x[16], int k0) {
    const size_t nlp = (size_t)tl->nlp;
    const __m128 ninf = _mm_set1_ps(-INFINITY);
    const __m128i k = _mm_set1_epi32(k0);
    const __m128i a = _mm_sub_epi32(_mm_loadu_si128((const __m128i *)(tl->lf + l)), k);
    const __m128i b = _mm_sub_epi32(_mm_loadu_si128((const __m128i *)(tl->lp + l)), k);
    const __m128 mo = _mm_loadu_ps(tl->m + l);
    __m128 m = mo, valid[16];
    for (int j = 0; j < 16; j++) {
        const __m128i jv = _mm_set1_epi32(j);
        valid[j] = _mm_castsi128_ps(_mm_xor_si128(
            _mm_or_si128(_mm_cmpgt_epi32(a, jv), _mm_cmpgt_epi32(jv, b)), _mm_set1_epi32(-1)));
        m = _mm_max_ps(_mm_blendv_ps(ninf, x[j], valid[j]), m);
    }
    const __m128 none = _mm_cmpeq_ps(mo, ninf);       /* lanes with no key before: alpha 0 */
    const __m128 alpha = _mm_andnot_ps(none, expf4_edges_avx2(_mm_andnot_ps(none, _mm_sub_ps(mo, m))));
    __m128 sum = _mm_mul_ps(_mm_loadu_ps(tl->l + l), alpha);
    for (int j = 0; j < 16; j++) {
        const __m128 p = _mm_and_ps(valid[j], expf4_edges_avx2(_mm_and_ps(valid[j], _mm_sub_ps(x[j], m))));
        _mm_storeu_ps(tl->p + (size_t)j * nlp + l, p);
        sum = _mm_add_ps(sum, p);
    }
    _mm_storeu_ps(tl->m + l, m);
    _mm_storeu_ps(tl->l + l, sum);
    _mm_storeu_ps(tl->al + l, alpha);
}

/* ---- the tiled path's block (ops/attention_tmpl.h, IG_ATTN_TILE_FAST): lanes are queries, 8 a
 * vector. ATTN(tile_block_ref)'s arithmetic (each score a product then a sum over d in order, then
 * the scale; the online softmax step lane by lane; ig_expf_f32), so its bits, without what the
 * compiler made of it (its 16 x 4 sums shuffled and spilled) ---- */
#define IG_ATTN_TILE_FAST 1

/* s[j] = sum over d of kb[d * 16 + j] * q_d for 8 lanes (qt) and 8 keys (kb) */
static inline __attribute__((always_inline)) void ATTN(tile_scores8)(
        __m256 s[8], const float *qt, size_t nlp, const float *kb, const int hd) {
    for (int j = 0; j < 8; j++) s[j] = _mm256_setzero_ps();
    for (int d = 0; d < hd; d++) {
        const __m256 qd = _mm256_loadu_ps(qt + (size_t)d * nlp);
        for (int j = 0; j < 8; j++)
            s[j] = _mm256_add_ps(s[j], _mm256_mul_ps(_mm256_broadcast_ss(kb + (size_t)d * 16 + j), qd));
    }
}

/* 16 lanes (at l0) against the block's 16 keys kb (head_dim, 16), 8 lanes at a time: their
 * scores, scaled, then ATTN(step4) on each four */
static inline void ATTN(tile_block16)(ig_attn_tile *tl, int l0, const float *kb, int k0,
                                      float scale) {
    const int hd = tl->head_dim;
    const size_t nlp = (size_t)tl->nlp;
    const __m256 vs = _mm256_set1_ps(scale);
    for (int l = l0; l < l0 + 16; l += 8) {
        __m256 s[16];
        for (int j0 = 0; j0 < 16; j0 += 8) {
            if (hd == 64) ATTN(tile_scores8)(s + j0, tl->qt + l, nlp, kb + j0, 64);
            else if (hd == 128) ATTN(tile_scores8)(s + j0, tl->qt + l, nlp, kb + j0, 128);
            else ATTN(tile_scores8)(s + j0, tl->qt + l, nlp, kb + j0, 256);
        }
        __m128 lo[16], hi[16];
        for (int j = 0; j < 16; j++) {
            const __m256 sj = _mm256_mul_ps(s[j], vs);
            lo[j] = _mm256_castps256_ps128(sj);
            hi[j] = _mm256_extractf128_ps(sj, 1);
        }
        ATTN(step4)(tl, l, lo, k0);
        ATTN(step4)(tl, l + 4, hi, k0);
    }
}

/* ---- the decode shape (ops/attention_tmpl.h ATTN(tile_few_run)) ---- */
#define IG_ATTN_TILE_FEW 8   /* tiles of at most 8 lanes take it */

/* lanes scored per block (R: nl rounded up to 1, 2, 4 or 8) and blocks per call (R x blocks <= 8,
 * the template's score buffer) */
static inline int ATTN(few_lanes)(int nl, int hd) {
    (void)hd;
    return nl <= 1 ? 1 : nl <= 2 ? 2 : nl <= 4 ? 4 : 8;
}
static inline int ATTN(few_blocks)(int nl, int hd) {
    const int R = ATTN(few_lanes)(nl, hd);
    return R == 8 ? 1 : R == 4 ? 2 : 4;
}

/* RP lanes x BP blocks x 2 halves of 16 keys = 8 chains, interleaved (the sum's latency):
 * s[b * bs + r * 16 + j] = scale * (q_r . k_j of block b), block b's keys at element kat[b] of the
 * cache (f32, or f16 when F16), (hd, 16). With ah (the call's first pass), every hd / 16 steps of
 * d one position of the next call's nb blocks is prefetched: their lines spread over the loop */
static inline __attribute__((always_inline)) void ATTN(few_scores_rb)(
        float *s, size_t bs, const float *qt, size_t nlp, const void *cache, const size_t *kat,
        float scale, const ig_attn_ahead *ah, int nb, const int RP, const int BP, const int hd,
        const int F16) {
    __m256 acc[8];
    for (int i = 0; i < 2 * RP * BP; i++) acc[i] = _mm256_setzero_ps();
    for (int d = 0; d < hd; d++) {
        if (ah && d % (hd / 16) == 0) ig_attn_ahead_pos(ah, nb, d / (hd / 16));
        for (int b = 0; b < BP; b++) {
            const __m256 k0 = ATTN(load8)(cache, kat[b] + (size_t)d * 16, F16);
            const __m256 k1 = ATTN(load8)(cache, kat[b] + (size_t)d * 16 + 8, F16);
            for (int r = 0; r < RP; r++) {
                const __m256 q = _mm256_broadcast_ss(qt + (size_t)d * nlp + r);
                const int i = 2 * (b * RP + r);
                acc[i] = _mm256_add_ps(acc[i], _mm256_mul_ps(k0, q));
                acc[i + 1] = _mm256_add_ps(acc[i + 1], _mm256_mul_ps(k1, q));
            }
        }
    }
    const __m256 vs = _mm256_set1_ps(scale);
    for (int b = 0; b < BP; b++)
        for (int r = 0; r < RP; r++) {
            const int i = 2 * (b * RP + r);
            _mm256_storeu_ps(s + b * bs + (size_t)r * 16, _mm256_mul_ps(acc[i], vs));
            _mm256_storeu_ps(s + b * bs + (size_t)r * 16 + 8, _mm256_mul_ps(acc[i + 1], vs));
        }
}

#define IG_FEW_SCORES(RP, BP, HD)                                                                  \
    (f16 ? ATTN(few_scores_rb)(sp, bs, qt, nlp, cache, kb, scale, pa, NB, RP, BP, HD, 1)           \
         : ATTN(few_scores_rb)(sp, bs, qt, nlp, cache, kb, scale, pa, NB, RP, BP, HD, 0))
#define IG_FEW_SCORES_HD(RP, BP)                                                                   \
    do {                                                                                           \
        if (hd == 64) IG_FEW_SCORES(RP, BP, 64);                                                   \
        else if (hd == 128) IG_FEW_SCORES(RP, BP, 128);                                            \
        else IG_FEW_SCORES(RP, BP, 256);                                                           \
    } while (0)
/* s[(b * R + r) * 16 + j] for the R lanes (ATTN(few_lanes)) and the blocks b at kat[b]: passes of
 * 4 lanes x 1 block, 2 x 2 or 1 x 4 */
static inline void ATTN(few_scores)(float *s, const ig_attn_tile *tl, const void *cache, int f16,
                                    const size_t *kat, int nl, float scale, const ig_attn_ahead *ah) {
    const size_t nlp = (size_t)tl->nlp;
    const int hd = tl->head_dim, R = ATTN(few_lanes)(nl, hd), NB = ATTN(few_blocks)(nl, hd);
    const int RP = R < 4 ? R : 4, BP = 4 / RP;
    const size_t bs = (size_t)R * 16;
    for (int b0 = 0; b0 < NB; b0 += BP)
        for (int r0 = 0; r0 < R; r0 += RP) {
            float *sp = s + (size_t)b0 * bs + (size_t)r0 * 16;
            const float *qt = tl->qt + r0;
            const size_t *kb = kat + b0;
            const ig_attn_ahead *pa = b0 == 0 && r0 == 0 ? ah : NULL;
            if (RP == 4) IG_FEW_SCORES_HD(4, 1);
            else if (RP == 2) IG_FEW_SCORES_HD(2, 2);
            else IG_FEW_SCORES_HD(1, 4);
        }
}
#undef IG_FEW_SCORES_HD
#undef IG_FEW_SCORES

#define IG_ATTN_FEW_STEP 1   /* ATTN(few_step) below */
static inline void ATTN(few_step_ref)(ig_attn_tile *tl, int nl, const float *s, int k0);

/* The decode shape's online softmax step for the lanes r < R (ATTN(few_lanes)) and the block at
 * k0, their scores s (R, 16): a 4 x 4 transpose per four keys gives x[j] = key j of four lanes,
 * then ATTN(step4). One or two lanes (MHA, 2:1 GQA) keep the scalar step: a vector would be
 * mostly padding. */
static inline void ATTN(few_step)(ig_attn_tile *tl, int nl, const float *s, int k0) {
    const int R = ATTN(few_lanes)(nl, tl->head_dim);
    if (R < 4) {
        ATTN(few_step_ref)(tl, nl, s, k0);
        return;
    }
    for (int g = 0; g < R; g += 4) {
        const float *sg = s + (size_t)g * 16;
        __m128 x[16];
        for (int q = 0; q < 16; q += 4) {
            __m128 r0 = _mm_loadu_ps(sg + q), r1 = _mm_loadu_ps(sg + 16 + q);
            __m128 r2 = _mm_loadu_ps(sg + 2 * 16 + q), r3 = _mm_loadu_ps(sg + 3 * 16 + q);
            _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
            x[q] = r0, x[q + 1] = r1, x[q + 2] = r2, x[q + 3] = r3;
        }
        ATTN(step4)(tl, g, x, k0);
    }
}

/* o = o * al + sum_j p[j] v_j for the lanes below nl, R at a time, C vectors of each o row per
 * pass; value row j at element at[j] of the cache (f32, or f16 when F16), every one a position
 * some lane reads (no copy, no zeroed rows): ATTN(tile_pv_ref)'s products and sums, so its bits */
static inline __attribute__((always_inline)) void ATTN(few_pv_rc)(
        ig_attn_tile *tl, const void *v, const int64_t *at, int nl, const int R, const int C,
        const int hd, const int F16) {
    const size_t nlp = (size_t)tl->nlp;
    for (int l = 0; l < nl; l += R)        /* lanes past nl (up to 8 < nlp): padding */
        for (int c0 = 0; c0 < hd; c0 += 8 * C) {
            __m256 acc[8];
            for (int r = 0; r < R; r++) {
                const __m256 a = _mm256_broadcast_ss(tl->al + l + r);
                for (int c = 0; c < C; c++)
                    acc[r * C + c] = _mm256_mul_ps(_mm256_loadu_ps(tl->o + (size_t)(l + r) * hd + c0 + 8 * c), a);
            }
            for (int j = 0; j < 16; j++) {
                const float *pj = tl->p + (size_t)j * nlp + l;
                for (int c = 0; c < C; c++) {
                    const __m256 x = ATTN(load8)(v, (size_t)at[j] + c0 + 8 * c, F16);
                    for (int r = 0; r < R; r++)
                        acc[r * C + c] = _mm256_add_ps(acc[r * C + c], _mm256_mul_ps(_mm256_broadcast_ss(pj + r), x));
                }
            }
            for (int r = 0; r < R; r++)
                for (int c = 0; c < C; c++)
                    _mm256_storeu_ps(tl->o + (size_t)(l + r) * hd + c0 + 8 * c, acc[r * C + c]);
        }
}

/* ATTN(tile_pv_ref) on the block's f32 rows vb (16, head_dim): row j at element j * head_dim */
static inline void ATTN(tile_pv16)(ig_attn_tile *tl, const float *vb, int nl) {
    const int hd = tl->head_dim;
    int64_t at[16];
    for (int j = 0; j < 16; j++) at[j] = (int64_t)j * hd;
    if (hd == 64) ATTN(few_pv_rc)(tl, vb, at, nl, 4, 2, 64, 0);
    else if (hd == 128) ATTN(few_pv_rc)(tl, vb, at, nl, 4, 2, 128, 0);
    else ATTN(few_pv_rc)(tl, vb, at, nl, 4, 2, 256, 0);
}

#define IG_FEW_PV(RR, CC)                                                                          \
    do {                                                                                           \
        if (hd == 64) { if (f16) ATTN(few_pv_rc)(tl, v, at, nl, RR, CC, 64, 1);                    \
                        else ATTN(few_pv_rc)(tl, v, at, nl, RR, CC, 64, 0); }                      \
        else if (hd == 128) { if (f16) ATTN(few_pv_rc)(tl, v, at, nl, RR, CC, 128, 1);             \
                              else ATTN(few_pv_rc)(tl, v, at, nl, RR, CC, 128, 0); }               \
        else { if (f16) ATTN(few_pv_rc)(tl, v, at, nl, RR, CC, 256, 1);                            \
               else ATTN(few_pv_rc)(tl, v, at, nl, RR, CC, 256, 0); }                              \
    } while (0)
static inline void ATTN(few_pv_cache)(ig_attn_tile *tl, const void *v, int f16, const int64_t *at,
                                      int nl) {
    const int hd = tl->head_dim;
    if (nl <= 1) IG_FEW_PV(1, 8);
    else if (nl <= 2) IG_FEW_PV(2, 4);
    else IG_FEW_PV(4, 2);
}
#undef IG_FEW_PV
