/* avx512.c — AVX-512 (F/BW/DQ/VL) and AVX-512 VNNI hot loops. Compiled with their -m flags only;
 * the VNNI function is reachable only through the avx512_vnni table. */
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#include "x86.h"

#include <math.h>
#include <string.h>

/* ---- the blocked matmul (matmul_tmpl.h) with 16-lane vectors ---- */
#define V __m512
#define VW 16
#define VZERO() _mm512_setzero_ps()
#define VLOAD(p) _mm512_loadu_ps(p)
#define VLOADN(p, n) _mm512_maskz_loadu_ps((__mmask16)((1u << (n)) - 1u), (p))
#define VFMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define VSUM(v) _mm512_reduce_add_ps(v)
#define FN(name) name##_f32_avx512
#define IG_DECODE_STREAMS 1   /* one row at a time: lm_head 151936 x 896 from memory 27-32 -> 36-39 GB/s */
#include "matmul_tmpl.h"
#undef FN

/* ---- the same matmul with bf16 weights: widened by a 16-bit shift, then the f32 path ---- */
#define WT uint16_t
#define WLOAD(p) _mm512_castsi512_ps(_mm512_slli_epi32( \
    _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
#define WLOADN(p, n) _mm512_castsi512_ps(_mm512_slli_epi32( \
    _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16((__mmask16)((1u << (n)) - 1u), (p))), 16))
#define FN(name) name##_bf16_avx512
#define IG_DECODE_STREAMS 2   /* the widening doubles a row's work: two rows, far apart, a tile */
#include "matmul_tmpl.h"
#undef FN

/* ---- the q8 matmul with 512-bit VNNI on packed q8 weights --------------------------------------
 *
 * One 64-byte load holds two weight rows' 32 integers of a block (stored as u8 = q + 128), the
 * activation block is broadcast to both halves, and one vpdpbusd makes 16 int32 lanes: 8 partial
 * dots per row. u8 x s8 gives sum((q + 128) * x) = dot + 128 * sum(x); the 128 * sum(x) part of
 * each lane depends on the activation only, so it is computed once per activation block (another
 * vpdpbusd, against bytes of 128) and starts every row's accumulation negated. Lanes go to f32,
 * are scaled by d_x * d_w (the group's 4 scales spread over the lanes by a permute) and summed,
 * and each 8-lane half is reduced once at the end. A tile is 2 groups (8 rows) x 1 activation row
 * for decode, 1 group x up to 4 activation rows for prefill; every dot is computed the same way in
 * both, so no result depends on T, the tile, or the thread count. */

/* Software prefetch of the weight stream in the x16 and q8 tiles: NTA (into L1, kept out of the
 * outer levels' replacement order), which measured above T1 (into L2) on this EPYC: a large Q6_K
 * matrix (16384 x 4864) read at 18 GB/s on one thread with T1 and 29-31 with NTA or T0; Q5_1 2
 * threads 40-45 -> 43-49; packed q8 262144 x 640, one thread, 30-31 -> 35-37 (benchmarks/
 * bench_kernels.py --model, and RESULTS.md). The q4 tile has its own (below). */
#define IG_PREFETCH_W(p) _mm_prefetch((const char *)(p), _MM_HINT_NTA)

static inline float ig_hsum8_avx512(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* acc[t][r] = dot(x row t, row r of the G groups at g (gstride bytes apart)), r < 4*G. x: q8
 * blocks, or with X16 the x16 blocks of the GGUF-block path (ig_block_x16: the same weights, each
 * product taken as 256 * (w . hi) + (w . lo), the offset from the stored sums) */
static inline __attribute__((always_inline)) void q8v_tile(
        float acc[4][16], const void *x, int64_t ldx, const uint8_t *g, int64_t gstride,
        int64_t pf, int nb, const int X16, const int G, const int TT) {
    if (!pf) pf = G * gstride;
    __m512 a[4][2][4];
    for (int gi = 0; gi < G; gi++)
        for (int h = 0; h < 2; h++)
            for (int t = 0; t < TT; t++) a[gi][h][t] = _mm512_setzero_ps();
    const __m512i b128 = _mm512_set1_epi8((char)0x80), zero = _mm512_setzero_si512();
    const __m512i lo = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m512i hi = _mm512_setr_epi32(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const int64_t sb = IG_Q8P_SCALE_BYTES(nb);
    for (int b = 0; b < nb; b++) {
        __m512 dw[4][2];
        __m512i wq[4][2];
        /* one activation row: its d_x goes into the 4 scales before they are spread over the
         * lanes (each lane the same product d_w * d_x, 2 multiplies a block, not 2 * G) */
        const __m128 dx1 = _mm_set1_ps(TT > 1 ? 1.0f : X16 ? ((const ig_block_x16 *)x)[b].d
                                                           : ((const ig_block_q8 *)x)[b].d);
        for (int gi = 0; gi < G; gi++) {
            const uint8_t *gg = g + gi * gstride;
            const __m128 d4 = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(gg + 8 * (int64_t)b)));
            const __m512 s4 = _mm512_castps128_ps512(TT > 1 ? d4 : _mm_mul_ps(d4, dx1));
            dw[gi][0] = _mm512_permutexvar_ps(lo, s4);
            dw[gi][1] = _mm512_permutexvar_ps(hi, s4);
            /* the next tile's groups: their integers, and every 8 blocks a line of scales (the
             * hardware prefetcher alone leaves one core at 13 GB/s on a large matrix) */
            IG_PREFETCH_W(gg + pf + sb + (int64_t)b * 128);
            IG_PREFETCH_W(gg + pf + sb + (int64_t)b * 128 + 64);
            if ((b & 7) == 0) IG_PREFETCH_W(gg + pf + (int64_t)b * 8);
            wq[gi][0] = _mm512_loadu_si512((const void *)(gg + sb + (int64_t)b * 128));
            wq[gi][1] = _mm512_loadu_si512((const void *)(gg + sb + (int64_t)b * 128 + 64));
        }
        for (int t = 0; t < TT; t++) {
            if (X16) {
                const ig_block_x16 *xb = (const ig_block_x16 *)x + t * ldx + b;
                const __m512i xh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)xb->hi));
                const __m512i xl = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)xb->lo));
                /* -128 * sum(a), in the first lane of each of the two rows */
                const __m512i neg = _mm512_maskz_set1_epi32((__mmask16)0x0101,
                                                            -128 * (xb->s[0] + xb->s[1]));
                const __m512 dx = _mm512_set1_ps(xb->d);
                for (int gi = 0; gi < G; gi++)
                    for (int h = 0; h < 2; h++) {
                        const __m512i ph = _mm512_dpbusd_epi32(zero, wq[gi][h], xh);
                        const __m512i p = _mm512_add_epi32(_mm512_dpbusd_epi32(neg, wq[gi][h], xl),
                                                           _mm512_slli_epi32(ph, 8));
                        a[gi][h][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p),
                                                      TT > 1 ? _mm512_mul_ps(dw[gi][h], dx) : dw[gi][h],
                                                      a[gi][h][t]);
                    }
            } else {
                const ig_block_q8 *xb = (const ig_block_q8 *)x + t * ldx + b;
                const __m512i xv = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)xb->qs));
                const __m512i neg = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, b128, xv));
                const __m512 dx = _mm512_set1_ps(xb->d);
                for (int gi = 0; gi < G; gi++)
                    for (int h = 0; h < 2; h++) {
                        const __m512i p = _mm512_dpbusd_epi32(neg, wq[gi][h], xv);
                        a[gi][h][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p),
                                                      TT > 1 ? _mm512_mul_ps(dw[gi][h], dx) : dw[gi][h],
                                                      a[gi][h][t]);
                    }
            }
        }
    }
    for (int gi = 0; gi < G; gi++)
        for (int h = 0; h < 2; h++)
            for (int t = 0; t < TT; t++) {
                acc[t][gi * 4 + 2 * h] = ig_hsum8_avx512(_mm512_castps512_ps256(a[gi][h][t]));
                acc[t][gi * 4 + 2 * h + 1] = ig_hsum8_avx512(_mm512_extractf32x8_ps(a[gi][h][t], 1));
            }
}

/* one tile of any integer layout, with G and TT as compile-time constants: G in {1, 2, 4} for one
 * activation row, {1, 2} for up to 4 rows */
#define IG_QV_TILE(call, ...)                                                                      \
    do {                                                                                           \
        if (tt == 1) {                                                                             \
            if (G == 4) call(__VA_ARGS__, 4, 1);                                                   \
            else if (G == 2) call(__VA_ARGS__, 2, 1);                                              \
            else call(__VA_ARGS__, 1, 1);                                                          \
        } else if (G == 2) {                                                                       \
            if (tt == 4) call(__VA_ARGS__, 2, 4);                                                  \
            else if (tt == 3) call(__VA_ARGS__, 2, 3);                                             \
            else call(__VA_ARGS__, 2, 2);                                                          \
        } else {                                                                                   \
            if (tt == 4) call(__VA_ARGS__, 1, 4);                                                  \
            else if (tt == 3) call(__VA_ARGS__, 1, 3);                                             \
            else call(__VA_ARGS__, 1, 2);                                                          \
        }                                                                                          \
    } while (0)

