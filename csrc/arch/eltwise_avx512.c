/* eltwise_avx512.c — the elementwise ops with AVX-512 where the portable loop calls a function per
 * element: GEGLU's gelu_tanh (ig_gelu_tanh_f32 in ignis.h: exp by polynomial, its operations
 * lane by lane in the same order, no FMA, so the bits are the portable twin's). The other ops are
 * the twin's loops (the compiler vectorizes them). */
#include <immintrin.h>

#include "x86.h"

static inline __m512 gelu_tanh16(__m512 x) {
    const __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
    __m512 z = _mm512_mul_ps(_mm512_set1_ps(IG_GELU_M2K),
                             _mm512_add_ps(x, _mm512_mul_ps(_mm512_set1_ps(0.044715f), x3)));
    /* (a < b ? a : b) and (a > b ? a : b), as the twin writes them: NaN goes to the bound */
    z = _mm512_min_ps(z, _mm512_set1_ps(87.0f));
    z = _mm512_max_ps(z, _mm512_set1_ps(-87.0f));
    const __m512 n = _mm512_roundscale_ps(
        _mm512_add_ps(_mm512_mul_ps(z, _mm512_set1_ps(IG_EXP_LOG2E)), _mm512_set1_ps(0.5f)),
        _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    const __m512 r = _mm512_sub_ps(_mm512_sub_ps(z, _mm512_mul_ps(n, _mm512_set1_ps(IG_EXP_LN2HI))),
                                   _mm512_mul_ps(n, _mm512_set1_ps(IG_EXP_LN2LO)));
    __m512 p = _mm512_set1_ps(IG_EXP_P0);
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(IG_EXP_P1));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(IG_EXP_P2));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(IG_EXP_P3));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(IG_EXP_P4));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(IG_EXP_P5));
    __m512 e = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(p, _mm512_mul_ps(r, r)), r),
                             _mm512_set1_ps(1.0f));
    const __m512i bits = _mm512_slli_epi32(
        _mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23);
    e = _mm512_mul_ps(e, _mm512_castsi512_ps(bits));
    const __m512 g = _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
    const __mmask16 in_range = _mm512_cmp_ps_mask(z, _mm512_set1_ps(87.0f), _CMP_LT_OQ);
    return _mm512_mask_blend_ps(in_range, _mm512_mul_ps(x, _mm512_setzero_ps()), g);
}

void ig_eltwise_f32_avx512(float *out, const float *x, const float *y, int op, int T, int dim,
                           int n_threads) {
    if (op != IG_EW_GEGLU) {
        ig_eltwise_f32_ref(out, x, y, op, T, dim, n_threads);
        return;
    }
    /* the twin's split: rows shared when there are enough elements, one row never split */
    IG_FOR_IF(t, T, T > 1 && (int64_t)T * dim >= IG_ROWS_PAR_MIN) {
        const size_t at = (size_t)t * dim;
        int i = 0;
        for (; i + 16 <= dim; i += 16) {
            const __m512 g = gelu_tanh16(_mm512_loadu_ps(x + at + i));
            _mm512_storeu_ps(out + at + i, _mm512_mul_ps(g, _mm512_loadu_ps(y + at + i)));
        }
        if (i < dim) {
            const __mmask16 m = (__mmask16)((1u << (dim - i)) - 1);
            const __m512 g = gelu_tanh16(_mm512_maskz_loadu_ps(m, x + at + i));
            _mm512_mask_storeu_ps(out + at + i, m, _mm512_mul_ps(g, _mm512_maskz_loadu_ps(m, y + at + i)));
        }
    }
}
