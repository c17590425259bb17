/* avx2.c — AVX2 + FMA hot loops. Compiled with -mavx2 -mfma only; called only when dispatch says so. */
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include "x86.h"

#include <math.h>

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
#define IG_DECODE_STREAMS 2   /* 8 lanes a 4-cycle FMA: one row's chain is too slow alone */
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

/* ---- the q8 matmul on packed q8 weights (ignis.h) ---------------------------------------------
 *
 * Bit for bit the portable twin (ops/quant.c): each row's block dot is summed exactly in int32,
 * goes to f32, is scaled by d_x * d_w and added to the row's accumulator, block after block.
 * A row's 32 stored integers (u8 = q + 128) go back to s8 by one xor; vpmaddubsw of |x| (u8, made
 * once per activation block) with q * sign(x) (s8) makes the products in pairs (|pair| <= 2 * 127
 * * 127 < 32767: never saturates, as neither is ever -128), and vpmaddwd with ones widens them to
 * 8 int32 per row: four operations a row and block. A tile of two groups (8 rows) sums them with
 * six vphaddd, one blend and one permute into one vector, [rows 0..3 of group 0 | rows 0..3 of
 * group 1], so the f32 steps run 8 rows a vector (a tile of one group: 4 rows in 128 bits). Each
 * output is computed one way whatever the tile, T or the thread count. */

/* the 8 int32 partial dots of a row's block (wv: its integers as s8) with an activation block
 * (ax = |x|, xv = x) */
static inline __m256i q8x2_row(__m256i wv, __m256i ax, __m256i xv) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(wv, xv)),
                             _mm256_set1_epi16(1));
}

/* dots of TT activation rows (x, ldx blocks apart) with G groups (g, gstride bytes apart): acc[t]
 * [4 * gi + r] = row r of group gi. pf: bytes from a group to the one to prefetch (0: G groups on). */
static inline __attribute__((always_inline)) void q8x2_tile(
        float acc[4][16], const ig_block_q8 *x, int64_t ldx, const uint8_t *g, int64_t gstride,
        int64_t pf, int nb, const int G, const int TT) {
    const __m256i b128 = _mm256_set1_epi8((char)0x80);
    const int64_t sb = IG_Q8P_SCALE_BYTES(nb);
    if (!pf) pf = G * gstride;
    __m256 a8[4];
    __m128 a4[4];
    for (int t = 0; t < TT; t++) {
        a8[t] = _mm256_setzero_ps();
        a4[t] = _mm_setzero_ps();
    }
    for (int b = 0; b < nb; b++) {
        __m256i xv[4], ax[4];
        for (int t = 0; t < TT; t++) {
            xv[t] = _mm256_loadu_si256((const __m256i *)x[t * ldx + b].qs);
            ax[t] = _mm256_abs_epi8(xv[t]);
        }
        /* per row pair k (group k / 2, rows 2 * (k % 2) and the next): [row, row, row + 1,
         * row + 1 | the same] partial sums, per activation row */
        __m256i h2[4][4];
        for (int k = 0; k < 2 * G; k++) {
            const uint8_t *gg = g + (k >> 1) * gstride, *q = gg + sb + (int64_t)b * 128 + 64 * (k & 1);
            /* the next tile's integers, and every 8 blocks a line of scales */
            _mm_prefetch((const char *)(q + pf), _MM_HINT_T1);
            if ((b & 7) == 0 && (k & 1) == 0)
                _mm_prefetch((const char *)(gg + pf + (int64_t)b * 8), _MM_HINT_T1);
            const __m256i w0 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)q), b128);
            const __m256i w1 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(q + 32)), b128);
            for (int t = 0; t < TT; t++)
                h2[t][k] = _mm256_hadd_epi32(q8x2_row(w0, ax[t], xv[t]), q8x2_row(w1, ax[t], xv[t]));
        }
        if (G == 2) {
            const __m128i h = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(g + (int64_t)b * 8)),
                                                 _mm_loadl_epi64((const __m128i *)(g + gstride + (int64_t)b * 8)));
            const __m256 dw = _mm256_cvtph_ps(h);
            for (int t = 0; t < TT; t++) {
                /* [g0 rows 0..3, low half | g0 rows 0..3, high half] and the same of g1 */
                const __m256i s0 = _mm256_hadd_epi32(h2[t][0], h2[t][1]);
                const __m256i s1 = _mm256_hadd_epi32(h2[t][2], h2[t][3]);
                const __m256i s = _mm256_add_epi32(_mm256_blend_epi32(s0, s1, 0xF0),
                                                   _mm256_permute2x128_si256(s0, s1, 0x21));
                const __m256 dx = _mm256_set1_ps(x[t * ldx + b].d);
                a8[t] = _mm256_add_ps(a8[t], _mm256_mul_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dx, dw)));
            }
        } else {
            const __m128 dw = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(g + (int64_t)b * 8)));
            for (int t = 0; t < TT; t++) {
                const __m256i s8 = _mm256_hadd_epi32(h2[t][0], h2[t][1]);
                const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
                const __m128 dx = _mm_set1_ps(x[t * ldx + b].d);
                a4[t] = _mm_add_ps(a4[t], _mm_mul_ps(_mm_cvtepi32_ps(s), _mm_mul_ps(dx, dw)));
            }
        }
    }
    for (int t = 0; t < TT; t++) {
        if (G == 2) _mm256_storeu_ps(acc[t], a8[t]);
        else _mm_storeu_ps(acc[t], a4[t]);
    }
}

/* one tile with G (groups) and TT (activation rows) as compile-time constants: G in {1, 2} for up
 * to 4 activation rows, and 4 for one (the q4 tile's decode; the x16 tile measured no faster) */
#define IG_X2_TILE(call, ...)                                                                      \
    do {                                                                                           \
        if (G == 4) {                                                                              \
            call(__VA_ARGS__, 4, 1);                                                               \
        } else if (G == 2) {                                                                       \
            if (tt == 1) call(__VA_ARGS__, 2, 1);                                                  \
            else if (tt == 2) call(__VA_ARGS__, 2, 2);                                             \
            else if (tt == 3) call(__VA_ARGS__, 2, 3);                                             \
            else call(__VA_ARGS__, 2, 4);                                                          \
        } else {                                                                                   \
            if (tt == 1) call(__VA_ARGS__, 1, 1);                                                  \
            else if (tt == 2) call(__VA_ARGS__, 1, 2);                                             \
            else if (tt == 3) call(__VA_ARGS__, 1, 3);                                             \
            else call(__VA_ARGS__, 1, 4);                                                          \
        }                                                                                          \
    } while (0)

/* dots of `tt` activation rows from t against groups [gi, gi+G) of w (second: of w2), G in {1, 2}:
 * into acc */
static void q8x2_dots(float acc[4][16], const ig_matmul_args *a, int second, int t, int tt, int gi,
                      int G, int nb) {
    const int64_t gb = IG_Q8P_GROUP_BYTES(nb);
    const ig_block_q8 *x = (const ig_block_q8 *)a->x + (size_t)t * nb;
    const uint8_t *g = (const uint8_t *)(second ? a->w2 : a->w) + gi * gb;
    if (G == 2) {
        if (tt == 1) q8x2_tile(acc, x, nb, g, gb, 0, nb, 2, 1);
        else if (tt == 2) q8x2_tile(acc, x, nb, g, gb, 0, nb, 2, 2);
        else if (tt == 3) q8x2_tile(acc, x, nb, g, gb, 0, nb, 2, 3);
        else q8x2_tile(acc, x, nb, g, gb, 0, nb, 2, 4);
    } else {
        if (tt == 1) q8x2_tile(acc, x, nb, g, gb, 0, nb, 1, 1);
        else if (tt == 2) q8x2_tile(acc, x, nb, g, gb, 0, nb, 1, 2);
        else if (tt == 3) q8x2_tile(acc, x, nb, g, gb, 0, nb, 1, 3);
        else q8x2_tile(acc, x, nb, g, gb, 0, nb, 1, 4);
    }
}

/* Decode reads each thread's share of a matrix as two sequential streams, as the VNNI kernels do
 * (csrc/arch/avx512.c, IG_QV_PAIR_PF_BYTES): a tile pairs a group of the first half of the matrix with
 * one half the matrix on, and each stream is prefetched IG_X2_PAIR_PF groups ahead. A second
 * stream gives the hardware prefetcher a second run to follow; each group's dots are computed as
 * in any tile, so no bit changes. */
