/* attention_avx512.h — the AVX-512 parts of the attention template (ops/attention_tmpl.h): the
 * tiled path's block of 16 keys against 16 queries (scores, online softmax step) and its weighted
 * sums of values, for head_dim 64, 128 or 256; its decode shape (few lanes: keys as the vector
 * lanes, read from the transposed key blocks in place); for the untiled path, ATTN(exp_sum) 16
 * lanes at a time. Included by arch/avx512.c, with its flags and ATTN defined, before the
 * template. One fixed order per build, but not the portable twin's (Cephes' expf, not libm's):
 * these results differ from it in the last bits. */
#define IG_ATTN_EXP_SUM 1   /* ATTN(exp_sum) below replaces the template's */
#define IG_ATTN_F16_ROW 1   /* and ATTN(f16_row): vcvtph2ps, 16 at a time */

static inline void ATTN(f16_row)(float *buf, const uint16_t *h, int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(buf + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + i))));
    if (i < n) {
        const __mmask16 k = (__mmask16)((1u << (n - i)) - 1u);
        _mm512_mask_storeu_ps(buf + i, k, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, h + i)));
    }
}

/* exp of 16 lanes: Cephes' expf reduction and polynomial (|error| about 1 ulp), 2^k by
 * vscalefps */
static inline __m512 ATTN(exp16)(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-88.0f));
    const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(y, k);
}

/* sc[j] = exp(sc[j] - m) for j < n; returns their sum: a vector sum reduced once */
static inline float ATTN(exp_sum)(float *sc, int n, float m) {
    const __m512 vm = _mm512_set1_ps(m);
    __m512 acc = _mm512_setzero_ps();
    int j = 0;
    for (; j + 16 <= n; j += 16) {
        const __m512 e = ATTN(exp16)(_mm512_sub_ps(_mm512_loadu_ps(sc + j), vm));
        _mm512_storeu_ps(sc + j, e);
        acc = _mm512_add_ps(acc, e);
    }
    if (j < n) {
        const __mmask16 k = (__mmask16)((1u << (n - j)) - 1u);
        const __m512 e = ATTN(exp16)(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, sc + j), vm));
        _mm512_mask_storeu_ps(sc + j, k, e);
        acc = _mm512_add_ps(acc, _mm512_maskz_mov_ps(k, e));
    }
    return _mm512_reduce_add_ps(acc);
}

/* 16 values of a cache at element i: f32 as stored, or f16 widened (exactly) by vcvtph2ps */
static inline __attribute__((always_inline)) __m512 ATTN(load16)(const void *cache, size_t i,
                                                                 const int f16) {
    return f16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)cache + i)))
               : _mm512_loadu_ps((const float *)cache + i);
}

/* ---- the tiled path's block (ops/attention_tmpl.h, IG_ATTN_TILE_FAST): lanes are queries ---- */
#define IG_ATTN_TILE_FAST 1
#include "../ops/attention_tile.h"

/* 16 lanes (at l0) against the block's 16 keys kb (C*16, 16): each score one fma chain over d,
 * the key's element broadcast against the lanes' queries; then the online softmax step, lane
 * by lane in vectors (no horizontal sums) */
static inline __attribute__((always_inline)) void ATTN(tile_scores16)(
        __m512 s[16], const float *qt, size_t nlp, const float *kb, const int hd) {
    for (int j = 0; j < 16; j++) s[j] = _mm512_setzero_ps();
    for (int d = 0; d < hd; d++) {
        const __m512 qd = _mm512_loadu_ps(qt + (size_t)d * nlp);
        for (int j = 0; j < 16; j++)
            s[j] = _mm512_fmadd_ps(_mm512_set1_ps(kb[(size_t)d * 16 + j]), qd, s[j]);
    }
}