/* dots of `tt` activation rows from t against groups [gi, gi+G) of w (second: of w2): into acc */
static void q8v_dots(float acc[4][16], const ig_matmul_args *a, int second, int t, int tt, int gi,
                     int G, int nb) {
    const int64_t gb = IG_Q8P_GROUP_BYTES(nb);
    const ig_block_q8 *x = (const ig_block_q8 *)a->x + (size_t)t * nb;
    const uint8_t *g = (const uint8_t *)(second ? a->w2 : a->w) + gi * gb;
    IG_QV_TILE(q8v_tile, acc, x, nb, g, gb, 0, nb, 0);
}

/* Decode reads each thread's share of a matrix as two streams, not one: an index of the parallel
 * loop is a block of groups in the first half of the matrix and the block half the matrix on, and
 * a tile pairs one group of each (ig_qv_pair). What a decode GEMV from memory gets is bound by the
 * misses a core keeps in flight, and a second sequential stream gives the hardware prefetcher a
 * second run to follow: on this 2-vCPU EPYC guest, gemma3-270m's Q8_0 output projection (262144 x
 * 640, 178 MB) went 34 -> 39 GB/s on one thread and 36 -> 47 (vCPUs on one CCD) or 63 -> 74 (two
 * CCDs) on two, against 40-42 / 50 / 76 for a plain read (benchmarks/RESULTS.md). Each group's dots
 * are computed as in any tile, so no bit changes. */
/* A paired tile prefetches each stream the fewest whole groups ahead that are at least this many
 * bytes: 1 group (3.8 KB) at K = 896, 2 (5.5 KB) at gemma's K = 640. With the pair function's
 * d_x folded into the scales, the 0.5B output projection (151936 x 896) from memory on one
 * thread read 33.7-35.9 -> 35.3-37.7 GB/s (Q8_0, packed q8) a group ahead, against 2; at K = 640
 * 1 group was 10% slower than 2 (benchmarks/RESULTS.md). */
/* A group longer than IG_QV_PAIR_PF_LONG bytes (K > 1920) is prefetched IG_QV_PAIR_PF_FIXED
 * bytes ahead, not a whole group: at K = 4864 (the 0.5B's down projection, 20.7 KB a group) the
 * lines a group ahead in both streams were evicted from the 48 KB L1 before their turn came (NTA
 * lines are not kept in the outer levels), and the matrix read 26-28 GB/s from memory where the
 * K = 896 ones read 35-37; 4 KB ahead, 30-33 (3 KB 30, 5-6 KB 30-31; benchmarks/RESULTS.md). A
 * fixed distance still prefetches every line once: the integers' prefetch runs on into the next
 * group's first bytes, and the scales' (pf + 8 b every 8 blocks) covers the bytes after those. */
#define IG_QV_PAIR_PF_BYTES 3072
#define IG_QV_PAIR_PF_LONG 8192
#define IG_QV_PAIR_PF_FIXED 4096

/* one activation row's dots against two groups far apart, ga and gz: acc[0][0..3] rows of ga,
 * acc[0][4..7] rows of gz (a G = 2 tile whose second group is gz - ga groups on) */
typedef void (*ig_qv_pair)(float acc[4][16], const ig_matmul_args *a, int second, int ga, int gz,
                           int nb);

/* a paired tile's prefetch distance: the fewest whole groups of gb bytes that make
 * IG_QV_PAIR_PF_BYTES, or for a long group IG_QV_PAIR_PF_FIXED bytes */
static inline int64_t qv_pair_pf(int64_t gb) {
    return gb > IG_QV_PAIR_PF_LONG ? IG_QV_PAIR_PF_FIXED : (IG_QV_PAIR_PF_BYTES + gb - 1) / gb * gb;
}

static void q8v_pair(float acc[4][16], const ig_matmul_args *a, int second, int ga, int gz, int nb) {
    const int64_t gb = IG_Q8P_GROUP_BYTES(nb);
    const uint8_t *g = (const uint8_t *)(second ? a->w2 : a->w) + ga * gb;
    q8v_tile(acc, a->x, nb, g, (int64_t)(gz - ga) * gb, qv_pair_pf(gb), nb, 0, 2, 1);
}

/* the same for the x16 blocks of a GGUF Q8_0 matrix (IG_WX_Q8, laid out as packed q8) */
static void x16v_pair(float acc[4][16], const ig_matmul_args *a, int second, int ga, int gz, int nb) {
    const int64_t gb = IG_Q8P_GROUP_BYTES(nb);
    const uint8_t *g = (const uint8_t *)(second ? a->w2 : a->w) + ga * gb;
    q8v_tile(acc, a->x, nb, g, (int64_t)(gz - ga) * gb, qv_pair_pf(gb), nb, 1, 2, 1);
}

/* The driver of the q8 and the 4-row x16 tiles (q4 has its own, below): parallel over blocks of
 * IG_QV_GROUPS packed groups of 4 rows, tiles of up to 4 activation rows, `dots` for the tile's dot
 * products (of w, and of w2 for the SwiGLU form), then the epilogue. decode_groups: groups per tile when there is one row. With
 * `pair` (NULL: none), one row reads two streams (above): index blk is block blk and block
 * blk + half, their groups paired in order, a group left over (the last block is short, or has no
 * partner) in a tile of its own. */
typedef void (*ig_qv_dots)(float acc[4][16], const ig_matmul_args *a, int second, int t, int tt,
                           int gi, int G, int nb);

#define IG_QV_GROUPS 8

