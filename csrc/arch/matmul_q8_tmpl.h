/* matmul_q8_tmpl.h — the q8 matmul over 256-bit vectors, instantiated by an arch file that defines
 * QDOT(aw, sx): 8 int32 sums of 4 products of |w| (u8) and x*sign(w) (s8) each, and FN(name).
 *
 * One block = one 256-bit load per operand; its integer dot goes to f32 and is scaled by d_x*d_w
 * into a per-dot f32 vector accumulator, reduced once at the end. Each dot is computed one way only
 * (the 1x4 tile shares x loads, nothing else), so results do not depend on T or thread count.
 */

#define IG_Q8_NB 32   /* weight rows per parallel block */

static inline __m256 FN(q8_block)(const ig_block_q8 *x, const ig_block_q8 *w, __m256 acc) {
    const __m256i xv = _mm256_loadu_si256((const __m256i *)x->qs);
    const __m256i wv = _mm256_loadu_si256((const __m256i *)w->qs);
    /* |w| as u8 and x with w's sign: their products are x*w, and neither is ever -128 */
    const __m256i p = QDOT(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(x->d * w->d), acc);
}

static inline float FN(q8_hsum)(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* acc[j] = dot(x, w[j]) for 4 weight rows */
static inline void FN(q8_tile_1x4)(float *acc, const ig_block_q8 *x, const ig_block_q8 *const *w, int nb) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        a0 = FN(q8_block)(x + b, w[0] + b, a0);
        a1 = FN(q8_block)(x + b, w[1] + b, a1);
        a2 = FN(q8_block)(x + b, w[2] + b, a2);
        a3 = FN(q8_block)(x + b, w[3] + b, a3);
    }
    acc[0] = FN(q8_hsum)(a0); acc[1] = FN(q8_hsum)(a1);
    acc[2] = FN(q8_hsum)(a2); acc[3] = FN(q8_hsum)(a3);
}

void FN(ig_matmul_q8)(const ig_matmul_q8_args *a, int n_threads) {
    const int T = a->T, N = a->N, nb = a->K / IG_QK;
    const int n_blocks = (N + IG_Q8_NB - 1) / IG_Q8_NB;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(n_threads > 0 ? n_threads : 1)
#endif
    for (int blk = 0; blk < n_blocks; blk++) {
        const int n0 = blk * IG_Q8_NB, n1 = n0 + IG_Q8_NB < N ? n0 + IG_Q8_NB : N;
        float g[4], u[4];
        for (int t = 0; t < T; t++) {
            const ig_block_q8 *x = a->x + (size_t)t * nb;
            for (int n = n0; n < n1; n += 4) {
                const int nt = n1 - n < 4 ? n1 - n : 4;
                const ig_block_q8 *ws[4], *ws2[4];
                for (int j = 0; j < 4; j++) {
                    const int r = j < nt ? n + j : n1 - 1;   /* past the end: repeat, discard */
                    ws[j] = a->w + (size_t)r * nb;
                    ws2[j] = a->w2 ? a->w2 + (size_t)r * nb : NULL;
                }
                FN(q8_tile_1x4)(g, x, ws, nb);
                if (a->w2) FN(q8_tile_1x4)(u, x, ws2, nb);
                for (int j = 0; j < nt; j++) {
                    float v = g[j];
                    if (a->w2) {
                        v = ig_silu_f32(v) * u[j];
                    } else {
                        if (a->bias) v += a->bias[n + j];
                        if (a->res) v += a->res[(size_t)t * a->ldr + n + j];
                    }
                    a->out[(size_t)t * a->ldo + n + j] = v;
                }
            }
        }
    }
    (void)n_threads;
}

#undef IG_Q8_NB
