/* avx2.c — AVX2 + FMA hot loops. Compiled with -mavx2 -mfma only; called only when dispatch says so. */
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include "../ignis.h"

static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

float ig_dot_f32_avx2(const float *x, const float *y, int n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 16), _mm256_loadu_ps(y + i + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 24), _mm256_loadu_ps(y + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8)
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), a0);
    float acc = hsum256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++) acc += x[i] * y[i];
    return acc;
}

void ig_gemv_f32_avx2(float *out, const float *w, const float *x, int rows, int cols, int n_threads) {
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(n_threads > 0 ? n_threads : 1)
#endif
    for (int r = 0; r < rows; r++) out[r] = ig_dot_f32_avx2(w + (size_t)r * cols, x, cols);
    (void)n_threads;
}

int32_t ig_dot_i8_avx2(const int8_t *x, const int8_t *y, int n) {
    /* Widen to int16 and use madd: exact for the whole int8 range (maddubs would saturate). */
    __m256i acc = _mm256_setzero_si256();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i xv = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(x + i)));
        __m256i yv = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(y + i)));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(xv, yv));
    }
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    int32_t total = _mm_cvtsi128_si32(s);
    for (; i < n; i++) total += (int32_t)x[i] * (int32_t)y[i];
    return total;
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
#define ARGS ig_matmul_bf16_args
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
/* ---- attention (ops/attention_tmpl.h) compiled with this file's flags ---- */
#define ATTN(name) name##_avx2
#include "../ops/attention_tmpl.h"
#undef ATTN
#endif