static void qv_matmul(const ig_matmul_args *a, ig_qv_dots dots, ig_qv_pair pair, int decode_groups,
                      int n_threads) {
    const int T = a->T, N = a->N, nb = a->K / IG_QK;
    const int n_groups = (N + 3) / 4, n_par = (n_groups + IG_QV_GROUPS - 1) / IG_QV_GROUPS;
    if (T == 1 && pair && n_par >= 2) {
        /* blocks of bg groups, halved while the pairs are fewer than the threads: N = 33-64 made
         * one pair, on one thread; split, 2 threads take 1.7 us, not 2.7, for 40 x 896 from memory
         * (6.8 not 10.6 for 40 x 4864, where one thread takes 8.6-10.3) */
        int bg = IG_QV_GROUPS, np = n_par;
        while (bg > 1 && (np + 1) / 2 < n_threads) {
            bg /= 2;
            np = (n_groups + bg - 1) / bg;
        }
        const int half = (np + 1) / 2;
        IG_FOR(blk, half) {
            const int a0 = blk * bg, z0 = (blk + half) * bg;
            const int na = n_groups - a0 < bg ? n_groups - a0 : bg;
            const int nz = blk + half >= np ? 0 : n_groups - z0 < bg ? n_groups - z0 : bg;
            float g[4][16], u[4][16];
            for (int j = 0; j < na || j < nz; j++) {
                const int two = j < na && j < nz, gi = j < na ? a0 + j : z0 + j;
                if (two) {
                    pair(g, a, 0, gi, z0 + j, nb);
                    if (a->w2) pair(u, a, 1, gi, z0 + j, nb);
                } else {
                    dots(g, a, 0, 0, 1, gi, 1, nb);
                    if (a->w2) dots(u, a, 1, 0, 1, gi, 1, nb);
                }
                for (int k = 0; k <= two; k++) {
                    const int n = (k ? z0 + j : gi) * 4, nt = N - n < 4 ? N - n : 4;
                    for (int r = 0; r < nt; r++)
                        a->out[n + r] = IG_MATMUL_EPILOGUE(a, g[0][4 * k + r],
                                                           a->w2 ? u[0][4 * k + r] : 0.0f, 0, n + r);
                }
            }
        }
        return;
    }
    IG_FOR(blk, n_par) {
        const int g0 = blk * IG_QV_GROUPS;
        const int g1 = g0 + IG_QV_GROUPS < n_groups ? g0 + IG_QV_GROUPS : n_groups;
        float g[4][16], u[4][16];
        for (int t = 0; t < T;) {
            const int tt = T - t >= 4 ? 4 : T - t;
            for (int gi = g0; gi < g1;) {
                int G = tt == 1 ? decode_groups : 2;
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
    (void)n_threads;
}

#undef IG_QV_GROUPS

void ig_matmul_q8_avx512vnni(const ig_matmul_args *a, int n_threads) {
    qv_matmul(a, q8v_dots, q8v_pair, 2, n_threads);
}


/* ---- the q4 matmul with 512-bit VNNI on packed q4 weights -------------------------------------
 *
 * One 64-byte load holds a block of all 4 rows of a group (16 bytes each); the low nibbles are the
 * rows' first 16 integers, the high nibbles the last 16, each plus 8 (u8 0..15). The activation
 * block's first and last 16 bytes are broadcast to every 128-bit lane and two vpdpbusd make 16
 * int32 lanes, 4 per row. The float work is done once per 4 blocks, not per block: the lanes of 4
 * blocks are summed in int16 pairs (vpackssdw + vpmaddwd, twice: exact, each lane is at most
 * 8 * 15 * 127 in magnitude, two of them 30480) into one vector whose lane (r, j) is row r's dot
 * with block b + j, the 8 * sum(x) offsets of the 4 blocks are added back from the activation's
 * summary, and one convert and one fma, by the 4 blocks' 16 scales (one vcvtph2ps of 32 bytes,
 * permuted from (block, row) to (row, block)) times the activation scales, take them to f32. Lane
 * (r, j) of the accumulator sums the blocks b = j mod 4 of row r, and the 4 lanes of a row are
 * added at the end: the same order in the decode tile (1 group) and the prefill tiles (2 groups x
 * up to 4 activation rows), so no result depends on T, the tile, or the thread count.
 *
 * The activation's summary (-8 * sum(x) and d_x per block, zero past the last block) is made once
 * per call for decode, and per 4 activation rows in each parallel block for prefill, in pieces of
 * IG_Q4V_CHUNK blocks (the tiles keep their accumulators across pieces, in memory).
 *
 * Decode tiles are one group, read in address order, so a weight matrix is one sequential stream
 * (and a pass over the model's matrices, laid out one after another, nearly one), and each 64 bytes
 * of weights is prefetched IG_Q4V_AHEAD bytes ahead into L1. On this EPYC (Zen 5), the output
 * projection (151936 x 896) on 2 MB pages, one thread: the earlier 4-group tiles with T1
 * prefetches two tiles ahead 35-36 GB/s, one group with T0 12 KB ahead 46-48 (two threads: 50-52
 * -> 64); without software prefetch one group streams 20-22 (4 KB pages), with T1 instead of T0
 * or 20-24 KB ahead 3-8% slower, 8 KB ahead the same, one prefetch per two lines 28. The
 * prefetches cost compute in cache (896 x 4864 in L2: ~80 GB/s without them, ~70 with; the
 * 4-group tiles ~53), which a stream from memory does not notice. */

#define IG_Q4V_CHUNK 1024   /* blocks per summary: K <= 32768 in one piece */
#define IG_Q4V_AHEAD 12288  /* bytes of weights prefetched ahead of the decode tile */

/* The prefetch walks a group's bytes in address order, 72 a block (its share of the group: 8 bytes
 * of scales, 64 of nibbles), so the prefetched addresses form one ascending sequence IG_Q4V_AHEAD
 * on. Prefetching the nibbles' address plus IG_Q4V_AHEAD, and the scales' every 8 blocks, fetched
 * the same lines once each, but as two sequences climbing at different rates (64 and 8 bytes a
 * block), and the down projection (K = 4864, 11 KB groups) streamed ~20% slower than gate/up; in
 * one sequence it streams as fast as they do, and they gain too (bench_ops, RESULTS.md). */
#define IG_Q4V_PF(gg, b) _mm_prefetch((const char *)((gg) + IG_Q4V_AHEAD + (int64_t)(b) * 72), _MM_HINT_T0)

static inline float ig_hsum4_avx512(__m128 s) {
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* out[r] = the sum of lanes 4r..4r+3 of v (one row's lanes in the 4-row nibble tiles) */
static inline void ig_hsum4x4_avx512(float out[4], __m512 v) {
    out[0] = ig_hsum4_avx512(_mm512_castps512_ps128(v));
    out[1] = ig_hsum4_avx512(_mm512_extractf32x4_ps(v, 1));
    out[2] = ig_hsum4_avx512(_mm512_extractf32x4_ps(v, 2));
    out[3] = ig_hsum4_avx512(_mm512_extractf32x4_ps(v, 3));
}

/* lane (r, j) = the sum of lanes 4r..4r+3 of p_j; exact while each lane of p is within +-16383 */
static inline __m512i q4v_reduce4(__m512i p0, __m512i p1, __m512i p2, __m512i p3) {
    const __m512i ones = _mm512_set1_epi16(1);
    const __m512i t01 = _mm512_madd_epi16(_mm512_packs_epi32(p0, p1), ones);
    const __m512i t23 = _mm512_madd_epi16(_mm512_packs_epi32(p2, p3), ones);
    return _mm512_madd_epi16(_mm512_packs_epi32(t01, t23), ones);
}

/* c[b - b0] = -8 * sum(x_b) and d[b - b0] = d_x of blocks [b0, b1) of one activation row, zeros on
 * to the next multiple of 4 blocks */
static void q4v_summary(int32_t *c, float *d, const ig_block_q8 *x, int b0, int b1) {
    const __m512i eight = _mm512_set1_epi8(8), zero = _mm512_setzero_si512();
    for (int b = b0; b < b1; b += 4) {
        __m512i p[4];
        for (int j = 0; j < 4; j++) {
            p[j] = zero;
            d[b - b0 + j] = 0.0f;
            if (b + j < b1) {
                const ig_block_q8 *xb = x + b + j;
                const __m512i xl = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)xb->qs));
                const __m512i xh = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(xb->qs + 16)));
                p[j] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, eight, xl), eight, xh);
                d[b - b0 + j] = xb->d;
            }
        }
        const __m512i s = _mm512_sub_epi32(zero, q4v_reduce4(p[0], p[1], p[2], p[3]));
        _mm_storeu_si128((__m128i *)(c + b - b0), _mm512_castsi512_si128(s));
    }
}

/* a[gi][t] += blocks [b, b + nq) (nq <= 4) of groups gi < G at g against activation rows t < TT;
 * cs/ds: the summary from block bs on, lds apart per row */
static inline __attribute__((always_inline)) void q4v_step(
        __m512 a[2][4], const ig_block_q8 *x, int64_t ldx, const int32_t *cs, const float *ds,
        int64_t lds, const uint8_t *g, int64_t gstride, int64_t sb, int b, int bs, const int nq,
        const int G, const int TT) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), zero = _mm512_setzero_si512();
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    for (int gi = 0; gi < G; gi++) {
        const uint8_t *gg = g + gi * gstride;
        __m512i lo[4], hi[4];
        for (int j = 0; j < nq; j++) {
            IG_Q4V_PF(gg, b + j);
            const __m512i v = _mm512_loadu_si512((const void *)(gg + sb + (int64_t)(b + j) * 64));
            lo[j] = _mm512_and_si512(v, m4);
            hi[j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        }
        if ((b & 7) == 0) IG_Q4V_PF(gg + 512, b);   /* the ninth line of 8 blocks' 576 bytes */
        const __m512 dw = _mm512_permutexvar_ps(idx, _mm512_cvtph_ps(
            nq == 4 ? _mm256_loadu_si256((const __m256i *)(gg + 8 * (int64_t)b))
                    : _mm256_maskz_loadu_epi16((__mmask16)((1u << (4 * nq)) - 1u), gg + 8 * (int64_t)b)));
        for (int t = 0; t < TT; t++) {
            __m512i p[4];
            for (int j = 0; j < 4; j++) {
                p[j] = zero;
                if (j < nq) {
                    const ig_block_q8 *xb = x + t * ldx + b + j;
                    const __m512i xl = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)xb->qs));
                    const __m512i xh = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(xb->qs + 16)));
                    p[j] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, lo[j], xl), hi[j], xh);
                }
            }
            const __m512i s = _mm512_add_epi32(q4v_reduce4(p[0], p[1], p[2], p[3]),
                _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(cs + t * lds + b - bs))));
            const __m512 dx = _mm512_broadcast_f32x4(_mm_loadu_ps(ds + t * lds + b - bs));
            a[gi][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, dx), a[gi][t]);
        }
    }
}

/* st[4 * gi + t] (+)= blocks [b0, b1) of groups gi < G at g (gstride bytes apart) against the
 * activation rows t < TT of x (ldx blocks apart); starts from zero at block 0. cs/ds: the summary
 * of those rows from block b0 on, lds apart. */
static inline __attribute__((always_inline)) void q4v_tile(
        __m512 *st, const ig_block_q8 *x, int64_t ldx, const int32_t *cs, const float *ds,
        int64_t lds, const uint8_t *g, int64_t gstride, int nb, int b0, int b1, const int G,
        const int TT) {
    __m512 a[2][4];
    for (int gi = 0; gi < G; gi++)
        for (int t = 0; t < TT; t++) a[gi][t] = b0 == 0 ? _mm512_setzero_ps() : st[4 * gi + t];
    const int64_t sb = IG_Q4P_SCALE_BYTES(nb);
    int b = b0;
    for (; b + 4 <= b1; b += 4) q4v_step(a, x, ldx, cs, ds, lds, g, gstride, sb, b, b0, 4, G, TT);
    if (b1 - b == 3) q4v_step(a, x, ldx, cs, ds, lds, g, gstride, sb, b, b0, 3, G, TT);
    else if (b1 - b == 2) q4v_step(a, x, ldx, cs, ds, lds, g, gstride, sb, b, b0, 2, G, TT);
    else if (b1 - b == 1) q4v_step(a, x, ldx, cs, ds, lds, g, gstride, sb, b, b0, 1, G, TT);
    for (int gi = 0; gi < G; gi++)
        for (int t = 0; t < TT; t++) st[4 * gi + t] = a[gi][t];
}