#define IG_X2_PAIR_PF 2

/* one activation row's dots against pg groups from ga on and pg from gz on (two streams):
 * acc[0][4 * p + r] row r of group ga + p, acc[0][4 * (pg + p) + r] of group gz + p; pg is 1 or
 * the pair function's own number (pair_groups of q2_matmul) */
typedef void (*q2_pair_fn)(float acc[4][16], const ig_matmul_args *a, int second, int ga, int gz,
                           int pg, int nb);

static void q8x2_pair(float acc[4][16], const ig_matmul_args *a, int second, int ga, int gz, int pg,
                      int nb) {
    const int64_t gb = IG_Q8P_GROUP_BYTES(nb);
    const uint8_t *g = (const uint8_t *)(second ? a->w2 : a->w) + ga * gb;
    q8x2_tile(acc, a->x, nb, g, (int64_t)(gz - ga) * gb, IG_X2_PAIR_PF * gb, nb, 2, 1);
    (void)pg;
}

/* The driver of the q8, q4 and 4-row x16 matmuls: parallel over blocks of IG_Q2_GROUPS packed groups of 4
 * rows, tiles of up to 4 activation rows (`prefill_groups` groups) or one (`decode_groups`),
 * `dots` for the tile's dot products (of w, and of w2 for the SwiGLU form), then the epilogue.
 * With one activation row and `pair`, index blk is block blk and block blk + half, their groups
 * paired in order, pair_groups of each a tile (1 near the end of a short block), a group left
 * over (the last block is short, or has no partner) in a tile of its own. */
typedef void (*q2_dots_fn)(float acc[4][16], const ig_matmul_args *a, int second, int t, int tt,
                           int gi, int G, int nb);

#define IG_Q2_GROUPS 8

static void q2_matmul(const ig_matmul_args *a, q2_dots_fn dots, q2_pair_fn pair, int pair_groups,
                      int decode_groups, int prefill_groups) {
    const int T = a->T, N = a->N, nb = a->K / IG_QK;
    const int n_groups = (N + 3) / 4, n_par = (n_groups + IG_Q2_GROUPS - 1) / IG_Q2_GROUPS;
    if (T == 1 && pair && n_par >= 2) {
        const int half = (n_par + 1) / 2;
        IG_FOR(blk, half) {
            const int a0 = blk * IG_Q2_GROUPS, z0 = (blk + half) * IG_Q2_GROUPS;
            const int na = n_groups - a0 < IG_Q2_GROUPS ? n_groups - a0 : IG_Q2_GROUPS;
            const int nz = blk + half >= n_par ? 0
                         : n_groups - z0 < IG_Q2_GROUPS ? n_groups - z0 : IG_Q2_GROUPS;
            float g[4][16], u[4][16];
            for (int j = 0; j < na || j < nz;) {
                const int two = j < na && j < nz, gi = j < na ? a0 + j : z0 + j;
                const int pg = two && j + pair_groups <= na && j + pair_groups <= nz ? pair_groups : 1;
                if (two) {
                    pair(g, a, 0, gi, z0 + j, pg, nb);
                    if (a->w2) pair(u, a, 1, gi, z0 + j, pg, nb);
                } else {
                    dots(g, a, 0, 0, 1, gi, 1, nb);
                    if (a->w2) dots(u, a, 1, 0, 1, gi, 1, nb);
                }
                for (int k = 0; k <= two; k++)
                    for (int p = 0; p < pg; p++) {
                        const int n = ((k ? z0 : a0) + j + p) * 4, nt = N - n < 4 ? N - n : 4;
                        const int c = 4 * (k * pg + p);
                        for (int r = 0; r < nt; r++)
                            a->out[n + r] = IG_MATMUL_EPILOGUE(a, g[0][c + r],
                                                               a->w2 ? u[0][c + r] : 0.0f, 0, n + r);
                    }
                j += pg;
            }
        }
        return;
    }
    IG_FOR(blk, n_par) {
        const int g0 = blk * IG_Q2_GROUPS;
        const int g1 = g0 + IG_Q2_GROUPS < n_groups ? g0 + IG_Q2_GROUPS : n_groups;
        float g[4][16], u[4][16];
        for (int t = 0; t < T;) {
            const int tt = T - t >= 4 ? 4 : T - t;
            for (int gi = g0; gi < g1;) {
                int G = tt == 1 ? decode_groups : prefill_groups;
                while (gi + G > g1) G /= 2;
                dots(g, a, 0, t, tt, gi, G, nb);
                if (a->w2) dots(u, a, 1, t, tt, gi, G, nb);
                const int n = gi * 4, nt = N - n < 4 * G ? N - n : 4 * G;
                for (int i = 0; i < tt; i++)
                    for (int j = 0; j < nt; j++)
                        a->out[(size_t)(t + i) * a->ldo + n + j] =
                            IG_MATMUL_EPILOGUE(a, g[i][j], a->w2 ? u[i][j] : 0.0f, t + i, n + j);
                gi += G;
            }
            t += tt;
        }
    }
}

#undef IG_Q2_GROUPS

void ig_matmul_q8_avx2(const ig_matmul_args *a, int n_threads) {
    q2_matmul(a, q8x2_dots, q8x2_pair, 1, 2, 2);
    (void)n_threads;
}

/* ---- the q4 matmul on packed q4 weights (ignis.h) ---------------------------------------------
 *
 * Two blocks of a group (4 rows) per step. A 32-byte load holds two rows' 16 bytes of a block; the
 * low nibbles are the rows' first 16 integers, the high nibbles the last 16, each stored plus 8
 * (u8 0..15), so vpmaddubsw of them with the activation's first and last 16 bytes (broadcast to
 * both 128-bit lanes) cannot saturate (|15 * 127 * 2| < 32767, and the lo and hi pieces summed:
 * 4 products, |4 * 15 * 127| < 32767); two vphaddw sum them to 16 products a lane, still exact
 * in int16 (16 * 15 * 127 = 30480), and one vpmaddwd with ones leaves one int32 per row and block:
 * [row 0, row 2 of block b, of b + 1 | row 1, row 3 ...].
 * The +8 comes back as 8 * sum(x) per block, made once per activation row by the same steps on a
 * weight row of eights. Then the twin's f32 steps (ops/quant.c): the exact int32 dot to f32, times
 * d_x * d_w, added to the row's one accumulator block after block (block b + 1's product moved onto
 * block b's lane by a permute), so the result is the twin's bit for bit whatever T, the tile or
 * the thread count. */

/* the int16 dots of one block of 4 rows (w01: rows 0, 1; w23: rows 2, 3) with (xl, xh), 8
 * products a lane: [row 0 x 4, row 2 x 4 | row 1 x 4, row 3 x 4] partial sums */
static inline __m256i q4x2_block(__m256i w01, __m256i w23, __m256i xl, __m256i xh) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i p01 = _mm256_add_epi16(
        _mm256_maddubs_epi16(_mm256_and_si256(w01, m4), xl),
        _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(w01, 4), m4), xh));
    const __m256i p23 = _mm256_add_epi16(
        _mm256_maddubs_epi16(_mm256_and_si256(w23, m4), xl),
        _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(w23, 4), m4), xh));
    return _mm256_hadd_epi16(p01, p23);
}

/* dots of TT activation rows (x, ldx blocks apart) with G groups: the first G / 2 from g on, the
 * others from g2 on, gstride bytes apart (g2 = g + G / 2 * gstride: G groups in a row; else two
 * streams); pf: bytes from a group to the one to prefetch (0: two tiles on) */
