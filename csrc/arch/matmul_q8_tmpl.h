/* matmul_q8_tmpl.h — the q8 matmul over 256-bit vectors on packed weights (ignis.h), instantiated
 * by an arch file that defines QDOT(aw, sx): 8 int32 sums of 4 products of |w| (u8) and x*sign(w)
 * (s8) each, and FN(name).
 *
 * One block = one 256-bit load per operand (the stored u8 integers are shifted back to s8 first);
 * its integer dot is summed exactly in int32, goes to f32, is scaled by d_x*d_w and added to the
 * row's accumulator, block after block, as the portable twin does (the same bits). A tile is one
 * packed group (4 weight rows) against one activation row: the group's 4 x 32 bytes per block are
 * contiguous, so the weights stream in order.
 */

#define IG_Q8_GROUPS 8   /* packed groups (4 rows each) per parallel block */

/* the exact int32 dot of the activation block x with one row's stored block qs (u8 = q + 128) */
static inline __m256i FN(q8_dot)(__m256i xv, const uint8_t *qs) {
    const __m256i wv = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)qs),
                                        _mm256_set1_epi8((char)0x80));
    /* |w| as u8 and x with w's sign: their products are x*w, and neither is ever -128 */
    return QDOT(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));
}

/* acc[j] = dot(x, row j of the packed group g) for its 4 rows, bit for bit the twin
 * (ops/quant.c): each row's block dot is summed exactly in int32 (three vphaddd and one add put
 * the 4 rows' sums side by side), then acc += (float)s * (d_x * d_w), block after block. */
static inline void FN(q8_tile_1x4)(float *acc, const ig_block_q8 *x, const uint8_t *g, int nb) {
    const uint16_t *h = (const uint16_t *)g;
    const uint8_t *qs = g + IG_Q8P_SCALE_BYTES(nb);
    __m128 a = _mm_setzero_ps();
    for (int b = 0; b < nb; b++, qs += 4 * IG_QK, h += 4) {
        const __m256i xv = _mm256_loadu_si256((const __m256i *)x[b].qs);
        const __m256i s = _mm256_hadd_epi32(
            _mm256_hadd_epi32(FN(q8_dot)(xv, qs), FN(q8_dot)(xv, qs + IG_QK)),
            _mm256_hadd_epi32(FN(q8_dot)(xv, qs + 2 * IG_QK), FN(q8_dot)(xv, qs + 3 * IG_QK)));
        const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        const __m128 dw = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)h));
        a = _mm_add_ps(a, _mm_mul_ps(_mm_cvtepi32_ps(s4), _mm_mul_ps(_mm_set1_ps(x[b].d), dw)));
    }
    _mm_storeu_ps(acc, a);
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