/* decode: one group; prefill: 2 groups (1 at an odd end) x tt rows */
static void q4v_tiles(__m512 *st, const ig_block_q8 *x, int64_t ldx, const int32_t *cs,
                      const float *ds, int64_t lds, const uint8_t *g, int64_t gstride, int nb,
                      int b0, int b1, int G, int tt) {
#define IG_Q4V_TILE(GG, TT) q4v_tile(st, x, ldx, cs, ds, lds, g, gstride, nb, b0, b1, GG, TT)
    if (tt == 1) IG_Q4V_TILE(1, 1);
    else if (G == 2 && tt == 4) IG_Q4V_TILE(2, 4);
    else if (G == 2 && tt == 3) IG_Q4V_TILE(2, 3);
    else if (G == 2) IG_Q4V_TILE(2, 2);
    else if (tt == 4) IG_Q4V_TILE(1, 4);
    else if (tt == 3) IG_Q4V_TILE(1, 3);
    else IG_Q4V_TILE(1, 2);
#undef IG_Q4V_TILE
}

#define IG_Q4V_GROUPS 8   /* packed groups per parallel index */

void ig_matmul_q4_avx512vnni(const ig_matmul_args *a, int n_threads) {
    const int T = a->T, N = a->N, nb = a->K / IG_QK;
    const int n_groups = (N + 3) / 4, n_par = (n_groups + IG_Q4V_GROUPS - 1) / IG_Q4V_GROUPS;
    const int64_t gb = IG_Q4P_GROUP_BYTES(nb);
    const ig_block_q8 *X = (const ig_block_q8 *)a->x;
    int32_t cs[4][IG_Q4V_CHUNK];
    float ds[4][IG_Q4V_CHUNK];
    const int once = T == 1 && nb <= IG_Q4V_CHUNK;   /* one summary serves the whole call */
    if (once) q4v_summary(cs[0], ds[0], X, 0, nb);
    IG_FOR(blk, n_par) {
        const int g0 = blk * IG_Q4V_GROUPS;
        const int g1 = g0 + IG_Q4V_GROUPS < n_groups ? g0 + IG_Q4V_GROUPS : n_groups;
        __m512 sw[IG_Q4V_GROUPS * 4], su[IG_Q4V_GROUPS * 4];
        for (int t = 0; t < T;) {
            const int tt = T - t >= 4 ? 4 : T - t;
            const ig_block_q8 *x = X + (size_t)t * nb;
            for (int b0 = 0; b0 < nb; b0 += IG_Q4V_CHUNK) {
                const int b1 = nb - b0 < IG_Q4V_CHUNK ? nb : b0 + IG_Q4V_CHUNK;
                if (!once)
                    for (int i = 0; i < tt; i++) q4v_summary(cs[i], ds[i], x + (size_t)i * nb, b0, b1);
                for (int gi = g0; gi < g1;) {
                    const int G = tt > 1 && gi + 2 <= g1 ? 2 : 1;
                    q4v_tiles(sw + (gi - g0) * 4, x, nb, cs[0], ds[0], IG_Q4V_CHUNK,
                              (const uint8_t *)a->w + gi * gb, gb, nb, b0, b1, G, tt);
                    if (a->w2)
                        q4v_tiles(su + (gi - g0) * 4, x, nb, cs[0], ds[0], IG_Q4V_CHUNK,
                                  (const uint8_t *)a->w2 + gi * gb, gb, nb, b0, b1, G, tt);
                    gi += G;
                }
            }
            for (int gi = g0; gi < g1; gi++) {
                const int n = gi * 4, nt = N - n < 4 ? N - n : 4;
                for (int i = 0; i < tt; i++) {
                    float v[4], u[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    ig_hsum4x4_avx512(v, sw[(gi - g0) * 4 + i]);
                    if (a->w2) ig_hsum4x4_avx512(u, su[(gi - g0) * 4 + i]);
                    for (int j = 0; j < nt; j++)
                        a->out[(size_t)(t + i) * a->ldo + n + j] =
                            IG_MATMUL_EPILOGUE(a, v[j], u[j], t + i, n + j);
                }
            }
            t += tt;
        }
    }
    (void)n_threads;
}

#undef IG_Q4V_GROUPS

/* ---- a GGUF file's own blocks with x16 activations (layouts in ignis.h) ----------------------
 *
 * The q8 tile, and for the nibble layouts a 4-row tile of the same shape, with two changes. The
 * activation block comes as two byte vectors, hi and lo (a = 256 * hi + lo), so each dot is two
 * vpdpbusd, the hi one shifted left by 8 before the sum:
 * exact in int32; the weights' offset (+128, +16 for Q5_0, +32 for Q6_K) is taken back from the
 * block's sums of a, which the quantizer stores, by starting one lane per row (per half) at
 * -offset * sum. And the weight scales come from the layout: a half per block (Q8_0, Q5_0), or a
 * super-block f32 times an int8 sub-block scale (K-quants). */

/* The nibble tiles' dot: start + 256 * (lo . h0 + hi . h1) + (lo . l0 + hi . l1), lane by lane, for
 * weights split into the bytes lo and hi and the activation pieces h (hi) and l (lo) beside them. */
static inline __m512i x16_nibble_dot(__m512i start, __m512i lo, __m512i hi, __m512i h0, __m512i h1,
                                     __m512i l0, __m512i l1) {
    const __m512i ph = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, h0), hi, h1);
    return _mm512_add_epi32(_mm512_dpbusd_epi32(_mm512_dpbusd_epi32(start, lo, l0), hi, l1),
                            _mm512_slli_epi32(ph, 8));
}

/* The nibble layouts' tile, FMT any IG_WX_* but IG_WX_Q8 (a compile-time constant). Each block's
 * 64 bytes of nibbles (4 rows x 16) split into a low and a high byte vector, lifted where the
 * layout's masks say so: by 16 for the fifth bits (Q5_0, Q5_1, Q5_K), by 16 and 32 for Q6_K's two
 * high bits, not at all for Q4_1 and Q4_K (q is 0..15 as it stands). Q3_K and Q2_K come as crumbs
 * (a pair of blocks per 64 bytes, 4 bits of each byte per block), in Q6_K's order, Q3_K lifted by
 * 4 where its masks say so. Scales per lane: a half per row (Q5_0, Q4_1, Q5_1), the super-block
 * f32 times the sub-block scale of each half (Q6_K, Q3_K, Q2_K: a row's lanes 0-1 hold its first
 * half, lanes 2-3 its second, so the activation's 8-byte quarters are reordered to [0, 2] beside
 * the low values and [1, 3] beside the high ones), or per block (Q4_K, Q5_K). Offsets that are not
 * integers take the activation block's f32 sum in one lane per row: -dmin * m (Q4_K, Q5_K) or the
 * half m (Q4_1, Q5_1); Q2_K's -dmin * m per half take the half's quantized sum d_x * s[half] in
 * lanes 0 and 2 of a row. The integer offsets (+16 for Q5_0, +32 for Q6_K, +4 for Q3_K) come back
 * from the activation's stored sums, in the first lane of each row (of each half for Q6_K and
 * Q3_K). */
