/* avx512.c — AVX-512 (F/BW/DQ/VL) and AVX-512 VNNI hot loops. Compiled with their -m flags only;
 * the VNNI function is reachable only through the avx512_vnni table. */
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include "../ignis.h"

float ig_dot_f32_avx512(const float *x, const float *y, int n) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    __m512 a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
    int i = 0;
    for (; i + 64 <= n; i += 64) {
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i), a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(y + i + 16), a1);
        a2 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 32), _mm512_loadu_ps(y + i + 32), a2);
        a3 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 48), _mm512_loadu_ps(y + i + 48), a3);
    }
    for (; i + 16 <= n; i += 16)
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i), a0);
    if (i < n) {   /* masked tail: no scalar loop, no read past the end */
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i), a1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

void ig_gemv_f32_avx512(float *out, const float *w, const float *x, int rows, int cols, int n_threads) {
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(n_threads > 0 ? n_threads : 1)
#endif
    for (int r = 0; r < rows; r++) out[r] = ig_dot_f32_avx512(w + (size_t)r * cols, x, cols);
    (void)n_threads;
}

int32_t ig_dot_i8_avx512(const int8_t *x, const int8_t *y, int n) {
    __m512i acc = _mm512_setzero_si512();
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512i xv = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(x + i)));
        __m512i yv = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(y + i)));
        acc = _mm512_add_epi32(acc, _mm512_madd_epi16(xv, yv));
    }
    int32_t total = _mm512_reduce_add_epi32(acc);
    for (; i < n; i++) total += (int32_t)x[i] * (int32_t)y[i];
    return total;
}

int32_t ig_dot_i8_avx512vnni(const int8_t *x, const int8_t *y, int n) {
    /* vpdpbusd multiplies unsigned by signed bytes. x ^ 0x80 = x + 128 as u8, so
     * sum((x+128)*y) - 128*sum(y) = sum(x*y), exactly; 128*sum(y) comes from the same instruction. */
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    __m512i acc = _mm512_setzero_si512(), corr = _mm512_setzero_si512();
    int i = 0;
    for (; i + 64 <= n; i += 64) {
        __m512i xv = _mm512_loadu_si512((const void *)(x + i));
        __m512i yv = _mm512_loadu_si512((const void *)(y + i));
        acc = _mm512_dpbusd_epi32(acc, _mm512_xor_si512(xv, bias), yv);
        corr = _mm512_dpbusd_epi32(corr, bias, yv);
    }
    if (i < n) {
        __mmask64 m = (n - i) >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << (n - i)) - 1);
        __m512i xv = _mm512_maskz_loadu_epi8(m, x + i);
        __m512i yv = _mm512_maskz_loadu_epi8(m, y + i);   /* masked-off y lanes are 0: no effect */
        acc = _mm512_dpbusd_epi32(acc, _mm512_xor_si512(xv, bias), yv);
        corr = _mm512_dpbusd_epi32(corr, bias, yv);
    }
    return _mm512_reduce_add_epi32(_mm512_sub_epi32(acc, corr));
}

/* ---- the blocked matmul (matmul_tmpl.h) with 16-lane vectors ---- */
#define V __m512
#define VW 16
#define VZERO() _mm512_setzero_ps()
#define VLOAD(p) _mm512_loadu_ps(p)
#define VLOADN(p, n) _mm512_maskz_loadu_ps((__mmask16)((1u << (n)) - 1u), (p))
#define VFMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define VSUM(v) _mm512_reduce_add_ps(v)
#define FN(name) name##_f32_avx512
#include "matmul_tmpl.h"
#undef FN

/* ---- the same matmul with bf16 weights: widened by a 16-bit shift, then the f32 path ---- */
#define WT uint16_t
#define WLOAD(p) _mm512_castsi512_ps(_mm512_slli_epi32( \
    _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
#define WLOADN(p, n) _mm512_castsi512_ps(_mm512_slli_epi32( \
    _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16((__mmask16)((1u << (n)) - 1u), (p))), 16))
#define ARGS ig_matmul_bf16_args
#define FN(name) name##_bf16_avx512
#include "matmul_tmpl.h"
#undef FN

/* ---- the q8 matmul (matmul_q8_tmpl.h) with VNNI: u8 x s8 dot of 4 straight into int32 ---- */
#define QDOT(aw, sx) _mm256_dpbusd_epi32(_mm256_setzero_si256(), (aw), (sx))
#define FN(name) name##_avx512vnni
#include "matmul_q8_tmpl.h"
#undef QDOT
#undef FN
#endif
