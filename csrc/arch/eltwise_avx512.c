/* eltwise_avx512.c — the elementwise ops with AVX-512 where the portable loop calls a function per
 * element: GEGLU's gelu_tanh (ig_gelu_tanh_f32 in ignis.h: exp by polynomial, its operations
 * lane by lane in the same order, no FMA, so the bits are the portable twin's), and SiLU and
 * SwiGLU (ig_silu_f32: ig_expf_f32's double-precision steps 8 lanes at a time, the twin's bits).
 * The other ops are the twin's loops (the compiler vectorizes them). */
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

/* ig_expf_f32 of 8 lanes, in double as it is: the same operations lane by lane (fused where it
 * fuses), the table read by two permutes; the caller takes lanes with |x| >= 88, inf or NaN to
 * the scalar function (its branches) */
static inline __m256 expf8(__m256 x) {
    const __m512d xd = _mm512_cvtps_pd(x), invln2n = _mm512_set1_pd(IG_EXPF_INVLN2N);
    const __m512d shift = _mm512_set1_pd(IG_EXPF_SHIFT);
    const __m512d kds = _mm512_fmadd_pd(invln2n, xd, shift);
    const __m512i ki = _mm512_castpd_si512(kds);
    const __m512d r = _mm512_fmsub_pd(invln2n, xd, _mm512_sub_pd(kds, shift));
    const __m512i lo = _mm512_loadu_si512(ig_expf_tab), hi = _mm512_loadu_si512(ig_expf_tab + 16);
    const __m512i t0 = _mm512_permutex2var_epi64(lo, ki, _mm512_loadu_si512(ig_expf_tab + 8));
    const __m512i t1 = _mm512_permutex2var_epi64(hi, ki, _mm512_loadu_si512(ig_expf_tab + 24));
    const __m512i t = _mm512_mask_blend_epi64(_mm512_test_epi64_mask(ki, _mm512_set1_epi64(16)), t0, t1);
    const __m512d s = _mm512_castsi512_pd(_mm512_add_epi64(t, _mm512_slli_epi64(ki, 47)));
    const __m512d z = _mm512_fmadd_pd(r, _mm512_set1_pd(IG_EXPF_C0), _mm512_set1_pd(IG_EXPF_C1));
    const __m512d y = _mm512_fmadd_pd(z, _mm512_mul_pd(r, r),
                                      _mm512_fmadd_pd(r, _mm512_set1_pd(IG_EXPF_C2), _mm512_set1_pd(1.0)));
    return _mm512_cvtpd_ps(_mm512_mul_pd(y, s));
}

/* ig_silu_f32 of 16 lanes: x / (1 + exp(-x)), each operation the scalar one's */
static inline __m512 silu16(__m512 x) {
    const __m512 nx = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x),
                                                           _mm512_set1_epi32((int)0x80000000u)));
    const __m512i top = _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(nx), 20),
                                         _mm512_set1_epi32(0x7ff));
    __m512 e;
    if (_mm512_cmpge_epi32_mask(top, _mm512_set1_epi32(0x42b))) {
        float v[16];
        _mm512_storeu_ps(v, nx);
        for (int i = 0; i < 16; i++) v[i] = ig_expf_f32(v[i]);
        e = _mm512_loadu_ps(v);
    } else {
        /* the halves by 64-bit lane moves: this file needs AVX-512F alone */
        const __m256 e0 = expf8(_mm512_castps512_ps256(nx));
        const __m256 e1 = expf8(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(nx), 1)));
        e = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(e0)),
                                                _mm256_castps_pd(e1), 1));
    }
    return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

/* silu (y NULL) or silu(x) * y over one row of dim */
static void silu_row(float *out, const float *x, const float *y, int dim) {
    int i = 0;
    for (; i + 16 <= dim; i += 16) {
        const __m512 g = silu16(_mm512_loadu_ps(x + i));
        _mm512_storeu_ps(out + i, y ? _mm512_mul_ps(g, _mm512_loadu_ps(y + i)) : g);
    }
    if (i < dim) {
        const __mmask16 m = (__mmask16)((1u << (dim - i)) - 1);
        const __m512 g = silu16(_mm512_maskz_loadu_ps(m, x + i));
        _mm512_mask_storeu_ps(out + i, m, y ? _mm512_mul_ps(g, _mm512_maskz_loadu_ps(m, y + i)) : g);
    }
}

void ig_eltwise_f32_avx512(float *out, const float *x, const float *y, int op, int T, int dim,
                           int n_threads) {
    if (op == IG_EW_SILU || op == IG_EW_SWIGLU) {
        IG_FOR_IF(t, T, T > 1 && (int64_t)T * dim >= IG_ROWS_PAR_MIN) {
            const size_t at = (size_t)t * dim;
            silu_row(out + at, x + at, op == IG_EW_SWIGLU ? y + at : NULL, dim);
        }
        return;
    }
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