static inline void ATTN(tile_block16)(ig_attn_tile *tl, int l0, const float *kb, int k0,
                                      float scale) {
    const int hd = tl->head_dim;
    const size_t nlp = (size_t)tl->nlp;
    __m512 s[16];
    if (hd == 64) ATTN(tile_scores16)(s, tl->qt + l0, nlp, kb, 64);
    else if (hd == 128) ATTN(tile_scores16)(s, tl->qt + l0, nlp, kb, 128);
    else ATTN(tile_scores16)(s, tl->qt + l0, nlp, kb, 256);
    const __m512i a = _mm512_sub_epi32(_mm512_loadu_si512(tl->lf + l0), _mm512_set1_epi32(k0));
    const __m512i b = _mm512_sub_epi32(_mm512_loadu_si512(tl->lp + l0), _mm512_set1_epi32(k0));
    /* every lane sees all 16 keys: no masks */
    const int full = _mm512_cmpgt_epi32_mask(a, _mm512_setzero_si512()) == 0 &&
                     _mm512_cmplt_epi32_mask(b, _mm512_set1_epi32(15)) == 0;
    const __m512 vs = _mm512_set1_ps(scale), ninf = _mm512_set1_ps(-INFINITY);
    const __m512 mo = _mm512_loadu_ps(tl->m + l0);
    __mmask16 valid[16];
    __m512 mx = mo;
    for (int j = 0; j < 16; j++) {
        s[j] = _mm512_mul_ps(s[j], vs);
        if (full) {
            valid[j] = 0xFFFF;
            mx = _mm512_max_ps(mx, s[j]);
        } else {
            const __m512i vj = _mm512_set1_epi32(j);
            valid[j] = _mm512_cmple_epi32_mask(a, vj) & _mm512_cmpge_epi32_mask(b, vj);
            mx = _mm512_max_ps(mx, _mm512_mask_blend_ps(valid[j], ninf, s[j]));
        }
    }
    /* rescale 0 where nothing was seen yet (m_old = -inf) */
    const __m512 alpha = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(mo, ninf, _CMP_NEQ_OQ),
                                             ATTN(exp16)(_mm512_sub_ps(mo, mx)));
    __m512 sum = _mm512_mul_ps(_mm512_loadu_ps(tl->l + l0), alpha);
    for (int j = 0; j < 16; j++) {
        const __m512 p = _mm512_maskz_mov_ps(valid[j], ATTN(exp16)(_mm512_sub_ps(s[j], mx)));
        _mm512_storeu_ps(tl->p + (size_t)j * nlp + l0, p);
        sum = _mm512_add_ps(sum, p);
    }
    _mm512_storeu_ps(tl->m + l0, mx);
    _mm512_storeu_ps(tl->l + l0, sum);
    _mm512_storeu_ps(tl->al + l0, alpha);
}

/* o = o * al + sum_j p[j] v_j for the lanes below nl, R at a time, each o row in C vectors of
 * registers; value row j at element at[j] of src (f32, or f16 when F16), or (at NULL) row j of
 * the block's f32 rows src (16, C*16) */
static inline __attribute__((always_inline)) void ATTN(tile_pv_rc)(
        ig_attn_tile *tl, const void *src, const int64_t *at, int nl, const int R, const int C,
        const int F16) {
    const size_t nlp = (size_t)tl->nlp, hd = (size_t)C * 16;
    for (size_t l = 0; l < (size_t)nl; l += R) {      /* the lanes past nl up to nlp: padding */
        __m512 acc[16];
        for (int r = 0; r < R; r++) {
            const __m512 a = _mm512_set1_ps(tl->al[l + r]);
            for (int c = 0; c < C; c++)
                acc[r * C + c] = _mm512_mul_ps(_mm512_loadu_ps(tl->o + (l + r) * hd + 16 * c), a);
        }
        for (int j = 0; j < 16; j++) {
            const float *pj = tl->p + (size_t)j * nlp + l;
            const size_t vr = at ? (size_t)at[j] : (size_t)j * hd;
            for (int c = 0; c < C; c++) {
                const __m512 v = ATTN(load16)(src, vr + 16 * c, F16);
                for (int r = 0; r < R; r++)
                    acc[r * C + c] = _mm512_fmadd_ps(_mm512_set1_ps(pj[r]), v, acc[r * C + c]);
            }
        }
        for (int r = 0; r < R; r++)
            for (int c = 0; c < C; c++) _mm512_storeu_ps(tl->o + (l + r) * hd + 16 * c, acc[r * C + c]);
    }
}

