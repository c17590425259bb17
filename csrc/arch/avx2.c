/* avx2.c — AVX2 + FMA hot loops. Compiled with -mavx2 -mfma only; called only when dispatch says so. */
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include "x86.h"

static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* ---- the blocked matmul (matmul_tmpl.h) with 8-lane vectors ---- */
static const int32_t IG_AVX2_TAIL[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
#define V __m256
#define VW 8
#define VZERO() _mm256_setzero_ps()
#define VLOAD(p) _mm256_loadu_ps(p)
#define VLOADN(p, n) _mm256_maskload_ps((p), _mm256_loadu_si256((const __m256i *)(IG_AVX2_TAIL + 8 - (n))))
#define VFMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define VSUM(v) hsum256(v)
#define FN(name) name##_f32_avx2
#include "matmul_tmpl.h"
#undef FN

/* ---- the same matmul with bf16 weights: widened by a 16-bit shift, then the f32 path ---- */
static inline __m256 ig_bf16_load8(const uint16_t *p) {
    const __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}
static inline __m256 ig_bf16_loadn(const uint16_t *p, int n) {
    uint16_t tmp[8] = {0};          /* AVX2 has no 16-bit masked load: copy the tail */
    for (int i = 0; i < n; i++) tmp[i] = p[i];
    return ig_bf16_load8(tmp);
}
#define WT uint16_t
#define WLOAD(p) ig_bf16_load8(p)
#define WLOADN(p, n) ig_bf16_loadn((p), (n))
#define FN(name) name##_bf16_avx2
#include "matmul_tmpl.h"
#undef V
#undef VW
#undef VZERO
#undef VLOAD
#undef VLOADN
#undef VFMA
#undef VSUM
#undef FN

/* ---- the q8 matmul (matmul_q8_tmpl.h): maddubs pairs, then madd with ones to int32 ---- */
static inline __m256i ig_qdot_avx2(__m256i aw, __m256i sx) {
    /* |w|*|x| <= 127*127: a pair sums to at most 32258, so maddubs never saturates */
    return _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), _mm256_set1_epi16(1));
}
#define QDOT(aw, sx) ig_qdot_avx2((aw), (sx))
#define FN(name) name##_avx2
#include "matmul_q8_tmpl.h"
#undef QDOT
#undef FN
/* ---- attention (ops/attention_tmpl.h) compiled with this file's flags, f16 cache rows widened
 * by F16C ---- */
#define ATTN(name) name##_avx2
#define IG_ATTN_F16_ROW 1
static inline void ATTN(f16_row)(float *buf, const uint16_t *h, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(buf + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
    for (; i < n; i++) buf[i] = _cvtsh_ss(h[i]);
}
#include "../ops/attention_tmpl.h"
#undef ATTN
#endif