static inline __attribute__((always_inline)) void q4x2_tile(
        float acc[4][16], const ig_block_q8 *x, int64_t ldx, const uint8_t *g, const uint8_t *g2,
        int64_t gstride, int64_t pf, int nb, const int G, const int TT) {
    if (!pf) pf = 2 * G * gstride;
    const __m256i eights = _mm256_set1_epi8(8), z = _mm256_setzero_si256();
    const __m256i order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    const int64_t sb = IG_Q4P_SCALE_BYTES(nb);
    __m256 a[4][4];
    for (int gi = 0; gi < G; gi++)
        for (int t = 0; t < TT; t++) a[gi][t] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b += 2) {
        const int two = b + 1 < nb;     /* an odd nb: the last step has one block */
        /* per activation row: its pieces of both blocks, 8 * sum(x) per block in the dots' lanes,
         * and d_x of each block in the same lanes */
        __m256i xl[4][2], xh[4][2], bias[4];
        __m256 dx[4];
        for (int t = 0; t < TT; t++) {
            const ig_block_q8 *xb = x + t * ldx + b;
            __m256i c[2];
            for (int k = 0; k < 2; k++) {
                if (k == 1 && !two) {
                    xl[t][1] = xh[t][1] = c[1] = z;
                    break;
                }
                xl[t][k] = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)xb[k].qs));
                xh[t][k] = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(xb[k].qs + 16)));
                const __m256i e = _mm256_madd_epi16(
                    _mm256_add_epi16(_mm256_maddubs_epi16(eights, xl[t][k]),
                                     _mm256_maddubs_epi16(eights, xh[t][k])),
                    _mm256_set1_epi16(1));
                c[k] = _mm256_hadd_epi32(e, e);
            }
            bias[t] = _mm256_hadd_epi32(c[0], c[1]);
            const float d0 = xb[0].d, d1 = two ? xb[1].d : 0.0f;
            dx[t] = _mm256_setr_ps(d0, d0, d1, d1, d0, d0, d1, d1);
        }
        for (int gi = 0; gi < G; gi++) {
            const uint8_t *gg = gi < G / 2 ? g + gi * gstride : g2 + (gi - G / 2) * gstride;
            const uint8_t *q = gg + sb + (int64_t)b * 64, *next = gg + pf;
            /* the groups pf bytes on (two tiles ahead; in a pair, the stream's groups two tiles
             * ahead): their integers, and every 8 blocks a line of scales */
            _mm_prefetch((const char *)(next + sb + (int64_t)b * 64), _MM_HINT_T1);
            _mm_prefetch((const char *)(next + sb + (int64_t)b * 64 + 64), _MM_HINT_T1);
            if ((b & 7) == 0) _mm_prefetch((const char *)(next + (int64_t)b * 8), _MM_HINT_T1);
            const __m128i h = two ? _mm_loadu_si128((const __m128i *)(gg + (int64_t)b * 8))
                                  : _mm_loadl_epi64((const __m128i *)(gg + (int64_t)b * 8));
            const __m256 dw = _mm256_permutevar8x32_ps(_mm256_cvtph_ps(h), order);
            const __m256i w0 = _mm256_loadu_si256((const __m256i *)q);
            const __m256i w1 = _mm256_loadu_si256((const __m256i *)(q + 32));
            const __m256i w2 = two ? _mm256_loadu_si256((const __m256i *)(q + 64)) : z;
            const __m256i w3 = two ? _mm256_loadu_si256((const __m256i *)(q + 96)) : z;
            for (int t = 0; t < TT; t++) {
                const __m256i s = _mm256_sub_epi32(
                    _mm256_madd_epi16(_mm256_hadd_epi16(q4x2_block(w0, w1, xl[t][0], xh[t][0]),
                                                        q4x2_block(w2, w3, xl[t][1], xh[t][1])),
                                      _mm256_set1_epi16(1)),
                    bias[t]);
                /* the twin's f32 steps: (float)s * (d_x * d_w), added block b then block b + 1 */
                const __m256 p = _mm256_mul_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dx[t], dw));
                a[gi][t] = _mm256_add_ps(a[gi][t], p);
                if (two) a[gi][t] = _mm256_add_ps(a[gi][t], _mm256_permute_ps(p, _MM_SHUFFLE(3, 2, 3, 2)));
            }
        }
    }
    /* row r's sum: lane 0, 4, 1, 5 for r = 0, 1, 2, 3 (lanes 2, 3, 6, 7 hold nothing used) */
    for (int gi = 0; gi < G; gi++)
        for (int t = 0; t < TT; t++) {
            float v[8];
            _mm256_storeu_ps(v, a[gi][t]);
            acc[t][4 * gi + 0] = v[0];
            acc[t][4 * gi + 1] = v[4];
            acc[t][4 * gi + 2] = v[1];
            acc[t][4 * gi + 3] = v[5];
        }
}

static void q4x2_dots(float acc[4][16], const ig_matmul_args *a, int second, int t, int tt, int gi,
                      int G, int nb) {
    const int64_t gb = IG_Q4P_GROUP_BYTES(nb);
    const ig_block_q8 *x = (const ig_block_q8 *)a->x + (size_t)t * nb;
    const uint8_t *g = (const uint8_t *)(second ? a->w2 : a->w) + gi * gb;
    IG_X2_TILE(q4x2_tile, acc, x, nb, g, g + G / 2 * gb, gb, 0, nb);
}

/* one activation row against pg groups from ga on and pg from gz on (two streams: q2_pair_fn) */
static void q4x2_pair(float acc[4][16], const ig_matmul_args *a, int second, int ga, int gz, int pg,
                      int nb) {
    const int64_t gb = IG_Q4P_GROUP_BYTES(nb);
    const uint8_t *w = (const uint8_t *)(second ? a->w2 : a->w);
    if (pg == 2)
        q4x2_tile(acc, a->x, nb, w + ga * gb, w + gz * gb, gb, 2 * IG_X2_PAIR_PF * gb, nb, 4, 1);
    else
        q4x2_tile(acc, a->x, nb, w + ga * gb, w + gz * gb, gb, IG_X2_PAIR_PF * gb, nb, 2, 1);
}

/* ---- a GGUF file's own blocks with x16 activations (layouts in ignis.h) ----------------------
 *
 * Bit for bit the portable twin (ops/quant_x16.c): each row's 16-weight half is an exact int32 sum
 * per block, turned to f32 and scaled by d_x * scale[half], and a row's accumulator adds half 0,
 * then half 1, then the block's offset, block after block, as the twin does; only the integer work
 * is vectorized, and a vector's lanes are 4 rows side by side (never one row's partial sums, whose
 * order would change the rounding). AVX2 has no u8 x s8 dot into int32, and vpmaddubsw saturates
 * (Q8_0's u8 integers times a piece of the activation pass int16 in a pair), so both sides go to
 * int16: the weights' integers u (k plus the layout's bias, 0..255) zero-extended, the activation
 * a = 256 * hi + lo (-32512..32512) rebuilt once per block, and vpmaddwd sums pairs exactly in
 * int32 (|u * a| <= 255 * 32512). The bias comes back from the activation's stored half sums:
 * -bias * s[half]. (vpmaddubsw on the hi and lo pieces would not saturate for the layouts whose u
 * stay below 64, but it measured no faster here: two multiplies per row instead of one; nor did
 * the q4 tile's shape for the nibble layouts, two rows a vector through vpmaddubsw and the sums of
 * 8 products kept in int16 by vphaddw. One activation row of Q5_0, Q5_1, Q5_K, Q4_K, Q4_1 goes to
 * x2_gemv.)
 *
 * Each row is decoded into one vector of its 32 u8 integers in index order (k[0..15] in the low
 * 128 bits, k[16..31] in the high), so half h of a row is 128-bit lane h; after the dots, a
 * transpose leaves [row 0..3 of half 0 | row 0..3 of half 1], one int32 per row and half. */

/* The 16 bytes at p in both 128-bit lanes; the low nibbles of each byte in the low lane, the high
 * ones in the high lane (shift the low lane right by `lo` bits, or left by -lo with the high lane
 * unshifted; else the high lane right by `hi`; then keep `mask`). */
static inline __m256i x2_split(const uint8_t *p, int lo, int hi, int mask) {
    const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
    if (lo < 0)
        return _mm256_and_si256(_mm256_sllv_epi32(v, _mm256_setr_epi32(-lo, -lo, -lo, -lo, 0, 0, 0, 0)),
                                _mm256_set1_epi8((char)mask));
    return _mm256_and_si256(_mm256_srlv_epi32(v, _mm256_setr_epi32(lo, lo, lo, lo, hi, hi, hi, hi)),
                            _mm256_set1_epi8((char)mask));
}

/* 0xFF in each byte whose bit is set: byte i of each lane reads bit i % 8 of byte idx[i] of m's
 * own lane (a pshufb of the mask bytes, then the bit). */