static inline __attribute__((always_inline)) void xnib_tile(
        float acc[4][16], const ig_block_x16 *x, const float *xs, int64_t ldx, const uint8_t *g,
        int64_t gstride, int nb, const int FMT, const int G, const int TT) {
    __m512 a[4][4];
    for (int gi = 0; gi < G; gi++)
        for (int t = 0; t < TT; t++) a[gi][t] = _mm512_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(0x0F), b16 = _mm512_set1_epi8(16), b32 = _mm512_set1_epi8(32);
    const __m512i rows = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512i pairs = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __m512i halves = _mm512_setr_epi32(0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1);
    const __m256i pair = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
    /* fifth bits as masks; K-quant super-blocks with dmin offsets; half offsets */
    const int FIVE = FMT == IG_WX_Q5_0 || FMT == IG_WX_Q5_1 || FMT == IG_WX_Q5K;
    const int KQ = FMT == IG_WX_Q4K || FMT == IG_WX_Q5K;
    const int ONE = FMT == IG_WX_Q4_1 || FMT == IG_WX_Q5_1;
    /* scales per 16 weights in Q6_K's order (Q3_K, Q2_K: crumbs; Q3_K one mask pair) */
    const int Q2 = FMT == IG_WX_Q2K, Q3 = FMT == IG_WX_Q3K, CRUMBS = Q2 || Q3;
    const int Q6L = FMT == IG_WX_Q6K || CRUMBS;
    const int MASKS = FIVE || FMT == IG_WX_Q6K || Q3;
    /* where each region of a group starts: super-block scales, block scales (then Q4_1/Q5_1's
     * offsets), masks, nibbles (Q3_K: crumbs) */
    const int64_t db = KQ || Q2 ? IG_Q4KP_D_BYTES(nb) : Q6L ? IG_Q6KP_D_BYTES(nb) : 0;
    const int64_t mb = db + (ONE ? 2 : 1) * IG_Q8P_SCALE_BYTES(nb);
    const int64_t qb = mb + (FIVE || Q3 ? IG_Q5P_MASK_BYTES(nb)
                             : FMT == IG_WX_Q6K ? IG_Q6KP_MASK_BYTES(nb) : 0);
    const int64_t mask_bytes = FIVE || Q3 ? 16 : 32;                   /* per block */
    const __m512i m2 = _mm512_set1_epi8(3), b4 = _mm512_set1_epi8(4);
    for (int b = 0; b < nb; b++) {
        __m512 dw[4], mw[4];
        __m512i lo[4], hi[4];
        for (int gi = 0; gi < G; gi++) {
            const uint8_t *gg = g + gi * gstride, *next = gg + 2 * G * gstride;
            if (FMT == IG_WX_Q5_0 || ONE) {
                dw[gi] = _mm512_permutexvar_ps(rows, _mm512_castps128_ps512(
                    _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(gg + 8 * (int64_t)b)))));
                if (ONE) {
                    const uint8_t *m = gg + IG_Q8P_SCALE_BYTES(nb) + 8 * (int64_t)b;
                    mw[gi] = _mm512_maskz_permutexvar_ps((__mmask16)0x1111, rows, _mm512_castps128_ps512(
                        _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)m))));
                }
            } else if (Q2) {
                /* per (row, half) the byte sc | m << 4; d and dmin per row, spread over pairs */
                const __m256i sm = _mm256_cvtepu8_epi32(
                    _mm_loadl_epi64((const __m128i *)(gg + db + 8 * (int64_t)b)));
                const float *sup = (const float *)(gg + 32 * (int64_t)(b / 8));
                const __m256 d = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(sup)), pair);
                const __m256 dm = _mm256_permutevar8x32_ps(
                    _mm256_castps128_ps256(_mm_loadu_ps(sup + 4)), pair);
                const __m256 sc = _mm256_cvtepi32_ps(_mm256_and_si256(sm, _mm256_set1_epi32(15)));
                const __m256 mn = _mm256_cvtepi32_ps(_mm256_srli_epi32(sm, 4));
                dw[gi] = _mm512_permutexvar_ps(pairs, _mm512_castps256_ps512(_mm256_mul_ps(sc, d)));
                mw[gi] = _mm512_maskz_permutexvar_ps((__mmask16)0x5555, pairs,
                                                     _mm512_castps256_ps512(_mm256_mul_ps(mn, dm)));
            } else if (Q6L) {
                const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                    _mm_loadl_epi64((const __m128i *)(gg + db + 8 * (int64_t)b))));
                const __m256 d = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(
                    _mm_loadu_ps((const float *)(gg + 16 * (int64_t)(b / 8)))), pair);
                dw[gi] = _mm512_permutexvar_ps(pairs, _mm512_castps256_ps512(_mm256_mul_ps(sc, d)));
            } else {
                const float *sup = (const float *)(gg + 32 * (int64_t)(b / 8));
                int32_t sm[2];
                memcpy(sm, gg + db + 8 * (int64_t)b, sizeof sm);
                const __m128 sc = _mm_cvtepi32_ps(_mm_cvtepi8_epi32(_mm_cvtsi32_si128(sm[0])));
                const __m128 mn = _mm_cvtepi32_ps(_mm_cvtepi8_epi32(_mm_cvtsi32_si128(sm[1])));
                dw[gi] = _mm512_permutexvar_ps(rows, _mm512_castps128_ps512(_mm_mul_ps(_mm_loadu_ps(sup), sc)));
                mw[gi] = _mm512_maskz_permutexvar_ps((__mmask16)0x1111, rows,
                                                     _mm512_castps128_ps512(_mm_mul_ps(_mm_loadu_ps(sup + 4), mn)));
            }
            /* the groups two tiles ahead: their nibbles, and a line of each side region as it
             * starts (masks every 64 / mask_bytes blocks, block scales every 8, super-block
             * scales every 64 / their bytes per super-block) */
            IG_PREFETCH_W(next + qb + (int64_t)(CRUMBS ? b / 2 : b) * 64);
            if (MASKS && (b * mask_bytes) % 64 == 0)
                IG_PREFETCH_W(next + mb + (int64_t)b * mask_bytes);
            if ((b & 7) == 0)
                IG_PREFETCH_W(next + db + (int64_t)b * 8);
            if (ONE && (b & 7) == 0)
                IG_PREFETCH_W(next + IG_Q8P_SCALE_BYTES(nb) + (int64_t)b * 8);
            if (Q6L && !Q2 && (b & 31) == 0)
                IG_PREFETCH_W(next + 2 * (int64_t)b);
            if ((KQ || Q2) && (b & 15) == 0)
                IG_PREFETCH_W(next + 4 * (int64_t)b);
            __m512i l, h;
            if (CRUMBS) {      /* a pair of blocks per 64 bytes: this one's 4 bits of each byte */
                const __m512i v = _mm512_srli_epi16(
                    _mm512_loadu_si512((const void *)(gg + qb + (int64_t)(b / 2) * 64)), 4 * (b & 1));
                l = _mm512_and_si512(v, m2);
                h = _mm512_and_si512(_mm512_srli_epi16(v, 2), m2);
            } else {
                const __m512i v = _mm512_loadu_si512((const void *)(gg + qb + (int64_t)b * 64));
                l = _mm512_and_si512(v, m4);
                h = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
            }
            if (MASKS) {
                uint64_t m[4];
                memcpy(m, gg + mb + (int64_t)b * mask_bytes, (size_t)mask_bytes);
                if (Q3) {
                    l = _mm512_mask_add_epi8(l, (__mmask64)m[0], l, b4);
                    h = _mm512_mask_add_epi8(h, (__mmask64)m[1], h, b4);
                } else if (FIVE) {
                    l = _mm512_mask_add_epi8(l, (__mmask64)m[0], l, b16);
                    h = _mm512_mask_add_epi8(h, (__mmask64)m[1], h, b16);
                } else {
                    l = _mm512_mask_add_epi8(l, (__mmask64)m[0], l, b16);
                    l = _mm512_mask_add_epi8(l, (__mmask64)m[1], l, b32);
                    h = _mm512_mask_add_epi8(h, (__mmask64)m[2], h, b16);
                    h = _mm512_mask_add_epi8(h, (__mmask64)m[3], h, b32);
                }
            }
            lo[gi] = l;
            hi[gi] = h;
        }
        for (int t = 0; t < TT; t++) {
            const ig_block_x16 *xb = x + t * ldx + b;
            __m512i h0, h1, l0, l1, neg;
            __m512 sx = _mm512_setzero_ps();
            if (Q6L) {
                /* quarters [0, 2, 1, 3]: the low 128 bits go beside the low nibbles */
                const __m256i ph4 = _mm256_permute4x64_epi64(
                    _mm256_loadu_si256((const __m256i *)xb->hi), 0xD8);
                const __m256i pl4 = _mm256_permute4x64_epi64(
                    _mm256_loadu_si256((const __m256i *)xb->lo), 0xD8);
                h0 = _mm512_broadcast_i32x4(_mm256_castsi256_si128(ph4));
                h1 = _mm512_broadcast_i32x4(_mm256_extracti128_si256(ph4, 1));
                l0 = _mm512_broadcast_i32x4(_mm256_castsi256_si128(pl4));
                l1 = _mm512_broadcast_i32x4(_mm256_extracti128_si256(pl4, 1));
                /* -32 (Q3_K: -4; Q2_K: none) * sum(a) of each half, in lane 0 (first half) and lane
                 * 2 (second) of a row */
                const __m512i s2 = _mm512_permutexvar_epi32(halves, _mm512_castsi128_si512(
                    _mm_loadl_epi64((const __m128i *)xb->s)));
                neg = Q2 ? _mm512_setzero_si512()
                         : _mm512_maskz_sub_epi32((__mmask16)0x5555, _mm512_setzero_si512(),
                                                  _mm512_slli_epi32(s2, Q3 ? 2 : 5));
                if (Q2)         /* the offsets' activation: -d_x * s[half] in lanes 0 and 2 of a row */
                    sx = _mm512_mul_ps(_mm512_set1_ps(-xb->d), _mm512_cvtepi32_ps(s2));
            } else {
                h0 = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)xb->hi));
                h1 = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(xb->hi + 16)));
                l0 = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)xb->lo));
                l1 = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(xb->lo + 16)));
                /* Q5_0: -16 * sum(a), in the first lane of each row; the others: no integer offset */
                neg = FMT == IG_WX_Q5_0
                    ? _mm512_maskz_set1_epi32((__mmask16)0x1111, -16 * (xb->s[0] + xb->s[1]))
                    : _mm512_setzero_si512();
            }
            const __m512 dx = _mm512_set1_ps(xb->d);
            const __m512 nx = _mm512_set1_ps(KQ ? -xs[t * ldx + b] : ONE ? xs[t * ldx + b] : 0.0f);
            for (int gi = 0; gi < G; gi++) {
                const __m512i p = x16_nibble_dot(neg, lo[gi], hi[gi], h0, h1, l0, l1);
                a[gi][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dw[gi], dx), a[gi][t]);
                if (KQ || ONE) a[gi][t] = _mm512_fmadd_ps(mw[gi], nx, a[gi][t]);
                if (Q2) a[gi][t] = _mm512_fmadd_ps(mw[gi], sx, a[gi][t]);
            }
        }
    }
    for (int gi = 0; gi < G; gi++)
        for (int t = 0; t < TT; t++) ig_hsum4x4_avx512(acc[t] + gi * 4, a[gi][t]);
}