static inline void ATTN(tile_pv16)(ig_attn_tile *tl, const float *vb, int nl) {
    if (tl->head_dim == 64) ATTN(tile_pv_rc)(tl, vb, NULL, nl, 4, 4, 0);
    else if (tl->head_dim == 128) ATTN(tile_pv_rc)(tl, vb, NULL, nl, 2, 8, 0);
    else ATTN(tile_pv_rc)(tl, vb, NULL, nl, 1, 16, 0);
}

/* the same, the 16 value rows read in place from the cache (rows at[j], every one a position
 * some lane reads: no copy, no zeroed rows): the same products and sums, so the same bits */
static inline void ATTN(few_pv_cache)(ig_attn_tile *tl, const void *v, int f16, const int64_t *at,
                                      int nl) {
    if (tl->head_dim == 64) {
        if (f16) ATTN(tile_pv_rc)(tl, v, at, nl, 4, 4, 1);
        else ATTN(tile_pv_rc)(tl, v, at, nl, 4, 4, 0);
    } else if (tl->head_dim == 128) {
        if (f16) ATTN(tile_pv_rc)(tl, v, at, nl, 2, 8, 1);
        else ATTN(tile_pv_rc)(tl, v, at, nl, 2, 8, 0);
    } else {
        if (f16) ATTN(tile_pv_rc)(tl, v, at, nl, 1, 16, 1);
        else ATTN(tile_pv_rc)(tl, v, at, nl, 1, 16, 0);
    }
}

/* ---- the tiled path's decode shape (few lanes, ops/attention_tmpl.h ATTN(tile_few_run)): keys
 * are the vector lanes, element d of a block's 16 keys one vector of the key cache (its blocks are
 * stored transposed: no shuffles). Each score is still one fma chain over d = 0..head_dim-1 from 0, then
 * the scale, and the online softmax step is the one above lane by lane, so every bit is the
 * tiled block's; the chains of R lanes x NB blocks run interleaved (8, to cover the fma's
 * latency). */
#define IG_ATTN_TILE_FEW 8   /* tiles of at most 8 lanes take it */
#define IG_ATTN_FEW_STEP 1   /* with ATTN(few_step) below (exp16's bits, as ATTN(tile_block16)) */

/* lanes per pass, and blocks per pass (NB x R = 8 chains) */
static inline int ATTN(few_lanes)(int nl, int hd) { return nl <= 2 && hd >= 128 ? 2 : nl <= 4 ? 4 : 8; }
static inline int ATTN(few_blocks)(int nl, int hd) { return 8 / ATTN(few_lanes)(nl, hd); }

/* s[(b * R + r) * 16 + j] = scale * (q_r . k_j of block b), each one fma chain over d; block b's
 * keys at element kat[b] of the cache (f32, or f16 when F16), (hd, 16). Every hd / 16 steps of d,
 * one position of the next pass's blocks is prefetched (ah): its lines spread over the loop */