static inline __m256i x2_bits(__m256i m, __m256i idx) {
    const __m256i notbit = _mm256_set1_epi64x((long long)0x7fbfdfeff7fbfdfeULL);
    return _mm256_cmpeq_epi8(_mm256_or_si256(_mm256_shuffle_epi8(m, idx), notbit),
                             _mm256_set1_epi64x(-1));
}

/* pshufb indices for row r's 16 bits of the 64-bit masks at byte a0 (lane 0) and a1 (lane 1) of
 * each lane's 16 mask bytes: bytes a + 2r and a + 2r + 1 */
static inline __m256i x2_mask_idx(int r, int a0, int a1) {
    const __m256i base = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                          0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m128i l0 = _mm_set1_epi8((char)(a0 + 2 * r)), l1 = _mm_set1_epi8((char)(a1 + 2 * r));
    return _mm256_add_epi8(base, _mm256_set_m128i(l1, l0));
}

/* the integer dot of one row's u8 integers (index order) with the activation as int16 (a[0..7 |
 * 16..23] and a[8..15 | 24..31]): [4 partial sums of half 0 | of half 1] */
static inline __m256i x2_dot(__m256i u, __m256i alo, __m256i ahi) {
    const __m256i z = _mm256_setzero_si256();
    return _mm256_add_epi32(_mm256_madd_epi16(_mm256_unpacklo_epi8(u, z), alo),
                            _mm256_madd_epi16(_mm256_unpackhi_epi8(u, z), ahi));
}

/* The same with the fifth bit as the int16's high byte: u16 = 16 * nibble + 256 * bit, 16 times the
 * integer, so the dot is 16 times the twin's (|16 * 31 * 32512| * 32 < 2^31) and the caller
 * shifts it back, exactly. The bit needs no placing at 16: one byte of 0 or 1 per weight. */
static inline __m256i x2_dot16(__m256i n16, __m256i bit, __m256i alo, __m256i ahi) {
    return _mm256_add_epi32(_mm256_madd_epi16(_mm256_unpacklo_epi8(n16, bit), alo),
                            _mm256_madd_epi16(_mm256_unpackhi_epi8(n16, bit), ahi));
}

/* 1 in each byte whose bit is set (x2_bits' bytes, as 0 or 1): byte i of each lane reads bit i % 8
 * of byte idx[i] of m's own lane */
static inline __m256i x2_bits01(__m256i m, __m256i idx) {
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    return _mm256_min_epu8(_mm256_and_si256(_mm256_shuffle_epi8(m, idx), bit), _mm256_set1_epi8(1));
}

/* An x16 activation block as int16, a = 256 * hi + lo: *alo = a[0..7 | 16..23] and
 * *ahi = a[8..15 | 24..31], the halves of a row as the x16 tiles lay out a block's weights */
static inline __attribute__((always_inline)) void x2_act16(const ig_block_x16 *xb, __m256i *alo,
                                                           __m256i *ahi) {
    const __m256i z = _mm256_setzero_si256();
    const __m256i hi = _mm256_loadu_si256((const __m256i *)xb->hi);
    const __m256i lo = _mm256_loadu_si256((const __m256i *)xb->lo);
    *alo = _mm256_add_epi16(_mm256_unpacklo_epi8(z, hi), _mm256_srai_epi16(_mm256_unpacklo_epi8(lo, lo), 8));
    *ahi = _mm256_add_epi16(_mm256_unpackhi_epi8(z, hi), _mm256_srai_epi16(_mm256_unpackhi_epi8(lo, lo), 8));
}

/* The tile: acc[t][4 * gi + r] for TT activation rows and G groups of 4 rows, FMT a compile-time
 * IG_WX_* constant. Per block and group: the 4 rows' integers (u8, index order), their scales
 * [row 0..3 of half 0 | of half 1] and offsets as the twin computes them; per activation row the
 * integer dots, then the twin's float steps. */