static void x16v_dots(float acc[4][16], const ig_matmul_args *a, int second, int t, int tt, int gi,
                      int G, int nb) {
    const int fmt = second ? a->layout2 : a->layout;
    const uint8_t *w = second ? a->w2 : a->w;
    const ig_block_x16 *x = (const ig_block_x16 *)a->x + (size_t)t * nb;
    const float *xs = a->xsum + (size_t)t * nb;
    /* each nibble layout's tile compiled for it: its FMT constant and the bytes of one group */
#define IG_XNIB(FMT, GROUP_BYTES)                                                                  \
    case FMT: {                                                                                    \
        const int64_t gb = GROUP_BYTES(nb);                                                        \
        IG_QV_TILE(xnib_tile, acc, x, xs, nb, w + gi * gb, gb, nb, FMT);                           \
        return;                                                                                    \
    }
    switch (fmt) {
    IG_XNIB(IG_WX_Q5_0, IG_Q5P_GROUP_BYTES)
    IG_XNIB(IG_WX_Q6K, IG_Q6KP_GROUP_BYTES)
    IG_XNIB(IG_WX_Q4K, IG_Q4KP_GROUP_BYTES)
    IG_XNIB(IG_WX_Q4_1, IG_Q41P_GROUP_BYTES)
    IG_XNIB(IG_WX_Q5_1, IG_Q51P_GROUP_BYTES)
    IG_XNIB(IG_WX_Q5K, IG_Q5KP_GROUP_BYTES)
    IG_XNIB(IG_WX_Q3K, IG_Q3KP_GROUP_BYTES)
    IG_XNIB(IG_WX_Q2K, IG_Q2KP_GROUP_BYTES)
    }
#undef IG_XNIB
    const int64_t gb = IG_Q8P_GROUP_BYTES(nb);      /* IG_WX_Q8 */
    IG_QV_TILE(q8v_tile, acc, x, nb, w + gi * gb, gb, 0, nb, 1);
}

/* ---- the nibble layouts' prefill and decode tile: 16 weight rows to a vector, the twin's
 * arithmetic ----------------------------------------------------------------------------------
 *
 * The tiles above put 4 rows in a vector, 4 lanes each, and turn every lane to f32: 6 vector
 * operations besides the 4 vpdpbusd per 4 rows, block and activation row, and a result that is not
 * the portable twin's (a row's 4 lanes are summed in f32 at the end). This tile puts one row in
 * each lane: per block, the 4 groups' 64-byte nibble vectors (split into low and high bytes,
 * lifted by their masks, as xnib_tile does) are transposed once into 8 vectors W_j whose lane holds
 * 4 consecutive integers of one of the 16 rows, and every activation row of the tile reuses them:
 * W_j against 4 bytes of the activation's hi (then lo) piece broadcast from memory, 8 vpdpbusd a
 * piece, accumulate each half's exact int32 sum of the 16 rows. Those sums then take the twin's f32
 * steps exactly as ig_matmul_x16_ref (ops/quant_x16.c) does: acc = (acc + s0 * (d_x * scale0))
 * + s1 * (d_x * scale1), then acc -= offset * xsum, block after block; so the result is the twin's
 * bit for bit, whatever T, the tile or the thread count. Per half and activation row: 8 vpdpbusd
 * and 5 other operations for 16 rows, instead of 4 + 6 for 4. A lane's row: lane 4r + g is row r of
 * the tile's group g (the transpose's order); the scales are gathered into the same order and the
 * result is permuted back once per tile. */

/* lane 4r + g <- lane 4g + r (its own inverse) */
#define IG_XV_RG _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15)

/* 4 groups' 4 f32 (one per row, at p[g]) in lane order 4r + g */
static inline __m512 xv_rows_ps(const float *p0, const float *p1, const float *p2, const float *p3) {
    __m512 v = _mm512_castps128_ps512(_mm_loadu_ps(p0));
    v = _mm512_insertf32x4(v, _mm_loadu_ps(p1), 1);
    v = _mm512_insertf32x4(v, _mm_loadu_ps(p2), 2);
    v = _mm512_insertf32x4(v, _mm_loadu_ps(p3), 3);
    return _mm512_permutexvar_ps(IG_XV_RG, v);
}

static inline int32_t xv_ld32(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* acc + the dots of w (u8) with the 4 bytes at p (s8) broadcast to every lane, the broadcast
 * folded into vpdpbusd's memory operand ({1to16}). GCC 12 does not fold _mm512_set1_epi32 of a
 * load into it: one vpbroadcastd more per vpdpbusd, 16 more a block and activation row in the x16
 * tile. Folded, the tile's prefill ran 2-14% faster and its decode 1-3% in cache (RESULTS.md).
 * Both assembler dialects; clang takes the same template. */
static inline __m512i xv_dpbusd_bcst(__m512i acc, __m512i w, const uint8_t *p) {
#if defined(__GNUC__)
    __asm__("vpdpbusd {%2%{1to16%}, %1, %0|%0, %1, %2%{1to16%}}"
            : "+v"(acc) : "v"(w), "m"(*(const int32_t (*)[1])p));
    return acc;
#else
    return _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(xv_ld32(p)));
#endif
}