static inline __attribute__((always_inline)) void ATTN(few_scores_rb)(
        float *s, const float *qt, size_t nlp, const void *cache, const size_t *kat, float scale,
        const ig_attn_ahead *ah, const int R, const int NB, const int hd, const int F16) {
    __m512 acc[8];
    for (int i = 0; i < R * NB; i++) acc[i] = _mm512_setzero_ps();
    for (int d = 0; d < hd; d++) {
        if (d % (hd / 16) == 0) ig_attn_ahead_pos(ah, NB, d / (hd / 16));
        for (int b = 0; b < NB; b++) {
            const __m512 kd = ATTN(load16)(cache, kat[b] + (size_t)d * 16, F16);
            for (int r = 0; r < R; r++)
                acc[b * R + r] = _mm512_fmadd_ps(_mm512_set1_ps(qt[(size_t)d * nlp + r]), kd, acc[b * R + r]);
        }
    }
    const __m512 vs = _mm512_set1_ps(scale);
    for (int i = 0; i < R * NB; i++) _mm512_storeu_ps(s + i * 16, _mm512_mul_ps(acc[i], vs));
}

#define IG_FEW_SCORES(RR, NN, HD)                                                                  \
    (f16 ? ATTN(few_scores_rb)(s, tl->qt, nlp, cache, kat, scale, ah, RR, NN, HD, 1)                \
         : ATTN(few_scores_rb)(s, tl->qt, nlp, cache, kat, scale, ah, RR, NN, HD, 0))
static inline void ATTN(few_scores)(float *s, const ig_attn_tile *tl, const void *cache, int f16,
                                    const size_t *kat, int nl, float scale, const ig_attn_ahead *ah) {
    const size_t nlp = (size_t)tl->nlp;
    const int hd = tl->head_dim, R = ATTN(few_lanes)(nl, hd);
    if (R == 8) {
        if (hd == 64) IG_FEW_SCORES(8, 1, 64);
        else if (hd == 128) IG_FEW_SCORES(8, 1, 128);
        else IG_FEW_SCORES(8, 1, 256);
    } else if (R == 4) {
        if (hd == 64) IG_FEW_SCORES(4, 2, 64);
        else if (hd == 128) IG_FEW_SCORES(4, 2, 128);
        else IG_FEW_SCORES(4, 2, 256);
    } else {
        if (hd == 128) IG_FEW_SCORES(2, 4, 128);
        else IG_FEW_SCORES(2, 4, 256);
    }
}
#undef IG_FEW_SCORES

/* the online softmax step of the lanes r < R (ATTN(few_lanes)) for the block at k0, their scores
 * s (R, 16): ATTN(tile_block16)'s arithmetic, lane by lane. Four lanes at a time, their scores
 * transposed by unpacks: chunk q (128 bits) of x[i] holds key 4q + i of the four lanes, so the
 * maximum is a vertical one (and two chunk swaps), and each lane's sum l * alpha + p_0 + ... +
 * p_15 a chain of vector adds in key order, the block's; rows R.. of a four (R = 2) read as 0 and
 * nothing of those lanes is stored */