static inline __attribute__((always_inline)) void x2_tile(
        float acc[4][16], const ig_block_x16 *x, const float *xs, int64_t ldx, const uint8_t *g,
        int64_t gstride, int nb, const int FMT, const int G, const int TT) {
    const int Q8 = FMT == IG_WX_Q8, FIVE = FMT == IG_WX_Q5_0 || FMT == IG_WX_Q5_1 || FMT == IG_WX_Q5K;
    const int KQ = FMT == IG_WX_Q4K || FMT == IG_WX_Q5K, ONE = FMT == IG_WX_Q4_1 || FMT == IG_WX_Q5_1;
    const int Q2 = FMT == IG_WX_Q2K, Q3 = FMT == IG_WX_Q3K, Q6 = FMT == IG_WX_Q6K;
    const int CRUMBS = Q2 || Q3, Q6L = Q6 || CRUMBS;
    const int BIAS = Q8 ? 128 : FMT == IG_WX_Q5_0 ? 16 : Q6 ? 32 : Q3 ? 4 : 0;
    const int64_t sb = IG_Q8P_SCALE_BYTES(nb);
    /* where each region of a group starts: super-block scales, block scales (then Q4_1/Q5_1's
     * offsets), masks, integers */
    const int64_t db = KQ || Q2 ? IG_Q4KP_D_BYTES(nb) : Q6L ? IG_Q6KP_D_BYTES(nb) : 0;
    const int64_t mb = db + (ONE ? 2 : 1) * sb;
    const int64_t qb = mb + (FIVE || Q3 ? IG_Q5P_MASK_BYTES(nb) : Q6 ? IG_Q6KP_MASK_BYTES(nb) : 0);
    const __m256i halves = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    __m128 a[4][4];
    for (int gi = 0; gi < G; gi++)
        for (int t = 0; t < TT; t++) a[gi][t] = _mm_setzero_ps();
    for (int b = 0; b < nb; b++) {
        __m256i u[4][4], hb[4][4];
        __m256 sc[4];
        __m128 off0[4], off1[4];
        for (int gi = 0; gi < G; gi++) {
            const uint8_t *gg = g + gi * gstride, *next = gg + 2 * G * gstride;
            off0[gi] = off1[gi] = _mm_setzero_ps();
            /* scales and offsets, [rows of half 0 | rows of half 1] */
            if (Q8 || FMT == IG_WX_Q5_0 || ONE) {
                const __m128 d = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(gg + 8 * (int64_t)b)));
                sc[gi] = _mm256_set_m128(d, d);
                if (ONE)        /* w = d * q + m: the twin's offset is -m */
                    off0[gi] = _mm_xor_ps(_mm_set1_ps(-0.0f), _mm_cvtph_ps(
                        _mm_loadl_epi64((const __m128i *)(gg + sb + 8 * (int64_t)b))));
            } else if (KQ) {
                const float *sup = (const float *)(gg + 32 * (int64_t)(b / 8));
                const __m128i s8 = _mm_loadl_epi64((const __m128i *)(gg + db + 8 * (int64_t)b));
                const __m128 d = _mm_mul_ps(_mm_loadu_ps(sup), _mm_cvtepi32_ps(_mm_cvtepi8_epi32(s8)));
                sc[gi] = _mm256_set_m128(d, d);
                off0[gi] = _mm_mul_ps(_mm_loadu_ps(sup + 4),
                                      _mm_cvtepi32_ps(_mm_cvtepi8_epi32(_mm_srli_si128(s8, 4))));
            } else {            /* Q6_K, Q3_K, Q2_K: per row and half */
                const __m128i s8 = _mm_loadl_epi64((const __m128i *)(gg + db + 8 * (int64_t)b));
                const __m256i s = _mm256_permutevar8x32_epi32(
                    Q2 ? _mm256_cvtepu8_epi32(s8) : _mm256_cvtepi8_epi32(s8), halves);
                const __m128 d4 = _mm_loadu_ps((const float *)(gg + (Q2 ? 32 : 16) * (int64_t)(b / 8)));
                const __m256 d = _mm256_set_m128(d4, d4);
                if (Q2) {
                    const __m128 m4 = _mm_loadu_ps((const float *)(gg + 32 * (int64_t)(b / 8) + 16));
                    const __m256 o = _mm256_mul_ps(_mm256_set_m128(m4, m4),
                                                   _mm256_cvtepi32_ps(_mm256_srli_epi32(s, 4)));
                    sc[gi] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_and_si256(s, _mm256_set1_epi32(15))));
                    off0[gi] = _mm256_castps256_ps128(o);
                    off1[gi] = _mm256_extractf128_ps(o, 1);
                } else {
                    sc[gi] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(s));
                }
            }
            /* the groups two tiles ahead: their integers, and a line of each side region as it
             * starts */
            _mm_prefetch((const char *)(next + qb + (int64_t)(CRUMBS ? b / 2 : b) * (Q8 ? 128 : 64)),
                         _MM_HINT_T1);
            if (Q8)
                _mm_prefetch((const char *)(next + qb + (int64_t)b * 128 + 64), _MM_HINT_T1);
            if ((FIVE || Q3) && (b & 3) == 0)
                _mm_prefetch((const char *)(next + mb + (int64_t)b * 16), _MM_HINT_T1);
            if (Q6 && (b & 1) == 0)
                _mm_prefetch((const char *)(next + mb + (int64_t)b * 32), _MM_HINT_T1);
            if ((b & 7) == 0)
                _mm_prefetch((const char *)(next + db + (int64_t)b * 8), _MM_HINT_T1);
            if (ONE && (b & 7) == 0)
                _mm_prefetch((const char *)(next + sb + (int64_t)b * 8), _MM_HINT_T1);
            if (Q6L && !Q2 && (b & 31) == 0)
                _mm_prefetch((const char *)(next + 2 * (int64_t)b), _MM_HINT_T1);
            if ((KQ || Q2) && (b & 15) == 0)
                _mm_prefetch((const char *)(next + 4 * (int64_t)b), _MM_HINT_T1);
            /* the integers */
            __m256i m = _mm256_setzero_si256();
            if (FIVE || Q3)
                m = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(gg + mb + 16 * (int64_t)b)));
            else if (Q6)
                m = _mm256_loadu_si256((const __m256i *)(gg + mb + 32 * (int64_t)b));
            for (int r = 0; r < 4; r++) {
                __m256i v;
                if (Q8) {
                    v = _mm256_loadu_si256((const __m256i *)(gg + qb + (int64_t)b * 128 + 32 * r));
                } else if (CRUMBS) {
                    const int sh = 4 * (b & 1);
                    v = x2_split(gg + qb + ((int64_t)(b / 2) * 4 + r) * 16, sh, sh + 2, 3);
                    if (Q3) v = _mm256_or_si256(v, _mm256_and_si256(x2_bits(m, x2_mask_idx(r, 0, 8)),
                                                                  _mm256_set1_epi8(4)));
                } else if (FIVE) {      /* 16 * nibble: the low ones shifted up, the high ones kept */
                    v = x2_split(gg + qb + ((int64_t)b * 4 + r) * 16, -4, 0, 0xF0);
                    hb[gi][r] = x2_bits01(m, x2_mask_idx(r, 0, 8));
                } else {
                    v = x2_split(gg + qb + ((int64_t)b * 4 + r) * 16, 0, 4, 15);
                    if (Q6) {
                        v = _mm256_or_si256(v, _mm256_and_si256(x2_bits(m, x2_mask_idx(r, 0, 0)),
                                                                _mm256_set1_epi8(16)));
                        v = _mm256_or_si256(v, _mm256_and_si256(x2_bits(m, x2_mask_idx(r, 8, 8)),
                                                                _mm256_set1_epi8(32)));
                    }
                }
                /* Q6_K's order (a lane holds quarters 0, 2 or 1, 3) to index order */
                u[gi][r] = Q6L ? _mm256_permute4x64_epi64(v, 0xD8) : v;
            }
        }
        for (int t = 0; t < TT; t++) {
            const ig_block_x16 *xb = x + t * ldx + b;
            __m256i alo, ahi;
            x2_act16(xb, &alo, &ahi);
            const __m256i bias = _mm256_set_m128i(_mm_set1_epi32(-BIAS * xb->s[1]),
                                                  _mm_set1_epi32(-BIAS * xb->s[0]));
            const __m256 dx = _mm256_set1_ps(xb->d);
            for (int gi = 0; gi < G; gi++) {
                __m256i p[4];
                for (int r = 0; r < 4; r++)
                    p[r] = FIVE ? x2_dot16(u[gi][r], hb[gi][r], alo, ahi) : x2_dot(u[gi][r], alo, ahi);
                /* [row 0..3 of half 0 | of half 1]: a transpose of the 4 rows' partial sums */
                const __m256i s01 = _mm256_add_epi32(_mm256_unpacklo_epi32(p[0], p[1]), _mm256_unpackhi_epi32(p[0], p[1]));
                const __m256i s23 = _mm256_add_epi32(_mm256_unpacklo_epi32(p[2], p[3]), _mm256_unpackhi_epi32(p[2], p[3]));
                __m256i s = _mm256_add_epi32(_mm256_unpacklo_epi64(s01, s23), _mm256_unpackhi_epi64(s01, s23));
                if (FIVE) s = _mm256_srai_epi32(s, 4);
                if (BIAS) s = _mm256_add_epi32(s, bias);
                /* the twin: acc += (float)s * (d_x * scale[half]), half 0 then half 1 */
                const __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dx, sc[gi]));
                __m128 v = _mm_add_ps(_mm_add_ps(a[gi][t], _mm256_castps256_ps128(f)),
                                      _mm256_extractf128_ps(f, 1));
                if (KQ || ONE)          /* acc -= offset * xsum */
                    v = _mm_sub_ps(v, _mm_mul_ps(off0[gi], _mm_set1_ps(xs[t * ldx + b])));
                if (Q2)                 /* acc -= d_x * (offset[0] * s[0] + offset[1] * s[1]) */
                    v = _mm_sub_ps(v, _mm_mul_ps(_mm256_castps256_ps128(dx), _mm_add_ps(
                        _mm_mul_ps(off0[gi], _mm_set1_ps((float)xb->s[0])),
                        _mm_mul_ps(off1[gi], _mm_set1_ps((float)xb->s[1])))));
                a[gi][t] = v;
            }
        }
    }
    for (int gi = 0; gi < G; gi++)
        for (int t = 0; t < TT; t++) _mm_storeu_ps(acc[t] + 4 * gi, a[gi][t]);
}

/* ---- the decode tile (one activation row) of the nibble layouts: Q5_0, Q5_1, Q5_K, Q4_K, Q4_1.
 * The same integers and the same f32 steps as x2_tile, with fewer operations: each group's rows
 * are dotted as soon as they are decoded (in x2_tile a T = 1 tile's 8 decoded rows and their
 * fifth bits do not fit the 16 ymm registers, and spill), and Q5_0's integer offset folds into the
 * weights: the int16 weight is 16 * nibble + 256 * (bit - 1) = 16 * k, the bit clear giving a high
 * byte of 0xFF (vpcmpeqb against zero), so no -16 * s[half] is added back; the int32 dot, 16 times
 * the twin's exact sum, is shifted back exactly. The sums go to [row 0..3 of half 0 | of half 1] by
 * unpacks (vphaddd would take fewer operations, but costs 2 cycles here). Measured on this machine
 * (Zen 5, one thread, the 0.5B model's matrices from memory): Q5_0 +9-11%, Q4_K +6% over x2_tile.
 * Q6_K has its own decode tile below: this scheme for it (its -32 folded the same way, its nibbles
 * left in the layout's order with the activation permuted to match) was 2% faster in cache, 6%
 * slower from memory; nor did two rows a vector (one 32-byte load and one shift for two rows) help. */
