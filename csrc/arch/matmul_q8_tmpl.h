/* matmul_q8_tmpl.h — the q8 matmul over 256-bit vectors on packed weights (ignis.h), instantiated
 * by an arch file that defines QDOT(aw, sx): 8 int32 sums of 4 products of |w| (u8) and x*sign(w)
 * (s8) each, and FN(name).
 *
 * One block = one 256-bit load per operand (the stored u8 integers are shifted back to s8 first);
 * its integer dot goes to f32 and is scaled by d_x*d_w into a per-dot f32 vector accumulator,
 * reduced once at the end. A tile is one packed group (4 weight rows) against one activation row:
 * the group's 4 x 32 bytes per block are contiguous, so the weights stream in order. Each dot is
 * computed one way only, so results do not depend on T or thread count.
 */

#define IG_Q8_GROUPS 8   /* packed groups (4 rows each) per parallel block */

static inline __m256 FN(q8_block)(const ig_block_q8 *x, const uint8_t *qs, float dw, __m256 acc) {
    /* dw: the weight block's half scale, widened (exactly) by the caller */
    const __m256i xv = _mm256_loadu_si256((const __m256i *)x->qs);
    const __m256i wv = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)qs),
                                        _mm256_set1_epi8((char)0x80));
    /* |w| as u8 and x with w's sign: their products are x*w, and neither is ever -128 */
    const __m256i p = QDOT(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(x->d * dw), acc);
}

static inline float FN(q8_hsum)(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* acc[j] = dot(x, row j of the packed group g) for its 4 rows */
static inline void FN(q8_tile_1x4)(float *acc, const ig_block_q8 *x, const uint8_t *g, int nb) {
    const uint16_t *h = (const uint16_t *)g;
    const uint8_t *qs = g + IG_Q8P_SCALE_BYTES(nb);
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    float d[4];
    for (int b = 0; b < nb; b++, qs += 4 * IG_QK, h += 4) {
        _mm_storeu_ps(d, _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)h)));
        a0 = FN(q8_block)(x + b, qs, d[0], a0);
        a1 = FN(q8_block)(x + b, qs + IG_QK, d[1], a1);
        a2 = FN(q8_block)(x + b, qs + 2 * IG_QK, d[2], a2);
        a3 = FN(q8_block)(x + b, qs + 3 * IG_QK, d[3], a3);
    }
    acc[0] = FN(q8_hsum)(a0); acc[1] = FN(q8_hsum)(a1);
    acc[2] = FN(q8_hsum)(a2); acc[3] = FN(q8_hsum)(a3);
}

/* The q8 driver: parallel over blocks of IG_Q8_GROUPS packed groups; for each
 * activation row, `tile` makes a group's 4 dots (and those of w2), then the epilogue. */
typedef void (*FN(q_tile))(float *acc, const ig_block_q8 *x, const uint8_t *g, int nb);

static void FN(q_matmul)(const ig_matmul_args *a, FN(q_tile) tile, int64_t gbytes, int n_threads) {
    const int T = a->T, N = a->N, nb = a->K / IG_QK;
    const ig_block_q8 *X = a->x;
    const uint8_t *W = a->w, *W2 = a->w2;
    const int n_groups = (N + 3) / 4, n_par = (n_groups + IG_Q8_GROUPS - 1) / IG_Q8_GROUPS;
    IG_FOR(blk, n_par) {
        const int g0 = blk * IG_Q8_GROUPS;
        const int g1 = g0 + IG_Q8_GROUPS < n_groups ? g0 + IG_Q8_GROUPS : n_groups;
        float g[4], u[4];
        for (int t = 0; t < T; t++) {
            const ig_block_q8 *x = X + (size_t)t * nb;
            for (int gi = g0; gi < g1; gi++) {
                tile(g, x, W + gi * gbytes, nb);
                if (W2) tile(u, x, W2 + gi * gbytes, nb);
                const int n = gi * 4, nt = N - n < 4 ? N - n : 4;
                for (int j = 0; j < nt; j++)
                    a->out[(size_t)t * a->ldo + n + j] =
                        IG_MATMUL_EPILOGUE(a, g[j], a->w2 ? u[j] : 0.0f, t, n + j);
            }
        }
    }
    (void)n_threads;
}

void FN(ig_matmul_q8)(const ig_matmul_args *a, int n_threads) {
    FN(q_matmul)(a, FN(q8_tile_1x4), IG_Q8P_GROUP_BYTES(a->K / IG_QK), n_threads);
}

#undef IG_Q8_GROUPS