static inline int64_t xv_ld64(const uint8_t *p) {
    int64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* 4 groups' 4 int8 (one per row, at p[g]) as f32 in lane order 4r + g */
static inline __m512 xv_rows_i8(const uint8_t *p0, const uint8_t *p1, const uint8_t *p2,
                                const uint8_t *p3) {
    const __m128i b = _mm_setr_epi32(xv_ld32(p0), xv_ld32(p1), xv_ld32(p2), xv_ld32(p3));
    return _mm512_cvtepi32_ps(_mm512_permutexvar_epi32(IG_XV_RG, _mm512_cvtepi8_epi32(b)));
}

/* 4 groups' 4 IEEE halves (one per row, at p[g]) as f32 in lane order 4r + g */
static inline __m512 xv_rows_f16(const uint8_t *p0, const uint8_t *p1, const uint8_t *p2,
                                 const uint8_t *p3) {
    const __m256i h = _mm256_setr_epi64x(xv_ld64(p0), xv_ld64(p1), xv_ld64(p2), xv_ld64(p3));
    const __m256i rg = _mm256_setr_epi16(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_cvtph_ps(_mm256_permutexvar_epi16(rg, h));
}

/* The 4 x 4 transpose of 32-bit pieces inside each 128-bit lane: out[j] lane 4r + g = v[g] lane
 * 4r + j (v[g]: group g, row r in 128-bit lane r, 4 integers per piece j) */
static inline void xv_transpose(__m512i out[4], const __m512i v[4]) {
    const __m512i t0 = _mm512_unpacklo_epi32(v[0], v[1]), t1 = _mm512_unpackhi_epi32(v[0], v[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(v[2], v[3]), t3 = _mm512_unpackhi_epi32(v[2], v[3]);
    out[0] = _mm512_unpacklo_epi64(t0, t2);
    out[1] = _mm512_unpackhi_epi64(t0, t2);
    out[2] = _mm512_unpacklo_epi64(t1, t3);
    out[3] = _mm512_unpackhi_epi64(t1, t3);
}

/* the layouts this tile reads */
static inline int xv_layout(int fmt) {
    return fmt == IG_WX_Q4K || fmt == IG_WX_Q5K || fmt == IG_WX_Q6K || fmt == IG_WX_Q5_0 ||
           fmt == IG_WX_Q4_1 || fmt == IG_WX_Q5_1;
}

#define IG_XV_TT 8   /* activation rows per tile */

/* acc[t][c] = the twin's dot of activation row t with row c of the 16 rows at g (4 groups gstride
 * bytes apart; only the first G exist: the others' lanes read group 0 and are not stored). FMT: an
 * xv_layout (a compile-time constant). */
static inline __attribute__((always_inline)) void xv_tile(
        float acc[IG_XV_TT][16], const ig_block_x16 *x, const float *xs, int64_t ldx,
        const uint8_t *g, int64_t gstride, int nb, int G, const int FMT, const int TT) {
    const int FIVE = FMT == IG_WX_Q5_0 || FMT == IG_WX_Q5_1 || FMT == IG_WX_Q5K;
    const int KQ = FMT == IG_WX_Q4K || FMT == IG_WX_Q5K, ONE = FMT == IG_WX_Q4_1 || FMT == IG_WX_Q5_1;
    const int Q6 = FMT == IG_WX_Q6K, MASKS = FIVE || Q6;
    const int BIAS = FMT == IG_WX_Q5_0 ? 16 : Q6 ? 32 : 0;
    const int64_t sb = IG_Q8P_SCALE_BYTES(nb);
    const int64_t db = KQ ? IG_Q4KP_D_BYTES(nb) : Q6 ? IG_Q6KP_D_BYTES(nb) : 0;
    const int64_t mb = db + (ONE ? 2 : 1) * sb;
    const int64_t qb = mb + (FIVE ? IG_Q5P_MASK_BYTES(nb) : Q6 ? IG_Q6KP_MASK_BYTES(nb) : 0);
    const int64_t mask_bytes = FIVE ? 16 : 32;
    const __m512i m4 = _mm512_set1_epi8(0x0F), b16 = _mm512_set1_epi8(16), b32 = _mm512_set1_epi8(32);
    /* the activation bytes beside W_j: low nibbles' pieces, then high nibbles' (Q6_K's order:
     * a row's byte i < 8 holds k[i] and k[i + 8], byte 8 + i k[16 + i] and k[24 + i]) */
    static const int KOFF[2][8] = {{0, 4, 8, 12, 16, 20, 24, 28}, {0, 4, 16, 20, 8, 12, 24, 28}};
    const int *koff = KOFF[Q6];
    const uint8_t *gg[4];
    for (int gi = 0; gi < 4; gi++) gg[gi] = g + (gi < G ? gi : 0) * gstride;
    __m512 a[IG_XV_TT];
    for (int t = 0; t < TT; t++) a[t] = _mm512_setzero_ps();
    __m512 d16 = _mm512_setzero_ps(), dm16 = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        /* scales (and offsets) of the 16 rows, per half, in lane order, as the twin computes them */
        __m512 sc0, sc1 = _mm512_setzero_ps(), off = _mm512_setzero_ps();
        if (KQ) {
            if ((b & 7) == 0) {
                const int64_t o = 32 * (int64_t)(b / 8);
                d16 = xv_rows_ps((const float *)(gg[0] + o), (const float *)(gg[1] + o),
                                 (const float *)(gg[2] + o), (const float *)(gg[3] + o));
                dm16 = xv_rows_ps((const float *)(gg[0] + o + 16), (const float *)(gg[1] + o + 16),
                                  (const float *)(gg[2] + o + 16), (const float *)(gg[3] + o + 16));
            }
            const int64_t o = db + 8 * (int64_t)b;
            sc0 = _mm512_mul_ps(d16, xv_rows_i8(gg[0] + o, gg[1] + o, gg[2] + o, gg[3] + o));
            off = _mm512_mul_ps(dm16, xv_rows_i8(gg[0] + o + 4, gg[1] + o + 4, gg[2] + o + 4, gg[3] + o + 4));
        } else if (Q6) {
            if ((b & 7) == 0) {
                const int64_t o = 16 * (int64_t)(b / 8);
                d16 = xv_rows_ps((const float *)(gg[0] + o), (const float *)(gg[1] + o),
                                 (const float *)(gg[2] + o), (const float *)(gg[3] + o));
            }
            /* per group 8 bytes: row r's half h at 2r + h; to words [half 0 | half 1] x lane order */
            const int64_t o = db + 8 * (int64_t)b;
            const __m512i w = _mm512_cvtepi8_epi16(_mm256_setr_epi64x(
                xv_ld64(gg[0] + o), xv_ld64(gg[1] + o), xv_ld64(gg[2] + o), xv_ld64(gg[3] + o)));
            static const int16_t IDX[32] = {0, 8, 16, 24, 2, 10, 18, 26, 4, 12, 20, 28, 6, 14, 22, 30,
                                            1, 9, 17, 25, 3, 11, 19, 27, 5, 13, 21, 29, 7, 15, 23, 31};
            const __m512i idx = _mm512_loadu_si512((const void *)IDX);
            const __m512i s = _mm512_permutexvar_epi16(idx, w);
            sc0 = _mm512_mul_ps(d16, _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_castsi512_si256(s))));
            sc1 = _mm512_mul_ps(d16, _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(s, 1))));
        } else {
            const int64_t o = 8 * (int64_t)b;
            sc0 = xv_rows_f16(gg[0] + o, gg[1] + o, gg[2] + o, gg[3] + o);
            if (ONE)        /* w = d * q + m: the twin's offset is -m */
                off = _mm512_xor_ps(_mm512_set1_ps(-0.0f),
                                    xv_rows_f16(gg[0] + sb + o, gg[1] + sb + o, gg[2] + sb + o, gg[3] + sb + o));
        }
        if (!Q6) sc1 = sc0;
        /* the integers: per group a low and a high byte vector (row r in 128-bit lane r), then W */
        __m512i lo[4], hi[4], W[8];
        for (int gi = 0; gi < 4; gi++) {
            const uint8_t *p = gg[gi];
            /* the group 4 tiles on (the next tile's rows): its integers, and a line of each side
             * region as it starts */
            if (gi < G) {
                const uint8_t *next = p + 4 * gstride;
                IG_PREFETCH_W(next + qb + (int64_t)b * 64);
                if (MASKS && (b * mask_bytes) % 64 == 0) IG_PREFETCH_W(next + mb + (int64_t)b * mask_bytes);
                if ((b & 7) == 0) IG_PREFETCH_W(next + db + (int64_t)b * 8);
                if (ONE && (b & 7) == 0) IG_PREFETCH_W(next + sb + (int64_t)b * 8);
                if (Q6 && (b & 31) == 0) IG_PREFETCH_W(next + 2 * (int64_t)b);
                if (KQ && (b & 15) == 0) IG_PREFETCH_W(next + 4 * (int64_t)b);
            }
            const __m512i v = _mm512_loadu_si512((const void *)(p + qb + (int64_t)b * 64));
            __m512i l = _mm512_and_si512(v, m4), h = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
            if (MASKS) {
                uint64_t m[4];
                memcpy(m, p + mb + (int64_t)b * mask_bytes, (size_t)mask_bytes);
                l = _mm512_mask_add_epi8(l, (__mmask64)m[0], l, b16);
                if (Q6) {
                    l = _mm512_mask_add_epi8(l, (__mmask64)m[1], l, b32);
                    h = _mm512_mask_add_epi8(h, (__mmask64)m[2], h, b16);
                    h = _mm512_mask_add_epi8(h, (__mmask64)m[3], h, b32);
                } else {
                    h = _mm512_mask_add_epi8(h, (__mmask64)m[1], h, b16);
                }
            }
            lo[gi] = l;
            hi[gi] = h;
        }
        xv_transpose(W, lo);
        xv_transpose(W + 4, hi);
        /* W[j] covers the 4 activation values at koff[j]; half 0 is W[0..3] (Q6_K: W[0, 1, 4, 5]) */
        static const int HALF[2][2][4] = {{{0, 1, 2, 3}, {4, 5, 6, 7}}, {{0, 1, 4, 5}, {2, 3, 6, 7}}};
        for (int t = 0; t < TT; t++) {
            const ig_block_x16 *xb = x + t * ldx + b;
            const __m512 dx = _mm512_set1_ps(xb->d);
            __m512 v = a[t];
            for (int hf = 0; hf < 2; hf++) {
                __m512i ph = _mm512_setzero_si512();
                __m512i pl = BIAS ? _mm512_set1_epi32(-BIAS * xb->s[hf]) : _mm512_setzero_si512();
                for (int i = 0; i < 4; i++) {
                    const int j = HALF[Q6][hf][i];
                    ph = xv_dpbusd_bcst(ph, W[j], (const uint8_t *)xb->hi + koff[j]);
                    pl = xv_dpbusd_bcst(pl, W[j], (const uint8_t *)xb->lo + koff[j]);
                }
                const __m512i s = _mm512_add_epi32(pl, _mm512_slli_epi32(ph, 8));
                v = _mm512_add_ps(v, _mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dx, hf ? sc1 : sc0)));
            }
            if (KQ || ONE) v = _mm512_sub_ps(v, _mm512_mul_ps(off, _mm512_set1_ps(xs[t * ldx + b])));
            a[t] = v;
        }
    }
    for (int t = 0; t < TT; t++) _mm512_storeu_ps(acc[t], _mm512_permutexvar_ps(IG_XV_RG, a[t]));
}