static inline __attribute__((always_inline)) void x2_gemv(
        float acc[4][16], const ig_block_x16 *x, const float *xs, const uint8_t *g,
        int64_t gstride, int nb, const int FMT, const int G) {
    const int FIVE = FMT == IG_WX_Q5_0 || FMT == IG_WX_Q5_1 || FMT == IG_WX_Q5K;
    const int KQ = FMT == IG_WX_Q4K || FMT == IG_WX_Q5K, ONE = FMT == IG_WX_Q4_1 || FMT == IG_WX_Q5_1;
    const int64_t sb = IG_Q8P_SCALE_BYTES(nb);
    const int64_t db = KQ ? IG_Q4KP_D_BYTES(nb) : 0;
    const int64_t mb = db + (ONE ? 2 : 1) * sb;
    const int64_t qb = mb + (FIVE ? IG_Q5P_MASK_BYTES(nb) : 0);
    const __m256i z = _mm256_setzero_si256();
    const __m256i bitpat = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m128 a[4];
    for (int gi = 0; gi < G; gi++) a[gi] = _mm_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const ig_block_x16 *xb = x + b;
        __m256i alo, ahi;
        x2_act16(xb, &alo, &ahi);
        const __m256 dx = _mm256_set1_ps(xb->d);
        for (int gi = 0; gi < G; gi++) {
            const uint8_t *gg = g + gi * gstride, *next = gg + 2 * G * gstride;
            /* the groups two tiles ahead: their integers, and a line of each side region as it
             * starts */
            _mm_prefetch((const char *)(next + qb + (int64_t)b * 64), _MM_HINT_T1);
            if (FIVE && (b & 3) == 0) _mm_prefetch((const char *)(next + mb + (int64_t)b * 16), _MM_HINT_T1);
            if ((b & 7) == 0) _mm_prefetch((const char *)(next + db + (int64_t)b * 8), _MM_HINT_T1);
            if (ONE && (b & 7) == 0) _mm_prefetch((const char *)(next + sb + (int64_t)b * 8), _MM_HINT_T1);
            if (KQ && (b & 15) == 0) _mm_prefetch((const char *)(next + 4 * (int64_t)b), _MM_HINT_T1);
            __m256i m = z;
            if (FIVE)
                m = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(gg + mb + 16 * (int64_t)b)));
            __m256i p[4];
            for (int r = 0; r < 4; r++) {
                const uint8_t *q = gg + qb + ((int64_t)b * 4 + r) * 16;
                __m256i v, hb = z;
                if (FIVE) {     /* 16 * nibble, and the fifth bit as the high byte */
                    v = x2_split(q, -4, 0, 0xF0);
                    const __m256i s = _mm256_and_si256(_mm256_shuffle_epi8(m, x2_mask_idx(r, 0, 8)), bitpat);
                    hb = FMT == IG_WX_Q5_0 ? _mm256_cmpeq_epi8(s, z) : _mm256_min_epu8(s, _mm256_set1_epi8(1));
                } else {
                    v = x2_split(q, 0, 4, 15);
                }
                p[r] = _mm256_add_epi32(_mm256_madd_epi16(_mm256_unpacklo_epi8(v, hb), alo),
                                        _mm256_madd_epi16(_mm256_unpackhi_epi8(v, hb), ahi));
            }
            /* [row 0..3 of half 0 | of half 1] */
            const __m256i s01 = _mm256_add_epi32(_mm256_unpacklo_epi32(p[0], p[1]), _mm256_unpackhi_epi32(p[0], p[1]));
            const __m256i s23 = _mm256_add_epi32(_mm256_unpacklo_epi32(p[2], p[3]), _mm256_unpackhi_epi32(p[2], p[3]));
            __m256i s = _mm256_add_epi32(_mm256_unpacklo_epi64(s01, s23), _mm256_unpackhi_epi64(s01, s23));
            if (FIVE) s = _mm256_srai_epi32(s, 4);
            /* the scales (and offsets) as the twin computes them */
            __m128 d, off = _mm_setzero_ps();
            if (KQ) {
                const float *sup = (const float *)(gg + 32 * (int64_t)(b / 8));
                const __m128i s8 = _mm_loadl_epi64((const __m128i *)(gg + db + 8 * (int64_t)b));
                d = _mm_mul_ps(_mm_loadu_ps(sup), _mm_cvtepi32_ps(_mm_cvtepi8_epi32(s8)));
                off = _mm_mul_ps(_mm_loadu_ps(sup + 4), _mm_cvtepi32_ps(_mm_cvtepi8_epi32(_mm_srli_si128(s8, 4))));
            } else {
                d = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(gg + 8 * (int64_t)b)));
                if (ONE)        /* w = d * q + m: the twin's offset is -m */
                    off = _mm_xor_ps(_mm_set1_ps(-0.0f), _mm_cvtph_ps(
                        _mm_loadl_epi64((const __m128i *)(gg + sb + 8 * (int64_t)b))));
            }
            /* the twin: acc += (float)s * (d_x * scale[half]), half 0 then half 1 */
            const __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dx, _mm256_set_m128(d, d)));
            __m128 v = _mm_add_ps(_mm_add_ps(a[gi], _mm256_castps256_ps128(f)), _mm256_extractf128_ps(f, 1));
            if (KQ || ONE)      /* acc -= offset * xsum */
                v = _mm_sub_ps(v, _mm_mul_ps(off, _mm_set1_ps(xs[b])));
            a[gi] = v;
        }
    }
    for (int gi = 0; gi < G; gi++) _mm_storeu_ps(acc[0] + 4 * gi, a[gi]);
}

/* ---- the decode tile of Q6_K: the same integers and f32 steps as x2_tile, its weights built as
 * int16 without a byte stage. A row's 16 bytes zero-extended to int16 (vpmovzxbw) give its low
 * nibbles by an and and its high ones by a shift, each already [half 0 | half 1] in the order of
 * the activation's alo and ahi (the layout's byte i holds u[i] and u[i + 8], byte 8 + i u[16 + i]
 * and u[24 + i]), so no vpermq and no unpacks a row. The two high bits of each weight are one
 * int16 lane: a pshufb of the block's masks puts the bit-4 byte in its low byte and the bit-5 byte
 * in its high byte, an and and a vpcmpeqb make them -1 or 0, and vpmaddubsw by (16, 32) gives
 * -(16 * bit4 + 32 * bit5), subtracted from the nibble: u = q + 32. The -32 comes back per group
 * from the activation's half sums, as in x2_tile. */
static inline __attribute__((always_inline)) void x2_gemv_q6k(
        float acc[4][16], const ig_block_x16 *x, const uint8_t *g, int64_t gstride, int nb,
        const int G) {
    const int64_t db = IG_Q6KP_D_BYTES(nb), mb = db + IG_Q8P_SCALE_BYTES(nb);
    const int64_t qb = mb + IG_Q6KP_MASK_BYTES(nb);
    const __m256i halves = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    const __m256i low4 = _mm256_set1_epi16(15), weights = _mm256_set1_epi16(32 * 256 + 16);
    /* int16 lane j reads bit j % 8 of its two bytes */
    const __m256i bit = _mm256_setr_epi16(0x0101, 0x0202, 0x0404, 0x0808, 0x1010, 0x2020, 0x4040, (short)0x8080,
                                          0x0101, 0x0202, 0x0404, 0x0808, 0x1010, 0x2020, 0x4040, (short)0x8080);
    /* row r's bit-4 byte (2r, 2r + 1 in the upper 128 bits) and bit-5 byte (8 bytes on) */
    __m256i idx[4];
    for (int r = 0; r < 4; r++) {
        const __m128i l0 = _mm_set1_epi16((short)((8 + 2 * r) << 8 | 2 * r));
        idx[r] = _mm256_set_m128i(_mm_add_epi8(l0, _mm_set1_epi8(1)), l0);
    }
    __m128 a[4];
    for (int gi = 0; gi < G; gi++) a[gi] = _mm_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const ig_block_x16 *xb = x + b;
        __m256i alo, ahi;
        x2_act16(xb, &alo, &ahi);
        const __m256i bias = _mm256_set_m128i(_mm_set1_epi32(-32 * xb->s[1]), _mm_set1_epi32(-32 * xb->s[0]));
        const __m256 dx = _mm256_set1_ps(xb->d);
        for (int gi = 0; gi < G; gi++) {
            const uint8_t *gg = g + gi * gstride, *next = gg + 2 * G * gstride;
            _mm_prefetch((const char *)(next + qb + (int64_t)b * 64), _MM_HINT_T1);
            if ((b & 1) == 0) _mm_prefetch((const char *)(next + mb + (int64_t)b * 32), _MM_HINT_T1);
            if ((b & 7) == 0) _mm_prefetch((const char *)(next + db + (int64_t)b * 8), _MM_HINT_T1);
            if ((b & 31) == 0) _mm_prefetch((const char *)(next + 2 * (int64_t)b), _MM_HINT_T1);
            /* the masks of the low nibbles (bit 4, bit 5) and of the high ones, in both lanes */
            const __m256i ml = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(gg + mb + 32 * (int64_t)b)));
            const __m256i mh = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(gg + mb + 32 * (int64_t)b + 16)));
            __m256i p[4];
            for (int r = 0; r < 4; r++) {
                const __m256i q = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(gg + qb + ((int64_t)b * 4 + r) * 16)));
                const __m256i bl = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(ml, idx[r]), bit), bit);
                const __m256i bh = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(mh, idx[r]), bit), bit);
                const __m256i wl = _mm256_sub_epi16(_mm256_and_si256(q, low4), _mm256_maddubs_epi16(weights, bl));
                const __m256i wh = _mm256_sub_epi16(_mm256_srli_epi16(q, 4), _mm256_maddubs_epi16(weights, bh));
                p[r] = _mm256_add_epi32(_mm256_madd_epi16(wl, alo), _mm256_madd_epi16(wh, ahi));
            }
            /* [row 0..3 of half 0 | of half 1] */
            const __m256i s01 = _mm256_add_epi32(_mm256_unpacklo_epi32(p[0], p[1]), _mm256_unpackhi_epi32(p[0], p[1]));
            const __m256i s23 = _mm256_add_epi32(_mm256_unpacklo_epi32(p[2], p[3]), _mm256_unpackhi_epi32(p[2], p[3]));
            const __m256i s = _mm256_add_epi32(_mm256_add_epi32(_mm256_unpacklo_epi64(s01, s23), _mm256_unpackhi_epi64(s01, s23)), bias);
            /* scale[row, half] = d[row] * sc[row][half], as the twin */
            const __m128i s8 = _mm_loadl_epi64((const __m128i *)(gg + db + 8 * (int64_t)b));
            const __m256i sc = _mm256_permutevar8x32_epi32(_mm256_cvtepi8_epi32(s8), halves);
            const __m128 d4 = _mm_loadu_ps((const float *)(gg + 16 * (int64_t)(b / 8)));
            const __m256 d = _mm256_mul_ps(_mm256_set_m128(d4, d4), _mm256_cvtepi32_ps(sc));
            /* the twin: acc += (float)s * (d_x * scale[half]), half 0 then half 1 */
            const __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dx, d));
            a[gi] = _mm_add_ps(_mm_add_ps(a[gi], _mm256_castps256_ps128(f)), _mm256_extractf128_ps(f, 1));
        }
    }
    for (int gi = 0; gi < G; gi++) _mm_storeu_ps(acc[0] + 4 * gi, a[gi]);
}

