/* attention_avx512.h — the AVX-512 parts of the attention template (ops/attention_tmpl.h): the
 * tiled path's block of 16 keys against 16 queries (scores, online softmax step) and its weighted
 * sums of values, for head_dim 64, 128 or 256 (at the end); for the untiled path,
 * ATTN(exp_sum) 16 lanes at a time, and for head_dim 64, 128 or 256 (Gemma 3) the scores and the
 * weighted sum of values 16 keys at a time, from an f32 or an f16 cache. Included by arch/avx512.c, with its flags
 * and ATTN defined, before the template. One fixed order per build, but not the portable twin's
 * (Cephes' expf, not libm's; other sums): these results differ from it in the last bits. */
#define IG_ATTN_EXP_SUM 1   /* ATTN(exp_sum) below replaces the template's */
#define IG_ATTN_FAST 1      /* so do ATTN(scores16) and ATTN(weighted16) */
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

/* The sums of 16 vectors' lanes, as one vector: r[i] = sum(a[i]). A fixed tree of in-lane
 * unpacks, shuffles and cross-lane permutes (45 instructions for 16 dot products, instead of a
 * full horizontal sum each). */
static inline __m512 ATTN(sum16)(const __m512 a[16]) {
    __m512 b[8], c[4];
    for (int i = 0; i < 8; i++)
        b[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                             _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    for (int i = 0; i < 4; i++)
        c[i] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(b[2 * i], b[2 * i + 1], 0xEE));
    const __m512 d0 = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88),
                                    _mm512_shuffle_f32x4(c[0], c[1], 0xDD));
    const __m512 d1 = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], 0x88),
                                    _mm512_shuffle_f32x4(c[2], c[3], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(d0, d1, 0x88), _mm512_shuffle_f32x4(d0, d1, 0xDD));
}

/* 16 values of a cache at element i: f32 as stored, or f16 widened (exactly) by vcvtph2ps */
static inline __attribute__((always_inline)) __m512 ATTN(load16)(const void *cache, size_t i,
                                                                 const int f16) {
    return f16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)cache + i)))
               : _mm512_loadu_ps((const float *)cache + i);
}

/* sc[j] = scale * q.k_j for the keys j < n16 (a multiple of 16) at element `base` of the cache (f32,
 * or f16 when F16), 16 keys at a time; returns their maximum. C = head_dim / 16 vectors per row. */
static inline __attribute__((always_inline)) float ATTN(scores16)(
        float *sc, const float *qr, const void *k, size_t base, size_t kv_dim, int n16, float scale,
        const int C, const int F16) {
    __m512 q[16], vmax = _mm512_set1_ps(-INFINITY);   /* C = 16: q partly spilled, read from L1 */
    for (int c = 0; c < C; c++) q[c] = _mm512_loadu_ps(qr + 16 * c);
    for (int j = 0; j < n16; j += 16) {
        __m512 a[16];
        for (int r = 0; r < 16; r++) {
            const size_t kr = base + (size_t)(j + r) * kv_dim;
            __m512 acc = _mm512_mul_ps(q[0], ATTN(load16)(k, kr, F16));
            for (int c = 1; c < C; c++) acc = _mm512_fmadd_ps(q[c], ATTN(load16)(k, kr + 16 * c, F16), acc);
            a[r] = acc;
        }
        const __m512 s = _mm512_mul_ps(ATTN(sum16)(a), _mm512_set1_ps(scale));
        _mm512_storeu_ps(sc + j, s);
        vmax = _mm512_max_ps(vmax, s);
    }
    return _mm512_reduce_max_ps(vmax);
}

/* o = sum_j p[j] * v_j over j < n, the rows at element `base` of the cache (f32, or f16 when
 * F16) (add: o += it), o kept in C registers */
static inline __attribute__((always_inline)) void ATTN(weighted16)(
        float *o, const float *p, const void *v, size_t base, size_t kv_dim, int n, int add,
        const int C, const int F16) {
    __m512 acc[16];
    for (int c = 0; c < C; c++) acc[c] = add ? _mm512_loadu_ps(o + 16 * c) : _mm512_setzero_ps();
    for (int j = 0; j < n; j++) {
        const __m512 pj = _mm512_set1_ps(p[j]);
        const size_t vr = base + (size_t)j * kv_dim;
        for (int c = 0; c < C; c++) acc[c] = _mm512_fmadd_ps(pj, ATTN(load16)(v, vr + 16 * c, F16), acc[c]);
    }
    for (int c = 0; c < C; c++) _mm512_storeu_ps(o + 16 * c, acc[c]);
}

/* ---- the tiled path's block (ops/attention_tmpl.h, IG_ATTN_TILE_FAST): lanes are queries ---- */
#define IG_ATTN_TILE_FAST 1
#include "../ops/attention_tile.h"

/* 16 lanes (at l0) against the block's 16 keys kb (16, C*16): each score one fma chain over d,
 * the key's element broadcast against the lanes' queries; then the online softmax step, lane
 * by lane in vectors (no horizontal sums) */
static inline __attribute__((always_inline)) void ATTN(tile_scores16)(
        __m512 s[16], const float *qt, size_t nlp, const float *kb, const int hd) {
    for (int j = 0; j < 16; j++) s[j] = _mm512_setzero_ps();
    for (int d = 0; d < hd; d++) {
        const __m512 qd = _mm512_loadu_ps(qt + (size_t)d * nlp);
        for (int j = 0; j < 16; j++)
            s[j] = _mm512_fmadd_ps(_mm512_set1_ps(kb[(size_t)j * hd + d]), qd, s[j]);
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

/* o = o * al + sum_j p[j] v_j for the lanes below nl, R at a time, each o row in C vectors of registers */
static inline __attribute__((always_inline)) void ATTN(tile_pv_rc)(ig_attn_tile *tl,
                                                                    const float *vb, int nl,
                                                                    const int R, const int C) {
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
            const float *vr = vb + (size_t)j * hd;
            for (int c = 0; c < C; c++) {
                const __m512 v = _mm512_loadu_ps(vr + 16 * c);
                for (int r = 0; r < R; r++)
                    acc[r * C + c] = _mm512_fmadd_ps(_mm512_set1_ps(pj[r]), v, acc[r * C + c]);
            }
        }
        for (int r = 0; r < R; r++)
            for (int c = 0; c < C; c++) _mm512_storeu_ps(tl->o + (l + r) * hd + 16 * c, acc[r * C + c]);
    }
}

static inline void ATTN(tile_pv16)(ig_attn_tile *tl, const float *vb, int nl) {
    if (tl->head_dim == 64) ATTN(tile_pv_rc)(tl, vb, nl, 4, 4);
    else if (tl->head_dim == 128) ATTN(tile_pv_rc)(tl, vb, nl, 2, 8);
    else ATTN(tile_pv_rc)(tl, vb, nl, 1, 16);
}