#define IG_FEW_CHUNK(v, q) ((q) == 0 ? _mm512_castps512_ps128(v) : _mm512_extractf32x4_ps((v), (q)))
static inline void ATTN(few_step)(ig_attn_tile *tl, int nl, const float *s, int k0) {
    const int R = ATTN(few_lanes)(nl, tl->head_dim), G = R > 4 ? 2 : 1;
    const size_t nlp = (size_t)tl->nlp;
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    const __m512i jq = _mm512_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12);
    const __mmask8 keep = R >= 4 ? 0xF : 0x3;
    __m512 x[2][4], vmx[2];
    __mmask16 valid[2][4];
    for (int g = 0; g < G; g++) {
        const float *sg = s + 64 * g;
        const __m512 r0 = _mm512_loadu_ps(sg), r1 = _mm512_loadu_ps(sg + 16);
        const __m512 r2 = R > 2 ? _mm512_loadu_ps(sg + 32) : _mm512_setzero_ps();
        const __m512 r3 = R > 2 ? _mm512_loadu_ps(sg + 48) : _mm512_setzero_ps();
        const __m512d u0 = _mm512_castps_pd(_mm512_unpacklo_ps(r0, r1));
        const __m512d u1 = _mm512_castps_pd(_mm512_unpackhi_ps(r0, r1));
        const __m512d u2 = _mm512_castps_pd(_mm512_unpacklo_ps(r2, r3));
        const __m512d u3 = _mm512_castps_pd(_mm512_unpackhi_ps(r2, r3));
        x[g][0] = _mm512_castpd_ps(_mm512_unpacklo_pd(u0, u2));
        x[g][1] = _mm512_castpd_ps(_mm512_unpackhi_pd(u0, u2));
        x[g][2] = _mm512_castpd_ps(_mm512_unpacklo_pd(u1, u3));
        x[g][3] = _mm512_castpd_ps(_mm512_unpackhi_pd(u1, u3));
        const __m512i k = _mm512_set1_epi32(k0);
        const __m512i a = _mm512_sub_epi32(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(tl->lf + 4 * g))), k);
        const __m512i b = _mm512_sub_epi32(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(tl->lp + 4 * g))), k);
        __m512 m = _mm512_broadcast_f32x4(_mm_loadu_ps(tl->m + 4 * g));
        for (int i = 0; i < 4; i++) {
            const __m512i j = _mm512_add_epi32(jq, _mm512_set1_epi32(i));
            valid[g][i] = _mm512_cmple_epi32_mask(a, j) & _mm512_cmpge_epi32_mask(b, j);
            m = _mm512_max_ps(m, _mm512_mask_blend_ps(valid[g][i], ninf, x[g][i]));
        }
        m = _mm512_max_ps(m, _mm512_shuffle_f32x4(m, m, _MM_SHUFFLE(1, 0, 3, 2)));
        vmx[g] = _mm512_max_ps(m, _mm512_shuffle_f32x4(m, m, _MM_SHUFFLE(2, 3, 0, 1)));
    }
    /* the lanes' maxima in lane order (lanes R.. keep theirs), their rescale */
    const __m512 mo = _mm512_loadu_ps(tl->m);
    __m512 vm = G == 2 ? _mm512_insertf32x4(vmx[0], _mm512_castps512_ps128(vmx[1]), 1) : vmx[0];
    vm = _mm512_mask_blend_ps((__mmask16)((1u << R) - 1u), mo, vm);
    const __m512 alpha = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(mo, ninf, _CMP_NEQ_OQ),
                                             ATTN(exp16)(_mm512_sub_ps(mo, vm)));
    _mm512_storeu_ps(tl->al, alpha);
    for (int g = 0; g < G; g++) {
        __m512 p[4];
        for (int i = 0; i < 4; i++)
            p[i] = _mm512_maskz_mov_ps(valid[g][i], ATTN(exp16)(_mm512_sub_ps(x[g][i], vmx[g])));
        float *pg = tl->p + 4 * g;
        __m128 sum = _mm_mul_ps(_mm_loadu_ps(tl->l + 4 * g),
                                g ? _mm512_extractf32x4_ps(alpha, 1) : _mm512_castps512_ps128(alpha));
#define IG_FEW_KEYS(q)                                                                             \
        for (int i = 0; i < 4; i++) {                                                              \
            const __m128 c = IG_FEW_CHUNK(p[i], q);                                                \
            _mm_mask_storeu_ps(pg + (size_t)(4 * (q) + i) * nlp, keep, c);                         \
            sum = _mm_add_ps(sum, c);                                                              \
        }
        IG_FEW_KEYS(0)
        IG_FEW_KEYS(1)
        IG_FEW_KEYS(2)
        IG_FEW_KEYS(3)
#undef IG_FEW_KEYS
        _mm_mask_storeu_ps(tl->m + 4 * g, keep, _mm512_castps512_ps128(vmx[g]));
        _mm_mask_storeu_ps(tl->l + 4 * g, keep, sum);
    }
}
#undef IG_FEW_CHUNK