/* dots of `tt` activation rows from t against groups [gi, gi+G) of w (second: of w2): into acc */
static void x2_dots(float acc[4][16], const ig_matmul_args *a, int second, int t, int tt, int gi,
                    int G, int nb) {
    const int fmt = second ? a->layout2 : a->layout;
    const uint8_t *w = second ? a->w2 : a->w;
    const ig_block_x16 *x = (const ig_block_x16 *)a->x + (size_t)t * nb;
    const float *xs = a->xsum + (size_t)t * nb;
#define IG_X2_GEMV(FMT, GROUP_BYTES)                                                               \
    case FMT: {                                                                                    \
        const int64_t gb = GROUP_BYTES(nb);                                                        \
        if (G == 4) x2_gemv(acc, x, xs, w + gi * gb, gb, nb, FMT, 4);                              \
        else if (G == 2) x2_gemv(acc, x, xs, w + gi * gb, gb, nb, FMT, 2);                         \
        else x2_gemv(acc, x, xs, w + gi * gb, gb, nb, FMT, 1);                                     \
        return;                                                                                    \
    }
    if (tt == 1) {
        switch (fmt) {
        IG_X2_GEMV(IG_WX_Q5_0, IG_Q5P_GROUP_BYTES)
        IG_X2_GEMV(IG_WX_Q4K, IG_Q4KP_GROUP_BYTES)
        IG_X2_GEMV(IG_WX_Q4_1, IG_Q41P_GROUP_BYTES)
        IG_X2_GEMV(IG_WX_Q5_1, IG_Q51P_GROUP_BYTES)
        IG_X2_GEMV(IG_WX_Q5K, IG_Q5KP_GROUP_BYTES)
        case IG_WX_Q6K: {
            const int64_t gb = IG_Q6KP_GROUP_BYTES(nb);
            if (G == 4) x2_gemv_q6k(acc, x, w + gi * gb, gb, nb, 4);
            else if (G == 2) x2_gemv_q6k(acc, x, w + gi * gb, gb, nb, 2);
            else x2_gemv_q6k(acc, x, w + gi * gb, gb, nb, 1);
            return;
        }
        }
    }
#undef IG_X2_GEMV
#define IG_X2(FMT, GROUP_BYTES)                                                                    \
    case FMT: {                                                                                    \
        const int64_t gb = GROUP_BYTES(nb);                                                        \
        IG_X2_TILE(x2_tile, acc, x, xs, nb, w + gi * gb, gb, nb, FMT);                             \
        return;                                                                                    \
    }
    switch (fmt) {
    IG_X2(IG_WX_Q8, IG_Q8P_GROUP_BYTES)
    IG_X2(IG_WX_Q5_0, IG_Q5P_GROUP_BYTES)
    IG_X2(IG_WX_Q6K, IG_Q6KP_GROUP_BYTES)
    IG_X2(IG_WX_Q4K, IG_Q4KP_GROUP_BYTES)
    IG_X2(IG_WX_Q4_1, IG_Q41P_GROUP_BYTES)
    IG_X2(IG_WX_Q5_1, IG_Q51P_GROUP_BYTES)
    IG_X2(IG_WX_Q5K, IG_Q5KP_GROUP_BYTES)
    IG_X2(IG_WX_Q3K, IG_Q3KP_GROUP_BYTES)
    IG_X2(IG_WX_Q2K, IG_Q2KP_GROUP_BYTES)
    }
#undef IG_X2
}

void ig_matmul_x16_avx2(const ig_matmul_args *a, int n_threads) {
    q2_matmul(a, x2_dots, NULL, 0, 2, 2);     /* no pairs: a 4-row x16 tile is compute-bound here */
    (void)n_threads;
}

void ig_matmul_q4_avx2(const ig_matmul_args *a, int n_threads) {
    q2_matmul(a, q4x2_dots, q4x2_pair, 2, 4, 2);
    (void)n_threads;
}

/* ---- activation quantization, 8 lanes at a time: the same bytes as the _ref twins (max is exact
 * in any order, the scale and its inverse are the same two divisions, the conversion rounds to
 * nearest even like lrintf; the f32 block sum in the twin's scalar order) ---- */
/* ig_block_amax of the 32 floats in q[0..3]: the largest |x| by bits (a NaN wins) */
static inline float x2_block_amax(const __m256 q[4]) {
    const __m256i abs = _mm256_set1_epi32(0x7fffffff);
    __m256i m = _mm256_and_si256(_mm256_castps_si256(q[0]), abs);
    for (int i = 1; i < 4; i++) m = _mm256_max_epu32(m, _mm256_and_si256(_mm256_castps_si256(q[i]), abs));
    __m128i h = _mm_max_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0x4E));
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0xB1));
    const uint32_t u = (uint32_t)_mm_cvtsi128_si32(h);
    float amax;
    memcpy(&amax, &u, sizeof amax);
    return amax;
}

/* the low byte of each int32 of a and b, in order: the twin's (int8_t) conversion, which wraps */
static inline __m128i x2_low_bytes(__m256i a, __m256i b) {
    const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                          0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i pa = _mm256_shuffle_epi8(a, pick), pb = _mm256_shuffle_epi8(b, pick);
    /* pa: a0-3 in bytes 0-3, a4-7 in bytes 16-19; the same for pb */
    const __m256i ab = _mm256_unpacklo_epi32(pa, pb);       /* a0-3 b0-3 | a4-7 b4-7 */
    const __m256i o = _mm256_permutevar8x32_epi32(ab, _mm256_setr_epi32(0, 4, 1, 5, 0, 0, 0, 0));
    return _mm256_castsi256_si128(o);
}