/* one tile with FMT and TT (1..IG_XV_TT) as compile-time constants */
#define IG_XV_ROWS(FMT)                                                                            \
    switch (tt) {                                                                                  \
    case 1: xv_tile(acc, x, xs, nb, g, gb, nb, G, FMT, 1); return;                                 \
    case 2: xv_tile(acc, x, xs, nb, g, gb, nb, G, FMT, 2); return;                                 \
    case 3: xv_tile(acc, x, xs, nb, g, gb, nb, G, FMT, 3); return;                                 \
    case 4: xv_tile(acc, x, xs, nb, g, gb, nb, G, FMT, 4); return;                                 \
    case 5: xv_tile(acc, x, xs, nb, g, gb, nb, G, FMT, 5); return;                                 \
    case 6: xv_tile(acc, x, xs, nb, g, gb, nb, G, FMT, 6); return;                                 \
    case 7: xv_tile(acc, x, xs, nb, g, gb, nb, G, FMT, 7); return;                                 \
    default: xv_tile(acc, x, xs, nb, g, gb, nb, G, FMT, 8); return;                                \
    }

/* dots of `tt` activation rows from t against the G groups from gi of w (second: of w2) */
static void xv_dots(float acc[IG_XV_TT][16], const ig_matmul_args *a, int second, int t, int tt,
                    int gi, int G, int nb) {
    const int fmt = second ? a->layout2 : a->layout;
    const ig_block_x16 *x = (const ig_block_x16 *)a->x + (size_t)t * nb;
    const float *xs = a->xsum + (size_t)t * nb;
    const uint8_t *w = second ? a->w2 : a->w;
    int64_t gb;
    const uint8_t *g;
    switch (fmt) {
#define IG_XV(FMT, GROUP_BYTES)                                                                    \
    case FMT:                                                                                      \
        gb = GROUP_BYTES(nb);                                                                      \
        g = w + gi * gb;                                                                           \
        IG_XV_ROWS(FMT)
    IG_XV(IG_WX_Q4K, IG_Q4KP_GROUP_BYTES)
    IG_XV(IG_WX_Q5K, IG_Q5KP_GROUP_BYTES)
    IG_XV(IG_WX_Q6K, IG_Q6KP_GROUP_BYTES)
    IG_XV(IG_WX_Q5_0, IG_Q5P_GROUP_BYTES)
    IG_XV(IG_WX_Q4_1, IG_Q41P_GROUP_BYTES)
    IG_XV(IG_WX_Q5_1, IG_Q51P_GROUP_BYTES)
#undef IG_XV
    }
}

/* The driver of the 16-row tile: parallel over blocks of IG_XV_GROUPS packed groups, tiles of 4
 * groups x up to IG_XV_TT activation rows, then the epilogue. */
#define IG_XV_GROUPS 8

static void xv_matmul(const ig_matmul_args *a, int n_threads) {
    const int T = a->T, N = a->N, nb = a->K / IG_QK;
    const int n_groups = (N + 3) / 4, n_par = (n_groups + IG_XV_GROUPS - 1) / IG_XV_GROUPS;
    IG_FOR(blk, n_par) {
        const int g0 = blk * IG_XV_GROUPS;
        const int g1 = g0 + IG_XV_GROUPS < n_groups ? g0 + IG_XV_GROUPS : n_groups;
        float g[IG_XV_TT][16], u[IG_XV_TT][16];
        for (int t = 0; t < T;) {
            const int tt = T - t >= IG_XV_TT ? IG_XV_TT : T - t;
            for (int gi = g0; gi < g1; gi += 4) {
                const int G = g1 - gi < 4 ? g1 - gi : 4;
                xv_dots(g, a, 0, t, tt, gi, G, nb);
                if (a->w2) xv_dots(u, a, 1, t, tt, gi, G, nb);
                const int n = gi * 4, nt = N - n < 4 * G ? N - n : 4 * G;
                for (int i = 0; i < tt; i++)
                    for (int j = 0; j < nt; j++)
                        a->out[(size_t)(t + i) * a->ldo + n + j] =
                            IG_MATMUL_EPILOGUE(a, g[i][j], a->w2 ? u[i][j] : 0.0f, t + i, n + j);
            }
            t += tt;
        }
    }
    (void)n_threads;
}

#undef IG_XV_GROUPS

void ig_matmul_x16_avx512vnni(const ig_matmul_args *a, int n_threads) {
    if (xv_layout(a->layout) && (!a->w2 || xv_layout(a->layout2))) {
        xv_matmul(a, n_threads);
        return;
    }
    qv_matmul(a, x16v_dots, a->layout == IG_WX_Q8 && (!a->w2 || a->layout2 == IG_WX_Q8) ? x16v_pair : NULL,
              a->layout == IG_WX_Q8 ? 2 : 4, n_threads);
}

/* ---- activation quantization, 16 lanes at a time: the same bytes as ig_quantize_q8_rows_ref (max is
 * exact, the scale and its inverse are the same two divisions, and the conversion rounds to
 * nearest even like lrintf) ---- */
/* ig_block_amax of the 32 floats in v0, v1: the largest |x| by bits (a NaN wins) */
static inline float x5_block_amax(__m512 v0, __m512 v1) {
    const __m512i abs = _mm512_set1_epi32(0x7fffffff);
    const uint32_t m = _mm512_reduce_max_epu32(_mm512_max_epu32(
        _mm512_and_si512(_mm512_castps_si512(v0), abs), _mm512_and_si512(_mm512_castps_si512(v1), abs)));
    float amax;
    memcpy(&amax, &m, sizeof amax);
    return amax;
}

void ig_quantize_q8_rows_avx512(ig_block_q8 *out, const float *x, int64_t ldx, int T, int K) {
    const int nb = K / IG_QK;
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * ldx;
        ig_block_q8 *o = out + (size_t)t * nb;
        for (int b = 0; b < nb; b++) {
            const __m512 v0 = _mm512_loadu_ps(xr + (size_t)b * IG_QK);
            const __m512 v1 = _mm512_loadu_ps(xr + (size_t)b * IG_QK + 16);
            const float amax = x5_block_amax(v0, v1);
            const float d = amax / 127.0f;
            float id = d > 0.0f ? 127.0f / amax : 0.0f;
            if (!(id < INFINITY)) id = 0.0f;
            o[b].d = d;
            if (id == 0.0f) {       /* the twin's all-zero block (v * id may be NaN or inf here) */
                memset(o[b].qs, 0, IG_QK);
                continue;
            }
            const __m512 vid = _mm512_set1_ps(id);
            const __m128i q0 = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v0, vid)));
            const __m128i q1 = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v1, vid)));
            _mm_storeu_si128((__m128i *)o[b].qs, q0);
            _mm_storeu_si128((__m128i *)(o[b].qs + 16), q1);
        }
    }
}

/* ---- x16 activation quantization, 16 lanes at a time: the same bytes and sums as
 * ig_quantize_x16_rows_ref (the same divisions, round to nearest even, the clamp, floor shifts; the
 * sum in the scalar order) ---- */
void ig_quantize_x16_rows_avx512(ig_block_x16 *out, float *xsum, const float *x, int64_t ldx, int T,
                                 int K) {
    const int nb = K / IG_QK;
    const __m512i lim = _mm512_set1_epi32(32512), c128 = _mm512_set1_epi32(128);
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * ldx;
        ig_block_x16 *o = out + (size_t)t * nb;
        for (int b = 0; b < nb; b++) {
            const float *v = xr + (size_t)b * IG_QK;
            const __m512 v0 = _mm512_loadu_ps(v), v1 = _mm512_loadu_ps(v + 16);
            const float amax = x5_block_amax(v0, v1);
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
            const __m512 vid = _mm512_set1_ps(id);
            for (int h = 0; h < 2; h++) {
                __m512i a = _mm512_cvtps_epi32(_mm512_mul_ps(h ? v1 : v0, vid));
                a = _mm512_max_epi32(_mm512_min_epi32(a, lim), _mm512_sub_epi32(_mm512_setzero_si512(), lim));
                o[b].s[h] = _mm512_reduce_add_epi32(a);
                const __m512i hi = _mm512_srai_epi32(_mm512_add_epi32(a, c128), 8);
                const __m512i lo = _mm512_sub_epi32(a, _mm512_slli_epi32(hi, 8));
                _mm_storeu_si128((__m128i *)(o[b].hi + 16 * h), _mm512_cvtepi32_epi8(hi));
                _mm_storeu_si128((__m128i *)(o[b].lo + 16 * h), _mm512_cvtepi32_epi8(lo));
            }
        }
    }
}

/* ---- attention (ops/attention_tmpl.h) compiled with this file's flags, its exp, scores and
 * weighted sums in AVX-512 (attention_avx512.h) ---- */
#define ATTN(name) name##_avx512
#include "attention_avx512.h"
#include "../ops/attention_tmpl.h"
#undef ATTN
#endif