void ig_quantize_q8_rows_avx2(ig_block_q8 *out, const float *x, int64_t ldx, int T, int K) {
    const int nb = K / IG_QK;
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * ldx;
        ig_block_q8 *o = out + (size_t)t * nb;
        for (int b = 0; b < nb; b++) {
            const float *v = xr + (size_t)b * IG_QK;
            __m256 q[4];
            for (int i = 0; i < 4; i++) q[i] = _mm256_loadu_ps(v + 8 * i);
            const float amax = x2_block_amax(q);
            const float d = amax / 127.0f;
            float id = d > 0.0f ? 127.0f / amax : 0.0f;
            if (!(id < INFINITY)) id = 0.0f;
            o[b].d = d;
            if (id == 0.0f) {       /* the twin's all-zero block (v * id may be NaN or inf here) */
                memset(o[b].qs, 0, IG_QK);
                continue;
            }
            const __m256 vid = _mm256_set1_ps(id);
            for (int h = 0; h < 2; h++)
                _mm_storeu_si128((__m128i *)(o[b].qs + 16 * h),
                                 x2_low_bytes(_mm256_cvtps_epi32(_mm256_mul_ps(q[2 * h], vid)),
                                              _mm256_cvtps_epi32(_mm256_mul_ps(q[2 * h + 1], vid))));
        }
    }
}

void ig_quantize_x16_rows_avx2(ig_block_x16 *out, float *xsum, const float *x, int64_t ldx, int T,
                               int K) {
    const int nb = K / IG_QK;
    const __m256i lim = _mm256_set1_epi32(32512), nlim = _mm256_set1_epi32(-32512);
    const __m256i c128 = _mm256_set1_epi32(128);
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * ldx;
        ig_block_x16 *o = out + (size_t)t * nb;
        for (int b = 0; b < nb; b++) {
            const float *v = xr + (size_t)b * IG_QK;
            __m256 q[4];
            for (int i = 0; i < 4; i++) q[i] = _mm256_loadu_ps(v + 8 * i);
            const float amax = x2_block_amax(q);
            float sum = 0.0f;
            for (int i = 0; i < IG_QK; i++) sum += v[i];
            xsum[(size_t)t * nb + b] = sum;
            const float d = amax / IG_X16_MAX;
            float id = d > 0.0f ? IG_X16_MAX / amax : 0.0f;
            if (!(id < INFINITY)) id = 0.0f;
            o[b].d = d;
            if (id == 0.0f) {       /* the twin's all-zero block (v * id may be NaN or inf here) */
                memset(o[b].hi, 0, IG_QK), memset(o[b].lo, 0, IG_QK);
                o[b].s[0] = o[b].s[1] = 0;
                continue;
            }
            const __m256 vid = _mm256_set1_ps(id);
            for (int h = 0; h < 2; h++) {
                __m256i a[2], hi[2], lo[2];
                for (int j = 0; j < 2; j++) {
                    a[j] = _mm256_cvtps_epi32(_mm256_mul_ps(q[2 * h + j], vid));
                    a[j] = _mm256_max_epi32(_mm256_min_epi32(a[j], lim), nlim);
                    hi[j] = _mm256_srai_epi32(_mm256_add_epi32(a[j], c128), 8);
                    lo[j] = _mm256_sub_epi32(a[j], _mm256_slli_epi32(hi[j], 8));
                }
                const __m256i s8 = _mm256_add_epi32(a[0], a[1]);
                __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
                s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
                s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
                o[b].s[h] = _mm_cvtsi128_si32(s4);
                _mm_storeu_si128((__m128i *)(o[b].hi + 16 * h), x2_low_bytes(hi[0], hi[1]));
                _mm_storeu_si128((__m128i *)(o[b].lo + 16 * h), x2_low_bytes(lo[0], lo[1]));
            }
        }
    }
}

/* ---- SiLU and SwiGLU (ig_silu_f32: ig_expf_f32's double-precision steps 4 lanes at a time, the
 * table by a gather; the twin's bits); the other elementwise ops are the twin's loops ---- */
static inline __m128 expf4_avx2(__m128 x) {
    const __m256d xd = _mm256_cvtps_pd(x), invln2n = _mm256_set1_pd(IG_EXPF_INVLN2N);
    const __m256d shift = _mm256_set1_pd(IG_EXPF_SHIFT);
    const __m256d kds = _mm256_fmadd_pd(invln2n, xd, shift);
    const __m256i ki = _mm256_castpd_si256(kds);
    const __m256d r = _mm256_fmsub_pd(invln2n, xd, _mm256_sub_pd(kds, shift));
    const __m256i t = _mm256_i64gather_epi64((const long long *)ig_expf_tab,
                                             _mm256_and_si256(ki, _mm256_set1_epi64x(31)), 8);
    const __m256d s = _mm256_castsi256_pd(_mm256_add_epi64(t, _mm256_slli_epi64(ki, 47)));
    const __m256d z = _mm256_fmadd_pd(r, _mm256_set1_pd(IG_EXPF_C0), _mm256_set1_pd(IG_EXPF_C1));
    const __m256d y = _mm256_fmadd_pd(z, _mm256_mul_pd(r, r),
                                      _mm256_fmadd_pd(r, _mm256_set1_pd(IG_EXPF_C2), _mm256_set1_pd(1.0)));
    return _mm256_cvtpd_ps(_mm256_mul_pd(y, s));
}

/* ig_expf_f32 of 4 lanes, any edge (|x| >= 88, inf, NaN) by the scalar function */
static inline __m128 expf4_edges_avx2(__m128 x) {
    const __m128i top = _mm_and_si128(_mm_srli_epi32(_mm_castps_si128(x), 20), _mm_set1_epi32(0x7ff));
    if (_mm_movemask_ps(_mm_castsi128_ps(_mm_cmpgt_epi32(top, _mm_set1_epi32(0x42a))))) {
        float v[4];
        _mm_storeu_ps(v, x);
        for (int i = 0; i < 4; i++) v[i] = ig_expf_f32(v[i]);
        return _mm_loadu_ps(v);
    }
    return expf4_avx2(x);
}

/* 8 lanes of ig_silu_f32; lanes with |x| >= 88, inf or NaN take the scalar function's branches */
static inline __m256 silu8_avx2(__m256 x) {
    const __m256 nx = _mm256_xor_ps(x, _mm256_set1_ps(-0.0f));
    const __m256i top = _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(nx), 20),
                                         _mm256_set1_epi32(0x7ff));
    __m256 e;
    if (!_mm256_testz_si256(_mm256_cmpgt_epi32(top, _mm256_set1_epi32(0x42a)), _mm256_set1_epi32(-1))) {
        float v[8];
        _mm256_storeu_ps(v, nx);
        for (int i = 0; i < 8; i++) v[i] = ig_expf_f32(v[i]);
        e = _mm256_loadu_ps(v);
    } else {
        e = _mm256_set_m128(expf4_avx2(_mm256_extractf128_ps(nx, 1)), expf4_avx2(_mm256_castps256_ps128(nx)));
    }
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

void ig_eltwise_f32_avx2(float *out, const float *x, const float *y, int op, int T, int dim,
                         int n_threads) {
    if (op != IG_EW_SILU && op != IG_EW_SWIGLU) {
        ig_eltwise_f32_ref(out, x, y, op, T, dim, n_threads);
        return;
    }
    IG_FOR_IF(t, T, T > 1 && (int64_t)T * dim >= IG_ROWS_PAR_MIN) {
        const size_t at = (size_t)t * dim;
        int i = 0;
        for (; i + 8 <= dim; i += 8) {
            const __m256 g = silu8_avx2(_mm256_loadu_ps(x + at + i));
            _mm256_storeu_ps(out + at + i, op == IG_EW_SWIGLU ? _mm256_mul_ps(g, _mm256_loadu_ps(y + at + i)) : g);
        }
        for (; i < dim; i++) {
            const float g = ig_silu_f32(x[at + i]);
            out[at + i] = op == IG_EW_SWIGLU ? g * y[at + i] : g;
        }
    }
}

/* ---- attention (ops/attention_tmpl.h) compiled with this file's flags, f16 cache rows widened
 * by F16C, its decode shape's keys-as-lanes scores and in-place weighted sums, its
 * online softmax step in vectors over expf4_edges_avx2 above (attention_avx2.h) ---- */
#define ATTN(name) name##_avx2
#include "attention_avx2.h"
#include "../ops/attention_tmpl.h"
#undef ATTN
#endif
